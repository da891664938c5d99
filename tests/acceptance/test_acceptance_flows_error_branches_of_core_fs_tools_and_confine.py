"""The error branches of the core fs tools (``fs.read``, ``fs.list``, ``fs.stat``, ``fs.write``,
``shell.exec``) and of the confinement of their paths to the agent's visible mounts, reached
from outside through ``ctx run --agent A [--native] TOOL``.

Sources: SPEC R-5, T-2, T-3, T-5, T-7; docs/tools.md ("The core tools", "Paths are confined to
the agent's visible mounts", the paragraph on ``fs.write``'s temporary file and the rights a
rename asks, "Running a tool"); the help and manifests of the core tools.

The angle: each refusal of ``cortexfs/tools/core/confine.py`` (``..``, an empty path, a NUL,
a path under no mount, a path ending in ``/``, a file, a missing directory or a link on the
way, a mount source that is no longer a reachable directory), of ``toolio.py`` (input the
schema lets through, nesting, huge numbers) and of the tool modules (special files, an
immutable, append-only, sticky or write-only directory, an immutable file, a file size limit,
a read the kernel fails, a command line no program can take) is provoked with real files,
devices, FIFOs, attributes, limits and processes; what is checked is the exit status, the
errno word of the ``<tool>: ERRNO: …`` line and of the native error object, that the message
names the path in the agent's view, that no traceback leaks, and that nothing is left
half-done: no file changed, no temporary file left, no FIFO opened, no command run."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    snapshot,
)
from tests.support.storage import copy_of_root

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as another uid than their creator's: needs root"
)

TOP = scratch_top(__file__)
LABEL = "coder_f"
TOOLS = ("fs.read", "fs.write", "fs.list", "fs.stat", "shell.exec")


# ================================================================================ the worlds


@dataclass(repr=False)
class World(OnStorage):
    """A bootstrapped root and agent ``coder`` (label ``coder_f``, uid ``nobody``) allowed the
    core fs tools in both layers of P-6; its workspace ``ws`` (its own, read-write at
    ``/workspace``, its working directory, holding ``a.txt``) and ``data`` (root's,
    read-only at ``/data``, holding ``d.txt``)."""

    top: Path
    storage: Path
    ws: Path
    data: Path
    uid: int
    gid: int

    def terminal(self, tool: str, *argv: str, **kw) -> Run:
        return self.ctx("run", "--agent", "coder", tool, *argv, **kw)

    def native(self, tool: str, value: object) -> tuple[Run, dict]:
        """``ctx run --native TOOL`` of ``value``: the run and its ``result`` frame."""
        run = self.ctx("run", "--agent", "coder", "--native", tool, input=json.dumps(value))
        frames = [json.loads(line) for line in run.out.splitlines() if line.strip()]
        assert frames and frames[-1]["type"] == "result", run
        return run, frames[-1]

    def mounts(self, table: list[list[str]]) -> None:
        """The agent's mount control, as an administrator rewrites it (``/ctx`` kept)."""
        control = self.storage / "agent" / "coder.d" / "mount"
        control.write_text(json.dumps([*table, [str(self.storage), "/ctx", "ro"]]))

    def grant(self, rule: str) -> None:
        with (self.storage / "agent" / "coder.d" / "policy").open("a") as policy:
            policy.write(rule + "\n")

    def events(self) -> list[dict]:
        home = self.storage / "home" / str(self.uid) / "agent" / "coder" / "session"
        return read_jsonl(home / "default" / "events.jsonl")

    def own(self, path: Path) -> Path:
        os.chown(path, self.uid, self.gid)
        return path


