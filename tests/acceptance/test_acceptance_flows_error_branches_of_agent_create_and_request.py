"""The error branches of making agents — ``ctx agent create`` and its request, the core tools
``agent.create`` and ``agent.update`` as an agent calls them, ``ctx agent list|show`` and the
bootstrap step that rewrites agents' entries — each reached from outside as a user or an agent
reaches it, and judged by SPEC, the docs and the help texts.

The angle: requests of odd shapes (mount targets whose last part names no policy object, as
many readable spaces as ``CTX_PATH`` holds to the byte, mounts past the ``CTX_MOUNTS`` budget,
a link or a file where a granted space should be), request files the kernel refuses to open,
ids that are no ids and groups a non-root owner does not hold (a second real user), an
``agent/`` directory that is missing, a link or a file, its install lock a directory, an entry
that is a link; a parent agent asking for a child whose name an earlier agent's sessions hold
in a space, whose label is another agent's, whose request the tool or the host refuses; an
agent updating its prompt while its own log cannot be appended to; entries of every shape
before ``ctx bootstrap``.  Each refusal is checked for the documented exit status, the errno
word of the ``PROG: ERRNO: …`` line (and of the ``--json`` error object or the native
``result`` frame), that the message names what is at fault and what to do where the docs say
so, and that nothing is left half-done: no agent, control, staged entry or changed file.

SPEC ids: §8 A-3, A-4, A-5; §1 R-2, R-3, R-5; §4 S-5, S-6; §5 P-5, P-7; §6 T-4.  Docs:
docs/spec/ctx.agent.md (*The request*, *ctx agent create*, *Making a child*, *Changing its own
prompt*), docs/tools.md (*Agents, host side*, *The core tools*) and ``ctx agent create|list|
show --help``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    snapshot,
)
from tests.support.storage import attribute
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as nobody and a second user acts: needs root"
)

TOP = scratch_top(__file__)
NOBODY = 65534
GROUP = 100  # the parent's one supplementary group ("users")
MAX_ID = 4294967294
MAX_ARG_STRLEN = 131072  # the kernel's limit of one argument or environment string
# CTX_PATH as the longest uid makes it, before any space's tier (docs/tools.md, T-4).
CTX_PATH_BASE = len(f"CTX_PATH=/ctx/tool:/ctx/home/{MAX_ID}/tool")
SPACE_ENTRY = len(":/ctx/shared/") + len("/tool")  # what each readable space adds, its name aside


# --------------------------------------------------------------------------- common checks


def refused(run: Run, errno_name: str, status: int, prog: str = "ctx") -> None:
    """``run`` ended with ``status`` and a ``PROG: ERRNO: …`` line, and no traceback."""
    assert run.rc == status, run
    assert f"{prog}: {errno_name}: " in run.err, run
    assert "Traceback" not in run.err, run


def refused_json(run: Run, errno_name: str, status: int) -> dict:
    """As :func:`refused`, for a ``--json`` run, whose stdout is the error object alone."""
    refused(run, errno_name, status)
    error = run.json()
    assert error["error"] == errno_name and isinstance(error["errno"], int), run
    return error


def on(storage: Path) -> dict[str, str]:
    return clean_env(CTX_STORAGE=str(storage))


def create(storage: Path, request: dict | str, *options: str) -> Run:
    """``ctx agent create - --json OPTIONS`` with ``request`` on standard input."""
    text = request if isinstance(request, str) else json.dumps(request)
    return ctx_run("agent", "create", "-", "--json", *options, input=text, env=on(storage))


def lines_of(run: Run, prefix: str) -> list[str]:
    """The stderr lines that start with ``prefix``, the prefix cut off."""
    return [line[len(prefix) :] for line in run.err.splitlines() if line.startswith(prefix)]


def rules(policy: Path) -> list[str]:
    return [line for line in policy.read_text().splitlines() if line.startswith("allow ")]


def shared_rules(controls: Path) -> list[str]:
    return [rule for rule in rules(controls / "policy") if " shared:" in rule]


def space_names(count: int, width: int = 64) -> list[str]:
    """``count`` legal space names of ``width`` bytes each."""
    return [f"s{index:05d}".ljust(width, "x") for index in range(count)]


def spaces_making(size: int) -> list[str]:
    """Space names whose readable tiers make the longest ``CTX_PATH=…`` exactly ``size``
    bytes long: as many 64-byte names as fit, and one shorter name for the rest."""
    per_space = SPACE_ENTRY + 64
    count, rest = divmod(size - CTX_PATH_BASE, per_space)
    names = space_names(count)
    if rest:
        assert rest > SPACE_ENTRY, rest
        names.append("t".ljust(rest - SPACE_ENTRY, "y"))
    assert CTX_PATH_BASE + sum(SPACE_ENTRY + len(n) for n in names) == size
    return names


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory every uid may search, for request files, links and mount sources."""
    made = new_scratch_dir(TOP)
    yield made
    shutil.rmtree(made, ignore_errors=True)


