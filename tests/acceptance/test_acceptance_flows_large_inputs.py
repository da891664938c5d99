"""Large but realistic inputs everywhere but the claim cost of Q-10 (SPEC §2 Q-1, Q-4, Q-8,
§2.4, §4 S-4, S-5, §6 T-1, T-3, T-5, T-7, T-8, T-8a, §5 P-8, §7 H-1, H-2, A-3, and the limits
docs/*.md state): a tier of 2 000 tools, a policy of 50 000 rules, an agent with 500 mounts,
a session of tens of megabytes with a 50 MB line and a torn tail, a tool ``log`` grown sparse
to 1 GiB, a queue of 20 000 finished jobs and a 16 MiB result, batches of 10 000 and 50 000
lines, requests at and one byte over ``max_request_bytes``, tools flooding stdout and stderr,
100 000 bytes of argv under a large environment, native inputs at the 16 MiB limit, a schema
installed at exactly the 1 MiB a control holds, and a tsh line past the terminal's 4095 bytes
and past tsh's 1 MiB.

Every command runs under an address-space limit (``RLIMIT_AS``, as ``prlimit --as`` sets it)
well below what holding its input whole would take, so a reader that is not bounded fails
visibly instead of passing on a large machine; and under a generous timeout, so a hang fails
too.  Nothing here asserts a duration.  The inputs are written as plain files where the
documents say they are plain files (a tier's tool pairs, queue evidence, ``events.jsonl``)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pty
import re
import resource
import select
import shutil
import subprocess
import termios
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    Run,
    clean_env,
    new_scratch_dir,
    scratch_top,
    tool_manifest,
    wait_for,
)
from tests.acceptance.ctxcli import limited as limited_run
from tests.acceptance.workercli import AGENT, LABEL, allow_in_tool_policy, make_agent
from tests.support.storage import copy_of_root, small_tmpfs

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as another uid")

MIB = 1 << 20
GIB = 1 << 30
TRACEBACK = "Traceback (most recent call last)"
TIMEOUT = 90  # seconds: a generous bound that only a hang reaches
# Address-space limits: below what the input would cost held whole (a ctx command takes some
# 45 MiB of address space of its own), well above what a bounded reader needs.
TIGHT = 96 * MIB
MEMORY = 256 * MIB
CONTROL_LIMIT = MIB  # docs/tools.md: every control but the policy holds at most 1 MiB
INPUT_LIMIT = 16 * MIB  # docs/tools.md: a native input, as much as a core tool reads
OUTPUT_LIMIT = 16 * MIB  # docs/tools.md: captured output
EVENT_LIMIT = 64 * 1024  # docs/sessions.md: an event is at most 64 KiB
REQUEST_LIMIT = MIB  # docs/queue.md: max_request_bytes by default
RESULT_LIMIT = 16 * MIB  # docs/queue.md: max_result_bytes by default


# ------------------------------------------------------------------------------- helpers


def limited(
    env: dict[str, str],
    *args,
    memory: int = MEMORY,
    input: bytes | str = b"",
) -> Run:
    """``ctx ARGS…`` with its address space (soft and hard) limited to ``memory`` bytes, its
    children included, and a timeout only a hang reaches."""
    return limited_run(env, *args, input=input, address_space=memory, timeout=TIMEOUT)


def ok(run: Run) -> Run:
    assert run.rc == 0 and TRACEBACK not in run.err, run
    return run


def frames(run: Run) -> list[dict]:
    return [json.loads(line) for line in run.out.splitlines() if line.strip()]


def result_frame(run: Run) -> dict:
    last = frames(run)[-1]
    assert last["type"] == "result", last
    return last


def lines_of(path: Path) -> list[bytes]:
    """The whole lines of ``path`` (each ended by a newline)."""
    data = path.read_bytes()
    assert data.endswith(b"\n"), data[-200:]
    return data[:-1].split(b"\n")


@dataclass
class World:
    """A bootstrapped root every uid may search (queue ``proj``), agent ``ci`` (uid nobody)
    allowed ``shell.exec`` by both policies (P-6), and a scratch directory beside it."""

    root: Path
    scratch: Path

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.root), XDG_CACHE_HOME=str(self.scratch / "cache"))

    def install(self, name: str, program: str, **options) -> Path:
        manifest = tool_manifest(self.scratch / "manifests", name, program, **options)
        ok(limited(self.env, "object", "install", manifest, "--tier", "system"))
        return self.root / "tool" / name

    def grant(self, *tools: str) -> None:
        """Both layers of P-6 for ``ci``: its own policy and each tool's."""
        with open(self.root / "agent" / f"{AGENT}.d" / "policy", "a") as own:
            for tool in tools:
                own.write(f"allow {LABEL} tool:{tool} execute\n")
        for tool in tools:
            allow_in_tool_policy(self.root, tool)

    def session(self, name: str) -> Path:
        uid = json.loads((self.root / "agent" / f"{AGENT}.d" / "identity").read_text())["uid"]
        return self.root / "home" / str(uid) / "agent" / AGENT / "session" / name / "events.jsonl"


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    """The world on a tmpfs of its own: what a test writes by the ten thousand (and a
    ``publish --batch``'s ``syncfs``) then neither waits on nor slows the disk of others."""
    scratch = new_scratch_dir(scratch_top(__file__))
    try:
        with small_tmpfs(scratch / "fs", "2g", mode=0o755) as disk:
            root = copy_of_root(_template, disk / "storage")
            make_agent(root, ["shell.exec"])
            allow_in_tool_policy(root, "shell.exec")
            (disk / "cache").mkdir()
            yield World(root, disk)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def copy_tool_pairs(tier: Path, model: str, names: list[str]) -> None:
    """Tool pairs ``names`` in ``tier``, each a copy of the installed pair ``model`` (its
    executable, and its control directory with the same modes) whose ``name`` control names
    it and whose ``policy`` also allows ``ci`` to run it: what ``ctx object install`` of the
    same manifest under each name would leave, written directly (T-1: plain files)."""
    source = tier / f"{model}.d"
    entries: list[tuple[str, int, bytes | None]] = []
    for dirpath, dirnames, filenames in os.walk(source):
        for name in sorted(dirnames) + sorted(filenames):
            path = Path(dirpath, name)
            data = None if path.is_dir() else path.read_bytes()
            entries.append((str(path.relative_to(source)), path.stat().st_mode & 0o7777, data))
    program = (tier / model).read_bytes()
    program_mode = (tier / model).stat().st_mode & 0o7777
    for name in names:
        controls = tier / f"{name}.d"
        controls.mkdir()
        controls.chmod(source.stat().st_mode & 0o7777)
        for relative, mode, data in entries:
            path = controls / relative
            if data is None:
                path.mkdir()
            else:
                if relative == "name":
                    data = f"{name}\n".encode()
                elif relative == "policy":
                    data += f"allow {LABEL} tool:{name} execute\n".encode()
                path.write_bytes(data)
            path.chmod(mode)
        (tier / name).write_bytes(program)
        (tier / name).chmod(program_mode)


