"""A script author drives ``ctx`` only through ``--json`` and exit statuses, on the paths that
succeed: each command prints exactly one JSON document on stdout (JSON Lines where its help
says so) whose keys and value types are those its help and the docs name, the same whether
what it reports is empty or not, notes going to stderr only; and what one command prints is
what the next one takes (paths, names, call ids, session directories), as the docs chain them.
Refusals are test_acceptance_flows_json_errors.py's."""

from __future__ import annotations

import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.acceptance.ctxcli import CTX_ARGV, MAN_PAGES, Run, clean_env, ctx_run, tool_manifest

CORE_TOOLS = {"fs.read", "fs.list", "fs.stat", "fs.write", "shell.exec", "tsh.config"}
LISTED_TOOL = {"name", "tier", "path", "status", "reason", "description", "problems"}
S2_KEYS = ["ts", "type", "agent", "session", "object", "status"]
CALL_FRAME = {"type", "call", "tool", "agent", "session", "pid", "ts"}
RESULT_FRAME = {
    "type", "status", "tool", "agent", "session", "call", "mode", "output", "exit_status",
    "error", "stderr", "post_hooks", "started", "finished", "timings_ms",
}  # fmt: skip
RESULT_ERROR = {"error", "errno", "stage", "step", "step_name", "message"}
EXPLAIN_KEYS = {
    "agent", "object", "permission", "allowed", "step", "step_name", "errno", "reason", "steps",
}  # fmt: skip
EXPLAIN_STEP = {"step", "name", "result", "errno", "detail"}


# --- helpers ---------------------------------------------------------------------------------


def document(run: Run, rc: int = 0):
    """stdout holds one JSON document and nothing else, on one line ended by a newline; the
    exit status is the one expected; no traceback anywhere."""
    assert run.rc == rc, run
    assert "Traceback" not in run.err, run
    assert run.out.endswith("\n") and run.out.count("\n") == 1, run
    return json.loads(run.out)


def json_lines(run: Run, rc: int = 0) -> list[dict]:
    """stdout is JSON Lines: every line one JSON object, nothing else."""
    assert run.rc == rc, run
    assert "Traceback" not in run.err, run
    assert run.out == "" or run.out.endswith("\n"), run
    lines = [json.loads(line) for line in run.out.splitlines()]
    assert all(isinstance(line, dict) for line in lines), run
    return lines


def bash(script: str, env: dict[str, str]) -> Run:
    """A pipeline as a script writes it, under bash with pipefail."""
    done = subprocess.run(
        ["/bin/bash", "-c", f"set -o pipefail\n{script}"],
        capture_output=True,
        env={**env, "CTX": CTX_ARGV[0]},
        timeout=60,
    )
    return Run(["(bash)", script], done.returncode, done.stdout.decode(), done.stderr.decode())


def types_of(obj: dict) -> dict[str, str]:
    return {key: type(value).__name__ for key, value in obj.items()}


# --- 1. the root and its manual ----------------------------------------------------------------


