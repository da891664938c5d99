"""``ctxmcp`` and MCP-backed tools run under tight per-process resource limits (SPEC §10 with
§2, §3, §4 and §6): ``RLIMIT_NOFILE`` too small to start a server, ``RLIMIT_AS`` too small
for what a server answers, ``RLIMIT_NPROC`` that leaves the agent's uid no second process, a
server that its own ``RLIMIT_CPU`` or ``RLIMIT_FSIZE`` (``ulimit`` in its configuration)
kills in the middle of a call run by a worker or of a listing, a listing of a thousand tools
with one huge schema projected with few descriptors or under a file-size limit, and several
workers, each a few descriptors above what it needs, draining many calls of one projected
tool that share a configuration.

Each refusal must be an errno-style line with an honest exit status and no traceback; a
queue job is finished once, with a reason, never left claimed and never run twice; no
server, bridge or temporary file outlives the command.  The limits are set in the child only
(``preexec_fn``), soft and hard, except ``RLIMIT_AS``, whose hard limit is left alone.

The servers here are small Python programs speaking JSON-RPC over stdio (raw pipes, as
test_acceptance_flows_hostile_mcp_server.py's); the other MCP flows are in
test_acceptance_flows_mcp*.py and test_acceptance_flows_hostile_mcp_*.py, the single claims
in test_acceptance_mcp*.py and tests/mcp/.  Black-box: the installed ``ctx`` and ``ctxmcp``,
real processes and uids."""

from __future__ import annotations

import json
import os
import resource
import shlex
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    REPO,
    OnStorage,
    QueueCLI,
    Run,
    clean_env,
    kill_processes_of,
    new_scratch_dir,
    processes_of,
    read_jsonl,
    scratch_top,
    wait_for,
)
from tests.support.mcp_wire import WIRE
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, users_named

SCRATCH = scratch_top(__file__)
VENV_BIN = REPO / ".venv" / "bin"
CTX = VENV_BIN / "ctx"
CTXMCP = VENV_BIN / "ctxmcp"
PYTHON = VENV_BIN / "python"
LABEL = "coder_t"
TRACEBACK = "Traceback (most recent call last)"
MIB = 1 << 20
# A user of this file's own, so that the processes other tests run as ``nobody`` or
# ``ctxtest`` do not count against its RLIMIT_NPROC.
NPROC_USER = "ctxmcpnproc"
# Empty objects a server puts in one answer: 3 bytes each on the wire (9 MB, under the
# 16 MiB a message may hold), over 60 once parsed (far over LIMITED_MEMORY).
EMPTIES = 3_000_000
LIMITED_MEMORY = 128 * MIB

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid"),
    pytest.mark.skipif(not CTXMCP.exists(), reason="ctxmcp is not installed in the venv"),
]

