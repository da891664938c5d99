"""End-to-end flows of a new user who learns CortexFS from the manual bundle (SPEC §12) and from
the command line's own guidance (§7): the pages ``ctx bootstrap`` installs, read with
``ctx man``, are held to what the installed ``ctx``, ``tsh`` and core tools really do — the
commands they name, the core tools' inputs and outputs, the tsh.config examples, the example
manifest of ``ctx man tool`` installed by the user, and ``ctx tool`` beside ``ctx object
list``/``which`` while the tool is switched off, damaged and repaired."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.acceptance.ctxcli import MAN_PAGES, REPO, Run, clean_env, ctx_run, read_jsonl

BIN = REPO / ".venv" / "bin"
H4_DEFAULTS = {"max_loaded_tools": "64", "cache_capacity": "32", "window_percent": "1"}
# The tools ctx.coreutils describes with an input table of their own.
TABLED = ("fs.read", "fs.list", "fs.stat", "fs.write", "shell.exec")
# The core tools ctx.coreutils says bootstrap installs ("eight core tools"), and tsh (H-1).
CORE = (*TABLED, "tsh.config", "agent.update", "agent.create")
# The tsh built-ins the coreutils page teaches ("What tsh does with these settings").
TSH_BUILTINS = ("load", "describe", "pin", "loaded", "unload", "unpin", "rehash")


# --- helpers ---------------------------------------------------------------------------------


def human_env(storage: Path, home: Path, **extra: str) -> dict[str, str]:
    """A person on the host: this storage root, ``home`` as CTX_HOME (no .tshrc) and the
    default CTX_PATH, ``/ctx/tool:/ctx/home/<uid>/tool`` (T-4)."""
    home.mkdir(parents=True, exist_ok=True)
    return clean_env(CTX_STORAGE=str(storage), CTX_HOME=str(home), **extra)


def man(env: dict[str, str], topic: str) -> dict:
    """``ctx man TOPIC --json``: the installed page, read without a note."""
    shown = ctx_run("man", topic, "--json", env=env)
    assert (shown.rc, shown.err) == (0, ""), shown
    page = shown.json()
    assert page["origin"] == "installed", page
    return page


def section(text: str, heading: str) -> str:
    """The text of a markdown page from ``heading`` to the next heading of its level."""
    level = heading.split(" ")[0]
    start = text.index(f"\n{heading}\n")
    end = text.find(f"\n{level} ", start + len(heading) + 2)
    return text[start : end if end != -1 else len(text)]


def fenced(text: str, language: str = r"\w*") -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.M | re.S)


def tsh(storage: Path, script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The storage root's ``bin/tsh`` as a standalone human tsh (H-2) reading ``script``."""
    return subprocess.run(
        [storage / "bin" / "tsh"], input=script, capture_output=True, text=True, env=env,
        timeout=60,
    )  # fmt: skip


def run_tool(
    storage: Path, name: str, *args: str, native: bool = False
) -> subprocess.CompletedProcess[str]:
    """A core tool's executable run by hand, as ctx.coreutils allows ("Run by hand outside
    ``ctx run`` … the tools see the host filesystem as one writable mount of /")."""
    env = clean_env(**({"CTX_MODE": "native"} if native else {}))
    return subprocess.run(
        [storage / "tool" / name, *args], input="", capture_output=True, text=True, env=env,
        timeout=60,
    )  # fmt: skip


def settings(text: str) -> dict[str, str]:
    """The ``key=value`` lines of a config text, blank and ``#`` lines left out."""
    found = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            found[key.strip()] = value.strip()
    return found


def listed(env: dict[str, str], *args: str) -> dict[str, dict]:
    """``ctx object list --json``, by name."""
    shown = ctx_run("object", "list", "--json", *args, env=env)
    assert shown.rc == 0, shown
    return {entry["name"]: entry for entry in shown.json()}


# --- 1. the coreutils page and the core tools -----------------------------------------------