@pytest.fixture(scope="session")
def template(_template: Path) -> Iterator[World]:
    """Per test process: a copy of the bootstrapped root, ``ctx agent create`` and the grants
    once; each test works on a copy of that."""
    top = new_scratch_dir(TOP, "template-")
    ws, data = top / "ws", top / "data"
    ws.mkdir()
    data.mkdir()
    storage = copy_of_root(_template, top / "storage")
    env = clean_env(CTX_STORAGE=str(storage))
    wanted = {"name": "coder", "label": LABEL, "tools": list(TOOLS),
              "mount": [[str(ws), "/workspace", "rw"], [str(data), "/data", "ro"]]}  # fmt: skip
    created = ctx_run("agent", "create", "-", "--json", input=json.dumps(wanted), env=env)
    assert created.rc == 0, created
    identity = created.json()["identity"]
    for tool in TOOLS:
        with (storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
            policy.write(f"allow {LABEL} tool:{tool} execute\n")
    yield World(top, storage, ws, data, identity["uid"], identity["gid"])
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def world(template: World) -> Iterator[World]:
    """A copy of the template's root, the agent's mounts pointed at a workspace and a data
    directory of its own (as docs/policy.md says to do for a root copied elsewhere).  File
    attributes a test set are lifted before the scratch directory is removed."""
    top = new_scratch_dir(TOP, "w-")
    storage = copy_of_root(template.storage, top / "storage")
    ws, data = top / "ws", top / "data"
    ws.mkdir(mode=0o755)
    data.mkdir(mode=0o755)
    (ws / "a.txt").write_text("data\n")
    os.chown(ws / "a.txt", template.uid, template.gid)
    os.chown(ws, template.uid, template.gid)
    (data / "d.txt").write_text("kept\n")
    made = World(top, storage, ws, data, template.uid, template.gid)
    made.mounts([[str(ws), "/workspace", "rw"], [str(data), "/data", "ro"]])
    entry = storage / "agent" / "coder"
    entry.write_text(entry.read_text().replace(str(template.storage), str(storage)))
    yield made
    subprocess.run(["chattr", "-R", "-i", "-a", str(top)], capture_output=True, check=False)
    shutil.rmtree(top, ignore_errors=True)


def chattr(flag: str, path: Path) -> None:
    """``chattr FLAG PATH``; the test is skipped where the filesystem keeps no attributes."""
    done = subprocess.run(["chattr", flag, str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"chattr {flag} is not possible here: {done.stderr.strip()}")


def hidden(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.startswith("."))


def one_line(run: Run, line: str, status: int) -> None:
    """The refusal of a terminal call: ``status``, nothing on stdout, exactly ``line``."""
    assert (run.rc, run.out, run.err) == (status, "", line + "\n"), run


def refused(result: dict, name: str, status: int) -> dict:
    """The native ``result`` frame of a call the tool refused with ``name``: its error
    object, which must agree with the errno word."""
    assert result["status"] == "error" and result["exit_status"] == status, result
    error = result["error"]
    assert (error["error"], error["stage"]) == (name, "exit"), result
    assert result["output"]["error"] == name, result
    assert "Traceback" not in result["stderr"], result
    return result["output"]


@contextlib.contextmanager
def blocked_writer(fifo: Path) -> Iterator[threading.Event]:
    """A process side waiting in ``open(fifo, O_WRONLY)`` for a reader, as a producer writing
    into a named pipe does; the event is set once that open returned.  Released at the end by
    a reader of this test's own."""
    opened = threading.Event()
    failure: list[BaseException] = []

    def write() -> None:
        try:
            fd = os.open(fifo, os.O_WRONLY)
        except OSError as exc:  # pragma: no cover - only when the FIFO is removed
            failure.append(exc)
            return
        opened.set()
        time.sleep(0.3)
        with contextlib.suppress(OSError):
            os.write(fd, b"x")
        os.close(fd)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    time.sleep(0.2)
    try:
        yield opened
    finally:
        if not opened.is_set():
            reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
            thread.join(5)
            os.close(reader)
        thread.join(5)


# ====================================================================== paths the view refuses


@pytest.mark.parametrize(
    ("tool", "value"),
    [
        ("fs.read", {"path": "../ws/a.txt"}),
        ("fs.list", {"path": "/workspace/.."}),
        ("fs.stat", {"path": "/data/../ws/a.txt"}),
        ("fs.write", {"path": "sub/../a.txt", "content": "lost"}),
        ("shell.exec", {"cmd": "touch ran", "cwd": "/workspace/.."}),
    ],
)
def test_dot_dot_is_bad_input_for_every_tool_in_both_modes(world, tool, value):
    """docs/tools.md "Paths are confined" (``..`` is refused outright, ``EINVAL``, never
    normalised away): exit 2 (bad input) in terminal mode with the one-line refusal quoting
    the path, the same errno and status in the native ``result`` frame; nothing written, no
    command run."""
    before = snapshot(world.top / "ws")
    path = value.get("path", value.get("cwd"))
    said = f"{tool}: EINVAL: {path!r}: '..' is not allowed in a path"
    one_line(world.terminal(tool, json.dumps(value)), said, 2)
    _, result = world.native(tool, value)
    output = refused(result, "EINVAL", 2)
    assert output["message"] == f"{path!r}: '..' is not allowed in a path", result
    assert snapshot(world.top / "ws") == before
    assert (world.ws / "a.txt").read_text() == "data\n"


def test_an_empty_path_or_one_holding_a_nul_is_bad_input_in_both_modes(world):
    """docs/tools.md "The core tools" (bad input exits 2, ``EINVAL``): an empty path is
    refused by the tool in terminal mode (its own check) and by the schema's ``minLength``
    before the tool starts in native mode; a NUL, which no file name holds, is ``a path must
    not contain NUL`` in both — never a lookup of what comes before the NUL."""
    one_line(world.terminal("fs.read", '{"path": ""}'),
             "fs.read: EINVAL: a path must be a non-empty string", 2)  # fmt: skip
    run, result = world.native("fs.read", {"path": ""})
    assert run.rc == 2 and result["error"]["stage"] == "schema", result
    assert result["error"]["error"] == "EINVAL", result
    for tool in ("fs.stat", "fs.read", "fs.write"):
        value = {"path": "a.txt\u0000.bak"}
        if tool == "fs.write":
            value["content"] = "x"
        one_line(world.terminal(tool, json.dumps(value)),
                 f"{tool}: EINVAL: a path must not contain NUL", 2)  # fmt: skip
        _, result = world.native(tool, value)
        assert refused(result, "EINVAL", 2)["message"] == "a path must not contain NUL"
    assert sorted(os.listdir(world.ws)) == ["a.txt"]
    assert (world.ws / "a.txt").read_text() == "data\n"


@pytest.mark.parametrize("tool", ["fs.read", "fs.list", "fs.stat"])
@pytest.mark.parametrize("path", ["/", "/etc/passwd", "/workspaces/a.txt"])
def test_a_path_under_no_visible_mount_is_eacces_and_shows_nothing_of_the_host(world, tool, path):
    """docs/tools.md "Paths are confined" (a path under no visible mount is refused,
    ``EACCES``): the host's ``/``, its ``/etc/passwd`` and a name that only begins like a
    mount's target are outside the view; exit 1, the path named, nothing of the host shown."""
    run = world.terminal(tool, path)
    one_line(run, f"{tool}: EACCES: {path} is outside every mount visible to the agent", 1)
    _, result = world.native(tool, {"path": path})
    refused(result, "EACCES", 1)
    assert "root:" not in json.dumps(world.events())


def test_a_trailing_slash_on_a_file_is_enotdir_and_the_file_is_untouched(world):
    """docs/tools.md "Paths are confined" (``a.txt/`` is ``ENOTDIR``, the slash never dropped
    to act on the file): ``fs.stat``, ``fs.read`` and ``fs.write`` of ``a.txt/`` and
    ``a.txt/.`` are refused, exit 1, naming the path and why; the file keeps its bytes."""
    before = snapshot(world.ws)
    for path in ("a.txt/", "a.txt/."):
        stat_run = world.terminal("fs.stat", path)
        one_line(stat_run, "fs.stat: ENOTDIR: /workspace/a.txt is not a directory, but the "
                 "path ends in '/'", 1)  # fmt: skip
        read_run = world.terminal("fs.read", path)
        assert (read_run.rc, read_run.out) == (1, ""), read_run
        assert read_run.err.startswith("fs.read: ENOTDIR: /workspace/a.txt"), read_run
        _, result = world.native("fs.write", {"path": path, "content": "lost"})
        output = refused(result, "ENOTDIR", 1)
        assert output["message"].startswith("/workspace/a.txt"), output
    assert snapshot(world.ws) == before


def test_a_new_name_ending_in_a_slash_makes_neither_a_file_nor_a_directory(world):
    """docs/tools.md "Paths are confined" (``fs.write`` never makes a file of ``new/``):
    ``new/`` and ``new/.`` are ``EISDIR`` naming ``/workspace/new/``, exit 1; nothing at all
    is made, not even a temporary file."""
    for path in ("new/", "new/."):
        run = world.terminal("fs.write", json.dumps({"path": path, "content": "x"}))
        one_line(run, "fs.write: EISDIR: /workspace/new/ names a directory; fs.write writes "
                 "a file", 1)  # fmt: skip
    assert sorted(os.listdir(world.ws)) == ["a.txt"]


@pytest.mark.parametrize(
    ("tool", "value", "said"),
    [
        ("fs.read", {"path": "a.txt/x"}, "ENOTDIR: /workspace/a.txt is not a directory"),
        ("fs.list", {"path": "a.txt"}, "ENOTDIR: /workspace/a.txt is not a directory"),
        ("fs.stat", {"path": "a.txt/x/y"}, "ENOTDIR: /workspace/a.txt is not a directory"),
        ("fs.write", {"path": "a.txt/x", "content": "x"},
         "ENOTDIR: /workspace/a.txt is not a directory"),
        ("fs.read", {"path": "no/x"}, "ENOENT: /workspace/no does not exist"),
        ("fs.list", {"path": "no"}, "ENOENT: /workspace/no does not exist"),
        ("fs.stat", {"path": "no/x"}, "ENOENT: /workspace/no does not exist"),
        ("fs.write", {"path": "no/deeper/x", "content": "x"},
         "ENOENT: /workspace/no does not exist"),
        ("shell.exec", {"cmd": "touch ran", "cwd": "no"}, "ENOENT: /workspace/no does not exist"),
    ],
)  # fmt: skip
def test_what_stands_in_the_way_is_named_by_its_view_path(world, tool, value, said):
    """confine's walk, one component at a time: a file where a directory is needed is
    ``ENOTDIR`` and a missing directory ``ENOENT``, each naming the first component at fault
    as the agent sees it (never the host path), exit 1; ``fs.write`` makes no directory on the
    way and ``shell.exec`` runs nothing."""
    before = snapshot(world.ws)
    one_line(world.terminal(tool, json.dumps(value)), f"{tool}: {said}", 1)
    assert snapshot(world.ws) == before
    assert str(world.ws) not in said


def test_a_link_on_the_way_is_never_followed_even_into_the_same_mount(world):
    """docs/tools.md "Paths are confined" (a symbolic link anywhere on the way or at the end
    is refused, ``ELOOP``, even one pointing inside the mount): ``in`` is a link to the
    workspace's own ``sub``; every tool refuses a path through it, exit 1 naming
    ``/workspace/in``; ``in/`` is refused too (it would have to be followed to tell); ``fs.stat
    in`` describes the link itself; nothing is written through it."""
    sub = world.ws / "sub"
    sub.mkdir()
    world.own(sub)
    (sub / "f").write_text("inside\n")
    (world.ws / "in").symlink_to("sub")
    os.lchown(world.ws / "in", world.uid, world.gid)
    before = snapshot(world.ws)
    through = "/workspace/in is a symbolic link; links are never followed"
    calls = {
        "fs.read": {"path": "in/f"},
        "fs.list": {"path": "in"},
        "fs.stat": {"path": "in/f"},
        "fs.write": {"path": "in/g", "content": "x"},
        "shell.exec": {"cmd": "touch ran", "cwd": "in"},
    }
    for tool, value in calls.items():
        one_line(world.terminal(tool, json.dumps(value)), f"{tool}: ELOOP: {through}", 1)
    one_line(world.terminal("fs.stat", "in/"),
             "fs.stat: ELOOP: /workspace/in is a symbolic link; never followed", 1)  # fmt: skip
    one_line(world.terminal("fs.read", "in"),
             "fs.read: ELOOP: /workspace/in is a symbolic link; never followed", 1)  # fmt: skip
    _, result = world.native("fs.stat", {"path": "in"})
    assert result["status"] == "ok" and result["output"]["type"] == "symlink", result
    assert snapshot(world.ws) == before


# ============================================================================= special files


def char_major_unused() -> int:
    """A character device major the running kernel has no driver for (of those Linux keeps for
    local use, 234 to 254): a node of it can be made but not opened."""
    text = Path("/proc/devices").read_text()
    chars = text.split("Block devices:")[0]
    used = {int(line.split()[0]) for line in chars.splitlines()[1:] if line.strip()}
    free = [major for major in range(234, 255) if major not in used]
    if not free:
        pytest.skip("every local character major is taken here")
    return free[0]


def test_fs_read_of_a_fifo_never_opens_it_so_a_waiting_writer_stays_waiting(world):
    """docs/tools.md "Paths are confined" (of a FIFO, a socket or a device, ``EINVAL``:
    "neither opens one"): a producer waits in ``open(O_WRONLY)`` on ``/workspace/pipe`` for
    its reader; ``fs.read pipe`` is refused ``EINVAL``, exit 1, and the producer is still
    waiting afterwards — opening the FIFO would let it through, then break its pipe."""
    fifo = world.ws / "pipe"
    os.mkfifo(fifo, 0o644)
    world.own(fifo)
    with blocked_writer(fifo) as opened:
        run = world.terminal("fs.read", "pipe", timeout=20)
        one_line(run, "fs.read: EINVAL: /workspace/pipe is not a regular file", 1)
        time.sleep(0.1)
        assert not opened.is_set(), "fs.read opened the FIFO: its writer was let through"


def test_fs_stat_list_and_write_describe_or_refuse_a_fifo_without_opening_it(world):
    """docs/tools.md (``fs.list`` types ``other``; ``fs.write`` of a FIFO is ``EINVAL``):
    with a producer waiting on ``/workspace/pipe``, ``fs.stat`` and ``fs.list`` describe it as
    ``other`` and ``fs.write`` refuses it naming what it is, nothing written; the producer is
    still waiting afterwards."""
    fifo = world.ws / "pipe"
    os.mkfifo(fifo, 0o666)
    world.own(fifo)
    with blocked_writer(fifo) as opened:
        _, described = world.native("fs.stat", {"path": "pipe"})
        assert described["output"]["type"] == "other", described
        _, listed = world.native("fs.list", {"path": "."})
        assert {"name": "pipe", "type": "other", "size": 0} in listed["output"]["entries"]
        run = world.terminal("fs.write", json.dumps({"path": "pipe", "content": "x"}))
        one_line(run, "fs.write: EINVAL: /workspace/pipe exists and is a FIFO, not a regular "
                 "file; nothing was written", 1)  # fmt: skip
        time.sleep(0.1)
        assert not opened.is_set()
    assert hidden(world.ws) == []


def test_fs_read_of_a_device_node_is_einval_without_opening_it(world):
    """docs/tools.md "Paths are confined" (of a device, ``EINVAL``; "neither opens one"): a
    character device node of a major no driver serves — which cannot be opened at all — is
    refused as every device is, ``EINVAL`` "not a regular file", exit 1; the kernel's answer to
    an open (``ENXIO``) would show that it was opened."""
    node = world.ws / "dev"
    os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(char_major_unused(), 7))
    run = world.terminal("fs.read", "dev")
    one_line(run, "fs.read: EINVAL: /workspace/dev is not a regular file", 1)


# ======================================================================== directories and files


def test_directories_the_agent_may_not_read_or_search_are_named(world):
    """T-5, docs/tools.md (the kernel judges every open with the agent's uid): ``ronly``
    (root's, 0744: readable, not searchable) and ``xonly`` (0711: searchable, not readable)
    cannot be listed, ``EACCES`` naming each, exit 1; a file below ``ronly`` cannot be
    described, named by its view path."""
    for name, mode in (("ronly", 0o744), ("xonly", 0o711)):
        (world.ws / name).mkdir()
        (world.ws / name).chmod(mode)
        (world.ws / name / "f").write_text("s\n")
    for name in ("ronly", "xonly"):
        one_line(world.terminal("fs.list", name),
                 f"fs.list: EACCES: /workspace/{name}: Permission denied", 1)  # fmt: skip
    one_line(world.terminal("fs.stat", "ronly/f"),
             "fs.stat: EACCES: /workspace/ronly/f: Permission denied", 1)  # fmt: skip
    _, described = world.native("fs.stat", {"path": "xonly/f"})
    assert described["output"]["type"] == "file", described


def test_numbers_the_schema_takes_but_the_tool_cannot_use_are_bad_input(world):
    """docs/tools.md (``offset`` ≤ 2⁶³ − 1, ``length`` ≤ 1 MiB; bad input exits 2): an
    ``offset`` of ``1e300`` is an integer as JSON Schema counts, and is refused by its range;
    a ``length`` of ``1e400`` is beyond any float; neither is a traceback.  A ``length`` of 0
    reads nothing and says the file goes on."""
    one_line(world.terminal("fs.read", '{"path": "a.txt", "offset": 1e300}'),
             "fs.read: EINVAL: offset must be from 0 to 9223372036854775807 and length from 0 "
             "to 1048576", 2)  # fmt: skip
    run = world.terminal("fs.read", '{"path": "a.txt", "length": 1e400}')
    assert (run.rc, run.out) == (2, ""), run
    assert run.err.startswith("fs.read: EINVAL: input is not JSON: "), run
    assert "Traceback" not in run.err
    _, result = world.native("fs.read", {"path": "a.txt", "length": 0})
    assert result["output"]["content"] == "" and result["output"]["truncated"] is True


def test_input_nested_past_the_limit_is_einval_in_both_modes(world):
    """toolio's strict reader, as ``ctx run --native``'s: a ``path`` nested 100 000 arrays
    deep is refused as not JSON, exit 2, in terminal mode (the tool reads it from stdin) and
    at stage ``schema`` in native mode; no recursion error, nothing run."""
    deep = '{"path": ' + "[" * 100000 + "]" * 100000 + "}"
    run = world.terminal("fs.read", input=deep)
    assert (run.rc, run.out) == (2, ""), run
    assert run.err.startswith("fs.read: EINVAL: input is not JSON: nested deeper than"), run
    native = world.ctx("run", "--agent", "coder", "--native", "fs.read", input=deep)
    result = json.loads(native.lines()[-1])
    assert (native.rc, result["error"]["error"]) == (2, "EINVAL"), native
    assert "Traceback" not in native.err + run.err


def test_an_encoding_of_another_json_type_is_refused_in_json_words(world):
    """docs/tools.md ("encoding must be 'utf-8' or 'base64'"; refusals name the JSON type of a
    property, ``must be of type string``): ``"encoding": 5`` in a terminal call — where no
    runner checks the schema's ``enum`` — is ``EINVAL``, exit 2, said in the words of the
    input, not of the language the tool is written in; no file is made."""
    run = world.terminal("fs.write", '{"path": "e.txt", "content": "x", "encoding": 5}')
    assert (run.rc, run.out) == (2, ""), run
    assert not (world.ws / "e.txt").exists()
    assert run.err in (
        "fs.write: EINVAL: encoding must be 'utf-8' or 'base64'\n",
        "fs.write: EINVAL: 'encoding' must be of type string\n",
    ), run


# ==================================================================== reads the kernel fails


@pytest.fixture
def process_dir(world: World) -> Iterator[Path]:
    """``/proc/<pid>`` of a process of the agent's own uid, mounted read-only at ``/p`` (the
    policy granting ``mount:p read``), as an operator shows an agent a process to inspect."""
    sleeper = subprocess.Popen(["setpriv", f"--reuid={world.uid}", f"--regid={world.gid}",
                                "--clear-groups", "sleep", "60"])  # fmt: skip
    try:
        time.sleep(0.2)
        world.mounts([[str(world.ws), "/workspace", "rw"], [f"/proc/{sleeper.pid}", "/p", "ro"]])
        world.grant(f"allow {LABEL} mount:p read")
        yield Path(f"/proc/{sleeper.pid}")
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_read_the_kernel_fails_names_the_file(world, process_dir):
    """docs/tools.md (a refusal names the path; ``<tool>: <ERRNO>: <sentence>``): the agent
    may open ``/p/mem`` (its own process's memory: ``fs.stat`` describes it, a file of size
    0), but the kernel fails a read at address 0 with ``EIO``; the refusal, exit 1, names
    ``/p/mem`` as every other refusal of the kernel names its path."""
    _, described = world.native("fs.stat", {"path": "/p/mem"})
    assert described["output"]["type"] == "file", described
    run = world.terminal("fs.read", "/p/mem")
    assert (run.rc, run.out) == (1, ""), run
    assert run.err.startswith("fs.read: EIO: "), run
    assert run.err == "fs.read: EIO: /p/mem: Input/output error\n", run


# ================================================================== writes the kernel refuses


def test_an_append_only_directory_gets_no_temporary_file_left_behind(world):
    """docs/tools.md (``fs.write`` writes a temporary file and renames it into place; a
    refused write leaves nothing): in ``log/``, append-only (``chattr +a``: entries may be
    added, none moved or removed), a replacement and a new file alike are refused ``EPERM``,
    exit 1; the old file keeps its bytes and no ``.NAME.<random>.tmp`` stays behind."""
    log = world.ws / "log"
    log.mkdir()
    world.own(log)
    (log / "old.txt").write_text("old\n")
    world.own(log / "old.txt")
    chattr("+a", log)
    for value in ({"path": "log/old.txt", "content": "new"},
                  {"path": "log/new.txt", "content": "new", "overwrite": False}):  # fmt: skip
        run = world.terminal("fs.write", json.dumps(value))
        assert (run.rc, run.out) == (1, ""), run
        assert run.err.startswith(f"fs.write: EPERM: /workspace/{value['path']}"), run
    assert (log / "old.txt").read_text() == "old\n"
    assert sorted(os.listdir(log)) == ["old.txt"]


def test_an_immutable_file_is_kept_and_writable_again_once_the_attribute_is_lifted(world):
    """``chattr +i`` on the file: ``fs.write`` is refused ``EPERM`` naming it, exit 1, its
    bytes kept, no temporary file left in the workspace; ``chattr -i`` and the same call
    replaces it."""
    target = world.ws / "a.txt"
    chattr("+i", target)
    value = {"path": "a.txt", "content": "new\n"}
    one_line(world.terminal("fs.write", json.dumps(value)),
             "fs.write: EPERM: /workspace/a.txt: Operation not permitted", 1)  # fmt: skip
    assert target.read_text() == "data\n" and hidden(world.ws) == []
    chattr("-i", target)
    done = world.terminal("fs.write", json.dumps(value))
    assert (done.rc, done.out) == (0, "wrote 4 bytes to /workspace/a.txt\n"), done
    assert target.read_text() == "new\n"


def test_an_immutable_directory_gets_nothing(world):
    """``chattr +i`` on ``frozen/``: ``fs.write`` of a new file there is ``EPERM`` naming it,
    exit 1 (the kernel refuses even the temporary file), and the directory stays empty."""
    frozen = world.ws / "frozen"
    frozen.mkdir()
    world.own(frozen)
    chattr("+i", frozen)
    one_line(world.terminal("fs.write", json.dumps({"path": "frozen/n", "content": "x"})),
             "fs.write: EPERM: /workspace/frozen/n: Operation not permitted", 1)  # fmt: skip
    assert os.listdir(frozen) == []


def test_a_sticky_directory_keeps_another_users_file(world):
    """docs/tools.md ("keep such files in a directory the agent may not write, or make it
    sticky"): in ``shared/`` (root's, mode 1777) root's ``r.txt`` (mode 0666) is not replaced
    by the agent's ``fs.write``: ``EPERM`` naming it, exit 1, its bytes and owner kept and the
    agent's temporary file removed."""
    shared = world.ws / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    (shared / "r.txt").write_text("root's\n")
    (shared / "r.txt").chmod(0o666)
    one_line(world.terminal("fs.write", json.dumps({"path": "shared/r.txt", "content": "x"})),
             "fs.write: EPERM: /workspace/shared/r.txt: Operation not permitted", 1)  # fmt: skip
    assert (shared / "r.txt").read_text() == "root's\n"
    assert (shared / "r.txt").stat().st_uid == 0
    assert sorted(os.listdir(shared)) == ["r.txt"]


def test_a_drop_box_the_agent_may_write_but_not_read_takes_a_file(world):
    """docs/tools.md ("what the kernel asks of the agent's uid is what a rename asks: write
    and search on the directory"): ``drop/`` is root's, mode 1733 — a drop box the agent may
    write into and search but not list.  ``shell.exec 'printf x > drop/by-shell'`` shows the
    kernel lets the agent make a file there; ``fs.write drop/n.txt`` writes one too."""
    drop = world.ws / "drop"
    drop.mkdir()
    drop.chmod(0o1733)
    shell = world.terminal("shell.exec", "printf x > drop/by-shell")
    assert shell.rc == 0 and (drop / "by-shell").read_text() == "x", shell
    run = world.terminal("fs.write", json.dumps({"path": "drop/n.txt", "content": "n"}))
    assert (run.rc, run.err) == (0, ""), run
    assert (drop / "n.txt").read_text() == "n"


def test_a_file_size_limit_is_efbig_naming_the_file_and_keeps_the_old_one(world):
    """A caller's ``ulimit -f`` (the tool keeps the caller's limits): a replacement of
    ``a.txt`` by 300 000 bytes under a limit of 200 000 is ``EFBIG`` naming
    ``/workspace/a.txt``, exit 1; the old bytes stay and the temporary file is removed."""
    value = json.dumps({"path": "a.txt", "content": "y" * 300000})

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (200000, 200000))

    done = subprocess.run([*CTX_ARGV, "run", "--agent", "coder", "fs.write"], input=value.encode(),
                          env=world.env, capture_output=True, timeout=60,
                          preexec_fn=limited)  # fmt: skip
    assert (done.returncode, done.stdout) == (1, b""), done
    assert done.stderr == b"fs.write: EFBIG: /workspace/a.txt: File too large\n", done
    assert (world.ws / "a.txt").read_text() == "data\n"
    assert hidden(world.ws) == []


