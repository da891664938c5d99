"""The environment of a ``ctx`` process, set by a careless user or by a hostile party who
controls it (a tool's children, a worker started from a crontab, an administrator who ran
``su`` without ``-`` in someone else's shell): ``CTX_STORAGE``, ``CTX_PROJECT``, ``CTX_AGENT``,
``CTX_PATH``, ``CTX_HOME`` and its ``.tshrc``, the runtime's own ``CTX_*`` names, ``HOME`` and
the XDG directories, ``TMPDIR``, ``PATH``, the locale, ``COLUMNS``, the umask, closed standard
streams and a current directory that is gone or closed.  Values are empty, relative, full of
``..``, control bytes and newlines, or lead through links to another user's directory, to
``/proc`` or ``/sys``.  Every command must refuse with ``ctx: ERRNO: …`` and its documented
exit status or do exactly its work, show no raw control byte, write nothing where nobody asked,
run no program from a directory nobody vouched for, and create its files with the documented
modes whatever the umask."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    ROOT_ENTRIES,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    request,
    scratch_top,
    snapshot,
    tool_manifest,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, find_or_create_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: agents and a second user run as other uids"
)

CTX = CTX_ARGV[0]
SCRATCH = scratch_top(__file__)
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
NOBODY = 65534
JOB = json.dumps(request("fs.stat", input={"path": "/ctx"}))
# A C0 control other than the newline that ends a line, DEL, or a C1 control: what may start
# an escape sequence on a terminal, or split one log line in two.
RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")
# Prints its uid and its whole environment as one JSON object: what the runtime gave it.
ENV_DUMP = """#!/usr/bin/python3 -I
import json, os, sys
sys.stdin.read()
print(json.dumps({"uid": os.getuid(), "env": dict(os.environ)}))
"""
# The variables docs/tools.md (*Environment*) lists for a native call, and nothing else.
TOOL_ENVIRONMENT = {
    "PATH", "HOME", "LANG", "CTX_AGENT", "CTX_SESSION", "CTX_CALL", "CTX_TOOL", "CTX_MODE",
    "CTX_PATH", "CTX_MOUNTS", "CTX_CWD",
}  # fmt: skip


# ---------------------------------------------------------------- helpers


@dataclass
class Host:
    """A bootstrapped storage root every uid may search, in a scratch directory of its own,
    and root's ``ctx`` aimed at it with a claim-order cache of its own."""

    storage: Path
    top: Path

    @property
    def env(self) -> dict[str, str]:
        return clean_env(
            CTX_STORAGE=str(self.storage), XDG_CACHE_HOME=str(self.top / "cache"), PATH=PATH
        )

    def ctx(self, *args, env: dict | None = None, **kw) -> Run:
        return ctx_run(*args, env={**self.env, **(env or {})}, **kw)

    def dir(self, name: str, owner: int = 0, mode: int = 0o755) -> Path:
        path = self.top / name
        path.mkdir()
        os.chown(path, owner, owner)
        path.chmod(mode)
        return path

    def agent(self, name: str, tools: list[str], mount: list | None = None) -> None:
        """Agent ``name`` (uid nobody, root's default) allowed ``tools`` in both layers of P-6."""
        req = {"name": name, "label": f"{name}_t", "tools": tools, "mount": mount or []}
        made = self.ctx("agent", "create", "-", input=json.dumps(req))
        assert made.rc == 0, made
        for tool in tools:
            with open(self.storage / "tool" / f"{tool}.d" / "policy", "a") as policy:
                policy.write(f"allow {name}_t tool:{tool} execute\n")

    def install_env_dump(self) -> None:
        manifest = tool_manifest(self.top / "src", "env.dump", ENV_DUMP)
        done = self.ctx("object", "install", manifest, "--tier", "system")
        assert done.rc == 0, done

    def publish(self, name: str, req: dict | None = None) -> None:
        body = json.dumps(req or json.loads(JOB))
        done = self.ctx("queue", "publish", "--project", "proj", "--name", name, "-", input=body)
        assert done.rc == 0, done


@pytest.fixture
def host(searchable_storage: Path) -> Iterator[Host]:
    top = new_scratch_dir(SCRATCH, "h")
    try:
        yield Host(searchable_storage, top)
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def user() -> UnprivilegedUser:
    return find_or_create_user()


