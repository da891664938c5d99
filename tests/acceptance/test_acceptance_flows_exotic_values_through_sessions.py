"""Exotic but valid values carried by tool calls into a session's records and back out
(SPEC §4 S-1 … S-6, T-7; docs/sessions.md "Events (S-2)", "What logs may say (S-4)",
"Commands"; docs/tools.md "Agent native mode and its frames").

A real agent runs real tools through ``ctx run --native`` and ``ctx run`` (terminal mode)
with inputs, argv words and outputs holding NUL, U+2028/U+2029/U+0085, terminal escape
sequences (ESC, CSI, OSC), right-to-left marks and overrides, integers of 300 digits, ``-0``,
``-0.0``, ``1.0``, ``1e-400``, emoji and combining characters, nesting at the 128-level
limit, strings past the 200-character cut with a multi-byte character at the cut, objects and
lists past 20 entries, summaries past 8 KiB, keys naming secrets in other cases, nested and in
lists, secrets in a terminal argv and in a tool's output.  What is checked:

* S-2, S-5: every line of ``events.jsonl`` (and of the tool's log) is one JSON object that a
  strict reader takes: UTF-8, no NaN, no name given twice, no lone surrogate;
* S-4, T-7: the input, argv and output are summarised exactly as documented (the 200-character
  cut and its ``…[+N chars]`` note, ``[+N keys]``, ``[+N items]``, ``[+N words]``, depth 6,
  the 8 KiB size note, ``[redacted]``), identically in the session's events and in
  ``tool/<name>.d/log``, while the caller's ``result`` frame keeps the value whole; a value
  that passes unsummarised is recorded as JSON reads it (types, key order and big integers
  kept);
* ``ctx session show --json``, ``tail -n N --json`` and ``tail --follow --json`` give back the
  very events of the file, in order; their text forms print one line per event and never a
  raw control, format or separator character; the agent's own uid reads the same;
* nothing is lost or reordered, and no command prints a traceback.
"""

from __future__ import annotations

import base64
import contextlib
import grp
import json
import math
import os
import shutil
import signal
import subprocess
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    Run,
    new_scratch_dir,
    scratch_top,
    tool_manifest,
    wait_for,
)
from tests.support.storage import copy_of_root

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid")

SCRATCH = scratch_top(__file__)
AGENT = "ex"
SPACE = "exotic-space"
LABEL = "ex_t"
REDACTED = "[redacted]"
TRACEBACK = "Traceback (most recent call last)"

# Prints its argv (terminal mode) or its stdin (native mode) back.
ECHO = """#!/bin/sh
if [ "$#" -gt 0 ]; then printf '%s\\n' "$*"; else cat; fi
"""
# Writes the bytes of "emit" (base64) on stdout and of "err" on stderr, exits "status".
RAW = """#!/usr/bin/python3 -I
import base64, json, sys
request = json.loads(sys.stdin.read())
sys.stdout.buffer.write(base64.b64decode(request.get("emit", "")))
sys.stderr.buffer.write(base64.b64decode(request.get("err", "")))
sys.exit(request.get("status", 0))
"""

BIG = "9" * 300
NEG_BIG = "-" + "1" * 300
# A native input written by hand, so that its spellings are exactly these.
EXOTIC_TEXT = (
    '{"nul":"a\\u0000b","seps":"x\\u2028y\\u2029z\\u0085w\\u000bv",'
    '"esc":"\\u001b[31mred\\u001b[0m \\u001b]0;title\\u0007 \\u001b[2J\\u009b1m\\u007f",'
    '"bidi":"\\u200fabc\\u202edef\\u202c","emoji":"\\ud83d\\ude00","comb":"e\\u0301",'
    f'"big":{BIG},"neg":{NEG_BIG},"one":1.0,"negzero":-0.0,"tiny":1e-400,"intzero":-0,'
    '"list":[null,true,false,0.5,[],{}],"\\u001b[1mkey\\u202e":"v"}'
)


# ------------------------------------------------------------------------------ helpers


def canon(value) -> str:
    """One spelling of a JSON value that tells 1 from 1.0, -0.0 from 0.0 and keeps key order."""
    return json.dumps(value, ensure_ascii=True)


def lone_surrogates(value) -> list[str]:
    """The strings and names of ``value`` that hold a lone surrogate (no UTF-8 text can)."""
    found, pending = [], [value]
    while pending:
        item = pending.pop()
        texts = [item] if isinstance(item, str) else list(item) if isinstance(item, dict) else []
        for text in texts:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                found.append(text)
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return found


