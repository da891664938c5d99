"""The error branches of what an agent may see and do — its view (``cortexfs/agents/view.py``),
the projection of ``/ctx`` its tools get (``projection.py``), the attenuation of a child it makes
(``capability.py``), its mount table (``cortexfs/policy/mounts.py``) and the reading of its
host-owned controls (``cortexfs/policy/controls.py``) — each reached from outside through ``ctx
agent show``, ``ctx agent list``, ``ctx policy explain`` and ``ctx run --agent``, as an operator
who edits an agent's controls by hand, or the agent itself, reaches it.

The angle: agent controls (identity, label, policy, mount) hand-edited into every shape a text
editor, a script or a slip gives — empty, one byte past their limit or exactly at it, with a
byte-order mark, CRLF ends, a line break inside the label, non-UTF-8 bytes, a lone surrogate,
duplicate names, numbers JSON has not, nesting deeper than any document needs; mount tables
with ``.`` and ``..``, targets the view or the sandbox owns, a ``/ctx`` naming a directory
inside the root or edited to ``rw``, a source a link now lies on, the root reached through a
bind mount, a thousand mounts; a working directory that is missing or a file; a home replaced
by a link; a tool made unavailable, a model granted in one policy only, a space granted before
it exists; and a parent's child mounts inside and outside its own view of ``/ctx``.

Each check reads the exit status, the errno word of the ``ctx: ERRNO: sentence`` line (and of
the ``--json`` error object or the native ``result`` frame), that the sentence names the control
or mount at fault and the remedy the documents promise, that there is no Python traceback, and
that nothing is half-done: no session, file or agent made by a refused call, nothing written
through a link.  Where a message names a repair, the repair is made and the call works again.

SPEC ids: §8 A-1, A-3, A-4; §5 P-3, P-5, P-6; §6 T-4, T-5; §9 X-1, X-2; §13 F-1; §1 R-3.  Docs:
docs/policy.md (*What the chain reads*, *Mounts (step 3)*, *Host-owned controls (step 4)*),
docs/tools.md (*CTX_PATH (T-4)*, *Agents, host side (A-3)*, *Running a tool* and its
*Environment* table, *The core tools*: ``agent.create``, *Under /ctx a tool reaches what ctx
mount --as AGENT shows*), docs/mount.md, and ``ctx agent show|list --help``."""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    OnStorage,
    Run,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    snapshot,
)
from tests.support.scratch_mounts import ScratchMounts

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as nobody, and controls are root's to edit: needs root"
)

TOP = scratch_top(__file__)
NOBODY = 65534
LABEL = "coder_t"
TOOLS = ["shell.exec", "fs.read", "fs.write", "fs.list", "agent.create"]
CONTROL_LIMIT = 1024 * 1024  # an identity, label or mount control (docs/policy.md)
MAX_ARG_STRLEN = 131072  # the most the kernel passes a program in one variable
TRACEBACK = "Traceback"


# --------------------------------------------------------------------------- common checks


def refused(run: Run, errno_name: str, status: int) -> None:
    """``run`` ended with ``status`` and a ``ctx: ERRNO: …`` line, and no traceback."""
    assert run.rc == status, run
    assert f"ctx: {errno_name}: " in run.err, run
    assert TRACEBACK not in run.err, run


def quiet(run: Run) -> None:
    """``run`` succeeded and said nothing of an error."""
    assert run.rc == 0, run
    assert TRACEBACK not in run.err and "ctx: E" not in run.err, run


def unused_id() -> int:
    """A uid (and gid) no user or group database entry has."""
    for candidate in range(47301, 48000):
        try:
            pwd.getpwuid(candidate)
            continue
        except KeyError:
            pass
        try:
            grp.getgrgid(candidate)
            continue
        except KeyError:
            return candidate
    pytest.skip("no unused id between 47301 and 48000")


@dataclass
class Site(OnStorage):
    """A root every uid may search, with space ``proj`` of group nobody, and agent ``coder``
    (uid nobody) that may read and write it, mounts ``data`` read-only at ``/data``, and may
    run ``shell.exec``, the ``fs.*`` tools and ``agent.create`` in both layers of P-6 and
    holds ``agent:kid create``."""

    storage: Path
    scratch: Path
    data: Path
    out: Path  # where an agent's tool leaves a trace that it ran

    def control(self, name: str, agent: str = "coder") -> Path:
        return self.storage / "agent" / f"{agent}.d" / name

    def mounts(self, *entries: list[str], ctx: bool = True) -> None:
        """The mount control written by hand: ``entries``, then the root at ``/ctx`` (ro)."""
        table = [*entries, *([[str(self.storage), "/ctx", "ro"]] if ctx else [])]
        self.control("mount").write_text(json.dumps(table) + "\n")

    def grant(self, *rules: str, agent: str = "coder", label: str = LABEL) -> None:
        with self.control("policy", agent).open("a") as policy:
            policy.writelines(f"allow {label} {rule}\n" for rule in rules)

    def revoke(self, rule: str) -> None:
        policy = self.control("policy")
        kept = [line for line in policy.read_text().splitlines() if line != f"allow {LABEL} {rule}"]
        policy.write_text("\n".join(kept) + "\n")

    def show(self, agent: str = "coder") -> dict:
        run = self.ctx("agent", "show", agent, "--json")
        quiet(run)
        return run.json()

    def listed(self) -> dict[str, dict]:
        run = self.ctx("agent", "list", "--json")
        quiet(run)
        return {entry["name"]: entry for entry in run.json()}

    def verdict(self, obj: str, perm: str) -> dict:
        run = self.ctx("policy", "explain", "coder", obj, perm, "--json")
        assert TRACEBACK not in run.err, run
        facts = run.json()
        assert run.rc == (0 if facts["allowed"] else 1), run
        return facts

    def call(self, tool: str, *args: str, agent: str = "coder", options: tuple = ()) -> Run:
        """A terminal-mode call in session s1 (or as ``options`` say)."""
        return self.ctx("run", "--agent", agent, "--session", "s1", *options, tool, *args)

    def native(
        self, tool: str, value: dict, agent: str = "coder", options: tuple = ()
    ) -> tuple[Run, dict]:
        run = self.ctx(
            "run", "--agent", agent, "--native", "--session", "s1", *options, tool,
            input=json.dumps(value),
        )  # fmt: skip
        assert TRACEBACK not in run.err, run
        frame = json.loads(run.lines()[-1])
        assert frame["type"] == "result", run
        return run, frame

    def environment(self, agent: str = "coder", options: tuple = ()) -> dict[str, str]:
        """The environment a tool of ``agent`` gets, as ``shell.exec`` prints it."""
        run = self.call("shell.exec", "env -0", agent=agent, options=options)
        quiet(run)
        pairs = [item.split("=", 1) for item in run.out.split("\0") if "=" in item]
        return dict(pairs)

    def events(self, agent: str = "coder", session: str = "s1") -> list[dict]:
        place = self.storage / "home" / str(NOBODY) / "agent" / agent / "session" / session
        return read_jsonl(place / "events.jsonl")

    def agents(self) -> set[str]:
        return set(os.listdir(self.storage / "agent"))


