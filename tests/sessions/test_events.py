"""events.jsonl: one line per event, concurrent appenders, torn lines, repair (SPEC S-2, S-5)."""

from __future__ import annotations

import errno
import fcntl
import json
import multiprocessing
import os
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cortexfs import durable
from cortexfs.errors import CtxError
from cortexfs.shared.events import (
    DAMAGED_LISTED,
    MAX_EVENT_BYTES,
    EventLog,
    append_event,
    encode_event,
    make_event,
    read_events,
    repair,
    scan_lines,
)
from cortexfs.shared.tree import Ownership
from tests.support.storage import attribute

WRITERS = 8
EVENTS_PER_WRITER = 10_000


def _append_many(path: Path, writer: int, count: int, durable_events: bool) -> None:
    with EventLog(path) as log:
        for sequence in range(count):
            # Sizes vary from tens of bytes to several pages, so a torn or interleaved
            # write would show up as a line that does not parse.
            padding = "x" * ((sequence * 7919 + writer * 104729) % 2500)
            event = make_event(
                "probe",
                agent="a",
                session="s",
                object="tool/t",
                status="ok",
                writer=writer,
                sequence=sequence,
                padding=padding,
            )
            log.append(event, durable_event=durable_events)


def _run_writers(path: Path, count: int, durable_events: bool) -> None:
    context = multiprocessing.get_context("fork")
    writers = [
        context.Process(target=_append_many, args=(path, writer, count, durable_events))
        for writer in range(WRITERS)
    ]
    for process in writers:
        process.start()
    for process in writers:
        process.join(300)
        assert process.exitcode == 0


def _assert_every_line_whole_and_in_order(path: Path, count: int) -> None:
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"", "the file ends with a complete line"
    seen: dict[int, list[int]] = {writer: [] for writer in range(WRITERS)}
    for line in lines[:-1]:
        event = json.loads(line)  # every line is exactly one whole event
        assert len(event["padding"]) == (event["sequence"] * 7919 + event["writer"] * 104729) % 2500
        seen[event["writer"]].append(event["sequence"])
    for writer, sequences in seen.items():
        assert sequences == list(range(count)), f"writer {writer} lost or reordered events"


