"""Time of check against time of use: while a command works, another process swaps what the
command is about to use, in a loop of ``rename(2)`` calls (``renameat2`` with
``RENAME_EXCHANGE``, so that one of the two things is at the name at every moment; as fast
as it can, or every few milliseconds), and the command is run again and again (SPEC Q-8,
Q-6, I-1, T-1, T-2, T-6, T-8, T-8a, P-5, S-5, R-5, X-1; docs/queue.md "What is not a job",
docs/tools.md "A tool on disk", "How an install stays atomic", "How the manifest and its
program are read", "Hooks (T-6)", "Paths are confined", docs/policy.md "What the chain
reads", docs/sessions.md "Appending, crash-safely").

Who swaps is whoever may write the directory: the administrator (root) for a tool's
executable and controls and a queue's config, the agent's uid in its workspace and its home
sessions and in a manifest's directory it wrote, a member of a space's group in the space's
queue and data, the owner of a storage root in its ``tool/``, a user in their home.  The
swaps: a directory for a symbolic link to a directory outside the storage root, a file for
a link, a FIFO, a second name of another file or a file of another owner, a lease or a
request for a link to a file elsewhere.  On every run: nothing outside the intended area is read,
written, moved, regrouped or chmodded (canary files and directories outside the storage root
keep their bytes, mode, owner, group and mtime), no job is lost or doubled, a tool the chain
would refuse never runs, and every refusal is a ``ctx: ERRNO: ...`` sentence (or an error
object naming the errno), never a traceback or a hang."""

from __future__ import annotations

import contextlib
import grp
import json
import os
import select
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    requests_by_state,
    scratch_top,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, members_of, system_group_with

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="swaps as other uids: needs root")

SCRATCH = scratch_top(__file__)
NOBODY = 65534  # the uid root's agents get by default
AGENT, LABEL = "swapee", "swapee_t"
FS_TOOLS = ["fs.read", "fs.write", "fs.list", "fs.stat"]
PROBE = "probe"
GROUP, MEMBER = "ctxtoc-g", "ctxtoc-m"
OTHER_GROUP = "ctxtoc-h"
SPACE = "proj"
SWAP_SECONDS = 8.0  # the longest a swapper runs; it is stopped when its block ends
# Between two rounds of swaps: a few hundred rounds a second leave the commands swapped under
# most of the machine, and still put each state at each name many times per command.
PAUSE = 0.002
# For a window of tens of milliseconds (an interpreter's start): each state then lasts 10 to
# 70 ms, so that whatever the machine's speed, some calls start near the end of one state.
SLOW = 0.03
CALL = 30  # seconds: a command that opened a FIFO it was handed would block past this

# The swapper: exchanges the two names of each pair in turn (RENAME_EXCHANGE: at every moment
# one of the two things is at each name), or, for a pair whose second member is null, makes
# and removes a symbolic link at the first name (its target in "targets"), with a pause of
# random length after each pair so that the pairs change state at moments of their own.  It
# says "ready" after its first round, stops when the stop file appears or its time is up,
# swaps back every pair left exchanged, and prints what it did as one JSON object.
SWAPPER = r"""
import ctypes, json, os, random, sys, time
libc = ctypes.CDLL(None, use_errno=True)
spec = json.loads(sys.argv[1])
pairs, stop, deadline = spec["pairs"], spec["stop"], time.monotonic() + spec["seconds"]
targets = spec.get("targets", {})
AT, EXCHANGE = -100, 2
done = [0] * len(pairs)
dead = [False] * len(pairs)
errors = {}
def swap(i):
    a, b = pairs[i]
    if b is None:
        try:
            os.symlink(targets[a], a)
            os.unlink(a)
            done[i] += 2
        except OSError as exc:
            errors[exc.strerror] = errors.get(exc.strerror, 0) + 1
        return
    if libc.renameat2(AT, a.encode(), AT, b.encode(), EXCHANGE) == 0:
        done[i] += 1
    else:
        err = ctypes.get_errno()
        errors[os.strerror(err)] = errors.get(os.strerror(err), 0) + 1
        if err == 2:
            dead[i] = True
rounds = 0
pause = spec["pause"] / len(pairs)
while True:
    for i in range(len(pairs)):
        if not dead[i]:
            swap(i)
        if pause:
            time.sleep(pause * (0.25 + 1.5 * random.random()))
    rounds += 1
    if rounds == 1:
        print("ready", flush=True)
    if (pause or rounds % 16 == 0) and (os.path.exists(stop) or time.monotonic() > deadline):
        break
for i, (a, b) in enumerate(pairs):
    if b is not None and done[i] % 2 and not dead[i]:
        if libc.renameat2(AT, a.encode(), AT, b.encode(), EXCHANGE) == 0:
            done[i] += 1
print(json.dumps({"swaps": done, "errors": errors, "rounds": rounds}), flush=True)
"""


@dataclass
class Swapped:
    """What a swapper did, once it stopped: swaps per pair, errors met, rounds."""

    swaps: list[int] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    rounds: int = 0


@contextlib.contextmanager
def swapping(
    top: Path,
    pairs: list[tuple[Path, Path | None]],
    *,
    user: UnprivilegedUser | int | None = None,
    targets: dict[Path, Path] | None = None,
    pause: float = PAUSE,
) -> Iterator[Swapped]:
    """A swapper process (as ``user``: a test user, a bare uid, or root) exchanging each pair
    of ``pairs`` until the block ends, ``pause`` seconds between rounds (0: as fast as it
    can); the :class:`Swapped` it yields is filled in then."""
    stop = Path(new_scratch_dir(top, "stop-")) / "stop"
    spec = {
        "pairs": [[str(a), None if b is None else str(b)] for a, b in pairs],
        "targets": {str(k): str(v) for k, v in (targets or {}).items()},
        "stop": str(stop),
        "seconds": SWAP_SECONDS,
        "pause": pause,
    }
    ids: dict = {}
    if isinstance(user, UnprivilegedUser):
        ids = {"user": user.uid, "group": user.gid, "extra_groups": user.groups}
    elif isinstance(user, int):
        ids = {"user": user, "group": user, "extra_groups": []}
    proc = subprocess.Popen(
        [sys.executable, "-I", "-c", SWAPPER, json.dumps(spec)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/", **ids,
    )  # fmt: skip
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 20)
    line = proc.stdout.readline() if ready else ""
    if line.strip() != "ready":
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the swapper did not start: {line!r} {out!r} {err!r}")
    outcome = Swapped()
    try:
        yield outcome
    finally:
        stop.touch()
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        shutil.rmtree(stop.parent, ignore_errors=True)
    assert proc.returncode == 0, err
    report = json.loads(out.strip().splitlines()[-1])
    outcome.swaps, outcome.errors, outcome.rounds = (
        report["swaps"],
        report["errors"],
        report["rounds"],
    )


@dataclass
class Canary:
    """A file or directory outside the storage root: its bytes (a directory: its names),
    mode, owner, group and mtime as they were when watched."""

    path: Path
    seen: tuple = ()

    def look(self) -> tuple:
        st = os.lstat(self.path)
        if stat.S_ISDIR(st.st_mode):
            content: object = sorted(os.listdir(self.path))
        elif stat.S_ISREG(st.st_mode):
            content = self.path.read_bytes()
        else:
            content = None
        kind = stat.S_IFMT(st.st_mode)
        return (kind, content, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_mtime_ns)

    def __post_init__(self) -> None:
        self.seen = self.look()

    def unchanged(self) -> bool:
        return self.look() == self.seen


def canary_file(path: Path, text: str, *, mode: int = 0o644, uid: int = 0, gid: int = 0) -> Canary:
    path.write_text(text)
    os.chown(path, uid, gid)
    path.chmod(mode)
    return Canary(path)


