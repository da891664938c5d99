"""``ctx object install --source STORAGE MANIFEST --tier system|user|shared:<name>`` across
storage roots, tiers and users, and what ``ctx object which`` / ``list``, ``ctx run`` and an
agent's ``CTX_PATH`` make of the result (SPEC T-4, T-8, T-8a, R-1, R-3, R-4, X-1, P-6;
docs/tools.md "Manifests, version 2", "How the manifest and its program are read", "How an
install stays atomic", "Listing and resolving", "CTX_PATH").

``--source`` names the storage root as ``--storage`` does: given relative, through a link,
against a ``CTX_STORAGE`` naming another root; missing, a file, or a directory that is no
storage root, it is refused and nothing is made.  The user tier is the caller's own
(``home/<uid>/tool``); a space's tier is its owner's to install into, a member's and an
outsider's installs are refused, and what each may then see differs.  One name in the
system tier, a user tier and a space: the agent's ``CTX_PATH`` takes the first hit and the
chain judges it.  Programs named by ``exec``: a link, a directory, a FIFO, a missing file, a
program over the limit, a setuid or non-executable one, one another uid could not read.
Reinstalls into two tiers at once while ``which``, ``list`` and ``ctx run`` read.  Every
refusal carries an errno and leaves the storage root as it was."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    scratch_top,
    snapshot,
)
from tests.support.users import UnprivilegedUser, members_of, run_as, users_named

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="acts as several uids: needs root")

SPACE = "oitspace"
GROUP = "ctxoit-g"
MEMBER = "ctxoit-m"
OUTSIDER = "ctxoit-x"


# ================================================================================ helpers


@dataclass
class World:
    """A bootstrapped storage root every uid may search, with a scratch directory beside it
    for manifests and programs."""

    storage: Path
    top: Path

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    def ctx(self, *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        return ctx_run(*args, **kw)

    def manifest(
        self,
        name: str,
        version: str = "1",
        *,
        directory: Path | None = None,
        exec_: str = "prog",
        program: str | None = None,
        mode: int = 0o755,
        write_program: bool = True,
    ) -> Path:
        """``manifest.json`` of tool ``name`` in its own directory beside a program ``prog``
        that reads its input and prints ``{"version": VERSION}``; the description says the
        version too (no program is written without ``write_program``)."""
        directory = directory or self.top / "src" / f"{name}-{version}"
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o755)
        if program is None:
            program = f'#!/bin/sh\ncat >/dev/null\necho \'{{"version": "{version}"}}\'\n'
        prog = directory / "prog"
        if write_program and not prog.is_symlink() and not prog.exists():
            prog.write_text(program)
            prog.chmod(mode)
        document = {
            "manifest": 2,
            "kind": "tool",
            "name": name,
            "description": f"{name} version {version}",
            "schema": {"type": "object"},
            "cap": {"side_effects": False, "network": False},
            "exec": exec_,
        }
        path = directory / "manifest.json"
        path.write_text(json.dumps(document))
        path.chmod(0o644)
        return path

    def install(self, manifest: Path, tier: str, *more: str) -> Run:
        r = self.ctx("object", "install", manifest, "--tier", tier, *more)
        assert r.rc == 0, r
        return r

    def listed(self, *args: str, env: dict[str, str] | None = None) -> list[dict]:
        r = self.ctx("object", "list", "--json", *args, env=env or self.env)
        assert r.rc == 0, r
        return r.json()


def as_user(user: UnprivilegedUser, world: World, *args, cwd: Path | None = None, **env: str):
    """``ctx ARGS`` run as ``user`` with its groups, on the world's storage root."""
    environ = clean_env(CTX_STORAGE=str(world.storage), HOME="/nonexistent", **env)
    return run_as(user, [*CTX_ARGV, *map(str, args)], user.groups, env=environ, cwd=cwd)


