"""Several administrators and scripts running ``ctx`` at the same time against one storage root,
as cron jobs, CI and people do: real processes released together at a barrier, each race
repeated a few rounds.  What the docs promise is checked after each: installs and repairs of
one tier take turns under its ``.install-lock`` (docs/tools.md), creators of shared spaces take
turns under a lock on ``shared/`` (docs/sessions.md), an existing agent is never overwritten,
appends and ``session repair`` share a lock (S-5), and ``recover`` on a busy queue exits 0 and
converges (Q-5, Q-6, I-5)."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QUEUE_SUBDIRS,
    ROOT_ENTRIES,
    QueueCLI,
    age,
    clean_env,
    ctx_run,
    request,
    result,
    scratch_top,
    tool_manifest,
)
from tests.acceptance.workercli import AGENT, shell_job, start_worker
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import storage as storage
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

TRACEBACK = "Traceback (most recent call last)"
SCRATCH = scratch_top(__file__)
CORE = {"fs.read", "fs.list", "fs.stat", "fs.write", "shell.exec", "tsh.config", "tsh"}
# The barrier: each process spins until the go file appears, then becomes the ctx command.
BARRIER = 'until [ -e "$0" ]; do :; done; exec "$@"'

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as another uid and spaces get other groups: needs root"
)


@dataclass
class Done:
    """What one of the racing commands did."""

    argv: list[str]
    rc: int
    out: str
    err: str

    def __repr__(self) -> str:
        return (
            f"$ {' '.join(self.argv)}\nexit {self.rc}\nstdout: {self.out!r}\nstderr: {self.err!r}"
        )

    def json(self):
        return json.loads(self.out)


def together(
    commands: Sequence[Sequence[str | os.PathLike]],
    env: dict[str, str],
    inputs: Sequence[str | None] | None = None,
    timeout: float = 60,
) -> list[Done]:
    """Start every ``ctx ARGS`` of ``commands`` held at one barrier, release them at once, and
    wait for all of them."""
    SCRATCH.mkdir(exist_ok=True)
    go = Path(tempfile.mkdtemp(dir=SCRATCH)) / "go"
    inputs = inputs or [None] * len(commands)
    procs = []
    try:
        for args, text in zip(commands, inputs, strict=True):
            argv = ["sh", "-c", BARRIER, str(go), *CTX_ARGV, *map(str, args)]
            procs.append(
                subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=env,
                    text=True,
                    start_new_session=True,
                )
            )
            procs[-1].stdin.write(text or "")
            procs[-1].stdin.close()
            procs[-1].stdin = None  # given whole before the barrier opens
        go.touch()
        done = []
        for args, proc in zip(commands, procs, strict=True):
            out, err = proc.communicate(timeout=timeout)
            done.append(Done(["ctx", *map(str, args)], proc.returncode, out, err))
        return done
    finally:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(go.parent, ignore_errors=True)


def no_traceback(runs: Sequence[Done]) -> None:
    for run in runs:
        assert TRACEBACK not in run.err and TRACEBACK not in run.out, run


def hidden(directory: Path) -> list[str]:
    """The dot-names of ``directory``: staging, commit markers, lock files."""
    return sorted(n for n in os.listdir(directory) if n.startswith("."))


def layout(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path below ``root`` with its mode, owner and group (never following links)."""
    seen = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top, name)
            st = path.lstat()
            seen[str(path.relative_to(root))] = (st.st_mode, st.st_uid, st.st_gid)
    return seen


def env_for(root: Path, **extra: str) -> dict[str, str]:
    return clean_env(CTX_STORAGE=str(root), **extra)


# ------------------------------------------------------------------------------ bootstrap


