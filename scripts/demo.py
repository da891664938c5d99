"""The main job: two real workers running a real tool, one killed in the middle of a job.

On the embedded default storage root (or $CTX_STORAGE), with the real command line:

1. ``ctx bootstrap``; an agent ``demo-runner`` that may run ``shell.exec`` (its policy and the
   tool's own policy both say so — the two layers of P-6);
2. ``ctx queue init`` and ``ctx queue publish --batch`` of shell.exec jobs, each recording
   when it starts, sleeping a little and printing its number;
3. two ``ctx queue work`` processes; one is SIGKILLed while its tool runs;
4. ``ctx queue recover`` requeues the killed worker's job, a last ``ctx queue work --drain``
   finishes the rest;
5. a summary checked against the disk: every job has exactly one terminal pair, the one
   interrupted job ran again, none ran after its finish was acknowledged, none was lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cortexfs import storage
from cortexfs.printable import shell_word
from cortexfs.timefmt import parse_rfc3339

PROJECT = "demo"
AGENT = "demo-runner"
LABEL = "demo_runner_t"
JOBS = 20
FAILING = {7}  # this job exits non-zero, to show the failed/ path
CTX = [sys.executable, "-m", "cortexfs"]


def ctx(*args: str, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the real command line, echoing it the way a user would type it."""
    print(f"$ ctx {' '.join(args)}", flush=True)
    done = subprocess.run([*CTX, *args], capture_output=True, text=True)
    if not quiet:
        for line in (done.stdout + done.stderr).splitlines()[:10]:
            print(f"  {line}")
    if check and done.returncode != 0:
        print(done.stderr, file=sys.stderr)
        raise SystemExit(f"demo: ctx {' '.join(args)} failed with exit status {done.returncode}")
    return done


def scratch_base() -> Path:
    """The one directory the demo agent may write, its only mount: each run makes its scratch
    directory below it.  A directory of this user's own, not all of /tmp: an agent that can
    write the storage root (a root under /tmp, a HOME there) could rewrite its own controls, and
    step 4 of the authority chain refuses every call such an agent makes."""
    base = Path(tempfile.gettempdir()) / f"cortexfs-demo-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        base.mkdir(mode=0o755)
    found = base.lstat()
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
        raise SystemExit(
            f"demo: EEXIST: {base} is not a directory of uid {os.geteuid()}; remove it, or set "
            "TMPDIR to a directory of your own"
        )
    return base


def prepare_agent(root: Path, scratch: Path, mount: list[str]) -> None:
    """Create the demo agent once; grant shell.exec in the tool's own policy once."""
    controls = root / "agent" / f"{AGENT}.d"
    if controls.is_dir() and mount not in json.loads((controls / "mount").read_text()):
        # An agent of an older demo that worked elsewhere: this demo owns it, so replace it.
        print(f"$ rm -r {root}/agent/{AGENT} {controls}   # a demo agent of an older version")
        (root / "agent" / AGENT).unlink(missing_ok=True)
        shutil.rmtree(controls)
    if not (root / "agent" / AGENT).exists():
        request = scratch / "agent.json"
        request.write_text(
            json.dumps(
                {
                    "name": AGENT,
                    "label": LABEL,
                    "model": [],
                    "tools": ["shell.exec"],
                    "shared": {PROJECT: ["read", "write"]},
                    "mount": [mount],
                }
            )
        )
        # No --user: ctx's default is this user's uid, for root 'nobody' (an agent never runs
        # as root), and it needs no user database entry, which a uid given by a container
        # runtime or setpriv may lack.
        ctx("agent", "create", str(request))
    tool_policy = root / "tool" / "shell.exec.d" / "policy"
    rule = f"allow {LABEL} tool:shell.exec execute"
    if rule not in tool_policy.read_text().splitlines():
        print(f"$ echo '{rule}' >> {shell_word(str(tool_policy))}   # the tool's own policy (P-6)")
        with open(tool_policy, "a", encoding="utf-8") as f:
            f.write(rule + "\n")


def job_command(n: int, starts: Path) -> str:
    status = 3 if n in FAILING else 0
    log = shell_word(str(starts))
    return f"echo {n} $(date +%s.%N) >> {log}; sleep 0.4; echo job {n}; exit {status}"


def spawn_worker(*extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CTX, "queue", "work", "--project", PROJECT, "--agent", AGENT, "--json", *extra],
        stdout=subprocess.PIPE,
        text=True,
    )


def main() -> int:
    try:
        return demonstrate()
    except KeyboardInterrupt:
        # The workers got the same Ctrl-C from the terminal and put back what they held.
        print(
            f"\ndemo: interrupted; the jobs it published stay in queue {PROJECT}, and the next "
            "demo finishes them first",
            file=sys.stderr,
        )
        return 130


def finish_what_an_earlier_demo_left(queue_dir: Path) -> None:
    """Jobs an interrupted demo left (pending, or held by its killed workers): run to their
    end first, so that this run's workers and its summary meet only this run's jobs."""
    left = [
        name
        for state in ("pending", "claimed")
        if (queue_dir / state).is_dir()
        for name in os.listdir(queue_dir / state)
    ]
    if not left:
        return
    print(f"finishing {len(left)} jobs an earlier, interrupted demo left")
    ctx("queue", "recover", "--project", PROJECT, "--grace", "0", quiet=True)
    ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain", quiet=True)
    print()


