"""``ctx policy`` through real processes: outputs and exit statuses to the letter (SPEC P-8)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.storage import add_tool, write
from tests.support.users import UnprivilegedUser

CTX = str(Path(sys.executable).with_name("ctx"))
CODER = "allow coder_t tool:fs.read execute\nallow coder_t network:default connect\n"
FS_READ = "# fs.read serves coder only\nallow coder_t tool:fs.read execute\n"


def ctx(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [CTX, "policy", *args], input=stdin, capture_output=True, text=True, check=False
    )


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    write(tmp_path / "coder.policy", CODER)
    write(tmp_path / "fs.read.policy", FS_READ)
    return tmp_path


def test_check_accepts_valid_files_silently(policies: Path) -> None:
    done = ctx("check", str(policies / "coder.policy"), str(policies / "fs.read.policy"))
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_check_reports_every_bad_line_of_every_file(policies: Path) -> None:
    bad = write(
        policies / "bad.policy",
        "allow coder_t tool:fs.read execute\n"
        "allow coder_t agent:* create\n"
        "# fine\n"
        "deny coder_t tool:fs.write execute\n"
        "allow coder_t tool:fs.read read\n",
    )
    worse = write(policies / "worse.policy", "allow coder.d tool:fs.read execute\n")
    done = ctx("check", str(bad), str(policies / "coder.policy"), str(worse))
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"{bad}:2: EINVAL: agent:*: globs are not supported (P-2); name each object",
        f"{bad}:4: EINVAL: there is no 'deny' (P-2): policy v0 denies whatever no rule allows",
        f"{bad}:5: EINVAL: 'read' is a permission of shared, session, mount, agent, not of "
        "tool; tool has execute",
        f"{worse}:1: EINVAL: illegal subject type: 'coder.d' ends in '.d', which is reserved "
        "for control directories",
    ]


def test_check_reads_standard_input() -> None:
    assert ctx("check", "-", stdin=CODER).returncode == 0
    done = ctx("check", "-", stdin="allow coder_t tool:* execute\n")
    assert (done.returncode, done.stderr.split(":", 2)[:2]) == (1, ["-", "1"])


def test_check_of_a_closed_standard_input_is_no_empty_policy() -> None:
    """`ctx policy check - <&-`: closed, standard input reads as empty, a valid policy that
    denies everything; judging it would say valid of a policy nobody gave."""
    done = subprocess.run(
        [CTX, "policy", "check", "-", "--json"],
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.close(0),
    )
    assert done.returncode == 1
    assert done.stderr == (
        "-: EBADF: standard input is closed: there is no policy to read; give a FILE, or pipe "
        "the policy in; nothing was done\n"
    )
    assert json.loads(done.stdout)["valid"] is False


def test_check_fails_on_an_unreadable_file(tmp_path: Path) -> None:
    done = ctx("check", str(tmp_path / "missing"))
    assert done.returncode == 1
    assert "ENOENT" in done.stderr


MAX_POLICY_BYTES = 16 * 1024 * 1024


def _in_1_gib() -> None:
    """Run with 1 GiB of address space: an input read whole would end in MemoryError."""
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


@pytest.mark.parametrize("name", ["/dev/zero", "-"])
def test_a_policy_that_never_ends_is_refused(name: str) -> None:
    """/dev/zero on stdin: invalid once past 16 MiB, no more than a byte past the limit read,
    where reading it whole would exhaust memory; as FILE: invalid, not a regular file (check:
    exit 1; query: exit 2, P-8)."""
    said = f"{name} holds more than {MAX_POLICY_BYTES} bytes, more than a policy may"
    if name != "-":
        said = f"{name} is not a regular file (a FIFO, device or directory); give a policy "
        said += "file, or '-' to read one from a pipe"
    query = ["query", "--policy", name, "coder_t", "tool:fs.read", "execute"]
    with open("/dev/zero", "rb") as zeros:
        check, asked = (
            subprocess.run(
                [CTX, "policy", *args],
                stdin=zeros if name == "-" else subprocess.DEVNULL,
                capture_output=True,
                text=True,
                preexec_fn=_in_1_gib,
                timeout=60,
            )
            for args in (["check", name], query)
        )

    assert (check.returncode, check.stderr) == (1, f"{name}: EINVAL: {said}\n")
    assert (asked.returncode, asked.stdout, asked.stderr) == (2, "", f"ctx: EINVAL: {said}\n")


def test_a_fifo_given_as_a_policy_file_is_refused_at_once(tmp_path: Path) -> None:
    """A FIFO is not waited on (no writer may ever come): not a regular file, EINVAL (check:
    exit 1; query: exit 2, P-8); a pipe is given as '-'."""
    fifo = tmp_path / "policy.fifo"
    os.mkfifo(fifo)
    said = f"{fifo} is not a regular file (a FIFO, device or directory); give a policy file, "
    said += "or '-' to read one from a pipe"

    check = subprocess.run(
        [CTX, "policy", "check", str(fifo)], capture_output=True, text=True, timeout=10
    )
    query = ["query", "--policy", str(fifo), "coder_t", "tool:fs.read", "execute"]
    asked = subprocess.run([CTX, "policy", *query], capture_output=True, text=True, timeout=10)

    assert (check.returncode, check.stderr) == (1, f"{fifo}: EINVAL: {said}\n")
    assert (asked.returncode, asked.stderr) == (2, f"ctx: EINVAL: {said}\n")


def test_a_policy_of_16_mib_is_read_and_one_byte_more_is_refused(tmp_path: Path) -> None:
    at_limit = write(tmp_path / "at", "#" * (MAX_POLICY_BYTES - 1) + "\n")
    past = write(tmp_path / "past", "#" * MAX_POLICY_BYTES + "\n")

    assert ctx("check", str(at_limit)).returncode == 0
    refused = ctx("check", str(past))
    assert refused.returncode == 1 and f"more than {MAX_POLICY_BYTES} bytes" in refused.stderr


def test_query_prints_allow_or_deny(policies: Path) -> None:
    coder = str(policies / "coder.policy")
    allowed = ctx("query", "--policy", coder, "coder_t", "tool:fs.read", "execute")
    assert (allowed.returncode, allowed.stdout, allowed.stderr) == (0, "allow\n", "")
    denied = ctx("query", "--policy", coder, "coder_t", "tool:fs.write", "execute")
    assert (denied.returncode, denied.stdout, denied.stderr) == (1, "deny\n", "")
    other_subject = ctx("query", "--policy", coder, "reviewer_t", "tool:fs.read", "execute")
    assert (other_subject.returncode, other_subject.stdout) == (1, "deny\n")


def test_query_requires_every_policy_to_allow(policies: Path) -> None:
    layers = [
        "--policy",
        str(policies / "coder.policy"),
        "--policy",
        str(policies / "fs.read.policy"),
    ]
    assert ctx("query", *layers, "coder_t", "tool:fs.read", "execute").stdout == "allow\n"
    network = ctx("query", *layers, "coder_t", "network:default", "connect")
    assert (network.returncode, network.stdout) == (1, "deny\n")


@pytest.mark.parametrize(
    "query",
    [
        ["coder.d", "tool:fs.read", "execute"],
        ["coder_t", "file:README", "read"],
        ["coder_t", "tool:fs.read", "read"],
        ["coder_t", "tool:*", "execute"],
        ["coder_t", "fs.read", "execute"],
        ["coder_t", "network:internet", "connect"],
    ],
)
def test_a_malformed_query_exits_2_with_einval(policies: Path, query: list[str]) -> None:
    done = ctx("query", "--policy", str(policies / "coder.policy"), *query)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("ctx: EINVAL: ")


def test_a_malformed_policy_exits_2_with_every_bad_line(policies: Path) -> None:
    bad = write(policies / "bad.policy", "allow coder_t tool:* execute\nallow x.d tool:y execute\n")
    done = ctx("query", "--policy", str(bad), "coder_t", "tool:fs.read", "execute")
    assert (done.returncode, done.stdout) == (2, "")
    assert [line.split(": ")[:2] for line in done.stderr.splitlines()] == [
        [f"{bad}:1", "EINVAL"],
        [f"{bad}:2", "EINVAL"],
    ]


def test_query_needs_a_policy(policies: Path) -> None:
    assert ctx("query", "coder_t", "tool:fs.read", "execute").returncode == 2
    missing = ctx("query", "--policy", str(policies / "nope"), "coder_t", "tool:x", "execute")
    assert missing.returncode == 2
    assert "ENOENT" in missing.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to set owners and uids")
def test_explain_walks_the_six_steps(root: Path, coder: Path, user: UnprivilegedUser) -> None:
    add_tool(root, "fs.read", policy="# nobody yet\n")
    request = ["explain", "--storage", str(root), "coder", "tool:fs.read", "execute"]
    done = ctx(*request)
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "agent coder: tool:fs.read execute"
    assert [line.split()[:2] for line in lines[1:7]] == [
        ["1", "peer"],
        ["2", "mode"],
        ["3", "mount"],
        ["4", "agent"],
        ["5", "object"],
        ["6", "tool/model"],
    ]
    assert "deny EACCES" in lines[6]
    assert lines[7].startswith("deny: EACCES: step 6 (tool/model policy): tool/fs.read.d/policy")

    write(root / "tool" / "fs.read.d" / "policy", FS_READ)
    allowed = ctx(*request, "--json")
    assert allowed.returncode == 0, allowed.stderr
    verdict = json.loads(allowed.stdout)
    assert (verdict["allowed"], verdict["step"], verdict["errno"]) == (True, None, None)
    assert [step["result"] for step in verdict["steps"]] == ["pass"] * 6

    peer = ctx(*request, "--peer", f"{user.uid + 1}:{user.gid}", "--json")
    assert peer.returncode == 1
    assert json.loads(peer.stdout)["step_name"] == "peer credentials"


def test_explain_notes_a_tool_the_chain_allows_whose_status_refuses_calls(
    root: Path, coder: Path
) -> None:
    """The status control is no step of the chain, but a call meets it first: an allowed
    explanation of a disabled tool says so, and stays the chain's answer (exit 0)."""
    add_tool(root, "fs.read", policy=FS_READ)
    request = ["explain", "--storage", str(root), "coder", "tool:fs.read", "execute"]
    incomplete = ctx(*request)
    assert incomplete.returncode == 0, incomplete.stderr
    assert "a call is refused before the chain: tool fs.read in" in incomplete.stderr
    assert "is damaged: fs.read.d/name is missing" in incomplete.stderr
    controls = root / "tool" / "fs.read.d"
    for name, text in (("name", "fs.read\n"), ("description", "Reads.\n"), ("cap", "{}\n"),
                       ("schema", '{"type": "object"}\n'), ("status", "available\n"),
                       ("log", "")):  # fmt: skip
        write(controls / name, text)
    for hooks in ("hooks/pre.d", "hooks/post.d"):
        (controls / hooks).mkdir(parents=True)
    assert ctx(*request).stderr == ""
    write(controls / "status", "disabled\n")

    for options in ((), ("--json",)):
        noted = ctx(*request, *options)
        assert noted.returncode == 0, noted.stderr
        assert noted.stderr == (
            "ctx: note: the chain allows it, but a call is refused before the chain: tool "
            "fs.read is not available (status: disabled); it runs again once its status "
            "control fs.read.d/status reads 'available'\n"
        )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to set owners and uids")
