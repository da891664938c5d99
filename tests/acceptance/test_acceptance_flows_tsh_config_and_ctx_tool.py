"""``tool/tsh.d/config`` as a data file, updated through ``tsh.config`` and read by tsh, and
``ctx tool NAME`` as the one way a person runs that safe core CLI (SPEC §7 H-3, H-4, with R-5,
T-4, T-7; docs/tools.md "ctx tool (H-3)", "tsh.config", "The agent terminal", "ctx bootstrap").

Every setting is given at, below and above its limits, with spaces, signs, leading zeros,
digits of other scripts, huge numbers and empty values, as ``key=value`` words and as JSON;
the file is edited by hand with CRLF line ends, spaces around ``=``, a comment after a value,
no final newline, digits tsh cannot read; it is made a link, a FIFO, a directory, unreadable
to another uid, part of a read-only or a full filesystem; tsh and tsh.config are reinstalled
by ``ctx bootstrap`` under it; two updates run at once through two ways in; a non-root user
reads and tries to update it, on root's storage root and on its own.  ``ctx tool`` is given
every core tool that is not a safe core CLI, a name nobody installed, and a ``tsh.config`` of
a user's tier that shadows the core one on ``CTX_PATH``.

What must hold each time: the errno and exit status the docs give, no traceback, a config
never half-written nor reset, and a tsh whose context (how many tools it keeps loaded) follows
what ``tsh.config`` reports."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Run,
    clean_env,
    new_scratch_dir,
    scratch_top,
    tool_manifest,
)
from tests.support.storage import copy_of_root, small_tmpfs
from tests.support.users import UnprivilegedUser, find_or_create_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="acts as a second uid and mounts")

SCRATCH = scratch_top(__file__)
DEFAULTS = {"max_loaded_tools": "64", "cache_capacity": "32", "window_percent": "1"}
LIMITS = {"max_loaded_tools": 65536, "cache_capacity": 65536, "window_percent": 100}
DEFAULT_TEXT = (
    "# tsh configuration (SPEC H-4): data, never code.\n"
    "max_loaded_tools=64\ncache_capacity=32\nwindow_percent=1\n"
)
# Tools of a bootstrapped root that tsh can load (their metadata) without running them.
LOADABLE = ["fs.read", "fs.list", "fs.stat", "fs.write", "shell.exec"]


# ----------------------------------------------------------------------------------- helpers


@dataclass
class Desk:
    """A bootstrapped storage root in a directory every uid may search, and a person's
    ``CTX_HOME`` (no ``.tshrc``) with ``CTX_PATH`` naming the root's ``tool/``."""

    top: Path
    storage: Path
    home: Path

    @property
    def config(self) -> Path:
        return self.storage / "tool" / "tsh.d" / "config"

    def env(self, **extra: str) -> dict[str, str]:
        values = {
            "CTX_STORAGE": str(self.storage),
            "CTX_HOME": str(self.home),
            "CTX_PATH": str(self.storage / "tool"),
        }
        values.update(extra)
        return clean_env(**values)

    def ctx(
        self,
        *args,
        user: UnprivilegedUser | None = None,
        env: dict[str, str] | None = None,
        input: str = "",
    ) -> Run:
        """``ctx ARGS`` (as ``user`` when given), stdin ``input``."""
        argv = [*CTX_ARGV, *map(str, args)]
        ids = {} if user is None else {"user": user.uid, "group": user.gid, "extra_groups": []}
        done = subprocess.run(
            argv, input=input.encode(), capture_output=True, env=env or self.env(),
            cwd=self.top, timeout=60, **ids,
        )  # fmt: skip
        return Run(
            argv[len(CTX_ARGV) :],
            done.returncode,
            done.stdout.decode("utf-8", "replace"),
            done.stderr.decode("utf-8", "replace"),
        )

    def tool(self, *args, **kw) -> Run:
        """``ctx tool tsh.config ARGS``."""
        return self.ctx("tool", "tsh.config", *args, **kw)

    def tsh(self, script: str, user: UnprivilegedUser | None = None) -> subprocess.CompletedProcess:
        """The root's ``bin/tsh`` as a person's standalone tsh, ``script`` on a pipe."""
        ids = {} if user is None else {"user": user.uid, "group": user.gid, "extra_groups": []}
        return subprocess.run(
            [self.storage / "bin" / "tsh"], input=script, capture_output=True, text=True,
            env=self.env(), cwd=self.top, timeout=60, **ids,
        )  # fmt: skip

    def kept_loaded(self, user: UnprivilegedUser | None = None) -> tuple[int, str]:
        """How many of :data:`LOADABLE` tsh keeps in its context after loading them all in
        turn (none pinned), and what else than its unload notices it said on stderr."""
        marker = f"{self.storage}/tool/fs.read"
        script = "".join(f"load {name}\n" for name in LOADABLE) + "which fs.read\nloaded\n"
        done = self.tsh(script, user=user)
        assert done.returncode == 0, done
        assert "Traceback" not in done.stderr, done.stderr[-1500:]
        lines = done.stdout.splitlines()
        after = lines[lines.index(marker) + 1 :]
        kept = len([line for line in after if line.split(":", 1)[0] in LOADABLE])
        said = done.stderr.splitlines(keepends=True)
        unloaded = [line for line in said if line.endswith(" (max_loaded_tools reached)\n")]
        assert len(unloaded) == len(LOADABLE) - kept, done  # each unload is said once
        return kept, "".join(line for line in said if line not in unloaded)

    def hidden(self) -> list[str]:
        """Names in ``tsh.d/`` starting with a dot: a temporary file an update left."""
        return sorted(name for name in os.listdir(self.config.parent) if name.startswith("."))