# ================================================================================ shell.exec


def test_a_command_line_longer_than_any_program_takes_names_cmd(world):
    """docs/tools.md (a refusal names the thing at fault): a ``cmd`` of 200 000 characters is
    more than the kernel passes as one argument (128 KiB); the call fails ``E2BIG`` without
    running anything, and its message says it is ``cmd`` that is too long, not merely
    "Argument list too long" (as ``ctx`` says it of a tool's arguments)."""
    marker = world.ws / "ran"
    value = {"cmd": f"touch {marker}; : " + "x" * 200000}
    _, result = world.native("shell.exec", value)
    output = refused(result, "E2BIG", 1)
    assert not marker.exists()
    assert "cmd" in output["message"], output


def test_a_command_or_stdin_no_text_holds_is_bad_input_and_runs_nothing(world):
    """docs/tools.md (a lone surrogate, which JSON can spell but no text holds, is
    ``EINVAL``, exit 2): in ``cmd`` or in ``stdin`` it refuses the call before the shell
    starts, naming the key; the command does not run."""
    marker = world.ws / "ran"
    for value, said in (
        ({"cmd": f"touch {marker}", "stdin": "\ud800"},
         "shell.exec: EINVAL: stdin holds '\\ud800' at character 0, a lone surrogate, which "
         "is no text"),
        ({"cmd": f"touch {marker} \ud800"},
         "shell.exec: EINVAL: cmd holds '\\ud800' at character"),
    ):  # fmt: skip
        run = world.terminal("shell.exec", json.dumps(value))
        assert (run.rc, run.out) == (2, ""), run
        assert run.err.startswith(said), run
        assert not marker.exists()