def _streams(done: subprocess.CompletedProcess | Run) -> tuple[str, str]:
    if isinstance(done, Run):
        return done.out, done.err
    return done.stdout, done.stderr


def no_traceback(done: subprocess.CompletedProcess | Run) -> None:
    out, err = _streams(done)
    assert "Traceback" not in err and "Traceback" not in out, done


def errno_sentence(done: subprocess.CompletedProcess | Run) -> str:
    """The errno of a refusal: ``ctx: ERRNO: ...`` on stderr (the last such line)."""
    lines = [line for line in _streams(done)[1].splitlines() if line.startswith("ctx: E")]
    assert lines, done
    word = lines[-1].split(":")[1].strip()
    assert word.isupper() and word.startswith("E"), done
    return word


def grp_gid(name: str) -> int:
    return grp.getgrnam(name).gr_gid


def give(path: Path, uid: int, gid: int | None = None) -> Path:
    os.chown(path, uid, uid if gid is None else gid, follow_symlinks=False)
    return path


def link_as(link: Path, target: Path, uid: int, gid: int | None = None) -> Path:
    """A symbolic link ``link`` -> ``target``, owned by ``uid`` (who swaps it in)."""
    link.symlink_to(target)
    return give(link, uid, gid)


# --------------------------------------------------------------------------- tools and calls


def probe_program(tag: str) -> str:
    """A shell tool that says which version ran, and as which uid."""
    body = """printf '{"ran": "%s", "uid": %s}\\n' TAG "$(id -u)"\n"""
    return "#!/bin/sh\ncat >/dev/null\n" + body.replace("TAG", tag)


@dataclass
class Tools(OnStorage):
    """A bootstrapped root in a scratch directory every uid may search, agent ``swapee``
    (uid nobody) with ``ws`` mounted read-write at /workspace, allowed the fs.* tools and the
    test tool ``probe`` in both layers of P-6; ``out``: outside the root and every mount."""

    top: Path
    storage: Path
    ws: Path
    out: Path

    def native(
        self, tool: str, value: dict, *args: str
    ) -> tuple[subprocess.CompletedProcess, dict]:
        argv = [*CTX_ARGV, "run", "--agent", AGENT, "--native", *args, tool]
        done = subprocess.run(argv, env=self.env, input=json.dumps(value), capture_output=True,
                              text=True, timeout=CALL)  # fmt: skip
        no_traceback(done)
        frames = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
        results = [f for f in frames if f.get("type") == "result"]
        assert len(results) == 1, done
        return done, results[0]

    @property
    def probe(self) -> Path:
        return self.storage / "tool" / PROBE

    @property
    def controls(self) -> Path:
        return self.storage / "tool" / f"{PROBE}.d"

    def install_probe(self, tag: str = "good", program: str | None = None) -> None:
        src = new_scratch_dir(self.top, "manifest-")
        (src / "probe.sh").write_text(program or probe_program(tag))
        document = {
            "manifest": 2, "kind": "tool", "name": PROBE, "description": "a probe",
            "schema": {"type": "object"},
            "cap": {"side_effects": False, "network": False}, "exec": "probe.sh",
        }  # fmt: skip
        (src / "probe.json").write_text(json.dumps(document))
        r = self.ctx("object", "install", src / "probe.json", "--tier", "system")
        assert r.rc == 0, r


def ran(frame: dict) -> str | None:
    """Which probe program ran in a call, None when none did."""
    output = frame.get("output")
    return output.get("ran") if isinstance(output, dict) else None


def error_word(frame: dict) -> str | None:
    return (frame.get("error") or {}).get("error")


@pytest.fixture
def tools(_template: Path) -> Iterator[Tools]:
    top = new_scratch_dir(SCRATCH, "tools-")
    try:
        storage = copy_of_root(_template, top / "storage")
        ws = top / "ws"
        ws.mkdir(mode=0o755)
        give(ws, NOBODY)
        out = new_scratch_dir(top, "out-")
        w = Tools(top, storage, ws, out)
        w.create_agent({"name": AGENT, "label": LABEL, "tools": [*FS_TOOLS, PROBE],
                        "mount": [[str(ws), "/workspace", "rw"]]})  # fmt: skip
        w.install_probe()
        w.allow_tool(LABEL, *FS_TOOLS, PROBE)
        yield w
    finally:
        shutil.rmtree(top, ignore_errors=True)


PYTHON_PROBE = """#!/usr/bin/python3 -I
import json, sys
sys.stdin.read()
print(json.dumps({"ran": "%s"}))
"""


@pytest.mark.xfail(
    strict=True,
    reason="P-5: the runner judges tool/NAME and then starts it by its path, and the script's "
    "#! interpreter opens the path again: a file of the agent's that the tier's writer swaps "
    "in meanwhile runs (step 6 refuses it whenever it is looked at), a FIFO swapped in holds "
    "the call until its timeout; a documented limit (docs/tools.md: change a tool through "
    "ctx object install, not by hand while it is called)",
)
@pytest.mark.parametrize("other", ["a file the agent owns", "a FIFO"])
def test_an_executable_swapped_after_the_chain_judged_it_never_runs(tools: Tools, other: str):
    """T-1, P-5 step 6, docs/tools.md ("The executable ... belong to the host"; an executable
    that is not an executable file makes the tool damaged): the administrator reinstalls
    probe as a Python script and then swaps tool/probe, every few milliseconds, with a
    script of the agent's uid (mode 0755) or with a FIFO, while the agent calls it: each
    call runs the host's program or is refused at once (EACCES at step 6, ENOEXEC, EAGAIN),
    never runs the agent's program, never waits on the FIFO."""
    tools.install_probe(program=PYTHON_PROBE % "good")
    partner = tools.out / "other"
    if other == "a FIFO":
        os.mkfifo(partner)
        partner.chmod(0o755)
    else:
        partner.write_text(PYTHON_PROBE % "other")
        partner.chmod(0o755)
        give(partner, NOBODY)
    frames = []
    with swapping(tools.top, [(tools.probe, partner)], pause=SLOW) as swapped:
        for _ in range(60):
            started = time.monotonic()
            _, frame = tools.native(PROBE, {}, "--timeout", "2")
            frames.append((frame, time.monotonic() - started))
            if ran(frame) == "other" or error_word(frame) == "ETIMEDOUT":
                break
    assert swapped.swaps[0] > 0
    outcomes = [(ran(f), error_word(f), round(t, 1)) for f, t in frames]
    assert all(
        r == "good" or e in ("EACCES", "ENOEXEC", "EAGAIN", "ENOENT") for r, e, _ in outcomes
    ), outcomes


GUARD = """#!/usr/bin/python3 -I
import sys
sys.stdin.read()
%s
"""