def _unique(pairs: list) -> dict:
    names = [name for name, _ in pairs]
    assert len(names) == len(set(names)), names
    return dict(pairs)


def _no_constant(name: str):
    raise AssertionError(f"{name} is no JSON number")


def strict_line(line: bytes) -> dict:
    """One JSON-lines line read as a strict reader of another language would: UTF-8 text, one
    object, no NaN or Infinity, no name twice, no lone surrogate."""
    value = json.loads(line.decode("utf-8"), object_pairs_hook=_unique, parse_constant=_no_constant)
    assert isinstance(value, dict), line[:200]
    assert lone_surrogates(value) == [], line[:300]
    return value


def strict_lines(data: bytes) -> list[dict]:
    assert data == b"" or data.endswith(b"\n"), data[-200:]
    return [strict_line(line) for line in data.split(b"\n")[:-1]]


def acted_on(text: str) -> list[str]:
    """What a terminal acts on or reorders: controls (C0, DEL, C1), format characters (the
    bidirectional marks), line and paragraph separators, surrogates; not the line feed and
    the tab."""
    return [
        char
        for char in text
        if char not in "\n\t" and unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Cs")
    ]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@dataclass
class World(OnStorage):
    top: Path
    storage: Path
    uid: int
    gid: int

    def session_dir(self, session: str, project: str | None = None) -> Path:
        base = self.storage / ("shared" if project else "home") / (project or str(self.uid))
        return base / "agent" / AGENT / "session" / session

    def events_file(self, session: str, project: str | None = None) -> Path:
        return self.session_dir(session, project) / "events.jsonl"

    def events(self, session: str, project: str | None = None) -> list[dict]:
        return strict_lines(self.events_file(session, project).read_bytes())

    def native(
        self, session: str, tool: str, payload: str | bytes, *options: str
    ) -> tuple[Run, dict]:
        """``ctx run --native`` of the JSON text ``payload``: the run and its result frame."""
        r = self.ctx("run", "--agent", AGENT, "--session", session, *options, "--native", tool,
                     input=payload)  # fmt: skip
        assert TRACEBACK not in r.err, r
        frames = [json.loads(line) for line in r.lines()]
        assert frames and frames[-1]["type"] == "result", r
        return r, frames[-1]

    def terminal(
        self, session: str, tool: str, *words: str | bytes, project: str | None = None
    ) -> subprocess.CompletedProcess:
        """``ctx run`` in terminal mode with ``words`` as the tool's argv (bytes as they are)."""
        where = [b"--project", project.encode()] if project else []
        argv = [*map(os.fsencode, CTX_ARGV), b"run", b"--agent", AGENT.encode(), b"--session",
                session.encode(), *where, tool.encode(), *map(os.fsencode, words)]  # fmt: skip
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                              env=self.env, timeout=60)  # fmt: skip
        assert TRACEBACK.encode() not in proc.stderr, proc.stderr
        return proc

    def log_line(self, tool: str, call: str) -> tuple[bytes, dict]:
        """The one line of ``tool/<tool>.d/log`` for ``call``: its bytes and the event."""
        found = []
        for line in (self.storage / "tool" / f"{tool}.d" / "log").read_bytes().splitlines():
            if f'"call":"{call}"'.encode() in line:
                found.append(line)
        assert len(found) == 1, (call, found)
        return found[0], strict_line(found[0])

    def pair(self, session: str, call: str, project: str | None = None) -> tuple[dict, dict, dict]:
        """``tool_call``, ``tool_result`` and the tool log's line of ``call``; the log agrees
        with the session on everything they both say (T-7)."""
        events = [e for e in self.events(session, project) if e.get("call") == call]
        assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
        request, result = events
        tool = result["object"].removeprefix("tool/")
        _, logged = self.log_line(tool, call)
        for key in ("input", "argv", "mode"):
            assert canon(logged.get(key)) == canon(request.get(key)), (key, logged, request)
        for key in set(result) - {"ts"}:
            assert canon(logged[key]) == canon(result[key]), (key, logged, result)
        where = self.session_dir(session, project)
        assert logged["session_dir"] == str(where.relative_to(self.storage)), logged
        return request, result, logged

    def shown_json(self, *args: str) -> list[dict]:
        r = self.ctx("session", *args, "--json")
        assert r.rc == 0 and TRACEBACK not in r.err, r
        return strict_lines(r.out.encode())

    def shown_text(self, *args: str) -> str:
        r = self.ctx("session", *args)
        assert r.rc == 0 and TRACEBACK not in r.err, r
        return r.out


