"""The shared queue protocol: publish, claim, lease, renew, finish (SPEC §2.1, §2.2).

The directory layout is the state machine.  For a job ``J`` (an object name ending in
``.req.json``) the durable states are::

    state     evidence on disk
    -------   ------------------------------------------
    pending   pending/J
    claimed   claimed/J/J   and  lease/J/worker
    done      done/J        and  done/J.result
    failed    failed/J      and  failed/J.result

``inbox/`` only ever holds temp files on their way to a final name.  Every transition is a
sequence of named steps; every step that changes a name is followed by a sync of the
directories it touched before the next step may depend on it (Q-7)::

    publish   write inbox/tmp, fsync it            a name never shows half a request (I-2)
              move inbox/tmp -> pending/J          no-replace: never overwrite evidence (Q-1)
              sync pending/, inbox/                then, and only then, report success
    claim     mkdir claimed/J, lock it, sync claimed/   the arbitration point; EEXIST = lost (Q-2)
              move pending/J -> claimed/J/J
              sync claimed/J, pending/             the claim is durable ...
    lease     mkdir lease/J, sync lease/
              move inbox/tmp -> lease/J/worker
              sync lease/J, inbox/                 ... before the lease exists (Q-3); execution
                                                   may start only now (I-4)
    finish    write inbox/tmp, fsync; move -> done/J.result; sync   result first (Q-4) ...
              move claimed/J/J -> done/J; sync done/  ... then the request: the terminal pair
              remove lease/J/worker, lease/J, claimed/J; sync lease/, claimed/
    (failed/ instead of done/ when the job failed)

A step the kernel refuses (EACCES, EROFS, ENOSPC…) is not a crash: the transition is undone
as far as it got, and the refusal (:meth:`Queue.refusal`) says which directory refused, what
was and was not done, and what to do.  A claim refused after its move puts the request back
(move claimed/J/J -> pending/J, first in the claim order; remove lease/J, claimed/J; sync);
``finish`` checks every directory it will change before its first step instead, because once
the result is in place there is no going back.  A batch refused midway through its moves
(``pending/`` cannot grow on a full disk) is published in part: :class:`PublishedInPart`
names the jobs published and the requests not.

Why this order survives a crash at any point is spelled out in ``docs/queue.md``; what
``recover`` does with each leftover is in :mod:`cortexfs.queue.recovery`.  Each step is marked
with ``ops.step(name)``, the crash points the fault-injection tests stop at.

The verbs live one to a module, in the order a job meets them: :mod:`~cortexfs.queue.publishing`
(``publish``, ``publish_batch``), :mod:`~cortexfs.queue.claiming` (``claim``, ``claim_job``:
the claim and its lease), :mod:`~cortexfs.queue.leasing` (``renew``, and who holds a job),
:mod:`~cortexfs.queue.finishing` (``finish``); what they share (J's lock, the removal of a
claim and its lease) is :mod:`~cortexfs.queue.transition`.  This module names the verbs
together.
"""

from cortexfs.queue.claiming import (
    CLAIM_LEFT,
    FINISHED,
    LEASE_LEFT,
    LEFT_PENDING,
    RECOVERED,
    UNLINKABLE,
    UNREADABLE,
    Claim,
    claim,
    claim_job,
)
from cortexfs.queue.finishing import finish
from cortexfs.queue.leasing import NotHeld, renew
from cortexfs.queue.publishing import PublishedInPart, publish, publish_batch

__all__ = [
    "CLAIM_LEFT",
    "FINISHED",
    "LEASE_LEFT",
    "LEFT_PENDING",
    "RECOVERED",
    "UNLINKABLE",
    "UNREADABLE",
    "Claim",
    "NotHeld",
    "PublishedInPart",
    "claim",
    "claim_job",
    "finish",
    "publish",
    "publish_batch",
    "renew",
]
