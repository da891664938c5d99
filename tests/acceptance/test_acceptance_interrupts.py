"""Ctrl-C (SIGINT) in the middle of a queue command: the transition it was making completes
or never starts, the command says EINTR in the form of every error and exits 130, and no
Python traceback reaches the user.

The black-box test sends SIGINT to a ``ctx`` blocked on its input.  To land SIGINT on one
exact step of a transition, the others run the real ``ctx`` entry point in a subprocess
whose protocol steps (the crash points of ``durable.FsOps.step``) send the process SIGINT
when the named step is reached: the signal is real, only its timing is chosen.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, REPO, QueueCLI, clean_env

INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command Ctrl-C stopped


def _as_in_a_terminal() -> None:
    """SIGINT's default disposition, which a shell gives the command it runs in the
    foreground (a test runner started in the background may have it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# Runs ``ctx ARGS...`` (argv[2:]) with SIGINT sent to itself when protocol step argv[1] runs.
_CTX_INTERRUPTED_AT_STEP = """
import os, signal, sys
from cortexfs import durable
from cortexfs.cli import main

STEP = sys.argv[1]

class InterruptAt(durable.FsOps):
    def step(self, name):
        if name == STEP:
            os.kill(os.getpid(), signal.SIGINT)

    def create_file(self, name, dir_fd, mode=0o666):
        fd = super().create_file(name, dir_fd, mode)
        if STEP == "file.created":  # the instant after the kernel made it
            os.kill(os.getpid(), signal.SIGINT)
        return fd

durable._DEFAULT_OPS = InterruptAt()
sys.argv = ["ctx", *sys.argv[2:]]
main()
"""


def _ctx_interrupted_at(step: str, queue: QueueCLI, *args: str, input: bytes = b""):
    return subprocess.run(
        [str(REPO / ".venv" / "bin" / "python"), "-c", _CTX_INTERRUPTED_AT_STEP, step, *args],
        input=input,
        capture_output=True,
        env=clean_env(CTX_STORAGE=str(queue.storage)),
        timeout=60,
        preexec_fn=_as_in_a_terminal,
    )


def _assert_reported_as_interrupted(proc: subprocess.CompletedProcess) -> None:
    err = proc.stderr.decode()
    assert proc.returncode == INTERRUPTED, (proc.returncode, err)
    assert err.lstrip("\n").startswith("ctx: EINTR: interrupted"), err  # after ^C's line
    assert "Traceback" not in err and "Aborted!" not in err, err


def _assert_consistent(queue: QueueCLI) -> None:
    status = queue.run("status", "--json")
    assert status.rc == 0, status
    report = status.json()
    assert report["incomplete"] == [] and report["conflicts"] == [], report
    assert queue.entries("inbox") == set()


@pytest.mark.parametrize(
    "step", ["claim.mkdir", "claim.move", "lease.write", "lease.mkdir", "lease.move"]
)
def test_ctrl_c_during_a_claim_completes_it_and_names_the_job(queue, child, step):
    """Stopped between its move and its lease, a claim would leave the job claimed without a
    lease: taken by nobody until someone runs 'recover --reconcile'."""
    job = queue.publish()

    proc = _ctx_interrupted_at(
        step, queue, "queue", "claim", "--project", "proj", "--pid", str(child.pid)
    )

    _assert_reported_as_interrupted(proc)
    assert proc.stdout.decode() == job + "\n"  # what it printed is done
    assert queue.state(job) == "claimed" and queue.lease(job)["pid"] == child.pid
    _assert_consistent(queue)


@pytest.mark.parametrize("step", ["publish.write", "publish.move"])
def test_ctrl_c_during_a_publish_completes_it_and_names_the_job(queue, step):
    proc = _ctx_interrupted_at(
        step, queue, "queue", "publish", "--project", "proj", "--name", "j1", "-",
        input=b'{"tool": "fs.stat", "input": {}}',
    )  # fmt: skip

    _assert_reported_as_interrupted(proc)
    assert proc.stdout.decode() == "j1.req.json\n"
    assert queue.state("j1.req.json") == "pending"
    _assert_consistent(queue)


def _batch_of_three_interrupted_at(step: str, queue: QueueCLI) -> subprocess.CompletedProcess:
    batch = b"".join(b'{"tool": "fs.stat", "input": {"n": %d}}\n' % n for n in range(3))
    return _ctx_interrupted_at(
        step, queue, "queue", "publish", "--project", "proj", "--batch", "-", input=batch
    )


@pytest.mark.parametrize("step", ["publish_batch.write", "file.created"])
def test_ctrl_c_during_a_batch_being_written_publishes_nothing(queue, step):
    """Nothing, not even an empty staging file: creating one can take a millisecond, and a
    Ctrl-C landing just after it must still find it listed for removal."""
    proc = _batch_of_three_interrupted_at(step, queue)

    _assert_reported_as_interrupted(proc)
    assert proc.stdout == b""
    assert queue.entries("pending") == set()
    _assert_consistent(queue)


def test_ctrl_c_once_a_batch_moves_completes_it_and_names_every_job(queue):
    """Stopped among its moves, a batch would publish a prefix whose names nobody saw."""
    proc = _batch_of_three_interrupted_at("publish_batch.move", queue)

    _assert_reported_as_interrupted(proc)
    names = proc.stdout.decode().split()
    assert len(names) == 3 and set(names) == queue.entries("pending"), proc.stdout
    _assert_consistent(queue)


@pytest.mark.parametrize("step", ["finish.write", "finish.result", "finish.request"])
def test_ctrl_c_during_a_finish_completes_it(queue, child, step):
    """Stopped after its result is in place, a finish would leave a result beside a claimed
    request: done to 'ctx queue status' only after 'recover --reconcile'."""
    job = queue.publish()
    queue.claim("--pid", str(child.pid))

    proc = _ctx_interrupted_at(
        step, queue, "queue", "finish", "--project", "proj", job, "--ok", "-",
        input=b'{"answer": 42}',
    )  # fmt: skip

    _assert_reported_as_interrupted(proc)
    assert proc.stdout.decode() == job + "\n"
    assert queue.state(job) == "done"
    _assert_consistent(queue)


@pytest.mark.parametrize("step", ["renew.write", "renew.replace"])
def test_ctrl_c_during_a_renewal_leaves_no_temp(queue, child, step):
    job = queue.publish()
    queue.claim("--pid", str(child.pid), "--ttl", "60")

    proc = _ctx_interrupted_at(
        step, queue, "queue", "renew", "--project", "proj", job, "--pid", str(child.pid),
        "--ttl", "600",
    )  # fmt: skip

    _assert_reported_as_interrupted(proc)
    assert queue.state(job) == "claimed" and "renewed_at" in queue.lease(job)
    _assert_consistent(queue)


def test_ctrl_c_during_a_requeue_completes_it(queue):
    job = queue.publish()
    queue.claim("--pid", "4194303")  # a pid that does not run: its holder is gone

    proc = _ctx_interrupted_at("recover.requeue", queue, "queue", "recover", "--project", "proj")

    _assert_reported_as_interrupted(proc)
    assert queue.state(job) == "pending"
    _assert_consistent(queue)


@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_while_reading_a_request_is_eintr_not_aborted(queue, as_json):
    """A user who meant to pipe a file in and pressed Ctrl-C at the waiting command."""
    json_flag = ["--json"] if as_json else []
    proc = subprocess.Popen(
        [*CTX_ARGV, "queue", "publish", "--project", "proj", *json_flag, "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(CTX_STORAGE=str(queue.storage)),
        preexec_fn=_as_in_a_terminal,
    )
    time.sleep(1.5)  # started, and waiting on stdin
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)

    completed = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    _assert_reported_as_interrupted(completed)
    if as_json:
        assert json.loads(out) == {
            "error": "EINTR",
            "errno": 4,
            "message": json.loads(out)["message"],
        }
    else:
        assert out == b""
    assert queue.entries("pending") == set() and queue.entries("inbox") == set()
    proc.stdin.close()
