"""End-to-end flows over SPEC §1 (R-*), §5 (policy v0 and the six-step chain), §6 (tools as
files) and §7 (``ctx tool``, ``tool/tsh.d/config``), read literally: the command lines, exit
statuses, file layouts, control names, policy grammar and errno names as SPEC writes them,
checked through ``ctx bootstrap``, ``ctx object``, ``ctx policy``, ``ctx agent create``,
``ctx run`` and ``ctx tool`` on fresh storage roots."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import ROOT_ENTRIES, Run, clean_env, ctx_run, snapshot

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid (root)")

AGENT_UID = 65534  # root's agents run as nobody unless told otherwise (ctx agent create --help)
CORE_TOOLS = ("fs.read", "fs.list", "fs.stat", "fs.write", "shell.exec", "tsh.config")
CONTROL_FILES = ("name", "description", "schema", "cap", "policy", "status", "log")
TSH_DEFAULTS = {"max_loaded_tools": "64", "cache_capacity": "32", "window_percent": "1"}


# ----------------------------------------------------------------------------- helpers


def on(storage: Path, *args, **kw) -> Run:
    """``ctx ARGS`` with ``CTX_STORAGE`` naming ``storage``."""
    extra = kw.pop("extra_env", {})
    return ctx_run(*args, env=clean_env(CTX_STORAGE=str(storage), **extra), **kw)


def settings(text: str) -> dict[str, str]:
    """The ``key=value`` lines of a data file; blank lines and ``#`` lines left out (H-4)."""
    found = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            found[key.strip()] = value.strip()
    return found


