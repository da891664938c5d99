"""Storage roots at unusual paths (SPEC R-1, R-5, Q-1..Q-5, T-8, A-3, P-5, S-1, H-4, F-1), named
by ``--storage`` and ``CTX_STORAGE``: a path holding spaces, quotes and ``$``, a line break,
bytes that are not UTF-8, a decomposed (NFD) accent, a leading dash; the same root spelt with
a trailing slash, ``.``, ``//`` and ``..``; a root reached through a symbolic link to its
parent; a component of NAME_MAX bytes and paths near and past PATH_MAX; a root that is itself
a mount point, one inside a bind mount and one reached through a second bind mount; a root
moved by ``mv`` after bootstrap.

Bootstrap, the queue (publish, claim, finish, recover, a worker), object install, agent
create, ``ctx run``, sessions, ``ctx tool tsh.config`` and ``ctx mount`` must work on such a
root or refuse with an errno naming the path printably; no command may act on another
directory than the one named; every path printed (text and ``--json``) is the one given, in
its canonical absolute form, and every command an error suggests, run by a shell, acts on the
very same root."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, ROOT_ENTRIES, mounted_at, scratch_top, snapshot
from tests.support.scratch_mounts import ScratchMounts

CTX = os.fsencode(CTX_ARGV[0])
SCRATCH = scratch_top(__file__)
JOB = json.dumps(
    {"tool": "fs.stat", "input": {"path": "/ctx"}, "from": "me", "created": "2026-06-22T12:00:00Z"}
)
MANIFEST = {
    "manifest": 2,
    "kind": "tool",
    "name": "hello.say",
    "description": "say hello",
    "schema": {"type": "object"},
    "cap": {"side_effects": False, "network": False},
    "exec": "/bin/echo",
}
AGENT = json.dumps({"name": "ci", "label": "ci_t", "tools": ["fs.stat"]})
PATH_MAX = 4096

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid; mounts")
needs_fuse = pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists("/dev/fuse"), reason="needs /dev/fuse and root"
)


# ------------------------------------------------------------------------------ helpers


class Done:
    """What one ``ctx`` command did; its output decoded as ctx encodes file names
    (surrogate escapes for bytes that are not UTF-8)."""

    def __init__(self, argv: list[bytes], proc: subprocess.CompletedProcess) -> None:
        self.argv = argv
        self.rc = proc.returncode
        self.out = proc.stdout.decode("utf-8", "surrogateescape")
        self.err = proc.stderr.decode("utf-8", "surrogateescape")

    def json(self):
        return json.loads(self.out)

    def __repr__(self) -> str:
        words = b" ".join(self.argv).decode("utf-8", "backslashreplace")
        return f"$ ctx {words}\nexit {self.rc}\nstdout: {self.out!r}\nstderr: {self.err!r}"


def base_env(**extra: str | bytes) -> dict[bytes, bytes]:
    env = {os.fsencode(k): os.fsencode(v) for k, v in os.environ.items()}
    env = {k: v for k, v in env.items() if not k.startswith(b"CTX_")}
    env.update({os.fsencode(k): os.fsencode(v) for k, v in extra.items()})
    return env


def ctx(
    *args: str | bytes | os.PathLike,
    env: dict[bytes, bytes] | None = None,
    stdin: str = "",
    cwd: Path | None = None,
) -> Done:
    """``ctx ARGS`` with every word passed as bytes (a path that is not UTF-8 stays itself)."""
    argv = [os.fsencode(a) for a in args]
    proc = subprocess.run(
        [CTX, *argv], input=stdin.encode(), capture_output=True,
        env=env if env is not None else base_env(), cwd=cwd, timeout=120,
    )  # fmt: skip
    return Done(argv, proc)


def on(root: str | Path, *args, **kw) -> Done:
    return ctx("--storage", root, *args, **kw)


def shown(text: str) -> str:
    """How a path is printed in text output: every character that is not printable as its
    Python escape (a line break as ``\\x0a``, a byte that is not UTF-8 as ``\\udcXX``)."""
    out = []
    for char in text:
        if char.isprintable():
            out.append(char)
        elif ord(char) < 0x100:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(f"\\u{ord(char):04x}" if ord(char) < 0x10000 else f"\\U{ord(char):08x}")
    return "".join(out)


def error_line(done: Done, errno_name: str) -> str:
    """The one ``ctx: ERRNO: ...`` line of a refusal, with no traceback."""
    assert "Traceback" not in done.err, done
    lines = [x for x in done.err.splitlines() if x.startswith("ctx: ")]
    lines = [x for x in lines if not x.startswith("ctx: warning:")]
    assert len(lines) == 1 and lines[0].startswith(f"ctx: {errno_name}: "), done
    return lines[0]


def allow_stat(root: str | Path) -> None:
    """Agent ``ci`` (fs.stat) made, and let run fs.stat by the tool's own policy (P-6)."""
    made = on(root, "agent", "create", "-", "--json", stdin=AGENT)
    assert made.rc == 0, made
    with open(os.path.join(os.fsencode(root), b"tool/fs.stat.d/policy"), "ab") as policy:
        policy.write(b"allow ci_t tool:fs.stat execute\n")