def own(user: UnprivilegedUser, *paths: Path) -> None:
    """Give ``paths`` and everything below them to ``user``."""
    for path in paths:
        for item in (path, *(path.rglob("*") if path.is_dir() else ())):
            os.chown(item, user.uid, user.gid, follow_symlinks=False)


def make_home(world: World, user: UnprivilegedUser) -> Path:
    """``home/<uid>`` made by root as docs/tools.md tells (``install -d``), the user's."""
    home = world.storage / "home" / str(user.uid)
    subprocess.run(
        ["install", "-d", "-o", str(user.uid), "-g", str(user.gid), "-m", "0755", str(home)],
        check=True,
    )
    return home


def hidden(directory: Path) -> list[str]:
    """Staging names, commit markers: what an install leaves while it runs."""
    if not directory.is_dir():
        return []
    return sorted(n for n in os.listdir(directory) if n.startswith(".") and "~" in n)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def result_frame(r: Run) -> dict:
    frames = [json.loads(line) for line in r.out.splitlines() if line.strip()]
    results = [f for f in frames if f.get("type") == "result"]
    assert len(results) == 1, r
    return results[0]


@pytest.fixture
def world(searchable_storage: Path) -> Iterator[World]:
    top = new_scratch_dir(scratch_top(__file__), "w")
    try:
        yield World(searchable_storage, top)
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def team() -> tuple[UnprivilegedUser, UnprivilegedUser, int]:
    """The space's member, an outsider, and the space's group."""
    (member,), gid = members_of(GROUP, MEMBER)
    (outsider,) = users_named(OUTSIDER)
    assert gid not in outsider.groups
    return member, outsider, gid


def make_space(world: World, gid: int) -> Path:
    made = world.ctx("shared", "create", SPACE, "--group", str(gid))
    assert made.rc == 0, made
    return world.storage / "shared" / SPACE / "tool"


# ============================================================ --source names the root (T-8)


def test_source_is_the_root_given_relative_through_a_link_or_against_ctx_storage(world):
    """T-8, R-1: ``--source`` relative to the caller's directory names the root the install
    goes into, whatever ``CTX_STORAGE`` names (that root is left as it was); the path printed
    and the ``origin`` control are absolute; a ``--source`` that is a link to a root installs
    into the root it names; ``--storage`` naming the same root as ``--source`` is fine."""
    other = world.top / "other"
    shutil.copytree(world.storage, other, symlinks=True)
    before_other = snapshot(other)
    manifest = world.manifest("src.rel")
    rel_manifest = os.path.relpath(manifest, world.storage.parent)

    done = ctx_run(
        "object", "install", "--source", world.storage.name, rel_manifest, "--tier", "system",
        env=clean_env(CTX_STORAGE=str(other)), cwd=world.storage.parent,
    )  # fmt: skip
    path = world.storage / "tool" / "src.rel"
    assert done.rc == 0 and done.out == f"installed src.rel in tier system: {path}\n", done
    origin = json.loads((world.storage / "tool" / "src.rel.d" / "origin").read_text())
    assert origin["manifest"] == str(manifest) and origin["sha256"] == sha256(path), origin
    assert snapshot(other) == before_other

    link = world.top / "root-link"
    link.symlink_to(world.storage)
    again = ctx_run(
        "object", "install", "--source", link, "--storage", world.storage,
        world.manifest("src.rel", "2"), "--tier", "system", "--json",
        env=clean_env(CTX_STORAGE=str(other)),
    )  # fmt: skip
    assert again.rc == 0 and again.json()["replaced"] is True, again
    assert (
        (world.storage / "tool" / "src.rel.d" / "description")
        .read_text()
        .startswith("src.rel version 2")
    )
    assert link.is_symlink() and snapshot(other) == before_other


