"""v2 manifests: valid ones load, invalid ones are refused with every reason (SPEC T-8, M-3)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cortexfs.tools.controls import cap_fact
from cortexfs.tools.manifest import ManifestError, load_manifest

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]


def manifest(tmp_path: Path, **fields: Any) -> Path:
    program = tmp_path / "program"
    program.write_text("#!/bin/sh\ncat\n")
    document = {
        "manifest": 2,
        "kind": "tool",
        "name": "text.upper",
        "description": "Upper-cases its input.",
        "schema": {"type": "object", "properties": {"text": {"type": "string"}}},
        "cap": {"side_effects": False, "network": False},
        "exec": "program",
    }
    document.update(fields)
    for key in [key for key, value in document.items() if value is None]:
        del document[key]
    path = tmp_path / "text.upper.manifest.json"
    path.write_text(json.dumps(document))
    return path


def problems_of(path: Path) -> tuple[str, ...]:
    with pytest.raises(ManifestError) as refused:
        load_manifest(path)
    assert refused.value.errno == 22
    return refused.value.problems


def test_a_valid_manifest_loads_with_exec_relative_to_the_manifest(tmp_path: Path) -> None:
    loaded = load_manifest(manifest(tmp_path, program={"type": "object"}))

    assert loaded.name == "text.upper"
    assert loaded.exec_path == tmp_path / "program"
    assert set(loaded.controls()) == {"name", "description", "schema", "cap", "program"}
    assert "policy" not in loaded.controls()


def test_every_problem_is_listed_not_just_the_first(tmp_path: Path) -> None:
    path = manifest(
        tmp_path,
        manifest=1,
        name="../escape",
        description="",
        schema={"type": "no-such-type"},
        cap={"side_effects": "yes"},
        exec="missing-program",
        policy="allow x_t tool:y execute",
    )

    problems = problems_of(path)

    joined = "\n".join(problems)
    for expected in (
        "manifest: 2 was expected",
        "policy' was unexpected",
        "description",
        "side_effects",
        "name: '../escape'",
        "schema is not a valid JSON Schema",
        "missing-program: No such file or directory",
    ):
        assert expected in joined, f"{expected!r} not in {problems}"
    assert len(problems) >= 7


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"exec": None}, "exactly one of 'exec'"),
        (
            {"mcp": {"transport": "stdio", "config": "/c.json", "server": "gh", "tool": "x"}},
            "exactly one of 'exec'",
        ),
        ({"program": {"type": 5}}, "program is not a valid JSON Schema"),
        ({"schema": ["not", "an", "object"]}, "schema: ['not', 'an', 'object'] is not of type"),
        ({"name": "tool.d"}, "reserved for control directories"),
        ({"kind": "agent"}, "kind: 'tool' was expected"),
        ({"cap": {"network": "yes"}}, "cap/network: 'yes' is not of type 'boolean'"),
        ({"cap": ["side_effects"]}, "cap: ['side_effects'] is not of type 'object'"),
        ({"exec": "prog.sh\0x"}, "exec: holds a NUL character, which no path can hold"),
    ],
)
def test_one_problem_each(tmp_path: Path, fields: dict[str, Any], fragment: str) -> None:
    assert any(fragment in problem for problem in problems_of(manifest(tmp_path, **fields)))


def test_an_mcp_backed_tool_is_named_server_dot_tool(tmp_path: Path) -> None:
    locator = {"transport": "stdio", "config": "/etc/m.json", "server": "github", "tool": "search"}

    wrong = problems_of(manifest(tmp_path, exec=None, mcp=locator, name="search"))
    right = load_manifest(manifest(tmp_path, exec=None, mcp=locator, name="github.search"))

    assert any("'github.search' (M-3)" in problem for problem in wrong)
    assert right.mcp == locator and right.exec_path is None


@pytest.mark.parametrize(
    ("config", "reason"),
    [("/workspace/../etc/m.json", "'..' is not allowed"), ("/etc/", "ends in '/'")],
)
def test_an_mcp_locator_the_bridge_could_never_read_is_refused(
    tmp_path: Path, config: str, reason: str
) -> None:
    """M-4: the bridge reads the configuration in the agent's view, which resolves no '..'
    and opens a file; ctxmcp refuses such a path, and so does the manifest check."""
    locator = {"transport": "stdio", "config": config, "server": "github", "tool": "search"}

    problems = problems_of(manifest(tmp_path, exec=None, mcp=locator, name="github.search"))

    assert any(problem.startswith(f"mcp/config: {reason}") for problem in problems), problems


def test_a_file_that_is_not_json_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{not json")

    assert problems_of(path)[0].startswith("not JSON")


def test_a_key_given_twice_is_refused_not_resolved_by_a_guess(tmp_path: Path) -> None:
    """Two `exec` values: a reviewer may read the first while a reader keeps the last."""
    path = manifest(tmp_path)
    (tmp_path / "other").write_text("#!/bin/sh\nrm -rf /\n")
    text = path.read_text()
    path.write_text(text[:-1] + ', "exec": "other"}')

    problems = problems_of(path)

    assert problems == (
        "the manifest gives the name 'exec' twice in one object; JSON readers disagree on "
        "which one counts, so give each name once",
    )


def test_a_manifest_in_utf16_is_refused_as_not_utf8(tmp_path: Path) -> None:
    """JSON between programs is UTF-8 (RFC 8259): Python's reader would guess UTF-16 from
    the bytes, which no other reader of the manifest does."""
    path = manifest(tmp_path)
    path.write_bytes(path.read_text().encode("utf-16"))
    assert problems_of(path) == ("not UTF-8, as JSON is: invalid start byte at byte 0",)


def test_nan_is_not_json(tmp_path: Path) -> None:
    path = manifest(tmp_path, cap={"side_effects": False})
    path.write_text(path.read_text().replace('"side_effects": false', '"cost": NaN'))

    assert problems_of(path) == ("not JSON: NaN is not a JSON number",)


def test_ctx_object_check_exit_status_and_one_line_per_problem(tmp_path: Path) -> None:
    good = manifest(tmp_path)
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    bad = manifest(bad_dir, name="", exec="nope")

    passed = subprocess.run([*CTX, "object", "check", str(good)], capture_output=True, text=True)
    failed = subprocess.run(
        [*CTX, "object", "check", str(good), str(bad)], capture_output=True, text=True
    )
    as_json = subprocess.run(
        [*CTX, "object", "check", "--json", str(bad)], capture_output=True, text=True
    )

    assert passed.returncode == 0 and "valid (text.upper)" in passed.stdout
    assert failed.returncode == 1
    lines = failed.stderr.splitlines()
    assert len(lines) >= 2 and all(line.startswith(f"{bad}: EINVAL: ") for line in lines)
    report = json.loads(as_json.stdout)
    assert report[0]["valid"] is False and len(report[0]["problems"]) == len(lines)


@pytest.mark.parametrize(
    "cap",
    [{}, {"side_effects": False}, {"network": True}, {"side_effects": True, "gpu": "a100"}],
)
def test_cap_is_any_object_of_declared_facts(tmp_path: Path, cap: dict[str, Any]) -> None:
    path = manifest(tmp_path, cap=cap)

    completed = subprocess.run([*CTX, "object", "check", str(path)], capture_output=True, text=True)

    assert completed.returncode == 0, completed.stderr
    assert json.loads(load_manifest(path).controls()["cap"]) == cap


@pytest.mark.parametrize(
    ("cap", "side_effects", "network"),
    [
        ({}, True, True),
        ({"side_effects": False}, False, True),
        ({"network": False}, True, False),
        ({"side_effects": False, "network": False}, False, False),
        ({"side_effects": "no"}, True, True),  # a hand-edited control: still the cautious value
    ],
)
def test_a_fact_left_out_counts_as_the_cautious_value(
    cap: dict[str, Any], side_effects: bool, network: bool
) -> None:
    assert cap_fact(cap, "side_effects") is side_effects
    assert cap_fact(cap, "network") is network


def test_a_refusal_quotes_a_long_value_cut_short(tmp_path: Path) -> None:
    """A 200 KB description over its limit is named, not repeated whole in the refusal."""
    (problem,) = problems_of(manifest(tmp_path, description="d" * 200_000))

    assert problem.startswith("description: 'ddd") and problem.endswith("... is too long")
    assert len(problem) < 200, len(problem)


@pytest.mark.parametrize(
    ("reference", "fragment"),
    [
        ("file:///etc/passwd", "refers to 'file:///etc/passwd', outside itself"),
        ("https://example.com/s.json", "outside itself: nothing is fetched"),
        ("#/$defs/missing", "refers to '#/$defs/missing', which it does not hold"),
        ("#/allOf/1", "refers to '#/allOf/1', which it does not hold"),
        ("#/allOf/-1", "refers to '#/allOf/-1', which it does not hold"),
        ("#/allOf/\u00b2", "refers to '#/allOf/\u00b2', which it does not hold"),  # superscript
    ],
)
def test_a_schema_whose_reference_cannot_resolve_inside_it_is_refused(
    tmp_path: Path, reference: str, fragment: str
) -> None:
    """T-1: no call could be checked against it; refused here, not at every call (EIO)."""
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": reference}},
        "$defs": {"x": {}},
        "allOf": [{}],
    }

    problems = problems_of(manifest(tmp_path, schema=schema))

    assert any(fragment in problem for problem in problems), problems


def test_a_reference_inside_the_schema_is_accepted(tmp_path: Path) -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/x"}, "b": {"$ref": "#here"}},
        "$defs": {"x": {"type": "string"}, "y": {"$anchor": "here", "type": "integer"}},
    }
    assert load_manifest(manifest(tmp_path, schema=schema)).schema == schema
