"""``ctxmcp list`` and ``ctxmcp project`` (SPEC §10, M-1 … M-4 with R-3) driven by a careless
or hostile MCP client configuration and output directory, with real stdio servers: a
configuration that is a FIFO, a link (dangling, looping, to ``/dev/zero``), a directory,
sparse gigabytes, not JSON or JSON of the wrong shape, entries whose command, arguments,
environment or cwd hold bytes no process can be given, a bare or ``./`` command next to a
planted program, secrets in ``env`` and ``args`` that must stay out of candidates, locators
and every error; server names that are no legal prefix or absent; names at R-3's 64-byte
limit and repeated across pages; an ``--out`` that is a link, a dangling link, a FIFO, below a
file, not writable, holding earlier candidates or planted links at a candidate's name; a
server that dies half-way through its listing and a disk that fills half-way through the
writing.  Throughout, M-1 is held strictly: the storage root, ``HOME``, ``TMPDIR`` and the
working directory are compared before and after."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import ROOT_ENTRIES, clean_env, ctx_run, snapshot, wait_for
from tests.acceptance.test_acceptance_mcp import (
    CTXMCP,
    RUNTIME_CONFIG,
    VENV_PYTHON,
    ctxmcp,
    project,
    received,
    scripted_config,
    write_json,
)
from tests.support.unwritable import run_with_stdout
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(not CTXMCP.exists(), reason="ctxmcp is not installed in the venv")

SECRET = "sk-cfg-7e2b1c0d9a-must-stay-in-the-config"
OPEN = {"type": "object"}
ECHO = {"name": "echo", "description": "Echo.", "inputSchema": OPEN}
ERROR_LINE = re.compile(r"^ctxmcp: (E[A-Z0-9]+): ", re.MULTILINE)

# A stdio MCP server on raw pipes that pages its listing.  argv[1] is its script (JSON):
#   pages    the tools of each tools/list page (the cursor is the next page's index)
#   die_at   the page during which it writes half a response and exits with status 9
#   starts   a file each start of the server is appended to
PAGED_SERVER = r"""
import json, os, sys

SCRIPT = json.loads(sys.argv[1])
with open(SCRIPT["starts"], "a") as starts:
    starts.write(f"{os.getpid()}\n")
for line in sys.stdin:
    message = json.loads(line)
    if "id" not in message:
        continue
    if message["method"] == "initialize":
        result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}},
                  "serverInfo": {"name": "paged", "version": "1"}}
    elif message["method"] == "tools/list":
        page = int(message.get("params", {}).get("cursor") or 0)
        if page == SCRIPT.get("die_at"):
            sys.stdout.write('{"jsonrpc": "2.0", "id": %d, "result": {"tools": [{"name": '
                             % message["id"])
            sys.stdout.flush()
            os._exit(9)
        result = {"tools": SCRIPT["pages"][page]}
        if page + 1 < len(SCRIPT["pages"]):
            result["nextCursor"] = str(page + 1)
    else:
        reply = {"jsonrpc": "2.0", "id": message["id"],
                 "error": {"code": -32601, "message": "no such method"}}
        print(json.dumps(reply), flush=True)
        continue
    print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
"""


# ---------------------------------------------------------------------------------- helpers


def tool(name: str, **fields) -> dict:
    return {"name": name, "description": f"The tool {name}.", "inputSchema": OPEN, **fields}


def paged_config(
    directory: Path, pages: list[list], die_at: int | None = None
) -> tuple[Path, Path]:
    """A configuration whose server ``p`` pages ``pages`` (and dies during page ``die_at``),
    holding a secret in its environment and arguments; and the file of its starts."""
    (directory / "paged_server.py").write_text(PAGED_SERVER)
    starts = directory / "starts.txt"
    script = {"pages": pages, "die_at": die_at, "starts": str(starts)}
    entry = {
        "command": str(VENV_PYTHON),
        "args": [str(directory / "paged_server.py"), json.dumps(script), f"--token={SECRET}"],
        "env": {"API_TOKEN": SECRET},
    }
    return write_json(directory / "paged.mcp.json", {"mcpServers": {"p": entry}}), starts


def starts_of(starts: Path) -> int:
    return len(starts.read_text().split()) if starts.exists() else 0


def edit_entry(config: Path, server: str, **fields) -> Path:
    """Set ``fields`` in the entry of ``server`` of ``config``."""
    document = json.loads(config.read_text())
    document["mcpServers"][server].update(fields)
    return write_json(config, document)


def marker_entry(marker: Path) -> dict:
    """An entry that would leave ``marker`` if anything started it."""
    return {"command": "/bin/sh", "args": ["-c", f"touch {marker}"], "env": {"T": SECRET}}


def errno_of(stderr: str) -> str | None:
    found = ERROR_LINE.findall(stderr)
    return found[-1] if found else None


def leftovers(directory: Path) -> list[str]:
    """Temporary or half-written files a projection may have left in ``directory``."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".") or "tmp" in p.name)


