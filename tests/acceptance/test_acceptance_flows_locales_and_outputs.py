"""The ``ctx`` command line under the locales and output environments it meets outside a
developer's UTF-8 terminal: ``LC_ALL`` of C, POSIX, C.UTF-8, a locale that is not installed or
none at all, an ISO-8859-1 locale, odd ``PYTHONIOENCODING`` values; standard output and error
on a pseudo-terminal (``TERM=dumb``, ``NO_COLOR``, ``COLUMNS`` of 10 and 500), on a terminal
that hung up, on a read-only descriptor, on ``/dev/full`` or a pipe whose reader left; standard
input or output that is a directory.  Whatever the environment, the answers must keep their
content (SPEC §2.4: exit statuses 0, 1, 2, 3; README: 74 when the output cannot be written,
saying what was done; 141 when the output's reader left), ``--json`` must stay UTF-8 JSON,
and no control byte that others chose (a file name, a request, a lease) may reach a terminal
unescaped (README, docs/queue.md)."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, clean_env, ctx_run, request

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: the agent runs as uid nobody, root's default"
)

CTX = CTX_ARGV[0]
NOBODY = 65534
# Text a publisher or a caller may put in a request or an argument: Latin-1, a check mark,
# CJK, and what a terminal acts on: CSI (ESC [ and the C1 byte U+009B) and a bidi override.
NON_ASCII = "caf\u00e9 \u2713 \u65e5\u672c"
HOSTILE = "\x1b[2J\x9b31m\u202e"
# What may not reach a terminal raw: a C0 control other than tab, line feed and carriage
# return (a pseudo-terminal turns each line feed into CR LF), DEL, a C1 control in UTF-8,
# a bidirectional embedding, override or isolate.
RAW_CONTROL = re.compile(
    rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\xaa-\xae]|\xe2\x81[\xa6-\xa9]"
)


@dataclass(repr=False)
class Raw:
    """One command's exit status and its two outputs, as bytes."""

    argv: list
    rc: int
    out: bytes
    err: bytes

    def __repr__(self) -> str:
        words = " ".join(os.fsdecode(w) if isinstance(w, bytes) else str(w) for w in self.argv)
        return f"$ {words}\nexit {self.rc}\nstdout: {self.out[:3000]!r}\nstderr: {self.err!r}"


def ctx(*words, env: dict, input: bytes = b"", stdin=None, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE) -> Raw:  # fmt: skip
    """``ctx WORDS`` with the descriptors given (``stdin`` overrides ``input``)."""
    argv = [CTX, *map(str, words)]
    proc = subprocess.run(
        argv,
        input=None if stdin is not None else input,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        env=env,
        timeout=60,
    )
    return Raw(argv[1:], proc.returncode, proc.stdout or b"", proc.stderr or b"")


def on_terminal(words: list, env: dict, *, stdout_on_pty: bool = True,
                stderr_on_pty: bool = False) -> Raw:  # fmt: skip
    """``ctx WORDS`` with standard output and/or error on a fresh pseudo-terminal (the other
    one on a pipe), standard input /dev/null; what the terminal showed, its CR LF turned back
    into LF, is the ``out`` (or ``err``) of the answer."""
    master, slave = pty.openpty()
    argv = [CTX, *map(str, words)]
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=slave if stdout_on_pty else subprocess.PIPE,
        stderr=slave if stderr_on_pty else subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    os.close(slave)
    piped = proc.stdout if not stdout_on_pty else proc.stderr
    shown = bytearray()
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            readable, _, _ = select.select([master], [], [], 0.1)
            if readable:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every descriptor of the other side is closed
                    break
                if not chunk:
                    break
                shown += chunk
            elif proc.poll() is not None and not select.select([master], [], [], 0.1)[0]:
                break
        other = piped.read() if piped is not None else b""
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    screen = bytes(shown).replace(b"\r\n", b"\n")
    if stdout_on_pty:
        return Raw(argv[1:], rc, screen, other if not stderr_on_pty else b"")
    return Raw(argv[1:], rc, other, screen)


def utf8_json_lines(data: bytes) -> list:
    """Each line of ``data`` read as UTF-8 JSON (RFC 8259 §8.1); fails on any other bytes."""
    return [json.loads(line.decode("utf-8")) for line in data.splitlines() if line.strip()]


