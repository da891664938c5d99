"""The protocol verbs on a real queue directory: publish, batch, claim, lease, renew, finish."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cortexfs.durable import FsOps
from cortexfs.errors import CtxError
from cortexfs.queue import (
    Holder,
    Lease,
    Queue,
    claim,
    claim_job,
    finish,
    publish,
    publish_batch,
    recover,
    renew,
)
from cortexfs.queue.holder import LocalSystem
from cortexfs.queue.layout import STATE_DIRS
from tests.queue.helpers import dead_pid, request


def entries(queue_dir: Path, state: str) -> list[str]:
    return sorted(os.listdir(queue_dir / state))


def test_init_creates_exactly_the_six_directories_and_a_config(queue_dir: Path) -> None:
    assert sorted(os.listdir(queue_dir)) == sorted([*STATE_DIRS, "config"])
    config = (queue_dir / "config").read_text()
    assert "max_request_bytes=1048576" in config
    # Every key is there to be found, move as a comment: its default depends on the filesystem.
    keys = {line.lstrip("# ").split("=")[0] for line in config.splitlines()[1:] if "=" in line}
    assert keys == {"max_request_bytes", "max_result_bytes", "lease_ttl", "grace", "move"}


def test_publish_puts_a_complete_request_in_pending(queue: Queue, queue_dir: Path) -> None:
    job = publish(queue, request(1), name="build-1")
    assert job == "build-1.req.json"
    assert entries(queue_dir, "pending") == [job]
    assert entries(queue_dir, "inbox") == []
    stored = json.loads((queue_dir / "pending" / job).read_text())
    assert stored["tool"] == "fs.stat" and stored["input"] == {"n": 1}
    assert stored["from"] and stored["created"].endswith("Z")


def test_publish_keeps_from_and_created_when_given(queue: Queue, queue_dir: Path) -> None:
    job = publish(queue, {**request(), "from": "coder", "created": "2026-01-01T00:00:00Z"})
    stored = json.loads((queue_dir / "pending" / job).read_text())
    assert stored["from"] == "coder" and stored["created"] == "2026-01-01T00:00:00Z"


@pytest.mark.parametrize("blank", [" ", "\n", "\t", "\u00a0", "\u2028"])
def test_a_created_with_blanks_around_its_stamp_is_refused(
    queue: Queue, queue_dir: Path, blank: str
) -> None:
    """Q-1: ``created`` is kept as written, so it must be the RFC 3339 timestamp itself."""
    for created in (blank + "2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z" + blank):
        with pytest.raises(CtxError) as caught:
            publish(queue, {**request(), "created": created})
        assert caught.value.errno == errno.EINVAL
        assert "blanks around the RFC 3339 timestamp" in caught.value.message
    assert os.listdir(queue_dir / "pending") == [] and os.listdir(queue_dir / "inbox") == []


def test_the_default_publisher_follows_the_environment_of_each_publish(
    queue: Queue, queue_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The login name is remembered between publishes, but never across a change of the
    variables it comes from."""
    for variable in ("CTX_AGENT", "LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(variable, raising=False)
    publishers = []
    for login in ("ana", "ana", "ben"):
        monkeypatch.setenv("LOGNAME", login)
        job = publish(queue, request())
        publishers.append(json.loads((queue_dir / "pending" / job).read_text())["from"])
    monkeypatch.setenv("CTX_AGENT", "triage")
    job = publish(queue, request())
    publishers.append(json.loads((queue_dir / "pending" / job).read_text())["from"])
    assert publishers == ["ana", "ana", "ben", "triage"]


def test_generated_names_are_legal_and_unique(queue: Queue) -> None:
    names = {publish(queue, request(n)) for n in range(20)}
    assert len(names) == 20
    assert all(n.startswith("job-") and n.endswith(".req.json") and len(n) <= 64 for n in names)


@pytest.mark.parametrize("state", ["pending", "claimed", "done", "failed"])
def test_publish_refuses_a_name_with_evidence_anywhere(
    queue: Queue, me: Holder, queue_dir: Path, state: str
) -> None:
    job = publish(queue, request(), name="dup")
    if state != "pending":
        assert claim_job(queue, job, me) is not None
    if state in ("done", "failed"):
        finish(queue, job, ok=state == "done")
    before = {s: entries(queue_dir, s) for s in STATE_DIRS}
    with pytest.raises(CtxError) as caught:
        publish(queue, request(2), name="dup")
    assert caught.value.errno == errno.EEXIST
    assert state in caught.value.message
    assert {s: entries(queue_dir, s) for s in STATE_DIRS} == before


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ({"input": {}}, "'tool'"),
        ({"tool": 3, "input": {}}, "'tool'"),
        ({"tool": "../etc", "input": {}}, "'tool'"),
        ({"tool": "fs.stat"}, "'input'"),
        ({"tool": "fs.stat", "input": [1]}, "'input'"),
        ({"tool": "fs.stat", "input": {}, "from": 5}, "'from'"),
        ([1, 2], "one JSON object"),
    ],
)
def test_publish_refuses_invalid_requests_and_leaves_nothing(
    queue: Queue, queue_dir: Path, bad: object, reason: str
) -> None:
    with pytest.raises(CtxError) as caught:
        publish(queue, bad)  # type: ignore[arg-type]
    assert caught.value.errno == errno.EINVAL and reason in caught.value.message
    assert entries(queue_dir, "pending") == [] and entries(queue_dir, "inbox") == []


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "é", "a" * 70, "..", "-lead"])
def test_publish_refuses_illegal_names(queue: Queue, name: str) -> None:
    with pytest.raises(CtxError) as caught:
        publish(queue, request(), name=name)
    assert caught.value.errno == errno.EINVAL


