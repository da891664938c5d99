"""Exotic ``tool/<name>.d/program`` controls (SPEC §11 C-1, C-2, C-3; T-1, T-8) in every path
that judges one: ``ctx object check`` and ``ctx object install`` (a manifest's ``program`` of
every JSON type, given twice, too large once installed, nested to the parser's limit, with
references and meta-schemas naming other places), the layout check behind ``ctx object
list``, ``ctx run`` and ``ctx bootstrap`` (a control that is empty, blank, followed by more
JSON, a directory, a socket, a device, exactly at or one byte past the limit of a control,
unreadable to the uid that lists it), the standalone ``tsh``'s discovery, ``ctxmcp``'s
projection of a server whose tools declare output schemas, and the pure C-3 decisions fed
provider ids that spell one id two ways.  A program grants nothing, is never an output
schema, and nothing anywhere names ``programmatic_tool_calling`` or ``allowed_callers``."""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import REPO, OnStorage, Run, clean_env, scratch_top
from tests.acceptance.workercli import AGENT, allow_in_tool_policy, make_agent
from tests.support.mcp_wire import WIRE
from tests.support.users import run_as
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
TOOL = "pc.tool"
PROGRAM = {"type": "object", "additionalProperties": False}  # C-2's own example
C1_WORDS = ("programmatic_tool_calling", "allowed_callers")
CONTROL_LIMIT = 1_048_576  # bytes a control other than the policy may hold (docs/tools.md)
ECHO = '#!/bin/sh\nif [ "$#" -gt 0 ]; then printf \'argv:%s\\n\' "$*"; else cat; fi\n'
CTXMCP = REPO / ".venv" / "bin" / "ctxmcp"
PYTHON = REPO / ".venv" / "bin" / "python"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid")


# ------------------------------------------------------------------------------ helpers


@dataclass
class Bench(OnStorage):
    """A bootstrapped root every uid may search, and a directory for manifests."""

    storage: Path
    src: Path

    def manifest(self, program_text: str | None, name: str = TOOL, tail: str = "") -> Path:
        """A v2 manifest of ``name`` whose ``program`` is the JSON text ``program_text``
        written as it is (None: no program); ``tail``: more members, as text."""
        (self.src / "echo.sh").write_text(ECHO)
        document = {
            "manifest": 2,
            "kind": "tool",
            "name": name,
            "description": f"The {name} tool.",
            "schema": {"type": "object"},
            "cap": {"side_effects": False, "network": False},
            "exec": "echo.sh",
        }
        text = json.dumps(document)[:-1]
        if program_text is not None:
            text += f', "program": {program_text}'
        fd, path = tempfile.mkstemp(prefix=f"{name}-", suffix=".json", dir=self.src)
        os.close(fd)
        Path(path).write_text(text + tail + "}")
        Path(path).chmod(0o644)
        return Path(path)

    def install(self, manifest: Path) -> Run:
        return self.ctx("object", "install", manifest, "--tier", "system")

    def controls(self, name: str = TOOL) -> Path:
        return self.storage / "tool" / f"{name}.d"

    def entry(self, name: str = TOOL) -> dict:
        listed = self.ctx("object", "list", "--json")
        assert listed.rc == 0 and "Traceback" not in listed.err, listed
        [found] = [e for e in listed.json() if e["name"] == name]
        return found

    def call(self, *argv: str, name: str = TOOL) -> Run:
        return self.ctx("run", "--agent", AGENT, name, *argv)

    def working(self, name: str = TOOL) -> None:
        """``name`` installed with C-2's example program, granted to agent ``ci`` in both
        layers of P-6, and seen answering a call."""
        installed = self.install(self.manifest(json.dumps(PROGRAM), name=name))
        assert installed.rc == 0, installed
        make_agent(self.storage, [name])
        allow_in_tool_policy(self.storage, name)
        ran = self.call("hi", name=name)
        assert (ran.rc, ran.out) == (0, "argv:hi\n"), ran