def install(world: World, name: str, program: str) -> None:
    manifest = tool_manifest(world.top / "manifests", name, program)
    installed = world.ctx("object", "install", manifest, "--tier", "system")
    assert installed.rc == 0, installed
    with (world.storage / "tool" / f"{name}.d" / "policy").open("a") as policy:
        policy.write(f"allow {LABEL} tool:{name} execute\n")


@pytest.fixture(scope="module")
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(SCRATCH, "world-")
    storage = copy_of_root(_template, top / "storage")
    try:
        probe = World(top, storage, 0, 0)
        request = {"name": AGENT, "label": LABEL, "mount": [], "tools": ["demo.echo", "demo.raw"],
                   "shared": {SPACE: ["read", "write"]}}  # fmt: skip
        made = probe.create_agent(request)
        world = World(top, storage, made["identity"]["uid"], made["identity"]["gid"])
        group = grp.getgrgid(world.gid).gr_name
        created = world.ctx("shared", "create", SPACE, "--group", group)
        assert created.rc == 0, created
        install(world, "demo.echo", ECHO)
        install(world, "demo.raw", RAW)
        yield world
    finally:
        shutil.rmtree(top, ignore_errors=True)


def raw_call(world: World, session: str, out: bytes, err: bytes = b"", status: int = 0):
    payload = json.dumps({"emit": b64(out), "err": b64(err), "status": status})
    return world.native(session, "demo.raw", payload)


# ------------------------------------------------------------------ values passed whole


def test_exotic_scalars_reach_the_tool_and_every_record_exactly_as_json_reads_them(world):
    """S-2, S-4, T-7: a native input of NUL, separators, escapes, bidi marks, an emoji, a
    combining accent, 300-digit integers, ``1.0``, ``-0.0``, ``1e-400`` and ``-0`` reaches the
    tool as JSON reads it and is recorded so — types, key order and every digit kept — in the
    ``tool_call``, the ``tool_result``'s output, the tool's log and what ``show --json`` and
    ``tail -n 2 --json`` print, every line a strict reader takes."""
    session = "scalars"
    expected = json.loads(EXOTIC_TEXT)
    r, result = world.native(session, "demo.echo", EXOTIC_TEXT)
    assert r.rc == 0 and result["status"] == "ok", r
    assert canon(result["output"]) == canon(expected), result["output"]
    assert BIG in r.out and NEG_BIG in r.out, r

    request, recorded, _ = world.pair(session, result["call"])
    assert canon(request["input"]) == canon(expected), request
    assert canon(recorded["output"]) == canon(expected), recorded
    line = world.events_file(session).read_bytes().splitlines()[0]
    for spelling in (BIG, NEG_BIG, '"one":1.0', '"negzero":-0.0'):
        assert spelling.encode() in line, (spelling, line)
    assert isinstance(request["input"]["one"], float)
    assert math.copysign(1.0, request["input"]["negzero"]) == -1.0
    assert int(BIG) == request["input"]["big"] and int(NEG_BIG) == request["input"]["neg"]
    assert list(request["input"]) == list(expected)  # key order kept

    events = world.events(session)
    assert world.shown_json("show", AGENT, session) == events
    assert world.shown_json("tail", AGENT, session, "-n", "2") == events[-2:]
    assert world.shown_json("tail", AGENT, session, "-n", "1") == events[-1:]


def test_terminal_argv_of_escapes_separators_and_bidi_is_recorded_word_for_word(world):
    """S-2, S-4, T-7: terminal-mode argv words holding ESC/CSI/OSC, a line feed, U+2028,
    U+0085, right-to-left overrides, an empty word and numbers-as-words reach the tool as they
    are and are recorded word for word (a word is text, ``-0`` and ``1e-400`` stay words), in
    the session and the log alike."""
    session = "argv"
    words = ["\x1b[31mred\x1b[0m", "a\nb", "x\u2028y\u0085z", "\u202eabc\u202c\u200f", "",
             "-0", "1e-400", "1.0", BIG[:150], "é\u0301😀", "\x1b]0;title\x07"]  # fmt: skip
    proc = world.terminal(session, "demo.echo", *words)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode() == " ".join(words) + "\n"
    events = world.events(session)
    assert [e["type"] for e in events] == ["tool_call", "tool_result"], events
    request, _, _ = world.pair(session, events[0]["call"])
    assert request["mode"] == "terminal" and request["argv"] == words, request


