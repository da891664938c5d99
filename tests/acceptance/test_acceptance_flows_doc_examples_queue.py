"""The project's own documentation taken literally, as a new user copies it: the worked
examples of docs/policy.md, the command line of docs/queue.md, the worker of docs/workers.md
and the session commands of docs/sessions.md, each run through ``ctx`` on a storage root of
its own, with the text, exit statuses, ``--json`` keys and files those pages print."""

from __future__ import annotations

import json
import os
import re
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import REPO, QueueCLI, clean_env, ctx_run
from tests.acceptance.workercli import allow_in_tool_policy, make_agent

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="the documented examples create agents of other uids: needs root"
)

# docs/policy.md prints its examples on the default root; a test's root stands in for it.
DOC_ROOT = "/var/lib/cortexfs/storage/current"
BIN = str(REPO / ".venv" / "bin")


def when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def shell(script: str, root: Path, cwd: Path) -> subprocess.CompletedProcess:
    """``script`` typed into bash by a user whose ``ctx`` is on PATH and who works in ``root``."""
    env = clean_env(CTX_STORAGE=str(root), PATH=f"{BIN}:{os.environ.get('PATH', '/usr/bin')}")
    return subprocess.run(
        ["bash", "-ec", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


# -------------------------------------------------------------------- docs/policy.md

# "Worked examples", as printed, with /tmp/coder.json moved to a scratch directory of the test.
WORKED_EXAMPLE = """\
cat > {scratch}/coder.json <<EOF
{{"name": "coder", "label": "coder_t", "tools": ["fs.read", "fs.write", "shell.exec"],
 "model": ["openai/gpt-5.6"], "shared": {{"project-a": ["read", "write"]}},
 "mount": [["$PWD/shared/project-a", "/shared/project-a", "rw"]]}}
EOF
cat > {scratch}/reviewer.json <<EOF
{{"name": "reviewer", "label": "reviewer_t", "tools": ["fs.read"],
 "model": ["openai/gpt-5.6"], "shared": {{"project-a": ["read"]}},
 "mount": [["$PWD/shared/project-a", "/shared/project-a", "ro"]]}}
EOF
ctx agent create --user 1001 --gid 1001 --groups 2000 {scratch}/coder.json
ctx agent create --user 1002 --gid 1002 --groups 2000 {scratch}/reviewer.json
# a request cannot grant these three; the host adds them by hand
printf 'allow coder_t %s\\n' 'network:default connect' 'agent:reviewer create' \\
       'agent:reviewer start' >> agent/coder.d/policy
echo 'allow coder_t tool:fs.read execute' >> tool/fs.read.d/policy
echo 'allow reviewer_t tool:fs.read execute' >> tool/fs.read.d/policy
echo 'allow coder_t tool:fs.write execute' >> tool/fs.write.d/policy
"""

CODER_FS_WRITE = """\
agent coder: tool:fs.write execute
  1 peer credentials   pass         asked as agent 'coder' itself (uid 1001 gid 1001)
  2 mode bits          pass         tool/fs.write: --x granted to uid 1001 (mode 0755, owner 0:0)
  3 mount visibility   pass         tool/fs.write appears at /ctx/tool/fs.write through {root} -> /ctx (ro)
  4 agent label        pass         coder_t (the agent cannot rewrite its own controls)
  5 object policy      pass         agent/coder.d/policy: allow coder_t tool:fs.write execute; its mount 'ctx' is granted
  6 tool/model policy  pass         tool/fs.write.d/policy: allow coder_t tool:fs.write execute
allow
"""  # noqa: E501

REVIEWER_SHARED_WRITE = """\
agent reviewer: shared:project-a write
  1 peer credentials   pass         asked as agent 'reviewer' itself (uid 1002 gid 1002)
  2 mode bits          pass         shared/project-a: -wx granted to uid 1002 (mode 3770, owner 0:2000)
  3 mount visibility   deny EACCES  shared/project-a is visible to the agent only read-only: its mount {root}/shared/project-a -> /shared/project-a (ro) is read-only
  4 agent label        not reached  an earlier step denied
  5 object policy      not reached  an earlier step denied
  6 tool/model policy  not reached  an earlier step denied
deny: EACCES: step 3 (mount visibility): shared/project-a is visible to the agent only read-only: its mount {root}/shared/project-a -> /shared/project-a (ro) is read-only
"""  # noqa: E501

CODER_POLICY = [
    "allow coder_t tool:fs.read execute",
    "allow coder_t tool:fs.write execute",
    "allow coder_t tool:shell.exec execute",
    "allow coder_t model:openai/gpt-5.6 use",
    "allow coder_t shared:project-a read",
    "allow coder_t shared:project-a write",
    "allow coder_t mount:project-a read",
    "allow coder_t mount:project-a write",
    "allow coder_t mount:ctx read",
    "allow coder_t network:default connect",
    "allow coder_t agent:reviewer create",
    "allow coder_t agent:reviewer start",
]
REVIEWER_POLICY = [
    "allow reviewer_t tool:fs.read execute",
    "allow reviewer_t model:openai/gpt-5.6 use",
    "allow reviewer_t shared:project-a read",
    "allow reviewer_t mount:project-a read",
    "allow reviewer_t mount:ctx read",
]


def rules(path: Path) -> list[str]:
    """A policy's lines without its comments ("the policies' comment lines left out")."""
    return [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def worked_example(root: Path, scratch: Path) -> None:
    """docs/policy.md's setup, run as printed in the storage root: the space, both agents."""
    r = ctx_run(
        "shared", "create", "project-a", "--group", "2000", env=clean_env(CTX_STORAGE=str(root))
    )
    assert r.rc == 0, r
    scratch.mkdir(exist_ok=True)
    done = shell(WORKED_EXAMPLE.format(scratch=scratch), root, cwd=root)
    assert done.returncode == 0, done.stderr


@needs_root
def test_policy_worked_example_runs_and_explains_as_printed(searchable_storage, tmp_path):
    """P-1…P-6, P-8, X-1, A-3: the coder/reviewer setup of docs/policy.md, typed as printed,
    leaves the controls it lists, and each ``ctx policy explain``/``query`` it shows answers
    with the printed lines and exit status, only the storage root's path differing."""
    root = searchable_storage
    worked_example(root, tmp_path / "scratch")
    env = clean_env(CTX_STORAGE=str(root))

    # "These are the controls it makes (the policies' comment lines left out)".
    agent = root / "agent"
    assert json.loads((agent / "coder.d/identity").read_text()) == {
        "uid": 1001,
        "gid": 1001,
        "groups": [2000],
    }
    assert json.loads((agent / "reviewer.d/identity").read_text()) == {
        "uid": 1002,
        "gid": 1002,
        "groups": [2000],
    }
    assert (agent / "coder.d/label").read_text().strip() == "coder_t"
    assert (agent / "reviewer.d/label").read_text().strip() == "reviewer_t"
    space = str(root / "shared/project-a")
    assert json.loads((agent / "coder.d/mount").read_text()) == [
        [space, "/shared/project-a", "rw"],
        [str(root), "/ctx", "ro"],
    ]
    assert json.loads((agent / "reviewer.d/mount").read_text()) == [
        [space, "/shared/project-a", "ro"],
        [str(root), "/ctx", "ro"],
    ]
    assert rules(agent / "coder.d/policy") == CODER_POLICY
    assert rules(agent / "reviewer.d/policy") == REVIEWER_POLICY
    assert rules(root / "tool/fs.read.d/policy") == [
        "allow coder_t tool:fs.read execute",
        "allow reviewer_t tool:fs.read execute",
    ]
    assert rules(root / "tool/fs.write.d/policy") == ["allow coder_t tool:fs.write execute"]
    assert rules(root / "tool/shell.exec.d/policy") == []  # "nobody may run shell.exec yet"
    # "shared/project-a (owned by root:2000, mode 3770, as ctx shared create makes it)"
    st = os.stat(space)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (0, 2000, 0o3770)

    def explain(*args: str):
        return ctx_run("policy", "explain", *args, env=env, cwd=root)

    r = explain("coder", "tool:fs.write", "execute")
    assert (r.rc, r.out) == (0, CODER_FS_WRITE.format(root=root)), r

    r = explain("coder", "tool:shell.exec", "execute")
    assert r.rc == 1, r
    assert r.lines()[5] == (
        "  5 object policy      pass         agent/coder.d/policy: allow coder_t "
        "tool:shell.exec execute; its mount 'ctx' is granted"
    )
    assert r.lines()[-2:] == [
        "  6 tool/model policy  deny EACCES  tool/shell.exec.d/policy has no rule "
        "'allow coder_t tool:shell.exec execute'",
        "deny: EACCES: step 6 (tool/model policy): tool/shell.exec.d/policy has no rule "
        "'allow coder_t tool:shell.exec execute'",
    ]

    r = explain("reviewer", "shared:project-a", "write")
    assert (r.rc, r.out) == (1, REVIEWER_SHARED_WRITE.format(root=root)), r

    r = explain("reviewer", "shared:project-a", "write", "--json")
    report = r.json()
    assert r.rc == 1 and list(report) == [
        "agent", "object", "permission", "allowed", "step", "step_name", "errno", "reason", "steps",
    ], report  # fmt: skip
    assert (report["allowed"], report["step"], report["step_name"], report["errno"]) == (
        False,
        3,
        "mount visibility",
        "EACCES",
    )
    assert [(s["step"], s["result"]) for s in report["steps"]] == [
        (1, "pass"), (2, "pass"), (3, "deny"), (4, "not reached"), (5, "not reached"),
        (6, "not reached"),
    ]  # fmt: skip
    assert all(set(s) == {"step", "name", "result", "errno", "detail"} for s in report["steps"])

    r = explain("reviewer", "network:default", "connect")
    assert r.rc == 1, r
    for line in (
        "  2 mode bits          n/a          network:default has no file on disk",
        "  3 mount visibility   n/a          network:default has no file on disk",
        "  5 object policy      deny EACCES  agent/reviewer.d/policy has no rule "
        "'allow reviewer_t network:default connect'",
    ):
        assert line in r.lines(), r

    r = ctx_run(
        "policy", "query", "--policy", "agent/reviewer.d/policy", "--policy",
        "tool/fs.write.d/policy", "reviewer_t", "tool:fs.write", "execute", env=env, cwd=root,
    )  # fmt: skip
    assert (r.rc, r.out) == (1, "deny\n"), r

    r = explain("coder", "tool:fs.read", "execute", "--peer", "1002:1002")
    assert r.rc == 1, r
    assert r.lines()[1] == (
        "  1 peer credentials   deny EACCES  the caller is uid 1002 gid 1002, but agent "
        "'coder' is uid 1001 gid 1001"
    )

    # "$ chmod 0666 agent/coder.d/policy; ctx policy explain coder tool:fs.read execute"
    done = shell(
        "chmod 0666 agent/coder.d/policy; ctx policy explain coder tool:fs.read execute", root, root
    )
    assert done.returncode == 1, done
    assert done.stdout.splitlines()[-1].startswith(
        "deny: EACCES: step 4 (agent label): agent/coder.d/policy is not host-owned: "
        "agent/coder.d/policy is writable by its group or by others (mode 0666); "
    ), done.stdout


# The "Errors you will see" table numbers its check messages FILE:2 … FILE:8: one file holds them.
ERROR_TABLE_POLICY = """\
allow coder_t tool:fs.read execute
allow coder_t agent:* create
deny coder_t tool:fs.read execute
allow coder.d tool:fs.read execute
allow coder_t shared:project-a read # read-only
allow coder_t tool:fs.read read
allow coder_t tool:/ctx/tool/fs.read execute
allow coder_t network:internet connect
"""
ERROR_TABLE_CHECK = [
    "FILE:2: EINVAL: agent:*: globs are not supported (P-2); name each object",
    "FILE:3: EINVAL: there is no 'deny' (P-2): policy v0 denies whatever no rule allows",
    "FILE:4: EINVAL: illegal subject type: 'coder.d' ends in '.d', ",
    "FILE:5: EINVAL: unexpected text after the permission: '# read-only'; ",
    "FILE:6: EINVAL: 'read' is a permission of shared, session, mount, agent, not of tool; "
    "tool has execute",
    "FILE:7: EINVAL: tool:/ctx/tool/fs.read: paths are not supported (P-2); ",
    "FILE:8: EINVAL: network:internet: the only network object is 'default' (P-4)",
]


@needs_root
def test_policy_errors_table_messages_appear_as_listed(searchable_storage, tmp_path):
    """P-2, P-3, P-4, P-5, P-8: every row of docs/policy.md's "Errors you will see" is
    produced on the worked example's root, by ``ctx policy check`` (exit 1, one line per
    invalid line, ``--json`` problems) and by ``ctx policy explain`` for each denying step,
    and a policy FILE that is a FIFO, a directory or larger than 16 MiB is refused as printed."""
    root = searchable_storage
    worked_example(root, tmp_path / "scratch")
    env = clean_env(CTX_STORAGE=str(root))
    scratch = tmp_path / "scratch"

    bad = scratch / "FILE"
    bad.write_text(ERROR_TABLE_POLICY)
    r = ctx_run("policy", "check", "FILE", env=env, cwd=scratch)
    assert (r.rc, r.out) == (1, ""), r
    got = r.err.splitlines()
    assert len(got) == len(ERROR_TABLE_CHECK), r
    for line, expected in zip(got, ERROR_TABLE_CHECK, strict=True):
        assert line.startswith(expected), (line, expected)
    r = ctx_run("policy", "check", "FILE", "--json", env=env, cwd=scratch)
    report = r.json()
    assert r.rc == 1 and report["valid"] is False, r
    [entry] = report["files"]
    assert (entry["file"], entry["valid"]) == ("FILE", False)
    assert [p["line"] for p in entry["problems"]] == [2, 3, 4, 5, 6, 7, 8]
    assert {(p["error"], p["errno"]) for p in entry["problems"]} == {("EINVAL", 22)}
    # A rule whose subject lacks the _t suffix is valid: "the suffix is a convention".
    (scratch / "ok").write_text(
        "# comments in any language: política\n\nallow X network:default connect\n"
    )
    r = ctx_run("policy", "check", "ok", env=env, cwd=scratch)
    assert (r.rc, r.out, r.err) == (0, "", ""), r

    # Policy FILEs that are not regular files, or too large.
    os.mkfifo(scratch / "fifo")
    (scratch / "dir").mkdir()
    with open(scratch / "big", "wb") as big:
        big.truncate(17 * 1024 * 1024)
    r = ctx_run("policy", "check", "fifo", "dir", "big", env=env, cwd=scratch, timeout=20)
    assert r.rc == 1, r
    assert r.err.splitlines() == [
        f"{name}: EINVAL: {name} is not a regular file (a FIFO, device or directory); give a "
        "policy file, or '-' to read one from a pipe"
        for name in ("fifo", "dir")
    ] + ["big: EINVAL: big holds more than 16777216 bytes, more than a policy may"], r
    r = ctx_run(
        "policy", "query", "--policy", "fifo", "a_t", "tool:x", "execute", env=env, cwd=scratch
    )
    assert r.rc == 2 and r.err.startswith("ctx: EINVAL: fifo is not a regular file"), r

    # The explain rows of the table, each made by the change it describes.
    def last_line(*args: str) -> str:
        r = ctx_run("policy", "explain", *args, env=env, cwd=root)
        assert r.rc in (0, 1), r
        return r.lines()[-1]

    fs_read = root / "tool/fs.read"
    fs_read.chmod(0o744)
    assert last_line("coder", "tool:fs.read", "execute") == (
        "deny: EACCES: step 2 (mode bits): tool/fs.read needs --x but mode 0744, owner 0:0 "
        "grants r-- to uid 1001"
    )
    fs_read.chmod(0o755)
    assert last_line("coder", "tool:fs.nothere", "execute") == (
        "deny: ENOENT: step 2 (mode bits): tool/fs.nothere does not exist"
    )
    assert last_line("ghost", "tool:fs.read", "execute").startswith(
        "deny: ENOENT: step 1 (peer credentials): there is no agent 'ghost' "
    )
    (root / "tool").chmod(0o700)
    try:
        assert last_line("coder", "tool:fs.write", "execute") == (
            "deny: EACCES: step 2 (mode bits): search (x) on tool is denied to uid 1001"
        )
    finally:
        (root / "tool").chmod(0o755)
    policy = root / "tool/fs.write.d/policy"
    saved = policy.read_bytes()
    policy.unlink()
    assert last_line("coder", "tool:fs.write", "execute") == (
        "deny: EACCES: step 6 (tool/model policy): no policy, so nothing is allowed "
        "(tool/fs.write.d/policy is missing)"
    )
    policy.write_bytes(saved)
    policy.chmod(0o644)
    coder = root / "agent/coder.d/policy"
    saved = coder.read_text()
    coder.write_text(
        "".join(f"{ln}\n" for ln in CODER_POLICY if ln != "allow coder_t mount:ctx read")
    )
    assert last_line("coder", "tool:fs.write", "execute") == (
        "deny: EACCES: step 5 (object policy): tool/fs.write is seen only through mount ctx, "
        "which agent/coder.d/policy does not grant: it lacks 'allow coder_t mount:ctx read'"
    )
    coder.write_text("# a glob\nallow coder_t agent:* create\n" + saved)
    line = last_line("coder", "tool:fs.write", "execute")
    assert line.startswith("deny: EACCES: step 5 (object policy): agent/coder.d/policy:2: "), line
    assert line.endswith("; an invalid policy grants nothing"), line
    coder.write_text(saved)
    assert last_line("reviewer", "tool:fs.write", "execute") == (
        "deny: EACCES: step 5 (object policy): agent/reviewer.d/policy has no rule "
        "'allow reviewer_t tool:fs.write execute'"
    )


# --------------------------------------------------------------------- docs/queue.md

CONFIG_KEYS = {"max_request_bytes", "max_result_bytes", "lease_ttl", "grace"}
STATUS_KEYS = {
    "queue", "pending", "claimed", "done", "failed", "conflict", "counts", "ignored",
    "incomplete", "conflicts", "temps", "owned_by_others", "group_not_inherited",
}  # fmt: skip
LEASE_KEYS = {
    "worker", "host", "machine_id", "boot_id", "pid_ns", "pid", "create_time", "claimed_at",
    "expires_at",
}  # fmt: skip


def test_queue_command_line_on_a_fresh_root_does_what_the_page_prints(tmp_path):
    """R-2, X-1, Q-1…Q-4, §2.4: ``ctx queue init --project P`` on a root that does not exist
    yet makes it whole; then publish (--name without the suffix, from/created put first), claim
    --ttl 1000 and renew (1000 s more), finish with a whole result object, and each refusal the
    command-line section names, with its exit status, message and ``--json`` error object."""
    root = tmp_path / "fresh" / "storage"
    env = clean_env(CTX_STORAGE=str(root))
    q = QueueCLI(root, "P")

    r = q.run("init", env=env)
    assert r.rc == 0 and "ready" in r.out, r
    assert {p.name for p in root.iterdir()} == {"bin", "tool", "agent", "model", "home", "shared"}
    assert (root / "tool" / "fs.read").is_file()  # "made whole, as ctx bootstrap makes it"
    queue_dirs = [f"queue/{d}" for d in ("inbox", "pending", "lease", "claimed", "done", "failed")]
    modes = {
        p: os.stat(root / "shared/P" / p).st_mode & 0o7777
        for p in ["", "tool", "data", "agent", "queue", *queue_dirs]
    }
    assert modes == {
        "": 0o3770, "tool": 0o2750, "data": 0o2770, "agent": 0o3770, "queue": 0o3770,
        **dict.fromkeys(queue_dirs, 0o2770),
    }  # fmt: skip
    config = (q.dir / "config").read_text().splitlines()
    given = {ln.split("=")[0] for ln in config if "=" in ln and not ln.startswith("#")}
    assert given == CONFIG_KEYS, config  # "it gives every key, move as a comment"
    assert any(ln.startswith("#") and "move=" in ln for ln in config), config
    assert "max_request_bytes=1048576" in config and "lease_ttl=300" in config

    # publish: --name without .req.json; the name alone on stdout; from and created put first.
    (tmp_path / "r.json").write_text(
        '  {"tool": "fs.read", "input": {"path": "a.txt"}, "priority": 1}\n'
    )
    r = q.run("publish", "--name", "build-7", tmp_path / "r.json", env=env)
    assert (r.rc, r.out) == (0, "build-7.req.json\n"), r
    stored = (q.dir / "pending/build-7.req.json").read_text()
    m = re.fullmatch(r'\{"from":"[^"]+","created":"([^"]+)",(.*)', stored, re.S)
    # The given bytes as they are, trimmed, ended by the one newline every stored file has.
    given = '"tool": "fs.read", "input": {"path": "a.txt"}, "priority": 1}\n'
    assert m and m.group(2) == given, stored
    assert when(m.group(1)).tzinfo is not None
    r = q.run(
        "publish",
        "--name",
        "b2",
        "-",
        input=(tmp_path / "r.json").read_text(),
        env={**env, "CTX_AGENT": "coder"},
    )
    assert (r.rc, r.out) == (0, "b2.req.json\n"), r
    assert json.loads((q.dir / "pending/b2.req.json").read_text())["from"] == "coder"
    r = q.run(
        "publish", "--name", "twice", "-", input='{"tool": "a", "input": {}, "tool": "b"}', env=env
    )
    assert r.rc == 1 and r.err.startswith("ctx: EINVAL: ") and "twice" in r.err, r
    assert sorted(os.listdir(q.dir / "pending")) == ["b2.req.json", "build-7.req.json"]
    assert os.listdir(q.dir / "inbox") == []

    # finish and renew of a job not claimed say where it is (exit 1).
    r = q.run("finish", "build-7", "--ok", env=env)
    assert r.rc == 1 and r.err.startswith("ctx: ENOENT: ") and "is pending" in r.err, r
    assert "claim it" in r.err, r
    r = q.run("renew", "build-7", env=env)
    assert r.rc == 1 and "is pending" in r.err and "claim it" in r.err, r
    r = q.run("finish", "nosuch", "--ok", "--json", env=env)
    assert r.rc == 1 and "'ctx queue list --project P'" in r.err, r
    assert r.json() == {
        "error": "ENOENT",
        "errno": 2,
        "message": r.err.removeprefix("ctx: ENOENT: ").strip(),
    }

    # claim --worker --ttl 1000, then renew: "1000 s more, never the shorter lease_ttl".
    r = q.run("claim", "--worker", "w-1", "--ttl", "1000", env=env)
    assert (r.rc, r.out) == (0, "build-7.req.json\n"), r
    lease = json.loads((q.dir / "lease/build-7.req.json/worker").read_text())
    assert set(lease) >= LEASE_KEYS, lease
    assert (lease["worker"], lease["pid"]) == ("w-1", os.getpid())
    assert (when(lease["expires_at"]) - when(lease["claimed_at"])).total_seconds() == pytest.approx(
        1000, abs=1
    )
    r = q.run("renew", "build-7.req.json", env=env)
    assert r.rc == 0, r
    renewed = json.loads((q.dir / "lease/build-7.req.json/worker").read_text())
    assert (
        when(renewed["expires_at"]) - when(renewed["renewed_at"])
    ).total_seconds() == pytest.approx(1000, abs=1)

    # finish with a whole §2.1 result object: its status must agree with --ok/--error.
    whole = {"status": "error", "output": {"n": 1}}
    r = q.run("finish", "build-7.req.json", "--ok", "-", input=json.dumps(whole), env=env)
    assert r.rc == 2 and r.err.startswith("ctx: EINVAL: "), r
    assert (q.dir / "claimed/build-7.req.json/build-7.req.json").is_file()
    assert not (q.dir / "done/build-7.req.json.result").exists()
    whole = {"status": "ok", "output": {"n": 1}, "worker": "somebody else", "started": "then"}
    r = q.run("finish", "build-7.req.json", "--ok", "-", input=json.dumps(whole), env=env)
    assert r.rc == 0, r
    res = json.loads((q.dir / "done/build-7.req.json.result").read_text())
    assert set(res) == {"status", "output", "worker", "started", "finished"}
    assert (res["status"], res["output"]) == ("ok", {"n": 1})
    assert res["worker"]["id"] == "w-1" and res["worker"]["pid"] == os.getpid()  # the holder
    assert res["started"] == lease["claimed_at"]
    assert (q.dir / "done/build-7.req.json").read_text() == stored
    assert os.listdir(q.dir / "claimed") == [] and os.listdir(q.dir / "lease") == []
    r = q.run("finish", "build-7.req.json", "--error", env=env)
    assert r.rc == 1 and r.err.startswith("ctx: EEXIST: ") and "ctx queue show" in r.err, r

    # An empty queue: claim prints nothing, with or without --json, and exits 3.
    assert q.run("claim", env=env).out == "b2.req.json\n"
    for extra in ((), ("--json",)):
        r = q.run("claim", *extra, env=env)
        assert (r.rc, r.out) == (3, ""), r

    r = q.run("status", "--json", env=env)
    status = r.json()
    assert r.rc == 0 and set(status) == STATUS_KEYS, status
    assert status["queue"] == str(q.dir)
    assert (status["pending"], status["claimed"], status["done"], status["failed"]) == (0, 1, 1, 0)
    assert {k: status["counts"][k] for k in ("pending", "claimed", "done", "failed")} == {
        "pending": 0, "claimed": 1, "done": 1, "failed": 0,
    }  # fmt: skip
    assert {"incomplete", "ignored", "conflict"} <= set(status["counts"])
    # "a malformed command line included": the error object on stdout, exit 2.
    r = q.run("list", "--state", "nope", "--json", env=env)
    assert r.rc == 2 and r.json()["error"] == "EINVAL" and r.json()["errno"] == 22, r


def test_recover_dry_run_plain_and_reconcile_say_what_the_page_prints(queue, tmp_path):
    """Q-3, Q-5, Q-6, I-5: a lease naming a pid that does not exist (with the ``ctx: note:``),
    and a claim without a lease that ``finish`` refuses with ENOENT; ``recover --dry-run``
    says ``would requeue`` and changes nothing, plain recover requeues only the first (exit 1
    while the claim without lease stays), ``--reconcile`` returns it (exit 0), a rerun changes
    nothing."""
    q = queue
    for name in ("a", "c"):
        r = q.run("publish", "--name", name, "-", input='{"tool": "x", "input": {}}')
        assert r.rc == 0, r
    r = q.run("claim", "--pid", "999999")
    assert (r.rc, r.out) == (0, "a.req.json\n"), r
    assert r.err.startswith("ctx: note: ") and "999999" in r.err and "ctx queue recover" in r.err, r
    r = q.run("claim")
    assert r.out == "c.req.json\n", r
    for entry in (q.dir / "lease/c.req.json").iterdir():
        entry.unlink()
    (q.dir / "lease/c.req.json").rmdir()  # "a claim without a lease (claimed/J/J alone)"

    r = q.run("finish", "c", "--ok", "-", input="{}")
    assert r.rc == 1 and r.err.startswith("ctx: ENOENT: ") and "recover --reconcile" in r.err, r
    assert (q.dir / "claimed/c.req.json/c.req.json").is_file()
    assert os.listdir(q.dir / "done") == []

    r = q.run("recover", "--dry-run")
    assert r.rc == 1, r  # "1 while a repair it only planned leaves an incomplete pair"
    assert r.lines()[0].startswith("would requeue  a.req.json: lease holder gone"), r
    assert any(
        ln.startswith("incomplete c.req.json: claimed without a lease") for ln in r.lines()
    ), r
    assert "nothing changed: dry run" in r.lines()[-1], r
    plan = q.run("recover", "--dry-run", "--json").json()
    assert [(j["job"], j["applied"]) for j in plan["requeued"]] == [("a.req.json", False)]
    assert (q.dir / "claimed/a.req.json/a.req.json").is_file()

    r = q.run("recover")
    assert r.rc == 1, r
    assert r.lines()[0].startswith("requeue  a.req.json: lease holder gone"), r
    assert (q.dir / "pending/a.req.json").is_file()
    assert (q.dir / "claimed/c.req.json/c.req.json").is_file()  # plain recover only reports

    r = q.run("recover", "--reconcile")
    assert r.rc == 0 and r.lines()[-1].endswith("queue consistent"), r
    r = q.run("recover", "--reconcile")
    assert (r.rc, r.out) == (
        0,
        "0 requeued, 0 repaired, 0 incomplete, 0 conflicts, 0 stale temps: queue consistent\n",
    ), r
    assert q.run("list").lines() == ["pending    a.req.json", "pending    c.req.json"]


def test_queue_paths_and_spaces_are_accepted_and_refused_as_documented(tmp_path):
    """X-1, X-2, R-2, R-3: ``ctx shared create NAME --group G`` prints a ``created`` line per
    entry and is idempotent; ``cortexfs-docs`` is never a space; ``--queue ROOT/queue``,
    ``--project ROOT/tool/q`` and ``--project ../escape`` are EINVAL (exit 2) and make nothing;
    ``--project ./queue`` and an absolute ``--project`` path name a queue."""
    root = tmp_path / "storage"
    assert ctx_run("bootstrap", "--storage", root).rc == 0
    env = clean_env(CTX_STORAGE=str(root))
    group = os.getgid()
    r = ctx_run("shared", "create", "project-a", "--group", str(group), env=env)
    assert r.rc == 0, r
    space = root / "shared/project-a"
    made = ["", "/tool", "/data", "/agent", "/queue"]
    made += [f"/queue/{d}" for d in ("inbox", "pending", "lease", "claimed", "done", "failed")]
    assert r.lines()[: len(made)] == [f"created   {space}{m}" for m in made], r
    r = ctx_run("shared", "create", "project-a", env=env)
    assert r.rc == 0 and "created" not in r.out, r

    before = sorted(os.listdir(root)), sorted(os.listdir(root / "tool"))
    for argv in (
        ("shared", "create", "cortexfs-docs"),
        ("queue", "init", "--project", "cortexfs-docs"),
        ("queue", "init", "--queue", str(root / "queue")),
        ("queue", "init", "--project", str(root / "tool/q")),
        ("queue", "init", "--project", "../escape"),
    ):
        r = ctx_run(*argv, env=env, cwd=space)
        assert r.rc == 2 and r.err.startswith("ctx: EINVAL: "), r
    assert (sorted(os.listdir(root)), sorted(os.listdir(root / "tool"))) == before
    assert not (root / "shared/escape").exists() and not (space.parent.parent / "escape").exists()

    r = ctx_run(
        "queue",
        "publish",
        "--project",
        "./queue",
        "--name",
        "rel",
        "-",
        input='{"tool": "x", "input": {}}',
        env=env,
        cwd=space,
    )
    assert (r.rc, r.out) == (0, "rel.req.json\n"), r
    assert (space / "queue/pending/rel.req.json").is_file()
    elsewhere = tmp_path / "srv/queues/build"
    r = ctx_run("queue", "init", "--project", elsewhere, env=env)
    assert r.rc == 0, r
    assert {p.name for p in elsewhere.iterdir()} == {
        "config",
        "inbox",
        "pending",
        "lease",
        "claimed",
        "done",
        "failed",
    }
    r = ctx_run("queue", "claim", "--project", elsewhere, env=env)
    assert r.rc == 3, r


# --------------------------------------------------- docs/workers.md and docs/sessions.md


@needs_root
def test_worker_results_and_its_session_read_back_as_documented(searchable_storage):
    """W-1, W-2, S-1, S-2, S-5: ``--agent ''`` is EINVAL (exit 2) and claims nothing; a worker
    with an agent prints the documented ``--json`` events and fails a tool's non-zero exit with
    the ``[exit]`` reason; an empty ``$CTX_AGENT`` is unset (a warning, the job failed at stage
    ``authorize``); the session ``worker`` it records is listed, shown, tailed and repaired
    with the documented output, modes and limits."""
    storage = searchable_storage
    make_agent(storage, ["shell.exec"])
    allow_in_tool_policy(storage, "shell.exec")
    q = QueueCLI(storage, "proj")
    env = clean_env(CTX_STORAGE=str(storage))
    bad = {"tool": "shell.exec", "input": {"cmd": "echo hi; echo oops >&2; exit 3"}}
    good = {"tool": "shell.exec", "input": {"cmd": "echo fine"}}
    for name, req in (("bad", bad), ("good", good)):
        assert q.run("publish", "--name", name, "-", input=json.dumps(req)).rc == 0

    r = q.run("work", "--agent", "", "--drain")
    assert r.rc == 2 and r.err.startswith("ctx: EINVAL: "), r
    assert sorted(os.listdir(q.dir / "pending")) == ["bad.req.json", "good.req.json"]

    r = q.run("work", "--agent", "ci", "--drain", "--json")
    assert r.rc == 0, r
    events = [json.loads(ln) for ln in r.lines()]
    assert [e["event"] for e in events] == ["start", "claim", "finish", "claim", "finish", "stop"]
    assert events[0]["wait"] == "inotify"
    assert [(e["job"], e["state"]) for e in events if e["event"] == "finish"] == [
        ("bad.req.json", "failed"),
        ("good.req.json", "done"),
    ]
    assert (events[-1]["done"], events[-1]["failed"]) == (1, 1)
    failed = json.loads((q.dir / "failed/bad.req.json.result").read_text())
    assert failed["reason"] == "shell.exec exited with status 3: oops [exit]", failed
    assert {k: failed["error"][k] for k in ("error", "errno", "stage")} == {
        "error": None,
        "errno": None,
        "stage": "exit",
    }
    assert set(failed["error"]) == {"error", "errno", "stage", "step", "step_name", "message"}

    # "An empty $CTX_AGENT counts as unset": one warning, the job failed at stage authorize.
    q.run("publish", "--name", "noagent", "-", input=json.dumps(good))
    r = q.run("work", "--drain", env={**env, "CTX_AGENT": ""})
    assert r.rc == 0, r
    # Not on a terminal: a line when it starts (how it waits), one per job, the summary.
    lines = r.lines()
    assert len(lines) == 3, r
    assert lines[0].startswith("worker ") and lines[0].endswith("started (waiting with inotify)")
    assert lines[1].startswith("failed  noagent.req.json: EACCES: "), r
    assert lines[2].startswith("worker stopped: 0 done, 1 failed"), r
    warnings = [ln for ln in r.err.splitlines() if ln.startswith("ctx: warning: ")]
    assert len(warnings) == 1, r
    refused = json.loads((q.dir / "failed/noagent.req.json.result").read_text())
    assert refused["reason"].startswith(
        "EACCES: this worker was started without --agent or CTX_AGENT"
    )
    assert (refused["error"]["error"], refused["error"]["stage"]) == ("EACCES", "authorize")
    r = q.run("work", "--agent", "ci", "--drain")  # "--drain on an empty queue exits 0"
    assert r.rc == 0, r

    # The session: home/<uid>/agent/ci/session/worker, 0755 / 0700 below / 0600.
    ident = json.loads((storage / "agent/ci.d/identity").read_text())
    uid, gid = ident["uid"], ident["gid"]
    home = storage / "home" / str(uid)
    session = home / "agent/ci/session/worker"
    assert os.stat(home).st_mode & 0o777 == 0o755
    for d in (home / "agent", home / "agent/ci", home / "agent/ci/session", session):
        st = os.stat(d)
        assert (st.st_mode & 0o777, st.st_uid, st.st_gid) == (0o700, uid, gid), d
    st = os.stat(session / "events.jsonl")
    assert (st.st_mode & 0o777, st.st_uid, st.st_gid) == (0o600, uid, gid)

    def session_cmd(*args: str):
        return ctx_run("session", *args, env=env)

    r = session_cmd("list", "ci")
    assert (r.rc, r.out) == (0, "worker\n"), r
    assert session_cmd("list", "ci", "--json").json() == [{"name": "worker", "path": str(session)}]
    shown = session_cmd("show", "ci", "worker", "--json")
    assert (
        shown.rc == 0
        and shown.out == session_cmd("show", "ci", "--session", "worker", "--json").out
    )
    timeline = [json.loads(ln) for ln in shown.lines()]  # JSON Lines, not one document
    for event in timeline:
        assert list(event)[:6] == ["ts", "type", "agent", "session", "object", "status"], event
    first_job = [
        e["type"] for e in timeline if e["object"] in ("queue/bad.req.json", "tool/shell.exec")
    ][:5]
    assert first_job == ["queue.claim", "queue.start", "tool_call", "tool_result", "queue.finish"]
    text = session_cmd("show", "ci", "worker")
    assert len(text.lines()) == len(timeline), text
    ts, kind, obj, status = text.lines()[0].split()[:4]
    assert (ts, kind, obj, status) == (timeline[0]["ts"], "queue.claim", "queue/bad.req.json", "ok")
    assert 'tool="shell.exec"' in text.lines()[0]  # "the other facts as key=value"
    r = session_cmd("tail", "ci", "worker", "-n", "1", "--json")
    assert [json.loads(ln) for ln in r.lines()] == timeline[-1:], r
    assert session_cmd("tail", "ci", "worker", "-n", str(2**63 - 1)).rc == 0
    for bad_number in (
        ("tail", "ci", "worker", "-n", str(2**63)),
        ("show", "ci", "--uid", "4294967295"),
    ):
        r = session_cmd(*bad_number)
        assert r.rc == 2 and "EINVAL" in r.err, r
    r = session_cmd("show", "ci", "nosuch")
    assert r.rc == 1 and r.err.startswith("ctx: ENOENT: ") and "ctx session list" in r.err, r
    r = session_cmd("repair", "ci", "worker")
    assert r.rc == 0 and r.out.startswith("nothing to do"), r
    assert session_cmd("repair", "ci", "worker", "--json").json() == {
        "session": f"home/{uid}/agent/ci/session/worker",
        "truncated_bytes": 0,
        "tightened": [],
        "left": [],
    }
    # The tool's log line names the session and where it lives, relative to the root.
    logged = [json.loads(ln) for ln in (storage / "tool/shell.exec.d/log").read_text().splitlines()]
    assert {(e["session"], e["session_dir"]) for e in logged} == {
        ("worker", f"home/{uid}/agent/ci/session/worker")
    }


@needs_root
def test_a_damaged_identity_is_named_in_the_documented_words(searchable_storage):
    """P-5 step 1, S-1: docs/policy.md's damaged ``identity`` — empty, not UTF-8, a NUL byte,
    not JSON — is named in plain words by ``ctx policy explain`` (step 1, EACCES), ``ctx agent
    list`` and ``ctx session show coder`` (``cannot tell agent 'coder''s uid: …; fix
    agent/coder.d/identity, or give --uid``, exit 1), and ``--uid`` then reads the home."""
    storage = searchable_storage
    make_agent(storage, ["fs.read"], "--user", "1001", "--gid", "1001", name="coder")
    env = clean_env(CTX_STORAGE=str(storage))
    identity = storage / "agent/coder.d/identity"
    cases = {
        b"": "it is empty",
        b'{"uid": \xff}': "byte 8 is not UTF-8 text",
        b'{"uid": 1001,\x00 "gid": 1}': "it holds a NUL byte (byte 13), so it is not text",
        b'{"uid": ,}': "Expecting value at line 1, column 9",
    }
    for content, words in cases.items():
        identity.write_bytes(content)
        why = f"agent/coder.d/identity is invalid: not JSON: {words}"
        r = ctx_run("session", "show", "coder", env=env)
        assert (r.rc, r.out) == (1, ""), r
        assert r.err == (
            f"ctx: EACCES: cannot tell agent 'coder''s uid: {why}; fix agent/coder.d/identity, "
            "or give --uid\n"
        ), r
        r = ctx_run("policy", "explain", "coder", "tool:fs.read", "execute", env=env)
        assert r.rc == 1 and r.lines()[-1] == f"deny: EACCES: step 1 (peer credentials): {why}", r
        r = ctx_run("agent", "list", env=env)
        assert r.rc in (0, 1) and why in r.out + r.err, r
    r = ctx_run("session", "show", "coder", "--uid", "1001", env=env)
    assert r.rc == 1 and r.err.startswith("ctx: ENOENT: "), r
    assert "'ctx session list coder --uid 1001'" in r.err, r
