"""End-to-end flows of a team that guards and audits its tools with hooks (SPEC §6 T-6, T-7,
§3 W-1/W-4, §4 S-2, §7 H-3, docs/tools.md "Hooks (T-6)"): the same ``hooks/pre.d`` and
``hooks/post.d`` met by every way a tool is called — ``ctx run --agent`` in terminal and
native mode, a queue job run by ``ctx queue work``, the ``tsh`` tool, and ``ctx tool`` (where
hooks do not run) — with vetoes, timeouts, links, foreign owners and loud hooks."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, QueueCLI, Run, alive, clean_env, ctx_run, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as another uid")

AGENT, LABEL = "ci", "ci_t"

# A hook that leaves one JSON line in trace.jsonl of its working directory (the agent's
# /workspace): its name, identity, working directory, environment and what it read on stdin.
TRACER = """\
#!/usr/bin/python3 -I
import json, os, sys
entry = {
    "name": os.path.basename(sys.argv[0]),
    "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(),
    "groups": sorted(os.getgroups()), "cwd": os.getcwd(),
    "env": dict(os.environ), "stdin": json.load(sys.stdin),
}
with open("trace.jsonl", "a") as trace:
    trace.write(json.dumps(entry) + "\\n")
"""

# A guard: refuses any call whose input or argv mentions "forbidden", saying why on its last
# line of stderr.
GUARD = """\
#!/bin/sh
if grep -q forbidden; then
  echo "checking the request" >&2
  echo "forbidden word in the request" >&2
  exit 3
fi
"""

GUARD_VETO = "hooks/pre.d/20-guard vetoed the call (exit 3): forbidden word in the request"


def nobody() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody: root's default agent user (docs/tools.md)")


@dataclass
class Team:
    """A storage root every uid may search, agent ``ci`` (uid nobody) allowed ``shell.exec``
    and ``tsh`` in both layers of P-6, with ``ws`` mounted read-write at its /workspace, and the
    queue of project ``proj``."""

    top: Path

    @property
    def storage(self) -> Path:
        return self.top / "storage"

    @property
    def ws(self) -> Path:
        return self.top / "ws"

    @property
    def queue(self) -> QueueCLI:
        return QueueCLI(self.storage, "proj")

    def env(self, **extra: str) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage), **extra)

    def ctx(self, *args, **kw) -> Run:
        kw.setdefault("env", self.env())
        return ctx_run(*args, **kw)

    def hooks(self, tool: str, phase: str) -> Path:
        return self.storage / "tool" / f"{tool}.d" / "hooks" / f"{phase}.d"

    def hook(self, tool: str, phase: str, name: str, body: str, mode: int = 0o755) -> Path:
        path = self.hooks(tool, phase) / name
        path.write_text(body)
        path.chmod(mode)
        return path

    def run(self, tool: str, *argv: str, options: tuple = (), session: str = "s1") -> Run:
        return self.ctx("run", "--agent", AGENT, "--session", session, *options, tool, *argv)

    def native(
        self, tool: str, value, options: tuple = (), session: str = "s1"
    ) -> tuple[Run, dict]:
        r = self.ctx("run", "--native", "--agent", AGENT, "--session", session, *options, tool,
                     input=json.dumps(value))  # fmt: skip
        frames = [json.loads(line) for line in r.lines()]
        assert frames and frames[-1]["type"] == "result", r
        return r, frames[-1]

    def work(self, *args: str, timeout: float = 60) -> tuple[Run, list[dict]]:
        r = self.ctx("queue", "work", "--project", "proj", "--agent", AGENT, "--json", *args,
                     timeout=timeout)  # fmt: skip
        return r, [json.loads(line) for line in r.lines()]

    def trace(self) -> list[dict]:
        path = self.ws / "trace.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def names(self) -> list[str]:
        return [entry["name"] for entry in self.trace()]

    def events(self, session: str) -> list[dict]:
        uid = nobody().pw_uid
        path = self.storage / "home" / str(uid) / "agent" / AGENT / "session" / session
        return [json.loads(line) for line in (path / "events.jsonl").read_text().splitlines()]

    def results(self, session: str) -> dict[str, dict]:
        """The session's ``tool_result`` events by call id."""
        return {e["call"]: e for e in self.events(session) if e["type"] == "tool_result"}

    def log(self, tool: str) -> dict[str, dict]:
        """The tool's log lines by call id (T-7)."""
        text = (self.storage / "tool" / f"{tool}.d" / "log").read_text()
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        return {line["call"]: line for line in lines if line.get("call")}


