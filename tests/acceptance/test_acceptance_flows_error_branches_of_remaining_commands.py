"""The error branches of the commands around the queue, each reached from outside through the
installed commands: ``ctx object check|install|which|list``, ``ctx tool``, ``ctx man``,
``ctx policy check|query|explain``, the option handling of ``ctx run`` and of ``ctx queue
work``, and ``ctx bootstrap SOURCE``.

Sources: SPEC R-1, R-3, R-5, T-3, T-4, T-8, T-8a, H-3, P-5, P-8, X-2, D-1, §2.4, W-1;
docs/tools.md ("Manifests, version 2", "How an install stays atomic", "Listing and
resolving", "CTX_PATH", "Running a tool", "Agent native mode and its frames", "ctx tool",
"ctx bootstrap"); docs/policy.md ("What the chain reads", "Commands"); docs/workers.md; the
help of each command.

The angle: every refusal these commands can give is provoked as a demanding user provokes
it — an option value spelt in another way, a tier that is not one, a program larger than a
program may be, a path ending in ``/``, a storage root without homes or named through a loop
of links, a standard input that is a directory or open for writing only, an output that
cannot be written, a manifest, ``.tshrc``, policy or control a second, real user may not
read — and each check reads the exit status, the errno word of the ``ctx: ERRNO: …`` line
(and the ``--json`` error object or the native ``result`` frame), that the message names the
thing at fault and what to do where the documents promise it, and that nothing was
half-done: no tool installed, no job claimed, no session or page written, nothing of the
storage root changed by a refusal."""

from __future__ import annotations

import errno
import json
import os
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
    REPO,
    OnStorage,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    request,
    scratch_top,
    snapshot,
)
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

TOP = scratch_top(__file__)
LABEL = "coder_t"
PROGRAM_LIMIT = 64 * 1024 * 1024  # docs/tools.md: an exec program is read up to 64 MiB
TOPICS = "README, agent, tool, model, coreutils, root-abi, session, provider"

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents, and a second real user, need root"
)


# ----------------------------------------------------------------------------------- helpers


def refused(run: Run, name: str, status: int) -> str:
    """``run`` exited ``status``, its last line on stderr ``ctx: NAME: …``, no traceback; that
    line's sentence."""
    assert "Traceback" not in run.err and "Fatal Python error" not in run.err, run
    assert run.rc == status, run
    last = run.err.rstrip("\n").splitlines()[-1] if run.err.strip() else ""
    assert last.startswith(f"ctx: {name}: "), run
    return last[len(f"ctx: {name}: ") :]


def refused_json(run: Run, name: str, status: int) -> dict:
    """As :func:`refused` for a ``--json`` run: stdout is the one error object, saying what
    stderr says."""
    refused(run, name, status)
    lines = run.out.splitlines()
    assert len(lines) == 1, run
    error = json.loads(lines[0])
    assert (error["error"], error["errno"]) == (name, getattr(errno, name)), run
    assert error["message"] in run.err, run
    return error


def manifest(directory: Path, name: str, exec_: str | None = None, **fields) -> Path:
    """A v2 manifest (T-8) of tool ``name`` in ``directory``; unless ``exec_`` names another,
    its program ``NAME.sh`` is written beside it."""
    directory.mkdir(parents=True, exist_ok=True)
    if exec_ is None:
        exec_ = f"{name}.sh"
        program = directory / exec_
        program.write_text("#!/bin/sh\necho '{}'\n")
        program.chmod(0o755)
    document = {
        "manifest": 2,
        "kind": "tool",
        "name": name,
        "description": f"The {name} tool.",
        "schema": {"type": "object"},
        "cap": {"side_effects": False, "network": False},
        "exec": exec_,
        **fields,
    }
    path = directory / f"{name}.json"
    path.write_text(json.dumps(document))
    path.chmod(0o644)
    return path


def as_user(
    user: UnprivilegedUser, *args, env: dict[str, str] | None = None, input: str = ""
) -> Run:
    """``ctx ARGS`` run as ``user`` (its own group only), in ``/``, with ``env`` added to a
    clean environment whose HOME holds nothing of root's."""
    environment = clean_env(HOME="/nonexistent", **(env or {}))
    done = subprocess.run(
        [*CTX_ARGV, *map(str, args)],
        input=input.encode(),
        capture_output=True,
        user=user.uid,
        group=user.gid,
        extra_groups=[],
        env=environment,
        cwd="/",
        timeout=60,
    )
    return Run(
        [str(a) for a in args],
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )


def with_streams(args: list[str], env: dict[str, str], *, stdin, stdout=subprocess.PIPE) -> Run:
    """``ctx ARGS`` with the standard input (and output) given: a descriptor, DEVNULL…"""
    done = subprocess.run(
        [*CTX_ARGV, *args],
        stdin=stdin,
        stdout=stdout,
        stderr=subprocess.PIPE,
        env=env,
        timeout=60,
    )
    out = b"" if done.stdout is None else done.stdout
    return Run(args, done.returncode, out.decode("utf-8", "replace"), done.stderr.decode())


def hidden(directory: Path) -> list[str]:
    """The names in ``directory`` starting with a dot but the tier's lock file: what an
    install stages under (``.<name>~…``) and must not leave."""
    return sorted(n for n in os.listdir(directory) if n.startswith(".") and n != ".install-lock")


@dataclass(repr=False)
class World(OnStorage):
    """A bootstrapped root every uid may search, below which agent ``coder`` (label
    ``coder_t``, running as nobody) is allowed ``fs.read`` in both layers of P-6; and a
    scratch directory every uid may search, for manifests and files a second user reads."""

    storage: Path
    scratch: Path

    @property
    def env(self) -> dict[str, str]:
        """The root's, with ``CTX_PATH`` naming its system tier (T-4: a standalone human's
        default ``/ctx/tool``, whatever is mounted at /ctx on this host)."""
        return clean_env(CTX_STORAGE=str(self.storage), CTX_PATH=str(self.storage / "tool"))

    @property
    def user_env(self) -> dict[str, str]:
        return {"CTX_STORAGE": str(self.storage), "CTX_PATH": str(self.storage / "tool")}


