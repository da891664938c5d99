"""A script author drives ``ctx``, ``ctxmcp`` and ``ctxterm`` with ``--json`` and relies on
machine-readable failures: for each refusal an exact exit status (SPEC §2.4: 1 refused,
2 usage error), exactly one JSON error object on stdout of one shape whatever the command
(``{"error", "errno", "message"}``, README), the same error as a sentence on stderr, and
nothing half-done in the storage root — for refusals of a job's state (EEXIST, ENOENT),
bad input (EINVAL), another uid (EACCES), the storage root chosen by option or environment
(R-1), and a standard output closed before the answer could be written."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, REPO, clean_env, scratch_top, snapshot, tool_manifest
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
CTXMCP = str(REPO / ".venv" / "bin" / "ctxmcp")
ERROR_KEYS = {"error", "errno", "message"}


@dataclass
class Answer:
    argv: list[str]
    rc: int
    out: str
    err: str

    def __repr__(self) -> str:
        return (
            f"$ {' '.join(self.argv)}\nexit {self.rc}\nstdout: {self.out!r}\nstderr: {self.err!r}"
        )


@dataclass
class World:
    """One storage root for the module: queue ``proj`` holding ``pend`` (pending), ``held``
    (claimed, leased to pid 1 for an hour) and ``fin`` (done); agent ``bob`` (runs as
    nobody) with a session; and the input files a script would hand the commands."""

    top: Path
    storage: Path
    files: Path
    before: dict

    def env(self, **extra: str) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage), **extra)

    def argv(self, program: str, words: list[str]) -> list[str]:
        words = [w.format(s=self.storage, f=self.files, top=self.top) for w in words]
        head = {
            "ctx": CTX_ARGV,
            "ctxmcp": [CTXMCP],
            "ctxterm": [str(self.storage / "bin" / "ctxterm")],
        }
        return [*head[program], *words]

    def changes(self) -> list[str]:
        """What changed in the root since it was made; a refused tsh.config call is still a
        call, which T-7 logs in the tool's log."""
        now = snapshot(self.storage)
        changed = {k for k in now.keys() | self.before.keys() if now.get(k) != self.before.get(k)}
        return sorted(changed - {"tool/tsh.config.d/log"})


def run(argv: list[str], *, env: dict[str, str], stdin: str = "", cwd: Path | None = None):
    done = subprocess.run(
        argv, input=stdin.encode(), capture_output=True, env=env, cwd=cwd, timeout=60
    )
    return Answer(argv, done.returncode, done.stdout.decode(), done.stderr.decode())


