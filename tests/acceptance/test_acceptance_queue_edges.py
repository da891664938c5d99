"""§1-§3 as a demanding user meets them: sources that never end, outputs that go away, queue
paths in unusual places, names at their limits.  Black box: only the installed ``ctx``."""

from __future__ import annotations

import json
import subprocess
import threading

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, QueueCLI, clean_env, ctx_run

MIB = 1 << 20


def _feed_endlessly(queue: QueueCLI, *args: str, cap: int = 64 * MIB) -> tuple[int, str, int]:
    """Run ``ctx queue ARGS`` with a standard input that holds zeros and no line end, for as
    long as ctx reads it (at most ``cap`` bytes); returns exit status, stderr, bytes taken."""
    proc = subprocess.Popen(
        [*CTX_ARGV, "queue", args[0], "--project", queue.project, *args[1:]],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=clean_env(CTX_STORAGE=str(queue.storage)),
    )
    written = 0

    def feed() -> None:
        nonlocal written
        block = b"0" * (64 * 1024)
        try:
            while written < cap:
                proc.stdin.write(block)
                written += len(block)
            proc.stdin.close()
        except (BrokenPipeError, ValueError):
            pass

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    err = proc.stderr.read()  # until ctx exits
    proc.wait(timeout=120)
    feeder.join(timeout=120)
    return proc.returncode, err.decode(), written


# --- §2.1 size limit: a source that does not end ------------------------------------------------


def test_publish_refuses_an_endless_stdin_once_past_the_limit(queue):
    """§2.1 "larger requests are refused with a clear error": without reading the rest."""
    rc, err, taken = _feed_endlessly(queue, "publish", "-")

    assert rc == 1 and err.startswith("ctx: EFBIG: request is more than 1048576 bytes"), err
    assert taken < 8 * MIB
    assert queue.entries("pending") == set() and queue.entries("inbox") == set()


def test_publish_batch_refuses_an_endless_line_once_past_the_limit(queue):
    rc, err, taken = _feed_endlessly(queue, "publish", "--batch", "-")

    assert rc == 1 and "EINVAL: batch refused, nothing published: line 1 is more than" in err
    assert taken < 8 * MIB
    assert queue.entries("pending") == set() and queue.entries("inbox") == set()


def test_finish_refuses_an_endless_result_once_past_max_result_bytes(queue):
    config = queue.dir / "config"
    config.write_text(config.read_text() + "max_result_bytes=4096\n")
    job = queue.publish()
    assert queue.claim() == job

    rc, err, taken = _feed_endlessly(queue, "finish", job, "--ok", "-")

    assert rc == 1 and "EFBIG: the result file is more than 4096 bytes" in err, err
    assert taken < 8 * MIB
    assert queue.state(job) == "claimed"  # nothing was finished


def test_a_batch_splits_lines_as_before_at_any_line_end(queue):
    """A JSONL batch with \\r\\n, \\r and blank lines: every request, numbered per line."""
    line = json.dumps({"tool": "fs.read", "input": {}})
    r = queue.run("publish", "--batch", "-", input=f"{line}\r\n\n{line}\r{line}")
    bad = queue.run("publish", "--batch", "-", input=f"{line}\r\n\nnope\r\n")

    assert r.rc == 0 and len(r.lines()) == 3, r
    assert bad.rc == 1 and "line 3 is not JSON" in bad.err and "line 1 is" not in bad.err, bad


# --- §3 the worker's output going away ------------------------------------------------------------


