"""``ctx agent create REQUEST`` given unusual but plausible requests (SPEC §8 A-3, A-4; §1 R-3;
§5 P-1..P-7; docs/spec/ctx.agent.md "The request", "ctx agent create", "The controls"): lists
at their limits (a request of exactly 256 KiB, tens of thousands of tools, thousands of
mounts), odd types, duplicates, names differing only in case, labels that are policy words or
another agent's label, mounts with trailing or doubled slashes, ``.``/``..``, symbolic links,
nested targets, system targets, the storage root as a source, modes other than ``ro``/``rw``,
identities with ids at the limits or naming no user, and requests read from standard input,
a FIFO, ``/dev/stdin`` and a file rewritten while it is read.

What is checked: a bad request is refused (exit 1) with every reason on its own
``ctx: EINVAL: REQUEST: <reason>`` line and nothing is created (no ``agent/<name>`` without
its complete ``.d/``, no stray file); a good request makes exactly the controls the manual
lists (policy rules generated one per grant, modes, owners, the mount table with ``/ctx``);
``ctx agent show``/``list`` and ``ctx policy explain`` agree with what was created; and the
created agent's first ``ctx run`` behaves as documented.  Black-box: the installed ``ctx``,
real files, FIFOs, symbolic links and uids."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    snapshot,
)
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
MAX_REQUEST = 256 * 1024
CONTROLS = {
    "label",
    "policy",
    "identity",
    "mount",
    "model",
    "system.md",
    "prompt.template.md",
    "log",
}
LOCK = ".install-lock"  # the agent directory's install lock, made by the first create

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents with other uids, and the test user, need root"
)


# ---------------------------------------------------------------------------------- helpers


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory every uid may search, for mount sources, links and request files."""
    made = new_scratch_dir(SCRATCH)
    yield made
    shutil.rmtree(made, ignore_errors=True)


def create(storage: Path, request: dict | str | bytes, *options: str) -> Run:
    """``ctx agent create - --json OPTIONS`` with ``request`` on standard input."""
    data = json.dumps(request) if isinstance(request, dict) else request
    return ctx_run("agent", "create", "-", "--json", *options, input=data, env=on(storage))


def on(storage: Path) -> dict[str, str]:
    return clean_env(CTX_STORAGE=str(storage))


def ctx(storage: Path, *args: str | os.PathLike, **kw) -> Run:
    kw.setdefault("env", on(storage))
    return ctx_run(*args, **kw)