def base_env(storage: Path | bytes, **extra: str) -> dict:
    """The caller's environment without a locale, Python I/O setting or CortexFS setting, on
    ``storage``, plus ``extra``."""
    env = {
        k: v
        for k, v in clean_env().items()
        if not k.startswith(("LC_", "LANG", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONCOERCE"))
    }
    env["CTX_STORAGE"] = os.fsdecode(storage)
    env.update(extra)
    return env


def build_world(storage: Path, *, jobs: bool = True) -> None:
    """In ``storage`` (which uid nobody may search): agent ``ci`` (uid nobody) allowed
    ``fs.stat`` in both layers of P-6, with a session holding a call whose argument is
    non-ASCII; with ``jobs``, queue ``proj`` holding ``uni`` (pending, a non-ASCII request),
    ``held`` (claimed by this process) and ``fin`` (done, a non-ASCII result), and an empty
    queue ``empty``."""
    env = base_env(storage, LANG="C.UTF-8")
    agent = {"name": "ci", "label": "ci_t", "tools": ["fs.stat"]}
    made = ctx_run("agent", "create", "-", env=env, input=json.dumps(agent))
    assert made.rc == 0, made
    with open(storage / "tool/fs.stat.d/policy", "a") as policy:
        policy.write("allow ci_t tool:fs.stat execute\n")
    called = ctx_run("run", "--agent", "ci", "fs.stat", f"/ctx/{NON_ASCII}", env=env)
    assert called.rc == 1 and "Traceback" not in called.err, called  # not in its view
    if not jobs:
        return

    def publish(name: str, req: dict) -> None:
        done = ctx_run("queue", "publish", "--project", "proj", "--name", name, "-", env=env,
                       input=json.dumps(req))  # fmt: skip
        assert done.rc == 0, done

    publish("fin", request("fs.stat", input={"path": "/fin"}))
    publish("held", request("fs.stat", input={"path": "/held"}))
    claimed = ctx_run("queue", "claim", "--project", "proj", "--ttl", "3600", env=env)
    assert (claimed.rc, claimed.out) == (0, "fin.req.json\n"), claimed
    finished = ctx_run("queue", "finish", "--project", "proj", "fin.req.json", "--ok", "-",
                       env=env, input=json.dumps({"said": NON_ASCII}))  # fmt: skip
    assert finished.rc == 0, finished
    claimed = ctx_run("queue", "claim", "--project", "proj", "--ttl", "3600", env=env)
    assert (claimed.rc, claimed.out) == (0, "held.req.json\n"), claimed
    publish("uni", request("fs.stat", input={"path": f"/{NON_ASCII}"}))
    assert ctx_run("queue", "init", "--project", "empty", env=env).rc == 0


# What a user reads most: each command of the queue, object, session and agent groups the
# world can answer, in text and JSON, a refusal, a usage error and a claim with nothing to
# claim.  (name, words, expected exit status)
MAIN_COMMANDS = [
    ("status", ["queue", "status", "--project", "proj"], 0),
    ("show", ["queue", "show", "--project", "proj", "uni"], 0),
    ("session-show", ["session", "show", "ci"], 0),
    ("refused-json", ["queue", "show", "--project", "proj", "nope", "--json"], 1),
    ("usage", ["queue", "show", "--project", "proj", "n\u00e9"], 2),
    ("nothing", ["queue", "claim", "--project", "empty"], 3),
]


# ---------------------------------------------------------------- locales


def test_c_posix_c_utf8_missing_and_no_locale_give_the_same_answers_byte_for_byte(
    searchable_storage: Path,
) -> None:
    """§2.4 (exit statuses 0, 1, 2, 3 whatever the environment), R-1, R-3, S-2: on a storage
    root whose path holds non-ASCII text and a byte that is not UTF-8, with a non-ASCII
    request, result and session, every main command prints the same bytes, on both outputs,
    and ends with the same status under ``LC_ALL=C``, ``POSIX``, ``C.UTF-8``, a locale that is
    not installed (``de_DE.UTF-8``) and no locale variable at all; each ``--json`` answer is
    UTF-8 JSON; no answer is a traceback."""
    build_world(searchable_storage)
    root = searchable_storage.parent / os.fsdecode("st\u00f6r \u2713 ".encode() + b"\xff")
    os.rename(searchable_storage, root)
    installed = subprocess.run(["locale", "-a"], capture_output=True, text=True).stdout
    missing = "de_DE.UTF-8"
    assert missing.lower().replace("-", "") not in installed.lower(), installed
    locales = {
        "C.UTF-8": {"LC_ALL": "C.UTF-8"},
        "C": {"LC_ALL": "C"},
        "POSIX": {"LC_ALL": "POSIX", "LANG": "POSIX"},
        "missing": {"LC_ALL": missing, "LANG": missing},
        "none": {},
    }
    answers = {
        (locale, name): (ctx(*words, env=base_env(root, **values)), status)
        for locale, values in locales.items()
        for name, words, status in MAIN_COMMANDS
    }
    problems = []
    for (locale, name), (answer, status) in answers.items():
        if answer.rc != status or b"Traceback" in answer.err:
            problems.append(f"{locale}: {answer!r}")
        if name.endswith("json") and answer.rc in (0, 1):
            try:
                utf8_json_lines(answer.out)
            except ValueError as exc:
                problems.append(f"{locale}: not UTF-8 JSON ({exc}): {answer!r}")
        first, _ = answers[("C.UTF-8", name)]
        if (answer.rc, answer.out, answer.err) != (first.rc, first.out, first.err):
            problems.append(f"{locale} differs from C.UTF-8:\n{answer!r}\n{first!r}")
    assert problems == []
    shown = answers[("C", "show")][0].out.decode()
    assert NON_ASCII in shown, shown  # intact, not escaped, in a UTF-8 (coerced) C locale


@pytest.fixture(scope="module")
def latin1(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The locale of a user whose terminal is ISO-8859-1: ``en_US.ISO-8859-1`` compiled into
    a LOCPATH of its own (the host's locales do not change)."""
    localedef = shutil.which("localedef")
    if localedef is None:
        pytest.skip("localedef is not installed")
    where = tmp_path_factory.mktemp("locales")
    subprocess.run([localedef, "-i", "en_US", "-f", "ISO-8859-1", str(where / "en_US.ISO-8859-1")],
                   capture_output=True, timeout=60)  # fmt: skip
    env = {"LOCPATH": str(where), "LC_ALL": "en_US.ISO-8859-1", "LANG": "en_US.ISO-8859-1"}
    probe = subprocess.run(
        [str(Path(CTX).parent / "python"), "-c", "import sys; print(sys.stdout.encoding)"],
        capture_output=True, text=True, env={**base_env(where), **env},
    )  # fmt: skip
    if probe.stdout.strip() != "iso8859-1":
        pytest.skip(f"cannot make an ISO-8859-1 locale here: {probe.stdout}{probe.stderr}")
    return env


def test_narrow_charsets_keep_json_utf8_and_text_free_of_tracebacks(
    searchable_storage: Path, latin1: dict[str, str]
) -> None:
    """§2.4 (``--json`` is machine-readable: one document a JSON reader takes, RFC 8259 §8.1
    UTF-8), README (errors read ``ctx: ERRNO: …``): under an ISO-8859-1 locale, under
    ``PYTHONIOENCODING=latin-1:strict``, and in a C locale with Python's coercion and UTF-8
    mode off, every queue ``--json`` answer (a refusal included) is UTF-8 JSON equal to the
    one under C.UTF-8, and every text answer ends with the status it has under C.UTF-8 and
    no traceback (non-ASCII text written in the charset, or escaped)."""
    build_world(searchable_storage)
    settings = {
        "latin1 locale": latin1,
        "latin-1:strict": {"PYTHONIOENCODING": "latin-1:strict"},
        "C, no coercion": {"LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"},
    }
    as_json = [
        ["queue", "show", "--project", "proj", "fin", "--json"],
        ["queue", "recover", "--project", "proj", "--dry-run", "--json"],
        ["queue", "show", "--project", "proj", "nope", "--json"],
    ]
    as_text = [
        ["queue", "show", "--project", "proj", "fin"],
        ["session", "show", "ci"],
        ["queue", "publish", "--project", "proj", f"/{NON_ASCII}.json"],
    ]
    reference = base_env(searchable_storage, LC_ALL="C.UTF-8")
    expected = {tuple(w): ctx(*w, env=reference) for w in as_json + as_text}
    problems = []
    for setting, values in settings.items():
        env = base_env(searchable_storage, **values)
        for words in as_json:
            answer, first = ctx(*words, env=env), expected[tuple(words)]
            try:
                same = utf8_json_lines(answer.out) == utf8_json_lines(first.out)
            except ValueError as exc:
                same = f"not UTF-8 JSON: {exc}"
            if same is not True or answer.rc != first.rc:
                problems.append(f"{setting}: {same}: {answer!r}")
        for words in as_text:
            answer, first = ctx(*words, env=env), expected[tuple(words)]
            if answer.rc != first.rc or b"Traceback" in answer.err or b"Error" in answer.err:
                problems.append(f"{setting}: {answer!r}")
    assert problems == []
    shown = ctx("queue", "show", "--project", "proj", "fin", env=base_env(searchable_storage,
                **latin1)).out  # fmt: skip
    assert b"caf\xe9 \\u2713" in shown, shown  # the charset's own byte, or escaped


def test_session_json_is_utf8_under_a_latin1_locale(
    searchable_storage: Path, latin1: dict[str, str]
) -> None:
    """S-2, S-5, ``ctx session show --help`` ("--json: JSON Lines, each event as it is
    stored"), RFC 8259 §8.1: the events of a session whose call had a non-ASCII argument are
    printed by ``session show --json`` and ``session tail --json`` as UTF-8 JSON lines —
    what ``events.jsonl`` holds — whatever the locale's charset, as every ``queue … --json``
    answer is; a JSON reader gets the argument back exactly."""
    build_world(searchable_storage, jobs=False)
    events = searchable_storage / f"home/{NOBODY}/agent/ci/session/default/events.jsonl"
    stored = utf8_json_lines(events.read_bytes())
    for setting in (latin1, {"PYTHONIOENCODING": "latin-1"}):
        env = base_env(searchable_storage, **setting)
        for words in (["session", "show", "ci", "--json"], ["session", "tail", "ci", "--json"]):
            answer = ctx(*words, env=env)
            assert answer.rc == 0, answer
            assert utf8_json_lines(answer.out) == stored, answer


# ---------------------------------------------------------------- a terminal


def hostile_entries(storage: Path) -> None:
    """What a queue member, a caller or a tool's author may plant, each name or value holding
    an escape sequence, a C1 CSI or a bidi override: a request file under such a name in
    ``pending/``, a dot-file and a link (ignored, Q-8); a lease whose holder's worker id and
    host are such text; a tool description holding it; a call whose argument holds it,
    recorded in the session of ``ci``."""
    queue = storage / "shared/proj/queue"
    (queue / "pending" / "\x1b[2Jesc.req.json").write_text("{}")
    (queue / "pending" / ".hid\x9b31m.req.json").write_text("{}")
    os.symlink("/etc/passwd", queue / "pending" / "ln\u202e.req.json")
    lease_file = queue / "lease/held.req.json/worker"
    lease = json.loads(lease_file.read_text())
    lease.update(worker=f"w{HOSTILE}", host="h\x1b]0;title\x07")
    lease_file.write_text(json.dumps(lease))
    with open(storage / "tool/fs.stat.d/description", "a") as description:
        description.write(f" {HOSTILE}")
    called = ctx_run("run", "--agent", "ci", "fs.stat", f"/ctx/{HOSTILE}",
                     env=base_env(storage, LANG="C.UTF-8"))  # fmt: skip
    assert called.rc == 1 and "Traceback" not in called.err, called


def test_on_a_dumb_narrow_or_wide_terminal_answers_match_a_pipes_and_stay_escaped(
    searchable_storage: Path,
) -> None:
    """README and docs/queue.md (what others named is shown escaped), §2.4, Q-8: with
    standard output, then standard error, on a pseudo-terminal under ``TERM=dumb``,
    ``NO_COLOR=1`` and ``COLUMNS`` of 10 or 500, the main commands over a queue holding
    planted names, a hostile lease and a tool description with escape sequences answer what
    they answer into a pipe — same bytes, same status, no colour or cursor codes — and
    nothing that others chose reaches the terminal as a raw control, C1 or bidi character
    (a pipe does not show it: click strips ``ESC [`` sequences only from non-terminals)."""
    build_world(searchable_storage)
    hostile_entries(searchable_storage)
    commands = [
        ["queue", "status", "--project", "proj"],
        ["queue", "show", "--project", "proj", "held"],
        ["object", "list"],
        ["session", "show", "ci"],
        ["queue", "show", "--project", "proj", f"j{HOSTILE}"],
        ["queue", "publish", "--project", "proj", f"/no/{HOSTILE}.json"],
    ]
    problems = []
    for number, words in enumerate(commands):
        columns = ("10", "500")[number % 2]
        env = base_env(searchable_storage, LANG="C.UTF-8", TERM="dumb", NO_COLOR="1",
                       COLUMNS=columns)  # fmt: skip
        piped = ctx(*words, env=env, stdin=subprocess.DEVNULL)
        for where in ("stdout", "stderr"):
            shown = on_terminal(words, env, stdout_on_pty=where == "stdout",
                                stderr_on_pty=where == "stderr")  # fmt: skip
            if (shown.rc, shown.out, shown.err) != (piped.rc, piped.out, piped.err):
                problems.append(f"{where} on a terminal:\n{shown!r}\ninto a pipe:\n{piped!r}")
            seen = shown.out if where == "stdout" else shown.err
            if RAW_CONTROL.search(seen):
                problems.append(f"raw control on the terminal ({where}): {shown!r}")
    assert problems == []


def listed(help_text: str) -> tuple[set[str], set[str]]:
    """The commands and the options a click help page lists: the rows of its ``Commands:``
    section, and the option words of the rows of its ``Options:`` section (a row starts two
    spaces in; its wrapped continuation lines start further in)."""
    options, _, commands = help_text.partition("\nCommands:\n")
    options = options.partition("\nOptions:\n")[2]
    rows = re.findall(r"^  (-\S.*?)(?:  |$)", options, re.MULTILINE)
    words = {word for row in rows for word in re.findall(r"--?[a-zA-Z][\w-]*", row)}
    return set(re.findall(r"^  ([a-z][\w.-]*)", commands, re.MULTILINE)), words


def test_help_on_a_terminal_10_or_500_columns_wide_names_every_option_and_command() -> None:
    """§2.4 (every command and option of the queue CLI): ``--help`` of ``ctx`` and of each
    group, and of ``queue work``, on a pseudo-terminal with ``TERM=dumb`` and ``COLUMNS`` of
    10 or 500 exits 0, names the same commands and options at either width (only the
    wrapping and the cut of one-line summaries may differ), and holds no control byte."""
    problems = []
    for words in (["--help"], ["queue", "--help"], ["object", "--help"], ["session", "--help"],
                  ["agent", "--help"], ["queue", "work", "--help"]):  # fmt: skip
        named = {}
        for columns in ("10", "500"):
            env = base_env("/nonexistent", LANG="C.UTF-8", TERM="dumb", COLUMNS=columns)
            shown = on_terminal(words, env)
            if shown.rc != 0 or RAW_CONTROL.search(shown.out) or shown.err:
                problems.append(shown)
            named[columns] = listed(shown.out.decode())
        if named["10"] != named["500"] or not all(named["10"][1:]):
            problems.append(f"{words}: {named}")
        if words == ["queue", "--help"]:
            assert named["10"][0] >= {"init", "publish", "claim", "renew", "finish", "status",
                                      "list", "show", "recover", "work"}, named  # fmt: skip
        if words == ["queue", "work", "--help"]:
            assert {"--drain", "--max-jobs", "--concurrency", "--json"} <= named["10"][1], named
    assert problems == []


def test_a_worker_on_a_terminal_shows_a_failed_jobs_reason_escaped(
    searchable_storage: Path,
) -> None:
    """W-1 (a failed job records its reason), README (what others wrote is shown escaped):
    a publisher puts an escape sequence (clear screen), a C1 CSI and a bidi override into a
    request's input; the tool quotes the input in its error, which becomes the job's reason.
    ``ctx queue work --drain`` with its standard output on a terminal shows the failed job
    and its reason with those characters escaped, as ``ctx queue show`` does."""
    build_world(searchable_storage, jobs=False)
    env = base_env(searchable_storage, LANG="C.UTF-8", TERM="xterm")
    body = json.dumps(request("fs.stat", input={"path": f"/{HOSTILE}"})).encode()
    sent = ctx("queue", "publish", "--project", "proj", "--name", "esc", "-", env=env, input=body)
    assert sent.rc == 0, sent
    worked = on_terminal(["queue", "work", "--project", "proj", "--drain", "--agent", "ci"], env)
    assert worked.rc == 0, worked
    result = json.loads((searchable_storage / "shared/proj/queue/failed/esc.req.json.result")
                        .read_text())  # fmt: skip
    assert HOSTILE in result["reason"], result  # the reason holds what the tool quoted
    assert b"failed  esc.req.json: " in worked.out, worked
    shown = ctx("queue", "show", "--project", "proj", "esc", env=env)
    assert not RAW_CONTROL.search(shown.out), shown  # show escapes it
    assert not RAW_CONTROL.search(worked.out), worked


@pytest.mark.parametrize("term", ["xterm", "dumb"])
def test_a_worker_rewrites_its_live_line_only_on_a_terminal_that_moves_its_cursor(
    searchable_storage: Path, term: str
) -> None:
    """W-1 (docs/workers.md: on a terminal the worker keeps one live line of counts): with
    standard error on a terminal, ``ctx queue work --drain`` rewrites one line (carriage
    return and erase to its end) under TERM=xterm; under TERM=dumb, which moves no cursor
    and erases nothing, it writes no escape sequence and gives each job a line of its own."""
    build_world(searchable_storage, jobs=False)
    env = base_env(searchable_storage, LANG="C.UTF-8", TERM=term)
    body = json.dumps(request("fs.stat", input={"path": "/"})).encode()
    for name in ("one", "two"):
        sent = ctx("queue", "publish", "--project", "proj", "--name", name, "-", env=env,
                   input=body)  # fmt: skip
        assert sent.rc == 0, sent
    worked = on_terminal(["queue", "work", "--project", "proj", "--drain", "--agent", "ci"], env,
                         stdout_on_pty=False, stderr_on_pty=True)  # fmt: skip
    assert worked.rc == 0, worked
    shown = worked.err
    if term == "dumb":
        assert b"\x1b" not in shown and b"\r" not in shown, shown
        assert b"one.req.json" in shown + worked.out and b"two.req.json" in shown + worked.out
    else:
        assert b"\r\x1b[K" in shown, shown


# ---------------------------------------------------------------- outputs that refuse writes


def test_a_terminal_that_hung_up_or_a_read_only_stdout_gets_74_saying_what_was_done(
    storage: Path, tmp_path: Path
) -> None:
    """README (74 "when the output cannot be written … saying what the command had done"),
    Q-1, Q-2, Q-4, Q-6: with standard output on a terminal that hung up (its master closed:
    every write is EIO) ``publish``, ``publish --batch``, ``claim``, ``finish``, ``recover
    --reconcile`` and ``queue init`` do their work, exit 74 with ``ctx: EIO: cannot write
    standard output`` and name what they did, which the storage root shows; a read-only
    descriptor as standard output (EBADF) does the same for ``publish``."""
    env = base_env(storage, LANG="C.UTF-8")
    queue = storage / "shared/proj/queue"
    body = json.dumps(request("fs.stat")).encode()

    def hung_up(*words: str, input: bytes = b"") -> Raw:
        master, slave = pty.openpty()
        os.close(master)
        try:
            return ctx(*words, env=env, input=input, stdout=slave)
        finally:
            os.close(slave)

    def said(answer: Raw, code: str, *facts: str) -> None:
        text = answer.err.decode()
        assert answer.rc == 74, answer
        assert text.startswith(f"ctx: {code}: cannot write standard output"), answer
        assert len(text.splitlines()) == 1 and "Traceback" not in text, answer
        for fact in facts:
            assert fact in text, answer

    said(hung_up("queue", "publish", "--project", "proj", "--name", "one", "-", input=body),
         "EIO", "one.req.json published and pending")  # fmt: skip
    batch = hung_up("queue", "publish", "--project", "proj", "--batch", "-",
                    input=body + b"\n" + body + b"\n")  # fmt: skip
    names = sorted(set(os.listdir(queue / "pending")) - {"one.req.json"})
    assert len(names) == 2, names
    said(batch, "EIO", *names, "published and pending")
    claim = hung_up("queue", "claim", "--project", "proj", "--ttl", "3600")
    said(claim, "EIO", "job one.req.json is claimed and leased to pid")
    finish = hung_up("queue", "finish", "--project", "proj", "one.req.json", "--ok", "-",
                     input=b"{}")  # fmt: skip
    said(finish, "EIO", "job one.req.json was finished in done/")
    assert (queue / "done/one.req.json.result").is_file()
    (queue / "claimed/lost.req.json").mkdir()
    (queue / "claimed/lost.req.json/lost.req.json").write_bytes(body)
    said(hung_up("queue", "recover", "--project", "proj", "--reconcile"), "EIO",
         "the queue was recovered")  # fmt: skip
    assert (queue / "pending/lost.req.json").is_file()
    said(hung_up("queue", "init", "--project", "fresh"), "EIO",
         f"queue {storage}/shared/fresh/queue was made")  # fmt: skip
    assert (storage / "shared/fresh/queue/pending").is_dir()

    readonly = tmp_path / "readonly"
    readonly.write_bytes(b"")
    with open(readonly, "rb") as fd:
        answer = ctx("queue", "publish", "--project", "proj", "--name", "ro", "-", env=env,
                     input=body, stdout=fd)  # fmt: skip
    said(answer, "EBADF", "ro.req.json published and pending")
    assert (queue / "pending/ro.req.json").is_file()


def test_stderr_closed_or_dev_null_changes_no_answer(storage: Path) -> None:
    """§2.4, README (with ``--json`` the error is also one object on stdout): with standard
    error closed (``2>&-``) or ``/dev/null``, a claim whose lease holder is a pid that is
    gone (a note on stderr) still prints its job and exits 0, and a ``--json`` refusal still
    prints its error object and exits 1."""
    env = base_env(storage, LANG="C.UTF-8")
    for name in ("a", "b"):
        assert ctx("queue", "publish", "--project", "proj", "--name", name, "-", env=env,
                   input=json.dumps(request()).encode()).rc == 0  # fmt: skip
    gone = subprocess.Popen(["true"])
    gone.wait()
    for script in ('exec "$@" 2>&-', 'exec "$@" 2>/dev/null'):
        claim = subprocess.run(
            ["/bin/sh", "-c", script, "sh", CTX, "queue", "claim", "--project", "proj",
             "--pid", str(gone.pid)], capture_output=True, env=env, timeout=60,
        )  # fmt: skip
        assert claim.returncode == 0 and claim.stdout in (b"a.req.json\n", b"b.req.json\n"), (
            script, claim)  # fmt: skip
        refused = subprocess.run(
            ["/bin/sh", "-c", script, "sh", CTX, "queue", "show", "--project", "proj", "nope",
             "--json"], capture_output=True, env=env, timeout=60,
        )  # fmt: skip
        assert refused.returncode == 1, (script, refused)
        assert json.loads(refused.stdout)["error"] == "ENOENT", (script, refused)


def to_an_unwritable_stderr(words: list, env: dict, how: str) -> Raw:
    """``ctx WORDS`` with standard error on ``/dev/full`` (ENOSPC) or on a pipe whose reader
    has left (EPIPE); standard output a pipe that is read."""
    if how == "full":
        with open("/dev/full", "wb") as full:
            return ctx(*words, env=env, stdin=subprocess.DEVNULL, stderr=full)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return ctx(*words, env=env, stdin=subprocess.DEVNULL, stderr=write_end)
    finally:
        os.close(write_end)


def test_a_note_that_cannot_be_written_changes_neither_the_answer_nor_the_status(
    storage: Path, tmp_path: Path
) -> None:
    """§2.4 (0 success; 1 refused; 141 only when the output's reader left, README), Q-2,
    D-1: a note on standard error is not the command's answer.  With standard error on
    ``/dev/full`` or a pipe whose reader left, ``ctx queue claim --pid GONE`` (which notes
    that the pid is gone) claims, prints the job and exits 0 — a script reading exit 1 would
    take the claim for refused and leave the job leased —, and ``ctx man tool`` on a root
    without the manual bundle (which notes that the built-in copy is shown) prints the page
    and exits 0."""
    env = base_env(storage, LANG="C.UTF-8")
    for name in ("a", "b"):
        assert ctx("queue", "publish", "--project", "proj", "--name", name, "-", env=env,
                   input=json.dumps(request()).encode()).rc == 0  # fmt: skip
    gone = subprocess.Popen(["true"])
    gone.wait()
    bare = tmp_path / "bare"
    bare.mkdir()
    page = ctx("man", "tool", env=base_env(bare, LANG="C.UTF-8"))
    assert page.rc == 0 and page.err.startswith(b"ctx man: "), page
    problems = []
    for how in ("full", "reader left"):
        claim = to_an_unwritable_stderr(
            ["queue", "claim", "--project", "proj", "--pid", gone.pid], env, how
        )
        if claim.rc != 0 or claim.out not in (b"a.req.json\n", b"b.req.json\n"):
            problems.append(f"stderr {how}: {claim!r}")
        manual = to_an_unwritable_stderr(["man", "tool"], base_env(bare, LANG="C.UTF-8"), how)
        if (manual.rc, manual.out) != (0, page.out):
            problems.append(f"stderr {how}: {manual!r}")
    assert sorted(os.listdir(storage / "shared/proj/queue/claimed")) == ["a.req.json", "b.req.json"]
    assert problems == []


def test_a_json_refusal_keeps_its_object_and_status_when_stderr_cannot_be_written(
    storage: Path,
) -> None:
    """README ("with --json, the same error is also one object on stdout"), §2.4 (exit 1
    refused; 141 only when the reader of the output left): ``ctx queue show J --json`` of a
    job that has no evidence, with standard error on ``/dev/full`` or on a pipe whose reader
    left, still prints ``{"error": "ENOENT", …}`` on its standard output and exits 1."""
    env = base_env(storage, LANG="C.UTF-8")
    problems = []
    for how in ("full", "reader left"):
        answer = to_an_unwritable_stderr(
            ["queue", "show", "--project", "proj", "nope", "--json"], env, how
        )
        try:
            error = json.loads(answer.out)["error"]
        except ValueError:
            error = None
        if (answer.rc, error) != (1, "ENOENT"):
            problems.append(f"stderr {how}: {answer!r}")
    assert problems == []


@pytest.mark.xfail(
    strict=True,
    reason="a standard stream that is a directory stops the interpreter before ctx runs: "
    "'Fatal Python error: init_sys_streams', exit 1, no ctx: ERRNO line",
)
def test_standard_input_or_output_that_is_a_directory_gets_ctxs_own_answer(
    storage: Path, tmp_path: Path
) -> None:
    """§2.4 (1 is "refused or conflict found"), README (errors read ``ctx: ERRNO: …``; 74 when
    the output cannot be written): with standard input a directory (``< DIR``), ``ctx queue
    status``, which reads no input, answers as with ``< /dev/null``, and ``ctx queue publish
    -`` refuses with a ``ctx: ERRNO:`` line and publishes nothing; with standard output a
    directory (``1< DIR``), ``ctx queue status`` ends with 74 and ``ctx: EBADF: cannot write
    standard output`` as with any descriptor that refuses writes."""
    env = base_env(storage, LANG="C.UTF-8")
    directory = tmp_path / "dir"
    directory.mkdir()
    expected = ctx("queue", "status", "--project", "proj", env=env, stdin=subprocess.DEVNULL)
    assert expected.rc == 0, expected
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        status = ctx("queue", "status", "--project", "proj", env=env, stdin=fd)
        publish = ctx("queue", "publish", "--project", "proj", "--name", "d", "-", env=env,
                      stdin=fd)  # fmt: skip
        written = ctx("queue", "status", "--project", "proj", env=env,
                      stdin=subprocess.DEVNULL, stdout=fd)  # fmt: skip
    finally:
        os.close(fd)
    problems = []
    if (status.rc, status.out) != (0, expected.out):
        problems.append(status)
    if publish.rc != 1 or not re.match(rb"ctx: E[A-Z]+: ", publish.err):
        problems.append(publish)
    if written.rc != 74 or not written.err.startswith(b"ctx: EBADF: cannot write standard output"):
        problems.append(written)
    assert not (storage / "shared/proj/queue/pending/d.req.json").exists()
    assert problems == []
