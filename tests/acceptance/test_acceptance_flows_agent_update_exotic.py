"""``agent.update`` (SPEC A-5) fed what a careless or hostile agent, or a damaged host, gives it:
prompts at and around the 8 KiB limit (multi-byte characters straddling it), text that is not
plain (NUL, escapes, C1, lone surrogates, bytes that are not UTF-8, CRLF, nothing at all), every
control name but the two it may change, a control replaced by a link, a FIFO or a directory, a
controls directory that is full or read-only, updates racing each other and an open reader,
grants in only one of the two policies (P-6), and callers that are not the agent's own call
(another agent's ``shell.exec``, a standalone user).  Each call must be recorded as an ordinary
``tool_call``/``tool_result`` pair (S-2, T-7) without the whole prompt (S-4), and change
nothing but the one control it was allowed to.

Also covered: A-3 (what ``agent/<name>.d`` holds), A-4 (the capability answers only its own
tool).  Black-box: the installed ``ctx``, real processes, real uids (agents run as nobody),
a real tmpfs for the full and read-only cases."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    Run,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
)
from tests.support.scratch_mounts import ScratchMounts
from tests.support.storage import copy_of_root
from tests.support.users import find_or_create_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as another uid (nobody): needs root"
)

SCRATCH = scratch_top(__file__)
NOBODY = 65534
LIMIT = 8192  # at most 8 KiB of UTF-8
UPDATABLE = ("system.md", "prompt.template.md")


# ---------------------------------------------------------------------------------- helpers


@dataclass
class Site(OnStorage):
    """A storage root below this file's scratch directory, searchable by every uid, with
    agent ``coder`` (label coder_t, agent.update granted in both layers) and agent ``other``
    (label other_t, shell.exec and agent.update granted in both layers), both as nobody."""

    top: Path
    storage: Path
    mounts: ScratchMounts

    def controls(self, agent: str = "coder") -> Path:
        return self.storage / "agent" / f"{agent}.d"

    def control(self, name: str, agent: str = "coder") -> Path:
        return self.controls(agent) / name

    def state(self, agent: str = "coder") -> dict[str, tuple]:
        """Every entry of the agent's controls directory but its log: kind and content."""
        found: dict[str, tuple] = {}
        for entry in sorted(os.listdir(self.controls(agent))):
            path = self.controls(agent) / entry
            if entry == "log":
                continue
            if path.is_symlink():
                found[entry] = ("link", os.readlink(path))
            elif path.is_file():
                found[entry] = ("file", path.read_bytes(), stat.S_IMODE(path.lstat().st_mode))
            else:
                found[entry] = ("other", stat.S_IFMT(path.lstat().st_mode))
        return found

    def log(self, agent: str = "coder") -> list[dict]:
        return read_jsonl(self.controls(agent) / "log")

    def updated(self, agent: str = "coder") -> list[tuple[str, str, int]]:
        """The ``agent.updated`` facts of the agent's log: (control, session, bytes)."""
        return [
            (e["control"], e["session"], e["bytes"])
            for e in self.log(agent)
            if e["type"] == "agent.updated"
        ]

    def events(self, session: str, agent: str = "coder") -> list[dict]:
        place = self.storage / "home" / str(NOBODY) / "agent" / agent / "session" / session
        return read_jsonl(place / "events.jsonl")

    def pairs(self, session: str, agent: str = "coder") -> list[tuple[str, str]]:
        """(type, status) of the agent.update events of ``session``."""
        return [
            (e["type"], e["status"])
            for e in self.events(session, agent)
            if e.get("object") == "tool/agent.update" and e["type"] in ("tool_call", "tool_result")
        ]

    def tool_log(self) -> list[dict]:
        return read_jsonl(self.storage / "tool" / "agent.update.d" / "log")

    def terminal(self, payload: object, session: str = "t", agent: str = "coder") -> Run:
        """``ctx run --agent AGENT --session S agent.update JSON`` (terminal mode, argv)."""
        text = payload if isinstance(payload, str) else json.dumps(payload)
        return self.ctx("run", "--agent", agent, "--session", session, "agent.update", text)

    def piped(self, data: bytes, session: str = "t", agent: str = "coder") -> Run:
        """The same call with its JSON input on stdin."""
        return self.ctx("run", "--agent", agent, "--session", session, "agent.update", input=data)

    def native(self, payload: object, session: str = "n", agent: str = "coder") -> dict:
        """``ctx run --native``: the result frame, with the exit status as ``rc``."""
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        ran = self.ctx(
            "run", "--agent", agent, "--session", session, "--native", "agent.update",
            input=data,
        )  # fmt: skip
        frames = [json.loads(line) for line in ran.lines() if line.strip()]
        assert frames and frames[-1]["type"] == "result", ran
        return {**frames[-1], "rc": ran.rc}


