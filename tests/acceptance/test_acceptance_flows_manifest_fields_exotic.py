"""v2 manifests whose fields other than the input schema are unusual but plausible (SPEC R-3,
T-1, T-3, T-7, T-8, T-8a, M-3, M-4; docs/tools.md "Manifests, version 2", "How the manifest
and its program are read", "How an install stays atomic", "Listing and resolving",
"Running a tool").

A user hands ``ctx object check`` and ``ctx object install`` manifest files that are JSON
arrays, empty, FIFOs, directories, links, saved with a byte-order mark or CRLF line ends,
exactly 1 MiB or a byte more; names at R-3's limits and just past them; descriptions holding
control characters, escape sequences, bidirectional marks, NUL, lone surrogates or a
megabyte of text; duplicate keys; host-owned fields (``status``, ``origin``, ``policy``);
``exec`` values that are relative, dotted, too long, hold NUL or name a program whose
interpreter is not there; ``cap`` and ``mcp`` fields with odd values; and two installs of
one name with different content at once, in the system, user and shared tiers.  What must
hold: every reason is listed, one line each, with its errno and exit 1 (``--json``: one entry
of fixed keys per manifest); nothing is installed half-way; ``ctx object list`` and ``which``
show names and descriptions escaped in text and exact in JSON; and what was installed runs
under ``ctx run`` as the agent, each failure named with its stage."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    snapshot,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs tools as an agent's uid")

SCRATCH = scratch_top(__file__)
AGENT = "coder"
LABEL = "coder_t"
MIB = 1024 * 1024
CHECK_KEYS = {"manifest", "valid", "name", "problems", "codes", "error"}
LIST_KEYS = {"name", "tier", "path", "status", "reason", "description", "problems"}
RAW_CONTROLS = [chr(c) for c in range(0x20) if chr(c) not in "\n\t"] + ["\x7f", "\x9b"]

# Prints its name and argv (terminal mode) or its JSON input (native mode).
ECHO = """\
#!/bin/sh
if [ "$#" -gt 0 ]; then
  printf 'ran %s\\n' "$*"
else
  cat
