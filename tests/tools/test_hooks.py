"""Hooks: pre.d runs in name order and may veto; post.d sees the result (SPEC T-6)."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import pytest

from cortexfs.tools import hooks
from tests.support.cli import ctx
from tests.tools.support import World

TRACE = """#!/bin/sh
# Appends its name, its uid and its phase to a trace; exits with its configured status.
echo "$(basename "$0") $(id -u) $CTX_HOOK" >> {trace}
cat > {trace}.$(basename "$0").json
echo "hook $(basename "$0") says no" >&2
exit {status}
"""


@pytest.fixture
def hooked(world: World) -> World:
    world.install("echo", "#!/bin/sh\ncat\n")
    world.agent("coder", tools=["echo"])
    world.allow_tool("echo")
    trace = world.workspace / "trace"
    trace.touch()
    os.chown(trace, world.user.uid, world.user.gid)
    return world


def add_hook(world: World, phase: str, name: str, status: int = 0, mode: int = 0o755) -> None:
    path = world.root / "tool/echo.d/hooks" / f"{phase}.d" / name
    path.write_text(TRACE.format(trace=world.workspace / "trace", status=status))
    path.chmod(mode)


def trace(world: World) -> list[str]:
    return (world.workspace / "trace").read_text().splitlines()


def test_pre_hooks_run_in_name_order_as_the_agent_then_the_tool(hooked: World) -> None:
    """Every executable runs, a dot-named one too (T-6): a name nobody lists by default
    must not turn a guard off."""
    for name in ("20-second", "10-first", ".dotted"):
        add_hook(hooked, "pre", name)

    result = hooked.run("echo", {"x": 1})

    assert result.ok and result.output == {"x": 1}
    uid = hooked.user.uid
    assert trace(hooked) == [f".dotted {uid} pre", f"10-first {uid} pre", f"20-second {uid} pre"]
    seen = json.loads((hooked.workspace / "trace.10-first.json").read_text())
    assert (seen["hook"], seen["tool"], seen["input"]) == ("pre", "echo", {"x": 1})


def test_a_dot_named_pre_hook_vetoes_as_any_other(hooked: World) -> None:
    add_hook(hooked, "pre", ".veto", status=1)

    result = hooked.run("echo", {"x": 1})

    assert (result.error.errno, result.error.stage) == (errno.EACCES, "hook"), result
    assert "hooks/pre.d/.veto vetoed the call (exit 1)" in str(result.error)


def test_an_editors_dot_named_lock_link_is_no_hook(hooked: World) -> None:
    """What Emacs leaves beside a hook it edits: a dangling link ``.#NAME``.  Any other link
    in pre.d is a failed hook and vetoes; this one is skipped."""
    add_hook(hooked, "pre", "10-guard")
    pre = hooked.root / "tool/echo.d/hooks/pre.d"
    os.symlink("root@host.1234:1700000000", pre / ".#10-guard")
    os.symlink("10-guard", pre / "20-link")

    vetoed = hooked.run("echo", {"x": 1})
    (pre / "20-link").unlink()
    passed = hooked.run("echo", {"x": 1})

    assert (vetoed.error.errno, vetoed.error.stage) == (errno.EACCES, "hook"), vetoed
    assert "hooks/pre.d/20-link" in str(vetoed.error)
    assert passed.ok, passed


def test_a_failing_pre_hook_vetoes_the_call_and_stops_the_others(hooked: World) -> None:
    add_hook(hooked, "pre", "10-guard", status=3)
    add_hook(hooked, "pre", "20-never")
    add_hook(hooked, "post", "10-never-either")

    result = hooked.run("echo", {"x": 1})

    assert result.status == "error" and result.exit_status is None
    assert (result.error.errno, result.error.stage) == (errno.EACCES, "hook")
    assert "hooks/pre.d/10-guard vetoed the call (exit 3): hook 10-guard says no" in str(
        result.error
    )
    assert trace(hooked) == [f"10-guard {hooked.user.uid} pre"]
    assert hooked.events()[-1]["stage"] == "hook"


def test_non_executables_and_directories_in_the_hook_directories_are_skipped(
    hooked: World,
) -> None:
    """T-6: only executables run; a README or a subdirectory neither runs nor vetoes."""
    for phase in ("pre", "post"):
        hooks = hooked.root / "tool/echo.d/hooks" / f"{phase}.d"
        (hooks / "README").write_text("10-* run first\n")
        (hooks / "README").chmod(0o644)
        (hooks / "05-old").mkdir()
        add_hook(hooked, phase, "20-real")

    completed = ctx(hooked.root, "run", "--agent", "coder", "--native", "echo", stdin='{"a": 1}')

    result = json.loads(completed.stdout.splitlines()[-1])
    assert completed.returncode == 0, completed.stdout
    assert result["status"] == "ok" and result["post_hooks"] == []
    uid = hooked.user.uid
    assert trace(hooked) == [f"20-real {uid} pre", f"20-real {uid} post"]


def test_a_pre_hook_that_looks_like_one_but_cannot_run_vetoes(hooked: World) -> None:
    hooks = hooked.root / "tool/echo.d/hooks/pre.d"
    add_hook(hooked, "pre", "10-roots-only", mode=0o700)  # execute bits, not the agent's
    refused_by_mode = hooked.run("echo", {})
    (hooks / "10-roots-only").unlink()
    outside = hooked.scratch / "outside-hook"
    outside.write_text("#!/bin/sh\nexit 0\n")
    outside.chmod(0o755)
    (hooks / "10-link").symlink_to(outside)
    refused_as_link = hooked.run("echo", {})

    assert refused_by_mode.error.stage == "hook"
    assert "10-roots-only vetoed the call" in refused_by_mode.error.message
    assert refused_as_link.error.stage == "hook"
    assert "10-link vetoed the call (exit 126): is a symbolic link" in refused_as_link.error.message


def test_a_pre_hook_whose_interpreter_is_missing_vetoes_naming_the_interpreter(
    hooked: World,
) -> None:
    """T-6: the veto says what cannot run, the interpreter on the hook's #! line, not only
    the errno's words, which would read as the hook itself missing."""
    hook = hooked.root / "tool/echo.d/hooks/pre.d/10-gone-interpreter"
    hook.write_text("#!/nonexistent/interpreter\nexit 0\n")
    hook.chmod(0o755)

    refused = hooked.run("echo", {})

    assert refused.error.stage == "hook"
    assert "10-gone-interpreter vetoed the call (exit 126): cannot be run: its interpreter " in (
        refused.error.message
    )
    assert "/nonexistent/interpreter, named on its #! line, is not there" in refused.error.message