def test_a_source_missing_a_file_or_no_storage_root_is_refused_and_nothing_is_made(world):
    """T-8, R-1: ``--source`` naming a directory that does not exist is ENOENT (exit 1) and
    is not created; a regular file is a usage error (EINVAL, exit 2); an empty directory, no
    storage root, is ENOENT for every tier and stays empty; ``CTX_STORAGE``'s root is never
    written instead."""
    manifest = world.manifest("src.bad")
    before = snapshot(world.storage)
    missing = world.top / "missing"
    r = world.ctx("object", "install", "--source", missing, manifest, "--tier", "system")
    assert r.rc == 1 and r.err.startswith("ctx: ENOENT: ") and str(missing) in r.err, r
    assert "ctx bootstrap" in r.err, r
    assert not missing.exists()

    r = world.ctx("object", "install", "--source", manifest, manifest, "--tier", "system")
    assert r.rc == 2 and "EINVAL" in r.err and "--source" in r.err, r

    empty = world.top / "empty"
    empty.mkdir()
    for tier in ("system", "user", f"shared:{SPACE}"):
        r = world.ctx("object", "install", "--source", empty, manifest, "--tier", tier)
        assert r.rc == 1 and r.err.startswith("ctx: ENOENT: "), (tier, r)
        assert "Traceback" not in r.err, r
        assert "'ctx bootstrap" in r.err or "'ctx shared create" in r.err, (tier, r)
        assert os.listdir(empty) == [], (tier, os.listdir(empty))
    assert snapshot(world.storage) == before


def test_malformed_tiers_are_usage_errors_and_a_space_never_made_is_enoent(world):
    """T-8, R-3, X-2: ``--tier`` naming no tier (``bogus``, ``User``, ``user:0``,
    ``shared:``, ``shared:../tool``, ``shared:.x``, ``shared:cortexfs-docs``) is EINVAL,
    exit 2; ``shared:<name>`` of a space never created is ENOENT (exit 1) saying how to
    create it, and the space is not made; the root is unchanged after every one."""
    manifest = world.manifest("tier.bad")
    before = snapshot(world.storage)
    for tier in ("bogus", "User", "user:0", "shared:", "shared:../tool", "shared:.x",
                 "shared:cortexfs-docs", "system:"):  # fmt: skip
        r = world.ctx("object", "install", manifest, "--tier", tier)
        assert r.rc == 2 and "EINVAL" in r.err, (tier, r)
    r = world.ctx("object", "install", manifest, "--tier", "shared:nospace")
    assert r.rc == 1 and r.err.startswith("ctx: ENOENT: "), r
    assert "ctx shared create nospace" in r.err, r
    assert not (world.storage / "shared" / "nospace").exists()
    assert snapshot(world.storage) == before


# ============================================================= tiers and users


def test_a_space_tier_is_its_owners_a_member_and_an_outsider_are_refused(world, team):
    """X-1, T-8, T-8a: in a space root made, a member's install is EACCES (its ``tool/`` is
    the owner's alone, mode 2750) and an outsider's is EACCES (it may not enter the space),
    each naming the directory, with nothing made.  Once root installed the tool there, the
    member lists it under ``--tier shared:<space>`` and finds it on a ``CTX_PATH`` holding
    the space; the outsider's full listing leaves it out (exit 0), its ``--tier`` listing is
    EACCES, and its ``which`` passes the file over as not reachable."""
    member, outsider, gid = team
    tier = make_space(world, gid)
    manifest = world.manifest("team.tool")
    before = snapshot(world.storage)

    refused = as_user(member, world, "object", "install", manifest, "--tier", f"shared:{SPACE}")
    assert refused.returncode == 1, refused
    assert refused.stderr.startswith("ctx: EACCES: ") and str(tier) in refused.stderr, refused
    assert "2750" in refused.stderr, refused
    refused = as_user(outsider, world, "object", "install", manifest, "--tier", f"shared:{SPACE}")
    assert refused.returncode == 1 and refused.stderr.startswith("ctx: EACCES: "), refused
    assert str(tier.parent) in refused.stderr, refused
    assert snapshot(world.storage) == before

    world.install(manifest, f"shared:{SPACE}")
    path = tier / "team.tool"
    seen = json.loads(
        as_user(member, world, "object", "list", "--tier", f"shared:{SPACE}", "--json").stdout
    )
    assert [(o["name"], o["path"], o["status"]) for o in seen] == [
        ("team.tool", str(path), "available")
    ]
    found = as_user(
        member, world, "object", "which", "team.tool", CTX_PATH=f"/ctx/shared/{SPACE}/tool"
    )
    assert found.returncode == 0 and found.stdout == f"{path}\n", found

    everything = as_user(outsider, world, "object", "list", "--json")
    assert everything.returncode == 0, everything
    assert "team.tool" not in [o["name"] for o in json.loads(everything.stdout)]
    closed = as_user(outsider, world, "object", "list", "--tier", f"shared:{SPACE}")
    assert closed.returncode == 1 and closed.stderr.startswith("ctx: EACCES: "), closed
    lost = as_user(
        outsider, world, "object", "which", "team.tool", CTX_PATH=f"/ctx/shared/{SPACE}/tool"
    )
    assert lost.returncode == 1 and lost.stderr.startswith("ctx: ENOENT: "), lost
    assert str(path) in lost.stderr and "Permission denied" in lost.stderr, lost


