"""The core tools: paths confined to the agent's mounts, no `..`, no links (SPEC R-5, T-5)."""

from __future__ import annotations

import base64
import errno
import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cortexfs.tools.core import fs_read
from cortexfs.tools.core.toolio import ToolFailure
from tests.tools.support import World

CORE = ["fs.read", "fs.list", "fs.stat", "fs.write", "shell.exec"]
SECRET = "the secret outside every mount\n"


@pytest.fixture
def agent(world: World) -> World:
    """Agent coder: the workspace read-write at /workspace, a reference dir read-only at /ref."""
    reference = world.scratch.parent / "reference"
    reference.mkdir()
    (reference / "manual.txt").write_text("read me\n")
    outside = world.scratch.parent / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET)
    work = world.workspace
    (work / "a.txt").write_text("inside\n")
    (work / "sub").mkdir()
    (work / "sub" / "b.txt").write_text("deeper\n")
    (work / "link-out").symlink_to(outside / "secret.txt")
    (work / "link-in").symlink_to(work / "a.txt")
    (work / "dir-link").symlink_to(outside)
    for path in (work / "sub", work / "sub/b.txt", work / "a.txt"):
        os.chown(path, world.user.uid, world.user.gid, follow_symlinks=False)
    mounts = [[str(work), "/workspace", "rw"], [str(reference), "/ref", "ro"]]
    world.agent("coder", tools=CORE, mounts=mounts)
    for tool in CORE:
        world.allow_tool(tool)
    return world


def failure(world: World, tool: str, request: dict[str, object]) -> tuple[int, str]:
    result = world.run(tool, request)
    assert result.status == "error" and result.error.stage == "exit", result
    return result.error.errno, result.error.message


@pytest.mark.parametrize(
    ("tool", "path", "code"),
    [
        ("fs.read", "../outside/secret.txt", errno.EINVAL),
        ("fs.read", "/workspace/../outside/secret.txt", errno.EINVAL),
        ("fs.read", "sub/../../outside/secret.txt", errno.EINVAL),
        ("fs.read", str(Path("/etc/passwd")), errno.EACCES),
        ("fs.read", "link-out", errno.ELOOP),
        ("fs.read", "link-in", errno.ELOOP),
        ("fs.read", "dir-link/secret.txt", errno.ELOOP),
        ("fs.list", "dir-link", errno.ELOOP),
        ("fs.list", "/", errno.EACCES),
        ("fs.stat", "dir-link/secret.txt", errno.ELOOP),
        ("fs.write", "link-out", errno.ELOOP),
        ("fs.write", "dir-link/new.txt", errno.ELOOP),
        ("fs.write", "/ref/manual.txt", errno.EROFS),
        ("fs.write", "/ctx/tool/fs.read", errno.EROFS),
        ("shell.exec", "dir-link", errno.ELOOP),
    ],
)
def test_escapes_are_refused(agent: World, tool: str, path: str, code: int) -> None:
    request: dict[str, object] = {"path": path}
    if tool == "fs.write":
        request["content"] = "overwritten"
    if tool == "shell.exec":
        request = {"cmd": "cat secret.txt", "cwd": path}

    refused, message = failure(agent, tool, request)

    assert refused == code, message
    outside = agent.scratch.parent / "outside" / "secret.txt"
    assert outside.read_text() == SECRET
    assert not (agent.scratch.parent / "outside" / "new.txt").exists()


def test_reads_lists_and_stats_inside_the_mounts(agent: World) -> None:
    read = agent.run("fs.read", {"path": "sub/b.txt"})
    binary = agent.workspace / "blob"
    binary.write_bytes(b"\xff\x00\xfe")
    read_binary = agent.run("fs.read", {"path": "/workspace/blob", "offset": 1, "length": 1})
    listing = agent.run("fs.list", {})
    stat = agent.run("fs.stat", {"path": "link-out"})
    reference = agent.run("fs.read", {"path": "/ref/manual.txt"})

    assert read.output["content"] == "deeper\n" and read.output["path"] == "/workspace/sub/b.txt"
    assert read_binary.output["encoding"] == "utf-8" and read_binary.output["content"] == "\x00"
    assert read_binary.output["truncated"] is True
    entries = {entry["name"]: entry["type"] for entry in listing.output["entries"]}
    assert entries["a.txt"] == "file" and entries["sub"] == "directory"
    assert entries["link-out"] == "symlink"
    assert stat.output["type"] == "symlink"
    assert reference.output["content"] == "read me\n"


