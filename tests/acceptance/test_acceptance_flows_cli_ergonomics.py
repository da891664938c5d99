"""A demanding shell user at the ``ctx``, ``ctxmcp`` and ``tsh`` command lines: the storage
root given before or after the subcommand and in the environment, ``--`` before names that
start with a dash, ``-`` as standard input where the documents offer it, file names and
arguments that are not UTF-8 or hold control bytes, and standard output closed, full or left
by its reader (SPEC §2.4, R-1, R-3, P-8, T-4, T-8a; README; docs/queue.md, docs/policy.md,
docs/tools.md)."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, REPO, clean_env, snapshot, tool_manifest
from tests.support.storage import copy_of_root

CTXMCP = str(REPO / ".venv" / "bin" / "ctxmcp")
REQUEST = b'{"tool": "fs.stat", "input": {"path": "/"}}'


@dataclass(repr=False)
class Raw:
    """One command's exit status and its two outputs as bytes."""

    argv: list
    rc: int
    out: bytes
    err: bytes

    @property
    def text(self) -> str:
        return self.err.decode("utf-8", "replace")

    def __repr__(self) -> str:
        return f"$ {self.argv!r}\nexit {self.rc}\nstdout: {self.out[:2000]!r}\nstderr: {self.err!r}"


def run(
    argv: list,
    *,
    env: dict,
    stdin=None,
    input: bytes | None = None,
    stdout=subprocess.PIPE,
    cwd: Path | None = None,
) -> Raw:
    """``argv`` (str words go to the OS by surrogateescape, bytes as they are)."""
    if input is None and stdin is None:
        input = b""
    proc = subprocess.run(
        argv,
        input=input,
        stdin=stdin,
        stdout=stdout,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd,
        timeout=60,
    )
    return Raw(argv, proc.returncode, proc.stdout or b"", proc.stderr)


def ctx(*words, env: dict, **kw) -> Raw:
    return run([*CTX_ARGV, *words], env=env, **kw)


def to_a_reader_that_left(argv: list, env: dict) -> Raw:
    """``argv`` writing into a pipe whose reader has already gone (``| true``, ``| head -1``
    once head is done): every write meets EPIPE, however fast the command is."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return run(argv, env=env, stdout=write_end, stdin=subprocess.DEVNULL)
    finally:
        os.close(write_end)


def to_a_full_disk(argv: list, env: dict) -> Raw:
    """``argv > /dev/full``: every write is refused with ENOSPC."""
    with open("/dev/full", "wb") as full:
        return run(argv, env=env, stdout=full, stdin=subprocess.DEVNULL)


def sh(script: str, *args, env: dict, cwd: Path | None = None) -> Raw:
    """``script`` run by /bin/sh with ``args`` as ``$1…`` (for ``<&-`` and ``>&-``)."""
    return run(["/bin/sh", "-c", script, "sh", *map(str, args)], env=env, cwd=cwd)


def pending(storage: Path, project: str = "proj") -> set[str]:
    return set(os.listdir(storage / "shared" / project / "queue" / "pending"))


def escaped(raw: bytes) -> str:
    """How ``ctx`` spells a name it shows on a terminal: each non-printable character (a
    control byte, a byte that is not UTF-8) as its Python escape (``\\x1b``, ``\\udcff``)."""
    text = os.fsdecode(raw)
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def no_raw_control_bytes(data: bytes) -> bool:
    """Valid UTF-8 with no control byte but the line breaks ending its lines."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return not any((b < 0x20 and b != 0x0A) or b == 0x7F for b in data)


@pytest.fixture
def second_root(_template: Path, tmp_path: Path) -> Path:
    """Another storage root made like ``storage``, also holding the queue of ``proj``."""
    return copy_of_root(_template, tmp_path / "second")


# --- 1. the storage root: before, after, environment -------------------------------------------


