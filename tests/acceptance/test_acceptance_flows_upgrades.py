"""Objects replaced while they are in use, as an administrator upgrading a live system does:
``ctx object install --tier system`` of new versions of a tool and ``ctx bootstrap`` (with and
without SOURCE) run again and again while agents call the tool with ``ctx run --native`` and a
``ctx queue work`` worker runs jobs of it (SPEC R-5, T-1, T-7, T-8, T-8a, D-1, §6)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    MAN_PAGES,
    REPO,
    QueueCLI,
    clean_env,
    ctx_run,
    request,
    tool_manifest,
    wait_for,
)
from tests.acceptance.workercli import AGENT, LABEL, make_agent, start_worker

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid: needs root")

TOOL = "up.probe"
SLOW = "up.slow"
PAD = ("#" * 1023 + "\n") * 1024  # 1 MiB of comment: each install copies a while


def manifest(top: Path, name: str, version: int, *, sleep: float = 0) -> Path:
    """A v2 manifest (T-8) of ``name`` whose program prints ``{"version": N}``."""
    directory = top / f"{name}-v{version}"
    program = (
        "#!/bin/sh\ncat >/dev/null\n"
        + (f"sleep {sleep}\n" if sleep else "")
        + f"echo '{{\"version\": {version}}}'\n"
        + PAD
    )
    path = tool_manifest(directory, name, program, description=f"{name} version {version}")
    (directory / f"{name}.sh").chmod(0o755)
    return path


@dataclass
class Live:
    storage: Path
    top: Path
    queue: QueueCLI
    calls: list[list[dict]] = field(default_factory=list)  # per caller, its result frames

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    def ctx(self, *args, **kw):
        kw.setdefault("env", self.env)
        return ctx_run(*args, **kw)

    def install(self, name: str, version: int, **kw) -> None:
        path = manifest(self.top, name, version, **kw)
        verb = "replaced" if (self.storage / "tool" / name).exists() else "installed"
        r = self.ctx("object", "install", path,
                     "--tier", "system")  # fmt: skip
        assert r.rc == 0 and r.out.startswith(f"{verb} {name} in tier system:"), r

    def native(self, tool: str, value: dict) -> tuple[int, dict]:
        """``ctx run --native``: its exit status and its ``result`` frame."""
        r = self.ctx("run", "--native", "--agent", AGENT, tool, input=json.dumps(value))
        frames = [json.loads(line) for line in r.lines()]
        results = [f for f in frames if f.get("type") == "result"]
        assert len(results) == 1, r
        return r.rc, results[0]

    def log_calls(self, tool: str) -> set[str]:
        text = (self.storage / "tool" / f"{tool}.d" / "log").read_text()
        return {json.loads(line).get("call") for line in text.splitlines() if line.strip()}

    @contextlib.contextmanager
    def callers(self, count: int = 2) -> Iterator[None]:
        """``count`` agents' sessions calling ``up.probe`` back to back until the block ends."""
        stop = threading.Event()

        def call(frames: list[dict]) -> None:
            while not stop.is_set():
                rc, result = self.native(TOOL, {})
                frames.append({"rc": rc, **result})

        threads = []
        for _ in range(count):
            frames: list[dict] = []
            self.calls.append(frames)
            threads.append(threading.Thread(target=call, args=(frames,), daemon=True))
        for thread in threads:
            thread.start()
        try:
            assert wait_for(lambda: all(self.calls), 60), "no call ended within 60 s"
            yield
        finally:
            stop.set()
            for thread in threads:
                thread.join(90)

    @contextlib.contextmanager
    def worker(self) -> Iterator[subprocess.Popen]:
        proc = start_worker(self.queue)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()

    def publish(self, count: int) -> list[str]:
        return [self.queue.publish(request(TOOL, n=n)) for n in range(count)]

    def finished(self, jobs: list[str]) -> bool:
        return all(self.queue.state(job) in ("done", "failed") for job in jobs)

    def job_result(self, job: str) -> dict:
        state = self.queue.state(job)
        return {
            "state": state,
            **json.loads((self.queue.dir / state / f"{job}.result").read_text()),
        }