def test_eight_processes_appending_ten_thousand_events_each(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"

    _run_writers(path, EVENTS_PER_WRITER, durable_events=False)

    _assert_every_line_whole_and_in_order(path, EVENTS_PER_WRITER)
    assert len(read_events(path).events) == WRITERS * EVENTS_PER_WRITER


def test_durable_concurrent_appends(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"

    _run_writers(path, 250, durable_events=True)

    _assert_every_line_whole_and_in_order(path, 250)


class _CountingOps(durable.FsOps):
    def __init__(self) -> None:
        super().__init__()
        self.fsyncs: list[int] = []

    def fsync(self, fd: int) -> None:
        self.fsyncs.append(fd)
        super().fsync(fd)


def test_a_durable_event_is_fsynced_before_append_returns(tmp_path: Path) -> None:
    ops = _CountingOps()
    log = EventLog(tmp_path / "events.jsonl", ops=ops)
    created_syncs = len(ops.fsyncs)  # the new file's name is made durable too

    log.append(make_event("a", agent="x", session="s", object="o", status="ok"))
    after_plain = len(ops.fsyncs)
    log.append(make_event("b", agent="x", session="s", object="o", status="ok"), durable_event=True)
    log.close()

    assert created_syncs == 1
    assert after_plain == created_syncs
    assert len(ops.fsyncs) == created_syncs + 1


def test_the_minimal_event_shape_of_s2(tmp_path: Path) -> None:
    event = make_event(
        "tool_call", agent="coder", session="default", object="tool/fs.read", status="ok", n=1
    )

    line = encode_event(event)

    assert list(json.loads(line)) == ["ts", "type", "agent", "session", "object", "status", "n"]
    assert line.startswith(b'{"ts":"') and line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line)["ts"].endswith("Z")


def test_events_must_start_with_ts_and_stay_small() -> None:
    with pytest.raises(CtxError) as no_ts:
        encode_event({"type": "x", "ts": "later"})
    huge = make_event(
        "x", agent="a", session="s", object="o", status="ok", blob="y" * MAX_EVENT_BYTES
    )
    with pytest.raises(CtxError) as too_big:
        encode_event(huge)

    assert no_ts.value.errno == errno.EINVAL
    assert too_big.value.errno == errno.EFBIG


def test_a_torn_last_line_is_ignored_by_readers_and_truncated_by_repair(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    for number in range(3):
        append_event(path, make_event("e", agent="a", session="s", object="o", status=str(number)))
    whole = path.read_bytes()
    with open(path, "ab") as handle:
        handle.write(b'{"ts":"2026-01-01T00:00:00Z","type":"torn","ag')

    scan = read_events(path)
    removed = repair(path)

    assert [event["status"] for event in scan.events] == ["0", "1", "2"]
    assert scan.torn_tail == len(b'{"ts":"2026-01-01T00:00:00Z","type":"torn","ag')
    assert scan.end == len(whole)
    assert removed == scan.torn_tail
    assert path.read_bytes() == whole
    assert repair(path) == 0


def _three_events_then(path: Path, tail: bytes) -> bytes:
    for number in range(3):
        append_event(path, make_event("e", agent="a", session="s", object="o", status=str(number)))
    whole = path.read_bytes()
    with open(path, "ab") as handle:
        handle.write(tail)
    return whole


def _event_line(status: str) -> bytes:
    return encode_event(make_event("e", agent="a", session="s", object="o", status=status))


def test_a_line_longer_than_any_event_is_a_damaged_line_and_the_events_around_it_are_read(
    tmp_path: Path,
) -> None:
    """No writer writes a line of MAX_EVENT_BYTES or more (encode_event): such a line is
    skipped as damaged, read in pieces, and an event glued to its end is still found."""
    path = tmp_path / "events.jsonl"
    _three_events_then(path, b"x" * (3 * MAX_EVENT_BYTES) + b"\n" + _event_line("3"))
    with open(path, "ab") as handle:
        handle.write(b"y" * (2 * MAX_EVENT_BYTES) + _event_line("4"))

    scan = read_events(path)

    assert [event["status"] for event in scan.events] == ["0", "1", "2", "3", "4"]
    assert scan.damaged == [4] and scan.torn_tail == 0 and scan.end == path.stat().st_size


def test_the_holes_of_a_sparse_line_are_skipped_not_read(tmp_path: Path) -> None:
    """A line of 64 GiB, nearly all of it a hole, between two events: read in a moment."""
    path = tmp_path / "events.jsonl"
    whole = _three_events_then(path, b"x" * 10)
    with open(path, "ab") as handle:
        handle.truncate(len(whole) + (64 << 30))
    with open(path, "ab") as handle:
        handle.write(b"\n" + _event_line("3"))

    started = time.monotonic()
    scan = read_events(path)

    assert time.monotonic() - started < 5
    assert [event["status"] for event in scan.events] == ["0", "1", "2", "3"]
    assert scan.damaged == [4] and scan.torn_tail == 0


@pytest.mark.parametrize("cut_by", ["repair", "append"])
def test_a_torn_last_line_of_any_length_is_skipped_and_cut(tmp_path: Path, cut_by: str) -> None:
    """S-5 holds for a last line longer than any event, here 64 GiB and sparse: readers skip
    it and a repair, or the next append, cuts it back to the last whole event, in a moment."""
    path = tmp_path / "events.jsonl"
    whole = _three_events_then(path, b"x" * (2 * MAX_EVENT_BYTES))
    with open(path, "ab") as handle:
        handle.truncate(64 << 30)

    started = time.monotonic()
    scan = read_events(path)
    if cut_by == "repair":
        assert repair(path) == (64 << 30) - len(whole)
        assert path.read_bytes() == whole
    else:
        append_event(path, make_event("e", agent="a", session="s", object="o", status="3"))
        added = path.read_bytes().removeprefix(whole)
        assert added.endswith(b"\n") and json.loads(added)["status"] == "3", added[:200]

    assert time.monotonic() - started < 5
    assert [event["status"] for event in scan.events] == ["0", "1", "2"]
    assert scan.torn_tail == (64 << 30) - len(whole) and scan.end == len(whole)


def test_a_file_of_empty_lines_keeps_only_the_first_damaged_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n" * 100_000)

    scan = read_events(path)

    assert scan.damaged_count == scan.lines == 100_000 and scan.end == 100_000
    assert scan.damaged == list(range(1, DAMAGED_LISTED + 1))


def test_the_first_append_after_a_crash_cuts_the_torn_line_instead_of_gluing_onto_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.jsonl"
    before = make_event("e", agent="a", session="s", object="o", status="before")
    after = make_event("e", agent="a", session="s", object="o", status="after")
    append_event(path, before)
    with open(path, "ab") as handle:
        handle.write(b'{"ts":"2026-01-01T00:00:00Z","type":"to')  # the crash

    append_event(path, after)

    assert path.read_bytes() == encode_event(before) + encode_event(after)
    scan = read_events(path)
    assert [event["status"] for event in scan.events] == ["before", "after"]
    assert scan.damaged == [] and scan.torn_tail == 0


def test_a_log_kept_open_cuts_a_fragment_another_writer_left_before_its_next_append(
    tmp_path: Path,
) -> None:
    """A worker keeps its session open; another writer of the session dies mid-append: the
    worker's next event is a line of its own, not glued onto the fragment."""
    path = tmp_path / "events.jsonl"
    first = make_event("e", agent="a", session="s", object="o", status="first")
    next_one = make_event("e", agent="a", session="s", object="o", status="next")
    with EventLog(path) as kept_open:
        kept_open.append(first)
        with open(path, "ab") as other_writer:
            other_writer.write(b'{"ts":"2026-01-01T00:00:00Z","type":"to')  # killed here

        kept_open.append(next_one)

    assert path.read_bytes() == encode_event(first) + encode_event(next_one)


TORN = b'{"ts":"2026-01-01T00:00:00Z","type":"to'


@pytest.mark.parametrize("found_by", ["open", "append"])
def test_an_append_only_log_ending_torn_is_refused_naming_it_and_its_attribute(
    tmp_path: Path, found_by: str
) -> None:
    """chattr +a lets an appender open the log but refuses the cut of its torn line, to root
    too, which the kernel says only as 'Operation not permitted': the refusal names the log,
    the torn bytes, the attribute and the chattr that lifts it, and nothing is written."""
    path = tmp_path / "events.jsonl"
    first = make_event("e", agent="a", session="s", object="o", status="first")
    append_event(path, first)
    kept_open = EventLog(path) if found_by == "append" else None
    try:
        with open(path, "ab") as other_writer:
            other_writer.write(TORN)  # killed here
        with attribute(path, "a"), pytest.raises(CtxError) as refused:
            if kept_open is None:
                EventLog(path)
            else:
                kept_open.append(first)
    finally:
        if kept_open is not None:
            kept_open.close()

    assert refused.value.errno == errno.EPERM
    assert refused.value.message == (
        f"{path} ends with a torn line of {len(TORN)} bytes, which cannot be cut while it is "
        "append-only (attribute 'a', which 'lsattr' shows), and no event is appended after a "
        "torn line (it would be glued onto it); nothing was changed: have root lift the "
        f"attribute with 'chattr -i -a {path}', and the next append cuts it"
    )
    assert path.read_bytes() == encode_event(first) + TORN


def test_threads_appending_through_one_log_lose_nothing(tmp_path: Path) -> None:
    """A worker's job slots share its session's log, and so its descriptor and flock: one
    thread's append must neither drop the lock another's write holds nor take a write still
    in flight for a torn fragment."""
    path = tmp_path / "events.jsonl"
    per_thread = 300

    with EventLog(path) as shared:

        def append_many(thread: int) -> None:
            for n in range(per_thread):
                # Long writes among short ones: the kernel copies a long one in pieces.
                pad = "x" * (60_000 if n % 2 else 10)
                shared.append(
                    make_event(
                        "e", agent="a", session="s", object=f"{thread}.{n}", status="ok", pad=pad
                    )
                )

        threads = [threading.Thread(target=append_many, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    scan = read_events(path)
    assert (len(scan.events), scan.damaged, scan.torn_tail) == (4 * per_thread, [], 0)


def test_repair_waits_for_an_append_in_flight(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"ts":"x","type":"half')
    appender = os.open(path, os.O_WRONLY | os.O_APPEND)
    fcntl.flock(appender, fcntl.LOCK_SH)  # an appender between its flock and its write
    finished = threading.Event()
    repairing = threading.Thread(target=lambda: (repair(path), finished.set()))

    repairing.start()
    time.sleep(0.3)
    blocked = not finished.is_set()
    os.write(appender, b'"}\n')  # the append completes the line
    fcntl.flock(appender, fcntl.LOCK_UN)
    repairing.join(10)
    os.close(appender)

    assert blocked, "repair must wait for appends holding the shared lock"
    assert path.read_bytes() == b'{"ts":"x","type":"half"}\n'


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_appending_to_something_other_than_a_regular_file_is_refused(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "events.jsonl"
    if kind == "symlink":
        (tmp_path / "elsewhere").write_text("")
        path.symlink_to(tmp_path / "elsewhere")
    else:
        os.mkfifo(path)

    with pytest.raises(CtxError) as refused:
        EventLog(path)

    assert refused.value.errno == errno.EINVAL
    assert not (tmp_path / "elsewhere").exists() or (tmp_path / "elsewhere").read_text() == ""


_EVENTS = st.lists(
    st.fixed_dictionaries({"status": st.text(max_size=30), "n": st.integers()}),
    min_size=1,
    max_size=8,
)


@given(events=_EVENTS, glue_before=st.integers(min_value=0), cut=st.integers(min_value=1))
def test_readers_recover_every_whole_event_around_a_torn_fragment(
    events: list[dict[str, object]], glue_before: int, cut: int
) -> None:
    lines = [
        encode_event(make_event("e", agent="a", session="s", object="o", **event))
        for event in events
    ]
    victim = lines[glue_before % len(lines)]
    fragment = victim[: 1 + cut % (len(victim) - 1)]  # a strict prefix: no newline
    position = glue_before % len(lines)
    data = b"".join(lines[:position]) + fragment + b"".join(lines[position:])

    recovered = scan_lines(data).events

    assert [event["n"] for event in recovered] == [event["n"] for event in events]


def test_a_hard_link_at_the_logs_name_is_refused_and_its_file_untouched(tmp_path: Path) -> None:
    """Someone who may write the session's directory links another file to events.jsonl:
    appending (or cutting a torn line) would change that file, which is not the log."""
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("somebody's data, no newline at the end")
    elsewhere.chmod(0o600)
    session = tmp_path / "session"
    session.mkdir()
    os.link(elsewhere, session / "events.jsonl")
    before = os.stat(elsewhere)

    with pytest.raises(CtxError) as refused:
        EventLog(session / "events.jsonl", owner=Ownership(12345, 12345))

    assert refused.value.errno == errno.EINVAL and "2 names (hard links)" in str(refused.value)
    after = os.stat(elsewhere)
    assert (after.st_uid, after.st_gid, after.st_mode) == (
        before.st_uid,
        before.st_gid,
        before.st_mode,
    )
    assert elsewhere.read_text() == "somebody's data, no newline at the end"


def test_only_a_log_this_open_created_is_given_to_the_owner(tmp_path: Path) -> None:
    existing = tmp_path / "events.jsonl"
    existing.write_text("")
    existing.chmod(0o604)

    with EventLog(existing, mode=0o640, owner=Ownership(12345, 12345)) as log:
        log.append(make_event("note", agent="a", session="s", object="tool/x", status="ok"))
    with EventLog(tmp_path / "new.jsonl", mode=0o640, owner=Ownership(12345, 12345)):
        pass

    assert os.stat(existing).st_uid == os.geteuid()
    assert os.stat(existing).st_mode & 0o777 == 0o604
    made = os.stat(tmp_path / "new.jsonl")
    assert made.st_mode & 0o777 == 0o640
    if os.geteuid() == 0:
        assert (made.st_uid, made.st_gid) == (12345, 12345)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory away needs root")
def test_a_directory_swapped_in_while_it_is_made_is_not_given_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between root's mkdir and its chown, a user who may write the parent puts another
    directory at the name: it keeps its owner and mode, and the call says what happened."""
    from cortexfs.shared import tree

    victims = tmp_path / "victims"
    victims.mkdir()
    theirs = victims / "private"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 4242, 4242)
    (theirs / "notes").write_text("mine\n")
    made = durable.make_dir_synced

    def swapped(ops: durable.FsOps, dir_fd: int, name: str, mode: int) -> bool:
        created = made(ops, dir_fd, name, mode)
        os.rmdir(name, dir_fd=dir_fd)
        os.rename(theirs, os.path.join(f"/proc/self/fd/{dir_fd}", name))
        return created

    monkeypatch.setattr(durable, "make_dir_synced", swapped)
    with pytest.raises(CtxError) as refused:
        tree.ensure_directories(
            durable.default_ops(), tmp_path, ["session"], mode=0o750, owner=Ownership(1, 1)
        )

    assert refused.value.errno == errno.EEXIST and "was replaced" in str(refused.value)
    status = os.stat(tmp_path / "session")
    assert (status.st_uid, status.st_gid, status.st_mode & 0o7777) == (4242, 4242, 0o700)


def test_a_log_kept_locked_by_another_process_is_waited_on_for_a_bounded_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anyone who may open a log may lock it; a call appending to it must not hang forever."""
    from cortexfs.shared import events

    monkeypatch.setattr(events, "LOCK_WAIT_SECONDS", 0.3)
    path = tmp_path / "events.jsonl"
    path.write_text("")
    holder = os.open(path, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    event = make_event("note", agent="a", session="s", object="tool/x", status="ok")
    try:
        with EventLog(path) as log:
            started = time.monotonic()
            with pytest.raises(CtxError) as waited:
                log.append(event)
            assert 0.3 <= time.monotonic() - started < 5
            assert waited.value.errno == errno.EAGAIN and "stayed locked" in str(waited.value)
        with pytest.raises(CtxError):
            repair(path)
    finally:
        os.close(holder)
    with EventLog(path) as log:
        log.append(event)  # the lock gone, appends go on
    assert len(read_events(path).events) == 1
