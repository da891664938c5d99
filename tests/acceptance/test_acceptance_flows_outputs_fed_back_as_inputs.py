"""What one command prints is what the next command takes (SPEC R-3, Q-1 … Q-6, Q-9, §2.4, W-1,
S-1, S-2, P-1, P-3, P-5, P-6, P-8, T-1, T-7, T-8, T-8a, A-2, A-3, X-1, M-1, M-3, D-1, H-4;
docs/queue.md *Command line*, docs/sessions.md *Commands*, docs/tools.md *Listing and resolving*,
*Running a tool*, *Agents, host side*, *The agent terminal*, *ctx bootstrap*, docs/policy.md
*Commands*, docs/workers.md *Output*).

A user scripts CortexFS by feeding each answer, exactly as printed, into the next command: job
names from ``publish``/``claim``/``list`` (text, ``awk`` of the table, ``--json``) into
``show``/``renew``/``finish``; the lease holder ``claim --json`` shows into ``renew --pid``; the
request and result ``show --json`` prints into ``publish`` and ``finish``; the incomplete job of
``status --json`` into ``show`` and ``recover``; a worker's ``--json`` events and the call and
session its result names into ``show`` and ``session show``; the frames of ``ctx run --native``
into ``session list/show/tail``, the tool's log and ``policy explain --location``; the rule a
refusal quotes, or ``policy query --json`` prints, pasted into a policy file; a manifest rebuilt
from ``object which --json``; the tiers of ``object list --json`` into ``--tier``; the paths of
``bootstrap``, ``queue init``, ``shared create`` and ``agent create`` as ``--storage``, ``--queue``
and programs; ``agent start --json`` into ``watch``/``attach``/``stop``; the names ``ctxmcp
list`` prints into ``project``, ``object install`` and ``ctx run``; ``ctx man --json`` and
``tsh.config`` printed settings back into themselves.  Names use every character R-3 allows, up
to its 64 bytes.  Every ``--json`` answer is read with a strict reader (no NaN or infinity, no
name twice, no lone surrogate) and its documented fields are checked with their types."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.ctxcli import (
    REPO,
    OnStorage,
    Run,
    clean_env,
    new_scratch_dir,
    rfc3339,
    scratch_top,
    wait_for,
)
from tests.support.storage import copy_of_root

SCRATCH = scratch_top(__file__)
BIN = REPO / ".venv" / "bin"
CTXMCP = BIN / "ctxmcp"
SUFFIX = ".req.json"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid: root")
needs_terminal = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs root, bubblewrap and /dev/fuse",
)

# Names holding every character R-3 allows, at its 64-byte limit.
AGENT = "A0._-" + "a" * 59
LABEL = "L0._-" + "l" * 57 + "_t"
SESSION = "S0._-" + "s" * 59
SPACE = "P0._-" + "p" * 59
TOOL = "T0._-" + "t" * 59
TOOL2 = "U9-_." + "u" * 59
JOB_BASE = "J0._-" + "j" * 50  # 55 bytes: 64 with the '.req.json' suffix (docs/queue.md)
for _name in (AGENT, LABEL, SESSION, SPACE, TOOL, TOOL2, JOB_BASE + SUFFIX):
    assert len(_name) == 64, _name

REQUEST = {"tool": "fs.stat", "input": {"path": "/ctx"}}


# ------------------------------------------------------------------------------ strict JSON


def _no_lone_surrogate(value: Any) -> None:
    pending = [value]
    while pending:
        item = pending.pop()
        texts = [item] if isinstance(item, str) else list(item) if isinstance(item, dict) else []
        for text in texts:
            text.encode("utf-8")  # a lone surrogate raises here
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)


def strict(text: str) -> Any:
    """One JSON document as a strict reader of another language takes it."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        names = [name for name, _ in items]
        assert len(names) == len(set(names)), f"a name given twice: {names}"
        return dict(items)

    def constant(word: str) -> Any:
        raise AssertionError(f"{word} is not JSON")

    def number(spelling: str) -> float:
        value = float(spelling)
        assert value not in (float("inf"), float("-inf")), f"{spelling} is beyond a float"
        return value

    value = json.loads(text, object_pairs_hook=pairs, parse_constant=constant, parse_float=number)
    _no_lone_surrogate(value)
    return value


def strict_lines(text: str) -> list[Any]:
    assert text == "" or text.endswith("\n"), text[-80:]
    return [strict(line) for line in text.splitlines()]


def has(obj: dict, **kinds: type | tuple[type, ...]) -> None:
    """Each named field is present with its documented type (a bool is no int here)."""
    for key, kind in kinds.items():
        assert key in obj, (key, obj)
        value = obj[key]
        if kind is int or kind == (int, float):
            assert not isinstance(value, bool), (key, value)
        assert isinstance(value, kind), (key, value, kind)


def json_of(run: Run) -> Any:
    return strict(run.out)


# ------------------------------------------------------------------------------ the world


@dataclass
class World(OnStorage):
    """A fresh copy of the bootstrapped root in a scratch directory every uid may search,
    with a claim-order cache of its own."""

    top: Path
    storage: Path

    @property
    def env(self) -> dict[str, str]:
        return clean_env(
            CTX_STORAGE=str(self.storage),
            XDG_CACHE_HOME=str(self.top / "cache"),
            PATH=f"{BIN}:/usr/local/bin:/usr/bin:/bin",
        )

    def q(self, command: str, *args, project: str = "proj", **kw) -> Run:
        return self.ctx("queue", command, "--project", project, *args, **kw)

    def publish(self, req: dict, *args: str, project: str = "proj") -> str:
        done = self.q("publish", *args, "-", project=project, input=json.dumps(req))
        assert done.rc == 0, done
        return done.out.strip()

    def bash(self, script: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script, "bash", *args],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=cwd or self.top,
            timeout=60,
        )

    def agent(self, name: str, label: str, tools: list[str], **extra) -> dict:
        made = self.create_agent({"name": name, "label": label, "tools": tools, **extra})
        return made["identity"]

    def tool_policy(self, tool: str, tier: Path | None = None) -> Path:
        return (tier or self.storage / "tool") / f"{tool}.d" / "policy"

    def append(self, path: Path, line: str) -> None:
        with path.open("a") as rules:
            rules.write(line + "\n")

    def install(self, name: str, text: str, *tier: str, **manifest_extra) -> Path:
        """A v2 manifest of tool ``name`` running the shell text ``text``, installed in
        ``tier`` (system when none is given); returns the manifest's path."""
        directory = self.top / "manifests"
        directory.mkdir(exist_ok=True)
        (directory / f"{name}.sh").write_text(text)
        manifest = {
            "manifest": 2,
            "kind": "tool",
            "name": name,
            "description": f"The {name} tool.",
            "schema": {"type": "object"},
            "cap": {"side_effects": False, "network": False},
            "exec": f"{name}.sh",
            **manifest_extra,
        }
        path = directory / f"{name}.json"
        path.write_text(json.dumps(manifest))
        done = self.ctx("object", "install", path, "--tier", *(tier or ("system",)))
        assert done.rc == 0, done
        return path


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(SCRATCH, "w")
    try:
        yield World(top, copy_of_root(_template, top / "storage"))
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen]:
    """A live process a lease may name (``--pid``), killed at the end."""
    proc = subprocess.Popen(["sleep", "600"])
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