def test_two_bootstraps_at_once_build_the_root_one_bootstrap_builds(tmp_path):
    """R-5, R-2, T-1: two ``ctx bootstrap`` started together on a root that does not exist yet
    (two cron jobs of a fresh host) both succeed and leave exactly the tree, modes and owners
    one bootstrap leaves: the six root entries, every core tool available, no staging or commit
    marker beside ``.install-lock``; a third run then has nothing to do."""
    reference = tmp_path / "serial"
    first = ctx_run("bootstrap", "--storage", reference)
    assert first.rc == 0, first
    expected = layout(reference)
    for round_ in range(3):
        root = tmp_path / f"raced{round_}"
        runs = together([("bootstrap", "--storage", root, "--json")] * 2, clean_env())
        no_traceback(runs)
        assert [r.rc for r in runs] == [0, 0], runs
        assert all(r.json()["problems"] == [] for r in runs), runs
        assert set(os.listdir(root)) == ROOT_ENTRIES
        assert layout(root) == expected, round_
        assert hidden(root / "tool") == [".install-lock"]
        listed = ctx_run("object", "list", "--storage", root, "--tier", "system", "--json")
        assert listed.rc == 0, listed
        status = {o["name"]: o["status"] for o in listed.json()}
        assert set(status) >= CORE and set(status.values()) == {"available"}, status
        again = ctx_run("bootstrap", "--storage", root, "--json")
        assert again.rc == 0, again
        report = again.json()
        assert (report["created"], report["repaired"], report["problems"]) == ([], [], []), report


def test_two_bootstraps_at_once_report_each_core_tool_made_once(tmp_path):
    """R-5 with docs/tools.md: installs and repairs of the system tier take turns, each holding
    ``.install-lock`` "from its first look to its last step", so the bootstrap that takes its
    turn second finds the core tools the first installed current and installs nothing again:
    each core tool is reported ``created`` by one run, not by both."""
    for round_ in range(3):
        root = tmp_path / f"raced{round_}"
        runs = together([("bootstrap", "--storage", root, "--json")] * 2, clean_env())
        assert [r.rc for r in runs] == [0, 0], runs
        made = [{c for c in r.json()["created"] if c.startswith("tool/")} for r in runs]
        assert made[0] | made[1] >= {f"tool/{name}" for name in CORE}, made
        assert made[0] & made[1] == set(), f"round {round_}: both created {made[0] & made[1]}"


# ------------------------------------------------------------------------------ tool tiers


def versioned(top: Path, name: str, version: int) -> Path:
    """A v2 manifest of ``name`` version ``version``: its program prints the version, its
    description and schema say it too (so a mix of two versions shows)."""
    directory = top / f"{name}-v{version}"
    program = (
        f"#!/bin/sh\ncat >/dev/null\necho '{{\"version\": {version}}}'\n"
        + ("#" * 1023 + "\n") * 256
    )
    path = tool_manifest(directory, name, program, description=f"{name} version {version}")
    (directory / f"{name}.sh").chmod(0o755)
    document = json.loads(path.read_text())
    document["schema"] = {"type": "object", "title": f"v{version}"}
    path.write_text(json.dumps(document))
    return path


def whole_version(tier_dir: Path, name: str) -> int:
    """The one version tool ``name`` of ``tier_dir`` is: executable, description, schema and
    origin all agree, or the assertion fails."""
    ran = subprocess.run([tier_dir / name], input="{}", capture_output=True, text=True,
                         timeout=30)  # fmt: skip
    assert ran.returncode == 0, ran
    version = json.loads(ran.stdout)["version"]
    controls = tier_dir / f"{name}.d"
    assert (controls / "description").read_text().strip() == f"{name} version {version}"
    assert json.loads((controls / "schema").read_text())["title"] == f"v{version}"
    assert json.loads((controls / "origin").read_text())["manifest"].endswith(
        f"{name}-v{version}/{name}.json"
    )
    return version


