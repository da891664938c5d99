"""Tiers an install or a listing meets in an unexpected shape (SPEC T-8, T-8a): a file where
a tier's directory belongs, and ``shared/`` a user may search but not list."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from cortexfs import storage
from cortexfs.shared.spaces import create_shared_space
from tests.support.users import UnprivilegedUser, run_as

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]
MANIFEST = {
    "manifest": 2, "name": "in.the.way", "kind": "tool", "description": "A tool.",
    "schema": {"type": "object"}, "exec": "/bin/true", "cap": {},
}  # fmt: skip


def ctx(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CTX, "--storage", str(root), *argv], capture_output=True, text=True, timeout=60
    )


def test_a_file_where_a_tier_belongs_is_enotdir_naming_it_and_the_way_out(
    tmp_path: Path,
) -> None:
    root = tmp_path / "storage"
    storage.bootstrap(root)
    create_shared_space(root, "proj")
    tier = root / "shared" / "proj" / "tool"
    shutil.rmtree(tier)
    tier.write_text("notes\n")
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps(MANIFEST))

    refused = ctx(root, "object", "install", str(manifest), "--tier", "shared:proj")

    assert refused.returncode == 1, refused.stderr
    assert refused.stderr == (
        f"ctx: ENOTDIR: tier shared:proj: {tier} is not a directory; move it aside, then "
        f"create the directory with 'ctx shared create proj --storage {root}'\n"
    )
    assert tier.read_text() == "notes\n"
    tier.unlink()
    assert ctx(root, "shared", "create", "proj").returncode == 0
    assert ctx(root, "object", "install", str(manifest), "--tier", "shared:proj").returncode == 0


def test_a_listing_by_a_user_who_may_not_list_shared_leaves_the_spaces_out_with_a_note(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    root = traversable_tmp / "storage"
    storage.bootstrap(root)
    create_shared_space(root, "proj")
    (root / "shared").chmod(0o711)

    listed = run_as(unprivileged_user, [*CTX, "--storage", str(root), "object", "list", "--json"])

    assert listed.returncode == 0, listed.stderr
    assert "fs.read" in {entry["name"] for entry in json.loads(listed.stdout)}
    assert listed.stderr == (
        f"ctx: note: {root / 'shared'} cannot be listed by uid {unprivileged_user.uid} "
        "(Permission denied), so the tiers of its spaces are left out: name one with --tier "
        "shared:NAME\n"
    )
