"""The command lines of SPEC §2.4 (queue), P-8 (policy), §4 (sessions), T-8/T-8a (objects),
§8 (agents), X-1 (shared spaces), §10 M-1/M-4 (ctxmcp), §13 F-1 (mount) and R-5 (bootstrap),
written the ways people and scripts write them: ``--opt=value`` and ``--opt value``, options
before and after operands, ``--`` before an operand that starts with ``-``, ``-`` for
standard input, an option given twice, an empty value (``--project=``, ``--tier "$UNSET"``),
values holding spaces, line breaks and non-ASCII text, ``--json`` and ``--help`` wherever
they may stand, and ``ctx`` / ``ctx --version`` alone.  Each form either means what its
other spelling means or is a usage error (exit 2, the usage on stderr, ``ctx: EINVAL: …``,
nothing on stdout but an error object where ``--json`` was asked for) that changes nothing on
disk; ``--storage`` beats ``$CTX_STORAGE`` however it is spelt (R-1)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    REPO,
    Run,
    clean_env,
    ctx_run,
    mounted_at,
    snapshot,
    tool_manifest,
)
from tests.support.storage import copy_of_root

CTXMCP = str(REPO / ".venv" / "bin" / "ctxmcp")
REQUEST = '{"tool": "fs.stat", "input": {"path": "/"}}'
POLICY = "allow a_t tool:x execute\n"

# A stdio MCP server that lists one tool, ``echo``; each start is appended to argv[1].
SERVER = r"""
import json, os, sys
with open(sys.argv[1], "a") as starts:
    starts.write(f"{os.getpid()}\n")
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    if message["method"] == "initialize":
        result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                  "serverInfo": {"name": "t", "version": "1"}}
    elif message["method"] == "tools/list":
        result = {"tools": [{"name": "echo", "description": "Echo.",
                             "inputSchema": {"type": "object"}}]}
    else:
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"],
                          "error": {"code": -32601, "message": "no such method"}}), flush=True)
        continue
    print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
"""


# --- helpers -------------------------------------------------------------------------------------


def ctxmcp(*args, env: dict | None = None, cwd: Path | None = None) -> Run:
    proc = subprocess.run(
        [CTXMCP, *map(str, args)],
        input=b"",
        capture_output=True,
        env=env if env is not None else clean_env(),
        cwd=cwd,
        timeout=60,
    )
    return Run([str(a) for a in args], proc.returncode, proc.stdout.decode(), proc.stderr.decode())


def on(storage: Path):
    """``ctx ARGS`` with ``$CTX_STORAGE`` naming ``storage``."""

    def run(*args, **kw) -> Run:
        kw.setdefault("env", clean_env(CTX_STORAGE=str(storage)))
        kw.setdefault("timeout", 30)
        return ctx_run(*args, **kw)

    return run


def json_documents(out: str) -> list:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def is_usage_error(answer: Run, program: str = "ctx") -> bool:
    """Exit 2, its reason as the last line of stderr, ``PROG: EINVAL: …``, no traceback."""
    lines = answer.err.splitlines()
    return (
        answer.rc == 2
        and bool(lines)
        and lines[-1].startswith(f"{program}: EINVAL: ")
        and "Traceback" not in answer.err
    )


def has_usage_lines(answer: Run, command: str) -> bool:
    """click's lines before the reason: the usage of ``command`` and where its help is."""
    lines = answer.err.splitlines()
    return (
        len(lines) >= 3
        and lines[0].startswith(f"Usage: {command} ")
        and lines[1] == f"Try '{command} --help' for help."
    )


def quiet_root(storage: Path) -> dict:
    """What a command may change in the root: everything but the logs, which record calls."""
    return {
        name: value
        for name, value in snapshot(storage).items()
        if not name.endswith(".d/log") and "/session/" not in name
    }


@pytest.fixture
def files(tmp_path: Path) -> Path:
    """The input files a script hands the commands, in a directory of their own."""
    here = tmp_path / "files"
    here.mkdir()
    (here / "req.json").write_text(REQUEST)
    (here / "res.json").write_text('{"answer": 42}')
    (here / "a.policy").write_text(POLICY)
    (here / "b.policy").write_text("allow b_t tool:x execute\n")
    (here / "agent.json").write_text('{"name": "formed", "label": "formed_t"}')
    tool_manifest(here, "demo.forms", "#!/bin/sh\necho hi\n")
    return here


@pytest.fixture
def with_coder(storage: Path) -> Path:
    """``storage`` with agent ``coder`` (run as nobody) and its session ``default``."""
    ctx = on(storage)
    made = ctx("agent", "create", "-", input='{"name": "coder", "label": "coder_t"}')
    assert made.rc == 0, made
    called = ctx("run", "--agent", "coder", "fs.stat", "/")
    assert called.rc == 126, called  # refused (no policy grants it), and recorded
    return storage


@pytest.fixture
def mcp_config(tmp_path: Path) -> tuple[Path, Path]:
    """A client configuration naming server ``t``, and the file each start is appended to."""
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    starts = tmp_path / "starts"
    config = tmp_path / "mcp.json"
    entry = {"command": str(REPO / ".venv" / "bin" / "python"), "args": [str(script), str(starts)]}
    config.write_text(json.dumps({"mcpServers": {"t": entry}}))
    return config, starts


