"""``tail --follow`` (follow_events) over a log that is removed and made again: waited for
as ``tail -F`` waits, said once, and read from the start of the new file."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from pathlib import Path

from cortexfs.shared.follow import follow_events

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


def _follower(
    log: Path, notes: list[str], damaged: list[list[int]], **options: object
) -> tuple[threading.Thread, queue.Queue[str]]:
    seen: queue.Queue[str] = queue.Queue()

    def follow() -> None:
        followed = follow_events(
            log,
            poll_interval=0.01,
            on_restart=notes.append,
            on_damaged=lambda scan: damaged.append(list(scan.damaged)),
            **options,  # type: ignore[arg-type]
        )
        for event in followed:
            seen.put(event["type"])
            if event["type"] == "last":
                return

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    return thread, seen


def test_a_log_renamed_away_is_read_to_its_end_before_the_new_one(tmp_path: Path) -> None:
    """What was appended to a log just before it was renamed away (a rotation) is read from
    the descriptor held, before the file then at the name: nothing is lost between the two."""
    log = tmp_path / "events.jsonl"
    log.write_bytes(FIRST)
    notes: list[str] = []
    thread, seen = _follower(log, notes, [])
    assert seen.get(timeout=30) == "first"
    with open(log, "ab") as old:
        old.write(SECOND)
        log.rename(tmp_path / "events.jsonl.1")  # at once: the follower has not read SECOND
    log.write_bytes(b'{"ts":"2026-06-22T12:00:02Z","type":"last"}\n')
    assert [seen.get(timeout=30), seen.get(timeout=30)] == ["second", "last"]
    thread.join(timeout=30)
    assert notes[-1].endswith(": following it again from its start"), notes


def test_a_directory_made_again_is_followed_and_damaged_lines_are_told(tmp_path: Path) -> None:
    """With ``open_directory`` the directory is looked up at each look: one removed and made
    again is followed.  A complete line holding no event is skipped and told, with its
    number, to ``on_damaged``."""
    directory = tmp_path / "session"
    directory.mkdir()
    log = directory / "events.jsonl"
    log.write_bytes(FIRST)
    notes: list[str] = []
    damaged: list[list[int]] = []

    def open_directory() -> int:
        return os.open(directory, os.O_RDONLY | os.O_DIRECTORY)

    thread, seen = _follower(log, notes, damaged, open_directory=open_directory)
    assert seen.get(timeout=30) == "first"
    log.unlink()
    directory.rmdir()
    deadline = time.monotonic() + 30
    while not notes and time.monotonic() < deadline:
        time.sleep(0.01)
    directory.mkdir()
    log.write_bytes(b"no event here\n" + SECOND)
    assert seen.get(timeout=30) == "second"
    while not damaged and time.monotonic() < deadline:
        time.sleep(0.01)
    with open(log, "ab") as appended:
        appended.write(b'{"ts":"2026-06-22T12:00:02Z","type":"last"}\n')
    assert seen.get(timeout=30) == "last"
    thread.join(timeout=30)
    assert notes == [
        f"{log} is gone: waiting for it to appear again",
        f"{log} appeared again: following it again from its start",
    ]
    assert damaged == [[1]]


def test_an_interrupt_just_after_a_close_leaves_the_interrupt_not_ebadf(
    tmp_path: Path, monkeypatch
) -> None:
    """^C lands between bytecodes: just after the close of the descriptor read at a look, the
    follower's cleanup must not close that descriptor again (the caller would see EBADF, or
    close a descriptor another thread has since been given, in place of the interrupt)."""
    from cortexfs.shared import events

    log = tmp_path / "events.jsonl"
    log.write_bytes(FIRST)
    real_close = os.close
    closes = []

    def close_then_interrupt(fd: int) -> None:
        real_close(fd)
        closes.append(fd)
        if len(closes) == 1:
            raise KeyboardInterrupt

    followed = follow_events(log, poll_interval=0.01)
    assert next(followed)["type"] == "first"
    monkeypatch.setattr(events.os, "close", close_then_interrupt)
    try:
        next(followed)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("the interrupt was not raised")
    finally:
        monkeypatch.undo()
    assert len(closes) == len(set(closes)) == 2  # the file read, then the one looked up


def test_a_log_handed_over_is_read_to_its_end_though_removed_before_the_first_look(
    tmp_path: Path,
) -> None:
    """``held``: the caller (``tail --follow``, which has printed the last events from it)
    hands its descriptor over.  The log renamed away before the follow's first look, with an
    event appended to it meanwhile, is read to its end; then its name is waited for."""
    log = tmp_path / "events.jsonl"
    log.write_bytes(FIRST)
    read = os.open(log, os.O_RDONLY)
    with open(log, "ab") as old:
        old.write(SECOND)
    log.rename(tmp_path / "events.jsonl.1")
    notes: list[str] = []
    thread, seen = _follower(log, notes, [], offset=len(FIRST), first_line=2, held=read)
    assert seen.get(timeout=30) == "second"
    deadline = time.monotonic() + 30
    while not notes and time.monotonic() < deadline:
        time.sleep(0.01)
    assert notes == [f"{log} is gone: waiting for it to appear again"]
    log.write_bytes(b'{"ts":"2026-06-22T12:00:02Z","type":"last"}\n')
    assert seen.get(timeout=30) == "last"
    thread.join(timeout=30)
    assert not thread.is_alive()
    # Closed by the follow, which took it over (its number may since lead to another file).
    rotated = str(tmp_path / "events.jsonl.1")
    with contextlib.suppress(FileNotFoundError):
        assert os.readlink(f"/proc/self/fd/{read}") != rotated, "the descriptor was left open"