def test_two_versions_tsh_config_updates_and_bootstrap_at_once_take_turns(storage, tmp_path):
    """T-8, T-1, H-4, R-5 with docs/tools.md: in one system tier, at once, two admins install
    two versions of one tool, three ``ctx tool tsh.config`` updates set three different keys,
    and ``ctx bootstrap`` reinstalls a changed tsh.  All succeed; the first time, one install
    says ``installed`` and the other ``replaced``; the tool is always one whole version, keeps
    the administrator's policy line and its log file, no update of tsh.config is lost to
    another or to tsh's reinstall, and nothing but ``.install-lock`` is left hidden."""
    name = "race.tool"
    manifests = [versioned(tmp_path, name, v) for v in (1, 2)]
    env = env_for(storage, CTX_PATH=str(storage / "tool"))
    tier = storage / "tool"
    seen = set()
    for round_ in range(5):
        (tier / "tsh").write_bytes((tier / "tsh").read_bytes() + b"\n# changed\n")
        runs = together(
            [
                ("object", "install", manifests[0], "--tier", "system"),
                ("object", "install", manifests[1], "--tier", "system"),
                ("tool", "tsh.config", f"cache_capacity={40 + round_}"),
                ("tool", "tsh.config", f"window_percent={3 + round_}"),
                ("tool", "tsh.config", f"max_loaded_tools={70 + round_}"),
                ("bootstrap",),
            ],
            env,
        )
        no_traceback(runs)
        assert [r.rc for r in runs] == [0] * 6, runs
        verbs = sorted(r.out.split()[0] for r in runs[:2])
        assert verbs == (["installed", "replaced"] if round_ == 0 else ["replaced"] * 2), runs
        assert "repaired  tool/tsh" in runs[5].out.splitlines(), runs[5]
        if round_ == 0:
            with open(tier / f"{name}.d" / "policy", "a") as policy:
                policy.write("allow admin_t tool:race.tool execute\n")
            log_inode = (tier / f"{name}.d" / "log").stat().st_ino
        seen.add(whole_version(tier, name))
        assert (
            "allow admin_t tool:race.tool execute\n" in (tier / f"{name}.d" / "policy").read_text()
        )
        assert (tier / f"{name}.d" / "log").stat().st_ino == log_inode
        config = (tier / "tsh.d" / "config").read_text().splitlines()
        for line in (
            f"cache_capacity={40 + round_}",
            f"window_percent={3 + round_}",
            f"max_loaded_tools={70 + round_}",
        ):
            assert config.count(line) == 1, (round_, config)
        shown = ctx_run("tool", "tsh.config", env=env)
        assert shown.rc == 0 and f"cache_capacity={40 + round_}" in shown.lines(), shown
        assert hidden(tier) == [".install-lock"], round_
    listed = ctx_run("object", "list", "--tier", "system", "--json", env=env).json()
    entry = [o for o in listed if o["name"] == name]
    assert len(entry) == 1 and entry[0]["status"] == "available", entry
    assert seen <= {1, 2}, seen


@needs_root
def test_one_tool_into_three_tiers_at_once_each_tier_gets_its_own_version(storage, tmp_path):
    """T-8, T-4, X-1: the same tool installed at once into the system tier, root's user tier
    and a space's tier (each with its own ``.install-lock``), a different version in turn:
    every install succeeds with ``installed`` the first time and ``replaced`` after, each tier
    holds exactly the version sent to it, whole, and ``ctx object which`` keeps resolving the
    name through CTX_PATH to the tier listed first."""
    name = "tiered.tool"
    manifests = {v: versioned(tmp_path, name, v) for v in (1, 2)}
    env = env_for(storage)
    made = ctx_run("shared", "create", "crew", env=env)
    assert made.rc == 0, made
    tiers = {
        "system": storage / "tool",
        "user": storage / "home" / str(os.getuid()) / "tool",
        "shared:crew": storage / "shared" / "crew" / "tool",
    }
    for round_ in range(4):
        wanted = {t: 1 + (round_ + i) % 2 for i, t in enumerate(tiers)}
        runs = together(
            [("object", "install", manifests[wanted[t]], "--tier", t) for t in tiers], env
        )
        no_traceback(runs)
        assert [r.rc for r in runs] == [0, 0, 0], runs
        verb = "installed" if round_ == 0 else "replaced"
        for run, t in zip(runs, tiers, strict=True):
            assert run.out.startswith(f"{verb} {name} in tier {t}:"), run
        for t, directory in tiers.items():
            assert whole_version(directory, name) == wanted[t], (round_, t)
            assert hidden(directory) == [".install-lock"], (round_, t)
        path = os.pathsep.join(str(d) for d in (tiers["shared:crew"], tiers["system"]))
        which = ctx_run("object", "which", name, env=env_for(storage, CTX_PATH=path))
        assert (which.rc, which.out.strip()) == (0, str(tiers["shared:crew"] / name)), which