# A stdio MCP server on raw pipes.  argv[1] is its script (JSON):
#   tools      how many tools it lists: "t", then "t0001", "t0002"…
#   huge       bytes of a property description in the schema of one more tool, "huge"
#   huge_at    where in the listing "huge" is (default: last)
#   list_pad   the tools/list answer also holds this many empty objects
#   spill_list at tools/list, write 4 MiB to this file with SIGXFSZ at its default
#   trace      a file (made by the host, writable by all) each tools/call is appended to
# A tools/call acts on its arguments' "how": "echo" (the default) answers with the
# arguments, "burn" spins until the CPU limit ends it, "pad" answers with "n" empty
# objects in its structuredContent.
SERVER = (
    WIRE
    + r"""
import signal

SCRIPT = json.loads(sys.argv[1])

def answer(ident, result, pad_key=None, pad=0):
    text = json.dumps(result)
    if pad:  # the padding is written, never built as objects here
        where = text.rindex(pad_key) + len(pad_key) + 2
        text = text[:where] + "[" + "{}," * (pad - 1) + "{}]" + text[where + 2:]
    send_bytes(b'{"jsonrpc": "2.0", "id": ' + json.dumps(ident).encode() + b', "result": '
               + text.encode() + b"}\n")

def trace(**fact):
    if SCRIPT.get("trace"):
        fd = os.open(SCRIPT["trace"], os.O_WRONLY | os.O_APPEND)
        os.write(fd, json.dumps({"pid": os.getpid(), **fact}).encode() + b"\n")
        os.close(fd)

SCHEMA = {"type": "object", "properties": {"how": {"type": "string"}, "n": {"type": "integer"}}}
count = SCRIPT.get("tools", 1)
TOOLS = [{"name": "t" if i == 0 else f"t{i:04d}", "description": f"Tool number {i}.",
          "inputSchema": SCHEMA} for i in range(count)]
if SCRIPT.get("huge"):
    big = {"type": "object", "properties": {"x": {"type": "string",
                                                  "description": "h" * SCRIPT["huge"]}}}
    huge = {"name": "huge", "description": "A huge schema.", "inputSchema": big}
    TOOLS.insert(SCRIPT.get("huge_at", len(TOOLS)), huge)

while True:
    message = receive()
    if "id" not in message:
        continue
    method, ident = message.get("method"), message["id"]
    if method == "initialize":
        answer(ident, {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                       "serverInfo": {"name": "limits", "version": "0"}})
    elif method == "tools/list":
        if SCRIPT.get("spill_list"):  # as a program that leaves SIGXFSZ at its default does
            signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
            with open(SCRIPT["spill_list"], "wb") as spill:
                spill.write(b"s" * (4 << 20))
        answer(ident, {"tools": TOOLS, "padding": []}, '"padding"', SCRIPT.get("list_pad", 0))
    elif method == "tools/call":
        arguments = message["params"]["arguments"]
        trace(call=os.environ.get("CTX_CALL"), arguments=arguments)
        how = arguments.get("how", "echo")
        if how == "burn":
            while True:
                pass
        text = json.dumps(arguments)
        result = {"content": [{"type": "text", "text": text}], "isError": False,
                  "structuredContent": {"arguments": arguments, "padding": []}}
        answer(ident, result, '"padding"', int(arguments.get("n", 0)) if how == "pad" else 0)
    else:
        send_bytes(json.dumps({"jsonrpc": "2.0", "id": ident,
                               "error": {"code": -32601, "message": method}}).encode() + b"\n")
"""
)


# ---------------------------------------------------------------------------------- helpers


def rlimits(
    nofile: int | None = None,
    nproc: int | None = None,
    address_space: int | None = None,
    fsize: int | None = None,
) -> dict[int, tuple[int, int]]:
    """The limits a child gets: soft and hard alike, but the address space, whose hard limit
    stays where it was."""
    limits = {}
    for which, value in ((resource.RLIMIT_NOFILE, nofile), (resource.RLIMIT_NPROC, nproc),
                         (resource.RLIMIT_FSIZE, fsize)):  # fmt: skip
        if value is not None:
            limits[which] = (value, value)
    if address_space is not None:
        limits[resource.RLIMIT_AS] = (address_space, resource.getrlimit(resource.RLIMIT_AS)[1])
    return limits


def limited(
    argv: list[str | os.PathLike],
    env: dict[str, str],
    limits: dict[int, tuple[int, int]],
    *,
    user: UnprivilegedUser | None = None,
    input: str = "",
    timeout: float = 60,
) -> Run:
    """``argv`` in a child under ``limits`` (set after the switch to ``user``, if any)."""

    def preexec() -> None:
        for which, value in limits.items():
            resource.setrlimit(which, value)

    as_user = {}
    if user is not None:
        as_user = {"user": user.uid, "group": user.gid, "extra_groups": []}
    done = subprocess.run([str(a) for a in argv], input=input.encode(), capture_output=True,
                          env=env, preexec_fn=preexec, timeout=timeout, **as_user)  # fmt: skip
    return Run([str(a) for a in argv[1:]], done.returncode,
               done.stdout.decode("utf-8", "replace"),
               done.stderr.decode("utf-8", "replace"))  # fmt: skip