def rules(policy: Path) -> list[str]:
    """The rule lines of a policy file (comments and blank lines left out)."""
    lines = [line.strip() for line in policy.read_text().splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def agents_dir(storage: Path) -> set[str]:
    """What ``agent/`` holds, its install lock left out."""
    return set(os.listdir(storage / "agent")) - {LOCK}


def assert_complete_or_absent(storage: Path) -> None:
    """Every ``agent/<name>`` has its complete ``agent/<name>.d``, and the reverse: nothing
    half-made, no temp file."""
    names = agents_dir(storage)
    for entry in names:
        if entry.endswith(".d"):
            assert entry[:-2] in names, f"controls {entry} without their entry"
            assert set(os.listdir(storage / "agent" / entry)) == CONTROLS, entry
        else:
            assert f"{entry}.d" in names, f"entry {entry} without its controls"


def refusal_lines(run: Run, source: str = "<stdin>") -> list[str]:
    """The reasons of a refused request: each stderr line ``ctx: EINVAL: SOURCE: reason``."""
    lines = run.err.splitlines()
    prefix = f"ctx: EINVAL: {source}: "
    assert lines and all(line.startswith(prefix) for line in lines), run
    return [line[len(prefix) :] for line in lines]


def allow_tool(storage: Path, label: str, *tools: str) -> None:
    """The tool layer of P-6, the host's to give."""
    for tool in tools:
        with (storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
            policy.write(f"allow {label} tool:{tool} execute\n")


def explain(storage: Path, agent: str, obj: str, perm: str) -> dict:
    r = ctx(storage, "policy", "explain", agent, obj, perm, "--json")
    assert r.rc in (0, 1), r
    facts = r.json()
    assert facts["allowed"] is (r.rc == 0), r
    return facts


def nobody() -> pwd.struct_passwd:
    return pwd.getpwnam("nobody")


# ------------------------------------------------------- a good request, its controls


def test_a_full_request_makes_exactly_the_documented_controls_and_its_first_run_works(
    searchable_storage: Path, scratch: Path
) -> None:
    """A-3, P-6, P-7: every field used at once, in its odd but legal forms (a permission
    string, a source through a link with a trailing slash, a target with one, a read-write
    target nested in a read-only one) makes exactly the eight controls with the documented
    modes and owners, one policy rule per grant, the mount table with the root at /ctx; show,
    list and explain agree with it, and the first calls behave as the manual says."""
    storage = searchable_storage
    src = scratch / "src"
    (src / "out").mkdir(parents=True)
    (src / "out").chmod(0o777)
    src.chmod(0o755)
    (src / "note.txt").write_text("hello from data\n")
    (src / "note.txt").chmod(0o644)
    (scratch / "via").symlink_to(src)
    request = {
        "name": "reviewer",
        "label": "reviewer_t",
        "model": ["openai/gpt-5.6", "local/llama-3"],
        "tools": ["fs.read", "fs.write", "fs.list"],
        "shared": {"proj": "read write", "docs-a": ["read"]},
        "mount": [[f"{scratch}/via/", "/data/", "ro"], [str(src / "out"), "/data/out", "rw"]],
    }
    made = create(storage, request)
    assert made.rc == 0, made
    answer = made.json()
    who = nobody()
    assert answer["name"] == "reviewer" and answer["default_user"] == "nobody", answer
    assert answer["identity"]["uid"] == who.pw_uid and answer["identity"]["gid"] == who.pw_gid
    # proj exists; docs-a is granted before it is made, which is said, and taken.
    assert answer["warnings"] == [
        "shared:docs-a names no shared space yet: the grant takes effect once "
        "'ctx shared create docs-a' makes it"
    ], answer
    assert made.err == f"ctx: warning: {answer['warnings'][0]}\n", made

    agent = storage / "agent"
    assert agents_dir(storage) == {"reviewer", "reviewer.d"}
    controls = agent / "reviewer.d"
    assert set(os.listdir(controls)) == CONTROLS
    for name in CONTROLS:
        st = os.lstat(controls / name)
        assert stat.S_ISREG(st.st_mode) and st.st_uid == 0, name
        assert stat.S_IMODE(st.st_mode) == (0o640 if name == "log" else 0o644), name
    entry = os.lstat(agent / "reviewer")
    assert stat.S_ISREG(entry.st_mode) and entry.st_mode & 0o111 and entry.st_uid == 0

    assert (controls / "label").read_text() == "reviewer_t\n"
    assert Counter(rules(controls / "policy")) == Counter(
        [
            "allow reviewer_t tool:fs.read execute",
            "allow reviewer_t tool:fs.write execute",
            "allow reviewer_t tool:fs.list execute",
            "allow reviewer_t model:openai/gpt-5.6 use",
            "allow reviewer_t model:local/llama-3 use",
            "allow reviewer_t shared:proj read",
            "allow reviewer_t shared:proj write",
            "allow reviewer_t shared:docs-a read",
            "allow reviewer_t mount:data read",
            "allow reviewer_t mount:out read",
            "allow reviewer_t mount:out write",
            "allow reviewer_t mount:ctx read",
        ]
    )
    assert json.loads((controls / "identity").read_text()) == answer["identity"]
    table = json.loads((controls / "mount").read_text())
    normal = [[source, str(PurePosixPath(target)), mode] for source, target, mode in table]
    root = str(storage.resolve())
    expected_mounts = [
        [str(src), "/data", "ro"],
        [str(src / "out"), "/data/out", "rw"],
        [root, "/ctx", "ro"],
    ]
    assert normal == expected_mounts
    assert (controls / "model").read_text() == "openai/gpt-5.6\nlocal/llama-3\n"
    assert (controls / "prompt.template.md").read_text() == "{{input}}\n"
    system = (controls / "system.md").read_text()
    assert all(tool in system for tool in request["tools"]), system
    (created,) = read_jsonl(controls / "log")
    assert created["type"] == "agent.created" and created["agent"] == "reviewer", created
    assert created["status"] == "ok" and created["object"] == "agent/reviewer", created
    assert "allow" not in (controls / "log").read_text()  # facts only, never policy text

    shown = ctx(storage, "agent", "show", "reviewer", "--json")
    assert shown.rc == 0, shown
    facts = shown.json()
    assert facts["label"] == "reviewer_t" and facts["identity"] == answer["identity"]
    assert facts["mounts"] == expected_mounts and facts["cwd"] == "/data", facts
    assert facts["problems"] == [] and facts["withheld_mounts"] == [], facts
    listed = ctx(storage, "agent", "list", "--json")
    assert listed.rc == 0, listed
    assert listed.json() == [
        {"name": "reviewer", "label": "reviewer_t", "identity": answer["identity"], "problems": []}
    ]

    # Chain: the agent layer holds the tool; the tool layer is the host's to add (P-6).
    denied = explain(storage, "reviewer", "tool:fs.read", "execute")
    assert denied["allowed"] is False and denied["step"] == 6, denied
    allow_tool(storage, "reviewer_t", "fs.read", "fs.write", "shell.exec")
    assert explain(storage, "reviewer", "tool:fs.read", "execute")["allowed"] is True
    unlisted = explain(storage, "reviewer", "tool:shell.exec", "execute")
    assert unlisted["allowed"] is False and unlisted["step"] == 5, unlisted
    assert explain(storage, "reviewer", "mount:out", "write")["allowed"] is True
    assert explain(storage, "reviewer", "mount:data", "write")["allowed"] is False
    assert explain(storage, "reviewer", "mount:data", "read")["allowed"] is True

    # The first calls (ctx.agent "Running an agent's tools").
    read = ctx(storage, "run", "--agent", "reviewer", "fs.read", '{"path": "/data/note.txt"}')
    assert read.rc == 0 and read.out == "hello from data\n", read
    wrote = ctx(
        storage, "run", "--agent", "reviewer", "fs.write",
        '{"path": "/data/out/made.txt", "content": "x"}',
    )  # fmt: skip
    assert wrote.rc == 0, wrote
    assert (src / "out" / "made.txt").stat().st_uid == who.pw_uid
    refused = ctx(
        storage, "run", "--agent", "reviewer", "fs.write",
        '{"path": "/data/top.txt", "content": "x"}',
    )  # fmt: skip
    assert refused.rc != 0 and "EROFS" in refused.err, refused
    assert not (src / "top.txt").exists()
    shell = ctx(storage, "run", "--agent", "reviewer", "shell.exec", '{"cmd": "id"}')
    assert shell.rc == 126 and "EACCES" in shell.err, shell
    events = read_jsonl(
        storage / "home" / str(who.pw_uid) / "agent" / "reviewer" / "session" / "default"
        / "events.jsonl"
    )  # fmt: skip
    assert {e["type"] for e in events} >= {"tool_call", "tool_result"}, events
    assert all(e["agent"] == "reviewer" for e in events)


def test_lists_at_their_limits_a_request_of_exactly_256_kib(
    searchable_storage: Path, scratch: Path
) -> None:
    """A-3: a request is at most 256 KiB from a file and from standard input alike; one of
    exactly that size (21 000 tools) is created with one rule per tool and remains usable by
    show and explain; a byte more is EFBIG, exit 1, nothing created."""
    storage = searchable_storage
    tools = [f"t{i:07d}" for i in range(20_999)] + ["fs.read"]

    def padded(name: str, extra: int = 0) -> bytes:
        text = json.dumps({"name": name, "label": f"{name}_t", "tools": tools})
        text = text.replace(", ", ",")
        assert len(text) < MAX_REQUEST
        return (text + " " * (MAX_REQUEST - len(text) + extra)).encode()

    over = scratch / "over.json"
    over.write_bytes(padded("over", 1))
    r = ctx(storage, "agent", "create", over)
    assert r.rc == 1 and r.err.startswith(f"ctx: EFBIG: {over}: "), r
    r = create(storage, padded("over", 1))
    assert r.rc == 1 and r.err.startswith("ctx: EFBIG: <stdin>: "), r
    assert agents_dir(storage) == set()

    exact = scratch / "exact.json"
    exact.write_bytes(padded("big"))
    assert exact.stat().st_size == MAX_REQUEST
    r = ctx(storage, "agent", "create", exact)
    assert r.rc == 0, r
    r = create(storage, padded("big2"))
    assert r.rc == 0, r
    granted = rules(storage / "agent" / "big.d" / "policy")
    assert len(granted) == len(tools) + 1  # and mount:ctx read
    assert len(set(granted)) == len(granted)
    shown = ctx(storage, "agent", "show", "big", "--json")
    assert shown.rc == 0 and shown.json()["problems"] == [], shown
    far = explain(storage, "big", "tool:fs.read", "execute")
    assert far["step"] == 6, far  # found in the agent's policy; the tool layer is missing
    assert_complete_or_absent(storage)


# ---------------------------------------------------- bad requests, every reason listed


BAD_REQUESTS = {
    "every member of the wrong type": (
        {"name": 1, "label": None, "tools": "fs.read", "model": [1], "shared": [], "mount": {}},
        [
            "name: 1 is not of type 'string'",
            "label: None is not of type 'string'",
            "tools: 'fs.read' is not of type 'array'",
            "model/0: 1 is not of type 'string'",
            "shared: [] is not of type 'object'",
            "mount: {} is not of type 'array'",
        ],
    ),
    "duplicates and an unknown field": (
        {
            "name": "dup",
            "label": "dup_t",
            "tools": ["fs.read", "fs.read"],
            "model": ["a/b", "a/b"],
            "system.md": "hi",
        },
        [
            "tools: ['fs.read', 'fs.read'] has non-unique elements",
            "model: ['a/b', 'a/b'] has non-unique elements",
            "request: Additional properties are not allowed ('system.md' was unexpected)",
        ],
    ),
    "names no object may have": (
        {
            "name": "x" * 65,
            "label": "l\u001b[31m",
            "tools": ["fs read", "../x", "*", "", "x.d", "fs.read\u0007"],
            "model": ["openai", "a/b/c", "/x"],
            "shared": {"caf\u00e9": ["read"], "p": ["READ"]},
        },
        [
            "name: 'xxxxxxxxxxxxxxxxxxxx'… is 65 bytes long",
            "label: ",
            "tool:fs read:",
            "tool:../x:",
            "tool:*:",
            "tool:: a name must not be empty",
            "tool:x.d: 'x.d' ends in '.d'",
            "tool:fs.read\\x07:",
            "model:openai:",
            "model:a/b/c:",
            "model:/x:",
            "shared:café:",
            "shared/p: 'READ' is not one of ['read', 'write']",
        ],
    ),
    "mounts no agent may have": (
        {
            "name": "mnt",
            "label": "mnt_t",
            "mount": [
                ["rel/src", "/a1", "ro"],
                ["/tmp/../etc", "/a2", "ro"],
                ["/tmp", "/a3/.", "ro"],
                ["/tmp", "/", "ro"],
                ["/tmp", "/proc", "ro"],
                ["/tmp", "/dev/shm2", "rw"],
                ["/tmp", "/ctx", "ro"],
                ["/tmp", "/ctx/x", "ro"],
                ["/tmp", "/srv/ctx", "ro"],
                ["/tmp", "/b1", "rx"],
                ["/tmp", "/b2"],
                ["/tmp", "/w", "ro"],
                ["/usr", "/x/w/", "ro"],
            ],
        },
        [
            "mount: mount entry 1: the source must be an absolute path",
            "mount: mount entry 2: the source '/tmp/../etc' must not contain '.' or '..'",
            "mount: mount entry 3: the target '/a3/.' must not contain '.' or '..'",
            "mount target /: ",
            "mount target /proc: ",
            "mount target /dev/shm2: ",
            "mount target /ctx: ",
            "mount target /ctx/x: ",
            "mount target /srv/ctx: the name 'ctx' belongs to the storage view at /ctx",
            "mount/9/2: 'rx' is not one of ['ro', 'rw']",
            "mount/10: ['/tmp', '/b2'] is too short",
            "share the name 'w'",
        ],
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_a_bad_request_is_refused_with_every_reason_and_nothing_made(
    storage: Path, case: str
) -> None:
    """A-3, R-3, P-2: each problem of the request on its own ``ctx: EINVAL: <stdin>:`` line
    (control characters shown escaped), exit 1, the storage root unchanged."""
    request, reasons = BAD_REQUESTS[case]
    before = snapshot(storage)
    r = create(storage, request)
    assert r.rc == 1, r
    assert r.json()["error"] == "EINVAL", r
    said = refusal_lines(r)
    assert len(said) == len(reasons), said
    for reason in reasons:
        assert any(reason in line for line in said), (reason, said)
    assert not any(ch in r.err for ch in "\u0007\u001b"), r
    assert snapshot(storage) == before


@pytest.mark.parametrize(
    "text",
    [
        b"",
        b"[]",
        b'{"name": "a", "label": "a_t"} {"name": "b", "label": "b_t"}',
        b'{"name": "a", "name": "b", "label": "a_t"}',
        b'{"name": "a", "label": "a_t", "tools": 1e400}',
        b'{"name": "a", "label": "a_t", "tools": ["\xff"]}',
    ],
    ids=["empty", "array", "two-objects", "duplicate-key", "huge-number", "not-utf8"],
)
def test_a_request_that_is_not_one_json_object_is_einval(storage: Path, text: bytes) -> None:
    """A-3: one JSON object, UTF-8, each member once; anything else is EINVAL, exit 1."""
    before = snapshot(storage)
    r = create(storage, text)
    assert r.rc == 1, r
    assert len(refusal_lines(r)) == 1
    assert "Traceback" not in r.err
    assert snapshot(storage) == before


@pytest.mark.parametrize(
    "request_text",
    [
        '{"name": "s1", "label": "s1_t", "mount": [["/tmp/\\ud800x", "/sur", "ro"]]}',
        '{"name": "s2", "label": "s2_t", "shared": {"\\udc80": ["read"]}}',
    ],
    ids=["mount-source", "shared-space"],
)
def test_a_lone_surrogate_in_a_request_is_einval_not_a_traceback(
    storage: Path, request_text: str
) -> None:
    before = snapshot(storage)
    r = create(storage, request_text)
    assert "Traceback" not in r.err, r
    assert r.rc == 1 and len(refusal_lines(r)) == 1, r
    assert snapshot(storage) == before


# ----------------------------------------------------------------- mounts and their paths


def test_the_storage_root_is_no_mount_source_however_it_is_written(
    storage: Path, scratch: Path
) -> None:
    """A-3, T-5: the raw storage root is refused as a source whether written plainly, with
    a trailing slash or through a link; a directory inside it is allowed."""
    (scratch / "root-link").symlink_to(storage)
    before = snapshot(storage)
    for source in (str(storage), f"{storage}/", str(scratch / "root-link")):
        r = create(
            storage, {"name": "rooted", "label": "rooted_t", "mount": [[source, "/s", "ro"]]}
        )
        assert r.rc == 1, r
        (reason,) = refusal_lines(r)
        assert "it is the storage root" in reason, r
    assert snapshot(storage) == before
    inside = {"name": "tools", "label": "tools_t", "mount": [[f"{storage}/tool", "/t", "ro"]]}
    assert create(storage, inside).rc == 0


def test_mount_sources_are_recorded_as_real_paths_and_foreign_links_are_named(
    searchable_storage: Path, scratch: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """A-3: a source through root's link is recorded as its real path, silently; through a
    link another uid owns it is recorded the same way with a warning naming the path written,
    the path recorded and the link; a missing source (or a link loop) is a warning, not a
    refusal; the agent is created all the same."""
    storage = searchable_storage
    real = scratch / "real"
    real.mkdir()
    (scratch / "mine").symlink_to(real)
    (scratch / "theirs").symlink_to(real)
    os.lchown(scratch / "theirs", unprivileged_user.uid, unprivileged_user.gid)
    (scratch / "loop1").symlink_to(scratch / "loop2")
    (scratch / "loop2").symlink_to(scratch / "loop1")
    request = {
        "name": "linked",
        "label": "linked_t",
        "mount": [
            [str(scratch / "mine"), "/m1", "ro"],
            [str(scratch / "theirs"), "/m2", "ro"],
            [str(scratch / "gone"), "/m3", "ro"],
            [str(scratch / "loop1"), "/m4", "ro"],
        ],
    }
    r = create(storage, request)
    assert r.rc == 0, r
    warnings = r.json()["warnings"]
    assert len(warnings) == 3, warnings
    (foreign,) = [w for w in warnings if "symbolic link" in w]
    assert str(scratch / "theirs") in foreign and str(real) in foreign, foreign
    assert f"uid {unprivileged_user.uid}" in foreign
    assert any(str(scratch / "gone") in w and "does not exist" in w for w in warnings)
    assert any(str(scratch / "loop1") in w for w in warnings)
    assert r.err.count("ctx: warning: ") == 3, r
    table = json.loads((storage / "agent" / "linked.d" / "mount").read_text())
    assert [row[0] for row in table[:2]] == [str(real), str(real)]
    shown = ctx(storage, "agent", "show", "linked", "--json").json()
    assert [m[0] for m in shown["mounts"][:2]] == [str(real), str(real)], shown


def test_same_source_twice_and_nested_targets_keep_each_mounts_own_mode(
    searchable_storage: Path, scratch: Path
) -> None:
    """A-3, P-5 step 3: one source at a read-only and a read-write target, and a read-write
    target nested in a read-only one: writes go through the rw ones only, and explain says
    the same as the runs."""
    storage = searchable_storage
    top = scratch / "top"
    (top / "inner").mkdir(parents=True)
    top.chmod(0o777)
    (top / "inner").chmod(0o777)
    request = {
        "name": "twice",
        "label": "twice_t",
        "tools": ["fs.write"],
        "mount": [
            [str(top), "/w", "ro"],
            [str(top / "inner"), "/w/inner/", "rw"],
            [str(top), "//alias", "rw"],
        ],
    }
    assert create(storage, request).rc == 0
    allow_tool(storage, "twice_t", "fs.write")

    def write(path: str) -> Run:
        body = json.dumps({"path": path, "content": "x"})
        return ctx(storage, "run", "--agent", "twice", "fs.write", body)

    assert write("/w/inner/a.txt").rc == 0
    assert (top / "inner" / "a.txt").exists()
    assert write("/alias/b.txt").rc == 0
    assert (top / "b.txt").exists()
    ro = write("/w/c.txt")
    assert ro.rc == 1 and "EROFS" in ro.err, ro
    assert not (top / "c.txt").exists()
    assert explain(storage, "twice", "mount:inner", "write")["allowed"] is True
    assert explain(storage, "twice", "mount:alias", "write")["allowed"] is True
    assert explain(storage, "twice", "mount:w", "write")["step"] == 3
    shown = ctx(storage, "agent", "show", "twice", "--json").json()
    assert [m[1] for m in shown["mounts"]] == ["/w", "/w/inner", "/alias", "/ctx"], shown


def test_mounts_recorded_longer_than_written_are_refused_at_create_or_usable(
    searchable_storage: Path, scratch: Path
) -> None:
    storage = searchable_storage
    deep = scratch
    while len(str(deep)) < 3800:
        deep = deep / ("d" * 200)
    deep.mkdir(parents=True)
    (deep / "note.txt").write_text("deep\n")
    for part in [deep, *deep.parents]:
        if part == scratch:
            break
        part.chmod(0o755)
    (deep / "note.txt").chmod(0o644)
    (scratch / "L").symlink_to(deep)
    request = {
        "name": "deep",
        "label": "deep_t",
        "tools": ["fs.read"],
        "mount": [[str(scratch / "L"), f"/m{i:03d}", "ro"] for i in range(40)],
    }
    made = create(storage, request)
    if made.rc != 0:  # refused at create: fine, if nothing was made
        assert made.rc == 1 and refusal_lines(made), made
        assert agents_dir(storage) == set()
        return
    allow_tool(storage, "deep_t", "fs.read")
    assert explain(storage, "deep", "tool:fs.read", "execute")["allowed"] is True
    r = ctx(storage, "run", "--agent", "deep", "fs.read", '{"path": "/m000/note.txt"}')
    assert r.rc == 0 and r.out == "deep\n", r


def test_a_read_write_mount_holding_the_agents_own_root_warns_and_step_4_denies(
    searchable_storage: Path, scratch: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """ctx.agent "ctx agent create": a rw mount whose source holds a storage root the agent's
    uid may change is created with a warning, and every decision is denied at step 4; the
    same mount read-only is neither."""
    storage = searchable_storage
    subprocess.run(
        ["chown", "-R", f"{unprivileged_user.uid}:{unprivileged_user.gid}", str(storage)],
        check=True,
    )
    holder = str(storage.parent)
    for mode, name in (("rw", "holdrw"), ("ro", "holdro")):
        request = {
            "name": name,
            "label": f"{name}_t",
            "tools": ["fs.read"],
            "mount": [[holder, "/above", mode]],
        }
        r = create(storage, request, "--user", unprivileged_user.name)
        assert r.rc == 0, r
        warnings = r.json()["warnings"]
        if mode == "rw":
            assert len(warnings) == 1 and "step 4" in warnings[0], warnings
            assert f"agent/{name}.d" in warnings[0], warnings
        else:
            assert warnings == [], warnings
        allow_tool(storage, f"{name}_t", "fs.read")
        verdict = explain(storage, name, "tool:fs.read", "execute")
        if mode == "rw":
            assert verdict["allowed"] is False and verdict["step"] == 4, verdict
        else:
            assert verdict["allowed"] is True, verdict


# -------------------------------------------------- names, labels, and what already exists


def test_names_differing_only_in_case_are_two_agents_and_shared_labels_are_warned_of(
    searchable_storage: Path,
) -> None:
    """R-3, A-3: names are bytes, so ``Rev`` and ``rev`` are two agents with controls of
    their own; a label another agent has is a warning naming it; a label that is a word of
    the policy grammar is an ordinary subject type."""
    storage = searchable_storage
    assert create(storage, {"name": "rev", "label": "rev_t", "tools": ["fs.read"]}).rc == 0
    upper = create(storage, {"name": "Rev", "label": "rev_t", "tools": ["fs.list"]})
    assert upper.rc == 0, upper
    (warning,) = upper.json()["warnings"]
    assert "label rev_t is also agent rev's" in warning, warning
    assert upper.err == f"ctx: warning: {warning}\n", upper
    word = create(storage, {"name": "kw", "label": "allow", "tools": ["fs.read"]})
    assert word.rc == 0 and word.json()["warnings"] == [], word
    assert agents_dir(storage) == {"rev", "rev.d", "Rev", "Rev.d", "kw", "kw.d"}
    assert rules(storage / "agent" / "Rev.d" / "policy")[0] == "allow rev_t tool:fs.list execute"
    assert rules(storage / "agent" / "rev.d" / "policy")[0] == "allow rev_t tool:fs.read execute"
    listed = {a["name"]: a["label"] for a in ctx(storage, "agent", "list", "--json").json()}
    assert listed == {"rev": "rev_t", "Rev": "rev_t", "kw": "allow"}
    allow_tool(storage, "allow", "fs.read")
    assert explain(storage, "kw", "tool:fs.read", "execute")["allowed"] is True
    # The shared label shares grants: Rev's label holds rev's tool grant at the tool layer.
    allow_tool(storage, "rev_t", "fs.read")
    assert explain(storage, "Rev", "tool:fs.read", "execute")["step"] == 5


def test_an_existing_agent_or_anything_in_its_place_is_never_overwritten(
    storage: Path, scratch: Path
) -> None:
    """A-3: EEXIST, exit 1, for an agent that exists (with a changed request too), for
    controls left without their entry (said so), for a directory or a dangling link in the
    entry's place (never followed); nothing is changed or made."""
    assert create(storage, {"name": "keep", "label": "keep_t", "tools": ["fs.read"]}).rc == 0
    agent = storage / "agent"
    (agent / "orphan.d").mkdir()
    (agent / "orphan.d" / "note").write_text("made by hand\n")
    (agent / "dir").mkdir()
    (agent / "dangling").symlink_to(scratch / "elsewhere")
    before = snapshot(storage)
    for name in ("keep", "orphan", "dir", "dangling"):
        r = create(storage, {"name": name, "label": "other_t", "tools": ["shell.exec"]})
        assert r.rc == 1 and r.err.startswith("ctx: EEXIST: "), r
        assert r.json()["error"] == "EEXIST", r
        if name == "orphan":
            assert "agent/orphan.d exists without agent/orphan" in r.err, r
            assert "nothing was created" in r.err, r
    assert snapshot(storage) == before
    assert not (scratch / "elsewhere").exists()


def test_an_entry_left_without_its_controls_is_named_as_such(storage: Path) -> None:
    assert create(storage, {"name": "half", "label": "half_t"}).rc == 0
    shutil.rmtree(storage / "agent" / "half.d")
    listed = ctx(storage, "agent", "list", "--json").json()
    assert listed[0]["name"] == "half" and listed[0]["problems"], listed
    r = create(storage, {"name": "half", "label": "half_t"})
    assert r.rc == 1 and r.err.startswith("ctx: EEXIST: "), r
    said = r.err.replace(str(storage), "ROOT")  # the test's own path may hold any word
    assert "change its controls in agent/half.d" not in said, r
    assert "agent/half.d" in said and "does not exist" in said, r


# ------------------------------------------------------------------------ identity options


def test_identities_at_the_limits_and_naming_no_user(
    searchable_storage: Path, scratch: Path
) -> None:
    """A-3, P-5 step 1: ids the user database does not know are recorded as given (with
    --gid for an unknown uid), shown alike, and the agent's first call runs as them; an
    unknown uid without --gid, an unknown name and a root uid written with a leading zero
    are usage errors (exit 2) that create nothing."""
    storage = searchable_storage
    src = scratch / "data"
    src.mkdir()
    (src / "note.txt").write_text("ids\n")
    (src / "note.txt").chmod(0o644)
    request = {
        "name": "ghost",
        "label": "ghost_t",
        "tools": ["fs.read"],
        "mount": [[str(src), "/data", "ro"]],
    }
    before = snapshot(storage)
    for options, said in (
        (("--user", "4294967294"), "give --gid too"),
        (("--user", "no-such-user-here"), "no such user"),
        (("--user", "00"), "never runs as root"),
        (("--user", "nobody", "--groups", "4294967295"), "--groups takes ids"),
    ):
        r = create(storage, request, *options)
        assert r.rc == 2 and r.err.startswith("ctx: EINVAL: ") and said in r.err, r
    assert snapshot(storage) == before
    options = ("--user", "4294967294", "--gid", "4294967294", "--groups", "4000000000,7")
    made = create(storage, request, *options)
    assert made.rc == 0, made
    ids = {"uid": 4294967294, "gid": 4294967294, "groups": [7, 4000000000]}
    assert made.json()["identity"] == ids and made.json()["default_user"] is None, made
    assert json.loads((storage / "agent" / "ghost.d" / "identity").read_text()) == ids
    assert ctx(storage, "agent", "show", "ghost", "--json").json()["identity"] == ids
    allow_tool(storage, "ghost_t", "fs.read")
    r = ctx(storage, "run", "--agent", "ghost", "fs.read", '{"path": "/data/note.txt"}')
    assert r.rc == 0 and r.out == "ids\n", r
    assert (storage / "home" / "4294967294" / "agent" / "ghost").is_dir()


def test_who_may_create_and_for_whom(
    searchable_storage: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """ctx.agent "ctx agent create": a user who neither is root nor owns the root is refused
    (EACCES, exit 1); the owner may create an agent running as themselves, not as another
    uid (EPERM); nothing is made by a refusal."""
    storage = searchable_storage
    user = unprivileged_user
    request = json.dumps({"name": "mine", "label": "mine_t"})
    env = on(storage)

    def as_user(*options: str) -> subprocess.CompletedProcess[str]:
        argv = [*CTX_ARGV, "agent", "create", "-", *options]
        return run_as(user, argv, env=env, cwd=Path("/"), stdin=request)

    before = snapshot(storage)
    refused = as_user()
    assert refused.returncode == 1 and refused.stderr.startswith("ctx: EACCES: "), refused
    assert snapshot(storage) == before
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(storage)], check=True)
    other = as_user("--user", "nobody")
    assert other.returncode == 1 and other.stderr.startswith("ctx: EPERM: "), other
    assert agents_dir(storage) == set()
    made = as_user("--json")
    assert made.returncode == 0, made
    assert json.loads(made.stdout)["identity"]["uid"] == user.uid
    controls = storage / "agent" / "mine.d"
    assert {p.stat().st_uid for p in controls.iterdir()} == {user.uid}


# ----------------------------------------------------------------- where the request comes from


def test_request_sources_a_fifo_a_device_a_directory_and_closed_stdin(
    storage: Path, scratch: Path
) -> None:
    """ctx.agent: REQUEST is read as a regular file: a FIFO (named, or through a link), a
    device and a directory are EINVAL, never waited on, with the hint to give '-'; a missing
    file is ENOENT; '-' with standard input closed is EBADF; all exit 1, nothing made."""
    fifo = scratch / "req.fifo"
    os.mkfifo(fifo)
    (scratch / "to-fifo").symlink_to(fifo)
    before = snapshot(storage)
    for source in (fifo, scratch / "to-fifo", Path("/dev/null"), scratch):
        r = ctx(storage, "agent", "create", source, timeout=20)
        assert r.rc == 1, r
        assert r.err.startswith(f"ctx: EINVAL: {source} is not a regular file"), r
        assert "'-' to read one from a pipe" in r.err, r
    missing = ctx(storage, "agent", "create", scratch / "missing.json")
    assert missing.rc == 1 and missing.err.startswith("ctx: ENOENT: "), missing
    closed = subprocess.run(
        [*CTX_ARGV, "agent", "create", "-"], stdin=subprocess.DEVNULL, capture_output=True,
        env=on(storage), timeout=60, preexec_fn=lambda: os.close(0),
    )  # fmt: skip
    assert closed.returncode == 1 and closed.stderr.startswith(b"ctx: EBADF: "), closed
    assert snapshot(storage) == before


def test_a_request_piped_slowly_through_a_fifo_or_redirected_to_dev_stdin(
    storage: Path, scratch: Path
) -> None:
    """ctx.agent: '-' reads standard input to its end, whatever pipe it is and however the
    writer splits it; /dev/stdin redirected from a regular file is that file."""
    fifo = scratch / "slow.fifo"
    os.mkfifo(fifo)
    text = json.dumps({"name": "slow", "label": "slow_t", "tools": ["fs.read"]}).encode()
    proc = subprocess.Popen(
        [*CTX_ARGV, "agent", "create", "-", "--json"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=on(storage),
    )  # fmt: skip
    assert proc.stdin is not None
    for start in range(0, len(text), 7):  # many small writes, each its own pipe write
        proc.stdin.write(text[start : start + 7])
        proc.stdin.flush()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out)["name"] == "slow"

    def writer() -> None:
        with open(fifo, "wb", buffering=0) as pipe:
            for start in range(0, len(text), 5):
                pipe.write(text[start : start + 5].replace(b"slow", b"fifo"))

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        with open(fifo, "rb", buffering=0) as pipe:
            via_fifo = subprocess.run(
                [*CTX_ARGV, "agent", "create", "-"], stdin=pipe, capture_output=True,
                env=on(storage), timeout=60,
            )  # fmt: skip
    finally:
        thread.join(timeout=30)
    assert via_fifo.returncode == 0, via_fifo

    request = scratch / "req.json"
    request.write_text(json.dumps({"name": "redirected", "label": "redirected_t"}))
    with open(request, "rb") as stdin:
        redirected = subprocess.run(
            [*CTX_ARGV, "agent", "create", "/dev/stdin"], stdin=stdin, capture_output=True,
            env=on(storage), timeout=60,
        )  # fmt: skip
    assert redirected.returncode == 0, redirected
    assert agents_dir(storage) >= {"slow", "slow.d", "redirected", "redirected.d"}
    assert_complete_or_absent(storage)


def test_a_request_file_rewritten_while_it_is_read_gives_one_whole_request_or_einval(
    storage: Path, scratch: Path
) -> None:
    """A-3: while another process rewrites the request file in place (truncate, then two
    writes, alternating two requests), each create either makes the agent of one whole
    version — its policy exactly that version's tools, never a mix — or refuses: the torn
    text with EINVAL, a name made already with EEXIST; a refusal makes nothing."""
    path = scratch / "changing.json"
    versions = {
        "vshort": ["fs.read"],
        "vlong": [f"tool{i:03d}" for i in range(300)],
    }
    texts = [
        json.dumps({"name": name, "label": f"{name}_t", "tools": tools}).encode()
        for name, tools in versions.items()
    ]
    path.write_bytes(texts[0])
    stop = threading.Event()

    def rewrite() -> None:
        turn = 0
        while not stop.is_set():
            text = texts[turn % 2]
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
            try:
                os.write(fd, text[: len(text) // 2])
                os.write(fd, text[len(text) // 2 :])
            finally:
                os.close(fd)
            turn += 1

    thread = threading.Thread(target=rewrite)
    thread.start()
    outcomes = []
    try:
        for _ in range(8):
            outcomes.append(ctx(storage, "agent", "create", path, "--json"))
    finally:
        stop.set()
        thread.join(timeout=30)
    for r in outcomes:
        assert "Traceback" not in r.err, r
        if r.rc == 0:
            assert r.json()["name"] in versions, r
        elif r.err.startswith("ctx: EEXIST: "):
            assert r.rc == 1, r
        else:
            assert r.rc == 1 and refusal_lines(r, str(path))[0].startswith("not JSON"), r
    made = agents_dir(storage)
    assert made <= {"vshort", "vshort.d", "vlong", "vlong.d"}, made
    assert_complete_or_absent(storage)
    assert len(made) == 2 * sum(r.rc == 0 for r in outcomes)
    for name, tools in versions.items():
        if name in made:
            granted = rules(storage / "agent" / f"{name}.d" / "policy")
            expected = [f"allow {name}_t tool:{tool} execute" for tool in tools]
            assert granted == [*expected, f"allow {name}_t mount:ctx read"], name
