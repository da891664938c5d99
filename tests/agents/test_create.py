"""``ctx agent create``: an ordinary entry plus host-owned controls, nothing else (SPEC A-3)."""

from __future__ import annotations

import errno
import json
import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cortexfs import storage
from cortexfs.agents import create as create_module
from cortexfs.agents.create import ROOT_DEFAULT_USER, create_agent
from cortexfs.agents.request import RequestError, parse_request, parse_request_bytes
from cortexfs.errors import CtxError
from cortexfs.locks import LOCK_FILE
from cortexfs.policy import Identity, Policy
from cortexfs.policy.mounts import parse_mount_table
from tests.support.cli import ctx
from tests.support.storage import make_root
from tests.support.users import UnprivilegedUser, run_as
from tests.tools.support import World, effective_user

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]

REVIEWER = {
    "name": "reviewer",
    "label": "reviewer_t",
    "model": ["openai/gpt-5.6"],
    "tools": ["fs.read"],
    "shared": {"project-a": ["read"]},
    "mount": [["/work", "/work", "ro"], ["/srv/project-a", "/shared/project-a", "rw"]],
}


def test_create_makes_the_entry_and_every_control(world: World) -> None:
    identity = Identity(world.user.uid, world.user.gid, frozenset({world.user.gid}))
    request = parse_request(REVIEWER, "request", world.root)

    created = create_agent(world.root, request, identity)

    controls = world.root / "agent/reviewer.d"
    assert created.entry == world.root / "agent/reviewer" and os.access(created.entry, os.X_OK)
    assert sorted(os.listdir(controls)) == sorted(
        ["label", "policy", "identity", "mount", "model", "system.md", "prompt.template.md", "log"]
    )
    assert (controls / "label").read_text() == "reviewer_t\n"
    assert json.loads((controls / "identity").read_text()) == {
        "uid": world.user.uid,
        "gid": world.user.gid,
        "groups": [world.user.gid],
    }
    assert (controls / "model").read_text() == "openai/gpt-5.6\n"
    assert [str(rule) for rule in Policy.from_bytes((controls / "policy").read_bytes())] == sorted(
        [
            "allow reviewer_t tool:fs.read execute",
            "allow reviewer_t model:openai/gpt-5.6 use",
            "allow reviewer_t shared:project-a read",
            "allow reviewer_t mount:work read",
            "allow reviewer_t mount:project-a read",
            "allow reviewer_t mount:project-a write",
            "allow reviewer_t mount:ctx read",
        ]
    )
    mounts = parse_mount_table((controls / "mount").read_bytes())
    assert [(str(m.target), m.writable) for m in mounts] == [
        ("/work", False),
        ("/shared/project-a", True),
        ("/ctx", False),
    ]
    assert str(mounts[-1].source) == str(world.root.resolve())
    for control in os.listdir(controls):
        status = os.stat(controls / control)
        assert status.st_uid == 0, "controls belong to the host, not the agent"
        assert not status.st_mode & stat.S_IWOTH and not status.st_mode & stat.S_IWGRP
    assert sorted(os.listdir(world.root)) == sorted(storage.ROOT_ENTRIES)
    assert sorted(os.listdir(world.root / "agent")) == [LOCK_FILE, "reviewer", "reviewer.d"]


def test_an_existing_agent_is_never_overwritten(world: World) -> None:
    world.agent("coder", tools=["fs.read"])
    before = (world.root / "agent/coder.d/policy").read_bytes()

    with pytest.raises(CtxError) as refused:
        world.agent("coder", tools=["shell.exec"])

    assert refused.value.errno == errno.EEXIST
    assert (world.root / "agent/coder.d/policy").read_bytes() == before


def test_leftover_controls_without_an_entry_are_named_as_what_they_are(world: World) -> None:
    """``agent/zz.d/`` alone is no agent: the refusal says what is there and how to settle it."""
    (world.root / "agent" / "zz.d").mkdir()
    request = json.dumps({"name": "zz", "label": "zz_t"})

    created = ctx(world.root, "agent", "create", "--user", world.user.name, "-", stdin=request)

    assert created.returncode == 1
    assert created.stderr.startswith("ctx: EEXIST: agent/zz.d exists without agent/zz"), (
        created.stderr
    )
    assert "remove agent/zz.d" in created.stderr and "nothing was created" in created.stderr
    assert "change its controls" not in created.stderr
    assert not (world.root / "agent" / "zz").exists()
    assert not any((world.root / "agent" / "zz.d").iterdir())