LEASE_TYPES: dict[str, type | tuple[type, ...]] = {
    "job": str,
    "worker": str,
    "host": str,
    "boot_id": str,
    "pid_ns": int,
    "pid": int,
    "create_time": (int, float),
    "claimed_at": str,
    "expires_at": str,
}


# ------------------------------------------------------------------------------ the queue


@pytest.mark.parametrize(
    ("given", "job"),
    [
        ("0", "0.req.json"),
        (JOB_BASE + SUFFIX, JOB_BASE + SUFFIX),
    ],
    ids=["one-byte-suffix-added", "64-bytes-suffix-given"],
)
def test_a_published_name_as_printed_is_shown_claimed_renewed_finished_and_listed(
    world: World, given: str, job: str
) -> None:
    """§2.4: publish and claim print J alone on a line; show, renew and finish take it as
    printed; renew's text names the expiry show then holds; finish prints J; list --state
    done names it.  R-3: every allowed character, up to 64 bytes, survives."""
    script = r"""
        cd "$1"
        J=$(ctx queue publish --project proj --name "$2" - <<< '{"tool":"fs.stat","input":{}}')
        printf '%s\n' "$J" > published
        ctx queue show --project proj "$J" --json > shown-pending
        C=$(ctx queue claim --project proj --ttl 600)
        printf '%s\n' "$C" > claimed
        ctx queue renew --project proj "$C" > renewed
        ctx queue show --project proj "$C" --json > shown-claimed
        ctx queue finish --project proj "$C" --ok - <<< '{"n": 1}' > finished
        ctx queue list --project proj --state done > listed
        ctx queue show --project proj "$C" --json > shown-done
    """
    done = world.bash(script, str(world.top), given)
    assert done.returncode == 0, done
    read = {n: (world.top / n).read_text() for n in ("published", "claimed", "finished", "listed")}
    assert read == dict.fromkeys(read, job + "\n"), read
    pending = strict((world.top / "shown-pending").read_text())
    claimed = strict((world.top / "shown-claimed").read_text())
    finished = strict((world.top / "shown-done").read_text())
    assert (pending["name"], pending["state"]) == (job, "pending")
    assert (claimed["name"], claimed["state"]) == (job, "claimed")
    assert claimed["lease"]["job"] == job
    lease = claimed["lease"]
    assert (world.top / "renewed").read_text() == f"{job} leased until {lease['expires_at']}\n"
    # docs/queue.md: a renewal lasts as long again as the claim's --ttl
    assert (rfc3339(lease["expires_at"]) - rfc3339(lease["renewed_at"])).total_seconds() == 600
    assert (finished["state"], finished["result"]["output"]) == ("done", {"n": 1})


def test_a_name_one_byte_past_the_limit_is_refused_and_nothing_is_published(
    world: World,
) -> None:
    """R-3 / docs/queue.md: J is at most 64 bytes, 55 before the suffix: one more is EINVAL,
    exit 2, with the --json error object on stdout."""
    refused = world.q("publish", "--name", JOB_BASE + "j", "--json", "-", input=json.dumps(REQUEST))
    assert refused.rc == 2, refused
    error = json_of(refused)
    assert (error["error"], error["errno"]) == ("EINVAL", 22), error
    has(error, message=str)
    assert os.listdir(world.storage / "shared/proj/queue/pending") == []


def test_claim_json_holder_feeds_renew_pid_and_finish_records_that_holder(
    world: World, sleeper: subprocess.Popen
) -> None:
    """§2.4, Q-3: claim --json prints name, request and the lease (documented fields and
    types); the holder's pid it shows renews the lease from another process (without it:
    EACCES); finish records the lease's holder as worker and its claimed_at as started."""
    job = world.publish({**REQUEST, "note": 'ünïcode "quoted" \\'}, "--name", JOB_BASE)
    worker_id = 'wörker #1 "q" \\ x'
    claim = world.q("claim", "--json", "--pid", str(sleeper.pid), "--worker", worker_id)
    assert claim.rc == 0, claim
    shown = json_of(claim)
    has(shown, name=str, request=dict, lease=dict)
    lease = shown["lease"]
    has(lease, **LEASE_TYPES)
    assert shown["name"] == lease["job"] == job
    assert (lease["pid"], lease["worker"]) == (sleeper.pid, worker_id)
    assert shown["request"]["note"] == 'ünïcode "quoted" \\'
    has(shown["request"], tool=str, input=dict, created=str)
    assert rfc3339(lease["expires_at"]) > rfc3339(lease["claimed_at"])

    not_mine = world.q("renew", shown["name"], "--json")
    assert not_mine.rc == 1, not_mine
    assert json_of(not_mine)["error"] == "EACCES"

    renewed = world.q("renew", shown["name"], "--pid", str(lease["pid"]), "--ttl", "500", "--json")
    assert renewed.rc == 0, renewed
    new_lease = json_of(renewed)
    for same in ("job", "worker", "pid", "create_time", "claimed_at", "host", "boot_id"):
        assert new_lease[same] == lease[same], same
    has(new_lease, renewed_at=str)
    assert json_of(world.q("show", job, "--json"))["lease"] == new_lease

    finished = world.q("finish", shown["name"], "--ok", "--json", "-", input="plain text")
    assert finished.rc == 0, finished
    answer = json_of(finished)
    assert (answer["name"], answer["state"]) == (job, "done")
    result = answer["result"]
    has(result, status=str, worker=dict, started=str, finished=str)
    assert result["output"] == "plain text"
    assert result["worker"]["id"] == worker_id
    for key in ("pid", "host", "boot_id", "pid_ns"):
        assert result["worker"][key] == lease[key], key
    assert result["started"] == lease["claimed_at"]


