"""A long-lived recorder follows its ``events.jsonl`` renamed away (a rotation): the next
event goes to a new file at the name, the renamed one keeps what came before."""

from __future__ import annotations

import threading
from pathlib import Path

from cortexfs import storage
from cortexfs.shared.events import read_events
from cortexfs.shared.sessions import SessionRef, open_session


def _session(tmp_path: Path) -> SessionRef:
    root = tmp_path / "root"
    storage.ensure_root_abi(root)
    return SessionRef.home(root, 1000, "coder", "s1")


def _types(path: Path) -> list[str]:
    return [event["type"] for event in read_events(path).events]


def test_a_session_following_rotation_writes_to_the_new_file(tmp_path: Path) -> None:
    ref = _session(tmp_path)
    with open_session(ref, follow_rotation=True) as session:
        session.record("before", object="o", status="ok")
        ref.events_path.rename(ref.events_path.with_name("events.jsonl.1"))
        session.record("after", object="o", status="ok", durable_event=True)
        ref.events_path.unlink()  # removed outright: made again at the next event
        session.record("again", object="o", status="ok")
        session.sync()
    assert _types(ref.events_path.with_name("events.jsonl.1")) == ["before"]
    assert _types(ref.events_path) == ["again"]


def test_one_that_does_not_follow_keeps_appending_to_the_renamed_file(tmp_path: Path) -> None:
    ref = _session(tmp_path)
    with open_session(ref) as session:
        session.record("before", object="o", status="ok")
        ref.events_path.rename(ref.events_path.with_name("events.jsonl.1"))
        session.record("after", object="o", status="ok")
    assert _types(ref.events_path.with_name("events.jsonl.1")) == ["before", "after"]
    assert not ref.events_path.exists()


def test_threads_recording_across_a_rotation_lose_no_event(tmp_path: Path) -> None:
    ref = _session(tmp_path)
    rotated = ref.events_path.with_name("events.jsonl.1")
    # Each thread records half its events, waits for the rotation (or a moment, whichever
    # comes first), then records the rest: the rename lands between records on any machine.
    halfway = threading.Barrier(5)
    rotated_now = threading.Event()
    with open_session(ref, follow_rotation=True) as session:

        def record(n: int) -> None:
            for i in range(200):
                if i == 100:
                    halfway.wait()
                    rotated_now.wait(timeout=0.01 * n)  # some record while it happens
                session.record("e", object=f"o{n}-{i}", status="ok")

        threads = [threading.Thread(target=record, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        halfway.wait()
        ref.events_path.rename(rotated)
        rotated_now.set()
        for thread in threads:
            thread.join()
    seen = read_events(rotated).events + read_events(ref.events_path).events
    assert sorted(e["object"] for e in seen) == sorted(
        f"o{n}-{i}" for n in range(4) for i in range(200)
    )