def test_the_user_tier_is_the_callers_own_root_included(world, team):
    """R-4, T-4, T-8a: ``--tier user`` as root goes into ``home/0/tool``; as a user whose
    home root made, into ``home/<uid>/tool``, the user's.  Each finds its own copy with its
    default ``CTX_PATH``; ``list --tier user`` shows each only its own; a user's
    ``list --tier user`` before any install lists nothing (exit 0)."""
    member, outsider, _ = team
    src = new_scratch_dir(world.top, "u")
    theirs = world.manifest("mine", "member", directory=src / "m")
    own(member, src)
    world.install(world.manifest("mine", "root"), "user")
    root_copy = world.storage / "home" / "0" / "tool" / "mine"
    assert root_copy.stat().st_uid == 0

    home = make_home(world, member)
    done = as_user(member, world, "object", "install", theirs, "--tier", "user", cwd=src)
    assert done.returncode == 0, done
    member_copy = home / "tool" / "mine"
    assert done.stdout == f"installed mine in tier user: {member_copy}\n", done
    assert member_copy.stat().st_uid == member.uid

    assert world.ctx("object", "which", "mine").out == f"{root_copy}\n"
    found = as_user(member, world, "object", "which", "mine")
    assert found.returncode == 0 and found.stdout == f"{member_copy}\n", found
    assert [o["path"] for o in world.listed("--tier", "user")] == [str(root_copy)]
    mine = json.loads(as_user(member, world, "object", "list", "--tier", "user", "--json").stdout)
    assert [(o["path"], o["description"]) for o in mine] == [
        (str(member_copy), "mine version member")
    ]
    nothing = as_user(outsider, world, "object", "list", "--tier", "user", "--json")
    assert nothing.returncode == 0 and json.loads(nothing.stdout) == [], nothing


