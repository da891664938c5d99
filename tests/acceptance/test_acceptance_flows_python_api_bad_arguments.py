"""The Python interfaces the docs give library callers, called by a program with arguments of
the wrong kind or value: the queue's library (``Queue``, ``publish``, ``publish_batch``,
``claim``, ``renew``, ``finish``, ``recover``, ``Holder``, ``init_queue``; docs/queue.md),
sessions and events (``SessionRef``, ``open_session``, ``Session.record``, ``EventLog``,
``append_event``; docs/sessions.md) and the tool runner (``run_native``; docs/tools.md "For
workers and other callers").

Each misuse is to get the project's errno-carrying ``CtxError`` with a sentence a user can act
on, or a plain ``TypeError``/``ValueError`` where that is what a Python API gives, never an
internal ``AttributeError``/``KeyError``; and nothing is left half-written: no temp file in
``inbox/``, no job published in part, no event line a reader skips as damaged, no directory
made for a refused session.

SPEC ids: §2.1 (a request and a result are one JSON object), Q-1 (publish), Q-2 and Q-3
(claim, lease), Q-4 (finish), Q-6 (recover's grace period), Q-8 (how a queue is reached),
S-1 (where sessions live), S-2 (the event shape), S-5 (whole lines), X-2 (the manual bundle is
no shared space), T-3 and T-7 (a call through the runner, recorded).

Every program runs in a subprocess of the install's interpreter, as an embedding program
would, under a deadline.  The storage root and the queue of project ``proj`` are made by
``ctx bootstrap`` and ``ctx queue init`` (conftest); the agent ``ci`` by ``ctx agent create``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, new_scratch_dir, scratch_top
from tests.acceptance.workercli import allow_in_tool_policy, make_agent
from tests.support.storage import copy_of_root

pytestmark = pytest.mark.timeout(60)

PYTHON = str(Path(CTX_ARGV[0]).parent / "python")
SCRATCH = scratch_top(__file__)
DEADLINE = 25.0  # seconds a program may take before it counts as hung
NOBODY = 65534

# What every program starts with: the documented imports and a way to report what a call did.
PRELUDE = """\
import json, math, os, shutil, sys
from pathlib import Path
from cortexfs.errors import CtxError
from cortexfs.queue import (
    Holder, Queue, claim, claim_job, finish, init_queue, publish, publish_batch, queue_path,
    recover, renew,
)
from cortexfs.shared.events import EventLog, append_event, make_event, read_events
from cortexfs.shared.sessions import SessionRef, open_session
from cortexfs.shared.tree import Ownership
from cortexfs.tools.runner import run_native

root = Path(sys.argv[1])
qdir = root / "shared" / "proj" / "queue"
R = {"tool": "fs.read", "input": {}}

def attempt(fn):
    try:
        value = fn()
    except CtxError as exc:
        return {"raised": "CtxError", "errno": exc.code_name, "message": exc.message}
    except Exception as exc:
        return {"raised": type(exc).__name__, "message": str(exc)}
    return {"raised": None, "value": repr(value)[:300]}

def listing(*names):
    return {name: sorted(os.listdir(qdir / name)) for name in names}

def outcome(r):
    e = r.error
    return {"ok": r.ok, "errno": None if e is None else e.errno,
            "stage": None if e is None else e.stage, "message": None if e is None else str(e)}

def done(value):
    sys.stdout.flush()
    print("\\nRESULT " + json.dumps(value), flush=True)
"""


def embed(root: Path, body: str, *, cwd: str = "/") -> dict:
    """Run ``PRELUDE + body`` as a program of its own; the value it passed to ``done``."""
    program = PRELUDE + textwrap.dedent(body)
    try:
        ran = subprocess.run(
            [PYTHON, "-c", program, str(root)],
            capture_output=True,
            text=True,
            timeout=DEADLINE,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"the program did not end within {DEADLINE}s: {hung.stderr!r}")
    marked = [line for line in ran.stdout.splitlines() if line.startswith("RESULT ")]
    assert ran.returncode == 0 and marked, (ran.returncode, ran.stdout[-2000:], ran.stderr)
    return json.loads(marked[-1][len("RESULT ") :])


def refused(outcome: dict, errno_name: str, *words: str) -> None:
    """``outcome`` (of ``attempt``) is a ``CtxError`` with ``errno_name`` whose sentence holds
    each of ``words``."""
    assert outcome["raised"] == "CtxError" and outcome["errno"] == errno_name, outcome
    for word in words:
        assert word in outcome["message"], (word, outcome)


def plain_python_error(outcome: dict) -> None:
    """What a Python API gives for an argument of the wrong kind or value."""
    assert outcome["raised"] in ("TypeError", "ValueError"), outcome


def strict_json_lines(path: Path) -> list[dict]:
    """Each line of ``path`` as JSON that every reader takes (no NaN, no Infinity)."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is no JSON number")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines()]