def grant_tool(site: Site, label: str, tool: str) -> None:
    with (site.storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
        policy.write(f"allow {label} tool:{tool} execute\n")


@pytest.fixture
def site(_template: Path) -> Iterator[Site]:
    top = new_scratch_dir(SCRATCH)
    mounts = ScratchMounts(top)
    try:
        storage = copy_of_root(_template, top / "storage")
        made = Site(top, storage, mounts)
        made.create_agent({"name": "coder", "label": "coder_t", "tools": ["agent.update"]})
        made.create_agent(
            {"name": "other", "label": "other_t", "tools": ["agent.update", "shell.exec"]}
        )
        grant_tool(made, "coder_t", "agent.update")
        grant_tool(made, "other_t", "agent.update")
        grant_tool(made, "other_t", "shell.exec")
        yield made
    finally:
        mounts.close()


def leftovers(site: Site, agent: str = "coder") -> list[str]:
    """Temporary files an update left in the agent's controls directory."""
    return [n for n in os.listdir(site.controls(agent)) if n.endswith(".tmp")]


def straddling(width: int, extra: int = 0) -> str:
    """``LIMIT + extra`` bytes of UTF-8 ending in one character ``width`` bytes wide."""
    last = {1: "z", 2: "é", 3: "€", 4: "😀"}[width]
    assert len(last.encode()) == width
    return "a" * (LIMIT + extra - width) + last


# ------------------------------------------------------------------ the 8 KiB boundary


def test_exactly_8_kib_is_taken_and_one_byte_more_is_efbig_in_every_mode(site: Site) -> None:
    """A-5: "rejects payloads over 8 KiB".  8192 bytes whose last (or first) character is 1
    to 4 bytes wide are taken whole, in native and in terminal mode; 8193 bytes, where that
    character straddles the limit, are EFBIG in both modes (in native mode 8193 one-byte
    characters meet the schema's ``maxLength`` first: EINVAL), with the file as the last good
    update left it and no ``agent.updated`` fact for the refusals."""
    for width in (1, 2, 3, 4):
        exact, ok, over = f"exact{width}", f"ok{width}", f"over{width}"
        text = straddling(width)
        taken = site.native({"control": "system.md", "content": text}, session=exact)
        assert (taken["rc"], taken["status"]) == (0, "ok"), (width, taken)
        assert taken["output"] == {"agent": "coder", "control": "system.md", "bytes": LIMIT}
        assert site.control("system.md").read_bytes() == text.encode(), width

        template = text[::-1]  # the wide character first: still 8192 bytes
        by_argv = site.terminal({"control": "prompt.template.md", "content": template}, ok)
        assert (by_argv.rc, by_argv.out) == (0, "prompt.template.md of agent coder updated\n")
        assert site.control("prompt.template.md").read_bytes() == template.encode(), width

        big = straddling(width, extra=1)
        assert len(big.encode()) == LIMIT + 1
        refused = site.native({"control": "system.md", "content": big}, session=over)
        assert refused["status"] == "error", (width, refused)
        if width == 1:  # 8193 characters: the schema's maxLength refuses them first
            assert refused["rc"] == 2 and refused["error"]["error"] == "EINVAL", refused
        else:
            assert refused["rc"] == 1 and refused["output"]["error"] == "EFBIG", refused
            assert f"at most {LIMIT} bytes, not {LIMIT + 1}" in refused["output"]["message"]
        piped = site.piped(json.dumps({"control": "prompt.template.md", "content": big}).encode(),
                           over)  # fmt: skip
        assert piped.rc == 1 and piped.err.startswith("agent.update: EFBIG: "), piped
        assert site.control("system.md").read_bytes() == text.encode(), width
        assert site.control("prompt.template.md").read_bytes() == template.encode(), width
        assert site.pairs(over) == [("tool_call", "ok"), ("tool_result", "error")] * 2
    assert site.updated() == [
        fact
        for width in (1, 2, 3, 4)
        for fact in (
            ("system.md", f"exact{width}", LIMIT),
            ("prompt.template.md", f"ok{width}", LIMIT),
        )
    ]
    assert leftovers(site) == []


def test_prompts_far_over_the_limit_are_refused_whole_and_never_cut(site: Site) -> None:
    """A-5: a prompt far past 8 KiB (past the 64 KiB request line the host reads, past the
    1 MiB of input too) is refused in terminal mode with EFBIG naming its size, never written
    cut off; in native mode the schema's ``maxLength`` refuses 8193 characters first
    (EINVAL, stage ``schema``).  Nothing changes."""
    before = site.state()
    for size in (LIMIT + 1, 70_000, 2_000_000):
        data = json.dumps({"control": "system.md", "content": "x" * size}).encode()
        refused = site.piped(data, "far")
        assert refused.rc == 1, refused
        assert refused.err == (
            f"agent.update: EFBIG: system.md may hold at most {LIMIT} bytes, not {size}\n"
        ), refused
    schema = site.native({"control": "system.md", "content": "x" * (LIMIT + 1)}, "far")
    assert schema["rc"] == 2 and schema["error"]["error"] == "EINVAL", schema
    assert schema["error"]["stage"] == "schema", schema
    assert site.state() == before and site.updated() == []


# --------------------------------------------------------------- what text is accepted


PLAIN = {
    "empty": "",
    "crlf": "first\r\nsecond\r\n",
    "tab": "a\tb\n",
    "bom": "\ufeffhello\n",
    "pair": "\ud83d\ude00 smile\n",  # a surrogate pair in JSON: one 4-byte character
    "separators": "a\u2028b\u2029c\n",
    "noncharacter": "a\uffffb\n",
    "no final newline": "no newline at the end",
}

NOT_PLAIN = {
    "nul": "a\x00b",
    "escape": "a\x1b[2Jb",
    "bell": "a\x07b",
    "vertical tab": "a\x0bb",
    "form feed": "a\x0cb",
    "delete": "a\x7fb",
    "c1 next line": "a\x85b",
    "c1 csi": "a\x9b2Jb",
    "lone high surrogate": "a\ud800b",
    "lone low surrogate": "a\udfffb",
}


def test_plain_text_is_kept_byte_for_byte_and_other_text_is_einval(site: Site) -> None:
    """A-5 "re-validates ... content": tabs, CR and LF, an empty prompt, a BOM, a surrogate
    pair, separators and noncharacters are text and are written exactly as their UTF-8; a
    control character other than tab/CR/LF (C0, DEL, C1) or a lone surrogate is EINVAL, and
    the file keeps what it held."""
    for name, text in PLAIN.items():
        taken = site.native({"control": "system.md", "content": text}, session="plain")
        assert taken["rc"] == 0 and taken["status"] == "ok", (name, taken)
        expected = json.loads(json.dumps(text)).encode()  # a JSON surrogate pair joined
        assert taken["output"]["bytes"] == len(expected), name
        assert site.control("system.md").read_bytes() == expected, name
    kept = site.control("system.md").read_bytes()
    for name, text in NOT_PLAIN.items():
        refused = site.native({"control": "system.md", "content": text}, session="odd")
        assert refused["status"] == "error", (name, refused)
        assert refused["output"]["error"] == "EINVAL", (name, refused)
        assert site.control("system.md").read_bytes() == kept, name
    assert len(site.updated()) == len(PLAIN)
    assert leftovers(site) == []


def test_bytes_that_are_not_utf8_are_refused_in_native_mode_and_in_argv(site: Site) -> None:
    """A-5: content is UTF-8 text.  A byte 0xff inside the JSON of a native call is EINVAL at
    the schema stage; in an argument (which Python sees as the lone surrogate U+DCFF) the host
    refuses it with EINVAL.  The file is untouched."""
    before = site.control("system.md").read_bytes()
    native = site.native(b'{"control": "system.md", "content": "a\xffb\\n"}', session="raw")
    assert native["status"] == "error" and native["error"]["error"] == "EINVAL", native
    argv = [*CTX_ARGV, "run", "--agent", "coder", "--session", "raw", "agent.update"]
    ran = subprocess.run(
        [*map(os.fsencode, argv), b'{"control": "system.md", "content": "a\xffb"}'],
        capture_output=True, env=site.env, timeout=60,
    )  # fmt: skip
    assert ran.returncode != 0 and ran.stderr.startswith(b"agent.update: EINVAL: "), ran
    assert site.control("system.md").read_bytes() == before
    assert site.updated() == []


def test_bytes_that_are_not_utf8_on_stdin_are_refused_too(site: Site) -> None:
    """A-5: the same 0xff byte, piped to the terminal-mode tool, must not reach system.md as
    a replacement character the agent never wrote."""
    before = site.control("system.md").read_bytes()
    piped = site.piped(b'{"control": "system.md", "content": "a\xffb\\n"}', "raw")
    assert piped.rc != 0 and "EINVAL" in piped.err, piped
    assert site.control("system.md").read_bytes() == before


# ------------------------------------------------------------ only two controls change


OTHER_CONTROLS = [
    "policy", "mount", "model", "identity", "label", "log", "window", "tool", "session",
    "system", "prompt.template", "System.md", "SYSTEM.MD", "Prompt.Template.md",
    "system.md ", " system.md", "system.md\n", "system.md.", "system.md/", "./system.md",
    "../coder.d/system.md", "../other.d/system.md", "sub/system.md", "/etc/passwd", "..",
    ".", "", "system.md\x00", "\x1b[2Jsystem.md", "é.md", "x" * 300,
]  # fmt: skip


def test_every_other_control_name_is_einval_and_changes_nothing(site: Site) -> None:
    """A-5: "Any other control (policy, mount, model, window, identity files) -> EINVAL".
    In terminal mode the host itself judges the name (the program's check reads only types):
    case variants, trailing spaces or line ends, paths with '/', '..' or an absolute path,
    NUL, an escape sequence: each is EINVAL on stderr (escaped, never raw), and no control of
    either agent, nor anything below ``agent/``, changes.  In native mode the schema's enum
    refuses them first."""
    agents_before = sorted(os.listdir(site.storage / "agent"))
    coder, other = site.state("coder"), site.state("other")
    outside = site.top / "system.md"
    for name in [*OTHER_CONTROLS, str(outside)]:
        refused = site.terminal({"control": name, "content": "allow coder_t tool:x execute\n"})
        assert refused.rc in (1, 2), (name, refused)
        assert refused.err.startswith("agent.update: EINVAL: "), (name, refused)
        assert "\x1b" not in refused.err and refused.out == "", (name, refused)
    for name in ("policy", "identity", "../other.d/system.md"):
        native = site.native({"control": name, "content": "x"})
        assert native["rc"] == 2 and native["error"]["error"] == "EINVAL", (name, native)
    assert site.state("coder") == coder and site.state("other") == other
    assert sorted(os.listdir(site.storage / "agent")) == agents_before
    assert not outside.exists()
    assert site.updated() == [] and site.updated("other") == []
    results = [e for e in site.events("t") if e["type"] == "tool_result"]
    assert len(results) == len(OTHER_CONTROLS) + 1
    assert {e["status"] for e in results} == {"error"}


def test_bad_input_the_host_finds_exits_2_like_every_core_tools_bad_input(site: Site) -> None:
    """docs/tools.md: bad input "exits 2, as bad input to every core tool does, whether the
    tool's schema check or the host's validation found it"; agent.update's native mode gives
    2 for ``control: policy``, its terminal mode must too."""
    native = site.native({"control": "policy", "content": "x"})
    assert native["rc"] == 2, native
    for payload in (
        {"control": "policy", "content": "x"},
        {"control": "system.md", "content": "a\x00b"},
        {"control": "system.md", "content": "a\x1b[2Jb"},
    ):
        refused = site.terminal(payload)
        assert refused.err.startswith("agent.update: EINVAL: "), refused
        assert refused.rc == 2, refused


def test_the_request_cannot_name_another_agent(site: Site) -> None:
    """A-5: "an agent cannot rewrite another agent".  An ``agent`` key in the input is EINVAL
    in both modes; other's own update changes only other's controls, and coder's call only
    coder's, whatever content names the other agent."""
    coder, other = site.state("coder"), site.state("other")
    for payload in (
        {"control": "system.md", "content": "x", "agent": "coder"},
        {"control": "system.md", "content": "x", "agent": ["coder"]},
    ):
        assert site.native(payload, agent="other")["error"]["error"] == "EINVAL"
        refused = site.terminal(payload, agent="other")
        assert refused.rc == 2 and "EINVAL" in refused.err, refused
    assert site.state("coder") == coder and site.state("other") == other

    own = site.terminal({"control": "system.md", "content": "I am other\n"}, agent="other")
    assert (own.rc, own.out) == (0, "system.md of agent other updated\n"), own
    assert site.state("coder") == coder
    assert site.control("system.md", "other").read_text() == "I am other\n"
    assert site.updated("other") == [("system.md", "t", 11)] and site.updated("coder") == []


# ------------------------------------------- the control file is not what it should be


def test_a_control_replaced_by_a_link_is_replaced_never_followed(site: Site) -> None:
    """A-5 "replaces the file atomically": a system.md that is a symbolic link (to another
    agent's system.md, to a host file, dangling) is itself replaced by a regular file; the
    link's target is never written."""
    host_file = site.top / "host-file"
    host_file.write_text("host data\n")
    theirs = site.control("system.md", "other")
    theirs_before = theirs.read_bytes()
    targets = [theirs, host_file, site.top / "nowhere"]
    for number, target in enumerate(targets):
        site.control("system.md").unlink()
        site.control("system.md").symlink_to(target)
        text = f"replaced {number}\n"
        done = site.terminal({"control": "system.md", "content": text}, "link")
        assert done.rc == 0, (target, done)
        placed = site.control("system.md")
        assert placed.is_file() and not placed.is_symlink(), target
        assert placed.read_text() == text
        assert stat.S_IMODE(placed.lstat().st_mode) == 0o644
    assert theirs.read_bytes() == theirs_before
    assert host_file.read_text() == "host data\n"
    assert not (site.top / "nowhere").exists()
    assert leftovers(site) == []


def test_a_fifo_or_a_missing_control_is_replaced_without_waiting(site: Site) -> None:
    """A-5: a FIFO where prompt.template.md belongs is replaced (never opened, so the call does
    not hang on it); a control deleted by hand is made again, 0644."""
    template = site.control("prompt.template.md")
    template.unlink()
    os.mkfifo(template)
    done = site.terminal({"control": "prompt.template.md", "content": "{{input}}\n"}, "fifo")
    assert done.rc == 0, done
    assert template.is_file() and template.read_text() == "{{input}}\n"

    site.control("system.md").unlink()
    done = site.terminal({"control": "system.md", "content": "again\n"}, "fifo")
    assert done.rc == 0, done
    assert site.control("system.md").read_text() == "again\n"
    assert stat.S_IMODE(site.control("system.md").stat().st_mode) == 0o644
    assert [c for c, _, _ in site.updated()] == ["prompt.template.md", "system.md"]


def test_a_directory_in_place_of_a_control_is_eisdir_and_left_alone(site: Site) -> None:
    """A-5: a directory where system.md belongs cannot be replaced by a file: EISDIR, exit 1,
    naming the control; the directory and what it holds stay, no temporary file is left, and
    the call is an error in the events and in the tool's log."""
    site.control("system.md").unlink()
    site.control("system.md").mkdir()
    (site.control("system.md") / "keep").write_text("kept\n")
    refused = site.terminal({"control": "system.md", "content": "x\n"}, "dir")
    assert refused.rc == 1, refused
    assert refused.err.startswith("agent.update: EISDIR: cannot replace system.md"), refused
    assert (site.control("system.md") / "keep").read_text() == "kept\n"
    assert leftovers(site) == [] and site.updated() == []
    assert site.pairs("dir") == [("tool_call", "ok"), ("tool_result", "error")]
    assert [e["status"] for e in site.tool_log() if e.get("session") == "dir"] == ["error"]


def load_controls_onto_tmpfs(site: Site, size: str) -> dict[str, bytes]:
    """A tmpfs of ``size`` over coder's controls directory, holding copies of its controls."""
    saved = {
        p.name: (p.read_bytes(), stat.S_IMODE(p.stat().st_mode)) for p in site.controls().iterdir()
    }
    site.mounts.tmpfs(site.controls().relative_to(site.top), f"size={size},mode=0755")
    for name, (data, mode) in saved.items():
        (site.controls() / name).write_bytes(data)
        (site.controls() / name).chmod(mode)
    return {name: data for name, (data, _) in saved.items()}


def test_a_full_or_read_only_controls_directory_fails_cleanly(site: Site) -> None:
    """A-5: when coder's controls directory is full the update fails with ENOSPC, and when it
    is read-only with EROFS: exit 1, a one-line error, no traceback, the old prompt whole, no
    temporary file, and an error tool_result in the session and the tool's log."""
    saved = load_controls_onto_tmpfs(site, "256k")
    filler = site.controls() / ".filler"
    try:
        with filler.open("wb") as fill:
            while True:
                fill.write(b"\0" * 4096)
                fill.flush()
    except OSError:
        pass
    assert filler.exists()
    prompt = "p" * 6000 + "\n"  # needs pages the disk no longer has
    full = site.terminal({"control": "system.md", "content": prompt}, "full")
    assert full.rc == 1, full
    assert full.err == "agent.update: ENOSPC: cannot replace system.md: No space left on device\n"
    assert site.control("system.md").read_bytes() == saved["system.md"]
    assert [n for n in os.listdir(site.controls()) if n.endswith(".tmp")] == []

    filler.unlink()
    site.mounts.remount(site.controls(), "ro")
    read_only = site.terminal({"control": "prompt.template.md", "content": "x\n"}, "ro")
    assert read_only.rc == 1, read_only
    assert read_only.err.startswith("agent.update: EROFS: cannot replace prompt.template.md")
    assert site.control("prompt.template.md").read_bytes() == saved["prompt.template.md"]
    for session in ("full", "ro"):
        assert site.pairs(session) == [("tool_call", "ok"), ("tool_result", "error")], session
    failed = [e["session"] for e in site.tool_log() if e["status"] == "error"]
    assert failed == ["full", "ro"], site.tool_log()
    assert site.updated() == []


# --------------------------------------------------------------- concurrency, renders


def test_an_open_render_keeps_the_version_it_opened(site: Site) -> None:
    """A-5: "The update only affects the next run's prompt rendering".  A render that has
    opened system.md and prompt.template.md and read half of each reads the rest of the old
    versions after both are updated; opening them again gives the new ones."""
    old_system = ("S" * 3000 + "\n").encode()
    old_template = ("T" * 3000 + "\n").encode()
    site.control("system.md").write_bytes(old_system)
    site.control("prompt.template.md").write_bytes(old_template)
    with (
        site.control("system.md").open("rb") as system,
        site.control("prompt.template.md").open("rb") as template,
    ):
        head = (system.read(1500), template.read(1500))
        for control in UPDATABLE:
            done = site.terminal({"control": control, "content": f"new {control}\n"}, "render")
            assert done.rc == 0, done
        assert head[0] + system.read() == old_system
        assert head[1] + template.read() == old_template
    for control in UPDATABLE:
        assert site.control(control).read_text() == f"new {control}\n"


def test_updates_of_both_controls_racing_each_other_all_land_whole(site: Site) -> None:
    """A-5, S-2, S-5: four sessions update system.md and prompt.template.md at once, several
    times each, while a reader renders both over and over.  Every call succeeds, the reader
    only ever sees whole versions, each control ends as one of its versions, no temporary
    file is left, the agent's log holds one whole line per update, and each session its
    tool_call/tool_result pairs; policy, identity and mount are untouched."""
    versions = {
        "a": ("system.md", "A" * 8191 + "\n"),
        "b": ("system.md", "é" * 4096),
        "c": ("prompt.template.md", "{{input}} c\n" * 600),
        "d": ("prompt.template.md", "€" * 2730 + "\n"),
    }
    rounds = 3
    old = {c: site.control(c).read_text() for c in UPDATABLE}
    fixed = {c: site.control(c).read_bytes() for c in ("policy", "identity", "mount", "label")}
    allowed = {c: {old[c], *(t for ctl, t in versions.values() if ctl == c)} for c in UPDATABLE}
    seen: dict[str, set[str]] = {c: set() for c in UPDATABLE}
    stop = threading.Event()
    failures: list[Run] = []

    def render() -> None:
        while not stop.is_set():
            for control in UPDATABLE:
                try:
                    seen[control].add(site.control(control).read_text())
                except FileNotFoundError:
                    seen[control].add("<missing>")

    def rewrite(session: str) -> None:
        control, text = versions[session]
        for _ in range(rounds):
            done = site.terminal({"control": control, "content": text}, session)
            if done.rc != 0:
                failures.append(done)

    reader = threading.Thread(target=render, daemon=True)
    reader.start()
    writers = [threading.Thread(target=rewrite, args=(s,)) for s in versions]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=120)
    stop.set()
    reader.join(timeout=10)

    assert failures == []
    for control in UPDATABLE:
        assert seen[control] <= allowed[control], {len(s) for s in seen[control]}
        assert site.control(control).read_text() in allowed[control] - {old[control]}
    assert leftovers(site) == []
    assert sorted(site.updated()) == sorted(
        (control, session, len(text.encode()))
        for session, (control, text) in versions.items()
        for _ in range(rounds)
    )
    for session in versions:
        assert site.pairs(session) == [("tool_call", "ok"), ("tool_result", "ok")] * rounds
    assert {c: site.control(c).read_bytes() for c in fixed} == fixed


