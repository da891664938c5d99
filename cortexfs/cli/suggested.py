"""The ``'ctx …'`` commands a message suggests, made to act on the storage root the command
that says them was given with ``--storage``.

Without it, a suggestion copied into a shell that has no $CTX_STORAGE (which ``--storage``
stood in for) would act on the default root.  Kept apart from click: ``ctx run`` starts
without it (:mod:`cortexfs.cli`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from cortexfs import absolute_paths
from cortexfs.printable import shell_word

SUGGESTED_COMMAND = re.compile(r"'ctx ([a-z][^']*)'")


def absolute(path: str | os.PathLike[str]) -> str:
    """``path`` made absolute for a suggestion, as given when it cannot be (relative, from a
    current directory that was removed: the command's own error says so)."""
    try:
        return absolute_paths.absolute(path)
    except OSError:
        return os.fspath(path)


def naming_the_root(
    text: str, root: str, place: Callable[[list[str]], int | None] = lambda words: 0
) -> str:
    """``text`` with ``--storage ROOT`` in every ``'ctx …'`` suggestion that names no root and
    is not a ``--help``, before the word ``place(words)`` gives (the words after ``ctx``):
    by default before them all, where ``ctx --storage ROOT …`` takes it for every command;
    nowhere when it gives None (a command that works on no storage root)."""
    option = ["--storage", shell_word(root)]

    def named(suggested: re.Match[str]) -> str:
        words = suggested[1].split(" ")
        if "--storage" in words or "--help" in words:
            return suggested[0]
        at = place(words)
        if at is None:
            return suggested[0]
        return "'ctx " + " ".join([*words[:at], *option, *words[at:]]) + "'"

    return SUGGESTED_COMMAND.sub(named, text)
