"""Session directories and the ``ctx session`` commands (SPEC S-1, S-5, S-6)."""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import time

import pytest

from cortexfs.errors import CtxError
from cortexfs.shared.sessions import SessionRef, list_sessions, open_session
from cortexfs.shared.spaces import create_shared_space
from cortexfs.shared.tree import Ownership
from tests.support.users import UnprivilegedUser, run_as
from tests.tools.support import World

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]


def test_a_home_session_belongs_to_the_agents_user(world: World) -> None:
    ref = SessionRef.home(world.root, world.user.uid, "coder", "review")

    with open_session(ref, owner=Ownership(world.user.uid, world.user.gid)) as session:
        session.record("note", object="agent/coder", status="ok", durable_event=True)

    for path in (ref.path, ref.events_path, world.root / "home" / str(world.user.uid)):
        status = os.stat(path)
        assert (status.st_uid, status.st_gid) == (world.user.uid, world.user.gid), path
    assert stat.S_IMODE(os.stat(ref.path).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(ref.events_path).st_mode) == 0o600
    assert ref.relative.as_posix() == f"home/{world.user.uid}/agent/coder/session/review"
    assert list_sessions(ref.path.parent, root=ref.root) == ["review"]


def test_a_shared_session_is_group_shared_and_needs_its_space(world: World) -> None:
    ref = SessionRef.shared(world.root, "proj", "coder", "design")
    with pytest.raises(CtxError) as missing:
        open_session(ref)
    create_shared_space(world.root, "proj", gid=world.user.gid)

    with open_session(ref, owner=Ownership(world.user.uid, world.user.gid)) as session:
        session.record("note", object="shared/proj", status="ok")

    assert missing.value.errno == errno.ENOENT and "ctx shared create" in missing.value.message
    status = os.stat(ref.path)
    assert stat.S_IMODE(status.st_mode) == 0o3770 and status.st_gid == world.user.gid
    assert stat.S_IMODE(os.stat(ref.events_path).st_mode) == 0o660


def test_another_member_cannot_rename_or_remove_an_agents_shared_session(world: World) -> None:
    """X-1/S-6: members may write in a shared session (with the grants), never take it away.
    The agent here runs as root; the member is the test user, in the space's group."""
    create_shared_space(world.root, "proj", gid=world.user.gid)
    ref = SessionRef.shared(world.root, "proj", "coder", "design")
    with open_session(ref, owner=Ownership(0, 0)) as session:
        session.record("note", object="shared/proj", status="ok")

    renamed = run_as(world.user, ["/bin/mv", str(ref.path), str(ref.path.with_name("gone"))])
    removed = run_as(world.user, ["/bin/rm", "-f", str(ref.events_path)])

    assert renamed.returncode and removed.returncode
    assert ref.events_path.exists()


def test_an_agents_place_in_a_space_made_by_another_member_is_refused(world: World) -> None:
    """Any member may make directories in a space's agent/: one made for another agent, before
    that agent first records there, would let its maker read and rewrite what it records."""
    create_shared_space(world.root, "proj", gid=world.user.gid)
    squatted = world.root / "shared" / "proj" / "agent" / "coder"
    squatted.mkdir()
    os.chown(squatted, 4321, world.user.gid)  # another member's uid
    ref = SessionRef.shared(world.root, "proj", "coder", "design")

    with pytest.raises(CtxError) as refused:
        open_session(ref, owner=Ownership(world.user.uid, world.user.gid))

    assert refused.value.errno == errno.EACCES and "belongs to uid 4321" in refused.value.message
    assert not ref.events_path.exists()
    os.chown(squatted, world.user.uid, -1)  # the agent's own: recorded there
    with open_session(ref, owner=Ownership(world.user.uid, world.user.gid)) as session:
        session.record("note", object="shared/proj", status="ok")


@pytest.mark.parametrize("bad", [{"agent": "../x"}, {"name": "a/b"}, {"name": "ok.d"}])
def test_session_names_follow_r3(world: World, bad: dict[str, str]) -> None:
    fields = {"agent": "coder", "name": "default", **bad}
    with pytest.raises(CtxError) as refused:
        SessionRef.home(world.root, 1000, fields["agent"], fields["name"])
    assert refused.value.errno == errno.EINVAL


@pytest.fixture
def recorded(world: World) -> World:
    world.agent("coder", tools=["fs.stat"])
    world.allow_tool("fs.stat")
    for path in ("/workspace", "/nowhere", "/workspace"):
        world.run("fs.stat", {"path": path})
    return world


def ctx(world: World, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CTX, "--storage", str(world.root), "session", *arguments],
        capture_output=True,
        text=True,
    )