# --- 1. --opt=value, --opt value, and options after the operands -------------------------------


def test_each_spelling_of_an_option_and_its_place_give_the_same_job(
    storage: Path, files: Path
) -> None:
    """§2.4: ``--project P``, ``--project=P``, ``-p P`` and ``-pP``, before or after FILE or
    JOB, are one command line: publish prints ``J`` alone on its line each time, the job is
    pending under that name, and claim and finish take their options in any of the forms."""
    ctx = on(storage)
    req = str(files / "req.json")
    forms = {
        "spaced": ["queue", "publish", "--project", "proj", "--name", "spaced", req],
        "equals": ["queue", "publish", "--project=proj", "--name=equals", req],
        "short": ["queue", "publish", "-p", "proj", "--name", "short", req],
        "glued": ["queue", "publish", "-pproj", "--name=glued", req],
        "after": ["queue", "publish", req, "--name", "after", "--project", "proj"],
        "between": ["queue", "publish", "--name=between", req, "-p", "proj"],
    }
    for name, words in forms.items():
        published = ctx(*words)
        assert (published.rc, published.out, published.err) == (0, f"{name}.req.json\n", ""), (
            published
        )
    pending = set(os.listdir(storage / "shared/proj/queue/pending"))
    assert pending == {f"{name}.req.json" for name in forms}

    listed = {
        spelling: ctx(*words)
        for spelling, words in {
            "spaced": ["queue", "list", "--project", "proj", "--state", "pending"],
            "equals": ["queue", "list", "--state=pending", "--project=proj"],
            "short": ["queue", "list", "--state=pending", "-pproj"],
        }.items()
    }
    assert {a.rc for a in listed.values()} == {0}, listed
    assert len({a.out for a in listed.values()}) == 1, listed
    assert set(listed["spaced"].lines()) == pending

    claimed = ctx("queue", "claim", "--ttl=600", "--worker=w-equals", "--project=proj")
    assert claimed.rc == 0 and len(claimed.lines()) == 1, claimed
    job = claimed.out.strip()
    lease = json.loads((storage / "shared/proj/queue/lease" / job / "worker").read_text())
    assert lease["worker"] == "w-equals", lease
    finished = ctx("queue", "finish", job, str(files / "res.json"), "--ok", "--project=proj")
    assert finished.rc == 0, finished
    result = json.loads((storage / "shared/proj/queue/done" / f"{job}.result").read_text())
    assert (result["status"], result["output"]) == ("ok", {"answer": 42})


def test_policy_and_ctxmcp_take_their_options_in_either_form_anywhere(
    files: Path, mcp_config: tuple[Path, Path], tmp_path: Path
) -> None:
    """P-8 (``--policy FILE`` repeated, before or among SUBJECT CLASS:NAME PERM) and M-1
    (``ctxmcp list --config C --server S``): the ``=`` form and the spaced form, before or after
    the operands, give the same answer."""
    env = clean_env()
    a, b = str(files / "a.policy"), str(files / "b.policy")
    forms = [
        ["policy", "query", "--policy", a, "a_t", "tool:x", "execute"],
        ["policy", "query", f"--policy={a}", "a_t", "tool:x", "execute"],
        ["policy", "query", "a_t", "tool:x", "execute", "--policy", a],
        ["policy", "query", "a_t", f"--policy={a}", "tool:x", "execute"],
    ]
    for words in forms:
        answer = ctx_run(*words, env=env)
        assert (answer.rc, answer.out, answer.err) == (0, "allow\n", ""), answer
    both = ctx_run("policy", "query", f"--policy={a}", "--policy", b, "a_t", "tool:x", "execute")
    assert (both.rc, both.out) == (1, "deny\n"), both  # every given policy must allow

    config, _ = mcp_config
    listed = [
        ctxmcp("list", "--config", config, "--server", "t", env=env),
        ctxmcp("list", f"--config={config}", "--server=t", env=env),
        ctxmcp("list", "--server=t", "--config", config, env=env),
    ]
    assert [(x.rc, x.out) for x in listed] == [(0, "t.echo\tEcho.\n")] * 3, listed


# --- 2. --json wherever the subcommand's words go ------------------------------------------------


def test_json_anywhere_among_a_commands_words_gives_the_same_document(
    with_coder: Path, files: Path
) -> None:
    """§2.4 ("--json gives machine-readable output on stdout"), P-8, §4, §8, D-1, T-8a:
    ``--json`` first, between the options, or last after the operands: the same single JSON
    document (JSON Lines for session show); before the subcommand, where the group takes no
    such option, a usage error; after ``--``, an operand and not the option."""
    ctx = on(with_coder)
    assert ctx("queue", "publish", "-p", "proj", "--name", "shown", str(files / "req.json")).rc == 0
    a = str(files / "a.policy")
    commands = {
        "queue status": (["queue", "status"], ["-p", "proj"], []),
        "queue show": (["queue", "show"], ["-p", "proj"], ["shown"]),
        "policy query": (["policy", "query"], ["--policy", a], ["a_t", "tool:x", "execute"]),
        "agent show": (["agent", "show"], [], ["coder"]),
        "session show": (["session", "show"], ["--session", "default"], ["coder"]),
        "man": (["man"], [], ["agent"]),
        "object which": (["object", "which"], [], ["fs.read"]),
    }
    for what, (command, options, operands) in commands.items():
        answers = [
            ctx(*command, "--json", *options, *operands),
            ctx(*command, *options, "--json", *operands),
            ctx(*command, *options, *operands, "--json"),
        ]
        assert {x.rc for x in answers} == {0}, (what, answers)
        documents = [json_documents(x.out) for x in answers]
        assert documents[0] and documents[0] == documents[1] == documents[2], (what, answers)
        if what != "session show":
            assert len(answers[0].out.splitlines()) == 1, answers[0]

    for words in (["--json", "queue", "status", "-p", "proj"], ["queue", "--json", "status"]):
        early = ctx(*words)
        assert is_usage_error(early) and "No such option '--json'" in early.err, early
    after = ctx("queue", "show", "-p", "proj", "--", "shown", "--json")
    assert is_usage_error(after) and after.out == "", after
    assert "unexpected extra argument (--json)" in after.err, after