def test_awk_of_the_list_table_gives_ids_that_show_and_list_state_agree_on(
    world: World, sleeper: subprocess.Popen
) -> None:
    """§2.4: `list` prints 'STATE NAME' lines (`--state S`: one name a line); a column cut with
    awk is an id `show` takes, in the state the table gave, and `list --json` says the same."""
    names = [world.publish(REQUEST, "--name", n) for n in ("a", "Z9._-b", JOB_BASE, "x.d", "y")]
    for flag in ("--ok", "--error"):
        job = world.q("claim", "--pid", str(sleeper.pid)).out.strip()
        assert world.q("finish", job, flag, "/dev/null").rc == 0
    world.q("claim", "--pid", str(sleeper.pid))
    queue = world.storage / "shared/proj/queue"  # a claim a crash left without its lease
    (queue / "claimed" / names[4]).mkdir()
    os.rename(queue / "pending" / names[4], queue / "claimed" / names[4] / names[4])
    script = r"""
        ctx queue list --project proj | awk '{print $1, $2}' | while read -r state id; do
            shown=$(ctx queue show --project proj "$id" \
                | awk '$1 == "job:" || $1 == "state:" {print $2}' | paste -sd ' ')
            printf '%s %s\n' "$state" "$shown"
        done
    """
    done = world.bash(script)
    assert done.returncode == 0, done
    rows = [line.split() for line in done.stdout.splitlines()]
    assert len(rows) == 5 and {r[1] for r in rows} == set(names), rows
    for table_state, name, shown_state in rows:
        assert table_state == shown_state, (name, table_state, shown_state)
    states = {name: state for state, name, _ in rows}
    assert sorted(states.values()) == ["claimed", "done", "failed", "incomplete", "pending"]
    listed = json_of(world.q("list", "--json"))
    assert {(e["name"], e["state"]) for e in listed} == {(n, s) for n, s in states.items()}
    for state in set(states.values()):
        one = world.q("list", "--state", state)
        assert one.rc == 0 and one.lines() == [n for n, s in states.items() if s == state], one


def test_pending_list_is_the_order_claims_take_and_a_requeued_job_goes_first(
    world: World, sleeper: subprocess.Popen
) -> None:
    """docs/queue.md (Q-9): `list --state pending` names the jobs in the order this user's next
    claims take them; recover --json names the job it requeued, which goes back first."""
    published = [world.publish(REQUEST, "--name", n) for n in ("c", "b", "a", "d")]
    assert world.q("list", "--state", "pending").lines() == published
    first = world.q("claim", "--pid", str(sleeper.pid), "--ttl", "600").out.strip()
    assert first == published[0]
    sleeper.kill()
    sleeper.wait()
    recovered = world.q("recover", "--json")
    assert recovered.rc == 0, recovered
    report = json_of(recovered)
    has(report, consistent=bool, requeued=list, repaired=list, conflicts=list, errors=list)
    assert [r["job"] for r in report["requeued"]] == [first]
    order = world.q("list", "--state", "pending").lines()
    assert order == published, order
    holder = subprocess.Popen(["sleep", "600"])
    try:
        taken = [world.q("claim", "--pid", str(holder.pid)).out.strip() for _ in order]
    finally:
        holder.kill()
        holder.wait()
    assert taken == order


def test_a_shown_request_republished_and_a_shown_result_finishing_another_job(
    world: World, sleeper: subprocess.Popen
) -> None:
    """§2.1, docs/queue.md: the request `show --json` prints, published again, is stored as it
    was (from and created kept); the result it prints, given to `finish` of another job, gives
    its output while worker and started are that job's own; a status that disagrees with
    --error is EINVAL (exit 2) and the job stays claimed."""
    original = world.publish({**REQUEST, "from": "ops", "extra": [1, "é"]}, "--name", "orig")
    request = json_of(world.q("show", original, "--json"))["request"]
    copy = world.publish(request, "--name", JOB_BASE)
    assert json_of(world.q("show", copy, "--json"))["request"] == request
    assert request["from"] == "ops" and request["extra"] == [1, "é"]

    assert world.q("claim", "--pid", str(sleeper.pid)).out.strip() == original
    world.q("finish", original, "--ok", "-", input='{"answer": [42, "ü"]}')
    result = json_of(world.q("show", original, "--json"))["result"]
    result_file = world.top / "result.json"
    result_file.write_text(json.dumps(result))

    other = subprocess.Popen(["sleep", "600"])
    try:
        assert world.q("claim", "--pid", str(other.pid)).out.strip() == copy
        lease = json_of(world.q("show", copy, "--json"))["lease"]
        disagreeing = world.q("finish", copy, "--error", result_file, "--json")
        assert disagreeing.rc == 2 and json_of(disagreeing)["error"] == "EINVAL", disagreeing
        assert json_of(world.q("show", copy, "--json"))["state"] == "claimed"
        finished = world.q("finish", copy, "--ok", result_file, "--json")
    finally:
        other.kill()
        other.wait()
    assert finished.rc == 0, finished
    copied = json_of(finished)["result"]
    assert copied["output"] == result["output"] == {"answer": [42, "ü"]}
    assert copied["worker"]["pid"] == other.pid != result["worker"]["pid"]
    assert copied["started"] == lease["claimed_at"]