def test_ctx_session_show_prints_a_timeline(recorded: World) -> None:
    text = ctx(recorded, "show", "coder")
    as_json = ctx(recorded, "show", "coder", "--json")

    lines = text.stdout.splitlines()
    assert text.returncode == 0 and len(lines) == 6
    assert "tool_call" in lines[0] and "tool/fs.stat" in lines[0] and " ok " in lines[0]
    assert "tool_result" in lines[3] and "EACCES" in lines[3]
    events = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [event["type"] for event in events] == ["tool_call", "tool_result"] * 3
    assert [event["status"] for event in events[1::2]] == ["ok", "error", "ok"]
    stored = SessionRef.home(recorded.root, recorded.user.uid, "coder").events_path
    assert as_json.stdout == stored.read_text()  # each event as it is stored


def test_ctx_session_tail_list_and_repair(recorded: World) -> None:
    events_path = SessionRef.home(recorded.root, recorded.user.uid, "coder").events_path
    torn = b'{"ts":"2026-01-01T00:00:00Z","ty'
    with open(events_path, "ab") as handle:
        handle.write(torn)

    tail = ctx(recorded, "tail", "coder", "-n", "2", "--json")
    listed = ctx(recorded, "list", "coder")
    repaired = ctx(recorded, "repair", "coder", "default", "--json")
    again = ctx(recorded, "repair", "coder")

    assert [json.loads(line)["type"] for line in tail.stdout.splitlines()] == [
        "tool_call",
        "tool_result",
    ]
    assert "torn line" in tail.stderr
    assert listed.stdout == "default\n"
    assert json.loads(repaired.stdout)["truncated_bytes"] == len(torn)
    assert "nothing to do" in again.stdout
    assert events_path.read_bytes().endswith(b"}\n")


@pytest.mark.parametrize(
    "args",
    [
        ("tail", "coder", "-n", "9223372036854775808"),
        ("tail", "coder", "-n", "-1"),
        ("tail", "coder", "--uid", "4294967295"),
        ("show", "coder", "--uid", "99999999999999999999"),
        ("repair", "coder", "--uid", "-5"),
        ("list", "coder", "--uid", "4294967295"),
    ],
)
def test_a_count_or_uid_out_of_its_range_is_a_usage_error(
    recorded: World, args: tuple[str, ...]
) -> None:
    """-n is a count a deque can hold (0 to 2**63 - 1), --uid a uid (0 to 2**32 - 2, since
    (uid_t) -1 is no id): EINVAL naming the range, exit 2, never a traceback or an empty
    answer about a home no uid can have."""
    refused = ctx(recorded, *args)

    assert (refused.returncode, refused.stdout) == (2, ""), refused.stderr
    last = refused.stderr.splitlines()[-1]
    assert last.startswith(f"ctx: EINVAL: Invalid value for '{args[2]}': ") and "range" in last
    most = ctx(recorded, "tail", "coder", "-n", "9223372036854775807", "--json")
    assert most.returncode == 0 and len(most.stdout.splitlines()) == 6, most.stderr


@pytest.mark.parametrize("command", ["list", "show", "tail", "repair"])
def test_the_manual_bundle_is_no_project_of_sessions(recorded: World, command: str) -> None:
    """X-2: no session is ever made in shared/cortexfs-docs, so naming it is a misnamed
    project (EINVAL, exit 2), not an empty listing, as the queue commands have it."""
    refused = ctx(recorded, command, "coder", "--project", "cortexfs-docs", "--json")

    assert (refused.returncode, json.loads(refused.stdout)["error"]) == (2, "EINVAL")
    assert "manual bundle (X-2)" in refused.stderr


def test_ctx_session_list_json_gives_names_as_the_text_does(recorded: World) -> None:
    recorded.run("fs.stat", {"path": "/workspace"}, session="review")
    parent = SessionRef.home(recorded.root, recorded.user.uid, "coder").path.parent

    text = ctx(recorded, "list", "coder")
    as_json = ctx(recorded, "list", "coder", "--json")

    assert text.stdout == "default\nreview\n"
    assert json.loads(as_json.stdout) == [
        {"name": "default", "path": str(parent / "default")},
        {"name": "review", "path": str(parent / "review")},
    ]