def demonstrate() -> int:
    root = storage.resolve_root(None)
    print(f"CortexFS demo on storage root {root}\n")
    ctx("bootstrap", quiet=True)
    queue_dir = root / "shared" / PROJECT / "queue"
    base = scratch_base()
    with tempfile.TemporaryDirectory(prefix="run-", dir=base) as scratch_name:
        scratch = Path(scratch_name)
        os.chmod(scratch, 0o777)  # the agent's uid records job starts here
        starts = scratch / "starts.log"
        starts.touch(mode=0o666)
        os.chmod(starts, 0o666)
        prepare_agent(root, scratch, [str(base), str(base), "rw"])
        ctx("queue", "init", "--project", PROJECT)
        finish_what_an_earlier_demo_left(queue_dir)
        batch = scratch / "jobs.jsonl"
        batch.write_text(
            "".join(
                json.dumps({"tool": "shell.exec", "input": {"cmd": job_command(n, starts)}}) + "\n"
                for n in range(JOBS)
            )
        )
        names = ctx("queue", "publish", "--project", PROJECT, "--batch", str(batch), quiet=True)
        jobs = names.stdout.split()
        print(f"  published {len(jobs)} shell.exec jobs\n")

        print("two workers start; one is killed with SIGKILL while its tool runs")
        victim, survivor = spawn_worker("--drain"), spawn_worker("--drain")
        killed = kill_during_a_job(victim, jobs, starts, queue_dir)
        survivor.communicate()
        print(f"  worker {survivor.pid} drained what it could and exited\n")

        ctx("queue", "status", "--project", PROJECT)
        ctx("queue", "recover", "--project", PROJECT)
        print()
        ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain")
        ctx("queue", "recover", "--project", PROJECT)
        time.sleep(0.5)  # let the killed worker's orphaned tool finish its sleep
        return summarise(queue_dir, jobs, starts, killed)


def kill_during_a_job(
    victim: subprocess.Popen[str], jobs: list[str], starts: Path, queue_dir: Path
) -> str | None:
    """SIGKILL ``victim`` once the tool of its third job of this run's batch has recorded its
    start: inside the 0.4 s it then sleeps.  The job it held, unfinished when it was killed
    (recover requeues it, and it runs again); None when none was (the other worker drained
    the queue before the victim's third claim, or a machine so slow that the job had
    finished before the kill)."""
    assert victim.stdout is not None
    claimed = 0
    for line in victim.stdout:
        event = json.loads(line)
        if event.get("event") != "claim" or event.get("job") not in jobs:
            continue
        claimed += 1
        if claimed < 3:
            continue
        job, number = event["job"], str(jobs.index(event["job"]))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and number not in started_numbers(starts):
            time.sleep(0.01)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
        if any(has_terminal_pair(queue_dir / state, job) for state in ("done", "failed")):
            print(f"  killed worker {victim.pid} after it finished {job}: nothing to recover")
            return None
        print(f"  killed worker {victim.pid} during job {number}, while its tool ran")
        return job
    victim.wait()
    print(f"  worker {victim.pid} ended before its third job: nothing to recover")
    return None


def started_numbers(starts: Path) -> set[str]:
    """The numbers of the jobs whose tool recorded its start (each start is a line)."""
    return {line.split()[0] for line in starts.read_text().splitlines() if line.strip()}


def has_terminal_pair(state_dir: Path, job: str) -> bool:
    return (state_dir / job).exists() and (state_dir / f"{job}.result").exists()


def summarise(queue_dir: Path, jobs: list[str], starts: Path, killed: str | None) -> int:
    """The table, checked against the disk: healthy when no job is lost, none ran after its
    finish was acknowledged, the failing job failed, and the only job that ran twice is the
    one the killed worker held."""
    started: dict[str, list[float]] = {}
    for line in starts.read_text().splitlines():
        n, when = line.split()
        started.setdefault(jobs[int(n)], []).append(float(when))  # --batch keeps input order
    terminal = {}
    for job in jobs:
        pairs = [s for s in ("done", "failed") if has_terminal_pair(queue_dir / s, job)]
        if len(pairs) == 1:
            terminal[job] = pairs[0]
    after_ack = 0
    for job, state in terminal.items():
        finished = json.loads((queue_dir / state / f"{job}.result").read_text())["finished"]
        acknowledged = parse_rfc3339(finished)
        after_ack += sum(1 for t in started.get(job, []) if t > acknowledged)
    rerun = sorted(j for j, times in started.items() if len(times) > 1)
    done = sum(1 for s in terminal.values() if s == "done")
    failed = sum(1 for s in terminal.values() if s == "failed")
    lost = len(jobs) - len(terminal)
    rows = [
        ("published", len(jobs)),
        ("done", done),
        ("failed (the job that exits 3)", failed),
        ("re-run after recovery", len(rerun)),
        ("executed after their finish was acknowledged", after_ack),
        ("lost", lost),
    ]
    print("\nsummary")
    print("  " + "-" * 58)
    for label, value in rows:
        print(f"  {label:<48}{value:>10}")
    print("  " + "-" * 58)
    expected_rerun = [killed] if killed is not None else []
    healthy = lost == 0 and after_ack == 0 and failed == len(FAILING) and rerun == expected_rerun
    print("  every published job finished exactly once" if healthy else "  FAILED")
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
