"""Everything at once on one storage root (SPEC §2 Q-1..Q-7, I-1..I-5; §3 W-1, W-3, W-4;
§4 S-2, S-3, S-5; §5 P-6; §6 T-1, T-7, T-8, T-8a; §8 A-1, A-2, A-3; §13 F-1; §1 R-5).

For some seconds, on one storage root and all at the same time:

* two ``ctx queue work`` workers serve project ``proj`` while two publishers feed it (single
  ``publish --name`` and ``publish --batch``);
* a third worker is started, SIGKILLed while it holds a job, and ``ctx queue recover`` run
  after each kill, in a loop;
* the tool the jobs run (``job.mark``) is reinstalled again and again with ``ctx object
  install``, a new version each time, while its calls run;
* ``ctx bootstrap`` runs again and again over the root;
* agent ``coder``'s terminal (``ctx agent start``) runs calls typed on its socket, of
  ``fs.read`` and of the tool being reinstalled;
* a FUSE mount of the root (``ctx mount``) is read in a loop;
* ``ctx session tail --follow`` follows a worker's session and the terminal's session;
* ``ctx agent create`` makes new agents;
* the policies gain and lose grants of other tools (never of the jobs' tool) by atomic
  replacement, as a careful administrator edits them.

Then the invariants: every published job is done or failed exactly once, as its request
asked (I-1, I-3, W-1); no job started again after its result was written, and a job no
killed worker touched ran exactly once (I-3, I-4); every ``tool_call`` has its
``tool_result`` (S-2, T-7) and the tool's log holds one line per result, across every
reinstall (T-7, "a reinstall keeps policy, log and hooks as the very same files"); no reader
ever saw the tool missing, a control missing or a mix of two versions (T-8, docs/tools.md
"How an install stays atomic"); every line of every log and events file parses (S-5); the
followers printed exactly what the sessions hold; every command exited as SPEC §2.4 and the
docs say; and nothing is left running or mounted for this storage root."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Run,
    alive,
    clean_env,
    ctx_run,
    mounted_at,
    new_scratch_dir,
    rfc3339,
    scratch_top,
    serving,
    wait_for,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, CoderHost, Raw
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
CHURN = 9.0  # seconds during which everything runs at once
TOOL = "job.mark"
NOTE = "notes kept in the operator's workspace\n"
SIX_KEYS = ["ts", "type", "agent", "session", "object", "status"]
TRACEBACK = "Traceback (most recent call last)"
CONTROLS = ("name", "description", "schema", "cap", "policy", "status", "log")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0
    or shutil.which("bwrap") is None
    or not os.path.exists("/dev/fuse")
    or shutil.which("fusermount3") is None,
    reason="needs root, bubblewrap, /dev/fuse and fusermount3",
)


# ------------------------------------------------------------------------------ helpers


def mark_program(version: str, outbox: Path) -> str:
    """Tool ``job.mark`` of ``version``.  Native mode (a worker's job): reads
    ``{"id": T, "fail": B}``, writes ``start``/``end`` lines naming T, its version, its pid
    and the time to ``outbox/runs.log``, naps, prints ``{"id", "version"}``, and exits 3 when
    asked to fail.  Terminal mode: prints ``mark ARG VERSION``."""
    runs = outbox / "runs.log"
    return (
        "#!/bin/sh\n"
        f"# job.mark version {version}\n"
        'if [ "$CTX_MODE" = terminal ]; then\n'
        f'    echo "mark $1 {version}"\n'
        "    exit 0\n"
        "fi\n"
        "read -r input\n"
        'id=${input#*\\"id\\": \\"}\n'
        'id=${id%%\\"*}\n'
        f'echo "start $id {version} $$ $(date +%s.%N)" >> {runs}\n'
        "sleep 0.1\n"
        f'echo "end $id {version} $$ $(date +%s.%N)" >> {runs}\n'
        f'printf \'{{"id": "%s", "version": "{version}"}}\\n\' "$id"\n'
        'case $input in *\'"fail": true\'*) echo "asked to fail" >&2; exit 3;; esac\n'
        "exit 0\n"
    )


def mark_manifest(directory: Path, version: str, outbox: Path) -> Path:
    """The v2 manifest (T-8) of ``job.mark`` ``version``, in a directory of its own."""
    directory.mkdir(parents=True)
    (directory / "mark.sh").write_text(mark_program(version, outbox))
    manifest = directory / f"{TOOL}.json"
    manifest.write_text(
        json.dumps(
            {
                "manifest": 2,
                "kind": "tool",
                "name": TOOL,
                "description": f"{TOOL} version {version}",
                "schema": {"type": "object"},
                "cap": {"side_effects": True, "network": False},
                "exec": "mark.sh",
            }
        )
    )
    return manifest


def replace_atomically(path: Path, text: str, spare: Path) -> None:
    """``path`` replaced by ``text`` as an editor that renames does: a temp file (in
    ``spare``, on the same filesystem) written, synced, then renamed over it."""
    temp = spare / f"{path.parent.name}-{path.name}.{uuid.uuid4().hex[:8]}"
    temp.write_text(text)
    temp.chmod(0o644)
    with open(temp, "rb") as synced:
        os.fsync(synced.fileno())
    os.replace(temp, path)


def jsonl_problems(path: Path, *, events: bool) -> list[str]:
    """Every line of ``path`` that is not one JSON object (for ``events``: one that does not
    start with the six keys of S-2)."""
    problems = []
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        torn = data.rsplit(b"\n", 1)[-1]
        problems.append(f"{path}: torn last line {torn[:200]!r}")
    for number, line in enumerate(data.splitlines(), 1):
        try:
            event = json.loads(line)
        except ValueError:
            problems.append(f"{path}:{number}: not JSON: {line[:200]!r}")
            continue
        if not isinstance(event, dict):
            problems.append(f"{path}:{number}: not an object")
        elif events and list(event)[:6] != SIX_KEYS:
            problems.append(f"{path}:{number}: keys {list(event)[:6]}")
    return problems


def read_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def leftovers(top: Path, storage: Path) -> list[str]:
    """Live processes (not this one) whose command line names ``top`` or whose environment
    names ``storage`` as CTX_STORAGE: what this test started and left running."""
    wanted_env = f"CTX_STORAGE={storage}".encode()
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        if int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            command = Path(f"/proc/{entry}/cmdline").read_bytes()
            environment = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            if (str(top).encode() in command or wanted_env in environment) and alive(int(entry)):
                shown = command.replace(b"\0", b" ")[:200]
                found.append(f"{entry}: {shown!r}")
    return found


def mounts_under(top: Path) -> list[str]:
    with open("/proc/self/mountinfo") as table:
        return [line.split()[4] for line in table if line.split()[4].startswith(str(top))]


# ------------------------------------------------------------------------------ the world


@dataclass
class World(CoderHost):
    """One storage root every uid may search: queue ``proj``; agent ``wk`` (label ``wk_t``)
    that runs the jobs' tool ``job.mark``; agent ``coder`` with a workspace and a terminal;
    ``outbox`` where the jobs' tool leaves its traces."""

    outbox: Path = Path()
    problems: dict[str, list[str]] = field(default_factory=dict)
    versions: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, what: str) -> None:
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def problem(self, kind: str, text: str) -> None:
        with self.lock:
            self.problems.setdefault(kind, []).append(text)

    @property
    def queue(self) -> Path:
        return self.storage / "shared" / "proj" / "queue"

    def home_session(self, agent: str, session: str) -> Path:
        return self.storage / "home" / str(self.uid) / "agent" / agent / "session" / session

    def popen(self, *args: str, stdout=subprocess.DEVNULL, **kw) -> subprocess.Popen:
        return subprocess.Popen(
            [*CTX_ARGV, *args],
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=subprocess.PIPE,
            env=self.env,
            **kw,
        )

    def install_version(self, version: str) -> None:
        manifest = mark_manifest(self.top / "manifests" / version, version, self.outbox)
        done = self.ctx("object", "install", manifest, "--tier", "system")
        if done.rc != 0 or TRACEBACK in done.err:
            self.problem("install", repr(done))
        else:
            with self.lock:
                self.versions.append(version)


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(SCRATCH)
    storage = copy_of_root(_template, top / "storage")
    outbox = top / "out"
    outbox.mkdir()
    outbox.chmod(0o1777)
    env = clean_env(CTX_STORAGE=str(storage))
    made = {}
    for name, tools in (("wk", [TOOL]), ("coder", ["fs.read", TOOL])):
        req = {"name": name, "label": f"{name}_t", "tools": tools}
        done = ctx_run("agent", "create", "-", "--json", input=json.dumps(req), env=env)
        assert done.rc == 0, done
        made[name] = done.json()["identity"]
    ws = top / "ws"
    ws.mkdir(mode=0o755)
    (ws / "notes.txt").write_text(NOTE)
    (ws / "notes.txt").chmod(0o644)
    os.chown(ws, made["coder"]["uid"], made["coder"]["gid"])
    assert made["wk"]["uid"] == made["coder"]["uid"], made  # one home holds both sessions
    world = World(top, storage, ws, made["coder"]["uid"], made["coder"]["gid"], outbox=outbox)
    world.install_version("v1")
    assert world.problems == {}, world.problems
    world.allow_tool("wk_t", TOOL)
    world.allow_tool("coder_t", TOOL, "fs.read")
    try:
        yield world
    finally:
        for session in world.started:
            ctx_run("agent", "stop", "coder", "--session", session, env=env)
        for mountpoint in mounts_under(top):
            subprocess.run(["umount", "-l", mountpoint], check=False)
        for line in leftovers(top, storage):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.split(":")[0]), signal.SIGKILL)
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------------------ activities


