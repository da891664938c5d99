"""What a tool process is given, compared across every way of starting it (SPEC T-2, T-3,
T-5, A-1, H-5, §10 M-4; docs/tools.md "Environment", "Identity", "Process group and
bounds", "Hooks (T-6)", "Terminal CLI mode", "The agent terminal", "MCP servers as tool
sources").

One probe tool prints its argv, working directory, umask, limits, ids and groups, open
descriptors, ignored and blocked signals, process group, session and controlling terminal,
and its whole environment.  It is run by ``ctx run --native``, by ``ctx run`` in terminal
mode, by ``ctx queue work``, as its own pre- and post-hook, from tsh in the agent's terminal
and as the server behind an MCP-backed tool, always by a caller whose environment holds what
must never reach an agent: a real ``LD_PRELOAD`` library and a ``PYTHONPATH`` holding a
``sitecustomize`` (each leaves a mark naming the uid that loaded it), ``BASH_ENV``,
``CTX_*`` values set by hand, credentials, and variables as large as the kernel passes.

Where the docs say the modes agree, they must: the same documented variables (``TERM`` in
terminal mode only, ``CTX_HOOK`` for hooks only, the configuration's ``env`` for an MCP
server), the same agent identity, working directory, mounts and search path, the caller's
umask and limits, no signal blocked and SIGPIPE and SIGXFSZ at their defaults (what else the
caller ignored goes on, alike everywhere), only the three standard descriptors, a process
group of the call's own.  Agents run as the real test user ``ctxtest``."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import pwd
import resource
import shutil
import signal
import subprocess
import termios
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Run,
    clean_env,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    wait_for,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, Raw, tsh_of
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, find_or_create_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: agents run as the test user's uid"
)

SCRATCH = scratch_top(__file__)
HOST_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
TOOL_PATH = "/usr/local/bin:/usr/bin:/bin"
TOOL = "env.probe"
# docs/tools.md "Environment": a native call's variables, and nothing else.
DOCUMENTED = {
    "PATH", "HOME", "LANG", "CTX_AGENT", "CTX_SESSION", "CTX_CALL", "CTX_TOOL", "CTX_MODE",
    "CTX_PATH", "CTX_MOUNTS", "CTX_CWD",
}  # fmt: skip
CALLER_UMASK = 0o027
CALLER_NOFILE = 300  # the soft limit; the hard one stays the caller's
needs_terminal = pytest.mark.skipif(
    shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs bubblewrap and /dev/fuse",
)

# The probe: the shell reads its own dispositions and mask first (Python ignores SIGPIPE
# and SIGXFSZ as it starts), then Python, started without -I so that a PYTHONPATH that
# reached it would run its sitecustomize, prints everything as one JSON line.
PROBE = r"""#!/bin/sh
sig=$(grep -E '^(SigIgn|SigBlk):' /proc/$$/status | tr -d ' \t' | tr '\n' ,)
code=$(cat <<'PY'
import json, os, sys, resource
native = os.environ.get("CTX_MODE") == "native" and "CTX_HOOK" not in os.environ
data = sys.stdin.read() if native else ""
st = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
fds = {}
for f in os.listdir("/proc/self/fd"):
    try:
        fds[f] = os.readlink("/proc/self/fd/" + f)
    except OSError:
        pass
print(json.dumps({
    "argv0": sys.argv[1], "argv": [os.fsencode(a).hex() for a in sys.argv[3:]],
    "signals": dict(kv.split(":", 1) for kv in sys.argv[2].split(",") if kv),
    "cwd": os.getcwd(), "umask": os.umask(0),
    "ids": [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), sorted(os.getgroups())],
    "pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0), "sid": os.getsid(0),
    "tty_nr": int(st[4]), "tpgid": int(st[5]),
    "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
    "env": dict(os.environ), "stdin": data, "fds": fds,
}))
PY
)
exec /usr/bin/python3 -c "$code" "$0" "$sig" "$@"
"""

PRELOAD_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    char line[32];
    int fd = open(MARKS, O_WRONLY | O_APPEND);
    if (fd < 0) return;
    int n = snprintf(line, sizeof line, "preload %d\n", (int)getuid());
    if (write(fd, line, n) < 0) {}
    close(fd);
}
"""

SITECUSTOMIZE = """import os
with open({marks!r}, "a") as marks:
    marks.write("sitecustomize %d\\n" % os.getuid())
"""

