"""End-to-end flows of the text and the names a real user throws at CortexFS: multi-byte UTF-8,
control characters, NUL bytes and invalid UTF-8 in requests, results and tool output; huge
lines, CRLF, a tool that writes only to stderr, awkward argv words and environment values; and
object names at the exact limits of R-3 (64 bytes, each allowed punctuation, look-alikes, names
differing only in case) used as tool, agent, session, shared space and job names — flowed
through ``ctx queue``, ``ctx queue work``, ``ctx run`` in both modes, the session's events and
the tool's log."""

from __future__ import annotations

import base64
import grp
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    tool_manifest,
)
from tests.support.users import UnprivilegedUser, find_or_create_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as another uid")

# R-3 at its limit: 64 bytes, every punctuation an object name may hold.
AGENT = "Agent.x-y_" + "a" * 53 + "9"
TOOL = "tool.x-y_" + "t" * 54 + "9"
SESSION = "sess.x-y_" + "s" * 54 + "9"
SPACE = "space.x-y_" + "p" * 53 + "9"
JOB_BASE = "job.x-y_" + "j" * 46 + "9"  # 55 bytes: with ".req.json", a 64-byte J
LABEL = "lg_t"
PROBE = "txt.probe"

# Prints its argv, each word followed by a NUL byte: what the tool was given, byte for byte.
ARGV_DUMP = """\
#!/bin/sh
for word in "$@"; do printf '%s\\0' "$word"; done
"""

# One tool, several hostile behaviours, chosen by its argv (terminal) or its input (native).
PROBE_PROGRAM = r"""#!/bin/sh
if [ "$#" -gt 0 ]; then mode=$1; input=""; else input=$(cat); mode=$input; fi
case "$mode" in
*binary-out*)
    printf 'caf\303\251 \377\000\r\nend\376'
    printf 'err\377\000x\r\n' >&2
    exit 3;;
*stderr-only*)
    printf 'only-stderr \342\202\254\n' >&2;;
*wide-stderr*)
    i=0
    while [ $i -lt 3000 ]; do printf '\342\202\254%.0s' 1 2 3 4 5 6 7 8 9 10; i=$((i+1)); done >&2
    printf '\nlast\n' >&2;;
*long-stderr*)
    head -c 60000 /dev/zero | tr '\0' a >&2
    sleep 0.5
    rest=$(head -c 10000 /dev/zero | tr '\0' a)
    printf '%s' "$rest
" >&2;;
*environment*)
    env;;
*)
    printf '%s' "$input";;
esac
"""

BINARY_OUT = b"caf\xc3\xa9 \xff\x00\r\nend\xfe"
BINARY_ERR = b"err\xff\x00x\r\n"


@dataclass
class World(OnStorage):
    storage: Path
    top: Path
    user: UnprivilegedUser

    def run(self, *args: str, input: str | bytes | None = None, **env: str) -> Run:
        return ctx_run("run", "--agent", AGENT, *args, input=input, env={**self.env, **env})

    def raw(self, *args: str, input: bytes = b"") -> subprocess.CompletedProcess:
        """``ctx run --agent AGENT ARGS...`` with its stdout and stderr kept as bytes."""
        return subprocess.run([*CTX_ARGV, "run", "--agent", AGENT, *args], input=input,
                              capture_output=True, env=self.env, timeout=60)  # fmt: skip

    def native(self, payload, *options: str) -> tuple[int, list[dict]]:
        """``ctx run --native``: every stdout line must be one JSON frame (strict UTF-8)."""
        proc = self.raw(*options, "--native", PROBE, input=json.dumps(payload).encode())
        return proc.returncode, strict_jsonl(proc.stdout)

    def raw_native(self, tool: str, payload, session: str) -> tuple[int, list[dict]]:
        proc = self.raw("--session", session, "--native", tool, input=json.dumps(payload).encode())
        return proc.returncode, strict_jsonl(proc.stdout)

    def session_dir(self, session: str) -> Path:
        home = self.storage / "home" / str(self.user.uid)
        return home / "agent" / AGENT / "session" / session

    def tool_log(self, tool: str) -> list[dict]:
        return strict_jsonl((self.storage / "tool" / f"{tool}.d" / "log").read_bytes())


def strict_jsonl(data: bytes) -> list[dict]:
    """JSON Lines as a strict reader takes them: UTF-8 (no replacement), one object a line."""
    text = data.decode("utf-8")  # raises on invalid UTF-8
    assert text == "" or text.endswith("\n"), text[-200:]
    return [json.loads(line) for line in text.split("\n")[:-1]]  # not splitlines(): U+2028