def settings(run: Run) -> dict[str, str]:
    return dict(line.split("=", 1) for line in run.lines() if "=" in line)


def no_traceback(*runs: Run) -> None:
    for run in runs:
        assert "Traceback" not in run.err, run.err[-1500:]


def refused_as_bad_input(run: Run, *words: str) -> None:
    """``EINVAL``, exit 2, from tsh.config, naming ``words``."""
    no_traceback(run)
    assert run.rc == 2, run
    assert run.err.startswith("ctx: EINVAL: tsh.config: "), run
    for word in words:
        assert word in run.err, (word, run)


@pytest.fixture
def desk(_template: Path) -> Iterator[Desk]:
    top = new_scratch_dir(SCRATCH)
    home = top / "home"
    home.mkdir()
    home.chmod(0o755)
    storage = copy_of_root(_template, top / "storage")
    yield Desk(top, storage, home)
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def user() -> UnprivilegedUser:
    return find_or_create_user()


def chown_tree(top: Path, user: UnprivilegedUser) -> None:
    os.chown(top, user.uid, user.gid)
    for directory, dirs, files in os.walk(top):
        for name in dirs + files:
            os.chown(os.path.join(directory, name), user.uid, user.gid, follow_symlinks=False)


# ------------------------------------------------------------------- H-4: values at limits


@pytest.mark.parametrize("key", sorted(LIMITS))
def test_each_setting_at_below_and_above_its_limits(desk: Desk, key: str) -> None:
    """H-4, docs/tools.md ("known keys, each given once, positive integers, window_percent ≤
    100, cache_capacity and max_loaded_tools ≤ 65536: else EINVAL, exit 2, and not one
    setting changes").  For each key: 1 and the limit are written as given; spaces around
    the value are ignored and leading zeros read as the number (written without them); 0,
    the limit plus one, a sign, a fraction, hexadecimal, digits of other scripts, a space
    inside, a comment after it and an empty value are EINVAL naming the key, and the file
    stays byte for byte."""
    limit = LIMITS[key]
    for given, written in (("1", "1"), (str(limit), str(limit)), (" 7 ", "7"), ("007", "7")):
        done = desk.tool(f"{key}={given}")
        no_traceback(done)
        assert done.rc == 0, (given, done)
        assert settings(done)[key] == written, (given, done)
        assert f"{key}={written}" in desk.config.read_text().splitlines(), given
    kept = desk.config.read_bytes()
    for value in ("0", str(limit + 1), "-1", "+5", "1.5", "0x10", "\u0663", "\uff15",
                  "1 0", "5 # five", ""):  # fmt: skip
        refused_as_bad_input(desk.tool(f"{key}={value}"), key)
        assert desk.config.read_bytes() == kept, value
    assert desk.hidden() == []


