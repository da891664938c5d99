"""``agent.create``: a child's mounts lie within what its parent's tools reach (SPEC A-4, T-5).

Every agent holds the storage root at ``/ctx``, but its tools reach there only its projection
(filtered mounts: the spaces it may read, its own home and controls, the tools and models it
may use).  A child's mount of a place under the root is within the parent's mounts only where
that projection shows it, read-write only where the parent may write; otherwise a parent could
hand its child a space it may not read itself.  Real roots, a real second uid, real tool
processes.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

import pytest

from cortexfs.shared.spaces import create_shared_space
from tests.tools.support import World, plant_secret

SECRET = "topsecret\n"
TOOLS = ["fs.read", "fs.list", "agent.create"]


@pytest.fixture
def lead(world: World) -> World:
    """Agent ``lead`` (the test user) runs the fs tools and agent.create, may create ``kid``,
    reads space ``ro``, reads and writes space ``pub``, uses model ``acme/m1``.  Space
    ``secretproj`` is the user's group's, so the mode bits let lead's uid read it; its policy
    does not."""
    world.agent("lead", tools=TOOLS, shared={"pub": ["read", "write"], "ro": ["read"]})
    for tool in TOOLS:
        world.allow_tool(tool, label="lead_t")
    with open(world.root / "agent" / "lead.d" / "policy", "a") as policy:
        policy.write("allow lead_t agent:kid create\nallow lead_t model:acme/m1 use\n")
    for space in ("pub", "ro", "secretproj"):
        create_shared_space(world.root, space, gid=world.user.gid)
    plant_secret(world, "secretproj", SECRET)
    (world.root / "shared" / "ro" / "data" / "r.txt").write_text("read-only space\n")
    for model in ("m1", "m2"):
        (world.root / "model" / "acme" / f"{model}.d").mkdir(parents=True, exist_ok=True)
        (world.root / "model" / "acme" / model).write_text(f"{model}\n")
    # The model's own policy lets lead use m1 as well (P-5 step 6), so that lead's view shows it.
    (world.root / "model" / "acme" / "m1.d" / "policy").write_text(
        "allow lead_t model:acme/m1 use\n"
    )
    home = home_of(world)
    home.mkdir(mode=0o700, exist_ok=True)
    os.chown(home, world.user.uid, world.user.gid)
    (world.root / "home" / "12345").mkdir()
    (world.root / "shared" / "cortexfs-docs").mkdir(mode=0o755, exist_ok=True)
    world.agent("other", uid=65534)
    return world


def home_of(world: World) -> Path:
    return world.root / "home" / str(world.user.uid)


def create(world: World, mounts: list[list[str]], **fields: Any) -> Any:
    request = {"name": "kid", "label": "lead_t", "tools": ["fs.read"], "mount": mounts}
    return world.run("agent.create", {**request, **fields}, agent="lead")


def mount_control(world: World) -> list[list[str]]:
    return json.loads((world.root / "agent" / "kid.d" / "mount").read_text())


def assert_refused(world: World, result: Any, code: int = errno.EACCES) -> None:
    assert not result.ok, result.output
    assert result.output["error"] == errno.errorcode[code], result.output
    assert not (world.root / "agent" / "kid").exists()
    assert not (world.root / "agent" / "kid.d").exists()


# --------------------------------------------------------------------------- refused


def test_a_space_the_parents_view_hides_is_not_the_childs_to_mount(lead: World) -> None:
    source = str(lead.root / "shared" / "secretproj" / "data")
    hidden = lead.run("fs.read", {"path": "/ctx/shared/secretproj/data/s.txt"}, agent="lead")
    assert not hidden.ok  # the parent itself cannot read it, though its uid could

    result = create(lead, [[source, "/data", "ro"]])

    assert_refused(lead, result)
    assert "does not hold the mount at /data (ro)" in result.output["message"]
    assert SECRET not in json.dumps(result.output)
    assert lead.run("fs.read", {"path": "/data/s.txt"}, agent="kid").error.errno == errno.ENOENT


@pytest.mark.parametrize(
    "place",
    [
        "shared/secretproj",  # a space it may not read
        "shared",  # the filtered directory itself: a mount of it shows every space
        "home",
        "home/12345",  # another uid's home
        "agent",
        "agent/other.d",  # another agent's controls
        "tool",
        "tool/shell.exec.d",  # a tool it may not run
        "model",
        "model/acme",  # a provider with a model it may not use
        "model/acme/m2.d",
        "stray",  # outside the root ABI
    ],
)
def test_a_place_of_the_root_outside_the_parents_projection_is_refused(
    lead: World, place: str
) -> None:
    (lead.root / "stray").mkdir(exist_ok=True)

    assert_refused(lead, create(lead, [[str(lead.root / place), "/data", "ro"]]))


def test_a_directory_holding_the_storage_root_is_refused(lead: World) -> None:
    assert_refused(lead, create(lead, [[str(lead.root.parent), "/data", "ro"]]))


@pytest.mark.parametrize(
    "place",
    [
        "shared/ro",
        "shared/ro/data",
        "shared/cortexfs-docs",
        "bin",
        "tool/fs.read.d",
        "agent/lead.d",
    ],
)
def test_a_place_the_parent_may_only_read_is_not_the_childs_to_write(
    lead: World, place: str
) -> None:
    result = create(lead, [[str(lead.root / place), "/data", "rw"]])

    assert_refused(lead, result)
    assert "(rw)" in result.output["message"]


def test_a_link_cannot_lead_a_child_into_a_hidden_space(lead: World) -> None:
    """Sources are judged where they really lead: a link the parent may make in its home, its
    writable space or its workspace does not carry the secret space into its reach."""
    target = lead.root / "shared" / "secretproj"
    links = [
        home_of(lead) / "peek",
        lead.root / "shared" / "pub" / "data" / "peek",
        lead.workspace / "peek",
    ]
    for link in links:
        link.symlink_to(target)
        os.lchown(link, lead.user.uid, lead.user.gid)

    for link in links:
        for source in (link, link / "data"):
            assert_refused(lead, create(lead, [[str(source), "/data", "ro"]]))


def test_dot_dot_in_a_source_is_refused_before_it_is_judged(lead: World) -> None:
    source = f"{lead.root}/shared/ro/../secretproj/data"

    result = create(lead, [[source, "/data", "ro"]])

    assert_refused(lead, result, errno.EINVAL)
    assert "'..'" in result.output["message"]


# --------------------------------------------------------------------------- allowed


@pytest.mark.parametrize(
    ("place", "mode"),
    [
        ("shared/ro/data", "ro"),
        ("shared/pub/data", "rw"),
        ("shared/cortexfs-docs", "ro"),
        ("home/{uid}/notes", "rw"),
        ("bin", "ro"),
        ("tool/fs.read.d", "ro"),
        ("agent/lead.d", "ro"),
        ("model/acme/m1.d", "ro"),
    ],
)
def test_a_place_the_parents_projection_shows_may_be_the_childs(
    lead: World, place: str, mode: str
) -> None:
    source = str(lead.root / place.format(uid=lead.user.uid))
    if place.startswith("home/"):
        _notes_in_home(lead)

    result = create(lead, [[source, "/data", mode]])

    assert result.ok, result.output
    assert [source, "/data", mode] in mount_control(lead)


def _notes_in_home(lead: World) -> None:
    """A directory of the parent's own in its home, beside the agent/ that holds sessions."""
    notes = home_of(lead) / "notes"
    notes.mkdir(exist_ok=True)
    os.chown(notes, lead.user.uid, lead.user.gid)


