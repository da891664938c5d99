"""The chain for every class of object and every tool tier (SPEC P-3..P-7, T-4, S-6, X-1)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from cortexfs.policy import AuthorityRequest, Credentials, Decision, Outcome, Step, check_authority
from cortexfs.shared.spaces import create_shared_space
from tests.support.storage import add_tool, write
from tests.support.users import UnprivilegedUser

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to set owners and uids")


def ask(root: Path, object_ref: str, permission: str, location: str | None = None) -> Decision:
    object_class, _, name = object_ref.partition(":")
    return check_authority(
        AuthorityRequest(root, "coder", object_class, name, permission, location=location)
    )


def grant(controls: Path, *rules: str) -> None:
    """The agent's policy: ``rules``, and the storage root's mount at /ctx that add_agent gives."""
    rules = ("mount:ctx read", *rules)
    write(controls / "policy", "".join(f"allow coder_t {rule}\n" for rule in rules))


def mount(controls: Path, *triples: list[str]) -> None:
    write(controls / "mount", json.dumps(list(triples)))


# What the agent's view of the storage root needs to show what lies in space project-a.
SPACE_READ = ("shared:project-a read",)


def make_session(root: Path, location: str, name: str) -> None:
    """Session directory ``location/name``, it and every directory above it up to the root
    open to all (0755)."""
    session = root / location / name
    session.mkdir(parents=True)
    for directory in (session, *session.parents):
        if directory == root:
            break
        directory.chmod(0o755)


def outcomes(decision: Decision) -> list[Outcome]:
    return [result.outcome for result in decision.steps]


def test_the_network_is_off_unless_allowed(root: Path, coder: Path) -> None:
    decision = ask(root, "network:default", "connect")
    assert (decision.step, decision.errno) == (Step.OBJECT_POLICY, errno.EACCES)
    grant(coder, "network:default connect")
    decision = ask(root, "network:default", "connect")
    assert decision.allowed
    na, ok = Outcome.NOT_APPLICABLE, Outcome.PASS
    assert outcomes(decision) == [ok, na, na, ok, ok, na]


def test_a_model_needs_its_own_policy_too(root: Path, coder: Path) -> None:
    model = write(root / "model" / "openai" / "gpt-5.6", "{}\n")
    model.parent.chmod(0o755)
    own_policy = root / "model" / "openai" / "gpt-5.6.d" / "policy"
    write(own_policy, "")
    own_policy.parent.chmod(0o755)
    assert ask(root, "model:openai/gpt-5.6", "use").step == Step.OWN_POLICY
    write(own_policy, "allow coder_t model:openai/gpt-5.6 use\n")
    assert ask(root, "model:openai/gpt-5.6", "use").allowed
    model.chmod(0o640)
    assert ask(root, "model:openai/gpt-5.6", "use").step == Step.MODE_BITS
    assert ask(root, "model:openai/gpt-9", "use").errno == errno.ENOENT


def test_a_shared_space_needs_mode_bits_a_mount_and_policy(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    space = root / "shared" / "project-a"
    space.mkdir(mode=0o755)
    space.chmod(0o755)
    grant(coder, "shared:project-a read", "shared:project-a write")
    assert ask(root, "shared:project-a", "read").allowed
    write_decision = ask(root, "shared:project-a", "write")
    assert write_decision.step == Step.MODE_BITS
    assert "needs -wx" in write_decision.reason

    os.chown(space, 0, 61006)
    space.chmod(0o775)
    identity = {"uid": user.uid, "gid": user.gid, "groups": [61006]}
    write(coder / "identity", json.dumps(identity))
    # Through the storage root's mount, its tools get the agent's view of the root (T-5),
    # writable in the spaces its policy lets it write, whatever the mount's own mode.
    through_view = ask(root, "shared:project-a", "write")
    assert through_view.allowed, through_view.reason
    assert "writable in the agent's view of the storage root" in through_view.steps[2].detail
    mount(coder, [str(space), "/shared/project-a", "ro"])
    assert ask(root, "shared:project-a", "write").step == Step.VISIBILITY
    mount(coder, [str(root), "/ctx", "ro"], [str(space), "/shared/project-a", "rw"])
    assert ask(root, "shared:project-a", "write").allowed
    grant(coder, "shared:project-a read")
    mount(coder, [str(root), "/ctx", "ro"])
    assert ask(root, "shared:project-a", "write").step == Step.VISIBILITY
    assert ask(root, "shared:project-b", "read").errno == errno.ENOENT


def test_the_roots_mount_written_read_write_widens_no_view(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    """Its tools get the agent's view of the root whatever the mode its control gives that
    mount: a space its policy lets it write but not read is hidden there, so not writable."""
    space = root / "shared" / "project-a"
    space.mkdir(mode=0o777)
    space.chmod(0o777)
    write(coder / "identity", json.dumps({"uid": user.uid, "gid": user.gid, "groups": []}))
    mount(coder, [str(root), "/ctx", "rw"])
    grant(coder, "mount:ctx write", "shared:project-a write")
    decision = ask(root, "shared:project-a", "write")
    assert (decision.step, decision.errno) == (Step.VISIBILITY, errno.EACCES), decision.reason
    assert "'shared:project-a read' and 'shared:project-a write'" in decision.reason
    grant(coder, "mount:ctx write", "shared:project-a write", "shared:project-a read")
    assert ask(root, "shared:project-a", "write").allowed


def test_a_session_is_found_through_its_location(root: Path, coder: Path) -> None:
    location = "shared/project-a/agent/reviewer/session"
    make_session(root, location, "design-review")
    grant(coder, "session:design-review read", "session:design-review resume")
    unseen = ask(root, "session:design-review", "read", location)
    assert (unseen.step, unseen.errno) == (Step.VISIBILITY, errno.EACCES), unseen.reason
    grant(coder, "session:design-review read", "session:design-review resume", *SPACE_READ)
    assert ask(root, "session:design-review", "read", location).allowed
    resume = ask(root, "session:design-review", "resume", location)
    assert (resume.step, resume.errno) == (Step.MODE_BITS, errno.EACCES)
    elsewhere = ask(root, "session:design-review", "read", "home/1000/agent/coder/session")
    assert elsewhere.errno == errno.ENOENT


def test_creating_an_agent_is_granted_per_child_name(root: Path, coder: Path) -> None:
    grant(coder, "agent:review-1 create")
    assert ask(root, "agent:review-1", "create").allowed
    denied = ask(root, "agent:review-2", "create")
    assert (denied.step, denied.errno) == (Step.OBJECT_POLICY, errno.EACCES)
    assert "has no rule 'allow coder_t agent:review-2 create'" in denied.reason


def test_starting_an_agent_needs_its_entry(root: Path, coder: Path) -> None:
    grant(coder, "agent:coder start", "agent:reviewer start")
    assert ask(root, "agent:coder", "start").allowed
    assert ask(root, "agent:reviewer", "start").errno == errno.ENOENT


def test_a_mount_is_named_by_its_target(
    root: Path, coder: Path, traversable_tmp: Path, user: UnprivilegedUser
) -> None:
    project = traversable_tmp / "project"
    project.mkdir(mode=0o755)
    project.chmod(0o755)
    mount(coder, [str(root), "/ctx", "ro"], [str(project), "/workspace", "ro"])
    grant(coder, "mount:workspace read", "mount:workspace write")
    assert ask(root, "mount:workspace", "read").allowed
    assert ask(root, "mount:home", "read").errno == errno.ENOENT
    assert ask(root, "mount:workspace", "write").step == Step.MODE_BITS

    os.chown(project, user.uid, user.gid)
    write_decision = ask(root, "mount:workspace", "write")
    assert write_decision.step == Step.VISIBILITY
    assert "read-only" in write_decision.reason
    mount(coder, [str(root), "/ctx", "ro"], [str(project), "/workspace", "rw"])
    assert ask(root, "mount:workspace", "write").allowed


@pytest.mark.parametrize("tier", ["home/{uid}/tool", "shared/project-a/tool"])
def test_tools_in_other_tiers_are_judged_where_they_live(
    root: Path, coder: Path, user: UnprivilegedUser, tier: str
) -> None:
    location = tier.format(uid=user.uid)
    add_tool(root, "lint", policy="allow coder_t tool:lint execute\n", location=location)
    grant(coder, "tool:lint execute", *SPACE_READ)
    assert ask(root, "tool:lint", "execute").errno == errno.ENOENT
    decision = check_authority(
        AuthorityRequest(
            root,
            "coder",
            "tool",
            "lint",
            "execute",
            caller=Credentials(user.uid, user.gid),
            location=location,
        )
    )
    assert decision.allowed, decision.reason
    assert f"{location}/lint.d/policy" in decision.steps[Step.OWN_POLICY - 1].detail


@pytest.mark.parametrize(
    ("location", "hidden"),
    [
        (
            "shared/project-a/tool",
            "its view of the storage root shows a space only when its policy allows "
            "'shared:project-a read' (X-1)",
        ),
        (
            "shared/project-a/agent/reviewer/session",
            "its view of the storage root shows a space only when its policy allows "
            "'shared:project-a read' (X-1)",
        ),
        (
            "home/4242/tool",
            "of the homes, its view of the storage root shows only its own (home/{uid})",
        ),
    ],
    ids=["space-tool", "space-session", "other-home-tool"],
)
def test_step_3_denies_what_the_agents_view_of_the_root_does_not_show(
    root: Path, coder: Path, user: UnprivilegedUser, location: str, hidden: str
) -> None:
    """The storage root's mount shows a space only with its read grant, and no home but the
    agent's own (X-1, S-6, as a view mounted with ``--as`` shows them): a tool or session
    there is denied at step 3, naming the grant, where it was seen through the mount and
    allowed, or denied later by a step that had nothing to do with it."""
    if location.endswith("session"):
        make_session(root, location, "design-review")
        object_ref, permission = "session:design-review", "read"
    else:
        add_tool(root, "lint", policy="allow coder_t tool:lint execute\n", location=location)
        object_ref, permission = "tool:lint", "execute"
    grant(coder, f"{object_ref} {permission}")
    caller = Credentials(user.uid, user.gid)
    object_class, _, name = object_ref.partition(":")
    request = AuthorityRequest(root, "coder", object_class, name, permission, caller, location)

    decision = check_authority(request)

    assert (decision.step, decision.errno) == (Step.VISIBILITY, errno.EACCES), decision.reason
    assert decision.reason == (
        f"step 3 (mount visibility): {location}/{name} is not in the view of agent 'coder': "
        + hidden.format(uid=user.uid)
    )
    grant(coder, f"{object_ref} {permission}", *SPACE_READ)
    assert check_authority(request).allowed is location.startswith("shared/")


@pytest.mark.parametrize("tier", ["home/{uid}/tool", "shared/project-a/tool"])
def test_a_tool_policy_the_agent_may_change_grants_nothing(
    root: Path, coder: Path, user: UnprivilegedUser, tier: str
) -> None:
    """Its own home, or a space directory its group may write: the tool's own policy there is
    the agent's to rewrite (through its view of /ctx, or with shell.exec outside it), so it
    grants nothing (P-6), though the storage root's mount itself is read-only."""
    location = tier.format(uid=user.uid)
    add_tool(root, "lint", policy="allow coder_t tool:lint execute\n", location=location)
    grant(coder, "tool:lint execute", "shared:project-a read", "shared:project-a write")
    top = root.joinpath(*location.split("/")[:2])  # home/<uid> or shared/project-a
    os.chown(top, 0, 61006)
    top.chmod(0o2775)
    identity = {"uid": user.uid, "gid": user.gid, "groups": [61006]}
    write(coder / "identity", json.dumps(identity))
    caller = Credentials(user.uid, user.gid)
    request = AuthorityRequest(root, "coder", "tool", "lint", "execute", caller, location)

    decision = check_authority(request)

    assert (decision.step, decision.errno) == (Step.OWN_POLICY, errno.EACCES), decision.reason
    assert f"{location}/lint.d/policy is not host-owned: {top.relative_to(root)}" in (
        decision.reason
    )


