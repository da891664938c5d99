"""Tool manifests whose ``schema`` is an unusual but valid, or nearly valid, JSON Schema (SPEC
T-1, T-3, T-8, W-1, W-4; docs/tools.md "Manifests, version 2", "How an input is checked",
docs/workers.md "One job").

A user writes manifests with remote and host-file ``$ref``s, recursive and chained references,
``$schema`` of every draft and of drafts nobody knows, ``format`` keywords, huge enums,
backtracking ``pattern``s, ``$defs`` / ``definitions``, ``unevaluatedProperties``, booleans as
schemas and non-object root types.  They go through ``ctx object check`` and ``ctx object
install``, then real calls: ``ctx run --native``, ``ctx run`` (terminal mode) and a job of
``ctx queue work``.  What must hold: an invalid schema is refused at check and install with
every reason listed and nothing installed; a valid one judges an input the same way at every
entry point; a refused input is ``EINVAL`` naming what failed; nothing is fetched, no host file
is read, nothing prints a traceback, and no call spins for minutes."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    scratch_top,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs tools as an agent's uid")

SCRATCH = scratch_top(__file__)
AGENT = "coder"
LABEL = "coder_t"

# Prints its argv in terminal mode, and echoes its one line of JSON input in native mode.
ECHO = """\
#!/bin/sh
if [ "$#" -gt 0 ]; then
  printf '%s\\n' "$*"
else
  cat
fi
"""

# A string on which ``^(a+)+$`` backtracks for longer than anyone waits (2^40 steps).
BACKTRACKING_INPUT = "a" * 40 + "!"
# How long a call given ``--timeout 1`` may take before it counts as hanging.
HANG_DEADLINE = 4.0


# ----------------------------------------------------------------------------------------------
# helpers


@dataclass
class World:
    """A bootstrapped storage root every uid may search, holding the queue of project
    ``proj``, an agent ``coder`` (uid nobody) and a directory of manifests."""

    storage: Path
    src: Path

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    @property
    def queue(self) -> QueueCLI:
        return QueueCLI(self.storage, "proj")

    def ctx(self, *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        kw.setdefault("timeout", 30)
        return ctx_run(*args, **kw)

    def manifest(self, name: str, schema: object, **extra: object) -> Path:
        """A v2 manifest of tool ``name`` with input schema ``schema``, beside its program."""
        (self.src / "echo.sh").write_text(ECHO)
        document = {
            "manifest": 2,
            "kind": "tool",
            "name": name,
            "description": f"The {name} tool.",
            "schema": schema,
            "cap": {"side_effects": False, "network": False},
            "exec": "echo.sh",
            **extra,
        }
        path = self.src / f"{name}.json"
        path.write_text(json.dumps(document))
        return path

    def install(self, name: str, schema: object, **extra: object) -> Run:
        return self.ctx("object", "install", self.manifest(name, schema, **extra),
                        "--tier", "system")  # fmt: skip

    def installed(self, name: str, schema: object) -> None:
        """Install tool ``name`` and grant it to the agent in both layers of P-6."""
        r = self.install(name, schema)
        assert r.rc == 0 and f"installed {name} in tier system" in r.out, r
        assert "Traceback" not in r.err, r
        for policy in (self.storage / f"tool/{name}.d/policy",
                       self.storage / f"agent/{AGENT}.d/policy"):  # fmt: skip
            with policy.open("a") as f:
                f.write(f"allow {LABEL} tool:{name} execute\n")

    def absent(self, name: str) -> bool:
        """Nothing of tool ``name`` in the system tier: no executable, no controls, no staging."""
        tier = self.storage / "tool"
        return not any(
            entry == name or entry.startswith((f"{name}.d", f".{name}~"))
            for entry in os.listdir(tier)
        )

    def native(self, tool: str, value: object, *args: str) -> tuple[Run, dict]:
        """``ctx run --native`` of ``value``: the run and its ``result`` frame."""
        r = self.ctx("run", "--native", "--agent", AGENT, *args, tool, input=json.dumps(value))
        assert "Traceback" not in r.err, r
        frames = [json.loads(line) for line in r.lines()]
        assert frames and frames[-1]["type"] == "result", r
        return r, frames[-1]

    def accepts(self, tool: str, value: object) -> None:
        r, result = self.native(tool, value)
        assert r.rc == 0 and result["status"] == "ok", r
        assert result["output"] == value, result

    def refuses(self, tool: str, value: object, *naming: str) -> str:
        """A native call of ``value`` refused at stage schema, EINVAL, exit 2, the tool not
        run; its message names each of ``naming``.  The message is returned."""
        r, result = self.native(tool, value)
        error = result["error"]
        assert r.rc == 2 and result["status"] == "error", r
        assert error["error"] == "EINVAL" and error["stage"] == "schema", result
        assert result["exit_status"] is None, result
        message = error["message"]
        assert message.startswith(f"input does not match the schema of {tool}: "), message
        for part in naming:
            assert part in message, (part, message)
        return message

    def drain(self) -> Run:
        r = self.queue.run("work", "--agent", AGENT, "--drain", timeout=60)
        assert r.rc == 0 and "Traceback" not in r.err, (r.rc, r.err[-4000:])
        return r


@pytest.fixture
def world(searchable_storage: Path) -> Iterator[World]:
    top = new_scratch_dir(SCRATCH, "w")
    try:
        src = top / "src"
        src.mkdir()
        src.chmod(0o755)
        ws = top / "ws"
        ws.mkdir()
        ws.chmod(0o777)
        w = World(searchable_storage, src)
        request = {
            "name": AGENT,
            "label": LABEL,
            "tools": [],
            "shared": {},
            "mount": [[str(ws), "/workspace", "rw"]],
        }
        made = w.ctx("agent", "create", "-", input=json.dumps(request))
        assert made.rc == 0, made
        yield w
    finally:
        shutil.rmtree(top, ignore_errors=True)


@contextlib.contextmanager
def listener() -> Iterator[tuple[socket.socket, int]]:
    """A TCP socket listening on loopback: anything that fetches a URL naming it connects."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        sock.setblocking(False)
        yield sock, sock.getsockname()[1]
    finally:
        sock.close()