def native_stat(root: str | Path, path: str = "/ctx/tool") -> tuple[Done, dict]:
    ran = on(root, "run", "--agent", "ci", "--native", "fs.stat", stdin=json.dumps({"path": path}))
    frames = [json.loads(line) for line in ran.out.splitlines()]
    assert frames and frames[-1]["type"] == "result", ran
    return ran, frames[-1]


@pytest.fixture
def place() -> Iterator[Path]:
    """A scratch directory every uid may search, below /tmp/<this file's stem>-<uid>/."""
    SCRATCH.mkdir(mode=0o755, exist_ok=True)
    SCRATCH.chmod(0o755)
    path = Path(tempfile.mkdtemp(dir=SCRATCH))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def mounts(place: Path) -> Iterator[ScratchMounts]:
    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    made = ScratchMounts(place / "mnt")
    try:
        yield made
    finally:
        made.close()


def whole_flow(root: str, *, everything: bool = True) -> None:
    """Bootstrap, the queue's life, an install, an agent and its call, and (``everything``)
    a worker, sessions and tsh.config on ``root``: each works, and every path printed is
    ``root``'s."""
    boot = on(root, "bootstrap", "--json")
    assert boot.rc == 0 and boot.json()["root"] == root and boot.json()["problems"] == [], boot
    text = on(root, "bootstrap")
    assert text.rc == 0 and text.out.splitlines()[0] == f"storage root: {shown(root)}", text
    assert all(line.isprintable() for line in text.out.splitlines()), text
    assert sorted(os.listdir(os.fsencode(root))) == sorted(os.fsencode(e) for e in ROOT_ENTRIES)
    # The terminal launcher bootstrap writes holds this root, not a mangled copy of it.
    with open(os.path.join(os.fsencode(root), b"bin/ctxterm"), encoding="utf-8") as script:
        launcher = script.read()
    assert f"storage={root!r}" in launcher, launcher[-300:]

    queue = root + "/shared/p/queue"
    init = on(root, "queue", "init", "--project", "p", "--json")
    assert init.rc == 0 and init.json()["queue"] == queue, init
    status = on(root, "queue", "status", "--project", "p")
    assert status.out.splitlines()[0] == f"queue: {shown(queue)}", status
    published = on(root, "queue", "publish", "--project", "p", "--name", "j", "-", stdin=JOB)
    assert (published.rc, published.out) == (0, "j.req.json\n"), published
    claimed = on(root, "queue", "claim", "--project", "p", "--json")
    assert claimed.rc == 0 and claimed.json()["name"] == "j.req.json", claimed
    finished = on(root, "queue", "finish", "--project", "p", "j.req.json", "--ok", "-", stdin="{}")
    assert finished.rc == 0, finished
    assert os.path.isfile(os.fsencode(queue + "/done/j.req.json.result"))
    recovered = on(root, "queue", "recover", "--project", "p", "--json")
    assert recovered.rc == 0 and recovered.json()["consistent"] is True, recovered

    manifest = os.path.join(os.path.dirname(os.fsencode(root)), b"hello.json")
    with open(manifest, "w") as out:
        out.write(json.dumps(MANIFEST))
    installed = on(root, "object", "install", manifest, "--tier", "system")
    assert installed.rc == 0 and shown(root + "/tool/hello.say") in installed.out, installed

    allow_stat(root)
    shown_agent = on(root, "agent", "show", "ci", "--json")
    mounted = [m[:3] for m in shown_agent.json()["tool_mounts"]]
    assert [root, "/ctx", "ro"] in mounted, shown_agent
    ran, result = native_stat(root)
    assert (ran.rc, result["status"]) == (0, "ok"), ran
    if not everything:
        return
    assert on(root, "queue", "publish", "--project", "p", "--name", "w", "-", stdin=JOB).rc == 0
    worked = on(root, "queue", "work", "--project", "p", "--drain", "--agent", "ci")
    assert worked.rc == 0, worked
    with open(os.fsencode(queue + "/done/w.req.json.result")) as res:
        assert json.load(res)["status"] == "ok"
    sessions = on(root, "session", "list", "ci")
    assert sessions.rc == 0 and "default" in sessions.out.split(), sessions
    config = on(root, "tool", "tsh.config", env=base_env(CTX_PATH=root + "/tool"))
    assert config.rc == 0 and "cache_capacity=32" in config.out.split(), config