# --- 3. --help after operands and bad values: help, and nothing done -----------------------------


def test_help_after_the_operands_answers_with_the_usage_and_does_nothing(
    storage: Path, files: Path, mcp_config: tuple[Path, Path], tmp_path: Path
) -> None:
    """Every command's ``--help`` (and ``-h``), even at the end of a command line that would
    otherwise publish, create, install or bootstrap, or after a value the command would
    refuse: exit 0, the usage line naming the command on stdout, nothing on stderr, and the
    storage root, the current directory and the places named untouched."""
    ctx = on(storage)
    config, starts = mcp_config
    req, manifest = str(files / "req.json"), str(files / "demo.forms.json")
    here = tmp_path / "here"
    here.mkdir()
    fresh = tmp_path / "fresh-root"
    out = tmp_path / "candidates"
    lines = {
        "ctx queue publish": ["queue", "publish", "-p", "proj", "--name", "h", req],
        "ctx queue init": ["queue", "init", "--project=newproj"],
        "ctx queue claim": ["queue", "claim", "-p", "proj", "--ttl=bad"],
        "ctx queue recover": ["queue", "recover", "-p", "proj", "--reconcile"],
        "ctx agent create": ["agent", "create", str(files / "agent.json")],
        "ctx shared create": ["shared", "create", "newspace"],
        "ctx object install": ["object", "install", manifest, "--tier", "system"],
        "ctx bootstrap": ["bootstrap", "--storage", str(fresh)],
        "ctx session repair": ["session", "repair", "coder", "--uid=-1"],
        "ctx policy query": ["policy", "query", "--policy", "nosuch", "a_t"],
    }
    before = snapshot(storage)
    for command, words in lines.items():
        for helps in ("--help", "-h") if command == "ctx queue publish" else ("--help",):
            answer = ctx(*words, helps, cwd=here)
            assert (answer.rc, answer.err) == (0, ""), answer
            assert answer.out.startswith(f"Usage: {command} [OPTIONS]"), answer
    projected = ctxmcp("project", "--config", config, "--server", "t", "--runtime-config",
                       "/x.json", "--out", out, "--help", cwd=here)  # fmt: skip
    assert projected.rc == 0 and projected.out.startswith("Usage: ctxmcp project [OPTIONS]")
    assert snapshot(storage) == before
    assert os.listdir(here) == [] and not fresh.exists() and not out.exists()
    assert not starts.exists(), "--help started the MCP server"


# --- 4. ctx alone, --version -------------------------------------------------------------------


def test_the_programs_alone_show_their_usage_and_version_answers_with_one_line(
    tmp_path: Path,
) -> None:
    """§2.4 (2: usage error): ``ctx`` and ``ctxmcp`` without a command print their usage and
    commands on stderr, nothing on stdout, exit 2; ``--version`` prints ``PROG, version X`` on
    stdout, exit 0, the same version for both, whatever ``$CTX_STORAGE`` names, making
    nothing."""
    env = clean_env(CTX_STORAGE=str(tmp_path / "nowhere"))
    bare = ctx_run(env=env, cwd=tmp_path)
    assert (bare.rc, bare.out) == (2, ""), bare
    assert bare.err.startswith("Usage: ctx [OPTIONS] COMMAND [ARGS]..."), bare
    assert all(f"  {name} " in bare.err for name in ("queue", "policy", "agent", "session")), bare
    mcp_bare = ctxmcp(env=env, cwd=tmp_path)
    assert (mcp_bare.rc, mcp_bare.out) == (2, ""), mcp_bare
    assert mcp_bare.err.startswith("Usage: ctxmcp [OPTIONS] COMMAND"), mcp_bare

    version = ctx_run("--version", env=env, cwd=tmp_path)
    mcp_version = ctxmcp("--version", env=env, cwd=tmp_path)
    found = []
    for program, answer in (("ctx", version), ("ctxmcp", mcp_version)):
        assert (answer.rc, answer.err) == (0, ""), answer
        matched = re.fullmatch(rf"{program}, version (\d+\.\d+\S*)\n", answer.out)
        assert matched, answer
        found.append(matched.group(1))
    assert found[0] == found[1], found
    assert ctx_run("--version", "--help", env=env).out == version.out  # the first eager wins
    assert os.listdir(tmp_path) == []


# --- 5. an option given twice ------------------------------------------------------------------