def test_fs_write_is_atomic_owned_by_the_agent_and_never_replaces_when_told_not_to(
    agent: World,
) -> None:
    payload = base64.b64encode(b"\x01\x02").decode()

    created = agent.run(
        "fs.write", {"path": "sub/new.bin", "content": payload, "encoding": "base64"}
    )
    replaced = agent.run("fs.write", {"path": "sub/new.bin", "content": "text"})
    kept = agent.run("fs.write", {"path": "sub/new.bin", "content": "no", "overwrite": False})

    target = agent.workspace / "sub" / "new.bin"
    assert created.output == {"path": "/workspace/sub/new.bin", "bytes": 2, "created": True}
    assert replaced.ok and replaced.output["created"] is False
    assert kept.error.errno == errno.EEXIST
    assert target.read_text() == "text"
    assert os.stat(target).st_uid == agent.user.uid
    assert sorted(os.listdir(target.parent)) == ["b.txt", "new.bin"], "no temporary file left"


def test_fs_write_keeps_the_permission_bits_of_the_file_it_replaces(agent: World) -> None:
    """Whatever the tool's umask (022) would take away: a group-writable file in a shared
    place stays group-writable after an agent rewrites it.  Special bits are not carried over
    to content the agent wrote."""
    shared = agent.workspace / "sub" / "b.txt"
    shared.chmod(0o660)
    special = agent.workspace / "sub" / "tool"
    special.write_text("#!/bin/sh\n")
    os.chown(special, agent.user.uid, agent.user.gid)
    special.chmod(0o2775)

    assert agent.run("fs.write", {"path": "sub/b.txt", "content": "rewritten"}).ok
    assert agent.run("fs.write", {"path": "sub/tool", "content": "#!/bin/sh\ntrue\n"}).ok

    assert shared.read_text() == "rewritten"
    assert oct(shared.stat().st_mode & 0o7777) == oct(0o660)
    assert oct(special.stat().st_mode & 0o7777) == oct(0o775)


def test_fs_write_is_refused_by_the_kernel_where_the_agent_may_not_write(agent: World) -> None:
    locked = agent.workspace / "locked"
    locked.mkdir()
    locked.chmod(0o755)  # owned by root: the agent may enter but not create

    code, _ = failure(agent, "fs.write", {"path": "locked/x", "content": "no"})

    assert code == errno.EACCES and not (locked / "x").exists()


def test_fs_write_into_a_drop_box_it_may_not_read(agent: World) -> None:
    """docs/tools.md: a write asks what a rename asks, write and search on the directory; in
    root's ``drop`` (mode 1733), which the agent may not read, a file is made and replaced
    all the same, and no temporary file stays behind."""
    drop = agent.workspace / "drop"
    drop.mkdir()
    drop.chmod(0o1733)

    created = agent.run("fs.write", {"path": "drop/n.txt", "content": "one"})
    replaced = agent.run("fs.write", {"path": "drop/n.txt", "content": "two"})
    kept = agent.run("fs.write", {"path": "drop/n.txt", "content": "no", "overwrite": False})

    assert created.ok and created.output["created"] is True, created
    assert replaced.ok and replaced.output["created"] is False, replaced
    assert kept.error is not None and kept.error.errno == errno.EEXIST, kept
    assert (drop / "n.txt").read_text() == "two"
    assert os.listdir(drop) == ["n.txt"]


def test_fs_write_into_a_drop_box_replaces_a_file_its_owner_may_not_read(agent: World) -> None:
    """The replacement keeps the replaced file's mode (here 0200, write only), which lets the
    agent open the new file neither to read nor to sync: it is synced through the descriptor
    it was written by, and the replacement stands."""
    drop = agent.workspace / "drop"
    drop.mkdir()
    drop.chmod(0o1733)
    assert agent.run("fs.write", {"path": "drop/w.txt", "content": "one"}).ok
    (drop / "w.txt").chmod(0o200)

    replaced = agent.run("fs.write", {"path": "drop/w.txt", "content": "two"})

    assert replaced.ok and replaced.output["created"] is False, replaced
    assert (drop / "w.txt").read_text() == "two"
    assert stat.S_IMODE((drop / "w.txt").stat().st_mode) == 0o200
    assert os.listdir(drop) == ["w.txt"]