def test_a_value_at_the_128_level_limit_passes_whole_and_is_recorded_to_depth_6(world):
    """S-4, docs/tools.md (native mode): an input nested 128 levels deep is taken, reaches the
    tool and comes back whole to the caller, while both records keep it to depth 6 with the
    documented ``[N items elided]``; one level more is refused at stage ``schema`` (exit 2,
    ``EINVAL``), the tool never run, and that call too has its two events and its log line,
    its text summarised as a text is (200 characters and what went)."""
    session = "deep"
    text = '{"x":' + "[" * 127 + "]" * 127 + "}"
    r, result = world.native(session, "demo.echo", text)
    assert r.rc == 0, r
    assert result["output"] == json.loads(text)
    request, recorded, _ = world.pair(session, result["call"])
    elided = {"x": [[[[[["[1 items elided]"]]]]]]}
    assert request["input"] == elided and recorded["output"] == elided, (request, recorded)

    deeper = '{"x":' + "[" * 128 + "]" * 128 + "}"
    r, result = world.native(session, "demo.echo", deeper)
    assert r.rc == 2, r
    assert (result["error"]["error"], result["error"]["stage"]) == ("EINVAL", "schema"), result
    assert result["exit_status"] is None and result["output"] is None, result
    assert "128" in result["error"]["message"], result
    request, recorded, _ = world.pair(session, result["call"])
    assert request["input"] == deeper[:200] + f"…[+{len(deeper) - 200} chars]", request
    assert (recorded["status"], recorded["errno"], recorded["stage"]) == (
        "error", "EINVAL", "schema"
    ), recorded  # fmt: skip


# ------------------------------------------------------------------ summaries


def test_long_strings_are_cut_at_200_characters_whole_characters_at_the_cut(world):
    """S-4: strings and keys past 200 characters keep their first 200 *characters* — an emoji
    or a CJK character at the cut is kept or dropped whole — with ``…[+N chars]`` counting
    characters; a string of exactly 200 is kept; the same summary in the session's call, its
    result and the tool's log, the lines valid UTF-8; the caller gets everything."""
    session = "long"
    emoji_at_cut = "é" * 199 + "😀" + "z" * 50
    long_key = "k" * 199 + "字" + "K" * 100
    payload = {
        "emoji_at_cut": emoji_at_cut,
        "emojis": "😀" * 250,
        "cjk": "字" * 1000,
        "exact": "x" * 200,
        "combining": "e\u0301" * 150,
        long_key: 1,
    }
    r, result = world.native(session, "demo.echo", json.dumps(payload))
    assert r.rc == 0 and result["output"] == payload, r
    expected = {
        "emoji_at_cut": "é" * 199 + "😀" + "…[+50 chars]",
        "emojis": "😀" * 200 + "…[+50 chars]",
        "cjk": "字" * 200 + "…[+800 chars]",
        "exact": "x" * 200,
        "combining": "e\u0301" * 100 + "…[+100 chars]",
        "k" * 199 + "字" + "…[+100 chars]": 1,
    }
    request, recorded, _ = world.pair(session, result["call"])
    assert request["input"] == expected, request["input"]
    assert recorded["output"] == expected, recorded["output"]

    word = "é" * 199 + "😀" + "tail"
    proc = world.terminal(session, "demo.echo", word, "short")
    assert proc.returncode == 0 and proc.stdout.decode() == f"{word} short\n", proc
    call = world.events(session)[-1]["call"]
    request, _, _ = world.pair(session, call)
    assert request["argv"] == ["é" * 199 + "😀" + "…[+4 chars]", "short"], request