def names_at(mounts: list[list], target: str) -> list[str] | None:
    """The names a filtered mount at ``target`` lists (None: no filtered mount there)."""
    for mount in mounts:
        if mount[1] == target and len(mount) == 4:
            return mount[3]
    return None


@pytest.fixture
def site(searchable_storage: Path) -> Iterator[Site]:
    scratch = new_scratch_dir(TOP)
    data = scratch / "data"
    data.mkdir(mode=0o755)
    (data / "notes.txt").write_text("in data\n")
    out = scratch / "out"
    out.mkdir()
    out.chmod(0o1777)
    s = Site(searchable_storage, scratch, data, out)
    made = s.ctx("shared", "create", "proj", "--group", str(NOBODY))
    assert made.rc == 0, made
    request = {
        "name": "coder",
        "label": LABEL,
        "tools": TOOLS,
        "shared": {"proj": ["read", "write"]},
        "mount": [[str(data), "/data", "ro"]],
    }
    s.create_agent(request)
    s.allow_tool(LABEL, *TOOLS)
    s.grant("agent:kid create")
    yield s
    shutil.rmtree(scratch, ignore_errors=True)


# ------------------------------------------------------- the mount table, hand-edited


def test_a_lone_surrogate_in_a_mount_source_is_a_problem_not_a_traceback(site: Site) -> None:
    """docs/policy.md (*What the chain reads*: "a control that is missing, malformed, a link
    or unreadable denies with EACCES"; a damaged control is reported "naming the file and what
    is wrong in plain words"), ``ctx agent show --help`` (an unusable mount control is listed
    as a problem): JSON can spell ``\\ud800``, which no byte string holds, so no path is
    named by it.  ``agent show`` and ``agent list`` exit 0 listing the mount control as the
    problem, ``policy explain`` denies at step 3 with EACCES naming it, and a call is refused
    with EACCES (126), never a traceback or an EIO that names Python's codec."""
    source = f"{site.data}/\\ud800"  # JSON's spelling of U+D800, as a text editor saves it
    table = f'[["{source}", "/data", "ro"], ["{site.storage}", "/ctx", "ro"]]\n'
    site.control("mount").write_text(table)

    shown = site.ctx("agent", "show", "coder", "--json")
    quiet(shown)
    [problem] = shown.json()["problems"]
    assert problem.startswith("agent/coder.d/mount is invalid: mount entry 1"), problem
    listed = site.ctx("agent", "list", "--json")
    quiet(listed)
    assert listed.json()[0]["problems"] == [problem], listed

    facts = site.verdict("tool:fs.read", "execute")
    assert (facts["step"], facts["errno"]) == (3, "EACCES"), facts
    assert problem in facts["reason"], facts

    ran = site.call("fs.read", "/data/notes.txt")
    refused(ran, "EACCES", 126)
    assert "UnicodeEncodeError" not in ran.err and "EIO" not in ran.err, ran


TABLES_WITH_DOTS = {
    "a dot-dot in a source": (
        [["/tmp/../etc", "/etc2", "ro"]],
        "mount entry 1: the source '/tmp/../etc' must not contain '.' or '..'",
    ),
    "a dot in a target": (
        [["/tmp", "/data/./x", "ro"]],
        "mount entry 1: the target '/data/./x' must not contain '.' or '..'",
    ),
}


@pytest.mark.parametrize("case", sorted(TABLES_WITH_DOTS))
def test_a_dot_component_makes_the_whole_hand_edited_table_invalid_until_rewritten(
    site: Site, case: str
) -> None:
    """docs/tools.md (*Agents, host side*: "Edit a control by hand with real paths only"),
    docs/policy.md (a malformed control denies with EACCES; step 3 reads the mount table): a
    table holding ``.`` or ``..`` is invalid as a whole — the agent keeps no mount, not even
    ``/ctx`` — ``agent show`` lists the sentence, the chain denies at step 3 naming it, a
    call is refused (126) and runs nothing; the table rewritten, the call works again."""
    entries, reason = TABLES_WITH_DOTS[case]
    site.mounts(*entries, [str(site.data), "/data", "ro"])
    said = f"agent/coder.d/mount is invalid: {reason}"

    shown = site.show()
    assert (shown["mounts"], shown["tool_mounts"], shown["problems"]) == ([], [], [said])
    assert shown["cwd"] == "/", shown
    facts = site.verdict("tool:fs.read", "execute")
    assert facts["reason"] == f"step 3 (mount visibility): {said}", facts
    ran = site.call("fs.read", "/data/notes.txt")
    refused(ran, "EACCES", 126)
    assert said in ran.err and "in data" not in ran.out, ran

    site.mounts([str(site.data), "/data", "ro"])
    again = site.call("fs.read", "/data/notes.txt")
    quiet(again)
    assert again.out == "in data\n", again


@pytest.mark.parametrize(
    "content, problem",
    [
        (b"", "the mount table is not JSON: it is empty"),
        (b" \n\t\n", "the mount table is not JSON: it is empty"),
        (b"[]\n", None),
        (None, None),
    ],
    ids=["empty", "blank", "an-empty-array", "missing"],
)
def test_an_empty_mount_control_is_invalid_and_an_empty_table_grants_no_mount(
    site: Site, content: bytes | None, problem: str | None
) -> None:
    """docs/policy.md (*Mounts*: "An agent without a mount control sees nothing"; a malformed
    control is a problem): an empty file is not a table (a problem, in plain words); an empty
    array or no control at all is a table of no mounts and no problem.  Either way the agent
    sees nothing (``cwd`` is ``/``, no tool mounts) and a call is refused at step 3 with
    EACCES saying the tool is under none of its mounts (or naming the control)."""
    if content is None:
        site.control("mount").unlink()
    else:
        site.control("mount").write_bytes(content)
    shown = site.show()
    said = [] if problem is None else [f"agent/coder.d/mount is invalid: {problem}"]
    assert shown["problems"] == said, shown
    assert (shown["mounts"], shown["tool_mounts"], shown["cwd"]) == ([], [], "/"), shown

    ran = site.call("fs.read", "/data/notes.txt")
    refused(ran, "EACCES", 126)
    expected = said[0] if said else "tool/fs.read is under none of the mounts of agent 'coder'"
    assert f"step 3 (mount visibility): {expected}" in ran.err, ran


