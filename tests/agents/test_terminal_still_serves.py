"""Whether a terminal still serves, as a client it let go asks it (``ctx agent watch`` and
``attach`` ending: ECONNABORTED when it lets the client go, exit 0 when it ended; A-2).

Real UNIX sockets and a real ``kill -9`` of the process that listens: the killed one's
listener can outlive its clients' connections for a moment, so a connection alone is no sign
of a terminal that serves.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from pathlib import Path

from cortexfs.agents.terminal_socket import socket_address, still_serves


def listener_at(path: Path, backlog: int = 16) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(backlog)
    return listener


def answer_once(listener: socket.socket, mode_lines: list[bytes] | None = None) -> None:
    """A terminal's answer to one watcher: its mode line read (kept in ``mode_lines``), its
    prompt sent, then the watcher's going waited for: the probe closes with some of the
    prompt unread, a reset, which the terminal takes as any client's going."""
    connection, _ = listener.accept()
    with connection:
        line = connection.recv(64)
        if mode_lines is not None:
            mode_lines.append(line)
        connection.sendall(b"$ ")
        with contextlib.suppress(OSError):
            connection.recv(64)


def serve_one_client(path: Path, ready: int) -> None:
    """A terminal's descriptors: its listener, a client taken, some more; then it waits."""
    listener = listener_at(path)
    held = [socket.socket(socket.AF_UNIX) for _ in range(20)]
    os.write(ready, b"x")
    client = listener.accept()[0]
    held.append(client)
    client.recv(64)  # its mode line: unread, it would reset the connection at the kill
    os.write(ready, b"y")
    time.sleep(60)


def test_a_killed_terminal_does_not_serve_once_its_client_saw_the_end(tmp_path: Path) -> None:
    """Each round: a process listens, takes one client and holds some more descriptors, as
    ctxterm does; it is killed; the moment its client reads the end of its connection, the
    terminal is asked whether it still serves, and it never does."""
    path = tmp_path / "main.sock"
    served = []
    for _ in range(40):
        path.unlink(missing_ok=True)
        ready_read, ready_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                serve_one_client(path, ready_write)
            finally:
                os._exit(0)
        os.close(ready_write)
        try:
            assert os.read(ready_read, 1) == b"x"
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
                client.connect(str(path))
                client.sendall(b"watch\n")
                assert os.read(ready_read, 1) == b"y"  # taken, and its mode line read
                os.kill(pid, signal.SIGKILL)
                assert client.recv(64) == b""
                served.append(still_serves(path, seconds=10))
        finally:
            os.close(ready_read)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # a round that failed before its kill
            os.waitpid(pid, 0)
    assert served == [False] * 40


def test_a_terminal_that_answers_a_watcher_serves(tmp_path: Path) -> None:
    path = tmp_path / "main.sock"
    listener = listener_at(path)
    lines: list[bytes] = []
    server = threading.Thread(target=answer_once, args=(listener, lines), daemon=True)
    server.start()
    try:
        assert still_serves(path)
        server.join(5)
        assert lines == [b"watch\n"]
    finally:
        listener.close()


def test_a_terminal_that_refuses_a_watcher_serves(tmp_path: Path) -> None:
    path = tmp_path / "main.sock"
    listener = listener_at(path)

    def terminal() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.sendall(b"ctxterm: EAGAIN: the terminal serves 64 clients\n")
            with contextlib.suppress(ConnectionResetError):
                connection.recv(64)

    threading.Thread(target=terminal, daemon=True).start()
    try:
        assert still_serves(path)
    finally:
        listener.close()


def test_a_listener_that_goes_without_taking_the_probe_does_not_serve(tmp_path: Path) -> None:
    """The dying terminal's listener: the probe waits in its queue, and is reset as it goes."""
    path = tmp_path / "main.sock"
    listener = listener_at(path)
    closing = threading.Timer(0.3, listener.close)
    closing.start()
    began = time.monotonic()
    try:
        assert not still_serves(path, seconds=10)
        assert time.monotonic() - began < 5
    finally:
        closing.cancel()
        listener.close()


def test_a_listener_that_neither_answers_nor_goes_counts_as_serving(tmp_path: Path) -> None:
    """Taken but not answered in time: a terminal too busy to answer has not ended."""
    path = tmp_path / "main.sock"
    with listener_at(path):
        began = time.monotonic()
        assert still_serves(path, seconds=0.3)
        assert 0.3 <= time.monotonic() - began < 5


def test_a_listener_whose_queue_stays_full_counts_as_serving(tmp_path: Path) -> None:
    """A terminal out of descriptors rests, its connections queued: one that cannot even
    queue the probe's connection within the wait has not ended either."""
    path = tmp_path / "main.sock"
    queued = []
    with listener_at(path, backlog=1):
        while True:  # fill its queue
            waiting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            waiting.setblocking(False)
            queued.append(waiting)
            try:
                waiting.connect(str(path))
            except BlockingIOError:
                break
        began = time.monotonic()
        assert still_serves(path, seconds=0.3)
        assert 0.3 <= time.monotonic() - began < 5
    for waiting in queued:
        waiting.close()


def test_no_terminal_and_a_socket_left_by_a_crash_do_not_serve(tmp_path: Path) -> None:
    assert not still_serves(tmp_path / "main.sock")
    listener_at(tmp_path / "left.sock").close()
    assert (tmp_path / "left.sock").exists()
    assert not still_serves(tmp_path / "left.sock")


def test_a_long_path_is_asked_through_its_directory(tmp_path: Path) -> None:
    """A socket's address holds 107 bytes; a terminal's path may be longer (R-3 names)."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = deep / "main.sock"
    assert len(os.fsencode(path)) > 107
    assert not still_serves(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with listener, socket_address(path) as address:
        listener.bind(address)
        listener.listen(16)
        threading.Thread(target=answer_once, args=(listener,), daemon=True).start()
        assert still_serves(path)