def test_an_agents_ctx_path_takes_its_own_user_tier_then_the_space_never_roots(world, team):
    """T-4, P-6, R-4, X-1: ``pick`` in the space (allowed for the agent), in root's user tier
    and, later, in the user tier of the agent's uid.  The agent's call runs the space's
    copy: root's ``home/0/tool`` is on no agent's path.  Once the agent's uid installed its
    own copy, that copy is the hit: refused at step 6 (it is the agent's own, not the
    host's), and the space's copy does not stand in.  When root takes that tier over, the
    user-tier copy runs; ``which`` as the agent's uid names the same file all along."""
    member, _, gid = team
    tier = make_space(world, gid)
    world.install(world.manifest("pick", "space"), f"shared:{SPACE}")
    with (tier / "pick.d" / "policy").open("a") as policy:
        policy.write("allow mate_t tool:pick execute\n")
    world.install(world.manifest("pick", "root"), "user")
    with (world.storage / "home" / "0" / "tool" / "pick.d" / "policy").open("a") as policy:
        policy.write("allow mate_t tool:pick execute\n")
    mate = {"name": "mate", "label": "mate_t", "tools": ["pick"], "shared": {SPACE: ["read"]}}
    created = world.ctx("agent", "create", "-", "--user", MEMBER, input=json.dumps(mate))
    assert created.rc == 0, created

    def call() -> dict:
        return result_frame(world.ctx("run", "--native", "--agent", "mate", "pick", input="{}"))

    first = call()
    assert first["status"] == "ok" and first["output"] == {"version": "space"}, first

    home = world.storage / "home" / str(member.uid)
    if not home.exists():
        make_home(world, member)
    os.chown(home, member.uid, member.gid)
    src = new_scratch_dir(world.top, "p")
    theirs = world.manifest("pick", "user", directory=src / "m")
    own(member, src)
    done = as_user(member, world, "object", "install", theirs, "--tier", "user", cwd=src)
    assert done.returncode == 0, done
    user_copy = home / "tool" / "pick"
    with (home / "tool" / "pick.d" / "policy").open("a") as policy:
        policy.write("allow mate_t tool:pick execute\n")
    found = as_user(member, world, "object", "which", "pick")
    assert found.stdout == f"{user_copy}\n", found

    refused = call()
    error = refused["error"]
    assert refused["status"] == "error" and (error["error"], error["step"]) == ("EACCES", 6), (
        refused
    )
    assert f"home/{member.uid}" in error["message"], error
    assert refused["output"] is None, refused

    for item in (home, home / "tool", *(home / "tool").rglob("*")):
        os.chown(item, 0, 0, follow_symlinks=False)
    ran = call()
    assert ran["status"] == "ok" and ran["output"] == {"version": "user"}, ran


# =================================================== what exec may name (T-8, docs/tools.md)


def test_exec_a_link_a_directory_a_fifo_missing_or_over_the_limit_is_refused(world):
    """T-8: a program reached through a link (the file itself, or a directory on its way)
    is ELOOP; a directory or a FIFO is EINVAL, never waited on; a missing one is EINVAL
    naming it; one over 64 MiB is EINVAL naming the limit.  ``check --json`` gives the same errno
    as ``install``; each install is refused (exit 1) with the storage root as it was."""
    real = world.manifest("real.prog").parent / "prog"
    cases: dict[str, tuple[str, str]] = {}

    def case(name: str, errno_name: str, fragment: str) -> Path:
        directory = world.top / "cases" / name
        directory.mkdir(parents=True)
        cases[name] = (errno_name, fragment)
        return directory

    (case("x.link", "ELOOP", "symbolic link") / "prog").symlink_to(real)
    linked = case("x.dirlink", "ELOOP", "symbolic link")
    (linked / "bin").symlink_to(real.parent)
    (case("x.dir", "EINVAL", "not a regular file") / "prog").mkdir()
    os.mkfifo(case("x.fifo", "EINVAL", "not a regular file") / "prog")
    case("x.missing", "EINVAL", "No such file or directory")
    with (case("x.huge", "EINVAL", "67108864") / "prog").open("wb") as big:
        big.truncate(64 * 1024 * 1024 + 1)
    before = snapshot(world.storage)
    for name, (errno_name, fragment) in cases.items():
        directory = world.top / "cases" / name
        exec_ = "bin/prog" if name == "x.dirlink" else "prog"
        manifest = world.manifest(name, directory=directory, exec_=exec_, write_program=False)
        if name in ("x.dirlink", "x.fifo", "x.huge"):
            checked = world.ctx("object", "check", "--json", manifest, timeout=20)
            assert checked.rc == 1 and checked.json()[0]["codes"] == [errno_name], (name, checked)
        r = world.ctx("object", "install", manifest, "--tier", "system", timeout=20)
        assert r.rc == 1 and r.err.startswith(f"ctx: {errno_name}: ") and fragment in r.err, (
            name,
            r,
        )
        assert "Traceback" not in r.err, r
    assert snapshot(world.storage) == before


