"""An unusable ``.tshrc`` (a directory, a link to someone else's file): refused with a reason
and what to do by ctx, and a standalone tsh goes on with the next source of its path (T-4)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cortexfs import storage
from cortexfs.errors import CtxError
from cortexfs.tools.ctxpath import read_tshrc
from tests.support.users import find_or_create_user

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]


def tsh_which(root: Path, home: Path, name: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(root / "bin" / "tsh")],
        input=f"which {name}\n",
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "CTX_HOME": str(home), "CTX_PATH": str(root / "tool")},
        timeout=60,
    )


def test_a_tshrc_that_is_a_directory_is_refused_by_ctx_and_passed_over_by_tsh(
    tmp_path: Path,
) -> None:
    root = tmp_path / "storage"
    storage.bootstrap(root)
    home = tmp_path / "home"
    (home / ".tshrc").mkdir(parents=True)

    shell = tsh_which(root, home, "fs.stat")
    which = subprocess.run(
        [*CTX, "--storage", str(root), "object", "which", "fs.stat"],
        capture_output=True,
        text=True,
        env={**os.environ, "CTX_HOME": str(home)},
    )

    assert "Traceback" not in shell.stderr, shell.stderr
    assert shell.stdout.splitlines()[0] == str(root / "tool" / "fs.stat")  # from CTX_PATH
    warnings = [line for line in shell.stderr.splitlines() if line.startswith("tsh: warning")]
    assert len(warnings) == 1 and "not a regular file" in warnings[0], shell.stderr
    assert which.returncode != 0 and "Traceback" not in which.stderr
    assert "not a regular file; make it a file of KEY=VALUE lines, or remove it" in which.stderr


def test_a_tshrc_linking_to_another_users_file_is_never_read(tmp_path: Path) -> None:
    """A dotfile may be a link, but only to a file of the home's owner: whoever reads the
    home's settings (root included) must not take /etc/shadow, say, for them."""
    home = tmp_path / "home"
    home.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("root:$6$hash:19000::::::\n")
    (home / ".tshrc").symlink_to(secret)
    own = tmp_path / "dotfiles-tshrc"
    own.write_text("CTX_PATH=/opt/mine\n")
    user = find_or_create_user()  # skips unless root: the home must be another uid's
    os.chown(home, user.uid, user.gid)  # the home is that user's, the link's target root's

    with pytest.raises(CtxError) as refused:
        read_tshrc(home / ".tshrc", warn=lambda message: pytest.fail(message))
    assert refused.value.code_name == "EPERM" and "another user" in refused.value.message
    assert "$6$" not in refused.value.message

    os.chown(own, user.uid, user.gid)
    (home / ".tshrc").unlink()
    (home / ".tshrc").symlink_to(own)
    assert read_tshrc(home / ".tshrc") == "/opt/mine"  # a link to the owner's own file
    (home / ".tshrc").unlink()
    (home / ".tshrc").write_text("CTX_PATH=/opt/provisioned\n")  # by root, in the home
    assert read_tshrc(home / ".tshrc") == "/opt/provisioned"