def input_table(text: str) -> dict[str, tuple[str, bool]]:
    """A tool's input table: name -> (type, required)."""
    rows = re.findall(r"^\| `(\w+)`\s*\|\s*(\w+)\s*\|\s*([^|]*?)\s*\|", text, flags=re.M)
    return {name: (kind, default == "(required)") for name, kind, default in rows}


def native_keys(text: str) -> tuple[list[str], list[str]]:
    """The keys a section's "Native output: `{…}`" names, and those of its list's items."""
    shape = re.search(r"Native output: `(\{.*?\})`", text, flags=re.S).group(1)
    inner = re.search(r"\[\{(.*?)\}", shape)
    top = re.sub(r"\[.*\]", "", shape, flags=re.S)
    return re.findall(r'"(\w+)"', top), re.findall(r'"(\w+)"', inner.group(1) if inner else "")


def schema_type(prop: dict) -> str:
    if "type" in prop:
        return prop["type"]
    assert all(isinstance(value, str) for value in prop.get("enum", [None])), prop
    return "string"


def test_the_coreutils_page_tells_each_core_tools_inputs_and_outputs_as_they_are(
    storage: Path, tmp_path: Path
) -> None:
    """D-1, R-5, T-1, T-2, T-3: ``ctx man coreutils`` (the installed page) names the core
    tools bootstrap installs; each input table is the installed ``schema`` control and what
    ``tsh describe`` shows (names, types, required), the inputs the tool's own refusal of an
    unknown key lists (EINVAL, exit 2); the native output keys and terminal forms it prints
    are what the tool, run by hand as the page allows, prints."""
    env = human_env(storage, tmp_path / "home")
    text = man(env, "coreutils")["text"]
    assert text == (storage / "shared/cortexfs-docs/man/ctx.coreutils.md").read_text()

    # "ctx bootstrap installs eight core tools into the system tier", and tsh (H-1)
    system = listed(env, "--tier", "system")
    assert set(system) == {*CORE, "tsh"}, sorted(system)
    assert "eight core tools" in text
    described = tsh(storage, "describe " + " ".join(CORE) + "\n", env)
    assert described.returncode == 0, described
    shown = {d["name"]: d for d in map(json.loads, re.split(r"(?m)^(?=\{)", described.stdout)[1:])}
    for name in CORE:
        controls = storage / "tool" / f"{name}.d"
        assert system[name]["status"] == "available", system[name]
        description = (controls / "description").read_text().strip()
        assert system[name]["description"] == description == shown[name]["description"].strip()
        assert json.loads((controls / "schema").read_text()) == shown[name]["schema"], name

    for name in TABLED:
        part = section(text, f"## {name}")
        table = input_table(part)
        schema = shown[name]["schema"]
        assert set(table) == set(schema["properties"]), (name, table, schema)
        assert {key for key, (_, req) in table.items() if req} == set(schema.get("required", []))
        for key, (kind, _) in table.items():
            assert schema_type(schema["properties"][key]) == kind, (name, key)
        # "The fields are checked in every mode, before the tool acts": the refusal names them
        refused = run_tool(storage, name, '{"nosuch": 1}', native=True)
        assert refused.returncode == 2, refused
        error = json.loads(refused.stdout)
        assert (error["error"], error["errno"]) == ("EINVAL", 22), refused
        assert refused.stderr.startswith(f"{name}: EINVAL: "), refused
        inputs = re.search(r"its inputs: ([^)]*)\)", error["message"]).group(1)
        assert set(re.findall(r"'(\w+)'", inputs)) == set(table), (name, error)

    # what each fs.* tool prints, in both modes, against what the page says
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    (work / "a.txt").write_text("hello\n")
    (work / "l").symlink_to("a.txt")
    calls = {
        "fs.read": str(work / "a.txt"),
        "fs.list": str(work),
        "fs.stat": str(work / "a.txt"),
        "fs.write": json.dumps({"path": str(work / "new.txt"), "content": "new\n"}),
    }
    outputs = {}
    for name, argument in calls.items():
        done = run_tool(storage, name, argument, native=True)
        assert done.returncode == 0, done
        outputs[name] = json.loads(done.stdout)
        top, items = native_keys(section(text, f"## {name}"))
        assert list(outputs[name]) == top, (name, outputs[name])
        for entry in outputs[name].get("entries", []):
            assert list(entry) == items, entry
    assert outputs["fs.read"]["content"] == "hello\n" and outputs["fs.read"]["encoding"] == "utf-8"
    assert [(e["name"], e["type"]) for e in outputs["fs.list"]["entries"]] == [
        ("a.txt", "file"), ("l", "symlink"), ("sub", "directory"),
    ]  # fmt: skip
    assert outputs["fs.stat"]["mode"] == "0644" and outputs["fs.stat"]["type"] == "file"
    assert outputs["fs.write"] == {"path": str(work / "new.txt"), "bytes": 4, "created": True}

    plain = {name: run_tool(storage, name, calls[name]) for name in ("fs.read", "fs.list")}
    assert plain["fs.read"].stdout == "hello\n"  # "Terminal output: the bytes themselves"
    assert plain["fs.list"].stdout.splitlines() == ["a.txt", "l@", "new.txt", "sub/"]
    stat_lines = run_tool(storage, "fs.stat", calls["fs.stat"]).stdout.splitlines()
    assert [line.split(": ", 1)[0] for line in stat_lines] == list(outputs["fs.stat"])
    wrote = run_tool(storage, "fs.write", json.dumps({"path": str(work / "b"), "content": "xy"}))
    assert wrote.stdout == f"wrote 2 bytes to {work / 'b'}\n", wrote
    # the confinement table: "fs.read or fs.write of a directory … EISDIR", exit 1
    for native in (False, True):
        refused = run_tool(storage, "fs.read", str(work), native=native)
        assert refused.returncode == 1 and refused.stderr.startswith("fs.read: EISDIR: "), refused


