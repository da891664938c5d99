"""Where a mount may appear and what its source may be (SPEC A-1, A-3, A-4, T-5).

The terminal's sandbox drops privileges with setpriv run as root inside it, through its own
``/usr``, ``/etc`` and ``/lib``: a mount there would run its writer's code as root.  So no
request may put a mount on a system directory, and a mount control that does (edited by hand)
has that mount withheld — never bound, never given to a tool.  A source is used only as the
real path it was recorded as: a link put on its path later leads nowhere.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path, PurePosixPath

import pytest

from cortexfs.agents import sandbox
from cortexfs.agents.request import RequestError, parse_request
from cortexfs.agents.view import AgentView
from cortexfs.errors import CtxError
from cortexfs.policy import controls
from cortexfs.policy.mounts import Mount
from cortexfs.tools.core import confine
from cortexfs.tools.core.toolio import ToolFailure
from tests.agents.test_agent_create_mounts import SECRET, create, home_of, mount_control
from tests.agents.test_agent_create_mounts import lead as lead  # the fixture
from tests.tools.support import World

SYSTEM_PLACES = [
    "/",
    "/usr",
    "/usr/bin",
    "/etc",
    "/etc/ld.so.preload",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64/x",
    "/lib32",
    "/libx32",
    "/proc/self",
    "/sys",
    "/dev/shm",
    "/run",
    "/run/ctx",
    "/var/tmp",
    "/boot",
    "/root",
    "/ctx",
    "/ctx/tool",
]


@pytest.mark.parametrize("target", SYSTEM_PLACES)
def test_a_request_mounting_on_a_system_directory_is_einval(world: World, target: str) -> None:
    request = {"name": "a", "label": "a_t", "mount": [[str(world.workspace), target, "ro"]]}

    with pytest.raises(RequestError) as raised:
        parse_request(request, "request", world.root)

    assert raised.value.errno == errno.EINVAL
    assert f"mount target {target}" in raised.value.problems[0], raised.value.problems


@pytest.mark.parametrize("target", ["/usrlocal", "/etcetera", "/data/etc", "/srv/usr", "/home"])
def test_a_target_merely_named_like_a_system_directory_is_fine(world: World, target: str) -> None:
    request = {"name": "a", "label": "a_t", "mount": [[str(world.workspace), target, "ro"]]}

    assert len(parse_request(request, "request", world.root).mounts) == 2  # with /ctx


def test_a_request_records_its_sources_as_real_paths(world: World) -> None:
    link = world.scratch / "to-workspace"
    link.symlink_to(world.workspace)
    request = {"name": "a", "label": "a_t", "mount": [[str(link), "/work", "ro"]]}

    mounts = parse_request(request, "request", world.root).mounts

    assert mounts[0] == (os.path.realpath(world.workspace), "/work", "ro")


@pytest.mark.parametrize("target", ["/etc", "/usr", "/lib", "/var/x"])
def test_agent_create_refuses_a_child_mount_on_a_system_directory(lead: World, target: str) -> None:
    """The parent may write its home; its child may not show the home at /etc."""
    home = home_of(lead)

    result = create(lead, [[str(home), target, "ro"], [str(home), "/h", "rw"]])

    assert not result.ok and result.output["error"] == "EINVAL", result.output
    assert f"mount target {target}" in result.output["message"]
    assert not (lead.root / "agent" / "kid").exists()


def _hand_edit(world: World, agent: str, mounts: list[list[str]]) -> None:
    (world.root / "agent" / f"{agent}.d" / "mount").write_text(json.dumps(mounts) + "\n")


def test_a_system_mount_in_a_hand_edited_control_is_withheld_and_never_bound(
    world: World,
) -> None:
    world.agent("edited", mounts=[[str(world.workspace), "/work", "rw"]])
    real = os.path.realpath(world.workspace)
    table = json.loads((world.root / "agent" / "edited.d" / "mount").read_text())
    _hand_edit(world, "edited", [*table, [real, "/etc", "ro"], [real, "/usr/lib/x", "ro"]])

    usable = controls.read_mounts(world.root, "edited")
    withheld = controls.withheld_mounts(world.root, "edited")
    view = AgentView.load(world.root, "edited")

    assert [str(m.target) for m in usable] == ["/work", "/ctx"]
    assert [str(m.target) for m, _ in withheld] == ["/etc", "/usr/lib/x"]
    assert all("belongs to the system" in reason for _, reason in withheld)
    assert [str(m.target) for m in view.tool_mounts()].count("/etc") == 0
    binds = _binds(view)
    assert (real, "/work") in binds
    assert ("/etc", "/etc") in binds and ("/usr", "/usr") in binds
    assert not [target for source, target in binds if source == real and target != "/work"]


def test_the_sandbox_binds_no_mount_on_a_system_directory_whatever_its_view(
    world: World,
) -> None:
    world.agent("plain", mounts=[[str(world.workspace), "/work", "ro"]])
    view = AgentView.load(world.root, "plain")
    real = PurePosixPath(os.path.realpath(world.workspace))
    planted = tuple(Mount(real, PurePosixPath(t), False) for t in ("/usr", "/etc", "/lib/x"))
    view = view._replace(mounts=view.mounts + planted)
    policy = world.root / "agent" / "plain.d" / "policy"
    policy.write_text(
        policy.read_text() + "".join(f"allow plain_t mount:{m.name} read\n" for m in planted)
    )
    view = view._replace(policy=AgentView.load(world.root, "plain").policy)
    assert len(view.visible_mounts()) == 5  # /work, /ctx and the three planted ones

    binds = _binds(view)

    assert not [target for source, target in binds if source == str(real) and target != "/work"]


def test_a_source_repointed_through_a_link_is_withheld(lead: World) -> None:
    """A child's source, checked and recorded as a real path in the parent's home, is later
    replaced by a link to a space neither may read: the child gets nothing through it."""
    home = home_of(lead)
    (home / "f").mkdir()
    os.chown(home / "f", lead.user.uid, lead.user.gid)
    assert create(lead, [[str(home / "f"), "/m", "ro"]]).ok
    assert mount_control(lead)[0][0] == os.path.realpath(home / "f")

    (home / "f").rmdir()
    (home / "f").symlink_to(lead.root / "shared" / "secretproj" / "data")

    read = lead.run("fs.read", {"path": "/m/s.txt"}, agent="kid")
    assert not read.ok and read.error.errno == errno.EACCES, read.output
    assert SECRET not in json.dumps(read.output)
    ((mount, reason),) = controls.withheld_mounts(lead.root, "kid")
    assert str(mount.target) == "/m" and "symbolic link" in reason


def test_an_intermediate_link_on_a_source_is_withheld_too(lead: World) -> None:
    home = home_of(lead)
    (home / "e" / "data").mkdir(parents=True)
    assert create(lead, [[str(home / "e" / "data"), "/m", "ro"]]).ok

    shutil.rmtree(home / "e")
    (home / "e").symlink_to(lead.root / "shared" / "secretproj")

    read = lead.run("fs.read", {"path": "/m/s.txt"}, agent="kid")
    assert not read.ok, read.output
    assert SECRET not in json.dumps(read.output)
    assert [str(m.target) for m in controls.read_mounts(lead.root, "kid")] == ["/ctx"]


def test_confine_never_follows_a_link_on_a_mounts_source(tmp_path: Path) -> None:
    """Between the check and the tool's use, a link swapped into the source is refused."""
    real = tmp_path / "real"
    (real / "sub").mkdir(parents=True)
    (real / "sub" / "x").write_text("x\n")
    (tmp_path / "link").symlink_to(real)
    base = os.path.realpath(tmp_path)

    def place(source: str) -> confine.Place:
        mounts = json.dumps([[source, "/m", "ro"]])
        view = confine.View.from_environment({"CTX_MOUNTS": mounts, "CTX_CWD": "/m"})
        return view.locate("/m/sub")

    os.close(confine.open_directory(place(f"{base}/real")))
    with pytest.raises(ToolFailure) as raised:
        confine.open_directory(place(f"{base}/link"))
    assert raised.value.errno == errno.ELOOP
    assert "symbolic link" in str(raised.value)


