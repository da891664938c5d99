"""Every command line of ``ctx`` and ``ctxmcp``, found by walking the "Commands:" sections of
their ``--help`` when the tests are collected (a command added later is swept too), held to
what a user relies on at each: a help that says how to call the command and lists exactly the
options it takes, a malformed command line refused as a usage error (SPEC §2.4: exit 2) that
makes nothing, and a storage root that is missing or empty answered with its errno (R-1), in
one JSON document on stdout where ``--json`` was asked for."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    REPO,
    ROOT_ENTRIES,
    clean_env,
    find_values,
    snapshot,
    tool_manifest,
)
from tests.support.storage import copy_of_root

BIN = REPO / ".venv" / "bin"
PROGRAMS = ("ctx", "ctxmcp")
ENTRY_POINTS = {"ctx": "cortexfs.cli:main", "ctxmcp": "cortexfs.cli.ctxmcp:main"}
UNKNOWN = "--no-such-option"


# --- what the help of each command says -----------------------------------------------------


@dataclass
class Option:
    names: list[str]
    takes_value: bool
    required: bool


@dataclass
class Help:
    command: tuple[str, ...]
    text: str
    usage: str = ""
    description: str = ""
    operands: list[str] = field(default_factory=list)  # the usage line after [OPTIONS]
    options: list[Option] = field(default_factory=list)
    subcommands: dict[str, str] = field(default_factory=dict)

    @property
    def prog(self) -> str:
        return " ".join(self.command)

    def long_options(self) -> set[str]:
        return {name for option in self.options for name in option.names if name[:2] == "--"}

    def offers(self, name: str) -> bool:
        return any(name in option.names for option in self.options)

    def required_operands(self) -> list[str]:
        """The operands of the usage line outside brackets: ``NAME``, ``(FILE | -)``."""
        return [word for word in self.operands if not word.startswith("[")]


def _sections(text: str) -> dict[str, list[str]]:
    """The indented lines below each ``Heading:`` line (click's and argparse's alike)."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        heading = re.fullmatch(r"([A-Za-z][A-Za-z ]*):", line)
        if heading:
            current = sections.setdefault(heading.group(1).lower(), [])
        elif current is not None and line.startswith(" "):
            current.append(line)
        elif line.strip():
            current = None
    return sections


def parse_help(command: tuple[str, ...], text: str) -> Help:
    helped = Help(command, text)
    lines = text.splitlines()
    helped.usage = lines[0] if lines else ""
    after = helped.usage.partition("[OPTIONS]")[2].strip()
    helped.operands = re.findall(r"\[[^\]]*\](?:\.\.\.)?|\([^)]*\)|\S+", after)
    body = []
    for line in lines[1:]:
        if re.fullmatch(r"[A-Za-z][A-Za-z ]*:", line):
            break
        body.append(line)
    helped.description = "\n".join(body).strip()
    sections = _sections(text)
    entries: list[str] = []
    for line in sections.get("options", []):
        if re.match(r" {2}-", line):
            entries.append(line)
        elif entries:  # its help goes on (or starts) on the next lines
            entries[-1] += "  " + line.strip()
    for entry in entries:
        # "--storage DIRECTORY  Storage root…", "-p, --project TEXT  …", "-f, --follow  …"
        head, _, rest = entry.strip().partition("  ")
        *aliases, last = head.split(", ")
        name, _, metavar = last.partition(" ")
        helped.options.append(Option([*aliases, name], bool(metavar.strip()), "[required]" in rest))
    for line in sections.get("commands", []):
        if re.match(r" {2}\S", line):
            name, _, summary = line.strip().partition(" ")
            helped.subcommands[name] = summary.strip()
    return helped


