"""Tool lookup through ``CTX_PATH`` with exotic values (SPEC T-4, T-8a, §7 H-1..H-3; docs/tools.md
"CTX_PATH (T-4)", "ctx tool (H-3)", "The agent terminal").

A person's search path comes from ``$CTX_HOME/.tshrc``, else ``$CTX_PATH``, else the default; an
agent's is derived by the runtime and is authoritative.  Here the path holds empty entries
(``::``, a leading or trailing ``:``), relative entries, ``.`` and ``..``, duplicates, a
directory that is a symbolic link, and in its directories a symbolic link to a tool, a file
without an execute bit, a directory or a FIFO named like a tool, a tool without its ``.d/`` and a
``.d/`` without its tool; directory names with spaces, line breaks, escape bytes and bytes that
are not UTF-8; a value of 128 KiB and thousands of entries; entries too long for the kernel, a
directory the caller cannot search, ``/proc`` and ``/dev``, and directories outside the storage
root.  ``.tshrc`` is written with CRLF line ends, a byte order mark, comments, several
``CTX_PATH`` lines, and lines that a shell would run (``$(…)``, backticks, ``export``, ``.``);
it is a symbolic link, a FIFO, a directory, a link to another user's file, unreadable, a loop.

``ctx object which``, ``bin/tsh`` (with stdin, and at a pseudo-terminal), ``ctx tool`` and
``ctx run --agent`` must agree on the tool found; nothing a ``.tshrc`` says is ever run; an
agent's lookup ignores the caller's ``CTX_PATH`` and every ``.tshrc``; a value that cannot be
used is an errno and an exit status, never a traceback."""

from __future__ import annotations

import errno
import json
import os
import pty
import re
import select
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    scratch_top,
    tool_manifest,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, Raw, coder_host
from tests.support.users import UnprivilegedUser, find_or_create_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="acts as a second uid and as agents")
needs_terminal = pytest.mark.skipif(
    shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs bubblewrap and /dev/fuse",
)

SCRATCH = scratch_top(__file__)
NAME = "hi"
# A C0 control other than the line feed, DEL or a C1 control: the start of an escape sequence.
RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")
# One environment variable holds at most 32 pages, its name, "=" and the final NUL included.
MAX_VARIABLE = 32 * 4096
RC_FIX = "make it a file of KEY=VALUE lines, or remove it"


# ----------------------------------------------------------------------------------- helpers


def put_tool(directory: Path, text: str, *, name: str = NAME, mode: int = 0o755) -> Path:
    """An executable ``name`` in ``directory`` (made when missing) that prints ``text``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\necho {text}\n")
    path.chmod(mode)
    return path


def person(storage: Path, home: Path, ctx_path: str | None = None) -> dict[str, str]:
    """A host user's environment for ``storage``: CTX_HOME ``home``, CTX_PATH when given."""
    env = clean_env(CTX_STORAGE=str(storage), CTX_HOME=str(home))
    if ctx_path is not None:
        env["CTX_PATH"] = ctx_path
    return env


def ctx(*args, env: dict[str, str], user: UnprivilegedUser | None = None, cwd=None) -> Run:
    """``ctx ARGS`` in ``env`` (as ``user`` when given); output decoded as the bytes it was."""
    argv = [*CTX_ARGV, *map(str, args)]
    ids = {} if user is None else {"user": user.uid, "group": user.gid, "extra_groups": []}
    done = subprocess.run(argv, input=b"", capture_output=True, env=env, cwd=cwd, timeout=30, **ids)
    return Run(
        argv[len(CTX_ARGV) :],
        done.returncode,
        done.stdout.decode("utf-8", "surrogateescape"),
        done.stderr.decode("utf-8", "surrogateescape"),
    )