@pytest.mark.xfail(
    strict=True,
    reason="T-6: hooks/pre.d (or post.d) swapped by the tier's writer for a symbolic link "
    "between the runner's look at a hook and the moment the hook's interpreter opens it runs "
    "the hook of that name in the link's target (hooks are started by path); a documented "
    "limit (docs/tools.md: change a tool through ctx object install, not by hand)",
)
@pytest.mark.parametrize("phase", ["pre.d", "post.d"])
def test_a_hook_directory_swapped_for_a_link_never_runs_a_hook_from_outside(tools: Tools, phase):
    """T-6, docs/tools.md "Hooks (T-6)": ``hooks/``, ``pre.d/`` and ``post.d/`` are opened
    without following links and a link in their place makes the tool damaged; no hook is
    taken from outside the directory.  The hook directory holds hooks of root's (in pre.d a
    guard that vetoes every call; in post.d 30 hooks that pass); a directory outside holds
    hooks of the same names that pass and leave a mark; the administrator swaps the hook
    directory with a link to that directory every few milliseconds while the agent calls
    the tool: no outside hook ever runs, no vetoed call runs the tool, and each call is
    refused (the veto, or ENOEXEC for a link in the directory's place) or, with post.d,
    runs."""
    real = tools.controls / "hooks" / phase
    outside = tools.out / "hooks"
    outside.mkdir()
    marks = new_scratch_dir(tools.top, "marks-")
    marks.chmod(0o777)
    for n in range(1 if phase == "pre.d" else 30):
        hook = real / f"h{n:02d}"
        hook.write_text(GUARD % ("sys.exit('vetoed')" if phase == "pre.d" else ""))
        hook.chmod(0o755)
        bad = outside / f"h{n:02d}"
        bad.write_text(GUARD % f"open({str(marks / f'h{n:02d}')!r}, 'w').close()")
        bad.chmod(0o755)
    link = tools.out / "link"
    link.symlink_to(outside)
    frames = []
    with swapping(tools.top, [(real, link)], pause=SLOW) as swapped:
        for _ in range(30):
            _, frame = tools.native(PROBE, {})
            frames.append(frame)
            if os.listdir(marks) or (phase == "pre.d" and ran(frame)):
                break
    assert swapped.swaps[0] > 0
    assert real.is_dir() and not real.is_symlink()
    assert os.listdir(marks) == [], sorted(os.listdir(marks))
    allowed = {"ENOEXEC", "EAGAIN", "EACCES"} if phase == "pre.d" else {"ENOEXEC", "EAGAIN"}
    assert all((phase == "post.d" and ran(f) == "good") or error_word(f) in allowed
               for f in frames), [(ran(f), error_word(f)) for f in frames]  # fmt: skip


# --------------------------------------------------------------------------- a space's queue


@dataclass
class Space:
    """A bootstrapped root every uid may search, holding space ``proj`` of group ``ctxtoc-g``
    (``ctx shared create``), whose member ``ctxtoc-m`` swaps things; the administrator (root)
    works the queue.  ``mine``: a directory of the member's outside the root; ``out``: one of
    root's outside the root, for canaries."""

    top: Path
    storage: Path
    member: UnprivilegedUser
    gid: int
    mine: Path
    out: Path
    holder: subprocess.Popen

    @property
    def env(self) -> dict[str, str]:
        env = clean_env(CTX_STORAGE=str(self.storage))
        env["XDG_CACHE_HOME"] = str(self.top / "cache")
        return env

    @property
    def space(self) -> Path:
        return self.storage / "shared" / SPACE

    @property
    def q(self) -> Path:
        return self.space / "queue"

    def run(self, *args: str | os.PathLike, stdin: str = "") -> subprocess.CompletedProcess:
        """``ctx ARGS`` as root, the administrator (umask 022)."""
        done = subprocess.run([*CTX_ARGV, *map(str, args)], input=stdin, env=self.env,
                              capture_output=True, text=True, timeout=CALL, cwd="/",
                              umask=0o022)  # fmt: skip
        no_traceback(done)
        return done

    def queue(self, verb: str, *args: str | os.PathLike, stdin: str = ""):
        return self.run("queue", verb, "--project", SPACE, *args, stdin=stdin)

    def publish(self, count: int, prefix: str = "j") -> list[str]:
        lines = "".join(
            json.dumps({"tool": "fs.stat", "input": {"path": "/"}, "n": f"{prefix}{n:02d}"}) + "\n"
            for n in range(count)
        )
        done = self.queue("publish", "--batch", "-", stdin=lines)
        assert done.returncode == 0, done
        jobs = done.stdout.split()
        assert len(jobs) == count, done
        return jobs

    def claim_all(self, count: int) -> list[str]:
        jobs = []
        for _ in range(count):
            done = self.queue("claim", "--pid", str(self.holder.pid))
            assert done.returncode == 0, done
            jobs.append(done.stdout.strip())
        return jobs

    def claims_swapped_for_links(self, jobs: list[str]) -> tuple[list, list]:
        """For each job, a directory of root's outside the root holding a canary file named
        like the job, and the pair (``claimed/J``, a member's link to that directory) to
        swap: the canaries to check, and the pairs."""
        canaries, pairs = [], []
        for n, job in enumerate(jobs):
            outside = self.out / f"c{n:02d}"
            outside.mkdir()
            canaries.append(canary_file(outside / job, f"canary {n}\n"))
            canaries.append(Canary(outside))
            pairs.append((self.q / "claimed" / job, self.link_of_member(f"l{n:02d}", outside)))
        return canaries, pairs

    def link_of_member(self, name: str, target: Path) -> Path:
        """A symbolic link of the member's, in its own directory, to ``target``."""
        link = self.mine / name
        link.symlink_to(target)
        give(link, self.member.uid, self.member.gid)
        return link


@pytest.fixture(scope="module")
def member() -> tuple[UnprivilegedUser, int]:
    """The member, in the space's group and in a second group the space may be given."""
    (user,), gid = members_of(GROUP, MEMBER)
    system_group_with(OTHER_GROUP, [MEMBER])
    return user, gid


@pytest.fixture
def space(_template: Path, member) -> Iterator[Space]:
    user, gid = member
    top = new_scratch_dir(SCRATCH, "space-")
    holder = subprocess.Popen(["sleep", "300"])
    try:
        storage = copy_of_root(_template, top / "storage")
        mine = new_scratch_dir(top, "mine-")
        give(mine, user.uid, user.gid)
        out = new_scratch_dir(top, "out-")
        w = Space(top, storage, user, gid, mine, out, holder)
        done = w.run("shared", "create", SPACE, "--group", GROUP)
        assert done.returncode == 0, done
        yield w
    finally:
        holder.kill()
        holder.wait()
        shutil.rmtree(top, ignore_errors=True)


def settled_once_each(space: Space, jobs: list[str]) -> dict[str, list[str]]:
    """With the lease holder gone, ``recover --reconcile`` (twice); then where each job's
    request is: each of ``jobs`` must be in exactly one state (I-1), and no other job exists."""
    space.holder.kill()
    space.holder.wait()
    for _ in range(2):
        done = space.queue("recover", "--reconcile", "--grace", "0")
        assert done.returncode in (0, 1), done
    seen = requests_by_state(space.q)
    assert sorted(seen) == sorted(jobs), seen
    assert all(len(states) == 1 for states in seen.values()), seen
    return seen


def refusal_or_success(done: subprocess.CompletedProcess, *codes: int, job: str = "") -> str | None:
    """None for exit 0; else the exit status must be one of ``codes`` and come with a
    ``ctx: ERRNO:`` sentence (naming ``job``), whose errno is returned."""
    if done.returncode == 0:
        return None
    assert done.returncode in codes, done
    assert job in done.stderr, done
    return errno_sentence(done)


def test_finish_never_moves_a_request_out_of_a_claim_swapped_for_a_link(space: Space):
    """Q-4, Q-8: while a member swaps each ``claimed/J`` with a link (of theirs) to a
    directory of root's outside the root that holds a file named J, root finishes every job:
    the file outside is never moved into ``done/`` nor removed, the directory's entries and
    modes stay as they were, and each finish either completes with J's own request or is
    refused with an errno."""
    jobs = space.publish(10)
    assert space.claim_all(10) == jobs
    canaries, pairs = space.claims_swapped_for_links(jobs)
    with swapping(space.top, pairs, user=space.member) as swapped:
        for job in jobs:
            done = space.queue("finish", job, "--ok", "-", stdin='{"answer": 1}')
            refusal_or_success(done, 1, job=job)
    assert sum(swapped.swaps) > 0
    assert [c.path for c in canaries if not c.unchanged()] == []
    for name in os.listdir(space.q / "done"):
        if not name.endswith(".result"):
            assert b"canary" not in (space.q / "done" / name).read_bytes(), name
    assert {s for (s,) in settled_once_each(space, jobs).values()} <= {"done", "pending"}