def test_explain_judges_the_tool_the_agents_ctx_path_finds(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    """A tool of the agent's user tier is the one `ctx run` would call (T-4): the explanation
    judges it, not a missing tool/fs.read, unless --location asks about another tier."""
    home_tier = f"home/{user.uid}/tool"
    add_tool(root, "fs.read", policy=FS_READ, location=home_tier)
    request = ["explain", "--storage", str(root), "coder", "tool:fs.read", "execute"]

    found = ctx(*request, "--json")
    elsewhere = ctx(*request, "--location", "tool")

    assert found.returncode == 0, found.stdout
    steps = json.loads(found.stdout)["steps"]
    assert steps[1]["detail"].startswith(f"{home_tier}/fs.read: --x granted")
    assert steps[5]["detail"] == f"{home_tier}/fs.read.d/policy: allow coder_t tool:fs.read execute"
    assert elsewhere.returncode == 1
    assert "ENOENT: step 2 (mode bits): tool/fs.read does not exist" in elsewhere.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to set owners and uids")
def test_explain_takes_a_location_as_object_which_prints_it(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    """An absolute --location within the root (the directory of what ``object which``
    prints) is judged as the root's own path to it; one outside the root, or the root
    itself, is EINVAL, exit 2."""
    home_tier = f"home/{user.uid}/tool"
    add_tool(root, "fs.read", policy=FS_READ, location=home_tier)
    request = ["explain", "--storage", str(root), "coder", "tool:fs.read", "execute", "--json"]

    absolute = ctx(*request, "--location", str(root / home_tier))
    assert absolute.returncode == 0, absolute.stderr
    relative = ctx(*request, "--location", home_tier)
    assert json.loads(absolute.stdout) == json.loads(relative.stdout)
    for odd in (f"{root}/{home_tier}/", f"{root}/tool/../{home_tier}"):
        malformed = ctx(*request, "--location", odd)  # judged as its relative form would be
        assert malformed.returncode == 2, malformed
        assert f"{odd!r} is not a place where a tool lives" in malformed.stderr  # as given
    system = ctx(*request, "--location", str(root / "tool"))
    assert system.returncode == 1
    assert json.loads(system.stdout)["errno"] == "ENOENT"
    for outside in ("/etc", str(root), str(root.parent)):
        refused = ctx(*request, "--location", outside)
        assert refused.returncode == 2, refused
        assert f"names no directory within the storage root {str(root)!r}" in refused.stderr
    current = root.parent / "current"  # a link to the root, as storage/current is
    current.symlink_to(root)
    linked = ctx(*request, "--location", f"{current}/{home_tier}")
    assert linked.returncode == 0, linked.stderr
    assert json.loads(linked.stdout) == json.loads(relative.stdout)
    malformed = ctx(*request, "--location", f"{current}/{home_tier}/")
    assert f"'{current}/{home_tier}/' is not a place where a tool lives" in malformed.stderr
    refused = ctx(*request, "--location", str(current))
    assert refused.returncode == 2 and "names no directory within" in refused.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to set owners and uids")
def test_explain_a_malformed_request_exits_2(root: Path, coder: Path) -> None:
    for request in (
        ["coder", "tool:*", "execute"],
        ["coder", "session:review", "read"],
        ["coder", "tool:fs.read", "execute", "--peer", "me"],
        ["coder", "tool:fs.read", "execute", "--peer", "4294967295:1"],
        ["../coder", "tool:fs.read", "execute"],
    ):
        done = ctx("explain", "--storage", str(root), *request)
        assert done.returncode == 2, request
        assert "EINVAL" in done.stderr


def test_explain_without_a_storage_root_fails(tmp_path: Path) -> None:
    done = ctx(
        "explain", "--storage", str(tmp_path / "none"), "coder", "network:default", "connect"
    )
    assert done.returncode == 1
    assert "ENOENT" in done.stderr


@pytest.mark.parametrize(
    ("command", "mentions"),
    [
        ([], ["allow SUBJECT_t CLASS:NAME PERMISSION", "network: connect"]),
        (["check"], ["FILE:LINE: EINVAL: <reason>"]),
        (["query"], ["--policy", "'allow'", "'deny'"]),
        (["explain"], ["--location", "--peer", "tool/model policy", "--json"]),
    ],
)
def test_every_command_explains_itself(command: list[str], mentions: list[str]) -> None:
    done = ctx(*command, "--help")
    assert done.returncode == 0
    for words in mentions:
        assert words in done.stdout
