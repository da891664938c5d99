"""Answers of a server that break the protocol are the server's fault, never a success and
never a wait (M-1, M-3, T-3).

A ``tools/call`` result without a ``content`` list, with an item that is not an object or an
``isError`` that is not a boolean would otherwise be read as a successful call with its data
dropped; a response to an id that was never asked would be waited past, until the timeout or,
for a call without one, forever; an entry of a listing that is not a tool object would be
dropped without a word, and the projection would claim every tool was written.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.mcp.test_ctxmcp import ctxmcp, scripted, tool
from tests.mcp.test_misbehaving import project, ready, run_terminal, skipped
from tests.tools.support import World

RESPONSE = '{"jsonrpc":"2.0","id":@ID@,"result":'


@pytest.mark.parametrize(
    ("result", "problem"),
    [
        ("{}", "its tools/call result has no 'content'"),
        ('{"content":"hello"}', "has a 'content' that is not a list"),
        ('{"content":[1,{"type":"text","text":"x"}]}', "holds an item that is no object"),
        (
            '{"content":[{"type":"text","text":"denied upstream"}],"isError":"true"}',
            'isError is "true", not true or false',
        ),
    ],
)
def test_a_call_result_that_breaks_the_protocol_is_eproto_in_both_modes(
    world: World, result: str, problem: str
) -> None:
    ready(world, call_raw=RESPONSE + result + "}")

    native = world.run("fake.echo", {})
    terminal = run_terminal(world, "{}")

    assert not native.ok and native.output["error"] == "EPROTO", native.output
    assert "server 'fake' broke the protocol: " in native.output["message"]
    assert problem in native.output["message"]
    assert terminal.returncode == 1 and "EPROTO" in terminal.stderr, terminal.stderr
    assert terminal.stdout == ""


@pytest.mark.parametrize("ident", ["999999", '"@ID@"', "null"])
def test_a_response_to_an_id_never_sent_is_eproto_at_once(tmp_path: Path, ident: str) -> None:
    listing = '{"jsonrpc":"2.0","id":' + ident + ',"result":{"tools":[]}}'
    config = scripted(tmp_path, list_raw=listing)

    started = time.monotonic()
    done = ctxmcp("list", "--config", str(config), "--server", "fake", "--timeout", "60")

    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("ctxmcp: EPROTO: server 'fake' broke the protocol: it answered")
    assert "the only request in flight was tools/list, id 2" in done.stderr
    assert time.monotonic() - started < 30, "it waited for the timeout"


def test_a_call_answered_under_another_id_fails_instead_of_waiting_forever(world: World) -> None:
    """Terminal mode has no timeout of its own: a call waited on would never end."""
    ready(world, call_raw='{"jsonrpc":"2.0","id":999999,"result":{"content":[]}}')

    terminal = run_terminal(world, "{}")
    native = world.run("fake.echo", {})

    assert terminal.returncode == 1 and "EPROTO" in terminal.stderr, terminal.stderr
    assert "it answered id 999999" in terminal.stderr
    assert not native.ok and native.output["error"] == "EPROTO", native.output


def test_listing_entries_that_are_not_tools_are_reported_and_skipped(tmp_path: Path) -> None:
    entries = [1, "x", None, tool("good")]
    config = scripted(tmp_path, list_raw=RESPONSE + json.dumps({"tools": entries}) + "}")
    out = tmp_path / "out"

    done = project(config, out)
    report = project(config, tmp_path / "again", "--json")
    listed = ctxmcp("list", "--config", str(config), "--server", "fake")

    assert done.returncode == 1, done.stderr  # exit 0 would say every tool was written
    assert skipped(done.stderr) == ["1", '"x"', "null"]
    assert "which is not a tool object" in done.stderr
    assert [path.name for path in out.iterdir()] == ["fake.good.manifest.json"]
    problems = [entry["problem"] for entry in json.loads(report.stdout)["skipped"]]
    assert len(problems) == 3 and all("not a tool object" in p for p in problems)
    assert listed.stdout.count("not projectable") == 3 and "fake.good" in listed.stdout


@pytest.mark.parametrize("size", [16 * 1024 * 1024 - 1, 16 * 1024 * 1024])
def test_a_message_of_16_mib_is_read_whatever_follows_it_in_the_same_read(
    tmp_path: Path, size: int
) -> None:
    """The limit is a message's own size, without its line break: a notification of up to
    16 MiB followed at once by the listing is no message over the limit, though one read of
    the pipe brings the end of the one and the start of the other."""
    opening = '{"jsonrpc":"2.0","method":"notifications/message","params":{"data":"'
    closing = '"}}'
    notice = opening + "x" * (size - len(opening) - len(closing)) + closing
    listing = RESPONSE + json.dumps({"tools": [tool("t" * 70000)]}) + "}"
    config = scripted(tmp_path, list_raw=notice + "\n" + listing)

    done = ctxmcp("list", "--config", str(config), "--server", "fake", "--json")

    assert done.returncode == 0, done.stderr[-300:]
    assert "larger than" not in done.stderr
