"""SPEC §7 (tsh, ``tool/tsh.d/config``, ``ctx tool``: H-1..H-5), §8 (ctxterm, agents and the
terminal socket: A-1..A-5) and §9 (shared spaces: X-1, X-2), read sentence by sentence and
checked with the command lines, exit statuses, file paths and output fields SPEC gives:

* H-1: the three places of tsh and ctxterm; tsh resolves names on CTX_PATH only, never a path
  to a host program, a program in the current directory or a tool's own file path.
* H-2: a standalone tsh, as root and as an ordinary uid, discovers tools and shows their
  metadata as their controls hold it, and runs none.
* H-3: ``ctx tool`` records each call of the safe core CLI as the caller's own; its native
  error is one JSON object with the status of the CLI.
* H-4: ``tsh.config`` reports which keys an update changed; pinned tools are outside the bound
  of ``max_loaded_tools`` and outside ``unload``.
* A-1, A-2, H-1: the processes of a real agent terminal (ctxterm holding the PTY, tsh on it in
  ``/workspace``) and the socket link of A-2.
* A-3: every request field lands in its control; a field of another shape is refused and
  creates nothing; no root entry is added.
* A-5: ``agent.update`` takes a control name, not a path to one.
* X-1: a space's parts, and the session of a call made for the project under
  ``shared/<name>/agent/<agent>/session/<session>/``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    ROOT_ENTRIES,
    OnStorage,
    clean_env,
    ctx_run,
    read_jsonl,
    scratch_top,
    snapshot,
)
from tests.acceptance.terminalcli import CoderHost, coder_host, tsh_of
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as another uid")
needs_terminal = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs root, bubblewrap and /dev/fuse",
)

SCRATCH = scratch_top(__file__)
TSH_KEYS = ("max_loaded_tools", "cache_capacity", "window_percent")


# ------------------------------------------------------------------ helpers


class Root(OnStorage):
    def __init__(self, storage: Path) -> None:
        self.storage = storage


def human_env(storage: Path, home: Path, **extra: str) -> dict[str, str]:
    """A host user's environment: this storage root, ``home`` as CTX_HOME (no .tshrc) and
    the system tier as CTX_PATH unless given."""
    home.mkdir(parents=True, exist_ok=True)
    extra.setdefault("CTX_PATH", str(storage / "tool"))
    return clean_env(CTX_STORAGE=str(storage), CTX_HOME=str(home), **extra)


def tsh(
    storage: Path, *args: str, env: dict[str, str], script: str = "", cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The root's ``bin/tsh`` run as a standalone human tsh (H-2)."""
    return subprocess.run(
        [storage / "bin" / "tsh", *args],
        input=script,
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=60,
    )


