"""``ctx policy explain`` asked by a uid that may not read what decides the answer (SPEC P-5,
T-4): the chain reads with the asking process's rights, so a refusal that process meets says
nothing of the agent.  It gets an EACCES naming the directory it may not enter, never a
verdict on the agent (a tool said not to exist, a step denied for the asker's refusal)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.storage import add_agent, add_tool
from tests.support.users import UnprivilegedUser

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs ctx under other ids")

CTX = str(Path(sys.executable).with_name("ctx"))
ASKER = 47_930  # a uid and gid in no user or group database, in no group of the space
POLICY = (
    "allow coder_t mount:ctx read\n"
    "allow coder_t shared:team read\n"
    "allow coder_t tool:probe execute\n"
)
EXPLAIN = ["policy", "explain", "coder", "tool:probe", "execute"]


def _ctx(root: Path, *args: str, uid: int = 0, gid: int = 0) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/", "LANG": "C.UTF-8"}
    return subprocess.run(
        [CTX, "--storage", str(root), *args],
        user=uid,
        group=gid,
        extra_groups=[],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture
def space(root: Path, user: UnprivilegedUser) -> Path:
    """Agent ``coder`` (the test user) may run ``probe`` of space ``team``, which only root
    and the agent's group may enter (``root:<its gid>``, 0750)."""
    add_agent(root, "coder", uid=user.uid, gid=user.gid, policy=POLICY)
    probe_policy = "allow coder_t tool:probe execute\n"
    add_tool(root, "probe", policy=probe_policy, location="shared/team/tool")
    team = root / "shared" / "team"
    os.chown(team, 0, user.gid)
    team.chmod(0o750)
    return team


def _refused_as_the_askers_own(done: subprocess.CompletedProcess[str], space: Path) -> None:
    assert (done.returncode, done.stdout) == (1, ""), done
    assert done.stderr.startswith(
        f"ctx: EACCES: cannot judge whether agent 'coder' may execute tool:probe: uid {ASKER} "
        f"may not enter {space} (owner uid 0, group "
    ), done.stderr
    assert f"that refusal is uid {ASKER}'s own and says nothing of agent 'coder'" in done.stderr


def test_root_and_the_agents_uid_see_the_agent_allowed(
    root: Path, space: Path, user: UnprivilegedUser
) -> None:
    for uid, gid in ((0, 0), (user.uid, user.gid)):
        done = _ctx(root, *EXPLAIN, uid=uid, gid=gid)
        assert (done.returncode, done.stdout.splitlines()[-1]) == (0, "allow"), done


def test_a_space_the_asker_may_not_enter_is_named_not_passed_over(root: Path, space: Path) -> None:
    """The agent's CTX_PATH finds probe in the space; the asker's lookup could not look
    there, and must not judge tool/probe instead (ENOENT, a false verdict)."""
    _refused_as_the_askers_own(_ctx(root, *EXPLAIN, uid=ASKER, gid=ASKER), space)


def test_the_askers_refusal_at_step_2_is_no_denial_of_the_agent(root: Path, space: Path) -> None:
    located = [*EXPLAIN, "--location", "shared/team/tool"]
    _refused_as_the_askers_own(_ctx(root, *located, uid=ASKER, gid=ASKER), space)


def test_a_refusal_the_agents_own_uid_meets_still_denies(
    root: Path, space: Path, user: UnprivilegedUser
) -> None:
    """What the agent's own uid may not reach, the agent may not: a verdict, failing closed."""
    space.chmod(0o700)
    located = [*EXPLAIN, "--location", "shared/team/tool"]
    done = _ctx(root, *located, uid=user.uid, gid=user.gid)
    assert done.returncode == 1 and done.stderr == "", done
    assert done.stdout.splitlines()[-1].startswith("deny: EACCES: step 2 (mode bits): "), done


PRIVATE_CONTROLS = {  # a control the chain reads for tool:probe, and the step reading it
    "agent/coder.d/label": 4,
    "agent/coder.d/policy": 5,
    "tool/probe.d/policy": 6,
}


@pytest.fixture
def system_probe(root: Path, user: UnprivilegedUser) -> None:
    """Agent ``coder`` (the test user) may run ``probe`` of the system tier."""
    add_agent(root, "coder", uid=user.uid, gid=user.gid, policy=POLICY)
    add_tool(root, "probe", policy="allow coder_t tool:probe execute\n")