def test_status_json_incomplete_job_feeds_show_and_reconcile_and_claim(world: World) -> None:
    """§2.4, Q-6: status --json has each documented field; the incomplete job it names is
    what show calls incomplete with the same repair, what recover --reconcile --json repairs,
    and then the job a claim takes."""
    job = world.publish(REQUEST, "--name", JOB_BASE)
    queue = world.storage / "shared/proj/queue"
    (queue / "claimed" / job).mkdir()
    os.rename(queue / "pending" / job, queue / "claimed" / job / job)

    status = world.q("status", "--json")
    assert status.rc == 0, status
    report = json_of(status)
    has(report, queue=str, pending=int, claimed=int, done=int, failed=int, conflict=int)
    has(report, counts=dict, ignored=list, incomplete=list, conflicts=list, temps=list)
    has(report, owned_by_others=list, group_not_inherited=list)
    for key in ("pending", "claimed", "done", "failed", "conflict", "incomplete", "ignored"):
        has(report["counts"], **{key: int})
    assert report["counts"]["incomplete"] == len(report["incomplete"]) == 1
    assert Path(report["queue"]) == queue
    entry = report["incomplete"][0]

    shown = json_of(world.ctx("queue", "show", "--queue", report["queue"], entry["job"], "--json"))
    assert (shown["name"], shown["state"], shown["repair"]) == (job, "incomplete", entry["repair"])
    repaired = json_of(world.q("recover", "--reconcile", "--json"))
    assert [(r["job"], r["action"], r["applied"]) for r in repaired["repaired"]] == [
        (job, entry["repair"], True)
    ]
    assert json_of(world.q("show", job, "--json"))["state"] == "pending"
    assert world.q("claim").out == job + "\n"


def test_batch_names_printed_are_the_jobs_published(world: World) -> None:
    """§2.4: publish --batch prints each J, one a line (with --json: the names list); each is
    a pending job holding its line's request."""
    lines = [{"tool": "fs.stat", "input": {"n": n}} for n in range(3)]
    batch = "".join(json.dumps(line) + "\n" for line in lines)
    text = world.q("publish", "--batch", "-", input=batch)
    as_json = world.q("publish", "--batch", "--json", "-", input=batch)
    assert text.rc == 0 and as_json.rc == 0, (text, as_json)
    names = text.lines() + json_of(as_json)["names"]
    assert len(set(names)) == 6, names
    for name, line in zip(names, lines + lines, strict=True):
        shown = json_of(world.q("show", name, "--json"))
        assert (shown["state"], shown["request"]["input"]) == ("pending", line["input"])


# ------------------------------------------------------------------------------ workers


@needs_root
def test_worker_events_name_jobs_and_a_quoted_rule_pasted_fixes_a_refusal(world: World) -> None:
    """W-1, docs/workers.md: `work --json` events name each job show finds in that state; a
    done result names the call and session that `session show` holds (with the job); a
    failed job's reason quotes the missing rule, which pasted into the policy it names (then
    the next one) makes the request `show --json` printed run when published again."""
    world.agent(AGENT, LABEL, ["fs.stat"])
    world.append(world.tool_policy("fs.stat"), f"allow {LABEL} tool:fs.stat execute")
    ok_job = world.publish(REQUEST, "--name", JOB_BASE)
    refused_job = world.publish({"tool": "fs.list", "input": {"path": "/ctx"}}, "--name", "ls")

    def work() -> list[dict]:
        ran = world.ctx("queue", "work", "--project", "proj", "--agent", AGENT, "--drain", "--json")
        assert ran.rc == 0, ran
        return strict_lines(ran.out)

    events = work()
    finished = {e["job"]: e for e in events if e["event"] == "finish"}
    assert [e["job"] for e in events if e["event"] == "claim"] == [ok_job, refused_job]
    for job, event in finished.items():
        assert json_of(world.q("show", job, "--json"))["state"] == event["state"]
    assert finished[ok_job]["state"] == "done" and finished[refused_job]["state"] == "failed"

    result = json_of(world.q("show", ok_job, "--json"))["result"]
    session = Path(result["session"]).name
    assert (world.storage / result["session"] / "events.jsonl").is_file()
    shown = strict_lines(world.ctx("session", "show", AGENT, session, "--json").out)
    call = [e for e in shown if e.get("call") == result["call"]]
    assert [e["type"] for e in call] == ["tool_call", "tool_result"], call
    assert call[0]["job"] == ok_job

    request = json_of(world.q("show", refused_job, "--json"))["request"]
    for policy_path in ("agent", "tool"):
        reason = finished[refused_job]["reason"]
        quoted = re.search(r"(\S+/\S+\.d/policy) has no rule '([^']+)'", reason)
        assert quoted, reason
        assert quoted.group(1).startswith(policy_path + "/"), reason
        world.append(world.storage / quoted.group(1), quoted.group(2))
        again = world.publish(request, "--name", f"ls-{policy_path}")
        finished = {e["job"]: e for e in work() if e["event"] == "finish"}
        refused_job = again
    assert finished[again]["state"] == "done", finished


# ------------------------------------------------------------------------------ sessions