@dataclass
class Host(OnStorage):
    """A root every uid may search, with agent ``parent`` (uid nobody, groups [100]) that may
    run ``agent.create``, ``agent.update`` and ``fs.read`` in both layers of P-6 and holds
    ``agent:kid create``."""

    storage: Path
    scratch: Path

    def call(self, tool: str, value: dict | str, agent: str = "parent") -> Run:
        """A terminal-mode call in session s1."""
        text = value if isinstance(value, str) else json.dumps(value)
        return self.ctx("run", "--agent", agent, "--session", "s1", tool, text)

    def native(self, tool: str, value: dict, agent: str = "parent") -> tuple[Run, dict]:
        """A native-mode call in session s1: the run and its ``result`` frame."""
        run = self.ctx(
            "run", "--agent", agent, "--native", "--session", "s1", tool, input=json.dumps(value)
        )
        frame = json.loads(run.lines()[-1])
        assert frame["type"] == "result", run
        return run, frame

    def events(self, agent: str = "parent") -> list[dict]:
        session = self.storage / "home" / str(NOBODY) / "agent" / agent / "session" / "s1"
        return read_jsonl(session / "events.jsonl")

    def grant(self, agent: str, *granted: str, label: str | None = None) -> None:
        with (self.storage / "agent" / f"{agent}.d" / "policy").open("a") as policy:
            for rule in granted:
                policy.write(f"allow {label or agent + '_t'} {rule}\n")

    def agents(self) -> set[str]:
        return set(os.listdir(self.storage / "agent"))

    def results(self, tool: str, agent: str = "parent") -> list[dict]:
        return [
            e
            for e in self.events(agent)
            if e["type"] == "tool_result" and e["object"] == f"tool/{tool}"
        ]


@pytest.fixture
def host(searchable_storage: Path, scratch: Path) -> Host:
    h = Host(searchable_storage, scratch)
    tools = ["agent.create", "agent.update", "fs.read"]
    h.create_agent({"name": "parent", "label": "parent_t", "tools": tools}, "--groups", str(GROUP))
    h.allow_tool("parent_t", *tools)
    h.grant("parent", "agent:kid create")
    return h


# ------------------------------------------------- ctx agent create: the request's mounts


BAD_TARGETS = {
    "starts-with-a-dash": ("/x/-bad", "'-bad' must start with a letter or digit"),
    "ends-in-dot-d": ("/y/z.d", "'z.d' ends in '.d', which is reserved for control directories"),
    "longer-than-64": ("/q/" + "n" * 65, "is 65 bytes long; at most 64 are allowed"),
    "named-ctx-elsewhere": ("/w/ctx", "the name 'ctx' belongs to the storage view at /ctx"),
}


@pytest.mark.parametrize("case", sorted(BAD_TARGETS))
def test_a_mount_target_whose_last_part_names_no_policy_object_is_refused(
    storage: Path, scratch: Path, case: str
) -> None:
    """A-3, R-3, P-7: a mount is named in policy by the last part of its target, so that part
    must be an object name (and not the view's own ``ctx``): EINVAL, exit 1, the target named,
    the root unchanged."""
    target, reason = BAD_TARGETS[case]
    before = snapshot(storage)
    r = create(storage, {"name": "m", "label": "m_t", "mount": [[str(scratch), target, "ro"]]})
    error = refused_json(r, "EINVAL", 1)
    (line,) = lines_of(r, "ctx: EINVAL: <stdin>: ")
    assert line.startswith(f"mount target {target}: "), r
    assert reason in line and reason in error["message"], r
    assert snapshot(storage) == before


def test_every_bad_mount_target_has_its_own_line_and_the_json_counts_the_others(
    storage: Path, scratch: Path
) -> None:
    """ctx.agent "The request": every problem is listed, one ``ctx: EINVAL: REQUEST:`` line
    each; the ``--json`` error names the first and counts the rest."""
    mounts = [[str(scratch), target, "ro"] for target, _ in BAD_TARGETS.values()]
    before = snapshot(storage)
    r = create(storage, {"name": "m", "label": "m_t", "mount": mounts})
    error = refused_json(r, "EINVAL", 1)
    said = lines_of(r, "ctx: EINVAL: <stdin>: ")
    assert len(said) == len(BAD_TARGETS), r
    for (target, reason), line in zip(BAD_TARGETS.values(), said, strict=True):
        assert target in line and reason in line, (target, line)
    assert error["message"] == f"<stdin>: {said[0]} (and {len(said) - 1} more)", error
    assert snapshot(storage) == before


