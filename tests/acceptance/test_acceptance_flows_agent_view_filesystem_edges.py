"""An agent's view of ``/ctx`` (``ctx mount --as coder``, SPEC §13 F-1 with T-5, S-6 and the
chain of §5; docs/mount.md "What each view shows", "What the mount promises") at its edges,
driven by a program running as the agent's own unprivileged uid and, so that the view's own
refusals show where mode bits would let anything pass, by root: system calls that cross the
boundary between a visible and a hidden name, or between a writable place (the agent's home,
space ``team``) and a read-only one (space ``audit``, the host's controls, the manual bundle)
— renames, links and exchanges toward and from a hidden space, over a hidden session's name,
into and out of session directories, in the home another agent of the same uid shares; every
inspecting call on a hidden name (it must answer as an absent name does: ``ENOENT``); names
reached again through ``/proc/self/fd``, directory descriptors and a working directory
after the agent's policy, identity, groups, mount control or storage root changed under
them (the next call decided afresh within a second, what was open before kept as the page
says); listings of partly hidden directories held open while grants change; and one file
seen through the host's view and the agent's view at once (bytes, sizes, times, modes, inode
numbers and links agree, locks are per mount).  After each refusal the storage root holds
exactly what it held."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import select
import shutil
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    ROOT_ENTRIES,
    clean_env,
    needs_fuse,
    needs_fuse_as_root,
    new_scratch_dir,
    scratch_top,
    serving,
    wait_for,
    write_durably,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, find_or_create_user

SCRATCH = scratch_top(__file__)
AGENT, LABEL = "coder", "coder_t"
OTHER = "peer"  # a second agent of the same uid, granted nothing
WRITABLE, READ_ONLY, HIDDEN = "team", "audit", "secret"
DOCS = "cortexfs-docs"
# Sessions kept in space team: the other agent's "vis" (coder may read it) and "hid" (it may
# not); coder's own "mine" (read and write) and "bare" (read and write, empty) and "looked"
# (read only).  In the home: the other agent's "h-vis" (read) and "h-hid" (not granted).
GRANTS = [
    f"allow {LABEL} session:vis read",
    f"allow {LABEL} session:mine read",
    f"allow {LABEL} session:mine write",
    f"allow {LABEL} session:bare read",
    f"allow {LABEL} session:bare write",
    f"allow {LABEL} session:looked read",
    f"allow {LABEL} session:h-vis read",
    f"allow {LABEL} shared:{DOCS} write",  # the manuals stay read-only whatever it says (D-1)
]
# docs/mount.md: the mount keeps an answer half a second, the kernel half a second more.
WITHIN = 3.0
SEQUENCE = itertools.count()

pytestmark = [needs_fuse_as_root, needs_fuse]  # a mount serving other uids needs root

# ------------------------------------------------------------------------------ the world


@dataclass
class World:
    """A storage root with spaces ``team`` (agent ``coder`` reads and writes it), ``audit``
    (it only reads) and ``secret`` (not granted), all of the test user's group; agents
    ``coder`` and ``peer`` run as that user, whose home exists; sessions as in
    :data:`GRANTS`.  ``host`` is the host's view, ``view`` coder's, both mounted."""

    top: Path
    storage: Path
    host: Path
    view: Path
    user: UnprivilegedUser

    def data(self, space: str = WRITABLE) -> Path:
        return self.storage / "shared" / space / "data"

    @property
    def home(self) -> Path:
        return self.storage / "home" / str(self.user.uid)

    @property
    def controls(self) -> Path:
        return self.storage / "agent" / f"{AGENT}.d"

    def session(self, agent: str, name: str, space: str | None = WRITABLE) -> Path:
        place = self.storage / "shared" / space if space else self.home
        return place / "agent" / agent / "session" / name

    def through(self, mount: Path, path: Path) -> Path:
        """``path`` (below the storage root) as ``mount`` shows it."""
        return mount / path.relative_to(self.storage)

    def v(self, path: Path) -> str:
        """``path`` as the agent's view shows it, as text for the agent's program."""
        return str(self.through(self.view, path))

    def fresh(self, base: Path, label: str) -> Path:
        """A new directory below ``base`` on the storage root, the test user's, mode 2775."""
        path = base / f"{label}-{next(SEQUENCE)}"
        path.mkdir()
        os.chown(path, self.user.uid, self.user.gid)
        path.chmod(0o2775)
        return path

    def owned_file(self, path: Path, text: str, mode: int = 0o664) -> Path:
        path.write_text(text)
        os.chown(path, self.user.uid, self.user.gid)
        path.chmod(mode)
        return path

    def edit_policy(self, drop: list[str] = (), add: list[str] = ()) -> None:
        """The administrator's edit of ``agent/coder.d/policy``: a whole new file renamed into
        place, as an editor saves it."""
        policy = self.controls / "policy"
        rules = [line for line in policy.read_text().splitlines() if line not in drop]
        write_durably(self.controls, "policy", ("\n".join([*rules, *add]) + "\n").encode())
        policy.chmod(0o644)

    def write_control(self, name: str, data: bytes) -> None:
        write_durably(self.controls, name, data)
        (self.controls / name).chmod(0o644)


def make_session(path: Path, user: UnprivilegedUser, line: str = '{"n": 1}\n') -> Path:
    """A session directory as the runner makes one: the agent's uid, the place's group."""
    for directory in reversed([path, *list(path.parents)[:3]]):
        if not directory.exists():
            directory.mkdir()
            os.chown(directory, user.uid, user.gid)
            directory.chmod(0o2770)
    if line is not None:
        events = path / "events.jsonl"
        events.write_text(line)
        os.chown(events, user.uid, user.gid)
        events.chmod(0o660)
    return path


