"""``ctx bootstrap`` tightens the home sessions an older version made readable by the agent's
group (0750 directories, 0640 events.jsonl) to the modes new ones get (SPEC S-1, R-5)."""

from __future__ import annotations

import json
import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import cortexfs.shared.home_sessions  # noqa: F401  (registers its bootstrap step)
from cortexfs import storage
from cortexfs.shared.sessions import SessionRef, open_session
from cortexfs.shared.tree import Ownership
from tests.support.storage import attribute
from tests.support.users import UnprivilegedUser, access_as, run_as

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]
OLD_DIRECTORY_MODE, OLD_EVENTS_MODE = 0o750, 0o640  # what versions before them made
LEVELS = ("agent", "agent/alice", "agent/alice/session", "agent/alice/session/s1")


def old_home_session(root: Path, user: UnprivilegedUser) -> Path:
    """A home session of agent alice (the test user's uid and group) with one event, given
    the modes an older version made it with; its home."""
    ref = SessionRef.home(root, user.uid, "alice", "s1")
    with open_session(ref, owner=Ownership(user.uid, user.gid)) as session:
        session.record("tool_result", object="tool/fs.stat", status="ok", output="secret")
    home = root / "home" / str(user.uid)
    for level in LEVELS:
        (home / level).chmod(OLD_DIRECTORY_MODE)
    (home / LEVELS[-1] / "events.jsonl").chmod(OLD_EVENTS_MODE)
    return home


@pytest.fixture
def old_home(traversable_tmp: Path, unprivileged_user: UnprivilegedUser) -> tuple[Path, Path]:
    """A bootstrapped root with :func:`old_home_session`: the root and the home."""
    root = traversable_tmp / "storage"
    storage.bootstrap(root)
    return root, old_home_session(root, unprivileged_user)


def ctx(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CTX, "--storage", str(root), *args], capture_output=True, text=True)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_bootstrap_tightens_an_old_home_session_so_the_group_reads_none_of_it(
    old_home: tuple[Path, Path], unprivileged_user: UnprivilegedUser
) -> None:
    root, home = old_home
    events = home / LEVELS[-1] / "events.jsonl"
    # Another agent's uid sharing alice's group.
    neighbour = UnprivilegedUser("neighbour", unprivileged_user.uid + 1000, unprivileged_user.gid)
    assert access_as(neighbour, [(str(events), "r")]) == [True]

    done = ctx(root, "bootstrap")

    assert done.returncode == 0, done.stdout + done.stderr
    shown = f"home/{unprivileged_user.uid}"
    for level in LEVELS:
        assert mode(home / level) == 0o700, level
        assert f"repaired  {shown}/{level} (mode 0750 -> 0700)" in done.stdout
    assert mode(events) == 0o600
    assert f"repaired  {shown}/{LEVELS[-1]}/events.jsonl (mode 0640 -> 0600)" in done.stdout
    assert access_as(neighbour, [(str(events), "r")]) == [False]
    assert os.stat(events).st_uid == unprivileged_user.uid  # only the mode changed

    again = storage.bootstrap(root)
    assert [line for line in again.repaired if line.startswith("home/")] == []


def test_links_are_not_followed_and_narrower_modes_are_kept(
    old_home: tuple[Path, Path], traversable_tmp: Path
) -> None:
    root, home = old_home
    outside = traversable_tmp / "outside"
    outside.mkdir(mode=0o755)
    (outside / "events.jsonl").write_text("not a session's\n")
    os.chmod(outside / "events.jsonl", 0o644)
    sessions = home / "agent/alice/session"
    (sessions / "linked").symlink_to(outside)
    (sessions / "s2").mkdir()
    (sessions / "s2").chmod(0o500)
    (sessions / "s2/events.jsonl").symlink_to(outside / "events.jsonl")

    report = storage.bootstrap(root)

    assert report.problems == []
    assert mode(outside) == 0o755 and mode(outside / "events.jsonl") == 0o644
    assert mode(sessions / "s2") == 0o500
    assert not [line for line in report.repaired if "linked" in line or "/s2" in line]
    assert mode(sessions / "s1/events.jsonl") == 0o600