# ------------------------------------------------------------------ T-8a: a tier of 2 000 tools


TOOLS_IN_TIER = 2000


def names_of_length(length: int, count: int = TOOLS_IN_TIER) -> list[str]:
    """``count`` legal object names (R-3) of ``length`` bytes each."""
    stem = "big." + "n" * (length - 8)
    return [f"{stem}{i:04d}" for i in range(count)]


def tier_of(world: World, names: list[str]) -> None:
    """The first of ``names`` installed with ``ctx object install``, the others copied from it,
    and agent ``ci`` allowed to run every one of them by both layers of P-6."""
    program = '#!/bin/sh\nprintf "%s:%s\\n" "$CTX_TOOL" "$*"\n'
    world.install(names[0], program)
    copy_tool_pairs(world.root / "tool", names[0], names[1:])
    allow_in_tool_policy(world.root, names[0])
    with open(world.root / "agent" / f"{AGENT}.d" / "policy", "a") as own:
        own.writelines(f"allow {LABEL} tool:{name} execute\n" for name in names)


def test_two_thousand_tools_in_a_tier_are_listed_resolved_and_run(world: World) -> None:
    """T-8a, T-4, T-5, docs/tools.md (a filtered mount costs twice a runnable tool's name and
    10 bytes of the 128 KiB the kernel takes for one variable: "some 2,000 runnable tools of
    25-byte names"): with 2 000 tools of 25-byte names in the system tier, ``ctx object list``
    lists each one available, ``ctx object which`` resolves the first, the last and none for
    a name one past them, and agent ``ci``, allowed all of them, runs the last one with its
    argv, bounded in memory."""
    names = names_of_length(25)
    tier_of(world, names)
    env = world.env

    listed = ok(limited(env, "object", "list", "--tier", "system", "--json")).json()
    mine = {entry["name"]: entry for entry in listed if entry["name"].startswith("big.")}
    assert sorted(mine) == names
    assert {entry["status"] for entry in mine.values()} == {"available"}
    on_path = {**env, "CTX_PATH": str(world.root / "tool")}
    for name in (names[0], names[-1]):
        found = ok(limited(on_path, "object", "which", name))
        assert found.out == f"{world.root / 'tool' / name}\n", found
    missing = limited(on_path, "object", "which", names[-1][:-4] + "2000")
    assert missing.rc == 1 and missing.err.startswith("ctx: ENOENT: "), missing

    ran = ok(limited(env, "run", "--agent", AGENT, names[-1], "two words", "x"))
    assert ran.out == f"{names[-1]}:two words x\n", ran


def test_too_many_runnable_tools_for_one_variable_say_why_the_call_cannot_start(
    world: World,
) -> None:
    """T-5, docs/tools.md ("the kernel takes at most 128 KiB for one variable …; past that a
    call cannot start (E2BIG at stage run)") and CONVENTIONS (an error is a sentence the user
    can act on): agent ``ci`` allowed 1 000 tools of 64-byte names (138 000 bytes of
    ``CTX_MOUNTS``) calls one with a one-word argv.  The call fails at stage ``run`` with
    E2BIG, recorded in its session; its message must say what is too long — the agent's
    environment (``CTX_MOUNTS``, one entry per tool it may run) — not that the argument list
    of a one-word call is."""
    names = names_of_length(64, 1000)
    tier_of(world, names)
    ran = limited(world.env, "run", "--agent", AGENT, "--session", "wide", names[-1], "hello")
    assert ran.rc == 126 and TRACEBACK not in ran.err, ran
    assert ran.err.startswith("ctx: E2BIG: "), ran
    call, result = (json.loads(line) for line in lines_of(world.session("wide")))
    assert (call["type"], result["type"]) == ("tool_call", "tool_result"), (call, result)
    assert (result["errno"], result["stage"]) == ("E2BIG", "run"), result
    for message in (ran.err, result["message"]):
        assert re.search(r"CTX_MOUNTS|environment", message), message


# --------------------------------------------------------------------- P-8: 50 000 rules


RULES = 50_000