def test_bootstrap_and_the_manual_answer_in_one_shape_before_and_after_the_bundle(
    tmp_path: Path,
) -> None:
    """R-5 and D-1: on a root that does not exist yet ``ctx man --json`` lists every topic from
    the built-in copy (path null, a note on stderr only); ``ctx bootstrap --json`` then reports
    ``created``/``repaired``/``problems``/``warnings`` as lists, every path it created being
    there, and a second run the same keys with nothing created; afterwards each topic the list
    names is read with ``ctx man TOPIC --json`` from the path the list gave, its ``text`` that
    file's content, and the listing keeps its keys with a path that is now a string."""
    root = tmp_path / "root"
    env = clean_env(CTX_STORAGE=str(root))

    before = ctx_run("man", "--json", env=env)
    listed_before = document(before)
    assert not root.exists(), "ctx man made the storage root"
    assert listed_before[0]["topic"] == "README"
    assert {t["topic"] for t in listed_before} == {"README", *MAN_PAGES}
    assert {t["origin"] for t in listed_before} == {"built-in"}
    assert {t["path"] for t in listed_before} == {None}
    page_before = document(ctx_run("man", "agent", "--json", env=env))
    assert "ctx bootstrap" in ctx_run("man", "agent", "--json", env=env).err  # the note
    assert page_before["origin"] == "built-in" and page_before["path"] is None

    first = document(ctx_run("bootstrap", "--json", env=env))
    report_keys = {"created", "repaired", "problems", "warnings"}
    assert report_keys <= set(first), first
    assert all(isinstance(first[k], list) for k in report_keys), first
    assert first["problems"] == [] and first["warnings"] == [] and first["created"], first
    for entry in first["created"]:
        assert isinstance(entry, str) and (root / entry).exists(), entry
    created_tools = {e[5:] for e in first["created"] if re.fullmatch(r"tool/[^/]+", e)}
    assert created_tools >= CORE_TOOLS, first
    second = document(ctx_run("bootstrap", "--json", env=env))
    assert types_of(second) == types_of(first), (first, second)
    assert second["created"] == [] and second["repaired"] == [], second
    # a narrowed directory (warned of, exit 0) and a loosened bin/tsh (rewritten): the same
    # keys and types, the lists now holding sentences that name each path
    (root / "model").chmod(0o700)
    (root / "bin" / "tsh").chmod(0o666)
    third = document(ctx_run("bootstrap", "--json", env=env))
    (root / "model").chmod(0o755)
    assert types_of(third) == types_of(first), third
    assert [w for w in third["warnings"] if str(root / "model") in w], third
    assert [r for r in third["repaired"] if r.startswith("bin/tsh")], third
    assert all(isinstance(line, str) for k in report_keys for line in third[k]), third
    assert third["problems"] == [] and third["created"] == [], third

    # what bootstrap says it created, object list lists as available in the system tier
    tools = document(ctx_run("object", "list", "--tier", "system", "--json", env=env))
    assert all(set(t) == LISTED_TOOL for t in tools), tools
    assert created_tools <= {t["name"] for t in tools}, (created_tools, tools)
    assert {t["name"] for t in tools if t["status"] == "available"} >= CORE_TOOLS, tools

    listed = document(ctx_run("man", "--json", env=env))
    assert [t["topic"] for t in listed] == [t["topic"] for t in listed_before]
    for entry, old in zip(listed, listed_before, strict=True):
        assert set(entry) == set(old) and entry["origin"] == "installed", entry
        page_run = ctx_run("man", entry["topic"], "--json", env=env)
        page = document(page_run)
        assert page_run.err == "", page_run
        assert set(page) == set(entry) | {"text"}, page
        assert {k: page[k] for k in entry} == entry
        assert page["text"] == Path(entry["path"]).read_text(), entry["topic"]
        assert Path(entry["path"]).is_relative_to(root / "shared" / "cortexfs-docs")
    # a page's text is the page itself: the same bytes as the text mode prints
    assert page["text"] == ctx_run("man", entry["topic"], env=env).out


# --- 2. tool objects -----------------------------------------------------------------------


