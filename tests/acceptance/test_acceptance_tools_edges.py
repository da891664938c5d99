"""Acceptance tests of §4 (sessions and their events), §5 (policy), §6 (tools as files,
``ctx object``, ``ctx run``) and §9 (``ctx shared create``), run against the installed ``ctx``:
unusual but legal inputs, closed streams, names at their limits and the exact shape of what
the commands print."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, clean_env, ctx_run, tool_manifest

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="runs tools as another uid")

PROBE = """\
#!/bin/sh
# What the tool was started with: where its standard streams lead.
for fd in 0 1 2; do
  printf '%s=%s\\n' "$fd" "$(readlink /proc/$$/fd/$fd || echo closed)" >&2
done
"""


@pytest.fixture
def world() -> Iterator[Path]:
    """A storage root every uid may search, an agent ``coder`` (run as root's default user,
    nobody) and the tool ``demo.probe`` both policies let it run (P-6)."""
    top = Path(tempfile.mkdtemp(prefix="cortexfs-edges-", dir="/tmp"))
    top.chmod(0o755)
    storage = top / "storage"
    env = clean_env(CTX_STORAGE=str(storage))
    try:
        assert ctx_run("bootstrap", "--storage", storage).rc == 0
        request = {"name": "coder", "label": "coder_t", "tools": ["demo.probe"], "mount": []}
        (top / "coder.json").write_text(json.dumps(request))
        assert ctx_run("agent", "create", top / "coder.json", env=env).rc == 0
        probe = tool_manifest(top, "demo.probe", PROBE)
        r = ctx_run("object", "install", probe, "--tier", "system", env=env)
        assert r.rc == 0, r
        with (storage / "tool" / "demo.probe.d" / "policy").open("a") as policy:
            policy.write("allow coder_t tool:demo.probe execute\n")
        yield storage
    finally:
        shutil.rmtree(top)


def run_closed(storage: Path, fd: int, *args: str) -> subprocess.CompletedProcess:
    """``ctx ARGS`` started with descriptor ``fd`` closed (the shell's ``N<&-``)."""
    return subprocess.run(
        ["/bin/sh", "-c", f'"$@" {fd}<&-', "sh", *CTX_ARGV, *args],
        capture_output=True,
        text=True,
        env=clean_env(CTX_STORAGE=str(storage)),
        timeout=60,
    )


# ------------------------------------------------------------------ T-3: ctx run, terminal


@needs_root
def test_a_tool_run_with_stdin_closed_reads_dev_null(world):
    """T-3: in terminal mode the tool's stdin is the caller's; a caller that closed it gives
    the tool an empty stdin (/dev/null), never a descriptor that is closed, or that is
    whatever the tool's first open() got."""
    r = run_closed(world, 0, "run", "--agent", "coder", "demo.probe")
    assert r.returncode == 0, r.stderr
    assert "0=/dev/null" in r.stderr.splitlines(), r.stderr


@needs_root
def test_a_tool_run_with_stdout_closed_writes_to_dev_null(world):
    """T-3: likewise for a closed stdout."""
    r = subprocess.run(
        ["/bin/sh", "-c", '"$@" >&-', "sh", *CTX_ARGV, "run", "--agent", "coder", "demo.probe"],
        capture_output=True, text=True, env=clean_env(CTX_STORAGE=str(world)), timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "1=/dev/null" in r.stderr.splitlines(), r.stderr


@needs_root
@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize(
    ("names", "kind"),
    [
        (("--agent", "../coder", "demo.probe"), "agent"),
        (("--agent", "coder", "../demo.probe"), "tool"),
        (("--agent", "coder", "--project", "../x", "demo.probe"), "shared space"),
        (("--agent", "coder", "--session", "a/b", "demo.probe"), "session"),
    ],
)
def test_an_illegal_name_given_to_ctx_run_is_a_usage_error(world, names, kind, native):
    """R-3, T-3: an agent, tool, space or session name that is not an object name is a
    malformed command line — EINVAL, exit 2, in either mode — not a refused call (126)."""
    mode = ("--native",) if native else ()
    r = ctx_run("run", *mode, *names, input="{}", env=clean_env(CTX_STORAGE=str(world)))
    assert r.rc == 2, r
    assert r.err.startswith(f"ctx: EINVAL: illegal {kind} name"), r
    assert r.out == ""
    assert not (world / "home" / "65534").exists(), "nothing recorded"


def test_install_refuses_source_and_storage_naming_two_roots(tmp_path):
    """T-8: --source names the storage root as --storage does; given both, differently, the
    command cannot know which is meant: EINVAL, exit 2, nothing installed in either."""
    roots = [tmp_path / "a", tmp_path / "b"]
    for root in roots:
        assert ctx_run("bootstrap", "--storage", root).rc == 0
    path = tool_manifest(tmp_path, "demo.twice", "#!/bin/sh\n")

    r = ctx_run("object", "install", "--source", roots[0], "--storage", roots[1], path,
                "--tier", "system")  # fmt: skip
    (tmp_path / "link").symlink_to(roots[0])
    same = ctx_run("object", "install", "--source", roots[0], "--storage", tmp_path / "link",
                   path, "--tier", "system")  # fmt: skip

    assert r.rc == 2 and r.err.startswith("ctx: EINVAL: --source"), r
    assert not (roots[1] / "tool" / "demo.twice").exists()
    assert same.rc == 0, same
    assert (roots[0] / "tool" / "demo.twice").exists()


# ------------------------------------------------------------------ S-1, S-2: ctx session


def test_show_prints_an_event_whose_s2_fields_are_not_strings(storage):
    """S-2, S-5: events.jsonl is an ordinary file anyone with access may append to; an event
    whose type, object or status is null, a number or a list is still shown, one line, its
    value as JSON, never a traceback."""
    env = clean_env(CTX_STORAGE=str(storage))
    session = storage / "home" / str(os.getuid()) / "agent" / "gone" / "session" / "default"
    session.mkdir(parents=True)
    event = {"ts": "2026-06-22T12:00:00Z", "type": 5, "agent": "gone", "session": "default",
             "object": None, "status": ["ok"]}  # fmt: skip
    (session / "events.jsonl").write_text(json.dumps(event) + "\n")
    for command in ("show", "tail"):
        r = ctx_run("session", command, "gone", env=env)
        assert r.rc == 0, r
        assert "Traceback" not in r.err
        line = '2026-06-22T12:00:00Z  5            null                     ["ok"]'
        assert r.lines() == [line], r


@pytest.mark.parametrize("command", ["show", "tail", "repair"])
@pytest.mark.parametrize("how", [("",), ("--session", "")])
def test_an_empty_session_name_is_refused_not_read_as_the_default(storage, command, how):
    """R-3, S-1: a session name is 1 to 64 bytes; an empty one is EINVAL (exit 2), the same
    as from ctx run, rather than a command on the session ``default``."""
    env = clean_env(CTX_STORAGE=str(storage))
    session = storage / "home" / str(os.getuid()) / "agent" / "gone" / "session" / "default"
    session.mkdir(parents=True)
    (session / "events.jsonl").write_text('{"ts":"2026-06-22T12:00:00Z","type":"x"}\n{"ts":')
    r = ctx_run("session", command, "gone", *how, env=env)
    assert r.rc == 2, r
    assert r.err.startswith("ctx: EINVAL: illegal session name"), r
    assert r.out == ""
    assert (session / "events.jsonl").read_text().endswith('{"ts":')  # repair did nothing


# ------------------------------------------------------------------ ctx shared create


@pytest.mark.parametrize("obstacle", ["file", "symlink"])
def test_a_root_entry_shared_in_the_way_refuses_before_anything_is_made(tmp_path, obstacle):
    """X-1, R-2: with a file (or a symlink) where the root entry ``shared/`` belongs, the space
    is refused with ENOTDIR naming it, and the storage root is left exactly as it was: not
    given the other root entries first."""
    root = tmp_path / "storage"
    root.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if obstacle == "file":
        (root / "shared").write_text("in the way")
    else:
        (root / "shared").symlink_to(elsewhere)
    r = ctx_run("shared", "create", "proj", "--storage", root)
    assert r.rc == 1, r
    assert r.err.startswith(f"ctx: ENOTDIR: {root / 'shared'} is in the way"), r
    assert os.listdir(root) == ["shared"]
    assert os.listdir(elsewhere) == []


def test_create_in_a_new_storage_root_names_every_path_it_made_in_full(tmp_path):
    """X-1: what ``ctx shared create`` made is listed as full paths, the root entries it had
    to make first (R-2) included, in the text and the --json output alike."""
    root = tmp_path / "storage"
    r = ctx_run("shared", "create", "proj", "--storage", root)
    assert r.rc == 0, r
    made = [line.removeprefix("created   ") for line in r.lines()]
    assert all(line.startswith("created   /") for line in r.lines()), r
    assert {str(root / entry) for entry in ("bin", "tool", "shared", "shared/proj")} <= set(made)
    r = ctx_run("shared", "create", "other", "--storage", tmp_path / "second", "--json")
    assert r.rc == 0, r
    assert all(os.path.isabs(path) for path in r.json()["created"]), r


# ------------------------------------------------------------------ T-4, T-8a: ctx object which


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_tshrc_that_is_not_a_regular_file_is_named_in_the_refusal(storage, tmp_path, kind):
    """T-4: ``$CTX_HOME/.tshrc`` is a data file; a directory or a FIFO in its place is refused
    the same way, EINVAL naming the file (exit 1), never waited on, never a bare errno."""
    home = tmp_path / "home"
    home.mkdir()
    tshrc = home / ".tshrc"
    if kind == "directory":
        tshrc.mkdir()
    else:
        os.mkfifo(tshrc)
    env = clean_env(CTX_STORAGE=str(storage), CTX_HOME=str(home))
    r = ctx_run("object", "which", "fs.read", env=env, timeout=20)
    assert r.rc == 1, r
    assert r.err == (
        f"ctx: EINVAL: {tshrc} is not a regular file; make it a file of KEY=VALUE lines, "
        "or remove it\n"
    ), r


def listed(storage: Path, name: str) -> dict:
    r = ctx_run(
        "object", "list", "--tier", "system", "--json", env=clean_env(CTX_STORAGE=str(storage))
    )
    assert r.rc == 0, r
    [entry] = [entry for entry in r.json() if entry["name"] == name]
    return entry


@pytest.mark.parametrize(
    ("text", "status", "reason"),
    [
        ("available\n", "available", ""),
        ("disabled\n", "disabled", ""),
        ("unavailable: moving to a new host\n", "unavailable", "moving to a new host"),
        ("Available\n", "unavailable", "the status control reads 'Available'"),
        ("available: soon\n", "unavailable", "the status control reads 'available: soon'"),
        ("\n", "unavailable", "the status control reads ''"),
    ],
)
def test_the_status_column_is_one_of_the_four_a_call_would_meet(storage, text, status, reason):
    """T-8a (docs/tools.md): ``ctx object list`` shows available, disabled, unavailable or
    damaged, what a call would meet; a status control that says none of the three settings
    refuses every call, so it is listed as unavailable with the text it holds, not as a
    fifth status of its own (or an empty column)."""
    (storage / "tool" / "fs.read.d" / "status").write_text(text)
    entry = listed(storage, "fs.read")
    assert entry["status"] == status, entry
    assert entry["reason"].startswith(reason), entry
    assert entry["problems"] == []


# ------------------------------------------------------------------ R-1 through §4 and §6


@pytest.mark.parametrize(
    ("args", "status"),
    [
        (("session", "show", "coder"), 1),
        (("session", "show", "coder", "--uid", "1000"), 1),
        (("session", "tail", "coder", "--project", "proj"), 1),
        (("session", "repair", "coder"), 1),
        (("session", "list", "coder"), 1),
        (("run", "--agent", "coder", "fs.read"), 126),  # docs/tools.md: 126, the call refused
        (("policy", "explain", "coder", "tool:fs.read", "execute"), 1),
    ],
)
def test_a_storage_root_that_does_not_exist_is_what_the_refusal_names(tmp_path, args, status):
    """R-1: with CTX_STORAGE naming no directory (a typo), the commands that look up an agent
    or its sessions say that the storage root does not exist, not that the agent is missing."""
    missing = tmp_path / "no-such-root"
    r = ctx_run(*args, env=clean_env(CTX_STORAGE=str(missing)))
    assert r.rc == status, r
    assert r.err.startswith(f"ctx: ENOENT: storage root {missing} does not exist;"), r
    assert r.out == "", r
    assert not missing.exists()


def test_a_json_object_without_ts_is_a_damaged_line_not_an_event(storage):
    """S-2, S-5 (docs/sessions.md): a complete line that holds no event is reported as
    damaged and skipped; ``{}`` is JSON but no event (every event has its ``ts``)."""
    env = clean_env(CTX_STORAGE=str(storage))
    session = storage / "home" / str(os.getuid()) / "agent" / "gone" / "session" / "default"
    session.mkdir(parents=True)
    event = '{"ts":"2026-06-22T12:00:00Z","type":"x","agent":"gone","session":"default"}'
    (session / "events.jsonl").write_text("{}\n" + event + "\n" + '{"type":"y"}\n')
    r = ctx_run("session", "show", "gone", "--json", env=env)
    assert r.rc == 0, r
    assert r.lines() == [event], r  # each event as it is stored
    assert "skipped damaged lines 1, 3 of" in r.err, r


# ------------------------------------------------------------------ P-8: ctx policy


def test_standard_input_given_twice_is_the_same_policy_twice(tmp_path):
    """P-8, P-6: every ``--policy`` must allow; ``-`` twice names standard input twice, the
    same policy, not that policy and then an empty one that denies everything."""
    rule = "allow coder_t tool:fs.read execute\n"
    args = ("policy", "query", "--policy", "-", "--policy", "-")
    r = ctx_run(*args, "coder_t", "tool:fs.read", "execute", input=rule)
    assert (r.rc, r.out) == (0, "allow\n"), r
    r = ctx_run("policy", "check", "-", "-", input="allow coder_t tool:* execute\n")
    assert r.rc == 1, r
    assert (
        r.err.splitlines()
        == ["-:1: EINVAL: tool:*: globs are not supported (P-2); name each object"] * 2
    ), r


# ------------------------------------------------------------------ T-8: ctx object check


@pytest.mark.parametrize("blank", [" ", "\n", " \t\n "])
def test_a_description_of_blanks_only_is_invalid(tmp_path, blank):
    """T-1, T-8 (docs/tools.md: ``description`` is non-empty text): a description of blanks
    only would be installed as an empty control, so the manifest is invalid (exit 1, one
    ``FILE: EINVAL: description: …`` line), and install refuses it with nothing made."""
    path = tool_manifest(tmp_path, "demo.blank", "#!/bin/sh\n")
    document = json.loads(path.read_text())
    path.write_text(json.dumps({**document, "description": blank}))
    r = ctx_run("object", "check", path)
    assert r.rc == 1, r
    assert r.err == f"{path}: EINVAL: description: only blanks; say what the tool does\n", r
    storage = tmp_path / "storage"
    assert ctx_run("bootstrap", "--storage", storage).rc == 0
    r = ctx_run("object", "install", "--source", storage, path, "--tier", "system")
    assert r.rc == 1, r
    assert not (storage / "tool" / "demo.blank").exists()


@pytest.mark.parametrize("command", ["show", "tail", "repair"])
@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_an_events_file_that_is_not_a_regular_file_is_named(storage, command, kind):
    """S-5 (docs/sessions.md): events.jsonl must be a regular file; a directory in its place is
    refused like a FIFO is, EINVAL naming the file (exit 1), never waited on or a bare errno."""
    env = clean_env(CTX_STORAGE=str(storage))
    session = storage / "home" / str(os.getuid()) / "agent" / "gone" / "session" / "default"
    session.mkdir(parents=True)
    events = session / "events.jsonl"
    if kind == "directory":
        events.mkdir()
    else:
        os.mkfifo(events)
    r = ctx_run("session", command, "gone", env=env, timeout=20)
    assert r.rc == 1, r
    refused = f"ctx: EINVAL: {events} is not a regular file"
    if command == "repair":  # it tightened the home session (0755) before it met the file
        refused += f" (before that, it tightened {session} (mode 0755 -> 0700))"
    assert r.err == f"{refused}\n", r
