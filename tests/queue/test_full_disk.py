"""The queue commands on a full disk, through real ``ctx`` processes and real filesystems
(needs root to mount them): every refusal names the directory that refused and says what was
and was not done, and a batch the disk cuts short names, on stdout and in its JSON error,
the jobs it published, so that a retry publishes only the rest."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.cli import ctx
from tests.support.storage import small_tmpfs
from tests.support.storage import traversable_tmp as traversable_tmp

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a filesystem")


def fill(disk: Path) -> None:
    """Write one file until the filesystem has no block left (large writes, then small ones
    for what a large one no longer fits in)."""
    fd = os.open(disk / "fill", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 16, 1 << 10):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)
    assert os.statvfs(disk).f_bavail == 0


def request(n: int) -> str:
    return json.dumps({"tool": "fs.stat", "input": {"n": n}})


def tree(queue: Path) -> dict[str, list[str]]:
    states = ("inbox", "pending", "claimed", "lease", "done", "failed")
    return {state: sorted(os.listdir(queue / state)) for state in states}


# ------------------------------------------------------ a batch cut short by pending/'s growth


@pytest.fixture
def small_ext4(traversable_tmp: Path) -> Iterator[Path]:
    """A 4 MiB ext4 with 1 KiB blocks whose small files live in their inodes (inline_data):
    a full disk still takes requests in ``inbox/``, but a directory that needs a new block
    for one more name cannot grow."""
    image, disk = traversable_tmp / "ext4.img", traversable_tmp / "ext4"
    with open(image, "wb") as sparse:
        sparse.truncate(4 << 20)
    mkfs = ["mkfs.ext4", "-q", "-F", "-b", "1024", "-I", "256", "-m", "0", "-O", "inline_data"]
    if shutil.which("mkfs.ext4") is None or subprocess.run([*mkfs, str(image)]).returncode:
        pytest.skip("cannot make an ext4 filesystem with inline data here")
    disk.mkdir()
    if subprocess.run(["mount", "-o", "loop", str(image), str(disk)]).returncode:
        pytest.skip("cannot mount a loop device here")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def pending_full_after_a_few(root: Path, disk: Path) -> Path:
    """A queue on ``disk`` whose ``pending/`` holds 10 jobs in its one block, with room in that
    block for a few names more, and whose ``inbox/`` has room for many; then the disk is
    filled."""
    queue = disk / "queue"
    assert ctx(root, "queue", "init", "--queue", str(queue)).returncode == 0
    # ext4 never shrinks a directory: names made and removed leave inbox/ its blocks.
    for n in range(400):
        (queue / "inbox" / f"{n:040d}.publish.tmp").touch()
    for n in range(400):
        (queue / "inbox" / f"{n:040d}.publish.tmp").unlink()
    lines = "".join(request(n) + "\n" for n in range(10))
    assert ctx(root, "queue", "publish", "--queue", str(queue), "--batch", "-", stdin=lines).stdout
    fill(disk)
    return queue


def published_inputs(queue: Path) -> list[int]:
    return sorted(
        json.loads((queue / "pending" / j).read_text())["input"]["n"]
        for j in tree(queue)["pending"]
    )


def test_a_batch_cut_short_prints_what_it_published_and_names_the_lines_it_did_not(
    root: Path, small_ext4: Path
) -> None:
    queue = pending_full_after_a_few(root, small_ext4)
    batch = small_ext4.parent / "batch.jsonl"
    batch.write_text("".join(request(n) + "\n" for n in range(10, 30)))

    cut = ctx(root, "queue", "publish", "--queue", str(queue), "--batch", str(batch))

    assert cut.returncode == 1, cut
    printed = cut.stdout.splitlines()
    assert 0 < len(printed) < 20, cut  # published in part: the point of the test
    assert set(printed) <= set(tree(queue)["pending"]) and tree(queue)["inbox"] == []
    assert len(tree(queue)["pending"]) == 10 + len(printed)
    first_left = len(printed) + 1
    assert cut.stderr.startswith(
        f"ctx: ENOSPC: cannot publish the whole batch in queue {queue}: {queue}/pending refused: "
        "No space left on device (its filesystem has 0 bytes and "
    ), cut.stderr
    assert f"published: {', '.join(printed)} (pending, to be claimed: do not publish" in cut.stderr
    assert cut.stderr.endswith(
        f"; not published: lines {first_left}-20: free space on that filesystem, then publish "
        "those lines again, and only those\n"
    ), cut.stderr

    # As told: space freed, only those lines again.  Every request is then pending once.
    (small_ext4 / "fill").unlink()
    rest = "".join(batch.read_text().splitlines(keepends=True)[first_left - 1 :])
    again = ctx(root, "queue", "publish", "--queue", str(queue), "--batch", "-", stdin=rest)
    assert again.returncode == 0, again
    assert published_inputs(queue) == list(range(30))


def test_a_batch_cut_short_gives_its_lists_in_the_json_error(root: Path, small_ext4: Path) -> None:
    queue = pending_full_after_a_few(root, small_ext4)
    lines = "".join(request(n) + "\n\n" for n in range(10, 30))  # blank lines count as lines

    cut = ctx(
        root, "queue", "publish", "--queue", str(queue), "--batch", "--json", "-", stdin=lines
    )

    assert cut.returncode == 1, cut
    error = json.loads(cut.stdout)
    assert (error["error"], error["errno"]) == ("ENOSPC", 28)
    published, left = error["published"], error["not_published"]
    assert 0 < len(published) < 20 and len(published) + len(left) == 20
    assert set(published) <= set(tree(queue)["pending"]) and not set(left) & set(
        tree(queue)["pending"]
    )
    assert error["not_published_lines"] == [2 * n + 1 for n in range(len(published), 20)]
    assert cut.stderr == f"ctx: {error['error']}: {error['message']}\n"

    (small_ext4 / "fill").unlink()
    rest = "".join(lines.splitlines(keepends=True)[n - 1] for n in error["not_published_lines"])
    assert (
        ctx(root, "queue", "publish", "--queue", str(queue), "--batch", "-", stdin=rest).returncode
        == 0
    )
    assert published_inputs(queue) == list(range(30))


@contextlib.contextmanager
def standard_output(kind: str, disk: Path) -> Iterator[int]:
    """A standard output that refuses what is written: ``/dev/full``, a file on the disk the
    batch filled, or a pipe whose reader has already left."""
    if kind == "pipe":
        reader, writer = os.pipe()
        os.close(reader)
        try:
            yield writer
        finally:
            os.close(writer)
        return
    path = "/dev/full" if kind == "/dev/full" else disk / "names.txt"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        yield fd
    finally:
        os.close(fd)


@pytest.mark.parametrize("output", ["/dev/full", "file on the full disk", "pipe"])
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_batch_cut_short_says_what_it_did_not_publish_even_when_stdout_fails(
    root: Path, small_ext4: Path, output: str, as_json: bool
) -> None:
    """The names refused by stdout, the error still names the jobs published and the lines
    not, on stderr, and exits 1 (refused in part): not 74 or 141, which a whole batch whose
    output failed also gives, and after which the lines not published would be lost."""
    queue = pending_full_after_a_few(root, small_ext4)
    before = set(tree(queue)["pending"])
    batch = small_ext4.parent / "batch.jsonl"
    batch.write_text("".join(request(n) + "\n" for n in range(10, 30)))
    command = [sys.executable, "-m", "cortexfs", "queue", "publish", "--queue", str(queue)]
    command += ["--batch", *(["--json"] if as_json else []), str(batch)]

    with standard_output(output, small_ext4) as stdout:
        cut = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "CTX_STORAGE": str(root)},
            timeout=60,
        )

    assert cut.returncode == 1, cut.stderr
    published = sorted(set(tree(queue)["pending"]) - before)
    assert 0 < len(published) < 20  # published in part: the point of the test
    first_left = len(published) + 1
    assert cut.stderr.count("\n") == 1 and cut.stderr.startswith(
        f"ctx: ENOSPC: cannot publish the whole batch in queue {queue}: "
    ), cut.stderr
    named = cut.stderr.split("; published: ")[1].split(" (pending, to be claimed")[0]
    assert sorted(named.split(", ")) == published
    assert (
        f"; not published: lines {first_left}-20: free space on that filesystem, then publish "
        "those lines again, and only those" in cut.stderr
    ), cut.stderr
    if not as_json:
        assert cut.stderr.endswith("this message is their one whole list\n"), cut.stderr

    (small_ext4 / "fill").unlink()
    rest = "".join(batch.read_text().splitlines(keepends=True)[first_left - 1 :])
    again = ctx(root, "queue", "publish", "--queue", str(queue), "--batch", "-", stdin=rest)
    assert again.returncode == 0, again
    assert published_inputs(queue) == list(range(30))


# ---------------------------------------------- each transition at 0 bytes free: never bare


@contextlib.contextmanager
def queue_with_a_claim(
    root: Path, disk: Path, run_out: Callable[[Path], None]
) -> Iterator[tuple[Path, str, int]]:
    """A queue on ``disk`` with one job pending and one claimed by a live process, then the
    disk run out of room by ``run_out``: the queue, the claimed job and that process's pid."""
    queue = disk / "queue"
    assert ctx(root, "queue", "init", "--queue", str(queue)).returncode == 0
    for n in range(2):
        assert ctx(root, "queue", "publish", "--queue", str(queue), "-", stdin=request(n)).stdout
    holder = subprocess.Popen(["sleep", "600"])
    try:
        claimed = ctx(root, "queue", "claim", "--queue", str(queue), "--pid", str(holder.pid))
        assert claimed.returncode == 0, claimed
        run_out(disk)
        yield queue, claimed.stdout.strip(), holder.pid
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()


