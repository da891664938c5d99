"""The queue's command line against a model of SPEC §2 (Q-1 … Q-8, I-1, I-3, I-4, I-5, §2.4;
docs/queue.md): random sequences of ``ctx queue`` commands, each a real subprocess, checked
after every step against the model and against the files of the queue.

The steps: ``publish`` (named, unnamed, ``--batch``, a name already taken, bad requests),
``claim`` (``--pid`` of a live holder, of a dead one, of none: the calling process; ``--ttl``),
``renew`` and ``finish --ok``/``--error`` by the holder and by others, ``recover`` (plain,
``--reconcile``, ``--dry-run``, ``--grace``), ``show --json``, a holder killed, leases left to
expire (short ``--ttl``, waited on with a deadline), a claimer SIGKILLed at a random moment,
and damage of the kinds docs/queue.md lists (a stray temp file in ``inbox/``, an empty
``claimed/J``, a claim whose lease file is gone).

After every step: every published job is in exactly one state (or is one of the incomplete
pairs the model knows of); no job is lost, and no result is written twice or rewritten; no
lease changes but by its own claim or renewal; ``status --json`` counts agree with ``list
--json`` and with the directories; ``inbox/`` holds exactly the temps the model expects.
Exit statuses and ``--json`` shapes are those of §2.4; ``recover`` never touches a job whose
holder is alive and whose lease is valid.

The run has fixed seeds (the same sequences every run) and is small: two times 12 sequences of
up to 20 steps, one per process under ``-n 2``."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    SUFFIX,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    rfc3339,
    scratch_top,
    wait_for,
)

# ------------------------------------------------------------------------------ helpers

TOP = scratch_top(__file__)
POOL = ["a", "b", "c", "d"]  # the names given with --name; unnamed publishes get new ones
SHORT_TTL = 1  # seconds: a lease meant to expire during the sequence
STATUS_KEYS = {
    "queue", "pending", "claimed", "done", "failed", "conflict", "counts", "ignored",
    "incomplete", "conflicts", "temps", "owned_by_others", "group_not_inherited",
}  # fmt: skip
RECOVER_KEYS = {
    "reconcile", "dry_run", "consistent", "requeued", "repaired", "untouched", "incomplete",
    "conflicts", "removed_temps", "stale_temps", "ignored", "errors",
}  # fmt: skip
BAD_REQUESTS = {
    "not JSON": "tool=fs.read",
    "no tool": '{"input": {}}',
    "a name twice": '{"tool": "fs.read", "input": {}, "tool": "fs.write"}',
    "NaN": '{"tool": "fs.read", "input": {"n": NaN}}',
    "not an object": '["fs.read"]',
}


def good_request(tag: int) -> str:
    return json.dumps({"tool": "fs.read", "input": {"path": "README.md", "n": tag}})


def epoch(stamp: str) -> float:
    return rfc3339(stamp).timestamp()


def assert_error(run: Run, code: int, errno_name: str | None = None) -> None:
    """A refusal as §2.4 gives it: the exit status, one ``ctx: ERRNO: …`` line on stderr, and
    (with ``--json``) the same error as one object on stdout."""
    assert run.rc == code, run
    assert run.err.startswith("ctx: "), run
    if "--json" in run.argv:
        shape = run.json()
        assert set(shape) >= {"error", "errno", "message"}, run
        if errno_name is not None:
            assert shape["error"] == errno_name, run


@dataclass
class Job:
    """What the model knows of one job.  ``state``: pending, claimed, unleased (its lease file
    removed: an incomplete pair), done or failed; ``empty_claim``: a pending job with an empty
    ``claimed/J`` beside it."""

    state: str
    empty_claim: bool = False
    holder: int | None = None
    expires: float | None = None
    lease: bytes | None = None
    result: bytes | None = None

    def listed_as(self) -> str:
        if self.state == "unleased" or (self.state == "pending" and self.empty_claim):
            return "incomplete"
        return self.state


# ------------------------------------------------------------------------------ the machine


class QueueCommandLine(RuleBasedStateMachine):
    storage: Path  # set by the test: one bootstrapped root per test process
    serial = 0

    def __init__(self) -> None:
        super().__init__()
        QueueCommandLine.serial += 1
        self.project = f"q{QueueCommandLine.serial}"
        self.queue = self.storage / "shared" / self.project / "queue"
        self.env = clean_env(
            CTX_STORAGE=str(self.storage), XDG_CACHE_HOME=str(self.storage.parent / "cache")
        )
        made = self.ctx("init")
        assert made.rc == 0, made
        self.jobs: dict[str, Job] = {}
        self.temps: dict[str, float] = {}  # inbox name -> mtime
        self.holders: list[subprocess.Popen] = []
        self.dead: set[int] = set()
        self.tag = 0

    def teardown(self) -> None:
        for proc in self.holders:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        shutil.rmtree(self.storage / "shared" / self.project, ignore_errors=True)

    # -------------------------------------------------------------------- the world

    def ctx(self, command: str, *args, input: str = "") -> Run:
        return ctx_run(
            "queue", command, "--project", self.project, *args, input=input, env=self.env
        )

    def next_tag(self) -> int:
        self.tag += 1
        return self.tag

    def live_holder(self, fresh: bool) -> int:
        running = [p for p in self.holders if p.poll() is None]
        if fresh or not running:
            proc = subprocess.Popen(["sleep", "1000"], stdin=subprocess.DEVNULL)
            self.holders.append(proc)
            return proc.pid
        return running[0].pid

    def dead_pid(self) -> int:
        proc = subprocess.Popen(["true"])
        proc.wait()
        self.dead.add(proc.pid)
        return proc.pid

    def is_alive(self, pid: int) -> bool:
        if pid == os.getpid():
            return True
        if pid in self.dead:
            return False
        return any(p.pid == pid and p.poll() is None for p in self.holders)

    def lease_path(self, job: str) -> Path:
        return self.queue / "lease" / job / "worker"

    def read_lease(self, job: str) -> tuple[dict, bytes]:
        data = self.lease_path(job).read_bytes()
        return json.loads(data), data

    def settle_expiries(self) -> None:
        """No lease may expire while a command judges it: one close to its expiry is waited
        past (short leases only; the long ones are hundreds of seconds from it)."""
        for name, job in self.jobs.items():
            close = job.expires is not None and -0.5 < job.expires - time.time() < SHORT_TTL + 3
            if job.state == "claimed" and close:
                until = job.expires + 0.5
                assert wait_for(lambda u=until: time.time() > u, SHORT_TTL + 5), name

    def holder_gone(self, job: Job) -> bool:
        return not self.is_alive(job.holder) or time.time() > job.expires

    def claimable(self) -> set[str]:
        return {n for n, j in self.jobs.items() if j.state == "pending" and not j.empty_claim}

    def incomplete(self) -> set[str]:
        return {n for n, j in self.jobs.items() if j.listed_as() == "incomplete"}

    def pick(self, data) -> str:
        """A job for renew or finish: a claimed one more often than not, else any, or one the
        queue never had."""
        claimed = sorted(n for n, j in self.jobs.items() if j.state == "claimed")
        if claimed and data.draw(st.integers(0, 3), label="claimed?"):
            return data.draw(st.sampled_from(claimed), label="job")
        return data.draw(st.sampled_from([*sorted(self.jobs), "nosuch" + SUFFIX]), label="job")

    def took_claim(self, name: str, pid: int) -> None:
        lease, data = self.read_lease(name)
        assert lease["pid"] == pid, (name, lease)
        job = self.jobs[name]
        job.state, job.holder, job.lease = "claimed", pid, data
        job.expires, job.empty_claim = epoch(lease["expires_at"]), False

    # -------------------------------------------------------------------- publish

    @rule(
        name=st.sampled_from(POOL), suffix=st.booleans(), as_json=st.booleans(),
        from_file=st.booleans(),
    )  # fmt: skip
    def publish_named(self, name: str, suffix: bool, as_json: bool, from_file: bool) -> None:
        job = name + SUFFIX
        given = job if suffix else name
        flags = ["--json"] if as_json else []
        body = good_request(self.next_tag())
        if from_file:
            source = self.storage.parent / "request.json"
            source.write_text(body)
            run = self.ctx("publish", "--name", given, *flags, source)
        else:
            run = self.ctx("publish", "--name", given, *flags, "-", input=body)
        if job in self.jobs or f"{job}.publish.tmp" in self.temps:
            assert_error(run, 1, "EEXIST")  # never overwritten
            return
        assert run.rc == 0, run
        assert (run.json() == {"name": job}) if as_json else (run.out == job + "\n"), run
        self.jobs[job] = Job("pending")

    @initialize(count=st.integers(1, 3))
    def some_jobs(self, count: int) -> None:
        self.publish_unnamed(count, True, False, None)

    @rule(
        count=st.integers(1, 3), batch=st.booleans(), as_json=st.booleans(),
        bad=st.sampled_from([None, None, *sorted(BAD_REQUESTS)]),
    )  # fmt: skip
    def publish_unnamed(self, count: int, batch: bool, as_json: bool, bad: str | None) -> None:
        if bad is not None:
            self.publish_bad(bad, batch, as_json)
            return
        flags = ["--json"] if as_json else []
        if batch:
            lines = "".join(good_request(self.next_tag()) + "\n" for _ in range(count))
            run = self.ctx("publish", "--batch", *flags, "-", input=lines)
            assert run.rc == 0, run
            names = run.json()["names"] if as_json else run.lines()
            assert len(names) == count, run
        else:
            run = self.ctx("publish", *flags, "-", input=good_request(self.next_tag()))
            assert run.rc == 0, run
            names = [run.json()["name"]] if as_json else run.lines()
            assert len(names) == 1 and (not as_json or set(run.json()) == {"name"}), run
        assert len(set(names)) == len(names), run
        for name in names:
            assert name.endswith(SUFFIX) and name not in self.jobs, (name, run)
            self.jobs[name] = Job("pending")

    def publish_bad(self, kind: str, batch: bool, as_json: bool) -> None:
        flags = ["--json"] if as_json else []
        if batch:  # one bad line refuses the whole batch, the good lines with it
            lines = good_request(self.next_tag()) + "\n" + BAD_REQUESTS[kind] + "\n"
            run = self.ctx("publish", "--batch", *flags, "-", input=lines)
        else:
            run = self.ctx("publish", *flags, "-", input=BAD_REQUESTS[kind])
        assert_error(run, 1, "EINVAL")
        assert "--json" in run.argv or run.out == "", run

    # -------------------------------------------------------------------- claim

    @rule(
        holder=st.sampled_from(["live", "new live", "dead", "caller"]),
        ttl=st.sampled_from([None, 600, SHORT_TTL]),
        as_json=st.booleans(),
    )
    def claim(self, holder: str, ttl: int | None, as_json: bool) -> None:
        if holder == "caller":
            pid, args = os.getpid(), []
        else:
            pid = self.dead_pid() if holder == "dead" else self.live_holder(holder == "new live")
            args = ["--pid", str(pid)]
        if ttl is not None:
            args += ["--ttl", str(ttl)]
        run = self.ctx("claim", *args, *(["--json"] if as_json else []))
        candidates = self.claimable()
        if not candidates:
            assert run.rc == 3 and run.out == "", run  # §2.4: nothing to claim, --json or not
            for name, job in self.jobs.items():  # pending, but none could be claimed: why
                if job.state == "pending":
                    assert "ctx: note:" in run.err and name in run.err, (name, run)
            return
        assert run.rc == 0, run
        if as_json:
            shape = run.json()
            assert {"name", "request"} <= set(shape), run
            name = shape["name"]
            assert shape["request"]["input"]["path"] == "README.md", run
        else:
            assert run.out.count("\n") == 1, run
            name = run.out.strip()
        assert name in candidates, (name, candidates, run)
        self.took_claim(name, pid)
        if holder == "dead":
            assert "ctx: note:" in run.err, run  # the pid may have been mistyped

    # -------------------------------------------------------------------- renew

    @rule(
        data=st.data(), by_holder=st.booleans(), ttl=st.sampled_from([None, 600, SHORT_TTL]),
        as_json=st.booleans(),
    )  # fmt: skip
    def renew(self, data, by_holder: bool, ttl: int | None, as_json: bool) -> None:
        name = self.pick(data)
        job = self.jobs.get(name)
        holder = job.holder if job is not None and job.state == "claimed" else None
        if by_holder and holder is not None:
            pid = holder
        else:
            pid = os.getpid() if holder not in (None, os.getpid()) else self.live_holder(False)
            if holder is not None and pid == holder:
                pid = self.live_holder(True)
        args = [] if pid == os.getpid() else ["--pid", str(pid)]
        args += [] if ttl is None else ["--ttl", str(ttl)]
        before = self.read_lease(name)[0] if holder is not None else None
        run = self.ctx("renew", name, *args, *(["--json"] if as_json else []))
        if holder is None:
            assert_error(run, 1, "ENOENT")  # not claimed: where it is instead (§2.4)
            return
        if pid != holder:
            assert_error(run, 1, "EACCES")  # only the holder renews
            return
        assert run.rc == 0, run
        lease, data_ = self.read_lease(name)
        if as_json:
            assert run.json() == lease, run
        last = epoch(before["expires_at"]) - epoch(before.get("renewed_at", before["claimed_at"]))
        wanted = ttl if ttl is not None else last
        lasts = epoch(lease["expires_at"]) - epoch(lease["renewed_at"])
        assert abs(lasts - wanted) < 0.01, (wanted, lease, before)
        assert lease["pid"] == holder and lease["claimed_at"] == before["claimed_at"], lease
        job.lease, job.expires = data_, epoch(lease["expires_at"])

    # -------------------------------------------------------------------- finish

    @rule(
        data=st.data(), ok=st.booleans(), as_json=st.booleans(),
        output=st.sampled_from(['{"answer": 42}', "plain text\n", ""]),
    )  # fmt: skip
    def finish(self, data, ok: bool, as_json: bool, output: str) -> None:
        name = self.pick(data)
        job = self.jobs.get(name)
        flag = "--ok" if ok else "--error"
        # `finish` from a shell does not check the holder (docs/queue.md): the caller here is
        # the holder only for a claim made without --pid.
        argv = ["finish", name, flag, *(["--json"] if as_json else []), "-"]
        run = self.ctx(*argv, input=output)
        if job is None:
            assert_error(run, 1, "ENOENT")
            return
        if job.state in ("done", "failed"):
            assert_error(run, 1, "EEXIST")  # I-3: never finished twice
            return
        if job.state != "claimed":
            assert_error(run, 1, "ENOENT")  # pending: claim it first; unleased: never ran
            return
        assert run.rc == 0, run
        state = "done" if ok else "failed"
        result = json.loads((self.queue / state / f"{name}.result").read_text())
        assert result["status"] == ("ok" if ok else "error"), result
        assert result["output"] == (json.loads(output) if output.startswith("{") else output)
        assert result["worker"]["pid"] == job.holder, result
        if as_json:
            assert run.json() == {"name": name, "state": state, "result": result}, run
        else:
            assert run.out == "" or name in run.out, run
        job.state, job.holder, job.expires, job.lease = state, None, None, None
        job.result = (self.queue / state / f"{name}.result").read_bytes()

    # -------------------------------------------------------------------- holders and time

    @precondition(lambda self: any(p.poll() is None for p in self.holders))
    @rule(data=st.data())
    def kill_holder(self, data) -> None:
        running = [p for p in self.holders if p.poll() is None]
        proc = data.draw(st.sampled_from(running), label="holder")
        proc.kill()
        proc.wait()
        self.dead.add(proc.pid)

    @precondition(
        lambda self: any(
            j.state == "claimed" and j.expires - time.time() < SHORT_TTL + 1
            for j in self.jobs.values()
        )
    )
    @rule()
    def leases_expire(self) -> None:
        latest = max(
            j.expires
            for j in self.jobs.values()
            if j.state == "claimed" and j.expires - time.time() < SHORT_TTL + 1
        )
        assert wait_for(lambda: time.time() > latest + 0.2, SHORT_TTL + 5)

    # -------------------------------------------------------------------- crashes and damage

    @precondition(lambda self: bool(self.claimable()))
    @rule(delay=st.sampled_from([0, 0.001, 0.002, 0.004, 0.008]))
    def claimer_killed(self, delay: float) -> None:
        """A claimer SIGKILLed at a random moment: the model learns from the files which of
        the crash states of docs/queue.md it left, and the checks then hold the command line to
        it."""
        pid = self.live_holder(True)
        before = set(os.listdir(self.queue / "inbox"))
        proc = subprocess.Popen(
            [*CTX_ARGV, "queue", "claim", "--project", self.project, "--pid", str(pid)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=self.env,
        )  # fmt: skip
        # The moment is found from the files, not a clock: once the claim's `mkdir claimed/J`
        # shows, it runs on for `delay` seconds more (its move, its lease, its return).
        claimed_before = set(os.listdir(self.queue / "claimed"))
        wait_for(
            lambda: (
                proc.poll() is not None
                or bool(set(os.listdir(self.queue / "claimed")) - claimed_before)
            ),
            10,
            0.0005,
        )
        time.sleep(delay)
        proc.kill()
        out, _ = proc.communicate()
        for name in self.claimable():
            job = self.jobs[name]
            pending = (self.queue / "pending" / name).exists()
            claimed = self.queue / "claimed" / name
            if pending:
                job.empty_claim = claimed.is_dir()
            elif self.lease_path(name).is_file():
                self.took_claim(name, pid)
            else:
                assert (claimed / name).is_file(), (name, os.listdir(self.queue / "claimed"))
                job.state = "unleased"
        if out:
            assert self.jobs[out.decode().strip()].state == "claimed", out
        for temp in set(os.listdir(self.queue / "inbox")) - before:
            self.temps[temp] = os.lstat(self.queue / "inbox" / temp).st_mtime

    @rule(data=st.data(), kind=st.sampled_from(["stray temp", "empty claim", "lease lost"]))
    def damage(self, data, kind: str) -> None:
        """Damage of the kinds docs/queue.md lists, made by hand."""
        if kind == "stray temp":
            name = data.draw(st.sampled_from([*POOL, "z"]), label="name")
            self.stray_temp(name, data.draw(st.booleans(), label="aged"))
        elif kind == "empty claim" and self.claimable():
            self.empty_claim(data)
        elif kind == "lease lost" and any(j.state == "claimed" for j in self.jobs.values()):
            self.lease_lost(data)

    def stray_temp(self, name: str, aged: bool) -> None:
        """A publisher that died before its move: ``inbox/J.publish.tmp`` (docs/queue.md)."""
        temp = f"{name}{SUFFIX}.publish.tmp"
        if temp in self.temps:
            return
        path = self.queue / "inbox" / temp
        path.write_text(good_request(self.next_tag())[:20])
        if aged:
            then = time.time() - 600
            os.utime(path, (then, then))
        self.temps[temp] = os.lstat(path).st_mtime

    def empty_claim(self, data) -> None:
        """A claimer that died right after its ``mkdir claimed/J``."""
        name = data.draw(st.sampled_from(sorted(self.claimable())), label="job")
        (self.queue / "claimed" / name).mkdir()
        self.jobs[name].empty_claim = True

    def lease_lost(self, data) -> None:
        """A claim whose lease file is gone: ``claimed/J/J`` without ``lease/J/worker``."""
        claimed = sorted(n for n, j in self.jobs.items() if j.state == "claimed")
        name = data.draw(st.sampled_from(claimed), label="job")
        self.lease_path(name).unlink()
        job = self.jobs[name]
        job.state, job.holder, job.expires, job.lease = "unleased", None, None, None

    # -------------------------------------------------------------------- recover and show

    @rule(
        reconcile=st.booleans(), dry_run=st.booleans(), grace=st.sampled_from([None, 0, 3600]),
        as_json=st.booleans(),
    )  # fmt: skip
    def recover(self, reconcile: bool, dry_run: bool, grace: int | None, as_json: bool) -> None:
        self.settle_expiries()
        args = ["--json"] if as_json else []
        args += ["--reconcile"] if reconcile else []
        args += ["--dry-run"] if dry_run else []
        args += [] if grace is None else ["--grace", str(grace)]
        claimed = {n: j for n, j in self.jobs.items() if j.state == "claimed"}
        gone = {n for n, j in claimed.items() if self.holder_gone(j)}
        incomplete = self.incomplete()
        limit = 60 if grace is None else grace
        stale = {t for t, mtime in self.temps.items() if time.time() - mtime > limit + 1}
        fresh = {t for t, mtime in self.temps.items() if time.time() - mtime < limit - 30}
        run = self.ctx("recover", *args)
        remains = incomplete if (dry_run or not reconcile) else set()
        assert run.rc == (1 if remains else 0), run  # Q-6's exit status
        applies = not dry_run
        inbox = set(os.listdir(self.queue / "inbox"))
        if as_json:
            report = run.json()
            assert set(report) == RECOVER_KEYS, run
            assert report["consistent"] is (run.rc == 0), run
            assert report["reconcile"] is reconcile and report["dry_run"] is dry_run, run
            assert report["conflicts"] == [] and report["errors"] == [], run
            assert {e["job"] for e in report["requeued"]} == gone, (gone, run)
            assert {e["job"] for e in report["untouched"]} == set(claimed) - gone, run
            repaired = {e["job"] for e in report["repaired"]}
            listed_incomplete = {e["job"] for e in report["incomplete"]}
            if reconcile:
                assert repaired == incomplete and listed_incomplete == set(), run
            else:
                assert listed_incomplete == incomplete and repaired == set(), run
            for entry in report["requeued"] + report["repaired"]:
                assert entry["applied"] is applies, (entry, run)
            named = {t.removeprefix("inbox/") for t in report["stale_temps"]}
            removed = {t.removeprefix("inbox/") for t in report["removed_temps"]}
            assert not named & removed, run
            assert stale <= named | removed and not (named | removed) & fresh, (stale, run)
            assert removed == (named | removed if reconcile and applies else set()), run
            assert inbox == set(self.temps) - removed, (inbox, run)
        else:
            verb = "requeue" if applies else "would requeue"
            for name in gone:
                assert f"{verb}  {name}:" in run.out, (name, run)
            removed = set(self.temps) - inbox
            assert inbox <= set(self.temps), (inbox, run)
            if reconcile and applies:
                assert stale <= removed and not removed & fresh, (stale, fresh, inbox, run)
            else:
                assert removed == set(), (inbox, run)
        for name, job in claimed.items():  # a live holder's job is never touched
            if name not in gone:
                assert self.lease_path(name).read_bytes() == job.lease, name
        if dry_run:
            return
        for name in gone:
            self.jobs[name] = Job("pending")
        for name in removed:
            del self.temps[name]
        if reconcile:
            for name in incomplete:
                self.jobs[name] = Job("pending")

    @precondition(lambda self: bool(self.jobs))
    @rule(data=st.data())
    def show(self, data) -> None:
        self.settle_expiries()
        name = data.draw(st.sampled_from(sorted(self.jobs)), label="job")
        job = self.jobs[name]
        run = self.ctx("show", name, "--json")
        assert run.rc == 0, run
        shown = run.json()
        assert shown["name"] == name and shown["state"] == job.listed_as(), (job, run)
        assert {"detail", "repair", "evidence", "temps", "request"} <= set(shown), run
        if job.state == "claimed":
            wanted = "gone" if self.holder_gone(job) else "alive"
            assert shown["holder"]["state"] == wanted, (job, run)
            assert shown["lease"] == json.loads(job.lease), run
        if job.state in ("done", "failed"):
            assert shown["result"] == json.loads(job.result), run
        repair = {"unleased": "requeue-unleased"}.get(job.state)
        if job.state == "pending" and job.empty_claim:
            repair = "remove-orphans"
        assert shown["repair"] == repair, (job, run)

    # -------------------------------------------------------------------- checks

    @invariant()
    def files_agree_with_the_model(self) -> None:
        q = self.queue
        seen: dict[str, list[str]] = {}
        for state in ("pending", "done", "failed"):
            for entry in os.listdir(q / state):
                if not entry.endswith(".result"):
                    seen.setdefault(entry, []).append(state)
        for entry in os.listdir(q / "claimed"):
            if (q / "claimed" / entry / entry).is_file():
                seen.setdefault(entry, []).append("claimed")
        assert set(seen) == set(self.jobs), (seen, self.jobs)  # nothing lost, nothing new
        for name, job in self.jobs.items():
            where = seen[name]
            claimed_dir = q / "claimed" / name
            if job.state in ("claimed", "unleased"):
                assert where == ["claimed"], (name, job, where)
                assert self.lease_path(name).is_file() is (job.state == "claimed"), (name, job)
            else:
                assert where == [job.state], (name, job, where)  # exactly one state (I-1)
                assert not (q / "lease" / name).exists(), (name, job)
                if job.state == "pending":
                    assert claimed_dir.exists() is job.empty_claim, (name, job)
                    if job.empty_claim:
                        assert os.listdir(claimed_dir) == [], name
                else:
                    assert not claimed_dir.exists(), (name, job)
            if job.state == "claimed":  # only its own claim or renewal writes a lease
                assert self.lease_path(name).read_bytes() == job.lease, (name, job)
            for terminal in ("done", "failed"):  # one result, never rewritten
                result = q / terminal / f"{name}.result"
                if job.state == terminal:
                    assert result.read_bytes() == job.result, name
                else:
                    assert not result.exists(), (name, terminal)
        assert set(os.listdir(q / "inbox")) == set(self.temps), self.temps
        assert {e for e in os.listdir(q / "lease")} <= {
            n for n, j in self.jobs.items() if j.state in ("claimed", "unleased")
        }

    def tree(self) -> list[tuple]:
        """Every entry of the queue with its inode, size and mtime: what ``status`` and
        ``list`` read, so that a step that changed none of it needs no new look."""
        found = []
        for dirpath, dirnames, filenames in os.walk(self.queue):
            for entry in dirnames + filenames:
                st_ = os.lstat(os.path.join(dirpath, entry))
                found.append((dirpath, entry, st_.st_ino, st_.st_size, st_.st_mtime_ns))
        return sorted(found)

    @invariant()
    def status_and_list_agree(self) -> None:
        tree = self.tree()
        if tree == getattr(self, "checked_tree", None):
            return
        self.checked_tree = tree
        expected = {name: job.listed_as() for name, job in self.jobs.items()}
        listed = self.ctx("list", "--json")
        assert listed.rc == 0, listed
        assert {e["name"]: e["state"] for e in listed.json()} == expected, listed
        status = self.ctx("status", "--json")
        assert status.rc == 0, status
        shape = status.json()
        assert set(shape) == STATUS_KEYS and shape["queue"] == str(self.queue), status
        wanted = Counter(expected.values())
        for state in ("pending", "claimed", "done", "failed", "incomplete", "conflict"):
            assert shape["counts"][state] == wanted[state], (state, status)
            if state != "incomplete":
                assert shape[state] == wanted[state], (state, status)
        assert {e["job"] for e in shape["incomplete"]} == self.incomplete(), status
        assert shape["conflicts"] == [] and shape["ignored"] == [], status
        assert {e["path"].removeprefix("inbox/") for e in shape["temps"]} == set(self.temps)


# ------------------------------------------------------------------------------ the test


@pytest.fixture
def storage() -> Path:
    top = new_scratch_dir(TOP, "sm")
    root = top / "storage"
    made = ctx_run("bootstrap", "--storage", root)
    assert made.rc == 0, made
    yield root
    shutil.rmtree(top, ignore_errors=True)


@pytest.mark.parametrize("fixed_seed", [1, 2])
def test_queue_command_line_follows_the_model(storage: Path, fixed_seed: int) -> None:
    """Two fixed seeds, so that the two halves of the run go to two processes under -n 2 and
    CI sees the same sequences every time."""
    machine = type(f"QueueCommandLineSeed{fixed_seed}", (QueueCommandLine,), {})
    machine.storage = storage
    run_state_machine_as_test(
        seed(fixed_seed)(machine),
        settings=settings(
            max_examples=12,
            stateful_step_count=20,
            database=None,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
