"""What the ``--help`` texts of ``ctx`` (every group and subcommand), ``ctxmcp``, ``bin/tsh``
and ``bin/ctxterm`` show, taken literally on a prepared storage root: the example commands
they print (``ctx policy explain coder tool:fs.read execute``, the two-layer ``ctx policy
query``, ``ctx tool tsh.config …``, the agent request of ``ctx agent create``, the "Next:"
commands of ``ctxmcp project``, ``ctx mount … &`` / ``ctx umount``, ``ctx agent start`` /
``watch`` / ``stop``), the exit statuses and ``--json`` keys they name, every option they list
(accepted by the parser), and every command or option they mention (which must exist).

SPEC ids: R-1, R-5 (bootstrap), §2.4 (queue CLI, exit statuses 0/1/2/3), W-1/W-2 (queue
work), P-8 (policy check/query), T-3 (ctx run modes), T-8/T-8a (object commands), H-3/H-4
(ctx tool, tsh.config), A-1/A-2/A-3 (agent create/start/watch/stop), S-5 (session repair),
X-1 (shared create), M-1/M-3 (ctxmcp), D-1 (ctx man), F-1 (mount)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    OnStorage,
    Run,
    clean_env,
    ctx_run,
    mounted_at,
    needs_fuse_as_root,
    new_scratch_dir,
    scratch_top,
    tool_manifest,
    wait_for,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
CTXMCP = str(REPO / ".venv" / "bin" / "ctxmcp")
TIME_SERVER = REPO / ".venv" / "bin" / "mcp-server-time"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid")
needs_terminal = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs root, bubblewrap and /dev/fuse",
)
needs_time_server = pytest.mark.skipif(
    not TIME_SERVER.exists(), reason="the venv has no mcp-server-time"
)


# --- helpers -------------------------------------------------------------------------------


def one_line(text: str) -> str:
    return " ".join(text.split())


@cache
def help_of(*path: str) -> str:
    """``ctx PATH… --help``, which must succeed."""
    shown = ctx_run(*path, "--help")
    assert shown.rc == 0 and shown.err == "", shown
    return shown.out


@cache
def ctxmcp_help(*path: str) -> str:
    shown = subprocess.run([CTXMCP, *path, "--help"], capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def subcommands(text: str) -> list[str]:
    """The names of a group's ``Commands:`` section."""
    found = re.search(r"\nCommands:\n(.*?)(?:\n\n|\Z)", text, re.S)
    if found is None:
        return []
    return [
        line.split()[0]
        for line in found.group(1).splitlines()
        if line.startswith("  ") and not line.startswith("    ")
    ]


OPTION_LINE = re.compile(
    r"^  ((?:-\w|--[\w-]+)(?:, (?:-\w|--[\w-]+))*)(?: ([^\s].*?))?(?:\s{2,}|$)"
)


def option_lines(text: str) -> dict[str, tuple[str | None, str]]:
    """Every option an ``Options:`` section lists, with its metavar (None for a flag) and
    the line that lists it."""
    listed: dict[str, tuple[str | None, str]] = {}
    for line in text.splitlines():
        found = OPTION_LINE.match(line)
        if found is None:
            continue
        # the names, metavar and first words of the description: the same for one option
        # that several commands share, however wide the column is
        shape = " ".join([found.group(0).strip(), *line[found.end() :].split()[:6]])
        for name in found.group(1).split(", "):
            listed[name] = (found.group(2), shape)
    return listed


def options(text: str) -> dict[str, str | None]:
    """Every option an ``Options:`` section lists, with its metavar (None for a flag)."""
    return {name: metavar for name, (metavar, _) in option_lines(text).items()}