# A stdio MCP server (§10) that answers one tool, ``attrs``, with what its process was given.
MCP_SERVER = r"""
import json, os, sys, resource

def send(message):
    os.write(1, json.dumps(message).encode() + b"\n")

buffer = b""
def receive():
    global buffer
    while b"\n" not in buffer:
        chunk = os.read(0, 65536)
        if not chunk:
            sys.exit(0)
        buffer += chunk
    line, _, buffer = buffer.partition(b"\n")
    return json.loads(line)

while True:
    message = receive()
    if "id" not in message:
        continue
    method, ident = message.get("method"), message["id"]
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": "probe", "version": "0"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": [
            {"name": "attrs", "description": "Attributes.", "inputSchema": {"type": "object"}}]}})
    elif method == "tools/call":
        fds = {}
        for f in os.listdir("/proc/self/fd"):
            try:
                fds[f] = os.readlink("/proc/self/fd/" + f)
            except OSError:
                pass
        seen = {"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()),
                "pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0),
                "umask": os.umask(0), "cwd": os.getcwd(), "fds": fds,
                "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
                "env": dict(os.environ)}
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "content": [{"type": "text", "text": json.dumps(seen)}], "isError": False}})
    else:
        send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no"}})
"""


# ---------------------------------------------------------------------------------- helpers


@dataclass
class Host:
    """A storage root every uid may search, in a scratch directory of its own: agent
    ``coder`` (label ``coder_t``) runs as the test user, with its workspace ``ws`` mounted
    read-write at ``/workspace``; ``outbox`` is where hooks and hostile libraries leave
    their traces (mode 1777)."""

    top: Path
    storage: Path
    ws: Path
    outbox: Path
    user: UnprivilegedUser

    @property
    def env(self) -> dict[str, str]:
        return clean_env(
            CTX_STORAGE=str(self.storage), PATH=HOST_PATH, XDG_CACHE_HOME=str(self.top / "cache")
        )

    @property
    def home(self) -> str:
        return pwd.getpwuid(self.user.uid).pw_dir or "/"

    def ctx(
        self,
        *args: str | os.PathLike | bytes,
        env: dict[str, str] | None = None,
        input: bytes = b"",
        cwd: Path | None = None,
        caller: Callable[[], None] | None = None,
        pass_fds: tuple[int, ...] = (),
        stdin: int | None = None,
    ) -> Run:
        """``ctx ARGS`` with ``env`` over the host's, started by ``caller`` (a preexec)."""
        argv = [*CTX_ARGV, *(a if isinstance(a, bytes) else str(a) for a in args)]
        proc = subprocess.run(
            argv,
            input=None if stdin is not None else input,
            stdin=stdin,
            capture_output=True,
            env={**self.env, **(env or {})},
            cwd=cwd,
            preexec_fn=caller,
            pass_fds=pass_fds,
            timeout=60,
        )
        shown = [os.fsdecode(a) for a in argv[len(CTX_ARGV) :]]
        return Run(shown, proc.returncode, proc.stdout.decode(errors="replace"),
                   proc.stderr.decode(errors="replace"))  # fmt: skip

    def grant(self, tool: str) -> None:
        for policy in (self.storage / "tool" / f"{tool}.d" / "policy",
                       self.storage / "agent" / "coder.d" / "policy"):  # fmt: skip
            with policy.open("a") as rules:
                rules.write(f"allow coder_t tool:{tool} execute\n")

    def install(self, manifest: dict, name: str) -> None:
        path = self.top / "src" / f"{name}.json"
        path.write_text(json.dumps(manifest))
        done = self.ctx("object", "install", path, "--tier", "system")
        assert done.rc == 0, done

    def install_probe(self, hooks: bool = True) -> None:
        (self.top / "src" / "probe.sh").write_text(PROBE)
        self.install(
            {"manifest": 2, "kind": "tool", "name": TOOL, "description": "Prints its process.",
             "schema": {"type": "object"}, "cap": {"side_effects": False, "network": False},
             "exec": "probe.sh"},
            TOOL,
        )  # fmt: skip
        self.grant(TOOL)
        if hooks:
            executable = self.storage / "tool" / TOOL
            for phase in ("pre", "post"):
                hook = self.storage / "tool" / f"{TOOL}.d" / "hooks" / f"{phase}.d" / "10-probe"
                hook.write_text(
                    "#!/bin/sh\n"
                    f'exec {executable} hook >"{self.outbox}/hook-$CTX_HOOK-$CTX_CALL.json"\n'
                )
                hook.chmod(0o755)

    def hook_seen(self, phase: str, call: str) -> dict:
        return json.loads((self.outbox / f"hook-{phase}-{call}.json").read_text())

    def session(self, name: str) -> Path:
        return self.storage / "home" / str(self.user.uid) / "agent" / "coder" / "session" / name

    def log(self, tool: str = TOOL) -> list[dict]:
        return read_jsonl(self.storage / "tool" / f"{tool}.d" / "log")