def test_session_repair_tightens_the_session_it_repairs(
    old_home: tuple[Path, Path], unprivileged_user: UnprivilegedUser
) -> None:
    root, home = old_home
    session = home / LEVELS[-1]
    repair = ["session", "repair", "alice", "--session", "s1"]
    uid = ["--uid", str(unprivileged_user.uid), "--json"]

    done = ctx(root, *repair, *uid)

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["tightened"] == [
        f"{session} (mode 0750 -> 0700)",
        f"{session}/events.jsonl (mode 0640 -> 0600)",
    ]
    assert (mode(session), mode(session / "events.jsonl")) == (0o700, 0o600)


def others_file(traversable_tmp: Path, user: UnprivilegedUser) -> tuple[Path, int]:
    """A file of a third uid (no account needed) that the test user's group may read and
    write, outside every home: what a hard link planted in a home may name; and that uid."""
    third = user.uid + 2000
    victim = traversable_tmp / "victim"
    victim.mkdir(mode=0o755)
    notes = victim / "notes.txt"
    notes.write_text("notes of another uid\n")
    os.chown(notes, third, user.gid)
    notes.chmod(0o664)
    return notes, third


def test_bootstrap_leaves_a_hard_link_to_another_uids_file_and_another_uids_entry(
    old_home: tuple[Path, Path], traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    root, home = old_home
    notes, third = others_file(traversable_tmp, unprivileged_user)
    sessions = home / "agent/alice/session"
    (sessions / "s9").mkdir(mode=0o700)
    os.chown(sessions / "s9", unprivileged_user.uid, unprivileged_user.gid)
    # The agent itself plants the link (fs.protected_hardlinks allows it: its group may read
    # and write the file).
    linked = run_as(unprivileged_user, ["ln", str(notes), str(sessions / "s9/events.jsonl")])
    assert linked.returncode == 0, linked.stderr
    # A second name for a file of the agent's own, and a session directory of the third uid.
    own = home / "own-notes"
    own.write_text("the agent's\n")
    os.chown(own, unprivileged_user.uid, unprivileged_user.gid)
    own.chmod(0o644)
    (sessions / "s7").mkdir()
    os.link(own, sessions / "s7/events.jsonl")
    (sessions / "s8").mkdir(mode=0o750)
    os.chown(sessions / "s8", third, unprivileged_user.gid)
    (sessions / "s8").chmod(0o750)

    done = ctx(root, "bootstrap")

    assert done.returncode == 0, done.stdout + done.stderr
    assert (mode(notes), mode(own), mode(sessions / "s8")) == (0o664, 0o644, 0o750)
    assert access_as(unprivileged_user, [(str(notes), "rw")]) == [True]
    shown = f"home/{unprivileged_user.uid}/agent/alice/session"
    warnings = [line for line in done.stdout.splitlines() if line.startswith("warning")]
    assert (
        f"warning   {shown}/s9/events.jsonl has mode 0664 but is left as it is, not made "
        f"0600: it belongs to uid {third}, not to uid {unprivileged_user.uid} whose home it "
        "is in, and is a file with 2 names (hard links), another of which may be another "
        "uid's file; only the home owner's own sessions are tightened" in done.stdout
    )
    assert any(
        line.startswith(f"warning   {shown}/s7/events.jsonl has mode 0644 but is left")
        and "it is a file with 2 names" in line
        for line in warnings
    )
    assert any(
        line.startswith(f"warning   {shown}/s8 has mode 0750 but is left")
        and f"it belongs to uid {third}" in line
        and "what another uid put there is that uid's to change" in line
        and "under every name" not in line  # a directory has one name
        for line in warnings
    )
    for name in ("s7", "s8", "s9"):
        assert f"repaired  {shown}/{name}" not in done.stdout
    assert mode(sessions / "s1/events.jsonl") == 0o600  # the agent's own session is tightened


def test_session_repair_leaves_a_hard_link_to_another_uids_file(
    old_home: tuple[Path, Path], traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    root, home = old_home
    notes, third = others_file(traversable_tmp, unprivileged_user)
    events = home / LEVELS[-1] / "events.jsonl"
    events.unlink()
    linked = run_as(unprivileged_user, ["ln", str(notes), str(events)])
    assert linked.returncode == 0, linked.stderr
    repair = ["session", "repair", "alice", "--session", "s1"]

    done = ctx(root, *repair, "--uid", str(unprivileged_user.uid))

    assert mode(notes) == 0o664, done.stdout + done.stderr
    assert notes.read_text() == "notes of another uid\n"
    assert f"ctx: warning: {events} has mode 0664 but is left as it is" in done.stderr
    assert f"it belongs to uid {third}" in done.stderr
    assert f"tightened {home / LEVELS[-1]} (mode 0750 -> 0700)" in done.stdout
    assert mode(home / LEVELS[-1]) == 0o700


def test_session_repair_names_in_json_what_it_left(
    old_home: tuple[Path, Path], unprivileged_user: UnprivilegedUser
) -> None:
    root, home = old_home
    events = home / LEVELS[-1] / "events.jsonl"
    os.chown(events, unprivileged_user.uid + 2000, unprivileged_user.gid)
    repair = ["session", "repair", "alice", "--session", "s1"]

    done = ctx(root, *repair, "--uid", str(unprivileged_user.uid), "--json")

    assert done.returncode == 0, done.stderr
    left = json.loads(done.stdout)["left"]
    assert len(left) == 1 and left[0].startswith(f"{events} has mode 0640 but is left as it is")
    assert mode(events) == 0o640


def test_bootstrap_holds_one_descriptor_per_level_however_many_sessions(
    old_home: tuple[Path, Path], unprivileged_user: UnprivilegedUser
) -> None:
    root, home = old_home
    sessions = home / "agent/alice/session"
    made = run_as(
        unprivileged_user,
        ["sh", "-c", "umask 027; for i in $(seq 1 400); do mkdir n$i; done"],
        cwd=sessions,
    )
    assert made.returncode == 0, made.stderr

    # Fewer descriptors than the sessions of one level: a walk that held them all fails.
    done = subprocess.run(
        [*CTX, "--storage", str(root), "bootstrap"],
        capture_output=True,
        text=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128)),
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert "problem" not in done.stdout
    assert mode(sessions / "n400") == 0o700
    assert done.stdout.count("repaired  ") >= 400


def test_bootstrap_tightens_only_the_levels_of_a_session(
    old_home: tuple[Path, Path], unprivileged_user: UnprivilegedUser
) -> None:
    root, home = old_home
    made = run_as(
        unprivileged_user,
        ["sh", "-c", "umask 022; mkdir -p pub/x/y && echo hi > pub/x/events.jsonl"],
        cwd=home / "agent/alice",
    )
    assert made.returncode == 0, made.stderr

    report = storage.bootstrap(root)

    assert report.problems == []
    pub = home / "agent/alice/pub"
    assert (mode(pub), mode(pub / "x"), mode(pub / "x/y")) == (0o755, 0o755, 0o755)
    assert mode(pub / "x/events.jsonl") == 0o644
    assert not [line for line in report.repaired if "/pub" in line]
    assert mode(home / LEVELS[-1] / "events.jsonl") == 0o600


def test_session_repair_in_an_immutable_directory_names_the_attribute_and_changes_nothing(
    old_home: tuple[Path, Path], unprivileged_user: UnprivilegedUser
) -> None:
    """chattr +i refuses the chmod to root too, which the kernel says only as 'Operation not
    permitted': the refusal names the directory, the attribute and the chattr that lifts it."""
    root, home = old_home
    session = home / LEVELS[-1]
    repair = ["session", "repair", "alice", "--session", "s1", "--json"]

    with attribute(session, "i"):
        done = ctx(root, *repair, "--uid", str(unprivileged_user.uid))
        modes = (mode(session), mode(session / "events.jsonl"))

    assert done.returncode == 1, done
    refusal = json.loads(done.stdout)
    assert refusal["error"] == "EPERM", done
    assert refusal["message"] == (
        f"cannot make {session} 0700 (mode 0750): it is immutable (attribute 'i', which "
        "'lsattr -d' shows), which refuses a change of its mode, by root too; have root "
        f"remove it with 'chattr -i {session}', then run the command again"
    )
    assert modes == (0o750, 0o640)


def test_bootstrap_names_the_attribute_of_an_immutable_home_session(
    old_home: tuple[Path, Path], unprivileged_user: UnprivilegedUser
) -> None:
    root, home = old_home
    session = home / LEVELS[-1]

    with attribute(session, "i"):
        report = storage.bootstrap(root)

    shown = f"home/{unprivileged_user.uid}"
    assert [problem for problem in report.problems if problem.startswith(shown)] == [
        f"{shown}: EPERM: cannot make {shown}/{LEVELS[-1]} 0700 (mode 0750): it is immutable "
        "(attribute 'i', which 'lsattr -d' shows), which refuses a change of its mode, by "
        f"root too; have root remove it with 'chattr -i {os.path.realpath(session)}', then "
        "run the command again; left as it was"
    ]


def test_session_repair_refused_by_an_immutable_events_file_says_it_tightened_the_directory(
    old_home: tuple[Path, Path], unprivileged_user: UnprivilegedUser
) -> None:
    root, home = old_home
    session = home / LEVELS[-1]
    events = session / "events.jsonl"
    repair = ["session", "repair", "alice", "--session", "s1"]

    with attribute(events, "i"):
        done = ctx(root, *repair, "--uid", str(unprivileged_user.uid))

    assert done.returncode == 1, done
    assert done.stdout == f"tightened {session} (mode 0750 -> 0700)\n"
    assert done.stderr == (
        f"ctx: EPERM: cannot make {events} 0600 (mode 0640): it is immutable (attribute 'i', "
        "which 'lsattr' shows), which refuses a change of its mode, by root too; have root "
        f"remove it with 'chattr -i {events}', then run the command again (before that, it "
        f"tightened {session} (mode 0750 -> 0700))\n"
    )
    assert (mode(session), mode(events)) == (0o700, 0o640)


def test_session_repair_by_the_agent_refused_its_events_file_says_it_tightened_the_directory(
    old_home: tuple[Path, Path], unprivileged_user: UnprivilegedUser
) -> None:
    """An events.jsonl left root's (0640) may not even be opened by the agent's uid, whose
    session directory the repair has already made 0700."""
    root, home = old_home
    session = home / LEVELS[-1]
    events = session / "events.jsonl"
    os.chown(events, 0, 0)
    repair = ["session", "repair", "alice", "--session", "s1", "--json"]

    done = run_as(unprivileged_user, [*CTX, "--storage", str(root), *repair])

    assert done.returncode == 1, done
    refusal = json.loads(done.stdout)
    assert (refusal["error"], refusal["message"]) == (
        "EACCES",
        f"Permission denied: {events} (before that, it tightened {session} (mode 0750 -> 0700))",
    )
    assert (mode(session), mode(events)) == (0o700, 0o640)


def test_session_repair_to_a_full_standard_output_still_cuts_and_says_what_it_did(
    old_home: tuple[Path, Path], unprivileged_user: UnprivilegedUser
) -> None:
    """The 'tightened' lines refused by standard output (> /dev/full) do not stop the repair:
    the torn line is cut, and the command ends as an output failure (exit 74), saying all it
    changed, not as a refusal of the repair."""
    root, home = old_home
    session = home / LEVELS[-1]
    events = session / "events.jsonl"
    whole = events.read_bytes()
    torn = b'{"ts":"2026-06-22T12:00:01Z","type":"tool_ca'
    events.write_bytes(whole + torn)
    repair = ["session", "repair", "alice", "--session", "s1"]

    with open("/dev/full", "wb") as full:
        done = subprocess.run(
            [*CTX, "--storage", str(root), *repair, "--uid", str(unprivileged_user.uid)],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
        )

    assert done.returncode == 74, done.stderr
    assert done.stderr == (
        f"ctx: ENOSPC: cannot write standard output (No space left on device); {session} was "
        f"made readable by the agent alone; a torn last line of {len(torn)} bytes was "
        f"truncated from {events}\n"
    )
    assert events.read_bytes() == whole
    assert (mode(session), mode(events)) == (0o700, 0o600)


def test_session_repair_whose_reader_left_still_cuts_the_torn_line(
    old_home: tuple[Path, Path], unprivileged_user: UnprivilegedUser
) -> None:
    """A reader that left before the 'tightened' lines (a closed pipe) ends the command as
    every command whose reader left (141, quietly), once the repair is made."""
    root, home = old_home
    session = home / LEVELS[-1]
    events = session / "events.jsonl"
    whole = events.read_bytes()
    events.write_bytes(whole + b'{"ts":"2026')
    repair = ["session", "repair", "alice", "--session", "s1"]
    read_end, write_end = os.pipe()
    os.close(read_end)

    try:
        done = subprocess.run(
            [*CTX, "--storage", str(root), *repair, "--uid", str(unprivileged_user.uid)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(write_end)

    assert (done.returncode, done.stderr) == (141, "")
    assert events.read_bytes() == whole
    assert (mode(session), mode(events)) == (0o700, 0o600)