@pytest.fixture
def bench(searchable_storage: Path) -> Iterator[Bench]:
    SCRATCH.mkdir(mode=0o755, exist_ok=True)
    SCRATCH.chmod(0o755)
    src = Path(tempfile.mkdtemp(prefix="src-", dir=SCRATCH))
    src.chmod(0o755)
    try:
        yield Bench(searchable_storage, src)
    finally:
        shutil.rmtree(src, ignore_errors=True)


def no_traceback(*runs: Run) -> None:
    for run in runs:
        assert "Traceback" not in run.err and "Traceback" not in run.out, run


def no_c1_word(*texts: str) -> None:
    for text in texts:
        for word in C1_WORDS:
            assert word not in text, (word, text[:400])


def tool_files(storage: Path) -> set[str]:
    return set(os.listdir(storage / "tool"))


# ====================================================== C-2, T-8: a manifest's odd programs

# JSON values that are not objects.  ``true`` and ``false`` are JSON Schemas of their own in
# the current drafts, yet C-2 asks for an object; a string holding an object's text is text.
NOT_OBJECTS = {
    "null": "null",
    "true": "true",
    "false": "false",
    "empty-array": "[]",
    "array-of-schema": '[{"type": "object"}]',
    "zero": "0",
    "fraction": "1.5",
    "empty-string": '""',
    "object-as-text": '"{\\"type\\": \\"object\\"}"',
}


@needs_root
def test_a_manifest_program_of_every_other_json_type_is_refused_and_installs_nothing(bench):
    """C-2, T-8: a manifest's ``program`` that is null, a boolean, an array, a number or a
    string (even one spelling an object) is refused by ``ctx object check --json`` (one
    entry each, not valid, an EINVAL problem naming ``program``) and by ``ctx object
    install`` (exit 1, EINVAL naming it), and nothing is installed; an empty object, the
    weakest schema there is, is accepted and installs available.  A manifest giving
    ``program`` twice is refused for that, whichever value is the good one."""
    before = tool_files(bench.storage)
    manifests = {case: bench.manifest(text) for case, text in NOT_OBJECTS.items()}
    twice = json.dumps(PROGRAM)
    manifests["given-twice"] = bench.manifest("[]", tail=f', "program": {twice}')

    checked = bench.ctx("object", "check", "--json", *manifests.values())
    no_traceback(checked)
    assert checked.rc == 1, checked
    verdicts = dict(zip(manifests, checked.json(), strict=True))
    for case, verdict in verdicts.items():
        assert verdict["valid"] is False and verdict["name"] is None, (case, verdict)
        assert verdict["error"] is None, (case, verdict)
        assert verdict["codes"] and set(verdict["codes"]) == {"EINVAL"}, (case, verdict)
        assert any("program" in problem for problem in verdict["problems"]), (case, verdict)
    assert any("twice" in p for p in verdicts["given-twice"]["problems"]), verdicts

    for case in ("null", "true", "object-as-text", "given-twice"):
        installed = bench.install(manifests[case])
        no_traceback(installed)
        assert installed.rc == 1 and "EINVAL" in installed.err, (case, installed)
        assert "program" in installed.err, (case, installed)
    assert tool_files(bench.storage) == before

    empty = bench.install(bench.manifest("{}"))
    assert empty.rc == 0, empty
    assert json.loads((bench.controls() / "program").read_text()) == {}
    assert bench.entry()["status"] == "available"