@dataclass
class Host(OnStorage):
    """A directory every uid may search: a bootstrapped storage root (queue ``proj``),
    ``mcp/`` (host-owned, holding the configuration and the server, mounted read-only at the
    same path by the agent), ``trace/`` where the servers, running as the agent, note each
    call, and ``tmp/``, the TMPDIR of the commands run here."""

    top: Path
    storage: Path
    mcp: Path
    trace: Path
    tmp: Path
    uid: int = -1

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage), TMPDIR=str(self.tmp))

    @property
    def config(self) -> Path:
        return self.mcp / "mcp.json"

    @property
    def calls(self) -> list[dict]:
        return read_jsonl(self.trace / "calls.jsonl")

    def serve(self, shell: str = "", **script) -> None:
        """``mcp.json`` whose server ``s`` runs SERVER with ``script``; ``shell``: through
        ``/bin/sh -c 'SHELL; exec …'``, as a configuration that sets a limit does."""
        script.setdefault("trace", str(self.trace / "calls.jsonl"))
        argv = [str(PYTHON), str(self.mcp / "server.py"), json.dumps(script)]
        if shell:
            entry = {"command": "/bin/sh", "args": ["-c", f"{shell}; exec {shlex.join(argv)}"]}
        else:
            entry = {"command": argv[0], "args": argv[1:]}
        self.config.write_text(json.dumps({"mcpServers": {"s": entry}}))
        self.config.chmod(0o644)

    def ctxmcp(self, *args, limits: dict | None = None, user=None, timeout: float = 60) -> Run:
        return limited([CTXMCP, *args], self.env, limits or {}, user=user, timeout=timeout)

    def project_args(self, out: Path) -> tuple:
        return ("project", "--config", self.config, "--runtime-config", self.config,
                "--server", "s", "--out", out)  # fmt: skip

    def adopt(self, *options: str) -> None:
        """Project ``s``, install ``s.t`` in the system tier, its own policy allowing the
        label, and make agent ``coder`` granted it and queue ``proj`` (``options``: of
        ``ctx agent create``)."""
        out = self.top / "candidates"
        projected = self.ctxmcp(*self.project_args(out), "--replace")
        assert projected.rc == 0, projected
        installed = self.ctx("object", "install", out / "s.t.manifest.json", "--tier", "system")
        assert installed.rc == 0, installed
        self.allow_tool(LABEL, "s.t")
        req = {"name": "coder", "label": LABEL, "tools": ["s.t"],
               "shared": {"proj": ["read", "write"]},
               "mount": [[str(self.mcp), str(self.mcp), "ro"]]}  # fmt: skip
        self.uid = self.create_agent(req, *options)["identity"]["uid"]
        (self.trace / "calls.jsonl").write_text("")

    def call(self, payload: dict, limits: dict | None = None, native: bool = True) -> Run:
        mode = ("--native",) if native else ()
        given = json.dumps(payload)
        argv = [CTX, "run", "--agent", "coder", *mode, "s.t", *(() if native else (given,))]
        return limited(argv, self.env, limits or {}, input=given if native else "")

    def events(self, session: str = "default") -> list[dict]:
        return read_jsonl(self.storage / "home" / str(self.uid) / "agent" / "coder" /
                          "session" / session / "events.jsonl")  # fmt: skip

    def log(self) -> list[dict]:
        return read_jsonl(self.storage / "tool" / "s.t.d" / "log")


@pytest.fixture
def host(_template: Path) -> Iterator[Host]:
    top = new_scratch_dir(SCRATCH, "host-")
    try:
        storage = copy_of_root(_template, top / "storage")
        mcp, trace, tmp = top / "mcp", top / "trace", top / "tmp"
        for directory, mode in ((mcp, 0o755), (trace, 0o755), (tmp, 0o1777)):
            directory.mkdir()
            directory.chmod(mode)
        (mcp / "server.py").write_text(SERVER)
        (mcp / "server.py").chmod(0o644)
        (trace / "calls.jsonl").touch()
        (trace / "calls.jsonl").chmod(0o666)
        yield Host(top, storage, mcp, trace, tmp)
    finally:
        kill_processes_of(top)
        shutil.rmtree(top, ignore_errors=True)


def frames(run: Run) -> list[dict]:
    return [json.loads(line) for line in run.out.splitlines() if line.strip()]


def by_call(events: list[dict]) -> dict[str, dict[str, dict]]:
    """``{call: {"tool_call": event, "tool_result": event}}`` of a session's events."""
    calls: dict[str, dict[str, dict]] = {}
    for event in events:
        if event["type"] in ("tool_call", "tool_result"):
            calls.setdefault(event["call"], {})[event["type"]] = event
    return calls


def no_traceback(*runs: Run) -> None:
    for run in runs:
        assert TRACEBACK not in run.out + run.err, run


def assert_nothing_left(host: Host) -> None:
    """No server or bridge of ``host`` runs on, and no temporary file is left in its TMPDIR."""
    assert wait_for(lambda: not processes_of(host.top), 10), processes_of(host.top)
    assert os.listdir(host.tmp) == [], os.listdir(host.tmp)


