"""End-to-end flows of policy v0 and the six-step authority chain (SPEC §5) as an administrator
lives them: policies edited while agents work, and every consumer of the chain — ``ctx run``
in both modes, a running ``ctx queue work``, ``ctx mount --as AGENT``, ``ctx agent show`` —
asked the same question as ``ctx policy explain`` right after each edit; a policy broken in
the middle of use (a malformed line, a symbolic link, a FIFO, a directory, a file its owner
may no longer read) failing closed and healing when it is fixed; shared-space grants and
Linux group membership deciding together who reaches ``shared/<name>/data`` and its queue;
and the session records of each refused call."""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    QueueCLI,
    Run,
    clean_env,
    ctx_mount,
    ctx_run,
    needs_fuse,
    scratch_top,
    tool_manifest,
    wait_for,
)
from tests.support.storage import copy_of_root
from tests.support.users import run_as
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as another uid")


SCRATCH = scratch_top(__file__)
AGENT, LABEL, TOOL = "ci", "ci_t", "demo.echo"
RULE = f"allow {LABEL} tool:{TOOL} execute"
SECRET = "hunter2-policy-flow-7731"  # under a key naming a secret: never in a log (S-4)
ECHO = "#!/bin/sh\ncat\n"  # prints its input back
S2_KEYS = ["ts", "type", "agent", "session", "object", "status"]
WAIT = 20.0


def nobody() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody: root's default agent user (docs/tools.md)")


@dataclass
class Admin(OnStorage):
    """An administrator's storage root (every uid may search it) with ``demo.echo``
    installed and agent ``ci`` made by ``ctx agent create`` with it in its policy."""

    top: Path

    @property
    def storage(self) -> Path:
        return self.top / "storage"

    @property
    def agent_policy(self) -> Path:
        return self.storage / "agent" / f"{AGENT}.d" / "policy"

    @property
    def tool_policy(self) -> Path:
        return self.storage / "tool" / f"{TOOL}.d" / "policy"

    def explain(self, obj: str = f"tool:{TOOL}", perm: str = "execute", agent: str = AGENT) -> dict:
        r = self.ctx("policy", "explain", agent, obj, perm, "--json")
        assert r.rc in (0, 1), r
        verdict = r.json()
        assert verdict["allowed"] is (r.rc == 0), r
        return verdict

    def native(self, value, tool: str = TOOL, agent: str = AGENT) -> tuple[Run, dict]:
        r = self.ctx("run", "--native", "--agent", agent, tool, input=json.dumps(value),
                     timeout=WAIT)  # fmt: skip
        frames = [json.loads(line) for line in r.lines()]
        assert frames and frames[-1]["type"] == "result", r
        return r, frames[-1]

    def terminal(self, tool: str = TOOL) -> Run:
        return self.ctx("run", "--agent", AGENT, tool, input='{"t": 1}', timeout=WAIT)

    def events(self, session: str, agent: str = AGENT) -> list[dict]:
        path = self.session_file(session, agent)
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def session_file(self, session: str, agent: str = AGENT) -> Path:
        uid = nobody().pw_uid
        return self.storage / "home" / str(uid) / "agent" / agent / "session" / session / (
            "events.jsonl")  # fmt: skip


def add_rule(policy: Path, rule: str) -> None:
    with policy.open("a") as f:
        f.write(rule + "\n")


def replace_text(policy: Path, text: str) -> None:
    """The file rewritten as a careful administrator does: a temp file renamed over it."""
    temp = policy.with_name(policy.name + ".edit")
    temp.write_text(text)
    temp.chmod(0o644)
    os.replace(temp, policy)


def drop_rule(policy: Path, rule: str) -> None:
    lines = policy.read_text().splitlines(keepends=True)
    assert rule + "\n" in lines, policy.read_text()
    replace_text(policy, "".join(line for line in lines if line != rule + "\n"))


