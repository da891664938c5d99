"""Text and ``--json`` tell one story.

Every command that answers both in text and with ``--json`` (``ctx queue``, ``ctx session``,
``ctx policy``, ``ctx object``, ``ctx agent``, ``ctx shared``, ``ctx bootstrap``, ``ctx man``,
``ctx tool``; ``ctx run`` in terminal and native mode; ``ctx queue work``) is run both ways on
the same state, or on two copies of one state for the commands that change it: states with
ignored entries, conflicts, incomplete pairs, stale temp files, damaged and torn session
lines, unusable agent controls, withheld mounts, damaged tools, invalid policies and
manifests, and refusals.  What is checked: the counts, names, states, reasons, warnings and
exit statuses are the same both ways; ``--json`` prints exactly one JSON document on stdout
(JSON Lines where the help says so) and nothing else there; a refusal is the documented
``{"error", "errno", "message"}`` object with the errno and exit status of the text mode's
``ctx: ERRNO: message`` line (SPEC §2.4, README, docs/queue.md, docs/sessions.md,
docs/policy.md, docs/tools.md and each command's ``--help``); and what the JSON reports is
in the text as well, where the docs say the text shows it."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    QueueCLI,
    Run,
    age,
    clean_env,
    ctx_run,
    new_scratch_dir,
    request,
    scratch_top,
    snapshot,
    tool_manifest,
)
from tests.acceptance.workercli import allow_in_tool_policy, make_agent, shell_job
from tests.support.storage import copy_of_root

SCRATCH = scratch_top(__file__)
ERROR_KEYS = {"error", "errno", "message"}
TORN = '{"ts": "2026-06-'  # an append cut short
ERRNO_LINE = re.compile(r"^ctx: (E[A-Z0-9]+): (.*)$")
SUMMARY = re.compile(
    r"^(\d+) (?:would )?requeue(?:d)?, (\d+) (?:would )?repair(?:ed)?, (\d+) incomplete, "
    r"(\d+) conflicts, (\d+) stale temps(?:, (\d+) temps removed)?(?:, (\d+) errors)?: "
    r"queue (consistent|NOT consistent)"
)


# --- reading what the commands print -----------------------------------------------------


def document(run: Run):
    """stdout holds exactly one JSON document and its line break, nothing else."""
    assert "Traceback" not in run.out + run.err, run
    value, end = json.JSONDecoder().raw_decode(run.out)
    assert run.out[end:] == "\n", run
    return value


def json_lines(run: Run) -> list[dict]:
    """stdout is JSON Lines: one JSON object a line, nothing else."""
    assert "Traceback" not in run.out + run.err, run
    assert run.out == "" or run.out.endswith("\n"), run
    lines = [json.loads(line) for line in run.out.splitlines()]
    assert all(isinstance(line, dict) for line in lines), run
    return lines


def stderr_error(run: Run) -> tuple[str, str]:
    """The last ``ctx: ERRNO: message`` line of stderr, as (ERRNO, message)."""
    found = [m for line in run.err.splitlines() if (m := ERRNO_LINE.match(line))]
    assert found, run
    return found[-1].group(1), found[-1].group(2)


def same_refusal(text: Run, as_json: Run, rc: int, name: str) -> dict:
    """Both ways refused alike: the exit status ``rc``, nothing on the text mode's stdout, the
    error object alone on the JSON mode's, and one ``ctx: ERRNO: message`` line whose errno
    and message are the object's."""
    assert text.rc == rc and as_json.rc == rc, (text, as_json)
    assert text.out == "", text
    obj = document(as_json)
    assert set(obj) == ERROR_KEYS, as_json
    assert obj["error"] == name and obj["errno"] == getattr(errno, name), as_json
    assert stderr_error(text) == (name, obj["message"]), (text, as_json)
    assert stderr_error(as_json) == (name, obj["message"]), as_json
    return obj


def lines_starting(text: str, *words: str) -> list[str]:
    """The lines whose first word (or first two, for 'would X') is one of ``words``."""
    found = []
    for line in text.splitlines():
        parts = line.split()
        if re.fullmatch(r"\w+\s+\d+", line):  # a count of status, not an entry
            continue
        if parts and (parts[0] in words or " ".join(parts[:2]) in words):
            found.append(line)
    return found


def one_line_naming(lines: list[str], *pieces: str) -> str:
    """The only line of ``lines`` holding every one of ``pieces``."""
    hits = [line for line in lines if all(piece in line for piece in pieces)]
    assert len(hits) == 1, (pieces, lines)
    return hits[0]


def relative_to(path: str, root: Path) -> str:
    return path.replace(str(root), "ROOT")


