"""What a core tool does with the answer on its run capability (SPEC A-4, A-5, T-2;
docs/tools.md "The core tools").

The host answers one JSON object per request: ``{"ok": true, …facts}`` or its refusal
``{"error", "errno", "message"}``.  Whoever runs ``agent.update`` or ``agent.create`` by hand
may hand it a socket of their own, whose other end answers anything: an answer no host gives
is one ``<tool>: EPROTO: …`` line quoting what came (shortened, escaped), exit 1 — never a
traceback, nor an errno made up from a word.  Real tool programs of a bootstrapped root, real
socket pairs.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
from pathlib import Path

import pytest

from cortexfs.tools.core.hostcall import ENVIRONMENT
from tests.tools.support import World

REQUESTS = {
    "agent.update": {"control": "system.md", "content": "be brief"},
    "agent.create": {"name": "child", "label": "child_t", "tools": []},
}


def answered(root: Path, tool: str, answer: bytes, mode: str) -> subprocess.CompletedProcess[str]:
    """``tool`` run by hand in ``mode``, its capability a socket whose other end has written
    ``answer``; the request it sent is checked to be its one request."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.sendall(answer)
        done = subprocess.run(
            [str(root / "tool" / tool), json.dumps(REQUESTS[tool])],
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "CTX_MODE": mode, ENVIRONMENT: str(theirs.fileno())},
            pass_fds=(theirs.fileno(),),
            timeout=60,
        )
        ours.setblocking(False)
        asked = json.loads(ours.recv(65536))
    assert asked["op"] == tool, asked
    return done


def one_line(done: subprocess.CompletedProcess[str], tool: str, mode: str) -> tuple[str, str]:
    """The errno word and the message of the tool's one failure line, exit 1."""
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr, done.stderr
    said = re.fullmatch(rf"{re.escape(tool)}: (E[A-Z0-9]+): ([^\n]+)\n", done.stderr)
    assert said, done.stderr
    if mode == "native":
        assert json.loads(done.stdout)["error"] == said.group(1), done.stdout
    else:
        assert done.stdout == "", done.stdout
    return said.group(1), said.group(2)


@pytest.mark.parametrize("tool", ["agent.update", "agent.create"])
@pytest.mark.parametrize("mode", ["terminal", "native"])
@pytest.mark.parametrize(
    ("answer", "what"),
    [
        pytest.param(b"not json\n", "not JSON", id="not-JSON"),
        pytest.param(b"\xff\xfe\n", "not JSON", id="not-UTF-8"),
        pytest.param(b"[" * 5000 + b"\n", "not JSON", id="nested-past-the-limit"),
        pytest.param(b"[]\n", "not a JSON object", id="an-array"),
        pytest.param(b"{}\n", "a refusal without a known errno", id="an-empty-object"),
        pytest.param(
            b'{"ok": false, "errno": 99999, "message": "no"}\n',
            "a refusal without a known errno",
            id="an-unknown-number",
        ),
        pytest.param(
            b'{"ok": false, "errno": "EBOGUS", "message": "no"}\n',
            "a refusal without a known errno",
            id="an-unknown-word",
        ),
        pytest.param(
            b'{"ok": false, "errno": true, "message": "no"}\n',
            "a refusal without a known errno",
            id="a-boolean",
        ),
        pytest.param(
            b'{"ok": false, "errno": 13, "message": ["no"]}\n',
            "a refusal whose message is no string",
            id="message-a-list",
        ),
        pytest.param(b'{"ok": true}\n', "a success without 'agent' (a string)", id="no-facts"),
        pytest.param(
            b'{"ok": true, "agent": 7}\n',
            "a success without 'agent' (a string)",
            id="a-fact-of-another-type",
        ),
    ],
)
def test_an_answer_no_host_gives_is_eproto_quoting_it(
    world: World, tool: str, mode: str, answer: bytes, what: str
) -> None:
    done = answered(world.root, tool, answer, mode)

    word, message = one_line(done, tool, mode)
    assert word == "EPROTO", done.stderr
    assert message.startswith(f"the run capability answered what no host says ({what}"), message


def test_what_the_answer_is_quoted_as_is_shortened_and_escaped(world: World) -> None:
    done = answered(
        world.root, "agent.update", b"\x1b]0;owned\x07" + b"x" * 5000 + b"\n", "terminal"
    )

    _, message = one_line(done, "agent.update", "terminal")
    assert message.endswith("(not JSON): \\x1b]0;owned\\x07" + "x" * 190 + "… (5010 characters)"), (
        message
    )


@pytest.mark.parametrize("mode", ["terminal", "native"])
def test_a_refusal_the_host_gives_is_its_errno_and_message(world: World, mode: str) -> None:
    """The host's refusal (``CtxError.to_json``), and one naming its errno by its word."""
    for answer in (
        b'{"error": "EACCES", "errno": 13, "message": "not yours"}\n',
        b'{"ok": false, "errno": "EACCES", "message": "not yours"}\n',
    ):
        done = answered(world.root, "agent.update", answer, mode)
        assert one_line(done, "agent.update", mode) == ("EACCES", "not yours"), done


def test_an_einval_of_the_host_is_a_usage_error(world: World) -> None:
    done = answered(world.root, "agent.update", b'{"errno": 22, "message": "bad"}\n', "terminal")

    assert (done.returncode, done.stderr) == (2, "agent.update: EINVAL: bad\n"), done


def test_a_success_with_its_facts_is_the_tools_output(world: World) -> None:
    update = b'{"ok": true, "agent": "coder", "control": "system.md", "bytes": 8}\n'
    done = answered(world.root, "agent.update", update, "native")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"agent": "coder", "control": "system.md", "bytes": 8}

    create = b'{"ok": true, "agent": "child", "label": "child_t", "uid": 5, "warnings": ["w"]}\n'
    done = answered(world.root, "agent.create", create, "terminal")
    assert (done.returncode, done.stdout) == (0, "created agent child\n"), done
    assert done.stderr == "agent.create: warning: w\n"


def test_no_answer_at_all_is_eio(world: World) -> None:
    """The host ended the capability unanswered (A-5): EIO, as before."""
    ours, theirs = socket.socketpair()
    with theirs:
        ours.close()
        done = subprocess.run(
            [str(world.root / "tool" / "agent.update"), json.dumps(REQUESTS["agent.update"])],
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", ENVIRONMENT: str(theirs.fileno())},
            pass_fds=(theirs.fileno(),),
            timeout=60,
        )
    assert (done.returncode, done.stderr) == (1, "agent.update: EIO: the host gave no answer\n")
