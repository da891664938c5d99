"""``ctx object install`` on the command line: which storage root it installs into (T-8)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

CTX = [sys.executable, "-m", "cortexfs"]


def ctx(*arguments: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {"PATH": "/usr/bin:/bin", **(env or {})}
    command = [*CTX, *map(str, arguments)]
    return subprocess.run(command, capture_output=True, text=True, env=base, timeout=120)


@pytest.fixture
def roots(tmp_path: Path) -> list[Path]:
    roots = [tmp_path / "a", tmp_path / "b"]
    for root in roots:
        assert ctx("bootstrap", "--storage", root).returncode == 0
    return roots


def manifest(directory: Path, name: str) -> Path:
    program = directory / f"{name}.sh"
    program.write_text("#!/bin/sh\necho mine\n")
    path = directory / f"{name}.json"
    document = {
        "manifest": 2,
        "kind": "tool",
        "name": name,
        "description": f"The {name} test tool.",
        "schema": {"type": "object"},
        "cap": {"side_effects": False, "network": False},
        "exec": program.name,
    }
    path.write_text(json.dumps(document))
    return path


def test_ctx_storage_and_source_naming_two_roots_is_a_usage_error(
    roots: list[Path], tmp_path: Path
) -> None:
    """Reported: `ctx --storage A object install --source B …` installed into B silently,
    while the same two options after `object install` were refused."""
    a, b = roots
    path = manifest(tmp_path, "demo.twice")

    refused = ctx("--storage", a, "object", "install", "--source", b, path, "--tier", "system")

    assert refused.returncode == 2, refused
    assert refused.stderr == (
        f"ctx: EINVAL: --source {b} and ctx --storage {a} name two storage roots; "
        "give one of them\n"
    )
    assert not (a / "tool" / "demo.twice").exists()
    assert not (b / "tool" / "demo.twice").exists()


def test_the_same_root_given_both_ways_installs(roots: list[Path], tmp_path: Path) -> None:
    a, _ = roots
    (tmp_path / "link").symlink_to(a)
    path = manifest(tmp_path, "demo.once")

    done = ctx("--storage", tmp_path / "link", "object", "install", "--source", a, path,
               "--tier", "system")  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert (a / "tool" / "demo.once").exists()


def test_ctx_storage_in_the_environment_is_a_default_that_source_overrides(
    roots: list[Path], tmp_path: Path
) -> None:
    a, b = roots
    path = manifest(tmp_path, "demo.env")

    done = ctx("object", "install", "--source", b, path, "--tier", "system",
               env={"CTX_STORAGE": str(a)})  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert (b / "tool" / "demo.env").exists() and not (a / "tool" / "demo.env").exists()


def _state(tool: Path) -> dict[str, bytes]:
    """The executable and every control of a tool, as bytes."""
    controls = tool.parent / f"{tool.name}.d"
    found = {"": tool.read_bytes()}
    found.update({p.name: p.read_bytes() for p in controls.iterdir() if p.is_file()})
    return found


@pytest.mark.parametrize("name", ["fs.read", "tsh.config", "tsh"])
def test_a_core_tools_name_is_refused_in_the_system_tier(
    roots: list[Path], tmp_path: Path, name: str
) -> None:
    """Reported: installing `fs.read` printed `replaced fs.read`, and the next bootstrap
    printed `repaired tool/fs.read` and threw it away; each step undid the other."""
    root, _ = roots
    path = manifest(tmp_path, name)
    before = _state(root / "tool" / name)

    refused = ctx("object", "install", "--source", root, path, "--tier", "system")

    assert refused.returncode == 1, refused
    assert refused.stderr.startswith(f"ctx: EEXIST: {name} is a core tool, maintained by ")
    assert f"'ctx bootstrap --storage {root}'" in refused.stderr and refused.stdout == ""
    assert _state(root / "tool" / name) == before  # so bootstrap has nothing to put back


def test_a_core_tools_name_is_free_in_a_user_tier(roots: list[Path], tmp_path: Path) -> None:
    root, _ = roots

    done = ctx("object", "install", "--source", root, manifest(tmp_path, "fs.read"),
               "--tier", "user")  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert "installed fs.read in tier user" in done.stdout


def test_an_install_under_a_strict_umask_leaves_the_controls_open_to_agents(
    roots: list[Path], tmp_path: Path
) -> None:
    """The agents a tool runs as list and run its hooks: the directories an install makes get
    the modes a default umask gives, whatever the installer's."""
    root = roots[0]
    path = manifest(tmp_path, "demo.strict")
    command = [*CTX, "object", "install", "--source", str(root), str(path), "--tier", "system"]

    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
        preexec_fn=lambda: os.umask(0o077),
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    controls = root / "tool" / "demo.strict.d"
    modes = {
        str(directory.relative_to(controls)): stat.S_IMODE(directory.stat().st_mode)
        for directory in [controls, *controls.rglob("*")]
        if directory.is_dir()
    }
    assert modes == {".": 0o755, "hooks": 0o755, "hooks/pre.d": 0o755, "hooks/post.d": 0o755}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user and group")