def test_a_mount_control_with_a_byte_order_mark_and_crlf_ends_is_the_same_table(
    site: Site,
) -> None:
    """docs/policy.md: a control is JSON a person may have written on another system; a
    byte-order mark before it (ignored, as JSON readers ignore it) and CRLF line ends (JSON
    white space) change nothing: the mounts are the same, no problem is listed, the call
    works."""
    table = f'[["{site.data}",\r\n  "/data", "ro"],\r\n ["{site.storage}", "/ctx", "ro"]]\r\n'
    site.control("mount").write_bytes(b"\xef\xbb\xbf" + table.encode())
    shown = site.show()
    assert shown["problems"] == [], shown
    assert shown["mounts"] == [[str(site.data), "/data", "ro"], [str(site.storage), "/ctx", "ro"]]
    ran = site.call("fs.read", "/data/notes.txt")
    quiet(ran)
    assert ran.out == "in data\n", ran


def test_a_mount_control_at_its_limit_is_read_and_a_byte_more_is_efbig(site: Site) -> None:
    """docs/policy.md (*What the chain reads*: any control but a policy holds at most 1 MiB
    (1048576 bytes); a larger one is refused with EFBIG naming it and its limit, the chain
    denies at the step that reads it, ``agent show`` and ``agent list`` list it as the agent's
    problem): a table padded with blanks to exactly the limit is read; one byte more is
    EFBIG, at step 3 of a call (126), in ``show`` and ``list``; nothing runs.  Rewritten, the
    call works."""
    table = json.dumps([[str(site.data), "/data", "ro"], [str(site.storage), "/ctx", "ro"]])
    padded = table.encode().ljust(CONTROL_LIMIT, b" ")
    site.control("mount").write_bytes(padded)
    assert site.show()["problems"] == []
    quiet(site.call("fs.read", "/data/notes.txt"))

    site.control("mount").write_bytes(padded + b" ")
    said = (
        f"agent/coder.d/mount holds more than {CONTROL_LIMIT} bytes, the limit of a control, "
        "so it is not read; rewrite it"
    )
    shown = site.show()
    assert (shown["problems"], shown["mounts"]) == ([said], []), shown
    assert site.listed()["coder"]["problems"] == [said]
    ran = site.call("fs.read", "/data/notes.txt")
    refused(ran, "EFBIG", 126)
    assert ran.err == f"ctx: EFBIG: step 3 (mount visibility): {said}\n", ran
    assert ran.out == "", ran

    site.control("mount").write_text(table)
    quiet(site.call("fs.read", "/data/notes.txt"))


WITHHELD_PLACES = {
    "/ctx/data": (
        "mount target /ctx/data: /ctx is the storage root's place (the agent's CortexFS view, "
        "mounted by the host); mount elsewhere"
    ),
    "/": (
        "mount target /: a mount needs a directory below /, whose last part names it in policy "
        "(mount:<name>)"
    ),
    "/run/x": (
        "mount target /run/x: /run belongs to the system the agent's terminal runs on (its "
        "sandbox takes it from the host, or makes it); mount elsewhere"
    ),
    "/var": (
        "mount target /var: /var belongs to the system the agent's terminal runs on (its "
        "sandbox takes it from the host, or makes it); mount elsewhere"
    ),
}


def test_targets_the_view_or_the_sandbox_owns_are_withheld_each_with_its_reason(
    site: Site,
) -> None:
    """docs/tools.md (*Agents, host side*: a mount control is read as written; "a mount whose
    target is one of those places (the storage root's own /ctx aside) … is withheld … given
    to no tool and bound in no sandbox", and ``ctx agent show`` lists it with the reason):
    targets under ``/ctx``, ``/`` itself and system directories are withheld one by one, each
    with its own sentence, while the usable mounts of the same table stay usable; no tool's
    ``CTX_MOUNTS`` holds a withheld source."""
    elsewhere = site.scratch / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    site.mounts(
        *([str(elsewhere), target, "ro"] for target in WITHHELD_PLACES),
        [str(site.data), "/data", "ro"],
    )
    site.grant("mount:x read", "mount:var read")
    shown = site.show()
    assert shown["problems"] == [], shown
    assert shown["mounts"] == [[str(site.data), "/data", "ro"], [str(site.storage), "/ctx", "ro"]]
    held = {m["mount"][1]: m["reason"] for m in shown["withheld_mounts"]}
    assert held == WITHHELD_PLACES, held
    text = site.ctx("agent", "show", "coder")
    quiet(text)
    for target, why in WITHHELD_PLACES.items():
        assert f"withheld mount: {elsewhere} at {target}: {why}" in text.lines(), text

    env = site.environment()
    assert str(elsewhere) not in env["CTX_MOUNTS"], env["CTX_MOUNTS"]
    assert env["CTX_CWD"] == "/data", env


def test_a_mount_withheld_for_its_place_leaves_its_name_to_the_other(site: Site) -> None:
    """docs/tools.md: two usable mounts whose targets end in one name are both withheld, since
    no ``mount:<name>`` rule could say which it grants; a mount withheld for its place (a
    system directory) is not usable, so ``/etc/data`` does not take ``data`` from ``/data``:
    only the former is withheld, for its place alone, and ``/data`` is read through."""
    elsewhere = site.scratch / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    site.mounts([str(elsewhere), "/etc/data", "ro"], [str(site.data), "/data", "ro"])
    shown = site.show()
    [held] = shown["withheld_mounts"]
    assert held["mount"] == [str(elsewhere), "/etc/data", "ro"], held
    assert held["reason"].startswith("mount target /etc/data: /etc belongs to the system"), held
    assert "mounts are named" not in held["reason"], held
    assert [str(site.data), "/data", "ro"] in shown["mounts"], shown
    facts = site.verdict("mount:data", "read")
    assert facts["allowed"] is True, facts
    ran = site.call("fs.read", "/data/notes.txt")
    quiet(ran)
    assert ran.out == "in data\n", ran


