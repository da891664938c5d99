"""Where the storage root is (SPEC R-1) and what ``ctx bootstrap`` says when it cannot be made."""

from __future__ import annotations

import pwd
from pathlib import Path

import pytest

from cortexfs.storage import SYSTEM_DEFAULT_ROOT, default_root

TAIL = Path("cortexfs/storage/current")


def test_root_s_default_is_the_system_root() -> None:
    assert default_root(0, {"HOME": "/home/x", "XDG_DATA_HOME": "/d"}) == SYSTEM_DEFAULT_ROOT


def test_an_absolute_xdg_data_home_holds_the_root() -> None:
    assert default_root(4242, {"HOME": "/home/x", "XDG_DATA_HOME": "/data"}) == "/data" / TAIL


@pytest.mark.parametrize("data_home", ["", "relative", "./here", "~/data"])
def test_a_relative_or_empty_xdg_data_home_is_ignored(data_home: str) -> None:
    """The XDG base directory specification: a relative path there is invalid and ignored."""
    found = default_root(4242, {"HOME": "/home/x", "XDG_DATA_HOME": data_home})

    assert found == Path("/home/x/.local/share") / TAIL


@pytest.mark.parametrize("home", [None, "", "relative"])
def test_without_an_absolute_home_the_password_database_names_it(home: str | None) -> None:
    environ = {} if home is None else {"HOME": home}

    found = default_root(4242, environ)

    assert found.is_absolute(), found
    try:
        expected = Path(pwd.getpwuid(4242).pw_dir) / ".local/share" / TAIL
    except KeyError:
        expected = Path("/.local/share") / TAIL
    assert found == expected