# ------------------------------------------------------------------------------ agents


@needs_root
def test_agents_created_at_once_one_name_twice_and_two_names(
    storage, unprivileged_user: UnprivilegedUser
):
    """A-3 with ``ctx agent create --help`` ("an existing agent is never overwritten"): two
    admins creating the same agent at once from different requests get one ``created`` and one
    ``EEXIST`` (exit 1) naming it, and the agent's label, policy and identity all come from the
    winner's request; two other agents created in the same instant both succeed, complete.
    ``agent/`` then holds nothing hidden but ``.install-lock``."""
    env = env_for(storage)
    requests = [
        {"name": "", "label": "left_t", "tools": ["fs.read"]},
        {"name": "", "label": "right_t", "tools": ["fs.stat"], "model": ["acme/m1"]},
    ]
    for round_ in range(5):
        twin = f"twin{round_}"
        pair = [dict(r, name=twin) for r in requests]
        if round_ % 2:
            pair.reverse()
        solos = [{"name": f"solo{round_}{s}", "label": f"solo{round_}{s}_t", "tools": ["fs.list"]}
                 for s in "ab"]  # fmt: skip
        users = [("--user", "nobody"), ("--user", unprivileged_user.name)]
        if round_ % 2:
            users.reverse()
        commands = [("agent", "create", *users[i % 2], "-") for i in range(4)]
        texts = [json.dumps(r) for r in (*pair, *solos)]
        runs = together(commands, env, texts)
        no_traceback(runs)
        twins = runs[:2]
        assert sorted(r.rc for r in twins) == [0, 1], twins
        winner = 0 if twins[0].rc == 0 else 1
        won, lost = twins[winner], twins[1 - winner]
        assert won.out.startswith(f"created agent {twin}: "), won
        assert lost.out == "", lost
        assert lost.err.startswith(f"ctx: EEXIST: {storage / 'agent' / twin} already exists"), lost
        chosen = pair[winner]
        label = chosen["label"]
        controls = storage / "agent" / f"{twin}.d"
        assert (controls / "label").read_text().strip() == label
        grants = [
            ln for ln in (controls / "policy").read_text().splitlines() if ln.startswith("allow")
        ]
        assert f"allow {label} tool:{chosen['tools'][0]} execute" in grants, grants
        assert all(ln.split()[1] == label for ln in grants), grants
        assert ("allow right_t model:acme/m1 use" in grants) == (label == "right_t"), grants
        uid = pwd.getpwnam(users[winner][1]).pw_uid
        assert f"/agent/{twin} (uid {uid}, " in won.out, won
        shown = ctx_run("agent", "show", twin, "--json", env=env)
        assert shown.rc == 0, shown
        assert shown.json()["label"] == label, shown
        for run, solo in zip(runs[2:], solos, strict=True):
            assert run.rc == 0 and run.out.startswith(f"created agent {solo['name']}: "), run
            shown = ctx_run("agent", "show", solo["name"], "--json", env=env)
            assert shown.rc == 0 and shown.json()["label"] == solo["label"], shown
        assert hidden(storage / "agent") == [".install-lock"], round_
    listed = ctx_run("agent", "list", env=env)
    assert listed.rc == 0, listed
    names = {line.split()[0] for line in listed.lines() if line.strip()}
    assert {f"twin{r}" for r in range(5)} | {f"solo{r}{s}" for r in range(5) for s in "ab"} <= names


