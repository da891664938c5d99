"""End-to-end flows of a user who sets up tools for agents and then watches them work (SPEC
§1, §4, §5, §6, §9, §13): ``ctx bootstrap``, a v2 manifest checked and installed into the
user and shared tiers, ``CTX_PATH`` as the human and the agent each resolve it, an agent made
from a request, both layers of policy edited while ``ctx policy`` and ``ctx run`` are asked
the same questions, hooks, the records each call leaves, a torn session line repaired, and
the host and agent views of ``ctx mount`` following those edits."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    MOUNT_WAIT,
    ROOT_ENTRIES,
    Run,
    clean_env,
    ctx_mount,
    ctx_run,
    mounted_at,
    needs_fuse,
    scratch_top,
    snapshot,
    wait_for,
    write_durably,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as another uid")

SCRATCH = scratch_top(__file__)
LABEL = "coder_t"


# The schema of demo.echo: one required string, nothing else.
ECHO_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
    "additionalProperties": False,
}

# Prints its argv (terminal mode) or its JSON input (native mode) back as one JSON object and
# leaves its name in ``ran`` in its working directory (the agent's /workspace).
ECHO = """\
#!/bin/sh
echo demo.echo >> ran
if [ "$#" -gt 0 ]; then
  python3 -c 'import json, sys; print(json.dumps({"argv": sys.argv[1:]}))' "$@"
else
  python3 -c 'import json, sys; print(json.dumps({"input": json.load(sys.stdin)}))'
fi
"""

# A guard: vetoes any call whose input or argv mentions "forbidden".
GUARD = """\
#!/bin/sh
echo 10-guard >> ran
if grep -q forbidden; then
  echo "the guard refuses forbidden words" >&2
  exit 3
