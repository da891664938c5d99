"""A request may carry any extra field (§2.1), one named "invalid" too: only a stored request
that could not be read as a valid one is claimed as not valid, noted by ``claim`` and failed
by the worker."""

from __future__ import annotations

import json
import os

from tests.queue.helpers import dead_pid
from tests.workers.conftest import AGENT, PROJECT, Farm

MARKED = {"tool": "shell.exec", "input": {"cmd": "echo ran"}, "invalid": "a publisher's own field"}


def plant_junk(farm: Farm) -> str:
    """A request put in pending/ by hand, past publish's checks, older than any published."""
    planted = farm.queue / "pending" / "junk.req.json"
    planted.write_text("{not json")
    os.utime(planted, (1, 1))
    return planted.name


def test_a_valid_request_with_an_invalid_field_runs_and_a_planted_one_fails(farm: Farm) -> None:
    junk = plant_junk(farm)
    published = farm.ctx("queue", "publish", "--project", PROJECT, "-", stdin=json.dumps(MARKED))
    assert published.returncode == 0, published.stderr
    job = published.stdout.strip()

    done = farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain")

    assert done.returncode == 0, done.stderr
    state, result = farm.result(job)
    assert state == "done" and result["status"] == "ok", result
    assert "ran" in json.dumps(result["output"])
    state, result = farm.result(junk)
    assert state == "failed" and "EINVAL" in result["reason"]
    assert "EINVAL: stored request is not JSON" in result["reason"]


def test_claim_gives_a_valid_request_as_stored_and_notes_only_a_planted_one(farm: Farm) -> None:
    published = farm.ctx("queue", "publish", "--project", PROJECT, "-", stdin=json.dumps(MARKED))
    assert published.returncode == 0, published.stderr
    pid = str(dead_pid())

    claimed = farm.ctx("queue", "claim", "--project", PROJECT, "--json", "--pid", pid)

    assert claimed.returncode == 0, claimed.stderr
    request = json.loads(claimed.stdout)["request"]
    assert {key: request[key] for key in MARKED} == MARKED
    assert "not valid" not in claimed.stderr, claimed.stderr

    junk = plant_junk(farm)
    claimed = farm.ctx("queue", "claim", "--project", PROJECT, "--json", "--pid", pid)

    assert claimed.returncode == 0, claimed.stderr
    shown = json.loads(claimed.stdout)
    assert shown["name"] == junk
    assert shown["request"]["tool"] is None and shown["request"]["input"] == {}
    assert "not JSON" in shown["request"]["invalid"]
    assert claimed.stderr.startswith(f"ctx: note: the request of {junk} is not valid (")


def test_a_shell_worker_fails_a_planted_request_as_malformed(farm: Farm) -> None:
    """It names no tool: the reason is that it is not valid, not that its tool is None."""
    junk = plant_junk(farm)
    work = ("queue", "work", "--project", PROJECT, "--agent", AGENT, "--kind", "shell")

    done = farm.ctx(*work, "--drain")

    assert done.returncode == 0, done.stderr
    state, result = farm.result(junk)
    assert state == "failed" and "stored request is not JSON" in result["reason"]


def test_the_reason_names_the_stored_request_once(farm: Farm) -> None:
    """One that misses a field, and one over the queue's size limit: each reason says what is
    wrong with the stored request, and says "stored request" once."""
    config = farm.queue / "config"
    config.write_text(config.read_text() + "max_request_bytes=1024\n")
    no_input = farm.queue / "pending" / "no-input.req.json"
    no_input.write_text(json.dumps({"tool": "shell.exec"}))
    too_big = farm.queue / "pending" / "too-big.req.json"
    too_big.write_text(json.dumps({"tool": "shell.exec", "input": {"cmd": "x" * 2_000_000}}))

    done = farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain")

    assert done.returncode == 0, done.stderr
    reasons = {job: farm.result(job) for job in (no_input.name, too_big.name)}
    assert all(state == "failed" for state, _ in reasons.values()), reasons
    missing = reasons[no_input.name][1]["reason"]
    assert missing.startswith("EINVAL: stored request is malformed: field 'input' must be")
    over = reasons[too_big.name][1]["reason"]
    assert over.startswith("EINVAL: stored request is over the size limit: ")
    assert f"{too_big.name} is " in over and "(max_request_bytes=1024 of the queue's config" in over
    assert all(r["reason"].count("stored request") == 1 for _, r in reasons.values()), reasons
