"""find_program answers what shutil.which answers for a bare program name, on real PATHs;
setpriv_id_options spells an identity so that the real setpriv(1) switches to exactly it."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

from cortexfs.policy import Identity
from cortexfs.tools.host_programs import (
    find_program,
    names_setpriv_misreads,
    setpriv_id_options,
)
from tests.support.users import group_named


@pytest.fixture
def bins(tmp_path: Path) -> dict[str, Path]:
    """Directories holding ``prog`` as: an executable, a file without x bits, a directory."""
    made = {}
    for name, kind in (("exec", "exec"), ("plain", "plain"), ("dir", "dir"), ("other", "exec")):
        directory = tmp_path / name
        directory.mkdir()
        made[name] = directory
        program = directory / "prog"
        if kind == "dir":
            program.mkdir(mode=0o755)
        else:
            program.write_text("#!/bin/sh\n")
            program.chmod(0o755 if kind == "exec" else 0o644)
    return made


@pytest.mark.parametrize(
    "entries",
    [
        ["exec"],
        ["plain", "exec"],
        ["dir", "plain"],
        ["dir", "other", "exec"],
        ["plain", "plain", "other"],
        ["", "exec"],
        [],
    ],
)
def test_the_first_executable_file_on_path_as_shutil_finds_it(
    bins: dict[str, Path], monkeypatch: pytest.MonkeyPatch, entries: list[str]
) -> None:
    monkeypatch.setenv("PATH", os.pathsep.join(str(bins[e]) if e else "" for e in entries))

    assert find_program("prog") == shutil.which("prog")


def test_an_empty_path_finds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")

    assert find_program("sh") is None


def test_an_unset_path_searches_the_system_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PATH", raising=False)

    assert find_program("sh") == shutil.which("sh") is not None


@pytest.mark.skipif(os.geteuid() != 0, reason="root's lookup is the one that judges owners")
@pytest.mark.parametrize(("mode", "found"), [(0o755, True), (0o1777, True), (0o777, False)])
def test_root_takes_no_program_from_below_a_directory_others_may_rename_things_in(
    bins: dict[str, Path], monkeypatch: pytest.MonkeyPatch, mode: int, found: bool
) -> None:
    """Root's program in root's directory, below a directory another uid may write to: that
    uid could rename root's directory away and put its own there, unless the directory is
    sticky (only an entry's owner may rename it)."""
    above = bins["exec"].parent
    above.chmod(mode)
    monkeypatch.setenv("PATH", str(bins["exec"]))

    assert find_program("prog") == (str(bins["exec"] / "prog") if found else None)


def _ids_under_setpriv(options: list[str]) -> tuple[int, int, list[int]]:
    """The uid, gid and supplementary groups a process started by setpriv with ``options``
    has."""
    shown = subprocess.run(
        [
            "setpriv",
            *options,
            "--",
            "sh",
            "-c",
            "id -u; id -g; sed -n 's/^Groups:\\s*//p' /proc/self/status",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    return int(shown[0]), int(shown[1]), sorted(int(gid) for gid in shown[2].split())


needs_setpriv_as_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)


def _free_id(taken: set[int]) -> int:
    return next(n for n in range(47000, 60000) if n not in taken)


@needs_setpriv_as_root
def test_ids_with_names_are_spelt_by_name_and_setpriv_switches_to_them() -> None:
    """A name found in the host's files spares setpriv a lookup of a number in every other
    source of the user database; it must still land on the very ids."""
    nobody = pwd.getpwnam("nobody")
    named_group = grp.getgrgid(nobody.pw_gid)
    identity = Identity(nobody.pw_uid, nobody.pw_gid, frozenset({0, nobody.pw_gid}))

    options = setpriv_id_options(identity)

    assert options is not None
    assert options[:2] == ["--reuid=nobody", f"--regid={named_group.gr_name}"]
    assert _ids_under_setpriv(options) == (nobody.pw_uid, nobody.pw_gid, [0, nobody.pw_gid])


@needs_setpriv_as_root
def test_ids_without_names_are_spelt_as_numbers() -> None:
    uid = _free_id({user.pw_uid for user in pwd.getpwall()})
    gid = _free_id({group.gr_gid for group in grp.getgrall()})
    identity = Identity(uid, gid, frozenset())

    options = setpriv_id_options(identity)

    assert options == [f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
    assert _ids_under_setpriv(options) == (uid, gid, [])


@needs_setpriv_as_root
def test_an_unnamed_gid_whose_number_names_another_group_cannot_be_spelt() -> None:
    gid = _free_id({group.gr_gid for group in grp.getgrall()})
    identity = Identity(0, 0, frozenset({gid}))

    with group_named(str(gid)) as stand_in:
        options = setpriv_id_options(identity)
        misread = names_setpriv_misreads(identity)

    assert options is None
    assert misread == [f"the group named {gid} is gid {stand_in}, not {gid}"]


@needs_setpriv_as_root
def test_a_gid_with_a_name_of_its_own_is_spelt_by_it_beside_a_group_named_like_its_number() -> None:
    """Given by its name, the gid is not misread through the group named like its number; given
    as a number (as the terminal's sandbox gives it) it would be, and that is said."""
    nogroup = grp.getgrgid(pwd.getpwnam("nobody").pw_gid)
    identity = Identity(0, 0, frozenset({nogroup.gr_gid}))

    with group_named(str(nogroup.gr_gid)) as stand_in:
        options = setpriv_id_options(identity)
        misread = names_setpriv_misreads(identity)
        switched = None if options is None else _ids_under_setpriv(options)

    assert options == ["--reuid=root", "--regid=root", f"--groups={nogroup.gr_name}"]
    assert switched == (0, 0, [nogroup.gr_gid])
    assert misread == [f"the group named {nogroup.gr_gid} is gid {stand_in}, not {nogroup.gr_gid}"]
