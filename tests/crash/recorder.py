"""Record what the protocol does to a queue directory, one micro-operation per system call.

:class:`RecordingOps` is the :class:`cortexfs.durable.FsOps` the harness hands to the real
protocol code: every call still happens on the real directory, and on success it is appended
to a :class:`Journal` with the directories and files it touched named by node id.  The journal
keeps a *live* image — the directory as the process sees it — by applying each operation as
it is recorded; :meth:`Journal.verify_live` compares that image with the real tree, so code
that changes the queue without going through ``FsOps`` is caught by every recorded run (and,
call by call, by the strace comparison in ``test_recorder.py``).

Operations on descriptors outside the journal's root are performed but not recorded.
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import traceback
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from cortexfs import durable
from tests.crash.fsimage import DIR, Image, snapshot
from tests.crash.microops import (
    Ack,
    Chmod,
    Create,
    Executed,
    Fsync,
    Link,
    MakeDir,
    Op,
    Record,
    RemoveDir,
    Rename,
    Step,
    SyncFs,
    Truncate,
    Unlink,
    Write,
    apply,
)

_PACKAGE_DIR = str(Path(durable.__file__).parent) + os.sep
_DURABLE = durable.__file__
_JOB_COMPONENT = re.compile(r"[^/]*\.req\.json(?=/|$|\.result$)")
_TEMP_COMPONENT = re.compile(r"[^/]*\.tmp(?=/|$)")


class Mutant(Protocol):
    """A deliberate defect injected at one call site (see :mod:`tests.crash.mutants`)."""

    def disables(self, site: str) -> bool: ...


class Journal:
    """The durable starting image of a directory, then everything done to it, in order."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.records: list[Record] = []
        self.start = 0
        self.recording = False
        self.lock = threading.RLock()
        self.on_step: Callable[[str, str], None] | None = None
        self.mutant: Mutant | None = None
        self.sites: Counter[str] = Counter()
        self.watch_sites = False
        self._ids = itertools.count(1)
        self.base = Image()
        self.live = Image()
        self._fds: dict[int, int] = {}

    # ------------------------------------------------------------------ recording

    def begin(self) -> None:
        """Take the current tree as the last durable state and start recording."""
        with self.lock:
            self.base = snapshot(self.root, self.new_id)
            self.live = self.base.copy()
            self.start = len(self.records)
            self.recording = True

    def new_id(self) -> int:
        return next(self._ids)

    def record(self, actor: str, op: Op) -> None:
        with self.lock:
            self.records.append(Record(actor, op))
            apply(self.live, op)

    def ack(self, actor: str, what: str, job: str, detail: object = None) -> None:
        self.record(actor, Ack(what, job, detail))

    def executed(self, actor: str, job: str) -> None:
        self.record(actor, Executed(job))

    # ------------------------------------------------------------------ descriptors

    def remember(self, fd: int, node: int | None) -> None:
        with self.lock:
            if node is None:
                self._fds.pop(fd, None)
            else:
                self._fds[fd] = node

    def node_of(self, fd: int) -> int | None:
        return self._fds.get(fd) if self.recording else None

    def resolve(self, name: str, dir_fd: int | None) -> int | None:
        """The node ``name`` refers to (relative to ``dir_fd``, or absolute), if it is ours."""
        if dir_fd is None:
            path = Path(name).resolve()
            if not path.is_relative_to(self.root):
                return None
            return self.live.resolve(str(path.relative_to(self.root)))
        parent = self.node_of(dir_fd)
        return None if parent is None else self.live.lookup(parent, name)

    # ------------------------------------------------------------------ call sites

    def site(self, kind: str, node: int, name: str = "") -> str | None:
        """Name the call site of a sync (on ``node``) or guard (``name`` in ``node``), when
        mutation testing asks for it."""
        if not (self.watch_sites or self.mutant):
            return None
        frames = [f for f in traceback.extract_stack() if f.filename.startswith(_PACKAGE_DIR)]
        # The site is the protocol line that asked for it: the innermost frame outside
        # durable.py, then the primitives it went through (callers further out are not
        # part of the site: claim() and claim_job() reach the same line).
        callers = [i for i, f in enumerate(frames) if not f.filename.startswith(_DURABLE)]
        frames = frames[callers[-1] :] if callers else frames
        chain = " > ".join(f"{Path(f.filename).stem}.{f.name}:{f.lineno}" for f in frames)
        label = f"{kind} {self.generic_path(node, name)} @ {chain}"
        if self.watch_sites:
            self.sites[label] += 1
        return label

    def disabled(self, site: str | None) -> bool:
        return site is not None and self.mutant is not None and self.mutant.disables(site)

    def generic_path(self, node: int, name: str = "") -> str:
        """``claimed/J/J``-style path of a node (or of ``name`` in it): job names as J, temp
        names as TMP."""
        path = self.live.path_of(node)
        if path is None:
            return "(unnamed)"
        if self.live.nodes[node].kind == DIR:
            path += "/"
        return _TEMP_COMPONENT.sub("TMP", _JOB_COMPONENT.sub("J", path + name))

    # ------------------------------------------------------------------ checks

    def verify_live(self) -> None:
        """AssertionError unless the real tree is exactly what the journal says it is."""
        with self.lock:
            real = snapshot(self.root, itertools.count(10**9).__next__).canonical()
            seen = self.live.canonical()
        if real != seen:
            missing = sorted(e[0] for e in seen - real)
            unexpected = sorted(e[0] for e in real - seen)
            raise AssertionError(
                "the queue changed behind the recorder's back (a mutation that bypassed "
                f"FsOps): recorded but not on disk {missing}, on disk but not recorded "
                f"{unexpected}"
            )


