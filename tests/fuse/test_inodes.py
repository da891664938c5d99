"""The daemon's record of which names lead to the inodes the kernel holds (no mount needed)."""

from __future__ import annotations

import pytest

from cortexfs.fuse.inodes import InodeNames

ROOT = 1


@pytest.fixture
def names() -> InodeNames:
    names = InodeNames(ROOT)
    names.remember(10, ("d",))
    names.remember(11, ("d", "sub"))
    names.remember(12, ("d", "sub", "f"))
    names.remember(13, ("other",))
    return names


def test_an_inode_is_forgotten_only_when_the_kernel_gives_back_every_entry(
    names: InodeNames,
) -> None:
    names.remember(13, ("other",))  # looked up twice: the kernel holds two entries

    names.forget(13, 1)
    assert names.path(13) == ("other",)
    names.forget(13, 1)
    with pytest.raises(KeyError):
        names.path(13)
    assert len(names) == 4  # the root and d, d/sub, d/sub/f


def test_forgetting_a_hard_linked_inode_drops_every_name(names: InodeNames) -> None:
    names.remember(12, ("other-name",))
    names.forget(12, 2)

    with pytest.raises(KeyError):
        names.path(12)
    names.remember(12, ("d", "sub", "f"))  # found again by a later lookup
    assert names.path(12) == ("d", "sub", "f")


def test_the_root_is_never_forgotten(names: InodeNames) -> None:
    names.forget(ROOT, 100)
    assert names.path(ROOT) == ()


def test_a_renamed_directory_carries_its_names_and_leaves_the_rest(names: InodeNames) -> None:
    names.moved(("d",), ("e",))

    assert names.path(12) == ("e", "sub", "f")
    assert names.path(11) == ("e", "sub")
    assert names.path(13) == ("other",)
    names.removed(("e", "sub"))
    for gone in (11, 12):
        with pytest.raises(KeyError):
            names.path(gone)
    assert names.path(10) == ("e",)


def test_a_forgotten_directory_name_is_found_again_with_what_is_beneath(
    names: InodeNames,
) -> None:
    for inode in (12, 11, 10):  # the kernel forgets children before their directory
        names.forget(inode, 1)
    assert len(names) == 2

    names.remember(10, ("d",))
    names.remember(11, ("d", "sub"))
    names.moved(("d",), ("e",))
    assert names.path(11) == ("e", "sub")


def test_a_name_seen_leading_to_another_inode_leaves_the_first(names: InodeNames) -> None:
    names.remember(20, ("other",))  # replaced outside the mount

    assert names.path(20) == ("other",)
    with pytest.raises(KeyError):
        names.path(13)
    names.forget(13, 1)  # the kernel gives the old one back: nothing of 20 is touched
    assert names.path(20) == ("other",)


def test_exchanged_directories_swap_what_lies_beneath(names: InodeNames) -> None:
    names.remember(14, ("other", "g"))
    names.exchanged(("d",), ("other",))

    assert names.path(12) == ("other", "sub", "f")
    assert names.path(14) == ("d", "g")
    assert names.path(10) == ("other",)
    assert names.path(13) == ("d",)


def test_a_number_held_for_a_removed_file_gives_another_file_a_node_of_its_own() -> None:
    """The kernel still holds node 13 (file ``a``); the filesystem gives 13 to file ``b``."""
    names = InodeNames(ROOT)
    assert names.node_for(13, b"a") == 13
    names.remember(13, ("old",), 13, b"a")
    names.removed(("old",), last_name=True)

    node = names.node_for(13, b"b")
    assert node != 13
    names.remember(node, ("new",), 13, b"b")
    assert names.node_for(13, b"b") == node  # found again by the same node
    assert (names.path(node), names.file(node), names.file(13)) == (
        ("new",),
        (13, b"b"),
        (13, b"a"),
    )
    names.forget(13, 1)  # the kernel gives the old node back: the number is free again
    assert names.node_for(13, b"c") == 13
    assert names.path(node) == ("new",)


def test_without_identities_a_number_removed_through_the_mount_is_another_file(
    names: InodeNames,
) -> None:
    names.removed(("other",), last_name=True)  # 13's only name, removed through the mount

    assert names.node_for(13, None) != 13
    assert names.node_for(10, None) == 10  # not removed: the same file