def manifest(directory: Path, name: str, program: str) -> Path:
    """A v2 manifest (T-8) of tool ``name`` running the shell text ``program``."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = name if len(name) < 60 and "/" not in name else "odd"
    (directory / f"{stem}.sh").write_text(program)
    path = directory / f"{stem}.json"
    path.write_text(
        json.dumps(
            {
                "manifest": 2,
                "kind": "tool",
                "name": name,
                "description": f"The {name} test tool.",
                "schema": {"type": "object"},
                "cap": {"side_effects": True, "network": False},
                "exec": f"{stem}.sh",
            }
        )
    )
    return path


def install(storage: Path, directory: Path, name: str, program: str, tier="system") -> Path:
    r = on(
        storage,
        "object",
        "install",
        "--source",
        storage,
        manifest(directory, name, program),
        "--tier",
        tier,
    )
    assert r.rc == 0, r
    return storage / "tool" / name


def create_agent(storage: Path, request: dict) -> None:
    r = on(storage, "agent", "create", "-", input=json.dumps(request))
    assert r.rc == 0, r


def allow_in_tool(storage: Path, tool: str, label: str) -> None:
    """The tool's own half of P-6."""
    with (storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
        policy.write(f"allow {label} tool:{tool} execute\n")


def native(storage: Path, agent: str, tool: str, value: dict) -> tuple[Run, dict]:
    """``ctx run --native``: the run and its last frame, the ``result`` (T-3)."""
    r = on(storage, "run", "--native", "--agent", agent, tool, input=json.dumps(value))
    frames = [json.loads(line) for line in r.lines()]
    assert frames and frames[-1]["type"] == "result", r
    return r, frames[-1]


def events(storage: Path, agent: str) -> list[dict]:
    path = storage / "home" / str(AGENT_UID) / "agent" / agent / "session" / "default"
    return [json.loads(line) for line in (path / "events.jsonl").read_text().splitlines()]


def rules(policy: Path) -> list[str]:
    return [line.strip() for line in policy.read_text().splitlines() if line.startswith("allow")]


def drop_rule(policy: Path, rule: str) -> None:
    text = policy.read_text()
    assert rule + "\n" in text, text
    policy.write_text(text.replace(rule + "\n", ""))


def workdir(parent: Path, name: str, mode: int) -> Path:
    path = parent / name
    path.mkdir()
    path.chmod(mode)
    return path


def without_logs(tree: dict) -> dict:
    return {k: v for k, v in tree.items() if not k.endswith("/log")}


# ----------------------------------------------------------------------------- §1 with §6, §7


def test_bootstrap_lays_out_the_abi_and_a_rerun_repairs_the_core_but_keeps_admin_choices(
    tmp_path: Path,
) -> None:
    """R-2, R-5, T-1, H-4, P-2, P-8: a fresh ``ctx bootstrap`` makes exactly the six root
    entries, each core tool as an executable plus every control, policies that are valid and
    grant nobody, and the H-4 defaults; after an admin's grants, hook, tsh setting, disabled
    status and user-tier tool and some damage, a rerun restores the core and keeps every choice."""
    root = tmp_path / "storage"
    made = ctx_run("bootstrap", "--storage", root)
    assert made.rc == 0, made
    assert set(os.listdir(root)) == ROOT_ENTRIES
    for forbidden in ("mcp", "audit", "queue", "registry"):
        assert not (root / forbidden).exists()

    policies = []
    for name in CORE_TOOLS:
        exe = root / "tool" / name
        assert exe.is_file() and not exe.is_symlink(), name
        assert exe.stat().st_mode & 0o111, name
        control = root / "tool" / f"{name}.d"
        for entry in CONTROL_FILES:
            assert (control / entry).is_file(), f"{name}.d/{entry}"
        for hooks in ("pre.d", "post.d"):
            assert (control / "hooks" / hooks).is_dir(), f"{name}.d/hooks/{hooks}"
        assert (control / "name").read_text().strip() == name
        assert (control / "description").read_text().strip()
        assert isinstance(json.loads((control / "schema").read_text()), dict)
        assert isinstance(json.loads((control / "cap").read_text()), dict)
        policies.append(control / "policy")
        denied = ctx_run(
            "policy", "query", "--policy", control / "policy", "coder_t", f"tool:{name}", "execute"
        )
        assert (denied.rc, denied.out.strip()) == (1, "deny"), denied
    checked = ctx_run("policy", "check", *policies)
    assert checked.rc == 0 and "EINVAL" not in checked.err, checked
    for entry in ("bin/ctxterm", "bin/tsh", "tool/tsh"):
        assert os.access(root / entry, os.X_OK), entry
    assert settings((root / "tool" / "tsh.d" / "config").read_text()) == TSH_DEFAULTS
    for page in ("README.md", "man/ctx.tool.md", "man/ctx.agent.md"):
        assert (root / "shared" / "cortexfs-docs" / page).is_file(), page

    # The administrator's choices, then damage.
    grant = "allow coder_t tool:fs.read execute"
    with (root / "tool" / "fs.read.d" / "policy").open("a") as policy:
        policy.write(grant + "\n")
    guard = root / "tool" / "shell.exec.d" / "hooks" / "pre.d" / "10-guard"
    guard.write_text("#!/bin/sh\nexit 0\n")
    guard.chmod(0o755)
    tuned = on(
        root,
        "tool",
        "tsh.config",
        "cache_capacity=48",
        extra_env={"CTX_HOME": str(tmp_path / "home"), "CTX_PATH": str(root / "tool")},
    )
    assert tuned.rc == 0, tuned
    (root / "tool" / "fs.write.d" / "status").write_text("disabled\n")
    install(root, tmp_path / "m", "mine.echo", "#!/bin/sh\ncat\n", tier="user")
    schema = (root / "tool" / "fs.list.d" / "schema").read_bytes()
    (root / "tool" / "fs.stat").unlink()
    (root / "tool" / "fs.list.d" / "schema").unlink()
    (root / "bin" / "tsh").unlink()

    repaired = ctx_run("bootstrap", "--storage", root)
    assert repaired.rc == 0, repaired
    assert os.access(root / "tool" / "fs.stat", os.X_OK)
    assert (root / "tool" / "fs.list.d" / "schema").read_bytes() == schema
    assert os.access(root / "bin" / "tsh", os.X_OK)
    assert grant in rules(root / "tool" / "fs.read.d" / "policy")
    assert guard.read_text() == "#!/bin/sh\nexit 0\n" and os.access(guard, os.X_OK)
    config = settings((root / "tool" / "tsh.d" / "config").read_text())
    assert config == {**TSH_DEFAULTS, "cache_capacity": "48"}
    assert (root / "tool" / "fs.write.d" / "status").read_text().strip() == "disabled"
    assert os.access(root / "home" / str(os.getuid()) / "tool" / "mine.echo", os.X_OK)
    assert set(os.listdir(root)) == ROOT_ENTRIES

    before = without_logs(snapshot(root))
    again = ctx_run("bootstrap", "--storage", root)
    assert again.rc == 0, again
    assert without_logs(snapshot(root)) == before


# ----------------------------------------------------------------------------- R-3 everywhere


@pytest.mark.parametrize("bad", ["notes.d", "a/b"], ids=["dot-d-suffix", "slash"])
def test_one_illegal_name_is_einval_at_every_command_and_changes_nothing(
    searchable_storage: Path, tmp_path: Path, bad: str
) -> None:
    """R-3 with T-8, T-8a, A-3, X-1, H-3, P-5, P-7, P-8: a name that is no object name is
    rejected with EINVAL by every command that takes one — manifest check and install, agent
    and space creation, ``which``, ``run``, ``ctx tool``, ``policy explain`` (as agent and as
    object), ``policy check`` and ``query`` — and the storage root is left exactly as it was;
    a 64-byte name is still a name."""
    storage = searchable_storage
    create_agent(storage, {"name": "coder", "label": "coder_t", "tools": ["fs.read"]})
    good = tmp_path / "good.policy"
    good.write_text("allow coder_t tool:fs.read execute\n")
    bad_rule = tmp_path / "bad.policy"
    bad_rule.write_text(f"# one rule\nallow coder_t tool:{bad} execute\n")
    bad_manifest = manifest(tmp_path / "m", bad, "#!/bin/sh\ncat\n")
    before = snapshot(storage)

    refusals = {
        "object check": on(storage, "object", "check", bad_manifest),
        "object install": on(
            storage, "object", "install", "--source", storage, bad_manifest, "--tier", "system"
        ),
        "agent create": on(
            storage,
            "agent",
            "create",
            "-",
            input=json.dumps({"name": bad, "label": "x_t", "tools": []}),
        ),
        "shared create": on(storage, "shared", "create", bad),
        "object which": on(storage, "object", "which", bad),
        "run": on(storage, "run", "--agent", "coder", bad),
        "run --native": on(storage, "run", "--native", "--agent", "coder", bad, input="{}"),
        "tool": on(storage, "tool", bad),
        "explain object": on(storage, "policy", "explain", "coder", f"tool:{bad}", "execute"),
        "explain agent": on(storage, "policy", "explain", bad, "tool:fs.read", "execute"),
        "query": ctx_run("policy", "query", "--policy", good, "coder_t", f"tool:{bad}", "execute"),
    }
    for what, r in refusals.items():
        assert r.rc != 0, (what, r)
        assert "EINVAL" in r.err, (what, r)
        assert "allow" not in r.out.split(), (what, r)
    for what in ("shared create", "object which", "run", "tool", "explain agent", "query"):
        assert refusals[what].rc == 2, (what, refusals[what])
    checked = ctx_run("policy", "check", bad_rule)
    assert checked.rc == 1, checked
    assert checked.err.startswith(f"{bad_rule}:2: EINVAL: "), checked
    assert snapshot(storage) == before

    longest = "b" * 64
    ok = on(
        storage,
        "object",
        "install",
        "--source",
        storage,
        manifest(tmp_path / "m64", longest, "#!/bin/sh\ncat\n"),
        "--tier",
        "system",
    )
    assert ok.rc == 0, ok
    found = on(storage, "object", "which", longest, extra_env={"CTX_PATH": str(storage / "tool")})
    assert (found.rc, found.out.strip()) == (0, str(storage / "tool" / longest)), found


# ----------------------------------------------------------------------------- P-5 / P-6


def test_both_policy_layers_must_allow_and_a_control_the_agent_could_rewrite_grants_nothing(
    searchable_storage: Path, traversable: Path
) -> None:
    """P-5 (steps 4 and 6), P-6, P-8, T-7 and §0 "agents with host-owned controls": ``ctx
    policy query`` over the agent's and the tool's own policy files follows P-6 as the user
    edits them, and ``ctx run`` agrees; but once the tool's policy is writable by others, or
    the agent's policy belongs to the agent's uid, the same rules grant nothing: ``explain``
    and ``run`` deny at step 6 and step 4, the tool never runs, and the session records it."""
    storage = searchable_storage
    trace = workdir(traversable, "trace", 0o1777) / "ran"
    program = f'#!/bin/sh\necho ran >> {trace}\necho "$@"\n'
    install(storage, traversable / "m", "note.echo", program)
    create_agent(storage, {"name": "coder", "label": "coder_t", "tools": ["note.echo"]})
    agent_policy = storage / "agent" / "coder.d" / "policy"
    tool_policy = storage / "tool" / "note.echo.d" / "policy"
    layers = ["--policy", agent_policy, "--policy", tool_policy]

    def query() -> Run:
        return ctx_run("policy", "query", *layers, "coder_t", "tool:note.echo", "execute")

    def explain() -> Run:
        return on(storage, "policy", "explain", "coder", "tool:note.echo", "execute")

    def runs() -> int:
        return len(trace.read_text().splitlines()) if trace.exists() else 0

    assert "allow coder_t tool:note.echo execute" in rules(agent_policy)
    assert (query().rc, query().out.strip()) == (1, "deny")
    assert explain().rc == 1 and "step 6" in explain().out + explain().err
    refused = on(storage, "run", "--agent", "coder", "note.echo", "hi")
    assert refused.rc == 126 and "EACCES" in refused.err, refused
    assert runs() == 0

    allow_in_tool(storage, "note.echo", "coder_t")
    assert (query().rc, query().out.strip()) == (0, "allow")
    assert explain().rc == 0, explain()
    ran = on(storage, "run", "--agent", "coder", "note.echo", "hi")
    assert (ran.rc, ran.out) == (0, "hi\n"), ran
    assert runs() == 1

    tool_policy.chmod(0o646)  # anyone may now write the tool's own policy
    assert query().rc == 0  # the text still holds both rules ...
    opened = explain()
    assert opened.rc == 1 and "step 6" in opened.out + opened.err, opened  # ... but grants nothing
    refused = on(storage, "run", "--agent", "coder", "note.echo", "hi")
    assert refused.rc == 126 and "EACCES" in refused.err, refused
    tool_policy.chmod(0o644)

    os.chown(agent_policy, AGENT_UID, -1)  # the agent could grant itself anything
    owned = explain()
    assert owned.rc == 1 and "step 4" in owned.out + owned.err, owned
    refused = on(storage, "run", "--agent", "coder", "note.echo", "hi")
    assert refused.rc == 126 and "EACCES" in refused.err, refused
    assert runs() == 1
    os.chown(agent_policy, 0, -1)
    assert on(storage, "run", "--agent", "coder", "note.echo", "hi").rc == 0
    assert runs() == 2

    results = [e for e in events(storage, "coder") if e["type"] == "tool_result"]
    assert [e["status"] for e in results] == ["error", "ok", "error", "error", "ok"]
    for event in results:
        assert event["agent"] == "coder" and event["object"] == "tool/note.echo"
    steps = [e.get("step") for e in results if e["status"] == "error"]
    assert steps == [6, 6, 4], results
    log = (storage / "tool" / "note.echo.d" / "log").read_text().splitlines()
    assert len(log) == 5, log


# ----------------------------------------------------------------------------- P-3 mount, P-5


def test_mount_rules_and_the_mount_table_together_decide_reads_and_writes(
    searchable_storage: Path, traversable: Path
) -> None:
    """P-3 (class ``mount``: read write), P-5 steps 3 and 5, P-8, A-3: an agent made with one
    rw and one ro mount gets a ``mount:<name> write`` rule for the rw one only; ``fs.write``
    writes through the rw mount and never through the ro one; taking the write rule out of
    the agent's policy refuses writes (``explain`` names step 5, ``query`` says deny) while
    reads go on, and taking the read rule out refuses reads too."""
    storage = searchable_storage
    work = workdir(traversable, "work", 0o777)
    ref = workdir(traversable, "ref", 0o755)
    (ref / "readme").write_text("reference\n")
    create_agent(
        storage,
        {
            "name": "m",
            "label": "m_t",
            "tools": ["fs.read", "fs.write"],
            "mount": [[str(work), "/workspace", "rw"], [str(ref), "/ref", "ro"]],
        },
    )
    for tool in ("fs.read", "fs.write"):
        allow_in_tool(storage, tool, "m_t")
    policy = storage / "agent" / "m.d" / "policy"
    mount_rules = [r for r in rules(policy) if " mount:" in r]
    writes = [r for r in mount_rules if r.endswith(" write")]
    assert len(writes) == 1, mount_rules
    work_mount = writes[0].split()[2]
    assert f"allow m_t {work_mount} read" in mount_rules
    assert len([r for r in mount_rules if r.endswith(" read")]) >= 2, mount_rules

    r, res = native(storage, "m", "fs.write", {"path": "/ref/new", "content": "x"})
    assert r.rc == 1 and res["status"] == "error", r
    assert sorted(os.listdir(ref)) == ["readme"]
    r, res = native(storage, "m", "fs.read", {"path": "/ref/readme"})
    assert r.rc == 0 and res["output"]["content"] == "reference\n", r
    r, res = native(storage, "m", "fs.write", {"path": "/workspace/a", "content": "one"})
    assert r.rc == 0 and res["status"] == "ok", r
    assert (work / "a").read_text() == "one"
    assert on(storage, "policy", "explain", "m", work_mount, "write").rc == 0

    drop_rule(policy, f"allow m_t {work_mount} write")
    r, res = native(storage, "m", "fs.write", {"path": "/workspace/b", "content": "two"})
    assert r.rc == 1 and res["status"] == "error", r
    assert not (work / "b").exists()
    explained = on(storage, "policy", "explain", "m", work_mount, "write")
    assert explained.rc == 1 and "step 5" in explained.out + explained.err, explained
    q = ctx_run("policy", "query", "--policy", policy, "m_t", work_mount, "write")
    assert (q.rc, q.out.strip()) == (1, "deny"), q
    r, res = native(storage, "m", "fs.read", {"path": "/workspace/a"})
    assert r.rc == 0 and res["output"]["content"] == "one", r

    drop_rule(policy, f"allow m_t {work_mount} read")
    r, res = native(storage, "m", "fs.read", {"path": "/workspace/a"})
    assert r.rc == 1 and res["status"] == "error", r
    assert "one" not in json.dumps(res)


# ----------------------------------------------------------------------------- P-5 step 2


def test_fs_write_is_judged_by_the_kernel_as_the_agents_uid(
    searchable_storage: Path, traversable: Path
) -> None:
    """P-5 step 2 (Linux mode bits), T-5, P-6: the files an agent reaches through its mounts
    are judged with its uid: a root-owned 0600 file is EACCES to ``fs.read``; ``shell.exec``
    cannot write a root-owned 0644 file; in a sticky directory ``fs.write`` cannot replace
    another owner's file (content, owner and mode stay); ``overwrite: false`` never replaces
    (EEXIST); a new file is written and belongs to the agent's uid."""
    storage = searchable_storage
    work = workdir(traversable, "work", 0o1777)
    secret = work / "secret.txt"
    secret.write_text("secret\n")
    secret.chmod(0o600)
    guarded = work / "guarded.txt"
    guarded.write_text("original\n")
    guarded.chmod(0o644)
    create_agent(
        storage,
        {
            "name": "w",
            "label": "w_t",
            "tools": ["fs.read", "fs.write", "shell.exec"],
            "mount": [[str(work), "/workspace", "rw"]],
        },
    )
    for tool in ("fs.read", "fs.write", "shell.exec"):
        allow_in_tool(storage, tool, "w_t")

    r, res = native(storage, "w", "fs.read", {"path": "/workspace/secret.txt"})
    assert r.rc == 1 and res["status"] == "error", r
    assert "EACCES" in json.dumps(res) and "secret\\n" not in json.dumps(res), res
    r, res = native(storage, "w", "fs.read", {"path": "/workspace/guarded.txt"})
    assert r.rc == 0 and res["output"]["content"] == "original\n", r
    shell = on(storage, "run", "--agent", "w", "shell.exec", f"printf x > {guarded}")
    assert shell.rc != 0, shell

    r, res = native(
        storage, "w", "fs.write", {"path": "/workspace/guarded.txt", "content": "clobbered"}
    )
    assert r.rc == 1 and res["status"] == "error", r
    r, res = native(storage, "w", "fs.write", {"path": "/workspace/new.txt", "content": "n"})
    assert r.rc == 0 and res["output"]["created"] is True, r
    assert (work / "new.txt").read_text() == "n"
    assert (work / "new.txt").stat().st_uid == AGENT_UID
    r, res = native(
        storage, "w", "fs.write", {"path": "/workspace/new.txt", "content": "m", "overwrite": False}
    )
    assert r.rc == 1 and "EEXIST" in json.dumps(res), r
    assert (work / "new.txt").read_text() == "n"
    assert guarded.read_text() == "original\n" and secret.read_text() == "secret\n"
    assert guarded.stat().st_uid == 0 and stat.S_IMODE(guarded.stat().st_mode) == 0o644


# ----------------------------------------------------------------------------- T-6 with P-5


def test_hooks_run_only_for_authorised_calls_in_name_order_and_a_veto_stops_the_rest(
    searchable_storage: Path, traversable: Path
) -> None:
    """T-6, T-7, P-5, P-6: executables of ``hooks/pre.d`` run in name order before the tool and
    ``hooks/post.d`` after it; a file without an execute bit is no hook; a call the chain
    denies runs no hook at all; a pre-hook's non-zero exit vetoes the tool and the hooks
    after it, and the session records each refusal."""
    storage = searchable_storage
    trace = workdir(traversable, "trace", 0o1777) / "trace"
    install(storage, traversable / "m", "guarded.echo", f"#!/bin/sh\necho tool >> {trace}\n")
    allow_in_tool(storage, "guarded.echo", "g_t")
    create_agent(storage, {"name": "g", "label": "g_t", "tools": []})
    hooks = storage / "tool" / "guarded.echo.d" / "hooks"

    def hook(where: str, name: str, word: str, code: int = 0, mode: int = 0o755) -> None:
        path = hooks / where / name
        path.write_text(f"#!/bin/sh\necho {word} >> {trace}\nexit {code}\n")
        path.chmod(mode)

    def seen() -> list[str]:
        return trace.read_text().split() if trace.exists() else []

    hook("pre.d", "20-second", "pre20")
    hook("pre.d", "10-first", "pre10")
    hook("pre.d", "05-plain", "plain", mode=0o644)
    hook("post.d", "50-audit", "post")

    denied = on(storage, "run", "--agent", "g", "guarded.echo")
    assert denied.rc == 126 and "EACCES" in denied.err, denied
    assert seen() == []

    with (storage / "agent" / "g.d" / "policy").open("a") as policy:
        policy.write("allow g_t tool:guarded.echo execute\n")
    ran = on(storage, "run", "--agent", "g", "guarded.echo")
    assert ran.rc == 0, ran
    assert seen() == ["pre10", "pre20", "tool", "post"]

    hook("pre.d", "15-veto", "veto", code=3)
    vetoed = on(storage, "run", "--agent", "g", "guarded.echo")
    assert vetoed.rc != 0, vetoed
    assert seen()[4:] == ["pre10", "veto"]

    results = [e for e in events(storage, "g") if e["type"] == "tool_result"]
    assert [e["status"] for e in results] == ["error", "ok", "error"], results
    assert results[0].get("step") == 5, results[0]
    assert all(e["object"] == "tool/guarded.echo" for e in results)


# ----------------------------------------------------------------------------- H-3, H-4, T-4


def test_ctx_tool_runs_only_the_core_tsh_config_its_path_resolves_to(
    storage: Path, tmp_path: Path, traversable: Path
) -> None:
    """H-3, H-4, T-4, T-8, T-8a, T-7: ``ctx tool tsh.config`` prints and updates the H-4
    settings of ``tool/tsh.d/config`` (bad input changes nothing); permission-bearing core
    tools are refused with EACCES and leave no log; a user-tier ``tsh.config`` first on
    ``CTX_PATH`` is what ``ctx object which`` prints, yet ``ctx tool`` refuses it without
    running it; and with nothing on ``CTX_PATH`` the name is ENOENT."""
    config = storage / "tool" / "tsh.d" / "config"
    home = tmp_path / "home"
    home.mkdir()
    system_path = {"CTX_HOME": str(home), "CTX_PATH": str(storage / "tool")}

    def tool(*args, path=system_path) -> Run:
        return on(storage, "tool", *args, extra_env=path)

    shown = tool("tsh.config")
    assert shown.rc == 0 and settings(shown.out) == TSH_DEFAULTS, shown
    assert settings(config.read_text()) == TSH_DEFAULTS
    changed = tool("tsh.config", "max_loaded_tools=16", "window_percent=2")
    assert changed.rc == 0, changed
    wanted = {**TSH_DEFAULTS, "max_loaded_tools": "16", "window_percent": "2"}
    assert settings(config.read_text()) == wanted
    assert settings(tool("tsh.config").out) == wanted
    text = config.read_text()
    for bad in ("cache_capacity=many", "no_such_key=1"):
        refused = tool("tsh.config", bad)
        assert refused.rc == 2, refused
        assert config.read_text() == text

    for name in ("fs.write", "shell.exec"):
        log = storage / "tool" / f"{name}.d" / "log"
        before = log.read_bytes()
        refused = tool(name, '{"path": "/tmp/x", "content": "x", "cmd": "true"}')
        assert (refused.rc, refused.out) == (1, ""), refused
        assert "EACCES" in refused.err, refused
        assert log.read_bytes() == before

    marker = workdir(traversable, "marks", 0o1777) / "shadow-ran"
    install(storage, tmp_path / "m", "tsh.config", f"#!/bin/sh\necho ran > {marker}\n", tier="user")
    user_tier = storage / "home" / str(os.getuid()) / "tool"
    shadowed = {"CTX_HOME": str(home), "CTX_PATH": f"{user_tier}:{storage / 'tool'}"}
    which = on(storage, "object", "which", "tsh.config", extra_env=shadowed)
    assert (which.rc, which.out.strip()) == (0, str(user_tier / "tsh.config")), which
    refused = tool("tsh.config", path=shadowed)
    assert refused.rc == 1 and "EACCES" in refused.err, refused
    assert not marker.exists()
    assert settings(config.read_text()) == wanted

    nowhere = {"CTX_HOME": str(home), "CTX_PATH": str(tmp_path / "empty")}
    (tmp_path / "empty").mkdir()
    missing = tool("tsh.config", path=nowhere)
    assert missing.rc == 1 and "ENOENT" in missing.err, missing
    gone = on(storage, "object", "which", "tsh.config", extra_env=nowhere)
    assert (gone.rc, gone.out) == (1, ""), gone