@pytest.fixture
def team(searchable_storage: Path) -> Team:
    """The bootstrapped root of conftest (project ``proj`` initialised) in a directory every
    uid may search, with the agent and its workspace beside it."""
    nobody()
    team = Team(searchable_storage.parent)
    team.ws.mkdir()
    team.ws.chmod(0o777)
    request = {
        "name": AGENT,
        "label": LABEL,
        "tools": ["shell.exec", "tsh"],
        "mount": [[str(team.ws), "/workspace", "rw"]],
    }
    r = team.ctx("agent", "create", "-", input=json.dumps(request))
    assert r.rc == 0, r
    for tool in ("shell.exec", "tsh"):
        with open(team.storage / "tool" / f"{tool}.d" / "policy", "a") as policy:
            policy.write(f"allow {LABEL} tool:{tool} execute\n")
    return team


def shell_job(cmd: str) -> dict:
    return {"tool": "shell.exec", "input": {"cmd": cmd}, "from": "tester",
            "created": "2026-06-22T12:00:00Z"}  # fmt: skip


def result_file(team: Team, job: str) -> tuple[str | None, dict]:
    state = team.queue.state(job)
    assert state in ("done", "failed"), (job, state)
    return state, json.loads((team.queue.dir / state / f"{job}.result").read_text())


def without_shell_noise(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in ("PWD", "OLDPWD", "SHLVL", "_")}


# ==================================================================== order, stdin, identity