def test_root_creates_an_agent_as_nobody_by_default(world: World) -> None:
    """An agent never runs as root (P-5 step 1): root's default identity is ``nobody``."""
    nobody = pwd.getpwnam(ROOT_DEFAULT_USER)
    request = parse_request({"name": "a", "label": "a_t"}, "request", world.root)

    created = create_agent(world.root, request)  # the creating user is root

    assert created.identity.uid == nobody.pw_uid != 0
    assert created.identity.gid == nobody.pw_gid and created.default_user == "nobody"
    identity = json.loads((world.root / "agent/a.d/identity").read_text())
    assert (identity["uid"], identity["gid"]) == (nobody.pw_uid, nobody.pw_gid)


def test_an_agent_never_runs_as_root(world: World) -> None:
    request = parse_request({"name": "a", "label": "a_t"}, "request", world.root)

    with pytest.raises(CtxError) as refused:
        create_agent(world.root, request, Identity(0, 0))

    assert refused.value.errno == errno.EINVAL and "never runs as root" in refused.value.message
    assert not (world.root / "agent/a").exists()


@pytest.mark.parametrize(
    "identity", [Identity(1000, -5), Identity(1000, 2**32 - 1), Identity(2**32, 1000)]
)
def test_an_identity_no_kernel_has_is_refused(world: World, identity: Identity) -> None:
    """An id is an integer from 0 to 2**32 - 2, as the identity control is read later."""
    request = parse_request({"name": "a", "label": "a_t"}, "request", world.root)

    with pytest.raises(CtxError) as refused:
        create_agent(world.root, request, identity)

    assert refused.value.errno == errno.EINVAL and "is not a uid or gid" in refused.value.message
    assert not (world.root / "agent/a").exists()


def test_without_a_default_user_root_must_name_one(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(create_module, "ROOT_DEFAULT_USER", "no-such-user-for-ctx")
    request = parse_request({"name": "a", "label": "a_t"}, "request", world.root)

    with pytest.raises(CtxError) as refused:
        create_agent(world.root, request)

    assert refused.value.errno == errno.EINVAL and "--user" in refused.value.message
    assert not (world.root / "agent/a").exists()


def test_only_the_host_administrator_creates_agents(world: World) -> None:
    request = parse_request({"name": "sneaky", "label": "sneaky_t"}, "request", world.root)

    with effective_user(world.user), pytest.raises(CtxError) as refused:
        create_agent(world.root, request, Identity(world.user.uid, world.user.gid))

    assert refused.value.errno == errno.EACCES
    assert not (world.root / "agent/sneaky").exists()


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"name": "../escape"}, "name: '../escape'"),
        ({"label": "review er"}, "label:"),
        ({"tools": ["fs.*"]}, "globs are not supported"),
        ({"model": ["gpt"]}, "model:gpt"),
        ({"shared": {"p": ["execute"]}}, "'execute' is not one of"),
        ({"mount": [["relative", "/x", "ro"]]}, "must be an absolute path"),
        ({"mount": [["/a", "/one/work", "ro"], ["/b", "/two/work", "ro"]]}, "share the name"),
        ({"mount": [["/a", "/other/ctx", "ro"]]}, "belongs to the storage view"),
        ({"mount": [["/a", "/ctx", "ro"]]}, "/ctx is the storage root's place"),
        ({"mount": [["/a", "/", "ro"]]}, "a mount needs a directory below /"),
        ({"mount": [["/a", "/ctx/", "rw"]]}, "/ctx is the storage root's place"),
        ({"mount": [["/a", "/ctx/tool", "ro"]]}, "/ctx is the storage root's place"),
        ({"shared": {"p": "read execute"}}, "'execute' is not one of"),
        ({"shared": {"p": 3}}, "is not of type"),
        ({"identity": {"uid": 0}}, "'identity' was unexpected"),
    ],
)
def test_invalid_requests_are_refused(world: World, change: dict[str, Any], fragment: str) -> None:
    with pytest.raises(RequestError) as refused:
        parse_request({**REVIEWER, **change}, "request", world.root)

    assert any(fragment in problem for problem in refused.value.problems), refused.value.problems