def test_the_request_limit_is_inclusive_and_on_what_the_publisher_gave(queue_dir: Path) -> None:
    (queue_dir / "config").write_text("max_request_bytes=200\n")
    compact = len(json.dumps(request(0, pad=""), separators=(",", ":")))
    exact = request(0, pad="x" * (200 - compact))
    with Queue.open(queue_dir) as q:
        job = publish(q, exact)  # exactly 200 bytes given; more once 'from'/'created' join
        with pytest.raises(CtxError) as caught:
            publish(q, request(0, pad="x" * (201 - compact)))
        won = claim(q, Holder.for_process(worker="t"))
    assert caught.value.errno == errno.EFBIG and "201 bytes" in caught.value.message
    assert (queue_dir / "claimed" / job / job).stat().st_size > 200
    assert won is not None and "invalid" not in won.request and won.request["from"]


def test_publish_refuses_oversize_requests_by_config(queue_dir: Path) -> None:
    (queue_dir / "config").write_text("max_request_bytes=200\n")
    with Queue.open(queue_dir) as q:
        publish(q, request(0, pad="x" * 50))
        with pytest.raises(CtxError) as caught:
            publish(q, request(0, pad="x" * 300))
    assert caught.value.errno == errno.EFBIG
    assert "max_request_bytes" in caught.value.message
    assert len(entries(queue_dir, "pending")) == 1 and entries(queue_dir, "inbox") == []


def test_batch_publishes_every_request_in_order(queue: Queue, queue_dir: Path) -> None:
    jobs = publish_batch(queue, [request(n) for n in range(50)])
    assert len(jobs) == 50 and sorted(jobs) == entries(queue_dir, "pending")
    assert [
        json.loads((queue_dir / "pending" / j).read_text())["input"]["n"] for j in jobs
    ] == list(range(50))
    assert entries(queue_dir, "inbox") == []


def test_batch_with_one_bad_request_publishes_nothing(queue: Queue, queue_dir: Path) -> None:
    batch = [request(0), {"tool": "x"}, request(2), "nope"]
    with pytest.raises(CtxError) as caught:
        publish_batch(queue, batch)  # type: ignore[arg-type]
    assert "request 2" in caught.value.message and "request 4" in caught.value.message
    assert entries(queue_dir, "pending") == [] and entries(queue_dir, "inbox") == []


def test_a_batch_given_line_numbers_names_a_bad_request_by_its_line(
    queue: Queue, queue_dir: Path
) -> None:
    """The command line passes where each request came from: a bad one is named by the line
    of the caller's input, as a line that is no JSON is, whatever blank lines came before."""
    batch = [request(0), {"tool": "x"}]
    with pytest.raises(CtxError) as caught:
        publish_batch(queue, batch, line_numbers=[1, 5])  # type: ignore[list-item]
    assert "line 5: " in caught.value.message and "request" not in caught.value.message[:40]
    assert entries(queue_dir, "pending") == [] and entries(queue_dir, "inbox") == []