@dataclass
class Jobs:
    """What the publishers published: job name → (token, asked to fail)."""

    published: dict[str, tuple[str, bool]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, name: str, token: str, fail: bool) -> None:
        with self.lock:
            self.published[name] = (token, fail)


def publisher(w: World, jobs: Jobs, who: str, stop: threading.Event) -> None:
    """Q-1: single publishes with ``--name`` and batches of three, each request naming a
    token of its own; exit 0 and exactly the names asked for (§2.4)."""
    n = 0
    while not stop.is_set():
        n += 1
        if n % 2:
            token, fail = f"{who}-{n}", n % 5 == 0
            req = {"tool": TOOL, "input": {"id": token, "fail": fail}, "from": who}
            done = w.ctx("queue", "publish", "--project", "proj", "--name", token, "-",
                         input=json.dumps(req))  # fmt: skip
            if done.rc != 0 or done.out != f"{token}.req.json\n":
                w.problem("publish", repr(done))
            else:
                jobs.add(f"{token}.req.json", token, fail)
        else:
            tokens = [(f"{who}-{n}b{k}", k == 2 and n % 4 == 0) for k in range(3)]
            lines = "".join(
                json.dumps({"tool": TOOL, "input": {"id": t, "fail": f}, "from": who}) + "\n"
                for t, f in tokens
            )
            done = w.ctx("queue", "publish", "--project", "proj", "--batch", "-", input=lines)
            names = done.out.split()
            if done.rc != 0 or len(names) != 3 or len(set(names)) != 3:
                w.problem("publish", repr(done))
            else:
                for name, (token, fail) in zip(names, tokens, strict=True):
                    jobs.add(name, token, fail)
        stop.wait(0.25)


