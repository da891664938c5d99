"""Shared sessions and the ``session:<name> read|write|resume`` permissions at their edges
(SPEC S-1, S-6, P-3 … P-6, X-1, F-1, R-3).

A space ``sp`` of group ``ctxspx-g`` holds the sessions of three agents: ``wr`` (uid
``ctxspx-a``, ``shared:sp read write``), ``rd`` (uid ``ctxspx-b``, ``shared:sp read`` only) and
``wb`` (uid ``ctxspx-b`` too, ``shared:sp read write``); ``ctxspx-o`` is a real uid outside the
group.  The flows: the modes and group of what the runner makes in a space, an agent that may
only read the space holding ``session:`` write and resume rules, write without read, a grant
naming a session that does not exist yet, session names at the edge of R-3, session
directories made by hand, ``ctx session show|tail|repair|list`` by root, the owner, a member
and an outsider, a session named in another space, and what ``ctx mount --as AGENT`` lists.
Everything runs through the ``ctx`` command, real uids and real FUSE mounts."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    Run,
    needs_fuse_as_root,
    new_scratch_dir,
    scratch_top,
    serving,
    tool_manifest,
    wait_for,
)
from tests.support.users import UnprivilegedUser, members_of, users_named

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents and users as other uids")

SPACE = "sp"
OTHER = "sq"
GROUP = "ctxspx-g"
TOOLS = ("demo.echo", "fs.read", "fs.list")
ECHO = "#!/bin/sh\ncat\n"
LONGEST = "Z" * 64  # 64 bytes, the longest object name


@dataclass
class World(OnStorage):
    storage: Path
    top: Path
    owner: UnprivilegedUser  # wr's uid
    member: UnprivilegedUser  # rd's and wb's uid
    outsider: UnprivilegedUser  # in no group of the space
    gid: int  # the space's group

    def record(self, agent: str, session: str, *options: str) -> Run:
        """One native call of ``demo.echo`` by ``agent`` in ``session``."""
        return self.ctx("run", "--agent", agent, *options, "--session", session, "--native",
                        "demo.echo", input='{"n": 1}')  # fmt: skip

    def shared_session(self, agent: str, session: str, space: str = SPACE) -> Path:
        return self.storage / "shared" / space / "agent" / agent / "session" / session

    def home_session(self, user: UnprivilegedUser, agent: str, session: str) -> Path:
        return self.storage / "home" / str(user.uid) / "agent" / agent / "session" / session

    def uid_of(self, agent: str) -> UnprivilegedUser:
        return self.owner if agent == "wr" else self.member

    @contextlib.contextmanager
    def rules(self, agent: str, *rules: str) -> Iterator[None]:
        """``agent``'s policy with ``rules`` added for the time of the block."""
        policy = self.storage / "agent" / f"{agent}.d" / "policy"
        kept = policy.read_text()
        policy.write_text(kept + "".join(f"allow {agent}_t {rule}\n" for rule in rules))
        try:
            yield
        finally:
            policy.write_text(kept)

    def explain(self, agent: str, obj: str, perm: str, location: str) -> dict:
        r = self.ctx("policy", "explain", agent, obj, perm, "--location", location, "--json")
        assert r.rc in (0, 1), r
        return r.json()

    def as_user(self, user: UnprivilegedUser, argv: list[str], groups: list[int]) -> Run:
        """``argv`` run as ``user`` with exactly ``groups``, in our environment aimed at the
        storage root and with a home nobody has."""
        env = {**self.env, "HOME": "/nonexistent"}
        done = subprocess.run(argv, user=user.uid, group=user.gid, extra_groups=groups,
                              env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
        return Run(argv, done.returncode, done.stdout, done.stderr)

    def ctx_as(self, user: UnprivilegedUser, *args: str) -> Run:
        groups = [] if user == self.outsider else [self.gid]
        return self.as_user(user, [*CTX_ARGV, *args], groups)

    def sh_as(self, agent: str, script: str) -> Run:
        """``script`` in sh as ``agent``'s uid and groups."""
        return self.as_user(self.uid_of(agent), ["/bin/sh", "-c", script], [self.gid])


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    (owner, member), gid = members_of(GROUP, "ctxspx-a", "ctxspx-b")
    (outsider,) = users_named("ctxspx-o")
    top = new_scratch_dir(scratch_top(__file__))
    try:
        storage = top / "storage"
        w = World(storage, top, owner, member, outsider, gid)
        assert w.ctx("bootstrap", "--storage", storage).rc == 0
        for space in (SPACE, OTHER):
            r = w.ctx("shared", "create", space, "--group", GROUP)
            assert r.rc == 0, r
        r = w.ctx("object", "install", tool_manifest(top / "m", "demo.echo", ECHO),
                  "--tier", "system")  # fmt: skip
        assert r.rc == 0, r
        for name, user, grant in (
            ("wr", owner, ["read", "write"]),
            ("rd", member, ["read"]),
            ("wb", member, ["read", "write"]),
        ):
            request = {"name": name, "label": f"{name}_t", "mount": [], "tools": list(TOOLS),
                       "shared": {SPACE: grant}}  # fmt: skip
            w.create_agent(request, "--user", user.name, "--groups", str(gid))
            w.allow_tool(f"{name}_t", *TOOLS)
        yield w
    finally:
        shutil.rmtree(top, ignore_errors=True)


def stat_of(path: Path) -> tuple[int, int, int]:
    status = path.lstat()
    return status.st_mode & 0o7777, status.st_uid, status.st_gid


def refused(r: Run, errno_name: str, *words: str) -> None:
    """Exit 1 with ``errno_name`` and every word of ``words`` on stderr, no traceback."""
    assert r.rc == 1, r
    assert errno_name in r.err and "Traceback" not in r.err + r.out, r
    for word in words:
        assert word in r.err, (word, r)


def listing(world: World, agent: str, path: Path) -> Run:
    return world.sh_as(agent, f"ls -1 '{path}'")


# ------------------------------------------------------------------ what the runner makes


def test_the_runner_gives_a_shared_session_the_agents_uid_and_the_spaces_group(world):
    """S-1, S-6, X-1 (docs/sessions.md "Where sessions live"): the runner, as root, makes the
    agent's directories down to the session 03770 with the agent's uid and the space's group,
    and ``events.jsonl`` 0660; a member of the group reads it but cannot rename or remove the
    session (sticky), and a uid outside the group reaches nothing of it."""
    r = world.record("wr", "modes", "--project", SPACE)
    assert r.rc == 0, r
    session = world.shared_session("wr", "modes")
    uid, gid = world.owner.uid, world.gid
    for path in (session.parent.parent, session.parent, session):
        assert stat_of(path) == (0o3770, uid, gid), path
    assert stat_of(session / "events.jsonl") == (0o660, uid, gid)
    events = session / "events.jsonl"
    before = events.read_bytes()
    moved = world.sh_as("wb", f"head -c 1 '{events}' >/dev/null && echo read; "
                        f"mv '{session}' '{session}.x'; rm -rf '{session}'; echo done")  # fmt: skip
    assert moved.out.split() == ["read", "done"], moved
    assert events.read_bytes() == before
    stranger = world.as_user(world.outsider, ["/bin/sh", "-c", f"cat '{events}'"], [])
    assert stranger.rc != 0 and stranger.out == "", stranger


# ------------------------------------------------------------------ read-only space, session rules


def test_session_write_and_resume_rules_do_not_make_a_read_only_space_writable(world):
    """S-6, P-5, X-1: ``rd`` may only read the space; its policy holding ``session:<n>
    read``, ``write`` and ``resume`` does not change that.  The chain allows ``read`` of
    ``wr``'s session and denies ``write`` and ``resume`` at step 3 (the space is read-only in
    its view); a call of ``rd`` naming a session in the space is refused with EACCES and
    nothing is made under ``shared/sp/agent/rd``."""
    assert world.record("wr", "ro", "--project", SPACE).rc == 0
    location = f"shared/{SPACE}/agent/wr/session"
    perms = ("read", "write", "resume")
    with world.rules("rd", *(f"session:ro {perm}" for perm in perms)):
        answers = {perm: world.explain("rd", "session:ro", perm, location) for perm in perms}
        r = world.record("rd", "ro", "--project", SPACE)
    assert answers["read"]["allowed"] is True, answers["read"]
    for perm in ("write", "resume"):
        assert answers[perm]["allowed"] is False, answers[perm]
        assert (answers[perm]["step"], answers[perm]["errno"]) == (3, "EACCES"), answers[perm]
    assert r.rc != 0, r
    result = json.loads(r.lines()[-1])
    assert result["error"]["error"] == "EACCES" and result["error"]["step"] == 3, result
    assert not (world.storage / "shared" / SPACE / "agent" / "rd").exists()


def test_resuming_a_session_records_without_any_session_rule_and_the_chain_says_so(world):
    """S-6 (docs/mount.md: the recording is the host's, whatever the agent itself may do with
    its sessions): ``wr``, with no ``session:`` rule at all, goes on recording in an existing
    shared session, while the chain denies it ``session:<n> resume`` at step 5, naming the
    missing rule."""
    assert world.record("wr", "again", "--project", SPACE).rc == 0
    assert world.record("wr", "again", "--project", SPACE).rc == 0
    events = (world.shared_session("wr", "again") / "events.jsonl").read_text().splitlines()
    assert [json.loads(line)["type"] for line in events] == ["tool_call", "tool_result"] * 2
    answer = world.explain("wr", "session:again", "resume", f"shared/{SPACE}/agent/wr/session")
    assert (answer["allowed"], answer["step"]) == (False, 5), answer
    assert "allow wr_t session:again resume" in answer["reason"], answer


# ------------------------------------------------------------------ the agent's view


@needs_fuse_as_root
def test_write_without_read_hides_a_session_and_read_with_write_lets_it_grow(world):
    """S-6, F-1 (docs/mount.md "Inside a space"): with ``session:w1 write`` and no ``read``,
    ``wr``'s view neither lists nor opens its session ``w1`` (ENOENT), so its events stay as
    they are; the chain denies ``read`` at step 5 and allows ``write``.  Its session ``w2``,
    granted ``read`` and ``write``, is listed and takes a line appended through the view, but
    the session directory itself is neither renamed nor removed there."""
    for session in ("w1", "w2"):
        assert world.record("wr", session, "--project", SPACE).rc == 0
    location = f"shared/{SPACE}/agent/wr/session"
    w1 = world.shared_session("wr", "w1") / "events.jsonl"
    before = w1.read_bytes()
    with world.rules("wr", "session:w1 write", "session:w2 read", "session:w2 write"):
        read = world.explain("wr", "session:w1", "read", location)
        write = world.explain("wr", "session:w1", "write", location)
        view = new_scratch_dir(world.top, "view-") / "mnt"
        view.mkdir()
        with serving(world.storage, view, "--as", "wr"):
            seen = view / "shared" / SPACE / "agent" / "wr" / "session"
            listed = listing(world, "wr", seen)
            script = (f"cat '{seen}/w1/events.jsonl' >/dev/null 2>&1; echo $?; "
                      f"echo '{{}}' >> '{seen}/w1/events.jsonl'; echo $?; "
                      f"echo '{{}}' >> '{seen}/w2/events.jsonl'; echo $?; "
                      f"mv '{seen}/w2' '{seen}/w3' 2>/dev/null; echo $?; "
                      f"rmdir '{seen}/w2' 2>/dev/null; echo $?")  # fmt: skip
            done = world.sh_as("wr", script)
    assert (read["allowed"], read["step"]) == (False, 5), read
    assert write["allowed"] is True, write
    assert listed.rc == 0 and "w1" not in listed.lines() and "w2" in listed.lines(), listed
    cat_w1, append_w1, append_w2, rename_w2, rmdir_w2 = done.out.split()
    assert cat_w1 != "0" and append_w1 != "0", done
    assert append_w2 == "0", done
    assert rename_w2 != "0" and rmdir_w2 != "0", done
    assert w1.read_bytes() == before
    assert (world.shared_session("wr", "w2") / "events.jsonl").read_text().endswith("{}\n")
    assert not world.shared_session("wr", "w3").exists()


@needs_fuse_as_root
def test_a_grant_for_a_session_that_does_not_exist_yet_shows_it_once_it_is_made(world):
    """S-6, F-1, P-4 (a missing object is ENOENT): ``rd`` holds ``session:later read`` before
    any such session exists; the chain answers ENOENT at step 2, and its view does not list
    it.  ``wr``, holding ``session:soon read`` and ``write``, cannot make its session ``soon``
    through its view (EACCES, nothing on disk).  Once ``wr``'s calls record ``later``, ``rd``'s
    running view lists it within the view's second and reads exactly what ``ctx session show``
    prints; ``rd`` still cannot write in it (its space is read-only)."""
    location = f"shared/{SPACE}/agent/wr/session"
    assert world.record("wr", "first", "--project", SPACE).rc == 0
    with (
        world.rules("rd", "session:later read"),
        world.rules("wr", "session:soon read", "session:soon write"),
    ):
        early = world.explain("rd", "session:later", "read", location)
        base = new_scratch_dir(world.top, "views-")
        (base / "rd").mkdir()
        (base / "wr").mkdir()
        with serving(world.storage, base / "rd", "--as", "rd"), \
                serving(world.storage, base / "wr", "--as", "wr"):  # fmt: skip
            rd_seen = base / "rd" / "shared" / SPACE / "agent" / "wr" / "session"
            wr_seen = base / "wr" / "shared" / SPACE / "agent" / "wr" / "session"
            before = listing(world, "rd", rd_seen)
            made = world.sh_as("wr", f"mkdir '{wr_seen}/soon'")
            assert world.record("wr", "later", "--project", SPACE).rc == 0
            assert wait_for(lambda: "later" in listing(world, "rd", rd_seen).lines(), 10)
            read = world.sh_as("rd", f"cat '{rd_seen}/later/events.jsonl'")
            wrote = world.sh_as("rd", f"echo '{{}}' >> '{rd_seen}/later/events.jsonl'")
    assert (early["allowed"], early["step"], early["errno"]) == (False, 2, "ENOENT"), early
    assert before.rc == 0 and "later" not in before.lines(), before
    assert made.rc != 0 and "Permission denied" in made.err, made
    assert not world.shared_session("wr", "soon").exists()
    shown = world.ctx("session", "show", "wr", "later", "--project", SPACE, "--json")
    assert shown.rc == 0, shown
    assert read.rc == 0 and [json.loads(x) for x in read.lines()] == [
        json.loads(x) for x in shown.lines()
    ], read
    assert wrote.rc != 0, wrote
    assert (world.shared_session("wr", "later") / "events.jsonl").read_text().count("\n") == 2


@needs_fuse_as_root
def test_sessions_named_at_the_edge_of_r3_are_recorded_and_shown_only_when_granted(world):
    """R-3, S-1, S-6, P-3, F-1: sessions named with 64 bytes, ``x.D`` (not the ``.d``
    suffix), ``9.-_`` and ``a..b`` are recorded, listed by ``ctx session list`` and shown;
    rules naming them are valid; ``rd``'s view lists the two it is granted and not the two it
    is not, the same session of ``wb`` (another agent of its own uid) included.  A rule for a
    65-byte name or a ``.d`` name is EINVAL."""
    names = (LONGEST, "x.D", "9.-_", "a..b")
    for name in names:
        for agent in ("wr", "wb"):
            r = world.record(agent, name, "--project", SPACE)
            assert r.rc == 0, r
    listed = world.ctx("session", "list", "wr", "--project", SPACE)
    assert listed.rc == 0 and set(names) <= set(listed.lines()), listed
    for name in names:
        shown = world.ctx("session", "show", "wr", "--session", name, "--project", SPACE,
                          "--json")  # fmt: skip
        assert shown.rc == 0 and len(shown.lines()) == 2, shown
        assert json.loads(shown.lines()[0])["session"] == name, shown
    granted = (LONGEST, "x.D")
    rules = [f"session:{name} read" for name in granted]
    check = world.ctx("policy", "check", "-",
                      input="".join(f"allow rd_t {rule}\n" for rule in rules))  # fmt: skip
    assert check.rc == 0, check
    for bad in ("Z" * 65, "x.d"):
        r = world.ctx("policy", "check", "-", input=f"allow rd_t session:{bad} read\n")
        assert r.rc == 1 and "EINVAL" in r.err, r
    with world.rules("rd", *rules):
        view = new_scratch_dir(world.top, "edge-") / "mnt"
        view.mkdir()
        with serving(world.storage, view, "--as", "rd"):
            shown_by = {
                agent: listing(world, "rd", view / "shared" / SPACE / "agent" / agent / "session")
                for agent in ("wr", "wb")
            }
            long_read = world.sh_as("rd", f"cat '{view}/shared/{SPACE}/agent/wr/session/"
                                          f"{LONGEST}/events.jsonl'")  # fmt: skip
    for agent, seen in shown_by.items():
        assert seen.rc == 0, (agent, seen)
        assert set(seen.lines()) & set(names) == set(granted), (agent, seen)
    assert long_read.rc == 0 and long_read.out.count("\n") == 2, long_read


@needs_fuse_as_root
def test_a_session_the_chain_denies_on_its_mode_bits_is_not_listed_in_the_view(world):
    """F-1, S-6, P-5 (docs/mount.md: the view decides as the chain does, ``ctx policy
    explain`` giving the same answer): root made ``wr``'s session directory ``vault`` by hand,
    0700; ``rd`` holds ``session:vault read``, yet the chain denies it at step 2 (mode bits).
    Only objects that pass the whole authority check are listed in an agent's view, so ``rd``'s
    view does not list ``vault``."""
    assert world.record("wr", "open", "--project", SPACE).rc == 0
    vault = world.shared_session("wr", "vault")
    vault.mkdir(mode=0o700)
    vault.chmod(0o700)
    with world.rules("rd", "session:vault read", "session:open read"):
        answer = world.explain("rd", "session:vault", "read", f"shared/{SPACE}/agent/wr/session")
        view = new_scratch_dir(world.top, "vault-") / "mnt"
        view.mkdir()
        with serving(world.storage, view, "--as", "rd"):
            seen = listing(world, "rd", view / "shared" / SPACE / "agent" / "wr" / "session")
    assert (answer["allowed"], answer["step"]) == (False, 2), answer
    assert seen.rc == 0 and "open" in seen.lines(), seen
    assert "vault" not in seen.lines(), seen


# ------------------------------------------------------------------ directories made by hand


def test_a_session_directory_made_by_hand_keeps_its_modes_and_its_owner_is_checked(world):
    """S-1, S-6 (docs/sessions.md: opening a session keeps the modes it has; what leads to a
    shared session must be the agent's own or root's): a session directory root made 0700 is
    recorded in, its mode kept (02700, setgid as ``mkdir`` leaves it there), ``events.jsonl`` the
    agent's with the space's group; one a
    member (``wb``'s uid) made in ``wr``'s ``session/`` is refused with EACCES naming the
    directory and its owner, and nothing is written in it."""
    # The agent's session/ as the runner makes it (another test may not have made it first).
    assert world.record("wr", "first", "--project", SPACE).rc == 0
    byroot = world.shared_session("wr", "byroot")
    byroot.mkdir(mode=0o700)
    byroot.chmod(0o2700)  # as mkdir(1) leaves it below the setgid session/
    r = world.record("wr", "byroot", "--project", SPACE)
    assert r.rc == 0, r
    assert stat_of(byroot) == (0o2700, 0, world.gid)
    assert stat_of(byroot / "events.jsonl") == (0o660, world.owner.uid, world.gid)
    planted = world.shared_session("wr", "planted")
    made = world.sh_as("wb", f"mkdir '{planted}'")
    assert made.rc == 0, made
    r = world.record("wr", "planted", "--project", SPACE)
    assert r.rc != 0, r
    error = json.loads(r.lines()[-1])["error"]
    assert error["error"] == "EACCES", error
    assert str(planted) in error["message"] and f"uid {world.member.uid}" in error["message"]
    assert os.listdir(planted) == []


def test_a_space_without_agent_dir_never_gives_it_to_the_first_agent_that_records(world):
    """X-1, S-6 (docs/sessions.md: the space and its ``agent/`` are sticky, so a member adds
    entries there but never renames or removes another agent's sessions): space ``bare`` lost
    its ``agent/``.  When ``wr`` records there, the runner may refuse (the space is not
    complete) or remake ``agent/``, but not as ``wr``'s: else ``wr``'s uid, owner of the sticky
    directory, renames ``wb``'s sessions away."""
    space = "bare"
    r = world.ctx("shared", "create", space, "--group", GROUP)
    assert r.rc == 0, r
    (world.storage / "shared" / space / "agent").rmdir()
    grants = (f"shared:{space} read", f"shared:{space} write")
    with world.rules("wr", *grants), world.rules("wb", *grants):
        first = world.record("wr", "s1", "--project", space)
        second = world.record("wb", "s1", "--project", space)
    agents = world.storage / "shared" / space / "agent"
    if first.rc == 0:
        assert agents.lstat().st_uid == 0, stat_of(agents)
    else:
        assert "ENOENT" in first.out and "ctx shared create" in first.out, first
        assert not agents.exists(), stat_of(agents)
        assert world.ctx("shared", "create", space, "--group", GROUP).rc == 0
        with world.rules("wr", *grants), world.rules("wb", *grants):
            assert world.record("wr", "s1", "--project", space).rc == 0
            second = world.record("wb", "s1", "--project", space)
    assert second.rc == 0, second
    moved = world.sh_as("wr", f"mv '{agents}/wb' '{agents}/gone'")
    assert moved.rc != 0, moved
    assert world.shared_session("wb", "s1", space).is_dir()


def test_a_new_shared_session_gets_the_spaces_group_even_when_agent_dir_lost_setgid(world):
    """X-1, S-6 (docs/sessions.md: a shared session belongs to the agent's uid and the space's
    group, so the members read it): the space's ``agent/`` lost its setgid bit (a ``chmod``, a
    copy that did not keep it).  A session the runner makes for ``wb`` there is never given
    root's group: it is the space's (or the call is refused naming the directory), and
    ``wr``'s uid, a member, can read it."""
    space = "nog"
    r = world.ctx("shared", "create", space, "--group", GROUP)
    assert r.rc == 0, r
    agents = world.storage / "shared" / space / "agent"
    agents.chmod(0o1770)
    with world.rules("wb", f"shared:{space} read", f"shared:{space} write"):
        r = world.record("wb", "nogid", "--project", space)
    events = world.shared_session("wb", "nogid", space) / "events.jsonl"
    if r.rc == 0:
        for path in (events.parent.parent.parent, events.parent, events):
            assert path.lstat().st_gid == world.gid, (path, stat_of(path))
        read = world.sh_as("wr", f"cat '{events}'")
        assert read.rc == 0, read
    else:
        assert "setgid" in r.out + r.err, r


# ------------------------------------------------------------------ ctx session by who


def test_session_commands_by_root_owner_member_and_outsider(world):
    """S-5, S-6, R-4 (docs/sessions.md "Commands", "Reading, torn lines and repair"): of a
    shared session with a torn last line and of a home session, ``ctx session
    show|tail|list`` print for root and for the owner; a member of the space reads the shared
    one and may repair it (the file is group-writable) but is refused the home one (EACCES
    naming the home); a uid outside the group is refused every command (EACCES, exit 1,
    naming the space and its group), the files unchanged."""
    assert world.record("wr", "who", "--project", SPACE).rc == 0
    assert world.record("wr", "who").rc == 0
    shared = world.shared_session("wr", "who") / "events.jsonl"
    home = world.home_session(world.owner, "wr", "who") / "events.jsonl"
    whole = shared.read_bytes()
    torn = b'{"ts":"2026-01-01T00:00:00Z","type":"tool_ca'
    with shared.open("ab") as f:
        f.write(torn)
    at_start = {path: path.read_bytes() for path in (shared, home)}
    in_space = ("who", "--project", SPACE)
    commands = [("show", "wr", *in_space, "--json"), ("tail", "wr", *in_space, "-n", "1"),
                ("list", "wr", "--project", SPACE)]  # fmt: skip

    for cmd in commands:
        r = world.ctx_as(world.outsider, "session", *cmd)
        refused(r, "EACCES", f"shared/{SPACE}", str(world.gid))
    for args in (("show", "wr", "who"), ("repair", "wr", *in_space)):
        refused(world.ctx_as(world.outsider, "session", *args), "EACCES")
    assert {path: path.read_bytes() for path in (shared, home)} == at_start

    refused(world.ctx_as(world.member, "session", "show", "wr", "who"), "EACCES",
            f"home/{world.owner.uid}")  # fmt: skip
    for user in (world.owner, world.member):
        r = world.ctx_as(user, "session", "show", "wr", *in_space, "--json")
        assert r.rc == 0 and len(r.lines()) == 2, r
        assert "torn line" in r.err, r
        r = world.ctx_as(user, "session", "tail", "wr", *in_space, "-n", "1", "--json")
        assert r.rc == 0 and json.loads(r.out)["type"] == "tool_result", r
    r = world.ctx_as(world.owner, "session", "show", "wr", "who", "--json")
    assert r.rc == 0 and len(r.lines()) == 2, r
    assert world.ctx_as(world.owner, "session", "list", "wr").lines() == ["who"]

    repaired = world.ctx_as(world.member, "session", "repair", "wr", *in_space, "--json")
    assert repaired.rc == 0, repaired
    assert repaired.json()["truncated_bytes"] == len(torn), repaired
    assert shared.read_bytes() == whole
    r = world.ctx("session", "repair", "wr", *in_space)
    assert r.rc == 0 and "nothing to do" in r.out, r
    r = world.ctx("session", "show", "wr", "who", "--json")
    assert r.rc == 0 and len(r.lines()) == 2, r
    assert stat_of(shared) == (0o660, world.owner.uid, world.gid)


def test_a_session_named_in_another_space_is_not_found_there_and_not_made_there(world):
    """S-1, S-6, X-1: ``wr``'s session ``cross`` lives in ``sp``.  Named with ``--project sq``
    (a space ``wr`` has no grant on), ``ctx session show|tail|repair`` answer ENOENT naming the
    ``ctx session list`` command for ``sq``, which lists nothing; ``ctx run --project sq
    --session cross`` is refused with EACCES and nothing is made under ``shared/sq/agent``;
    a space that does not exist is ENOENT naming ``ctx shared create``."""
    assert world.record("wr", "cross", "--project", SPACE).rc == 0
    for cmd in (("show",), ("tail", "-n", "1"), ("repair",)):
        r = world.ctx("session", cmd[0], "wr", "--session", "cross", "--project", OTHER, *cmd[1:])
        refused(r, "ENOENT", f"ctx session list wr --project {OTHER}")
    r = world.ctx("session", "list", "wr", "--project", OTHER)
    assert (r.rc, r.out) == (0, ""), r
    r = world.record("wr", "cross", "--project", OTHER)
    assert r.rc != 0, r
    assert json.loads(r.lines()[-1])["error"]["error"] == "EACCES", r
    assert os.listdir(world.storage / "shared" / OTHER / "agent") == []
    r = world.ctx("session", "show", "wr", "cross", "--project", "nosuch")
    refused(r, "ENOENT", "ctx shared create")
    assert world.shared_session("wr", "cross").is_dir()