@pytest.fixture
def space_tool(root: Path, coder: Path, user: UnprivilegedUser) -> AuthorityRequest:
    """Tool ``lint`` of space ``project-a``, installed by the host as ``ctx shared create``
    lays a space out (the space sticky, its tool/ the owner's); coder is a member."""
    create_shared_space(root, "project-a", gid=61006)
    location = "shared/project-a/tool"
    add_tool(root, "lint", policy="allow coder_t tool:lint execute\n", location=location)
    (root / "shared" / "project-a").chmod(0o3770)
    (root / location).chmod(0o2750)
    grant(coder, "tool:lint execute", "shared:project-a read", "shared:project-a write")
    identity = {"uid": user.uid, "gid": user.gid, "groups": [61006]}
    write(coder / "identity", json.dumps(identity))
    caller = Credentials(user.uid, user.gid)
    return AuthorityRequest(root, "coder", "tool", "lint", "execute", caller, location)


def test_a_spaces_tool_laid_out_as_a_space_makes_it_runs_for_a_member(
    space_tool: AuthorityRequest,
) -> None:
    decision = check_authority(space_tool)
    assert decision.allowed, decision.reason


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("executable of another uid", "shared/project-a/tool/lint belongs to uid 12345, who"),
        ("policy of another uid", "lint.d/policy belongs to uid 12345, who"),
        ("policy of the agent", "lint.d/policy belongs to uid {uid}, the agent's own"),
        ("tool/ group-writable", "shared/project-a/tool is writable by its group"),
        ("space not sticky", "shared/project-a is writable by its group"),
    ],
)
def test_a_spaces_tool_another_may_change_runs_for_nobody(
    space_tool: AuthorityRequest, user: UnprivilegedUser, change: str, reason: str
) -> None:
    """Code or a grant that some other member (or the agent itself, for the grant) could
    rewrite would run with the agent's grants: refused at step 6 (P-6)."""
    tools = space_tool.root / "shared" / "project-a" / "tool"
    if change == "executable of another uid":
        os.chown(tools / "lint", 12345, 61006)
    elif change == "policy of another uid":
        os.chown(tools / "lint.d" / "policy", 12345, 61006)
    elif change == "policy of the agent":
        os.chown(tools / "lint.d" / "policy", user.uid, user.gid)
    elif change == "tool/ group-writable":
        tools.chmod(0o2770)
    else:
        tools.parent.chmod(0o2770)

    decision = check_authority(space_tool)

    assert (decision.step, decision.errno) == (Step.OWN_POLICY, errno.EACCES), decision.reason
    assert reason.format(uid=user.uid) in decision.reason


