"""An abstract image of a directory tree: what the crash model reasons about.

Nodes are files and directories identified by a number that outlives renames and is never
reused (real inode numbers are reused as soon as a file is deleted, which would make two
different files look like one).  A file may have several names (hard links): the link
strategy of :func:`cortexfs.durable.move_noreplace` relies on exactly that.  Nodes that no
name reaches are kept — a crash model may write to a file whose name never reached the disk —
but they are invisible: comparison, digests and materialisation only see what is reachable
from the root.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

FILE = "file"
DIR = "dir"


@dataclass
class Node:
    kind: str
    data: bytes = b""
    entries: dict[str, int] = field(default_factory=dict)


# One reachable entry as compared between images: (path, kind, data, first path of the same
# node) — the last field tells hard links apart; directories have no data and no first path.
Entry = tuple[str, str, bytes, str]


class Image:
    """Nodes by id; node ``root`` is the top directory."""

    def __init__(self, root: int = 0) -> None:
        self.root = root
        self.nodes: dict[int, Node] = {root: Node(DIR)}

    def copy(self) -> Image:
        clone = Image(self.root)
        clone.nodes = {
            ident: Node(n.kind, n.data, dict(n.entries)) for ident, n in self.nodes.items()
        }
        return clone

    def file(self, ident: int) -> Node:
        """The file ``ident``, created empty (and unnamed) when the image has not seen it."""
        return self.nodes.setdefault(ident, Node(FILE))

    def directory(self, ident: int) -> Node:
        return self.nodes.setdefault(ident, Node(DIR))

    def lookup(self, parent: int, name: str) -> int | None:
        node = self.nodes.get(parent)
        return node.entries.get(name) if node is not None else None

    def resolve(self, relative: str) -> int | None:
        """The node at a path relative to the root ("" is the root itself)."""
        ident: int | None = self.root
        for part in Path(relative).parts:
            if ident is None:
                return None
            ident = self.lookup(ident, part)
        return ident

    def walk(self) -> Iterator[tuple[str, int]]:
        """Every reachable (path, node) below the root, depth first, names in sorted order."""

        def below(prefix: str, ident: int, seen: frozenset[int]) -> Iterator[tuple[str, int]]:
            for name, child in sorted(self.nodes[ident].entries.items()):
                path = f"{prefix}{name}"
                yield path, child
                node = self.nodes.get(child)
                if node is not None and node.kind == DIR and child not in seen:
                    yield from below(path + "/", child, seen | {child})

        yield from below("", self.root, frozenset({self.root}))

    def path_of(self, ident: int) -> str | None:
        if ident == self.root:
            return ""
        return next((path for path, node in self.walk() if node == ident), None)

    def canonical(self) -> frozenset[Entry]:
        """The reachable tree as a value: equal for images a reader cannot tell apart."""
        first_path: dict[int, str] = {}
        entries: set[Entry] = set()
        for path, ident in self.walk():
            node = self.nodes.get(ident)
            if node is None:
                continue
            if node.kind == DIR:
                entries.add((path, DIR, b"", ""))
            else:
                entries.add((path, FILE, node.data, first_path.setdefault(ident, path)))
        return frozenset(entries)


def snapshot(top: Path, new_id: Callable[[], int]) -> Image:
    """Read a real directory tree into an image; hard links become one node."""
    image = Image(new_id())
    by_inode: dict[tuple[int, int], int] = {}

    def read_dir(path: Path, ident: int) -> None:
        for entry in sorted(os.scandir(path), key=lambda e: e.name):
            st = entry.stat(follow_symlinks=False)
            key = (st.st_dev, st.st_ino)
            if stat.S_ISDIR(st.st_mode):
                child = new_id()
                image.nodes[child] = Node(DIR)
                read_dir(Path(entry.path), child)
            elif stat.S_ISREG(st.st_mode):
                if key not in by_inode:
                    by_inode[key] = new_id()
                    image.nodes[by_inode[key]] = Node(FILE, Path(entry.path).read_bytes())
                child = by_inode[key]
            else:
                raise ValueError(f"{entry.path}: the crash model knows files and directories only")
            image.nodes[ident].entries[entry.name] = child

    read_dir(top, image.root)
    return image


def materialise(image: Image, top: Path) -> None:
    """Create the reachable part of ``image`` under the empty directory ``top``."""
    placed: dict[int, Path] = {}
    for path, ident in image.walk():
        node = image.nodes[ident]
        target = top / path
        if node.kind == DIR:
            target.mkdir()
        elif ident in placed:
            os.link(placed[ident], target)
        else:
            target.write_bytes(node.data)
            placed[ident] = target