@needs_root
def test_the_same_values_written_into_an_installed_program_make_the_tool_unavailable(bench):
    """C-2 ("malformed, non-object … makes the tool unavailable"), T-8a: values a manifest
    may not give, written by hand into a working tool's program control, makes
    ``ctx object list --json`` say ``unavailable`` with a reason naming the program control
    and C-2, listed in ``problems`` too; the JSON Schema ``true`` is refused by a call as
    well (exit 126, nothing run, saying why) and reported by ``ctx bootstrap`` (exit 1),
    which leaves the control as the administrator wrote it."""
    bench.working()
    program = bench.controls() / "program"
    for case in ("null", "true", "array-of-schema", "fraction", "object-as-text"):
        program.write_text(NOT_OBJECTS[case])
        entry = bench.entry()
        assert entry["status"] == "unavailable", (case, entry)
        assert "program control" in entry["reason"] and "C-2" in entry["reason"], (case, entry)
        assert any("program" in problem for problem in entry["problems"]), (case, entry)

    program.write_text("true")
    ran = bench.call("x")
    native = bench.ctx("run", "--native", "--agent", AGENT, TOOL, input="{}")
    booted = bench.ctx("bootstrap", "--json")
    no_traceback(ran, native, booted)
    assert ran.rc == 126 and ran.out == "", ran
    assert "not available" in ran.err and "program control" in ran.err, ran
    frames = [json.loads(line) for line in native.lines()]
    assert native.rc == 1 and frames[-1]["type"] == "result", native
    error = frames[-1]["error"]
    assert frames[-1]["status"] == "error" and error["error"] == "EACCES", native
    assert error["stage"] == "resolve" and "program control" in error["message"], native
    assert booted.rc == 1, booted
    assert f"tool/{TOOL}" in json.dumps(booted.json()["problems"]), booted
    assert program.read_text() == "true"

    program.write_text(json.dumps(PROGRAM))
    assert bench.entry()["status"] == "available"
    ran = bench.call("back")
    assert (ran.rc, ran.out) == (0, "argv:back\n"), ran


# Control bytes that are no JSON text at all, and what the reason says of them.
NOT_JSON = {
    "empty": (b"", "empty"),
    "blank": (b"  \n\t\n", "empty"),
    "two-documents": (b"{} {}", "not JSON"),
    "truncated": (b'{"type": "object"', "not JSON"),
    "nul-byte": (b'{"type":\x00 "object"}', "not JSON"),
    "latin-1": ('{"description": "caf\u00e9"}'.encode("latin-1"), "not JSON"),
}


@needs_root
def test_a_program_control_that_is_empty_blank_or_more_than_one_document_says_not_json(bench):
    """C-2, docs/tools.md (``the program control is not JSON: it is empty``): a control made
    empty, blank, truncated, holding two documents, a NUL byte or bytes that are no UTF-8
    makes the tool unavailable with a reason saying the program control is not JSON; a
    valid object followed by blank lines is a valid control."""
    bench.working()
    program = bench.controls() / "program"
    for case, (data, said) in NOT_JSON.items():
        program.write_bytes(data)
        entry = bench.entry()
        assert entry["status"] == "unavailable", (case, entry)
        assert "program control is not JSON" in entry["reason"], (case, entry)
        assert said in entry["reason"], (case, entry)
    program.write_bytes(json.dumps(PROGRAM).encode() + b"\n\n\n")
    assert bench.entry()["status"] == "available"


# ============================================ C-2: one verdict whatever else the program says

# Programs written with the common keywords only, each invalid by the draft's meta-schema
# (2020-12: "$id" holds no non-empty fragment) or by the references rule of docs/tools.md
# (an "$id" below the top changes what references under it mean).  The same program with
# one more keyword that constrains nothing ("allOf": [{}]) is refused today.
ID_PROGRAMS = {
    "id-with-fragment": {"type": "object", "$id": "#result"},
    "id-below-the-top": {"type": "object", "properties": {"a": {"$id": "http://x.test/a"}}},
}