def marker_program(path: Path, mark: Path) -> Path:
    """An executable shell program at ``path`` that creates ``mark`` when anything runs it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\ntouch {mark}\necho ran\n")
    path.chmod(0o755)
    return path


def config_of(storage: Path) -> Path:
    return storage / "tool" / "tsh.d" / "config"


@pytest.fixture
def root(storage: Path) -> Root:
    return Root(storage)


@pytest.fixture
def coder(_template: Path) -> Iterator[CoderHost]:
    with coder_host(_template, SCRATCH, ["tsh.config"], {"notes.txt": "seen\n"}) as host:
        yield host


# ------------------------------------------------------------------ H-1


def test_h1_the_three_places_hold_executables_and_tool_tsh_is_a_tool_object(root: Root) -> None:
    """H-1: tsh is started by ``ctxterm`` (``/ctx/bin/ctxterm``, ``/ctx/bin/tsh``,
    ``/ctx/tool/tsh``): each is a regular executable file; ``tool/tsh`` is a tool like any
    other (T-1: its control directory with every control, ``name`` reading ``tsh``) that
    ``ctx object which tsh`` resolves (T-8a)."""
    for entry in ("bin/ctxterm", "bin/tsh", "tool/tsh"):
        path = root.storage / entry
        assert path.is_file() and not path.is_symlink(), entry
        assert path.stat().st_mode & 0o111, entry
    controls = root.storage / "tool" / "tsh.d"
    for control in ("name", "description", "schema", "cap", "policy", "status", "log"):
        assert (controls / control).is_file(), control
    for hooks in ("hooks/pre.d", "hooks/post.d"):
        assert (controls / hooks).is_dir(), hooks
    assert (controls / "name").read_text().strip() == "tsh"
    which = root.ctx(
        "object", "which", "tsh", env={**root.env, "CTX_PATH": str(root.storage / "tool")}
    )
    assert (which.rc, which.out) == (0, f"{root.storage}/tool/tsh\n"), which


@pytest.mark.parametrize("form", ["absolute", "dot-slash", "tool-file-path", "bare-in-cwd"])
def test_h1_tsh_never_runs_a_program_named_by_path_or_found_in_the_current_directory(
    storage: Path, tmp_path: Path, form: str
) -> None:
    """H-1: "it never runs host commands from PATH; it only resolves and runs CortexFS tool
    objects through CTX_PATH": a path to a program (absolute, ``./prog``, even the file of a
    tool) is no name on CTX_PATH, nor is a program of the current directory; each is
    status 127 with ``not a tool on CTX_PATH``, and nothing runs."""
    mark = tmp_path / "ran"
    cwd = tmp_path / "cwd"
    program = marker_program(cwd / "prog", mark)
    argv = {
        "absolute": str(program),
        "dot-slash": "./prog",
        "tool-file-path": str(storage / "tool" / "tsh.config"),
        "bare-in-cwd": "prog",
    }[form]
    env = human_env(storage, tmp_path / "home", PATH=f"{cwd}:{os.environ.get('PATH', '')}")
    for done in (
        tsh(storage, argv, env=env, cwd=cwd),
        tsh(storage, env=env, cwd=cwd, script=f"{argv}\n"),
    ):
        assert done.returncode == 127, done
        assert "not a tool on CTX_PATH" in done.stderr, done
        assert "ran" not in done.stdout, done
    assert not mark.exists()


# ------------------------------------------------------------------ H-2


def test_h2_describe_shows_the_metadata_its_controls_hold(storage: Path, tmp_path: Path) -> None:
    """H-2: a standalone tsh "can discover tools and read metadata": ``describe NAME`` shows
    the path ``which`` prints and the description, schema and cap the tool's controls hold,
    for every core tool, and exits 0."""
    env = human_env(storage, tmp_path / "home")
    for name in ("fs.read", "fs.write", "shell.exec", "tsh.config"):
        controls = storage / "tool" / f"{name}.d"
        which = tsh(storage, "which", name, env=env)
        assert (which.returncode, which.stdout) == (0, f"{storage}/tool/{name}\n"), which
        shown = tsh(storage, "describe", name, env=env)
        assert shown.returncode == 0, shown
        described = json.loads(shown.stdout)
        assert described["name"] == name and described["path"] == f"{storage}/tool/{name}"
        assert described["description"] == (controls / "description").read_text(), name
        assert described["schema"] == json.loads((controls / "schema").read_text()), name
        assert described["cap"] == json.loads((controls / "cap").read_text()), name


@needs_root
def test_h2_an_ordinary_uid_s_tsh_lists_and_finds_tools_but_runs_none(
    searchable_storage: Path, unprivileged_user: UnprivilegedUser, tmp_path: Path
) -> None:
    """H-2 for a host user who is not root: the standalone tsh lists the tools on its path
    and ``which`` finds them (exit 0), and running one is refused with exit 126 (EACCES,
    H-2) whatever the line form; nothing is recorded in the tool's log."""
    storage = searchable_storage
    home = Path(f"/tmp/{SCRATCH.name}-home-{os.getpid()}")
    home.mkdir(mode=0o755, exist_ok=True)
    try:
        env = human_env(storage, home)
        tsh_path = str(storage / "bin" / "tsh")
        listed = run_as(unprivileged_user, [tsh_path, "tools"], env=env, stdin="")
        assert listed.returncode == 0, listed
        assert {"fs.read", "tsh.config", "tsh"} <= set(listed.stdout.split()), listed
        which = run_as(unprivileged_user, [tsh_path, "which", "fs.stat"], env=env, stdin="")
        assert (which.returncode, which.stdout) == (0, f"{storage}/tool/fs.stat\n"), which
        log = storage / "tool" / "fs.stat.d" / "log"
        before = log.read_bytes()
        for argv, stdin in (([tsh_path, "fs.stat", "/"], ""), ([tsh_path], "fs.stat /\n")):
            ran = run_as(unprivileged_user, argv, env=env, stdin=stdin)
            assert ran.returncode == 126, ran
            assert "EACCES" in ran.stderr and "H-2" in ran.stderr, ran
        assert log.read_bytes() == before
    finally:
        shutil.rmtree(home, ignore_errors=True)


