"""A core tool checks its own input against its manifest's schema in every mode (SPEC T-3, R-5).

``ctx run --native`` checks the schema before it starts a tool; a terminal call, a person
running the program, or ``ctx tool`` do not.  So each core tool program refuses, whatever the
mode, a missing required key, an unknown key or a mistyped value — EINVAL, exit 2, before it
does anything — and the shorthands of the terminal (``fs.read PATH``, ``fs.write PATH <
FILE``, ``tsh.config key=value``) keep working.  Every program here is the one a freshly
bootstrapped storage root holds, run as a user would run it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cortexfs import storage
from cortexfs.tools.core import CORE_TOOLS, tsh_config
from cortexfs.tools.core.toolio import core_schema
from tests.tools.support import World

MODES = ["terminal", "native"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("core-input") / "storage"
    report = storage.bootstrap(root)
    assert not report.problems, report.problems
    return root


def call(
    root: Path,
    tool: str,
    *arguments: str,
    mode: str = "terminal",
    stdin: bytes | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """The core tool program of ``root`` run directly; stdin is ``stdin``, or /dev/null."""
    env = {"PATH": "/usr/bin:/bin", **({"CTX_MODE": "native"} if mode == "native" else {})}
    return subprocess.run(
        [str(root / "tool" / tool), *arguments],
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        env=env,
        timeout=60,
    )


def refused_as_input(done: subprocess.CompletedProcess[bytes], tool: str, *named: str) -> None:
    stderr = done.stderr.decode()
    assert done.returncode == 2, (done.returncode, stderr)
    assert stderr.startswith(f"{tool}: EINVAL: "), stderr
    for name in named:
        assert repr(name) in stderr, stderr


@pytest.fixture
def kept(tmp_path: Path) -> Path:
    path = tmp_path / "k.txt"
    path.write_text("keep\n")
    return path


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({}, ["content"]),
        ({"contnet": "x"}, ["content", "contnet"]),
        ({"encoding": "utf-8"}, ["content"]),
    ],
    ids=["no-content", "misspelled-content", "encoding-only"],
)
def test_fs_write_without_content_is_einval_and_leaves_the_file_alone(
    root: Path, kept: Path, mode: str, given: dict[str, str], named: list[str]
) -> None:
    """Reported: `fs.write '{"path": …}'` emptied the file and said it wrote 0 bytes."""
    done = call(root, "fs.write", json.dumps({"path": str(kept), **given}), mode=mode)

    refused_as_input(done, "fs.write", *named)
    assert kept.read_text() == "keep\n"
    assert sorted(os.listdir(kept.parent)) == ["k.txt"]


@pytest.mark.parametrize("stdin", [None, b""], ids=["devnull", "empty-pipe"])
def test_fs_write_path_with_nothing_on_stdin_is_einval_and_leaves_the_file_alone(
    root: Path, kept: Path, stdin: bytes | None
) -> None:
    done = call(root, "fs.write", str(kept), stdin=stdin)

    refused_as_input(done, "fs.write", "content")
    assert "fs.write PATH < FILE" in done.stderr.decode()
    assert kept.read_text() == "keep\n"


def test_fs_write_path_takes_its_contents_from_stdin(root: Path, tmp_path: Path) -> None:
    """The documented shorthand `fs.write notes.txt < draft.txt`, text or any other bytes."""
    text, binary = tmp_path / "notes.txt", tmp_path / "blob"

    wrote_text = call(root, "fs.write", str(text), stdin="draft ✓\n".encode())
    wrote_binary = call(root, "fs.write", str(binary), stdin=b"\xff\x00\xfe")
    empty = call(root, "fs.write", json.dumps({"path": str(tmp_path / "e"), "content": ""}))

    assert wrote_text.returncode == 0, wrote_text.stderr
    assert wrote_text.stdout == f"wrote 10 bytes to {text}\n".encode()
    assert text.read_text() == "draft ✓\n"
    assert wrote_binary.returncode == 0 and binary.read_bytes() == b"\xff\x00\xfe"
    assert empty.returncode == 0 and (tmp_path / "e").read_bytes() == b""


def test_ctx_run_terminal_fs_write_with_nothing_on_stdin_leaves_the_file_alone(
    world: World,
) -> None:
    """Through the runner in terminal mode, as an agent: the same refusal, exit 2."""
    world.agent("coder", tools=["fs.write"])
    world.allow_tool("fs.write")
    notes = world.workspace / "notes.txt"
    notes.write_text("keep\n")
    command = [sys.executable, "-m", "cortexfs", "--storage", str(world.root), "run"]
    command += ["--agent", "coder", "fs.write", "notes.txt"]

    done = subprocess.run(
        command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60
    )
    piped = subprocess.run(command, input="new\n", capture_output=True, text=True, timeout=60)

    assert done.returncode == 2 and "fs.write: EINVAL: 'content' is required" in done.stderr
    assert piped.returncode == 0, piped.stderr
    assert notes.read_text() == "new\n"


# For each core tool: an input its schema accepts (none of them acts on this test's world
# beyond a scratch directory: agent.* refuse later, without the runner's capability).
VALID = {
    "fs.read": {"path": "{dir}/k.txt"},
    "fs.list": {"path": "{dir}"},
    "fs.stat": {"path": "{dir}"},
    "fs.write": {"path": "{dir}/k.txt", "content": "overwritten"},
    "shell.exec": {"cmd": "touch ran", "cwd": "{dir}"},
    "tsh.config": {"set": {"cache_capacity": 3}},
    "agent.update": {"control": "system.md", "content": "x"},
    "agent.create": {"name": "child", "label": "child_t"},
}


def _filled(request: dict[str, object], directory: Path) -> dict[str, object]:
    return json.loads(json.dumps(request).replace("{dir}", str(directory)))


def test_every_core_tool_has_a_case_here() -> None:
    assert sorted(VALID) == sorted(CORE_TOOLS)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tool", sorted(VALID))
def test_an_unknown_key_is_refused_by_every_core_tool_before_it_acts(
    root: Path, kept: Path, tool: str, mode: str
) -> None:
    """Reported: `"overwrit": false` overwrote, `{"pth": "/etc"}` listed the working
    directory, `"cdw"` ran the command elsewhere, `{"sett": …}` said nothing and changed
    nothing.  Each names the key it does not know."""
    config = root / "tool" / "tsh.d" / "config"
    request = {**_filled(VALID[tool], kept.parent), "bogus_key": False}

    done = call(root, tool, json.dumps(request), mode=mode)

    refused_as_input(done, tool, "bogus_key")
    assert kept.read_text() == "keep\n"
    assert not (kept.parent / "ran").exists()
    assert config.read_text() == tsh_config.DEFAULT_TEXT
    if mode == "native":
        assert json.loads(done.stdout)["error"] == "EINVAL"


@pytest.mark.parametrize(
    ("tool", "request_", "named"),
    [
        ("fs.write", {"path": "{dir}/k.txt", "content": "x", "overwrit": False}, "overwrit"),
        ("fs.list", {"pth": "/etc"}, "pth"),
        ("shell.exec", {"cmd": "touch ran", "cdw": "/"}, "cdw"),
        ("tsh.config", {"sett": {"cache_capacity": 3}}, "sett"),
        ("tsh.config", {"set": {"cache_capacty": 3}}, "cache_capacty"),
        ("fs.read", {}, "path"),
        ("shell.exec", {"cwd": "{dir}"}, "cmd"),
    ],
)
def test_the_reported_misspellings_are_refused(
    root: Path, kept: Path, tool: str, request_: dict[str, object], named: str
) -> None:
    done = call(root, tool, json.dumps(_filled(request_, kept.parent)))

    refused_as_input(done, tool, named)
    assert kept.read_text() == "keep\n"
    assert not (kept.parent / "ran").exists()


def test_ctx_tool_tsh_config_refuses_an_unknown_key_too(root: Path) -> None:
    config = root / "tool" / "tsh.d" / "config"
    command = [sys.executable, "-m", "cortexfs", "--storage", str(root), "tool", "tsh.config"]

    done = subprocess.run(
        [*command, '{"sett": {"cache_capacity": 3}}'], capture_output=True, text=True, timeout=60
    )

    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("ctx: EINVAL: tsh.config: ") and "'sett'" in done.stderr
    assert config.read_text() == tsh_config.DEFAULT_TEXT


@pytest.mark.parametrize(
    ("tool", "arguments", "stdout"),
    [
        ("fs.read", ["{dir}/k.txt"], b"keep\n"),
        ("fs.stat", ["{dir}/k.txt"], b"path: {dir}/k.txt\n"),
        ("fs.list", ["{dir}"], b"k.txt\n"),
        ("fs.list", [], None),
        ("fs.list", ["{}"], None),
        ("shell.exec", ["echo hi"], b"hi\n"),
        ("tsh.config", [], b"max_loaded_tools=64\n"),
    ],
)
def test_the_documented_forms_still_work(
    root: Path, kept: Path, tool: str, arguments: list[str], stdout: bytes | None
) -> None:
    filled = [argument.replace("{dir}", str(kept.parent)) for argument in arguments]

    done = call(root, tool, *filled)

    assert done.returncode == 0, done.stderr
    if stdout is not None:
        assert done.stdout.startswith(stdout.replace(b"{dir}", bytes(kept.parent)))


# The keywords of a core tool's schema that toolio.check_input reads (the top level and each
# property's "type"), and those that only describe; the finer rules of a value (an enum, a
# bound) are the tool's own checks.
CHECKED = {"type", "properties", "required", "additionalProperties"}
DESCRIBING = {"title", "description"}


@pytest.mark.parametrize("tool", sorted(CORE_TOOLS))
def test_the_check_and_the_schema_control_are_one_schema(root: Path, tool: str) -> None:
    """The program checks against its manifest, which bootstrap writes the control from; and
    the schema states the keys of the input with the keywords the check reads, so no rule
    about which keys there are or what type each is escapes it."""
    control = json.loads((root / "tool" / f"{tool}.d" / "schema").read_text())

    assert core_schema(tool) == control
    assert control["type"] == "object" and control["additionalProperties"] is False
    assert set(control) <= CHECKED | DESCRIBING
    for key, rules in control["properties"].items():
        assert isinstance(rules, dict), key
        assert "type" in rules or "enum" in rules, key


def test_a_value_of_the_wrong_type_is_named(root: Path, kept: Path) -> None:
    done = call(root, "fs.read", json.dumps({"path": str(kept), "offset": "1", "length": 2.0}))

    refused_as_input(done, "fs.read", "offset")
    assert "'offset' must be of type integer" in done.stderr.decode()
    assert "length" not in done.stderr.decode()  # 2.0 is an integer, to JSON Schema


def test_a_value_only_the_tool_checks_is_named_in_json_words(root: Path, tmp_path: Path) -> None:
    """``encoding``'s schema is an enum, no type, so the schema check lets a number through
    to the tool, whose refusal names the JSON type as the schema check's would."""
    target = tmp_path / "e.txt"
    done = call(root, "fs.write", json.dumps({"path": str(target), "content": "x", "encoding": 5}))

    refused_as_input(done, "fs.write", "encoding")
    assert done.stderr.decode() == "fs.write: EINVAL: 'encoding' must be of type string\n"
    assert not target.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may keep another user's ownership")
def test_fs_write_run_by_root_over_another_users_file_leaves_it_theirs(
    root: Path, tmp_path: Path
) -> None:
    """Root replaces a file as GNU sed -i does: the new content keeps the owner, the group
    and the permission bits of the file it replaces."""
    path = tmp_path / "theirs.txt"
    path.write_text("old\n")
    os.chown(path, 4242, 4343)
    path.chmod(0o640)

    request = {"path": str(path), "content": "new\n"}
    done = call(root, "fs.write", stdin=json.dumps(request).encode())

    assert done.returncode == 0, done.stderr
    status = path.stat()
    assert (status.st_uid, status.st_gid, status.st_mode & 0o7777) == (4242, 4343, 0o640)
    assert path.read_text() == "new\n"