@pytest.fixture
def queue_dir(storage: Path) -> Path:
    return storage / "shared" / "proj" / "queue"


# ------------------------------------------------------------------------------- publish


def test_publish_refuses_what_is_not_one_json_object_and_leaves_nothing(
    storage: Path, queue_dir: Path
) -> None:
    """§2.1, Q-1: a request that is None, a str of JSON, bytes or a list is refused (EINVAL
    saying a request is one JSON object, or a TypeError), and nothing reaches inbox/ or
    pending/."""
    out = embed(
        storage,
        """
        q = Queue.open(qdir)
        done({
            "none": attempt(lambda: publish(q, None)),
            "str": attempt(lambda: publish(q, '{"tool": "fs.read", "input": {}}')),
            "list": attempt(lambda: publish(q, [R])),
            "bytes": attempt(lambda: publish(q, b"{}")),
            "input list": attempt(lambda: publish(q, {"tool": "fs.read", "input": []})),
            "tool int": attempt(lambda: publish(q, {"tool": 5, "input": {}})),
            "after": listing("inbox", "pending"),
        })
        """,
    )
    for case in ("none", "str", "list"):
        refused(out[case], "EINVAL", "one JSON object")
    refused(out["input list"], "EINVAL", "'input'")
    refused(out["tool int"], "EINVAL", "'tool'")
    if out["bytes"]["raised"] != "CtxError":
        plain_python_error(out["bytes"])
    assert out["after"] == {"inbox": [], "pending": []}


def test_publish_refuses_nan_infinity_and_illegal_names_and_leaves_nothing(
    storage: Path, queue_dir: Path
) -> None:
    """§2.1, Q-1: NaN and the infinities are refused with EINVAL (docs/queue.md), in
    ``publish`` and in a batch (which names the bad request and publishes none of the
    others); a name that is not a string or not an object name is EINVAL naming it."""
    out = embed(
        storage,
        """
        q = Queue.open(qdir)
        nan = {"tool": "fs.read", "input": {"x": math.nan}}
        done({
            "nan": attempt(lambda: publish(q, nan)),
            "inf": attempt(lambda: publish(q, {"tool": "fs.read", "input": {"x": [-math.inf]}})),
            "batch": attempt(lambda: publish_batch(q, [R, nan, R])),
            "name int": attempt(lambda: publish(q, R, name=5)),
            "name bytes": attempt(lambda: publish(q, R, name=b"abc")),
            "name dots": attempt(lambda: publish(q, R, name="../escape")),
            "name empty": attempt(lambda: publish(q, R, name="")),
            "batch names": attempt(lambda: publish_batch(q, [R, R], names=["a"])),
            "batch twice": attempt(lambda: publish_batch(q, [R, R], names=["a", "a"])),
            "after": listing("inbox", "pending"),
        })
        """,
    )
    refused(out["nan"], "EINVAL", "NaN")
    refused(out["inf"], "EINVAL", "infinite")
    refused(out["batch"], "EINVAL", "nothing published", "request 2")
    assert "request 1" not in out["batch"]["message"], out["batch"]
    for case in ("name int", "name bytes", "name dots", "name empty"):
        refused(out[case], "EINVAL", "illegal job name")
    refused(out["batch names"], "EINVAL", "one name")
    refused(out["batch twice"], "EINVAL", "twice")
    assert out["after"] == {"inbox": [], "pending": []}
    assert not (queue_dir / "pending" / "escape.req.json").exists()


def test_publish_of_values_json_cannot_hold_is_a_type_error_and_publishes_nothing(
    storage: Path, queue_dir: Path
) -> None:
    """Q-1: a set, an arbitrary object or a tuple key in a request's input is a plain
    TypeError (not stored as some text of Python's), alone or in a batch, and nothing is
    published."""
    out = embed(
        storage,
        """
        q = Queue.open(qdir)
        def req(value):
            return {"tool": "fs.read", "input": {"a": value}}
        done({
            "set": attempt(lambda: publish(q, req({1, 2}))),
            "object": attempt(lambda: publish(q, req(object()))),
            "tuple key": attempt(lambda: publish(q, {"tool": "fs.read", "input": {(1, 2): 3}})),
            "batch": attempt(lambda: publish_batch(q, [R, req({3})])),
            "keyword typo": attempt(lambda: publish(q, R, nmae="x")),
            "after": listing("inbox", "pending"),
        })
        """,
    )
    for case in ("set", "object", "tuple key", "batch"):
        if out[case]["raised"] != "CtxError":
            plain_python_error(out[case])
        else:
            refused(out[case], "EINVAL")
    assert out["keyword typo"]["raised"] == "TypeError", out
    assert "nmae" in out["keyword typo"]["message"]
    assert out["after"] == {"inbox": [], "pending": []}