def test_a_tool_goes_from_check_to_install_to_list_to_which_on_what_each_printed(
    storage: Path, tmp_path: Path
) -> None:
    """T-8, T-8a, T-4, X-1, H-4: ``object check --json`` names the manifest's tool; ``object
    install --json`` puts it where ``object list --json`` and ``object which --json`` then
    find it (the same path; ``replaced`` false then true); the user tier lists [] before and
    entries of the system tier's keys after; ``which``'s ``controls`` is the directory whose
    policy ``policy check`` reads from a pipe; a space made by ``shared create --json`` is the
    tier its path names; and ``ctx tool --json tsh.config`` reads, changes and leaves alone the
    settings in one object shape."""
    env = clean_env(CTX_STORAGE=str(storage), CTX_HOME=str(tmp_path / "home"))
    manifest = tool_manifest(tmp_path / "src", "demo.echo", "#!/bin/sh\ncat\n")
    (tmp_path / "src" / "demo.echo.sh").chmod(0o755)

    checked = document(ctx_run("object", "check", manifest, manifest, "--json", env=env))
    assert isinstance(checked, list) and len(checked) == 2, checked
    assert checked[0]["manifest"] == str(manifest) and checked[0]["valid"] is True
    name = checked[0]["name"]
    assert name == "demo.echo"

    empty = document(ctx_run("object", "list", "--tier", "user", "--json", env=env))
    assert empty == []
    installs = [
        document(ctx_run("object", "install", manifest, "--tier", "user", "--json", env=env))
        for _ in range(2)
    ]
    assert [i["replaced"] for i in installs] == [False, True], installs
    assert types_of(installs[0]) == types_of(installs[1])
    assert {"name", "tier", "path", "replaced"} <= set(installs[0])
    assert installs[0]["name"] == name and installs[0]["tier"] == "user"
    installed = Path(installs[0]["path"])
    assert installed.is_relative_to(storage / "home") and os.access(installed, os.X_OK)

    user_tier = document(ctx_run("object", "list", "--tier", "user", "--json", env=env))
    system = document(ctx_run("object", "list", "--tier", "system", "--json", env=env))
    assert [t["name"] for t in user_tier] == [name]
    for entry in [*user_tier, *system]:
        assert set(entry) == LISTED_TOOL, entry
        assert types_of(entry) == types_of(system[0]), entry
    assert user_tier[0]["path"] == str(installed) and user_tier[0]["status"] == "available"
    assert user_tier[0]["description"] == "The demo.echo test tool."

    found = document(ctx_run("object", "which", name, "--json", env=env))
    core = document(ctx_run("object", "which", "fs.stat", "--json", env=env))
    assert {"name", "path", "skipped"} <= set(found) and types_of(found) == types_of(core)
    assert found["path"] == str(installed) and found["skipped"] == []
    assert core["path"] == next(t["path"] for t in system if t["name"] == "fs.stat")
    assert Path(found["controls"]) == installed.with_name(f"{name}.d")
    # a file of that name earlier on CTX_PATH that is no hit is listed as skipped, in one shape
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / name).write_text("not executable\n")
    path = f"{shadow}:/ctx/tool:/ctx/home/{os.getuid()}/tool"
    skipping = document(ctx_run("object", "which", name, "--json", env={**env, "CTX_PATH": path}))
    assert types_of(skipping) == types_of(found) and skipping["path"] == found["path"]
    assert len(skipping["skipped"]) == 1 and str(shadow / name) in skipping["skipped"][0]

    # the controls which printed hold the policy an administrator edits; check it from a pipe
    piped = bash(f'p=$("$CTX" object which {name} --json | python3 -c \'import json,sys; '
                 'print(json.load(sys.stdin)["controls"])\') && "$CTX" policy check - --json '
                 '< "$p/policy"', env)  # fmt: skip
    assert document(piped) == {
        "valid": True,
        "files": [{"file": "-", "valid": True, "problems": []}],
    }

    space = document(ctx_run("shared", "create", "team", "--json", env=env))
    again = document(ctx_run("shared", "create", "team", "--json", env=env))
    assert {"regrouped_from", "regrouped", "kept", "repaired"} <= set(space)
    assert types_of(space) == types_of(again), (space, again)
    assert space["regrouped_from"] is None and space["regrouped"] == 0 and again["created"] == []
    assert space["created"] and all(Path(p).exists() for p in space["created"])
    shared_tier = f"shared:{Path(space['path']).name}"
    install = ["object", "install", manifest, "--tier", shared_tier, "--json"]
    into = document(ctx_run(*install, env=env))
    assert Path(into["path"]).parent == Path(space["path"]) / "tool" and into["tier"] == shared_tier
    in_space = document(ctx_run("object", "list", "--tier", shared_tier, "--json", env=env))
    assert [(t["name"], t["path"], t["tier"]) for t in in_space] == [
        (name, into["path"], shared_tier)
    ]

    config_file = storage / "tool" / "tsh.d" / "config"
    shown = document(ctx_run("tool", "--json", "tsh.config", env=env))
    assert set(shown) == {"path", "config", "changed", "warnings"}, shown
    assert shown["path"] == str(config_file) and shown["changed"] == []
    assert shown["config"] == {"max_loaded_tools": 64, "cache_capacity": 32, "window_percent": 1}
    value = shown["config"]["cache_capacity"] + 8
    changed = document(ctx_run("tool", "--json", "tsh.config", f"cache_capacity={value}", env=env))
    assert types_of(changed) == types_of(shown) and changed["changed"] == ["cache_capacity"]
    assert changed["config"]["cache_capacity"] == value
    assert f"cache_capacity={value}" in config_file.read_text()
    stamp = config_file.stat().st_mtime_ns
    same = document(ctx_run("tool", "--json", "tsh.config", f"cache_capacity={value}", env=env))
    assert same["changed"] == [] and same["config"] == changed["config"]
    assert config_file.stat().st_mtime_ns == stamp