def test_policies_of_fifty_thousand_rules_are_checked_explained_and_obeyed(
    world: World,
) -> None:
    """P-8, P-6, docs/policy.md (a policy holds at most 16 MiB; the chain re-reads it at every
    call): ``shell.exec``'s own policy grows to 50 000 rules, one for each agent of a large
    fleet, with ``ci``'s last.  ``policy check`` passes it, and names only the added last line
    of a copy that ends in a ``deny``; ``policy explain`` allows ``ci`` the tool through both
    layers; and a native call runs, every command bounded in memory."""
    policy = world.root / "tool" / "shell.exec.d" / "policy"
    text = policy.read_text().replace(f"allow {LABEL} tool:shell.exec execute\n", "")
    rules = "".join(f"allow a{i}_t tool:shell.exec execute\n" for i in range(RULES - 1))
    policy.write_text(text + rules + f"allow {LABEL} tool:shell.exec execute\n")
    env = world.env
    checked = ok(limited(env, "policy", "check", policy))
    assert (checked.out, checked.err) == ("", ""), checked

    bad = world.scratch / "bad.policy"
    shutil.copyfile(policy, bad)
    count = len(bad.read_text().splitlines())
    with open(bad, "a") as more:
        more.write("deny x_t tool:y execute\n")
    refused = limited(env, "policy", "check", bad, "--json")
    assert refused.rc == 1 and TRACEBACK not in refused.err, refused
    [entry] = refused.json()["files"]
    assert [p["line"] for p in entry["problems"]] == [count + 1], entry["problems"][:3]

    explained = ok(limited(env, "policy", "explain", AGENT, "tool:shell.exec", "execute"))
    assert explained.lines()[-1] == "allow", explained

    call = limited(env, "run", "--native", "--agent", AGENT, "shell.exec",
                   input=json.dumps({"cmd": "echo ran"}))  # fmt: skip
    result = result_frame(call)
    assert call.rc == 0 and result["output"] == "ran\n", result


# ------------------------------------------------------------------- 500 mounts


MOUNTS = 500


def test_an_agent_with_five_hundred_mounts_sees_and_is_confined_to_each(world: World) -> None:
    """A-3, T-5, P-5 steps 2–5, docs/tools.md ("Paths are confined to the agent's visible
    mounts"): an agent made from a request of 500 mounts (alternately ``rw`` and ``ro``)
    records all of them and a ``mount:`` rule for each; ``agent show`` lists them with none
    withheld and no problem; ``policy explain`` refuses writing a ``ro`` mount at step 3
    (its mode bits would allow it); its ``fs.read`` reads the last mount, its
    ``fs.write`` writes the last ``rw`` mount and gets EROFS on the last ``ro`` one."""
    sources = world.scratch / "mounts"
    sources.mkdir(mode=0o755)
    mounts = []
    for i in range(MOUNTS):
        source = sources / f"m{i:03d}"
        source.mkdir(mode=0o755)
        (source / "f.txt").write_text(f"file {i}\n")
        mounts.append([str(source), f"/data/m{i:03d}", "rw" if i % 2 == 0 else "ro"])
    last_rw, last_ro = f"m{MOUNTS - 2:03d}", f"m{MOUNTS - 1:03d}"
    for writable in (last_rw, last_ro):  # the mode bits (step 2) let the agent write both
        (sources / writable).chmod(0o777)
    request = {"name": "many", "label": "many_t", "tools": ["fs.read", "fs.write"],
               "mount": mounts}  # fmt: skip
    env = world.env
    ok(limited(env, "agent", "create", "-", input=json.dumps(request)))
    for tool in ("fs.read", "fs.write"):
        allow_in_tool_policy(world.root, tool, label="many_t")
    policy = (world.root / "agent" / "many.d" / "policy").read_text()
    for i in range(MOUNTS):
        assert f"allow many_t mount:m{i:03d} read\n" in policy, i
    assert f"allow many_t mount:{last_rw} write\n" in policy

    shown = ok(limited(env, "agent", "show", "many", "--json")).json()
    data = [m for m in shown["mounts"] if m[1].startswith("/data/")]
    assert data == mounts, data[:3]
    assert (shown["withheld_mounts"], shown["problems"]) == ([], []), shown

    denied = limited(env, "policy", "explain", "many", f"mount:{last_ro}", "write")
    assert denied.rc == 1 and denied.lines()[-1].startswith("deny: EACCES: step 3 "), denied

    def call(tool: str, value: dict) -> dict:
        return result_frame(
            limited(env, "run", "--native", "--agent", "many", tool, input=json.dumps(value))
        )

    read = call("fs.read", {"path": f"/data/{last_ro}/f.txt"})
    assert read["status"] == "ok" and read["output"]["content"] == f"file {MOUNTS - 1}\n", read
    wrote = call("fs.write", {"path": f"/data/{last_rw}/new.txt", "content": "made"})
    assert wrote["status"] == "ok", wrote
    assert (sources / last_rw / "new.txt").read_text() == "made"
    refused = call("fs.write", {"path": f"/data/{last_ro}/new.txt", "content": "no"})
    assert refused["output"]["error"] == "EROFS", refused
    assert not (sources / last_ro / "new.txt").exists()


CROWDED_MOUNTS = 2000