def test_publish_of_a_cyclic_request_names_the_cycle(storage: Path) -> None:
    """Q-1: a request whose input refers to itself cannot be written; the refusal says so
    (a circular reference), not something else the request does not hold."""
    out = embed(
        storage,
        """
        q = Queue.open(qdir)
        cyclic = {"tool": "fs.read", "input": {}}
        cyclic["input"]["self"] = cyclic
        done({"cyclic": attempt(lambda: publish(q, cyclic)), "after": listing("inbox", "pending")})
        """,
    )
    assert out["after"] == {"inbox": [], "pending": []}
    if out["cyclic"]["raised"] != "CtxError":
        plain_python_error(out["cyclic"])
    assert "NaN" not in out["cyclic"]["message"], out
    assert "circular" in out["cyclic"]["message"].lower(), out


def test_publish_of_a_request_with_a_huge_integer_names_the_integer(storage: Path) -> None:
    """§2.1, Q-1 (docs/queue.md): a request holding an integer of more than 4 300 digits is
    refused with EINVAL, and the sentence says that is why."""
    out = embed(
        storage,
        """
        q = Queue.open(qdir)
        big = {"tool": "fs.read", "input": {"n": 10 ** 5000}}
        done({"big": attempt(lambda: publish(q, big)), "after": listing("inbox", "pending")})
        """,
    )
    assert out["after"] == {"inbox": [], "pending": []}
    refused(out["big"], "EINVAL", "digits")


def test_publish_refuses_a_request_nested_deeper_than_readers_take(
    storage: Path, queue_dir: Path
) -> None:
    """§2.1, Q-1 (docs/queue.md: a request nested more than 128 arrays or objects deep is
    refused with EINVAL): the library caller is held to what ``ctx queue publish`` is, so
    that no job reaches pending/ that its claimer can only fail as malformed."""
    out = embed(
        storage,
        """
        q = Queue.open(qdir)
        deep = []
        for _ in range(199):
            deep = [deep]
        request = {"tool": "fs.read", "input": {"a": deep}}
        got = attempt(lambda: publish(q, request, name="deep"))
        c = claim(q, Holder.for_process(), ttl=60) if got["raised"] is None else None
        done({"publish": got, "claimed": None if c is None else c.request,
              "after": listing("inbox")})
        """,
    )
    assert out["after"] == {"inbox": []}
    assert out["claimed"] is None or "invalid" not in out["claimed"], out["claimed"]
    refused(out["publish"], "EINVAL", "128")


def test_publish_with_a_publisher_that_is_not_text_publishes_no_malformed_job(
    storage: Path,
) -> None:
    """§2.1, Q-1: ``from`` is a string; a ``publisher`` that is not one is refused (EINVAL or
    TypeError) rather than stored into a request every claimer then fails."""
    out = embed(
        storage,
        """
        q = Queue.open(qdir)
        got = attempt(lambda: publish(q, R, name="who", publisher=5))
        c = claim(q, Holder.for_process(), ttl=60) if got["raised"] is None else None
        done({"publish": got, "claimed": None if c is None else c.request})
        """,
    )
    assert out["claimed"] is None or "invalid" not in out["claimed"], out["claimed"]
    if out["publish"]["raised"] == "CtxError":
        refused(out["publish"], "EINVAL", "from")
    else:
        plain_python_error(out["publish"])


# ------------------------------------------------------------------ claim, renew, finish


def test_claim_and_renew_refuse_lifetimes_that_are_no_number_of_seconds(
    storage: Path, queue_dir: Path
) -> None:
    """Q-2, Q-3: a ``ttl`` that is NaN, infinite, negative, zero, past 366 days or a str is
    EINVAL naming a lease lifetime; the claim leaves the job pending (no ``claimed/J``, no
    ``lease/J``, no temp file) and the renewal leaves the lease as it was."""
    out = embed(
        storage,
        """
        q = Queue.open(qdir)
        me = Holder.for_process()
        publish(q, R, name="a1")
        bad = [math.nan, math.inf, -1, 0, 1e300, "10"]
        claims = [attempt(lambda: claim(q, me, ttl=ttl)) for ttl in bad]
        before = listing("pending", "claimed", "lease", "inbox")
        c = claim(q, me, ttl=60)
        lease = (qdir / "lease" / c.job / "worker").read_bytes()
        renewals = [attempt(lambda: renew(q, c.job, [me], ttl=ttl)) for ttl in bad]
        done({"claims": claims, "before": before, "renewals": renewals,
              "lease same": (qdir / "lease" / c.job / "worker").read_bytes() == lease,
              "inbox": listing("inbox")})
        """,
    )
    for got in out["claims"] + out["renewals"]:
        refused(got, "EINVAL", "lease lifetime")
    assert out["before"] == {
        "pending": ["a1.req.json"],
        "claimed": [],
        "lease": [],
        "inbox": [],
    }
    assert out["lease same"] and out["inbox"] == {"inbox": []}