def scalars(value: object) -> Iterator[object]:
    """Every number, string, boolean and null inside ``value``, keys included."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from scalars(item)
    elif isinstance(value, list):
        for item in value:
            yield from scalars(item)
    else:
        yield value


def install(world_env: dict, top: Path, name: str, program: str) -> None:
    r = ctx_run("object", "install", tool_manifest(top / name, name, program), "--tier",
                "system", env=world_env)  # fmt: skip
    assert r.rc == 0, r


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    top = Path(tempfile.mkdtemp(prefix="cortexfs-flow-text-", dir="/tmp"))
    try:
        top.chmod(0o755)
        user = find_or_create_user()
        storage = top / "storage"
        env = clean_env(CTX_STORAGE=str(storage))
        assert ctx_run("bootstrap", "--storage", storage).rc == 0
        install(env, top, TOOL, ARGV_DUMP)
        install(env, top, PROBE, PROBE_PROGRAM)
        tools = [TOOL, PROBE, "shell.exec", "fs.list", "fs.read", "fs.write"]
        request = {"name": AGENT, "label": LABEL, "mount": [], "tools": tools}
        r = ctx_run("agent", "create", "--user", user.name, "-", input=json.dumps(request),
                    env=env)  # fmt: skip
        assert r.rc == 0, r
        for tool in tools:
            with (storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
                policy.write(f"allow {LABEL} tool:{tool} execute\n")
        group = grp.getgrgid(user.gid).gr_name
        r = ctx_run("shared", "create", SPACE, "--group", group, env=env)
        assert r.rc == 0, r
        r = ctx_run("queue", "init", "--project", SPACE, env=env)
        assert r.rc == 0, r
        yield World(storage, top, user)
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def space_queue(world: World) -> QueueCLI:
    """The queue of the 64-byte space."""
    return QueueCLI(world.storage, SPACE)


@pytest.fixture
def fresh_queue(world: World, request: pytest.FixtureRequest) -> QueueCLI:
    """A queue of its own for one test (``ctx queue init``), so no other test's job is in it."""
    project = "q-" + request.node.name.removeprefix("test_")[:40].rstrip("_-.")
    r = ctx_run("queue", "init", "--project", project, env=world.env)
    assert r.rc == 0, r
    return QueueCLI(world.storage, project)


# ------------------------------------------------------------------ R-3 at its limits