# ------------------------------------------------------------------ H-3


def test_h3_each_ctx_tool_call_is_a_host_line_of_the_tools_log(root: Root) -> None:
    """H-3 with T-7: a call through ``ctx tool`` is the caller's own: each one, done, refused
    by the CLI (exit 2) or refused because the tool is not available (EACCES, exit 1), is a
    ``tool_result`` line of ``tool/tsh.config.d/log`` with an empty agent and session, mode
    ``host``, the caller's uid and its argv; the refused one has a null exit status."""
    env = {**root.env, "CTX_PATH": str(root.storage / "tool")}
    log = root.storage / "tool" / "tsh.config.d" / "log"
    before = len(read_jsonl(log))
    assert root.ctx("tool", "tsh.config", env=env).rc == 0
    assert root.ctx("tool", "tsh.config", "bogus=1", env=env).rc == 2
    status = root.storage / "tool" / "tsh.config.d" / "status"
    kept = status.read_text()
    status.write_text("disabled\n")
    try:
        off = root.ctx("tool", "tsh.config", "window_percent=2", env=env)
    finally:
        status.write_text(kept)
    assert off.rc == 1 and off.err.startswith("ctx: EACCES: "), off
    lines = read_jsonl(log)[before:]
    assert [(e["argv"], e["exit_status"]) for e in lines] == [
        ([], 0),
        (["bogus=1"], 2),
        (["window_percent=2"], None),
    ], lines
    for line in lines:
        assert line["type"] == "tool_result" and line["object"] == "tool/tsh.config", line
        assert (line["agent"], line["session"], line["mode"]) == ("", "", "host"), line
        assert line["uid"] == os.getuid(), line
    assert lines[2]["errno"] == "EACCES" and lines[2]["status"] == "error", lines[2]
    assert "window_percent=1" in config_of(root.storage).read_text()


def test_h3_ctx_tool_json_error_is_one_object_and_the_clis_status(root: Root) -> None:
    """H-3: with ``--json`` a bad update is one JSON object on stdout naming the errno
    (``error``, ``errno``, ``message``), exit 2 (the CLI's status), the file untouched."""
    env = {**root.env, "CTX_PATH": str(root.storage / "tool")}
    before = config_of(root.storage).read_bytes()
    for bad in ("bogus=1", "window_percent=101", "cache_capacity=0", "max_loaded_tools"):
        r = root.ctx("tool", "--json", "tsh.config", bad, env=env)
        assert r.rc == 2, r
        error = r.json()
        assert set(error) == {"error", "errno", "message"}, error
        assert (error["error"], error["errno"]) == ("EINVAL", 22), error
    assert config_of(root.storage).read_bytes() == before


# ------------------------------------------------------------------ H-4


def test_h4_changed_names_only_the_keys_an_update_changed(root: Root) -> None:
    """H-4: ``ctx tool --json tsh.config KEY=VALUE`` answers ``{"path", "config", "changed",
    "warnings"}``: ``changed`` lists the keys whose value changed, a key set to the value it
    has changes nothing and leaves the file as it was (same inode, same bytes)."""
    env = {**root.env, "CTX_PATH": str(root.storage / "tool")}
    config = config_of(root.storage)
    r = root.ctx("tool", "--json", "tsh.config", "window_percent=3", "cache_capacity=32", env=env)
    assert r.rc == 0, r
    answer = r.json()
    assert set(answer) == {"path", "config", "changed", "warnings"}, answer
    assert answer["path"] == str(config)
    assert answer["config"] == {"max_loaded_tools": 64, "cache_capacity": 32, "window_percent": 3}
    assert answer["changed"] == ["window_percent"] and answer["warnings"] == [], answer
    inode, text = config.stat().st_ino, config.read_bytes()
    again = root.ctx("tool", "--json", "tsh.config", "window_percent=3", env=env)
    assert again.rc == 0 and again.json()["changed"] == [], again
    assert (config.stat().st_ino, config.read_bytes()) == (inode, text)
    plain = root.ctx("tool", "tsh.config", env=env)
    assert plain.lines() == ["max_loaded_tools=64", "cache_capacity=32", "window_percent=3"]


