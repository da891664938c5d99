"""A hostile agent on a root host: agent ``mole`` (uid ``nobody``) holds the core tools over
its own read-write workspace and uses every door it has — path tricks, links it plants and
swaps while calls run, its home's sessions, its own controls, smuggled input and environment,
tools and children it was not granted, processes of the host — to get more than it was
given.  Every attempt must fail with the documented errno and leave no trace of success."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    serving,
    snapshot,
)
from tests.support.storage import copy_of_root
from tests.support.users import find_or_create_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as other uids: needs root")

SCRATCH = scratch_top(__file__)
MOLE_TOOLS = ["fs.read", "fs.write", "fs.list", "fs.stat", "shell.exec", "agent.update"]
SECRET = "TOPSECRET-host-file\n"
NOBODY = 65534
RENAME_EXCHANGE = 2
# PTRACE_ATTACH (16) on the pid given, exit 0 when the kernel allowed it.
ATTACH = (
    "ATTACH='import ctypes, sys; libc = ctypes.CDLL(None); "
    "sys.exit(0 if libc.ptrace(16, int(sys.argv[1]), 0, 0) == 0 else 1)'"
)
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass
class World(OnStorage):
    top: Path
    storage: Path
    ws: Path  # mole's workspace, /workspace, owned by mole's uid
    secret: Path  # a host directory outside every mount: s.txt readable by all, r.txt 0600
    victim_uid: int

    def home(self, uid: int, agent: str) -> Path:
        return self.storage / "home" / str(uid) / "agent" / agent

    def native(self, calls: list[tuple]) -> list[tuple[int, dict]]:
        """``ctx run --agent A --native [--session S] TOOL`` for each ``(A, TOOL, input[,
        S])``, all started together; each exit status with its ``result`` frame."""
        procs = []
        for call in calls:
            agent, tool, value = call[:3]
            session = ["--session", call[3]] if len(call) > 3 else []
            argv = [*CTX_ARGV, "run", "--agent", agent, "--native", *session, tool]
            proc = subprocess.Popen(argv, env=self.env, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
            procs.append((proc, json.dumps(value).encode()))
        done = []
        for proc, data in procs:
            out, err = proc.communicate(data, timeout=60)
            lines = out.decode().splitlines()
            frame = json.loads(lines[-1]) if lines else {"stderr": err.decode()}
            done.append((proc.returncode, frame))
        return done


def errno_of(frame: dict) -> str | None:
    return (frame.get("error") or {}).get("error")


def grant(storage: Path, label: str, tools: list[str]) -> None:
    for tool in tools:
        with open(storage / "tool" / f"{tool}.d" / "policy", "a") as policy:
            policy.write(f"allow {label} tool:{tool} execute\n")


def create(world: World, request: dict, *options: str) -> dict:
    made = world.ctx("agent", "create", "-", "--json", *options, input=json.dumps(request))
    assert made.rc == 0, made
    return made.json()


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    """Agent ``mole`` (uid nobody) with :data:`MOLE_TOOLS` granted in both layers over its
    workspace; agent ``victim`` (the test uid) allowed fs.read, with one call in its session."""
    top = new_scratch_dir(SCRATCH)
    storage = copy_of_root(_template, top / "storage")
    ws, secret = top / "ws", top / "secret"
    ws.mkdir(mode=0o755)
    (ws / "a.txt").write_text("data\n")
    (ws / "sub").mkdir()
    for path in (ws, ws / "sub", ws / "a.txt"):
        os.chown(path, NOBODY, NOBODY)
    secret.mkdir(mode=0o755)
    (secret / "s.txt").write_text(SECRET)
    (secret / "s.txt").chmod(0o644)
    (secret / "r.txt").write_text("ROOT-ONLY\n")
    (secret / "r.txt").chmod(0o600)
    victim = find_or_create_user()
    w = World(top, storage, ws, secret, victim.uid)
    create(w, {"name": "mole", "label": "mole_t", "tools": MOLE_TOOLS,
               "mount": [[str(ws), "/workspace", "rw"]]})  # fmt: skip
    create(w, {"name": "victim", "label": "victim_t", "tools": ["fs.read"]}, "--user", victim.name)
    grant(storage, "mole_t", MOLE_TOOLS)
    grant(storage, "victim_t", ["fs.read"])
    seen = w.ctx("run", "--agent", "victim", "fs.stat", "/ctx")  # not granted: still recorded
    assert seen.rc == 126, seen
    try:
        yield w
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_path_tricks_through_every_fs_tool_reach_nothing_outside_the_workspace(world: World):
    """T-5 and docs/tools.md "Paths are confined": ``//``, ``/proc/self/root``, a prefix of
    ``/workspace``, ``..`` anywhere, NUL, over-long names, links at the end or in the middle
    (planted by the agent or by someone else), a hard link to a root-only file and ``cwd``
    of shell.exec all fail with their errno; fs.write over a hard link replaces the agent's
    name, never the host file; nothing appears outside the workspace and each refusal is a
    recorded ``tool_result`` error (T-7)."""
    ws, secret = world.ws, world.secret
    (ws / "out-link").symlink_to(secret / "s.txt")
    (ws / "dir-link").symlink_to(secret)
    (ws / "sub" / "deep-link").symlink_to(secret)
    os.link(secret / "r.txt", ws / "hard-r")  # root's 0600 file under a second name
    os.link(secret / "s.txt", ws / "hard-s")
    before = snapshot(secret)
    long_name = "x" * 300
    attacks = [
        ("fs.read", {"path": "//etc/passwd"}, "EACCES"),
        ("fs.read", {"path": "/proc/self/root/etc/passwd"}, "EACCES"),
        ("fs.read", {"path": "/workspacex/a.txt"}, "EACCES"),
        ("fs.read", {"path": str(secret / "s.txt")}, "EACCES"),
        ("fs.read", {"path": "sub/../a.txt"}, "EINVAL"),
        ("fs.read", {"path": "/ctx/../etc/passwd"}, "EINVAL"),
        ("fs.read", {"path": "a.txt\u0000/../../etc/passwd"}, "EINVAL"),
        ("fs.read", {"path": "out-link"}, "ELOOP"),
        ("fs.read", {"path": "dir-link/s.txt"}, "ELOOP"),
        ("fs.read", {"path": "sub/deep-link/s.txt"}, "ELOOP"),
        ("fs.read", {"path": "hard-r"}, "EACCES"),
        ("fs.list", {"path": "dir-link/"}, "ELOOP"),
        ("fs.list", {"path": "sub/deep-link"}, "ELOOP"),
        ("fs.stat", {"path": "dir-link/s.txt"}, "ELOOP"),
        ("fs.write", {"path": "out-link", "content": "PWNED"}, "ELOOP"),
        ("fs.write", {"path": "dir-link/new.txt", "content": "PWNED"}, "ELOOP"),
        ("fs.write", {"path": "sub/deep-link/new.txt", "content": "PWNED"}, "ELOOP"),
        ("fs.write", {"path": "/workspace/../escaped", "content": "PWNED"}, "EINVAL"),
        ("fs.write", {"path": long_name, "content": "x"}, "ENAMETOOLONG"),
        ("fs.write", {"path": "hard-r", "content": "PWNED", "overwrite": False}, "EEXIST"),
        ("fs.write", {"path": f"/ctx/home/{world.victim_uid}/x", "content": "PWNED"}, "EACCES"),
        ("shell.exec", {"cmd": "cat s.txt", "cwd": "dir-link"}, "ELOOP"),
        ("shell.exec", {"cmd": "cat s.txt", "cwd": str(secret)}, "EACCES"),
    ]
    # Two that succeed, inside the workspace only: a name with a newline, and fs.write over
    # a hard link to a host file (the rename replaces the agent's name, not the host file).
    allowed = [
        ("fs.write", {"path": "line\nbreak", "content": "x"}),
        ("fs.write", {"path": "hard-s", "content": "PWNED"}),
    ]
    runs = world.native([("mole", tool, value) for tool, value, _ in attacks] +
                        [("mole", tool, value) for tool, value in allowed])  # fmt: skip
    for (_, value, expected), (rc, frame) in zip(attacks, runs, strict=False):
        assert (rc, frame.get("status"), errno_of(frame)) == (1, "error", expected), (value, frame)
        assert SECRET.strip() not in json.dumps(frame), frame
    for rc, frame in runs[len(attacks) :]:
        assert (rc, frame["status"]) == (0, "ok"), frame

    assert snapshot(secret) == before  # the host files are as they were, r.txt and s.txt
    assert (ws / "hard-s").read_text() == "PWNED" and (ws / "hard-s").stat().st_nlink == 1
    assert (ws / "line\nbreak").read_text() == "x"
    assert not (world.top / "escaped").exists()
    assert not (ws / long_name[:255]).exists()
    events = read_jsonl(world.home(NOBODY, "mole") / "session" / "default" / "events.jsonl")
    results = [e for e in events if e["type"] == "tool_result"]
    assert len(results) == len(attacks) + len(allowed), results
    assert sum(e["status"] == "error" for e in results) == len(attacks), results


def _swapping(a: Path, b: Path, stop: threading.Event, counter: list[int]) -> None:
    while not stop.is_set():
        if _libc.renameat2(-100, bytes(a), -100, bytes(b), RENAME_EXCHANGE) != 0:
            counter.append(-ctypes.get_errno())
            return
        counter[0] += 1


def test_a_directory_swapped_for_a_link_while_calls_run_never_leads_outside(world: World):
    """T-5 ("the host path is walked … one component at a time with O_NOFOLLOW … nothing is
    ever followed"): while the agent's ``proj`` directory and a link of the same shape to a
    host directory trade places as fast as the kernel allows, concurrent fs.read, fs.list and
    fs.write calls either see the workspace's own files or fail with ELOOP/ENOENT/ENOTDIR;
    none reads, lists or writes the host directory."""
    proj, alias, host_dir = world.ws / "proj", world.ws / "projl", world.top / "hostdir"
    proj.mkdir()
    (proj / "f.txt").write_text("inner\n")
    host_dir.mkdir(mode=0o1777)  # the agent's uid could write there: only confinement stops it
    (host_dir / "f.txt").write_text(SECRET)
    (host_dir / "f.txt").chmod(0o666)
    (host_dir / "only-host.txt").write_text("x")
    alias.symlink_to(host_dir)
    for path in (proj, proj / "f.txt"):
        os.chown(path, NOBODY, NOBODY)
    before = snapshot(host_dir)
    stop, counter = threading.Event(), [0]
    swapper = threading.Thread(target=_swapping, args=(proj, alias, stop, counter))
    swapper.start()
    try:
        time.sleep(0.05)
        calls = [("mole", "fs.read", {"path": "proj/f.txt"})] * 9
        calls += [("mole", "fs.list", {"path": "proj"})] * 4
        calls += [("mole", "fs.write", {"path": f"proj/w{n}.txt", "content": "PWNED"})
                  for n in range(5)]  # fmt: skip
        calls += [("mole", "shell.exec", {"cmd": "cat f.txt", "cwd": "proj"})] * 3
        runs = world.native(calls)
    finally:
        stop.set()
        swapper.join()
    assert counter[0] > 100 and len(counter) == 1, counter  # the swap really ran throughout
    harmless = {"ELOOP", "ENOENT", "ENOTDIR"}
    for call, (rc, frame) in zip(calls, runs, strict=True):
        assert SECRET.strip() not in json.dumps(frame), (call, frame)
        assert "only-host.txt" not in json.dumps(frame.get("output")), (call, frame)
        if frame.get("status") != "ok":
            assert rc == 1 and errno_of(frame) in harmless, (call, frame)
        elif call[1] == "fs.read":
            assert frame["output"]["content"] == "inner\n", frame
    assert snapshot(host_dir) == before  # nothing written into the host directory


def test_links_fifos_and_hard_links_planted_in_its_home_are_never_written_through(world: World):
    """S-5, docs/sessions.md ("the host … never writes through one"): with shell.exec the
    agent plants, in its own home, a session that is a link to the victim's session, an
    ``events.jsonl`` that is a link to a tool's policy, a FIFO, a hard link to its workspace,
    and then swaps its whole agent directory for a link to the victim's; each host call in
    those sessions is refused before the tool runs (ELOOP/ENOTDIR/EINVAL), ``ctx session
    show``/``repair`` follow none of them, and the victim's session and the policy keep
    their bytes."""
    home = world.home(NOBODY, "mole")
    victim_session = world.home(world.victim_uid, "victim") / "session" / "default"
    policy = world.storage / "tool" / "fs.read.d" / "policy"
    plant = (
        f"set -e; cd {home}/session; ln -s {victim_session} evil; "
        f"mkdir pol; ln -s {policy} pol/events.jsonl; mkdir fifo; mkfifo fifo/events.jsonl; "
        f"mkdir hard; echo mine > {world.ws}/h; ln {world.ws}/h hard/events.jsonl"
    )
    planted = world.ctx("run", "--agent", "mole", "shell.exec", plant)
    assert planted.rc == 0, planted
    guarded = {p: p.read_bytes() for p in (victim_session / "events.jsonl", policy)}
    planted_sessions = {"evil": "ENOTDIR", "pol": "EINVAL", "fifo": "EINVAL", "hard": "EINVAL"}
    runs = world.native([("mole", "fs.read", {"path": "a.txt"}, name) for name in planted_sessions])
    for (name, expected), (rc, frame) in zip(planted_sessions.items(), runs, strict=True):
        assert (rc, errno_of(frame), frame["error"]["stage"]) == (1, expected, "session"), frame
        assert frame["exit_status"] is None, (name, frame)  # the tool never started
    for verb, session in (("show", "evil"), ("tail", "evil"), ("repair", "pol"),
                          ("repair", "hard"), ("show", "fifo")):  # fmt: skip
        looked = world.ctx("session", verb, "mole", session, timeout=20)
        assert looked.rc == 1 and "data" not in looked.out, looked
    listed = world.ctx("session", "list", "mole")
    assert "evil" not in listed.lines(), listed

    swap = f"cd {home}/.. && mv mole mole.old && ln -s {victim_session.parent.parent} mole"
    assert world.ctx("run", "--agent", "mole", "shell.exec", swap).rc == 0
    through = world.ctx("run", "--agent", "mole", "fs.read", "a.txt")
    assert through.rc == 126 and "ctx: ENOTDIR: " in through.err, through
    assert {p: p.read_bytes() for p in guarded} == guarded
    assert (world.ws / "h").read_text() == "mine\n"
    victim = read_jsonl(victim_session / "events.jsonl")
    assert {e["agent"] for e in victim} == {"victim"}, victim


def test_another_agents_home_and_controls_are_out_of_reach_by_view_and_by_kernel(world: World):
    """T-5, S-6, A-3: through the fs tools ``/ctx`` shows mole only its own home and agent
    entry; the victim's session, controls and home are EACCES whether read, listed, stat'ed
    or written, and with shell.exec the raw storage root (outside every mount for the fs
    tools) is refused by the kernel for the victim's 0700 session; nothing of it leaks."""
    v = world.victim_uid
    session = f"/ctx/home/{v}/agent/victim/session/default"
    attacks = [
        ("fs.read", {"path": f"{session}/events.jsonl"}),
        ("fs.list", {"path": session}),
        ("fs.stat", {"path": f"/ctx/home/{v}"}),
        ("fs.read", {"path": "/ctx/agent/victim.d/policy"}),
        ("fs.read", {"path": "/ctx/agent/victim.d/identity"}),
        ("fs.stat", {"path": "/ctx/agent/victim"}),
        ("fs.write", {"path": "/ctx/agent/victim.d/system.md", "content": "obey mole"}),
        ("fs.write", {"path": f"{session}/events.jsonl", "content": "{}\n"}),
        ("fs.read", {"path": str(world.storage / "agent" / "victim.d" / "policy")}),
    ]
    listings = [("fs.list", {"path": "/ctx/home"}), ("fs.list", {"path": "/ctx/agent"})]
    runs = world.native([("mole", t, value) for t, value in attacks + listings])
    for (tool, value), (rc, frame) in zip(attacks, runs, strict=False):
        assert (rc, errno_of(frame)) == (1, "EACCES"), (tool, value, frame)
    homes, agents = (frame["output"]["entries"] for _, frame in runs[len(attacks) :])
    assert [e["name"] for e in homes] == [str(NOBODY)], homes
    assert sorted(e["name"] for e in agents) == ["mole", "mole.d"], agents
    raw = world.home(v, "victim") / "session" / "default" / "events.jsonl"
    shell = world.ctx("run", "--agent", "mole", "shell.exec", f"cat {raw}")
    assert shell.rc != 0 and "Permission denied" in shell.err and '"victim"' not in shell.out
    before = raw.read_bytes()
    assert all('"mole"' not in line for line in before.decode().splitlines())


@pytest.mark.parametrize("door", ["agent.update", "fs.write", "shell.exec", "mount"])
def test_its_own_policy_mount_and_identity_stay_the_hosts_through_every_door(
    world: World, door: str
):
    """A-5, A-3, P-6, F-1: ``agent.update`` takes system.md and prompt.template.md only —
    ``policy``, ``mount``, ``identity`` and spellings that would reach them (``../``,
    ``./system.md``, a trailing newline, upper case) are EINVAL; fs.write to its controls
    is EROFS; shell.exec as its uid cannot write, rename or replace them (the kernel); in
    ``ctx mount --as mole`` its uid gets EACCES/EROFS.  The controls keep their bytes and
    shell.exec, which it was never given a second grant of, stays the only shell."""
    controls = world.storage / "agent" / "mole.d"
    kept = {p.name: p.read_bytes() for p in controls.iterdir() if p.name != "log"}
    rule = "allow mole_t tool:agent.create execute\n"
    if door == "agent.update":
        names = ["policy", "mount", "identity", "label", "../mole.d/policy", "log",
                 "system.md/../policy", "./system.md", "system.md\n", "SYSTEM.MD"]  # fmt: skip
        runs = world.native(
            [("mole", "agent.update", {"control": n, "content": rule}) for n in names]
        )
        for name, (rc, frame) in zip(names, runs, strict=True):
            # the schema's enum (rc 2, never started) or the host's own check (the tool's 2)
            assert rc in (1, 2) and errno_of(frame) == "EINVAL", (name, frame)
            assert frame["exit_status"] in (None, 2), (name, frame)
    elif door == "fs.write":
        names = ["policy", "mount", "identity", "system.md", "new-control"]
        runs = world.native(
            [("mole", "fs.write", {"path": f"/ctx/agent/mole.d/{n}", "content": rule})
             for n in names]
        )  # fmt: skip
        for name, (rc, frame) in zip(names, runs, strict=True):
            assert (rc, errno_of(frame)) == (1, "EROFS"), (name, frame)
    elif door == "shell.exec":
        for cmd in (f"echo '{rule}' >> {controls}/policy",
                    f"mv {controls}/policy {controls}/p.old",
                    f"cp {world.ws}/a.txt {controls}/mount",
                    f"mv {controls} {controls}.x",
                    f"ln -sf {world.ws}/a.txt {controls}/identity"):  # fmt: skip
            tried = world.ctx("run", "--agent", "mole", "shell.exec", cmd)
            assert tried.rc != 0 and "ermission denied" in tried.err, tried
    else:
        if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
            pytest.skip("needs /dev/fuse and fusermount3")
        where = world.top / "view"
        where.mkdir()
        with serving(world.storage, where, "--as", "mole"):
            view = where / "agent" / "mole.d"
            for cmd in (f"echo '{rule}' >> {view}/policy", f"echo x > {view}/mount",
                        f"rm {view}/identity", f"mv {view}/policy {view}/p",
                        f"touch {view}/extra"):  # fmt: skip
                tried = subprocess.run(
                    ["/bin/sh", "-c", cmd], user=NOBODY, group=NOBODY, extra_groups=[],
                    capture_output=True, text=True, timeout=30,
                )  # fmt: skip
                assert tried.returncode != 0, (cmd, tried)
                assert "ermission denied" in tried.stderr or "Read-only" in tried.stderr, tried
    assert {p.name: p.read_bytes() for p in controls.iterdir() if p.name != "log"} == kept
    explained = world.ctx("policy", "query", "--policy", controls / "policy", "mole_t",
                          "tool:agent.create", "execute")  # fmt: skip
    assert (explained.rc, explained.out.strip()) == (1, "deny"), explained


def test_smuggled_input_keys_and_a_forged_host_environment_widen_no_call(world: World):
    """T-3, T-5, docs/tools.md "Environment": input keys a schema does not declare (``argv``,
    ``env``), a path of the wrong type and an over-long ``length`` are EINVAL at stage
    ``schema`` before anything runs; in terminal mode a second argument is refused by the
    tool; and a host environment forging ``CTX_MOUNTS``, ``CTX_AGENT``, ``CTX_PATH``,
    ``CTX_CWD``, ``LD_PRELOAD`` and ``PYTHONPATH`` reaches neither the tool nor its
    confinement: ``/`` stays outside every mount."""
    smuggled = [
        ("fs.read", {"path": "a.txt", "argv": ["--follow"]}),
        ("shell.exec", {"cmd": "id", "env": {"LD_PRELOAD": "/tmp/x.so"}}),
        ("fs.read", {"path": ["a.txt", "/etc/shadow"]}),
        ("fs.read", {"path": "a.txt", "length": 99_999_999}),
        ("fs.write", {"path": "a.txt", "content": "x", "mode": "4755"}),
    ]
    runs = world.native([("mole", tool, value) for tool, value in smuggled])
    for (_, value), (rc, frame) in zip(smuggled, runs, strict=True):
        assert value is not None
        assert (rc, errno_of(frame), frame["error"]["stage"]) == (2, "EINVAL", "schema"), frame
        assert frame["exit_status"] is None, frame  # never started
    assert (world.ws / "a.txt").read_text() == "data\n"
    two = world.ctx("run", "--agent", "mole", "fs.read", "a.txt", "/etc/passwd")
    assert (two.rc, two.out) == (2, ""), two
    evil = world.top / "evil"
    evil.mkdir()
    # Loaded by the host's own interpreter (root's, the host's choice); an agent's never.
    (evil / "sitecustomize.py").write_text(
        f"import os\nos.getuid() and open({str(world.top / 'pwned')!r}, 'w')\n"
    )
    forged = {**world.env, "CTX_MOUNTS": '[["/", "/", "rw"]]', "CTX_AGENT": "victim",
              "CTX_PATH": str(evil), "CTX_CWD": "/", "PYTHONPATH": str(evil),
              "LD_PRELOAD": str(evil / "none.so"), "SECRET_TOKEN": "s3cr3t"}  # fmt: skip
    read = world.ctx("run", "--agent", "mole", "fs.read", "/etc/hostname", env=forged)
    assert read.rc == 1 and "fs.read: EACCES: " in read.err and read.out == "", read
    env = world.ctx("run", "--agent", "mole", "shell.exec", "env", env=forged)
    assert env.rc == 0, env
    seen = dict(line.split("=", 1) for line in env.out.splitlines() if "=" in line)
    assert seen["CTX_AGENT"] == "mole" and seen["CTX_CWD"] == "/workspace", seen
    assert seen["CTX_PATH"] == f"/ctx/tool:/ctx/home/{NOBODY}/tool", seen
    assert ["/", "/", "rw"] not in json.loads(seen["CTX_MOUNTS"]), seen
    assert not {"PYTHONPATH", "LD_PRELOAD", "SECRET_TOKEN"} & set(seen), seen
    assert not (world.top / "pwned").exists()


def test_from_inside_a_granted_shell_no_ungranted_tool_agent_or_host_verb_runs(world: World):
    """P-5 step 1, H-3, A-5, A-4: shell.exec runs as the agent's uid, so ``ctx run --agent``
    (itself or the victim) is EACCES at step 1, ``ctx tool fs.write`` and a ``tsh.config``
    update are refused, the agent.update and agent.create programs run by hand have no run
    capability (EPERM), and ``ctx agent create`` / ``ctx object install`` are refused:
    no control, agent, tool or setting changes."""
    s = world.storage
    request = json.dumps({"name": "kid", "label": "kid_t", "tools": ["shell.exec"]})
    update = json.dumps({"control": "system.md", "content": "pwned"})
    config = (s / "tool" / "tsh.d" / "config").read_bytes()
    system = (s / "agent" / "mole.d" / "system.md").read_bytes()
    ctx = CTX_ARGV[0]
    attempts = {
        f"{ctx} --storage {s} run --agent mole fs.read a.txt": "EACCES",
        f"{ctx} --storage {s} run --agent victim --native fs.read < /dev/null": "EACCES",
        f"{ctx} --storage {s} tool fs.write '{{}}'": "EACCES",
        f"{ctx} --storage {s} tool tsh.config cache_capacity=1": "EACCES",
        f"{s}/tool/agent.update '{update}'": "EPERM",
        f"{s}/tool/agent.create '{request}'": "EPERM",
        f"echo '{request}' | {ctx} --storage {s} agent create -": "EACCES",
    }
    procs = {
        cmd: subprocess.Popen(
            [*CTX_ARGV, "run", "--agent", "mole", "shell.exec", cmd],
            env=world.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for cmd in attempts
    }
    for cmd, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode != 0, (cmd, out, err)
        assert attempts[cmd] in out + err, (cmd, out, err)
    assert not (s / "agent" / "kid").exists() and not (s / "agent" / "kid.d").exists()
    assert (s / "tool" / "tsh.d" / "config").read_bytes() == config
    assert (s / "agent" / "mole.d" / "system.md").read_bytes() == system
    agents = sorted(p.name for p in (s / "agent").iterdir() if not p.name.startswith("."))
    assert agents == ["mole", "mole.d", "victim", "victim.d"], agents


def test_children_wider_than_their_parent_are_refused_and_a_later_link_redirects_none(
    world: World,
):
    """A-4, P-7: with ``agent:kid create`` and agent.create granted, every child wider than
    mole is refused — a tool, model or space it does not hold, another name, another agent's
    label, a mount outside its own (directly, through a planted link, with ``..``, nested
    under its own, of the storage root, of the victim's home), a system target — and nothing
    is created; the child it may make mounts ``ws/proj``, and once mole swaps that directory
    for a link to a host directory (then trades them continuously) the child's calls are
    refused, never redirected."""
    grant(world.storage, "mole_t", ["agent.create"])
    with open(world.storage / "agent" / "mole.d" / "policy", "a") as policy:
        policy.write("allow mole_t tool:agent.create execute\nallow mole_t agent:kid create\n")
    ws, secret, s = world.ws, world.secret, world.storage
    (ws / "dir-link").symlink_to(secret)
    proj = ws / "proj"
    proj.mkdir()
    (proj / "f.txt").write_text("inner\n")
    os.chown(proj, NOBODY, NOBODY)

    def kid(**fields) -> dict:
        return {"name": "kid", "label": "kid_t", "tools": ["fs.read"], **fields}

    wider = [
        (kid(tools=["fs.read", "tsh.config"]), "EACCES"),
        (kid(model=["openai/gpt-5.6"]), "EACCES"),
        (kid(shared={"proj": ["read"]}), "EACCES"),
        ({**kid(), "name": "kid2"}, "EACCES"),
        (kid(label="victim_t"), "EACCES"),
        (kid(mount=[[str(secret), "/s", "ro"]]), "EACCES"),
        (kid(mount=[[str(ws / "dir-link"), "/s", "ro"]]), "EACCES"),
        (kid(mount=[[f"{ws}/../secret", "/s", "ro"]]), "EINVAL"),
        (kid(mount=[[str(ws), "/w", "rw"], [str(secret), "/w/s", "ro"]]), "EACCES"),
        (kid(mount=[[str(s), "/st", "ro"]]), "EINVAL"),
        (kid(mount=[[str(s / "home" / str(world.victim_uid)), "/v", "ro"]]), "EACCES"),
        (kid(mount=[[str(ws), "/etc", "ro"]]), "EINVAL"),
        (kid(mount=[[str(ws), "/ctx/tool", "ro"]]), "EINVAL"),
    ]
    runs = world.native([("mole", "agent.create", request) for request, _ in wider])
    for (request, expected), (rc, frame) in zip(wider, runs, strict=True):
        assert (rc, errno_of(frame)) == (1, expected), (request, frame)
    assert not (s / "agent" / "kid").exists() and not (s / "agent" / "kid2").exists()

    made = world.native([("mole", "agent.create", kid(mount=[[str(proj), "/p", "ro"]]))])
    assert made[0][0] == 0, made
    grant(s, "kid_t", ["fs.read"])
    assert world.ctx("run", "--agent", "kid", "fs.read", "/p/f.txt").out == "inner\n"
    (secret / "f.txt").write_text(SECRET)
    (secret / "f.txt").chmod(0o644)
    swapped = world.ctx("run", "--agent", "mole", "shell.exec",
                        f"mv proj proj.real && ln -s {secret} proj")  # fmt: skip
    assert swapped.rc == 0, swapped
    after = world.ctx("run", "--agent", "kid", "fs.read", "/p/f.txt")
    assert after.rc == 1 and "fs.read: EACCES: " in after.err and SECRET not in after.out, after
    shown = world.ctx("agent", "show", "kid")
    assert "withheld mount" in shown.out and str(proj) in shown.out, shown

    os.rename(proj, ws / "projl")
    os.rename(ws / "proj.real", proj)  # back to a directory, with the link beside it
    stop, counter = threading.Event(), [0]
    swapper = threading.Thread(target=_swapping, args=(proj, ws / "projl", stop, counter))
    swapper.start()
    try:
        time.sleep(0.05)
        runs = world.native([("kid", "fs.read", {"path": "/p/f.txt"})] * 10)
    finally:
        stop.set()
        swapper.join()
    assert counter[0] > 100 and len(counter) == 1, counter
    for _, frame in runs:
        assert SECRET.strip() not in json.dumps(frame), frame
        if frame.get("status") == "ok":
            assert frame["output"]["content"] == "inner\n", frame
    kid_policy = (s / "agent" / "kid.d" / "policy").read_text()
    assert "agent:" not in kid_policy and "shell.exec" not in kid_policy, kid_policy


def test_an_mcp_config_the_agent_controls_starts_no_host_program(world: World):
    """M-4, docs/tools.md (bridge step 3): an MCP-backed tool whose locator names a
    configuration inside the agent's workspace — the agent's own file, then a root-owned
    copy in a root-owned directory below the agent's workspace, then a link to a host-owned
    configuration — is refused (EACCES, or ELOOP for the link) and the command it names
    (``/bin/sh`` touching a marker) never starts."""
    marker = world.top / "server-ran"
    server = {"mcpServers": {"evil": {"command": "/bin/sh",
                                      "args": ["-c", f"touch {marker}; sleep 5"]}}}  # fmt: skip
    manifest = {
        "manifest": 2, "kind": "tool", "name": "evil.run", "description": "d",
        "schema": {"type": "object"}, "cap": {},
        "mcp": {"transport": "stdio", "config": "/workspace/cfg/mcp.json",
                "server": "evil", "tool": "run"},
    }  # fmt: skip
    (world.top / "m.json").write_text(json.dumps(manifest))
    installed = world.ctx("object", "install", world.top / "m.json", "--tier", "system")
    assert installed.rc == 0, installed
    grant(world.storage, "mole_t", ["evil.run"])
    with open(world.storage / "agent" / "mole.d" / "policy", "a") as policy:
        policy.write("allow mole_t tool:evil.run execute\n")
    cfg = world.ws / "cfg"
    hostcfg = world.top / "hostcfg"
    hostcfg.mkdir(mode=0o755)
    (hostcfg / "mcp.json").write_text(json.dumps(server))

    outcomes = []
    for layout in ("agent-owned", "root-owned-below-workspace", "link"):
        shutil.rmtree(cfg, ignore_errors=True)
        cfg.mkdir(mode=0o755)
        if layout == "link":
            (cfg / "mcp.json").symlink_to(hostcfg / "mcp.json")
        else:
            (cfg / "mcp.json").write_text(json.dumps(server))
        if layout == "agent-owned":
            os.chown(cfg, NOBODY, NOBODY)
            os.chown(cfg / "mcp.json", NOBODY, NOBODY)
        [(rc, frame)] = world.native([("mole", "evil.run", {})])
        outcomes.append((layout, rc, errno_of(frame)))
    assert outcomes == [
        ("agent-owned", 1, "EACCES"),
        ("root-owned-below-workspace", 1, "EACCES"),
        ("link", 1, "ELOOP"),
    ], outcomes
    time.sleep(0.2)
    assert not marker.exists()


def test_the_host_processes_of_a_call_cannot_be_signalled_traced_or_read(world: World):
    """P-5 step 1, I-4, docs/tools.md "Identity": a shell.exec call walks up its ancestors
    (``ctx run`` and whatever root runs for it): it may not signal them (kill -0, STOP),
    attach to them with ptrace, or read their environment, which holds the host's secrets;
    the call and ``ctx run`` finish normally afterwards."""
    script = (
        ATTACH
        + r"""
pid=$PPID; out=""
while [ "$pid" -gt 1 ]; do
  owner=$(awk '/^Uid:/{print $2}' /proc/$pid/status)
  if [ "$owner" = 0 ]; then
    kill -0 $pid 2>/dev/null && out="$out signal:$pid"
    kill -STOP $pid 2>/dev/null && { kill -CONT $pid; out="$out stop:$pid"; }
    cat /proc/$pid/environ >/dev/null 2>&1 && out="$out environ:$pid"
    python3 -c "$ATTACH" $pid 2>/dev/null && out="$out ptrace:$pid"
    roots="$roots $pid"
  fi
  pid=$(awk '/^PPid:/{print $2}' /proc/$pid/status)
done
echo "roots:$roots"
echo "gained:$out"
"""
    )
    env = {**world.env, "HOST_SECRET": "s3cr3t-of-the-host"}
    r = world.ctx("run", "--agent", "mole", "--timeout", "30", "shell.exec", script, env=env)
    assert r.rc == 0, r
    roots, gained = r.out.splitlines()[-2:]
    assert roots.split(":", 1)[1].split(), r  # it did find root's processes above it
    assert gained == "gained:", r
    assert "s3cr3t" not in r.out + r.err
