"""The error branches of the core tools and of tsh, reached from outside through the installed
commands: ``ctx run`` (terminal and ``--native`` modes), ``ctx queue work``, ``ctx tool``, a
live agent terminal (``ctx agent start``, then its socket), and the programs of a storage root
run by hand (``tool/fs.stat``, ``tool/agent.update``, ``bin/tsh``, an MCP-backed tool).

Sources: SPEC R-5, T-2, T-3, T-4, T-5, H-1, H-2, H-4, A-1, A-4, A-5, M-4, W-1; docs/tools.md
("The core tools", "Paths are confined to the agent's visible mounts", "The agent terminal",
"Running a tool", "ctx tool", "MCP servers as tool sources"), docs/sessions.md
(``terminal.view_lost``), docs/workers.md (a failed job's ``error`` and ``reason``),
docs/spec/ctx.coreutils.md, and the help of ``tsh`` and ``ctx queue work``.

The angle: each refusal the core tools (``fs.*``, ``shell.exec``, ``agent.create``,
``agent.update``, ``tsh.config``, the MCP bridge) and tsh can give is provoked as a user
provokes it — the top of a mount named as a file, a directory the agent may not search, a mount
source moved away, content piped past the limit, a request too large for the host, a
capability a person does not hold, a ``CTX_MOUNTS`` or a run socket a person made up, a
``tsh.d/config`` that cannot be used, a word of hundreds of characters typed to a built-in, a
terminal whose view of ``/ctx`` has ended — and what is checked is the documented exit status,
the errno word of the ``<tool>: ERRNO: …`` line (and of the native error object, the
``result`` frame or the failed job), that the message names the thing at fault and what to do,
that no Python traceback leaks, and that nothing is left half-done: no file written, no agent
made, no control changed, no server started, no tool run."""

from __future__ import annotations

import array
import contextlib
import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    OnStorage,
    QueueCLI,
    Run,
    alive,
    clean_env,
    ctx_run,
    new_scratch_dir,
    processes_of,
    read_jsonl,
    request,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, CoderHost, Raw, coder_host
from tests.support.storage import copy_of_root, small_tmpfs

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as another uid than their creator's: needs root"
)
needs_terminal = pytest.mark.skipif(
    shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs bubblewrap and /dev/fuse",
)

TOP = scratch_top(__file__)
LABEL = "coder_t"
GRANTED = ("fs.read", "fs.write", "fs.list", "fs.stat", "shell.exec", "agent.create",
           "agent.update", "tsh", "tsh.config")  # fmt: skip
CONTENT_LIMIT = 16 * 1024 * 1024  # docs/tools.md: what a core tool reads (16777216 bytes)
HOST_LINE = 65536  # hostcall: the longest request line the host reads
CAPABILITY = "runs through the runner, which gives it the capability"


# ================================================================================ the worlds


@dataclass(repr=False)
class World(OnStorage):
    """A bootstrapped root with the queue of project ``proj`` and agent ``coder`` (label
    ``coder_t``, uid ``nobody``), allowed the core tools and tsh in both layers of P-6 and
    ``agent:kid create``; its workspace ``ws`` (its own, read-write at ``/workspace``, its
    working directory, holding ``a.txt``) and ``data`` (root's, read-only at ``/data``,
    holding ``d.txt``)."""

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

    def events(self) -> list[dict]:
        home = self.storage / "home" / str(self.uid) / "agent" / "coder" / "session"
        return read_jsonl(home / "default" / "events.jsonl")

    def last_result(self) -> dict:
        results = [e for e in self.events() if e["type"] == "tool_result"]
        assert results, self.events()
        return results[-1]

    def tool(self, name: str) -> Path:
        return self.storage / "tool" / name

    def controls(self) -> dict[str, tuple]:
        return snapshot(self.storage / "agent")

    def allow(self, tool: str) -> None:
        """Both layers of P-6 for ``tool``: the agent's policy and the tool's own."""
        for policy in (self.storage / "agent" / "coder.d" / "policy",
                       self.tool(f"{tool}.d") / "policy"):  # fmt: skip
            with policy.open("a") as rules:
                rules.write(f"allow {LABEL} tool:{tool} execute\n")


def grant(policy: Path, rule: str) -> None:
    with policy.open("a") as rules:
        rules.write(rule + "\n")


@pytest.fixture(scope="session")
def template(_template: Path) -> Iterator[World]:
    """Per test process: a copy of the bootstrapped root holding the queue of ``proj``, then
    ``ctx agent create`` and the grants once; each test works on a copy of that."""
    top = new_scratch_dir(TOP, "template-")
    ws, data = top / "ws", top / "data"
    ws.mkdir()
    data.mkdir()
    storage = copy_of_root(_template, top / "storage")
    env = clean_env(CTX_STORAGE=str(storage))
    wanted = {"name": "coder", "label": LABEL, "tools": list(GRANTED),
              "mount": [[str(ws), "/workspace", "rw"], [str(data), "/data", "ro"]]}  # fmt: skip
    created = ctx_run("agent", "create", "-", "--json", input=json.dumps(wanted), env=env)
    assert created.rc == 0, created
    identity = created.json()["identity"]
    grant(storage / "agent" / "coder.d" / "policy", f"allow {LABEL} agent:kid create")
    for tool in GRANTED:
        grant(storage / "tool" / f"{tool}.d" / "policy", f"allow {LABEL} tool:{tool} execute")
    yield World(top, storage, ws, data, identity["uid"], identity["gid"])
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def world(template: World) -> Iterator[World]:
    """A copy of the template's root, the agent's mounts pointed at a workspace and a data
    directory of its own (as docs/policy.md says to do for a root copied elsewhere)."""
    top = new_scratch_dir(TOP, "w-")
    storage = copy_of_root(template.storage, top / "storage")
    ws, data = top / "ws", top / "data"
    ws.mkdir(mode=0o755)
    data.mkdir(mode=0o755)
    (ws / "a.txt").write_text("data\n")
    os.chown(ws / "a.txt", template.uid, template.gid)
    os.chown(ws, template.uid, template.gid)
    (data / "d.txt").write_text("kept\n")
    table = [
        [str(ws), "/workspace", "rw"],
        [str(data), "/data", "ro"],
        [str(storage), "/ctx", "ro"],
    ]
    (storage / "agent" / "coder.d" / "mount").write_text(json.dumps(table))
    entry = storage / "agent" / "coder"
    entry.write_text(entry.read_text().replace(str(template.storage), str(storage)))
    yield World(top, storage, ws, data, template.uid, template.gid)
    shutil.rmtree(top, ignore_errors=True)


