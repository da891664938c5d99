"""tsh, ``tool/tsh.d/config`` and ``ctx tool`` (SPEC §7 H-1..H-5, T-4) under attack from two
sides: an agent (or the model driving it) typing into its live terminal, and a person running
``bin/tsh`` or ``ctx tool`` by hand.  Lines full of shell syntax, host program names and paths,
globbing, quoting tricks, backslash-newline, NUL and escape bytes, look-alike names and lines of
megabytes must run nothing but a tool found on ``CTX_PATH``, with its words kept literally; a
person's tsh must never start a tool as an agent, whatever agent environment, run socket or
capability descriptor it is handed; ``ctx tool`` must refuse every name that is not the core
``tsh.config``, reached through hard links, case changes or trailing dots; a hostile or broken
config (control bytes, duplicate and unknown keys, numbers past any bound, a link, a FIFO, a
sparse file of gigabytes) must be read as data, fail safe and be reported; concurrent updates
must leave a whole file; thousands of tool names must leave tsh's context and cache bounded with
pinned tools in place; and ``exit`` typed to a tool or to a nested tsh must return to tsh."""

from __future__ import annotations

import array
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    clean_env,
    ctx_run,
    scratch_top,
    tool_manifest,
    wait_for,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, CoderHost, Raw, Term, coder_host
from tests.support.storage import copy_of_root

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents and tools as other uids")
needs_terminal = pytest.mark.skipif(
    shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs bubblewrap and /dev/fuse",
)

SCRATCH = scratch_top(__file__)
CONFIG_TEXT = (
    "# tsh configuration (SPEC H-4): data, never code.\n"
    "max_loaded_tools=64\ncache_capacity=32\nwindow_percent=1\n"
)
# A C0 control other than the line feed, DEL or a C1 control: the start of an escape sequence.
RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")
# Shows each argument between brackets, so that the words a tool got can be read back.
ECHO = '#!/bin/sh\necho "argc=$#"\nfor w in "$@"; do printf "[%s]\\n" "$w"; done\n'
HUGE = "9" * 5000  # past the 4300 digits Python turns into an int by default


# ----------------------------------------------------------------------------------- helpers


def person(storage: Path, home: Path, **extra: str) -> dict[str, str]:
    """A host user's environment for ``storage``: no agent context, ``home`` as CTX_HOME."""
    home.mkdir(parents=True, exist_ok=True)
    return clean_env(CTX_STORAGE=str(storage), CTX_HOME=str(home), **extra)


def run_tsh(
    storage: Path,
    *args: str,
    env: dict[str, str],
    script: str | bytes = b"",
    cwd: Path | None = None,
    timeout: float = 20,
    **popen,
) -> subprocess.CompletedProcess:
    """``bin/tsh ARGS`` of ``storage`` with ``script`` on its stdin; output decoded as the
    bytes it was (surrogate escapes for what is not UTF-8)."""
    data = script.encode() if isinstance(script, str) else script
    done = subprocess.run(
        [storage / "bin" / "tsh", *args], input=data, capture_output=True, env=env, cwd=cwd,
        timeout=timeout, **popen,
    )  # fmt: skip
    done.stdout = done.stdout.decode("utf-8", "surrogateescape")
    done.stderr = done.stderr.decode("utf-8", "surrogateescape")
    return done


def install(storage: Path, name: str, program: str, description: str | None = None) -> Path:
    """Tool ``name`` installed in the system tier with ``ctx object install``."""
    manifest = tool_manifest(storage.parent / "manifests", name, program, description=description)
    r = ctx_run("object", "install", manifest, "--tier", "system",
                env=clean_env(CTX_STORAGE=str(storage)))  # fmt: skip
    assert r.rc == 0, r
    return storage / "tool" / name


def config_of(storage: Path) -> Path:
    return storage / "tool" / "tsh.d" / "config"


