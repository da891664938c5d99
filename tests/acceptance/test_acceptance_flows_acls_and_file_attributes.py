"""POSIX ACLs, file attributes (``chattr``) and extended attributes on a CortexFS storage root
(SPEC R-5, §2.4, Q-2, Q-3, Q-4, S-5, T-8, X-1, P-5, P-6; docs/queue.md "A queue shared by a
group", docs/policy.md step 2, docs/tools.md).

ACLs are written as the kernel stores them (``system.posix_acl_access`` and
``system.posix_acl_default``), with no ``setfacl`` needed.  What is checked:

* a default ACL on the storage root (which replaces the umask for what is made below it), and
  a root on a filesystem that keeps no ACL and no extended attribute at all (ramfs), leave
  every mode ctx sets exactly as on a plain root: tools, controls, spaces, queue files,
  results, leases, sessions;
* an ACL that lets an agent's uid write a host tool shows in the group bits (the ACL mask),
  and the authority chain refuses the tool (P-6) until ``chmod go-w``;
* a default ACL that lets a non-member's uid into a new space gives its agent nothing through
  the chain, which judges the space's mode bits (X-1, P-5 step 2);
* the user.* attributes on a request travel with it from ``pending/`` to ``done/`` (it is
  moved, never copied);
* a job file, an ``events.jsonl`` or a tool control made immutable or append-only: what
  ``claim``, ``renew``, ``finish``, ``ctx session repair``, ``ctx object install`` and
  ``ctx bootstrap`` say and leave behind.

Real processes, real uids (the test user of tests/support/users.py as an agent's uid) and a
real ramfs mounted below /tmp/<this file's stem>-<uid>/ and unmounted after.  Needs root
(chattr, mounts, ACLs naming another uid)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import struct
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    Run,
    clean_env,
    new_scratch_dir,
    request,
    scratch_top,
    tool_manifest,
)
from tests.support.users import UnprivilegedUser, access_as, find_or_create_user

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: chattr, mounts, other uids"),
    pytest.mark.skipif(shutil.which("chattr") is None, reason="needs chattr"),
]

SCRATCH = scratch_top(__file__)
CACHE = SCRATCH / f"cache-{os.getpid()}"  # claim-order hints of this process (docs/queue.md)
SPACE = "proj"
AGENT = "alpha"
TOOL = "demo.echo"
ECHO = '#!/bin/sh\nif [ "$#" -gt 0 ]; then printf \'%s\\n\' "$*"; else cat; fi\n'
TRACEBACK = "Traceback (most recent call last)"

# The kernel's POSIX ACL xattr format (linux/posix_acl_xattr.h).
ACL_ACCESS, ACL_DEFAULT = "system.posix_acl_access", "system.posix_acl_default"
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
NO_ID = 0xFFFFFFFF


# ------------------------------------------------------------------------------ helpers


def acl(*entries: tuple[int, int, int]) -> bytes:
    """An ACL as the kernel stores it: version 2, then (tag, perm, id) sorted by tag and id."""
    body = b"".join(struct.pack("<HHI", *entry) for entry in sorted(entries))
    return struct.pack("<I", 2) + body


def set_acl(path: Path, which: str, *entries: tuple[int, int, int]) -> None:
    try:
        os.setxattr(path, which, acl(*entries))
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOTSUP):
            pytest.skip(f"{path}'s filesystem keeps no POSIX ACL")
        raise


def chattr(flag: str, path: Path) -> None:
    done = subprocess.run(["chattr", flag, str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"chattr {flag} does not work here: {done.stderr.strip()}")


def lsattr_flags(path: Path) -> str:
    done = subprocess.run(["lsattr", "-d", str(path)], capture_output=True, text=True)
    return done.stdout.split()[0] if done.returncode == 0 else ""


def unpin(top: Path) -> None:
    """Every immutable or append-only attribute below ``top`` removed, so that it can go."""
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            if not path.is_symlink() and set(lsattr_flags(path)) & {"i", "a"}:
                subprocess.run(["chattr", "-i", "-a", str(path)], capture_output=True)


def modes(top: Path) -> dict[str, int]:
    """Every entry below ``top`` (never following a link) by relative path: its full mode."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            found[str(path.relative_to(top))] = os.lstat(path).st_mode
    return found