def test_the_storage_root_before_or_after_the_subcommand_and_in_the_environment(
    storage: Path, second_root: Path, tmp_path: Path
) -> None:
    """R-1, §2.4 ("All commands take --storage DIR (or CTX_STORAGE)"), ``ctx --help`` ("Storage
    root for every subcommand"), docs/tools.md (``ctx --storage A object install --source B``:
    two roots are EINVAL, exit 2; one root given both ways is fine): wherever the root is
    named, the job lands in that root and nowhere else, $CTX_STORAGE is only a default, and a
    queue command given two roots works in one of them, the one its output names."""
    a, b = storage, second_root
    env_b = clean_env(CTX_STORAGE=str(b))

    before = ctx("--storage", a, "queue", "publish", "--project", "proj", "--name", "front",
                 "-", env=env_b, input=REQUEST)  # fmt: skip
    after = ctx("queue", "publish", "--project", "proj", "--name", "back", "--storage", a, "-",
                env=env_b, input=REQUEST)  # fmt: skip
    assert (before.rc, before.out, after.rc, after.out) == (
        0, b"front.req.json\n", 0, b"back.req.json\n"
    ), (before, after)  # fmt: skip
    assert pending(a) == {"front.req.json", "back.req.json"} and pending(b) == set()

    # $CTX_STORAGE (b) answers only where no --storage was given, before or after.
    listed = {
        where: ctx(*words, env=env_b)
        for where, words in {
            "group": ["--storage", a, "queue", "list", "--project", "proj", "--state", "pending"],
            "command": ["queue", "list", "--project", "proj", "--state", "pending", "--storage", a],
            "environment": ["queue", "list", "--project", "proj", "--state", "pending"],
        }.items()
    }
    names = {b"back.req.json", b"front.req.json"}
    for where in ("group", "command"):
        assert listed[where].rc == 0 and set(listed[where].out.split()) == names, listed
    assert (listed["environment"].rc, listed["environment"].out) == (0, b""), listed

    # Both, naming two roots: a usage error (EINVAL, exit 2) that acts on neither.
    status = ctx("--storage", b, "queue", "status", "--project", "proj", "--storage", a,
                 "--json", env=clean_env())  # fmt: skip
    assert status.rc == 2 and json.loads(status.out)["error"] == "EINVAL", status
    twice = ctx("--storage", b, "queue", "publish", "--project", "proj", "--name", "twice",
                "--storage", a, "-", env=clean_env(), input=REQUEST)  # fmt: skip
    assert (twice.rc, twice.out) == (2, b""), twice
    assert [("twice.req.json" in pending(root)) for root in (a, b)] == [False, False]

    # One root both ways, through another spelling of it, installs; two roots install nothing.
    manifest = tool_manifest(tmp_path / "m", "demo.cli", "#!/bin/sh\necho hi\n")
    both = (a, b)
    trees = [snapshot(root) for root in both]
    two = ctx("--storage", b, "object", "install", "--source", a, manifest, "--tier", "system",
              "--json", env=clean_env())  # fmt: skip
    assert two.rc == 2, two
    assert json.loads(two.out)["error"] == "EINVAL" and b"ctx: EINVAL: " in two.err, two
    assert [snapshot(root) for root in both] == trees, "a refused install changed a root"
    same = ctx("--storage", a / "tool" / "..", "object", "install", "--source", a, manifest,
               "--tier", "system", env=env_b)  # fmt: skip
    assert same.rc == 0, same
    assert (a / "tool" / "demo.cli").is_file() and not (b / "tool" / "demo.cli").exists()
    which = ctx("--storage", a, "object", "which", "demo.cli", env=clean_env(CTX_STORAGE=str(b),
                CTX_HOME=str(tmp_path / "nohome")))  # fmt: skip
    assert (which.rc, which.out) == (0, f"{a}/tool/demo.cli\n".encode()), which


# --- 2. "--" before a name that starts with a dash ---------------------------------------------