def test_a_ctx_mount_of_a_directory_inside_this_root_is_not_called_another_root(
    site: Site,
) -> None:
    """docs/policy.md (*Mounts*: "Only the mount of this storage root (its real path) may take
    /ctx"; the "names another storage root" sentence is for a root moved or copied
    elsewhere): an administrator who points ``/ctx`` at ``shared/`` of this very root, to
    show the agent less, has the mount withheld — rightly — but the reason must name what is
    wrong (a directory inside this root, not the root) rather than claim another root and a
    move that never happened; it names the source and the control to edit."""
    inside = site.storage / "shared"
    site.mounts([str(inside), "/ctx", "ro"], ctx=False)
    shown = site.show()
    [held] = shown["withheld_mounts"]
    reason = held["reason"]
    assert str(inside) in reason and "agent/coder.d/mount" in reason, reason
    assert "another storage root" not in reason, reason
    assert "moved or copied" not in reason, reason


def test_a_ctx_mount_edited_to_read_write_grants_no_write_its_view_does_not_show(
    site: Site,
) -> None:
    """docs/policy.md (*Mounts (step 3)*: the agent's mount of the storage root is the one
    exception — its tools get the agent's view of the root, "which is writable below the
    agent's own home and below each space its policy lets it write"; a space is writable in
    the view only with ``shared:<s> read`` and ``write``), docs/tools.md (stage ``session``:
    a session in ``shared/<space>/`` needs ``shared:<space> write`` through the whole chain):
    the mode written for ``/ctx`` in the control does not widen the view.  The tools' view of
    space ``other`` (write granted, read not) stays hidden, so the chain must deny its write
    at step 3 as it does for the ``ro`` table, and a call in that space opens no session."""
    made = site.ctx("shared", "create", "other", "--group", str(NOBODY))
    assert made.rc == 0, made
    site.grant("shared:other write", "mount:ctx write")
    site.mounts([str(site.data), "/data", "ro"], ctx=False)
    table = json.loads(site.control("mount").read_text())
    site.control("mount").write_text(json.dumps([*table, [str(site.storage), "/ctx", "rw"]]))
    assert "other" not in names_at(site.show()["tool_mounts"], "/ctx/shared")
    other = site.storage / "shared" / "other"
    before = snapshot(other)

    facts = site.verdict("shared:other", "write")
    assert (facts["allowed"], facts["step"], facts["errno"]) == (False, 3, "EACCES"), facts
    ran = site.call("shell.exec", "echo ran", options=("--project", "other"))
    refused(ran, "EACCES", 126)
    assert ran.out == "", ran
    assert snapshot(other) == before


def test_a_source_a_link_now_lies_on_is_withheld_until_its_real_path_is_written(
    site: Site,
) -> None:
    """docs/tools.md (*Agents, host side*: "a mount … whose source is no longer its own real
    path — a symbolic link now anywhere on it, put there since — is withheld … given to no
    tool"; ``ctx agent show`` lists it with the reason): the directory above a recorded source
    is moved away and a link put in its place; the mount is withheld with a sentence naming
    where the link leads now, no tool's ``CTX_MOUNTS`` holds it, a read through it is refused
    (nothing followed), and written back as its real path it is usable again."""
    holder = site.scratch / "holder"
    (holder / "inner").mkdir(parents=True)
    (holder / "inner" / "f.txt").write_text("through the holder\n")
    for path in (holder, holder / "inner"):
        path.chmod(0o755)
    site.mounts([str(holder / "inner"), "/inner", "ro"])
    site.grant("mount:inner read")
    assert site.call("fs.read", "/inner/f.txt").out == "through the holder\n"

    moved = site.scratch / "moved"
    holder.rename(moved)
    holder.symlink_to(moved)
    shown = site.show()
    [held] = shown["withheld_mounts"]
    assert held["mount"] == [str(holder / "inner"), "/inner", "ro"], held
    assert held["reason"] == (
        f"mount source {holder / 'inner'}: its path runs through a symbolic link (it leads to "
        f"{moved / 'inner'} now); a source is used only as the real path it was recorded as"
    ), held
    env = site.environment()
    assert "/inner" not in env["CTX_MOUNTS"], env
    run, frame = site.native("fs.read", {"path": "/inner/f.txt"})
    assert frame["status"] == "error" and frame["error"]["error"] == "EACCES", frame
    assert "through the holder" not in run.out, run

    site.mounts([str(moved / "inner"), "/inner", "ro"])
    assert site.show()["withheld_mounts"] == []
    assert site.call("fs.read", "/inner/f.txt").out == "through the holder\n"


def test_the_root_named_through_a_bind_mount_at_ctx_is_this_root(site: Site) -> None:
    """docs/tools.md, ``cortexfs/policy/mounts.py``: only the mount of this storage root may
    take ``/ctx``, and the same directory reached by another path (a bind mount of the root)
    is that root: the mount is used, shown and judged as the root's real path, so its tools
    get the agent's projection of it and the call works — not a mount withheld as "another
    storage root", and not the raw root."""
    mounts = ScratchMounts(new_scratch_dir(TOP, "bind"))
    try:
        alias = mounts.bind(site.storage, "alias")
        site.mounts([str(site.data), "/data", "ro"], ctx=False)
        table = json.loads(site.control("mount").read_text())
        site.control("mount").write_text(json.dumps([*table, [str(alias), "/ctx", "ro"]]))
        shown = site.show()
        assert shown["withheld_mounts"] == [], shown
        assert [str(site.storage), "/ctx", "ro"] in shown["mounts"], shown
        assert names_at(shown["tool_mounts"], "/ctx/agent") == ["coder", "coder.d"], shown
        run, frame = site.native("fs.list", {"path": "/ctx/agent"})
        assert frame["status"] == "ok", frame
        assert "coder.d" in json.dumps(frame["output"]), frame
        assert str(alias) not in run.out, run
    finally:
        mounts.close()


# ------------------------------------------------------------- the working directory