# ------------------------------------------------------------------------------ spaces


SPACE_MODES = {".": 0o3770, "agent": 0o3770, "data": 0o2770, "queue": 0o3770, "tool": 0o2750}


@needs_root
def test_queue_init_and_shared_creates_of_one_space_at_once_leave_one_group(storage):
    """X-1, §2 with docs/sessions.md ("creators run one at a time"): ``ctx queue init --project
    P``, ``ctx shared create P --group G`` and ``ctx shared create P`` started together on a
    missing space all succeed; one of them made it and the others found it, so no directory is
    reported made twice; every entry of the space ends with group G and the modes the docs
    give, the queue has its six directories, and a rerun has nothing left to do."""
    env = env_for(storage)
    gid = 4343
    for round_ in range(4):
        name = f"space{round_}"
        space = storage / "shared" / name
        commands = [
            ("queue", "init", "--project", name, "--json"),
            ("shared", "create", name, "--group", str(gid), "--json"),
            ("shared", "create", name, "--json"),
        ]
        if round_ % 2:
            commands.reverse()
        runs = together(commands, env)
        no_traceback(runs)
        assert [r.rc for r in runs] == [0, 0, 0], runs
        made = [p for r in runs for p in r.json()["created"]]
        assert len(made) == len(set(made)), runs
        assert sum(str(space) in r.json()["created"] for r in runs) == 1, runs
        groups = {p: st[2] for p, st in layout(space).items()}
        groups["."] = space.lstat().st_gid
        assert set(groups.values()) == {gid}, {p: g for p, g in groups.items() if g != gid}
        for rel, mode in SPACE_MODES.items():
            assert (space / rel).lstat().st_mode & 0o7777 == mode, (round_, rel)
        for sub in QUEUE_SUBDIRS:
            assert (space / "queue" / sub).lstat().st_mode & 0o7777 == 0o2770, (round_, sub)
        assert set(os.listdir(space / "queue")) == QUEUE_SUBDIRS | {"config"}
        status = ctx_run("queue", "status", "--project", name, "--json", env=env)
        assert status.rc == 0 and status.json()["pending"] == 0, status
        again = ctx_run("shared", "create", name, "--group", str(gid), "--json", env=env)
        assert again.rc == 0, again
        report = again.json()
        assert (report["created"], report["regrouped"], report["repaired"]) == ([], 0, []), report
    assert hidden(storage / "shared") == []


# ------------------------------------------------------------------------------ the queue


def events_of(path: Path) -> list[dict]:
    data = path.read_bytes()
    assert data.endswith(b"\n"), data[-200:]
    return [json.loads(line) for line in data.decode().splitlines()]


def wreck(queue: QueueCLI, runs_file: Path) -> dict[str, str]:
    """What a crash leaves in a queue: a dead holder's claim, a claim without its lease, a
    result whose request is still claimed and a stale temp file; then eight ordinary jobs.
    Returns the jobs by role.  (An empty claim is left out here: see the test of orphans.)"""
    made = queue.run("init")
    assert made.rc == 0, made
    dead = queue.publish(shell_job(f"echo {queue.project}:dead >> {runs_file}"), name="dead")
    holder = subprocess.Popen(["sleep", "60"])
    try:
        claimed = queue.claim("--pid", str(holder.pid))  # on behalf of a process now gone
    finally:
        holder.kill()
        holder.wait()
    assert claimed == dead
    roles = {"dead": dead}
    for role in ("unleased", "rolled"):
        job = f"{role}.req.json"
        (queue.dir / "claimed" / job).mkdir()
        req = shell_job(f"echo {queue.project}:{role} >> {runs_file}")
        (queue.dir / "claimed" / job / job).write_text(json.dumps(req))
        roles[role] = job
    (queue.dir / "done" / f"{roles['rolled']}.result").write_text(json.dumps(result("done")))
    stray = queue.dir / "inbox" / "stray.req.json.publish.tmp"
    stray.write_text(json.dumps(request()))
    age(stray, 3600)
    for i in range(8):
        cmd = f"sleep 0.2; echo {queue.project}:job{i} >> {runs_file}"
        roles[f"job{i}"] = queue.publish(shell_job(cmd), name=f"job{i}")
    return roles