# ================================================================ ctxmcp under limits


def test_ctxmcp_without_descriptors_for_its_server_says_emfile_and_makes_nothing(
    host: Host,
) -> None:
    """M-1 (docs/tools.md, "Exit statuses": a server that could not start is exit 1, named
    with its errno): at ``RLIMIT_NOFILE`` 8, enough for the interpreter but not for the
    server's pipes, ``ctxmcp list`` and ``project`` stop with ``ctxmcp: EMFILE: …`` naming the
    server, exit 1, no traceback; ``project`` makes no OUT, no server runs on, and nothing is
    left in TMPDIR (where ctxmcp keeps the server's stderr); with the limit lifted both work."""
    host.serve()
    out = host.top / "deep" / "out"
    few = rlimits(nofile=8)

    listed = host.ctxmcp("list", "--config", host.config, "--server", "s", limits=few)
    projected = host.ctxmcp(*host.project_args(out), limits=few)

    no_traceback(listed, projected)
    for run in (listed, projected):
        assert run.rc == 1 and run.err.startswith("ctxmcp: EMFILE: "), run
        assert "server 's'" in run.err, run
        assert "raise the limit of open files ('ulimit -n')" in run.err, run
    assert not (host.top / "deep").exists()
    assert_nothing_left(host)
    again = host.ctxmcp(*host.project_args(out))
    assert again.rc == 0 and os.listdir(out) == ["s.t.manifest.json"], again


def test_ctxmcp_short_of_memory_for_a_listing_says_enomem_without_a_traceback(
    host: Host,
) -> None:
    """M-1, README (errors read ``ERRNO: what to do``), docs/tools.md (memory is a host
    shortage, ``ENOMEM``): a ``tools/list`` answer of 9 MB — under the 16 MiB a message may
    be — made of three million empty objects needs more memory once parsed than ctxmcp's
    128 MiB address-space limit allows; ``ctxmcp project`` then stops with
    ``ctxmcp: ENOMEM: …``, exit 1, no traceback, no OUT made, no server left running."""
    host.serve(list_pad=1000)
    listed = host.ctxmcp("list", "--config", host.config, "--server", "s")
    assert listed.rc == 0 and listed.out.startswith("s.t\t"), listed  # a well-formed answer
    host.serve(list_pad=EMPTIES)
    out = host.top / "out"

    projected = host.ctxmcp(*host.project_args(out), limits=rlimits(address_space=LIMITED_MEMORY))

    assert not out.exists()
    assert_nothing_left(host)
    assert projected.rc == 1, projected
    no_traceback(projected)
    assert projected.err.startswith("ctxmcp: ENOMEM: "), projected


def test_a_thousand_tools_and_a_huge_schema_project_whole_or_not_at_all(host: Host) -> None:
    """M-1, M-3, M-4, T-8 (docs/tools.md, "Candidates": all or none, each written whole
    through one descriptor of OUT; a failure while writing, ``EFBIG`` included, removes what
    was written and the directories made for OUT): a server listing 1 000 tools and, 100th,
    one whose schema makes a candidate of 600 kB is projected whole with 12 descriptors;
    under a file-size limit of 256 kB only that candidate cannot be written, after the 99
    before it were, and the projection is ``EFBIG``, exit 1, no traceback, saying nothing
    was written — no candidate, no temporary file, no OUT; ``ctx object check`` takes the
    huge candidate and a sample of the rest."""
    host.serve(tools=1000, huge=600_000, huge_at=99)
    fsize_out = host.top / "fsize" / "out"
    limited_out = host.top / "few-descriptors"

    cut = host.ctxmcp(*host.project_args(fsize_out), limits=rlimits(fsize=256 * 1024))
    whole = host.ctxmcp(*host.project_args(limited_out), "--json", limits=rlimits(nofile=12))

    no_traceback(cut, whole)
    assert cut.rc == 1 and cut.err.startswith("ctxmcp: EFBIG: "), cut
    assert "s.huge.manifest.json" in cut.err and "nothing was written" in cut.err, cut
    assert not (host.top / "fsize").exists(), os.listdir(host.top / "fsize")
    assert whole.rc == 0, whole
    report = whole.json()
    assert report["skipped"] == [] and len(report["written"]) == 1001, report["skipped"][:3]
    names = sorted(os.listdir(limited_out))
    assert len(names) == 1001 and not [n for n in names if n.startswith(".")], names[:5]
    huge = limited_out / "s.huge.manifest.json"
    assert 600_000 < huge.stat().st_size < MIB
    sample = [huge, limited_out / "s.t.manifest.json", limited_out / "s.t0999.manifest.json"]
    checked = host.ctx("object", "check", *sample)
    assert checked.rc == 0, checked
    assert_nothing_left(host)


