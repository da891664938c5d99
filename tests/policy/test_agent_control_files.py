"""An agent's host-owned controls read together through one descriptor of its directory give
what reading each by its path gives: the same values, the same refusals (SPEC P-5, P-6)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from cortexfs.errors import CtxError
from cortexfs.policy import controls
from cortexfs.regular_file import MAX_CONTROL_BYTES
from tests.support.users import UnprivilegedUser

CASES = [
    "as made",
    "no label",
    "a linked policy",
    "a FIFO for the identity",
    "a mount table over its limit",
    "a linked control directory",
    "no control directory",
]


def _damage(root: Path, case: str) -> None:
    directory = root / "agent" / "coder.d"
    if case == "no label":
        (directory / "label").unlink()
    elif case == "a linked policy":
        (directory / "policy").rename(root / "policy")
        (directory / "policy").symlink_to(root / "policy")
    elif case == "a FIFO for the identity":
        (directory / "identity").unlink()
        os.mkfifo(directory / "identity")
    elif case == "a mount table over its limit":
        (directory / "mount").write_bytes(b" " * (MAX_CONTROL_BYTES + 1))
    elif case == "a linked control directory":
        directory.rename(root / "coder.d")
        directory.symlink_to(root / "coder.d")
    elif case == "no control directory":
        for control in directory.iterdir():
            control.unlink()
        directory.rmdir()


Read = Callable[[controls.AgentControlFiles | None], object]


def _outcome(read: Read, files: controls.AgentControlFiles | None) -> object:
    try:
        return read(files)
    except CtxError as exc:
        return (exc.errno, exc.message)


@pytest.mark.parametrize("case", CASES)
def test_controls_read_together_are_each_control_read_by_its_path(
    root: Path, coder: Path, user: UnprivilegedUser, case: str
) -> None:
    _damage(root, case)
    files = controls.AgentControlFiles(root, "coder")
    policy = controls.control_path("coder", "policy")
    reads: list[Read] = [
        lambda given: controls.read_identity(root, "coder", given),
        lambda given: controls.read_label(root, "coder", given),
        lambda given: list(controls.read_policy(root, policy, given)),
        lambda given: controls.read_mounts(root, "coder", given),
    ]
    for read in reads:
        alone = _outcome(read, None)
        assert _outcome(read, files) == alone
        assert _outcome(read, files) == alone  # a refusal is raised again each time asked
    if case == "as made":
        assert controls.read_label(root, "coder", files) == "coder_t"
