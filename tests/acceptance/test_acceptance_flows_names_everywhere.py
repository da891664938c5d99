"""Every name a user passes to every ``ctx`` command, held to the letter of SPEC R-3 (object
names: 1 to 64 bytes of ASCII ``[A-Za-z0-9._-]``, first byte alphanumeric, not ``.`` or
``..``, no ``/``, no NUL, not ending in ``.d``; anything else ``EINVAL``) and to one rule per
kind of name: an agent, session, shared space, project, job or tool name that one command
takes is taken by every command that takes that kind of name, and one that a command refuses
is refused by every other the same way — ``EINVAL`` naming the rule broken, exit 2 (§2.4 "2
usage error"; ``ctx run --help``: "a malformed command line … is EINVAL, exit 2"), the name
shown escaped, nothing made.  Names that start with a dash are given after ``--`` or as
``--option=NAME``, so that they reach the command as names.  The manual bundle's name
``cortexfs-docs`` (X-2) is the one name reserved under ``shared/``."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Run,
    clean_env,
    ctx_run,
    mounted_at,
    new_scratch_dir,
    scratch_top,
    snapshot,
    tool_manifest,
)
from tests.support.storage import copy_of_root

SCRATCH = scratch_top(__file__)
BUNDLE = "cortexfs-docs"
REQUEST = '{"tool": "fs.stat", "input": {"path": "/"}}'

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid (nobody)")


# --- the world: a bootstrapped root with the queue of proj and agent coder -------------------


@dataclass
class World:
    top: Path
    storage: Path

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    def ctx(self, *args: str | os.PathLike, **kw) -> Run:
        kw.setdefault("env", self.env)
        kw.setdefault("cwd", self.top)
        kw.setdefault("timeout", 60)
        return ctx_run(*args, **kw)

    def ctx_each(self, argvs: list[list[str]]) -> list[Run]:
        """Each command line run (four at a time: they are independent), in order."""
        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(lambda argv: self.ctx(*argv, input=REQUEST, timeout=30), argvs))


@pytest.fixture(scope="module")
def _named_template(_template: Path) -> Iterator[Path]:
    """The acceptance root plus agent ``coder`` (run as nobody when root creates it)."""
    top = new_scratch_dir(SCRATCH, "template-")
    try:
        root = copy_of_root(_template, top / "storage")
        made = ctx_run(
            "agent", "create", "-", env=clean_env(CTX_STORAGE=str(root)),
            input=json.dumps({"name": "coder", "label": "coder_t", "tools": ["fs.stat"]}),
        )  # fmt: skip
        assert made.rc == 0, made
        yield root
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def world(_named_template: Path) -> Iterator[World]:
    top = new_scratch_dir(SCRATCH, "world-")
    try:
        storage = copy_of_root(_named_template, top / "storage")
        tool_manifest(top / "manifests", "demo.names", "#!/bin/sh\necho hi\n")
        (top / "mnt").mkdir(mode=0o755)
        yield World(top, storage)
    finally:
        if mounted_at(top / "mnt"):  # a name that was not refused mounted the view
            subprocess.run(["umount", "-l", str(top / "mnt")], check=False)
        shutil.rmtree(top, ignore_errors=True)


# --- the names ------------------------------------------------------------------------------

# Each name that breaks R-3, with the words that say which rule it breaks (a command may say
# the same rule in its own grammar: P-2 names '/' a path and '[' a glob).
ILLEGAL: dict[str, tuple[str, str]] = {
    "dotdot": ("..", r"must start with a letter or digit"),
    "dash-help": ("--help", r"must start with a letter or digit"),
    # a slash and an escape sequence: the first rule a command checks is named, and the name
    # is shown escaped (R-3's "no /"; no raw control byte reaches a terminal)
    "slash-escape": ("a/\x1b[31mb", r"holds '/'|holds no '/'|paths are not supported"),
}
# The rest of R-3's cases, given to one command of most kinds of name (``primary``).
ILLEGAL_MORE: dict[str, tuple[str, str]] = {
    "empty": ("", r"must not be empty|is empty"),
    "dot": (".", r"must start with a letter or digit"),
    "hidden": (".hid", r"must start with a letter or digit"),
    "dash": ("-x", r"must start with a letter or digit"),
    "newline": ("a\nb", r"holds '\\n'"),
    "blank": ("a b", r"holds ' '"),
    "escape": ("a\x1b[31mb", r"holds '\\x1b'|globs are not supported"),
    "nfc": ("caf\u00e9", r"holds 'é'"),
    "nfd": ("cafe\u0301", r"which an object name may not hold"),
    "suffix-d": ("x.d", r"ends in '\.d'"),
}
LEGAL_MORE = {"mixed": "Zz-9.y_X"}
# The longest legal name of a kind, and one byte more.  A job name J ends in .req.json, which
# --name and JOB add when missing: 55 bytes before it make the 64 R-3 allows.
LONGEST = {"job": "j" * 55}
DEFAULT_LONGEST = "Q" * 64

# What a refusal calls the name: "illegal agent name: …", "tool:NAME: …" (a policy object).
CALLED = {
    "agent": r"illegal agent name",
    "session": r"illegal session name",
    "space": r"illegal shared space name",
    "project": r"illegal project name|--project '",
    "job": r"illegal job name",
    "tool": r"illegal tool name",
    "policy-tool": r"tool:",
}
RULE_WORDS = re.compile(
    r"illegal|must start with a letter|may not hold|bytes long|ends in '\.d'|must not be empty"
)


def longest(kind: str) -> str:
    return LONGEST.get(kind, DEFAULT_LONGEST)


def one_more(kind: str) -> tuple[str, str]:
    return longest(kind) + "q", r"bytes long"


def raw_controls(text: str) -> list[str]:
    """The control characters of ``text`` but its line breaks: what a terminal would act on."""
    return [c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0]


# --- where each command takes a name --------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    """One place of one command line where a name of ``kind`` is given."""

    id: str
    kind: str
    argv: Callable[[str, World], list[str]]
    primary: bool = False  # given every case of R-3, not only the common ones
    legal: bool = True  # also given the longest legal name (no mount, no terminal started)


MANIFEST = "manifests/demo.names.json"
SLOTS = [
    Slot("agent show NAME", "agent", lambda n, w: ["agent", "show", "--", n], primary=True),
    Slot("agent start NAME", "agent", lambda n, w: ["agent", "start", "--no-workspace", "--", n]),
    Slot(
        "agent stop --session", "session", lambda n, w: ["agent", "stop", f"--session={n}", "coder"]
    ),
    Slot(
        "agent start --session",
        "session",
        lambda n, w: ["agent", "start", "--no-workspace", f"--session={n}", "nosuch"],
    ),
    Slot("session list AGENT", "agent", lambda n, w: ["session", "list", "--", n]),
    Slot(
        "session show AGENT SESSION",
        "session",
        lambda n, w: ["session", "show", "coder", "--", n],
        primary=True,
    ),
    Slot("session repair SESSION", "session", lambda n, w: ["session", "repair", "coder", "--", n]),
    Slot(
        "session list --project",
        "space",
        lambda n, w: ["session", "list", "coder", f"--project={n}"],
    ),
    Slot("shared create NAME", "space", lambda n, w: ["shared", "create", "--", n], primary=True),
    Slot("queue init --project", "project", lambda n, w: ["queue", "init", f"--project={n}"]),
    Slot(
        "queue publish --name",
        "job",
        lambda n, w: ["queue", "publish", "--project", "proj", f"--name={n}", "-"],
    ),
    Slot(
        "queue show JOB",
        "job",
        lambda n, w: ["queue", "show", "--project", "proj", "--", n],
        primary=True,
    ),
    Slot(
        "queue work --agent",
        "agent",
        lambda n, w: ["queue", "work", "--project", "proj", "--drain", f"--agent={n}"],
    ),
    Slot(
        "queue work --session",
        "session",
        lambda n, w: [
            "queue",
            "work",
            "--project",
            "proj",
            "--drain",
            "--agent=coder",
            f"--session={n}",
        ],
    ),
    Slot("run --agent", "agent", lambda n, w: ["run", f"--agent={n}", "fs.stat", "/"]),
    Slot("run TOOL", "tool", lambda n, w: ["run", "--agent=coder", "--", n]),
    Slot(
        "run --session",
        "session",
        lambda n, w: ["run", "--agent=coder", f"--session={n}", "fs.stat", "/"],
    ),
    Slot(
        "run --project",
        "space",
        lambda n, w: ["run", "--agent=coder", f"--project={n}", "fs.stat", "/"],
    ),
    Slot("object which NAME", "tool", lambda n, w: ["object", "which", "--", n], primary=True),
    Slot(
        "object install --tier shared:",
        "space",
        lambda n, w: ["object", "install", f"--tier=shared:{n}", MANIFEST],
    ),
    Slot("tool NAME", "tool", lambda n, w: ["tool", n]),
    Slot(
        "policy explain AGENT",
        "agent",
        lambda n, w: ["policy", "explain", "--", n, "tool:fs.stat", "execute"],
    ),
    Slot(
        "policy explain tool:NAME",
        "policy-tool",
        lambda n, w: ["policy", "explain", "coder", f"tool:{n}", "execute"],
    ),
    Slot(
        "mount --as", "agent", lambda n, w: ["mount", f"--as={n}", str(w.top / "mnt")], legal=False
    ),
]
# ctx tool refuses a dash-led NAME as an option (a defect of its own, tested below): the slot
# is given the cases of R-3 that do not start with a dash.
DASH_AS_OPTION = {"tool NAME"}


def _cases(slot: Slot) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """(illegal name -> rule words, legal names) for ``slot``."""
    illegal = dict(ILLEGAL)
    legal: dict[str, str] = {}
    if slot.primary:
        illegal.update(ILLEGAL_MORE)
        legal.update(LEGAL_MORE)
    illegal["one-byte-more"] = one_more(slot.kind)
    if slot.legal:
        legal["longest"] = longest(slot.kind)
    if slot.kind == "job" and "suffix-d" in illegal:  # x.d.req.json does not end in .d
        legal["suffix-d"] = illegal.pop("suffix-d")[0]
    if slot.id in DASH_AS_OPTION:
        illegal = {k: v for k, v in illegal.items() if not v[0].startswith("-")}
    return illegal, legal


@needs_root
@pytest.mark.parametrize("slot", SLOTS, ids=[slot.id for slot in SLOTS])
def test_each_name_slot_refuses_what_r3_refuses_as_einval_exit_2_and_takes_the_rest(
    slot: Slot, world: World
) -> None:
    """R-3 ("Anything else is rejected with EINVAL"), §2.4 (2: usage error), ``ctx run
    --help`` (an agent, tool, space or session name that is not an object name: EINVAL, exit 2,
    nothing run or recorded): at every place of every command where an agent, session, space,
    project, job or tool name is given, each name R-3 refuses — one byte over the longest,
    ``..``, ``--help`` given as a name, ``/`` with an escape sequence, and at ``agent show``,
    ``session show``, ``shared create``, ``queue show`` and ``object which`` every other case
    (empty, ``.``, a leading dot or dash, a newline, a blank, an escape sequence alone, a
    letter outside ASCII in NFC and in NFD, the ``.d`` suffix) — is
    refused with ``ctx: EINVAL:`` naming the name's kind and the rule, exit 2, nothing on
    stdout, the name escaped, the storage root unchanged; the longest legal name of the kind
    is taken as a name (whatever the command then answers about it)."""
    illegal, legal = _cases(slot)
    before = snapshot(world.storage)
    refused = world.ctx_each([slot.argv(name, world) for name, _ in illegal.values()])
    wrong: list[str] = []
    for (case, (name, rule)), answer in zip(illegal.items(), refused, strict=True):
        last = answer.err.strip().splitlines()[-1] if answer.err.strip() else ""
        problems = []
        if answer.rc != 2:
            problems.append(f"exit {answer.rc}")
        if not last.startswith("ctx: EINVAL: "):
            problems.append("no 'ctx: EINVAL:' line")
        if not re.search(CALLED[slot.kind], last) or not re.search(rule, last):
            problems.append("the refusal does not name the kind of name and the rule")
        if answer.out:
            problems.append("stdout not empty")
        if raw_controls(answer.err):
            problems.append("raw control bytes on stderr")
        if "Traceback" in answer.err:
            problems.append("traceback")
        if problems:
            wrong.append(f"{case} {name!r}: {', '.join(problems)}: {answer!r}")
    assert snapshot(world.storage) == before, "a refused name changed the storage root"
    taken = world.ctx_each([slot.argv(name, world) for name in legal.values()])
    for (case, name), answer in zip(legal.items(), taken, strict=True):
        if answer.rc == 2 or RULE_WORDS.search(answer.err):
            wrong.append(f"legal {case} {name!r} refused as a name: {answer!r}")
    assert wrong == []


# --- names that reach a command through a file or standard input ---------------------------


@needs_root
def test_names_read_from_a_request_a_manifest_or_a_policy_meet_the_same_rule(
    world: World,
) -> None:
    """R-3 for names that argv cannot carry: a NUL inside an agent's name (``agent create -``),
    a tool's name (a v2 manifest, T-8), a request's tool (§2.1) and a policy's object (P-1)
    is refused with EINVAL naming ``\\x00``, as are the NFC and NFD spellings of one non-ASCII
    name alike; nothing is created."""
    before = snapshot(world.storage)
    refusals = {}
    for case, name in {"nul": "a\x00b", "nfc": "caf\u00e9", "nfd": "cafe\u0301"}.items():
        refusals[f"agent {case}"] = world.ctx(
            "agent", "create", "-", input=json.dumps({"name": name, "label": "n_t"})
        )
    manifest = tool_manifest(world.top / "nul", "placeholder", "#!/bin/sh\n")
    document = json.loads(manifest.read_text())
    document["name"] = "a\x00b"
    manifest.write_text(json.dumps(document))
    refusals["manifest"] = world.ctx("object", "install", manifest, "--tier", "system")
    refusals["request"] = world.ctx(
        "queue", "publish", "--project", "proj", "-",
        input=json.dumps({"tool": "a\x00b", "input": {}}),
    )  # fmt: skip
    policy = world.ctx("policy", "check", "-", input=b"allow n_t tool:a\x00b execute\n")

    for what, answer in refusals.items():
        assert answer.rc != 0 and "EINVAL" in answer.err, (what, answer)
        assert not raw_controls(answer.err) and "Traceback" not in answer.err, (what, answer)
        if "nul" in what or what in ("manifest", "request"):
            assert "'\\x00'" in answer.err, (what, answer)
    assert policy.rc == 1 and policy.err.startswith("-:1: EINVAL: "), policy
    assert "\\x00" in policy.err and not raw_controls(policy.err), policy
    assert snapshot(world.storage) == before


# --- a legal name is legal everywhere ----------------------------------------------------------


@needs_root
def test_upper_and_mixed_case_names_work_in_every_command_that_takes_them(world: World) -> None:
    """R-3 allows ``A-Z`` as well as ``a-z`` (the SPEC asks for no lowercase): an agent, a space,
    a job and a session named with capitals are made and then used by every command that takes
    them — ``queue init``/``publish``/``work``/``show``, ``session list``/``show``, ``policy
    explain`` — and a name differing only in case is another name (``agent show``: ENOENT)."""
    agent, space, job, session = "CoDer.X", "Proj-UP", "Job_A.1", "S.ONE"
    made = world.ctx(
        "agent", "create", "-",
        input=json.dumps({"name": agent, "label": "CoDer_t", "tools": ["fs.stat"]}),
    )  # fmt: skip
    assert made.rc == 0, made
    for argv in (
        ["shared", "create", space],
        ["queue", "init", "--project", space],
        ["queue", "publish", "--project", space, "--name", job, "-"],
        ["queue", "work", "--project", space, "--agent", agent, "--session", session, "--drain"],
        ["queue", "show", "--project", space, job],
        ["session", "show", agent, session],
    ):
        answer = world.ctx(*argv, input=REQUEST)
        assert answer.rc == 0, answer
    listed = world.ctx("session", "list", agent)
    assert session in listed.lines(), listed
    explained = world.ctx("policy", "explain", agent, "tool:fs.stat", "execute")
    assert explained.rc == 1 and "step 6" in explained.out, explained  # the tool's half
    other = world.ctx("agent", "show", "CODER.X")
    assert other.rc == 1 and other.err.startswith("ctx: ENOENT: "), other
    assert (world.storage / "shared" / space / "queue" / "failed" / f"{job}.req.json").is_file()


# --- the one reserved name: the manual bundle ---------------------------------------------------


def test_the_manual_bundles_name_is_no_space_to_any_command_that_makes_or_lists_spaces(
    world: World,
) -> None:
    """X-2 (``shared/cortexfs-docs/`` is the system-maintained manual bundle) as ``ctx shared
    create --help`` states it ("cortexfs-docs (the manual bundle) is a usage error (EINVAL,
    exit 2)"): ``shared create``, ``queue init``/``status --project`` and ``object install``/
    ``list --tier shared:`` refuse the name alike, and nothing is made in the bundle."""
    bundle = world.storage / "shared" / BUNDLE
    before = snapshot(bundle)
    for argv in (
        ["shared", "create", BUNDLE],
        ["queue", "init", "--project", BUNDLE],
        ["queue", "status", "--project", BUNDLE],
        ["queue", "publish", "--project", BUNDLE, "-"],
        ["object", "install", MANIFEST, "--tier", f"shared:{BUNDLE}"],
        ["object", "list", "--tier", f"shared:{BUNDLE}"],
    ):
        answer = world.ctx(*argv, "--json", input=REQUEST)
        assert answer.rc == 2 and answer.err.startswith("ctx: EINVAL: "), answer
        assert "manual bundle" in answer.err and answer.json()["error"] == "EINVAL", answer
    assert snapshot(bundle) == before


def test_the_manual_bundles_queue_named_by_its_path_is_refused_as_by_its_name(
    world: World,
) -> None:
    """X-2 and §2.4 (``--project NAME`` "or a queue path"; 2: usage error): the queue path of
    the manual bundle, ``ROOT/shared/cortexfs-docs/queue``, names the same non-space as
    ``--project cortexfs-docs`` and is refused the same way (EINVAL, exit 2), as
    ``ROOT/shared/.hid/queue`` is; a queue directory planted there by hand takes no job."""
    bundle_queue = world.storage / "shared" / BUNDLE / "queue"
    by_name = world.ctx("queue", "init", "--project", BUNDLE)
    hidden = world.ctx("queue", "init", "--queue", world.storage / "shared" / ".hid" / "queue")
    assert (by_name.rc, hidden.rc) == (2, 2), (by_name, hidden)
    problems = []
    for option in ("--queue", "--project"):
        for command in ("init", "status"):
            answer = world.ctx("queue", command, option, bundle_queue)
            if answer.rc != 2 or not answer.err.startswith("ctx: EINVAL: "):
                problems.append(answer)
    assert not bundle_queue.exists()
    for state in ("inbox", "pending", "lease", "claimed", "done", "failed"):
        (bundle_queue / state).mkdir(parents=True)
    published = world.ctx("queue", "publish", "--queue", bundle_queue, "-", input=REQUEST)
    if published.rc != 2 or os.listdir(bundle_queue / "pending"):
        problems.append(published)
    assert problems == []


@needs_root
def test_explain_refuses_the_manual_bundle_as_a_tool_location_as_install_and_list_do(
    world: World,
) -> None:
    """X-2, D-1 ("Manuals … grant nothing"), P-5 and ``ctx policy explain --help`` (``--location
    … shared/SPACE/tool``): ``shared:cortexfs-docs`` is no tier to ``object install`` and
    ``object list`` (EINVAL, exit 2), and ``ctx run`` never runs a tool planted in the bundle;
    so ``policy explain`` asked about ``--location shared/cortexfs-docs/tool`` must not answer
    ``allow`` for that tool either."""
    made = world.ctx(
        "agent", "create", "-",
        input=json.dumps({"name": "reader", "label": "reader_t", "tools": ["evil"],
                          "shared": {BUNDLE: ["read"]}}),
    )  # fmt: skip
    assert made.rc == 0, made
    tools = world.storage / "shared" / BUNDLE / "tool"
    (tools / "evil.d" / "hooks" / "pre.d").mkdir(parents=True)
    (tools / "evil.d" / "hooks" / "post.d").mkdir()
    (tools / "evil").write_text("#!/bin/sh\necho ran\n")
    (tools / "evil").chmod(0o755)
    for control, text in {
        "name": "evil\n", "description": "planted\n", "schema": '{"type": "object"}\n',
        "cap": '{"side_effects": false, "network": false}\n', "status": "available\n",
        "policy": "allow reader_t tool:evil execute\n", "log": "",
    }.items():  # fmt: skip
        (tools / "evil.d" / control).write_text(text)

    listed = world.ctx("object", "list", "--tier", f"shared:{BUNDLE}")
    assert listed.rc == 2 and listed.err.startswith("ctx: EINVAL: "), listed
    ran = world.ctx("run", "--agent", "reader", "--project", BUNDLE, "evil")
    assert ran.rc == 126 and "ran" not in ran.out, ran

    explained = world.ctx(
        "policy", "explain", "reader", "tool:evil", "execute",
        "--location", f"shared/{BUNDLE}/tool",
    )  # fmt: skip
    assert explained.rc != 0 and explained.lines()[-1:] != ["allow"], explained


# --- a name that starts with a dash, given after "--" or as --option=NAME ---------------------


def test_ctx_tool_takes_a_dash_led_name_after_double_dash_as_a_name(world: World) -> None:
    """R-3 and POSIX's ``--``: after ``--`` a word is an operand, so ``ctx tool -- -x`` names a
    tool called ``-x`` and is refused with R-3's words (``illegal tool name … must start with
    a letter or digit``), as ``ctx object which -- -x`` and ``ctx run --agent coder -- -x``
    refuse the same name; "No such option '--json'" is wrong twice, since ``ctx tool`` takes
    ``--json``."""
    wrong = []
    for name in ("-x", "--json", "--"):
        which = world.ctx("object", "which", "--", name)
        assert which.rc == 2 and "illegal tool name" in which.err, which
        tool = world.ctx("tool", "--", name)
        if tool.rc != 2 or "illegal tool name" not in tool.err:
            wrong.append(tool)
    assert wrong == []


def test_ctx_run_names_the_rule_for_a_double_dash_given_as_a_value(world: World) -> None:
    """R-3 ("EINVAL") as ``ctx run --help`` applies it (an agent, space or session name that is
    not an object name is EINVAL, exit 2): ``--agent=--`` gives the name ``--``, which ``ctx
    queue work --agent=--`` and ``ctx mount --as=--`` refuse because it must start with a letter
    or digit; ``ctx run`` refuses it too, and must say that, not that a name must be a
    string."""
    work = world.ctx("queue", "work", "--project", "proj", "--drain", "--agent=--")
    assert work.rc == 2 and "'--' must start with a letter or digit" in work.err, work
    wrong = []
    for option in ("--agent=--", "--session=--", "--project=--"):
        argv = [option] if option.startswith("--agent") else ["--agent=coder", option]
        ran = world.ctx("run", *argv, "fs.stat", "/")
        if ran.rc != 2 or "'--' must start with a letter or digit" not in ran.err:
            wrong.append(ran)
    assert wrong == []


# --- a malformed session name is malformed whatever else the command line names ----------------


def test_an_illegal_session_name_is_a_usage_error_whichever_agent_or_root_is_named(
    world: World,
) -> None:
    """R-3, §2.4 (2: usage error) and ``ctx run --help`` ("a malformed command line … is
    EINVAL, exit 2"): ``--session .x`` is malformed whatever agent or storage root the line
    also names.  ``agent start``, ``run`` and ``queue work`` say so for an agent that does not
    exist, and ``agent show``/``queue show`` for a root that does not exist; the other commands
    that take a session name must answer the same, not ENOENT for the agent or the root."""
    missing_root = str(world.top / "no-root")
    consistent = {
        "agent start": ["agent", "start", "--no-workspace", "--session", ".x", "nosuch"],
        "run": ["run", "--agent", "nosuch", "--session", ".x", "fs.stat"],
        "queue work": ["queue", "work", "--project", "proj", "--drain", "--agent", "nosuch",
                       "--session", ".x"],
    }  # fmt: skip
    for what, argv in consistent.items():
        answer = world.ctx(*argv)
        assert answer.rc == 2 and "illegal session name" in answer.err, (what, answer)
    shown = world.ctx("--storage", missing_root, "queue", "show", "--project", "proj", ".x")
    assert shown.rc == 2 and "illegal job name" in shown.err, shown

    wrong = []
    for argv in (
        ["agent", "stop", "nosuch", "--session", ".x"],
        ["agent", "watch", "nosuch", "--session", ".x"],
        ["agent", "attach", "nosuch", "--session", ".x"],
        ["session", "show", "nosuch", ".x"],
        ["session", "tail", "nosuch", "--session", ".x"],
        ["session", "repair", "nosuch", ".x"],
        ["--storage", missing_root, "session", "show", "coder", ".x"],
        ["--storage", missing_root, "agent", "stop", "coder", "--session", ".x"],
    ):
        answer = world.ctx(*argv)
        if answer.rc != 2 or "illegal session name" not in answer.err:
            wrong.append(answer)
    assert wrong == []
    assert not Path(missing_root).exists()


# --- the terminal commands with the longest names ---------------------------------------------


@needs_root
def test_a_terminal_of_the_longest_agent_and_session_names_starts_answers_and_stops(
    world: World,
) -> None:
    """R-3 with A-1/A-2: a 64-byte agent name and a 64-byte session name, legal for ``agent
    create``, are legal for ``agent start``, ``agent attach`` and ``agent stop`` too (docs/tools.md:
    a socket path longer than a UNIX address is reached through its directory), and the names
    come back whole."""
    if shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"):
        pytest.skip("agent start needs bubblewrap and /dev/fuse")
    agent, session = "A" * 64, "s" * 64
    made = world.ctx("agent", "create", "-", input=json.dumps({"name": agent, "label": "long_t"}))
    assert made.rc == 0, made
    started = world.ctx("agent", "start", "--no-workspace", "--session", session, agent)
    try:
        assert started.rc == 0 and f"started {agent}, session {session}:" in started.out, started
        attached = subprocess.run(
            [*CTX_ARGV, "agent", "attach", "--session", session, agent],
            input=b"exit\n", capture_output=True, env=world.env, timeout=60,
        )  # fmt: skip
        assert attached.returncode == 0, attached
    finally:
        stopped = world.ctx("agent", "stop", "--session", session, agent)
    assert stopped.rc in (0, 1) and "illegal" not in stopped.err, stopped
    again = world.ctx("agent", "stop", "--session", session, agent)
    assert again.rc == 1 and again.err.startswith("ctx: ENOENT: "), again
