"""What tsh answers when something around it is wrong: a run socket's odd answer, a word of
hundreds of characters, a config it cannot use, a CTX_PATH directory that cannot be reached
(SPEC H-1, H-2, H-4; docs/tools.md "The agent terminal", docs/sessions.md
``terminal.view_lost``).  Each is one line on stderr saying what and why, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cortexfs import storage
from tests.fuse.support import NEEDS_A_MOUNT, mounted
from tests.support.storage import copy_of_root


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("tsh") / "storage"
    storage.bootstrap(root)
    yield root
    shutil.rmtree(root.parent)


@pytest.fixture
def root(template: Path, tmp_path: Path) -> Path:
    return copy_of_root(template, tmp_path / "storage")


def tsh(root: Path, *argv: str, **environ: str) -> subprocess.CompletedProcess[str]:
    """``bin/tsh ARGV`` run by a person, ``CTX_PATH`` the root's ``tool/`` unless given."""
    return subprocess.run(
        [str(root / "bin" / "tsh"), *argv],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "CTX_PATH": str(root / "tool"), **environ},
        timeout=60,
    )


# ================================================================= the run socket's answer


def serve_once(path: Path, answer: bytes) -> threading.Thread:
    """A run socket at ``path`` that takes one command line and answers ``answer``."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    server.settimeout(30)

    def serve() -> None:
        with server:
            connection, _ = server.accept()
            with connection:
                _, ancillary, _, _ = connection.recvmsg(65536, socket.CMSG_SPACE(3 * 4))
                for _, _, passed in ancillary:  # stdin, stdout, stderr: not ours to keep
                    for offset in range(0, len(passed) - len(passed) % 4, 4):
                        os.close(int.from_bytes(passed[offset : offset + 4], "little"))
                connection.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize(
    ("answer", "shown"),
    [
        pytest.param(b'{"exit_status": null}\n', "null", id="null"),
        pytest.param(b'{"exit_status": {}}\n', "{}", id="an-object"),
        pytest.param(b'{"exit_status": 1e400}\n', "Infinity", id="an-infinity"),
        pytest.param(b'{"exit_status": true}\n', "true", id="a-boolean"),
        pytest.param(b'{"exit_status": -1}\n', "-1", id="below-0"),
        pytest.param(b'{"exit_status": 256}\n', "256", id="past-255"),
        pytest.param(b'{"exit_status": "3"}\n', '"3"', id="a-string"),
    ],
)
def test_an_answer_holding_no_exit_status_is_126_the_host_did_not_run_it(
    root: Path, tmp_path: Path, answer: bytes, shown: str
) -> None:
    """tsh's help: 126 when a tool cannot be run — as for an answer that is no object."""
    where = tmp_path / "run.sock"
    host = serve_once(where, answer)

    run = tsh(root, "fs.stat", "/", CTX_RUN_SOCKET=str(where))
    host.join(30)

    assert (run.returncode, run.stdout) == (126, ""), run
    assert run.stderr == (
        "tsh: fs.stat: EPROTO: the host did not run it: its answer's exit_status is "
        f"{shown}, which is no exit status (0 to 255)\n"
    ), run.stderr


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        pytest.param(b"", "it closed its run socket without an answer", id="nothing"),
        pytest.param(b"ok\x1b[2J\n", "its answer is no JSON: ok\\x1b[2J", id="no-json"),
        pytest.param(b"[3]\n", "its answer is no JSON object with an exit_status: [3]",
                     id="no-object"),
        pytest.param(b'{"status": 3}\n', "its answer is no JSON object with an exit_status: "
                     '{"status": 3}', id="no-exit-status"),
    ],
)  # fmt: skip
def test_an_answer_that_is_no_outcome_is_eproto_saying_what_it_was(
    root: Path, tmp_path: Path, answer: bytes, said: str
) -> None:
    """An answer is one JSON object with an exit status; anything else is a protocol error
    (EPROTO) saying what came instead, printable, never Python's own words for it."""
    where = tmp_path / "run.sock"
    host = serve_once(where, answer)

    run = tsh(root, "fs.stat", "/", CTX_RUN_SOCKET=str(where))
    host.join(30)

    assert (run.returncode, run.stdout) == (126, ""), run
    assert run.stderr == f"tsh: fs.stat: EPROTO: the host did not run it: {said}\n", run