@pytest.fixture
def world(searchable_storage: Path) -> Iterator[World]:
    scratch = new_scratch_dir(TOP)
    made = World(searchable_storage, scratch)
    if os.geteuid() == 0:
        made.create_agent({"name": "coder", "label": LABEL, "tools": ["fs.read"]})
        made.allow_tool(LABEL, "fs.read")
    try:
        yield made
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# ------------------------------------------------------------- ctx object check / install


def test_a_program_over_64_mib_is_einval_for_check_and_install_and_64_mib_is_not(
    storage: Path, tmp_path: Path
) -> None:
    """docs/tools.md "How the manifest and its program are read" (the program is read at most
    64 MiB; ``EFBIG`` is only for a control; every other problem is ``EINVAL``): an ``exec``
    one byte over 64 MiB is one ``EINVAL`` line naming it and its limit (``codes`` EINVAL in
    ``--json``), install refuses it the same way and installs nothing, staging nothing; one
    of exactly 64 MiB is valid."""
    m = manifest(tmp_path, "big", "big.bin")
    program = tmp_path / "big.bin"
    with open(program, "wb") as sparse:
        sparse.truncate(PROGRAM_LIMIT + 1)
    said = f"exec: {program} is larger than {PROGRAM_LIMIT} bytes"
    env = clean_env(CTX_STORAGE=str(storage))
    check = ctx_run("object", "check", m, env=env)
    assert (check.rc, check.out, check.err) == (1, "", f"{m}: EINVAL: {said}\n"), check
    report = ctx_run("object", "check", "--json", m, env=env)
    assert report.rc == 1, report
    assert report.json() == [
        {
            "manifest": str(m),
            "valid": False,
            "name": None,
            "problems": [said],
            "codes": ["EINVAL"],
            "error": None,
        }
    ], report
    tier = storage / "tool"
    before = snapshot(tier)
    installed = ctx_run("object", "install", m, "--tier", "system", "--json", env=env)
    assert refused_json(installed, "EINVAL", 1)["message"] == f"{m}: {said}", installed
    assert snapshot(tier) == before and hidden(tier) == []
    with open(program, "r+b") as sparse:
        sparse.truncate(PROGRAM_LIMIT)
    fits = ctx_run("object", "check", m, env=env)
    assert (fits.rc, fits.out, fits.err) == (0, f"{m}: valid (big)\n", ""), fits


@pytest.mark.parametrize("where", ["exec", "manifest argument"])
def test_a_path_ending_in_a_slash_names_no_regular_file(
    storage: Path, tmp_path: Path, where: str
) -> None:
    """docs/tools.md ("exec: the program, a readable regular file"; "A manifest that cannot be
    read at all is one line with its own errno"), and as ``ctx policy check FILE/`` answers
    (``ENOTDIR``): ``"exec": "t.sh/"`` beside a regular ``t.sh``, or ``ctx object check
    t.json/``, names no regular file: the check is refused (exit 1, ``Not a directory``),
    nothing is called valid, and the install installs nothing."""
    env = clean_env(CTX_STORAGE=str(storage))
    if where == "exec":
        program = tmp_path / "t.sh"
        program.write_text("#!/bin/sh\necho '{}'\n")
        program.chmod(0o755)
        given = str(manifest(tmp_path, "t", "t.sh/"))
    else:
        given = f"{manifest(tmp_path, 't')}/"
    check = ctx_run("object", "check", given, env=env)
    assert check.rc == 1 and "valid" not in check.out, check
    assert "Not a directory" in check.err, check
    installed = ctx_run("object", "install", given, "--tier", "system", env=env)
    assert installed.rc == 1 and not (storage / "tool" / "t").exists(), installed