@pytest.mark.parametrize("size", [MAX_ARG_STRLEN - 1, MAX_ARG_STRLEN], ids=["fits", "one-over"])
def test_readable_spaces_are_refused_from_the_byte_where_ctx_path_passes_the_kernels_limit(
    storage: Path, scratch: Path, size: int
) -> None:
    """docs/tools.md: ``ctx agent create`` refuses a request whose readable spaces would take
    ``CTX_PATH`` (one ``/ctx/shared/<space>/tool`` entry each) past what the kernel passes in
    one variable, counting the NUL: a ``CTX_PATH=…`` of 131071 bytes is taken, one of 131072 is
    EINVAL naming the count and the size, and nothing is made."""
    names = spaces_making(size)
    path = scratch / "spaces.json"
    request = {"name": "many", "label": "many_t", "shared": {name: "read" for name in names}}
    path.write_text(json.dumps(request))
    before = snapshot(storage)
    r = ctx_run("agent", "create", path, "--json", env=on(storage))
    if size < MAX_ARG_STRLEN:
        assert r.rc == 0, r
        assert len(shared_rules(storage / "agent" / "many.d")) == len(names)
        return
    error = refused_json(r, "EINVAL", 1)
    (line,) = lines_of(r, f"ctx: EINVAL: {path}: ")
    assert f"the {len(names)} spaces it may read make a CTX_PATH of {size} bytes" in line, r
    assert "grant read on fewer spaces" in line and line in error["message"], r
    assert snapshot(storage) == before


def test_spaces_granted_write_only_and_the_manual_bundle_take_no_place_on_ctx_path(
    storage: Path, scratch: Path
) -> None:
    """T-4, D-1: only the spaces an agent may read put a tier on its ``CTX_PATH``, and the
    manual bundle never does: the request one byte over the limit is taken once its last
    space is write-only and with ``cortexfs-docs`` readable besides, with the warning that
    write without read grants nothing."""
    names = spaces_making(MAX_ARG_STRLEN)
    shared: dict[str, object] = {name: "read" for name in names}
    shared[names[-1]] = ["write"]
    shared["cortexfs-docs"] = ["read"]
    path = scratch / "spaces.json"
    path.write_text(json.dumps({"name": "many", "label": "many_t", "shared": shared}))
    r = ctx_run("agent", "create", path, "--json", env=on(storage))
    assert r.rc == 0, r
    warnings = r.json()["warnings"]
    assert any(f"shared:{names[-1]} write without read grants nothing" in w for w in warnings)
    assert not any("cortexfs-docs" in w for w in warnings), warnings
    assert len(shared_rules(storage / "agent" / "many.d")) == len(names) + 1


def test_mounts_past_the_ctx_mounts_budget_are_refused_naming_their_count_and_size(
    storage: Path, scratch: Path
) -> None:
    """A-3: the mounts travel to every tool in ``CTX_MOUNTS``; a request whose mounts alone
    would take more than 64 KiB of it is EINVAL naming how many mounts take how many bytes and
    what to do, and nothing is made; the same mounts, fewer, are taken."""
    source = str(scratch / "/".join(["d" * 200] * 19))
    mounts = [[source, f"/m{index:03d}", "ro"] for index in range(20)]
    before = snapshot(storage)
    r = create(storage, {"name": "wide", "label": "wide_t", "mount": mounts})
    error = refused_json(r, "EINVAL", 1)
    (line,) = lines_of(r, "ctx: EINVAL: <stdin>: ")
    assert line.startswith("mount: its 20 mounts take ") and "bytes of CTX_MOUNTS" in line, r
    size = int(line.split(" take ")[1].split()[0])
    assert size > 65536, line
    assert "keep the mounts within 65536 bytes" in line and line in error["message"], r
    assert snapshot(storage) == before
    fewer = create(storage, {"name": "wide", "label": "wide_t", "mount": mounts[:5]})
    assert fewer.rc == 0, fewer
    missing = [w for w in fewer.json()["warnings"] if w.startswith(f"the source {source} ")]
    assert len(missing) == 5 and all("does not exist" in w for w in missing), fewer


# -------------------------------------------- ctx agent create: grants, files and identities


