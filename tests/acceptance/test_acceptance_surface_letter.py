"""The letter of SPEC §3 (workers), §7 (tsh, ``tool/tsh.d/config``, ``ctx tool``), §9 (shared
spaces), §12 (the manual bundle) and §13 (``ctx mount``) where the other acceptance files do
not look: the command lines' usage errors and exit statuses (§2.4), ``--json`` output, what
``--drain``, ``--max-jobs`` and ``--concurrency`` promise together, the lease a worker writes
(Q-3), the config's defaults and bad settings, the names ``ctx tool`` takes, the exact shape
of a space's queue and of the manual bundle, and what a mount refuses at the root (R-2)."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import stat
import subprocess
import time
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from tests.acceptance.ctxcli import (
    MAN_PAGES,
    MOUNT_WAIT,
    QUEUE_SUBDIRS,
    REPO,
    ROOT_ENTRIES,
    clean_env,
    ctx_mount,
    ctx_run,
    find_values,
    mounted_at,
    needs_fuse_as_root,
    request,
    snapshot,
    wait_for,
)
from tests.acceptance.workercli import (
    AGENT,
    LABEL,
    allow_in_tool_policy,
    result_of,
    running_worker,
    shell_job,
)
from tests.acceptance.workercli import make_agent as make_agent_in_policy
from tests.acceptance.workercli import storage as storage
from tests.support.users import UnprivilegedUser, access_as
from tests.support.users import unprivileged_user as unprivileged_user

H4_DEFAULTS = {"max_loaded_tools": "64", "cache_capacity": "32", "window_percent": "1"}

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid")


def env_for(storage: Path, **extra: str) -> dict[str, str]:
    return clean_env(CTX_STORAGE=str(storage), **extra)


# ====================================================================== §3 workers: helpers


def make_agent(storage: Path, tools: list[str]) -> None:
    """``ctx agent create`` (A-3) whose policy grants ``tools``; the tool layer of P-6 too."""
    make_agent_in_policy(storage, tools)
    for tool in tools:
        allow_in_tool_policy(storage, tool)


@pytest.fixture
def agent(storage: Path) -> str:
    make_agent(storage, ["shell.exec"])
    return AGENT


def as_epoch(value) -> float:
    """A timestamp of the lease, as a number or an RFC 3339 text (SPEC fixes neither)."""
    if isinstance(value, (int, float)):
        return float(value)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


# ====================================================================== §2.4 / W-2: ctx queue work


def test_24_work_usage_errors_exit_2_and_claim_nothing(queue):
    """§2.4: "Exit status ... 2 usage error" for ``ctx queue work``; a worker that refuses its
    command line claims nothing."""
    job = queue.publish(shell_job("true"))
    for bad in (["--max-jobs", "0"], ["--max-jobs", "many"], ["--concurrency", "0"],
                ["--concurrency", "-1"], ["--timeout", "0"], ["--ttl", "0"],
                ["--no-such-option"]):  # fmt: skip
        r = queue.run("work", "--agent", AGENT, "--drain", *bad)
        assert r.rc == 2, r
        assert queue.state(job) == "pending"
    # No queue named at all: neither --project, nor a queue path, nor CTX_PROJECT.
    r = ctx_run("queue", "work", "--agent", AGENT, "--drain", env=env_for(queue.storage))
    assert r.rc == 2, r
    assert queue.state(job) == "pending"


def test_w1_a_worker_for_an_agent_that_does_not_exist_claims_nothing(queue):
    """W-1: jobs run "under the worker's agent identity"; P-4: a missing object is ``ENOENT``
    (or ``EACCES``): with no such agent there is no identity, the worker is refused and the
    job stays pending, for a worker that has one."""
    job = queue.publish(shell_job("true"))
    r = queue.run("work", "--agent", "nosuch", "--drain")
    assert r.rc == 1, r
    assert "ENOENT" in r.err or "EACCES" in r.err, r
    assert queue.state(job) == "pending"
    assert queue.entries("claimed") == queue.entries("lease") == set()


@needs_root
def test_w3_concurrency_n_runs_n_jobs_at_once_and_never_more(queue, agent, outbox):
    """§2.4 ``--concurrency N``: N jobs at once, so with four short jobs two run side by
    side, and never a third (W-3: each still exactly once)."""
    for n in range(4):
        cmd = (
            f"date +%s.%N > {outbox}/start{n}; sleep 0.7; date +%s.%N > {outbox}/end{n}; "
            f"echo {n} >> {outbox}/runs"
        )
        queue.publish(shell_job(cmd), name=f"c{n}")
    r = queue.run("work", "--agent", AGENT, "--drain", "--concurrency", "2", timeout=60)
    assert r.rc == 0, r
    spans = [
        (float((outbox / f"start{n}").read_text()), float((outbox / f"end{n}").read_text()))
        for n in range(4)
    ]
    most = max(sum(1 for s, e in spans if s <= moment < e) for moment, _ in spans)
    assert most == 2, spans
    assert sorted((outbox / "runs").read_text().split()) == ["0", "1", "2", "3"]


@needs_root
def test_w2_drain_and_max_jobs_stop_at_whichever_comes_first(queue, agent):
    """W-2: ``--drain`` "processes until the queue is empty and exits"; §2.4 ``--max-jobs N``
    bounds the jobs taken: together, the worker stops at the first of the two."""
    jobs = [queue.publish(shell_job(f"echo {n}"), name=f"m{n}") for n in range(3)]
    r = queue.run("work", "--agent", AGENT, "--drain", "--max-jobs", "1")
    assert r.rc == 0, r
    assert sorted(queue.state(j) for j in jobs) == ["done", "pending", "pending"]
    r = queue.run("work", "--agent", AGENT, "--drain", "--max-jobs", "50", timeout=30)
    assert r.rc == 0, r
    assert [queue.state(j) for j in jobs] == ["done"] * 3


@needs_root
def test_w2_max_jobs_bounds_the_claims_of_every_slot_together(queue, agent, outbox):
    """§2.4 ``--max-jobs N`` with ``--concurrency M``: N jobs in all, whatever the number of
    slots claiming side by side; the others stay pending, untouched."""
    jobs = [queue.publish(shell_job(f"echo {n} >> {outbox}/runs"), name=f"k{n}") for n in range(6)]
    r = queue.run("work", "--agent", AGENT, "--max-jobs", "3", "--concurrency", "4", timeout=60)
    assert r.rc == 0, r
    assert sorted(queue.state(j) for j in jobs) == ["done"] * 3 + ["pending"] * 3
    assert len((outbox / "runs").read_text().split()) == 3


def waiting_job(outbox: Path, name: str) -> dict:
    """A job that says it started, then waits (at most 20 s) for ``outbox/go-<name>``."""
    return shell_job(
        f"touch {outbox}/started-{name}; i=0; "
        f"while [ ! -e {outbox}/go-{name} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done"
    )


@needs_root
def test_w2_drain_takes_what_is_published_while_it_runs(queue, agent, outbox):
    """W-2: ``--drain`` "processes until the queue is empty and exits": a job published while
    the worker is busy is work still in the queue, taken before it exits."""
    first = queue.publish(waiting_job(outbox, "a"), name="a")
    with running_worker(queue, "--drain") as proc:
        assert wait_for(lambda: (outbox / "started-a").exists(), 20)
        second = queue.publish(shell_job("echo late"), name="b")
        (outbox / "go-a").touch()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert [queue.state(first), queue.state(second)] == ["done", "done"]


@needs_root
def test_w4_a_first_interrupt_lets_the_running_job_finish(queue, agent, outbox):
    """W-4: a worker asked to stop "lets the running job finish ..., then exits cleanly";
    ``ctx queue work --help`` gives ^C (SIGINT, once) the meaning of SIGTERM."""
    running = queue.publish(waiting_job(outbox, "a"), name="a")
    waiting = queue.publish(shell_job("echo never"), name="b")
    with running_worker(queue) as proc:
        assert wait_for(lambda: (outbox / "started-a").exists(), 20)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        (outbox / "go-a").touch()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert queue.state(running) == "done"
    assert queue.state(waiting) == "pending"
    assert "Traceback" not in err


@needs_root
def test_24_work_json_is_machine_readable_and_names_each_job(queue, agent):
    """§2.4: "``--json`` gives machine-readable output on stdout": every line the worker
    prints is JSON, and what it did with each job is in it."""
    jobs = [queue.publish(shell_job(f"echo {n}"), name=f"j{n}") for n in range(2)]
    r = queue.run("work", "--agent", AGENT, "--drain", "--json")
    assert r.rc == 0, r
    objects = [json.loads(line) for line in r.lines() if line.strip()]
    assert objects and all(isinstance(o, dict) for o in objects), r
    for job in jobs:
        assert any(job in json.dumps(o) for o in objects), (job, objects)


@needs_root
def test_24_work_on_a_queue_that_does_not_exist_fails_and_makes_nothing(storage, agent):
    """§2.4: a worker of a project that has no queue is refused (exit 1 or 2, with the errno
    word), and it creates nothing: a queue is made by ``ctx queue init`` (R-2: nothing else
    appears in the storage root)."""
    before = snapshot(storage / "shared")
    r = ctx_run("queue", "work", "--project", "nosuch", "--agent", AGENT, "--drain",
                env=env_for(storage))  # fmt: skip
    assert r.rc in (1, 2), r
    assert "ENOENT" in r.err, r
    assert snapshot(storage / "shared") == before
    assert set(os.listdir(storage)) == ROOT_ENTRIES


def test_r3_work_with_a_project_that_is_no_object_name_is_einval(storage):
    """R-3: a shared space's name is an object name; "Anything else is rejected with
    ``EINVAL``" — also by ``ctx queue work --project``."""
    for project in (".hidden", "space.d", "x" * 65, "sp ace"):
        r = ctx_run("queue", "work", "--project", project, "--agent", AGENT, "--drain",
                    env=env_for(storage))  # fmt: skip
        assert r.rc in (1, 2), r
        assert "EINVAL" in r.err, r