@pytest.fixture
def live(searchable_storage: Path, tmp_path: Path) -> Live:
    """A bootstrapped root with ``up.probe`` version 1 installed and agent ``ci`` allowed it in
    both policy layers (P-6), and ``fs.read`` too."""
    world = Live(searchable_storage, tmp_path, QueueCLI(searchable_storage, "proj"))
    settled = world.ctx("bootstrap")  # the copied root's bin/ctxterm names the copy anew
    assert settled.rc == 0, settled
    world.install(TOOL, 1)
    world.install(SLOW, 1, sleep=3)
    make_agent(world.storage, [TOOL, SLOW, "fs.read"])
    for tool in (TOOL, SLOW, "fs.read"):
        with open(world.storage / "tool" / f"{tool}.d" / "policy", "a") as policy:
            policy.write(f"allow {LABEL} tool:{tool} execute\n")
    return world


def versions_seen(frames: list[dict]) -> list[int]:
    """The version each call ran; every call must have succeeded whole."""
    bad = [f for f in frames if f["rc"] != 0 or f.get("status") != "ok"]
    assert not bad, bad[:3]
    return [f["output"]["version"] for f in frames]


def test_reinstalls_under_live_calls_and_a_worker_run_one_whole_version_each(live):
    """T-8, T-8a, T-1, T-7: a tool reinstalled again and again while two agents call it and a
    worker runs jobs of it: every call runs one whole version (never a tool without its controls,
    ENOEXEC or EAGAIN), a caller never sees an older version after a newer one, ``which`` and
    ``list`` always show it available with one version's description, and its log keeps every
    call."""
    looks: list[tuple] = []
    stop_looking = threading.Event()

    def look() -> None:
        while not stop_looking.is_set():
            which = live.ctx("object", "which", TOOL)
            listed = live.ctx("object", "list", "--tier", "system", "--json")
            entry = [o for o in listed.json() if o["name"] == TOOL] if listed.rc == 0 else []
            looks.append((which.rc, which.out.strip(), listed.rc, entry))

    looker = threading.Thread(target=look, daemon=True)
    with live.worker() as worker, live.callers():
        jobs = live.publish(4)
        looker.start()
        try:
            for version in range(2, 6):
                live.install(TOOL, version)
                jobs += live.publish(2)
                listed = {o["name"]: o for o in live.ctx("object", "list", "--json").json()}
                assert listed[TOOL]["status"] == "available", listed[TOOL]
                assert listed[TOOL]["description"] == f"{TOOL} version {version}"
        finally:
            stop_looking.set()
            looker.join(90)
        assert wait_for(lambda: live.finished(jobs), 120), live.queue.entries("pending")
        assert worker.poll() is None, worker.communicate()

    for frames in live.calls:
        seen = versions_seen(frames)
        assert set(seen) <= {1, 2, 3, 4, 5}, seen
        assert seen == sorted(seen), seen  # T-8: each install is complete when it returns
    # the calls really overlapped the installs: some caller met more than one version
    assert any(len(set(versions_seen(frames))) > 1 for frames in live.calls), live.calls
    path = str(live.storage / "tool" / TOOL)
    assert looks, "nothing looked at the tool while it was reinstalled"
    for which_rc, which_out, list_rc, entry in looks:
        assert (which_rc, which_out) == (0, path)
        assert list_rc == 0 and len(entry) == 1, entry
        assert entry[0]["status"] == "available", entry
        assert entry[0]["description"] in {f"{TOOL} version {n}" for n in range(1, 6)}, entry
    results = [live.job_result(job) for job in jobs]
    assert all(r["state"] == "done" and r["status"] == "ok" for r in results), results
    assert {r["output"]["version"] for r in results} <= {1, 2, 3, 4, 5}, results
    logged = live.log_calls(TOOL)
    called = {f["call"] for frames in live.calls for f in frames}
    assert called <= logged, called - logged
    assert len(logged) >= len(called) + len(jobs)  # the worker's calls are logged too
    assert [n for n in os.listdir(live.storage / "tool") if n.startswith(".")] == [".install-lock"]


