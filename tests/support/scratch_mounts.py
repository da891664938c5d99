"""Real filesystems a test mounts below its scratch directory, and unmounts again."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest


class ScratchMounts:
    """The filesystems one test mounts below its scratch directory ``top``; :meth:`close`
    unmounts them in reverse order (lazily when a plain unmount fails) and removes ``top``.
    A mount the machine does not allow skips the test."""

    def __init__(self, top: Path) -> None:
        self.top = top
        self.mounted: list[Path] = []

    def _mount(self, argv: list[str], path: Path) -> Path:
        made = subprocess.run(argv, capture_output=True)
        if made.returncode != 0:
            pytest.skip(f"cannot mount here ({' '.join(argv)}): {made.stderr.decode().strip()}")
        self.mounted.append(path)
        return path

    def tmpfs(self, where: Path | str, options: str) -> Path:
        """A tmpfs mounted with ``options`` at ``where`` (relative to ``top``), made here."""
        path = self.top / where
        path.mkdir(parents=True, exist_ok=True)
        return self._mount(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], path)

    def bind(self, source: Path, where: Path | str) -> Path:
        """``source`` bind-mounted at ``where`` (relative to ``top``), made here."""
        path = self.top / where
        path.mkdir(parents=True, exist_ok=True)
        return self._mount(["mount", "--bind", str(source), str(path)], path)

    def bind_self(self, path: Path, options: str) -> Path:
        """``path`` bind-mounted on itself, that mount then remounted ``bind,OPTIONS``."""
        self._mount(["mount", "--bind", str(path), str(path)], path)
        self.remount(path, f"bind,{options}")
        return path

    def ext4(self, where: str, options: str, megabytes: int = 64) -> Path:
        """A fresh ext4 image below ``top``, loop-mounted with ``options`` at ``where``."""
        if shutil.which("mkfs.ext4") is None:
            pytest.skip("mkfs.ext4 is not installed")
        image = self.top / f"{where}.img"
        with open(image, "wb") as raw:
            raw.truncate(megabytes * 1024 * 1024)
        made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True)
        if made.returncode != 0:
            pytest.skip(f"mkfs.ext4 failed: {made.stderr.decode().strip()}")
        path = self.top / where
        path.mkdir()
        mounted = self._mount(["mount", "-o", f"loop,{options}", str(image), str(path)], path)
        mounted.chmod(0o755)
        return mounted

    def remount(self, path: Path, options: str, tries: int = 1) -> bool:
        """``mount -o remount,OPTIONS PATH``, tried up to ``tries`` times while the kernel
        says the mount is busy (a write under way); whether it took.  A single try that
        fails fails the test."""
        for _ in range(tries):
            done = subprocess.run(["mount", "-o", f"remount,{options}", str(path)],
                                  capture_output=True)  # fmt: skip
            if done.returncode == 0:
                return True
            time.sleep(0.005)
        if tries == 1:
            raise AssertionError(f"remount,{options} {path}: {done.stderr.decode()}")
        return False

    def unmount(self, path: Path) -> None:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)
        self.mounted.remove(path)

    def close(self) -> None:
        for path in reversed(list(self.mounted)):
            self.unmount(path)
        shutil.rmtree(self.top, ignore_errors=True)