@needs_root
def test_run_frames_feed_session_list_show_tail_the_tool_log_and_explain(world: World) -> None:
    """T-3 frames, S-1, S-2, T-7, docs/sessions.md: the session path and call id `ctx run
    --native` prints lead to the session `session list --json` names, to the two events
    `show`/`tail` print, and to the tool's log line; the path's parent is the --location
    `policy explain` takes for the session, whose quoted rule pasted in allows it."""
    world.agent(AGENT, LABEL, ["fs.stat"])
    world.append(world.tool_policy("fs.stat"), f"allow {LABEL} tool:fs.stat execute")
    ran = world.ctx(
        "run", "--agent", AGENT, "--native", "--session", SESSION, "fs.stat",
        input=json.dumps({"path": "/ctx"}),
    )  # fmt: skip
    assert ran.rc == 0, ran
    frames = strict_lines(ran.out)
    call, result = frames[0], frames[-1]
    assert (call["type"], result["type"]) == ("call", "result")
    has(call, call=str, tool=str, agent=str, session=str, pid=int, ts=str)
    has(result, status=str, exit_status=int, stderr=str, post_hooks=list, session=str, call=str)
    has(result, timings_ms=dict)
    assert call["call"] == result["call"] and call["session"] == result["session"]
    assert result["output"]["type"] == "directory"

    listed = json_of(world.ctx("session", "list", AGENT, "--json"))
    assert listed == [{"name": SESSION, "path": str(world.storage / result["session"])}]
    assert world.ctx("session", "list", AGENT).out == SESSION + "\n"
    name = world.ctx("session", "list", AGENT).out.strip()
    shown = world.ctx("session", "show", AGENT, name, "--json")
    tail = world.ctx("session", "tail", AGENT, "--session", name, "-n", "2", "--json")
    events = strict_lines(shown.out)
    assert strict_lines(tail.out) == events[-2:]
    assert [(e["type"], e["call"], e["session"]) for e in events] == [
        ("tool_call", result["call"], SESSION),
        ("tool_result", result["call"], SESSION),
    ]
    assert list(events[0])[:6] == ["ts", "type", "agent", "session", "object", "status"]
    log = strict_lines((world.storage / "tool/fs.stat.d/log").read_text())
    mine = [e for e in log if e.get("call") == result["call"]]
    assert [e["session_dir"] for e in mine] == [result["session"]]

    location = str(Path(result["session"]).parent)
    explain = ["policy", "explain", AGENT, f"session:{name}", "read", "--location", location]
    denied = world.ctx(*explain, "--json")
    assert denied.rc == 1, denied
    reason = json_of(denied)
    assert (reason["step"], reason["errno"]) == (5, "EACCES"), reason
    rule = re.search(r"has no rule '([^']+)'", reason["reason"]).group(1)
    world.append(world.storage / "agent" / f"{AGENT}.d" / "policy", rule)
    allowed = world.ctx(*explain, "--json")
    assert allowed.rc == 0 and json_of(allowed)["allowed"] is True, allowed


@needs_root
def test_a_shared_session_path_printed_by_run_is_where_list_and_show_find_it(
    world: World,
) -> None:
    """S-1, X-1: `ctx run --project P` prints shared/P/agent/A/session/S; `session list
    --project P --json` gives that directory, and `show --project P` its two events."""
    identity = world.agent(AGENT, LABEL, ["fs.stat"], shared={SPACE: ["read", "write"]})
    world.append(world.tool_policy("fs.stat"), f"allow {LABEL} tool:fs.stat execute")
    made = world.ctx("shared", "create", SPACE, "--group", str(identity["gid"]), "--json")
    assert made.rc == 0, made
    space = json_of(made)["path"]
    ran = world.ctx(
        "run", "--agent", AGENT, "--native", "--project", SPACE, "--session", SESSION,
        "fs.stat", input=json.dumps({"path": "/ctx"}),
    )  # fmt: skip
    assert ran.rc == 0, ran
    result = strict_lines(ran.out)[-1]
    assert result["session"] == f"shared/{SPACE}/agent/{AGENT}/session/{SESSION}"
    assert str(world.storage / result["session"]).startswith(space + "/")
    listed = json_of(world.ctx("session", "list", AGENT, "--project", SPACE, "--json"))
    assert listed == [{"name": SESSION, "path": str(world.storage / result["session"])}]
    shown = world.ctx("session", "show", AGENT, listed[0]["name"], "--project", SPACE, "--json")
    assert [e["call"] for e in strict_lines(shown.out)] == [result["call"]] * 2


# ------------------------------------------------------------------------------ policy


@needs_root
def test_quoted_rules_of_explain_pasted_into_both_policies_make_run_work(world: World) -> None:
    """P-5, P-6, docs/policy.md: explain's step 5 quotes the agent's missing rule, pasted in,
    step 6 the tool's; then explain allows, `ctx run` runs it, and `policy query` over the
    two files allows with that very rule."""
    world.agent(AGENT, LABEL, [])
    world.install(TOOL, "#!/bin/sh\ncat > /dev/null\necho '{\"ran\": true}'\n")
    refused = world.ctx("run", "--agent", AGENT, TOOL)
    assert refused.rc == 126, refused
    pasted: list[str] = []
    for step in (5, 6):
        denied = world.ctx("policy", "explain", AGENT, f"tool:{TOOL}", "execute", "--json")
        assert denied.rc == 1, denied
        report = json_of(denied)
        has(report, agent=str, object=str, permission=str, allowed=bool, steps=list, reason=str)
        assert (report["step"], report["errno"]) == (step, "EACCES"), report
        quoted = re.search(r"(\S+\.d/policy) has no rule '([^']+)'", report["reason"])
        world.append(world.storage / quoted.group(1), quoted.group(2))
        pasted.append(quoted.group(1))
        assert quoted.group(2) == f"allow {LABEL} tool:{TOOL} execute"
    assert pasted == [f"agent/{AGENT}.d/policy", f"tool/{TOOL}.d/policy"]
    allowed = world.ctx("policy", "explain", AGENT, f"tool:{TOOL}", "execute")
    assert allowed.rc == 0, allowed
    ran = world.ctx("run", "--agent", AGENT, TOOL)
    assert (ran.rc, ran.out) == (0, '{"ran": true}\n'), ran
    files = [str(world.storage / p) for p in pasted]
    query = ["policy", "query", "--policy", files[0], "--policy", files[1]]
    answer = world.ctx(*query, LABEL, f"tool:{TOOL}", "execute", "--json")
    assert answer.rc == 0, answer
    assert json_of(answer) == {
        "decision": "allow",
        "rule": f"allow {LABEL} tool:{TOOL} execute",
        "policies": [{"policy": f, "allows": True} for f in files],
    }
    assert world.ctx("policy", "check", *files).rc == 0


