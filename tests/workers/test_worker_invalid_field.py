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
    assert "the stored request is malformed" in result["reason"]


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
    assert state == "failed" and "the stored request is malformed" in result["reason"]