def test_double_dash_lets_file_names_start_with_a_dash_and_never_smuggles_a_job_name(
    storage: Path, tmp_path: Path
) -> None:
    """§2.4 (``publish (FILE | -)``, ``finish J --ok [RESULT_FILE | -]``), P-8, R-3 and
    docs/tools.md ("A -- before TOOL ends the options of ctx run"): after ``--`` a file
    called ``-req.json`` or ``--help`` is a file, read as such; without it the word is an option
    and the command a usage error (exit 2, a pointer to --help) that publishes nothing; a job or
    tool name that starts with ``-`` stays illegal after ``--`` (EINVAL, exit 2)."""
    env = clean_env(CTX_STORAGE=str(storage))
    here = tmp_path / "here"
    here.mkdir()
    (here / "-req.json").write_bytes(REQUEST)
    (here / "-res.json").write_text('{"answer": 42}')
    (here / "-p.policy").write_text("allow a_t tool:x execute\nbad line\n")

    bare = ctx("queue", "publish", "--project", "proj", "-req.json", env=env, cwd=here)
    assert bare.rc == 2 and bare.out == b"", bare
    assert "Try 'ctx queue publish --help' for help." in bare.text, bare
    assert bare.text.splitlines()[-1].startswith("ctx: EINVAL: "), bare
    assert pending(storage) == set()

    published = ctx("queue", "publish", "--project", "proj", "--name", "lead", "--", "-req.json",
                    env=env, cwd=here)  # fmt: skip
    assert (published.rc, published.out) == (0, b"lead.req.json\n"), published
    stored = json.loads((storage / "shared/proj/queue/pending/lead.req.json").read_bytes())
    assert stored["input"] == {"path": "/"}

    # A file called "--help" after "--" is a file: missing, ENOENT (exit 1), no help text.
    missing = ctx("queue", "publish", "--project", "proj", "--", "--help", env=env, cwd=here)
    assert missing.rc == 1 and missing.out == b"", missing
    assert missing.text.startswith("ctx: ENOENT: ") and "Usage:" not in missing.text, missing
    (here / "--help").write_bytes(REQUEST)
    helpfile = ctx("queue", "publish", "--project", "proj", "--name", "hf", "--", "--help",
                   env=env, cwd=here)  # fmt: skip
    assert (helpfile.rc, helpfile.out) == (0, b"hf.req.json\n"), helpfile

    claimed = ctx("queue", "claim", "--project", "proj", env=env)
    assert claimed.rc == 0, claimed
    job = claimed.out.decode().strip()
    finished = ctx("queue", "finish", "--project", "proj", "--ok", "--", job, "-res.json",
                   env=env, cwd=here)  # fmt: skip
    assert finished.rc == 0, finished
    result = json.loads((storage / "shared/proj/queue/done" / f"{job}.result").read_bytes())
    assert (result["status"], result["output"]) == ("ok", {"answer": 42}), result

    # A dash-led job name is no name even after "--": R-3's EINVAL, as a usage error.
    shown = ctx("queue", "show", "--project", "proj", "--json", "--", "-x", env=env)
    assert shown.rc == 2 and json.loads(shown.out)["error"] == "EINVAL", shown
    assert shown.text.startswith("ctx: EINVAL: illegal job name"), shown
    tool = ctx("run", "--agent", "coder", "--", "-weird", env=env)
    assert tool.rc == 2 and "ctx: EINVAL: illegal tool name" in tool.text, tool

    checked = ctx("policy", "check", "--", "-p.policy", env=env, cwd=here)
    assert checked.rc == 1, checked
    assert checked.text.splitlines() == [
        "-p.policy:2: EINVAL: unknown statement 'bad'; every rule has the form "
        "'allow SUBJECT CLASS:NAME PERMISSION'"
    ], checked


# --- 3. "-" as standard input -------------------------------------------------------------------