def test_an_event_holding_a_lone_surrogate_is_shown_escaped(recorded: World) -> None:
    """The recorder keeps such an input as it came, escaped; the readers print it so too."""
    recorded.run("fs.stat", {"path": "/workspace/\ud800"})

    shown = ctx(recorded, "show", "coder")
    as_json = ctx(recorded, "show", "coder", "--json")
    tail = ctx(recorded, "tail", "coder", "-n", "2", "--json")

    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert '"/workspace/\\ud800"' in shown.stdout.splitlines()[-2]
    assert as_json.returncode == 0 and tail.returncode == 0, as_json.stderr + tail.stderr
    call = json.loads(as_json.stdout.splitlines()[-2])
    assert call["type"] == "tool_call" and call["input"] == {"path": "/workspace/\ud800"}
    assert json.loads(tail.stdout.splitlines()[0]) == call


def test_what_an_event_holds_reaches_the_terminal_as_text_never_as_controls(
    recorded: World,
) -> None:
    """The agent owns its home events.jsonl: an escape sequence, a carriage return, a C1
    control or a bidirectional override in any column or detail is shown escaped."""
    events_path = recorded.root / "home" / str(recorded.user.uid) / "agent" / "coder"
    events_path = events_path / "session" / "default" / "events.jsonl"
    forged = {
        "ts": "2026-01-01T00:00:00Z\x1b[2K\r",
        "type": "tool_call\x1b]0;owned\x07",
        "object": "tool/\u202efs.stat",
        "status": "ok\u009b2J",
        "note": "x\u0085y",
    }
    with open(events_path, "a") as handle:
        handle.write(json.dumps(forged, ensure_ascii=False) + "\n")

    shown = ctx(recorded, "show", "coder")

    last = shown.stdout.splitlines()[-1]
    assert shown.returncode == 0, shown.stderr
    assert not any(char in shown.stdout for char in "\x1b\r\x07\u202e\u009b\u0085")
    for escaped in ("\\x1b[2K\\x0d", "\\x1b]0;owned\\x07", "\\u202efs.stat", "\\x9b2J", "\\x85"):
        assert escaped in last, (escaped, last)


def test_ctx_session_show_and_tail_help_say_json_lines(recorded: World) -> None:
    for command in ("show", "tail"):
        helped = ctx(recorded, command, "--help")
        assert "JSON Lines" in " ".join(helped.stdout.split()), command