def by_hand(program: Path, *argv: str, env: dict[str, str], data: bytes = b"") -> Run:
    """``program ARGV`` run directly by a person (no runner), with ``env`` and ``data`` on
    its stdin."""
    done = subprocess.run([str(program), *argv], input=data, capture_output=True, env=env,
                          timeout=30)  # fmt: skip
    return Run([str(program), *argv], done.returncode, done.stdout.decode("utf-8", "replace"),
               done.stderr.decode("utf-8", "replace"))  # fmt: skip


def one_line(err: str) -> bool:
    return err.endswith("\n") and err.count("\n") == 1 and "Traceback" not in err


def hidden(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.startswith("."))


# ================================================ core tools a person runs without the runner


@pytest.mark.parametrize(
    ("tool", "capability", "data", "errno_word", "said"),
    [
        pytest.param("agent.update", None, {"control": "system.md", "content": "hacked"},
                     "EPERM", f"agent.update {CAPABILITY}", id="update-without-a-capability"),
        pytest.param("agent.create", "fd3", {"name": "kid", "label": "kid_t"},
                     "EPERM", f"agent.create {CAPABILITY}", id="create-with-a-word-for-a-number"),
        pytest.param("agent.create", "987", {"name": "kid", "label": "kid_t"},
                     "EBADF", "", id="create-with-a-descriptor-that-is-not-open"),
    ],
)  # fmt: skip
def test_a_person_running_an_agent_tool_by_hand_has_no_capability_and_changes_nothing(
    world, tool, capability, data, errno_word, said
):
    """A-4, A-5, docs/tools.md ("Run outside the runner, the tool has no capability
    (``EPERM``)"): ``tool/agent.update`` or ``tool/agent.create`` run by a person — without
    ``CTX_RUN_CAPABILITY``, with a word that is no descriptor number there, or with the number
    of a descriptor it does not hold — refuses with that errno, exit 1: one
    ``<tool>: ERRNO: …`` line in terminal mode, the JSON error object on stdout in native
    mode; the agent's controls are byte for byte as they were and no agent ``kid`` is made."""
    before = world.controls()
    extra = {} if capability is None else {"CTX_RUN_CAPABILITY": capability}
    for mode in ("terminal", "native"):
        env = clean_env(CTX_MODE=mode, **extra)
        run = by_hand(world.tool(tool), json.dumps(data), env=env)
        assert run.rc == 1, (mode, run)
        assert one_line(run.err) and run.err.startswith(f"{tool}: {errno_word}: {said}"), run
        if mode == "native":
            answer = json.loads(run.out)
            assert (answer["error"], set(answer)) == (errno_word, {"error", "errno", "message"})
        else:
            assert run.out == "", run
    assert world.controls() == before
    assert not (world.storage / "agent" / "kid").exists()