def command_paths(prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command reached from ``ctx --help``, groups included, depth first."""
    yield prefix
    for name in subcommands(help_of(*prefix)):
        yield from command_paths((*prefix, name))


def leaves() -> list[tuple[str, ...]]:
    return [path for path in command_paths() if path and not subcommands(help_of(*path))]


@dataclass
class Host(OnStorage):
    """A storage root every uid may search, agent ``coder`` (label ``coder_t``, uid nobody)
    allowed fs.read and fs.stat on both layers, its workspace ``ws`` at ``/workspace`` and the
    queue of project ``proj``."""

    top: Path
    storage: Path
    ws: Path

    def write(self, name: str, text: str) -> Path:
        path = self.top / name
        path.write_text(text)
        path.chmod(0o644)
        return path


@pytest.fixture
def host(_template: Path) -> Iterator[Host]:
    top = new_scratch_dir(SCRATCH)
    storage = copy_of_root(_template, top / "storage")
    ws = top / "ws"
    ws.mkdir(mode=0o755)
    (ws / "a.txt").write_text("hello\n")
    (ws / "a.txt").chmod(0o644)
    made = Host(top, storage, ws)
    made.create_agent(
        {
            "name": "coder",
            "label": "coder_t",
            "tools": ["fs.read", "fs.stat"],
            "mount": [[str(ws), "/workspace", "rw"]],
        }
    )
    made.allow_tool("coder_t", "fs.read", "fs.stat")
    try:
        yield made
    finally:
        for session in ("default", "s1", "ro"):
            for agent in ("coder", "ro1"):
                if (storage / "agent" / agent).exists():
                    made.ctx("agent", "stop", agent, "--session", session)
        shutil.rmtree(top, ignore_errors=True)


# --- what the help texts name exists -------------------------------------------------------


def test_every_command_of_the_tree_answers_help_with_its_own_usage_line() -> None:
    paths = list(command_paths())
    assert {("queue", "claim"), ("policy", "explain"), ("session", "tail"), ("run",)} <= set(paths)
    for path in paths:
        text = help_of(*path)
        assert text.startswith(f"Usage: ctx {' '.join(path)}".replace("ctx  ", "ctx ")), path
    for path in [p for p in paths if len(p) < 2]:  # -h is --help, for ctx and each group
        short = ctx_run(*path, "-h")
        assert short.rc == 0 and short.out == help_of(*path), short
    for path in [(), ("list",), ("project",)]:
        assert ctxmcp_help(*path).startswith(f"Usage: ctxmcp {' '.join(path)}".rstrip())


REFERENCE = re.compile(
    r"'(ctx [a-z][^']*)'|\((ctx [a-z][^)]*)\)|^\s+(?:Example:\s+)?(ctx [a-z].*)$"
)


def references(text: str) -> list[str]:
    """Every ``ctx …`` command a help text quotes, puts in brackets or prints as an example
    (continuation lines joined, a trailing comment column cut)."""
    joined = re.sub(r"\\\n\s*", " ", text)
    found = []
    for line in joined.splitlines():
        for match in REFERENCE.finditer(line):
            command = next(group for group in match.groups() if group)
            found.append(re.split(r"\s{2,}", command.strip())[0])
    return found


def resolve(command: str) -> tuple[tuple[str, ...], list[str]]:
    """The command path ``command`` names and the option words it gives that command."""
    words = shlex.split(command)
    assert words[0] == "ctx"
    path: tuple[str, ...] = ()
    rest = words[1:]
    while rest and rest[0] in subcommands(help_of(*path)):
        path = (*path, rest.pop(0))
    return path, [word for word in rest if word.startswith("--")]


def all_help_texts(storage: Path) -> dict[str, str]:
    texts = {f"ctx {' '.join(path)}": help_of(*path) for path in command_paths()}
    texts |= {
        f"ctxmcp {' '.join(path)}": ctxmcp_help(*path) for path in [(), ("list",), ("project",)]
    }
    for program in ("tsh", "ctxterm"):
        shown = subprocess.run(
            [storage / "bin" / program, "--help"], capture_output=True, text=True, timeout=30
        )
        assert shown.returncode == 0, shown.stderr
        texts[program] = shown.stdout
    return texts


def test_every_ctx_command_a_help_text_names_exists_with_the_options_it_gives(
    storage: Path,
) -> None:
    checked = 0
    for where, text in all_help_texts(storage).items():
        for command in references(text):
            path, given = resolve(command)
            assert path, (where, command)
            leaf_or_group = help_of(*path)
            words = shlex.split(command)[1 + len(path) :]
            if subcommands(leaf_or_group):
                # a group is named alone ('ctx agent') or as 'ctx queue --help'
                assert all(word.startswith("-") for word in words), (where, command)
            known = options(leaf_or_group)
            for option in given:
                assert option.split("=")[0] in known, (where, command, option)
            checked += 1
    assert checked >= 25, checked  # the examples and remedies of the texts were found


def test_the_documents_the_help_texts_point_to_exist() -> None:
    texts = " ".join(help_of(*path) for path in command_paths())
    named = set(re.findall(r"docs/[a-z-]+\.md", texts))
    assert {"docs/tools.md", "docs/policy.md"} <= named
    for document in named:
        assert (REPO / document).is_file(), document
    assert "(README, 'Upgrading')" in one_line(help_of("bootstrap"))
    assert re.search(r"^#+ Upgrading", (REPO / "README.md").read_text(), re.M)


# --- every option a help lists is accepted --------------------------------------------------

# Operands that make each command end quickly and harmlessly whatever option it is given: an
# agent or job that does not exist, a mount point that does not exist, an empty queue drained.
OPERANDS: dict[tuple[str, ...], list[str]] = {
    ("agent", "attach"): ["nope"],
    ("agent", "create"): ["{top}/missing.json"],
    ("agent", "list"): [],
    ("agent", "show"): ["coder"],
    ("agent", "start"): ["nope"],
    ("agent", "stop"): ["nope"],
    ("agent", "watch"): ["nope"],
    ("bootstrap",): [],
    ("man",): ["agent"],
    ("mount",): ["{top}/no/such/mountpoint"],
    ("object", "check"): ["{top}/hello.json"],
    ("object", "install"): ["{top}/hello.json", "--tier", "user"],
    ("object", "list"): [],
    ("object", "which"): ["fs.read"],
    ("policy", "check"): ["{top}/policy"],
    ("policy", "explain"): ["coder", "tool:fs.read", "execute"],
    ("policy", "query"): ["--policy", "{top}/policy", "coder_t", "tool:fs.read", "execute"],
    ("queue", "claim"): [],
    ("queue", "finish"): ["nope.req.json"],
    ("queue", "init"): [],
    ("queue", "list"): [],
    ("queue", "publish"): ["{top}/request.json"],
    ("queue", "recover"): [],
    ("queue", "renew"): ["nope.req.json"],
    ("queue", "show"): ["nope.req.json"],
    ("queue", "status"): [],
    ("queue", "work"): ["--drain", "--agent", "coder"],
    ("run",): ["--agent", "coder"],
    ("session", "list"): ["coder"],
    ("session", "repair"): ["coder"],
    ("session", "show"): ["coder"],
    ("session", "tail"): ["coder"],
    ("shared", "create"): ["space1"],
    ("tool",): [],
    ("umount",): ["{top}/no/such/mountpoint"],
}
QUEUE_TARGET = ("-p", "--project", "--queue")
VALUES = {
    "--storage": "{storage}",
    "--source": "{storage}",
    "--workspace": "{ws}",
    "--queue": "{storage}/shared/proj/queue",
    "--policy": "{top}/policy",
    "--config": "{top}/mcp.json",
    "--out": "{top}/out",
    "--location": "tool",
    "--peer": "65534:65534",
    "--user": "nobody",
    "--gid": "65534",
    "--groups": "65534",
    "--group": "0",
    "--tier": "user",
    "--agent": "coder",
    "--as": "coder",
    "-p": "proj",
    "--project": "proj",
    "--runtime-config": "/mcp/mcp.json",
    "--server": "time",
    "--name": "j1",
    "--pid": "1",
    "--uid": "65534",
}
METAVARS = {"SECONDS": "5", "INTEGER RANGE": "1", "TEXT": "s1", "SESSION": "s1"}
REJECTIONS = ("No such option", "no such option", "Invalid value for", "requires an argument")


def option_value(option: str, metavar: str) -> str:
    if option in VALUES:
        return VALUES[option]
    if metavar.startswith("["):
        return metavar.strip("[]").split("|")[0]
    return METAVARS.get(metavar, "1")


def accepted(argv: list[str], env: dict[str, str], cwd: Path, stdin: str = "") -> Run:
    try:
        return ctx_run(*argv, env=env, cwd=cwd, input=stdin, timeout=1)
    except subprocess.TimeoutExpired:  # --follow keeps printing: it was accepted
        return Run(argv, 0, "", "")


def test_every_option_each_help_lists_is_accepted_by_its_command(host: Host) -> None:
    host.write("policy", "allow coder_t tool:fs.read execute\n")
    host.write("request.json", '{"tool": "fs.stat", "input": {"path": "/workspace"}}')
    tool_manifest(host.top, "hello", "#!/bin/sh\necho hi\n")
    fill = {"top": str(host.top), "storage": str(host.storage), "ws": str(host.ws)}
    assert ctx_run("queue", "init", "--project", "proj", env=host.env).rc == 0
    tried = 0
    assert set(OPERANDS) == set(leaves())  # every subcommand has its case
    seen: set[str] = set()  # an option listed with the same line elsewhere: the same option
    for path, operands in OPERANDS.items():
        for option, (metavar, line) in option_lines(help_of(*path)).items():
            if option in ("-h", "--help") or line in seen:
                continue
            seen.add(line)
            words = [option] if metavar is None else [option, option_value(option, metavar)]
            base = [word.format(**fill) for word in operands]
            if path[0] == "queue" and option not in QUEUE_TARGET:
                base += ["--project", "proj"]
            if path == ("queue", "finish") and option not in ("--ok", "--error"):
                base.append("--ok")
            if option == "--no-workspace":
                words = [option]
            if option == "--queue" and path[0] == "queue":
                base = [w for w in base if w != "proj" and w != "--project"]
            tail = ["fs.stat", "/workspace"] if path == ("run",) else []
            tail = ["tsh.config"] if path == ("tool",) else tail
            argv = [*path, *base, *[w.format(**fill) for w in words], *tail]
            done = accepted(argv, host.env, host.top)
            assert not any(word in done.err for word in REJECTIONS), done
            assert done.rc != 2 or ("EINVAL" in done.err and option not in done.err), done
            tried += 1
    assert tried > 40, tried


def test_every_option_the_ctxmcp_helps_list_is_accepted(host: Host) -> None:
    host.write("mcp.json", json.dumps({"mcpServers": {"other": {"command": "/bin/false"}}}))
    for sub in ("list", "project"):
        base = ["--config", str(host.top / "mcp.json"), "--server", "nope"]
        if sub == "project":
            base += ["--runtime-config", "/mcp/mcp.json", "--out", str(host.top / "out")]
        for option, metavar in options(ctxmcp_help(sub)).items():
            if option in ("-h", "--help") or option in base:
                continue
            value = [] if metavar is None else [option_value(option, metavar).format(
                top=host.top, storage=host.storage, ws=host.ws)]  # fmt: skip
            done = subprocess.run(
                [CTXMCP, sub, *base, option, *value], capture_output=True, text=True, timeout=30
            )
            assert not any(word in done.stderr for word in REJECTIONS), (option, done.stderr)
            # the server is not in the configuration: a usage error that names it
            assert "nope" in done.stderr, (option, done.stderr)


# --- the examples, run literally ------------------------------------------------------------


def test_policy_explain_example_walks_the_six_steps_the_help_lists(host: Host) -> None:
    text = help_of("policy", "explain")
    example = re.search(r"Example:\n\s+(ctx .*)\n", text)
    assert example is not None
    argv = shlex.split(example.group(1))[1:]
    steps = re.findall(r"^\s+(\d) ([a-z/ ]+?)\s{2,}", text, re.M)
    assert [number for number, _ in steps] == ["1", "2", "3", "4", "5", "6"]

    allowed = host.ctx(*argv)
    as_json = host.ctx(*argv, "--json")
    (host.storage / "tool" / "fs.read.d" / "policy").write_text("")
    denied = host.ctx(*argv)
    malformed = host.ctx("policy", "explain", "coder", "tool:fs.read", "exec")

    assert allowed.rc == 0, allowed
    for number, name in steps:
        assert re.search(rf"^\s+{number} {name}\s+pass", allowed.out, re.M), (name, allowed)
    assert [(s["step"], s["name"]) for s in as_json.json()["steps"]] == [
        (int(n), name) for n, name in steps
    ]
    assert denied.rc == 1 and "deny: EACCES: step 6 (tool/model policy)" in denied.out, denied
    assert malformed.rc == 2 and "EINVAL" in malformed.err, malformed


def test_policy_query_example_run_from_the_storage_root_as_printed(host: Host) -> None:
    text = help_of("policy", "query")
    example = re.search(r"Example:\n\s+(ctx .*?\\\n\s+.*)\n", text)
    assert example is not None
    argv = shlex.split(example.group(1).replace("\\\n", " "))[1:]

    allowed = host.ctx(*argv, cwd=host.storage)
    as_json = host.ctx(*argv, "--json", cwd=host.storage)
    (host.storage / "tool" / "fs.read.d" / "policy").write_text("# nothing\n")
    denied = host.ctx(*argv, cwd=host.storage)
    malformed = host.ctx(*argv[:-1], "run", "--json", cwd=host.storage)

    assert (allowed.rc, allowed.out) == (0, "allow\n"), allowed
    answer = as_json.json()
    assert set(answer) == {"decision", "rule", "policies"}, answer
    assert answer["decision"] == "allow" and answer["rule"] == "allow coder_t tool:fs.read execute"
    assert [set(p) for p in answer["policies"]] == [{"policy", "allows"}] * 2, answer
    assert (denied.rc, denied.out) == (1, "deny\n"), denied
    assert malformed.rc == 2 and malformed.json()["error"] == "EINVAL", malformed


def test_ctx_tool_examples_print_and_change_the_tsh_configuration(host: Host) -> None:
    examples = re.findall(r"(ctx tool tsh\.config[^\n]*?)(?:\s{2,}\S.*)?$", help_of("tool"), re.M)
    assert len(examples) == 2, examples
    show, change = (shlex.split(example)[1:] for example in examples)
    config = host.storage / "tool" / "tsh.d" / "config"

    before = host.ctx(*show)
    changed = host.ctx(*change)
    after = host.ctx("tool", "--json", "tsh.config")
    bad = host.ctx(*show, "no_such_setting=1")
    refused = host.ctx("tool", "fs.read", "/etc/passwd")
    missing = host.ctx("tool", "no.such")

    assert before.rc == 0 and "cache_capacity=32" in before.lines(), before
    assert changed.rc == 0 and {"cache_capacity=64", "window_percent=2"} <= set(changed.lines())
    assert "cache_capacity=64" in config.read_text().splitlines()
    assert after.json()["config"]["window_percent"] == 2, after
    assert bad.rc == 2 and "EINVAL" in bad.err, bad
    assert refused.rc == 1 and "EACCES" in refused.err and "ctx run --agent" in refused.err
    assert missing.rc == 1 and "ENOENT" in missing.err, missing


@needs_root
def test_the_agent_request_of_ctx_agent_create_help_creates_that_agent(host: Host) -> None:
    text = help_of("agent", "create")
    shown = re.search(r"REQUEST is one JSON object:\n(.*?)\n\n", text, re.S)
    assert shown is not None
    request = json.loads(shown.group(1))
    Path(request["mount"][0][0]).mkdir(exist_ok=True)
    path = host.write("reviewer.json", shown.group(1))

    made = host.ctx("agent", "create", path, "--json")
    again = host.ctx("agent", "create", path)
    as_root = host.ctx("agent", "create", "--user", "root", "-", input=shown.group(1))
    listed = host.ctx("agent", "list", "--json")
    policy = (host.storage / "agent" / "reviewer.d" / "policy").read_text().splitlines()

    assert made.rc == 0, made
    assert made.json()["identity"]["uid"] == 65534 and made.json()["default_user"] == "nobody"
    rules = {line for line in policy if line.startswith("allow ")}
    assert {
        "allow reviewer_t tool:fs.read execute",
        "allow reviewer_t model:openai/gpt-5.6 use",
        "allow reviewer_t shared:project-a read",
    } <= rules, policy
    assert again.rc == 1 and "EEXIST" in again.err, again  # never overwritten
    assert as_root.rc == 2 and "EINVAL" in as_root.err, as_root
    for entry in listed.json():
        assert set(entry) == {"name", "label", "identity", "problems"}, entry
    assert {entry["name"] for entry in listed.json()} == {"coder", "reviewer"}


@needs_root
def test_agent_create_as_another_user_runs_as_that_user_as_the_help_says(
    unprivileged_user: UnprivilegedUser, tmp_path: Path
) -> None:
    top = new_scratch_dir(SCRATCH, "u")
    try:
        os.chown(top, unprivileged_user.uid, unprivileged_user.gid)
        env = clean_env(CTX_STORAGE=str(top / "storage"))
        request = top / "r.json"
        request.write_text('{"name": "c2", "label": "c2_t"}')
        request.chmod(0o644)

        def as_user(*args: str):
            return run_as(unprivileged_user, [*CTX_ARGV, *args], env=env, cwd=top)

        assert as_user("bootstrap").returncode == 0
        mine = as_user("agent", "create", str(request), "--json")
        other = as_user("agent", "create", str(request), "--user", "nobody")
        root = as_user("agent", "create", str(request), "--user", "0")

        assert mine.returncode == 0, mine.stderr
        assert json.loads(mine.stdout)["identity"]["uid"] == unprivileged_user.uid
        assert other.returncode == 1 and "EPERM" in other.stderr, other.stderr
        assert root.returncode == 2 and "EINVAL" in root.stderr, root.stderr
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_the_queue_help_exit_statuses_are_each_reached(host: Host) -> None:
    statuses = re.search(r"Exit statuses: (.*?)\.\n\n", help_of("queue"), re.S)
    assert statuses is not None
    named = one_line(statuses.group(1))
    assert "0 success, 1 refused or conflict found, 2 usage error, 3 nothing to claim" in named
    host.ctx("queue", "init", "--project", "proj")
    q = ("--project", "proj")
    request = host.write("request.json", '{"tool": "fs.stat", "input": {"path": "/workspace"}}')

    published = host.ctx("queue", "publish", *q, "--name", "j1", request)
    again = host.ctx("queue", "publish", *q, "--name", "j1", request)
    usage = host.ctx("queue", "publish", *q, "--no-such-option", request)
    head = subprocess.run(
        f"{shlex.join(CTX_ARGV)} queue list {shlex.join(q)} | head -c0; exit ${{PIPESTATUS[0]}}",
        shell=True, executable="/bin/bash", env=host.env, capture_output=True, timeout=30,
    )  # fmt: skip
    with open("/dev/full", "w") as full:
        unwritable = subprocess.run(
            [*CTX_ARGV, "queue", "status", *q], env=host.env, stdout=full,
            stderr=subprocess.PIPE, text=True, timeout=30,
        )  # fmt: skip
    claimed = host.ctx("queue", "claim", *q)
    empty = host.ctx("queue", "claim", *q)
    empty_json = host.ctx("queue", "claim", *q, "--json")

    assert (published.rc, published.out) == (0, "j1.req.json\n"), published
    assert again.rc == 1 and "EEXIST" in again.err, again
    assert usage.rc == 2 and "EINVAL" in usage.err, usage
    assert "141 when the reader of the output left ('| head -1')" in named
    assert head.returncode == 141, head
    assert "74 when the output cannot be written ('> /dev/full')" in named
    assert unwritable.returncode == 74 and "ENOSPC" in unwritable.stderr, unwritable.stderr
    assert (claimed.rc, claimed.out) == (0, "j1.req.json\n"), claimed
    assert (empty.rc, empty.out) == (3, ""), empty
    assert empty_json.rc == 3, empty_json


def test_queue_status_json_has_exactly_the_keys_its_help_names(host: Host) -> None:
    text = one_line(help_of("queue", "status"))
    shown = re.search(r"With --json, one object: \{(.*?)\}\.", text)
    assert shown is not None
    named = set(re.findall(r'"(\w+)"', shown.group(1)))
    host.ctx("queue", "init", "--project", "proj")

    status = host.ctx("queue", "status", "--project", "proj", "--json")

    assert status.rc == 0, status
    assert set(status.json()) == named
    assert set(status.json()["counts"]) == {
        "pending", "claimed", "done", "failed", "conflict", "incomplete", "ignored",
    }  # fmt: skip


def test_queue_work_json_prints_the_events_its_help_names_and_max_jobs_stops_it(
    host: Host,
) -> None:
    text = one_line(help_of("queue", "work"))
    assert "each event (claim, finish, stop, ...) is one JSON object" in text
    q = ("--project", "proj")
    host.ctx("queue", "init", *q)
    lines = "".join(
        json.dumps({"tool": "fs.stat", "input": {"path": "/workspace/a.txt"}}) + "\n"
        for _ in range(3)
    )
    assert host.ctx("queue", "publish", *q, "--batch", "-", input=lines).rc == 0

    worked = host.ctx("queue", "work", *q, "--agent", "coder", "--max-jobs", "2", "--json")
    events = [json.loads(line) for line in worked.lines()]
    left = host.ctx("queue", "list", *q, "--state", "pending")

    assert worked.rc == 0, worked
    kinds = [event["event"] for event in events]
    assert kinds.count("claim") == 2 and kinds.count("finish") == 2 and kinds[-1] == "stop"
    assert all(e["state"] == "done" for e in events if e["event"] == "finish"), events
    assert len(left.lines()) == 1, left


def test_queue_work_stops_with_exit_0_on_the_signals_its_help_names(host: Host) -> None:
    host.ctx("queue", "init", "--project", "proj")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        worker = subprocess.Popen(
            [*CTX_ARGV, "queue", "work", "--project", "proj", "--agent", "coder", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=host.env, text=True,
        )  # fmt: skip
        assert json.loads(worker.stdout.readline())["event"] == "start"
        worker.send_signal(sig)
        out, err = worker.communicate(timeout=30)
        assert worker.returncode == 0, (sig, err)
        assert json.loads(out.splitlines()[-1])["stopped_by"] == sig.name


def test_ctx_run_exit_statuses_and_native_frames_are_those_the_help_names(host: Host) -> None:
    text = one_line(help_of("run"))
    assert "(126: refused, 127: not found;" in text
    ok = host.ctx("run", "--agent", "coder", "fs.stat", "/workspace/a.txt")
    refused = host.ctx("run", "--agent", "coder", "fs.list", "/workspace")
    missing = host.ctx("run", "--agent", "coder", "no.such")
    illegal = host.ctx("run", "--agent", "coder", "bad/tool")
    native = host.ctx("run", "--agent", "coder", "--native", "fs.read",
                      input='{"path": "/workspace/a.txt"}')  # fmt: skip
    not_json = host.ctx("run", "--agent", "coder", "--native", "fs.read", input="not json")
    closed = subprocess.run(
        [*CTX_ARGV, "run", "--agent", "coder", "--native", "fs.read"],
        input=b'{"path": "/workspace/a.txt"}', stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, env=host.env, timeout=60,
        preexec_fn=lambda: os.close(1),
    )  # fmt: skip

    assert ok.rc == 0 and "type: file" in ok.out, ok
    assert refused.rc == 126 and "EACCES" in refused.err, refused
    assert missing.rc == 127 and "ENOENT" in missing.err, missing
    assert illegal.rc == 2 and "EINVAL" in illegal.err, illegal
    frames = [json.loads(line) for line in native.lines()]
    assert native.rc == 0 and frames[0]["type"] == "call" and frames[-1]["type"] == "result"
    assert {"call", "pid"} <= set(frames[0])
    assert {"status", "output", "exit_status", "error", "timings_ms"} <= set(frames[-1])
    assert frames[-1]["output"]["content"] == "hello\n"
    assert not_json.rc == 2 and not_json.json()["error"]["error"] == "EINVAL", not_json
    assert closed.returncode == 74 and b"EBADF" in closed.stderr, closed.stderr


def test_session_commands_print_the_json_keys_their_helps_name(host: Host) -> None:
    assert host.ctx("run", "--agent", "coder", "fs.stat", "/workspace").rc == 0
    listed = host.ctx("session", "list", "coder", "--json")
    repaired = host.ctx("session", "repair", "coder", "--json")
    shown = host.ctx("session", "show", "coder", "--json")
    tail = host.ctx("session", "tail", "coder", "-n", "1", "--json")
    nothing = host.ctx("session", "tail", "coder", "-n", "0")

    assert [set(entry) for entry in listed.json()] == [{"name", "path"}], listed
    assert listed.json()[0]["name"] == "default"
    assert Path(listed.json()[0]["path"], "events.jsonl").is_file()
    assert set(repaired.json()) == {"session", "truncated_bytes", "tightened", "left"}
    assert repaired.json()["truncated_bytes"] == 0, repaired
    assert [json.loads(line)["type"] for line in shown.lines()] == ["tool_call", "tool_result"]
    assert len(tail.lines()) == 1 and json.loads(tail.out)["type"] == "tool_result", tail
    assert (nothing.rc, nothing.out) == (0, ""), nothing


def test_session_tail_follow_stops_on_ctrl_c_with_exit_0(host: Host) -> None:
    assert host.ctx("run", "--agent", "coder", "fs.stat", "/workspace").rc == 0
    follower = subprocess.Popen(
        [*CTX_ARGV, "session", "tail", "coder", "-n", "1", "--follow"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=host.env, text=True,
    )  # fmt: skip
    first = follower.stdout.readline()
    follower.send_signal(signal.SIGINT)
    _, err = follower.communicate(timeout=30)

    assert "tool_result" in first
    assert follower.returncode == 0, err


def test_object_command_exit_statuses_named_in_their_helps(host: Host) -> None:
    manifest = tool_manifest(host.top, "hello", "#!/bin/sh\necho hi\n")
    core = tool_manifest(host.top / "core", "fs.read", "#!/bin/sh\necho mine\n")
    other_root = host.top / "other"

    checked = host.ctx("object", "check", manifest, "--json")
    core_refused = host.ctx("object", "install", core, "--tier", "system")
    two_roots = host.ctx("--storage", other_root, "object", "install", "--source",
                         host.storage, manifest, "--tier", "system")  # fmt: skip
    installed = host.ctx("object", "install", "--source", host.storage, manifest,
                         "--tier", "system", "--json")  # fmt: skip
    no_space = host.ctx("object", "list", "--tier", "shared:nope")
    bad_tier = host.ctx("object", "list", "--tier", "bogus")
    listed = host.ctx("object", "list", "--tier", "system")
    which = host.ctx("object", "which", "hello")
    not_found = host.ctx("object", "which", "no.such")

    assert checked.rc == 0 and checked.json()[0]["valid"] is True, checked
    assert core_refused.rc == 1 and "EEXIST" in core_refused.err, core_refused
    assert two_roots.rc == 2 and "EINVAL" in two_roots.err, two_roots
    assert not other_root.exists()
    assert installed.rc == 0 and installed.json()["path"] == str(host.storage / "tool/hello")
    assert no_space.rc == 1 and "ENOENT" in no_space.err, no_space
    assert bad_tier.rc == 2 and "EINVAL" in bad_tier.err, bad_tier
    assert re.search(r"^hello\s+system\s+available\s", listed.out, re.M), listed
    assert (which.rc, which.out) == (0, f"{host.storage}/tool/hello\n"), which
    assert not_found.rc == 1 and not_found.out == "", not_found


def test_object_which_json_lists_what_was_skipped_and_why(host: Host) -> None:
    shadow = host.top / "shadow"
    shadow.mkdir()
    (shadow / "fs.read").write_text("not executable\n")
    env = {**host.env, "CTX_PATH": f"{shadow}:/ctx/tool"}

    found = host.ctx("object", "which", "fs.read", "--json", env=env)

    assert found.rc == 0, found
    assert found.json()["path"] == str(host.storage / "tool" / "fs.read")
    assert [entry.split(":")[0] for entry in found.json()["skipped"]] == [str(shadow / "fs.read")]


def test_policy_check_json_shape_and_exit_statuses_named_in_its_help(host: Host) -> None:
    text = one_line(help_of("policy", "check"))
    assert '{"valid", "files": [{"file", "valid", "problems": [{"line", "error",' in text
    good = host.write("good", "# a comment\n\nallow coder_t tool:fs.read execute\n")
    bad = host.write("bad", "allow coder_t tool:fs.read exec\nallow coder_t agent:* create\n")

    valid = host.ctx("policy", "check", good, "--json")
    invalid = host.ctx("policy", "check", good, bad)
    invalid_json = host.ctx("policy", "check", "-", "--json", input=bad.read_text())
    unreadable = host.ctx("policy", "check", host.top / "missing", "--json")

    assert valid.rc == 0 and valid.json() == {
        "valid": True, "files": [{"file": str(good), "valid": True, "problems": []}],
    }  # fmt: skip
    assert invalid.rc == 1
    assert [line.split(": ")[:2] for line in invalid.err.splitlines()] == [
        [f"{bad}:1", "EINVAL"], [f"{bad}:2", "EINVAL"],
    ]  # fmt: skip
    problems = invalid_json.json()["files"][0]["problems"]
    assert [set(p) for p in problems] == [{"line", "error", "errno", "message"}] * 2
    assert unreadable.rc == 1 and unreadable.json()["files"][0]["problems"][0]["line"] is None


def test_every_manual_topic_and_alias_of_the_man_help_prints_a_page(host: Host) -> None:
    text = one_line(help_of("man"))
    assert "Topics: README (the bundle's overview; also readme, README.md), agent, tool," in text
    topics = ["README", "readme", "README.md", "agent", "tool", "model", "coreutils",
              "root-abi", "session", "provider", "ctx.agent", "ctx.agent.md"]  # fmt: skip
    for topic in topics:
        page = host.ctx("man", topic)
        assert page.rc == 0 and page.out.strip() and page.err == "", page
    assert host.ctx("man", "agent").out == host.ctx("man", "ctx.agent.md").out
    unknown = host.ctx("man", "nope")
    assert unknown.rc == 1 and "ENOENT" in unknown.err, unknown
    listing = host.ctx("man", "--json")
    assert [entry["topic"] for entry in listing.json()] == [
        "README", "agent", "tool", "model", "coreutils", "root-abi", "session", "provider",
    ]  # fmt: skip


def test_bootstrap_refuses_a_source_without_pages_before_changing_anything(host: Host) -> None:
    empty_source = host.top / "src"
    empty_source.mkdir()
    page = host.storage / "shared" / "cortexfs-docs" / "man" / "ctx.tool.md"
    page.write_text("stale\n")

    refused = host.ctx("bootstrap", empty_source, "--json")
    after_refusal = page.read_text()
    repaired = host.ctx("bootstrap")

    assert refused.rc == 2 and refused.json()["error"] == "EINVAL", refused
    assert after_refusal == "stale\n"
    assert repaired.rc == 0 and "shared/cortexfs-docs/man/ctx.tool.md" in repaired.out
    assert page.read_text() != "stale\n"


def test_shared_create_makes_the_modes_its_help_states(host: Host) -> None:
    made = host.ctx("shared", "create", "team", "--group", "0")
    docs = host.ctx("shared", "create", "cortexfs-docs")
    illegal = host.ctx("shared", "create", "a b")
    space = host.storage / "shared" / "team"
    modes = {
        path: oct((space / path).stat().st_mode & 0o7777)
        for path in [".", "tool", "data", "agent", "queue", "queue/pending", "queue/done"]
    }

    assert made.rc == 0, made
    assert modes == {
        ".": "0o3770", "tool": "0o2750", "data": "0o2770", "agent": "0o3770",
        "queue": "0o3770", "queue/pending": "0o2770", "queue/done": "0o2770",
    }  # fmt: skip
    assert docs.rc == 2 and "EINVAL" in docs.err, docs
    assert illegal.rc == 2 and "EINVAL" in illegal.err, illegal


@needs_time_server
def test_the_next_commands_ctxmcp_project_prints_install_its_candidate(host: Host) -> None:
    config = host.write(
        "mcp.json", json.dumps({"mcpServers": {"time": {"command": str(TIME_SERVER)}}})
    )
    out = host.top / "candidates"
    project = [CTXMCP, "project", "--config", str(config), "--runtime-config", "/mcp/mcp.json",
               "--server", "time", "--out", str(out)]  # fmt: skip
    nxt = re.search(r"Next:\n(.*?)\n\n", ctxmcp_help("project"), re.S)
    assert nxt is not None
    commands = [
        shlex.split(line.replace("OUT", str(out)).replace("SERVER.TOOL", "time.get_current_time")
                    .replace("STORAGE", str(host.storage)))
        for line in re.sub(r"\\\n\s*", " ", nxt.group(1)).strip().splitlines()
    ]  # fmt: skip

    first = subprocess.run([*project, "--json"], capture_output=True, text=True, timeout=60)
    second = subprocess.run(project, capture_output=True, text=True, timeout=60)
    inside = subprocess.run(
        [*project[:-1], str(host.storage / "shared" / "x")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    ran = [host.ctx(*command[1:]) for command in commands]

    assert first.returncode == 0, first.stderr
    assert set(json.loads(first.stdout)) >= {"written", "replaced", "skipped", "notes"}
    assert second.returncode == 1 and "EEXIST" in second.stderr, second.stderr
    assert inside.returncode == 2 and "EINVAL" in inside.stderr, inside.stderr
    assert not (host.storage / "shared" / "x").exists()
    assert [run.rc for run in ran] == [0, 0], ran
    assert (host.storage / "tool" / "time.get_current_time").is_file()


@needs_fuse_as_root
def test_mount_and_umount_as_their_helps_describe_them(host: Host) -> None:
    where = host.top / "mp"
    where.mkdir()
    inside = host.storage / "home" / "mp"
    inside.mkdir()
    log = open(host.top / "mount.err", "wb")  # noqa: SIM115
    mount = subprocess.Popen(
        [*CTX_ARGV, "mount", where], stdout=subprocess.DEVNULL, stderr=log, env=host.env,
        start_new_session=True,
    )  # fmt: skip
    try:
        assert wait_for(lambda: mounted_at(where), 20), (host.top / "mount.err").read_text()
        shown = sorted(os.listdir(where))
        busy = host.ctx("mount", where)
        in_root = host.ctx("mount", inside)
        not_ours = host.ctx("umount", host.ws)
        unmounted = host.ctx("umount", where)
        mount.wait(timeout=30)
    finally:
        if mounted_at(where):
            subprocess.run(["umount", "-l", str(where)], check=False)
        if mount.poll() is None:
            mount.kill()
            mount.wait()
        log.close()

    assert shown == ["agent", "bin", "home", "model", "shared", "tool"]
    assert busy.rc == 1 and "EBUSY" in busy.err, busy
    assert in_root.rc != 0 and "EINVAL" in in_root.err, in_root
    assert not_ours.rc != 0 and "EINVAL" in not_ours.err, not_ours
    assert unmounted.rc == 0, unmounted
    assert mount.returncode == 0 and not mounted_at(where)


@needs_terminal
def test_agent_start_watch_stop_as_the_start_help_prints_them(host: Host) -> None:
    os.chown(host.ws, 65534, 65534)
    started = host.ctx("agent", "start", "coder", "--session", "s1", cwd=host.ws)
    assert started.rc == 0, started
    hint = re.search(r"watch: (ctx agent watch .*?)\s{2,}join: (ctx agent attach .*)$",
                     started.out, re.M)  # fmt: skip
    assert hint is not None, started
    watcher = subprocess.Popen(
        [*CTX_ARGV, *shlex.split(hint.group(1))[1:]], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=host.env,
    )  # fmt: skip
    attached = host.ctx(*shlex.split(hint.group(2))[1:], input="fs.stat /workspace/a.txt\n")
    stopped = host.ctx("agent", "stop", "coder", "--session", "s1")
    _, watch_err = watcher.communicate(timeout=30)
    again = host.ctx("agent", "stop", "coder", "--session", "s1", "--json")

    assert attached.rc == 0 and "type: file" in attached.out, attached
    assert re.fullmatch(r"stopped coder, session s1 \(pid \d+\)\n", stopped.out), stopped
    assert watcher.returncode == 0 and b"ended" in watch_err, watch_err
    assert again.rc == 1 and again.json()["error"] == "ENOENT", again


@needs_terminal
def test_agent_start_json_and_stop_json_keys_are_those_of_the_helps(host: Host) -> None:
    started = host.ctx("agent", "start", "coder", "--json", cwd=host.ws)
    stopped = host.ctx("agent", "stop", "coder", "--json")

    assert started.rc == 0, started
    assert {"agent", "session", "socket", "workspace"} <= set(started.json())
    assert Path(started.json()["socket"]).name == "main.sock"
    assert stopped.rc == 0 and set(stopped.json()) >= {"agent", "session", "pid"}, stopped


@needs_terminal
def test_agent_start_describes_a_workspace_from_the_mount_control_as_it_is(host: Host) -> None:
    # The help: the default /workspace "is for this terminal only and is not written to NAME's
    # controls; a /workspace in NAME's mount control wins over it".
    request = {"name": "ro1", "label": "ro1_t", "tools": ["fs.stat"],
               "mount": [[str(host.ws), "/workspace", "ro"]]}  # fmt: skip
    host.create_agent(request)
    elsewhere = host.top / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    assert "/workspace (ro)" in host.ctx("agent", "show", "ro1").out

    started = host.ctx("agent", "start", "ro1", "--session", "ro", cwd=elsewhere)

    assert started.rc == 0, started
    said = [line for line in started.lines() if line.startswith("/workspace")]
    assert said, started
    assert "read-write" not in said[0] and "this terminal only" not in said[0], said