def test_an_option_given_twice_counts_once_the_last_spelling_and_policy_adds_layers(
    with_coder: Path, files: Path, tmp_path: Path
) -> None:
    """§2.4, P-8, §4: an option that takes one value and is given twice counts with its last
    value (the job lands in the last project, under the last name; the last state is listed;
    the last session shown; the last --ttl judged), never the first nor both; ``--policy``
    is the one option made to be repeated: each is one more layer that must allow."""
    ctx = on(with_coder)
    req = str(files / "req.json")
    assert ctx("queue", "init", "--project", "other").rc == 0
    published = ctx("queue", "publish", "-p", "other", "--project=proj", "--name", "first",
                    "--name=second", req)  # fmt: skip
    assert (published.rc, published.out) == (0, "second.req.json\n"), published
    assert os.listdir(with_coder / "shared/proj/queue/pending") == ["second.req.json"]
    assert os.listdir(with_coder / "shared/other/queue/pending") == []

    listed = ctx("queue", "list", "-p", "proj", "--state", "done", "--state=pending")
    assert (listed.rc, listed.out) == (0, "second.req.json\n"), listed
    ttl = ctx("queue", "claim", "-p", "proj", "--ttl", "60", "--ttl=0")
    assert is_usage_error(ttl) and "'--ttl': 0" in ttl.err, ttl
    assert os.listdir(with_coder / "shared/proj/queue/claimed") == []

    other = ctx("session", "show", "coder", "--session", "nosuch", "--session=default")
    plain = ctx("session", "show", "coder")
    assert (other.rc, other.out) == (0, plain.out) and plain.out, (other, plain)

    a, b = str(files / "a.policy"), str(files / "b.policy")
    both = files / "both.policy"
    both.write_text(POLICY + "allow b_t tool:x execute\n")
    for policies, expected in (
        ([a, a], (0, "allow\n")),
        ([a, b], (1, "deny\n")),
        ([b, str(both)], (1, "deny\n")),
        ([str(both), a, str(both)], (0, "allow\n")),
    ):
        words = [w for p in policies for w in ("--policy", p)]
        answer = ctx("policy", "query", *words, "a_t", "tool:x", "execute")
        assert (answer.rc, answer.out) == expected, answer


def test_a_storage_root_given_twice_is_the_last_one_in_either_place(
    storage: Path, _template: Path, tmp_path: Path, files: Path
) -> None:
    """R-1 (``--storage DIR`` overrides everywhere): ``--storage`` given twice to the group or to
    the subcommand is the last one given there; the first one is not read, and nothing is
    made in it."""
    second = copy_of_root(_template, tmp_path / "second")
    missing = tmp_path / "missing"
    req = str(files / "req.json")
    env = clean_env()
    group = ctx_run("--storage", missing, f"--storage={second}", "queue", "publish", "-p",
                    "proj", "--name", "g", req, env=env)  # fmt: skip
    command = ctx_run("queue", "publish", "-p", "proj", "--name", "c", "--storage", missing,
                      f"--storage={storage}", req, env=env)  # fmt: skip
    assert (group.rc, command.rc) == (0, 0), (group, command)
    assert os.listdir(second / "shared/proj/queue/pending") == ["g.req.json"]
    assert os.listdir(storage / "shared/proj/queue/pending") == ["c.req.json"]
    assert not missing.exists()


# --- 6. empty values --------------------------------------------------------------------------


EMPTY_VALUES = {
    # command line up to the option; the option; the words after it
    "queue publish --project": (["queue", "publish"], "--project", ["{req}"]),
    "queue publish --name": (["queue", "publish", "-p", "proj"], "--name", ["{req}"]),
    "queue publish --queue": (["queue", "publish"], "--queue", ["{req}"]),
    "queue publish --storage": (["queue", "publish", "-p", "proj"], "--storage", ["{req}"]),
    "queue init --project": (["queue", "init"], "--project", []),
    "queue claim --worker": (["queue", "claim", "-p", "proj"], "--worker", []),
    "queue claim --ttl": (["queue", "claim", "-p", "proj"], "--ttl", []),
    "queue claim --pid": (["queue", "claim", "-p", "proj"], "--pid", []),
    "queue recover --grace": (["queue", "recover", "-p", "proj", "--reconcile"], "--grace", []),
    "queue work --agent": (["queue", "work", "-p", "proj", "--drain"], "--agent", []),
    "queue work --session": (["queue", "work", "-p", "proj", "--drain"], "--session", []),
    "queue list --state": (["queue", "list", "-p", "proj"], "--state", []),
    "agent create --user": (["agent", "create"], "--user", ["{agent}"]),
    "agent create --gid": (["agent", "create"], "--gid", ["{agent}"]),
    "agent start --session": (["agent", "start"], "--session", ["coder"]),
    "agent start --workspace": (["agent", "start"], "--workspace", ["coder"]),
    "agent stop --session": (["agent", "stop"], "--session", ["coder"]),
    "session show --session": (["session", "show"], "--session", ["coder"]),
    "session repair --project": (["session", "repair"], "--project", ["coder"]),
    "session list --uid": (["session", "list"], "--uid", ["coder"]),
    "policy explain --peer": (
        ["policy", "explain"],
        "--peer",
        ["coder", "tool:fs.stat", "execute"],
    ),
    "policy explain --location": (
        ["policy", "explain"],
        "--location",
        ["coder", "tool:fs.stat", "execute"],
    ),
    "shared create --group": (["shared", "create"], "--group", ["newspace"]),
    "object install --tier": (["object", "install"], "--tier", ["{manifest}"]),
    "mount --as": (["mount"], "--as", ["{mountpoint}"]),
    "run --agent": (["run"], "--agent", ["fs.stat", "/"]),
    "run --session": (["run", "--agent", "coder"], "--session", ["fs.stat", "/"]),
    "run --timeout": (["run", "--agent", "coder"], "--timeout", ["fs.stat", "/"]),
    "ctx --storage": ([], "--storage", ["queue", "status", "-p", "proj"]),
}