def test_objects_lists_and_argv_past_20_entries_say_how_many_went(world):
    """S-4: an object keeps its first 20 keys and ``"[+N keys]": null``, a list its first 20
    items and ``"[+N items]"``, an argv its first 20 words and ``"[+N words]"`` — in order,
    the same in the session and the log."""
    session = "counts"
    payload = {f"k{i:02}": i for i in range(25)}
    payload["k00"] = [f"\u202e{i}" for i in range(23)]
    r, result = world.native(session, "demo.echo", json.dumps(payload))
    assert r.rc == 0, r
    expected = {f"k{i:02}": i for i in range(20)}
    expected["k00"] = [f"\u202e{i}" for i in range(20)] + ["[+3 items]"]
    expected["[+5 keys]"] = None
    request, recorded, _ = world.pair(session, result["call"])
    assert canon(request["input"]) == canon(expected), request["input"]
    assert canon(recorded["output"]) == canon(expected), recorded["output"]

    words = [f"w{i}\x1b[0m" for i in range(26)]
    proc = world.terminal(session, "demo.echo", *words)
    assert proc.returncode == 0, proc
    request, _, _ = world.pair(session, world.events(session)[-1]["call"])
    assert request["argv"] == [*words[:20], "[+6 words]"], request


def test_a_summary_past_8_kib_becomes_a_note_of_its_size_in_both_records(world):
    """S-4: an input whose summary is still longer than 8 KiB once cut (20 strings of 200
    four-byte emoji) is recorded as ``[summary of N bytes elided]``, N its size in UTF-8 JSON,
    the same note for the output and in the tool's log; the caller's output is whole."""
    session = "note"
    payload = {f"k{i}": "😀" * 300 for i in range(20)}
    r, result = world.native(session, "demo.echo", json.dumps(payload))
    assert r.rc == 0 and result["output"] == payload, r
    summary = {f"k{i}": "😀" * 200 + "…[+100 chars]" for i in range(20)}
    size = len(json.dumps(summary, ensure_ascii=False, separators=(",", ":")).encode())
    assert size > 8 * 1024
    request, recorded, _ = world.pair(session, result["call"])
    note = f"[summary of {size} bytes elided]"
    assert request["input"] == note and recorded["output"] == note, (request, recorded)
    assert len(world.events_file(session).read_bytes()) < 4096


# ------------------------------------------------------------------ secrets


def test_secret_keys_in_other_cases_nested_and_in_lists_lose_their_exotic_values(world):
    """S-4, T-7: keys naming a secret in other cases and spellings (``PASSWORD``, ``Api_Key``,
    ``authorization`` in a list, ``pass<NUL>word``, ``X-AUTH``) lose their values whatever
    their type — a 300-digit integer, ``-0.0``, a list, an object, a text with escapes —
    while their exotic neighbours (``author``, ``tokenizer``, ``passenger``) are kept as they
    are; the output echoing them is summarised by the same rule; no secret appears in the
    session, the log or any view of them; the caller's result keeps everything."""
    session = "secrets"
    secret_big = "8" * 299 + "3"
    secrets = ["PW\x1b[8mhidden-a1", "AK-\u202eb2", "BR-c3", "NUL-d4", "XA-e5"]
    payload = {
        "PASSWORD": secrets[0],
        "Api_Key": [secrets[1], 5],
        "headers": [{"authorization": f"Bearer {secrets[2]}"}, {"accept": "*/*"}],
        "pass\u0000word": {"v": secrets[3]},
        "X-AUTH": secrets[4],
        "client_SECRET": int(secret_big),
        "Session_Token": -0.0,
        "author": "\u202eAna",
        "tokenizer": 1e-300,
        "passenger": "\x1b[1mBob",
    }
    r, result = world.native(session, "demo.echo", json.dumps(payload))
    assert r.rc == 0 and result["output"] == payload, r
    assert all(secret in r.out or json.dumps(secret)[1:-1] in r.out for secret in secrets)
    expected = {
        "PASSWORD": REDACTED,
        "Api_Key": REDACTED,
        "headers": [{"authorization": REDACTED}, {"accept": "*/*"}],
        "pass\u0000word": REDACTED,
        "X-AUTH": REDACTED,
        "client_SECRET": REDACTED,
        "Session_Token": REDACTED,
        "author": "\u202eAna",
        "tokenizer": 1e-300,
        "passenger": "\x1b[1mBob",
    }
    request, recorded, logged = world.pair(session, result["call"])
    assert canon(request["input"]) == canon(expected), request["input"]
    assert canon(recorded["output"]) == canon(expected), recorded["output"]

    argv = ["--PASSWORD", "PWargv-f6", "Api-Key=AKargv-g7", "Authorization:", "Bearer",
            "BRargv-h8", "\x1b[31m--token\x1b[0m", "x\npassword: PWline-i9\ny"]  # fmt: skip
    proc = world.terminal(session, "demo.echo", *argv)
    assert proc.returncode == 0 and b"PWargv-f6" in proc.stdout, proc
    request, _, _ = world.pair(session, world.events(session)[-1]["call"])
    assert request["argv"][:7] == ["--PASSWORD", REDACTED, f"Api-Key={REDACTED}",
                                   "Authorization:", "Bearer", REDACTED,
                                   "\x1b[31m--token\x1b[0m"], request  # fmt: skip
    assert request["argv"][7] == f"x\npassword: {REDACTED}\ny", request
    secrets += ["PWargv-f6", "AKargv-g7", "BRargv-h8", "PWline-i9", secret_big]

    views = [
        world.events_file(session).read_text(),
        json.dumps(world.events(session)),
        "".join(
            line
            for line in (world.storage / "tool" / "demo.echo.d" / "log").read_text().splitlines()
            if f'"session":"{session}"' in line
        ),
        json.dumps(logged),
        world.ctx("session", "show", AGENT, session).out,
        world.ctx("session", "show", AGENT, session, "--json").out,
        world.ctx("session", "tail", AGENT, session, "-n", "4").out,
    ]
    for view in views:
        for secret in secrets:
            assert secret not in view and json.dumps(secret)[1:-1] not in view, (secret, view)