@needs_root
def test_a_manifest_the_installer_may_not_read_is_one_eacces_line_and_installs_nothing(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """docs/tools.md ("A manifest that cannot be read at all is one line with its own errno";
    ``--json``'s ``error``), ``ctx object check --help``: a second, real user checking a
    manifest only root may read gets ``MANIFEST: EACCES: cannot read …: Permission denied``
    (exit 1), the entry's ``error`` EACCES with no problems in ``--json``; ``ctx object
    install`` of it into that user's own tier makes nothing, not even the user's home."""
    user = unprivileged_user
    m = manifest(world.scratch, "private")
    m.chmod(0o600)
    said = f"cannot read {m}: Permission denied; nothing was checked or installed"
    check = as_user(user, "object", "check", m, env=world.user_env)
    assert (check.rc, check.out, check.err) == (1, "", f"{m}: EACCES: {said}\n"), check
    report = as_user(user, "object", "check", "--json", m, env=world.user_env)
    (entry,) = report.json()
    assert report.rc == 1, report
    assert (entry["valid"], entry["problems"], entry["codes"]) == (False, [], []), report
    assert entry["error"] == {"error": "EACCES", "errno": errno.EACCES, "message": said}
    before = snapshot(world.storage)
    installed = as_user(user, "object", "install", m, "--tier", "user", env=world.user_env)
    assert refused(installed, "EACCES", 1) == said, installed
    assert snapshot(world.storage) == before
    assert not (world.storage / "home" / str(user.uid)).exists()


@needs_root
def test_a_users_install_into_the_system_tier_names_the_directory_and_stages_nothing(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """T-8 (installing is the administrator's), docs/tools.md ("An install that may not open
    it fails before it changes anything and says why"): a second, real user installing a
    manifest of its own into the system tier of root's storage root gets ``EACCES`` (exit 1),
    naming its uid, the tier's directory with its owner and mode, and what to do; in
    ``--json`` the same error object; the tier is as it was, without staged names."""
    user = unprivileged_user
    m = manifest(world.scratch, "mine")
    tier = world.storage / "tool"
    before = snapshot(tier)
    for extra in ((), ("--json",)):
        run = as_user(user, "object", "install", m, "--tier", "system", *extra, env=world.user_env)
        said = refused(run, "EACCES", 1)
        assert said.startswith(
            f"cannot install into tier system: uid {user.uid} may not write in {tier} "
            "(owner uid 0, group 0, mode 0755); run it as root or as that owner"
        ), run
        if extra:
            assert refused_json(run, "EACCES", 1)["message"] == said, run
    assert snapshot(tier) == before and hidden(tier) == []


def test_the_manual_bundle_is_no_tier_to_install_into_or_list(
    storage: Path, tmp_path: Path
) -> None:
    """X-2, docs/tools.md ("A malformed ``--tier`` (… ``shared:cortexfs-docs``) is a usage
    error for ``list`` and ``install`` alike: ``EINVAL``, exit 2, nothing done"): the bundle
    is refused naming it as the manual bundle, in text and in ``--json``; nothing is written
    in it."""
    m = manifest(tmp_path, "doc.tool")
    env = clean_env(CTX_STORAGE=str(storage))
    bundle = storage / "shared" / "cortexfs-docs"
    before = snapshot(bundle)
    said = "shared/cortexfs-docs is the manual bundle (X-2), not a shared space"
    commands = [
        ("object", "install", m, "--tier", "shared:cortexfs-docs"),
        ("object", "list", "--tier", "shared:cortexfs-docs"),
    ]
    for command in commands:
        assert refused(ctx_run(*command, env=env), "EINVAL", 2) == said
        assert refused_json(ctx_run(*command, "--json", env=env), "EINVAL", 2)["message"] == said
    assert snapshot(bundle) == before


def test_tiers_spelt_otherwise_are_usage_errors_of_install_and_list(
    storage: Path, tmp_path: Path
) -> None:
    """docs/tools.md (``system``, ``user`` or ``shared:<name>``; a malformed ``--tier`` is
    ``EINVAL``, exit 2, nothing done), R-3 (a space's name is an object name): an empty
    tier, another case, a space without a name or with an illegal one and a user tier with a
    uid are each refused by install and by list with the reason, before anything is made."""
    m = manifest(tmp_path, "t")
    env = clean_env(CTX_STORAGE=str(storage))
    cases = {
        "": "unknown tier ''; use system, user or shared:<name>",
        "SYSTEM": "unknown tier 'SYSTEM'; use system, user or shared:<name>",
        "user:0": "unknown tier 'user:0'; use system, user or shared:<name>",
        "shared:": "illegal shared space name: a name must not be empty",
        "shared:a/b": "illegal shared space name: 'a/b' holds '/'",
        "shared:proj.d": "illegal shared space name: 'proj.d' ends in '.d'",
    }
    before = snapshot(storage)
    problems = []
    for tier, said in cases.items():
        install = ("object", "install", m, "--tier", tier)
        for command in (install, ("object", "list", "--tier", tier)):
            run = ctx_run(*command, env=env)
            if run.rc != 2 or not run.err.startswith(f"ctx: EINVAL: {said}") or run.out:
                problems.append(run)
    assert problems == []
    assert snapshot(storage) == before


def test_a_root_without_homes_has_no_user_tier_until_the_bootstrap_it_names(
    tmp_path: Path,
) -> None:
    """docs/tools.md ("a user tier nobody installed into yet lists nothing"; a root that does
    not exist is ``ENOENT``), R-4, R-5: a directory holding only ``tool/`` is no storage root:
    install and list of the user tier are ``ENOENT`` (exit 1) saying so and naming ``'ctx
    bootstrap --storage ROOT'``, and nothing is made; that command, run as written, makes
    the root, after which the same install succeeds and the tool is listed in tier user."""
    root = tmp_path / "notyet"
    (root / "tool").mkdir(parents=True)
    m = manifest(tmp_path / "m", "mine")
    said = (
        f"tier user has no {root}/home: {root} is no storage root (or a damaged one); run "
        f"'ctx bootstrap --storage {root}'"
    )
    install = ("object", "install", "--storage", root, m, "--tier", "user")
    listing = ("object", "list", "--storage", root, "--tier", "user")
    for command in (install, listing):
        assert refused(ctx_run(*command), "ENOENT", 1) == said
        assert refused_json(ctx_run(*command, "--json"), "ENOENT", 1)["message"] == said
    assert os.listdir(root) == ["tool"] and os.listdir(root / "tool") == []
    suggested = re.search(r"'ctx ([^']*)'", said)
    assert suggested is not None
    bootstrapped = ctx_run(*suggested[1].split(" "))
    assert bootstrapped.rc == 0, bootstrapped
    assert ctx_run(*install).rc == 0
    listed = ctx_run(*listing, "--json")
    assert listed.rc == 0 and [t["name"] for t in listed.json()] == ["mine"], listed
    assert listed.json()[0]["tier"] == "user" and listed.json()[0]["status"] == "available"


def test_an_install_whose_answer_is_lost_says_it_installed_and_is_not_to_be_repeated(
    storage: Path, tmp_path: Path
) -> None:
    """README and ``ctx object install --help``: an output that cannot be written ends
    the command with exit 74, ``ctx: ENOSPC: cannot write standard output``, saying what was
    changed: ``ctx object install > /dev/full`` installs the tool, exits 74 and says
    ``NAME was installed in tier system (do not install it again)``; the tool is listed
    available, and an install run all the same replaces it rather than doubling it."""
    m = manifest(tmp_path, "lost.answer")
    env = clean_env(CTX_STORAGE=str(storage))
    with open("/dev/full", "wb") as full:
        run = with_streams(
            ["object", "install", str(m), "--tier", "system"],
            env,
            stdin=subprocess.DEVNULL,
            stdout=full,
        )
    assert run.rc == 74, run
    assert run.err == (
        "ctx: ENOSPC: cannot write standard output (No space left on device); lost.answer was "
        "installed in tier system (do not install it again)\n"
    ), run
    listed = ctx_run("object", "list", "--tier", "system", "--json", env=env)
    (entry,) = [t for t in listed.json() if t["name"] == "lost.answer"]
    assert entry["status"] == "available" and entry["path"] == str(storage / "tool/lost.answer")
    again = ctx_run("object", "install", m, "--tier", "system", env=env)
    assert again.rc == 0, again
    assert again.out == f"replaced lost.answer in tier system: {storage}/tool/lost.answer\n"
    assert hidden(storage / "tool") == []


def test_a_source_that_is_no_directory_is_a_usage_error_and_installs_nothing(
    storage: Path, tmp_path: Path
) -> None:
    """T-8 (``--source STORAGE``), ``ctx object install --help`` (``--source`` names the
    storage root as ``--storage`` does): a ``--source`` that is a regular file, or the empty
    string, is a malformed command line (``EINVAL``, exit 2, the usage lines first, the
    error object with ``--json``); nothing is installed in the root ``$CTX_STORAGE`` names."""
    m = manifest(tmp_path, "src.tool")
    env = clean_env(CTX_STORAGE=str(storage))
    before = snapshot(storage)
    cases = {
        str(m): f"Invalid value for '--source': Directory '{m}' is a file.",
        "": "Invalid value for '--source': an empty string names no path",
    }
    for source, said in cases.items():
        run = ctx_run("object", "install", m, "--tier", "system", "--source", source, env=env)
        assert refused(run, "EINVAL", 2) == said, run
        assert run.err.startswith("Usage: ctx object install"), run
        as_json = ctx_run(
            "object", "install", m, "--tier", "system", "--source", source, "--json", env=env
        )
        assert refused_json(as_json, "EINVAL", 2)["message"] == said
    assert snapshot(storage) == before


# ------------------------------------------------------------------------ ctx object which


def test_which_of_a_name_that_is_no_object_name_is_a_usage_error(storage: Path) -> None:
    """T-8a, R-3 (a tool's name is an object name; anything else is ``EINVAL``), docs: a
    malformed command line is exit 2: ``ctx object which`` of the empty name, a path, a
    control directory's name, a dot-file and a 65-byte name is refused naming the rule
    broken, in text and as the ``--json`` error object, nothing printed as found."""
    env = clean_env(CTX_STORAGE=str(storage), CTX_PATH=str(storage / "tool"))
    cases = {
        "": "a name must not be empty",
        "tool/fs.read": "'tool/fs.read' holds '/'",
        "fs.read.d": "'fs.read.d' ends in '.d', which is reserved for control directories",
        ".install-lock": "'.install-lock' must start with a letter or digit, not '.'",
        "x" * 65: "is 65 bytes long; at most 64 are allowed",
    }
    problems = []
    for name, said in cases.items():
        run = ctx_run("object", "which", "--json", "--", name, env=env)
        error = refused_json(run, "EINVAL", 2)
        if not (error["message"].startswith("illegal tool name: ") and said in error["message"]):
            problems.append(run)
    assert problems == []


@needs_root
def test_a_tshrc_the_user_may_not_read_is_eacces_naming_it_and_what_to_do(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """T-4 (``CTX_PATH=`` in ``$CTX_HOME/.tshrc`` comes first; ``.tshrc`` is data),
    ``ctx object which --help``: a ``.tshrc`` in the user's ``CTX_HOME`` that only root may
    read is not passed over for ``$CTX_PATH`` — the search path it would give is unknown —
    but refused, ``EACCES`` (exit 1), naming the file and saying to make it a file of
    KEY=VALUE lines or remove it; once removed, the same command finds the tool on
    ``$CTX_PATH``."""
    home = world.scratch / "home"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    tshrc = home / ".tshrc"
    tshrc.write_text(f"CTX_PATH={world.storage / 'tool'}\n")
    tshrc.chmod(0o600)
    env = {**world.user_env, "CTX_HOME": str(home), "CTX_PATH": "/nonexistent"}
    said = f"{tshrc}: Permission denied; make it a file of KEY=VALUE lines, or remove it"
    run = as_user(unprivileged_user, "object", "which", "fs.read", env=env)
    assert refused(run, "EACCES", 1) == said and run.out == "", run
    as_json = as_user(unprivileged_user, "object", "which", "--json", "fs.read", env=env)
    assert refused_json(as_json, "EACCES", 1)["message"] == said
    tshrc.unlink()
    env["CTX_PATH"] = str(world.storage / "tool")
    found = as_user(unprivileged_user, "object", "which", "fs.read", env=env)
    assert (found.rc, found.out) == (0, f"{world.storage}/tool/fs.read\n"), found


# ------------------------------------------------------------------------- ctx object list


@needs_root
def test_a_control_the_lister_may_not_read_does_not_make_a_tool_damaged(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """docs/tools.md "Listing and resolving" (the status column is what a call would meet;
    ``damaged``: a control is missing or malformed), docs/policy.md "What the chain reads" (a
    refusal is a verdict only for root or the agent's uid): with ``fs.read.d/schema`` made
    0600 by root, root's listing says ``available`` and an agent's native call of fs.read
    gets past every check to the tool, yet a second user's listing calls it damaged."""
    schema = world.storage / "tool" / "fs.read.d" / "schema"
    schema.chmod(0o600)

    def entry(run: Run) -> dict:
        assert run.rc == 0, run
        (found,) = [t for t in run.json() if t["name"] == "fs.read"]
        return found

    as_root = entry(world.ctx("object", "list", "--tier", "system", "--json"))
    assert (as_root["status"], as_root["problems"]) == ("available", [])
    call = world.ctx("run", "--agent", "coder", "--native", "fs.read", input='{"path": "/ctx"}')
    frames = [json.loads(line) for line in call.lines()]
    assert frames[-1]["type"] == "result" and frames[-1]["exit_status"] is not None, call
    listed = as_user(
        unprivileged_user, "object", "list", "--tier", "system", "--json", env=world.user_env
    )
    assert entry(listed)["status"] != "damaged", listed


# -------------------------------------------------------------------------------- ctx tool


def test_ctx_tool_options_before_the_name_and_names_after_dashes_are_usage_errors(
    storage: Path,
) -> None:
    """``ctx tool --help`` (options of ctx tool go before NAME), R-3, docs (a malformed
    command line is ``EINVAL``, exit 2): ``ctx tool -x`` is an unknown option of ctx tool,
    with its usage lines; ``ctx tool -- -x`` and ``ctx tool ''`` name no legal tool; none of
    them runs or records anything: the tsh configuration and the tool's log are as they
    were."""
    env = clean_env(CTX_STORAGE=str(storage), CTX_PATH=str(storage / "tool"))
    controls = storage / "tool" / "tsh.config.d"
    before = (controls / "log").read_bytes(), (storage / "tool" / "tsh.d" / "config").read_bytes()
    unknown = ctx_run("tool", "-x", "cache_capacity=5", env=env)
    assert refused(unknown, "EINVAL", 2) == "No such option '-x'.", unknown
    assert unknown.err.startswith("Usage: ctx tool [OPTIONS] NAME [ARGS]..."), unknown
    dashed = ctx_run("tool", "--", "-x", env=env)
    assert (
        refused(dashed, "EINVAL", 2) == "illegal tool name: '-x' must start with a letter or "
        "digit, not '-'"
    )
    empty = ctx_run("tool", "--json", "", env=env)
    assert refused_json(empty, "EINVAL", 2)["message"] == (
        "illegal tool name: a name must not be empty"
    )
    after = (controls / "log").read_bytes(), (storage / "tool" / "tsh.d" / "config").read_bytes()
    assert after == before


def test_ctx_tool_refusals_in_json_are_error_objects_and_change_nothing(storage: Path) -> None:
    """H-3, docs/tools.md "ctx tool" (``--json``: native output; a name not on CTX_PATH is
    ``ENOENT``, exit 1; the core tools that act with an agent's permissions are refused with
    ``EACCES``; otherwise the exit status is the CLI's; each call is a ``tool_result`` line of
    the tool's log): with ``--json`` a name not on the path, ``fs.write`` and a setting
    ``tsh.config`` does not know each end with one error object; ``fs.write``'s names the
    ``ctx run --agent`` to use and leaves its log alone; the refused update changes no byte
    of the configuration and is one ``host`` line of ``tsh.config``'s log, exit status 2."""
    env = clean_env(CTX_STORAGE=str(storage), CTX_PATH=str(storage / "tool"))
    tools = storage / "tool"
    config = (tools / "tsh.d" / "config").read_bytes()
    write_log = (tools / "fs.write.d" / "log").read_bytes()
    lines = len(read_jsonl(tools / "tsh.config.d" / "log"))
    missing = refused_json(ctx_run("tool", "--json", "no.such.tool", env=env), "ENOENT", 1)
    assert missing["message"].startswith(f"no.such.tool is not on CTX_PATH ({tools})"), missing
    core = refused_json(ctx_run("tool", "--json", "fs.write", "{}", env=env), "EACCES", 1)
    assert "run it as an agent with 'ctx run --agent AGENT fs.write'" in core["message"], core
    bad = refused_json(ctx_run("tool", "--json", "tsh.config", "bogus=1", env=env), "EINVAL", 2)
    assert bad["message"] == (
        "unknown setting 'bogus'; known: max_loaded_tools, cache_capacity, window_percent"
    )
    assert (tools / "tsh.d" / "config").read_bytes() == config
    assert (tools / "fs.write.d" / "log").read_bytes() == write_log
    logged = read_jsonl(tools / "tsh.config.d" / "log")
    assert len(logged) == lines + 1, logged
    assert {k: logged[-1][k] for k in ("type", "mode", "argv", "exit_status", "status")} == {
        "type": "tool_result",
        "mode": "host",
        "argv": ["bogus=1"],
        "exit_status": 2,
        "status": "error",
    }, logged[-1]


@needs_root
def test_ctx_tool_refusal_for_a_control_the_caller_may_not_read_is_not_damage(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """docs/tools.md "ctx tool" (a damaged tool is refused ``ENOEXEC``; one whose status is
    not available ``EACCES``), "Listing and resolving" (damaged: a control missing or
    malformed): with ``tool/tsh.config.d/status`` made 0600 by root, root's ``ctx tool
    tsh.config`` prints the settings and ``ctx bootstrap`` has nothing to do; a second
    user's call is refused, but with ``EACCES`` (its own refusal), not as damage that
    bootstrap would mend."""
    status = world.storage / "tool" / "tsh.config.d" / "status"
    status.chmod(0o600)
    as_root = world.ctx("tool", "tsh.config")
    assert as_root.rc == 0 and "cache_capacity=" in as_root.out, as_root
    booted = world.ctx("bootstrap")
    assert booted.rc == 0 and "nothing to do" in booted.out, booted
    assert stat.S_IMODE(status.stat().st_mode) == 0o600
    run = as_user(unprivileged_user, "tool", "tsh.config", env=world.user_env)
    said = refused(run, "EACCES", 1)
    assert "damaged" not in said, run


# --------------------------------------------------------------------------------- ctx man


def test_man_of_an_unknown_or_empty_topic_is_enoent_listing_the_topics(storage: Path) -> None:
    """D-1, ``ctx man --help`` (exit 1, ENOENT, for an unknown topic): ``ctx man nope`` and
    ``ctx man ''`` print no page, say ``no manual page`` quoting what was asked and list the
    topics; with ``--json`` the same as one error object."""
    env = clean_env(CTX_STORAGE=str(storage))
    for topic in ("nope", "", "ctx.README"):
        said = f"no manual page {topic!r}; the topics are {TOPICS}"
        run = ctx_run("man", topic, env=env)
        assert refused(run, "ENOENT", 1) == said and run.out == "", run
        assert refused_json(ctx_run("man", "--json", topic, env=env), "ENOENT", 1)["message"] == (
            said
        )


# ------------------------------------------------------------------------------ ctx policy


@pytest.mark.xfail(
    strict=True,
    reason="P-8: with standard input a directory ('< DIR'), 'ctx policy check -' dies before "
    "ctx runs ('Fatal Python error: init_sys_streams: <stdin> is a directory', exit 1) "
    "instead of the '-: ERRNO: …' line it gives a closed or write-only standard input",
)
def test_policy_check_of_a_standard_input_that_is_a_directory_is_an_errno_line(
    tmp_path: Path,
) -> None:
    """P-8 (one line per error on stderr, exit 1), docs/policy.md "Commands" (``-`` with
    standard input closed is refused with ``EBADF``, ``-: EBADF: …``): ``ctx policy check -
    < DIR`` is refused the same way, one ``-: ERRNO:`` line, exit 1, no interpreter crash."""
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        run = with_streams(["policy", "check", "-"], clean_env(), stdin=fd)
    finally:
        os.close(fd)
    assert "Fatal Python error" not in run.err and "Traceback" not in run.err, run
    assert run.rc == 1 and re.match(r"-: E[A-Z]+: ", run.err), run


def test_policy_dash_on_a_standard_input_open_for_writing_only_is_ebadf(tmp_path: Path) -> None:
    """docs/policy.md "Commands" (a ``-`` given with standard input closed is refused with
    ``EBADF``: check exit 1, query exit 2; closed, it would read as an empty policy, which is
    valid and denies everything), P-8: standard input opened for writing only (``0>>FILE``)
    holds no policy either: ``check -`` says ``-: EBADF: …`` (exit 1; ``--json``: the file's
    one problem, ``line`` null), ``query --policy -`` ``ctx: EBADF: …`` (exit 2, no answer;
    ``--json``: the error object); the file stays empty."""
    sink = tmp_path / "sink"
    sink.touch()
    said = (
        "standard input is open for writing only (as '0>FILE' or '0>>FILE' opens it): there "
        "is no policy to read; give a FILE, or pipe the policy in; nothing was done"
    )
    fd = os.open(sink, os.O_WRONLY | os.O_APPEND)
    try:

        def run(*args: str) -> Run:
            return with_streams(list(args), clean_env(), stdin=fd)

        check = run("policy", "check", "-")
        report = run("policy", "check", "--json", "-")
        query = run("policy", "query", "--policy", "-", "a_t", "tool:x", "execute")
        as_json = run("policy", "query", "--json", "--policy", "-", "a_t", "tool:x", "execute")
    finally:
        os.close(fd)
    assert (check.rc, check.out, check.err) == (1, "", f"-: EBADF: {said}\n"), check
    assert report.rc == 1 and report.json() == {
        "valid": False,
        "files": [
            {
                "file": "-",
                "valid": False,
                "problems": [
                    {"line": None, "error": "EBADF", "errno": errno.EBADF, "message": said}
                ],
            }
        ],
    }, report
    assert refused(query, "EBADF", 2) == said and query.out == "", query
    assert refused_json(as_json, "EBADF", 2)["message"] == said
    assert sink.read_bytes() == b""


@needs_root
def test_a_policy_the_user_may_not_read_is_unreadable_for_check_and_no_answer_for_query(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """P-8, docs/policy.md "Commands" (check: 1 invalid or unreadable; query: ``allow`` exit 0
    or ``deny`` exit 1, never for a policy not read): a policy file only root may read,
    given by a second, real user, is ``FILE: EACCES: cannot read FILE: Permission denied``
    for check (exit 1), and for query no ``allow`` or ``deny`` but ``ctx: EACCES`` with
    exit 2 (the error object with ``--json``), even with a second layer that allows."""
    user = unprivileged_user
    private = world.scratch / "private.policy"
    private.write_text("allow a_t tool:x execute\n")
    private.chmod(0o600)
    public = world.scratch / "public.policy"
    public.write_text("allow a_t tool:x execute\n")
    public.chmod(0o644)
    said = f"cannot read {private}: Permission denied"
    check = as_user(user, "policy", "check", public, private)
    assert (check.rc, check.out, check.err) == (1, "", f"{private}: EACCES: {said}\n"), check
    query = ("policy", "query", "--policy", public, "--policy", private, "a_t", "tool:x", "execute")
    answered = as_user(user, *query)
    assert refused(answered, "EACCES", 2) == said and answered.out == "", answered
    assert refused_json(as_user(user, *query, "--json"), "EACCES", 2)["message"] == said


def test_explain_with_a_location_outside_the_root_is_a_malformed_request(
    storage: Path,
) -> None:
    """docs/policy.md "Commands" (``--location``: relative to the storage root or an absolute
    path within it; one outside the root is ``EINVAL``), ``ctx policy explain --help`` (2 for
    a malformed request): ``/etc``, the root itself and the root with a trailing ``/`` name
    no directory within it: exit 2, the location and the root quoted, no verdict on stdout
    (the error object alone with ``--json``)."""
    env = clean_env(CTX_STORAGE=str(storage))
    problems = []
    for location in ("/etc", str(storage), f"{storage}/"):
        said = (
            f"{location!r} names no directory within the storage root {str(storage)!r}; give "
            "the one (tool, home/UID/tool, shared/SPACE/tool, or a session directory)"
        )
        args = ("policy", "explain", "coder", "tool:fs.read", "execute", "--location", location)
        text = ctx_run(*args, env=env)
        if refused(text, "EINVAL", 2) != said or text.out:
            problems.append(text)
        refused_json(ctx_run(*args, "--json", env=env), "EINVAL", 2)
    assert problems == []


@needs_root
def test_explain_by_a_user_who_may_not_read_the_agents_policy_gives_no_verdict(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """docs/policy.md "What the chain reads" ("A refusal is a verdict on the agent only when
    that process is root or runs as the agent's uid; ``ctx policy explain`` run by another
    user may be refused what the agent may read …, which says nothing of the agent.  It then
    gives no verdict but exits 1 naming what that user may not enter"), "Commands" (exit 1:
    "or not judged: ``EACCES`` on stderr when the caller, not the agent, may not read what
    decides it"): with ``agent/coder.d/policy`` made 0600 by root (a private policy; root's
    calls read it), root's explanation allows, and a second user's is no deny but an
    ``EACCES`` naming that user's uid, with an empty stdout."""
    policy = world.storage / "agent" / "coder.d" / "policy"
    policy.chmod(0o600)
    args = ("policy", "explain", "coder", "tool:fs.read", "execute")
    as_root = world.ctx(*args)
    assert as_root.rc == 0 and as_root.lines()[-1] == "allow", as_root
    user = unprivileged_user
    other = as_user(user, *args, env=world.user_env)
    assert "Traceback" not in other.err, other
    assert other.rc == 1 and other.out == "", other
    assert other.err.startswith(
        f"ctx: EACCES: cannot judge whether agent 'coder' may execute tool:fs.read: uid {user.uid} "
    ), other


# --------------------------------------------------------------------------------- ctx run


def test_run_option_values_it_cannot_take_are_usage_errors_in_both_modes(storage: Path) -> None:
    """T-3, ``ctx run --help`` and docs/tools.md ("a malformed command line … ``EINVAL``, exit
    2, nothing run or recorded", reported as every other command reports one; "``--timeout``
    is at most a year and a day (31 622 400 s)"; options are spelt out): a timeout of 0, of
    ``nan``, of ``1_0`` or past a year and a day, an empty ``--storage`` and a misspelt
    ``--session`` are refused before anything runs, in terminal or in native mode: the usage
    lines, then ``ctx: EINVAL:`` naming the option and the value, no frame on stdout, the
    storage root as it was."""
    cases = {
        ("--timeout", "0"): "Invalid value for '--timeout': '0' is not a positive number of "
        "seconds",
        ("--timeout", "nan"): "Invalid value for '--timeout': 'nan' is not a number of seconds",
        ("--timeout", "1_0"): "Invalid value for '--timeout': '1_0' is not a number of seconds",
        ("--timeout", "31622401"): "Invalid value for '--timeout': '31622401' is longer than a "
        "year and a day (31622400 seconds)",
        ("--storage", ""): "Invalid value for '--storage': an empty string names no path",
        ("--sesion", "s"): "No such option '--sesion'. Did you mean '--session'?",
    }
    env = clean_env(CTX_STORAGE=str(storage))
    before = snapshot(storage)
    problems = []
    for index, ((option, value), said) in enumerate(cases.items()):
        mode = ("--native",) if index % 2 else ()  # terminal and native mode in turn
        run = ctx_run("run", "--agent", "coder", *mode, option, value, "fs.read", env=env,
                      input="{}")  # fmt: skip
        if (
            refused(run, "EINVAL", 2) != said
            or run.out
            or not run.err.startswith("Usage: ctx run [OPTIONS] TOOL [ARGS]...")
        ):
            problems.append(run)
    assert problems == []
    assert snapshot(storage) == before


def test_run_native_with_arguments_after_the_tool_is_a_usage_error(storage: Path) -> None:
    """T-3 (agent native mode: structured JSON input), ``ctx run --help`` ("the tool's JSON
    input … is read from stdin"; a malformed command line is exit 2, nothing run or
    recorded): ``ctx run --native --agent coder fs.read /etc`` is refused saying native mode
    takes its input on stdin, exit 2, no frame, nothing recorded."""
    env = clean_env(CTX_STORAGE=str(storage))
    before = snapshot(storage)
    run = ctx_run("run", "--native", "--agent", "coder", "fs.read", "/etc", env=env, input="{}")
    assert refused(run, "EINVAL", 2) == "native mode takes its input on stdin, not as arguments"
    assert run.out == "" and run.err.startswith("Usage: ctx run"), run
    assert snapshot(storage) == before


@pytest.mark.parametrize("root", ["a loop of links", "CTX_STORAGE set but empty"])
def test_run_native_answers_a_root_it_cannot_use_with_its_result_frame(
    tmp_path: Path, root: str
) -> None:
    """docs/tools.md "Agent native mode and its frames" (``result``: always, last; exit 1 for
    every failure but a bad input) and the native answer to a storage root that does not
    exist or is a file (one ``result`` frame, ``error`` naming it, stage ``agent``):
    ``CTX_STORAGE`` naming ``a -> b -> a``, or set but empty, is refused with exit 1 and a
    ``result`` frame whose ``error`` is ``ELOOP`` or ``EINVAL``, as its stderr line says."""
    missing = ctx_run(
        "run", "--native", "--agent", "coder", "fs.read",
        env=clean_env(CTX_STORAGE=str(tmp_path / "missing")), input="{}",
    )  # fmt: skip
    (frame,) = [json.loads(line) for line in missing.lines()]
    assert missing.rc == 1 and frame["error"]["error"] == "ENOENT", missing
    if root == "a loop of links":
        (tmp_path / "a").symlink_to("b")
        (tmp_path / "b").symlink_to("a")
        env, expected = clean_env(CTX_STORAGE=str(tmp_path / "a")), "ELOOP"
    else:
        env, expected = clean_env(CTX_STORAGE=""), "EINVAL"
    run = ctx_run("run", "--native", "--agent", "coder", "fs.read", env=env, input="{}")
    refused(run, expected, 1)
    lines = run.lines()
    assert len(lines) == 1, run
    result = json.loads(lines[0])
    assert (result["type"], result["status"], result["error"]["error"]) == (
        "result",
        "error",
        expected,
    ), run


@needs_root
def test_run_recording_in_the_manual_bundle_is_refused_and_writes_nothing(world: World) -> None:
    """X-2 (the bundle is system-maintained), D-1 (manuals grant nothing), docs/tools.md
    "Running a tool" (stage ``session``: a session in ``shared/<space>/`` needs
    ``shared:<space> write`` through the whole chain, ``EACCES`` naming the step, and nothing
    is created): ``ctx run --project cortexfs-docs`` is refused before the tool runs — 126
    in terminal mode, a ``result`` frame at stage ``session`` in native mode — naming
    ``shared/cortexfs-docs``; no session directory appears in the bundle or anywhere else."""
    before = snapshot(world.storage)
    terminal = world.ctx("run", "--agent", "coder", "--project", "cortexfs-docs", "fs.read", "/")
    said = refused(terminal, "EACCES", 126)
    assert said.startswith("step 2 (mode bits): shared/cortexfs-docs "), terminal
    native = world.ctx(
        "run", "--native", "--agent", "coder", "--project", "cortexfs-docs", "fs.read",
        input='{"path": "/ctx"}',
    )  # fmt: skip
    (frame,) = [json.loads(line) for line in native.lines()]
    assert native.rc == 1 and frame["type"] == "result" and frame["exit_status"] is None, native
    assert (frame["error"]["error"], frame["error"]["stage"]) == ("EACCES", "session"), frame
    assert frame["error"]["message"] == said, frame
    assert snapshot(world.storage) == before


# ------------------------------------------------------------------------ ctx queue work


def test_worker_counts_spelt_otherwise_are_refused_before_a_claim(queue: QueueCLI) -> None:
    """docs/workers.md, ``ctx queue work --help`` (``--concurrency`` 1 to 1024, ``--max-jobs``
    N; a usage error, exit 2, before any job is claimed), §2.4: a count with a sign, a
    blank, an underscore, digits of another script, a hexadecimal or an exponent is refused
    as ``not an integer in decimal digits``, for both options, naming the option and quoting
    the value; the pending job stays pending and no session is made."""
    job = queue.publish(request("fs.read"), name="waiting")
    before = snapshot(queue.storage)
    problems = []
    cases = [
        ("--concurrency", "+5"),
        ("--max-jobs", " 1"),
        ("--concurrency", "1_0"),
        ("--max-jobs", "\u0663"),
        ("--concurrency", "0x10"),
        ("--max-jobs", "1e3"),
    ]
    for option, value in cases:
        run = queue.run("work", "--drain", "--agent", "ci", option, value)
        said = f"Invalid value for '{option}': {value!r} is not an integer in decimal digits"
        if refused(run, "EINVAL", 2) != said or run.out:
            problems.append(run)
    assert problems == []
    assert snapshot(queue.storage) == before and queue.state(job) == "pending"


def test_worker_durations_that_are_no_finite_seconds_are_refused_before_a_claim(
    queue: QueueCLI,
) -> None:
    """docs/workers.md, ``ctx queue work --help`` (``--timeout`` per-job seconds, ``--ttl``
    at least 1), §2.4 (2 usage error): ``1e999`` is no finite number of seconds, ``inf`` and
    ``nan`` are no numbers of seconds, and a timeout past a year and a day is out of its
    range — each a usage error naming the option, with the ``--json`` error object, and the
    job stays pending."""
    job = queue.publish(request("fs.read"), name="waiting")
    before = snapshot(queue.storage)
    cases = {
        ("--timeout", "1e999"): "Invalid value for '--timeout': '1e999' is not a finite number "
        "of seconds",
        ("--ttl", "1e999"): "Invalid value for '--ttl': '1e999' is not a finite number of seconds",
        ("--timeout", "inf"): "Invalid value for '--timeout': 'inf' is not a number of seconds",
        ("--ttl", "nan"): "Invalid value for '--ttl': 'nan' is not a number of seconds",
        ("--timeout", "31622401"): "Invalid value for '--timeout': 31622401 is not in the range "
        "0<x<=31622400.0",
    }
    problems = []
    for (option, value), said in cases.items():
        run = queue.run("work", "--drain", "--agent", "ci", "--json", option, value)
        if refused_json(run, "EINVAL", 2)["message"] != said:
            problems.append(run)
    assert problems == []
    assert snapshot(queue.storage) == before and queue.state(job) == "pending"


def test_worker_names_it_cannot_use_are_refused_before_a_claim(queue: QueueCLI) -> None:
    """``ctx queue work --help`` (an empty ``--agent ''`` is an illegal name: ``EINVAL``, exit
    2, nothing claimed; ``--kind`` tool or shell), R-3 (session names), §2.4: an empty or
    two-line worker id, a session name with a blank, an empty agent and an unknown kind are
    each refused naming what is wrong; the job stays pending, no lease or session is made."""
    job = queue.publish(request("fs.read"), name="waiting")
    before = snapshot(queue.storage)
    cases = {
        ("--worker", ""): "Invalid value for '--worker': worker id '' is not one line of "
        "printable text (no control characters)",
        ("--worker", "a\nb"): "Invalid value for '--worker': worker id 'a\\nb' is not one line "
        "of printable text (no control characters)",
        ("--session", "a b"): "illegal session name: 'a b' holds ' ', which an object name may "
        "not hold (allowed: A-Z a-z 0-9 . _ -)",
        ("--agent", ""): "illegal agent name: a name must not be empty",
        ("--kind", "bogus"): "Invalid value for '--kind': 'bogus' is not one of 'tool', 'shell'.",
    }
    problems = []
    for (option, value), said in cases.items():
        agent = () if option == "--agent" else ("--agent", "ci")
        run = queue.run("work", "--drain", *agent, option, value)
        if refused(run, "EINVAL", 2) != said or run.out:
            problems.append(run)
    assert problems == []
    assert snapshot(queue.storage) == before and queue.state(job) == "pending"


def test_a_worker_for_an_agent_that_does_not_exist_claims_nothing(queue: QueueCLI) -> None:
    """W-1 (a worker runs each job's tool as its agent), ``ctx queue work --help``, docs/tools.md
    (for an agent that does not exist the reason names ``ctx agent list`` and ``ctx agent
    create REQUEST.json``): ``ctx queue work --drain --agent ghost`` is ``ENOENT`` (exit 1,
    the error object with ``--json``) before its first claim: the job is still pending, not
    failed with that reason, and no lease, claim or home is made."""
    job = queue.publish(request("fs.read"), name="waiting")
    before = snapshot(queue.storage)
    for extra in ((), ("--json",)):
        run = queue.run("work", "--drain", "--agent", "ghost", *extra)
        said = refused(run, "ENOENT", 1)
        assert said.startswith(
            f"there is no agent 'ghost' ({queue.storage}/agent/ghost does not exist); 'ctx "
            "agent list' lists the agents there are, and 'ctx agent create REQUEST.json'"
        ), run
        if extra:
            assert refused_json(run, "ENOENT", 1)["message"] == said
    assert snapshot(queue.storage) == before and queue.state(job) == "pending"


# --------------------------------------------------------------------- ctx bootstrap SOURCE


@pytest.mark.parametrize("pyproject", ["another version", "not TOML"])
def test_bootstrap_from_a_tree_of_another_version_or_unreadable_toml_changes_nothing(
    storage: Path, tmp_path: Path, pyproject: str
) -> None:
    """R-5, D-1 (a stale bundle is rebuilt by ``ctx bootstrap [SOURCE]`` from the tree of
    the matching version), ``ctx bootstrap --help`` (the tree of another version, one whose
    ``pyproject.toml`` declares another, is refused, ``EINVAL``, exit 2, before anything is
    changed): a tree holding this version's pages but declaring version 0.0.1, or whose
    ``pyproject.toml`` is not TOML, is refused naming the file or both versions, in text and
    as the ``--json`` error object, and the bundle is as it was."""
    source = tmp_path / "src"
    shutil.copytree(REPO / "docs" / "spec", source / "docs" / "spec", symlinks=False)
    version = ctx_run("--version")
    assert version.rc == 0, version
    ours = version.out.split()[-1]
    if pyproject == "another version":
        (source / "pyproject.toml").write_text('[project]\nname = "cortexfs"\nversion = "0.0.1"\n')
        said = f"{source} is the source tree of cortexfs 0.0.1, but this ctx is {ours}"
    else:
        (source / "pyproject.toml").write_text("[project\n")
        said = f"{source}/pyproject.toml cannot be read as TOML ("
    env = clean_env(CTX_STORAGE=str(storage))
    # A page bootstrap would give back its mode (0444): a refused SOURCE must not get so far.
    page = storage / "shared" / "cortexfs-docs" / "README.md"
    page.chmod(0o644)
    before = snapshot(storage)
    text = ctx_run("bootstrap", source, env=env)
    assert refused(text, "EINVAL", 2).startswith(said) and text.out == "", text
    assert refused_json(ctx_run("bootstrap", "--json", source, env=env), "EINVAL", 2)[
        "message"
    ].startswith(said)
    assert snapshot(storage) == before and stat.S_IMODE(page.stat().st_mode) == 0o644