def test_an_update_is_judged_whole_and_json_values_are_numbers_only(desk: Desk) -> None:
    """H-4, docs/tools.md: an update is validated whole before anything is written: a good
    setting beside an unknown key, a key given twice (as words or in one JSON object), a word
    without ``=`` or without a key, and a key in other case change nothing (EINVAL, exit 2).
    In JSON, ``true``, ``false``, ``null``, ``40.0``, ``[40]`` and ``" 40"`` are no positive
    integers; a string of decimal digits is read as the number it spells."""
    kept = desk.config.read_bytes()
    for words in (
        ("cache_capacity=40", "colour=1"),
        ("cache_capacity=40", "cache_capacity=40"),
        ("cache_capacity=40", "window_percent"),
        ("cache_capacity=40", "=5"),
        ("Cache_Capacity=40",),
        ("cache_capacity=40", "window_percent=101"),
    ):
        refused_as_bad_input(desk.tool(*words))
        assert desk.config.read_bytes() == kept, words
    twice = '{"set": {"cache_capacity": 40, "cache_capacity": 41}}'
    refused_as_bad_input(desk.tool(twice), "twice")
    refused_as_bad_input(desk.tool(input=twice), "twice")  # the same input on stdin
    for value in ("true", "false", "null", "40.0", "[40]", '" 40"', '{"n": 40}', "-40"):
        refused_as_bad_input(desk.tool(f'{{"set": {{"cache_capacity": {value}}}}}'), "cache_")
        assert desk.config.read_bytes() == kept, value
    shown = desk.ctx("tool", "--json", "tsh.config", '{"set": {"cache_capacity": "040"}}')
    assert shown.rc == 0, shown
    assert shown.json()["config"]["cache_capacity"] == 40
    assert "cache_capacity=40" in desk.config.read_text().splitlines()


def test_a_config_value_of_thousands_of_leading_zeros_is_one_more_bad_line(desk: Desk) -> None:
    """H-4, docs/tools.md ("a value of more digits than any setting needs", leading zeros
    not counted, "is one more bad line"): a line ``cache_capacity=000…08`` of 4400 zeros,
    as a careless generator may write it, is 8, as the same value given to ``tsh.config``
    as a word is.  tsh must still start and resolve names, and both it and ``tsh.config``
    show the setting (``ctx bootstrap`` calls such a root complete)."""
    desk.config.write_text("max_loaded_tools=3\ncache_capacity=" + "0" * 4400 + "8\n")
    shown = desk.tool()
    no_traceback(shown)
    assert shown.rc == 0, shown
    assert settings(shown)["max_loaded_tools"] == "3", shown
    assert settings(shown)["cache_capacity"] == "8" and shown.err == "", shown
    started = desk.tsh("which fs.read\n")
    assert "Traceback" not in started.stderr, started.stderr[-1500:]
    assert (started.returncode, started.stdout) == (0, f"{desk.storage}/tool/fs.read\n")
    assert "tsh.d/config" not in started.stderr, started


def test_an_update_of_thousands_of_leading_zeros_is_judged_alike_in_both_forms(
    desk: Desk,
) -> None:
    """H-4, docs/tools.md (an update is validated before anything is written; a bad one is
    EINVAL, exit 2): the value ``000…08`` (4400 zeros) given as a ``key=value`` word and as a
    JSON string is one value, so both forms must get the same answer — taken (exit 0) or
    refused as bad input (exit 2) — and never a traceback."""
    value = "0" * 4400 + "8"
    as_word = desk.tool(f"cache_capacity={value}")
    no_traceback(as_word)
    desk.config.write_text(DEFAULT_TEXT)
    as_json = desk.tool(json.dumps({"set": {"cache_capacity": value}}))
    no_traceback(as_json)
    assert as_json.rc in (0, 2), as_json
    assert as_word.rc == as_json.rc, (as_word, as_json)


# ---------------------------------------------------------------- H-4: the file edited by hand