@pytest.mark.parametrize("through_a_link", [False, True])
def test_a_mount_of_the_storage_root_itself_is_refused(
    world: World, tmp_path: Path, through_a_link: bool
) -> None:
    """Raw, the root holds every agent's controls and sessions: an agent sees it only
    through its view at /ctx (T-5), never through a mount of its own."""
    path = world.root
    if through_a_link:
        path = tmp_path / "current"
        path.symlink_to(world.root)
    request = {"name": "a", "label": "a_t", "mount": [[str(path), "/work", "rw"]]}

    with pytest.raises(RequestError) as refused:
        parse_request(request, "request", world.root)

    (problem,) = refused.value.problems
    assert problem.startswith(f"mount source {path}: it is the storage root"), problem


def test_a_mount_above_beside_or_inside_the_storage_root_is_the_administrators_choice(
    world: World, tmp_path: Path
) -> None:
    """A home holding the user's default root, a shared space's data: theirs to give."""
    mounts = [
        [str(world.root.parent), "/home", "rw"],
        [str(world.root / "shared" / "p" / "data"), "/data", "rw"],
        [str(tmp_path / "elsewhere"), "/scratch", "ro"],
    ]
    request = {"name": "a", "label": "a_t", "mount": mounts}
    assert len(parse_request(request, "request", world.root).mounts) == 4  # with /ctx


def test_every_problem_of_a_request_is_listed(world: World) -> None:
    bad = {"name": "", "label": "x y", "tools": ["a/b"], "shared": {"..": ["read"]}}

    with pytest.raises(RequestError) as refused:
        parse_request(bad, "request", world.root)

    assert len(refused.value.problems) == 4, refused.value.problems


def test_a_malformed_mount_entry_hides_no_problem_of_the_other_entries(world: World) -> None:
    bad = {
        "name": "m4",
        "label": "m4_t",
        "mount": [["/srv/a", "/ctx/a", "ro"], ["/srv/b/../c", "/data", "ro"], ["/x", "/etc", "ro"]],
    }

    with pytest.raises(RequestError) as refused:
        parse_request(bad, "request", world.root)

    problems = refused.value.problems
    assert len(problems) == 3, problems
    assert (
        problems[0] == "mount: mount entry 2: the source '/srv/b/../c' must not contain '.' or '..'"
    )
    assert problems[1].startswith("mount target /ctx/a: /ctx is the storage root's place")
    assert problems[2].startswith("mount target /etc: /etc belongs to the system")


def test_problems_the_schema_finds_come_with_those_of_the_rest_of_the_request(
    world: World,
) -> None:
    bad = {
        "name": "bad.d",
        "label": "x",
        "model": "m",
        "tools": ["a*", 7],
        "shared": {"p": ["exec"], "q": 3},
        "mount": [["rel", "/w", "rx"], ["/srv", "/etc/x", "ro"]],
        "extra": True,
    }

    with pytest.raises(RequestError) as refused:
        parse_request(bad, "request", world.root)

    said = "\n".join(refused.value.problems)
    for fragment in (
        "model: 'm' is not of type 'array'",
        "tools/1: 7 is not of type 'string'",
        "shared/q: 3 is not of type",
        "mount/0/2: 'rx' is not one of",
        "'extra' was unexpected",
        "name: 'bad.d' ends in '.d'",
        "tool:a*: globs are not supported",
        "shared/p: 'exec' is not one of",
        "mount target /etc/x",
    ):
        assert fragment in said, said
    assert len(refused.value.problems) == 9, said


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"name": "a", "label": "a_t", "label": "root_t"}', "gives the name 'label' twice"),
        ('{"name": "a", "label": "a_t", "shared": {"p": "read", "p": "write"}}', "'p' twice"),
        ('{"name": "a", "label": "a_t", "tools": [], "x": NaN}', "NaN is not a JSON number"),
    ],
)
def test_a_request_is_strict_json(world: World, text: str, fragment: str) -> None:
    """A key given twice would grant what one reader sees and not what another does."""
    with pytest.raises(RequestError) as refused:
        parse_request_bytes(text.encode(), "request", world.root)
    assert refused.value.errno == errno.EINVAL and fragment in str(refused.value)


