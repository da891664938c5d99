"""Every command run the way a careful Python developer runs it: ``PYTHONDEVMODE=1``,
``PYTHONWARNINGS=error`` and ``PYTHONASYNCIODEBUG=1`` (R-5, §2.4, Q-1..Q-5, W-1, W-2, W-4,
S-1, S-5, T-3, T-6, T-8, T-8a, X-1, A-1, A-2, H-1, M-1, M-3, F-1).

A demanding user expects the same exit status and output with and without the developer
mode, and nothing on standard error that the product causes: no unclosed file, socket or
subprocess pipe (``ResourceWarning``), no deprecated API (``DeprecationWarning``), no
coroutine never awaited, no "subprocess still running".  The long-lived processes
(``ctxterm`` behind ``ctx agent start``, the view it mounts, ``ctx mount``) write their
standard error to ``/dev/null`` or to a log; a ``sitecustomize`` module on ``PYTHONPATH``
notes every warning, unraisable exception (a ``ResourceWarning`` raised in ``__del__``) and
thread exception of every interpreter that imports it, in a file the test reads after.  It
changes no behaviour of the product: it only writes down what the interpreter would print.

The core tools are zipapps run with ``-IS`` (the environment does not reach them), so they
are also run by hand as a developer debugging one would: ``python3 -X dev -W error -IS``.

Every flow runs with every warning an error.  The tests at the top hold the command line to
that for the one warning it once gave everywhere: click 8.5 deprecates the public name of the
stream wrapper it puts in place when a reader leaves, which ``ctx`` used to import.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    OnStorage,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    mounted_at,
    needs_fuse_as_root,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    tool_manifest,
    wait_for,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, Raw
from tests.support.storage import copy_of_root
from tests.support.users import run_as
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
CTXMCP = REPO / ".venv" / "bin" / "ctxmcp"
TIME_SERVER = REPO / ".venv" / "bin" / "mcp-server-time"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid: root")

STRICT = "error"
CORE_PYTHON = "/usr/bin/python3.11"

# Imported at start-up by every interpreter that gets PYTHONPATH=<its directory>: each
# warning shown, unraisable exception and thread exception becomes one JSON line of
# $DEVMODE_WARNLOG, with the process's argv.  The interpreter's own report still happens.
SITECUSTOMIZE = r"""
import json, os, sys, threading, warnings

_log = os.environ.get("DEVMODE_WARNLOG")
if _log:
    def _note(kind, text):
        line = json.dumps({"pid": os.getpid(), "argv": list(sys.argv), "kind": kind,
                           "text": text})
        with open(_log, "a") as out:
            out.write(line + "\n")

    _shown = warnings.showwarning

    def _show(message, category, filename, lineno, file=None, line=None):
        _note(category.__name__, f"{message} ({filename}:{lineno})")
        _shown(message, category, filename, lineno, file, line)

    warnings.showwarning = _show
    _unraisable = sys.unraisablehook

    def _on_unraisable(u):
        _note("unraisable", f"{u.exc_type.__name__}: {u.exc_value} in {u.object!r}")
        _unraisable(u)

    sys.unraisablehook = _on_unraisable
    _thread = threading.excepthook

    def _on_thread(a):
        _note("thread", f"{a.exc_type.__name__}: {a.exc_value}")
        _thread(a)

    threading.excepthook = _on_thread
