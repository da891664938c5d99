"""What a workload had been told before a crash: the oracle's view of the world.

Read from the journal's markers up to the crash point — exactly the acknowledgements a
program would have printed before the machine went down.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.crash.microops import Ack, Attempt, Executed, Record


@dataclass
class Expectations:
    published: dict[str, bytes] = field(default_factory=dict)
    leased: dict[str, bytes] = field(default_factory=dict)  # last acknowledged lease
    finished: dict[str, tuple[bool, dict[str, Any]]] = field(default_factory=dict)
    executed: Counter[str] = field(default_factory=Counter)
    # Jobs with a renew or finish attempted after their last acknowledged lease.
    renewing: set[str] = field(default_factory=set)
    finishing: set[str] = field(default_factory=set)
    publish_acks: Counter[str] = field(default_factory=Counter)
    recovering: bool = False  # recover ran: claims of dead holders may be back in pending

    @classmethod
    def at(cls, records: Sequence[Record], point: int) -> Expectations:
        seen = cls()
        for record in records[:point]:
            match record.op:
                case Attempt("recover" | "recover --reconcile"):
                    seen.recovering = True
                case Attempt("renew", job):
                    seen.renewing.add(job)
                case Attempt("finish", job):
                    seen.finishing.add(job)
                case Ack("publish", job, request):
                    seen.published[job] = request
                    seen.publish_acks[job] += 1
                case Ack("claim" | "renew", job, lease):
                    seen.leased[job] = lease
                    seen.renewing.discard(job)
                case Ack("finish", job, outcome):
                    seen.finished[job] = outcome
                    seen.finishing.discard(job)
                case Executed(job):
                    seen.executed[job] += 1
        return seen