def as_user(
    user: UnprivilegedUser,
    argv: list,
    env: dict[str, str],
    *,
    cwd: Path,
    stdin: str = "",
    umask: int = 0o022,
) -> Run:
    done = subprocess.run(
        [str(word) for word in argv], input=stdin, user=user.uid, group=user.gid,
        extra_groups=[], umask=umask, env=env, cwd=cwd, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    return Run([str(word) for word in argv], done.returncode, done.stdout, done.stderr)


def user_dir(top: Path, name: str, user: UnprivilegedUser) -> Path:
    path = top / name
    path.mkdir()
    os.chown(path, user.uid, user.gid)
    path.chmod(0o755)
    return path


def error_lines(run: Run) -> list[str]:
    return [line for line in run.err.splitlines() if not line.startswith("ctx: warning:")]


def refused(run: Run, rc: int, errno_name: str, *named: str) -> str:
    """``run`` ended with ``rc`` and one ``ctx: ERRNO: …`` line naming each of ``named``."""
    assert run.rc == rc, run
    assert "Traceback" not in run.err, run
    lines = [line for line in error_lines(run) if line.startswith("ctx: ")]
    assert len(lines) == 1, run
    assert lines[0].startswith(f"ctx: {errno_name}: "), run
    for text in named:
        assert text in lines[0], (text, run)
    return lines[0]


def no_raw_control(run: Run) -> None:
    for stream in (run.out, run.err):
        assert not RAW_CONTROL.search(stream), run


def last_frame(run: Run) -> dict:
    frames = [json.loads(line) for line in run.lines()]
    assert frames and frames[-1]["type"] == "result", run
    return frames[-1]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def every_entry(top: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            yield Path(dirpath, name)


# ---------------------------------------------------------------- CTX_STORAGE


def test_control_bytes_and_newlines_in_ctx_storage_and_ctx_project_never_reach_output_raw(
    host: Host,
) -> None:
    """README ('ctx: ERRNO: what to do'), docs/queue.md: a storage root or queue path holding
    ESC, BEL and a newline followed by a forged error line is shown escaped in every line of
    queue init, status and object which, so the forged line never starts a line
    of its own and no escape sequence reaches the terminal; the commands still work on it."""
    forged = "\nctx: EPERM: forged"
    root = copy_of_root(host.storage, host.top / f"r\x1b]0;owned\x07{forged}")
    env = {"CTX_STORAGE": str(root)}
    runs = [
        host.ctx("queue", "init", "--project", "p", env=env),
        host.ctx("queue", "status", "--project", "missing", env=env),
        host.ctx("object", "which", "no.such", env=env),
        host.ctx("queue", "status", "--project", str(root / "shared"), env={}),
    ]
    assert [run.rc for run in runs] == [0, 1, 1, 1], runs
    assert (root / "shared/p/queue/pending").is_dir()
    for run in runs:
        no_raw_control(run)
        assert "Traceback" not in run.err, run
        for line in (run.out + run.err).splitlines():
            assert not line.startswith("ctx: EPERM: forged"), run
    assert "\\x1b]0;owned\\x07\\x0actx: EPERM: forged" in runs[1].err, runs[1]


@pytest.fixture
def place() -> Iterator[Path]:
    """A scratch directory of root's that every uid may search, with no storage root in it."""
    path = new_scratch_dir(SCRATCH, "p")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("kind", ["proc", "sys", "fifo", "link-loop", "dangling"])
def test_a_ctx_storage_on_proc_sys_a_fifo_or_a_broken_link_is_refused_and_nothing_is_made(
    place: Path, kind: str
) -> None:
    """R-1: a storage root named by CTX_STORAGE that is a pseudo-filesystem, a FIFO, a link
    loop or a link to nowhere is refused by bootstrap and publish with an errno (exit 1),
    never waited on, never a traceback; nothing is made beside it or at the link's target."""
    value = {
        "proc": "/proc",
        "sys": "/sys/kernel",
        "fifo": str(place / "fifo"),
        "link-loop": str(place / "a"),
        "dangling": str(place / "link"),
    }[kind]
    os.mkfifo(place / "fifo")
    (place / "a").symlink_to("b")
    (place / "b").symlink_to("a")
    (place / "link").symlink_to(place / "gone" / "release")
    before = snapshot(place)
    env = clean_env(CTX_STORAGE=value, XDG_CACHE_HOME=str(place / "cache"))
    for args in (["bootstrap"], ["queue", "publish", "--project", "p", "-"]):
        ran = ctx_run(*args, env=env, input=JOB, timeout=20)
        assert ran.rc == 1, ran
        assert "Traceback" not in ran.err, ran
        assert re.match(r"ctx: E[A-Z]+: ", error_lines(ran)[0]), ran
    assert snapshot(place) == before
    assert not os.path.lexists("/proc/bin") and not os.path.lexists("/sys/kernel/bin")


def test_bootstrap_on_a_pseudo_filesystem_names_the_storage_root_it_cannot_make() -> None:
    """R-1/R-5 and the README's 'ctx: ERRNO: what to do': CTX_STORAGE pointing at a kernel
    filesystem, where no directory can be made, is refused naming the storage root (as the
    read-only and missing roots are), not a bare 'bin'."""
    for root in ("/proc", "/sys/kernel"):
        ran = ctx_run("bootstrap", env=clean_env(CTX_STORAGE=root))
        assert ran.rc == 1 and "Traceback" not in ran.err, ran
        line = error_lines(ran)[0]
        assert re.match(r"ctx: E[A-Z]+: ", line), ran
        assert root in line, ran


def test_root_never_bootstraps_through_a_link_another_user_made_into_a_directory_of_roots(
    place: Path,
) -> None:
    """docs/queue.md ('only the storage root may be reached through a link its administrator
    made'): a link ``~nobody/ctx`` that nobody planted, pointing at a directory of root's that
    holds other files (``/etc`` in real life), given to root as CTX_STORAGE (``su`` without
    ``-`` keeps it), is refused by bootstrap, and nothing is written there."""
    theirs = place / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    roots = place / "roots-only"
    roots.mkdir()
    (roots / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    link = theirs / "ctx"
    link.symlink_to(roots)
    os.lchown(link, NOBODY, NOBODY)
    before = snapshot(roots)
    ran = ctx_run("bootstrap", env=clean_env(CTX_STORAGE=str(link)))
    assert ran.rc == 1 and "Traceback" not in ran.err, ran
    assert str(link) in error_lines(ran)[0], ran
    assert snapshot(roots) == before


def test_a_relative_ctx_storage_read_in_two_directories_of_one_pipeline_moves_nothing(
    host: Host,
) -> None:
    """R-1, Q-4, docs/queue.md: ``J=$(ctx queue claim)`` and ``ctx queue finish "$J"`` with one
    relative CTX_STORAGE, the second run from another directory, name two roots: finish and
    renew there are ENOENT (exit 1), saying where J is, and neither the claim in the first
    root nor the pending J of the second is touched; from the right directory finish works."""
    first, second = host.dir("first"), host.dir("second")
    env = {"CTX_STORAGE": "store"}
    for place in (first, second):
        copy_of_root(host.storage, place / "store")
        published = host.ctx(
            "queue", "publish", "--project", "proj", "--name", "j", "-", input=JOB, env=env,
            cwd=place,
        )  # fmt: skip
        assert (published.rc, published.out) == (0, "j.req.json\n"), published
    claimed = host.ctx("queue", "claim", "--project", "proj", env=env, cwd=first)
    assert (claimed.rc, claimed.out) == (0, "j.req.json\n"), claimed
    state = {place: snapshot(place / "store/shared/proj/queue") for place in (first, second)}

    finish = host.ctx(
        "queue", "finish", "--project", "proj", "j.req.json", "--ok", "-", input="{}", env=env,
        cwd=second,
    )  # fmt: skip
    refused(finish, 1, "ENOENT", "j.req.json", "pending", "claim it")
    renew = host.ctx("queue", "renew", "--project", "proj", "j.req.json", env=env, cwd=second)
    refused(renew, 1, "ENOENT", "j.req.json", "pending")
    for place in (first, second):
        assert snapshot(place / "store/shared/proj/queue") == state[place]

    done = host.ctx(
        "queue", "finish", "--project", "proj", "j.req.json", "--ok", "-", input="{}", env=env,
        cwd=first,
    )  # fmt: skip
    assert done.rc == 0, done
    assert (first / "store/shared/proj/queue/done/j.req.json.result").is_file()
    assert (second / "store/shared/proj/queue/pending/j.req.json").is_file()


# ---------------------------------------------------------------- CTX_PROJECT, CTX_AGENT


def test_ctx_project_and_ctx_agent_from_the_environment_are_checked_as_the_options_are(
    host: Host,
) -> None:
    """§2.4, docs/queue.md and docs/workers.md: ``$CTX_PROJECT`` of ``../../etc``, of a name
    ending in a newline, or of a link into ``/proc`` is refused like ``--project`` (EINVAL
    exit 2, ELOOP exit 1), an empty one is a missing project (exit 2); a ``$CTX_AGENT`` of
    ``../x`` or holding ESC and a newline stops ``queue work`` with EINVAL (exit 2), shown
    escaped, before it claims anything; as a publisher it is recorded as data, exactly."""
    host.publish("keep")
    storage_before = snapshot(host.storage)
    cases = [
        ({"CTX_PROJECT": "../../etc"}, 2, "EINVAL"),
        ({"CTX_PROJECT": "proj\n"}, 2, "EINVAL"),
        ({"CTX_PROJECT": "/proc/self/cwd"}, 1, "ELOOP"),
        ({"CTX_PROJECT": ""}, 2, "EINVAL"),
    ]
    for env, rc, errno_name in cases:
        ran = host.ctx("queue", "init", env=env, cwd=host.top)
        refused(ran, rc, errno_name)
        no_raw_control(ran)
    for agent in ("../x", "ci\n\x1b[2J"):
        worker = host.ctx("queue", "work", "--project", "proj", "--drain", env={"CTX_AGENT": agent})
        refused(worker, 2, "EINVAL", "agent")
        no_raw_control(worker)
    assert snapshot(host.storage) == storage_before
    assert set(os.listdir(host.top)) <= {"cache"}

    publisher = "ev\x1b[2Jil\nroot"
    published = host.ctx(
        "queue", "publish", "--project", "proj", "--name", "from-env", "-",
        input=json.dumps({"tool": "fs.stat", "input": {}}), env={"CTX_AGENT": publisher},
    )  # fmt: skip
    assert published.rc == 0, published
    shown = host.ctx("queue", "show", "--project", "proj", "from-env", "--json")
    assert shown.json()["request"]["from"] == publisher, shown
    text = host.ctx("queue", "show", "--project", "proj", "from-env")
    assert text.rc == 0, text
    no_raw_control(text)


# ---------------------------------------------------------------- the runtime's own CTX_*


def test_a_worker_and_a_call_started_in_a_forged_runtime_environment_run_the_real_tool(
    host: Host,
) -> None:
    """T-4 (the runtime's CTX_PATH is authoritative), docs/tools.md *Environment* ('exactly
    this environment, nothing from the host's'), W-1: a worker and a native call started with
    a CTX_PATH and a CTX_HOME/.tshrc naming a planted tool, a CTX_MOUNTS granting ``/``
    read-write, CTX_CWD, CTX_SESSION, CTX_MODE, CTX_RUN_SOCKET, CTX_RUN_CAPABILITY and
    CTX_MCP_CONFIG_VOUCHED of the caller's choosing run the installed tool as the agent's uid,
    in the worker's own session, with exactly the documented variables of the runtime."""
    host.install_env_dump()
    host.agent("ci", ["env.dump"])
    planted = host.dir("planted")
    mark = host.top / "planted-ran"
    (planted / "env.dump").write_text(f"#!/bin/sh\ntouch {mark}\necho '{{}}'\n")
    (planted / "env.dump").chmod(0o755)
    shutil.copytree(host.storage / "tool/env.dump.d", planted / "env.dump.d")
    home = host.dir("home")
    (home / ".tshrc").write_text(f"CTX_PATH={planted}\n")
    forged = {
        "CTX_PATH": str(planted),
        "CTX_HOME": str(home),
        "CTX_MOUNTS": json.dumps([["/", "/", "rw"]]),
        "CTX_CWD": "/etc",
        "CTX_SESSION": "forged",
        "CTX_MODE": "terminal",
        "CTX_RUN_SOCKET": str(host.top / "run.sock"),
        "CTX_RUN_CAPABILITY": "0",
        "CTX_MCP_CONFIG_VOUCHED": "forged",
        "CTX_TOOL": "fs.write",
        "CTX_CALL": "forged",
        "HOME": "/root",
    }
    host.publish("dump", {"tool": "env.dump", "input": {}})
    worker = host.ctx(
        "queue", "work", "--project", "proj", "--drain", env={**forged, "CTX_AGENT": "ci"}
    )
    assert worker.rc == 0, worker
    result = json.loads((host.storage / "shared/proj/queue/done/dump.req.json.result").read_text())
    call = host.ctx("run", "--agent", "ci", "--native", "env.dump", input="{}", env=forged)
    assert call.rc == 0, call
    for output, session in ((result["output"], "worker"), (last_frame(call)["output"], "default")):
        seen = output["env"]
        assert output["uid"] == NOBODY, output
        assert set(seen) == TOOL_ENVIRONMENT, sorted(seen)
        assert (seen["CTX_SESSION"], seen["CTX_MODE"]) == (session, "native"), seen
        assert (seen["CTX_TOOL"], seen["CTX_AGENT"]) == ("env.dump", "ci"), seen
        assert seen["CTX_PATH"] == f"/ctx/tool:/ctx/home/{NOBODY}/tool", seen
        assert ["/", "/", "rw"] not in json.loads(seen["CTX_MOUNTS"]), seen
        assert seen["CTX_CWD"] != "/etc" and seen["HOME"] != "/root", seen
    assert not mark.exists()
    home_sessions = host.storage / f"home/{NOBODY}/agent/ci/session"
    assert sorted(os.listdir(home_sessions)) == ["default", "worker"]


# ---------------------------------------------------------------- PATH


def test_root_with_dot_on_path_never_runs_a_setpriv_the_agent_left_in_its_workspace(
    host: Host, outbox: Path
) -> None:
    """P-5 step 1 (exec uid/gid), T-5: a tool runs as the agent's uid and nothing of the
    agent's runs as root.  An administrator whose PATH starts with ``.`` runs a call from
    the agent's workspace, where the agent (uid nobody) left an executable ``setpriv``: the
    call works, and that file is never executed — by root least of all."""
    workspace = host.dir("ws", owner=NOBODY)
    host.agent("ci", ["fs.stat"], mount=[[str(workspace), "/workspace", "rw"]])
    mark = outbox / "setpriv-ran"
    planted = workspace / "setpriv"
    planted.write_text(
        "#!/bin/sh\n"
        f'echo "uid $(id -u)" >> {mark}\n'
        'while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done\n'
        'shift\nexec "$@"\n'
    )
    planted.chmod(0o755)
    os.chown(planted, NOBODY, NOBODY)
    ran = host.ctx(
        "run", "--agent", "ci", "fs.stat", "/workspace",
        env={"PATH": f".:{PATH}"}, cwd=workspace,
    )  # fmt: skip
    assert ran.rc == 0, ran
    assert not mark.exists(), mark.read_text()


def test_an_unset_empty_or_useless_path_still_runs_the_tool_as_the_agent(host: Host) -> None:
    """T-5, docs/tools.md *Environment*: without setpriv on the caller's PATH (PATH unset,
    empty, or naming only missing and relative directories), the call still switches to the
    agent's uid before the tool runs, and the tool gets the runtime's PATH, not the caller's."""
    host.install_env_dump()
    host.agent("ci", ["env.dump"])
    for path in (None, "", "/nonexistent:relative/bin"):
        env = {k: v for k, v in host.env.items() if k != "PATH"}
        if path is not None:
            env["PATH"] = path
        ran = ctx_run("run", "--agent", "ci", "--native", "env.dump", input="{}", env=env)
        assert ran.rc == 0, (path, ran)
        output = last_frame(ran)["output"]
        assert output["uid"] == NOBODY, (path, output)
        assert output["env"]["PATH"] == "/usr/local/bin:/usr/bin:/bin", (path, output)


# ---------------------------------------------------------------- CTX_PATH, CTX_HOME, .tshrc


def test_a_world_writable_or_foreign_directory_first_on_ctx_path_is_listed_but_never_run(
    host: Host, user: UnprivilegedUser, outbox: Path
) -> None:
    """T-4 (the first directory holding an executable wins the lookup), H-2 and H-3: a
    world-writable directory and another uid's directory ahead of ``/ctx/tool`` on the
    process CTX_PATH hold a ``tsh.config`` and an ``fs.read`` anyone could have planted.
    ``ctx object which`` names the planted file (that is the search), but ``ctx tool``
    refuses it (EACCES, not the core tool) and a human tsh runs nothing (EACCES, exit 126)."""
    open_dir = host.dir("open", mode=0o1777)
    foreign = host.dir("foreign", owner=user.uid)
    mark = outbox / "planted-ran"
    for directory in (open_dir, foreign):
        for name in ("tsh.config", "fs.read"):
            (directory / name).write_text(f"#!/bin/sh\necho {directory.name} >> {mark}\n")
            (directory / name).chmod(0o755)
    for first in (open_dir, foreign):
        env = {"CTX_PATH": f"{first}:/ctx/tool", "CTX_HOME": str(host.top / "no-home")}
        which = host.ctx("object", "which", "tsh.config", env=env)
        assert (which.rc, which.out) == (0, f"{first}/tsh.config\n"), which
        tool = host.ctx("tool", "tsh.config", env=env)
        refused(tool, 1, "EACCES", f"{first}/tsh.config", "not the core tool")
        shell = subprocess.run(
            [host.storage / "bin/tsh"], input="fs.read /etc/hostname\ntsh.config\n",
            capture_output=True, text=True, env={**host.env, **env}, timeout=30,
        )  # fmt: skip
        assert shell.returncode == 126, shell
        assert shell.stderr.count("EACCES") == 2, shell.stderr
    assert not mark.exists(), mark.read_text()


def test_a_tshrc_warning_shows_control_bytes_of_ctx_home_escaped(host: Host) -> None:
    """T-4 (a line that is not KEY=VALUE is ignored 'with one warning on stderr naming the
    file and the line'), as every other message of ctx: a CTX_HOME whose name holds a
    clear-screen sequence and a newline followed by a forged error is named escaped, on one
    line, by ``ctx object which`` and by a human tsh."""
    home = host.top / "h\x1b[2J\nctx: EPERM: forged"
    home.mkdir()
    (home / ".tshrc").write_text("echo hi\nCTX_PATH=/ctx/tool\n")
    env = {"CTX_HOME": str(home)}
    which = host.ctx("object", "which", "fs.read", env=env)
    assert (which.rc, which.out) == (0, f"{host.storage}/tool/fs.read\n"), which
    shell = subprocess.run(
        [host.storage / "bin/tsh", "which", "fs.read"], capture_output=True, text=True,
        env={**host.env, **env}, timeout=30,
    )  # fmt: skip
    for err in (which.err, shell.stderr):
        assert "warning" in err, err
        assert not RAW_CONTROL.search(err), err
        assert not any(line.startswith("ctx: EPERM") for line in err.splitlines()), err


def test_a_nul_byte_in_the_ctx_path_of_a_tshrc_is_refused_not_a_traceback(host: Host) -> None:
    """T-4 (a .tshrc that cannot be used: ``ctx`` exits with EINVAL and what to do, a
    standalone tsh warns once and takes $CTX_PATH or the default): a CTX_PATH line holding a
    NUL byte is such a file, for ``ctx object which``, ``ctx tool`` and tsh alike."""
    home = host.dir("home")
    (home / ".tshrc").write_bytes(b"CTX_PATH=/ctx/tool\x00:/elsewhere\n")
    env = {"CTX_HOME": str(home)}
    for args in (["object", "which", "fs.read"], ["tool", "tsh.config"]):
        ran = host.ctx(*args, env=env)
        assert "Traceback" not in ran.err, ran
        if ran.rc != 0:
            refused(ran, 1, "EINVAL", str(home / ".tshrc"))
    shell = subprocess.run(
        [host.storage / "bin/tsh", "which", "fs.read"], capture_output=True, text=True,
        env={**host.env, **env}, timeout=30,
    )  # fmt: skip
    assert "Traceback" not in shell.stderr, shell.stderr
    assert shell.returncode == 0 and shell.stdout == f"{host.storage}/tool/fs.read\n", shell


def test_a_tshrc_too_big_linked_to_another_users_file_or_full_of_includes_is_only_data(
    host: Host, outbox: Path
) -> None:
    """T-4 and docs/tools.md: a .tshrc over 64 KiB is refused (EINVAL, exit 1, naming it); a
    .tshrc linked to another uid's file is refused (EPERM) without a word of that file's
    content; ``source``, ``.``, ``include`` and ``CTX_PATH+=`` lines after the CTX_PATH line
    are ignored with a warning each, the file they name never read or run."""
    home = host.dir("home")
    tshrc = home / ".tshrc"
    tshrc.write_text("#" * (64 * 1024 + 1) + "\n")
    refused(host.ctx("object", "which", "fs.read", env={"CTX_HOME": str(home)}), 1, "EINVAL",
            str(tshrc), "larger than")  # fmt: skip

    tshrc.unlink()
    secret = host.top / "their-settings"
    secret.write_text("CTX_PATH=/srv/private-tools\nTOKEN=hunter2\n")
    os.chown(secret, NOBODY, NOBODY)
    secret.chmod(0o600)
    tshrc.symlink_to(secret)
    linked = host.ctx("object", "which", "fs.read", env={"CTX_HOME": str(home)})
    refused(linked, 1, "EPERM", str(tshrc), "another user")
    assert "hunter2" not in linked.err and "private-tools" not in linked.err, linked

    tshrc.unlink()
    tools = host.dir("tools")
    (tools / "demo.x").write_text(f"#!/bin/sh\necho included >> {outbox / 'ran'}\n")
    (tools / "demo.x").chmod(0o755)
    included = host.top / "included.sh"
    included.write_text(f"touch {outbox / 'included-ran'}\nCTX_PATH=/nowhere\n")
    # After the CTX_PATH line: were the included file read, its CTX_PATH would win.
    tshrc.write_text(
        f"CTX_PATH={tools}\nsource {included}\n. {included}\ninclude {included}\n"
        "CTX_PATH+=/nowhere\n"
    )
    found = host.ctx("object", "which", "demo.x", env={"CTX_HOME": str(home)})
    assert (found.rc, found.out) == (0, f"{tools}/demo.x\n"), found
    warnings = [line for line in found.err.splitlines() if line.startswith("ctx: warning:")]
    assert len(warnings) == 4 and all("ignored" in w for w in warnings), found
    assert os.listdir(outbox) == []


# ---------------------------------------------------------------- HOME, XDG


def test_empty_and_relative_home_and_xdg_values_put_nothing_in_the_current_directory(
    user: UnprivilegedUser,
) -> None:
    """R-1 ('$XDG_DATA_HOME/cortexfs/storage/current, ~/.local/share/…') and docs/queue.md's
    claim-order hint: relative XDG_DATA_HOME and XDG_CACHE_HOME values are ignored, so the
    user's root and hint go below HOME; with HOME empty or relative too the password
    database names the home, and the default root reported is there.  Whatever the values,
    nothing is made in the directory the user stood in."""
    top = new_scratch_dir(SCRATCH, "x")
    try:
        home, cwd = user_dir(top, "home", user), user_dir(top, "cwd", user)
        env = {"PATH": PATH, "HOME": str(home), "XDG_DATA_HOME": "rel", "XDG_CACHE_HOME": "."}
        made = as_user(user, [CTX, "queue", "init", "--project", "p"], env, cwd=cwd)
        assert made.rc == 0, made
        published = as_user(user, [CTX, "queue", "publish", "--project", "p", "-"], env,
                            cwd=cwd, stdin=JOB)  # fmt: skip
        assert published.rc == 0, published
        claimed = as_user(user, [CTX, "queue", "claim", "--project", "p"], env, cwd=cwd)
        assert (claimed.rc, claimed.out) == (0, published.out), claimed
        root = home / ".local/share/cortexfs/storage/current"
        assert {p.name for p in root.iterdir()} == ROOT_ENTRIES
        assert len(os.listdir(home / ".cache/cortexfs/claim-order")) >= 1
        assert os.listdir(cwd) == []

        default = Path(pwd.getpwuid(user.uid).pw_dir) / ".local/share/cortexfs/storage/current"
        for bad_home in ("", "../up"):
            odd = {**env, "HOME": bad_home, "XDG_DATA_HOME": "../x"}
            status = as_user(user, [CTX, "queue", "status", "--project", "p"], odd, cwd=cwd)
            refused(status, 1, "ENOENT", f"no queue at {default}/shared/p/queue")
        assert os.listdir(cwd) == []
        assert not (top / "x").exists() and not (top / "up").exists()
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_root_handed_a_users_home_makes_nothing_in_it(host: Host, user: UnprivilegedUser) -> None:
    """R-1 and docs/queue.md ('/var/cache/cortexfs/… for root'): root run with a user's HOME
    and no XDG_CACHE_HOME (``su`` without ``-``) uses the system's root and cache, and makes
    nothing in that user's home."""
    theirs = user_dir(host.top, "their-home", user)
    env = {k: v for k, v in host.env.items() if k != "XDG_CACHE_HOME"}
    env["HOME"] = str(theirs)
    host.publish("for-root")
    claimed = ctx_run("queue", "claim", "--project", "proj", env=env)
    assert (claimed.rc, claimed.out) == (0, "for-root.req.json\n"), claimed
    assert os.listdir(theirs) == []


def test_root_never_follows_a_link_another_user_planted_in_xdg_cache_home(host: Host) -> None:
    """docs/queue.md (claim-order hints, private, in the caller's cache): root run with
    XDG_CACHE_HOME of a directory another uid owns (``su`` without ``-`` keeps it), where that
    uid has made ``cortexfs`` a link to a directory of root's, still claims its job, and
    makes nothing at the link's target."""
    theirs = host.dir("their-cache", owner=NOBODY)
    target = host.dir("roots-dir")
    link = theirs / "cortexfs"
    link.symlink_to(target)
    os.lchown(link, NOBODY, NOBODY)
    host.publish("cached")
    claimed = host.ctx("queue", "claim", "--project", "proj", env={"XDG_CACHE_HOME": str(theirs)})
    assert (claimed.rc, claimed.out) == (0, "cached.req.json\n"), claimed
    assert os.listdir(target) == []


# ---------------------------------------------------------------- TMPDIR


def test_a_hostile_tmpdir_leaves_bootstrap_whole_and_nothing_behind(host: Host) -> None:
    """R-5 (idempotent, never destroys), docs/tools.md: root's bootstrap with TMPDIR an
    agent's directory (the agent may rename and replace what is put there) still exits 0 on
    a current root without a problem, changes nothing of it, and leaves nothing there."""
    agents = host.dir("agents-tmp", owner=NOBODY)

    def tree() -> dict:  # bootstrap takes its install locks; they are no change
        return {k: v for k, v in snapshot(host.storage).items() if "install-lock" not in k}

    before = tree()
    boot = host.ctx("bootstrap", "--json", env={"TMPDIR": str(agents)})
    assert boot.rc == 0, boot
    assert boot.json()["problems"] == [], boot
    assert tree() == before
    assert os.listdir(agents) == []


# ---------------------------------------------------------------- umask


def test_every_file_keeps_its_documented_mode_under_umask_000(host: Host) -> None:
    """docs/tools.md ('modes, whatever the umask'), docs/queue.md, docs/sessions.md: root
    working under ``umask 000`` — a new root made whole, an agent, a queue with a published,
    a claimed and a finished job, a call and its session, the claim-order hint — leaves no
    entry writable by others: the root and its six entries 0755, controls 0644, queue files
    the queue group's rw, a home session 0700/0600, the hint cache 0700/0600."""
    root = host.top / "fresh"
    cache = host.top / "cache000"
    env = {"CTX_STORAGE": str(root), "XDG_CACHE_HOME": str(cache)}

    def ctx(*args: str, stdin: str = "") -> Run:
        done = subprocess.run(
            [CTX, *args], input=stdin, capture_output=True, text=True, umask=0,
            env={**host.env, **env}, timeout=60,
        )  # fmt: skip
        run = Run(list(args), done.returncode, done.stdout, done.stderr)
        assert run.rc == 0, run
        return run

    queue = root / "shared/p/queue"
    ctx("queue", "init", "--project", "p")  # makes the root whole first, as bootstrap does
    ctx("queue", "publish", "--project", "p", "--name", "a", "-", stdin=JOB)
    ctx("queue", "claim", "--project", "p")
    claimed = [queue / "claimed/a.req.json/a.req.json", queue / "lease/a.req.json/worker"]
    claimed_modes = [mode(path) for path in claimed]
    ctx("queue", "finish", "--project", "p", "a.req.json", "--ok", "-", stdin="{}")
    ctx("agent", "create", "-", stdin=json.dumps({"name": "u0", "label": "u0_t",
                                                  "tools": ["fs.stat"]}))  # fmt: skip
    with open(root / "tool/fs.stat.d/policy", "a") as policy:
        policy.write("allow u0_t tool:fs.stat execute\n")
    ctx("run", "--agent", "u0", "fs.stat", "/ctx")

    open_to_others = [
        f"{p} {mode(p):o}" for p in (*every_entry(root), *every_entry(cache))
        if not p.is_symlink() and mode(p) & stat.S_IWOTH
    ]  # fmt: skip
    assert open_to_others == []
    assert {mode(root / e) for e in ROOT_ENTRIES} | {mode(root)} == {0o755}
    assert mode(root / "tool/fs.stat") == 0o755
    assert {mode(p) for p in (root / "agent/u0.d").iterdir() if p.name != "log"} == {0o644}
    done = [mode(queue / "done/a.req.json"), mode(queue / "done/a.req.json.result")]
    for found in claimed_modes + done:
        assert found & 0o060 == 0o060 and not found & 0o002, oct(found)
    session = root / f"home/{NOBODY}/agent/u0/session/default"
    assert (mode(session), mode(session / "events.jsonl")) == (0o700, 0o600)
    hints = cache / "cortexfs/claim-order"
    assert mode(hints) == 0o700 and {mode(p) for p in hints.iterdir()} == {0o600}


def test_a_user_under_umask_077_gets_the_modes_a_default_umask_gives(
    user: UnprivilegedUser,
) -> None:
    """docs/tools.md ('a bootstrap under umask 077 makes exactly the root a default umask
    makes'), docs/queue.md (queue entries get the group's access whatever the umask): an
    ordinary user under ``umask 077`` gets a private XDG data home (0700), a root and six
    entries an agent's uid can search (0755), core tools others may run, controls others may
    read, and queue files its group may read and write; the hint stays 0600."""
    top = new_scratch_dir(SCRATCH, "m")
    try:
        home, cwd = user_dir(top, "home", user), user_dir(top, "cwd", user)
        env = {"PATH": PATH, "HOME": str(home)}

        def ctx(*args: str, stdin: str = "") -> Run:
            run = as_user(user, [CTX, *args], env, cwd=cwd, stdin=stdin, umask=0o077)
            assert run.rc == 0, run
            return run

        ctx("queue", "init", "--project", "p")  # makes the root whole, as bootstrap does
        ctx("queue", "publish", "--project", "p", "--name", "a", "-", stdin=JOB)
        ctx("queue", "publish", "--project", "p", "--name", "b", "-", stdin=JOB)
        ctx("queue", "claim", "--project", "p")
        ctx("queue", "finish", "--project", "p", "a.req.json", "--ok", "-", stdin="{}")
        ctx("agent", "create", "-", stdin=json.dumps({"name": "me", "label": "me_t"}))

        data = home / ".local/share"
        root = data / "cortexfs/storage/current"
        assert (mode(home / ".local"), mode(data)) == (0o700, 0o700)
        assert {mode(root / e) for e in ROOT_ENTRIES} | {mode(root)} == {0o755}
        assert mode(root / "tool/fs.read") == 0o755
        assert mode(root / "tool/fs.read.d/policy") == 0o644
        assert mode(root / "agent/me.d/policy") == 0o644
        queue = root / "shared/p/queue"
        for path in (queue / "pending/b.req.json", queue / "done/a.req.json.result"):
            assert mode(path) & 0o060 == 0o060, (path, oct(mode(path)))
        hints = home / ".cache/cortexfs/claim-order"
        assert mode(hints) == 0o700 and {mode(p) for p in hints.iterdir()} == {0o600}
        assert all(p.lstat().st_uid == user.uid for p in every_entry(home))
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ---------------------------------------------------------------- locale, COLUMNS


@pytest.fixture(scope="module")
def latin1(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a user whose locale is ISO-8859-1 (a compiled ``en_US.ISO-8859-1``
    in a LOCPATH of its own: nothing of the host's locales changes)."""
    localedef = shutil.which("localedef")
    if localedef is None:
        pytest.skip("localedef is not installed")
    where = tmp_path_factory.mktemp("locales")
    subprocess.run([localedef, "-i", "en_US", "-f", "ISO-8859-1", str(where / "en_US.ISO-8859-1")],
                   capture_output=True, timeout=60)  # fmt: skip
    env = {"LOCPATH": str(where), "LC_ALL": "en_US.ISO-8859-1", "LANG": "en_US.ISO-8859-1"}
    probe = subprocess.run(
        [str(Path(CTX).parent / "python"), "-c", "import sys; print(sys.stdout.encoding)"],
        capture_output=True, text=True, env={**os.environ, **env},
    )  # fmt: skip
    if probe.stdout.strip() != "iso8859-1":
        pytest.skip(f"cannot make an ISO-8859-1 locale here: {probe.stdout}{probe.stderr}")
    return env


def test_a_latin1_locale_never_turns_output_into_a_traceback(
    host: Host, latin1: dict[str, str]
) -> None:
    """README ('Errors read ctx: ERRNO: what to do'), D-1, docs/sessions.md: a user or a cron
    job whose locale is ISO-8859-1 reads the manual, a job whose request holds a check mark
    and an em dash, and a session that recorded them: each command prints (escaped or
    transliterated) or refuses with an errno; none ends in a traceback."""
    host.agent("ci", ["fs.stat"])
    host.publish("uni", request("fs.stat", input={"path": "/ctx/\u2713\u2014"}))
    # Refused (not in the agent's view), and recorded in the session with its argument.
    host.ctx("run", "--agent", "ci", "fs.stat", "/ctx/\u2713\u2014")
    for args in (
        ["man", "tool"],
        ["queue", "show", "--project", "proj", "uni"],
        ["session", "show", "ci", "--json"],
    ):
        ran = host.ctx(*args, env=latin1)
        assert "Traceback" not in ran.err, ran
        assert ran.rc == 0 or re.match(r"ctx: E[A-Z]+: ", ran.err), ran


def test_c_posix_unknown_and_missing_locales_keep_non_ascii_text_exact(host: Host) -> None:
    """D-1, §2.4: under the POSIX (C) locale, an unknown one or none at all, a request holding
    non-ASCII text round-trips exactly through ``queue show --json``, ``ctx man tool`` prints
    the installed page byte for byte, and an error naming a non-ASCII root names it intact."""
    text = "caf\u00e9 \u2713 \u65e5\u672c"
    host.publish("uni", request("fs.stat", input={"path": text}))
    page = (host.storage / "shared/cortexfs-docs/man/ctx.tool.md").read_bytes()
    missing = host.top / "r\u00f6\u00f6t \u2713"
    base = {k: v for k, v in host.env.items() if not k.startswith(("LC_", "LANG"))}
    for locale in ({"LC_ALL": "POSIX"}, {"LC_ALL": "xx_YY.UTF-8"}, {}):
        env = {**base, **locale}
        shown = ctx_run("queue", "show", "--project", "proj", "uni", "--json", env=env)
        assert shown.rc == 0 and shown.json()["request"]["input"]["path"] == text, shown
        manual = subprocess.run([CTX, "man", "tool"], capture_output=True, env=env, timeout=60)
        assert (manual.returncode, manual.stdout) == (0, page), (locale, manual.stderr)
        if locale == {"LC_ALL": "POSIX"}:
            ran = ctx_run(
                "queue", "status", "--project", "p", env={**env, "CTX_STORAGE": str(missing)}
            )
            refused(ran, 1, "ENOENT", f"no queue at {missing}/shared/p/queue")


def test_odd_columns_and_lines_values_leave_help_whole() -> None:
    """§2.4: ``COLUMNS`` and ``LINES`` of negative, non-numeric, one or absurdly large
    values change at most the wrapping of ``ctx queue --help``: exit 0, every command named."""
    for columns in ("-5", "abc", "1", "9" * 30):
        ran = ctx_run("queue", "--help", env=clean_env(COLUMNS=columns, LINES=columns))
        assert ran.rc == 0 and "Traceback" not in ran.err, ran
        named = set(re.findall(r"^\s+([a-z]+)\s", ran.out, re.MULTILINE))
        assert named >= {"init", "publish", "claim", "renew", "finish", "status", "list",
                         "show", "recover", "work"}, (columns, ran)  # fmt: skip


# ---------------------------------------------------------------- streams, cwd


def test_a_worker_and_a_call_started_with_every_standard_stream_closed_finish_their_work(
    host: Host,
) -> None:
    """W-1, S-5, T-3: a worker and a terminal-mode call started as a daemon starts them
    (stdin, stdout and stderr closed) do their work: the job is done with its result, and the
    session's events are whole JSON lines, none of the tool's output among them."""
    host.agent("ci", ["fs.stat"])
    host.publish("closed")
    closed = ["/bin/sh", "-c", 'exec "$@" <&- >&- 2>&-', "sh"]
    worker = subprocess.run(
        [*closed, CTX, "queue", "work", "--project", "proj", "--drain", "--agent", "ci"],
        env=host.env, timeout=60,
    )  # fmt: skip
    assert worker.returncode == 0
    result = json.loads((host.storage / "shared/proj/queue/done/closed.req.json.result")
                        .read_text())  # fmt: skip
    assert result["status"] == "ok", result
    call = subprocess.run(
        [*closed, CTX, "run", "--agent", "ci", "--session", "quiet", "fs.stat", "/ctx"],
        env=host.env, timeout=60,
    )  # fmt: skip
    assert call.returncode == 0
    events = read_jsonl(host.storage / f"home/{NOBODY}/agent/ci/session/quiet/events.jsonl")
    assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
    assert events[-1]["exit_status"] == 0, events


def test_a_removed_or_closed_current_directory_leaves_absolute_roots_working(
    host: Host, user: UnprivilegedUser
) -> None:
    """R-1 and docs/queue.md: from a current directory that was removed (root) or made mode
    0000 by its owner (a user), commands on an absolute CTX_STORAGE work — publish, claim,
    finish and an agent's call — while a relative CTX_STORAGE is refused naming why (ENOENT:
    the directory no longer exists; EACCES naming the directory), and nothing is made."""
    host.agent("ci", ["fs.stat"])
    gone = host.top / "gone"
    gone.mkdir()
    script = (
        'cd "$1" && rmdir "$1" && shift && '
        'printf %s "$JOB" | "$@" queue publish --project proj --name in-gone - && '
        '"$@" queue claim --project proj && '
        'echo {} | "$@" queue finish --project proj in-gone.req.json --ok - && '
        '"$@" run --agent ci fs.stat /ctx >/dev/null && echo ALL-OK; '
        'CTX_STORAGE=rel "$@" queue status --project proj'
    )
    done = subprocess.run(["/bin/sh", "-c", script, "sh", str(gone), CTX], capture_output=True,
                          text=True, env={**host.env, "JOB": JOB}, timeout=60)  # fmt: skip
    assert "ALL-OK" in done.stdout, done
    assert "Traceback" not in done.stderr, done
    assert done.stderr.startswith("ctx: ENOENT: CTX_STORAGE rel is relative, and the current "
                                  "directory no longer exists"), done.stderr  # fmt: skip
    assert (host.storage / "shared/proj/queue/done/in-gone.req.json.result").is_file()

    locked = host.dir("locked", owner=user.uid)
    env = {"PATH": PATH, "HOME": str(host.top)}

    def from_closed_directory(*args: str | Path) -> Run:
        script = 'cd "$1" && chmod 000 . && shift && "$@"'
        argv = ["/bin/sh", "-c", script, "sh", locked, CTX, *args]
        ran = as_user(user, argv, env, cwd=host.top)
        locked.chmod(0o755)
        return ran

    absolute = from_closed_directory("--storage", host.storage, "object", "which", "fs.read")
    assert (absolute.rc, absolute.out) == (0, f"{host.storage}/tool/fs.read\n"), absolute
    relative = from_closed_directory("--storage", "rel", "queue", "init", "--project", "p")
    refused(relative, 1, "EACCES", str(locked), "chmod u+x")
    assert os.listdir(locked) == []