class RecordingOps(durable.FsOps):
    """The real system calls, each one journalled on success."""

    def __init__(self, journal: Journal, actor: str, move_strategy: str | None = None) -> None:
        super().__init__(move_strategy)
        self.journal = journal
        self.actor = actor

    def step(self, name: str) -> None:
        self.journal.record(self.actor, Step(name))
        if self.journal.on_step is not None:
            self.journal.on_step(self.actor, name)

    # Opening and closing hold the journal's lock around the system call too: the kernel
    # hands a closed descriptor's number to the next open of any thread, so a close whose
    # bookkeeping came after another thread's open of the same number would drop that
    # thread's descriptor, and its moves would go unrecorded.
    def open_dir(self, name: str, dir_fd: int | None = None) -> int:
        with self.journal.lock:
            fd = super().open_dir(name, dir_fd)
            self.journal.remember(fd, self.journal.resolve(name, dir_fd))
        return fd

    def close(self, fd: int) -> None:
        with self.journal.lock:
            super().close(fd)
            self.journal.remember(fd, None)

    def create_file(self, name: str, dir_fd: int, mode: int = 0o666) -> int:
        journal = self.journal
        with journal.lock:
            fd = super().create_file(name, dir_fd, mode)
            parent = journal.node_of(dir_fd)
            if parent is not None:
                node = journal.new_id()
                journal.record(self.actor, Create(parent, name, node))
                journal.remember(fd, node)
        return fd

    def open_append(
        self, name: str, dir_fd: int, mode: int = 0o666, *, create: bool | None = None
    ) -> int:
        journal = self.journal
        with journal.lock:
            existing = journal.resolve(name, dir_fd)
            fd = super().open_append(name, dir_fd, mode, create=create)
            parent = journal.node_of(dir_fd)
            if parent is not None and existing is None:
                existing = journal.new_id()
                journal.record(self.actor, Create(parent, name, existing))
            journal.remember(fd, existing)
        return fd

    def write(self, fd: int, data: bytes) -> None:
        journal = self.journal
        with journal.lock:
            super().write(fd, data)
            node = journal.node_of(fd)
            if node is not None:
                end = os.lseek(fd, 0, os.SEEK_CUR)
                journal.record(self.actor, Write(node, end - len(data), bytes(data)))

    def truncate(self, fd: int, size: int) -> None:
        journal = self.journal
        with journal.lock:
            super().truncate(fd, size)
            node = journal.node_of(fd)
            if node is not None:
                journal.record(self.actor, Truncate(node, size))

    def fchmod(self, fd: int, mode: int) -> None:
        journal = self.journal
        with journal.lock:
            super().fchmod(fd, mode)
            node = journal.node_of(fd)
            if node is not None:
                journal.record(self.actor, Chmod(node, mode))

    def fsync(self, fd: int) -> None:
        journal = self.journal
        with journal.lock:
            node = journal.node_of(fd)
            site = None if node is None else journal.site("fsync", node)
            if journal.disabled(site):
                return
            super().fsync(fd)
            if node is not None:
                directory = journal.live.nodes[node].kind == DIR
                journal.record(self.actor, Fsync(node, directory))

    def syncfs(self, fd: int) -> None:
        journal = self.journal
        with journal.lock:
            node = journal.node_of(fd)
            site = None if node is None else journal.site("syncfs", node)
            if journal.disabled(site):
                return
            super().syncfs(fd)
            if node is not None:
                journal.record(self.actor, SyncFs())

    def mkdir(self, name: str, dir_fd: int, mode: int = 0o777) -> None:
        journal = self.journal
        with journal.lock:
            parent = journal.node_of(dir_fd)
            site = None if parent is None else journal.site("mkdir", parent, name)
            if journal.disabled(site) and journal.live.lookup(parent, name) is not None:
                return  # mutant: the arbitration guard is gone, an existing directory "wins"
            super().mkdir(name, dir_fd, mode)
            if parent is not None:
                journal.record(self.actor, MakeDir(parent, name, journal.new_id()))

    def rmdir(self, name: str, dir_fd: int) -> None:
        journal = self.journal
        with journal.lock:
            node = journal.resolve(name, dir_fd)
            super().rmdir(name, dir_fd)
            parent = journal.node_of(dir_fd)
            if parent is not None and node is not None:
                journal.record(self.actor, RemoveDir(parent, name, node))

    def unlink(self, name: str, dir_fd: int) -> None:
        journal = self.journal
        with journal.lock:
            node = journal.resolve(name, dir_fd)
            super().unlink(name, dir_fd)
            parent = journal.node_of(dir_fd)
            if parent is not None and node is not None:
                journal.record(self.actor, Unlink(parent, name, node))

    def link(self, src: str, src_dir_fd: int, dst: str, dst_dir_fd: int) -> None:
        journal = self.journal
        with journal.lock:
            node = journal.resolve(src, src_dir_fd)
            parent = journal.node_of(dst_dir_fd)
            site = None if parent is None else journal.site("link", parent, dst)
            if journal.disabled(site) and journal.live.lookup(parent, dst) is not None:
                self.unlink(dst, dst_dir_fd)  # mutant: link that replaces what it meets
            super().link(src, src_dir_fd, dst, dst_dir_fd)
            src_parent = journal.node_of(src_dir_fd)
            if None not in (node, parent, src_parent):
                journal.record(self.actor, Link(src_parent, src, parent, dst, node))

    def rename(self, src: str, src_dir_fd: int, dst: str, dst_dir_fd: int) -> None:
        journal = self.journal
        with journal.lock:
            node = journal.resolve(src, src_dir_fd)
            replaced = journal.resolve(dst, dst_dir_fd)
            super().rename(src, src_dir_fd, dst, dst_dir_fd)
            self._record_rename(src, src_dir_fd, dst, dst_dir_fd, node, replaced)

    def rename_noreplace(self, src: str, src_dir_fd: int, dst: str, dst_dir_fd: int) -> None:
        journal = self.journal
        with journal.lock:
            parent = journal.node_of(dst_dir_fd)
            site = None if parent is None else journal.site("rename_noreplace", parent, dst)
            if journal.disabled(site):
                self.rename(src, src_dir_fd, dst, dst_dir_fd)  # mutant: replaces what it meets
                return
            node = journal.resolve(src, src_dir_fd)
            super().rename_noreplace(src, src_dir_fd, dst, dst_dir_fd)
            self._record_rename(src, src_dir_fd, dst, dst_dir_fd, node, None)

    def _record_rename(
        self,
        src: str,
        src_dir_fd: int,
        dst: str,
        dst_dir_fd: int,
        node: int | None,
        replaced: int | None,
    ) -> None:
        src_parent = self.journal.node_of(src_dir_fd)
        parent = self.journal.node_of(dst_dir_fd)
        if None not in (node, parent, src_parent):
            op = Rename(src_parent, src, parent, dst, node, replaced)  # type: ignore[arg-type]
            self.journal.record(self.actor, op)