@needs_root
def test_24_work_takes_a_queue_path_and_the_storage_option(queue, agent):
    """§2.4: "All commands take ``--storage DIR`` (or ``CTX_STORAGE``) and ``--project NAME``
    (or a queue path)"."""
    job = queue.publish(shell_job("echo by-path"))
    r = ctx_run("queue", "work", "--queue", queue.dir, "--agent", AGENT, "--drain",
                env=env_for(queue.storage))  # fmt: skip
    assert r.rc == 0, r
    assert queue.state(job) == "done"
    second = queue.publish(shell_job("echo by-storage"))
    r = ctx_run("queue", "work", "--storage", queue.storage, "--project", queue.project,
                "--agent", AGENT, "--drain")  # fmt: skip
    assert r.rc == 0, r
    assert queue.state(second) == "done"


@needs_root
def test_q3_w1_the_lease_a_worker_takes_holds_every_field(queue, agent, outbox):
    """W-1 "takes the lease"; Q-3: ``lease/J/worker`` is one JSON object with the ``worker``
    id, ``host``, ``boot_id``, ``pid_ns``, ``pid``, the process start time, ``claimed_at`` and
    ``expires_at`` (``--ttl`` sets the latter); §2.1: the result's ``worker`` names it too."""
    job = queue.publish(
        shell_job(f"touch {outbox}/started; i=0; while [ ! -e {outbox}/go ] && [ $i -lt 400 ];"
                  f" do sleep 0.05; i=$((i+1)); done")
    )  # fmt: skip
    with running_worker(queue, "--drain", "--worker", "letter-worker-7", "--ttl", "30") as proc:
        assert wait_for(lambda: (outbox / "started").exists(), 20), proc.stderr
        lease = queue.lease(job)
        create_time = psutil.Process(proc.pid).create_time()
        (outbox / "go").touch()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert lease["worker"] == "letter-worker-7", lease
    assert lease["host"] == socket.gethostname(), lease
    assert lease["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert int(lease["pid_ns"]) == os.stat("/proc/self/ns/pid").st_ino, lease
    assert lease["pid"] == proc.pid, lease
    starts = [v for k, v in lease.items() if k not in ("pid", "pid_ns", "claimed_at", "expires_at")
              and isinstance(v, (int, float)) and abs(v - create_time) < 1.0]  # fmt: skip
    assert starts, f"no start time of pid {proc.pid} ({create_time}) in {lease}"
    ttl = as_epoch(lease["expires_at"]) - as_epoch(lease["claimed_at"])
    assert 25 <= ttl <= 31, lease
    assert "letter-worker-7" in json.dumps(result_of(queue, job)["worker"])


@needs_root
def test_w1_a_denial_records_the_step_that_denied(storage, queue, outbox):
    """W-1: authorization denied fails the job, "recording the reason in the result"; P-5:
    "the decision records which step denied" — here step 6, the tool's own policy (P-6)."""
    req = {"name": AGENT, "label": LABEL, "tools": ["shell.exec"]}
    made = ctx_run("agent", "create", "--storage", storage, "-", input=json.dumps(req))
    assert made.rc == 0, made
    job = queue.publish(shell_job(f"touch {outbox}/ran"))
    assert queue.run("work", "--agent", AGENT, "--drain").rc == 0
    assert queue.state(job) == "failed"
    res = result_of(queue, job)
    assert "EACCES" in json.dumps(res)
    assert 6 in find_values(res, "step") or "step 6" in json.dumps(res), res
    assert not (outbox / "ran").exists()


@needs_root
def test_w1_input_that_fails_the_tools_schema_fails_the_job(queue, agent, outbox):
    """W-1: the request's input goes "through the normal tool authorization chain (§6)", where
    T-1's ``schema`` is the tool's input schema: a job whose input fails it is finished in
    ``failed/`` with the reason, and the tool never runs."""
    req = request("shell.exec")
    req["input"] = {"command": f"touch {outbox}/ran"}
    job = queue.publish(req)
    assert queue.run("work", "--agent", AGENT, "--drain").rc == 0
    assert queue.state(job) == "failed"
    res = result_of(queue, job)
    assert res["status"] == "error"
    assert "EINVAL" in json.dumps(res) or "schema" in json.dumps(res).lower(), res
    assert not (outbox / "ran").exists()


@needs_root
@pytest.mark.parametrize("program", ["shell_worker.py", "tool_worker.py"])
def test_w5_ready_workers_take_the_commands_options(queue, agent, program):
    """W-5: the ``workers/`` programs are "built on the library": they take ``--drain`` and
    ``--max-jobs`` as ``ctx queue work`` does, and a usage error is exit 2 (§2.4)."""
    jobs = [queue.publish(shell_job(f"echo {n}"), name=f"r{n}") for n in range(2)]
    argv = [str(REPO / "workers" / program), "--project", queue.project,
            "--storage", str(queue.storage), "--agent", AGENT]  # fmt: skip
    bad = subprocess.run([*argv, "--max-jobs", "0"], capture_output=True, text=True,
                         timeout=60, env=clean_env())  # fmt: skip
    assert bad.returncode == 2, bad.stderr
    ran = subprocess.run([*argv, "--drain", "--max-jobs", "1"], capture_output=True, text=True,
                         timeout=60, env=clean_env())  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert sorted(queue.state(j) for j in jobs) == ["done", "pending"]


# ====================================================================== §7: tsh.d/config, ctx tool


def human_env(storage: Path, home: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    return env_for(storage, CTX_HOME=str(home), CTX_PATH=str(storage / "tool"))


def settings(text: str) -> dict[str, str]:
    """The ``key=value`` lines of a config text, blank and ``#`` lines left out."""
    found = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            found[key.strip()] = value.strip()
    return found


def test_h4_bootstrap_writes_the_config_as_data_with_the_defaults(storage):
    """H-4: ``tool/tsh.d/config`` is data holding ``max_loaded_tools=64``, ``cache_capacity=32``,
    ``window_percent=1``: a regular file, not executable, with those three settings alone."""
    config = storage / "tool" / "tsh.d" / "config"
    info = config.lstat()
    assert stat.S_ISREG(info.st_mode)
    assert not info.st_mode & 0o111, oct(info.st_mode)
    assert settings(config.read_text()) == H4_DEFAULTS


def test_h4_r5_bootstrap_keeps_the_settings_a_person_made(storage, tmp_path):
    """R-5: bootstrap "is idempotent and never destroys user data"; H-4: the config is the
    host's data, updated through ``tsh.config`` — a repair keeps the settings."""
    env = human_env(storage, tmp_path / "home")
    assert ctx_run("tool", "tsh.config", "cache_capacity=40", env=env).rc == 0
    config = storage / "tool" / "tsh.d" / "config"
    before = config.read_bytes()
    again = ctx_run("bootstrap", "--storage", storage)
    assert again.rc == 0, again
    assert config.read_bytes() == before


def test_h1_tool_tsh_is_the_same_tsh_as_bin_tsh(storage, tmp_path):
    """H-1: tsh is ``/ctx/bin/tsh`` and ``/ctx/tool/tsh``: run from either place, a standalone
    tsh resolves names through CTX_PATH alike."""
    env = human_env(storage, tmp_path / "home")
    answers = [
        subprocess.run([storage / where / "tsh"], input="which fs.read\n", capture_output=True,
                       text=True, env=env, timeout=60)
        for where in ("bin", "tool")
    ]  # fmt: skip
    for done in answers:
        assert (done.returncode, done.stdout) == (0, f"{storage}/tool/fs.read\n"), done


def test_h4_a_missing_config_means_the_defaults(storage, tmp_path):
    """H-4 names the defaults: with no config file ``tsh.config`` reports them."""
    (storage / "tool" / "tsh.d" / "config").unlink()
    r = ctx_run("tool", "tsh.config", env=human_env(storage, tmp_path / "home"))
    assert r.rc == 0, r
    assert settings(r.out) == H4_DEFAULTS


def test_h4_tsh_config_is_a_visible_tool_with_its_controls(storage, tmp_path):
    """H-4: "Updates normally go through the visible tool ``tsh.config``": it is a tool of
    T-1, ``tool/tsh.config`` (executable) and ``tool/tsh.config.d/`` with its controls, and
    CTX_PATH finds it (T-4)."""
    tool = storage / "tool" / "tsh.config"
    assert tool.is_file() and os.access(tool, os.X_OK)
    controls = storage / "tool" / "tsh.config.d"
    for control in ("name", "description", "schema", "cap", "policy", "status", "log"):
        assert (controls / control).is_file(), control
    for hooks in ("hooks/pre.d", "hooks/post.d"):
        assert (controls / hooks).is_dir(), hooks
    assert (controls / "name").read_text().strip() == "tsh.config"
    which = ctx_run("object", "which", "tsh.config", env=human_env(storage, tmp_path / "home"))
    assert which.out == f"{tool}\n", which


def test_h4_a_bad_setting_is_einval_and_changes_nothing(storage, tmp_path):
    """H-4 fixes three integer keys; anything else given to ``tsh.config`` is a bad input: a
    clear ``EINVAL`` and the file stays as it was, the good setting beside it not applied."""
    config = storage / "tool" / "tsh.d" / "config"
    before = config.read_bytes()
    for setting in ("cache_capacity=abc", "cache_capacity=-1", "cache_capacity=0",
                    "max_loaded_tools=", "window_percent=1.5", "window_percent=101",
                    "no_such_key=3", "cache_capacity"):  # fmt: skip
        r = ctx_run("tool", "tsh.config", "max_loaded_tools=5", setting,
                    env=human_env(storage, tmp_path / "home"))  # fmt: skip
        assert r.rc != 0, r
        assert "EINVAL" in r.err, r
        assert config.read_bytes() == before


def test_h4_an_update_keeps_the_comments_and_blank_lines(storage, tmp_path):
    """H-4: the config is a data file of "blank lines, ``#`` comments" and settings; changing
    one setting through ``tsh.config`` keeps what the person wrote around it."""
    config = storage / "tool" / "tsh.d" / "config"
    config.write_text(
        "# kept: why we changed the cache\n\nmax_loaded_tools=64\n# second note\n"
        "cache_capacity=32\nwindow_percent=1\n"
    )
    r = ctx_run("tool", "tsh.config", "cache_capacity=40", env=human_env(storage, tmp_path / "h"))
    assert r.rc == 0, r
    text = config.read_text()
    assert "# kept: why we changed the cache" in text and "# second note" in text
    assert "\n\n" in text
    assert settings(text) == {**H4_DEFAULTS, "cache_capacity": "40"}


def test_h4_a_config_that_is_a_symbolic_link_is_never_followed(storage, tmp_path):
    """H-4: ``tool/tsh.d/config`` is a data file of the storage root; a symbolic link in its
    place (Q-8's rule for what the tree holds: never followed) neither leads an update to
    the file it names nor is read as the settings."""
    outside = tmp_path / "outside"
    outside.write_text("max_loaded_tools=64\ncache_capacity=32\nwindow_percent=1\n")
    before = outside.read_bytes()
    config = storage / "tool" / "tsh.d" / "config"
    config.unlink()
    config.symlink_to(outside)
    env = human_env(storage, tmp_path / "home")
    r = ctx_run("tool", "tsh.config", "cache_capacity=7", env=env)
    assert outside.read_bytes() == before, r
    assert r.rc != 0 or not config.is_symlink(), r


def test_h3_ctx_tool_native_output_is_json(storage, tmp_path):
    """T-3 agent native mode: "structured JSON input, JSONL frames out" — ``ctx tool --json``
    prints JSON (one object a line) holding the settings."""
    r = ctx_run("tool", "--json", "tsh.config", env=human_env(storage, tmp_path / "home"))
    assert r.rc == 0, r
    frames = [json.loads(line) for line in r.lines() if line.strip()]
    assert frames and all(isinstance(f, dict) for f in frames), r
    text = json.dumps(frames)
    assert all(key in text for key in H4_DEFAULTS), r


def test_r3_ctx_tool_name_that_is_no_object_name_is_einval(storage, tmp_path):
    """R-3: a tool name is an object name; "Anything else is rejected with ``EINVAL``"."""
    for name in ("a/b", "../tool/tsh.config", "tsh.d", ".hidden", "x" * 65):
        r = ctx_run("tool", name, env=human_env(storage, tmp_path / "home"))
        assert r.rc != 0, r
        assert "EINVAL" in r.err, r


def test_h3_ctx_tool_of_a_name_nowhere_on_ctx_path_is_enoent(storage, tmp_path):
    """H-3: "NAME must still be visible on CTX_PATH"; P-4: a missing object is ``ENOENT``."""
    r = ctx_run("tool", "no.such-cli", env=human_env(storage, tmp_path / "home"))
    assert r.rc == 1, r
    assert "ENOENT" in r.err, r


def test_h3_ctx_tool_without_a_name_is_a_usage_error(storage, tmp_path):
    r = ctx_run("tool", env=human_env(storage, tmp_path / "home"))
    assert r.rc == 2, r


def test_h3_ctx_tool_refuses_every_core_tool_but_the_safe_clis(storage, tmp_path):
    """H-3: ``ctx tool`` "runs only the allowed safe core CLIs implemented inside ctx (e.g.
    tsh.config)"; the core tools that act with an agent's permissions are refused
    (``EACCES``), as fs.write and shell.exec are."""
    for name in ("fs.read", "fs.list", "fs.stat", "agent.create", "tsh"):
        r = ctx_run("tool", name, json.dumps({"path": str(storage)}),
                    env=human_env(storage, tmp_path / "home"))  # fmt: skip
        assert r.rc != 0, r
        assert "EACCES" in r.err, r
        assert r.out == "", r


# ====================================================================== §9 shared spaces


def test_x1_a_spaces_queue_has_exactly_the_six_directories(storage):
    """X-1 ``queue/`` with §2: the queue "lives at shared/<project>/queue/ with exactly these
    subdirectories": inbox, pending, lease, claimed, done, failed."""
    made = ctx_run("shared", "create", "space-q", env=env_for(storage))
    assert made.rc == 0, made
    queue = storage / "shared" / "space-q" / "queue"
    subdirs = {e.name for e in queue.iterdir() if e.is_dir()}
    assert subdirs == QUEUE_SUBDIRS


def test_x1_shared_create_never_follows_a_link_in_the_spaces_place(storage, tmp_path):
    """X-1 is a space under ``shared/``; a symbolic link there (Q-8: never followed) is no
    space: ``ctx shared create`` refuses it and writes nothing where it leads."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (storage / "shared" / "linked").symlink_to(outside)
    r = ctx_run("shared", "create", "linked", env=env_for(storage))
    assert r.rc != 0, r
    assert os.listdir(outside) == []
    assert (storage / "shared" / "linked").is_symlink()


def test_x1_shared_create_with_a_group_that_does_not_exist_makes_nothing(storage):
    """X-1 (a Linux-permission space): a group the system does not know is a clear error with
    its errno word, and no space is made."""
    before = snapshot(storage)
    r = ctx_run("shared", "create", "space-g", "--group", "no-such-group-xyz",
                env=env_for(storage))  # fmt: skip
    assert r.rc != 0, r
    assert any(word in r.err for word in ("EINVAL", "ENOENT")), r
    assert snapshot(storage) == before


def test_x1_shared_create_json_is_machine_readable(storage):
    r = ctx_run("shared", "create", "--json", "space-j", env=env_for(storage))
    assert r.rc == 0, r
    json.loads(r.out)
    assert (storage / "shared" / "space-j" / "data").is_dir()


# ====================================================================== §12 the manual bundle


def test_d1_the_bundle_holds_its_pages_and_nothing_else(storage):
    """D-1: the bundle is ``README.md`` and ``man/ctx.*.md``; the design text: manuals
    "grant no permission and cannot grow into a second root ABI namespace" — no other entry,
    nothing executable."""
    bundle = storage / "shared" / "cortexfs-docs"
    entries = {str(p.relative_to(bundle)) for p in bundle.rglob("*")}
    assert entries == {"README.md", "man", *(f"man/{page}" for page in MAN_PAGES.values())}
    for page in bundle.rglob("*.md"):
        assert not page.lstat().st_mode & 0o111, page


@needs_root
def test_d1_no_other_user_can_add_or_change_a_page(storage, unprivileged_user: UnprivilegedUser):
    """D-1: "Manuals are read-only documents" maintained by the system (X-2): a user can read
    them, but neither write a page nor add one to the bundle."""
    storage.parent.chmod(0o755)
    bundle = storage / "shared" / "cortexfs-docs"
    answers = access_as(
        unprivileged_user,
        [(str(bundle / "man" / "ctx.agent.md"), "r"), (str(bundle / "man" / "ctx.agent.md"), "w"),
         (str(bundle / "man"), "w"), (str(bundle), "w")],
    )  # fmt: skip
    assert answers == [True, False, False, False]


def test_d1_ctx_man_serves_the_readme(storage):
    """D-1: ``shared/cortexfs-docs/README.md`` is a page of the bundle ``ctx man`` reads."""
    r = ctx_run("man", "README", env=env_for(storage))
    assert r.rc == 0, r
    assert r.out == (REPO / "docs" / "spec" / "README.md").read_text()


def test_d1_ctx_man_without_a_topic_names_the_topics(storage):
    r = ctx_run("man", env=env_for(storage))
    assert r.rc == 0, r
    for alias in MAN_PAGES:
        assert alias in r.out, (alias, r)


# ====================================================================== §13 ctx mount


@needs_fuse_as_root
def test_f1_r2_nothing_else_is_created_at_the_root_through_the_mount(storage, tmp_path):
    """F-1 mounts the storage root "as the root ABI"; R-2: it "has exactly these root entries
    ... Nothing else may be created at the root": no ``mcp/``, ``audit/`` or ``queue/``, no
    file, no link; and the six are not removed or renamed away."""
    before = snapshot(storage)
    view = tmp_path / "ctx"
    with ctx_mount(storage, view):
        attempts = [
            lambda: os.mkdir(view / "audit"),
            lambda: os.mkdir(view / "mcp"),
            lambda: os.close(os.open(view / "queue", os.O_CREAT | os.O_WRONLY, 0o644)),
            lambda: os.rename(view / "model", view / "models"),
            lambda: os.rmdir(view / "model"),
        ]
        for attempt in attempts:
            with pytest.raises(OSError) as refused:
                attempt()
            assert refused.value.errno in (errno.EPERM, errno.EACCES, errno.EROFS,
                                           errno.ENOTEMPTY, errno.EBUSY), refused.value  # fmt: skip
        # docs/mount.md: no symbolic link is made through the mount at all (ENOSYS).
        with pytest.raises(OSError):
            os.symlink("/tmp", view / "registry")
        assert set(os.listdir(view)) == ROOT_ENTRIES
    assert snapshot(storage) == before


@needs_fuse_as_root
def test_f1_r2_an_agent_view_keeps_the_root_entries_too(storage, tmp_path):
    """F-1 ``--as AGENT`` is a view of the root ABI too (R-2): the agent can neither add an
    entry at its root nor remove or rename one of the six, whoever asks through it."""
    make_agent(storage, ["fs.read"])
    before = snapshot(storage)
    view = tmp_path / "agent-view"
    with ctx_mount(storage, view, "--as", AGENT):
        shown = set(os.listdir(view))
        assert shown <= ROOT_ENTRIES
        attempts = [
            lambda: os.mkdir(view / "audit"),
            lambda: os.rename(view / "bin", view / "bin2"),
            lambda: os.rmdir(view / "model"),
        ]
        for attempt in attempts:
            with pytest.raises(OSError):
                attempt()
        assert set(os.listdir(view)) == shown
    assert snapshot(storage) == before


@needs_fuse_as_root
def test_f1_the_host_view_shows_the_files_as_they_are(storage, tmp_path):
    """F-1 without ``--as``: the root ABI of the storage root itself — each file's content,
    mode and size are the storage root's."""
    view = tmp_path / "ctx"
    paths = ["tool/fs.read", "tool/tsh.d/config", "tool/fs.read.d/policy",
             "shared/cortexfs-docs/README.md"]  # fmt: skip
    with ctx_mount(storage, view):
        for rel in paths:
            seen, behind = (view / rel).stat(), (storage / rel).stat()
            assert stat.S_IMODE(seen.st_mode) == stat.S_IMODE(behind.st_mode), rel
            assert seen.st_size == behind.st_size, rel
            assert (view / rel).read_bytes() == (storage / rel).read_bytes(), rel


@needs_fuse_as_root
@pytest.mark.parametrize("signal_number", [signal.SIGINT, signal.SIGHUP])
def test_f1_sigint_and_sighup_unmount_cleanly_too(storage, tmp_path, signal_number):
    """F-1: "``ctx umount`` / SIGTERM unmounts cleanly"; ``ctx mount --help`` promises the
    same for SIGINT (^C in the terminal running it) and SIGHUP (that terminal closed)."""
    view = tmp_path / "ctx"
    with ctx_mount(storage, view) as proc:
        proc.send_signal(signal_number)
        proc.wait(timeout=MOUNT_WAIT)
        assert proc.returncode in (0, 128 + signal_number, -signal_number), proc.returncode
        assert not mounted_at(view)
        assert os.listdir(view) == []


@needs_fuse_as_root
def test_f1_umount_of_a_directory_that_is_no_mount_is_refused(storage, tmp_path):
    """F-1: ``ctx umount`` unmounts what ``ctx mount`` mounted; asked for a plain directory it
    fails (not a silent success) and leaves it as it was."""
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "keep").write_text("x")
    r = ctx_run("umount", plain)
    assert r.rc != 0, r
    assert r.err.strip(), r
    assert (plain / "keep").read_text() == "x"


@needs_fuse_as_root
def test_f1_a_second_mount_on_a_mounted_point_is_refused(storage, tmp_path):
    """F-1: one mount per mount point; a second ``ctx mount`` there fails and the first one
    keeps working."""
    view = tmp_path / "ctx"
    with ctx_mount(storage, view):
        again = ctx_run("mount", "--storage", storage, view, timeout=MOUNT_WAIT)
        assert again.rc != 0, again
        assert set(os.listdir(view)) == ROOT_ENTRIES