def test_an_output_as_deep_as_a_document_may_be_is_finished_and_shown(queue: Queue) -> None:
    """A result wraps its output: an output of MAX_DEPTH levels (as deep as a tool's output
    is read) makes a result one level deeper, which show and a finish completed again read;
    an output deeper still is refused, the job left claimed."""
    from cortexfs.jsontext import MAX_DEPTH
    from cortexfs.queue.inspect import show

    deep: object = []
    for _ in range(MAX_DEPTH - 1):
        deep = [deep]
    publish(queue, request(1))
    won = claim(queue, Holder.for_process())
    assert won is not None
    with pytest.raises(CtxError) as caught:
        finish(queue, won.job, True, [deep])
    assert caught.value.errno == errno.EINVAL and "nested deeper" in caught.value.message
    finish(queue, won.job, True, deep)
    shown = show(queue, won.job)
    assert shown["state"] == "done" and shown["result"]["output"] == deep, shown["result"]


def test_a_request_with_a_byte_order_mark_is_refused_saying_so() -> None:
    """Stored as given, such a request would be no JSON to a reader that does not skip the
    mark: refused, in words that say what to change (not the JSON reader's)."""
    from cortexfs.queue.requests import parse_request_bytes

    with pytest.raises(CtxError) as caught:
        parse_request_bytes(b'\xef\xbb\xbf{"tool": "fs.read", "input": {}}', 1 << 20)
    assert caught.value.errno == errno.EINVAL
    assert caught.value.message.startswith("request starts with a byte order mark (U+FEFF)")


def test_batch_issues_one_barrier_for_all_data(queue_dir: Path) -> None:
    from tests.queue.helpers import CountingOps

    ops = CountingOps()
    with Queue.open(queue_dir, ops) as q:
        publish_batch(q, [request(n) for n in range(40)])
    assert ops.counts["syncfs"] == 1
    assert ops.counts["fsync"] <= 2  # pending/ and inbox/, once each for the whole batch


@pytest.mark.parametrize("refusal", [errno.ENOSYS, errno.EPERM])
def test_a_batch_whose_syncfs_is_refused_syncs_each_file_instead(
    queue_dir: Path, refusal: int
) -> None:
    """A seccomp filter may refuse syncfs(2): the group commit then syncs each file written,
    before any is moved into pending/ (Q-7), rather than publish nothing."""
    from tests.queue.helpers import CountingOps

    class WithoutSyncfs(CountingOps):
        def __init__(self) -> None:
            super().__init__(move_strategy="rename")
            self.moved_after_syncs: list[int] = []  # how many fsyncs came before each move

        def syncfs(self, fd: int) -> None:
            raise OSError(refusal, os.strerror(refusal))

        def rename_noreplace(self, src: str, src_dir_fd: int, dst: str, dst_dir_fd: int) -> None:
            self.moved_after_syncs.append(self.counts["fsync"])
            super().rename_noreplace(src, src_dir_fd, dst, dst_dir_fd)

    ops = WithoutSyncfs()
    with Queue.open(queue_dir, ops) as q:
        jobs = publish_batch(q, [request(n) for n in range(5)])
    assert entries(queue_dir, "pending") == sorted(jobs)
    assert ops.moved_after_syncs and min(ops.moved_after_syncs) >= 5  # each file's data first


def test_claim_moves_the_job_and_writes_the_lease(
    queue: Queue, me: Holder, queue_dir: Path
) -> None:
    job = publish(queue, request(7), name="c1")
    won = claim(queue, me, ttl=30)
    assert won is not None and won.job == job and won.request["input"] == {"n": 7}
    assert entries(queue_dir, "pending") == []
    assert entries(queue_dir / "claimed", job) == [job]
    lease = json.loads((queue_dir / "lease" / job / "worker").read_text())
    here = LocalSystem.current()
    assert lease["pid"] == os.getpid() and lease["boot_id"] == here.boot_id
    assert lease["pid_ns"] == here.pid_ns and lease["host"] == here.host
    assert lease["create_time"] == pytest.approx(me.start_time)
    decoded = Lease.decode((queue_dir / "lease" / job / "worker").read_bytes())
    assert 29 < decoded.expires_at - decoded.claimed_at < 31
    assert entries(queue_dir, "inbox") == []


def test_claim_returns_none_on_an_empty_queue(queue: Queue, me: Holder) -> None:
    assert claim(queue, me) is None


def test_claim_takes_the_oldest_first(queue: Queue, me: Holder, queue_dir: Path) -> None:
    for n, name in enumerate(["c", "a", "b"]):
        publish(queue, request(n), name=name)
        stamp = 1_700_000_000 + n
        os.utime(queue_dir / "pending" / f"{name}.req.json", (stamp, stamp))
    order = [claim(queue, me).job for _ in range(3)]  # type: ignore[union-attr]
    assert order == ["c.req.json", "a.req.json", "b.req.json"]


