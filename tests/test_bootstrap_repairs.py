"""``ctx bootstrap`` repairs what it owns and only that (SPEC R-5, P-5 step 2, D-1).

What it owns — the root ABI directories, the core tools, ``bin/tsh``, ``bin/ctxterm``,
``tool/tsh.d/config`` and the manual bundle — when another uid could change it: a file it
writes whole is written anew, a directory it relies on nothing in is given back to the
storage root's owner and made writable by its owner alone, and the administrator's files
(policies, logs, settings, hooks) and the directories holding them are reported, never
given back.  A link, FIFO or socket where it writes a file whole is replaced; each repair is
listed, a second run repairs nothing.
Real directories, real modes and owners (a real second uid), real ``ctx`` processes.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest

import cortexfs.manual  # registers the manual bundle's bootstrap step
import cortexfs.tools.core.bootstrap  # noqa: F401  (registers the core tools' step)
from cortexfs import durable, storage
from cortexfs.errors import CtxError
from cortexfs.tools.controls import ToolObject, read_controls
from cortexfs.tools.core.launcher import same_program
from tests.support.cli import ctx
from tests.support.storage import copy_of_root
from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

POLICY_LINE = "allow coder_t tool:fs.list execute\n"


@pytest.fixture
def root(bootstrapped_by_ctx: Path, tmp_path: Path) -> Path:
    return copy_of_root(bootstrapped_by_ctx, tmp_path / "storage")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def repaired_twice(root: Path) -> tuple[storage.BootstrapReport, storage.BootstrapReport]:
    """Two bootstraps; the second must find nothing to do (R-5: idempotent)."""
    first = storage.bootstrap(root)
    second = storage.bootstrap(root)
    assert (second.created, second.repaired, second.problems) == ([], [], []), second.to_json()
    return first, second


# ------------------------------------------------------- directories it may give back


@pytest.mark.parametrize("loose", [0o777, 0o757])
def test_bin_which_it_writes_anew_is_made_the_owners_alone(root: Path, loose: int) -> None:
    relative = "bin"
    made = mode(root / relative)
    (root / relative).chmod(loose)

    first, _ = repaired_twice(root)

    assert f"{relative} (mode {loose:04o}, now {made:04o})" in first.repaired
    assert mode(root / relative) == made
    assert first.problems == []


def test_a_loose_storage_root_itself_is_reported_untouched(root: Path) -> None:
    """Whoever could write the root could have swapped its entries."""
    root.chmod(0o777)

    report = storage.bootstrap(root)

    assert report.repaired == [] and mode(root) == 0o777
    assert [problem for problem in report.problems if problem.startswith(str(root))], (
        report.problems
    )
    root.chmod(0o755)


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


def test_bin_of_another_uid_is_given_back(root: Path, unprivileged_user: UnprivilegedUser) -> None:
    relative = "bin"
    os.chown(root / relative, unprivileged_user.uid, -1)
    owner = root.stat().st_uid

    first, _ = repaired_twice(root)

    assert f"{relative} (owner uid {unprivileged_user.uid}, now uid {owner})" in first.repaired
    assert (root / relative).lstat().st_uid == owner


def test_user_data_below_a_reported_directory_is_untouched(
    root: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """A loose home/ is reported, and what users keep below it left as it is."""
    home = root / "home" / str(unprivileged_user.uid)
    home.mkdir(mode=0o700)
    os.chown(home, unprivileged_user.uid, unprivileged_user.gid)
    notes = home / "notes.txt"
    notes.write_text("mine\n")
    os.chown(notes, unprivileged_user.uid, unprivileged_user.gid)
    notes.chmod(0o666)
    (root / "home").chmod(0o777)

    report = storage.bootstrap(root)

    assert report.repaired == [] and [p for p in report.problems if p.startswith("home")]
    assert mode(root / "home") == 0o777
    assert (home.stat().st_uid, mode(home)) == (unprivileged_user.uid, 0o700)
    assert (notes.read_text(), notes.stat().st_uid, mode(notes)) == (
        "mine\n",
        unprivileged_user.uid,
        0o666,
    )


# ------------------------------------------------------ files it writes: written anew


def _loosen(path: Path, user: UnprivilegedUser) -> str:
    path.chmod(0o666 if stat.S_ISREG(path.lstat().st_mode) and mode(path) == 0o644 else 0o777)
    return f"mode {mode(path):04o}"


def _give_away(path: Path, user: UnprivilegedUser) -> str:
    os.chown(path, user.uid, -1)
    return f"owner uid {user.uid}"


DAMAGE: dict[str, Callable[[Path, UnprivilegedUser], str]] = {
    "loose": _loosen,
    "another uid's": _give_away,
}


@pytest.mark.parametrize("damage", DAMAGE)
@pytest.mark.parametrize(
    ("relative", "line"),
    [
        ("tool/fs.stat", "tool/fs.stat"),
        ("tool/fs.stat.d/schema", "tool/fs.stat"),
        ("bin/tsh", "bin/tsh ({}, rewritten)"),
        ("bin/ctxterm", "bin/ctxterm ({}, rewritten)"),
    ],
)
def test_a_file_it_writes_that_another_uid_could_change_is_written_anew(
    root: Path, relative: str, line: str, damage: str, unprivileged_user: UnprivilegedUser
) -> None:
    """Never given back: a new file from the source, which no descriptor of the old reaches."""
    path = root / relative
    wanted, wanted_mode, old = path.read_bytes(), mode(path), path.lstat().st_ino
    why = DAMAGE[damage](path, unprivileged_user)

    first, _ = repaired_twice(root)

    assert first.repaired == [line.format(why)]
    assert first.problems == []
    status = path.lstat()
    assert status.st_ino != old
    assert (status.st_uid, mode(path)) == (root.stat().st_uid, wanted_mode)
    assert same_program(path.read_bytes(), wanted)  # a launcher: its program, not its bytes


def test_a_writer_that_held_a_program_open_cannot_change_what_bootstrap_leaves(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """Whoever owned bin/tsh may keep it open for writing: a chown would leave them a way in."""
    root = traversable_tmp / "storage"
    assert storage.bootstrap(root).problems == []
    program = root / "bin/tsh"
    wanted = program.read_bytes()
    os.chown(program, unprivileged_user.uid, -1)
    holder = subprocess.Popen(
        [
            "/bin/sh",
            "-c",
            'exec 3<>"$1"; read -r go; printf "#!/bin/sh\\nid\\n" >&3',
            "sh",
            str(program),
        ],
        stdin=subprocess.PIPE,
        text=True,
        user=unprivileged_user.uid,
        group=unprivileged_user.gid,
        extra_groups=[],
    )
    try:
        time.sleep(0.3)  # the holder has opened it
        report = storage.bootstrap(root)
    finally:
        assert holder.stdin is not None
        holder.stdin.write("go\n")
        holder.stdin.close()
        assert holder.wait(timeout=30) == 0

    assert report.problems == []
    assert program.stat().st_uid == root.stat().st_uid
    assert same_program(program.read_bytes(), wanted)


# ------------------------------------------- the administrator's files and directories


@pytest.mark.parametrize(
    "relative",
    ["tool/fs.list.d/policy", "tool/fs.list.d/status", "tool/fs.list.d/log", "tool/tsh.d/config"],
)
@pytest.mark.parametrize("damage", DAMAGE)
def test_the_administrators_file_another_uid_could_change_is_reported_untouched(
    root: Path, relative: str, damage: str, unprivileged_user: UnprivilegedUser
) -> None:
    """Its content is the administrator's: giving it back would bless what another uid wrote."""
    path = root / relative
    with path.open("a") as stream:
        stream.write(POLICY_LINE if relative.endswith("policy") else "")
    why = DAMAGE[damage](path, unprivileged_user)
    before = (path.read_bytes(), path.lstat().st_uid, mode(path), path.lstat().st_ino)

    report = storage.bootstrap(root)
    again = storage.bootstrap(root)

    owner = root.stat().st_uid
    fix = f"'chown {owner} {path}'" if damage == "another uid's" else f"'chmod go-w {path}'"
    assert report.problems == [
        f"{relative} ({why}): what it says is the administrator's and could have been "
        "rewritten by another uid, so bootstrap leaves it as it is; check its content, "
        f"then {fix}"
    ]
    assert report.repaired == [] and again.problems == report.problems
    assert (path.read_bytes(), path.lstat().st_uid, mode(path), path.lstat().st_ino) == before


