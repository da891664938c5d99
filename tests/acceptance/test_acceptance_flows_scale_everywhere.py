"""Everything around the queue at the size a busy multi-agent project reaches (SPEC R-3, T-4,
T-8a, P-5, P-6, P-8, S-1, S-2, S-5, W-1, §2.1 ``max_result_bytes`` and the limits docs/*.md
state): hundreds of tools in the system, user and shared tiers listed and resolved along a
``CTX_PATH`` of more than a thousand entries, an agent that reads hundreds of spaces and runs a tool
found in the last of them, names of exactly 64 bytes and of 65 read from requests, manifests
and policies, thousands of sessions, a session of tens of thousands of events shown, tailed,
appended to and repaired at its end, and tool outputs and job results near their limits.

Large inputs are written straight to disk where the documents say a reader meets plain files
(a tier's tool pairs, a space's directories, ``events.jsonl``); commands that read them run
under an address-space limit (``RLIMIT_AS``, as ``prlimit --as`` sets it) so that a reader
that holds what it should stream fails visibly, and under a timeout only a hang reaches.
Nothing here asserts a duration."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    scratch_top,
    tool_manifest,
)
from tests.acceptance.ctxcli import limited as limited_run
from tests.acceptance.workercli import AGENT, LABEL, allow_in_tool_policy, make_agent
from tests.support.storage import copy_of_root, small_tmpfs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as another uid")

MIB = 1 << 20
TRACEBACK = "Traceback (most recent call last)"
TIMEOUT = 90  # seconds: a bound only a hang reaches
# Address-space limits.  A ``ctx`` command that streams what it reads runs in about 32 MiB of
# address space; twice that is the bound for a session reader, and 256 MiB (sixteen times a
# 16 MiB text output, the bound the suite gives such an output) for a tool call.
READER = 64 * MIB
CALL = 256 * MIB
LONGEST = 64  # an object name is 1 to 64 bytes


def name_of(length: int, stem: str, n: int = 0) -> str:
    """A legal object name (R-3) of exactly ``length`` bytes, ending in the number ``n``."""
    tail = f"{n:04d}"
    return stem + "x" * (length - len(stem) - len(tail)) + tail


def limited(env: dict[str, str], *args, memory: int = CALL, input: bytes | str = b"") -> Run:
    return limited_run(env, *args, input=input, address_space=memory, timeout=TIMEOUT)


def ok(run: Run) -> Run:
    assert run.rc == 0 and TRACEBACK not in run.err, run
    return run


def frames(run: Run) -> list[dict]:
    return [json.loads(line) for line in run.out.splitlines() if line.strip()]


def copy_entry(source: Path, target: Path, data: bytes | None = None) -> None:
    """``target`` made like ``source`` (a directory, or a file holding ``data`` or a copy of
    its bytes), with its owner, group and mode: owner first, since a chown clears set-id
    bits."""
    status = source.lstat()
    if source.is_dir():
        target.mkdir()
    else:
        target.write_bytes(source.read_bytes() if data is None else data)
    os.chown(target, status.st_uid, status.st_gid)
    target.chmod(status.st_mode & 0o7777)


def copy_tree(source: Path, target: Path) -> None:
    """The tree ``source`` copied to ``target`` with every owner, group and mode kept."""
    copy_entry(source, target)
    for dirpath, dirnames, filenames in os.walk(source):
        here = Path(dirpath)
        for name in sorted(dirnames) + sorted(filenames):
            copy_entry(here / name, target / (here / name).relative_to(source))


def copy_tool_pairs(tier: Path, model: str, names: list[str]) -> None:
    """Tool pairs ``names`` in ``tier``, each the installed pair ``model`` whose ``name``
    control names it: what ``ctx object install`` of the same manifest under each name leaves
    (T-1: plain files), written directly."""
    for name in names:
        copy_tree(tier / f"{model}.d", tier / f"{name}.d")
        (tier / f"{name}.d" / "name").write_text(f"{name}\n")
        copy_entry(tier / model, tier / name)


@dataclass
class World:
    """A bootstrapped root every uid may search (queue ``proj``), agent ``ci`` (uid nobody)
    allowed ``shell.exec`` by both layers of P-6, and a scratch directory beside it."""

    root: Path
    scratch: Path

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.root))

    def ctx(self, *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        kw.setdefault("timeout", TIMEOUT)
        return ctx_run(*args, **kw)

    def manifest(self, name: str, program: str) -> Path:
        return tool_manifest(self.scratch / "manifests", name, program)

    def install(self, name: str, program: str, tier: str) -> None:
        ok(self.ctx("object", "install", self.manifest(name, program), "--tier", tier))

    def identity(self) -> dict:
        return json.loads((self.root / "agent" / f"{AGENT}.d" / "identity").read_text())

    def home_sessions(self) -> Path:
        return self.root / "home" / str(self.identity()["uid"]) / "agent" / AGENT / "session"

    def grant(self, *rules: str) -> None:
        with open(self.root / "agent" / f"{AGENT}.d" / "policy", "a") as policy:
            policy.writelines(f"allow {LABEL} {rule}\n" for rule in rules)


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    """The world on a tmpfs of its own: what a test writes by the thousand is then made and
    removed without waiting on, or slowing, the disk of others."""
    scratch = new_scratch_dir(scratch_top(__file__))
    try:
        with small_tmpfs(scratch / "fs", "1g", mode=0o755) as disk:
            root = copy_of_root(_template, disk / "storage")
            make_agent(root, ["shell.exec"])
            allow_in_tool_policy(root, "shell.exec")
            yield World(root, disk)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ------------------------------------------------- T-8a, T-4: hundreds of tools in three tiers


TOOLS_PER_TIER = 100
ECHO = '#!/bin/sh\necho "$CTX_TOOL:$*"\n'


def test_hundreds_of_tools_in_three_tiers_are_listed_once_and_found_late_on_a_long_path(
    world: World,
) -> None:
    """T-8a (``ctx object list [--tier T]`` lists installed objects; ``which`` prints what
    ``CTX_PATH`` resolves a name to), T-4 and docs/tools.md "CTX_PATH" (left
    to right, the first directory holding an executable regular file of that name; a file
    without an execute bit or a link is no hit and ``which --json`` lists it as skipped):
    100 tools in each of the system, user and shared tiers, one of each named with 64 bytes,
    are each listed once, ``available``, in its tier, by ``list`` and ``list --json`` alike and
    by ``--tier``; along a ``CTX_PATH`` of 1 200 missing directories, entries whose names the
    kernel refuses as too long, a regular file, and directories holding a non-executable file
    and a link of that name, the name resolves to the last entry, each miss skipped with its
    reason; two tiers holding one name resolve to the one named first."""
    tiers = {
        "system": world.root / "tool",
        "user": world.root / "home" / "0" / "tool",
        "shared:proj": world.root / "shared" / "proj" / "tool",
    }
    with ThreadPoolExecutor(3) as pool:  # the tiers are independent
        list(pool.map(lambda n, t: world.install(f"model.{n}", ECHO, t), range(3), tiers))
    made: dict[str, list[str]] = {}
    for number, (tier, directory) in enumerate(tiers.items()):
        names = [name_of(LONGEST, f"t{number}.")]
        names += [f"t{number}.{i:04d}" for i in range(1, TOOLS_PER_TIER)]
        copy_tool_pairs(directory, f"model.{number}", names)
        made[tier] = [f"model.{number}", *names]
    env = world.env

    listed = ok(limited(env, "object", "list", "--json")).json()
    seen: dict[str, list[str]] = {}
    for entry in listed:
        seen.setdefault(entry["tier"], []).append(entry["name"])
        if entry["name"].startswith(("t0.", "t1.", "t2.", "model.")):
            assert (entry["status"], entry["problems"]) == ("available", []), entry
    for tier, names in made.items():
        mine = [n for n in seen[tier] if n.startswith(("t0.", "t1.", "t2.", "model."))]
        assert sorted(mine) == sorted(names), (tier, len(mine))
    text = ok(limited(env, "object", "list")).lines()
    assert len(text) == len(listed), (len(text), len(listed))
    rows = {tuple(line.split()[:3]) for line in text}
    for tier, names in made.items():
        assert all((name, tier, "available") in rows for name in names), tier
    user = ok(limited(env, "object", "list", "--tier", "user", "--json")).json()
    assert sorted(e["name"] for e in user) == sorted(made["user"])  # that tier alone

    target = made["shared:proj"][1]  # the 64-byte name, only in the shared tier
    misses = world.scratch / "misses"
    (misses / "plain").mkdir(parents=True)
    (misses / "plain" / target).write_text("#!/bin/sh\n")  # no execute bit
    (misses / "linked").mkdir()
    (misses / "linked" / target).symlink_to(tiers["shared:proj"] / target)
    entries = [str(misses / f"gone-{i:04d}") for i in range(1200)]
    entries += [str(misses / ("n" * 300)), str(misses / "/".join(["d" * 250] * 20))]
    entries += [str(misses / "plain" / target)]  # a file, not a directory
    entries += [str(misses / "plain"), str(misses / "linked"), str(tiers["shared:proj"])]
    on_path = {**env, "CTX_PATH": ":".join(entries)}
    found = ok(limited(on_path, "object", "which", target))
    assert found.out == f"{tiers['shared:proj'] / target}\n", found
    report = ok(limited(on_path, "object", "which", target, "--json")).json()
    assert report["path"] == str(tiers["shared:proj"] / target), report
    skipped = " ".join(report["skipped"])
    for miss in ("plain", "linked", "n" * 300):
        assert str(misses / miss / target) in skipped, report["skipped"]

    both = made["user"][2]  # installed in the user tier only: give the system tier one too
    copy_tool_pairs(tiers["system"], made["system"][0], [both])
    for first, second in (("system", "user"), ("user", "system")):
        order = {**env, "CTX_PATH": f"{tiers[first]}:{tiers[second]}"}
        assert ok(limited(order, "object", "which", both)).out == f"{tiers[first] / both}\n"


# -------------------------------------- T-4, P-5, P-6: an agent that reads hundreds of spaces


SPACES = 200


def test_an_agent_reading_hundreds_of_spaces_runs_the_tool_of_the_last_and_is_told_why_not(
    world: World,
) -> None:
    """T-4 (an agent's ``CTX_PATH`` is ``/ctx/tool:/ctx/home/<uid>/tool`` then
    ``/ctx/shared/<space>/tool`` for every space its policy lets it read, in name order; the
    hit is the first on the path), P-5/P-6 (a denial names its step and the rule missing),
    S-2 (a tool call's ``object`` is the tool where the path finds it): agent ``ci`` may read
    200 spaces of 64-byte names.  A tool installed only in the last space runs, recorded
    under that space; without the tool layer's rule the call is refused at step 6 naming the
    whole rule and the policy file of the last space; once the first space holds a tool of the
    same name, that one is the hit.  Grants for 1 700 spaces make a ``CTX_PATH`` longer than
    one variable may be: the call cannot start, E2BIG naming ``CTX_PATH``."""
    gid = world.identity()["gid"]
    spaces = [name_of(LONGEST, "S", i) for i in range(SPACES)]
    ok(world.ctx("shared", "create", spaces[0], "--group", str(gid)))
    shared = world.root / "shared"
    for space in spaces[1:]:
        copy_tree(shared / spaces[0], shared / space)
    tool = "late.tool"
    world.install(tool, ECHO, f"shared:{spaces[-1]}")
    world.grant(*(f"shared:{space} read" for space in spaces), f"tool:{tool} execute")
    tool_policy = shared / spaces[-1] / "tool" / f"{tool}.d" / "policy"
    without = tool_policy.read_text()
    tool_policy.write_text(without + f"allow {LABEL} tool:{tool} execute\n")
    env = world.env

    ran = ok(limited(env, "run", "--agent", AGENT, "--session", "wide", tool, "a", "b"))
    assert ran.out == f"{tool}:a b\n", ran
    events = world.home_sessions() / "wide" / "events.jsonl"
    objects = {json.loads(line)["object"] for line in events.read_text().splitlines()}
    assert objects == {f"shared/{spaces[-1]}/tool/{tool}"}, objects
    explained = ok(limited(env, "policy", "explain", AGENT, f"tool:{tool}", "execute"))
    assert explained.lines()[-1] == "allow", explained

    tool_policy.write_text(without)
    refused = limited(env, "run", "--agent", AGENT, tool)
    assert refused.rc == 126 and refused.out == "", refused
    assert refused.err.rstrip("\n") == (
        f"ctx: EACCES: step 6 (tool/model policy): shared/{spaces[-1]}/tool/{tool}.d/policy "
        f"has no rule 'allow {LABEL} tool:{tool} execute'"
    ), refused

    tool_policy.write_text(without + f"allow {LABEL} tool:{tool} execute\n")
    world.install(tool, "#!/bin/sh\necho first\n", f"shared:{spaces[0]}")
    first = limited(env, "run", "--agent", AGENT, tool)
    assert first.rc == 126, first
    assert f"shared/{spaces[0]}/tool/{tool}.d/policy has no rule" in first.err, first

    first_policy = shared / spaces[0] / "tool" / f"{tool}.d" / "policy"
    with open(first_policy, "a") as policy:
        policy.write(f"allow {LABEL} tool:{tool} execute\n")
    assert ok(limited(env, "run", "--agent", AGENT, tool)).out == "first\n"
    world.grant(*(f"shared:{name_of(LONGEST, 'T', i)} read" for i in range(1700)))
    crowded = limited(env, "run", "--agent", AGENT, "--session", "crowded", tool)
    assert crowded.rc == 126 and crowded.err.startswith("ctx: E2BIG: "), crowded.err[:300]
    assert "CTX_PATH" in crowded.err and TRACEBACK not in crowded.err, crowded.err[-400:]
    result = json.loads(
        (world.home_sessions() / "crowded" / "events.jsonl").read_text().splitlines()[-1]
    )
    assert (result["type"], result["errno"], result["stage"]) == ("tool_result", "E2BIG", "run")


# ---------------------------------------------- 64 bytes and 65 in what files name


def test_names_of_64_bytes_read_from_files_are_taken_and_of_65_refused_with_nothing_made(
    world: World,
) -> None:
    """R-3 (1 to 64 bytes; anything else EINVAL), A-3 (an agent request names the agent, its
    label, tools, spaces, models and mounts, whose last part names the mount in policy), T-8
    (a manifest's ``name``), §2.1 (a request's ``tool``), P-1/P-8 (a rule's subject and
    object): every such name of exactly 64 bytes is taken — the agent is made and its policy
    holds each rule whole, the tool installed, the job published, the rule valid — and the
    same name one byte longer is refused with EINVAL saying so, with nothing made."""
    n64, n65 = "q" * 64, "q" * 65
    source = world.scratch / "src"
    source.mkdir(mode=0o755)

    def request(name: str, **fields) -> dict:
        made = {"name": name, "label": f"{name[:60]}_t", "tools": ["fs.stat"]}
        made.update(fields)
        return made

    requests = {
        "name": lambda n: request(n),
        "label": lambda n: request("lb", label=n),
        "tools": lambda n: request("tl", tools=[n]),
        "shared": lambda n: request("sh", shared={n: ["read"]}),
        "model": lambda n: request("md", model=[f"p/{n}"]),
        "mount": lambda n: request("mt", mount=[[str(source), f"/data/{n}", "ro"]]),
    }
    with ThreadPoolExecutor(4) as pool:
        long = dict(zip(requests, pool.map(
            lambda make: world.ctx("agent", "create", "-", input=json.dumps(make(n65))),
            requests.values(),
        ), strict=True))  # fmt: skip
    for field, answer in long.items():
        assert answer.rc == 1 and answer.err.startswith("ctx: EINVAL: "), (field, answer)
        assert "is 65 bytes long; at most 64 are allowed" in answer.err, (field, answer)
    agents = sorted(os.listdir(world.root / "agent"))
    assert [a for a in agents if not a.startswith((".", AGENT))] == [], agents

    with ThreadPoolExecutor(4) as pool:
        made = list(pool.map(
            lambda make: world.ctx("agent", "create", "-", input=json.dumps(make(n64))),
            requests.values(),
        ))  # fmt: skip
    for answer in made:
        ok(answer)
    policy = (world.root / "agent" / f"{n64}.d" / "policy").read_text()
    assert f"allow {n64[:60]}_t tool:fs.stat execute\n" in policy
    label_policy = (world.root / "agent" / "lb.d" / "policy").read_text()
    assert f"allow {n64} tool:fs.stat execute\n" in label_policy
    for agent, rule in (("tl", f"tool:{n64} execute"), ("sh", f"shared:{n64} read"),
                        ("md", f"model:p/{n64} use"), ("mt", f"mount:{n64} read")):  # fmt: skip
        text = (world.root / "agent" / f"{agent}.d" / "policy").read_text()
        assert f"allow {agent[:60]}_t {rule}\n" in text, (agent, text)

    fits, over = world.manifest(n64, ECHO), world.manifest(n65, ECHO)
    ok(world.ctx("object", "install", fits, "--tier", "system"))
    assert (world.root / "tool" / n64).is_file()
    refused = world.ctx("object", "install", over, "--tier", "system")
    assert refused.rc == 1 and "is 65 bytes long" in refused.err, refused
    assert not [n for n in os.listdir(world.root / "tool") if n65 in n]

    queue = QueueCLI(world.root, "proj")
    job = queue.publish({"tool": n64, "input": {}})
    assert json.loads((queue.dir / "pending" / job).read_text())["tool"] == n64
    over_job = queue.run("publish", "-", input=json.dumps({"tool": n65, "input": {}}))
    assert over_job.rc == 1 and "is 65 bytes long" in over_job.err, over_job
    assert os.listdir(queue.dir / "pending") == [job]

    rules = f"allow {n64} tool:{n64} execute\nallow {n65} tool:{n64} execute\n"
    checked = world.ctx("policy", "check", "-", input=rules)
    assert checked.rc == 1 and checked.err.startswith("-:2: EINVAL: "), checked
    assert "-:1:" not in checked.err, checked


# --------------------------------------------------------- S-1: thousands of sessions


SESSIONS = 3000


def write_session(directory: Path, events: list[bytes], owner: os.stat_result) -> Path:
    """A session directory holding ``events`` as its ``events.jsonl``, owned and moded as a
    home session is (docs/sessions.md: 0700, 0600, the agent's uid and gid)."""
    directory.mkdir(mode=0o700)
    os.chown(directory, owner.st_uid, owner.st_gid)
    path = directory / "events.jsonl"
    path.write_bytes(b"".join(events))
    os.chown(path, owner.st_uid, owner.st_gid)
    path.chmod(0o600)
    return path


def event(session: str, n: int, **facts) -> bytes:
    """One whole event line of ``ci`` (S-2's six keys first)."""
    fields = {"ts": "2026-12-04T12:00:00Z", "type": "note", "agent": AGENT, "session": session,
              "object": "tool/x", "status": "ok", "n": n, **facts}  # fmt: skip
    return json.dumps(fields, separators=(",", ":")).encode() + b"\n"


def first_call(world: World, session: str = "default") -> os.stat_result:
    """One call into ``session`` (which makes the agent's home), and the owner of its file."""
    ok(world.ctx("run", "--agent", AGENT, "--session", session, "shell.exec", "true"))
    return (world.home_sessions() / session / "events.jsonl").stat()


def test_thousands_of_sessions_of_64_byte_names_are_listed_each_once_and_read(
    world: World,
) -> None:
    """S-1 (sessions are ordinary directories), R-3, docs/sessions.md "Commands" (``list``
    prints one session name a line; ``list --json`` one array of ``{"name", "path"}``):
    3 000 sessions of 64-byte names beside the agent's ``default`` are each listed once, in
    text and JSON alike, bounded in memory; the last is shown, and a call into it appends
    after its event."""
    owner = first_call(world)
    sessions = world.home_sessions()
    names = [name_of(LONGEST, "s", i) for i in range(SESSIONS)]
    for name in names:
        write_session(sessions / name, [event(name, 0)], owner)
    env = world.env
    listed = ok(limited(env, "session", "list", AGENT, memory=READER)).lines()
    assert sorted(listed) == sorted([*names, "default"]), len(listed)
    as_json = ok(limited(env, "session", "list", AGENT, "--json", memory=READER)).json()
    assert sorted(e["name"] for e in as_json) == sorted(listed)
    assert {e["name"]: e["path"] for e in as_json}[names[-1]].endswith(f"/session/{names[-1]}")

    shown = ok(limited(env, "session", "show", AGENT, names[-1], "--json", memory=READER))
    assert [e["n"] for e in frames(shown)] == [0], shown
    ok(world.ctx("run", "--agent", AGENT, "--session", names[-1], "shell.exec", "true"))
    after = ok(limited(env, "session", "show", AGENT, names[-1], "--json", memory=READER))
    assert [e["type"] for e in frames(after)] == ["note", "tool_call", "tool_result"], after


# ------------------------------------------ S-5: a session of tens of thousands of events


EVENTS = 30_000
TAILED_EVENTS = 80_000


def big_session(world: World, name: str, count: int = EVENTS) -> Path:
    owner = first_call(world)
    return write_session(
        world.home_sessions() / name, [event(name, n) for n in range(count)], owner
    )


def bytes_read_from(trace: Path, name: str) -> int:
    """What the traced processes read from a file called ``name``, by the output of ``strace
    -f -y -e trace=read,pread64`` (each descriptor shown with its path; a call another thread
    interrupted is finished on a ``resumed`` line of the same pid)."""
    pending: set[str] = set()
    total = 0
    for line in trace.read_text().splitlines():
        pid, _, call = line.partition(" ")
        call = call.lstrip()
        if call.startswith(("read(", "pread64(")):
            if f"/{name}>," not in call.split(" ", 1)[0]:
                continue
            if "<unfinished" in call:
                pending.add(pid)
                continue
        elif call.startswith(("<... read resumed>", "<... pread64 resumed>")):
            if pid not in pending:
                continue
            pending.discard(pid)
        else:
            continue
        done = call.rsplit("= ", 1)[-1].split()[0]
        total += int(done) if done.isdigit() else 0
    return total


def traced(world: World, trace: Path, *args: str) -> Run:
    """``ctx ARGS…`` under strace, its reads written to ``trace`` (see :func:`bytes_read_from`)."""
    argv = ["strace", "-f", "-y", "--seccomp-bpf", "-o", str(trace), "-e", "trace=read,pread64"]
    proc = subprocess.run(
        [*argv, *CTX_ARGV, *args], capture_output=True, env=world.env, timeout=TIMEOUT
    )
    return Run(list(args), proc.returncode, proc.stdout.decode(), proc.stderr.decode())


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_session_of_30000_events_is_streamed_and_appended_to_and_repaired_at_its_end(
    world: World,
) -> None:
    """S-5, docs/sessions.md ("Readers read the file in pieces of 64 KiB and hold at most two
    of them, whatever the file holds"; a torn last line is cut by ``repair`` and by the next
    appender, which waits for appends in flight): a session of 30 000 events (3.4 MB) is shown
    whole and in order, and its last three tailed, each under an address space of 64 MiB.
    After a torn line, ``repair`` cuts exactly it, and the next call appends two whole lines
    after the last event: neither reads more of the file than a few pieces from its end."""
    events = big_session(world, "big")
    original = events.read_bytes()
    size = len(original)
    env = world.env
    shown = ok(limited(env, "session", "show", AGENT, "big", "--json", memory=READER))
    assert [e["n"] for e in frames(shown)] == list(range(EVENTS))
    tail = ok(limited(env, "session", "tail", AGENT, "big", "-n", "3", "--json", memory=READER))
    assert [e["n"] for e in frames(tail)] == list(range(EVENTS - 3, EVENTS)), tail

    torn = b'{"ts":"2026-12-04T12:00:00Z","type":"note","pad":"' + b"t" * 5000
    with open(events, "ab") as log:
        log.write(torn)
    repaired = ok(traced(world, world.scratch / "repair.trace", "session", "repair", AGENT,
                         "big", "--json"))  # fmt: skip
    assert json.loads(repaired.out)["truncated_bytes"] == len(torn), repaired
    assert events.stat().st_size == size
    assert 0 < bytes_read_from(world.scratch / "repair.trace", "events.jsonl") <= 4 * 65536

    with open(events, "ab") as log:
        log.write(torn)
    ok(traced(world, world.scratch / "append.trace", "run", "--agent", AGENT, "--session",
              "big", "shell.exec", "true"))  # fmt: skip
    assert 0 < bytes_read_from(world.scratch / "append.trace", "events.jsonl") <= 4 * 65536
    data = events.read_bytes()
    assert data[:size] == original and data.endswith(b"\n")
    added = [json.loads(line) for line in data[size:].splitlines()]
    assert [e["type"] for e in added] == ["tool_call", "tool_result"], data[size : size + 300]


def test_tail_of_every_event_of_a_large_session_is_as_bounded_as_show(world: World) -> None:
    """S-5 and docs/sessions.md ("Readers read the file in pieces of 64 KiB and hold at most
    two of them, whatever the file holds"; ``tail`` prints "the last N"; ``show`` is printed
    as read, within 64 MiB of address space in the test above): ``ctx session tail -n 80000``
    of a session of 80 000 events (9 MB) must print each of them, in order, within the same
    64 MiB, not stop with ENOMEM."""
    big_session(world, "big", TAILED_EVENTS)
    tail = limited(world.env, "session", "tail", AGENT, "big", "-n", str(TAILED_EVENTS),
                   "--json", memory=READER)  # fmt: skip
    assert tail.rc == 0, tail.err[-300:]
    assert [e["n"] for e in frames(tail)] == list(range(TAILED_EVENTS))


# ------------------------------------------ W-1, §2.1: a job's result near max_result_bytes


RESULT_LIMIT = MIB  # set in queue/config below (default 16 MiB, docs/queue.md)


def printing(size: int) -> str:
    """A ``shell.exec`` command that prints exactly ``size`` bytes of ``a``."""
    return f"head -c {size} /dev/zero | tr '\\0' a"


def test_a_job_result_just_under_max_result_bytes_is_done_and_just_over_fails_whole(
    world: World,
) -> None:
    """§2.1 (a result file; the size limit is configurable per queue in ``queue/config``),
    W-1, docs/workers.md ("A result too large": refused by ``finish`` with EFBIG; the worker
    finishes the job in ``failed/`` with ``reason`` ``EFBIG: … [finish]``, ``output_omitted``
    and the output left out, never leaving it claimed) and docs/queue.md ("Configuration"):
    with ``max_result_bytes`` set to 1 MiB, a job whose output leaves its result 4 KiB under
    the limit is done with the output whole; one whose output is 64 bytes under it (its
    result then over it) is failed with the EFBIG record, and the queue is consistent."""
    queue = QueueCLI(world.root, "proj")
    with open(queue.dir / "config", "a") as config:
        config.write(f"max_result_bytes={RESULT_LIMIT}\n")
    under = queue.publish({"tool": "shell.exec", "input": {"cmd": printing(RESULT_LIMIT - 4096)}})
    over = queue.publish({"tool": "shell.exec", "input": {"cmd": printing(RESULT_LIMIT - 64)}})
    worked = limited(world.env, "queue", "work", "--project", "proj", "--agent", AGENT,
                     "--drain", "--json")  # fmt: skip
    assert worked.rc == 0 and TRACEBACK not in worked.err, worked.err[-500:]

    assert (queue.state(under), queue.state(over)) == ("done", "failed"), queue.requests()
    done = queue.dir / "done" / f"{under}.result"
    assert done.stat().st_size <= RESULT_LIMIT
    assert json.loads(done.read_text())["output"] == "a" * (RESULT_LIMIT - 4096)
    failed = json.loads((queue.dir / "failed" / f"{over}.result").read_text())
    assert failed["error"]["error"] == "EFBIG" and failed["error"]["stage"] == "finish", failed
    assert failed["output_omitted"] is True and failed["output"] is None
    assert re.match(r"EFBIG: .* \[finish\]$", failed["reason"]), failed["reason"]
    recovered = ok(world.ctx("queue", "recover", "--project", "proj", "--json"))
    assert recovered.json()["consistent"] is True, recovered


# -------------------------------------- T-3, W-1: a tool output of JSON near the output limit


OUTPUT_ITEMS = 3_000_000  # "[],\n" each: 12 MB of JSON, three quarters of the 16 MiB limit


def json_flood(marker: Path | None = None) -> str:
    """A ``shell.exec`` command whose stdout is one JSON array of 3 000 001 empty arrays, 12 MB
    (after touching ``marker``, when given)."""
    mark = f"echo ran >> {marker}; " if marker else ""
    return f"{mark}printf '['; yes '[],' | head -n {OUTPUT_ITEMS}; printf '[]]'"


def test_a_json_output_too_big_to_hold_decoded_fails_the_call_saying_the_tool_ran(
    world: World,
) -> None:
    """T-3, S-2 (docs/tools.md: a native call's JSON output is held decoded; a runner short of
    memory for it fails the call with ``ENOMEM`` at stage ``run``, keeping the tool's exit
    status and saying the tool ran): under the 256 MiB address space in which ``ctx run
    --native`` takes a 16 MiB text output, a tool printing 12 MB of JSON — one array of three
    million empty arrays — is an error ``ENOMEM``, stage ``run``, exit status 0, whose message
    says it ran and that its output is not kept; no traceback."""
    env = world.env
    native = ("run", "--native", "--agent", AGENT, "shell.exec")
    call = limited(env, *native, input=json.dumps({"cmd": json_flood()}))
    assert TRACEBACK not in call.err, call.err[-500:]
    result = frames(call)[-1]
    assert (result["status"], result["exit_status"]) == ("error", 0), result
    error = result["error"]
    assert (error["error"], error["stage"]) == ("ENOMEM", "run"), error
    assert "shell.exec ran and exited with status 0" in error["message"], error
    assert "could not be decoded, and is not kept" in error["message"], error
    assert result["output"] is None


def test_a_worker_short_of_memory_after_a_tool_ran_does_not_say_the_job_did_not_run(
    world: World, outbox: Path
) -> None:
    """W-1, docs/workers.md ("A host that runs short": a job whose tool *could not start* for
    want of memory stays claimed; "So does a call the worker ran out of memory around") and
    docs/tools.md (a result's ``exit_status`` is null only when the tool never ran or was
    killed before it was given its input): a worker under a 256 MiB address space claims a job
    whose tool records that it ran, then prints 12 MB of JSON (three million empty arrays)
    and exits 0.  The job is finished in ``failed/`` with ``ENOMEM`` and exit status 0 (docs/
    tools.md), not left claimed as one that did not run, and the session's ``tool_result``
    keeps the tool's exit status 0."""
    marker = outbox / "ran"
    queue = QueueCLI(world.root, "proj")
    job = queue.publish({"tool": "shell.exec", "input": {"cmd": json_flood(marker)}})
    worked = limited(world.env, "queue", "work", "--project", "proj", "--agent", AGENT,
                     "--drain")  # fmt: skip
    assert TRACEBACK not in worked.err, worked.err[-500:]
    assert marker.read_text() == "ran\n"  # the tool ran, once
    # Failed with the call's reason, as a result over the output limit is: it ran, and running
    # it again would not give its output back.
    assert worked.rc == 0 and f"job {job} did not run" not in worked.err, worked.err
    assert queue.state(job) == "failed", queue.requests()
    failed = json.loads((queue.dir / "failed" / f"{job}.result").read_text())
    assert failed["error"]["error"] == "ENOMEM" and failed["exit_status"] == 0, failed
    events = world.home_sessions() / "worker" / "events.jsonl"
    results = [json.loads(line) for line in events.read_text().splitlines()]
    [result] = [e for e in results if e["type"] == "tool_result"]
    assert result["exit_status"] == 0, result