def test_a_link_or_a_file_in_a_granted_spaces_place_is_warned_of_and_never_followed(
    storage: Path, scratch: Path
) -> None:
    """ctx.agent "ctx agent create": a shared grant is kept as asked, with a warning saying
    what lies where the space should be — a symbolic link (never followed: nothing is made
    where it points) or a file — and how the grant takes effect."""
    elsewhere = scratch / "elsewhere"
    elsewhere.mkdir()
    (storage / "shared" / "lnk").symlink_to(elsewhere)
    (storage / "shared" / "afile").write_text("not a space\n")
    r = create(storage, {"name": "g", "label": "g_t", "shared": {"lnk": "read", "afile": ["read"]}})
    assert r.rc == 0, r
    link, file = [w for w in r.json()["warnings"] if w.startswith("shared:")]
    assert link.startswith(f"shared:lnk names a symbolic link at {storage}/shared/lnk"), link
    assert file.startswith(f"shared:afile names no directory at {storage}/shared/afile"), file
    for name, warning in (("lnk", link), ("afile", file)):
        assert f"once it is removed and 'ctx shared create {name}' makes it" in warning
    assert {link, file} <= set(lines_of(r, "ctx: warning: ")), r
    assert shared_rules(storage / "agent" / "g.d") == [
        "allow g_t shared:lnk read",
        "allow g_t shared:afile read",
    ]
    assert os.listdir(elsewhere) == []
    assert (storage / "shared" / "afile").read_text() == "not a space\n"


@pytest.mark.parametrize("case", ["link-loop", "name-too-long", "file-as-directory"])
def test_a_request_path_the_kernel_will_not_open_is_named_with_its_errno(
    storage: Path, scratch: Path, case: str
) -> None:
    """ctx.agent "ctx agent create": REQUEST is a file read as a regular file; a path the
    kernel refuses (a loop of links, a component over 255 bytes, a file used as a directory)
    is its errno naming the path, exit 1, nothing made."""
    good = scratch / "req.json"
    good.write_text(json.dumps({"name": "r", "label": "r_t"}))
    if case == "link-loop":
        (scratch / "a").symlink_to(scratch / "b")
        (scratch / "b").symlink_to(scratch / "a")
        path, word = scratch / "a", "ELOOP"
    elif case == "name-too-long":
        path, word = scratch / ("n" * 300), "ENAMETOOLONG"
    else:
        path, word = good / "inner.json", "ENOTDIR"
    before = snapshot(storage)
    r = ctx_run("agent", "create", path, "--json", env=on(storage))
    error = refused_json(r, word, 1)
    assert error["message"].startswith(f"{path}: "), error
    assert snapshot(storage) == before


BAD_IDS = {
    "gid-word": (("--gid", "abc"), "--gid takes ids"),
    "gid-negative": (("--gid", "-1"), "--gid takes ids"),
    "gid-no-id": (("--gid", str(MAX_ID + 1)), "--gid takes ids"),
    "gid-fullwidth-digit": (("--gid", "\uff14"), "--gid takes ids"),
    "user-no-id": (("--user", str(MAX_ID + 1)), "--user takes ids"),
    "user-empty": (("--user", ""), "no such user: ''"),
    "groups-word": (("--groups", "1,x"), "--groups takes ids"),
}


@pytest.mark.parametrize("case", sorted(BAD_IDS))
def test_ids_that_are_no_ids_are_usage_errors_that_make_nothing(storage: Path, case: str) -> None:
    """ctx.agent "ctx agent create": exit 2 for a bad option; ids are integers from 0 to
    4294967294 ((uid_t)-1 is none); EINVAL naming the option and the value, nothing made."""
    options, said = BAD_IDS[case]
    before = snapshot(storage)
    r = create(storage, {"name": "i", "label": "i_t"}, *options)
    error = refused_json(r, "EINVAL", 2)
    assert said in error["message"], r
    if "takes ids" in said:
        assert f"integers from 0 to {MAX_ID}" in error["message"], r
    assert snapshot(storage) == before


def test_gid_alone_from_root_keeps_the_default_user_and_says_so(storage: Path) -> None:
    """docs/tools.md "Agents, host side": without --user root's agent runs as nobody, and
    the output says so; --gid alone changes only the primary group."""
    r = ctx_run(
        "agent", "create", "-", "--gid", "4321", input='{"name": "g", "label": "g_t"}',
        env=on(storage),
    )  # fmt: skip
    assert r.rc == 0, r
    assert f"(uid {NOBODY}, gid 4321)" in r.out, r
    assert "it runs as user nobody: an agent never runs as root" in r.out, r
    identity = json.loads((storage / "agent" / "g.d" / "identity").read_text())
    assert identity["uid"] == NOBODY and identity["gid"] == 4321, identity
    shown = ctx_run("agent", "show", "g", "--json", env=on(storage)).json()
    assert shown["identity"] == identity, shown


# ---------------------------------------------------------- the second user: a root's owner