# ------------------------------------------------------------------ outputs


def test_tool_output_that_is_not_json_is_recorded_as_its_text_alike_everywhere(world):
    """S-4, T-7, docs/tools.md (The result): a tool's stdout of NUL bytes, bytes that are not
    UTF-8, escapes and U+2028 is its text (the odd bytes as U+FFFD), ``{"n": NaN}`` and an
    array nested 200 deep are kept as text (their JSON is no JSON every reader takes), each
    recorded as a text is summarised, the same in the result, the session and the log (an
    object giving a name twice is read as the result reads it, the last value); the
    last stderr line of a failing tool, escapes and a secret in it, becomes the message,
    redacted the same everywhere."""
    session = "outputs"
    cases = {
        b"x\x00y\xff\xfe \x1b[2J\xe2\x80\xa8 done\n": "x\x00y\ufffd\ufffd \x1b[2J\u2028 done\n",
        b'{"n": NaN}': '{"n": NaN}',
        b"[" * 200 + b"]" * 200: "[" * 200 + "…[+200 chars]",
        # A name given twice: the result and the records hold the same reading of it.
        b'{"a": "\\u001b[1m", "a": "\\u202e"}': {"a": "\u202e"},
    }
    for out, text in cases.items():
        r, result = raw_call(world, session, out)
        assert r.rc == 0, r
        if isinstance(text, str):
            assert result["output"] == out.decode("utf-8", "replace"), result
        else:
            assert result["output"] == text, result
        _, recorded, _ = world.pair(session, result["call"])
        assert recorded["output"] == text, (out, recorded)

    stderr = b"first line\n\x1b[31mfailed\x1b[0m: password=PWerr-j10 \xe2\x80\xae end\n"
    r, result = raw_call(world, session, b'{"Token": "TKout-k11", "ok": false}', stderr, 3)
    assert r.rc == 1, r
    assert result["output"] == {"Token": "TKout-k11", "ok": False}, result
    assert result["error"]["message"].endswith("password=PWerr-j10 \u202e end"), result
    _, recorded, _ = world.pair(session, result["call"])
    assert recorded["output"] == {"Token": REDACTED, "ok": False}, recorded
    assert recorded["message"] == (
        f"demo.raw exited with status 3: \x1b[31mfailed\x1b[0m: password={REDACTED} \u202e end"
    ), recorded
    assert (recorded["exit_status"], recorded["errno"], recorded["stage"]) == (3, None, "exit")
    for view in (world.events_file(session).read_text(), world.shown_text("show", AGENT, session)):
        assert "PWerr-j10" not in view and "TKout-k11" not in view and "first line" not in view


# ------------------------------------------------------------------ views