def applied(reports: list[dict], key: str, job: str) -> int:
    """How many of the recover reports say they applied a transition of ``job``."""
    return sum(
        1
        for report in reports
        for entry in report[key]
        if entry["job"] == job and entry.get("applied", True)
    )


@needs_root
def test_reconciles_at_once_while_workers_drain_and_calls_and_repairs_share_the_session(
    storage, agent, outbox
):
    """Q-5, Q-6, I-1, I-3, I-5, W-3, S-5: a queue a crash left in pieces (a dead holder's
    claim, a claim without its lease, a result with its request still claimed, a stale temp
    file) is reconciled by two ``recover --reconcile`` started together while two
    workers drain it, and ``ctx run`` calls and ``ctx session repair`` use the workers'
    session: both recovers exit 0 (a busy queue is consistent), each repair is applied by one
    of them only, every job ends once in done/ with its tool run exactly once, the
    rolled-forward job never runs, the debris is gone, repair cuts nothing, and the session
    holds whole lines with every tool_call paired."""
    env = env_for(storage)
    runs_file = outbox / "runs"
    nobody = pwd.getpwnam("nobody").pw_uid  # root's default user for agents
    session = storage / "home" / str(nobody) / "agent" / AGENT / "session" / "worker"
    call = ("run", "--native", "--agent", AGENT, "--session", "worker", "shell.exec")
    executed = 0
    for round_ in range(3):
        queue = QueueCLI(storage, f"wreck{round_}")
        roles = wreck(queue, runs_file)
        recover = ("queue", "recover", "--project", queue.project, "--reconcile", "--json")
        repair = ("session", "repair", AGENT, "worker", "--json")
        workers = [start_worker(queue, "--drain") for _ in range(2)]
        try:
            time.sleep(0.3)  # the workers are claiming and running
            assert all(proc.poll() is None for proc in workers), "the workers did not wait"
            raced = together(
                [recover, recover, call, call, call, repair, repair],
                env,
                [None, None, *['{"cmd": "true"}'] * 3, None, None],
            )
            no_traceback(raced)
            recovers, calls, repairs = raced[:2], raced[2:5], raced[5:]
            assert [r.rc for r in recovers] == [0, 0], [(r.rc, r.out, r.err) for r in recovers]
            assert [r.rc for r in calls] == [0, 0, 0], calls
            assert [r.rc for r in repairs] == [0, 0], repairs
            assert [r.json()["truncated_bytes"] for r in repairs] == [0, 0], repairs
            for proc in workers:
                _, err = proc.communicate(timeout=60)
                assert proc.returncode == 0 and TRACEBACK not in err, err
        finally:
            for proc in workers:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
        reports = [r.json() for r in recovers]
        assert all(report["conflicts"] == [] for report in reports), reports
        assert applied(reports, "requeued", roles["dead"]) == 1, reports
        for role in ("unleased", "rolled"):
            assert applied(reports, "repaired", roles[role]) == 1, (role, reports)
        removed = {t for report in reports for t in report["removed_temps"]}
        assert removed == {"inbox/stray.req.json.publish.tmp"}, reports
        # What the recovers put back once the workers had found the queue empty.
        final = queue.run("work", "--agent", AGENT, "--drain", timeout=60)
        assert final.rc == 0, final
        settled = queue.run("recover", "--reconcile", "--json")
        assert settled.rc == 0 and settled.json()["repaired"] == [], settled

        ran = [line for line in runs_file.read_text().split() if line.startswith(queue.project)]
        expected = {f"{queue.project}:{role}" for role in roles if role != "rolled"}
        assert sorted(ran) == sorted(expected), ran  # each exactly once; rolled never
        for role, job in roles.items():
            assert queue.state(job) == "done", (role, queue.state(job))
        for sub in ("claimed", "lease", "pending", "inbox", "failed"):
            assert os.listdir(queue.dir / sub) == [], sub
        executed += len(expected) + len(calls)

    events = events_of(session / "events.jsonl")
    pairs: dict[str, list[str]] = {}
    for event in events:
        if event["type"] in ("tool_call", "tool_result"):
            pairs.setdefault(event["call"], []).append(event["type"])
    assert all(types == ["tool_call", "tool_result"] for types in pairs.values()), pairs
    assert len(pairs) == executed, (len(pairs), executed)


