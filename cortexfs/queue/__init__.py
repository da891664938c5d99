"""The crash-safe shared job queue of a project: ``shared/<project>/queue/`` (SPEC §2).

The protocol's state table and step order are in :mod:`cortexfs.queue.protocol`, which names
its verbs (each lives in a module of its own), recovery in
:mod:`cortexfs.queue.recovery`, the reading side (status, list, show) in
:mod:`cortexfs.queue.inspect`.  A project's queue is part of its shared space, which
:func:`cortexfs.shared.spaces.create_shared_space` makes (with the queue) when it is missing.
"""

from cortexfs.queue.holder import Holder, Lease
from cortexfs.queue.layout import Queue, QueueConfig, init_queue, queue_path
from cortexfs.queue.protocol import Claim, claim, claim_job, finish, publish, publish_batch, renew
from cortexfs.queue.recovery import RecoverReport, recover

__all__ = [
    "Claim",
    "Holder",
    "Lease",
    "Queue",
    "QueueConfig",
    "RecoverReport",
    "claim",
    "claim_job",
    "finish",
    "init_queue",
    "publish",
    "publish_batch",
    "queue_path",
    "recover",
    "renew",
]
