"""``ctx bootstrap`` repairs what it owns and only that (SPEC R-5, P-5 step 2, D-1).

What it owns — the root ABI directories, the core tools, ``bin/tsh``, ``bin/ctxterm``,
``tool/tsh.d/config`` and the manual bundle — is given back to the storage root's owner and
made writable by its owner alone when another uid could change it, and a link, FIFO or
socket where it writes a file whole is replaced; each repair is listed, a second run repairs
nothing, and what the entries hold for users (policies, logs, settings) keeps every byte.
Real directories, real modes and owners (a real second uid), real ``ctx`` processes.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

import cortexfs.manual  # registers the manual bundle's bootstrap step
import cortexfs.tools.core.bootstrap  # noqa: F401  (registers the core tools' step)
from cortexfs import storage
from cortexfs.errors import CtxError
from cortexfs.tools.controls import ToolObject, read_controls
from tests.support.cli import ctx
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

POLICY_LINE = "allow coder_t tool:fs.list execute\n"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "storage"
    report = storage.bootstrap(path)
    assert report.problems == [], report.problems
    return path


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def repaired_twice(root: Path) -> tuple[storage.BootstrapReport, storage.BootstrapReport]:
    """Two bootstraps; the second must find nothing to do (R-5: idempotent)."""
    first = storage.bootstrap(root)
    second = storage.bootstrap(root)
    assert (second.created, second.repaired, second.problems) == ([], [], []), second.to_json()
    return first, second


# ----------------------------------------------------------------------- loosened modes


@pytest.mark.parametrize(
    ("relative", "loose"),
    [
        ("agent", 0o777),
        ("tool", 0o775),
        ("home", 0o757),
        ("tool/fs.list.d", 0o777),
        ("tool/fs.list.d/hooks/pre.d", 0o777),
        ("tool/fs.stat.d/schema", 0o666),
        ("tool/fs.stat", 0o777),
        ("bin/tsh", 0o777),
        ("bin/ctxterm", 0o775),
    ],
)
def test_an_entry_others_may_write_is_made_the_owners_alone(
    root: Path, relative: str, loose: int
) -> None:
    made = mode(root / relative)
    (root / relative).chmod(loose)

    first, _ = repaired_twice(root)

    assert f"{relative} (mode {loose:04o}, now {made:04o})" in first.repaired
    assert mode(root / relative) == made
    assert first.problems == []


def test_a_loose_storage_root_itself_is_repaired(root: Path) -> None:
    root.chmod(0o777)

    first, _ = repaired_twice(root)

    assert first.repaired == [f"{root} (mode 0777, now 0755)"]
    assert mode(root) == 0o755


def test_a_core_tools_policy_and_the_tsh_config_keep_their_bytes(root: Path) -> None:
    """Local state: its mode is repaired, never what it says."""
    policy, config = root / "tool/fs.list.d/policy", root / "tool/tsh.d/config"
    with policy.open("a") as stream:
        stream.write(POLICY_LINE)
    config.write_text("# mine\ncache_capacity=8\n")
    before = {policy: policy.read_bytes(), config: config.read_bytes()}
    policy.chmod(0o666)
    config.chmod(0o646)

    first, _ = repaired_twice(root)

    assert sorted(first.repaired) == [
        "tool/fs.list.d/policy (mode 0666, now 0644)",
        "tool/tsh.d/config (mode 0646, now 0644)",
    ]
    assert {path: path.read_bytes() for path in before} == before


def test_the_manual_bundles_directories_get_their_mode_back(root: Path) -> None:
    """D-1: directories of mode 0755, so that every agent reads the pages and none changes them."""
    bundle = root / "shared/cortexfs-docs"
    (bundle / "man").chmod(0o777)
    bundle.chmod(0o000)

    first, _ = repaired_twice(root)

    assert first.repaired == [
        "shared/cortexfs-docs (mode 0000, now 0755)",
        "shared/cortexfs-docs/man (mode 0777, now 0755)",
    ]
    assert (mode(bundle), mode(bundle / "man")) == (0o755, 0o755)


# --------------------------------------------------------------------------- owners


@pytest.mark.parametrize(
    "relative",
    ["tool", "agent", "tool/fs.list", "tool/fs.list.d", "tool/fs.list.d/log", "bin/tsh"],
)
def test_an_entry_of_another_uid_is_given_back_to_the_storage_owner(
    root: Path, relative: str, unprivileged_user: UnprivilegedUser
) -> None:
    os.chown(root / relative, unprivileged_user.uid, -1)
    owner = root.stat().st_uid

    first, _ = repaired_twice(root)

    assert f"{relative} (owner uid {unprivileged_user.uid}, now uid {owner})" in first.repaired
    assert (root / relative).lstat().st_uid == owner


def test_a_page_of_another_uid_is_rewritten_as_the_storage_owners(
    root: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """0444 means nothing to its owner, who may chmod it and rewrite it."""
    page = root / "shared/cortexfs-docs/man/ctx.agent.md"
    os.chown(page, unprivileged_user.uid, -1)

    first, _ = repaired_twice(root)

    assert first.repaired == ["shared/cortexfs-docs/man/ctx.agent.md"]
    assert page.lstat().st_uid == root.stat().st_uid and mode(page) == 0o444


def test_user_data_below_a_repaired_directory_is_untouched(
    root: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """Only the entry bootstrap owns changes: not what users keep below it."""
    home = root / "home" / str(unprivileged_user.uid)
    home.mkdir(mode=0o700)
    os.chown(home, unprivileged_user.uid, unprivileged_user.gid)
    notes = home / "notes.txt"
    notes.write_text("mine\n")
    os.chown(notes, unprivileged_user.uid, unprivileged_user.gid)
    notes.chmod(0o666)
    (root / "home").chmod(0o777)

    first, _ = repaired_twice(root)

    assert first.repaired == ["home (mode 0777, now 0755)"]
    assert (home.stat().st_uid, mode(home)) == (unprivileged_user.uid, 0o700)
    assert (notes.read_text(), notes.stat().st_uid, mode(notes)) == (
        "mine\n",
        unprivileged_user.uid,
        0o666,
    )


# --------------------------------------------------------------------------- stand-ins


def _symlink(path: Path) -> None:
    path.symlink_to("/etc/hostname")


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(str(path))


STAND_INS: dict[str, tuple[Callable[[Path], None], str]] = {
    "symlink": (_symlink, "symbolic link"),
    "fifo": (_fifo, "FIFO"),
    "socket": (_socket, "socket"),
}


@pytest.mark.parametrize("kind", STAND_INS)
@pytest.mark.parametrize(
    ("relative", "line"),
    [
        ("tool/fs.list.d/cap", "tool/fs.list (tool/fs.list.d/cap was a {})"),
        ("tool/fs.stat", "tool/fs.stat (tool/fs.stat was a {})"),
        ("bin/tsh", "bin/tsh (it was a {})"),
        ("bin/ctxterm", "bin/ctxterm (it was a {})"),
        ("tool/tsh.d/config", "tool/tsh.d/config (it was a {})"),
    ],
)
def test_a_stand_in_where_bootstrap_writes_a_file_is_replaced(
    root: Path, kind: str, relative: str, line: str
) -> None:
    make, word = STAND_INS[kind]
    path = root / relative
    wanted = path.read_bytes()
    with (root / "tool/fs.list.d/policy").open("a") as stream:
        stream.write(POLICY_LINE)
    policy = (root / "tool/fs.list.d/policy").read_bytes()
    outside = Path("/etc/hostname").read_bytes()
    path.unlink()
    make(path)

    first, _ = repaired_twice(root)

    assert first.repaired == [line.format(word)]
    assert first.problems == []
    assert stat.S_ISREG(path.lstat().st_mode) and path.read_bytes() == wanted
    assert (root / "tool/fs.list.d/policy").read_bytes() == policy  # kept by the reinstall
    assert Path("/etc/hostname").read_bytes() == outside  # a link is never followed


def test_a_link_at_a_core_tools_policy_is_still_a_problem(root: Path) -> None:
    """The policy is the administrator's: a link there is reported, never replaced."""
    policy = root / "tool/fs.list.d/policy"
    policy.unlink()
    policy.symlink_to("/etc/hostname")

    report = storage.bootstrap(root)

    assert report.problems == [
        "tool/fs.list.d/policy is a symbolic link, not a control file; left untouched"
    ]
    assert policy.is_symlink()


