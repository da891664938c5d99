"""Command lines a person or an agent really types or sends to ``tsh`` (SPEC §7 H-1..H-4, T-3,
T-4; docs/tools.md "The agent terminal", docs/spec/ctx.agent.md).

tsh is no host shell: a line is a tool name on ``CTX_PATH`` and its arguments, split as a shell
splits words, without expansions.  Here lines are written with every quoting form (single,
double, backslashes, empty words, quotes glued to words, unbalanced quotes, a trailing
backslash), as blank lines, CRLF lines, a last line without its line feed, lines holding
control characters, NUL, bytes that are not UTF-8, bidirectional overrides and other line
separators, lines of exactly and just over 1 MiB (in bytes and in characters) and lines over
the 4095 bytes a terminal's own editing keeps; with pipes, redirections, globs, ``~``,
variables and assignments, which reach a tool as literal words; with every built-in the docs
name (used rightly and wrongly) and the host shell's built-ins tsh does not have; with
``ctx tool …`` typed at the prompt; with ``exit`` in all its forms.  They are read from a pipe,
from argv, and at a pseudo-terminal (prompt, echo, erase, Ctrl-W, Ctrl-U, Ctrl-C, Ctrl-D), and,
in a live agent terminal, run tools that exist, do not exist, are not executable, or are denied
by the tool's policy.  Each refusal must be one clear line, quoted escaped, with the status the
docs give (127 not found, 126 refused, 2 usage or syntax), and nothing a policy denies runs.

Black-box: the installed ``ctx``, ``bin/tsh`` of a bootstrapped root, real processes, PTYs,
and for the agent terminal bubblewrap, FUSE views and the terminal socket."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import clean_env, ctx_run, scratch_top, wait_for
from tests.acceptance.terminalcli import AGENT_PROMPT, CoderHost, Raw, coder_host

SCRATCH = scratch_top(__file__)
PROMPT = b"tsh$ "  # a person's tsh at a terminal
MIB = 1 << 20
NOT_A_TOOL = "not a tool on CTX_PATH (tsh runs CortexFS tools only)"
# A C0 control other than the line feed, DEL or a C1 control: raw, the start of a sequence.
RAW_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f]")
# Shows each argument between brackets, so that the words a tool got can be read back.
ECHO = '#!/bin/sh\necho "argc=$#"\nfor w in "$@"; do printf "[%s]\\n" "$w"; done\n'

needs_terminal = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs root, bubblewrap and /dev/fuse",
)


# ----------------------------------------------------------------------------------- helpers


def person(storage: Path, home: Path, **extra: str) -> dict[str, str]:
    """A host user's environment: no agent context, the root's system tier as CTX_PATH."""
    home.mkdir(parents=True, exist_ok=True)
    values = {"CTX_STORAGE": str(storage), "CTX_HOME": str(home),
              "CTX_PATH": str(storage / "tool"), **extra}  # fmt: skip
    return clean_env(**values)


def tsh(
    storage: Path, *args: str, env: dict[str, str], script: bytes | str = b""
) -> tuple[int, str]:
    """``bin/tsh ARGS`` with ``script`` on its stdin: its status and its standard output and
    error on one pipe, in the order written (tsh flushes both before each line it reads)."""
    data = script.encode() if isinstance(script, str) else script
    done = subprocess.run(
        [storage / "bin" / "tsh", *args], input=data, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, env=env, timeout=30,
    )  # fmt: skip
    return done.returncode, done.stdout.decode("utf-8", "surrogateescape")


def tsh_each(storage: Path, runs: list[tuple[list[str], str]], env: dict[str, str]) -> list:
    """Several ``bin/tsh`` at once (argv, script): each one's status and output."""
    procs = [
        subprocess.Popen(
            [storage / "bin" / "tsh", *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
        )
        for argv, _ in runs
    ]
    answers = []
    for proc, (_, script) in zip(procs, runs, strict=True):
        out, _ = proc.communicate(script.encode(), timeout=30)
        answers.append((proc.returncode, out.decode("utf-8", "surrogateescape")))
    return answers


class Pty:
    """``bin/tsh`` with a pseudo-terminal as its stdin, stderr and (unless ``stdout`` is given)
    stdout, and as its controlling terminal (``setsid -c``), so Ctrl-C is a SIGINT; what the
    terminal shows is collected in a thread."""

    def __init__(self, storage: Path, env: dict[str, str], stdout=None) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            ["setsid", "-c", storage / "bin" / "tsh"], stdin=slave,
            stdout=stdout if stdout is not None else slave, stderr=slave, env=env,
        )  # fmt: skip
        os.close(slave)
        self.data = b""
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    def _pump(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # EIO: the other side is gone
                return
            if not chunk:
                return
            self.data += chunk

    def shows(self, text: bytes, count: int = 1, seconds: float = 15) -> bool:
        return wait_for(lambda: self.data.count(text) >= count, seconds)

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def line(self, data: bytes) -> bytes:
        """Type ``data`` and a carriage return at the prompt; what it showed up to the next."""
        prompts = self.data.count(PROMPT)
        before = len(self.data)
        os.write(self.master, data + b"\r")
        assert self.shows(PROMPT, prompts + 1), self.data[-300:]
        return self.data[before:].rpartition(PROMPT)[0]

    def wait(self, seconds: float = 15) -> int:
        return self.proc.wait(seconds)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        with contextlib.suppress(OSError):
            os.close(self.master)
        self.reader.join(timeout=5)


@contextlib.contextmanager
def at_a_terminal(storage: Path, env: dict[str, str], stdout=None) -> Iterator[Pty]:
    term = Pty(storage, env, stdout)
    try:
        if stdout is None:  # tsh waits for its first line: what is typed now, it edits
            assert term.shows(PROMPT), term.data
        yield term
    finally:
        term.close()


# ------------------------------------------------------------- quoting, read from a pipe


def test_every_quoting_form_gives_the_words_a_shell_would_and_nothing_is_expanded(
    storage: Path, tmp_path: Path
) -> None:
    """H-1, docs ("split as a shell splits words, without expansions"): single and double
    quotes, backslashes, quotes glued to a word and quoted built-in names give the words a
    POSIX shell gives; a backslash in double quotes escapes only ``"`` and itself; a quoted
    blank is part of a word; ``$VAR``, ``~`` and globs stay literal.  Each line answers in
    order, refusals on one line each naming the word as it was split."""
    tool = str(storage / "tool")
    env = person(storage, tmp_path / "home", TOOL="fs.read")
    lines = [
        "which 'fs.read'",  # quotes around a whole word
        'which "fs.list"',
        "which fs\\.stat",  # a backslash before an ordinary character
        "which fs.'wr'\"ite\"",  # quotes glued inside a word
        "'which' fs.read",  # a quoted built-in is the built-in
        '"wh"ich fs.list',
        "\\which fs.stat",
        "which 'fs.read fs.list'",  # one word holding a blank
        "which fs.read\\ ",  # an escaped trailing blank is part of the word
        'which "\\f\\s.read"',  # in double quotes the backslash stays
        "which $TOOL ~ fs.* fs.rea? [f]s.read {fs.read,x}",
    ]
    rc, out = tsh(storage, env=env, script="".join(f"{line}\n" for line in lines))
    assert rc == 1, out  # the last line's status: some names were not found
    assert out.splitlines() == [
        f"{tool}/fs.read",
        f"{tool}/fs.list",
        f"{tool}/fs.stat",
        f"{tool}/fs.write",
        f"{tool}/fs.read",
        f"{tool}/fs.list",
        f"{tool}/fs.stat",
        "tsh: fs.read fs.list: not on CTX_PATH",
        "tsh: fs.read : not on CTX_PATH",
        "tsh: \\f\\s.read: not on CTX_PATH",
        "tsh: $TOOL: not on CTX_PATH",
        "tsh: ~: not on CTX_PATH",
        "tsh: fs.*: not on CTX_PATH",
        "tsh: fs.rea?: not on CTX_PATH",
        "tsh: [f]s.read: not on CTX_PATH",
        "tsh: {fs.read,x}: not on CTX_PATH",
    ], out


def test_pipes_redirections_lists_and_assignments_are_literal_words_and_create_nothing(
    storage: Path, tmp_path: Path
) -> None:
    """H-1, docs/spec/ctx.agent.md ("tsh runs tools only: NAME ARG..."): the docs name no
    pipe, redirection, list or assignment, so ``|``, ``>``, ``>>``, ``<``, ``;``, ``&&``,
    ``2>&1`` and ``NAME=VALUE`` are words like any other: ``which`` looks each up, no file is
    created or read, and an assignment in front of a name is the (missing) tool's name."""
    tool = str(storage / "tool")
    out_file = tmp_path / "out.txt"
    env = person(storage, tmp_path / "home")
    script = (
        f"which fs.read | which fs.list > {out_file} 2>&1\n"
        f"which fs.stat;which fs.write && which >> {out_file}\n"
        "TOOL=fs.read which fs.read\n"
    )
    rc, out = tsh(
        storage,
        env=env,
        script=script,
    )
    assert rc == 127, out
    # within one line, what ``which`` finds and what it does not may interleave either way
    assert sorted(out.splitlines()) == sorted([
        f"{tool}/fs.read",
        "tsh: |: not on CTX_PATH",
        "tsh: which: not on CTX_PATH",
        f"{tool}/fs.list",
        "tsh: >: not on CTX_PATH",
        f"tsh: {out_file}: not on CTX_PATH",
        "tsh: 2>&1: not on CTX_PATH",
        "tsh: fs.stat;which: not on CTX_PATH",
        f"{tool}/fs.write",
        "tsh: &&: not on CTX_PATH",
        "tsh: which: not on CTX_PATH",
        "tsh: >>: not on CTX_PATH",
        f"tsh: {out_file}: not on CTX_PATH",
        f"tsh: TOOL=fs.read: {NOT_A_TOOL}",
    ]), out  # fmt: skip
    assert out.splitlines()[-1] == f"tsh: TOOL=fs.read: {NOT_A_TOOL}", out
    assert not out_file.exists()


def test_unbalanced_quotes_are_a_syntax_error_of_status_2_and_argv_is_never_resplit(
    storage: Path, tmp_path: Path
) -> None:
    """H-1, T-3: a line with an open single or double quote, or ending in a backslash (also
    inside double quotes), is refused with status 2, nothing looked up, and the next line is
    read as a line of its own.  Given as argv (``tsh which '"fs.read'``) the words are kept as
    they are: the quote is part of the name, which is simply not found (1)."""
    env = person(storage, tmp_path / "home")
    broken = ["which 'fs.read", 'which "fs.read', "which fs.read\\", 'which "fs.read\\',
              "which it'\"s"]  # fmt: skip
    for line in broken:
        rc, out = tsh(storage, env=env, script=f"{line}\n")
        assert rc == 2, (line, out)
        assert out.count("\n") == 1 and out.startswith("tsh: "), (line, out)
        assert re.search(r"(?i)quotation|escaped", out) and "not on CTX_PATH" not in out, out
    rc, out = tsh(storage, env=env, script=f"{broken[0]}\nwhich fs.read\n")
    assert (rc, out.splitlines()[1:]) == (0, [f"{storage}/tool/fs.read"]), out
    rc, out = tsh(storage, "which", '"fs.read', "it's", env=env)
    assert rc == 1, out
    assert out.splitlines() == ['tsh: "fs.read: not on CTX_PATH', "tsh: it's: not on CTX_PATH"]


def test_blank_lines_keep_the_last_status_crlf_is_read_and_a_last_line_needs_no_line_feed(
    storage: Path, tmp_path: Path
) -> None:
    """docs ("Exit status: the tool's (for lines read, the last one's)"): empty lines and
    lines of blanks (spaces, tabs, a carriage return) run nothing and change no status, as in
    a shell; a script written with CRLF line ends runs as with LF; the last line of a script
    without its line feed still runs; an empty script leaves with 0."""
    tool = str(storage / "tool")
    env = person(storage, tmp_path / "home")
    answers = tsh_each(storage, [
        ([], "no.such\n\n   \n\t\r\n\nexit\n"),
        ([], "which fs.read\r\nwhich fs.list\r\n"),
        ([], "no.such\nwhich fs.stat"),
        ([], ""),
        ([], "\n\n\n"),
    ], env)  # fmt: skip
    assert answers[0] == (127, f"tsh: no.such: {NOT_A_TOOL}\n"), answers[0]
    assert answers[1] == (0, f"{tool}/fs.read\n{tool}/fs.list\n"), answers[1]
    assert answers[2] == (0, f"tsh: no.such: {NOT_A_TOOL}\n{tool}/fs.stat\n"), answers[2]
    assert answers[3] == (0, "") and answers[4] == (0, ""), answers[3:]


def test_only_a_line_feed_ends_a_line_other_separators_are_part_of_a_word(
    storage: Path, tmp_path: Path
) -> None:
    """T-3, docs ("tsh reads a command a line"): a carriage return alone is a blank between
    words, not the end of a line; a form feed, a vertical tab, NEL (U+0085) and the line
    separator U+2028 are characters of a word, shown escaped in the refusal: a ``exit 3``
    after one of them is an argument, never a second command."""
    tool = str(storage / "tool")
    env = person(storage, tmp_path / "home")
    separators = ["\r", "\f", "\v", "\x85", "\u2028"]
    answers = tsh_each(storage, [([], f"which fs.read{sep}exit 3\n") for sep in separators], env)
    rc, out = answers[0]
    assert rc == 1 and sorted(out.splitlines()) == [
        f"{tool}/fs.read",
        "tsh: 3: not on CTX_PATH",
        "tsh: exit: not on CTX_PATH",
    ], answers[0]
    for sep, (rc, out) in zip(separators[1:], answers[1:], strict=True):
        shown = repr(sep)[1:-1]  # \x0c, \x0b, \x85, \u2028
        assert rc == 1, (sep, out)
        assert out == f"tsh: fs.read{shown}exit: not on CTX_PATH\ntsh: 3: not on CTX_PATH\n", out


# ------------------------------------------------- control characters, NUL, unicode, bytes


def test_control_characters_nul_and_bidi_overrides_are_refused_escaped_and_tsh_goes_on(
    storage: Path, tmp_path: Path
) -> None:
    """H-1 and docs ("a name that was typed ... is shown escaped (\\x1b), never raw"): names
    holding NUL, an escape sequence, BEL, DEL, a C1 control or a right-to-left override are
    no tool (127) and are quoted escaped; letters of other scripts are shown as they are; a
    NUL inside an argument of a built-in is refused the same way; tsh reads on."""
    env = person(storage, tmp_path / "home")
    names = ["fs.read\x00x", "\x1b[2J\x1b]0;owned\x07fs.read", "fs\x7f.read", "fs\x9b.read",
             "\u202edaer.sf", "fs.réad"]  # fmt: skip
    script = "".join(f"{name}\n" for name in names) + "which fs.read\x00 fs.read\n"
    rc, out = tsh(storage, env=env, script=script)
    assert rc == 1, out
    assert not RAW_CONTROL.search(out), repr(out)
    assert "\u202e" not in out, repr(out)
    assert out.splitlines() == [
        f"tsh: fs.read\\x00x: {NOT_A_TOOL}",
        f"tsh: \\x1b[2J\\x1b]0;owned\\x07fs.read: {NOT_A_TOOL}",
        f"tsh: fs\\x7f.read: {NOT_A_TOOL}",
        f"tsh: fs\\x9b.read: {NOT_A_TOOL}",
        f"tsh: \\u202edaer.sf: {NOT_A_TOOL}",
        f"tsh: fs.réad: {NOT_A_TOOL}",
        "tsh: fs.read\\x00: not on CTX_PATH",
        f"{storage}/tool/fs.read",
    ], out


def test_bytes_that_are_not_utf8_in_a_line_or_in_argv_are_refused_never_a_traceback(
    storage: Path, tmp_path: Path
) -> None:
    """H-1, docs (escaped "a byte of a name that is not UTF-8", ``\\udcfe``): a line of bytes
    that are not UTF-8, read from a pipe under a UTF-8 and under the C locale, and the same
    bytes given as argv, are no tool and are quoted escaped, with no Python error."""
    script = b"\xff\xfe\nwhich caf\xe9 fs.read\n"
    for locale in ("C.UTF-8", "C"):
        env = person(storage, tmp_path / "home", LC_ALL=locale)
        rc, out = tsh(storage, env=env, script=script)
        assert "Traceback" not in out and "Error" not in out, out
        assert rc == 1, (locale, out)
        assert out.splitlines() == [
            f"tsh: \\udcff\\udcfe: {NOT_A_TOOL}",
            "tsh: caf\\udce9: not on CTX_PATH",
            f"{storage}/tool/fs.read",
        ], (locale, out)
    env = person(storage, tmp_path / "home")
    done = subprocess.run([storage / "bin" / "tsh", b"\xff"], capture_output=True, env=env)
    assert done.returncode == 127, done
    assert done.stderr == f"tsh: \\udcff: {NOT_A_TOOL}\n".encode(), done


# -------------------------------------------------------------------- line length, a pipe


def test_a_line_just_under_one_mebibyte_from_a_pipe_runs_and_one_without_line_feed_too(
    storage: Path, tmp_path: Path
) -> None:
    """docs ("a line ... up to 1 MiB"): a ``which`` line padded with blanks to 1 MiB less
    one byte (with its line feed), or to exactly 1 MiB as the last line without one, runs."""
    env = person(storage, tmp_path / "home")
    head = b"which fs.read"
    answers = [
        tsh(storage, env=env, script=head + b" " * (MIB - 1 - len(head)) + b"\n"),
        tsh(storage, env=env, script=head + b" " * (MIB - len(head))),
    ]
    for rc, out in answers:
        assert (rc, out) == (0, f"{storage}/tool/fs.read\n"), out[:300]


def test_a_line_of_exactly_one_mebibyte_and_its_line_feed_from_a_pipe_runs(
    storage: Path, tmp_path: Path
) -> None:
    """docs ("a line typed at the prompt reaches tsh whole, up to 1 MiB (longer: E2BIG ...;
    so is a longer line read from a pipe"), and tsh's own refusal ("a command line holds at
    most 1048576 bytes"): a line of exactly 1048576 bytes, followed by its line feed, is
    within the bound, as it is without the line feed and as at a terminal, where the line
    break ends the line and is not part of it."""
    env = person(storage, tmp_path / "home")
    head = b"which fs.read"
    rc, out = tsh(storage, env=env, script=head + b" " * (MIB - len(head)) + b"\n")
    assert (rc, out) == (0, f"{storage}/tool/fs.read\n"), out[:300]


def test_a_line_over_one_mebibyte_of_multibyte_characters_from_a_pipe_is_e2big(
    storage: Path, tmp_path: Path
) -> None:
    """docs ("up to 1 MiB (longer: E2BIG, status 2, nothing run; so is a longer line read
    from a pipe ...)") and tsh's refusal ("at most 1048576 bytes"): a line of 1.5 MiB made
    of 786432 two-byte characters is longer than 1 MiB and must be dropped with E2BIG,
    nothing looked up, exactly as a line of as many bytes of ASCII is."""
    env = person(storage, tmp_path / "home")
    line = "which fs.read " + "é" * (3 * MIB // 4)
    assert len(line.encode()) > MIB + MIB // 2 and len(line) < MIB
    rc, out = tsh(storage, env=env, script=line + "\nexit\n")
    assert "E2BIG" in out[:300], out[:300]
    assert rc == 2 and f"{storage}/tool/fs.read" not in out, out[:300]


# ---------------------------------------------------------------- built-ins, exit statuses


def test_each_built_in_used_rightly_and_wrongly_answers_with_the_documented_status(
    storage: Path, tmp_path: Path
) -> None:
    """docs/spec/ctx.agent.md ("a built-in used wrongly (which without a name, tools with one)
    is a usage error, exit 2"), docs/tools.md (``which`` and the context's built-ins need
    names; ``help``, ``tools``, ``loaded`` and ``rehash`` take none): every built-in, given
    as argv, answers with its status and one line naming its form; the context's built-ins on
    a name that is no tool, or not loaded, or not pinned, are 1."""
    env = person(storage, tmp_path / "home")
    cases = [
        (["help"], 0, "tsh runs CortexFS tools"),
        (["help", "exit"], 2, "tsh: help: takes no arguments (help)"),
        (["tools", "fs"], 2, "tsh: tools: takes no arguments (tools)"),
        (["loaded", "-a"], 2, "tsh: loaded: takes no arguments (loaded)"),
        (["rehash", "fs.read"], 2, "tsh: rehash: takes no arguments (rehash)"),
        (["rehash"], 0, ""),
        (["loaded"], 0, ""),
        (["which"], 2, "tsh: which: a tool name is needed (which NAME...)"),
        (["load"], 2, "tsh: load: a tool name is needed (load NAME...)"),
        (["describe"], 2, "tsh: describe: a tool name is needed (describe NAME...)"),
        (["pin"], 2, "tsh: pin: a tool name is needed (pin NAME...)"),
        (["unpin"], 2, "tsh: unpin: a tool name is needed (unpin NAME...)"),
        (["unload"], 2, "tsh: unload: a tool name is needed (unload NAME...)"),
        (["load", "no.such"], 1, f"tsh: load: no.such: {NOT_A_TOOL.split(' (')[0]}"),
        (["unload", "fs.read"], 1, "tsh: unload: fs.read: not loaded"),
        (["unpin", "fs.read"], 1, "tsh: unpin: fs.read: not pinned"),
        (["which", "fs.read", "no.such"], 1, "tsh: no.such: not on CTX_PATH"),
        (["which", "/ctx/tool/fs.read", "..", ""], 1, "tsh: ..: not on CTX_PATH"),
    ]
    answers = tsh_each(storage, [(argv, "") for argv, _, _ in cases], env)
    for (argv, status, said), (rc, out) in zip(cases, answers, strict=True):
        assert rc == status, (argv, rc, out)
        assert said in out, (argv, out)
        assert "Traceback" not in out, (argv, out)
    rc, out = tsh(storage, env=env, script="pin fs.read\nunload fs.read\nloaded\n")
    assert rc == 0 and "tsh: unload: fs.read: pinned; 'unpin fs.read' first" in out, out


def test_host_shell_built_ins_and_ctx_itself_are_no_tools_at_the_prompt(
    storage: Path, tmp_path: Path
) -> None:
    """H-1, H-3: the built-ins of a host shell that tsh does not name (``cd``, ``echo``,
    ``export``, ``source``, ``.``, ``set``, ``alias``, ``type``, ``history``, ``jobs``, ``fg``,
    ``true``, ``:``) and ``ctx tool tsh.config`` typed at tsh's prompt are each refused as no
    tool, status 127, naming the first word; ``tsh.config`` itself, found on CTX_PATH, is
    refused by a person's tsh with EACCES (126) and the advice to use ``ctx tool``, which
    then shows the settings."""
    env = person(storage, tmp_path / "home")
    words = ["cd /", "echo hi", "export A=1", "source x", ". x", "set -e", "alias l=ls",
             "type fs.read", "history", "jobs", "fg", "true", ":",
             "ctx tool tsh.config"]  # fmt: skip
    rc, out = tsh(storage, env=env, script="".join(f"{w}\n" for w in words))
    assert rc == 127, out
    assert out.splitlines() == [f"tsh: {w.split()[0]}: {NOT_A_TOOL}" for w in words], out
    rc, out = tsh(storage, "tsh.config", env=env)
    assert rc == 126, out
    assert out.startswith("tsh: tsh.config: EACCES: ") and "'ctx tool NAME'" in out, out
    shown = ctx_run("tool", "tsh.config", env=env)
    assert shown.rc == 0 and "max_loaded_tools=" in shown.out, shown


EXITS = [
    ("exit", 0), ("exit 0", 0), ("exit 7", 7), ("exit 300", 44), ("exit -1", 255),
    ("exit 00000000000000000256", 0), ("exit '  '", 2), ("exit 0x10", 2), ("exit +5", 2),
    ("exit \u0663", 2), ("exit 1e3", 2), ("exit -", 2), ("no.such\nexit", 127),
    ("exit 1 2\nexit", 1), ("'exit' 9", 9), ("\\exit 9", 9),
]  # fmt: skip


def test_exit_in_every_form_leaves_with_the_status_a_posix_shell_gives(
    storage: Path, tmp_path: Path
) -> None:
    """docs (``exit [N]``: "N modulo 256 however many digits it has", the last status without
    N): a number that is not ASCII decimal (hexadecimal, ``+5``, an Arabic-Indic digit, an
    exponent, blanks) leaves with 2 and says so; two numbers are an error that does not
    leave; a quoted or escaped ``exit`` is the built-in."""
    env = person(storage, tmp_path / "home")
    answers = tsh_each(storage, [([], f"{line}\nwhich fs.read\n") for line, _ in EXITS], env)
    for (line, status), (rc, out) in zip(EXITS, answers, strict=True):
        assert rc == status, (line, out)
        assert f"{storage}/tool/fs.read" not in out, out  # it left before the next line
        assert "Traceback" not in out, out
        if status == 2:
            assert "a decimal number is needed (exit [N])" in out, (line, out)


def test_exit_given_as_argv_and_a_name_as_argv_answer_like_a_line(
    storage: Path, tmp_path: Path
) -> None:
    """docs ("tsh NAME ARG... runs that one command line and exits with its status"): ``tsh
    exit 300`` leaves with 44, ``tsh exit 1 2`` with 1, ``tsh ''`` and ``tsh -x`` are no tool
    (127), and ``tsh 'which fs.read'`` is one word, not a line to split."""
    env = person(storage, tmp_path / "home")
    answers = tsh_each(storage, [(["exit", "300"], ""), (["exit", "1", "2"], ""), ([""], ""),
                                 (["-x"], ""), (["which fs.read"], "")], env)  # fmt: skip
    assert [rc for rc, _ in answers] == [44, 1, 127, 127, 127], answers
    assert answers[2][1] == f"tsh: : {NOT_A_TOOL}\n", answers[2]
    assert answers[4][1] == f"tsh: which fs.read: {NOT_A_TOOL}\n", answers[4]


# ---------------------------------------------------------------------- at a terminal (pty)


def test_at_a_terminal_the_prompt_shows_and_from_a_pipe_it_never_does(
    storage: Path, tmp_path: Path
) -> None:
    """docs ("prompting only when stdin is a terminal (a piped script gets the output
    alone)"): at a pseudo-terminal tsh shows ``tsh$ `` before each line and echoes what is
    typed; the same line piped in answers with the output alone; Ctrl-D on an empty line ends
    tsh with the last status."""
    env = person(storage, tmp_path / "home")
    rc, out = tsh(storage, env=env, script="which fs.read\nno.such\n")
    assert "tsh$" not in out and rc == 127, out
    with at_a_terminal(storage, env) as term:
        shown = term.line(b"which fs.read")
        assert shown == f"which fs.read\r\n{storage}/tool/fs.read\r\n".encode(), shown
        shown = term.line(b"no.such")
        assert shown == f"no.such\r\ntsh: no.such: {NOT_A_TOOL}\r\n".encode(), shown
        term.type(b"\x04")
        assert term.wait() == 127


def test_erase_word_erase_line_kill_and_ctrl_d_inside_a_line_edit_what_tsh_runs(
    storage: Path, tmp_path: Path
) -> None:
    """docs ("At a terminal, tsh edits the line it waits for itself (erase, Ctrl-W a word,
    Ctrl-U the line, Ctrl-D on an empty line ends tsh)"): what runs is the line as edited:
    DEL erases a character (a two-byte ``é`` as one), Ctrl-W the last word and the blanks
    after it, Ctrl-U the whole line; Ctrl-D inside a line ends nothing; a NUL typed is echoed
    as ``^@`` and refused escaped."""
    tool = str(storage / "tool")
    env = person(storage, tmp_path / "home")
    with at_a_terminal(storage, env) as term:
        assert term.line(b"which fs.xx\x7f\x7fread").endswith(f"{tool}/fs.read\r\n".encode())
        shown = term.line(b"which no.such fs.list ju\x17\x17fs.stat")
        assert shown.endswith(f"tsh: no.such: not on CTX_PATH\r\n{tool}/fs.stat\r\n".encode())
        assert term.line(b"garbage x\x15which fs.write").endswith(f"{tool}/fs.write\r\n".encode())
        assert term.line(b"which fs.read\xc3\xa9\x7f").endswith(f"{tool}/fs.read\r\n".encode())
        assert term.line(b"which fs.\x04list").endswith(f"{tool}/fs.list\r\n".encode())
        shown = term.line(b"which a\x00b")
        assert shown == b"which a^@b\r\ntsh: a\\x00b: not on CTX_PATH\r\n", shown
        term.type(b"exit 5\r")
        assert term.wait() == 5


def test_a_line_longer_than_the_terminal_driver_keeps_reaches_tsh_whole(
    storage: Path, tmp_path: Path
) -> None:
    """docs ("the terminal's own line editing keeps 4095 bytes of a line and drops the rest:
    a line typed at the prompt reaches tsh whole"): a ``which`` line of 12 KB naming fs.read
    1500 times answers 1500 paths, none lost and the line not cut into an unclosed word."""
    env = person(storage, tmp_path / "home")
    with at_a_terminal(storage, env) as term:
        shown = term.line(b"which" + b" fs.read" * 1500)
        assert shown.count(f"{storage}/tool/fs.read\r\n".encode()) == 1500, shown[-300:]
        assert b"tsh: " not in shown


def test_ctrl_c_at_the_prompt_drops_the_half_typed_line_and_tsh_reads_on(
    storage: Path, tmp_path: Path
) -> None:
    """docs ("Ctrl-C at the prompt clears the line ... never the terminal"): with the
    pseudo-terminal as its controlling terminal, Ctrl-C after a half-typed line shows ``^C``,
    runs nothing of it, and the next prompt takes a line as usual."""
    env = person(storage, tmp_path / "home")
    with at_a_terminal(storage, env) as term:
        prompts = term.data.count(PROMPT) or 1
        term.type(b"which no.such\x03")
        assert term.shows(PROMPT, prompts + 1), term.data
        assert b"^C" in term.data and b"not on CTX_PATH" not in term.data, term.data
        assert term.line(b"which fs.read").endswith(f"{storage}/tool/fs.read\r\n".encode())
        term.type(b"exit\r")
        assert term.wait() == 0


def test_bytes_that_are_not_utf8_typed_at_a_terminal_are_refused_escaped(
    storage: Path, tmp_path: Path
) -> None:
    """H-1 and docs (a typed name shown escaped): bytes that are not UTF-8 typed at the
    prompt are echoed, refused as no tool with their escapes, and tsh reads on."""
    env = person(storage, tmp_path / "home")
    with at_a_terminal(storage, env) as term:
        shown = term.line(b"\xff\xfe x")
        assert shown.endswith(f"tsh: \\udcff\\udcfe: {NOT_A_TOOL}\r\n".encode()), shown
        assert term.line(b"which fs.read").endswith(f"{storage}/tool/fs.read\r\n".encode())


def test_at_a_terminal_with_output_redirected_typing_shows_and_the_file_gets_output_alone(
    storage: Path, tmp_path: Path
) -> None:
    """T-3 ("plain text out"), docs ("a piped script gets the output alone"): a person at a
    terminal runs ``tsh > out.txt`` to keep what tools print.  What they type must still
    appear on the terminal they type at, as it does in any shell, and ``out.txt`` must hold
    the output alone, without prompts and the typed command lines mixed into it."""
    env = person(storage, tmp_path / "home")
    out_file = tmp_path / "out.txt"
    with out_file.open("wb") as sink, at_a_terminal(storage, env, stdout=sink) as term:
        wait_for(lambda: term.data or out_file.stat().st_size, 10)
        os.write(term.master, b"which fs.read\r")
        wait_for(lambda: b"fs.read" in out_file.read_bytes() + term.data, 10)
        os.write(term.master, b"\x04")
        assert term.wait() == 0
        shown = term.data
    assert b"which fs.read" in shown, shown  # the person sees what they typed
    assert out_file.read_text() == f"{storage}/tool/fs.read\n", out_file.read_text()


# ------------------------------------------------------------------------ the agent terminal


@pytest.fixture
def host(_template: Path) -> Iterator[CoderHost]:
    """Agent ``coder`` with ``demo.echo`` (shows its argv) and ``demo.fail`` (exits with its
    first argument) granted in both policies, ``demo.denied`` in its own policy only (its
    tool policy grants nothing), and ``demo.plain`` granted but without an execute bit."""
    tools = ["demo.echo", "demo.fail", "demo.denied", "demo.plain"]
    with coder_host(_template, SCRATCH, tools, {}) as host:
        host.install("demo.echo", ECHO)
        host.install("demo.fail", '#!/bin/sh\necho "failing with $1"\nexit "$1"\n')
        marker = host.top / "denied-ran"
        host.install("demo.denied", f"#!/bin/sh\ntouch {marker}\n")
        host.install("demo.plain", f"#!/bin/sh\ntouch {marker}\n")
        (host.storage / "tool" / "demo.plain").chmod(0o644)
        for tool in ("demo.echo", "demo.fail", "demo.plain"):
            host.grant_in_tool(tool)
        yield host


def answer(typist: Raw, line: bytes) -> str:
    """Type ``line`` at the agent's prompt; what tsh showed before the next prompt, the echo
    of the line taken off."""
    prompts = typist.count(AGENT_PROMPT)
    before = len(typist.data)
    typist.type(line)
    assert typist.shows(AGENT_PROMPT, prompts + 1), typist.text()[-600:]
    shown = typist.data[before:].rpartition(AGENT_PROMPT.encode())[0]
    return shown.decode("utf-8", "replace").replace("\r\n", "\n").split("\n", 1)[1]


@needs_terminal
def test_in_the_agent_terminal_quoted_words_reach_the_tool_and_refusals_have_their_status(
    host: CoderHost,
) -> None:
    """H-1, H-2, T-3, T-4, T-5 and docs (the run socket answers "127: not found, 126:
    refused"; the hit is the first on the path "even where the agent's view of /ctx/tool
    hides it ... which then names that later tool while a call of the name is refused"):

    * quoting gives the tool exactly the words a shell would, empty words and quoted blanks
      included, and an empty argv stays empty (T-3); each call is in the session;
    * a tool's own status comes back modulo 256 (``demo.fail 300`` is 44);
    * a name that is not there, a granted tool without an execute bit, a tool the tool policy
      denies and ``ctx tool tsh.config`` are refused as no tool; a copy of the denied tool in
      the agent's own tier is what ``which`` names, but a call of it is refused by the chain
      with EACCES naming the missing rule, recorded as refused, and never runs;
    * Ctrl-D ends tsh with the last line's status, which ``terminal.stopped`` records."""
    marker = host.top / "denied-ran"
    mine = host.storage / "home" / str(host.uid) / "tool"
    mine.mkdir(parents=True)
    shutil.copy2(host.storage / "tool" / "demo.denied", mine / "demo.denied")
    shutil.copytree(host.storage / "tool" / "demo.denied.d", mine / "demo.denied.d")
    for path in (mine.parent, mine, *mine.rglob("*")):
        os.lchown(path, host.uid, host.gid)
    term = host.start()
    session = term.session
    typist = Raw(term.listening_at, b"attach\n")
    try:
        assert typist.shows(AGENT_PROMPT), typist.text()
        shown = answer(typist, b"demo.echo '' \"\" 'a b' c\\ d \"x\\\"y\" 'it'\\''s' $HOME")
        words = ["", "", "a b", "c d", 'x"y', "it's", "$HOME"]
        assert shown == f"argc={len(words)}\n" + "".join(f"[{w}]\n" for w in words), shown
        assert answer(typist, b"demo.echo") == "argc=0\n"
        assert answer(typist, b"demo.fail 300") == "failing with 300\n"
        for line, name in ((b"no.such x", "no.such"), (b"demo.plain", "demo.plain"),
                           (b"ctx tool tsh.config", "ctx")):  # fmt: skip
            assert answer(typist, line) == f"tsh: {name}: {NOT_A_TOOL}\n", line
        assert answer(typist, b"which demo.denied") == f"/ctx/home/{host.uid}/tool/demo.denied\n"
        refused = answer(typist, b"demo.denied now")
        assert refused.startswith("tsh: demo.denied: EACCES: "), refused
        assert "allow coder_t tool:demo.denied execute" in refused, refused
        assert answer(typist, b"which demo.plain no.such").count("not on CTX_PATH") == 2
        calls = [(e["object"], e["argv"]) for e in host.events(session)
                 if e["type"] == "tool_call"]  # fmt: skip
        assert calls == [
            ("tool/demo.echo", words),
            ("tool/demo.echo", []),
            ("tool/demo.fail", ["300"]),
            ("tool/demo.denied", ["now"]),
        ], calls
        results = [e for e in host.events(session) if e["type"] == "tool_result"]
        assert [r.get("exit_status") for r in results[:3]] == [0, 0, 44], results
        assert (results[3].get("errno"), results[3].get("stage")) == ("EACCES", "authorize")
        typist.send(b"\x04")
        assert typist.eof.wait(20), typist.text()[-300:]

        def stopped() -> list[dict]:
            return [e for e in host.lifecycle(session) if e["type"] == "terminal.stopped"]

        assert wait_for(stopped, 15), host.lifecycle(session)
        host.started.remove(session)
        assert stopped()[0]["exit_status"] == 1  # the last line: which found neither name
    finally:
        typist.close()
    assert not marker.exists()