def connected(sock: socket.socket) -> bool:
    """Whether a connection is waiting on the listening ``sock``."""
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


def lines_of(run: Run, manifest: Path) -> list[str]:
    """The EINVAL lines ``ctx object check`` printed for ``manifest``."""
    return [line for line in run.err.splitlines() if line.startswith(f"{manifest}: ")]


def bounded(argv: list[str], env: dict[str, str], data: bytes, deadline: float) -> Run | None:
    """Run ``argv`` with ``data`` on stdin, in a process group of its own; None (the group
    killed) when it has not ended within ``deadline`` seconds."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(data, timeout=deadline)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None
    return Run(argv[len(CTX_ARGV) :], proc.returncode, out.decode(errors="replace"),
               err.decode(errors="replace"))  # fmt: skip


# ----------------------------------------------------------------------------------------------
# references that lead outside the schema


def test_references_outside_the_schema_are_refused_and_nothing_is_fetched_or_read(
    world: World,
) -> None:
    """T-8, T-1: a ``$ref`` (or ``$dynamicRef``) to an http URL, to a ``file:`` URL or to a
    file beside the manifest is refused by check and install, naming the reference, with
    nothing installed; the URL's server is never contacted and the file (a FIFO, which would
    block any reader) is never opened.  A ``$schema`` and a top ``$id`` naming the same server
    are only names: the schema installs and is applied with no connection made."""
    fifo = world.src / "defs.json"
    os.mkfifo(fifo)
    with listener() as (sock, port):
        url = f"http://127.0.0.1:{port}"
        refused = {
            "ref.http": {"type": "object", "properties": {"a": {"$ref": f"{url}/a.json"}}},
            "ref.file": {"$ref": f"file://{fifo}"},
            "ref.relative": {"type": "object", "properties": {"a": {"$ref": "defs.json#/x"}}},
            "ref.dynamic": {"$dynamicRef": f"{url}/meta#node"},
            "ref.id-relative": {"$id": f"{url}/root.json", "$ref": "other.json"},
        }
        paths = {name: world.manifest(name, schema) for name, schema in refused.items()}
        checked = world.ctx("object", "check", *paths.values())
        assert checked.rc == 1 and checked.out == "", checked
        assert "Traceback" not in checked.err, checked
        for name, path in paths.items():
            lines = lines_of(checked, path)
            assert len(lines) == 1 and lines[0].startswith(f"{path}: EINVAL: schema "), lines
            assert "outside itself" in lines[0] and "nothing is fetched" in lines[0], lines
            installed = world.ctx("object", "install", path, "--tier", "system")
            assert installed.rc != 0 and "EINVAL" in installed.err, installed
            assert "Traceback" not in installed.err, installed
            assert world.absent(name), os.listdir(world.storage / "tool")
        assert not connected(sock)

        # Names of the same server in $schema and $id are not references to follow.
        named = {
            "$schema": f"{url}/my-draft",
            "$id": f"{url}/root.json",
            "$defs": {"word": {"type": "string", "pattern": "^[a-z]+$"}},
            "type": "object",
            "properties": {"w": {"$ref": "#/$defs/word"}},
            "oneOf": [{"required": ["w"]}, {"required": ["v"]}],
        }
        world.installed("ref.named", named)
        world.accepts("ref.named", {"w": "abc"})
        world.refuses("ref.named", {"w": "ABC"}, "at /w: ", "'ABC' does not match")
        assert not connected(sock)


def test_a_schema_with_two_references_outside_itself_names_both(world: World) -> None:
    """T-8 (docs/tools.md): "Every reason a manifest is invalid is listed, one line each"."""
    outside = {
        "type": "object",
        "properties": {
            "a": {"$ref": "https://schemas.example.invalid/a.json"},
            "b": {"$ref": "file:///etc/passwd"},
        },
    }
    path = world.manifest("two.refs", outside)
    checked = world.ctx("object", "check", path)
    assert checked.rc == 1, checked
    text = "\n".join(lines_of(checked, path))
    assert "file:///etc/passwd" in text, checked
    assert "https://schemas.example.invalid/a.json" in text, checked


def test_a_schema_invalid_against_its_meta_schema_also_names_its_outside_reference(
    world: World,
) -> None:
    """T-8 (docs/tools.md): every reason is listed, the meta-schema's and the reference's."""
    schema = {
        "type": "object",
        "properties": {
            "a": {"$ref": "https://schemas.example.invalid/a.json"},
            "b": {"type": "strin"},
        },
    }
    path = world.manifest("meta.and.ref", schema)
    checked = world.ctx("object", "check", path)
    assert checked.rc == 1, checked
    text = "\n".join(lines_of(checked, path))
    assert "at /properties/b/type" in text, checked
    assert "https://schemas.example.invalid/a.json" in text, checked


def test_every_reason_of_an_invalid_manifest_is_listed_and_nothing_installed(
    world: World,
) -> None:
    """T-8: problems of several fields, the schema's and the program's included, come out one
    line each with exit 1, the same in ``--json``; install refuses with nothing installed."""
    document_extra = {"program": {"minLength": -1}}
    schema = {"type": "strin", "properties": {"a": {"pattern": "(("}}}
    path = world.manifest("many.faults", schema, **document_extra)
    raw = json.loads(path.read_text())
    raw["cap"] = {"network": "no"}
    raw["description"] = ""
    path.write_text(json.dumps(raw))
    checked = world.ctx("object", "check", path)
    assert checked.rc == 1 and checked.out == "", checked
    lines = lines_of(checked, path)
    assert all(": EINVAL: " in line for line in lines), lines
    for part in ("description:", "cap/network:", "at /properties/a/pattern", "at /type",
                 "program is not a valid JSON Schema: at /minLength"):  # fmt: skip
        assert sum(part in line for line in lines) == 1, (part, lines)
    as_json = world.ctx("object", "check", "--json", path)
    assert as_json.rc == 1, as_json
    (entry,) = as_json.json()
    assert entry["valid"] is False and entry["name"] is None, entry
    assert len(entry["problems"]) == len(lines) == 5, entry
    assert entry["codes"] == ["EINVAL"] * 5, entry
    installed = world.ctx("object", "install", path, "--tier", "system")
    assert installed.rc == 1 and "Traceback" not in installed.err, installed
    assert world.absent("many.faults")


# ----------------------------------------------------------------------------------------------
# $schema: every draft, unknown drafts, values that are no URI


DRAFTS = {
    # name: (schema, an input it accepts, one it refuses, what the refusal names)
    "draft.03": (
        {"$schema": "http://json-schema.org/draft-03/schema#", "type": "object",
         "properties": {"a": {"type": "string", "required": True}}},
        {"a": "x"}, {}, "'a' is a required property",
    ),
    "draft.04": (
        {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
         "properties": {"n": {"type": "number", "minimum": 5, "exclusiveMinimum": True}}},
        {"n": 6}, {"n": 5}, "at /n: 5 is less than or equal to the minimum of 5",
    ),
    "draft.06": (
        {"$schema": "http://json-schema.org/draft-06/schema#", "type": "object",
         "properties": {"n": {"exclusiveMinimum": 5}}},
        {"n": 6}, {"n": 5}, "at /n: 5 is less than or equal to 5",
    ),
    "draft.07": (
        {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
         "definitions": {"pos": {"type": "integer", "minimum": 1}},
         "properties": {"n": {"$ref": "#/definitions/pos"}},
         "if": {"required": ["a"]}, "then": {"required": ["b"]}},
        {"a": 1, "b": 2, "n": 3}, {"a": 1, "n": 3}, "'b' is a required property",
    ),
    "draft.2019": (
        {"$schema": "https://json-schema.org/draft/2019-09/schema", "type": "object",
         "dependentRequired": {"a": ["b"]}},
        {"a": 1, "b": 2}, {"a": 1}, "'b' is a dependency of 'a'",
    ),
    "draft.2020": (
        {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
         "$defs": {"pos": {"$anchor": "pos", "type": "integer", "minimum": 1}},
         "properties": {"t": {"prefixItems": [{"$ref": "#pos"}], "items": False}}},
        {"t": [1]}, {"t": [0]}, "at /t/0: 0 is less than the minimum of 1",
    ),
    "draft.unknown": (
        {"$schema": "https://drafts.example.invalid/my-own-draft", "type": "object",
         "properties": {"t": {"prefixItems": [{"type": "integer"}]}}},
        {"t": [1]}, {"t": ["x"]}, "at /t/0: 'x' is not of type 'integer'",
    ),
}  # fmt: skip


def test_each_draft_judges_the_same_way_natively_and_in_a_queue_job(world: World) -> None:
    """T-8, T-3, W-1: a schema of each draft (03, 04, 06, 07, 2019-09, 2020-12) and of a draft
    nobody knows checks valid and installs; an input it accepts runs natively and as a job
    (done), one it refuses is EINVAL at stage schema with the same message natively and in the
    job's result (failed); terminal mode, which checks no schema, runs the tool on its argv."""
    paths = [world.manifest(name, schema) for name, (schema, *_) in DRAFTS.items()]
    checked = world.ctx("object", "check", *paths)
    assert checked.rc == 0, checked
    assert checked.lines() == [f"{p}: valid ({n})" for p, n in zip(paths, DRAFTS, strict=True)]
    messages = {}
    for name, (schema, good, bad, named) in DRAFTS.items():
        world.installed(name, schema)
        world.accepts(name, good)
        messages[name] = world.refuses(name, bad, named)
        world.queue.publish({"tool": name, "input": good}, name=f"{name}-good")
        world.queue.publish({"tool": name, "input": bad}, name=f"{name}-bad")
    world.drain()
    for name, (_, good, _, _) in DRAFTS.items():
        state, res = world.queue.only_result(f"{name}-good.req.json")
        assert state == "done" and res["output"] == good, res
        state, res = world.queue.only_result(f"{name}-bad.req.json")
        assert state == "failed", res
        assert res["error"]["error"] == "EINVAL" and res["error"]["stage"] == "schema", res
        assert res["error"]["message"] == messages[name], (res, messages[name])
    term = world.ctx("run", "--agent", AGENT, "draft.2020", "not", "json")
    assert term.rc == 0 and term.out == "not json\n", term


