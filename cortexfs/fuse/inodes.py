"""Which names lead to each inode the kernel holds, for :class:`~cortexfs.fuse.mount.StorageFS`.

The kernel names a file by inode number once it has looked it up, and keeps that number across
a rename: after ``mv t1 t2`` it asks for the inode it knew as ``t1``, never looking ``t2`` up.
The daemon reaches a file only by a path below the storage root (see ``StorageFS._parent``), so
every change of a name made through the mount is applied here at once — the name itself and,
for a directory, every name beneath it.  An inode may have several names (hard links: the
queue's no-replace move makes a second name before it removes the first); the most recently
seen one is used, and removing one name leaves the others.

A name leads to one inode only: seeing it lead to another (the file was replaced outside the
mount) takes it from the first.  Names changed outside the mount are found again at the next
lookup, as before; until then an operation on the old name fails with ``ENOENT``.
"""

from __future__ import annotations

from collections.abc import Iterator

Parts = tuple[str, ...]


class InodeNames:
    """Inode number → the names (paths below the root, as parts) known to lead to it."""

    def __init__(self, root_inode: int) -> None:
        self._names: dict[int, list[Parts]] = {root_inode: [()]}
        self._inode_of: dict[Parts, int] = {(): root_inode}

    def path(self, inode: int) -> Parts:
        """The most recently seen name of ``inode``; KeyError when it has none."""
        return self._names[inode][-1]

    def remember(self, inode: int, parts: Parts) -> None:
        """``parts`` leads to ``inode`` (a lookup, a create, a link said so)."""
        previous = self._inode_of.get(parts)
        if previous is not None:
            self._drop(previous, parts)
        names = self._names.setdefault(inode, [])
        names.append(parts)
        self._inode_of[parts] = inode

    def removed(self, parts: Parts) -> None:
        """``parts`` and everything beneath it no longer exist (unlink, rmdir, replaced)."""
        for name in list(self._beneath(parts)):
            self._drop(self._inode_of[name], name)

    def moved(self, old: Parts, new: Parts) -> None:
        """``old`` was renamed to ``new``, replacing what ``new`` was: the names beneath move
        with it.  (A rename between two names of one file changes nothing: not for this.)"""
        if old == new:
            return
        self.removed(new)
        self._rename_beneath({old: new})

    def exchanged(self, first: Parts, second: Parts) -> None:
        """``first`` and ``second`` swapped places (``RENAME_EXCHANGE``)."""
        self._rename_beneath({first: second, second: first})

    def _rename_beneath(self, prefixes: dict[Parts, Parts]) -> None:
        changes = [
            (name, self._inode_of[name], prefixes[prefix] + name[len(prefix) :])
            for prefix in prefixes
            for name in self._beneath(prefix)
        ]
        # Every old name goes before any new one is added: in a swap, one's new name is the
        # other's old one.
        for name, inode, _ in changes:
            del self._inode_of[name]
            self._names[inode].remove(name)
        for _, inode, renamed in changes:
            self._names[inode].append(renamed)
            self._inode_of[renamed] = inode

    def _beneath(self, prefix: Parts) -> Iterator[Parts]:
        size = len(prefix)
        return (name for name in list(self._inode_of) if name[:size] == prefix)

    def _drop(self, inode: int, parts: Parts) -> None:
        self._inode_of.pop(parts, None)
        names = self._names.get(inode)
        if names is None:
            return
        if parts in names:
            names.remove(parts)
        if not names:
            del self._names[inode]  # the kernel may still hold it: ESTALE, not another file