def test_an_agent_made_with_two_thousand_mounts_can_run_its_tools(world: World) -> None:
    """A-3, T-3, T-5, docs/policy.md (an agent request holds at most 256 KiB) and docs/tools.md
    (the tool gets the mounts its policy lets it use in ``CTX_MOUNTS``; the kernel takes at
    most 128 KiB for one variable): a request of 2 000 read-only mounts, some 180 KiB, is
    within the request's limit.  Either ``agent create`` refuses it, naming the mounts, and
    makes nothing; or the agent it makes, which ``agent show`` reports without a problem, can
    run its tool: ``fs.read`` of a file in its last mount.  Not an agent that is made and then
    refused every call with ``E2BIG: … Argument list too long``."""
    sources = world.scratch / "crowd"
    sources.mkdir(mode=0o755)
    mounts = []
    for i in range(CROWDED_MOUNTS):
        source = sources / f"project-{i:04d}"
        source.mkdir(mode=0o755)
        mounts.append([str(source), f"/data/project-{i:04d}", "ro"])
    (source / "f.txt").write_text("last\n")
    request = json.dumps({"name": "crowd", "label": "crowd_t", "tools": ["fs.read"],
                          "mount": mounts})  # fmt: skip
    assert 128 * 1024 < len(request) < 256 * 1024
    env = world.env
    made = limited(env, "agent", "create", "-", input=request)
    assert TRACEBACK not in made.err, made
    if made.rc != 0:
        assert made.rc == 1 and "mount" in made.err, made
        assert not (world.root / "agent" / "crowd").exists()
        return
    allow_in_tool_policy(world.root, "fs.read", label="crowd_t")
    shown = ok(limited(env, "agent", "show", "crowd", "--json")).json()
    assert shown["problems"] == [], shown["problems"]
    path = f"/data/project-{CROWDED_MOUNTS - 1:04d}/f.txt"
    call = limited(env, "run", "--native", "--agent", "crowd", "fs.read",
                   input=json.dumps({"path": path}))  # fmt: skip
    result = result_frame(call)
    assert result["status"] == "ok", result["error"]
    assert result["output"]["content"] == "last\n"


# ------------------------------------------------------------- S-5: a long session and its tail


SESSION_EVENTS = 10_000


def note(n: int, **facts) -> bytes:
    """One whole event line (S-2's six keys first) for session ``big`` of ``ci``."""
    event = {"ts": "2026-12-04T12:00:00Z", "type": "note", "agent": AGENT, "session": "big",
             "object": "tool/x", "status": "ok", "n": n, **facts}  # fmt: skip
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"


def test_show_tail_and_repair_stream_a_session_holding_a_50_mb_line_and_a_long_torn_tail(
    world: World,
) -> None:
    """S-5, docs/sessions.md ("Readers read the file in pieces of 64 KiB and hold at most two
    of them, whatever the file holds"; a line of 64 KiB or more is damaged, an unterminated
    last line of any length torn): a session of 10 000 events, then one 50 MB line, three
    more events and a torn line of 100 000 bytes, is read by ``show`` and ``tail`` under an
    address space smaller than twice that one line: every event in order, the long line
    reported as damaged, the torn tail as torn; ``repair`` cuts exactly the torn bytes and
    nothing else; the next call then appends whole lines after the last event."""
    env = world.env
    ok(limited(env, "run", "--agent", AGENT, "--session", "big", "shell.exec", "true"))
    events = world.session("big")
    head = events.read_bytes()
    torn = b'{"ts":"2026-12-04T12:00:00Z","type":"note","pad":"' + b"t" * (100_000 - 50)
    assert len(torn) == 100_000
    with open(events, "ab") as log:
        log.write(b"".join(note(i) for i in range(SESSION_EVENTS)))
        log.write(b'{"ts":"2026-12-04T12:00:00Z","type":"note","pad":"' + b"x" * (50 * MIB))
        log.write(b'"}\n' + note(0, after=1) + note(1, after=2) + note(2, after=3) + torn)
    damaged_line = len(head.splitlines()) + SESSION_EVENTS + 1
    whole_size = events.stat().st_size - len(torn)

    shown = ok(limited(env, "session", "show", AGENT, "big", "--json", memory=TIGHT))
    got = frames(shown)
    assert len(got) == 2 + SESSION_EVENTS + 3, len(got)
    assert [e.get("n") for e in got[2:-3]] == list(range(SESSION_EVENTS))
    assert [e.get("after") for e in got[-3:]] == [1, 2, 3]
    assert "torn line of 100000 bytes" in shown.err, shown.err
    assert f"damaged lines {damaged_line} " in shown.err, shown.err

    tail = ok(limited(env, "session", "tail", AGENT, "big", "-n", "3", "--json", memory=TIGHT))
    assert [e.get("after") for e in frames(tail)] == [1, 2, 3], tail.out[:300]
    assert "torn line of 100000 bytes" in tail.err, tail.err

    repaired = ok(limited(env, "session", "repair", AGENT, "big", "--json", memory=TIGHT))
    assert repaired.json()["truncated_bytes"] == len(torn), repaired
    assert events.stat().st_size == whole_size

    ok(limited(env, "run", "--agent", AGENT, "--session", "big", "shell.exec", "echo again"))
    last = ok(limited(env, "session", "tail", AGENT, "big", "-n", "3", "--json", memory=TIGHT))
    assert [e["type"] for e in frames(last)] == ["note", "tool_call", "tool_result"], last
    assert frames(last)[0].get("after") == 3 and "torn" not in last.err, last


FOLLOWED_EVENTS = 100_000


