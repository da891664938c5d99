"""``agent.update`` over the run capability (SPEC A-5), as a real agent through the runner."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys

import pytest

from cortexfs.agents.capability import Capability
from tests.tools.support import World


def system_md(world: World, agent: str = "coder") -> str:
    return (world.root / "agent" / f"{agent}.d" / "system.md").read_text()


def granted(world: World) -> World:
    world.agent("coder", tools=["agent.update"])
    world.allow_tool("agent.update")
    return world


def test_an_agent_replaces_its_own_system_md(world: World) -> None:
    granted(world)

    result = world.run("agent.update", {"control": "system.md", "content": "Be brief.\n"})

    assert result.ok, result.error
    assert result.output == {"agent": "coder", "control": "system.md", "bytes": 10}
    assert system_md(world) == "Be brief.\n"
    status = (world.root / "agent" / "coder.d" / "system.md").stat()
    assert (status.st_uid, stat.S_IMODE(status.st_mode)) == (os.geteuid(), 0o644)
    assert [e["type"] for e in world.events()][-2:] == ["tool_call", "tool_result"]


def test_the_prompt_template_is_the_only_other_control_it_may_change(world: World) -> None:
    granted(world)
    policy = (world.root / "agent" / "coder.d" / "policy").read_text()

    template = world.run("agent.update", {"control": "prompt.template.md", "content": "{task}"})
    refused = world.run("agent.update", {"control": "policy", "content": "allow coder_t x:y z"})

    assert template.ok, template.error
    assert not refused.ok and refused.error is not None
    assert refused.error.errno == errno.EINVAL
    assert (world.root / "agent" / "coder.d" / "policy").read_text() == policy


def test_more_than_8_kib_is_refused(world: World) -> None:
    granted(world)
    before = system_md(world)

    too_long = world.run("agent.update", {"control": "system.md", "content": "x" * 9000})
    too_many_bytes = world.run("agent.update", {"control": "system.md", "content": "é" * 5000})

    assert not too_long.ok and too_long.error.errno == errno.EINVAL  # type: ignore[union-attr]
    assert not too_many_bytes.ok
    assert too_many_bytes.output["error"] == "EFBIG", too_many_bytes.output
    assert system_md(world) == before


def test_the_capability_is_bound_to_the_calling_agent(world: World) -> None:
    granted(world)
    world.agent("other")
    others = system_md(world, "other")
    request = {"op": "agent.update", "control": "system.md", "content": "mine", "agent": "other"}

    answer = Capability(world.root, "coder", "agent.update").answer(json.dumps(request).encode())

    assert answer["ok"] and answer["agent"] == "coder"
    assert system_md(world) == "mine" and system_md(world, "other") == others


def test_a_request_nested_past_any_json_document_is_answered_einval(world: World) -> None:
    """A tool's request is bounded as every JSON the host reads: nesting past its limit is
    refused in the answer, where the reader would recurse until the thread serving the
    capability died and the tool was answered nothing."""
    granted(world)
    capability = Capability(world.root, "coder", "agent.update")

    answer = capability.answer(b"[" * 100_000 + b"]" * 100_000)

    assert answer["error"] == "EINVAL" and "nested deeper" in answer["message"], answer


# Writes one request on the descriptor it is given, then prints the answer (or nothing).
WRITER = """
import os, sys
fd = int(sys.argv[1])
os.write(fd, sys.argv[2].encode())
print(os.read(fd, 65536).decode(), end="")
"""


def ask(descriptor: int, request: dict[str, object]) -> subprocess.Popen[str]:
    """A process of our uid writing ``request`` on ``descriptor``, a capability's tool end."""
    line = json.dumps(request) + "\n"
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(descriptor), line],
        pass_fds=(descriptor,),
        stdout=subprocess.PIPE,
        text=True,
    )


def test_the_capability_answers_only_the_tool_process_it_was_given_to(world: World) -> None:
    """A copy of the descriptor in another process of the uid (another agent's, which took it
    with pidfd_getfd) gets no answer, and the capability ends unused (A-5)."""
    granted(world)
    before = system_md(world)
    capability = Capability(world.root, "coder", "agent.update")
    with capability.serving():
        copy = os.dup(capability.tool_descriptor)  # as pidfd_getfd would take it
        tool = subprocess.Popen(["sleep", "30"])  # the process the runner started
        capability.bind(tool.pid)
        thief = ask(copy, {"op": "agent.update", "control": "system.md", "content": "x"})
        stolen, _ = thief.communicate(timeout=30)
        os.close(copy)
        tool.kill()
        tool.wait()

    assert stolen == "" and system_md(world) == before

    capability = Capability(world.root, "coder", "agent.update")
    with capability.serving():
        request = {"op": "agent.update", "control": "system.md", "content": "mine"}
        tool = ask(capability.tool_descriptor, request)
        capability.bind(tool.pid)  # possibly after its write: the write waits for it
        answered, _ = tool.communicate(timeout=30)

    assert json.loads(answered)["ok"] and system_md(world) == "mine"


def test_the_capability_answers_the_operation_of_its_tool_only(world: World) -> None:
    """agent.update's capability creates no agent: both policies allowed agent.update, not
    agent.create (P-6)."""
    granted(world)
    with open(world.root / "agent" / "coder.d" / "policy", "a") as policy:
        policy.write("allow coder_t agent:kid create\n")
    request = {"op": "agent.create", "request": {"name": "kid", "label": "kid_t", "tools": []}}

    answer = Capability(world.root, "coder", "agent.update").answer(json.dumps(request).encode())

    assert answer["error"] == "EACCES" and "answers agent.update only" in answer["message"]
    assert not (world.root / "agent" / "kid").exists()


def test_both_policies_must_allow_it(world: World) -> None:
    world.agent("coder", tools=["agent.update"])  # the tool's own policy does not allow it

    result = world.run("agent.update", {"control": "system.md", "content": "x"})

    assert not result.ok and result.error is not None
    assert result.error.errno == errno.EACCES and result.error.step == 6


def test_without_the_runner_there_is_no_capability(world: World) -> None:
    tool = world.root / "tool" / "agent.update"

    direct = subprocess.run(
        [str(tool), json.dumps({"control": "system.md", "content": "x"})],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip

    assert direct.returncode == 1 and "EPERM" in direct.stderr


@pytest.mark.parametrize("content", ["Be brief.\x1b[2J\n", "a\x00b", "\x7f", "next\x85line"])
def test_content_with_a_control_character_is_refused(world: World, content: str) -> None:
    """A-5: the host re-validates the content: the prompts are text, tabs and line ends their
    only control characters (an escape sequence could rewrite what a person reading it sees)."""
    granted(world)
    before = system_md(world)

    refused = world.run("agent.update", {"control": "system.md", "content": content})
    kept = world.run("agent.update", {"control": "system.md", "content": "a\tb\r\nc\n"})

    assert not refused.ok and refused.error is not None
    assert refused.error.errno == errno.EINVAL
    assert "control character" in refused.error.message
    assert kept.ok, kept.error
    written = (world.root / "agent" / "coder.d" / "system.md").read_bytes()
    assert before.encode() != written == b"a\tb\r\nc\n"


def test_content_with_a_lone_surrogate_is_refused_as_such(world: World) -> None:
    granted(world)

    refused = world.run("agent.update", {"control": "system.md", "content": "a\ud800b"})

    assert not refused.ok and refused.error is not None
    assert refused.error.errno == errno.EINVAL
    assert "lone surrogate" in refused.error.message