# --- 2. the commands the manual and the help texts send a reader to -------------------------


class HelpTree:
    """``ctx`` commands as their ``--help`` shows them, asked as a reader would."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.helps: dict[tuple[str, ...], str] = {}

    def help(self, command: tuple[str, ...]) -> str:
        if command not in self.helps:
            shown = ctx_run(*command[1:], "--help", env=self.env)
            assert (shown.rc, shown.err) == (0, ""), shown
            assert shown.out.startswith(f"Usage: {' '.join(command)} "), shown
            self.helps[command] = shown.out
        return self.helps[command]

    def subcommands(self, command: tuple[str, ...]) -> list[str]:
        found = re.search(r"^Commands:\n((?:  .*\n?)*)", self.help(command), flags=re.M)
        lines = found.group(1).splitlines() if found else []
        return [line.split()[0] for line in lines if re.match(r"  \S", line)]

    def walk(self) -> None:
        """Every command of the tree, each level's helps asked at once."""
        todo = [("ctx",)]
        with ThreadPoolExecutor(8) as pool:
            while todo:
                list(pool.map(self.help, todo))
                todo = [(*command, name) for command in todo for name in self.subcommands(command)]

    def resolve(self, words: list[str]) -> tuple[tuple[str, ...], str | None]:
        """The command ``ctx WORDS`` names, and the word that names no command, if any."""
        command: tuple[str, ...] = ("ctx",)
        at = 0
        while at < len(words) and self.subcommands(command):
            word = words[at].rstrip(",.;:)'\"")
            if word.startswith("-"):  # a group's option (ctx --storage DIR object …)
                at += 1
                if at < len(words) and words[at] not in self.subcommands(command):
                    at += 1
                continue
            if not re.fullmatch(r"[a-z][a-z-]*", word):
                break  # a placeholder: NAME, <topic>, [...]
            if word not in self.subcommands(command):
                return command, word
            command = (*command, word)
            at += 1
        self.help(command)
        return command, None