def test_losing_the_mkdir_race_is_not_an_error(queue: Queue, me: Holder, queue_dir: Path) -> None:
    job = publish(queue, request(), name="raced")
    os.mkdir(queue_dir / "claimed" / job)  # another worker won the mkdir
    assert claim_job(queue, job, me) is None
    assert entries(queue_dir, "pending") == [job]


def test_claim_skips_a_job_with_stale_lease_evidence(
    queue: Queue, me: Holder, queue_dir: Path
) -> None:
    job = publish(queue, request(), name="stale")
    os.mkdir(queue_dir / "lease" / job)
    assert claim(queue, me) is None
    assert entries(queue_dir, "pending") == [job] and entries(queue_dir, "claimed") == []


def test_renew_extends_only_the_holders_lease(queue: Queue, me: Holder, queue_dir: Path) -> None:
    publish(queue, request(), name="r")
    won = claim(queue, me, ttl=5)
    assert won is not None
    renewed = renew(queue, won.job, [me], ttl=500)
    assert renewed.expires_at > won.lease.expires_at + 400
    stored = Lease.decode((queue_dir / "lease" / won.job / "worker").read_bytes())
    assert stored.expires_at == pytest.approx(renewed.expires_at, abs=1e-3)
    stranger = dataclasses.replace(me, pid=1)
    with pytest.raises(CtxError) as caught:
        renew(queue, won.job, [stranger])
    assert caught.value.errno == errno.EACCES
    with pytest.raises(CtxError) as caught:
        renew(queue, "nothing", [me])
    assert caught.value.errno == errno.ENOENT


@pytest.mark.parametrize(
    ("apart", "told"),
    [
        ({"pid_ns": 4026599999}, " of pid namespace 4026599999 (the holder's is "),
        (
            {"boot_id": "0b7d4b4e-2f3a-4d6c-8e1f-5a9c7b3d2e10"},
            " of another boot (the holder's was ",
        ),
        ({"start_time": 1.0}, ", another process of that number (started at 1970-01-01T"),
    ],
)
def test_a_renewal_by_the_holder_s_pid_number_in_another_process_says_what_sets_it_apart(
    queue: Queue, me: Holder, apart: dict, told: str
) -> None:
    """Q-5: a pid alone never proves the same process; refused, the caller who has the
    holder's pid number hears why it is not the holder (not 'pid N, not to pid N')."""
    publish(queue, request(), name="apart")
    won = claim(queue, me, ttl=60)
    assert won is not None

    with pytest.raises(CtxError) as refused:
        renew(queue, won.job, [dataclasses.replace(me, **apart)])

    assert refused.value.errno == errno.EACCES
    assert f"not to pid {me.pid}{told}" in refused.value.message


def test_renew_without_a_lifetime_renews_for_the_lease_s_own_period(
    queue: Queue, me: Holder, queue_dir: Path
) -> None:
    publish(queue, request(), name="long")
    won = claim(queue, me, ttl=1000)
    assert won is not None and queue.config.lease_ttl < 1000

    renewed = renew(queue, won.job, [me])
    again = renew(queue, won.job, [me])

    assert renewed.expires_at >= won.lease.expires_at
    assert renewed.period == pytest.approx(1000, abs=1e-3)
    assert again.period == pytest.approx(1000, abs=1e-3)


def test_renew_of_a_hand_written_lease_with_no_usable_period_takes_lease_ttl(
    queue: Queue, me: Holder, queue_dir: Path
) -> None:
    publish(queue, request(), name="odd")
    won = claim(queue, me)
    assert won is not None
    path = queue_dir / "lease" / won.job / "worker"
    backwards = {**json.loads(path.read_text()), "expires_at": "2001-01-01T00:00:00Z"}
    path.write_text(json.dumps(backwards))

    renewed = renew(queue, won.job, [me])

    assert renewed.period == pytest.approx(queue.config.lease_ttl, abs=1e-3)


@pytest.mark.parametrize("ok", [True, False])
def test_finish_writes_the_terminal_pair_and_cleans_up(
    queue: Queue, me: Holder, queue_dir: Path, ok: bool
) -> None:
    publish(queue, request(), name="f")
    won = claim(queue, me)
    assert won is not None
    result = finish(queue, won.job, ok, {"answer": 42}, worker={"id": "w"})
    state = "done" if ok else "failed"
    assert entries(queue_dir, state) == [won.job, won.job + ".result"]
    stored = json.loads((queue_dir / state / (won.job + ".result")).read_text())
    assert stored == result
    assert stored["status"] == ("ok" if ok else "error") and stored["output"] == {"answer": 42}
    assert stored["started"] and stored["finished"] and stored["worker"] == {"id": "w"}
    for leftover in ("claimed", "lease", "pending", "inbox"):
        assert entries(queue_dir, leftover) == []


