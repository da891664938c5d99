"""``cached``: an attribute computed on first use and kept on its instance.

``functools.cached_property`` does the same, but in Python 3.11 each one holds a lock shared
by every instance of its class (3.12 dropped it): calls of the runner on different agents in
threads of one process wait for each other there, and a child forked while another thread
held it waits forever on its first call.  Two threads that compute the value at once each
compute it, and the last one kept wins: every value cached here is a pure function of its
instance's state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")


class cached(Generic[T]):
    def __init__(self, compute: Callable[[Any], T]) -> None:
        self.compute = compute
        self.__doc__ = compute.__doc__
        self.name = compute.__name__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> cached[T]: ...
    @overload
    def __get__(self, instance: object, owner: type | None = None) -> T: ...
    def __get__(self, instance: object | None, owner: type | None = None) -> T | cached[T]:
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.compute(instance)
        return value