# ------------------------------------------------------------------------------ the tests


@needs_root
@pytest.mark.parametrize(
    "leaf",
    [
        pytest.param('it\'s a "root" $HOME `x` ;', id="quotes-spaces-dollar"),
        pytest.param("line\nbreak\tand\x1b[31mescape", id="newline-tab-escape"),
        pytest.param(os.fsdecode(b"lat\xe9\xff-root"), id="not-utf8"),
    ],
)
def test_a_root_at_an_exotic_path_carries_every_flow_and_prints_itself(
    place: Path, leaf: str
) -> None:
    """R-1, R-5, Q-1..Q-5, T-8, A-3, S-1, H-4: on a root whose path holds shell syntax, a line
    break and an escape sequence, or bytes that are not UTF-8, every flow works; text output
    shows the path escaped (one line each, no raw control byte), --json holds the path itself
    (non-UTF-8 bytes as surrogate escapes), and no directory but the one named is made."""
    root = os.fsdecode(os.path.join(os.fsencode(place), os.fsencode(leaf)))
    whole_flow(root)
    assert sorted(os.listdir(place)) == sorted([os.path.basename(root), "hello.json"])


@needs_root
def test_a_decomposed_accent_stays_decomposed_and_the_composed_name_is_another_root(
    place: Path,
) -> None:
    """R-1: a path is a string of bytes: a root named with an NFD accent is used and printed
    as given (never normalized to NFC), and the NFC spelling of it, which the kernel sees as
    another name, is refused by reading commands as missing, naming the NFC path."""
    nfd = str(place / unicodedata.normalize("NFD", "café root"))
    nfc = str(place / unicodedata.normalize("NFC", "café root"))
    assert nfd != nfc
    init = on(nfd, "queue", "init", "--project", "p", "--json")
    assert init.rc == 0 and init.json()["queue"] == nfd + "/shared/p/queue", init
    assert on(nfd, "queue", "publish", "--project", "p", "--name", "j", "-", stdin=JOB).rc == 0
    assert os.listdir(place) == [os.path.basename(nfd)]
    before = snapshot(Path(nfd))

    for args in (["queue", "status", "--project", "p"], ["queue", "claim", "--project", "p"]):
        missing = on(nfc, *args)
        assert missing.rc == 1, missing
        assert f"no queue at {nfc}/shared/p/queue" in error_line(missing, "ENOENT"), missing
    listed = on(nfc, "agent", "list")
    assert f"storage root {nfc} does not exist" in error_line(listed, "ENOENT"), listed
    assert snapshot(Path(nfd)) == before
    assert os.listdir(place) == [os.path.basename(nfd)]
    status = on(nfd, "queue", "status", "--project", "p", "--json")
    assert status.json()["queue"] == nfd + "/shared/p/queue", status
    assert status.json()["counts"]["pending"] == 1, status