def test_a_missing_working_directory_names_the_mount_it_comes_from(site: Site) -> None:
    """docs/tools.md (*Environment*: ``CTX_CWD`` is ``/workspace`` if visible, else the first
    visible mount other than ``/ctx``): a ``/workspace`` listed second in the table is the
    working directory, and when its source is missing the call is refused (ENOENT, 126)
    before anything runs, naming that directory and the mount to fix — not "the first
    mount", which is another, and fine."""
    site.mounts([str(site.data), "/data", "ro"], [str(site.scratch / "gone"), "/workspace", "ro"])
    site.grant("mount:workspace read")
    assert site.show()["cwd"] == "/workspace"
    ran = site.call("shell.exec", f"touch {site.out}/ran")
    refused(ran, "ENOENT", 126)
    assert str(site.scratch / "gone") in ran.err, ran
    assert not (site.out / "ran").exists()
    assert "/workspace" in ran.err.replace(str(site.scratch / "gone"), ""), ran
    assert "the first mount" not in ran.err, ran


def test_a_working_directory_that_is_a_file_is_enotdir_and_runs_nothing(site: Site) -> None:
    """docs/tools.md (*Environment*: ``CTX_CWD`` is the first visible mount other than
    ``/ctx``; the process's working directory is the host directory behind it): a source
    that is a file cannot be worked in — the call is refused before the tool starts (ENOTDIR,
    126) naming the file and the mount control, and nothing runs; once the source is a
    directory, the tool starts there, with ``CTX_CWD`` its view path."""
    plain = site.scratch / "plain"
    plain.write_text("a file\n")
    site.mounts([str(plain), "/plain", "ro"])
    site.grant("mount:plain read")
    ran = site.call("shell.exec", f"touch {site.out}/ran")
    refused(ran, "ENOTDIR", 126)
    assert ran.err == (
        f"ctx: ENOTDIR: agent coder's working directory {plain} is not a directory; fix the "
        "mount at /plain in agent/coder.d/mount\n"
    ), ran
    assert not (site.out / "ran").exists()

    plain.unlink()
    plain.mkdir(mode=0o755)
    worked = site.call("shell.exec", 'printf "%s %s" "$CTX_CWD" "$PWD"')
    quiet(worked)
    assert worked.out == f"/plain {plain}", worked


CWD_CASES = {
    "a /workspace after another mount": (
        ["data", "workspace"],
        ["data", "workspace"],
        "/workspace",
    ),
    "the first granted mount": (["data", "second"], ["second"], "/second"),
    "the storage root alone, with a home": ([], [], f"/ctx/home/{NOBODY}"),
}


@pytest.mark.parametrize("case", sorted(CWD_CASES))
def test_ctx_cwd_follows_the_documented_order_and_agent_show_agrees(site: Site, case: str) -> None:
    """docs/tools.md (*Environment*: ``CTX_CWD`` is "``/workspace`` if visible, else the first
    visible mount other than ``/ctx``, else, for an agent that sees only the storage root,
    its home ``/ctx/home/<uid>``"; the process's working directory is the host directory
    behind it): a mount the policy does not grant is not visible, so it is passed over; the
    tool starts where ``CTX_CWD`` says, and ``ctx agent show`` says the same."""
    listed, granted, expected = CWD_CASES[case]
    places = {}
    for name in listed:
        place = site.scratch / f"m-{name}"
        place.mkdir(mode=0o755)
        places[name] = place
    site.mounts(*([str(places[name]), f"/{name}", "ro"] for name in listed))
    site.revoke("mount:data read")
    site.grant(*(f"mount:{name} read" for name in granted))
    ran = site.call("shell.exec", 'printf "%s|%s" "$CTX_CWD" "$PWD"')
    quiet(ran)
    host = str(places[expected.strip("/")]) if listed else str(site.storage / "home" / str(NOBODY))
    assert ran.out == f"{expected}|{host}", ran
    assert site.show()["cwd"] == expected


def test_an_agent_that_may_not_use_its_root_mount_sees_nothing_and_starts_in_slash(
    site: Site,
) -> None:
    """docs/tools.md (*Environment*: ``CTX_CWD`` is ``/`` for an agent that sees nothing at
    all), docs/policy.md (step 5 grants a mount the object is seen through: ``mount:ctx
    read``): without ``mount:ctx read`` and with no other granted mount, ``agent show`` says
    the working directory is ``/`` and its tools get no mount; a call is refused at step 5
    naming the rule to add, and added, it works."""
    site.mounts()
    site.revoke("mount:ctx read")
    shown = site.show()
    assert (shown["cwd"], shown["mounts"], shown["tool_mounts"]) == ("/", [], []), shown
    ran = site.call("fs.list", "/ctx")
    refused(ran, "EACCES", 126)
    assert f"it lacks 'allow {LABEL} mount:ctx read'" in ran.err, ran
    site.grant("mount:ctx read")
    quiet(site.call("fs.list", "/ctx"))


def test_home_is_slash_for_an_agent_whose_uid_no_user_database_knows(site: Site) -> None:
    """docs/tools.md (*Environment*: ``HOME`` is "the agent user's home (or ``/``)"): an agent
    made with a uid and gid no user database knows gets ``HOME=/``; one of a known user gets
    that user's home from the password database."""
    ghost = unused_id()
    made = site.ctx(
        "agent", "create", "-", "--user", str(ghost), "--gid", str(ghost),
        input=json.dumps({"name": "ghost", "label": "ghost_t", "tools": ["shell.exec"]}),
    )  # fmt: skip
    assert made.rc == 0, made
    site.allow_tool("ghost_t", "shell.exec")
    ran = site.call("shell.exec", 'printf "%s|%s" "$HOME" "$(id -u)"', agent="ghost")
    quiet(ran)
    assert ran.out == f"/|{ghost}", ran
    assert site.environment()["HOME"] == (pwd.getpwuid(NOBODY).pw_dir or "/")