def command_lines(text: str) -> list[str]:
    """Every ``ctx …`` command line of a page: in its code blocks and its `inline` spans."""
    lines = []
    for block in fenced(text):
        for line in block.splitlines():
            lines += [m.group(1) for m in re.finditer(r"(?:^|[\s(;|&$`\"])ctx( [^#\n]*)", line)]
    lines += [m[len("ctx") :] for m in re.findall(r"`(ctx [^`]*)`", text)]
    return [line.strip() for line in lines if line.strip()]


def test_every_command_the_manual_and_the_help_texts_name_is_one_ctx_and_tsh_know(
    storage: Path, tmp_path: Path
) -> None:
    """D-1 ("a page describes a command your ctx does not know" is a stale bundle), H-1, H-4:
    on a freshly bootstrapped root every installed page is current; the README names every
    topic ``ctx man`` lists and the keys of ``ctx man TOPIC --json``; every ``ctx …`` command
    line of every page, and every ``'ctx …'`` a ``--help`` tells the reader to run, names a
    command whose ``--help`` answers; and the tsh built-ins the coreutils page teaches are in
    ``tsh help`` and work in a standalone tsh."""
    env = human_env(storage, tmp_path / "home")
    topics = ctx_run("man", "--json", env=env)
    assert topics.rc == 0, topics
    listing = topics.json()
    assert [e["topic"] for e in listing] == ["README", *MAN_PAGES], listing
    assert {e["origin"] for e in listing} == {"installed"}
    pages = {entry["topic"]: man(env, entry["topic"]) for entry in listing}
    for topic, page in pages.items():
        where = "README.md" if topic == "README" else f"man/{page['page']}"
        assert page["path"] == str(storage / "shared" / "cortexfs-docs" / where)
        assert Path(page["path"]).read_text() == page["text"]

    readme = pages["README"]["text"]
    named = re.findall(r"^\* `ctx\.([\w-]+)\.md` — ", readme, flags=re.M)
    assert sorted(named) == sorted(MAN_PAGES), named
    keys = re.search(r"ctx man agent --json\s+# \{([^}]*)\}", readme).group(1)
    assert set(pages["agent"]) == set(re.findall(r'"(\w+)"', keys)), pages["agent"].keys()

    tree = HelpTree(env)
    tree.walk()
    unknown = []
    taught = set()
    for topic, page in pages.items():
        for line in command_lines(page["text"]):
            command, wrong = tree.resolve(line.split())
            taught.add(command)
            if wrong is not None:
                unknown.append(f"ctx man {topic}: ctx {line}  ('{wrong}' is no command of "
                               f"{' '.join(command)})")  # fmt: skip
    # the pages' main commands were found and resolved, so the check above stood on them
    assert {("ctx", "run"), ("ctx", "tool"), ("ctx", "man"), ("ctx", "bootstrap"),
            ("ctx", "object", "install"), ("ctx", "agent", "create"),
            ("ctx", "session", "show"), ("ctx", "policy", "explain")} <= taught  # fmt: skip
    helps = dict(tree.helps)
    tsh_help = subprocess.run(
        [storage / "bin" / "tsh", "--help"], capture_output=True, text=True, env=env, timeout=60
    )
    assert tsh_help.returncode == 0, tsh_help
    helps[("tsh",)] = tsh_help.stdout
    for command, text in helps.items():
        for mention in re.findall(r"'ctx ([^']*)'", text):
            _, wrong = tree.resolve(mention.split())
            if wrong is not None:
                unknown.append(f"{' '.join(command)} --help: 'ctx {mention}'")
    assert unknown == []

    # the tsh built-ins of the coreutils page
    told = section(pages["coreutils"]["text"], "## What tsh does with these settings")
    for builtin in TSH_BUILTINS:
        assert f"`{builtin}" in told, builtin
        assert re.search(rf"^  {builtin}\b", tsh_help.stdout, flags=re.M), builtin
    script = "load fs.read fs.list\ndescribe fs.stat\npin fs.list\nloaded\nunload fs.read\n"
    script += "unpin fs.list\nrehash\nwhich fs.read\nloaded\n"
    ran = tsh(storage, script, env)
    assert ran.returncode == 0 and ran.stderr == "", ran
    lines = ran.stdout.splitlines()
    last = lines[lines.index(str(storage / "tool" / "fs.read")) + 1 :]
    # fs.read unloaded, fs.list unpinned: what stays is what was loaded and kept
    assert sorted(line.split(":")[0] for line in last) == ["fs.list", "fs.stat"], ran
    assert not any("(pinned)" in line for line in last), ran


