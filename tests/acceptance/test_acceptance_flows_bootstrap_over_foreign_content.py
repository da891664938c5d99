"""``ctx bootstrap`` over a storage root that already holds things it did not make (SPEC R-1,
R-2, R-4, R-5; docs/tools.md "ctx bootstrap (R-5)"): at every name of the root ABI, at the
names of the core tools, their ``.d`` control directories and controls, at ``bin/tsh``,
``bin/ctxterm`` and ``tool/tsh.d/config``, and beside the six at the root's top level, a
regular file, an empty file, a symbolic link to elsewhere, a dangling link, a FIFO, a socket,
a hard link to a file outside, a directory holding a user's files, or one of another uid and
mode.  For each: what bootstrap says (exit status, the ``created`` / ``repaired`` /
``problem`` / ``warning`` lines, ``--json``), that no user data is destroyed and nothing
outside the root is followed, read or written, that a second run changes nothing, and that
the root works (a core tool runs for an agent) once what was in the way is moved aside."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    ROOT_ENTRIES,
    OnStorage,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    scratch_top,
)
from tests.acceptance.workercli import AGENT, allow_in_tool_policy, make_agent
from tests.support.users import find_or_create_user, run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents and other uids")

SCRATCH = scratch_top(__file__)
COMPLETE = "nothing to do: the storage root is complete"
OTHER_UID = 4321  # a uid no account has: "another uid" of docs/tools.md
IN_THE_WAY = "exists but is not a directory; left untouched"


# ============================================================================ helpers


@dataclass
class Place(OnStorage):
    """A scratch directory every uid may search holding ``root`` (the storage root, made but
    empty unless a test bootstraps it), ``outside`` (a user's files beside the root) and
    ``aside`` (where a user moves what was in the way)."""

    top: Path
    storage: Path
    outside: Path
    aside: Path

    def boot(self, *extra: str) -> Run:
        return ctx_run("bootstrap", "--storage", self.storage, *extra)

    def boot_json(self) -> tuple[Run, dict]:
        r = self.boot("--json")
        return r, json.loads(r.out)

    def outside_file(self, name: str, text: str) -> Path:
        path = self.outside / name
        path.write_text(text)
        return path


@pytest.fixture
def place() -> Iterator[Place]:
    top = new_scratch_dir(SCRATCH, "b-")
    p = Place(top, top / "root", top / "outside", top / "aside")
    for directory in (p.storage, p.outside, p.aside):
        directory.mkdir(mode=0o755)
        directory.chmod(0o755)
    (p.outside / "thesis.txt").write_text("a user's own words\n")
    (p.outside / "sub").mkdir()
    (p.outside / "sub" / "data.csv").write_text("a,b\n1,2\n")
    try:
        yield p
    finally:
        shutil.rmtree(top, ignore_errors=True)


def make_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))  # the socket file stays after the close


def put_foreign(path: Path, kind: str, p: Place) -> None:
    """Put a thing of ``kind`` at ``path`` (whatever was there removed first)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    if kind == "file":
        path.write_text("a user's file\n")
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "link-dir":
        path.symlink_to(p.outside)
    elif kind == "link-file":
        path.symlink_to(p.outside / "thesis.txt")
    elif kind == "dangling":
        path.symlink_to(p.outside / "not-there")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        make_socket(path)
    elif kind == "hard":
        os.link(p.outside / "thesis.txt", path)
    elif kind == "dir":
        path.mkdir()
        (path / "notes.txt").write_text("kept here on purpose\n")
    else:
        raise AssertionError(kind)


def identity(path: Path) -> tuple:
    """What a user would call the same entry: inode, type and mode, owner, size, mtime, and
    the target of a link or the bytes of a regular file."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        held: object = os.readlink(path)
    elif stat.S_ISREG(st.st_mode):
        held = hashlib.sha256(path.read_bytes()).hexdigest()
    else:
        held = None
    return (st.st_ino, st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, held)


def tree(top: Path) -> dict[str, tuple]:
    """Every entry below ``top`` (``top`` itself included), by relative path, links never
    followed."""
    found = {".": identity(top)}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            found[str(path.relative_to(top))] = identity(path)
    return found


def agent_runs(p: Place, tool: str, value: dict) -> dict:
    """``ctx run --native --agent ci TOOL`` with ``value``: its result frame."""
    r = p.ctx("run", "--native", "--agent", AGENT, tool, input=json.dumps(value))
    frames = [json.loads(line) for line in r.lines()]
    assert frames and frames[-1]["type"] == "result", r
    return frames[-1]


def grant(p: Place, *tools: str) -> None:
    """Agent ``ci`` (uid nobody) with both layers of P-6 for ``tools``."""
    make_agent(p.storage, list(tools))
    for tool in tools:
        allow_in_tool_policy(p.storage, tool)


def refusal_line(r: Run, code: str, count: int) -> None:
    """The last line on stderr every bootstrap that leaves problems ends with."""
    plural = "problems as they were" if count > 1 else "problem as it was"
    assert r.err.startswith(f"ctx: {code}: bootstrap of {r.argv[2]} left {count} {plural}"), r
    # The command it suggests names the root it was given (docs/queue.md, R-1).
    assert f"run 'ctx bootstrap --storage {r.argv[2]}' again" in r.err, r
    assert "Traceback" not in r.err, r


# ================================================================ the six root names


# Each root name taken by one kind of foreign entry, each kind at least once.
ROOT_CASES = [
    ("bin", "hard"),
    ("tool", "fifo"),
    ("tool", "file"),
    ("model", "empty"),
    ("home", "link-dir"),
    ("shared", "socket"),
]


@pytest.mark.parametrize(("name", "kind"), ROOT_CASES, ids=[f"{n}-{k}" for n, k in ROOT_CASES])
def test_a_root_name_taken_by_a_foreign_entry_is_one_problem_and_stops_only_its_part(
    place, name, kind
):
    """R-2, R-5: bootstrap of a fresh root whose ``NAME`` is already a file, link, FIFO,
    socket or hard link names it in exactly one problem (exit 1, ENOTDIR on stderr), makes
    every other root directory and every part that does not live below ``NAME`` (the core
    tools, ``bin/tsh``, the manual bundle), and leaves the entry and what it leads to exactly
    as they were; a second run says the same and makes nothing."""
    p = place
    entry = p.storage / name
    put_foreign(entry, kind, p)
    kept, outside = identity(entry), tree(p.outside)

    r, report = p.boot_json()

    assert r.rc == 1, r
    refusal_line(r, "ENOTDIR", 1)
    assert report["problems"] == [f"{name}: {IN_THE_WAY}"], report
    assert (report["repaired"], report["warnings"]) == ([], []), report
    made = set(report["created"])
    assert (ROOT_ENTRIES - {name}) <= made and name not in made, report
    for part, below in (
        ("tool/fs.stat", "tool"),
        ("tool/tsh.d/config", "tool"),
        ("bin/tsh", "bin"),
        ("bin/ctxterm", "bin"),
        ("shared/cortexfs-docs/man/ctx.tool.md", "shared"),
    ):
        assert (part in made) == (below != name), (part, report)
        assert not any(m.startswith(f"{name}/") for m in made), report
    assert identity(entry) == kept
    assert tree(p.outside) == outside
    assert sorted(os.listdir(p.storage)) == sorted(ROOT_ENTRIES)

    again, second = p.boot_json()
    assert again.rc == 1, again
    assert second["problems"] == report["problems"], second
    assert (second["created"], second["repaired"], second["warnings"]) == ([], [], []), second
    assert identity(entry) == kept and tree(p.outside) == outside


def test_all_six_taken_then_moved_aside_make_a_root_whose_core_tool_runs(place):
    """R-2, R-5: every root name taken at once (a hard link to a file outside, a FIFO, a
    socket, an empty file, a link to a directory outside, a user's regular file): the text
    output names each in a ``problem`` line and nothing below them is made.  Moved aside
    by the user, the next bootstrap makes the six and everything below them (exit 0), the
    one after has nothing to do, an agent's core tool call lists exactly the six, and each
    moved entry is still what it was."""
    p = place
    kinds = {
        "bin": "hard",
        "tool": "fifo",
        "agent": "file",
        "model": "empty",
        "home": "link-dir",
        "shared": "socket",
    }
    for name, kind in kinds.items():
        put_foreign(p.storage / name, kind, p)
    kept = {name: identity(p.storage / name) for name in kinds}
    outside = tree(p.outside)

    r = p.boot()

    assert r.rc == 1 and r.lines()[0] == f"storage root: {p.storage}", r
    assert not [line for line in r.lines() if line.startswith(("created", "repaired"))], r
    for name in kinds:
        assert f"problem   {name}: {IN_THE_WAY}" in r.lines(), (name, r)
    refusal_line(r, "ENOTDIR", len([x for x in r.lines() if x.startswith("problem")]))
    assert {name: identity(p.storage / name) for name in kinds} == kept
    assert tree(p.outside) == outside

    for name in kinds:
        os.rename(p.storage / name, p.aside / name)
    fixed = p.boot()
    assert fixed.rc == 0 and fixed.err == "", fixed
    for name in ROOT_ENTRIES:
        assert f"created   {name}" in fixed.lines(), (name, fixed)
    assert "created   tool/fs.list" in fixed.lines(), fixed
    assert not [line for line in fixed.lines() if line.startswith(("problem", "warning"))]
    again = p.boot()
    assert again.rc == 0 and again.lines()[-1] == COMPLETE, again
    assert {name: identity(p.aside / name) for name in kinds} == kept
    assert tree(p.outside) == outside

    grant(p, "fs.list")
    result = agent_runs(p, "fs.list", {"path": "/ctx"})
    assert result["status"] == "ok", result
    assert {e["name"] for e in result["output"]["entries"]} == ROOT_ENTRIES, result


@pytest.mark.parametrize("kind", ["file", "link-dir"])
def test_a_file_or_link_at_agent_is_one_problem_naming_agent(place, kind):
    """R-5 (docs: every problem names its path): ``agent`` taken by a user's file or by a link
    to a directory outside is one problem, ``agent: exists but is not a directory``, as
    ``tool``, ``home`` and the others are — not a second line for the same cause headed by
    the name of a module of ctx."""
    p = place
    put_foreign(p.storage / "agent", kind, p)
    r, report = p.boot_json()
    assert r.rc == 1, r
    assert not any(x.startswith("cortexfs.") for x in report["problems"]), report
    assert report["problems"] == [f"agent: {IN_THE_WAY}"], report


def test_a_shared_link_to_a_directory_outside_is_never_followed(place):
    """R-1, R-5: ``shared`` is a symbolic link to a user's directory outside the root, which
    holds a project tree with a ``tool/`` (and in it a directory whose name looks like what an
    interrupted install leaves, holding the user's thesis).  Bootstrap reports ``shared`` as
    in the way and left untouched: nothing below the link may be read as a tier of this root,
    locked, or removed."""
    p = place
    tools = p.outside / "proj" / "tool"
    staged = tools / ".notes~0123456789ab~controls"
    staged.mkdir(parents=True)
    (staged / "thesis.txt").write_text("chapter one\n")
    (p.outside / "proj" / "data").mkdir()
    (p.outside / "proj" / "data" / "input.csv").write_text("x\n1\n")
    (p.storage / "shared").symlink_to(p.outside)
    outside = tree(p.outside)

    r, report = p.boot_json()

    assert r.rc == 1 and f"shared: {IN_THE_WAY}" in report["problems"], r
    assert (staged / "thesis.txt").exists(), "bootstrap removed a user's tree outside the root"
    assert tree(p.outside) == outside
    assert not any(str(p.outside) in line for line in report["repaired"]), report


def test_a_home_link_to_a_directory_outside_gets_nothing_written(place):
    """R-1, R-4, R-5: ``home`` is a link to another directory that happens to hold ``0/tool/``
    (root's user tier in another root, say).  Bootstrap reports ``home`` as in the way; the
    directory the link names is not this root's and receives nothing."""
    p = place
    (p.outside / "0" / "tool").mkdir(parents=True)
    (p.outside / "0" / "notes").write_text("root's notes\n")
    (p.storage / "home").symlink_to(p.outside)
    outside = tree(p.outside)

    r, report = p.boot_json()

    assert r.rc == 1 and report["problems"] == [f"home: {IN_THE_WAY}"], r
    assert sorted(os.listdir(p.outside / "0" / "tool")) == []
    assert tree(p.outside) == outside


def test_a_tool_link_to_a_directory_outside_is_not_read_as_the_system_tier(place):
    """R-5 (docs: a link at one of the six root entries is reported and left untouched, never
    followed): ``tool`` is a link to a user's directory.  The one problem says so; no line
    calls the user's files damaged tools of this root or tells to reinstall them."""
    p = place
    (p.storage / "tool").symlink_to(p.outside)
    outside = tree(p.outside)

    r, report = p.boot_json()

    assert r.rc == 1 and report["problems"] == [f"tool: {IN_THE_WAY}"], r
    assert tree(p.outside) == outside
    assert report["warnings"] == [], report


# ==================================================== directories of another uid and mode


def test_root_directories_of_another_uid_keep_the_users_files(place):
    """R-5 (docs: what another uid could change): ``bin/``, ``model/`` and ``home/`` exist,
    owned by another uid, mode 0777, each holding that uid's file.  ``bin/`` (whose files
    bootstrap writes anew) is given back, saying so, and gets ``tsh``; ``model/`` and
    ``home/`` (whose entries are looked up by name) are problems naming the chown and chmod,
    left as they are.  No user file is removed or changed; a second run repairs nothing
    more and says the same problems."""
    p = place
    users = {}
    for name in ("bin", "model", "home"):
        directory = p.storage / name
        directory.mkdir()
        mine = directory / "mine.txt"
        mine.write_text(f"{name}: the other uid's\n")
        os.chown(directory, OTHER_UID, OTHER_UID)
        os.chown(mine, OTHER_UID, OTHER_UID)
        directory.chmod(0o777)
        users[mine] = identity(mine)
    held = {n: identity(p.storage / n) for n in ("model", "home")}

    r, report = p.boot_json()

    assert r.rc == 1, r
    refusal_line(r, "EACCES", 2)
    assert f"bin (owner uid {OTHER_UID}, now uid 0; mode 0777, now 0755)" in report["repaired"]
    assert len(report["problems"]) == 2, report
    for problem, name in zip(report["problems"], ("model", "home"), strict=True):
        path = p.storage / name
        assert problem.startswith(f"{name} (owner uid {OTHER_UID}, mode 0777): "), problem
        assert "bootstrap leaves it as it is" in problem, problem
        assert f"'chown 0 {path}'" in problem and f"'chmod go-w {path}'" in problem, problem
    assert {n: identity(p.storage / n) for n in ("model", "home")} == held
    bin_status = os.stat(p.storage / "bin")
    assert (bin_status.st_uid, stat.S_IMODE(bin_status.st_mode)) == (0, 0o755)
    assert (p.storage / "bin" / "tsh").stat().st_mode & 0o111
    assert {m: identity(m) for m in users} == users

    again, second = p.boot_json()
    assert again.rc == 1 and second["problems"] == report["problems"], again
    assert (second["created"], second["repaired"]) == ([], []), second
    assert {m: identity(m) for m in users} == users


def test_a_shared_directory_another_uid_could_change_gets_nothing_written(place):
    """R-5 (docs/tools.md: a directory whose entries are looked up by name, ``shared/``
    among them, is reported and left as it is; 'Bootstrap writes nothing into it'):
    ``shared/`` owned by another uid, mode 0777, holding that uid's file, is one problem and
    receives no entry."""
    p = place
    shared = p.storage / "shared"
    shared.mkdir()
    (shared / "mine.txt").write_text("the other uid's\n")
    os.chown(shared, OTHER_UID, OTHER_UID)
    shared.chmod(0o777)

    r, report = p.boot_json()

    assert r.rc == 1 and len(report["problems"]) == 1, r
    assert report["problems"][0].startswith(f"shared (owner uid {OTHER_UID}, mode 0777): ")
    assert "bootstrap leaves it as it is" in report["problems"][0], report
    assert sorted(os.listdir(shared)) == ["mine.txt"], report["created"]


# =========================================================== stray entries at the root


def test_strangers_at_the_root_are_one_warning_kept_unfollowed_and_never_shown(place):
    """R-2, R-5: beside the six, the root holds a user's directory named ``logs``, a FIFO
    ``queue``, a socket ``registry``, a link ``mcp`` to a directory outside, a hard link to a
    file outside and a file whose name holds a newline and an escape sequence.  Bootstrap
    makes the root (exit 0) and says so in one warning naming each (the odd name escaped in
    the text, exact in ``--json``); a second run warns the same and changes nothing; nothing
    is removed, opened or followed; an agent's ``/ctx`` shows exactly the six."""
    p = place
    odd = "odd\nname\x1b[31m"
    put_foreign(p.storage / "logs", "dir", p)
    put_foreign(p.storage / "queue", "fifo", p)
    put_foreign(p.storage / "registry", "socket", p)
    put_foreign(p.storage / "mcp", "link-dir", p)
    put_foreign(p.storage / "linked", "hard", p)
    (p.storage / odd).write_text("x\n")
    strangers = ["logs", "linked", "mcp", odd, "queue", "registry"]
    kept = {name: identity(p.storage / name) for name in strangers}
    kept_logs, outside = tree(p.storage / "logs"), tree(p.outside)

    r, report = p.boot_json()

    assert r.rc == 0 and r.err == "", r
    assert report["problems"] == [] and len(report["warnings"]) == 1, report
    [warning] = report["warnings"]
    assert warning.startswith(", ".join(sorted(strangers)) + f" at the root of {p.storage} "), (
        warning
    )
    assert "not part of the root ABI" in warning and "move them elsewhere" in warning
    assert set(report["created"]) >= ROOT_ENTRIES, report

    text = p.boot()
    assert text.rc == 0, text
    assert [x for x in text.lines() if not x.startswith("storage root:")] == [
        "warning   " + warning.replace("\n", "\\x0a").replace("\x1b", "\\x1b")
    ], text
    assert "\x1b" not in text.out, text
    assert {name: identity(p.storage / name) for name in strangers} == kept
    assert tree(p.storage / "logs") == kept_logs and tree(p.outside) == outside

    grant(p, "fs.list")
    result = agent_runs(p, "fs.list", {"path": "/ctx"})
    assert result["status"] == "ok", result
    assert sorted(e["name"] for e in result["output"]["entries"]) == sorted(ROOT_ENTRIES)


# ======================================================= core tool names and controls


def test_foreign_entries_at_core_tool_names_are_replaced_or_kept_and_the_tools_run(place):
    """R-5, T-1, H-1 (docs: links, FIFOs and sockets where bootstrap writes a file): on a
    bootstrapped root, a core tool's executable becomes a user's file, a link to a file
    outside, a FIFO, a socket, a directory of the user's notes and a hard link to a file
    outside; a control directory becomes a user's file; a ``policy`` a link outside;
    ``tool/tsh.d/hooks`` a FIFO; ``bin/tsh`` a directory of notes; ``bin/ctxterm`` a hard
    link outside.  Bootstrap replaces what it writes whole (saying what each was), reports
    the rest as problems left untouched (exit 1), never changes a file outside; a second run
    says the same problems only.  The replaced tools run for an agent, and once the user
    moves aside what was in the way the root is complete."""
    p = place
    assert p.boot().rc == 0
    grant(p, "fs.stat", "fs.list")
    tools, bins = p.storage / "tool", p.storage / "bin"
    policy = (tools / "fs.stat.d" / "policy").read_bytes()
    for name in ("f", "g", "h", "i"):
        p.outside_file(name, f"outside file {name}\n")
    put_foreign(tools / "fs.read", "file", p)
    put_foreign(tools / "fs.list", "link-file", p)
    put_foreign(tools / "fs.stat", "fifo", p)
    put_foreign(tools / "fs.write", "socket", p)
    put_foreign(tools / "shell.exec", "dir", p)
    (tools / "tsh.config").unlink()
    os.link(p.outside / "g", tools / "tsh.config")
    put_foreign(tools / "agent.update.d", "file", p)
    (tools / "agent.create.d" / "policy").unlink()
    (tools / "agent.create.d" / "policy").symlink_to(p.outside / "h")
    put_foreign(tools / "tsh.d" / "hooks", "fifo", p)
    put_foreign(bins / "tsh", "dir", p)
    (bins / "ctxterm").unlink()
    os.link(p.outside / "i", bins / "ctxterm")
    in_the_way = [
        tools / "shell.exec",
        tools / "agent.update.d",
        tools / "agent.create.d" / "policy",
        tools / "tsh.d" / "hooks",
        bins / "tsh",
    ]
    kept = {path: identity(path) for path in in_the_way}
    notes = {path: tree(path) for path in (tools / "shell.exec", bins / "tsh")}
    outside = tree(p.outside)

    r, report = p.boot_json()

    assert r.rc == 1, r
    refusal_line(r, "EEXIST", 5)
    assert report["created"] == [] and report["warnings"] == [], report
    assert sorted(report["repaired"]) == [
        "bin/ctxterm",
        "tool/fs.list (tool/fs.list was a symbolic link)",
        "tool/fs.read",
        "tool/fs.stat (tool/fs.stat was a FIFO)",
        "tool/fs.write (tool/fs.write was a socket)",
        "tool/tsh.config",
    ], report
    assert report["problems"] == [
        "tool/shell.exec is a directory, not an executable file; left untouched",
        "tool/agent.update.d is a file, not a control directory; left untouched",
        "tool/agent.create.d/policy is a symbolic link, not a control file; left untouched",
        "tool/tsh.d/hooks is a special file, not a directory; left untouched",
        "bin/tsh: not a regular file; left untouched",
    ], report
    assert {path: identity(path) for path in in_the_way} == kept
    assert {path: tree(path) for path in notes} == notes
    assert tree(p.outside) == outside
    for replaced in ("fs.read", "fs.list", "fs.stat", "fs.write", "tsh.config"):
        st = os.lstat(tools / replaced)
        assert stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_mode & 0o111, replaced
    assert os.lstat(bins / "ctxterm").st_nlink == 1
    assert (tools / "fs.stat.d" / "policy").read_bytes() == policy

    again, second = p.boot_json()
    assert again.rc == 1 and second["problems"] == report["problems"], again
    assert (second["created"], second["repaired"], second["warnings"]) == ([], [], []), second

    stat_result = agent_runs(p, "fs.stat", {"path": "/ctx"})
    assert stat_result["status"] == "ok", stat_result
    assert stat_result["output"]["type"] == "directory", stat_result
    listed = agent_runs(p, "fs.list", {"path": "/ctx/tool"})
    assert listed["status"] == "ok", listed
    # the agent's view of tool/ shows the tools it is granted, the repaired ones among them
    assert {"fs.list", "fs.stat"} <= {e["name"] for e in listed["output"]["entries"]}, listed

    for path in in_the_way:
        os.rename(path, p.aside / f"{path.parent.name}-{path.name}")
    fixed, last = p.boot_json()
    assert fixed.rc == 0 and (last["problems"], last["warnings"]) == ([], []), fixed
    assert sorted(last["created"]) == ["bin/tsh", "tool/shell.exec"], last
    assert sorted(last["repaired"]) == ["tool/agent.create", "tool/agent.update", "tool/tsh"]
    done = p.boot()
    assert done.rc == 0 and done.lines()[-1] == COMPLETE, done
    assert tree(p.outside) == outside
    assert tree(p.aside / "tool-shell.exec") == notes[tools / "shell.exec"]


CONFIG_CASES = {
    "link-file": "repaired  tool/tsh.d/config (it was a symbolic link)",
    "fifo": "repaired  tool/tsh.d/config (it was a FIFO)",
    "dir": "problem   tool/tsh.d/config is not a regular file; left untouched",
    "empty": None,
}


@pytest.mark.parametrize("kind", list(CONFIG_CASES))
def test_tsh_config_taken_by_a_foreign_entry(place, kind):
    """R-5, H-4: ``tool/tsh.d/config`` is a link to a file outside, a FIFO, a directory of
    the user's notes or an empty file.  A link or FIFO holds nobody's settings and is
    replaced by the defaults, never followed (what it named is unchanged); a directory is a
    problem, left with its notes; an empty file is the administrator's (every default) and
    kept.  The second run changes nothing, and ``ctx tool tsh.config`` reads the settings
    (refused without a traceback while a directory is in the way)."""
    p = place
    assert p.boot().rc == 0
    config = p.storage / "tool" / "tsh.d" / "config"
    defaults = config.read_text()
    put_foreign(config, kind, p)
    before, outside = identity(config), tree(p.outside)
    notes = tree(config) if kind == "dir" else None

    r = p.boot()

    said = [x for x in r.lines() if not x.startswith("storage root:")]
    expected = CONFIG_CASES[kind]
    assert tree(p.outside) == outside
    if expected is None:
        assert r.rc == 0 and said == [COMPLETE], r
        assert identity(config) == before
    elif expected.startswith("problem"):
        assert r.rc == 1 and said == [expected], r
        refusal_line(r, "EEXIST", 1)
        assert identity(config) == before and tree(config) == notes
    else:
        assert r.rc == 0 and said == [expected], r
        st = os.lstat(config)
        assert stat.S_ISREG(st.st_mode) and config.read_text() == defaults
    again = p.boot()
    assert again.rc == r.rc, again
    assert [x for x in again.lines()[1:] if not x.startswith("problem")] in ([], [COMPLETE])
    shown = p.ctx("tool", "tsh.config")
    if expected is not None and expected.startswith("problem"):
        assert shown.rc != 0 and "Traceback" not in shown.err, shown
    else:
        assert shown.rc == 0, shown


# ========================================================================== non-root


def test_a_users_own_root_with_foreign_entries_is_bootstrapped_as_that_user(place):
    """R-1, R-5 as an ordinary uid: the test user's own root holds a FIFO at ``model``, a
    dangling link at ``home`` and a stray file of its own.  Bootstrap run as that user makes
    the rest, all the user's, names the two problems and the stray, and leaves them; a second
    run says the same and makes nothing."""
    user = find_or_create_user()
    p = place
    os.chown(p.storage, user.uid, user.gid)
    put_foreign(p.storage / "model", "fifo", p)
    put_foreign(p.storage / "home", "dangling", p)
    (p.storage / "notes.txt").write_text("the user's notes\n")
    for name in ("model", "home", "notes.txt"):
        os.chown(p.storage / name, user.uid, user.gid, follow_symlinks=False)
    kept = {n: identity(p.storage / n) for n in ("model", "home", "notes.txt")}
    env = clean_env(HOME=str(p.top), PATH=os.environ.get("PATH", "/usr/bin:/bin"))
    argv = [*CTX_ARGV, "bootstrap", "--storage", str(p.storage), "--json"]

    done = run_as(user, argv, env=env, cwd=p.top)

    assert done.returncode == 1 and "Traceback" not in done.stderr, done
    report = json.loads(done.stdout)
    assert report["problems"] == [f"model: {IN_THE_WAY}", f"home: {IN_THE_WAY}"], report
    assert len(report["warnings"]) == 1 and report["warnings"][0].startswith("notes.txt "), report
    assert {"bin", "tool", "agent", "shared", "tool/fs.read", "bin/tsh"} <= set(
        report["created"]
    ), report
    for made in ("bin", "tool", "tool/fs.read", "bin/tsh", "shared/cortexfs-docs"):
        assert os.lstat(p.storage / made).st_uid == user.uid, made
    assert {n: identity(p.storage / n) for n in kept} == kept

    again = run_as(user, argv, env=env, cwd=p.top)
    second = json.loads(again.stdout)
    assert again.returncode == 1 and second["problems"] == report["problems"], again
    assert (second["created"], second["repaired"]) == ([], []), second
    assert {n: identity(p.storage / n) for n in kept} == kept