def test_holder_refuses_a_pid_or_worker_id_no_lease_may_record(storage: Path) -> None:
    """Q-3 (docs/queue.md: a worker id is one line of printable text; a library claim for
    such a holder is EINVAL): a negative or huge pid and a worker id that is not text or
    holds a line break are EINVAL, before anything is claimed."""
    out = embed(
        storage,
        """
        done({
            "pid -5": attempt(lambda: Holder.for_process(-5)),
            "pid 2**70": attempt(lambda: Holder.for_process(2 ** 70)),
            "worker int": attempt(lambda: Holder.for_process(worker=5)),
            "worker newline": attempt(lambda: Holder.for_process(worker="a\\nb")),
            "worker empty": attempt(lambda: Holder.for_process(worker="")),
        })
        """,
    )
    for case, got in out.items():
        refused(got, "EINVAL")
        assert "Traceback" not in got["message"], case


def test_finish_with_an_output_json_cannot_write_leaves_the_job_claimed(
    storage: Path, queue_dir: Path
) -> None:
    """Q-4: an output that refers to itself, or holds an integer of 5 001 digits, cannot be
    written as a result: a plain ValueError (or EINVAL), and the job stays claimed with its
    lease, no result in done/ and no temp file in inbox/; finishing it properly then works."""
    out = embed(
        storage,
        """
        q = Queue.open(qdir)
        publish(q, R, name="f1")
        c = claim(q, Holder.for_process(), ttl=60)
        loop = []
        loop.append(loop)
        got = {
            "cyclic": attempt(lambda: finish(q, c.job, True, loop)),
            "digits": attempt(lambda: finish(q, c.job, True, {"n": 10 ** 5000})),
        }
        after = listing("claimed", "lease", "done", "inbox")
        final = attempt(lambda: finish(q, c.job, True, {"answer": 42}))
        done({"got": got, "after": after, "final": final,
              "done": listing("done", "claimed", "lease", "inbox")})
        """,
    )
    for got in out["got"].values():
        if got["raised"] == "CtxError":
            refused(got, "EINVAL")
        else:
            plain_python_error(got)
    assert out["after"] == {
        "claimed": ["f1.req.json"],
        "lease": ["f1.req.json"],
        "done": [],
        "inbox": [],
    }
    assert out["final"]["raised"] is None, out["final"]
    assert out["done"] == {
        "done": ["f1.req.json", "f1.req.json.result"],
        "claimed": [],
        "lease": [],
        "inbox": [],
    }


@pytest.mark.parametrize("where", ["output", "extra"])
def test_finish_never_writes_a_result_that_is_not_json(
    storage: Path, queue_dir: Path, where: str
) -> None:
    """§2.1, Q-4: a result file is one JSON object; NaN, which JSON has no spelling for, is
    refused (EINVAL, as ``ctx queue finish`` refuses it in a result file) and the job stays
    claimed, rather than finished with a result no reader takes."""
    out = embed(
        storage,
        f"""
        q = Queue.open(qdir)
        publish(q, R, name="n1")
        c = claim(q, Holder.for_process(), ttl=60)
        if {where!r} == "output":
            got = attempt(lambda: finish(q, c.job, True, math.nan))
        else:
            got = attempt(lambda: finish(q, c.job, True, 1, extra={{"x": math.nan}}))
        done({{"got": got, "after": listing("claimed", "done", "inbox")}})
        """,
    )
    result = queue_dir / "done" / "n1.req.json.result"
    if result.exists():
        strict_json_lines(result)
    refused(out["got"], "EINVAL")
    assert out["after"] == {"claimed": ["n1.req.json"], "done": [], "inbox": []}


# ------------------------------------------------------------------------ opening a queue


def test_opening_a_missing_queue_or_a_file_says_what_is_wrong(storage: Path) -> None:
    """Q-8: a queue path that does not exist is ENOENT with the ``ctx queue init`` that makes
    it; one that is a file is ENOTDIR naming it; a relative path and a str open the queue; a
    project name that is not an object name is EINVAL."""
    out = embed(
        storage,
        """
        def opened(path):
            with Queue.open(path) as q:
                return str(q.path)
        done({
            "missing": attempt(lambda: Queue.open(root / "shared" / "nope" / "queue")),
            "file": attempt(lambda: Queue.open(qdir / "config")),
            "str": attempt(lambda: opened(str(qdir))),
            "relative": attempt(lambda: opened(Path("shared/proj/queue"))),
            "project int": attempt(lambda: queue_path(root, 5)),
            "project dots": attempt(lambda: queue_path(root, "..")),
            "project docs": attempt(lambda: queue_path(root, "cortexfs-docs")),
        })
        """,
        cwd=str(storage),
    )
    refused(out["missing"], "ENOENT", "ctx queue init")
    refused(out["file"], "ENOTDIR", "config")
    assert out["str"]["raised"] is None and out["relative"]["raised"] is None, out
    for case in ("project int", "project dots"):
        refused(out[case], "EINVAL", "project")
    refused(out["project docs"], "EINVAL", "cortexfs-docs", "not a space")
    assert not (storage / "shared" / "nope").exists()