def test_ctx_mounts_past_the_kernels_limit_is_e2big_naming_the_mounts_and_the_policy(
    site: Site,
) -> None:
    """docs/tools.md (*Under /ctx…*: past the 128 KiB the kernel takes for one variable "a
    call cannot start (E2BIG at stage run, said before the start and naming the variable, the
    agent's mounts, writable spaces or tools, and its policy)"): a thousand granted mounts
    written by hand make ``CTX_MOUNTS`` too long; the call is refused with E2BIG (126) saying
    how long it is, how many mounts, and which controls to shrink, the tool never runs, and
    the session records the refusal at stage ``run``; with fewer mounts it runs."""
    count = 1000
    entries = [
        [f"/srv/{'s' * 60}{index:05d}", f"/m/{'t' * 50}{index:05d}", "ro"] for index in range(count)
    ]
    site.mounts([str(site.data), "/data", "ro"], *entries)
    site.grant(*(f"mount:{'t' * 50}{index:05d} read" for index in range(count)))
    assert len(site.show()["mounts"]) == count + 2
    ran = site.call("shell.exec", f"touch {site.out}/ran")
    refused(ran, "E2BIG", 126)
    assert ran.err.startswith("ctx: E2BIG: agent coder's CTX_MOUNTS is "), ran
    size = int(ran.err.split("CTX_MOUNTS is ", 1)[1].split(" ", 1)[0])
    assert size > MAX_ARG_STRLEN, ran
    assert f"more than the {MAX_ARG_STRLEN} the kernel passes a program in one variable" in ran.err
    assert f"it lists the agent's {count + 2} mounts and its view of /ctx" in ran.err, ran
    assert ran.err.rstrip().endswith(
        "give it fewer mounts (agent/coder.d/mount), or fewer writable spaces, tools or models "
        "(agent/coder.d/policy)"
    ), ran
    assert not (site.out / "ran").exists()
    result = [e for e in site.events() if e["type"] == "tool_result"][-1]
    assert (result["errno"], result["stage"], result["exit_status"]) == ("E2BIG", "run", None)

    site.mounts([str(site.data), "/data", "ro"], *entries[:100])
    quiet(site.call("shell.exec", f"touch {site.out}/ran"))
    assert (site.out / "ran").exists()


# ---------------------------------------------------------- identity, label, policy (P-5)

IDENTITIES = {
    "a name given twice": (
        '{"uid": 65534, "gid": 65534, "groups": [], "uid": 1000}',
        "not JSON: it gives the name 'uid' twice in one object; JSON readers disagree on which "
        "one counts, so give each name once",
    ),
    "true for a uid": (
        '{"uid": true, "gid": 65534, "groups": []}',
        "true is not a uid or gid (an integer from 0 to 4294967294)",
    ),
    "a float for a uid": (
        '{"uid": 65534.0, "gid": 65534, "groups": []}',
        "65534.0 is not a uid or gid (an integer from 0 to 4294967294)",
    ),
    "a string for a gid": (
        '{"uid": 65534, "gid": "65534", "groups": []}',
        '"65534" is not a uid or gid (an integer from 0 to 4294967294)',
    ),
    "NaN": ('{"uid": NaN, "gid": 65534, "groups": []}', "not JSON: NaN is not a JSON number"),
    "a number beyond a float": (
        '{"uid": 65534, "gid": 65534, "groups": [1e999]}',
        "not JSON: 1e999 (beyond the largest float) is not a JSON number",
    ),
    "nesting deeper than any identity": (
        '{"uid": 65534, "gid": 65534, "groups": ' + "[" * 300 + "]" * 300 + "}",
        "not JSON: nested deeper than 128 levels at line 1, column 167",
    ),
    "bytes that are not UTF-8": (
        b'{"uid": 65534, "gid": 65534, "groups": [], "x": "\xff"}',
        "not JSON: byte 49 is not UTF-8 text",
    ),
    "blanks only": (" \n\n", "not JSON: it is empty"),
}


@pytest.mark.parametrize("case", sorted(IDENTITIES))
def test_an_identity_no_kernel_could_take_is_named_by_show_list_and_a_call(
    site: Site, case: str
) -> None:
    """docs/policy.md (*What the chain reads*: a damaged identity is reported naming the file
    and what is wrong in plain words — "not JSON: …", a value that "is not a uid or gid"),
    ``ctx agent list --help`` (identity null when it cannot be read, with the problem):
    ``agent show`` exits 1 with EACCES and that sentence (the ``--json`` error object says
    the same), ``agent list`` lists the agent with no identity and the sentence, a call is
    refused (126) naming it and runs nothing, and no session is made."""
    content, reason = IDENTITIES[case]
    data = content if isinstance(content, bytes) else content.encode()
    site.control("identity").write_bytes(data)
    said = f"agent/coder.d/identity is invalid: {reason}"
    homes = snapshot(site.storage / "home")

    shown = site.ctx("agent", "show", "coder", "--json")
    refused(shown, "EACCES", 1)
    assert shown.err == f"ctx: EACCES: {said}\n", shown
    assert (shown.json()["error"], shown.json()["message"]) == ("EACCES", said), shown

    entry = site.listed()["coder"]
    assert (entry["label"], entry["identity"], entry["problems"]) == (LABEL, None, [said])
    ran = site.call("shell.exec", f"touch {site.out}/ran")
    refused(ran, "EACCES", 126)
    assert said in ran.err, ran
    assert not (site.out / "ran").exists()
    assert snapshot(site.storage / "home") == homes


def test_an_identity_with_a_byte_order_mark_is_the_identity(site: Site) -> None:
    """docs/policy.md: the identity is JSON text a person may have saved with a byte-order
    mark; the mark changes nothing — ``agent show`` gives the same ids, and a call runs as
    them."""
    site.control("identity").write_bytes(
        b'\xef\xbb\xbf{"uid": 65534, "gid": 65534, "groups": [65534]}\r\n'
    )
    shown = site.show()
    assert shown["identity"] == {"uid": NOBODY, "gid": NOBODY, "groups": [NOBODY]}, shown
    ran = site.call("shell.exec", "id -u")
    quiet(ran)
    assert ran.out == f"{NOBODY}\n", ran


@pytest.mark.parametrize("control", ["identity", "label"])
def test_a_control_one_byte_over_its_limit_is_efbig_for_show_list_and_a_call(
    site: Site, control: str
) -> None:
    """docs/policy.md (*What the chain reads*: an identity or label over 1 MiB is refused with
    EFBIG naming it and its limit; ``agent list`` and ``agent show`` list it as the agent's
    problem; only a byte past the limit is read, so a sparse file costs nothing): an identity
    so grown makes ``agent show`` exit 1 with EFBIG (nothing else can be derived without it),
    a label is a problem ``show`` lists; both are in ``list``, and a call is refused (126)
    naming the control and its limit, running nothing."""
    with site.control(control).open("r+b") as grown:
        grown.truncate(CONTROL_LIMIT + 1)
    said = (
        f"agent/coder.d/{control} holds more than {CONTROL_LIMIT} bytes, the limit of a "
        "control, so it is not read; rewrite it"
    )
    shown = site.ctx("agent", "show", "coder", "--json")
    if control == "identity":
        refused(shown, "EFBIG", 1)
        assert shown.json()["message"] == said, shown
    else:
        quiet(shown)
        assert (shown.json()["label"], shown.json()["problems"]) == (None, [said]), shown
    assert site.listed()["coder"]["problems"] == [said]
    ran = site.call("shell.exec", f"touch {site.out}/ran")
    assert ran.rc == 126 and said in ran.err and TRACEBACK not in ran.err, ran
    assert not (site.out / "ran").exists()