"""


# ---------------------------------------------------------------------------------- helpers


@dataclass
class DevHost(OnStorage):
    """A bootstrapped storage root in a directory every uid may search, the directory of the
    ``sitecustomize`` above and the file it writes to."""

    top: Path
    storage: Path

    @property
    def hook(self) -> Path:
        return self.top / "hook"

    @property
    def notes(self) -> Path:
        return self.top / "warnings.jsonl"

    def dev_env(self, warnings: str = STRICT, **extra: str) -> dict[str, str]:
        """The environment of a developer's shell: dev mode, warnings as errors, asyncio
        debugging, and the note-taking ``sitecustomize``."""
        return clean_env(
            CTX_STORAGE=str(self.storage),
            PYTHONDEVMODE="1",
            PYTHONWARNINGS=warnings,
            PYTHONASYNCIODEBUG="1",
            PYTHONPATH=str(self.hook),
            DEVMODE_WARNLOG=str(self.notes),
            **extra,
        )

    def dev(self, *args, warnings: str = STRICT, **kw) -> Run:
        kw.setdefault("env", self.dev_env(warnings))
        return ctx_run(*args, **kw)

    def both(self, *args, **kw) -> tuple[Run, Run]:
        """``ctx ARGS`` in the developer's environment, then as usual, on the same state."""
        return self.dev(*args, **kw), self.ctx(*args, **kw)

    def noted(self) -> list[dict]:
        """What the interpreters of the product noted: every note but those of the
        third-party MCP server (the core tools run with ``-IS`` and note nothing)."""
        return [n for n in read_jsonl(self.notes) if n["argv"][:1] != [str(TIME_SERVER)]]

    def grant(self, label: str, tool: str) -> None:
        self.allow_tool(label, tool)


def same(dev: Run, plain: Run) -> None:
    """Both runs ended alike, and the developer's run said nothing more."""
    assert (dev.rc, dev.out) == (plain.rc, plain.out), (dev, plain)
    assert dev.err == plain.err, (dev, plain)


def quiet(run: Run, rc: int = 0) -> None:
    assert run.rc == rc and run.err == "", run
    assert "Warning" not in run.out, run


@pytest.fixture
def dev(_template: Path) -> Iterator[DevHost]:
    top = new_scratch_dir(SCRATCH, "dev-")
    try:
        storage = copy_of_root(_template, top / "storage")
        (top / "hook").mkdir(mode=0o755)
        (top / "hook" / "sitecustomize.py").write_text(SITECUSTOMIZE)
        (top / "hook" / "sitecustomize.py").chmod(0o644)
        yield DevHost(top, storage)
    finally:
        for proc in Path("/proc").iterdir():  # what a flow left running under its top
            if proc.name.isdigit() and int(proc.name) != os.getpid():
                try:
                    if str(top).encode() in (proc / "cmdline").read_bytes():
                        os.kill(int(proc.name), signal.SIGKILL)
                except (OSError, ProcessLookupError):
                    pass
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            where = line.split()[4]
            if where.startswith(str(top)):
                subprocess.run(["umount", "-l", where], check=False)
        shutil.rmtree(top, ignore_errors=True)


def coder(dev: DevHost, *tools: str, mount: list | None = None, name: str = "coder") -> dict:
    """Agent ``name`` (label ``<name>_t``) given ``tools`` in both policy layers."""
    req = {"name": name, "label": f"{name}_t", "tools": list(tools)}
    if mount is not None:
        req["mount"] = mount
    made = dev.dev("agent", "create", "-", "--json", input=json.dumps(req))
    quiet(made)
    for tool in tools:
        dev.grant(f"{name}_t", tool)
    return made.json()["identity"]


# ------------------------------------------------------ click's deprecated stream wrapper


def test_click_commands_in_dev_mode_say_nothing_more_on_stderr(dev: DevHost) -> None:
    """R-5, §2.4, T-8a: with ``PYTHONDEVMODE=1`` alone (the interpreter's default filters,
    which show a DeprecationWarning) ``ctx bootstrap`` of a new root prints only its report,
    and ``queue status`` prints on stderr what it prints without the developer mode."""
    env = clean_env(PYTHONDEVMODE="1")
    fresh = ctx_run("bootstrap", "--storage", dev.top / "fresh", env=env)
    assert fresh.rc == 0 and (dev.top / "fresh" / "tool" / "fs.read").is_file(), fresh
    assert fresh.err == "", fresh
    env["CTX_STORAGE"] = str(dev.storage)
    same(
        ctx_run("queue", "status", "--project", "proj", env=env),
        dev.ctx("queue", "status", "--project", "proj"),
    )


def test_queue_recover_with_warnings_as_errors_acts_as_without(dev: DevHost) -> None:
    """Q-5, §2.4: ``ctx queue recover --json`` on a consistent queue answers alike."""
    strict, plain = (
        dev.dev("queue", "recover", "--project", "proj", "--json", warnings=STRICT),
        (dev.ctx("queue", "recover", "--project", "proj", "--json")),
    )
    assert plain.rc == 0 and plain.json()["consistent"] is True, plain
    same(strict, plain)