def _run(
    argv: Iterable[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    stdin: bytes = b"",
) -> tuple[int, str, str]:
    argv = list(argv)
    done = subprocess.run(
        [str(BIN / argv[0]), *argv[1:]],
        input=stdin,
        capture_output=True,
        env=env if env is not None else clean_env(),
        cwd=cwd,
        timeout=60,
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def _discover() -> dict[tuple[str, ...], Help]:
    """Every command and subcommand, from the "Commands:" sections of each ``--help``."""
    found: dict[tuple[str, ...], Help] = {}
    scratch = Path(tempfile.mkdtemp(prefix="ctx-sweep-discover-"))
    env = clean_env(CTX_STORAGE=str(scratch / "no-root"))
    todo: list[tuple[str, ...]] = [(program,) for program in PROGRAMS]
    try:
        with ThreadPoolExecutor(4) as pool:
            while todo:
                answers = list(
                    pool.map(lambda c: (c, _run([*c, "--help"], env=env, cwd=scratch)), todo)
                )
                todo = []
                for command, (_, out, _) in answers:
                    found[command] = parse_help(command, out)
                    todo += [(*command, name) for name in found[command].subcommands]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return found


TREE = _discover()
ALL = sorted(TREE)
LEAVES = [command for command in ALL if not TREE[command].subcommands]
IDS = [" ".join(command) for command in ALL]
LEAF_IDS = [" ".join(command) for command in LEAVES]
# The options that more than one command takes: the ones a command is likeliest to take too.
SHARED_OPTIONS = {
    name
    for name in set().union(*(helped.long_options() for helped in TREE.values()))
    if sum(name in helped.long_options() for helped in TREE.values()) > 1
} - {"--help"}


def test_the_walk_found_the_command_tree() -> None:
    """SPEC §2.4, §5 P-8, T-8, §8, §10 M-1, §13 F-1: the commands they name are in the tree
    the walk found, so that the sweep below stands on the whole of it."""
    named = {
        ("ctx", "queue", name)
        for name in ("init", "publish", "claim", "renew", "finish", "status", "list", "show")
    } | {
        ("ctx", "queue", "recover"),
        ("ctx", "queue", "work"),
        ("ctx", "policy", "check"),
        ("ctx", "policy", "query"),
        ("ctx", "object", "check"),
        ("ctx", "object", "install"),
        ("ctx", "object", "which"),
        ("ctx", "object", "list"),
        ("ctx", "agent", "start"),
        ("ctx", "agent", "watch"),
        ("ctx", "agent", "attach"),
        ("ctx", "bootstrap"),
        ("ctx", "man"),
        ("ctx", "mount"),
        ("ctx", "umount"),
        ("ctx", "tool"),
        ("ctx", "run"),
        ("ctxmcp", "list"),
        ("ctxmcp", "project"),
    }
    assert named <= set(TREE), sorted(named - set(TREE))


# --- 1. --help ----------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ALL, ids=IDS)
def test_help_says_how_to_call_the_command_and_what_it_does(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    """Every command answers ``--help`` and ``-h`` alike (exit 0, nothing on stderr) with its
    usage line, a description and its options, and a group with a summary of each command;
    asking for help makes nothing, in the storage root or in the current directory (R-1)."""
    here = tmp_path / "here"
    here.mkdir()
    env = clean_env(CTX_STORAGE=str(tmp_path / "root"))
    long_form = _run([*command, "--help"], env=env, cwd=here)
    short_form = _run([*command, "-h"], env=env, cwd=here)

    rc, out, err = long_form
    assert (rc, err) == (0, ""), long_form
    assert short_form == long_form
    helped = parse_help(command, out)
    assert helped.usage.startswith(f"Usage: {helped.prog} [OPTIONS]"), helped.usage
    assert len(helped.description) > 20, out
    assert helped.offers("--help") and helped.offers("-h"), out
    for name, summary in helped.subcommands.items():
        assert summary, f"{helped.prog} {name} has no summary in {helped.prog} --help"
    assert os.listdir(here) == [] and not (tmp_path / "root").exists()


# --- 2. the options the help lists are those the command takes ---------------------------------

# Many command lines are run below: each through the console script's entry point (the
# function .venv/bin/ctx and .venv/bin/ctxmcp call), in a process of its own forked from one that
# has loaded the command's modules, with its own environment, directory and standard streams.
# The --help of each command, and the discovery above, run the installed scripts themselves.
_DRIVER = r"""
import json, os, sys
module, attribute = sys.argv[1].split(":")
main = getattr(__import__(module, fromlist=[attribute]), attribute)
given = json.loads(sys.stdin.read())
scratch = sys.argv[2]

def quietly(argv):
    try:
        main(argv)
    except SystemExit as end:
        return end.code if isinstance(end.code, int) else int(end.code is not None)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return 0

def call(probe):
    out, err = os.path.join(scratch, "out"), os.path.join(scratch, "err")
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            for fd, path in ((1, out), (2, err)):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
            if probe.get("env") is not None:
                os.environ.clear()
                os.environ.update(probe["env"])
            os.chdir(probe.get("cwd") or scratch)
            sys.argv = [sys.argv[0], *probe["argv"]]
            code = quietly(probe["argv"])
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    with open(out) as o, open(err) as e:
        return [os.waitstatus_to_exitcode(status), o.read(), e.read()]

saved = [os.dup(1), os.dup(2)]
null = os.open(os.devnull, os.O_WRONLY)
os.dup2(null, 1)
os.dup2(null, 2)
quietly(given["warmup"])  # loads the command's modules once, before the forks
os.dup2(saved[0], 1)
os.dup2(saved[1], 2)
print(json.dumps([call(probe) for probe in given["probes"]]))
"""

Answer = tuple[int, str, str]


def run_many(
    command: tuple[str, ...],
    argvs: list[list[str]],
    scratch: Path,
    *,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    envs: list[dict[str, str] | None] | None = None,
) -> list[Answer]:
    """Each argument vector (the program's name first) run as that program runs it."""
    if not argvs:
        return []
    scratch.mkdir(exist_ok=True)
    envs = envs or [None] * len(argvs)
    probes = [
        {"argv": argv[1:], "env": one if one is not None else env, "cwd": str(cwd or scratch)}
        for argv, one in zip(argvs, envs, strict=True)
    ]
    done = subprocess.run(
        [str(BIN / "python"), "-c", _DRIVER, ENTRY_POINTS[command[0]], str(scratch)],
        input=json.dumps({"warmup": [*command[1:], "--help"], "probes": probes}).encode(),
        capture_output=True,
        env=clean_env(CTX_STORAGE=str(scratch / "no-root")),
        cwd=scratch,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()
    return [tuple(answer) for answer in json.loads(done.stdout)]


# ctx run (argparse) and ctx tool hand every word from their first operand on to the tool: an
# unknown option is refused once the operand is there ("No such option"), and --help after it
# would be acted on first.
OPERAND_FIRST = {("ctx", "run"): ["--agent", "coder", "fs.stat"], ("ctx", "tool"): ["tsh.config"]}
NOT_TAKEN = r"No such option '{name}'"


@pytest.mark.parametrize("command", ALL, ids=IDS)
def test_the_options_a_help_lists_are_exactly_those_the_command_takes(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    """SPEC §2.4's command lines as a user reads them off ``--help``: each option listed is
    taken, with a value exactly when the help shows one, and none of the options that other
    commands take is taken here without being listed (an option the help hides)."""
    helped = TREE[command]
    program, words = command[0], list(command[1:])
    listed: list[tuple[str, list[str], str]] = []
    for option in helped.options:
        for name in option.names:
            if name in ("-h", "--help"):
                continue
            if option.takes_value:
                given = [f"{name}=1"] if name.startswith("--") else [name, "1"]
                listed.append((f"{name} takes a value", [*words, *given, "--help"], "ok"))
            else:
                listed.append((f"{name} is a flag", [*words, name, "--help"], "ok"))
                if name.startswith("--"):
                    argv = [*words, f"{name}=1", "--help"]
                    listed.append((f"{name} takes no value", argv, "refused"))
    unlisted = sorted(SHARED_OPTIONS - helped.long_options())
    for name in unlisted:
        argv = [*words, f"{name}=1", "--help"]
        if command in OPERAND_FIRST:  # --help past an unknown option would be acted on
            argv = [*words, f"{name}=1", *OPERAND_FIRST[command]]
        listed.append((f"{name} is not taken", argv, name))

    answers = run_many(command, [[program, *argv] for _, argv, _ in listed], tmp_path / "probe")

    wrong = []
    for (what, argv, expected), (rc, out, err) in zip(listed, answers, strict=True):
        if expected == "ok":
            # --version is eager too, and answers first
            good = rc == 0 and out.startswith(
                f"Usage: {program}" if "--version" not in argv else program
            )
        elif expected == "refused":
            good = rc == 2 and re.search(r"does not take a value|ignored explicit argument", err)
        else:
            said = NOT_TAKEN.format(name=re.escape(expected))
            good = rc == 2 and re.search(said, err)
        if not good:
            wrong.append(
                f"{helped.prog}: expected {what}: {' '.join(argv)} -> exit {rc}: {err[-200:]}"
            )
    assert wrong == []


def _command_part(line: str) -> str:
    """``line`` up to a shell comment or a pipe; a ``|`` in brackets is a synopsis's choice."""
    depth = 0
    for at, char in enumerate(line):
        depth += (char in "([{") - (char in ")]}")
        if char == "#" or (char == "|" and depth == 0):
            return line[:at]
    return line


def _documented_synopses() -> list[tuple[tuple[str, ...], str, str]]:
    """(command, option, where) for each option that a command line in the documents gives a
    command: the code blocks and `inline` commands of README.md, docs/*.md and the manual's
    pages (docs/spec/*.md), which restate SPEC's command lines."""
    documents = [
        REPO / "README.md",
        *sorted((REPO / "docs").glob("*.md")),
        *sorted((REPO / "docs" / "spec").glob("*.md")),
    ]
    found = []
    for document in documents:
        text = document.read_text()
        blocks = re.findall(r"^```\w*\n(.*?)^```", text, flags=re.M | re.S)
        lines = [line for block in blocks for line in block.splitlines()]
        lines += re.findall(r"`((?:ctx|ctxmcp) [^`]*)`", text)
        for line in lines:
            line = _command_part(re.sub(r"^\s*\$ ", "", line.strip()))
            words = line.split()
            if not words or words[0] not in PROGRAMS:
                continue
            command: tuple[str, ...] = (words[0],)
            rest = words[1:]
            while rest:
                if (*command, rest[0]) in TREE:
                    command = (*command, rest.pop(0))
                    continue
                taken = [o for o in TREE[command].options if rest[0].split("=")[0] in o.names]
                if not taken or not TREE[command].subcommands:
                    break
                found.append((command, rest.pop(0).split("=")[0], f"{document.name}: {line}"))
                if taken[0].takes_value and rest and "=" not in rest[0]:
                    rest.pop(0)
            if command in (("ctx", "run"), ("ctx", "tool")):
                continue  # words after TOOL or NAME are the tool's
            for word in rest:
                for name in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", word):
                    found.append((command, name, f"{document.name}: {line}"))
    return found


def test_every_option_the_documents_give_a_command_is_in_its_help() -> None:
    """SPEC §2.4, P-8, T-8, M-1 and the docs print command lines to copy: each option they
    give a command is one its ``--help`` lists (a group's option given after the group's
    subcommand is the subcommand's)."""
    missing = sorted(
        {
            f"{' '.join(command)} {name}   ({where})"
            for command, name, where in _documented_synopses()
            if name not in TREE[command].long_options() | {"--help"}
        }
    )
    assert missing == []


# --- 3. a malformed command line ---------------------------------------------------------------


def _json_documents(out: str) -> list:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _assert_usage_error(command: tuple[str, ...], answer: tuple[int, str, str], said: str) -> None:
    """Exit 2, click's usage lines on stderr, then ``PROG: EINVAL: <said…>`` (SPEC §2.4)."""
    rc, _, err = answer
    prog = " ".join(command)
    lines = err.splitlines()
    assert rc == 2 and len(lines) >= 3, answer
    assert lines[0].startswith(f"Usage: {prog} "), answer
    assert lines[1] == f"Try '{prog} --help' for help.", answer
    assert lines[-1].startswith(f"{command[0]}: EINVAL: {said}"), answer
    assert "Traceback" not in err


def _assert_error_object(answer: tuple[int, str, str], errno_name: str) -> dict:
    """stdout is one JSON object naming the errno, and stderr says the same sentence."""
    _, out, err = answer
    documents = _json_documents(out)
    assert len(documents) == 1 and len(out.strip().splitlines()) == 1, answer
    error = documents[0]
    assert error["error"] == errno_name and isinstance(error["errno"], int), answer
    # stderr: "PROG: ERRNO: sentence", the message's sentence (the first of several problems)
    said = [line.split(f": {errno_name}: ", 1)[1] for line in err.splitlines()
            if re.match(rf"[a-z]+: {errno_name}: ", line)]  # fmt: skip
    assert any(error["message"].startswith(sentence) for sentence in said), answer
    return error


# Where the docs promise the error object of a usage error on stdout: every queue command
# (README, docs/queue.md "Command line": "a malformed command line included") and policy query
# (docs/policy.md: "the error object on stdout with --json").  The other commands print it too
# or nothing; never anything else.
JSON_USAGE_ERRORS_DOCUMENTED = {("ctx", "queue"), ("ctx", "policy", "query")}


def _json_usage_error_documented(command: tuple[str, ...]) -> bool:
    return any(command[: len(prefix)] == prefix for prefix in JSON_USAGE_ERRORS_DOCUMENTED)


# Commands whose refusal of an unknown option is a defect of its own, tested on its own below.
UNKNOWN_OPTION_DEFECTS = {("ctx", "tool")}


@pytest.mark.parametrize("command", ALL, ids=IDS)
def test_an_unknown_option_or_a_missing_operand_is_a_usage_error_that_makes_nothing(
    command: tuple[str, ...], tmp_path: Path, storage: Path
) -> None:
    """SPEC §2.4: "2 usage error", for every command: an unknown option, and a command line
    without an operand or option the usage line requires (a bare group: its help, on stderr),
    exit 2 with the usage on stderr, nothing on stdout but the error object where --json was
    asked for, and nothing made in the storage root or the current directory."""
    helped = TREE[command]
    here = tmp_path / "here"
    here.mkdir()
    before = snapshot(storage)
    words = list(command)
    if command in OPERAND_FIRST:  # an option before the operand, where options go
        unknown = [*words, UNKNOWN, *OPERAND_FIRST[command]]
    else:
        unknown = [*words, UNKNOWN]
    at = len(words)
    offers_json = helped.offers("--json")
    required = helped.required_operands() or [o for o in helped.options if o.required]
    calls = {"unknown": unknown}
    if offers_json:
        calls["unknown --json"] = [*unknown[:at], "--json", *unknown[at:]]
    if helped.subcommands or required:
        calls["bare"] = words
        if offers_json:
            calls["bare --json"] = [*words, "--json"]

    answers = dict(
        zip(
            calls,
            run_many(
                command,
                list(calls.values()),
                tmp_path / "scratch",
                env=clean_env(CTX_STORAGE=str(storage)),
                cwd=here,
            ),
            strict=True,
        )
    )

    answer = answers["unknown"]
    if command not in UNKNOWN_OPTION_DEFECTS:
        _assert_usage_error(command, answer, f"No such option '{UNKNOWN}'")
    assert answer[0] == 2 and answer[1] == "", answer
    if offers_json:
        rc, out, err = answer = answers["unknown --json"]
        assert rc == 2, answer
        if out or _json_usage_error_documented(command):
            error = _assert_error_object(answer, "EINVAL")
            assert error["errno"] == 22 and UNKNOWN in error["message"]
    if helped.subcommands:
        rc, out, err = answer = answers["bare"]
        assert (rc, out) == (2, ""), answer
        assert err.startswith(f"Usage: {helped.prog} [OPTIONS] COMMAND"), answer
        assert all(name in err for name in helped.subcommands), answer
    elif required:
        answer = answers["bare"]
        _assert_usage_error(command, answer, "")
        assert re.search(r"EINVAL: [Mm]issing ", answer[2]), answer
        assert answer[1] == ""
        if offers_json:
            answer = answers["bare --json"]
            assert answer[0] == 2, answer
            if answer[1] or _json_usage_error_documented(command):
                message = _assert_error_object(answer, "EINVAL")["message"]
                assert message.lower().startswith("missing "), answer
    assert os.listdir(here) == []
    assert snapshot(storage) == before


# --- 4. a storage root that is missing, or named by an empty string ---------------------------

# A sample command line for each command, built from its usage line and the options its help
# marks [required]: a value for each operand and option by its name, so that a command added
# later gets one too.
SAMPLE_OPERANDS = {
    "NAME": "coder",
    "AGENT": "coder",
    "JOB": "j1",
    "SUBJECT": "coder_t",
    "CLASS:NAME": "tool:fs.read",
    "PERM": "execute",
    "TOOL": "fs.stat",
    "MOUNTPOINT": "{mountpoint}",
    "REQUEST": "{agent_request}",
    "MANIFEST": "{manifest}",
    "MANIFESTS...": "{manifest}",
    "FILE...": "{policy}",
    "(FILE | -)": "{job_request}",
}
SAMPLE_OPERANDS_OF = {
    ("ctx", "shared", "create"): {"NAME": "s1"},
    ("ctx", "object", "which"): {"NAME": "fs.read"},
    ("ctx", "tool"): {"NAME": "tsh.config"},
}
SAMPLE_OPTIONS = {
    "--project": "proj",  # not marked [required], but a queue command needs it (§2.4)
    "--policy": "{policy}",
    "--tier": "system",
    "--config": "{mcp_config}",
    "--server": "time",
    "--runtime-config": "/mcp/mcp.json",
    "--out": "{out}",
}
SAMPLE_FLAGS = {("ctx", "queue", "finish"): ["--ok"], ("ctx", "run"): ["--agent", "coder"]}


def sample_files(directory: Path) -> dict[str, str]:
    directory.mkdir()
    (directory / "agent.json").write_text('{"name": "coder", "label": "coder_t"}')
    (directory / "job.json").write_text('{"tool": "fs.stat", "input": {"path": "/"}}')
    (directory / "coder.policy").write_text("allow coder_t tool:fs.read execute\n")
    (directory / "mountpoint").mkdir()
    marker = directory / "server-started"
    # ctxmcp's server leaves a mark when it is started at all
    (directory / "mcp.json").write_text(
        json.dumps(
            {"mcpServers": {"time": {"command": "/bin/sh", "args": ["-c", f": > {marker}"]}}}
        )
    )
    manifest = tool_manifest(directory / "manifests", "sweep.echo", "#!/bin/sh\ncat\n")
    return {
        "agent_request": str(directory / "agent.json"),
        "job_request": str(directory / "job.json"),
        "policy": str(directory / "coder.policy"),
        "mountpoint": str(directory / "mountpoint"),
        "mcp_config": str(directory / "mcp.json"),
        "out": str(directory / "out"),
        "manifest": str(manifest),
        "marker": str(marker),
    }


def sample_argv(command: tuple[str, ...], files: dict[str, str]) -> list[str]:
    """A sample command line, with --json where the command offers it: options first (ctx run
    and ctx tool take theirs before the operand), then operands."""
    helped = TREE[command]
    words: list[str] = list(SAMPLE_FLAGS.get(command, []))
    for option in helped.options:
        name = option.names[-1]
        queue_command = name == "--project" and helped.offers("--queue")
        if name in SAMPLE_OPTIONS and (option.required or queue_command):
            words += [name, SAMPLE_OPTIONS[name].format(**files)]
        elif option.required:
            words += [name, "x"]
    if helped.offers("--json"):
        words.append("--json")
    operands = {**SAMPLE_OPERANDS, **SAMPLE_OPERANDS_OF.get(command, {})}
    for operand in helped.required_operands():
        words.append(operands.get(operand, "x").format(**files))
    return [*command, *words]


# Commands for which a missing storage root is documented to be made, not refused: R-5 for
# bootstrap, and docs/queue.md ("a storage root that does not exist yet is first made whole, as
# 'ctx bootstrap' makes it") for queue init and shared create.
MAKES_THE_ROOT = {("ctx", "bootstrap"), ("ctx", "queue", "init"), ("ctx", "shared", "create")}
# Commands that read no storage root, so that neither a missing nor an empty one is theirs to
# refuse: a manifest or policy file is checked on its own (T-8, P-8), umount takes a mount point,
# and ctxmcp list starts a server (M-1) and takes no --storage.
READS_NO_ROOT = {
    ("ctx", "object", "check"),
    ("ctx", "policy", "check"),
    ("ctx", "policy", "query"),
    ("ctx", "umount"),
    ("ctxmcp", "list"),
}
# ctx man prints the copy built into ctx where no bundle is installed (D-1, ctx man --help).
SHOWS_A_BUILT_IN_COPY = {("ctx", "man")}
# ctxmcp project reads the root only to refuse an --out inside it; with a root that does not
# exist it starts the server, which this sweep does not provide.
STARTS_A_SERVER = {("ctxmcp", "project")}
# ctx run in terminal mode: "126 when the call was refused" (docs/tools.md); it has no --json.
REFUSED_EXIT = {("ctx", "run"): 126}

# A set but empty $CTX_STORAGE is EINVAL, exit 1 (docs/queue.md "Command line"); 'ctx policy
# explain' says 1 for "denied" and 2 for a malformed request (docs/policy.md), ctxmcp 2 for what
# it refuses before the server starts (docs/tools.md), and 'ctx run' 126 for a refused call.
EMPTY_ENVIRONMENT_EXIT = {
    ("ctx", "policy", "explain"): 2,
    ("ctxmcp", "project"): 2,
    ("ctx", "run"): 126,
}

# Exit statuses that are a defect of their own, tested on their own below.
EMPTY_ENVIRONMENT_EXIT_DEFECTS = {("ctx", "run")}


def _assert_refused(
    command: tuple[str, ...], answer: tuple[int, str, str], errno_name: str, rc: int | None
) -> None:
    """Exit ``rc``, ``PROG: ERRNO: sentence`` on stderr, and with --json the same error as the
    one JSON document on stdout."""
    status, out, err = answer
    assert status == rc or (rc is None and status != 0), answer
    assert re.search(rf"^{command[0]}: {errno_name}: \S", err, re.M), answer
    assert "Traceback" not in err
    if TREE[command].offers("--json"):
        _assert_error_object(answer, errno_name)
    else:
        assert out == "", answer


@pytest.mark.parametrize("command", LEAVES, ids=LEAF_IDS)
def test_a_missing_or_empty_storage_root_is_refused_with_its_errno_and_nothing_is_made(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    """R-1 and §2.4 for every command: a --storage that does not exist is ENOENT (exit 1)
    except where a command is documented to make the root (R-5); an empty --storage is EINVAL
    (exit 2, a usage error) and a set but empty $CTX_STORAGE EINVAL (exit 1), never the default
    root; each with --json is one JSON error object on stdout, and nothing is made anywhere."""
    if command in READS_NO_ROOT:
        pytest.skip("reads no storage root (see READS_NO_ROOT)")
    helped = TREE[command]
    files = sample_files(tmp_path / "files")
    here = tmp_path / "here"
    here.mkdir()
    missing = tmp_path / "no-root"
    argv = sample_argv(command, files)
    program, rest = argv[0], argv[1:]

    def at_root(root: str) -> list[str]:
        if helped.offers("--storage"):
            return (
                [*argv, "--storage", root]
                if command not in OPERAND_FIRST
                else [*argv[: len(command)], "--storage", root, *argv[len(command) :]]
            )
        return [program, "--storage", root, *rest]

    def made() -> list[str]:
        marker = ["server started"] if Path(files["marker"]).exists() else []
        return sorted(os.listdir(here)) + marker

    calls: dict[str, tuple[list[str], dict[str, str]]] = {}
    if command not in STARTS_A_SERVER:
        calls["missing"] = (at_root(str(missing)), clean_env())
    calls["--storage ''"] = (at_root(""), clean_env())
    if program == "ctx" and helped.offers("--storage"):
        calls["ctx --storage ''"] = ([program, "--storage", "", *rest], clean_env())
    calls["CTX_STORAGE=''"] = (argv, clean_env(CTX_STORAGE=""))

    answers = dict(
        zip(
            calls,
            run_many(
                command,
                [argv for argv, _ in calls.values()],
                tmp_path / "scratch",
                envs=[env for _, env in calls.values()],
                cwd=here,
            ),
            strict=True,
        )
    )

    # 1. a storage root that does not exist
    if "missing" in answers:
        answer = answers["missing"]
        if command in MAKES_THE_ROOT:
            assert answer[0] == 0, answer
            assert set(os.listdir(missing)) == ROOT_ENTRIES  # the root ABI, nothing else
            assert len(_json_documents(answer[1])) == 1, answer
        elif command in SHOWS_A_BUILT_IN_COPY:
            assert answer[0] == 0 and len(_json_documents(answer[1])) == 1, answer
            assert not missing.exists()
        else:
            _assert_refused(command, answer, "ENOENT", REFUSED_EXIT.get(command, 1))
            assert str(missing) in answer[2], answer
            assert not missing.exists()

    # 2. --storage '' (the subcommand's option, and the group's where there is one)
    for case in ("--storage ''", "ctx --storage ''"):
        if case in answers:
            answer = answers[case]
            groups = calls[case][0][1] == "--storage"  # ctx --storage '' COMMAND …
            _assert_usage_error((program,) if groups else command, answer, "")
            assert "'--storage'" in answer[2].splitlines()[-1], answer
            if answer[1] or _json_usage_error_documented(command):
                assert "--storage" in _assert_error_object(answer, "EINVAL")["message"]

    # 3. CTX_STORAGE set but empty
    answer = answers["CTX_STORAGE=''"]
    rc = EMPTY_ENVIRONMENT_EXIT.get(command, 1)
    _assert_refused(
        command, answer, "EINVAL", None if command in EMPTY_ENVIRONMENT_EXIT_DEFECTS else rc
    )
    assert "CTX_STORAGE" in answer[2], answer
    assert made() == []


# --- 5. --json on success and on a refusal ----------------------------------------------------

# Not runnable in a sweep: 'agent start' starts a sandboxed terminal (test_acceptance_terminal.py);
# ctxmcp needs an MCP server to answer (test_acceptance_mcp*.py); 'queue init' of any project
# makes its queue, so there is nothing to refuse.
JSON_ELSEWHERE = {("ctx", "agent", "start"), ("ctxmcp",), ("ctx", "queue", "init")}
# Every queue command's --json on a whole life of jobs is test_acceptance_queue_letter.py's
# (and 'queue work' without --drain would never end): only their refusal is swept here.
JSON_SUCCESS_ELSEWHERE = {("ctx", "queue")}
# "JSON Lines: each event as it is stored, one JSON object per line" (their --help).
JSON_LINES = {("ctx", "session", "show"), ("ctx", "session", "tail")}
# Exit 1 is an answer here, not a refusal: "deny" (P-8) and "denied" (docs/policy.md).
ONE_IS_AN_ANSWER = {("ctx", "policy", "query"), ("ctx", "policy", "explain")}
# A check answers with a report of every file, each problem with its errno, and says each on
# stderr as a linter does, FILE: ERRNO: reason (P-8, T-8); 'policy query' refuses a policy it
# cannot read as a malformed one, exit 2 (P-8), since 1 is "deny".
REPORTS = {("ctx", "object", "check"), ("ctx", "policy", "check")}
# "ENOENT (exit 1) when no terminal runs and none left anything" (ctx agent stop --help).
SAMPLE_REFUSED = {("ctx", "agent", "stop")}
# The name each sample uses, and one that names nothing there.
UNKNOWN_NAMES = {
    "coder": "nosuch",
    "fs.read": "fs.nosuch",
    "tsh.config": "nosuch.cli",
    "proj": "nosuch",
}


def _json_commands() -> list[tuple[str, ...]]:
    return [
        command
        for command in LEAVES
        if TREE[command].offers("--json")
        and not any(command[: len(prefix)] == prefix for prefix in JSON_ELSEWHERE)
    ]


def _assert_one_json_answer(command: tuple[str, ...], answer: Answer) -> None:
    rc, out, _ = answer
    documents = _json_documents(out)
    if command in JSON_LINES:
        assert documents and len(documents) == len(out.splitlines()), answer
    else:
        assert len(documents) == 1 and len(out.strip().splitlines()) == 1, answer
    errors = [
        document for document in documents if isinstance(document, dict) and "error" in document
    ]
    if rc == 0 or (rc == 1 and command in ONE_IS_AN_ANSWER and not errors):
        return
    _assert_error_object(answer, errors[0]["error"] if errors else "E?")


@pytest.fixture(scope="module")
def _agent_template(_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The acceptance root with agent coder (run as nobody when root creates it) and a session
    of its."""
    root = tmp_path_factory.mktemp("sweep") / "storage"
    copy_of_root(_template, root)
    files = sample_files(root.parent / "files")
    env = clean_env(CTX_STORAGE=str(root))
    created = _run(["ctx", "agent", "create", files["agent_request"]], env=env)
    assert created[0] == 0, created
    # a refused call is recorded all the same: coder has a session to show
    called = _run(["ctx", "run", "--agent", "coder", "fs.stat", "/"], env=env)
    assert called[0] == 126, called
    return root


@pytest.fixture
def with_an_agent(_agent_template: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    root = tmp_path / "storage"
    copy_of_root(_agent_template, root)
    return root, sample_files(tmp_path / "files")


@pytest.mark.parametrize("command", _json_commands(), ids=" ".join)
def test_json_is_one_document_on_stdout_whether_the_command_succeeds_or_is_refused(
    command: tuple[str, ...], with_an_agent: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """SPEC §2.4 ("--json gives machine-readable output on stdout") for every command that
    offers it: a command that does its work prints exactly one JSON document (JSON Lines where
    its help says so), and one refused for a name the root does not have (an agent, a tool, a
    topic) prints one error object with its errno, the same error on stderr as
    ``ctx: ERRNO: sentence``."""
    storage, files = with_an_agent
    env = clean_env(CTX_STORAGE=str(storage))
    argv = sample_argv(command, files)
    if command == ("ctx", "agent", "create"):
        argv = [*argv[:-1], files["agent_request"].replace("agent.json", "other.json")]
        Path(argv[-1]).write_text('{"name": "other", "label": "other_t"}')
    refusals: dict[str, tuple[list[str], str]] = {}
    unknown = [UNKNOWN_NAMES.get(word, word) for word in argv]
    if unknown != argv:
        refusals["an unknown name"] = (unknown, "ENOENT")
    missing_file = str(tmp_path / "no-such-file")
    for given in ("manifest", "policy"):  # a file operand that is not there
        if files[given] in argv:
            refusals[f"a missing {given}"] = (
                [missing_file if word == files[given] else word for word in argv],
                "ENOENT",
            )
    if command == ("ctx", "agent", "create"):
        refusals["an agent that exists"] = ([*argv[:-1], files["agent_request"]], "EEXIST")
    if command == ("ctx", "man"):
        refusals["an unknown topic"] = ([*argv, "nosuch"], "ENOENT")
    if command == ("ctx", "object", "list"):
        refusals["a tier nobody made"] = ([*argv, "--tier", "shared:nosuch"], "ENOENT")
    succeeds_here = command[:2] not in JSON_SUCCESS_ELSEWHERE and command not in SAMPLE_REFUSED
    if command in SAMPLE_REFUSED:
        refusals["the sample"] = (argv, "ENOENT")
    argvs = ([argv] if succeeds_here else []) + [given for given, _ in refusals.values()]

    answers = run_many(command, argvs, tmp_path / "scratch", env=env)

    if succeeds_here:
        done = answers.pop(0)
        assert done[0] == 0 or command in ONE_IS_AN_ANSWER, done
        _assert_one_json_answer(command, done)
    for (what, (_, errno_name)), answer in zip(refusals.items(), answers, strict=True):
        assert answer[0] == (2 if command == ("ctx", "policy", "query") else 1), (what, answer)
        if command in REPORTS:
            documents = _json_documents(answer[1])
            assert len(documents) == 1 and len(answer[1].strip().splitlines()) == 1, answer
            assert errno_name in find_values(documents[0], "error"), (what, answer)
            assert re.search(rf"^{re.escape(missing_file)}: {errno_name}: \S", answer[2], re.M)
            continue
        _assert_one_json_answer(command, answer)
        document = _json_documents(answer[1])[0]
        # an error object's "error", or the errno of the step that denied (policy explain)
        assert document.get("error", document.get("errno")) == errno_name, (what, answer)


# --- 6. two refusals that do not read as their documents say --------------------------------


def test_an_unknown_option_of_ctx_tool_is_refused_as_an_option(storage: Path) -> None:
    """§2.4 "2 usage error" and ``ctx tool --help`` ("Options of ctx tool go before NAME"): an
    option there that ctx tool does not take is refused as one, with the usage lines, as
    ``ctx run`` refuses an option before TOOL that it does not take."""
    env = clean_env(CTX_STORAGE=str(storage))
    tool = _run(["ctx", "tool", UNKNOWN, "tsh.config"], env=env)
    run = _run(["ctx", "run", "--agent", "coder", UNKNOWN, "fs.stat"], env=env)

    _assert_usage_error(("ctx", "run"), run, f"No such option '{UNKNOWN}'")
    _assert_usage_error(("ctx", "tool"), tool, f"No such option '{UNKNOWN}'")


def test_ctx_run_refused_for_an_empty_ctx_storage_exits_126_like_every_refused_call(
    tmp_path: Path,
) -> None:
    """docs/tools.md: "``ctx run`` exits with the tool's status …; 126 when the call was
    refused"; R-1: an empty $CTX_STORAGE names no root (EINVAL), so no tool ran and the exit
    is 126, as for a storage root that does not exist."""
    argv = ["ctx", "run", "--agent", "coder", "fs.stat", "/"]
    missing = _run(argv, env=clean_env(CTX_STORAGE=str(tmp_path / "no-root")), cwd=tmp_path)
    empty = _run(argv, env=clean_env(CTX_STORAGE=""), cwd=tmp_path)

    assert missing[0] == 126 and "ctx: ENOENT: " in missing[2], missing
    assert "ctx: EINVAL: CTX_STORAGE is set but empty" in empty[2], empty
    assert empty[0] == 126, empty
