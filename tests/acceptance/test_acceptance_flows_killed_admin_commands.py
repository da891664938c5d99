"""End-to-end flows of administrative ``ctx`` commands that die, or hang, in the middle of their
work (SPEC R-2, R-5, T-8, T-8a, A-3, X-1, H-4, §2.4; docs/tools.md "Readers find a tool by its
executable …", "Installs and repairs of one tier … take turns", "ctx bootstrap (R-5)").

The command is either SIGKILLed by strace's fault injection as it enters one of its steps, or
frozen there (SIGSTOP) while the administrator looks around and starts the next command, and
then SIGKILLed; or it is SIGKILLed from outside, again and again, as its work advances, without
the root being put back in between.  After each kill or during each freeze a reader (``ctx
object which``/``list``, ``ctx agent list``, ``ctx run``, ``ctx tool tsh.config``, ``ctx queue
status``/``publish``) meets the old state or the new one, never an executable without its
complete control directory, a half-written control, or a half-made agent, space or queue taken
for a whole one; a second command of the same tier waits for the frozen one and then completes;
running the same command again completes the work (or says what to repair); ``ctx bootstrap``
finishes or discards what was left; and nothing the administrator had is lost."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QUEUE_SUBDIRS,
    Run,
    alive,
    clean_env,
    ctx_run,
    new_scratch_dir,
    scratch_top,
    tool_manifest,
    wait_for,
)
from tests.support.strace import Step, can_inject, first_process_steps, pick
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid: needs root"),
    pytest.mark.skipif(not can_inject(), reason="needs strace fault injection"),
]

TOP = scratch_top(__file__)
AGENT = "ci"
LABEL = "ci_t"
# The calls traced to name a step: those that change a filesystem, plus flock.
CALLS = "mkdirat,renameat2,renameat,linkat,unlinkat,openat,write,fchmod,fchown,flock"
CONTROLS = ("name", "description", "schema", "cap", "policy", "status", "log")
TRACEBACK = "Traceback"


# ------------------------------------------------------------------------------ helpers


def _umask_022() -> None:
    os.umask(0o022)  # an administrator's usual umask, whatever the test runner's


def ctx(root: Path, *args, input: str | bytes | None = None) -> Run:
    return ctx_run(*args, input=input, env=clean_env(CTX_STORAGE=str(root)))


def _strace(trace: Path, inject: str | None = None) -> list[str]:
    argv = ["strace", "-f", "-qq", "-o", str(trace), "-e", f"trace={CALLS}"]
    if inject is not None:
        argv += ["-e", f"inject={inject}"]
    return argv


def _run(argv: list[str], root: Path, input: bytes, user: UnprivilegedUser | None) -> Run:
    as_user = {}
    if user is not None:
        as_user = {"user": user.uid, "group": user.gid, "extra_groups": []}
    proc = subprocess.run(argv, input=input, capture_output=True, timeout=120,
                          env=clean_env(CTX_STORAGE=str(root)), preexec_fn=_umask_022,
                          **as_user)  # fmt: skip
    return Run(argv, proc.returncode, proc.stdout.decode(errors="replace"),
               proc.stderr.decode(errors="replace"))  # fmt: skip


def steps_of(root: Path, args, trace: Path, input: bytes = b"", user=None) -> list[Step]:
    """Run ``ctx ARGS`` once to its end under strace; the calls of its own process."""
    done = _run([*_strace(trace), *CTX_ARGV, *map(str, args)], root, input, user)
    assert done.rc == 0, done
    return first_process_steps(trace)


def killed_at(root: Path, args, step: Step, trace: Path, input: bytes = b"", user=None) -> Run:
    """``ctx ARGS`` SIGKILLed by strace as it enters ``step``."""
    inject = f"{step.call}:signal=KILL:when={step.nth}"
    run = _run([*_strace(trace, inject), *CTX_ARGV, *map(str, args)], root, input, user)
    assert run.rc == -signal.SIGKILL, (str(step), run)  # strace dies of its tracee's signal
    assert TRACEBACK not in run.err, run
    return run


@contextlib.contextmanager
def frozen(root: Path, args, step: Step, trace: Path, input: bytes = b"") -> Iterator[int]:
    """``ctx ARGS`` stopped (SIGSTOP) at ``step``, for the block: yields its pid; SIGKILLed on
    the way out, as an administrator does with a command that hangs."""
    inject = f"{step.call}:signal=STOP:when={step.nth}"
    proc = subprocess.Popen([*_strace(trace, inject), *CTX_ARGV, *map(str, args)],
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=clean_env(CTX_STORAGE=str(root)),
                            preexec_fn=_umask_022)  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write(input)
    proc.stdin.close()
    pid = None
    try:

        def stopped() -> bool:
            return trace.exists() and "stopped by SIGSTOP" in trace.read_text()

        assert wait_for(lambda: stopped() or proc.poll() is not None, 60), "never stopped"
        assert proc.poll() is None and stopped(), (str(step), proc.returncode)
        pid = int(trace.read_text().split(None, 1)[0])
        yield pid
    finally:
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        else:
            proc.kill()
        proc.wait(timeout=60)


def waiting_for_a_lock(pid: int) -> bool:
    """Whether process ``pid`` is blocked on a file lock (a ``->`` line of /proc/locks)."""
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields and len(fields) > 5 and fields[fields.index("->") + 4] == str(pid):
            return True
    return False


def start(root: Path, *args, input: bytes = b"") -> subprocess.Popen:
    proc = subprocess.Popen([*CTX_ARGV, *map(str, args)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=clean_env(CTX_STORAGE=str(root)))  # fmt: skip
    assert proc.stdin is not None
    proc.stdin.write(input)
    proc.stdin.close()
    proc.stdin = None  # given whole: communicate() has nothing more to send
    return proc


def finished(proc: subprocess.Popen) -> Run:
    out, err = proc.communicate(timeout=60)
    return Run(list(map(str, proc.args)), proc.returncode, out.decode(), err.decode())


def copy_tree(source: Path, target: Path) -> None:
    """``target`` a copy of ``source`` with owners, modes and links as they are (``cp -a``)."""
    subprocess.run(["cp", "-a", str(source), str(target)], check=True)


def hidden(directory: Path) -> list[str]:
    """Hidden names a tier holds, its lock file aside (an install's staging, a marker)."""
    return sorted(n for n in os.listdir(directory) if n.startswith(".") and n != ".install-lock")


@pytest.fixture
def scratch() -> Iterator[Path]:
    top = new_scratch_dir(TOP, "t-")
    yield top
    shutil.rmtree(top, ignore_errors=True)


_TEMPLATE: list[Path] = []


def bootstrapped(root: Path) -> Path:
    """``root`` bootstrapped: one bootstrap per test process, copied, then bootstrapped again
    in place (so that ``bin/ctxterm`` names this root and a later bootstrap has nothing to do)."""
    if not _TEMPLATE:
        made = new_scratch_dir(TOP, "template-") / "st"
        assert ctx(made, "bootstrap").rc == 0
        _TEMPLATE.append(made)
        atexit.register(shutil.rmtree, made.parent, True)
    copy_tree(_TEMPLATE[0], root)
    again = ctx(root, "bootstrap")
    assert again.rc == 0, again
    return root


def assert_nothing_to_do(root: Path, where: str = "") -> None:
    settled = ctx(root, "bootstrap")
    assert settled.rc == 0 and "nothing to do" in settled.out, (where, settled)


def assert_whole_tools(root: Path, where: str, listing: bool = True) -> dict[str, bytes]:
    """Every tool a reader finds in ``tool/`` has its complete, parseable control directory,
    and ``ctx object list`` shows it whole (asked when ``listing``: while a commit marker is
    there, a listing first waits for it 2 s); returns the controls seen (path -> bytes)."""
    tier = root / "tool"
    seen: dict[str, bytes] = {}
    if not tier.is_dir():
        return seen
    marked = {n.split("~")[0][1:] for n in hidden(tier) if n.endswith("~commit")}
    for name in os.listdir(tier):
        entry = tier / name
        if name.startswith(".") or name.endswith(".d") or not entry.is_file():
            continue
        controls = tier / f"{name}.d"
        missing = [c for c in CONTROLS if not (controls / c).is_file()]
        assert not missing, (where, name, missing)
        assert (controls / "name").read_text() == f"{name}\n", (where, name)
        json.loads((controls / "schema").read_text())
        json.loads((controls / "cap").read_text())
        for control in ("name", "description", "schema", "cap"):
            seen[f"tool/{name}.d/{control}"] = (controls / control).read_bytes()
        seen[f"tool/{name}"] = entry.read_bytes()
    if not listing:
        return seen
    listed = ctx(root, "object", "list", "--json")
    assert listed.rc == 0, (where, listed)
    for obj in listed.json():
        assert not obj["problems"], (where, obj)
        if obj["name"] not in marked:
            assert obj["status"] == "available", (where, obj)
    return seen


# ------------------------------------------------------------------------------ tools


def demo_world(top: Path) -> tuple[Path, dict[str, Path]]:
    """A root where tool ``demo`` version one is installed, granted to agent ``ci`` in both
    layers of P-6, guarded by an administrator's pre-hook and called once (made once per test
    process, copied, bootstrapped in place); manifests of versions one to three."""
    manifests = {
        word: tool_manifest(
            top / word, "demo", f"#!/bin/sh\necho {word}\n", description=f"version {word}"
        )
        for word in ("one", "two", "three")
    }
    return demo_root(top / "st", manifests["one"]), manifests


def demo_root(root: Path, one: Path) -> Path:
    bootstrapped(root)
    assert ctx(root, "object", "install", one, "--tier", "system").rc == 0
    made = ctx(root, "agent", "create", "-",
               input=json.dumps({"name": AGENT, "label": LABEL, "tools": ["demo"]}))  # fmt: skip
    assert made.rc == 0, made
    with open(root / "tool" / "demo.d" / "policy", "a") as policy:
        policy.write(f"allow {LABEL} tool:demo execute\n")
    hook = root / "tool" / "demo.d" / "hooks" / "pre.d" / "10-admin"
    hook.write_text("#!/bin/sh\nexit 0\n")
    hook.chmod(0o755)
    first = ctx(root, "run", "--agent", AGENT, "demo")
    assert (first.rc, first.out) == (0, "one\n"), first
    return root


def assert_demo_state_kept(root: Path, calls: int) -> None:
    """The administrator's grant and hook are kept, and the log holds every earlier call."""
    controls = root / "tool" / "demo.d"
    assert f"allow {LABEL} tool:demo execute" in (controls / "policy").read_text()
    assert (controls / "hooks" / "pre.d" / "10-admin").read_text() == "#!/bin/sh\nexit 0\n"
    assert len((controls / "log").read_text().splitlines()) >= calls


def test_a_reinstall_frozen_mid_commit_is_whole_to_readers_and_the_next_install_waits_then_wins(
    scratch,
):
    """T-8, T-8a, R-5 (docs/tools.md: the executable and its control directory are never
    missing; installs of one tier take turns on ``.install-lock``): a reinstall of ``demo``
    hangs just after swapping in its new control directory.  Meanwhile ``ctx object which``
    finds ``demo``, its controls are complete and parseable, the listing shows no problem; an
    install of version three started then waits on the tier's lock instead of working beside
    it.  Once the hung install is SIGKILLed the waiting one completes, version three runs, no
    hidden name is left, the grant, hook and log are kept and bootstrap has nothing to do."""
    root, manifests = demo_world(scratch)
    args = ["object", "install", manifests["two"], "--tier", "system"]
    template = scratch / "template"
    copy_tree(root, template)
    steps = steps_of(root, args, scratch / "reference.trace")
    swap = pick(steps, "renameat2", "RENAME_EXCHANGE")
    shutil.rmtree(root)
    copy_tree(template, root)

    with frozen(root, args, swap, scratch / "frozen.trace") as pid:
        assert (root / "tool" / ".demo~commit").exists()  # a commit under way
        which = ctx(root, "object", "which", "demo")
        assert (which.rc, which.out.strip()) == (0, str(root / "tool" / "demo")), which
        assert_whole_tools(root, "frozen", listing=False)
        second = start(root, "object", "install", manifests["three"], "--tier", "system")
        assert wait_for(lambda: waiting_for_a_lock(second.pid) or second.poll() is not None)
        assert second.poll() is None, finished(second)  # it waits for the hung one
        assert alive(pid)
    done = finished(second)
    assert done.rc == 0 and TRACEBACK not in done.err, done
    assert hidden(root / "tool") == []
    call = ctx(root, "run", "--agent", AGENT, "demo")
    assert (call.rc, call.out) == (0, "three\n"), call
    assert_demo_state_kept(root, calls=2)
    assert_nothing_to_do(root)


def test_a_bootstrap_waiting_on_a_frozen_install_finishes_its_commit_once_it_is_killed(scratch):
    """R-5, T-8 (docs/tools.md "ctx bootstrap (R-5)": it finishes or discards interrupted
    installs, the system tier first): a reinstall hangs with its commit marker written; a
    ``ctx bootstrap`` started then waits for the system tier's lock rather than judging a
    commit still in progress.  When the install is SIGKILLed, bootstrap finishes the marked
    commit and says so naming the tool; version two then runs with the grant, hook and log
    kept, and the next bootstrap has nothing to do."""
    root, manifests = demo_world(scratch)
    args = ["object", "install", manifests["two"], "--tier", "system"]
    template = scratch / "template"
    copy_tree(root, template)
    steps = steps_of(root, args, scratch / "reference.trace")
    marker = pick(steps, "write", after=pick(steps, "openat", "~commit"))
    shutil.rmtree(root)
    copy_tree(template, root)

    with frozen(root, args, marker, scratch / "frozen.trace"):
        repair = start(root, "bootstrap")
        assert wait_for(lambda: waiting_for_a_lock(repair.pid) or repair.poll() is not None)
        assert repair.poll() is None, finished(repair)
    report = finished(repair)
    assert report.rc == 0 and TRACEBACK not in report.err, report
    named = [line for line in report.lines() if str(root / "tool" / "demo") in line]
    assert named and all("interrupted install" in line for line in named), report
    assert hidden(root / "tool") == []
    call = ctx(root, "run", "--agent", AGENT, "demo")
    assert (call.rc, call.out) == (0, "two\n"), call
    assert_demo_state_kept(root, calls=2)
    assert_nothing_to_do(root)


def test_a_reinstall_killed_twice_at_two_moments_is_completed_by_the_next_install(scratch):
    """T-8, R-5: one reinstall is killed with its commit half done (marker written, controls
    swapped), the next, of another version, is killed while it stages; the tier then holds
    what both left.  Readers still find ``demo`` whole; the same install run a third time
    finishes or discards both, installs its version, leaves no hidden name, keeps the grant,
    hook and log, and bootstrap then has nothing to do."""
    root, manifests = demo_world(scratch)
    two = ["object", "install", manifests["two"], "--tier", "system"]
    three = ["object", "install", manifests["three"], "--tier", "system"]
    template = scratch / "template"
    copy_tree(root, template)
    steps_two = steps_of(root, two, scratch / "two.trace")
    shutil.rmtree(root)
    copy_tree(template, root)
    steps_three = steps_of(root, three, scratch / "three.trace")
    shutil.rmtree(root)
    copy_tree(template, root)

    after_swap = pick(steps_two, "renameat", '"demo"')  # the executable's rename, not made
    killed_at(root, two, after_swap, scratch / "k1.trace")
    assert (root / "tool" / ".demo~commit").exists()
    # the third version's staging: its first link of the old local state, before its marker
    staging = pick(steps_three, "linkat", '"policy"')
    run = killed_at(root, three, staging, scratch / "k2.trace")
    assert run.out == "", run
    assert_whole_tools(root, "after two kills", listing=False)

    again = ctx(root, *three)
    assert again.rc == 0 and TRACEBACK not in again.err, again
    assert hidden(root / "tool") == [], again
    call = ctx(root, "run", "--agent", AGENT, "demo")
    assert (call.rc, call.out) == (0, "three\n"), call
    assert_demo_state_kept(root, calls=2)
    assert_nothing_to_do(root)


# ------------------------------------------------------------------------------ bootstrap


def test_a_bootstrap_killed_again_and_again_as_it_advances_never_shows_a_partial_tool(scratch):
    """R-2, R-5, T-8, H-4: ``ctx bootstrap`` of a new root SIGKILLed from outside each time its
    ``tool/`` tier has grown by a few entries, the root never put back in between, so every
    run starts from what the last one left.  After each kill every tool a reader finds has its
    complete controls and is listed whole; ``bin/tsh``, ``bin/ctxterm`` and
    ``tool/tsh.d/config``, when there, are the bytes a finished bootstrap gives; the root
    holds only the six root entries.  The first run left alone completes the root, the next
    has nothing to do, and it holds what an uninterrupted bootstrap makes."""
    root = scratch / "st"
    reference = scratch / "ref"
    assert ctx(reference, "bootstrap").rc == 0
    wanted = {str(p.relative_to(reference)) for p in reference.rglob("*")}
    seen: list[dict[str, bytes]] = []
    kills = 0
    for _ in range(40):
        tier = root / "tool"
        before = len(os.listdir(tier)) if tier.is_dir() else 0
        proc = start(root, "bootstrap")

        def advanced(proc=proc, tier=tier, before=before) -> bool:
            return proc.poll() is not None or (
                tier.is_dir() and len(os.listdir(tier)) >= before + 5
            )

        assert wait_for(advanced, 60, step=0.002)
        if proc.poll() is not None:
            last = finished(proc)
            break
        proc.kill()
        proc.wait()
        kills += 1
        if root.exists():
            assert set(os.listdir(root)) <= {"bin", "tool", "agent", "model", "home", "shared"}
        controls = assert_whole_tools(root, f"kill {kills}")
        for rel in ("bin/tsh", "bin/ctxterm", "tool/tsh.d/config"):
            if (root / rel).exists():
                controls[rel] = (root / rel).read_bytes()
        seen.append(controls)
    else:
        pytest.fail("bootstrap never ran to its end")
    assert kills >= 2, "the tier grew too fast to sample"
    assert last.rc == 0 and TRACEBACK not in last.err, last
    assert_nothing_to_do(root)
    got = {str(p.relative_to(root)) for p in root.rglob("*")}
    debris = {rel for rel in got - wanted if re.search(r"/\.[^/]+\.tmp$", rel)}
    assert got - debris == wanted, sorted(got ^ wanted)
    for number, controls in enumerate(seen):
        for rel, data in controls.items():
            assert (root / rel).read_bytes() == data, (number, rel)


# ------------------------------------------------------------------------------ agents, tsh


def test_an_agent_create_frozen_between_its_controls_and_its_entry_is_no_agent_yet(scratch):
    """A-3, R-5 (an agent is its entry ``agent/NAME`` plus ``agent/NAME.d/``): ``ctx agent
    create`` hangs after renaming the controls into place, before the entry.  Meanwhile
    ``ctx agent list`` does not list ``ci`` and ``ctx run --agent ci`` says there is no such
    agent (no half-made agent runs); a second create of ``ci`` waits on the ``agent/`` lock.
    Once the first is SIGKILLed the second finishes the marked commit and refuses with EEXIST
    (or creates ``ci``): either way there is one whole agent, one ``agent.created`` record, no
    hidden name, and its calls run."""
    root = bootstrapped(scratch / "st")
    with open(root / "tool" / "fs.stat.d" / "policy", "a") as policy:
        policy.write(f"allow {LABEL} tool:fs.stat execute\n")
    template = scratch / "template"
    copy_tree(root, template)
    request = json.dumps({"name": AGENT, "label": LABEL, "tools": ["fs.stat"]}).encode()
    args = ["agent", "create", "-"]
    steps = steps_of(root, args, scratch / "reference.trace", input=request)
    controls_in = pick(steps, "renameat2", f'"{AGENT}.d"')
    shutil.rmtree(root)
    copy_tree(template, root)
    agents = root / "agent"

    with frozen(root, args, controls_in, scratch / "frozen.trace", input=request):
        assert (agents / f"{AGENT}.d").is_dir() and not (agents / AGENT).exists()
        listed = ctx(root, "agent", "list", "--json")
        assert listed.rc == 0 and listed.json() == [], listed
        call = ctx(root, "run", "--agent", AGENT, "fs.stat", "/ctx")
        assert call.rc != 0 and "ENOENT" in call.err, call
        second = start(root, *args, input=request)
        assert wait_for(lambda: waiting_for_a_lock(second.pid) or second.poll() is not None)
        assert second.poll() is None, finished(second)
    done = finished(second)
    assert TRACEBACK not in done.err, done
    assert done.rc == 0 or (done.rc == 1 and "EEXIST" in done.err), done
    assert hidden(agents) == [], done
    listed = ctx(root, "agent", "list", "--json")
    assert [a["name"] for a in listed.json()] == [AGENT] and not listed.json()[0]["problems"]
    assert (agents / f"{AGENT}.d" / "log").read_text().count('"agent.created"') == 1
    call = ctx(root, "run", "--agent", AGENT, "fs.stat", "/ctx")
    assert call.rc == 0, call
    assert_nothing_to_do(root)


def test_a_tsh_config_update_frozen_before_its_rename_holds_the_next_which_keeps_its_own(scratch):
    """H-4, R-5 (docs/tools.md: ``tsh.config`` takes the tier's install lock while it updates
    ``tsh.d/config``): an update ``cache_capacity=64`` hangs with its new file written but not
    renamed.  Meanwhile ``ctx tool tsh.config`` reads the old settings whole, and another
    update ``window_percent=2`` waits.  Once the first is SIGKILLed (it never said it was
    done) the second completes: the file holds ``window_percent=2``, the administrator's
    comment, and no half of the lost update."""
    root = bootstrapped(scratch / "st")
    config = root / "tool" / "tsh.d" / "config"
    with config.open("a") as extra:
        extra.write("# the administrator's note\n")
    before = config.read_bytes()
    template = scratch / "template"
    copy_tree(root, template)
    args = ["tool", "tsh.config", "cache_capacity=64"]
    steps = steps_of(root, args, scratch / "reference.trace")
    written = pick(steps, "write", after=pick(steps, "openat", ".config."))
    shutil.rmtree(root)
    copy_tree(template, root)

    with frozen(root, args, written, scratch / "frozen.trace"):
        shown = ctx(root, "tool", "tsh.config")
        assert shown.rc == 0 and "cache_capacity=32" in shown.out, shown
        assert config.read_bytes() == before
        second = start(root, "tool", "tsh.config", "window_percent=2")
        assert wait_for(lambda: waiting_for_a_lock(second.pid) or second.poll() is not None)
        assert second.poll() is None, finished(second)
    done = finished(second)
    assert done.rc == 0 and TRACEBACK not in done.err, done
    text = config.read_text()
    assert "window_percent=2" in text and "# the administrator's note" in text, text
    assert "cache_capacity=32" in text and "cache_capacity=64" not in text, text
    assert "max_loaded_tools=64" in text, text


# ------------------------------------------------------------------------------ spaces, queues


def space_steps(steps: list[Step]) -> list[Step]:
    """A sample of the moments a space or queue is being made: before its first directory,
    between a directory and its mode, before the config's temp file is renamed."""
    made = [s for s in steps if s.call == "mkdirat" and "= 0" in s.text]
    fixes = [s for s in steps if s.call in ("fchown", "fchmod")]
    return [made[0], fixes[len(fixes) // 2], pick(steps, "renameat2", '"config"')]


@pytest.mark.parametrize(
    "args",
    [["queue", "init", "--project", "proj"], ["shared", "create", "proj"]],
    ids=["queue-init", "shared-create"],
)
def test_a_new_space_killed_as_it_is_made_is_never_taken_for_a_whole_one(args, scratch):
    """X-1, §2.4, Q-1 (docs/queue.md: neither ``init`` nor ``ctx shared create`` calls a queue
    ready when the other queue commands refuse it): ``ctx queue init --project proj`` (or
    ``ctx shared create proj``) killed at sampled moments while it makes the new space leaves
    a space that ``ctx queue status`` either refuses, naming ``ctx queue init``, or finds
    complete with its six state directories; a publish into it is likewise refused or lands
    in a whole queue.  The same command run again completes it, a job published before it
    stays pending, and ``ctx queue status`` then counts it."""
    root = bootstrapped(scratch / "st")
    template = scratch / "template"
    copy_tree(root, template)
    steps = steps_of(root, args, scratch / "reference.trace")
    queue = root / "shared" / "proj" / "queue"
    request = json.dumps({"tool": "fs.stat", "input": {"path": "/ctx"}})

    for step in space_steps(steps):
        where = str(step)
        shutil.rmtree(root)
        copy_tree(template, root)
        killed_at(root, args, step, scratch / "killed.trace")
        status = ctx(root, "queue", "status", "--project", "proj", "--json")
        assert TRACEBACK not in status.err, (where, status)
        whole = queue.is_dir() and set(os.listdir(queue)) >= QUEUE_SUBDIRS
        if status.rc == 0:
            assert whole, (where, status)
        else:
            assert status.rc == 1 and "ctx queue init" in status.err, (where, status)
        published = ctx(root, "queue", "publish", "--project", "proj", "--name", "j1", "-",
                        input=request)  # fmt: skip
        if published.rc == 0:
            assert whole and (queue / "pending" / "j1.req.json").is_file(), (where, published)
        else:
            assert published.rc == 1 and "ctx queue init" in published.err, (where, published)
        again = ctx(root, *args)
        assert again.rc == 0 and TRACEBACK not in again.err, (where, again)
        assert set(os.listdir(queue)) >= QUEUE_SUBDIRS and (queue / "config").is_file(), where
        counts = ctx(root, "queue", "status", "--project", "proj", "--json")
        assert counts.rc == 0, (where, counts)
        assert counts.json()["pending"] == (1 if published.rc == 0 else 0), (where, counts)


SPACE_MODES = {
    "": 0o3770,
    "tool": 0o2750,
    "data": 0o2770,
    "agent": 0o3770,
    "queue": 0o3770,
    **{f"queue/{d}": 0o2770 for d in sorted(QUEUE_SUBDIRS)},
}


def test_a_queue_init_killed_between_a_mkdir_and_its_mode_gives_the_mode_when_run_again(scratch):
    """X-1, §2.4, R-5: ``ctx queue init --project proj`` makes each directory of the new space
    (under umask 022, with the mode 0750 the umask leaves) and then gives it its mode.  Killed
    between the two for ``queue/failed``, it leaves ``failed/`` 2750: no member of the group
    could finish a job as failed.  The same command run again must complete the space, every
    directory with its mode (``ctx shared create --help``: 2770 for the queue's six), or at
    least say what is wrong and how to repair it; ``ctx queue status`` must not call the
    queue fine."""
    root = bootstrapped(scratch / "st")
    template = scratch / "template"
    copy_tree(root, template)
    args = ["queue", "init", "--project", "proj"]
    steps = steps_of(root, args, scratch / "reference.trace")
    mode_of_failed = pick(steps, "fchown", after=pick(steps, "mkdirat", '"failed"'))
    shutil.rmtree(root)
    copy_tree(template, root)
    killed_at(root, args, mode_of_failed, scratch / "killed.trace")
    space = root / "shared" / "proj"
    assert stat.S_IMODE((space / "queue" / "failed").stat().st_mode) != 0o2770

    again = ctx(root, *args)
    assert again.rc == 0, again
    wrong = {
        rel: oct(stat.S_IMODE((space / rel).stat().st_mode))
        for rel, mode in SPACE_MODES.items()
        if stat.S_IMODE((space / rel).stat().st_mode) != mode
    }
    said = again.out + again.err
    assert not wrong or ("failed" in said and "ctx shared create" in said), (wrong, again)


def test_a_queue_init_killed_before_its_config_rename_leaves_no_temp_once_settled(scratch):
    """§2.4, R-5, Q-6: ``ctx queue init`` writes the default ``queue/config`` as a temp file
    renamed into place (cortexfs/queue/layout.py says none of its temps may outlive it,
    "where nothing would ever look for it").  SIGKILLed just before the rename, it leaves
    ``queue/.config.TOKEN.tmp``.  Once the same command has run again and ``ctx queue recover
    --reconcile`` and ``ctx bootstrap`` have run (an hour later), the temp is gone, or at
    least one of them (or ``ctx queue status``) named it."""
    root = bootstrapped(scratch / "st")
    template = scratch / "template"
    copy_tree(root, template)
    args = ["queue", "init", "--project", "proj"]
    steps = steps_of(root, args, scratch / "reference.trace")
    rename = pick(steps, "renameat2", '"config"')
    shutil.rmtree(root)
    copy_tree(template, root)
    killed_at(root, args, rename, scratch / "killed.trace")
    queue = root / "shared" / "proj" / "queue"
    (temp,) = [n for n in os.listdir(queue) if n.startswith(".config.")]
    an_hour_ago = (queue / temp).stat().st_mtime - 3600
    os.utime(queue / temp, (an_hour_ago, an_hour_ago))

    said = []
    for command in (
        args,
        ["queue", "status", "--project", "proj"],
        ["queue", "recover", "--project", "proj", "--reconcile", "--grace", "0"],
        ["bootstrap"],
    ):
        run = ctx(root, *command)
        assert run.rc == 0 and TRACEBACK not in run.err, run
        said.append(run.out + run.err)
    assert (queue / "config").is_file()
    assert not (queue / temp).exists() or any(temp in text for text in said), said


# ------------------------------------------------------------------------------ a user


def test_a_users_install_into_their_tier_killed_mid_commit_is_finished_by_their_next(
    scratch, unprivileged_user
):
    """T-8, T-8a, R-5 as an ordinary user: uid ``ctxtest`` reinstalls ``demo`` into its own
    tier ``home/<uid>/tool`` and the install is SIGKILLed between swapping in the new controls
    and renaming the new executable.  The user's listing shows ``demo`` whole (or a commit
    under way, naming ``ctx bootstrap``), never damaged; the user's same install run again
    finishes the work, leaves no hidden name and shows version two available, the user's
    note in the control directory kept."""
    user = unprivileged_user
    root = bootstrapped(scratch / "st")
    home = root / "home" / str(user.uid)
    home.mkdir(mode=0o755)
    os.chown(home, user.uid, user.gid)
    manifests = {
        word: tool_manifest(
            scratch / word, "demo", f"#!/bin/sh\necho {word}\n", description=f"version {word}"
        )
        for word in ("one", "two")
    }
    for path in scratch.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    first = _run([*CTX_ARGV, "object", "install", str(manifests["one"]), "--tier", "user"],
                 root, b"", user)  # fmt: skip
    assert first.rc == 0, first
    tier = home / "tool"
    note = tier / "demo.d" / "my-note"
    note.write_text("mine\n")
    os.chown(note, user.uid, user.gid)
    template = scratch / "template"
    copy_tree(root, template)
    args = ["object", "install", str(manifests["two"]), "--tier", "user"]
    trace = scratch / "traces"
    trace.mkdir(mode=0o777)
    trace.chmod(0o777)
    steps = steps_of(root, args, trace / "reference", user=user)
    exe = pick(steps, "renameat", '"demo"')
    shutil.rmtree(root)
    copy_tree(template, root)

    killed_at(root, args, exe, trace / "killed", user=user)
    listing = _run([*CTX_ARGV, "object", "list", "--tier", "user", "--json"], root, b"", user)
    assert listing.rc == 0, listing
    (demo,) = [o for o in json.loads(listing.out) if o["name"] == "demo"]
    assert not demo["problems"], demo
    assert demo["status"] == "available" or "ctx bootstrap" in demo["reason"], demo
    assert (tier / "demo.d" / "name").read_text() == "demo\n"

    again = _run([*CTX_ARGV, *args], root, b"", user)
    assert again.rc == 0 and TRACEBACK not in again.err, again
    assert hidden(tier) == [], os.listdir(tier)
    listing = _run([*CTX_ARGV, "object", "list", "--tier", "user", "--json"], root, b"", user)
    (demo,) = [o for o in json.loads(listing.out) if o["name"] == "demo"]
    assert (demo["status"], demo["description"]) == ("available", "version two"), demo
    assert (tier / "demo").read_text() == "#!/bin/sh\necho two\n"
    assert note.read_text() == "mine\n"
