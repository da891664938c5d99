"""``tail --follow`` (follow_events) over a log that is removed and made again: waited for
as ``tail -F`` waits, said once, and read from the start of the new file."""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path

from cortexfs.shared.events import follow_events

FIRST = b'{"ts":"2026-06-22T12:00:00Z","type":"first"}\n'
SECOND = b'{"ts":"2026-06-22T12:00:01Z","type":"second"}\n'


def test_a_log_removed_and_made_again_is_waited_for_and_read_from_its_start(
    tmp_path: Path,
) -> None:
    log = tmp_path / "events.jsonl"
    log.write_bytes(FIRST)
    seen: queue.Queue[str] = queue.Queue()
    notes: list[str] = []

    def follow() -> None:
        for event in follow_events(log, poll_interval=0.01, on_restart=notes.append):
            seen.put(event["type"])
            if event["type"] == "second":
                return

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    assert seen.get(timeout=30) == "first"
    log.unlink()
    deadline = time.monotonic() + 30
    while not notes and time.monotonic() < deadline:
        time.sleep(0.01)
    assert notes == [f"{log} is gone: waiting for it to appear again"]
    log.write_bytes(SECOND)
    assert seen.get(timeout=30) == "second"
    follower.join(timeout=30)
    assert not follower.is_alive()
    assert notes[1:] == [f"{log} appeared again: following it again from its start"]
