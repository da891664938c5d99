"""Shared spaces, sessions and their event logs (SPEC §4, §9).

* :mod:`~cortexfs.shared.events` — append-only ``events.jsonl`` and object logs: one line per
  event, one ``write`` on ``O_APPEND``, fsync for durable events, torn-line repair (S-5).
* :mod:`~cortexfs.shared.sessions` — session directories in a home or a shared space (S-1).
* :mod:`~cortexfs.shared.spaces` — ``shared/<name>/`` with its group and setgid bits (X-1).
* :mod:`~cortexfs.shared.redact` — what a log may say: facts, not secrets or long text (S-4).
"""
