"""End-to-end flows of a new user who copies the documentation literally: the README's blocks,
docs/multi-host.md, docs/crash-model.md and the manual pages ``ctx man`` prints (SPEC §1, §8,
§12, §14).  Each printed command is typed as printed (through ``bash`` where the page shows a
shell snippet, through the agent's tsh where the page tells an agent what to type), on a
fresh storage root in a scratch directory standing for the default one, and held to the
output, exit status and files the page promises.

Black-box: the installed ``ctx``, bash, strace, bubblewrap and PTYs; nothing of the product is
imported."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    ROOT_ENTRIES,
    clean_env,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    wait_for,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, Raw
from tests.support.storage import copy_of_root
from tests.support.strace import trace_lines
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
VENV_BIN = Path(CTX_ARGV[0]).parent
NOBODY = 65534

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="the pages' agents run as nobody, which only root can make"
)
needs_strace = pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
needs_terminal = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs root, bubblewrap and /dev/fuse",
)


# ---------------------------------------------------------------------------------- helpers


@dataclass
class Desk:
    """A scratch directory every uid may search, holding a bootstrapped storage root
    (``storage``) that stands for the default root of the pages' examples."""

    top: Path
    storage: Path

    @property
    def env(self) -> dict[str, str]:
        return clean_env(
            CTX_STORAGE=str(self.storage),
            PATH=f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        )

    def ctx(self, *args, **kw):
        kw.setdefault("env", self.env)
        return ctx_run(*args, **kw)

    def sh(self, script: str, cwd: Path | None = None, **extra: str):
        """``script`` run by ``bash -e`` as a reader pastes it, with ``ctx`` on PATH."""
        return subprocess.run(
            ["bash", "-e", "-c", script], cwd=cwd or self.top, env={**self.env, **extra},
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip


@pytest.fixture
def desk(_template: Path) -> Iterator[Desk]:
    top = new_scratch_dir(SCRATCH, "d")
    try:
        yield Desk(top, copy_of_root(_template, top / "storage"))
    finally:
        shutil.rmtree(top, ignore_errors=True)


def rules_of(policy: Path) -> list[str]:
    return [
        line.strip()
        for line in policy.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def create(desk: Desk, request: dict, *options: str):
    made = desk.ctx("agent", "create", "-", *options, input=json.dumps(request))
    assert made.rc == 0, made
    return made


def upper_manifest(desk: Desk) -> Path:
    """The text.upper manifest of ``ctx man tool``, with its program, in the desk."""
    program = desk.top / "mf" / "bin" / "text-upper"
    program.parent.mkdir(parents=True, exist_ok=True)
    program.write_text("#!/bin/sh\ntr a-z A-Z\n")
    program.chmod(0o755)
    manifest = desk.top / "mf" / "text.upper.json"
    manifest.write_text(
        json.dumps(
            {
                "manifest": 2,
                "kind": "tool",
                "name": "text.upper",
                "description": "Upper-cases the text it is given.",
                "schema": {
                    "type": "object",
                    "properties": {"text": {"type": "string"}},
                    "required": ["text"],
                    "additionalProperties": False,
                },
                "cap": {"side_effects": False, "network": False},
                "exec": "bin/text-upper",
            }
        )
    )
    return manifest


# ------------------------------------------------------------- ctx.model and ctx.provider


@needs_root
def test_the_model_pages_shell_example_runs_as_printed_and_explain_prints_its_lines(
    desk: Desk,
) -> None:
    """R-3, P-3, P-4, P-5 (steps 2, 5, 6), D-1: the agent request of ``ctx man model`` writes
    the ``model`` control and one ``use`` rule; its shell snippet, pasted into bash, makes a
    model that ``ctx policy explain`` allows with the very step 5 and 6 lines the page
    prints; without the model's policy step 6 says what the page says (exit 1); ``model:openai``
    is EINVAL (exit 2); a missing entry denies at step 2 with ENOENT; a model policy others
    may write denies at step 6; the provider page's rules are invalid line by line; no model
    call leaves a ``.d/log``."""
    assert sorted(os.listdir(desk.storage / "model")) == []  # bootstrap: an empty model/
    create(desk, {"name": "coder", "label": "coder_t", "model": ["openai/gpt-5.6"],
                  "tools": ["fs.read"]})  # fmt: skip
    controls = desk.storage / "agent" / "coder.d"
    assert (controls / "model").read_text() == "openai/gpt-5.6\n"
    assert rules_of(controls / "policy") == [
        "allow coder_t tool:fs.read execute",
        "allow coder_t model:openai/gpt-5.6 use",
        "allow coder_t mount:ctx read",
    ]

    snippet = """
R=$CTX_STORAGE
mkdir -p "$R/model/openai/gpt-5.6.d"
touch "$R/model/openai/gpt-5.6" && chmod 0644 "$R/model/openai/gpt-5.6"
echo 'allow coder_t model:openai/gpt-5.6 use' > "$R/model/openai/gpt-5.6.d/policy"
ctx policy explain coder model:openai/gpt-5.6 use
"""
    pasted = desk.sh(snippet)
    assert pasted.returncode == 0 and pasted.stderr == "", pasted
    lines = pasted.stdout.splitlines()
    # the three lines the page prints, as printed
    assert lines[-3:] == [
        "  5 object policy      pass         agent/coder.d/policy: allow coder_t "
        "model:openai/gpt-5.6 use; its mount 'ctx' is granted",
        "  6 tool/model policy  pass         model/openai/gpt-5.6.d/policy: allow coder_t "
        "model:openai/gpt-5.6 use",
        "allow",
    ], pasted.stdout
    assert [line.split()[0] for line in lines[1:7]] == ["1", "2", "3", "4", "5", "6"]

    model_policy = desk.storage / "model" / "openai" / "gpt-5.6.d" / "policy"
    model_policy.chmod(0o646)  # a policy the agent could rewrite
    loose = desk.ctx("policy", "explain", "coder", "model:openai/gpt-5.6", "use", "--json")
    assert (loose.rc, loose.json()["step"], loose.json()["errno"]) == (1, 6, "EACCES"), loose
    model_policy.unlink()
    missing = desk.ctx("policy", "explain", "coder", "model:openai/gpt-5.6", "use")
    assert missing.rc == 1, missing
    step6 = [line for line in missing.out.splitlines() if line.startswith("  6 ")]
    assert step6 and step6[0].endswith(
        "no policy, so nothing is allowed (model/openai/gpt-5.6.d/policy is missing)"
    ), missing.out

    malformed = desk.ctx("policy", "explain", "coder", "model:openai", "use")
    assert malformed.rc == 2 and malformed.err.startswith("ctx: EINVAL: "), malformed
    absent = desk.ctx("policy", "explain", "coder", "model:local/llama-3.1-8b", "use", "--json")
    assert absent.rc == 1, absent
    assert (absent.json()["step"], absent.json()["errno"]) == (2, "ENOENT"), absent.json()

    # ctx.provider and the names table of ctx.model, as policy lines
    rules = desk.top / "provider.policy"
    rules.write_text(
        "allow coder_t model:openai use\n"
        "allow coder_t model:openai/* use\n"
        "allow coder_t model:openai/gpt/5 use\n"
        "allow coder_t model:openai/gpt-5.6 use\n"
        "allow coder_t model:local/llama-3.1-8b use\n"
    )
    checked = desk.ctx("policy", "check", rules)
    assert checked.rc == 1, checked
    assert [line.split(": ")[0:2] for line in checked.err.splitlines()] == [
        [f"{rules}:{n}", "EINVAL"] for n in (1, 2, 3)
    ], checked.err
    assert not list((desk.storage / "model").rglob("log"))  # no model call, no model log


# ------------------------------------------------------------------------------ ctx.coreutils


@needs_root
def test_the_coreutils_pages_commands_print_what_the_page_shows(desk: Desk) -> None:
    """P-6, T-3, D-1 (ctx.coreutils): a fresh install allows nobody; the page's ``for`` loop,
    pasted into bash, grants fs.read, fs.list and fs.stat; then each printed call does what the
    page says — the main parameter as the one argument, ``length`` 100, ``'{}'`` for a call
    without parameters listing ``/`` after a directory and ``@`` after a link, ``key: value``
    lines of fs.stat — and the two sample refusals print exactly the page's lines; fs.write,
    outside the loop, is refused (126) until granted, then writes the redirected draft."""
    ws = desk.top / "ws"
    ws.mkdir()
    (ws / "README.md").write_text("".join(f"line {n:03d} of the workspace readme\n"
                                          for n in range(40)))  # fmt: skip
    (ws / "sub").mkdir()
    (ws / "link").symlink_to("README.md")
    os.chown(ws, NOBODY, NOBODY)
    create(desk, {"name": "coder", "label": "coder_t",
                  "tools": ["fs.read", "fs.list", "fs.stat", "fs.write"],
                  "mount": [[str(ws), "/workspace", "rw"]]})  # fmt: skip

    before = desk.ctx("run", "--agent", "coder", "fs.read", "README.md")
    assert before.rc == 126 and "step 6" in before.err, before  # "A fresh install allows nobody"
    loop = """
for t in fs.read fs.list fs.stat; do
  echo "allow coder_t tool:$t execute" >> "$CTX_STORAGE/tool/$t.d/policy"
done
"""
    assert desk.sh(loop).returncode == 0
    for tool in ("fs.read", "fs.list", "fs.stat"):
        assert f"allow coder_t tool:{tool} execute" in rules_of(
            desk.storage / "tool" / f"{tool}.d" / "policy"
        )

    readme = (ws / "README.md").read_text()
    whole = desk.ctx("run", "--agent", "coder", "fs.read", "README.md")
    assert (whole.rc, whole.out, whole.err) == (0, readme, ""), whole
    head = desk.ctx("run", "--agent", "coder", "fs.read", '{"path": "README.md", "length": 100}')
    assert (head.rc, head.out) == (0, readme[:100]), head
    listing = desk.ctx("run", "--agent", "coder", "fs.list", "{}")
    assert (listing.rc, listing.out) == (0, "README.md\nlink@\nsub/\n"), listing
    stat_lines = desk.ctx("run", "--agent", "coder", "fs.stat", "README.md")
    assert stat_lines.rc == 0, stat_lines
    fields = dict(line.split(": ", 1) for line in stat_lines.out.splitlines())
    assert list(fields) == ["path", "type", "size", "mode", "uid", "gid", "mtime"], fields
    assert (fields["path"], fields["type"], fields["size"]) == (
        "/workspace/README.md",
        "file",
        str(len(readme)),
    )
    assert re.fullmatch(r"0[0-7]{3}", fields["mode"]) and fields["mtime"].endswith("Z"), fields

    # the page's two sample sessions, line for line
    dotdot = desk.ctx("run", "--agent", "coder", "fs.read", "../etc/passwd")
    assert dotdot.err == "fs.read: EINVAL: '../etc/passwd': '..' is not allowed in a path\n"
    assert dotdot.rc in (1, 2) and dotdot.out == "", dotdot
    link = desk.ctx("run", "--agent", "coder", "fs.read", "link")
    assert link.err == "fs.read: ELOOP: /workspace/link is a symbolic link; never followed\n"
    assert link.rc == 1 and link.out == "", link

    draft = "a draft, written by redirection\n"
    refused = desk.ctx("run", "--agent", "coder", "fs.write", "notes.txt", input=draft)
    assert refused.rc == 126 and not (ws / "notes.txt").exists(), refused
    with open(desk.storage / "tool" / "fs.write.d" / "policy", "a") as policy:
        policy.write("allow coder_t tool:fs.write execute\n")
    (desk.top / "draft.txt").write_text(draft)
    wrote = desk.sh("ctx run --agent coder fs.write notes.txt < draft.txt")
    assert wrote.returncode == 0, wrote
    assert wrote.stdout == f"wrote {len(draft)} bytes to /workspace/notes.txt\n", wrote
    assert (ws / "notes.txt").read_text() == draft
    assert stat.S_IMODE((ws / "notes.txt").stat().st_mode) & 0o7133 == 0  # 0644 less a umask


# ---------------------------------------------------------------- ctx.agent and ctx.root-abi


@needs_root
def test_the_agent_pages_request_for_a_named_user_is_what_show_and_the_root_choice_find(
    desk: Desk, unprivileged_user: UnprivilegedUser
) -> None:
    """A-3, P-6, P-7, R-1, R-3, S-3, D-1 (ctx.agent, ctx.root-abi): the page's request, saved
    to a file and given with ``--user``, prints the page's line (uid and gid of that user),
    warns of its missing mount source, and writes exactly one rule per grant, the mount table
    with the root at ``/ctx``, controls of 0644 (log 0640) whose log starts with
    ``agent.created``; ``ctx agent show`` derives the CTX_PATH with the space it may read and
    ``/workspace``; the subcommand's ``--storage`` wins over ``ctx --storage``; a missing root
    is ENOENT with the page's sentence for each command it names; the object-names table
    holds."""
    uid, gid = unprivileged_user.uid, unprivileged_user.gid
    source = desk.top / "srv" / "project-a"  # the page's /srv/project-a, absent as there
    request = {"name": "reviewer", "label": "reviewer_t",
               "model": ["openai/gpt-5.6"],
               "tools": ["fs.read", "fs.list"],
               "shared": {"project-a": ["read"]},
               "mount": [[str(source), "/workspace", "ro"]]}  # fmt: skip
    (desk.top / "reviewer.json").write_text(json.dumps(request))
    made = desk.ctx(
        "agent", "create", "reviewer.json", "--user", unprivileged_user.name, cwd=desk.top
    )
    assert made.rc == 0, made
    entry = desk.storage / "agent" / "reviewer"
    assert made.out == f"created agent reviewer: {entry} (uid {uid}, gid {gid})\n", made
    warnings = [line for line in made.err.splitlines() if line.startswith("ctx: warning: ")]
    # The page's space and mount source are both yet to be made: each is said.
    assert len(warnings) == 2, made.err
    assert "shared:project-a names no shared space yet" in warnings[0], made.err
    assert str(source) in warnings[1], made.err

    controls = desk.storage / "agent" / "reviewer.d"
    assert sorted(rules_of(controls / "policy")) == sorted(
        [
            "allow reviewer_t tool:fs.read execute",
            "allow reviewer_t tool:fs.list execute",
            "allow reviewer_t model:openai/gpt-5.6 use",
            "allow reviewer_t shared:project-a read",
            "allow reviewer_t mount:workspace read",
            "allow reviewer_t mount:ctx read",
        ]
    )
    assert json.loads((controls / "mount").read_text()) == [
        [str(source), "/workspace", "ro"],
        [str(desk.storage), "/ctx", "ro"],
    ]
    assert json.loads((controls / "identity").read_text())["uid"] == uid
    assert (controls / "label").read_text() == "reviewer_t\n"
    for control in ("label", "policy", "identity", "mount", "model", "system.md",
                    "prompt.template.md", "log"):  # fmt: skip
        info = (controls / control).stat()
        wanted = 0o640 if control == "log" else 0o644
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (wanted, 0), control
    assert read_jsonl(controls / "log")[0]["type"] == "agent.created"

    shown = desk.ctx("agent", "show", "reviewer")
    assert shown.rc == 0, shown
    facts = dict(line.split(": ", 1) for line in shown.out.splitlines() if ": " in line)
    assert facts["ctx_path"] == f"/ctx/tool:/ctx/home/{uid}/tool:/ctx/shared/project-a/tool"
    assert (facts["label"], facts["cwd"]) == ("reviewer_t", "/workspace"), shown.out

    # ctx.root-abi, "Choosing the storage root": --storage given to ctx and to the subcommand
    # must name one root; two are a usage error that acts on neither
    nowhere = desk.top / "no-root"
    bare = clean_env()
    both = ctx_run("--storage", nowhere, "agent", "show", "reviewer", "--storage", desk.storage,
                   env=bare)  # fmt: skip
    assert (both.rc, both.out) == (2, ""), both
    assert "ctx: EINVAL: two storage roots given" in both.err, both
    same = ctx_run("--storage", desk.storage, "agent", "show", "reviewer", "--storage",
                   desk.storage, env=bare)  # fmt: skip
    assert (same.rc, same.out) == (0, shown.out), same
    sentence = (
        f"ctx: ENOENT: storage root {nowhere} does not exist; create it with 'ctx bootstrap "
        f"--storage {nowhere}'"
    )
    for argv in (
        ("--storage", nowhere, "agent", "show", "reviewer"),
        ("agent", "create", "--storage", nowhere, desk.top / "reviewer.json"),
        ("policy", "explain", "--storage", nowhere, "reviewer", "tool:fs.read", "execute"),
        ("object", "install", "--tier", "system", "--storage", nowhere,
         upper_manifest(desk)),
    ):  # fmt: skip
        missing = ctx_run(*argv, env=bare)
        assert missing.rc == 1 and sentence in missing.err.splitlines(), missing
    assert not nowhere.exists()

    # ctx.root-abi, "Object names"
    for name in (".hidden", "notes.d", "a/b"):
        refused = desk.ctx("agent", "create", "-", input=json.dumps({"name": name,
                                                                     "label": "x_t"}))  # fmt: skip
        assert refused.rc == 1 and "EINVAL" in refused.err, (name, refused)
    create(desk, {"name": "review-1", "label": "review-1_t"})
    assert sorted(n for n in os.listdir(desk.storage / "agent") if n[0] != ".") == [
        "review-1", "review-1.d", "reviewer", "reviewer.d",
    ]  # fmt: skip
    assert set(os.listdir(desk.storage)) == ROOT_ENTRIES


def test_every_problem_of_an_agent_request_is_listed_one_per_line(desk: Desk) -> None:
    """A-3, D-1 (ctx.agent, "The request": "every problem is listed on standard error, one per
    line, as ``ctx: EINVAL: REQUEST: <reason>``"): a request with a mount source holding
    ``..`` and a mount target below ``/ctx`` names both, and creates nothing."""
    request = {"name": "kid", "label": "kid_t",
               "mount": [["/srv/a", "/ctx/a", "ro"], ["/srv/b/../c", "/data", "ro"]]}  # fmt: skip
    (desk.top / "kid.json").write_text(json.dumps(request))
    refused = desk.ctx("agent", "create", desk.top / "kid.json")
    assert refused.rc == 1, refused
    lines = refused.err.splitlines()
    assert all(line.startswith(f"ctx: EINVAL: {desk.top / 'kid.json'}: ") for line in lines)
    assert not (desk.storage / "agent" / "kid").exists()
    assert any("'..'" in line for line in lines), lines
    assert any("/ctx/a" in line for line in lines), lines


def test_a_file_named_model_is_a_problem_left_alone_while_the_rest_is_repaired(
    desk: Desk,
) -> None:
    """R-2, R-5 (ctx.root-abi, "ctx bootstrap"): with the page's own example of something in
    the way — a file named ``model`` at the root — bootstrap prints a ``problem`` line naming
    it, ends with one ``ctx: E…`` line, exits 1 and still makes what it can (a removed core
    tool, ``bin/ctxterm``, a removed page); once the file is moved aside a run makes
    ``model/`` (exit 0, ``--json`` naming it in ``created``) and the next says the root is
    complete."""
    root = desk.storage
    (root / "model").rmdir()
    (root / "model").write_text("not a directory\n")
    (root / "tool" / "fs.list").unlink()
    (root / "bin" / "ctxterm").unlink()
    page = root / "shared" / "cortexfs-docs" / "man" / "ctx.model.md"
    page.unlink()

    first = desk.ctx("bootstrap")
    assert first.rc == 1, first
    problems = [line for line in first.out.splitlines() if line.startswith("problem ")]
    assert len(problems) == 1 and problems[0].split()[1].rstrip(":") == "model", first.out
    errors = first.err.splitlines()
    assert len(errors) == 1 and re.match(r"ctx: E[A-Z]+: ", errors[0]), first.err
    assert (root / "model").read_text() == "not a directory\n"  # left alone
    assert os.access(root / "tool" / "fs.list", os.X_OK)
    assert (root / "bin" / "ctxterm").is_file() and page.is_file()
    assert stat.S_IMODE(page.stat().st_mode) == 0o444

    (root / "model").rename(desk.top / "model.aside")
    fixed = desk.ctx("bootstrap", "--json")
    assert fixed.rc == 0, fixed
    report = fixed.json()
    assert set(report) == {"root", "created", "repaired", "problems", "warnings"}, report
    assert (report["root"], report["created"], report["problems"]) == (str(root), ["model"], [])
    assert (root / "model").is_dir() and stat.S_IMODE((root / "model").stat().st_mode) == 0o755
    complete = desk.ctx("bootstrap")
    assert complete.rc == 0, complete
    assert complete.out.splitlines()[-1] == "nothing to do: the storage root is complete"
    assert set(os.listdir(root)) == ROOT_ENTRIES


def test_bootstrap_names_a_file_in_the_way_of_a_root_entry_enotdir(desk: Desk) -> None:
    """R-5, D-1 (ctx.root-abi: "the first problem's errno: … ``ENOTDIR`` for a file where one
    of the six root directories belongs", whose example is "a file named ``model`` at the
    root"): the last line of bootstrap with a file at ``model`` is ``ctx: ENOTDIR: …``."""
    (desk.storage / "model").rmdir()
    (desk.storage / "model").write_text("in the way\n")
    entry = desk.ctx("bootstrap")
    assert entry.rc == 1, entry
    assert entry.err.startswith("ctx: ENOTDIR: "), entry


# ------------------------------------------------- the README's queue, multi-host, crash model

README_QUEUE = """
ctx queue init    --project build
ctx queue publish --project build request.json > "$OUT/published"
J=$(ctx queue claim --project build)
echo "$J $$" > "$OUT/claimed"
until [ -e "$OUT/go" ]; do sleep 0.02; done
ctx queue finish  --project build "$J" --ok result.json > "$OUT/finished"
ctx queue recover --project build > "$OUT/recovered"
rc=0; ctx queue claim --project build > "$OUT/empty" || rc=$?
echo "$rc" > "$OUT/empty.rc"
"""


def traced(desk: Desk, calls: str, *args: str) -> tuple[object, list[str]]:
    """``ctx ARGS`` under ``strace -f -e trace=CALLS``: the run and the calls it made."""
    log = desk.top / "strace.log"
    run = subprocess.run(
        ["strace", "-f", "-qq", "-e", f"trace={calls}", "-o", str(log), *CTX_ARGV, *args],
        env=desk.env, capture_output=True, text=True, timeout=60, cwd=desk.top, check=False,
    )  # fmt: skip
    made = [line for line in trace_lines(log) if "(" in line and "exited" not in line]
    return run, [re.sub(r"^\d+\s+", "", line) for line in made]


def set_move(queue: Path, strategy: str) -> None:
    """``move=STRATEGY`` as the one ``move`` line of ``queue/config``."""
    lines = (queue / "config").read_text().splitlines()
    kept = [line for line in lines if not line.startswith("move=")]
    (queue / "config").write_text("\n".join([*kept, f"move={strategy}"]) + "\n")


@needs_strace
def test_the_readme_queue_block_leases_to_the_shell_and_moves_as_the_host_pages_say(
    desk: Desk,
) -> None:
    """Q-1..Q-5, Q-7, N-1 (README "The queue in five commands", docs/multi-host.md,
    docs/crash-model.md §8): the README's five commands with its request run in bash: publish
    prints J alone, the claim's lease names the shell by the fields multi-host.md shows
    (host, machine-id, boot id, pid namespace, pid), recover leaves the live shell's job, the
    finish moves it to done, the last claim exits 3; a finish is 8 fsyncs and, with
    ``move=link`` in ``queue/config``, publish, claim and finish move by link, never by
    rename."""
    out = desk.top / "out"
    out.mkdir()
    readme_request = {"tool": "fs.stat", "input": {"path": "/"}}
    (desk.top / "request.json").write_text(json.dumps(readme_request))
    (desk.top / "result.json").write_text('{"size": 4096}\n')
    env = {**desk.env, "OUT": str(out)}
    script = subprocess.Popen(
        ["bash", "-e", "-c", README_QUEUE], cwd=desk.top, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert wait_for(lambda: (out / "claimed").exists(), 30), script.stderr
        job, holder = (out / "claimed").read_text().split()
        assert (out / "published").read_text() == f"{job}\n"
        assert job.endswith(".req.json") and int(holder) == script.pid
        queue = desk.storage / "shared" / "build" / "queue"
        lease = json.loads((queue / "lease" / job / "worker").read_text())
        documented = {"job", "worker", "host", "machine_id", "boot_id", "pid_ns", "pid",
                      "create_time", "claimed_at", "expires_at"}  # fmt: skip
        assert documented <= set(lease), lease
        host = os.uname().nodename
        assert (lease["job"], lease["host"], lease["pid"]) == (job, host, script.pid), lease
        assert lease["worker"] == f"{host}:{script.pid}", lease
        assert lease["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        assert lease["pid_ns"] == os.stat(f"/proc/{script.pid}/ns/pid").st_ino, lease
        if Path("/etc/machine-id").is_file():
            assert lease["machine_id"] == Path("/etc/machine-id").read_text().strip(), lease
        stored = json.loads((queue / "claimed" / job / job).read_text())
        assert {key: stored[key] for key in readme_request} == readme_request, stored
        kept = desk.ctx("queue", "recover", "--project", "build", "--reconcile")
        assert kept.rc == 0 and (queue / "lease" / job / "worker").exists(), kept
        (out / "go").touch()
        _, err = script.communicate(timeout=60)
    finally:
        if script.poll() is None:
            script.kill()
            script.communicate()
    assert script.returncode == 0, err
    assert (out / "finished").read_text() == f"{job}\n"
    assert json.loads((queue / "done" / f"{job}.result").read_text())["output"] == {"size": 4096}
    assert (queue / "done" / job).is_file() and os.listdir(queue / "claimed") == []
    assert (out / "empty.rc").read_text() == "3\n" and (out / "empty").read_text() == ""

    # crash-model.md §8: "a finish costs two fsyncs more (6 -> 8)", moving by rename
    set_move(queue, "rename")
    published = desk.ctx("queue", "publish", "--project", "build", desk.top / "request.json")
    again = desk.ctx("queue", "claim", "--project", "build", "--pid", str(os.getpid()))
    assert published.rc == 0 and again.out == published.out, again
    finish = ("queue", "finish", "--project", "build", again.out.strip(), "--ok",
              str(desk.top / "result.json"))  # fmt: skip
    run, syncs = traced(desk, "fsync,fdatasync,syncfs", *finish)
    assert run.returncode == 0, run
    assert len(syncs) == 8 and all(call.startswith("fsync(") for call in syncs), syncs

    # multi-host.md: "Set move=link in queue/config to force it."
    set_move(queue, "link")
    moves = "rename,renameat,renameat2,link,linkat"
    ran, published_moves = traced(desk, moves, "queue", "publish", "--project", "build",
                                  str(desk.top / "request.json"))  # fmt: skip
    linked = ran.stdout.strip()
    ran, claim_moves = traced(desk, moves, "queue", "claim", "--project", "build", "--pid",
                              str(os.getpid()))  # fmt: skip
    assert ran.stdout.strip() == linked, ran
    ran, finish_moves = traced(desk, moves, "queue", "finish", "--project", "build", linked,
                               "--error", str(desk.top / "result.json"))  # fmt: skip
    assert ran.returncode == 0, ran
    for moved in (published_moves, claim_moves, finish_moves):
        assert moved and all(call.startswith("linkat(") for call in moved), moved
    assert (queue / "failed" / linked).is_file() and os.listdir(queue / "inbox") == []


# ------------------------------------------------------------- the README's tools block

README_TOOLS = """
mkdir -p ~/ctx-first && cd ~/ctx-first
mkdir -p workspace
mkdir -p mcp
cat > mcp/mcp.json <<EOF
{"mcpServers": {"time": {"command": "$(command -v mcp-server-time)"}}}
EOF
cat > request.json <<EOF
{"name": "coder", "label": "coder_t", "tools": ["fs.stat"],
 "mount": [["$PWD/workspace", "/workspace", "rw"], ["$PWD/mcp", "/mcp", "ro"]]}
EOF
ctx agent create request.json
echo "allow coder_t tool:fs.stat execute" >> "$(ctx object which fs.stat).d/policy"
ctx run --agent coder fs.stat /workspace
"""


@needs_root
def test_the_readme_tools_block_as_root_needs_a_home_the_agents_uid_may_search(
    desk: Desk,
) -> None:
    """A-3, P-5 step 2, P-6, T-8a (README "Tools, agents and MCP servers"): pasted as root
    into bash with a home of mode 0700 (Debian's ``/root``), the block creates coder (as
    nobody, said so), ``ctx object which`` leads the rule into the tool's own policy and the
    chain allows the call, but the kernel refuses nobody the workspace below the closed home
    (``fs.stat: EACCES``, exit 1); once others may search the home the same call answers."""
    home = desk.top / "roothome"
    home.mkdir(mode=0o700)
    pasted = desk.sh(README_TOOLS, cwd=home, HOME=str(home))
    assert pasted.returncode == 1, pasted
    entry = desk.storage / "agent" / "coder"
    assert pasted.stdout.startswith(f"created agent coder: {entry} (uid {NOBODY}, gid "), pasted
    assert "it runs as user nobody" in pasted.stdout, pasted.stdout
    assert pasted.stderr.splitlines()[-1] == "fs.stat: EACCES: /workspace: Permission denied"
    policy = desk.storage / "tool" / "fs.stat.d" / "policy"
    assert "allow coder_t tool:fs.stat execute" in rules_of(policy)
    explained = desk.ctx("policy", "explain", "coder", "tool:fs.stat", "execute")
    assert explained.rc == 0 and explained.out.splitlines()[-1] == "allow", explained

    home.chmod(0o711)
    answered = desk.ctx("run", "--agent", "coder", "fs.stat", "/workspace", cwd=home)
    assert answered.rc == 0, answered
    fields = dict(line.split(": ", 1) for line in answered.out.splitlines())
    assert (fields["path"], fields["type"]) == ("/workspace", "directory"), fields


# ------------------------------------------------------- what ctx.agent tells an agent to type

UPDATE_LINE = (
    """agent.update '{"control": "system.md", "content": "Answer in one paragraph.\\n"}'"""
)
# ctx.agent's agent.create example, one line as tsh reads it, its mount named as the caller
# sees it.
CREATE_LINE = (
    """agent.create '{"name": "helper", "label": "helper_t", "tools": ["fs.read"], """
    """"mount": [["/workspace/sub", "/data", "ro"]]}'"""
)


@needs_terminal
def test_a_terminal_started_by_the_agents_entry_takes_what_the_agent_page_says_to_type(
    desk: Desk,
) -> None:
    """A-1, A-2, A-4, A-5, H-1, H-4, D-1 (ctx.agent "The agent terminal", "agent.update",
    "agent.create"; ctx.coreutils): running the entry ``agent/coder`` starts its terminal as
    ``ctx agent start`` does; typed in tsh, the page's agent.update line replaces system.md,
    the agent.create example as printed on two lines creates nothing, on one line makes the
    helper (its mount recorded as the host path behind the caller's ``/workspace/sub``),
    ``tsh.config`` shows the settings, ``which`` names ``/ctx/tool``, the manual reads under
    ``/ctx/shared/cortexfs-docs``; ``ctx agent stop --json`` gives agent, session and pid."""
    ws = desk.top / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "data.txt").write_text("for the helper\n")
    os.chown(ws, NOBODY, NOBODY)
    tools = ["agent.update", "agent.create", "tsh.config", "fs.read"]
    create(desk, {"name": "coder", "label": "coder_t", "tools": tools,
                  "mount": [[str(ws), "/workspace", "rw"]]})  # fmt: skip
    for tool in tools:
        with open(desk.storage / "tool" / f"{tool}.d" / "policy", "a") as policy:
            policy.write(f"allow coder_t tool:{tool} execute\n")
    with open(desk.storage / "agent" / "coder.d" / "policy", "a") as policy:
        policy.write("allow coder_t agent:helper create\n")

    started = subprocess.run(
        [desk.storage / "agent" / "coder", "--session", "doc", "--json"],
        cwd=ws, env=desk.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert started.returncode == 0, started
    typist = None
    try:
        typist = Raw(Path(json.loads(started.stdout)["listening_at"]), b"attach\n")
        assert typist.shows(AGENT_PROMPT), typist.text()
        said = typist.answer(UPDATE_LINE)
        assert said.strip() == "system.md of agent coder updated", said
        controls = desk.storage / "agent" / "coder.d"
        assert (controls / "system.md").read_text() == "Answer in one paragraph.\n"

        assert CREATE_LINE in (desk.storage / "shared/cortexfs-docs/man/ctx.agent.md").read_text()
        made = typist.answer(CREATE_LINE)
        assert made.strip() == "created agent helper", made
        assert json.loads((desk.storage / "agent" / "helper.d" / "mount").read_text())[0] == [
            str(ws / "sub"), "/data", "ro",
        ]  # fmt: skip

        shown = typist.answer("tsh.config").replace("\r", "")
        assert shown.splitlines() == [
            "max_loaded_tools=64", "cache_capacity=32", "window_percent=1",
        ], shown  # fmt: skip
        assert typist.answer("which fs.read").strip() == "/ctx/tool/fs.read"
        page = typist.answer("fs.read /ctx/shared/cortexfs-docs/man/ctx.tool.md")
        assert page.startswith("# ctx.tool — tools as files"), page[:200]
    finally:
        if typist is not None:
            typist.close()
        stopped = desk.ctx("agent", "stop", "coder", "--session", "doc", "--json")
    assert stopped.rc == 0, stopped
    facts = stopped.json()
    assert {"agent", "session", "pid"} <= set(facts), facts
    assert (facts["agent"], facts["session"]) == ("coder", "doc"), facts
    assert wait_for(lambda: not os.path.exists(f"/proc/{facts['pid']}"), 15), facts
    session = desk.storage / "home" / str(NOBODY) / "agent" / "coder" / "session" / "doc"
    calls = [e["object"] for e in read_jsonl(session / "events.jsonl") if e["type"] == "tool_call"]
    # one agent.create call: the page's line
    assert calls == [f"tool/{name}" for name in
                     ("agent.update", "agent.create", "tsh.config", "fs.read")], calls  # fmt: skip


@needs_terminal
def test_a_child_may_not_mount_the_workspace_granted_for_one_terminal(desk: Desk) -> None:
    """A-1, A-4, D-1 (ctx.agent "Making a child": the workspace ``ctx agent start`` adds for
    one terminal is not one of the caller's mounts for agent.create, since a child's mounts
    last): in a terminal started in a directory, the caller's fs.read reads
    ``/workspace/sub``, and the page's agent.create line with that source is refused
    (EACCES naming the mount), nothing created."""
    ws = desk.top / "ws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "data.txt").write_text("for the helper\n")
    os.chown(ws, NOBODY, NOBODY)
    tools = ["agent.create", "fs.read"]
    create(desk, {"name": "coder", "label": "coder_t", "tools": tools})
    for tool in tools:
        with open(desk.storage / "tool" / f"{tool}.d" / "policy", "a") as policy:
            policy.write(f"allow coder_t tool:{tool} execute\n")
    with open(desk.storage / "agent" / "coder.d" / "policy", "a") as policy:
        policy.write("allow coder_t agent:helper create\n")
    started = desk.ctx("agent", "start", "coder", "--session", "ws", "--json", cwd=ws)
    assert started.rc == 0, started
    typist = None
    try:
        typist = Raw(Path(started.json()["listening_at"]), b"attach\n")
        assert typist.shows(AGENT_PROMPT), typist.text()
        seen = typist.answer("fs.read /workspace/sub/data.txt")
        assert seen.replace("\r", "") == "for the helper\n", seen
        refused = typist.answer(CREATE_LINE).replace("\r", "").strip()
        assert refused == (
            "agent.create: EACCES: agent.create attenuates (A-4): coder does not hold the "
            "mount at /data (ro)"
        ), refused
        assert not (desk.storage / "agent" / "helper").exists()
    finally:
        if typist is not None:
            typist.close()
        desk.ctx("agent", "stop", "coder", "--session", "ws")