def test_tail_follow_streams_a_large_session_that_replaced_the_one_it_followed(
    world: World,
) -> None:
    """S-5, docs/sessions.md ("Readers read the file in pieces of 64 KiB and hold at most two
    of them, whatever the file holds"; a follower reads a file that replaced the one it
    followed again from its start, as ``tail -F`` does): ``ctx session tail --follow`` runs
    under an address space in which ``ctx session tail`` reads the same 11 MB session of
    100 000 events.  When a copy of that session (restored from a backup, say) is renamed
    over the small one it follows, the follower must print every one of its events and go
    on following, not stop with ENOMEM."""
    env = world.env
    ok(limited(env, "run", "--agent", AGENT, "--session", "fol", "shell.exec", "true"))
    events = world.session("fol")
    restored = events.with_name("restored.jsonl")
    restored.write_bytes(b"".join(note(i) for i in range(FOLLOWED_EVENTS)))
    owner = events.stat()
    os.chown(restored, owner.st_uid, owner.st_gid)
    restored.chmod(0o600)

    out, err = world.scratch / "follow.out", world.scratch / "follow.err"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        follower = subprocess.Popen(
            [*CTX_ARGV, "session", "tail", AGENT, "fol", "-n", "1", "--follow", "--json"],
            stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=env,
            start_new_session=True,
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (TIGHT, TIGHT)),
        )  # fmt: skip
    try:
        assert wait_for(lambda: out.read_bytes().count(b"\n") >= 1, 30), err.read_text()
        os.rename(restored, events)
        alone = ok(limited(env, "session", "tail", AGENT, "fol", "-n", "1", "--json",
                           memory=TIGHT))  # fmt: skip
        assert frames(alone)[0]["n"] == FOLLOWED_EVENTS - 1, alone

        def shown_or_ended() -> bool:
            printed = out.read_bytes()
            if follower.poll() is not None or not printed.endswith(b"\n"):
                return follower.poll() is not None
            return json.loads(printed.splitlines()[-1]).get("n") == FOLLOWED_EVENTS - 1

        wait_for(shown_or_ended, 60, step=0.2)
        assert follower.poll() is None, (follower.returncode, err.read_text()[-500:])
        printed = out.read_bytes().splitlines()
        assert len(printed) == 1 + FOLLOWED_EVENTS, (len(printed), err.read_text()[-500:])
    finally:
        if follower.poll() is None:
            follower.kill()
        follower.wait()


# ---------------------------------------------------------------- T-7: a log of 1 GiB sparse


def test_a_tool_log_grown_sparse_to_a_gibibyte_costs_a_call_only_its_data(world: World) -> None:
    """T-1, T-7, T-8, S-5, docs/tools.md (the ``log`` is a record the host appends to; a
    reinstall keeps it as the very same file) and docs/sessions.md (a tool's log is opened as
    a session's; the next appender cuts a torn line; the holes of a sparse file are skipped,
    not read): after one call, the tool's log is grown with holes to 1 GiB (its end no
    longer a line).  A reinstall keeps that very file, ``object list`` shows the tool
    available, and the next call, bounded in memory, cuts the hole and appends its line
    after the first call's."""
    tool = world.install("log.probe", "#!/bin/sh\necho probed\n")
    world.grant("log.probe")
    env = world.env
    call = ("run", "--agent", AGENT, "log.probe")
    assert ok(limited(env, *call)).out == "probed\n"
    log = world.root / "tool" / "log.probe.d" / "log"
    [first] = lines_of(log)
    os.truncate(log, GIB)
    inode = log.stat().st_ino

    manifest = world.scratch / "manifests" / "log.probe.json"
    ok(limited(env, "object", "install", manifest, "--tier", "system"))
    assert (log.stat().st_ino, log.stat().st_size) == (inode, GIB)
    listed = ok(limited(env, "object", "list", "--tier", "system", "--json")).json()
    assert [e["status"] for e in listed if e["name"] == "log.probe"] == ["available"]

    assert ok(limited(env, *call, memory=TIGHT)).out == "probed\n"
    assert tool.exists() and log.stat().st_ino == inode
    kept = lines_of(log)
    assert kept[0] == first and len(kept) == 2, [line[:80] for line in kept]
    second = json.loads(kept[1])
    assert (second["type"], second["status"]) == ("tool_result", "ok"), second


# ------------------------------------------------ §2.4: 20 000 results and 16 MiB


DONE_JOBS = 20_000


def test_a_queue_of_twenty_thousand_results_and_one_of_16_mib_is_read_and_left_alone(
    world: World,
) -> None:
    """§2.1, §2.4, Q-4, Q-5, I-5, docs/queue.md (``max_result_bytes`` 16 MiB by default):
    ``done/`` holds 20 000 finished pairs and one whose result is exactly 16 MiB.  Under an
    address space of a few times that result, ``status`` counts 20 001 done and nothing
    else, ``list --state done`` lists each once, ``show`` gives the big result whole, and
    ``recover`` and ``recover --reconcile`` find the queue consistent and change nothing."""
    queue = QueueCLI(world.root, "proj")
    request = json.dumps({"tool": "fs.stat", "input": {"path": "/"}, "from": "t",
                          "created": "2026-06-22T12:00:00Z"}).encode()  # fmt: skip
    small = json.dumps({"status": "ok", "output": {"a": 1}, "worker": {"worker": "w"},
                        "started": "2026-06-22T12:00:00Z",
                        "finished": "2026-06-22T12:00:01Z"}).encode()  # fmt: skip
    done = os.open(queue.dir / "done", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(DONE_JOBS):
            for name, data in ((f"j{i:05d}.req.json", request), (f"j{i:05d}.req.json.result",
                                                                small)):  # fmt: skip
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o660, dir_fd=done)
                os.write(fd, data)
                os.close(fd)
    finally:
        os.close(done)
    big = {"status": "ok", "output": "", "worker": {"worker": "w"},
           "started": "2026-06-22T12:00:00Z", "finished": "2026-06-22T12:00:01Z"}  # fmt: skip
    big["output"] = "r" * (RESULT_LIMIT - len(json.dumps(big)))
    (queue.dir / "done" / "big.req.json").write_bytes(request)
    (queue.dir / "done" / "big.req.json.result").write_text(json.dumps(big))
    assert (queue.dir / "done" / "big.req.json.result").stat().st_size == RESULT_LIMIT
    before = sorted(os.listdir(queue.dir / "done"))
    env = world.env

    status = ok(limited(env, "queue", "status", "--project", "proj", "--json")).json()
    counts = status["counts"]
    assert counts["done"] == DONE_JOBS + 1, counts
    assert sum(counts.values()) == DONE_JOBS + 1, counts
    listed = ok(limited(env, "queue", "list", "--project", "proj", "--state", "done"))
    assert sorted(listed.lines()) == sorted(n for n in before if not n.endswith(".result"))

    shown = ok(limited(env, "queue", "show", "--project", "proj", "big.req.json", "--json"))
    report = shown.json()
    assert report["state"] == "done" and report["result"]["output"] == big["output"]

    plain = ok(limited(env, "queue", "recover", "--project", "proj"))
    assert plain.lines()[-1].endswith("queue consistent"), plain
    again = ok(limited(env, "queue", "recover", "--project", "proj", "--reconcile", "--json"))
    assert again.json()["consistent"] is True, again.out[:500]
    assert (again.json()["requeued"], again.json()["repaired"]) == ([], [])
    assert sorted(os.listdir(queue.dir / "done")) == before