def must(answer: Answer) -> Answer:
    assert answer.rc == 0, answer
    return answer


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    SCRATCH.mkdir(exist_ok=True)
    SCRATCH.chmod(0o755)
    top = Path(tempfile.mkdtemp(prefix="world-", dir=SCRATCH))
    top.chmod(0o755)
    storage, files = top / "storage", top / "files"
    files.mkdir()
    env = clean_env(CTX_STORAGE=str(storage))
    ctx = [*CTX_ARGV]
    try:
        must(run([*ctx, "bootstrap"], env=env))
        must(run([*ctx, "queue", "init", "--project", "proj"], env=env))
        request = json.dumps({"tool": "fs.stat", "input": {"path": "/"}})
        (files / "request.json").write_text(request)
        for name in ("held", "fin"):
            must(run([*ctx, "queue", "publish", "--project", "proj", "--name", name, "-"],
                     env=env, stdin=request))  # fmt: skip
            claimed = must(run([*ctx, "queue", "claim", "--project", "proj", "--pid", "1",
                                "--ttl", "3600"], env=env))  # fmt: skip
            assert claimed.out == f"{name}.req.json\n", claimed
        must(run([*ctx, "queue", "finish", "--project", "proj", "fin", "--ok"], env=env))
        must(run([*ctx, "queue", "publish", "--project", "proj", "--name", "pend", "-"],
                 env=env, stdin=request))  # fmt: skip
        (files / "bob.json").write_text('{"name": "bob", "label": "bob_t"}')
        (files / "carol.json").write_text('{"name": "carol", "label": "carol_t"}')
        must(run([*ctx, "agent", "create", str(files / "bob.json")], env=env))
        # a call refused by the chain is recorded all the same: bob has a session
        called = run([*ctx, "run", "--agent", "bob", "fs.stat", "/"], env=env)
        assert called.rc == 126, called

        (files / "not-json").write_text("{broken")
        (files / "no-tool.json").write_text('{"input": {}}')
        (files / "bad-name.json").write_text('{"name": "x/y", "label": "x_t"}')
        (files / "error-result.json").write_text('{"status": "error", "output": 1}')
        tool_manifest(files / "manifests", "flows.echo", "#!/bin/sh\ncat\n")
        (files / "manifests" / "flows.echo.sh").chmod(0o755)
        core = json.loads((files / "manifests" / "flows.echo.json").read_text())
        core["name"] = "fs.read"
        (files / "manifests" / "fs.read.json").write_text(json.dumps(core))
        (files / "manifests" / "half.json").write_text('{"manifest": 2}')
        (files / "bad.policy").write_text("allow x_t nonsense:y execute\n")
        marker = files / "server-started"
        servers = {
            "time": {"command": "/bin/sh", "args": ["-c", f": > {marker}"]},
            "a.b": {"command": "/bin/sh", "args": ["-c", f": > {marker}"]},
        }
        (files / "mcp.json").write_text(json.dumps({"mcpServers": servers}))
        (files / "broken-mcp.json").write_text("{broken")
        for path in [files, *files.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o555 if path.is_dir() else 0o644)
        (files / "manifests" / "flows.echo.sh").chmod(0o755)
        yield World(top, storage, files, snapshot(storage))
    finally:
        shutil.rmtree(top, ignore_errors=True)


def error_object(program: str, answer: Answer, errno_name: str) -> dict:
    """stdout is one JSON document, on one line: the error object of README's shape, its
    errno number that of its name; stderr says the same error as a sentence."""
    assert "Traceback" not in answer.err + answer.out, answer
    lines = answer.out.splitlines()
    assert len(lines) == 1, answer
    document = json.loads(lines[0])
    assert isinstance(document, dict) and set(document) == ERROR_KEYS, answer
    assert document["error"] == errno_name, answer
    assert document["errno"] == getattr(errno, errno_name), answer
    message = document["message"]
    assert isinstance(message, str) and len(message.split()) >= 3, answer
    said = False
    for line in answer.err.splitlines():
        head, sep, sentence = line.partition(f": {errno_name}: ")
        if not sep:
            continue
        assert head == program or re.fullmatch(r".+:\d+", head), answer  # PROG or FILE:LINE
        said = said or (
            message.startswith(sentence)
            or sentence.endswith(message)
            or f"{head}: {sentence}" == message
        )
    assert said, answer
    return document


# --- 1. every refusal, one error object, nothing changed ------------------------------------