def test_the_child_reads_through_its_mount_what_the_parent_may_read(lead: World) -> None:
    result = create(lead, [[str(lead.root / "shared" / "ro" / "data"), "/data", "ro"]])

    assert result.ok, result.output
    read = lead.run("fs.read", {"path": "/data/r.txt"}, agent="kid")
    assert read.ok and read.output["content"] == "read-only space\n", read


def test_the_childs_ctx_is_its_own_projection(lead: World) -> None:
    """The storage root at /ctx, which every child gets, is allowed: the child's tools see
    there what the child's own policy shows, within its parent's."""
    result = create(lead, [], tools=["fs.list"], shared={"ro": ["read"]})

    assert result.ok, result.output
    ctx = [source for source, target, _ in mount_control(lead) if target == "/ctx"]
    assert ctx == [os.path.realpath(lead.root)]
    listed = lead.run("fs.list", {"path": "/ctx/shared"}, agent="kid")
    assert listed.ok, listed
    assert [entry["name"] for entry in listed.output["entries"]] == ["cortexfs-docs", "ro"]


def test_a_link_to_a_visible_place_is_recorded_as_the_place(lead: World) -> None:
    """The child's mount names the real directory judged, so repointing the link later leads
    the child nowhere new."""
    link = home_of(lead) / "alias"
    link.symlink_to(lead.root / "shared" / "ro" / "data")
    os.lchown(link, lead.user.uid, lead.user.gid)

    result = create(lead, [[str(link), "/data", "ro"]])

    assert result.ok, result.output
    real = os.path.realpath(lead.root / "shared" / "ro" / "data")
    assert [real, "/data", "ro"] in mount_control(lead)
    link.unlink()
    link.symlink_to(lead.root / "shared" / "secretproj" / "data")
    read = lead.run("fs.read", {"path": "/data/s.txt"}, agent="kid")
    assert not read.ok and SECRET not in json.dumps(read.output)


# --------------------------------------------------------------------------- stacked mounts