def test_a_run_socket_that_is_not_there_is_named_with_its_errno(tmp_path: Path, root: Path) -> None:
    where = tmp_path / "gone.sock"
    run = tsh(root, "fs.stat", "/", CTX_RUN_SOCKET=str(where))
    assert (run.returncode, run.stdout) == (126, ""), run
    assert run.stderr == (
        f"tsh: fs.stat: ENOENT: the host did not run it: its run socket {where}: No such file "
        "or directory\n"
    ), run


def test_a_refusal_the_host_answers_is_printed_printable(root: Path, tmp_path: Path) -> None:
    where = tmp_path / "run.sock"
    host = serve_once(where, b'{"error": "EACCES: no\\u001b[2J", "exit_status": 126}\n')

    run = tsh(root, "fs.stat", "/", CTX_RUN_SOCKET=str(where))
    host.join(30)

    assert (run.returncode, run.stderr) == (126, "tsh: fs.stat: EACCES: no\\x1b[2J\n"), run


def test_an_exit_status_the_host_answers_is_tshs(root: Path, tmp_path: Path) -> None:
    where = tmp_path / "run.sock"
    host = serve_once(where, b'{"exit_status": 3}\n')

    run = tsh(root, "fs.stat", "/", CTX_RUN_SOCKET=str(where))
    host.join(30)

    assert (run.returncode, run.stdout, run.stderr) == (3, "", ""), run


# ======================================================================= a long word typed


@pytest.mark.parametrize(
    ("argv", "status", "said"),
    [
        pytest.param(["load"], 1, "tsh: load: {word}: not a tool on CTX_PATH", id="load"),
        pytest.param(["describe"], 1, "tsh: describe: {word}: not a tool on CTX_PATH",
                     id="describe"),
        pytest.param(["pin"], 1, "tsh: pin: {word}: not a tool on CTX_PATH", id="pin"),
        pytest.param(["unpin"], 1, "tsh: unpin: {word}: not pinned", id="unpin"),
        pytest.param(["unload"], 1, "tsh: unload: {word}: not loaded", id="unload"),
        pytest.param(["exit"], 2, "tsh: exit: {word}: a decimal number is needed (exit [N])",
                     id="exit"),
        pytest.param(["which"], 1, "tsh: {word}: not on CTX_PATH", id="which"),
    ],
)  # fmt: skip
def test_a_built_in_names_a_long_word_cut_past_256_characters(
    template: Path, argv: list[str], status: int, said: str
) -> None:
    """docs/tools.md: "A message naming a word typed cuts it past 256 characters, saying how
    long it was" — escaped first, so an escape sequence typed never reaches the terminal."""
    word = "\x1b" + "x" * 399
    shown = "\\x1b" + "x" * 252 + "… (403 characters)"  # the word as escaped, then cut

    run = tsh(template, *argv, word)

    assert (run.returncode, run.stdout) == (status, ""), run
    assert run.stderr == said.replace("{word}", shown) + "\n", run.stderr


# ============================================================= the config of tsh as a tool