def test_ctx_agent_create_and_show(world: World, tmp_path: Path) -> None:
    request_file = tmp_path / "coder.json"
    request_file.write_text(json.dumps({"name": "coder", "label": "coder_t", "tools": ["fs.read"]}))
    base = [*CTX, "--storage", str(world.root), "agent"]

    created = subprocess.run(
        [*base, "create", str(request_file), "--user", world.user.name, "--json"],
        capture_output=True,
        text=True,
    )
    again = subprocess.run(
        [*base, "create", str(request_file), "--user", world.user.name],
        capture_output=True,
        text=True,
    )
    shown = subprocess.run([*base, "show", "coder", "--json"], capture_output=True, text=True)
    invalid = subprocess.run(
        [*base, "create", "-"], input='{"name": 1}', capture_output=True, text=True
    )

    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["identity"]["uid"] == world.user.uid
    assert again.returncode == 1 and "EEXIST" in again.stderr
    assert "change its controls in agent/coder.d/, or create the agent under" in again.stderr
    facts = json.loads(shown.stdout)
    assert facts["ctx_path"] == f"/ctx/tool:/ctx/home/{world.user.uid}/tool"
    assert facts["mounts"] == [[str(world.root.resolve()), "/ctx", "ro"]]
    assert invalid.returncode == 1
    assert len([line for line in invalid.stderr.splitlines() if "EINVAL" in line]) >= 2


def test_create_warns_of_a_shared_label_and_a_missing_mount_source(
    world: World, tmp_path: Path
) -> None:
    """Created all the same (the administrator may mean it), but said at once: a label
    another agent has shares its grants, and a missing source keeps the terminal from
    starting."""
    base = [*CTX, "--storage", str(world.root), "agent", "create", "-", "--user", world.user.name]
    first = {"name": "first", "label": "team_t"}
    second = {"name": "second", "label": "team_t", "mount": [[str(tmp_path / "gone"), "/x", "ro"]]}

    quiet = subprocess.run(base, input=json.dumps(first), capture_output=True, text=True)
    warned = subprocess.run(base, input=json.dumps(second), capture_output=True, text=True)
    as_json = subprocess.run(
        [*base, "--json"],
        input=json.dumps({**second, "name": "third"}),
        capture_output=True,
        text=True,
    )

    assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet.stderr
    assert warned.returncode == 0, warned.stderr
    assert "ctx: warning: label team_t is also agent first's" in warned.stderr
    assert f"ctx: warning: the source {tmp_path / 'gone'} of the mount at /x does not exist" in (
        warned.stderr
    )
    assert (world.root / "agent" / "second").exists()
    assert json.loads(as_json.stdout)["warnings"][:1] == [
        "label team_t is also agent first's: tool and model policies grant by label, so the "
        "two agents share every grant made to it"
    ]
    assert "also agent second's" in json.loads(as_json.stdout)["warnings"][1]


def test_create_warns_of_shared_grants_that_grant_nothing(world: World) -> None:
    base = [*CTX, "--storage", str(world.root), "agent", "create", "-", "--user", world.user.name]
    request = {
        "name": "w",
        "label": "w_t",
        "shared": {"cortexfs-docs": ["read", "write"], "proj": ["write"], "ok": ["read", "write"]},
    }

    assert ctx(world.root, "shared", "create", "ok").returncode == 0

    done = subprocess.run(base, input=json.dumps(request), capture_output=True, text=True)

    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if line.startswith("ctx: warning:")]
    assert warned == [
        "ctx: warning: shared:cortexfs-docs write grants nothing: the manual bundle is "
        "read-only (D-1)",
        "ctx: warning: shared:proj names no shared space yet: the grant takes effect once "
        f"'ctx shared create proj --storage {world.root}' makes it",
        "ctx: warning: shared:proj write without read grants nothing: a space the agent may "
        "not read is not in its view, so it can write nothing there (add read)",
    ]