def as_user(user: UnprivilegedUser, storage: Path, *args: str, stdin: str = "") -> Run:
    done = run_as(user, [*CTX_ARGV, *args], env=on(storage), cwd=Path("/"), stdin=stdin)
    return Run(list(args), done.returncode, done.stdout, done.stderr)


@pytest.mark.parametrize(
    "options",
    [("--gid", "0"), ("--groups", "0"), ("--user", "SELF", "--groups", "0,5")],
    ids=["gid", "groups", "user-and-groups"],
)
def test_an_owner_who_is_not_root_may_not_give_a_group_it_lacks(
    searchable_storage: Path, unprivileged_user: UnprivilegedUser, options: tuple[str, ...]
) -> None:
    """ctx.agent "ctx agent create": anyone but root can give an agent only their own uid
    and groups (EPERM, exit 1), naming each group it lacks and what to do; nothing made; the
    same request without the options is the owner's agent."""
    storage, user = searchable_storage, unprivileged_user
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(storage)], check=True)
    options = tuple(user.name if o == "SELF" else o for o in options)
    request = json.dumps({"name": "own", "label": "own_t"})
    before = snapshot(storage)
    r = as_user(user, storage, "agent", "create", "-", "--json", *options, stdin=request)
    error = refused_json(r, "EPERM", 1)
    groups = "group 0, group 5" if "0,5" in options else "group 0"
    assert f"only root can create an agent that runs as {groups}: " in error["message"], r
    assert f"you (uid {user.uid}, groups {user.gid})" in error["message"], r
    assert "leave out --user, --gid and --groups, or have root create" in error["message"], r
    assert snapshot(storage) == before
    made = as_user(user, storage, "agent", "create", "-", "--json", stdin=request)
    assert made.rc == 0 and made.json()["identity"]["uid"] == user.uid, made


def test_an_owner_who_may_not_read_the_request_file_is_eacces_naming_it(
    searchable_storage: Path, scratch: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """ctx.agent "ctx agent create": a request file the creator may not read is its errno
    naming the file, exit 1, and nothing is made."""
    storage, user = searchable_storage, unprivileged_user
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(storage)], check=True)
    path = scratch / "root-only.json"
    path.write_text(json.dumps({"name": "own", "label": "own_t"}))
    path.chmod(0o600)
    before = snapshot(storage)
    r = as_user(user, storage, "agent", "create", str(path), "--json")
    error = refused_json(r, "EACCES", 1)
    assert error["message"].startswith(f"{path}: "), r
    assert snapshot(storage) == before


# ------------------------------------------------------------------- the agent/ directory


def test_a_root_without_agent_is_enoent_for_create_and_list_until_bootstrap(
    storage: Path,
) -> None:
    """R-2, R-5, ``ctx agent list --help``: a root without its agent/ directory is ENOENT,
    exit 1, naming 'ctx bootstrap', for create and list alike; bootstrap makes it, and the
    same create then works."""
    (storage / "agent").rmdir()
    request = {"name": "a", "label": "a_t"}
    for r in (create(storage, request), ctx_run("agent", "list", "--json", env=on(storage))):
        error = refused_json(r, "ENOENT", 1)
        assert "has no directory agent/" in error["message"], r
        assert "run 'ctx bootstrap'" in error["message"], r
    assert not (storage / "agent").exists()
    boot = ctx_run("bootstrap", "--storage", storage, "--json")
    assert boot.rc == 0 and "agent" in boot.json()["created"], boot
    assert create(storage, request).rc == 0


def test_an_agent_directory_that_is_a_link_is_never_written_through(
    storage: Path, scratch: Path
) -> None:
    """R-2, A-3: agent/ reached through a symbolic link is refused by create (ELOOP, exit 1,
    naming it), and nothing is made where the link points; an agent there is no agent for
    show (ENOENT, exit 1)."""
    other = scratch / "other"
    copied = shutil.copytree(storage, other, symlinks=True)
    assert create(copied, {"name": "there", "label": "there_t"}).rc == 0
    shutil.rmtree(storage / "agent")
    (storage / "agent").symlink_to(other / "agent")
    before = snapshot(other)
    r = create(storage, {"name": "new", "label": "new_t"})
    error = refused_json(r, "ELOOP", 1)
    assert f"{storage}/agent" in error["message"], r
    shown = ctx_run("agent", "show", "there", "--json", env=on(storage))
    refused_json(shown, "ENOENT", 1)
    assert snapshot(other) == before