def test_finish_never_removes_a_lease_through_a_lease_directory_swapped_for_a_link(space: Space):
    """Q-4, Q-8: a member swaps each ``lease/J`` with a link to a directory of root's outside
    the root holding a ``worker`` file that reads like J's lease; root finishes every job:
    the outside ``worker`` files stay (finish removes ``lease/J/worker`` only through the
    real directory), and no finish reports success without J's terminal pair in place."""
    jobs = space.publish(10)
    assert space.claim_all(10) == jobs
    canaries, pairs = [], []
    for n, job in enumerate(jobs):
        outside = space.out / f"c{n:02d}"
        outside.mkdir()
        lease = (space.q / "lease" / job / "worker").read_text()
        canaries.append(canary_file(outside / "worker", lease))
        canaries.append(Canary(outside))
        pairs.append((space.q / "lease" / job, space.link_of_member(f"l{n:02d}", outside)))
    outcomes = {}
    with swapping(space.top, pairs, user=space.member) as swapped:
        for job in jobs:
            done = space.queue("finish", job, "--ok", "-", stdin='{"answer": 1}')
            outcomes[job] = refusal_or_success(done, 1, job=job)
    assert sum(swapped.swaps) > 0
    assert [c.path for c in canaries if not c.unchanged()] == []
    for job, outcome in outcomes.items():
        if outcome is None:
            assert (space.q / "done" / job).is_file(), job
            assert (space.q / "done" / f"{job}.result").is_file(), job


def test_recover_never_requeues_through_a_claim_swapped_for_a_link(space: Space):
    """Q-5, Q-6, Q-8: claims without a lease (``claimed/J/J`` alone, which ``recover
    --reconcile`` returns to pending) while a member swaps each ``claimed/J`` with a link to a
    directory of root's outside holding a file named J: root's reconciles never move the file
    outside into ``pending/``, and every run exits 0 or 1 with its errors named."""
    jobs = space.publish(10)
    assert space.claim_all(10) == jobs
    for job in jobs:
        os.unlink(space.q / "lease" / job / "worker")
        os.rmdir(space.q / "lease" / job)
    canaries, pairs = space.claims_swapped_for_links(jobs)
    with swapping(space.top, pairs, user=space.member) as swapped:
        for _ in range(8):
            done = space.queue("recover", "--reconcile", "--grace", "0", "--json")
            assert done.returncode in (0, 1), done
            report = json.loads(done.stdout)
            for error in report.get("errors", []):
                assert str(error.get("error", "")).startswith("E"), error
    assert sum(swapped.swaps) > 0
    assert [c.path for c in canaries if not c.unchanged()] == []
    for name in os.listdir(space.q / "pending"):
        assert b"canary" not in (space.q / "pending" / name).read_bytes(), name


def test_claims_never_read_a_request_through_a_link_swapped_into_pending(space: Space):
    """Q-2, Q-8, Q-9, §2.4 (exit 3: nothing to claim): a member swaps six of twelve pending
    requests, each with a link to a file of root's outside the root (a request of other
    words, mode 0600); root claims with ``--json`` twelve times: no claim ever prints the
    outside file's request, the outside files keep their bytes, mode and place, and no claim
    says there is nothing to claim (exit 3) while a request nobody touched is pending."""
    jobs = space.publish(12)
    canaries, pairs = [], []
    for n, job in enumerate(jobs[:6]):
        secret = {"tool": "fs.stat", "input": {"path": "/"}, "secret": f"canary {n}"}
        canaries.append(canary_file(space.out / f"s{n:02d}", json.dumps(secret), mode=0o600))
        link = space.link_of_member(f"l{n:02d}", canaries[-1].path)
        pairs.append((space.q / "pending" / job, link))
    untouched = set(jobs[6:])
    claimed, empty = [], []
    with swapping(space.top, pairs, user=space.member) as swapped:
        for _ in range(12):
            done = space.queue("claim", "--pid", str(space.holder.pid), "--json")
            assert "canary" not in done.stdout + done.stderr, done
            if done.returncode == 3:
                assert done.stdout == "", done
                empty.append(sorted(untouched - set(claimed)))
            elif refusal_or_success(done, 1) is None:
                claimed.append(json.loads(done.stdout)["name"])
    assert sum(swapped.swaps) > 0
    assert [c.path for c in canaries if not c.unchanged()] == []
    assert len(claimed) == len(set(claimed)), claimed
    assert [e for e in empty if e] == []
    for job in claimed:  # each claim holds a request, never a link moved in
        assert stat.S_ISREG(os.lstat(space.q / "claimed" / job / job).st_mode), job
    left = [f"{d}/{n}" for d in os.listdir(space.q / "claimed")
            for n in os.listdir(space.q / "claimed" / d) if d not in claimed]  # fmt: skip
    assert left == [], left


def test_a_refusal_names_what_stood_at_the_claim_when_it_was_refused(space: Space):
    """Q-8, Q-4, docs/queue.md ("finish and renew refuse it ... naming the job", "nothing
    was changed"): a member exchanges ``claimed/J`` with a link to a directory outside, as
    fast as it can, while root tries to finish J again and again: a refusal names J, never
    contradicts itself ("a directory, not a directory"), and the job ends finished once,
    with its own request, or still claimed."""
    jobs = space.publish(5)
    assert space.claim_all(5) == jobs
    outside = space.out / "c"
    outside.mkdir()
    canary = Canary(outside)
    said = []
    for n, job in enumerate(jobs):
        link = space.link_of_member(f"l{n}", outside)
        pair = [(space.q / "claimed" / job, link)]
        with swapping(space.top, pair, user=space.member, pause=0):
            for _ in range(3):
                done = space.queue("finish", job, "--ok", "-", stdin='{"answer": 1}')
                if done.returncode == 0:
                    break
                errno_sentence(done)
                assert job in done.stderr, done
                said.append(done.stderr)
    assert said, "no finish was refused"
    assert not [s for s in said if "is a directory, not a directory" in s]
    assert canary.unchanged()
    assert {s for (s,) in settled_once_each(space, jobs).values()} <= {"done", "pending"}


# --------------------------------------------------------------------------- sessions

TORN = (
    b'{"ts":"2026-06-22T12:00:00Z","type":"note","agent":"swapee","session":"s",'
    b'"object":"tool/fs.read","status":"ok"}\n{"ts":"2026-06-22T12:00:01Z","ty'
)


def agents_dir(w: Tools) -> Path:
    """A directory of the agent's uid outside the storage root and its mounts."""
    mine = new_scratch_dir(w.top, "agents-")
    return give(mine, NOBODY)


def home_sessions(w: Tools, count: int, *, dmode: int = 0o700, fmode: int = 0o600) -> list[Path]:
    """Sessions s00… of the agent in its home, made as the agent's uid would (its own
    directories and files), each ``events.jsonl`` ending in a torn line."""
    r = w.native("fs.stat", {"path": "/workspace"})[0]
    assert r.returncode == 0, r
    base = w.storage / "home" / str(NOBODY) / "agent" / AGENT / "session"
    made = []
    for n in range(count):
        d = base / f"s{n:02d}"
        d.mkdir()
        d.chmod(dmode)
        (d / "events.jsonl").write_bytes(TORN)
        (d / "events.jsonl").chmod(fmode)
        give(d / "events.jsonl", NOBODY)
        made.append(give(d, NOBODY))
    return made