def tsh(
    storage: Path,
    *args: str,
    env: dict[str, str],
    script: str = "",
    user: UnprivilegedUser | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess:
    """``bin/tsh ARGS`` of ``storage`` with ``script`` on its stdin (a pipe, not a terminal)."""
    ids = {} if user is None else {"user": user.uid, "group": user.gid, "extra_groups": []}
    done = subprocess.run(
        [storage / "bin" / "tsh", *args], input=script.encode(), capture_output=True, env=env,
        cwd=cwd, timeout=30, **ids,
    )  # fmt: skip
    done.stdout = done.stdout.decode("utf-8", "surrogateescape")
    done.stderr = done.stderr.decode("utf-8", "surrogateescape")
    return done


def no_traceback(*outputs) -> None:
    for output in outputs:
        text = output.err if isinstance(output, Run) else output.stderr
        assert "Traceback" not in text, text[-1500:]


def lookup(
    storage: Path,
    env: dict[str, str],
    *,
    user: UnprivilegedUser | None = None,
    cwd=None,
    with_tool: bool = True,
) -> str | None:
    """Where ``ctx object which hi`` finds the tool (None: ENOENT, exit 1), checked to be what
    a person's tsh finds (``which``, ``tools``) and what ``ctx tool`` sees (an ordinary tool it
    refuses with EACCES, or ENOENT), all with the same environment."""
    found = ctx("object", "which", NAME, env=env, user=user, cwd=cwd)
    by_tsh = tsh(storage, env=env, user=user, cwd=cwd, script=f"which {NAME}\ntools\n")
    by_tool = ctx("tool", NAME, env=env, user=user, cwd=cwd) if with_tool else None
    no_traceback(found, by_tsh, *([by_tool] if by_tool else []))
    if found.rc == 0:
        assert len(found.lines()) == 1, found
        assert by_tsh.stdout.splitlines()[0] == found.out.rstrip("\n"), (found, by_tsh)
        assert NAME in by_tsh.stdout.splitlines()[1:], by_tsh
        if by_tool is not None:
            last = by_tool.err.splitlines()[-1]  # after the warnings a .tshrc may give
            assert by_tool.rc == 1 and last.startswith(f"ctx: EACCES: {NAME} is an ord"), by_tool
        return found.out.rstrip("\n")
    last = found.err.splitlines()[-1]
    assert found.rc == 1 and last.startswith(f"ctx: ENOENT: {NAME} is not on CTX_PATH ("), found
    assert f"tsh: {NAME}: not on CTX_PATH" in by_tsh.stderr, by_tsh
    assert NAME not in by_tsh.stdout.splitlines(), by_tsh
    if by_tool is not None:
        assert by_tool.rc == 1 and by_tool.err.splitlines()[-1].startswith("ctx: ENOENT: ")
    return None


def which_json(storage: Path, env: dict[str, str], **kw) -> dict:
    found = ctx("object", "which", "--json", NAME, env=env, **kw)
    assert found.rc == 0, found
    return found.json()


@pytest.fixture
def top() -> Iterator[Path]:
    """A scratch directory every uid may search, removed at the end."""
    made = new_scratch_dir(SCRATCH)
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
def user() -> UnprivilegedUser:
    return find_or_create_user()


# --------------------------------------------------------------------- entries of the path


def test_empty_relative_dot_and_duplicate_entries_are_ignored_and_every_way_agrees(
    storage: Path, top: Path
) -> None:
    """T-4 and docs/tools.md: "Empty and relative entries are ignored" — ``::``, a leading or
    trailing ``:``, ``.``, ``..`` and ``rel`` never mean the current directory, though it (and
    its parent and ``rel``) hold an executable ``hi``; a duplicate changes nothing; ``.`` and
    ``..`` inside an absolute entry are the kernel's.  ``ctx object which``, a person's tsh
    (``which``, ``tools``) and ``ctx tool`` find the same file, and ``--json`` lists only the
    absolute entries as directories."""
    a, b, cwd = top / "a", top / "b", top / "cwd"
    put_tool(a, "A")
    put_tool(b, "B")
    put_tool(top, "PARENT")
    put_tool(cwd, "CWD")
    put_tool(cwd / "rel", "REL")
    home = top / "home"
    cases = {
        f"::{a}": a,
        f".:{b}:": b,
        f"..:rel:{b}": b,
        f"{b}:{b}:{a}:{b}": b,
        f"{b}/:{a}": b,
        f"{top}/./a:{b}": a,
        f"{cwd}/../a:{b}": f"{cwd}/../a",  # kept as written; the kernel reads the ".."
        f"{top}/missing/../a:{b}": b,  # the kernel's "..": missing/ does not exist
        "": None,  # not set: the default, which holds no hi
        "::::": None,
        ".:..:rel:cwd:./rel": None,
    }
    for value, directory in cases.items():
        with_tool = value in (f"::{a}", f".:{b}", ".:..:rel:cwd:./rel")  # ctx tool, for some
        found = lookup(storage, person(storage, home, value), cwd=cwd, with_tool=with_tool)
        expected = None if directory is None else f"{directory}/{NAME}"
        assert found == expected, (value, found)
    shown = which_json(storage, person(storage, home, f"::.:rel:{a}::{b}:"), cwd=cwd)
    assert shown["search_path"]["directories"] == [str(a), str(b)], shown
    assert shown["search_path"]["ctx_path"] == f"::.:rel:{a}::{b}:", shown
    assert shown["search_path"]["source"] == "CTX_PATH", shown


def test_only_an_executable_regular_file_is_a_hit_and_the_rest_is_passed_over_with_why(
    storage: Path, top: Path
) -> None:
    """T-4: "a non-executable file is not a hit"; docs/tools.md: a symbolic link, a directory
    or a special file is not a hit either, and ``--json`` lists what was skipped and why.  A
    directory on the path that is itself a symbolic link is searched (the link names a
    directory, not a tool).  With nothing but non-hits, ENOENT names each of them."""
    home = top / "home"
    real = put_tool(top / "real", "REAL")
    put_tool(top / "noexec", "NOEXEC", mode=0o644)
    (top / "dir" / NAME).mkdir(parents=True, mode=0o755)
    (top / "link").mkdir()
    (top / "link" / NAME).symlink_to(real)
    (top / "fifo").mkdir()
    os.mkfifo(top / "fifo" / NAME)
    (top / "fifo" / NAME).chmod(0o755)
    (top / "linked-dir").symlink_to(top / "real")
    put_tool(top / "later", "LATER")
    non_hits = ["noexec", "dir", "link", "fifo"]
    path = ":".join(str(top / d) for d in [*non_hits, "linked-dir", "later"])
    env = person(storage, home, path)
    assert lookup(storage, env) == f"{top}/linked-dir/{NAME}"
    shown = which_json(storage, env)
    assert shown["controls"] == f"{top}/linked-dir/{NAME}.d", shown
    assert shown["skipped"] == [
        f"{top}/noexec/{NAME}: not executable",
        f"{top}/dir/{NAME}: a directory, not a regular file",
        f"{top}/link/{NAME}: a symbolic link, not a regular file",
        f"{top}/fifo/{NAME}: a special file, not a regular file",
    ], shown
    env = person(storage, home, ":".join(str(top / d) for d in non_hits))
    assert lookup(storage, env) is None
    refused = ctx("object", "which", NAME, env=env)
    for d in non_hits:
        assert f"{top}/{d}/{NAME}: " in refused.err, refused
    assert "passed over: " in refused.err, refused


def test_controls_come_from_the_directory_of_the_hit_and_never_from_another(
    storage: Path, top: Path
) -> None:
    """T-4: "the control dir ``.d/`` comes from the directory that held the executable".  A
    ``hi.d/`` in an earlier directory without an executable ``hi`` (or with one that is not
    executable), or in a later one, is never read: a person's tsh ``describe`` shows the hit's
    own controls, and none at all while the hit has no ``.d/``."""
    home = top / "home"
    for d, executable in (("early", False), ("noexec", None), ("late", True)):
        if executable is not None:
            put_tool(top / d, d.upper(), mode=0o755 if executable else 0o644)
        controls = top / d / f"{NAME}.d"
        controls.mkdir(parents=True)
        (controls / "description").write_text(f"controls of {d}\n")
    (top / "early" / NAME).unlink()
    (top / "noexec" / NAME).write_text("#!/bin/sh\necho NOEXEC\n")
    (top / "noexec" / NAME).chmod(0o644)
    put_tool(top / "hit", "HIT")
    path = ":".join(str(top / d) for d in ("early", "noexec", "hit", "late"))
    env = person(storage, home, path)
    shown = which_json(storage, env)
    assert (shown["path"], shown["controls"]) == (f"{top}/hit/{NAME}", f"{top}/hit/{NAME}.d")
    described = tsh(storage, "describe", NAME, env=env)
    assert described.returncode == 0, described
    assert json.loads(described.stdout) == {
        "name": NAME, "path": f"{top}/hit/{NAME}", "description": "", "schema": None,
        "cap": None,
    }, described  # fmt: skip
    (top / "hit" / f"{NAME}.d").mkdir()
    (top / "hit" / f"{NAME}.d" / "description").write_text("controls of hit\n")
    described = tsh(storage, "describe", NAME, env=env)
    assert json.loads(described.stdout)["description"] == "controls of hit\n", described


@pytest.mark.parametrize(
    "directory",
    [b"sp ace", b" lead and trail ", b"nl\ndir", b"tab\tdir", b"esc\x1b[2Jdir", b"bad\xff\xfe"],
    ids=["space", "edge-spaces", "newline", "tab", "escape", "not-utf8"],
)
def test_directory_names_with_spaces_controls_and_bytes_that_are_not_utf8(
    storage: Path, top: Path, directory: bytes
) -> None:
    """T-4, T-8a: a directory of any name the kernel allows is searched as named.  What
    ``ctx object which`` prints is one line, with control bytes escaped (never raw to a
    terminal), and a person's tsh prints the same text; ``--json`` gives the exact path back
    (its bytes, through Python's surrogate escapes).  A name found nowhere on such a path is
    ENOENT whose message is escaped too."""
    place = top / os.fsdecode(directory)
    put_tool(place, "ODD")
    home = top / "home"
    env = person(storage, home, str(place))
    found = lookup(storage, env)
    assert found is not None and not RAW_CONTROL.search(found), found
    shown = which_json(storage, env)
    assert os.fsencode(shown["path"]) == os.fsencode(place / NAME), shown
    assert os.fsencode(shown["search_path"]["directories"][0]) == os.fsencode(place), shown
    missing = ctx("object", "which", "no.such.tool", env=env)
    no_traceback(missing)
    assert missing.rc == 1 and missing.err.startswith("ctx: ENOENT: "), missing
    assert not RAW_CONTROL.search(missing.err.rstrip("\n")), missing


def test_a_ctx_path_of_128_kib_and_thousands_of_entries_is_searched_and_errors_stay_short(
    storage: Path, top: Path
) -> None:
    """docs/tools.md: "``$CTX_PATH`` itself may be as long as the kernel lets a variable be",
    and "a name found nowhere is ENOENT naming the first 16 entries of the path (and how many
    more)".  A value of exactly the largest size one variable may have, of thousands of entries
    with the tool in the last, is searched by ``ctx object which``, tsh and ``ctx tool``; with
    nothing found the message stays a short line."""
    hit = top / "the-last"
    put_tool(hit, "LAST")
    size = MAX_VARIABLE - len("CTX_PATH=") - 1
    tail = f":{hit}:{storage}/tool"
    entries: list[str] = []
    length = -1
    while length + len(tail) < size - 40:
        entries.append(f"/nonexistent-ctx-path/{len(entries):06d}")
        length += len(entries[-1]) + 1
    entries.append("/" + "p" * (size - len(tail) - length - 2))  # the last bytes, to the limit
    value = ":".join(entries) + tail
    assert len(value) == size and len(entries) > 4000
    home = top / "home"
    env = person(storage, home, value)
    assert lookup(storage, env) == f"{hit}/{NAME}"
    config = ctx("tool", "tsh.config", env=env)
    assert config.rc == 0 and "max_loaded_tools=" in config.out, config
    env = person(storage, home, ":".join(entries))
    assert lookup(storage, env) is None
    refused = ctx("object", "which", NAME, env=env)
    assert f" … and {len(entries) - 16} more)" in refused.err, refused.err[:600]
    assert len(refused.err) < 1000 and refused.err.count("\n") == 1, refused.err[:600]
    too_big = person(storage, home, value + "x")  # one byte more: no process can be given it
    with pytest.raises(OSError) as raised:
        ctx("object", "which", NAME, env=too_big)
    assert raised.value.errno == errno.E2BIG


def test_entries_too_long_for_the_kernel_proc_and_dev_are_passed_over_with_their_errno(
    storage: Path, top: Path
) -> None:
    """T-4: an entry longer than PATH_MAX, or with a component longer than NAME_MAX, is passed
    over with the kernel's reason (``--json``'s skipped) and the search goes on; ``/proc`` and
    ``/dev`` on the path hold nothing that is a tool (``/proc/self/environ`` is not executable),
    and ``tools`` lists them without waiting on a device or choking on a pid directory."""
    home = top / "home"
    put_tool(top / "b", "B")
    too_long = "/" + "/".join(["x" * 200] * 25)
    too_long_name = "/" + "y" * 300
    env = person(storage, home, f"{too_long}:{too_long_name}:{top}/b")
    assert lookup(storage, env) == f"{top}/b/{NAME}"
    skipped = which_json(storage, env)["skipped"]
    assert [s.rsplit(": ", 1)[1] for s in skipped] == [os.strerror(errno.ENAMETOOLONG)] * 2
    env = person(storage, home, "/proc/self:/proc/sys/kernel:/proc:/dev")
    environ = ctx("object", "which", "environ", env=env)
    no_traceback(environ)
    assert environ.rc == 1 and "/proc/self/environ: not executable" in environ.err, environ
    listed = tsh(storage, "tools", env=env)
    no_traceback(listed)
    assert (listed.returncode, listed.stdout) == (0, ""), listed


def test_ctx_tool_takes_the_root_s_core_tool_by_any_path_and_refuses_a_copy_elsewhere(
    storage: Path, top: Path
) -> None:
    """H-3, docs/tools.md: NAME must be visible on ``CTX_PATH`` and resolve to the core tool
    of the storage root's ``tool/``, "whatever name the path gives that directory: through a
    symbolic link or ``..``"; ``/proc/self/root`` and the ``/ctx`` mapping are such names.  A
    copy outside the root, earlier on the path, is refused with EACCES naming it; a link to
    the core tool earlier on the path is no hit (T-4), and the core tool after it is used."""
    home = top / "home"
    tools = storage / "tool"
    (top / "link-to-tools").symlink_to(tools)
    names = [
        f"::{tools}/.:", f"{storage}//tool/../tool", str(top / "link-to-tools"),
        f"/proc/self/root{tools}",
    ]  # fmt: skip
    if not os.path.ismount("/ctx"):  # /ctx/... names the storage root (T-4)
        names += ["/ctx/tool/../tool", ""]
    for value in names:
        shown = ctx("tool", "tsh.config", env=person(storage, home, value))
        assert shown.rc == 0 and "cache_capacity=" in shown.out, (value, shown)
    copy = top / "elsewhere"
    copy.mkdir()
    shutil.copy2(tools / "tsh.config", copy / "tsh.config")
    refused = ctx("tool", "tsh.config", env=person(storage, home, f"{copy}:{tools}"))
    assert refused.rc == 1, refused
    assert refused.err.startswith(f"ctx: EACCES: tsh.config on CTX_PATH is {copy}/tsh.config"), (
        refused
    )
    (top / "a-link").mkdir()
    (top / "a-link" / "tsh.config").symlink_to(tools / "tsh.config")
    through = ctx("tool", "tsh.config", env=person(storage, home, f"{top}/a-link:{tools}"))
    assert through.rc == 0, through
    for value in (f"tool:.:{storage}/tool-not",):
        missing = ctx("tool", "tsh.config", env=person(storage, home, value), cwd=storage)
        assert missing.rc == 1 and missing.err.startswith("ctx: ENOENT: tsh.config"), missing


def test_a_directory_the_caller_cannot_search_is_passed_over_with_eacces(
    searchable_storage: Path, top: Path, user: UnprivilegedUser
) -> None:
    """T-4 for a non-root caller: a directory on the path it may not search is passed over,
    ``--json`` saying why (EACCES's text), and the next directory's tool is the hit for
    ``ctx object which``, tsh and ``ctx tool``; when it is the only one, ENOENT says what was
    passed over.  ``ctx tool tsh.config`` still reaches the core tool after it."""
    storage = searchable_storage
    locked = top / "locked"
    put_tool(locked, "LOCKED")
    locked.chmod(0o700)
    put_tool(top / "open", "OPEN")
    home = top / "no-home"
    env = person(storage, home, f"{locked}:{top}/open")
    assert lookup(storage, env, user=user, cwd=top) == f"{top}/open/{NAME}"
    shown = which_json(storage, env, user=user, cwd=top)
    assert shown["skipped"] == [f"{locked}/{NAME}: {os.strerror(errno.EACCES)}"], shown
    env = person(storage, home, str(locked))
    assert lookup(storage, env, user=user, cwd=top) is None
    refused = ctx("object", "which", NAME, env=env, user=user, cwd=top)
    assert f"passed over: {locked}/{NAME}: {os.strerror(errno.EACCES)}" in refused.err, refused
    shown = ctx("tool", "tsh.config", env=person(storage, home, f"{locked}:{storage}/tool"),
                user=user, cwd=top)  # fmt: skip
    assert shown.rc == 0 and "window_percent=" in shown.out, shown


# ------------------------------------------------------------------------- .tshrc as data


def test_tshrc_with_crlf_comments_spaces_and_several_ctx_path_lines_the_last_wins(
    storage: Path, top: Path
) -> None:
    """T-4 source (1), docs/tools.md: ``.tshrc`` holds ``KEY=VALUE`` lines, blank lines and
    ``#`` comments.  CRLF line ends, spaces around the key and value, an indented comment
    naming another path and two ``CTX_PATH`` lines (the last wins) give one path with no
    warning, over ``$CTX_PATH``; a last ``CTX_PATH=`` with nothing after it counts as not set,
    so ``$CTX_PATH`` applies (or the default, which has no ``hi``)."""
    a, b, evil = top / "a", top / "b", top / "evil"
    for d in (a, b, evil):
        put_tool(d, d.name.upper())
    home = top / "home"
    home.mkdir()
    rc = home / ".tshrc"
    rc.write_bytes(
        (
            f"# settings of tsh\r\n\r\n  CTX_PATH = {a}  \r\n    # CTX_PATH={evil}\r\n"
            f"max_loaded_tools=3\r\nCTX_PATH={b}:{a}\r\n"
        ).encode()
    )
    env = person(storage, home, str(evil))
    assert lookup(storage, env) == f"{b}/{NAME}"
    shown = which_json(storage, env)
    assert shown["search_path"]["source"] == str(rc), shown
    assert shown["search_path"]["directories"] == [str(b), str(a)], shown
    quiet = tsh(storage, "which", NAME, env=env)
    assert (quiet.returncode, quiet.stderr) == (0, ""), quiet
    with rc.open("a") as more:
        more.write("CTX_PATH=\r\n")
    assert lookup(storage, env) == f"{evil}/{NAME}"
    assert lookup(storage, person(storage, home)) is None


def test_tshrc_lines_a_shell_would_run_are_data_named_in_one_warning_each(
    storage: Path, top: Path
) -> None:
    """T-4: "``.tshrc`` is data, never code".  Command substitutions, backticks, ``;``,
    ``export``, ``.`` and ``source`` of a script, ``eval`` and ``+=`` run nothing and set
    nothing; each line that is not ``KEY=VALUE`` is named once on stderr by ``ctx`` and once
    by a tsh that reads several command lines; a value is taken literally (``$HOME``, ``~``
    and a substitution are relative entries, ignored), so the one directory it names is the
    hit.  ``ctx tool tsh.config`` reads the same file and reaches the core tool through it."""
    a, evil = top / "a", top / "evil"
    put_tool(a, "A")
    put_tool(evil, "EVIL")
    marks = top / "marks"
    marks.mkdir()
    script = top / "script.sh"
    script.write_text(f"touch {marks}/sourced\nCTX_PATH={evil}\n")
    script.chmod(0o755)
    not_key_value = [
        f"$(touch {marks}/subst)", f"`touch {marks}/tick`", f"touch {marks}/plain; echo",
        f"export CTX_PATH={evil}", f". {script}", f"source {script}", f"eval CTX_PATH={evil}",
        f"CTX_PATH+=:{evil}", f"{script}",
    ]  # fmt: skip
    key_value = [
        f"PS1=$(touch {marks}/ps1)", f"PROMPT_COMMAND=touch {marks}/prompt",
        f"CTX_PATH=$(touch {marks}/value):`touch {marks}/value2`:$HOME/x:~:{a}:"
        f"{storage}/tool;touch {marks}/semi",
        f"CTX_PATH=$(touch {marks}/value):`touch {marks}/value2`:$HOME/x:~:{a}:{storage}/tool",
    ]  # fmt: skip
    lines = [*not_key_value[:5], *key_value[:3], *not_key_value[5:], key_value[3]]
    home = top / "home"
    home.mkdir()
    rc = home / ".tshrc"
    rc.write_text("\n".join(lines) + "\n")
    env = person(storage, home, str(evil))
    env["PATH"] = f"{top}:/usr/bin:/bin"
    assert lookup(storage, env) == f"{a}/{NAME}"
    shown = ctx("object", "which", "--json", NAME, env=env)
    assert shown.json()["search_path"]["ctx_path"] == key_value[3].removeprefix("CTX_PATH=")
    assert shown.json()["search_path"]["directories"] == [str(a), f"{storage}/tool"], shown
    numbers = [lines.index(line) + 1 for line in not_key_value]
    warned = [line for line in shown.err.splitlines() if line.startswith("ctx: warning: ")]
    assert warned == [
        f"ctx: warning: {rc}:{n}: ignored, not KEY=VALUE (.tshrc is data, never run): "
        f"{lines[n - 1].strip()!r}"
        for n in numbers
    ], shown.err
    session = tsh(storage, env=env, script=f"which {NAME}\ntools\nwhich {NAME}\n")
    assert session.returncode == 0, session
    assert session.stdout.splitlines()[0] == f"{a}/{NAME}", session
    tsh_warned = [line for line in session.stderr.splitlines() if line.startswith("tsh: warn")]
    assert len(tsh_warned) == len(not_key_value), session.stderr  # each once, not per line
    assert all(f"{rc}:{n}: ignored" in session.stderr for n in numbers), session.stderr
    config = ctx("tool", "tsh.config", env=env)
    assert config.rc == 0 and "max_loaded_tools=" in config.out, config
    assert sorted(os.listdir(marks)) == [], "a line of .tshrc was run"


def test_a_byte_order_mark_before_ctx_path_is_named_in_a_warning_and_the_line_ignored(
    storage: Path, top: Path
) -> None:
    """T-4, docs/tools.md (lenient reading, one warning naming the line): a ``.tshrc`` saved
    with a UTF-8 byte order mark has a first line whose key is not ``CTX_PATH``; ``ctx`` and
    tsh say so, showing the mark escaped, and ``$CTX_PATH`` applies."""
    put_tool(top / "a", "A")
    put_tool(top / "b", "B")
    home = top / "home"
    home.mkdir()
    (home / ".tshrc").write_bytes(b"\xef\xbb\xbfCTX_PATH=" + os.fsencode(top / "a") + b"\n")
    env = person(storage, home, str(top / "b"))
    found = ctx("object", "which", NAME, env=env)
    assert (found.rc, found.out) == (0, f"{top}/b/{NAME}\n"), found
    assert f"{home}/.tshrc:1: ignored, not KEY=VALUE" in found.err, found
    assert "\\ufeffCTX_PATH" in found.err and "\ufeff" not in found.err, found
    by_tsh = tsh(storage, "which", NAME, env=env)
    assert (by_tsh.returncode, by_tsh.stdout) == (0, found.out), by_tsh
    assert by_tsh.stderr.count("\\ufeffCTX_PATH") == 1, by_tsh


@pytest.mark.parametrize("kind", ["fifo", "directory", "nul", "huge", "others-file"])
def test_a_tshrc_that_cannot_be_used_is_refused_by_ctx_and_skipped_once_by_tsh(
    storage: Path, top: Path, kind: str, user: UnprivilegedUser
) -> None:
    """docs/tools.md: a ``.tshrc`` that is a FIFO (never waited on) or a directory, a
    ``CTX_PATH`` line holding a NUL, one over 64 KiB, or a link to a file of another user than
    the home's owner is refused: ``ctx`` exits 1 with EINVAL or EPERM naming the file and what
    to do, and ``ctx tool`` too; a standalone tsh warns once, however many lines it reads, and
    takes ``$CTX_PATH``.  (The home belongs to the test user; ``ctx`` runs as root, who could
    read the other file.)"""
    put_tool(top / "b", "B")
    put_tool(top / "evil", "EVIL")
    home = top / "home"
    home.mkdir()
    os.chown(home, user.uid, user.gid)
    rc = home / ".tshrc"
    code = "EINVAL"
    if kind == "fifo":
        os.mkfifo(rc)
    elif kind == "directory":
        rc.mkdir()
    elif kind == "nul":
        rc.write_bytes(b"CTX_PATH=" + os.fsencode(top / "evil") + b"\0x\n")
    elif kind == "huge":
        rc.write_text(f"CTX_PATH={top}/evil\n" + "# padding\n" * 7000)
    else:
        secret = top / "root-owned"
        secret.write_text(f"CTX_PATH={top}/evil\n")
        rc.symlink_to(secret)
        code = "EPERM"
    env = person(storage, home, str(top / "b"))
    refused = ctx("object", "which", NAME, env=env)
    by_tool = ctx("tool", "tsh.config", env=env)
    no_traceback(refused, by_tool)
    for answer in (refused, by_tool):
        assert answer.rc == 1 and answer.out == "", answer
        assert answer.err.startswith(f"ctx: {code}: {rc}"), answer
        assert RC_FIX in answer.err, answer
    session = tsh(storage, env=env, script=f"which {NAME}\ntools\nwhich {NAME}\n")
    no_traceback(session)
    assert session.returncode == 0, session
    assert session.stdout.splitlines() == [f"{top}/b/{NAME}", NAME, f"{top}/b/{NAME}"], session
    warned = session.stderr.splitlines()
    assert len(warned) == 1 and warned[0].startswith(f"tsh: warning: {code}: {rc}"), session
    assert warned[0].endswith("CTX_PATH or the default used instead"), session


def test_a_tshrc_that_is_a_link_to_the_owners_file_is_followed_and_a_dangling_one_is_absent(
    storage: Path, top: Path, user: UnprivilegedUser
) -> None:
    """docs/tools.md: "``.tshrc`` may be a symbolic link (a dotfile manager's), but only to a
    regular file of the home's owner": followed, by ``ctx`` and tsh alike; a link that leads
    nowhere is no ``.tshrc`` at all (``$CTX_PATH`` applies, nothing said)."""
    put_tool(top / "a", "A")
    put_tool(top / "b", "B")
    home = top / "home"
    home.mkdir()
    os.chown(home, user.uid, user.gid)
    dotfiles = top / "dotfiles"
    dotfiles.mkdir()
    (dotfiles / "tshrc").write_text(f"CTX_PATH={top}/a\n")
    os.chown(dotfiles / "tshrc", user.uid, user.gid)
    (home / ".tshrc").symlink_to(dotfiles / "tshrc")
    env = person(storage, home, str(top / "b"))
    assert lookup(storage, env) == f"{top}/a/{NAME}"
    (home / ".tshrc").unlink()
    (home / ".tshrc").symlink_to(top / "nothing-here")
    assert lookup(storage, env) == f"{top}/b/{NAME}"
    assert ctx("object", "which", NAME, env=env).err == ""


@pytest.mark.parametrize("kind", ["loop", "unreadable"])
def test_ctx_refuses_a_tshrc_it_cannot_open_with_its_errno(
    searchable_storage: Path, top: Path, kind: str, user: UnprivilegedUser
) -> None:
    """T-4: a ``.tshrc`` that is a link to itself (ELOOP) or that its owner cannot read (mode
    000: EACCES) cannot be used: ``ctx object which`` and ``ctx tool`` exit 1 with that errno
    and the file's path, no traceback."""
    storage = searchable_storage
    home, rc = tshrc_that_cannot_be_opened(top, kind, user)
    env = person(storage, home, str(top / "b"))
    code = "ELOOP" if kind == "loop" else "EACCES"
    for args in (("object", "which", NAME), ("tool", "tsh.config")):
        refused = ctx(*args, env=env, user=user, cwd=top)
        no_traceback(refused)
        assert refused.rc == 1 and refused.err.startswith(f"ctx: {code}: {rc}"), refused


@pytest.mark.parametrize("kind", ["loop", "unreadable"])
def test_a_persons_tsh_warns_once_about_a_tshrc_it_cannot_open_and_goes_on(
    searchable_storage: Path, top: Path, kind: str, user: UnprivilegedUser
) -> None:
    """T-4, docs/tools.md: a ``.tshrc`` that cannot be used makes a standalone tsh warn once
    and take ``$CTX_PATH`` ("A shell still starts with an unusable rc file, as sh does").  A
    link loop (ELOOP) and a file its owner cannot read (EACCES) are such files: tsh must answer
    ``which`` from ``$CTX_PATH``, with one warning naming the errno, not a traceback."""
    storage = searchable_storage
    home, rc = tshrc_that_cannot_be_opened(top, kind, user)
    env = person(storage, home, str(top / "b"))
    session = tsh(storage, env=env, script=f"which {NAME}\nwhich {NAME}\n", user=user, cwd=top)
    no_traceback(session)
    assert session.returncode == 0, session
    assert session.stdout.splitlines() == [f"{top}/b/{NAME}"] * 2, session
    code = "ELOOP" if kind == "loop" else "EACCES"
    assert session.stderr.startswith(f"tsh: warning: {code}: {rc}"), session
    assert session.stderr.count("\n") == 1, session


def tshrc_that_cannot_be_opened(top: Path, kind: str, user: UnprivilegedUser) -> tuple[Path, Path]:
    """A home of ``user`` whose ``.tshrc`` is a link to itself or a file of mode 000, and a
    tool ``hi`` in ``top/b``; the home and the file's path."""
    put_tool(top / "b", "B")
    home = top / "home"
    home.mkdir()
    rc = home / ".tshrc"
    if kind == "loop":
        rc.symlink_to(".tshrc")
    else:
        rc.write_text(f"CTX_PATH={top}/b\n")
        os.chown(rc, user.uid, user.gid)
        rc.chmod(0)
    os.chown(home, user.uid, user.gid)
    return home, rc


def test_a_tshrc_naming_a_directory_that_is_not_utf8_finds_it_or_says_why_not(
    storage: Path, top: Path
) -> None:
    """T-4: ``CTX_PATH=`` in ``.tshrc`` is the search path.  A directory whose name is not
    UTF-8 (``bad\\xff``), found through ``$CTX_PATH`` holding those bytes, must be found
    through ``.tshrc`` holding the same bytes — or, if ``.tshrc`` is to be UTF-8 text only,
    the line must be refused or named in a warning saying so; never a path silently changed
    into another one."""
    place = top / os.fsdecode(b"bad\xff\xfe")
    put_tool(place, "ODD")
    home = top / "home"
    home.mkdir()
    through_env = ctx("object", "which", NAME, env=person(storage, home, str(place)))
    assert through_env.rc == 0, through_env
    (home / ".tshrc").write_bytes(b"CTX_PATH=" + os.fsencode(place) + b"\n")
    through_rc = ctx("object", "which", NAME, env=person(storage, home))
    no_traceback(through_rc)
    said = "UTF-8" in through_rc.err or "utf-8" in through_rc.err
    assert (through_rc.rc, through_rc.out) == (0, through_env.out) or said, through_rc


# ------------------------------------------------------------------------ tsh at a terminal


def test_a_persons_tsh_at_a_terminal_shows_the_tshrc_warning_escaped_once_and_finds_the_tool(
    storage: Path, top: Path
) -> None:
    """H-2, T-4: a person's tsh on a pseudo-terminal prompts, takes ``CTX_PATH`` from
    ``.tshrc`` (over ``$CTX_PATH``), says the one line that is not ``KEY=VALUE`` once —
    escaped, its retitle sequence never sent raw to the terminal — and answers ``which`` as
    ``ctx object which`` does; ``exit 3`` leaves with status 3."""
    put_tool(top / "a", "A")
    put_tool(top / "b", "B")
    home = top / "home"
    home.mkdir()
    (home / ".tshrc").write_bytes(
        b"CTX_PATH=" + os.fsencode(top / "a") + b"\r\nbad \x1b]0;owned\x07 $(id)\n"
    )
    env = person(storage, home, str(top / "b"))
    expected = ctx("object", "which", NAME, env=env)
    assert expected.out == f"{top}/a/{NAME}\n", expected
    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.execve(storage / "bin" / "tsh", [str(storage / "bin" / "tsh")], env)
        finally:
            os._exit(127)
    seen = bytearray()

    def read_until(token: bytes, count: int = 1, seconds: float = 15) -> bool:
        deadline = time.monotonic() + seconds
        while seen.count(token) < count and time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                seen.extend(chunk)
        return seen.count(token) >= count

    try:
        assert read_until(b"$ "), bytes(seen)
        for _ in range(2):
            prompts = seen.count(b"$ ")
            os.write(fd, f"which {NAME}\r".encode())
            assert read_until(b"$ ", prompts + 1), bytes(seen)
        os.write(fd, b"exit 3\r")
        read_until(b"\0", seconds=5)  # the rest, up to the end of the terminal
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 3, bytes(seen)
    text = seen.decode("utf-8", "replace").replace("\r\n", "\n")
    assert text.count(f"\n{top}/a/{NAME}\n") == 2, text
    assert text.count(".tshrc:2: ignored, not KEY=VALUE") == 1, text
    assert "\\x1b]0;owned\\x07" in text and "\x1b]0;owned" not in text, text
    assert not RAW_CONTROL.search(text.replace("\x08", "")), repr(text)
    assert "Traceback" not in text, text


# --------------------------------------------------------------------------------- agents


def test_an_agents_lookup_ignores_the_callers_ctx_path_and_every_tshrc(
    searchable_storage: Path, top: Path
) -> None:
    """T-4: "Inside an agent terminal the runtime-injected ``CTX_PATH`` … is authoritative";
    docs/tools.md: tsh run as an agent's tool "takes the runner's ``CTX_PATH`` and never a
    ``.tshrc``".  With the caller's ``CTX_PATH`` (empty entries, bytes that are not UTF-8, a
    planted ``demo.hi`` first) and a ``.tshrc`` in the caller's and in the agent's home naming
    the planted one, ``ctx run --agent`` runs the system tier's ``demo.hi``, ``ctx agent
    show`` prints the derived path, and ``tsh which`` run as the agent's tool names the view's
    path.  Without any of them, the person's ``ctx object which`` and tsh name the file the
    agent ran."""
    storage = searchable_storage
    env = clean_env(CTX_STORAGE=str(storage))
    manifest = tool_manifest(top / "manifests", "demo.hi", '#!/bin/sh\necho SYSTEM "$@"\n')
    assert ctx("object", "install", manifest, "--tier", "system", env=env).rc == 0
    request = json.dumps({"name": "coder", "label": "coder_t", "tools": ["demo.hi", "tsh"]})
    made = ctx_run("agent", "create", "-", "--json", input=request, env=env)
    assert made.rc == 0, made
    uid = made.json()["identity"]["uid"]
    for tool in ("demo.hi", "tsh"):
        with (storage / "tool" / f"{tool}.d" / "policy").open("a") as rules:
            rules.write(f"allow coder_t tool:{tool} execute\n")
    marker = top / "planted-ran"
    planted = top / "planted"
    planted.mkdir(mode=0o755)
    (planted / "demo.hi").write_text(f"#!/bin/sh\ntouch {marker}\necho PLANTED\n")
    (planted / "demo.hi").chmod(0o755)
    caller_home = top / "home"
    caller_home.mkdir()
    agent_home = storage / "home" / str(uid)
    agent_home.mkdir(parents=True, exist_ok=True)
    for home in (caller_home, agent_home):
        (home / ".tshrc").write_text(f"CTX_PATH={planted}\n")
    odd = os.fsdecode(b"/bad\xff:")
    hostile = person(storage, caller_home, f"::{planted}:{odd}:.:{planted}")
    ran = ctx("run", "--agent", "coder", "demo.hi", "x", env=hostile)
    no_traceback(ran)
    assert (ran.rc, ran.out) == (0, "SYSTEM x\n"), ran
    shown = ctx("agent", "show", "coder", "--json", env=hostile)
    assert shown.rc == 0 and shown.json()["ctx_path"] == f"/ctx/tool:/ctx/home/{uid}/tool", shown
    as_tool = ctx("run", "--agent", "coder", "tsh", "which", "demo.hi", env=hostile)
    assert (as_tool.rc, as_tool.out) == (0, "/ctx/tool/demo.hi\n"), as_tool
    assert ctx("object", "which", "demo.hi", env=hostile).out == f"{planted}/demo.hi\n"
    (caller_home / ".tshrc").unlink()
    plain = person(storage, caller_home)
    found = ctx("object", "which", "demo.hi", env=plain)
    assert (found.rc, found.out) == (0, f"{storage}/tool/demo.hi\n"), found
    by_tsh = tsh(storage, "which", "demo.hi", env=plain)
    assert by_tsh.stdout == found.out, by_tsh
    assert not marker.exists()


@needs_terminal
def test_in_the_agent_terminal_a_planted_tshrc_changes_no_lookup(_template: Path) -> None:
    """T-4, H-1: in the agent's terminal tsh takes the ``CTX_PATH`` ctxterm gave it and never
    reads a ``.tshrc``: one the agent could write in its home (``/ctx/home/<uid>``) or its
    workspace (its ``HOME``), naming a directory of the workspace with its own ``demo.hi`` and
    ``evil.only``, changes neither ``which``, ``tools`` nor the tool a call runs."""
    program = '#!/bin/sh\necho "SYSTEM $*"\n'
    with coder_host(_template, SCRATCH, ["demo.hi"], {}) as host:
        host.install("demo.hi", program)
        host.grant_in_tool("demo.hi")
        planted = host.ws / "bin"
        planted.mkdir()
        for name in ("demo.hi", "evil.only"):
            (planted / name).write_text("#!/bin/sh\necho PLANTED\n")
            (planted / name).chmod(0o755)
        agent_home = host.storage / "home" / str(host.uid)
        agent_home.mkdir(parents=True, exist_ok=True)
        for home in (host.ws, agent_home):
            (home / ".tshrc").write_text("CTX_PATH=/workspace/bin:/workspace\n")
        term = host.start()
        typist = Raw(term.listening_at, b"attach\n")
        try:
            assert typist.shows(AGENT_PROMPT), typist.text()
            assert typist.answer("which demo.hi") == "/ctx/tool/demo.hi\n"
            assert "evil.only" not in typist.answer("tools")
            assert typist.answer("which evil.only") == "tsh: evil.only: not on CTX_PATH\n"
            assert typist.answer("demo.hi now") == "SYSTEM now\n"
            assert ".tshrc" not in typist.text(), typist.text()
        finally:
            typist.close()