def snapshot_of(root: Path, skip: tuple[str, ...]) -> dict[str, tuple]:
    """Every entry below ``root`` with its type, mode, owner and bytes, but paths in ``skip``."""
    seen = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top) / name
            rel = str(path.relative_to(root))
            if rel.startswith(skip):
                continue
            st = path.lstat()
            data = path.read_bytes() if path.is_file() and not path.is_symlink() else b""
            seen[rel] = (st.st_mode, st.st_uid, st.st_gid, data)
    return seen


def test_bootstrap_rerun_under_live_calls_and_a_worker_changes_nothing(live):
    """R-5, T-7: ``ctx bootstrap`` run again while agents call a tool and a worker runs jobs
    has nothing to do: it succeeds each time, saying so, changes no file outside the logs and
    sessions the calls write, keeps the administrator's data, and fails no call or job."""
    data = live.storage / "shared" / "proj" / "data"
    data.mkdir(exist_ok=True)
    (data / "keep.csv").write_text("a,b\n1,2\n")
    (live.storage / "tool" / f"{TOOL}.d" / "notes").write_text("admin's note\n")
    busy = ("home", "shared/proj/queue", "shared/proj/agent", "tool/up.probe.d/log")
    before = snapshot_of(live.storage, busy)

    with live.worker() as worker, live.callers():
        jobs = live.publish(4)
        runs = [live.ctx("bootstrap") for _ in range(3)]
        jobs += live.publish(2)
        assert wait_for(lambda: live.finished(jobs), 120), live.queue.entries("pending")
        assert worker.poll() is None, worker.communicate()

    for r in runs:
        assert r.rc == 0 and "nothing to do" in r.out, r
        assert "repaired" not in r.out and "created" not in r.out, r
    after = snapshot_of(live.storage, busy)
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert not changed, sorted(changed)
    for frames in live.calls:
        assert set(versions_seen(frames)) == {1}
    assert all(live.job_result(job)["status"] == "ok" for job in jobs)
    assert {f["call"] for frames in live.calls for f in frames} <= live.log_calls(TOOL)


def slow_called(live: Live) -> bool:
    """Whether the agent's session records the call of ``up.slow`` (it then sleeps 3 s)."""
    events = live.storage.glob(f"home/*/agent/{AGENT}/session/default/events.jsonl")
    return any(
        '"type":"tool_call"' in line.replace(" ", "") and SLOW in line
        for path in events
        for line in path.read_text().splitlines()
    )