def test_create_warns_of_a_shared_grant_whose_name_holds_a_link_or_a_file(
    world: World, tmp_path: Path
) -> None:
    """A name under shared/ that is a link or a file is no space (every command refuses it):
    the grant is said to grant nothing until the space is made."""
    (world.root / "shared" / "linked").symlink_to(tmp_path)
    (world.root / "shared" / "filed").write_text("not a space\n")
    base = [*CTX, "--storage", str(world.root), "agent", "create", "-", "--user", world.user.name]
    request = {"name": "l", "label": "l_t", "shared": {"linked": ["read"], "filed": ["read"]}}

    done = subprocess.run(base, input=json.dumps(request), capture_output=True, text=True)

    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stderr.splitlines() if line.startswith("ctx: warning:")]
    assert warned == [
        f"ctx: warning: shared:{name} names {what} at {world.root}/shared/{name}, which is no "
        f"shared space: the grant takes effect once it is removed and 'ctx shared create "
        f"{name} --storage {world.root}' makes it"
        for name, what in (("linked", "a symbolic link"), ("filed", "no directory"))
    ]


def test_each_problem_of_a_request_reads_like_every_ctx_error(world: World, tmp_path: Path) -> None:
    """``ctx: EINVAL: SOURCE: <problem>``, one line each, for a file and for stdin."""
    request_file = tmp_path / "bad.json"
    request_file.write_text(json.dumps({"name": "bad name", "label": "bad_t", "tools": ["a/b"]}))

    from_file = ctx(world.root, "agent", "create", "--user", world.user.name, str(request_file))
    from_stdin = ctx(
        world.root, "agent", "create", "--user", world.user.name, "-", "--json",
        stdin='{"name": "a"}',
    )  # fmt: skip

    assert from_file.returncode == 1
    lines = from_file.stderr.strip().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"ctx: EINVAL: {request_file}: name: 'bad name' "), lines
    assert all(line.startswith(f"ctx: EINVAL: {request_file}: ") for line in lines), lines
    assert from_stdin.returncode == 1
    assert from_stdin.stderr.strip().splitlines() == [
        "ctx: EINVAL: <stdin>: request: 'label' is a required property"
    ]
    assert json.loads(from_stdin.stdout)["error"] == "EINVAL"
    assert not (world.root / "agent" / "a").exists()


def test_a_request_over_256_kib_is_efbig_from_a_file_and_from_stdin(
    world: World, tmp_path: Path
) -> None:
    """Over the limit is EFBIG, as every other bounded input of ctx; nothing is created."""
    text = json.dumps({"name": "big", "label": "big_t", "x": "a" * 262144})
    request_file = tmp_path / "big.json"
    request_file.write_text(text)

    for ran in (
        ctx(world.root, "agent", "create", "--user", world.user.name, str(request_file)),
        ctx(world.root, "agent", "create", "--user", world.user.name, "-", stdin=text),
    ):
        assert ran.returncode == 1
        assert ran.stderr.startswith("ctx: EFBIG: "), ran.stderr
        assert "at most 262144 bytes" in ran.stderr
    assert not (world.root / "agent" / "big").exists()


def test_ctx_agent_create_as_root_without_user_runs_as_nobody(world: World, tmp_path: Path) -> None:
    nobody = pwd.getpwnam(ROOT_DEFAULT_USER)
    request_file = tmp_path / "plain.json"
    request_file.write_text(json.dumps({"name": "plain", "label": "plain_t"}))

    created = ctx(world.root, "agent", "create", str(request_file))

    assert created.returncode == 0, created.stderr
    assert f"uid {nobody.pw_uid}, gid {nobody.pw_gid}" in created.stdout
    assert "runs as user nobody" in created.stdout and "--user" in created.stdout
    identity = json.loads((world.root / "agent/plain.d/identity").read_text())
    assert identity["uid"] == nobody.pw_uid
    assert "nobody" in ctx(world.root, "agent", "create", "--help").stdout