@pytest.mark.skipif(not TIME_SERVER.exists(), reason="mcp-server-time is not installed")
def test_ctxmcp_with_warnings_as_errors_lists_as_without(dev: DevHost) -> None:
    """M-1, M-3: ``ctxmcp list`` of the time server lists its two tools either way."""
    config = dev.top / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"time": {"command": str(TIME_SERVER)}}}))
    argv = [str(CTXMCP), "list", "--config", str(config), "--server", "time"]
    plain = subprocess.run(argv, capture_output=True, text=True, env=dev.env, timeout=60)
    strict = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                            env=dev.dev_env(STRICT))  # fmt: skip
    assert plain.returncode == 0 and "time.get_current_time" in plain.stdout, plain
    assert (strict.returncode, strict.stdout, strict.stderr) == (0, plain.stdout, ""), strict


# ----------------------------------------------------------------- ctx run: no click at all


@needs_root
def test_run_terminal_and_native_with_warnings_as_errors(dev: DevHost) -> None:
    """T-3, T-6, W-4, P-6: ``ctx run`` (parsed without click) under ``PYTHONWARNINGS=error``
    for everything: a tool that answers, one that fails, one that outlives its ``--timeout``,
    a pre-hook that vetoes and a post-hook that sees the result end with the exit statuses
    and outputs of a plain run, and nothing of the interpreter's on stderr."""
    manifests = dev.top / "manifests"
    tool_manifest(manifests, "answer", "#!/bin/sh\ncat >/dev/null\necho '{\"n\": 42}'\n")
    tool_manifest(manifests, "boom", "#!/bin/sh\necho boom >&2\nexit 5\n")
    tool_manifest(manifests, "stall", "#!/bin/sh\ncat >/dev/null\nexec sleep 60\n")
    for name in ("answer", "boom", "stall"):
        quiet(dev.dev("object", "install", manifests / f"{name}.json", "--tier", "system"))
    coder(dev, "answer", "boom", "stall")
    hooks = dev.storage / "tool" / "answer.d" / "hooks"
    seen = dev.top / "post-seen"
    seen.mkdir(mode=0o777)
    seen.chmod(0o777)
    post = hooks / "post.d" / "10-see"
    post.write_text(f"#!/bin/sh\ncat > {seen}/$$\n")
    post.chmod(0o755)

    def strict(*args: str, stdin: str = "") -> Run:
        return dev.dev("run", "--agent", "coder", *args, input=stdin, warnings=STRICT)

    ok = strict("answer", "{}")
    assert (ok.rc, ok.out, ok.err) == (0, '{"n": 42}\n', ""), ok
    native = strict("--native", "answer", stdin="{}")
    frames = [json.loads(line) for line in native.lines()]
    assert native.rc == 0 and native.err == "", native
    assert frames[-1]["type"] == "result" and frames[-1]["status"] == "ok", frames
    assert wait_for(lambda: len(os.listdir(seen)) == 2, 10), os.listdir(seen)  # T-6: post.d

    failed = strict("boom", "{}")
    assert (failed.rc, failed.out, failed.err) == (5, "", "boom\n"), failed
    failed_native = strict("--native", "boom", stdin="{}")
    last = json.loads(failed_native.lines()[-1])
    assert failed_native.rc == 1 and failed_native.err == "", failed_native
    assert (last["status"], last["exit_status"]) == ("error", 5), last

    late = strict("--timeout", "1", "stall", "{}")
    plain_late = dev.ctx("run", "--agent", "coder", "--timeout", "1", "stall", "{}")
    same(late, plain_late)
    assert late.rc == 137 and "ETIMEDOUT" in late.err, late
    late_native = strict("--native", "--timeout", "1", "stall", stdin="{}")
    last = json.loads(late_native.lines()[-1])
    assert late_native.rc == 1 and late_native.err == "", late_native
    assert last["error"]["error"] == "ETIMEDOUT", last

    veto = hooks / "pre.d" / "20-veto"
    veto.write_text("#!/bin/sh\ncat >/dev/null\necho not today >&2\nexit 1\n")
    veto.chmod(0o755)
    vetoed, plain_vetoed = strict("answer", "{}"), dev.ctx("run", "--agent", "coder", "answer",
                                                           "{}")  # fmt: skip
    same(vetoed, plain_vetoed)
    assert vetoed.rc == 126 and "20-veto" in vetoed.err and "Warning" not in vetoed.err, vetoed
    assert dev.noted() == []