# ============================================================== mounts the agent lost or keeps


def test_a_mount_source_replaced_by_a_file_is_enotdir_until_it_is_put_back(world):
    """T-5, confine's walk of a mount's source: ``/data``'s source replaced by a file is
    refused ``ENOTDIR`` naming ``/data`` by every tool, exit 1 (never the file's contents);
    with the directory put back the same call reads again."""
    saved = world.top / "saved"
    world.data.rename(saved)
    world.data.write_text("a file where the directory was\n")
    for tool, value in (("fs.read", {"path": "/data/d.txt"}), ("fs.list", {"path": "/data"}),
                        ("fs.stat", {"path": "/data/d.txt"}),
                        ("shell.exec", {"cmd": "touch ran", "cwd": "/data"})):  # fmt: skip
        one_line(world.terminal(tool, json.dumps(value)),
                 f"{tool}: ENOTDIR: /data: Not a directory", 1)  # fmt: skip
    assert "a file where" not in json.dumps(world.events())
    world.data.unlink()
    saved.rename(world.data)
    again = world.terminal("fs.read", "/data/d.txt")
    assert (again.rc, again.out) == (0, "kept\n"), again


def test_a_mount_source_the_agent_can_no_longer_reach_is_eacces_naming_the_mount(world):
    """T-5 (the kernel judges every step with the agent's uid): ``/data``'s source moved
    below ``locked/`` (root's, 0700) and the mount control pointed there; every call under
    ``/data`` is ``EACCES`` naming ``/data``, exit 1; ``chmod 0755 locked`` repairs it."""
    locked = world.top / "locked"
    locked.mkdir(mode=0o700)
    moved = locked / "data"
    world.data.rename(moved)
    world.mounts([[str(world.ws), "/workspace", "rw"], [str(moved), "/data", "ro"]])
    for tool in ("fs.read", "fs.stat"):
        one_line(world.terminal(tool, "/data/d.txt"),
                 f"{tool}: EACCES: /data: Permission denied", 1)  # fmt: skip
    locked.chmod(0o755)
    again = world.terminal("fs.read", "/data/d.txt")
    assert (again.rc, again.out) == (0, "kept\n"), again


def test_with_the_workspace_mount_dropped_relative_paths_land_in_the_next_mount(world):
    """docs/tools.md (a path is relative to ``CTX_CWD``; ``/workspace`` is the working
    directory while it is visible): with ``/workspace`` dropped from the mount control, a
    relative ``fs.write`` lands on ``/data``, read-only — ``EROFS`` naming it, exit 1 — and
    ``/workspace/a.txt`` is outside the view; nothing is written anywhere."""
    world.mounts([[str(world.data), "/data", "ro"]])
    before = snapshot(world.top / "ws"), snapshot(world.data)
    one_line(world.terminal("fs.write", json.dumps({"path": "x.txt", "content": "x"})),
             "fs.write: EROFS: /data/x.txt is on a read-only mount (/data)", 1)  # fmt: skip
    one_line(world.terminal("fs.read", "/workspace/a.txt"),
             "fs.read: EACCES: /workspace/a.txt is outside every mount visible to the agent",
             1)  # fmt: skip
    relative = world.terminal("fs.read", "d.txt")
    assert (relative.rc, relative.out) == (0, "kept\n"), relative
    assert (snapshot(world.top / "ws"), snapshot(world.data)) == before