def test_a_user_running_with_another_group_installs_in_their_own_tier(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """After ``newgrp`` (or under a service's group) the passwd group may be one the process
    does not hold: the user's own home keeps the group the process runs with, as mkdir would,
    instead of an EPERM for a chown only root may make."""
    other_group = 65534
    assert other_group != unprivileged_user.gid
    root = traversable_tmp / "storage"
    os.chown(traversable_tmp, unprivileged_user.uid, unprivileged_user.gid)
    as_user = ["setpriv", f"--reuid={unprivileged_user.uid}", f"--regid={other_group}"]
    as_user += ["--clear-groups", *CTX]

    def run(*arguments: object) -> subprocess.CompletedProcess[str]:
        command = [*as_user, *map(str, arguments)]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd="/")

    assert run("bootstrap", "--storage", root).returncode == 0
    done = run("object", "install", "--source", root, manifest(traversable_tmp, "mine"),
               "--tier", "user")  # fmt: skip

    assert done.returncode == 0, done.stderr
    home = root / "home" / str(unprivileged_user.uid)
    assert (home.stat().st_uid, home.stat().st_gid) == (unprivileged_user.uid, other_group)
    assert (home / "tool" / "mine").is_file()


def test_an_install_over_controls_left_without_their_executable_says_it_kept_them(
    roots: list[Path], tmp_path: Path
) -> None:
    """Between the two steps of a removal (docs/tools.md), an install is a reinstall: the
    grants in the controls left there apply to the new program, which is never left unsaid
    (T-8: installing grants nothing of itself)."""
    root, path = roots[0], manifest(tmp_path, "hello")
    assert ctx("object", "install", "--storage", root, "--tier", "system", path).returncode == 0
    policy = root / "tool" / "hello.d" / "policy"
    policy.write_text(policy.read_text() + "allow ci_t tool:hello execute\n")
    (root / "tool" / "hello").unlink()

    again = ctx("object", "install", "--storage", root, "--tier", "system", "--json", path)

    assert again.returncode == 0 and json.loads(again.stdout)["took_leftover_controls"] is True
    assert again.stderr.startswith(f"ctx: warning: {root}/tool/hello.d was there without its ")
    assert "allow ci_t tool:hello execute" in policy.read_text()
    plain = ctx("object", "install", "--storage", root, "--tier", "system", "--json", path)
    assert json.loads(plain.stdout)["took_leftover_controls"] is False and plain.stderr == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user")
def test_a_tier_the_caller_may_not_list_is_left_out_with_a_note(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """A listing that left a space's tier out unsaid would read as complete."""
    root = traversable_tmp / "storage"
    assert ctx("bootstrap", "--storage", root).returncode == 0
    assert ctx("shared", "create", "team", "--storage", root).returncode == 0
    path = manifest(traversable_tmp, "mine")
    made = ctx("object", "install", "--storage", root, "--tier", "shared:team", path)
    assert made.returncode == 0, made.stderr
    os.chmod(root / "shared" / "team", 0o2770)  # the space's group only: the user is not in it
    as_user = ["setpriv", f"--reuid={unprivileged_user.uid}", f"--regid={unprivileged_user.gid}"]
    command = [*as_user, "--clear-groups", *CTX, "object", "list", "--storage", str(root)]

    listed = subprocess.run([*command, "--json"], capture_output=True, text=True, cwd="/")

    assert listed.returncode == 0
    assert "mine" not in [tool["name"] for tool in json.loads(listed.stdout)]
    assert listed.stderr == (
        f"ctx: note: tier shared:team ({root}/shared/team/tool) cannot be listed by uid "
        f"{unprivileged_user.uid} (Permission denied): its tools are left out\n"
    )