def _binds(view: AgentView) -> list[tuple[str, str]]:
    """The (source, target) pairs the sandbox's command line binds: a mount's source is
    the directory its descriptor holds open, as the kernel names it."""
    sources = sandbox.open_mount_sources(view)
    try:
        command = sandbox.shell_command("bwrap", view, Path("/view"), Path("/run.sock"), sources)
        binds = []
        for index, word in enumerate(command):
            if word in ("--bind", "--ro-bind"):
                binds.append((command[index + 1], command[index + 2]))
            elif word in ("--bind-fd", "--ro-bind-fd"):
                held = os.readlink(f"/proc/self/fd/{command[index + 1]}")
                binds.append((held, command[index + 2]))
        return binds
    finally:
        sandbox.close_sources(sources)


def test_the_sandbox_binds_the_directory_it_checked_not_a_link_put_on_its_path_since(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bubblewrap would follow a link when it binds a path: it gets the source open instead,
    and a source whose path runs through a link by then is refused (ELOOP), never bound.
    (A link there before the check withholds the mount: the test above.)"""
    inner = world.workspace / "inner"
    inner.mkdir()
    world.agent("raced", mounts=[[str(inner), "/work", "rw"]])
    view = AgentView.load(world.root, "raced")
    assert (os.path.realpath(inner), "/work") in _binds(view)

    monkeypatch.setattr(sandbox, "mount_problem", lambda mount, storage_root: "")
    inner.rmdir()  # after the check: what a writer of the workspace could do
    inner.symlink_to(world.root / "agent")

    with pytest.raises(CtxError) as refused:
        sandbox.open_mount_sources(view)  # the view was loaded before the swap
    assert refused.value.errno == errno.ELOOP
    assert f"source {os.path.realpath(world.workspace)}/inner" in refused.value.message
    assert "symbolic link (inner)" in refused.value.message