def test_a_schema_keyword_that_is_not_a_string_is_an_einval_line(world: World) -> None:
    """T-8: "Every reason a manifest is invalid is listed, one line each" - also for a
    ``$schema`` of the wrong type, never a traceback; nothing is installed."""
    paths = [
        world.manifest(f"odd.schema{i}", {"$schema": value, "type": "object"})
        for i, value in enumerate((42, True, [], {}))
    ]
    checked = world.ctx("object", "check", *paths)
    assert "Traceback" not in checked.err, checked
    assert checked.rc == 1, checked
    for path in paths:
        (line,) = lines_of(checked, path)
        assert "EINVAL: schema" in line and "$schema" in line, line
    installed = world.ctx("object", "install", paths[0], "--tier", "system")
    assert installed.rc == 1 and "Traceback" not in installed.err, installed
    assert world.absent("odd.schema0")


# ----------------------------------------------------------------------------------------------
# booleans, non-object roots, format, unevaluatedProperties, big enums, deep recursion


def test_booleans_as_whole_schemas_are_refused_and_as_subschemas_are_applied(
    world: World,
) -> None:
    """T-8: ``schema`` is a JSON object, so ``true`` and ``false`` as the whole schema are
    refused naming the field; inside an object they mean what JSON Schema says."""
    paths = [world.manifest(f"bool.{value}", value) for value in ("true", "false")]
    for path, value in zip(paths, (True, False), strict=True):
        raw = json.loads(path.read_text())
        raw["schema"] = value
        path.write_text(json.dumps(raw))
    checked = world.ctx("object", "check", *paths)
    assert checked.rc == 1 and "Traceback" not in checked.err, checked
    for path in paths:
        (line,) = lines_of(checked, path)
        assert "EINVAL: schema: " in line and "is not of type 'object'" in line, line
    world.installed("bool.props", {"type": "object",
                                   "properties": {"no": False, "yes": True}})  # fmt: skip
    world.accepts("bool.props", {"yes": [1, {"any": None}]})
    world.refuses("bool.props", {"no": 1}, "at /no: ", "False schema does not allow 1")