# ------------------------------------------------------ batches and max_request_bytes


BATCH = 10_000
REFUSED_BATCH = 50_000


def sized_request(n: int, size: int) -> str:
    """A request line of exactly ``size`` bytes."""
    body = {"tool": "fs.stat", "input": {"path": "/"}, "n": n, "pad": ""}
    body["pad"] = "p" * (size - len(json.dumps(body, separators=(",", ":"))))
    text = json.dumps(body, separators=(",", ":"))
    assert len(text) == size
    return text


def test_batches_of_tens_of_thousands_of_lines_publish_whole_or_not_at_all(
    world: World, child: subprocess.Popen
) -> None:
    """Q-1, Q-9, §2.4 ``publish --batch`` (one request per line, one group commit; one bad
    line refuses the whole batch before anything is written), docs/queue.md
    (``max_request_bytes`` limits each line; a request of exactly the limit is accepted):
    a batch of 10 000 lines prints 10 000 distinct names in line order, all pending, the
    first line claimed first; a batch of 50 000 lines whose last one is one byte over the
    limit publishes nothing and names that line; one whose last line is exactly the limit
    publishes both of its lines, the big one stored whole."""
    env = world.env
    queue = QueueCLI(world.root, "proj")
    batch = "".join(json.dumps({"tool": "fs.stat", "input": {"path": "/"}, "n": n}) + "\n"
                    for n in range(BATCH))  # fmt: skip
    published = ok(limited(env, "queue", "publish", "--project", "proj", "--batch", "-",
                           input=batch))  # fmt: skip
    names = published.lines()
    assert len(names) == len(set(names)) == BATCH
    assert sorted(os.listdir(queue.dir / "pending")) == sorted(names)
    claimed = ok(limited(env, "queue", "claim", "--project", "proj", "--pid", str(child.pid)))
    assert claimed.out == f"{names[0]}\n"

    over = "".join(json.dumps({"tool": "fs.stat", "input": {}, "n": n}) + "\n"
                   for n in range(REFUSED_BATCH - 1))  # fmt: skip
    over += sized_request(REFUSED_BATCH, REQUEST_LIMIT + 1) + "\n"
    refused = limited(env, "queue", "publish", "--project", "proj", "--batch", "-", input=over)
    assert refused.rc == 1 and refused.out == "" and TRACEBACK not in refused.err, refused
    assert refused.err.startswith("ctx: EINVAL: ") and f"line {REFUSED_BATCH} " in refused.err
    assert len(os.listdir(queue.dir / "pending")) == BATCH - 1
    assert os.listdir(queue.dir / "inbox") == []

    at = sized_request(1, REQUEST_LIMIT)
    pair = json.dumps({"tool": "fs.stat", "input": {}, "n": 0}) + "\n" + at + "\n"
    both = ok(limited(env, "queue", "publish", "--project", "proj", "--batch", "-", input=pair))
    [_, big] = both.lines()
    stored = json.loads((queue.dir / "pending" / big).read_text())
    assert stored["pad"] == json.loads(at)["pad"] and stored["n"] == 1


# ------------------------------------------------------------- T-3: floods and big argv


def test_tools_flooding_stdout_and_stderr_are_cut_and_killed_within_bounds(world: World) -> None:
    """T-3, T-7, S-4, docs/tools.md (captured output is limited to 16 MiB, EFBIG at stage
    ``run`` and the rest killed; a ``stderr`` frame holds at most 64 KiB; the result keeps
    the last 64 KiB of stderr) and docs/sessions.md (an event is at most 64 KiB): a tool that
    never stops writing stdout is cut at exactly the limit and killed; one that writes 64 MB
    of stderr as one line, then says ``done`` on stdout, succeeds with the end of that line
    in its result, every frame and record bounded — all under an address space of a few
    times the output limit."""
    env = world.env
    native = ("run", "--native", "--agent", AGENT, "--session", "flood", "shell.exec")
    endless = limited(env, *native, input=json.dumps({"cmd": "yes"}))
    result = frames(endless)[-1]
    assert endless.rc == 1 and result["error"]["error"] == "EFBIG", result["error"]
    assert result["error"]["stage"] == "run"
    assert len(result["output"]) == OUTPUT_LIMIT and set(result["output"]) == {"y", "\n"}

    cmd = "head -c 64000000 /dev/zero | tr '\\0' e >&2; printf z >&2; echo done"
    loud = limited(env, *native, input=json.dumps({"cmd": cmd}), memory=TIGHT)
    *streamed, result = frames(loud)
    assert loud.rc == 0 and result["output"] == "done\n", result["error"]
    assert 0 < len(result["stderr"]) <= EVENT_LIMIT and result["stderr"].endswith("eez")
    pieces = [f["text"] for f in streamed if f["type"] == "stderr"]
    assert all(len(p.encode()) <= EVENT_LIMIT for p in pieces)
    assert sum(len(p) for p in pieces) == 64_000_001
    records = lines_of(world.session("flood")) + lines_of(
        world.root / "tool" / "shell.exec.d" / "log"
    )
    assert records and all(len(line) < EVENT_LIMIT for line in records)


