"""scripts/install run by a user who may not write the checkout (someone else's clone): it
says what that user lacks and what to do, instead of failing with no word (README quickstart)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

REPO = Path(__file__).resolve().parent.parent


def checkout(parent: Path, *, stamp_current: bool) -> Path:
    """A root-owned checkout of the package whose .venv runs this interpreter, no bytecode."""
    tree = parent / "checkout"
    (tree / "scripts").mkdir(parents=True)
    for name in ("pyproject.toml", "scripts/install"):
        shutil.copy2(REPO / name, tree / name)
    shutil.copytree(
        REPO / "cortexfs", tree / "cortexfs", ignore=shutil.ignore_patterns("__pycache__")
    )
    venv = tree / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    (venv / "pyvenv.cfg").write_text(f"executable = {os.path.realpath(sys.executable)}\n")
    digests = "".join(
        f"{hashlib.sha256((tree / name).read_bytes()).hexdigest()}  {name}\n"
        for name in ("pyproject.toml", "scripts/install")
    )
    wanted = hashlib.sha256(digests.encode()).hexdigest()
    (venv / ".cortexfs-installed").write_text((wanted if stamp_current else "stale") + "\n")
    for directory, _, _ in os.walk(tree):
        os.chmod(directory, 0o755)
    return tree


def run_install(tree: Path, user: UnprivilegedUser) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["./scripts/install"],
        cwd=tree,
        user=user.uid,
        group=user.gid,
        extra_groups=[],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tree.parent), "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_an_installed_checkout_of_someone_else_is_ready_with_a_word_on_bytecode(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    tree = checkout(traversable_tmp, stamp_current=True)

    done = run_install(tree, unprivileged_user)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "install: ready" in done.stdout
    assert "could not be written" in done.stderr and "a clone of your own" in done.stderr


def test_a_venv_to_reinstall_that_the_user_may_not_write_is_refused_saying_so(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    tree = checkout(traversable_tmp, stamp_current=False)

    done = run_install(tree, unprivileged_user)

    assert done.returncode == 1, done.stdout + done.stderr
    assert "may not write it" in done.stderr and "VENV" in done.stderr, done.stderr


@pytest.mark.slow
def test_a_first_install_prints_no_warning_meant_for_the_maintainers(
    traversable_tmp: Path,
) -> None:
    """A newcomer's first ./scripts/install is a few lines of its own: setuptools' notice
    that compat editable mode is transitional used to come first, fourteen lines long."""
    tree = traversable_tmp / "clone"
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "pyproject.toml", "README.md", "LICENSE*", "scripts", "cortexfs"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, tracked.split("\0")):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, tree / name)
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(traversable_tmp),
        "PYTHON": sys.executable,
    }

    done = subprocess.run(
        ["./scripts/install"],
        cwd=tree,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith("install: ready"), done.stdout
    assert "Warning" not in done.stderr, done.stderr