def test_an_empty_value_is_a_usage_error_that_changes_nothing(
    with_coder: Path, files: Path, tmp_path: Path
) -> None:
    """§2.4 (2 usage error), R-3 (an empty name is EINVAL), R-1: ``--opt=`` and ``--opt ''``
    (what ``--opt "$UNSET"`` gives a script) are refused by every command, as EINVAL with exit
    2 and the reason on stderr, nothing on stdout, and nothing changed in the storage root:
    no job claimed or moved, no agent, space or queue made, nothing mounted."""
    ctx = on(with_coder)
    waiting = ctx("queue", "publish", "-p", "proj", "--name", "waiting", str(files / "req.json"))
    assert waiting.rc == 0, waiting
    mountpoint = tmp_path / "mp"
    mountpoint.mkdir()
    values = {
        "req": str(files / "req.json"),
        "agent": str(files / "agent.json"),
        "manifest": str(files / "demo.forms.json"),
        "mountpoint": str(mountpoint),
    }
    here = tmp_path / "here"
    here.mkdir()
    before = quiet_root(with_coder)
    wrong = []
    try:
        for at, (what, (head, option, tail)) in enumerate(EMPTY_VALUES.items()):
            # each option in one of the two spellings, in turn
            given = [f"{option}="] if at % 2 else [option, ""]
            words = [*head, *given, *[w.format(**values) for w in tail]]
            answer = ctx(*words, cwd=here)
            if not is_usage_error(answer) or answer.out != "":
                wrong.append(f"{what}: {answer!r}")
    finally:
        if mounted_at(mountpoint):
            subprocess.run(["umount", "-l", str(mountpoint)], check=False)
    assert wrong == []
    assert quiet_root(with_coder) == before
    assert os.listdir(here) == []


def test_an_empty_value_of_a_ctxmcp_option_is_refused_before_the_server_starts(
    mcp_config: tuple[Path, Path], tmp_path: Path
) -> None:
    """M-1, M-4 (the locator names "the visible absolute config path"), §2.4: an empty
    ``--config``, ``--server``, ``--runtime-config`` or ``--out`` is EINVAL with exit 2,
    before the server is started and before anything is written."""
    config, starts = mcp_config
    out = tmp_path / "candidates"
    base = {
        "--config": str(config),
        "--server": "t",
        "--runtime-config": "/workspace/.mcp.json",
        "--out": str(out),
    }
    wrong = []
    for option in base:
        for given in ([f"{option}="], [option, ""]):
            words = [w for name, value in base.items() if name != option for w in (name, value)]
            answer = ctxmcp("project", *words, *given, "--json")
            documents = json_documents(answer.out)
            if not is_usage_error(answer, "ctxmcp") or [d.get("error") for d in documents] != [
                "EINVAL"
            ]:
                wrong.append(answer)
            if option in ("--config", "--server"):
                words = [*given, *(["--server", "t"] if option == "--config" else [])]
                if option == "--server":
                    words += ["--config", str(config)]
                listed = ctxmcp("list", *words)
                if not is_usage_error(listed, "ctxmcp") or listed.out:
                    wrong.append(listed)
    assert wrong == []
    assert not starts.exists() and not out.exists()


def test_an_empty_tier_is_refused_by_object_list_as_by_object_install(
    storage: Path, files: Path
) -> None:
    """T-8a (``ctx object list [--tier T]``), T-8: a tier named by an empty string is no tier
    (``object install --tier ''`` is EINVAL, exit 2); a script's ``--tier "$TIER"`` with
    ``TIER`` unset must not be answered with the listing of every tier as if no tier had been
    asked for."""
    ctx = on(storage)
    install = ctx("object", "install", str(files / "demo.forms.json"), "--tier=")
    assert is_usage_error(install), install
    for given in (["--tier="], ["--tier", ""]):
        listed = ctx("object", "list", *given)
        assert is_usage_error(listed) and listed.out == "", listed


def test_an_empty_policy_file_name_is_a_malformed_query(files: Path) -> None:
    """P-8: "a malformed query or policy is exit 2 with EINVAL"; ``--policy ''`` names no
    file at all (the other commands say "an empty string names no path", EINVAL)."""
    for given in (["--policy="], ["--policy", ""]):
        answer = ctx_run("policy", "query", *given, "a_t", "tool:x", "execute", "--json")
        assert is_usage_error(answer), answer
        assert [d["error"] for d in json_documents(answer.out)] == ["EINVAL"], answer


# --- 7. values with spaces, line breaks, non-ASCII text --------------------------------------