P = pytest.param
REFUSALS = [
    # EEXIST: a name with evidence anywhere is never published again, a done job is
    # never finished again (docs/queue.md), a core tool's name is bootstrap's (docs/tools.md)
    P("ctx", ["queue", "publish", "--project", "proj", "--name", "pend", "{f}/request.json"],
      1, "EEXIST", id="publish-over-pending"),
    P("ctx", ["queue", "publish", "--project", "proj", "--name", "held", "{f}/request.json"],
      1, "EEXIST", id="publish-over-claimed"),
    P("ctx", ["queue", "publish", "--project", "proj", "--name", "fin", "{f}/request.json"],
      1, "EEXIST", id="publish-over-done"),
    P("ctx", ["queue", "finish", "--project", "proj", "fin", "--ok"], 1, "EEXIST",
      id="finish-a-done-job"),
    P("ctx", ["object", "install", "{f}/manifests/fs.read.json", "--tier", "system"], 1,
      "EEXIST", id="install-a-core-tool-name"),
    # ENOENT: jobs, sessions and agents the root does not have (docs/queue.md: exit 1)
    P("ctx", ["queue", "finish", "--project", "proj", "pend", "--ok"], 1, "ENOENT",
      id="finish-a-pending-job"),
    P("ctx", ["queue", "renew", "--project", "proj", "fin"], 1, "ENOENT", id="renew-a-done-job"),
    P("ctx", ["queue", "show", "--project", "proj", "nosuch"], 1, "ENOENT",
      id="show-an-unknown-job"),
    P("ctx", ["session", "show", "bob", "nosuch"], 1, "ENOENT", id="show-an-unknown-session"),
    P("ctxterm", ["nosuch"], 1, "ENOENT", id="ctxterm-an-unknown-agent"),
    # ctxmcp: 2 for a configuration or server name that cannot be used (docs/tools.md)
    P("ctxmcp", ["list", "--config", "{f}/nosuch.json", "--server", "time"], 2, "ENOENT",
      id="ctxmcp-a-missing-config"),
    P("ctxmcp", ["list", "--config", "{f}/mcp.json", "--server", "nosuch"], 2, "ENOENT",
      id="ctxmcp-an-unknown-server"),
    # EACCES: a lease is renewed by its holder only (§2.4)
    P("ctx", ["queue", "renew", "--project", "proj", "held"], 1, "EACCES",
      id="renew-another-holders-lease"),
    # EINVAL: input that cannot be used
    P("ctx", ["queue", "publish", "--project", "proj", "{f}/not-json"], 1, "EINVAL",
      id="publish-not-json"),
    P("ctx", ["queue", "publish", "--project", "proj", "{f}/no-tool.json"], 1, "EINVAL",
      id="publish-without-a-tool"),
    P("ctx", ["queue", "finish", "--project", "proj", "held", "--ok", "{f}/error-result.json"],
      2, "EINVAL", id="finish-ok-with-an-error-result"),
    P("ctx", ["queue", "claim", "--project", "proj", "--ttl", "nan"], 2, "EINVAL",
      id="claim-a-lease-of-nan-seconds"),
    P("ctx", ["agent", "create", "{f}/not-json"], 1, "EINVAL", id="create-not-json"),
    P("ctx", ["agent", "create", "{f}/bad-name.json"], 1, "EINVAL",
      id="create-an-illegal-name"),
    P("ctx", ["object", "install", "{f}/manifests/half.json", "--tier", "system"], 1, "EINVAL",
      id="install-half-a-manifest"),
    P("ctx", ["object", "install", "{f}/manifests/flows.echo.json", "--tier", "nowhere"], 2,
      "EINVAL", id="install-into-an-unknown-tier"),
    P("ctx", ["tool", "--json", "tsh.config", "bogus=1"], 2, "EINVAL",
      id="tsh-config-an-unknown-setting"),
    P("ctx", ["policy", "query", "--policy", "{f}/bad.policy", "x_t", "tool:y", "execute"], 2,
      "EINVAL", id="query-a-malformed-policy"),
    P("ctx", ["policy", "explain", "bob", "nonsense:y", "execute"], 2, "EINVAL",
      id="explain-an-unknown-class"),
    P("ctx", ["shared", "create", "cortexfs-docs"], 2, "EINVAL", id="create-the-manual-space"),
    P("ctx", ["session", "list", "bob", "--project", "../x"], 2, "EINVAL",
      id="sessions-of-an-illegal-space"),
    P("ctxterm", ["bad/name"], 2, "EINVAL", id="ctxterm-an-illegal-agent"),
    P("ctxmcp", ["list", "--config", "{f}/broken-mcp.json", "--server", "time"], 2, "EINVAL",
      id="ctxmcp-a-broken-config"),
    P("ctxmcp", ["list", "--config", "{f}/mcp.json", "--server", "a.b"], 2, "EINVAL",
      id="ctxmcp-a-dotted-server"),
    P("ctxmcp", ["project", "--config", "{f}/mcp.json", "--server", "time", "--runtime-config",
                 "/mcp/mcp.json", "--out", "{s}/shared/out"], 2, "EINVAL",
      id="ctxmcp-out-inside-the-root"),
]  # fmt: skip