def test_hooks_run_in_byte_order_as_the_agent_and_read_the_call_in_both_modes(team):
    """T-6 and docs/tools.md "Hooks": every executable of ``pre.d`` runs before the tool in the
    byte order of its name (dot-names included), files without execute bits, subdirectories
    and dot-named links are no hooks; each hook runs as the tool does — the agent's uid, gid
    and groups (not root), the tool's working directory and environment plus ``CTX_HOOK`` —
    and reads the call on stdin; post-hooks read the same call with the result the caller got."""
    agent = nobody()
    pre_names = ["a-lower", "9-a", "_under", "A-upper", ".05-dot", "10-b"]
    for name in pre_names:
        team.hook("shell.exec", "pre", name, TRACER)
    for name in ("20-audit", "10-audit"):
        team.hook("shell.exec", "post", name, TRACER)
    outside = team.ws / "outside-hook"
    outside.write_text(TRACER)
    outside.chmod(0o755)
    pre = team.hooks("shell.exec", "pre")
    team.hook("shell.exec", "pre", "15-README", "#!/bin/sh\nexit 1\n", mode=0o644)
    (pre / "16-subdir").mkdir()
    (pre / ".#10-b").symlink_to(outside)  # an editor's lock link: skipped, never followed

    expected = [".05-dot", "10-b", "9-a", "A-upper", "_under", "a-lower", "tool"]
    expected += ["10-audit", "20-audit"]
    tool_cmd = "printf '%s\\n' '{\"name\": \"tool\"}' >> trace.jsonl; env; id -u; id -g; id -G; pwd"
    term = team.run("shell.exec", tool_cmd, options=("--timeout", "30"))
    assert term.rc == 0, term
    assert team.names() == expected
    *env_lines, uid, gid, groups, cwd = term.out.splitlines()
    tool_env = without_shell_noise(dict(line.split("=", 1) for line in env_lines if "=" in line))
    assert int(uid) == agent.pw_uid != 0 and int(gid) == agent.pw_gid, term
    hooks_seen = [e for e in team.trace() if e["name"] != "tool"]
    call = tool_env["CTX_CALL"]
    for entry in hooks_seen:
        phase = "post" if entry["name"].endswith("audit") else "pre"
        assert (entry["uid"], entry["euid"], entry["gid"]) == (int(uid), int(uid), int(gid))
        assert entry["groups"] == sorted(map(int, groups.split())), entry
        assert entry["cwd"] == cwd == os.path.realpath(team.ws), entry
        assert entry["env"]["CTX_HOOK"] == phase, entry
        hook_env = without_shell_noise({k: v for k, v in entry["env"].items() if k != "CTX_HOOK"})
        assert hook_env == tool_env, entry["name"]
        assert tool_env["CTX_MODE"] == "terminal" and tool_env["CTX_CWD"] == "/workspace"
        seen = entry["stdin"]
        assert seen["hook"] == phase and seen["tool"] == "shell.exec", seen
        assert (seen["agent"], seen["call"], seen["mode"]) == (AGENT, call, "terminal"), seen
        assert seen["session"] == f"home/{agent.pw_uid}/agent/{AGENT}/session/s1", seen
        assert seen["argv"] == [tool_cmd], seen
        if phase == "post":
            assert seen["result"]["exit_status"] == 0 and seen["result"]["call"] == call, seen
            assert seen["result"]["status"] == "ok", seen
        else:
            assert "result" not in seen, seen

    (team.ws / "trace.jsonl").unlink()
    r, result = team.native("shell.exec", {"cmd": "echo native-output"})
    assert r.rc == 0 and result["output"] == "native-output\n", r
    assert result["post_hooks"] == [], result
    assert team.names() == [n for n in expected if n != "tool"]
    for entry in team.trace():
        seen = entry["stdin"]
        assert (seen["call"], seen["mode"], seen["input"]) == (
            result["call"], "native", {"cmd": "echo native-output"}), seen  # fmt: skip
        assert entry["env"]["CTX_MODE"] == "native" and entry["env"]["CTX_CALL"] == result["call"]
        assert "TERM" not in entry["env"], entry["env"]  # terminal mode only
        if entry["env"]["CTX_HOOK"] == "post":
            got = seen["result"]
            assert (got["status"], got["output"], got["exit_status"], got["error"]) == (
                "ok", "native-output\n", 0, None), got  # fmt: skip
    # Both calls are a tool_call/tool_result pair of the session (T-7), hooks and all.
    results = team.results("s1")
    assert results[call]["status"] == results[result["call"]]["status"] == "ok", results


# ==================================================================== one guard, every caller


