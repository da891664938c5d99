"""Judge one crash state: materialise it, run the real recover on it, drain it.

The checks, in the order they run (each returns sentences naming the SPEC id it enforces):

1. I-2 — no file under a final name (anything outside ``inbox/``) holds less or other than
   what the workload wrote into it;
2. the acknowledgements — a published job has its request (byte for byte) somewhere; a
   claimed or renewed job is still claimed with that lease or a newer one (Q-3); a finished
   job is in ``done/`` or ``failed/`` with the result ``finish`` returned (Q-4, I-3); no job
   is a conflict (I-1);
3. plain ``recover`` only requeues claims whose holder is gone (Q-5, Q-6) and, run again,
   changes nothing (I-5);
4. ``recover --reconcile`` leaves every job pending, done or failed, deletes no request and
   no result (I-5), and a second run changes nothing; jobs held by a live holder are never
   touched (Q-6);
5. the drain: claim and finish until the queue is empty — every acknowledged job ends in
   ``done/`` or ``failed/`` (I-1), none whose finish was acknowledged or whose result was
   durable runs again (I-3), every finished job ran at least once.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

from cortexfs.durable import FsOps
from cortexfs.errors import CtxError
from cortexfs.queue import Holder, Lease, Queue, claim, finish, recover
from cortexfs.queue import evidence as ev
from cortexfs.queue.holder import ALIVE, judge
from tests.crash.expectations import Expectations
from tests.crash.fsimage import FILE, Entry, Image, materialise, snapshot
from tests.crash.persistence import CrashState, Mode
from tests.crash.recorder import Journal

GRACE = 0.0  # a materialised crash state has no live process: every temp file is a stray
SETTLED = ("pending", "done", "failed")
REQUEST_PLACES = ("pending/{j}", "claimed/{j}/{j}", "done/{j}", "failed/{j}")
RESULT_PLACES = ("done/{j}.result", "failed/{j}.result")

Tree = frozenset[Entry]


def tree(path: Path) -> Tree:
    return snapshot(path, iter(range(1, 10**9)).__next__).canonical()


def files(t: Tree) -> dict[str, bytes]:
    return {path: data for path, kind, data, _ in t if kind == FILE}


def owner(path: str) -> str:
    """The job an entry belongs to (inbox temps and top-level entries stand for themselves)."""
    top, _, rest = path.partition("/")
    if not rest or top == "inbox":
        return path
    return rest.split("/")[0].removesuffix(".result")


def by_owner(t: Tree) -> dict[str, set[Entry]]:
    grouped: dict[str, set[Entry]] = {}
    for entry in t:
        grouped.setdefault(owner(entry[0]), set()).add(entry)
    return grouped


def request_of(t: dict[str, bytes], job: str) -> bytes | None:
    return next((t[p.format(j=job)] for p in REQUEST_PLACES if p.format(j=job) in t), None)


def phase(a: ev.Assessment, e: ev.JobEvidence) -> str:
    """Where a job stands in its life, read from its evidence."""
    if a.state in ("done", "failed"):
        return "finished"
    if a.state != "incomplete":
        return a.state  # pending, claimed, conflict
    if a.repair == ev.REQUEUE_UNLEASED:
        return "claiming"
    if a.repair == ev.ROLL_FORWARD:
        return "finishing"
    if a.repair == ev.DROP_CLAIM_COPY:
        return "claiming" if e.pending is not None else "finishing"
    if e.pending is not None:
        return "pending"
    if e.done_request is not None or e.failed_request is not None:
        return "finished"
    return "lost"


class Oracle:
    def __init__(
        self,
        journal: Journal,
        strategy: str,
        workdir: Path,
        mode: Mode,
        drainer: Holder,
        holder_alive: bool = False,
    ) -> None:
        self.journal, self.strategy, self.workdir = journal, strategy, workdir
        self.mode, self.drainer, self.holder_alive = mode, drainer, holder_alive

    def judge(self, state: CrashState) -> list[str]:
        expect = Expectations.at(self.journal.records, state.point)
        problems = self.torn_names(state.image)
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir.mkdir(parents=True)
        materialise(state.image, self.workdir)
        original = tree(self.workdir)
        with Queue.open(self.workdir, ops=FsOps(self.strategy)) as queue:
            try:
                problems += self.acknowledged(queue, original, expect)
                live = self.live_jobs(queue)
                problems += self.plain_recover(queue, original, live)
                problems += self.reconcile(queue, original, expect, live)
                if not (problems or self.holder_alive):
                    problems += self.drain(queue, original, expect)
            except Exception as exc:
                problems.append(f"recover or the drain raised {exc!r}")
        return problems

    # --------------------------------------------------------------------------- I-2

    def torn_names(self, image: Image) -> list[str]:
        problems = []
        for path, node in image.walk():
            seen = image.nodes[node]
            if seen.kind != FILE or path.startswith("inbox/"):
                continue
            written = self.journal.live.nodes[node].data
            if seen.data != written:
                problems.append(
                    f"I-2: {path} holds {len(seen.data)} bytes that are not the "
                    f"{len(written)} bytes written to it (a partial file under a final name)"
                )
        return problems

    # ------------------------------------------------------------------- acknowledgements

    def acknowledged(self, queue: Queue, original: Tree, expect: Expectations) -> list[str]:
        problems = []
        found = ev.scan(queue).jobs
        content = files(original)
        for job, evidence in sorted(found.items()):
            assessment = ev.assess(evidence)
            if assessment.state == "conflict":
                problems.append(f"I-1: {job} is a conflict: {assessment.detail}")
        for job, request in expect.published.items():
            stored = request_of(content, job)
            if stored is None:
                problems.append(f"I-1: published {job} has no request left anywhere")
            elif stored != request:
                problems.append(f"Q-1: the request of published {job} is not what was published")
        for job, lease in expect.leased.items():
            if job in expect.finished or job not in found:
                continue
            now = phase(ev.assess(found[job]), found[job])
            allowed = {"claimed"}
            if job in expect.finishing:
                allowed |= {"finishing", "finished"}
            if expect.recovering:
                allowed |= {"claiming", "pending"}  # the holder is gone, requeue
            if job in expect.renewing and self.mode is Mode.PESSIMISTIC:
                allowed.add("claiming")  # no atomic replace without atomic rename (doc §4)
            if now not in allowed:
                problems.append(f"Q-3: claimed {job} is {now} (acknowledged lease lost)")
            elif now == "claimed":
                problems += self.lease_kept(job, content, Lease.decode(lease))
        for job, (ok, result) in expect.finished.items():
            terminal = "done" if ok else "failed"
            now = phase(ev.assess(found[job]), found[job]) if job in found else "gone"
            stored = content.get(f"{terminal}/{job}.result")
            # "finished" includes a leftover empty claimed/J: a loser of a claim race may
            # create one after the winner finished (it removes it again when it sees it lost).
            if now != "finished" or f"{terminal}/{job}" not in content or stored is None:
                problems.append(f"I-3: finished {job} is {now}, not {terminal}")
            elif json.loads(stored) != result:
                problems.append(f"Q-4: the result of finished {job} is not the one returned")
        return problems

    def lease_kept(self, job: str, content: dict[str, bytes], acked: Lease) -> list[str]:
        try:
            stored = Lease.decode(content[f"lease/{job}/worker"])
        except CtxError as exc:
            return [f"Q-3: the lease of claimed {job} cannot be read: {exc}"]
        if stored.holder != acked.holder or stored.expires_at < acked.expires_at:
            return [f"Q-3: the lease of {job} is older than the one acknowledged"]
        return []

    def live_jobs(self, queue: Queue) -> set[str]:
        """Jobs whose lease names a holder that is running."""
        content = files(tree(self.workdir))
        live = set()
        for path, data in content.items():
            if path.startswith("lease/") and path.endswith("/worker"):
                try:
                    lease = Lease.decode(data)
                except CtxError:
                    continue  # unreadable: recover treats it as alive, the checks will tell
                if judge(lease).state == ALIVE:
                    live.add(owner(path))
        return live

    # ------------------------------------------------------------------- recover

    def plain_recover(self, queue: Queue, original: Tree, live: set[str]) -> list[str]:
        problems = []
        report = recover(queue, grace=GRACE)
        after = tree(self.workdir)
        requeued = {f.job for f in report.requeued}
        before_jobs, after_jobs = by_owner(original), by_owner(after)
        for job in sorted(set(before_jobs) | set(after_jobs)):
            if before_jobs.get(job) == after_jobs.get(job):
                continue
            if job not in requeued:
                problems.append(f"Q-6: plain recover changed {job}, which it may only report")
            elif job in live:
                problems.append(f"Q-5: plain recover requeued {job}, whose holder is alive")
            elif request_of(files(after), job) != request_of(files(original), job):
                problems.append(f"Q-5: requeued {job} lost its request")
        again = recover(queue, grace=GRACE)
        if tree(self.workdir) != after or again.requeued:
            problems.append("I-5: a second plain recover changed the queue again")
        return problems

    def reconcile(
        self, queue: Queue, original: Tree, expect: Expectations, live: set[str]
    ) -> list[str]:
        problems = []
        report = recover(queue, reconcile=True, grace=GRACE)
        # An incomplete pair of a live holder is left alone and reported: the run is
        # "not consistent" because of it, and rightly so; anything else left is a failure.
        left = [
            f"{f.job}: {f.detail}"
            for f in report.conflicts + report.incomplete
            if f in report.conflicts or f.job not in live
        ]
        if left:
            problems.append(f"I-1: recover --reconcile left the queue inconsistent: {left}")
        after = tree(self.workdir)
        again = recover(queue, reconcile=True, grace=GRACE)
        if tree(self.workdir) != after or again.requeued or again.repaired:
            problems.append("I-5: a second recover --reconcile changed the queue again")
        before_jobs, after_jobs = by_owner(original), by_owner(after)
        for job in sorted(live):
            if before_jobs.get(job) != after_jobs.get(job):
                problems.append(f"Q-6: recover touched {job}, whose lease holder is alive")
        states = {job: ev.assess(e).state for job, e in ev.scan(queue).jobs.items()}
        for job, state in sorted(states.items()):
            if state not in SETTLED and job not in live:
                problems.append(f"I-1: after recover --reconcile {job} is {state}")
        if any(path.startswith("inbox/") for path in files(after)):
            problems.append("Q-6: recover --reconcile left stray temp files in inbox/")
        problems += preserved(original, after, states)
        for job in expect.published:
            if job not in states:
                problems.append(f"I-1: published {job} is gone after recover --reconcile")
        return problems

    # ------------------------------------------------------------------- drain

    def drain(self, queue: Queue, original: Tree, expect: Expectations) -> list[str]:
        problems = []
        ran: Counter[str] = Counter()
        while (won := claim(queue, self.drainer)) is not None:
            ran[won.job] += 1
            finish(queue, won.job, True, {"drained": True})
        before = files(original)
        for job in sorted(ran):
            if job in expect.finished:
                problems.append(f"I-3: {job} ran again after its finish was acknowledged")
            elif any(p.format(j=job) in before for p in RESULT_PLACES):
                problems.append(f"I-3: {job} ran again although its result was durable")
            if ran[job] > 1:
                problems.append(f"I-4: {job} ran {ran[job]} times in one drain")
        states = {job: ev.assess(e).state for job, e in ev.scan(queue).jobs.items()}
        for job in expect.published:
            if states.get(job) not in ("done", "failed"):
                problems.append(f"I-1: published {job} is {states.get(job)} after the drain")
        for job, state in states.items():
            if state not in ("done", "failed"):
                problems.append(f"I-1: {job} is {state} after the drain")
            elif not (expect.executed[job] or ran[job]):
                problems.append(f"I-3: {job} is {state} but never ran")
        final = recover(queue, reconcile=True, dry_run=True, grace=GRACE)
        if not final.consistent or final.requeued or final.repaired:
            problems.append("I-5: the drained queue still needs recover")
        return problems


def preserved(original: Tree, after: Tree, states: dict[str, str]) -> list[str]:
    """I-5: recover deletes or overwrites nothing but what Q-6 names."""
    problems = []
    before, now = files(original), files(after)
    for path, data in before.items():
        if path.endswith(".result") and now.get(path) != data:
            problems.append(f"I-5: recover removed or changed the result {path}")
    for job in {owner(p) for p in before}:
        request = request_of(before, job)
        if request is not None and request_of(now, job) != request:
            problems.append(f"I-5: recover lost the request of {job}")
    for job in states:
        if not any(owner(p) == job for p in before):
            problems.append(f"I-5: {job} appeared during recover")
    return problems
