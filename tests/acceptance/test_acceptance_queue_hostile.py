"""§2 Q-8: what is not a job.  Illegal names, dot-files, symlinks and non-regular request or
lease files are never followed, opened through a link, executed or moved; ``status`` lists
them as ``ignored`` with a reason; a symlink swapped in for a queue directory cannot redirect
an operation outside the queue."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import QueueCLI, find_values, kill, request, snapshot

CALL_TIMEOUT = 20  # an implementation that opens a FIFO through a link would block here


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside the storage root, holding a valid-looking request and a FIFO."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "loot.req.json").write_text(json.dumps(request(tool="shell.exec")))
    os.mkfifo(out / "trap")
    return out


def plant_pending_junk(queue: QueueCLI, outside: Path) -> dict[str, str]:
    """Entries of ``pending/`` that are not jobs, by name, with what makes them so."""
    pending = queue.dir / "pending"
    os.symlink(outside / "loot.req.json", pending / "link-to-file.req.json")
    os.symlink(outside / "trap", pending / "link-to-fifo.req.json")
    os.mkfifo(pending / "fifo.req.json")
    (pending / "dir.req.json").mkdir()
    (pending / ".hidden.req.json").write_text(json.dumps(request()))
    (pending / "bad name.req.json").write_text(json.dumps(request()))
    (pending / "notes.txt").write_text(json.dumps(request()))
    return {
        "link-to-file.req.json": "symlink",
        "link-to-fifo.req.json": "symlink to a FIFO",
        "fifo.req.json": "FIFO",
        "dir.req.json": "directory",
        ".hidden.req.json": "dot-file",
        "bad name.req.json": "illegal name",
        "notes.txt": "no .req.json suffix",
    }


def gives_a_reason(line: str, name: str) -> bool:
    """Whether ``line`` says more than "ignored", the state directory and the name."""
    rest = line.replace(name, " ").replace("ignored", " ").replace("pending/", " ")
    return any(len(word) >= 3 for word in re.findall(r"[A-Za-z]+", rest))


def test_status_lists_every_non_job_in_pending_as_ignored_with_a_reason(queue, outside):
    """Q-8: ``status`` lists each non-job as ``ignored`` with the reason and counts no job.

    # reading: in text mode each ignored entry is named on a line that says ``ignored`` and
    # gives more than the name; in JSON each one is named inside a value under ``ignored``.
    """
    junk = plant_pending_junk(queue, outside)
    before = snapshot(queue.dir)

    text = queue.run("status", timeout=CALL_TIMEOUT)
    assert text.rc == 0, text
    for name in junk:
        lines = [line for line in text.lines() if name in line and "ignored" in line]
        assert lines, (name, text)
        assert any(gives_a_reason(line, name) for line in lines), (name, text)

    js = queue.run("status", "--json", timeout=CALL_TIMEOUT)
    assert js.rc == 0, js
    ignored = json.dumps(find_values(js.json(), "ignored"))
    for name in junk:
        assert json.dumps(name)[1:-1] in ignored, (name, js.out)
    assert snapshot(queue.dir) == before


def test_claim_takes_no_non_job_and_moves_nothing(queue, outside):
    """Q-8: with only non-jobs in ``pending/`` there is nothing to claim (exit 3); nothing is
    moved, and nothing outside the queue is touched."""
    plant_pending_junk(queue, outside)
    before, outside_before = snapshot(queue.dir), snapshot(outside)
    r = queue.run("claim", timeout=CALL_TIMEOUT)
    assert (r.rc, r.out) == (3, ""), r
    assert snapshot(queue.dir) == before
    assert snapshot(outside) == outside_before


def test_a_real_job_is_claimed_past_the_non_jobs(queue, outside):
    """Q-8: non-jobs do not hide real work: the one legal request is claimed."""
    plant_pending_junk(queue, outside)
    job = queue.drop("real")
    r = queue.run("claim", timeout=CALL_TIMEOUT)
    assert (r.rc, r.out) == (0, job + "\n"), r
    assert queue.state(job) == "claimed"
    assert os.path.islink(queue.dir / "pending" / "link-to-file.req.json")


def test_a_symlinked_lease_is_never_followed(queue, child, outside):
    """Q-8: a lease file that is a symlink is not lease evidence and is never opened through
    the link (here it points at a FIFO); status reports it, recover leaves the link alone."""
    job = queue.drop("linked-lease")
    assert queue.claim("--pid", str(child.pid)) == job
    kill(child)
    worker = queue.dir / "lease" / job / "worker"
    worker.unlink()
    os.symlink(outside / "trap", worker)
    outside_before = snapshot(outside)

    status = queue.run("status", timeout=CALL_TIMEOUT)
    assert status.rc in (0, 1), status
    assert f"lease/{job}/worker" in status.out, status
    queue.run("recover", "--reconcile", timeout=CALL_TIMEOUT)

    assert snapshot(outside) == outside_before
    links = [p for p in queue.dir.rglob("*") if p.is_symlink()]
    assert links in ([], [worker]), links
    if links:
        assert os.readlink(worker) == str(outside / "trap")
    assert not (queue.dir / "pending" / job).is_symlink()


def test_recover_never_moves_a_symlinked_request(queue, outside):
    """Q-8: ``claimed/J/J`` that is a symlink is not a claim: recover --reconcile neither moves it
    to pending nor touches its target."""
    job = "linked-claim.req.json"
    (queue.dir / "claimed" / job).mkdir()
    os.symlink(outside / "loot.req.json", queue.dir / "claimed" / job / job)
    outside_before = snapshot(outside)
    queue.run("recover", "--reconcile", timeout=CALL_TIMEOUT)
    assert queue.entries("pending") == set()
    assert os.path.islink(queue.dir / "claimed" / job / job)
    assert snapshot(outside) == outside_before


def test_entries_with_illegal_names_outside_pending_are_left_in_place(queue):
    """Q-8, I-5: a dot-file claim directory and an illegally named lease directory are not
    jobs: status lists them as ignored and recover --reconcile does not remove them (it deletes
    only the evidence Q-6 names)."""
    (queue.dir / "claimed" / ".x.req.json").mkdir()
    bad_lease = queue.dir / "lease" / "bad name.req.json"
    bad_lease.mkdir()
    (bad_lease / "worker").write_text("{}")
    before = snapshot(queue.dir)
    status = queue.run("status", "--json")
    ignored = json.dumps(find_values(status.json(), "ignored"))
    assert ".x.req.json" in ignored and "bad name.req.json" in ignored, status
    queue.run("recover", "--reconcile")
    assert snapshot(queue.dir) == before


@pytest.mark.parametrize(
    "swapped", ["pending-claim", "pending-publish", "claimed-claim", "done-finish"]
)
def test_a_symlink_swapped_in_for_a_queue_directory_cannot_redirect_an_operation(
    queue, tmp_path, swapped
):
    """Q-8: directory access does not follow a symlink swapped in for a state directory, so
    no operation reads from or writes to the directory it points at; the operation fails.

    # reading: failing is required ("cannot redirect"); claim may report it as exit 1 or as
    # nothing to claim (exit 3).
    """
    sub, op = swapped.split("-")
    job = None
    if sub == "done":
        job = queue.drop("finishing")
        assert queue.claim() == job
    elif sub == "claimed":
        job = queue.drop("waiting")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if sub == "pending":
        (elsewhere / "loot.req.json").write_text(json.dumps(request(tool="shell.exec")))
    real = queue.dir / sub
    real.rmdir()  # empty at this point
    os.symlink(elsewhere, real)
    elsewhere_before = snapshot(elsewhere)

    if op == "claim":
        r = queue.run("claim")
        assert r.rc in (1, 3), r
        assert queue.entries("lease") == set()
        if job:
            assert (queue.dir / "pending" / job).is_file()
    elif op == "publish":
        r = queue.run("publish", "--name", "redirected", "-", input=json.dumps(request()))
        assert r.rc == 1, r
    else:
        r = queue.run("finish", job, "--ok", "-", input="{}")
        assert r.rc == 1, r
        assert (queue.dir / "claimed" / job / job).is_file()
    assert snapshot(elsewhere) == elsewhere_before
    assert os.readlink(real) == str(elsewhere)


def dead_lease(job: str) -> dict:
    """A lease whose holder has exited: the same host and boot, a pid that is gone."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    now = time.time()
    return {
        "worker": "gone",
        "host": os.uname().nodename,
        "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        "pid_ns": os.stat("/proc/self/ns/pid").st_ino,
        "pid": proc.pid,
        "start_time": now - 5,
        "claimed_at": now - 5,
        "expires_at": now + 600,
        "job": job,
    }