def test_a_hundred_thousand_bytes_of_argv_pass_whole_and_the_callers_environment_does_not(
    world: World,
) -> None:
    """T-3 (terminal mode: the argv is passed as it is), docs/tools.md ("The tool gets exactly
    this environment, nothing from the host's"), S-4 (argv summarised in the records): a call
    with 5 000 words (100 000 bytes, shell syntax and UTF-8 among them) from a caller whose
    environment holds 1.2 MB of its own variables gives the tool every word, in order and
    byte for byte, and none of those variables; its session and log records stay short."""
    tool = (
        '#!/bin/sh\necho "argc=$#"\nprintf "%s\\n" "$@" | md5sum\nenv | grep -c "^HUGE_" || true\n'
    )
    world.install("argv.count", tool)
    world.grant("argv.count")
    words = [f"w{i:04d}-{'é' if i % 7 == 0 else 'a'}{'$(id)*' if i % 11 == 0 else 'bcdefgh'}"
             for i in range(5000)]  # fmt: skip
    words = [word.ljust(20 if "é" not in word else 19, "z") for word in words]
    assert sum(len(word.encode()) for word in words) == 100_000
    env = {**world.env, **{f"HUGE_{i}": "h" * 20_000 for i in range(60)}}
    ran = ok(limited(env, "run", "--agent", AGENT, "--session", "argv", "argv.count", *words))
    digest = hashlib.md5(("\n".join(words) + "\n").encode()).hexdigest()
    assert ran.out == f"argc=5000\n{digest}  -\n0\n", ran
    records = lines_of(world.session("argv")) + lines_of(
        world.root / "tool" / "argv.count.d" / "log"
    )
    assert all(len(line) < EVENT_LIMIT for line in records)
    assert json.loads(records[0])["argv"][0] == words[0]


@pytest.mark.parametrize(
    "stdin",
    [
        pytest.param("at-limit", id="an-input-of-exactly-16-mib"),
        pytest.param("non-ascii", id="six-mb-of-non-ascii-text"),
    ],
)
def test_a_native_input_within_the_limit_reaches_a_core_tool_whole(
    world: World, stdin: str
) -> None:
    """T-3, docs/tools.md ("The input is one JSON value on stdin, passed to the tool on its
    stdin: at most 16 MiB (16777216 bytes, as much as a core tool reads). A longer one is
    refused before anything runs"): ``ctx run --native`` accepts an input of exactly
    16 777 216 bytes, and one of 6 MB of UTF-8 text (``é``, two bytes each); ``shell.exec``
    must then read either and give its ``stdin`` to the command whole (``wc -c`` counts
    it), not refuse it as larger than those 16 MiB."""
    if stdin == "at-limit":
        body = {"cmd": "wc -c", "stdin": ""}
        body["stdin"] = "a" * (INPUT_LIMIT - len(json.dumps(body, separators=(",", ":"))))
        data = json.dumps(body, separators=(",", ":")).encode()
        assert len(data) == INPUT_LIMIT
    else:
        body = {"cmd": "wc -c", "stdin": "é" * 3_000_000}
        data = json.dumps(body, ensure_ascii=False).encode()
    call = limited(world.env, "run", "--native", "--agent", AGENT, "shell.exec", input=data,
                   memory=4 * MEMORY)  # fmt: skip
    result = result_frame(call)
    assert result["status"] == "ok", result["error"]
    # wc's count on stdout, which the result holds as the JSON it is (a number)
    assert str(result["output"]).strip() == str(len(body["stdin"].encode())), result["output"]


# ----------------------------------------------------------------- T-8: a schema of 1 MiB


SCHEMA_PROPERTIES = 14_000
LAST_PROPERTY = f"p{SCHEMA_PROPERTIES - 1:05d}"


def schema_of_installed_size(size: int) -> dict:
    """A JSON Schema of 14 000 string properties whose control, written as install writes it
    (indented by two, keys sorted, a line break after), is exactly ``size`` bytes."""
    props = {f"p{i:05d}": {"maxLength": 8, "type": "string"} for i in range(SCHEMA_PROPERTIES)}
    schema = {"additionalProperties": False, "description": "", "properties": props,
              "required": [LAST_PROPERTY], "type": "object"}  # fmt: skip

    def written() -> int:
        return len(json.dumps(schema, indent=2, sort_keys=True)) + 1

    schema["description"] = "d" * (size - written())
    assert written() == size
    return schema