# ----------------------------------------------------------------- the queue and its worker


def test_queue_verbs_in_dev_mode_answer_as_without(dev: DevHost) -> None:
    """Q-1..Q-6, Q-8, §2.4: publish (a file, stdin, a batch), claim, renew, finish, status,
    list, show and recover (plain, --reconcile --dry-run, --json) in the developer's
    environment print nothing on stderr, and the read-only verbs print what a plain run
    prints on the same queue."""
    queue = QueueCLI(dev.storage, "proj")
    req = dev.top / "req.json"
    req.write_text(json.dumps({"tool": "fs.read", "input": {"path": "README.md"}}))
    published = dev.dev("queue", "publish", "--project", "proj", "--name", "first", req)
    quiet(published)
    assert published.out == "first.req.json\n", published
    batch = "\n".join(json.dumps({"tool": "fs.stat", "input": {"n": n}}) for n in range(3))
    quiet(dev.dev("queue", "publish", "--project", "proj", "--batch", "-", input=batch + "\n"))
    twice = dev.dev("queue", "publish", "--project", "proj", "--name", "first", req)
    assert twice.rc == 1 and "EEXIST" in twice.err and "Warning" not in twice.err, twice
    (queue.dir / "pending" / ".hidden").write_text("{}")  # not a job
    (queue.dir / "claimed" / "orphan.req.json").mkdir()  # an incomplete pair

    claimed = dev.dev("queue", "claim", "--project", "proj", "--ttl", "600")
    quiet(claimed)
    job = claimed.out.strip()
    quiet(dev.dev("queue", "renew", "--project", "proj", job, "--ttl", "900"))
    for args in (
        ("status",),
        ("status", "--json"),
        ("list",),
        ("list", "--json"),
        ("list", "--state", "pending"),
        ("show", job),
        ("show", job, "--json"),
        ("show", "nothing-here"),
        ("recover",),
        ("recover", "--reconcile", "--dry-run", "--json"),
    ):
        same(*dev.both("queue", args[0], "--project", "proj", *args[1:]))
    empty = dev.both("queue", "claim", "--project", "nowhere")
    same(*empty)

    quiet(dev.dev("queue", "finish", "--project", "proj", job, "--ok", "-", input='{"a": 1}'))
    assert queue.state(job) == "done"
    mended = dev.dev("queue", "recover", "--project", "proj", "--reconcile", "--json")
    assert mended.rc == 0 and mended.err == "" and mended.json()["consistent"] is True, mended
    assert not (queue.dir / "claimed" / "orphan.req.json").exists()
    assert dev.noted() == []