def test_a_setuid_setgid_or_non_executable_program_is_installed_plain_0755(world):
    """T-8, T-4: the installed executable is mode 0755 whatever the program's mode was: a
    setuid or setgid program loses those bits, a program without an execute bit gets one
    (``which`` finds it); its bytes are the program's, the ``origin`` digest says so; a
    ``..`` in a root-owned manifest's ``exec`` is honoured."""
    for name, mode in (("m.suid", 0o4755), ("m.sgid", 0o2755), ("m.plain", 0o644)):
        manifest = world.manifest(name, mode=mode)
        (manifest.parent / "prog").chmod(mode)
        world.install(manifest, "system")
        path = world.storage / "tool" / name
        assert stat.S_IMODE(path.stat().st_mode) == 0o755, (name, oct(path.stat().st_mode))
        assert path.read_bytes() == (manifest.parent / "prog").read_bytes()
        origin = json.loads((world.storage / "tool" / f"{name}.d" / "origin").read_text())
        assert origin["sha256"] == sha256(path)
    assert world.ctx("object", "which", "m.plain").out == f"{world.storage / 'tool' / 'm.plain'}\n"

    up = world.top / "updir"
    world.manifest("m.up", directory=up / "sub", exec_="../prog")
    (up / "prog").write_text("#!/bin/sh\necho up\n")
    world.install(up / "sub" / "manifest.json", "system")
    assert (world.storage / "tool" / "m.up").read_text() == "#!/bin/sh\necho up\n"


def test_another_uids_manifest_may_name_only_what_it_could_read_below_it(world, team):
    """T-8, docs/tools.md "How the manifest and its program are read": root installs
    manifests a user wrote.  ``exec`` with ``..`` or an absolute path is EACCES; a program
    below a directory the user may not pass is EACCES naming that directory; the user's
    link to root's own private manifest does not hand over root's private program.  A
    manifest the installing user may not read is EACCES, nothing checked.  Each refusal is
    exit 1 with nothing installed."""
    _, outsider, _ = team
    drop = new_scratch_dir(world.top, "drop")
    world.manifest("u.dotdot", directory=drop / "a" / "sub", exec_="../prog")
    (drop / "a" / "prog").write_text("#!/bin/sh\necho a\n")
    world.manifest("u.abs", directory=drop / "b", exec_=str(drop / "a" / "prog"))
    world.manifest("u.priv", directory=drop / "c", exec_="p/prog")
    own(outsider, drop)
    private = drop / "c" / "p"
    private.mkdir()
    (private / "prog").write_text("#!/bin/sh\necho private\n")
    private.chmod(0o700)

    secret_dir = world.top / "secret"
    secret = "#!/bin/sh\necho root-only-4711\n"
    world.manifest("u.link", directory=secret_dir, program=secret)
    (secret_dir / "prog").chmod(0o600)
    secret_dir.chmod(0o700)
    link = drop / "link.json"
    link.symlink_to(secret_dir / "manifest.json")
    os.chown(link, outsider.uid, outsider.gid, follow_symlinks=False)

    before = snapshot(world.storage)
    expected = {
        drop / "a" / "sub" / "manifest.json": ("EACCES", "outside the manifest's directory"),
        drop / "b" / "manifest.json": ("EACCES", "outside the manifest's directory"),
        drop / "c" / "manifest.json": ("EACCES", f"may not pass {private}"),
    }
    for manifest, (errno_name, fragment) in expected.items():
        r = world.ctx("object", "install", manifest, "--tier", "system")
        assert r.rc == 1 and r.err.startswith(f"ctx: {errno_name}: "), (manifest, r)
        assert fragment in r.err, r
    r = world.ctx("object", "install", link, "--tier", "system")
    assert r.rc == 1 and "Traceback" not in r.err, r
    assert snapshot(world.storage) == before
    assert not any(
        b"root-only-4711" in entry[1]
        for entry in snapshot(world.storage).values()
        if entry[0] == "file"
    )

    home = make_home(world, outsider)
    mine = world.manifest("u.unreadable", directory=world.top / "rootonly")
    mine.chmod(0o600)
    r = as_user(outsider, world, "object", "install", mine, "--tier", "user")
    assert r.returncode == 1 and r.stderr.startswith("ctx: EACCES: "), r
    assert "nothing was checked or installed" in r.stderr, r
    assert not (home / "tool" / "u.unreadable").exists()