def test_a_worker_whose_output_reader_left_stops_quietly_and_leaves_nothing_claimed(queue):
    """``ctx queue work --drain --json | head -1``: the worker stops claiming, finishes what it
    runs and exits 141 (128 + SIGPIPE) without a traceback, as every command whose reader
    left (docs/queue.md)."""
    line = json.dumps({"tool": "fs.read", "input": {}})
    assert queue.run("publish", "--batch", "-", input="\n".join([line] * 50)).rc == 0
    proc = subprocess.Popen(
        [*CTX_ARGV, "queue", "work", "--project", queue.project, "--drain", "--json"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(CTX_STORAGE=str(queue.storage)),
    )
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    rc = proc.wait(timeout=120)

    assert json.loads(first)["event"] == "start"
    assert rc == 141 and "Traceback" not in err and "Exception" not in err, err
    assert queue.entries("claimed") == set() and queue.entries("lease") == set()
    assert queue.entries("pending"), "the worker went on claiming with nowhere to report"


# --- §1 R-2, §2.4 init of a queue path outside the storage root ----------------------------------


def test_init_of_a_queue_path_shaped_like_a_space_makes_only_the_queue(storage, tmp_path):
    """``--queue DIR`` makes a queue anywhere (docs/queue.md); a DIR that happens to read
    X/shared/N/queue must not turn X into a storage root (R-2) nor judge N as a space name."""
    env = clean_env(CTX_STORAGE=str(storage))
    elsewhere = tmp_path / "srv"
    made = [
        ctx_run("queue", "init", "--queue", elsewhere / "shared" / name / "queue", env=env)
        for name in ("build", "nightly.d")
    ]

    assert [r.rc for r in made] == [0, 0], made
    assert sorted(p.name for p in elsewhere.iterdir()) == ["shared"]
    for name in ("build", "nightly.d"):
        assert sorted(p.name for p in (elsewhere / "shared" / name).iterdir()) == ["queue"]
        assert {"inbox", "pending", "lease", "claimed", "done", "failed"} <= {
            p.name for p in (elsewhere / "shared" / name / "queue").iterdir()
        }


def test_init_of_the_storage_roots_own_queue_path_makes_the_whole_space(storage):
    """The same path inside the storage root is project N's queue: the space is made (X-1)."""
    r = ctx_run(
        "queue",
        "init",
        "--queue",
        storage / "shared" / "other" / "queue",
        env=clean_env(CTX_STORAGE=str(storage)),
    )

    assert r.rc == 0, r
    assert {"tool", "data", "queue", "agent"} <= {
        p.name for p in (storage / "shared" / "other").iterdir()
    }


# --- §2.4 show: temp files of a job whose name holds ".req.json." -------------------------------


def test_show_attributes_a_temp_file_to_the_job_whose_name_holds_req_json(queue):
    """``a.req.json.req.json`` is a legal job name (R-3, §2.1); the temp file its publisher
    left (a crash mid-publish) belongs to it, not to ``a.req.json``."""
    job = "a.req.json.req.json"
    (queue.dir / "inbox" / f"{job}.publish.tmp").write_text("{}")

    mine = queue.run("show", job, "--json")
    other = queue.run("show", "a", "--json")
    status = queue.run("status", "--json")

    assert mine.rc == 0, mine
    assert [t["path"] for t in mine.json()["temps"]] == [f"inbox/{job}.publish.tmp"]
    assert other.rc == 1 and "ENOENT" in other.err, other
    assert [t["job"] for t in status.json()["temps"]] == [job]


# --- §2.4 the --name suffix rule at its limits ----------------------------------------------------


def test_name_refusals_speak_of_the_name_given(queue):
    """``--name J`` may omit ``.req.json`` (§2.4): an empty J is refused as empty, and a J
    that only the added suffix makes too long (R-3: 64 bytes) says how long it may be."""
    body = json.dumps({"tool": "fs.read", "input": {}})
    empty = queue.run("publish", "--name", "", "-", input=body)
    long = queue.run("publish", "--name", "a" * 56, "-", input=body)
    fits = queue.run("publish", "--name", "a" * 55, "-", input=body)

    assert empty.rc == 2 and "EINVAL" in empty.err and "empty" in empty.err, empty
    assert "'.req.json' must start" not in empty.err
    assert long.rc == 2 and "56 bytes long" in long.err and "55 before the suffix" in long.err
    assert fits.rc == 0 and fits.out == "a" * 55 + ".req.json\n", fits


# --- §2.4 an acknowledgement that cannot be printed ----------------------------------------------


def _to_full_disk(queue: QueueCLI, *args: str, input: bytes = b"") -> subprocess.CompletedProcess:
    with open("/dev/full", "wb") as full:
        return subprocess.run(
            [*CTX_ARGV, "queue", args[0], "--project", queue.project, *args[1:]],
            input=input,
            stdout=full,
            stderr=subprocess.PIPE,
            env=clean_env(CTX_STORAGE=str(queue.storage)),
            timeout=60,
        )


@pytest.mark.parametrize("as_json", [[], ["--json"]])
def test_publish_whose_name_cannot_be_printed_says_the_job_is_published(queue, as_json):
    """Publish is acknowledged by printing J (§2.4); when that fails the job is pending all
    the same, and a bare 'No space left on device' would have the user publish it twice.
    With --json the error object cannot be printed either: the line on stderr says it all."""
    body = json.dumps({"tool": "fs.read", "input": {}}).encode()
    done = _to_full_disk(queue, "publish", *as_json, "--name", "once", "-", input=body)

    err = done.stderr.decode()
    assert done.returncode == 74 and err.startswith("ctx: ENOSPC: "), err
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert "once.req.json published and pending" in err
    assert queue.state("once.req.json") == "pending"


def test_claim_whose_name_cannot_be_printed_names_the_job_it_leased(queue):
    job = queue.publish()
    done = _to_full_disk(queue, "claim")

    err = done.stderr.decode()
    assert done.returncode == 74 and err.startswith("ctx: ENOSPC: "), err
    assert f"job {job} is claimed and leased to pid" in err
    assert queue.state(job) == "claimed"


# --- §1 a storage root reached through a symlink -----------------------------------------


def test_a_storage_root_that_is_a_symlink_is_bootstrapped_like_every_command_uses_it(tmp_path):
    """``…/storage/current`` as a link to a release directory: the queue commands already
    work through it, so ``ctx bootstrap`` and ``ctx queue init`` must too (R-1, R-5)."""
    release = tmp_path / "release-1"
    release.mkdir()
    current = tmp_path / "current"
    current.symlink_to(release.name)
    env = clean_env(CTX_STORAGE=str(current))

    boot = ctx_run("bootstrap", env=env)
    again = ctx_run("bootstrap", env=env)
    init = ctx_run("queue", "init", "--project", "proj", env=env)

    assert boot.rc == 0 and again.rc == 0, (boot, again)
    assert "nothing to do" in again.out
    assert init.rc == 0, init
    assert {"bin", "tool", "agent", "model", "home", "shared"} == {
        p.name for p in release.iterdir()
    }
    assert (release / "shared" / "proj" / "queue" / "pending").is_dir()
    assert current.is_symlink()


def test_a_request_that_gives_a_name_twice_is_refused_and_nothing_is_published(queue):
    """Stored as given, it would name one tool to a reader that takes the first of two names
    and another to one that takes the last."""
    twice = '{"tool": "fs.read", "input": {}, "tool": "shell.exec"}'
    nested = '{"tool": "fs.read", "input": {"path": "a", "path": "/etc/shadow"}}'
    for args, text in (
        (["--name", "twice", "-"], twice),
        (["-"], nested),
        (["--batch", "-"], json.dumps({"tool": "fs.read", "input": {}}) + "\n" + twice + "\n"),
    ):
        refused = queue.run("publish", *args, "--json", input=text)
        assert refused.rc == 1, refused
        assert refused.json()["error"] == "EINVAL"
        assert refused.err.startswith("ctx: EINVAL: "), refused
        assert "twice in one object" in refused.err, refused
        assert queue.entries("pending") == queue.entries("inbox") == set()
