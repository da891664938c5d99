"""CTX_PATH: left to right, executables only, controls from the winning directory (SPEC T-4)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cortexfs.errors import CtxError
from cortexfs.policy import Identity
from cortexfs.policy.linux import EXECUTE, permits
from cortexfs.tools.ctxpath import (
    human_search_path,
    read_tshrc,
    view_to_storage,
    which,
    which_on_user_path,
)
from tests.support.users import UnprivilegedUser
from tests.tools.support import World

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]


def place(directory: Path, name: str, mode: int, *, controls: str | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\necho {directory.name}\n")
    path.chmod(mode)
    if controls is not None:
        (directory / f"{name}.d").mkdir()
        (directory / f"{name}.d" / "description").write_text(controls)
    return path


def test_the_first_directory_holding_an_executable_wins(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    place(first, "tool.x", 0o755)
    place(second, "tool.x", 0o755)

    found = which("tool.x", [first, second])

    assert found is not None and found.directory == first


def test_a_non_executable_earlier_file_is_not_a_hit(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    place(first, "tool.x", 0o644)
    place(second, "tool.x", 0o755)

    found = which("tool.x", [first, second])

    assert found is not None and found.directory == second
    assert found.skipped == [f"{first / 'tool.x'}: not executable"]


def test_controls_come_from_the_directory_that_held_the_executable(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    (first / "tool.x.d").mkdir()  # a .d in the wrong directory: it has no executable
    place(second, "tool.x", 0o755, controls="the right one")

    found = which("tool.x", [first, second])

    assert found is not None and found.control_dir == second / "tool.x.d"
    assert (found.control_dir / "description").read_text() == "the right one"


@pytest.mark.parametrize("kind", ["symlink", "directory", "fifo"])
def test_links_directories_and_special_files_are_not_hits(tmp_path: Path, kind: str) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    real = place(second, "tool.x", 0o755)
    if kind == "symlink":
        (first / "tool.x").symlink_to(real)
    elif kind == "directory":
        (first / "tool.x").mkdir()
    else:
        os.mkfifo(first / "tool.x")

    found = which("tool.x", [first, second])

    assert found is not None and found.directory == second
    assert "not a regular file" in found.skipped[0]


def test_nothing_found_is_none_and_an_illegal_name_is_einval(tmp_path: Path) -> None:
    assert which("tool.x", [tmp_path / "missing", tmp_path]) is None
    with pytest.raises(CtxError) as refused:
        which("../etc/passwd", [tmp_path])
    assert refused.value.errno == 22


def test_executable_means_executable_for_the_asking_identity(
    tmp_path: Path, unprivileged_user: UnprivilegedUser
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    place(first, "tool.x", 0o700)  # root's alone
    place(second, "tool.x", 0o755)
    agent = Identity(unprivileged_user.uid, unprivileged_user.gid)

    found = which(
        "tool.x", [first, second], is_executable=lambda _p, st: permits(st, agent, EXECUTE)
    )

    assert found is not None and found.directory == second


def test_any_execute_bit_is_a_hit_whoever_it_is_for(tmp_path: Path) -> None:
    """T-4: only a file with no execute bit at all is skipped; whose bits they are is step 2's
    question, so the search never depends on who asks."""
    first, second = tmp_path / "first", tmp_path / "second"
    place(first, "tool.x", 0o640)  # no execute bit: not a hit
    place(second, "tool.x", 0o710)  # the owner's and the group's only: a hit

    found = which("tool.x", [first, second])

    assert found is not None and found.directory == second
    assert found.skipped == [f"{first / 'tool.x'}: not executable"]


def test_a_name_on_no_long_ctx_path_names_its_first_entries_and_how_many_more(
    tmp_path: Path,
) -> None:
    """T-4: ENOENT for a name found nowhere names the search path, but a CTX_PATH of thousands
    of entries (and as many passed over) is not repeated whole on one line."""
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "t").write_text("not executable\n")
    entries = [str(plain)] * 3000 + [f"/nowhere/{n}" for n in range(2000)]
    with pytest.raises(CtxError) as raised:
        which_on_user_path(tmp_path, "t", uid=1000, environ={"CTX_PATH": ":".join(entries)})
    message = raised.value.message
    assert f"t is not on CTX_PATH ({plain}:" in message
    assert "… and 4984 more)" in message and "/nowhere/1999" not in message
    assert "… and 2984 more" in message  # of the 3000 non-executable hits passed over
    assert len(message) < 4096, len(message)


def test_search_path_sources_tshrc_then_environment_then_default(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    home = root / "home" / "1000"
    home.mkdir(parents=True)
    default = human_search_path(root, uid=1000, environ={})
    from_env = human_search_path(root, uid=1000, environ={"CTX_PATH": "/opt/a:/opt/b"})
    (home / ".tshrc").write_text("# my tools first\nCTX_PATH=/ctx/home/1000/tool:/ctx/tool\n")
    from_tshrc = human_search_path(root, uid=1000, environ={"CTX_PATH": "/opt/a"})

    assert default.source == "default"
    assert default.directories == (root / "tool", root / "home/1000/tool")
    assert from_env.source == "CTX_PATH"
    assert from_env.directories == (Path("/opt/a"), Path("/opt/b"))
    assert from_tshrc.source == "/ctx/home/1000/.tshrc"
    assert from_tshrc.directories == (root / "home/1000/tool", root / "tool")


def test_ctx_home_moves_the_tshrc(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ".tshrc").write_text("CTX_PATH=/opt/mine\n")

    path = human_search_path(tmp_path, uid=1, environ={"CTX_HOME": str(elsewhere)})

    assert path.directories == (Path("/opt/mine"),)


def test_tshrc_is_data_never_code(tmp_path: Path) -> None:
    witness = tmp_path / "witness"
    rc = tmp_path / ".tshrc"
    rc.write_text(f"CTX_PATH=/opt/x:$(touch {witness})\nSHELL_THING=`touch {witness}`\n")

    value = read_tshrc(rc)

    assert value == f"/opt/x:$(touch {witness})"
    assert not witness.exists()


def test_lines_that_are_not_key_value_are_ignored_with_one_warning_each(tmp_path: Path) -> None:
    witness = tmp_path / "witness"
    rc = tmp_path / ".tshrc"
    rc.write_text(
        f"touch {witness}\n# a comment\n\nexport CTX_PATH=/p2\nCTX_PATH=/opt/a\n=/nothing\n"
    )
    warnings: list[str] = []

    value = read_tshrc(rc, warn=warnings.append)

    assert value == "/opt/a"
    assert [warning.split(": ignored")[0] for warning in warnings] == [
        f"{rc}:1",
        f"{rc}:4",
        f"{rc}:6",
    ]
    assert "'export CTX_PATH=/p2'" in warnings[1]
    assert not witness.exists()


@pytest.mark.parametrize("text", ["CTX_PATH=\n", "CTX_PATH=/opt/a\nCTX_PATH=  \n", "# none\n"])
def test_an_empty_ctx_path_in_the_tshrc_falls_through_to_the_environment(
    tmp_path: Path, text: str
) -> None:
    (tmp_path / ".tshrc").write_text(text)

    path = human_search_path(
        tmp_path, uid=1, environ={"CTX_HOME": str(tmp_path), "CTX_PATH": "/opt/env"}
    )

    assert (path.source, path.directories) == ("CTX_PATH", (Path("/opt/env"),))


def test_ctx_object_which_reads_a_tshrc_with_shell_lines_as_data(
    world: World, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".tshrc").write_text(f"echo hi\nexport CTX_PATH=/p2\nCTX_PATH={world.root}/tool\n")
    env = {**os.environ, "CTX_STORAGE": str(world.root), "CTX_HOME": str(home)}
    env.pop("CTX_PATH", None)

    completed = subprocess.run(
        [*CTX, "object", "which", "fs.read"], env=env, capture_output=True, text=True
    )

    assert completed.returncode == 0, completed.stderr
    assert completed.stdout == f"{world.root}/tool/fs.read\n"
    assert completed.stderr.splitlines() == [
        f"ctx: warning: {home}/.tshrc:1: ignored, not KEY=VALUE (.tshrc is data, never run): "
        "'echo hi'",
        f"ctx: warning: {home}/.tshrc:2: ignored, not KEY=VALUE (.tshrc is data, never run): "
        "'export CTX_PATH=/p2'",
    ]


def test_a_tshrc_that_is_not_a_regular_file_is_refused_not_waited_on(tmp_path: Path) -> None:
    rc = tmp_path / ".tshrc"
    os.mkfifo(rc)

    with pytest.raises(CtxError, match="not a regular file"):
        read_tshrc(rc)


def test_empty_and_relative_entries_are_ignored(tmp_path: Path) -> None:
    path = human_search_path(tmp_path, uid=1, environ={"CTX_PATH": ":relative:/abs::."})

    assert path.directories == (Path("/abs"),)


def test_ctx_paths_map_onto_the_storage_root_when_ctx_is_not_mounted(tmp_path: Path) -> None:
    if os.path.ismount("/ctx"):
        pytest.skip("/ctx is mounted on this host")

    assert view_to_storage(tmp_path, "/ctx/shared/p/tool") == tmp_path / "shared/p/tool"
    assert view_to_storage(tmp_path, "/ctxother/tool") == Path("/ctxother/tool")


def test_ctx_object_which(world: World, tmp_path: Path) -> None:
    env = {**os.environ, "CTX_STORAGE": str(world.root), "CTX_HOME": str(tmp_path)}
    env.pop("CTX_PATH", None)

    found = subprocess.run([*CTX, "object", "which", "fs.read"], env=env, capture_output=True)
    missing = subprocess.run([*CTX, "object", "which", "no.such"], env=env, capture_output=True)
    detail = subprocess.run(
        [*CTX, "object", "which", "--json", "fs.read"], env=env, capture_output=True
    )

    assert found.returncode == 0
    assert found.stdout.decode().strip() == str(world.root / "tool/fs.read")
    assert missing.returncode == 1 and b"ENOENT" in missing.stderr
    assert json.loads(detail.stdout)["search_path"]["source"] == "default"


def test_a_miss_names_what_it_passed_over(world: World, tmp_path: Path) -> None:
    """A tool that is there but not executable, or not a file, is the likely reason of a miss:
    the ENOENT says so, in text and in --json's error object."""
    (world.root / "tool" / "hello").write_text("#!/bin/sh\n")
    (world.root / "tool" / "hello").chmod(0o644)
    env = {**os.environ, "CTX_STORAGE": str(world.root), "CTX_HOME": str(tmp_path)}
    env.pop("CTX_PATH", None)

    missing = subprocess.run(
        [*CTX, "object", "which", "--json", "hello"], env=env, capture_output=True, text=True
    )

    assert missing.returncode == 1, missing.stderr
    message = json.loads(missing.stdout)["message"]
    assert message.endswith(f"; passed over: {world.root / 'tool' / 'hello'}: not executable")
    assert message in missing.stderr