# ------------------------------------------------------------------- what it reports


def test_the_command_lists_each_repair_and_then_has_nothing_to_do(root: Path) -> None:
    (root / "agent").chmod(0o777)
    (root / "tool/fs.list.d").chmod(0o777)

    text = ctx(root, "bootstrap")
    (root / "agent").chmod(0o777)
    as_json = ctx(root, "bootstrap", "--json")
    again = ctx(root, "bootstrap")

    assert text.returncode == 0, text.stderr
    assert "repaired  agent (mode 0777, now 0755)" in text.stdout.splitlines()
    assert "repaired  tool/fs.list.d (mode 0777, now 0755)" in text.stdout.splitlines()
    assert "nothing to do" not in text.stdout
    assert json.loads(as_json.stdout)["repaired"] == ["agent (mode 0777, now 0755)"]
    assert again.stdout.splitlines()[1:] == ["nothing to do: the storage root is complete"]


def test_a_damaged_tool_of_a_user_is_not_called_repaired(root: Path, tmp_path: Path) -> None:
    """Bootstrap has no manifest to reinstall a user's tool from: it says what fixes it, and
    never that the root is complete."""
    program = tmp_path / "mytool.sh"
    program.write_text("#!/bin/sh\necho mine\n")
    manifest = tmp_path / "mytool.json"
    document = {
        "manifest": 2,
        "kind": "tool",
        "name": "mytool",
        "description": "A user's tool.",
        "schema": {"type": "object"},
        "cap": {"side_effects": False, "network": False},
        "exec": program.name,
    }
    manifest.write_text(json.dumps(document))
    installed = ctx(root, "object", "install", "--tier", "user", str(manifest))
    assert installed.returncode == 0, installed.stderr
    tier = root / "home" / str(os.getuid()) / "tool"
    (tier / "mytool.d/hooks/post.d").rmdir()

    bootstrapped = ctx(root, "bootstrap")
    with pytest.raises(CtxError) as refused:
        read_controls(ToolObject("mytool", tier))

    assert bootstrapped.returncode == 0, bootstrapped.stderr
    (warning,) = [line for line in bootstrapped.stdout.splitlines() if "mytool" in line]
    assert warning.startswith(f"warning   home/{os.getuid()}/tool/mytool is damaged")
    assert "'ctx object install MANIFEST --tier user'" in warning
    assert "nothing to do" not in bootstrapped.stdout
    assert not (tier / "mytool.d/hooks/post.d").exists()
    assert "--tier user" in refused.value.message
    assert "repair the storage root" not in refused.value.message