@pytest.mark.parametrize("kind", ["bytes", "none"])
def test_opening_a_queue_by_a_path_of_another_type_is_not_called_missing(
    storage: Path, kind: str
) -> None:
    """Q-8: ``os`` takes a bytes path as well as a str; a queue named by one is opened, or
    the call is a TypeError.  ``None`` is no path at all: a TypeError, not an ENOENT whose
    remedy (``ctx queue init``) would make nothing of it."""
    out = embed(
        storage,
        f"""
        path = bytes(qdir) if {kind!r} == "bytes" else None
        def opened():
            with Queue.open(path) as q:
                return q.path
        done(attempt(opened))
        """,
    )
    assert out["raised"] in (None, "TypeError"), out


def test_init_queue_takes_a_str_path_as_queue_open_does(storage: Path) -> None:
    """Q-8: ``init_queue`` makes a queue at a str path, as ``Queue.open`` opens one, or
    refuses it with a TypeError; never an internal AttributeError."""
    target = storage.parent / "elsewhere-queue"
    out = embed(storage, f"done(attempt(lambda: init_queue({str(target)!r})))")
    assert out["raised"] in (None, "TypeError"), out
    if out["raised"] is None:
        assert {"inbox", "pending", "claimed", "lease", "done", "failed"} <= set(os.listdir(target))


def test_a_closed_queue_says_it_is_closed(storage: Path) -> None:
    """A ``Queue`` used after ``close()`` (or after its ``with`` block) is refused as a
    closed file is, with a ValueError or an EBADF ``CtxError`` saying it is closed; nothing
    is published."""
    out = embed(
        storage,
        """
        with Queue.open(qdir) as q:
            pass
        got = {
            "publish": attempt(lambda: publish(q, R)),
            "claim": attempt(lambda: claim(q, Holder.for_process())),
            "recover": attempt(lambda: recover(q)),
        }
        done({"got": got, "after": listing("inbox", "pending")})
        """,
    )
    assert out["after"] == {"inbox": [], "pending": []}
    for got in out["got"].values():
        assert got["raised"] in ("ValueError", "CtxError"), got
        assert "closed" in got["message"], got


def test_a_queue_whose_directory_was_removed_publishes_nothing_and_makes_nothing(
    storage: Path, queue_dir: Path
) -> None:
    """Q-1, Q-8: a ``Queue`` still open after ``rm -rf`` of its directory refuses a publish
    with ENOENT saying nothing was published, finds nothing to claim, and makes nothing at
    the old path; opening it again is ENOENT with ``ctx queue init``."""
    out = embed(
        storage,
        """
        q = Queue.open(qdir)
        shutil.rmtree(qdir)
        done({
            "publish": attempt(lambda: publish(q, R, name="late")),
            "claim": attempt(lambda: claim(q, Holder.for_process(), ttl=60)),
            "reopen": attempt(lambda: Queue.open(qdir)),
        })
        """,
    )
    refused(out["publish"], "ENOENT", "nothing was published")
    assert out["claim"] == {"raised": None, "value": "None"}, out["claim"]
    refused(out["reopen"], "ENOENT", "ctx queue init")
    assert not queue_dir.exists()


@pytest.mark.parametrize("grace", ["math.nan", "-1.0"])
def test_recover_refuses_a_grace_period_that_is_no_number_of_seconds(
    storage: Path, queue_dir: Path, grace: str
) -> None:
    """Q-6: stray temp files are removed only once older than the grace period; a grace that
    is NaN or negative is EINVAL (as ``--grace`` and the config's ``grace`` are), and a temp
    file just written stays."""
    out = embed(
        storage,
        f"""
        q = Queue.open(qdir)
        (qdir / "inbox" / "j1.req.json.publish.tmp").write_text("{{}}")
        got = attempt(lambda: recover(q, reconcile=True, grace={grace}))
        done({{"got": got, "after": listing("inbox")}})
        """,
    )
    assert out["after"] == {"inbox": ["j1.req.json.publish.tmp"]}, out
    refused(out["got"], "EINVAL", "grace")


# ------------------------------------------------------------------- sessions and events