def as_the_agents_tool(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """tsh as the runner starts it for an agent: the storage root in its view at ``/ctx``."""
    view = json.dumps([[str(root), "/ctx", "ro"]])
    return tsh(root, *argv, CTX_AGENT="coder", CTX_MOUNTS=view, CTX_PATH="/ctx/tool")


@pytest.mark.parametrize(
    ("shape", "why"),
    [
        pytest.param("link", "a symbolic link, never followed", id="a-link"),
        pytest.param("fifo", "not a regular file", id="a-FIFO"),
        pytest.param("directory", "not a regular file", id="a-directory"),
        pytest.param("large", "larger than 65536 bytes", id="over-64-KiB"),
        pytest.param("tsh.d-a-link", "a symbolic link, never followed", id="tsh.d-a-link"),
    ],
)
def test_tsh_as_the_agents_tool_says_when_its_config_cannot_be_used(
    root: Path, tmp_path: Path, shape: str, why: str
) -> None:
    """docs/tools.md: "A ``tool/tsh.d/config`` that cannot be read (a link, a FIFO, over 64
    KiB) is said on stderr, as a bad line is, and the defaults apply" — by the tsh an agent
    runs as a tool too, naming the config as the agent sees it."""
    controls = root / "tool" / "tsh.d"
    config = controls / "config"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("max_loaded_tools=abc\n")
    if shape == "tsh.d-a-link":
        controls.rename(tmp_path / "tsh.d")
        controls.symlink_to(tmp_path / "tsh.d")
    else:
        config.unlink()
    if shape == "link":
        config.symlink_to(elsewhere)
    elif shape == "fifo":
        os.mkfifo(config)
    elif shape == "directory":
        config.mkdir()
    elif shape == "large":
        config.write_text("# padding\n" * 7000)

    run = as_the_agents_tool(root, "which", "fs.read")

    assert (run.returncode, run.stdout) == (0, "/ctx/tool/fs.read\n"), run
    assert run.stderr == (
        f"tsh: /ctx/tool/tsh.d/config cannot be read ({why}): every setting (ignored; the "
        "default applies)\n"
    ), run.stderr


def test_tsh_as_the_agents_tool_takes_its_config_or_the_defaults_in_silence(root: Path) -> None:
    """A usable config, or none at all, is nothing to say."""
    config = root / "tool" / "tsh.d" / "config"
    config.write_text("max_loaded_tools=1\n")
    kept = as_the_agents_tool(root, "load", "fs.read", "fs.stat")
    config.unlink()
    missing = as_the_agents_tool(root, "which", "fs.read")

    assert kept.returncode == 0, kept
    assert kept.stderr == "tsh: unloaded fs.read (max_loaded_tools reached)\n", kept.stderr
    assert (missing.returncode, missing.stdout, missing.stderr) == (0, "/ctx/tool/fs.read\n", "")


# ================================================== a CTX_PATH directory that cannot be reached


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        pytest.param(["which", "fs.stat"], "tsh: fs.stat: not on CTX_PATH", id="which"),
        pytest.param(["describe", "fs.stat"], "tsh: describe: fs.stat: not a tool on CTX_PATH",
                     id="describe"),
        pytest.param(["load", "fs.stat"], "tsh: load: fs.stat: not a tool on CTX_PATH",
                     id="load"),
        pytest.param(["pin", "fs.stat"], "tsh: pin: fs.stat: not a tool on CTX_PATH", id="pin"),
        pytest.param(["fs.stat"], "tsh: fs.stat: not a tool on CTX_PATH", id="a-call"),
    ],
)  # fmt: skip
def test_a_name_not_found_in_a_dead_mount_says_the_directory_cannot_be_reached(
    root: Path, tmp_path: Path, argv: list[str], said: str
) -> None:
    """docs/sessions.md ``terminal.view_lost``: ``/ctx`` answers ``ENOTCONN`` "and tsh says so
    when it finds no tool" — ``which``, ``describe``, ``load`` and ``pin`` as a call does,
    not a bare "not on CTX_PATH", which would read as a view that holds no such tool."""
    dead = tmp_path / "ctx"
    with mounted(root, dead) as process:
        process.kill()
        process.wait(timeout=30)
        try:
            run = tsh(root, *argv, CTX_PATH=str(dead / "tool"))
        finally:
            subprocess.run(["umount", "--lazy", str(dead)], check=True)

    assert run.returncode == (127 if len(argv) == 1 else 1), run
    assert run.stderr == (
        f"{said}: the CTX_PATH directory {dead}/tool cannot be reached (ENOTCONN: Transport "
        "endpoint is not connected); this terminal's view of /ctx has ended: ask the host to "
        "stop and start the terminal\n"
    ), run.stderr


for _mark in NEEDS_A_MOUNT:
    test_a_name_not_found_in_a_dead_mount_says_the_directory_cannot_be_reached = _mark(
        test_a_name_not_found_in_a_dead_mount_says_the_directory_cannot_be_reached
    )