# --- 3. the tsh.config examples of the coreutils page ---------------------------------------


def test_the_tsh_config_examples_run_as_printed_and_a_hand_made_fault_waits_for_a_hand_fix(
    storage: Path, tmp_path: Path
) -> None:
    """H-3, H-4, R-5, D-1: the config bootstrap wrote is the one ``ctx man coreutils`` prints;
    its three ``ctx tool tsh.config`` examples, run as printed, read the defaults, change two
    settings and then two more in native mode (``{"path", "config", "changed", "warnings"}``),
    keeping the comment; a key given twice by hand is warned of with its default applied,
    refuses updates (EINVAL, exit 1), is a problem bootstrap reports and leaves (exit 1), and
    once fixed by hand bootstrap has nothing to do and the settings read as written."""
    env = human_env(storage, tmp_path / "home")
    env["PATH"] = f"{BIN}:{env.get('PATH', '/usr/bin:/bin')}"
    config = storage / "tool" / "tsh.d" / "config"
    part = section(man(env, "coreutils")["text"], "## tool/tsh.d/config and tsh.config")
    printed = [block for block in fenced(part, "") if "max_loaded_tools=" in block]
    assert printed == [config.read_text()], (printed, config.read_text())
    comment = config.read_text().splitlines()[0]
    assert comment.startswith("#")

    examples = [line for block in fenced(part, "sh") for line in block.splitlines()]
    assert [line.split()[:2] for line in examples] == [["ctx", "tool"]] * 3, examples
    answers = [
        subprocess.run(["bash", "-c", line], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=60)
        for line in examples
    ]  # fmt: skip
    assert [a.returncode for a in answers] == [0, 0, 0], answers
    assert settings(answers[0].stdout) == H4_DEFAULTS, answers[0]
    assert settings(answers[1].stdout) == {
        "max_loaded_tools": "64", "cache_capacity": "64", "window_percent": "2",
    }, answers[1]  # fmt: skip
    native = json.loads(answers[2].stdout)
    assert set(native) == {"path", "config", "changed", "warnings"}, native
    wanted = {"max_loaded_tools": 32, "cache_capacity": 64, "window_percent": 2}
    assert (native["path"], native["config"], native["warnings"]) == (str(config), wanted, [])
    assert "max_loaded_tools" in native["changed"], native
    assert set(native["changed"]) <= {"max_loaded_tools", "window_percent"}, native
    assert config.read_text().splitlines()[0] == comment
    assert settings(config.read_text()) == {k: str(v) for k, v in wanted.items()}
    log = read_jsonl(storage / "tool" / "tsh.config.d" / "log")
    assert [(e["mode"], e["agent"], e["uid"]) for e in log[-3:]] == [
        ("host", "", os.getuid())
    ] * 3, log
    assert log[-2]["argv"] == ["cache_capacity=64", "window_percent=2"], log

    # a key given twice, by hand: "a key given twice is a problem, and its default applies"
    faulty = config.read_text() + "cache_capacity=5\n"
    config.write_text(faulty)
    read = ctx_run("tool", "tsh.config", env=env)
    assert read.rc == 0 and settings(read.out)["cache_capacity"] == "32", read
    assert read.err.startswith("ctx: warning: tsh.config: tsh.d/config:5: "), read
    read = ctx_run("tool", "--json", "tsh.config", env=env)
    assert read.rc == 0, read
    assert [w.split(": ")[0] for w in read.json()["warnings"]] == ["tsh.d/config:5"], read
    refused = ctx_run("tool", "tsh.config", "window_percent=3", env=env)
    assert refused.rc == 1 and "EINVAL" in refused.err, refused
    reported = ctx_run("bootstrap", "--json", env=env)
    assert reported.rc == 1, reported
    problems = reported.json()["problems"]
    assert len(problems) == 1 and "tool/tsh.d/config:5" in problems[0], reported
    assert config.read_text() == faulty

    config.write_text(faulty.replace("cache_capacity=5\n", ""))  # fixed by hand
    again = ctx_run("bootstrap", "--json", env=env)
    assert again.rc == 0, again
    assert {k: v for k, v in again.json().items() if k != "root"} == {
        "created": [], "repaired": [], "problems": [], "warnings": [],
    }, again  # fmt: skip
    read = ctx_run("tool", "tsh.config", env=env)
    assert (read.rc, read.err, settings(read.out)) == (
        0,
        "",
        {k: str(v) for k, v in wanted.items()},
    )


