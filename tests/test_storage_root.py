"""Where the storage root is (SPEC R-1) and what ``ctx bootstrap`` says when it cannot be made."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from cortexfs.queue.claim_order import hint_path
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


@pytest.mark.parametrize("cache_home", ["", "relative", "./here"])
def test_the_claim_order_hint_never_lands_in_the_current_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cache_home: str
) -> None:
    """A relative XDG_CACHE_HOME is ignored, as a relative XDG_DATA_HOME is: the hint is this
    user's cache file, not one made wherever ctx was started."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", cache_home)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    hint = hint_path(tmp_path / "queue")

    assert hint.is_absolute(), hint
    if os.geteuid() == 0:
        assert hint.is_relative_to("/var/cache/cortexfs"), hint
    else:
        assert hint.is_relative_to(tmp_path / "home" / ".cache" / "cortexfs"), hint


def test_an_absolute_xdg_cache_home_holds_the_hint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    assert hint_path(tmp_path / "queue").is_relative_to(tmp_path / "cache" / "cortexfs")