def test_a_crlf_config_with_spaces_around_the_equals_sign_is_read_and_kept_crlf(
    desk: Desk,
) -> None:
    """H-4 (blank lines, ``#`` comments, ``key=value``): a config saved by a Windows editor,
    with CRLF line ends and spaces around ``=``, gives its values to tsh.config and to tsh
    alike with no warning (tsh keeps 2 tools loaded); an update rewrites only its line and
    keeps that line's CRLF and the comment's bytes; ``ctx bootstrap`` leaves it as it is."""
    desk.config.write_bytes(
        b"# edited on a laptop\r\n\r\nmax_loaded_tools = 2\r\ncache_capacity=20\r\n"
    )
    shown = desk.tool()
    assert (shown.rc, shown.err) == (0, ""), shown
    assert settings(shown) == {**DEFAULTS, "max_loaded_tools": "2", "cache_capacity": "20"}
    assert desk.kept_loaded() == (2, "")
    assert desk.tool("cache_capacity=21").rc == 0
    assert desk.config.read_bytes() == (
        b"# edited on a laptop\r\n\r\nmax_loaded_tools = 2\r\ncache_capacity=21\r\n"
    )
    assert desk.tool("max_loaded_tools=3").rc == 0
    data = desk.config.read_bytes()
    assert data.startswith(b"# edited on a laptop\r\n\r\nmax_loaded_tools=3\r\n"), data
    boot = desk.ctx("bootstrap", "--storage", desk.storage, "--json")
    assert boot.rc == 0 and boot.json()["problems"] == [], boot
    assert desk.config.read_bytes() == data
    assert desk.kept_loaded() == (3, "")


def test_a_config_without_a_final_newline_gets_its_new_line_on_a_line_of_its_own(
    desk: Desk,
) -> None:
    """H-4, docs/tools.md ("a key that was absent is appended"; comments and order kept):
    a config whose last line has no newline (``printf`` or an editor that adds none) gets the
    new key on a line of its own, never glued to the last value, and each line ends in a
    newline afterwards."""
    for text, key in (
        ("# mine\nmax_loaded_tools=3", "cache_capacity"),
        ("max_loaded_tools=3\n# the end", "window_percent"),
        ("max_loaded_tools=3", "max_loaded_tools"),
    ):
        desk.config.write_text(text)
        done = desk.tool(f"{key}=5")
        assert done.rc == 0, (text, done)
        lines = desk.config.read_text().split("\n")
        assert lines[-1] == "" and f"{key}=5" in lines, (text, lines)
        assert settings(desk.tool())[key] == "5"
        if key != "max_loaded_tools":
            assert "max_loaded_tools=3" in lines, lines
        assert [line for line in lines if line.startswith("#")] == [
            line for line in text.split("\n") if line.startswith("#")
        ]


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("max_loaded_tools=3 # three", "'3 # three'"),
        ("max_loaded_tools=\u0663", "'\u0663'"),
        ("max_loaded_tools=3;", "'3;'"),
    ],
    ids=["comment-after-value", "arabic-indic-digit", "trailing-semicolon"],
)
def test_a_line_tsh_cannot_use_is_the_default_everywhere_and_blocks_updates(
    desk: Desk, line: str, shown: str
) -> None:
    """H-4 (comments are lines of their own), docs/tools.md (each unusable line is warned of
    and its key keeps the default; an update is refused while the file has a malformed line;
    bootstrap reports, never rewrites): a value followed by a comment, written in another
    script's digits or with a stray ``;`` is one bad line.  tsh.config and tsh name it and
    show the same value inside it, both use 64 (tsh keeps all 5 tools loaded); an update is
    EINVAL (exit 1) and ``ctx bootstrap`` a problem (exit 1); the file is never rewritten."""
    text = f"# tuned\n{line}\ncache_capacity=20\n"
    desk.config.write_text(text)
    read = desk.tool()
    assert read.rc == 0 and settings(read)["max_loaded_tools"] == "64", read
    assert settings(read)["cache_capacity"] == "20", read
    assert f"tsh.d/config:2: max_loaded_tools must be a positive integer, not {shown}" in read.err
    kept, said = desk.kept_loaded()
    assert kept == len(LOADABLE), said
    assert f"tsh.d/config:2: max_loaded_tools must be a positive integer, not {shown}" in said
    update = desk.tool("cache_capacity=21")
    no_traceback(update)
    assert update.rc == 1 and update.err.startswith("ctx: EINVAL: "), update
    boot = desk.ctx("bootstrap", "--storage", desk.storage, "--json")
    assert boot.rc == 1, boot
    assert [p for p in boot.json()["problems"] if "tool/tsh.d/config:2: " in p], boot
    assert desk.config.read_text() == text