# --- 4. the tool page's example manifest, installed by the user -----------------------------

UPPER = """\
#!/bin/sh
touch "$0.ran" 2>/dev/null
tr a-z A-Z
"""


def test_the_tool_pages_example_installed_by_the_user_appears_in_every_listing_as_the_page_says(
    storage: Path, tmp_path: Path
) -> None:
    """T-1, T-8, T-8a, H-2, H-3, D-1: the v2 manifest ``ctx man tool`` prints, saved with its
    program, is valid and installs into the user tier with the controls the page's "A tool on
    disk" lists (a policy of comments only: installing grants nothing); ``ctx object list``,
    ``ctx object which``, tsh's ``tools``, ``which`` and ``describe`` all show it alike;
    ``ctx tool`` refuses it (EACCES) without running it; ``disabled`` written to its status is
    listed, and kept by a reinstall, as the page says, with the administrator's policy and log."""
    env = human_env(storage, tmp_path / "home")
    page = man(env, "tool")["text"]
    manifests = section(page, "## Manifests and ctx object")
    document = json.loads(fenced(manifests, "json")[0])
    source = tmp_path / "src"
    (source / Path(document["exec"]).parent).mkdir(parents=True)
    (source / document["exec"]).write_text(UPPER)
    manifest = source / f"{document['name']}.json"
    manifest.write_text(json.dumps(document))
    name = document["name"]

    checked = ctx_run("object", "check", manifest, env=env)
    assert (checked.rc, checked.out) == (0, f"{manifest}: valid ({name})\n"), checked
    installed = ctx_run("object", "install", manifest, "--tier", "user", env=env)
    tool = storage / "home" / str(os.getuid()) / "tool" / name
    assert installed.rc == 0, installed
    assert installed.out == f"installed {name} in tier user: {tool}\n", installed

    # the controls "A tool on disk" lists: every one that is not optional, and no other
    on_disk = re.findall(r"^<tier>/<name>\.d/(\S+?)/?\s+(.*)$", fenced(page)[0], flags=re.M)
    required = {entry for entry, said in on_disk if not said.startswith("optional")}
    optional = {entry for entry, said in on_disk if said.startswith("optional")}
    controls = Path(f"{tool}.d")
    present = {str(p.relative_to(controls)) for p in controls.rglob("*")} - {"hooks"}
    assert required <= present and present <= required | optional, (present, required)
    assert not present & {"mcp", "program"}  # the manifest has neither
    assert (controls / "name").read_text().strip() == name
    assert (controls / "description").read_text().strip() == document["description"]
    assert json.loads((controls / "schema").read_text()) == document["schema"]
    assert json.loads((controls / "cap").read_text()) == document["cap"]
    assert (controls / "status").read_text().strip() == "available"
    # origin: "the manifest, install time, uid, sha256" (of the program installed)
    origin = json.loads((controls / "origin").read_text())
    assert set(origin) == {"manifest", "installed", "uid", "sha256"}, origin
    assert (origin["manifest"], origin["uid"]) == (str(manifest), os.getuid()), origin
    assert (
        origin["sha256"]
        == hashlib.sha256(tool.read_bytes()).hexdigest()
        == (hashlib.sha256(UPPER.encode()).hexdigest())
    )
    rules = [line for line in (controls / "policy").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]  # fmt: skip
    assert rules == []

    # every listing shows it alike
    everything = listed(env)
    entry = everything[name]
    assert (entry["tier"], entry["path"], entry["status"], entry["description"]) == (
        "user", str(tool), "available", document["description"],
    ), entry  # fmt: skip
    text_line = [ln for ln in ctx_run("object", "list", "--tier", "user", env=env).lines()]
    assert len(text_line) == 1 and text_line[0].split()[:3] == [name, "user", "available"]
    which = ctx_run("object", "which", name, env=env)
    assert which.out == f"{tool}\n", which
    looked = tsh(storage, f"tools\nwhich {name}\ndescribe {name}\n", env)
    assert looked.returncode == 0, looked
    out = looked.stdout.splitlines()
    on_path = {n for n, e in everything.items() if e["tier"] in ("system", "user")}
    tools_listed = out[: out.index(str(tool))]
    assert set(tools_listed) == on_path, tools_listed
    described = json.loads("\n".join(out[out.index(str(tool)) + 1 :]))
    assert described["path"] == str(tool)
    assert (described["schema"], described["cap"]) == (document["schema"], document["cap"])
    assert described["description"].strip() == document["description"]

    # ctx tool runs only the safe core CLI (ctx.tool: "Not available in this version")
    refused = ctx_run("tool", name, '{"text": "a"}', env=env)
    assert (refused.rc, refused.out) == (1, "") and "EACCES" in refused.err, refused
    assert not Path(f"{tool}.ran").exists()

    # "Write disabled to switch a tool off; a reinstall keeps it"
    (controls / "policy").write_text("# mine\nallow coder_t tool:text.upper execute\n")
    (controls / "status").write_text("disabled\n")
    log_before = (controls / "log").read_bytes()
    assert listed(env, "--tier", "user")[name]["status"] == "disabled"
    again = ctx_run("object", "install", manifest, "--tier", "user", env=env)
    assert again.rc == 0, again
    assert (controls / "status").read_text() == "disabled\n"
    assert (controls / "policy").read_text().endswith("allow coder_t tool:text.upper execute\n")
    assert (controls / "log").read_bytes() == log_before
    assert listed(env, "--tier", "user")[name]["status"] == "disabled"