@needs_root
@pytest.mark.parametrize("case", list(ID_PROGRAMS))
def test_a_program_is_judged_alike_with_or_without_a_keyword_that_constrains_nothing(bench, case):
    """C-2 ("failing schema validation makes the tool unavailable"): whether a program is a
    valid JSON Schema does not depend on an ``"allOf": [{}]`` beside the rest.  A program
    whose ``$id`` carries a fragment (the meta-schema's pattern refuses it) or that declares
    an ``$id`` below its top is refused by ``ctx object check`` and ``ctx object install``
    as it is when that keyword is added, and written into an installed tool's control it
    makes the tool unavailable either way."""
    program = ID_PROGRAMS[case]
    padded = {**program, "allOf": [{}]}
    bench.working()
    control = bench.controls() / "program"
    verdicts = {}
    for label, document in (("plain", program), ("padded", padded)):
        checked = bench.ctx("object", "check", "--json", bench.manifest(json.dumps(document)))
        control.write_text(json.dumps(document))
        verdicts[label] = (checked.json()[0]["valid"], bench.entry()["status"])
    assert verdicts["padded"] == (False, "unavailable"), verdicts  # today's verdict
    assert verdicts["plain"] == verdicts["padded"], verdicts
    installed = bench.install(bench.manifest(json.dumps(program), name="pc.plain"))
    assert installed.rc == 1 and "EINVAL" in installed.err, installed
    assert not os.path.lexists(bench.storage / "tool" / "pc.plain")


# ================================================================= C-2: the size of a program


@needs_root
def test_a_program_control_exactly_at_the_limit_is_read_and_one_byte_more_is_refused(bench):
    """C-2, T-1 ("no further than a byte past its limit: … 1 MiB for any other"): a valid
    program padded with blanks to exactly 1048576 bytes is read and judged (available); one
    byte more makes the tool damaged with EFBIG naming the program and the limit, for
    ``ctx object list`` and a call alike, and ``ctx bootstrap`` leaves the file as it is."""
    bench.working()
    control = bench.controls() / "program"
    text = json.dumps(PROGRAM).encode()
    control.write_bytes(text + b" " * (CONTROL_LIMIT - len(text)))
    assert control.stat().st_size == CONTROL_LIMIT
    assert bench.entry()["status"] == "available"
    ran = bench.call("at-limit")
    assert (ran.rc, ran.out) == (0, "argv:at-limit\n"), ran

    control.write_bytes(text + b" " * (CONTROL_LIMIT + 1 - len(text)))
    entry = bench.entry()
    ran = bench.call("past")
    booted = bench.ctx("bootstrap", "--json")
    no_traceback(ran, booted)
    assert entry["status"] == "damaged", entry
    assert any(str(CONTROL_LIMIT) in p and "program" in p for p in entry["problems"]), entry
    assert ran.rc == 126 and ran.out == "" and "EFBIG" in ran.err, ran
    assert str(CONTROL_LIMIT) in ran.err and "program" in ran.err, ran
    assert control.stat().st_size == CONTROL_LIMIT + 1


@needs_root
def test_a_manifest_program_that_would_outgrow_a_control_once_installed_is_efbig(bench):
    """T-8, docs/tools.md ("``object install`` refuses a manifest whose controls would come
    out larger as installed (a schema is written indented), EFBIG, with nothing
    installed"): a program of 300 000 enum members, well under a manifest's megabyte as
    written, is EFBIG for ``ctx object check`` and ``install`` alike, naming the program
    control and the limit; nothing is installed."""
    members = ",".join("0" for _ in range(300_000))
    manifest = bench.manifest(f'{{"enum": [{members}]}}', name="pc.wide")
    assert manifest.stat().st_size < CONTROL_LIMIT
    before = tool_files(bench.storage)

    checked = bench.ctx("object", "check", "--json", manifest)
    installed = bench.install(manifest)

    no_traceback(checked, installed)
    assert checked.rc == 1 and checked.json()[0]["codes"] == ["EFBIG"], checked
    [problem] = checked.json()[0]["problems"]
    assert "program" in problem and str(CONTROL_LIMIT) in problem, checked
    assert installed.rc == 1 and "EFBIG" in installed.err, installed
    assert tool_files(bench.storage) == before


def nested_enum(levels: int) -> str:
    """A program ``levels`` deep counting itself: ``{"enum": [[...]]}``."""
    return '{"enum": ' + "[" * (levels - 1) + "]" * (levels - 1) + "}"