def test_rules_query_prints_and_lines_check_names_round_trip_through_a_file(world: World) -> None:
    """P-1, P-3, P-8: the `rule` of `policy query --json` for every class, written to a file,
    is valid and makes the same query allow; the line numbers `policy check --json` (and its
    FILE:LINE: text) names, removed, leave a valid file."""
    empty = world.top / "empty.policy"
    empty.write_text("")
    queries = [
        (f"tool:{TOOL}", "execute"),
        (f"model:{SPACE}/{TOOL}", "use"),
        (f"shared:{SPACE}", "write"),
        (f"session:{SESSION}", "resume"),
        (f"mount:{SPACE}", "read"),
        (f"agent:{AGENT}", "stop"),
        ("network:default", "connect"),
    ]
    rules = []
    for obj, perm in queries:
        denied = world.ctx("policy", "query", "--policy", empty, LABEL, obj, perm, "--json")
        assert denied.rc == 1 and json_of(denied)["decision"] == "deny", denied
        rules.append(json_of(denied)["rule"])
    bad = ["allow x_t agent:* create", "deny x_t tool:a execute", "allow x_t tool:a read"]
    policy = world.top / "written.policy"
    policy.write_text("\n".join(["# pasted", *rules[:3], *bad, *rules[3:]]) + "\n")

    checked = world.ctx("policy", "check", policy, "--json")
    assert checked.rc == 1, checked
    report = json_of(checked)
    has(report, valid=bool, files=list)
    problems = report["files"][0]["problems"]
    numbers = [p["line"] for p in problems]
    assert numbers == [5, 6, 7], problems
    text_numbers = [
        int(line.split(":")[1]) for line in world.ctx("policy", "check", policy).err.splitlines()
    ]
    assert text_numbers == numbers
    kept = [line for n, line in enumerate(policy.read_text().splitlines(), 1) if n not in numbers]
    policy.write_text("\n".join(kept) + "\n")
    assert world.ctx("policy", "check", policy).rc == 0
    for (obj, perm), rule in zip(queries, rules, strict=True):
        allowed = world.ctx("policy", "query", "--policy", policy, LABEL, obj, perm)
        assert (allowed.rc, allowed.out) == (0, "allow\n"), (rule, allowed)


# ------------------------------------------------------------------------------ tools


def test_a_manifest_rebuilt_from_which_json_installs_the_same_tool(world: World) -> None:
    """T-1, T-8, T-8a: the executable and controls `object which --json` names rebuild a v2
    manifest; `object check` calls it valid by its name, `object install --json` installs it,
    and the new tool's controls and program are those of the first, byte for byte."""
    world.install(
        TOOL, "#!/bin/sh\necho hi\n",
        description="Déjà vu: a tool whose name holds . _ -",
        cap={"side_effects": False, "network": False, "gpu": "none"},
        program={"type": "object", "additionalProperties": False},
    )  # fmt: skip
    which = world.ctx("object", "which", TOOL, "--json")
    assert which.rc == 0, which
    found = json_of(which)
    has(found, name=str, path=str, controls=str, skipped=list)
    assert found["path"] == world.ctx("object", "which", TOOL).out.strip()
    controls = Path(found["controls"])
    manifest = {
        "manifest": 2,
        "kind": "tool",
        "name": TOOL2,
        "description": (controls / "description").read_text().rstrip("\n"),
        "schema": strict((controls / "schema").read_text()),
        "cap": strict((controls / "cap").read_text()),
        "exec": found["path"],
        "program": strict((controls / "program").read_text()),
    }
    rebuilt = world.top / "rebuilt.json"
    rebuilt.write_text(json.dumps(manifest))
    checked = world.ctx("object", "check", rebuilt)
    assert (checked.rc, checked.out) == (0, f"{rebuilt}: valid ({TOOL2})\n"), checked
    installed = world.ctx("object", "install", rebuilt, "--tier", "user", "--json")
    assert installed.rc == 0, installed
    answer = json_of(installed)
    assert (answer["name"], answer["tier"]) == (TOOL2, "user")
    new = Path(answer["path"])
    assert new == world.storage / "home" / str(os.geteuid()) / "tool" / TOOL2
    assert new.read_bytes() == Path(found["path"]).read_bytes()
    for control in ("description", "schema", "cap", "program"):
        assert (new.parent / f"{TOOL2}.d" / control).read_bytes() == (
            controls / control
        ).read_bytes(), control
    assert (new.parent / f"{TOOL2}.d" / "name").read_text().strip() == TOOL2
    assert world.ctx("object", "which", TOOL2).out == f"{new}\n"


def test_tiers_object_list_prints_feed_list_tier_and_install_tier(world: World) -> None:
    """T-8, T-8a, X-1: each `tier` of `object list --json` (system, user, shared:<64-byte
    space>) is a --tier `object list` lists exactly those tools of and `object install`
    installs into; the text table's first two columns are the same names and tiers."""
    assert world.ctx("shared", "create", SPACE).rc == 0
    manifest = world.install(TOOL, "#!/bin/sh\necho hi\n", f"shared:{SPACE}")
    assert world.ctx("object", "install", manifest, "--tier", "user").rc == 0
    everything = json_of(world.ctx("object", "list", "--json"))
    for entry in everything:
        has(entry, name=str, tier=str, path=str, status=str, reason=str, description=str)
        has(entry, problems=list)
    tiers = sorted({e["tier"] for e in everything})
    assert tiers == ["shared:" + SPACE, "system", "user"], tiers
    table = world.bash("ctx object list | awk '{print $1, $2}'")
    assert table.stdout.splitlines() == [f"{e['name']} {e['tier']}" for e in everything]

    other = json.loads(manifest.read_text())
    other["name"] = TOOL2
    (manifest.parent / "other.json").write_text(json.dumps(other))
    for tier in tiers:
        only = json_of(world.ctx("object", "list", "--tier", tier, "--json"))
        assert only == [e for e in everything if e["tier"] == tier], tier
        done = world.ctx("object", "install", manifest.parent / "other.json", "--tier", tier)
        assert done.rc == 0, done
    now = json_of(world.ctx("object", "list", "--json"))
    assert sorted(e["tier"] for e in now if e["name"] == TOOL2) == tiers