# ====================================================== the bridge of an installed tool


def test_a_call_short_of_descriptors_says_emfile_and_is_never_called_damaged(
    host: Host,
) -> None:
    """M-4 (docs/tools.md, the bridge), T-3, T-7, docs/tools.md ("A stage that cannot judge
    because the host is short of something … refuses with that errno rather than with a
    verdict"): ``ctx run`` of an MCP-backed tool at ``RLIMIT_NOFILE`` 6 and 8 — the limit the
    runner, the bridge and the server inherit — fails at whatever step runs short with
    ``EMFILE``, exit 126 (the bridge did not start) or 1 (the bridge could not start the
    server), never a traceback, never ``ENOEXEC``/damaged or ``EACCES``; the
    server runs no call; every ``tool_call`` the session holds has its ``tool_result``, with
    that errno or, for the bridge's own refusal (terminal mode passes the tool's stderr
    through), none; no bridge or server is left, and with the limit lifted the same call
    succeeds."""
    host.serve()
    host.adopt()

    for nofile in (6, 8):
        ran = host.call({"n": nofile}, rlimits(nofile=nofile), native=False)
        no_traceback(ran)
        assert ran.rc in (1, 126), (nofile, ran)  # 126: ctx run could not start the bridge
        [line] = [line for line in ran.err.splitlines() if ": EMFILE: " in line]
        assert line.startswith(("ctx: EMFILE: ", "s.t: EMFILE: ")), (nofile, ran)
        assert "ENOEXEC" not in ran.err and "damaged" not in ran.err, (nofile, ran)
        assert "EACCES" not in ran.err, (nofile, ran)
    assert host.calls == []
    for call, pair in by_call(host.events()).items():
        assert set(pair) == {"tool_call", "tool_result"}, (call, pair)
        # null: the bridge's own EMFILE, which terminal mode passes through unrecorded
        assert pair["tool_result"]["status"] == "error", pair
        assert pair["tool_result"]["errno"] in ("EMFILE", None), pair
    assert_nothing_left(host)

    ran = host.call({"n": 1}, native=False)
    assert ran.rc == 0 and json.loads(ran.out) == {"n": 1}, ran


def test_a_call_whose_answer_does_not_fit_the_memory_limit_fails_with_enomem(
    host: Host,
) -> None:
    """M-4 (docs/tools.md, the bridge's step 5), T-3, T-7, docs/tools.md (memory is a host
    shortage: ``ENOMEM``, not a verdict): a remote tool answers with 9 MB — under the
    16 MiB a message may be — of empty objects, which the bridge cannot parse within the
    128 MiB address-space limit ``ctx run`` passes on to it; the native call then fails with
    ``ENOMEM`` in its result frame, no traceback among its stderr frames, the session records
    the call with that errno, and no server is left."""
    host.serve()
    host.adopt()
    padded = frames(host.call({"how": "pad", "n": 1000}))[-1]
    assert padded["output"]["structuredContent"]["padding"] == [{}] * 1000, padded["error"]
    (host.trace / "calls.jsonl").write_text("")

    ran = host.call({"how": "pad", "n": EMPTIES}, rlimits(address_space=LIMITED_MEMORY))

    assert_nothing_left(host)
    assert len(host.calls) == 1
    result = frames(ran)[-1]
    assert ran.rc == 1 and result["type"] == "result" and result["status"] == "error", ran
    assert TRACEBACK not in result["stderr"] and TRACEBACK not in ran.err, result["stderr"][:600]
    assert result["error"]["error"] == "ENOMEM", result["error"]
    pair = by_call(host.events())[result["call"]]
    assert pair["tool_result"]["errno"] == "ENOMEM", pair