@pytest.mark.parametrize(("program", "words", "rc", "errno_name"), REFUSALS)
def test_each_refusal_is_one_error_object_of_one_shape_and_changes_nothing(
    world: World, tmp_path: Path, program: str, words: list[str], rc: int, errno_name: str
) -> None:
    """§2.4 and README ("with --json, the same error is also one object on stdout"), Q-1,
    Q-4, R-3, P-8, M-1: a refusal for a job's state, a name the root does not have, or input
    that cannot be used exits with its documented status and prints exactly one
    ``{"error", "errno", "message"}`` object whatever the program, the errno number matching
    its name; stderr says the same sentence; no file of the root, the current directory or
    the MCP server is touched."""
    here = tmp_path / "here"
    here.mkdir()
    argv = world.argv(program, [*words, "--json"] if "--json" not in words else words)
    answer = run(argv, env=world.env(), cwd=here)

    assert answer.rc == rc, answer
    error_object(program, answer, errno_name)
    assert world.changes() == [], answer
    assert os.listdir(here) == [] and not (world.top / "out").exists()
    assert not (world.files / "server-started").exists(), "the MCP server was started"
    assert not (world.storage / "shared" / "out").exists()
    inbox = world.storage / "shared" / "proj" / "queue" / "inbox"
    assert os.listdir(inbox) == [], "a temp file was left in the staging directory"


# --- 2. another uid -------------------------------------------------------------------------

AS_ANOTHER_UID = [
    P("ctx", ["agent", "create", "{f}/carol.json"], id="agent-create"),
    P("ctx", ["object", "install", "{f}/manifests/flows.echo.json", "--tier", "system"],
      id="object-install"),
    P("ctx", ["shared", "create", "team"], id="shared-create"),
    P("ctx", ["queue", "init", "--project", "team"], id="queue-init"),
    P("ctx", ["queue", "publish", "--project", "proj", "{f}/request.json"], id="queue-publish"),
    P("ctx", ["queue", "finish", "--project", "proj", "held", "--ok"], id="queue-finish"),
    P("ctx", ["queue", "renew", "--project", "proj", "held"], id="queue-renew"),
    P("ctx", ["bootstrap"], id="bootstrap"),
    P("ctx", ["tool", "--json", "tsh.config", "cache_capacity=40"], id="tsh-config"),
    P("ctx", ["session", "show", "bob"], id="session-show"),
    P("ctx", ["session", "repair", "bob"], id="session-repair"),
    P("ctxterm", ["bob"], id="ctxterm"),
]  # fmt: skip


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
@pytest.mark.parametrize(("program", "words"), AS_ANOTHER_UID)
def test_another_uid_is_refused_with_eacces_in_one_object_and_leaves_no_trace(
    world: World, unprivileged_user: UnprivilegedUser, program: str, words: list[str]
) -> None:
    """P-5 step 1-2, A-3, T-8, X-1, §2.4: an ordinary uid that may not write the root's
    administrator-owned directories (tool/, shared/, the queue, another uid's session) is
    refused with EACCES, exit 1, one error object on stdout and the remedy on stderr, and
    nothing it could have started is left: no job, no agent, no tool, no file of its uid."""
    argv = world.argv(program, [*words, "--json"] if "--json" not in words else words)
    answer = run_as(unprivileged_user, argv, env=world.env(HOME="/nonexistent"), cwd=Path("/"))
    answer = Answer(argv, answer.returncode, answer.stdout, answer.stderr)

    assert answer.rc == 1, answer
    message = error_object(program, answer, "EACCES")["message"]
    assert "run it as" in message or "only the holder" in message or "changes it with" in message
    assert world.changes() == [], answer
    mine = [p for p in world.storage.rglob("*") if p.lstat().st_uid == unprivileged_user.uid]
    assert mine == []