@pytest.mark.parametrize(
    "leaf",
    [
        pytest.param("sp ace 'q' \"d\"", id="quotes"),
        pytest.param("nl\nx", id="newline"),
        pytest.param(os.fsdecode(b"b\xe9\xff"), id="not-utf8"),
    ],
)
def test_a_command_an_error_suggests_acts_on_the_very_root_when_a_shell_runs_it(
    place: Path, leaf: str
) -> None:
    """R-1 and docs/queue.md ('a ctx queue command that a refusal suggests names the queue as
    the command was told it ... so that the suggestion, copied into another shell, acts on the
    same queue'): the 'ctx bootstrap' and 'ctx queue init' an ENOENT suggests for a root at
    an exotic path, run by bash, make exactly that root and queue, nothing beside them."""
    root = os.fsdecode(os.path.join(os.fsencode(place), os.fsencode(leaf)))
    bash_env = base_env(PATH=os.path.dirname(CTX_ARGV[0]) + ":/usr/bin:/bin")

    def suggested(done: Done, errno_name: str, lead: str) -> str:
        line = error_line(done, errno_name)
        assert line.isprintable(), done  # a shell word with $'...' escapes, not raw bytes
        command = line.split(lead, 1)[1]
        assert command.startswith("ctx ") and command.endswith("'"), done
        return command[:-1]

    missing_root = on(root, "agent", "list")
    command = suggested(missing_root, "ENOENT", "create it with '")
    assert not os.path.lexists(os.fsencode(root))
    ran = subprocess.run([b"bash", b"-c", command.encode()], env=bash_env, capture_output=True)
    assert ran.returncode == 0, (command, ran)
    assert sorted(os.listdir(os.fsencode(root))) == sorted(os.fsencode(e) for e in ROOT_ENTRIES)

    missing_queue = on(root, "queue", "status", "--project", "p")
    command = suggested(missing_queue, "ENOENT", "create it with '")
    ran = subprocess.run([b"bash", b"-c", command.encode()], env=bash_env, capture_output=True)
    assert ran.returncode == 0, (command, ran)
    assert os.path.isdir(os.path.join(os.fsencode(root), b"shared/p/queue/pending"))
    assert os.listdir(place) == [os.path.basename(root)]


def test_one_root_under_many_spellings_is_one_queue_printed_in_one_canonical_form(
    place: Path,
) -> None:
    """R-1 with docs/queue.md ('a path made absolute'): a trailing slash, '.' and doubled
    slashes, a relative path from elsewhere with '..', and a relative name with a leading dash
    given as CTX_STORAGE or as '--storage=-x' / '--storage -x' all name one root: every
    command acts on it, and every --json path is its absolute form without those spellings."""
    site = place / "site"
    site.mkdir()
    (place / "elsewhere").mkdir()
    root = str(site / "-dash root")
    queue = root + "/shared/p/queue"
    made = ctx("--storage=-dash root", "queue", "init", "--project", "p", "--json", cwd=site)
    assert made.rc == 0 and made.json()["queue"] == queue, made

    spellings = [
        (["--storage", root + "/"], None, place),
        (["--storage", str(site) + "/./-dash root/."], None, place),
        (["--storage", str(site) + "//-dash root//"], None, place),
        (["--storage", "../site/-dash root"], None, place / "elsewhere"),
        (["--storage", "-dash root"], None, site),
        ([], "-dash root/", site),
        ([], "./-dash root", site),
    ]
    for number, (option, env_value, cwd) in enumerate(spellings):
        env = base_env() if env_value is None else base_env(CTX_STORAGE=env_value)
        sent = ctx(*option, "queue", "publish", "--project", "p", "--name", f"j{number}", "-",
                   stdin=JOB, env=env, cwd=cwd)  # fmt: skip
        assert (sent.rc, sent.out) == (0, f"j{number}.req.json\n"), sent
        if number in (0, 3):  # a trailing slash; '..' from elsewhere
            status = ctx(*option, "queue", "status", "--project", "p", "--json", cwd=cwd)
            assert status.rc == 0 and status.json()["queue"] == queue, status
        if number == len(spellings) - 2:  # a relative CTX_STORAGE with a trailing slash
            boot = ctx("bootstrap", "--json", env=env, cwd=cwd)
            assert boot.rc == 0 and boot.json()["root"] == root, boot
    pending = sorted(os.listdir(queue + "/pending"))
    assert pending == sorted(f"j{n}.req.json" for n in range(len(spellings)))
    assert sorted(os.listdir(place)) == ["elsewhere", "site"]
    assert os.listdir(place / "elsewhere") == [] and os.listdir(site) == ["-dash root"]