def test_a_name_with_a_space_a_line_break_or_non_ascii_text_is_refused_on_one_line(
    with_coder: Path, files: Path
) -> None:
    """R-3 (object names are ``[A-Za-z0-9._-]``; anything else EINVAL), §2.4: a project, job,
    session, agent or space name holding a space, a line break or non-ASCII text is refused
    with exit 2 in either spelling of its option, the reason one line on stderr naming the
    value (the line break shown as ``\\n``), one error object on stdout with ``--json``, and
    nothing made."""
    ctx = on(with_coder)
    req = str(files / "req.json")
    before = quiet_root(with_coder)
    wrong = []
    for value, shown in (("a b", "a b"), ("a\nb", "a\\nb"), ("café", "café")):
        lines = [
            ["queue", "publish", f"--project={value}", req],
            ["queue", "publish", "-p", "proj", "--name", value, req],
            ["queue", "init", "--project", value],
            ["session", "show", "coder", f"--session={value}"],
            ["agent", "show", value],
            ["shared", "create", value],
            ["run", f"--agent={value}", "fs.stat", "/"],
            ["policy", "query", "--policy", str(files / "a.policy"), value, "tool:x", "execute"],
        ]
        for words in lines:
            answer = ctx(*words)
            refused = is_usage_error(answer) and not answer.out
            if not refused or shown not in answer.err.splitlines()[-1]:
                wrong.append(answer)
            if words[0] != "run" and value == "a\nb":
                as_json = ctx(*words, "--json")
                documents = json_documents(as_json.out)
                if len(as_json.out.splitlines()) != 1 or documents[0].get("error") != "EINVAL":
                    wrong.append(as_json)
    assert wrong == []
    assert quiet_root(with_coder) == before


def test_free_text_values_and_paths_keep_their_spaces_line_breaks_and_non_ascii_text(
    storage: Path, files: Path, mcp_config: tuple[Path, Path], tmp_path: Path
) -> None:
    """§2.4 (``--worker ID``; ``publish FILE``), R-1 (``--storage DIR``), P-8 (``policy check
    FILE``), §8 (``agent create REQUEST``), M-4 (``--runtime-config``, the locator's path):
    values that are text or paths, not object names, arrive exactly as given: a storage root
    and files whose names hold spaces, non-ASCII text and a line break, a worker id with a
    space and an umlaut, a runtime configuration path with both."""
    odd = tmp_path / "a root ü"
    copy_of_root(storage, odd)
    env = clean_env()
    req = files / "re q\nü.json"
    req.write_text(REQUEST)
    published = ctx_run("queue", "publish", f"--storage={odd}", "-p", "proj", "--name", "odd",
                        req, env=env)  # fmt: skip
    assert (published.rc, published.out) == (0, "odd.req.json\n"), published
    status = ctx_run("--storage", odd, "queue", "status", "-p", "proj", "--json", env=env)
    assert json.loads(status.out)["queue"] == str(odd / "shared/proj/queue"), status
    claimed = ctx_run("queue", "claim", "-p", "proj", "--worker", "w 1 ü", "--storage", odd,
                      "--json", env=env)  # fmt: skip
    assert claimed.rc == 0 and claimed.json()["lease"]["worker"] == "w 1 ü", claimed
    lease = json.loads((odd / "shared/proj/queue/lease/odd.req.json/worker").read_text())
    assert lease["worker"] == "w 1 ü"
    broken = ctx_run("queue", "claim", "-p", "proj", "--worker=w\n2", "--storage", odd, env=env)
    assert is_usage_error(broken) and "'w\\n2'" in broken.err, broken

    policy = files / "pol icy\nü"
    policy.write_text(POLICY + "allow a_t tool:* execute\n")
    checked = ctx_run("policy", "check", "--json", policy, env=env)
    assert checked.rc == 1 and json.loads(checked.out)["files"][0]["file"] == str(policy), checked

    request = files / "agent ü.json"
    request.write_text('{"name": "spaced", "label": "spaced_t"}')
    made = ctx_run("agent", "create", request, "--storage", odd, "--json", env=env)
    assert made.rc == 0 and made.json()["name"] == "spaced", made
    assert (odd / "agent" / "spaced").exists() and not (storage / "agent" / "spaced").exists()

    config, _ = mcp_config
    out = tmp_path / "candidates"
    where = "/work space/ü.json"
    projected = ctxmcp("project", f"--config={config}", "--server=t", "--runtime-config", where,
                       f"--out={out}", "--json")  # fmt: skip
    assert projected.rc == 0, projected
    candidate = json.loads((out / "t.echo.manifest.json").read_text())
    assert candidate["mcp"]["config"] == where, candidate


# --- 8. "--" and "-" -------------------------------------------------------------------------