def test_object_check_entries_keep_one_shape_whether_valid_or_not(tmp_path: Path) -> None:
    """T-8 and docs/tools.md (``--json``'s ``codes``, one per problem): a script that reads
    ``.[].problems`` and ``.[].codes`` of ``ctx object check --json`` finds two lists in every
    entry, empty for a valid manifest, as ``ctx policy check --json`` gives every file its
    ``problems`` list."""
    good = tool_manifest(tmp_path, "demo.good", "#!/bin/sh\ncat\n")
    bad = tmp_path / "bad.json"
    bad.write_text('{"manifest": 2}')
    checked = document(ctx_run("object", "check", good, bad, "--json"), rc=1)
    assert checked[1]["valid"] is False and checked[1]["problems"], checked
    assert set(checked[0]) == set(checked[1]), checked
    assert checked[0]["problems"] == [] and checked[0]["codes"] == [], checked


# --- 3. agents --------------------------------------------------------------------------------


def test_agents_created_listed_and_shown_agree_field_for_field(
    searchable_storage: Path, tmp_path: Path
) -> None:
    """A-3 and docs/tools.md: ``agent list --json`` is [] on a root without agents; ``agent
    create --json`` (a request from a pipe or a file) reports the identity, and
    ``default_user`` "nobody" when root named no user (null otherwise); ``agent list --json``
    then lists each with exactly ``name``, ``label``, ``identity``, ``problems`` and the
    identity create reported, and ``agent show --json`` of every listed name gives the same
    identity and label, its ``ctx_path``, ``tool_mounts``, ``withheld_mounts`` and
    ``problems``, the storage root at /ctx among its mounts."""
    root = searchable_storage
    env = clean_env(CTX_STORAGE=str(root))
    assert document(ctx_run("agent", "list", "--json", env=env)) == []

    request = json.dumps({"name": "coder", "label": "coder_t", "tools": ["fs.stat"]})
    made = {"coder": document(bash(f"printf '%s' '{request}' | \"$CTX\" agent create - --json",
                                   env))}  # fmt: skip
    (tmp_path / "helper.json").write_text('{"name": "helper", "label": "helper_t"}')
    other = ["--user", "daemon"] if os.geteuid() == 0 else []
    made["helper"] = document(
        ctx_run("agent", "create", tmp_path / "helper.json", *other, "--json", env=env)
    )
    for agent, created in made.items():
        assert {"identity", "default_user", "warnings"} <= set(created), created
        assert set(created["identity"]) == {"uid", "gid", "groups"}, created
        assert created["warnings"] == []
        assert created["name"] == agent and os.access(created["entry"], os.X_OK)
        assert (
            json.loads(Path(created["controls"], "identity").read_text()) == (created["identity"])
        )
    if os.geteuid() == 0:
        assert made["coder"]["default_user"] == "nobody", made
        assert made["coder"]["identity"]["uid"] == 65534
        assert made["helper"]["default_user"] is None, made
    assert set(made["coder"]) == set(made["helper"])

    listed = document(ctx_run("agent", "list", "--json", env=env))
    assert [a["name"] for a in listed] == ["coder", "helper"], listed
    for entry in listed:
        assert set(entry) == {"name", "label", "identity", "problems"}, entry
        assert entry["identity"] == made[entry["name"]]["identity"] and entry["problems"] == []
        shown = document(ctx_run("agent", "show", entry["name"], "--json", env=env))
        need = {"identity", "label", "ctx_path", "tool_mounts", "withheld_mounts", "problems"}
        assert need <= set(shown), shown
        assert (shown["identity"], shown["label"]) == (entry["identity"], entry["label"])
        assert shown["label"] == f"{entry['name']}_t"
        uid = entry["identity"]["uid"]
        assert shown["ctx_path"].split(":")[:2] == ["/ctx/tool", f"/ctx/home/{uid}/tool"]
        assert [str(root), "/ctx", "ro"] in shown["mounts"], shown
        assert shown["withheld_mounts"] == [] and shown["problems"] == []
        targets = {m[1] for m in shown["tool_mounts"]}
        assert "/ctx" in targets and all(m[2] in ("ro", "rw") for m in shown["tool_mounts"])


