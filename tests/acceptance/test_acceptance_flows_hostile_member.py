"""A hostile member of a shared space's group (SPEC §2 Q-1..Q-8, §9 X-1, docs/queue.md "A
queue shared by a group" and "What is not a job"): a second real uid who may write in
``shared/<p>/queue/*`` plants FIFOs, symlinks, hard links, directories and forged leases
under the names of another member's jobs, and races the victims' commands.  The victims (the
other member and root, the administrator) drive the queue only through ``ctx queue``; they
must never be led through a link, never hang, never lose or run a job twice, and every
refusal names its errno and what to do."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, clean_env, snapshot
from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import (
    UnprivilegedUser,
    members_of,
    process_of,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as several users")

VICTIM, HOSTILE, GROUP = "ctxhm-v", "ctxhm-x", "ctxhm-g"
SPACE = "proj"
CALL = 20  # seconds: a command that opened a FIFO it was handed would block past this


@pytest.fixture(scope="module")
def people() -> tuple[UnprivilegedUser, UnprivilegedUser, int]:
    """The victim member, the hostile member and their group (system users kept for reruns)."""
    (victim, hostile), gid = members_of(GROUP, VICTIM, HOSTILE)
    return victim, hostile, gid


@dataclass
class World:
    storage: Path
    top: Path
    victim: UnprivilegedUser
    hostile: UnprivilegedUser
    gid: int

    @property
    def q(self) -> Path:
        return self.storage / "shared" / SPACE / "queue"

    def env(self, who: UnprivilegedUser | None) -> dict[str, str]:
        env = clean_env(CTX_STORAGE=str(self.storage))
        env = {k: v for k, v in env.items() if not k.startswith("XDG_")}
        name = who.name if who else "root"
        env.update(HOME="/nonexistent", XDG_CACHE_HOME=str(self.top / f"cache-{name}"))
        return env

    def run(
        self, who: UnprivilegedUser | None, argv: list[str], stdin: str = "", timeout: float = CALL
    ):
        """``argv`` as ``who`` (None: root), its groups from the group database, umask 022."""
        ids = {} if who is None else {"user": who.uid, "group": who.gid, "extra_groups": who.groups}
        return subprocess.run(argv, input=stdin, env=self.env(who), capture_output=True,
                              text=True, timeout=timeout, umask=0o022, cwd="/", **ids)  # fmt: skip

    def ctx(
        self, who: UnprivilegedUser | None, verb: str, *args: str, stdin: str = "", timeout=CALL
    ):
        return self.run(who, [*CTX_ARGV, "queue", verb, "-p", SPACE, *args], stdin, timeout)

    def publish(self, who: UnprivilegedUser | None, name: str, path: str = "/") -> str:
        req = json.dumps({"tool": "fs.stat", "input": {"path": path}})
        done = self.ctx(who, "publish", "--name", name, "-", stdin=req)
        assert done.returncode == 0, done
        return done.stdout.strip()

    def hostile_does(self, script: str, *args: str) -> subprocess.CompletedProcess:
        """A shell script run as the hostile member; it must succeed."""
        done = self.run(self.hostile, ["/bin/sh", "-ec", script, "sh", *map(str, args)])
        assert done.returncode == 0, done
        return done

    def status(self, who: UnprivilegedUser | None) -> dict:
        done = self.ctx(who, "status", "--json")
        assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done
        return json.loads(done.stdout)


@pytest.fixture
def world(traversable_tmp: Path, people) -> World:
    victim, hostile, gid = people
    storage = traversable_tmp / "storage"
    w = World(storage, traversable_tmp, victim, hostile, gid)
    for argv in (["bootstrap"], ["shared", "create", SPACE, "--group", GROUP]):
        made = w.run(None, [*CTX_ARGV, *argv])
        assert made.returncode == 0, made
    return w


def assert_refusal(done: subprocess.CompletedProcess, errno: str, *words: str) -> None:
    """Exit 1, one ``ctx: ERRNO: ...`` sentence, no traceback, and every word of ``words``."""
    assert done.returncode == 1, done
    assert done.stderr.startswith(f"ctx: {errno}: "), done.stderr
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in done.stderr, (word, done.stderr)


def result_output(w: World, state: str, job: str):
    return json.loads((w.q / state / f"{job}.result").read_text())["output"]


# ------------------------------------------------------------------------------ results


def test_fifo_symlink_and_directory_at_a_victims_result_names_never_hang_or_lead_away(world):
    """Q-4, Q-6, Q-8: while the victim works three claims, the hostile member plants a FIFO at
    ``done/J1.result``, a symlink to the victim's private notes at ``failed/J2.result`` and a
    directory at ``done/J3.result``.  Every ``finish`` is refused at once with EEXIST naming the
    kind and "nothing was changed"; status/list/show never block and call each a conflict;
    root's ``recover --reconcile`` moves none of them; nothing is read or written through the
    link.  Once the victim clears the planted entries its own finishes land, each job once."""
    w, v = world, world.victim
    notes = w.top / "victim-notes"
    notes.write_text("private\n")
    os.chown(notes, v.uid, v.gid)
    notes.chmod(0o600)
    jobs = [w.publish(v, name, f"/{name}") for name in ("j1", "j2", "j3")]
    with process_of(v) as holder:
        for job in jobs:
            claimed = w.ctx(v, "claim", "--pid", str(holder.pid))
            assert claimed.returncode == 0 and claimed.stdout == f"{job}\n", claimed
        j1, j2, j3 = jobs
        w.hostile_does('mkfifo "$1"; ln -s "$2" "$3"; mkdir "$4"',
                       w.q / "done" / f"{j1}.result", notes, w.q / "failed" / f"{j2}.result",
                       w.q / "done" / f"{j3}.result")  # fmt: skip
        before = snapshot(w.q)

        for job, flag, kind in ((j1, "--ok", "FIFO"), (j2, "--error", "symlink"),
                                (j3, "--ok", "directory")):  # fmt: skip
            refused = w.ctx(v, "finish", job, flag, "-", stdin='{"mine": 1}')
            assert_refusal(refused, "EEXIST", f"{job}.result", kind, "nothing was changed")
        for argv in (["status"], ["list"], ["show", j1], ["show", j2], ["show", j3]):
            looked = w.ctx(v, *argv)
            assert looked.returncode == 1 and "Traceback" not in looked.stderr, looked
        status = w.status(v)
        assert sorted(c["job"] for c in status["conflicts"]) == sorted(jobs), status
        ignored = {i["path"] for i in status["ignored"]}
        assert {f"done/{j1}.result", f"failed/{j2}.result", f"done/{j3}.result"} <= ignored
        assert "private" not in json.dumps(status)
        shown = w.ctx(v, "show", j2, "--json")
        assert "private" not in shown.stdout, shown
        reconciled = w.ctx(None, "recover", "--reconcile", "--grace", "0", "--json")
        assert reconciled.returncode == 1, reconciled
        report = json.loads(reconciled.stdout)
        assert sorted(c["job"] for c in report["conflicts"]) == sorted(jobs)
        assert report["requeued"] == [] and report["repaired"] == []
        assert snapshot(w.q) == before
        assert notes.read_text() == "private\n" and stat.S_IMODE(notes.stat().st_mode) == 0o600

        # The victim may clear what was planted in the group's directories, then finish.
        for planted in (f"done/{j1}.result", f"failed/{j2}.result"):
            os.unlink(w.q / planted)
        os.rmdir(w.q / "done" / f"{j3}.result")
        for job, flag in ((j1, "--ok"), (j2, "--error"), (j3, "--ok")):
            done = w.ctx(v, "finish", job, flag, "-", stdin=json.dumps({"by": job}))
            assert done.returncode == 0 and done.stdout == f"{job}\n", done
    assert result_output(w, "done", j1) == {"by": j1}
    assert result_output(w, "failed", j2) == {"by": j2}
    assert result_output(w, "done", j3) == {"by": j3}
    assert os.path.isfile(notes) and not os.path.islink(w.q / "failed" / f"{j2}.result")
    settled = w.ctx(None, "recover", "--reconcile", "--json")
    assert settled.returncode == 0 and json.loads(settled.stdout)["consistent"] is True, settled


def test_an_unreadable_result_planted_beside_a_live_claim_is_not_proof_the_job_ran(world):
    """Q-6, §2.1: the hostile member puts a sparse 3 GiB file at ``done/J.result`` of a job
    the victim holds.  ``show`` reports it unreadable (EFBIG) without reading it; the victim's
    finish is refused.  A result is one JSON object: a file no finish could have written
    proves nothing, so once the victim's holder is gone root's ``recover --reconcile`` must
    report a conflict and leave J claimed, never mark it done with that file as its result."""
    w, v = world, world.victim
    job = w.publish(v, "big")
    with process_of(v) as holder:
        assert w.ctx(v, "claim", "--pid", str(holder.pid)).stdout == f"{job}\n"
        w.hostile_does('truncate -s 3G "$1"', w.q / "done" / f"{job}.result")
        start = time.monotonic()
        shown = w.ctx(v, "show", job, "--json")
        assert time.monotonic() - start < 10 and len(shown.stdout) < 100_000, shown
        assert "EFBIG" in json.dumps(json.loads(shown.stdout)["result"]), shown.stdout
        refused = w.ctx(v, "finish", job, "--ok", "-", stdin='{"real": true}')
        assert_refusal(refused, "EEXIST", f"{job}.result", "nothing was changed")
    reconciled = w.ctx(None, "recover", "--reconcile", "--json")
    report = json.loads(reconciled.stdout)
    assert not (w.q / "done" / job).exists(), report
    assert [c["job"] for c in report["conflicts"]] == [job], report
    assert reconciled.returncode == 1


# ------------------------------------------------------------------------------ names


def test_blockers_planted_under_job_names_are_refused_reported_and_cleared(world):
    """Q-1, Q-2, Q-6, Q-8: the hostile member takes names ahead of the victim: an empty
    ``claimed/K`` (mode 0700) for the victim's pending K, an orphan ``lease/L`` naming the
    victim's own live process, a symlink ``inbox/M.publish.tmp`` to the victim's private
    file, and a dot-file ``pending/.N.req.json``.  Publishing L and M is refused with EEXIST
    saying what holds the name and what to do; K is a conflict the victim's claim passes over
    and the member's reconcile leaves; root's ``recover --reconcile --grace 0`` removes the
    leftover claim and unlinks the link (its target intact), and leaves the live holder's
    lease and the dot-file; then K and M are claimed once each, and L once its holder exits."""
    w, v = world, world.victim
    notes = w.top / "victim-notes"
    notes.write_text("private\n")
    os.chown(notes, v.uid, v.gid)
    notes.chmod(0o600)
    k = w.publish(v, "k")
    with process_of(v) as holder:
        now = time.time()
        lease = {"worker": "forged", "host": os.uname().nodename, "pid": holder.pid,
                 "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
                 "pid_ns": os.stat("/proc/self/ns/pid").st_ino,
                 "claimed_at": now, "expires_at": now + 3600}  # fmt: skip
        w.hostile_does(
            'mkdir "$1/claimed/k.req.json"; chmod 0700 "$1/claimed/k.req.json"\n'
            'mkdir "$1/lease/l.req.json"; printf "%s" "$2" > "$1/lease/l.req.json/worker"\n'
            'ln -s "$3" "$1/inbox/m.req.json.publish.tmp"\n'
            'printf "%s" "$4" > "$1/pending/.n.req.json"\n',
            w.q,
            json.dumps(lease),
            notes,
            json.dumps({"tool": "shell.exec", "input": {}}),
        )
        req = '{"tool": "fs.stat", "input": {}}'
        refused_l = w.ctx(v, "publish", "--name", "l", "-", stdin=req)
        assert_refusal(refused_l, "EEXIST", "l.req.json", "publish under another name")
        refused_m = w.ctx(v, "publish", "--name", "m", "-", stdin=req)
        assert_refusal(refused_m, "EEXIST", "inbox/m.req.json.publish.tmp",
                       "ctx queue recover --reconcile")  # fmt: skip
        nothing = w.ctx(v, "claim", "--pid", str(holder.pid))  # K is held, .n is no job
        assert (nothing.returncode, nothing.stdout) == (3, ""), nothing

        status = w.ctx(v, "status", "--json")
        assert status.returncode == 1, status
        report = json.loads(status.stdout)
        assert [c["job"] for c in report["conflicts"]] == [k], report
        assert "l.req.json" in {i["job"] for i in report["incomplete"]}, report
        assert [t["path"] for t in report["temps"]] == ["inbox/m.req.json.publish.tmp"]
        ignored = {i["path"]: i["reason"] for i in report["ignored"]}
        assert "EACCES" in ignored[f"claimed/{k}"] and "pending/.n.req.json" in ignored, ignored
        by_member = w.ctx(v, "recover", "--reconcile", "--grace", "0")
        assert by_member.returncode == 1 and f"conflict {k}" in by_member.stdout, by_member

        reconciled = w.ctx(None, "recover", "--reconcile", "--grace", "0")
        assert reconciled.returncode == 1, reconciled  # L stays: its named holder is alive
        assert "l.req.json" in reconciled.stdout and "lease holder alive" in reconciled.stdout
        assert not (w.q / "claimed" / k).exists()
        assert not os.path.lexists(w.q / "inbox" / "m.req.json.publish.tmp")
        assert (w.q / "lease" / "l.req.json" / "worker").is_file()
        assert (w.q / "pending" / ".n.req.json").is_file()
        assert notes.read_text() == "private\n"

        m = w.publish(v, "m")
        claims = [w.ctx(v, "claim", "--pid", str(holder.pid)).stdout.strip() for _ in range(3)]
        assert claims == [k, m, ""]
    gone = w.ctx(None, "recover", "--reconcile", "--json")  # the forged holder has exited
    report = json.loads(gone.stdout)
    assert "l.req.json" in json.dumps(report["repaired"]), report
    assert sorted(r["job"] for r in report["requeued"]) == [k, m]
    assert w.publish(v, "l") == "l.req.json"
    assert sorted(os.listdir(w.q / "pending")) == [".n.req.json", k, "l.req.json", m]


def test_a_temp_file_dated_in_the_future_does_not_hold_a_name_for_ever(world):
    """Q-1, Q-6: the hostile member leaves ``inbox/J.publish.tmp`` with an mtime in 2100.  The
    victim's publish is refused, naming ``recover --reconcile`` as the remedy once the grace
    period has passed; root runs exactly that with ``--grace 0``, and the victim can then
    publish J (the mtime is the member's to set; its ctime says how long it has been there)."""
    w, v = world, world.victim
    temp = w.q / "inbox" / "j.req.json.publish.tmp"
    w.hostile_does('echo x > "$1"; touch -d 2100-01-01 "$1"', temp)
    refused = w.ctx(v, "publish", "--name", "j", "-", stdin='{"tool":"fs.stat","input":{}}')
    assert_refusal(refused, "EEXIST", "inbox/j.req.json.publish.tmp", "grace period")
    temps = w.status(v)["temps"]
    assert [t["path"] for t in temps] == ["inbox/j.req.json.publish.tmp"]
    assert temps[0]["age_seconds"] >= 0, temps
    reconciled = w.ctx(None, "recover", "--reconcile", "--grace", "0", "--json")
    assert reconciled.returncode == 0, reconciled
    assert not os.path.lexists(temp), reconciled.stdout
    assert w.publish(v, "j") == "j.req.json"


def test_finish_and_renew_through_a_swapped_claim_or_lease_directory_say_what_and_where(world):
    """Q-8, Q-4, docs/queue.md (a claim whose lease is not a lease is refused naming the job and
    its evidence, and changes nothing): the hostile member moves the victim's ``lease/A`` and
    ``claimed/B`` aside and puts symlinks to a look-alike directory in their place.  The
    victim's ``finish`` and ``renew`` are refused (exit 1) without touching the decoy, and
    each refusal names the symlinked path and says nothing was changed, as ``show`` calls the
    job a conflict."""
    w, v = world, world.victim
    a, b = w.publish(v, "a"), w.publish(v, "b")
    outside = decoy(w, b)
    before = snapshot(outside)
    with process_of(v) as holder:
        for job in (a, b):
            assert w.ctx(v, "claim", "--pid", str(holder.pid)).stdout == f"{job}\n"
        w.hostile_does('mv "$1/lease/$2" "$1/lease/.$2"; ln -s "$4" "$1/lease/$2"\n'
                       'mv "$1/claimed/$3" "$1/claimed/.$3"; ln -s "$4" "$1/claimed/$3"',
                       w.q, a, b, outside)  # fmt: skip
        for job, where in ((a, f"lease/{a}"), (b, f"claimed/{b}")):
            assert json.loads(w.ctx(v, "show", job, "--json").stdout)["state"] == "conflict"
            for argv, stdin in ((["finish", job, "--ok", "-"], "{}"),
                                (["renew", job, "--pid", str(holder.pid)], "")):  # fmt: skip
                refused = w.ctx(v, *argv, stdin=stdin)
                assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused
                assert snapshot(outside) == before
                assert where in refused.stderr and "symlink" in refused.stderr, refused.stderr
                assert "nothing was changed" in refused.stderr, refused.stderr


# ------------------------------------------------------------------------------ links


def test_a_hard_link_of_a_live_claim_back_into_pending_never_runs_the_job_twice(world):
    """Q-2, Q-5, Q-6, I-3, I-4: the victim holds J; the hostile member hard-links
    ``claimed/J/J`` to ``pending/J`` (what a crash of a link-strategy claim leaves).  Another
    claim of the victim takes the next job, never J; root's reconcile leaves the live claim
    alone; the victim finishes J; J then stands both pending and done, a conflict that no claim
    ever takes again (exit 3), while the pending name still reads as the victim's request."""
    w, v = world, world.victim
    job, other = w.publish(v, "held", "/held"), w.publish(v, "next", "/next")
    with process_of(v) as holder:
        assert w.ctx(v, "claim", "--pid", str(holder.pid)).stdout == f"{job}\n"
        w.hostile_does('ln "$1" "$2"', w.q / "claimed" / job / job, w.q / "pending" / job)
        second = w.ctx(v, "claim", "--pid", str(holder.pid))
        assert second.returncode == 0 and second.stdout == f"{other}\n", second
        shown = json.loads(w.ctx(v, "show", job, "--json").stdout)
        assert shown["state"] in ("incomplete", "conflict") and shown["holder"]["state"] == "alive"
        by_root = w.ctx(None, "recover", "--reconcile", "--json")
        assert by_root.returncode == 1, by_root
        report = json.loads(by_root.stdout)
        assert report["requeued"] == [] and report["repaired"] == [], report
        assert (w.q / "claimed" / job / job).is_file() and (w.q / "lease" / job).is_dir()
        for j in (job, other):
            done = w.ctx(v, "finish", j, "--ok", "-", stdin=json.dumps({"ran": j}))
            assert done.returncode == 0, done
    for attempt in range(2):
        nothing = w.ctx(v, "claim", "--pid", "1")
        assert (nothing.returncode, nothing.stdout) == (3, ""), (attempt, nothing)
        assert w.ctx(None, "recover", "--reconcile").returncode == 1
    status = w.status(v)
    assert [c["job"] for c in status["conflicts"]] == [job], status
    assert "pending" in json.dumps(status["conflicts"]) and "done" in json.dumps(
        status["conflicts"]
    )
    assert result_output(w, "done", job) == {"ran": job}
    assert os.listdir(w.q / "claimed") == [] and os.listdir(w.q / "lease") == []


def test_a_lease_forged_into_another_pid_namespace_keeps_the_victims_job_claimed(world):
    """Q-3, Q-5: the hostile member rewrites the victim's live lease so it names a pid that is
    dead here but in another pid namespace, valid for an hour.  ``show`` judges the holder
    ``unknown`` (a pid alone is no proof across namespaces); neither root's ``recover`` nor
    ``--reconcile`` requeues the job, so it never runs twice; the victim still finishes it
    from its shell, and the queue is left consistent."""
    w, v = world, world.victim
    job = w.publish(v, "ns")
    with process_of(v) as holder:
        assert w.ctx(v, "claim", "--pid", str(holder.pid)).stdout == f"{job}\n"
    dead = subprocess.Popen(["true"])
    dead.wait()
    lease_file = w.q / "lease" / job / "worker"
    lease = json.loads(lease_file.read_text())
    lease.update(pid=dead.pid, pid_ns=lease["pid_ns"] + 7, expires_at=time.time() + 3600)
    forged = w.top / "forged.json"
    forged.write_text(json.dumps(lease))
    forged.chmod(0o644)
    w.hostile_does('cp "$1" "$2.new"; mv -f "$2.new" "$2"', forged, lease_file)

    shown = json.loads(w.ctx(v, "show", job, "--json").stdout)
    assert shown["holder"]["state"] == "unknown", shown["holder"]
    for args in ([], ["--reconcile"]):
        looked = w.ctx(None, "recover", *args, "--json")
        report = json.loads(looked.stdout)
        assert report["requeued"] == [] and report["repaired"] == [], report
        assert (w.q / "claimed" / job / job).is_file()
    assert w.ctx(v, "claim", "--pid", "1").returncode == 3
    done = w.ctx(v, "finish", job, "--ok", "-", stdin='{"once": true}')
    assert done.returncode == 0, done
    assert result_output(w, "done", job) == {"once": True}
    assert w.ctx(None, "recover", "--reconcile").returncode == 0


# ------------------------------------------------------------------------------ races

SWAPPER = r"""
import os, sys, time
target, seconds, reals = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
end = time.monotonic() + seconds
while time.monotonic() < end:
    for real in reals:
        aside = os.path.join(os.path.dirname(real), "." + os.path.basename(real) + ".aside")
        job, lease = os.path.basename(real), os.environ.get("REPLANT")
        queue = os.path.dirname(os.path.dirname(real))
        try:
            if lease and not os.path.lexists(real) and not os.path.lexists(aside):
                # requeued: claim it again by hand, with the same dead holder
                os.mkdir(real)
                os.rename(f"{queue}/pending/{job}", f"{real}/{job}")
                os.makedirs(f"{queue}/lease/{job}", exist_ok=True)
                open(f"{queue}/lease/{job}/worker", "w").write(lease)
            os.rename(real, aside)
            os.symlink(target, real)
            time.sleep(0.002 / len(reals))
            os.unlink(real)
            os.rename(aside, real)
        except OSError:
            pass
    time.sleep(0.001)
for real in reals:
    aside = os.path.join(os.path.dirname(real), "." + os.path.basename(real) + ".aside")
    if os.path.islink(real):
        os.unlink(real)
    if os.path.isdir(aside) and not os.path.lexists(real):
        os.rename(aside, real)
"""


def start_swapper(
    w: World, reals: list[Path], target: Path, seconds: float, replant: str = ""
) -> subprocess.Popen:
    """The hostile member swapping each of ``reals`` for a symlink to ``target`` and back,
    again and again, for ``seconds``; with ``replant`` (a lease), claiming by hand again,
    under that lease, each job of ``reals`` that was requeued."""
    argv = [sys.executable, "-c", SWAPPER, str(target), str(seconds), *map(str, reals)]
    env = {**w.env(w.hostile), "REPLANT": replant}
    return subprocess.Popen(argv, user=w.hostile.uid, group=w.hostile.gid,
                            extra_groups=w.hostile.groups, env=env)  # fmt: skip


def decoy(w: World, job: str) -> Path:
    """A directory outside the queue shaped like ``claimed/J`` and ``lease/J``, owned by the
    hostile member: a request and a worker file that must never move or change."""
    outside = w.top / "decoy"
    outside.mkdir()
    (outside / job).write_text(json.dumps({"tool": "shell.exec", "input": {"cmd": "id"}}))
    (outside / "worker").write_text('{"worker": "decoy"}')
    for path in (outside, outside / job, outside / "worker"):
        os.chown(path, w.hostile.uid, w.hostile.gid)
    return outside


def test_roots_reconcile_racing_a_claim_directory_swapped_for_a_link(world):
    """Q-5, Q-8, I-5, docs/queue.md (recover never stops at one job: what it cannot do is an
    ``error`` line): the hostile member leaves dead claims, claims each again by hand once it
    is requeued, and swaps each ``claimed/H`` for a symlink to a look-alike directory outside
    the queue and back, while root runs ``recover --reconcile`` again and again from two
    shells.  No run follows the link (the decoy is untouched and nothing of it reaches
    ``pending/``), none crashes: each exits 0 or 1 with a JSON report; once the swapping
    stops, each H is pending exactly once."""
    w, x = world, world.hostile
    jobs = [f"h{n:02}.req.json" for n in range(8)]
    dead = subprocess.Popen(["true"])
    dead.wait()
    lease = {"worker": "x", "host": os.uname().nodename, "pid": dead.pid,
             "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
             "pid_ns": os.stat("/proc/self/ns/pid").st_ino,
             "claimed_at": time.time() - 9, "expires_at": time.time() + 600}  # fmt: skip
    plant = (
        "import json, os, sys\n"
        "q, lease = sys.argv[1], sys.argv[2]\n"
        "for job in sys.argv[3:]:\n"
        "    os.mkdir(f'{q}/claimed/{job}'); os.mkdir(f'{q}/lease/{job}')\n"
        "    open(f'{q}/claimed/{job}/{job}', 'w').write(json.dumps("
        "{'tool': 'fs.stat', 'input': {'path': '/h'}}))\n"
        "    open(f'{q}/lease/{job}/worker', 'w').write(lease)\n"
    )
    planted = w.run(x, [sys.executable, "-c", plant, str(w.q), json.dumps(lease), *jobs])
    assert planted.returncode == 0, planted
    outside = decoy(w, jobs[0])
    before = snapshot(outside)
    runs: list[subprocess.CompletedProcess] = []
    claims = [w.q / "claimed" / job for job in jobs]
    swapper = start_swapper(w, claims, outside, 6.0, replant=json.dumps(lease))

    def reconcile_until_stopped() -> None:
        while swapper.poll() is None:
            run = w.ctx(None, "recover", "--reconcile", "--grace", "0", "--json")
            runs.append(run)
            if "Traceback" in run.stderr:
                swapper.kill()

    shells = [threading.Thread(target=reconcile_until_stopped) for _ in range(2)]
    try:
        for shell in shells:
            shell.start()
        for shell in shells:
            shell.join(timeout=60)
    finally:
        swapper.kill()
        swapper.wait(timeout=30)
    for job in jobs:  # undo a swap the kill cut short, as the hostile member would leave it
        aside = w.q / "claimed" / f".{job}.aside"
        if os.path.islink(w.q / "claimed" / job):
            os.unlink(w.q / "claimed" / job)
        if aside.is_dir():
            os.rename(aside, w.q / "claimed" / job)
    assert snapshot(outside) == before
    for name in os.listdir(w.q / "pending"):
        assert json.loads((w.q / "pending" / name).read_text())["input"] == {"path": "/h"}
    final = w.ctx(None, "recover", "--reconcile", "--json")
    assert final.returncode == 0, final
    assert sorted(os.listdir(w.q / "pending")) == jobs and os.listdir(w.q / "claimed") == []
    for run in runs:
        assert run.returncode in (0, 1) and "Traceback" not in run.stderr, run
        json.loads(run.stdout)


def test_victims_finishes_racing_lease_directories_swapped_for_links(world):
    """Q-4, Q-7, Q-8: the victim finishes three claims one after the other while the hostile
    member swaps each job's ``lease/J`` for a symlink to a directory holding a ``worker`` and
    back.  A finish never removes through the link (the decoy's worker stays), never hangs,
    and either lands or is refused with an errno; root's reconcile requeues none of them, and
    every job ends done once with the victim's output."""
    w, v = world, world.victim
    jobs = [w.publish(v, f"f{n}", f"/f{n}") for n in range(3)]
    outside = decoy(w, "unused.req.json")
    before = snapshot(outside)
    with process_of(v) as holder:
        for job in jobs:
            assert w.ctx(v, "claim", "--pid", str(holder.pid)).stdout == f"{job}\n"
        for job in jobs:
            swapper = start_swapper(w, [w.q / "lease" / job], outside, 0.7)
            try:
                time.sleep(0.05)
                done = w.ctx(v, "finish", job, "--ok", "-", stdin=json.dumps({"job": job}))
            finally:
                swapper.wait(timeout=30)
            assert "Traceback" not in done.stderr, done
            assert done.returncode == 0 or done.stderr.startswith("ctx: E"), done
        # Whatever a refused finish left (still claimed, or its terminal pair with a lease
        # left over), root's reconcile and one more finish of what is still claimed end it.
        reconciled = w.ctx(None, "recover", "--reconcile", "--json")
        assert reconciled.returncode in (0, 1) and "Traceback" not in reconciled.stderr
        assert json.loads(reconciled.stdout)["requeued"] == []
        for job in jobs:
            if (w.q / "claimed" / job / job).is_file():
                done = w.ctx(v, "finish", job, "--ok", "-", stdin=json.dumps({"job": job}))
                assert done.returncode == 0, done
    assert snapshot(outside) == before
    for job in jobs:
        assert result_output(w, "done", job) == {"job": job}
    assert os.listdir(w.q / "pending") == []
    settled = w.ctx(None, "recover", "--reconcile", "--json")
    assert settled.returncode == 0, settled
    assert os.listdir(w.q / "claimed") == [] and os.listdir(w.q / "lease") == []


# ------------------------------------------------------------------------------ wedges


def test_a_member_who_takes_the_victims_jobs_and_closes_them_cannot_wedge_the_others(world):
    """Q-5, Q-8, §2.4, docs/queue.md (refusals name who may and what to do): the hostile
    member claims two of the victim's jobs from a shell that exits, then takes the group's
    write bit off ``claimed/S`` and ``lease/S`` (``chmod g-w``) and closes ``claimed/H`` and
    ``lease/H`` altogether (0700); it keeps its own dead claim ``claimed/G`` locked with flock
    and makes its pending request 0600.  The victim's ``recover`` reports S as EACCES naming
    the directory, its owner and mode and what to do, lists H's directories as ignored
    (EACCES), leaves G to the lock holder and still requeues the victim's own dead claim; the
    victim's claim passes over the unreadable request with a note.  Root's recover returns S
    and H to pending, and the victim runs each once."""
    w, v, x = world, world.victim, world.hostile
    stolen, hidden = w.publish(v, "s", "/s"), w.publish(v, "h", "/h")
    locked = w.publish(x, "g", "/g")
    mine, secret = w.publish(v, "mine", "/mine"), w.publish(x, "secret", "/secret")
    shell_claim = ["/bin/sh", "-c", '"$@"; true', "sh", *CTX_ARGV, "queue", "claim", "-p", SPACE]
    for expected, who in ((stolen, x), (hidden, x), (locked, x), (mine, v)):
        claimed = w.run(who, shell_claim)
        assert claimed.stdout == f"{expected}\n", claimed
    w.hostile_does('chmod g-w "$1" "$2"; chmod 0700 "$3" "$4"; chmod 0600 "$5"',
                   w.q / "claimed" / stolen, w.q / "lease" / stolen, w.q / "claimed" / hidden,
                   w.q / "lease" / hidden, w.q / "pending" / secret)  # fmt: skip
    locker = subprocess.Popen(
        ["flock", str(w.q / "claimed" / locked), "sleep", "300"],
        user=x.uid, group=x.gid, extra_groups=x.groups, start_new_session=True,
    )  # fmt: skip
    try:
        assert wait_until(lambda: lock_held(w.q / "claimed" / locked))
        recovered = w.ctx(v, "recover")
        assert recovered.returncode == 1, recovered
        errors = [li for li in recovered.stdout.splitlines() if li.startswith("error")]
        assert len(errors) == 1 and f"{stolen}: EACCES" in errors[0], recovered.stdout
        assert f"may not write in {w.q / 'claimed' / stolen} (owner uid {x.uid}" in errors[0]
        assert "mode 2755" in errors[0] and "run it as root or as that owner" in errors[0]
        assert errors[0].endswith("left as it is"), errors[0]
        assert f"requeue  {mine}" in recovered.stdout, recovered.stdout
        report = json.loads(w.ctx(v, "recover", "--json").stdout)
        assert locked in json.dumps(report["untouched"]), report
        ignored = {i["path"]: i["reason"] for i in report["ignored"]}
        for path in (f"claimed/{hidden}", f"lease/{hidden}"):
            assert "EACCES" in ignored[path], ignored
        assert (w.q / "claimed" / locked / locked).is_file()

        with process_of(v) as holder:
            again = w.ctx(v, "claim", "--pid", str(holder.pid))
            assert again.returncode == 0 and again.stdout == f"{mine}\n", again
            skipped = w.ctx(v, "claim", "--pid", str(holder.pid))
            assert (skipped.returncode, skipped.stdout) == (3, ""), skipped
            assert skipped.stderr.startswith("ctx: note: ") and secret in skipped.stderr
            assert w.ctx(v, "finish", mine, "--ok").returncode == 0
        by_root = json.loads(w.ctx(None, "recover", "--json").stdout)
        assert sorted(r["job"] for r in by_root["requeued"]) == sorted([stolen, hidden])
        with process_of(v) as holder:
            for expected in (stolen, hidden):
                claimed = w.ctx(v, "claim", "--pid", str(holder.pid))
                assert claimed.stdout == f"{expected}\n", claimed
                done = w.ctx(v, "finish", expected, "--ok", "-", stdin=json.dumps({"j": expected}))
                assert done.returncode == 0, done
    finally:
        os.killpg(locker.pid, signal.SIGKILL)  # flock and the sleep that holds the lock
        locker.wait()
    for job in (mine, stolen, hidden):
        assert (w.q / "done" / f"{job}.result").is_file()
    assert sorted(os.listdir(w.q / "pending")) == [secret]
    assert os.listdir(w.q / "claimed") == [locked]


def lock_held(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


def wait_until(predicate, seconds: float = 10) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return False