@needs_root
def test_a_deeply_nested_program_installs_up_to_the_parsers_depth_and_is_refused_past_it(bench):
    """C-2, T-8: a program nested 127 levels (128 with the manifest around it) is checked,
    installed and available, and still so after ``ctx bootstrap``; a program nested past
    the reader's depth — in a manifest, or 100 000 levels of arrays written into the
    control — is refused with a reason (EINVAL; unavailable, not JSON), never with an
    interpreter traceback, and nothing is installed."""
    deep = bench.manifest(nested_enum(127), name="pc.deep")
    installed = bench.install(deep)
    assert installed.rc == 0, installed
    assert bench.entry("pc.deep")["status"] == "available"
    booted = bench.ctx("bootstrap", "--json")
    assert booted.rc == 0, booted
    assert bench.entry("pc.deep")["status"] == "available"

    deeper = bench.manifest(nested_enum(128), name="pc.deeper")
    checked = bench.ctx("object", "check", deeper)
    refused = bench.install(deeper)
    no_traceback(checked, refused)
    assert checked.rc == 1 and "EINVAL" in checked.err and "nested" in checked.err, checked
    assert refused.rc == 1 and not os.path.lexists(bench.storage / "tool" / "pc.deeper")

    bench.working()
    (bench.controls() / "program").write_text(nested_enum(100_000))
    entry = bench.entry()
    ran = bench.call("x")
    no_traceback(ran)
    assert entry["status"] == "unavailable" and "nested" in entry["reason"], entry
    assert ran.rc == 126 and "program control" in ran.err, ran


# ============================================= C-2: a program that names other places