fi
"""


# ----------------------------------------------------------------------------------------------
# helpers


def nobody() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody: root's default agent user (docs/tools.md)")


def document(name: str, **fields: object) -> dict:
    """A valid v2 manifest of tool ``name`` running ``prog.sh``, with ``fields`` replacing
    (or, given as None, removing) its fields."""
    doc: dict = {
        "manifest": 2,
        "kind": "tool",
        "name": name,
        "description": f"The {name} tool.",
        "schema": {"type": "object"},
        "cap": {"side_effects": False, "network": False},
        "exec": "prog.sh",
    }
    doc.update(fields)
    return {key: value for key, value in doc.items() if value is not None}


def raw_controls(text: str) -> list[str]:
    return [c for c in RAW_CONTROLS if c in text]


@dataclass
class World:
    """A bootstrapped storage root every uid may search, an agent ``coder`` (uid nobody)
    that may read the shared space ``lab`` (made for nobody's group), and ``src``, a
    directory of manifests holding the program ``prog.sh``."""

    storage: Path
    src: Path

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    def ctx(self, *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        kw.setdefault("timeout", 60)
        r = ctx_run(*args, **kw)
        assert "Traceback" not in r.err, r
        return r

    def write(self, file: str, data: bytes | str | dict | list) -> Path:
        path = self.src / file
        if isinstance(data, dict | list):
            data = json.dumps(data)
        if isinstance(data, str):
            data = data.encode()
        path.write_bytes(data)
        return path

    def tier_dir(self, tier: str) -> Path:
        if tier == "system":
            return self.storage / "tool"
        if tier == "user":
            return self.storage / "home" / str(os.getuid()) / "tool"
        return self.storage / "shared" / tier.split(":", 1)[1] / "tool"

    def tiers(self) -> dict[str, dict]:
        """A snapshot of every tier this world installs into."""
        return {t: snapshot(self.tier_dir(t)) for t in ("system", "shared:lab")}

    def install(self, manifest: Path, tier: str = "system") -> Run:
        return self.ctx("object", "install", manifest, "--tier", tier)

    def grant(self, name: str, tier: str = "system") -> None:
        """Both layers of P-6 for ``coder``: the tool's own policy and the agent's."""
        for policy in (
            self.tier_dir(tier) / f"{name}.d" / "policy",
            self.storage / "agent" / f"{AGENT}.d" / "policy",
        ):
            with policy.open("a") as f:
                f.write(f"allow {LABEL} tool:{name} execute\n")

    def installed(self, manifest: Path, name: str, tier: str = "system") -> None:
        r = self.install(manifest, tier)
        assert r.rc == 0, r
        assert r.out == f"installed {name} in tier {tier}: {self.tier_dir(tier) / name}\n", r
        self.grant(name, tier)

    def terminal(self, tool: str, *argv: str) -> Run:
        return self.ctx("run", "--agent", AGENT, tool, *argv)

    def native(self, tool: str, value: object) -> tuple[Run, dict]:
        r = self.ctx("run", "--native", "--agent", AGENT, tool, input=json.dumps(value))
        frames = [json.loads(line) for line in r.lines()]
        assert frames and frames[-1]["type"] == "result", r
        return r, frames[-1]

    def listing(self, *args: str) -> dict[str, dict]:
        listed = self.ctx("object", "list", "--json", *args)
        assert listed.rc == 0, listed
        entries = listed.json()
        for entry in entries:
            assert set(entry) == LIST_KEYS, entry
        return {(e["tier"], e["name"]): e for e in entries}

    def check_json(self, *manifests: Path) -> tuple[Run, dict[str, dict]]:
        r = self.ctx("object", "check", "--json", *manifests)
        entries = r.json()
        assert [e["manifest"] for e in entries] == [str(m) for m in manifests], r
        for entry in entries:
            assert set(entry) == CHECK_KEYS, entry
            assert len(entry["problems"]) == len(entry["codes"]), entry
        return r, {e["manifest"]: e for e in entries}

    def events(self) -> list[dict]:
        uid = nobody().pw_uid
        return read_jsonl(
            self.storage
            / "home"
            / str(uid)
            / "agent"
            / AGENT
            / "session"
            / "default"
            / "events.jsonl"
        )


@pytest.fixture
def world(searchable_storage: Path) -> Iterator[World]:
    agent_user = nobody()
    top = new_scratch_dir(SCRATCH, "w")
    try:
        src = top / "src"
        src.mkdir()
        src.chmod(0o755)
        (src / "prog.sh").write_text(ECHO)
        w = World(searchable_storage, src)
        made = w.ctx("shared", "create", "lab", "--group", str(agent_user.pw_gid))
        assert made.rc == 0, made
        request = {
            "name": AGENT,
            "label": LABEL,
            "tools": [],
            "shared": {"lab": ["read"]},
            "mount": [],
        }
        made = w.ctx("agent", "create", "-", input=json.dumps(request))
        assert made.rc == 0, made
        yield w
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ----------------------------------------------------------------------------------------------
# the manifest file itself


def test_a_manifest_that_is_no_json_object_file_is_refused_in_one_line_and_installs_nothing(
    world: World,
) -> None:
    """T-8, docs "How the manifest … are read": a JSON array (even of a valid manifest), a
    string, null, an empty file, blanks, trailing data and bytes that are not UTF-8 are each
    one EINVAL problem; a FIFO (named, or through a link), a directory and a device are
    EINVAL without being waited on; a dangling link is ENOENT with ``error`` set in
    ``--json``; ``install`` of them exits 1 and leaves every tier as it was."""
    w = world
    invalid = {
        "array": w.write("array.json", [document("arr")]),
        "string": w.write("string.json", '"a manifest"'),
        "null": w.write("null.json", "null"),
        "empty": w.write("empty.json", b""),
        "blanks": w.write("blanks.json", b" \r\n\t\n"),
        "trailing": w.write("trailing.json", json.dumps(document("tr")) + "\n{}"),
        "latin1": w.write(
            "latin1.json", json.dumps(document("l1")).replace("tool.", "t\xe9l.").encode("latin-1")
        ),
    }
    os.mkfifo(w.src / "fifo.json")
    (w.src / "dir.json").mkdir()
    (w.src / "to-fifo.json").symlink_to("fifo.json")
    unreadable = {
        "fifo": w.src / "fifo.json",
        "to-fifo": w.src / "to-fifo.json",
        "dir": w.src / "dir.json",
        "device": Path("/dev/null"),
    }
    (w.src / "dangling.json").symlink_to("nowhere.json")
    dangling = w.src / "dangling.json"
    before = w.tiers()

    r, entries = w.check_json(*invalid.values(), *unreadable.values(), dangling)
    assert r.rc == 1, r
    for case, path in invalid.items():
        entry = entries[str(path)]
        assert (entry["valid"], entry["name"], entry["error"]) == (False, None, None), case
        assert entry["codes"] == ["EINVAL"], (case, entry)
    assert "is not of type 'object'" in entries[str(invalid["array"])]["problems"][0]
    for case, path in unreadable.items():
        entry = entries[str(path)]
        assert entry["valid"] is False and entry["problems"] == [], (case, entry)
        assert entry["error"]["error"] == "EINVAL", (case, entry)
        assert "not a regular file" in entry["error"]["message"], (case, entry)
    assert entries[str(dangling)]["error"]["error"] == "ENOENT", entries[str(dangling)]

    text = w.ctx("object", "check", *invalid.values(), *unreadable.values(), dangling)
    assert text.rc == 1 and text.out == "", text
    lines = text.err.splitlines()
    assert len(lines) == len(invalid) + len(unreadable) + 1, text
    for path in [*invalid.values(), *unreadable.values(), dangling]:
        [line] = [ln for ln in lines if ln.startswith(f"{path}: ")]
        code = "ENOENT" if path == dangling else "EINVAL"
        assert line.startswith(f"{path}: {code}: "), line

    for path in (invalid["array"], invalid["empty"], unreadable["to-fifo"], dangling):
        refused = w.install(path)
        assert refused.rc == 1 and refused.out == "", refused
        assert refused.err.startswith("ctx: E"), refused
    assert w.tiers() == before


def test_a_bom_crlf_and_exactly_one_mebibyte_install_and_one_byte_more_does_not(
    world: World,
) -> None:
    """T-8: a manifest saved with a UTF-8 byte-order mark, with CRLF line ends, or padded
    with blanks to exactly 1048576 bytes is valid, installs and runs; one byte more, or a
    sparse gigabyte, is EINVAL ("at most 1048576 bytes"), nothing installed."""
    w = world
    bom = w.write("bom.json", b"\xef\xbb\xbf" + json.dumps(document("bom.tool")).encode())
    crlf = w.write("crlf.json", json.dumps(document("crlf.tool"), indent=2).replace("\n", "\r\n"))
    compact = json.dumps(document("mib.tool")).encode()
    exact = w.write("mib.json", compact[:-1] + b" " * (MIB - len(compact)) + b"}")
    over = w.write("over.json", compact[:-1] + b" " * (MIB + 1 - len(compact)) + b"}")
    assert exact.stat().st_size == MIB and over.stat().st_size == MIB + 1
    sparse = w.src / "sparse.json"
    with sparse.open("wb") as f:
        f.write(compact[:-1])
        f.truncate(1 << 30)

    r, entries = w.check_json(bom, crlf, exact, over, sparse)
    assert r.rc == 1, r
    assert [entries[str(p)]["name"] for p in (bom, crlf, exact)] == [
        "bom.tool",
        "crlf.tool",
        "mib.tool",
    ]
    for path in (over, sparse):
        assert entries[str(path)]["problems"] == ["a manifest is at most 1048576 bytes"]
        assert entries[str(path)]["codes"] == ["EINVAL"]

    before = w.tiers()
    for path in (over, sparse):
        refused = w.install(path)
        assert refused.rc == 1 and "at most 1048576 bytes" in refused.err, refused
    assert w.tiers() == before
    for path, name in ((bom, "bom.tool"), (crlf, "crlf.tool"), (exact, "mib.tool")):
        w.installed(path, name)
        ran = w.terminal(name, "x")
        assert (ran.rc, ran.out) == (0, "ran x\n"), ran


def test_duplicate_keys_are_refused_with_every_other_problem_listed(world: World) -> None:
    """T-8, docs "Manifests": a key given twice — at the top and in ``cap`` — is EINVAL
    naming each, and the other problems of the manifest as Python reads it are listed
    too (here a 65-byte name and a missing program), all in ``--json``'s codes; nothing is
    installed."""
    w = world
    long_name = "n" * 65
    text = (
        '{"manifest": 2, "kind": "tool", "name": "NAME", "description": "d",'
        ' "schema": {"type": "object"}, "cap": {"network": false, "network": true},'
        ' "exec": "prog.sh", "exec": "missing.sh"}'.replace("NAME", long_name)
    )
    dup = w.write("dup.json", text)
    r, entries = w.check_json(dup)
    entry = entries[str(dup)]
    assert r.rc == 1 and entry["valid"] is False, r
    problems = entry["problems"]
    assert "twice" in problems[0] and "'exec'" in problems[0] and "'network'" in problems[0]
    assert any(p.startswith("name: ") and "65 bytes" in p for p in problems), problems
    assert any("missing.sh" in p for p in problems), problems
    assert set(entry["codes"]) == {"EINVAL"}, entry
    shown = w.ctx("object", "check", dup)
    assert len(shown.err.splitlines()) == len(problems), shown
    before = w.tiers()
    refused = w.install(dup)
    assert refused.rc == 1 and "twice" in refused.err, refused
    assert w.tiers() == before


def test_host_owned_and_unknown_fields_are_refused_by_name(world: World) -> None:
    """T-8: ``status``, ``origin``, ``policy``, ``log``, ``hooks`` and a field of the author's
    own are no v2 field (installing grants nothing, the host owns those controls): one line
    naming them all; a ``manifest`` 3 of ``kind`` agent is two more lines; nothing is
    installed.  A ``manifest`` of ``2.0`` is the number 2 (JSON Schema compares numbers by
    value)."""
    w = world
    owned = w.write(
        "owned.json",
        document(
            "owned",
            status="disabled",
            origin="https://example.org",
            policy="allow x tool:y execute",
            log="",
            hooks={"pre.d": []},
            x_comment="mine",
        ),
    )
    other = w.write("other.json", document("other", manifest=3, kind="agent"))
    float_two = w.write("two.json", document("two.float", manifest=2.0))
    r, entries = w.check_json(owned, other, float_two)
    assert r.rc == 1, r
    [problem] = entries[str(owned)]["problems"]
    for field in ("status", "origin", "policy", "log", "hooks", "x_comment"):
        assert f"'{field}'" in problem, problem
    assert "no such field" in problem, problem
    assert sorted(entries[str(other)]["problems"]) == [
        "kind: 'tool' was expected",
        "manifest: 2 was expected",
    ]
    assert entries[str(float_two)]["valid"] is True, entries
    before = w.tiers()
    for path in (owned, other):
        assert w.install(path).rc == 1
    assert w.tiers() == before


# ----------------------------------------------------------------------------------------------
# names

LEGAL_NAMES = ["a" * 64, "Tool.X", "a..b", "abc.", "a-", "0", "x.D", "a.d.x", "A_b"]
ILLEGAL_NAMES = {
    "b" * 65: "65 bytes",
    ".a": "must start with a letter or digit",
    "-a": "must start with a letter or digit",
    "_a": "must start with a letter or digit",
    "..": "must start with a letter or digit",
    "a.d": "ends in '.d'",
    "a/b": "holds '/'",
    "a b": "holds ' '",
    "caf\u00e9": "caf",
    "": "must not be empty",
    "a\n": "holds '\\n'",
    "a\x1b[2J": "\\x1b",
}


def test_names_past_r3s_limits_are_one_einval_line_each_and_install_nothing(
    world: World,
) -> None:
    """R-3, T-8, T-8a: a 65-byte name, a leading ``.``/``-``/``_``, ``..``, ``.d``, ``/``, a
    blank, a non-ASCII letter, a line break and an escape are each one EINVAL ``name:`` line
    (shown escaped), and nothing is installed; ``which`` of a 65-byte name is a usage error
    (exit 2)."""
    w = world
    bad = [w.write(f"bad{i}.json", document(name)) for i, name in enumerate(ILLEGAL_NAMES)]
    r, entries = w.check_json(*bad)
    assert r.rc == 1, r
    for path, (name, words) in zip(bad, ILLEGAL_NAMES.items(), strict=True):
        entry = entries[str(path)]
        assert entry["codes"] == ["EINVAL"], (name, entry)
        [problem] = entry["problems"]
        assert problem.startswith("name: ") and words in problem, (name, problem)
    shown = w.ctx("object", "check", *bad)
    assert shown.rc == 1 and not raw_controls(shown.err), shown
    assert len(shown.err.splitlines()) == len(bad), shown
    before = w.tiers()
    for path in (bad[0], bad[5], bad[-1]):  # 65 bytes, '.d', an escape
        refused = w.install(path)
        assert refused.rc == 1 and "EINVAL" in refused.err, refused
        assert not raw_controls(refused.err), refused
    assert w.tiers() == before
    too_long = w.ctx("object", "which", "c" * 65)
    assert too_long.rc == 2 and "EINVAL" in too_long.err and "65 bytes" in too_long.err


def test_names_at_r3s_limits_install_list_resolve_and_run(world: World) -> None:
    """R-3, T-8, T-8a: names of 64 bytes, upper case, leading/trailing/doubled dots and a
    ``.D`` ending install, are listed exactly, resolve with ``ctx object which`` (when
    ``/ctx`` is not mounted on this host) and run as the agent."""
    w = world
    for i, name in enumerate(LEGAL_NAMES):
        w.installed(w.write(f"good{i}.json", document(name)), name)
    listing = w.listing("--tier", "system")
    for name in LEGAL_NAMES:
        entry = listing[("system", name)]
        assert entry["path"] == str(w.storage / "tool" / name), entry
        assert (entry["status"], entry["description"]) == ("available", f"The {name} tool.")
    if not os.path.ismount("/ctx"):
        for name in ("a" * 64, "abc.", "x.D"):
            which = w.ctx("object", "which", name)
            assert (which.rc, which.out) == (0, f"{w.storage / 'tool' / name}\n"), which
    for name in ("a" * 64, "Tool.X", "abc.", "x.D"):
        ran = w.terminal(name, "arg")
        assert (ran.rc, ran.out) == (0, "ran arg\n"), (name, ran)


# ----------------------------------------------------------------------------------------------
# descriptions


def test_a_description_of_controls_rtl_marks_and_nul_shows_escaped_and_comes_back_exact(
    world: World,
) -> None:
    """T-8, T-8a: a description holding NUL, an OSC title sequence, BEL, a C1 CSI, an RTL
    override and a second line installs; ``object list`` shows its first line escaped (no raw
    control reaches stdout), ``--json`` gives that line exactly, the ``description`` control
    holds the whole text, and ``check`` names a manifest path holding an escape escaped."""
    w = world
    first = "Reads\x00files \x1b]0;pwned\x07 \x9b31m and \u202eeulav\u202c"
    description = first + "\nSecond line."
    path = w.write("odd\x1b[2Jname.json", document("odd.desc", description=description))
    checked = w.ctx("object", "check", path)
    assert checked.rc == 0, checked
    assert checked.out == f"{w.src}/odd\\x1b[2Jname.json: valid (odd.desc)\n", checked
    w.installed(path, "odd.desc")
    control = w.storage / "tool" / "odd.desc.d" / "description"
    assert control.read_text() == description + "\n"

    listed = w.ctx("object", "list", "--tier", "system")
    assert listed.rc == 0 and not raw_controls(listed.out), listed
    [line] = [ln for ln in listed.lines() if ln.startswith("odd.desc ")]
    for escaped in ("\\x00", "\\x1b]0;pwned\\x07", "\\x9b31m", "\\u202eeulav\\u202c"):
        assert escaped in line, line
    assert "Second line" not in line, line
    entry = w.listing("--tier", "system")[("system", "odd.desc")]
    assert entry["description"] == first, entry


def test_descriptions_past_8192_characters_or_with_lone_surrogates_are_named_briefly(
    world: World,
) -> None:
    """T-8: a description of 8192 four-byte characters is valid and lists exactly; one of
    8193 characters, and one of a megabyte, are one EINVAL ``description:`` line each, of a
    few hundred bytes at most; a lone surrogate in the description, in a ``cap`` key and in
    the name are each a line naming the field; a description of blanks only is refused."""
    w = world
    emoji = "\U0001f600" * 8192
    wide = w.write("wide.json", document("wide.desc", description=emoji))
    past = w.write("past.json", document("past.desc", description="x" * 8193))
    huge = w.write("huge.json", document("huge.desc", description="y" * 1_000_000))
    assert huge.stat().st_size < MIB
    lone = w.write(
        "lone.json", document("lone\ud800", description="a\udfffb", cap={"\ud800": True})
    )
    blank = w.write("blank.json", document("blank.desc", description=" \n\t "))
    r, entries = w.check_json(wide, past, huge, lone, blank)
    assert r.rc == 1, r
    assert entries[str(wide)]["valid"] is True, entries[str(wide)]
    for path in (past, huge):
        [problem] = entries[str(path)]["problems"]
        assert problem.startswith("description: ") and "too long" in problem, problem
        assert len(problem) < 400, len(problem)
    problems = entries[str(lone)]["problems"]
    for field in ("name", "description", "cap"):
        assert any(p.startswith(f"{field}: ") and "lone surrogate" in p for p in problems), (
            field,
            problems,
        )
    assert entries[str(blank)]["problems"] == ["description: only blanks; say what the tool does"]
    text = w.ctx("object", "check", huge)
    assert text.rc == 1 and len(text.err) < 600, len(text.err)

    w.installed(wide, "wide.desc")
    entry = w.listing("--tier", "system")[("system", "wide.desc")]
    assert entry["description"] == emoji, len(entry["description"])


# ----------------------------------------------------------------------------------------------
# exec


def test_exec_values_that_are_dotted_long_or_not_a_file_are_named_per_manifest(
    world: World,
) -> None:
    """T-8, docs "How the manifest and its program are read": ``./prog.sh`` and
    ``sub//prog.sh`` are the program below the manifest; ``.``, ``sub`` (a directory), a
    FIFO, an empty string, a number, a 300-byte component and a path of 3000 components are
    EINVAL naming ``exec``, never waited on; the valid ones install and run."""
    w = world
    sub = w.src / "sub"
    sub.mkdir()
    (sub / "prog.sh").write_text(ECHO)
    os.mkfifo(w.src / "pipe.sh")
    good = {
        "dot.slash": w.write("g1.json", document("dot.slash", exec="./prog.sh")),
        "double.slash": w.write("g2.json", document("double.slash", exec="sub//prog.sh")),
    }
    bad = {
        "dot": w.write("b1.json", document("b.dot", exec=".")),
        "dir": w.write("b2.json", document("b.dir", exec="sub")),
        "fifo": w.write("b3.json", document("b.fifo", exec="pipe.sh")),
        "empty": w.write("b4.json", document("b.empty", exec="")),
        "number": w.write("b5.json", document("b.number", exec=7)),
        "component": w.write("b6.json", document("b.component", exec="p" * 300)),
        "deep": w.write("b7.json", document("b.deep", exec="d/" * 3000 + "prog.sh")),
    }
    r, entries = w.check_json(*good.values(), *bad.values())
    assert r.rc == 1, r
    for name, path in good.items():
        assert entries[str(path)]["name"] == name, entries[str(path)]
    for case, path in bad.items():
        entry = entries[str(path)]
        assert entry["valid"] is False and entry["codes"] == ["EINVAL"], (case, entry)
        assert entry["problems"][0].startswith("exec"), (case, entry)
    before = w.tiers()
    for case in ("dir", "fifo", "deep"):
        refused = w.install(bad[case])
        assert refused.rc == 1 and "exec" in refused.err, refused
    assert w.tiers() == before
    for name, path in good.items():
        w.installed(path, name)
        assert (w.storage / "tool" / name).read_text() == ECHO
        ran = w.terminal(name, "go")
        assert (ran.rc, ran.out) == (0, "ran go\n"), ran


def test_an_exec_holding_nul_is_an_einval_line_not_a_traceback(world: World) -> None:
    """T-8: JSON can spell a NUL (``"prog.sh\\u0000x"``) but no path holds one: ``check`` (text
    and ``--json``) lists it as an EINVAL ``exec:`` problem, exit 1, and ``install`` refuses
    it with nothing installed, as it does a NUL in ``mcp``'s ``config``."""
    w = world
    path = w.write("nul.json", document("nul.exec", exec="prog.sh\x00x"))
    for args in (
        ("object", "check", path),
        ("object", "check", "--json", path),
        ("object", "install", path, "--tier", "system"),
    ):
        r = ctx_run(*args, env=w.env)
        assert r.rc == 1 and "Traceback" not in r.err, r
        assert "EINVAL" in r.err or "EINVAL" in r.out, r
    assert not (w.storage / "tool" / "nul.exec").exists()


INTERPRETERS = {
    "gone.interp": "#!/nonexistent/interpreter\necho never\n",
    "crlf.interp": "#!/bin/sh\r\necho never\r\n",
}


@pytest.mark.parametrize("name", sorted(INTERPRETERS))
def test_a_program_whose_interpreter_is_not_there_fails_a_native_call_at_stage_run(
    world: World, name: str
) -> None:
    """T-3, T-7, docs "Running a tool" (stage ``run``): a program naming an interpreter that
    does not exist (or, saved with CRLF, ``/bin/sh\\r``) installs; a native call is an error
    at stage ``run``, ``ENOENT``, exit status null — not an exit 127 of a tool that ran — in
    the result frame and in the session."""
    w = world
    (w.src / f"{name}.sh").write_text(INTERPRETERS[name])
    w.installed(w.write(f"{name}.json", document(name, exec=f"{name}.sh")), name)
    r, result = w.native(name, {})
    assert r.rc == 1 and result["status"] == "error", r
    assert result["exit_status"] is None, result
    assert (result["error"]["error"], result["error"]["stage"]) == ("ENOENT", "run"), result
    [recorded] = [e for e in w.events() if e["type"] == "tool_result"]
    assert (recorded["errno"], recorded["stage"], recorded["exit_status"]) == (
        "ENOENT",
        "run",
        None,
    )


@pytest.mark.parametrize("name", sorted(INTERPRETERS))
def test_a_program_whose_interpreter_is_not_there_fails_a_terminal_call_at_stage_run(
    world: World, name: str
) -> None:
    """T-3, T-7, docs "Running a tool": the same call in terminal mode goes through the same
    stages: its ``tool_result`` in the session and the tool's log says stage ``run``,
    ``ENOENT``, exit status null, and ``ctx run`` says ENOENT on stderr."""
    w = world
    (w.src / f"{name}.sh").write_text(INTERPRETERS[name])
    w.installed(w.write(f"{name}.json", document(name, exec=f"{name}.sh")), name)
    r = w.terminal(name, "x")
    assert r.rc != 0, r
    [recorded] = [e for e in w.events() if e["type"] == "tool_result"]
    assert (recorded["errno"], recorded["stage"], recorded["exit_status"]) == (
        "ENOENT",
        "run",
        None,
    ), recorded
    assert "ENOENT" in r.err, r


def test_a_linked_manifest_takes_its_relative_exec_from_the_directory_it_was_named_in(
    world: World,
) -> None:
    """T-8, docs "How the manifest … are read" ("a link to it is followed: it is the file
    you named"): a manifest reached through a symbolic link in another directory is read
    from its target, and its relative ``exec`` is taken beside the link."""
    w = world
    (w.src / "real").mkdir()
    (w.src / "named").mkdir()
    (w.src / "real" / "prog.sh").write_text("#!/bin/sh\necho beside-the-target\n")
    (w.src / "named" / "prog.sh").write_text("#!/bin/sh\necho beside-the-link\n")
    (w.src / "real" / "m.json").write_text(json.dumps(document("linked.m")))
    (w.src / "named" / "m.json").symlink_to("../real/m.json")
    w.installed(w.src / "named" / "m.json", "linked.m")
    ran = w.terminal("linked.m")
    assert (ran.rc, ran.out) == (0, "beside-the-link\n"), ran


# ----------------------------------------------------------------------------------------------
# cap and mcp


def test_cap_values_are_judged_only_for_side_effects_and_network_and_by_installed_size(
    world: World,
) -> None:
    """T-8, C-2, docs "Manifests": ``side_effects`` as a string and ``network`` null are a
    line each; a ``cap`` array is one, and so is a ``program`` that is null, an array, holds a
    lone surrogate or is no JSON Schema; facts of the author's own (an escape in a key, nested
    values, ``{}``) install and come back exactly from the ``cap`` control; a ``cap`` that
    fits the manifest but not a control once indented is EFBIG at check and install, and a
    reinstall refused so keeps the version in place."""
    w = world
    typed = w.write(
        "typed.json", document("typed.cap", cap={"side_effects": "false", "network": None})
    )
    array = w.write("array.json", document("array.cap", cap=[]))
    facts = {"gpu": "a100", "\x1b[31m": 1, "nested": {"a": [1, 2.5, None]}, "side_effects": True}
    own = w.write("own.json", document("own.cap", cap=facts))
    empty = w.write("empty.json", document("empty.cap", cap={}))
    big_cap = {f"k{i:05d}": 0 for i in range(80000)}
    big = w.write("big.json", json.dumps(document("own.cap", cap=big_cap), separators=(",", ":")))
    assert big.stat().st_size < MIB

    programs = {
        "null": (None, "program: None is not of type 'object'"),
        "array": ([], "program: [] is not of type 'object'"),
        "lone": ({"description": "\ud800"}, "program holds '\\ud800'"),
        "type": ({"type": "nonsense"}, "program is not a valid JSON Schema"),
    }
    program_paths = {
        case: w.write(f"program-{case}.json", {**document("prog.field"), "program": value})
        for case, (value, _) in programs.items()
    }
    r, entries = w.check_json(typed, array, own, empty, big, *program_paths.values())
    assert r.rc == 1, r
    assert sorted(entries[str(typed)]["problems"]) == [
        "cap/network: None is not of type 'boolean'",
        "cap/side_effects: 'false' is not of type 'boolean'",
    ]
    assert entries[str(array)]["problems"] == ["cap: [] is not of type 'object'"]
    assert entries[str(own)]["valid"] and entries[str(empty)]["valid"], entries
    for case, (_, start) in programs.items():
        [problem] = entries[str(program_paths[case])]["problems"]
        assert problem.startswith(start), (case, problem)
    [problem] = entries[str(big)]["problems"]
    assert entries[str(big)]["codes"] == ["EFBIG"] and "1048576" in problem, entries[str(big)]

    w.installed(own, "own.cap")
    w.installed(empty, "empty.cap")
    cap = w.storage / "tool" / "own.cap.d" / "cap"
    assert json.loads(cap.read_text()) == facts
    kept = snapshot(w.storage / "tool")
    refused = w.install(big)
    assert refused.rc == 1 and "EFBIG" in refused.err, refused
    assert snapshot(w.storage / "tool") == kept
    assert not raw_controls(w.ctx("object", "list").out)
    ran = w.terminal("own.cap", "still")
    assert (ran.rc, ran.out) == (0, "ran still\n"), ran


def test_mcp_locators_with_odd_values_list_every_problem(world: World) -> None:
    """M-3, M-4, T-8: an ``mcp`` locator with another transport, a ``url``, a relative
    config, a NUL or ``..`` in the config path, a name that is not ``<server>.<tool>``, an
    empty remote tool, or beside an ``exec`` is refused with a line per problem; nothing is
    installed."""
    w = world
    config = w.write("mcp.json", {"mcpServers": {"srv": {"command": "/bin/true"}}})

    def locator(**fields: str) -> dict:
        return {"transport": "stdio", "config": str(config), "server": "srv", "tool": "t", **fields}

    cases = {
        "http": (
            document(
                "srv.t", exec=None, mcp=locator(transport="http", url="http://x", config="rel.json")
            ),
            ["mcp: Additional properties", "mcp/transport:", "mcp/config:"],
        ),
        "nul": (
            document("srv.t", exec=None, mcp=locator(config="/tmp/a\x00b")),
            ["mcp/config: holds a NUL"],
        ),
        "dotdot": (
            document("srv.t", exec=None, mcp=locator(config="/tmp/../etc/mcp.json")),
            ["mcp/config: '..'"],
        ),
        "renamed": (document("other", exec=None, mcp=locator()), ["name: an MCP-backed tool"]),
        "no.tool": (document("srv.", exec=None, mcp=locator(tool="")), ["mcp/tool:"]),
        "both": (document("srv.t", mcp=locator()), ["a manifest names exactly one of 'exec'"]),
    }
    paths = {case: w.write(f"mcp-{case}.json", doc) for case, (doc, _) in cases.items()}
    r, entries = w.check_json(*paths.values())
    assert r.rc == 1, r
    for case, (_, expected) in cases.items():
        problems = entries[str(paths[case])]["problems"]
        assert len(problems) == len(expected), (case, problems)
        for start in expected:
            assert any(p.startswith(start) for p in problems), (case, start, problems)
    before = w.tiers()
    for case in ("http", "both"):
        assert w.install(paths[case]).rc == 1
    assert w.tiers() == before


# ----------------------------------------------------------------------------------------------
# two installs at once


VERSIONS = {
    "A": ("#!/bin/sh\necho version-A\n", {"side_effects": True, "network": False}),
    "B": ("#!/bin/sh\necho version-B\n", {"side_effects": False, "network": True}),
}


@pytest.mark.parametrize("tier", ["system", "user", "shared:lab"])
def test_two_installs_of_one_name_at_once_leave_one_whole_version(world: World, tier: str) -> None:
    """T-8, docs "How an install stays atomic": two ``ctx object install`` processes of one
    name with different programs, descriptions and caps, started together, both succeed
    (one ``installed``, the other ``replaced``); the tool left is one version whole —
    executable, description, cap and schema of the same manifest — with no staging name
    left, ``available``, and (system and shared tiers) a call runs that version."""
    w = world
    manifests = {}
    for version, (program, cap) in VERSIONS.items():
        (w.src / f"race-{version}.sh").write_text(program)
        manifests[version] = w.write(
            f"race-{version}.json",
            document(
                "race.tool",
                description=f"Version {version}.",
                cap=cap,
                schema={"type": "object", "title": version},
                exec=f"race-{version}.sh",
            ),
        )
    tier_dir = w.tier_dir(tier)
    verbs = []
    for round_ in range(3):
        order = "AB" if round_ % 2 == 0 else "BA"
        procs = [
            subprocess.Popen(
                [*CTX_ARGV, "object", "install", str(manifests[v]), "--tier", tier],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=w.env,
            )
            for v in order
        ]
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0 and b"Traceback" not in err, (out, err)
            verbs.append(out.decode().split(" ", 1)[0])
        program = (tier_dir / "race.tool").read_text()
        version = program.strip()[-1]
        controls = tier_dir / "race.tool.d"
        assert (controls / "description").read_text() == f"Version {version}.\n"
        assert json.loads((controls / "cap").read_text()) == VERSIONS[version][1]
        assert json.loads((controls / "schema").read_text())["title"] == version
        assert [n for n in os.listdir(tier_dir) if "~" in n] == [], os.listdir(tier_dir)
        entry = w.listing("--tier", tier)[(tier, "race.tool")]
        assert (entry["status"], entry["description"]) == ("available", f"Version {version}.")
    assert sorted(verbs[:2]) == ["installed", "replaced"], verbs
    assert verbs[2:] == ["replaced"] * 4, verbs
    if tier == "user":
        return  # root's user tier is on no agent's CTX_PATH
    w.grant("race.tool", tier)
    ran = w.terminal("race.tool")
    assert (ran.rc, ran.out) == (0, f"version-{version}\n"), ran
