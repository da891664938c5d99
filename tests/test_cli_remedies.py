"""A refusal of the command line says what to do next, in one line with its errno: the real
``ctx``, run in a fresh interpreter as a user would run it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.support.cli import ctx
from tests.support.storage import make_root
from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user


def _last_line(stderr: str) -> str:
    return stderr.splitlines()[-1]


def test_a_mistyped_command_is_answered_with_the_one_meant_at_every_level(tmp_path: Path) -> None:
    top = ctx(tmp_path / "root", "qeueu", "status")
    assert top.returncode == 2
    assert _last_line(top.stderr) == "ctx: EINVAL: No such command 'qeueu'. Did you mean 'queue'?"
    below = ctx(tmp_path / "root", "queue", "stauts")
    assert _last_line(below.stderr) == (
        "ctx: EINVAL: No such command 'stauts'. Did you mean 'status'?"
    )
    # A subcommand loaded only when it runs is among those suggested too.
    lazy = ctx(tmp_path / "root", "queue", "wrok")
    assert _last_line(lazy.stderr) == "ctx: EINVAL: No such command 'wrok'. Did you mean 'work'?"
    unlike = ctx(tmp_path / "root", "xyzzy")
    assert (unlike.returncode, _last_line(unlike.stderr)) == (
        2,
        "ctx: EINVAL: No such command 'xyzzy'.",
    )


def test_ctx_run_reports_a_missing_option_as_every_other_command_does(tmp_path: Path) -> None:
    """``ctx run`` parses with argparse, not click; its usage error reads the same all the same."""
    for prefix in ([], ["--storage", str(tmp_path / "root")]):
        missing = ctx(tmp_path / "root", *prefix, "run", "fs.stat")
        assert missing.returncode == 2
        assert missing.stderr == (
            "Usage: ctx run [OPTIONS] TOOL [ARGS]...\n"
            "Try 'ctx run --help' for help.\n\n"
            "ctx: EINVAL: Missing option '--agent'.\n"
        )
    clicks = ctx(tmp_path / "root", "queue", "work")  # a click command, for the form
    assert clicks.stderr.startswith("Usage: ctx queue work [OPTIONS]\nTry 'ctx queue work --help'")
    no_tool = ctx(tmp_path / "root", "run", "--agent", "coder")
    assert (no_tool.returncode, _last_line(no_tool.stderr)) == (
        2,
        "ctx: EINVAL: Missing argument 'TOOL'.",
    )
    no_value = ctx(tmp_path / "root", "run", "--agent")
    assert _last_line(no_value.stderr) == "ctx: EINVAL: Option '--agent' requires an argument."
    helped = ctx(tmp_path / "root", "run", "--help")
    assert helped.returncode == 0 and helped.stdout.startswith("Usage: ctx run [OPTIONS] TOOL")


def test_running_a_tool_as_an_agent_that_does_not_exist_says_how_to_make_one(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    assert ctx(root, "bootstrap").returncode == 0
    called = ctx(root, "run", "--agent", "coder", "fs.stat", "/")
    assert called.returncode == 126  # refused, in terminal mode (docs/tools.md)
    assert called.stderr == (
        f"ctx: ENOENT: there is no agent 'coder' ({root}/agent/coder does not exist); 'ctx agent "
        "list' lists the agents there are, and 'ctx agent create REQUEST.json' makes one (the "
        "request's form: 'ctx agent create --help')\n"
    )
    # A storage root that is not there is what to fix first, and is said alone.
    nowhere = ctx(tmp_path / "nowhere", "run", "--agent", "coder", "fs.stat", "/")
    assert nowhere.returncode == 126
    assert "ctx bootstrap" in nowhere.stderr and "agent create" not in nowhere.stderr


def test_which_before_bootstrap_says_the_root_has_no_tools_yet_and_how_to_install_them(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    default_path = {"CTX_PATH": "", "CTX_HOME": ""}
    before = ctx(root, "object", "which", "fs.stat", env=default_path)
    assert before.returncode == 1  # T-8a: none found
    assert _last_line(before.stderr).startswith("ctx: ENOENT: fs.stat is not on CTX_PATH (")
    assert _last_line(before.stderr).endswith(
        f"; the storage root {root} has no tools yet: 'ctx bootstrap --storage {root}' "
        "installs the core tools"
    )
    assert len(before.stderr.splitlines()) == 1
    # The remedy given is the one that works.
    assert ctx(tmp_path / "elsewhere", "bootstrap", "--storage", str(root)).returncode == 0
    after = ctx(root, "object", "which", "fs.stat", env=default_path)
    assert (after.returncode, after.stdout) == (0, f"{root}/tool/fs.stat\n"), after.stderr
    unknown = ctx(root, "object", "which", "fs.nosuch", env=default_path)
    assert unknown.returncode == 1
    assert _last_line(unknown.stderr).endswith("; 'ctx object list' lists the tools installed")


def test_finishing_or_renewing_a_job_the_queue_does_not_have_says_so_and_what_to_do(
    tmp_path: Path,
) -> None:
    root, queue = tmp_path / "root", str(tmp_path / "queue")
    assert ctx(root, "queue", "init", "--queue", queue).returncode == 0
    nowhere = (
        f"job nosuchjob.req.json is not claimed, nor pending, done or failed: queue {queue} has "
        "no such job (is it the queue the job was claimed from?); 'ctx queue list --queue "
        f"{queue}' lists the jobs it has"
    )
    finished = ctx(root, "queue", "finish", "--queue", queue, "--ok", "nosuchjob.req.json")
    assert (finished.returncode, finished.stderr) == (1, f"ctx: ENOENT: {nowhere}\n")
    renewed = ctx(root, "queue", "renew", "--queue", queue, "nosuchjob.req.json")
    assert (renewed.returncode, renewed.stderr) == (
        1,
        f"ctx: ENOENT: there is no lease to renew: {nowhere}\n",
    )
    # A job the queue has is said to be where it is, as before.
    request = '{"tool": "fs.stat", "input": {}}'
    job = ctx(root, "queue", "publish", "--queue", queue, "-", stdin=request).stdout.strip()
    pending = ctx(root, "queue", "finish", "--queue", queue, "--ok", job)
    assert pending.returncode == 1 and f"job {job} is pending, not claimed" in pending.stderr


def test_a_missing_mount_point_offers_a_user_who_is_not_root_a_directory_of_their_own(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    root = make_root(traversable_tmp)
    missing = traversable_tmp / "ctx"  # in a directory of root's, as /ctx is
    environment = {**os.environ, "CTX_STORAGE": str(root)}
    mount = [sys.executable, "-m", "cortexfs", "mount", "--as", "coder", str(missing)]
    refused = run_as(unprivileged_user, mount, env=environment)
    assert refused.returncode == 1
    assert refused.stderr == (
        f"ctx: ENOENT: the mount point {missing} does not exist; create an empty directory "
        f"there ('mkdir {missing}' as root: you may not create entries in {traversable_tmp}), "
        "or mount on a directory of your own: 'mkdir -p ~/ctx && ctx mount --as coder ~/ctx'\n"
    )
    # A storage root given on the command line is given again in the command to run.
    given = [sys.executable, "-m", "cortexfs", "--storage", str(root), "mount", str(missing)]
    refused = run_as(unprivileged_user, given, env=environment)
    assert refused.stderr.endswith(f"'mkdir -p ~/ctx && ctx mount --storage {root} ~/ctx'\n")
    # Root may make any mount point: told only to make it.
    as_root = ctx(root, "mount", "--as", "coder", str(missing))
    assert (as_root.returncode, as_root.stderr) == (
        1,
        f"ctx: ENOENT: the mount point {missing} does not exist; create an empty directory "
        f"there ('mkdir {missing}')\n",
    )


def test_every_command_that_meets_a_missing_agent_says_how_to_make_one(tmp_path: Path) -> None:
    """The remedy belongs to the refusal itself, not to one command that prints it."""
    root = tmp_path / "root"
    assert ctx(root, "bootstrap").returncode == 0

    native = ctx(root, "run", "--agent", "coder", "--native", "fs.stat", stdin='{"path": "/"}')
    explained = ctx(root, "policy", "explain", "coder", "tool:fs.stat", "execute")

    remedy = "'ctx agent create REQUEST.json' makes one"
    assert remedy in json.loads(native.stdout.splitlines()[-1])["error"]["message"]
    assert remedy in explained.stdout + explained.stderr


def test_listing_the_agents_of_a_directory_never_bootstrapped_says_to_bootstrap_it(
    tmp_path: Path,
) -> None:
    """An empty listing would read as "no agents yet" of a root that is no root at all."""
    plain = tmp_path / "plain"
    plain.mkdir()
    for extra in ([], ["--json"]):
        listed = ctx(plain, "agent", "list", "--storage", str(plain), *extra)
        assert (listed.returncode, _last_line(listed.stderr)) == (
            1,
            f"ctx: ENOENT: {plain} has no directory agent/: it is no storage root (or a damaged "
            f"one); run 'ctx bootstrap --storage {plain}'",
        )
    assert json.loads(listed.stdout)["error"] == "ENOENT"
    assert os.listdir(plain) == []


def test_policy_explain_suggests_commands_on_the_root_it_was_given(tmp_path: Path) -> None:
    """The reason a step gives is a refusal's text: what it suggests acts on the root asked
    about, in the table, the last line and the JSON alike."""
    root = tmp_path / "root"
    assert ctx(root, "bootstrap").returncode == 0
    asked = ["policy", "explain", "coder", "tool:fs.stat", "execute", "--storage", str(root)]
    elsewhere = {"CTX_STORAGE": str(tmp_path / "other")}
    text = ctx(root, *asked, env=elsewhere)
    suggestion = f"'ctx agent create REQUEST.json --storage {root}' makes one"
    assert text.returncode == 1
    assert suggestion in text.stdout.splitlines()[1]  # step 1's line of the table
    assert suggestion in text.stdout.splitlines()[-1]  # the deny line
    decision = json.loads(ctx(root, *asked, "--json", env=elsewhere).stdout)
    assert suggestion in decision["reason"] and suggestion in decision["steps"][0]["detail"]
    unnamed = ctx(root, *asked[:-2])  # no --storage given: none is added
    assert "'ctx agent create REQUEST.json' makes one" in unnamed.stdout


def test_two_storage_roots_on_one_command_line_are_a_usage_error(tmp_path: Path) -> None:
    """``ctx --storage A CMD --storage B``: taking either would act on a root the other word
    did not mean, so neither is taken; the same root given twice is one root."""
    first, second = tmp_path / "first", tmp_path / "second"
    for root in (first, second):
        assert ctx(root, "bootstrap").returncode == 0
    said = (
        f"ctx: EINVAL: two storage roots given: --storage '{first}' before the command and "
        f"--storage '{second}' after it; give one"
    )
    for words in (
        ["queue", "init", "--project", "p"],
        ["run", "--agent", "coder", "fs.stat", "/"],
        ["run", "--agent", "coder", "--native", "fs.stat"],
    ):
        at = words.index("--project") if "init" in words else 1
        both = [*words[:at], "--storage", str(second), *words[at:]]
        refused = ctx(first, "--storage", str(first), *both, stdin='{"path": "/"}')
        assert (refused.returncode, _last_line(refused.stderr)) == (2, said), words
    assert not (first / "shared" / "p").exists() and not (second / "shared" / "p").exists()
    again = ctx(
        first, "--storage", str(first), "queue", "init", "--storage", f"{first}/.", "-p", "p"
    )
    assert again.returncode == 0, again.stderr
    assert (first / "shared" / "p" / "queue").is_dir()


def test_a_queue_command_on_a_root_its_owner_may_not_list_names_the_root(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """R-1: the user's own root, with a project's queue, made 0300 (entered, never listed):
    the queue command names the root as what refuses, with the chmod that lifts it, whether
    the project is there or not — not the queue, whose mode is not at fault."""
    root = make_root(traversable_tmp)
    ctx(root, "queue", "init", "--project", "proj")
    for entry in (root, *root.rglob("*")):
        os.lchown(entry, unprivileged_user.uid, unprivileged_user.gid)
    root.chmod(0o300)
    environment = {**os.environ, "CTX_STORAGE": str(root)}
    for project in ("proj", "absent"):
        status = [sys.executable, "-m", "cortexfs", "queue", "status", "--project", project]
        refused = run_as(unprivileged_user, status, env=environment)
        assert refused.returncode == 1, refused
        assert refused.stderr.startswith("ctx: EACCES: "), refused
        assert f"may not read {root} (" in refused.stderr, refused.stderr
        assert "'chmod u+r' it" in refused.stderr, refused.stderr
        assert "No such file" not in refused.stderr, refused.stderr