def test_a_manifest_that_is_a_directory_a_fifo_missing_or_over_1_mib_is_refused(world):
    """T-8: the manifest itself must be a regular file of at most 1 MiB: a directory or a
    FIFO is EINVAL (never waited on), a missing one ENOENT, a larger one EINVAL naming the
    limit; nothing is installed."""
    base = world.manifest("m.kinds")
    fifo = world.top / "fifo.json"
    os.mkfifo(fifo)
    big = world.top / "big.json"
    document = json.loads(base.read_text())
    document["description"] = "x" * (1 << 20)
    big.write_text(json.dumps(document))
    before = snapshot(world.storage)
    for manifest, errno_name, fragment in (
        (base.parent, "EINVAL", "not a regular file"),
        (fifo, "EINVAL", "not a regular file"),
        (world.top / "none.json", "ENOENT", "No such file"),
        (big, "EINVAL", "1048576"),
    ):
        r = world.ctx("object", "install", manifest, "--tier", "system", timeout=20)
        assert r.rc == 1 and r.err.startswith(f"ctx: {errno_name}: "), (manifest, r)
        assert fragment in r.err, r
    assert snapshot(world.storage) == before


# ==================================== a storage root of a user's, installed into by root (T-8)


def users_root_with_link(world: World, user: UnprivilegedUser, link: str) -> tuple[Path, Path]:
    """A storage root of ``user``'s own, in which ``user`` put ``link`` (relative to it) as a
    symbolic link to a root-owned directory outside it that holds ``tool/``; the root and
    the outside directory."""
    root = world.top / "users-root"
    shutil.copytree(world.storage, root, symlinks=True)
    own(user, root)
    outside = world.top / "outside"
    (outside / "tool").mkdir(parents=True)
    (root / link).parent.mkdir(parents=True, exist_ok=True)
    own(user, (root / link).parent)
    if (root / link).exists():
        shutil.rmtree(root / link)
    made = run_as(user, ["ln", "-s", str(outside), str(root / link)])
    assert made.returncode == 0, made
    return root, outside


def test_root_installing_into_a_users_root_is_refused_at_a_linked_home(world, team):
    """T-8, R-4: in a storage root a user owns, the user made ``home/0`` a link to a
    directory outside it.  Root's ``--tier user`` install is refused (exit 1, with an
    errno) and writes nothing through the link."""
    _, outsider, _ = team
    root, outside = users_root_with_link(world, outsider, "home/0")
    manifest = world.manifest("through.home")
    r = ctx_run("object", "install", "--source", root, manifest, "--tier", "user")
    assert r.rc == 1 and r.err.startswith("ctx: E"), r
    assert os.listdir(outside / "tool") == []


def test_root_installing_into_a_users_root_is_refused_at_a_linked_space(world, team):
    """T-8, X-1, R-1: in a storage root a user owns, the user made ``shared/<space>`` a link
    to a root-owned directory outside the root that holds ``tool/``.  Root's install into
    ``shared:<space>`` must be refused, as the linked ``home/0`` is (and as ``ctx bootstrap``
    refuses to repair a tier reached through a link), and write nothing outside the root."""
    _, outsider, _ = team
    root, outside = users_root_with_link(world, outsider, f"shared/{SPACE}")
    manifest = world.manifest("through.space")
    r = ctx_run("object", "install", "--source", root, manifest, "--tier", f"shared:{SPACE}")
    assert os.listdir(outside / "tool") == [], r
    assert r.rc == 1 and r.err.startswith("ctx: E"), r