def test_finish_refuses_what_is_not_claimed(queue: Queue, me: Holder) -> None:
    job = publish(queue, request(), name="nf")
    with pytest.raises(CtxError) as caught:
        finish(queue, job, True)
    assert caught.value.errno == errno.ENOENT and "pending" in caught.value.message
    claim(queue, me)
    finish(queue, job, True)
    with pytest.raises(CtxError) as caught:
        finish(queue, job, False)
    assert caught.value.errno == errno.EEXIST and "done" in caught.value.message


def test_finish_and_renew_of_a_job_left_as_its_lease_alone_name_that_lease(
    queue: Queue, me: Holder, queue_dir: Path
) -> None:
    """Q-6: a job whose request left claimed/ and whose lease stayed (an incomplete job) is
    not "no such job": finish and renew name the lease left and what settles it."""
    publish(queue, request(), name="orphan")
    won = claim(queue, me)
    assert won is not None
    os.unlink(queue_dir / "claimed" / won.job / won.job)
    os.rmdir(queue_dir / "claimed" / won.job)
    acts = [
        (lambda: finish(queue, won.job, True), "job"),
        (lambda: renew(queue, won.job, [me]), "there is no claim to renew: job"),
    ]
    for act, opening in acts:
        with pytest.raises(CtxError) as caught:
            act()
        assert caught.value.errno == errno.ENOENT
        assert caught.value.message.startswith(
            f"{opening} {won.job} is not claimed: only its lease, lease/{won.job}, is left"
        ), caught.value.message
        assert "recover --reconcile" in caught.value.message
    assert entries(queue_dir, "lease") == [won.job]


def test_publish_of_a_finished_job_with_a_leftover_claim_says_it_is_done(
    queue: Queue, me: Holder, queue_dir: Path
) -> None:
    """Q-1: a finish cut short in its clean-up leaves claimed/J and lease/J beside J's result:
    J ran, and a publish under its name says so (as status and show do), not "claimed"."""
    publish(queue, request(), name="ran")
    won = claim(queue, me)
    assert won is not None
    os.rename(queue_dir / "claimed" / won.job / won.job, queue_dir / "done" / won.job)
    (queue_dir / "done" / (won.job + ".result")).write_text('{"status": "ok", "output": null}')
    with pytest.raises(CtxError) as caught:
        publish(queue, request(), name="ran")
    assert caught.value.errno == errno.EEXIST
    assert f"job {won.job} is already done, with a leftover claimed/" in caught.value.message


def test_finish_never_overwrites_an_existing_result(
    queue: Queue, me: Holder, queue_dir: Path
) -> None:
    publish(queue, request(), name="twice")
    won = claim(queue, me)
    assert won is not None
    (queue_dir / "done" / (won.job + ".result")).write_text('{"status": "ok", "output": "first"}')
    with pytest.raises(CtxError) as caught:
        finish(queue, won.job, True, "second")
    assert caught.value.errno == errno.EEXIST
    assert "first" in (queue_dir / "done" / (won.job + ".result")).read_text()
    assert entries(queue_dir / "claimed", won.job) == [won.job]
    assert entries(queue_dir, "inbox") == []


def test_a_full_lifecycle_leaves_only_the_terminal_pair(
    queue: Queue, me: Holder, queue_dir: Path
) -> None:
    jobs = publish_batch(queue, [request(n) for n in range(10)])
    finished = []
    while (won := claim(queue, me)) is not None:
        finish(queue, won.job, won.request["input"]["n"] % 3 != 0)
        finished.append(won.job)
    assert sorted(finished) == sorted(jobs)
    assert len(entries(queue_dir, "done")) + len(entries(queue_dir, "failed")) == 20
    assert all(entries(queue_dir, s) == [] for s in ("inbox", "pending", "lease", "claimed"))


def test_link_strategy_gives_the_same_results(queue_dir: Path, me: Holder) -> None:
    (queue_dir / "config").write_text("move=link\n")
    with Queue.open(queue_dir) as q:
        assert q.ops.move_strategy == "link"
        publish_batch(q, [request(n) for n in range(3)])
        while (won := claim(q, me)) is not None:
            finish(q, won.job, True)
    assert len(entries(queue_dir, "done")) == 6
    assert all(entries(queue_dir, s) == [] for s in ("inbox", "pending", "lease", "claimed"))