def test_schemas_of_non_object_roots_take_their_own_inputs(world: World) -> None:
    """T-8, W-1: a root ``type`` of string or array takes a native input of that type and
    refuses an object; a queue job, whose input is always an object, fails EINVAL the same
    way; an empty schema takes anything."""
    world.installed("root.string", {"type": "string", "minLength": 2})
    world.installed("root.array", {"type": "array", "items": {"type": "integer"}})
    world.installed("root.any", {})
    world.accepts("root.string", "hi")
    world.refuses("root.string", "h", "'h' is shorter than 2")
    message = world.refuses("root.string", {}, "{} is not of type 'string'")
    world.accepts("root.array", [1, 2])
    world.refuses("root.array", [1, "2"], "at /1: '2' is not of type 'integer'")
    for value in (None, 0, "s", [], {}):
        world.accepts("root.any", value)
    world.queue.publish({"tool": "root.string", "input": {}}, name="string-object")
    world.drain()
    state, res = world.queue.only_result("string-object.req.json")
    assert state == "failed" and res["error"]["message"] == message, res


def test_format_annotates_and_unevaluated_properties_constrain_at_every_entry_point(
    world: World,
) -> None:
    """docs/tools.md "How an input is checked": ``format`` asserts nothing (natively and in a
    job alike); ``unevaluatedProperties`` (2020-12) sees what ``allOf`` evaluated."""
    formats = {
        "type": "object",
        "properties": {
            "e": {"type": "string", "format": "email"},
            "d": {"type": "string", "format": "date-time"},
            "i": {"type": "string", "format": "ipv4"},
            "b": {"type": "string", "format": "no-such-format"},
        },
    }
    unevaluated = {
        "type": "object",
        "allOf": [{"properties": {"a": {"type": "integer"}}}],
        "properties": {"b": {}},
        "unevaluatedProperties": False,
    }
    world.installed("fmt.any", formats)
    world.installed("fmt.uneval", unevaluated)
    odd = {"e": "not an address", "d": "yesterday", "i": "999.1", "b": "x"}
    world.accepts("fmt.any", odd)
    world.accepts("fmt.uneval", {"a": 1, "b": 2})
    message = world.refuses("fmt.uneval", {"a": 1, "c": 3}, "'c' was unexpected")
    world.queue.publish({"tool": "fmt.any", "input": odd}, name="fmt")
    world.queue.publish({"tool": "fmt.uneval", "input": {"a": 1, "c": 3}}, name="unev")
    world.drain()
    state, res = world.queue.only_result("fmt.req.json")
    assert state == "done" and res["output"] == odd, res
    state, res = world.queue.only_result("unev.req.json")
    assert state == "failed" and res["error"]["message"] == message, res


