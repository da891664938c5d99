"""The human-readable (non ``--json``) views of ``ctx`` that lay text out in columns or lines,
fed values that are hard to lay out: CJK and other double-width characters, emoji (ZWJ
sequences, variation selectors), combining marks, zero-width characters, right-to-left text,
tabs and values of more than 1 000 characters, with ``COLUMNS`` at 20, 80, 500, unset and not
a number, ``TERM=dumb``, ``NO_COLOR=1``, and stdout a pipe, a file and a pseudo-terminal.

Covered: ``ctx queue status / list / show / recover`` (§2.4, Q-8), ``ctx queue work``'s lines
and its live line (W-1, W-2), ``ctx object list / which`` (T-8a), ``ctx session show / tail``
(S-2), ``ctx agent list`` (A-3), ``ctx policy explain`` (P-5), ``ctx man`` (D-1) and
``--help``.  What a reader expects of them: columns that line up when measured in display
cells (``unicodedata.east_asian_width``, combining and format characters taking none), every
value shown whole, one line per row, a live line that never wraps on the terminal it redraws,
no control sequence when stdout is not a terminal (or is a dumb one), no colour under
``NO_COLOR``, and the same facts as ``--json``."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import shutil
import struct
import subprocess
import termios
import time
import unicodedata
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
    new_scratch_dir,
    scratch_top,
    tool_manifest,
)
from tests.support.storage import copy_of_root

SCRATCH = scratch_top(__file__)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="agents are created as root")

# Values that are hard to lay out.  None is an object name (R-3 keeps those ASCII); each is a
# value a publisher, a manifest author or a session writer chooses.
CJK = "工具调用读取文件"  # 8 characters, 16 cells
FAMILY = "\U0001f469\u200d\U0001f469\u200d\U0001f467"  # one ZWJ emoji sequence
HEART = "\u2764\ufe0f"  # a variation selector asks for the emoji form
COMBINING = "e\u0301e\u0301"  # two cells, four code points
ZERO_WIDTH = "a\u200bb"
RTL = "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd"  # Hebrew, right to left
LONG = "long-" + "\u5b57" * 1200  # more than 1 000 characters, all double width
HARD = f"{CJK} {FAMILY} {HEART} {COMBINING} {ZERO_WIDTH} {RTL}\ttab"

NAME_64 = "t" * 60 + ".abc"  # R-3 at its limit
SPACE_64 = "s" * 64
JOB_64 = "j" * 55  # with ".req.json", a 64-byte J
LABEL = "coder_t"

# The terminals a text view is read on: (environment, width in columns) — COLUMNS unset,
# matching the terminal, and not a number; a dumb terminal; NO_COLOR.
TERMINALS = [
    ({}, 20),
    ({"COLUMNS": "500"}, 500),
    ({"COLUMNS": "not-a-number", "NO_COLOR": "1"}, 80),
    ({"COLUMNS": "80", "TERM": "dumb"}, 80),
]


def cells(text: str) -> int:
    """Display width of ``text`` on a terminal: wide and full-width characters take two
    cells; combining marks, format characters (ZWJ, zero width space) and variation
    selectors take none."""
    total = 0
    for char in text:
        if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me", "Cf"):
            continue
        total += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return total


def column_of(line: str, value: str) -> int:
    """The display cell at which ``value`` starts in ``line`` (it must be there)."""
    at = line.index(value)
    return cells(line[:at])


def controls(text: str) -> list[str]:
    """Every control character in ``text`` but the line feed."""
    return [c for c in text if c != "\n" and unicodedata.category(c) == "Cc"]


# ------------------------------------------------------------------ terminals


@dataclass
class Screen:
    """What a pseudo-terminal received, and what a terminal of ``width`` columns shows of it."""

    raw: str
    width: int
    rc: int

    def rows(self) -> list[str]:
        """The rows a VT100-like terminal shows: printable characters advance the cursor and
        wrap at the right margin, ``\\r`` returns to the first column, ``\\n`` moves down,
        ``ESC [ K`` erases to the end of the row."""
        rows: list[list[str]] = [[]]
        row = col = 0
        pending_wrap = False
        i = 0
        text = self.raw
        while i < len(text):
            char = text[i]
            if text.startswith("\x1b[K", i):
                del rows[row][col:]
                i += 3
                pending_wrap = False
                continue
            i += 1
            if char == "\r":
                col, pending_wrap = 0, False
            elif char == "\n":
                row += 1
                pending_wrap = False
                while len(rows) <= row:
                    rows.append([])
            else:
                w = cells(char)
                if w == 0:
                    continue
                if pending_wrap or col + w > self.width:
                    row, col, pending_wrap = row + 1, 0, False
                    while len(rows) <= row:
                        rows.append([])
                line = rows[row]
                while len(line) < col:
                    line.append(" ")
                line[col:col + w] = [char] + [""] * (w - 1)  # fmt: skip
                col += w
                if col >= self.width:
                    col, pending_wrap = self.width - 1, True
        return ["".join(r).rstrip() for r in rows]

    def text(self) -> str:
        """The bytes as lines (the terminal's ``\\r\\n`` read as ``\\n``)."""
        return self.raw.replace("\r\n", "\n")


def on_pty(argv: list[str], env: dict[str, str], width: int = 80, seconds: float = 30) -> Screen:
    """``argv`` with stdin, stdout and stderr one pseudo-terminal ``width`` columns wide, run
    to its end; everything it wrote."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, width, 0, 0))
    proc = subprocess.Popen(
        argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
    )
    os.close(slave)
    data = b""
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the command and its children are gone
                break
            if not chunk:
                break
            data += chunk
        rc = proc.wait(timeout=max(deadline - time.monotonic(), 1))
    finally:
        os.close(master)
    return Screen(data.decode("utf-8", "replace"), width, rc)


# ------------------------------------------------------------------ the world


@dataclass
class World(OnStorage):
    top: Path
    storage: Path
    uid: int

    def session_dir(self, session: str) -> Path:
        return self.storage / "home" / str(self.uid) / "agent" / "coder" / "session" / session

    def everywhere(self, *args: str) -> list[tuple[str, str]]:
        """``ctx ARGS`` read through a pipe, a file, and a pseudo-terminal in each of
        TERMINALS: (where, what stdout showed), the exit status the pipe's every time."""
        piped = self.ctx(*args)
        seen = [("pipe", piped.out)]
        with open(self.top / f"out-{os.getpid()}.txt", "w+b") as file:
            proc = subprocess.run([*CTX_ARGV, *args], stdout=file, stderr=subprocess.PIPE,
                                  env=self.env, check=False)  # fmt: skip
            file.seek(0)
            seen.append(("file", file.read().decode("utf-8", "replace")))
        assert proc.returncode == piped.rc, proc.stderr
        for extra, width in TERMINALS:
            screen = on_pty([*CTX_ARGV, *args], {"TERM": "xterm", **self.env, **extra}, width)
            assert screen.rc == piped.rc, (extra, width, screen.raw)
            seen.append((f"pty {width} {extra}", screen.text()))
        return seen


def install(world: World, name: str, description: str, tier: str = "system") -> None:
    manifest = tool_manifest(
        world.top / "manifests" / name / tier.replace(":", "-"), name,
        "#!/bin/sh\necho ran\n", description=description,
    )  # fmt: skip
    installed = world.ctx("object", "install", manifest, "--tier", tier)
    assert installed.rc == 0, installed


@pytest.fixture(scope="module")
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(SCRATCH, "world-")
    storage = copy_of_root(_template, top / "storage")
    env = clean_env(CTX_STORAGE=str(storage))
    try:
        request = {"name": "coder", "label": LABEL, "tools": ["fs.read"]}
        made = ctx_run("agent", "create", "-", "--json", input=json.dumps(request), env=env)
        assert made.rc == 0, made
        world = World(top, storage, made.json()["identity"]["uid"])
        made = world.ctx("shared", "create", SPACE_64)
        assert made.rc == 0, made
        install(world, NAME_64, f"Wide {HARD} {LONG}")
        install(world, "short", f"{RTL} and {CJK}")
        install(world, "short", "Short in a space.", tier=f"shared:{SPACE_64}")
        yield world
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def queue(world: World, request: pytest.FixtureRequest) -> QueueCLI:
    """A queue of the test's own in the world's root."""
    project = "q-" + request.node.name.removeprefix("test_")[:40].rstrip("_-.[")
    made = world.ctx("queue", "init", "--project", project)
    assert made.rc == 0, made
    return QueueCLI(world.storage, project)


def fill(queue: QueueCLI) -> dict[str, str]:
    """Jobs in every state, with hard values in their requests and results (claims take the
    oldest first, Q-9): name → state."""
    hard = {"tool": "fs.read", "input": {"path": HARD, "long": LONG}, "from": f"{CJK}{FAMILY}"}
    bases = ["done-" + JOB_64[:50], "failed-" + JOB_64[:48], "a", JOB_64[:-1] + "1", JOB_64]
    names = [queue.publish(hard, name=base) for base in bases]
    for flag in ("--ok", "--error"):
        job = queue.claim("--pid", str(os.getpid()))
        queue.finish(job, flag, {"said": HARD, "long": LONG})
    assert queue.claim("--pid", str(os.getpid())) == names[2]
    return dict(zip(names, ["done", "failed", "claimed", "pending", "pending"], strict=True))


# ------------------------------------------------------------------ the queue (§2.4, Q-8)


def test_queue_status_counts_line_up_and_match_json_on_every_output(
    world: World, queue: QueueCLI
) -> None:
    """§2.4, Q-8: ``status`` shows one right-aligned count per state, each equal to the
    ``--json`` count, the same on a pipe, a file and a terminal of any width, with no control
    character; a file planted in ``pending/`` under a CJK, emoji and right-to-left name is an
    ``ignored`` line naming it whole, as ``--json`` does."""
    fill(queue)
    odd = f"{CJK}{FAMILY}{RTL}.req.json"
    (queue.dir / "pending" / odd).write_text("{}")
    escaped = odd.replace("\u200d", "\\u200d")  # a format character shows as its escape
    as_json = queue.run("status", "--json")
    assert as_json.rc == 0, as_json
    counts = as_json.json()["counts"]
    assert [e["path"] for e in as_json.json()["ignored"]] == [f"pending/{odd}"]
    for where, shown in world.everywhere("queue", "status", "--project", queue.project):
        assert controls(shown) == [], (where, shown)
        lines = shown.splitlines()
        rows = [ln for ln in lines if len(ln.split()) == 2 and ln.split()[1].isdigit()]
        assert {ln.split()[0]: int(ln.split()[1]) for ln in rows} == counts, (where, shown)
        assert len({cells(ln) for ln in rows}) == 1, (where, rows)  # right edge of the counts
        [ignored] = [ln for ln in lines if ln.startswith("ignored    pending/")]
        assert f"pending/{escaped}:" in ignored, (where, ignored)


def test_queue_list_names_every_job_whole_after_a_state_column(
    world: World, queue: QueueCLI
) -> None:
    """§2.4: ``list`` is one ``STATE NAME`` line per job (``--state``: the name alone), the
    names whole (two 64-byte names differing in their last character stay two), starting in
    one column, as ``--json`` lists them."""
    jobs = fill(queue)
    as_json = queue.run("list", "--json")
    assert as_json.rc == 0, as_json
    assert {j["name"]: j["state"] for j in as_json.json()} == jobs
    for where, shown in world.everywhere("queue", "list", "--project", queue.project):
        assert controls(shown) == [], (where, shown)
        lines = shown.splitlines()
        assert {ln.split()[1]: ln.split()[0] for ln in lines} == jobs, (where, shown)
        assert {column_of(ln, ln.split()[1]) for ln in lines} == {11}, (where, lines)
    pending = queue.run("list", "--state", "pending")
    expected = [j["name"] for j in as_json.json() if j["state"] == "pending"]
    assert pending.rc == 0 and pending.lines() == expected, pending


def test_queue_show_request_lease_and_result_lines_are_the_json_documents(
    world: World, queue: QueueCLI
) -> None:
    """§2.4: ``show`` of a finished job gives its request and its result each on one line
    (tabs, ZWJ sequences, right-to-left text and a 1 200-character value included, nothing
    cut), and each line, read as JSON, is what ``show --json`` gives."""
    jobs = fill(queue)
    [done] = [j for j, s in jobs.items() if s == "done"]
    as_json = queue.run("show", done, "--json")
    assert as_json.rc == 0, as_json
    for where, shown in world.everywhere("queue", "show", done, "--project", queue.project):
        assert controls(shown) == [], (where, shown)
        for key in ("request", "result"):
            [line] = [ln for ln in shown.splitlines() if ln.startswith(f"{key}: ")]
            assert json.loads(line.removeprefix(f"{key}: ")) == as_json.json()[key], where


def test_queue_show_evidence_columns_line_up_for_a_64_byte_job(
    world: World, queue: QueueCLI
) -> None:
    """§2.4, Q-6 (every piece of evidence for J): the evidence lines of a claimed job whose
    name is 64 bytes show path, kind and size in columns: each kind starts in one column."""
    job = queue.publish(name=JOB_64)
    assert queue.claim("--pid", str(os.getpid())) == job
    shown = queue.run("show", job)
    assert shown.rc == 0, shown
    evidence = [ln for ln in shown.lines() if ln.startswith("  ")]
    assert len(evidence) == 4, shown
    kinds = {column_of(ln, "directory" if "directory" in ln else "regular file") for ln in evidence}
    assert len(kinds) == 1, evidence


def test_queue_recover_names_each_untouched_job_whole_on_its_own_line(
    world: World, queue: QueueCLI
) -> None:
    """Q-5, Q-6: plain ``recover`` of a queue with two claims held by this live process, one
    of them a 64-byte name, names each on a line of its own, whole, and its summary counts
    agree with ``recover --json``."""
    first = queue.publish(name=JOB_64)
    second = queue.publish(name=JOB_64[:-1] + "1")
    for _ in range(2):
        queue.claim("--pid", str(os.getpid()))
    as_json = queue.run("recover", "--json")
    assert as_json.rc == 0 and as_json.json()["consistent"] is True, as_json
    for where, shown in world.everywhere("queue", "recover", "--project", queue.project):
        assert controls(shown) == [], (where, shown)
        lines = shown.splitlines()
        for job in (first, second):
            assert len([ln for ln in lines if f" {job}:" in ln]) == 1, (where, shown)
        assert "0 requeued" in lines[-1] and "queue consistent" in lines[-1], (where, shown)


# ------------------------------------------------------------------ the worker (W-1, W-2)


def test_worker_lines_on_a_pipe_a_file_and_a_dumb_terminal_are_one_per_job(
    world: World, queue: QueueCLI
) -> None:
    """W-1, W-2: a worker without an agent fails every job (EACCES); on a pipe, a file and a
    ``TERM=dumb`` terminal it writes one ``failed  J: reason`` line per job, the 64-byte name
    whole, and a summary whose count is the number of results in ``failed/``; no escape
    sequence anywhere."""
    names = [JOB_64[:-1] + str(i) for i in range(2)]
    failed = 0
    for round_ in ("pipe", "file", "dumb"):
        jobs = [queue.publish(name=f"{n[:-2]}{round_[0]}{n[-1]}") for n in names]
        argv = [*CTX_ARGV, "queue", "work", "--project", queue.project, "--drain"]
        if round_ == "pipe":
            work = subprocess.run(argv, capture_output=True, env=world.env, check=False)
            rc, out = work.returncode, (work.stdout + work.stderr).decode()
        elif round_ == "file":
            with open(world.top / "work.txt", "w+b") as file:
                rc = subprocess.run(argv, stdout=file, stderr=file, env=world.env).returncode
                file.seek(0)
                out = file.read().decode()
        else:
            screen = on_pty(argv, {**world.env, "TERM": "dumb"})
            rc, out = screen.rc, screen.text()
        assert rc == 0 and controls(out) == [], (round_, out)
        for job in jobs:
            [line] = [ln for ln in out.splitlines() if ln.startswith(f"failed  {job}: ")]
            assert "EACCES" in line, line
        now = len([n for n in os.listdir(queue.dir / "failed") if n.endswith(".result")])
        assert f"worker stopped: 0 done, {now - failed} failed" in out, (round_, out)
        failed = now


def test_worker_live_line_stays_one_row_on_an_80_column_terminal(
    world: World, queue: QueueCLI
) -> None:
    """W-2: on a terminal that moves its cursor the worker redraws one progress line in
    place; with 64-byte job names on an ordinary 80-column terminal, the screen at the end
    holds one progress row, not the wrapped leftovers of every earlier redraw."""
    for i in range(3):
        queue.publish(name=JOB_64[:-1] + str(i))
    argv = [*CTX_ARGV, "queue", "work", "--project", queue.project, "--drain"]
    screen = on_pty(argv, {**world.env, "TERM": "xterm"}, width=80)
    assert screen.rc == 0, screen.raw
    assert "\r\x1b[K" in screen.raw, screen.raw  # the live line is drawn
    progress = [row for row in screen.rows() if "jobs/s" in row and "stopped" not in row]
    assert len(progress) == 1, screen.rows()
    assert all(cells(row) <= 80 for row in screen.rows())


def test_worker_on_a_terminal_under_no_color_writes_no_colour(
    world: World, queue: QueueCLI
) -> None:
    """W-2: with ``NO_COLOR=1`` the worker on a terminal may redraw its line
    (``\\r ESC[K``) but writes no SGR colour sequence."""
    queue.publish(name="plain")
    argv = [*CTX_ARGV, "queue", "work", "--project", queue.project, "--drain"]
    screen = on_pty(argv, {**world.env, "TERM": "xterm-256color", "NO_COLOR": "1"})
    assert screen.rc == 0, screen.raw
    escapes = screen.raw.replace("\r\x1b[K", "")
    assert "\x1b" not in escapes, screen.raw


# ------------------------------------------------------------------ objects (T-8a)


def test_object_list_shows_wide_and_long_descriptions_whole_and_as_json(world: World) -> None:
    """T-8a: ``object list`` gives one line per installed tool whose name, tier and status
    are ``--json``'s, and whose description keeps its CJK, combining, variation-selector and
    right-to-left text and all of its 1 200 wide characters, on every output."""
    as_json = world.ctx("object", "list", "--json")
    assert as_json.rc == 0, as_json
    listed = as_json.json()
    for where, shown in world.everywhere("object", "list"):
        assert controls(shown) == [], (where, shown)
        lines = shown.splitlines()
        assert len(lines) == len(listed), (where, shown)
        for line, entry in zip(lines, listed, strict=True):
            assert line.split()[:3] == [entry["name"], entry["tier"], entry["status"]], line
        [wide] = [ln for ln in lines if ln.startswith(NAME_64 + " ")]
        for piece in (CJK, HEART, COMBINING, RTL, LONG):
            assert piece in wide, (where, piece)


def test_object_list_columns_line_up_with_64_byte_names_and_tiers(world: World) -> None:
    """T-8a: the tier column starts in one place on every line, and so does the status
    column, whether the name is ``short`` or 64 bytes and the tier ``system`` or
    ``shared:`` and a 64-byte space name."""
    shown = world.ctx("object", "list")
    assert shown.rc == 0, shown
    lines = shown.lines()
    tiers = {column_of(ln, " " + ln.split()[1] + " ") for ln in lines}
    statuses = {column_of(ln, " " + ln.split()[2] + " ") for ln in lines}
    assert len(tiers) == 1 and len(statuses) == 1, lines


def test_object_which_prints_the_path_alone_on_every_output(world: World) -> None:
    """T-8a: ``object which`` of a 64-byte name prints its path alone on one line, never
    folded to the terminal's width, as ``--json`` names it."""
    as_json = world.ctx("object", "which", NAME_64, "--json")
    assert as_json.rc == 0, as_json
    path = as_json.json()["path"]
    for where, shown in world.everywhere("object", "which", NAME_64):
        assert shown == path + "\n", (where, shown)


# ------------------------------------------------------------------ sessions (S-2)

EVENTS = [
    ("tool_call", "tool/fs.read", "ok"),
    (CJK[:4], f"tool/{CJK}", "\u6210\u529f"),
    ("tab\there", f"tool/{FAMILY}", f"ok{ZERO_WIDTH}"),
    (COMBINING, f"tool/{COMBINING}{HEART}", "ok"),
    ("rtl", f"tool/{RTL[:4]}", "ok"),
]


def plant_session(world: World, session: str, extra: list[dict] | None = None) -> list[dict]:
    """A session of agent ``coder`` whose events (one JSON line each, as an agent in its own
    home may write them) carry the hard values in the S-2 columns."""
    directory = world.session_dir(session)
    directory.mkdir(parents=True, exist_ok=True)
    events = [
        {"ts": f"2026-06-22T12:00:0{i}Z", "type": kind, "agent": "coder", "session": session,
         "object": thing, "status": status}
        for i, (kind, thing, status) in enumerate(EVENTS)
    ] + (extra or [])  # fmt: skip
    text = "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in events)
    (directory / "events.jsonl").write_text(text)
    return events


def test_session_show_columns_line_up_for_wide_combining_and_escaped_values(
    world: World,
) -> None:
    """S-2: in ``session show`` the object column and the status column each start in one
    display column on every line, whatever the width of the type and object before them."""
    plant_session(world, "widths")
    shown = world.ctx("session", "show", "coder", "widths")
    assert shown.rc == 0, shown
    lines = shown.lines()
    assert len(lines) == len(EVENTS), shown
    objects = {column_of(ln, " tool/") + 1 for ln in lines}
    statuses = {cells(ln.rstrip()) - cells(ln.rstrip().split(" ")[-1]) for ln in lines}
    assert len(objects) == 1 and len(statuses) == 1, lines


def test_session_show_and_tail_keep_one_line_per_event_and_long_values_whole(
    world: World,
) -> None:
    """S-2: ``session show`` and ``tail`` give one line per event on every output, a
    1 200-character object and an extra field shown whole, CJK and right-to-left text as
    they are, and ``--json`` the very events of the file."""
    extra = [{"ts": "2026-06-22T12:00:09Z", "type": "tool_result", "agent": "coder",
              "session": "long", "object": f"tool/{LONG}", "status": "ok",
              "note": HARD}]  # fmt: skip
    events = plant_session(world, "long", extra)
    for command in ("show", "tail"):
        as_json = world.ctx("session", command, "coder", "long", "--json")
        assert as_json.rc == 0, as_json
        assert [json.loads(ln) for ln in as_json.lines()] == events[-len(as_json.lines()) :]
        for where, shown in world.everywhere("session", command, "coder", "long"):
            assert controls(shown) == [], (where, shown)
            lines = shown.splitlines()
            assert len(lines) == len(as_json.lines()), (where, shown)
            assert f"tool/{LONG}" in lines[-1] and CJK in lines[-1] and RTL in lines[-1], where


# ------------------------------------------------------------------ agents, policy, manual


def test_agent_list_gives_each_agent_one_line_with_json_facts(world: World) -> None:
    """A-3: ``agent list`` gives one line per agent, a 64-byte name whole, each naming the
    agent, its label and its uid as ``--json`` does."""
    name = "a" * 64
    request = {"name": name, "label": "long_t", "tools": ["fs.read"]}
    made = world.ctx("agent", "create", "-", "--json", input=json.dumps(request))
    assert made.rc == 0, made
    as_json = world.ctx("agent", "list", "--json")
    assert as_json.rc == 0, as_json
    for where, shown in world.everywhere("agent", "list"):
        lines = shown.splitlines()
        assert len(lines) == len(as_json.json()), (where, shown)
        for line, agent in zip(lines, as_json.json(), strict=True):
            words = line.split()
            assert words[:2] == [agent["name"], agent["label"]], (where, line)
            assert f"uid {agent['identity']['uid']}," in line, (where, line)


def test_policy_explain_steps_line_up_and_match_json(world: World) -> None:
    """P-5, P-8: ``policy explain`` shows its six steps with the verdict and the detail each
    in one column, the detail naming a 64-byte tool whole, as ``--json``'s steps say."""
    args = ("policy", "explain", "coder", f"tool:{NAME_64}", "execute")
    as_json = world.ctx(*args, "--json")
    assert as_json.rc == 1, as_json
    steps = as_json.json()["steps"]
    for where, shown in world.everywhere(*args):
        rows = [ln for ln in shown.splitlines() if ln[:3].strip().isdigit()]
        assert len(rows) == 6, (where, shown)
        verdicts = {column_of(ln, ln[23:].split()[0]) for ln in rows}
        assert len(verdicts) == 1, (where, rows)
        for row, step in zip(rows, steps, strict=True):
            assert step["name"] in row and step["detail"] in row, (where, row)
        assert NAME_64 in rows[1], (where, rows)


def test_man_lists_topics_in_one_column_on_every_output(world: World) -> None:
    """D-1: ``ctx man`` lists one topic a line, the summaries starting in one column."""
    for where, shown in world.everywhere("man"):
        lines = shown.splitlines()
        assert len(lines) >= 8 and controls(shown) == [], (where, shown)
        assert {column_of(ln, ln.split()[1]) for ln in lines} == {11}, (where, lines)


# ------------------------------------------------------------------ --help


def helped(*words: str, env: dict[str, str] | None = None) -> Run:
    return ctx_run(*words, "--help", env=env)


HELP_PAGES = [
    pytest.param((), id="ctx"),
    pytest.param(("queue",), id="queue"),
    pytest.param(("queue", "work"), id="queue-work"),
    pytest.param(("queue", "status"), id="queue-status"),
    pytest.param(("session", "show"), id="session-show"),
    pytest.param(("object", "list"), id="object-list"),
    pytest.param(("agent", "create"), id="agent-create"),
    pytest.param(("agent", "start"), id="agent-start"),
    pytest.param(("object",), id="object"),
    pytest.param(("policy", "explain"), id="policy-explain"),
    pytest.param(("agent", "stop"), id="agent-stop"),
    pytest.param(("policy",), id="policy"),
    pytest.param(("policy", "query"), id="policy-query"),
]


@pytest.mark.parametrize("words", HELP_PAGES)
def test_help_fits_an_80_column_terminal(words: tuple[str, ...]) -> None:
    """With ``COLUMNS=80`` every line of a ``--help`` page fits 80 columns, so that the
    terminal never folds a line in the middle of a word."""
    shown = helped(*words, env=clean_env(COLUMNS="80"))
    assert shown.rc == 0, shown
    wide = [ln for ln in shown.lines() if cells(ln) > 80]
    assert wide == [], wide


def test_help_with_an_unusable_columns_value_is_the_default_page() -> None:
    """A ``COLUMNS`` that is not a positive number is ignored: ``--help`` exits 0 with the page
    shown when it is unset, without a traceback."""
    default = helped("queue", "work", env=clean_env())
    for columns in ("not-a-number", "", "0", "-3", "80x", "99999999999999999999"):
        shown = helped("queue", "work", env=clean_env(COLUMNS=columns))
        assert shown.rc == 0 and "Traceback" not in shown.err, shown
        assert shown.out == default.out, (columns, shown)


@pytest.mark.parametrize("columns", ["20", "80", "500"])
def test_help_at_any_width_names_every_option_and_no_control(columns: str) -> None:
    """At 20, 80 and 500 columns, on a pipe and a terminal, ``queue work --help`` names each
    option the default page names and holds no control sequence."""
    default = helped("queue", "work", env=clean_env())
    options = {w.strip(",") for w in default.out.split() if w.startswith("--")}
    piped = helped("queue", "work", env=clean_env(COLUMNS=columns))
    screen = on_pty([*CTX_ARGV, "queue", "work", "--help"],
                    clean_env(COLUMNS=columns, TERM="xterm"), int(columns))  # fmt: skip
    for shown in (piped.out, screen.text()):
        assert controls(shown) == [], shown
        assert options <= {w.strip(",") for w in shown.split() if w.startswith("--")}, shown