def test_fs_write_in_an_append_only_directory_is_refused_before_writing(agent: World) -> None:
    """An append-only directory lets the temporary file in and neither out nor away: EPERM
    naming the attribute and ``chattr -a``, and nothing written."""
    log = agent.workspace / "log"
    log.mkdir()
    (log / "old.txt").write_text("old\n")
    if subprocess.run(["chattr", "+a", str(log)], capture_output=True).returncode != 0:
        pytest.skip("this filesystem keeps no attributes")
    try:
        refused = agent.run("fs.write", {"path": "log/old.txt", "content": "new"})
        listed = sorted(os.listdir(log))
    finally:
        subprocess.run(["chattr", "-a", str(log)], check=True)

    assert refused.error is not None and refused.error.errno == errno.EPERM, refused
    message = refused.output["message"]
    assert message.startswith("/workspace/log/old.txt: /workspace/log is append-only"), message
    assert "'chattr -a'" in message, message
    assert listed == ["old.txt"] and (log / "old.txt").read_text() == "old\n"


@pytest.mark.parametrize(
    ("tool", "request_", "code"),
    [
        ("fs.read", {"path": "a.txt/"}, errno.ENOTDIR),
        ("fs.read", {"path": "/workspace/a.txt/."}, errno.ENOTDIR),
        ("fs.read", {"path": "sub"}, errno.EISDIR),
        ("fs.read", {"path": "sub/"}, errno.EISDIR),
        ("fs.stat", {"path": "a.txt/"}, errno.ENOTDIR),
        ("fs.stat", {"path": "link-in/"}, errno.ELOOP),
        ("fs.write", {"path": "a.txt/", "content": "replaced"}, errno.ENOTDIR),
        ("fs.write", {"path": "fresh/", "content": "made"}, errno.EISDIR),
        ("fs.write", {"path": "sub/", "content": "made"}, errno.EISDIR),
    ],
)
def test_a_trailing_slash_names_a_directory_as_it_does_to_the_kernel(
    agent: World, tool: str, request_: dict[str, object], code: int
) -> None:
    """`cat a.txt/` is ENOTDIR; dropping the slash would read, replace or create a file."""
    refused, message = failure(agent, tool, request_)

    assert refused == code, message
    assert (agent.workspace / "a.txt").read_text() == "inside\n"
    assert not (agent.workspace / "fresh").exists()
    assert agent.run("fs.stat", {"path": "sub/"}).output["type"] == "directory"


def test_fs_read_refuses_a_socket_by_its_type_as_a_fifo_or_a_device(agent: World) -> None:
    """docs/tools.md: fs.read of a FIFO, a socket or a device is EINVAL, and ``sock/`` is
    ENOTDIR, where the kernel's open of a socket (ENXIO) would have answered for it."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(agent.workspace / "sock"))
    os.mkfifo(agent.workspace / "fifo")
    try:
        for path, code in (("sock", errno.EINVAL), ("sock/", errno.ENOTDIR),
                           ("fifo", errno.EINVAL)):  # fmt: skip
            refused, message = failure(agent, "fs.read", {"path": path})
            assert refused == code, (path, message)
    finally:
        listener.close()


def test_shell_exec_runs_as_the_agent_in_a_confined_directory(agent: World) -> None:
    here = agent.run("shell.exec", {"cmd": "pwd; id -u"})
    sub = agent.run("shell.exec", {"cmd": "cat b.txt; cat", "cwd": "sub", "stdin": "fed\n"})
    failing = agent.run("shell.exec", {"cmd": "echo nope >&2; exit 4"})
    as_json = agent.run("shell.exec", {"cmd": "echo '{\"n\": 1}'"})

    assert here.output == f"{agent.workspace}\n{agent.user.uid}\n"
    assert sub.output == "deeper\nfed\n"
    assert failing.exit_status == 4 and failing.error.message.endswith("nope")
    assert failing.stderr == "nope\n"
    assert as_json.output == {"n": 1}


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"cmd": "echo a\0b"}, "cmd must not contain NUL"),
        ({"cmd": "echo \ud800"}, "cmd holds '\\ud800' at character 5, a lone surrogate"),
        ({"cmd": "cat", "stdin": "x\udcff"}, "stdin holds '\\udcff' at character 1"),
    ],
)
def test_shell_exec_refuses_a_command_or_stdin_no_process_can_be_given(
    agent: World, given: dict[str, str], said: str
) -> None:
    """A NUL ends an argument in the kernel, and a lone surrogate is no text: a bad input
    (EINVAL, the tool's usage status 2), never a traceback of the tool."""
    refused = agent.run("shell.exec", given)
    assert refused.error is not None and refused.error.errno == errno.EINVAL, refused
    assert said in refused.error.message and refused.exit_status == 2, refused
    assert "Traceback" not in refused.stderr, refused.stderr


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    absolute=st.booleans(),
    parts=st.lists(
        st.sampled_from(["a.txt", "sub", "b.txt", "link-out", "dir-link", "..", ".", "", "x"]),
        min_size=1,
        max_size=6,
    ),
)
def test_no_path_whatsoever_reaches_outside(
    agent: World, monkeypatch: pytest.MonkeyPatch, absolute: bool, parts: list[str]
) -> None:
    """In-process fs.read over random paths: a refusal, or a file inside the mounts."""
    mounts = [[str(agent.workspace), "/workspace", "rw"]]
    monkeypatch.setenv("CTX_MOUNTS", json.dumps(mounts))
    monkeypatch.setenv("CTX_CWD", "/workspace")
    path = ("/workspace/" if absolute else "") + "/".join(parts)

    try:
        reply = fs_read.read({"path": path}, True)
    except (ToolFailure, OSError):
        return
    assert reply.data["content"] in ("inside\n", "deeper\n")
    assert ".." not in path.split("/")