def test_a_label_with_blanks_and_a_crlf_end_is_that_label(site: Site) -> None:
    """docs/policy.md (the label is one line: the agent's subject type): blanks around it and
    the CR of a CRLF line end are not part of the name: ``agent show`` gives ``coder_t`` with
    no problem, and the grants written for ``coder_t`` hold for a call."""
    site.control("label").write_bytes(b"  coder_t \r\n")
    shown = site.show()
    assert (shown["label"], shown["problems"]) == (LABEL, []), shown
    ran = site.call("fs.read", "/data/notes.txt")
    quiet(ran)
    assert ran.out == "in data\n", ran


def test_a_label_of_two_lines_is_one_problem_line_naming_the_line_break(site: Site) -> None:
    """``ctx agent show --help`` (an unusable label is listed as a problem), docs/tools.md
    (whatever is shown that others wrote is escaped): a label of two lines names no subject
    type; ``agent show`` prints it as one ``problem:`` line with the line break written
    ``\\n``, never a second line that reads like one of its own (``admin_t`` alone); the
    chain denies at step 4 naming it, and the label written back, the call works."""
    site.control("label").write_bytes(b"coder_t\nadmin_t\n")
    reason = (
        "agent/coder.d/label is invalid: illegal subject type: 'coder_t\\nadmin_t' holds "
        "'\\n', which an object name may not hold (allowed: A-Z a-z 0-9 . _ -)"
    )
    assert site.show()["problems"] == [reason]
    text = site.ctx("agent", "show", "coder")
    quiet(text)
    assert f"problem: {reason}" in text.lines(), text
    assert "admin_t" not in [line.strip() for line in text.lines()], text
    facts = site.verdict("tool:fs.read", "execute")
    assert (facts["step"], facts["errno"]) == (4, "EACCES") and reason in facts["reason"], facts
    site.control("label").write_text(f"{LABEL}\n")
    quiet(site.call("fs.read", "/data/notes.txt"))


def test_every_unusable_control_is_listed_at_once(site: Site) -> None:
    """docs/tools.md (*Agents, host side*: ``ctx agent show`` lists "each label, policy or
    mount control that is unusable and so grants nothing, with the reason"), docs/policy.md
    (step 4: a control writable by its group or by others is not host-owned and grants
    nothing): an administrator who finds two problems should be told of both at once, not
    find the second after fixing the first; ``agent list`` counts both."""
    site.control("label").write_text("coder t\n")
    site.control("policy").chmod(0o666)
    problems = site.show()["problems"]
    assert any(p.startswith("agent/coder.d/label is invalid") for p in problems), problems
    assert any("agent/coder.d/policy is not host-owned" in p for p in problems), problems
    text = site.ctx("agent", "list")
    quiet(text)
    assert "(2 problem(s): " in text.out, text


# ------------------------------------------------------------- the projection of /ctx (T-5)


def test_a_home_replaced_by_a_link_is_never_a_working_directory_nor_written_through(
    site: Site,
) -> None:
    """docs/tools.md (*Environment*: the home is the working directory once it exists; the
    tools walk every path "with O_NOFOLLOW: a symbolic link anywhere on the way or at the end
    is refused (ELOOP)"), T-5: a home the host replaced by a link to another directory is not
    the agent's home to start in (``CTX_CWD`` is ``/ctx``), and a write below it through
    ``/ctx`` is refused without anything appearing where the link leads."""
    home = site.storage / "home" / str(NOBODY)
    home.mkdir(exist_ok=True)
    elsewhere = site.scratch / "elsewhere"
    (elsewhere / "agent").mkdir(parents=True)
    for path in (elsewhere, elsewhere / "agent"):
        os.chown(path, NOBODY, NOBODY)
        path.chmod(0o755)
    shutil.rmtree(home)
    home.symlink_to(elsewhere)
    site.mounts()
    assert site.show()["cwd"] == "/ctx"
    run, frame = site.native(
        "fs.write",
        {"path": f"/ctx/home/{NOBODY}/agent/planted", "content": "x"},
        options=("--project", "proj"),
    )
    assert frame["status"] == "error", frame
    assert frame["error"]["error"] in ("ELOOP", "EACCES"), frame
    assert os.listdir(elsewhere / "agent") == [], run
    assert home.is_symlink()


def test_a_tool_made_unavailable_leaves_the_view_and_returns_once_available(
    site: Site,
) -> None:
    """docs/mount.md and docs/tools.md (``tool/<t>``, ``<t>.d/`` are shown only for tools the
    agent may run: intact controls, status ``available``, and the whole chain): a tool
    disabled by its status control leaves ``/ctx/tool`` of the agent's view at the next call
    (``agent show``'s ``tool_mounts`` and a tool's ``fs.list``), a call of it is refused at
    stage ``resolve`` naming the status control, and set back to ``available`` it returns."""
    status = site.storage / "tool" / "fs.read.d" / "status"
    shown = names_at(site.show()["tool_mounts"], "/ctx/tool")
    assert {"fs.read", "fs.read.d", "tsh.d"} <= set(shown), shown
    status.write_text("disabled\n")
    hidden = names_at(site.show()["tool_mounts"], "/ctx/tool")
    assert "fs.read" not in hidden and "fs.read.d" not in hidden and "tsh.d" in hidden, hidden
    _, frame = site.native("fs.list", {"path": "/ctx/tool"})
    assert frame["status"] == "ok" and "fs.read.d" not in json.dumps(frame["output"]), frame
    ran = site.call("fs.read", "/data/notes.txt")
    refused(ran, "EACCES", 126)
    assert "fs.read.d/status reads 'available'" in ran.err, ran
    status.write_text("available\n")
    assert "fs.read" in names_at(site.show()["tool_mounts"], "/ctx/tool")
    quiet(site.call("fs.read", "/data/notes.txt"))