@needs_root
def test_a_program_naming_a_listening_address_is_never_fetched_by_any_judge(bench):
    """C-2: a program is judged as the document it is.  One whose ``$schema`` names a
    meta-schema at a listening address on this machine, and one whose ``$id`` is that
    address with a ``$recursiveRef`` (draft 2019-09) to it, get their verdict from
    ``ctx object check``, ``ctx object install``, ``ctx object list``, a call and
    ``ctx bootstrap`` without any of them connecting; what check accepts installs
    available and runs, and the same bytes written into the control keep it so."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        server.setblocking(False)
        where = f"http://127.0.0.1:{server.getsockname()[1]}"
        programs = {
            "pc.meta": {"$schema": f"{where}/meta.json", "type": "object"},
            "pc.recursive": {
                "$schema": "https://json-schema.org/draft/2019-09/schema",
                "$id": f"{where}/root.json",
                "properties": {"a": {"$recursiveRef": f"{where}/other.json"}},
            },
        }
        make_agent(bench.storage, list(programs))
        runs = []
        for name, program in programs.items():
            manifest = bench.manifest(json.dumps(program), name=name)
            checked = bench.ctx("object", "check", "--json", manifest)
            installed = bench.install(manifest)
            runs += [checked, installed]
            valid = checked.json()[0]["valid"]
            assert (installed.rc == 0) == valid, (checked, installed)
            if valid:
                allow_in_tool_policy(bench.storage, name)
                (bench.controls(name) / "program").write_text(json.dumps(program))
                assert bench.entry(name)["status"] == "available"
                ran = bench.call("x", name=name)
                runs.append(ran)
                assert (ran.rc, ran.out) == (0, "argv:x\n"), ran
        runs.append(bench.ctx("bootstrap", "--json"))
        no_traceback(*runs)
        readable, _, _ = select.select([server], [], [], 0)
        assert readable == [], "a judge of the program connected to the address it names"


# ============================================ C-2, T-1: programs that are no regular file


def make_directory(path: Path) -> None:
    path.mkdir()


def make_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(str(path))


def make_device(path: Path) -> None:
    os.mknod(path, 0o644 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers


SPECIAL = {"directory": make_directory, "socket": make_socket, "device": make_device}


@needs_root
def test_a_program_replaced_by_a_special_entry_is_damaged_and_reinstall_says_what_to_do(bench):
    """C-2, T-1, T-8: a program control replaced by a directory, a socket or a character
    device (one that never ends) is never read: the tool is damaged for ``ctx object list``
    (a problem naming the program) and a call (ENOEXEC, exit 126), ``ctx bootstrap`` warns
    and exits 0 leaving it there; a reinstall refuses to replace what is not a control file
    (EISDIR or EEXIST naming the path, nothing changed); once the entry is moved away the
    reinstall puts the tool right and it runs."""
    bench.working()
    control = bench.controls() / "program"
    manifest = bench.manifest(json.dumps(PROGRAM))
    for case, make in SPECIAL.items():
        control.unlink()
        make(control)
        kind = stat.S_IFMT(control.lstat().st_mode)
        entry = bench.entry()
        again = bench.install(manifest)
        no_traceback(again)
        assert entry["status"] == "damaged", (case, entry)
        assert any("program" in problem for problem in entry["problems"]), (case, entry)
        assert again.rc == 1 and str(control) in again.err, (case, again)
        assert ("EISDIR" if case == "directory" else "EEXIST") in again.err, (case, again)
        assert stat.S_IFMT(control.lstat().st_mode) == kind, case
        if case != "device":
            control.rmdir() if case == "directory" else control.unlink()
            control.write_bytes(json.dumps(PROGRAM).encode())

    ran = bench.call("x")
    booted = bench.ctx("bootstrap", "--json")
    no_traceback(ran, booted)
    assert ran.rc == 126 and ran.out == "" and "ENOEXEC" in ran.err, ran
    assert booted.rc == 0 and TOOL in json.dumps(booted.json()["warnings"]), booted
    assert stat.S_ISCHR(control.lstat().st_mode)
    control.unlink()  # moved away, as the refusal says
    fixed = bench.install(manifest)
    assert fixed.rc == 0, fixed
    assert bench.entry()["status"] == "available"
    ran = bench.call("fixed")
    assert (ran.rc, ran.out) == (0, "argv:fixed\n"), ran


@needs_root
def test_a_program_the_listing_uid_cannot_read_is_unknown_to_it_not_a_traceback(
    bench, unprivileged_user
):
    """C-2, T-8a, as a non-root user: a system tool's program control made readable by root
    alone (mode 0600) lists as ``unknown`` for an unprivileged uid (docs/tools.md: what a
    call meets is not for that uid to tell) — the reason names the program control and who
    may read it — with exit 0 and no traceback, while root still lists it
    available and a call still runs; the user's ``ctx object check`` of a manifest whose
    program is not an object is refused as root's is."""
    bench.working()
    control = bench.controls() / "program"
    control.chmod(0o600)
    env = clean_env(CTX_STORAGE=str(bench.storage), HOME=str(bench.src))
    ctx = str(REPO / ".venv" / "bin" / "ctx")
    listed = run_as(unprivileged_user, [ctx, "object", "list", "--json"], env=env)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed
    [entry] = [e for e in json.loads(listed.stdout) if e["name"] == TOOL]
    assert (entry["status"], entry["problems"]) == ("unknown", []), entry
    assert "program" in entry["reason"] and "may not read" in entry["reason"], entry
    assert bench.entry()["status"] == "available"
    ran = bench.call("root-reads-it")
    assert (ran.rc, ran.out) == (0, "argv:root-reads-it\n"), ran

    manifest = bench.manifest("[]", name="pc.users")
    checked = run_as(unprivileged_user, [ctx, "object", "check", str(manifest)], env=env)
    assert checked.returncode == 1, checked
    assert "EINVAL" in checked.stderr and "program" in checked.stderr, checked
    assert "Traceback" not in checked.stderr, checked


# ======================================================= C-1: nothing announces the feature


