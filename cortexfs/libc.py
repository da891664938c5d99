"""The C library, for the system calls ``os`` lacks on Python 3.11 (renameat2, syncfs,
fstatfs, unshare, setns, prctl).

Loaded through the interpreter's own symbols, since ``find_library("c")`` runs ldconfig, and on
first use, since ctypes costs each start of ctx a few milliseconds that most commands never
need.
"""

from __future__ import annotations

import functools
import os
from typing import Any


@functools.cache
def libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


@functools.cache
def prctl() -> Any:
    """``prctl(2)`` with its five arguments typed (option, then four unsigned longs): a
    pointer is passed as its address."""
    import ctypes

    function = libc().prctl
    function.argtypes = [ctypes.c_int, *[ctypes.c_ulong] * 4]
    function.restype = ctypes.c_int
    return function


def check(result: int, what: str) -> None:
    """Raise the C library's errno as :class:`OSError` when ``result`` is not 0."""
    if result != 0:
        import ctypes

        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), what)