def test_h4_pinned_tools_are_outside_the_bound_of_max_loaded_tools(
    storage: Path, tmp_path: Path
) -> None:
    """H-4: "max_loaded_tools bounds unpinned tool metadata loaded into the tsh context ...
    Pinned tools are exempt from unload": with ``max_loaded_tools=1``, two pinned tools and
    one unpinned tool stay loaded together; loading another unloads the unpinned one and
    never a pinned one; ``unload`` of a pinned tool is refused (status 1) until it is
    unpinned."""
    config_of(storage).write_text("max_loaded_tools=1\ncache_capacity=32\nwindow_percent=1\n")
    env = human_env(storage, tmp_path / "home")
    script = "pin fs.read fs.list\nload fs.stat\nloaded\nload fs.write\nloaded\n"
    done = tsh(storage, env=env, script=script)
    assert done.returncode == 0, done
    lines = done.stdout.splitlines()
    shown = [line.split(":", 1)[0] for line in lines]
    # pin and load name each tool they load (2 lines, then 1), `loaded` lists the pinned
    # tools first, then the rest; the second load names one tool too.
    assert len(shown) == 10, done
    first, second = shown[3:6], shown[7:10]
    assert [line.endswith("(pinned)") for line in lines[3:6]] == [True, True, False], done
    assert sorted(first[:2]) == ["fs.list", "fs.read"] and first[2] == "fs.stat", done
    assert sorted(second[:2]) == ["fs.list", "fs.read"] and second[2:] == ["fs.write"], done
    assert "unloaded fs.stat" in done.stderr and "unloaded fs.read" not in done.stderr, done

    refused = tsh(storage, env=env, script="pin fs.read\nunload fs.read\n")
    assert refused.returncode == 1 and "pinned" in refused.stderr, refused
    freed = tsh(storage, env=env, script="pin fs.read\nunpin fs.read\nunload fs.read\nloaded\n")
    assert freed.returncode == 0, freed
    # only the pin's line: `loaded` has nothing left to show
    assert len(freed.stdout.splitlines()) == 1, freed


# ------------------------------------------------------------------ H-1: a terminal


