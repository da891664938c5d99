"""The sentences lately added to the user docs, taken at their word (docs/tools.md,
docs/queue.md, docs/workers.md, docs/sessions.md, docs/policy.md, docs/mount.md and the manual
pages ctx.coreutils and ctx.root-abi): each concrete claim they make — an errno and its exit
status, the words of a message, a bound in bytes or entries, what is recorded where, what is
left behind, who may do what — is run from the outside as a demanding user would meet it: at
the bound and one past it, the second time, as another uid, with the input spelt otherwise,
through another name of the same directory.

Every test quotes the page and section it checks and runs the installed ``ctx`` (or a core
tool of a bootstrapped root, run directly as a person runs it) on a storage root of its own.

SPEC ids covered: R-1, R-2, R-5, Q-1, Q-6, §2.4, W-1, W-4, S-1, S-2, S-4, P-5, T-2, T-3, T-4,
T-6, H-4, F-1."""

from __future__ import annotations

import fcntl
import grp
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    age,
    clean_env,
    ctx_run,
    mounted_at,
    needs_fuse_as_root,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    serving,
    tool_manifest,
    wait_for,
)
from tests.acceptance.workercli import allow_in_tool_policy, make_agent, shell_job
from tests.support.users import UnprivilegedUser, run_as, system_group_with
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
WAIT = 20.0
NOBODY = UnprivilegedUser("nobody", 65534, 65534)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acts as other uids: needs root")

# ------------------------------------------------------------------------------ helpers


@pytest.fixture
def scratch() -> Iterator[Path]:
    made = new_scratch_dir(SCRATCH)
    yield made
    shutil.rmtree(made, ignore_errors=True)


def core(
    storage: Path, tool: str, *args: str, env: dict | None = None, **kw
) -> subprocess.CompletedProcess:
    """``storage/tool/TOOL ARGS`` run directly, as a person runs a core tool (no runner, no
    CTX_MOUNTS: the host filesystem is one mount ``/``)."""
    if "stdout" not in kw and "stderr" not in kw:
        kw.setdefault("capture_output", True)
    kw.setdefault("timeout", 30)
    return subprocess.run(
        [str(storage / "tool" / tool), *args],
        env=env if env is not None else clean_env(CTX_STORAGE=str(storage)),
        **kw,
    )


def err_of(done: subprocess.CompletedProcess) -> str:
    return done.stderr.decode("utf-8", "replace") if isinstance(done.stderr, bytes) else done.stderr


def on(storage: Path, *args, **kw):
    kw.setdefault("env", clean_env(CTX_STORAGE=str(storage)))
    return ctx_run(*args, **kw)


def tsh(storage: Path, script: bytes, **env: str) -> subprocess.CompletedProcess:
    """A standalone tsh reading ``script`` from a pipe (no prompt)."""
    return subprocess.run(
        [str(storage / "bin" / "tsh")],
        input=script,
        capture_output=True,
        env=clean_env(CTX_STORAGE=str(storage), **env),
        timeout=60,
    )


def install(storage: Path, directory: Path, name: str, program: str, tier: str = "system"):
    r = on(storage, "object", "install", tool_manifest(directory, name, program), "--tier", tier)
    assert r.rc == 0, r


def grant(storage: Path, agent: str, tool: str) -> None:
    """The tool layer of P-6 for ``agent`` (label ``<agent>_t``) on ``tool`` of the system
    tier; its request's ``tools`` gave it the agent layer."""
    with (storage / "tool" / f"{tool}.d" / "policy").open("a") as rules:
        rules.write(f"allow {agent}_t tool:{tool} execute\n")


def coder_allowed(storage: Path, tool: str) -> None:
    """Agent ``coder`` (label ``coder_t``) made with ``tool`` in its request and granted it
    in the tool's policy: both layers of P-6."""
    r = on(
        storage,
        "agent",
        "create",
        "-",
        input=json.dumps({"name": "coder", "label": "coder_t", "tools": [tool]}),
    )
    assert r.rc == 0, r
    grant(storage, "coder", tool)


def events(storage: Path, uid: int, agent: str, session: str) -> list[dict]:
    return read_jsonl(
        storage / "home" / str(uid) / "agent" / agent / "session" / session / "events.jsonl"
    )


def publish(storage: Path, project: str, req: dict, name: str) -> str:
    r = on(
        storage,
        "queue",
        "publish",
        "--project",
        project,
        "--name",
        name,
        "-",
        input=json.dumps(req),
    )
    assert r.rc == 0, r
    return r.out.strip()


# -------------------------------------------------- docs/tools.md: the core tools (R-5, T-2)


def test_fs_read_and_fs_write_refuse_a_fifo_and_a_device_without_opening_them(
    storage: Path, scratch: Path
):
    """docs/tools.md "The core tools", paths: "``fs.read`` or ``fs.write`` of a directory is
    ``EISDIR`` …; of a FIFO, a socket or a device, ``EINVAL`` (neither opens one)".  A FIFO
    with no writer would hold an open for ever; the refusal comes at once, exit 1, and the FIFO
    is still a FIFO, nothing written into it."""
    fifo = scratch / "pipe"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/null", "/dev/zero"):
        read = core(storage, "fs.read", path, timeout=10)
        assert read.returncode == 1 and read.stdout == b"", (path, read)
        assert err_of(read).startswith("fs.read: EINVAL: "), (path, read)
        wrote = core(storage, "fs.write", json.dumps({"path": path, "content": "x"}), timeout=10)
        assert wrote.returncode == 1, (path, wrote)
        assert err_of(wrote).startswith("fs.write: EINVAL: "), (path, wrote)
        assert "nothing was written" in err_of(wrote), wrote
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert os.listdir(scratch) == ["pipe"]


