"""A hostile client of ``ctx mount --as AGENT`` (SPEC §13 F-1 with T-5 and §5): a program of
the agent's own, unprivileged uid that has nothing but its FUSE view of ``/ctx`` — mounted
by root, answered by a root-owned daemon — and attacks that daemon.  It asks for kinds of
files and attributes the mount never makes (FIFOs, sockets, devices, links out of the view,
``security.*``/``trusted.*`` attributes, ``O_TMPFILE``, huge ``fallocate``/``truncate``), probes
for hidden objects by guessed names (every answer must be the one an absent name gets),
plays listing games, builds a tree deeper than ``PATH_MAX``, races truncates against reads,
writes through ``mmap``, and holds descriptors until the daemon runs out.  After each
attack: refusals are errnos, nothing root-owned or forbidden appears on the storage root,
the root operator still gets correct answers, and ``ctx umount`` unmounts (exit 0)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    MOUNT_WAIT,
    ROOT_ENTRIES,
    ctx_run,
    mounted_at,
    needs_fuse,
    needs_fuse_as_root,
    new_scratch_dir,
    scratch_top,
    serving,
    wait_for,
)
from tests.support.users import UnprivilegedUser, find_or_create_user

SCRATCH = scratch_top(__file__)
AGENT, OTHER = "coder", "other"
SPACE, HIDDEN = "team", "secret"
HIDDEN_SESSION = "s-hidden"  # another agent's session in the space, not granted to coder

pytestmark = [needs_fuse_as_root, needs_fuse]  # a mount serving other uids needs root

# ------------------------------------------------------------------------------ helpers


@dataclass
class World:
    """A storage root with spaces ``team`` (agent ``coder`` may read and write it) and
    ``secret`` (granted to agent ``other`` only), both of the test user's group; ``coder`` runs
    as the test user, whose home exists; agent ``other`` keeps a session in ``team`` that
    ``coder`` may not read; ``team/data/setuid-tool`` is root's, setuid and setgid, writable by
    the group.  ``top`` is searchable by every uid and holds the mount points."""

    top: Path
    storage: Path
    user: UnprivilegedUser

    @property
    def home(self) -> Path:
        return self.storage / "home" / str(self.user.uid)

    def mountpoint(self, name: str) -> Path:
        path = self.top / name
        path.mkdir(mode=0o755, exist_ok=True)
        return path


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    user = find_or_create_user()
    top = new_scratch_dir(SCRATCH)
    storage = top / "storage"
    shutil.copytree(_template, storage, symlinks=True)
    for space in (SPACE, HIDDEN):
        r = ctx_run("shared", "create", space, "--group", str(user.gid), "--storage", storage)
        assert r.rc == 0, r
    for name, owner, space in ((AGENT, user.name, SPACE), (OTHER, "nobody", HIDDEN)):
        req = {
            "name": name,
            "label": f"{name}_t",
            "tools": [],
            "shared": {space: ["read", "write"]},
        }
        r = ctx_run(
            "agent", "create", "--storage", storage, "--user", owner, "-", input=json.dumps(req)
        )
        assert r.rc == 0, r
    home = storage / "home" / str(user.uid)  # R-4, made by the host (docs/sessions.md)
    home.mkdir(mode=0o755)
    os.chown(home, user.uid, user.gid)
    session = storage / "shared" / SPACE / "agent" / OTHER / "session" / HIDDEN_SESSION
    session.mkdir(parents=True)
    (session / "events.jsonl").write_text('{"type":"note","agent":"other"}\n')
    (storage / "shared" / HIDDEN / "data" / "plans").write_text("not for coder\n")
    tool = storage / "shared" / SPACE / "data" / "setuid-tool"
    tool.write_text("#!/bin/sh\necho root's\n")
    os.chown(tool, 0, user.gid)
    tool.chmod(0o6775)
    try:
        yield World(top, storage, user)
    finally:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            where = line.split()[4]
            if where.startswith(str(top) + "/"):
                subprocess.run(["umount", "-l", where], check=False)
        shutil.rmtree(top, ignore_errors=True)


@contextlib.contextmanager
def mounted(world: World, where: Path, *args: str, nofile: int | None = None):
    """``ctx mount --storage ROOT ARGS WHERE`` for the block (``ctxcli.serving``), with a
    descriptor limit of ``nofile`` when given; the block is given the daemon's process."""
    with serving(world.storage, where, *args, nofile=nofile) as mount:
        yield mount.proc