def test_dash_reads_standard_input_where_documented_and_a_closed_one_publishes_nothing(
    storage: Path, tmp_path: Path
) -> None:
    """§2.4 (``publish (FILE | -)``, ``--batch (JSONL_FILE | -)``, ``finish … [RESULT_FILE |
    -]``), docs/policy.md ("``-`` reads stdin", "A pipe is given as ``-``") and ``ctx agent
    create --help`` ("'-' reads standard input"): ``-`` is stdin, ``./-`` the file of that name;
    a standard input closed by the shell (``<&-``) is no request: EBADF, nothing published."""
    env = clean_env(CTX_STORAGE=str(storage))
    here = tmp_path / "here"
    here.mkdir()
    (here / "-").write_bytes(b'{"tool": "fs.stat", "input": {"path": "/from-file"}}')

    via_stdin = ctx("queue", "publish", "--project", "proj", "--name", "in", "-", env=env,
                    cwd=here, input=REQUEST)  # fmt: skip
    via_file = ctx("queue", "publish", "--project", "proj", "--name", "file", "./-", env=env,
                   cwd=here, input=REQUEST)  # fmt: skip
    assert (via_stdin.rc, via_file.rc) == (0, 0), (via_stdin, via_file)
    q = storage / "shared/proj/queue"
    assert json.loads((q / "pending/in.req.json").read_bytes())["input"] == {"path": "/"}
    assert json.loads((q / "pending/file.req.json").read_bytes())["input"] == {"path": "/from-file"}

    batch = ctx("queue", "publish", "--project", "proj", "--batch", "-", env=env,
                input=REQUEST + b"\n" + REQUEST + b"\n")  # fmt: skip
    assert batch.rc == 0 and len(batch.out.splitlines()) == 2, batch
    assert {n.decode() for n in batch.out.splitlines()} <= pending(storage)

    claimed = ctx("queue", "claim", "--project", "proj", env=env)
    job = claimed.out.decode().strip()
    done = ctx("queue", "finish", "--project", "proj", job, "--ok", "-", env=env,
               input=b'{"lines": 3}')  # fmt: skip
    assert done.rc == 0, done
    assert json.loads((q / "done" / f"{job}.result").read_bytes())["output"] == {"lines": 3}

    policy = b"allow a_t tool:x execute\n"
    query = ctx("policy", "query", "--policy", "-", "a_t", "tool:x", "execute", env=env,
                input=policy)  # fmt: skip
    assert (query.rc, query.out) == (0, b"allow\n"), query
    check = ctx("policy", "check", "-", env=env, input=policy + b"allow a_t tool:* execute\n")
    assert check.rc == 1 and check.text.startswith("-:2: EINVAL: "), check
    agent = ctx("agent", "create", "-", env=env, input=b'{"name": "cli-dash"}')
    assert agent.rc in (1, 2) and "<stdin>" in agent.text, agent  # it read the pipe
    assert not (storage / "agent" / "cli-dash").exists()

    # Standard input closed by the shell: no request, nothing published, no temp left.
    before = pending(storage)
    for words in (["--name", "closed", "-"], ["--batch", "-"]):
        closed = sh('exec "$@" <&-', *CTX_ARGV, "queue", "publish", "--project", "proj", *words,
                    env=env)  # fmt: skip
        assert closed.rc == 1 and closed.out == b"", closed
        assert closed.err.startswith(b"ctx: EBADF: standard input is closed: "), closed
    assert pending(storage) == before
    assert os.listdir(q / "inbox") == []


# --- 4. bytes that are not UTF-8, control bytes ------------------------------------------------


def test_names_that_are_not_utf8_reach_the_command_and_come_back_escaped(
    storage: Path, tmp_path: Path
) -> None:
    """R-3, §2.4 (errors ``ctx: ERRNO: sentence``; ``--json`` one object on stdout), P-8
    (``FILE:LINE: EINVAL``): a file name holding ``\\xff`` and an escape sequence is read under
    its own bytes; a refusal naming one shows it escaped (no raw control byte, valid UTF-8) in
    text, and in JSON as a string that gives the very bytes back (surrogateescape)."""
    env = clean_env(CTX_STORAGE=str(storage))
    here = tmp_path / "here"
    here.mkdir()
    odd = b"caf\xe9\xff\x1b[31m.json"
    (here / os.fsdecode(odd)).write_bytes(REQUEST)
    published = ctx("queue", "publish", "--project", "proj", "--name", "odd", odd, env=env,
                    cwd=here)  # fmt: skip
    assert (published.rc, published.out) == (0, b"odd.req.json\n"), published

    missing = b"nope\xff\x1b[2J.json"
    text = ctx("queue", "publish", "--project", "proj", missing, env=env, cwd=here)
    as_json = ctx("queue", "publish", "--project", "proj", "--json", missing, env=env, cwd=here)
    for answer in (text, as_json):
        assert answer.rc == 1 and no_raw_control_bytes(answer.err), answer
        assert answer.text.startswith("ctx: ENOENT: ") and escaped(missing) in answer.text, answer
    assert no_raw_control_bytes(as_json.out) and len(as_json.out.splitlines()) == 1, as_json
    error = json.loads(as_json.out)
    assert error["error"] == "ENOENT" and os.fsdecode(missing) in error["message"], error

    # An argument that must be an object name: EINVAL, a usage error, shown escaped.
    for words in (
        ["queue", "show", "--project", "proj", b"j\xff\x1b[H"],
        ["queue", "publish", "--project", b"p\xff\x1b]0;x\x07", "-"],
        ["queue", "publish", "--project", "proj", "--name", b"n\xff", "-"],
    ):
        refused = ctx(*words, "--json", env=env, input=REQUEST)
        assert refused.rc == 2 and no_raw_control_bytes(refused.err), refused
        assert refused.text.startswith("ctx: EINVAL: illegal "), refused
        assert json.loads(refused.out)["error"] == "EINVAL", refused
        assert no_raw_control_bytes(refused.out), refused
    assert pending(storage) == {"odd.req.json"}

    # P-8 with a policy file of such a name: the error line and the JSON report.
    bad = here / os.fsdecode(b"p\xff\x1b[31m.policy")
    bad.write_text("allow x_t nonsense:y execute\n")
    check = ctx("policy", "check", bytes(bad), env=env)
    report = ctx("policy", "check", "--json", bytes(bad), env=env)
    assert check.rc == report.rc == 1, (check, report)
    assert no_raw_control_bytes(check.err), check
    assert check.text.startswith(f"{escaped(bytes(bad))}:1: EINVAL: unknown class"), check
    assert no_raw_control_bytes(report.out), report
    assert os.fsencode(json.loads(report.out)["files"][0]["file"]) == bytes(bad), report

    # A storage root whose own path holds such bytes: status escapes it, --json round-trips.
    root = tmp_path / os.fsdecode(b"r\x1b[31m\xffoot")
    os.rename(storage, root)
    odd_env = clean_env(CTX_STORAGE=str(root))
    status = ctx("queue", "status", "--project", "proj", env=odd_env)
    assert status.rc == 0 and no_raw_control_bytes(status.out), status
    assert status.out.decode().splitlines()[0] == f"queue: {escaped(bytes(root))}/shared/proj/queue"
    as_json = ctx("queue", "status", "--project", "proj", "--json", env=odd_env)
    assert os.fsencode(json.loads(as_json.out)["queue"]) == bytes(root / "shared/proj/queue")


