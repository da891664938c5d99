"""A path ending in ``/`` names a directory (SPEC T-8): the kernel answers ENOTDIR for a
regular file before the slash.  An ``exec`` so written, and a MANIFEST argument so given,
name no manifest or program: never the file before the slash, which pathlib, dropping the
slash, would name."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from cortexfs.errors import CtxError
from cortexfs.tools.manifest import ManifestError, load_manifest

CTX = [sys.executable, "-m", "cortexfs"]


def _manifest(directory: Path, exec_value: str) -> Path:
    """``t.json`` naming ``exec_value``, beside a program ``t.sh``, a directory ``dd`` and a
    link ``ln`` to the program."""
    program = directory / "t.sh"
    program.write_text("#!/bin/sh\necho '{}'\n")
    program.chmod(0o755)
    (directory / "dd").mkdir()
    (directory / "ln").symlink_to("t.sh")
    document = {
        "manifest": 2,
        "kind": "tool",
        "name": "t",
        "description": "The t tool.",
        "schema": {"type": "object"},
        "cap": {"side_effects": False, "network": False},
        "exec": exec_value,
    }
    path = directory / "t.json"
    path.write_text(json.dumps(document))
    return path


@pytest.mark.parametrize(
    ("exec_value", "code", "said"),
    [
        ("t.sh/", errno.EINVAL, "exec: {d}/t.sh/: Not a directory"),
        ("t.sh/.", errno.EINVAL, "exec: {d}/t.sh/: Not a directory"),
        ("{d}/t.sh/", errno.EINVAL, "exec: {d}/t.sh/: Not a directory"),
        ("dd/", errno.EINVAL, "exec: {d}/dd/ is not a regular file (a FIFO, device or directory)"),
        ("ln/", errno.ELOOP, "exec: {d}/ln/: ln/ is a symbolic link (to t.sh), which is never "),
    ],
)
def test_an_exec_ending_in_a_slash_names_no_program(
    tmp_path: Path, exec_value: str, code: int, said: str
) -> None:
    manifest = _manifest(tmp_path, exec_value.format(d=tmp_path))
    with pytest.raises(ManifestError) as refused:
        load_manifest(manifest)
    assert refused.value.codes == (code,), refused.value.problems
    assert refused.value.problems[0].startswith(said.format(d=tmp_path)), refused.value.problems


@pytest.mark.parametrize("suffix", ["/", "/."])
def test_a_manifest_named_with_a_final_slash_is_enotdir(tmp_path: Path, suffix: str) -> None:
    given = f"{_manifest(tmp_path, 't.sh')}{suffix}"
    with pytest.raises(CtxError) as refused:
        load_manifest(given)
    assert not isinstance(refused.value, ManifestError)
    assert (refused.value.errno, refused.value.message) == (
        errno.ENOTDIR,
        f"cannot read {given}: Not a directory; nothing was checked or installed",
    )
    assert load_manifest(given.removesuffix(suffix)).name == "t"  # the file itself is valid


def test_a_directory_named_with_a_final_slash_is_no_manifest(tmp_path: Path) -> None:
    with pytest.raises(CtxError) as refused:
        load_manifest(f"{tmp_path}/")
    assert refused.value.errno == errno.EINVAL
    assert refused.value.message.startswith(f"{tmp_path}/ is not a regular file")


def test_ctx_object_check_reads_its_argument_as_given(tmp_path: Path) -> None:
    """The slash reaches the check, which click's Path conversion would drop."""
    given = f"{_manifest(tmp_path, 't.sh')}/"
    done = subprocess.run(
        [*CTX, "object", "check", given], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout) == (1, ""), done
    assert done.stderr == (
        f"{given}: ENOTDIR: cannot read {given}: Not a directory; nothing was checked or "
        "installed\n"
    ), done


@pytest.mark.parametrize("given", [".", ".."])
def test_the_current_and_parent_directory_are_no_manifest(tmp_path: Path, given: str) -> None:
    """``.`` is a directory as ``./`` is: EINVAL, where pathlib reads it as no name at all
    (it was ENOENT, "cannot read .")."""
    (tmp_path / "here").mkdir()
    done = subprocess.run(
        [*CTX, "object", "check", given],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path / "here",
    )
    assert (done.returncode, done.stdout) == (1, ""), done
    assert done.stderr == (
        f"{given}: EINVAL: {given} is not a regular file (a FIFO, device or directory); give a "
        "manifest file; nothing was read from it\n"
    ), done