@needs_root
def test_worker_drains_then_is_stopped_mid_job_in_dev_mode(dev: DevHost) -> None:
    """W-1, W-2, W-4: ``ctx queue work --drain`` in the developer's environment finishes a
    good job done, a failing one and one past its ``--timeout`` failed, and exits 0 with
    nothing on stderr; a waiting worker given SIGTERM while its job runs lets the job
    finish, then exits 0, still silent; no interpreter noted anything."""
    coder(dev, "shell.exec")
    queue = QueueCLI(dev.storage, "proj")
    good = queue.publish({"tool": "shell.exec", "input": {"cmd": "echo fine"}}, name="good")
    bad = queue.publish({"tool": "shell.exec", "input": {"cmd": "exit 4"}}, name="bad")
    slow = queue.publish({"tool": "shell.exec", "input": {"cmd": "sleep 30"}}, name="slow")
    drained = dev.dev("queue", "work", "--project", "proj", "--agent", "coder", "--drain",
                      "--timeout", "1", "--json", timeout=60)  # fmt: skip
    assert drained.rc == 0 and drained.err == "", drained
    events = [json.loads(line) for line in drained.lines()]
    assert events[-1]["event"] == "stop", events
    assert (events[-1]["done"], events[-1]["failed"]) == (1, 2), events[-1]
    assert queue.only_result(good)[0] == "done"
    assert queue.only_result(bad)[0] == "failed"
    state, result = queue.only_result(slow)
    assert state == "failed" and "ETIMEDOUT" in json.dumps(result), result

    gate = dev.top / "gate"
    held = queue.publish(
        {"tool": "shell.exec", "input": {"cmd": f"until [ -e {gate} ]; do sleep 0.05; done"}},
        name="held",
    )
    out, err = dev.top / "worker.out", dev.top / "worker.err"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        worker = subprocess.Popen(
            [*CTX_ARGV, "queue", "work", "--project", "proj", "--agent", "coder", "--json"],
            stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=dev.dev_env(),
        )  # fmt: skip
    try:
        assert wait_for(lambda: b'"event": "claim"' in out.read_bytes(), 20), out.read_text()
        worker.send_signal(signal.SIGTERM)
        time.sleep(0.2)  # the signal is taken while the job runs; the job still ends
        gate.touch()
        assert worker.wait(timeout=30) == 0, err.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert err.read_text() == "", err.read_text()
    stop = json.loads(out.read_text().splitlines()[-1])
    assert stop["event"] == "stop" and stop["stopped_by"] == "SIGTERM", stop
    assert queue.only_result(held)[0] == "done"
    queue.assert_settled()
    assert dev.noted() == []


@needs_root
def test_sessions_shown_and_followed_until_interrupted_in_dev_mode(dev: DevHost) -> None:
    """S-1, S-5: ``session list``, ``show`` and ``tail --json`` of a session that recorded
    calls answer as a plain run does; ``tail --follow`` stopped with Ctrl-C ends with the
    status and the silence of a plain run."""
    identity = coder(dev, "shell.exec")
    for n in range(3):
        called = dev.dev("run", "--agent", "coder", "shell.exec", json.dumps({"cmd": f"echo {n}"}))
        assert (called.rc, called.out, called.err) == (0, f"{n}\n", ""), called
    session = dev.storage / "home" / str(identity["uid"]) / "agent" / "coder" / "session"
    assert len(read_jsonl(session / "default" / "events.jsonl")) >= 6
    for args in (("list", "coder"), ("show", "coder"), ("tail", "coder", "--json", "-n", "2")):
        same(*dev.both("session", *args))

    def follow(env: dict[str, str], tag: str) -> tuple[int, bytes, bytes]:
        out, err = dev.top / f"follow-{tag}.out", dev.top / f"follow-{tag}.err"
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            proc = subprocess.Popen(
                [*CTX_ARGV, "session", "tail", "coder", "--follow", "-n", "1"],
                stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=env,
            )  # fmt: skip
        try:
            assert wait_for(lambda: out.read_bytes().count(b"\n") >= 1, 10), err.read_text()
            dev.dev("run", "--agent", "coder", "shell.exec", f'{{"cmd": "echo later-{tag}"}}')
            assert wait_for(lambda: f"later-{tag}".encode() in out.read_bytes(), 10)
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return proc.returncode, out.read_bytes(), err.read_bytes()

    dev_rc, dev_out, dev_err = follow(dev.dev_env(), "dev")
    plain_rc, _, plain_err = follow(dev.env, "plain")
    assert (dev_rc, dev_err) == (plain_rc, plain_err), (dev_rc, dev_err, plain_rc, plain_err)
    assert b"later-dev" in dev_out and dev_err == b"", (dev_out, dev_err)
    assert dev.noted() == []


# ------------------------------------------------------------ objects, spaces, policy, manual