# ---------------------------------------------------------------- P-6: the two policy layers


def test_a_grant_in_only_one_policy_denies_before_the_tool_runs(site: Site) -> None:
    """P-6, A-5: agent.update needs ``allow <agent>_t tool:agent.update execute`` in both
    policies.  With only the agent's layer the call is refused at step 6, with only the tool's
    at step 5, and a rule for another label in the agent's own policy counts for nothing:
    exit 126, nothing written, and an error tool_result naming the step."""
    made = site.create_agent({"name": "half", "label": "half_t", "tools": ["agent.update"]})
    assert made["name"] == "half"
    made = site.create_agent({"name": "bare", "label": "bare_t"})
    grant_tool(site, "bare_t", "agent.update")
    made = site.create_agent({"name": "mimic", "label": "mimic_t"})
    with site.control("policy", "mimic").open("a") as policy:
        policy.write("allow coder_t tool:agent.update execute\n")  # coder's label, not its own
    for agent, step in (("half", 6), ("bare", 5), ("mimic", 5)):
        before = site.state(agent)
        refused = site.terminal({"control": "system.md", "content": "widen me\n"}, "p6", agent)
        assert refused.rc == 126, (agent, refused)
        assert refused.err.startswith(f"ctx: EACCES: step {step} "), (agent, refused)
        assert site.state(agent) == before and site.updated(agent) == []
        result = [e for e in site.events("p6", agent) if e["type"] == "tool_result"]
        assert [(e["status"], e.get("step"), e.get("errno")) for e in result] == [
            ("error", step, "EACCES")
        ], result
    assert site.updated("coder") == []