@pytest.mark.parametrize(
    "program",
    [b"\x00\x01guard\nexit 0\n", Path("/bin/true").read_bytes()[:200]],
    ids=["no-format", "elf-cut-short"],
)
def test_a_pre_hook_the_kernel_will_not_start_vetoes(hooked: World, program: bytes) -> None:
    """T-6: a guard in no format the kernel starts cannot run, and must not let the call
    through as the shell script setpriv's execvp would make of it."""
    hook = hooked.root / "tool/echo.d/hooks/pre.d/10-guard"
    hook.write_bytes(program)
    hook.chmod(0o755)

    refused = hooked.run("echo", {"x": 1})

    assert not refused.ok and refused.error.stage == "hook", refused
    assert "10-guard vetoed the call (exit 126): cannot be run" in refused.error.message


def test_a_missing_working_directory_is_named_before_any_hook_is_blamed(hooked: World) -> None:
    """The hooks start where the tool does: with the agent's working directory gone, the
    call names that directory (ENOENT, stage run), not an intact guard that could not
    start there."""
    add_hook(hooked, "pre", "10-guard")
    workspace = hooked.workspace
    workspace.rename(workspace.with_name("moved"))

    refused = hooked.run("echo", {"x": 1})

    assert (refused.error.errno, refused.error.stage) == (errno.ENOENT, "run"), refused
    assert f"working directory {workspace} does not exist" in refused.error.message


def test_a_pre_hook_in_a_directory_the_agent_may_not_search_vetoes(hooked: World) -> None:
    """The agent's search of the directories on the way counts as the kernel counts it: a
    program (no script, whose shell would fail to read it) behind a directory only root may
    enter is not run as the agent."""
    hooks = hooked.root / "tool/echo.d/hooks/pre.d"
    guard = hooks / "10-true"
    guard.write_bytes(Path("/bin/true").read_bytes())
    guard.chmod(0o755)
    hooks.chmod(0o700)

    refused = hooked.run("echo", {"x": 1})

    assert not refused.ok and refused.error.errno == errno.EACCES, refused
    assert "10-true vetoed the call (exit 126): may not be executed by the agent" in (
        refused.error.message
    )
    assert "search (x) on" in refused.error.message
    hooks.chmod(0o755)
    assert hooked.run("echo", {"x": 1}).ok