def test_a_path_holding_an_escape_sequence_is_printed_as_it_is_or_escaped_never_altered(
    storage: Path, tmp_path: Path
) -> None:
    """T-8a ("``ctx object which NAME`` prints the path that CTX_PATH resolves NAME to", the
    idiom ``"$(ctx object which fs.stat).d/policy"`` of the README): a directory whose name holds
    an escape sequence is printed either byte for byte or escaped as ``ctx queue status`` does,
    never as a third path that names another directory; the same for the paths ``queue init``
    and ``object install`` report."""
    env = clean_env(CTX_STORAGE=str(storage), CTX_HOME=str(tmp_path / "nohome"))
    tools = tmp_path / os.fsdecode(b"t\x1b[2Jx")
    tools.mkdir()
    (tools / "demo.x").write_text("#!/bin/sh\necho hi\n")
    (tools / "demo.x").chmod(0o755)
    (tmp_path / "tx").mkdir()  # the path the escape sequence's removal would name
    which = ctx("object", "which", "demo.x", env={**env, "CTX_PATH": str(tools)})
    target = bytes(tools / "demo.x")
    problems = []
    if which.out not in (target + b"\n", escaped(target).encode() + b"\n"):
        problems.append(f"object which printed {which.out!r} for {target!r}")

    root = tmp_path / os.fsdecode(b"r\x1b[31moot")
    os.rename(storage, root)
    odd_env = clean_env(CTX_STORAGE=str(root))
    init = ctx("queue", "init", "--project", "fresh", env=odd_env)
    queue_dir = bytes(root / "shared/fresh/queue")
    if queue_dir not in init.out and escaped(queue_dir).encode() not in init.out:
        problems.append(f"queue init printed {init.out!r} for {queue_dir!r}")
    manifest = tool_manifest(tmp_path / "m", "demo.esc", "#!/bin/sh\necho hi\n")
    install = ctx("object", "install", manifest, "--tier", "system", env=odd_env)
    installed = bytes(root / "tool/demo.esc")
    if installed not in install.out and escaped(installed).encode() not in install.out:
        problems.append(f"object install printed {install.out!r} for {installed!r}")
    assert problems == []


# --- 5. standard output closed, full, or left by its reader -----------------------------------