def test_agent_list_on_an_agent_directory_that_is_a_link_is_an_error_not_an_empty_list(
    storage: Path, scratch: Path
) -> None:
    other = shutil.copytree(storage, scratch / "other", symlinks=True)
    assert create(other, {"name": "there", "label": "there_t"}).rc == 0
    shutil.rmtree(storage / "agent")
    (storage / "agent").symlink_to(other / "agent")
    listed = ctx_run("agent", "list", "--json", env=on(storage))
    assert listed.rc == 1, listed
    assert listed.json()["error"] in ("ENOENT", "ELOOP", "ENOTDIR"), listed
    assert "agent" in listed.json()["message"], listed


def test_a_file_in_place_of_agent_is_named_by_create_and_by_bootstrap(storage: Path) -> None:
    """R-2, R-5: a file where agent/ belongs is no agents' directory (create: ENOENT, exit 1);
    bootstrap never destroys it and names it as a problem (ENOTDIR, exit 1) with what to do."""
    shutil.rmtree(storage / "agent")
    (storage / "agent").write_text("an administrator's note\n")
    r = create(storage, {"name": "a", "label": "a_t"})
    error = refused_json(r, "ENOENT", 1)
    assert "has no directory agent/" in error["message"], r
    boot = ctx_run("bootstrap", "--storage", storage, "--json")
    assert boot.rc == 1, boot
    assert "agent: exists but is not a directory; left untouched" in boot.json()["problems"]
    assert boot.json()["error"] == "ENOTDIR" and "move aside what is in the way" in boot.err
    assert (storage / "agent").read_text() == "an administrator's note\n"


def test_a_directory_at_agents_install_lock_refuses_both_creates_naming_it(host: Host) -> None:
    """A-3, A-4: the agents' install lock is a file; a directory in its place refuses
    ``ctx agent create`` and a parent's ``agent.create`` alike (EISDIR, exit 1), naming the
    lock and to move it away; nothing is made or staged, and the parent's log is unchanged."""
    lock = host.storage / "agent" / ".install-lock"
    if lock.exists():
        lock.unlink()
    lock.mkdir()
    parent_log = (host.storage / "agent" / "parent.d" / "log").read_bytes()
    before = host.agents()
    r = create(host.storage, {"name": "kid", "label": "kid_t"})
    error = refused_json(r, "EISDIR", 1)
    assert f"{lock} is a directory" in error["message"] and "move it away" in error["message"]
    run, frame = host.native("agent.create", {"name": "kid", "label": "kid_t"})
    assert run.rc == 1 and frame["status"] == "error", run
    assert frame["exit_status"] == 1 and frame["error"]["error"] == "EISDIR", frame
    assert f"{lock} is a directory" in frame["error"]["message"], frame
    assert host.agents() == before
    assert (host.storage / "agent" / "parent.d" / "log").read_bytes() == parent_log


def test_an_entry_that_is_a_link_is_no_agent_for_show_list_and_create(host: Host) -> None:
    """A-3: agent/<name> must be an entry of its own: a symbolic link there (to another
    agent's entry) is not followed — show says so (ENOENT, exit 1), list leaves it out, and a
    create of that name is EEXIST with nothing changed."""
    (host.storage / "agent" / "alias").symlink_to("parent")
    shown = host.ctx("agent", "show", "alias", "--json")
    error = refused_json(shown, "ENOENT", 1)
    assert "is a symbolic link, never followed" in error["message"], shown
    listed = host.ctx("agent", "list", "--json")
    assert listed.rc == 0 and [a["name"] for a in listed.json()] == ["parent"], listed
    before = snapshot(host.storage / "agent")
    r = create(host.storage, {"name": "alias", "label": "alias_t"})
    refused_json(r, "EEXIST", 1)
    assert "remove agent/alias" in r.err and "nothing was created" in r.err, r
    assert snapshot(host.storage / "agent") == before


# --------------------------------------------------- agent.create: what the host refuses


def test_sessions_an_earlier_agent_left_in_a_granted_space_refuse_the_child(host: Host) -> None:
    """A-4, docs/tools.md "agent.create": where an earlier agent of the child's name left its
    sessions in a space the child is granted, the create is EEXIST (exit 1) naming that place
    and what to do; nothing is made and the sessions are left as they were; once they are
    moved aside the same request makes the child."""
    made = host.ctx("shared", "create", "proj", "--group", str(GROUP))
    assert made.rc == 0, made
    host.grant("parent", "shared:proj read")
    old = host.storage / "shared" / "proj" / "agent" / "kid" / "session" / "old"
    old.mkdir(parents=True)
    (old / "events.jsonl").write_text('{"type": "note"}\n')
    request = {"name": "kid", "label": "kid_t", "shared": {"proj": ["read"]}}
    before = host.agents()
    r = host.call("agent.create", request)
    refused(r, "EEXIST", 1, prog="agent.create")
    assert "shared/proj/agent/kid holds the sessions of an earlier agent named kid" in r.err
    assert "have the host administrator move them aside" in r.err, r
    assert host.agents() == before
    assert (old / "events.jsonl").read_text() == '{"type": "note"}\n'
    (result,) = host.results("agent.create")
    assert result["status"] == "error" and result["exit_status"] == 1, result
    shutil.move(host.storage / "shared" / "proj" / "agent" / "kid", host.scratch / "kid-old")
    again = host.call("agent.create", request)
    assert again.rc == 0 and again.out == "created agent kid\n", again
    assert shared_rules(host.storage / "agent" / "kid.d") == ["allow kid_t shared:proj read"]