def test_reconcile_reports_a_symlinked_lease_directory_and_moves_nothing(queue, outside):
    """Q-8, Q-6, I-5: ``lease/J`` a symlink to a directory outside the queue (holding a
    ``worker`` file) beside a real ``claimed/J/J``: the link is ignored with its reason, J is a
    conflict (its lease evidence is unusable), nothing moves, the run ends with exit 1 and a
    report, and a second run says the same."""
    job = queue.drop("held")
    (queue.dir / "claimed" / job).mkdir()
    os.rename(queue.dir / "pending" / job, queue.dir / "claimed" / job / job)
    (outside / "worker").write_text(json.dumps(dead_lease(job)))
    os.symlink(outside, queue.dir / "lease" / job)
    before, outside_before = snapshot(queue.dir), snapshot(outside)

    for _ in range(2):
        r = queue.run("recover", "--reconcile", "--grace", "0")
        assert r.rc == 1 and "Traceback" not in r.err and r.err == "", r
        assert f"conflict {job}" in r.out and f"ignored  lease/{job}: a symlink" in r.out, r
        assert snapshot(queue.dir) == before and snapshot(outside) == outside_before

    report = queue.run("recover", "--reconcile", "--json").json()
    assert [c["job"] for c in report["conflicts"]] == [job]
    assert f"lease/{job}" in report["conflicts"][0]["evidence"]
    assert {i["path"] for i in report["ignored"]} == {f"lease/{job}"}


