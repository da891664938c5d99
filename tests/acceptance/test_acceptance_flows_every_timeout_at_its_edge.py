"""Every time limit and interval the docs name, just below, at and just above its edge
(SPEC Q-3, Q-5, Q-6, §2.4, W-1, W-2, W-4, T-3, T-6, T-7, S-2, A-2, M-4; docs/queue.md
"Liveness (Q-5)", "Configuration", "Command line"; docs/workers.md "One job", "Signals";
docs/tools.md "Running a tool", "Process group and bounds", "Hooks (T-6)", the terminal's
end, the MCP bridge and ctxmcp; docs/sessions.md "Commands"; the ``--help`` of ``ctx queue
claim|renew|recover|work``, ``ctx run``, ``ctx session tail``, ``ctx agent attach`` and
``ctxmcp list|project``).

For each limit: its documented range (zero, negative, a hair past the year and a day, past
2**63, not finite, not decimal: a usage error, exit 2 ``EINVAL``, nothing done; a bad
``queue/config`` value refused naming its line), its unit and exactness (a lease of ``--ttl
1.5`` ends 1.5 s after its claim or renewal, to the microsecond), and its outcome at the edge,
measured with ``time.monotonic()``: never before the limit, and within the limit plus a few
seconds on a loaded two-core machine.  A lease is judged alive until ``expires_at`` and gone
after it; a renewal in time keeps a job claimed; a worker renews a one-second lease every third
of it; a tool (native, terminal, MCP-backed, worker job) is killed with its process group at
its ``--timeout`` (``ETIMEDOUT``, stage ``run``, exit status 137) while one ending just under
it succeeds; pre-hooks share the call's timeout and post-hooks keep their own; an inbox temp
is stray on one side of the grace and not on the other; a ``ctxmcp`` server answering slower
than ``--timeout`` is refused; ``session tail --follow`` shows an event at once and ends on
Ctrl-C with 0; ``agent attach`` ends after one quiet second; a terminal's stop sends SIGHUP
two seconds after SIGINT, and a call that outlasts both is still recorded."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    QueueCLI,
    Run,
    alive,
    clean_env,
    ctx_run,
    kill_processes_of,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    wait_for,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, Raw, coder_host
from tests.acceptance.workercli import AGENT, allow_in_tool_policy, make_agent, shell_job
from tests.support.storage import copy_of_root

SCRATCH = scratch_top(__file__)
CTXMCP = REPO / ".venv" / "bin" / "ctxmcp"
# The interpreter of the MCP servers, which run as the agent: one every uid may run.
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
YEAR_AND_DAY = 31_622_400  # the largest lifetime, grace or timeout the docs allow, in seconds
SLACK = 3.0  # how long past a limit its outcome may come on a loaded two-core machine

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as another uid, which only root may switch to"
)

STUBBORN = "#!/bin/sh\ntrap '' INT HUP TERM\necho started\nwhile :; do sleep 0.1; done\n"
HANGS_UP = "#!/bin/sh\ntrap '' INT\necho started\nwhile :; do sleep 0.1; done\n"
GAPS = "#!/bin/sh\necho one\nsleep 0.5\necho two\nsleep 2\necho three\n"


# ------------------------------------------------------------------------------ helpers


@dataclass
class World:
    """A storage root of this file's own (a copy of the bootstrapped template, queue
    ``proj``), an outbox every uid may write, and the queue."""

    top: Path
    storage: Path
    box: Path
    queue: QueueCLI

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    def ctx(self, *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        return ctx_run(*args, **kw)


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(SCRATCH, "w-")
    storage = copy_of_root(_template, top / "storage")
    box = top / "box"
    box.mkdir()
    box.chmod(0o1777)
    try:
        yield World(top, storage, box, QueueCLI(storage, "proj"))
    finally:
        for pidfile in box.glob("*.pid"):
            with contextlib.suppress(ValueError, ProcessLookupError, OSError):
                os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)
        kill_processes_of(top)
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def agent_world(world: World) -> World:
    """:func:`world` with agent ``ci`` (uid nobody) allowed ``shell.exec`` in both layers of
    P-6."""
    make_agent(world.storage, ["shell.exec"])
    allow_in_tool_policy(world.storage, "shell.exec")
    return world


def stamp(text: str) -> datetime:
    parsed = datetime.fromisoformat(text)
    assert parsed.tzinfo is not None, text
    return parsed


def lifetime(lease: dict) -> timedelta:
    """How long a lease runs from its claim, or from its last renewal."""
    return stamp(lease["expires_at"]) - stamp(lease.get("renewed_at") or lease["claimed_at"])


def timed(*args, **kw) -> tuple[Run, float]:
    began = time.monotonic()
    done = ctx_run(*args, **kw)
    return done, time.monotonic() - began


def ctxmcp(world: World, *args: str) -> tuple[Run, float]:
    began = time.monotonic()
    done = subprocess.run([str(CTXMCP), *args], capture_output=True, text=True,
                          env=world.env, timeout=60)  # fmt: skip
    return Run(list(args), done.returncode, done.stdout, done.stderr), time.monotonic() - began


def frames(run: Run) -> list[dict]:
    return [json.loads(line) for line in run.out.splitlines() if line.strip()]


def pid_in(box: Path, name: str) -> int:
    path = box / f"{name}.pid"
    assert wait_for(lambda: path.is_file() and path.read_text().strip() != "", 10), name
    return int(path.read_text().split()[0])


def agent_uid(world: World, name: str = AGENT) -> int:
    return json.loads((world.storage / "agent" / f"{name}.d" / "identity").read_text())["uid"]


def uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(pid)


def concurrently(**calls) -> dict:
    """Each keyword's callable run in a thread of its own; their answers by keyword."""
    answers: dict = {}

    def run(name, call) -> None:
        answers[name] = call()

    threads = [threading.Thread(target=run, args=item) for item in calls.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert set(answers) == set(calls), answers
    return answers


def started_in_terminal(client: Raw, tool: str) -> None:
    """Type ``tool`` at tsh's prompt and wait until it says it started."""
    assert client.shows(AGENT_PROMPT), client.text()
    client.type(tool)
    assert client.shows("started"), client.text()


# --------------------------------------------------------------- terminals (longest first)


def test_a_call_killed_at_the_end_of_a_terminal_stop_still_gets_its_result_recorded(
    _template: Path,
) -> None:
    """SPEC T-7 (tool calls are logged to the tool's log and the session's events), S-2 (as
    ``tool_call``/``tool_result`` events), docs/sessions.md ("A recorded ``tool_call`` always
    gets its ``tool_result``, whatever goes wrong after it … even an interrupt of the
    caller"; only a session that cannot be written keeps a ``tool_call`` alone): a call that
    ignores the stop's SIGINT and SIGHUP, and is killed two seconds after the SIGHUP, is
    recorded as ended in the session and in the tool's log."""
    with coder_host(_template, SCRATCH, ["stubborn"], {}) as host:
        host.install("stubborn", STUBBORN)
        host.grant_in_tool("stubborn")
        term = host.start()
        client = Raw(term.listening_at, b"attach\n")
        try:
            started_in_terminal(client, "stubborn")
            stopped = host.ctx("agent", "stop", "coder", "--session", term.session, timeout=60)
        finally:
            client.close()
        host.started.remove(term.session)
        assert stopped.rc == 0, stopped
        calls = host.calls(term.session, "stubborn")
        assert [e["type"] for e in calls] == ["tool_call", "tool_result"], calls
        assert calls[1]["status"] == "error" and calls[1]["call"] == calls[0]["call"], calls
        log = read_jsonl(host.storage / "tool" / "stubborn.d" / "log")
        assert [line.get("call") for line in log] == [calls[0]["call"]], log


def test_attach_ends_after_one_quiet_second_and_a_stop_hangs_up_two_seconds_after_sigint(
    _template: Path,
) -> None:
    """``ctx agent attach --help`` ("Input piped in (a script) is sent, then the output is
    shown until the terminal has been quiet for a second"): a pause of half a second is not
    that second (both lines shown), a pause of two is (the line after it is not; exit 0).
    docs/tools.md (a terminal ending), in a second terminal meanwhile: a call still running
    two seconds after the stop's SIGINT — a tool that ignores SIGINT, as an interactive shell
    does — is sent SIGHUP, which ends it, and its result is recorded (EINTR at stage
    ``run``, exit status 129); ``ctx agent stop`` returns once the terminal has ended,
    between 2 and 2 + 1 (the group's grace) + SLACK seconds, and ``terminal.stopped`` is
    recorded."""
    with coder_host(_template, SCRATCH, ["gaps", "hangs-up"], {}) as host:
        host.install("gaps", GAPS)
        host.install("hangs-up", HANGS_UP)
        host.grant_in_tool("gaps")
        host.grant_in_tool("hangs-up")
        quiet, stopping = host.start(), host.start()
        attached: list[tuple[Run, float]] = []
        piped = ("agent", "attach", "coder", "--session", quiet.session)
        attaching = threading.Thread(
            target=lambda: attached.append(timed(*piped, input="gaps\n", env=host.env))
        )
        client = Raw(stopping.listening_at, b"attach\n")
        try:
            started_in_terminal(client, "hangs-up")
            attaching.start()
            began = time.monotonic()
            stopped = host.ctx("agent", "stop", "coder", "--session", stopping.session)
            took = time.monotonic() - began
        finally:
            client.close()
            if attaching.ident is not None:
                attaching.join(60)
        host.started.remove(stopping.session)
        assert stopped.rc == 0, stopped
        assert re.fullmatch(rf"stopped coder, session {stopping.session} \(pid \d+\)\n",
                            stopped.out)  # fmt: skip
        assert 2.0 <= took <= 3.0 + SLACK, took
        result = host.calls(stopping.session, "hangs-up", "tool_result")
        assert len(result) == 1, host.events(stopping.session)
        assert result[0]["errno"] == "EINTR" and result[0]["stage"] == "run", result
        assert result[0]["exit_status"] == 128 + signal.SIGHUP, result
        assert "terminal.stopped" in [e["type"] for e in host.lifecycle(stopping.session)]

        [(shown, took)] = attached
        assert shown.rc == 0, shown
        text = shown.out.replace("\r\n", "\n")
        assert "one\n" in text and "two\n" in text, shown
        assert "three" not in text, shown
        assert 0.5 + 1.0 <= took <= 1.5 + SLACK, took


# ------------------------------------------------------------------------------- ranges


def test_every_time_option_refuses_values_outside_its_documented_range(
    agent_world: World, child: subprocess.Popen
) -> None:
    """The ranges the help texts print — ``claim``/``renew --ttl [0.0<x<=31622400.0]``,
    ``recover --grace [0<=x<=31622400.0]``, ``work --ttl [1.0<=x<=31622400.0]`` ("at least
    1"), ``work --timeout [0<x<=31622400.0]``, ``ctxmcp --timeout [0<x<=31622400.0]`` — and
    docs/tools.md (``ctx run --timeout``: seconds above 0, "at most a year and a day"): zero
    (as ``0`` or ``1e-400``), negative, a thousandth past the maximum, past 2**63, not a
    number: a usage error, exit 2, ``EINVAL`` naming the option (also as the ``--json`` error
    object), with nothing claimed, renewed, removed, run or recorded; the maximum itself is
    taken."""
    world = agent_world
    queue = world.queue
    job = queue.publish(shell_job("echo edge"), name="edge")
    holder = ("--pid", str(child.pid))

    def refused(run: Run, option: str, program: str = "ctx") -> None:
        assert run.rc == 2, run
        assert f"{program}: EINVAL: Invalid value for '{option}'" in run.err, run
        if "--json" in run.argv:
            error = json.loads(run.out.strip().splitlines()[-1])
            assert error["error"] == "EINVAL" and error["errno"] == 22, run
        assert "Traceback" not in run.err, run

    for value in ("0", "1e-400", "-1", "31622400.001", "9223372036854775808", "nan", "abc"):
        refused(queue.run("claim", *holder, "--ttl", value, "--json"), "--ttl")
    assert queue.entries("pending") == {job} and queue.entries("inbox") == set()
    assert queue.claim(*holder, "--ttl", str(YEAR_AND_DAY)) == job
    lease = (queue.dir / "lease" / job / "worker").read_bytes()
    for value in ("0", "31622400.001"):
        refused(queue.run("renew", job, *holder, "--ttl", value, "--json"), "--ttl")
    assert (queue.dir / "lease" / job / "worker").read_bytes() == lease
    temp = queue.dir / "inbox" / "stray.publish.tmp"
    temp.write_text("{}")
    for value in ("-1", "31622400.001", "inf"):
        refused(queue.run("recover", "--reconcile", "--grace", value, "--json"), "--grace")
    assert temp.exists()
    kept = queue.run("recover", "--reconcile", "--grace", str(YEAR_AND_DAY), "--json")
    assert kept.rc == 0 and kept.json()["removed_temps"] == [] and temp.exists(), kept

    work = ("work", "--agent", AGENT, "--drain", "--json")
    for value in ("0.999", "31622400.001"):
        refused(queue.run(*work, "--ttl", value), "--ttl")
    for value in ("0", "inf"):
        refused(queue.run(*work, "--timeout", value), "--timeout")
    for value in ("0", "-1", "31622401", "nan"):
        refused(world.ctx("run", "--agent", AGENT, "--session", "edges", "--native",
                          "--timeout", value, "shell.exec", input='{"cmd": "echo no"}'),
                "--timeout")  # fmt: skip
    terminal = world.ctx("run", "--agent", AGENT, "--session", "edges", "--timeout", "0",
                         "shell.exec", '{"cmd": "echo no"}')  # fmt: skip
    refused(terminal, "--timeout")
    session = world.storage / "home" / str(agent_uid(world)) / "agent" / AGENT / "session" / "edges"
    assert read_jsonl(session / "events.jsonl") == []
    ran = world.ctx("run", "--agent", AGENT, "--session", "edges", "--native", "--timeout",
                    str(YEAR_AND_DAY), "shell.exec", input='{"cmd": "echo yes"}')  # fmt: skip
    assert ran.rc == 0 and frames(ran)[-1]["output"] == "yes\n", ran

    config, _ = mcp_setup(world)
    for value in ("-1", "31622400.001"):
        run, _ = ctxmcp(world, "list", "--config", str(config), "--server", "s", "--json",
                        "--timeout", value)  # fmt: skip
        refused(run, "--timeout", "ctxmcp")
    out = world.top / "out"
    run, _ = ctxmcp(world, "project", "--config", str(config), "--runtime-config", str(config),
                    "--server", "s", "--out", str(out), "--timeout", "0")  # fmt: skip
    refused(run, "--timeout", "ctxmcp")
    assert not out.exists()
    assert queue.state(job) == "claimed" and queue.entries("done") == set()


# ------------------------------------------------------------------------ leases by hand


def test_lease_lifetimes_are_exact_from_claim_renewal_and_config_and_one_too_short_fails(
    world: World, child: subprocess.Popen
) -> None:
    """``--ttl`` is seconds from the claim (``claim --help``), a renewal lasts ``--ttl`` from
    its ``renewed_at``, by default "as long as the lease was taken or last renewed for"
    (``renew --help``; docs/queue.md: ``claim --ttl 1000`` then ``renew``, 1000 s more), a
    claim without ``--ttl`` lasts ``lease_ttl`` (300 by default; "above 0, at most 366 days",
    any other value EINVAL naming its line, exit 1) — each to the microsecond.  A claim whose
    lease expires before it returns (``--ttl 0.000001``) names no job: ETIMEDOUT, exit 1, and
    ``recover`` returns the job to pending."""
    queue = world.queue
    holder = ("--pid", str(child.pid))
    job = queue.publish(name="lives")

    def claimed_for(*args: str) -> timedelta:
        assert queue.claim(*holder, *args) == job
        return lifetime(queue.lease(job))

    def release() -> None:
        (queue.dir / "lease" / job / "worker").unlink()  # a claim that never ran: requeued
        assert queue.run("recover", "--reconcile").rc == 0
        assert queue.state(job) == "pending"

    assert claimed_for() == timedelta(seconds=300)
    for ttl, expected in ((None, 300), ("1000", 1000), (None, 1000), ("1.5", 1.5)):
        renewed = queue.run("renew", job, *holder, *(("--ttl", ttl) if ttl else ()))
        assert renewed.rc == 0, renewed
        assert "renewed_at" in queue.lease(job)
        assert lifetime(queue.lease(job)) == timedelta(seconds=expected), (ttl, queue.lease(job))
    release()
    assert claimed_for("--ttl", "1.5") == timedelta(seconds=1.5)
    release()

    config = queue.dir / "config"
    original = config.read_text()
    line = len(original.splitlines()) + 1
    for value, given, expected in (("2.5", (), 2.5), ("2.5", ("--ttl", "4"), 4)):
        config.write_text(f"{original}lease_ttl={value}\n")
        assert claimed_for(*given) == timedelta(seconds=expected), value
        release()
    for value in ("0", "31622401", "nan"):
        config.write_text(f"{original}lease_ttl={value}\n")
        bad = queue.run("claim", *holder, "--json")
        assert bad.rc == 1 and bad.json()["error"] == "EINVAL", (value, bad)
        assert f"{config}:{line}: lease_ttl" in bad.err, (value, bad)
        assert queue.state(job) == "pending", value
    config.write_text(original)

    expired = queue.run("claim", *holder, "--ttl", "0.000001")
    assert expired.rc == 1 and expired.out == "", expired
    assert expired.err.startswith("ctx: ETIMEDOUT: ") and "do not run it" in expired.err
    recovered = queue.run("recover", "--json")
    assert recovered.rc == 0, recovered
    assert [e["job"] for e in recovered.json()["requeued"]] == [job], recovered
    assert "expired" in recovered.json()["requeued"][0]["detail"], recovered
    assert queue.state(job) == "pending"


def test_a_live_holder_keeps_its_job_until_expires_at_and_a_renewal_in_time_keeps_it_longer(
    world: World, child: subprocess.Popen
) -> None:
    """Q-5 and docs/queue.md (an expired lease proves its holder gone "even if its pid is
    still alive"; "a holder keeps its job only by renewing its lease in time"; a renewal
    "lands before recover judges the lease"): two jobs leased for 1.5 s to one live process.
    ``show`` judges the holder alive before ``expires_at`` and gone after it, saying it
    expired, never the other way round; the job renewed for 2 s before its lease lapsed stays
    alive past the first expiry; ``recover`` requeues only the lapsed one."""
    queue = world.queue
    lapsing, renewed = queue.publish(name="lapsing"), queue.publish(name="renewed")
    for _ in range(2):
        assert queue.claim("--pid", str(child.pid), "--ttl", "1.5") in (lapsing, renewed)
    expires = stamp(queue.lease(lapsing)["expires_at"])
    renewal = queue.run("renew", renewed, "--pid", str(child.pid), "--ttl", "2")
    assert renewal.rc == 0, renewal
    assert lifetime(queue.lease(renewed)) == timedelta(seconds=2)
    assert stamp(queue.lease(renewed)["renewed_at"]) < expires  # in time
    renewed_until = stamp(queue.lease(renewed)["expires_at"])
    early = queue.run("recover", "--json")
    assert early.rc == 0 and early.json()["requeued"] == [], early

    verdicts: list[tuple[datetime, datetime, dict]] = []
    while datetime.now(UTC) < expires + timedelta(seconds=SLACK):
        before = datetime.now(UTC)
        shown = queue.run("show", lapsing, "--json")
        assert shown.rc == 0, shown
        verdicts.append((before, datetime.now(UTC), shown.json()["holder"]))
        if verdicts[-1][2]["state"] == "gone":
            break
        time.sleep(0.1)
    for before, after, holder in verdicts:
        if holder["state"] == "gone":
            assert after >= expires, (after, expires, holder)
            assert "expired at" in holder["reason"], holder
        else:
            assert holder["state"] == "alive", holder
            assert before < expires + timedelta(seconds=0.2), (before, expires, holder)
    assert verdicts[-1][2]["state"] == "gone", verdicts

    recovered = queue.run("recover", "--json")
    checked = datetime.now(UTC)
    assert recovered.rc == 0, recovered
    assert [e["job"] for e in recovered.json()["requeued"]] == [lapsing], recovered
    assert queue.state(lapsing) == "pending"
    if checked < renewed_until:  # else the machine was too slow to tell
        assert queue.state(renewed) == "claimed"


def test_recover_grace_and_config_grace_age_an_inbox_temp_on_either_side_of_the_edge(
    world: World,
) -> None:
    """docs/queue.md (``grace``: 60 by default; ``recover --grace SECONDS`` overrides it;
    Q-6: stray temp files in ``inbox/`` older than the grace period are removed): a temp file
    30 s old is not stray under a grace of 35 s or the default, is stray under 25 s — from
    the config or ``--grace`` (listed by ``--dry-run``, removed by ``--reconcile``) — and a
    fresh one is removed with ``--grace 0`` only."""
    queue = world.queue
    config = queue.dir / "config"
    original = config.read_text()
    temp = queue.dir / "inbox" / "old.publish.tmp"
    temp.write_text("{}")

    def stale(*args: str) -> list[str]:
        then = time.time() - 30
        os.utime(temp, (then, then))
        report = queue.run("recover", "--reconcile", "--dry-run", "--json", *args)
        assert report.rc == 0, report
        return report.json()["stale_temps"]

    assert stale() == []  # grace=60, as init wrote it
    assert stale("--grace", "35") == []
    assert stale("--grace", "25") == ["inbox/old.publish.tmp"]
    config.write_text(f"{original}grace=25\n")
    assert stale() == ["inbox/old.publish.tmp"]
    assert stale("--grace", "35") == []
    config.write_text(f"{original}grace=35\n")
    assert stale() == []
    assert stale("--grace", "25") == ["inbox/old.publish.tmp"]
    for value in ("-1", "31622401", "nan"):
        config.write_text(f"{original}grace={value}\n")
        bad = queue.run("recover", "--json")
        assert bad.rc == 1 and bad.json()["error"] == "EINVAL", (value, bad)
        assert f"{config}:{len(original.splitlines()) + 1}: grace" in bad.err, (value, bad)
    config.write_text(original)
    assert temp.exists()

    removed = queue.run("recover", "--reconcile", "--grace", "25", "--json")
    assert removed.rc == 0 and removed.json()["removed_temps"] == ["inbox/old.publish.tmp"]
    fresh = queue.dir / "inbox" / "new.publish.tmp"
    fresh.write_text("{}")
    assert queue.run("recover", "--reconcile", "--json").json()["removed_temps"] == []
    zero = queue.run("recover", "--reconcile", "--grace", "0", "--json")
    assert zero.json()["removed_temps"] == ["inbox/new.publish.tmp"], zero
    assert queue.entries("inbox") == set()


# --------------------------------------------------------------------------------- workers


def test_a_job_past_the_worker_timeout_is_killed_with_its_group_and_one_just_under_it_is_done(
    agent_world: World,
) -> None:
    """W-4, docs/workers.md "One job" (a timeout is ``ETIMEDOUT``; the tool's whole process
    group is killed) and "A worker keeps no lease shorter than one second" (a ``lease_ttl``
    of 0.5 stops the worker before its first claim, exit 1, naming the file and both
    remedies; ``--ttl 1`` is enough): under ``--timeout 1`` a job that would run 30 s fails
    after no less than 1 s and within SLACK more, its background child dead too, with the
    runner's error; the next job, 0.3 s long, is done."""
    world = agent_world
    queue = world.queue
    slow = queue.publish(
        shell_job(f"sleep 30 & echo $! > {world.box}/child.pid; sleep 30"), name="slow"
    )
    quick = queue.publish(shell_job("sleep 0.3; echo under"), name="quick")
    config = queue.dir / "config"
    original = config.read_text()
    config.write_text(f"{original}lease_ttl=0.5\n")
    work = ("work", "--agent", AGENT, "--drain", "--json", "--timeout", "1")
    stopped = queue.run(*work)
    assert stopped.rc == 1, stopped
    error = json.loads(stopped.out.strip().splitlines()[-1])
    assert error["error"] == "EINVAL" and str(config) in error["message"], error
    assert "lease_ttl" in error["message"] and "--ttl" in error["message"], error
    assert queue.entries("pending") == {slow, quick} and queue.entries("claimed") == set()

    ran = queue.run(*work, "--ttl", "1")
    assert ran.rc == 0, ran
    state, result = queue.only_result(slow)
    assert state == "failed", result
    assert result["error"]["error"] == "ETIMEDOUT" and result["error"]["errno"] == 110, result
    assert result["error"]["stage"] == "run" and result["exit_status"] == 137, result
    assert result["error"]["message"] == "timed out after 1s; its process group was killed"
    assert result["reason"] == f"ETIMEDOUT: {result['error']['message']} [run]", result
    ran_for = (stamp(result["finished"]) - stamp(result["started"])).total_seconds()
    assert 1.0 <= ran_for <= 1.0 + SLACK, result
    assert wait_for(lambda: not alive(pid_in(world.box, "child")), 2)
    state, result = queue.only_result(quick)
    assert state == "done" and result["output"] == "under\n", result
    config.write_text(original)


def test_a_worker_renews_a_one_second_lease_every_third_so_it_never_lapses(
    agent_world: World,
) -> None:
    """docs/workers.md (the worker renews its lease every third of its lifetime; "the lease
    always has two thirds of its lifetime left after a renewal"; an expired lease lets
    ``recover`` requeue the job even while its holder lives): a 1.8 s job under ``--ttl 1``
    sees its lease renewed at least three times, each renewal exactly 1 s long and none
    late; a ``recover`` run all the while requeues nothing; the job runs and is done once."""
    world = agent_world
    queue = world.queue
    job = queue.publish(shell_job(f"echo run >> {world.box}/runs; sleep 1.8"), name="long")
    worker = subprocess.Popen(
        [*CTX_ARGV, "queue", "work", "--project", "proj", "--agent", AGENT, "--drain",
         "--json", "--ttl", "1", "--timeout", "20"],
        env=world.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    leases: dict[str, dict] = {}
    requeued: list = []
    done = threading.Event()

    def recover_all_the_while() -> None:
        while not done.wait(0.2):
            check = queue.run("recover", "--json")
            requeued.extend(check.json()["requeued"] if check.rc == 0 else [check.err])

    checker = threading.Thread(target=recover_all_the_while)
    checker.start()
    try:
        while worker.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                lease = json.loads((queue.dir / "lease" / job / "worker").read_text())
                leases[lease.get("renewed_at") or lease["claimed_at"]] = lease
            time.sleep(0.01)
        out, err = worker.communicate(timeout=30)
    finally:
        done.set()
        checker.join(30)
        if worker.poll() is None:
            worker.kill()
            worker.communicate()
    assert worker.returncode == 0, (out, err)
    assert requeued == [], requeued
    assert queue.only_result(job)[0] == "done"
    assert (world.box / "runs").read_text() == "run\n"
    assert sum("renewed_at" in lease for lease in leases.values()) >= 3, leases
    for lease in leases.values():
        assert lifetime(lease) == timedelta(seconds=1), lease
    starts = sorted(stamp(key) for key in leases)
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(starts)]
    assert all(gap < 1.0 for gap in gaps), gaps  # each renewal came before the lease lapsed


def test_sigterm_lets_the_running_job_time_out_then_the_worker_exits_0(
    agent_world: World,
) -> None:
    """W-4 ("SIGTERM to a worker lets the running job finish or time out, then exits
    cleanly"), W-2 and docs/workers.md "Signals", "Waiting for work" (every wait bounded,
    2 s): SIGTERM during a job with ``--timeout 1`` ends that job at its timeout (failed,
    ETIMEDOUT, run for at least 1 s), the worker exits 0 within 1 + SLACK seconds of the
    signal, ``stopped_by`` SIGTERM, the next job still pending; a worker waiting on an
    empty queue exits 0 within SLACK seconds of its SIGTERM."""
    world = agent_world
    queue = world.queue
    slow = queue.publish(shell_job("sleep 30"), name="slow")
    later = queue.publish(shell_job("echo later"), name="later")
    assert world.ctx("queue", "init", "--project", "idle").rc == 0
    argv = [*CTX_ARGV, "queue", "work", "--agent", AGENT, "--json", "--timeout", "1"]
    busy = subprocess.Popen([*argv, "--project", "proj"], env=world.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    idle = subprocess.Popen([*argv, "--project", "idle"], env=world.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert busy.stdout is not None and idle.stdout is not None
        events = [json.loads(busy.stdout.readline()) for _ in range(2)]
        assert [e["event"] for e in events] == ["start", "claim"], events
        assert json.loads(idle.stdout.readline())["event"] == "start"
        time.sleep(0.2)
        busy.send_signal(signal.SIGTERM)
        idle.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        rest, err = busy.communicate(timeout=30)
        ended = time.monotonic()
        idle_out, idle_err = idle.communicate(timeout=30)
        idle_ended = time.monotonic()
    finally:
        for proc in (busy, idle):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert busy.returncode == 0, (rest, err)
    assert ended - signalled <= 1.0 + SLACK, ended - signalled
    stop = json.loads(rest.strip().splitlines()[-1])
    assert stop["event"] == "stop" and stop["stopped_by"] == "SIGTERM", stop
    state, result = queue.only_result(slow)
    assert state == "failed" and result["error"]["error"] == "ETIMEDOUT", result
    assert (stamp(result["finished"]) - stamp(result["started"])).total_seconds() >= 1.0, result
    assert queue.state(later) == "pending"
    assert idle.returncode == 0, (idle_out, idle_err)
    assert idle_ended - signalled <= SLACK, idle_ended - signalled
    assert json.loads(idle_out.strip().splitlines()[-1])["stopped_by"] == "SIGTERM"


# ------------------------------------------------------------------------------ ctx run


def test_run_timeout_kills_the_group_at_its_edge_in_both_modes_and_spares_a_call_under_it(
    agent_world: World,
) -> None:
    """docs/tools.md "Process group and bounds" (a timeout kills the whole group with SIGKILL;
    a process that left the group with ``setsid`` is not in it), the ETIMEDOUT message of
    "Errors you will see", ``ctx run --help`` (terminal mode: the tool's exit status): native
    ``--timeout 1`` and ``0.5`` and terminal ``--timeout 1`` end a 30 s tool no earlier than
    their limit and within SLACK more, exit status 137, the message giving the limit as
    written; the group's child is dead and the ``setsid`` one still runs, as the agent; a
    0.3 s call under ``--timeout 1.5`` succeeds.  A tool that exits leaving a child in its
    group: the child is killed "after a one-second grace" — it runs on for about a second
    (from 0.8 to 1 + SLACK s) and no longer once the call has returned."""
    world = agent_world
    box = world.box
    native = ("run", "--agent", AGENT, "--native", "--timeout")
    hung = json.dumps(
        {"cmd": f"sleep 30 & echo $! > {box}/group.pid; "
                f"setsid sleep 33 & echo $! > {box}/away.pid; sleep 30"}
    )  # fmt: skip
    sleeper = json.dumps({"cmd": "sleep 30"})
    leaves = json.dumps(
        {"cmd": f"(while :; do date +%s.%N >> {box}/beat; sleep 0.05; done) & "
                f"date +%s.%N > {box}/exited; echo done"}
    )  # fmt: skip
    answers = concurrently(
        one=lambda: timed(*native, "1", "shell.exec", input=hung, env=world.env),
        half=lambda: timed(*native, "0.5", "shell.exec", input=sleeper, env=world.env),
        terminal=lambda: timed(
            "run", "--agent", AGENT, "--timeout", "1", "shell.exec", sleeper, env=world.env
        ),
        under=lambda: timed(
            *native, "1.5", "shell.exec", input='{"cmd": "sleep 0.3; echo ok"}', env=world.env
        ),
        leaving=lambda: timed(*native, "20", "shell.exec", input=leaves, env=world.env),
    )
    for name, limit, text in (("one", 1.0, "1s"), ("half", 0.5, "0.5s")):
        ran, took = answers[name]
        assert ran.rc == 1, ran
        result = frames(ran)[-1]
        assert result["type"] == "result" and result["status"] == "error", result
        assert result["error"]["error"] == "ETIMEDOUT" and result["error"]["stage"] == "run"
        assert result["exit_status"] == 137, result
        assert result["error"]["message"] == f"timed out after {text}; its process group was killed"
        assert limit <= took <= limit + SLACK, (name, took)
    assert wait_for(lambda: not alive(pid_in(box, "group")), 1.0)
    away = pid_in(box, "away")
    assert alive(away) and uid_of(away) == agent_uid(world)

    ran, took = answers["terminal"]
    assert ran.rc == 137, ran
    assert ran.err.strip() == "ctx: ETIMEDOUT: timed out after 1s; its process group was killed"
    assert 1.0 <= took <= 1.0 + SLACK, took
    ran, _ = answers["under"]
    assert ran.rc == 0 and frames(ran)[-1]["output"] == "ok\n", ran

    ran, took = answers["leaving"]
    assert ran.rc == 0 and frames(ran)[-1]["output"] == "done\n", ran
    beats = (box / "beat").read_text()
    last_beat = beats.split("\n")[:-1][-1]  # the last whole line
    outlived = float(last_beat) - float((box / "exited").read_text())
    assert 0.8 <= outlived <= 1.0 + SLACK, outlived  # the group's one-second grace
    assert 1.0 <= took <= 1.0 + SLACK, took
    time.sleep(0.2)
    assert (box / "beat").read_text() == beats  # nothing of the call outlives it


PRE_HOOK = """#!/bin/sh
input=$(cat)
case "$input" in
  *PRE-FIVE*) sleep 5 ;;
  *PRE-PART*) sleep 0.6 ;;
esac
exit 0
"""

POST_HOOK = """#!/bin/sh
input=$(cat)
case "$input" in
  *POST-LONG*) sleep 1.5 ;;
esac
exit 0
"""


def test_pre_hooks_share_the_call_timeout_and_post_hooks_keep_their_own(
    agent_world: World,
) -> None:
    """T-6, docs/tools.md "Hooks (T-6)" (a call's timeout "starts with the pre-hooks, which
    share it with the tool": a pre-hook still running when it runs out is killed and vetoes
    the call, ``EACCES``, "ran past the call's timeout (killed after …s)", and the tool gets
    what they left; "Post-hooks see a result already decided and keep their own ten
    seconds"): under ``--timeout 1`` a 5 s pre-hook vetoes at 1 s and the tool never runs; a
    0.6 s pre-hook leaves a 0.7 s tool too little (ETIMEDOUT at stage ``run``) where
    ``--timeout 2`` leaves enough; a 1.5 s post-hook runs to its end past the call's 1 s."""
    world = agent_world
    hooks = world.storage / "tool" / "shell.exec.d" / "hooks"
    for where, text in (("pre.d", PRE_HOOK), ("post.d", POST_HOOK)):
        (hooks / where / "10-wait").write_text(text)
        (hooks / where / "10-wait").chmod(0o755)

    def call(limit: str, cmd: str):
        payload = json.dumps({"cmd": cmd})
        return lambda: timed(
            "run", "--agent", AGENT, "--native", "--timeout", limit, "shell.exec",
            input=payload, env=world.env,
        )  # fmt: skip

    answers = concurrently(
        vetoed=call("1", "echo never # PRE-FIVE"),
        squeezed=call("1", "sleep 0.7; echo late # PRE-PART"),
        roomy=call("2", "sleep 0.7; echo in-time # PRE-PART"),
        post=call("1", "echo quick # POST-LONG"),
    )
    ran, took = answers["vetoed"]
    result = frames(ran)[-1]
    assert ran.rc == 1 and result["error"]["error"] == "EACCES", ran
    assert result["error"]["stage"] == "hook" and result["exit_status"] is None, result
    message = re.fullmatch(
        r"hooks/pre\.d/10-wait vetoed the call \(exit 137\): ran past the call's timeout "
        r"\(killed after (\d+\.\d+)s\)",
        result["error"]["message"],
    )
    assert message, result["error"]
    assert 0.9 <= float(message.group(1)) <= 1.0 + SLACK, message.group(1)
    assert 1.0 <= took <= 1.0 + SLACK, took

    ran, took = answers["squeezed"]
    result = frames(ran)[-1]
    assert ran.rc == 1 and result["error"]["error"] == "ETIMEDOUT", ran
    assert result["error"]["stage"] == "run" and result["exit_status"] == 137, result
    assert 1.0 <= took <= 1.0 + SLACK, took

    ran, _ = answers["roomy"]
    assert ran.rc == 0 and frames(ran)[-1]["output"] == "in-time\n", ran

    ran, took = answers["post"]
    result = frames(ran)[-1]
    assert ran.rc == 0 and result["status"] == "ok" and result["post_hooks"] == [], ran
    assert took >= 1.5, took


# -------------------------------------------------------------------------------- sessions


def test_session_tail_follow_shows_an_event_at_once_and_ctrl_c_ends_it_with_0(
    agent_world: World,
) -> None:
    """docs/sessions.md "Commands" (``tail --follow`` keeps printing new events and "runs
    until Ctrl-C, which ends it with exit 0"; ``-n`` is 0 to 2**63 - 1, any other number
    EINVAL exit 2): ``-n 0 --follow`` prints nothing of the past, prints a new call's two
    events within SLACK seconds of the call, and ends with 0 within SLACK seconds of
    SIGINT."""
    world = agent_world
    first = world.ctx("run", "--agent", AGENT, "shell.exec", '{"cmd": "echo before"}')
    assert first.rc == 0, first
    everything = world.ctx("session", "tail", AGENT, "-n", "9223372036854775807", "--json")
    assert everything.rc == 0 and len(everything.lines()) == 2, everything
    for value in ("9223372036854775808", "-1"):
        refused = world.ctx("session", "tail", AGENT, "-n", value)
        assert refused.rc == 2 and "ctx: EINVAL: Invalid value for '-n'" in refused.err, refused

    follower = subprocess.Popen(
        [*CTX_ARGV, "session", "tail", AGENT, "-n", "0", "--follow", "--json"],
        env=world.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    lines: list[dict] = []
    try:
        time.sleep(0.3)
        called = world.ctx("run", "--agent", AGENT, "shell.exec", '{"cmd": "echo after"}')
        assert called.rc == 0, called
        after_call = time.monotonic()
        out = follower.stdout
        assert out is not None
        reader = threading.Thread(
            target=lambda: lines.extend(json.loads(out.readline()) for _ in range(2)),
            daemon=True,
        )
        reader.start()
        reader.join(SLACK)
        assert time.monotonic() - after_call <= SLACK
        assert [e["type"] for e in lines] == ["tool_call", "tool_result"], lines
        follower.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        follower.wait(timeout=10)
        assert time.monotonic() - interrupted <= SLACK
        _, err = follower.communicate()
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.communicate()
    assert follower.returncode == 0, err
    assert b"Traceback" not in err, err


# ------------------------------------------------------------------------------------- MCP

# A stdio MCP server answering each request after argv[1] seconds (never, when "never"),
# ending at the end of its input; a tools/call writes its pid to argv[2] and never answers.
MCP_SERVER = r"""
import json, os, sys, time
delay, trace = sys.argv[1], sys.argv[2]
def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    if message["method"] == "tools/call":
        with open(trace, "a") as out:
            out.write(f"{os.getpid()}\n")
        time.sleep(300)
    if delay == "never":
        continue
    time.sleep(float(delay))
    if message["method"] == "initialize":
        send({"jsonrpc": "2.0", "id": message["id"], "result": {
            "protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
            "serverInfo": {"name": "edge", "version": "1"}}})
    elif message["method"] == "tools/list":
        send({"jsonrpc": "2.0", "id": message["id"], "result": {"tools": [
            {"name": "hang", "description": "Never answers a call.",
             "inputSchema": {"type": "object"}}]}})
"""


def mcp_setup(world: World) -> tuple[Path, Path]:
    """``mcp/`` (root's, read by all) holding the server and ``mcp.json`` with the servers
    ``slow`` (0.6 s an answer), ``silent`` (no answer) and ``s`` (at once); the file a
    call's server writes its pid to."""
    mcp = world.top / "mcp"
    mcp.mkdir(mode=0o755, exist_ok=True)
    mcp.chmod(0o755)
    (mcp / "server.py").write_text(MCP_SERVER)
    (mcp / "server.py").chmod(0o644)
    trace = world.box / "calls"
    servers = {
        name: {"command": PYTHON, "args": [str(mcp / "server.py"), delay, str(trace)]}
        for name, delay in (("slow", "0.6"), ("silent", "never"), ("s", "0"))
    }
    (mcp / "mcp.json").write_text(json.dumps({"mcpServers": servers}))
    (mcp / "mcp.json").chmod(0o644)
    return mcp / "mcp.json", trace


def test_ctxmcp_timeout_waits_for_each_answer_up_to_its_edge(world: World) -> None:
    """``ctxmcp list --help`` (``--timeout SECONDS``: "Seconds to wait for each answer of the
    server"), docs/tools.md (a server that "fell silent past ``--timeout``" is exit 1 with
    its errno): answers 0.6 s apart are taken under ``--timeout 1.5`` and refused under 0.3
    (ETIMEDOUT naming ``initialize`` and the limit), a silent server is refused after 0.5 s,
    no earlier."""
    config, _ = mcp_setup(world)
    listing = ("list", "--config", str(config), "--json", "--server")
    answers = concurrently(
        roomy=lambda: ctxmcp(world, *listing, "slow", "--timeout", "1.5"),
        short=lambda: ctxmcp(world, *listing, "slow", "--timeout", "0.3"),
        silent=lambda: ctxmcp(world, *listing, "silent", "--timeout", "0.5"),
    )
    listed, _ = answers["roomy"]
    assert listed.rc == 0, listed
    assert [t["name"] for t in json.loads(listed.out)["tools"]] == ["slow.hang"], listed
    for name, limit in (("short", 0.3), ("silent", 0.5)):
        refused, took = answers[name]
        assert refused.rc == 1, refused
        error = json.loads(refused.out)
        assert error["error"] == "ETIMEDOUT" and error["errno"] == 110, refused
        assert "initialize" in error["message"] and f"{limit} s" in error["message"], error
        assert limit <= took <= limit + SLACK, (name, took)


def test_an_mcp_backed_call_past_its_timeout_is_killed_with_its_server(world: World) -> None:
    """docs/tools.md, the MCP bridge (it starts the server "in the call's own process group
    (the runner's timeout kills both)" and awaits the answer "as long as the call's timeout
    allows"), M-4 (a projected tool is an ordinary tool): a server that never answers
    ``tools/call`` fails the call at ``--timeout 1.5`` — ETIMEDOUT, stage ``run``, exit status
    137, no earlier and within SLACK more — and its server process is gone."""
    config, trace = mcp_setup(world)
    trace.touch()
    trace.chmod(0o666)
    out = world.top / "candidates"
    projected, _ = ctxmcp(world, "project", "--config", str(config), "--runtime-config",
                          str(config), "--server", "s", "--out", str(out))  # fmt: skip
    assert projected.rc == 0, projected
    installed = world.ctx("object", "install", out / "s.hang.manifest.json", "--tier", "system")
    assert installed.rc == 0, installed
    allow_in_tool_policy(world.storage, "s.hang", "mcpuser_t")
    req = {"name": "mcpuser", "label": "mcpuser_t", "tools": ["s.hang"],
           "mount": [[str(config.parent), str(config.parent), "ro"]]}  # fmt: skip
    made = world.ctx("agent", "create", "-", input=json.dumps(req))
    assert made.rc == 0, made

    ran, took = timed("run", "--agent", "mcpuser", "--native", "--timeout", "1.5", "s.hang",
                      input="{}", env=world.env)  # fmt: skip
    assert ran.rc == 1, ran
    result = frames(ran)[-1]
    assert result["error"]["error"] == "ETIMEDOUT" and result["error"]["stage"] == "run", result
    assert result["exit_status"] == 137, result
    assert result["error"]["message"] == "timed out after 1.5s; its process group was killed"
    assert 1.5 <= took <= 1.5 + SLACK, took
    servers = [int(pid) for pid in trace.read_text().split()]
    assert len(servers) == 1, servers
    assert wait_for(lambda: not alive(servers[0]), 1.0), servers