def settings_shown(out: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


# ------------------------------------------------------------------ H-1: nothing but a tool runs


def test_host_programs_paths_and_shell_syntax_typed_to_a_persons_tsh_run_nothing(
    storage: Path, tmp_path: Path
) -> None:
    """H-1: "tsh is not a host shell: it never runs host commands from PATH".  A host program
    on PATH and in the current directory, named bare, by path, through ``..``, by glob, behind
    quotes and backslashes, after an environment assignment or a shell keyword, inside a list,
    pipe, redirection or substitution, or spelled with look-alike letters, is never run, and
    a link to it on CTX_PATH is no tool (T-4).  Each line is refused on its own and tsh goes on
    to the next; given as argv, the refusal is status 127."""
    bindir, ctxdir = tmp_path / "hostbin", tmp_path / "ctxpath"
    bindir.mkdir()
    ctxdir.mkdir()
    marker = tmp_path / "host-ran"
    (bindir / "hostcmd").write_text(f"#!/bin/sh\ntouch {marker}\necho ran\n")
    (bindir / "hostcmd").chmod(0o755)
    (ctxdir / "hostcmd").symlink_to(bindir / "hostcmd")  # a link is no hit on CTX_PATH
    (ctxdir / "sh").symlink_to("/bin/sh")
    env = person(storage, tmp_path / "home", CTX_PATH=f"{ctxdir}:{storage}/tool")
    env["PATH"] = f"{bindir}:/usr/bin:/bin"
    env["HOME"] = str(bindir)
    lines = [
        "hostcmd", "hostcmd --version", "./hostcmd", "../hostbin/hostcmd", f"{bindir}/hostcmd",
        f"/bin/sh -c 'touch {marker}'", f"sh -c 'touch {marker}'", f"-c 'touch {marker}'",
        f"PATH={bindir} hostcmd", "env hostcmd", "exec hostcmd", ". ./hostcmd",
        "command hostcmd", "host*", "hostcm?", "[h]ostcmd", "{hostcmd,x}", "~/hostcmd",
        "\\hostcmd", "'host''cmd'", '"hostcmd"', "hostcmd;", ";hostcmd", "x;hostcmd",
        "x && hostcmd", "x || hostcmd", "x | hostcmd", "x & hostcmd", "$(hostcmd)",
        "`hostcmd`", f"x > {marker}", f"x >> {marker}", "< /etc/passwd hostcmd",
        "\uff48ostcmd", "h\u03bfstcmd", "hostcmd\u200b", "\u0455h -c id",
    ]  # fmt: skip
    r = run_tsh(storage, env=env, cwd=bindir, script="".join(f"{line}\n" for line in lines)
                + "which fs.read\n")  # fmt: skip
    assert (r.returncode, r.stdout) == (0, f"{storage}/tool/fs.read\n"), r  # it lived on
    refusals = r.stderr.splitlines()
    assert len(refusals) == len(lines), r  # one refusal per line, none swallowed or split
    assert all(line.startswith("tsh: ") and "not a tool on CTX_PATH" in line
               for line in refusals), r  # fmt: skip
    for argv in (["./hostcmd"], ["/bin/sh", "-c", f"touch {marker}"], ["-c", f"touch {marker}"]):
        one = run_tsh(storage, *argv, env=env, cwd=bindir)
        assert (one.returncode, one.stdout) == (127, ""), (argv, one)
    assert not marker.exists()


def test_an_unclosed_quote_or_a_backslash_newline_is_a_syntax_error_and_tsh_goes_on(
    storage: Path, tmp_path: Path
) -> None:
    """H-1, T-3: tsh reads one command line per line and splits it as a shell splits words,
    without expansion or continuation: an unclosed quotation and a trailing backslash are
    refused (status 2) with nothing run, the next physical line is a command line of its own
    (``touch`` there is no tool), and tsh goes on."""
    marker = tmp_path / "continued"
    env = person(storage, tmp_path / "home", CTX_PATH=str(storage / "tool"))
    script = (
        f'fs.read \'unclosed\nfs.read \\\ntouch {marker}\nwhich fs.read\nfs.stat "x\nfs.list "\\"\n'
    )
    r = run_tsh(storage, env=env, script=script)
    assert r.returncode == 2, r  # the last line's status: a syntax error
    assert r.stdout == f"{storage}/tool/fs.read\n", r
    errors = r.stderr.splitlines()
    assert len(errors) == 5, r
    assert "touch: not a tool on CTX_PATH" in errors[2], r
    assert all(line.startswith("tsh: ") for line in errors), r
    assert "EACCES" not in r.stderr, r  # no line reached a tool
    assert not marker.exists()


def test_names_on_ctx_path_that_are_no_tools_are_never_listed_found_or_followed(
    storage: Path, tmp_path: Path
) -> None:
    """T-4, H-2: in a directory on a person's CTX_PATH only an executable regular file with an
    object name is a tool: names with escapes, line breaks, spaces, look-alike letters, a
    leading dash or dot, a ``.d`` suffix, links to host programs, FIFOs and directories are
    neither listed nor found; ``describe`` of the one tool reads its controls without following
    a link to a secret, waiting on a FIFO or choking on a directory."""
    tools = tmp_path / "planted"
    tools.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET\n")
    program = "#!/bin/sh\necho ran\n"
    for name in ("good", "esc\x1b[2Jx", "nl\nx", "sp ace", "-rf", ".hidden", "x.d",
                 "\uff46s.read", "fs.re\u0430d"):  # fmt: skip
        (tools / name).write_text(program)
        (tools / name).chmod(0o755)
    (tools / "sh").symlink_to("/bin/sh")
    (tools / "dir").mkdir()
    os.mkfifo(tools / "fifo")
    (tools / "fifo").chmod(0o755)
    controls = tools / "good.d"
    controls.mkdir()
    (controls / "description").symlink_to(secret)
    os.mkfifo(controls / "schema")
    (controls / "cap").mkdir()
    env = person(storage, tmp_path / "home", CTX_PATH=str(tools))
    listed = run_tsh(storage, "tools", env=env)
    assert (listed.returncode, listed.stdout) == (0, "good\n"), listed
    script = "".join(f"which {name}\n" for name in ("sh", "dir", "fifo", "x.d", "-rf",
                                                    ".hidden", "\uff46s.read"))  # fmt: skip
    found = run_tsh(storage, env=env, script=script)
    assert (found.returncode, found.stdout) == (1, ""), found
    shown = run_tsh(storage, "describe", "good", env=env, timeout=10)
    assert shown.returncode == 0, shown
    assert json.loads(shown.stdout) == {
        "name": "good", "path": str(tools / "good"), "description": "", "schema": None,
        "cap": None,
    }, shown  # fmt: skip
    assert "TOPSECRET" not in shown.stdout + shown.stderr


def test_a_deeply_nested_cap_is_shown_as_null_and_tsh_lives_on(
    storage: Path, tmp_path: Path
) -> None:
    """H-2 (a person's tsh reads metadata), docs/spec/ctx.coreutils.md: a control that is not
    usable JSON is shown as null, "rather than failing".  A cap of 30000 nested arrays (60 KB,
    under the 64 KiB tsh reads), as a member of a space could plant beside a tool, must not end
    tsh: ``describe`` shows the tool with ``cap`` null and the next line still runs."""
    tools = tmp_path / "space-tools"
    (tools / "deep.d").mkdir(parents=True)
    (tools / "deep").write_text("#!/bin/sh\necho ran\n")
    (tools / "deep").chmod(0o755)
    (tools / "deep.d" / "description").write_text("Nested.\n")
    (tools / "deep.d" / "cap").write_text("[" * 30000 + "]" * 30000)
    env = person(storage, tmp_path / "home", CTX_PATH=str(tools))
    r = run_tsh(storage, env=env, script="describe deep\nwhich deep\n")
    assert "Traceback" not in r.stderr, r.stderr[-600:]
    assert r.returncode == 0, r
    described, _, rest = r.stdout.partition("}\n")
    assert json.loads(described + "}")["cap"] is None, r
    assert rest == f"{tools}/deep\n", r


def test_escape_sequences_in_a_tool_description_never_reach_the_terminal_raw(
    storage: Path, tmp_path: Path
) -> None:
    """H-2 ("discover tools and read metadata"), cortexfs/printable.py and ``ctx object list``:
    a description is text a manifest's author controls; an escape sequence in it (a retitle, a
    screen wipe) must be shown escaped by tsh as by ``ctx object list``, not sent raw."""
    wipe = "Harmless helper\x1b]0;owned\x07\x1b[2J\x1b[H"
    install(storage, "demo.wipe", "#!/bin/sh\necho ran\n", description=wipe + "\nMore.")
    env = person(storage, tmp_path / "home", CTX_PATH=str(storage / "tool"))
    listed = ctx_run("object", "list", env=env)
    row = next(line for line in listed.lines() if line.startswith("demo.wipe"))
    assert "\\x1b]0;owned" in row and "\x1b" not in row, row  # ctx escapes it
    r = run_tsh(storage, env=env, script="load demo.wipe\npin demo.wipe\nloaded\n")
    assert r.returncode == 0, r
    assert r.stdout.count("Harmless helper") == 3, r
    assert not RAW_CONTROL.search(r.stdout + r.stderr), repr(r.stdout)


def test_a_command_line_over_one_mebibyte_from_a_pipe_is_refused_as_at_a_terminal(
    storage: Path, tmp_path: Path
) -> None:
    """docs/tools.md ("a line ... up to 1 MiB (longer: E2BIG, status 2, nothing run)") and
    tsh_line's "a command line longer than this is refused, not held in memory": a script fed
    to tsh on a pipe holds a line of 1 MiB + 1 bytes; it is dropped with E2BIG, not looked
    up, and the next line runs."""
    env = person(storage, tmp_path / "home", CTX_PATH=str(storage / "tool"))
    line = "no.such.tool" + " a" * (512 * 1024)  # short words: quick to split
    r = run_tsh(storage, env=env, script=f"{line}\nwhich fs.read\n")
    assert r.stdout == f"{storage}/tool/fs.read\n", r.stdout[:200]
    assert "E2BIG" in r.stderr, r.stderr[:200]
    assert len(r.stderr) < 1000, "the refusal does not repeat a megabyte of line"


def test_a_long_json_argument_is_split_in_linear_time(storage: Path, tmp_path: Path) -> None:
    """docs/tools.md: "a line typed at the prompt reaches tsh whole, up to 1 MiB", so that an
    agent can pass a large input on one line (``fs.write '{"path": ..., "content": ...}'``).
    Such a line of nearly 1 MiB, one quoted word, must be split and answered (here: refused,
    as a person's tsh runs no tool) within 10 s: a split a character at a time takes over 20 s
    of CPU for it, a linear one a fraction of a second (a wide margin for a busy machine)."""
    env = person(storage, tmp_path / "home", CTX_PATH=str(storage / "tool"))
    content = "x" * (1024 * 1024 - 100)
    line = "fs.write '" + json.dumps({"path": "/tmp/big.txt", "content": content}) + "'\n"
    try:
        r = run_tsh(storage, env=env, script=line, timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail("tsh was still splitting a line of nearly 1 MiB after 10 s")
    assert r.returncode == 126 and "EACCES" in r.stderr, r


def test_exit_with_a_number_of_thousands_of_digits_leaves_cleanly(
    storage: Path, tmp_path: Path
) -> None:
    """docs (tsh's ``exit [N]``, read as a POSIX shell reads it: N modulo 256): a number of
    5000 digits typed after ``exit`` leaves with that number modulo 256 (or a usage error),
    never with a Python traceback."""
    env = person(storage, tmp_path / "home", CTX_PATH=str(storage / "tool"))
    r = run_tsh(storage, env=env, script=f"exit {HUGE}\n")
    assert "Traceback" not in r.stderr, r.stderr[-300:]
    assert r.returncode in ((10**5000 - 1) % 256, 2), r


# ----------------------------------------------------------------- H-2: a person runs no tool


def test_a_forged_agent_context_run_socket_and_capability_never_start_a_tool(
    storage: Path, tmp_path: Path
) -> None:
    """H-2: a person's tsh "cannot execute tools as an agent (it cannot forge agent
    identity)".  Handed every name of an agent's context (CTX_AGENT, CTX_SESSION, a CTX_MOUNTS
    showing ``/``, CTX_RUN_CAPABILITY naming a descriptor it really holds) and a run socket
    served by the person's own process, tsh never starts the tool itself: the tool's file does
    not run, the fake host gets only the request, the capability descriptor is never written
    to, and nothing is recorded for the agent."""
    request = json.dumps({"name": "coder", "label": "coder_t", "tools": ["demo.mark"]})
    assert ctx_run("agent", "create", "-", "--storage", storage, input=request).rc == 0
    marker = tmp_path / "tool-ran"
    install(storage, "demo.mark", f"#!/bin/sh\ntouch {marker}\necho ran\n")
    with (storage / "tool" / "demo.mark.d" / "policy").open("a") as policy:
        policy.write("allow coder_t tool:demo.mark execute\n")
    forged = {"CTX_AGENT": "coder", "CTX_SESSION": "s1", "CTX_MODE": "terminal",
              "CTX_MOUNTS": json.dumps([["/", "/", "rw"]]), "CTX_CALL": "1"}  # fmt: skip
    home = tmp_path / "home"
    tool_path = str(storage / "tool")
    as_tool = run_tsh(storage, "demo.mark", "x", env=person(storage, home, CTX_PATH=tool_path,
                                                             **forged))  # fmt: skip
    assert as_tool.returncode == 126 and "EACCES" in as_tool.stderr, as_tool

    fake = tmp_path / "fake-run.sock"
    heard: list[tuple[bytes, int]] = []
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(fake))
    server.listen(1)
    server.settimeout(15)

    def serve() -> None:
        connection, _ = server.accept()
        with connection:
            fds = array.array("i")
            data, ancillary, _, _ = connection.recvmsg(65536, socket.CMSG_SPACE(3 * fds.itemsize))
            for _, _, cmsg_data in ancillary:
                fds.frombytes(cmsg_data[: len(cmsg_data) - len(cmsg_data) % fds.itemsize])
            for fd in fds:
                os.close(fd)
            heard.append((data, len(fds)))
            connection.sendall(b'{"exit_status": 0}\n')

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    mine, given = socket.socketpair()
    try:
        env = person(storage, home, CTX_PATH=tool_path, CTX_RUN_SOCKET=str(fake),
                     CTX_RUN_CAPABILITY=str(given.fileno()), **forged)  # fmt: skip
        r = run_tsh(storage, "demo.mark", "x", env=env, pass_fds=(given.fileno(),))
        thread.join(10)
        assert r.returncode == 0, r  # what the person's own "host" answered
        assert "ran" not in r.stdout, r
        assert [(json.loads(data), n) for data, n in heard] == [
            ({"tool": "demo.mark", "argv": ["x"]}, 3)
        ], heard
        mine.setblocking(False)
        with pytest.raises(BlockingIOError):
            mine.recv(1)  # the capability was never used
    finally:
        server.close()
        mine.close()
        given.close()
    assert not marker.exists()
    assert not list(storage.glob("home/*/agent/coder/session/*/events.jsonl"))
    assert (storage / "tool" / "demo.mark.d" / "log").read_text() == ""


# ------------------------------------------------------------------------- H-3: ctx tool


def test_ctx_tool_refuses_hard_links_case_changes_and_trailing_dots_of_any_tool(
    storage: Path, _template: Path, tmp_path: Path
) -> None:
    """H-3: ``ctx tool`` runs only the safe core CLI ``tsh.config`` and "MUST refuse ordinary
    visible tools and permission-bearing core tools (fs.write, shell.exec)".  Hard links on
    CTX_PATH that put shell.exec under the name ``tsh.config`` (ahead of the real one), or
    fs.write and shell.exec under a trailing dot or other case, or even the core tsh.config
    under ``TSH.CONFIG``, are refused (EACCES, exit 1) and act on nothing; so is the
    ``tsh.config`` of another storage root.  Nothing is written, no config changes."""
    tool = storage / "tool"
    aliases = tmp_path / "aliases"
    aliases.mkdir()
    for alias, target in (("tsh.config", "shell.exec"), ("TSH.CONFIG", "tsh.config"),
                          ("fs.write.", "fs.write"), ("Shell.Exec", "shell.exec")):  # fmt: skip
        os.link(tool / target, aliases / alias)
    other = copy_of_root(_template, tmp_path / "other" / "storage")
    written, touched = tmp_path / "written.txt", tmp_path / "touched"
    env = person(storage, tmp_path / "home", CTX_PATH=f"{aliases}:{tool}")
    before = {root: config_of(root).read_bytes() for root in (storage, other)}
    attempts = [
        (env, "tsh.config", json.dumps({"cmd": f"touch {touched}"}), str(aliases / "tsh.config")),
        (env, "tsh.config", "cache_capacity=5", "not the core tool"),
        (env, "TSH.CONFIG", "cache_capacity=5", "ordinary tool"),
        (env, "fs.write.", json.dumps({"path": str(written), "content": "x"}), "fs.write."),
        (env, "Shell.Exec", json.dumps({"cmd": f"touch {touched}"}), "Shell.Exec"),
        (person(storage, tmp_path / "home", CTX_PATH=str(other / "tool")), "tsh.config",
         "cache_capacity=5", str(other / "tool" / "tsh.config")),
    ]  # fmt: skip
    for caller, name, argument, named in attempts:
        forms = [(name, argument), ("--json", name, argument)][: 2 if name == "fs.write." else 1]
        for form in forms:
            r = ctx_run("tool", *form, env=caller)
            assert r.rc == 1, r
            assert r.err.startswith("ctx: EACCES: ") and named in r.err, r
            assert "Traceback" not in r.err
    assert not written.exists() and not touched.exists()
    assert {root: config_of(root).read_bytes() for root in (storage, other)} == before


def test_ctx_tool_names_that_no_tool_can_have_are_usage_errors(
    storage: Path, tmp_path: Path
) -> None:
    """H-3 with R-3: a NAME that is a path, holds a slash or a full-width dot, or ends in
    ``.d`` names no tool: ``EINVAL``, exit 2, before anything is looked up or run."""
    env = person(storage, tmp_path / "home", CTX_PATH=str(storage / "tool"))
    before = config_of(storage).read_bytes()
    for name in (f"{storage}/tool/tsh.config", "tool/fs.write", "tsh\uff0econfig", "tsh.d"):
        r = ctx_run("tool", name, "cache_capacity=5", env=env)
        assert r.rc == 2, r
        assert r.err.startswith("ctx: EINVAL: illegal tool name"), r
    assert config_of(storage).read_bytes() == before


# ------------------------------------------------------------ H-4: tool/tsh.d/config is data


def test_a_hostile_config_is_data_every_bad_line_is_named_escaped_and_defaults_apply(
    storage: Path, tmp_path: Path
) -> None:
    """H-4: a config holding shell code, NUL and escape bytes, a key given twice, unknown and
    upper-case keys, zero, negative, hexadecimal and oversize numbers and a trailing comment
    runs nothing; tsh starts, names every bad line by its number and shows no raw control
    byte; the duplicated key takes its default (not the first, not the last value:
    5 tools stay loaded, not 2 or 3); ``tsh.config`` shows the defaults for those keys and
    refuses an update (EINVAL, exit 1) until the file is fixed, leaving it byte for byte."""
    marker = tmp_path / "config-ran"
    text = (
        "# hostile\n"
        f"$(touch {marker})\n"  # 2
        "max_loaded_tools=2\n"  # 3 (given again on 4)
        "max_loaded_tools=3\n"  # 4
        "cache_capacity=5\x00\n"  # 5
        "window_percent=\x1b[2J7\n"  # 6
        "\x1b]0;owned\x07=3\n"  # 7
        "CACHE_CAPACITY=8\n"  # 8
        "cache_capacity=0x10\n"  # 9
        "window_percent=-1\n"  # 10
        "cache_capacity=65537 # the most\n"  # 11
        f"rm -rf {tmp_path}\n"  # 12
    )
    config_of(storage).write_text(text)
    env = person(storage, tmp_path / "home", CTX_PATH=str(storage / "tool"))
    names = ["fs.read", "fs.list", "fs.stat", "fs.write", "shell.exec"]
    r = run_tsh(storage, env=env, script="".join(f"load {n}\n" for n in names) + "loaded\n")
    assert r.returncode == 0, r
    warnings = r.stderr.splitlines()
    numbers = [int(re.match(r"tsh: tsh\.d/config:(\d+): ", w).group(1)) for w in warnings]
    assert sorted(set(numbers)) == [2, 4, 5, 6, 7, 8, 9, 10, 11, 12], r.stderr
    assert all(w.endswith("(ignored; the default applies)") for w in warnings), r.stderr
    assert not RAW_CONTROL.search(r.stdout + r.stderr), repr(r.stderr)
    assert len(r.stdout.splitlines()) == 2 * len(names), r  # 5 loads, then 5 still loaded
    shown = ctx_run("tool", "tsh.config", env=env)
    defaults = {"max_loaded_tools": "64", "cache_capacity": "32", "window_percent": "1"}
    assert (shown.rc, settings_shown(shown.out)) == (0, defaults), shown
    assert not RAW_CONTROL.search(shown.err), shown
    update = ctx_run("tool", "tsh.config", "window_percent=2", env=env)
    assert update.rc == 1 and update.err.startswith("ctx: EINVAL: "), update
    assert "fixed by hand" in update.err, update
    assert config_of(storage).read_text() == text
    assert not marker.exists() and tmp_path.exists()


@pytest.mark.parametrize("kind", ["link", "fifo", "directory", "sparse"])
def test_tsh_config_refuses_a_config_it_must_not_follow_wait_on_or_read_whole(
    storage: Path, tmp_path: Path, kind: str
) -> None:
    """H-4 with docs/tools.md (a control is read without following a link, never waiting on a
    FIFO, no further than its limit): ``tsh.config`` refuses a config that is a link (ELOOP;
    the file it names is left as it was), a FIFO or a directory (EINVAL), or 5 GiB of sparse
    file (EFBIG), at once, for a read and for an update alike, and changes nothing."""
    config = config_of(storage)
    config.unlink()
    elsewhere = tmp_path / "elsewhere.cfg"
    elsewhere.write_text("max_loaded_tools=3\n")
    expected = {"link": "ELOOP", "fifo": "EINVAL", "directory": "EINVAL", "sparse": "EFBIG"}
    if kind == "link":
        config.symlink_to(elsewhere)
    elif kind == "fifo":
        os.mkfifo(config)
    elif kind == "directory":
        config.mkdir()
    else:
        with config.open("wb") as sparse:
            sparse.truncate(5 * 1024**3)
    env = person(storage, tmp_path / "home", CTX_PATH=str(storage / "tool"))
    for args in (("tsh.config",), ("tsh.config", "cache_capacity=40")):
        r = ctx_run("tool", *args, env=env, timeout=10)
        assert r.rc == 1, r
        assert r.err.startswith(f"ctx: {expected[kind]}: tsh.config: {config}"), r
    assert elsewhere.read_text() == "max_loaded_tools=3\n"
    kept = os.lstat(config)
    assert {"link": stat.S_ISLNK, "fifo": stat.S_ISFIFO, "directory": stat.S_ISDIR,
            "sparse": stat.S_ISREG}[kind](kept.st_mode)  # fmt: skip
    assert not [n for n in os.listdir(config.parent) if n.startswith(".")], "no temp left"


def test_tsh_says_when_it_cannot_use_its_config_at_all(storage: Path, tmp_path: Path) -> None:
    """H-4 and docs/spec/ctx.coreutils.md ("a malformed line is reported and its key keeps
    the default"): a config tsh may not read — a link, a FIFO, a file over its limit — is
    unusable as a whole; tsh stays safe (defaults, no hang) and must say so on stderr, as it
    says of one bad line, so that an administrator who set ``max_loaded_tools=3`` learns why
    it does not hold."""
    config = config_of(storage)
    elsewhere = tmp_path / "managed.cfg"
    elsewhere.write_text("max_loaded_tools=3\n")
    env = person(storage, tmp_path / "home", CTX_PATH=str(storage / "tool"))
    for kind in ("link", "fifo", "oversize"):
        config.unlink()
        if kind == "link":
            config.symlink_to(elsewhere)
        elif kind == "fifo":
            os.mkfifo(config)
        else:
            config.write_text("#" * 70000 + "\nmax_loaded_tools=3\n")
        r = run_tsh(storage, "which", "fs.read", env=env, timeout=10)
        assert (r.returncode, r.stdout) == (0, f"{storage}/tool/fs.read\n"), (kind, r)
        assert "config" in r.stderr, (kind, r)


def test_a_config_number_of_thousands_of_digits_is_a_bad_line_not_a_crash(
    storage: Path, tmp_path: Path
) -> None:
    """H-4: an overflowing number in the config is one more line tsh cannot use: tsh starts
    with the default and says so, and ``tsh.config`` shows the defaults with a warning."""
    config_of(storage).write_text(f"max_loaded_tools={HUGE}\n")
    env = person(storage, tmp_path / "home", CTX_PATH=str(storage / "tool"))
    r = run_tsh(storage, "which", "fs.read", env=env)
    assert "Traceback" not in r.stderr, r.stderr[-300:]
    assert (r.returncode, r.stdout) == (0, f"{storage}/tool/fs.read\n"), r
    assert "tsh.d/config:1: max_loaded_tools must be at most 65536" in r.stderr, r
    shown = ctx_run("tool", "tsh.config", env=env)
    assert shown.rc == 0 and "max_loaded_tools=64" in shown.lines(), shown


def test_an_update_to_a_number_of_thousands_of_digits_is_einval(
    storage: Path, tmp_path: Path
) -> None:
    """H-4 and docs/tools.md: an update is validated whole before anything is written; a value
    that is not a positive integer up to 65536 is EINVAL, exit 2, and not one setting changes —
    a number of 5000 digits included, given as ``key=value`` or as a JSON string."""
    env = person(storage, tmp_path / "home", CTX_PATH=str(storage / "tool"))
    before = config_of(storage).read_bytes()
    for args in (
        ("tsh.config", "window_percent=2", f"cache_capacity={HUGE}"),
        ("--json", "tsh.config", json.dumps({"set": {"cache_capacity": HUGE}})),
    ):
        r = ctx_run("tool", *args, env=env)
        assert "Traceback" not in r.err, r.err[-300:]
        assert r.rc == 2 and "EINVAL" in r.err, r
    assert config_of(storage).read_bytes() == before


def test_racing_updates_of_one_key_lose_none_and_readers_only_ever_see_a_whole_file(
    storage: Path, tmp_path: Path
) -> None:
    """H-4, docs/tools.md ("rewritten in one rename", "updates take turns ... so none is
    lost"): five administrators set ``cache_capacity`` to five values at once, two send
    invalid updates, while the file is read over and over and tsh keeps starting.  Each valid
    update reports its own change, each invalid one is EINVAL (exit 2); every read sees the
    whole file with one of the values; tsh never warns of a torn line; at the end one value
    holds, the file keeps its comment, order and mode, and no temporary file is left."""
    config = config_of(storage)
    env = person(storage, tmp_path / "home", CTX_PATH=str(storage / "tool"))
    values = list(range(40, 45))
    argvs = [["--json", "tsh.config", f"cache_capacity={v}"] for v in values]
    argvs += [["tsh.config", "cache_capacity=0"], ["tsh.config", "cache_capacity=50", "colour=1"]]
    procs = [
        subprocess.Popen([*CTX_ARGV, "tool", *argv], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        for argv in argvs
    ]  # fmt: skip
    seen: set[str] = set()
    starts: list[subprocess.CompletedProcess] = []
    reads = 0
    while any(proc.poll() is None for proc in procs) or reads < 50:
        lines = config.read_text().splitlines()
        reads += 1
        assert lines[:2] == CONFIG_TEXT.splitlines()[:2] and lines[3] == "window_percent=1", lines
        assert len(lines) == 4 and lines[2].startswith("cache_capacity="), lines
        seen.add(lines[2])
        if len(starts) < 3:
            starts.append(run_tsh(storage, "which", "fs.read", env=env))
    outcomes = [(proc.returncode, *proc.communicate()) for proc in procs]
    for value, (rc, out, err) in zip(values, outcomes, strict=False):
        assert rc == 0, (value, err)
        reply = json.loads(out)
        assert (reply["changed"], reply["config"]["cache_capacity"]) == (["cache_capacity"],
                                                                         value), reply  # fmt: skip
    for rc, _, err in outcomes[len(values) :]:
        assert rc == 2 and err.startswith(b"ctx: EINVAL: tsh.config: "), err
    assert seen <= {f"cache_capacity={v}" for v in [32, *values]}, seen
    assert all((s.returncode, s.stderr) == (0, "") for s in starts), starts
    final = config.read_text()
    assert final in {CONFIG_TEXT.replace("=32", f"={v}") for v in values}, final
    assert stat.S_IMODE(config.stat().st_mode) == 0o644
    assert sorted(n for n in os.listdir(config.parent) if n.startswith(".")) == []


def test_thousands_of_tool_names_keep_the_context_and_cache_bounded_and_pins_in_place(
    storage: Path, tmp_path: Path
) -> None:
    """H-4: "max_loaded_tools bounds unpinned tool metadata loaded into the tsh context;
    cache_capacity bounds the W-TinyLFU tool-path cache ... Pinned tools are exempt".  A tsh
    that loads 800 distinct tools of 60 KB descriptions each (48 MB if all were kept) and
    looks up 1500 distinct names that are no tool keeps 8 unpinned tools, the most recent,
    and the pinned one; its peak memory grows by far less than what it read; every name still
    resolves as CTX_PATH says."""
    tools = tmp_path / "many"
    tools.mkdir()
    program, description = tmp_path / "program", tmp_path / "description"
    program.write_text("#!/bin/sh\necho ran\n")
    program.chmod(0o755)
    description.write_text("Tool of a crowd.\n" + "x" * 60000 + "\n")
    count = 800
    names = [f"t{n:04d}" for n in range(count)]
    for name in names:
        os.link(program, tools / name)
        (tools / f"{name}.d").mkdir()
        os.link(description, tools / f"{name}.d" / "description")
    config_of(storage).write_text("max_loaded_tools=8\ncache_capacity=64\nwindow_percent=1\n")
    env = person(storage, tmp_path / "home", CTX_PATH=str(tools))
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen([storage / "bin" / "tsh"], stdin=subprocess.PIPE, stdout=stdout,
                                stderr=stderr, env=env)  # fmt: skip
    assert proc.stdin is not None

    def peak_after(lines: str, mark: str) -> int:
        proc.stdin.write(f"{lines}which {mark}\n".encode())
        proc.stdin.flush()
        assert wait_for(lambda: f"{tools}/{mark}\n" in out.read_text(), 30), err.read_text()
        status = Path(f"/proc/{proc.pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1))

    try:
        first = peak_after("pin t0000\n" + "".join(f"load {n}\n" for n in names[1:20]), "t0001")
        crowd = "".join(f"load {n}\n" for n in names[20:])
        crowd += "".join(f"which nothing{n}\n" for n in range(1500))
        last = peak_after(crowd, "t0002")
        proc.stdin.write(b"loaded\nwhich t0000\n")
        proc.stdin.close()
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    shown = out.read_text().split(f"{tools}/t0002\n", 1)[1].splitlines()
    assert shown[-1] == f"{tools}/t0000", shown[-3:]
    loaded = [line.split(":", 1)[0] + ("+" if line.endswith("(pinned)") else "")
              for line in shown[:-1]]  # fmt: skip
    assert loaded == ["t0000+", *reversed(names[-8:])], loaded
    unloaded = re.findall(r"tsh: unloaded (t\d+) ", err.read_text())
    assert "t0000" not in unloaded and len(unloaded) == count - 1 - 8, len(unloaded)
    assert last - first < 20 * 1024, (first, last)  # kB: far below the 48 MB it read


# ------------------------------------------------------- the agent's terminal (H-1, H-2, H-5)


Live = tuple[CoderHost, Raw, Term]


@pytest.fixture(scope="module")
def live(_template: Path) -> Iterator[Live]:
    """One running terminal of agent ``coder``, granted ``demo.echo`` (shows its argv),
    ``demo.cat`` (echoes its stdin) and ``tsh`` itself as a tool, with an attached client;
    the tests of this part type into it one after the other."""
    tools = ["demo.echo", "demo.cat", "tsh"]
    with coder_host(_template, SCRATCH, tools, {}) as host:
        host.install("demo.echo", ECHO)
        host.install("demo.cat", '#!/bin/sh\necho "got=$(cat)"\n')
        for tool in tools:
            host.grant_in_tool(tool)
        term = host.start()
        typist = Raw(term.listening_at, b"attach\n")
        try:
            assert typist.shows(AGENT_PROMPT), typist.text()
            yield host, typist, term
        finally:
            typist.close()


def session_of(host: CoderHost) -> str:
    return host.started[0]  # the one terminal the fixture started


def typed(typist: Raw, line: bytes, prompt: str = AGENT_PROMPT) -> bytes:
    """Type raw ``line``; the bytes the terminal showed from it up to the next ``prompt``."""
    before = len(typist.data)
    count = typist.count(prompt)
    typist.type(line)
    assert typist.shows(prompt, count + 1), typist.text()[-800:]
    return typist.data[before:].rpartition(prompt.encode())[0]


@needs_terminal
def test_in_the_agent_terminal_shell_syntax_reaches_a_tool_only_as_literal_words(
    live: Live,
) -> None:
    """H-1, T-3: typed by the agent, redirections, lists, pipes, background ``&``,
    substitutions, globs, ``~``, variables and braces are not shell: they reach the tool as
    the words typed (quotes and backslashes only group and escape), and no file appears.  A
    host command, an environment assignment, the absolute or relative path of a granted tool
    and a look-alike of its name are no tool on CTX_PATH: refused, nothing recorded."""
    host, typist, _ = live
    marker = host.top / "terminal-ran"
    line = (
        f"demo.echo x > {marker} ; touch {marker} && y || z | w & $(touch {marker}) `id` "
        "* ~ $HOME {a,b} \\; 'q w' \"$PATH\""
    )
    words = ["x", ">", str(marker), ";", "touch", str(marker), "&&", "y", "||", "z", "|", "w",
             "&", "$(touch", f"{marker})", "`id`", "*", "~", "$HOME", "{a,b}", ";", "q w",
             "$PATH"]  # fmt: skip
    shown = typist.answer(line)
    assert shown == f"argc={len(words)}\n" + "".join(f"[{w}]\n" for w in words), shown
    refused = ["PATH=/bin", "/bin/sh", "sh", "/ctx/tool/demo.echo", "../tool/demo.echo",
               "./demo.echo", "\uff44emo.echo", "demo.ech\u043e", "DEMO.ECHO",
               "demo.echo."]  # fmt: skip
    for word in refused:
        shown = typist.answer(f"{word} -c 'touch {marker}'")
        assert shown == f"tsh: {word}: not a tool on CTX_PATH (tsh runs CortexFS tools only)\n"
    calls = [e for e in host.events(session_of(host)) if e["type"] == "tool_call"]
    # the session keeps the first 20 words of a long argv (and says how many more)
    got = [e["argv"][:20] for e in calls if e["object"] == "tool/demo.echo"]
    assert got.count(words[:20]) == 1, got
    assert not [e for e in calls if "-c" in e.get("argv", [])], calls
    assert not marker.exists()


@needs_terminal
def test_exit_typed_to_a_running_tool_or_a_nested_tsh_returns_to_the_terminals_tsh(
    live: Live,
) -> None:
    """H-5 ("exit in them returns to tsh") and docs ("What is typed while a tool runs is the
    tool's input"): ``exit`` typed while a tool reads its stdin is that tool's data, tsh stays;
    ``tsh`` granted as a tool is an interactive tool of its own that runs no tool (EACCES, H-2)
    and whose ``exit 4`` returns to the terminal's tsh, the call's status 4."""
    host, typist, _ = live
    session = session_of(host)
    started = len(host.calls(session, "tool/demo.cat", "tool_call"))
    since, prompts = len(typist.data), typist.count(AGENT_PROMPT)
    typist.type("demo.cat")
    assert wait_for(lambda: len(host.calls(session, "tool/demo.cat", "tool_call")) > started, 15)
    typist.type("exit")  # the tool runs: the line is its input
    typist.send(b"\x04")  # Ctrl-D: the end of its input
    assert typist.shows(AGENT_PROMPT, prompts + 1), typist.text()[-300:]
    assert b"got=exit\r\n" in typist.data[since:], typist.data[since:]
    assert typist.answer("which demo.cat") == "/ctx/tool/demo.cat\n"  # still the same tsh

    assert typed(typist, b"tsh", "tsh$ ").endswith(b"tsh\r\n"), typist.text()[-300:]
    inner = typed(typist, b"demo.echo nested-call", "tsh$ ").decode()
    assert "tsh: demo.echo: EACCES: this tsh runs as a tool of agent coder" in inner, inner
    assert "argc=" not in inner
    typed(typist, b"exit 4")
    assert typist.answer("which demo.echo") == "/ctx/tool/demo.echo\n"
    events = host.events(session)
    nested = [e for e in events if e["object"] == "tool/tsh" and e["type"] == "tool_result"]
    assert [e["exit_status"] for e in nested][-1:] == [4], nested
    assert not [e for e in events if e.get("argv") == ["nested-call"]], events


@needs_terminal
def test_a_nul_byte_typed_in_an_argument_is_refused_as_einval(
    live: Live,
) -> None:
    """H-1, T-3 and docs/tools.md (a failure is ``<tool>: <ERRNO>: <sentence>``; no process
    can be given an argument holding a NUL, which is EINVAL wherever ctx meets one): the
    agent types ``demo.echo a<NUL>b``; the call is refused as invalid input, not reported as
    an I/O error quoting a Python exception, and the tool does not run."""
    _, typist, _ = live
    shown = typed(typist, b"demo.echo nul\x00byte").decode("utf-8", "replace")
    assert "argc=" not in shown, shown
    assert "ValueError" not in shown and "EIO" not in shown, shown
    assert "EINVAL" in shown, shown


@needs_terminal
def test_escape_bytes_typed_as_a_command_name_are_shown_escaped_in_the_refusal(
    live: Live,
) -> None:
    """H-1 and cortexfs/printable.py: a model that types an escape sequence as a command name
    (a retitle of the operator's window) gets its line echoed as ``^[`` by tsh's editor, and
    tsh's own refusal must quote the name as safely, not send the raw sequence to every
    client of the terminal."""
    _, typist, _ = live
    shown = typed(typist, b"\x1b]0;owned\x07demo.echo")
    assert b"not a tool on CTX_PATH" in shown, shown
    assert b"\x1b" not in shown and b"\x07" not in shown, shown


@needs_terminal
def test_a_persons_tsh_pointed_at_the_terminal_socket_runs_nothing_in_it(
    live: Live,
) -> None:
    """H-2 and A-2: a tsh outside the sandbox, run by root with the agent's name and the
    terminal's own ``main.sock`` given as its run socket, sends a request that is no mode
    line: nothing runs (status 126), no call is recorded, and the terminal goes on serving
    its client."""
    host, typist, term = live
    env = clean_env(CTX_STORAGE=str(host.storage), CTX_RUN_SOCKET=str(term.listening_at),
                    CTX_PATH=str(host.storage / "tool"), CTX_AGENT="coder")  # fmt: skip
    shown_before = len(typist.data)
    r = run_tsh(host.storage, "demo.echo", "forged-call", env=env)
    assert r.returncode == 126, r
    assert b"argc=" not in r.stdout.encode() + typist.data[shown_before:]
    assert typist.answer("which demo.echo") == "/ctx/tool/demo.echo\n"
    assert not [e for e in host.events(session_of(host)) if e.get("argv") == ["forged-call"]]