# --- 3. the storage root the caller chose (R-1) -----------------------------------------------

# Commands that read the root: each is answered from the root named by ``ctx --storage``, the
# command's own --storage, or $CTX_STORAGE, in that order (R-1: either overrides the default).
READERS = [
    P("ctx", ["agent", "list"], 0, id="agent-list"),
    P("ctx", ["agent", "show", "bob"], 0, id="agent-show"),
    P("ctx", ["object", "list"], 0, id="object-list"),
    P("ctx", ["object", "which", "fs.read"], 0, id="object-which"),
    P("ctx", ["session", "list", "bob"], 0, id="session-list"),
    P("ctx", ["policy", "explain", "bob", "tool:fs.stat", "execute"], 1, id="policy-explain"),
    P("ctx", ["queue", "status", "--project", "proj"], 0, id="queue-status"),
    P("ctx", ["queue", "show", "--project", "proj", "held"], 0, id="queue-show"),
    P("ctxterm", ["bob"], None, id="ctxterm"),
]  # fmt: skip


@pytest.mark.parametrize(("program", "words", "answered"), READERS)
def test_a_root_named_on_the_command_line_is_never_replaced_by_the_environments(
    world: World, tmp_path: Path, program: str, words: list[str], answered: int | None
) -> None:
    """R-1 ("CTX_STORAGE or --storage DIR overrides it everywhere"), §2.4: a --storage that
    does not exist (the command's own, or ``ctx --storage`` before the command) is ENOENT
    naming it, exit 1, even with a usable $CTX_STORAGE; a $CTX_STORAGE that does not exist
    is ENOENT naming it; and a usable --storage is answered, in one JSON document that is no
    error object, whatever $CTX_STORAGE says.  The missing root is never made."""
    missing = tmp_path / "no-root"
    good = world.env()
    bad_env = clean_env(CTX_STORAGE=str(missing))
    own = world.argv(program, [*words, "--storage", str(missing), "--json"])
    ways = {
        "own --storage": (own, good),
        "CTX_STORAGE": (world.argv(program, [*words, "--json"]), bad_env),
    }
    if program == "ctx":
        ways["ctx --storage"] = (
            [*CTX_ARGV, "--storage", str(missing), *world.argv(program, [*words, "--json"])[1:]],
            good,
        )
    for way, (argv, env) in ways.items():
        answer = run(argv, env=env, cwd=tmp_path)
        assert answer.rc == 1, (way, answer)
        message = error_object(program, answer, "ENOENT")["message"]
        assert str(missing) in message, (way, answer)
        assert not missing.exists(), way

    if answered is not None:
        argv = world.argv(program, [*words, "--storage", str(world.storage), "--json"])
        answer = run(argv, env=bad_env, cwd=tmp_path)
        assert answer.rc == answered, answer
        document = json.loads(answer.out)
        assert len(answer.out.splitlines()) == 1, answer
        assert not (isinstance(document, dict) and "error" in document), answer
        assert not missing.exists()
    assert world.changes() == []


def test_ctxmcp_keeps_out_of_the_storage_root_the_caller_named_first(
    world: World, tmp_path: Path
) -> None:
    """M-1 and R-1: ctxmcp writes nothing under the storage root, which is ``--storage``,
    else $CTX_STORAGE — judged by name before the root exists: an --out inside either is
    EINVAL, exit 2, one error object, before the server starts and before anything is made."""
    chosen, from_env = tmp_path / "chosen-root", tmp_path / "env-root"
    base = ["project", "--config", "{f}/mcp.json", "--server", "time"]
    base += ["--runtime-config", "/mcp/mcp.json", "--json"]
    for argv, env, root in (
        (world.argv("ctxmcp", [*base, "--out", f"{chosen}/out", "--storage", str(chosen)]),
         clean_env(CTX_STORAGE=str(from_env)), chosen),
        (world.argv("ctxmcp", [*base, "--out", f"{from_env}/out"]),
         clean_env(CTX_STORAGE=str(from_env)), from_env),
    ):  # fmt: skip
        answer = run(argv, env=env, cwd=tmp_path)
        assert answer.rc == 2, answer
        message = error_object("ctxmcp", answer, "EINVAL")["message"]
        assert f"is inside {root}" in message, answer
    assert not chosen.exists() and not from_env.exists()
    assert not (world.files / "server-started").exists(), "the MCP server was started"