def test_an_agent_uid_without_a_second_process_gets_eagain_naming_the_server(
    host: Host,
) -> None:
    """M-1, M-4, T-3, T-7, docs/tools.md ("Exit statuses": a server that could not start is
    named with its errno): for a uid at ``RLIMIT_NPROC`` 1, ``ctxmcp list`` and ``project``
    cannot start the server: ``ctxmcp: EAGAIN: cannot start server 's' …``, exit 1, no
    traceback, no OUT.  An agent running as that uid, called by root's ``ctx run`` under the
    same limit, gets its bridge started but not the server: the call fails with ``EAGAIN``
    naming the server, in both modes, the native one recorded with that errno; the server
    never ran."""
    [user] = users_named(NPROC_USER)
    host.serve()
    one = rlimits(nproc=1)
    outs = host.top / "user-out"
    outs.mkdir()
    os.chown(outs, user.uid, user.gid)
    out = outs / "out"

    listed = host.ctxmcp("list", "--config", host.config, "--server", "s", limits=one,
                         user=user)  # fmt: skip
    projected = host.ctxmcp(*host.project_args(out), limits=one, user=user)
    no_traceback(listed, projected)
    for run in (listed, projected):
        assert run.rc == 1, run
        assert run.err.startswith("ctxmcp: EAGAIN: cannot start server 's'"), run
        assert "no process could be made under 'ulimit -u' (1)" in run.err, run
    assert not out.exists()

    host.adopt("--user", user.name)
    assert host.uid == user.uid
    terminal = host.call({"n": 1}, one, native=False)
    native = host.call({"n": 2}, one)
    no_traceback(terminal, native)
    assert terminal.rc == 1 and terminal.err.startswith("s.t: EAGAIN: cannot start server"), (
        terminal
    )
    result = frames(native)[-1]
    assert native.rc == 1 and result["error"]["error"] == "EAGAIN", native
    assert "cannot start server 's'" in result["error"]["message"], result
    assert host.calls == []
    results = {p["tool_call"]["mode"]: p["tool_result"] for p in by_call(host.events()).values()}
    assert set(results) == {"terminal", "native"}, results
    assert (results["native"]["status"], results["native"]["errno"]) == ("error", "EAGAIN")
    # Terminal mode passes the tool's stderr through: the record keeps the exit status only.
    assert (results["terminal"]["status"], results["terminal"]["exit_status"]) == ("error", 1)
    assert_nothing_left(host)


# ============================================================= through the queue


def test_a_server_its_cpu_limit_kills_mid_call_fails_that_job_once_and_the_next_runs(
    host: Host,
) -> None:
    """W-1, W-4, Q-4, Q-5, I-3, T-7, S-2 with §10: the configuration starts the server under
    ``ulimit -S -t 1``; a job whose remote call spins is ended by the kernel's SIGXCPU in
    the middle of the call: the worker finishes it in ``failed/`` with an ``EIO`` reason
    saying the server ended before answering ``tools/call``, goes on to the next job (done),
    leaves nothing claimed or leased; ``ctx queue recover`` finds nothing to requeue, the
    spinning call reached the server once, each call is in the worker's session and the
    tool's log, and no bridge or server is left."""
    host.serve(shell="ulimit -S -t 1")
    host.adopt()
    queue = QueueCLI(host.storage, "proj")
    spin = queue.publish({"tool": "s.t", "input": {"how": "burn"}}, name="spin")
    after = queue.publish({"tool": "s.t", "input": {"n": 7}}, name="after")

    worked = host.ctx("queue", "work", "--project", "proj", "--agent", "coder", "--drain",
                      "--json", timeout=90)  # fmt: skip
    assert worked.rc == 0, worked
    summary = frames(worked)[-1]
    assert summary["event"] == "stop" and (summary["done"], summary["failed"]) == (1, 1), summary
    assert queue.state(spin) == "failed" and queue.state(after) == "done"
    failed = json.loads((queue.dir / "failed" / f"{spin}.result").read_text())
    assert failed["reason"].startswith("EIO") and "tools/call" in failed["reason"], failed
    done = json.loads((queue.dir / "done" / f"{after}.result").read_text())
    assert done["output"]["structuredContent"]["arguments"] == {"n": 7}, done
    for state in ("claimed", "lease", "pending", "inbox"):
        assert queue.entries(state) == set(), (state, queue.entries(state))

    recovered = queue.run("recover", "--json")
    assert recovered.rc == 0 and recovered.json()["requeued"] == [], recovered
    assert queue.state(spin) == "failed"
    assert [c["arguments"] for c in host.calls] == [{"how": "burn"}, {"n": 7}], host.calls
    recorded = {p["tool_result"]["call"]: p["tool_result"]["status"]
                for p in by_call(host.events("worker")).values()}  # fmt: skip
    assert recorded == {failed["call"]: "error", done["call"]: "ok"}, recorded
    assert sorted(e["call"] for e in host.log()) == sorted(recorded)
    assert_nothing_left(host)


