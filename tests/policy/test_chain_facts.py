"""One reading of an agent's controls for many questions (AgentFacts): the same answers as
asking each question afresh, the controls read once, each object judged once, and the caller
judged at every question (SPEC P-5, P-6)."""

from __future__ import annotations

import errno
import os
from collections import Counter
from pathlib import Path, PurePosixPath

import pytest

from cortexfs import beneath
from cortexfs.policy import (
    AgentFacts,
    AuthorityRequest,
    Credentials,
    Outcome,
    Step,
    check_authority,
)
from cortexfs.policy import controls as agent_controls
from tests.support.storage import add_agent, add_tool, write
from tests.support.users import UnprivilegedUser

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to set owners and uids")

QUESTIONS = [
    ("tool", "fs.read", "execute"),  # both layers allow
    ("tool", "fs.list", "execute"),  # its own policy does not
    ("tool", "fs.stat", "execute"),  # the agent's policy does not
    ("tool", "fs.gone", "execute"),  # no such tool: ENOENT at step 2
    ("model", "openai/gpt-5.6", "use"),  # the agent allows it, no such model
    ("network", "default", "connect"),  # no file, the agent's policy does not
    ("shared", "demo", "read"),  # no such space
]


@pytest.fixture
def tools(root: Path, coder: Path) -> None:
    add_tool(root, "fs.read", policy="allow coder_t tool:fs.read execute\n")
    add_tool(root, "fs.list", policy="")
    add_tool(root, "fs.stat", policy="allow coder_t tool:fs.stat execute\n")
    write(
        coder / "policy",
        "allow coder_t mount:ctx read\nallow coder_t tool:fs.read execute\n"
        "allow coder_t tool:fs.list execute\nallow coder_t model:openai/gpt-5.6 use\n",
    )


def requests(root: Path, caller: Credentials | None) -> list[AuthorityRequest]:
    return [AuthorityRequest(root, "coder", *question, caller) for question in QUESTIONS]


@pytest.mark.parametrize("as_caller", [False, True])
def test_shared_facts_give_every_answer_asking_afresh_gives(
    root: Path, coder: Path, user: UnprivilegedUser, tools: None, as_caller: bool
) -> None:
    caller = Credentials(user.uid, user.gid) if as_caller else None
    afresh = [check_authority(request).to_json() for request in requests(root, caller)]
    facts = AgentFacts(root, "coder")
    shared = [check_authority(request, facts).to_json() for request in requests(root, caller)]
    assert shared == afresh
    assert [answer["step"] for answer in afresh] == [None, 6, 5, 2, 2, 5, 2]


def test_the_controls_are_read_once_for_all_questions(
    root: Path, coder: Path, tools: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: Counter[str] = Counter()
    read_file = beneath.read_file
    read_in_directory = agent_controls.read_regular_file

    def counting(base: Path, path: PurePosixPath, limit: int) -> bytes:
        reads[str(path)] += 1
        return read_file(base, path, limit)

    def counting_in_directory(name: str, limit: int, *, dir_fd: int) -> bytes:
        directory = PurePosixPath(os.readlink(f"/proc/self/fd/{dir_fd}"), name)
        reads[str(directory.relative_to(root.resolve()))] += 1
        return read_in_directory(name, limit, dir_fd=dir_fd)

    monkeypatch.setattr(beneath, "read_file", counting)
    monkeypatch.setattr(agent_controls, "read_regular_file", counting_in_directory)
    facts = AgentFacts(root, "coder")
    for request in requests(root, None):
        check_authority(request, facts)
    controls = {f"agent/coder.d/{name}" for name in ("identity", "mount", "label", "policy")}
    assert {path: reads[path] for path in controls} == dict.fromkeys(controls, 1)

    reads.clear()
    for request in requests(root, None):
        check_authority(request)
    # Each question reads the agent's controls afresh.
    assert reads["agent/coder.d/policy"] == len(QUESTIONS)


def test_answers_last_as_long_as_their_facts(
    root: Path, coder: Path, user: UnprivilegedUser, tools: None
) -> None:
    """Facts are made for one call or one lookup: a change shows with the next facts."""
    request = requests(root, None)[0]
    facts = AgentFacts(root, "coder")
    write(coder / "label", "not a label\n")
    denied = check_authority(request, facts)
    assert (denied.step, denied.errno) == (Step.LABEL, errno.EACCES)
    write(coder / "label", "coder_t\n")
    assert check_authority(request, facts) == denied
    assert check_authority(request, AgentFacts(root, "coder")).allowed


def test_the_caller_is_judged_at_every_question(
    root: Path, coder: Path, user: UnprivilegedUser, tools: None
) -> None:
    """Steps 2 to 6 are decided once per object; step 1, who asks, each time."""
    facts = AgentFacts(root, "coder")
    stranger = Credentials(user.uid + 1, user.gid)
    me = Credentials(user.uid, user.gid)

    allowed = check_authority(requests(root, me)[0], facts)
    refused = check_authority(requests(root, stranger)[0], facts)
    again = check_authority(requests(root, me)[0], facts)

    assert allowed.allowed and again == allowed
    assert (refused.step, refused.errno) == (Step.CREDENTIALS, errno.EACCES)
    assert {result.outcome for result in refused.steps[1:]} == {Outcome.NOT_REACHED}


def test_facts_answer_for_their_own_agent_only(
    root: Path, coder: Path, user: UnprivilegedUser, tools: None
) -> None:
    add_agent(root, "reviewer", uid=user.uid, gid=user.gid)
    facts = AgentFacts(root, "reviewer")
    with pytest.raises(ValueError, match="facts of agent 'reviewer'"):
        check_authority(requests(root, None)[0], facts)