# --- 5. ctx tool beside ctx object list and which -------------------------------------------


def test_ctx_tool_and_the_listings_agree_while_tsh_config_is_switched_off_damaged_and_repaired(
    storage: Path, tmp_path: Path
) -> None:
    """H-3, T-1, T-8a, R-5: ``ctx tool tsh.config`` runs what ``ctx object which`` finds while
    ``ctx object list`` says ``available``; written ``disabled``, the list says so, ``ctx tool``
    refuses it (EACCES, naming the status control) and bootstrap leaves that setting alone;
    with a control missing, the list says ``damaged`` naming it, ``ctx tool`` refuses it
    (ENOEXEC naming ``ctx bootstrap``, one JSON error with --json), bootstrap repairs exactly
    that tool keeping its settings, status and log, and ``ctx tool`` runs again."""
    env = human_env(storage, tmp_path / "home")
    config = storage / "tool" / "tsh.d" / "config"
    controls = storage / "tool" / "tsh.config.d"
    path = str(storage / "tool" / "tsh.config")

    which = ctx_run("object", "which", "--json", "tsh.config", env=env)
    assert which.rc == 0 and which.json()["path"] == path, which
    assert listed(env, "--tier", "system")["tsh.config"]["path"] == path
    tuned = ctx_run("tool", "tsh.config", "cache_capacity=48", env=env)
    assert tuned.rc == 0 and settings(tuned.out)["cache_capacity"] == "48", tuned
    tuned_config = config.read_bytes()

    def refused(expected_rc: int, errno_name: str) -> Run:
        done = ctx_run("tool", "tsh.config", "cache_capacity=49", env=env)
        assert (done.rc, done.out) == (expected_rc, ""), done
        assert done.err.startswith(f"ctx: {errno_name}: "), done
        as_json = ctx_run("tool", "--json", "tsh.config", env=env)
        assert as_json.rc == expected_rc and as_json.json()["error"] == errno_name, as_json
        assert config.read_bytes() == tuned_config
        return done

    (controls / "status").write_text("disabled\n")
    assert listed(env, "--tier", "system")["tsh.config"]["status"] == "disabled"
    off = refused(1, "EACCES")
    assert "tsh.config.d/status" in off.err and "'available'" in off.err, off
    left = ctx_run("bootstrap", "--json", env=env)
    assert left.rc == 0 and "tool/tsh.config" not in left.json()["repaired"], left
    assert (controls / "status").read_text() == "disabled\n"

    (controls / "status").write_text("available\n")
    (controls / "schema").unlink()
    log_before = (controls / "log").read_bytes()
    entry = listed(env, "--tier", "system")["tsh.config"]
    assert entry["status"] == "damaged", entry
    assert any("tsh.config.d/schema" in problem for problem in entry["problems"]), entry
    assert ctx_run("object", "which", "tsh.config", env=env).out == f"{path}\n"
    damaged = refused(1, "ENOEXEC")
    assert "ctx bootstrap" in damaged.err, damaged

    repaired = ctx_run("bootstrap", "--json", env=env)
    assert repaired.rc == 0, repaired
    assert repaired.json()["repaired"] == ["tool/tsh.config"], repaired
    assert (controls / "schema").is_file()
    assert (controls / "status").read_text() == "available\n"
    assert (controls / "log").read_bytes().startswith(log_before)
    assert config.read_bytes() == tuned_config
    assert listed(env, "--tier", "system")["tsh.config"]["status"] == "available"
    back = ctx_run("tool", "tsh.config", "window_percent=4", env=env)
    assert back.rc == 0 and settings(back.out) == {**H4_DEFAULTS, "cache_capacity": "48",
                                                    "window_percent": "4"}, back  # fmt: skip
    last = read_jsonl(controls / "log")[-1]
    assert (last["mode"], last["argv"], last["status"]) == ("host", ["window_percent=4"], "ok")


