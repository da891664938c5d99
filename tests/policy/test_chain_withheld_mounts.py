"""Two mounts of one name in an agent's table (SPEC P-5, docs/tools.md): a mount is named in
policy by its target's last component, so no rule could grant one of them, and both are
withheld — given to no tool, and no way for the chain to see an object.  A denial says so, as
``ctx agent show`` does, and never blames the agent's policy for a rule it holds."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from cortexfs.policy import AuthorityRequest, Decision, Step, check_authority, controls
from tests.support.storage import write

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to set owners and uids")


def shared_name(name: str) -> str:
    """What ``ctx agent show`` says of each of two mounts named ``name``."""
    return (
        f"2 mounts are named {name!r} (the last component of their targets): a rule "
        f"'mount:{name}' could not say which it grants, so none of them is used"
    )


def ask(root: Path, object_ref: str, permission: str) -> Decision:
    object_class, _, name = object_ref.partition(":")
    return check_authority(AuthorityRequest(root, "coder", object_class, name, permission))


def grant(controls_dir: Path, *rules: str) -> None:
    write(controls_dir / "policy", "".join(f"allow coder_t {rule}\n" for rule in rules))


def mount(controls_dir: Path, *triples: list[str]) -> None:
    write(controls_dir / "mount", json.dumps(list(triples)))


@pytest.fixture
def space(root: Path) -> Path:
    """``shared/sp``, which every uid may read and write: only the mounts decide."""
    space = root / "shared" / "sp"
    space.mkdir(mode=0o777)
    space.chmod(0o777)
    return space


def test_two_mounts_of_one_name_are_withheld_and_used_by_no_step(
    root: Path, coder: Path, space: Path
) -> None:
    mount(
        coder, [str(space), "/a/sp", "ro"], [str(space), "/b/sp", "ro"], [str(root), "/ctx", "ro"]
    )
    assert [str(m.target) for m in controls.read_mounts(root, "coder")] == ["/ctx"]
    assert [(str(m.target), why) for m, why in controls.withheld_mounts(root, "coder")] == [
        ("/a/sp", shared_name("sp")),
        ("/b/sp", shared_name("sp")),
    ]


def test_a_space_seen_only_through_two_mounts_of_one_name_is_refused_saying_so_once(
    root: Path, coder: Path, space: Path
) -> None:
    """Its policy grants the space and ``mount:sp read``: the mounts, not the policy, are at
    fault, and their one reason is given once."""
    mount(coder, [str(space), "/a/sp", "ro"], [str(space), "/b/sp", "ro"])
    grant(coder, "shared:sp read", "mount:sp read")
    decision = ask(root, "shared:sp", "read")
    assert (decision.step, decision.errno) == (Step.VISIBILITY, errno.EACCES), decision.reason
    assert decision.reason == (
        "step 3 (mount visibility): shared/sp is under none of the mounts of agent 'coder': "
        + shared_name("sp")
    )


def test_a_write_two_mounts_of_one_target_would_carry_does_not_blame_the_policy(
    root: Path, coder: Path, space: Path
) -> None:
    """``[S, /sp, rw]`` and ``[S, /sp, ro]``, the policy granting ``mount:sp write``: the
    write is refused as read-only in the agent's view of ``/ctx`` (its policy does not let it
    read the space), and the read-write mount is named withheld, not lacking a rule."""
    mount(coder, [str(space), "/sp", "rw"], [str(space), "/sp", "ro"], [str(root), "/ctx", "ro"])
    grant(coder, "mount:ctx read", "shared:sp write", "mount:sp read", "mount:sp write")
    decision = ask(root, "shared:sp", "write")
    assert (decision.step, decision.errno) == (Step.VISIBILITY, errno.EACCES), decision.reason
    assert decision.reason == (
        "step 3 (mount visibility): shared/sp is visible to the agent only read-only: a space "
        "is writable in its view only when its policy allows both 'shared:sp read' and "
        f"'shared:sp write'; {shared_name('sp')}"
    )
    grant(coder, "mount:ctx read", "shared:sp read", "shared:sp write")
    assert ask(root, "shared:sp", "write").allowed  # through the agent's view of /ctx


def test_a_mount_request_for_a_shared_name_is_refused_as_withheld(
    root: Path, coder: Path, traversable_tmp: Path
) -> None:
    """As for any withheld mount (docs/tools.md): step 2, "its mount … is withheld" and why."""
    sources = [traversable_tmp / "d1", traversable_tmp / "d2"]
    for source in sources:
        source.mkdir(mode=0o755)
    mount(coder, [str(sources[0]), "/a/data", "ro"], [str(sources[1]), "/b/data", "ro"])
    grant(coder, "mount:data read")
    decision = ask(root, "mount:data", "read")
    assert (decision.step, decision.errno) == (Step.MODE_BITS, errno.EACCES), decision.reason
    assert decision.reason == (
        f"step 2 (mode bits): its mount 'data' is withheld: {shared_name('data')}"
    )
    mount(coder, [str(sources[0]), "/a/data", "ro"], [str(sources[1]), "/b/other", "ro"])
    assert ask(root, "mount:data", "read").allowed