HUGE_ENUM = [f"value-{i:06d}" for i in range(30000)]


def test_a_huge_enum_installs_and_judges_members(world: World) -> None:
    """T-8: an enum of 30 000 strings (most of a manifest's 1 MiB) installs; a member passes,
    a stranger is EINVAL naming where."""
    world.installed("enum.huge", {"type": "object", "properties": {"v": {"enum": HUGE_ENUM}}})
    world.accepts("enum.huge", {"v": HUGE_ENUM[-1]})
    world.refuses("enum.huge", {"v": "nope"}, "at /v: 'nope' is not one of")


def test_a_refusal_by_a_huge_enum_is_a_bounded_message(world: World) -> None:
    """W-1: the reason is recorded in the result; it names what failed without repeating
    half a megabyte of schema (the quoted input is already cut to 80 characters)."""
    world.installed("enum.loud", {"type": "object", "properties": {"v": {"enum": HUGE_ENUM}}})
    message = world.refuses("enum.loud", {"v": "nope"}, "at /v: 'nope' is not one of")
    world.queue.publish({"tool": "enum.loud", "input": {"v": "nope"}}, name="loud")
    world.drain()
    result = world.queue.dir / "failed" / "loud.req.json.result"
    assert len(message) < 64 * 1024, len(message)
    assert result.stat().st_size < 64 * 1024, result.stat().st_size