def test_session_refs_refuse_illegal_names_and_uids_and_make_nothing(storage: Path) -> None:
    """S-1: an agent, session or space name that is None, bytes or not an object name, a
    negative uid, both a uid and a space or neither, are EINVAL; nothing is made in home/ or
    shared/."""
    before = sorted(os.listdir(storage / "home")), sorted(os.listdir(storage / "shared"))
    out = embed(
        storage,
        """
        def opened(make):
            with open_session(make()) as s:
                return str(s.ref)
        done({
            "agent none": attempt(lambda: opened(lambda: SessionRef.home(root, 0, None, "s"))),
            "agent bytes": attempt(lambda: opened(lambda: SessionRef.home(root, 0, b"a", "s"))),
            "name dots": attempt(lambda: opened(lambda: SessionRef.home(root, 0, "a", ".."))),
            "name slash": attempt(lambda: opened(lambda: SessionRef.home(root, 0, "a", "x/y"))),
            "space int": attempt(lambda: opened(lambda: SessionRef.shared(root, 5, "a", "s"))),
            "uid -1": attempt(lambda: opened(lambda: SessionRef.home(root, -1, "a", "s"))),
            "neither": attempt(lambda: opened(lambda: SessionRef(root, "a", "s"))),
            "both": attempt(lambda: opened(lambda: SessionRef(root, "a", "s", 0, "proj"))),
        })
        """,
    )
    for case, got in out.items():
        refused(got, "EINVAL")
        assert got["message"], case
    after = sorted(os.listdir(storage / "home")), sorted(os.listdir(storage / "shared"))
    assert after == before


@pytest.mark.parametrize("uid", ["1.5", "True"])
def test_a_uid_that_is_no_integer_makes_no_home(storage: Path, uid: str) -> None:
    """S-1: a session lives in ``home/<uid>/``; a uid that is a float or a bool is refused
    (EINVAL or TypeError) and no directory is made for it under home/."""
    before = sorted(os.listdir(storage / "home"))
    out = embed(
        storage,
        f"""
        def opened():
            with open_session(SessionRef.home(root, {uid}, "a", "s")) as s:
                return str(s.ref)
        done(attempt(opened))
        """,
    )
    assert sorted(os.listdir(storage / "home")) == before
    assert out["raised"] in ("CtxError", "TypeError", "ValueError"), out


def test_no_session_is_made_in_the_manual_bundle(storage: Path) -> None:
    """X-2: ``shared/cortexfs-docs`` is the manual bundle, never a shared space; a session
    there is refused with EINVAL, as ``ctx shared create`` and ``ctx queue init`` refuse the
    name, and nothing is added to the bundle."""
    bundle = storage / "shared" / "cortexfs-docs"
    before = sorted(os.listdir(bundle))
    out = embed(
        storage,
        """
        def opened():
            with open_session(SessionRef.shared(root, "cortexfs-docs", "a", "s")) as s:
                return str(s.ref)
        done(attempt(opened))
        """,
    )
    assert sorted(os.listdir(bundle)) == before
    refused(out, "EINVAL", "cortexfs-docs")


def test_events_that_cannot_be_recorded_leave_the_log_as_it_was(storage: Path) -> None:
    """S-5: an event over 64 KiB is EFBIG, an event whose first key is not ``ts`` (or that is
    not a mapping) is EINVAL, a keyword the record does not take is a TypeError; the log
    holds exactly the events recorded before, whole."""
    out = embed(
        storage,
        """
        ref = SessionRef.home(root, 0, "a", "s1")
        s = open_session(ref)
        first = s.record("note", object="x", status="ok", durable_event=True)
        got = {
            "big": attempt(lambda: s.record("note", object="x", status="ok", v="a" * 70000)),
            "typo": attempt(lambda: s.record("note", objct="x", status="ok")),
            "no ts": attempt(lambda: append_event(ref.events_path, {"type": "t"})),
            "list": attempt(lambda: append_event(ref.events_path, [1, 2])),
        }
        s.close()
        scan = read_events(ref.events_path)
        done({"got": got, "events": len(scan.events), "damaged": scan.damaged_count,
              "torn": scan.torn_tail, "path": str(ref.events_path)})
        """,
    )
    refused(out["got"]["big"], "EFBIG", "65536")
    assert out["got"]["typo"]["raised"] == "TypeError", out
    for case in ("no ts", "list"):
        refused(out["got"][case], "EINVAL", "'ts'")
    assert (out["events"], out["damaged"], out["torn"]) == (1, 0, 0), out
    assert len(strict_json_lines(Path(out["path"]))) == 1


def test_a_closed_session_refuses_to_record_and_appends_nothing(storage: Path) -> None:
    """S-5: ``record`` and ``sync`` on a session closed by its ``with`` block raise a plain
    ValueError (as a closed file does), never an AttributeError or KeyError, and append
    nothing; closing twice is harmless."""
    out = embed(
        storage,
        """
        ref = SessionRef.home(root, 0, "a", "s2")
        with open_session(ref) as s:
            s.record("note", object="x", status="ok")
        got = {
            "record": attempt(lambda: s.record("note", object="x", status="ok")),
            "sync": attempt(lambda: s.sync()),
            "close": attempt(lambda: s.close()),
        }
        done({"got": got, "events": len(read_events(ref.events_path).events)})
        """,
    )
    assert out["got"]["record"]["raised"] in ("ValueError", "CtxError"), out
    assert out["got"]["sync"]["raised"] in ("ValueError", "CtxError"), out
    assert out["got"]["close"]["raised"] is None
    assert out["events"] == 1