def test_output_closed_full_or_left_by_its_reader_ends_with_the_documented_status(
    storage: Path,
) -> None:
    """README and docs/queue.md: 141 "when the reader of the output left, as in ``| head -1``"
    (quietly, never 1), 74 with ``ctx: ENOSPC: cannot write standard output`` when it cannot be
    written (``> /dev/full``, help included: docs/tools.md), and with standard output closed
    ``publish`` and ``claim`` refuse with EBADF (exit 1) before anything moves, while a command
    whose answer is not the point (``status``) runs as usual."""
    env = clean_env(CTX_STORAGE=str(storage))
    batch = b"".join(REQUEST + b"\n" for _ in range(40))
    assert (
        ctx("queue", "publish", "--project", "proj", "--batch", "-", env=env, input=batch).rc == 0
    )
    left = {
        " ".join(words): to_a_reader_that_left([*CTX_ARGV, *words], env)
        for words in (
            ["queue", "list", "--project", "proj"],
            ["queue", "status", "--project", "proj", "--json"],
            ["queue", "recover", "--project", "proj"],
            ["object", "list"],
            ["man", "tool"],
        )
    }
    assert {k: (a.rc, a.err) for k, a in left.items()} == {k: (141, b"") for k in left}, left

    full = {
        " ".join(map(os.fsdecode, argv)): to_a_full_disk(argv, env)
        for argv in (
            [*CTX_ARGV, "queue", "list", "--project", "proj"],
            [*CTX_ARGV, "--help"],
            [*CTX_ARGV, "queue", "status", "-h"],
            [CTXMCP, "list", "--help"],
        )
    }
    for command, answer in full.items():
        program = "ctxmcp" if "ctxmcp" in command else "ctx"
        assert answer.rc == 74, answer
        assert answer.text.startswith(f"{program}: ENOSPC: cannot write standard output"), answer
        assert "Traceback" not in answer.text and "Exception" not in answer.text, answer

    before = pending(storage)
    claim = sh('exec "$@" >&-', *CTX_ARGV, "queue", "claim", "--project", "proj", env=env)
    publish = sh('echo "$1" | { shift; exec "$@" >&-; }', REQUEST.decode(), *CTX_ARGV, "queue",
                 "publish", "--project", "proj", "--name", "unseen", "-", env=env)  # fmt: skip
    for answer in (claim, publish):
        assert answer.rc == 1 and answer.text.startswith("ctx: EBADF: "), answer
    assert pending(storage) == before
    assert os.listdir(storage / "shared/proj/queue/claimed") == []
    status = sh('exec "$@" >&-', *CTX_ARGV, "queue", "status", "--project", "proj", env=env)
    assert (status.rc, status.err) == (0, b""), status


def test_help_and_version_to_a_reader_that_left_end_quietly_with_141(storage: Path) -> None:
    """README and docs/queue.md: a reader that left ends a command quietly with 141, "never 1,
    which says a conflict was found"; docs/tools.md counts what ``--help`` writes as the
    command's output (it exits 74 on ``/dev/full``).  ``ctx queue status --help | true`` in a
    script must not look like a queue holding a conflict."""
    env = clean_env(CTX_STORAGE=str(storage))
    answers = {
        " ".join([Path(prog[0]).name, *words]): to_a_reader_that_left([*prog, *words], env)
        for prog, words in (
            (CTX_ARGV, ["--help"]),
            (CTX_ARGV, ["queue", "status", "--help"]),
            (CTX_ARGV, ["--version"]),
            ([CTXMCP], ["--help"]),
        )
    }
    assert {k: (a.rc, a.err) for k, a in answers.items()} == {k: (141, b"") for k in answers}, (
        answers
    )


def test_tsh_output_to_a_reader_that_left_or_a_full_disk_is_reported_like_ctxs(
    storage: Path, tmp_path: Path
) -> None:
    """T-4, H-1 (a standalone human tsh lists and finds tools) and the rule docs/tools.md gives
    "any command's output that cannot be written" (74 with an ENOSPC sentence; 141, quietly,
    when the reader left, README): ``tsh tools | head -1`` and ``tsh which NAME > /dev/full``
    say so in tsh's words, not with an interpreter's shutdown message and status 120."""
    env = clean_env(CTX_PATH=str(storage / "tool"), CTX_HOME=str(tmp_path / "nohome"))
    tsh = str(storage / "bin" / "tsh")
    assert run([tsh, "which", "fs.read"], env=env).rc == 0
    left = to_a_reader_that_left([tsh, "tools"], env)
    full = to_a_full_disk([tsh, "which", "fs.read"], env)
    problems = []
    if (left.rc, left.err) != (141, b""):
        problems.append(left)
    if full.rc != 74 or not full.text.startswith("tsh: ENOSPC: ") or "Exception" in full.text:
        problems.append(full)
    assert problems == []
