"""The crash-safe shared job queue of a project: ``shared/<project>/queue/`` (SPEC §2).

The protocol verbs live in :mod:`cortexfs.queue.protocol`, recovery in
:mod:`cortexfs.queue.recovery`, the reading side (status, list, show) in
:mod:`cortexfs.queue.inspect`.
"""

from cortexfs.queue.holder import Holder, Lease
from cortexfs.queue.layout import Queue, QueueConfig, init_project_queue, init_queue, queue_path
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
    "init_project_queue",
    "init_queue",
    "publish",
    "publish_batch",
    "queue_path",
    "recover",
    "renew",
]
