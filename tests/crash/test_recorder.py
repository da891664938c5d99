"""The recorder sees every change the protocol makes to a queue (docs/crash-model.md §1).

Each verb runs once under ``strace -f``; every system call that changed something under the
queue directory must be, in the same order, a micro-operation the recorder journalled.  Code
that bypasses :class:`cortexfs.durable.FsOps` shows up here, and in every recorded workload
(:meth:`tests.crash.recorder.Journal.verify_live` compares the journal with the real tree).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cortexfs.durable import MOVE_LINK, MOVE_RENAME
from cortexfs.queue import init_queue
from tests.crash.recorder import Journal, RecordingOps
from tests.support.strace import trace_lines

REPO = Path(__file__).resolve().parents[2]
MUTATING = (
    "open,openat,openat2,creat,mkdir,mkdirat,mknod,mknodat,rmdir,unlink,unlinkat,link,linkat,"
    "symlink,symlinkat,rename,renameat,renameat2,write,pwrite64,writev,pwritev,pwritev2,"
    "truncate,ftruncate,fallocate,fsync,fdatasync,syncfs,sync,sync_file_range,chmod,fchmod,"
    "fchmodat,chown,fchown,lchown,fchownat,utimensat,setxattr,lsetxattr,fsetxattr,"
    "removexattr,lremovexattr,fremovexattr"
)
LINE = re.compile(r"^(?:\[pid\s+\d+\]\s+|\d+\s+)?(\w+)\((.*)\)\s+=\s+(-?\d+)")
ARGUMENT = re.compile(r'\s*("(?:[^"\\]|\\.)*"(?:\.\.\.)?|\{[^}]*\}|[^,]+)')
FD = re.compile(r"^(?:-?\d+|AT_FDCWD)<(.*)>$")

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")


def arguments(text: str) -> list[str]:
    return [a.strip() for a in ARGUMENT.findall(text)]


def unquote(token: str) -> str:
    return token.removesuffix("...").strip('"')


class Trace:
    """strace output turned into the recorder's vocabulary, cut at the verb marks."""

    def __init__(self, output: str, queue: Path, marks: Path) -> None:
        self.queue, self.marks = str(queue), str(marks)
        self.verbs: list[tuple[str, list[list[str | int]]]] = []
        for line in output.splitlines():
            self.feed(line)

    def inside(self, path: str | None) -> str | None:
        if path is None or not (path == self.queue or path.startswith(self.queue + "/")):
            return None
        return path[len(self.queue) :].lstrip("/")

    def at(self, dir_token: str, name_token: str) -> str | None:
        name = unquote(name_token)
        fd = FD.match(dir_token)
        if name.startswith("/"):
            return self.inside(name)
        return self.inside(f"{fd.group(1)}/{name}" if fd else name)

    def fd_path(self, token: str) -> str | None:
        fd = FD.match(token)
        return self.inside(fd.group(1)) if fd else None

    def feed(self, line: str) -> None:
        match = LINE.match(line)
        if match is None or int(match.group(3)) < 0:
            return  # a failed call changed nothing (or a line strace split)
        name, args = match.group(1), arguments(match.group(2))
        if name == "write" and FD.match(args[0]) and FD.match(args[0]).group(1) == self.marks:
            self.verbs.append((unquote(args[1]).replace("\\n", ""), []))
            return
        event = self.event(name, args, int(match.group(3)))
        if event is not None and self.verbs:
            calls = self.verbs[-1][1]
            if event[0] == "write" and calls and calls[-1][:2] == event[:2]:
                calls[-1][2] += event[2]  # one write() of ours may take several syscalls
            else:
                calls.append(event)

    def event(self, name: str, args: list[str], result: int) -> list[str | int] | None:
        if name in ("openat", "openat2") and "O_CREAT" in args[2]:
            path = self.at(args[0], args[1])
            return None if path is None else ["create", path]
        if name in ("open", "creat") and (name == "creat" or "O_CREAT" in args[1]):
            return self.touched("create", self.inside(unquote(args[0])))
        if name == "mkdirat":
            return self.touched("mkdir", self.at(args[0], args[1]))
        if name == "unlinkat":
            kind = "rmdir" if "AT_REMOVEDIR" in args[2] else "unlink"
            return self.touched(kind, self.at(args[0], args[1]))
        if name in ("renameat", "renameat2", "linkat"):
            src, dst = self.at(args[0], args[1]), self.at(args[2], args[3])
            if src is None and dst is None:
                return None
            return ["link" if name == "linkat" else "rename", src or "?", dst or "?"]
        if name in ("write", "pwrite64", "writev", "pwritev", "pwritev2"):
            path = self.fd_path(args[0])
            return None if path is None else ["write", path, result]
        if name in ("fsync", "fdatasync", "syncfs", "ftruncate", "fallocate", "fchmod"):
            path = self.fd_path(args[0])
            kind = {"fdatasync": "fsync", "ftruncate": "truncate"}.get(name, name)
            return None if path is None else ([kind] if kind == "syncfs" else [kind, path])
        paths = [p for p in (self.inside(unquote(a)) for a in args) if p is not None]
        return [name, *paths] if paths else None  # anything else that named the queue

    @staticmethod
    def touched(kind: str, path: str | None) -> list[str | int] | None:
        return None if path is None else [kind, path]