def test_lease_expiry_follows_the_configured_ttl(queue_dir: Path, me: Holder) -> None:
    (queue_dir / "config").write_text("lease_ttl=7\n")
    with Queue.open(queue_dir) as q:
        publish(q, request())
        won = claim(q, me)
    assert won is not None
    assert won.lease.expires_at - won.lease.claimed_at == pytest.approx(7)
    assert won.lease.claimed_at == pytest.approx(time.time(), abs=5)


@pytest.mark.parametrize(
    "config",
    [
        "max_request_bytes=0",
        "lease_ttl=soon",
        "lease_ttl=-5",
        "lease_ttl=0",
        "colour=blue",
        "grace=-1",
        "grace=1e300",  # beyond what recover's --grace takes (366 days)
        "lease_ttl=1_000",  # Python reads it; a person does not write seconds so
        "grace=infinity",
        "move=copy",
        "novalue",
    ],
)
def test_a_malformed_config_is_refused_with_its_line(queue_dir: Path, config: str) -> None:
    (queue_dir / "config").write_text(f"# comment\n\n{config}\n")
    with pytest.raises(CtxError) as caught:
        Queue.open(queue_dir)
    assert caught.value.errno == errno.EINVAL and "config:3" in caught.value.message
    assert caught.value.message.count("config:") == 1  # the place is said once


def test_a_key_appended_to_the_config_overrides_the_one_before(queue_dir: Path) -> None:
    """init writes every key; a line appended to change one counts, as in a shell's."""
    config = queue_dir / "config"
    config.write_text(config.read_text() + "lease_ttl=600\n")
    with Queue.open(queue_dir) as q:
        assert q.config.lease_ttl == 600


class _Preempted(FsOps):
    """Real operations that run ``meanwhile`` once when the protocol reaches ``at``."""

    def __init__(self, at: str, meanwhile: Callable[[], object]) -> None:
        super().__init__()
        self.at, self.meanwhile = at, meanwhile

    def step(self, name: str) -> None:
        if name == self.at:
            self.at = ""
            self.meanwhile()


def test_a_publisher_overtaken_by_a_whole_publish_and_claim_of_its_name_is_refused(
    queue: Queue, queue_dir: Path, me: Holder
) -> None:
    """A's early check passes; before A holds the name, B publishes the same name and a worker
    claims it, so pending/ is empty again when A moves.  A must be refused, not acknowledged
    beside B (Q-1): it looks again once it holds inbox/J.publish.tmp."""

    def b_publishes_and_a_worker_claims() -> None:
        assert publish(queue, request(2), name="same") == "same.req.json"
        assert claim(queue, me) is not None

    overtaken = _Preempted("publish.write", b_publishes_and_a_worker_claims)
    with Queue.open(queue_dir, overtaken) as a, pytest.raises(CtxError) as refused:
        publish(a, request(1), name="same")

    assert refused.value.errno == errno.EEXIST and "claimed" in refused.value.message
    assert entries(queue_dir, "pending") == [] and entries(queue_dir, "inbox") == []
    assert entries(queue_dir, "claimed") == ["same.req.json"]


def test_a_publish_in_progress_holds_its_name(queue: Queue, queue_dir: Path) -> None:
    def b_publishes_the_same_name() -> None:
        with pytest.raises(CtxError) as refused:
            publish(queue, request(2), name="same")
        assert refused.value.errno == errno.EEXIST
        assert "being published by another process" in refused.value.message
        with pytest.raises(CtxError):
            publish_batch(queue, [request(3), request(4)], names=["other", "same"])

    with Queue.open(queue_dir, _Preempted("publish.move", b_publishes_the_same_name)) as a:
        assert publish(a, request(1), name="same") == "same.req.json"

    assert entries(queue_dir, "pending") == ["same.req.json"]
    assert entries(queue_dir, "inbox") == []  # the refused batch left nothing behind
    assert json.loads((queue_dir / "pending/same.req.json").read_text())["input"] == {"n": 1}


def test_a_job_both_pending_and_finished_is_never_claimed(
    queue: Queue, queue_dir: Path, me: Holder
) -> None:
    publish(queue, request(1), name="twice")
    finish(queue, claim(queue, me).job, True, {"ran": 1})
    (queue_dir / "pending/twice.req.json").write_bytes(
        (queue_dir / "done/twice.req.json").read_bytes()
    )

    assert claim(queue, me) is None  # a conflict: reported by status, never run again
    assert entries(queue_dir, "pending") == ["twice.req.json"]
    assert entries(queue_dir, "claimed") == []


