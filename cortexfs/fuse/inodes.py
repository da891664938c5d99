"""Which file and which names each node the kernel holds stands for, for
:class:`~cortexfs.fuse.mount.StorageFS`.

The kernel names a file by its node id once it has looked it up, and keeps that id across a
rename: after ``mv t1 t2`` it asks for the node it knew as ``t1``, never looking ``t2`` up.
A node id is the storage inode number of its file, so that ``stat`` through the mount shows
the number the file has on disk.  But a number is reused: remove a directory and make
another, and ext4 gives the new one the old one's number, while the kernel may still hold the
old directory's node (a process's working directory, a descriptor, a lookup not yet given
back).  Had the new directory the same node id, the kernel would take it for the old one, and
a file made in the removed directory would land in the new one.  So each node is kept with the
identity of its file (:mod:`cortexfs.fuse.identity`: the filesystem's file handle, which
changes when a number is reused), and a file whose number is still held by a node of another
file gets a node id of its own (above :data:`ALIASES`) until the kernel gives the old node back.
An operation on the old node is then ``ENOENT`` or ``ESTALE``, never one on the new file.
Where the filesystem gives no handles, a file removed through the mount is the only reuse
that can be told: the number is then known to stand for another file when it is seen again.

The daemon reaches a file only by a path below the storage root (see ``StorageFS._parent``),
so every change of a name made through the mount is applied here at once — the name itself
and, for a directory, every name beneath it.  A node may have several names (hard links: the
queue's no-replace move makes a second name before it removes the first); the most recently
seen one is used, and removing one name leaves the others.

A name leads to one node only: seeing it lead to another (the file was replaced outside the
mount) takes it from the first.  Names changed outside the mount are found again at the next
lookup, as before; until then an operation on the node by its old name fails with ``ESTALE``
(or ``ENOENT`` when nothing has the name), since the mount checks that the name still leads
to the node's file before it acts (``StorageFS._still``).

The kernel counts the entries it was given for a node (each lookup, create, mkdir, link and
``readdirplus`` entry adds one) and gives them back with ``forget`` when it evicts the node.
A node whose count drops to zero is forgotten here too, names and all: a mount that serves a
queue of a hundred thousand jobs for weeks holds what the kernel holds, not every name it ever
answered.  Names are indexed by their parent as well, so renaming or removing a directory costs
what lies beneath it, not every name known.
"""

from __future__ import annotations

from cortexfs.fuse.identity import Identity

Parts = tuple[str, ...]
File = tuple[int, Identity | None]  # storage inode number, identity

# Node ids given to a file whose inode number is held by another file's node: far above any
# inode number a local filesystem gives (ext4's are 32-bit; xfs and btrfs stay well below).
ALIASES = 1 << 62