@needs_root
@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="the server is python3")
def test_ctxmcp_names_listed_are_projected_installed_and_run(world: World) -> None:
    """M-1, M-3, T-8: the names `ctxmcp list` prints (text column 1, `--json` name) are the
    candidates `project` writes (`written`), which `object check` calls valid by that name,
    `object install` installs, `object which` finds and `ctx run` calls; the illegal ones
    are reported and skipped."""
    remote = "Z9._-" + "e" * 55  # srv.<remote> is 64 bytes
    server = r"""
import json, sys
names = ["echo", %r, "bad name", "x" * 61]
tools = [{"name": n, "description": "tool " + n,
          "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}}
         for n in names]
for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m:
        continue
    if m["method"] == "initialize":
        r = {"protocolVersion": m["params"]["protocolVersion"], "capabilities": {"tools": {}},
             "serverInfo": {"name": "srv", "version": "1"}}
    elif m["method"] == "tools/list":
        r = {"tools": tools}
    else:
        r = {"content": [{"type": "text", "text": json.dumps(m["params"]["arguments"])}],
             "isError": False}
    print(json.dumps({"jsonrpc": "2.0", "id": m["id"], "result": r}), flush=True)
""" % (remote,)  # noqa: UP031
    mcp = world.top / "mcp"
    mcp.mkdir(mode=0o755)
    (mcp / "srv.py").write_text(server)
    config = mcp / "mcp.json"
    entry = {"command": "/usr/bin/python3", "args": [str(mcp / "srv.py")]}
    config.write_text(json.dumps({"mcpServers": {"srv": entry}}))
    for path in (mcp / "srv.py", config):
        path.chmod(0o644)
    run_mcp = [str(CTXMCP), "--config", str(config), "--server", "srv"]

    def ctxmcp(command: str, *args: str) -> subprocess.CompletedProcess:
        argv = [run_mcp[0], command, *run_mcp[1:], *args]
        return subprocess.run(argv, capture_output=True, text=True, env=world.env, timeout=60)

    listed = ctxmcp("list", "--json")
    assert listed.returncode == 0, listed
    names = [t["name"] for t in strict(listed.stdout)["tools"] if t["name"] is not None]
    assert names == ["srv.echo", f"srv.{remote}"], names
    column = [line.split("\t")[0] for line in ctxmcp("list").stdout.splitlines()]
    assert column[:2] == names

    out = world.top / "candidates"
    projected = ctxmcp("project", "--runtime-config", "/mcp/mcp.json", "--out", str(out), "--json")
    assert projected.returncode == 1, projected  # two tools skipped
    report = strict(projected.stdout)
    assert [s["tool"] for s in report["skipped"]] == ["bad name", "x" * 61]
    checked = world.ctx("object", "check", *report["written"])
    assert checked.rc == 0, checked
    assert checked.lines() == [
        f"{written}: valid ({name})" for name, written in zip(names, report["written"], strict=True)
    ]
    for written in report["written"]:
        assert world.ctx("object", "install", written, "--tier", "system").rc == 0
    name = names[1]
    assert world.ctx("object", "which", name).out == f"{world.storage / 'tool' / name}\n"

    world.agent(AGENT, LABEL, names, mount=[[str(mcp), "/mcp", "ro"]])
    world.append(world.tool_policy(name), f"allow {LABEL} tool:{name} execute")
    ran = world.ctx("run", "--agent", AGENT, "--native", name, input='{"text": "hé"}')
    assert ran.rc == 0, ran
    result = strict_lines(ran.out)[-1]
    assert result["output"]["content"][0]["text"] == json.dumps({"text": "hé"})


# ------------------------------------------------------------------------------ paths


@needs_root
def test_paths_printed_by_bootstrap_queue_init_shared_create_and_agent_create_are_usable(
    world: World,
) -> None:
    """R-1, R-5, X-1, A-3, docs/tools.md *ctx bootstrap*: a root made from a relative
    --storage is printed absolute; used from another directory as --storage it takes `queue
    init`, whose queue path is a --queue, the `shared create` path of that space holds it,
    and `agent create` prints the agent's executable entry and its controls."""
    relative = Path("rel") / AGENT
    made = world.ctx("bootstrap", "--storage", relative, "--json", cwd=world.top, env=clean_env())
    assert made.rc == 0, made
    boot = json_of(made)
    has(boot, root=str, created=list, repaired=list, problems=list, warnings=list)
    root = boot["root"]
    assert root == str(world.top / relative)
    assert {"bin", "tool", "agent", "model", "home", "shared"} <= set(boot["created"])

    def at(*args, **kw) -> Run:
        return world.ctx("--storage", root, *args, cwd=Path("/"), env=clean_env(), **kw)

    init = at("queue", "init", "--project", SPACE, "--json")
    assert init.rc == 0, init
    queue = json_of(init)["queue"]
    assert queue == f"{root}/shared/{SPACE}/queue"
    space = json_of(at("shared", "create", SPACE, "--json"))
    assert space["path"] + "/queue" == queue and space["created"] == []
    job = world.ctx("queue", "publish", "--queue", queue, "-", input=json.dumps(REQUEST),
                    cwd=Path("/"), env=clean_env()).out.strip()  # fmt: skip
    assert json_of(at("queue", "show", "--project", SPACE, job, "--json"))["state"] == "pending"

    request = json.dumps({"name": AGENT, "label": LABEL, "tools": ["fs.stat"]})
    created = at("agent", "create", "-", "--json", input=request)
    assert created.rc == 0, created
    agent = json_of(created)
    has(agent, name=str, entry=str, controls=str, identity=dict)
    assert agent["entry"] == f"{root}/agent/{AGENT}" and os.access(agent["entry"], os.X_OK)
    assert Path(agent["controls"], "label").read_text().strip() == LABEL
    listed = world.bash(f"ctx --storage {shlex.quote(root)} agent list | awk '{{print $1}}'")
    assert listed.stdout == AGENT + "\n", listed
    shown = json_of(at("agent", "show", listed.stdout.strip(), "--json"))
    assert (shown["name"], shown["label"]) == (AGENT, LABEL)


def test_man_topics_listed_are_the_pages_man_prints(world: World) -> None:
    """D-1: each topic (and page name) `ctx man --json` lists prints the installed page its
    `path` names; the text listing's first column is the same topics."""
    listed = world.ctx("man", "--json")
    assert listed.rc == 0, listed
    pages = json_of(listed)
    topics = [p["topic"] for p in pages]
    assert topics == ["README", "agent", "tool", "model", "coreutils", "root-abi", "session",
                      "provider"]  # fmt: skip
    assert [line.split()[0] for line in world.ctx("man").lines()] == topics
    for page in pages:
        has(page, topic=str, page=str, summary=str, origin=str, path=str)
        shown = world.ctx("man", page["topic"])
        assert (shown.rc, shown.out) == (0, Path(page["path"]).read_text()), page
    by_page = world.ctx("man", pages[1]["page"])
    assert by_page.out == Path(pages[1]["path"]).read_text()