# ----------------------------------------------------- S-2, S-4, T-7: what the records hold


def test_calls_are_recorded_as_pairs_with_facts_and_never_the_whole_prompt(site: Site) -> None:
    """S-2, S-4, T-7, A-5: an 8 KiB prompt given as an argument, one piped on stdin and one
    given natively are each a tool_call/tool_result pair in the session and one entry in
    ``tool/agent.update.d/log``, and one ``agent.updated`` fact (control, session, bytes) in
    the agent's log; no record holds the whole prompt (S-4: facts, not long prompts)."""
    marker = "SECRET-PROMPT-WORD "
    prompt = (marker * 500)[: LIMIT - 1] + "\n"
    payload = {"control": "system.md", "content": prompt}
    assert site.terminal(payload, "rec-argv").rc == 0
    assert site.piped(json.dumps(payload).encode(), "rec-pipe").rc == 0
    assert site.native(payload, "rec-native")["status"] == "ok"
    sessions = ("rec-argv", "rec-pipe", "rec-native")
    for session in sessions:
        assert site.pairs(session) == [("tool_call", "ok"), ("tool_result", "ok")], session
        pair = [e for e in site.events(session) if e["type"] in ("tool_call", "tool_result")]
        assert pair[0]["call"] == pair[1]["call"], pair
        assert all(e["agent"] == "coder" and e["session"] == session for e in pair), pair
    assert site.updated() == [("system.md", s, LIMIT) for s in sessions]
    logged = [e for e in site.tool_log() if e.get("session") in sessions]
    assert [(e["session"], e["status"]) for e in logged] == [(s, "ok") for s in sessions]

    records = [site.controls() / "log", site.storage / "tool" / "agent.update.d" / "log"]
    records += [
        site.storage / "home" / str(NOBODY) / "agent" / "coder" / "session" / s / "events.jsonl"
        for s in sessions
    ]
    for record in records:
        text = record.read_text()
        assert text.count(marker) < 40, (record, text.count(marker))  # shortened, if at all
        for line in text.splitlines():
            assert len(line) < 2048, (record, len(line))
    assert site.control("system.md").read_text() == prompt