def test_names_of_exactly_64_bytes_flow_through_every_subsystem(world, space_queue):
    """R-3, §2.4, W-1, S-1, T-7: a 64-byte agent, tool, session and shared space name, each
    holding ``.``, ``-`` and ``_``, and a 64-byte job name, work together: the job published in
    the space's queue is run by ``ctx queue work`` as that agent into that session, a terminal
    call of the 64-byte tool records in the same session, and every name comes back whole."""
    job = JOB_BASE + ".req.json"
    assert len(job.encode()) == 64
    r = space_queue.run(
        "publish",
        "--name",
        JOB_BASE,
        "-",
        input=json.dumps({"tool": "shell.exec", "input": {"cmd": "echo ok"}}),
    )
    assert r.rc == 0 and r.out == job + "\n", r
    work = space_queue.run("work", "--agent", AGENT, "--session", SESSION, "--drain")
    assert work.rc == 0, work
    assert space_queue.state(job) == "done"
    done = json.loads((space_queue.dir / "done" / f"{job}.result").read_bytes().decode())
    assert done["status"] == "ok" and done["output"] == "ok\n", done

    r = world.run("--session", SESSION, TOOL, "x")
    assert r.rc == 0 and r.out == "x\0", r

    shown = world.ctx("session", "show", AGENT, SESSION, "--json")
    assert shown.rc == 0, shown
    events = strict_jsonl(shown.out.encode())
    assert events == strict_jsonl((world.session_dir(SESSION) / "events.jsonl").read_bytes())
    assert {e["agent"] for e in events} == {AGENT}
    assert {e["session"] for e in events} == {SESSION}
    objects = {e["object"] for e in events}
    assert {f"queue/{job}", "tool/shell.exec", f"tool/{TOOL}"} <= objects, objects
    logged = world.tool_log(TOOL)
    assert logged and logged[-1]["agent"] == AGENT and logged[-1]["argv"] == ["x"], logged
    listed = world.ctx("session", "list", AGENT, "--json")
    assert listed.rc == 0 and SESSION in [s["name"] for s in listed.json()], listed


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("over", "a" * 65),
        ("cyrillic o", "c\u043eder"),
        ("fullwidth first letter", "\uff23oder"),
        ("control suffix", "coder.d"),
    ],
)
def test_a_name_one_past_r3_is_einval_as_agent_tool_session_space_and_job(world, kind, name):
    """R-3: one byte over 64, a Unicode look-alike of a legal name, or the ``.d`` suffix is
    ``EINVAL`` wherever a name is given — agent create, object check, shared create,
    ``ctx run --session``, ``queue publish --name`` — and nothing of it is made."""
    env = world.env
    before = {p: sorted(os.listdir(world.storage / p)) for p in ("agent", "tool", "shared")}

    agent = ctx_run(
        "agent",
        "create",
        "--user",
        world.user.name,
        "-",
        input=json.dumps({"name": name, "label": "bad_t", "tools": []}),
        env=env,
    )
    assert agent.rc != 0 and "EINVAL" in agent.err, agent

    manifest = tool_manifest(world.top / "bad", "placeholder", "#!/bin/sh\n")
    document = json.loads(manifest.read_text())
    document["name"] = name
    manifest.write_text(json.dumps(document, ensure_ascii=False))
    check = ctx_run("object", "check", manifest, env=env)
    assert check.rc == 1 and "EINVAL" in check.out + check.err, check

    space = ctx_run("shared", "create", name, env=env)
    assert space.rc != 0 and "EINVAL" in space.err, space

    run = world.run("--session", name, TOOL)
    assert run.rc == 2 and run.err.startswith("ctx: EINVAL: illegal session name"), run

    if kind != "control suffix":  # "coder.d.req.json" is a legal job name
        job = QueueCLI(world.storage, SPACE).run(
            "publish", "--name", name, "-", input='{"tool": "fs.read", "input": {}}'
        )
        assert job.rc == 2 and "EINVAL" in job.err and "illegal job name" in job.err, job

    after = {p: sorted(os.listdir(world.storage / p)) for p in ("agent", "tool", "shared")}
    assert after == before
    assert not world.session_dir(name).exists()


def test_job_names_differing_only_in_case_are_two_jobs_with_their_own_results(fresh_queue):
    """R-3, Q-1, Q-4: ``Build``, ``build`` and ``BUILD`` are three object names: publishing
    one never refuses another with EEXIST, and each is claimed and finished with its own
    result."""
    names = ["Build", "build", "BUILD"]
    for name in names:
        req = {"tool": "fs.read", "input": {"path": name}}
        r = fresh_queue.run("publish", "--name", name, "-", input=json.dumps(req))
        assert r.rc == 0 and r.out == f"{name}.req.json\n", r
    again = fresh_queue.run(
        "publish", "--name", "build", "-", input='{"tool":"fs.read","input":{}}'
    )
    assert again.rc == 1 and "EEXIST" in again.err, again
    claimed = {}
    for _ in names:
        r = fresh_queue.run("claim", "--json")
        assert r.rc == 0, r
        claimed[r.json()["name"]] = r.json()["request"]["input"]["path"]
    assert claimed == {f"{n}.req.json": n for n in names}
    for name in names:
        r = fresh_queue.run(
            "finish", f"{name}.req.json", "--ok", "-", input=json.dumps({"was": name})
        )
        assert r.rc == 0, r
    for name in names:
        shown = fresh_queue.run("show", f"{name}.req.json", "--json")
        assert shown.rc == 0 and shown.json()["result"]["output"] == {"was": name}, shown


# ------------------------------------------------------------------ the queue (§2)


HOSTILE = {
    "tool": "shell.exec",
    "input": {
        "cmd": "printf '%s' \"$NOTE\"",
        "note": "caf\u00e9 \u65e5\u672c\u8a9e \U0001f389 a\r\nb\tc \u0000 \u202eevil\u202c \ufeff",
        "argv": ["-n", "--", "\"fresh_queue'", "--help", ""],
        "combining": "e\u0301",
    },
    "\u00ff\u00e9 key": "\\",
}