@pytest.fixture(scope="module")
def user() -> UnprivilegedUser:
    return find_or_create_user()


@pytest.fixture
def host(_template: Path, user: UnprivilegedUser) -> Iterator[Host]:
    top = new_scratch_dir(SCRATCH, "h")
    try:
        storage = copy_of_root(_template, top / "storage")
        (top / "src").mkdir()
        ws = top / "ws"
        ws.mkdir(mode=0o755)
        os.chown(ws, user.uid, user.gid)
        outbox = top / "outbox"
        outbox.mkdir()
        outbox.chmod(0o1777)
        made = Host(top, storage, ws, outbox, user)
        request = {"name": "coder", "label": "coder_t", "tools": [],
                   "mount": [[str(ws), "/workspace", "rw"]]}  # fmt: skip
        created = made.ctx("agent", "create", "-", "--user", user.name,
                           input=json.dumps(request).encode())  # fmt: skip
        assert created.rc == 0, created
        yield made
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def hostile(host: Host) -> dict[str, str]:
    """A caller's environment holding what must never reach an agent: a working preload
    library (when a C compiler is there), a Python path with a ``sitecustomize``, a
    ``BASH_ENV``, ``CTX_*`` values set by hand, credentials, another home and locale."""
    marks = host.outbox / "marks"
    marks.write_text("")
    marks.chmod(0o666)
    env = {
        "PYTHONPATH": str(host.top / "pythonpath"),
        "PYTHONSTARTUP": str(host.top / "pythonpath" / "sitecustomize.py"),
        "BASH_ENV": str(host.top / "bash_env.sh"),
        "ENV": str(host.top / "bash_env.sh"),
        "CTX_AGENT": "intruder",
        "CTX_PROJECT": "elsewhere",
        "CTX_PATH": str(host.top / "evil-tools"),
        "CTX_HOME": str(host.top / "evil-home"),
        "CTX_MOUNTS": '[["/", "/", "rw"]]',
        "CTX_CWD": "/",
        "CTX_SESSION": "forged-session",
        "CTX_CALL": "forged-call",
        "CTX_TOOL": "forged-tool",
        "CTX_MODE": "forged-mode",
        "CTX_HOOK": "forged-hook",
        "CTX_RUN_SOCKET": "/tmp/forged-run.sock",
        "AWS_SECRET_ACCESS_KEY": "aws-caller-secret-5e1d",
        "SSH_AUTH_SOCK": "/tmp/ssh-caller-agent.sock",
        "LD_LIBRARY_PATH": str(host.top / "evil-libs"),
        "TMPDIR": str(host.top / "evil-tmp"),
        "HOME": "/root",
        "LC_ALL": "C",
        "IFS": "x",
    }
    (host.top / "pythonpath").mkdir()
    (host.top / "pythonpath" / "sitecustomize.py").write_text(
        SITECUSTOMIZE.format(marks=str(marks))
    )
    (host.top / "bash_env.sh").write_text(f'echo "bash_env $(id -u)" >> {marks}\n')
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is not None:
        source = host.top / "preload.c"
        source.write_text(PRELOAD_C)
        library = host.top / "preload.so"
        built = subprocess.run(
            [compiler, "-shared", "-fPIC", f'-DMARKS="{marks}"', "-o", str(library), str(source)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert built.returncode == 0, built.stderr
        library.chmod(0o755)
        env["LD_PRELOAD"] = str(library)
    else:
        env["LD_PRELOAD"] = str(host.top / "missing-preload.so")
    return env


def odd_caller() -> Callable[[], None]:
    """A preexec: the caller's umask 027, a soft descriptor limit of 300 under its hard one,
    SIGUSR1 and SIGPIPE ignored, SIGUSR2 and SIGINT blocked."""

    def prepare() -> None:
        os.umask(CALLER_UMASK)
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (CALLER_NOFILE, hard))
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2, signal.SIGINT})

    return prepare


def frames(run: Run) -> list[dict]:
    return [json.loads(line) for line in run.lines() if line.strip()]


def hostile_values(env: dict[str, str]) -> set[str]:
    return {value for key, value in env.items() if key not in ("LC_ALL",)}