def at_once(calls: dict[str, Callable[[], Run]]) -> dict[str, Run]:
    """What each of ``calls`` returned, each run in a thread of its own, all let go
    together."""
    start = threading.Barrier(len(calls))
    results: dict[str, Run] = {}

    def one(side: str) -> None:
        start.wait(10)
        results[side] = calls[side]()

    threads = [threading.Thread(target=one, args=(side,)) for side in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def one_won(runs: dict[str, Run]) -> str | None:
    """The side that won a race, when exactly one did and the other was refused EEXIST."""
    won = [side for side, run in runs.items() if run.rc == 0]
    lost = [run for run in runs.values() if run.rc != 0]
    if len(won) == 1 and len(lost) == 1 and lost[0].rc == 1 and "EEXIST" in lost[0].err:
        return won[0]
    return None


def rivals(w: World, stop: threading.Event, jobs: Jobs, made: list[str]) -> None:
    """Q-1, A-3: two publishers publish the same ``--name`` at the same moment, and two
    administrators create the same agent at the same moment: exactly one of each pair wins
    (exit 0), the other is refused ``EEXIST`` (exit 1), and what the winner asked for is what
    is kept."""
    n = 0
    while not stop.is_set():
        n += 1
        name = f"dup-{n}"
        runs = at_once(
            {
                side: partial(w.ctx, "queue", "publish", "--project", "proj", "--name", name,
                              "-", input=json.dumps({"tool": TOOL, "from": side,
                              "input": {"id": f"{name}-{side}", "fail": False}}))
                for side in "xy"
            }
        )  # fmt: skip
        side = one_won(runs)
        if side is None:
            w.problem("publish", f"rival publishes of {name}: {runs}")
        else:
            jobs.add(f"{name}.req.json", f"{name}-{side}", False)

        agent = f"twin-{n}"
        runs = at_once(
            {
                side: partial(w.ctx, "agent", "create", "-", "--json", input=json.dumps(
                    {"name": agent, "label": f"twin_{side}_t", "tools": ["fs.read"]}))
                for side in "xy"
            }
        )  # fmt: skip
        side = one_won(runs)
        if side is None:
            w.problem("agent create", f"rival creates of {agent}: {runs}")
            continue
        if f"twin_{side}_t" not in (w.storage / "agent" / f"{agent}.d" / "policy").read_text():
            w.problem("agent create", f"{agent}: the policy is not the winner's ({side})")
        made.append(agent)
        stop.wait(0.3)


def installer(w: World, stop: threading.Event, flavour: str = "") -> None:
    """T-8: a new version of the jobs' tool installed over the running one, again and
    again; each install exits 0."""
    k = 1
    while not stop.is_set():
        k += 1
        w.install_version(f"v{k}{flavour}")
        stop.wait(0.3)


def pair_observer(w: World, stop: threading.Event) -> None:
    """docs/tools.md "How an install stays atomic": the executable and its control directory
    are never missing, no control is half-written, and what is read between two looks at the
    executable and at the commit marker is one whole version; ``ctx object which`` always
    finds the tool and ``ctx object list`` never calls it damaged."""
    tier = w.storage / "tool"
    entry, controls, marker = tier / TOOL, tier / f"{TOOL}.d", tier / f".{TOOL}~commit"
    rounds = 0
    while not stop.is_set():
        rounds += 1
        try:
            before = os.lstat(entry)
            marked = os.path.lexists(marker)
            program = entry.read_text()
            description = (controls / "description").read_text()
            present = {c: (controls / c).exists() for c in CONTROLS}
            json.loads((controls / "schema").read_text())
            json.loads((controls / "cap").read_text())
            marked = marked or os.path.lexists(marker)
            after = os.lstat(entry)
        except (OSError, ValueError) as exc:
            w.problem("pair", f"round {rounds}: {exc!r}")
            continue
        if not all(present.values()):
            w.problem("pair", f"round {rounds}: controls missing: {present}")
        if not before.st_mode & 0o111 or "# job.mark version v" not in program:
            w.problem("pair", f"round {rounds}: executable {oct(before.st_mode)} {program!r}")
        same = (before.st_ino, before.st_ctime_ns) == (after.st_ino, after.st_ctime_ns)
        if not marked and same:
            version = program.split("# job.mark version ", 1)[1].split()[0]
            w.count("pair compared")
            if description.strip() != f"{TOOL} version {version}":
                w.problem("pair", f"executable {version} beside description {description!r}")
        if rounds % 10 == 0:
            which = w.ctx("object", "which", TOOL)
            if which.rc != 0 or which.out != f"{entry}\n":
                w.problem("pair", repr(which))
            listed = w.ctx("object", "list", "--tier", "system", "--json")
            if listed.rc != 0:
                w.problem("pair", repr(listed))
            else:
                mine = [t for t in listed.json() if t["name"] == TOOL]
                if len(mine) != 1 or mine[0]["status"] not in ("available", "unavailable"):
                    w.problem("pair", f"listed as {mine}")
        stop.wait(0.01)


def bootstrapper(w: World, stop: threading.Event) -> None:
    """R-5: ``ctx bootstrap`` over the busy root, idempotent: exit 0 every time."""
    while not stop.is_set():
        done = w.ctx("bootstrap", "--storage", w.storage)
        if done.rc != 0 or TRACEBACK in done.err:
            w.problem("bootstrap", repr(done))
        stop.wait(0.4)


def creator(w: World, stop: threading.Event, made: list[str]) -> None:
    """A-3: new agents made while everything else runs; exit 0 and a complete pair each."""
    n = 0
    while not stop.is_set():
        n += 1
        name = f"extra-{n}"
        req = {"name": name, "label": "extra_t", "tools": ["fs.read"]}
        done = w.ctx("agent", "create", "-", "--json", input=json.dumps(req))
        if done.rc != 0 or not (w.storage / "agent" / f"{name}.d" / "policy").is_file():
            w.problem("agent create", repr(done))
        else:
            made.append(name)
        stop.wait(0.4)


def policy_editor(w: World, stop: threading.Event) -> None:
    """P-6: grants of ``fs.stat`` come and go in the agents' policies and in the tool's, each
    edit an atomic replacement; the grants of the jobs' tool are never touched, and
    ``ctx policy query`` says so every time."""
    spare = w.top / "edits"
    spare.mkdir()
    files = {
        w.storage / "agent" / "wk.d" / "policy": "allow wk_t tool:fs.stat execute\n",
        w.storage / "agent" / "coder.d" / "policy": "allow coder_t tool:fs.stat execute\n",
        w.storage / "tool" / "fs.stat.d" / "policy": "allow wk_t tool:fs.stat execute\n",
    }
    n = 0
    while not stop.is_set():
        n += 1
        for path, rule in files.items():
            text = path.read_text()
            text = text.replace(rule, "") if rule in text else text + rule
            replace_atomically(path, text, spare)
        query = w.ctx("policy", "query", "--policy", w.storage / "agent" / "wk.d" / "policy",
                      "--policy", w.storage / "tool" / f"{TOOL}.d" / "policy",
                      "wk_t", f"tool:{TOOL}", "execute")  # fmt: skip
        if query.rc != 0 or query.out.strip() != "allow":
            w.problem("policy", repr(query))
        stop.wait(0.2)


def killed_worker_loop(w: World, stop: threading.Event, kills: list[str]) -> None:
    """W-3, Q-5: a third worker (session ``w3``) SIGKILLed while it holds a job, then
    ``ctx queue recover``: exit 0, or 1 for an incomplete pair the kill left (never a
    conflict), which ``recover --reconcile`` settles (exit 0)."""
    n = 0
    while not stop.is_set():
        n += 1
        out = w.top / f"w3-{n}.out"
        with open(out, "wb") as sink:
            proc = w.popen("queue", "work", "--project", "proj", "--agent", "wk",
                           "--session", "w3", "--json", stdout=sink)  # fmt: skip
        if n % 4 == 0:  # while it starts, or waits for work
            time.sleep(0.05 * (n % 8))
        else:  # while it holds a job: claiming, running its tool, finishing
            wait_for(lambda out=out: b'"claim"' in out.read_bytes() or stop.is_set(), 3, 0.01)
            time.sleep(0.03 * (n % 5))
        proc.kill()
        _, err = proc.communicate()
        kills.append(out.read_text())
        if proc.returncode != -signal.SIGKILL:
            w.problem("w3", f"exit {proc.returncode}: {err.decode()[-2000:]}")
        plain = w.ctx("queue", "recover", "--project", "proj", "--json")
        if plain.rc not in (0, 1) or TRACEBACK in plain.err:
            w.problem("recover", repr(plain))
            continue
        report = plain.json()
        if report["conflicts"] or report["errors"]:
            w.problem("recover", repr(plain))
        w.count(f"recover exit {plain.rc}")
        if plain.rc == 1:
            settled = w.ctx("queue", "recover", "--project", "proj", "--reconcile", "--json")
            if settled.rc != 0 or settled.json()["conflicts"]:
                w.problem("recover", f"{plain!r}\nthen\n{settled!r}")
        stop.wait(0.1)


def terminal_caller(w: World, typist: Raw, stop: threading.Event, answers: list[str]) -> None:
    """A-1, A-2, H-1: calls typed in the agent's terminal while its tools are reinstalled
    and its policy edited: each call answers as the tool does."""
    n = 0
    while not stop.is_set():
        n += 1
        try:
            said = typist.answer("fs.read notes.txt")
            if said != NOTE:
                w.problem("terminal", f"fs.read said {said!r}")
            said = typist.answer(f"{TOOL} t{n}")
            answers.append(said)
            if not said.startswith(f"mark t{n} v") or said.count("\n") != 1:
                w.problem("terminal", f"{TOOL} t{n} said {said!r}")
        except AssertionError as exc:
            w.problem("terminal", f"call {n}: {exc}")
            return


def status_reader(w: World, stop: threading.Event) -> None:
    """§2.4: ``ctx queue status --json`` of the busy queue exits 0 (it finds no conflict:
    nothing here makes one)."""
    while not stop.is_set():
        done = w.ctx("queue", "status", "--project", "proj", "--json")
        try:
            status = done.json()
            added = sum(status[s] for s in ("pending", "claimed", "done", "failed"))
        except (ValueError, KeyError, TypeError):
            w.problem("status", repr(done))
            continue
        if done.rc != 0 or status["conflicts"] or added < 0:
            w.problem("status", repr(done))
        w.count("status")
        stop.wait(0.1)


NON_ROOT_READER = """
while [ ! -e "$1/stop" ]; do
    d=$(cat "$2/tool/job.mark.d/description") || echo "description: exit $?"
    case $d in "job.mark version v"*) ;; *) echo "description: $d";; esac
    ls "$2/tool" | grep -qx job.mark || echo "tool/ without job.mark"
    [ -x "$2/tool/job.mark" ] || echo "tool/job.mark not executable"
    echo round >> "$1/rounds"
done
"""


def mount_reader(w: World, where: Path, stop: threading.Event) -> None:
    """F-1: the root view read while all this happens: the tool and its controls are always
    there, finished jobs' results always read whole."""
    rounds = 0
    while not stop.is_set():
        rounds += 1
        try:
            tools = set(os.listdir(where / "tool"))
            if not {TOOL, f"{TOOL}.d"} <= tools:
                w.problem("mount", f"round {rounds}: tool/ lists {sorted(tools)}")
            description = (where / "tool" / f"{TOOL}.d" / "description").read_text()
            if not description.startswith(f"{TOOL} version v"):
                w.problem("mount", f"description {description!r}")
            results = sorted(n for n in os.listdir(where / "shared/proj/queue/done")
                             if n.endswith(".result"))  # fmt: skip
            if results:
                result = json.loads((where / "shared/proj/queue/done" / results[-1]).read_text())
                if result["status"] != "ok":
                    w.problem("mount", f"{results[-1]}: {result}")
            os.listdir(where / "agent")
        except (OSError, ValueError) as exc:
            w.problem("mount", f"round {rounds}: {exc!r}")
        stop.wait(0.02)


@dataclass
class Follower:
    proc: subprocess.Popen
    out: Path
    events: Path


def follow(w: World, agent: str, session: str) -> Follower:
    """``ctx session tail AGENT SESSION --follow --json`` from the session's first event."""
    events = w.home_session(agent, session) / "events.jsonl"
    assert wait_for(events.exists, 15), events
    out = w.top / f"follow-{agent}-{session}.out"
    with open(out, "wb") as sink:
        proc = w.popen("session", "tail", agent, session, "--follow", "--json", "-n",
                       "1000000", stdout=sink)  # fmt: skip
    return Follower(proc, out, events)


# ------------------------------------------------------------------------------ the flow


def test_everything_at_once_on_one_storage_root(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    w = world
    stop = threading.Event()
    jobs = Jobs()
    kills: list[str] = []
    made: list[str] = []
    answers: list[str] = []
    term = w.start()
    mountpoint = w.top / "mnt"
    mountpoint.mkdir()
    workers = []
    for k in (1, 2):
        with open(w.top / f"w{k}.out", "wb") as sink:
            workers.append(w.popen("queue", "work", "--project", "proj", "--agent", "wk",
                                   "--session", f"w{k}", "--concurrency", "2", "--json",
                                   stdout=sink))  # fmt: skip
    followers: list[Follower] = []
    signals = w.top / "nonroot"
    signals.mkdir(mode=0o777)
    signals.chmod(0o777)
    with serving(w.storage, mountpoint) as mount, contextlib.ExitStack() as cleanup:
        typist = Raw(term.listening_at, b"attach\n")
        cleanup.callback(typist.close)
        assert typist.shows(AGENT_PROMPT), typist.text()
        # F-1 for a uid that is not root: the root view, read through the mount as it is.
        outsider = subprocess.Popen(
            ["/bin/sh", "-c", NON_ROOT_READER, "sh", str(signals), str(mountpoint)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            user=unprivileged_user.uid, group=unprivileged_user.gid, extra_groups=[],
            cwd="/",
        )  # fmt: skip
        threads = [
            threading.Thread(target=publisher, args=(w, jobs, "pa", stop)),
            threading.Thread(target=publisher, args=(w, jobs, "pb", stop)),
            threading.Thread(target=installer, args=(w, stop)),
            threading.Thread(target=installer, args=(w, stop, "b")),
            threading.Thread(target=rivals, args=(w, stop, jobs, made)),
            threading.Thread(target=pair_observer, args=(w, stop)),
            threading.Thread(target=bootstrapper, args=(w, stop)),
            threading.Thread(target=creator, args=(w, stop, made)),
            threading.Thread(target=policy_editor, args=(w, stop)),
            threading.Thread(target=killed_worker_loop, args=(w, stop, kills)),
            threading.Thread(target=terminal_caller, args=(w, typist, stop, answers)),
            threading.Thread(target=mount_reader, args=(w, mountpoint, stop)),
            threading.Thread(target=status_reader, args=(w, stop)),
        ]
        for thread in threads:
            thread.start()
        followers.append(follow(w, "wk", "w1"))
        followers.append(follow(w, "coder", term.session))
        followers.append(follow(w, "wk", "w3"))
        time.sleep(CHURN)
        stop.set()
        (signals / "stop").touch()
        said, _ = outsider.communicate(timeout=30)
        rounds = len((signals / "rounds").read_text().splitlines())
        if outsider.returncode != 0 or said or rounds < 5:
            w.problem("mount", f"uid {unprivileged_user.uid}: exit {outsider.returncode}, "
                               f"{rounds} rounds: {said.decode()[-2000:]!r}")  # fmt: skip
        for thread in threads:
            thread.join(60)
            assert not thread.is_alive(), thread

        # The two workers stop as SIGTERM asks: running jobs finish, exit 0 (W-4).
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        for proc in workers:
            _, err = proc.communicate(timeout=60)
            if proc.returncode != 0:
                w.problem("workers", f"exit {proc.returncode}: {err.decode()[-2000:]}")
        # What is left: recover (nothing live holds a job now), then one drain.
        settled = w.ctx("queue", "recover", "--project", "proj", "--reconcile", "--json")
        if settled.rc != 0 or not settled.json()["consistent"]:
            w.problem("recover", f"final: {settled!r}")
        drained = w.ctx("queue", "work", "--project", "proj", "--agent", "wk", "--session",
                        "final", "--drain", "--concurrency", "4", timeout=120)  # fmt: skip
        if drained.rc != 0:
            w.problem("workers", f"final drain: {drained!r}")

        # The followers catch up with their files, then ^C ends them with exit 0.
        stopped = w.ctx("agent", "stop", "coder", "--session", term.session)
        if stopped.rc == 0:
            w.started.remove(term.session)
        else:
            w.problem("terminal", repr(stopped))
        for f in followers:
            wanted = len(f.events.read_bytes().splitlines())
            caught_up = wait_for(lambda f=f, n=wanted: len(f.out.read_bytes().splitlines()) >= n,
                                 15)  # fmt: skip
            f.proc.send_signal(signal.SIGINT)
            _, err = f.proc.communicate(timeout=30)
            printed = f.out.read_bytes().splitlines()
            held = f.events.read_bytes().splitlines()
            if not caught_up or f.proc.returncode != 0 or printed != held:
                differ = [i for i, (a, b) in enumerate(zip(printed, held, strict=False)) if a != b]
                w.problem(
                    "follow",
                    f"{f.events}: exit {f.proc.returncode}, printed {len(printed)} of "
                    f"{len(held)} events; differing at {differ[:5]}; "
                    f"stderr {err.decode()[-1500:]!r}",
                )
    if mount.proc.returncode not in (0, None):
        w.problem("mount", f"ctx mount exited {mount.proc.returncode}: {mount.said()[-1500:]}")

    report = check_queue(w, jobs, kills)
    check_records(w)
    check_leftovers(w, term)
    summary = (
        f"{len(jobs.published)} jobs, {len(w.versions)} versions installed, {len(kills)} "
        f"kills, {len(made)} agents made, {len(answers)} terminal calls; {report}; {w.counts}"
    )
    assert len(jobs.published) >= 15 and len(w.versions) >= 4 and len(kills) >= 2, summary
    assert len(made) >= 3 and len(answers) >= 3, summary
    assert w.problems == {}, (summary, w.problems)


# ------------------------------------------------------------------------------ the checks


def check_queue(w: World, jobs: Jobs, kills: list[str]) -> str:
    """I-1, I-3, I-4, W-1: every job done or failed exactly once, as its request asked; no
    start after its result; one run for a job no killed worker claimed; the queue settled."""
    q = w.queue
    for sub in ("pending", "claimed", "lease", "inbox"):
        if os.listdir(q / sub):
            w.problem("queue", f"{sub}/ still holds {sorted(os.listdir(q / sub))}")
    on_disk = {n for s in ("done", "failed") for n in os.listdir(q / s)
               if not n.endswith(".result")}  # fmt: skip
    if on_disk != set(jobs.published):
        w.problem("queue", f"unknown {sorted(on_disk - set(jobs.published))}, "
                           f"lost {sorted(set(jobs.published) - on_disk)}")  # fmt: skip
    touched_by_w3 = set()
    for text in kills:
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("event") == "claim":
                    touched_by_w3.add(event["job"])
    for name in read_events(w.home_session("wk", "w3") / "events.jsonl"):
        if name["type"] == "queue.claim":
            touched_by_w3.add(name["object"].removeprefix("queue/"))
    finishes: dict[str, list[str]] = {}
    for session in ("w1", "w2", "w3", "final"):
        for event in read_events(w.home_session("wk", session) / "events.jsonl"):
            if event["type"] == "queue.finish":
                finishes.setdefault(event["object"].removeprefix("queue/"), []).append(session)
    for k in (1, 2):
        said = (w.top / f"w{k}.out").read_text().splitlines()
        events = [json.loads(line) for line in said]
        stops = [e for e in events if e["event"] == "stop"]
        lost = [e for e in events if e["event"] == "lost"]
        if lost or len(stops) != 1 or stops[0]["lost"] != 0 or stops[0]["stopped_by"] != "SIGTERM":
            w.problem("workers", f"w{k}: lost {lost}, stop {stops}")
    runs: dict[str, list[tuple[str, str, float]]] = {}
    for line in (w.outbox / "runs.log").read_text().splitlines():
        fields = line.split(" ")
        if len(fields) != 5:
            w.problem("queue", f"runs.log line {line!r}")
            continue
        kind, token, _version, pid, stamp = fields
        # A run killed with its worker may lose its `date` before its shell: no time then.
        runs.setdefault(token, []).append((kind, pid, float(stamp or 0)))
    finished = {"done": 0, "failed": 0}
    for name, (token, fail) in sorted(jobs.published.items()):
        states = [s for s in ("done", "failed") if (q / s / name).is_file()]
        results = [s for s in ("done", "failed") if (q / s / f"{name}.result").is_file()]
        if states != results or len(states) != 1:
            w.problem("queue", f"{name}: requests in {states}, results in {results}")
            continue
        state = states[0]
        finished[state] += 1
        result = json.loads((q / state / f"{name}.result").read_text())
        if state != ("failed" if fail else "done"):
            w.problem("queue", f"{name} (fail={fail}) ended {state}: {result}")
            continue
        output = result.get("output")
        if not isinstance(output, dict) or output.get("id") != token:
            w.problem("queue", f"{name}: output {output!r}, not of token {token}")
        elif output.get("version") not in w.versions:
            w.problem("queue", f"{name}: ran version {output.get('version')}, never installed")
        at = rfc3339(result["finished"]).timestamp()
        starts = [r for r in runs.get(token, []) if r[0] == "start"]
        late = [r for r in starts if r[2] > at]
        if late:
            w.problem("queue", f"{name}: started after its result ({result['finished']}): {late}")
        if len(finishes.get(name, [])) > 1 or (
            name not in touched_by_w3 and len(finishes.get(name, [])) != 1
        ):
            w.problem("queue", f"{name}: queue.finish recorded by {finishes.get(name)}")
        if name not in touched_by_w3 and len(starts) != 1:
            w.problem("queue", f"{name}: started {len(starts)} times: {runs.get(token)}")
        ends = {pid: stamp for kind, pid, stamp in runs.get(token, []) if kind == "end"}
        spans = sorted((s, ends[p]) for _, p, s in starts if p in ends)
        for (_, end1), (start2, _) in itertools.pairwise(spans):
            if start2 < end1:
                w.problem("queue", f"{name}: two runs at once: {runs.get(token)}")
    return f"{finished}, {len(touched_by_w3)} jobs claimed by the killed worker"


def check_records(w: World) -> None:
    """S-2, S-5, T-7: every events file and log parses; each tool_call has its tool_result
    (the killed worker's own session excepted, for the jobs it held when killed); the
    tool's log holds one line per result, across every reinstall."""
    for path in sorted(w.storage.rglob("events.jsonl")):
        for text in jsonl_problems(path, events=True):
            w.problem("records", text)
    for path in sorted(w.storage.glob("*/*.d/log")):
        for text in jsonl_problems(path, events=False):
            w.problem("records", text)
    results_of_tool = 0
    for path in sorted(w.storage.rglob("events.jsonl")):
        events = read_events(path)
        calls = {e["call"]: e for e in events if e["type"] == "tool_call"}
        results = [e for e in events if e["type"] == "tool_result"]
        answered = [e["call"] for e in results]
        results_of_tool += sum(e["object"] == f"tool/{TOOL}" for e in results)
        if sorted(set(answered)) != sorted(answered) or not set(answered) <= set(calls):
            w.problem("records", f"{path}: results without their call, or twice")
        open_calls = [c for c in calls if c not in set(answered)]
        if open_calls and path.parent.name != "w3":
            w.problem("records", f"{path}: tool_call without tool_result: {open_calls}")
    log = read_events(w.storage / "tool" / f"{TOOL}.d" / "log")
    if len(log) != results_of_tool:
        w.problem("records", f"tool log holds {len(log)} lines for {results_of_tool} results")


def check_leftovers(w: World, term) -> None:
    """A-2, F-1, W-4: no process of this storage root, no mount under it, no runtime
    directory of the stopped terminal."""
    left = wait_for(lambda: not leftovers(w.top, w.storage), 10)
    if not left:
        w.problem("leftovers", "\n".join(leftovers(w.top, w.storage)))
    if mounts_under(w.top):
        w.problem("leftovers", f"mounted: {mounts_under(w.top)}")
    if term.rundir.exists() or mounted_at(term.rundir / "private" / "ctx"):
        w.problem("leftovers", f"terminal runtime directory left: {term.rundir}")
