"""Where a session may live (SPEC S-1, X-2): a ``SessionRef`` of a uid that is no uid is
refused as it is made, and ``open_session`` refuses the manual bundle, so no directory is
ever made for either; a root is a path however ``os`` spells one."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from cortexfs.errors import CtxError
from cortexfs.names import MAX_ID
from cortexfs.shared.sessions import SessionRef, homes_with_sessions, open_session
from cortexfs.storage import DOCS_BUNDLE
from tests.tools.support import World


@pytest.mark.parametrize("uid", [1.5, 1.0, True, False, "1000", None, -1, MAX_ID + 1], ids=repr)
def test_a_uid_that_is_no_uid_is_refused_before_a_home_is_made(tmp_path: Path, uid: object) -> None:
    """S-1: ``home/<uid>/`` is named by an integer from 0 to MAX_ID; a float, a bool (an int
    to Python, ``home/True`` to a path) or a str would name a directory no user's home is."""
    # None is neither a uid nor a space: refused for that, as ever.
    expected = "either in a home" if uid is None else "is not a uid"

    with pytest.raises(CtxError) as refused:
        open_session(SessionRef.home(tmp_path, uid, "coder", "s"))  # type: ignore[arg-type]

    assert refused.value.errno == errno.EINVAL and expected in refused.value.message
    assert list(tmp_path.iterdir()) == []


def test_a_home_named_by_no_uid_is_passed_over_when_homes_are_listed(tmp_path: Path) -> None:
    """The homes holding an agent's sessions are found by looking (S-1): a directory under
    home/ whose name no uid has is not one of them, and does not end the listing."""
    (tmp_path / "home").mkdir()
    with open_session(SessionRef.home(tmp_path, 1000, "coder", "s")) as session:
        session.record("note", object="x", status="ok")
    for name in (str(MAX_ID + 1), "9" * 200):
        (tmp_path / "home" / name / "agent" / "coder" / "session").mkdir(parents=True)

    assert homes_with_sessions(tmp_path, "coder") == [1000]


def test_the_manual_bundle_is_no_space_for_a_session(world: World) -> None:
    """X-2: ``shared/cortexfs-docs`` is refused as ``ctx shared create`` refuses the name, and
    nothing is added to the bundle."""
    bundle = world.root / "shared" / DOCS_BUNDLE
    bundle.mkdir(exist_ok=True)  # as 'ctx bootstrap' installs it from a source tree
    before = sorted(os.listdir(bundle))

    with pytest.raises(CtxError) as refused:
        open_session(SessionRef.shared(world.root, DOCS_BUNDLE, "coder", "s"))

    assert refused.value.errno == errno.EINVAL
    assert DOCS_BUNDLE in refused.value.message and "manual bundle" in refused.value.message
    assert sorted(os.listdir(bundle)) == before


def test_a_root_given_as_a_str_is_a_path(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    ref = SessionRef.home(str(tmp_path), 0, "coder", "s")

    with open_session(ref) as session:
        session.record("note", object="x", status="ok")

    assert ref.root == tmp_path
    assert ref.events_path == tmp_path / "home/0/agent/coder/session/s/events.jsonl"
    assert ref.events_path.exists()