@pytest.mark.parametrize("value", ["math.nan", "[math.inf]", "json.loads('[' * 300 + ']' * 300)"])
def test_a_recorded_event_is_one_every_reader_takes(storage: Path, value: str) -> None:
    """S-2, S-5: what ``record`` returns from was appended as one event readers read back;
    a fact JSON cannot hold, or no reader takes, is refused (EINVAL or ValueError) and
    nothing is appended, rather than recorded as a line skipped as damaged."""
    out = embed(
        storage,
        f"""
        ref = SessionRef.home(root, 0, "a", "s3")
        with open_session(ref) as s:
            s.record("note", object="x", status="ok")
            got = attempt(lambda: s.record("note", object="x", status="ok", v={value},
                                           durable_event=True))
        scan = read_events(ref.events_path)
        done({{"got": got, "events": len(scan.events), "damaged": scan.damaged_count,
               "path": str(ref.events_path)}})
        """,
    )
    assert out["damaged"] == 0, out
    strict_json_lines(Path(out["path"]))
    if out["got"]["raised"] is None:
        assert out["events"] == 2
    else:
        assert out["got"]["raised"] in ("CtxError", "ValueError"), out
        assert out["events"] == 1


def test_a_fact_named_ts_does_not_replace_the_events_timestamp(storage: Path) -> None:
    """S-2: every event starts with ``ts``, RFC 3339 in UTC, set by the recorder; a fact
    named ``ts`` is refused as a fact named ``agent`` is, never written over it."""
    out = embed(
        storage,
        """
        ref = SessionRef.home(root, 0, "a", "s4")
        with open_session(ref) as s:
            got = attempt(lambda: s.record("note", object="x", status="ok", ts="bogus"))
            agent = attempt(lambda: s.record("note", object="x", status="ok", agent="b"))
        done({"got": got, "agent": agent, "path": str(ref.events_path)})
        """,
    )
    assert out["agent"]["raised"] == "TypeError", out
    stamps = [event["ts"] for event in strict_json_lines(Path(out["path"]))]
    assert "bogus" not in stamps, stamps
    assert out["got"]["raised"] in ("TypeError", "CtxError"), out


def test_event_logs_take_a_str_path_as_the_readers_do(storage: Path) -> None:
    """S-5 (docs/sessions.md: ``EventLog(path)``, ``append_event(path, event, …)``): a path
    given as a str is appended to, as ``read_events`` reads one, or refused with a
    TypeError; never an internal AttributeError."""
    out = embed(
        storage,
        """
        path = str(root / "home" / "events.jsonl")
        event = make_event("note", agent="a", session="s", object="x", status="ok")
        def logged():
            with EventLog(path) as log:
                log.append(event)
        got = {"log": attempt(logged),
               "append": attempt(lambda: append_event(path, event))}
        done({"got": got, "events": len(read_events(path).events) if os.path.exists(path) else 0})
        """,
    )
    for got in out["got"].values():
        assert got["raised"] in (None, "TypeError"), out


# --------------------------------------------------------------------------- the runner


@pytest.fixture(scope="module")
def agent_root(_template: Path) -> Iterator[Path]:
    """A copy of the bootstrapped root where uid nobody may search, with agent ``ci`` allowed
    ``shell.exec`` in both layers of P-6; removed afterwards."""
    parent = new_scratch_dir(SCRATCH, "root")
    storage = copy_of_root(_template, parent / "storage")
    make_agent(storage, ["shell.exec"])
    allow_in_tool_policy(storage, "shell.exec")
    yield storage
    shutil.rmtree(parent, ignore_errors=True)


def session_lines(root: Path, name: str) -> list[dict]:
    path = root / f"home/{NOBODY}/agent/ci/session/{name}/events.jsonl"
    return strict_json_lines(path) if path.exists() else []