def ctx_at_once(*commands: tuple[list[str], dict | None]) -> None:
    """``ctx ARGS`` for each ``(ARGS, request)``, all started at once; each must succeed."""
    running = []
    for argv, req in commands:
        proc = subprocess.Popen(
            [*CTX_ARGV, *map(str, argv)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=clean_env(),
        )  # fmt: skip
        running.append((argv, proc, json.dumps(req).encode() if req else b""))
    for argv, proc, data in running:
        out, err = proc.communicate(data, timeout=60)
        assert proc.returncode == 0, (argv, out, err)


@contextlib.contextmanager
def built(template: Path, *, full: bool) -> Iterator[World]:
    """The world of :class:`World`; without ``full`` no host's view and no agent ``peer``
    (its sessions are there all the same)."""
    user = find_or_create_user()
    top = new_scratch_dir(SCRATCH)
    storage = copy_of_root(template, top / "storage")
    try:
        spaces = [
            (["shared", "create", space, "--group", user.gid, "--storage", storage], None)
            for space in (WRITABLE, READ_ONLY, HIDDEN)
        ]
        ctx_at_once(*spaces)
        requests = [
            {
                "name": AGENT,
                "label": LABEL,
                "tools": [],
                "shared": {WRITABLE: ["read", "write"], READ_ONLY: ["read"]},
            },
            {"name": OTHER, "label": f"{OTHER}_t", "tools": []},
        ]
        ctx_at_once(
            *[
                (["agent", "create", "--storage", storage, "--user", user.name, "-"], req)
                for req in requests[: 2 if full else 1]
            ]
        )
        home = storage / "home" / str(user.uid)  # R-4, made by the host (docs/sessions.md)
        home.mkdir(mode=0o755)
        os.chown(home, user.uid, user.gid)
        host, view = top / "host", top / "view"
        host.mkdir(mode=0o755)
        view.mkdir(mode=0o755)
        world = World(top, storage, host, view, user)
        world.edit_policy(add=GRANTS)
        for agent, name in ((OTHER, "vis"), (OTHER, "hid"), (AGENT, "mine"), (AGENT, "looked")):
            make_session(world.session(agent, name), user)
        make_session(world.session(AGENT, "bare"), user, line=None)
        for name in ("h-vis", "h-hid"):
            make_session(world.session(OTHER, name, space=None), user)
        make_session(world.session(AGENT, "c1", space=None), user)
        (world.data(HIDDEN) / "s").write_text("hidden\n")
        with contextlib.ExitStack() as mounts:
            if full:
                mounts.enter_context(serving(storage, host))
            mounts.enter_context(serving(storage, view, "--as", AGENT))
            yield world
    finally:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            where = line.split()[4]
            if where.startswith(str(top) + "/"):
                subprocess.run(["umount", "-l", where], check=False)
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def world(_template: Path) -> Iterator[World]:
    """One world for the tests that change no control (each works in directories of its own)."""
    with built(_template, full=True) as made:
        yield made


@pytest.fixture
def own_world(_template: Path) -> Iterator[World]:
    """A world of the test's own, whose agent's controls the test changes."""
    with built(_template, full=False) as made:
        yield made


# ------------------------------------------------------------------------ the agent's program

# Runs as the agent's uid (or root), keeps descriptors and a working directory between the
# test's steps: each line on stdin is a JSON string of Python statements, which set ``r``;
# the answer is ``{"r": r}`` on one line.  ``e(f, ...)`` is f's result ("ok" for None) or
# the name of the errno it raised; ``done(f, ...)`` is "ok" or that name.
DRIVER = r"""
import ctypes, errno, fcntl, json, os, stat, sys, traceback
libc = ctypes.CDLL(None, use_errno=True)
def _raise(path=None):
    n = ctypes.get_errno()
    raise OSError(n, os.strerror(n), path)
def e(f, *a, **k):
    try:
        r = f(*a, **k)
    except OSError as x:
        return errno.errorcode.get(x.errno, str(x.errno))
    return "ok" if r is None else r
def done(f, *a, **k):
    return e(lambda: (f(*a, **k), None)[1])
def opened(path, flags, mode=0o644, **kw):
    os.close(os.open(path, flags, mode, **kw))
def renameat2(a, b, flags):
    if libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), flags) != 0:
        _raise(a)
def access(path, mode):
    if libc.access(os.fsencode(path), mode) != 0:
        _raise(path)
def spawn(path):
    os.waitpid(os.posix_spawn(path, [path], {}), 0)
def text(path):
    with open(path, "rb") as f:
        return f.read().decode()
def facts(st):
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, stat.S_IMODE(st.st_mode),
            st.st_uid, st.st_gid, st.st_nlink]
ns = dict(globals())
for line in sys.stdin:
    ns.pop("r", None)
    try:
        exec(json.loads(line), ns)
        answer = {"r": ns.get("r")}
    except Exception:
        answer = {"crash": traceback.format_exc()}
    print(json.dumps(answer), flush=True)
"""


class Program:
    """:data:`DRIVER` running as ``user`` (its own group only, as the agent's identity gives
    it), or as root when ``user`` is None."""

    def __init__(self, user: UnprivilegedUser | None) -> None:
        ids = {}
        if user is not None:
            ids = {"user": user.uid, "group": user.gid, "extra_groups": [user.gid]}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", DRIVER],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, cwd="/",
            env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"},
            start_new_session=True, **ids,
        )  # fmt: skip

    def __call__(self, code: str, **values: object):
        """``r`` after ``code`` ran with ``values`` bound (paths given as text)."""
        bound = "".join(f"{name} = {value!r}\n" for name, value in values.items())
        self.proc.stdin.write(json.dumps(bound + textwrap.dedent(code)) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        assert ready, "the agent's program did not answer within a minute"
        answer = json.loads(self.proc.stdout.readline())
        assert "crash" not in answer, answer["crash"]
        return answer["r"]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def programs() -> Iterator[list[Program]]:
    made: list[Program] = []
    yield made
    for program in made:
        program.close()


@pytest.fixture
def agent(world: World, programs: list[Program]) -> Program:
    programs.append(Program(world.user))
    return programs[-1]


@pytest.fixture
def own_agent(own_world: World, programs: list[Program]) -> Program:
    programs.append(Program(own_world.user))
    return programs[-1]


def tree(top: Path) -> dict[str, tuple]:
    """Each entry under ``top`` (and ``top``), never following links: kind, mode, owner,
    size, mtime, ctime and content."""
    shown: dict[str, tuple] = {}
    for path in [top, *sorted(top.rglob("*"))]:
        st = path.lstat()
        content = path.read_bytes() if stat.S_ISREG(st.st_mode) else b""
        shown[str(path.relative_to(top))] = (
            stat.S_IFMT(st.st_mode),
            stat.S_IMODE(st.st_mode),
            st.st_uid,
            st.st_gid,
            0 if stat.S_ISDIR(st.st_mode) else st.st_size,
            st.st_mtime_ns,
            st.st_ctime_ns,
            content,
        )
    return shown


def listed(world: World, program: Program, *where: str) -> dict[str, list[str]]:
    """What ``program`` lists of each directory ``where`` (relative to the view's root)."""
    paths = {name: str(world.view / name) for name in where}
    return program(
        "r = {k: e(lambda: sorted(os.listdir(p))) for k, p in paths.items()}", paths=paths
    )


# ---------------------------------------------------------- hidden names, inspected


INSPECT = """
def inspect(p, below, sibling):
    parent, name = os.path.split(p)
    pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return {
            "stat": done(os.stat, p),
            "lstat": done(os.lstat, p),
            "access F_OK": done(access, p, 0),
            "access R_OK below": done(access, below, 4),
            "readlink": done(os.readlink, p),
            "opendir": done(os.listdir, p),
            "O_PATH": done(opened, p, os.O_PATH),
            "O_PATH|O_NOFOLLOW": done(opened, p, os.O_PATH | os.O_NOFOLLOW),
            "chdir": done(os.chdir, p),
            "statvfs": done(os.statvfs, p),
            "getxattr": done(os.getxattr, p, "user.x"),
            "fstatat from its directory": done(os.stat, name, dir_fd=pfd),
            "relative to a working directory": done(lambda: (os.chdir(parent), os.stat(name))),
            "through a visible sibling and ..": done(os.stat, os.path.join(sibling, "..", name)),
            "open below": done(opened, below, os.O_RDONLY),
            "exec below": done(spawn, below),
            "truncate below": done(os.truncate, below, 0),
            "utime below": done(os.utime, below),
        }
    finally:
        os.close(pfd)
        os.chdir("/")
r = {label: inspect(*paths) for label, paths in pairs.items()}
"""


def test_every_inspecting_call_on_a_hidden_name_answers_as_on_an_absent_one(world, agent):
    """docs/mount.md (a name it may not see is ``ENOENT``) and F-1: for a space it is not
    granted, a tool it may not run, another agent's controls and another uid's home, each of
    eighteen calls that only look — ``stat``, ``access``, ``readlink``, ``opendir``,
    ``O_PATH`` opens, ``chdir``, ``statvfs``, ``getxattr``, ``fstatat`` from a directory
    descriptor, a path relative to a working directory, a path through a visible sibling and
    ``..``, an open, ``exec``, ``truncate`` or ``utime`` below it — answers ``ENOENT``, exactly
    as for a name that does not exist, while the same calls on a visible space succeed."""
    (world.storage / "home" / "0").mkdir(exist_ok=True, mode=0o755)
    v = world.view
    sh = v / "shared"
    space, tsh = str(sh / WRITABLE), str(v / "tool" / "tsh.d")
    own, home = str(v / "agent" / f"{AGENT}.d"), str(v / "home" / str(world.user.uid))
    pairs = {
        "hidden space": (str(sh / HIDDEN), str(sh / HIDDEN / "data" / "s"), space),
        "absent space": (str(sh / "nosuch"), str(sh / "nosuch" / "data" / "s"), space),
        "hidden tool": (str(v / "tool" / "shell.exec.d"), str(v / "tool" / "shell.exec"), tsh),
        "absent tool": (str(v / "tool" / "nosuch.d"), str(v / "tool" / "nosuch"), tsh),
        "other agent's controls": (str(v / "agent" / f"{OTHER}.d"),
                                   str(v / "agent" / f"{OTHER}.d" / "policy"), own),
        "absent agent's controls": (str(v / "agent" / "nosuch.d"),
                                    str(v / "agent" / "nosuch.d" / "policy"), own),
        "root's home": (str(v / "home" / "0"), str(v / "home" / "0" / "x"), home),
        "absent home": (str(v / "home" / "4242"), str(v / "home" / "4242" / "x"), home),
        "visible space": (space, str(v / "shared" / WRITABLE / "data"), space),
    }  # fmt: skip
    before = tree(world.storage / "shared" / HIDDEN)
    answers = agent(INSPECT, pairs=pairs)
    for hidden, absent in (("hidden space", "absent space"), ("hidden tool", "absent tool"),
                           ("other agent's controls", "absent agent's controls"),
                           ("root's home", "absent home")):  # fmt: skip
        assert answers[hidden] == answers[absent], (hidden, answers[hidden], answers[absent])
        assert set(answers[hidden].values()) == {"ENOENT"}, (hidden, answers[hidden])
    seen = answers["visible space"]
    assert {
        k: seen[k] for k in ("stat", "access F_OK", "opendir", "O_PATH", "chdir")
    } == dict.fromkeys(("stat", "access F_OK", "opendir", "O_PATH", "chdir"), "ok")
    assert seen["readlink"] == "EINVAL" and seen["getxattr"] in ("EOPNOTSUPP", "ENOTSUP", "ENODATA")
    assert tree(world.storage / "shared" / HIDDEN) == before


# ------------------------------------------------- crossing into and out of hidden places


TOWARD_HIDDEN = """
h = lambda *n: os.path.join(home, *n)
s = lambda *n: os.path.join(secret, *n)
t = lambda *n: os.path.join(team, *n)
r = {
    "rename a home file into it": done(os.rename, h("f"), s("f")),
    "rename a home directory into it": done(os.rename, h("d"), s("d")),
    "rename a space file into it": done(os.rename, t("f"), s("f")),
    "link a home file into it": done(os.link, h("f"), s("f")),
    "RENAME_NOREPLACE into it": done(renameat2, h("f"), s("f"), 1),
    "RENAME_EXCHANGE with its file": done(renameat2, h("f"), s("s"), 2),
    "rename its file to the home": done(os.rename, s("s"), h("s")),
    "link its file into the home": done(os.link, s("s"), h("s")),
    "rename over the hidden space's own name": done(os.rename, h("d"), secret_top),
    "mkdir of the hidden space's name": done(os.mkdir, secret_top),
}
"""


def test_moves_and_links_toward_or_out_of_a_hidden_space_are_enoent_and_move_nothing(world, agent):
    """docs/mount.md (a name it may not see is ``ENOENT``; writes only in the home and the
    spaces it may write): renames of files and directories from the agent's home or its
    writable space into space ``secret``, a hard link into it, ``RENAME_NOREPLACE`` and
    ``RENAME_EXCHANGE`` with a file there, a rename or link of its file out to the home, are
    ``ENOENT``; replacing or making the space's own name at ``shared/`` is ``EACCES`` (nothing
    is made at ``shared/``); nothing moves on the storage root."""
    home, team = world.fresh(world.home, "toward"), world.fresh(world.data(), "toward")
    world.owned_file(home / "f", "mine\n")
    (home / "d").mkdir()
    world.owned_file(home / "d" / "x", "x\n")
    world.owned_file(team / "f", "team\n")
    before = {p: tree(p) for p in (home, team, world.storage / "shared" / HIDDEN)}
    secret = world.storage / "shared" / HIDDEN
    answers = agent(TOWARD_HIDDEN, home=world.v(home), team=world.v(team),
                    secret=world.v(secret / "data"), secret_top=world.v(secret))  # fmt: skip
    moves = {k: v for k, v in answers.items() if "hidden space's" not in k}
    assert moves == dict.fromkeys(moves, "ENOENT"), answers
    assert answers["rename over the hidden space's own name"] == "EACCES"
    assert answers["mkdir of the hidden space's name"] == "EACCES"
    assert {p: tree(p) for p in before} == before


AT_A_HIDDEN_SESSION = """
results = {}
for name in ("hid", "nosuch"):
    target = os.path.join(sessions, name)
    results[name] = {
        "rename an empty directory over it": done(os.rename, empty, target),
        "rename a file over it": done(os.rename, f, target),
        "link a file to it": done(os.link, f, target),
        "mkdir": done(os.mkdir, target),
        "O_CREAT|O_EXCL": done(opened, target, os.O_WRONLY | os.O_CREAT | os.O_EXCL),
        "RENAME_NOREPLACE": done(renameat2, empty, target, 1),
        "RENAME_EXCHANGE": done(renameat2, empty, target, 2),
        "rmdir": done(os.rmdir, target),
        "events below it": done(opened, os.path.join(target, "events.jsonl"), os.O_RDONLY),
    }
results["listing"] = sorted(os.listdir(sessions))
r = results
"""


def test_nothing_is_put_over_a_hidden_session_and_its_name_answers_as_an_absent_one(world, agent):
    """S-6 and docs/mount.md ("Inside a space": sessions of another agent show only with
    ``session:<n> read``; session directories are never made, renamed or removed through
    the view): in space ``team``, which the agent may write, a rename of a directory or a
    file over another agent's hidden session, a link, ``mkdir``, ``O_EXCL``,
    ``RENAME_NOREPLACE``, ``RENAME_EXCHANGE`` and ``rmdir`` at its name each get exactly the
    answer an absent session name gets (never ``EEXIST`` or ``ENOTEMPTY``, which would tell it
    is there), and the session keeps its events."""
    team = world.fresh(world.data(), "over")
    (team / "empty").mkdir()
    world.owned_file(team / "f", "f\n")
    hidden = world.session(OTHER, "hid")
    before = tree(hidden), tree(team)
    answers = agent(AT_A_HIDDEN_SESSION, sessions=world.v(hidden.parent),
                    empty=world.v(team / "empty"), f=world.v(team / "f"))  # fmt: skip
    assert answers["hid"] == answers["nosuch"], answers
    assert answers["hid"] == {
        "rename an empty directory over it": "EACCES",
        "rename a file over it": "EACCES",
        "link a file to it": "EACCES",
        "mkdir": "EACCES",
        "O_CREAT|O_EXCL": "EACCES",
        "RENAME_NOREPLACE": "EACCES",
        "RENAME_EXCHANGE": "ENOENT",
        "rmdir": "ENOENT",
        "events below it": "ENOENT",
    }
    assert answers["listing"] == ["vis"]
    assert (tree(hidden), tree(team)) == before


SESSION_DIRECTORIES = """
p = lambda *n: os.path.join(agents, *n)
d = lambda *n: os.path.join(data, *n)
r = {
    "rename own session": done(os.rename, p("coder", "session", "mine"), p("coder", "session", "mine2")),
    "rename own session out to data": done(os.rename, p("coder", "session", "mine"), d("mine")),
    "rmdir own empty session": done(os.rmdir, p("coder", "session", "bare")),
    "mkdir a new session": done(os.mkdir, p("coder", "session", "new")),
    "rename a directory in as a session": done(os.rename, d("dir"), p("coder", "session", "new")),
    "rename coder's directory": done(os.rename, p("coder"), d("coder")),
    "mkdir an agent directory": done(os.mkdir, p("ghost")),
    "a file beside session/": done(opened, p("coder", "notes"), os.O_WRONLY | os.O_CREAT),
    "rename a file into its own session": done(os.rename, d("f"), p("coder", "session", "mine", "f")),
    "chmod in its own session": done(os.chmod, p("coder", "session", "mine", "events.jsonl"), 0o640),
    "append in its own session": done(lambda: open(p("coder", "session", "mine", "events.jsonl"), "a").write("{}\\n")),
    "append in a read-only session": done(lambda: open(p("coder", "session", "looked", "events.jsonl"), "a").write("{}\\n")),
    "chmod in a read-only session": done(os.chmod, p("coder", "session", "looked", "events.jsonl"), 0o640),
    "utime in a read-only session": done(os.utime, p("coder", "session", "looked", "events.jsonl"), ns=(1, 1)),
    "truncate in a read-only session": done(os.truncate, p("coder", "session", "looked", "events.jsonl"), 0),
    "link into a read-only session": done(os.link, d("g"), p("coder", "session", "looked", "g")),
    "unlink in a read-only session": done(os.unlink, p("coder", "session", "looked", "events.jsonl")),
    "read in another agent's readable session": text(p("peer", "session", "vis", "events.jsonl")),
    "create in another agent's readable session": done(opened, p("peer", "session", "vis", "x"), os.O_WRONLY | os.O_CREAT),
}
"""  # noqa: E501


def test_session_directories_stay_put_and_change_inside_only_with_the_session_grant(world, agent):
    """S-6 and docs/mount.md ("Inside a space"): through the view the directories that hold
    sessions — each agent's directory, its ``session/``, each session — are never
    made, renamed or removed (``EACCES``), the agent's own ones included, while the rest of
    its directory is as the space is; what a session holds changes with ``session:<n>
    write`` (a file renamed in, a chmod, an append) and only reads without it (append,
    chmod, utime, truncate, link in and unlink: ``EACCES``), whoever owns the files."""
    data = world.fresh(world.data(), "sessions")
    (data / "dir").mkdir()
    world.owned_file(data / "f", "moved in\n")
    world.owned_file(data / "g", "linked\n")
    looked = world.session(AGENT, "looked")
    before = tree(looked), tree(world.session(AGENT, "bare"))
    agents = world.storage / "shared" / WRITABLE / "agent"
    answers = agent(SESSION_DIRECTORIES, agents=world.v(agents), data=world.v(data))
    changes_in_own = ("a file beside session/", "rename a file into its own session",
                      "chmod in its own session", "append in its own session")  # fmt: skip
    assert {k: answers[k] for k in changes_in_own} == dict.fromkeys(changes_in_own, "ok")
    assert answers.pop("read in another agent's readable session") == '{"n": 1}\n'
    refused = {k: v for k, v in answers.items() if k not in changes_in_own}
    assert refused == dict.fromkeys(refused, "EACCES"), refused
    assert (tree(looked), tree(world.session(AGENT, "bare"))) == before
    mine = world.session(AGENT, "mine")
    assert (mine / "f").read_text() == "moved in\n"
    assert stat.S_IMODE((mine / "events.jsonl").stat().st_mode) == 0o640
    assert (mine / "events.jsonl").read_text().endswith("{}\n")
    assert sorted(os.listdir(agents / AGENT / "session")) == ["bare", "looked", "mine"]
    assert (data / "dir").is_dir() and not (world.session(OTHER, "vis") / "x").exists()


HOME_AGENTS = """
a = lambda *n: os.path.join(home, "agent", *n)
h = lambda *n: os.path.join(home, *n)
os.makedirs(h(scratch, "fake", "session", "s1"))
r = {
    "listing agent/": sorted(os.listdir(a())),
    "peer's sessions listed": sorted(os.listdir(a("peer", "session"))),
    "hidden session": done(os.stat, a("peer", "session", "h-hid")),
    "rename peer's readable session": done(os.rename, a("peer", "session", "h-vis"), h(scratch, "x")),
    "create in peer's readable session": done(opened, a("peer", "session", "h-vis", "x"), os.O_WRONLY | os.O_CREAT),
    "rename a directory over peer's directory": done(os.rename, h(scratch, "fake"), a("peer")),
    "mkdir an agent directory": done(os.mkdir, a("ghost")),
    "rename a directory in as an agent's": done(os.rename, h(scratch, "fake"), a("ghost")),
    "rename its own directory away": done(os.rename, a("coder"), h(scratch, "mine")),
    "rename another directory in as its own": done(os.rename, h(scratch, "fake"), a("coder")),
    "listing its own sessions": sorted(os.listdir(a("coder", "session"))),
    "rename its own directory to another agent's name": done(os.rename, a("coder"), a("ghost")),
    "exchange its own directory with peer's": done(renameat2, a("coder"), a("peer"), 2),
    "rename agent/ itself": done(os.rename, a(), h(scratch, "agents")),
    "mkdir a session of its own": done(os.mkdir, a("coder", "session", "s2")),
}
"""  # noqa: E501


def test_in_a_home_shared_with_another_agent_only_its_own_agent_directory_moves(world, agent):
    """docs/mount.md (in the agent's home the sessions of the other agents that run as its
    uid are kept as in a space; its own ``home/<uid>/agent/<self>/`` is as the home is):
    agent ``peer`` runs as coder's uid; in coder's view peer's session ``h-hid`` is
    hidden and ``h-vis`` only readable, peer's directory is neither replaced nor made
    again, no new agent directory appears; coder's own directory may be moved away and a
    directory moved in in its place, but never under another agent's name."""
    scratch = world.fresh(world.home, "home-agents").name
    mine_before = tree(world.home / "agent" / AGENT)
    peers = world.home / "agent" / OTHER
    before = tree(peers)
    answers = agent(HOME_AGENTS, home=world.v(world.home), scratch=scratch)
    try:
        assert answers == {
            "listing agent/": [AGENT, OTHER],
            "peer's sessions listed": ["h-vis"],
            "hidden session": "ENOENT",
            "rename peer's readable session": "EACCES",
            "create in peer's readable session": "EACCES",
            "rename a directory over peer's directory": "EACCES",
            "mkdir an agent directory": "EACCES",
            "rename a directory in as an agent's": "EACCES",
            "rename its own directory away": "ok",
            "rename another directory in as its own": "ok",
            "listing its own sessions": ["s1"],
            "rename its own directory to another agent's name": "EACCES",
            "exchange its own directory with peer's": "EACCES",
            "rename agent/ itself": "EACCES",
            "mkdir a session of its own": "ok",
        }
        assert tree(peers) == before
        assert sorted(os.listdir(world.home / "agent")) == [AGENT, OTHER]
        moved = tree(world.home / scratch / "mine")
        # Renamed, a directory changes its own ctime (its ".." entry): the rest is as it was.
        assert {k: v for k, v in moved.items() if k != "."} == {
            k: v for k, v in mine_before.items() if k != "."
        }
    finally:  # the home as the other tests of this world expect it
        shutil.rmtree(world.home / "agent" / AGENT)
        os.rename(world.home / scratch / "mine", world.home / "agent" / AGENT)


# ------------------------------------------------------------------ read-only places


EXISTING_NAMES = """
j = lambda *n: os.path.join(d, *n)
r = {
    "O_CREAT of an existing file, read": done(opened, j("f"), os.O_RDONLY | os.O_CREAT),
    "O_CREAT|O_EXCL of an existing file": done(opened, j("f"), os.O_WRONLY | os.O_CREAT | os.O_EXCL),
    "mkdir of an existing directory": done(os.mkdir, j("sub")),
    "mkdir of an existing file's name": done(os.mkdir, j("f")),
    "rmdir of a directory with entries": done(os.rmdir, j("sub")),
    "rename onto itself": done(os.rename, j("f"), j("f")),
    "unlink of an absent name": done(os.unlink, j("nosuch")),
    "rmdir of an absent name": done(os.rmdir, j("nosuch")),
    "rename of an absent name": done(os.rename, j("nosuch"), j("other")),
    "O_CREAT of a new name": done(opened, j("new"), os.O_WRONLY | os.O_CREAT),
    "mkdir of a new name": done(os.mkdir, j("newdir")),
    "unlink": done(os.unlink, j("f")),
    "read": text(j("f")),
}
"""  # noqa: E501


def test_calls_in_a_read_only_space_answer_as_in_a_directory_the_user_may_not_write(world, agent):
    """docs/mount.md (a change the agent may not make is ``EACCES``) read with open(2),
    mkdir(2), rmdir(2), rename(2): in space ``audit``, which the agent may only read, each
    call answers as it does on a local disk in a directory the caller may not write —
    ``O_CREAT`` of an existing file opens it, ``O_EXCL`` and ``mkdir`` of existing names are
    ``EEXIST``, an absent name is ``ENOENT``, a rename onto itself does nothing, any real
    change is ``EACCES`` — although the agent's uid owns the directory and the file, and the
    storage root is left as it was."""
    audit = world.fresh(world.data(READ_ONLY), "existing")
    world.owned_file(audit / "f", "audited\n")
    (audit / "sub").mkdir()
    world.owned_file(audit / "sub" / "x", "x\n")
    local = new_scratch_dir(world.top, "local-")
    (local / "f").write_text("audited\n")
    (local / "f").chmod(0o644)
    (local / "sub").mkdir()
    (local / "sub" / "x").write_text("x\n")
    before = tree(audit)
    seen = agent(EXISTING_NAMES, d=world.v(audit))
    on_disk = agent(EXISTING_NAMES, d=str(local))
    assert seen == on_disk, (seen, on_disk)
    assert seen["mkdir of an existing directory"] == "EEXIST" and seen["unlink"] == "EACCES"
    assert seen["read"] == "audited\n"
    assert tree(audit) == before


REACHED_AGAIN = """
p = os.open(f, os.O_PATH)
fd = os.open(f, os.O_RDONLY)
dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
hfd = os.open(home, os.O_RDONLY | os.O_DIRECTORY)
r = {
    "reopen an O_PATH descriptor for writing": done(opened, f"/proc/self/fd/{p}", os.O_WRONLY),
    "reopen it O_RDWR|O_TRUNC": done(opened, f"/proc/self/fd/{p}", os.O_RDWR | os.O_TRUNC),
    "reopen a read descriptor O_APPEND": done(opened, f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_APPEND),
    "truncate by /proc path": done(os.truncate, f"/proc/self/fd/{p}", 0),
    "chmod by /proc path": done(os.chmod, f"/proc/self/fd/{p}", 0o600),
    "utime by /proc path": done(os.utime, f"/proc/self/fd/{p}", ns=(1, 1)),
    "openat O_CREAT": done(opened, "new", os.O_WRONLY | os.O_CREAT, dir_fd=dfd),
    "mkdirat": done(os.mkdir, "newdir", dir_fd=dfd),
    "unlinkat": done(os.unlink, "f", dir_fd=dfd),
    "renameat to the home": done(os.rename, "f", "f", src_dir_fd=dfd, dst_dir_fd=hfd),
    "linkat to the home": done(os.link, "f", "f", src_dir_fd=dfd, dst_dir_fd=hfd),
    "renameat from the home": done(os.rename, "h", "h", src_dir_fd=hfd, dst_dir_fd=dfd),
    "read through the O_PATH descriptor": text(f"/proc/self/fd/{p}"),
}
"""  # noqa: E501


def test_a_read_only_file_reached_through_descriptors_and_proc_takes_no_change(world, agent):
    """F-1 (writes are checked with the same chain whatever way the file is reached) and
    docs/mount.md: a file of space ``audit`` held by an ``O_PATH`` or a read descriptor, and
    its directory held by a directory descriptor, take no change through ``/proc/self/fd``
    reopens for writing, ``truncate``/``chmod``/``utime`` of the ``/proc`` path, or
    ``openat``/``mkdirat``/``unlinkat``/``renameat``/``linkat`` relative to the descriptor,
    to or from the home: each is ``EACCES`` and the storage root is unchanged; reading
    through the ``O_PATH`` descriptor works."""
    audit = world.fresh(world.data(READ_ONLY), "reached")
    world.owned_file(audit / "f", "audited\n")
    home = world.fresh(world.home, "reached")
    world.owned_file(home / "h", "home\n")
    before = tree(audit), tree(home)
    answers = agent(REACHED_AGAIN, f=world.v(audit / "f"), d=world.v(audit), home=world.v(home))
    assert answers.pop("read through the O_PATH descriptor") == "audited\n"
    assert answers == dict.fromkeys(answers, "EACCES"), answers
    assert (tree(audit), tree(home)) == before


AS_ROOT = """
j = lambda *n: os.path.join(view, *n)
r = {
    "append to its own policy": done(opened, j("agent", "coder.d", "policy"), os.O_WRONLY | os.O_APPEND),
    "truncate its label": done(os.truncate, j("agent", "coder.d", "label"), 0),
    "chmod its identity": done(os.chmod, j("agent", "coder.d", "identity"), 0o666),
    "chown its policy to the agent": done(os.chown, j("agent", "coder.d", "policy"), uid, gid),
    "utime its mount control": done(os.utime, j("agent", "coder.d", "mount"), ns=(1, 1)),
    "unlink its system prompt": done(os.unlink, j("agent", "coder.d", "system.md")),
    "rename its identity into the home": done(os.rename, j("agent", "coder.d", "identity"), j("home", str(uid), "identity")),
    "link its policy into the home": done(os.link, j("agent", "coder.d", "policy"), j("home", str(uid), "policy")),
    "link a home file into its controls": done(os.link, j("home", str(uid), name, "h"), j("agent", "coder.d", "h")),
    "create in agent/": done(opened, j("agent", "x"), os.O_WRONLY | os.O_CREAT),
    "write tsh's configuration": done(opened, j("tool", "tsh.d", "config"), os.O_WRONLY | os.O_APPEND),
    "create a tool": done(opened, j("tool", "evil"), os.O_WRONLY | os.O_CREAT, 0o755),
    "write bin/tsh": done(opened, j("bin", "tsh"), os.O_WRONLY | os.O_APPEND),
    "mkdir in model/": done(os.mkdir, j("model", "x")),
    "mkdir in home/": done(os.mkdir, j("home", "x")),
    "chmod its home itself": done(os.chmod, j("home", str(uid)), 0o777),
    "create in the manual bundle": done(opened, j("shared", "cortexfs-docs", "x"), os.O_WRONLY | os.O_CREAT),
    "write the manual's README": done(opened, j("shared", "cortexfs-docs", "README.md"), os.O_WRONLY | os.O_APPEND),
    "rename a space's agent/": done(os.rename, j("shared", "team", "agent"), j("shared", "team", "data", "agents")),
    "create in a space's tool/": done(opened, j("shared", "team", "tool", "x"), os.O_WRONLY | os.O_CREAT),
    "write in the home": done(opened, j("home", str(uid), name, "root-made"), os.O_WRONLY | os.O_CREAT),
}
"""  # noqa: E501


def test_root_through_the_agents_view_changes_nothing_outside_the_agents_writable_places(
    world, programs
):
    """F-1 and docs/mount.md (writes only in the home and the spaces the agent may write;
    the manuals are read-only documents, D-1, even with ``shared:cortexfs-docs write`` in the
    policy; a space's ``tool/`` is the host's): root, whose mode bits pass everywhere, meets
    the view's ``EACCES`` for every change to the agent's own controls (append, truncate,
    chmod, chown, utime, unlink, rename and link out, link in), to ``agent/``, ``tool/``,
    ``bin/``, ``model/``, ``home/``, the home directory itself, the manual bundle and a
    space's ``tool/``, while it may make a file in the agent's home; the controls are left
    byte for byte as they were."""
    home = world.fresh(world.home, "root")
    world.owned_file(home / "h", "home\n")
    watched = [world.controls, world.storage / "tool" / "tsh.d", world.storage / "bin",
               world.storage / "shared" / DOCS, world.storage / "model"]  # fmt: skip
    before = [tree(path) for path in watched]
    programs.append(Program(None))
    answers = programs[-1](AS_ROOT, view=str(world.view), uid=world.user.uid,
                           gid=world.user.gid, name=home.name)  # fmt: skip
    assert answers.pop("write in the home") == "ok"
    assert answers == dict.fromkeys(answers, "EACCES"), answers
    assert [tree(path) for path in watched] == before
    assert sorted(os.listdir(world.storage / "agent")) == sorted(
        [AGENT, f"{AGENT}.d", OTHER, f"{OTHER}.d", ".install-lock"]
    )
    assert "x" not in os.listdir(world.storage / "home")
    assert (home / "root-made").stat().st_uid == 0


# ------------------------------------------------------ listings of partly hidden places

LISTING = """
class Dirent(ctypes.Structure):
    _fields_ = [("d_ino", ctypes.c_uint64), ("d_off", ctypes.c_int64),
                ("d_reclen", ctypes.c_ushort), ("d_type", ctypes.c_ubyte),
                ("d_name", ctypes.c_char * 256)]
libc.opendir.restype = ctypes.c_void_p
libc.opendir.argtypes = [ctypes.c_char_p]
libc.readdir.restype = ctypes.POINTER(Dirent)
libc.readdir.argtypes = [ctypes.c_void_p]
libc.telldir.restype = ctypes.c_long
libc.telldir.argtypes = [ctypes.c_void_p]
libc.rewinddir.argtypes = [ctypes.c_void_p]
libc.closedir.argtypes = [ctypes.c_void_p]
def entries(handle, most=10 ** 6):
    out = []
    while len(out) < most:
        entry = libc.readdir(handle)
        if not entry:
            break
        out.append([entry.contents.d_name.decode(), entry.contents.d_ino, libc.telldir(handle)])
    return out
"""


def test_a_listing_with_a_hidden_entry_is_the_listing_without_it_offsets_included(world, agent):
    """F-1, T-5 and docs/mount.md (a directory's link count is 1 in an agent's view because
    the count on disk "would tell how many are hidden"): the session directory of ``peer``
    in space ``team`` holds ``hid`` (hidden from coder) and ``vis``; that of a third agent's
    directory made for the test holds ``vis`` alone.  Read with ``readdir`` and ``telldir``
    through coder's view the two listings are the same — names and positions — so nothing
    tells that a hidden session sorts before ``vis``."""
    third = world.storage / "shared" / WRITABLE / "agent" / "third" / "session" / "vis"
    make_session(third, world.user)
    with_hidden = world.v(world.session(OTHER, "vis").parent)
    without = world.v(third.parent)
    answers = agent(LISTING + """
def listing(path):
    handle = libc.opendir(os.fsencode(path))
    try:
        return [[name, offset] for name, _, offset in entries(handle)]
    finally:
        libc.closedir(handle)
r = [listing(with_hidden), listing(without)]
""", with_hidden=with_hidden, without=without)  # fmt: skip
    assert [name for name, _ in answers[0]] == [".", "..", "vis"]
    assert answers[0] == answers[1]


HELD_LISTING = (
    LISTING
    + """
handle = libc.opendir(os.fsencode(shared))
r = entries(handle, 3)
"""
)


def test_a_listing_held_open_while_grants_change_shows_each_name_once_and_rewound_the_new_set(
    own_world, own_agent
):
    """docs/mount.md (*Listings*: an open directory lists the names it held when its listing
    began, or was rewound; every entry shows exactly once; a policy change shows within a
    second): the agent reads the first entries of ``shared/``, the administrator takes space
    ``audit`` out of its policy and grants ``secret``; the listing read on repeats no name
    and never shows ``secret``; rewound, it shows ``secret`` and not ``audit``, each with the
    inode number ``stat`` gives and the disk holds."""
    world, agent = own_world, own_agent
    shared = world.storage / "shared"
    first = agent(HELD_LISTING, shared=world.v(shared))
    assert [name for name, _, _ in first] == [".", "..", READ_ONLY]
    world.edit_policy(drop=[f"allow {LABEL} shared:{READ_ONLY} read"],
                      add=[f"allow {LABEL} shared:{HIDDEN} read"])  # fmt: skip
    assert wait_for(
        lambda: (
            agent("r = e(lambda: sorted(os.listdir(p)))", p=world.v(shared))
            == sorted([DOCS, HIDDEN, WRITABLE])
        ),
        WITHIN,
    )
    rest = agent("r = entries(handle)")
    names = [name for name, _, _ in first + rest]
    assert len(names) == len(set(names)) and HIDDEN not in names, names
    assert set(names) >= {".", "..", READ_ONLY, WRITABLE}
    rewound = agent("libc.rewinddir(handle); r = entries(handle); libc.closedir(handle)")
    shown = {name: ino for name, ino, _ in rewound if name not in (".", "..")}
    assert sorted(shown) == sorted([DOCS, HIDDEN, WRITABLE])
    assert shown == {name: (shared / name).stat().st_ino for name in shown}


def test_a_session_granted_while_its_directory_is_listed_shows_after_a_rewind(own_world, own_agent):
    """S-6 and docs/mount.md (*Listings*; a policy change shows within a second): while the
    agent holds a listing of ``peer``'s ``session/`` in space ``team``, granting it
    ``session:hid read`` makes ``hid`` show once the listing is rewound, and its events
    read; taking the grant back hides it again (``ENOENT``), the listing rewound once more
    shows ``vis`` alone."""
    world, agent = own_world, own_agent
    sessions = world.session(OTHER, "hid").parent
    code = LISTING + "handle = libc.opendir(os.fsencode(sessions)); r = entries(handle)"
    assert [n for n, _, _ in agent(code, sessions=world.v(sessions))] == [".", "..", "vis"]
    rule = f"allow {LABEL} session:hid read"
    world.edit_policy(add=[rule])
    events = world.v(world.session(OTHER, "hid") / "events.jsonl")
    assert wait_for(lambda: agent("r = e(text, p)", p=events) == '{"n": 1}\n', WITHIN)
    again = agent("libc.rewinddir(handle); r = entries(handle)")
    assert [n for n, _, _ in again] == [".", "..", "hid", "vis"]
    world.edit_policy(drop=[rule])
    assert wait_for(lambda: agent("r = e(text, p)", p=events) == "ENOENT", WITHIN)
    last = agent("libc.rewinddir(handle); r = entries(handle); libc.closedir(handle)")
    assert [n for n, _, _ in last] == [".", "..", "vis"]


# ------------------------------------------- changes while descriptors and cwd are held


HOLD_IN_SPACE = """
os.chdir(d)
held = {
    "path": os.open(os.path.join(d, "f"), os.O_PATH),
    "read": os.open(os.path.join(d, "f"), os.O_RDONLY),
    "write": os.open(os.path.join(d, "w"), os.O_WRONLY | os.O_APPEND),
    "dir": os.open(d, os.O_RDONLY | os.O_DIRECTORY),
}
r = sorted(os.listdir("."))
"""


def test_an_o_path_descriptor_held_before_a_revoke_opens_nothing_after_it(own_world, own_agent):
    """F-1 (reads are checked with the same chain) and docs/mount.md (*Open files*: once a
    grant is revoked the next open is refused, while a descriptor opened before goes on
    reading): the agent holds an ``O_PATH`` descriptor — which reads nothing by itself — of a
    file in space ``team``; the administrator takes the space out of its policy and then
    rewrites the file.  Opening ``/proc/self/fd/N`` afterwards is a new open, refused as the
    same open by name is, and the new bytes never reach the agent."""
    world, agent = own_world, own_agent
    d = world.fresh(world.data(), "opath")
    world.owned_file(d / "f", "before\n")
    world.owned_file(d / "w", "")
    f = world.v(d / "f")
    assert agent(HOLD_IN_SPACE, d=world.v(d)) == ["f", "w"]
    world.edit_policy(drop=[f"allow {LABEL} shared:{WRITABLE} read",
                            f"allow {LABEL} shared:{WRITABLE} write"])  # fmt: skip
    assert wait_for(lambda: agent("r = done(opened, f, os.O_RDONLY)", f=f) == "ENOENT", WITHIN)
    (d / "f").write_text("written after the revoke\n")
    # What the page promises: the read descriptor opened before goes on reading.
    assert wait_for(
        lambda: (
            agent("r = os.pread(held['read'], 100, 0).decode()") == "written after the revoke\n"
        ),
        WITHIN,
    )
    reopened = agent("r = e(text, f'/proc/self/fd/{held[\"path\"]}')")
    assert reopened in ("ENOENT", "EACCES"), reopened


def test_a_working_directory_in_a_revoked_space_is_neither_opened_nor_shown(own_world, own_agent):
    """F-1 and docs/mount.md (*Open files*; a name it may not see is ``ENOENT``): the agent's
    working directory lies in space ``team`` when the space is taken out of its policy.
    Afterwards, as a name relative to it is ``ENOENT``, so are ``opendir(".")``, ``stat(".")``,
    ``stat("..")`` and an open of ``/proc/self/cwd``: the directory it may no longer see is not
    opened again nor its attributes shown."""
    world, agent = own_world, own_agent
    d = world.fresh(world.data(), "cwd")
    world.owned_file(d / "f", "f\n")
    world.owned_file(d / "w", "")
    assert agent(HOLD_IN_SPACE, d=world.v(d)) == ["f", "w"]
    world.edit_policy(drop=[f"allow {LABEL} shared:{WRITABLE} read",
                            f"allow {LABEL} shared:{WRITABLE} write"])  # fmt: skip
    assert wait_for(lambda: agent("r = done(os.stat, 'f')") == "ENOENT", WITHIN)
    answers = agent("""
r = {
    "opendir .": done(os.listdir, "."),
    "stat .": done(os.stat, "."),
    "stat ..": done(os.stat, ".."),
    "open /proc/self/cwd": done(opened, "/proc/self/cwd", os.O_RDONLY | os.O_DIRECTORY),
}
""")
    assert set(answers.values()) <= {"ENOENT", "EACCES"}, answers


def test_a_write_revoke_refuses_every_new_way_in_and_keeps_what_was_open(own_world, own_agent):
    """F-1 and docs/mount.md (*Open files*: once a grant is revoked the next open is
    refused; a descriptor opened for writing before goes on writing): the agent holds a
    working directory, a directory descriptor, a read descriptor and an append descriptor in
    space ``team``; once ``shared:team write`` is taken out of its policy a reopen of the
    read descriptor for writing, ``openat``/``mkdirat`` through the directory descriptor,
    relative creates, renames and links out to the home and ``fchmod`` are ``EACCES``; reads
    go on, the append descriptor still appends, and the storage root holds exactly its
    writes."""
    world, agent = own_world, own_agent
    d = world.fresh(world.data(), "revoke-write")
    world.owned_file(d / "f", "f\n")
    world.owned_file(d / "w", "")
    home = world.fresh(world.home, "revoke-write")
    assert agent(HOLD_IN_SPACE, d=world.v(d)) == ["f", "w"]
    world.edit_policy(drop=[f"allow {LABEL} shared:{WRITABLE} write"])
    probe = "r = done(opened, 'f', os.O_WRONLY | os.O_APPEND)"  # changes nothing when allowed
    assert wait_for(lambda: agent(probe) == "EACCES", WITHIN)
    answers = agent("""
r = {
    "reopen the read descriptor for writing":
        done(opened, f"/proc/self/fd/{held['read']}", os.O_WRONLY | os.O_APPEND),
    "openat O_CREAT": done(opened, "n2", os.O_WRONLY | os.O_CREAT, dir_fd=held["dir"]),
    "mkdirat": done(os.mkdir, "sub", dir_fd=held["dir"]),
    "relative mkdir": done(os.mkdir, "sub"),
    "relative unlink": done(os.unlink, "f"),
    "rename out to the home": done(os.rename, "f", os.path.join(home, "f")),
    "link out to the home": done(os.link, "f", os.path.join(home, "f")),
    "fchmod of the read descriptor": done(os.chmod, held["read"], 0o600),
    "utime": done(os.utime, "f", ns=(1, 1)),
}
""", home=world.v(home))  # fmt: skip
    assert answers == dict.fromkeys(answers, "EACCES"), answers
    assert agent("r = [text('f'), os.pread(held['read'], 10, 0).decode()]") == ["f\n", "f\n"]
    assert agent("r = os.write(held['write'], b'after\\n'); os.fsync(held['write'])") == 6
    assert sorted(os.listdir(d)) == ["f", "w"] and os.listdir(home) == []
    assert (d / "w").read_text() == "after\n"
    assert stat.S_IMODE((d / "f").stat().st_mode) == 0o664


def test_a_working_directory_moved_by_the_agent_is_judged_where_it_now_lies(own_world, own_agent):
    """docs/mount.md (*Names*: a rename through the mount is applied to the daemon's names at
    once; writes only in the home and writable spaces): the agent's working directory, made
    in its home, is moved through the view into space ``team``, and another the other way;
    once ``shared:team write`` is revoked, a file made relative to the first is ``EACCES``
    (it now lies in the space) and one relative to the second is made (it lies in the
    home)."""
    world, agent = own_world, own_agent
    home, team = world.fresh(world.home, "moving"), world.fresh(world.data(), "moving")
    answers = agent("""
os.mkdir(os.path.join(home, "a")); os.mkdir(os.path.join(team, "b"))
os.chdir(os.path.join(home, "a"))
os.rename(os.path.join(home, "a"), os.path.join(team, "a"))
b = os.open(os.path.join(team, "b"), os.O_RDONLY | os.O_DIRECTORY)
os.rename(os.path.join(team, "b"), os.path.join(home, "b"))
r = [done(opened, "before", os.O_WRONLY | os.O_CREAT),
     done(opened, "before", os.O_WRONLY | os.O_CREAT, dir_fd=b)]
""", home=world.v(home), team=world.v(team))  # fmt: skip
    assert answers == ["ok", "ok"]
    world.edit_policy(drop=[f"allow {LABEL} shared:{WRITABLE} write"])
    probe = "r = done(opened, 'before', os.O_WRONLY | os.O_APPEND)"  # changes nothing
    assert wait_for(lambda: agent(probe) == "EACCES", WITHIN)
    assert agent("r = done(opened, 'after', os.O_WRONLY | os.O_CREAT)") == "EACCES"
    assert agent("r = done(opened, 'after', os.O_WRONLY | os.O_CREAT, dir_fd=b)") == "ok"
    assert sorted(os.listdir(team / "a")) == ["before"]
    assert sorted(os.listdir(home / "b")) == ["after", "before"]
    assert (home / "b" / "after").stat().st_uid == world.user.uid


def test_a_directory_moved_on_the_storage_root_into_a_hidden_space_is_out_of_reach(world, agent):
    """docs/mount.md (*Names*: a name changed outside the mount is found again at the next
    lookup, meanwhile ``ENOENT`` or ``ESTALE``; a name it may not see is ``ENOENT``): the agent
    holds a directory descriptor, an ``O_PATH`` descriptor of a file in it and its working
    directory there when the host moves the directory from space ``team`` into space
    ``secret`` on the storage root; the file is then reached neither by ``openat`` nor by a
    ``/proc`` reopen, the directory not listed, and a relative create makes nothing."""
    d = world.fresh(world.data(), "moved-away")
    world.owned_file(d / "f", "f\n")
    held = """
os.chdir(d)
held = {"path": os.open(os.path.join(d, "f"), os.O_PATH), "dir": os.open(d, os.O_DIRECTORY)}
r = sorted(os.listdir("."))
"""
    assert agent(held, d=world.v(d)) == ["f"]
    gone = world.data(HIDDEN) / d.name
    os.rename(d, gone)
    try:
        # The kernel may answer from the entries it keeps for half a second (docs/mount.md).
        probe = "r = [done(opened, 'f', os.O_RDONLY, dir_fd=held['dir']), done(os.stat, 'f')]"
        assert wait_for(lambda: set(agent(probe)) <= {"ENOENT", "ESTALE"}, WITHIN)
        answers = agent("""
r = {
    "openat": done(opened, "f", os.O_RDONLY, dir_fd=held["dir"]),
    "reopen the O_PATH descriptor": done(text, f"/proc/self/fd/{held['path']}"),
    "list the directory descriptor": e(lambda: sorted(os.listdir(held["dir"]))),
    "relative create": done(opened, "new", os.O_WRONLY | os.O_CREAT),
    "relative stat": done(os.stat, "f"),
}
""")
        assert answers["list the directory descriptor"] in ("ENOENT", "ESTALE", []), answers
        del answers["list the directory descriptor"]
        assert set(answers.values()) <= {"ENOENT", "ESTALE", "EACCES"}, answers
        assert sorted(os.listdir(gone)) == ["f"]
    finally:
        agent("os.chdir('/'); [os.close(fd) for fd in held.values()]; r = None")
        shutil.rmtree(gone)


def test_an_identity_given_another_uid_moves_the_view_to_that_uids_home(own_world, own_agent):
    """docs/mount.md (``home/<uid>/``: its own uid only; a change of the controls shows
    within a second) and P-5 step 1: the administrator gives agent ``coder`` another uid
    while a program of the old uid works in the old home; the old home leaves the view (by
    path and relative to the working directory: ``ENOENT``; a relative create refused) and
    the new uid's home enters it; the append descriptor opened before goes on appending;
    the identity restored brings the old home back."""
    world, agent = own_world, own_agent
    other_uid = 4321
    (world.storage / "home" / str(other_uid)).mkdir(mode=0o755)
    os.chown(world.storage / "home" / str(other_uid), other_uid, other_uid)
    d = world.fresh(world.home, "identity")
    world.owned_file(d / "f", "f\n")
    world.owned_file(d / "w", "")
    assert agent(HOLD_IN_SPACE, d=world.v(d)) == ["f", "w"]
    identity = (world.controls / "identity").read_bytes()
    changed = dict(json.loads(identity), uid=other_uid)
    world.write_control("identity", json.dumps(changed).encode())
    assert wait_for(lambda: listed(world, agent, "home")["home"] == [str(other_uid)], WITHIN)
    assert wait_for(lambda: agent("r = done(os.stat, 'f')") == "ENOENT", WITHIN)
    answers = agent("""
r = {
    "by path": done(os.stat, os.path.join(d, "f")),
    "relative create": done(opened, "new", os.O_WRONLY | os.O_CREAT),
    "append through the descriptor": e(os.write, held["write"], b"kept\\n"),
}
""", d=world.v(d))  # fmt: skip
    assert answers["by path"] == "ENOENT"
    assert answers["relative create"] in ("ENOENT", "EACCES")
    assert answers["append through the descriptor"] == 5
    world.write_control("identity", identity)
    assert wait_for(lambda: listed(world, agent, "home")["home"] == [str(world.user.uid)], WITHIN)
    assert wait_for(lambda: agent("r = e(text, 'f')") == "f\n", WITHIN)
    assert sorted(os.listdir(d)) == ["f", "w"] and (d / "w").read_text() == "kept\n"


def test_an_identity_without_the_spaces_group_hides_the_spaces_until_given_back(
    own_world, own_agent
):
    """X-1 and P-5 step 2 (a space shows to an agent whose uid, gid and groups may enter it;
    ``ctx mount --help``: "spaces its policy lets it read and its uid may enter"): the
    spaces are ``3770`` of the test user's group; an identity whose gid and groups leave
    that group out hides ``team`` and ``audit`` from the view within a second (``ENOENT``),
    its home staying; the group given back shows them again."""
    world, agent = own_world, own_agent
    identity = (world.controls / "identity").read_bytes()
    outside = 4322
    world.write_control(
        "identity", json.dumps({"uid": world.user.uid, "gid": outside, "groups": []}).encode()
    )
    team = world.v(world.data())
    assert wait_for(lambda: listed(world, agent, "shared")["shared"] == [DOCS], WITHIN)
    assert agent("r = done(os.stat, p)", p=team) == "ENOENT"
    assert listed(world, agent, "home")["home"] == [str(world.user.uid)]
    world.write_control("identity", identity)
    assert wait_for(
        lambda: listed(world, agent, "shared")["shared"] == sorted([DOCS, READ_ONLY, WRITABLE]),
        WITHIN,
    )
    assert agent("r = done(os.stat, p)", p=team) == "ok"


def test_an_identity_of_root_grants_the_view_nothing_and_it_stays_mounted(own_world, own_agent):
    """P-5 step 1 (an agent's identity is never root) and docs/mount.md (a view stays
    fail-closed and mounted whatever happens to the agent's controls): given uid 0 while
    mounted, the agent's view shows no home, space or agent entry and takes no write in what
    was its home; the identity restored brings them back."""
    world, agent = own_world, own_agent
    (world.storage / "home" / "0").mkdir(mode=0o755)
    identity = (world.controls / "identity").read_bytes()
    world.write_control("identity", b'{"uid": 0, "gid": 0, "groups": [0]}')
    assert wait_for(
        lambda: (
            listed(world, agent, "home", "shared", "agent")
            == {"home": [], "shared": [], "agent": []}
        ),
        WITHIN,
    )
    home = world.v(world.home)
    assert wait_for(lambda: agent("r = done(os.stat, p)", p=home) == "ENOENT", WITHIN)
    made = agent("r = done(opened, p, os.O_WRONLY | os.O_CREAT)", p=world.v(world.home / "x"))
    assert made == "ENOENT"
    assert sorted(os.listdir(world.view)) == sorted(ROOT_ENTRIES)
    world.write_control("identity", identity)
    assert wait_for(lambda: listed(world, agent, "home")["home"] == [str(world.user.uid)], WITHIN)
    assert not (world.home / "x").exists() and not (world.storage / "home" / "0" / "x").exists()


def test_an_unreadable_identity_empties_the_view_under_a_held_working_directory(
    own_world, own_agent
):
    """docs/mount.md (while the agent's identity cannot be read the view is empty: its root
    lists nothing, every name is ``ENOENT``, nothing may be changed; ``ctx mount`` says so on
    standard error, goes on serving and notes the repair): with the agent's working
    directory and descriptors in its home, the identity is moved aside; names by path and
    relative to the working directory are ``ENOENT``, creates and reopens for writing are
    refused and leave nothing; the identity put back shows everything again within a
    second."""
    world, agent = own_world, own_agent
    d = world.fresh(world.home, "empty")
    world.owned_file(d / "f", "f\n")
    world.owned_file(d / "w", "")
    assert agent(HOLD_IN_SPACE, d=world.v(d)) == ["f", "w"]
    os.rename(world.controls / "identity", world.top / "identity.aside")
    try:
        assert wait_for(lambda: agent("r = sorted(os.listdir(v))", v=str(world.view)) == [], WITHIN)
        assert wait_for(lambda: agent("r = done(os.stat, 'f')") == "ENOENT", WITHIN)
        answers = agent("""
r = {
    "home by path": done(os.stat, home),
    "relative open": done(opened, "f", os.O_RDONLY),
    "relative create": done(opened, "new", os.O_WRONLY | os.O_CREAT),
    "relative mkdir": done(os.mkdir, "sub"),
    "reopen for writing": done(opened, f"/proc/self/fd/{held['read']}", os.O_WRONLY),
    "chmod through the descriptor": done(os.chmod, held["read"], 0o600),
}
""", home=world.v(world.home))  # fmt: skip
        assert answers["home by path"] == "ENOENT" and answers["relative open"] == "ENOENT"
        others = {k: v for k, v in answers.items() if not k.startswith(("home", "relative open"))}
        assert set(others.values()) <= {"ENOENT", "EACCES"}, answers
    finally:
        os.rename(world.top / "identity.aside", world.controls / "identity")
    assert wait_for(lambda: agent("r = e(text, 'f')") == "f\n", WITHIN)
    assert sorted(os.listdir(d)) == ["f", "w"]
    assert stat.S_IMODE((d / "f").stat().st_mode) == 0o664
    said = (world.top / "view.stderr").read_text()
    assert f"warning: agent {AGENT}'s view is empty until it is repaired: EACCES" in said, said
    assert f"note: agent {AGENT}'s view shows its entries again" in said, said


@pytest.mark.parametrize(
    "mount_control",
    [b'[["/nowhere", "/ctx", "ro"', b"[]\n", b"SPACE"],
    ids=["malformed", "empty", "a-space-at-ctx"],
)
def test_a_mount_control_that_grants_no_mount_of_the_root_leaves_bin_and_tsh_alone(
    own_world, own_agent, mount_control
):
    """docs/policy.md (an agent without a mount control sees nothing; a malformed control
    counts as empty; only the mount of the storage root may take ``/ctx``), ``ctx mount
    --help`` (nothing but ``bin/`` and ``tool/tsh.d/`` when no mount of the storage root is
    granted) and docs/mount.md (a view stays mounted whatever happens to the controls): the
    agent's ``mount`` control rewritten while it works in its home — malformed, empty, or
    naming a space at ``/ctx`` — leaves the root's six entries, ``bin/`` and ``tool/tsh.d``;
    its home and spaces go (``ENOENT``), a relative create makes nothing; the control put
    back restores them."""
    world, agent = own_world, own_agent
    if mount_control == b"SPACE":
        space = world.storage / "shared" / WRITABLE
        mount_control = json.dumps([[str(space), "/ctx", "ro"]]).encode()
    d = world.fresh(world.home, "mounts")
    world.owned_file(d / "f", "f\n")
    world.owned_file(d / "w", "")
    assert agent(HOLD_IN_SPACE, d=world.v(d)) == ["f", "w"]
    original = (world.controls / "mount").read_bytes()
    full = listed(world, agent, "", "bin", "tool", "home", "shared", "agent")
    world.write_control("mount", mount_control)
    bare = {**full, "tool": ["tsh.d"], "home": [], "shared": [], "agent": []}
    assert wait_for(
        lambda: listed(world, agent, "", "bin", "tool", "home", "shared", "agent") == bare,
        WITHIN,
    )
    assert full[""] == sorted(ROOT_ENTRIES) and full["shared"] == sorted(
        [DOCS, READ_ONLY, WRITABLE]
    )
    # A name the kernel looked up may be kept half a second more (docs/mount.md).
    assert wait_for(lambda: agent("r = done(os.stat, 'f')") == "ENOENT", WITHIN)
    assert agent("r = done(opened, 'new', os.O_WRONLY | os.O_CREAT)") in ("ENOENT", "EACCES")
    world.write_control("mount", original)
    assert wait_for(
        lambda: listed(world, agent, "", "bin", "tool", "home", "shared", "agent") == full,
        WITHIN,
    )
    assert sorted(os.listdir(d)) == ["f", "w"]


# ---------------------------------------------------- one file through two views at once


def test_one_file_shows_the_same_bytes_and_status_through_the_host_and_agent_views(world, agent):
    """docs/mount.md (the host's view is the storage root; every file shows its number on
    disk; a caller's new file is its own): a file the agent writes through its view is read
    byte for byte through the host's view, and both views and the disk agree on its inode
    number, size, times to the nanosecond, mode, owner and link count — after the write,
    after a ``chmod`` and an exact ``utime`` through the agent's view, and after a hard link
    made through it."""
    d = world.fresh(world.home, "two-views")
    agent_path, host_path = world.v(d / "f"), str(world.through(world.host, d / "f"))
    agent("""
with open(p, "w") as f:
    f.write("written by the agent\\n")
r = None
""", p=agent_path)  # fmt: skip

    def compare() -> list:
        seen = agent("r = [facts(os.stat(a)), facts(os.stat(h))]", a=agent_path, h=host_path)
        st = os.stat(d / "f")
        disk = [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
                stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_nlink]  # fmt: skip
        return [*seen, disk]

    assert wait_for(lambda: len({json.dumps(x) for x in compare()}) == 1, WITHIN), compare()
    assert compare()[0][5:7] == [world.user.uid, world.user.gid]
    assert agent("r = text(h)", h=host_path) == "written by the agent\n"
    agent("os.chmod(p, 0o640); os.utime(p, ns=(1_234_567_891, 2_345_678_912)); r = None",
          p=agent_path)  # fmt: skip
    assert wait_for(lambda: len({json.dumps(x) for x in compare()}) == 1, WITHIN), compare()
    assert compare()[0][2] == 2_345_678_912 and compare()[0][4] == 0o640
    agent("os.link(p, p + '2'); r = None", p=agent_path)
    assert wait_for(lambda: len({json.dumps(x) for x in compare()}) == 1, WITHIN), compare()
    assert compare()[0][7] == 2
    twin = agent("r = facts(os.stat(h + '2'))", h=host_path)
    assert twin[0] == compare()[0][0]


def test_writes_through_either_view_are_read_through_the_other(world, agent):
    """docs/mount.md (the pages the kernel caches of a file are kept from one open to the
    next only while the file is unchanged; the kernel keeps a name's entry half a second):
    a file of the writable space appended to through the host's view is read whole through
    the agent's view by a new open once the second is over, its size as ``stat`` gives it
    there; one rewritten through the agent's view is read whole through the host's view."""
    d = world.fresh(world.data(), "either")
    world.owned_file(d / "f", "one\n")
    agent_path, host_path = world.v(d / "f"), str(world.through(world.host, d / "f"))
    assert agent("r = text(p)", p=agent_path) == "one\n"
    with open(host_path, "a") as appended:
        appended.write("two\n")
    assert wait_for(
        lambda: agent("r = [text(p), os.stat(p).st_size]", p=agent_path) == ["one\ntwo\n", 8],
        WITHIN,
    )
    agent("""
with open(p, "w") as f:
    f.write("rewritten by the agent, longer than before\\n")
r = None
""", p=agent_path)  # fmt: skip
    expected = "rewritten by the agent, longer than before\n"
    assert wait_for(lambda: Path(host_path).read_text() == expected, WITHIN)
    assert (d / "f").read_text() == expected


def test_names_changed_through_one_view_show_through_the_other(world, agent):
    """docs/mount.md (*Names*: a rename through the mount is applied at once; a name
    changed outside a mount is found again at its next lookup; a name the agent may not see
    is ``ENOENT``): a rename made through the agent's view shows through the host's view with
    the same inode number; a rename made through the host's view from the writable space
    into the hidden space takes the file out of the agent's view within a second while the
    host's view shows it at its new place."""
    d = world.fresh(world.data(), "renames")
    world.owned_file(d / "f", "moving\n")
    ino = (d / "f").stat().st_ino
    host_dir = world.through(world.host, d)
    agent("os.rename(os.path.join(p, 'f'), os.path.join(p, 'g')); r = None", p=world.v(d))
    assert sorted(os.listdir(host_dir)) == ["g"] and os.stat(host_dir / "g").st_ino == ino
    hidden = world.data(HIDDEN) / f"moved-{d.name}"
    os.rename(host_dir / "g", world.through(world.host, hidden))
    try:
        g = world.v(d / "g")
        assert wait_for(lambda: agent("r = done(os.stat, p)", p=g) == "ENOENT", WITHIN)
        assert agent("r = sorted(os.listdir(p))", p=world.v(d)) == []
        assert agent("r = done(os.stat, p)", p=world.v(hidden)) == "ENOENT"
        assert os.stat(world.through(world.host, hidden)).st_ino == ino
        assert hidden.read_text() == "moving\n"
    finally:
        hidden.unlink()


def test_locks_exclude_within_the_agents_view_and_not_across_views(world, agent):
    """docs/mount.md (*Locks*: ``flock`` and ``fcntl`` locks taken through a mount exclude only
    other locks taken through the same mount): the agent holds an exclusive ``flock`` and an
    ``fcntl`` write lock on a file through its view; a second descriptor through the same
    view is refused both (``EWOULDBLOCK``/``EAGAIN``), while root takes both through the
    host's view."""
    d = world.fresh(world.data(), "locks")
    world.owned_file(d / "f", "locked\n")
    p = world.v(d / "f")
    answers = agent("""
a = os.open(p, os.O_RDWR)
fcntl.flock(a, fcntl.LOCK_EX | fcntl.LOCK_NB)
b = os.open(p, os.O_RDWR)
r = {"flock again in the view": done(fcntl.flock, b, fcntl.LOCK_EX | fcntl.LOCK_NB)}
c = os.open(p, os.O_RDWR)
fcntl.lockf(c, fcntl.LOCK_EX | fcntl.LOCK_NB)
import subprocess
child = subprocess.run([sys.executable, "-c",
    "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR)\\n"
    "try:\\n fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('ok')\\n"
    "except OSError as x: print(__import__('errno').errorcode[x.errno])", p],
    capture_output=True, text=True)
r["fcntl lock from another process in the view"] = child.stdout.strip()
""", p=p)  # fmt: skip
    assert answers["flock again in the view"] == "EAGAIN"  # EWOULDBLOCK is EAGAIN on Linux
    assert answers["fcntl lock from another process in the view"] in ("EAGAIN", "EACCES")
    through_host = world.through(world.host, d / "f")
    fd = os.open(through_host, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    agent("[os.close(x) for x in (a, b, c)]; r = None")


# ------------------------------------------------------------- odd but legal arrangements


OWN_CONTROL = """
r = {
    "read": text(p),
    "open for writing": done(opened, p, os.O_WRONLY | os.O_APPEND),
    "O_TRUNC": done(opened, p, os.O_RDONLY | os.O_TRUNC),
    "truncate": done(os.truncate, p, 0),
    "chmod": done(os.chmod, p, 0o666),
    "chown to its own group": done(os.chown, p, -1, os.getgid()),
    "utime now": done(os.utime, p),
    "utime exact": done(os.utime, p, ns=(1, 1)),
    "unlink": done(os.unlink, p),
    "rename within its controls": done(os.rename, p, p + ".old"),
    "rename to the home": done(os.rename, p, os.path.join(home, "system.md")),
    "link to the home": done(os.link, p, os.path.join(home, "system.md")),
}
"""


def test_a_control_file_the_agents_uid_owns_takes_no_change_through_its_view(world, agent):
    """docs/mount.md (writes are allowed in the agent's home and in the spaces it may write;
    a change it may not make is ``EACCES``) and A-5 (``system.md`` is replaced only by the
    host, over the run capability): with ``agent/coder.d/system.md`` given to the agent's
    uid by mistake, so that the kernel's mode bits let its owner change it, every change
    through the view — write, ``O_TRUNC``, truncate, chmod, chown, times, unlink, renames
    and a link out — is ``EACCES``; the agent reads it and the file is left as it was."""
    control = world.controls / "system.md"
    os.chown(control, world.user.uid, world.user.gid)
    home = world.fresh(world.home, "control")
    try:
        before = tree(world.controls)
        answers = agent(OWN_CONTROL, p=world.v(control), home=world.v(home))
        assert answers.pop("read") == control.read_text()
        assert answers == dict.fromkeys(answers, "EACCES"), answers
        assert tree(world.controls) == before and os.listdir(home) == []
    finally:
        os.chown(control, 0, 0)


def test_a_file_with_a_second_name_in_a_hidden_space_is_changed_through_its_visible_name(
    world, agent
):
    """docs/mount.md (a file keeps its own link count; a name it may not see is ``ENOENT``;
    other names of an unlinked file stay): the host links a file of space ``team`` into
    space ``secret``; through the view the agent reads and appends to it by its ``team``
    name (``st_nlink`` 2, the inode number on disk), never reaches the ``secret`` name, and
    its unlink removes only the ``team`` name: the file lives on in ``secret`` with the
    agent's lines."""
    d = world.fresh(world.data(), "twice")
    world.owned_file(d / "f", "first\n")
    hidden = world.data(HIDDEN) / f"twice-{d.name}"
    os.link(d / "f", hidden)
    try:
        answers = agent("""
with open(p, "a") as f:
    f.write("appended by the agent\\n")
st = os.stat(p)
r = {
    "links": st.st_nlink,
    "inode": st.st_ino,
    "read": text(p),
    "the hidden name": done(os.stat, hidden),
    "link to the hidden name again": done(os.link, p, hidden),
    "unlink": done(os.unlink, p),
    "after": sorted(os.listdir(os.path.dirname(p))),
}
""", p=world.v(d / "f"), hidden=world.v(hidden))  # fmt: skip
        assert answers == {
            "links": 2,
            "inode": hidden.stat().st_ino,
            "read": "first\nappended by the agent\n",
            "the hidden name": "ENOENT",
            "link to the hidden name again": "ENOENT",
            "unlink": "ok",
            "after": [],
        }
        assert hidden.read_text() == "first\nappended by the agent\n"
        assert hidden.stat().st_nlink == 1 and not (d / "f").exists()
    finally:
        hidden.unlink()


def test_a_storage_root_replaced_under_the_view_empties_it_until_put_back(own_world, own_agent):
    """docs/mount.md (while the storage root's path names another directory than the one the
    mount serves — the root moved aside and another made in its place, whose controls would
    grant over the old root's files — the view is empty, every name ``ENOENT``, nothing may be
    changed; ``ctx mount`` says so, goes on serving and notes the repair): the agent works in
    its home when the administrator moves the root aside and puts a copy of its controls,
    granting every space, at its path; the view lists nothing, names by path and relative to
    the working directory are ``ENOENT`` and nothing is made; the root put back brings the
    view back within a second."""
    world, agent = own_world, own_agent
    d = world.fresh(world.home, "replaced")
    world.owned_file(d / "f", "f\n")
    world.owned_file(d / "w", "")
    assert agent(HOLD_IN_SPACE, d=world.v(d)) == ["f", "w"]
    aside = world.top / "storage.aside"
    os.rename(world.storage, aside)
    try:
        impostor = world.storage
        shutil.copytree(aside / "agent", impostor / "agent", symlinks=True)
        policy = impostor / "agent" / f"{AGENT}.d" / "policy"
        with policy.open("a") as rules:
            rules.write(
                f"allow {LABEL} shared:{HIDDEN} read\nallow {LABEL} shared:{HIDDEN} write\n"
            )
        for entry in sorted(ROOT_ENTRIES - {"agent"}):
            (impostor / entry).mkdir(mode=0o755)
        assert wait_for(lambda: agent("r = sorted(os.listdir(v))", v=str(world.view)) == [], WITHIN)
        assert wait_for(lambda: agent("r = done(os.stat, 'f')") == "ENOENT", WITHIN)
        # Each listing of the root renews the kernel's entries of its names for half a second.
        probe = "r = [done(os.stat, secret), done(os.stat, home)]"
        names = {"secret": str(world.view / "shared" / HIDDEN), "home": str(world.view / "home")}
        assert wait_for(lambda: agent(probe, **names) == ["ENOENT", "ENOENT"], WITHIN)
        made = agent("r = done(opened, 'new', os.O_WRONLY | os.O_CREAT)")
        assert made in ("ENOENT", "EACCES"), made
        shutil.rmtree(impostor)
    finally:
        if world.storage.exists():
            shutil.rmtree(world.storage)
        os.rename(aside, world.storage)
    assert wait_for(lambda: agent("r = e(text, 'f')") == "f\n", WITHIN)
    assert sorted(os.listdir(d)) == ["f", "w"]
    said = (world.top / "view.stderr").read_text()
    assert f"warning: agent {AGENT}'s view is empty until it is repaired: ENOENT" in said, said
    assert f"note: agent {AGENT}'s view shows its entries again" in said, said