def test_a_schema_of_exactly_one_mebibyte_installs_and_checks_calls_one_byte_more_does_not(
    world: World,
) -> None:
    """T-8, T-1, docs/tools.md (a manifest is read up to 1 MiB; every control but the policy
    holds at most 1 MiB; install refuses, ``EFBIG`` and nothing installed, a manifest whose
    controls would be larger as installed, a schema being written indented): a manifest
    whose schema is exactly 1 MiB as installed is installed (its ``schema`` control 1 048 576
    bytes) and judges calls (a valid input runs, an invalid one is EINVAL at stage ``schema``
    naming the property); the same with one byte more in the schema is refused whole; a
    manifest file of exactly 1 MiB is read, one of a byte more is not."""
    env = world.env
    src = world.scratch / "schemas"
    src.mkdir()
    (src / "run.sh").write_text("#!/bin/sh\necho checked\n")

    def manifest(name: str, schema: dict) -> Path:
        path = src / f"{name}.json"
        path.write_text(json.dumps({"manifest": 2, "kind": "tool", "name": name,
                                    "description": "d", "schema": schema,
                                    "cap": {"side_effects": False, "network": False},
                                    "exec": "run.sh"}))  # fmt: skip
        return path

    fits = manifest("schema.fits", schema_of_installed_size(CONTROL_LIMIT))
    ok(limited(env, "object", "install", fits, "--tier", "system"))
    assert (world.root / "tool" / "schema.fits.d" / "schema").stat().st_size == CONTROL_LIMIT
    world.grant("schema.fits")
    native = ("run", "--native", "--agent", AGENT, "schema.fits")
    ran = result_frame(limited(env, *native, input=json.dumps({LAST_PROPERTY: "ok"})))
    assert (ran["status"], ran["output"]) == ("ok", "checked\n"), ran["error"]
    bad = result_frame(limited(env, *native, input=json.dumps({LAST_PROPERTY: "much too long"})))
    assert (bad["error"]["error"], bad["error"]["stage"]) == ("EINVAL", "schema"), bad
    assert LAST_PROPERTY in bad["error"]["message"], bad["error"]

    over = manifest("schema.over", schema_of_installed_size(CONTROL_LIMIT + 1))
    refused = limited(env, "object", "install", over, "--tier", "system")
    assert refused.rc == 1 and refused.err.startswith("ctx: EFBIG: "), refused
    assert not [n for n in os.listdir(world.root / "tool") if "schema.over" in n]

    whole = {"manifest": 2, "kind": "tool", "name": "manifest.size", "description": "d",
             "schema": {"type": "object", "description": ""}, "cap": {},
             "exec": "run.sh"}  # fmt: skip
    whole["schema"]["description"] = "m" * (MIB - len(json.dumps(whole)))
    (src / "at.json").write_text(json.dumps(whole))
    whole["schema"]["description"] += "m"
    (src / "past.json").write_text(json.dumps(whole))
    assert (src / "at.json").stat().st_size == MIB == (src / "past.json").stat().st_size - 1
    ok(limited(env, "object", "check", src / "at.json"))
    past = limited(env, "object", "check", src / "past.json", "--json")
    assert past.rc == 1 and past.json()[0]["codes"] == ["EINVAL"], past
    assert str(MIB) in past.json()[0]["problems"][0], past


# ------------------------------------------------------------ H-1, H-2: tsh at a terminal


TSH_MEMORY = 128 * MIB
PROMPT = b"tsh$ "


class Terminal:
    """A PTY whose other side runs a person's ``bin/tsh`` (no agent context, H-2) as its
    controlling terminal, under an address-space limit; what it shows is collected."""

    def __init__(self, tsh: Path, env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()

        def preexec() -> None:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            resource.setrlimit(resource.RLIMIT_AS, (TSH_MEMORY, TSH_MEMORY))

        self.proc = subprocess.Popen(
            [tsh], stdin=slave, stdout=slave, stderr=slave, env=env,
            start_new_session=True, preexec_fn=preexec,
        )  # fmt: skip
        os.close(slave)
        self.screen = bytearray()
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    def _pump(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.screen += chunk

    def shows(self, text: bytes, count: int = 1, seconds: float = 30) -> bool:
        return wait_for(lambda: self.screen.count(text) >= count, seconds)

    def type(self, data: bytes, seconds: float = TIMEOUT) -> None:
        """Write ``data`` as a paste would, waiting while the terminal's input queue is full
        (as long as tsh runs), at most ``seconds`` in all."""
        deadline = time.monotonic() + seconds
        view = memoryview(data)
        while view:
            assert self.proc.poll() is None, bytes(self.screen[-500:])
            assert time.monotonic() < deadline, "tsh stopped reading its terminal"
            _, writable, _ = select.select([], [self.master], [], 0.2)
            if writable:
                view = view[os.write(self.master, view[:4096]) :]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.master)
        self.reader.join(timeout=5)


def test_tsh_at_a_terminal_takes_a_line_past_4095_bytes_and_drops_a_paste_past_1_mib(
    world: World,
) -> None:
    """H-1, H-2, docs/tools.md ("the terminal's own line editing keeps 4095 bytes of a line and
    drops the rest: a line typed at the prompt reaches tsh whole, up to 1 MiB (longer: E2BIG,
    status 2, nothing run …, never held whole)"): at a real terminal, a person's tsh under an
    address-space limit answers a ``which`` line of 5 605 bytes for every one of its 700
    names; a paste of a line over 1 MiB is refused with E2BIG and nothing of it runs; the
    next line runs and ``exit 3`` leaves with status 3."""
    home = world.scratch / "home"
    home.mkdir()
    env = clean_env(CTX_STORAGE=str(world.root), CTX_PATH=str(world.root / "tool"),
                    CTX_HOME=str(home), TERM="xterm")  # fmt: skip
    path = f"{world.root / 'tool' / 'fs.read'}\r\n".encode()
    with contextlib.closing(Terminal(world.root / "bin" / "tsh", env)) as term:
        assert term.shows(PROMPT), bytes(term.screen)
        line = b"which" + b" fs.read" * 700
        assert len(line) > 4095
        term.type(line + b"\r")
        assert term.shows(PROMPT, 2), bytes(term.screen[-300:])
        assert term.screen.count(path) == 700

        term.type(b"which" + b" fs.read" * (MIB // 8 + 64) + b"\r")
        assert term.shows(b"E2BIG", 1, TIMEOUT), bytes(term.screen[-300:])
        assert term.shows(PROMPT, 3), bytes(term.screen[-300:])
        assert term.screen.count(path) == 700, "nothing of the dropped line ran"

        term.type(b"which fs.stat\r")
        assert term.shows(f"{world.root / 'tool' / 'fs.stat'}\r\n".encode())
        term.type(b"exit 3\r")
        assert term.proc.wait(timeout=30) == 3
