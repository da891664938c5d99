"""A directory made immutable or append-only (chattr) refuses what its mode allows, to root
too: a command stopped by one names the attribute and the chattr that removes it, never a mode
to change (EPERM, not EACCES).  Needs root."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from cortexfs.errors import CtxError
from cortexfs.storage import require_writable
from tests.support.cli import ctx
from tests.support.storage import attribute

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (chattr)")


def test_a_space_refused_by_an_immutable_shared_directory_names_the_attribute(
    tmp_path: Path,
) -> None:
    root = tmp_path / "storage"
    root.mkdir()
    assert ctx(root, "bootstrap").returncode == 0
    shared = root / "shared"

    with attribute(shared, "i"):
        made = ctx(root, "shared", "create", "proj")

    assert made.returncode != 0
    assert made.stderr.startswith(
        f"ctx: EPERM: cannot create shared space proj: {shared} is immutable (attribute 'i', "
    ), made.stderr
    assert f"have root remove it with 'chattr -i {shared}'" in made.stderr
    assert "chmod" not in made.stderr
    assert not (shared / "proj").exists()


def test_bootstrap_of_an_immutable_root_names_the_attribute(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    root.mkdir()

    with attribute(root, "i"):
        made = ctx(root, "bootstrap")
        with pytest.raises(CtxError) as refused:
            require_writable(root, "do it")

    assert made.returncode != 0
    assert f"{root} is immutable (attribute 'i'" in made.stderr, made.stderr
    assert f"'chattr -i {root}'" in made.stderr and "chmod" not in made.stderr
    assert list(root.iterdir()) == []
    assert refused.value.errno == errno.EPERM