def test_session_repair_never_truncates_through_a_session_swapped_for_a_link(tools: Tools):
    """S-5, docs/sessions.md ("a link planted in a home never leads them to read or truncate
    a file elsewhere"; ``repair`` tightens a home session an older version left 0750): the
    agent's uid swaps each of its home sessions (0750) with a link to a directory of its own
    outside the storage root (0750) holding an ``events.jsonl`` of root's that also ends in a
    torn line; root repairs every session: the outside directories keep their mode and the
    files their bytes, and each repair says what it did or is refused with an errno."""
    sessions = home_sessions(tools, 12, dmode=0o750)
    mine = agents_dir(tools)
    canaries, pairs = [], []
    for n, session in enumerate(sessions):
        outside = mine / f"c{n:02d}"
        outside.mkdir()
        canaries.append(canary_file(outside / "events.jsonl", TORN.decode()))
        give(outside, NOBODY).chmod(0o750)
        canaries.append(Canary(outside))
        pairs.append((session, link_as(mine / f"l{n:02d}", outside, NOBODY)))
    with swapping(tools.top, pairs, user=NOBODY) as swapped:
        for session in sessions:
            r = tools.ctx("session", "repair", AGENT, "--session", session.name)
            no_traceback(r)
            assert r.rc == 0 or (r.rc == 1 and errno_sentence(r)), r
    assert sum(swapped.swaps) > 0
    assert [c.path for c in canaries if not c.unchanged()] == []


@pytest.mark.parametrize("partner", ["a link to root's file", "a second name of the agent's file"])
def test_session_repair_never_truncates_an_events_file_swapped_in(tools: Tools, partner: str):
    """S-5, docs/sessions.md: ``events.jsonl`` must be a regular file with one name; the
    agent's uid swaps each session's ``events.jsonl`` with a link to a file of root's outside
    the root, or with a second name (a hard link) of a file of its own outside the root, both
    ending in a torn line; root repairs every session: the outside files keep their bytes,
    and each repair cuts the session's own torn line or is refused with an errno."""
    sessions = home_sessions(tools, 12)
    mine = agents_dir(tools)
    canaries, pairs = [], []
    for n, session in enumerate(sessions):
        if partner == "a link to root's file":
            canaries.append(canary_file(tools.out / f"e{n:02d}", TORN.decode()))
            other = link_as(session / ".other", canaries[-1].path, NOBODY)
        else:
            canaries.append(canary_file(mine / f"e{n:02d}", TORN.decode(), uid=NOBODY, gid=NOBODY))
            other = session / ".other"
            os.link(canaries[-1].path, other)
            canaries[-1] = Canary(canaries[-1].path)  # two names now: watched as it is
        pairs.append((session / "events.jsonl", other))
    with swapping(tools.top, pairs, user=NOBODY) as swapped:
        for session in sessions:
            r = tools.ctx("session", "repair", AGENT, "--session", session.name)
            no_traceback(r)
            assert r.rc == 0 or (r.rc == 1 and errno_sentence(r)), r
    assert sum(swapped.swaps) > 0
    assert [c.path for c in canaries if not c.unchanged()] == []


def test_calls_never_append_their_events_through_a_swapped_events_file(tools: Tools):
    """S-5, T-7, docs/sessions.md ("the host, often root, never writes through one"): while
    the agent's uid swaps its session's ``events.jsonl`` with a link to a file of its own
    outside the storage root, root runs its calls: the outside file never gets a line, and
    every call is answered by one result frame (a call whose record failed says so)."""
    sessions = home_sessions(tools, 1)
    mine = agents_dir(tools)
    canary = canary_file(mine / "elsewhere.jsonl", "mine\n", uid=NOBODY, gid=NOBODY)
    other = link_as(sessions[0] / ".other", canary.path, NOBODY)
    frames = []
    with swapping(tools.top, [(sessions[0] / "events.jsonl", other)], user=NOBODY) as swapped:
        for _ in range(12):
            _, frame = tools.native("fs.stat", {"path": "/workspace"}, "--session", "s00")
            frames.append(frame)
    assert swapped.swaps[0] > 0
    assert canary.unchanged(), canary.path.read_bytes()[:300]
    for frame in frames:
        assert frame["status"] == "ok" or error_word(frame).startswith("E"), frame


def test_bootstrap_never_tightens_a_directory_swapped_into_a_home_session(tools: Tools):
    """R-5, docs/sessions.md ("never through a link"): home sessions an older version left
    0750 (events 0640), each swapped by the agent's uid with a link to a directory of its
    own outside the root, also 0750 with an events file 0640; ``ctx bootstrap`` run by root
    tightens the sessions and leaves the outside directories and files as they were."""
    sessions = home_sessions(tools, 16, dmode=0o750, fmode=0o640)
    mine = agents_dir(tools)
    canaries, pairs = [], []
    for n, session in enumerate(sessions):
        outside = mine / f"c{n:02d}"
        outside.mkdir()
        outside.chmod(0o750)
        canary_file(outside / "events.jsonl", TORN.decode(), mode=0o640, uid=NOBODY, gid=NOBODY)
        give(outside, NOBODY)
        canaries += [Canary(outside), Canary(outside / "events.jsonl")]
        pairs.append((session, link_as(mine / f"l{n:02d}", outside, NOBODY)))
    for _ in range(2):
        with swapping(tools.top, pairs, user=NOBODY) as swapped:
            r = tools.ctx("bootstrap")
        no_traceback(r)
        assert r.rc in (0, 1), r
        assert sum(swapped.swaps) > 0
        assert [c.path for c in canaries if not c.unchanged()] == []
        for session in sessions:  # the swapper put each back: loosened again for the next
            assert not session.is_symlink(), session
            session.chmod(0o750)


def test_session_readers_never_wait_on_an_events_file_swapped_for_a_fifo(tools: Tools):
    """S-5, docs/sessions.md ("a socket, a directory or a FIFO at events.jsonl is EINVAL for
    every reader and repair"): the agent's uid swaps its session's ``events.jsonl`` with a
    FIFO no one writes; root's ``ctx session show``, ``tail`` and ``repair`` each end at
    once, with the events or with ``EINVAL``, never waiting for a writer."""
    sessions = home_sessions(tools, 1)
    fifo = sessions[0] / ".fifo"
    os.mkfifo(fifo)
    give(fifo, NOBODY)
    with swapping(tools.top, [(sessions[0] / "events.jsonl", fifo)], user=NOBODY) as swapped:
        for verb in ("show", "tail", "repair") * 4:
            started = time.monotonic()
            r = tools.ctx("session", verb, AGENT, "--session", "s00", timeout=CALL)
            assert time.monotonic() - started < 10, r
            no_traceback(r)
            assert r.rc == 0 or errno_sentence(r) == "EINVAL", r
    assert swapped.swaps[0] > 0


# --------------------------------------------------------------------------- tool controls

GRANT = f"allow {LABEL} tool:{PROBE} execute\n"