def raw_controls(text: str) -> list[str]:
    """Characters a terminal would act on (line breaks and tabs of the output aside)."""
    return sorted({c for c in text if c not in "\n\t" and not c.isprintable()})


# =========================================================== the configuration file itself


def test_a_config_that_is_a_fifo_is_refused_at_once_instead_of_waiting_for_a_writer(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "mcp.json"
    os.mkfifo(fifo)
    proc = subprocess.Popen(
        [str(CTXMCP), "list", "--config", str(fifo), "--server", "s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        ended = wait_for(lambda: proc.poll() is not None, 1.5)
    finally:
        if proc.poll() is None:
            # A writer that comes and goes ends the blocked open(): EOF, then a refusal.
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            if not wait_for(lambda: proc.poll() is not None, 5):
                proc.kill()
        _, stderr = proc.communicate(timeout=10)

    assert ended, "ctxmcp still waits on the FIFO after 1.5 s"
    assert proc.returncode == 2, stderr
    assert errno_of(stderr), stderr


def test_a_config_reached_through_a_link_is_read_and_broken_links_are_named(
    tmp_path: Path,
) -> None:
    """A configuration kept elsewhere and linked in works like the file itself; a dangling
    link and a loop of links are usage errors naming ENOENT and ELOOP, and nothing starts."""
    config, record = scripted_config(tmp_path, "s", tools=[ECHO])
    linked = tmp_path / "linked.json"
    linked.symlink_to(config)
    (tmp_path / "dangling.json").symlink_to(tmp_path / "gone.json")
    (tmp_path / "loop-a.json").symlink_to(tmp_path / "loop-b.json")
    (tmp_path / "loop-b.json").symlink_to(tmp_path / "loop-a.json")

    listed = ctxmcp("list", "--config", linked, "--server", "s")
    assert listed.returncode == 0, listed
    assert listed.stdout.split("\t")[0] == "s.echo", listed
    assert len([m for m in received(record) if m.get("method") == "initialize"]) == 1

    for name, code in (("dangling.json", "ENOENT"), ("loop-a.json", "ELOOP")):
        refused = ctxmcp("list", "--config", tmp_path / name, "--server", "s")
        assert refused.returncode == 2, refused
        assert errno_of(refused.stderr) == code, refused
        assert name in refused.stderr
    assert len([m for m in received(record) if m.get("method") == "initialize"]) == 1
    assert linked.is_symlink() and os.readlink(linked) == str(config)


def test_a_config_past_one_mib_is_refused_without_being_read_whole(tmp_path: Path) -> None:
    """A configuration of exactly 1 MiB is read; one byte more or a sparse file of 8 GiB is
    EINVAL, exit 2, promptly, and its server never starts; so is a link to /dev/zero, which
    is no regular file and is never read."""
    marker = tmp_path / "started"
    body = json.dumps({"mcpServers": {"s": marker_entry(marker)}}).encode()
    exact = tmp_path / "exact.json"
    exact.write_bytes(body + b" " * (1024 * 1024 - len(body)))
    over = tmp_path / "over.json"
    over.write_bytes(exact.read_bytes() + b" ")
    sparse = tmp_path / "sparse.json"
    with open(sparse, "wb") as handle:
        handle.write(body)
        handle.truncate(8 * 1024**3)
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")

    for config in (over, sparse, zero):
        refused = ctxmcp("list", "--config", config, "--server", "s")
        assert refused.returncode == 2, refused
        assert errno_of(refused.stderr) == "EINVAL", refused
        why = "not a regular file" if config == zero else "larger than 1048576 bytes"
        assert why in refused.stderr, refused
        assert not marker.exists()

    read = ctxmcp("list", "--config", exact, "--server", "s")
    assert errno_of(read.stderr) == "EIO", read  # read whole, started, and the shell exited
    assert marker.exists()


MARKER = "@MARKER@"  # replaced by an entry that would leave a marker if started
UNUSABLE_CONFIGS = {
    "directory": None,
    "binary": "\udcff\udcfe\x00\x01",
    "nan": '{"mcpServers": {"s": @MARKER@}, "n": NaN}',
    "name-twice": '{"mcpServers": {"s": @MARKER@, "s": @MARKER@}}',
    "top-level-list": '[{"mcpServers": {"s": @MARKER@}}]',
    "entry-a-string": '{"mcpServers": {"s": "/bin/sh -c touch @SECRET@"}}',
    "empty-command": '{"mcpServers": {"s": {"command": "", "env": {"T": "@SECRET@"}}}}',
    "args-holding-a-number": '{"mcpServers": {"s": {"command": "/x", "args": ["@SECRET@", 1]}}}',
    "env-number": '{"mcpServers": {"s": {"command": "/", "env": {"T": "@SECRET@", "N": 0}}}}',
    "remote-entry": '{"mcpServers": {"s": {"url": "https://@SECRET@@example.org/mcp"}}}',
}


@pytest.mark.parametrize("case", sorted(UNUSABLE_CONFIGS))
def test_a_config_that_is_no_usable_json_object_is_a_usage_error(tmp_path: Path, case: str) -> None:
    """docs/tools.md: "2 a configuration or server name that cannot be used"; the refusal
    names EINVAL (also as the --json error object), carries no traceback, echoes no value of
    the file (its secrets), makes no OUT and starts nothing."""
    marker = tmp_path / "started"
    config = tmp_path / "mcp.json"
    text = UNUSABLE_CONFIGS[case]
    if text is None:
        config.mkdir()
    else:
        text = text.replace(MARKER, json.dumps(marker_entry(marker))).replace("@SECRET@", SECRET)
        config.write_bytes(text.encode("utf-8", "surrogateescape"))
    out = tmp_path / "out"

    refused = project(config, "s", out, "--json")

    assert refused.returncode == 2, refused
    assert errno_of(refused.stderr) == "EINVAL", refused
    assert json.loads(refused.stdout)["error"] == "EINVAL"
    assert "Traceback" not in refused.stderr
    assert SECRET not in refused.stdout + refused.stderr
    assert not marker.exists()
    assert not out.exists()


SPAWN_BREAKERS = {
    "nul-in-command": {"command": "/bin/s\u0000h"},
    "nul-in-an-env-value": {"env": {"API_TOKEN": f"{SECRET}\u0000"}},
    "lone-surrogate-in-an-env-value": {"env": {"API_TOKEN": f"{SECRET}\ud800"}},
    "equals-sign-in-an-env-name": {"env": {"API=TOKEN": SECRET}},
    "nul-in-cwd": {"cwd": "/tmp\u0000"},
}


@pytest.mark.parametrize("case", sorted(SPAWN_BREAKERS))
def test_an_entry_no_process_can_be_started_with_is_einval_without_a_traceback(
    tmp_path: Path, case: str
) -> None:
    marker = tmp_path / "started"
    config = write_json(tmp_path / "mcp.json", {"mcpServers": {"s": marker_entry(marker)}})
    edit_entry(config, "s", **SPAWN_BREAKERS[case])

    refused = ctxmcp("list", "--config", config, "--server", "s")

    assert "Traceback" not in refused.stderr, refused.stderr[-300:]
    assert refused.returncode == 2, refused
    assert errno_of(refused.stderr) == "EINVAL", refused
    assert SECRET not in refused.stdout + refused.stderr
    assert not marker.exists()


def test_a_bare_command_is_looked_up_on_the_entrys_path_never_in_the_working_directory(
    tmp_path: Path,
) -> None:
    """docs/tools.md: "a command that is not an absolute path is looked up on the PATH of
    that environment": a program of that name planted in the directory ctxmcp runs from is
    not started (ENOENT, exit 1); the same name on the entry's own PATH is."""
    work, bin_dir = tmp_path / "work", tmp_path / "bin"
    work.mkdir()
    bin_dir.mkdir()
    for place in (work, bin_dir):
        program = place / "mcp-srv"
        program.write_text(f"#!/bin/sh\ntouch {place}/ran\nexit 3\n")
        program.chmod(0o755)
    config = write_json(tmp_path / "mcp.json", {"mcpServers": {"s": {"command": "mcp-srv"}}})

    planted = subprocess.run(
        [str(CTXMCP), "list", "--config", str(config), "--server", "s"],
        capture_output=True, text=True, cwd=work, env=clean_env(), timeout=60,
    )  # fmt: skip
    assert planted.returncode == 1, planted
    assert errno_of(planted.stderr) == "ENOENT", planted
    assert not (work / "ran").exists()

    edit_entry(config, "s", env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    found = subprocess.run(
        [str(CTXMCP), "list", "--config", str(config), "--server", "s"],
        capture_output=True, text=True, cwd=work, env=clean_env(), timeout=60,
    )  # fmt: skip
    assert found.returncode == 1 and errno_of(found.stderr) == "EIO", found
    assert "status 3" in found.stderr
    assert (bin_dir / "ran").exists() and not (work / "ran").exists()


def test_a_relative_command_with_a_slash_is_refused_not_run_from_the_callers_directory(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    program = work / "mcp-srv"
    program.write_text(f"#!/bin/sh\ntouch {work}/ran\nexit 3\n")
    program.chmod(0o755)
    config = write_json(tmp_path / "mcp.json", {"mcpServers": {"s": {"command": "./mcp-srv"}}})

    refused = subprocess.run(
        [str(CTXMCP), "list", "--config", str(config), "--server", "s"],
        capture_output=True, text=True, cwd=work, env=clean_env(), timeout=60,
    )  # fmt: skip

    assert not (work / "ran").exists(), "the program in the working directory was run"
    assert refused.returncode == 2, refused
    assert errno_of(refused.stderr) == "EINVAL", refused


# ============================================================================ secrets (M-4)


def test_secrets_of_the_entry_reach_no_candidate_locator_or_message_even_on_failure(
    tmp_path: Path,
) -> None:
    """M-4: "Projection never copies external config or secrets".  The secret, in the
    entry's env and args, stays out of the candidates and their locator on success, and out
    of every message and --json report when the projection is refused (earlier candidate),
    the server cannot start, or dies mid-listing."""
    good = tmp_path / "good"
    good.mkdir()
    config, _ = paged_config(good, [[tool("a"), tool("b")]])
    out = tmp_path / "out"
    outputs: list[subprocess.CompletedProcess] = []

    done = project(config, "p", out, "--json")
    outputs.append(done)
    assert done.returncode == 0, done
    for candidate in sorted(out.iterdir()):
        text = candidate.read_text()
        assert SECRET not in text and "API_TOKEN" not in text and "--token" not in text
        manifest = json.loads(text)
        assert manifest["mcp"] == {
            "transport": "stdio", "config": RUNTIME_CONFIG, "server": "p",
            "tool": manifest["name"].split(".", 1)[1],
        }  # fmt: skip
    outputs.append(project(config, "p", out, "--json"))  # EEXIST: earlier candidates
    dying = tmp_path / "dying"
    dying.mkdir()
    dies, _ = paged_config(dying, [[tool("a")], [tool("b")]], die_at=1)
    outputs.append(project(dies, "p", tmp_path / "out2", "--json"))
    missing = edit_entry(dies, "p", command=str(tmp_path / "no-such-server"))
    outputs.append(ctxmcp("list", "--config", missing, "--server", "p", "--json"))

    assert [o.returncode for o in outputs] == [0, 1, 1, 1], outputs
    assert [errno_of(o.stderr) for o in outputs[1:]] == ["EEXIST", "EIO", "ENOENT"]
    for output in outputs:
        assert SECRET not in output.stdout + output.stderr, output


def test_an_absent_server_is_named_with_the_others_escaped_and_none_of_them_started(
    tmp_path: Path,
) -> None:
    """An absent --server is ENOENT, exit 2; the servers the file does hold are listed with
    their names escaped (a name is text of whoever wrote the file), their secrets are not,
    and none of them is started."""
    hostile = "evil\x1b]0;owned\x07\x1b[2J"
    marker = tmp_path / "started"
    servers = {"time": marker_entry(marker), hostile: marker_entry(marker)}
    config = write_json(tmp_path / "mcp.json", {"mcpServers": servers})

    for command in ("list", "project"):
        extra = ["--runtime-config", RUNTIME_CONFIG, "--out", str(tmp_path / "out")]
        refused = ctxmcp(command, "--config", config, "--server", "github",
                         *(extra if command == "project" else []))  # fmt: skip
        assert refused.returncode == 2, refused
        assert errno_of(refused.stderr) == "ENOENT", refused
        assert "'github'" in refused.stderr and "time" in refused.stderr
        assert "evil\\x1b]0;owned\\x07\\x1b[2J" in refused.stderr, refused
        assert raw_controls(refused.stderr) == [], refused
        assert SECRET not in refused.stderr
    assert not marker.exists() and not (tmp_path / "out").exists()


SERVER_NAMES = ["-rf", "x" * 65, "ok\x1b[2J", "café"]


@pytest.mark.parametrize("name", SERVER_NAMES, ids=repr)
def test_a_server_name_that_is_no_legal_prefix_is_refused_before_anything_starts(
    tmp_path: Path, name: str
) -> None:
    """M-3/R-3: a projected name is <server>.<tool>, so a server name that is no legal
    object name (or holds a dot) can name no tool: EINVAL, exit 2, nothing started, the name
    shown escaped — even when the configuration does hold an entry of that name."""
    marker = tmp_path / "started"
    config = write_json(tmp_path / "mcp.json", {"mcpServers": {name: marker_entry(marker)}})

    refused = project(config, name, tmp_path / "out")

    assert refused.returncode == 2, refused
    assert errno_of(refused.stderr) == "EINVAL", refused
    assert raw_controls(refused.stderr) == [], refused
    assert not marker.exists() and not (tmp_path / "out").exists()


# ================================================================= names the server lists


def test_projected_names_are_held_to_64_bytes_exactly(tmp_path: Path) -> None:
    """R-3: 1 to 64 bytes.  With a server name of 62 bytes, tool ``t`` makes a name of 64
    bytes (written, and ``ctx object check`` accepts it) and ``tt`` one of 65 (reported and
    skipped, M-3: exit 1)."""
    server = "s" * 62
    config, _ = scripted_config(tmp_path, server, tools=[tool("t"), tool("tt")])
    out = tmp_path / "out"

    done = project(config, server, out, "--json")

    assert done.returncode == 1, done
    report = json.loads(done.stdout)
    assert report["written"] == [str(out / f"{server}.t.manifest.json")], report
    assert [entry["tool"] for entry in report["skipped"]] == ["tt"], report
    assert "(M-3)" in report["skipped"][0]["problem"]
    checked = ctx_run("object", "check", out / f"{server}.t.manifest.json")
    assert checked.rc == 0, checked


def test_a_megabyte_tool_name_is_reported_cut_short_not_printed_whole(tmp_path: Path) -> None:
    """A report quotes a name the server gave cut short with its length, once: a tool named
    with a megabyte must not put a megabyte (or two) on the operator's terminal."""
    huge = "n" * 1_000_000
    config, _ = scripted_config(tmp_path, "s", tools=[tool(huge), tool("ok")])

    listed = ctxmcp("list", "--config", config, "--server", "s")
    projected = project(config, "s", tmp_path / "out")

    assert listed.returncode == 0, listed.stderr[-300:]
    assert projected.returncode == 1, projected.stderr[-300:]
    for said in (listed.stdout, projected.stderr):
        assert len(said) < 2_000, said[:300]
        assert "(1000000 characters)" in said and "is 1000002 bytes long" in said, said
    assert projected.stdout.split() == [str(tmp_path / "out" / "s.ok.manifest.json")]


def test_a_name_listed_on_two_pages_is_skipped_for_both_copies_and_nothing_else_is(
    tmp_path: Path,
) -> None:
    """M-3: a name the server lists more than once is skipped for every copy, also when the
    copies come on different pages of a paged listing; the other tools of both pages are
    written."""
    config, _ = paged_config(tmp_path, [[tool("a"), tool("dup")], [tool("dup"), tool("b")]])
    out = tmp_path / "out"

    listed = ctxmcp("list", "--config", config, "--server", "p", "--json")
    done = project(config, "p", out, "--json")

    assert listed.returncode == 0, listed
    names = [(entry["tool"], entry["name"]) for entry in json.loads(listed.stdout)["tools"]]
    assert names == [("a", "p.a"), ("dup", None), ("dup", None), ("b", "p.b")], names
    assert done.returncode == 1, done
    report = json.loads(done.stdout)
    assert [entry["tool"] for entry in report["skipped"]] == ["dup", "dup"], report
    assert sorted(p.name for p in out.iterdir()) == ["p.a.manifest.json", "p.b.manifest.json"]


def test_control_bytes_and_huge_descriptions_reach_the_terminal_only_escaped(
    tmp_path: Path,
) -> None:
    """A server's names and descriptions holding C0 and C1 controls, DEL, a bidi override
    and line separators, one description of 300 kB: ``list`` and ``project`` show them escaped
    (plain text) or ASCII-escaped (--json), the long description is cut to the 8192
    characters a manifest holds, with a note, and its candidate passes ``ctx object
    check``."""
    nasty = "\x1b]0;owned\x07\x9b2J\x7f\u202e\u2028"
    tools = [
        tool(f"bad{nasty}", description=nasty),
        tool("long", description=f"first{nasty}line\n" + "D" * 300_000),
        tool("plain", description=f"Plain{nasty}."),
    ]
    config, _ = scripted_config(tmp_path, "s", tools=tools)
    out = tmp_path / "out"

    listed = ctxmcp("list", "--config", config, "--server", "s")
    listed_json = ctxmcp("list", "--config", config, "--server", "s", "--json")
    done = project(config, "s", out)

    assert listed.returncode == 0 and listed_json.returncode == 0, (listed, listed_json)
    assert done.returncode == 1, done  # the bad name is skipped
    for text in (listed.stdout, listed.stderr, listed_json.stdout, done.stdout, done.stderr):
        assert raw_controls(text) == [], raw_controls(text)
    assert listed_json.stdout.isascii()
    assert len(listed.stdout) < 10_000  # the first line of each description, not 300 kB
    assert "ctxmcp: note: s.long: its description of " in done.stderr
    assert "ctxmcp: skipped bad\\x1b]0;owned\\x07\\x9b2J\\x7f\\u202e\\u2028: " in done.stderr
    long = json.loads((out / "s.long.manifest.json").read_text())
    assert long["description"].startswith(f"first{nasty}line\n")
    assert len(long["description"]) == 8192
    assert json.loads((out / "s.plain.manifest.json").read_text())["description"] == (
        f"Plain{nasty}."
    )
    checked = ctx_run(
        "object", "check", out / "s.long.manifest.json", out / "s.plain.manifest.json"
    )
    assert checked.rc == 0, checked


# ========================================================================= --runtime-config


@pytest.mark.parametrize(
    "runtime",
    ["~/.mcp.json", "/mcp/./../mcp.json", b"/mcp/\xff.json"],
    ids=repr,
)
def test_a_runtime_config_the_bridge_could_not_read_is_refused_before_anything_starts(
    tmp_path: Path, runtime: str | bytes
) -> None:
    """M-4: the locator's config is "the visible absolute config path": a relative one (a
    ``~`` is not expanded), one with ``..`` or a trailing ``/``, or bytes that are not UTF-8
    (a manifest is UTF-8 text) is EINVAL, exit 2, before the server starts and OUT is made."""
    config, record = scripted_config(tmp_path, "s", tools=[ECHO])
    out = tmp_path / "deep" / "out"
    given = os.fsdecode(runtime) if isinstance(runtime, bytes) else runtime

    refused = project(config, "s", out, runtime=given)

    assert refused.returncode == 2, refused
    assert refused.stderr.startswith("ctxmcp: EINVAL: --runtime-config "), refused
    assert raw_controls(refused.stderr) == []
    assert not received(record)
    assert not (tmp_path / "deep").exists()


# ===================================================================================== --out


def test_an_out_that_is_a_link_to_another_directory_gets_the_candidates_there(
    tmp_path: Path,
) -> None:
    """OUT may be a link the user made: the candidates land in the directory it leads to,
    the link stays a link, and nothing else is made."""
    config, _ = scripted_config(tmp_path, "s", tools=[tool("a"), tool("b")])
    target = tmp_path / "real"
    target.mkdir()
    link = tmp_path / "out"
    link.symlink_to(target)
    before = set(os.listdir(tmp_path))

    done = project(config, "s", link)

    assert done.returncode == 0, done
    assert done.stdout.split() == [str(link / "s.a.manifest.json"), str(link / "s.b.manifest.json")]
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert sorted(os.listdir(target)) == ["s.a.manifest.json", "s.b.manifest.json"]
    assert set(os.listdir(tmp_path)) - before == {"received.jsonl"}


def test_a_dangling_link_as_out_is_refused_and_nothing_is_made_where_it_points(
    tmp_path: Path,
) -> None:
    """An OUT that is a link to a missing place is refused with ENOENT, exit 2, before the
    server starts, naming the link's target and what to do; ctxmcp makes nothing through it
    (no directory at its target), and keeps it."""
    config, _ = scripted_config(tmp_path, "s", tools=[ECHO])
    out = tmp_path / "out"
    out.symlink_to(tmp_path / "missing" / "deeper")

    refused = project(config, "s", out)

    assert refused.returncode == 2, refused
    assert errno_of(refused.stderr) == "ENOENT", refused
    assert f"--out {out}" in refused.stderr and "nothing was written" in refused.stderr
    assert str(tmp_path / "missing" / "deeper") in refused.stderr
    assert not (tmp_path / "missing").exists()
    assert out.is_symlink() and refused.stdout == ""


# What each refusal may name: the place is no directory, or (a FIFO) something is there.
NEVER_DIRECTORIES = {
    "below-a-file": {"ENOTDIR", "EINVAL"},
    "below-dev-null": {"ENOTDIR", "EINVAL"},
    "a-fifo": {"ENOTDIR", "EINVAL", "EEXIST"},
}


@pytest.mark.parametrize("case", sorted(NEVER_DIRECTORIES))
def test_an_out_that_can_never_be_a_directory_is_refused_before_the_server_starts(
    tmp_path: Path, case: str
) -> None:
    config, record = scripted_config(tmp_path, "s", tools=[ECHO])
    (tmp_path / "notes.txt").write_text("mine\n")
    os.mkfifo(tmp_path / "fifo")
    out = {
        "below-a-file": tmp_path / "notes.txt" / "out",
        "below-dev-null": Path("/dev/null/out"),
        "a-fifo": tmp_path / "fifo",
    }[case]

    refused = project(config, "s", out)

    assert not received(record), "the server was started first"
    assert refused.returncode == 2, refused
    assert errno_of(refused.stderr) in NEVER_DIRECTORIES[case], refused
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a second uid")
def test_an_out_the_caller_may_not_write_is_named_and_nothing_is_made(
    traversable: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """As an ordinary user: an existing OUT of root's, or a missing one below it, is refused
    with EACCES, exit 2, before the server starts (docs/tools.md: "an --out that ctxmcp may
    not write into"), naming OUT and saying nothing was written; no directory, candidate or
    temporary file is left."""
    config, record = scripted_config(traversable, "s", tools=[ECHO])
    record.touch()
    record.chmod(0o666)  # the server runs as the user and records what it receives
    locked = traversable / "locked"
    locked.mkdir(mode=0o755)

    for out in (locked, locked / "sub" / "out"):
        refused = run_as(unprivileged_user, [
            str(CTXMCP), "project", "--config", str(config), "--runtime-config",
            RUNTIME_CONFIG, "--server", "s", "--out", str(out),
        ], env={"PATH": "/usr/bin:/bin", "HOME": "/"})  # fmt: skip

        assert refused.returncode == 2, refused
        assert errno_of(refused.stderr) == "EACCES", refused
        assert f"--out {out}: ctxmcp may not write into {locked}" in refused.stderr, refused
        assert "nothing was written" in refused.stderr and refused.stdout == ""
        assert os.listdir(locked) == []


def test_earlier_candidates_refuse_the_whole_projection_and_none_of_the_new_ones_appear(
    tmp_path: Path,
) -> None:
    """docs/tools.md "Earlier candidates": without --replace an earlier candidate refuses
    the projection with EEXIST naming it, before anything is written: the new candidate
    ``s.b`` is not written either, the earlier one and the user's other files are left byte
    for byte, and no temporary file remains."""
    config, _ = scripted_config(tmp_path, "s", tools=[tool("a"), tool("b")])
    out = tmp_path / "out"
    out.mkdir()
    (out / "s.a.manifest.json").write_text('{"earlier": true}\n')
    (out / "README").write_text("mine\n")
    before = snapshot(out)

    refused = project(config, "s", out)

    assert refused.returncode == 1, refused
    assert errno_of(refused.stderr) == "EEXIST", refused
    assert str(out / "s.a.manifest.json") in refused.stderr
    assert "--replace" in refused.stderr
    assert snapshot(out) == before
    assert refused.stdout == ""


def test_replace_never_writes_through_a_link_planted_at_a_candidates_name(
    tmp_path: Path,
) -> None:
    """A link planted where a candidate goes, to another file or to a missing one: without
    --replace EEXIST and nothing changes; with it the link itself is replaced by the
    candidate, its target is never written and a missing one never made."""
    config, _ = scripted_config(tmp_path, "s", tools=[tool("a"), tool("b")])
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (out / "s.a.manifest.json").symlink_to(victim)
    (out / "s.b.manifest.json").symlink_to(tmp_path / "made-by-ctxmcp")

    refused = project(config, "s", out)
    assert refused.returncode == 1 and errno_of(refused.stderr) == "EEXIST", refused
    assert (out / "s.a.manifest.json").is_symlink() and victim.read_text() == "precious\n"

    replaced = project(config, "s", out, "--replace", "--json")

    assert replaced.returncode == 0, replaced
    assert sorted(json.loads(replaced.stdout)["replaced"]) == [
        str(out / "s.a.manifest.json"), str(out / "s.b.manifest.json")]  # fmt: skip
    for name in ("a", "b"):
        candidate = out / f"s.{name}.manifest.json"
        assert (
            not candidate.is_symlink() and json.loads(candidate.read_text())["name"] == f"s.{name}"
        )
    assert victim.read_text() == "precious\n"
    assert not os.path.lexists(tmp_path / "made-by-ctxmcp")
    assert leftovers(out) == []


def test_a_server_that_dies_half_way_through_its_listing_leaves_out_as_it_was(
    tmp_path: Path,
) -> None:
    """The server answers the first page of its listing and dies writing the second: the
    session ends with EIO naming its exit status, exit 1; a fresh OUT is not made, an OUT
    holding earlier candidates keeps them byte for byte even with --replace, and ``list``
    prints no partial listing."""
    config, starts = paged_config(tmp_path, [[tool("a"), tool("b")], [tool("c")]], die_at=1)
    fresh = tmp_path / "fresh" / "out"
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "p.a.manifest.json").write_text('{"earlier": "a"}\n')
    (kept / "p.c.manifest.json").write_text('{"earlier": "c"}\n')
    before = snapshot(kept)

    listed = ctxmcp("list", "--config", config, "--server", "p")
    into_fresh = project(config, "p", fresh)
    into_kept = project(config, "p", kept, "--replace", "--json")

    assert starts_of(starts) == 3
    for failed in (listed, into_fresh, into_kept):
        assert failed.returncode == 1, failed
        assert errno_of(failed.stderr) == "EIO", failed
        assert "exited (status 9) before answering tools/list" in failed.stderr, failed
    assert listed.stdout == "" and into_fresh.stdout == ""
    assert json.loads(into_kept.stdout)["error"] == "EIO"
    assert not (tmp_path / "fresh").exists()
    assert snapshot(kept) == before


def test_a_write_that_fails_half_way_leaves_earlier_candidates_untouched_with_replace(
    tmp_path: Path,
) -> None:
    """docs/tools.md: "A failure while writing (ENOSPC, EFBIG, …) removes what was written,
    and the directories made for OUT, and says that nothing was".  A file-size limit stands
    for a full disk: the first candidate fits, the second does not.  With --replace into an
    OUT holding both earlier candidates, neither is replaced and no temporary file is left;
    into a fresh OUT three levels deep, none of the three levels remains."""
    big = {"type": "object", "description": "z" * 200_000}
    config, _ = scripted_config(tmp_path, "s", tools=[tool("a"), tool("b", inputSchema=big)])
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "s.a.manifest.json").write_text('{"earlier": "a"}\n')
    (kept / "s.b.manifest.json").write_text('{"earlier": "b"}\n')
    before = snapshot(kept)
    fresh = tmp_path / "x" / "y" / "out"

    def limited(out: Path, *extra: str) -> subprocess.CompletedProcess:
        argv = [str(CTXMCP), "project", "--config", str(config), "--runtime-config",
                RUNTIME_CONFIG, "--server", "s", "--out", str(out), *extra]  # fmt: skip
        return run_with_stdout(argv, subprocess.PIPE, env=clean_env(), limit=64 * 1024)

    into_kept = limited(kept, "--replace")
    into_fresh = limited(fresh)

    for failed in (into_kept, into_fresh):
        assert failed.returncode == 1, failed
        assert errno_of(failed.stderr) == "EFBIG", failed
        assert "s.b.manifest.json" in failed.stderr and "nothing was written" in failed.stderr
        assert failed.stdout == ""
    assert snapshot(kept) == before
    assert not (tmp_path / "x").exists()


# ===================================================================================== M-1


def test_list_and_project_change_nothing_but_out_not_the_root_home_tmpdir_or_cwd(
    storage: Path, tmp_path: Path
) -> None:
    """M-1: ctxmcp "installs nothing, grants no policy, writes nothing under /ctx".  Run
    with the storage root named by $CTX_STORAGE and --storage, a HOME, XDG directories,
    TMPDIR and a working directory of their own, through success, refusals and a dying
    server: the root, those directories and ``ctx object list`` are exactly as before, no
    ``/ctx`` appears, and only OUT holds something new."""
    world = tmp_path / "world"
    home, tmp, work = world / "home", world / "tmp", world / "work"
    for place in (home, tmp, work):
        place.mkdir(parents=True)
    servers = tmp_path / "servers"
    servers.mkdir()
    config, _ = paged_config(servers, [[tool("a")], [tool("b")]])
    dying_dir = tmp_path / "dying"
    dying_dir.mkdir()
    dying, _ = paged_config(dying_dir, [[tool("a")], [tool("b")]], die_at=1)
    env = clean_env(CTX_STORAGE=str(storage), HOME=str(home), TMPDIR=str(tmp),
                    XDG_DATA_HOME=str(home / ".local/share"), XDG_CACHE_HOME=str(home / ".cache"),
                    XDG_CONFIG_HOME=str(home / ".config"))  # fmt: skip
    objects_before = ctx_run("object", "list", "--json", env=env)
    assert objects_before.rc == 0, objects_before
    root_before, world_before = snapshot(storage), snapshot(world)
    ctx_existed = os.path.lexists("/ctx")
    out = tmp_path / "out"

    def run(*args: str | Path) -> subprocess.CompletedProcess:
        return subprocess.run([str(CTXMCP), *map(str, args)], capture_output=True, text=True,
                              env=env, cwd=work, timeout=60)  # fmt: skip

    common = ["--runtime-config", RUNTIME_CONFIG, "--server", "p", "--storage", str(storage)]
    statuses = [
        run("list", "--config", config, "--server", "p", "--json").returncode,
        run("project", "--config", config, *common, "--out", out).returncode,
        run("project", "--config", dying, *common, "--out", tmp_path / "out2").returncode,
        run("project", "--config", config, *common, "--out", storage / "shared").returncode,
    ]

    assert statuses == [0, 0, 1, 2], statuses
    assert snapshot(storage) == root_before
    assert set(os.listdir(storage)) == ROOT_ENTRIES
    assert snapshot(world) == world_before
    assert os.path.lexists("/ctx") == ctx_existed
    assert sorted(os.listdir(out)) == ["p.a.manifest.json", "p.b.manifest.json"]
    assert not (tmp_path / "out2").exists()
    objects_after = ctx_run("object", "list", "--json", env=env)
    assert objects_after.out == objects_before.out
    assert not [t for t in json.loads(objects_after.out) if t["name"].startswith("p.")]


def test_list_writes_nothing_at_all_and_exits_0_when_every_tool_would_be_skipped(
    tmp_path: Path,
) -> None:
    """``list`` judges; it writes nothing, not even for a server none of whose tools could be
    projected, and shows why each would not be (exit 0: listing skips nothing)."""
    tools = [tool("x" * 70), {"name": "noschema"}, tool("arr", inputSchema={"type": "array"}), 7]
    config, _ = scripted_config(tmp_path, "s", tools=tools)
    before = snapshot(tmp_path)

    listed = subprocess.run(
        [str(CTXMCP), "list", "--config", str(config), "--server", "s"],
        capture_output=True, text=True, cwd=tmp_path, env=clean_env(), timeout=60,
    )  # fmt: skip

    assert listed.returncode == 0, listed
    lines = listed.stdout.splitlines()
    assert len(lines) == 4 and all("(not projectable: " in line for line in lines), lines
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if k != "received.jsonl"} == {
        k: v for k, v in before.items() if k != "received.jsonl"
    }
