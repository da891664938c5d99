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
lookup, as before; until then an operation on the inode by its old name fails with ``ESTALE``
(or ``ENOENT`` when nothing has the name), since the mount checks that the name still leads
to the inode before it acts (``StorageFS._still``).

The kernel counts the entries it was given for an inode (each lookup, create, mkdir, link and
``readdirplus`` entry adds one) and gives them back with ``forget`` when it evicts the inode.
An inode whose count drops to zero is forgotten here too, names and all: a mount that serves a
queue of a hundred thousand jobs for weeks holds what the kernel holds, not every name it ever
answered.  Names are indexed by their parent as well, so renaming or removing a directory costs
what lies beneath it, not every name known.
"""

from __future__ import annotations

Parts = tuple[str, ...]


class InodeNames:
    """Inode number → the names (paths below the root, as parts) known to lead to it, and how
    many entries for it the kernel holds."""

    def __init__(self, root_inode: int) -> None:
        self._root_inode = root_inode
        self._names: dict[int, list[Parts]] = {root_inode: [()]}
        self._inode_of: dict[Parts, int] = {(): root_inode}
        self._children: dict[Parts, set[str]] = {}
        self._lookups: dict[int, int] = {}

    def __len__(self) -> int:
        """How many inodes have a name here (the root included)."""
        return len(self._names)

    def path(self, inode: int) -> Parts:
        """The most recently seen name of ``inode``; KeyError when it has none."""
        return self._names[inode][-1]

    def remember(self, inode: int, parts: Parts) -> None:
        """``parts`` leads to ``inode`` (a lookup, a create, a link said so), and the kernel
        was given one more entry for ``inode``."""
        previous = self._inode_of.get(parts)
        if previous != inode:
            if previous is not None:
                self._unname(parts)
            self._name(inode, parts)
        elif parts != self._names[inode][-1]:  # seen again: it is the most recent name now
            self._names[inode].remove(parts)
            self._names[inode].append(parts)
        if inode != self._root_inode:
            self._lookups[inode] = self._lookups.get(inode, 0) + 1

    def forget(self, inode: int, count: int) -> None:
        """The kernel gave back ``count`` of its entries for ``inode``; at none, the inode is
        forgotten with every name it had (its children are the kernel's to forget)."""
        if inode == self._root_inode:
            return
        left = self._lookups.get(inode, 0) - count
        if left > 0:
            self._lookups[inode] = left
            return
        self._lookups.pop(inode, None)
        for parts in list(self._names.get(inode, ())):
            self._unname(parts)

    def removed(self, parts: Parts) -> None:
        """``parts`` and everything beneath it no longer exist (unlink, rmdir, replaced)."""
        for name in self._beneath(parts):
            self._unname(name)

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
        for name, _, _ in changes:
            self._unname(name)
        for _, inode, renamed in changes:
            self._name(inode, renamed)

    def _beneath(self, prefix: Parts) -> list[Parts]:
        """``prefix`` (when it is a known name) and every known name below it."""
        found = [prefix] if prefix in self._inode_of else []
        directories = [prefix]
        while directories:
            directory = directories.pop()
            for child in self._children.get(directory, ()):
                name = (*directory, child)
                found.append(name)
                directories.append(name)
        return found

    def _name(self, inode: int, parts: Parts) -> None:
        self._inode_of[parts] = inode
        self._names.setdefault(inode, []).append(parts)
        if parts:
            self._children.setdefault(parts[:-1], set()).add(parts[-1])

    def _unname(self, parts: Parts) -> None:
        inode = self._inode_of.pop(parts)
        names = self._names[inode]
        names.remove(parts)
        if not names:
            del self._names[inode]  # the kernel may still hold it: ESTALE, not another file
        siblings = self._children.get(parts[:-1])
        if siblings is not None:
            siblings.discard(parts[-1])
            if not siblings:
                del self._children[parts[:-1]]