def unmount_cleanly(proc: subprocess.Popen, where: Path) -> None:
    """``ctx umount WHERE`` answers 0 and the ``ctx mount`` process ends with 0: the daemon
    survived what came before and shuts down as documented."""
    assert proc.poll() is None, "the daemon died under the attack"
    r = ctx_run("umount", where, timeout=30)
    assert r.rc == 0, r
    assert proc.wait(timeout=MOUNT_WAIT) == 0
    assert not mounted_at(where)


def as_agent(user: UnprivilegedUser, script: str, *args) -> dict:
    """A Python ``script`` run as ``user`` with its own group only (the agent's identity); the
    JSON object it prints last."""
    done = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(script), *map(str, args)],
        user=user.uid, group=user.gid, extra_groups=[user.gid],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        env={"PATH": "/usr/bin:/bin", "LC_ALL": "C"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


# What every agent script starts with: the view, the agent's home in it, and ``code(f)``,
# which is "ok" or the errno name ``f()`` failed with.
PRELUDE = textwrap.dedent(
    """
    import ctypes, errno, json, os, sys
    view, uid = sys.argv[1], sys.argv[2]
    home = f"{view}/home/{uid}"
    libc = ctypes.CDLL(None, use_errno=True)

    def code(action):
        try:
            action()
        except OSError as e:
            return errno.errorcode.get(e.errno, str(e.errno))
        return "ok"

    def checked(result):
        if result == -1:
            number = ctypes.get_errno()
            raise OSError(number, os.strerror(number))
        return result
    """
)


def facts(top: Path) -> dict[str, tuple]:
    """Each entry under ``top`` (links not followed): type and mode, owner, size, mtime,
    extended attributes and content: what any write, chmod, chown, xattr or new file would
    change."""
    seen = {}
    for path in [top, *sorted(top.rglob("*"))]:
        st = path.lstat()
        content = path.read_bytes() if stat.S_ISREG(st.st_mode) else b""
        xattrs = tuple(sorted(os.listxattr(path, follow_symlinks=False)))
        seen[str(path.relative_to(top))] = (
            st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, xattrs, content,
        )  # fmt: skip
    return seen


def open_descriptors(pid: int) -> set[str]:
    """What process ``pid`` holds open, as its ``/proc/PID/fd`` links name it."""
    held = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            held.add(f"{fd} -> {os.readlink(f'/proc/{pid}/fd/{fd}')}")
    return held


def released_listings(pid: int, listed: str) -> set[str]:
    """What the daemon ``pid`` holds open once it holds no directory ending in ``listed``:
    it keeps a listing's directory until the kernel's release of it (docs/mount.md), which
    comes after ``listdir`` has returned."""
    assert wait_for(lambda: not any(fd.endswith(listed) for fd in open_descriptors(pid)), 3), (
        open_descriptors(pid)
    )
    return open_descriptors(pid)


# ------------------------------------------------------------------------ the tests

FORBIDDEN_KINDS = """
    open(f"{home}/mine", "w").write("the agent's\\n")
    out = {}
    out["mkfifo"] = code(lambda: os.mkfifo(f"{home}/fifo"))
    out["mknod_null"] = code(lambda: os.mknod(f"{home}/null", 0o666 | 0o020000, os.makedev(1, 3)))
    import socket
    out["bind"] = code(lambda: socket.socket(socket.AF_UNIX).bind(f"{home}/sock"))
    out["symlink_out"] = code(lambda: os.symlink("/etc/shadow", f"{home}/shadow"))
    out["symlink_hidden"] = code(
        lambda: os.symlink(f"{view}/shared/secret/data/plans", f"{view}/shared/team/data/p"))
    out["link_bin"] = code(lambda: os.link(f"{view}/bin/tsh", f"{home}/tsh"))
    out["link_hidden"] = code(lambda: os.link(f"{view}/shared/secret/data/plans", f"{home}/p"))
    out["link_into_session"] = code(
        lambda: os.link(f"{home}/mine", f"{view}/shared/team/agent/other/session/x"))
    cap = b"\\x01\\x00\\x00\\x02" + b"\\xff" * 16  # VFS_CAP_REVISION_2, every capability
    out["security.capability"] = code(
        lambda: os.setxattr(f"{home}/mine", "security.capability", cap))
    out["security.selinux"] = code(lambda: os.setxattr(f"{home}/mine", "security.selinux", b"x"))
    out["trusted"] = code(lambda: os.setxattr(f"{home}/mine", "trusted.overlay.opaque", b"y"))
    out["user"] = code(lambda: os.setxattr(f"{home}/mine", "user.note", b"z"))
    out["chown_root"] = code(lambda: os.chown(f"{home}/mine", 0, 0))
    out["chgrp_root"] = code(lambda: os.chown(f"{home}/mine", -1, 0))
    out["tmpfile"] = code(lambda: os.open(home, os.O_TMPFILE | os.O_RDWR, 0o600))
    fd = os.open(f"{home}/mine", os.O_RDWR)
    huge = ctypes.c_long(1 << 50)
    out["fallocate"] = code(lambda: checked(libc.fallocate(fd, 0, ctypes.c_long(0), huge)))
    out["ftruncate_2_62"] = code(lambda: os.ftruncate(fd, 1 << 62))
    out["truncate_2_62"] = code(lambda: os.truncate(f"{home}/mine", 1 << 62))
    out["size"] = os.fstat(fd).st_size
    os.close(fd)
    out["chmod_suid"] = code(lambda: os.chmod(f"{home}/mine", 0o4755))
    out["rename_over_policy"] = code(
        lambda: os.rename(f"{home}/mine", f"{view}/agent/coder.d/policy"))
    out["rename_over_hidden"] = code(
        lambda: os.rename(f"{home}/mine", f"{view}/shared/secret/data/plans"))
    out["rename_over_session"] = code(
        lambda: os.rename(f"{home}/mine", f"{view}/shared/team/agent/other/session/s-hidden"))
    out["rename_out_of_mount"] = code(lambda: os.rename(f"{home}/mine", sys.argv[3] + "/mine"))
    out["rename_root_entry"] = code(lambda: os.rename(f"{view}/home", f"{view}/home.old"))
    tool = f"{view}/shared/team/data/setuid-tool"
    with open(tool, "a") as f:
        f.write("id\\n")
    # Its own file-size limit binds it, not the daemon's (root's, unlimited).
    import resource, signal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    fd = os.open(f"{home}/capped", os.O_CREAT | os.O_WRONLY, 0o600)
    out["write_past_fsize"] = code(lambda: os.pwrite(fd, b"z" * 4096, 1 << 20))
    out["truncate_past_fsize"] = code(lambda: os.ftruncate(fd, 2 << 20))
    out["capped_size"] = os.fstat(fd).st_size
    os.close(fd)
    print(json.dumps(out))
"""


def test_links_devices_xattrs_tmpfiles_and_huge_sizes_never_become_a_root_owned_effect(
    world: World,
):
    """F-1, T-5, P-5 steps 1-3 and docs/mount.md (*Not provided*, *Ownership*): from its own
    uid the agent asks the root-run daemon for a FIFO, a socket, a device, symbolic links out
    of the view, hard links of root's files and of hidden ones, ``security.capability``,
    ``security.*``, ``trusted.*`` and ``user.*`` attributes, ``chown`` to root, ``O_TMPFILE``, a
    2^50-byte ``fallocate``, a 2^62-byte truncate, writes past its own ``RLIMIT_FSIZE`` (the
    root daemon's limit is not lent) and renames over controls and hidden names: each is
    the errno a local disk (or the docs) gives, and its write to a group-writable
    setuid file of root clears the setuid and setgid bits as a local write would.  Nothing
    else changes on the storage root, nothing there is root's that was not, and the daemon
    still serves root and unmounts cleanly."""
    user, storage = world.user, world.storage
    before = facts(storage)
    view = world.mountpoint("agent")
    elsewhere = new_scratch_dir(SCRATCH, "elsewhere-")
    os.chown(elsewhere, user.uid, user.gid)
    with mounted(world, view, "--as", AGENT) as proc:
        out = as_agent(user, FORBIDDEN_KINDS, view, user.uid, elsewhere)
        assert sorted(os.listdir(view)) == sorted(ROOT_ENTRIES)  # root's own look still works
        assert sorted(os.listdir(view / "home" / str(user.uid))) == ["capped", "mine"]
        unmount_cleanly(proc, view)
    shutil.rmtree(elsewhere)

    not_made = {"ENOSYS"}  # docs/mount.md: no symbolic links, no device nodes (FIFOs, sockets)
    assert out["mkfifo"] in not_made and out["bind"] in not_made, out
    assert out["symlink_out"] in not_made and out["symlink_hidden"] in not_made, out
    assert out["mknod_null"] == "EPERM", out  # a device needs CAP_MKNOD, which it has not
    assert out["link_bin"] in ("EPERM", "EACCES"), out  # root's file, in a read-only place
    assert out["link_hidden"] == "ENOENT", out
    assert out["link_into_session"] == "EACCES", out  # another agent's session/ takes nothing
    # Only what the caller itself may set gets as far as the daemon, which sets none.
    assert out["security.capability"] == "EPERM" and out["trusted"] == "EPERM", out
    assert out["security.selinux"] in ("EPERM", "ENOTSUP", "EOPNOTSUPP"), out
    assert out["user"] in ("ENOTSUP", "EOPNOTSUPP"), out  # no extended attributes
    assert (out["chown_root"], out["chgrp_root"]) == ("EPERM", "EPERM"), out
    assert out["chmod_suid"] == "ok", out  # its own file: as on a local disk
    assert out["tmpfile"] in ("ENOTSUP", "EOPNOTSUPP", "EISDIR", "EINVAL"), out
    assert out["fallocate"] in ("ENOTSUP", "EOPNOTSUPP", "EFBIG", "ENOSPC"), out
    assert (out["ftruncate_2_62"], out["truncate_2_62"]) == ("EFBIG", "EFBIG"), out
    assert out["size"] == len("the agent's\n"), out
    assert out["rename_over_policy"] == "EACCES", out
    assert out["rename_over_hidden"] == "ENOENT", out
    assert out["rename_over_session"] == "EACCES", out
    assert out["rename_out_of_mount"] == "EXDEV", out
    assert out["rename_root_entry"] in ("EACCES", "EPERM"), out
    assert (out["write_past_fsize"], out["truncate_past_fsize"]) == ("EFBIG", "EFBIG"), out
    assert out["capped_size"] == 0, out

    after = facts(storage)
    home = str(world.home.relative_to(storage))
    mine = after[f"{home}/mine"]
    assert (mine[1], mine[2]) == (user.uid, user.gid), "what it made is its own"
    assert stat.S_IMODE(mine[0]) == 0o4755 and mine[5] == () and mine[3] == len("the agent's\n")
    tool = after["shared/team/data/setuid-tool"]
    assert tool[1:3] == (0, user.gid), "the setuid file keeps its owner"
    assert stat.S_IMODE(tool[0]) == 0o775, "written by another uid: setuid and setgid cleared"
    assert tool[6].endswith(b"id\n")
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    expected = {home, f"{home}/mine", f"{home}/capped", "shared/team/data/setuid-tool"}
    assert changed == expected, changed
    assert after[f"{home}/capped"][1:4] == (user.uid, user.gid, 0)


PROBES = """
    out = {}
    open(f"{home}/mine", "w").write("x")
    pairs = json.loads(sys.argv[3])
    ops = {
        "stat": lambda p: os.stat(p),
        "lstat": lambda p: os.lstat(p),
        "open": lambda p: os.close(os.open(p, os.O_RDONLY)),
        "open_dir": lambda p: os.close(os.open(p, os.O_RDONLY | os.O_DIRECTORY)),
        "listdir": lambda p: os.listdir(p),
        "readlink": lambda p: os.readlink(p),
        "create": lambda p: os.close(os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)),
        "create_in": lambda p: os.close(os.open(p + "/n", os.O_CREAT | os.O_WRONLY, 0o600)),
        "mkdir": lambda p: os.mkdir(p),
        "rmdir": lambda p: os.rmdir(p),
        "unlink": lambda p: os.unlink(p),
        "chmod": lambda p: os.chmod(p, 0o777),
        "utime": lambda p: os.utime(p, (0, 0)),
        "truncate": lambda p: os.truncate(p, 0),
        "getxattr": lambda p: os.getxattr(p, "user.x"),
        "rename_to": lambda p: os.rename(f"{home}/mine", p),
        "rename_from": lambda p: os.rename(p, f"{home}/stolen"),
        "link_to": lambda p: os.link(f"{home}/mine", p),
        "link_from": lambda p: os.link(p, f"{home}/stolen"),
    }
    for hidden, absent in pairs:
        for op, action in ops.items():
            out[f"{op} {hidden}"] = [code(lambda: action(f"{view}/{hidden}")),
                                     code(lambda: action(f"{view}/{absent}"))]
    tricks = ["shared/secret/.", "shared/./secret/data", "shared/team/../secret/data/plans",
              f"home/{uid}/../../shared/secret/data/plans", "agent/coder.d/../other.d/policy",
              "shared//secret", "tool/shell.exec.d/./policy"]
    for trick in tricks:
        out[f"trick {trick}"] = code(lambda: os.stat(f"{view}/{trick}"))
    for n in (255, 256):
        out[f"long {n}"] = code(lambda: os.stat(f"{view}/shared/{'s' * n}"))
        out[f"long create {n}"] = code(lambda: open(f"{view}/shared/team/data/{'d' * n}", "w"))
    for raw in (b"secret\\xff", b"\\xff\\xfe", b"secre\\xc3\\x28t", b"team\\x80"):
        name = os.fsdecode(raw)
        out[f"raw {raw!r}"] = code(lambda: os.stat(f"{view}/shared/{name}"))
        out[f"raw agent {raw!r}"] = code(lambda: os.stat(f"{view}/agent/{name}.d/policy"))
    out["listing shared"] = sorted(os.listdir(f"{view}/shared"))
    out["listing agent"] = sorted(os.listdir(f"{view}/agent"))
    out["listing sessions"] = sorted(os.listdir(f"{view}/shared/team/agent/other/session"))
    os.unlink(f"{home}/mine")
    print(json.dumps(out))
"""


def test_guessed_names_of_hidden_objects_answer_exactly_as_absent_ones_and_leave_no_trace(
    world: World,
):
    """F-1 and T-5 (a name it may not see is ``ENOENT``; the view is computed in memory, no
    persistent file as a side effect) with S-6: for another agent's entry and controls,
    a space it is not granted, root's home, a tool it may not run and a session of another
    agent in its own space, twenty operations (stat, open, create, mkdir, rmdir, unlink,
    chmod, rename and link both ways, xattrs…) answer each hidden name exactly as they answer
    an absent name beside it — no errno tells one from the other; ``.``/``..`` chains, double
    slashes, 255/256-byte and non-UTF-8 names lead nowhere (ENOENT, ENAMETOOLONG); and the
    storage root is byte for byte what it was."""
    user, storage = world.user, world.storage
    pairs = [
        ("agent/other", "agent/nosuch"),
        ("agent/other.d", "agent/nosuch.d"),
        ("agent/other.d/policy", "agent/nosuch.d/policy"),
        ("shared/secret", "shared/nosuch"),
        ("shared/secret/data/plans", "shared/nosuch/data/plans"),
        ("home/0", "home/4242"),
        ("tool/shell.exec", "tool/nosuch"),
        ("tool/shell.exec.d/policy", "tool/nosuch.d/policy"),
        (
            f"shared/{SPACE}/agent/{OTHER}/session/{HIDDEN_SESSION}",
            f"shared/{SPACE}/agent/{OTHER}/session/nosuch",
        ),
        (
            f"shared/{SPACE}/agent/{OTHER}/session/{HIDDEN_SESSION}/events.jsonl",
            f"shared/{SPACE}/agent/{OTHER}/session/nosuch/events.jsonl",
        ),
    ]
    (storage / "home" / "0").mkdir(mode=0o755)
    before = facts(storage)
    view = world.mountpoint("agent")
    with mounted(world, view, "--as", AGENT) as proc:
        out = as_agent(user, PROBES, view, user.uid, json.dumps(pairs))
        # The operator, in the same view, is shown what the agent is shown.
        assert sorted(os.listdir(view / "shared")) == out["listing shared"]
        unmount_cleanly(proc, view)

    told_apart = {k: v for k, v in out.items() if k.split()[0] in OPS and v[0] != v[1]}
    assert told_apart == {}, told_apart
    stats = {k: v for k, v in out.items() if k.startswith("stat ")}
    assert all(v == ["ENOENT", "ENOENT"] for v in stats.values()), stats
    for key, answer in out.items():
        if key.startswith(("trick ", "raw ")):
            assert answer == "ENOENT", (key, out)
    # An overlong name where nothing may be seen is absent like any other (or too long).
    assert out["long 255"] == "ENOENT" and out["long 256"] in ("ENOENT", "ENAMETOOLONG"), out
    assert out["long create 256"] == "ENAMETOOLONG", out
    assert out["long create 255"] in ("ok", "EACCES"), out  # data/ of a space it may write
    assert HIDDEN not in out["listing shared"] and SPACE in out["listing shared"]
    assert out["listing agent"] == [AGENT, f"{AGENT}.d"], out
    assert out["listing sessions"] == [], out
    after = facts(storage)
    data = f"shared/{SPACE}/data"
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert changed <= {str(world.home.relative_to(storage)), data, f"{data}/{'d' * 255}"}, changed


OPS = {
    "stat", "lstat", "open", "open_dir", "listdir", "readlink", "create", "create_in",
    "mkdir", "rmdir", "unlink", "chmod", "utime", "truncate", "getxattr", "rename_to",
    "rename_from", "link_to", "link_from",
}  # fmt: skip


HOARD = """
    out = {"errors": []}
    held = []
    for i in range(int(sys.argv[3])):
        try:
            held.append(os.open(f"{home}/f{i:05d}", os.O_CREAT | os.O_RDWR, 0o600))
        except OSError as e:
            out["errors"].append(errno.errorcode[e.errno])
            if len(out["errors"]) == 3:
                break
    out["held"] = len(held)
    print(json.dumps(out), flush=True)
    os.kill(os.getpid(), 9)  # the descriptors are left to the kernel to release
"""


def test_descriptors_hoarded_to_the_daemons_limit_leave_no_root_file_and_no_leak(world: World):
    """F-1 and docs/mount.md (*Ownership*: what a caller creates is the caller's; *Memory*:
    the daemon holds what the kernel holds): the daemon started from an operator's shell with
    an ordinary descriptor limit, the agent creates and holds files in its home until the
    daemon has no descriptor left.  A refused create is refused (EMFILE/ENFILE), and leaves
    nothing — never a file of root's in the agent's home; once the agent is killed the
    daemon holds exactly what it held before, serves the operator, and unmounts cleanly."""
    user = world.user
    view = world.mountpoint("agent")
    with mounted(world, view, "--as", AGENT, nofile=128) as proc:
        os.listdir(view / "home" / str(user.uid))
        baseline = released_listings(proc.pid, f"/home/{user.uid}")
        done = subprocess.run(
            [sys.executable, "-c", PRELUDE + textwrap.dedent(HOARD), view, str(user.uid), "400"],
            user=user.uid, group=user.gid, extra_groups=[user.gid],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        out = json.loads(done.stdout.splitlines()[-1])
        assert out["errors"] and set(out["errors"]) <= {"EMFILE", "ENFILE"}, out
        # The kernel's releases of the killed agent's files reach the daemon.
        wait_for(lambda: open_descriptors(proc.pid) == baseline, seconds=3)
        assert sorted(os.listdir(view)) == sorted(ROOT_ENTRIES)
        assert len(os.listdir(view / "home" / str(user.uid))) >= out["held"]
        left = released_listings(proc.pid, f"/home/{user.uid}")
        unmount_cleanly(proc, view)
    owners = {(p.name, p.stat().st_uid) for p in world.home.iterdir()}
    foreign = sorted(name for name, uid in owners if uid != user.uid)
    assert foreign == [], f"files in the agent's home that are not the agent's: {foreign}"
    assert left == baseline, sorted(left - baseline)


GAMES = """
    import mmap, threading
    out = {}
    # A directory of 300 entries read with telldir/seekdir games: a position far past the
    # end, a position saved and gone back to, rewinddir.
    spool = f"{home}/spool"
    os.mkdir(spool)
    for i in range(300):
        os.close(os.open(f"{spool}/e{i:03d}", os.O_CREAT | os.O_WRONLY, 0o600))
    libc.opendir.restype = ctypes.c_void_p
    libc.readdir.restype = ctypes.c_void_p
    libc.readdir.argtypes = [ctypes.c_void_p]
    libc.telldir.restype = ctypes.c_long
    libc.telldir.argtypes = [ctypes.c_void_p]
    libc.seekdir.argtypes = [ctypes.c_void_p, ctypes.c_long]
    libc.rewinddir.argtypes = [ctypes.c_void_p]
    libc.closedir.argtypes = [ctypes.c_void_p]
    NAME_AT = 19  # offsetof(struct dirent, d_name) on Linux x86-64 and arm64
    def read_name(d):
        entry = libc.readdir(d)
        return None if not entry else ctypes.string_at(entry + NAME_AT).decode()
    d = libc.opendir(spool.encode())
    first = [read_name(d) for _ in range(50)]
    mark = libc.telldir(d)
    after_mark = read_name(d)
    libc.seekdir(d, (1 << 40) + 7)
    out["past_end"] = read_name(d)
    libc.seekdir(d, mark)
    out["back_to_mark"] = read_name(d) == after_mark
    rest = []
    while (name := read_name(d)) is not None:
        rest.append(name)
    libc.rewinddir(d)
    again = []
    while (name := read_name(d)) is not None:
        again.append(name)
    libc.closedir(d)
    seen = [n for n in first + [after_mark] + rest if n not in (".", "..")]
    out["once_each"] = sorted(seen) == [f"e{i:03d}" for i in range(300)]
    out["rewound"] = sorted(n for n in again if n not in (".", "..")) == sorted(seen)

    # A tree deeper than PATH_MAX, made one directory at a time relative to the last.
    fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY)
    depth = int(sys.argv[3])
    for i in range(depth):
        name = f"level-{i:04d}-" + "x" * 16
        os.mkdir(name, 0o700, dir_fd=fd)
        deeper = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    leaf = os.open("leaf", os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=fd)
    os.write(leaf, b"at the bottom\\n")
    os.fsync(leaf)
    os.close(leaf)
    os.close(fd)

    # One thread reads a file again and again while another truncates and regrows it.
    path = f"{home}/racing"
    with open(path, "wb") as f:
        f.write(b"r" * (1 << 20))
    errors, stop = [], threading.Event()
    def reader():
        while not stop.is_set():
            try:
                with open(path, "rb") as f:
                    data = f.read()
                if data.strip(b"r\\0"):
                    errors.append("foreign bytes")
            except OSError as e:
                errors.append(errno.errorcode[e.errno])
    thread = threading.Thread(target=reader)
    thread.start()
    fd = os.open(path, os.O_RDWR)
    for i in range(150):
        os.ftruncate(fd, (i * 7919) % (1 << 20))
        os.pwrite(fd, b"r" * 4096, (i * 104729) % (1 << 20))
    stop.set()
    thread.join()
    os.close(fd)
    out["race_errors"] = sorted(set(errors))

    # Shared mmap written, unmapped without msync, then fsync on the descriptor.
    path = f"{home}/mapped"
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 1 << 16)
    m = mmap.mmap(fd, 1 << 16, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    pattern = bytes(range(256)) * 256
    m[:] = pattern
    m.close()
    os.fsync(fd)
    os.close(fd)
    print(json.dumps(out))
"""

DEPTH = 180  # 180 levels of 27 bytes: a path of about 4 900 bytes below the home


def test_listing_games_a_tree_past_path_max_racing_truncates_and_mmap_leave_it_serving(
    world: World,
):
    """F-1 (durability once ``fsync`` returns) and docs/mount.md (*Listings*, *Names*,
    *Durability*): in its home the agent reads a listing with ``seekdir`` far past its end and
    back to a ``telldir`` mark and rewinds it (every entry exactly once), builds a tree deeper
    than ``PATH_MAX`` one directory at a time, races truncates and writes against a reader
    (never an error, never a byte it did not write), and writes through a shared ``mmap``
    unmapped without ``msync`` then fsynced.  The storage root holds the deep leaf and the
    mapped bytes as the agent's own, root walks and removes the deep tree through the
    host's view, and both daemons unmount cleanly."""
    user = world.user
    view, host = world.mountpoint("agent"), world.mountpoint("host")
    with mounted(world, view, "--as", AGENT) as proc:
        out = as_agent(user, GAMES, view, user.uid, DEPTH)
        assert sorted(os.listdir(view)) == sorted(ROOT_ENTRIES)
        assert proc.poll() is None
        # Durable on the storage root, as the agent's own, while the view is still mounted.
        assert (world.home / "mapped").read_bytes() == bytes(range(256)) * 256
        unmount_cleanly(proc, view)
    assert out["past_end"] is None and out["back_to_mark"], out
    assert out["once_each"] and out["rewound"], out
    assert out["race_errors"] == [], out

    fd = os.open(world.home, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(DEPTH):
            name = f"level-{i:04d}-" + "x" * 16
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (user.uid, 0o700)
            deeper = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = deeper
        leaf = os.open("leaf", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
        assert os.read(leaf, 100) == b"at the bottom\n" and os.fstat(leaf).st_uid == user.uid
        os.close(leaf)
    finally:
        os.close(fd)
    not_its_own = [
        name
        for _, dirs, files, top in os.fwalk(world.home)
        for name in dirs + files
        if os.stat(name, dir_fd=top, follow_symlinks=False).st_uid != user.uid
    ]
    assert not_its_own == []

    with mounted(world, host) as proc:
        gone = subprocess.run(
            ["rm", "-rf", str(host / "home" / str(user.uid) / ("level-0000-" + "x" * 16))],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert gone.returncode == 0, gone.stderr
        assert sorted(os.listdir(host / "home" / str(user.uid))) == [
            "mapped", "racing", "spool"
        ]  # fmt: skip
        unmount_cleanly(proc, host)
    assert sorted(p.name for p in world.home.iterdir()) == ["mapped", "racing", "spool"]