@dataclass
class Root:
    """A storage root, driven through ``ctx`` as root under umask 022."""

    storage: Path
    manifests: Path
    user: UnprivilegedUser

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage), XDG_CACHE_HOME=str(CACHE))

    def ctx(self, *args, input: str = "") -> Run:
        done = subprocess.run(
            [*CTX_ARGV, *map(str, args)],
            input=input.encode(),
            capture_output=True,
            env=self.env,
            preexec_fn=lambda: os.umask(0o022),
            timeout=60,
        )
        return Run(
            [str(a) for a in args],
            done.returncode,
            done.stdout.decode("utf-8", "replace"),
            done.stderr.decode("utf-8", "replace"),
        )

    def ok(self, *args, input: str = "") -> Run:
        done = self.ctx(*args, input=input)
        assert done.rc == 0, done
        return done

    @property
    def queue(self) -> QueueCLI:
        return QueueCLI(self.storage, SPACE)

    @property
    def q(self) -> Path:
        return self.storage / "shared" / SPACE / "queue"

    def publish(self, name: str) -> str:
        return self.ok("queue", "publish", "--project", SPACE, "--name", name, "-",
                       input=json.dumps(request(tag=name))).out.strip()  # fmt: skip

    def claim(self) -> str:
        return self.ok("queue", "claim", "--project", SPACE, "--ttl", "600").out.strip()

    def session(self, session: str) -> Path:
        uid = str(self.user.uid)
        return self.storage / "home" / uid / "agent" / AGENT / "session" / session

    def install(self, description: str = "The demo.echo test tool.") -> Run:
        manifest = tool_manifest(self.manifests, TOOL, ECHO, description=description)
        return self.ctx("object", "install", manifest, "--tier", "system")

    def listed(self, name: str) -> str:
        """The status ``ctx object list`` gives tool ``name``."""
        for line in self.ok("object", "list").lines():
            words = line.split()
            if words and words[0] == name:
                return words[2]
        raise AssertionError(f"{name} is not listed")


def build(storage: Path, manifests: Path, user: UnprivilegedUser, *, agent: bool) -> Root:
    """A root made by ``ctx bootstrap`` with the space ``proj`` and the tool ``demo.echo``;
    with ``agent``, agent ``alpha`` (the test user's uid) allowed to run it, and one call of it
    recorded in its session ``s1``."""
    root = Root(storage, manifests, user)
    root.ok("bootstrap")
    root.ok("shared", "create", SPACE)
    assert root.install().rc == 0
    if agent:
        spec = {"name": AGENT, "label": f"{AGENT}_t", "mount": [], "tools": [TOOL],
                "shared": {SPACE: ["read", "write"]}}  # fmt: skip
        path = manifests / f"{AGENT}.json"
        path.write_text(json.dumps(spec))
        root.ok("agent", "create", "--user", user.name, path)
        with (storage / "tool" / f"{TOOL}.d" / "policy").open("a") as policy:
            policy.write(f"allow {AGENT}_t tool:{TOOL} execute\n")
        assert root.ok("run", "--agent", AGENT, "--session", "s1", TOOL, "hi").out == "hi\n"
    return root


@pytest.fixture(scope="module", autouse=True)
def _hint_cache() -> Iterator[None]:
    yield
    shutil.rmtree(CACHE, ignore_errors=True)


@pytest.fixture
def scratch() -> Iterator[Path]:
    top = new_scratch_dir(SCRATCH, "a")
    try:
        yield top
    finally:
        unpin(top)
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def user() -> UnprivilegedUser:
    return find_or_create_user()


@pytest.fixture(scope="module")
def reference(user: UnprivilegedUser) -> Iterator[dict[str, int]]:
    """The modes of :func:`flow` on a plain root, made once."""
    top = new_scratch_dir(SCRATCH, "ref")
    try:
        yield flow(top / "storage", top / "manifests", user)
    finally:
        unpin(top)
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def root(scratch: Path, user: UnprivilegedUser) -> Root:
    return build(scratch / "storage", scratch / "manifests", user, agent=False)


@pytest.fixture
def agent_root(scratch: Path, user: UnprivilegedUser) -> Root:
    return build(scratch / "storage", scratch / "manifests", user, agent=True)


