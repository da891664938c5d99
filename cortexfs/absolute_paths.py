"""A relative path made absolute the way the kernel reads it, once and for good.

A command keeps the storage root it was given for its whole life (a worker, a terminal, the
``ctxterm`` a bootstrap writes) and prints it in the commands it suggests.  ``Path.absolute``
keeps a ``..`` as it is, so ``../st`` given in ``/tmp/a/start`` stays ``/tmp/a/start/../st``,
which names nothing once that directory is removed; ``os.path.abspath`` drops the ``..`` by
text, which names another directory than the kernel's when a symbolic link comes before it
(``lnk/../st`` with ``lnk`` a link to ``real/sub`` is ``real/st`` to the kernel).  Here each
``..`` is taken as the kernel takes it, after the links before it, and every other link is
kept as given: a root reached through ``storage/current`` stays named so.
"""

from __future__ import annotations

import os


def absolute(path: str | os.PathLike[str]) -> str:
    """``path`` made absolute against the current directory, with no ``..`` left: the part up
    to its last ``..`` resolved (links followed, as the kernel follows them before a ``..``),
    the rest as given.  FileNotFoundError when ``path`` is relative and the current directory
    was removed."""
    text = os.fspath(path)
    joined = text if os.path.isabs(text) else os.path.join(os.getcwd(), text)
    parts = joined.split("/")
    if ".." not in parts:
        return os.path.normpath(joined)
    last = len(parts) - 1 - parts[::-1].index("..")
    resolved = os.path.realpath("/".join(parts[: last + 1]))
    return os.path.normpath(os.path.join(resolved, *parts[last + 1 :]))