def test_recursive_references_validate_deep_inputs(world: World) -> None:
    """T-8: a tree schema that refers to itself through ``$defs`` (consuming a level each
    time) checks valid and judges an input 100 levels deep, natively and as a job."""
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"child": {"$ref": "#/$defs/node"}, "v": {"type": "integer"}},
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/node",
    }
    world.installed("tree.deep", tree)

    def nested(leaf: object) -> dict:
        value: dict = {"v": leaf}
        for _ in range(99):
            value = {"child": value}
        return value

    world.accepts("tree.deep", nested(1))
    message = world.refuses("tree.deep", nested("x"), "/child/child/", "/v: 'x' is not of type")
    world.queue.publish({"tool": "tree.deep", "input": nested("x")}, name="tree")
    world.drain()
    state, res = world.queue.only_result("tree.req.json")
    assert state == "failed" and res["error"]["message"] == message, res


def test_a_reference_cycle_below_the_top_is_refused_at_check(world: World) -> None:
    """T-8: check refuses ``{"$ref": "#"}`` ("refers to itself without end"); the same cycle
    one level down is no more applicable and must be refused too, not installed as a tool
    that every call reaching it reports damaged with advice (reinstall) that cannot help."""
    cycle = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/p"}},
        "$defs": {"p": {"$ref": "#/$defs/q"}, "q": {"$ref": "#/$defs/p"}},
    }
    top = world.manifest("cycle.top", {"$ref": "#"})
    deep = world.manifest("cycle.deep", cycle)
    checked = world.ctx("object", "check", top, deep)
    assert checked.rc == 1, checked
    assert "refers to itself without end" in "\n".join(lines_of(checked, top)), checked
    assert "EINVAL: schema" in "\n".join(lines_of(checked, deep)), checked


def test_a_draft4_id_below_the_top_is_refused_like_a_nested_id(world: World) -> None:
    """T-8: check refuses an ``$id`` below the top, which changes what the references under it
    mean; draft 4 spells it ``id``, with the same effect, so the schema must be refused at
    check (or, installed, judge the call with EINVAL), never a call failing with an internal
    exception's name.  No server named by the id is ever contacted."""
    with listener() as (sock, port):
        schema = {
            "$schema": "http://json-schema.org/draft-04/schema#",
            "type": "object",
            "definitions": {"x": {"type": "string"}},
            "properties": {
                "a": {
                    "id": f"http://127.0.0.1:{port}/a.json",
                    "properties": {"b": {"$ref": "#/definitions/x"}},
                }
            },
        }
        path = world.manifest("draft4.id", schema)
        checked = world.ctx("object", "check", path)
        assert "Traceback" not in checked.err, checked
        if checked.rc == 0:
            world.installed("draft4.id", schema)
            _, result = world.native("draft4.id", {"a": {"b": 1}})
            assert result["error"]["error"] == "EINVAL", result
            assert "Wrapped" not in result["error"]["message"], result
        else:
            assert "EINVAL: schema" in checked.err, checked
        assert not connected(sock)