@pytest.mark.parametrize(
    "control", ["tool policy", "agent policy", "schema", "status", "agent identity"]
)
def test_a_control_swapped_for_a_link_to_a_laxer_one_is_never_followed(tools: Tools, control):
    """P-5, P-6, T-1, docs/policy.md ("Every file is reached one component at a time without
    following links. A control that is missing, malformed, a link or unreadable denies"): the
    administrator swaps one control of a call that must be refused — a tool policy without
    the grant, an agent policy without it, a schema the input fails, a status ``disabled`` —
    with a link to a laxer file outside (the grant, the agent's grant, any object,
    ``available``) while the agent calls the tool: no call ever runs it.  And the agent's
    ``identity`` swapped with a link to one naming uid 0: no call ever runs as root."""
    value: dict = {}
    if control == "agent identity":
        real = tools.storage / "agent" / f"{AGENT}.d" / "identity"
        lax = json.dumps({"uid": 0, "gid": 0, "groups": []})
    elif control == "tool policy":
        real = tools.controls / "policy"
        real.write_text("# nobody\n")
        lax = GRANT
    elif control == "agent policy":
        real = tools.storage / "agent" / f"{AGENT}.d" / "policy"
        lax = real.read_text()
        real.write_text(lax.replace(GRANT, ""))
        assert real.read_text() != lax
    elif control == "schema":
        real = tools.controls / "schema"
        real.write_text(json.dumps({"type": "object", "additionalProperties": False}))
        lax = json.dumps({"type": "object"})
        value = {"x": 1}
    else:
        real = tools.controls / "status"
        real.write_text("disabled\n")
        lax = "available\n"
    (tools.out / "lax").write_text(lax)
    link = tools.out / "lax-link"
    link.symlink_to(tools.out / "lax")
    frames = []
    with swapping(tools.top, [(real, link)]) as swapped:
        for _ in range(8):
            _, frame = tools.native(PROBE, value)
            frames.append(frame)
            if ran(frame) and control != "agent identity":
                break
    assert swapped.swaps[0] > 0
    if control == "agent identity":
        assert {f["output"]["uid"] for f in frames if ran(f)} <= {NOBODY}, frames
        assert all(ran(f) or error_word(f) for f in frames), frames
        return
    assert [ran(f) for f in frames if ran(f)] == []
    assert all(error_word(f) in ("EACCES", "ENOEXEC", "EINVAL", "EAGAIN") for f in frames), frames


def test_reinstalls_in_a_loop_never_leave_the_tool_missing_or_half_made(tools: Tools):
    """T-8, T-8a, docs/tools.md "How an install stays atomic" ("the tool is always found, by
    ctx object which as by a call, with a complete control directory"): the administrator
    reinstalls probe again and again, two versions in turn, while ``ctx object which`` and
    ``ctx object list`` look and the agent calls it: it is always found, never damaged, and
    each call runs one of the two versions or meets EAGAIN."""
    versions = []
    for tag in ("v1", "v2"):
        src = new_scratch_dir(tools.top, f"{tag}-")
        (src / "probe.sh").write_text(probe_program(tag))
        document = {"manifest": 2, "kind": "tool", "name": PROBE, "description": tag,
                    "schema": {"type": "object"}, "cap": {}, "exec": "probe.sh"}  # fmt: skip
        (src / "probe.json").write_text(json.dumps(document))
        versions.append(src / "probe.json")
    refused: list[Run] = []

    def reinstall() -> None:
        for n in range(6):
            r = tools.ctx("object", "install", versions[n % 2], "--tier", "system")
            if r.rc != 0:
                refused.append(r)

    installer = threading.Thread(target=reinstall)
    installer.start()
    seen = set()
    while installer.is_alive():
        which = tools.ctx("object", "which", PROBE)
        assert which.rc == 0 and which.out.strip() == str(tools.probe), which
        listing = tools.ctx("object", "list", "--json")
        entry = [e for e in listing.json() if e["name"] == PROBE]
        assert len(entry) == 1 and entry[0]["status"] in ("available", "unavailable"), entry
        _, frame = tools.native(PROBE, {})
        assert ran(frame) in ("v1", "v2") or error_word(frame) == "EAGAIN", frame
        seen.add(ran(frame))
    installer.join()
    assert refused == []
    assert seen & {"v1", "v2"}, seen


# --------------------------------------------------------------------------- object install


@dataclass
class Manifest:
    """A manifest the agent's uid wrote in a directory of its own, whose program is
    ``bin/prog`` (or ``prog``), and a file of root's outside that it must never install."""

    path: Path
    secret: Canary


def agents_manifest(w: Tools, nested: bool) -> Manifest:
    mine = agents_dir(w)
    program = "bin/prog" if nested else "prog"
    (mine / "bin").mkdir()
    give(mine / "bin", NOBODY)
    (mine / program).write_text('#!/bin/sh\ncat >/dev/null\necho \'{"ran": "agent"}\'\n')
    give(mine / program, NOBODY)
    document = {"manifest": 2, "kind": "tool", "name": "leak", "description": "leak",
                "schema": {"type": "object"}, "cap": {}, "exec": program}  # fmt: skip
    (mine / "m.json").write_text(json.dumps(document))
    give(mine / "m.json", NOBODY)
    private = w.out / "private"
    private.mkdir(mode=0o700)
    secret = canary_file(private / "prog", "#!/bin/sh\n# SECRET of root's\n", mode=0o600)
    return Manifest(mine / "m.json", secret)


@pytest.mark.parametrize("swapped", ["its program", "the directory of its program"])
def test_install_never_copies_a_file_swapped_in_for_the_program(tools: Tools, swapped: str):
    """T-8, docs/tools.md "How the manifest and its program are read" (a relative ``exec``
    walked never through a symbolic link; another uid's manifest names only what that uid
    could read): the agent's uid swaps its program, or the directory holding it, with a link
    to a file of root's it may not read (or to the directory of root's holding it) while
    root installs the manifest again and again: the installed tool never holds root's file,
    and each install succeeds with the agent's program or is refused with an errno."""
    m = agents_manifest(tools, nested=swapped != "its program")
    mine = m.path.parent
    if swapped == "its program":
        pair = (mine / "prog", link_as(mine / "alt", m.secret.path, NOBODY))
    else:
        pair = (mine / "bin", link_as(mine / "alt", m.secret.path.parent, NOBODY))
    installed = tools.storage / "tool" / "leak"
    outcomes = set()
    with swapping(tools.top, [pair], user=NOBODY) as swapping_done:
        for _ in range(8):
            r = tools.ctx("object", "install", m.path, "--tier", "system")
            no_traceback(r)
            outcomes.add(None if r.rc == 0 else errno_sentence(r))
            if installed.exists():
                assert b"SECRET" not in installed.read_bytes()
    assert swapping_done.swaps[0] > 0
    assert m.secret.unchanged()
    assert outcomes <= {None, "ELOOP", "EACCES", "ENOENT", "ENOTDIR", "EINVAL"}, outcomes


# --------------------------------------------------------------------------- fs.* core tools


def test_fs_tools_never_follow_a_workspace_directory_swapped_for_a_link(tools: Tools):
    """T-2, docs/tools.md "Paths are confined" (walked one component at a time with
    O_NOFOLLOW: a link anywhere on the way is ELOOP): the agent's uid swaps ``sub`` in its
    workspace with a link to a directory of its own outside every mount, while it calls
    fs.read, fs.list, fs.stat and fs.write on paths below ``sub``: nothing outside is read,
    listed, stat-ed or written, and each call answers from the workspace or is refused."""
    sub = tools.ws / "sub"
    sub.mkdir()
    (sub / "f").write_text("inside\n")
    give(sub / "f", NOBODY)
    give(sub, NOBODY)
    mine = agents_dir(tools)
    outside = mine / "outside"
    outside.mkdir()
    (outside / "f").write_text("OUTSIDE\n")
    (outside / "only-outside").write_text("OUTSIDE\n")
    for p in (outside / "f", outside / "only-outside", outside):
        give(p, NOBODY)
    canaries = [Canary(outside), Canary(outside / "f"), Canary(outside / "only-outside")]
    calls = [
        ("fs.read", {"path": "sub/f"}),
        ("fs.list", {"path": "sub"}),
        ("fs.stat", {"path": "sub/only-outside"}),
        ("fs.write", {"path": "sub/f", "content": "written\n"}),
    ]
    with swapping(tools.top, [(sub, link_as(mine / "l", outside, NOBODY))], user=NOBODY) as s:
        for n in range(12):
            tool, value = calls[n % len(calls)]
            _, frame = tools.native(tool, value)
            text = json.dumps(frame.get("output")) if frame["status"] == "ok" else ""
            assert "OUTSIDE" not in text and "only-outside" not in text, frame
            if tool == "fs.stat":
                assert frame["status"] == "error", frame
            if frame["status"] == "error":
                assert error_word(frame) in ("ELOOP", "ENOENT", "ENOTDIR", "EACCES"), frame
    assert s.swaps[0] > 0
    assert [c.path for c in canaries if not c.unchanged()] == []


