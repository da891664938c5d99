"""Hooks met at their edges (SPEC §6 T-6, T-7, §3 W-1/W-4, §4 S-2, docs/tools.md "Hooks (T-6)"
and "Running a tool"): hooks that leave children behind, read their stdin to the end, die by
a signal, carry odd names (``~`` backups, dot-files, non-ASCII and non-UTF-8 bytes) under any
caller locale, appear or vanish while a call runs, are executable only by a class that does
not apply to the agent, are cut short by an interrupted caller, guard long inputs, and
quote long, blank-ended or carriage-return messages; in terminal and native mode and through
a queue worker, with the session's events and the tool's log checked each time."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, QueueCLI, Run, alive, clean_env, ctx_run, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as another uid")

AGENT, LABEL = "ci", "ci_t"

# A hook that copies what it read on stdin, byte for byte, to in-<phase>-<name> of its working
# directory (the agent's /workspace), and its name to the ``order`` file there.
RECORDER = """\
#!/bin/sh
name=${0##*/}
cat > "in-$CTX_HOOK-$name"
printf '%s\\n' "$name" >> order
"""

# A guard: refuses any call whose input or argv mentions "forbidden".
GUARD = """\
#!/bin/sh
if grep -q forbidden; then
  echo "forbidden word in the request" >&2
  exit 3
fi
"""

# A hook that waits (a few seconds at most) for the test to say "go", after saying it runs.
GATE = """\
#!/bin/sh
touch "gate-$CTX_HOOK"
i=0
while [ ! -e "go-$CTX_HOOK" ] && [ $i -lt 160 ]; do sleep 0.05; i=$((i + 1)); done
"""


def nobody() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody: root's default agent user (docs/tools.md)")


@dataclass
class Desk:
    """A storage root every uid may search, agent ``ci`` (uid nobody) allowed ``shell.exec``
    in both layers of P-6, its workspace ``ws`` mounted read-write at /workspace, and the
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
        kw.setdefault("timeout", 40)
        return ctx_run(*args, **kw)

    def hooks(self, phase: str, tool: str = "shell.exec") -> Path:
        return self.storage / "tool" / f"{tool}.d" / "hooks" / f"{phase}.d"

    def hook(
        self, phase: str, name: str | bytes, body: str, mode: int = 0o755, tool: str = "shell.exec"
    ) -> Path:
        path = self.hooks(phase, tool) / os.fsdecode(name)
        path.write_text(body)
        path.chmod(mode)
        return path

    def run(self, *argv: str, session: str = "s1", options: tuple = (), **kw) -> Run:
        return self.ctx("run", "--agent", AGENT, "--session", session, *options, "shell.exec",
                        *argv, **kw)  # fmt: skip

    def native(self, value, session: str = "s1", options: tuple = ()) -> tuple[Run, dict]:
        r = self.ctx("run", "--native", "--agent", AGENT, "--session", session, *options,
                     "shell.exec", input=json.dumps(value))  # fmt: skip
        frames = [json.loads(line) for line in r.lines()]
        assert frames and frames[-1]["type"] == "result", r
        return r, frames[-1]

    def argv(self, *words: str, native: bool = False, session: str = "s1") -> list[str]:
        """``ctx run`` words for a call made in the background."""
        mode = ["--native"] if native else []
        return ["run", *mode, "--agent", AGENT, "--session", session, "shell.exec", *words]

    def order(self) -> list[bytes]:
        path = self.ws / "order"
        return path.read_bytes().splitlines() if path.exists() else []

    def seen(self, phase: str, name: str) -> bytes:
        return (self.ws / f"in-{phase}-{name}").read_bytes()

    def session_dir(self, session: str) -> Path:
        return self.storage / "home" / str(nobody().pw_uid) / "agent" / AGENT / "session" / session

    def events(self, session: str) -> list[dict]:
        path = self.session_dir(session) / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def results(self, session: str) -> dict[str, dict]:
        return {e["call"]: e for e in self.events(session) if e["type"] == "tool_result"}

    def calls(self, session: str) -> list[str]:
        return [e["call"] for e in self.events(session) if e["type"] == "tool_call"]

    def log(self, tool: str = "shell.exec") -> dict[str, dict]:
        text = (self.storage / "tool" / f"{tool}.d" / "log").read_text()
        lines = [json.loads(line) for line in text.splitlines() if line.strip()]
        return {line["call"]: line for line in lines if line.get("call")}

    def log_lines(self, tool: str = "shell.exec") -> list[str]:
        return (self.storage / "tool" / f"{tool}.d" / "log").read_text().splitlines()


@pytest.fixture
def desk(searchable_storage: Path) -> Desk:
    nobody()
    desk = Desk(searchable_storage.parent)
    desk.ws.mkdir()
    desk.ws.chmod(0o777)
    request = {
        "name": AGENT,
        "label": LABEL,
        "tools": ["shell.exec"],
        "mount": [[str(desk.ws), "/workspace", "rw"]],
    }
    r = desk.ctx("agent", "create", "-", input=json.dumps(request))
    assert r.rc == 0, r
    with open(desk.storage / "tool" / "shell.exec.d" / "policy", "a") as policy:
        policy.write(f"allow {LABEL} tool:shell.exec execute\n")
    return desk


@contextlib.contextmanager
def background(desk: Desk, argv: list[str], stdin: bytes = b"") -> Iterator[subprocess.Popen]:
    """``ctx ARGV`` started in a process group of its own (its stdin ``stdin``), killed with
    it if left running."""
    feed = desk.top / f"stdin-{len(list(desk.top.glob('stdin-*')))}"
    feed.write_bytes(stdin)
    with open(feed, "rb") as given:
        proc = subprocess.Popen([*CTX_ARGV, *argv], stdin=given, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=desk.env(),
                                start_new_session=True)  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def shell_job(cmd: str) -> dict:
    return {"tool": "shell.exec", "input": {"cmd": cmd}, "from": "tester",
            "created": "2026-06-22T12:00:00Z"}  # fmt: skip


def one_json_line(data: bytes) -> dict:
    """What a hook read on stdin: exactly one JSON object on one line."""
    assert data.endswith(b"\n") and data.count(b"\n") == 1, data[:300]
    value = json.loads(data)
    assert isinstance(value, dict), value
    return value


# ==================================================================== stdin, children, output


LEAVER = """\
#!/bin/sh
sleep 60 &
echo $! > "child-$CTX_HOOK-$CTX_MODE"
cat > "in-$CTX_HOOK-$CTX_MODE"
head -c 8000000 /dev/zero
exit 0
"""


def test_hooks_that_read_to_eof_flood_stdout_and_leave_children_hold_up_no_call(desk):
    """T-6 and docs/tools.md "Hooks" and "Process group and bounds": a hook reads its call on a
    stdin of its own — one JSON line, then end of file, never the caller's stdin, which stays
    the terminal tool's — and what it writes on stdout, 8 MB here, is dropped; a child it left
    running while holding its pipes does not hold up the call, in terminal or native mode, and
    does not outlive it."""
    desk.hook("pre", "10-leaver", LEAVER)
    desk.hook("post", "10-leaver", LEAVER.replace("sleep 60 &\n", "true\n"))

    term = desk.run("cat; echo tool-ran", input="caller-data\n")
    assert term.rc == 0 and term.out == "caller-data\ntool-ran\n", term
    r, result = desk.native({"cmd": "echo native-ran"})
    assert r.rc == 0 and result["output"] == "native-ran\n" and result["post_hooks"] == [], r

    for mode in ("terminal", "native"):
        pre = one_json_line((desk.ws / f"in-pre-{mode}").read_bytes())
        post = one_json_line((desk.ws / f"in-post-{mode}").read_bytes())
        assert pre["hook"] == "pre" and post["hook"] == "post" and pre["mode"] == mode, pre
        assert pre["call"] == post["call"] == post["result"]["call"], (pre, post)
        assert "result" not in pre and post["result"]["status"] == "ok", post
    assert one_json_line((desk.ws / "in-pre-terminal").read_bytes())["argv"] == [
        "cat; echo tool-ran"
    ]
    assert one_json_line((desk.ws / "in-pre-native").read_bytes())["input"] == {
        "cmd": "echo native-ran"
    }
    children = [int(p.read_text()) for p in desk.ws.glob("child-pre-*")]
    assert len(children) == 2, children
    assert wait_for(lambda: not any(alive(pid) for pid in children), 5), children
    results = desk.results("s1")
    assert set(desk.calls("s1")) == set(results) and len(results) == 2, results
    assert all(e["status"] == "ok" and e.get("post_hooks", []) == [] for e in results.values()), (
        results
    )


# ==================================================================== signals


def test_a_hook_ended_by_a_signal_vetoes_before_and_is_listed_after(desk):
    """T-6, T-7: a pre-hook that dies by a signal vetoes with exit status 128 + N and the last
    line it wrote (terminal: exit 126; native: ``EACCES`` at stage ``hook``); a post-hook that
    dies by SIGSEGV is listed in ``post_hooks`` with 139 and changes nothing; the session and
    the tool's log say the same."""
    desk.hook("pre", "10-term", '#!/bin/sh\necho "about to die" >&2\nkill -TERM $$\n')
    term = desk.run("touch ran")
    assert term.rc == 126 and term.out == "", term
    veto = "hooks/pre.d/10-term vetoed the call (exit 143): about to die"
    assert f"EACCES: {veto}" in term.err, term
    r, result = desk.native({"cmd": "touch ran"})
    assert r.rc == 1 and result["exit_status"] is None and result["post_hooks"] == [], r
    assert (result["error"]["error"], result["error"]["stage"]) == ("EACCES", "hook"), result
    assert result["error"]["message"] == veto, result
    assert not (desk.ws / "ran").exists()

    (desk.hooks("pre") / "10-term").unlink()
    desk.hook("post", "10-segv", '#!/bin/sh\necho "segv soon" >&2\nkill -SEGV $$\n')
    r, passed = desk.native({"cmd": "echo still-fine"})
    assert r.rc == 0 and passed["status"] == "ok" and passed["output"] == "still-fine\n", r
    listed = [{"hook": "hooks/post.d/10-segv", "exit_status": 139, "message": "segv soon"}]
    assert passed["post_hooks"] == listed, passed
    term = desk.run("echo terminal-fine")
    assert term.rc == 0 and term.out == "terminal-fine\n", term

    results, log = desk.results("s1"), desk.log()
    assert len(results) == 4 and set(desk.calls("s1")) == set(results), results
    for record in (results[result["call"]], log[result["call"]]):
        assert (record["errno"], record["stage"], record["message"]) == ("EACCES", "hook", veto)
    for record in (results[passed["call"]], log[passed["call"]]):
        assert record["status"] == "ok" and record["post_hooks"] == listed, record


# ==================================================================== odd names


def test_odd_names_run_in_byte_order_whatever_the_callers_locale(desk):
    """T-6 and docs/tools.md "Hooks": every executable runs, in the byte order of its name —
    an editor's ``~`` backup and a dot-file included, names with accents and a byte that is
    not UTF-8 after ASCII — however the caller's locale would collate them."""
    names = [b"10-a~", b"a", b"\xc3\xa9", b"B", b"10-a", b"_x", b"z\xff", b".hidden", b"-dash",
             b"\xc3\x84"]  # fmt: skip
    for name in names:
        desk.hook("pre", name, RECORDER)
    desk.hook("post", "10-after", RECORDER)
    locale = {"LC_ALL": "en_US.UTF-8", "LANG": "de_DE.UTF-8", "LC_COLLATE": "en_US.UTF-8"}
    term = desk.run("echo ran", env=desk.env(**locale))
    assert term.rc == 0 and term.out == "ran\n", term
    assert desk.order() == [*sorted(names), b"10-after"]

    (desk.ws / "order").unlink()
    r, result = desk.native({"cmd": "echo ran"}, options=())
    assert r.rc == 0 and result["post_hooks"] == [], r
    assert desk.order() == [*sorted(names), b"10-after"]


def test_a_veto_by_a_hook_named_with_a_non_utf8_byte_is_recorded_as_text(desk):
    """T-6, T-7 and docs/sessions.md (a byte that is not UTF-8 is written as the text
    ``\\xNN``, so that every line is one strict readers take): a pre-hook named ``50-z\\xff``
    vetoes, and the session's event and the tool's log line name it in text that is UTF-8."""
    desk.hook("pre", b"50-z\xff", "#!/bin/sh\nexit 9\n")
    r, result = desk.native({"cmd": "touch ran"})
    assert r.rc == 1 and result["error"]["stage"] == "hook", r
    assert not (desk.ws / "ran").exists()
    for record in (desk.results("s1")[result["call"]], desk.log()[result["call"]]):
        assert record["message"].startswith("hooks/pre.d/50-z"), record
        record["message"].encode("utf-8")  # no lone surrogate in a recorded line


# ==================================================================== changes during a call


def test_hooks_added_or_removed_while_a_call_runs(desk):
    """T-6 and docs/tools.md "What counts as a hook": the hooks of a call are the ones listed
    when it is admitted — a pre-hook removed while an earlier one runs is a failed hook and so
    a veto (``vanished before it could run``), one added then does not run for that call but
    for the next; a post-hook removed while the tool runs is listed failed (126) and changes
    nothing."""
    desk.hook("pre", "10-gate", GATE)
    desk.hook("pre", "20-later", RECORDER)
    with background(desk, desk.argv("touch ran")) as call:
        assert wait_for(lambda: (desk.ws / "gate-pre").exists(), 15), "10-gate never ran"
        (desk.hooks("pre") / "20-later").unlink()
        desk.hook("pre", "15-new", RECORDER)
        (desk.ws / "go-pre").touch()
        _, err = call.communicate(timeout=30)
    assert call.returncode == 126, err
    assert b"EACCES: hooks/pre.d/20-later vetoed the call (exit 126): vanished before it" in err
    assert desk.order() == [] and not (desk.ws / "ran").exists()

    desk.hook("post", "10-trail", RECORDER)
    wait = "touch tool-started; i=0; while [ ! -e go-tool ] && [ $i -lt 160 ]; do sleep 0.05; "
    wait += "i=$((i + 1)); done; echo tool-ran"
    with background(desk, desk.argv(native=True), json.dumps({"cmd": wait}).encode()) as call:
        assert wait_for(lambda: (desk.ws / "tool-started").exists(), 15), "the tool never ran"
        (desk.hooks("post") / "10-trail").unlink()
        (desk.ws / "go-tool").touch()
        out, _ = call.communicate(timeout=30)
    result = json.loads(out.splitlines()[-1])
    assert call.returncode == 0 and result["status"] == "ok", out
    assert result["output"] == "tool-ran\n", result
    gone = [{"hook": "hooks/post.d/10-trail", "exit_status": 126,
             "message": "vanished before it could run"}]  # fmt: skip
    assert result["post_hooks"] == gone, result
    assert desk.order() == [b"15-new"]  # admitted with 15-new, ran once the gate let it through
    results = desk.results("s1")
    assert results[result["call"]]["post_hooks"] == gone, results
    assert set(desk.calls("s1")) == set(results) and len(results) == 2, results


# ==================================================================== whose execute bits


def test_execute_bits_are_judged_by_the_class_that_applies_to_the_agent(desk):
    """docs/tools.md "What counts as a hook" (execute bits judged as the kernel judges them:
    the one class that applies): a root-owned pre-hook of the agent's group with mode 0705
    vetoes although *other* may execute it, and runs with 0750; a ``pre.d`` of mode 0700 the
    agent cannot search vetoes every call, a ``post.d`` of 0700 lists its hook failed, and
    0711 (search without read) lets both run."""
    agent = nobody()
    hook = desk.hook("pre", "10-group", RECORDER, mode=0o705)
    os.chown(hook, 0, agent.pw_gid)
    term = desk.run("touch ran")
    assert term.rc == 126, term
    assert "hooks/pre.d/10-group vetoed the call (exit 126): may not be executed by the agent" in (
        term.err), term  # fmt: skip
    assert desk.order() == [] and not (desk.ws / "ran").exists()
    hook.chmod(0o750)
    term = desk.run("echo ran")
    assert term.rc == 0 and term.out == "ran\n", term
    assert desk.order() == [b"10-group"]

    desk.hook("post", "10-post", RECORDER)
    pre, post = desk.hooks("pre"), desk.hooks("post")
    pre.chmod(0o700)
    term = desk.run("touch ran")
    assert term.rc == 126 and "search (x) on shell.exec.d/hooks/pre.d" in term.err, term
    pre.chmod(0o755)
    post.chmod(0o700)
    r, result = desk.native({"cmd": "echo fine"})
    assert r.rc == 0 and result["output"] == "fine\n", r
    ((failed),) = result["post_hooks"]
    assert (failed["hook"], failed["exit_status"]) == ("hooks/post.d/10-post", 126), result
    assert "search (x) on shell.exec.d/hooks/post.d" in failed["message"], failed
    pre.chmod(0o711)
    post.chmod(0o711)
    r, result = desk.native({"cmd": "echo again"})
    assert r.rc == 0 and result["post_hooks"] == [], r
    assert desk.order() == [b"10-group", b"10-group", b"10-group", b"10-post"]
    assert not (desk.ws / "ran").exists()


# ==================================================================== interrupted callers


HOLDER = """\
#!/bin/sh
sleep 60 &
echo $! > "child-$CTX_MODE"
touch "gate-$CTX_MODE"
sleep 60
"""


@pytest.mark.parametrize("native", [True, False], ids=["native", "terminal"])
def test_a_caller_stopped_during_its_pre_hooks_leaves_nothing_running(desk, native):
    """docs/tools.md "Running a tool" (SIGTERM to ``ctx run`` ends the call ``EINTR``, exit
    128 + N) and "Hooks": a caller stopped while a pre-hook runs kills the hook and what it
    started, runs neither the tool nor the post-hooks, and records the call (``tool_call`` and
    its ``tool_result``, ``EINTR`` at stage ``hook``) in the session and the tool's log."""
    mode = "native" if native else "terminal"
    desk.hook("pre", "10-holder", HOLDER)
    desk.hook("post", "10-post", RECORDER)
    argv = desk.argv(*(() if native else ("touch ran",)), native=native, session="stop")
    with background(desk, argv, json.dumps({"cmd": "touch ran"}).encode()) as call:
        assert wait_for(lambda: (desk.ws / f"gate-{mode}").exists(), 15), "the hook never ran"
        call.send_signal(signal.SIGTERM)
        out, err = call.communicate(timeout=30)
    assert call.returncode == 143, err
    assert b"EINTR" in err, err
    if native:
        result = json.loads(out.splitlines()[-1])
        error = result["error"]
        assert (error["error"], error["stage"], result["exit_status"]) == ("EINTR", "hook", None)
    child = int((desk.ws / f"child-{mode}").read_text())
    assert wait_for(lambda: not alive(child), 5), child
    assert not (desk.ws / "ran").exists() and desk.order() == []
    (call_id,) = desk.calls("stop")
    for record in (desk.results("stop")[call_id], desk.log()[call_id]):
        assert (record["errno"], record["stage"]) == ("EINTR", "hook"), record


# ==================================================================== a worker's jobs


def test_a_workers_hooks_read_the_job_and_post_hooks_see_its_timeout(desk):
    """T-6, W-1, W-4 and docs/sessions.md (the queue job in the hooks' input): a worker's
    pre-hook reads the job's name and input in native mode in session ``worker`` as the agent;
    a job that times out is seen so by the post-hooks (``ETIMEDOUT``, 137), whose failure is
    listed with the call and does not change the job's failure."""
    agent = nobody()
    desk.hook("pre", "10-rec", RECORDER)
    desk.hook("post", "10-rec", RECORDER + "echo 'trail refused' >&2\nexit 3\n")
    job = desk.queue.publish(shell_job("sleep 5; touch ran"), name="slow")
    w = desk.ctx("queue", "work", "--project", "proj", "--agent", AGENT, "--drain",
                 "--timeout", "1", "--json")  # fmt: skip
    assert w.rc == 0, w
    state, job_result = desk.queue.only_result(job)
    assert state == "failed", job_result
    assert job_result["error"]["error"] == "ETIMEDOUT", job_result
    assert job_result["reason"].startswith("ETIMEDOUT: ") and "[run]" in job_result["reason"]

    pre = one_json_line(desk.seen("pre", "10-rec"))
    post = one_json_line(desk.seen("post", "10-rec"))
    session = f"home/{agent.pw_uid}/agent/{AGENT}/session/worker"
    for seen in (pre, post):
        assert (seen["job"], seen["mode"], seen["session"]) == (job, "native", session), seen
        assert seen["input"] == {"cmd": "sleep 5; touch ran"}, seen
        assert seen["call"] == job_result["call"], seen
    got = post["result"]
    assert (got["status"], got["exit_status"], got["error"]["error"]) == (
        "error", 137, "ETIMEDOUT"), got  # fmt: skip
    assert (desk.ws / "in-pre-10-rec").stat().st_uid == agent.pw_uid
    listed = [{"hook": "hooks/post.d/10-rec", "exit_status": 3, "message": "trail refused"}]
    for record in (desk.results("worker")[job_result["call"]], desk.log()[job_result["call"]]):
        assert record["errno"] == "ETIMEDOUT" and record["post_hooks"] == listed, record
    assert not (desk.ws / "ran").exists()


# ==================================================================== refused calls


def test_calls_refused_before_the_tool_runs_run_no_post_hook(desk):
    """docs/tools.md "Running a tool" (the first stage that refuses ends the call; post-hooks
    see a result after the run): a veto, a schema refusal and a call of a tool the agent is
    not granted run no post-hook, and the refused call's pre-hooks only where it reached
    stage ``hook``."""
    desk.hook("pre", "10-guard", GUARD)
    desk.hook("pre", "20-rec", RECORDER)
    desk.hook("post", "10-rec", RECORDER)
    term = desk.run("echo forbidden")
    assert term.rc == 126 and "hooks/pre.d/10-guard vetoed the call (exit 3)" in term.err, term
    r, result = desk.native({"cmd": 5})
    assert r.rc == 2 and result["error"]["stage"] == "schema", r
    desk.hook("pre", "10-rec", RECORDER, tool="fs.read")
    desk.hook("post", "10-rec", RECORDER, tool="fs.read")
    denied = desk.ctx("run", "--agent", AGENT, "--session", "s1", "fs.read", "x")
    assert denied.rc == 126 and "EACCES" in denied.err, denied
    assert desk.order() == []
    results = [e for e in desk.events("s1") if e["type"] == "tool_result"]
    assert [(e["object"], e["stage"]) for e in results] == [
        ("tool/shell.exec", "hook"),
        ("tool/shell.exec", "schema"),
        ("tool/fs.read", "authorize"),
    ], results
    assert not any(e.get("post_hooks") for e in results), results


# ==================================================================== messages


def test_a_veto_quotes_the_last_line_of_its_stderr_cut_to_1000_characters(desk):
    """T-6 and docs/tools.md "Hooks": the message is the last line of the hook's stderr —
    blank lines after it do not count, and ``\\r`` ends a line as progress output uses it —
    cut to 1 000 characters, shortened further in the session and the log; a veto that says
    nothing names the hook and its exit status alone; 20 MB of stdout change none of it."""
    pre = desk.hooks("pre")
    desk.hook("pre", "10-blank", '#!/bin/sh\nprintf "first\\nthe reason\\n\\n   \\n" >&2\nexit 4\n')
    term = desk.run("touch ran")
    assert term.rc == 126, term
    assert term.err.rstrip("\n").endswith("vetoed the call (exit 4): the reason"), term

    (pre / "10-blank").unlink()
    desk.hook("pre", "10-cr", '#!/bin/sh\nprintf "10%%\\r50%%\\rdenied by rule 7" >&2\nexit 5\n')
    term = desk.run("touch ran")
    assert term.rc == 126, term
    assert term.err.rstrip("\n").endswith("vetoed the call (exit 5): denied by rule 7"), term

    (pre / "10-cr").unlink()
    desk.hook("pre", "10-mute", "#!/bin/sh\nexit 9\n")
    _, result = desk.native({"cmd": "touch ran"})
    assert result["error"]["message"] == "hooks/pre.d/10-mute vetoed the call (exit 9)", result

    (pre / "10-mute").unlink()
    long_hook = '#!/bin/sh\nhead -c 20000000 /dev/zero\nprintf "%05000d\\n" 7 >&2\nexit 6\n'
    desk.hook("pre", "10-long", long_hook)
    _, long = desk.native({"cmd": "touch ran"})
    prefix = "hooks/pre.d/10-long vetoed the call (exit 6): "
    assert long["error"]["message"] == prefix + "0" * 999 + "…", long["error"]
    term = desk.run("touch ran")
    assert term.rc == 126 and prefix + "0" * 999 + "…" in term.err, term
    recorded = desk.results("s1")[long["call"]]["message"]
    assert recorded.startswith(prefix + "0" * 100) and len(recorded) < len(prefix) + 999, recorded
    assert not (desk.ws / "ran").exists()


# ==================================================================== guards and long inputs


def test_a_guard_sees_the_whole_input_of_a_native_call(desk):
    """T-6 and docs/tools.md "Hooks" (each hook reads the call's ``input``): a guard refusing
    any request that mentions ``forbidden`` refuses it also when the word comes after 300
    characters of the command, and reads the input the tool would have read."""
    desk.hook("pre", "10-rec", RECORDER)
    desk.hook("pre", "20-guard", GUARD)
    cmd = "echo " + "x" * 300 + " && echo forbidden > ran"
    r, result = desk.native({"cmd": cmd})
    assert not (desk.ws / "ran").exists(), result
    assert r.rc == 1 and result["error"]["stage"] == "hook", result
    assert one_json_line(desk.seen("pre", "10-rec"))["input"] == {"cmd": cmd}


def test_a_guard_sees_the_whole_argv_of_a_terminal_call(desk):
    """T-6 and docs/tools.md "Hooks" (each hook reads the call's ``argv``): the same guard in
    terminal mode refuses a command whose forbidden part comes after 300 characters."""
    desk.hook("pre", "10-rec", RECORDER)
    desk.hook("pre", "20-guard", GUARD)
    word = "echo " + "x" * 300 + " && echo forbidden > ran"
    term = desk.run(word)
    assert not (desk.ws / "ran").exists(), term
    assert term.rc == 126 and "hooks/pre.d/20-guard vetoed the call" in term.err, term
    assert one_json_line(desk.seen("pre", "10-rec"))["argv"] == [word]