@dataclass
class World:
    """One storage root for the module, only read by the tests that use it.

    Queue ``proj``: ``held`` claimed (pid 1, for an hour), ``settled`` done, ``broke`` failed,
    ``waiting`` pending, ``twice`` both pending and done and ``lost`` a result without its
    request (conflicts), ``unleased`` claimed without a lease and an orphan ``lease/orphan``
    (incomplete), a dot-file, an illegal name, a symlink and a FIFO in ``pending/``
    (ignored), a stale temp file in ``inbox/``.  Agents: ``bob`` (fs.stat, with sessions
    ``default``, ``scratchy`` with damaged and torn lines and ``forged`` holding an event
    that names another agent and session), ``cat`` (a malformed label), ``dan`` (no
    identity), ``eve`` (withheld mounts).  Input files in ``files``."""

    top: Path
    storage: Path
    files: Path
    bob_uid: int

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    def ctx(self, *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        return ctx_run(*args, **kw)

    def both(self, *args, **kw) -> tuple[Run, Run]:
        """``ctx ARGS`` in text and with ``--json`` at the end, on the same state."""
        return self.ctx(*args, **kw), self.ctx(*args, "--json", **kw)

    @property
    def queue(self) -> Path:
        return self.storage / "shared" / "proj" / "queue"

    def session_dir(self, name: str) -> Path:
        return self.storage / "home" / str(self.bob_uid) / "agent" / "bob" / "session" / name


def _session_copy(world_default: Path, name: str, body: str) -> None:
    """A session of bob beside ``default``, with its owner and modes, holding ``body``."""
    made = world_default.parent / name
    made.mkdir()
    events = made / "events.jsonl"
    events.write_text(body)
    st = world_default.stat()
    ev = (world_default / "events.jsonl").stat()
    for path, mode, owner in ((made, st.st_mode, st), (events, ev.st_mode, ev)):
        path.chmod(mode & 0o7777)
        if os.geteuid() == 0:
            os.chown(path, owner.st_uid, owner.st_gid)


@pytest.fixture(scope="module")
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(SCRATCH, "world-")
    try:
        storage = copy_of_root(_template, top / "storage")
        files = top / "files"
        files.mkdir()
        env = clean_env(CTX_STORAGE=str(storage))

        def must(*args, input: str | None = None) -> Run:
            done = ctx_run(*args, env=env, input=input)
            assert done.rc == 0, done
            return done

        q = QueueCLI(storage, "proj")
        claim = ("--pid", "1", "--ttl", "3600")
        q.publish(request(tag="held"), name="held")
        assert q.claim(*claim) == "held.req.json"
        q.publish(request(tag="settled"), name="settled")
        assert q.claim(*claim) == "settled.req.json"
        q.finish("settled.req.json")
        q.publish(request(tag="broke"), name="broke")
        assert q.claim(*claim) == "broke.req.json"
        q.finish("broke.req.json", "--error", {"why": "it broke"})
        q.publish(request(tag="waiting"), name="waiting")
        q.publish(request(tag="twice"), name="twice")
        shutil.copy(q.dir / "pending" / "twice.req.json", q.dir / "done" / "twice.req.json")
        shutil.copy(
            q.dir / "done" / "settled.req.json.result", q.dir / "done/twice.req.json.result"
        )
        shutil.copy(q.dir / "done" / "settled.req.json.result", q.dir / "done/lost.req.json.result")
        (q.dir / "claimed" / "unleased.req.json").mkdir()
        (q.dir / "claimed/unleased.req.json/unleased.req.json").write_text(json.dumps(request()))
        (q.dir / "lease" / "orphan.req.json").mkdir()
        (q.dir / "pending" / ".hidden.req.json").write_text(json.dumps(request()))
        (q.dir / "pending" / "bad name.req.json").write_text(json.dumps(request()))
        (q.dir / "pending" / "link.req.json").symlink_to("/etc/hostname")
        os.mkfifo(q.dir / "pending" / "fifo.req.json")
        (q.dir / "inbox" / "stray.tmp").write_text("half a request")
        age(q.dir / "inbox" / "stray.tmp", 7200)

        bob = json.loads(
            must(
                "agent", "create", "-", "--json",
                input=json.dumps({"name": "bob", "label": "bob_t", "tools": ["fs.stat"]}),
            ).out
        )  # fmt: skip
        with open(storage / "tool" / "fs.stat.d" / "policy", "a") as policy:
            policy.write("allow bob_t tool:fs.stat execute\n")
        must("run", "--agent", "bob", "fs.stat", "/ctx")
        refused = ctx_run("run", "--agent", "bob", "fs.read", "/ctx/x", env=env)
        assert refused.rc == 126, refused
        world = World(top, storage, files, bob["identity"]["uid"])
        default = world.session_dir("default")
        lines = (default / "events.jsonl").read_text().splitlines(keepends=True)
        assert len(lines) == 4, lines
        damaged = [*lines[:2], "this is not json\n", "[1, 2]\n", *lines[2:], TORN]
        _session_copy(default, "scratchy", "".join(damaged))
        forged = [
            {"ts": "2026-06-22T12:00:00Z", "type": "note", "agent": "mallory",
             "session": "elsewhere", "object": "tool/fs.read", "status": "ok", "said": "hi"},
            {"ts": "2026-06-22T12:00:01Z", "type": "note", "agent": "bob",
             "session": "forged", "object": "tool/fs.stat", "status": "error"},
        ]  # fmt: skip
        _session_copy(default, "forged", "".join(json.dumps(e) + "\n" for e in forged))

        for name, label in (("cat", "cat_t"), ("dan", "dan_t"), ("eve", "eve_t")):
            must("agent", "create", "-", input=json.dumps({"name": name, "label": label}))
        (storage / "agent" / "cat.d" / "label").write_text("bad label!\n")
        (storage / "agent" / "dan.d" / "identity").unlink()
        elsewhere = top / "elsewhere"
        elsewhere.mkdir()
        mounts = [[str(files), "/etc/x", "ro"], [str(files), "/data", "rw"],
                  [str(elsewhere), "/data", "ro"]]  # fmt: skip
        (storage / "agent" / "eve.d" / "mount").write_text(json.dumps(mounts))

        (files / "request.json").write_text(json.dumps(request()))
        (files / "not-json").write_text("{broken")
        (files / "ok.policy").write_text("# fine\n\nallow bob_t tool:fs.stat execute\n")
        (files / "empty.policy").write_text("")
        (files / "bad.policy").write_text(
            "allow a_t tool:x execute\nallow a_t bogus:y z\n# c\n"
            "allow a_t tool:x fly\ndeny a_t tool:x execute\nallow a_t agent:* create\n"
        )
        (files / "latin.policy").write_bytes(b"allow a_t tool:\xe9t\xe9 execute\n")
        for path in [files, *files.iterdir()]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        yield world
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def twin(storage: Path, tmp_path: Path) -> Path:
    """A second storage root, a copy of ``storage`` as it is when the test takes it."""
    return tmp_path / "twin"


def copy_twin(storage: Path, twin: Path) -> Path:
    return copy_of_root(storage, twin)


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


# --- 1. queue status, list and show on one state -----------------------------------------------


def test_status_counts_and_lists_every_entry_alike_in_text_and_json(world: World) -> None:
    text, as_json = world.both("queue", "status", "--project", "proj")
    assert text.rc == 1 and as_json.rc == 1, (text, as_json)  # conflicts found (§2.4)
    doc = document(as_json)
    expected = {"pending": 1, "claimed": 1, "done": 1, "failed": 1, "incomplete": 2,
                "conflict": 2, "ignored": 4}  # fmt: skip
    assert doc["counts"] == expected, doc
    for state in ("pending", "claimed", "done", "failed", "conflict"):
        assert doc[state] == expected[state], doc
    counted = {}
    for line in text.lines():
        match = re.fullmatch(r"(\w+)\s+(\d+)", line)
        if match:
            counted[match.group(1)] = int(match.group(2))
    assert counted == expected, text
    assert text.lines()[0] == f"queue: {doc['queue']}", text
    incomplete = lines_starting(text.out, "incomplete")
    assert len(incomplete) == len(doc["incomplete"]) == 2, text
    for item in doc["incomplete"]:
        one_line_naming(incomplete, f" {item['job']}: ", item["detail"], item["repair"])
    conflicts = lines_starting(text.out, "conflict")
    assert {c["job"] for c in doc["conflicts"]} == {"twice.req.json", "lost.req.json"}
    assert len(conflicts) == len(doc["conflicts"]), text
    for item in doc["conflicts"]:
        one_line_naming(conflicts, f" {item['job']}: ", item["detail"], *item["evidence"])
    ignored = lines_starting(text.out, "ignored")
    assert len(ignored) == len(doc["ignored"]) == 4, text
    for entry in doc["ignored"]:
        one_line_naming(ignored, f" {entry['path']}: {entry['reason']}")
    temps = lines_starting(text.out, "temp")
    assert [t["path"] for t in doc["temps"]] == ["inbox/stray.tmp"], doc
    one_line_naming(temps, "inbox/stray.tmp")
    assert doc["owned_by_others"] == [] and not lines_starting(text.out, "owner")
    assert doc["group_not_inherited"] == [] and not lines_starting(text.out, "group")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory away needs root")
def test_status_owner_and_group_lines_say_what_the_json_lists(queue: QueueCLI) -> None:
    os.chown(queue.dir / "done", 65534, -1)  # another uid's state directory
    os.chown(queue.dir / "failed", -1, 65534)  # not the queue's group
    text = queue.run("status")
    as_json = queue.run("status", "--json")
    assert text.rc == 0 and as_json.rc == 0, (text, as_json)
    doc = document(as_json)
    owners = lines_starting(text.out, "owner")
    assert [o["path"] for o in doc["owned_by_others"]] == ["done"] and len(owners) == 1
    for owned in doc["owned_by_others"]:
        one_line_naming(owners, f"{owned['path']}/", owned["reason"], owned["remedy"])
    groups = lines_starting(text.out, "group")
    if os.getegid() == 65534:  # the queue's own group: nothing to say
        return
    assert [g["path"] for g in doc["group_not_inherited"]] == ["failed"] and len(groups) == 1
    for lost in doc["group_not_inherited"]:
        one_line_naming(groups, f"{lost['path']}/", lost["reason"], lost["remedy"])


def test_list_names_the_same_jobs_in_the_same_order_for_every_state(world: World) -> None:
    for state in (None, "pending", "claimed", "done", "failed", "incomplete", "conflict"):
        words = ["queue", "list", "--project", "proj", *(["--state", state] if state else [])]
        text, as_json = world.both(*words)
        jobs = document(as_json)
        assert isinstance(jobs, list) and jobs, (state, as_json)
        if state is None:
            shown = [line.split() for line in text.lines()]
            assert shown == [[job["state"], job["name"]] for job in jobs], (text, as_json)
        else:
            assert text.lines() == [job["name"] for job in jobs], (text, as_json)
            assert {job["state"] for job in jobs} == {state}, as_json
        conflict = any(job["state"] == "conflict" for job in jobs)
        assert text.rc == as_json.rc == (1 if conflict else 0), (state, text, as_json)
    everything = document(world.ctx("queue", "list", "--project", "proj", "--json"))
    by_state = {}
    for job in everything:
        by_state.setdefault(job["state"], set()).add(job["name"])
    assert by_state == {
        "claimed": {"held.req.json"}, "done": {"settled.req.json"},
        "failed": {"broke.req.json"}, "pending": {"waiting.req.json"},
        "conflict": {"twice.req.json", "lost.req.json"},
        "incomplete": {"unleased.req.json", "orphan.req.json"},
    }  # fmt: skip


def _show_text(run: Run) -> dict:
    facts: dict = {"rows": []}
    for line in run.lines():
        if line.startswith("  "):
            facts["rows"].append(line.split()[0])
        elif line.startswith("state:"):
            match = re.fullmatch(r"state:\s+(\S+) \((.*)\)", line)
            assert match, line
            facts["state"], facts["detail"] = match.groups()
        elif line.startswith("repair:"):
            facts["repair"] = line.split()[-1]
        else:
            key, value = line.split(":", 1)
            facts[key] = value.strip()
    return facts


SHOWN = [
    ("held", "claimed", 0),
    ("waiting", "pending", 0),
    ("settled", "done", 0),
    ("broke", "failed", 0),
    ("twice", "conflict", 1),
    ("lost", "conflict", 1),
    ("unleased", "incomplete", 0),
    ("orphan", "incomplete", 0),
]


def test_show_gives_the_same_evidence_request_lease_result_and_holder(world: World) -> None:
    for job, state, rc in SHOWN:
        _same_show(world, job, state, rc)


def _same_show(world: World, job: str, state: str, rc: int) -> None:
    text, as_json = world.both("queue", "show", "--project", "proj", job)
    assert text.rc == rc and as_json.rc == rc, (text, as_json)
    doc = document(as_json)
    shown = _show_text(text)
    assert doc["name"] == shown["job"] == f"{job}.req.json", (text, as_json)
    assert doc["state"] == shown["state"] == state, (text, as_json)
    assert doc["detail"] == shown["detail"], (text, as_json)
    assert doc["repair"] == shown.get("repair"), (text, as_json)
    paths = [item["path"] for item in doc["evidence"]] + [t["path"] for t in doc["temps"]]
    assert paths and shown["rows"] == paths, (text, as_json)
    for key in ("request", "lease", "result"):
        assert (key in doc) == (key in shown), (key, text, as_json)
        if key in doc:
            assert json.loads(shown[key]) == doc[key], (key, text, as_json)
    assert ("holder" in doc) == ("holder" in shown) == (state == "claimed"), (text, as_json)
    if "holder" in doc:
        assert shown["holder"] == f"{doc['holder']['state']} ({doc['holder']['reason']})"
        assert doc["holder"]["state"] == "alive", doc


# --- 2. recover ----------------------------------------------------------------------------------


def _recover_text(run: Run) -> dict[str, list[str]]:
    kinds = {
        "requeued": ("requeue", "would requeue"),
        "repaired": ("repair", "would repair"),
        "untouched": ("untouched",),
        "incomplete": ("incomplete",),
        "conflicts": ("conflict",),
        "removed_temps": ("remove",),
        "stale_temps": ("stale", "would remove"),
        "ignored": ("ignored",),
        "errors": ("error",),
    }
    return {key: lines_starting(run.out, *words) for key, words in kinds.items()}


def _same_recover_report(text: Run, doc: dict) -> None:
    lines = _recover_text(text)
    for key, found in lines.items():
        assert len(found) == len(doc[key]), (key, text, doc)
    for key in ("requeued", "repaired", "untouched", "incomplete", "conflicts", "errors"):
        for item in doc[key]:
            one_line_naming(lines[key], f" {item['job']}: ", item["detail"])
    for item in doc["conflicts"]:
        one_line_naming(lines["conflicts"], f" {item['job']}: ", *item["evidence"])
    for key in ("removed_temps", "stale_temps"):
        for path in doc[key]:
            one_line_naming(lines[key], f" {path}")
    for entry in doc["ignored"]:
        one_line_naming(lines["ignored"], f" {entry['path']}: {entry['reason']}")
    summary = SUMMARY.match(text.lines()[-1])
    assert summary, text
    numbers = [int(n) if n else 0 for n in summary.groups()[:7]]
    assert numbers == [
        len(doc["requeued"]), len(doc["repaired"]), len(doc["incomplete"]),
        len(doc["conflicts"]), len(doc["stale_temps"]), len(doc["removed_temps"]),
        len(doc["errors"]),
    ], (text, doc)  # fmt: skip
    assert (summary.group(8) == "consistent") == doc["consistent"], (text, doc)


def test_recover_reports_the_same_findings_and_counts_and_changes_nothing(world: World) -> None:
    for options in ((), ("--dry-run",), ("--reconcile", "--dry-run"), ("--grace", "0")):
        _same_recover_on_the_world(world, options)


def _same_recover_on_the_world(world: World, options: tuple[str, ...]) -> None:
    before = snapshot(world.queue)
    text, as_json = world.both("queue", "recover", "--project", "proj", *options)
    assert snapshot(world.queue) == before
    assert text.rc == 1 and as_json.rc == 1, (text, as_json)  # conflicts remain
    doc = document(as_json)
    assert doc["reconcile"] == ("--reconcile" in options)
    assert doc["dry_run"] == ("--dry-run" in options) and doc["consistent"] is False
    assert [u["job"] for u in doc["untouched"]] == ["held.req.json"], doc
    assert {c["job"] for c in doc["conflicts"]} == {"twice.req.json", "lost.req.json"}
    reconciling = "--reconcile" in options
    assert {r["job"] for r in doc["repaired" if reconciling else "incomplete"]} == {
        "unleased.req.json", "orphan.req.json"
    }, doc  # fmt: skip
    assert doc["stale_temps"] == ["inbox/stray.tmp"] and doc["removed_temps"] == [], doc
    assert len(doc["ignored"]) == 4, doc
    _same_recover_report(text, doc)


def _recoverable(storage: Path) -> QueueCLI:
    """Queue ``proj`` of ``storage`` holding what a crash leaves: a job whose holder is gone,
    a claim without a lease, an empty claim directory, a stale temp file."""
    q = QueueCLI(storage, "proj")
    for name in ("gone", "unleased", "waiting"):
        q.publish(request(tag=name), name=name)
    assert q.claim("--pid", str(dead_pid())) == "gone.req.json"
    assert q.claim("--pid", "1", "--ttl", "3600") == "unleased.req.json"
    shutil.rmtree(q.dir / "lease" / "unleased.req.json")
    (q.dir / "claimed" / "empty.req.json").mkdir()
    (q.dir / "inbox" / "stray.tmp").write_text("x")
    age(q.dir / "inbox" / "stray.tmp", 7200)
    return q


def test_recover_reconcile_does_and_says_the_same_on_two_copies(storage: Path, twin: Path) -> None:
    q = _recoverable(storage)
    copy_twin(storage, twin)
    t = QueueCLI(twin, "proj")
    text = q.run("recover", "--reconcile")
    as_json = t.run("recover", "--reconcile", "--json")
    assert text.rc == 0 and as_json.rc == 0, (text, as_json)
    doc = document(as_json)
    assert doc["consistent"] is True and doc["dry_run"] is False
    assert [r["job"] for r in doc["requeued"]] == ["gone.req.json"], doc
    assert {r["job"] for r in doc["repaired"]} == {"unleased.req.json", "empty.req.json"}
    assert all(item["applied"] for item in doc["requeued"] + doc["repaired"]), doc
    assert doc["removed_temps"] == ["inbox/stray.tmp"], doc
    _same_recover_report(text, doc)
    assert q.requests() == t.requests() == {
        "gone.req.json": ["pending"], "unleased.req.json": ["pending"],
        "waiting.req.json": ["pending"],
    }  # fmt: skip
    for sub in ("inbox", "claimed", "lease"):
        assert q.entries(sub) == t.entries(sub) == set(), sub


@pytest.mark.skipif(os.geteuid() != 0, reason="chattr +i needs root")
def test_a_recover_that_cannot_requeue_says_so_alike_in_its_error_line_and_json(
    storage: Path,
) -> None:
    q = QueueCLI(storage, "proj")
    q.publish(name="stuck")
    assert q.claim("--pid", str(dead_pid())) == "stuck.req.json"
    pending = q.dir / "pending"
    if subprocess.run(["chattr", "+i", str(pending)], capture_output=True).returncode != 0:
        pytest.skip("this filesystem takes no immutable attribute")
    try:
        before = snapshot(q.dir)
        text = q.run("recover")
        as_json = q.run("recover", "--json")
        after = snapshot(q.dir)
    finally:
        subprocess.run(["chattr", "-i", str(pending)], check=True)
    assert after == before
    assert text.rc == 1 and as_json.rc == 1, (text, as_json)
    doc = document(as_json)
    assert [(e["job"], e["error"]) for e in doc["errors"]] == [("stuck.req.json", "EPERM")]
    assert doc["errors"][0]["detail"].startswith("EPERM: "), doc
    _same_recover_report(text, doc)


# --- 3. queue commands that change the queue, each way on a copy -------------------------------


def test_publish_claim_renew_finish_say_the_same_and_leave_the_same_queue(
    storage: Path, twin: Path, child: subprocess.Popen
) -> None:
    copy_twin(storage, twin)
    a, b = QueueCLI(storage, "proj"), QueueCLI(twin, "proj")
    empty_text, empty_json = a.run("claim", "--pid", "1"), b.run("claim", "--pid", "1", "--json")
    assert (empty_text.rc, empty_text.out) == (empty_json.rc, empty_json.out) == (3, "")
    assert "Traceback" not in empty_text.err + empty_json.err
    req = json.dumps(request(tag="one"))
    published = a.run("publish", "--name", "one", "-", input=req)
    doc = document(b.run("publish", "--name", "one", "-", "--json", input=req))
    assert (
        published.rc == 0 and published.out == "one.req.json\n" and doc == {"name": "one.req.json"}
    )
    holder = ("--pid", str(child.pid), "--ttl", "600")
    claimed = a.run("claim", *holder)
    doc = document(b.run("claim", *holder, "--json"))
    assert claimed.rc == 0 and claimed.out == f"{doc['name']}\n" == "one.req.json\n", claimed
    assert doc["request"] == json.loads(
        (twin / "shared/proj/queue/claimed/one.req.json/one.req.json").read_text()
    )
    assert doc["lease"] == b.lease("one.req.json") and doc["lease"]["pid"] == child.pid
    renewed = a.run("renew", "one", "--pid", str(child.pid), "--ttl", "900")
    doc = document(b.run("renew", "one", "--pid", str(child.pid), "--ttl", "900", "--json"))
    assert renewed.rc == 0, renewed
    match = re.fullmatch(r"one\.req\.json leased until (\S+)\n", renewed.out)
    assert match and match.group(1) == a.lease("one.req.json")["expires_at"], renewed
    assert doc == b.lease("one.req.json") and doc["job"] == "one.req.json", doc
    out = json.dumps({"answer": 42})
    finished = a.run("finish", "one", "--ok", "-", input=out)
    doc = document(b.run("finish", "one", "--ok", "-", "--json", input=out))
    assert finished.rc == 0 and finished.out == "one.req.json\n", finished
    assert doc["name"] == "one.req.json" and doc["state"] == "done", doc
    state_a, result_a = a.only_result("one.req.json")
    state_b, result_b = b.only_result("one.req.json")
    assert state_a == state_b == "done" and doc["result"] == result_b
    assert result_a["output"] == result_b["output"] == {"answer": 42}
    assert result_a["status"] == result_b["status"] == "ok"


def test_a_batch_prints_as_many_names_as_its_json_lists_and_a_bad_one_none(
    storage: Path, twin: Path
) -> None:
    copy_twin(storage, twin)
    a, b = QueueCLI(storage, "proj"), QueueCLI(twin, "proj")
    batch = "".join(json.dumps(request(tag=str(i))) + "\n" for i in range(3))
    text = a.run("publish", "--batch", "-", input=batch)
    doc = document(b.run("publish", "--batch", "-", "--json", input=batch))
    assert text.rc == 0 and len(text.lines()) == len(doc["names"]) == 3, (text, doc)
    assert set(text.lines()) == a.entries("pending") and set(doc["names"]) == b.entries("pending")
    bad = batch + "not json\n" + json.dumps({"input": {}}) + "\n"
    before = snapshot(a.dir), snapshot(b.dir)
    obj = same_refusal(
        a.run("publish", "--batch", "-", input=bad),
        b.run("publish", "--batch", "-", "--json", input=bad),
        1,
        "EINVAL",
    )
    assert "line 4" in obj["message"] and "line 5" in obj["message"], obj
    assert (snapshot(a.dir), snapshot(b.dir)) == before


def test_claim_of_a_malformed_request_notes_it_both_ways(storage: Path, twin: Path) -> None:
    copy_twin(storage, twin)
    a, b = QueueCLI(storage, "proj"), QueueCLI(twin, "proj")
    for q in (a, b):
        (q.dir / "pending" / "odd.req.json").write_text('{"tool": "x", "input": {}, "tool": "y"}')
    text = a.run("claim", "--pid", "1", "--ttl", "60")
    as_json = b.run("claim", "--pid", "1", "--ttl", "60", "--json")
    assert text.rc == 0 and text.out == "odd.req.json\n", text
    doc = document(as_json)
    assert doc["name"] == "odd.req.json"
    assert doc["request"]["tool"] is None and doc["request"]["input"] == {}, doc
    note = "ctx: note: the request of odd.req.json is not valid"
    assert note in text.err and note in as_json.err, (text, as_json)
    assert doc["request"]["invalid"] in text.err, (text, doc)


def test_init_counts_in_text_the_entries_its_json_names(storage: Path, twin: Path) -> None:
    copy_twin(storage, twin)
    for root in (storage, twin):
        queue_dir = root / "shared" / "proj" / "queue"
        shutil.rmtree(queue_dir / "done")
        (queue_dir / "config").unlink()
    text = ctx_run("queue", "init", "--project", "proj", env=clean_env(CTX_STORAGE=str(storage)))
    as_json = ctx_run(
        "queue", "init", "--project", "proj", "--json", env=clean_env(CTX_STORAGE=str(twin))
    )
    assert text.rc == 0 and as_json.rc == 0, (text, as_json)
    doc = document(as_json)
    queue_dir = twin / "shared" / "proj" / "queue"
    assert doc["queue"] == str(queue_dir)
    assert sorted(doc["created"]) == sorted([str(queue_dir / "done"), str(queue_dir / "config")])
    assert re.fullmatch(rf"queue \S+ ready \({len(doc['created'])} entries created\)\n", text.out)
    again = ctx_run("queue", "init", "--project", "proj", env=clean_env(CTX_STORAGE=str(storage)))
    doc = document(
        ctx_run("queue", "init", "--project", "proj", "--json",
                env=clean_env(CTX_STORAGE=str(storage)))
    )  # fmt: skip
    assert doc["created"] == [] and again.out.strip().endswith("ready"), again


# --- 4. queue refusals ---------------------------------------------------------------------------

QUEUE_REFUSALS = [
    (["publish", "--name", "waiting", "{f}/request.json"], 1, "EEXIST"),
    (["publish", "--name", "bad name", "{f}/request.json"], 2, "EINVAL"),
    (["publish", "{f}/not-json"], 1, "EINVAL"),
    (["publish", "{f}/missing.json"], 1, "ENOENT"),
    (["finish", "waiting", "--ok"], 1, "ENOENT"),
    (["finish", "ghost", "--ok"], 1, "ENOENT"),
    (["finish", "settled", "--ok"], 1, "EEXIST"),
    (["finish", "held", "--ok", "--error"], 2, "EINVAL"),
    (["renew", "held"], 1, "EACCES"),
    (["renew", "waiting"], 1, "ENOENT"),
    (["show", "ghost"], 1, "ENOENT"),
    (["show", "a/b"], 2, "EINVAL"),
    (["list", "--state", "weird"], 2, "EINVAL"),
    (["recover", "--grace", "-1"], 2, "EINVAL"),
    (["claim", "--ttl", "0"], 2, "EINVAL"),
    (["status", "--bogus"], 2, "EINVAL"),
]


def test_a_queue_refusal_is_the_same_both_ways_and_changes_nothing(world: World) -> None:
    before = snapshot(world.queue)
    for words, rc, name in QUEUE_REFUSALS:
        rest = [w.format(f=world.files) for w in words[1:]]
        argv = ["queue", words[0], "--project", "proj", *rest]
        text = world.ctx(*argv)
        as_json = world.ctx(*argv[:2], "--json", *argv[2:])  # --json before the bad word too
        same_refusal(text, as_json, rc, name)
    assert snapshot(world.queue) == before
    same_refusal(
        world.ctx("queue", "status", "--project", "nope"),
        world.ctx("queue", "status", "--project", "nope", "--json"),
        1,
        "ENOENT",
    )
    obj = same_refusal(
        world.ctx("queue", "list"), world.ctx("queue", "list", "--json"), 2, "EINVAL"
    )
    assert "--project" in obj["message"], obj
    assert not (world.storage / "shared" / "nope").exists()


# --- 5. the worker -------------------------------------------------------------------------------


def test_worker_lines_and_json_events_tell_the_same_jobs_and_summary(
    _template: Path, traversable: Path
) -> None:
    roots = [copy_of_root(_template, traversable / name) for name in ("a", "b")]
    for root in roots:
        make_agent(root, ["shell.exec"])
        allow_in_tool_policy(root, "shell.exec")
        q = QueueCLI(root, "proj")
        q.publish(shell_job("true"), name="j1")
        q.publish(shell_job("exit 1"), name="j2")
        q.publish(request("fs.read"), name="j3")
    work = ("queue", "work", "--project", "proj", "--agent", "ci", "--drain")
    text = ctx_run(*work, env=clean_env(CTX_STORAGE=str(roots[0])))
    as_json = ctx_run(*work, "--json", env=clean_env(CTX_STORAGE=str(roots[1])))
    assert text.rc == 0 and as_json.rc == 0, (text, as_json)
    events = json_lines(as_json)
    assert events[0]["event"] == "start" and events[-1]["event"] == "stop", events
    finished = {e["job"]: e for e in events if e["event"] == "finish"}
    assert {job: e["state"] for job, e in finished.items()} == {
        "j1.req.json": "done", "j2.req.json": "failed", "j3.req.json": "failed"
    }  # fmt: skip
    lines = text.lines()
    assert re.fullmatch(rf"worker \S+ started \(waiting with {events[0]['wait']}\)", lines[0])
    for job, event in finished.items():
        line = one_line_naming(lines, f" {job}")
        assert line.split()[0] == event["state"], (line, event)
        if event["reason"]:
            assert line.endswith(f"{job}: {event['reason']}"), (line, event)
    stop = events[-1]
    assert re.match(rf"worker stopped: {stop['done']} done, {stop['failed']} failed", lines[-1])
    assert (stop["done"], stop["failed"]) == (1, 2), stop
    assert QueueCLI(roots[0], "proj").requests() == QueueCLI(roots[1], "proj").requests()


# --- 6. sessions ---------------------------------------------------------------------------------


def _event_line_holds(line: str, event: dict) -> None:
    assert line.startswith(event["ts"]), (line, event)
    parts = line.split()
    assert parts[1] == event["type"] and parts[2] == event.get("object", "-"), (line, event)
    assert parts[3] == event["status"], (line, event)
    for key in ("call", "mode", "exit_status", "errno", "stage", "step"):
        if key in event:
            assert f"{key}={json.dumps(event[key])}" in line, (key, line, event)


def test_show_tail_and_list_print_the_same_sessions_events_and_notes_both_ways(
    world: World,
) -> None:
    text, as_json = world.both("session", "list", "bob")
    assert text.rc == 0 and as_json.rc == 0, (text, as_json)
    listed = document(as_json)
    assert text.lines() == [s["name"] for s in listed], (text, listed)
    assert {"default", "forged", "scratchy"} <= set(text.lines()), text
    for entry in listed:
        assert Path(entry["path"]) == world.session_dir(entry["name"]), entry
    for session in ("default", "scratchy"):
        _same_session_events(world, session)


def _same_session_events(world: World, session: str) -> None:
    text, as_json = world.both("session", "show", "bob", session)
    assert text.rc == 0 and as_json.rc == 0, (text, as_json)
    events = json_lines(as_json)
    stored = [
        json.loads(line)
        for line in (world.session_dir(session) / "events.jsonl").read_text().splitlines()
        if line.startswith("{") and line.endswith("}")
    ]
    assert events == stored and len(events) == 4, as_json
    assert len(text.lines()) == len(events), text
    for line, event in zip(text.lines(), events, strict=True):
        _event_line_holds(line, event)
    assert text.err == as_json.err, (text, as_json)
    if session == "scratchy":
        assert "skipped damaged lines 3, 4" in text.err, text
        assert f"ends with a torn line of {len(TORN)} bytes" in text.err, text
    else:
        assert text.err == "", text
    tail_text, tail_json = world.both("session", "tail", "bob", session, "-n", "3")
    assert tail_text.rc == tail_json.rc == 0
    assert json_lines(tail_json) == events[-3:], tail_json
    assert tail_text.lines() == text.lines()[-3:], tail_text
    none_text, none_json = world.both("session", "tail", "bob", session, "-n", "0")
    assert (none_text.rc, none_text.out, none_json.rc, none_json.out) == (0, "", 0, "")


def test_show_text_names_an_event_s_agent_and_session_as_its_json_does(world: World) -> None:
    text, as_json = world.both("session", "show", "bob", "forged")
    assert text.rc == 0 and as_json.rc == 0, (text, as_json)
    events = json_lines(as_json)
    assert events[0]["agent"] == "mallory" and events[0]["session"] == "elsewhere"
    first = text.lines()[0]
    assert 'said="hi"' in first, text  # the other facts are there...
    assert "mallory" in first and "elsewhere" in first, text  # ...and so are these


SESSION_REFUSALS = [
    (["session", "show", "nobody-here"], 1, "ENOENT"),
    (["session", "show", "bob", "no-such-session"], 1, "ENOENT"),
    (["session", "list", "a b"], 2, "EINVAL"),
    (["session", "tail", "bob", "-n", "-1"], 2, "EINVAL"),
    (["session", "list", "bob", "--uid", "1", "--project", "proj"], 2, "EINVAL"),
    (["session", "repair", "nobody-here"], 1, "ENOENT"),
    (["session", "show"], 2, "EINVAL"),
]


def test_session_refusals_are_the_same_both_ways(world: World) -> None:
    before = snapshot(world.storage / "home")
    for words, rc, name in SESSION_REFUSALS:
        same_refusal(world.ctx(*words), world.ctx(*words, "--json"), rc, name)
    assert snapshot(world.storage / "home") == before


def _bob_session(storage: Path) -> Path:
    made = json.loads(
        ctx_run(
            "agent", "create", "-", "--json", env=clean_env(CTX_STORAGE=str(storage)),
            input=json.dumps({"name": "bob", "label": "bob_t"}),
        ).out
    )  # fmt: skip
    env = clean_env(CTX_STORAGE=str(storage))
    assert ctx_run("run", "--agent", "bob", "fs.stat", "/ctx", env=env).rc == 126
    uid = made["identity"]["uid"]
    return storage / "home" / str(uid) / "agent" / "bob" / "session" / "default"


@pytest.mark.skipif(os.geteuid() != 0, reason="an agent of another uid needs root")
def test_repair_truncates_and_tightens_the_same_and_says_so_both_ways(
    storage: Path, twin: Path
) -> None:
    copy_twin(storage, twin)
    sessions = [_bob_session(storage), _bob_session(twin)]
    sizes = []
    for session in sessions:
        session.chmod(0o750)
        (session / "events.jsonl").chmod(0o640)
        sizes.append((session / "events.jsonl").stat().st_size)
        with open(session / "events.jsonl", "a") as events:
            events.write(TORN)
    text = ctx_run("session", "repair", "bob", env=clean_env(CTX_STORAGE=str(storage)))
    as_json = ctx_run("session", "repair", "bob", "--json", env=clean_env(CTX_STORAGE=str(twin)))
    assert text.rc == 0 and as_json.rc == 0, (text, as_json)
    doc = document(as_json)
    assert doc["session"] == str(sessions[1].relative_to(twin)), doc
    assert doc["truncated_bytes"] == len(TORN) and doc["left"] == [], doc
    tightened = lines_starting(text.out, "tightened")
    assert len(tightened) == len(doc["tightened"]) == 2, (text, doc)
    for item in doc["tightened"]:
        one_line_naming(tightened, relative_to(item, twin).replace("ROOT", str(storage)))
    assert re.search(rf"truncated a torn last line of {doc['truncated_bytes']} bytes", text.out)
    for session, size in zip(sessions, sizes, strict=True):
        assert (session / "events.jsonl").stat().st_size == size, session
    assert all(s.stat().st_mode & 0o777 == 0o700 for s in sessions)
    again_text = ctx_run("session", "repair", "bob", env=clean_env(CTX_STORAGE=str(storage)))
    again = document(
        ctx_run("session", "repair", "bob", "--json", env=clean_env(CTX_STORAGE=str(twin)))
    )
    assert again == {**doc, "truncated_bytes": 0, "tightened": []}, again
    assert again_text.rc == 0 and again_text.out.startswith("nothing to do"), again_text


@pytest.mark.skipif(os.geteuid() != 0, reason="a file of another uid needs root")
def test_repair_names_a_file_it_leaves_in_its_warning_and_in_left(storage: Path) -> None:
    session = _bob_session(storage)
    events = session / "events.jsonl"
    os.chown(events, 0, -1)  # not the home owner's
    events.chmod(0o640)
    env = clean_env(CTX_STORAGE=str(storage))
    text = ctx_run("session", "repair", "bob", env=env)
    as_json = ctx_run("session", "repair", "bob", "--json", env=env)
    assert text.rc == 0 and as_json.rc == 0, (text, as_json)
    doc = document(as_json)
    assert len(doc["left"]) == 1 and str(events) in doc["left"][0], doc
    for run in (text, as_json):
        assert f"ctx: warning: {doc['left'][0]}" in run.err.splitlines(), run
    assert events.stat().st_mode & 0o777 == 0o640


# --- 7. policy -----------------------------------------------------------------------------------


def test_policy_check_problems_are_the_stderr_lines_one_for_one(world: World) -> None:
    files = [str(world.files / n) for n in ("bad.policy", "ok.policy", "latin.policy")]
    files.append(str(world.files / "missing.policy"))
    text, as_json = world.both("policy", "check", *files)
    assert text.rc == 1 and as_json.rc == 1 and text.out == "", (text, as_json)
    doc = document(as_json)
    assert doc["valid"] is False
    assert [f["file"] for f in doc["files"]] == files
    assert [f["valid"] for f in doc["files"]] == [False, True, False, False]
    expected = []
    for report in doc["files"]:
        assert report["valid"] == (report["problems"] == []), report
        for p in report["problems"]:
            assert p["errno"] == getattr(errno, p["error"]), p
            where = report["file"] if p["line"] is None else f"{report['file']}:{p['line']}"
            expected.append(f"{where}: {p['error']}: {p['message']}")
    assert [p["line"] for p in doc["files"][0]["problems"]] == [2, 4, 5, 6], doc
    assert doc["files"][3]["problems"][0]["error"] == "ENOENT", doc
    assert text.err.splitlines() == expected == as_json.err.splitlines(), (text, as_json)


QUERIES = [
    (["ok.policy"], ["bob_t", "tool:fs.stat", "execute"], 0, "allow"),
    (["ok.policy", "empty.policy"], ["bob_t", "tool:fs.stat", "execute"], 1, "deny"),
    (["ok.policy"], ["bob_t", "tool:fs.stat", "fly"], 2, "EINVAL"),
    (["ok.policy"], ["bob_t", "tool:fs*", "execute"], 2, "EINVAL"),
    (["bad.policy"], ["a_t", "tool:x", "execute"], 2, "EINVAL"),
]


def test_policy_query_answers_alike(world: World) -> None:
    for policies, query, rc, answer in QUERIES:
        _same_query(world, policies, query, rc, answer)


def _same_query(world: World, policies: list[str], query: list[str], rc: int, answer: str) -> None:
    words = [w for p in policies for w in ("--policy", str(world.files / p))]
    text, as_json = world.both("policy", "query", *words, *query)
    assert text.rc == rc and as_json.rc == rc, (text, as_json)
    if rc == 2:
        obj = document(as_json)
        assert set(obj) == ERROR_KEYS and obj["error"] == answer, obj
        assert text.out == "" and f"{answer}: " in text.err, text
        return
    doc = document(as_json)
    assert text.out == f"{answer}\n" and doc["decision"] == answer, (text, doc)
    assert doc["rule"] == f"allow {' '.join(query)}"
    assert [p["policy"] for p in doc["policies"]] == [str(world.files / p) for p in policies]
    assert all(p["allows"] for p in doc["policies"]) == (answer == "allow"), doc


EXPLAINED = [
    ("bob", "tool:fs.stat", "execute", 0, None),
    ("bob", "tool:fs.read", "execute", 1, 5),
    ("nobody-here", "tool:fs.read", "execute", 1, 1),
    ("dan", "tool:fs.stat", "execute", 1, 1),
]


def test_policy_explain_walks_the_same_steps_both_ways_or_refuses_alike(world: World) -> None:
    for agent, obj, perm, rc, step in EXPLAINED:
        _same_explanation(world, agent, obj, perm, rc, step)
    for words in (["bob", "bogus:x", "execute"], ["bob", "tool:fs.stat", "use"]):
        same_refusal(
            world.ctx("policy", "explain", *words),
            world.ctx("policy", "explain", *words, "--json"),
            2,
            "EINVAL",
        )
    same_refusal(
        world.ctx("policy", "explain", "--peer", "x", "bob", "tool:fs.stat", "execute"),
        world.ctx("policy", "explain", "--json", "--peer", "x", "bob", "tool:fs.stat", "execute"),
        2,
        "EINVAL",
    )


def _same_explanation(
    world: World, agent: str, obj: str, perm: str, rc: int, step: int | None
) -> None:
    text, as_json = world.both("policy", "explain", agent, obj, perm)
    assert text.rc == rc and as_json.rc == rc, (text, as_json)
    doc = document(as_json)
    assert (doc["agent"], doc["object"], doc["permission"]) == (agent, obj, perm)
    assert doc["allowed"] is (rc == 0) and doc["step"] == step, doc
    lines = text.lines()
    assert lines[0] == f"agent {agent}: {obj} {perm}", text
    assert len(doc["steps"]) == 6 and len(lines) == 8, text
    for line, s in zip(lines[1:7], doc["steps"], strict=True):
        assert line.split()[0] == str(s["step"]) and s["name"] in line, (line, s)
        assert s["result"] in line and s["detail"] in line, (line, s)
        if s["errno"]:
            assert s["errno"] in line, (line, s)
    if rc == 0:
        assert lines[-1] == "allow", text
    else:
        assert lines[-1] == f"deny: {doc['errno']}: {doc['reason']}", (text, doc)
        assert doc["steps"][step - 1]["result"] == "deny", doc


# --- 8. objects ----------------------------------------------------------------------------------


def _manifests(where: Path) -> dict[str, Path]:
    good = tool_manifest(where, "t.one", "#!/bin/sh\ncat\n")
    (where / "t.one.sh").chmod(0o755)
    bad = where / "bad.json"
    bad.write_text(json.dumps({
        "manifest": 3, "kind": "toolx", "name": "bad/name", "schema": [],
        "cap": {"network": "yes"}, "exec": "missing.sh", "extra": 1,
    }))  # fmt: skip
    (where / "link.sh").symlink_to("t.one.sh")
    link = where / "link.json"
    manifest = json.loads(good.read_text())
    manifest.update(name="t.two", exec="link.sh")
    link.write_text(json.dumps(manifest))
    broken = where / "broken.json"
    broken.write_text("{broken")
    return {"good": good, "bad": bad, "link": link, "broken": broken}


def test_object_check_lines_are_the_json_problems_with_their_codes(tmp_path: Path) -> None:
    made = _manifests(tmp_path)
    paths = [str(made[k]) for k in ("good", "bad", "link", "broken")]
    text = ctx_run("object", "check", *paths)
    as_json = ctx_run("object", "check", *paths, "--json")
    assert text.rc == 1 and as_json.rc == 1, (text, as_json)
    reports = document(as_json)
    assert [r["manifest"] for r in reports] == paths
    assert [r["valid"] for r in reports] == [True, False, False, False], reports
    assert reports[0]["name"] == "t.one" and text.out == f"{paths[0]}: valid (t.one)\n", text
    expected = []
    for report in reports:
        assert len(report["codes"]) == len(report["problems"]), report
        expected += [
            f"{report['manifest']}: {c}: {p}"
            for c, p in zip(report["codes"], report["problems"], strict=True)
        ]
    assert reports[2]["codes"] == ["ELOOP"] and len(reports[1]["problems"]) >= 6, reports
    assert text.err.splitlines() == expected == as_json.err.splitlines(), (text, as_json)


def test_object_list_gives_each_tool_the_same_tier_status_and_reason(storage: Path) -> None:
    tool = storage / "tool"
    (tool / "fs.list.d" / "status").write_text("disabled\n")
    (tool / "fs.read.d" / "status").write_text("weird\n")
    (tool / "fs.stat.d" / "program").write_text("[1]\n")
    (tool / "fs.write.d" / "schema").unlink()
    env = clean_env(CTX_STORAGE=str(storage))
    text = ctx_run("object", "list", env=env)
    as_json = ctx_run("object", "list", "--json", env=env)
    assert text.rc == 0 and as_json.rc == 0, (text, as_json)
    listed = document(as_json)
    statuses = {t["name"]: t["status"] for t in listed}
    expected = {"fs.list": "disabled", "fs.read": "unavailable", "fs.stat": "unavailable",
                "fs.write": "damaged", "shell.exec": "available"}  # fmt: skip
    assert {name: statuses[name] for name in expected} == expected, listed
    assert len(text.lines()) == len(listed), text
    for line, entry in zip(text.lines(), listed, strict=True):
        name, tier, status, rest = line.split(None, 3)
        assert (name, tier, status) == (entry["name"], entry["tier"], entry["status"]), line
        assert rest.startswith(entry["description"]), (line, entry)
        if entry["reason"]:
            assert rest.endswith(f"({entry['reason']})"), (line, entry)
    damaged = next(t for t in listed if t["name"] == "fs.write")
    assert any(p.startswith("fs.write.d/schema") for p in damaged["problems"]), damaged


def test_object_which_finds_the_same_path_and_refuses_alike(world: World, tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "dup").write_text("not executable\n")
    (second / "dup").write_text("#!/bin/sh\n")
    (second / "dup").chmod(0o755)
    (first / "dir").mkdir()
    env = {**world.env, "CTX_PATH": f"{first}:{second}"}
    text = world.ctx("object", "which", "dup", env=env)
    doc = document(world.ctx("object", "which", "dup", "--json", env=env))
    assert text.rc == 0 and text.out == f"{doc['path']}\n" == f"{second / 'dup'}\n", text
    assert doc["controls"] == f"{second / 'dup'}.d" and doc["name"] == "dup"
    assert doc["skipped"] == [f"{first / 'dup'}: not executable"], doc
    assert doc["search_path"]["directories"] == [str(first), str(second)], doc
    obj = same_refusal(
        world.ctx("object", "which", "dir", env=env),
        world.ctx("object", "which", "dir", "--json", env=env),
        1,
        "ENOENT",
    )
    assert f"{first / 'dir'}: a directory" in obj["message"], obj
    same_refusal(
        world.ctx("object", "which", "a/b", env=env),
        world.ctx("object", "which", "a/b", "--json", env=env),
        2,
        "EINVAL",
    )


def test_object_install_says_installed_and_replaced_as_its_json(
    storage: Path, twin: Path, tmp_path: Path
) -> None:
    copy_twin(storage, twin)
    made = _manifests(tmp_path / "m")
    good = str(made["good"])
    for tier in ("system", "system", "user"):
        text = ctx_run("object", "install", good, "--tier", tier, "--storage", storage)
        doc = document(
            ctx_run("object", "install", good, "--tier", tier, "--storage", twin, "--json")
        )
        assert text.rc == 0, text
        verb = "replaced" if doc["replaced"] else "installed"
        rel = Path(doc["path"]).relative_to(twin)
        assert text.out == f"{verb} t.one in tier {doc['tier']}: {storage / rel}\n", (text, doc)
        assert doc["name"] == "t.one" and doc["tier"] == tier
    assert sorted(os.listdir(storage / "tool")) == sorted(os.listdir(twin / "tool"))


def test_an_install_refusal_is_alike_and_its_json_counts_the_other_problems(
    storage: Path, tmp_path: Path
) -> None:
    made = _manifests(tmp_path / "m")
    before = snapshot(storage)
    bad = str(made["bad"])
    text = ctx_run("object", "install", bad, "--tier", "system", "--storage", storage)
    as_json = ctx_run("object", "install", bad, "--tier", "system", "--storage", storage, "--json")
    assert text.rc == 1 and as_json.rc == 1 and text.out == "", (text, as_json)
    obj = document(as_json)
    assert set(obj) == ERROR_KEYS and obj["error"] == "EINVAL", obj
    lines = text.err.splitlines()
    assert lines == as_json.err.splitlines() and len(lines) >= 6, text
    assert all(line.startswith(f"ctx: EINVAL: {bad}: ") for line in lines), text
    first = lines[0].removeprefix("ctx: EINVAL: ")
    assert obj["message"] == f"{first} (and {len(lines) - 1} more)", (obj, lines)
    assert snapshot(storage) == before
    for words, rc, name in (
        (["--tier", "bogus"], 2, "EINVAL"),
        (["--tier", "shared:nosp"], 1, "ENOENT"),
    ):
        argv = ["object", "install", str(made["good"]), *words, "--storage", storage]
        same_refusal(ctx_run(*argv), ctx_run(*argv, "--json"), rc, name)
    assert snapshot(storage) == before


# --- 9. agents -----------------------------------------------------------------------------------

AGENT_LINE = re.compile(
    r"(\S+)\s+(\S+|\(no label\))\s+uid (\S+), gid (\S+)(?:\s+\((\d+) problem\(s\): (.*)\))?"
)


def test_agent_list_gives_each_agent_the_same_label_identity_and_problems(world: World) -> None:
    text, as_json = world.both("agent", "list")
    assert text.rc == 0 and as_json.rc == 0, (text, as_json)
    agents = document(as_json)
    assert [a["name"] for a in agents] == ["bob", "cat", "dan", "eve"], agents
    assert len(text.lines()) == len(agents), text
    for line, agent in zip(text.lines(), agents, strict=True):
        match = AGENT_LINE.fullmatch(line)
        assert match, line
        name, label, uid, gid, count, first = match.groups()
        assert name == agent["name"], line
        assert label == (agent["label"] or "(no label)"), (line, agent)
        ids = agent["identity"]
        assert (uid, gid) == ((str(ids["uid"]), str(ids["gid"])) if ids else ("?", "?"))
        assert int(count or 0) == len(agent["problems"]), (line, agent)
        if first:
            assert first == agent["problems"][0], (line, agent)
    problems = {a["name"]: len(a["problems"]) for a in agents}
    assert problems == {"bob": 0, "cat": 1, "dan": 1, "eve": 0}, agents


def test_agent_show_gives_the_same_facts_both_ways(world: World) -> None:
    for name in ("bob", "cat", "eve"):
        _same_agent_shown(world, name)


def _same_agent_shown(world: World, name: str) -> None:
    text, as_json = world.both("agent", "show", name)
    assert text.rc == 0 and as_json.rc == 0, (text, as_json)
    doc = document(as_json)
    fields: dict[str, list[str]] = {}
    for line in text.lines():
        key, value = line.split(": ", 1)
        fields.setdefault(key, []).append(value)
    assert fields["name"] == [doc["name"]] and fields["label"] == [doc["label"] or "(none)"]
    ids = doc["identity"]
    groups = ", ".join(map(str, ids["groups"]))
    assert fields["identity"] == [f"uid {ids['uid']}, gid {ids['gid']}, groups {groups}"]
    assert fields["ctx_path"] == [doc["ctx_path"]] and fields["cwd"] == [doc["cwd"]]
    mounts = [f"{m[0]} at {m[1]} ({m[2]})" for m in doc["mounts"]]
    assert fields.get("mount", []) == mounts, (text, doc)
    withheld = fields.get("withheld mount", [])
    assert len(withheld) == len(doc["withheld_mounts"]), (text, doc)
    for line, item in zip(withheld, doc["withheld_mounts"], strict=True):
        source, target, _ = item["mount"]
        assert line == f"{source} at {target}: {item['reason']}", (line, item)
    assert fields.get("problem", []) == doc["problems"], (text, doc)
    assert doc["terminals"] == [] and "terminal" not in fields
    assert (len(doc["withheld_mounts"]), len(doc["problems"])) == {
        "bob": (0, 0), "cat": (0, 1), "eve": (3, 0)
    }[name]  # fmt: skip


def test_agent_refusals_are_the_same_both_ways_and_change_nothing(world: World) -> None:
    before = snapshot(world.storage / "agent")
    for words, rc, name in (
        (["agent", "show", "nobody-here"], 1, "ENOENT"),
        (["agent", "show", "dan"], 1, "EACCES"),
        (["agent", "stop", "nobody-here"], 1, "ENOENT"),
        (["agent", "show", "a/b"], 2, "EINVAL"),
        (["agent", "create", str(world.files / "missing.json")], 1, "ENOENT"),
        (["agent", "create", "-", "--user", "root"], 2, "EINVAL"),
    ):
        req = json.dumps({"name": "newcomer", "label": "newcomer_t"})
        same_refusal(world.ctx(*words, input=req), world.ctx(*words, "--json", input=req), rc, name)
    taken = json.dumps({"name": "bob", "label": "bob_t"})
    same_refusal(
        world.ctx("agent", "create", "-", input=taken),
        world.ctx("agent", "create", "-", "--json", input=taken),
        1,
        "EEXIST",
    )
    assert snapshot(world.storage / "agent") == before


def test_an_invalid_agent_request_lists_its_problems_and_the_json_counts_them(
    world: World,
) -> None:
    req = json.dumps({"name": "a/b", "label": "x y", "tools": [1], "bogus": 2})
    text = world.ctx("agent", "create", "-", input=req)
    as_json = world.ctx("agent", "create", "-", "--json", input=req)
    assert text.rc == 1 and as_json.rc == 1 and text.out == "", (text, as_json)
    obj = document(as_json)
    assert set(obj) == ERROR_KEYS and obj["error"] == "EINVAL" and obj["errno"] == errno.EINVAL
    lines = text.err.splitlines()
    assert lines == as_json.err.splitlines() and len(lines) == 4, text
    first = lines[0].removeprefix("ctx: EINVAL: ")
    assert obj["message"] == f"{first} (and {len(lines) - 1} more)", (obj, lines)
    assert not (world.storage / "agent" / "a").exists()


REQUEST_WITH_WARNINGS = {
    "name": "fay", "label": "fay_t", "tools": ["fs.stat"],
    "shared": {"nosp": ["read"]}, "mount": [["/nonexistent-source", "/x", "ro"]],
}  # fmt: skip


def test_agent_create_reports_the_same_agent_and_warnings_both_ways(
    storage: Path, twin: Path
) -> None:
    copy_twin(storage, twin)
    req = json.dumps(REQUEST_WITH_WARNINGS)
    text = ctx_run("agent", "create", "-", env=clean_env(CTX_STORAGE=str(storage)), input=req)
    as_json = ctx_run(
        "agent", "create", "-", "--json", env=clean_env(CTX_STORAGE=str(twin)), input=req
    )
    assert text.rc == 0 and as_json.rc == 0, (text, as_json)
    doc = document(as_json)
    ids = doc["identity"]
    assert doc["name"] == "fay" and doc["entry"] == str(twin / "agent" / "fay")
    assert doc["controls"] == str(twin / "agent" / "fay.d")
    lines = text.lines()
    assert (
        lines[0]
        == f"created agent fay: {storage / 'agent' / 'fay'} (uid {ids['uid']}, gid {ids['gid']})"
    )
    if doc["default_user"] is None:
        assert len(lines) == 1, text
    else:
        assert len(lines) == 2 and f"runs as user {doc['default_user']}" in lines[1], text
    warned = [w.removeprefix("ctx: warning: ") for w in text.err.splitlines()]
    assert len(warned) == len(doc["warnings"]) >= 2, (text, doc)
    assert any("shared:nosp" in w for w in warned), text
    assert any("/nonexistent-source" in w for w in warned), text
    # the environment named the root: the suggestions are as given, each root its own
    assert [relative_to(w, storage) for w in warned] == [
        relative_to(w, twin) for w in doc["warnings"]
    ], (text, doc)
    policy = "fay.d/policy"
    assert (storage / "agent" / policy).read_text() == (twin / "agent" / policy).read_text()


def test_agent_create_json_warnings_name_the_root_the_command_was_given(storage: Path) -> None:
    req = json.dumps(REQUEST_WITH_WARNINGS)
    as_json = ctx_run(
        "agent", "create", "--storage", storage, "-", "--json", env=clean_env(), input=req
    )
    assert as_json.rc == 0, as_json
    doc = document(as_json)
    warned = [w.removeprefix("ctx: warning: ") for w in as_json.err.splitlines()]
    assert any(f"--storage {storage}" in w for w in warned), as_json
    assert doc["warnings"] == warned, (doc, warned)


# --- 10. shared spaces ---------------------------------------------------------------------------


def test_shared_create_reports_the_same_entries_both_ways(storage: Path, twin: Path) -> None:
    before = snapshot(storage / "shared")
    for words, rc, name in (
        (["a b"], 2, "EINVAL"),
        (["cortexfs-docs"], 2, "EINVAL"),
        (["sp", "--group", "no-such-group-here"], 2, "EINVAL"),
    ):
        argv = ["shared", "create", *words, "--storage", storage]
        same_refusal(ctx_run(*argv), ctx_run(*argv, "--json"), rc, name)
    assert snapshot(storage / "shared") == before
    copy_twin(storage, twin)

    def both(*words: str) -> tuple[Run, dict]:
        text = ctx_run("shared", "create", *words, "--storage", storage)
        as_json = ctx_run("shared", "create", *words, "--storage", twin, "--json")
        assert text.rc == 0 and as_json.rc == 0, (text, as_json)
        return text, document(as_json)

    text, doc = both("sp")
    created = [
        relative_to(line.split(None, 1)[1], storage) for line in lines_starting(text.out, "created")
    ]
    assert created == [relative_to(p, twin) for p in doc["created"]] and len(created) == 12
    assert doc["path"] == str(twin / "shared" / "sp") and doc["regrouped_from"] is None
    text, doc = both("sp")
    assert (
        doc["created"] == []
        and text.out == f"nothing to do: {storage / 'shared' / 'sp'} is complete\n"
    )
    if os.geteuid() != 0:
        return
    for root in (storage, twin):
        (root / "shared/sp/data/f").write_text("x")
        os.link(root / "shared/sp/data/f", root / "outside-link")
        (root / "shared/sp/tool").chmod(0o2700)
        (root / "shared/sp/data/more").mkdir()
    text, doc = both("sp", "--group", "65534")
    assert doc["gid"] == 65534 and doc["regrouped_from"] == os.getegid(), doc
    line = one_line_naming(lines_starting(text.out, "regrouped"), f"({doc['regrouped']} entries)")
    assert f"group {doc['regrouped_from']} -> {doc['gid']}" in line, text
    kept = lines_starting(text.out, "kept")
    assert len(kept) == len(doc["kept"]) == 1, (text, doc)
    assert doc["kept"][0]["reason"] in kept[0] and "data/f" in kept[0]
    repaired = lines_starting(text.out, "repaired")
    assert [relative_to(r.split()[1].rstrip(":"), storage) for r in repaired] == [
        relative_to(p, twin) for p in doc["repaired"]
    ], (text, doc)
    assert doc["repaired"], doc


# --- 11. bootstrap -------------------------------------------------------------------------------


def _bootstrap_text(run: Run, root: Path) -> dict[str, list[str]]:
    lines = run.lines()
    assert lines[0] == f"storage root: {root}", run
    found: dict[str, list[str]] = {"created": [], "repaired": [], "problem": [], "warning": []}
    for line in lines[1:]:
        word, rest = line.split(None, 1)
        found[word].append(rest)
    return found


def test_bootstrap_prints_what_its_json_lists_fresh_then_again(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    text = ctx_run("bootstrap", "--storage", a)
    as_json = ctx_run("bootstrap", "--storage", b, "--json")
    assert text.rc == 0 and as_json.rc == 0, (text, as_json)
    doc = document(as_json)
    assert doc["root"] == str(b) and doc["created"][0] == str(b), doc
    shown = _bootstrap_text(text, a)
    assert [relative_to(p, a) for p in shown["created"]] == [
        relative_to(p, b) for p in doc["created"]
    ]
    assert "tool/fs.read" in doc["created"] and shown["problem"] == doc["problems"] == []
    assert shown["warning"] == doc["warnings"] == []
    again = ctx_run("bootstrap", "--storage", a)
    doc = document(ctx_run("bootstrap", "--storage", b, "--json"))
    assert again.rc == 0 and doc == {"root": str(b), "created": [], "repaired": [],
                                     "problems": [], "warnings": []}  # fmt: skip
    assert again.lines()[1:] == ["nothing to do: the storage root is complete"], again
    assert snapshot(a).keys() == snapshot(b).keys()


def _blocked(root: Path) -> None:
    """``model`` a file, where bootstrap would make a directory; ``tool`` closed to others."""
    (root / "model").rmdir()
    (root / "model").write_text("in the way\n")
    (root / "tool").chmod(0o700)


def test_bootstrap_problems_and_warnings_are_the_same_both_ways(storage: Path, twin: Path) -> None:
    copy_twin(storage, twin)
    for root in (storage, twin):
        _blocked(root)
    text = ctx_run("bootstrap", "--storage", storage)
    as_json = ctx_run("bootstrap", "--storage", twin, "--json")
    assert text.rc == 1 and as_json.rc == 1, (text, as_json)
    doc = document(as_json)
    shown = _bootstrap_text(text, storage)
    assert shown["problem"] == doc["problems"] and len(doc["problems"]) == 1, (text, doc)
    assert doc["problems"][0].startswith("model: "), doc
    assert [relative_to(w, storage) for w in shown["warning"]] == [
        relative_to(w, twin) for w in doc["warnings"]
    ] and len(doc["warnings"]) == 1, (text, doc)
    assert shown["created"] == doc["created"] == [], (text, doc)
    assert shown["repaired"] == doc["repaired"], (text, doc)
    name, message = stderr_error(text)
    assert (name, relative_to(message, storage)) == (
        stderr_error(as_json)[0], relative_to(stderr_error(as_json)[1], twin)
    )  # fmt: skip
    assert name == "ENOTDIR" and doc["problems"][0] in message, text
    assert (storage / "model").read_text() == (twin / "model").read_text() == "in the way\n"


def test_the_bootstrap_error_line_suggests_the_root_it_was_given(storage: Path) -> None:
    _blocked(storage)
    for extra in ((), ("--json",)):
        run = ctx_run("bootstrap", "--storage", storage, *extra)
        assert run.rc == 1, run
        name, message = stderr_error(run)
        assert name == "ENOTDIR" and "'ctx bootstrap" in message, run
        assert f"'ctx bootstrap --storage {storage}'" in message, run


# --- 12. ctx run: terminal and native mode -------------------------------------------------------


def test_a_tool_s_facts_are_the_same_in_terminal_text_and_native_output(world: World) -> None:
    text = world.ctx("run", "--agent", "bob", "--session", "modes", "fs.stat", "/ctx")
    native = world.ctx(
        "run", "--agent", "bob", "--session", "modes", "--native", "fs.stat",
        input=json.dumps({"path": "/ctx"}),
    )  # fmt: skip
    assert text.rc == 0 and native.rc == 0, (text, native)
    frames = json_lines(native)
    assert [f["type"] for f in frames] == ["call", "result"], frames
    result = frames[-1]
    assert result["status"] == "ok" and result["exit_status"] == 0 and result["error"] is None
    shown = dict(line.split(": ", 1) for line in text.lines())
    output = result["output"]
    assert set(shown) == set(output), (text, output)
    for key, value in output.items():
        assert shown[key] == str(value), (key, text, output)


def test_a_refused_call_gives_the_same_errno_and_reason_in_both_modes(world: World) -> None:
    for tool, rc, name, stage in (
        ("fs.read", 126, "EACCES", "authorize"),
        ("no.such.tool", 127, "ENOENT", "resolve"),
    ):
        _same_refused_call(world, tool, rc, name, stage)


def _same_refused_call(world: World, tool: str, rc: int, name: str, stage: str) -> None:
    session = f"refusals-{stage}"
    text = world.ctx("run", "--agent", "bob", "--session", session, tool, "/ctx")
    native = world.ctx(
        "run", "--agent", "bob", "--session", session, "--native", tool,
        input=json.dumps({"path": "/ctx"}),
    )  # fmt: skip
    assert text.rc == rc and text.out == "" and native.rc == 1, (text, native)
    result = json_lines(native)[-1]
    assert result["type"] == "result" and result["status"] == "error", result
    error = result["error"]
    assert (error["error"], error["errno"], error["stage"]) == (name, getattr(errno, name), stage)
    assert stderr_error(text) == (name, error["message"]), (text, error)
    assert native.err == "", native
    events = [
        json.loads(line)
        for line in (world.session_dir(session) / "events.jsonl").read_text().splitlines()
    ]
    results = [e for e in events if e["type"] == "tool_result"]
    assert [e["mode"] for e in events if e["type"] == "tool_call"] == ["terminal", "native"]
    assert len(results) == 2, events
    for key in ("status", "errno", "stage", "step", "message"):
        assert results[0][key] == results[1][key], (key, results)
    assert results[1]["errno"] == name and results[1]["step"] == error["step"]


def test_a_malformed_run_command_line_is_refused_alike_in_both_modes(world: World) -> None:
    before = snapshot(world.storage / "home")
    for words in (["--agent", "a b", "fs.stat"], ["--agent", "bob", "a/b"]):
        text = world.ctx("run", *words, "/ctx")
        native = world.ctx("run", "--native", *words, input="{}")
        assert text.rc == native.rc == 2, (text, native)
        assert text.out == native.out == "", (text, native)
        assert stderr_error(text) == stderr_error(native) and stderr_error(text)[0] == "EINVAL"
    assert snapshot(world.storage / "home") == before


# --- 13. the manual and ctx tool -----------------------------------------------------------------


def test_man_lists_and_prints_the_same_pages_both_ways(world: World) -> None:
    text, as_json = world.both("man")
    assert text.rc == 0 and as_json.rc == 0, (text, as_json)
    pages = document(as_json)
    assert len(text.lines()) == len(pages) == 8, text
    for line, page in zip(text.lines(), pages, strict=True):
        assert line.split()[0] == page["topic"] and page["summary"] in line, (line, page)
        assert line.endswith(f"[{page['origin']}]"), (line, page)
    page_text, page_json = world.both("man", "session")
    doc = document(page_json)
    assert page_text.rc == 0 and page_text.out == doc["text"], doc["path"]
    assert doc["topic"] == "session" and doc["origin"] == "installed"
    assert Path(doc["path"]).read_text() == doc["text"]
    same_refusal(world.ctx("man", "bogus"), world.ctx("man", "bogus", "--json"), 1, "ENOENT")


def test_tsh_config_shows_the_same_settings_and_warnings_both_ways(storage: Path) -> None:
    config = storage / "tool" / "tsh.d" / "config"
    with open(config, "a") as data:
        data.write("weird=1\ncache_capacity=notnum\n")
    env = clean_env(CTX_STORAGE=str(storage))
    text = ctx_run("tool", "tsh.config", env=env)
    as_json = ctx_run("tool", "--json", "tsh.config", env=env)
    assert text.rc == 0 and as_json.rc == 0, (text, as_json)
    doc = document(as_json)
    assert doc["path"] == str(config) and doc["changed"] == []
    assert text.lines() == [f"{k}={v}" for k, v in doc["config"].items()], (text, doc)
    warned = [w.removeprefix("ctx: warning: tsh.config: ") for w in text.err.splitlines()]
    assert warned == doc["warnings"] and len(warned) == 3, (text, doc)
    before = config.read_bytes()
    for words, rc, name in ((["cache_capacity=abc"], 2, "EINVAL"), (["bogus=1"], 2, "EINVAL")):
        text = ctx_run("tool", "tsh.config", *words, env=env)
        as_json = ctx_run("tool", "--json", "tsh.config", *words, env=env)
        assert text.rc == as_json.rc == rc and text.out == "", (text, as_json)
        obj = document(as_json)
        assert obj["error"] == name and stderr_error(text)[0] == name, (text, obj)
        assert stderr_error(text)[1].endswith(obj["message"]), (text, obj)
    assert config.read_bytes() == before
    same_refusal(
        ctx_run("tool", "fs.read", "x", env=env),
        ctx_run("tool", "--json", "fs.read", "x", env=env),
        1,
        "EACCES",
    )


# --- 14. usage errors of every group -------------------------------------------------------------

USAGE = [
    ["session", "show"],
    ["policy", "check"],
    ["policy", "query", "x_t", "tool:a", "execute"],
    ["object", "install", "m.json"],
    ["object", "list", "--bogus"],
    ["agent", "create"],
    ["agent", "list", "extra"],
    ["shared", "create"],
    ["bootstrap", "--bogus"],
    ["man", "a", "b"],
]


def test_usage_errors_of_every_group_are_exit_2_and_one_error_object(world: World) -> None:
    for words in USAGE:
        text = world.ctx(*words)
        as_json = world.ctx(*words[:2], "--json", *words[2:])
        same_refusal(text, as_json, 2, "EINVAL")
        assert "Usage: ctx" in text.err and "Usage: ctx" in as_json.err, (text, as_json)