def test_an_agent_with_a_damaged_identity_is_listed_with_its_label(storage: Path) -> None:
    """A-3 and ``ctx agent list --help`` ("identity null when it cannot be read"): an agent
    whose identity control is damaged is listed with ``identity`` null and its problem, and
    still with the label its intact ``label`` control holds, the only key documented to
    become null being ``identity``."""
    env = clean_env(CTX_STORAGE=str(storage))
    request = '{"name": "helper", "label": "helper_t"}'
    document(ctx_run("agent", "create", "-", "--json", input=request, env=env))
    (storage / "agent" / "helper.d" / "identity").write_text("garbage")
    assert (storage / "agent" / "helper.d" / "label").read_text().strip() == "helper_t"
    (listed,) = document(ctx_run("agent", "list", "--json", env=env))
    assert listed["identity"] is None and len(listed["problems"]) == 1, listed
    assert "identity" in listed["problems"][0], listed
    assert listed["label"] == "helper_t", listed


# --- 4. policy ---------------------------------------------------------------------------------


def test_policy_answers_are_read_from_paths_other_commands_printed(
    searchable_storage: Path, tmp_path: Path
) -> None:
    """P-1, P-5, P-6, P-8 and docs/policy.md: with the agent's policy (the ``controls`` that
    ``agent create --json`` printed) and the tool's (``object which --json``'s), ``policy
    query --json`` is ``{"decision", "rule", "policies": [{"policy", "allows"}]}``, deny with
    exit 1 until the tool's own layer holds the rule, then allow with exit 0; ``policy
    explain --json`` is one object of the documented keys with its six steps, in the same
    shape allowed and denied; ``policy check --json`` reads both files at once."""
    root = searchable_storage
    env = clean_env(CTX_STORAGE=str(root))
    request = tmp_path / "coder.json"
    request.write_text('{"name": "coder", "label": "coder_t", "tools": ["fs.stat"]}')
    agent = document(ctx_run("agent", "create", request, "--json", env=env))
    agent_policy = str(Path(agent["controls"]) / "policy")
    tool_policy = str(
        Path(document(ctx_run("object", "which", "fs.stat", "--json", env=env))["controls"])
        / "policy"
    )
    query = ["policy", "query", "--policy", agent_policy, "--policy", tool_policy]
    query += ["coder_t", "tool:fs.stat", "execute", "--json"]

    denied = document(ctx_run(*query, env=env), rc=1)
    assert set(denied) == {"decision", "rule", "policies"}, denied
    assert denied["decision"] == "deny" and denied["rule"] == "allow coder_t tool:fs.stat execute"
    assert denied["policies"] == [
        {"policy": agent_policy, "allows": True},
        {"policy": tool_policy, "allows": False},
    ]
    with open(tool_policy, "a") as policy:
        policy.write(f"{denied['rule']}\n")  # the rule query printed is the line to add
    allowed = document(ctx_run(*query, env=env))
    assert allowed["decision"] == "allow" and types_of(allowed) == types_of(denied)
    assert [p["allows"] for p in allowed["policies"]] == [True, True]

    checked = document(ctx_run("policy", "check", agent_policy, tool_policy, "--json", env=env))
    assert checked == {
        "valid": True,
        "files": [
            {"file": agent_policy, "valid": True, "problems": []},
            {"file": tool_policy, "valid": True, "problems": []},
        ],
    }

    yes = document(ctx_run("policy", "explain", "coder", "tool:fs.stat", "execute", "--json",
                           env=env))  # fmt: skip
    no = document(ctx_run("policy", "explain", "coder", "tool:fs.read", "execute", "--json",
                          env=env), rc=1)  # fmt: skip
    for answer in (yes, no):
        assert set(answer) == EXPLAIN_KEYS, answer
        assert [s["step"] for s in answer["steps"]] == [1, 2, 3, 4, 5, 6], answer
        assert all(set(s) == EXPLAIN_STEP for s in answer["steps"]), answer
        assert answer["agent"] == "coder" and answer["permission"] == "execute"
        assert {s["result"] for s in answer["steps"]} <= {"pass", "deny", "n/a", "not reached"}
    assert (yes["object"], yes["allowed"], yes["step"], yes["errno"]) == (
        "tool:fs.stat", True, None, None,
    )  # fmt: skip
    assert {s["result"] for s in yes["steps"]} == {"pass"}
    assert (no["object"], no["allowed"], no["step"], no["errno"]) == (
        "tool:fs.read", False, 5, "EACCES",
    )  # fmt: skip
    assert no["step_name"] == no["steps"][4]["name"] == "object policy"
    assert [s["result"] for s in no["steps"]] == ["pass"] * 4 + ["deny", "not reached"]
    assert "allow coder_t tool:fs.read execute" in no["reason"]