@pytest.fixture
def full_queue(root: Path, traversable_tmp: Path) -> Iterator[tuple[Path, str, int]]:
    """:func:`queue_with_a_claim` on a tmpfs with no byte left."""
    with (
        small_tmpfs(traversable_tmp / "disk", "1m") as disk,
        queue_with_a_claim(root, disk, fill) as made,
    ):
        yield made


def test_every_transition_refused_by_a_full_disk_names_the_directory_and_what_was_done(
    root: Path, full_queue: tuple[Path, str, int]
) -> None:
    queue, job, pid = full_queue
    before = tree(queue)
    lease = json.loads((queue / "lease" / job / "worker").read_text())
    waiting = before["pending"][0]
    refused_in = f"{queue}/inbox refused: No space left on device (its filesystem has 0 bytes"
    outcomes = {
        ("publish", "-"): "; nothing was published: free space on that filesystem, then "
        "publish again",
        ("publish", "--batch", "-"): "; nothing was published: free space on that filesystem, "
        "then publish again",
        ("claim",): f"; nothing was claimed (job {waiting} stays pending): free space on that "
        "filesystem, then claim again",
        ("renew", job, "--pid", str(pid)): f"; the lease on {job} is unchanged (it expires at "
        f"{lease['expires_at']}): free space on that filesystem, then renew it again",
        ("finish", job, "--ok", "-"): f"; job {job} stays claimed and no result of it was "
        "written: free space on that filesystem, then finish it again",
    }
    for args, outcome in outcomes.items():
        refused = ctx(root, "queue", *args[:1], "--queue", str(queue), *args[1:], stdin=request(9))

        assert refused.returncode == 1, refused
        assert refused.stdout == ""
        assert refused.stderr.startswith(f"ctx: ENOSPC: cannot {args[0]}"), refused.stderr
        assert refused_in in refused.stderr and refused.stderr.endswith(f"{outcome}\n"), refused
        assert tree(queue) == before


