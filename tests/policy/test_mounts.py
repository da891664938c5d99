"""What an agent sees through its mount table (SPEC P-5 step 3, A-3, X-1)."""

from __future__ import annotations

import errno
import json
from pathlib import PurePosixPath as P

import pytest

from cortexfs.errors import CtxError
from cortexfs.policy.mounts import (
    Mount,
    at_or_below,
    mounts_named,
    parse_mount_table,
    target_problem,
    views_of,
)


def table(*triples: list[str]) -> tuple[Mount, ...]:
    return parse_mount_table(json.dumps(list(triples)).encode())


def test_a_path_under_a_source_appears_under_its_target() -> None:
    mounts = table(["/srv/storage", "/ctx", "ro"])
    (view,) = views_of(mounts, P("/srv/storage/tool/fs.read"))
    assert view.path == P("/ctx/tool/fs.read")
    assert not view.mount.writable
    assert [v.path for v in views_of(mounts, P("/srv/storage"))] == [P("/ctx")]


def test_a_path_under_no_source_is_invisible() -> None:
    mounts = table(["/srv/storage/tool", "/ctx/tool", "ro"])
    assert views_of(mounts, P("/srv/storage/shared/project-a")) == []
    assert views_of(mounts, P("/srv/storage/toolbox")) == []
    assert views_of((), P("/srv/storage/tool/fs.read")) == []


def test_a_deeper_mount_hides_what_lies_beneath_it() -> None:
    mounts = table(
        ["/srv/storage", "/ctx", "rw"],
        ["/srv/empty", "/ctx/shared", "ro"],
    )
    assert views_of(mounts, P("/srv/storage/shared/project-a")) == []
    assert [v.path for v in views_of(mounts, P("/srv/storage/tool/x"))] == [P("/ctx/tool/x")]


def test_the_later_of_two_mounts_on_one_target_wins() -> None:
    mounts = table(["/srv/a", "/data", "rw"], ["/srv/b", "/data", "ro"])
    assert views_of(mounts, P("/srv/a/file")) == []
    (view,) = views_of(mounts, P("/srv/b/file"))
    assert view.path == P("/data/file")


def test_one_path_may_be_seen_in_several_places() -> None:
    mounts = table(["/srv/storage", "/ctx", "ro"], ["/srv/storage/shared/p", "/shared/p", "rw"])
    views = views_of(mounts, P("/srv/storage/shared/p/data"))
    assert [(v.path, v.mount.writable) for v in views] == [
        (P("/ctx/shared/p/data"), False),
        (P("/shared/p/data"), True),
    ]


@pytest.mark.parametrize("top", ["/", "/ctx", "/ctx/tool", "/srv/storage", "/usr"])
@pytest.mark.parametrize(
    "path", ["/", "/ctx", "/ctx/tool", "/ctx/toolbox", "/ctxx", "/srv/storage/tool", "/usr/lib"]
)
def test_at_or_below_is_the_path_or_one_of_its_parents(path: str, top: str) -> None:
    expected = P(path) == P(top) or P(top) in P(path).parents
    assert at_or_below(P(path), P(top)) == expected


@pytest.mark.parametrize("top", [".", ""])
def test_a_top_with_no_parts_holds_nothing(top: str) -> None:
    assert not at_or_below(P("/etc/shadow"), P(top))
    assert not at_or_below(P("etc"), P(top))


def test_mounts_are_named_by_the_last_component_of_their_target() -> None:
    mounts = table(["/home/u/project", "/workspace", "rw"], ["/srv/x", "/data/cache", "ro"])
    assert [m.name for m in mounts] == ["workspace", "cache"]
    assert mounts_named(mounts, "workspace") == [mounts[0]]
    assert mounts_named(mounts, "data") == []


def test_paths_are_normalised() -> None:
    (mount,) = table(["/srv//storage/", "/ctx/", "rw"])
    assert (mount.source, mount.target, mount.writable) == (P("/srv/storage"), P("/ctx"), True)


@pytest.mark.parametrize(
    "data",
    [
        b"not json",
        b'{"source": "/x"}',
        b'[["/x", "/y"]]',
        b'[["/x", "/y", "rx"]]',
        b'[["x", "/y", "ro"]]',
        b'[["/x", "y", "ro"]]',
        b'[["/x/../etc", "/y", "ro"]]',
        b'[["/x", "/y/./z", "ro"]]',
        b'[[1, "/y", "ro"]]',
        b'[["/x\\u0000", "/y", "ro"]]',
        b'[["/x/\\ud800", "/y", "ro"]]',
        b'[["/x", "/y\\udc7f", "ro"]]',
        b"\xff",
    ],
)
def test_malformed_tables_are_einval(data: bytes) -> None:
    with pytest.raises(CtxError) as raised:
        parse_mount_table(data)
    assert raised.value.errno == errno.EINVAL


def test_a_lone_surrogate_names_no_path_and_is_said_so() -> None:
    """JSON can spell one, but no byte string holds it: the entry is refused before any
    path is made of it, naming the entry, the role and the character."""
    with pytest.raises(CtxError) as raised:
        parse_mount_table(b'[["/srv/ok", "/a", "ro"], ["/srv/\\ud800", "/b", "ro"]]')
    assert raised.value.message == (
        "mount entry 2: the source '/srv/\\ud800' holds '\\ud800', a lone surrogate that "
        "stands for no byte, which no path can hold"
    )


def test_a_byte_of_a_name_that_is_not_utf8_is_its_surrogate_escape() -> None:
    """A table written from a path that is not UTF-8 holds each odd byte as the surrogate
    that stands for it: that path, not a lone surrogate."""
    (mount,) = parse_mount_table(b'[["/srv/bad\\udcff", "/a", "ro"]]')
    assert bytes(mount.source) == b"/srv/bad\xff"


def test_a_directory_inside_the_root_at_ctx_is_not_called_another_root() -> None:
    inside = Mount(P("/srv/root/shared"), P("/ctx"), False)
    reason = target_problem(inside, P("/srv/root"), "coder")
    assert reason.startswith(
        "the mount at /ctx names /srv/root/shared, a directory inside this storage root "
        "/srv/root, not the root itself"
    ), reason
    assert reason.endswith("set its source to /srv/root in agent/coder.d/mount"), reason
    assert "another storage root" not in reason