def test_an_interrupted_finish_is_not_finished_again_the_other_way(
    queue: Queue, queue_dir: Path, me: Holder
) -> None:
    publish(queue, request(1), name="half")
    claim(queue, me)
    (queue_dir / "done/half.req.json.result").write_text('{"status": "ok", "output": 1}')

    with pytest.raises(CtxError) as refused:
        finish(queue, "half", False, "too late")

    assert refused.value.errno == errno.EEXIST and "done/half.req.json.result" in str(refused.value)
    assert entries(queue_dir, "failed") == []
    assert entries(queue_dir, "claimed") == ["half.req.json"]  # for recover --reconcile
    said = str(refused.value)
    assert "an earlier finish of half.req.json was interrupted" in said
    # Its holder (this process) lives: recover leaves the job alone until then, and says so.
    assert (
        f"'ctx queue recover --reconcile' completes it once its lease holder (pid {me.pid} on "
        f"{me.host}) has exited or its lease has expired (at "
    ) in said
    assert "finishing it again" not in said  # a result no finish of this claim recorded


def test_a_finish_meeting_a_result_that_is_no_file_calls_it_a_conflict(
    queue: Queue, queue_dir: Path, me: Holder
) -> None:
    """recover --reconcile never completes a finish whose result is a FIFO (Q-8): the
    refusal says what is there and that a person must repair it, not to reconcile."""
    publish(queue, request(1), name="odd")
    claim(queue, me)
    os.mkfifo(queue_dir / "done/odd.req.json.result")

    with pytest.raises(CtxError) as refused:
        finish(queue, "odd", True, "out")

    message = refused.value.message
    assert refused.value.errno == errno.EEXIST
    assert message.startswith("done/odd.req.json.result already exists and is a FIFO")
    assert "is a conflict" in message and "a person must" in message
    assert "--reconcile" not in message
    assert [f.job for f in recover(queue, reconcile=True).conflicts] == ["odd.req.json"]
    assert entries(queue_dir, "claimed") == ["odd.req.json"]


def test_renewing_a_pending_job_says_why_it_may_be_pending(queue: Queue, me: Holder) -> None:
    """A holder whose lease lapsed and whose job recover requeued is told so may be why, not
    only to claim it (which, while its first run goes on, would run it twice)."""
    job = publish(queue, request(), name="waiting")
    with pytest.raises(CtxError) as refused:
        renew(queue, job, [me])
    assert refused.value.errno == errno.ENOENT
    assert refused.value.message == (
        "there is no lease to renew: job waiting.req.json is pending, not claimed: it was never "
        "claimed, or 'ctx queue recover' returned it to pending once its lease had expired or "
        "its holder was gone, to run again; claim it before renewing its lease, never beside "
        "a run of it still going on"
    )


def test_a_holder_whose_lease_was_taken_away_cannot_finish(queue: Queue, me: Holder) -> None:
    """Q-5: an expired lease is proof the holder is gone; the job is requeued and claimed
    again.  The first holder, still running, must not finish the second holder's claim."""
    job = publish(queue, request(), name="stolen")
    first = claim(queue, me, ttl=0.1)
    assert first is not None
    time.sleep(0.2)
    assert [f.job for f in recover(queue).requeued] == [job]
    with pytest.raises(CtxError) as late_renewal:
        renew(queue, job, [me], ttl=300)
    assert late_renewal.value.errno == errno.ENOENT and "pending" in late_renewal.value.message
    second_holder = dataclasses.replace(me, pid=dead_pid(), worker="second")
    second = claim(queue, second_holder, ttl=300)
    assert second is not None and second.job == job
    before = sorted(str(p.relative_to(queue.path)) for p in queue.path.rglob("*"))

    with pytest.raises(CtxError) as refused:
        finish(queue, job, True, "first", holder=me)

    assert refused.value.errno == errno.EACCES and "second" in refused.value.message
    assert sorted(str(p.relative_to(queue.path)) for p in queue.path.rglob("*")) == before
    finish(queue, job, True, "second", holder=second_holder)
    with pytest.raises(CtxError) as again:
        finish(queue, job, True, "first", holder=me)
    assert again.value.errno == errno.EEXIST
    result = json.loads((queue.path / "done" / f"{job}.result").read_text())
    assert result["output"] == "second"


@pytest.mark.parametrize("worker", ["a" * 256, "", "tab\there"])
def test_a_claim_for_a_worker_id_no_lease_may_record_is_refused_before_anything_moves(
    queue: Queue, queue_dir: Path, me: Holder, worker: str
) -> None:
    job = publish(queue, request(), name="kept")
    holder = dataclasses.replace(me, worker=worker)
    for attempt in (lambda: claim(queue, holder), lambda: claim_job(queue, job, holder)):
        with pytest.raises(CtxError) as caught:
            attempt()
        assert caught.value.errno == errno.EINVAL and "worker id" in caught.value.message
    assert os.listdir(queue_dir / "pending") == [job]
    assert os.listdir(queue_dir / "claimed") == os.listdir(queue_dir / "lease") == []
    with pytest.raises(CtxError):
        Holder.for_process(worker=worker or " ")