def test_a_ctx_tool_call_refused_by_the_tools_controls_is_a_line_of_its_log(
    storage: Path, tmp_path: Path
) -> None:
    """T-7 ("Tool calls are logged to tool/<name>.d/log") as ``ctx man tool`` puts it ("Each
    call of a tool found on CTX_PATH, refused or not, adds one line to <tier>/<name>.d/log")
    and docs/tools.md for ``ctx tool`` ("the tool's controls hold here too: … one whose
    status is not available [is refused] (EACCES), and each call is a tool_result line of its
    log … mode host"): a host call refused because the administrator disabled tsh.config
    leaves its record, as a refused ``ctx run`` does."""
    env = human_env(storage, tmp_path / "home")
    controls = storage / "tool" / "tsh.config.d"
    (controls / "status").write_text("disabled\n")
    before = read_jsonl(controls / "log")

    refused = ctx_run("tool", "tsh.config", "cache_capacity=40", env=env)

    assert refused.rc == 1 and "EACCES" in refused.err, refused
    added = read_jsonl(controls / "log")[len(before) :]
    assert [(e["type"], e["status"], e["mode"], e["uid"]) for e in added] == [
        ("tool_result", "error", "host", os.getuid())
    ], added
    assert added[0]["argv"] == ["cache_capacity=40"], added