def test_a_multibyte_crlf_request_is_stored_as_given_and_round_trips_exactly(fresh_queue):
    """§2.1, §2.4, Q-1: a request written as a pretty-printed CRLF file of multi-byte UTF-8,
    NUL and bidi escapes is stored as the given bytes (whitespace around it trimmed, only
    ``from`` and ``created`` put in front), and ``claim --json``, ``show --json`` and
    ``list --json`` give back exactly the object published; its result, a non-ASCII JSON
    document, comes back exactly from ``finish --json`` and ``show --json``."""
    given = json.dumps(HOSTILE, ensure_ascii=False, indent=2).replace("\n", "\r\n")
    data = ("\r\n  " + given + "\r\n\r\n").encode()
    job = "Crlf.utf8-req_1.req.json"
    r = fresh_queue.run("publish", "--name", job, "-", input=data)
    assert r.rc == 0 and r.out == job + "\n", r

    stored = (fresh_queue.dir / "pending" / job).read_bytes()
    body = given.encode()
    assert stored.startswith(b'{"from":') and stored.rstrip(b"\n").endswith(body[1:]), stored
    assert "\u65e5\u672c\u8a9e".encode() in stored  # not re-encoded as \\u escapes

    claim = fresh_queue.run("claim", "--json")
    assert claim.rc == 0, claim
    request = claim.json()["request"]
    assert claim.json()["name"] == job
    assert {k: v for k, v in request.items() if k not in ("from", "created")} == HOSTILE
    assert list(request)[:2] == ["from", "created"]

    output = {"r\u00e9sum\u00e9": ["\u00e9" * 3, "\U0001f600", "line1\r\nline2", "\u0000"],
              "n": 1.5, "empty": ""}  # fmt: skip
    fin = fresh_queue.run(
        "finish", job, "--ok", "--json", "-", input=json.dumps(output, ensure_ascii=False)
    )
    assert fin.rc == 0, fin
    assert fin.json()["result"]["output"] == output and fin.json()["state"] == "done"
    show = fresh_queue.run("show", job, "--json")
    assert show.rc == 0, show
    assert show.json()["request"] == request and show.json()["result"]["output"] == output
    listed = fresh_queue.run("list", "--state", "done", "--json")
    assert listed.rc == 0, listed
    assert job in json.dumps(listed.json()), listed


def test_a_result_file_of_invalid_utf8_and_nul_keeps_every_json_output_valid(fresh_queue):
    """§2.1, §2.4, Q-4: ``finish`` given a result file that is not UTF-8 (a lone ``\\xff``,
    NUL, CRLF) keeps it as text: ``finish --json``, ``show --json`` and the result file on disk
    stay strict UTF-8 JSON, and the valid text around the bad bytes is kept."""
    r = fresh_queue.run("publish", "--name", "Bin.out", "-", input='{"tool":"fs.read","input":{}}')
    assert r.rc == 0, r
    job = fresh_queue.claim()
    assert job == "Bin.out.req.json"
    fin = fresh_queue.run("finish", job, "--error", "--json", "-", input=BINARY_OUT)
    assert fin.rc == 0, fin
    finished = json.loads(fin.out.encode("utf-8", "surrogateescape").decode("utf-8"))
    on_disk = json.loads((fresh_queue.dir / "failed" / f"{job}.result").read_bytes().decode())
    show = fresh_queue.run("show", job, "--json")
    assert show.rc == 0, show
    shown = json.loads(show.out.encode("utf-8", "surrogateescape").decode("utf-8"))
    output = on_disk["output"]
    assert isinstance(output, str) and on_disk["status"] == "error", on_disk
    assert output.startswith("caf\u00e9 ") and "\u0000\r\nend" in output, output
    output.encode("utf-8")  # no lone surrogate smuggled in: it is storable text
    assert finished["result"] == on_disk and shown["result"] == on_disk
    text = fresh_queue.run("show", job)
    assert text.rc == 0 and "\x00" not in text.out, text


def test_worker_id_is_1_to_255_bytes_of_printable_utf8_counted_in_bytes(fresh_queue):
    """Q-3, §2.4 (docs/queue.md ``--worker``): a worker id of 255 bytes of two-byte characters
    is taken and recorded whole in the lease; 256 bytes, or a newline or tab in it, is EINVAL,
    exit 2, with the job still pending."""
    r = fresh_queue.run("publish", "--name", "Wid", "-", input='{"tool":"fs.read","input":{}}')
    assert r.rc == 0, r
    for bad in ("\u00e9" * 128, "a\nb", "a\tb", "a\x1b[2Jb"):
        refused = fresh_queue.run("claim", "--worker", bad)
        assert refused.rc == 2 and "EINVAL" in refused.err, refused
        assert fresh_queue.state("Wid.req.json") == "pending"
    fits = "\u00e9" * 127 + "x"
    assert len(fits.encode()) == 255
    claim = fresh_queue.run("claim", "--worker", fits, "--json")
    assert claim.rc == 0, claim
    assert claim.json()["lease"]["worker"] == fits
    assert fresh_queue.lease("Wid.req.json")["worker"] == fits
    fin = fresh_queue.run("finish", "Wid.req.json", "--ok", "--json", "-", input="{}")
    assert fin.rc == 0, fin
    assert fin.json()["result"]["worker"]["id"] == fits, fin