@pytest.mark.parametrize("control", PRIVATE_CONTROLS)
def test_a_control_the_asker_may_not_read_is_no_denial_of_the_agent(
    root: Path, system_probe: None, user: UnprivilegedUser, control: str
) -> None:
    """A control made 0600 by root (private to the host, as a grant may be; root's calls
    read it): the asker's refusal to read it is named as the asker's own, with the file's
    owner and mode, and no step is said to deny; the agent's own uid, refused it too, gets
    the verdict, denied at the step that reads it, failing closed."""
    private = root / control
    private.chmod(0o600)
    as_root = _ctx(root, *EXPLAIN)
    assert (as_root.returncode, as_root.stdout.splitlines()[-1]) == (0, "allow"), as_root
    done = _ctx(root, *EXPLAIN, uid=ASKER, gid=ASKER)
    assert (done.returncode, done.stdout) == (1, ""), done
    assert done.stderr.startswith(
        f"ctx: EACCES: cannot judge whether agent 'coder' may execute tool:probe: uid {ASKER} "
        f"may not read {private} (owner uid 0, group 0, mode 0600); that refusal is "
        f"uid {ASKER}'s own and says nothing of agent 'coder'"
    ), done.stderr
    as_agent = _ctx(root, *EXPLAIN, uid=user.uid, gid=user.gid)
    assert (as_agent.returncode, as_agent.stderr) == (1, ""), as_agent
    step = PRIVATE_CONTROLS[control]
    assert as_agent.stdout.splitlines()[-1].startswith(
        f"deny: EACCES: step {step} ("
    ) and as_agent.stdout.splitlines()[-1].endswith(
        f"{control} cannot be read safely: Permission denied"
    ), as_agent


def test_a_policy_the_asker_may_not_read_hides_where_the_agent_finds_the_tool(
    root: Path, space: Path
) -> None:
    """The agent's CTX_PATH holds the spaces its policy grants: unread, the tier the agent's
    lookup finds probe in cannot be told, and the system tier's lack of it is no verdict."""
    space.chmod(0o755)
    policy = root / "agent" / "coder.d" / "policy"
    policy.chmod(0o600)
    done = _ctx(root, *EXPLAIN, uid=ASKER, gid=ASKER)
    assert (done.returncode, done.stdout) == (1, ""), done
    assert done.stderr.startswith(
        f"ctx: EACCES: cannot judge whether agent 'coder' may execute tool:probe: uid {ASKER} "
        f"may not read {policy} (owner uid 0, group 0, mode 0600); "
    ), done.stderr
    as_root = _ctx(root, *EXPLAIN)
    assert (as_root.returncode, as_root.stdout.splitlines()[-1]) == (0, "allow"), as_root


def _explained(root: Path, obj: str, perm: str, uid: int, gid: int) -> dict[str, object]:
    done = _ctx(root, "policy", "explain", "coder", obj, perm, "--json", uid=uid, gid=gid)
    assert (done.returncode, done.stderr) == (1, ""), done
    return json.loads(done.stdout)


def test_the_agents_own_uid_is_told_which_directory_it_may_not_search(
    root: Path, user: UnprivilegedUser
) -> None:
    """P-5 step 2: a provider directory closed to the agent (root's, 0700) denies
    ``model:acme/m1 use``.  Root judges the bits and names it; the agent's own uid, refused
    the directory itself, gets the same verdict naming the same directory, not a bare
    "Permission denied"."""
    add_agent(root, "coder", uid=user.uid, gid=user.gid, policy=POLICY)
    model = root / "model" / "acme" / "m1"
    model.parent.mkdir(mode=0o700)
    model.write_text("{}\n")
    (root / "model" / "acme" / "m1.d").mkdir(mode=0o755)
    (root / "model" / "acme" / "m1.d" / "policy").write_text("allow coder_t model:acme/m1 use\n")
    reason = f"step 2 (mode bits): search (x) on model/acme is denied to uid {user.uid}"
    for uid, gid in ((0, 0), (user.uid, user.gid)):
        facts = _explained(root, "model:acme/m1", "use", uid, gid)
        assert (facts["step"], facts["errno"], facts["reason"]) == (2, "EACCES", reason), facts


def test_the_agents_own_uid_is_told_which_directory_hides_a_tools_policy(
    root: Path, system_probe: None, user: UnprivilegedUser
) -> None:
    """P-5 step 6: a tool directory ``tool/probe.d`` only root may enter keeps its policy from
    the agent's uid, which fails closed naming the directory and the policy behind it."""
    (root / "tool" / "probe.d").chmod(0o700)
    facts = _explained(root, "tool:probe", "execute", user.uid, user.gid)
    assert (facts["step"], facts["errno"], facts["reason"]) == (
        6,
        "EACCES",
        f"step 6 (tool/model policy): tool/probe.d/policy cannot be read: search (x) on "
        f"tool/probe.d is denied to uid {user.uid}",
    ), facts
