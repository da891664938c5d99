"""``ctxmcp project --out`` where ``/ctx`` or the storage root does not exist yet (M-1).

What does not exist has no device and inode to compare, so OUT is judged by the path it
leads to as well: making OUT must never make ``/ctx`` or a root that ``ctx bootstrap`` would
later adopt as it found it.  The refusal comes before the server starts and before anything
is made (exit 2), and again before OUT is made, after the server ran (exit 1).
"""

from __future__ import annotations

import errno
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from cortexfs.errors import CtxError
from cortexfs.mcp.candidates import write_candidates
from cortexfs.mcp.project import project_tools
from tests.mcp.test_ctxmcp import RUNTIME_CONFIG, ctxmcp, scripted, tool

CTX = Path("/ctx")


def project(config: Path, out: Path, *extra: str, **env: str) -> tuple[int, str]:
    done = ctxmcp(
        "project", "--config", str(config), "--runtime-config", RUNTIME_CONFIG,
        "--server", "fake", "--out", str(out), *extra, env=env,
    )  # fmt: skip
    return done.returncode, done.stderr


@pytest.mark.skipif(CTX.exists() or os.geteuid() != 0, reason="needs a host without /ctx, as root")
def test_an_out_under_a_missing_ctx_is_refused_before_the_server_starts(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    config = scripted(tmp_path, record=str(record), tools=[tool("t")])

    try:
        status, stderr = project(config, CTX / "candidates", CTX_STORAGE=str(tmp_path / "st"))
    finally:
        made = CTX.exists()
        if made:
            (CTX / "candidates").rmdir()
            CTX.rmdir()

    assert status == 2, stderr
    assert stderr.startswith("ctxmcp: EINVAL: --out /ctx/candidates is inside /ctx: "), stderr
    assert "M-1" in stderr and "nothing was written" in stderr
    assert not made, "/ctx was made"
    assert not record.exists(), "the server was started"


@pytest.mark.parametrize("inside", ["", "tool", "tool/x"])
@pytest.mark.parametrize("named_by", ["CTX_STORAGE", "--storage"])
def test_an_out_inside_a_storage_root_not_yet_made_is_refused_and_nothing_made(
    tmp_path: Path, inside: str, named_by: str
) -> None:
    record = tmp_path / "record.jsonl"
    config = scripted(tmp_path, record=str(record), tools=[tool("t")])
    root = tmp_path / "newroot"
    out = root / inside if inside else root
    option = ["--storage", str(root)] if named_by == "--storage" else []
    environment = {"CTX_STORAGE": str(root)} if named_by == "CTX_STORAGE" else {}

    status, stderr = project(config, out, *option, **environment)

    assert status == 2, stderr
    assert stderr.startswith(f"ctxmcp: EINVAL: --out {out} is inside {root}: "), stderr
    assert not root.exists() and not record.exists()


def test_an_out_leading_into_a_missing_root_through_a_link_or_dotdot_is_refused(
    tmp_path: Path,
) -> None:
    config = scripted(tmp_path, tools=[tool("t")])
    root = tmp_path / "newroot"
    (tmp_path / "link").symlink_to(root)  # dangling: the root is not made yet

    for out in (tmp_path / "link" / "tool", tmp_path / "missing" / ".." / "newroot" / "tool"):
        status, stderr = project(config, out, "--storage", str(root))

        assert status == 2, stderr
        assert f"is inside {root}: " in stderr and "M-1" in stderr
        assert not root.exists() and not (tmp_path / "missing").exists()


def test_a_server_that_links_out_toward_a_missing_root_makes_nothing(tmp_path: Path) -> None:
    """The server runs as the caller between the two checks: it makes OUT's parent a link to
    where the root will be.  Nothing may be made there, and nothing is left behind."""
    root = tmp_path / "newroot"
    parent = tmp_path / "place"  # missing when checked; the server then makes it a link
    config = scripted(tmp_path, tools=[tool("t")], link=[str(root), str(parent)])

    status, stderr = project(config, parent / "out", "--storage", str(root))

    assert status == 1, stderr  # refused after the server ran: not a usage error
    assert stderr.startswith(f"ctxmcp: EINVAL: --out {parent / 'out'} is inside {root}: ")
    assert "nothing was written" in stderr
    assert not root.exists()


def test_write_candidates_refuses_by_name_before_it_makes_a_directory(tmp_path: Path) -> None:
    root = tmp_path / "newroot"
    projections = project_tools("fake", [tool("t")], RUNTIME_CONFIG)

    with pytest.raises(CtxError) as refused:
        write_candidates(projections, root / "tool" / "candidates", root=root)

    assert refused.value.errno == errno.EINVAL and "M-1" in refused.value.message
    assert not root.exists()


def test_the_directories_made_for_out_are_taken_back_when_nothing_is_written(
    tmp_path: Path,
) -> None:
    """A file size limit stands for a full disk: the candidate cannot be written once OUT is
    made, and what was made for it goes again, down to the directory that was there."""
    big = {"type": "object", "description": "z" * 200_000}
    config = scripted(tmp_path, tools=[tool("a"), tool("b", big)])
    out = tmp_path / "made" / "for" / "out"
    limit = 64 * 1024
    done = subprocess.run(
        [sys.executable, "-c", "from cortexfs.cli.ctxmcp import main; main()", "project",
         "--config", str(config), "--runtime-config", RUNTIME_CONFIG, "--server", "fake",
         "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
    )  # fmt: skip

    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("ctxmcp: EFBIG: ") and "nothing was written" in done.stderr
    assert not (tmp_path / "made").exists()