# ------------------------------------------------------------------ the worker (§3)


def test_worker_results_keep_binary_stderr_only_and_huge_line_output_valid(world, fresh_queue):
    """W-1, §2.1, S-4, T-7: jobs whose command prints invalid UTF-8 with NUL and CRLF, prints
    only to stderr, prints 300 two-byte characters, or prints one 300 000-byte line are all
    finished in ``done/`` with results that are strict UTF-8 JSON; the caller-facing result
    keeps the output whole, while the session and the tool log keep the first 200 characters
    and a note of what went."""
    cmds = {
        "Out.binary": "printf 'caf\\303\\251 \\377\\000\\r\\nend\\376'",
        "Out.stderr": "printf 'only-stderr \\342\\202\\254\\n' >&2",
        "Out.wide": "i=0; while [ $i -lt 300 ]; do printf '\\303\\251'; i=$((i+1)); done",
        "Out.huge": "head -c 300000 /dev/zero | tr '\\0' y",
    }
    for name, cmd in cmds.items():
        r = fresh_queue.run(
            "publish",
            "--name",
            name,
            "-",
            input=json.dumps({"tool": "shell.exec", "input": {"cmd": cmd}}),
        )
        assert r.rc == 0, r
    session = "text-worker"
    work = fresh_queue.run("work", "--agent", AGENT, "--session", session, "--drain")
    assert work.rc == 0, work
    results = {}
    for name in cmds:
        job = f"{name}.req.json"
        assert fresh_queue.state(job) == "done", (job, work)
        results[name] = json.loads(
            (fresh_queue.dir / "done" / f"{job}.result").read_bytes().decode()
        )
        shown = fresh_queue.run("show", job, "--json")
        assert shown.rc == 0 and shown.json()["result"] == results[name], shown

    binary = results["Out.binary"]["output"]
    assert binary.startswith("caf\u00e9 ") and "\u0000\r\nend" in binary, binary
    assert results["Out.stderr"]["output"] == ""
    assert results["Out.stderr"]["stderr"] == "only-stderr \u20ac\n"
    assert results["Out.wide"]["output"] == "\u00e9" * 300
    assert results["Out.huge"]["output"] == "y" * 300000

    events = strict_jsonl((world.session_dir(session) / "events.jsonl").read_bytes())
    summaries = [e["output"] for e in events if e["type"] == "tool_result"]
    assert "\u00e9" * 200 + "\u2026[+100 chars]" in summaries, summaries
    assert "y" * 200 + "\u2026[+299800 chars]" in summaries, [s[-30:] for s in summaries]
    calls = {e["call"] for e in events if e["type"] == "tool_result"}
    logged = [e for e in world.tool_log("shell.exec") if e.get("call") in calls]
    assert len(logged) == 4, logged
    assert max(len(json.dumps(e)) for e in logged + events) < 8192


# ------------------------------------------------------------------ terminal mode (T-3)


def test_terminal_mode_passes_argv_words_and_output_bytes_unchanged(world):
    """T-3 (docs/tools.md *Terminal CLI mode*): every word after TOOL — leading dashes, ``--``,
    ``--native``, newlines, quotes, multi-byte text, an empty word, a 100 000-byte word —
    reaches the tool exactly; its stdout and stderr of invalid UTF-8, NUL and CRLF reach the
    caller byte for byte, with its exit status; the event records the argv summarised."""
    long_word = "\u00e9" * 50000  # 100 000 bytes
    words = ["--", "-n", "--native", "--help", "a\nb", "\"q'", "\u65e5\u672c \U0001f389", "",
             "x\r\ny", long_word]  # fmt: skip
    r = world.run("--session", "argv", TOOL, *words)
    assert r.rc == 0, r
    assert r.out == "".join(w + "\0" for w in words)

    raw = world.raw("--session", "argv", PROBE, "binary-out")
    assert raw.returncode == 3, raw
    assert raw.stdout == BINARY_OUT and raw.stderr == BINARY_ERR

    events = strict_jsonl((world.session_dir("argv").joinpath("events.jsonl")).read_bytes())
    call = next(e for e in events if e["type"] == "tool_call" and e["object"] == f"tool/{TOOL}")
    recorded = call["argv"]
    assert recorded[:9] == words[:9], recorded
    assert recorded[9] == "\u00e9" * 200 + "\u2026[+49800 chars]", recorded[9][-40:]
    results = [e for e in events if e["type"] == "tool_result" and e["object"] == f"tool/{PROBE}"]
    assert [e["exit_status"] for e in results] == [3], results