fi
"""

# An auditor: keeps what it was given, one file per call.
AUDIT = """\
#!/bin/sh
echo 20-audit >> ran
cat > "audit-$CTX_CALL.json"
"""


def nobody() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody: root's default agent user (docs/tools.md)")


@dataclass
class Flow:
    """A user's working directory: a storage root every uid may search, a workspace the
    agent may write and a place for manifests."""

    top: Path

    @property
    def storage(self) -> Path:
        return self.top / "storage"

    @property
    def workspace(self) -> Path:
        return self.top / "ws"

    def env(self, **extra: str) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage), **extra)

    def ctx(self, *args, env: dict[str, str] | None = None, **kw) -> Run:
        return ctx_run(*args, env=env or self.env(), **kw)

    def manifest(self, name: str, program: str, schema: dict | None = None) -> Path:
        """A v2 manifest (T-8) beside its program, named relative to it."""
        src = self.top / "src" / name
        src.mkdir(parents=True, exist_ok=True)
        (src / "prog.sh").write_text(program)
        document = {
            "manifest": 2,
            "kind": "tool",
            "name": name,
            "description": f"The {name} tool.",
            "schema": schema or {"type": "object"},
            "cap": {"side_effects": False, "network": False},
            "exec": "prog.sh",
        }
        path = src / "manifest.json"
        path.write_text(json.dumps(document))
        return path

    def install(self, manifest: Path, tier: str) -> Run:
        r = self.ctx("object", "install", manifest, "--tier", tier)
        assert r.rc == 0, r
        return r

    def create_agent(self, tools: list[str], shared: dict | None = None) -> Path:
        request = {
            "name": "coder",
            "label": LABEL,
            "tools": tools,
            "shared": shared or {},
            "mount": [[str(self.workspace), "/workspace", "rw"]],
        }
        path = self.top / "coder.json"
        path.write_text(json.dumps(request))
        r = self.ctx("agent", "create", path)
        assert r.rc == 0, r
        assert "created agent coder" in r.out, r
        return path

    @property
    def agent_policy(self) -> Path:
        return self.storage / "agent" / "coder.d" / "policy"

    def add_rule(self, policy: Path, rule: str) -> None:
        with policy.open("a") as f:
            f.write(rule + "\n")

    def drop_rule(self, policy: Path, rule: str) -> None:
        lines = policy.read_text().splitlines(keepends=True)
        assert rule + "\n" in lines, policy.read_text()
        policy.write_text("".join(line for line in lines if line != rule + "\n"))

    def run(self, tool: str, *argv: str, session: str = "default") -> Run:
        return self.ctx("run", "--agent", "coder", "--session", session, tool, *argv)

    def native(self, tool: str, value, session: str = "default") -> tuple[Run, list[dict]]:
        text = value if isinstance(value, str) else json.dumps(value)
        r = self.ctx("run", "--native", "--agent", "coder", "--session", session, tool,
                     input=text)  # fmt: skip
        return r, [json.loads(line) for line in r.lines()]

    def ran(self) -> list[str]:
        marker = self.workspace / "ran"
        return marker.read_text().split() if marker.exists() else []


@pytest.fixture
def flow() -> Iterator[Flow]:
    """A fresh directory with ``ctx bootstrap`` run in it (R-5), as a new user starts."""
    SCRATCH.mkdir(exist_ok=True)
    SCRATCH.chmod(0o755)
    top = Path(tempfile.mkdtemp(prefix="flow-", dir=SCRATCH))
    top.chmod(0o755)
    flow = Flow(top)
    try:
        flow.workspace.mkdir()
        flow.workspace.chmod(0o777)
        r = ctx_run("bootstrap", "--storage", flow.storage)
        assert r.rc == 0, r
        assert {p.name for p in flow.storage.iterdir()} == ROOT_ENTRIES
        yield flow
    finally:
        shutil.rmtree(top, ignore_errors=True)


def result_frame(frames: list[dict]) -> dict:
    assert frames and frames[-1]["type"] == "result", frames
    return frames[-1]


def explain(flow: Flow, tool: str) -> dict:
    r = flow.ctx("policy", "explain", "--json", "coder", f"tool:{tool}", "execute")
    assert r.rc in (0, 1), r
    verdict = r.json()
    assert verdict["allowed"] is (r.rc == 0), r
    return verdict


def query(flow: Flow, tool: str, *policies: Path) -> Run:
    args = [a for p in policies for a in ("--policy", str(p))]
    return flow.ctx("policy", "query", *args, LABEL, f"tool:{tool}", "execute")


# ====================================================================== tiers and CTX_PATH


def test_flow_one_tool_name_in_three_tiers_resolves_as_each_caller_sees_it(flow):
    """T-8, T-8a, T-4, X-1, P-6: a manifest is checked, installed as ``text.upper`` in the
    user tier, in a shared space made for the agent's group and later in the system tier; the
    human's ``ctx object which`` and the agent's call each take the first executable on their
    own ``CTX_PATH``, and the controls (the policy) beside that executable decide the call."""
    agent_user = nobody()
    user_m = flow.manifest("text.upper", "#!/bin/sh\necho from-user\n")
    check = flow.ctx("object", "check", user_m)
    assert (check.rc, check.out.strip()) == (0, f"{user_m}: valid (text.upper)"), check
    installed = flow.install(user_m, "user")
    user_path = flow.storage / "home" / "0" / "tool" / "text.upper"
    assert installed.out.strip() == f"installed text.upper in tier user: {user_path}", installed
    assert os.access(user_path, os.X_OK) and (user_path.parent / "text.upper.d").is_dir()

    made = flow.ctx("shared", "create", "lab", "--group", str(agent_user.pw_gid))
    assert made.rc == 0, made
    lab_m = flow.manifest("text.upper.lab", "#!/bin/sh\necho from-lab\n")
    document = json.loads(lab_m.read_text())
    lab_m.write_text(json.dumps({**document, "name": "text.upper"}))
    flow.install(lab_m, "shared:lab")
    lab_path = flow.storage / "shared" / "lab" / "tool" / "text.upper"
    assert lab_path.stat().st_gid == agent_user.pw_gid  # the space's group

    listed = flow.ctx("object", "list", "--json")
    assert listed.rc == 0, listed
    mine = {(t["tier"], t["path"], t["status"]) for t in listed.json() if t["name"] == "text.upper"}
    assert mine == {("user", str(user_path), "available"),
                    ("shared:lab", str(lab_path), "available")}, listed  # fmt: skip
    only_lab = flow.ctx("object", "list", "--tier", "shared:lab", "--json")
    assert [t["path"] for t in only_lab.json()] == [str(lab_path)], only_lab

    # The human: the default path is /ctx/tool:/ctx/home/<uid>/tool, mapped onto the root.
    if not os.path.ismount("/ctx"):
        which = flow.ctx("object", "which", "text.upper")
        assert (which.rc, which.out.strip()) == (0, str(user_path)), which
        lab_first = flow.env(CTX_PATH="/ctx/shared/lab/tool:/ctx/home/0/tool")
        which = flow.ctx("object", "which", "text.upper", env=lab_first)
        assert (which.rc, which.out.strip()) == (0, str(lab_path)), which

    # The agent (uid nobody): its path holds its own home's tier and the spaces it may read,
    # never root's user tier.
    flow.create_agent(["text.upper"], shared={"lab": ["read"]})
    shown = flow.ctx("agent", "show", "coder", "--json")
    assert shown.rc == 0, shown
    ctx_path = shown.json()["ctx_path"]
    assert ctx_path.split(":") == ["/ctx/tool", f"/ctx/home/{agent_user.pw_uid}/tool",
                                   "/ctx/shared/lab/tool"], shown  # fmt: skip
    refused = flow.run("text.upper")
    assert refused.rc == 126, refused
    assert "step 6" in refused.err and "shared/lab/tool/text.upper.d/policy" in refused.err
    flow.add_rule(lab_path.parent / "text.upper.d" / "policy",
                  f"allow {LABEL} tool:text.upper execute")  # fmt: skip
    ran = flow.run("text.upper")
    assert (ran.rc, ran.out) == (0, "from-lab\n"), ran

    # The system tier comes first on both paths; its policy, not the space's, now decides.
    sys_m = flow.manifest("text.upper.sys", "#!/bin/sh\necho from-system\n")
    sys_m.write_text(json.dumps({**json.loads(sys_m.read_text()), "name": "text.upper"}))
    flow.install(sys_m, "system")
    sys_path = flow.storage / "tool" / "text.upper"
    if not os.path.ismount("/ctx"):
        which = flow.ctx("object", "which", "text.upper")
        assert which.out.strip() == str(sys_path), which
    refused = flow.run("text.upper")
    assert refused.rc == 126 and "tool/text.upper.d/policy" in refused.err, refused
    assert "shared/lab" not in refused.err, refused
    flow.add_rule(sys_path.parent / "text.upper.d" / "policy",
                  f"allow {LABEL} tool:text.upper execute")  # fmt: skip
    ran = flow.run("text.upper")
    assert (ran.rc, ran.out) == (0, "from-system\n"), ran

    # S-2, T-7: each call names the tool where the agent's path found it, and is a line of
    # the log beside that executable.
    shown = flow.ctx("session", "show", "coder", "--json")
    results = [json.loads(line) for line in shown.lines()]
    results = [(e["object"], e["status"]) for e in results if e["type"] == "tool_result"]
    lab_obj, sys_obj = "shared/lab/tool/text.upper", "tool/text.upper"
    assert results == [(lab_obj, "error"), (lab_obj, "ok"), (sys_obj, "error"), (sys_obj, "ok")]
    for tier_dir, statuses in (
        (lab_path.parent, ["error", "ok"]),
        (sys_path.parent, ["error", "ok"]),
    ):
        log = (tier_dir / "text.upper.d" / "log").read_text().splitlines()
        logged = [json.loads(line) for line in log]
        assert [e["status"] for e in logged if e["type"] == "tool_result"] == statuses, log
        assert {e["session_dir"] for e in logged} == {
            f"home/{agent_user.pw_uid}/agent/coder/session/default"}, log  # fmt: skip
    assert (user_path.parent / "text.upper.d" / "log").read_text() == ""


# ====================================================================== policy vs ctx run


def test_flow_policy_check_query_and_explain_agree_with_what_ctx_run_does(flow):
    """P-6, P-5, P-8: as the user edits the agent's and the tool's policies, ``ctx policy
    check`` validates both files, ``ctx policy query`` with both gives the two-layer answer,
    ``ctx policy explain`` names the denying step, and ``ctx run`` in both modes does exactly
    that: runs when both allow, else ``EACCES`` naming the same step; an invalid tool policy
    is reported by check and query and grants nothing in a call."""
    flow.install(flow.manifest("demo.echo", ECHO, ECHO_SCHEMA), "system")
    flow.create_agent(["demo.echo"])
    tool_policy = flow.storage / "tool" / "demo.echo.d" / "policy"
    rule = f"allow {LABEL} tool:demo.echo execute"

    def agreed(expect_step: int | None) -> None:
        checked = flow.ctx("policy", "check", flow.agent_policy, tool_policy)
        assert (checked.rc, checked.err) == (0, ""), checked
        both = query(flow, "demo.echo", flow.agent_policy, tool_policy)
        assert both.out.strip() == ("allow" if expect_step is None else "deny"), both
        assert both.rc == (0 if expect_step is None else 1), both
        verdict = explain(flow, "demo.echo")
        assert verdict["step"] == expect_step, verdict
        term = flow.run("demo.echo", "hi")
        native, frames = flow.native("demo.echo", {"text": "hi"})
        result = result_frame(frames)
        if expect_step is None:
            assert term.rc == 0 and json.loads(term.out) == {"argv": ["hi"]}, term
            assert native.rc == 0 and result["output"] == {"input": {"text": "hi"}}, native
        else:
            assert term.rc == 126 and f"EACCES: step {expect_step} " in term.err, term
            assert native.rc == 1, native
            error = result["error"]
            assert (error["error"], error["stage"], error["step"]) == (
                "EACCES", "authorize", expect_step), result  # fmt: skip
            assert error["step_name"] == verdict["step_name"], (error, verdict)

    # Right after create: the agent's layer holds the rule, the tool's does not (install
    # granted nothing): one layer alone allows in a query of that layer only.
    assert rule in flow.agent_policy.read_text().splitlines()
    alone = query(flow, "demo.echo", flow.agent_policy)
    assert (alone.rc, alone.out.strip()) == (0, "allow"), alone
    agreed(6)
    flow.add_rule(tool_policy, rule)
    agreed(None)
    runs = flow.ran().count("demo.echo")
    flow.drop_rule(flow.agent_policy, rule)
    agreed(5)
    flow.add_rule(flow.agent_policy, rule)
    agreed(None)
    assert flow.ran().count("demo.echo") == runs + 2  # denied calls never ran the tool

    # A typo in the tool's policy: the file is invalid, so it grants nothing at all.
    flow.add_rule(tool_policy, f"allow {LABEL} tool:demo.echo exec")
    checked = flow.ctx("policy", "check", tool_policy)
    line = len(tool_policy.read_text().splitlines())
    assert checked.rc == 1 and checked.err.startswith(f"{tool_policy}:{line}: EINVAL: "), checked
    malformed = query(flow, "demo.echo", flow.agent_policy, tool_policy)
    assert malformed.rc == 2 and "EINVAL" in malformed.err, malformed
    assert explain(flow, "demo.echo")["step"] == 6
    term = flow.run("demo.echo", "hi")
    assert term.rc == 126 and "EACCES: step 6 " in term.err, term
    assert flow.ran().count("demo.echo") == runs + 2


# ====================================================================== calls, hooks, records


def test_flow_calls_in_both_modes_with_hooks_are_recorded_and_a_torn_line_repaired(flow):
    """T-3, T-6, T-7, S-2, S-5: a user's tool with a guard in ``hooks/pre.d`` and an auditor
    in ``hooks/post.d`` is called in terminal and native mode while the user watches the
    session with ``ctx session tail --follow --json``; a schema error is ``EINVAL`` before any
    hook, the guard's veto is ``EACCES`` naming it (exit 126 in terminal mode), the auditor
    sees each result; every call is a ``tool_call``/``tool_result`` pair of the S-2 shape in
    ``ctx session show --json`` and in what the watcher printed, and a line of the tool's log;
    a torn line appended by hand is ignored by readers and removed by ``ctx session repair``,
    after which calls are recorded (and watched) as before."""
    uid = nobody().pw_uid
    flow.install(flow.manifest("demo.echo", ECHO, ECHO_SCHEMA), "system")
    controls = flow.storage / "tool" / "demo.echo.d"
    flow.add_rule(controls / "policy", f"allow {LABEL} tool:demo.echo execute")
    for kind, name, body in (("pre", "10-guard", GUARD), ("post", "20-audit", AUDIT)):
        hook = controls / "hooks" / f"{kind}.d" / name
        hook.write_text(body)
        hook.chmod(0o755)
    flow.create_agent(["demo.echo"])
    session_dir = flow.storage / "home" / str(uid) / "agent" / "coder" / "session" / "s1"
    events_file = session_dir / "events.jsonl"

    term = flow.run("demo.echo", "hello", "two words", session="s1")
    assert term.rc == 0 and json.loads(term.out) == {"argv": ["hello", "two words"]}, term
    assert flow.ran() == ["10-guard", "demo.echo", "20-audit"]
    assert events_file.is_file()  # S-1: the session is an ordinary directory, made on use

    watched = flow.top / "watched.jsonl"
    with watched.open("wb") as out:
        watcher = subprocess.Popen(
            [*CTX_ARGV, "session", "tail", "coder", "s1", "--follow", "--json", "-n", "2"],
            stdout=out, stderr=subprocess.DEVNULL, env=flow.env(), start_new_session=True,
        )  # fmt: skip
    try:
        calls_while_watched(flow, controls, events_file, watched)
    finally:
        if watcher.poll() is None:
            os.killpg(watcher.pid, signal.SIGTERM)
        watcher.wait(timeout=10)


def watched_events(watched: Path) -> list[dict]:
    return [json.loads(line) for line in watched.read_bytes().splitlines()]


def calls_while_watched(flow: Flow, controls: Path, events_file: Path, watched: Path) -> None:
    uid = nobody().pw_uid
    calls: list[tuple[str, str, str | None]] = []  # (call, status, errno), in order
    assert wait_for(lambda: len(watched_events(watched)) == 2, 10)

    ok, frames = flow.native("demo.echo", {"text": "hi"}, session="s1")
    assert ok.rc == 0, ok
    assert [f["type"] for f in frames] == ["call", "result"], frames
    result = frames[-1]
    assert frames[0]["call"] == result["call"] and isinstance(frames[0]["pid"], int), frames
    assert (result["status"], result["output"], result["exit_status"]) == (
        "ok", {"input": {"text": "hi"}}, 0), result  # fmt: skip
    assert result["session"] == f"home/{uid}/agent/coder/session/s1", result
    calls.append((result["call"], "ok", None))

    bad, frames = flow.native("demo.echo", {"text": 5}, session="s1")
    error = result_frame(frames)["error"]
    assert bad.rc == 2 and (error["error"], error["stage"]) == ("EINVAL", "schema"), bad
    calls.append((result_frame(frames)["call"], "error", "EINVAL"))

    vetoed, frames = flow.native("demo.echo", {"text": "forbidden"}, session="s1")
    error = result_frame(frames)["error"]
    assert vetoed.rc == 1 and (error["error"], error["stage"]) == ("EACCES", "hook"), vetoed
    assert "10-guard" in error["message"], error
    assert "the guard refuses forbidden words" in error["message"], error
    calls.append((result_frame(frames)["call"], "error", "EACCES"))

    term_veto = flow.run("demo.echo", "a", "forbidden", "word", session="s1")
    assert term_veto.rc == 126, term_veto
    assert "EACCES" in term_veto.err and "10-guard" in term_veto.err, term_veto
    assert term_veto.out == "", term_veto
    # The schema error ran nothing; each veto ran the guard alone.
    assert flow.ran() == ["10-guard", "demo.echo", "20-audit"] * 2 + ["10-guard"] * 2

    audits = {p.name: json.loads(p.read_text()) for p in flow.workspace.glob("audit-*.json")}
    assert len(audits) == 2, audits
    seen = audits[f"audit-{calls[0][0]}.json"]
    assert (seen["hook"], seen["tool"], seen["call"]) == ("post", "demo.echo", calls[0][0])
    assert seen["input"] == {"text": "hi"}, seen
    assert seen["result"]["output"] == {"input": {"text": "hi"}}, seen
    assert seen["result"]["exit_status"] == 0, seen

    shown = flow.ctx("session", "show", "coder", "s1", "--json")
    assert shown.rc == 0, shown
    events = [json.loads(line) for line in shown.lines()]
    assert [e["type"] for e in events] == ["tool_call", "tool_result"] * 5, events
    for event in events:
        assert list(event)[:6] == ["ts", "type", "agent", "session", "object", "status"], event
        assert (event["agent"], event["session"], event["object"]) == (
            "coder", "s1", "tool/demo.echo"), event  # fmt: skip
    results = [(e["call"], e["status"], e.get("errno")) for e in events
               if e["type"] == "tool_result"]  # fmt: skip
    assert results[1:4] == calls, results
    assert results[4][1:] == ("error", "EACCES"), results
    tail = flow.ctx("session", "tail", "coder", "s1", "-n", "3", "--json")
    assert [json.loads(line) for line in tail.lines()] == events[-3:], tail
    logged = [json.loads(line) for line in (controls / "log").read_text().splitlines()]
    assert [e["call"] for e in logged if e.get("type") == "tool_result"][-5:] == [
        r[0] for r in results], logged  # fmt: skip
    # The watcher printed the last two events it found, then each one as it came.
    assert wait_for(lambda: watched_events(watched) == events, 10), watched.read_text()

    # S-5: a torn last line, as a crash in the middle of an append leaves it.
    whole = events_file.read_bytes()
    torn = b'{"ts":"2026-12-01T00:00:00Z","type":"tool_call","agent":"co'
    with events_file.open("ab") as f:
        f.write(torn)
    again = flow.ctx("session", "show", "coder", "s1", "--json")
    assert again.rc == 0 and [json.loads(line) for line in again.lines()] == events, again
    assert "torn" in again.err and "ctx session repair" in again.err, again
    repaired = flow.ctx("session", "repair", "coder", "s1", "--json")
    assert repaired.rc == 0, repaired
    report = repaired.json()
    assert report["truncated_bytes"] == len(torn), report
    assert report["session"] == f"home/{uid}/agent/coder/session/s1", report
    assert events_file.read_bytes() == whole
    nothing = flow.ctx("session", "repair", "coder", "s1", "--json")
    assert nothing.rc == 0 and nothing.json()["truncated_bytes"] == 0, nothing
    after = flow.run("demo.echo", "after", session="s1")
    assert after.rc == 0, after
    lines = events_file.read_bytes().splitlines(keepends=True)
    assert len(lines) == 12 and all(line.endswith(b"\n") for line in lines), lines
    latest = [json.loads(line) for line in lines[-2:]]
    assert [e["type"] for e in latest] == ["tool_call", "tool_result"], latest
    assert wait_for(lambda: watched_events(watched)[-2:] == latest, 10), watched.read_text()
    assert len(watched_events(watched)) == 12, watched.read_text()


# ====================================================================== ctx mount


@pytest.fixture
def mounts(flow: Flow) -> Path:
    """Where this flow mounts its views (outside the storage root)."""
    place = flow.top / "mnt"
    place.mkdir()
    return place


@needs_fuse
def test_flow_the_host_view_runs_tools_as_files_and_keeps_what_is_written(flow, mounts):
    """F-1, T-2, T-4, X-1: the host view mounted with ``ctx mount`` shows the root ABI; its
    ``tool/fs.read '{"path":"README.md"}'`` and ``echo '{"cmd":"pwd"}' | tool/shell.exec``
    run as files; ``CTX_PATH`` may name the mount; a file written and fsynced through it is on
    the storage root and an agent reads it with ``ctx run``; ``ctx umount`` ends it cleanly."""
    agent_user = nobody()
    made = flow.ctx("shared", "create", "lab", "--group", str(agent_user.pw_gid))
    assert made.rc == 0, made
    flow.install(flow.manifest("text.upper", "#!/bin/sh\necho from-user\n"), "user")
    flow.create_agent(["fs.read"], shared={"lab": ["read"]})
    flow.add_rule(flow.storage / "tool" / "fs.read.d" / "policy",
                  f"allow {LABEL} tool:fs.read execute")  # fmt: skip
    view = mounts / "ctx"
    cwd = flow.top / "project"
    cwd.mkdir()
    (cwd / "README.md").write_text("read me through the mount\n")
    with ctx_mount(flow.storage, view) as proc:
        assert set(os.listdir(view)) == ROOT_ENTRIES
        read = subprocess.run([view / "tool" / "fs.read", '{"path":"README.md"}'], cwd=cwd,
                              capture_output=True, text=True, env=clean_env(), timeout=60,
                              stdin=subprocess.DEVNULL)  # fmt: skip
        assert read.returncode == 0 and "read me through the mount" in read.stdout, read
        pwd_ = subprocess.run([view / "tool" / "shell.exec"], input='{"cmd":"pwd"}',
                              cwd=cwd, capture_output=True, text=True, env=clean_env(),
                              timeout=60)  # fmt: skip
        assert (pwd_.returncode, pwd_.stdout.strip()) == (0, str(cwd)), pwd_

        # T-4 with the view on the path: the first executable wins, seen through the mount.
        on_path = flow.env(CTX_PATH=f"{view}/home/0/tool:{view}/tool")
        which = flow.ctx("object", "which", "text.upper", env=on_path)
        assert (which.rc, which.out.strip()) == (0, f"{view}/home/0/tool/text.upper"), which

        data = view / "shared" / "lab" / "data"
        write_durably(data, "notes.txt", b"written through the host view\n")
        behind = flow.storage / "shared" / "lab" / "data" / "notes.txt"
        assert behind.read_bytes() == b"written through the host view\n"
        assert behind.stat().st_gid == agent_user.pw_gid  # the space's setgid group
        r, frames = flow.native("fs.read", {"path": "/ctx/shared/lab/data/notes.txt"})
        assert r.rc == 0, r
        assert result_frame(frames)["output"]["content"] == "written through the host view\n"

        # A shell still in the view keeps it busy; once it leaves, the view unmounts cleanly.
        inside = subprocess.Popen(["sleep", "30"], cwd=data)
        try:
            busy = ctx_run("umount", view)
            assert busy.rc == 1 and "EBUSY" in busy.err, busy
            assert mounted_at(view) and set(os.listdir(view)) == ROOT_ENTRIES
        finally:
            inside.kill()
            inside.wait()
        done = ctx_run("umount", view)
        assert done.rc == 0, done
        proc.wait(timeout=MOUNT_WAIT)
        assert proc.returncode == 0
        assert not mounted_at(view) and os.listdir(view) == []


def view_tools(view: Path) -> set[str]:
    return {name for name in os.listdir(view / "tool") if not name.endswith(".d")}


@needs_fuse
def test_flow_the_agent_view_follows_both_policies_within_a_second(flow, mounts):
    """F-1, T-5, P-6: ``ctx mount --as coder`` lists exactly the tools ``ctx policy explain``
    allows; the tool's rule added shows the tool within about a second, the agent's rule taken
    out hides it (``ENOENT``) as ``ctx run`` starts refusing it at step 5; walking the view
    creates nothing on the storage root, and ``ctx umount`` ends it cleanly."""
    nobody()
    flow.create_agent(["fs.read", "fs.list"])
    fs_read_policy = flow.storage / "tool" / "fs.read.d" / "policy"
    flow.add_rule(flow.storage / "tool" / "fs.list.d" / "policy",
                  f"allow {LABEL} tool:fs.list execute")  # fmt: skip
    core = ["fs.read", "fs.list", "fs.stat", "fs.write", "shell.exec", "tsh.config"]
    view = mounts / "coder"
    with ctx_mount(flow.storage, view, "--as", "coder") as proc:
        allowed = {name for name in core if explain(flow, name)["allowed"]}
        assert allowed == {"fs.list"}
        assert view_tools(view) == allowed, os.listdir(view / "tool")
        with pytest.raises(FileNotFoundError):
            os.stat(view / "tool" / "fs.read")

        started = time.monotonic()
        flow.add_rule(fs_read_policy, f"allow {LABEL} tool:fs.read execute")
        assert wait_for(lambda: view_tools(view) == {"fs.read", "fs.list"}, 5, 0.02)
        assert time.monotonic() - started < 2.0  # docs/mount.md: within a second
        assert os.access(view / "tool" / "fs.read", os.X_OK)
        assert flow.native("fs.read", {"path": "/ctx/tool/fs.read.d/name"})[0].rc == 0
        # The agent's tools see the same /ctx as this view (docs/mount.md).
        for place in ("tool", "shared", "agent"):
            r, frames = flow.native("fs.list", {"path": f"/ctx/{place}"})
            assert r.rc == 0, r
            listed = {e["name"] for e in result_frame(frames)["output"]["entries"]}
            assert listed == set(os.listdir(view / place)), (place, listed)

        started = time.monotonic()
        flow.drop_rule(flow.agent_policy, f"allow {LABEL} tool:fs.read execute")
        assert wait_for(lambda: view_tools(view) == {"fs.list"}, 5, 0.02)
        assert wait_for(lambda: not os.path.lexists(view / "tool" / "fs.read"), 5, 0.02)
        assert time.monotonic() - started < 2.5
        assert explain(flow, "fs.read")["step"] == 5
        refused = flow.run("fs.read", "/ctx/tool/fs.read.d/name")
        assert refused.rc == 126 and "EACCES: step 5 " in refused.err, refused

        # T-5: the projection is computed in memory: looking, reading and being refused
        # leave the storage root as it was.
        before = snapshot(flow.storage)
        for top, _dirs, files in os.walk(view):
            for name in files:
                with contextlib.suppress(OSError):
                    Path(top, name).read_bytes()
        for hidden in ("tool/shell.exec", "tool/fs.read.d/policy", "agent/other"):
            with pytest.raises(FileNotFoundError):
                os.stat(view / hidden)
        with pytest.raises(OSError) as denied:
            (view / "tool" / "planted").write_text("x")
        assert denied.value.errno in (errno.EACCES, errno.EROFS, errno.EPERM), denied.value
        assert snapshot(flow.storage) == before

        done = ctx_run("umount", view)
        assert done.rc == 0, done
        proc.wait(timeout=MOUNT_WAIT)
        assert proc.returncode == 0 and not mounted_at(view)


@needs_fuse
def test_flow_host_and_agent_views_side_by_side(flow, mounts):
    """F-1, T-5, R-2: two mounts of one root at once: the host view shows every tool and
    every agent, the agent's view only what passes its chain and only itself; a tool
    installed while both are mounted appears in the host view and, once both policies allow
    it, in the agent's; unmounting one leaves the other serving."""
    flow.create_agent(["demo.late"])
    # A second agent the coder must not see.
    other = flow.top / "other.json"
    other.write_text(json.dumps({"name": "other", "label": "other_t", "tools": []}))
    assert flow.ctx("agent", "create", other).rc == 0
    host, agent = mounts / "host", mounts / "agent"
    with ctx_mount(flow.storage, host), ctx_mount(flow.storage, agent, "--as", "coder") as ap:
        assert {"coder", "coder.d", "other", "other.d"} <= set(os.listdir(host / "agent"))
        assert set(os.listdir(agent / "agent")) <= {"coder", "coder.d"}
        assert "other" not in os.listdir(agent / "agent")
        assert "fs.read" in os.listdir(host / "tool") and view_tools(agent) == set()

        flow.install(flow.manifest("demo.late", "#!/bin/sh\necho late\n"), "system")
        assert wait_for(lambda: "demo.late" in os.listdir(host / "tool"), 3, 0.02)
        time.sleep(1.2)  # longer than both caches: installing alone grants nothing (T-8)
        assert "demo.late" not in view_tools(agent)
        flow.add_rule(flow.storage / "tool" / "demo.late.d" / "policy",
                      f"allow {LABEL} tool:demo.late execute")  # fmt: skip
        assert wait_for(lambda: view_tools(agent) == {"demo.late"}, 3, 0.02)
        assert (agent / "tool" / "demo.late.d" / "description").read_text().strip()

        done = ctx_run("umount", agent)
        assert done.rc == 0, done
        ap.wait(timeout=MOUNT_WAIT)
        assert not mounted_at(agent) and mounted_at(host)
        assert set(os.listdir(host)) == ROOT_ENTRIES
        st = (host / "tool" / "demo.late").stat()
        assert stat.S_ISREG(st.st_mode) and st.st_mode & 0o111