def test_a_linked_hook_directory_makes_the_tool_damaged_and_is_never_followed(
    hooked: World,
) -> None:
    elsewhere = hooked.scratch / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "10-permissive").write_text("#!/bin/sh\nexit 0\n")
    (elsewhere / "10-permissive").chmod(0o755)
    pre = hooked.root / "tool/echo.d/hooks/pre.d"
    pre.rmdir()
    pre.symlink_to(elsewhere)

    result = hooked.run("echo", {})

    assert (result.error.errno, result.error.stage) == (errno.ENOEXEC, "resolve")
    assert "hooks/pre.d/ is not a directory (a symbolic link; links are not followed)" in (
        result.error.message
    )


def test_post_hooks_see_the_result_and_cannot_change_it(hooked: World) -> None:
    add_hook(hooked, "post", "10-audit")
    add_hook(hooked, "post", "20-grumpy", status=1)

    result = hooked.run("echo", {"y": 2})

    assert result.ok and result.output == {"y": 2}
    seen = json.loads((hooked.workspace / "trace.10-audit.json").read_text())
    assert seen["hook"] == "post" and seen["result"]["output"] == {"y": 2}
    assert result.post_hooks == [
        {"hook": "hooks/post.d/20-grumpy", "exit_status": 1, "message": "hook 20-grumpy says no"}
    ]
    assert hooked.events()[-1]["post_hooks"][0]["hook"] == "hooks/post.d/20-grumpy"


def test_a_post_hooks_message_is_recorded_as_a_tools_would_be(hooked: World) -> None:
    """The last line of a hook's stderr is cut to a sentence's length, and is summarized in
    the records as the tool's own words are (S-4): a token in it is not logged."""
    token = "ghp_" + "a1B2" * 9
    hook = hooked.root / "tool/echo.d/hooks/post.d/10-leaky"
    hook.write_text(f"#!/bin/sh\necho 'login failed with {token}' >&2\nexit 3\n")
    hook.chmod(0o755)
    long_hook = hooked.root / "tool/echo.d/hooks/post.d/20-long"
    long_hook.write_text("#!/bin/sh\nhead -c 200000 /dev/zero | tr '\\0' d >&2\nexit 4\n")
    long_hook.chmod(0o755)

    result = hooked.run("echo", {"y": 2})

    assert result.ok, result
    leaky, long = result.post_hooks
    assert token in leaky["message"]  # the caller is told what its hook said
    assert len(long["message"]) == hooks.MAX_HOOK_MESSAGE and long["message"].endswith("…")
    for records in (hooked.events()[-1], hooked.tool_log("echo")[-1]):
        logged = json.dumps(records["post_hooks"])
        assert token not in logged, logged
        assert [h["exit_status"] for h in records["post_hooks"]] == [3, 4]


def test_pre_hooks_and_the_tool_share_the_calls_timeout(hooked: World) -> None:
    """W-4: a call that exceeds its timeout fails, however its time went: a pre-hook that
    outlives it is killed and vetoes the call, where its own ten-second bound would have let
    it run on."""
    slow = hooked.root / "tool/echo.d/hooks/pre.d/10-slow"
    slow.write_text("#!/bin/sh\nsleep 30\n")
    slow.chmod(0o755)

    began = time.monotonic()
    result = hooked.run("echo", {"x": 1}, timeout=1)

    assert time.monotonic() - began < 5
    assert not result.ok and result.error is not None
    assert "hooks/pre.d/10-slow vetoed the call" in result.error.message
    assert "ran past the call's timeout" in result.error.message


def test_what_pre_hooks_leave_of_the_timeout_is_the_tools(hooked: World) -> None:
    pause = hooked.root / "tool/echo.d/hooks/pre.d/10-pause"
    pause.write_text("#!/bin/sh\nsleep 1\n")
    pause.chmod(0o755)
    (hooked.root / "tool/echo").write_text("#!/bin/sh\nsleep 1\ncat\n")  # alone, in time

    result = hooked.run("echo", {"x": 1}, timeout=1.6)

    assert not result.ok and result.error is not None
    assert "timed out after 1.6s" in result.error.message