def test_host_environment_values_with_newlines_never_reach_the_tool(world):
    """T-3 (docs/tools.md *Environment*): the tool gets exactly its environment: a host
    variable holding a newline is not passed, and a ``TERM`` that is not a plain terminfo name
    (one with a newline in it) becomes ``xterm-256color``; ``LANG`` is ``C.UTF-8``."""
    r = world.run("--session", "env", PROBE, "environment",
                  TERM="xterm\nINJECTED=1", HOST_NOTE="first\nCTX_AGENT=root")  # fmt: skip
    assert r.rc == 0, r
    seen = r.out.splitlines()
    assert "TERM=xterm-256color" in seen, seen
    assert "LANG=C.UTF-8" in seen and f"CTX_AGENT={AGENT}" in seen, seen
    assert not any(line.startswith(("HOST_NOTE=", "INJECTED=")) for line in seen), seen
    assert "CTX_AGENT=root" not in seen


# ------------------------------------------------------------------ native mode (T-3)


def test_native_frames_stay_jsonl_when_the_tool_writes_invalid_utf8(world):
    """T-3 (docs/tools.md *Agent native mode*): a tool writing invalid UTF-8, NUL and CRLF on
    stdout and stderr still gives one strict-UTF-8 JSON frame a line — ``call``, ``stderr``,
    ``result`` last — with the status, exit status and stage of a non-zero exit; the session
    records the same call as valid JSON."""
    rc, got = world.native({"m": "binary-out"}, "--session", "native-bin")
    assert rc == 1, got
    assert [f["type"] for f in got] == ["call", "stderr", "result"], got
    call, err, result = got
    assert err["call"] == call["call"] == result["call"]
    assert err["text"].startswith("err") and "\u0000x" in err["text"], err
    assert result["status"] == "error" and result["exit_status"] == 3
    assert result["error"]["stage"] == "exit" and result["error"]["errno"] is None
    assert result["output"].startswith("caf\u00e9 ") and "\u0000\r\nend" in result["output"]
    assert result["stderr"].startswith("err") and result["stderr"].endswith("x\r\n")
    events = strict_jsonl((world.session_dir("native-bin") / "events.jsonl").read_bytes())
    assert [e["type"] for e in events] == ["tool_call", "tool_result"]
    assert events[1]["status"] == "error" and events[1]["exit_status"] == 3
    shown = world.ctx("session", "show", AGENT, "native-bin", "--json")
    assert shown.rc == 0 and strict_jsonl(shown.out.encode()) == events


def test_native_stderr_only_tool_gives_an_empty_output_and_its_stderr(world):
    """T-3, §result: a tool that writes only to stderr and exits 0 is ``ok`` with output ``""``;
    its multi-byte stderr line arrives whole as a ``stderr`` frame and in ``stderr``."""
    rc, got = world.native({"m": "stderr-only"}, "--session", "native-err")
    assert rc == 0, got
    assert [f["type"] for f in got] == ["call", "stderr", "result"], got
    assert got[1]["text"] == "only-stderr \u20ac"
    assert got[2]["output"] == "" and got[2]["stderr"] == "only-stderr \u20ac\n"


def test_native_stderr_line_longer_than_64_kib_arrives_in_pieces(world):
    """T-3 (docs/tools.md frames table): a stderr line longer than 64 KiB arrives in pieces of
    at most 64 KiB, also when its end comes in a later write than its start (60 000 bytes,
    a pause, then 10 000 bytes and the newline); the pieces put together are the line."""
    rc, got = world.native({"m": "long-stderr"}, "--session", "native-long")
    assert rc == 0, got[-1]
    pieces = [f["text"] for f in got if f["type"] == "stderr"]
    assert "".join(pieces) == "a" * 70000, [len(p) for p in pieces]
    assert all(len(p.encode()) <= 65536 for p in pieces), [len(p) for p in pieces]