def test_a_damaged_tool_of_a_shared_space_names_its_tier(root: Path) -> None:
    created = ctx(root, "shared", "create", "proj")
    assert created.returncode == 0, created.stderr
    tier = root / "shared/proj/tool"
    tool = ToolObject("ptool", tier)
    tool.control_dir.mkdir()
    tool.executable.write_text("#!/bin/sh\n")

    with pytest.raises(CtxError) as refused:
        read_controls(tool)

    assert "'ctx object install MANIFEST --tier shared:proj'" in refused.value.message
    assert "repair the storage root" not in refused.value.message


def test_a_damaged_core_tool_still_sends_its_user_to_bootstrap(root: Path) -> None:
    (root / "tool/fs.list.d/hooks/post.d").rmdir()

    with pytest.raises(CtxError) as refused:
        read_controls(ToolObject("fs.list", root / "tool"))

    assert refused.value.message.endswith("repair the storage root ('ctx bootstrap')")


def test_shared_create_on_a_queue_whose_config_is_a_fifo_is_no_complete_space(
    root: Path,
) -> None:
    assert ctx(root, "shared", "create", "proj").returncode == 0
    config = root / "shared/proj/queue/config"
    config.unlink()
    os.mkfifo(config)

    again = ctx(root, "shared", "create", "proj")
    status = ctx(root, "queue", "status", "--project", "proj")

    assert again.returncode != 0
    assert "complete" not in again.stdout
    assert f"ctx: EINVAL: {config} is a FIFO, not a regular file" in again.stderr
    assert f"{config} is a FIFO" in status.stderr
    assert stat.S_ISFIFO(config.lstat().st_mode)