def test_tsh_config_printed_settings_fed_back_change_nothing_and_json_shows_a_change(
    world: World,
) -> None:
    """H-4, H-3: the key=value lines `ctx tool tsh.config` prints, given back, change nothing;
    a setting changed shows in the next printing, and `--json`'s config is what it prints."""
    config = world.storage / "tool/tsh.d/config"
    before = config.read_bytes()
    printed = world.ctx("tool", "tsh.config")
    assert printed.lines() == ["max_loaded_tools=64", "cache_capacity=32", "window_percent=1"]
    fed = world.ctx("tool", "--json", "tsh.config", *printed.lines())
    assert fed.rc == 0 and json_of(fed)["changed"] == [], fed
    assert config.read_bytes() == before
    changed = world.ctx("tool", "--json", "tsh.config", "cache_capacity=64")
    assert json_of(changed)["changed"] == ["cache_capacity"], changed
    now = world.ctx("tool", "tsh.config").lines()
    assert now == [f"{k}={v}" for k, v in json_of(changed)["config"].items()]
    assert "cache_capacity=64" in now


# ------------------------------------------------------------------------------ terminals


@needs_terminal
def test_agent_start_json_feeds_watch_attach_session_show_and_stop(world: World) -> None:
    """A-1, A-2, docs/tools.md *The agent terminal*: the agent and session `agent start --json`
    prints (64 bytes each) are what watch, attach and stop take; what is typed through attach
    is recorded in that session; stop's pid is the one `agent show --json` and the agent's
    log name; watch ends with exit 0 when the terminal ends; the start's watch hint runs."""
    identity = world.agent(AGENT, LABEL, ["fs.stat"])
    world.append(world.tool_policy("fs.stat"), f"allow {LABEL} tool:fs.stat execute")
    ws = world.top / "ws"
    ws.mkdir(mode=0o755)
    os.chown(ws, identity["uid"], identity["gid"])
    procs: list[subprocess.Popen] = []

    def spawn(argv: list[str], out_path: Path, stdin=None) -> subprocess.Popen:
        with out_path.open("wb") as out:
            proc = subprocess.Popen(
                argv, stdin=stdin, stdout=out, stderr=subprocess.DEVNULL, env=world.env
            )
        procs.append(proc)
        return proc

    def holds(path: Path, data: bytes) -> bool:
        return data in path.read_bytes()

    ctx = str(BIN / "ctx")
    outs = {name: world.top / f"{name}.out" for name in ("watch", "attach", "hinted")}
    try:
        started_run = world.ctx("agent", "start", AGENT, "--session", SESSION, "--json", cwd=ws)
        assert started_run.rc == 0, started_run
        started = json_of(started_run)
        has(started, agent=str, session=str, socket=str, listening_at=str)
        assert (started["agent"], started["session"]) == (AGENT, SESSION)
        home = world.storage / "home" / str(identity["uid"]) / "agent" / AGENT / "session"
        assert started["socket"] == str(home / SESSION / "terminal" / "main.sock")
        # docs/tools.md: the A-2 link leads to /run/cortexfs/terminal/<uid>/<agent>/<session>,
        # the alias of where it listens, below the storage root's key
        alias = f"/run/cortexfs/terminal/{identity['uid']}/{AGENT}/{SESSION}/main.sock"
        assert os.readlink(started["socket"]) == alias
        key = hashlib.sha256(os.fsencode(os.path.realpath(world.storage))).hexdigest()[:16]
        assert started["listening_at"] == (
            f"/run/cortexfs/terminal/{key}/{identity['uid']}/{AGENT}/{SESSION}/main.sock"
        )
        assert os.readlink(alias) == started["listening_at"]
        prompt = f"{started['agent']}$ ".encode()
        names = [started["agent"], "--session", started["session"]]

        watcher = spawn([ctx, "agent", "watch", *names], outs["watch"])
        attacher = spawn([ctx, "agent", "attach", *names], outs["attach"], subprocess.PIPE)
        assert wait_for(lambda: holds(outs["attach"], prompt), 15)
        attacher.stdin.write(b"fs.stat /workspace\r")
        attacher.stdin.flush()
        assert wait_for(lambda: holds(outs["attach"], b"type: directory"), 15)
        attacher.stdin.write(b"\x1d")  # Ctrl-] detaches
        attacher.stdin.close()
        assert attacher.wait(timeout=15) == 0
        shown = world.ctx("session", "show", AGENT, started["session"], "--json")
        calls = [e for e in strict_lines(shown.out) if e["type"] == "tool_call"]
        assert [(e["object"], e["mode"], e["argv"]) for e in calls] == [
            ("tool/fs.stat", "terminal", ["/workspace"])
        ]

        text = world.ctx("agent", "start", AGENT, "--session", "hint", cwd=ws)
        assert text.rc == 0, text
        hint = re.search(r"watch: (ctx agent watch [^\n]*?)   join:", text.out)
        assert hint, text
        hinted = spawn(shlex.split(hint.group(1)), outs["hinted"])
        assert wait_for(lambda: holds(outs["hinted"], prompt), 15)
        assert world.ctx("agent", "stop", AGENT, "--session", "hint").rc == 0
        assert hinted.wait(timeout=15) == 0

        terminals = json_of(world.ctx("agent", "show", AGENT, "--json"))["terminals"]
        stopped = world.ctx("agent", "stop", *names, "--json")
        assert stopped.rc == 0, stopped
        answer = json_of(stopped)
        assert (answer["agent"], answer["session"]) == (AGENT, SESSION)
        has(answer, pid=int)
        assert [t["pid"] for t in terminals if t["session"] == SESSION] == [answer["pid"]]
        assert watcher.wait(timeout=15) == 0
        assert holds(outs["watch"], prompt)
    finally:
        for session in (SESSION, "hint"):
            world.ctx("agent", "stop", AGENT, "--session", session)
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()
    log = strict_lines((world.storage / "agent" / f"{AGENT}.d" / "log").read_text())
    pids = [e["pid"] for e in log if e["type"] == "terminal.started" and e["session"] == SESSION]
    assert pids == [answer["pid"]]