def test_native_stderr_of_multibyte_text_keeps_whole_characters(world):
    """T-3 (docs/tools.md frames and result): 90 000 bytes of ``€`` on one stderr line arrive
    in frames of at most 64 KiB with no character split, and the result's ``stderr`` is the
    last 64 KiB of what the tool wrote: a suffix of its text, no character it never wrote."""
    rc, got = world.native({"m": "wide-stderr"}, "--session", "native-wide")
    assert rc == 0, got[-1]
    written = "\u20ac" * 30000 + "\nlast\n"
    result = got[-1]
    assert "\ufffd" not in result["stderr"], result["stderr"][:5]
    assert written.endswith(result["stderr"]) and len(result["stderr"].encode()) <= 65536
    pieces = [f["text"] for f in got if f["type"] == "stderr"]
    assert "".join(pieces) == "\u20ac" * 30000 + "last"
    assert all(len(p.encode()) <= 65536 and "\ufffd" not in p for p in pieces)


# ------------------------------------------------------------------ sessions and logs (S-4)


def test_hostile_text_in_an_input_is_summarised_redacted_and_shown_one_line_per_event(world):
    """S-2, S-4, S-5, T-7 (docs/sessions.md *What logs may say*): an input holding control
    characters, NUL, an escape sequence, secret-naming keys in any case and 300 astral-plane
    characters reaches the tool and the caller whole, while the session and the tool log keep
    the secrets ``[redacted]`` (not ``tokenizer``) and the long text cut to its first 200
    characters with the count of those dropped; ``session show`` prints one line per event
    with no raw control byte, and ``--json`` gives back the events themselves."""
    payload = {
        "note": "a\nb\r\nc\x1b[2J\x07\u0000 \u00e9\u202e \u2028 \u0085 \x0c",
        "Api-Token": "abc123-\u00e9",
        "DB_PASSWORD": 12345,
        "tokenizer": "bpe-\u65e5\u672c",
        "long": "\U0001f389" * 300,
    }
    rc, got = world.native(payload, "--session", "hostile")
    assert rc == 0, got[-1]
    assert got[-1]["output"] == payload  # the caller gets the output as it was

    path = world.session_dir("hostile") / "events.jsonl"
    events = strict_jsonl(path.read_bytes())
    call = next(e for e in events if e["type"] == "tool_call")
    summary = call["input"]
    assert summary["note"] == payload["note"]
    assert summary["Api-Token"] == "[redacted]" and summary["DB_PASSWORD"] == "[redacted]"
    assert summary["tokenizer"] == payload["tokenizer"]
    assert summary["long"] == "\U0001f389" * 200 + "\u2026[+100 chars]", summary["long"][-20:]
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["output"] == summary
    # Compared value by value: the secret number's digits may well turn up in a timestamp.
    for value in scalars([events, world.tool_log(PROBE)]):
        assert str(value) != "12345" and "abc123" not in str(value), value
    logged = [e for e in world.tool_log(PROBE) if e.get("call") == call["call"]]
    assert len(logged) == 1 and logged[0]["input"] == summary, logged

    shown = world.ctx("session", "show", AGENT, "hostile", "--json")
    assert shown.rc == 0 and strict_jsonl(shown.out.encode()) == events
    text = world.ctx("session", "show", AGENT, "hostile")
    assert text.rc == 0, text
    assert len(text.out.splitlines()) == len(events), text.out
    assert not any(c in text.out for c in "\x1b\x07\x00\r\u202e\u2028\x85\x0c"), text.out


def test_a_summary_over_8_kib_of_multibyte_text_becomes_a_note_of_its_size(world):
    """S-4, T-7 (docs/sessions.md: "a summary still longer than 8 KiB becomes a note of its
    size"): twenty keys of 200 four-byte characters each — nothing for the 200-character cut
    to take, 16 KB of UTF-8 — are logged as the note, so one event stays one short line."""
    payload = {f"k{i:02d}": "\U0001f389" * 200 for i in range(20)}
    rc, got = world.native(payload, "--session", "wide-input")
    assert rc == 0 and got[-1]["output"] == payload, got[-1]
    path = world.session_dir("wide-input") / "events.jsonl"
    call = next(e for e in strict_jsonl(path.read_bytes()) if e["type"] == "tool_call")
    logged = json.dumps(call["input"], ensure_ascii=False).encode()
    assert isinstance(call["input"], str) or len(logged) <= 8192, len(logged)
    assert max(len(line) for line in path.read_bytes().split(b"\n")) <= 8192 + 1024