def test_a_members_own_executable_in_a_space_runs_for_nobody(
    space_tool: AuthorityRequest, user: UnprivilegedUser, root: Path
) -> None:
    """The grant is for the tool the host installed: an executable the agent could rewrite
    would run whatever it put there under that grant (P-6), as much as another uid's."""
    os.chown(root / "shared" / "project-a" / "tool" / "lint", user.uid, user.gid)

    decision = check_authority(space_tool)

    assert (decision.step, decision.errno) == (Step.OWN_POLICY, errno.EACCES), decision.reason
    assert f"tool/lint belongs to uid {user.uid}, the agent's own" in decision.reason


def test_an_agent_of_the_host_administrator_runs_the_tools_of_its_own_home(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    """A user's own storage root and agent (the agent runs as its creator): the host's files
    are the agent's uid's anyway, so its home tier is no less the host's than tool/."""
    location = f"home/{user.uid}/tool"
    add_tool(root, "lint", policy="allow coder_t tool:lint execute\n", location=location)
    for path in (root, root / "home" / str(user.uid), *(root / location).rglob("*")):
        os.chown(path, user.uid, user.gid)
    grant(coder, "tool:lint execute")
    caller = Credentials(user.uid, user.gid)
    request = AuthorityRequest(root, "coder", "tool", "lint", "execute", caller, location)

    decision = check_authority(request)

    assert decision.allowed, decision.reason


def test_a_space_hidden_in_the_roots_view_is_granted_only_through_a_mount_of_its_own(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    """A space the storage root's view hides (no ``shared:project-a read``) but another mount
    of the agent shows passes step 3 through that mount, and step 5 asks the policy for that
    mount, not for ``/ctx``, which does not show it: allowed only with ``mount:sp read``."""
    location = "shared/project-a/tool"
    add_tool(root, "lint", policy="allow coder_t tool:lint execute\n", location=location)
    mount(coder, [str(root), "/ctx", "ro"], [str(root / "shared" / "project-a"), "/sp", "ro"])
    grant(coder, "tool:lint execute")
    caller = Credentials(user.uid, user.gid)
    request = AuthorityRequest(root, "coder", "tool", "lint", "execute", caller, location)

    decision = check_authority(request)

    assert (decision.step, decision.errno) == (Step.OBJECT_POLICY, errno.EACCES), decision.reason
    assert decision.reason.endswith(
        f"{location}/lint is seen only through mount sp, which agent/coder.d/policy does not "
        "grant: it lacks 'allow coder_t mount:sp read'"
    ), decision.reason
    grant(coder, "tool:lint execute", "mount:sp read")
    decision = check_authority(request)
    assert decision.allowed, decision.reason
    assert "its mount 'sp' is granted" in decision.steps[Step.OBJECT_POLICY - 1].detail


def test_step_3_names_a_withheld_mount_that_would_show_a_hidden_space(
    root: Path, coder: Path, user: UnprivilegedUser
) -> None:
    """Two mounts of the space named alike are withheld (P-5): a tool the root's view hides is
    denied at step 3 with the view's reason and the table's, as ``ctx agent show`` says it."""
    location = "shared/project-a/tool"
    add_tool(root, "lint", policy="allow coder_t tool:lint execute\n", location=location)
    space = str(root / "shared" / "project-a")
    mount(coder, [str(root), "/ctx", "ro"], [space, "/a/sp", "ro"], [space, "/b/sp", "ro"])
    grant(coder, "tool:lint execute", "mount:sp read")
    caller = Credentials(user.uid, user.gid)
    request = AuthorityRequest(root, "coder", "tool", "lint", "execute", caller, location)

    decision = check_authority(request)

    assert (decision.step, decision.errno) == (Step.VISIBILITY, errno.EACCES), decision.reason
    assert "shows a space only when its policy allows 'shared:project-a read' (X-1); " in (
        decision.reason
    )
    assert "2 mounts are named 'sp'" in decision.reason, decision.reason