def test_reconcile_carries_on_past_a_symlinked_claim_directory(queue, outside):
    """Q-8, Q-6: ``claimed/J`` a symlink plus a dead holder's ``lease/J/worker`` is a reported
    conflict, not a crash, and the other jobs of the same run are still repaired."""
    job = "linked.req.json"
    os.symlink(outside, queue.dir / "claimed" / job)
    (queue.dir / "lease" / job).mkdir()
    queue.write_lease(job, dead_lease(job))
    other = queue.drop("unleased")
    (queue.dir / "claimed" / other).mkdir()
    os.rename(queue.dir / "pending" / other, queue.dir / "claimed" / other / other)
    outside_before = snapshot(outside)

    r = queue.run("recover", "--reconcile", "--json")

    assert r.rc == 1 and r.err == "", r
    report = r.json()
    assert [c["job"] for c in report["conflicts"]] == [job]
    assert [(f["job"], f["applied"]) for f in report["repaired"]] == [(other, True)]
    assert queue.state(other) == "pending"
    assert os.readlink(queue.dir / "claimed" / job) == str(outside)
    assert (queue.dir / "lease" / job / "worker").is_file()
    assert snapshot(outside) == outside_before
    again = queue.run("recover", "--reconcile", "--json")
    assert again.rc == 1 and again.json()["repaired"] == [], again


def test_status_and_recover_list_ignored_entries_and_temps_in_a_stable_order(queue):
    """Directory by directory, then by path: not in the order the directory happens to hold."""
    for n in range(24):
        os.mkfifo(queue.dir / "pending" / f"f{n:02}.req.json")
        (queue.dir / "done" / f".dot{n:02}").write_text("")
        (queue.dir / "inbox" / f"t{n:02}.req.json.publish.tmp").write_text("")
    status = queue.run("status", "--json")
    assert status.rc == 0, status
    ignored = [entry["path"] for entry in status.json()["ignored"]]
    assert ignored == [f"pending/f{n:02}.req.json" for n in range(24)] + [
        f"done/.dot{n:02}" for n in range(24)
    ]
    temps = [temp["path"] for temp in status.json()["temps"]]
    assert temps == [f"inbox/t{n:02}.req.json.publish.tmp" for n in range(24)]
    recovered = queue.run("recover", "--json")
    assert [entry["path"] for entry in recovered.json()["ignored"]] == ignored
    listed = [line.split()[1] for line in queue.run("status").lines() if line.startswith("ignored")]
    assert listed == [str(len(ignored))] + [path + ":" for path in ignored]