def test_bootstrap_replaces_a_linked_or_fifo_config_and_leaves_a_directory_for_a_person(
    desk: Desk,
) -> None:
    """R-5, docs/tools.md "ctx bootstrap" ("a symbolic link, FIFO … holds nobody's data …
    so it is replaced"; "a directory … where a file … belongs [is] reported as [a] problem
    and left untouched"): a config that is a link is replaced by the defaults, the file it
    named left as it was; a FIFO too, without bootstrap waiting on it; a directory is a
    problem (exit 1) and stays.  While it is a directory tsh says it cannot read it and
    starts with the defaults, and tsh.config refuses it with EINVAL."""
    managed = desk.top / "managed.cfg"
    managed.write_text("max_loaded_tools=3\n")
    for kind, said in (("link", "a symbolic link"), ("fifo", "a FIFO")):
        desk.config.unlink()
        if kind == "link":
            desk.config.symlink_to(managed)
        else:
            os.mkfifo(desk.config)
        boot = desk.ctx("bootstrap", "--storage", desk.storage)
        assert boot.rc == 0, boot
        assert f"repaired  tool/tsh.d/config (it was {said})" in boot.out.splitlines(), boot
        assert stat.S_ISREG(os.lstat(desk.config).st_mode)
        assert desk.config.read_text() == DEFAULT_TEXT
        assert managed.read_text() == "max_loaded_tools=3\n"
    desk.config.unlink()
    desk.config.mkdir()
    boot = desk.ctx("bootstrap", "--storage", desk.storage)
    assert boot.rc == 1, boot
    assert "problem   tool/tsh.d/config is not a regular file; left untouched" in boot.out
    assert desk.config.is_dir()
    kept, said = desk.kept_loaded()
    assert kept == len(LOADABLE) and "cannot be read (not a regular file)" in said, said
    refused = desk.tool()
    assert refused.rc == 1 and refused.err.startswith("ctx: EINVAL: tsh.config: "), refused


# --------------------------------------------------------- H-4: what tsh uses after each change