# --- 5. native calls and their sessions ----------------------------------------------------------


def test_native_frames_and_the_session_commands_tell_one_story_in_json(
    searchable_storage: Path, tmp_path: Path
) -> None:
    """T-3, T-7, S-1, S-2, S-5: ``session list --json`` is [] before any call; ``ctx run
    --native`` prints JSON Lines, a ``call`` frame, a ``stderr`` frame per line and the
    ``result`` last, with the documented keys, its ``error`` null or the documented object;
    the session directory the result names is the one ``session list --json`` then lists;
    ``session show --json`` prints the events of both calls (S-2's six keys first, the
    frames' call ids), ``tail -n 1 --json`` the last of them and ``-n 0`` nothing; a torn
    line ``show`` skips (a note on stderr) is cut by ``session repair --json``, whose
    ``truncated_bytes`` is 0 on the next run."""
    root = searchable_storage
    env = clean_env(CTX_STORAGE=str(root))
    manifest = tool_manifest(tmp_path / "src", "demo.echo", "#!/bin/sh\necho working >&2\ncat\n")
    (tmp_path / "src" / "demo.echo.sh").chmod(0o755)
    tool = document(ctx_run("object", "install", manifest, "--tier", "system", "--json", env=env))
    request = {"name": "coder", "label": "coder_t", "tools": ["demo.echo"]}
    agent = document(ctx_run("agent", "create", "-", "--json", input=json.dumps(request), env=env))
    with open(Path(tool["path"] + ".d") / "policy", "a") as policy:
        policy.write("allow coder_t tool:demo.echo execute\n")
    assert document(ctx_run("session", "list", "coder", "--json", env=env)) == []

    ran = ctx_run("run", "--agent", "coder", "--native", "demo.echo", input='{"n": [1, 2]}',
                  env=env)  # fmt: skip
    frames = json_lines(ran)
    assert [f["type"] for f in frames] == ["call", "stderr", "result"], ran
    call, stderr, result = frames
    assert set(call) == CALL_FRAME and set(stderr) == {"type", "call", "text"}, frames
    assert set(result) == RESULT_FRAME, result
    assert call["call"] == stderr["call"] == result["call"] and stderr["text"] == "working"
    assert (call["tool"], call["agent"], call["session"]) == (
        result["tool"], result["agent"], result["session"],
    )  # fmt: skip
    assert isinstance(call["pid"], int) and result["mode"] == "native"
    assert (result["status"], result["output"], result["exit_status"], result["error"]) == (
        "ok", {"n": [1, 2]}, 0, None,
    )  # fmt: skip
    assert result["stderr"] == "working\n" and result["post_hooks"] == []
    assert {"total", "record"} <= set(result["timings_ms"])

    refused = ctx_run("run", "--agent", "coder", "--native", "fs.stat", input='{"path": "/"}',
                      env=env)  # fmt: skip
    (denial,) = json_lines(refused, rc=1)
    assert set(denial) == RESULT_FRAME and types_of(denial)["error"] == "dict", denial
    assert set(denial["error"]) == RESULT_ERROR, denial
    assert (denial["error"]["error"], denial["error"]["stage"], denial["error"]["step"]) == (
        "EACCES", "authorize", 5,
    )  # fmt: skip
    assert denial["output"] is None and denial["exit_status"] is None
    assert denial["session"] == result["session"]

    sessions = document(ctx_run("session", "list", "coder", "--json", env=env))
    assert sessions == [{"name": "default", "path": str(root / result["session"])}], sessions
    assert Path(sessions[0]["path"], "events.jsonl").is_file()
    assert result["session"].startswith(f"home/{agent['identity']['uid']}/agent/coder/")

    shown_run = ctx_run("session", "show", "coder", sessions[0]["name"], "--json", env=env)
    events = json_lines(shown_run)
    assert shown_run.err == ""
    assert [(e["type"], e["call"]) for e in events] == [
        ("tool_call", result["call"]),
        ("tool_result", result["call"]),
        ("tool_call", denial["call"]),
        ("tool_result", denial["call"]),
    ], events
    for event in events:
        assert list(event)[:6] == S2_KEYS, event
        assert (event["agent"], event["session"]) == ("coder", "default")
    assert events[1]["output"] == {"n": [1, 2]} and events[1]["exit_status"] == 0
    assert events[0]["object"] == "tool/demo.echo" and events[3]["status"] == "error"
    stored = Path(sessions[0]["path"], "events.jsonl").read_text()
    assert shown_run.out.splitlines() == stored.splitlines()  # each event as it is stored

    tail = ctx_run("session", "tail", "coder", "-n", "1", "--json", env=env)
    assert json_lines(tail) == events[-1:]
    assert json_lines(ctx_run("session", "tail", "coder", "-n", "0", "--json", env=env)) == []

    clean = document(ctx_run("session", "repair", "coder", "--json", env=env))
    assert set(clean) == {"session", "truncated_bytes", "tightened", "left"}, clean
    assert (clean["session"], clean["truncated_bytes"]) == (result["session"], 0)
    torn = '{"ts": "2026-'
    with open(Path(sessions[0]["path"], "events.jsonl"), "a") as log:
        log.write(torn)
    skipped = ctx_run("session", "show", "coder", "--json", env=env)
    assert json_lines(skipped) == events and "torn" in skipped.err, skipped
    cut = document(ctx_run("session", "repair", "coder", "--json", env=env))
    assert types_of(cut) == types_of(clean) and cut["truncated_bytes"] == len(torn), cut
    again = document(ctx_run("session", "repair", "coder", "--json", env=env))
    assert again == clean