class InodeNames:
    """Node id → the file it stands for and the names (paths below the root, as parts) known
    to lead to it, and how many entries for it the kernel holds."""

    def __init__(self, root_node: int) -> None:
        self._root_node = root_node
        self._names: dict[int, list[Parts]] = {root_node: [()]}
        self._node_of: dict[Parts, int] = {(): root_node}
        self._children: dict[Parts, set[str]] = {}
        self._lookups: dict[int, int] = {}
        self._files: dict[int, File] = {}
        self._node_for: dict[File, int] = {}
        self._gone: set[int] = set()  # removed through the mount (used where no identity)
        self._next_alias = ALIASES

    def __len__(self) -> int:
        """How many nodes have a name here (the root included)."""
        return len(self._names)

    def path(self, node: int) -> Parts:
        """The most recently seen name of ``node``; KeyError when it has none."""
        return self._names[node][-1]

    def node_at(self, parts: Parts) -> int | None:
        """The node ``parts`` is known to lead to (None when it is not known)."""
        return self._node_of.get(parts)

    def file(self, node: int) -> File | None:
        """The storage inode number and identity of the file ``node`` stands for (None for
        the root, and for a node given back)."""
        return self._files.get(node)

    def node_for(self, inode: int, identity: Identity | None) -> int:
        """The node id the kernel knows, or is to be given, the file ``(inode, identity)`` by:
        its inode number, unless a node of another file still holds that number."""
        node = self._node_for.get((inode, identity))
        if node is not None and not (identity is None and node in self._gone):
            return node
        if inode not in self._files and inode != self._root_node:
            return inode
        self._next_alias += 1
        return self._next_alias - 1

    def remember(
        self, node: int, parts: Parts, inode: int | None = None, identity: Identity | None = None
    ) -> None:
        """``parts`` leads to ``node`` — the file ``(inode, identity)``, got from
        :meth:`node_for` — (a lookup, a create, a link said so), and the kernel was given
        one more entry for ``node``."""
        if node != self._root_node and node not in self._files:
            file = (node if inode is None else inode, identity)
            self._files[node] = file
            self._node_for[file] = node
        previous = self._node_of.get(parts)
        if previous != node:
            if previous is not None:
                self._unname(parts)
            self._name(node, parts)
        elif parts != self._names[node][-1]:  # seen again: it is the most recent name now
            self._names[node].remove(parts)
            self._names[node].append(parts)
        if node != self._root_node:
            self._lookups[node] = self._lookups.get(node, 0) + 1

    def forget(self, node: int, count: int) -> None:
        """The kernel gave back ``count`` of its entries for ``node``; at none, the node is
        forgotten with every name it had (its children are the kernel's to forget), and its
        inode number may stand for another file again."""
        if node == self._root_node:
            return
        left = self._lookups.get(node, 0) - count
        if left > 0:
            self._lookups[node] = left
            return
        self._lookups.pop(node, None)
        for parts in list(self._names.get(node, ())):
            self._unname(parts)
        file = self._files.pop(node, None)
        if file is not None and self._node_for.get(file) == node:
            del self._node_for[file]
        self._gone.discard(node)

    def removed(self, parts: Parts, *, last_name: bool = False) -> None:
        """``parts`` and everything beneath it no longer exist (unlink, rmdir, replaced);
        ``last_name``: its file is gone with it, and its inode number free for another."""
        node = self._node_of.get(parts)
        if last_name and node is not None and node != self._root_node:
            self._gone.add(node)
        for name in self._beneath(parts):
            self._unname(name)

    def moved(self, old: Parts, new: Parts, *, replaced_last_name: bool = False) -> None:
        """``old`` was renamed to ``new``, replacing what ``new`` was (``replaced_last_name``:
        and that file is gone): the names beneath move with it.  (A rename between two names
        of one file changes nothing: not for this.)"""
        if old == new:
            return
        self.removed(new, last_name=replaced_last_name)
        self._rename_beneath({old: new})

    def exchanged(self, first: Parts, second: Parts) -> None:
        """``first`` and ``second`` swapped places (``RENAME_EXCHANGE``)."""
        self._rename_beneath({first: second, second: first})

    def _rename_beneath(self, prefixes: dict[Parts, Parts]) -> None:
        changes = [
            (name, self._node_of[name], prefixes[prefix] + name[len(prefix) :])
            for prefix in prefixes
            for name in self._beneath(prefix)
        ]
        # Every old name goes before any new one is added: in a swap, one's new name is the
        # other's old one.
        for name, _, _ in changes:
            self._unname(name)
        for _, node, renamed in changes:
            self._name(node, renamed)

    def _beneath(self, prefix: Parts) -> list[Parts]:
        """``prefix`` (when it is a known name) and every known name below it."""
        found = [prefix] if prefix in self._node_of else []
        directories = [prefix]
        while directories:
            directory = directories.pop()
            for child in self._children.get(directory, ()):
                name = (*directory, child)
                found.append(name)
                directories.append(name)
        return found

    def _name(self, node: int, parts: Parts) -> None:
        self._node_of[parts] = node
        self._names.setdefault(node, []).append(parts)
        if parts:
            self._children.setdefault(parts[:-1], set()).add(parts[-1])

    def _unname(self, parts: Parts) -> None:
        node = self._node_of.pop(parts)
        names = self._names[node]
        names.remove(parts)
        if not names:
            del self._names[node]  # the kernel may still hold it: ESTALE, not another file
        siblings = self._children.get(parts[:-1])
        if siblings is not None:
            siblings.discard(parts[-1])
            if not siblings:
                del self._children[parts[:-1]]