def test_a_file_name_that_is_not_utf8_goes_from_fs_list_through_the_queue_to_fs_read(
    world, fresh_queue
):
    """R-5 core tools (docs/tools.md: a name that is not UTF-8 leaves ``fs.list`` with each odd
    byte as its surrogate escape and comes back as the same name), §2.1, W-1: the listed name
    put into a queue request is read by a worker, whose result gives the file's bytes in
    base64; a lone ``\\ud800`` is EINVAL; every result and event stays strict UTF-8 JSON."""
    folder = agent_folder(world, "odd-names")
    data = b"bin\xff\x00\r\ndata\xfe"
    raw_name = b"caf\xe9 \xff.bin"
    with open(os.path.join(os.fsencode(folder), raw_name), "wb") as odd:
        odd.write(data)
    view = f"/ctx/home/{world.user.uid}/odd-names"

    rc, got = world.raw_native("fs.list", {"path": view}, "odd")
    assert rc == 0, got[-1]
    names = [e["name"] for e in got[-1]["output"]["entries"]]
    assert names == ["caf\udce9 \udcff.bin"], names

    path = f"{view}/{names[0]}"
    for name, req in (
        ("Odd.read", {"tool": "fs.read", "input": {"path": path}}),
        ("Lone.read", {"tool": "fs.read", "input": {"path": f"{view}/caf\ud800"}}),
    ):
        r = fresh_queue.run("publish", "--name", name, "-", input=json.dumps(req))
        assert r.rc == 0, r
    work = fresh_queue.run("work", "--agent", AGENT, "--session", "odd-worker", "--drain")
    assert work.rc == 0, work
    assert fresh_queue.state("Odd.read.req.json") == "done", work
    assert fresh_queue.state("Lone.read.req.json") == "failed", work
    done = json.loads((fresh_queue.dir / "done" / "Odd.read.req.json.result").read_bytes().decode())
    assert done["output"]["encoding"] == "base64" and done["output"]["path"] == path
    assert base64.b64decode(done["output"]["content"]) == data
    failed = json.loads(
        (fresh_queue.dir / "failed" / "Lone.read.req.json.result").read_bytes().decode()
    )
    assert failed["error"]["error"] == "EINVAL" and failed["exit_status"] == 2, failed

    for session in ("odd", "odd-worker"):
        events = strict_jsonl((world.session_dir(session) / "events.jsonl").read_bytes())
        assert events and all(e["agent"] == AGENT for e in events)


def agent_folder(world: World, name: str) -> Path:
    """A directory of the agent's own in its home, which ``/ctx/home/<uid>`` shows it."""
    home = world.storage / "home" / str(world.user.uid)
    folder = home / name
    folder.mkdir(parents=True, exist_ok=True)
    os.chown(home, world.user.uid, world.user.gid)
    os.chown(folder, world.user.uid, world.user.gid)
    return folder


@pytest.mark.parametrize("native", [True, False])
def test_fs_write_to_a_name_fs_list_gave_succeeds_or_writes_nothing(world, native):
    """R-5 core tools (docs/tools.md: a name that is not UTF-8 leaves ``fs.list`` as surrogate
    escapes and "comes back into the other tools as the same name"; bad input is EINVAL, exit
    2): ``fs.write`` to ``copy-\\udce9`` either succeeds, writing ``copy-\\xe9``, or refuses
    and writes nothing — never both a written file and a failure."""
    folder = agent_folder(world, f"odd-write-{native}")
    path = f"/ctx/home/{world.user.uid}/{folder.name}/copy-\udce9"
    payload = json.dumps({"path": path, "content": "aGk=", "encoding": "base64"})
    if native:
        proc = world.raw("--session", "odd-write", "--native", "fs.write", input=payload.encode())
        assert strict_jsonl(proc.stdout)[-1]["status"] == (
            "ok" if proc.returncode == 0 else "error"
        )
    else:
        proc = world.raw("--session", "odd-write", "fs.write", payload)
    written = os.listdir(os.fsencode(folder))
    assert written in ([], [b"copy-\xe9"]), written
    assert (proc.returncode == 0) == (written == [b"copy-\xe9"]), (proc.stderr, written)
    assert proc.returncode == 0, proc.stderr