def test_objects_spaces_and_policy_in_dev_mode_answer_as_without(dev: DevHost) -> None:
    """T-8, T-8a, X-1, P-8, D-1, R-5: ``object check``/``install``/``which``/``list``,
    ``shared create``, ``policy check``/``query``, ``man`` and a second ``bootstrap`` in the
    developer's environment: nothing on stderr but the product's own refusals, and what a
    plain run prints."""
    manifest = tool_manifest(dev.top / "m", "hello", "#!/bin/sh\necho hello\n")
    broken = dev.top / "m" / "broken.json"
    broken.write_text('{"manifest": 2, "kind": "tool"}')
    same(*dev.both("object", "check", manifest, broken))
    quiet(dev.dev("object", "install", manifest, "--tier", "system"))
    for args in (("object", "which", "hello"), ("object", "which", "absent"), ("object", "list")):
        same(*dev.both(*args))
    made = dev.dev("shared", "create", "lab")
    quiet(made)
    assert (dev.storage / "shared" / "lab" / "queue" / "pending").is_dir()
    same(*dev.both("shared", "create", "lab"))
    policy = dev.top / "policy"
    policy.write_text("allow coder_t tool:hello execute\nallow coder_t agent:* create\n")
    same(*dev.both("policy", "check", policy))
    same(*dev.both("policy", "query", "--policy", policy, "coder_t", "tool:hello", "execute"))
    same(*dev.both("man", "agent"))
    same(*dev.both("bootstrap"))
    assert dev.noted() == []