@pytest.fixture
def stacked(world: World) -> World:
    """Agent ``lead``'s own mounts: its workspace read-write at /workspace, with
    ``work/locked`` read-only on top at /workspace/locked and ``scratch`` covering
    ``work/cover`` at /workspace/cover."""
    for name in ("locked", "cover", "other"):
        (world.workspace / name).mkdir()
    world.agent(
        "lead",
        tools=["agent.create"],
        mounts=[
            [str(world.workspace), "/workspace", "rw"],
            [str(world.workspace / "locked"), "/workspace/locked", "ro"],
            [str(world.scratch), "/workspace/cover", "ro"],
        ],
    )
    world.allow_tool("agent.create", label="lead_t")
    with open(world.root / "agent" / "lead.d" / "policy", "a") as policy:
        policy.write("allow lead_t agent:kid create\n")
    return world


@pytest.mark.parametrize(
    ("place", "mode", "allowed"),
    [
        ("other", "rw", True),
        ("locked", "ro", True),
        ("locked", "rw", False),  # read-only where the parent sees it
        ("cover", "ro", False),  # hidden from the parent by the mount on top
        ("", "ro", False),  # would show work/cover, which the parent cannot see
        ("", "rw", False),
    ],
)
def test_a_mount_on_top_of_the_parents_hides_what_is_below_it(
    stacked: World, place: str, mode: str, allowed: bool
) -> None:
    source = str(stacked.workspace / place) if place else str(stacked.workspace)

    result = create(stacked, [[source, "/data", mode]], tools=[])

    if allowed:
        assert result.ok, result.output
    else:
        assert_refused(stacked, result)


# ------------------------------------------------------------- named as the parent sees it


@pytest.mark.parametrize(
    ("seen", "place", "mode"),
    [
        ("/ctx/shared/ro/data", "shared/ro/data", "ro"),
        ("/ctx/shared/pub/data", "shared/pub/data", "rw"),
        ("/ctx/home/{uid}/notes", "home/{uid}/notes", "rw"),
    ],
)
def test_a_source_may_be_named_as_the_parents_tools_see_it(
    lead: World, seen: str, place: str, mode: str
) -> None:
    """A-4: the child's mounts lie within the parent's *visible* mounts, which the agent
    knows by their paths in its view; the host records the real path behind them."""
    uid = lead.user.uid
    _notes_in_home(lead)

    result = create(lead, [[seen.format(uid=uid), "/data", mode]])

    assert result.ok, result.output
    assert [str(lead.root / place.format(uid=uid)), "/data", mode] in mount_control(lead)


def test_the_parents_workspace_may_be_named_by_its_place_in_the_view(lead: World) -> None:
    (lead.workspace / "sub").mkdir()

    result = create(lead, [["/workspace/sub", "/data", "ro"]])

    assert result.ok, result.output
    assert [os.path.realpath(lead.workspace / "sub"), "/data", "ro"] in mount_control(lead)


@pytest.mark.parametrize(
    ("seen", "mode"),
    [
        ("/ctx/shared/secretproj/data", "ro"),  # hidden by the parent's view
        ("/ctx/shared/ro/data", "rw"),  # a space the parent may only read
        ("/ctx/agent/other.d", "ro"),  # another agent's controls
        ("/nowhere/in/the/view", "ro"),  # no mount shows it, and no such host path
    ],
)
def test_a_place_named_in_the_view_is_judged_as_its_host_path_would_be(
    lead: World, seen: str, mode: str
) -> None:
    assert_refused(lead, create(lead, [[seen, "/data", mode]]))


@pytest.mark.parametrize(
    "place",
    [
        "shared/pub",
        "shared/ro",
        "shared/pub/agent",
        "shared/pub/agent/other",
        "home/{uid}",  # another agent of the parent's uid records its sessions there
        "home/{uid}/agent",
    ],
)
def test_a_place_other_agents_sessions_may_appear_in_is_never_a_childs_mount(
    lead: World, place: str
) -> None:
    """A space or a home, its agent/ and another agent's directory: sessions recorded there
    later would show through the child's mount unfiltered, past S-6, for as long as the child
    exists, though none is there (and so no filter of the parent's view) when it is made."""
    (lead.root / "shared" / "pub" / "agent" / "other").mkdir(exist_ok=True)
    agents_of_uid = home_of(lead) / "agent"
    agents_of_uid.mkdir(exist_ok=True)
    os.chown(agents_of_uid, lead.user.uid, lead.user.gid)

    result = create(lead, [[str(lead.root / place.format(uid=lead.user.uid)), "/data", "ro"]])

    assert_refused(lead, result)
    assert "the mount at /data (ro)" in result.output["message"]


def test_a_refusal_names_the_mount_by_its_target_not_the_path_resolved_as_root(
    lead: World, tmp_path: Path
) -> None:
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    (hidden / "lnk").symlink_to(tmp_path / "target-name-the-parent-may-not-learn")
    (lead.workspace / "l2").symlink_to(hidden / "lnk")

    result = create(lead, [["/workspace/l2", "/data", "ro"]])

    assert_refused(lead, result)
    assert "target-name-the-parent-may-not-learn" not in result.output["message"]
    assert "the mount at /data (ro)" in result.output["message"]