def trace_verbs(
    tmp_path: Path, strategy: str, *extra: str, group_writable: bool = False
) -> tuple[list, list]:
    queue = tmp_path / "queue"
    init_queue(queue)
    if group_writable:
        queue.chmod(0o2770)  # as in a shared space: what the protocol creates gets fchmod'ed
    out, log = tmp_path / "recorded.json", tmp_path / "strace.txt"
    target = [sys.executable, "-m", "tests.crash.strace_target", str(queue), str(out), strategy]
    strace = ["strace", "-f", "-y", "-qq", "-s", "256", "-e", f"trace={MUTATING}", "-o", str(log)]
    subprocess.run(
        [*strace, *target, *extra],
        cwd=REPO,
        check=True,
        timeout=120,
        umask=0o022 if group_writable else -1,  # a umask that takes the group's write bit
    )
    traced = Trace(
        "\n".join(trace_lines(log)), queue.resolve(), out.with_suffix(".marks").resolve()
    )
    return traced.verbs, [(name, calls) for name, calls in json.loads(out.read_text())]


@pytest.mark.parametrize("strategy", [MOVE_RENAME, MOVE_LINK])
def test_every_system_call_that_changed_the_queue_was_recorded(tmp_path, strategy):
    traced, recorded = trace_verbs(tmp_path, strategy)
    assert [name for name, _ in traced] == [name for name, _ in recorded]
    for (verb, seen), (_, journalled) in zip(traced, recorded, strict=True):
        assert seen, f"strace saw nothing of {verb}: the comparison would prove nothing"
        assert seen == journalled, f"{verb}: strace and the recorder disagree"


def test_the_group_access_given_in_a_shared_queue_is_recorded(tmp_path):
    traced, recorded = trace_verbs(tmp_path, MOVE_RENAME, group_writable=True)
    assert any(call[0] == "fchmod" for _, seen in traced for call in seen)
    assert traced == [(name, calls) for name, calls in recorded]


def test_a_change_that_bypasses_fsops_is_caught(tmp_path):
    traced, recorded = trace_verbs(tmp_path, MOVE_RENAME, "--bypass")
    (_, seen), (_, journalled) = traced[0], recorded[0]
    assert ["create", "inbox/behind-the-back"] in seen
    assert ["create", "inbox/behind-the-back"] not in journalled


def test_the_journal_notices_changes_behind_its_back(tmp_path):
    init_queue(tmp_path / "queue")
    journal = Journal(tmp_path / "queue")
    journal.begin()
    ops = RecordingOps(journal, "test")
    fd = ops.open_dir(str(tmp_path / "queue"))
    ops.mkdir("seen", fd)
    journal.verify_live()
    os.mkdir(tmp_path / "queue" / "unseen")
    with pytest.raises(AssertionError, match="unseen"):
        journal.verify_live()
    ops.close(fd)