def test_a_user_of_their_own_root_in_dev_mode(dev: DevHost, unprivileged_user) -> None:
    """R-1, R-5, Q-1..Q-4: a non-root user bootstraps a root of their own and runs a job
    through its queue by hand in the developer's environment: every step silent."""
    home = dev.top / "user"
    home.mkdir(mode=0o755)
    os.chown(home, unprivileged_user.uid, unprivileged_user.gid)
    env = dev.dev_env()
    env.update(CTX_STORAGE=str(home / "storage"), HOME=str(home))

    def as_user(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return run_as(unprivileged_user, [*CTX_ARGV, *args], env=env, cwd=home, stdin=stdin)

    steps = [
        ("bootstrap",),
        ("queue", "init", "--project", "mine"),
        ("queue", "publish", "--project", "mine", "--name", "j", "-"),
        ("queue", "claim", "--project", "mine", "--pid", str(os.getpid())),
        ("queue", "finish", "--project", "mine", "j.req.json", "--ok", "-"),
        ("queue", "recover", "--project", "mine", "--reconcile"),
    ]
    for args in steps:
        done = as_user(*args, stdin='{"tool": "fs.read", "input": {}}')
        assert done.returncode == 0 and done.stderr == "", (args, done)
    assert (home / "storage" / "shared" / "mine" / "queue" / "done" / "j.req.json").is_file()
    assert dev.noted() == []


# --------------------------------------------------------------------- the core tools by hand


@needs_root
def test_core_tools_under_python_dev_mode_answer_as_without(dev: DevHost) -> None:
    """R-5, T-2: each core tool's zipapp run by hand with ``-X dev -W error`` gives the
    output and exit status of a plain run, for a good and a bad input."""
    if not Path(CORE_PYTHON).exists():
        pytest.skip(f"{CORE_PYTHON} is not installed")
    data = dev.top / "data"
    data.mkdir()
    (data / "note.txt").write_text("a note\n")
    tools = dev.storage / "tool"
    cases = [
        ("fs.read", {"path": str(data / "note.txt")}),
        ("fs.read", {"path": str(data / "missing")}),
        ("fs.list", {"path": str(data)}),
        ("fs.stat", {"path": str(data / "note.txt")}),
        ("fs.write", {"path": str(data / "new.txt"), "content": "x"}),
        ("fs.write", {"path": str(data / "new.txt"), "content": "x"}),
        ("shell.exec", {"cmd": "echo out; echo err >&2; exit 3"}),
        ("shell.exec", {"nope": 1}),
        ("tsh.config", {}),
        ("agent.update", {}),
    ]
    for tool, payload in cases:
        ran = {}
        for name, flags in (("dev", ["-X", "dev", "-W", "error"]), ("plain", [])):
            if tool == "fs.write":
                (data / "new.txt").unlink(missing_ok=True)
            done = subprocess.run([CORE_PYTHON, *flags, "-IS", str(tools / tool)],
                                  input=json.dumps(payload), capture_output=True, text=True,
                                  env=dev.env, timeout=60)  # fmt: skip
            ran[name] = (done.returncode, done.stdout, done.stderr.replace(str(data), "D"))
        assert ran["dev"] == ran["plain"], (tool, payload, ran)
        assert "Warning" not in ran["dev"][2], (tool, ran["dev"])


# --------------------------------------------------------------------- an agent's terminal


@needs_root
def test_agent_terminal_started_used_and_stopped_in_dev_mode(dev: DevHost) -> None:
    """A-1, A-2, H-1, T-3: ``ctx agent start`` in the developer's environment leaves
    ``ctxterm`` (and the view it mounts) running with that environment; a client attaches,
    tsh runs a tool and refuses a host command, ``ctx agent watch`` is interrupted, and
    ``ctx agent stop`` ends it all; every command silent, and no interpreter of the product
    noted a warning, an unraisable exception or a thread's exception."""
    identity = coder(dev, "shell.exec")
    ws = dev.top / "ws"
    ws.mkdir(mode=0o755)
    os.chown(ws, identity["uid"], identity["gid"])
    started = dev.dev("agent", "start", "coder", "--session", "dm", "--json", cwd=ws)
    quiet(started)
    listening = Path(started.json()["listening_at"])
    try:
        client = Raw(listening, b"attach\n")
        try:
            assert client.shows(AGENT_PROMPT), client.text()
            answered = client.answer('shell.exec \'{"cmd": "echo typed-$((6*7))"}\'')
            assert "typed-42" in answered, answered
            refused = client.answer("ls /")
            assert "not a tool" in refused, refused
        finally:
            client.close()
        watcher = subprocess.Popen(
            [*CTX_ARGV, "agent", "watch", "coder", "--session", "dm"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=dev.dev_env(),
        )  # fmt: skip
        try:
            assert wait_for(lambda: _connected(watcher.pid), 10)
            watcher.send_signal(signal.SIGINT)
            _, watched_err = watcher.communicate(timeout=20)
        finally:
            if watcher.poll() is None:
                watcher.kill()
                watcher.wait()
        assert watched_err == b"", watched_err
    finally:
        stopped = dev.dev("agent", "stop", "coder", "--session", "dm", "--json")
    quiet(stopped)
    assert wait_for(lambda: not listening.exists(), 10)
    log = read_jsonl(dev.storage / "agent" / "coder.d" / "log")
    ends = [e for e in log if e.get("session") == "dm" and e["type"] == "terminal.stopped"]
    assert [e["status"] for e in ends] == ["ok"], log
    time.sleep(0.3)  # the daemon's teardown writes its notes as it exits
    assert dev.noted() == [], dev.noted()


def _connected(pid: int) -> bool:
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
                   for fd in os.listdir(f"/proc/{pid}/fd"))  # fmt: skip
    except OSError:
        return False


# ---------------------------------------------------------------------------------- ctxmcp


@needs_root
@pytest.mark.skipif(not TIME_SERVER.exists(), reason="mcp-server-time is not installed")
def test_ctxmcp_and_a_projected_tool_in_dev_mode(dev: DevHost) -> None:
    """M-1, M-3, M-4, T-8, T-3: ``ctxmcp list``/``project`` of the time server and of
    servers that fail (one exits at once, one never answers), the candidate
    installed and called in both modes: the product's exit statuses and words are a plain
    run's, nothing of the interpreter's is added, no server is left running."""
    mcp = dev.top / "mcp"
    mcp.mkdir(mode=0o755)
    config = mcp / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {
        "time": {"command": str(TIME_SERVER)},
        "gone": {"command": "/bin/false"},
        "mute": {"command": "/bin/sh", "args": ["-c", "exec sleep 30"]},
    }}))  # fmt: skip
    config.chmod(0o644)

    def ctxmcp(*args: str | Path, env: dict[str, str]) -> subprocess.CompletedProcess:
        argv = [str(CTXMCP), *map(str, args)]
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)

    listed = ctxmcp("list", "--config", config, "--server", "time", env=dev.dev_env())
    assert listed.returncode == 0 and listed.stderr == "", listed
    assert {line.split("\t")[0] for line in listed.stdout.splitlines()} == {
        "time.get_current_time",
        "time.convert_time",
    }, listed
    got, plain = (ctxmcp("list", "--config", config, "--server", "gone", env=env)
                  for env in (dev.dev_env(), dev.env))  # fmt: skip
    assert (got.returncode, got.stdout, got.stderr) == (
        plain.returncode, plain.stdout, plain.stderr), (got, plain)  # fmt: skip
    assert got.returncode == 1 and "Warning" not in got.stderr, got
    mute = ctxmcp("list", "--config", config, "--server", "mute", "--timeout", "1",
                  env=dev.dev_env())  # fmt: skip
    assert mute.returncode == 1 and mute.stdout == "", mute
    assert mute.stderr.startswith("ctxmcp: ETIMEDOUT") and mute.stderr.count("\n") == 1, mute
    out = dev.top / "candidates"
    got = ctxmcp("project", "--config", config, "--runtime-config", config, "--server", "time",
                 "--out", out, env=dev.dev_env())  # fmt: skip
    assert got.returncode == 0 and got.stderr == "", got
    quiet(dev.dev("object", "install", out / "time.get_current_time.manifest.json", "--tier",
                  "system"))  # fmt: skip
    coder(dev, "time.get_current_time", mount=[[str(mcp), str(mcp), "ro"]])
    ran = dev.dev("run", "--agent", "coder", "time.get_current_time", '{"timezone": "UTC"}')
    assert ran.rc == 0 and json.loads(ran.out)["timezone"] == "UTC" and ran.err == "", ran
    wrong = dev.dev("run", "--agent", "coder", "--native", "time.get_current_time",
                    input='{"timezone": "Nowhere/Zone"}')  # fmt: skip
    assert wrong.rc == 1 and wrong.err == "", wrong
    assert json.loads(wrong.lines()[-1])["status"] == "error", wrong
    assert wait_for(lambda: not _running_from(mcp), 10), "an MCP server was left running"
    assert dev.noted() == [], dev.noted()


