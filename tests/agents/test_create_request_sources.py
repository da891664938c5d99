"""``ctx agent create`` reading what another uid may have put in its way (SPEC A-3): a request
file that is a FIFO, and a mount source reached through that uid's symbolic link."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cortexfs.agents.request import resolve_links
from tests.support.cli import ctx
from tests.tools.support import World

CTX = Path(sys.executable).with_name("ctx")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="another uid's files, made as root")


def create(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    user = ["--user", str(world.user.uid), "--gid", str(world.user.gid)]
    return ctx(world.root, "agent", "create", *user, *args, timeout=20)


def test_a_fifo_as_the_request_is_refused_at_once(world: World) -> None:
    """It waited forever for a writer; ctx policy check words the same refusal."""
    request = world.workspace / "req.json"
    os.mkfifo(request)
    os.chown(request, world.user.uid, world.user.gid)

    done = create(world, str(request))

    assert done.returncode == 1
    assert done.stderr == (
        f"ctx: EINVAL: {request} is not a regular file (a FIFO, device or directory); give a "
        "request file, or '-' to read one from a pipe; nothing was created\n"
    )
    assert not (world.root / "agent" / "a3").exists()


def test_a_closed_standard_input_is_no_request(world: World) -> None:
    """`ctx agent create - <&-`: there is nothing to read, which is said as such (EBADF)."""
    done = subprocess.run(
        [str(CTX), "--storage", str(world.root), "agent", "create", "-"],
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.close(0),
        timeout=20,
    )

    assert done.returncode == 1
    assert done.stderr == (
        "ctx: EBADF: standard input is closed: there is no request to read; give a FILE, or "
        "pipe the request in; nothing was done\n"
    )


def test_a_huge_request_is_refused_without_being_read_whole(world: World) -> None:
    request = world.scratch / "req.json"
    with open(request, "wb") as sparse:
        sparse.truncate(100 * 1024**3)

    done = create(world, str(request))

    assert done.returncode == 1
    assert done.stderr.startswith(f"ctx: EFBIG: {request}: a request is at most 262144 bytes")


def test_a_source_through_another_uids_link_is_recorded_with_a_warning(
    world: World, traversable_tmp: Path
) -> None:
    """The agent's own directory holds a link it planted to a directory it cannot reach."""
    secret = traversable_tmp / "secret700"
    (secret / "inner").mkdir(parents=True)
    secret.chmod(0o700)
    planted = world.workspace / "proj"
    planted.symlink_to(secret / "inner")
    os.lchown(planted, world.user.uid, world.user.gid)
    plain = world.workspace / "plain"
    plain.mkdir()
    mounts = [[str(planted), "/project", "ro"], [str(plain), "/plain", "ro"]]
    request = world.scratch / "req.json"
    request.write_text(json.dumps({"name": "a3", "label": "a3_t", "mount": mounts}))

    done = create(world, str(request), "--json")

    assert done.returncode == 0, done.stderr
    warning = (
        f"the source {planted} of the mount at /project is recorded as {secret / 'inner'}: the "
        f"way there goes through the symbolic link {planted}, which uid {world.user.uid} owns"
    )
    linked = [line for line in json.loads(done.stdout)["warnings"] if "symbolic link" in line]
    assert len(linked) == 1 and linked[0].startswith(warning), linked
    assert f"ctx: warning: {warning}" in done.stderr
    recorded = json.loads((world.root / "agent" / "a3.d" / "mount").read_text())
    assert recorded[:2] == [[str(secret / "inner"), "/project", "ro"], [*mounts[1]]]


def test_links_of_the_creator_or_root_need_no_warning(world: World) -> None:
    own = world.scratch / "mine"
    own.symlink_to(world.workspace)
    request = world.scratch / "req.json"
    request.write_text(
        json.dumps({"name": "a4", "label": "a4_t", "mount": [[str(own), "/w", "ro"]]})
    )

    done = create(world, str(request))

    assert done.returncode == 0, done.stderr
    assert "symbolic link" not in done.stderr


def test_resolve_links_makes_the_real_path_realpath_makes(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "up").symlink_to("a/b/..")
    (tmp_path / "abs").symlink_to(tmp_path / "up")
    (tmp_path / "loop").symlink_to("loop")
    for path in ("abs/b", "up/missing/x", "loop/x", "a/b"):
        written = str(tmp_path / path)
        assert resolve_links(written)[0] == os.path.realpath(written), path
    _, links = resolve_links(str(tmp_path / "abs" / "b"))
    assert [link for link, _ in links] == [str(tmp_path / "abs"), str(tmp_path / "up")]