@needs_root
def test_the_standalone_tsh_discovers_a_tool_with_a_program_and_shows_no_output_schema(bench):
    """C-1, H-2, T-4: a human's standalone ``tsh`` (``bin/tsh``, ``CTX_PATH`` at the system
    tier) lists and describes a tool that has a program: ``describe`` gives its name,
    description, input schema and cap — never the program as an output schema, never
    ``allowed_callers`` — and it runs nothing as an agent (exit 126)."""
    bench.working()
    tsh = bench.storage / "bin" / "tsh"
    env = clean_env(CTX_STORAGE=str(bench.storage), CTX_PATH=str(bench.storage / "tool"),
                    CTX_HOME=str(bench.src))  # fmt: skip

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(tsh), *argv], capture_output=True, text=True, env=env,
                              stdin=subprocess.DEVNULL, timeout=60)  # fmt: skip

    tools = run("tools")
    described = run("describe", TOOL)
    refused = run(TOOL, "x")
    assert tools.returncode == 0 and TOOL in tools.stdout.split(), tools
    assert described.returncode == 0, described
    shown = json.loads(described.stdout)
    assert shown["schema"] == {"type": "object"}, shown
    assert not {"program", "output_schema", "outputSchema"} & set(shown), shown
    assert refused.returncode == 126 and "argv:" not in refused.stdout, refused
    no_c1_word(tools.stdout, described.stdout, refused.stderr, tools.stderr)


SERVER = (
    WIRE
    + r"""
TOOLS = json.loads(sys.argv[1])
while True:
    message = receive()
    if "id" not in message:
        continue
    method, ident = message.get("method"), message["id"]
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": "typed", "version": "0"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "content": [{"type": "text", "text": "{}"}], "structuredContent": {},
            "isError": False}})
    else:
        send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no"}})
"""
)

# A remote tool declaring what an MCP server may: an output schema, annotations that say it
# is read-only and closed-world, and provider hints of its own under _meta.
TYPED_TOOL = {
    "name": "typed",
    "description": "Returns a count.",
    "inputSchema": {"type": "object"},
    "outputSchema": {
        "type": "object",
        "properties": {"count": {"type": "integer"}},
        "required": ["count"],
    },
    "annotations": {"readOnlyHint": True, "openWorldHint": False},
    "_meta": {"allowed_callers": ["code_execution"], "programmatic_tool_calling": True},
}


@needs_root
@pytest.mark.skipif(not CTXMCP.exists(), reason="ctxmcp is not installed in the venv")
def test_an_mcp_tools_output_schema_never_becomes_a_program_nor_announces_callers(bench):
    """C-1, C-2, M-1, M-4: ``ctxmcp`` projects a remote tool that declares an
    ``outputSchema`` and provider hints naming ``allowed_callers`` into a candidate whose
    only schema is the input schema: no ``program`` control, no output schema, neither C-1
    word in ``ctxmcp list --json``, ``project --json`` or the candidate; installed, the tool
    has no program control and is available."""
    mcp = bench.src / "mcp"
    mcp.mkdir(mode=0o755)
    (mcp / "server.py").write_text(SERVER)
    server = {"command": str(PYTHON), "args": [str(mcp / "server.py"), json.dumps([TYPED_TOOL])]}
    config = mcp / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"s": server}}))
    out = bench.src / "out"

    def ctxmcp(*args) -> subprocess.CompletedProcess:
        return subprocess.run([str(CTXMCP), *map(str, args)], capture_output=True, text=True,
                              env=bench.env, timeout=60)  # fmt: skip

    listed = ctxmcp("list", "--config", config, "--server", "s", "--json")
    projected = ctxmcp("project", "--config", config, "--runtime-config", config,
                       "--server", "s", "--out", out, "--json")  # fmt: skip
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed
    assert projected.returncode == 0 and "Traceback" not in projected.stderr, projected
    candidate_path = out / "s.typed.manifest.json"
    candidate_text = candidate_path.read_text()
    candidate = json.loads(candidate_text)
    assert "program" not in candidate and "outputSchema" not in candidate, candidate
    assert candidate["schema"] == {"type": "object"}, candidate
    assert candidate["cap"] == {"side_effects": False, "network": False}, candidate
    no_c1_word(listed.stdout, projected.stdout, candidate_text, listed.stderr)

    installed = bench.install(candidate_path)
    assert installed.rc == 0, installed
    assert not os.path.lexists(bench.controls("s.typed") / "program")
    entry = bench.entry("s.typed")
    assert entry["status"] == "available", entry
    no_c1_word(bench.ctx("object", "list", "--json").out, installed.out)