def test_a_dotdot_after_a_symbolic_link_is_read_as_the_kernel_reads_it(place: Path) -> None:
    """R-1: in 'link/../root' with link -> real/sub, the kernel's '..' is real/, so that is
    where the root is made and what is printed; the textual reading (place/root) is not
    touched."""
    (place / "real" / "sub").mkdir(parents=True)
    (place / "link").symlink_to("real/sub")
    boot = on(str(place / "link") + "/../root", "bootstrap", "--json")
    assert boot.rc == 0 and boot.json()["root"] == str(place / "real" / "root"), boot
    assert not (place / "root").exists()
    assert sorted(os.listdir(place / "real")) == ["root", "sub"]


@needs_root
def test_a_root_below_a_linked_parent_is_named_as_given_and_mounted_by_its_real_path(
    place: Path,
) -> None:
    """R-1, A-3, S-1: a root named through a symbolic link to its parent is made in the
    link's target; commands print it as given, the agent's /ctx mount records its real path,
    an agent's call and its session work through either name."""
    (place / "disk" / "vol").mkdir(parents=True)
    (place / "lp").symlink_to("disk/vol")
    given, real = str(place / "lp" / "root"), str(place / "disk" / "vol" / "root")
    init = on(given, "queue", "init", "--project", "p", "--json")
    assert init.rc == 0 and init.json()["queue"] == given + "/shared/p/queue", init
    assert (place / "lp").is_symlink() and os.path.isdir(real + "/shared/p/queue/done")
    allow_stat(given)
    with open(real + "/agent/ci.d/mount") as table:
        assert [real, "/ctx", "ro"] in json.load(table)
    for name in (given, real):
        ran, result = native_stat(name)
        assert (ran.rc, result["status"]) == (0, "ok"), ran
    listed = on(given + "/", "session", "list", "ci")
    assert listed.rc == 0 and listed.out.split() == ["default"], listed


@needs_root
def test_a_component_of_name_max_bytes_works_and_one_byte_more_is_enametoolong(
    place: Path,
) -> None:
    """R-1, R-5: a root whose last component is 255 bytes (NAME_MAX) carries the queue; one
    of 256 bytes is refused ENAMETOOLONG by bootstrap, init and the readers, naming the path,
    and nothing is made."""
    ok = str(place / ("n" * 255))
    assert on(ok, "queue", "init", "--project", "p").rc == 0
    sent = on(ok, "queue", "publish", "--project", "p", "--name", "j", "-", stdin=JOB)
    assert sent.rc == 0, sent
    assert on(ok, "queue", "claim", "--project", "p").out == "j.req.json\n"

    too_long = str(place / ("m" * 256))
    for args in (["bootstrap"], ["queue", "init", "--project", "p"], ["agent", "list"]):
        refused = on(too_long, *args)
        assert refused.rc == 1, refused
        assert too_long in error_line(refused, "ENAMETOOLONG"), refused
    assert os.listdir(place) == ["n" * 255]