@pytest.fixture(scope="session")
def _admin_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A storage root bootstrapped, with queue ``proj`` and ``demo.echo`` installed (its own
    policy granting nobody): made once per test process, copied per test."""
    top = tmp_path_factory.mktemp("policy-template")
    storage = top / "storage"
    assert ctx_run("bootstrap", "--storage", storage).rc == 0
    env = clean_env(CTX_STORAGE=str(storage))
    assert ctx_run("queue", "init", "--project", "proj", env=env).rc == 0
    manifest = tool_manifest(top / "src", TOOL, ECHO)
    r = ctx_run("object", "install", manifest, "--tier", "system", env=env)
    assert r.rc == 0, r
    return storage


@pytest.fixture
def admin(_admin_template: Path) -> Iterator[Admin]:
    SCRATCH.mkdir(exist_ok=True)
    SCRATCH.chmod(0o755)
    top = Path(tempfile.mkdtemp(prefix="admin-", dir=SCRATCH))
    top.chmod(0o755)
    admin = Admin(top)
    try:
        nobody()
        copy_of_root(_admin_template, admin.storage)
        req = {"name": AGENT, "label": LABEL, "tools": [TOOL]}
        r = admin.ctx("agent", "create", "-", input=json.dumps(req))
        assert r.rc == 0, r
        yield admin
    finally:
        shutil.rmtree(top, ignore_errors=True)


@contextlib.contextmanager
def worker(admin: Admin, project: str = "proj", agent: str = AGENT) -> Iterator[QueueCLI]:
    """``ctx queue work`` waiting for jobs (no ``--drain``) for the length of the block, then
    stopped with SIGTERM, which it must obey with exit 0 (W-4)."""
    argv = [*CTX_ARGV, "queue", "work", "--project", project, "--agent", agent, "--json"]
    proc = subprocess.Popen(argv, env=admin.env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        yield QueueCLI(admin.storage, project)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=WAIT)
        assert proc.returncode == 0, (out, err)
        assert json.loads(out.splitlines()[-1])["event"] == "stop", out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def job_outcome(queue: QueueCLI, value: dict, tool: str = TOOL) -> tuple[str, dict]:
    """Publish one job and wait for the running worker to finish it: its state and result."""
    req = {"tool": tool, "input": value, "from": "admin", "created": "2026-12-01T00:00:00Z"}
    job = queue.publish(req)
    assert wait_for(lambda: queue.state(job) in ("done", "failed"), WAIT), (
        job, queue.state(job), os.listdir(queue.dir / "claimed"))  # fmt: skip
    state = queue.state(job)
    return state, json.loads((queue.dir / state / f"{job}.result").read_text())


def in_flight(queue: QueueCLI) -> list[str]:
    """What ``claimed/`` and ``lease/`` still hold."""
    return os.listdir(queue.dir / "claimed") + os.listdir(queue.dir / "lease")


def agree(
    admin: Admin, queue: QueueCLI, step: int | None, n: int, says: str = "", terminal: bool = True
) -> dict:
    """``ctx policy explain``, ``ctx run`` (native, and terminal unless told) and the running
    worker's next job give one answer: allowed, or EACCES at ``step`` for the same reason
    (holding ``says``)."""
    verdict = admin.explain()
    assert verdict["step"] == step, verdict
    value = {"n": n, "password": SECRET, "note": "x" * 400}
    r, result = admin.native(value)
    term = admin.terminal() if terminal else None
    state, job = job_outcome(queue, value)
    if step is None:
        assert [s["result"] for s in verdict["steps"]] == ["pass"] * 6, verdict
        assert (r.rc, result["status"], result["output"]) == (0, "ok", value), r
        assert term is None or (term.rc, json.loads(term.out)) == (0, {"t": 1}), term
        assert (state, job["status"], job["output"]) == ("done", "ok", value), job
        return verdict
    reason = verdict["reason"]
    assert says in reason and reason.startswith(f"step {step} "), verdict
    assert verdict["errno"] == "EACCES", verdict
    results = [s["result"] for s in verdict["steps"]]
    assert results == ["pass"] * (step - 1) + ["deny"] + ["not reached"] * (6 - step), verdict
    error = result["error"]
    assert r.rc == 1 and result["exit_status"] is None, r
    assert (error["error"], error["stage"], error["step"]) == ("EACCES", "authorize", step), r
    assert error["message"] == reason, (error, verdict)
    assert term is None or (term.rc == 126 and f"EACCES: {reason}" in term.err), term
    assert state == "failed" and job["status"] == "error", job
    assert (job["error"]["error"], job["error"]["step"]) == ("EACCES", step), job
    assert job["reason"] == f"EACCES: {reason} [authorize]", job
    assert job["exit_status"] is None, job
    return verdict


def refusals(events: list[dict]) -> list[tuple[str, int | None]]:
    """The outcome of each tool call recorded: ``("ok", None)`` or ``(errno, step)``."""
    out = []
    for event in events:
        assert list(event)[:6] == S2_KEYS, event  # S-2: the six keys first, in that order
        if event["type"] == "tool_result":
            out.append(("ok", None) if event["status"] == "ok" else (event["errno"], event["step"]))
    return out


def assert_no_leak(admin: Admin, *files: Path) -> None:
    """S-4: the secret under ``password`` is redacted and the long note cut, everywhere the
    calls were recorded."""
    for path in files:
        text = path.read_text()
        assert SECRET not in text and "x" * 300 not in text, path
    for session in ("default", "worker"):
        for event in admin.events(session):
            if event["type"] == "tool_call" and event.get("mode") == "native":
                assert event["input"]["password"] == "[redacted]", event


# ====================================================================== grants and revokes


def test_each_grant_and_revoke_reaches_run_a_running_worker_and_explain_on_the_next_call(admin):
    """P-5, P-6, W-1, S-2, S-4: with one worker waiting for jobs all along, the administrator
    grants the tool's half, revokes and restores the agent's half, then the agent's
    ``mount:ctx read``; after each edit the very next ``ctx policy explain``, ``ctx run``
    (native and terminal) and job agree step by step — the job failing with the step and
    reason in its result, never lost or left claimed — and the sessions record every refusal
    with its step, the secret in the input redacted."""
    with worker(admin) as queue:
        agree(admin, queue, 6, 1, f"tool/{TOOL}.d/policy has no rule '{RULE}'")
        add_rule(admin.tool_policy, RULE)
        agree(admin, queue, None, 2)
        drop_rule(admin.agent_policy, RULE)
        agree(admin, queue, 5, 3, f"agent/{AGENT}.d/policy has no rule '{RULE}'")
        add_rule(admin.agent_policy, RULE)
        agree(admin, queue, None, 4)
        drop_rule(admin.agent_policy, f"allow {LABEL} mount:ctx read")
        agree(admin, queue, 5, 5, f"lacks 'allow {LABEL} mount:ctx read'")
        add_rule(admin.agent_policy, f"allow {LABEL} mount:ctx read")
        agree(admin, queue, None, 6)
        # finish removes claimed/J and lease/J after the request has moved, which the
        # last job's state is read from.
        assert wait_for(lambda: not in_flight(queue), WAIT), in_flight(queue)
        assert len(os.listdir(queue.dir / "failed")) == 2 * 3
        assert len(os.listdir(queue.dir / "done")) == 2 * 3

    expected = [("EACCES", 6), ("ok", None), ("EACCES", 5), ("ok", None), ("EACCES", 5),
                ("ok", None)]  # fmt: skip
    assert refusals(admin.events("worker")) == expected
    # ctx run: a native and a terminal call per phase, in that order.
    assert refusals(admin.events("default")) == [o for o in expected for _ in (0, 1)]
    for event in admin.events("worker") + admin.events("default"):
        if event["type"] == "tool_result" and event["status"] == "error":
            assert (event["stage"], event["object"]) == ("authorize", f"tool/{TOOL}"), event
            assert event["message"].startswith(f"step {event['step']} "), event
    assert_no_leak(admin, admin.session_file("worker"), admin.session_file("default"),
                   admin.tool_policy.with_name("log"))  # fmt: skip


# ====================================================================== a policy broken mid-use


def view_tools(view: Path) -> set[str]:
    return {name for name in os.listdir(view / "tool") if not name.endswith(".d")}


@needs_fuse
def test_a_malformed_line_written_mid_use_fails_closed_everywhere_until_it_is_fixed(
    admin, tmp_path
):
    """P-1, P-3, P-5, P-8, F-1, T-5: while the agent's view is mounted and a worker waits, a
    bad line appended to the agent's policy (a typo), then to the tool's (a CRLF line), makes
    the whole file grant nothing: ``ctx policy check`` names FILE:LINE, ``explain``,
    ``ctx run``, the worker's job and ``ctx agent show`` all name the same file and line, and
    the tool leaves the view; removing the line restores every one of them."""
    add_rule(admin.tool_policy, RULE)
    view = tmp_path / "view"
    with ctx_mount(admin.storage, view, "--as", AGENT), worker(admin) as queue:
        assert wait_for(lambda: view_tools(view) == {TOOL}, 5, 0.05), os.listdir(view / "tool")
        agree(admin, queue, None, 1)

        for n, (policy, step, rel, bad, says) in enumerate(
            [  # a typo in the agent's policy; a line an editor saved with CRLF in the tool's
                (admin.agent_policy, 5, f"agent/{AGENT}.d/policy", f"{RULE[:-3]}\n", "exec"),
                (admin.tool_policy, 6, f"tool/{TOOL}.d/policy", f"{RULE}\r\n", "carriage"),
            ]
        ):
            good = policy.read_text()
            with policy.open("a", newline="") as f:
                f.write(bad)
            line = policy.read_bytes().count(b"\n")
            checked = admin.ctx("policy", "check", policy)
            assert checked.rc == 1, checked
            assert checked.err.startswith(f"{policy}:{line}: EINVAL: "), checked
            assert says in checked.err, checked
            where = f"{rel}:{line}: "
            verdict = agree(admin, queue, step, 10 + n, where)
            assert "grants nothing" in verdict["reason"] and says in verdict["reason"], verdict
            shown = admin.ctx("agent", "show", AGENT, "--json").json()
            if step == 5:
                assert any(p.startswith(where) for p in shown["problems"]), shown
            assert wait_for(lambda: TOOL not in view_tools(view), 5, 0.05)
            # Gone by name too, once the kernel's entry for it (half a second, docs/mount.md)
            # has lapsed: the listing may tell first.
            assert wait_for(lambda: not os.path.lexists(view / "tool" / TOOL), 5, 0.05)

            replace_text(policy, good)
            assert admin.ctx("policy", "check", policy).rc == 0
            agree(admin, queue, None, 20 + n)
            assert admin.ctx("agent", "show", AGENT, "--json").json()["problems"] == []
            assert wait_for(lambda: view_tools(view) == {TOOL}, 5, 0.05)
            assert os.access(view / "tool" / TOOL, os.X_OK)
    assert refusals(admin.events("worker")) == [
        ("ok", None), ("EACCES", 5), ("ok", None), ("EACCES", 6), ("ok", None)]  # fmt: skip
    assert_no_leak(admin, admin.session_file("worker"), admin.session_file("default"))


def break_file(policy: Path, kind: str, keep: Path) -> None:
    """Replace ``policy`` by ``kind``; its content moved to ``keep``."""
    os.replace(policy, keep)
    if kind == "symlink":  # to a copy holding exactly the rules it held: still no grant
        os.symlink(keep, policy)
    elif kind == "fifo":  # no writer ever comes: a reader that waits would hang
        os.mkfifo(policy)
    elif kind == "directory":
        policy.mkdir()


def restore_file(policy: Path, keep: Path) -> None:
    if policy.is_dir() and not policy.is_symlink():
        policy.rmdir()
    else:
        policy.unlink()
    os.replace(keep, policy)


@needs_fuse
def test_a_policy_replaced_by_a_link_a_fifo_or_a_directory_fails_closed_at_once(admin, tmp_path):
    """P-2, P-5, P-6, W-1 (docs/policy.md, "What the chain reads"): a policy file read
    without following a link and never waiting on a FIFO: each layer's policy replaced by a
    symbolic link to a copy of itself, a FIFO or a directory denies at that layer's step at
    once, naming the file, in ``explain``, ``ctx run``, the worker's next job (failed with
    the reason, not hung or lost) and the mounted view (F-1, T-5: the tool leaves it, the
    view keeps answering); the regular file put back restores the grant everywhere."""
    add_rule(admin.tool_policy, RULE)
    view = tmp_path / "view"
    with ctx_mount(admin.storage, view, "--as", AGENT), worker(admin) as queue:
        assert wait_for(lambda: view_tools(view) == {TOOL}, 5, 0.05)
        n = 0
        for policy, step, rel in (
            (admin.agent_policy, 5, f"agent/{AGENT}.d/policy"),
            (admin.tool_policy, 6, f"tool/{TOOL}.d/policy"),
        ):
            keep = admin.top / "kept-policy"
            for kind in ("symlink", "fifo", "directory"):
                break_file(policy, kind, keep)
                started = time.monotonic()
                n += 1
                verdict = agree(admin, queue, step, n, f"{rel} ", terminal=False)
                assert "cannot be read safely" in verdict["reason"], verdict
                # P-8 (docs/policy.md): ``check`` follows a link to a regular file, which is
                # valid, but refuses a FIFO or a directory at once; the chain takes neither.
                checked = admin.ctx("policy", "check", policy, timeout=WAIT)
                if kind == "symlink":
                    assert (checked.rc, checked.err) == (0, ""), checked
                else:
                    assert checked.rc == 1 and "not a regular file" in checked.err, checked
                # The view answers at once and drops the tool; nothing waited on the FIFO.
                assert wait_for(lambda: view_tools(view) == set(), 5, 0.05), kind
                assert time.monotonic() - started < 15, kind
                restore_file(policy, keep)
                assert admin.explain()["allowed"] is True
                assert wait_for(lambda: view_tools(view) == {TOOL}, 5, 0.05), kind
        n += 1
        agree(admin, queue, None, n)
    outcomes = refusals(admin.events("worker"))
    assert outcomes == [("EACCES", 5)] * 3 + [("EACCES", 6)] * 3 + [("ok", None)], outcomes
    assert_no_leak(admin, admin.session_file("worker"), admin.session_file("default"))


def test_a_policy_its_administrator_can_no_longer_read_fails_closed(unprivileged_user):
    """P-5, P-6 (docs/policy.md: a control that is unreadable denies with EACCES): a user who
    is not root administers a storage root of their own; a policy of either layer made
    unreadable (mode 0000) refuses their agent's call at that layer's step, naming the file,
    and mode 0644 restores it."""
    user = unprivileged_user
    SCRATCH.mkdir(exist_ok=True)
    SCRATCH.chmod(0o755)
    top = Path(tempfile.mkdtemp(prefix="owner-", dir=SCRATCH))
    try:
        top.chmod(0o755)
        os.chown(top, user.uid, user.gid)
        storage = top / "storage"
        env = clean_env(CTX_STORAGE=str(storage), HOME=str(top))

        def ctx(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
            return run_as(user, [*CTX_ARGV, *args], env=env, cwd=top, stdin=stdin)

        assert ctx("bootstrap").returncode == 0
        manifest = tool_manifest(top / "src", TOOL, ECHO)
        shutil.chown(top / "src", user.uid, user.gid)
        assert ctx("object", "install", str(manifest), "--tier", "system").returncode == 0
        req = json.dumps({"name": AGENT, "label": LABEL, "tools": [TOOL]})
        made = ctx("agent", "create", "-", stdin=req)
        assert made.returncode == 0 and f"(uid {user.uid}," in made.stdout, made
        run_as(user, ["/bin/sh", "-c", f"echo '{RULE}' >> tool/{TOOL}.d/policy"], cwd=storage)
        call = ("run", "--agent", AGENT, TOOL)
        ok = ctx(*call, stdin='{"a": 1}')
        assert (ok.returncode, ok.stdout) == (0, '{"a": 1}'), ok
        for rel, step in ((f"agent/{AGENT}.d/policy", 5), (f"tool/{TOOL}.d/policy", 6)):
            (storage / rel).chmod(0o000)
            refused = ctx(*call, stdin='{"a": 1}')
            assert refused.returncode == 126, refused
            assert f"EACCES: step {step} " in refused.stderr and rel in refused.stderr, refused
            explained = ctx("policy", "explain", AGENT, f"tool:{TOOL}", "execute", "--json")
            verdict = json.loads(explained.stdout)
            assert (explained.returncode, verdict["step"]) == (1, step), explained
            assert rel in verdict["reason"], verdict
            (storage / rel).chmod(0o644)
            again = ctx(*call, stdin='{"a": 2}')
            assert (again.returncode, again.stdout) == (0, '{"a": 2}'), again
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ====================================================================== shared spaces


def free_gid() -> int:
    taken = {g.gr_gid for g in grp.getgrall()} | {p.pw_gid for p in pwd.getpwall()}
    return next(g for g in range(47100, 48000) if g not in taken)


def test_shared_grants_and_group_membership_together_decide_data_and_queue(admin):
    """X-1, P-3, P-5 (steps 2, 3 and 5), T-5, W-1: in space ``lab`` of group G, agent ``member``
    (in G) and agent ``outsider`` (not in G) hold the same ``shared:lab read|write`` rules;
    only the member writes ``data/`` and lists the queue, and only the member's worker
    finishes a job writing there; revoking ``write`` (read-only view, step 3) then ``read``
    (step 5) narrows the member, a
    membership taken away denies at step 2, and a membership given lets the outsider in —
    ``explain`` agreeing with each call."""
    gid = free_gid()
    made = admin.ctx("shared", "create", "lab", "--group", str(gid))
    assert made.rc == 0, made
    tools = ["fs.write", "fs.list", "fs.read"]
    for name, options in (("member", ["--groups", str(gid)]), ("outsider", [])):
        req = {"name": name, "label": f"{name}_t", "tools": tools,
               "shared": {"lab": ["read", "write"]}}  # fmt: skip
        assert admin.ctx("agent", "create", *options, "-", input=json.dumps(req)).rc == 0
        for tool in tools:
            add_rule(admin.storage / "tool" / f"{tool}.d" / "policy",
                     f"allow {name}_t tool:{tool} execute")  # fmt: skip
    lab = QueueCLI(admin.storage, "lab")
    by_job = {"path": "/ctx/shared/lab/data/by-job", "content": "job"}
    req = {"tool": "fs.write", "input": by_job, "from": "admin", "created": "2026-12-01T00:00:00Z"}
    job = lab.publish(req)

    def write(agent: str, name: str) -> dict:
        value = {"path": f"/ctx/shared/lab/data/{name}", "content": agent}
        return admin.native(value, "fs.write", agent)[1]

    def listing(agent: str, where: str) -> dict:
        return admin.native({"path": f"/ctx/shared/lab/{where}"}, "fs.list", agent)[1]

    def step(agent: str, perm: str) -> int | None:
        return admin.explain("shared:lab", perm, agent)["step"]

    def refused(result: dict, errno: str) -> bool:
        return result["status"] == "error" and result["output"]["error"] == errno

    # The member, in G with both rules: writes data, sees the pending job.
    assert step("member", "write") is None and step("member", "read") is None
    assert write("member", "m1")["status"] == "ok"
    st = (admin.storage / "shared" / "lab" / "data" / "m1").stat()
    assert (st.st_uid, st.st_gid) == (nobody().pw_uid, gid)  # setgid space keeps G
    names = {e["name"] for e in listing("member", "queue/pending")["output"]["entries"]}
    assert names == {job}
    # The outsider, the same rules but not in G: the mode bits deny (step 2) everything.
    for perm in ("read", "write"):
        verdict = admin.explain("shared:lab", perm, "outsider")
        assert (verdict["step"], verdict["errno"]) == (2, "EACCES"), verdict
    assert refused(write("outsider", "o1"), "EACCES")
    assert refused(listing("outsider", "queue/pending"), "EACCES")
    assert not (admin.storage / "shared" / "lab" / "data" / "o1").exists()
    # The outsider's worker takes the job and fails it; the member's finishes it.
    with worker(admin, "lab", "outsider"):
        assert wait_for(lambda: lab.state(job) == "failed", WAIT), lab.state(job)
    failed = json.loads((lab.dir / "failed" / f"{job}.result").read_text())
    assert failed["error"]["error"] == "EACCES" and "[exit]" in failed["reason"], failed
    again = lab.publish(req)
    with worker(admin, "lab", "member"):
        assert wait_for(lambda: lab.state(again) == "done", WAIT), lab.state(again)
    assert (admin.storage / "shared" / "lab" / "data" / "by-job").read_text() == "job"
    finished = {e["name"] for e in listing("member", "queue/done")["output"]["entries"]}
    assert finished == {again, f"{again}.result"}

    # Revoke write: the space stays readable, writes are refused read-only.
    member_policy = admin.storage / "agent" / "member.d" / "policy"
    drop_rule(member_policy, "allow member_t shared:lab write")
    # docs/policy.md: without the write rule the space is read-only in the view (step 3).
    assert (step("member", "write"), step("member", "read")) == (3, None)
    assert refused(write("member", "m2"), "EROFS")
    assert listing("member", "data")["status"] == "ok"
    # Revoke read too: the space leaves the agent's view.
    drop_rule(member_policy, "allow member_t shared:lab read")
    assert step("member", "read") == 5
    assert refused(listing("member", "data"), "EACCES")
    add_rule(member_policy, "allow member_t shared:lab read")
    add_rule(member_policy, "allow member_t shared:lab write")
    assert write("member", "m3")["status"] == "ok"

    # Group membership changed by the administrator: the member leaves G, the outsider joins.
    uid = nobody().pw_uid
    for name, groups in (("member", []), ("outsider", [gid])):
        identity = admin.storage / "agent" / f"{name}.d" / "identity"
        replace_text(identity, json.dumps({"uid": uid, "gid": uid, "groups": groups}))
    assert step("member", "write") == 2
    assert refused(write("member", "m4"), "EACCES")
    assert step("outsider", "write") is None
    assert write("outsider", "o2")["status"] == "ok"
    names = {e["name"] for e in listing("outsider", "data")["output"]["entries"]}
    assert names == {"m1", "m3", "o2", "by-job"}