def test_text_views_print_one_escaped_line_per_event_and_the_agents_uid_reads_the_same(world):
    """docs/sessions.md (Commands), S-1: for a session holding exotic inputs, argv words,
    outputs and a message, ``session show`` and ``tail -n N`` in text print one line per event
    with no raw control, format or separator character (the escapes shown as their escape),
    every digit of a big integer kept; the agent's own uid, reading its own session, gets the
    same JSON and text as root."""
    session = "views"
    r, _ = world.native(session, "demo.echo", EXOTIC_TEXT)
    assert r.rc == 0, r
    proc = world.terminal(session, "demo.echo", "\x1b[2J", "a\u2028b", "\u202eevil", "x\ny")
    assert proc.returncode == 0, proc
    r, _ = raw_call(world, session, b"\x00\x1b]52;c;SGVsbG8=\x07\xc2\x9b\n", b"\x1b[1mE\n", 5)
    assert r.rc == 1, r
    events = world.events(session)
    assert len(events) == 6, events

    shown = world.shown_text("show", AGENT, session)
    tailed = world.shown_text("tail", AGENT, session, "-n", "3")
    for text, count in ((shown, 6), (tailed, 3)):
        assert len(text.splitlines()) == count, text
        assert acted_on(text) == [], (acted_on(text), text)
        assert "]52;c;SGVsbG8=" in text, text
    assert "[2J" in shown, shown
    assert BIG in shown and NEG_BIG in shown, shown
    assert any(esc + "[31mred" in shown for esc in ("\\x1b", "\\u001b")), shown
    assert any(esc in shown for esc in ("\\u202e", "\\u202E")), shown
    assert [line.split()[1] for line in tailed.splitlines()] == [e["type"] for e in events[-3:]]

    as_agent = {"user": world.uid, "group": world.gid, "extra_groups": []}
    for args in (("show", AGENT, session, "--json"), ("show", AGENT, session),
                 ("tail", AGENT, session, "-n", "3")):  # fmt: skip
        root_view = world.ctx("session", *args)
        own = subprocess.run([*CTX_ARGV, "session", *args], capture_output=True, env=world.env,
                             timeout=60, **as_agent)  # fmt: skip
        assert own.returncode == 0 and root_view.rc == 0, (own, root_view)
        assert own.stdout.decode() == root_view.out, (args, own.stdout)


def test_follow_prints_every_exotic_event_in_order_and_ends_cleanly_on_ctrl_c(world):
    """S-5, docs/sessions.md (Commands): ``tail --follow --json`` and ``tail --follow`` (text)
    watching a session while native and terminal calls with exotic values record into it print
    exactly the file's events, in order, the JSON strict and the text one escaped line per
    event; the tool's log holds the calls in the same order; SIGINT ends both with exit 0."""
    session = "followed"
    r, _ = world.native(session, "demo.echo", '{"first": "\\u2028"}')
    assert r.rc == 0, r
    json_out = world.top / "follow.jsonl"
    text_out = world.top / "follow.txt"
    followers = []
    try:
        for out, extra in ((json_out, ["--json"]), (text_out, [])):
            with out.open("wb") as sink:
                followers.append(subprocess.Popen(
                    [*CTX_ARGV, "session", "tail", AGENT, session, "-n", "100", "--follow",
                     *extra],
                    stdout=sink, stderr=subprocess.PIPE, env=world.env, start_new_session=True,
                ))  # fmt: skip
        for out in (json_out, text_out):
            assert wait_for(lambda out=out: len(out.read_bytes().splitlines()) == 2, 20), out
        for i in range(3):
            r, _ = world.native(session, "demo.echo", EXOTIC_TEXT.replace('"nul"', f'"n{i}"'))
            assert r.rc == 0, r
            proc = world.terminal(session, "demo.echo", f"t{i}", "\x1b[H\u202e\u2029", "é" * 300)
            assert proc.returncode == 0, proc
            r, _ = raw_call(world, session, b"\x1b[0m\x00\xff" + str(i).encode())
            assert r.rc == 0, r
        events = world.events(session)
        assert len(events) == 20, events
        assert wait_for(lambda: len(json_out.read_bytes().splitlines()) >= 20, 20)
        assert wait_for(lambda: len(text_out.read_bytes().splitlines()) >= 20, 20)
        for follower in followers:
            follower.send_signal(signal.SIGINT)
        for follower in followers:
            _, err = follower.communicate(timeout=20)
            assert follower.returncode == 0, err
            assert TRACEBACK.encode() not in err, err
    finally:
        for follower in followers:
            if follower.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(follower.pid, signal.SIGKILL)
                follower.wait()
    assert strict_lines(json_out.read_bytes()) == events
    text = text_out.read_bytes().decode("utf-8")
    assert len(text.splitlines()) == 20 and acted_on(text) == [], text
    calls = [e["call"] for e in events if e["type"] == "tool_result"]
    logged = []
    for tool in ("demo.echo", "demo.raw"):
        for line in (world.storage / "tool" / f"{tool}.d" / "log").read_bytes().splitlines():
            event = json.loads(line)
            if event.get("call") in calls:
                logged.append((event["ts"], event["call"]))
    assert [call for _, call in sorted(logged)] == calls