def test_bootstrap_repairs_a_hand_edited_page_and_a_damaged_core_control_during_a_call(live):
    """R-5, T-1, D-1: a manual page edited by hand and ``fs.read.d/schema`` broken by hand make
    the bundle stale and ``fs.read`` damaged (ENOEXEC at resolve, naming bootstrap); bootstrap,
    run while another call runs, names both repairs, keeps the tool's policy and log, lets the
    running call end well, and a second run has nothing to do."""
    page = live.storage / "shared" / "cortexfs-docs" / "man" / MAN_PAGES["tool"]
    page.chmod(0o644)
    with page.open("a") as f:
        f.write("\nmy own notes\n")
    schema = live.storage / "tool" / "fs.read.d" / "schema"
    schema.write_text("{not json")
    policy = (live.storage / "tool" / "fs.read.d" / "policy").read_bytes()
    target = {"path": "/ctx/tool/fs.read.d/name"}

    rc, damaged = live.native("fs.read", target)
    assert rc != 0 and damaged["status"] == "error", damaged
    assert damaged["error"]["error"] == "ENOEXEC", damaged
    assert damaged["error"]["stage"] == "resolve", damaged
    assert "bootstrap" in damaged["error"]["message"], damaged
    log_before = (live.storage / "tool" / "fs.read.d" / "log").read_bytes()

    (live.top / "empty.json").write_text("{}")
    with open(live.top / "empty.json") as empty:
        slow = subprocess.Popen(
            [*CTX_ARGV, "run", "--native", "--agent", AGENT, SLOW],
            env=live.env,
            stdin=empty,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        assert wait_for(lambda: slow_called(live), 60), "the slow call never started"
        repair = live.ctx("bootstrap")
        out, err = slow.communicate(timeout=60)
    finally:
        if slow.poll() is None:
            slow.kill()
            slow.communicate()

    assert repair.rc == 0, repair
    repaired = [line for line in repair.lines() if line.startswith("repaired")]
    assert any(f"shared/cortexfs-docs/man/{MAN_PAGES['tool']}" in line for line in repaired), repair
    assert any("fs.read" in line for line in repaired), repair
    assert slow.returncode == 0, err
    assert json.loads(out.splitlines()[-1])["output"] == {"version": 1}, out
    assert page.read_bytes() == (REPO / "docs" / "spec" / MAN_PAGES["tool"]).read_bytes()
    assert page.stat().st_mode & 0o7777 == 0o444
    assert live.ctx("man", "tool").out.rstrip("\n") == page.read_text().rstrip("\n")
    assert (live.storage / "tool" / "fs.read.d" / "policy").read_bytes() == policy
    assert (live.storage / "tool" / "fs.read.d" / "log").read_bytes().startswith(log_before)
    rc, fixed = live.native("fs.read", target)
    assert rc == 0 and fixed["status"] == "ok", fixed
    again = live.ctx("bootstrap")
    assert again.rc == 0 and "nothing to do" in again.out, again


def test_bootstrap_source_rebuilds_a_stale_bundle_while_it_is_read(live, tmp_path):
    """D-1, R-5: ``ctx bootstrap SOURCE`` with an administrator's tree (no pyproject.toml)
    installs its pages; ``ctx bootstrap SOURCE`` with this checkout then
    rebuilds that stale bundle to this version's pages (a removed page written again, each
    replaced in one rename) while ``ctx man`` reads it: a reader sees one page or the other whole;
    a SOURCE lacking a page is refused (EINVAL, exit 2) with nothing changed."""
    bundle = live.storage / "shared" / "cortexfs-docs"
    builtin = {p.name: p.read_bytes() for p in (REPO / "docs" / "spec").glob("*.md")}
    own = tmp_path / "own"
    shutil.copytree(REPO / "docs" / "spec", own / "docs" / "spec")
    own_page = own / "docs" / "spec" / MAN_PAGES["tool"]
    own_page.write_text(own_page.read_text() + "\nSite note: ask ops before installing.\n")

    r = live.ctx("bootstrap", own)
    assert r.rc == 0 and f"man/{MAN_PAGES['tool']}" in r.out, r
    assert (bundle / "man" / MAN_PAGES["tool"]).read_bytes() == own_page.read_bytes()
    (bundle / "man" / MAN_PAGES["session"]).unlink()

    lacking = tmp_path / "lacking"
    shutil.copytree(own, lacking)
    (lacking / "docs" / "spec" / MAN_PAGES["agent"]).unlink()
    before = snapshot_of(bundle, ())
    refused = live.ctx("bootstrap", lacking)
    assert refused.rc == 2 and "EINVAL" in refused.err, refused
    assert snapshot_of(bundle, ()) == before

    pages = {builtin[MAN_PAGES["tool"]].decode(), own_page.read_text()}
    reads: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            reads.append(live.ctx("man", "tool").out)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        rebuilt = live.ctx("bootstrap", REPO)
        stop.wait(0.5)
    finally:
        stop.set()
        reader.join(60)
    assert rebuilt.rc == 0, rebuilt
    assert f"man/{MAN_PAGES['tool']}" in rebuilt.out and MAN_PAGES["session"] in rebuilt.out
    for text in reads:
        assert text.rstrip("\n") in {p.rstrip("\n") for p in pages}, text[-200:]
    for name in MAN_PAGES.values():
        assert (bundle / "man" / name).read_bytes() == builtin[name], name
        assert (bundle / "man" / name).stat().st_mode & 0o7777 == 0o444
    again = live.ctx("bootstrap", REPO)
    assert again.rc == 0 and "nothing to do" in again.out, again