def test_a_server_killed_by_its_file_size_limit_is_said_to_be_killed_by_sigxfsz(
    host: Host,
) -> None:
    """M-1 (docs/tools.md, "Exit statuses": a server that exited is named with its errno and
    the tail of its stderr), CONVENTIONS (a sentence a user can act on), docs/tools.md (a
    process that "dies by a signal (SIGSEGV, …; exit status 128 + N)" is reported as
    ``killed by SIGSEGV (exit status 139)``): a server started under ``ulimit -f 64`` that
    writes past it while answering ``tools/list``, with SIGXFSZ at its default (as most
    programs but Python's leave it), is killed by the kernel; ``ctxmcp list`` then names
    SIGXFSZ (or exit status 153), never a negative status.  The same sentence is what a
    job's reason says when a server dies so in a call (the CPU-limit test above:
    ``exited (status -24)``)."""
    spill = host.top / "spill"
    spill.mkdir(mode=0o1777)
    spill.chmod(0o1777)
    host.serve(shell="ulimit -f 64", spill_list=str(spill / "cache"))

    listed = host.ctxmcp("list", "--config", host.config, "--server", "s")

    no_traceback(listed)
    assert listed.rc == 1 and listed.err.startswith("ctxmcp: EIO: server 's' "), listed
    assert "tools/list" in listed.err, listed
    assert "status -" not in listed.err, listed.err
    assert "SIGXFSZ" in listed.err or "status 153" in listed.err, listed.err


def test_workers_a_few_descriptors_above_their_need_drain_many_calls_of_one_tool_once_each(
    host: Host,
) -> None:
    """W-1, W-3, I-4, Q-4, T-7, S-2 with M-4: three workers, each at ``RLIMIT_NOFILE`` 32
    (a few above what one needs to run a tool, so a descriptor kept per call would stop it
    within the drain), drain 24 jobs of one MCP-backed tool whose calls share one server
    configuration: every job is done once with its own input echoed back, the server saw
    each input exactly once, the workers' summaries add up to 24 with nothing failed or
    lost, nothing stays claimed, leased or pending, the worker session and the tool's log
    hold one ``ok`` result per job, and no bridge or server is left."""
    host.serve()
    host.adopt()
    queue = QueueCLI(host.storage, "proj")
    lines = "".join(json.dumps({"tool": "s.t", "input": {"n": n}}) + "\n" for n in range(24))
    published = queue.run("publish", "--batch", "-", input=lines, env=host.env)
    assert published.rc == 0, published
    jobs = published.lines()
    argv = [CTX, "queue", "work", "--project", "proj", "--agent", "coder", "--drain", "--json"]
    runs: list[Run] = []

    def work() -> None:
        runs.append(limited(argv, host.env, rlimits(nofile=32), timeout=90))

    workers = [threading.Thread(target=work) for _ in range(3)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)

    assert len(runs) == 3, runs
    no_traceback(*runs)
    summaries = [frames(run)[-1] for run in runs]
    assert all(run.rc == 0 for run in runs), runs
    assert sum(s["done"] for s in summaries) == 24, summaries
    assert all((s["failed"], s["lost"], s["failure"]) == (0, 0, None) for s in summaries)
    for job in jobs:
        assert queue.state(job) == "done", job
    echoed = sorted(
        json.loads((queue.dir / "done" / f"{job}.result").read_text())["output"][
            "structuredContent"
        ]["arguments"]["n"]
        for job in jobs
    )
    assert echoed == list(range(24)), echoed
    assert sorted(c["arguments"]["n"] for c in host.calls) == list(range(24)), host.calls
    assert len({c["call"] for c in host.calls}) == 24
    for state in ("claimed", "lease", "pending", "inbox"):
        assert queue.entries(state) == set(), (state, queue.entries(state))
    results = [p["tool_result"] for p in by_call(host.events("worker")).values()]
    assert len(results) == 24 and {r["status"] for r in results} == {"ok"}, results[:3]
    assert {c["call"] for c in host.calls} == {r["call"] for r in results}
    assert len(host.log()) == 24
    assert_nothing_left(host)
