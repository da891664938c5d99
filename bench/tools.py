"""Tool runner benchmark: what a call through the whole chain costs over a direct exec.

Targets (issue "Tools as files, objects and manifests, CTX_PATH, agent identities, sessions
and events"): the runner on a trivial tool takes at most 2 x a direct exec of that tool, and
events are appended with fsync at 0.7 x the fsync floor of the disk or better.  Every ratio is
against a baseline measured in the same run, on the same filesystem:

* **direct exec** — the tool's own executable started with ``subprocess`` in the same
  environment and working directory, with its JSON input on stdin: what a call costs without
  CortexFS.  It is started the cheapest way a caller can (vfork), and so under this process's
  uid rather than the agent's: switching credentials makes Python fork, copying the page
  tables of this whole process (some 2 ms here, more than the trivial tool takes) and leaving
  its memory copy-on-write for whatever runs next — a cost of the bench, not of a call;
* **run_native** — :func:`cortexfs.tools.runner.run_native` in process (what a queue worker
  does): resolution, controls, schema, the six-step chain, hooks, the process, and two durable
  records (the session's ``tool_result`` and the tool's log);
* **ctx run --native** — the command line, which adds an interpreter start and its imports;
* **interpreter floor** — the console script's interpreter starting and exiting
  (``python -c pass`` with its site-packages): what any Python command line costs before it
  does anything, so ``floor + direct exec`` over ``direct exec`` bounds what ``ctx run`` could
  reach;
* **authority chain** — :func:`cortexfs.policy.check_tool_execute` alone, per call;
* **fsync floor** — ``write`` + ``fsync`` of one event-sized line on an ``O_APPEND`` file,
  against :meth:`cortexfs.shared.events.EventLog.append` with ``durable_event=True``.

Two trivial tools: ``sh.cat`` (``#!/bin/sh`` + ``cat``) and the core ``fs.stat`` (Python).
Figures are medians; a figure and its baseline are sampled in turns, so that both see the same
load on a shared machine.  The agent runs as ``--uid`` (default: nobody), so run this as root.

``--baseline DIR`` also times ``ctx run --native`` with the ``cortexfs`` package of ``DIR``
instead of this checkout's (the same console script and interpreter, ``PYTHONPATH=DIR``), in
turns with the rest: a before-and-after comparison of a change in one run, say with
``git archive <commit> cortexfs | tar -x -C DIR``.

Usage: python bench/tools.py [--calls N] [--cli-calls N] [--events N] [--dir DIR]
                             [--baseline DIR] [--json]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cortexfs.tools.core.bootstrap  # noqa: F401  (registers the core tools' bootstrap step)
from cortexfs import storage
from cortexfs.agents.create import create_agent
from cortexfs.agents.request import parse_request
from cortexfs.agents.view import AgentView
from cortexfs.policy import Credentials, Identity, check_tool_execute
from cortexfs.shared.events import EventLog, encode_event, make_event
from cortexfs.tools.install import install_tool, parse_tier
from cortexfs.tools.manifest import parse_manifest
from cortexfs.tools.runner import run_native

RUNNER_TARGET = 2.0
EVENTS_TARGET = 0.7
TRIVIAL_SHELL_TOOL = "#!/bin/sh\ncat\n"


def median_seconds(run: Callable[[], object], count: int) -> float:
    return interleaved_medians([run], count)[0]


def interleaved_medians(runs: list[Callable[[], object]], count: int) -> list[float]:
    """The median time of each function, the functions taking turns so that they share
    whatever else the machine is doing at the time."""
    timings: list[list[float]] = [[] for _ in runs]
    for _ in range(count):
        for run, samples in zip(runs, timings, strict=True):
            started = time.perf_counter()
            run()
            samples.append(time.perf_counter() - started)
    return [statistics.median(samples) for samples in timings]


def build(workdir: Path, uid: int, gid: int) -> tuple[Path, Path]:
    """A bootstrapped root, tool ``sh.cat``, and agent ``bench`` allowed to run both tools."""
    root = workdir / "storage"
    storage.bootstrap(root)
    for entry in (workdir, root, *root.iterdir()):
        entry.chmod(0o755)
    program = workdir / "sh.cat"
    program.write_text(TRIVIAL_SHELL_TOOL)
    document = {
        "manifest": 2,
        "kind": "tool",
        "name": "sh.cat",
        "description": "Echoes its input.",
        "schema": {"type": "object"},
        "cap": {"side_effects": False, "network": False},
        "exec": str(program),
    }
    manifest = parse_manifest(document, source=workdir / "sh.cat.json")
    install_tool(parse_tier(root, "system"), manifest, program.read_bytes())
    workspace = workdir / "work"
    workspace.mkdir()
    os.chown(workspace, uid, gid)
    request = {
        "name": "bench",
        "label": "bench_t",
        "tools": ["sh.cat", "fs.stat"],
        "mount": [[str(workspace), "/workspace", "rw"]],
    }
    create_agent(root, parse_request(request, "bench", root), Identity(uid, gid))
    for tool in ("sh.cat", "fs.stat"):
        with open(root / "tool" / f"{tool}.d" / "policy", "a") as policy:
            policy.write(f"allow bench_t tool:{tool} execute\n")
    return root, workspace


def direct_exec(root: Path, tool: str, payload: bytes, view: AgentView) -> Callable[[], object]:
    env = view.tool_environment(tool=tool, session="default", call="direct", mode="native")
    _, cwd = view.working_directory()

    def run() -> object:
        completed = subprocess.run(  # no credentials to switch: started with vfork
            [str(root / "tool" / tool)],
            input=payload,
            capture_output=True,
            env=env,
            cwd=cwd,
            start_new_session=True,
            check=True,
        )
        return completed.stdout

    return run


def measure_tool(
    root: Path,
    tool: str,
    request: dict[str, Any],
    calls: int,
    cli_calls: int,
    baseline: dict[str, str] | None = None,
) -> dict[str, float]:
    """The figures of ``tool``; ``baseline`` is the environment of the other package's
    ``ctx run``, when one is compared."""
    view = AgentView.load(root, "bench")
    payload = json.dumps(request).encode() + b"\n"

    def library() -> object:
        result = run_native(root, "bench", tool, request)
        assert result.ok, result.error
        return result

    ctx = str(Path(sys.executable).with_name("ctx"))  # the console script users run
    command = [ctx, "run", "--storage", str(root), "--agent", "bench", "--native", tool]

    def command_line() -> object:
        return subprocess.run(command, input=payload, capture_output=True, check=True)

    def baseline_command_line() -> object:
        return subprocess.run(command, input=payload, capture_output=True, check=True, env=baseline)

    def interpreter_floor() -> object:
        return subprocess.run([sys.executable, "-c", "pass"], capture_output=True, check=True)

    direct_call = direct_exec(root, tool, payload, view)
    direct_call()  # warm the page cache for both sides
    library()
    direct, runner = interleaved_medians([direct_call, library], calls)
    command_lines = [command_line] if baseline is None else [command_line, baseline_command_line]
    direct_again, floor, through_cli, *through_baseline = interleaved_medians(
        [direct_call, interpreter_floor, *command_lines], cli_calls
    )
    compared = {}
    if through_baseline:
        compared = {
            "baseline_ctx_run_native_ms": through_baseline[0] * 1000,
            "baseline_ctx_run_native_ratio": through_baseline[0] / direct_again,
            "baseline_ctx_run_native_overhead_ms": (through_baseline[0] - direct_again) * 1000,
        }
    return {
        "direct_exec_ms": direct * 1000,
        "run_native_ms": runner * 1000,
        "run_native_overhead_ms": (runner - direct) * 1000,
        "run_native_ratio": runner / direct,
        "ctx_run_native_ms": through_cli * 1000,
        "ctx_run_native_ratio": through_cli / direct_again,
        "ctx_run_native_overhead_ms": (through_cli - direct_again) * 1000,
        "interpreter_floor_ms": floor * 1000,
        "best_possible_cli_ratio": (floor + direct_again) / direct_again,
        **compared,
    }


def baseline_environment(package_root: Path) -> dict[str, str]:
    """The environment in which the console script imports ``cortexfs`` from
    ``package_root``, whose bytecode is compiled first (as scripts/install does for this
    checkout), so that neither side compiles its modules at every start."""
    package = package_root.resolve() / "cortexfs"
    if not (package / "__init__.py").is_file():
        raise SystemExit(f"--baseline {package_root}: no cortexfs package in it")
    compileall.compile_dir(package, quiet=1, force=False)
    search = os.pathsep.join(filter(None, [str(package.parent), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": search}
    where = subprocess.run(
        [sys.executable, "-c", "import cortexfs; print(cortexfs.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        check=True,
    )
    if Path(where.stdout.strip()).parent != package:
        raise SystemExit(f"--baseline {package_root}: ctx would import {where.stdout.strip()}")
    return env


def measure_chain(root: Path, uid: int, gid: int, calls: int) -> float:
    caller = Credentials(uid, gid)

    def decide() -> object:
        decision = check_tool_execute(root, "bench", "sh.cat", caller)
        assert decision.allowed, decision.reason
        return decision

    return median_seconds(decide, calls)


def measure_events(directory: Path, count: int, batch: int = 100) -> dict[str, float]:
    """Durable appends against the raw floor, in alternating batches (they share the load)."""
    line = encode_event(
        make_event(
            "tool_result",
            agent="bench",
            session="default",
            object="tool/sh.cat",
            status="ok",
            call="0123456789abcdef",
            exit_status=0,
            duration_ms=12.5,
        )
    )
    event = json.loads(line)
    floor_fd = os.open(directory / "floor.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    floor_seconds = events_seconds = 0.0
    with EventLog(directory / "events.jsonl") as log:
        for _ in range(max(1, count // batch)):
            started = time.perf_counter()
            for _ in range(batch):
                os.write(floor_fd, line)
                os.fsync(floor_fd)
            floor_seconds += time.perf_counter() - started
            started = time.perf_counter()
            for _ in range(batch):
                log.append(event, durable_event=True)
            events_seconds += time.perf_counter() - started
    os.close(floor_fd)
    appended = max(1, count // batch) * batch
    floor, durable_rate = appended / floor_seconds, appended / events_seconds
    return {
        "fsync_floor_per_s": floor,
        "durable_events_per_s": durable_rate,
        "ratio": durable_rate / floor,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100, help="calls per in-process figure")
    parser.add_argument("--cli-calls", type=int, default=30, help="calls through ctx run")
    parser.add_argument("--events", type=int, default=2000, help="durable events to append")
    parser.add_argument("--uid", type=int, default=pwd.getpwnam("nobody").pw_uid)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument(
        "--baseline",
        type=Path,
        help="also time ctx run with the cortexfs package in this directory (another commit's)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    options = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("run as root: the tools run under the agent's uid (--uid)")
    gid = pwd.getpwuid(options.uid).pw_gid
    if not options.json:  # the JSON output is one object, for programs to read
        print("command:", " ".join([sys.executable, *sys.argv]), flush=True)
    baseline = None if options.baseline is None else baseline_environment(options.baseline)
    workdir = Path(tempfile.mkdtemp(prefix="cortexfs-bench-", dir=options.dir))
    try:
        root, workspace = build(workdir, options.uid, gid)
        counts = (options.calls, options.cli_calls, baseline)
        figures = {
            "sh.cat": measure_tool(root, "sh.cat", {"n": 1}, *counts),
            "fs.stat": measure_tool(root, "fs.stat", {"path": "/workspace"}, *counts),
            "chain_us": measure_chain(root, options.uid, gid, options.calls * 10) * 1e6,
            "events": measure_events(workspace, options.events),
        }
    finally:
        shutil.rmtree(workdir)
    if options.json:
        print(json.dumps(figures, indent=2))
        return 0
    for tool in ("sh.cat", "fs.stat"):
        row = figures[tool]
        verdict = "meets" if row["run_native_ratio"] <= RUNNER_TARGET else "misses"
        print(
            f"{tool:8} direct exec {row['direct_exec_ms']:7.2f} ms | run_native "
            f"{row['run_native_ms']:7.2f} ms (+{row['run_native_overhead_ms']:.2f} ms) = "
            f"{row['run_native_ratio']:.2f} x ({verdict} <= {RUNNER_TARGET:g} x) | "
            f"ctx run --native {row['ctx_run_native_ms']:7.2f} ms = "
            f"{row['ctx_run_native_ratio']:.2f} x"
        )
        print(
            f"{'':8} a Python start alone: {row['interpreter_floor_ms']:.2f} ms, so no Python "
            f"command line can do better than {row['best_possible_cli_ratio']:.2f} x; "
            f"ctx run adds {row['ctx_run_native_overhead_ms']:.2f} ms"
        )
        if "baseline_ctx_run_native_ms" in row:
            print(
                f"{'':8} ctx run --native with the baseline's package: "
                f"{row['baseline_ctx_run_native_ms']:.2f} ms = "
                f"{row['baseline_ctx_run_native_ratio']:.2f} x (adds "
                f"{row['baseline_ctx_run_native_overhead_ms']:.2f} ms)"
            )
    print(f"authority chain (check_tool_execute): {figures['chain_us']:.0f} us per call")
    events = figures["events"]
    verdict = "meets" if events["ratio"] >= EVENTS_TARGET else "misses"
    print(
        f"durable events: {events['durable_events_per_s']:.0f}/s vs fsync floor "
        f"{events['fsync_floor_per_s']:.0f}/s = {events['ratio']:.2f} x ({verdict} "
        f">= {EVENTS_TARGET:g} x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