def assert_environment(host: Host, seen: dict, mode: str, *, hook: str | None = None) -> None:
    """``seen['env']`` is exactly the documented environment of a ``mode`` call of the
    probe for ``coder`` (``TERM`` in terminal mode, ``CTX_HOOK`` for a hook)."""
    env = dict(seen["env"])
    # dash exports the directory it starts in; it must be the process's own.
    assert env.pop("PWD", seen["cwd"]) == seen["cwd"], env
    expected = DOCUMENTED | ({"TERM"} if mode == "terminal" else set())
    expected |= {"CTX_HOOK"} if hook else set()
    assert set(env) == expected, sorted(set(env) ^ expected)
    assert (env["PATH"], env["LANG"], env["HOME"]) == (TOOL_PATH, "C.UTF-8", host.home), env
    assert (env["CTX_AGENT"], env["CTX_TOOL"], env["CTX_MODE"]) == ("coder", TOOL, mode), env
    assert env.get("CTX_HOOK") == hook, env
    assert env["CTX_CWD"] == "/workspace", env
    assert env["CTX_PATH"] == f"/ctx/tool:/ctx/home/{host.user.uid}/tool", env
    mounts = json.loads(env["CTX_MOUNTS"])
    assert [str(host.ws), "/workspace", "rw"] in mounts, mounts
    assert ["/", "/", "rw"] not in mounts, mounts


def assert_process(host: Host, seen: dict, *, tool_pgid: int | None = None) -> None:
    """The agent's identity, the workspace behind ``/workspace``, the caller's umask and
    descriptor limit, nothing blocked, three descriptors, a group of its own."""
    user = host.user
    assert seen["ids"] == [user.uid, user.uid, user.gid, user.gid, sorted(user.groups)], seen
    assert seen["cwd"] == os.path.realpath(host.ws), seen["cwd"]
    assert seen["umask"] == CALLER_UMASK, oct(seen["umask"])
    assert seen["nofile"][0] == CALLER_NOFILE, seen["nofile"]
    # Nothing blocked; SIGPIPE and SIGXFSZ at their defaults whatever the caller (and Python)
    # set.  Any other disposition the caller ignored (SIGUSR1 here, SIGHUP under nohup) goes
    # on across the exec, as it does under a shell, the same in every way of running.
    assert seen["signals"]["SigBlk"] == "0" * 16, seen["signals"]
    # Signals 32 and 33 are glibc's own: one the test runner's parent ignored (make does)
    # stays ignored, since no caller can set them back (sigaction refuses them).
    ignored = int(seen["signals"]["SigIgn"], 16) & ~_GLIBCS_OWN
    assert ignored == 1 << (signal.SIGUSR1 - 1), seen["signals"]
    assert sorted(seen["fds"]) == ["0", "1", "2"], seen["fds"]
    assert seen["pgid"] == (tool_pgid or seen["pid"]), seen


_GLIBCS_OWN = (1 << (32 - 1)) | (1 << (33 - 1))


def assert_no_marks(host: Host) -> None:
    """The hostile libraries marked none of the agent's processes."""
    marks = (host.outbox / "marks").read_text().split("\n")
    assert not [m for m in marks if m.endswith(f" {host.user.uid}")], marks


# ------------------------------------------------------------------------ ctx run and workers