def test_what_tsh_keeps_loaded_follows_every_change_of_the_config(desk: Desk) -> None:
    """H-4 ("max_loaded_tools bounds unpinned tool metadata loaded into the tsh context";
    updates normally go through ``tsh.config``): after each update tsh keeps as many tools as
    tsh.config reports; with the file removed tsh takes the defaults without a word while
    tsh.config warns that it is missing; the first update then writes the whole default file
    with the one change, mode 0644 however tight the caller's umask, so that every agent's
    tsh may read it."""
    for value in (1, 4, 2):
        done = desk.tool(f"max_loaded_tools={value}")
        assert done.rc == 0 and settings(done)["max_loaded_tools"] == str(value), done
        assert desk.kept_loaded() == (value, "")
    desk.config.unlink()
    assert desk.kept_loaded() == (len(LOADABLE), "")
    read = desk.tool()
    assert read.rc == 0 and settings(read) == DEFAULTS, read
    assert f"{desk.config} does not exist: every default applies" in read.err, read
    assert not desk.config.exists()
    env = desk.env()
    tight = subprocess.run(
        ["/bin/sh", "-c", 'umask 077; exec "$@"', "sh", *CTX_ARGV, "tool", "tsh.config",
         "max_loaded_tools=3"], capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert tight.returncode == 0, tight
    assert desk.config.read_text() == DEFAULT_TEXT.replace(
        "max_loaded_tools=64", "max_loaded_tools=3"
    )
    assert stat.S_IMODE(desk.config.stat().st_mode) == 0o644
    assert desk.kept_loaded() == (3, "")


# ------------------------------------------------- reinstalls and bootstrap keep the config


def test_reinstalls_of_tsh_and_tsh_config_and_bootstrap_keep_the_config_byte_for_byte(
    desk: Desk,
) -> None:
    """R-5 ("idempotent and never destroys user data"), docs/tools.md ("an existing config is
    never rewritten"; ``tool/tsh``'s controls hold ``config``, "which an install carries over
    like any local state"): with an administrator's config (comment, CRLF line, no final
    newline), ``ctx bootstrap`` putting back a damaged ``tool/tsh`` and a damaged
    ``tool/tsh.config`` keeps the very same file, and a manifest of the core name is refused
    (EEXIST, exit 1) without touching it.  tsh and tsh.config still read its values."""
    text = b"# ours: do not reset\nmax_loaded_tools=2\r\ncache_capacity=7"
    desk.config.write_bytes(text)
    inode = desk.config.stat().st_ino
    for tool in ("tsh", "tsh.config"):
        (desk.storage / "tool" / f"{tool}.d" / "description").write_text("changed by hand\n")
        boot = desk.ctx("bootstrap", "--storage", desk.storage)
        assert boot.rc == 0, boot
        assert f"repaired  tool/{tool}" in boot.out.splitlines(), boot
        assert desk.config.read_bytes() == text, tool
        assert desk.config.stat().st_ino == inode, tool
    manifest = tool_manifest(desk.top / "manifests", "tsh.config", "#!/bin/sh\necho mine\n")
    refused = desk.ctx("object", "install", manifest, "--tier", "system")
    assert refused.rc == 1 and refused.err.startswith("ctx: EEXIST: tsh.config is a core tool")
    again = desk.ctx("bootstrap", "--storage", desk.storage)
    assert again.rc == 0 and "nothing to do" in again.out, again
    assert desk.config.read_bytes() == text
    shown = desk.tool()
    assert (shown.rc, shown.err) == (0, ""), shown
    assert settings(shown) == {**DEFAULTS, "max_loaded_tools": "2", "cache_capacity": "7"}
    assert desk.kept_loaded() == (2, "")


# ------------------------------------------------------------ H-4: two updates at once


def test_updates_through_ctx_tool_and_through_the_program_at_once_lose_nothing(
    desk: Desk,
) -> None:
    """H-4, docs/tools.md ("updates take turns under the lock of the tier's installs, so none
    is lost"; rewritten in one rename): ``ctx tool tsh.config`` and the ``tool/tsh.config``
    program run by a person set two different keys at the same moment, round after round.
    Each round both succeed and both values are in the file; the file is whole at every
    step, keeps its comment, and no temporary file stays in ``tsh.d/``."""
    program = desk.storage / "tool" / "tsh.config"
    env = desk.env()
    for round_ in range(6):
        procs = [
            subprocess.Popen([*CTX_ARGV, "tool", "tsh.config", f"cache_capacity={40 + round_}"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env),
            subprocess.Popen([program, f"window_percent={10 + round_}"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env),
        ]  # fmt: skip
        outcomes = [(proc.wait(timeout=60), *proc.communicate()) for proc in procs]
        assert [rc for rc, _, _ in outcomes] == [0, 0], outcomes
        assert all(b"Traceback" not in err for _, _, err in outcomes), outcomes
        lines = desk.config.read_text().splitlines()
        assert lines == [
            DEFAULT_TEXT.splitlines()[0],
            "max_loaded_tools=64",
            f"cache_capacity={40 + round_}",
            f"window_percent={10 + round_}",
        ], (round_, lines)
    assert desk.hidden() == []


# --------------------------------------------------------- failures of the filesystem beneath


def test_a_read_only_or_full_filesystem_refuses_an_update_with_its_errno_and_keeps_the_file(
    _template: Path,
) -> None:
    """H-4, docs/tools.md (an update that cannot be written says why; "rewritten in one
    rename"): on a read-only filesystem tsh.config still reads, an update that changes
    nothing is fine, and a change is EROFS (exit 1) saying to remount; on a full one a change
    is ENOSPC (exit 1).  Both answer in ``--json`` as ``{"error", "errno", "message"}``; the
    file keeps its settings and no temporary file is left."""
    top = new_scratch_dir(SCRATCH)
    try:
        with small_tmpfs(top / "disk", "8m", mode=0o755) as disk:
            desk = Desk(top, copy_of_root(_template, disk / "storage"), top / "home")
            desk.home.mkdir()
            desk.config.write_text("max_loaded_tools=5\n")
            subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
            read = desk.tool()
            assert read.rc == 0 and settings(read)["max_loaded_tools"] == "5", read
            assert desk.tool("max_loaded_tools=5").rc == 0
            for args in (("tsh.config",), ("--json", "tsh.config")):
                done = desk.ctx("tool", *args[:-1], args[-1], "cache_capacity=9")
                no_traceback(done)
                assert done.rc == 1, done
                assert "ctx: EROFS: tsh.config: " in done.err and "remount" in done.err, done
                if args[0] == "--json":
                    assert done.json()["error"] == "EROFS", done
            subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
            # Unbuffered, down to the last byte: a buffered tail would fail again at close.
            with open(disk / "filler", "wb", buffering=0) as filler:
                for chunk in (65536, 4096, 1):
                    with contextlib.suppress(OSError):
                        while filler.write(b"\0" * chunk):
                            pass
            full = desk.ctx("tool", "--json", "tsh.config", "cache_capacity=9")
            no_traceback(full)
            assert full.rc == 1 and full.json()["error"] == "ENOSPC", full
            assert desk.config.read_text() == "max_loaded_tools=5\n"
            assert desk.hidden() == []
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------- another uid: read, not write


def test_another_uid_reads_the_settings_and_is_told_whose_they_are_to_change(
    desk: Desk, user: UnprivilegedUser
) -> None:
    """H-3, H-4, docs/tools.md ("an agent allowed to run the tool, or any other uid, reads
    the settings and gets EACCES when it tries to change them, even where tsh.d/ and the file
    were made writable to it; the error names the lock file, whose it is and who may
    update"): through ``ctx tool`` as the test user, a read shows root's values; an update is
    EACCES (exit 1, ``--json`` an error object) naming how the owner changes it; with the
    file and ``tsh.d/`` opened to it, the refusal names ``.install-lock``, uid 0 and mode
    0600.  A config it may not read is EACCES for tsh.config, and its tsh says so and takes
    the defaults.  Nothing changes."""
    desk.config.write_text("max_loaded_tools=3\n")
    read = desk.tool(user=user)
    assert read.rc == 0 and settings(read)["max_loaded_tools"] == "3", read
    assert desk.kept_loaded(user=user) == (3, "")
    update = desk.tool("max_loaded_tools=9", user=user)
    no_traceback(update)
    assert update.rc == 1, update
    assert update.err.startswith(f"ctx: EACCES: tsh.config: {desk.config} cannot be changed by")
    assert "'ctx tool tsh.config KEY=VALUE'" in update.err, update
    native = desk.ctx("tool", "--json", "tsh.config", "max_loaded_tools=9", user=user)
    assert native.rc == 1 and native.json()["error"] == "EACCES", native
    desk.config.chmod(0o666)
    desk.config.parent.chmod(0o777)
    try:
        update = desk.tool("max_loaded_tools=9", user=user)
        assert update.rc == 1, update
        lock = desk.storage / "tool" / ".install-lock"
        assert update.err.startswith(f"ctx: EACCES: tsh.config: {lock} cannot be opened by uid "
                                     f"{user.uid}"), update  # fmt: skip
        assert "(it belongs to uid 0, mode 0600)" in update.err, update
    finally:
        desk.config.parent.chmod(0o755)
    desk.config.chmod(0o600)
    unreadable = desk.tool(user=user)
    no_traceback(unreadable)
    assert unreadable.rc == 1 and unreadable.err.startswith("ctx: EACCES: tsh.config: "), unreadable
    kept, said = desk.kept_loaded(user=user)
    assert kept == len(LOADABLE) and "cannot be read (Permission denied)" in said, said
    assert desk.config.read_text() == "max_loaded_tools=3\n"
    assert desk.hidden() == []


def test_a_user_updates_the_config_of_its_own_storage_root(
    desk: Desk, user: UnprivilegedUser
) -> None:
    """H-3, H-4, docs/tools.md ("only the tier's owner (and root) may update it"): on a
    storage root that belongs to the test user, its own ``ctx tool tsh.config`` update is
    taken, the file stays the user's with mode 0644, and its tsh uses the new value."""
    chown_tree(desk.storage, user)
    done = desk.tool("max_loaded_tools=2", user=user)
    assert done.rc == 0, done
    held = desk.config.stat()
    assert (held.st_uid, stat.S_IMODE(held.st_mode)) == (user.uid, 0o644)
    assert desk.kept_loaded(user=user) == (2, "")


def test_roots_update_of_a_users_root_leaves_the_config_the_users(
    desk: Desk, user: UnprivilegedUser
) -> None:
    """H-4, docs/tools.md ("the file belongs to the storage root's owner"; bootstrap run as
    root on another uid's root gives that owner what it makes): ``sudo ctx tool tsh.config``
    on the user's own root must leave ``tsh.d/config`` the user's, so that the user can
    still change it as an ordinary file."""
    chown_tree(desk.storage, user)
    done = desk.tool("max_loaded_tools=2")
    assert done.rc == 0, done
    assert desk.config.stat().st_uid == user.uid


# ----------------------------------------------------------- H-3: which names ctx tool runs


@pytest.mark.parametrize("as_user", [False, True], ids=["root", "user"])
def test_ctx_tool_refuses_every_core_tool_but_the_safe_cli_and_reads_nothing(
    desk: Desk, user: UnprivilegedUser, as_user: bool
) -> None:
    """H-3 ("runs only the allowed safe core CLIs … it MUST refuse ordinary visible tools and
    permission-bearing core tools"), docs/tools.md (only ``tsh.config``; ``fs.*``,
    ``shell.exec`` and the agent lifecycle tools would bypass both policies): as root and as
    another uid, ``ctx tool`` refuses ``fs.read``, ``fs.list``, ``fs.stat``,
    ``agent.update``, ``agent.create`` and ``tsh`` with EACCES (exit 1) naming what they are
    and ``ctx run --agent``, in ``--json`` an error object on stdout, and prints nothing the
    tool would have read.  A name nobody installed is ENOENT (exit 1)."""
    caller = user if as_user else None
    secret = desk.top / "secret.txt"
    secret.write_text("the-secret-text\n")
    secret.chmod(0o644)
    for name in ("fs.read", "fs.list", "fs.stat", "agent.update", "agent.create", "tsh"):
        kind = "an ordinary tool" if name == "tsh" else "a core tool that acts with an agent's"
        for form in ((name,), ("--json", name))[: 2 if name == "fs.read" else 1]:
            done = desk.ctx("tool", *form, str(secret), user=caller)
            no_traceback(done)
            assert done.rc == 1, done
            assert done.err.startswith(f"ctx: EACCES: {name} is {kind}"), done
            assert f"'ctx run --agent AGENT {name}'" in done.err, done
            assert "the-secret-text" not in done.out + done.err, done
            if form[0] == "--json":
                assert done.json()["error"] == "EACCES", done
    for form in (("nosuch.tool",), ("--json", "nosuch.tool")):
        missing = desk.ctx("tool", *form, user=caller)
        assert missing.rc == 1 and missing.err.startswith("ctx: ENOENT: nosuch.tool is not on"), (
            missing
        )


def test_a_tsh_config_of_a_users_tier_first_on_ctx_path_is_refused_and_never_run(
    desk: Desk,
) -> None:
    """H-3 ("NAME must still be visible on CTX_PATH"), T-4, docs/tools.md ("a tool of that
    name earlier on the path is refused (EACCES)"): a ``tsh.config`` installed the ordinary
    way into root's user tier (where the name is free) and put first by ``.tshrc`` shadows
    the core one: ``ctx tool tsh.config`` refuses naming it, in text and ``--json``, runs
    neither it nor the core CLI, and changes nothing.  With the system tier first again the
    core CLI runs."""
    ran = desk.top / "user-tier-ran"
    manifest = tool_manifest(
        desk.top / "manifests", "tsh.config", f"#!/bin/sh\ntouch {ran}\necho mine\n"
    )
    installed = desk.ctx("object", "install", manifest, "--tier", "user")
    assert installed.rc == 0, installed
    mine = desk.storage / "home" / "0" / "tool" / "tsh.config"
    (desk.home / ".tshrc").write_text(f"CTX_PATH={mine.parent}:{desk.storage}/tool\n")
    kept = desk.config.read_bytes()
    for form in (("tsh.config",), ("--json", "tsh.config")):
        done = desk.ctx("tool", *form, "cache_capacity=9")
        no_traceback(done)
        assert done.rc == 1, done
        assert done.err.startswith(f"ctx: EACCES: tsh.config on CTX_PATH is {mine}, not"), done
        assert "mine" not in done.out.split(), done
    assert not ran.exists()
    assert desk.config.read_bytes() == kept
    (desk.home / ".tshrc").write_text(f"CTX_PATH={desk.storage}/tool:{mine.parent}\n")
    done = desk.tool("cache_capacity=9")
    assert done.rc == 0 and settings(done)["cache_capacity"] == "9", done
    assert not ran.exists()
