"""The crash-consistency harness of the queue (see docs/crash-model.md).

Record what the protocol does to a queue directory as micro-operations
(:mod:`tests.crash.recorder`), derive every crash state a persistence model allows
(:mod:`tests.crash.persistence`), materialise each one in a real directory and judge it with
the real ``recover`` against what the workload had acknowledged (:mod:`tests.crash.oracle`).
"""