def test_native_terminal_worker_and_hooks_get_one_process_state_and_the_documented_env(
    host: Host, hostile: dict[str, str]
) -> None:
    """T-3, T-5, T-6, docs/tools.md "Environment", "Hooks": a caller under umask 027, a soft
    descriptor limit of 300, SIGUSR1 and SIGPIPE ignored, SIGUSR2 and SIGINT blocked, a file
    held open, and a hostile environment runs the probe natively, in terminal mode and
    through ``ctx queue work``; the tool and its pre- and post-hooks of each see the same
    process state (the agent's ids, the workspace, the caller's umask and limit, no signal
    blocked, SIGPIPE at its default, three descriptors, a group of their own) and exactly the
    documented variables, with one ``CTX_CALL`` per call shared by the tool and its hooks."""
    host.install_probe()
    held_path = host.top / "held-by-caller"
    held_path.write_text("caller's open file\n")
    with open(held_path) as held:
        native = host.ctx("run", "--agent", "coder", "--native", TOOL, input=b'{"n": 1}',
                          env=hostile, caller=odd_caller(), pass_fds=(held.fileno(),))  # fmt: skip
        terminal = host.ctx("run", "--agent", "coder", TOOL, "one", "--two",
                            env=hostile, caller=odd_caller(), pass_fds=(held.fileno(),),
                            stdin=subprocess.DEVNULL)  # fmt: skip
    assert native.rc == 0, native
    result = frames(native)[-1]
    assert result["status"] == "ok", result
    tool = result["output"]
    assert tool["stdin"] == '{"n": 1}\n' and tool["argv"] == [], tool
    assert_environment(host, tool, "native")
    assert_process(host, tool)
    assert tool["env"]["CTX_CALL"] == result["call"] and tool["env"]["CTX_SESSION"] == "default"

    assert terminal.rc == 0, terminal
    seen_terminal = json.loads(terminal.out)
    assert [bytes.fromhex(a) for a in seen_terminal["argv"]] == [b"one", b"--two"]
    assert_environment(host, seen_terminal, "terminal")
    assert_process(host, seen_terminal)
    assert seen_terminal["fds"]["0"] == "/dev/null", seen_terminal["fds"]
    terminal_call = host.log()[-1]["call"]
    assert seen_terminal["env"]["CTX_CALL"] == terminal_call

    published = host.ctx("queue", "publish", "--project", "proj", "-", input=json.dumps(
        {"tool": TOOL, "input": {"w": 1}, "from": "tester",
         "created": "2026-06-22T12:00:00Z"}).encode())  # fmt: skip
    assert published.rc == 0, published
    job = published.out.strip()
    worked = host.ctx("queue", "work", "--project", "proj", "--agent", "coder", "--drain",
                      env=hostile, caller=odd_caller())  # fmt: skip
    assert worked.rc == 0, worked
    done = host.storage / "shared" / "proj" / "queue" / "done" / f"{job}.result"
    job_result = json.loads(done.read_text())
    worker_tool = job_result["output"]
    assert worker_tool["stdin"] == '{"w": 1}\n', worker_tool
    assert_environment(host, worker_tool, "native")
    assert_process(host, worker_tool)
    assert worker_tool["env"]["CTX_SESSION"] == "worker", worker_tool["env"]

    calls = {"native": (tool, result["call"]), "terminal": (seen_terminal, terminal_call),
             "worker": (worker_tool, job_result["call"])}  # fmt: skip
    for how, (seen, call) in calls.items():
        mode = "terminal" if how == "terminal" else "native"
        for phase in ("pre", "post"):
            hook = host.hook_seen(phase, call)
            assert [bytes.fromhex(a) for a in hook["argv"]] == [b"hook"], hook
            assert_environment(host, hook, mode, hook=phase)
            assert_process(host, hook)
            same = {k: v for k, v in hook["env"].items() if k not in ("CTX_HOOK", "PWD")}
            assert same == {k: v for k, v in seen["env"].items() if k != "PWD"}, (how, phase)
    # One view of the agent in every way of running it.
    for key in ("CTX_MOUNTS", "CTX_PATH", "CTX_CWD", "HOME"):
        assert len({seen["env"][key] for seen, _ in calls.values()}) == 1, key
    assert_no_marks(host)
    for seen, _ in calls.values():
        for value in hostile_values(hostile):
            assert value not in seen["env"].values(), value


def test_a_real_preload_and_python_path_act_on_ctx_itself_but_never_on_the_agent(
    host: Host, hostile: dict[str, str]
) -> None:
    """T-5: the caller's ``LD_PRELOAD`` (a library that works) and ``PYTHONPATH`` (with a
    ``sitecustomize``) are the caller's business: they are loaded by ``ctx`` itself, as root,
    which shows they were in effect; no process of the agent's uid — the tool, a Python it
    starts without ``-I``, its hooks — ever loads them, natively or in terminal mode."""
    if "missing-preload" in hostile["LD_PRELOAD"]:
        pytest.skip("no C compiler to build a preload library")
    host.install_probe()
    native = host.ctx("run", "--agent", "coder", "--native", TOOL, input=b"{}", env=hostile)
    assert native.rc == 0, native
    terminal = host.ctx("run", "--agent", "coder", TOOL, env=hostile, stdin=subprocess.DEVNULL)
    assert terminal.rc == 0, terminal
    marks = (host.outbox / "marks").read_text().split("\n")
    assert "preload 0" in marks and "sitecustomize 0" in marks, marks  # ctx as root
    assert_no_marks(host)