@pytest.mark.parametrize("user", ["root", "0"])
def test_ctx_agent_create_refuses_an_explicit_root(world: World, tmp_path: Path, user: str) -> None:
    request_file = tmp_path / "rooted.json"
    request_file.write_text(json.dumps({"name": "rooted", "label": "rooted_t"}))

    refused = ctx(world.root, "agent", "create", str(request_file), "--user", user)

    # A command line no agent can have: a usage error, as every other --user it cannot take.
    assert refused.returncode == 2 and "EINVAL" in refused.stderr, refused.stderr
    assert "never runs as root" in refused.stderr
    assert not (world.root / "agent/rooted").exists()


def personal_root(top: Path, user: UnprivilegedUser, agent: str) -> tuple[Path, Path]:
    """A storage root ``user`` owns (a personal one) under ``top``, and a request for
    ``agent`` they may read."""
    home = top / "personal"
    home.mkdir()
    root = make_root(home)
    for directory, _, files in os.walk(home):
        for entry in (directory, *(os.path.join(directory, f) for f in files)):
            os.chown(entry, user.uid, user.gid)
    request_file = home / f"{agent}.json"
    request_file.write_text(json.dumps({"name": agent, "label": f"{agent}_t"}))
    os.chmod(request_file, 0o644)
    return root, request_file