def test_double_dash_ends_the_options_of_every_command_that_takes_operands(
    storage: Path, files: Path, tmp_path: Path
) -> None:
    """§2.4, P-8, T-8, §8, D-1, H-3: after ``--`` a word that starts with ``-`` is an operand:
    a manifest or agent request called ``-x.json`` is read, a word such as ``--json`` after
    ``--`` is an extra operand (a usage error, no JSON on stdout), and a name that starts
    with ``-`` stays illegal (R-3)."""
    ctx = on(storage)
    here = tmp_path / "here"
    here.mkdir()
    (here / "-m.json").write_text((files / "demo.forms.json").read_text())
    (here / "demo.forms.sh").write_text((files / "demo.forms.sh").read_text())
    (here / "-a.json").write_text('{"name": "dashed", "label": "dashed_t"}')

    checked = ctx("object", "check", "--", "-m.json", cwd=here)
    assert checked.rc == 0 and "-m.json" in checked.out, checked
    bare = ctx("object", "check", "-m.json", cwd=here)
    assert is_usage_error(bare), bare
    made = ctx("agent", "create", "--json", "--", "-a.json", cwd=here)
    assert made.rc == 0 and made.json()["name"] == "dashed", made
    query = ctx("policy", "query", "--policy", str(files / "a.policy"), "--", "a_t", "tool:x",
                "execute")  # fmt: skip
    assert (query.rc, query.out) == (0, "allow\n"), query
    manual = ctx("man", "--", "agent")
    assert manual.rc == 0 and manual.out.startswith("# ctx.agent"), manual
    config = ctx("tool", "--", "tsh.config")
    assert config.rc == 0 and "max_loaded_tools=" in config.out, config

    for words in (
        ["agent", "show", "--", "dashed", "--json"],
        ["object", "which", "--", "fs.read", "--json"],
        ["man", "--", "agent", "--json"],
    ):
        extra = ctx(*words)
        assert is_usage_error(extra) and extra.out == "", extra
    for words in (
        ["agent", "show", "--json", "--", "-dashed"],
        ["policy", "query", "--policy", str(files / "a.policy"), "--json", "--", "-a_t",
         "tool:x", "execute"],
        ["session", "list", "--json", "--", "-coder"],
    ):  # fmt: skip
        illegal = ctx(*words)
        assert is_usage_error(illegal), illegal
        assert [d["error"] for d in json_documents(illegal.out)] == ["EINVAL"], illegal


def test_dash_is_standard_input_for_a_request_a_policy_and_a_result(
    storage: Path, files: Path
) -> None:
    """§2.4 (``publish … -``, ``finish … [RESULT_FILE | -]``), P-8 (``-`` reads stdin, for
    check and for each ``--policy``), §8 (``agent create -``): ``-`` in any of its places
    reads the pipe, with the options before or after it."""
    ctx = on(storage)
    published = ctx("queue", "publish", "-", "--name=piped", "-p", "proj", input=REQUEST)
    assert (published.rc, published.out) == (0, "piped.req.json\n"), published
    claimed = ctx("queue", "claim", "-p", "proj")
    assert claimed.out == "piped.req.json\n", claimed
    finished = ctx("queue", "finish", "piped.req.json", "-", "--error", "-p", "proj",
                   input='{"why": "piped"}')  # fmt: skip
    assert finished.rc == 0, finished
    result = json.loads((storage / "shared/proj/queue/failed/piped.req.json.result").read_text())
    assert (result["status"], result["output"]) == ("error", {"why": "piped"}), result

    made = ctx("agent", "create", "-", "--json", input='{"name": "piped", "label": "piped_t"}')
    assert made.rc == 0 and made.json()["name"] == "piped", made
    query = ctx("policy", "query", "a_t", "tool:x", "execute", "--policy=-", "--json",
                input=POLICY)  # fmt: skip
    assert query.rc == 0 and query.json()["decision"] == "allow", query
    check = ctx("policy", "check", str(files / "a.policy"), "-", input="allow a_t tool:* execute\n")
    assert check.rc == 1 and check.err.startswith("-:1: EINVAL: "), check


# --- 9. --storage against $CTX_STORAGE, however spelt ----------------------------------------


def test_the_storage_option_beats_the_environment_in_every_spelling(
    storage: Path, _template: Path, tmp_path: Path
) -> None:
    """R-1: "``CTX_STORAGE`` or ``--storage DIR`` overrides it everywhere", the option before
    the environment: with ``$CTX_STORAGE`` naming root A, ``--storage B``, ``--storage=B`` on
    the subcommand and ``ctx --storage=B`` before it each read and write root B only, for the
    agent, object, session, manual, shared-space and queue commands."""
    a = storage
    b = copy_of_root(_template, tmp_path / "b")
    env = clean_env(CTX_STORAGE=str(a))
    made = ctx_run("agent", "create", "-", "--storage", b, env=env,
                   input='{"name": "onlyb", "label": "onlyb_t"}')  # fmt: skip
    assert made.rc == 0, made
    assert (b / "agent/onlyb").exists() and not (a / "agent/onlyb").exists()

    def spellings(*words: str) -> list[list[str]]:
        return [
            [*words, "--storage", str(b)],
            [*words, f"--storage={b}"],
            [f"--storage={b}", *words],
            ["--storage", str(b), *words],
        ]

    for words in spellings("agent", "list", "--json"):
        listed = ctx_run(*words, env=env)
        assert listed.rc == 0 and [x["name"] for x in listed.json()] == ["onlyb"], listed
    page = ctx_run("man", "tool", "--json", f"--storage={b}", env=env)
    assert page.rc == 0 and page.json()["path"].startswith(f"{b}/"), page
    sessions = ctx_run("--storage", b, "session", "list", "onlyb", env=env)
    assert sessions.rc == 0, sessions  # the agent exists in b only
    for at, words in enumerate(spellings("shared", "create")):
        space = f"space{at}"
        assert ctx_run(*words, space, env=env).rc == 0
        assert (b / "shared" / space).is_dir() and not (a / "shared" / space).exists()
    for at, words in enumerate(spellings("queue", "init")):
        project = f"proj{at}"
        assert ctx_run(*words, "-p", project, env=env).rc == 0
        assert (b / "shared" / project / "queue").is_dir()
        assert not (a / "shared" / project).exists()
    in_a = ctx_run("agent", "list", "--json", env=env)
    assert [x["name"] for x in in_a.json()] == [], in_a