def test_an_agents_own_grant_in_a_core_tools_policy_is_never_given_to_root(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """The policy was the second uid's: the grant it wrote stays refused by the chain."""
    root = traversable_tmp / "storage"
    assert ctx(root, "bootstrap").returncode == 0
    policy = root / "tool/shell.exec.d/policy"
    os.chown(policy, unprivileged_user.uid, -1)
    grant = "allow coder_t tool:shell.exec execute\n"
    wrote = run_as(unprivileged_user, ["/bin/sh", "-c", f"printf '{grant}' >> {policy}"])
    assert wrote.returncode == 0, wrote.stderr

    text = ctx(root, "bootstrap")
    as_json = ctx(root, "bootstrap", "--json")

    assert text.returncode == 1 and as_json.returncode == 1
    problem = (
        f"tool/shell.exec.d/policy (owner uid {unprivileged_user.uid}): what it says is the "
        "administrator's and could have been rewritten by another uid, so bootstrap leaves "
        f"it as it is; check its content, then 'chown {root.stat().st_uid} {policy}'"
    )
    assert problem in text.stdout + text.stderr
    assert json.loads(as_json.stdout)["problems"] == [problem]
    assert policy.stat().st_uid == unprivileged_user.uid
    assert policy.read_text().endswith(grant)


@pytest.mark.parametrize("relative", ["agent", "model", "home", "shared"])
@pytest.mark.parametrize("damage", DAMAGE)
def test_a_directory_of_objects_looked_up_by_name_is_reported_untouched(
    root: Path, relative: str, damage: str, unprivileged_user: UnprivilegedUser
) -> None:
    """Whoever could write agent/ could have swapped two agents' control directories, or
    shared/ two spaces (all root's): giving the directory back would vouch for that."""
    path = root / relative
    why = DAMAGE[damage](path, unprivileged_user)
    before = (path.lstat().st_uid, mode(path))

    report = storage.bootstrap(root)

    assert report.repaired == []
    assert [problem for problem in report.problems if problem.startswith(f"{relative} ({why})")], (
        report.problems
    )
    assert (path.lstat().st_uid, mode(path)) == before


@pytest.mark.parametrize(
    "relative",
    ["tool", "tool/fs.list.d", "tool/fs.list.d/hooks", "tool/fs.list.d/hooks/pre.d"],
)
@pytest.mark.parametrize("damage", DAMAGE)
def test_a_directory_holding_the_administrators_files_is_reported_untouched(
    root: Path, relative: str, damage: str, unprivileged_user: UnprivilegedUser
) -> None:
    """Whoever could write it could have renamed or removed what is in it (a guard hook)."""
    path = root / relative
    guard = root / "tool/fs.list.d/hooks/pre.d/10-guard"
    guard.write_text("#!/bin/sh\nexit 3\n")
    guard.chmod(0o755)
    why = DAMAGE[damage](path, unprivileged_user)
    (root / "tool/fs.list.d/cap").unlink()  # damage bootstrap would repair in a trusted tree
    before = (path.lstat().st_uid, mode(path), sorted(os.listdir(path)))

    report = storage.bootstrap(root)

    owner = root.stat().st_uid
    fix = f"'chown {owner} {path}'" if damage == "another uid's" else f"'chmod go-w {path}'"
    assert report.problems == [
        f"{relative} ({why}): the administrator's files in it (a policy, a hook...) could "
        "have been renamed, replaced or removed by another uid, so bootstrap leaves it as it "
        f"is; check what it holds, then {fix}"
    ]
    assert "tool/fs.list" not in report.repaired
    assert (path.lstat().st_uid, mode(path), sorted(os.listdir(path))) == before
    assert not (root / "tool/fs.list.d/cap").exists()


@pytest.mark.parametrize("sticky_owner", ["the administrator", "another uid"])
def test_a_sticky_directory_others_may_write_is_reported_for_what_they_could_add(
    root: Path, sticky_owner: str, unprivileged_user: UnprivilegedUser
) -> None:
    """A sticky directory of the administrator's keeps its entries from others, who may still
    put a file where none was; one of another uid's is as any directory that uid may write."""
    path = root / "tool/fs.list.d/hooks/pre.d"
    path.chmod(0o1777)
    if sticky_owner == "another uid":
        os.chown(path, unprivileged_user.uid, unprivileged_user.gid)

    report = storage.bootstrap(root)

    owner = root.stat().st_uid
    if sticky_owner == "another uid":
        said = (
            "the administrator's files in it (a policy, a hook...) could have been renamed, "
            f"replaced or removed by another uid, so bootstrap leaves it as it is; check what "
            f"it holds, then 'chown {owner} {path}' and 'chmod go-w {path}'"
        )
    else:
        said = (
            "a file the administrator had not made yet (a policy, a hook...) could have been "
            "put in it by another uid, so bootstrap leaves it as it is; check what it holds, "
            f"then 'chmod go-w {path}'"
        )
    assert len(report.problems) == 1 and report.problems[0].endswith(said), report.problems


def test_a_loose_tsh_d_is_neither_written_nor_read(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser, tmp_path: Path
) -> None:
    """tool/tsh.d of another uid, a link at config and the temporary name swapped for a link
    by that uid as soon as bootstrap creates it: nothing outside is changed, and the directory
    is reported rather than taken back."""
    root = traversable_tmp / "storage"
    assert storage.bootstrap(root).problems == []
    victim = tmp_path / "victim"
    victim.write_text("secret\n")
    victim.chmod(0o600)
    tsh_d = root / "tool/tsh.d"
    os.chown(tsh_d, unprivileged_user.uid, -1)
    (tsh_d / "config").unlink()
    (tsh_d / "config").symlink_to("/nonexistent")
    swapped: list[str] = []

    class SwapsTheTemporary(durable.FsOps):
        """The other uid's move: the temporary file renamed away and a link put in its name."""

        def create_file(self, name: str, dir_fd: int, mode: int = 0o666) -> int:
            fd = super().create_file(name, dir_fd, mode)
            if name.startswith(".config."):
                script = 'cd "$1" && mv "$2" "$2.moved" && ln -s "$3" "$2"'
                argv = ["/bin/sh", "-c", script, "sh", str(tsh_d), name, str(victim)]
                done = run_as(unprivileged_user, argv)
                assert done.returncode == 0, done.stderr
                swapped.append(name)
            return fd

    with mock.patch.object(durable, "_DEFAULT_OPS", SwapsTheTemporary()):
        report = storage.bootstrap(root)

    assert mode(victim) == 0o600
    assert swapped == []  # nothing was written in the directory
    assert tsh_d.lstat().st_uid == unprivileged_user.uid
    assert "tool/tsh.d/config (it was a symbolic link)" not in report.repaired
    assert report.problems[0].startswith(f"tool/tsh.d (owner uid {unprivileged_user.uid}): ")


def test_replacing_a_file_sets_its_mode_through_its_descriptor(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser, tmp_path: Path
) -> None:
    """durable.replace_file_synced never reaches its temporary file by name again."""
    directory = traversable_tmp / "dir"
    directory.mkdir()
    os.chown(directory, unprivileged_user.uid, -1)
    victim = tmp_path / "victim"
    victim.write_text("secret\n")
    victim.chmod(0o600)

    class SwapsTheTemporary(durable.FsOps):
        def create_file(self, name: str, dir_fd: int, mode: int = 0o666) -> int:
            fd = super().create_file(name, dir_fd, mode)
            script = 'cd "$1" && mv "$2" "$2.moved" && ln -s "$3" "$2"'
            argv = ["/bin/sh", "-c", script, "sh", str(directory), name, str(victim)]
            done = run_as(unprivileged_user, argv)
            assert done.returncode == 0, done.stderr
            return fd

    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        durable.replace_file_synced(SwapsTheTemporary(), dir_fd, "config", b"x\n", 0o644)
    finally:
        os.close(dir_fd)

    assert mode(victim) == 0o600


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
    assert stat.S_ISREG(path.lstat().st_mode) and same_program(path.read_bytes(), wanted)
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
    (root / "bin").chmod(0o777)
    (root / "bin/tsh").chmod(0o777)

    text = ctx(root, "bootstrap")
    (root / "bin").chmod(0o777)
    as_json = ctx(root, "bootstrap", "--json")
    again = ctx(root, "bootstrap")

    assert text.returncode == 0, text.stderr
    assert "repaired  bin (mode 0777, now 0755)" in text.stdout.splitlines()
    assert "repaired  bin/tsh (mode 0777, rewritten)" in text.stdout.splitlines()
    assert "nothing to do" not in text.stdout
    assert json.loads(as_json.stdout)["repaired"] == ["bin (mode 0777, now 0755)"]
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


def test_a_core_program_grown_sparse_is_rewritten_without_being_read(root: Path) -> None:
    """A core tool's executable made 4 GiB (sparse) is found different after reading one byte
    more than the launcher, and rewritten: in a moment and in 1 GiB of address space."""
    program = root / "tool" / "fs.stat"
    launcher = program.read_bytes()
    os.truncate(program, 4 << 30)

    def limited_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    started = time.monotonic()
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ctx")), "--storage", str(root), "bootstrap"],
        capture_output=True,
        text=True,
        preexec_fn=limited_memory,
        timeout=60,
    )

    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "repaired  tool/fs.stat" in done.stdout, done.stdout
    assert same_program(program.read_bytes(), launcher) and time.monotonic() - started < 10


