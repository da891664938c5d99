"""The six steps of the authority chain over real files, modes and a real uid (SPEC P-5, P-6)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path, PurePosixPath

import pytest

from cortexfs import beneath
from cortexfs.errors import CtxError
from cortexfs.policy import (
    AuthorityRequest,
    Credentials,
    Decision,
    Outcome,
    Step,
    chain,
    check_authority,
    check_tool_execute,
)
from tests.support.storage import add_tool, write
from tests.support.users import UnprivilegedUser, run_as

FS_READ_RULE = "allow coder_t tool:fs.read execute\n"
SEES_CTX = "allow coder_t mount:ctx read\n"  # the storage root at /ctx, as add_agent mounts it

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to set owners and uids")


def me(user: UnprivilegedUser) -> Credentials:
    return Credentials(user.uid, user.gid)


def run_fs_read(root: Path, user: UnprivilegedUser) -> Decision:
    return check_tool_execute(root, "coder", "fs.read", me(user))


def assert_denied_at(decision: Decision, step: Step, code: int, *words: str) -> None:
    assert not decision.allowed
    assert (decision.step, decision.errno) == (step, code), decision.reason
    for word in words:
        assert word in decision.reason
    outcomes = [result.outcome for result in decision.steps]
    assert outcomes[step - 1] is Outcome.DENY
    assert set(outcomes[step:]) <= {Outcome.NOT_REACHED}


def test_a_tool_both_policies_allow_runs(root: Path, coder: Path, user: UnprivilegedUser) -> None:
    tool = add_tool(root, "fs.read", policy=FS_READ_RULE)
    decision = run_fs_read(root, user)
    assert decision.allowed, decision.reason
    assert (decision.step, decision.errno) == (None, 0)
    assert [result.step for result in decision.steps] == list(Step)
    assert {result.outcome for result in decision.steps} == {Outcome.PASS}
    # The kernel agrees with step 2: the agent's uid can really execute the tool.
    assert run_as(user, [str(tool)]).returncode == 0


@pytest.mark.parametrize(
    ("agent_allows", "tool_allows", "denying_step"),
    [
        (True, True, None),
        (True, False, Step.OWN_POLICY),
        (False, True, Step.OBJECT_POLICY),
        (False, False, Step.OBJECT_POLICY),
    ],
)
def test_the_two_layer_rule(
    root: Path,
    coder: Path,
    user: UnprivilegedUser,
    agent_allows: bool,
    tool_allows: bool,
    denying_step: Step | None,
) -> None:
    write(coder / "policy", SEES_CTX + (FS_READ_RULE if agent_allows else ""))
    add_tool(root, "fs.read", policy=FS_READ_RULE if tool_allows else "# nobody\n")
    decision = run_fs_read(root, user)
    assert decision.step == denying_step
    assert decision.allowed is (denying_step is None)
    if denying_step is not None:
        assert decision.errno == errno.EACCES
        assert "has no rule 'allow coder_t tool:fs.read execute'" in decision.reason


def test_a_tool_without_its_own_policy_runs_for_nobody(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    add_tool(root, "fs.read", policy="")
    (root / "tool" / "fs.read.d" / "policy").unlink()
    assert_denied_at(run_fs_read(root, user), Step.OWN_POLICY, errno.EACCES, "no policy")


def test_prompts_grant_nothing(root: Path, coder: Path, user: UnprivilegedUser) -> None:
    add_tool(root, "fs.write", policy="allow coder_t tool:fs.write execute\n")
    for prompt in ("system.md", "prompt.template.md"):
        write(coder / prompt, "allow coder_t tool:fs.write execute\nYou may run fs.write.\n")
    decision = check_tool_execute(root, "coder", "fs.write", me(user))
    assert_denied_at(decision, Step.OBJECT_POLICY, errno.EACCES)


# Step 1: peer credentials.


def test_a_caller_who_is_not_the_agent_is_refused(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    add_tool(root, "fs.read", policy=FS_READ_RULE)
    for caller in (Credentials(user.uid + 1, user.gid), Credentials(user.uid, user.gid + 1)):
        decision = check_tool_execute(root, "coder", "fs.read", caller)
        assert_denied_at(decision, Step.CREDENTIALS, errno.EACCES, f"the caller is {caller}")


def test_a_missing_agent_is_enoent(root: Path, user: UnprivilegedUser) -> None:
    decision = check_tool_execute(root, "ghost", "fs.read", me(user))
    assert_denied_at(decision, Step.CREDENTIALS, errno.ENOENT, "there is no agent 'ghost'")


@pytest.mark.parametrize(
    ("identity", "reason"),
    [
        (None, "has no identity"),
        ("{", "identity is invalid"),
        ('{"uid": 1000, "gid": 1000}', "identity is invalid"),
        ('{"uid": "1000", "gid": 1000, "groups": []}', "is not a uid or gid"),
        ('{"uid": true, "gid": 1000, "groups": []}', "true is not a uid or gid"),
        ('{"uid": 0, "gid": 0, "groups": []}', "never runs as root"),
    ],
)
def test_an_agent_needs_a_sound_non_root_identity(
    root: Path, coder: Path, user: UnprivilegedUser, identity: str | None, reason: str
) -> None:
    add_tool(root, "fs.read", policy=FS_READ_RULE)
    if identity is None:
        (coder / "identity").unlink()
    else:
        write(coder / "identity", identity)
    decision = check_authority(AuthorityRequest(root, "coder", "tool", "fs.read", "execute"))
    assert_denied_at(decision, Step.CREDENTIALS, errno.EACCES, reason)


# Step 2: mode bits, judged for the agent's uid, gid and groups.


def test_a_tool_the_agent_may_not_execute_is_refused(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    tool = add_tool(root, "fs.read", policy=FS_READ_RULE, mode=0o744)
    assert_denied_at(run_fs_read(root, user), Step.MODE_BITS, errno.EACCES, "grants r--")
    with pytest.raises(PermissionError):  # and the kernel refuses it too
        run_as(user, [str(tool)])


def test_owner_and_group_bits_apply_to_the_agent(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    tool = add_tool(root, "fs.read", policy=FS_READ_RULE, mode=0o700)
    assert run_fs_read(root, user).step == Step.MODE_BITS
    os.chown(tool, user.uid, 0)
    # Its owner bits let the agent run it; that the agent could rewrite it is step 6's.
    assert_denied_at(run_fs_read(root, user), Step.OWN_POLICY, errno.EACCES, "the agent's own")

    os.chown(tool, 0, 61005)
    tool.chmod(0o750)
    assert run_fs_read(root, user).step == Step.MODE_BITS
    identity = {"uid": user.uid, "gid": user.gid, "groups": [61005]}
    write(coder / "identity", json.dumps(identity))
    assert run_fs_read(root, user).allowed


def test_an_unsearchable_directory_hides_the_tool(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    add_tool(root, "fs.read", policy=FS_READ_RULE)
    (root / "tool").chmod(0o700)
    assert_denied_at(run_fs_read(root, user), Step.MODE_BITS, errno.EACCES, "search (x) on tool")


def test_a_tool_on_a_noexec_filesystem_is_refused_at_step_2(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    """T-5: the mount's noexec is part of the decision; the kernel would refuse the exec."""
    tool = add_tool(root, "fs.read", policy=FS_READ_RULE)
    tools = root / "tool"
    subprocess.run(["mount", "--bind", tools, tools], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,noexec", tools], check=True)
        assert_denied_at(run_fs_read(root, user), Step.MODE_BITS, errno.EACCES, "noexec")
        with pytest.raises(PermissionError):  # and the kernel refuses it too
            run_as(user, [str(tool)])
    finally:
        subprocess.run(["umount", tools], check=True)
    assert run_fs_read(root, user).allowed


def test_a_missing_tool_is_enoent(root: Path, coder: Path, user: UnprivilegedUser) -> None:
    assert_denied_at(run_fs_read(root, user), Step.MODE_BITS, errno.ENOENT, "does not exist")


def test_a_tool_reached_through_a_link_is_refused(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    add_tool(root, "real-read", policy=FS_READ_RULE)
    (root / "tool" / "fs.read").symlink_to("real-read")
    assert_denied_at(run_fs_read(root, user), Step.MODE_BITS, errno.EACCES, "symbolic link")


# Step 3: mount visibility.


def test_an_object_under_no_mount_is_invisible(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    add_tool(root, "fs.read", policy=FS_READ_RULE)
    write(coder / "mount", json.dumps([[str(root / "shared"), "/shared", "rw"]]))
    assert_denied_at(
        run_fs_read(root, user),
        Step.VISIBILITY,
        errno.EACCES,
        "under none of the mounts of agent 'coder'",
    )
    (coder / "mount").unlink()
    assert run_fs_read(root, user).step == Step.VISIBILITY


def test_a_narrow_mount_is_enough(root: Path, coder: Path, user: UnprivilegedUser) -> None:
    add_tool(root, "fs.read", policy=FS_READ_RULE)
    write(coder / "mount", json.dumps([[str(root / "tool"), "/tools", "ro"]]))
    write(coder / "policy", FS_READ_RULE + "allow coder_t mount:tools read\n")
    decision = run_fs_read(root, user)
    assert decision.allowed, decision.reason
    assert "appears at /tools/fs.read" in decision.steps[Step.VISIBILITY - 1].detail


def test_an_object_seen_only_through_a_mount_the_policy_does_not_grant_is_refused(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    """The agent's tools get only the mounts its policy grants (T-5); the chain agrees."""
    add_tool(root, "fs.read", policy=FS_READ_RULE)
    write(coder / "policy", FS_READ_RULE)
    assert_denied_at(
        run_fs_read(root, user),
        Step.OBJECT_POLICY,
        errno.EACCES,
        "tool/fs.read is seen only through mount ctx",
        "'allow coder_t mount:ctx read'",
    )
    # A second mount showing it, granted, is enough; two mounts of one name grant neither.
    mounts = [[str(root), "/ctx", "ro"], [str(root / "tool"), "/tools", "ro"]]
    write(coder / "mount", json.dumps(mounts))
    either = "it lacks 'allow coder_t mount:ctx read'; or 'allow coder_t mount:tools read'"
    assert run_fs_read(root, user).reason.endswith(either)
    write(coder / "policy", FS_READ_RULE + "allow coder_t mount:tools read\n")
    assert run_fs_read(root, user).allowed
    mounts.append([str(root / "shared"), "/other/tools", "ro"])
    write(coder / "mount", json.dumps(mounts))
    assert run_fs_read(root, user).step == Step.OBJECT_POLICY


def test_writing_through_a_mount_needs_its_write_grant(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    space = root / "shared" / "project-a"
    space.mkdir(parents=True)
    os.chown(space, user.uid, user.gid)
    write(coder / "mount", json.dumps([[str(root / "shared"), "/spaces", "rw"]]))
    rules = "allow coder_t shared:project-a write\nallow coder_t mount:spaces read\n"
    write(coder / "policy", rules)
    request = AuthorityRequest(root, "coder", "shared", "project-a", "write")
    decision = check_authority(request)
    lacks = "seen writably only through mount spaces, which agent/coder.d/policy does not grant"
    assert_denied_at(decision, Step.OBJECT_POLICY, errno.EACCES, lacks)
    assert decision.reason.endswith("it lacks 'allow coder_t mount:spaces write'")
    write(coder / "policy", rules + "allow coder_t mount:spaces write\n")
    assert check_authority(request).allowed, check_authority(request).reason


def test_a_malformed_mount_table_denies(root: Path, coder: Path, user: UnprivilegedUser) -> None:
    add_tool(root, "fs.read", policy=FS_READ_RULE)
    write(coder / "mount", '[["relative", "/ctx", "ro"]]')
    assert_denied_at(run_fs_read(root, user), Step.VISIBILITY, errno.EACCES, "mount is invalid")


# Step 4: the agent label, and controls the agent cannot rewrite.


@pytest.mark.parametrize(
    ("label", "reason"),
    [
        (None, "has no label"),
        ("coder.d\n", "illegal subject type"),
        ("coder_t reviewer_t\n", "label"),
    ],
)
def test_an_agent_needs_a_valid_label(
    root: Path, coder: Path, user: UnprivilegedUser, label: str | None, reason: str
) -> None:
    add_tool(root, "fs.read", policy=FS_READ_RULE)
    if label is None:
        (coder / "label").unlink()
    else:
        write(coder / "label", label)
    assert_denied_at(run_fs_read(root, user), Step.LABEL, errno.EACCES, reason)


def test_the_label_decides_which_rules_apply(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    add_tool(root, "fs.read", policy="allow reviewer_t tool:fs.read execute\n")
    write(
        coder / "policy", "allow reviewer_t mount:ctx read\nallow reviewer_t tool:fs.read execute\n"
    )
    assert run_fs_read(root, user).step == Step.OBJECT_POLICY
    write(coder / "label", "reviewer_t\n")
    assert run_fs_read(root, user).allowed


@pytest.mark.parametrize("control", ["policy", "label", "identity", "mount"])
@pytest.mark.parametrize(
    ("loosen", "reason"),
    [
        ("world-writable", "is writable by its group or by others (mode 0666)"),
        ("group-writable", "is writable by its group or by others (mode 0664)"),
        ("the agent's", "belongs to uid {uid}, the agent's own"),
    ],
)
def test_a_control_the_agent_could_rewrite_grants_nothing(
    root: Path, coder: Path, user: UnprivilegedUser, control: str, loosen: str, reason: str
) -> None:
    """Step 4, like ssh's StrictModes: whether or not a mount shows the file writable."""
    add_tool(root, "fs.read", policy=FS_READ_RULE)
    assert run_fs_read(root, user).allowed
    if loosen == "the agent's":
        os.chown(coder / control, user.uid, user.gid)
    else:
        (coder / control).chmod(0o666 if loosen == "world-writable" else 0o664)

    decision = run_fs_read(root, user)

    assert_denied_at(
        decision, Step.LABEL, errno.EACCES, f"agent/coder.d/{control}", reason.format(uid=user.uid)
    )
    assert decision.reason.startswith(f"step 4 (agent label): agent/coder.d/{control} is not")


@pytest.mark.parametrize("directory", ["agent/coder.d", "agent", ""])
def test_a_control_directory_the_agent_could_change_grants_nothing(
    root: Path, coder: Path, user: UnprivilegedUser, directory: str
) -> None:
    add_tool(root, "fs.read", policy=FS_READ_RULE)
    (root / directory).chmod(0o777)
    world_writable = run_fs_read(root, user)
    (root / directory).chmod(0o755)
    if directory:  # the storage root's owner is the host administrator by definition
        os.chown(root / directory, user.uid, user.gid)
        assert_denied_at(run_fs_read(root, user), Step.LABEL, errno.EACCES, "the agent's own")

    shown = directory or str(root)
    assert_denied_at(world_writable, Step.LABEL, errno.EACCES, f"{shown} is writable by")


def test_an_agent_running_as_the_host_administrator_may_own_its_controls(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    """A non-root storage owner runs agents as its own uid; its controls are its own files.
    What still counts is whether the agent sees them through a read-write mount."""
    add_tool(root, "fs.read", policy=FS_READ_RULE)
    for entry in (root, root / "agent", coder, *coder.iterdir()):
        os.chown(entry, user.uid, user.gid)
    assert run_fs_read(root, user).allowed
    write(coder / "mount", json.dumps([[str(root), "/ctx", "ro"], [str(coder), "/me", "rw"]]))
    os.chown(coder / "mount", user.uid, user.gid)
    assert_denied_at(run_fs_read(root, user), Step.LABEL, errno.EACCES, "may change agent/coder.d")


# Steps 5 and 6: the agent's policy, then the tool's own.


def test_an_invalid_agent_policy_grants_nothing(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    add_tool(root, "fs.read", policy=FS_READ_RULE)
    write(coder / "policy", SEES_CTX + FS_READ_RULE + "allow coder_t tool:* execute\n")
    decision = run_fs_read(root, user)
    assert_denied_at(decision, Step.OBJECT_POLICY, errno.EACCES, "agent/coder.d/policy:3")
    assert "an invalid policy grants nothing" in decision.reason


def test_a_tool_policy_the_agent_could_rewrite_grants_nothing(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    add_tool(root, "fs.read", policy=FS_READ_RULE)
    write(coder / "mount", json.dumps([[str(root / "tool"), "/tools", "rw"]]))
    write(coder / "policy", FS_READ_RULE + "allow coder_t mount:tools read\n")
    (root / "tool" / "fs.read.d" / "policy").chmod(0o666)
    assert_denied_at(
        run_fs_read(root, user), Step.OWN_POLICY, errno.EACCES, "tool/fs.read.d/policy"
    )


@pytest.mark.parametrize("phase", ["pre.d", "post.d"])
@pytest.mark.parametrize(
    ("what", "reason"),
    [
        ("world-writable hook", "is writable by its group or by others (mode 0777)"),
        ("hook of another uid", "belongs to uid 65534"),
        ("world-writable directory", "is writable by its group or by others (mode 0777)"),
    ],
)
def test_a_hook_someone_else_could_rewrite_denies_at_step_6(
    root: Path, coder: Path, user: UnprivilegedUser, phase: str, what: str, reason: str
) -> None:
    """T-6: hooks run as the agent and a pre-hook is its calls' guard: held to the rule of
    the tool's policy and executable, not run as whatever someone put there."""
    add_tool(root, "fs.read", policy=FS_READ_RULE)
    directory = root / "tool" / "fs.read.d" / "hooks" / phase
    hook = write(directory / "10-check", "#!/bin/sh\nexit 0\n", 0o755)
    for place in (directory.parent, directory):
        place.chmod(0o755)
    assert run_fs_read(root, user).allowed
    if what == "world-writable hook":
        hook.chmod(0o777)
    elif what == "hook of another uid":
        os.chown(hook, 65534, 65534)
    else:
        directory.chmod(0o777)
    assert_denied_at(run_fs_read(root, user), Step.OWN_POLICY, errno.EACCES, phase, reason)


def test_the_agent_may_own_a_post_hook_but_not_a_pre_hook(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    add_tool(root, "fs.read", policy=FS_READ_RULE)
    hooks = root / "tool" / "fs.read.d" / "hooks"
    for phase in ("pre.d", "post.d"):
        hook = write(hooks / phase / "10-mine", "#!/bin/sh\nexit 0\n", 0o755)
        os.chown(hook, user.uid, user.gid)
        (hooks / phase).chmod(0o755)
    hooks.chmod(0o755)
    assert_denied_at(
        run_fs_read(root, user), Step.OWN_POLICY, errno.EACCES, "pre.d/10-mine", "the agent's own"
    )
    (hooks / "pre.d" / "10-mine").unlink()
    assert run_fs_read(root, user).allowed


# The decision itself.


def test_a_denial_can_be_raised_as_an_error(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    decision = run_fs_read(root, user)
    with pytest.raises(CtxError) as raised:
        decision.raise_if_denied()
    assert raised.value.errno == errno.ENOENT
    assert str(raised.value).startswith("ENOENT: step 2 (mode bits): tool/fs.read")
    as_json = decision.to_json()
    assert (as_json["allowed"], as_json["step"], as_json["errno"]) == (False, 2, "ENOENT")
    assert [step["result"] for step in as_json["steps"]] == ["pass", "deny", *["not reached"] * 4]


@pytest.mark.parametrize(
    ("object_class", "name", "permission", "location"),
    [
        ("file", "x", "read", None),
        ("tool", "fs.read", "read", None),
        ("tool", "../fs.read", "execute", None),
        ("tool", "fs.read", "execute", "bin"),
        ("tool", "fs.read", "execute", "home/../tool"),
        ("tool", "fs.read", "execute", "shared/a.d/tool"),
        ("session", "review", "read", None),
        ("shared", "project-a", "read", "shared"),
        ("network", "internet", "connect", None),
    ],
)
def test_a_malformed_request_is_einval(
    root: Path,
    coder: Path,
    object_class: str,
    name: str,
    permission: str,
    location: str | None,
) -> None:
    request = AuthorityRequest(root, "coder", object_class, name, permission, location=location)
    with pytest.raises(CtxError) as raised:
        check_authority(request)
    assert raised.value.errno == errno.EINVAL


def test_a_missing_storage_root_is_enoent(tmp_path: Path) -> None:
    request = AuthorityRequest(tmp_path / "nowhere", "coder", "network", "default", "connect")
    with pytest.raises(CtxError) as raised:
        check_authority(request)
    assert raised.value.errno == errno.ENOENT


def test_a_policy_the_host_cannot_open_now_is_denied_with_the_shortage(
    root: Path, coder: Path, user: UnprivilegedUser, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of descriptors, step 6 cannot read the tool's policy: denied all the same, but
    with EMFILE, so that a worker does not take it for a verdict and fail its job for good."""
    add_tool(root, "fs.read", policy=FS_READ_RULE)
    read_file = beneath.read_file

    def out_of_descriptors(directory: Path, path: PurePosixPath, limit: int) -> bytes:
        if path.name == "policy" and "fs.read.d" in path.parts:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return read_file(directory, path, limit)

    monkeypatch.setattr(beneath, "read_file", out_of_descriptors)

    assert_denied_at(run_fs_read(root, user), Step.OWN_POLICY, errno.EMFILE, "cannot be read")


def test_a_step_the_host_cannot_check_now_is_denied_with_the_shortage(
    root: Path, coder: Path, user: UnprivilegedUser, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of descriptors in the middle of a step's own walk (StrictModes here): denied, and
    the errno says it was not a verdict."""
    add_tool(root, "fs.read", policy=FS_READ_RULE)

    def out_of_descriptors(*_: object) -> object:
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    monkeypatch.setattr(chain, "walk", out_of_descriptors)

    decision = run_fs_read(root, user)
    assert not decision.allowed and decision.errno == errno.EMFILE, decision.reason
    assert "cannot be checked, so it is denied" in decision.reason
