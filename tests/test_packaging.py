"""What pip installs from a checkout: a wheel, as ``pip install .`` or a package index
builds it, not the editable install ``scripts/install`` makes, which reads the checkout itself
and so hides anything the build leaves out."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA_SUFFIXES = (".py", ".json", ".md")


def tracked_files() -> list[str]:
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True
    )
    return [name for name in listed.stdout.decode().split("\0") if name]


def test_a_wheel_of_the_checkout_carries_every_module_and_data_file(tmp_path: Path) -> None:
    """README install: every module of ``cortexfs/`` and every data file the package reads
    (core tool manifests, manual pages) is in the wheel built from the checkout's tracked
    files.  ``packages.find`` takes only directories with an ``__init__.py``: a directory
    of modules without one is left out, and an install from a wheel then fails the first
    command that imports it (``ctx mount`` did)."""
    source = tmp_path / "source"
    package_files = []
    for name in tracked_files():
        if not (REPO / name).is_file():
            continue  # removed in the working tree, not yet in git
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, source / name)
        if name.startswith("cortexfs/") and name.endswith(DATA_SUFFIXES):
            package_files.append(name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "wheel"),
         str(source)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "wheel").glob("cortexfs-*.whl")
    carried = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(name for name in package_files if name not in carried)
    assert len(package_files) > 100 and missing == [], missing