def test_a_space_the_parent_may_not_read_is_eacces_whatever_that_space_holds(
    host: Host,
) -> None:
    assert host.ctx("shared", "create", "proj").rc == 0  # root's group: closed to nobody
    explained = host.ctx("policy", "explain", "parent", "shared:proj", "read", "--json")
    assert explained.rc == 1 and explained.json()["step"] == 2, explained
    request = {"name": "kid", "label": "kid_t", "shared": {"proj": "read"}}
    first = host.call("agent.create", request)
    refused(first, "EACCES", 1, prog="agent.create")
    assert "does not hold shared:proj read" in first.err, first
    (host.storage / "shared" / "proj" / "agent" / "kid").mkdir(parents=True)
    again = host.call("agent.create", request)
    assert again.err == first.err, again
    assert again.rc == 1 and "shared/proj/agent/kid" not in again.err, again


def test_another_agents_label_is_eacces_naming_it_and_the_parents_own_comes_with_a_warning(
    host: Host,
) -> None:
    """A-4: a child takes a label of its own or its parent's, never another existing agent's
    (EACCES, exit 1, naming that agent, nothing made); the parent's own label is taken, with
    the warning ``ctx agent create`` would give, on stderr in terminal mode."""
    host.create_agent({"name": "sib", "label": "sib_t"})
    before = host.agents()
    r = host.call("agent.create", {"name": "kid", "label": "sib_t"})
    refused(r, "EACCES", 1, prog="agent.create")
    assert "label sib_t is agent sib's: a child takes a label of its own or its parent's" in r.err
    assert host.agents() == before
    made = host.call("agent.create", {"name": "kid", "label": "parent_t"})
    assert made.rc == 0 and made.out == "created agent kid\n", made
    assert made.err == (
        "agent.create: warning: label parent_t is also agent parent's: tool and model "
        "policies grant by label, so the two agents share every grant made to it\n"
    ), made
    assert (host.storage / "agent" / "kid.d" / "label").read_text() == "parent_t\n"


def test_a_mount_target_naming_no_policy_object_is_bad_input_from_a_parent_too(
    host: Host,
) -> None:
    """docs/tools.md "agent.create": the host validates a child's request as ``ctx agent
    create`` does, and EINVAL is bad input: exit 2 (the native frame's exit status 2), the
    target named, nothing made."""
    request = {"name": "kid", "label": "kid_t", "mount": [["/ctx/tool", "/x/-bad", "ro"]]}
    before = host.agents()
    r = host.call("agent.create", request)
    refused(r, "EINVAL", 2, prog="agent.create")
    assert "agent.create by parent: mount target /x/-bad: its last part names it in policy" in r.err
    run, frame = host.native("agent.create", {**request, "mount": [["/ctx/tool", "/w/ctx", "ro"]]})
    assert run.rc == 1 and frame["exit_status"] == 2, frame
    assert frame["error"]["error"] == "EINVAL", frame
    assert "the name 'ctx' belongs to the storage view at /ctx" in frame["error"]["message"]
    assert host.agents() == before


TOOL_REFUSALS = {
    "shorthand-name-only": ("kid", "'label' is required"),
    "tools-a-string": ('{"name": "kid", "label": "kid_t", "tools": "fs.read"}', "'tools' must"),
    "shared-a-list": ('{"name": "kid", "label": "kid_t", "shared": ["p"]}', "'shared' must"),
    "two-arguments": ('{"name": "kid", "label": "kid_t"}', "expected one JSON object"),
    "label-twice": (
        '{"name": "kid", "label": "kid_t", "label": "parent_t"}',
        "gives the name 'label' twice",
    ),
    "lone-surrogate": (
        '{"name": "kid", "label": "kid_t", "tools": ["\\ud800"]}',
        "a lone surrogate, which is no character",
    ),
    "permission-word": (
        '{"name": "kid", "label": "kid_t", "shared": {"p": "read exec"}}',
        "'exec' is not one of ['read', 'write']",
    ),
}