# --- 6. --help says --json ----------------------------------------------------------------------

JSON_COMMANDS = [
    ["bootstrap"], ["man"], ["tool"],
    ["agent", "create"], ["agent", "list"], ["agent", "show"], ["agent", "start"],
    ["agent", "stop"],
    ["object", "check"], ["object", "install"], ["object", "list"], ["object", "which"],
    ["policy", "check"], ["policy", "explain"], ["policy", "query"],
    ["session", "list"], ["session", "show"], ["session", "tail"], ["session", "repair"],
    ["shared", "create"],
]  # fmt: skip
NATIVE_COMMANDS = [["run"]]  # JSON Lines through --native, no --json (docs/tools.md)


def test_every_command_that_answers_in_json_says_so_in_its_help() -> None:
    """§2.4 ("--json gives machine-readable output on stdout") and each command's help: the
    help of every ``ctx`` command outside the queue that takes ``--json`` names it (``ctx run``
    its ``--native`` JSON Lines), on stdout, exit 0; the command groups ``ctx --help`` lists
    are the ones walked here, and a group's commands are those its help lists."""
    top = ctx_run("--help")
    assert top.rc == 0, top
    listed = re.findall(r"^  (\S+)\s", top.out.split("Commands:")[1], flags=re.M)
    walked = {c[0] for c in JSON_COMMANDS + NATIVE_COMMANDS} | {"queue", "mount", "umount"}
    assert set(listed) == walked, listed
    for group in ("agent", "object", "policy", "session", "shared"):
        helped = ctx_run(group, "--help")
        names = re.findall(r"^  (\S+)\s", helped.out.split("Commands:")[1], flags=re.M)
        with_json = {c[1] for c in JSON_COMMANDS if c[0] == group}
        assert with_json <= set(names), (group, names)
        assert set(names) - with_json <= {"attach", "watch"}, (group, names)

    with ThreadPoolExecutor(max_workers=4) as pool:
        helps = list(pool.map(lambda c: ctx_run(*c, "--help"), JSON_COMMANDS + NATIVE_COMMANDS))
    for command, helped in zip(JSON_COMMANDS + NATIVE_COMMANDS, helps, strict=True):
        assert (helped.rc, helped.err) == (0, ""), helped
        option = "--native" if command in NATIVE_COMMANDS else "--json"
        assert re.search(rf"^\s+{option}\s+\S", helped.out, flags=re.M), (command, helped)
    assert "JSON Lines" in helps[-1].out or "JSONL" in helps[-1].out