@needs_fuse
def test_flow_a_space_made_without_the_agents_group_denies_at_step_2_until_regrouped(flow, mounts):
    """X-1, P-5, T-5: a space made with the default group (the caller's) holds a tool both
    policies allow, yet the agent's uid may not enter the space: ``ctx policy explain``, both
    modes of ``ctx run`` and the agent's view agree on step 2 (mode bits); ``ctx shared
    create NAME --group G`` regroups the space and the same call runs, the view showing the
    space within about a second."""
    agent_user = nobody()
    assert flow.ctx("shared", "create", "lab").rc == 0
    flow.install(flow.manifest("lab.note", "#!/bin/sh\necho lab-note\n"), "shared:lab")
    space = flow.storage / "shared" / "lab"
    flow.add_rule(space / "tool" / "lab.note.d" / "policy", f"allow {LABEL} tool:lab.note execute")
    flow.create_agent(["lab.note"], shared={"lab": ["read"]})
    view = mounts / "coder"
    with ctx_mount(flow.storage, view, "--as", "coder"):
        assert "lab" not in os.listdir(view / "shared")
        verdict = explain(flow, "lab.note")
        assert (verdict["step"], verdict["errno"]) == (2, "EACCES"), verdict
        term = flow.run("lab.note")
        assert term.rc == 126 and "EACCES: step 2 (mode bits)" in term.err, term
        native, frames = flow.native("lab.note", {})
        error = result_frame(frames)["error"]
        assert native.rc == 1 and (error["step"], error["step_name"]) == (2, "mode bits"), native

        regrouped = flow.ctx("shared", "create", "lab", "--group", str(agent_user.pw_gid))
        assert regrouped.rc == 0 and "regrouped" in regrouped.out, regrouped
        assert space.stat().st_gid == agent_user.pw_gid
        assert explain(flow, "lab.note")["allowed"] is True
        ran = flow.run("lab.note")
        assert (ran.rc, ran.out) == (0, "lab-note\n"), ran
        assert wait_for(lambda: "lab" in os.listdir(view / "shared"), 3, 0.02)
        assert "lab.note" in os.listdir(view / "shared" / "lab" / "tool")

        # Revoking the space's read takes it off the agent's path and out of its view.
        flow.drop_rule(flow.agent_policy, f"allow {LABEL} shared:lab read")
        assert wait_for(lambda: "lab" not in os.listdir(view / "shared"), 3, 0.02)
        shown = flow.ctx("agent", "show", "coder", "--json")
        assert "/ctx/shared/lab/tool" not in shown.json()["ctx_path"], shown
        gone = flow.run("lab.note")
        assert gone.rc == 127 and "ENOENT" in gone.err, gone
        assert explain(flow, "lab.note")["errno"] == "ENOENT"