class _OtherBootstrapFirst(durable.FsOps):
    """Real operations, except that the entry ``name`` of the root is made by someone else
    (another bootstrap running at the same time) just before this one makes it."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def mkdir(self, name: str, dir_fd: int, mode: int = 0o777) -> None:
        if name == self.name:
            os.mkdir(name, storage.ABI_MODE, dir_fd=dir_fd)
        super().mkdir(name, dir_fd, mode)


def test_an_entry_another_bootstrap_made_first_is_not_reported_created(tmp_path: Path) -> None:
    """R-5: of two bootstraps of one fresh root, each entry is reported created by the one
    that made it, not by both."""
    root = tmp_path / "storage"
    report = storage.ensure_root_abi(root, ops=_OtherBootstrapFirst("shared"))
    assert (root / "shared").is_dir()
    assert "shared" not in report.created
    assert {"bin", "tool", "home"} <= set(report.created), report.created


def test_a_root_bootstrapped_through_a_link_and_by_its_path_is_left_as_it_is(
    tmp_path: Path,
) -> None:
    """R-5: run again, bootstrap changes nothing, whichever name of the root it is given: its
    ctxterm keeps naming the root as the first run named it (a link such as
    ``storage/current`` stays followed after a switch of it), where each run rewrote it."""
    root, link = tmp_path / "root", tmp_path / "current"
    root.mkdir()
    link.symlink_to(root.name)
    assert ctx(link, "bootstrap").returncode == 0
    for name in (root, link, root):
        again = ctx(name, "bootstrap", "--json")
        assert again.returncode == 0 and json.loads(again.stdout)["repaired"] == [], again.stdout
    assert f"main(storage={str(link)!r})" in (root / "bin" / "ctxterm").read_text()


def test_a_core_tools_origin_nested_past_any_json_is_repaired_as_any_that_is_no_json(
    tmp_path: Path,
) -> None:
    """R-5, T-1: an ``origin`` nested thousands deep is no JSON a reader takes (it recursed
    until bootstrap died); bootstrap writes it back as it writes back one that is no JSON."""
    root = tmp_path / "root"
    assert ctx(root, "bootstrap").returncode == 0
    origin = root / "tool" / "fs.list.d" / "origin"
    origin.write_text("[" * 5000 + "]" * 5000)

    repaired = ctx(root, "bootstrap")

    assert repaired.returncode == 0 and "Traceback" not in repaired.stderr, repaired.stderr
    assert isinstance(json.loads(origin.read_text()), dict)