def test_a_shared_space_session_records_exotic_values_as_a_home_session_does(world):
    """S-1, S-4, S-6, T-7: the same exotic input and argv recorded in a session of a shared
    space (``--project``) land in ``shared/<space>/agent/<agent>/session/<s>/events.jsonl``
    with the same summaries as in a home session, strict lines, the tool's log naming that
    session, and ``show --project --json`` / ``tail --project`` giving them back."""
    session = "in-space"
    r, result = world.native(session, "demo.echo", EXOTIC_TEXT, "--project", SPACE)
    assert r.rc == 0, r
    assert result["session"] == f"shared/{SPACE}/agent/{AGENT}/session/{session}", result
    request, recorded, _ = world.pair(session, result["call"], SPACE)
    expected = json.loads(EXOTIC_TEXT)
    assert canon(request["input"]) == canon(expected) == canon(recorded["output"]), request
    words = ["\x1b[2J", "--password", "PWspace-n14", "\u202e" + "é" * 250]
    proc = world.terminal(session, "demo.echo", *words, project=SPACE)
    assert proc.returncode == 0, proc
    events = world.events(session, SPACE)
    request, _, _ = world.pair(session, events[-1]["call"], SPACE)
    summary = ["\x1b[2J", "--password", REDACTED, "\u202e" + "é" * 199 + "…[+51 chars]"]
    assert request["argv"] == summary, request
    assert world.shown_json("show", AGENT, session, "--project", SPACE) == events
    tailed = world.shown_text("tail", AGENT, session, "--project", SPACE, "-n", "2")
    assert len(tailed.splitlines()) == 2 and acted_on(tailed) == [], tailed
    assert "PWspace-n14" not in world.events_file(session, SPACE).read_text()


# ------------------------------------------------------------------ defects


def test_a_secret_after_a_coloured_label_in_a_tools_output_is_redacted(world):
    """S-4: ``key: value`` is redacted in any text; a CLI that prints its labels in colour
    (``\\x1b[1mPassword:\\x1b[0m VALUE``, ``\\x1b[1mpassword\\x1b[0m: VALUE``) shows
    ``Password: VALUE`` on a terminal, and its value must not reach the records either."""
    session = "coloured"
    for out, secret in (
        (b"\x1b[1mPassword:\x1b[0m PWcolour-l12\n", "PWcolour-l12"),
        (b"\x1b[1mpassword\x1b[0m: PWcolour-m13\n", "PWcolour-m13"),
    ):
        r, result = raw_call(world, session, out)
        assert r.rc == 0 and secret in result["output"], r
        _, recorded, _ = world.pair(session, result["call"])
        assert secret not in recorded["output"], recorded


def test_the_note_of_keys_that_went_never_replaces_a_kept_key(world):
    """S-4: an object keeps its first 20 keys and a ``"[+N keys]": null`` note; an input
    whose first key is itself spelt ``[+1 keys]`` keeps that key's value, and the note is an
    entry of its own."""
    session = "marker"
    payload = {"[+1 keys]": "first-value"}
    payload.update({f"k{i:02}": i for i in range(20)})
    r, result = world.native(session, "demo.echo", json.dumps(payload))
    assert r.rc == 0, r
    request, _, _ = world.pair(session, result["call"])
    summary = request["input"]
    assert "first-value" in summary.values(), summary
    assert len(summary) == 21, summary


def test_an_argv_word_that_is_not_utf8_leaves_lines_a_strict_reader_takes(world):
    """S-2, S-5, T-7: an argv word holding a byte that is not UTF-8 (a Latin-1 file name) is
    passed to the tool as it is, and the event lines that record it are still text that any
    strict JSON reader takes: no lone surrogate in the session or the tool's log."""
    session = "latin1"
    proc = world.terminal(session, "demo.echo", b"caf\xe9", "ok")
    assert proc.returncode == 0 and proc.stdout == b"caf\xe9 ok\n", proc
    data = world.events_file(session).read_bytes()
    events = strict_lines(data)
    raw, _ = world.log_line("demo.echo", events[0]["call"])
    strict_line(raw)