# ===================================== reinstalls in two tiers while readers look (T-8a)


def test_reinstalls_in_two_tiers_while_which_list_and_run_read_never_show_half_a_pair(world, team):
    """T-8, T-8a, T-4: ``flux`` in the system tier and in the space, allowed for agent
    ``mate``; versions are installed into both tiers one after the other while ``which``,
    ``list`` and the agent's calls read.  ``which`` always names the system copy; ``list``
    always lists one copy per tier, available, described as a version installed there;
    every call runs the system copy (first on the agent's path) and prints a version
    installed there; a reader on the files always finds each executable with its controls.
    At the end each tier holds its last version whole and nothing hidden."""
    _, _, gid = team
    space_tier = make_space(world, gid)
    system_tier = world.storage / "tool"
    tiers = {"system": system_tier, f"shared:{SPACE}": space_tier}
    versions = {"system": ["y1", "y2", "y3", "y4"], f"shared:{SPACE}": ["s1", "s2", "s3", "s4"]}
    for tier, directory in tiers.items():
        world.install(world.manifest("flux", versions[tier][0]), tier)
        with (directory / "flux.d" / "policy").open("a") as policy:
            policy.write("allow mate_t tool:flux execute\n")
    mate = {"name": "mate", "label": "mate_t", "tools": ["flux"], "shared": {SPACE: ["read"]}}
    created = world.ctx("agent", "create", "-", "--user", MEMBER, input=json.dumps(mate))
    assert created.rc == 0, created
    manifests = {
        tier: [world.manifest("flux", v) for v in names[1:]] for tier, names in versions.items()
    }

    problems: list[str] = []
    done = threading.Event()

    def installer() -> None:
        try:
            for pair in zip(*manifests.values(), strict=True):
                for tier, manifest in zip(manifests, pair, strict=True):
                    r = world.ctx("object", "install", manifest, "--tier", tier)
                    if r.rc != 0:
                        problems.append(repr(r))
        finally:
            done.set()

    def files_reader() -> None:
        while not done.is_set():
            for directory in tiers.values():
                try:
                    entry = (directory / "flux").stat()
                    for control in ("name", "description", "schema", "cap", "policy", "status"):
                        (directory / "flux.d" / control).read_bytes()
                except OSError as exc:
                    problems.append(f"files: {exc}")
                    return
                if not entry.st_mode & 0o111:
                    problems.append(f"files: {directory}/flux not executable")

    threads = [threading.Thread(target=installer), threading.Thread(target=files_reader)]
    for thread in threads:
        thread.start()
    rounds = 0
    try:
        while not done.is_set() and not problems:
            rounds += 1
            which = world.ctx("object", "which", "flux")
            if which.out != f"{system_tier / 'flux'}\n":
                problems.append(f"which: {which!r}")
            seen = [o for o in world.listed() if o["name"] == "flux"]
            if [(o["tier"], o["status"]) for o in seen] != [
                ("system", "available"),
                (f"shared:{SPACE}", "available"),
            ]:
                problems.append(f"list: {seen}")
            for o in seen:
                if o["description"].split()[-1] not in versions[o["tier"]]:
                    problems.append(f"list: {o}")
            ran = result_frame(world.ctx("run", "--native", "--agent", "mate", "flux", input="{}"))
            if ran["status"] != "ok" or ran["output"]["version"] not in versions["system"]:
                problems.append(f"run: {json.dumps(ran)}")
    finally:
        done.wait(60)
        for thread in threads:
            thread.join(60)
    assert problems == [], problems
    assert rounds >= 1
    for tier, directory in tiers.items():
        described = (directory / "flux.d" / "description").read_text()
        assert described.startswith(f"flux version {versions[tier][-1]}"), described
        assert f'"{versions[tier][-1]}"' in (directory / "flux").read_text()
        assert hidden(directory) == [], hidden(directory)
