"""The queue against a model: random sequences of publish, claim, renew, finish, holder death
and recover, with real lease-holder processes, checked after every step."""

from __future__ import annotations

import errno
import shutil
import subprocess
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from cortexfs.errors import CtxError
from cortexfs.queue import (
    Holder,
    Queue,
    claim,
    finish,
    init_queue,
    publish,
    recover,
    renew,
)
from cortexfs.queue.evidence import assess, evidence_of, scan
from tests.queue.helpers import request

NAMES = st.sampled_from([f"m{n}" for n in range(6)])


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.scratch = Path(tempfile.mkdtemp(prefix="cortexfs-model-"))
        init_queue(self.scratch / "queue")
        self.queue = Queue.open(self.scratch / "queue")
        self.processes = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
        self.holders = [Holder.for_process(p.pid, f"h{i}") for i, p in enumerate(self.processes)]
        self.alive = [True, True]
        # job -> ("pending", None) | ("claimed", holder index) | ("done"|"failed", None)
        self.model: dict[str, tuple[str, int | None]] = {}

    def teardown(self) -> None:
        self.queue.close()
        for process in self.processes:
            process.kill()
            process.wait()
        shutil.rmtree(self.scratch)

    def pending_jobs(self) -> list[str]:
        return [j for j, (state, _) in self.model.items() if state == "pending"]

    @rule(name=NAMES)
    def publish_job(self, name: str) -> None:
        job = f"{name}.req.json"
        try:
            publish(self.queue, request(), name=name)
        except CtxError as exc:
            assert exc.errno == errno.EEXIST and job in self.model
            return
        assert job not in self.model
        self.model[job] = ("pending", None)

    @rule(who=st.integers(0, 1))
    def claim_job(self, who: int) -> None:
        if not self.alive[who]:
            return
        won = claim(self.queue, self.holders[who], ttl=600)
        if won is None:
            assert self.pending_jobs() == []
            return
        assert self.model[won.job] == ("pending", None)
        self.model[won.job] = ("claimed", who)

    @rule(who=st.integers(0, 1), name=NAMES)
    def renew_lease(self, who: int, name: str) -> None:
        job = f"{name}.req.json"
        try:
            renew(self.queue, job, [self.holders[who]], ttl=600)
        except CtxError as exc:
            state, holder = self.model.get(job, ("absent", None))
            expected = errno.EACCES if state == "claimed" and holder != who else errno.ENOENT
            assert exc.errno == expected
            return
        assert self.model[job] == ("claimed", who)

    @rule(name=NAMES, ok=st.booleans())
    def finish_job(self, name: str, ok: bool) -> None:
        job = f"{name}.req.json"
        try:
            finish(self.queue, job, ok, {"n": 1})
        except CtxError as exc:
            assert self.model.get(job, ("absent", None))[0] != "claimed"
            assert exc.errno in (errno.ENOENT, errno.EEXIST)
            return
        assert self.model[job][0] == "claimed"
        self.model[job] = ("done" if ok else "failed", None)

    @rule(who=st.integers(0, 1))
    def holder_dies(self, who: int) -> None:
        if self.alive[who]:
            self.processes[who].kill()
            self.processes[who].wait()
            self.alive[who] = False

    @rule(reconcile=st.booleans())
    def run_recover(self, reconcile: bool) -> None:
        report = recover(self.queue, reconcile=reconcile)
        assert report.consistent and not report.conflicts
        requeued = {f.job for f in report.requeued}
        expected = {
            job
            for job, (state, who) in self.model.items()
            if state == "claimed" and who is not None and not self.alive[who]
        }
        assert requeued == expected
        for job in requeued:
            self.model[job] = ("pending", None)

    @invariant()
    def disk_matches_model(self) -> None:
        found = scan(self.queue)
        assert set(found.jobs) == set(self.model)
        assert found.ignored == [] and found.temps == []
        for job, (state, _) in self.model.items():
            assert assess(evidence_of(self.queue, job)).state == state


QueueMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
test_queue_follows_the_model = QueueMachine.TestCase