def test_a_guard_vetoes_every_caller_alike_and_the_veto_is_recorded_everywhere(team):
    """T-6, T-7, W-1, S-2, H-3: one guard in ``pre.d`` refuses forbidden calls whether they come
    from ``ctx run`` (exit 126, the hook named and its last stderr line quoted), ``--native``
    (``EACCES`` at stage ``hook``) or a queue job (failed, its result saying why) — the tool and
    the hooks after the guard never run, and each veto is a ``tool_result`` of the caller's
    session and a line of the tool's log.  The ``tsh`` tool is guarded by its own hooks, and
    ``ctx tool tsh.config`` runs no hook at all (it is the caller's own call)."""
    team.hook("shell.exec", "pre", "10-trace", TRACER)
    team.hook("shell.exec", "pre", "20-guard", GUARD)
    team.hook("shell.exec", "pre", "30-after", TRACER)
    forbidden = "touch forbidden-was-run"

    term = team.run("shell.exec", forbidden)
    assert term.rc == 126 and term.out == "", term
    assert f"EACCES: {GUARD_VETO}" in term.err, term
    r, native = team.native("shell.exec", {"cmd": forbidden})
    assert r.rc == 1, r
    assert (native["status"], native["output"], native["exit_status"]) == ("error", None, None)
    error = native["error"]
    assert (error["error"], error["errno"], error["stage"]) == ("EACCES", 13, "hook"), error
    assert error["message"] == GUARD_VETO, error

    vetoed = team.queue.publish(shell_job(forbidden), name="vetoed")
    allowed = team.queue.publish(shell_job("echo allowed > allowed-job"), name="allowed")
    w, worker_events = team.work("--drain")
    assert w.rc == 0, w
    state, job_result = result_file(team, vetoed)
    assert state == "failed", job_result
    assert job_result["error"]["stage"] == "hook" and job_result["error"]["error"] == "EACCES"
    assert job_result["error"]["message"] == GUARD_VETO, job_result
    assert job_result["reason"] == f"EACCES: {GUARD_VETO} [hook]", job_result
    finished = {e["job"]: e for e in worker_events if e.get("event") == "finish"}
    assert finished[vetoed]["reason"] == job_result["reason"], worker_events
    assert result_file(team, allowed)[0] == "done"
    assert (team.ws / "allowed-job").read_text() == "allowed\n"

    assert not (team.ws / "forbidden-was-run").exists()
    # 10-trace ran before each veto and once for the allowed job; 30-after only for the latter.
    assert team.names() == ["10-trace"] * 3 + ["10-trace", "30-after"]

    # The records: each veto in its caller's session and in the tool's log, alike.
    vetoes = {term_call(team, "s1", 0): "s1", native["call"]: "s1", job_result["call"]: "worker"}
    log = team.log("shell.exec")
    for call, session in vetoes.items():
        event = team.results(session)[call]
        for record in (event, log[call]):
            assert record["status"] == "error" and record["errno"] == "EACCES", record
            assert record["stage"] == "hook" and record["message"] == GUARD_VETO, record
            assert record["exit_status"] is None, record
            assert record["object"] == "tool/shell.exec", record
        assert log[call]["session"] == session, log[call]

    # tsh, a tool the agent may run, has hooks of its own: the guard there refuses too.
    team.hook("tsh", "pre", "20-guard", GUARD)
    which = team.run("tsh", "which", "shell.exec")
    assert which.rc == 0 and which.out.strip() == "/ctx/tool/shell.exec", which
    refused = team.run("tsh", "which", "forbidden")
    assert refused.rc == 126 and f"EACCES: {GUARD_VETO}" in refused.err, refused
    tsh_results = [e for e in team.events("s1") if e["type"] == "tool_result"]
    assert tsh_results[-1]["object"] == "tool/tsh" and tsh_results[-1]["stage"] == "hook"

    # ctx tool (H-3) runs tsh.config as the caller: a hook that refuses everything is not run.
    marker = team.top / "tsh.config-hook-ran"
    team.hook("tsh.config", "pre", "10-never", f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    env = team.env(CTX_PATH=str(team.storage / "tool"))
    shown = team.ctx("tool", "tsh.config", env=env)
    assert shown.rc == 0 and "max_loaded_tools=64" in shown.lines(), shown
    assert not marker.exists()
    text = (team.storage / "tool" / "tsh.config.d" / "log").read_text()
    last = json.loads(text.splitlines()[-1])
    assert (last["mode"], last["status"], last["exit_status"]) == ("host", "ok", 0), last


def term_call(team: Team, session: str, index: int) -> str:
    """The call id of the session's ``index``-th ``tool_call`` event."""
    return [e for e in team.events(session) if e["type"] == "tool_call"][index]["call"]


# ==================================================================== hanging hooks


SLOW = """\
#!/bin/sh
call=$(cat)
if echo "$call" | grep -q hang; then
  sleep 60 &
  echo $! > "slow-child-$CTX_CALL"
  echo "waiting for a lock that never comes" >&2
  sleep 60
fi
if echo "$call" | grep -q nap; then sleep 0.6; fi
"""


def children_of_the_hook(team: Team) -> list[int]:
    return [int(p.read_text()) for p in team.ws.glob("slow-child-*")]


def test_a_hanging_pre_hook_shares_the_call_timeout_and_dies_with_its_group(team):
    """T-6, W-4 and docs/tools.md "Hooks": a call's timeout starts with the pre-hooks; a pre-hook
    still running when it runs out is killed with what it started and vetoes the call
    (``ran past the call's timeout``), in ``ctx run`` and in a worker's job alike; a pre-hook
    that only takes part of the timeout leaves the tool the rest (``ETIMEDOUT`` at stage
    ``run``)."""
    team.hook("shell.exec", "pre", "10-slow", SLOW)
    began = time.monotonic()
    term = team.run("shell.exec", "hang; touch ran-after-hang", options=("--timeout", "1"))
    assert time.monotonic() - began < 5, term
    assert term.rc == 126, term
    assert "EACCES: hooks/pre.d/10-slow vetoed the call (exit 137): ran past the call's" in (
        term.err), term  # fmt: skip

    r, result = team.native("shell.exec", {"cmd": "nap; sleep 1.4; touch ran-too-long"},
                            options=("--timeout", "1.5"))  # fmt: skip
    assert r.rc == 1, r
    error = result["error"]
    assert (error["error"], error["stage"]) == ("ETIMEDOUT", "run"), result
    assert result["exit_status"] == 137, result

    job = team.queue.publish(shell_job("hang; touch ran-after-hang"), name="hang")
    began = time.monotonic()
    w, _ = team.work("--drain", "--timeout", "1")
    assert w.rc == 0 and time.monotonic() - began < 8, w
    state, job_result = result_file(team, job)
    assert state == "failed" and job_result["error"]["stage"] == "hook", job_result
    assert "hooks/pre.d/10-slow vetoed the call (exit 137): ran past the call's timeout" in (
        job_result["reason"]), job_result  # fmt: skip

    children = children_of_the_hook(team)
    assert len(children) == 2, children
    assert wait_for(lambda: not any(alive(pid) for pid in children), 5), children
    assert not (team.ws / "ran-after-hang").exists()
    assert not (team.ws / "ran-too-long").exists()


@contextlib.contextmanager
def background(
    team: Team, argv: list[str], stdin: Path | None = None
) -> Iterator[subprocess.Popen]:
    """``ctx ARGV`` started in a process group of its own, killed with it if left running."""
    with open(stdin or os.devnull, "rb") as given:
        proc = subprocess.Popen([*CTX_ARGV, *argv], stdin=given, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=team.env(),
                                start_new_session=True)  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def test_hooks_without_a_call_timeout_are_cut_after_ten_seconds(team):
    """T-6 and docs/tools.md "Hooks": every hook has ten seconds at most — a pre-hook of a
    terminal call (no default timeout) is killed then and vetoes (``timed out after 10s``); a
    post-hook keeps its own ten seconds past a native call's timeout, is killed with what it
    started, and its failure is recorded with the call without changing it."""
    team.hook("shell.exec", "pre", "10-slow", SLOW.replace("hang", "pre-hang"))
    team.hook("shell.exec", "post", "10-slow", SLOW.replace("hang", "post-hang"))
    native_in = team.top / "native-input.json"
    native_in.write_text(json.dumps({"cmd": "echo post-hang"}))
    term_argv = ["run", "--agent", AGENT, "--session", "s1", "shell.exec",
                 "echo pre-hang; touch ran-after-hang"]  # fmt: skip
    native_argv = ["run", "--native", "--timeout", "1", "--agent", AGENT, "--session", "s2",
                   "shell.exec"]  # fmt: skip
    began = time.monotonic()
    with background(team, term_argv) as term, background(team, native_argv, native_in) as native:
        _, term_err = term.communicate(timeout=30)
        native_out, _ = native.communicate(timeout=30)
    elapsed = time.monotonic() - began
    assert 9.5 < elapsed < 20, elapsed
    assert term.returncode == 126, term_err
    assert "EACCES: hooks/pre.d/10-slow vetoed the call (exit 137): timed out after 10s" in (
        term_err)  # fmt: skip
    assert not (team.ws / "ran-after-hang").exists()

    result = json.loads(native_out.splitlines()[-1])
    assert native.returncode == 0 and result["status"] == "ok", native_out
    assert result["output"] == "post-hang\n" and result["error"] is None, result
    failed = [{"hook": "hooks/post.d/10-slow", "exit_status": 137,
               "message": "timed out after 10s"}]  # fmt: skip
    assert result["post_hooks"] == failed, result
    assert team.results("s2")[result["call"]]["post_hooks"] == failed
    children = children_of_the_hook(team)
    assert len(children) == 2, children
    assert wait_for(lambda: not any(alive(pid) for pid in children), 5), children


# ==================================================================== what counts as a hook


def test_links_special_files_and_foreign_owners_in_the_hook_directories(team):
    """T-6 and docs/tools.md "What counts as a hook": a symbolic link in ``pre.d`` is never
    followed and vetoes (exit 126), in ``post.d`` it is a failed hook recorded with the call; a
    FIFO vetoes a worker's job; a pre-hook the agent's uid owns, or one its group may write, is
    refused at step 6 (``EACCES`` naming it) while a post-hook of the agent's own runs; a link
    in place of ``pre.d`` makes the tool damaged (``ENOEXEC``)."""
    agent = nobody()
    outside = team.ws / "outside-hook"
    outside.write_text(TRACER)
    outside.chmod(0o755)
    team.hook("shell.exec", "pre", "10-trace", TRACER)
    pre, post = team.hooks("shell.exec", "pre"), team.hooks("shell.exec", "post")

    (pre / "40-link").symlink_to(outside)
    term = team.run("shell.exec", "touch ran")
    assert term.rc == 126, term
    assert "EACCES: hooks/pre.d/40-link vetoed the call (exit 126): is a symbolic link" in (
        term.err), term  # fmt: skip
    assert team.names() == ["10-trace"]  # the link's target never ran
    (pre / "40-link").unlink()

    os.mkfifo(pre / "40-fifo")
    job = team.queue.publish(shell_job("touch ran"), name="fifo")
    assert team.work("--drain")[0].rc == 0
    state, job_result = result_file(team, job)
    assert state == "failed" and job_result["error"]["stage"] == "hook", job_result
    assert job_result["error"]["message"] == (
        "hooks/pre.d/40-fifo vetoed the call (exit 126): is not a regular file"
    ), job_result
    (pre / "40-fifo").unlink()

    (post / "10-link").symlink_to(outside)
    r, result = team.native("shell.exec", {"cmd": "echo fine"})
    assert r.rc == 0 and result["output"] == "fine\n", r
    (linked,) = result["post_hooks"]
    assert (linked["hook"], linked["exit_status"]) == ("hooks/post.d/10-link", 126), result
    assert team.results("s1")[result["call"]]["post_hooks"] == result["post_hooks"]
    assert not (team.ws / "ran").exists()
    assert team.names() == ["10-trace"] * 3
    (post / "10-link").unlink()

    own = team.hook("shell.exec", "pre", "20-own", TRACER)
    os.chown(own, agent.pw_uid, agent.pw_gid)
    term = team.run("shell.exec", "touch ran")
    assert term.rc == 126, term
    assert "EACCES: step 6 " in term.err and "hooks/pre.d/20-own" in term.err, term
    os.rename(own, post / "20-own")  # the agent's own code, run as itself, after the call
    r, result = team.native("shell.exec", {"cmd": "echo fine"})
    assert r.rc == 0 and result["post_hooks"] == [], r
    assert team.trace()[-1]["name"] == "20-own" and team.trace()[-1]["uid"] == agent.pw_uid

    (pre / "10-trace").chmod(0o775)
    term = team.run("shell.exec", "touch ran")
    assert term.rc == 126, term
    assert "EACCES: step 6 " in term.err and "hooks/pre.d/10-trace" in term.err, term
    (pre / "10-trace").chmod(0o755)

    shutil.rmtree(pre)
    real = team.top / "pre.d-elsewhere"
    real.mkdir()
    pre.symlink_to(real)
    term = team.run("shell.exec", "touch ran")
    assert term.rc == 126 and "ENOEXEC" in term.err and "pre.d" in term.err, term
    assert not (team.ws / "ran").exists()


# ==================================================================== loud hooks


LOUD = """\
#!/bin/sh
head -c 4000000 /dev/zero | tr '\\0' e >&2
echo >&2
echo "{name}: last word" >&2
exit {status}
"""


def test_hooks_flooding_stderr_do_not_hold_up_the_call(team):
    """T-6 and docs/tools.md "Hooks": pre- and post-hooks that write megabytes to stderr do not
    block the call in any mode; the call runs, a failing loud post-hook is recorded with the
    last line of its stderr and changes nothing, and a loud veto quotes its last line."""
    team.hook("shell.exec", "pre", "10-loud", LOUD.format(name="10-loud", status=0))
    team.hook("shell.exec", "post", "10-loud", LOUD.format(name="post-10-loud", status=2))
    began = time.monotonic()
    term = team.run("shell.exec", "echo terminal-ran")
    assert term.rc == 0 and term.out == "terminal-ran\n", term
    r, result = team.native("shell.exec", {"cmd": "echo native-ran"})
    assert r.rc == 0 and result["output"] == "native-ran\n", r
    failed = [{"hook": "hooks/post.d/10-loud", "exit_status": 2,
               "message": "post-10-loud: last word"}]  # fmt: skip
    assert result["post_hooks"] == failed, result
    job = team.queue.publish(shell_job("echo job-ran"), name="loud")
    assert team.work("--drain")[0].rc == 0
    state, job_result = result_file(team, job)
    assert state == "done" and job_result["output"] == "job-ran\n", job_result
    assert team.results("worker")[job_result["call"]]["post_hooks"] == failed

    team.hook("shell.exec", "pre", "20-loud-veto", LOUD.format(name="20-loud-veto", status=4))
    term = team.run("shell.exec", "touch ran")
    assert term.rc == 126, term
    assert "hooks/pre.d/20-loud-veto vetoed the call (exit 4): 20-loud-veto: last word" in (
        term.err), term  # fmt: skip
    assert not (team.ws / "ran").exists()
    assert time.monotonic() - began < 15


# ==================================================================== product defects


def test_a_post_hook_with_a_long_last_line_changes_nothing(team):
    """T-6, S-2 and docs/tools.md "Hooks": a post-hook's exit status is recorded with the call
    and changes nothing, and every recorded ``tool_call`` gets its ``tool_result`` — also when
    the failing post-hook's last stderr line is a long one (a dumped JSON document)."""
    dump = "#!/bin/sh\nhead -c 70000 /dev/zero | tr '\\0' d >&2\necho >&2\nexit 2\n"
    team.hook("shell.exec", "post", "10-dump", dump)
    job = team.queue.publish(shell_job("echo job-ran"), name="dump")
    assert team.work("--drain")[0].rc == 0
    assert team.queue.state(job) == "done", result_file(team, job)
    term = team.run("shell.exec", "echo ran")
    assert term.rc == 0 and term.out == "ran\n", term
    r, result = team.native("shell.exec", {"cmd": "echo native"})
    assert r.rc == 0 and result["status"] == "ok", r
    assert [h["hook"] for h in result["post_hooks"]] == ["hooks/post.d/10-dump"], result
    calls = [e["call"] for e in team.events("s1") if e["type"] == "tool_call"]
    assert set(calls) <= set(team.results("s1")), team.events("s1")


def test_a_pre_hook_that_prints_a_long_report_and_exits_0_lets_the_call_run(team):
    """T-6 and docs/tools.md "Hooks": a pre-hook vetoes with a non-zero exit or a timeout; a
    linter-like guard that prints a 100 KB report on stdout and exits 0 lets the call run."""
    team.hook("shell.exec", "pre", "10-report",
              "#!/bin/sh\nhead -c 100000 /dev/zero | tr '\\0' r\necho\nexit 0\n")  # fmt: skip
    term = team.run("shell.exec", "echo ran")
    assert term.rc == 0 and term.out == "ran\n", term


def test_a_pre_hook_the_agent_may_not_execute_vetoes(team):
    """docs/tools.md "What counts as a hook": a hook whose execute bits are not the agent's is a
    failed hook, in ``pre.d`` a veto — the guard is not run, and neither is the tool."""
    marker = team.ws / "hook-ran"
    team.hook("shell.exec", "pre", "10-root-only", f"#!/bin/sh\nid -u > {marker}\n", mode=0o744)
    term = team.run("shell.exec", "touch ran")
    assert not marker.exists(), marker.read_text()
    assert term.rc == 126 and "hooks/pre.d/10-root-only vetoed the call" in term.err, term
    assert not (team.ws / "ran").exists()