def _running_from(directory: Path) -> bool:
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if b"sleep\x0030" in (proc / "cmdline").read_bytes() and str(directory).encode() \
                        in (proc / "environ").read_bytes():  # fmt: skip
                    return True
            except OSError:
                pass
    return False


# -------------------------------------------------------------------------------- the mount


@needs_fuse_as_root
def test_mount_used_and_ended_in_dev_mode(dev: DevHost) -> None:
    """F-1, R-2: ``ctx mount`` in the developer's environment serves reads, writes and
    listings, and ends silently both by ``ctx umount`` and by SIGTERM (the agent view);
    nothing of the interpreter's appears on its stderr or in the notes."""
    coder(dev, "fs.read")
    for args, end in (((), "umount"), (("--as", "coder"), "SIGTERM")):
        where = dev.top / f"mnt-{end}"
        where.mkdir()
        log = dev.top / f"mnt-{end}.err"
        with open(log, "wb") as err:
            proc = subprocess.Popen(
                [*CTX_ARGV, "mount", *args, str(where)], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=err, env=dev.dev_env(),
                start_new_session=True,
            )  # fmt: skip
        try:
            assert wait_for(lambda w=where: mounted_at(w), 15), log.read_text()
            assert {"tool", "shared", "agent"} <= set(os.listdir(where))
            assert (where / "tool" / "fs.read.d" / "description").read_text()
            if end == "umount":
                data = where / "shared" / "proj" / "data"
                data.mkdir(exist_ok=True)
                (data / "f.txt").write_text("through the mount\n")
                assert (data / "f.txt").read_text() == "through the mount\n"
                quiet(dev.dev("umount", where))
            else:
                proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=15) == 0, log.read_text()
        finally:
            if mounted_at(where):
                subprocess.run(["umount", "-l", str(where)], check=False)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert log.read_text() == "", log.read_text()
        assert not mounted_at(where)
    stored = dev.storage / "shared" / "proj" / "data" / "f.txt"
    assert stored.read_text() == "through the mount\n"
    assert dev.noted() == []
