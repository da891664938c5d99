"""S-4 end to end: a shell.exec job whose command line holds passwords leaves none of them in
the worker's session nor in the tool's log, which keep the command with the values
redacted."""

from __future__ import annotations

from tests.workers.conftest import AGENT, PROJECT, Farm

SECRETS = ("hunter2", "s3cr3t", "t0k3n", "pa55", "k3y")
COMMAND = (
    "true https://ana:hunter2@git.example/r; true --password s3cr3t --token=t0k3n; "
    "curl -u admin:pa55 --max-time 0.001 http://127.0.0.1:9/ || true; true --api-key k3y"
)


def test_the_passwords_in_a_jobs_command_line_are_not_logged(farm: Farm) -> None:
    job = farm.publish("shell.exec", {"cmd": COMMAND})

    done = farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain")

    assert done.returncode == 0, done.stderr
    assert farm.result(job)[0] == "done"
    session = farm.root / "home" / str(farm.user.uid) / "agent" / AGENT / "session" / "worker"
    for log in (session / "events.jsonl", farm.root / "tool" / "shell.exec.d" / "log"):
        text = log.read_text()
        assert "https://ana:[redacted]@git.example/r" in text, text
        assert "curl -u admin:[redacted] " in text
        assert not [secret for secret in SECRETS if secret in text], text