# --- 10. malformed command lines: usage lines, exit 2, nothing changed ------------------------


def test_unknown_options_extra_operands_and_clashing_flags_change_nothing(
    with_coder: Path, files: Path, tmp_path: Path
) -> None:
    """§2.4 (2 usage error): an unknown option in the ``=`` form or as a short option, an
    operand too many, a flag given a value, ``--ok`` with ``--error``, ``--name`` with
    ``--batch``, ``--project`` with ``--queue``, and a JOB without ``--ok``/``--error``: exit
    2, the usage and the pointer to ``--help`` on stderr before ``ctx: EINVAL: …``, nothing on
    stdout, the claimed job still claimed and nothing else changed."""
    ctx = on(with_coder)
    req = str(files / "req.json")
    assert ctx("queue", "publish", "-p", "proj", "--name", "held", req).rc == 0
    assert ctx("queue", "claim", "-p", "proj").out == "held.req.json\n"
    queue_path = str(with_coder / "shared/proj/queue")
    lines = {
        "ctx queue publish": [
            ["queue", "publish", "-p", "proj", "--nosuch=1", req],
            ["queue", "publish", "-p", "proj", "-Z", req],
            ["queue", "publish", "-p", "proj", req, req],
            ["queue", "publish", "-p", "proj", "--batch", "--name", "x", req],
            ["queue", "publish", "-p", "proj", "--queue", queue_path, req],
        ],
        "ctx queue finish": [
            ["queue", "finish", "-p", "proj", "held.req.json"],
            ["queue", "finish", "-p", "proj", "held.req.json", "--ok", "--error"],
            ["queue", "finish", "-p", "proj", "held.req.json", "--ok", "-", "extra"],
        ],
        "ctx queue recover": [["queue", "recover", "-p", "proj", "--reconcile", "--nosuch=1"]],
        "ctx agent create": [["agent", "create", str(files / "agent.json"), "extra"]],
        "ctx policy query": [
            ["policy", "query", "--policy", str(files / "a.policy"), "a_t", "tool:x"],
        ],
        "ctx session repair": [["session", "repair", "coder", "default", "extra"]],
    }
    before = quiet_root(with_coder)
    wrong = []
    for command, variants in lines.items():
        for words in variants:
            answer = ctx(*words, input=REQUEST)
            if not (is_usage_error(answer) and has_usage_lines(answer, command)) or answer.out:
                wrong.append(answer)
    assert wrong == []
    assert quiet_root(with_coder) == before
    assert os.listdir(with_coder / "shared/proj/queue/claimed") == ["held.req.json"]


def test_an_option_missing_its_value_is_refused_with_the_usage_like_any_other(
    storage: Path,
) -> None:
    """§2.4 (2 usage error) and the way ctx reports every other malformed command line, ``ctx
    run --agent`` included: the command's usage, ``Try 'ctx … --help' for help.``, then
    ``ctx: EINVAL: Option '--project' requires an argument.``"""
    ctx = on(storage)
    run_answer = ctx("run", "--agent")
    assert has_usage_lines(run_answer, "ctx run"), run_answer
    wrong = []
    for command, words in (
        ("ctx queue status", ["queue", "status", "--project"]),
        ("ctx queue status", ["queue", "status", "-p"]),
        ("ctx queue status", ["queue", "status", "-p", "proj", "--json=1"]),
        ("ctx policy query", ["policy", "query", "--policy"]),
        ("ctx session show", ["session", "show", "coder", "--session"]),
        ("ctx", ["--storage"]),
    ):
        answer = ctx(*words)
        assert is_usage_error(answer), answer
        if not has_usage_lines(answer, command):
            wrong.append(answer)
    assert wrong == []


def test_json_is_not_printed_for_a_command_line_that_did_not_ask_for_it(
    storage: Path,
) -> None:
    """§2.4: "--json gives machine-readable output on stdout; human text otherwise"; in text
    mode claim prints the job name "and nothing else on stdout"; ``ctx run`` has no --json,
    and every word after TOOL is the tool's (``ctx run --help``).  A word ``--json`` that is
    the value of ``--worker`` or ``--policy``, or an argument of the tool, asks for nothing:
    the usage error goes to stderr and stdout stays empty."""
    ctx = on(storage)
    wrong = []
    for words in (
        ["queue", "claim", "-p", "proj", "--worker", "--json", "--ttl", "0"],
        ["policy", "query", "--policy", "--json", "a_t", "tool:x"],
        ["--storage=", "run", "--agent", "coder", "fs.stat", "--json"],
        ["tool", "--nosuch", "tsh.config", "--json"],
    ):
        answer = ctx(*words)
        assert answer.rc == 2 and "ctx: EINVAL: " in answer.err, answer
        if answer.out != "":
            wrong.append(answer)
    assert wrong == []
