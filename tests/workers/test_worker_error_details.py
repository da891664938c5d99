"""Every failed job's result holds one shape of ``error`` — the tool runner's: ``error`` (the
errno's name), ``errno`` (its number), ``stage``, ``step``, ``step_name``, ``message`` — and a
``reason`` that reads as a sentence: the errno when there is one, the message, the stage.  A
tool that exits non-zero without naming an errno has none (both null), and a tool the worker
killed on a second ^C is recorded in the session as interrupted (EINTR)."""

from __future__ import annotations

import errno
import json
import signal

from tests.workers.conftest import AGENT, PROJECT, Farm

ERROR_KEYS = {"error", "errno", "stage", "step", "step_name", "message"}


def work(farm: Farm, *extra: str, env: dict[str, str] | None = None) -> None:
    done = farm.ctx("queue", "work", "--project", PROJECT, "--drain", *extra, env=env)
    assert done.returncode == 0, done.stderr


def failed_error(farm: Farm, job: str) -> tuple[str, dict[str, object]]:
    state, result = farm.result(job)
    assert state == "failed" and result["status"] == "error"
    error = result["error"]
    assert isinstance(error, dict) and set(error) == ERROR_KEYS, error
    code = error["errno"]
    assert error["error"] == (errno.errorcode[code] if code else None), error
    return str(result["reason"]), error


def test_a_non_zero_exit_has_no_errno_and_a_reason_that_reads_well(farm: Farm) -> None:
    job = farm.publish("shell.exec", {"cmd": "echo broken >&2; exit 3"})

    work(farm, "--agent", AGENT)

    reason, error = failed_error(farm, job)
    assert (error["error"], error["errno"], error["stage"]) == (None, None, "exit")
    assert reason == "shell.exec exited with status 3: broken [exit]"


def test_every_refusal_of_the_worker_itself_has_an_errno(farm: Farm) -> None:
    no_agent = farm.publish("shell.exec", {"cmd": "true"})
    work(farm, env={"CTX_AGENT": ""})
    reason, error = failed_error(farm, no_agent)
    assert (error["error"], error["errno"], error["stage"]) == ("EACCES", 13, "authorize")
    assert reason.startswith("EACCES: this worker was started without --agent")

    (farm.queue / "pending" / "junk.req.json").write_text("{not json")
    work(farm, "--agent", AGENT)
    reason, error = failed_error(farm, "junk.req.json")
    assert (error["error"], error["errno"], error["stage"]) == ("EINVAL", 22, "request")
    assert reason.startswith("EINVAL: stored request is not JSON") and "[request]" in reason

    config = farm.queue / "config"
    config.write_text(config.read_text() + "max_result_bytes=64\n")
    too_big = farm.publish("shell.exec", {"cmd": "head -c 4096 /dev/zero | tr '\\0' x"})
    work(farm, "--agent", AGENT)
    reason, error = failed_error(farm, too_big)
    assert (error["error"], error["errno"], error["stage"]) == ("EFBIG", 27, "finish")
    assert reason.startswith("EFBIG: ") and reason.endswith("[finish]")


def test_a_tool_killed_by_a_second_ctrl_c_is_recorded_as_interrupted(farm: Farm) -> None:
    job = farm.abort_with_two_ctrl_c().job
    assert (farm.queue / "claimed" / job / job).exists(), "left for recover"

    session = farm.root / "home" / str(farm.user.uid) / "agent" / AGENT / "session" / "worker"
    events = [json.loads(line) for line in (session / "events.jsonl").read_text().splitlines()]
    result = [event for event in events if event["type"] == "tool_result"][-1]
    assert (result["status"], result["errno"], result["stage"]) == ("error", "EINTR", "run")
    assert result["exit_status"] == 128 + signal.SIGKILL
    log = (farm.root / "tool" / "shell.exec.d" / "log").read_text().splitlines()
    assert json.loads(log[-1])["errno"] == "EINTR"