def test_a_claim_stalled_past_its_lease_lifetime_returns_a_renewed_lease(
    queue_dir: Path, me: Holder
) -> None:
    """A claim stopped between its move and its lease for longer than the lease lives (here
    at ``lease.move``, for twice the ttl) returns a lease renewed under J's lock, never one
    already expired: recover right after it finds the holder alive and leaves J claimed."""
    ttl = 0.2
    stalled = _Preempted("lease.move", lambda: time.sleep(2 * ttl))
    with Queue.open(queue_dir) as q:
        job = publish(q, request(), name="slow")
    with Queue.open(queue_dir, stalled) as q:
        won = claim(q, me, ttl=ttl)
    assert won is not None and won.job == job
    assert won.lease.expires_at > time.time() and won.lease.renewed_at is not None
    with Queue.open(queue_dir) as q:
        assert recover(q).requeued == []
        on_disk = json.loads((queue_dir / "lease" / job / "worker").read_bytes())
    assert on_disk["expires_at"] == won.lease.to_json()["expires_at"]


def test_a_finish_that_waited_while_its_job_was_requeued_and_claimed_again_says_so(
    queue_dir: Path, me: Holder
) -> None:
    """A finish that opened ``claimed/J`` and then waited (stopped before its lock) while J
    was requeued and claimed anew holds a directory recover removed: refused with EACCES
    saying J was claimed again, the new claim untouched."""
    gone = dataclasses.replace(me, pid=dead_pid())
    with Queue.open(queue_dir) as q:
        job = publish(q, request(), name="late")
        assert claim(q, gone) is not None

    def requeued_and_claimed_again() -> None:
        with Queue.open(queue_dir) as q:
            assert [f.job for f in recover(q).requeued] == [job]
            assert claim(q, me) is not None

    class WaitsBeforeItsLock(FsOps):
        waited = False

        def open_dir(self, name: str, dir_fd: int | None = None) -> int:
            fd = super().open_dir(name, dir_fd)
            if name == job and not self.waited:  # claimed/J, opened first
                self.waited = True
                requeued_and_claimed_again()
            return fd

    with Queue.open(queue_dir, WaitsBeforeItsLock()) as q, pytest.raises(CtxError) as refused:
        finish(q, job, True)
    assert refused.value.errno == errno.EACCES, refused.value
    assert "was claimed again, by another claim" in refused.value.message
    assert entries(queue_dir, "claimed") == [job] and entries(queue_dir, "done") == []


def test_a_name_held_only_by_an_empty_claim_directory_is_refused_saying_what_removes_it(
    queue: Queue, queue_dir: Path
) -> None:
    """Q-1 refuses a name with evidence anywhere: an empty ``claimed/J`` (a claim cut short
    before its move) is refused as what it is, with what removes it, not "already claimed"."""
    (queue_dir / "claimed" / "left.req.json").mkdir()
    with pytest.raises(CtxError) as refused:
        publish(queue, request(), name="left")
    assert refused.value.errno == errno.EEXIST
    assert "empty claimed/left.req.json" in refused.value.message
    assert "recover --reconcile" in refused.value.message
    assert entries(queue_dir, "pending") == [] and entries(queue_dir, "inbox") == []


def test_a_name_whose_only_entries_are_no_queue_files_is_said_to_be_no_job(
    queue: Queue, me: Holder, queue_dir: Path
) -> None:
    """Q-8: status lists such a name as ignored; publish, finish and renew say the same of
    it (what stands there, of what kind), never a job pending, leased or in conflict."""
    (queue_dir / "pending" / "odd.req.json").mkdir()
    os.mkfifo(queue_dir / "lease" / "odd.req.json")
    said = "pending/odd.req.json (directory) and lease/odd.req.json (FIFO) are no queue file"
    with pytest.raises(CtxError) as published:
        publish(queue, request(), name="odd")
    assert published.value.errno == errno.EEXIST and said in published.value.message
    for act in (lambda: finish(queue, "odd.req.json", True), lambda: renew(queue, "odd", [me])):
        with pytest.raises(CtxError) as refused:
            act()
        assert refused.value.errno == errno.ENOENT, refused.value.message
        assert said in refused.value.message and "conflict" not in refused.value.message