# --- 4. a standard output closed before the answer ----------------------------------------------

CLOSED_STDOUT = [
    P(["queue", "init", "--project", "fresh"], id="init"),
    P(["queue", "publish", "--project", "proj", "--name", "lost", "{f}/request.json"],
      id="publish"),
    P(["queue", "claim", "--project", "proj"], id="claim"),
    P(["queue", "finish", "--project", "proj", "held", "--ok"], id="finish"),
    P(["queue", "recover", "--project", "proj", "--reconcile"], id="recover"),
    P(["queue", "status", "--project", "proj"], id="status"),
]  # fmt: skip


@pytest.mark.parametrize("words", CLOSED_STDOUT)
def test_a_queue_command_asked_for_json_with_stdout_closed_does_nothing(
    world: World, words: list[str]
) -> None:
    """§2.4, docs/queue.md ("every command given --json, exit 1 with EBADF on stderr before
    anything is published, claimed, finished or recovered"): a script that forgot its
    redirection learns it from the exit status, and no job moved that it could not learn of."""
    argv = world.argv("ctx", [*words, "--json"])
    done = subprocess.run(
        ["/bin/sh", "-c", '"$@" >&-', "sh", *argv],
        capture_output=True,
        env=world.env(),
        timeout=60,
    )
    answer = Answer(argv, done.returncode, done.stdout.decode(), done.stderr.decode())
    assert answer.rc == 1, answer
    assert answer.err.startswith("ctx: EBADF: standard output is closed"), answer
    assert "Traceback" not in answer.err
    assert world.changes() == [], answer
    assert not (world.storage / "shared" / "fresh").exists()


# --- 5. a file name that holds a line break --------------------------------------------------


def test_a_file_name_with_a_line_break_never_splits_or_forges_an_error_line(
    world: World, tmp_path: Path
) -> None:
    """P-8 ("one line per error on stderr: FILE:LINE: EINVAL: <reason>"), T-8: a linter-style
    consumer reads one error per stderr line, so a file name holding a newline is written
    escaped (as ``ctx object install`` writes it, ``\\x0a``): it never splits an error line,
    nor forges one naming another file, while --json keeps the name as it is."""
    forged = "x.policy:9: EINVAL: forged"
    policy = tmp_path / f"evil\n{forged}"
    policy.write_text("allow x_t nonsense:y execute\n")
    manifest = tmp_path / "half\nx.json"
    manifest.write_text('{"manifest": 2}')
    env = world.env()
    install = run(
        [*CTX_ARGV, "object", "install", str(manifest), "--tier", "user", "--json"], env=env
    )
    assert install.rc == 1 and "half\\x0ax.json" in install.err, install  # the escaped form
    query = ["policy", "query", "--policy", str(policy), "x_t", "tool:y", "execute", "--json"]
    answers = {
        "policy check": run([*CTX_ARGV, "policy", "check", str(policy), "--json"], env=env),
        "policy query": run([*CTX_ARGV, *query], env=env),
        "object check": run([*CTX_ARGV, "object", "check", str(manifest), "--json"], env=env),
    }
    assert json.loads(answers["policy check"].out)["files"][0]["file"] == str(policy)
    wrong = []
    for what, answer in answers.items():
        for line in answer.err.splitlines():
            if not re.match(rf"{re.escape(str(tmp_path))}/\S.*: EINVAL: ", line):
                wrong.append(f"{what}: stderr line {line!r}")
    assert wrong == []
    assert world.changes() == []