@pytest.mark.parametrize("tool", ["fs.read", "fs.write"])
def test_fs_tools_never_read_or_write_through_a_file_swapped_for_a_link(tools: Tools, tool: str):
    """T-2, docs/tools.md ("a symbolic link anywhere on the way or at the end is refused
    (ELOOP)"; fs.write renames a temporary file into place): the agent's uid swaps
    ``/workspace/f`` with a link to a file of its own outside every mount: fs.read never
    returns the outside file's bytes, fs.write never changes it."""
    target = tools.ws / "f"
    target.write_text("inside\n")
    give(target, NOBODY)
    mine = agents_dir(tools)
    canary = canary_file(mine / "outside", "OUTSIDE\n", uid=NOBODY, gid=NOBODY)
    value = {"path": "f"} if tool == "fs.read" else {"path": "f", "content": "written\n"}
    with swapping(
        tools.top, [(target, link_as(mine / "l", canary.path, NOBODY))], user=NOBODY
    ) as s:
        for _ in range(10):
            _, frame = tools.native(tool, value)
            assert "OUTSIDE" not in json.dumps(frame.get("output")), frame
            assert frame["status"] == "ok" or error_word(frame) in ("ELOOP", "ENOENT"), frame
    assert s.swaps[0] > 0
    assert canary.unchanged(), canary.path.read_bytes()


# --------------------------------------------------------------------------- spaces


def members_dirs(space: Space, where: Path, count: int, mode: int) -> list[Path]:
    """Directories ``where/dNN`` made as the member's (its uid, the space's group)."""
    made = []
    for n in range(count):
        d = where / f"d{n:02d}"
        d.mkdir()
        give(d, space.member.uid, space.gid)
        d.chmod(mode)
        made.append(d)
    return made


def test_regrouping_a_space_never_regroups_through_a_directory_swapped_for_a_link(space: Space):
    """X-1, ``ctx shared create --help`` ("gives G every entry of the space that had its old
    group, never through a link"): a member swaps directories of its own in ``data/`` with
    links to directories of root's outside the root that have the space's old group; root
    gives the space another group and back, again and again: the outside directories and the
    files in them keep their group and mode."""
    other = grp_gid(OTHER_GROUP)
    dirs = members_dirs(space, space.space / "data", 12, 0o2770)
    canaries, pairs = [], []
    for n, d in enumerate(dirs):
        outside = space.out / f"c{n:02d}"
        outside.mkdir()
        os.chown(outside, 0, space.gid)
        outside.chmod(0o750)
        canaries.append(canary_file(outside / "f", "canary\n", mode=0o640, gid=space.gid))
        canaries.append(Canary(outside))
        pairs.append((d, space.link_of_member(f"l{n:02d}", outside)))
    with swapping(space.top, pairs, user=space.member) as swapped:
        for group in (OTHER_GROUP, GROUP) * 2:
            done = space.run("shared", "create", SPACE, "--group", group)
            assert done.returncode == 0 or errno_sentence(done), done
    assert sum(swapped.swaps) > 0
    assert [c.path for c in canaries if not c.unchanged()] == []
    assert os.stat(space.space).st_gid in (space.gid, other)


def test_repairing_session_modes_never_chmods_through_a_session_swapped_for_a_link(space: Space):
    """X-1, docs/sessions.md ("that command gives ... each session directory the setgid and
    sticky bits it lacks ... through descriptors, following no link"): a member's sessions in
    the space, made 02770 as an older version made them, each swapped by the member with a
    link to a directory of its own outside the root (also 02770); root's ``ctx shared create
    proj --group G`` repairs the sessions and leaves the outside directories' modes as they
    were."""
    base = space.space / "agent" / "mine"
    base.mkdir()
    give(base, space.member.uid, space.gid)
    base.chmod(0o2770)
    (base / "session").mkdir()
    give(base / "session", space.member.uid, space.gid)
    (base / "session").chmod(0o2770)
    sessions = members_dirs(space, base / "session", 12, 0o2770)
    canaries, pairs = [], []
    for n, session in enumerate(sessions):
        outside = space.mine / f"c{n:02d}"
        outside.mkdir()
        give(outside, space.member.uid, space.gid)
        outside.chmod(0o2770)
        canaries.append(Canary(outside))
        pairs.append((session, space.link_of_member(f"l{n:02d}", outside)))
    for _ in range(2):
        with swapping(space.top, pairs, user=space.member) as swapped:
            done = space.run("shared", "create", SPACE, "--group", GROUP)
        assert done.returncode == 0 or errno_sentence(done), done
        assert sum(swapped.swaps) > 0
        assert [c.path for c in canaries if not c.unchanged()] == []
        for session in sessions:  # back at their names: made old-style again for the next run
            assert not session.is_symlink(), session
            session.chmod(0o2770)


# --------------------------------------------------------------------------- queue, more


@pytest.mark.parametrize("partner", ["a link to a laxer config", "a FIFO"])
def test_a_queue_config_swapped_in_is_never_read_through_or_waited_on(space: Space, partner):
    """Q-8, docs/queue.md "Configuration" and "init ... a config that is a FIFO, a socket or
    a link ... is refused": the administrator swaps ``queue/config`` (max_request_bytes=1024)
    with a link to a config outside that allows 1 MiB, or with a FIFO; root publishes a
    2 KiB request again and again: it is never accepted, and every command ends at once,
    refused with an errno (EFBIG, ELOOP, EINVAL)."""
    config = space.q / "config"
    with config.open("a") as out:
        out.write("max_request_bytes=1024\n")
    if partner == "a FIFO":
        other = space.out / "fifo"
        os.mkfifo(other)
    else:
        (space.out / "config").write_text("max_request_bytes=1048576\n")
        other = space.out / "link"
        other.symlink_to(space.out / "config")
    big = json.dumps({"tool": "fs.stat", "input": {"path": "/"}, "pad": "x" * 2048})
    outcomes = set()
    with swapping(space.top, [(config, other)]) as swapped:
        for n in range(8):
            started = time.monotonic()
            done = space.queue("publish", "--name", f"big{n}", "-", stdin=big)
            assert time.monotonic() - started < 10, done
            assert done.returncode == 1, done
            outcomes.add(errno_sentence(done))
            status = space.queue("status", "--json")
            assert status.returncode in (0, 1), status
    assert swapped.swaps[0] > 0
    assert os.listdir(space.q / "pending") == []
    assert outcomes <= {"EFBIG", "ELOOP", "EINVAL"}, outcomes


def test_recover_never_judges_a_holder_by_a_lease_swapped_for_a_link(space: Space):
    """Q-5, Q-8, I-4: jobs claimed for a live holder; a member swaps each ``lease/J/worker``
    with a link to a file outside that reads as the same lease whose holder is gone (another
    pid, long expired); root's ``recover --reconcile`` runs again and again: no job leaves
    its claim while its holder lives, and the outside files stay as they were."""
    jobs = space.publish(10)
    assert space.claim_all(10) == jobs
    canaries, pairs = [], []
    dead = subprocess.Popen(["true"])
    dead.wait()
    for n, job in enumerate(jobs):
        lease = json.loads((space.q / "lease" / job / "worker").read_text())
        lease.update(pid=dead.pid, expires_at="2000-01-01T00:00:00Z")
        canaries.append(canary_file(space.out / f"lease{n:02d}", json.dumps(lease)))
        link = space.link_of_member(f"l{n:02d}", canaries[-1].path)
        pairs.append((space.q / "lease" / job / "worker", link))
    with swapping(space.top, pairs, user=space.member) as swapped:
        for _ in range(6):
            done = space.queue("recover", "--reconcile", "--json")
            assert done.returncode in (0, 1), done
            assert json.loads(done.stdout)["requeued"] == [], done.stdout
    assert sum(swapped.swaps) > 0
    assert [c.path for c in canaries if not c.unchanged()] == []
    assert os.listdir(space.q / "pending") == []
    assert sorted(requests_by_state(space.q)) == sorted(jobs)