@pytest.mark.parametrize("case", sorted(TOOL_REFUSALS))
def test_a_childs_request_of_the_wrong_shape_is_einval_exit_2_and_makes_nothing(
    host: Host, case: str
) -> None:
    """docs/tools.md "agent.create": bad input exits 2 wherever it is found — the tool's
    schema, its strict JSON, or the host's validation — with one ``agent.create: EINVAL:``
    line saying what is wrong; the call is recorded as a failed tool_result."""
    text, said = TOOL_REFUSALS[case]
    extra = ("extra",) if case == "two-arguments" else ()
    before = host.agents()
    r = host.ctx("run", "--agent", "parent", "--session", "s1", "agent.create", text, *extra)
    refused(r, "EINVAL", 2, prog="agent.create")
    assert said in r.err, r
    assert host.agents() == before
    (result,) = host.results("agent.create")
    assert result["status"] == "error" and result["exit_status"] == 2, result


# ------------------------------------------------- agent.update: when the log cannot be kept


def update_outcome_is_whole(host: Host, run: Run, before: str, content: str) -> None:
    """An update that succeeded changed system.md and said so; one that failed left it as it
    was, with exit 1 (the input was good) and an errno that is not the lost answer."""
    now = (host.storage / "agent" / "upd.d" / "system.md").read_text()
    if run.rc == 0:
        assert now == content, run
        return
    assert now == before, (run, now)
    assert run.rc == 1, run
    assert "the host gave no answer" not in run.err, run


@pytest.fixture
def updater(host: Host) -> Host:
    """Agent ``upd`` (uid nobody) that may run ``agent.update`` in both layers of P-6."""
    host.create_agent({"name": "upd", "label": "upd_t", "tools": ["agent.update"]})
    host.allow_tool("upd_t", "agent.update")
    first = host.call("agent.update", {"control": "system.md", "content": "first\n"}, "upd")
    assert first.rc == 0, first
    return host


def test_an_update_while_the_agents_log_is_a_directory_is_done_whole_or_not_at_all(
    updater: Host,
) -> None:
    log = updater.storage / "agent" / "upd.d" / "log"
    log.unlink()
    log.mkdir()
    r = updater.call("agent.update", {"control": "system.md", "content": "second\n"}, "upd")
    assert "Traceback" not in r.err, r
    update_outcome_is_whole(updater, r, "first\n", "second\n")


def test_an_update_while_the_agents_log_cannot_be_appended_is_done_whole_or_not_at_all(
    updater: Host,
) -> None:
    log = updater.storage / "agent" / "upd.d" / "log"
    with attribute(log, "i"):
        r = updater.call("agent.update", {"control": "system.md", "content": "second\n"}, "upd")
    assert "Traceback" not in r.err, r
    update_outcome_is_whole(updater, r, "first\n", "second\n")


# ------------------------------------------------------ ctx bootstrap and agents' entries


def test_bootstrap_rewrites_only_entries_of_the_shape_ctx_agent_create_writes(
    storage: Path,
) -> None:
    """R-5, docs/tools.md "ctx bootstrap": an entry ``ctx agent create`` wrote for another
    root (or whose root is no string at all) is rewritten as this install writes it and
    reported repaired; any other program in an entry's place — another agent's entry copied,
    a large script, bytes that are not UTF-8 — is the administrator's and left byte for
    byte."""
    for name in ("a", "b", "c", "d", "e"):
        assert create(storage, {"name": name, "label": f"{name}_t"}).rc == 0
    agent = storage / "agent"
    fresh = {name: (agent / name).read_bytes() for name in ("a", "b")}
    root_literal = repr(str(storage)).encode()
    (agent / "a").write_bytes(fresh["a"].replace(root_literal, b"'/old/root'"))
    (agent / "b").write_bytes(fresh["b"].replace(root_literal, b"__import__('os').getcwd()"))
    own = {
        "c": fresh["a"],
        "d": b"#!/bin/sh\n" + b"# padding\n" * 7000 + b"exit 0\n",
        "e": b"#!/bin/sh\n# caf\xe9\nexit 0\n",
    }
    for name, program in own.items():
        (agent / name).write_bytes(program)
    assert fresh["a"] != (agent / "a").read_bytes()
    boot = ctx_run("bootstrap", "--storage", storage, "--json")
    assert boot.rc == 0, boot
    repaired = [entry for entry in boot.json()["repaired"] if entry.startswith("agent/")]
    assert repaired == ["agent/a", "agent/b"], boot
    assert {name: (agent / name).read_bytes() for name in fresh} == fresh
    assert {name: (agent / name).read_bytes() for name in own} == own
    assert all(os.access(agent / name, os.X_OK) for name in "abcde")