def test_a_model_and_its_provider_show_only_while_both_policies_grant_it(site: Site) -> None:
    """docs/mount.md, ``projection.py`` (``model/<p>/<m>`` only for models the agent may use
    through the whole chain, its policy and the model's own, P-5; a provider when it may use
    one of its models): a model granted in the agent's policy alone shows nothing; one both
    policies grant shows with its control directory and its provider, another provider
    stays hidden; revoked in the model's own policy, provider and model are gone again."""
    for name in ("acme/m1", "acme/m2", "zed/z1"):
        path = site.storage / "model" / name
        path.parent.mkdir(mode=0o755, exist_ok=True)
        path.write_text("{}\n")
        (path.parent / f"{path.name}.d").mkdir(mode=0o755)
        (path.parent / f"{path.name}.d" / "policy").write_text("")
    own = site.storage / "model" / "acme" / "m1.d" / "policy"
    site.grant("model:acme/m1 use", "model:acme/m2 use")
    assert names_at(site.show()["tool_mounts"], "/ctx/model") == []
    own.write_text(f"allow {LABEL} model:acme/m1 use\n")
    mounts = site.show()["tool_mounts"]
    assert names_at(mounts, "/ctx/model") == ["acme"], mounts
    assert names_at(mounts, "/ctx/model/acme") == ["m1", "m1.d"], mounts
    _, frame = site.native("fs.list", {"path": "/ctx/model/acme"})
    assert frame["status"] == "ok", frame
    assert "m2" not in json.dumps(frame["output"]), frame
    own.write_text("")
    assert names_at(site.show()["tool_mounts"], "/ctx/model") == []


def test_a_space_granted_before_it_exists_joins_the_view_the_moment_it_is_made(
    site: Site,
) -> None:
    """docs/tools.md (*CTX_PATH*: "A granted space that is not there … stays on the path,
    found empty … and it takes effect the moment ``ctx shared create`` makes it"), X-1: the
    path holds the space's tier from the start; the view lists the space only once it exists,
    at the next call, with nothing to restart."""
    site.grant("shared:later read")
    shown = site.show()
    assert ":/ctx/shared/later/tool:" in f"{shown['ctx_path']}:", shown
    assert "later" not in names_at(shown["tool_mounts"], "/ctx/shared"), shown
    made = site.ctx("shared", "create", "later", "--group", str(NOBODY))
    assert made.rc == 0, made
    assert "later" in names_at(site.show()["tool_mounts"], "/ctx/shared")
    _, frame = site.native("fs.list", {"path": "/ctx/shared/later"})
    assert frame["status"] == "ok", frame


def test_a_granted_write_never_opens_the_manual_bundle_or_a_spaces_tool_directory(
    site: Site,
) -> None:
    """docs/tools.md (*Under /ctx…*: writes go only into its home and the spaces it may write;
    tools, agents and models are the host's, a space's ``tool/`` included), D-1 (the manual
    bundle is read-only in every view, whatever a policy says): with ``shared:cortexfs-docs
    write`` added by hand, neither the bundle nor ``shared/proj/tool`` is a read-write
    mount of the view, and a write to either is refused with EROFS, creating nothing."""
    site.grant("shared:cortexfs-docs read", "shared:cortexfs-docs write")
    mounts = site.show()["tool_mounts"]
    writable = {mount[1] for mount in mounts if mount[2] == "rw"}
    assert "/ctx/shared/proj" in writable, mounts
    assert not {"/ctx/shared/cortexfs-docs", "/ctx/shared/proj/tool"} & writable, mounts
    for path in ("/ctx/shared/cortexfs-docs/planted", "/ctx/shared/proj/tool/planted"):
        _, frame = site.native("fs.write", {"path": path, "content": "x"})
        assert frame["status"] == "error" and frame["error"]["error"] == "EROFS", frame
        assert not (site.storage / path.removeprefix("/ctx/")).exists()


# -------------------------------------------------------- a child's mounts (A-4, agent.create)

CHILD_MOUNTS = {
    "a space's data, read-write": ("/ctx/shared/proj/data", "rw", "shared/proj/data"),
    "the manual bundle, read-only": ("/ctx/shared/cortexfs-docs", "ro", "shared/cortexfs-docs"),
    "a space's tool directory, read-only": ("/ctx/shared/proj/tool", "ro", "shared/proj/tool"),
    "the manual bundle, read-write": ("/ctx/shared/cortexfs-docs", "rw", None),
    "a space's tool directory, read-write": ("/ctx/shared/proj/tool", "rw", None),
    "the space itself": ("/ctx/shared/proj", "ro", None),
    "every space": ("/ctx/shared", "ro", None),
    "a space's agent directory": ("/ctx/shared/proj/agent", "ro", None),
    "the tool directory whole": ("/ctx/tool", "ro", None),
}


@pytest.mark.parametrize("case", sorted(CHILD_MOUNTS))
def test_a_childs_mount_is_taken_within_the_parents_view_of_ctx_and_refused_beyond(
    site: Site, case: str
) -> None:
    """A-4, docs/tools.md (*The core tools*, ``agent.create``: each mount "must lie within
    what the caller's own tools reach — under the storage root only what the caller's view
    shows (… never a filtered directory such as ``shared/`` whole, nor a space or a home
    itself, its ``agent/`` …) — ``rw`` only where they may write, and is recorded as the real
    path that was checked"; anything short is EACCES naming what the caller does not hold,
    exit 1, and nothing is created): a place the parent reads (or writes) through its view is
    recorded as the host path behind it; the manual bundle and a space's ``tool/`` are never
    the parent's to write; a space, ``shared/`` and a space's ``agent/`` are not the parent's
    to hand on whole."""
    source, mode, recorded = CHILD_MOUNTS[case]
    before = site.agents()
    request = {"name": "kid", "label": "kid_t", "mount": [[source, "/m", mode]]}
    run, frame = site.native("agent.create", request)
    if recorded is None:
        assert run.rc == 1 and frame["error"]["error"] == "EACCES", frame
        assert frame["error"]["message"].endswith(
            f"agent.create attenuates (A-4): coder does not hold the mount at /m ({mode})"
        ), frame
        assert site.agents() == before
        return
    assert run.rc == 0 and frame["status"] == "ok", frame
    table = json.loads(site.control("mount", "kid").read_text())
    assert table[0] == [str(site.storage / recorded), "/m", mode], table