@pytest.mark.parametrize(
    ("program", "mounts", "status", "said"),
    [
        pytest.param("tool/fs.stat", "nope", 1,
                     "fs.stat: EINVAL: CTX_MOUNTS is malformed: Expecting value", id="not-JSON"),
        pytest.param("tool/fs.stat", [["{src}", "/w"]], 1,
                     "fs.stat: EINVAL: CTX_MOUNTS is malformed: ['{src}', '/w'] is not [source, "
                     "target, mode] or [source, target, mode, names]", id="a-mount-of-two-fields"),
        pytest.param("tool/fs.stat", [["{src}", "/w", "ro", [1]]], 1,
                     "fs.stat: EINVAL: CTX_MOUNTS is malformed: the names of the mount at '/w' "
                     "must be a list of strings", id="names-that-are-no-strings"),
        pytest.param("tool/fs.stat", [["tmp", "/w", "ro"]], 1,
                     "fs.stat: EINVAL: /w: its source 'tmp' is not a real path",
                     id="a-relative-source"),
        pytest.param("bin/tsh", "nope", 126,
                     "tsh: EINVAL: CTX_MOUNTS is malformed: Expecting value", id="tsh-not-JSON"),
    ],
)  # fmt: skip
def test_a_ctx_mounts_a_person_made_up_is_einval_naming_it(
    storage, tmp_path, program, mounts, status, said
):
    """docs/tools.md "The core tools" (``CTX_MOUNTS`` is the runner's; a failure prints
    ``<tool>: <ERRNO>: <sentence>``) and tsh's help (126 when a tool cannot be run): a
    ``CTX_MOUNTS`` set by hand that is no mount table — not JSON, a mount of two fields,
    names that are not strings, a source that is not a real path — is ``EINVAL`` naming
    ``CTX_MOUNTS`` or the mount at fault, exit 1 from ``fs.stat`` (the input was fine) and
    126 from tsh, one line on stderr, nothing on stdout, nothing looked at."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "x").write_text("x\n")
    text = mounts if isinstance(mounts, str) else json.dumps(mounts).replace("{src}", str(src))
    env = clean_env(CTX_MOUNTS=text, CTX_CWD="/w", CTX_PATH="/ctx/tool")
    argv = ("which", "fs.read") if program == "bin/tsh" else ("/w/x",)
    run = by_hand(storage / program, *argv, env=env)
    assert (run.rc, run.out) == (status, ""), run
    assert one_line(run.err) and run.err.startswith(said.replace("{src}", str(src))), run


@pytest.mark.parametrize(
    ("program", "source"),
    [
        pytest.param("tool/fs.stat", 1, id="fs.stat-a-number-for-a-source"),
        pytest.param("tool/fs.stat", "{src}\u0000x", id="fs.stat-a-source-holding-a-NUL"),
        pytest.param("bin/tsh", 1, id="tsh-a-number-for-a-source"),
    ],
)
def test_a_ctx_mounts_source_that_is_no_path_is_einval_not_a_traceback(
    storage, tmp_path, program, source
):
    """docs/tools.md "The core tools": a failure prints ``<tool>: <ERRNO>: <sentence>``; the
    programs refuse a malformed ``CTX_MOUNTS`` with ``EINVAL: CTX_MOUNTS is malformed`` (and
    ``… is not a real path`` for a source that names none).  A source that is a number, or a
    string holding a NUL character, is no path either: ``EINVAL`` on one line, never a
    traceback."""
    src = tmp_path / "src"
    src.mkdir()
    value = source.replace("{src}", str(src)) if isinstance(source, str) else source
    env = clean_env(CTX_MOUNTS=json.dumps([[value, "/w", "ro"]]), CTX_CWD="/w",
                    CTX_PATH="/w/tool")  # fmt: skip
    argv = ("tools",) if program == "bin/tsh" else ("/w/x",)
    run = by_hand(storage / program, *argv, env=env)
    assert "Traceback" not in run.err, run
    assert run.rc == (126 if program == "bin/tsh" else 1), run
    assert ": EINVAL: " in run.err and one_line(run.err), run


# =================================================================== a person's tsh, its host


@contextlib.contextmanager
def fake_host(path: Path, answer: bytes | None) -> Iterator[list[dict]]:
    """A run socket at ``path`` served by this process: it takes one message (and the
    descriptors passed with it, closed at once), records it, answers ``answer`` (None:
    closes without a word)."""
    heard: list[dict] = []
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    server.settimeout(15)

    def serve() -> None:
        try:
            connection, _ = server.accept()
        except OSError:
            return
        with connection:
            fds = array.array("i")
            data, ancillary, _, _ = connection.recvmsg(65536, socket.CMSG_SPACE(3 * fds.itemsize))
            for _, _, cmsg in ancillary:
                fds.frombytes(cmsg[: len(cmsg) - len(cmsg) % fds.itemsize])
            for fd in fds:
                os.close(fd)
            heard.append(json.loads(data))
            if answer is not None:
                connection.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield heard
    finally:
        thread.join(15)
        server.close()


def persons_tsh(storage: Path, where: Path, *argv: str, sock: Path) -> Run:
    """``bin/tsh ARGV`` run by a person whose environment names ``sock`` as its run socket."""
    env = clean_env(CTX_PATH=str(storage / "tool"), CTX_RUN_SOCKET=str(sock),
                    CTX_HOME=str(where))  # fmt: skip
    return by_hand(storage / "bin" / "tsh", *argv, env=env)


def test_a_run_socket_that_is_not_there_is_126_naming_the_tool_and_nothing_runs(storage):
    """H-2, T-3 and tsh's help ("126 when it cannot be run"): a person's tsh whose
    ``CTX_RUN_SOCKET`` names nothing cannot hand the command line to a host: exit 126, one
    line naming the tool and saying the host did not run it; the tool never ran (the file it
    would write is not there) and nothing is on stdout."""
    where = new_scratch_dir(TOP, "sock-")
    target = where / "written.txt"
    data = json.dumps({"path": str(target), "content": "x"})
    run = persons_tsh(storage, where, "fs.write", data, sock=where / "nothing.sock")
    assert (run.rc, run.out) == (126, ""), run
    assert one_line(run.err), run
    assert run.err.startswith("tsh: fs.write: ENOENT: the host did not run it: its run socket "), (
        run
    )
    assert run.err.endswith("nothing.sock: No such file or directory\n"), run
    assert not target.exists()
    shutil.rmtree(where)


NOT_RUN = "tsh: fs.write: EPROTO: the host did not run it: "


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        pytest.param(b"[]\n", NOT_RUN, id="not-an-object"),
        pytest.param(None, NOT_RUN, id="no-answer"),
        pytest.param(b'{"exit_status": "x"}\n', NOT_RUN,
                     id="a-status-that-is-no-number"),
        pytest.param(b'{"error": "EACCES: refused by this host", "exit_status": 126}\n',
                     "tsh: fs.write: EACCES: refused by this host\n", id="a-refusal"),
    ],
)  # fmt: skip
def test_what_a_run_socket_answers_that_is_no_status_is_126_and_runs_nothing(storage, answer, said):
    """H-2, T-3 and tsh's help: the host answers a command line with its exit status, or with
    its refusal.  A run socket a person serves that answers something else — not an object,
    nothing, a status that is no number — leaves tsh with 126 and one line saying the host
    did not run the tool; a refusal is relayed as the host words it, 126.  tsh sent the
    command line as it was typed and ran nothing itself."""
    where = new_scratch_dir(TOP, "sock-")
    target = where / "written.txt"
    data = json.dumps({"path": str(target), "content": "x"})
    with fake_host(where / "run.sock", answer) as heard:
        run = persons_tsh(storage, where, "fs.write", data, sock=where / "run.sock")
    assert (run.rc, run.out) == (126, ""), run
    assert one_line(run.err) and run.err.startswith(said), run
    assert heard == [{"tool": "fs.write", "argv": [data]}], heard
    assert not target.exists()
    shutil.rmtree(where)


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(b'{"exit_status": null}\n', id="null"),
        pytest.param(b'{"exit_status": {}}\n', id="an-object"),
        pytest.param(b'{"exit_status": 1e400}\n', id="an-infinity"),
    ],
)
def test_a_status_of_no_number_from_a_run_socket_is_126_not_a_traceback(storage, answer):
    """tsh's help ("126 when it cannot be run"), as for a status that is a word (above): a
    status of ``null``, an object or an infinity is no exit status either — exit 126, one
    line, never a traceback."""
    where = new_scratch_dir(TOP, "sock-")
    with fake_host(where / "run.sock", answer):
        run = persons_tsh(storage, where, "fs.stat", "/", sock=where / "run.sock")
    shutil.rmtree(where)
    assert "Traceback" not in run.err, run
    assert run.rc == 126 and run.err.startswith("tsh: fs.stat: EPROTO: the host did not run it"), (
        run
    )


@pytest.mark.parametrize(
    ("argv", "status"),
    [
        pytest.param(["load"], 1, id="load"),
        pytest.param(["exit"], 2, id="exit"),
    ],
)
def test_a_built_in_refusing_a_long_word_cuts_it_past_256_characters(storage, argv, status):
    """docs/tools.md "The agent terminal": "A message naming a word typed cuts it past 256
    characters, saying how long it was" — as ``which`` and an unknown name do.  A word of 400
    characters given to a built-in that refuses it is shown cut, with ``(400 characters)``."""
    word = "x" * 400
    env = clean_env(CTX_PATH=str(storage / "tool"))
    run = by_hand(storage / "bin" / "tsh", *argv, word, env=env)
    assert run.rc == status, run
    assert "x" * 257 not in run.err and "(400 characters)" in run.err, run


# ====================================================== the confined paths, through ctx run


def test_the_top_of_a_mount_is_no_file_to_read_or_write(world):
    """docs/tools.md "Paths are confined" (``fs.read`` or ``fs.write`` of a directory is
    ``EISDIR``): the top of a mount — ``/workspace`` itself — is refused by ``fs.write`` and
    ``fs.read`` with ``EISDIR`` naming it as the top of a mount, exit 1 in terminal mode, the
    same errno at stage ``exit`` in the native ``result`` frame; nothing is written in the
    workspace, not even a hidden temporary file."""
    before = snapshot(world.ws)
    for tool, value in (("fs.write", {"path": "/workspace", "content": "x"}),
                        ("fs.read", {"path": "/workspace"})):  # fmt: skip
        run = world.terminal(tool, json.dumps(value))
        assert (run.rc, run.out) == (1, ""), run
        assert run.err == f"{tool}: EISDIR: /workspace is the top of a mount\n", run
        _, result = world.native(tool, value)
        error = result["error"]
        assert (result["status"], error["error"], error["stage"]) == ("error", "EISDIR", "exit")
        assert result["output"]["message"] == "/workspace is the top of a mount", result
    assert snapshot(world.ws) == before


def test_content_piped_past_16_mib_is_efbig_and_nothing_is_written(world):
    """docs/tools.md "The core tools" (a core tool reads at most 16 MiB; ``fs.write PATH <
    FILE`` takes the contents from stdin): 16777216 bytes piped are written whole; one byte
    more is ``fs.write: EFBIG: content is larger than 16777216 bytes``, exit 1 (too much, not
    malformed), recorded so in the session, with no file and no temporary file made."""
    big = world.terminal("fs.write", "big.txt", input=b"a" * (CONTENT_LIMIT + 1), timeout=120)
    assert (big.rc, big.out) == (1, ""), big
    assert big.err == f"fs.write: EFBIG: content is larger than {CONTENT_LIMIT} bytes\n", big
    assert world.last_result()["exit_status"] == 1
    assert not (world.ws / "big.txt").exists() and hidden(world.ws) == []
    fits = world.terminal("fs.write", "big.txt", input=b"a" * CONTENT_LIMIT, timeout=120)
    assert fits.rc == 0, fits
    assert fits.out == f"wrote {CONTENT_LIMIT} bytes to /workspace/big.txt\n", fits
    assert (world.ws / "big.txt").stat().st_size == CONTENT_LIMIT


def test_writes_outside_the_writable_view_name_the_mount_or_the_view(world):
    """docs/tools.md "Paths are confined": writing to a read-only mount is ``EROFS`` naming
    the mount (``/data``, ``/ctx/tool``); a name ``/ctx`` does not show is ``EACCES`` (not in
    the agent's view), a path under no mount ``EACCES`` (outside every mount); exit 1 each,
    and nothing is made or changed anywhere."""
    tool_before = world.tool("fs.read").read_bytes()
    cases = {
        "/data/new.txt": "EROFS: /data/new.txt is on a read-only mount (/data)",
        "/ctx/tool/fs.read": "EROFS: /ctx/tool/fs.read is on a read-only mount (/ctx/tool)",
        "/ctx/planted": "EACCES: /ctx/planted is not in the agent's view (/ctx shows only what "
        "the agent's authority allows)",
        "/etc/cortexfs-planted": "EACCES: /etc/cortexfs-planted is outside every mount visible "
        "to the agent",
    }
    for path, said in cases.items():
        run = world.terminal("fs.write", json.dumps({"path": path, "content": "x"}))
        assert (run.rc, run.out, run.err) == (1, "", f"fs.write: {said}\n"), run
    assert sorted(os.listdir(world.data)) == ["d.txt"]
    assert world.tool("fs.read").read_bytes() == tool_before
    assert not (world.storage / "planted").exists()
    assert not Path("/etc/cortexfs-planted").exists()


def test_a_mount_whose_source_moved_away_or_became_a_link_is_never_followed(world):
    """T-5, docs/tools.md ("the host path is walked from the mount's source … nothing is ever
    followed"): with ``/data``'s source moved away, ``fs.stat /data/d.txt`` is ``ENOENT``
    naming ``/data``; with a symbolic link put where the source was (to the moved directory),
    the mount is withheld — ``fs.read`` is ``EACCES``, the path outside every visible mount —
    and the file behind the link is never read."""
    moved = world.top / "moved"
    world.data.rename(moved)
    gone = world.terminal("fs.stat", "/data/d.txt")
    assert (gone.rc, gone.out) == (1, ""), gone
    assert gone.err == "fs.stat: ENOENT: /data: No such file or directory\n", gone
    world.data.symlink_to(moved)
    linked = world.terminal("fs.read", "/data/d.txt")
    assert (linked.rc, linked.out) == (1, ""), linked
    assert linked.err == (
        "fs.read: EACCES: /data/d.txt is outside every mount visible to the agent\n"
    ), linked
    assert "kept" not in json.dumps(world.events())


def test_a_directory_the_agent_may_not_search_is_named_by_list_write_and_shell_exec(world):
    """T-5, docs/tools.md ("the kernel judges every open with the agent's uid"): below
    ``/workspace/shut`` (root's, mode 0700) ``fs.list``, ``fs.write`` and ``shell.exec``
    (as ``cwd``) are refused ``EACCES`` naming the view path of the directory or of the entry
    asked for, exit 1, and nothing is made there."""
    shut = world.ws / "shut"
    shut.mkdir(mode=0o700)
    (shut / "x").write_text("secret\n")
    calls = {
        "fs.list": ["shut/x"],
        "fs.write": [json.dumps({"path": "shut/y", "content": "y"})],
        "shell.exec": [json.dumps({"cmd": "touch made", "cwd": "shut"})],
    }
    for tool, argv in calls.items():
        run = world.terminal(tool, *argv)
        assert (run.rc, run.out) == (1, ""), run
        assert re.fullmatch(rf"{tool}: EACCES: /workspace/shut(/x)?: Permission denied\n",
                            run.err), run  # fmt: skip
    assert sorted(os.listdir(shut)) == ["x"] and not (world.ws / "made").exists()


@pytest.mark.parametrize("tool", ["fs.read", "fs.stat"])
def test_a_directory_the_agent_may_not_search_is_named_by_read_and_stat(world, tool):
    """T-5, docs/tools.md "Paths are confined": the refusal of the kernel below a directory
    the agent's uid may not search names the path in the agent's view, as the other tools
    name it (above) — not the last component alone, which says nothing of where it is."""
    shut = world.ws / "shut"
    shut.mkdir(mode=0o700)
    (shut / "x").write_text("secret\n")
    run = world.terminal(tool, "shut/x")
    assert (run.rc, run.out) == (1, ""), run
    assert run.err.startswith(f"{tool}: EACCES: /workspace/shut"), run


# ============================================================== the host's side of agent.*


def test_an_agent_create_request_larger_than_the_host_reads_is_efbig_and_makes_no_agent(world):
    """A-4, docs/tools.md ("a request line over the 64 KiB the host reads is ``EFBIG``"):
    ``agent.create`` with a request whose JSON line passes 65536 bytes (9000 tool names) is
    refused by the tool before it asks the host: ``EFBIG`` saying how large it is and what the
    host reads, exit 1 in terminal mode, at stage ``exit`` in native mode; no agent ``kid``,
    no controls of it, and the caller's controls unchanged."""
    wanted = {"name": "kid", "label": "kid_t", "tools": [f"t{i:05d}" for i in range(9000)]}
    before = world.controls()
    words = re.compile(rf"the request is (\d+) bytes as JSON; the host reads at most {HOST_LINE}")
    run = world.terminal("agent.create", json.dumps(wanted))
    assert (run.rc, run.out) == (1, ""), run
    said = words.fullmatch(run.err.removeprefix("agent.create: EFBIG: ").rstrip("\n"))
    assert said and int(said.group(1)) > HOST_LINE, run
    _, result = world.native("agent.create", wanted)
    error = result["error"]
    assert (error["error"], error["stage"], result["exit_status"]) == ("EFBIG", "exit", 1)
    assert words.search(error["message"]), result
    assert world.controls() == before
    assert not (world.storage / "agent" / "kid").exists()


def test_core_tool_failures_of_queued_jobs_fail_them_with_the_tools_errno(world):
    """W-1, docs/workers.md ("A failed job's ``error`` and ``reason``"): jobs whose core tool
    refuses — ``fs.write`` of an existing file with ``overwrite`` false (``EEXIST``), of the
    top of a mount (``EISDIR``), of a read-only mount (``EROFS``); ``agent.create`` of a
    request too large for the host (``EFBIG``); ``agent.update`` of text holding an escape
    sequence, which the host refuses (``EINVAL``, exit 2) — are finished in ``failed/`` by
    ``ctx queue work --drain`` with the tool's errno at stage ``exit``, its exit status and its
    sentence in ``reason``; the files, the agent's prompt and the list of agents are as they
    were, and the queue is settled."""
    queue = QueueCLI(world.storage, "proj")
    big = {"name": "kid", "label": "kid_t", "tools": [f"t{i:05d}" for i in range(9000)]}
    jobs = {
        "exists": ("fs.write", {"path": "a.txt", "content": "new", "overwrite": False},
                   "EEXIST", 1, "/workspace/a.txt exists and overwrite is false"),
        "top": ("fs.write", {"path": "/workspace", "content": "x"},
                "EISDIR", 1, "/workspace is the top of a mount"),
        "readonly": ("fs.write", {"path": "/data/x", "content": "x"},
                     "EROFS", 1, "/data/x is on a read-only mount (/data)"),
        "big": ("agent.create", big, "EFBIG", 1, "the host reads at most 65536"),
        "escape": ("agent.update", {"control": "system.md", "content": "a\u001b[2Jb"},
                   "EINVAL", 2, "'content' holds the control character '\\x1b' at character 1"),
    }  # fmt: skip
    for name, (tool, value, *_) in jobs.items():
        queue.publish(request(tool, input=value), name=name)
    prompt = (world.storage / "agent" / "coder.d" / "system.md").read_bytes()
    worked = world.ctx("queue", "work", "--project", "proj", "--agent", "coder", "--drain",
                       timeout=120)  # fmt: skip
    assert worked.rc == 0, worked
    for name, (tool, _, errno_word, status, said) in jobs.items():
        state, result = queue.only_result(f"{name}.req.json")
        error = result["error"]
        assert (state, error["error"], error["stage"]) == ("failed", errno_word, "exit"), result
        assert result["exit_status"] == status, result
        assert result["reason"].startswith(f"{errno_word}: {tool} exited with status {status}: ")
        assert said in result["reason"], result
    assert (world.ws / "a.txt").read_text() == "data\n"
    assert sorted(os.listdir(world.data)) == ["d.txt"]
    assert (world.storage / "agent" / "coder.d" / "system.md").read_bytes() == prompt
    assert [n for n in sorted(os.listdir(world.storage / "agent")) if n[0] != "."] == [
        "coder",
        "coder.d",
    ]
    queue.assert_settled()


# =============================================================== tsh as a tool, tsh.config


def test_tsh_run_as_the_agents_tool_names_a_bad_line_of_its_config(world):
    """H-4, docs/tools.md ("A ``tool/tsh.d/config`` that cannot be read … is said on stderr,
    as a bad line is"): ``ctx run --agent coder tsh which fs.read`` with a config line that is
    no setting names the line on stderr and runs on with the default."""
    (world.tool("tsh.d") / "config").write_text("max_loaded_tools=abc\n")
    run = world.terminal("tsh", "which", "fs.read")
    assert (run.rc, run.out) == (0, "/ctx/tool/fs.read\n"), run
    assert run.err == (
        "tsh: tsh.d/config:1: max_loaded_tools must be a positive integer, not 'abc' "
        "(ignored; the default applies)\n"
    ), run


@pytest.mark.parametrize("shape", ["fifo", "link"])
def test_tsh_run_as_the_agents_tool_says_when_it_cannot_use_its_config(world, shape):
    """H-4, docs/tools.md "The agent terminal": "A ``tool/tsh.d/config`` that cannot be read
    (a link, a FIFO, over 64 KiB) is said on stderr, as a bad line is, and the defaults
    apply" — as the terminal's tsh says ``/ctx/tool/tsh.d/config cannot be read (…)``."""
    config = world.tool("tsh.d") / "config"
    text = config.read_text()
    config.unlink()
    if shape == "fifo":
        os.mkfifo(config)
    else:
        (world.top / "config.elsewhere").write_text(text)
        config.symlink_to(world.top / "config.elsewhere")
    run = world.terminal("tsh", "which", "fs.read", timeout=20)
    assert (run.rc, run.out) == (0, "/ctx/tool/fs.read\n"), run
    assert "tsh.d/config cannot be read" in run.err, run


def tsh_config(storage: Path, *argv: str) -> Run:
    env = clean_env(CTX_STORAGE=str(storage), CTX_PATH=str(storage / "tool"))
    return ctx_run("tool", *argv, env=env)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        pytest.param({"set": {"cache_size": 3}}, "unknown setting 'cache_size'; known: "
                     "max_loaded_tools, cache_capacity, window_percent", id="an-unknown-key"),
        pytest.param({"set": {"cache_capacity": 40, "window_percent": 0}},
                     "window_percent must be a positive integer, not 0",
                     id="a-bad-value-beside-a-good-one"),
    ],
)  # fmt: skip
def test_an_update_tsh_config_refuses_changes_nothing(storage, value, said):
    """H-4, docs/tools.md "tsh.config" (validated whole before anything is written: known
    keys, positive integers … else ``EINVAL``, exit 2, and not one setting changes):
    ``ctx tool tsh.config`` and ``ctx tool --json tsh.config`` refuse the update naming the
    key at fault, exit 2, the JSON error object on stdout with ``--json``; the file is byte
    for byte as it was, and each call is a line of the tool's log with exit status 2."""
    config = storage / "tool" / "tsh.d" / "config"
    before = config.read_bytes()
    text = tsh_config(storage, "tsh.config", json.dumps(value))
    assert (text.rc, text.out, text.err) == (2, "", f"ctx: EINVAL: tsh.config: {said}\n"), text
    as_json = tsh_config(storage, "--json", "tsh.config", json.dumps(value))
    assert as_json.rc == 2, as_json
    assert as_json.json() == {"error": "EINVAL", "errno": 22, "message": said}, as_json
    assert config.read_bytes() == before
    logged = read_jsonl(storage / "tool" / "tsh.config.d" / "log")
    assert [entry["exit_status"] for entry in logged] == [2, 2], logged


def test_an_update_of_a_config_with_a_key_given_twice_waits_for_a_hand_fix(storage):
    """H-4, docs/tools.md "tsh.config" (an update is "refused while the file has a malformed
    line (a key given twice in the file among them; its default applies until one line is
    removed)"): the update is ``EINVAL`` naming the file, the line and what to do, exit 1 (the
    request was fine), the file untouched; a read still shows the settings, warning of the
    line, and once a line is removed the same update works."""
    config = storage / "tool" / "tsh.d" / "config"
    config.write_text("# mine\nmax_loaded_tools=8\nmax_loaded_tools=9\n")
    before = config.read_bytes()
    refused = tsh_config(storage, "tsh.config", "cache_capacity=40")
    assert (refused.rc, refused.out) == (1, ""), refused
    assert refused.err == (
        f"ctx: EINVAL: tsh.config: {config} must be fixed by hand first: tsh.d/config:3: "
        "max_loaded_tools is given again (first on line 2), so which one holds is unclear; "
        "keep one\n"
    ), refused
    assert config.read_bytes() == before
    read = tsh_config(storage, "tsh.config")
    assert read.rc == 0 and read.out.splitlines()[:2] == [
        "max_loaded_tools=64",
        "cache_capacity=32",
    ], read
    assert "tsh.d/config:3: max_loaded_tools is given again" in read.err, read
    config.write_text("# mine\nmax_loaded_tools=8\n")
    fixed = tsh_config(storage, "tsh.config", "cache_capacity=40")
    assert fixed.rc == 0 and "cache_capacity=40\n" in fixed.out, fixed
    assert config.read_text() == "# mine\nmax_loaded_tools=8\ncache_capacity=40\n"


def test_an_update_of_a_config_on_a_read_only_filesystem_says_to_remount(_template):
    """H-4, docs/tools.md "tsh.config": on a storage root whose filesystem is read-only an
    update is ``EROFS`` naming the file and "remount it read-write", exit 1, in text and as
    the ``--json`` error object; a read still shows the settings (exit 0)."""
    top = new_scratch_dir(TOP, "ro-")
    try:
        with small_tmpfs(top / "mnt", "64m", 0o755) as mnt:
            storage = copy_of_root(_template, mnt / "storage")
            subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
            config = storage / "tool" / "tsh.d" / "config"
            said = f"{config} cannot be changed: it is on a read-only filesystem; remount it "
            said += "read-write"
            refused = tsh_config(storage, "tsh.config", "cache_capacity=40")
            assert (refused.rc, refused.out) == (1, ""), refused
            assert refused.err == f"ctx: EROFS: tsh.config: {said}\n", refused
            as_json = tsh_config(storage, "--json", "tsh.config", '{"set": {"window_percent": 5}}')
            assert as_json.rc == 1, as_json
            assert as_json.json() == {"error": "EROFS", "errno": 30, "message": said}, as_json
            read = tsh_config(storage, "tsh.config")
            assert read.rc == 0 and "cache_capacity=32\n" in read.out, read
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ============================================================================ the MCP bridge


def mcp_tool(world: World, config: str) -> Path:
    """``fake.echo`` installed from a manifest whose locator names ``config``; its
    executable."""
    manifest = world.top / "fake.echo.json"
    manifest.write_text(json.dumps({
        "manifest": 2, "kind": "tool", "name": "fake.echo", "description": "Echo text.",
        "schema": {"type": "object", "properties": {"text": {"type": "string"}},
                   "additionalProperties": False},
        "cap": {"side_effects": False, "network": False},
        "mcp": {"transport": "stdio", "config": config, "server": "fake", "tool": "echo"},
    }))  # fmt: skip
    installed = world.ctx("object", "install", manifest, "--tier", "system")
    assert installed.rc == 0, installed
    return world.tool("fake.echo")


def server_config(path: Path, marker: Path) -> None:
    """An MCP configuration naming server ``fake``, whose command leaves ``marker``."""
    command = {"command": "/bin/sh", "args": ["-c", f"touch {marker}"]}
    path.write_text(json.dumps({"mcpServers": {"fake": command}}))
    path.chmod(0o644)


@pytest.mark.parametrize(
    ("damage", "argv", "status", "said"),
    [
        pytest.param("locator-a-directory", '{"text": "hi"}', 1,
                     "ENOEXEC: {tool}.d/mcp is not a readable MCP locator", id="locator-dir"),
        pytest.param("schema-an-array", '{"text": "hi"}', 1,
                     "ENOEXEC: {tool}.d/schema is not a JSON Schema object", id="schema-array"),
        pytest.param("config-writable-by-others", '{"text": "hi"}', 1,
                     "EACCES: {config} (on the host {config}) names the command this tool runs",
                     id="loose-config"),
        pytest.param(None, '{"txt": "hi"}', 2,
                     "EINVAL: input does not match the schema of fake.echo", id="bad-input"),
    ],
)  # fmt: skip
def test_an_mcp_tool_run_by_hand_refuses_before_it_starts_its_server(
    world, damage, argv, status, said
):
    """M-4, docs/tools.md "MCP servers as tool sources" (the bridge reads its locator and
    schema, refuses a locator that is not its strict stdio locator, checks the input against
    the schema, holds the configuration to StrictModes): run by a person, an intact
    ``fake.echo`` starts its server (which leaves a marker); a locator that is a directory,
    a schema that is no object (``ENOEXEC``, the tool damaged), a configuration others may
    write (``EACCES`` naming it and ``chmod go-w``) exit 1, input the schema refuses exits
    2 — each one line, and the server never started."""
    where = new_scratch_dir(TOP, "mcp-")
    config, marker = where / "fake.json", where / "server-started"
    server_config(config, marker)
    tool = mcp_tool(world, str(config))
    intact = by_hand(tool, '{"text": "hi"}', env=clean_env())
    assert intact.rc == 1 and marker.exists(), intact  # the server ran (and said nothing)
    marker.unlink()
    if damage == "locator-a-directory":
        (tool.parent / "fake.echo.d" / "mcp").unlink()
        (tool.parent / "fake.echo.d" / "mcp").mkdir()
    elif damage == "schema-an-array":
        (tool.parent / "fake.echo.d" / "schema").write_text("[]")
    elif damage == "config-writable-by-others":
        config.chmod(0o666)
    run = by_hand(tool, argv, env=clean_env())
    assert (run.rc, run.out) == (status, ""), run
    expected = said.replace("{tool}", str(tool)).replace("{config}", str(config))
    assert one_line(run.err) and run.err.startswith(f"fake.echo: {expected}"), run
    if damage == "config-writable-by-others":
        assert "(chown, chmod go-w)" in run.err, run
    assert not marker.exists()
    shutil.rmtree(where)


def test_an_mcp_tool_whose_configuration_the_agent_cannot_see_starts_no_server(world):
    """M-4 ("the visible absolute config path"), docs/tools.md (the configuration is read
    as the agent sees it, inside its visible mounts): through ``ctx run`` a locator naming a
    file under no mount of the agent is ``EACCES`` naming it, exit 1, and no server starts;
    the same configuration at ``/data`` (the agent's read-only mount) starts it."""
    config, marker = world.data / "fake.json", world.ws / "server-started"
    server_config(config, marker)
    tool = mcp_tool(world, str(config))
    world.allow("fake.echo")
    run = world.terminal("fake.echo", '{"text": "hi"}')
    assert (run.rc, run.out) == (1, ""), run
    assert run.err == f"fake.echo: EACCES: {config} is outside every mount visible to the agent\n"
    assert not marker.exists()
    locator = tool.parent / "fake.echo.d" / "mcp"
    locator.write_text(locator.read_text().replace(str(config), "/data/fake.json"))
    seen = world.terminal("fake.echo", '{"text": "hi"}')
    assert seen.rc == 1 and marker.exists(), seen  # started, as the agent (and said nothing)


# ======================================================================= a live terminal


@pytest.fixture
def host(_template: Path) -> Iterator[CoderHost]:
    """Agent ``coder`` allowed the core tools it uses below in both policies, ``a.txt`` in
    its workspace."""
    tools = ["fs.read", "fs.write", "fs.stat", "shell.exec", "agent.update"]
    with coder_host(_template, TOP, tools, {"a.txt": "data\n"}) as made:
        for tool in tools:
            made.grant_in_tool(tool)
        yield made


def attached(host: CoderHost) -> tuple[str, Raw]:
    term = host.start()
    client = Raw(term.listening_at, b"attach\n")
    assert client.shows(AGENT_PROMPT), client.text()
    return term.session, client


def results_of(host: CoderHost, session: str) -> list[tuple[str, int]]:
    return [(e["object"], e["exit_status"]) for e in host.events(session)
            if e["type"] == "tool_result"]  # fmt: skip


@needs_terminal
def test_in_the_terminal_core_tool_refusals_show_with_their_errno_and_status(host):
    """T-3, H-1, docs/tools.md ("The core tools", "Paths are confined"): typed at tsh, a core
    tool refuses as it does anywhere — ``fs.write PATH`` with the terminal on stdin is no
    content (``EINVAL``, status 2, nothing written), the top of a mount ``EISDIR``, ``a.txt/``
    ``ENOTDIR``, a ``cwd`` outside the mounts ``EACCES`` (status 1), and ``agent.update`` of
    text holding an escape sequence the host's ``EINVAL`` (status 2) — each line on the
    terminal, escaped, and each status in the session; nothing is made in the workspace and
    the prompt is unchanged."""
    prompt = (host.storage / "agent" / "coder.d" / "system.md").read_bytes()
    session, client = attached(host)
    try:
        lines = {
            "fs.write out.txt": ("fs.write: EINVAL: 'content' is required: pipe the new "
                                 "contents on stdin (fs.write PATH < FILE)"),
            "fs.read /workspace": "fs.read: EISDIR: /workspace is the top of a mount\n",
            "fs.stat a.txt/": ("fs.stat: ENOTDIR: /workspace/a.txt is not a directory, but the "
                               "path ends in '/'\n"),
            """shell.exec '{"cmd": "touch made", "cwd": "/etc"}'""":
                "shell.exec: EACCES: /etc is outside every mount visible to the agent\n",
            """agent.update '{"control": "system.md", "content": "a\\u001b[2Jb"}'""":
                "agent.update: EINVAL: 'content' holds the control character '\\x1b' at ",
        }  # fmt: skip
        for line, said in lines.items():
            answer = client.answer(line)
            assert answer.startswith(said), (line, answer)
        assert b"\x1b[2J" not in client.data
    finally:
        client.close()
    assert results_of(host, session) == [
        ("tool/fs.write", 2),
        ("tool/fs.read", 1),
        ("tool/fs.stat", 1),
        ("tool/shell.exec", 1),
        ("tool/agent.update", 2),
    ]
    assert sorted(os.listdir(host.ws)) == ["a.txt"]
    assert (host.storage / "agent" / "coder.d" / "system.md").read_bytes() == prompt


def kill_the_view(term_rundir: Path) -> None:
    """SIGKILL to the mount process of a terminal's view (the terminal this test started)."""
    [mount] = [
        pid
        for pid in processes_of(term_rundir)
        if b" mount " in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    ]
    os.kill(mount, signal.SIGKILL)
    assert wait_for(lambda: not alive(mount), 10)
    # The kernel answers from what it cached of the view for a moment (its entry and
    # attribute timeouts); then every look there is ENOTCONN, in the sandbox as here.
    view = term_rundir / "private" / "ctx"
    assert wait_for(lambda: cut_off(view / "tool") and cut_off(view / "tool" / "fs.stat"), 10)


def cut_off(path: Path) -> bool:
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == errno.ENOTCONN
    return False


@needs_terminal
def test_when_the_terminals_view_has_ended_a_call_says_why_no_tool_is_found(host):
    """docs/sessions.md (``terminal.view_lost``: "the agent's ``/ctx`` answers ``ENOTCONN``
    until the terminal is stopped and started again, and tsh says so when it finds no tool"):
    with the view's mount process killed, ``fs.stat a.txt`` typed at tsh names the
    ``CTX_PATH`` directory that cannot be reached, ``ENOTCONN``, and the remedy; no call is
    made (the session holds only the call made before), and ``ctx agent stop`` still ends
    the terminal."""
    term = host.start()
    client = Raw(term.listening_at, b"attach\n")
    try:
        assert client.shows(AGENT_PROMPT), client.text()
        assert "path: /workspace/a.txt\n" in client.answer("fs.stat a.txt")
        kill_the_view(term.rundir)
        answer = client.answer("fs.stat a.txt")
    finally:
        client.close()
    assert answer == (
        "tsh: fs.stat: not a tool on CTX_PATH: the CTX_PATH directory /ctx/tool cannot be "
        "reached (ENOTCONN: Transport endpoint is not connected); this terminal's view of /ctx "
        "has ended: ask the host to stop and start the terminal\n"
    ), answer
    assert results_of(host, term.session) == [("tool/fs.stat", 0)]
    host.stop(term.session)


@needs_terminal
def test_when_the_terminals_view_has_ended_which_and_describe_say_why(host):
    """docs/sessions.md ``terminal.view_lost``: "tsh says so when it finds no tool".
    ``which`` and ``describe`` find no tool then either, and must say why (``ENOTCONN``,
    the terminal to stop and start) rather than call a tool on the path not on it."""
    term = host.start()
    client = Raw(term.listening_at, b"attach\n")
    try:
        assert client.shows(AGENT_PROMPT), client.text()
        kill_the_view(term.rundir)
        which = client.answer("which fs.stat")
        describe = client.answer("describe fs.stat")
    finally:
        client.close()
    host.stop(term.session)
    assert "ENOTCONN" in which and "stop and start the terminal" in which, which
    assert "ENOTCONN" in describe, describe