def test_ctx_session_tail_follow_prints_new_events(recorded: World) -> None:
    follower = subprocess.Popen(
        [*CTX, "--storage", str(recorded.root), "session", "tail", "coder", "-n", "1", "-f"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert "tool_result" in follower.stdout.readline()  # the last event: it is following
        recorded.run("fs.stat", {"path": "/workspace"})
        lines = [follower.stdout.readline(), follower.stdout.readline()]
    finally:
        follower.kill()
        follower.wait()

    assert "tool_call" in lines[0] and "tool_result" in lines[1]


def test_ctx_session_errors(recorded: World) -> None:
    unknown = ctx(recorded, "show", "ghost")
    no_session = ctx(recorded, "show", "coder", "never")
    bad_name = ctx(recorded, "show", "coder", "../x", "--uid", "1")

    no_space = ctx(recorded, "list", "coder", "--project", "nospace")

    assert unknown.returncode == 1 and "ENOENT: there is no agent 'ghost'" in unknown.stderr
    assert no_space.returncode == 1 and "no shared space 'nospace'" in no_space.stderr
    assert no_session.returncode == 1 and "ENOENT" in no_session.stderr
    assert bad_name.returncode == 2 and "EINVAL" in bad_name.stderr


def test_a_missing_session_says_what_is_missing_and_how_to_list_the_others(
    recorded: World,
) -> None:
    uid = recorded.user.uid
    (recorded.root / f"home/{uid}/agent/coder/session/quiet").mkdir()
    create_shared_space(recorded.root, "proj", gid=recorded.user.gid)

    never = ctx(recorded, "show", "coder", "never")
    elsewhere = ctx(recorded, "tail", "coder", "never", "--uid", "7")
    in_space = ctx(recorded, "repair", "coder", "never", "--project", "proj")
    no_space = ctx(recorded, "show", "coder", "--project", "nospace")
    quiet = ctx(recorded, "show", "coder", "quiet")

    assert never.returncode == 1 and never.stderr == (
        f"ctx: ENOENT: there is no session home/{uid}/agent/coder/session/never; "
        f"'ctx session list coder --storage {recorded.root}' lists the sessions there are\n"
    )
    assert f"'ctx session list coder --uid 7 --storage {recorded.root}'" in elsewhere.stderr
    assert in_space.returncode == 1
    assert f"'ctx session list coder --project proj --storage {recorded.root}'" in (in_space.stderr)
    assert no_space.returncode == 1 and "no shared space 'nospace'" in no_space.stderr
    assert quiet.returncode == 1 and "nothing was recorded in it yet" in quiet.stderr


@pytest.mark.parametrize("planted", ["session/planted", "session"])
def test_a_link_planted_in_a_home_is_never_followed_by_a_reader(
    recorded: World, tmp_path_factory: pytest.TempPathFactory, planted: str
) -> None:
    """The home is the agent's: a link it plants must not lead `ctx session` (often root) to
    read or truncate a file elsewhere."""
    outside = tmp_path_factory.mktemp("outside")
    secret = b'{"ts":"2026-01-01T00:00:00Z","type":"secret","agent":"x","session":"x"}\n{"ts'
    (outside / "planted").mkdir()
    for directory in (outside, outside / "planted"):
        (directory / "events.jsonl").write_bytes(secret)
    agent_dir = recorded.root / f"home/{recorded.user.uid}/agent/coder"
    link = agent_dir / planted
    if link.exists():
        link.rename(agent_dir / "moved-away")
    link.symlink_to(outside / "planted" if planted.endswith("planted") else outside)
    name = "planted" if planted.endswith("planted") else "default"

    answers = [ctx(recorded, command, "coder", name) for command in ("show", "tail", "repair")]
    if name == "default":  # the session directory itself is the link: nothing to list
        answers.append(ctx(recorded, "list", "coder"))

    for answer in answers:
        assert answer.returncode == 1, answer
        assert "ENOTDIR" in answer.stderr and "symlink" in answer.stderr, answer.stderr
        assert "secret" not in answer.stdout and "planted" not in answer.stdout
    for directory in (outside, outside / "planted"):
        assert (directory / "events.jsonl").read_bytes() == secret


def test_a_session_another_user_may_not_read_is_eacces_naming_the_directory(
    recorded: World,
) -> None:
    """Not the kernel's bare 'agent: Permission denied', which names no path."""
    stranger = UnprivilegedUser("stranger", recorded.user.uid + 1000, recorded.user.gid + 1000)
    storage = ["--storage", str(recorded.root), "session"]
    closed = recorded.root / f"home/{recorded.user.uid}/agent"

    answers = [
        run_as(stranger, [*CTX, *storage, command, "coder", "--uid", str(recorded.user.uid)])
        for command in ("show", "list")
    ]

    for answer in answers:
        assert answer.returncode == 1, answer
        assert answer.stderr.startswith(
            f"ctx: EACCES: cannot open {closed}: uid {stranger.uid} may not read {closed} "
        ), answer.stderr


def test_a_member_of_the_group_of_a_closed_home_is_not_told_to_join_it(recorded: World) -> None:
    """The advice follows the mode: a directory whose group bits grant nothing is not opened
    by being of its group, so the refusal names only root and the owner."""
    member = UnprivilegedUser("member", recorded.user.uid + 1000, recorded.user.gid)
    closed = recorded.root / f"home/{recorded.user.uid}/agent"
    assert closed.stat().st_mode & 0o070 == 0 and closed.stat().st_gid == member.gid

    answer = run_as(
        member, [*CTX, "--storage", str(recorded.root), "session", "tail", "coder", "--json"]
    )

    assert answer.returncode == 1, answer
    assert f"uid {member.uid} may not read {closed} " in answer.stderr, answer.stderr
    assert "run it as root or as that owner, or " in answer.stderr, answer.stderr
    assert "group" not in answer.stderr.partition("); ")[2], answer.stderr


@pytest.mark.parametrize("command", ["show", "tail", "list", "repair"])
def test_a_closed_home_directory_on_the_way_to_a_gone_agents_sessions_names_who_may_read_it(
    recorded: World, command: str
) -> None:
    """The homes holding the sessions of an agent that is gone (or never was) are found by
    listing home/: closed to the caller, it is EACCES naming home/, its owner, group and
    mode, not the kernel's bare 'home: Permission denied'."""
    stranger = UnprivilegedUser("stranger", recorded.user.uid + 1000, recorded.user.gid + 1000)
    home = recorded.root / "home"
    home.chmod(0o700)

    answer = run_as(
        stranger, [*CTX, "--storage", str(recorded.root), "session", command, "ghost", "--json"]
    )

    assert answer.returncode == 1, answer
    refusal = json.loads(answer.stdout)
    assert refusal["error"] == "EACCES", answer
    assert refusal["message"].startswith(
        "cannot find the homes holding sessions of agent 'ghost': "
        f"uid {stranger.uid} may not read {home} (owner uid 0, group 0, mode 0700); "
    ), answer


def _forget_agent(world: World, agent: str) -> None:
    (world.root / "agent" / agent).unlink()
    shutil.rmtree(world.root / "agent" / f"{agent}.d")


def test_a_session_outlives_its_agent(recorded: World) -> None:
    """S-1: sessions are ordinary directories; reading one needs no agent entry."""
    recorded.run("fs.stat", {"path": "/workspace"}, session="s1")
    _forget_agent(recorded, "coder")
    storage = ["--storage", str(recorded.root), "session"]

    as_root = ctx(recorded, "show", "coder", "s1", "--json")
    listed = ctx(recorded, "list", "coder")
    as_its_user = run_as(recorded.user, [*CTX, *storage, "show", "coder", "s1", "--json"])
    listed_by_its_user = run_as(recorded.user, [*CTX, *storage, "list", "coder"])
    ghost = ctx(recorded, "list", "ghost")

    assert as_root.returncode == 0, as_root.stderr
    assert [json.loads(line)["type"] for line in as_root.stdout.splitlines()] == [
        "tool_call",
        "tool_result",
    ]
    assert (listed.returncode, listed.stdout) == (0, "default\ns1\n")
    assert (as_its_user.returncode, as_its_user.stdout) == (0, as_root.stdout), as_its_user.stderr
    assert (listed_by_its_user.returncode, listed_by_its_user.stdout) == (0, listed.stdout)
    assert ghost.returncode == 1 and "ENOENT: there is no agent 'ghost'" in ghost.stderr


def test_sessions_of_a_gone_agent_in_several_homes_need_uid(recorded: World) -> None:
    other_uid = recorded.user.uid + 1
    with open_session(SessionRef.home(recorded.root, other_uid, "coder", "elsewhere")) as session:
        session.record("note", object="agent/coder", status="ok")
    _forget_agent(recorded, "coder")

    ambiguous = ctx(recorded, "list", "coder")
    chosen = ctx(recorded, "list", "coder", "--uid", str(other_uid))

    assert ambiguous.returncode == 2 and "give --uid" in ambiguous.stderr
    assert ambiguous.stderr.startswith("ctx: EINVAL: there is no agent 'coder'")
    assert (chosen.returncode, chosen.stdout) == (0, "elsewhere\n")


def test_ctx_session_takes_the_session_as_ctx_run_names_it(recorded: World) -> None:
    """``--session S`` as in ``ctx run`` and ``ctx agent watch``, or a second argument."""
    by_option = ctx(recorded, "show", "coder", "--session", "default", "--json")
    by_argument = ctx(recorded, "show", "coder", "default", "--json")
    other = ctx(recorded, "show", "coder", "--session", "never")
    both = ctx(recorded, "show", "coder", "default", "--session", "never")

    assert by_option.returncode == 0 and by_option.stdout == by_argument.stdout
    assert [json.loads(line)["type"] for line in by_option.stdout.splitlines()][-1] == (
        "tool_result"
    )
    assert other.returncode == 1 and "ENOENT" in other.stderr
    assert both.returncode == 2 and "EINVAL: two sessions given" in both.stderr


def _limited_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_a_members_sparse_events_file_costs_root_a_moment_and_little_memory(world: World) -> None:
    """A member of a space may write another agent's shared events.jsonl (0660), here
    growing it by 3 GiB with no newline.  Root's show and tail skip the torn line and repair
    cuts it, each in a moment and in 2 GiB of address space: a sparse file's holes are never
    read."""
    create_shared_space(world.root, "proj", gid=world.user.gid)
    ref = SessionRef.shared(world.root, "proj", "coder", "default")
    with open_session(ref, owner=Ownership(world.user.uid, world.user.gid)) as session:
        session.record("note", object="shared/proj", status="ok")
    whole = ref.events_path.read_bytes()
    planted = run_as(world.user, ["/usr/bin/truncate", "-s", "+3G", str(ref.events_path)])
    assert planted.returncode == 0, planted.stderr

    answers = {}
    for command in ("show", "tail", "repair"):
        started = time.monotonic()
        answers[command] = subprocess.run(
            [*CTX, "--storage", str(world.root), "session", command, "--project", "proj", "coder"],
            capture_output=True,
            text=True,
            preexec_fn=_limited_memory,
            timeout=60,
        )
        assert answers[command].returncode == 0, answers[command]
        assert time.monotonic() - started < 10, command
    for command in ("show", "tail"):
        assert "note" in answers[command].stdout and "shared/proj" in answers[command].stdout
        assert f"ends with a torn line of {3 << 30} bytes" in answers[command].stderr
    assert str(3 << 30) in answers["repair"].stdout, answers["repair"]
    assert ref.events_path.read_bytes() == whole