def test_variables_as_large_as_the_kernel_passes_stay_with_the_caller(host: Host) -> None:
    """T-5, docs/tools.md "Environment" ("nothing from the host's"): a caller holding one
    variable of the largest size one string may have (128 KiB with its name) and a megabyte
    more of them runs the probe natively and in terminal mode, and the tool gets exactly
    the documented variables; the calls are recorded without them."""
    host.install_probe(hooks=False)
    biggest = "HUGE_ONE=" + "h" * (131072 - len("HUGE_ONE=") - 1)
    name, value = biggest.split("=", 1)
    big = {name: value, **{f"BIG_{n}": chr(ord("a") + n) * 100_000 for n in range(10)}}
    native = host.ctx("run", "--agent", "coder", "--native", TOOL, input=b"{}", env=big)
    assert native.rc == 0, native.err[-500:]
    seen = frames(native)[-1]["output"]
    assert_environment(host, seen, "native")
    terminal = host.ctx("run", "--agent", "coder", TOOL, env=big, stdin=subprocess.DEVNULL)
    assert terminal.rc == 0, terminal.err[-500:]
    assert_environment(host, json.loads(terminal.out), "terminal")
    records = (host.session("default") / "events.jsonl").read_text()
    records += (host.storage / "tool" / f"{TOOL}.d" / "log").read_text()
    assert "h" * 1000 not in records and "BIG_0" not in records


def test_argv_is_passed_byte_for_byte_in_terminal_mode_and_empty_natively(host: Host) -> None:
    """T-3 ("argv kept"), docs/tools.md "Terminal CLI mode" ("every word after TOOL is the
    tool's argv, passed exactly as given", an empty argv too): empty words, dashes, options
    of ``ctx run`` itself, blanks, newlines, shell syntax, non-ASCII and bytes that are not
    UTF-8 reach the tool as given; a native call's argv is empty; argv[0] is the tool's
    executable in both modes; the terminal call is recorded with as many words."""
    host.install_probe(hooks=False)
    words = [b"", b"-", b"--", b"--native", b"--help", b"a b", b"x\ny", b"$HOME", b"*",
             "\u00e9\u2713".encode(), b"\xff\xfe"]  # fmt: skip
    terminal = host.ctx("run", "--agent", "coder", TOOL, *words, stdin=subprocess.DEVNULL)
    assert terminal.rc == 0, terminal
    seen = json.loads(terminal.out)
    assert [bytes.fromhex(a) for a in seen["argv"]] == words, seen["argv"]
    executable = str(host.storage / "tool" / TOOL)
    assert seen["argv0"] == executable, seen["argv0"]
    empty = host.ctx("run", "--agent", "coder", TOOL, stdin=subprocess.DEVNULL)
    assert empty.rc == 0 and json.loads(empty.out)["argv"] == [], empty
    native = host.ctx("run", "--agent", "coder", "--native", TOOL, input=b"{}")
    output = frames(native)[-1]["output"]
    assert (output["argv"], output["argv0"]) == ([], executable), output
    recorded = [e for e in host.log() if e.get("mode") == "terminal"]
    assert [len(e["argv"]) for e in recorded] == [len(words), 0], recorded
    assert recorded[0]["argv"][:3] == ["", "-", "--"], recorded[0]
    assert recorded[0]["argv"][9] == "\u00e9\u2713", recorded[0]


# ------------------------------------------------------------------------ on a terminal


@contextlib.contextmanager
def controlling_pty() -> Iterator[tuple[int, int]]:
    """A new pty: (master, slave)."""
    master, slave = pty.openpty()
    try:
        yield master, slave
    finally:
        os.close(master)
        os.close(slave)