def test_a_non_root_creator_keeps_their_own_identity(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """The owner of a personal storage root, a real process of their uid, creates an agent
    that runs as them (the default applies to root only)."""
    root, request_file = personal_root(traversable_tmp, unprivileged_user, "mine")

    created = run_as(
        unprivileged_user,
        [*CTX, "--storage", str(root), "agent", "create", str(request_file), "--json"],
    )

    assert created.returncode == 0, created.stderr
    facts = json.loads(created.stdout)
    assert facts["identity"]["uid"] == unprivileged_user.uid
    assert facts["identity"]["gid"] == unprivileged_user.gid
    assert facts["default_user"] is None


@pytest.mark.parametrize(
    ("options", "foreign"),
    [
        (["--user", ROOT_DEFAULT_USER], "uid "),
        (["--gid", "0"], "group 0"),
        (["--groups", "0"], "group 0"),
    ],
)
def test_a_non_root_creator_cannot_give_an_identity_it_does_not_hold(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser, options: list[str], foreign: str
) -> None:
    """Only root starts processes with another's credentials: an agent of another uid or group
    made by the owner of a personal root could never run, and is refused, nothing made."""
    root, request_file = personal_root(traversable_tmp, unprivileged_user, "other")

    refused = run_as(
        unprivileged_user,
        [*CTX, "--storage", str(root), "agent", "create", str(request_file), *options],
    )

    assert refused.returncode == 1, refused.stdout
    assert refused.stderr.startswith("ctx: EPERM: only root can create an agent that runs as ")
    assert foreign in refused.stderr and "have root create the agent" in refused.stderr
    assert os.listdir(root / "agent") == []


@pytest.mark.parametrize(
    ("permissions", "granted"),
    [
        ("read", ["read"]),
        ("read write", ["read", "write"]),
        ("write  read", ["write", "read"]),
        (["read", "write"], ["read", "write"]),
    ],
)
def test_shared_permissions_are_a_list_or_a_string(
    world: World, permissions: str | list[str], granted: list[str]
) -> None:
    request = parse_request(
        {"name": "a", "label": "a_t", "shared": {"project-a": permissions}}, "request", world.root
    )

    assert request.shared == (("project-a", tuple(granted)),)
    for permission in granted:
        assert f"allow a_t shared:project-a {permission}\n" in request.policy_text()


def test_ctx_agent_create_takes_a_permission_string_and_refuses_a_ctx_mount(
    world: World, tmp_path: Path
) -> None:
    reader = tmp_path / "reader.json"
    reader.write_text(
        json.dumps({"name": "reader", "label": "reader_t", "shared": {"project-a": "read"}})
    )
    shadow = tmp_path / "shadow.json"
    shadow.write_text(
        json.dumps({"name": "shadow", "label": "shadow_t", "mount": [["/srv", "/ctx", "ro"]]})
    )

    created = ctx(world.root, "agent", "create", str(reader), "--user", world.user.name)
    refused = ctx(world.root, "agent", "create", str(shadow), "--user", world.user.name)

    assert created.returncode == 0, created.stderr
    policy = (world.root / "agent/reader.d/policy").read_text()
    assert "allow reader_t shared:project-a read\n" in policy
    assert refused.returncode == 1 and "EINVAL" in refused.stderr, refused.stderr
    assert "/ctx is the storage root's place" in refused.stderr
    assert not (world.root / "agent/shadow").exists()


def test_an_agent_terminal_started_by_its_non_root_creator_says_who_may(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """ctx agent start needs root (the sandbox, the identity switch): the owner of a personal
    root is told so, with the command root runs and what the owner may do meanwhile."""
    root, request_file = personal_root(traversable_tmp, unprivileged_user, "mine")
    base = [*CTX, "--storage", str(root), "agent"]
    assert run_as(unprivileged_user, [*base, "create", str(request_file)]).returncode == 0

    refused = run_as(unprivileged_user, [*base, "start", "mine"])

    assert refused.returncode == 1, refused.stdout
    assert refused.stderr.startswith("ctx: EPERM: an agent terminal is started by root"), (
        refused.stderr
    )
    assert f"have root run 'ctx --storage {root} agent start mine'" in refused.stderr
    assert f"'ctx --storage {root} run --agent mine TOOL'" in refused.stderr


def test_an_agent_that_cannot_reach_the_storage_root_is_warned_of_and_refused_at_step_2(
    world: World,
) -> None:
    """A root made inside a private directory (0700, as pytest's own tmp_path is) is out of
    the agent's reach: said when the agent is made, and every call names step 2 and the
    directory, rather than failing inside the tool."""
    private = world.scratch / "private"
    private.mkdir(mode=0o700)
    root = private / "storage"
    storage.bootstrap(root)
    for entry in (root, *root.iterdir()):
        entry.chmod(0o755)
    request = json.dumps({"name": "reader", "label": "reader_t", "tools": ["fs.stat"]})

    made = ctx(root, "agent", "create", "-", "--user", world.user.name, stdin=request)
    with open(root / "tool" / "fs.stat.d" / "policy", "a") as policy:
        policy.write("allow reader_t tool:fs.stat execute\n")
    ran = ctx(root, "run", "--agent", "reader", "fs.stat", "/ctx")
    explained = ctx(root, "policy", "explain", "reader", "tool:fs.stat", "execute")

    assert made.returncode == 0, made.stderr
    assert f"every tool call of the agent will be refused: search (x) on {private}" in made.stderr
    assert ran.returncode == 126, ran
    assert "step 2 (mode bits)" in ran.stderr and f"chmod o+x {private}" in ran.stderr
    assert explained.returncode == 1 and "2 mode bits          deny" in explained.stdout
    private.chmod(0o711)
    assert ctx(root, "run", "--agent", "reader", "fs.stat", "/ctx").returncode == 0


def test_create_warns_of_a_mount_source_closed_to_the_agents_uid(world: World) -> None:
    """Created all the same, but said at once: a source the agent's uid may not read and
    search shows it nothing."""
    closed = world.scratch / "closed"
    closed.mkdir()
    closed.chmod(0o700)  # root's
    base = [*CTX, "--storage", str(world.root), "agent", "create", "-", "--user", world.user.name]
    request = {"name": "shut", "label": "shut_t", "mount": [[str(closed), "/work", "rw"]]}

    warned = subprocess.run(base, input=json.dumps(request), capture_output=True, text=True)

    assert warned.returncode == 0, warned.stderr
    assert (
        f"ctx: warning: the source {closed} of the mount at /work is closed to the agent: read "
        f"and search (rx) on {closed} are denied to uid {world.user.uid}" in warned.stderr
    ), warned.stderr
    assert (world.root / "agent" / "shut").exists()