@needs_root
def test_no_json_answer_about_a_program_names_the_reserved_feature(bench):
    """C-1: with a tool whose program would pass C-2 and a second whose program is the
    JSON Schema ``true`` (unavailable), the ``--json`` answers of ``ctx object check``,
    ``ctx object which``, ``ctx bootstrap`` and ``ctx policy explain``, and the native
    frames of a call, hold neither ``programmatic_tool_calling`` nor ``allowed_callers``
    — not even as a key set to false — and the program never appears as an output
    schema of the call (its result is the tool's own output)."""
    bench.working()
    second = bench.install(bench.manifest(json.dumps(PROGRAM), name="pc.other"))
    assert second.rc == 0, second
    (bench.controls("pc.other") / "program").write_text("true")
    native = bench.ctx("run", "--native", "--agent", AGENT, TOOL, input='{"extra": [1, 2]}')
    frames = [json.loads(line) for line in native.lines()]
    assert native.rc == 0 and frames[-1]["output"] == {"extra": [1, 2]}, native
    answers = [
        native.out,
        bench.ctx("object", "check", "--json", bench.manifest(json.dumps(PROGRAM))).out,
        bench.ctx("object", "which", "--json", TOOL).out,
        bench.ctx("object", "which", "--json", "pc.other").out,
        bench.ctx("bootstrap", "--json").out,
        bench.ctx("policy", "explain", "--json", AGENT, f"tool:{TOOL}", "execute").out,
        (bench.controls() / "log").read_text(),
    ]
    no_c1_word(*answers)
    for frame in frames:
        assert not {"output_schema", "outputSchema", "program"} & set(frame), frame


# ========================================================== C-3: the pure decisions

DECIDE = """
import json, sys, unicodedata
from cortexfs.tools import ptc

# Pairs a provider could send for one id, spelled two ways.
PAIRS = [
    ("call_7", "call_7"),
    ("caf\\u00e9", unicodedata.normalize("NFD", "caf\\u00e9")),
    ("call_7", "call_7\\u200b"),
    ("call_7", "\\uff43all_7"),
    ("call_7", "call_7 "),
]
closed = []
for one, other in PAIRS:
    flagged = bool(ptc.duplicates([one, other]))
    refused = any(ptc.identity_problem(v) for v in (one, other))
    closed.append(flagged or refused)
odd = {}
for ids in (None, 7, [["a"], ["a"]], [{"a": 1}]):
    try:
        odd[repr(ids)] = sorted(map(repr, ptc.duplicates(ids)))
    except TypeError:
        odd[repr(ids)] = "TypeError"
print(json.dumps({"closed": closed, "odd": odd,
                  "same": sorted(ptc.duplicates(["a", "b", "a", "a"]))}))
"""


def test_provider_ids_spelled_two_ways_are_caught_as_duplicates_or_refused() -> None:
    """C-3, the fail-closed table ("program or nested call id repeated: refuse before
    authorization"): two ids that are one id spelled two ways (equal, composed and
    decomposed, with a zero-width space, a full-width letter) are either reported by
    ``duplicates`` or refused by ``identity_problem`` — never both let through; an id
    list that is no list of strings raises instead of answering, and a repeated id is
    reported once however often it repeats."""
    done = subprocess.run([str(PYTHON), "-c", DECIDE], capture_output=True, text=True,
                          cwd=REPO, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert all(answer["closed"]), answer
    assert answer["same"] == ["a"], answer
    for ids, verdict in answer["odd"].items():
        assert verdict == "TypeError", (ids, verdict)