def run_on_pty(host: Host, slave: int, *args: str) -> Run:
    """``ctx ARGS`` in a session of its own whose controlling terminal is ``slave`` (its
    stdin), stdout and stderr to pipes, as a job a shell runs in the foreground."""

    def lead() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = subprocess.run(
        [*CTX_ARGV, *args], stdin=slave, capture_output=True, env=host.env,
        preexec_fn=lead, timeout=60,
    )  # fmt: skip
    return Run(list(args), proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def test_on_a_terminal_a_terminal_mode_tool_leads_it_and_a_native_tool_never_has_it(
    host: Host,
) -> None:
    """T-3, docs/tools.md "Terminal CLI mode" ("on a terminal the tool becomes the foreground
    process group"): ``ctx run`` started on a terminal runs its terminal-mode tool with that
    terminal as its controlling terminal and its group as the foreground group; a native
    call from the same terminal, whose stdin is its input, runs in a session of its own
    without a controlling terminal."""
    host.install_probe(hooks=False)
    with controlling_pty() as (master, slave):
        device = os.stat(os.ttyname(slave)).st_rdev
        terminal = run_on_pty(host, slave, "run", "--agent", "coder", TOOL)
        assert terminal.rc == 0, terminal
        seen = json.loads(terminal.out)
        assert seen["tty_nr"] == device, seen
        assert seen["tpgid"] == seen["pgid"] == seen["pid"], seen
        os.write(master, b"{}\n\x04")
        native = run_on_pty(host, slave, "run", "--agent", "coder", "--native", TOOL)
        assert native.rc == 0, native
        output = frames(native)[-1]["output"]
        assert (output["tty_nr"], output["sid"]) == (0, output["pid"]), output
        assert output["stdin"] == "{}\n", output


# ------------------------------------------------------------------ the agent's terminal


@contextlib.contextmanager
def agent_terminal(host: Host, env: dict[str, str]) -> Iterator[tuple[str, Raw]]:
    """``ctx agent start coder`` under the odd caller with ``env``; an attached client at
    tsh's prompt; stopped at the end."""
    session = f"s{uuid.uuid4().hex[:10]}"
    started = host.ctx("agent", "start", "coder", "--session", session, "--json",
                       env=env, cwd=host.ws, caller=odd_caller())  # fmt: skip
    assert started.rc == 0, started
    client = None
    try:
        client = Raw(Path(started.json()["listening_at"]), b"attach\n")
        assert client.shows(AGENT_PROMPT), client.text()
        yield session, client
    finally:
        if client is not None:
            client.close()
        host.ctx("agent", "stop", "coder", "--session", session)


def typed(client: Raw, line: str) -> dict:
    answer = client.answer(line)
    return json.loads(answer[answer.index("{") : answer.rindex("}") + 1])


@needs_terminal
def test_a_tool_typed_at_tsh_gets_the_terminal_environment_and_the_starters_process_state(
    host: Host, hostile: dict[str, str]
) -> None:
    """A-1, H-1, T-3, T-6: an operator with a hostile environment, umask 027 and a soft
    descriptor limit of 300 starts the terminal; a tool typed at tsh gets its words as typed,
    the terminal environment (``TERM`` the operator's plain terminfo name, as tsh's own),
    ``/workspace`` behind its working directory, the agent's ids, the starter's umask and
    limit, no signal blocked, and the PTY on its three descriptors only; its hooks
    see the same call in terminal mode.  No hostile library marks it."""
    host.install_probe()
    env = {**hostile, "TERM": "vt100"}
    with agent_terminal(host, env) as (session, client):
        seen = typed(client, "env.probe '' 'a b' --x \u00e9")
        tsh_env = Path(f"/proc/{tsh_of(session)}/environ").read_bytes().split(b"\0")
    assert [bytes.fromhex(a) for a in seen["argv"]] == [b"", b"a b", b"--x", "\u00e9".encode()]
    assert seen["argv0"] == str(host.storage / "tool" / TOOL), seen["argv0"]
    assert_environment(host, seen, "terminal")
    assert seen["env"]["TERM"] == "vt100" and b"TERM=vt100" in tsh_env, seen["env"]
    assert seen["env"]["CTX_SESSION"] == session, seen["env"]
    assert_process(host, seen)
    assert len(set(seen["fds"].values())) == 1, seen["fds"]
    assert seen["fds"]["0"].startswith("/dev/pts/"), seen["fds"]
    for value in hostile_values(env) - {"vt100"}:
        assert value not in seen["env"].values(), value
    call = seen["env"]["CTX_CALL"]
    for phase in ("pre", "post"):
        hook = host.hook_seen(phase, call)
        assert_environment(host, hook, "terminal", hook=phase)
        assert hook["env"]["TERM"] == "vt100" and hook["env"]["CTX_SESSION"] == session
        assert_process(host, hook)
    assert wait_for(lambda: any(e.get("call") == call for e in host.log()))
    assert_no_marks(host)


@needs_terminal
def test_a_tool_typed_at_tsh_leads_the_agents_terminal_as_on_any_terminal(host: Host) -> None:
    """H-5 (interactive shells are ordinary tools), T-3 and docs/tools.md ("on a terminal
    the tool becomes the foreground process group so that Ctrl-C and job control reach it";
    tsh's tools run by "the terminal-mode runner"): a tool typed at tsh, whose three
    descriptors are the agent's PTY, has that PTY as its controlling terminal and leads it,
    as the same tool started by ``ctx run`` on a terminal does — so that ``bash`` run from
    tsh has job control and a program may open ``/dev/tty``."""
    host.install_probe(hooks=False)
    with agent_terminal(host, {}) as (_, client):
        seen = typed(client, TOOL)
    pts = seen["fds"]["0"]
    assert pts.startswith("/dev/pts/"), seen["fds"]
    assert seen["tty_nr"] != 0, seen
    assert seen["tpgid"] == seen["pgid"], seen


# ------------------------------------------------------------------------ the MCP bridge


def test_an_mcp_server_runs_in_the_calls_group_with_the_calls_state_and_environment(
    host: Host, hostile: dict[str, str]
) -> None:
    """§10 M-4, docs/tools.md "MCP servers as tool sources" (the bridge "starts that server in
    the call's own process group"; "the server runs as the agent with the environment of the
    call plus the configuration's env"): a projected tool called natively and in terminal
    mode by the odd caller starts its server as the agent, in the call's process group, in
    the tool's working directory, under the caller's umask and limit, with only its three
    pipes, and with the call's documented variables (its ``CTX_CALL`` included) plus the
    configuration's ``env``; no hostile library marks it."""
    mcp = host.top / "mcp"
    mcp.mkdir(mode=0o755)
    (mcp / "server.py").write_text(MCP_SERVER)
    config = mcp / "mcp.json"
    entry = {"command": "/usr/bin/python3", "args": [str(mcp / "server.py")],
             "env": {"SERVER_SETTING": "from-config"}}  # fmt: skip
    config.write_text(json.dumps({"mcpServers": {"probe": entry}}))
    host.install(
        {"manifest": 2, "kind": "tool", "name": "probe.attrs", "description": "Attributes.",
         "schema": {"type": "object"}, "cap": {"side_effects": False, "network": False},
         "mcp": {"transport": "stdio", "config": str(config), "server": "probe",
                 "tool": "attrs"}},
        "probe.attrs",
    )  # fmt: skip
    host.grant("probe.attrs")
    with open(host.storage / "agent" / "coder.d" / "mount", "r+") as mounts:
        table = json.load(mounts)
        table.append([str(mcp), str(mcp), "ro"])
        mounts.seek(0)
        mounts.truncate()
        json.dump(table, mounts)
    with open(host.storage / "agent" / "coder.d" / "policy", "a") as policy:
        policy.write("allow coder_t mount:mcp read\n")

    native = host.ctx("run", "--agent", "coder", "--native", "probe.attrs", input=b"{}",
                      env=hostile, caller=odd_caller())  # fmt: skip
    assert native.rc == 0, native
    call_frame, result = frames(native)[0], frames(native)[-1]
    server = json.loads(result["output"]["content"][0]["text"])
    terminal = host.ctx("run", "--agent", "coder", "probe.attrs", "{}",
                        env=hostile, caller=odd_caller(), stdin=subprocess.DEVNULL)  # fmt: skip
    assert terminal.rc == 0, terminal
    server_terminal = json.loads(terminal.out)
    assert server["pgid"] == call_frame["pid"], (server, call_frame)
    assert server["env"]["CTX_CALL"] == result["call"], server["env"]
    assert server_terminal["pgid"] == server_terminal["ppid"], server_terminal
    for seen, mode in ((server, "native"), (server_terminal, "terminal")):
        user = host.user
        assert (seen["uid"], seen["gid"]) == (user.uid, user.gid), seen
        assert seen["groups"] == sorted(user.groups), seen
        assert seen["cwd"] == os.path.realpath(host.ws), seen
        assert seen["umask"] == CALLER_UMASK and seen["nofile"][0] == CALLER_NOFILE, seen
        assert sorted(seen["fds"]) == ["0", "1", "2"], seen["fds"]
        assert all(target.startswith("pipe:") for target in seen["fds"].values()), seen["fds"]
        env = dict(seen["env"])
        assert env.pop("SERVER_SETTING") == "from-config", env
        env.pop("LC_CTYPE", None)  # Python's own locale coercion (PEP 538) may add it
        expected = DOCUMENTED | ({"TERM"} if mode == "terminal" else set())
        assert set(env) == expected, sorted(set(env) ^ expected)
        assert (env["CTX_TOOL"], env["CTX_MODE"], env["CTX_AGENT"]) == ("probe.attrs", mode,
                                                                        "coder")  # fmt: skip
        for value in hostile_values(hostile):
            assert value not in env.values(), value
    assert_no_marks(host)
