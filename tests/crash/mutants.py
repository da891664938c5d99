"""The mutation check: disable one sync or no-replace guard of the protocol at a time and
show that the harness then reports a violation (docs/crash-model.md §5).

A call site is named by the chain of ``cortexfs`` frames that led to the system call plus
the directory or file it acted on, e.g. ``fsync pending/ @ publishing.publish:77 >
durable.move_noreplace:252 > … > durable.sync_dir:183``: the same primitive called from two
protocol steps, or on two directories, is two sites.  Sites are discovered by running every
workload with the recorder watching, so the list is exactly what the protocol does.  A mutant
is injected in :class:`tests.crash.recorder.RecordingOps`, never by editing source files:

* ``fsync`` / ``syncfs`` — the call does nothing and is not journalled;
* ``rename_noreplace`` — a plain rename, replacing whatever it meets;
* ``link`` — unlink whatever holds the destination name first, then link;
* ``mkdir`` — an existing directory counts as made (the claim arbitration is gone).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from cortexfs.durable import MOVE_LINK, MOVE_RENAME
from cortexfs.queue import Holder
from tests.crash.harness import explore, record, scratch_dir
from tests.crash.persistence import Mode
from tests.crash.workloads import Workload

SYNC_KINDS = ("fsync", "syncfs")
GUARD_KINDS = ("rename_noreplace", "link", "mkdir")
# The configurations that must be violation-free, and so must catch every mutant.
CONFIGS = ((Mode.ATOMIC, MOVE_RENAME), (Mode.PESSIMISTIC, MOVE_LINK))


# Guards that cannot fire, each with the reason (docs/crash-model.md §5 says the same), and
# syncs kept for Q-7's letter alone.
# Keyed by (call, destination, protocol module.function): line numbers would go stale.
_FRESH_CLAIM = (
    "claimed/J was created an instant earlier by this claimer, under the mkdir arbitration "
    "(Q-2), and is held under flock: nothing can be in it"
)
_FRESH_LEASE = (
    "lease/J was just created by this claimer (make_dir_synced refuses an existing one), and "
    "only the winner of the claimed/J arbitration creates it: nothing can be in it"
)
_RESULT_ARBITRATES = (
    "the result move just before is the arbiter between finishers: a second finisher is "
    "refused there (EEXIST) and never reaches the request move (a holder completing its own "
    "finish cut short gets here only when the look under J's lock found the result alone); "
    "the request's terminal name can exist here only if that arbiter was bypassed"
)
_SAME_FILE = (
    "roll-forward runs only when the re-check under the claimed/J lock found no done/J; the "
    "only other writer of that name moves the same file, so whichever mover comes second "
    "finds its source gone (ENOENT) before it could replace anything"
)
_PUBLISH_RACE = (
    "pending/J can exist here only if a publish of the same name got past its checks while J "
    "was claimed, which the staging-name arbitration and the look taken under it prevent "
    "(docs/crash-model.md §9); the guard stays as the last line"
)
_PUBLISHERS_ARBITRATED = (
    "publishers of J are serialised by creating inbox/J.publish.tmp (O_EXCL) and look again "
    "for J while they hold it, so no other publish and no forward move can put pending/J "
    "here; only recover requeueing an earlier J between that look's pending/ and claimed/ "
    "checks could, and the harness never runs recover beside a publish: the guard stays for it"
)
# Syncs Q-7 asks for by its letter ("after every rename, link, unlink or rmdir, every affected
# parent directory is fsynced") that no crash state can tell from their absence.
_REMOVED_NEXT = (
    "Q-7's letter: this directory is removed right after and its parent synced, and once that "
    "removal is durable no name inside it can come back, so no crash state tells this sync "
    "from its absence (docs/crash-model.md §8)"
)
JUSTIFIED = {
    ("fsync", "claimed/J/", "finishing._move_request_and_clean_up"): _REMOVED_NEXT,
    ("fsync", "claimed/J/", "recovery._move_claim_to"): _REMOVED_NEXT,
    ("fsync", "claimed/J/", "recovery._drop_from_claim"): _REMOVED_NEXT,
    ("fsync", "lease/J/", "transition.remove_claim_and_lease"): _REMOVED_NEXT,
    ("rename_noreplace", "claimed/J/J", "claiming.claim_job"): _FRESH_CLAIM,
    ("link", "claimed/J/J", "claiming.claim_job"): _FRESH_CLAIM,
    ("rename_noreplace", "lease/J/worker", "claiming._write_lease"): _FRESH_LEASE,
    ("link", "lease/J/worker", "claiming._write_lease"): _FRESH_LEASE,
    ("mkdir", "claimed/J", "claiming.claim_job"): (
        "claimers that get past it share one claimed/J and are still decided by its lock, the "
        "lease check and the no-replace move out of pending/ (pending/J exists once); it stays "
        "because Q-2 names it and it is the only arbiter where flock is missing (N-1), in a "
        "window no preemption at a protocol step reaches (inside a link-strategy move)"
    ),
    ("mkdir", "lease/J", "claiming._write_lease"): (
        "claim_job looks for lease/J while it holds the claimed/J arbitration, and only that "
        "arbitration's winner creates lease/J: it cannot appear in between"
    ),
    **{
        (call, f"{state}/J", "finishing._move_request_and_clean_up"): _RESULT_ARBITRATES
        for call in ("rename_noreplace", "link")
        for state in ("done", "failed")
    },
    **{
        (call, f"{state}/J", "recovery._move_claim_to"): _SAME_FILE
        for call in ("rename_noreplace", "link")
        for state in ("done", "failed")
    },
    ("rename_noreplace", "pending/J", "publishing.publish"): _PUBLISHERS_ARBITRATED,
    ("link", "pending/J", "publishing.publish"): _PUBLISHERS_ARBITRATED,
    ("rename_noreplace", "pending/J", "publishing.publish_batch"): _PUBLISHERS_ARBITRATED,
    ("link", "pending/J", "publishing.publish_batch"): _PUBLISHERS_ARBITRATED,
    ("rename_noreplace", "pending/J", "recovery._move_claim_to"): _PUBLISH_RACE,
    ("link", "pending/J", "recovery._move_claim_to"): _PUBLISH_RACE,
}


@dataclass(frozen=True)
class Mutant:
    site: str

    def disables(self, site: str) -> bool:
        return site == self.site

    @property
    def kind(self) -> str:
        return self.site.split(" ", 1)[0]

    @property
    def justification(self) -> str | None:
        """Why this guard cannot fire, if it is one of the known ones."""
        kind, target, _, caller = self.site.split(" ", 3)
        return JUSTIFIED.get((kind, target, caller.split(":", 1)[0]))


@dataclass
class Verdict:
    mutant: Mutant
    killed_by: str | None = None  # the first violation found
    tried: list[str] = field(default_factory=list)

    @property
    def killed(self) -> bool:
        return self.killed_by is not None


def discover(
    workloads: Iterable[Workload], holder: Holder
) -> dict[Mutant, list[tuple[Workload, str]]]:
    """Every sync and guard call site the workloads reach, with where it is reached."""
    reached: defaultdict[Mutant, list[tuple[Workload, str]]] = defaultdict(list)
    for workload in workloads:
        for strategy in (MOVE_RENAME, MOVE_LINK):
            with scratch_dir() as directory:
                stage, _ = record(workload, strategy, holder, directory, watch_sites=True)
            for site in stage.journal.sites:
                if site.split(" ", 1)[0] in SYNC_KINDS + GUARD_KINDS:
                    reached[Mutant(site)].append((workload, strategy))
    return dict(reached)


def hunt(
    mutant: Mutant,
    reached_in: list[tuple[Workload, str]],
    holder: Holder,
    drainer: Holder,
    *,
    limit: int,
) -> Verdict:
    """Explore the workloads that reach the mutant's site until one shows a violation."""
    verdict = Verdict(mutant)
    for workload, reached_with in reached_in:
        for mode, strategy in CONFIGS:
            if reached_with != strategy:
                continue
            verdict.tried.append(f"{workload.name} [{mode}/{strategy}]")
            outcome = explore(
                workload,
                mode,
                strategy,
                holder,
                drainer,
                limit=limit,
                mutant=mutant,
                first_violation=True,
            )
            if outcome.violations:
                verdict.killed_by = outcome.violations[0]
                return verdict
    return verdict