def test_renew_never_rewrites_or_reads_a_lease_swapped_for_a_link(space: Space):
    """Q-3, Q-8, docs/queue.md ("renew rewrites it atomically (temp + fsync + rename) and
    only for the process that holds it"; "a claim whose lease is not a lease (a symlink ...)
    ... finish and renew refuse it with the lease's own error (ELOOP ...)"): a member swaps
    each ``lease/J/worker`` with a link to a copy of it outside the root; root renews each
    job for its holder: the copies outside keep their bytes and mode, each renew succeeds
    or is refused with an errno naming J, and every lease is a regular file afterwards."""
    jobs = space.publish(8)
    assert space.claim_all(8) == jobs
    canaries, pairs = [], []
    for n, job in enumerate(jobs):
        text = (space.q / "lease" / job / "worker").read_text()
        canaries.append(canary_file(space.out / f"lease{n:02d}", text))
        link = space.link_of_member(f"l{n:02d}", canaries[-1].path)
        pairs.append((space.q / "lease" / job / "worker", link))
    with swapping(space.top, pairs, user=space.member) as swapped:
        for job in jobs:
            done = space.queue("renew", job, "--pid", str(space.holder.pid), "--ttl", "600")
            refusal_or_success(done, 1, job=job)
    assert sum(swapped.swaps) > 0
    assert [c.path for c in canaries if not c.unchanged()] == []
    for job in jobs:
        assert stat.S_ISREG(os.lstat(space.q / "lease" / job / "worker").st_mode), job


def test_queue_readers_never_wait_on_a_lease_swapped_for_a_fifo(space: Space):
    """Q-8, docs/queue.md (reads ``with O_NOFOLLOW|O_NONBLOCK`` and checks the file type after
    opening): a member swaps each ``lease/J/worker`` with a FIFO of its own; root's ``status``,
    ``show J`` and ``list`` each end at once, exit 0 or 1 (a conflict found), never waiting
    for a writer and never with a traceback."""
    jobs = space.publish(4)
    assert space.claim_all(4) == jobs
    pairs = []
    for n, job in enumerate(jobs):
        fifo = space.mine / f"f{n}"
        os.mkfifo(fifo)
        give(fifo, space.member.uid, space.gid)
        pairs.append((space.q / "lease" / job / "worker", fifo))
    with swapping(space.top, pairs, user=space.member) as swapped:
        for n in range(12):
            verb = ("status", "show", "list")[n % 3]
            args = (jobs[n % 4],) if verb == "show" else ()
            started = time.monotonic()
            done = space.queue(verb, *args, "--json")
            assert time.monotonic() - started < 10, done
            assert done.returncode in (0, 1), done
            json.loads(done.stdout)
    assert sum(swapped.swaps) > 0


def test_publish_never_writes_through_a_link_flickering_at_its_staging_name(space: Space):
    """Q-1, docs/queue.md ("a symlink, FIFO or socket planted at that name (the refusal names
    what is there): removing a name never follows it"): a member makes and removes, in a
    loop, a link at each staging name ``inbox/J.publish.tmp`` to a file of root's outside;
    root publishes each J: the outside file keeps its bytes, each J published is pending with
    the request given, and each refusal names an errno."""
    canary = canary_file(space.out / "target", "canary\n")
    names = [f"pub{n:02d}" for n in range(12)]
    staging = [space.q / "inbox" / f"{name}.req.json.publish.tmp" for name in names]
    targets = dict.fromkeys(staging, canary.path)
    published = []
    with swapping(space.top, [(s, None) for s in staging], user=space.member,
                  targets=targets) as swapped:  # fmt: skip
        for name in names:
            req = {"tool": "fs.stat", "input": {"path": "/"}, "n": name}
            done = space.queue("publish", "--name", name, "-", stdin=json.dumps(req))
            if refusal_or_success(done, 1, job=name) is None:
                published.append(done.stdout.strip())
    assert sum(swapped.swaps) > 0
    assert canary.unchanged()
    for job in published:
        assert json.loads((space.q / "pending" / job).read_text())["n"] == job.split(".")[0]


# --------------------------------------------------------------------------- a user's root, tsh


def test_bootstrap_never_gives_away_a_log_through_a_control_directory_swapped_for_a_link(
    _template: Path, member
):
    """R-5, docs/tools.md ("Bootstrap run as root gives such a log that an earlier version left
    root's to the owner"; every change "never through a link"): a storage root owned by a
    user, whose tool logs an older version left root's; the user swaps the control
    directories of the core tools, in ``tool/`` (theirs), with links to directories of
    root's outside holding a ``log`` of root's; root's ``ctx bootstrap`` gives the tools'
    own logs to the user and never the files outside, and every problem it meets is named."""
    user, _ = member
    top = new_scratch_dir(SCRATCH, "owned-")
    try:
        storage = top / "storage"
        storage.mkdir()
        give(storage, user.uid, user.gid)
        r = ctx_run("bootstrap", "--storage", storage)
        assert r.rc == 0, r
        out = new_scratch_dir(top, "out-")
        canaries, pairs = [], []
        for tool in ("fs.read", "fs.list", "fs.stat", "fs.write", "shell.exec"):
            os.chown(storage / "tool" / f"{tool}.d" / "log", 0, 0)
            outside = out / tool
            outside.mkdir()
            canaries.append(canary_file(outside / "log", "root's\n", mode=0o640))
            link = link_as(storage / "tool" / f".swap-{tool}", outside, user.uid, user.gid)
            pairs.append((storage / "tool" / f"{tool}.d", link))
        for _ in range(3):
            with swapping(top, pairs, user=user) as swapped:
                r = ctx_run("bootstrap", "--storage", storage)
            no_traceback(r)
            assert r.rc == 0 or errno_sentence(r), r
            assert sum(swapped.swaps) > 0
            assert [c.path for c in canaries if not c.unchanged()] == []
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_tshrc_swapped_for_a_link_to_roots_file_is_never_read(tools: Tools, member):
    """T-4, docs/tools.md (".tshrc may be a symbolic link ... but only to a regular file of
    the home's owner: ... a link to another user's file (/etc/shadow when root reads the
    home) is refused"): a user swaps their ``.tshrc`` (a link to a file of theirs) with a
    link to a file of root's naming a secret path; root's ``ctx object which`` with that
    home, again and again, uses the user's path or refuses (EPERM), and never says a word of
    root's file."""
    user, _ = member
    home = new_scratch_dir(tools.top, "home-")
    give(home, user.uid, user.gid)
    (home / "mine").write_text("CTX_PATH=/ctx-user-path\n")
    give(home / "mine", user.uid, user.gid)
    secret = canary_file(tools.out / "rootrc", "CTX_PATH=/SECRET-of-root\n", mode=0o600)
    rc = link_as(home / ".tshrc", home / "mine", user.uid, user.gid)
    alt = link_as(home / ".alt", secret.path, user.uid, user.gid)
    env = {**tools.env, "CTX_HOME": str(home)}
    said = set()
    with swapping(tools.top, [(rc, alt)], user=user) as swapped:
        for _ in range(16):
            r = tools.ctx("object", "which", "nosuch", env=env)
            no_traceback(r)
            assert r.rc == 1 and "SECRET" not in r.out + r.err, r
            said.add(errno_sentence(r))
    assert swapped.swaps[0] > 0
    assert said <= {"ENOENT", "EPERM"}, said
    assert secret.unchanged()