def test_a_dynamic_anchor_is_a_place_the_schema_holds(world: World) -> None:
    """T-8: ``$dynamicRef: "#node"`` with ``$dynamicAnchor: "node"`` in the same document is a
    reference inside the schema (the 2020-12 way to write an extensible tree)."""
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$dynamicAnchor": "node",
        "type": "object",
        "properties": {"child": {"$dynamicRef": "#node"}, "v": {"type": "integer"}},
    }
    path = world.manifest("dyn.tree", schema)
    checked = world.ctx("object", "check", path)
    assert checked.rc == 0, checked
    world.installed("dyn.tree", schema)
    world.accepts("dyn.tree", {"child": {"child": {"v": 1}}})
    world.refuses("dyn.tree", {"child": {"v": "x"}}, "at /child/v: ")


# ----------------------------------------------------------------------------------------------
# patterns


def test_pattern_anchors_and_classes_mean_what_json_schema_says(world: World) -> None:
    """T-1: the ``schema`` control is a JSON Schema, whose ``pattern`` is an ECMA-262 regular
    expression: ``$`` ends the string (no trailing newline slips through) and ``\\d`` is
    ``[0-9]``.  A tool author who writes ``^[a-z]+$`` to keep a name to one line relies on it."""
    world.installed("re.anchored", {
        "type": "object",
        "properties": {"id": {"type": "string", "pattern": "^[a-z]+$"},
                       "n": {"type": "string", "pattern": "^\\d+$"}},
    })  # fmt: skip
    world.accepts("re.anchored", {"id": "abc", "n": "12"})
    world.refuses("re.anchored", {"id": "abc\n"}, "at /id: ")
    world.refuses("re.anchored", {"n": "\u0661\u0662"}, "at /n: ")


def backtracking_tool(world: World, name: str) -> bool:
    """Install ``name`` with the pattern ``^(a+)+$``: True when installed (and granted),
    False when install refuses the pattern itself, with a reason and nothing installed."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}
    r = world.install(name, schema)
    assert "Traceback" not in r.err, r
    if r.rc != 0:
        assert "pattern" in r.err and world.absent(name), r
        return False
    for policy in (world.storage / f"tool/{name}.d/policy",
                   world.storage / f"agent/{AGENT}.d/policy"):  # fmt: skip
        with policy.open("a") as f:
            f.write(f"allow {LABEL} tool:{name} execute\n")
    return True


def test_a_backtracking_pattern_does_not_hang_a_native_call(world: World) -> None:
    """T-3, docs/tools.md (``--timeout``): a pattern that backtracks on the input must give a
    bounded answer - refused at install, or the call ended (a refusal, ETIMEDOUT) well within
    a few times its timeout - not a runner spinning for hours."""
    if not backtracking_tool(world, "re.slow"):
        return
    argv = [*CTX_ARGV, "run", "--native", "--timeout", "1", "--agent", AGENT, "re.slow"]
    data = json.dumps({"s": BACKTRACKING_INPUT}).encode()
    r = bounded(argv, world.env, data, HANG_DEADLINE)
    assert r is not None, f"ctx run --native did not end within {HANG_DEADLINE}s"
    assert "Traceback" not in r.err, r
    assert json.loads(r.lines()[-1])["status"] == "error", r


def test_a_backtracking_pattern_does_not_hang_a_worker_past_its_job_timeout(
    world: World,
) -> None:
    """W-4: "Per-job timeout; a job that exceeds it is killed ... and finished as failed"
    (docs/workers.md: ``--timeout`` bounds each job).  With ``--timeout 1`` the worker must
    finish such a job as failed within a few seconds (or install must have refused the
    pattern)."""
    if not backtracking_tool(world, "re.slowjob"):
        return
    job = world.queue.publish({"tool": "re.slowjob", "input": {"s": BACKTRACKING_INPUT}},
                              name="slow")  # fmt: skip
    argv = [*CTX_ARGV, "queue", "work", "--project", "proj", "--agent", AGENT, "--drain",
            "--timeout", "1"]  # fmt: skip
    r = bounded(argv, world.env, b"", HANG_DEADLINE)
    assert r is not None, f"the worker did not finish the job within {HANG_DEADLINE}s"
    assert r.rc == 0 and "Traceback" not in r.err, r
    state, _ = world.queue.only_result(job)
    assert state == "failed"