def test_a_lone_surrogate_in_the_input_is_einval_and_the_call_is_still_recorded(
    agent: World,
) -> None:
    """JSON can spell "\\ud800"; no file name or text can hold it: EINVAL, no traceback, and
    exit 2 as for any other input that is wrong."""
    refused, message = failure(agent, "fs.stat", {"path": "\ud800"})

    assert refused == errno.EINVAL and "lone surrogate" in message, message
    assert "Traceback" not in message
    call, result = agent.events()[-2:]
    assert call["type"] == "tool_call" and call["input"] == {"path": "\ud800"}
    assert result["type"] == "tool_result" and result["status"] == "error"
    assert agent.run("fs.write", {"path": "x.txt", "content": "\ud800"}).exit_status == 2


def test_a_file_name_that_is_not_utf8_comes_back_to_a_tool_as_it_went_out(
    agent: World,
) -> None:
    """A listing names it with the surrogate escape of its bytes; that name reaches it."""
    odd = os.fsdecode(b"caf\xe9.txt")
    (agent.workspace / odd).write_text("latin-1\n")

    listing = agent.run("fs.list", {})
    (name,) = [e["name"] for e in listing.output["entries"] if e["name"].startswith("caf")]
    stat = agent.run("fs.stat", {"path": name})
    command = ["run", "--agent", "coder", "fs.list", "/workspace"]
    text = subprocess.run(
        [sys.executable, "-m", "cortexfs", "--storage", str(agent.root), *command],
        capture_output=True,
        check=True,
    )

    assert name == odd and stat.status == "ok" and stat.output["type"] == "file"
    assert b"caf\xe9.txt\n" in text.stdout.splitlines(keepends=True)


def test_fs_write_to_a_name_that_is_not_utf8_writes_it_and_says_so(agent: World) -> None:
    """The name fs.list gives a file whose name is not UTF-8 goes into fs.write too: the file
    is written and the call succeeds in both modes, its text telling the name in its bytes
    (a call that wrote the file must never report a failure)."""
    odd = os.fsdecode(b"caf\xe9.txt")

    native = agent.run("fs.write", {"path": odd, "content": "one\n"})
    command = ["run", "--agent", "coder", "fs.write", json.dumps({"path": odd, "content": "two"})]
    text = subprocess.run(
        [sys.executable, "-m", "cortexfs", "--storage", str(agent.root), *command],
        capture_output=True,
    )

    assert native.status == "ok" and native.output["path"].endswith(odd), native
    assert text.returncode == 0, text.stderr
    assert text.stdout == b"wrote 3 bytes to /workspace/caf\xe9.txt\n"
    assert (agent.workspace / odd).read_bytes() == b"two"


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ('{"path": "/tmp", "path": "/"}', "gives the name 'path' twice"),
        ('{"path": 1e999}', "1e999"),
    ],
)
def test_a_core_tool_reads_its_input_as_strictly_as_ctx_run(
    agent: World, given: str, reason: str
) -> None:
    """Called directly (a terminal's tsh passes argv), a core tool must not act on the value
    a reviewer of the logged input did not see first."""
    done = subprocess.run(
        [str(agent.root / "tool" / "fs.stat"), given], capture_output=True, text=True
    )

    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.startswith("fs.stat: EINVAL: ") and reason in done.stderr, done.stderr