@needs_terminal
def test_a1_a2_ctxterm_holds_the_pty_and_tsh_runs_on_it_in_workspace(coder: CoderHost) -> None:
    """A-1: "ctxterm owns the PTY for the agent terminal's lifetime and starts tsh by
    default", in ``/workspace``; H-1: the tsh is ``/ctx/bin/tsh``, as the agent's uid.  A-2:
    the session's ``terminal/main.sock`` is a symbolic link whose chain leads through one of
    the two places A-2 names to the socket; ``ctx agent stop`` ends it all."""
    term = coder.start()
    shell = tsh_of(term.session)
    assert Path(f"/proc/{shell}/cwd").readlink() == Path("/workspace")
    assert Path(f"/proc/{shell}").stat().st_uid == coder.uid
    streams = {Path(f"/proc/{shell}/fd/{n}").readlink() for n in (0, 1, 2)}
    assert len(streams) == 1 and str(streams.pop()).startswith("/dev/pts/"), streams
    holders = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{entry}/comm").read_text().strip() != "ctxterm":
                continue
            fds = [Path(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")]
            if any(str(fd.readlink()) == "/dev/ptmx" for fd in fds):
                holders.append(int(entry))
        except OSError:
            continue
    started = [e for e in coder.lifecycle(term.session) if e["type"] == "terminal.started"]
    assert len(started) == 1 and started[0]["pid"] in holders, (started, holders)
    assert term.link.is_symlink()
    hop = Path(os.readlink(term.link))
    named = (
        Path(f"/run/user/{coder.uid}/cortexfs/terminal/coder/{term.session}/main.sock"),
        Path(f"/run/cortexfs/terminal/{coder.uid}/coder/{term.session}/main.sock"),
    )
    assert hop in named, hop
    stopped = coder.ctx("agent", "stop", "coder", "--session", term.session, "--json")
    assert stopped.rc == 0, stopped
    assert stopped.json() == {"agent": "coder", "session": term.session, "pid": started[0]["pid"]}
    coder.started.remove(term.session)
    assert not term.link.exists() and not os.path.lexists(term.link)


# ------------------------------------------------------------------


@needs_root
def test_a3_every_request_field_lands_in_its_control_and_no_root_entry_is_added(
    root: Root, tmp_path: Path
) -> None:
    """A-3: a request of every field (``name``, ``label``, ``model`` a list, ``tools`` a
    list, ``shared`` name to permissions, ``mount`` a list of ``[source, target, ro|rw]``)
    makes an ordinary executable ``agent/<name>`` and ``agent/<name>.d/*`` whose label, model,
    mount and policy say what the request said; the root keeps exactly its six entries."""
    source = tmp_path / "src"
    source.mkdir()
    assert ctx_run("shared", "create", "team", env=root.env).rc == 0
    request = {
        "name": "rev",
        "label": "rev_t",
        "model": ["openai/gpt-4", "anthropic/claude"],
        "tools": ["fs.read", "fs.list"],
        "shared": {"team": ["read", "write"]},
        "mount": [[str(source), "/src", "ro"]],
    }
    made = root.create_agent(request)
    assert made["name"] == "rev", made
    entry = root.storage / "agent" / "rev"
    assert entry.is_file() and not entry.is_symlink() and entry.stat().st_mode & 0o111
    controls = root.storage / "agent" / "rev.d"
    assert (controls / "label").read_text().strip() == "rev_t"
    assert (controls / "model").read_text().split() == ["openai/gpt-4", "anthropic/claude"]
    assert [str(source), "/src", "ro"] in json.loads((controls / "mount").read_text())
    rules = {line for line in (controls / "policy").read_text().splitlines() if line[:1] != "#"}
    assert {
        "allow rev_t tool:fs.read execute",
        "allow rev_t tool:fs.list execute",
        "allow rev_t model:openai/gpt-4 use",
        "allow rev_t model:anthropic/claude use",
        "allow rev_t shared:team read",
        "allow rev_t shared:team write",
    } <= rules, rules
    assert set(os.listdir(root.storage)) == ROOT_ENTRIES


@pytest.mark.parametrize(
    "field",
    [
        {"model": "openai/gpt-4"},
        {"tools": "fs.read"},
        {"shared": {"team": ["execute"]}},
        {"shared": {"team": "rw"}},
        {"mount": [["/tmp", "/src"]]},
        {"mount": [["/tmp", "/src", "rx"]]},
        {"mount": ["/tmp:/src:ro"]},
    ],
    ids=lambda f: json.dumps(f),
)
def test_a3_a_field_of_another_shape_is_einval_and_creates_nothing(root: Root, field) -> None:
    """A-3 names each field's shape (``model`` a list, ``tools`` a list, ``shared`` name to
    permissions, ``mount`` a list of ``[source, target, "ro"|"rw"]``): a request that gives
    another is refused with EINVAL naming the field, and leaves the root as it was."""
    assert ctx_run("shared", "create", "team", env=root.env).rc == 0
    before = snapshot(root.storage)
    request = {"name": "odd", "label": "odd_t", **field}
    r = root.ctx("agent", "create", "-", input=json.dumps(request))
    assert r.rc != 0 and r.err.startswith("ctx: EINVAL: "), r
    assert next(iter(field)) in r.err, r
    assert snapshot(root.storage) == before


# ------------------------------------------------------------------


@needs_root
@pytest.mark.parametrize(
    "control",
    ["agent/selfy.d/system.md", "../selfy.d/system.md", "./system.md", "system.md/", "SYSTEM.md"],
)
def test_a5_the_control_is_named_not_reached_by_a_path(searchable_storage: Path, control) -> None:
    """A-5: ``agent.update`` "replaces exactly one of the caller's own agent/<self>.d/
    system.md or agent/<self>.d/prompt.template.md"; any other control is EINVAL: a path
    to that very file, or a name spelt otherwise, is refused (exit 2, bad input of a core
    tool) and the control stays as it was."""
    host = Root(searchable_storage)
    host.create_agent({"name": "selfy", "label": "selfy_t", "tools": ["agent.update"]})
    host.allow_tool("selfy_t", "agent.update")
    system = host.storage / "agent" / "selfy.d" / "system.md"
    before = system.read_bytes()
    payload = json.dumps({"control": control, "content": "rewritten\n"})
    r = host.ctx("run", "--agent", "selfy", "agent.update", payload)
    assert r.rc == 2 and "EINVAL" in r.err, r
    assert system.read_bytes() == before
    fine = host.ctx(
        "run", "--agent", "selfy", "agent.update", '{"control":"system.md","content":"ok\\n"}'
    )
    assert fine.rc == 0 and system.read_text() == "ok\n", fine


# ------------------------------------------------------------------


@needs_root
def test_x1_a_space_holds_its_parts_and_a_project_call_s_session_lies_in_it(
    searchable_storage: Path,
) -> None:
    """X-1: ``shared/<name>/`` has ``tool/``, ``data/``, ``queue/`` and
    ``agent/<agent>/session/<session>/``: a call made for the project by an agent the space
    admits (its group, ``shared:<name> read|write``) records its session at
    ``shared/<name>/agent/<agent>/session/<session>/events.jsonl``, and the agent's listing
    of the space shows exactly those four parts."""
    host = Root(searchable_storage)
    made = host.ctx("shared", "create", "--group", "nogroup", "team")
    if made.rc != 0 and "nogroup" in made.err:
        pytest.skip("this host has no group nogroup")
    assert made.rc == 0, made
    space = host.storage / "shared" / "team"
    assert {"tool", "data", "queue", "agent"} <= set(os.listdir(space))
    host.create_agent(
        {
            "name": "mate",
            "label": "mate_t",
            "tools": ["fs.list"],
            "shared": {"team": ["read", "write"]},
        }
    )
    host.allow_tool("mate_t", "fs.list")
    listed = host.ctx(
        "run", "--agent", "mate", "--project", "team", "--session", "s7",
        "fs.list", '{"path": "/ctx/shared/team"}',
    )  # fmt: skip
    assert listed.rc == 0, listed
    assert sorted(listed.lines()) == ["agent/", "data/", "queue/", "tool/"], listed
    events = read_jsonl(space / "agent" / "mate" / "session" / "s7" / "events.jsonl")
    kinds = [e["type"] for e in events if e.get("object") == "tool/fs.list"]
    assert kinds == ["tool_call", "tool_result"], events
    home = host.storage / "home"
    assert not list(home.glob("*/agent/mate/session/s7")), "the session is the space's"


def test_x2_the_manual_bundle_is_no_space_for_any_command(root: Root) -> None:
    """X-2: ``shared/cortexfs-docs/`` is the system-maintained manual bundle: ``ctx shared
    create``, ``ctx queue init`` and ``ctx queue publish`` refuse it as a space (EINVAL, exit
    2) and the bundle keeps exactly what it held; a request granting write on it creates the
    agent with a warning that the grant is nothing."""
    bundle = root.storage / "shared" / "cortexfs-docs"
    before = snapshot(bundle)
    for argv in (
        ("shared", "create", "cortexfs-docs"),
        ("queue", "init", "--project", "cortexfs-docs"),
        ("queue", "publish", "--project", "cortexfs-docs", "-"),
    ):
        r = root.ctx(*argv, input='{"tool": "fs.read", "input": {}}')
        assert r.rc == 2 and r.err.startswith("ctx: EINVAL: "), r
    assert snapshot(bundle) == before
    request = {"name": "reader", "label": "reader_t", "shared": {"cortexfs-docs": ["write"]}}
    made = root.ctx("agent", "create", "-", input=json.dumps(request))
    assert made.rc == 0, made
    assert "cortexfs-docs" in made.err and "grants nothing" in made.err, made
    assert snapshot(bundle) == before