def flow(storage: Path, manifests: Path, user: UnprivilegedUser) -> dict[str, int]:
    """A root with a space, a tool, an agent and its session, a finished job, a claimed one and
    a pending one: the modes of everything in it."""
    root = build(storage, manifests, user, agent=True)
    root.publish("a")
    assert root.claim() == "a.req.json"
    root.ok("queue", "finish", "--project", SPACE, "a", "--ok", "-", input='{"n": 1}')
    root.publish("b")
    assert root.claim() == "b.req.json"
    root.publish("c")
    assert root.queue.state("a.req.json") == "done"
    assert root.queue.state("b.req.json") == "claimed"
    assert root.queue.state("c.req.json") == "pending"
    return modes(storage)


def mounted_ramfs(where: Path) -> Path:
    where.mkdir()
    made = subprocess.run(["mount", "-t", "ramfs", "ramfs", str(where)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a ramfs here: {made.stderr.decode().strip()}")
    where.chmod(0o755)
    return where


# ------------------------------------------------------------------ ACLs and modes


@pytest.mark.parametrize("where", ["default-acl", "ramfs"])
def test_every_mode_ctx_sets_is_the_same_under_a_default_acl_and_without_acl_support(
    scratch: Path, user: UnprivilegedUser, reference: dict[str, int], where: str
) -> None:
    """A default ACL replaces the umask for what is made below it: ``other::rwx`` there would
    make world-writable whatever ctx left to the umask.  A ramfs keeps neither ACLs nor
    extended attributes.  Both roots must come out mode for mode like a plain one."""
    parent = scratch / where
    if where == "ramfs":
        mounted_ramfs(parent)
        with pytest.raises(OSError):
            os.setxattr(parent, "user.probe", b"1")
    else:
        parent.mkdir(mode=0o755)
        set_acl(parent, ACL_DEFAULT, (USER_OBJ, 7, NO_ID), (GROUP_OBJ, 7, NO_ID), (OTHER, 7, NO_ID))
    try:
        got = flow(parent / "storage", scratch / "manifests", user)
        differing = {
            path: (oct(reference.get(path, 0)), oct(got.get(path, 0)))
            for path in reference.keys() | got.keys()
            if reference.get(path) != got.get(path)
        }
        assert differing == {}
        writable_by_others = [
            path
            for path, mode in got.items()
            if mode & stat.S_IWOTH and not stat.S_ISLNK(mode) and not mode & stat.S_ISVTX
        ]
        assert writable_by_others == []
    finally:
        if where == "ramfs":
            subprocess.run(["umount", "-l", str(parent)], check=False)


def test_an_acl_letting_the_agent_write_a_host_tool_makes_the_chain_refuse_it(
    agent_root: Root, user: UnprivilegedUser
) -> None:
    """P-6: a grant the agent could rewrite is no grant.  An ACL naming the agent's uid
    (``user:UID:rwx``) needs a mask that lets it write, and the mask is what ``stat`` shows as
    the group bits: the chain sees a tool writable by others and refuses it, until
    ``chmod go-w`` (which narrows the mask) takes the write away again."""
    tool = agent_root.storage / "tool" / TOOL
    set_acl(tool, ACL_ACCESS, (USER_OBJ, 7, NO_ID), (USER, 7, user.uid), (GROUP_OBJ, 5, NO_ID),
            (MASK, 7, NO_ID), (OTHER, 5, NO_ID))  # fmt: skip
    assert access_as(user, [(str(tool), "w")]) == [True]

    refused = agent_root.ctx("run", "--agent", AGENT, "--session", "s2", TOOL, "hi")
    assert refused.rc != 0 and refused.out == "", refused
    assert "EACCES" in refused.err and "not host-owned" in refused.err, refused
    assert TRACEBACK not in refused.err

    tool.chmod(0o755)
    assert access_as(user, [(str(tool), "w")]) == [False]
    again = agent_root.ctx("run", "--agent", AGENT, "--session", "s2", TOOL, "hi")
    assert again.rc == 0 and again.out == "hi\n", again


def test_a_default_acl_that_lets_a_non_member_into_a_space_grants_its_agent_nothing(
    root: Root, user: UnprivilegedUser
) -> None:
    """X-1, P-5 step 2: whether an agent may use a space is the space's mode bits, its group
    and the agent's uid and groups.  A default ACL on ``shared/`` naming the uid of an agent
    that is not in the space's group is inherited by a space made afterwards; the chain still
    denies that agent the space at step 2."""
    assert 0 not in user.groups and user.gid != 0  # the space gets root's group, gid 0
    set_acl(root.storage / "shared", ACL_DEFAULT, (USER_OBJ, 7, NO_ID), (USER, 7, user.uid),
            (GROUP_OBJ, 5, NO_ID), (MASK, 7, NO_ID), (OTHER, 5, NO_ID))  # fmt: skip
    root.ok("shared", "create", "acl-space")
    spec = {"name": AGENT, "label": f"{AGENT}_t", "mount": [], "tools": [],
            "shared": {"acl-space": ["read", "write"]}}  # fmt: skip
    (root.manifests / "agent.json").write_text(json.dumps(spec))
    root.ok("agent", "create", "--user", user.name, root.manifests / "agent.json")

    for permission in ("read", "write"):
        explained = root.ctx("policy", "explain", AGENT, "shared:acl-space", permission)
        assert explained.rc == 1, explained
        assert "step 2 (mode bits)" in explained.out, explained
        assert "EACCES" in explained.out, explained


def test_a_request_keeps_its_user_attributes_from_pending_to_done(root: Root) -> None:
    """Q-2, Q-4: claim and finish move the request (rename), never copy it: the same file,
    with the ``user.*`` attributes a publisher's tooling put on it, ends in ``done/``."""
    job = root.publish("tagged")
    pending = root.q / "pending" / job
    try:
        os.setxattr(pending, "user.origin", b"nightly-batch")
    except OSError as exc:
        pytest.skip(f"no user.* attributes here: {exc}")
    inode = os.stat(pending).st_ino
    assert root.claim() == job
    claimed = root.q / "claimed" / job / job
    assert os.getxattr(claimed, "user.origin") == b"nightly-batch"
    root.ok("queue", "finish", "--project", SPACE, job, "--ok", "-", input="{}")
    done = root.q / "done" / job
    assert os.stat(done).st_ino == inode
    assert os.getxattr(done, "user.origin") == b"nightly-batch"
    root.queue.assert_settled()


# ------------------------------------------------------------------ attributes of job files


def test_finish_refused_by_an_immutable_request_names_it_and_writes_no_result(
    root: Root,
) -> None:
    """docs/queue.md: finish cannot undo a result once it is in ``done/``, so it checks first
    and nothing has moved when it refuses; a refusal by an immutable attribute is ``EPERM``
    naming the attribute and the ``chattr -i`` that removes it.  A request made immutable
    (``chattr +i``, root only) cannot be renamed into ``done/``."""
    job = root.publish("pinned")
    assert root.claim() == job
    request_file = root.q / "claimed" / job / job
    chattr("+i", request_file)

    refused = root.ctx("queue", "finish", "--project", SPACE, job, "--ok", "-", input="{}")
    assert refused.rc == 1, refused
    assert refused.err.startswith("ctx: EPERM:"), refused
    assert TRACEBACK not in refused.err
    assert root.queue.state(job) == "claimed"
    assert not (root.q / "done" / f"{job}.result").exists(), "a result was written"
    assert "immutable" in refused.err and f"chattr -i {request_file}" in refused.err, refused


@pytest.mark.parametrize("step", ["claim", "renew"])
def test_a_claim_or_renew_refused_by_an_immutable_job_file_names_the_file(
    root: Root, step: str
) -> None:
    """docs/queue.md: a step refused by an immutable attribute is ``EPERM`` naming it and the
    ``chattr -i`` that removes it; the directory (``pending/``, ``lease/J``) is writable, so
    naming it as what refused sends the operator to the wrong place."""
    job = root.publish("pinned")
    if step == "claim":
        pinned = root.q / "pending" / job
        chattr("+i", pinned)
        refused = root.ctx("queue", "claim", "--project", SPACE, "--ttl", "600")
        expected = "pending"
    else:
        assert root.claim() == job
        pinned = root.q / "lease" / job / "worker"
        chattr("+i", pinned)
        refused = root.ctx("queue", "renew", "--project", SPACE, job, "--ttl", "900")
        expected = "claimed"
    assert refused.rc == 1, refused
    assert refused.err.startswith("ctx: EPERM:"), refused
    assert TRACEBACK not in refused.err
    assert root.queue.state(job) == expected
    assert "immutable" in refused.err and f"chattr -i {pinned}" in refused.err, refused


# ------------------------------------------------------------------ attributes of sessions


def test_an_immutable_session_log_stops_a_call_before_the_tool_runs(agent_root: Root) -> None:
    """S-5, T-7: a call whose ``tool_call`` cannot be recorded does not run; nothing is
    written anywhere, and the error names the session log."""
    events = agent_root.session("s1") / "events.jsonl"
    log = agent_root.storage / "tool" / f"{TOOL}.d" / "log"
    before = (events.read_bytes(), log.read_bytes())
    chattr("+i", events)
    refused = agent_root.ctx("run", "--agent", AGENT, "--session", "s1", TOOL, "hi")
    assert refused.rc != 0 and refused.out == "", refused
    assert "EPERM" in refused.err and str(events) in refused.err, refused
    assert TRACEBACK not in refused.err
    assert (events.read_bytes(), log.read_bytes()) == before


def test_an_append_only_session_log_still_records_whole_calls(agent_root: Root) -> None:
    """S-5: events are appended with ``O_APPEND``, which an append-only file allows."""
    events = agent_root.session("s1") / "events.jsonl"
    chattr("+a", events)
    agent_root.ok("run", "--agent", AGENT, "--session", "s1", TOOL, "again")
    lines = events.read_text().splitlines()
    kinds = [json.loads(line)["type"] for line in lines]
    assert kinds == ["tool_call", "tool_result", "tool_call", "tool_result"]


def test_repair_refused_by_an_append_only_session_log_names_the_attribute(
    agent_root: Root,
) -> None:
    """S-5: ``ctx session repair`` truncates a torn last line.  An append-only file cannot be
    truncated, by root too: the refusal must say so and how to lift it, not send root to run
    it as root."""
    events = agent_root.session("s1") / "events.jsonl"
    with events.open("ab") as log:
        log.write(b'{"ts":"2026-06-22T12:00:00Z","type":"tool_ca')
    before = events.read_bytes()
    chattr("+a", events)
    refused = agent_root.ctx("session", "repair", AGENT, "--session", "s1")
    assert refused.rc == 1, refused
    assert refused.err.startswith("ctx: EPERM:"), refused
    assert events.read_bytes() == before
    assert "append-only" in refused.err and f"chattr -a {events}" in refused.err, refused
    assert "or as root" not in refused.err, refused


# ------------------------------------------------------------------ attributes of tool controls


def pin_a_control_and_reinstall(root: Root) -> tuple[Path, Run]:
    """``tool/demo.echo.d/description`` made immutable, then the tool installed again with
    another description: the control, and what the install said."""
    control = root.storage / "tool" / f"{TOOL}.d" / "description"
    chattr("+i", control)
    return control, root.install(description="A newer description.")


def test_an_install_refused_by_an_immutable_control_leaves_the_tool_usable(root: Root) -> None:
    """T-8: an install either happens or leaves the previous version in place; a refusal by
    an immutable attribute is ``EPERM`` naming the file and the ``chattr -i`` that lifts
    it.  The tool stays usable either way."""
    _, refused = pin_a_control_and_reinstall(root)
    assert refused.rc == 1, refused
    assert refused.err.startswith("ctx: EPERM:"), refused
    assert TRACEBACK not in refused.err
    hidden = [p.name for p in (root.storage / "tool").iterdir() if p.name.startswith(f".{TOOL}")]
    assert root.listed(TOOL) == "available"
    assert hidden == []
    assert "immutable" in refused.err and "chattr -i" in refused.err, refused


def test_bootstrap_meeting_an_immutable_leftover_of_an_install_names_the_file(
    root: Root,
) -> None:
    """R-5: bootstrap repairs what it can and says what it left.  An install cut short before
    its commit leaves its staged control directory hidden beside the tool, for the next
    install or bootstrap to remove; one file of it made immutable meanwhile is the one thing
    in the way, and each problem line must let the operator find it (its path) and lift it
    (``chattr -i``).  Once lifted, bootstrap removes the leftover."""
    tier = root.storage / "tool"
    staged = tier / f".{TOOL}~0123456789ab~controls"
    shutil.copytree(tier / f"{TOOL}.d", staged, symlinks=True)
    pinned = staged / "description"
    chattr("+i", pinned)

    repaired = root.ctx("bootstrap")
    assert repaired.rc == 1, repaired
    assert TRACEBACK not in repaired.err
    problems = [line for line in repaired.out.splitlines() if line.startswith("problem")]
    assert problems, repaired
    for line in problems:
        assert str(pinned) in line and f"chattr -i {pinned}" in line, line

    chattr("-i", pinned)
    root.ok("bootstrap")
    assert not staged.exists()
    assert root.listed(TOOL) == "available"