def _deep(top: Path, length: int) -> str:
    """A path below ``top`` exactly ``length`` bytes long, made of 200-byte directories (the
    last one shorter), the directories above its last component made here with relative
    mkdirs (no single path handed to the kernel gets that long)."""
    parts, total = [], len(str(top))
    while total + 201 < length:
        parts.append("d" * 200)
        total += 201
    parts.append("e" * (length - total - 1))
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, dir_fd=fd)
            below = os.open(part, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = below
    finally:
        os.close(fd)
    return "/".join([str(top), *parts])


def test_a_root_near_path_max_keeps_its_queue_and_bootstrap_says_what_it_could_not_make(
    place: Path,
) -> None:
    """R-5, Q-1..Q-5: a root 4072 bytes long, whose deeper files would pass PATH_MAX: the
    queue still publishes, claims, finishes and recovers (it works by directory), and
    bootstrap exits 1 with ENAMETOOLONG naming what it could not make and 'a shorter
    storage root path', never a traceback."""
    root = _deep(place, 4072)
    assert len(os.fsencode(root)) == 4072
    boot = on(root, "bootstrap")
    assert boot.rc == 1, boot
    line = error_line(boot, "ENAMETOOLONG")
    assert "a shorter storage root path" in line, boot
    assert "run 'ctx bootstrap --storage " in line and "' again, which" in line, boot
    assert on(root, "queue", "init", "--project", "p").rc == 0
    sent = on(root, "queue", "publish", "--project", "p", "--name", "j", "-", stdin=JOB)
    assert sent.rc == 0, sent
    assert on(root, "queue", "claim", "--project", "p").out == "j.req.json\n"
    done = on(root, "queue", "finish", "--project", "p", "j.req.json", "--ok", "-", stdin="{}")
    assert done.rc == 0, done
    shown_job = on(root, "queue", "show", "--project", "p", "j.req.json", "--json")
    assert shown_job.rc == 0 and shown_job.json()["state"] == "done", shown_job
    recovered = on(root, "queue", "recover", "--project", "p", "--json")
    assert recovered.rc == 0 and recovered.json()["consistent"] is True, recovered


def test_a_root_path_longer_than_path_max_is_refused_before_anything_is_made(
    place: Path,
) -> None:
    """R-1, R-5: a root path of more bytes than PATH_MAX can never be opened by its path: the
    refusal (ENAMETOOLONG, naming it, saying what to do) comes before any directory is made,
    by bootstrap as by queue init."""
    top = place / "top"
    top.mkdir()
    root = str(top) + ("/" + "x" * 200) * 21
    assert len(os.fsencode(root)) > PATH_MAX
    for args in (["bootstrap"], ["queue", "init", "--project", "p"]):
        refused = on(root, *args)
        assert refused.rc == 1, refused
        line = error_line(refused, "ENAMETOOLONG")
        assert os.listdir(top) == [], (args, "left behind")
        assert "shorter" in line, refused


def test_ctx_run_takes_a_storage_value_with_a_leading_dash_as_every_command_does(
    place: Path,
) -> None:
    """R-1 ('--storage DIR overrides it everywhere'): the next word after '--storage' is its
    value whatever its first character, for the click commands (which take it) and for ctx
    run alike."""
    root = place / "-r"
    assert ctx("--storage", "-r", "bootstrap", cwd=place).rc == 0
    listed = ctx("agent", "list", "--storage", "-r", cwd=place)
    assert listed.rc == 0, listed
    assert ctx("--storage", "-r", "agent", "create", "-", stdin=AGENT, cwd=place).rc == 0
    assert os.path.isdir(root / "agent" / "ci.d")
    ran = ctx("run", "--storage", "-r", "--agent", "ci", "fs.stat", "/ctx", cwd=place)
    assert "requires an argument" not in ran.err, ran
    assert "EINVAL" not in ran.err, ran


@needs_root
def test_a_root_that_is_a_mount_point_works_and_a_world_writable_one_is_named(
    mounts: ScratchMounts,
) -> None:
    """R-1, R-5, A-3: a tmpfs mounted as the root itself (mode 0755) is bootstrapped and used
    by the queue, an agent and a worker.  A tmpfs left at its default mode 1777 is
    bootstrapped too, but bootstrap exits 1 naming it and 'chmod go-w'; after that chmod it
    exits 0."""
    root = str(mounts.tmpfs("tidy", "size=32m,mode=0755"))
    whole_flow(root, everything=False)

    loose = mounts.tmpfs("loose", "size=8m")
    assert loose.stat().st_mode & 0o7777 == 0o1777
    boot = on(loose, "bootstrap", "--json")
    assert boot.rc == 1 and boot.json()["created"], boot
    problems = boot.json()["problems"]
    assert len(problems) == 1 and f"'chmod go-w {loose}'" in problems[0], boot
    assert sorted(os.listdir(loose)) == sorted(ROOT_ENTRIES)
    loose.chmod(0o755)
    again = on(loose, "bootstrap", "--json")
    assert again.rc == 0 and again.json()["problems"] == [], again


@needs_root
def test_a_root_inside_a_bind_mount_is_used_by_the_path_it_was_made_through(
    place: Path, mounts: ScratchMounts
) -> None:
    """R-1, A-3, W-1: a root below a bind mount, made and used through the bind mount's path:
    the agent's /ctx mount records that path, its call and a worker's job work, and the files
    land in the bound directory."""
    (place / "disk" / "inner").mkdir(parents=True)
    bound = mounts.bind(place / "disk", "bound")
    root = str(bound / "inner" / "root")
    assert on(root, "queue", "init", "--project", "p").rc == 0
    allow_stat(root)
    with open(root + "/agent/ci.d/mount") as table:
        assert [root, "/ctx", "ro"] in json.load(table)
    ran, result = native_stat(root)
    assert (ran.rc, result["status"]) == (0, "ok"), ran
    assert on(root, "queue", "publish", "--project", "p", "--name", "j", "-", stdin=JOB).rc == 0
    worked = on(root, "queue", "work", "--project", "p", "--drain", "--agent", "ci")
    assert worked.rc == 0, worked
    assert (place / "disk/inner/root/shared/p/queue/done/j.req.json.result").is_file()


@needs_root
def test_a_root_reached_through_a_second_bind_mount_works_or_says_why_not(
    place: Path, mounts: ScratchMounts
) -> None:
    """R-1, A-3, P-5 with docs/policy.md: the same directory reached by another bind mount is
    this root (the /ctx mount's source is the same directory): the agent's call works there,
    or, if only the recorded path may be used, the refusal says that the /ctx mount names
    another path (both named) and 'ctx agent show' lists the mount as withheld."""
    root = str(place / "root")
    assert on(root, "bootstrap").rc == 0
    allow_stat(root)
    again = str(mounts.bind(Path(root), "again"))
    assert os.path.samefile(root, again)
    ran, result = native_stat(again)
    if result["status"] == "ok":
        return
    message = result["error"]["message"]
    assert root in message and again in message, ran
    shown_agent = on(again, "agent", "show", "ci", "--json")
    assert shown_agent.json()["withheld_mounts"] != [], shown_agent


@needs_root
def test_a_root_moved_to_a_path_with_a_line_break_names_both_paths_printably(
    place: Path,
) -> None:
    """R-1, A-3, P-5 with docs/policy.md: after 'mv' of a bootstrapped root to a path with a
    line break, the queue keeps its jobs there; an agent's call is refused naming the old and
    the new path, each escaped (the message stays one line); bootstrap repairs the entries and
    names the new path in --json as it is."""
    old = str(place / "old")
    assert on(old, "queue", "init", "--project", "p").rc == 0
    allow_stat(old)
    assert on(old, "queue", "publish", "--project", "p", "--name", "j", "-", stdin=JOB).rc == 0
    new = str(place / "new\nroot")
    os.rename(old, new)

    status = on(new, "queue", "status", "--project", "p", "--json")
    assert status.rc == 0 and status.json()["counts"]["pending"] == 1, status
    assert status.json()["queue"] == new + "/shared/p/queue", status
    refused = on(new, "run", "--agent", "ci", "fs.stat", "/ctx/tool")
    assert refused.rc == 126 and "Traceback" not in refused.err, refused
    assert old in refused.err and shown(new) in refused.err, refused
    assert "\n" not in refused.err.rstrip("\n"), refused
    boot = on(new, "bootstrap", "--json")
    assert boot.rc == 0 and boot.json()["root"] == new, boot
    assert "bin/ctxterm" in boot.json()["repaired"], boot
    assert not os.path.exists(old)


@needs_fuse
def test_ctx_mount_shows_a_root_at_a_path_with_a_line_break_and_bytes_not_utf8(
    place: Path,
) -> None:
    """F-1, R-2: 'ctx mount --storage ROOT' of a root whose path holds a line break and bytes
    that are not UTF-8 shows exactly the six root entries and the queue's files, and
    'ctx umount' ends it cleanly."""
    root = os.fsdecode(os.path.join(os.fsencode(place), b"m\nr\xe9\xff"))
    assert on(root, "queue", "init", "--project", "p").rc == 0
    assert on(root, "queue", "publish", "--project", "p", "--name", "j", "-", stdin=JOB).rc == 0
    where = place / "view"
    where.mkdir()
    proc = subprocess.Popen(
        [CTX, b"mount", b"--storage", os.fsencode(root), os.fsencode(where)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=base_env(), start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 15
        while not mounted_at(where):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "ctx mount did not mount in time"
            time.sleep(0.05)
        assert sorted(os.listdir(where)) == sorted(ROOT_ENTRIES)
        assert os.listdir(where / "shared/p/queue/pending") == ["j.req.json"]
        ended = ctx("umount", where)
        assert ended.rc == 0, ended
        out, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, (out, err)
    finally:
        if mounted_at(where):
            subprocess.run(["umount", "-l", str(where)], check=False)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