# ------------------------------------------------------ callers that are not the call


def test_another_agents_shell_or_a_standalone_user_cannot_update(site: Site) -> None:
    """A-5: the request travels over the run capability the runner gives the call.  Agent
    other (same uid as coder) running the agent.update program from its own shell.exec has
    none (EPERM), nor does it with a descriptor number it made up; a standalone user running
    ``ctx run --agent coder`` is refused before anything runs (126, EACCES); the program run
    by that user directly says EPERM.  coder's controls never change."""
    coder = site.state("coder")
    program = site.storage / "tool" / "agent.update"
    request = json.dumps({"control": "system.md", "content": "pwned\n"})
    for prefix in ("", "CTX_RUN_CAPABILITY=0 ", "CTX_RUN_CAPABILITY=1 "):
        cmd = f"{prefix}{program} '{request}'; echo status=$?"
        ran = site.ctx("run", "--agent", "other", "--session", "sh", "shell.exec",
                       json.dumps({"cmd": cmd}))  # fmt: skip
        assert "status=1" in ran.out, (prefix, ran)
        assert "agent.update: E" in ran.err and "updated" not in ran.out, (prefix, ran)
    assert (
        "agent.update: EPERM: "
        in site.ctx(
            "run", "--agent", "other", "shell.exec", json.dumps({"cmd": f"{program} '{request}'"})
        ).err
    )

    user = find_or_create_user()
    as_user = {"user": user.uid, "group": user.gid, "extra_groups": [], "timeout": 60}
    argv = [*CTX_ARGV, "run", "--agent", "coder", "agent.update", request]
    env = {**site.env, "HOME": str(site.top)}
    ran = subprocess.run(argv, capture_output=True, text=True, env=env, **as_user)
    assert ran.returncode == 126 and ran.stderr.startswith("ctx: EACCES: "), ran
    direct = subprocess.run([str(program), request], capture_output=True, text=True,
                            env=env, **as_user)  # fmt: skip
    assert direct.returncode == 1, direct
    assert direct.stderr.startswith("agent.update: EPERM: "), direct
    assert site.state("coder") == coder and site.updated("coder") == []
    assert [e for e in site.tool_log() if e["agent"] == "coder"] == []