def test_fs_read_of_a_socket_is_einval_and_with_a_slash_enotdir(storage: Path, scratch: Path):
    """docs/tools.md "The core tools", paths: "a path ending in ``/`` names a directory …:
    ``a.txt/`` is ``ENOTDIR``, and ``fs.read`` or ``fs.write`` of a directory is ``EISDIR``
    …; of a FIFO, a socket or a device, ``EINVAL`` (neither opens one)".  fs.write and fs.stat
    already treat a socket so; fs.read of the same socket, with and without the slash, must
    too, in both modes."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(scratch / "sock"))
    listener.listen(1)
    try:
        wrote = core(storage, "fs.write", json.dumps({"path": f"{scratch}/sock", "content": "x"}))
        assert err_of(wrote).startswith("fs.write: EINVAL: "), wrote  # the writer's words
        plain = core(storage, "fs.read", f"{scratch}/sock")
        native = core(
            storage,
            "fs.read",
            json.dumps({"path": f"{scratch}/sock"}),
            env=clean_env(CTX_STORAGE=str(storage), CTX_MODE="native"),
        )
        slash = core(storage, "fs.read", json.dumps({"path": f"{scratch}/sock/"}))
    finally:
        listener.close()
    assert plain.returncode == 1 and err_of(plain).startswith("fs.read: EINVAL: "), plain
    assert native.returncode == 1 and json.loads(native.stdout)["error"] == "EINVAL", native
    assert slash.returncode == 1 and err_of(slash).startswith("fs.read: ENOTDIR: "), slash


def test_fs_write_writes_every_legal_name_length_and_leaves_no_temporary(
    storage: Path, scratch: Path
):
    """docs/tools.md "The core tools": "The temporary file is named ``.NAME.<random>.tmp``, or
    ``.fs.write.<random>.tmp`` where that would pass the 255 bytes a name may hold, so every
    legal name can be written"; "``overwrite: false`` never replaces: ``EEXIST``".  Names of
    238, 254 and 255 bytes (ASCII and two-byte characters) are written, read back whole, and
    the directory holds nothing else afterwards, a refused second write included."""
    names = ["a" * 238, "b" * 254, "c" * 255, "é" * 127 + "d"]  # the last: 255 bytes in UTF-8
    for name in names:
        done = core(storage, "fs.write", json.dumps({"path": f"{scratch}/{name}", "content": name}))
        assert done.returncode == 0, (len(name.encode()), done)
        assert (scratch / name).read_text() == name
    again = core(
        storage,
        "fs.write",
        json.dumps({"path": f"{scratch}/{names[2]}", "content": "new", "overwrite": False}),
    )
    assert again.returncode == 1 and err_of(again).startswith("fs.write: EEXIST: "), again
    assert (scratch / names[2]).read_text() == names[2]
    assert sorted(os.listdir(scratch)) == sorted(names)


def test_fs_read_takes_an_offset_up_to_2_63_minus_1_and_refuses_2_63(storage: Path, scratch: Path):
    """docs/tools.md, the core tools' table: ``fs.read`` takes "``offset`` (≤ 2⁶³ − 1)"; a
    failure for bad input "exits … 2".  At the bound the read is empty and not truncated; one
    past it is ``EINVAL``, exit 2; a range that ends past the bound is cut to it."""
    target = scratch / "a.txt"
    target.write_text("hello")
    native = clean_env(CTX_STORAGE=str(storage), CTX_MODE="native")
    for offset, length in ((2**63 - 1, None), (2**63 - 2, 100)):
        request = {"path": str(target), "offset": offset}
        if length is not None:
            request["length"] = length
        done = core(storage, "fs.read", json.dumps(request), env=native)
        assert done.returncode == 0, done
        answer = json.loads(done.stdout)
        assert (answer["offset"], answer["content"], answer["truncated"]) == (offset, "", False)
        assert answer["size"] == 5
    for offset in (2**63, -1):
        done = core(storage, "fs.read", json.dumps({"path": str(target), "offset": offset}))
        assert done.returncode == 2 and done.stdout == b"", done
        assert err_of(done).startswith(
            "fs.read: EINVAL: offset must be from 0 to 9223372036854775807"
        )


def test_a_core_tools_output_ends_as_a_ctx_commands_does(storage: Path, scratch: Path):
    """docs/tools.md "The core tools": "Its output ends as a ``ctx`` command's does: a reader
    that left (``fs.read F | head -c 10``) ends it with 141, quietly; an output that cannot be
    written (``> /dev/full``) with ``<tool>: ENOSPC: cannot write standard output (…)`` on
    stderr and 74"."""
    big = scratch / "big.txt"
    big.write_text("0123456789abcdef\n" * 40000)  # far more than a pipe holds
    reader = subprocess.Popen(
        [str(storage / "tool" / "fs.read"), str(big)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(CTX_STORAGE=str(storage)),
    )
    assert reader.stdout.read(10) == b"0123456789"
    reader.stdout.close()
    said = reader.stderr.read()
    reader.wait(timeout=30)
    assert reader.returncode in (141, -signal.SIGPIPE) and said == b"", (reader.returncode, said)
    for tool, arg in (
        ("fs.read", str(big)),
        ("fs.list", str(scratch)),
        ("fs.stat", str(big)),
        ("tsh.config", None),
    ):
        with open("/dev/full", "wb") as full:
            done = core(storage, tool, *([arg] if arg else []), stdout=full, stderr=subprocess.PIPE)
        assert done.returncode == 74, (tool, done)
        assert err_of(done).startswith(f"{tool}: ENOSPC: cannot write standard output ("), done
        assert "Traceback" not in err_of(done)


def test_shell_exec_gives_sigpipe_and_sigxfsz_back_their_defaults(storage: Path, scratch: Path):
    """docs/tools.md "The core tools": "The command gets SIGPIPE and SIGXFSZ at their
    defaults, as a shell gives them: ``yes | head -1`` ends at once, and ``shell.exec`` whose
    reader left ends with 141, quietly" — also when whatever started it had both ignored
    (Python ignores SIGPIPE; an ignored disposition survives ``exec``)."""

    def ignoring() -> None:
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    def shell(cmd: str) -> subprocess.CompletedProcess:
        return core(storage, "shell.exec", cmd, cwd=scratch, preexec_fn=ignoring,
                    restore_signals=False, timeout=20)  # fmt: skip

    started = time.monotonic()
    done = shell("yes | head -1")
    assert (done.returncode, done.stdout) == (0, b"y\n"), done
    assert time.monotonic() - started < 15
    # ulimit -f 1 is 512 bytes: past it the writer is killed by SIGXFSZ (128 + 25).
    done = shell("ulimit -f 1; head -c 4096 /dev/zero > big; echo status=$?")
    assert done.stdout == b"status=153\n", done
    # Its own reader gone, shell.exec ends with 141 and says nothing.
    proc = subprocess.Popen(
        [str(storage / "tool" / "shell.exec"), "yes"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(CTX_STORAGE=str(storage)),
        preexec_fn=ignoring,
        restore_signals=False,
    )
    assert proc.stdout.read(4) == b"y\ny\n"
    proc.stdout.close()
    said = proc.stderr.read()
    proc.wait(timeout=20)
    assert proc.returncode in (141, -signal.SIGPIPE) and said == b"", (proc.returncode, said)


def test_fs_list_shows_names_as_ls_b_does(storage: Path, scratch: Path):
    """ctx.coreutils "fs.list": "Terminal output: one name per line, ``/`` after a directory,
    ``@`` after a symbolic link; as ``ls -b`` shows names, each byte of a character that is not
    printable (a line break, an escape) is ``\\xHH`` and a backslash is ``\\\\``, while bytes
    that are not UTF-8 are written as they are"."""
    top = os.fsencode(scratch)
    for name in (b"nl\nx", b"esc\x1bx", b"back\\slash", b"caf\xe9", "ls\u2028x".encode()):
        open(os.path.join(top, name), "w").close()
    os.mkdir(os.path.join(top, b"dir\x1b"))
    os.symlink("nowhere", os.path.join(top, b"lnk\\"))
    done = core(storage, "fs.list", str(scratch))
    assert done.returncode == 0, done
    assert done.stdout.split(b"\n") == [
        b"back\\\\slash",
        b"caf\xe9",
        b"dir\\x1b/",
        b"esc\\x1bx",
        b"lnk\\\\@",
        b"ls\\xe2\\x80\\xa8x",
        b"nl\\x0ax",
        b"",
    ], done.stdout


# ------------------------------------------------------ docs/tools.md: tsh and tsh.config


def test_tsh_comment_lines_leave_the_last_status_as_it_was(storage: Path):
    """docs/tools.md, tsh: "a line whose first word starts with an unquoted ``#`` is a
    comment, which leaves ``$?`` as it was" — an indented one too; a quoted ``"#"`` is a word
    like any other, looked up as a tool."""
    done = tsh(storage, b"nosuch\n# a note\n   #indented note\n#!not a shebang\nexit\n")
    assert done.returncode == 127, done
    assert err_of(done).count("not a tool on CTX_PATH") == 1, done
    done = tsh(storage, b'"#" quoted\nexit\n')
    assert done.returncode == 127 and "tsh: #: not a tool on CTX_PATH" in err_of(done), done
    done = tsh(storage, b"# only a note\nexit\n")
    assert (done.returncode, done.stderr) == (0, b""), done


def test_tsh_bounds_a_line_in_bytes_and_cuts_a_named_word_at_256_characters(storage: Path):
    """docs/tools.md, tsh: "a line … reaches tsh whole, up to 1 MiB (1048576 bytes, however
    many characters, the line break not counted; longer: ``E2BIG``, status 2, nothing run; so
    is a longer line read from a pipe …).  A message naming a word typed cuts it past 256
    characters, saying how long it was"."""
    word = "é" * (1024 * 1024 // 2)  # 524288 characters, 1048576 bytes
    done = tsh(storage, word.encode() + b"\nexit 7\n")
    said = err_of(done)
    assert done.returncode == 7 and "E2BIG" not in said, said[-300:]
    assert said.startswith("tsh: " + "é" * 256 + "…"), said[:600]
    assert "é" * 257 not in said and "(524288 characters)" in said, said[-300:]
    done = tsh(storage, word.encode() + b"x\nexit\n")
    assert done.returncode == 2, err_of(done)[-300:]
    assert err_of(done).startswith("tsh: E2BIG: "), err_of(done)[:300]
    assert "é" not in err_of(done)


def test_tsh_config_takes_a_string_of_ascii_digits_as_its_number_and_nothing_else(storage: Path):
    """docs/tools.md, tsh.config: an update's values are "positive integers — in JSON a number,
    or a string of decimal digits, taken as the number it spells as a ``key=value`` word is
    —", validated whole before anything is written (``EINVAL``, exit 2, "not one setting
    changes"); "a value of more digits than any setting needs (leading zeros not counted:
    ``0008`` is 8, however many zeros)"."""
    config = storage / "tool" / "tsh.d" / "config"
    done = core(storage, "tsh.config", json.dumps({"set": {"cache_capacity": "0064"}}))
    assert done.returncode == 0, done
    assert "cache_capacity=64" in config.read_text().splitlines()
    before = config.read_bytes()
    for spelt in ("6_4", "\u0666\u0664", "\uff16\uff14", "+64", " 64", "64 ", "0x40", ""):
        done = core(
            storage,
            "tsh.config",
            json.dumps({"set": {"cache_capacity": spelt, "window_percent": 2}}),
        )
        assert done.returncode == 2, (spelt, done)
        assert err_of(done).startswith("tsh.config: EINVAL: cache_capacity"), (spelt, done)
        if spelt.strip() == spelt:  # a word's value is trimmed, as a line of the file is
            done = core(storage, "tsh.config", f"cache_capacity={spelt}", "window_percent=2")
            assert done.returncode == 2, (spelt, done)
        assert config.read_bytes() == before, spelt
    config.write_text("max_loaded_tools=64\ncache_capacity=" + "0" * 60 + "8\nwindow_percent=1\n")
    done = core(storage, "tsh.config", env=clean_env(CTX_STORAGE=str(storage), CTX_MODE="native"))
    answer = json.loads(done.stdout)
    assert answer["config"]["cache_capacity"] == 8 and answer["warnings"] == [], answer


def test_a_tshrc_of_64_kib_is_read_and_one_byte_more_is_refused(storage: Path, scratch: Path):
    """docs/tools.md "Where the path comes from": a ``.tshrc`` is refused when it cannot be
    used, "so is a ``.tshrc`` over 64 KiB … — ``ctx`` exits with ``EINVAL`` or ``EPERM`` and
    what to do, a standalone tsh warns once and takes ``$CTX_PATH`` or the default instead"."""
    home, first, second = scratch / "home", scratch / "first", scratch / "second"
    for directory in (home, first, second):
        directory.mkdir()
    for directory in (first, second):
        (directory / "probe").write_text("#!/bin/sh\n")
        (directory / "probe").chmod(0o755)
    line = f"CTX_PATH={first}\n".encode()

    def tshrc(size: int) -> None:
        (home / ".tshrc").write_bytes(b"#" * (size - len(line) - 1) + b"\n" + line)
        assert (home / ".tshrc").stat().st_size == size

    env = clean_env(CTX_STORAGE=str(storage), CTX_HOME=str(home), CTX_PATH=str(second))
    tshrc(65536)
    found = ctx_run("object", "which", "probe", env=env)
    assert (found.rc, found.out) == (0, f"{first}/probe\n"), found
    tshrc(65537)
    found = ctx_run("object", "which", "probe", env=env)
    assert found.rc == 1 and found.out == "", found
    assert found.err.startswith("ctx: EINVAL: ") and "larger than 65536 bytes" in found.err, found
    done = tsh(storage, b"which probe\nwhich probe\n", CTX_HOME=str(home), CTX_PATH=str(second))
    assert done.returncode == 0 and done.stdout.decode() == f"{second}/probe\n" * 2, done
    warnings = [w for w in err_of(done).splitlines() if w.startswith("tsh: warning:")]
    assert len(warnings) == 1 and "65536" in warnings[0], done


def test_a_name_found_nowhere_names_16_entries_of_the_path_and_how_many_more(
    storage: Path, scratch: Path
):
    """docs/tools.md "Where the path comes from": "A name found nowhere is ``ENOENT`` naming
    the first 16 entries of the path (and how many more) and what was passed over"."""
    entries = [scratch / f"d{n:02d}" for n in range(1, 18)]
    for directory in entries:
        directory.mkdir()
    (entries[2] / "probe").write_text("#!/bin/sh\n")  # not executable: passed over
    for count, more in ((16, None), (17, "and 1 more")):
        path = ":".join(map(str, entries[:count]))
        env = clean_env(CTX_STORAGE=str(storage), CTX_PATH=path)
        found = ctx_run("object", "which", "probe", env=env)
        assert found.rc == 1 and found.err.startswith("ctx: ENOENT: "), found
        assert all(str(d) in found.err for d in entries[:16]), found
        assert str(entries[16]) not in found.err, found
        assert (more in found.err) if more else (" more)" not in found.err), found
        assert f"{entries[2]}/probe: not executable" in found.err, found


# --------------------------------------------------------- ctx.root-abi: the storage root


def test_storage_given_before_and_after_the_command_must_name_one_root(
    storage: Path, tmp_path: Path
):
    """ctx.root-abi "Storage root": "given both ways, the two must name the same root, else the
    command is a usage error (``EINVAL``, exit 2) that acts on neither"; the same root spelt
    otherwise (a trailing slash, a ``..``) is that root."""
    other = tmp_path / "other"
    other.mkdir()
    refused = ctx_run("--storage", storage, "shared", "create", "sp1", "--storage", other)
    assert refused.rc == 2 and refused.err.startswith("ctx: EINVAL: "), refused
    assert "two storage roots" in refused.err, refused
    assert not (storage / "shared" / "sp1").exists() and os.listdir(other) == []
    for spelt in (f"{storage}/", f"{storage}/../{storage.name}"):
        made = ctx_run("--storage", storage, "shared", "create", "sp2", "--storage", spelt)
        assert made.rc == 0, (spelt, made)
        assert (storage / "shared" / "sp2" / "queue" / "pending").is_dir()


# ---------------------------------------------------------------- docs/queue.md


def test_created_with_any_unicode_blank_around_it_is_refused_and_a_legal_one_kept_as_written(
    queue: QueueCLI,
):
    """docs/queue.md "The request": "a ``created`` given must be an RFC 3339 timestamp with a
    zone and nothing around it — no blank, no line break —, kept as written" (Q-1, §2.1).
    Blanks beyond ASCII (a no-break space, a line separator, an ideographic space, a file
    separator) are blanks too; a lower-case ``t``/``z``, a leap second and ``-00:00`` are RFC
    3339, stored byte for byte."""
    for n, blank in enumerate(("\u00a0", "\u2028", "\u3000", "\u001c", "\u0085", "\u000b")):
        stamp = f"2026-06-22T12:00:00Z{blank}" if n % 2 else f"{blank}2026-06-22T12:00:00Z"
        r = queue.run(
            "publish", "-", input=json.dumps({"tool": "x", "input": {}, "created": stamp})
        )
        assert r.rc == 1 and r.out == "", (stamp, r)
        assert r.err.startswith("ctx: EINVAL: ") and "created" in r.err, (stamp, r)
    assert queue.entries("pending") == set() and queue.entries("inbox") == set()
    for n, stamp in enumerate(("2026-06-30t23:59:60z", "2026-06-22T12:00:00.5-00:00")):
        job = queue.publish({"tool": "x", "input": {}, "created": stamp}, name=f"ok{n}")
        stored = json.loads((queue.dir / "pending" / job).read_text())
        assert stored["created"] == stamp, stored


def test_every_regular_file_in_inbox_is_a_temp_removed_once_the_grace_has_passed(
    queue: QueueCLI,
):
    """docs/queue.md "What is not a job (Q-8)": "every regular file in it, at whatever name (a
    README or a dot-file too), is a temp file, which ``recover --reconcile`` removes once the
    grace period has passed"; an entry at a staging name that is not a regular file counts as
    a temp too; "A directory … is only listed as ignored"."""
    inbox = queue.dir / "inbox"
    for name in ("README", ".hidden", "pending", "x.req.json"):
        (inbox / name).write_text("left by hand\n")
    os.mkfifo(inbox / "y.req.json.publish.tmp")
    (inbox / "keep.d").mkdir()
    for entry in inbox.iterdir():
        age(entry, 120)
    status = queue.run("status", "--json")
    temps = {t["path"] for t in status.json()["temps"]}
    assert temps == {f"inbox/{n}" for n in ("README", ".hidden", "pending", "x.req.json",
                                           "y.req.json.publish.tmp")}, status  # fmt: skip
    assert [i["path"] for i in status.json()["ignored"]] == ["inbox/keep.d"], status
    young = queue.run("recover", "--reconcile", "--grace", "600", "--json")
    assert young.rc == 0 and young.json()["removed_temps"] == [], young
    assert len(os.listdir(inbox)) == 6
    old = queue.run("recover", "--reconcile", "--grace", "60", "--json")
    assert old.rc == 0 and old.json()["consistent"] is True, old
    assert len(old.json()["removed_temps"]) == 5, old
    assert os.listdir(inbox) == ["keep.d"]


def test_recover_waits_for_a_readers_look_and_leaves_a_transitions_job_alone(queue: QueueCLI):
    """docs/queue.md "Command line": "a reader's shared lock keeps no transition and no
    ``recover`` from J — they wait the moment of its look (``recover`` up to 10 s, then leaves
    J untouched for this run, as for a transition) —, and one whose lock a transition holds is
    reported … ``claimed``, "a claim, finish or recover is moving it""; Q-6: a claim without
    its lease goes back to pending."""

    def unleased(name: str) -> tuple[str, int]:
        job = f"{name}.req.json"
        (queue.dir / "claimed" / job).mkdir()
        (queue.dir / "claimed" / job / job).write_text('{"tool": "x", "input": {}}')
        return job, os.open(queue.dir / "claimed" / job, os.O_RDONLY | os.O_DIRECTORY)

    looked, reader = unleased("looked")
    fcntl.flock(reader, fcntl.LOCK_SH)
    letting_go = threading.Timer(1.0, os.close, (reader,))
    letting_go.start()
    started = time.monotonic()
    recovered = queue.run("recover", "--reconcile", "--json")
    letting_go.join()
    assert recovered.rc == 0 and time.monotonic() - started >= 0.9, recovered
    assert [r["job"] for r in recovered.json()["repaired"]] == [looked], recovered
    assert queue.entries("pending") == {looked} and queue.entries("claimed") == set()

    moving, transition = unleased("moving")
    fcntl.flock(transition, fcntl.LOCK_EX)
    try:
        shown = queue.run("show", moving, "--json")
        assert shown.rc == 0 and shown.json()["state"] == "claimed", shown
        assert "a claim, finish or recover is moving it" in shown.json()["detail"], shown
        started = time.monotonic()
        recovered = queue.run("recover", "--reconcile", "--json")
        assert time.monotonic() - started < 8 and recovered.json()["repaired"] == [], recovered
        assert [u["job"] for u in recovered.json()["untouched"]] == [moving], recovered
        assert (queue.dir / "claimed" / moving / moving).is_file()
    finally:
        os.close(transition)


# ----------------------------------------------------- docs/workers.md (W-1, W-4, S-2)


@pytest.fixture
def worker_root(searchable_storage: Path) -> Path:
    """A root whose agent ``ci`` (uid nobody) may run shell.exec, with a queue ``proj``."""
    make_agent(searchable_storage, ["shell.exec"])
    allow_in_tool_policy(searchable_storage, "shell.exec")
    return searchable_storage


def work(root: Path, where: list[str], *args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [*CTX_ARGV, "queue", "work", *where, "--agent", "ci", *args],
        env=env or clean_env(CTX_STORAGE=str(root)),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def queue_events(root: Path, session: str) -> list[dict]:
    return [e for e in events(root, 65534, "ci", session) if e["type"].startswith("queue.")]


def test_worker_records_name_the_job_and_its_queue_and_a_result_keeps_failed_post_hooks(
    worker_root: Path,
):
    """docs/workers.md: the worker's session "records ``queue.claim``, ``queue.start`` and
    ``queue.finish`` for each job (its ``object`` is the job as its queue names it,
    ``queue/J``, and ``queue`` the queue's path from the storage root,
    ``shared/<project>/queue``…), next to the runner's ``tool_call`` / ``tool_result`` (whose
    ``tool_call`` names the job: ``job``)"; the result holds "the post-hooks that exited
    non-zero (``post_hooks`` …: they change nothing)".  The queue named by its project and by
    its absolute path is one queue."""
    post = worker_root / "tool" / "shell.exec.d" / "hooks" / "post.d" / "10-grumble"
    post.parent.mkdir(parents=True, exist_ok=True)
    post.write_text("#!/bin/sh\necho 'grumbling' >&2\nexit 3\n")
    post.chmod(0o755)
    qdir = worker_root / "shared" / "proj" / "queue"
    for session, where in (("byname", ["--project", "proj"]), ("bypath", ["--project", str(qdir)])):
        job = publish(worker_root, "proj", shell_job("echo hi"), session)
        proc = work(worker_root, where, "--drain", "--session", session)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, (out, err)
        recorded = queue_events(worker_root, session)
        assert [e["type"] for e in recorded] == ["queue.claim", "queue.start", "queue.finish"]
        assert {(e["object"], e["queue"]) for e in recorded} == {
            (f"queue/{job}", "shared/proj/queue")
        }
        calls = [e for e in events(worker_root, 65534, "ci", session) if e["type"] == "tool_call"]
        assert [c.get("job") for c in calls] == [job], calls
        result = json.loads((qdir / "done" / f"{job}.result").read_text())
        assert result["status"] == "ok" and result["output"] == "hi\n", result
        assert [(h["hook"], h["exit_status"]) for h in result["post_hooks"]] == [
            ("hooks/post.d/10-grumble", 3)
        ], result


def test_worker_records_the_queue_from_the_root_when_named_through_a_link_to_it(
    worker_root: Path,
):
    """docs/workers.md: ``queue`` is "the queue's path from the storage root,
    ``shared/<project>/queue``: one agent's workers of two projects are told apart".  The
    queue named through ``current`` -> the root (the layout docs/queue.md calls
    ``storage/current`` -> a release), which ``ctx queue init`` itself judges to lie inside the
    root (R-2), is still ``shared/proj/queue``."""
    link = worker_root.parent / "current"
    link.symlink_to(worker_root)
    job = publish(worker_root, "proj", shell_job("echo hi"), "vialink")
    proc = work(
        worker_root, ["--project", f"{link}/shared/proj/queue"], "--drain", "--session", "vialink"
    )
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (out, err)
    recorded = queue_events(worker_root, "vialink")
    assert len(recorded) == 3 and {e["object"] for e in recorded} == {f"queue/{job}"}, recorded
    assert {e["queue"] for e in recorded} == {"shared/proj/queue"}, recorded


def test_a_worker_stops_with_estale_when_its_project_is_made_again(worker_root: Path):
    """docs/workers.md "A host that runs short": "A worker … whose queue's path does [name
    another directory] (its project removed, perhaps made again), stops before its next claim
    (``ESTALE``, or ``ENOENT`` when nothing is there), the job left pending"."""
    shared = worker_root / "shared"
    assert on(worker_root, "queue", "init", "--project", "next").rc == 0
    job = publish(worker_root, "next", shell_job("echo again"), "after")
    proc = work(worker_root, ["--project", "proj"], "--json")
    try:
        assert json.loads(proc.stdout.readline())["event"] == "start"
        os.rename(shared / "proj", shared / "proj-old")  # then at once, the new project
        os.rename(shared / "next", shared / "proj")
        out, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, (out, err)
    assert err.startswith(("ctx: ESTALE: ", "ctx: ENOENT: ")), err
    assert "the worker claims no more jobs from it; start it again" in err, err
    stop = [json.loads(line) for line in out.splitlines() if '"stop"' in line]
    assert stop and stop[0]["stopped_by"] == "failure" and stop[0]["done"] == 0, out
    assert os.listdir(worker_root / "shared" / "proj" / "queue" / "pending") == [job]
    assert os.listdir(worker_root / "shared" / "proj-old" / "queue" / "claimed") == []


def test_a_second_ctrl_c_names_the_jobs_left_claimed_which_recover_then_requeues(
    worker_root: Path,
):
    """docs/workers.md "Stopping": a second ^C aborts: "running tools are killed, the worker
    exits 130 …  The jobs left claimed are named on stderr (``ctx: note: left claimed, as the
    worker was aborted before their tools ended: J; 'ctx queue recover' requeues them once
    this worker has exited, and they run again``) and in the ``stop`` event's
    ``left_claimed``"."""
    jobs = [publish(worker_root, "proj", shell_job("sleep 60"), f"long{n}") for n in (1, 2)]
    proc = work(worker_root, ["--project", "proj"], "--json", "--concurrency", "2")
    try:
        claimed = set()
        while len(claimed) < 2:
            event = json.loads(proc.stdout.readline())
            if event["event"] == "claim":
                claimed.add(event["job"])
        proc.send_signal(signal.SIGINT)
        assert json.loads(proc.stdout.readline())["event"] == "interrupt"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, (out, err)
    stop = json.loads(out.splitlines()[-1])
    assert stop["event"] == "stop" and stop["aborted"] is True, out
    assert sorted(stop["left_claimed"]) == sorted(jobs), stop
    notes = [line for line in err.splitlines() if "left claimed" in line]
    assert len(notes) == 1 and all(j in notes[0] for j in jobs), err
    assert notes[0].startswith("ctx: note: ") and "'ctx queue recover --project proj'" in notes[0]
    recovered = on(worker_root, "queue", "recover", "--project", "proj", "--json")
    assert recovered.rc == 0 and sorted(r["job"] for r in recovered.json()["requeued"]) == sorted(
        jobs
    )
    assert sorted(os.listdir(worker_root / "shared" / "proj" / "queue" / "pending")) == sorted(jobs)


# ------------------------------------------------------------- docs/sessions.md (S-1, P-5)


@pytest.fixture
def owned_root(searchable_storage: Path, unprivileged_user: UnprivilegedUser) -> Path:
    """The root handed to ``unprivileged_user`` (its storage owner, not root), holding agent
    ``porter`` (uid nobody, made by root) and agent ``mine`` (the owner's own uid), both
    granted fs.stat; ``home/`` stays root's, as root laid it out."""
    root = searchable_storage
    for name, user in (("porter", []), ("mine", ["--user", unprivileged_user.name])):
        r = on(
            root,
            "agent",
            "create",
            "-",
            *user,
            input=json.dumps({"name": name, "label": f"{name}_t", "tools": ["fs.stat"]}),
        )
        assert r.rc == 0, r
        grant(root, name, "fs.stat")
    for dirpath, dirnames, filenames in os.walk(root):
        for entry in (dirpath, *(os.path.join(dirpath, n) for n in filenames + dirnames)):
            os.lchown(entry, unprivileged_user.uid, unprivileged_user.gid)
    os.chown(root / "home", 0, 0)
    return root


@needs_root
def test_a_storage_owner_calling_an_agent_of_another_uid_is_refused_at_step_1_making_nothing(
    owned_root: Path, unprivileged_user: UnprivilegedUser
):
    """docs/sessions.md: "A storage owner who is not root keeps its own uid, so its call of an
    agent root gave another uid is refused at step 1 of the chain (``EACCES: step 1 (peer
    credentials): the caller is uid 1001 gid 1001, but agent 'porter' is uid 1002 gid 1002;
    only root may start a process as another uid: …``, stage ``authorize``, exit 126) before
    anything is made"; docs/tools.md: "no session, no log line"."""
    log = owned_root / "tool" / "fs.stat.d" / "log"
    before = log.read_bytes()
    argv = [*CTX_ARGV, "run", "--storage", str(owned_root), "--agent", "porter"]
    done = run_as(unprivileged_user, [*argv, "fs.stat", "/ctx"], cwd=owned_root, env=clean_env())
    u = unprivileged_user
    assert done.returncode == 126 and done.stdout == "", done
    assert done.stderr.startswith(
        f"ctx: EACCES: step 1 (peer credentials): the caller is uid {u.uid} gid {u.gid}, but "
        "agent 'porter' is uid 65534 gid 65534; only root may start a process as another uid"
    ), done
    native = run_as(u, [*argv, "--native", "fs.stat"], cwd=owned_root, env=clean_env(),
                    stdin='{"path": "/ctx"}')  # fmt: skip
    frame = json.loads(native.stdout.splitlines()[-1])
    assert native.returncode == 1 and frame["error"]["stage"] == "authorize", native
    assert frame["error"]["step"] == 1 and frame["error"]["error"] == "EACCES", frame
    assert os.listdir(owned_root / "home") == [] and log.read_bytes() == before


@needs_root
def test_a_storage_owner_may_not_make_a_home_below_a_home_directory_root_owns(
    owned_root: Path, unprivileged_user: UnprivilegedUser
):
    """docs/sessions.md: "Nor may such an owner make a home below a ``home/`` it does not own
    …: ``ctx run`` then exits 126 with ``EACCES: cannot open the session
    ROOT/home/<uid>/agent/<agent>/session/<session> (…); the tool did not run: … run it as
    root, or create ROOT/home/<uid> owned by uid <uid> first, then make the call again``
    … Nothing is made"."""
    u = unprivileged_user
    done = run_as(u, [*CTX_ARGV, "run", "--storage", str(owned_root), "--agent", "mine",
                      "fs.stat", "/ctx"], cwd=owned_root, env=clean_env())  # fmt: skip
    assert done.returncode == 126 and done.stdout == "", done
    home = f"{owned_root}/home/{u.uid}"
    assert done.stderr.startswith(
        f"ctx: EACCES: cannot open the session {home}/agent/mine/session/default ("
    ), done
    assert "the tool did not run" in done.stderr, done
    assert f"create {home} owned by uid {u.uid} first, then make the call again" in done.stderr
    assert os.listdir(owned_root / "home") == []


def test_uid_and_project_together_are_a_usage_error_for_every_session_command(
    worker_root: Path,
):
    """docs/sessions.md "Command line": "``--uid`` names a home, ``--project`` a space: both
    at once is ``EINVAL``, exit 2" — for each command that takes both, with ``--json`` the
    error object too, and whatever sessions there are in either place."""
    publish(worker_root, "proj", shell_job("true"), "one")
    assert on(worker_root, "queue", "work", "--project", "proj", "--agent", "ci", "--drain").rc == 0
    before = (worker_root / "home" / "65534" / "agent" / "ci" / "session" / "worker").stat()
    for command in (["list", "ci"], ["show", "ci", "worker"], ["tail", "ci", "worker"],
                    ["repair", "ci", "worker"]):  # fmt: skip
        for extra in ((), ("--json",)):
            r = on(worker_root, "session", *command, "--uid", "65534", "--project", "proj", *extra)
            assert r.rc == 2 and r.err.startswith("ctx: EINVAL: "), (command, r)
            assert "--project proj" in r.err and "--uid 65534" in r.err, r
            assert json.loads(r.out)["error"] == "EINVAL" if extra else r.out == "", r
    after = (worker_root / "home" / "65534" / "agent" / "ci" / "session" / "worker").stat()
    assert (after.st_mtime_ns, after.st_ino) == (before.st_mtime_ns, before.st_ino)


@needs_root
def test_hooks_are_given_the_input_and_argv_whole_while_the_records_keep_the_summary(
    searchable_storage: Path, outbox: Path, scratch: Path
):
    """docs/tools.md "Hooks": "``input`` and ``argv`` are whole, as the tool gets them, not the
    summary the records keep (strings cut at 200 characters, secrets redacted)"; the records
    (docs/sessions.md, S-4) keep the summary: the secret gone, the long string cut."""
    root = searchable_storage
    install(root, scratch, "keep", "#!/bin/sh\ncat >/dev/null\necho '{}'\n")
    make_agent(root, ["keep"], name="hk")
    grant(root, "hk", "keep")
    hook = root / "tool" / "keep.d" / "hooks" / "pre.d" / "10-look"
    hook.write_text(f'#!/bin/sh\ncat > "{outbox}/hook.$$.json"\n')
    hook.chmod(0o755)
    long = "L" * 500
    terminal = on(root, "run", "--agent", "hk", "keep", "--password", "hunter22", long)
    assert terminal.rc == 0, terminal
    native = on(root, "run", "--native", "--agent", "hk", "keep",
                input=json.dumps({"api_token": "tok-abcdef", "note": long}))  # fmt: skip
    assert native.rc == 0, native
    seen = [json.loads(p.read_text()) for p in sorted(outbox.iterdir(), key=os.path.getmtime)]
    assert [s["mode"] for s in seen] == ["terminal", "native"], seen
    assert seen[0]["argv"] == ["--password", "hunter22", long], seen[0]
    assert seen[1]["input"] == {"api_token": "tok-abcdef", "note": long}, seen[1]
    calls = [e for e in events(root, 65534, "hk", "default") if e["type"] == "tool_call"]
    text = json.dumps(calls)
    assert "hunter22" not in text and "tok-abcdef" not in text and long not in text, calls


# ------------------------------------------------------------------- docs/policy.md (P-5)


@needs_root
def test_explain_asked_by_a_user_who_may_not_enter_a_space_on_the_path_gives_no_verdict(
    searchable_storage: Path, scratch: Path, unprivileged_user: UnprivilegedUser
):
    """docs/policy.md "The chain": "``ctx policy explain`` run by another user may be refused
    what the agent may read …  It then gives no verdict but exits 1 naming what that user may
    not enter: ``ctx: EACCES: cannot judge whether agent 'coder' may execute tool:probe: uid
    1003 may not enter ROOT/shared/team (…)``…  So too when the agent's ``CTX_PATH`` holds,
    before the tool's directory, one that user may not enter".  Root, and the agent's own uid,
    get the verdict."""
    root, u = searchable_storage, unprivileged_user
    team = system_group_with("ctxrdc-team", [])
    assert on(root, "shared", "create", "team", "--group", "ctxrdc-team").rc == 0
    assert on(root, "shared", "create", "zeta", "--group", grp.getgrgid(u.gid).gr_name).rc == 0
    install(root, scratch, "probe", "#!/bin/sh\necho '{}'\n", tier="shared:zeta")
    request = {
        "name": "pz",
        "label": "pz_t",
        "tools": ["probe"],
        "shared": {"team": "read", "zeta": "read"},
    }
    made = on(
        root, "agent", "create", "-", "--groups", f"{team},{u.gid}", input=json.dumps(request)
    )
    assert made.rc == 0, made
    with open(root / "shared" / "zeta" / "tool" / "probe.d" / "policy", "a") as policy:
        policy.write("allow pz_t tool:probe execute\n")
    argv = [*CTX_ARGV, "policy", "explain", "--storage", str(root), "pz", "tool:probe", "execute"]
    as_root = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert as_root.returncode == 0 and as_root.stdout.splitlines()[-1] == "allow", as_root
    as_agent = run_as(NOBODY, argv, [team, u.gid], cwd=root, env=clean_env())
    assert as_agent.returncode == 0 and as_agent.stdout.splitlines()[-1] == "allow", as_agent
    other = run_as(u, argv, cwd=root, env=clean_env())
    assert other.returncode == 1 and other.stdout == "", other
    assert other.stderr.startswith(
        f"ctx: EACCES: cannot judge whether agent 'pz' may execute tool:probe: uid {u.uid} may "
        f"not enter {root}/shared/team ("
    ), other
    assert "says nothing of agent 'pz', so no verdict is given" in other.stderr, other


def test_explain_allows_a_disabled_or_damaged_tool_with_a_note_in_both_outputs(
    searchable_storage: Path,
):
    """docs/policy.md "Examples": "The chain judges the grant, not whether the tool can run
    now: a tool its administrator disabled (``status``), or one whose controls are damaged, is
    refused before the chain …  An explanation that allows such a tool says so in a note on
    stderr (``ctx: note: the chain allows it, but a call is refused before the chain: tool
    fs.write is not available (status: disabled); …``), and still exits 0"."""
    storage = searchable_storage
    coder_allowed(storage, "fs.write")
    controls = storage / "tool" / "fs.write.d"
    quiet = on(storage, "policy", "explain", "coder", "tool:fs.write", "execute", "--json")
    assert quiet.rc == 0 and quiet.json()["allowed"] is True and quiet.err == "", quiet
    (controls / "status").write_text("disabled\n")
    for extra in ((), ("--json",)):
        said = on(storage, "policy", "explain", "coder", "tool:fs.write", "execute", *extra)
        assert said.rc == 0, said
        assert said.err.startswith(
            "ctx: note: the chain allows it, but a call is refused before the chain: tool "
            "fs.write is not available (status: disabled)"
        ), said
    (controls / "status").write_text("available\n")
    (controls / "schema").write_text("{broken")
    said = on(storage, "policy", "explain", "coder", "tool:fs.write", "execute", "--json")
    assert said.rc == 0 and said.json()["allowed"] is True, said
    assert said.err.startswith("ctx: note: the chain allows it") and "damaged" in said.err, said


def test_explain_location_takes_an_absolute_directory_within_the_root(
    searchable_storage: Path, tmp_path: Path
):
    """docs/policy.md, ``--location``: it names where a tool lives "relative to the storage
    root or as an absolute path within it (the directory of what ``ctx object which`` prints;
    one outside the root is ``EINVAL``)" — also when the root is named through a link, as
    ``storage/current`` is."""
    storage = searchable_storage
    coder_allowed(storage, "fs.read")
    link = tmp_path / "current"
    link.symlink_to(storage)
    for root in (storage, link):
        which = on(root, "object", "which", "fs.read")
        assert which.rc == 0, which
        place = os.path.dirname(which.out.strip())
        for location in ("tool", place):
            said = on(
                root,
                "policy",
                "explain",
                "coder",
                "tool:fs.read",
                "execute",
                "--location",
                location,
            )
            assert said.rc == 0 and said.lines()[-1] == "allow", (root, location, said)
    outside = tmp_path / "elsewhere" / "tool"
    outside.mkdir(parents=True)
    said = on(
        storage, "policy", "explain", "coder", "tool:fs.read", "execute", "--location", outside
    )
    assert said.rc == 2 and said.out == "" and said.err.startswith("ctx: EINVAL: "), said


# ---------------------------------------------------- docs/tools.md: agents, CTX_PATH (T-4)


def spaces_request(name: str, count: int) -> dict:
    spaces = {f"s{n:05d}" + "x" * 58: "read" for n in range(count)}  # 64-byte names
    return {"name": name, "label": f"{name}_t", "tools": ["fs.stat"], "shared": spaces}


def test_the_ctx_path_bound_holds_at_create_at_each_call_and_for_a_worker(searchable_storage: Path):
    """docs/tools.md "Agents, host side": "``CTX_PATH`` holds the same limit: one
    ``/ctx/shared/<space>/tool`` entry for each space the agent may read …  ``ctx agent
    create`` refuses a request whose spaces would take ``CTX_PATH`` past it; a policy widened
    by hand past it makes every call, ``ctx agent start`` and ``ctx queue work`` (before it
    claims any job) refuse with ``E2BIG``, saying how many of those spaces exist"; a granted
    space not made yet "stays on the path"."""
    root = searchable_storage
    # 82 bytes an entry: 1700 spaces pass 128 KiB, 1500 stay below it.
    refused = on(root, "agent", "create", "-", input=json.dumps(spaces_request("wide", 1700)))
    assert refused.rc == 1 and "E2BIG" in refused.err and "131072" in refused.err, refused.err[
        -400:
    ]
    assert not (root / "agent" / "wide").exists() and not (root / "agent" / "wide.d").exists()
    made = on(root, "agent", "create", "-", input=json.dumps(spaces_request("near", 1500)))
    assert made.rc == 0, made.err[-400:]
    grant(root, "near", "fs.stat")
    called = on(root, "run", "--agent", "near", "fs.stat", "/ctx")
    assert called.rc == 0 and called.out.startswith("path: /ctx\n"), called.err[-400:]
    with open(root / "agent" / "near.d" / "policy", "a") as policy:
        policy.writelines(f"allow near_t shared:w{n:05d}{'y' * 58} read\n" for n in range(200))
    called = on(root, "run", "--agent", "near", "fs.stat", "/ctx")
    assert called.rc == 126 and called.err.startswith("ctx: E2BIG: "), called
    assert "1700 of them spaces that do not exist" in called.err, called
    job = publish(root, "proj", {"tool": "fs.stat", "input": {"path": "/ctx"}}, "wide-job")
    worked = on(root, "queue", "work", "--project", "proj", "--agent", "near", "--drain")
    assert worked.rc == 1 and "E2BIG" in worked.err and "claimed no job" in worked.err, worked
    assert os.listdir(root / "shared" / "proj" / "queue" / "pending") == [job]


# ------------------------------------------------------- docs/tools.md: ctx run (T-3, T-6)


@pytest.fixture
def dump_root(searchable_storage: Path, outbox: Path, scratch: Path) -> Path:
    """Agent ``dp`` granted the tool ``dump``, which keeps its stdin in ``outbox/stdin``."""
    install(searchable_storage, scratch, "dump", f"#!/bin/sh\ncat > {outbox}/stdin\necho '{{}}'\n")
    install(searchable_storage, scratch, "plain", "echo this file has no interpreter line\n")
    private = scratch / "private"
    private.mkdir(mode=0o700)
    shutil.copy("/bin/sh", private / "sh")
    install(searchable_storage, scratch, "hidden", f"#!{private}/sh\necho '{{}}'\n")
    make_agent(searchable_storage, ["dump", "plain", "hidden"], name="dp")
    for tool in ("dump", "plain", "hidden"):
        grant(searchable_storage, "dp", tool)
    return searchable_storage


def test_native_input_reaches_the_tool_as_json_dumps_writes_it_until_that_is_too_long(
    dump_root: Path, outbox: Path
):
    """docs/tools.md "Agent native mode and its frames": "The input is one JSON value on stdin,
    passed to the tool on its stdin as one line, in the form of Python's ``json.dumps``
    (``{"path": "/ctx"}``), or as compact UTF-8 JSON when that form would be longer than a core
    tool reads (ASCII escapes triple an accented letter): at most 16 MiB".  At the bound: a
    ``json.dumps`` form of exactly 16777216 bytes is passed so; one byte more goes compact."""

    def passed(value: dict) -> bytes:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        r = on(dump_root, "run", "--native", "--agent", "dp", "dump", input=text, timeout=120)
        assert r.rc == 0, r.err[-300:]
        return (outbox / "stdin").read_bytes()

    assert passed({"b": [1, 2.5, {"c": None}], "a": "é", "t": True}) == (
        b'{"b": [1, 2.5, {"c": null}], "a": "\\u00e9", "t": true}\n'
    )
    limit = 16 * 1024 * 1024
    fill = limit - len(json.dumps({"a": "é"}))  # the json.dumps form of the input: 16 MiB
    at_bound = passed({"a": "é" + "x" * fill})
    assert len(at_bound) == limit + 1 and at_bound.startswith(b'{"a": "\\u00e9xxx'), at_bound[:20]
    past = passed({"a": "é" + "x" * (fill + 1)})
    assert past.startswith('{"a":"éxxx'.encode()) and len(past) == limit - 3, past[:20]


def test_a_tool_the_kernel_would_not_exec_does_not_start_in_any_mode(
    dump_root: Path, scratch: Path
):
    """docs/tools.md "Running a tool", stage ``run``: "the kernel refused its exec: ``EACCES``
    for an interpreter the tool's uid, gid and groups may not execute — …, below a directory
    they may not search, … — judged by their mode bits (T-5) even where ``setpriv``, holding
    root's capabilities up to the exec, would let it through; …; ``ENOEXEC`` for a file of
    text with no ``#!`` line …  The message names the interpreter at fault …  Said so whether
    ``setpriv`` or Python made the exec, in terminal mode as in native mode and a worker, never
    as an exit status 126 or 127 of a tool that never ran"."""
    private = f"{scratch}/private"
    expected = {
        "plain": ("ENOEXEC", "cannot start "),
        "hidden": ("EACCES", f"its interpreter {private}/sh, named on its #! line, lies below "
                   f"{private}, which the tool's uid 65534 gid 65534 may not search"),
    }  # fmt: skip
    for tool, (code, words) in expected.items():
        terminal = on(dump_root, "run", "--agent", "dp", tool)
        assert terminal.out == "" and terminal.err.startswith(f"ctx: {code}: "), terminal
        assert words in terminal.err and "no interpreter line" not in terminal.err, terminal
        native = on(dump_root, "run", "--native", "--agent", "dp", tool, input="{}")
        frame = json.loads(native.lines()[-1])
        assert native.rc == 1 and frame["exit_status"] is None, native
        assert (frame["error"]["error"], frame["error"]["stage"]) == (code, "run"), frame
        job = publish(dump_root, "proj", {"tool": tool, "input": {}}, f"{tool}-job")
        worked = on(dump_root, "queue", "work", "--project", "proj", "--agent", "dp", "--drain")
        assert worked.rc == 0, worked
        failed = dump_root / "shared" / "proj" / "queue" / "failed"
        result = json.loads((failed / f"{job}.result").read_text())
        assert result["exit_status"] is None and result["error"]["error"] == code, result
        assert words in result["error"]["message"], result
    results = [e for e in events(dump_root, 65534, "dp", "default") if e["type"] == "tool_result"]
    assert [(e["errno"], e["stage"], e["exit_status"]) for e in results] == [
        ("ENOEXEC", "run", None),
        ("ENOEXEC", "run", None),
        ("EACCES", "run", None),
        ("EACCES", "run", None),
    ], results


# ---------------------------------------------------------------- docs/mount.md (F-1)


@needs_fuse_as_root
def test_umount_runs_no_program_found_outside_roots_own_directories(
    storage: Path, scratch: Path, unprivileged_user: UnprivilegedUser
):
    """docs/mount.md: ``ctx umount`` "runs ``fusermount3 -u``, else ``umount``, found on
    ``PATH`` as root's launchers are …: in absolute entries only, and for root in directories
    only root may write; neither there is ``ENOENT`` naming both".  A ``umount`` planted in
    the working directory, in another uid's directory, or owned by another uid in a directory
    of root's, is never run; the mount stays until a trusted one unmounts it.  ``ctx umount``
    without MOUNTPOINT "unmounts the one storage root mounted with ``ctx mount`` by the caller
    …: none is ``ENOENT`` (exit 1)" — a user other than root's is not given root's mount."""
    unprivileged = unprivileged_user
    planted = scratch / "planted"
    planted.mkdir()
    marker = scratch / "RAN"
    program = f"#!/bin/sh\n: > {marker}\n"
    others = scratch / "others"
    others.mkdir()
    rooted = scratch / "rooted"
    rooted.mkdir()
    for directory in (planted, others, rooted):
        for name in ("umount", "fusermount3"):
            (directory / name).write_text(program)
            (directory / name).chmod(0o755)
    os.chown(others, 65534, 65534)
    for name in ("umount", "fusermount3"):
        os.chown(rooted / name, 65534, 65534)
    where = scratch / "mnt"
    where.mkdir()
    with serving(storage, where) as mount:
        for path in (".", f".:{planted.name}", str(others), str(rooted)):
            umount = [*CTX_ARGV, "umount", str(where)]
            env = {"PATH": path}
            done = subprocess.run(umount, capture_output=True, text=True, cwd=planted, env=env)
            assert done.returncode == 1, (path, done)
            assert done.stderr.startswith(f"ctx: ENOENT: cannot unmount {where}: "), done
            assert "neither fusermount3" in done.stderr and "nor umount" in done.stderr, done
            assert not marker.exists(), path
        assert mount.proc.poll() is None
        if unprivileged is not None:  # "unmounts the one … mounted … by the caller": none
            theirs = run_as(unprivileged, [*CTX_ARGV, "umount"], cwd=scratch, env=clean_env())
            assert theirs.returncode == 1 and theirs.stderr.startswith("ctx: ENOENT: "), theirs
            assert mounted_at(where) and mount.proc.poll() is None
        gone = ctx_run("umount", where)
        assert gone.rc == 0, gone
        assert wait_for(lambda: mount.proc.poll() is not None, 15)