def test_reconciles_at_once_report_each_stray_temp_removed_by_one_run(tmp_path):
    """Q-6, I-5 with docs/queue.md ("``removed_temps`` lists only what was removed"): two
    ``recover --reconcile`` started together on a queue with unleased claims and stale temp
    files share the work, each claim requeued by one run only, and each temp file is listed as
    removed by the run that removed it, not by both."""
    for round_ in range(4):
        queue = QueueCLI(tmp_path / f"root{round_}", "p")
        made = queue.run("init")
        assert made.rc == 0, made
        for i in range(10):
            job = f"u{i}.req.json"
            (queue.dir / "claimed" / job).mkdir()
            (queue.dir / "claimed" / job / job).write_text(json.dumps(request()))
        temps = {f"inbox/s{i}.req.json.publish.tmp" for i in range(5)}
        for temp in temps:
            (queue.dir / temp).write_text("{}")
            age(queue.dir / temp, 3600)
        recover = ("queue", "recover", "--project", "p", "--reconcile", "--json")
        runs = together([recover, recover], env_for(queue.storage))
        no_traceback(runs)
        assert [r.rc for r in runs] == [0, 0], runs
        reports = [r.json() for r in runs]
        assert sum(applied(reports, "repaired", f"u{i}.req.json") for i in range(10)) == 10
        assert (
            len(os.listdir(queue.dir / "pending")) == 10 and os.listdir(queue.dir / "inbox") == []
        )
        listed = [t for report in reports for t in report["removed_temps"]]
        assert set(listed) == temps, reports
        assert len(listed) == len(temps), f"round {round_}: {[r['removed_temps'] for r in reports]}"


def test_reconciles_at_once_on_empty_claims_both_end_consistent(tmp_path):
    """Q-6, I-5 with docs/queue.md: "an empty ``claimed/J`` ... → removed"; two ``recover
    --reconcile`` started together on a queue holding forty empty claim directories (what a
    claimer that lost the race leaves after a crash) share the removals: the queue ends empty
    and consistent, so both exit 0 and neither reports a conflict."""
    for round_ in range(5):
        queue = QueueCLI(tmp_path / f"root{round_}", "p")
        made = queue.run("init")
        assert made.rc == 0, made
        for i in range(40):
            (queue.dir / "claimed" / f"o{i}.req.json").mkdir()
        recover = ("queue", "recover", "--project", "p", "--reconcile", "--json")
        runs = together([recover, recover], env_for(queue.storage))
        no_traceback(runs)
        assert os.listdir(queue.dir / "claimed") == []
        conflicts = [c for r in runs for c in r.json()["conflicts"]]
        assert conflicts == [], f"round {round_}: {conflicts[:3]}"
        assert [r.rc for r in runs] == [0, 0], runs