def fill_inodes(disk: Path) -> None:
    """Empty files until the filesystem has no inode left (and bytes to spare)."""
    (disk / "fill").mkdir()
    number = 0
    with contextlib.suppress(OSError):
        while True:
            (disk / "fill" / str(number)).touch()
            number += 1
    assert os.statvfs(disk).f_favail == 0 and os.statvfs(disk).f_bavail > 0


def test_a_disk_out_of_inodes_but_not_bytes_is_told_to_free_inodes(
    root: Path, traversable_tmp: Path
) -> None:
    """Told to free space, a user would delete big files, which frees no inode."""
    with (
        small_tmpfs(traversable_tmp / "disk", "8m,nr_inodes=200") as disk,
        queue_with_a_claim(root, disk, fill_inodes) as (queue, job, pid),
    ):
        before = tree(queue)
        for args in (
            ("publish", "-"),
            ("publish", "--batch", "-"),
            ("claim",),
            ("renew", job, "--pid", str(pid)),
            ("finish", job, "--ok", "-"),
        ):
            refused = ctx(
                root, "queue", *args[:1], "--queue", str(queue), *args[1:], stdin=request(9)
            )

            assert refused.returncode == 1 and refused.stdout == "", refused
            assert refused.stderr.startswith(f"ctx: ENOSPC: cannot {args[0]}"), refused
            assert "bytes and 0 inodes free); " in refused.stderr, refused.stderr
            assert ": free inodes on that filesystem (remove files there: bytes are left)" in (
                refused.stderr
            )
            assert "free space" not in refused.stderr
            assert tree(queue) == before