def test_run_native_returns_a_refusal_for_bad_names_inputs_and_sessions(
    agent_root: Path,
) -> None:
    """T-3 (docs/tools.md: ``run_native`` never raises for a refused or failed call): an
    agent, tool or session name that is None, bytes or not an object name, an input that
    is not an object or does not match the schema, a ``SessionRef`` of another agent, each
    come back as a result with EINVAL at their stage; every line of the session is JSON."""
    out = embed(
        agent_root,
        """
        C = {"cmd": "echo hi"}
        def call(agent="ci", tool="shell.exec", value=C, session="bad-args"):
            return outcome(run_native(root, agent, tool, value, session=session, timeout=20))
        got = {
            "agent none": call(agent=None),
            "agent dots": call(agent="../x"),
            "tool none": call(tool=None),
            "tool bytes": call(tool=b"shell.exec"),
            "input none": call(value=None),
            "input str": call(value='{"cmd": "echo hi"}'),
            "cmd int": call(value={"cmd": 5}),
            "session int": call(session=5),
            "session dots": call(session="../x"),
            "session other": call(session=SessionRef.home(root, 65534, "other", "s")),
        }
        typo = attempt(lambda: run_native(root, "ci", "shell.exec", C, sesion="x"))
        done({"got": got, "typo": typo})
        """,
    )
    stages = {
        "agent none": "agent",
        "agent dots": "agent",
        "tool none": "resolve",
        "tool bytes": "resolve",
        "input none": "schema",
        "input str": "schema",
        "cmd int": "schema",
        "session int": "session",
        "session dots": "session",
        "session other": "session",
    }
    for case, stage in stages.items():
        got = out["got"][case]
        assert (got["ok"], got["errno"], got["stage"]) == (False, 22, stage), (case, got)
    assert out["typo"]["raised"] == "TypeError" and "sesion" in out["typo"]["message"]
    assert not (agent_root / f"home/{NOBODY}/agent/ci/session/x").exists()
    session_lines(agent_root, "bad-args")


def test_run_native_takes_a_str_root(agent_root: Path) -> None:
    """T-3: the storage root given as a str runs the call as a ``Path`` would, or is refused
    as EINVAL; not reported as an I/O error (EIO) from an internal exception."""
    out = embed(
        agent_root,
        """
        r = run_native(str(root), "ci", "shell.exec", {"cmd": "echo hi"}, session="str-root",
                       timeout=20)
        done(outcome(r))
        """,
    )
    assert out["errno"] != 5, out
    assert out["ok"] or out["errno"] == 22, out


def test_run_native_with_a_relative_root_runs_the_tool_it_found(agent_root: Path) -> None:
    """T-3, T-7: a root given relative to the caller's working directory names the same tree
    throughout the call: the tool it resolved there is the one that runs (or the root is
    refused before anything is recorded)."""
    out = embed(
        agent_root,
        """
        os.chdir(root.parent)
        r = run_native(Path(root.name), "ci", "shell.exec", {"cmd": "echo hi"},
                       session="relative", timeout=20)
        done(outcome(r))
        """,
        cwd=str(agent_root.parent),
    )
    assert out["ok"], out


@pytest.mark.parametrize("timeout", ["math.nan", "'10'"])
def test_run_native_refuses_a_timeout_that_is_no_number_of_seconds(
    agent_root: Path, timeout: str
) -> None:
    """T-3: a timeout that is NaN or a str is the caller's mistake: EINVAL saying so, before
    the tool starts, rather than an I/O error (EIO) naming an internal exception."""
    out = embed(
        agent_root,
        f"""
        r = run_native(root, "ci", "shell.exec", {{"cmd": "echo hi"}}, session="timeouts",
                       timeout={timeout})
        done(outcome(r))
        """,
    )
    assert (out["ok"], out["errno"]) == (False, 22), out
    assert "timeout" in out["message"], out


def test_run_native_does_not_raise_for_an_input_json_cannot_write(agent_root: Path) -> None:
    """T-3 (docs/tools.md: ``run_native`` never raises for a refused or failed call): an
    input holding an integer of 5 001 digits gives a refused result (EINVAL)."""
    out = embed(
        agent_root,
        """
        got = attempt(lambda: run_native(root, "ci", "shell.exec",
                                         {"cmd": "echo hi", "n": 10 ** 5000},
                                         session="digits", timeout=20))
        done(got)
        """,
    )
    assert out["raised"] is None, out
    session_lines(agent_root, "digits")


def test_a_call_with_nan_in_its_input_leaves_both_events_readable(agent_root: Path) -> None:
    """S-2, T-7: every tool call leaves a ``tool_call`` and a ``tool_result`` that readers
    read back; an input holding NaN is refused (EINVAL) and both its events are JSON."""
    out = embed(
        agent_root,
        """
        r = run_native(root, "ci", "shell.exec", {"cmd": "echo hi", "x": math.nan},
                       session="nan-input", timeout=20)
        path = root / "home" / "65534" / "agent" / "ci" / "session" / "nan-input" / "events.jsonl"
        scan = read_events(path)
        done({"result": outcome(r), "types": [e["type"] for e in scan.events],
              "damaged": scan.damaged_count})
        """,
    )
    assert out["result"]["errno"] == 22, out
    assert (out["types"], out["damaged"]) == (["tool_call", "tool_result"], 0), out
    session_lines(agent_root, "nan-input")
