"""What the fs tools reach under /ctx is the agent's projection, no more (SPEC T-5, F-1, X-1).

The runner never hands a tool the storage root raw: its ``CTX_MOUNTS`` carry the projection of
``cortexfs.agents.projection`` as filtered mounts, the same rules ``ctx mount --as AGENT``
asks, so a space the policy does not grant is out of reach even where the mode bits would let
the agent's uid read it.  Real roots, a real second uid, real tool processes.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import pytest

from cortexfs.agents.projection import FRESH_SECONDS, ViewRules
from cortexfs.agents.view import AgentView
from cortexfs.shared.spaces import create_shared_space
from cortexfs.tools.core import confine
from cortexfs.tools.core.toolio import ToolFailure
from tests.fuse.support import NEEDS_A_MOUNT, mounted
from tests.tools.support import World, plant_secret, reaches, storage_paths

FS_TOOLS = ["fs.read", "fs.list", "fs.stat", "fs.write"]
SECRET = "topsecret\n"
ROOT_ABI = ["agent", "bin", "home", "model", "shared", "tool"]


@pytest.fixture
def team(world: World) -> World:
    """Agent coder (the test user): the fs tools; spaces ``open`` (read, write) and ``ro``
    (read); model ``acme/m1``.  Space ``secret`` is the user's group's, so the mode bits let
    coder read it; its policy does not.  Agent ``other``, another home, a stray root entry."""
    world.agent("coder", tools=FS_TOOLS, shared={"open": ["read", "write"], "ro": ["read"]})
    for tool in FS_TOOLS:
        world.allow_tool(tool)
    world.agent("other", uid=65534)
    for space in ("open", "ro", "secret"):
        create_shared_space(world.root, space, gid=world.user.gid)
    plant_secret(world, "secret", SECRET)
    (world.root / "shared" / "ro" / "data" / "r.txt").write_text("shared, read-only\n")
    for provider, model in (("acme", "m1"), ("acme", "m2"), ("other", "m3")):
        (world.root / "model" / provider / f"{model}.d").mkdir(parents=True, exist_ok=True)
        (world.root / "model" / provider / model).write_text(f"{model}\n")
    with open(world.root / "agent" / "coder.d" / "policy", "a") as policy:
        policy.write("allow coder_t model:acme/m1 use\n")
    # The model's own policy too (P-5 step 6): m2 and m3 are denied by the agent's already.
    (world.root / "model" / "acme" / "m1.d" / "policy").write_text(
        "allow coder_t model:acme/m1 use\n"
    )
    (world.root / "home" / "12345").mkdir()
    (world.root / "shared" / "cortexfs-docs").mkdir(mode=0o755, exist_ok=True)
    (world.root / "stray").write_text("not in the root ABI\n")
    return world


def ctx(world: World, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cortexfs", "--storage", str(world.root), *arguments],
        capture_output=True,
        text=True,
        timeout=120,
    )


def names(world: World, path: str, agent: str = "coder") -> list[str]:
    result = world.run("fs.list", {"path": path}, agent=agent)
    assert result.status == "ok", result
    return [entry["name"] for entry in result.output["entries"]]


def refusal(world: World, tool: str, request: dict[str, object]) -> tuple[int, str]:
    result = world.run(tool, request)
    assert result.status == "error" and result.error.stage == "exit", result
    assert result.exit_status == 1, result
    return result.error.errno, result.error.message


# --------------------------------------------------------------------------- reading


def test_a_space_the_policy_does_not_grant_is_refused_though_the_modes_allow_it(
    team: World,
) -> None:
    read = ctx(team, "run", "--agent", "coder", "fs.read", "/ctx/shared/secret/data/s.txt")
    listed = ctx(team, "run", "--agent", "coder", "fs.list", "/ctx/shared/secret")

    for refused in (read, listed):
        assert refused.returncode == 1, refused
        assert "EACCES" in refused.stderr and "not in the agent's view" in refused.stderr
        assert "topsecret" not in refused.stdout + refused.stderr
    assert refusal(team, "fs.read", {"path": "/ctx/shared/secret/data/s.txt"})[0] == errno.EACCES
    assert refusal(team, "fs.stat", {"path": "/ctx/shared/secret"})[0] == errno.EACCES


def test_an_agent_granted_the_space_reads_it(team: World) -> None:
    team.agent("reader", tools=["fs.read"], shared={"secret": ["read"]})
    team.allow_tool("fs.read", label="reader_t")

    read = team.run("fs.read", {"path": "/ctx/shared/secret/data/s.txt"}, agent="reader")

    assert read.status == "ok" and read.output["content"] == SECRET, read


def test_an_agent_that_sees_only_the_storage_root_starts_in_its_home_there(
    team: World,
) -> None:
    team.agent("plain", tools=["shell.exec", "fs.list"], mounts=[])
    for tool in ("shell.exec", "fs.list"):
        team.allow_tool(tool, label="plain_t")
    home = team.root / "home" / str(team.user.uid)

    listed = team.run("fs.list", {}, agent="plain")  # opens the home session: home/<uid>
    printed = team.run("shell.exec", {"cmd": "pwd"}, agent="plain")

    assert listed.status == "ok", listed
    assert printed.status == "ok", printed
    assert Path(str(printed.output).strip()).resolve() == home.resolve()
    relative = team.run("fs.list", {"path": "agent"}, agent="plain")
    assert relative.status == "ok" and [e["name"] for e in relative.output["entries"]] == [
        "plain"
    ], relative


def test_another_agents_controls_are_out_of_reach(team: World) -> None:
    for path in ("/ctx/agent/other.d/policy", "/ctx/agent/other"):
        code, message = refusal(team, "fs.read", {"path": path})
        assert code == errno.EACCES and "allow other_t" not in message
    assert names(team, "/ctx/agent") == ["coder", "coder.d"]
    own = team.run("fs.read", {"path": "/ctx/agent/coder.d/label"})
    assert own.status == "ok" and own.output["content"] == "coder_t\n", own


def test_listings_show_exactly_the_projection(team: World) -> None:
    uid = str(team.user.uid)

    assert names(team, "/ctx") == ROOT_ABI
    assert names(team, "/ctx/tool") == [
        "fs.list", "fs.list.d", "fs.read", "fs.read.d", "fs.stat", "fs.stat.d",
        "fs.write", "fs.write.d", "tsh.d",
    ]  # fmt: skip
    assert names(team, "/ctx/agent") == ["coder", "coder.d"]
    assert names(team, "/ctx/home") == [uid]
    assert names(team, "/ctx/shared") == ["cortexfs-docs", "open", "ro"]
    assert names(team, "/ctx/model") == ["acme"]
    assert names(team, "/ctx/model/acme") == ["m1", "m1.d"]
    assert "stray" not in names(team, "/ctx")
    # Below a visible object, everything is listed as it is.
    assert names(team, "/ctx/shared/ro") == sorted(os.listdir(team.root / "shared" / "ro"))
    stat = team.run("fs.stat", {"path": "/ctx/shared"})
    assert stat.status == "ok" and stat.output["type"] == "directory", stat


def test_a_hidden_tool_or_model_is_refused(team: World) -> None:
    for path in (
        "/ctx/tool/shell.exec",
        "/ctx/tool/shell.exec.d/policy",
        "/ctx/model/acme/m2",
        "/ctx/model/other/m3",
        "/ctx/home/12345",
        "/ctx/stray",
    ):
        assert refusal(team, "fs.stat", {"path": path})[0] == errno.EACCES, path


# --------------------------------------------------------------------------- writing


def test_writes_go_only_into_the_home_and_the_writable_spaces(team: World) -> None:
    uid = team.user.uid
    home = team.root / "home" / str(uid)

    mine = team.run("fs.write", {"path": f"/ctx/home/{uid}/note.txt", "content": "mine\n"})
    ours = team.run("fs.write", {"path": "/ctx/shared/open/data/x.txt", "content": "ours\n"})

    assert mine.status == "ok" and ours.status == "ok", (mine, ours)
    assert (home / "note.txt").read_text() == "mine\n"
    assert (home / "note.txt").stat().st_uid == uid
    assert (team.root / "shared" / "open" / "data" / "x.txt").read_text() == "ours\n"
    refused = {
        "/ctx/shared/ro/data/x.txt": errno.EROFS,
        "/ctx/shared/open/tool/x": errno.EROFS,  # a space's tools are the host's
        "/ctx/shared/secret/data/x.txt": errno.EACCES,
        "/ctx/tool/fs.read": errno.EROFS,
        "/ctx/tool/new-tool": errno.EACCES,
        "/ctx/agent/coder.d/policy": errno.EROFS,
        "/ctx/agent/other.d/policy": errno.EACCES,
        "/ctx/new": errno.EACCES,
        "/ctx/bin/tsh": errno.EROFS,
        "/ctx/home/12345/x.txt": errno.EACCES,
        f"/ctx/home/{uid}": errno.EISDIR,
    }
    before = snapshot(team.root)
    for path, code in refused.items():
        got, message = refusal(team, "fs.write", {"path": path, "content": "x"})
        assert got == code, (path, message)
    assert snapshot(team.root) == before


def test_no_grant_makes_the_manuals_writable(team: World) -> None:
    """D-1: manuals are read-only documents and grant nothing; ``shared:cortexfs-docs write``
    in a policy changes nothing of that, in the view or in the chain."""
    page = team.root / "shared" / "cortexfs-docs" / "page.md"
    page.write_text("the manual\n")
    page.chmod(0o666)  # even where the mode bits would let the agent's uid write it
    page.parent.chmod(0o777)
    with open(team.root / "agent" / "coder.d" / "policy", "a") as policy:
        policy.write(
            "allow coder_t shared:cortexfs-docs read\nallow coder_t shared:cortexfs-docs write\n"
        )
    view = AgentView.load(team.root, "coder")

    assert not ViewRules(view).writable(("shared", "cortexfs-docs", "page.md"))
    got, _ = refusal(
        team, "fs.write", {"path": "/ctx/shared/cortexfs-docs/page.md", "content": "x"}
    )
    assert got == errno.EROFS and page.read_text() == "the manual\n"
    explained = ctx(team, "policy", "explain", "coder", "shared:cortexfs-docs", "write")
    assert explained.returncode == 1
    assert "step 3" in explained.stdout and "manual bundle is read-only" in explained.stdout


def test_step_3_says_why_a_space_is_read_only_in_the_view(team: World) -> None:
    with open(team.root / "agent" / "coder.d" / "policy", "a") as policy:
        policy.write("allow coder_t shared:secret write\n")  # write without read

    explained = ctx(team, "policy", "explain", "coder", "shared:secret", "write")

    assert explained.returncode == 1
    assert "step 3" in explained.stdout, explained.stdout
    assert "'shared:secret read' and 'shared:secret write'" in explained.stdout


def test_the_mode_bits_still_apply_where_the_view_lets_the_agent_write(team: World) -> None:
    locked = team.root / "shared" / "open" / "locked"
    locked.mkdir(mode=0o755)  # root's: the kernel refuses the agent's uid

    code, message = refusal(team, "fs.write", {"path": "/ctx/shared/open/locked/x", "content": "x"})

    assert code == errno.EACCES and "Permission denied" in message, message
    assert not (locked / "x").exists()


def test_a_policy_change_shows_at_the_next_call(team: World) -> None:
    assert "ro" in names(team, "/ctx/shared")
    policy = team.root / "agent" / "coder.d" / "policy"
    kept = [line for line in policy.read_text().splitlines() if "shared:ro" not in line]
    policy.write_text("\n".join(kept) + "\n")

    assert names(team, "/ctx/shared") == ["cortexfs-docs", "open"]
    assert refusal(team, "fs.read", {"path": "/ctx/shared/ro/data/r.txt"})[0] == errno.EACCES


def test_a_revoked_tool_is_refused_at_once_and_hidden_within_a_second(team: World) -> None:
    """Which tools a call's view shows is kept for half a second (a worker does not run the chain
    for every tool its agent may run at every job); whether the call's own tool runs is
    decided afresh at every call."""
    assert "fs.stat" in names(team, "/ctx/tool")
    (team.root / "tool" / "fs.stat.d" / "policy").write_text("")  # the tool's half of P-6

    refused = team.run("fs.stat", {"path": "/ctx"})

    assert refused.status == "error" and refused.error.stage == "authorize", refused
    time.sleep(FRESH_SECONDS)
    assert "fs.stat" not in names(team, "/ctx/tool")


def test_the_tools_kept_for_one_agent_never_show_to_another(team: World) -> None:
    """What one agent's calls keep for a moment is its own: another agent of the same uid,
    asking within that moment, sees only the tools it may run."""
    team.agent("peer", tools=["fs.list"])
    team.allow_tool("fs.list", label="peer_t")

    assert "fs.stat" in names(team, "/ctx/tool")
    assert names(team, "/ctx/tool", agent="peer") == ["fs.list", "fs.list.d", "tsh.d"]


# ------------------------------------------------------------------- one decision, no copy


def test_what_a_tool_may_reach_is_what_the_rules_decide_for_every_path(team: World) -> None:
    """Every path of the root to four levels: a tool locates it iff the projection shows
    it, and may write it iff the projection lets it be written.  Nothing is written to
    decide it."""
    (team.root / "home" / str(team.user.uid)).mkdir(exist_ok=True)
    view = AgentView.load(team.root, "coder")
    rules = ViewRules(view)
    before = snapshot(team.root)
    environment = view.tool_environment(tool="fs.read", session="s", call="c", mode="native")
    assert snapshot(team.root) == before
    tools = confine.View.from_environment(environment)

    checked = 0
    for parts in storage_paths(team.root, depth=4):
        path = str(PurePosixPath("/ctx", *parts))
        assert reaches(tools, path) == rules.visible(parts), path
        assert reaches(tools, path, write=True) == rules.writable(parts), path
        checked += 1
    assert checked > 100


def test_a_filtered_mount_lists_only_its_names_and_a_malformed_one_is_einval(
    tmp_path: Path,
) -> None:
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
    table = [[str(tmp_path), "/v", "ro", ["a", "c", "absent"]]]
    view = confine.View.from_environment({"CTX_MOUNTS": json.dumps(table), "CTX_CWD": "/v"})

    place = view.locate("/v")
    assert confine.listed(place, os.listdir(tmp_path)) == ["a", "c"]
    assert confine.listed(view.locate("/v/a"), ["x", "b"]) == ["b", "x"]
    with pytest.raises(ToolFailure) as hidden:
        view.locate("b/deeper")
    assert hidden.value.errno == errno.EACCES
    for malformed in ([[str(tmp_path), "/v", "ro", "a"]], [[str(tmp_path), "/v", "ro", [1]]]):
        with pytest.raises(ToolFailure) as refused:
            confine.View.from_environment({"CTX_MOUNTS": json.dumps(malformed)})
        assert refused.value.errno == errno.EINVAL


def needs_a_mount(test: Callable[..., None]) -> Callable[..., None]:
    for mark in NEEDS_A_MOUNT:
        test = mark(test)
    return test


@needs_a_mount
def test_the_mount_and_the_tools_list_the_same_names(team: World) -> None:
    (team.root / "home" / str(team.user.uid)).mkdir(exist_ok=True)
    directories = ["", "tool", "agent", "home", "shared", "model", "model/acme", "shared/ro"]
    through_tools = {d: names(team, f"/ctx/{d}".rstrip("/")) for d in directories}
    mountpoint = team.scratch / "ctx"
    with mounted(team.root, mountpoint, "--as", "coder"):
        through_mount = {d: sorted(os.listdir(mountpoint / d)) for d in directories}
    assert through_tools == through_mount


# --------------------------------------------------------------------------- helpers


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every entry's mtime and size, but the records each call appends to (T-7, S-2)."""
    return {
        str(p): (p.lstat().st_mtime_ns, p.lstat().st_size)
        for p in root.rglob("*")
        if p.name not in ("log", "events.jsonl")
    }
