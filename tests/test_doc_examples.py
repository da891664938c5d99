"""The examples the documents print for a reader to run, run as printed: the README's tools
block (its MCP step against the real ``mcp-server-time`` the install provides) and the
worked example of docs/policy.md, whose sample output is compared with what ``ctx`` prints.

Only the place differs: a scratch storage root stands for the default one.  The tools block
runs as root and as an ordinary user, since the README says it works as any user."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
DEFAULT_ROOT = "/var/lib/cortexfs/storage/current"
ELISIONS = {"...", "…"}

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="the examples create agents running as other users, as root does"
)


def section(document: Path, heading: str) -> str:
    """The text of ``document`` from ``heading`` to the next heading of the same level."""
    text = document.read_text()
    level = heading.split(" ")[0]
    start = text.index(f"\n{heading}\n")
    end = text.find(f"\n{level} ", start + len(heading) + 2)
    return text[start : end if end != -1 else len(text)]


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """Every fenced block of ``text`` as (its language, its text)."""
    return re.findall(r"^```(\w*)\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)


def environment(root: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "CTX_STORAGE": str(root),
    }


def run_script(
    script: str, cwd: Path, root: Path, user: UnprivilegedUser | None = None
) -> subprocess.CompletedProcess[str]:
    """``script`` run by bash -e in ``cwd``, its HOME too, as root or as ``user``."""
    identity: dict[str, object] = {}
    env = {**environment(root), "HOME": str(cwd)}
    if user is not None:
        identity = {"user": user.uid, "group": user.gid, "extra_groups": []}
    return subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        **identity,  # type: ignore[arg-type]
    )


needs_mcp_server_time = pytest.mark.skipif(
    not (VENV_BIN / "mcp-server-time").exists(),
    reason=f"{VENV_BIN} has no mcp-server-time (the install provides it)",
)


def readme_tools_steps() -> str:
    """The README's tools block up to 'ctx mount' (which needs FUSE and stays in the
    background), as printed."""
    [(_, block)] = [
        block
        for block in fenced_blocks(section(REPO / "README.md", "## Tools, agents and MCP servers"))
        if block[0] == "sh"
    ]
    return block[: block.index("\nctx mount ")]


def check_the_projected_tool_answers_coder(
    work: Path, root: Path, user: UnprivilegedUser | None = None
) -> None:
    """Once both policies grant it, as the comment on the install line says."""
    grant = "allow coder_t tool:time.get_current_time execute\n"
    for policy in (root / "agent/coder.d/policy", root / "tool/time.get_current_time.d/policy"):
        with open(policy, "a") as handle:
            handle.write(grant)
    called = run_script(
        'ctx run --agent coder time.get_current_time \'{"timezone": "UTC"}\'', work, root, user
    )
    assert called.returncode == 0, called.stderr
    assert json.loads(called.stdout)["timezone"] == "UTC", called.stdout


@needs_root
@needs_mcp_server_time
def test_the_readme_tools_block_projects_installs_and_runs_an_mcp_tool(
    traversable_tmp: Path,
) -> None:
    """As root, coder runs as root's default user, nobody."""
    root, work = traversable_tmp / "root", traversable_tmp / "work"
    work.mkdir()

    ran = run_script(readme_tools_steps(), work, root)

    assert ran.returncode == 0, ran.stderr
    assert "installed time.get_current_time in tier system" in ran.stdout
    assert json.loads((root / "agent/coder.d/identity").read_text())["uid"] == 65534
    check_the_projected_tool_answers_coder(work, root)


@needs_mcp_server_time
def test_the_readme_tools_block_runs_as_printed_for_an_ordinary_user(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """An ordinary user's coder runs as that user: an agent of another user is root's to
    make, so a block that named one (--user alice) stopped there for everyone but root.  On
    the user's default storage root, below HOME, where the block starts: run there, its
    read-write workspace held the storage root, and step 4 refused every call coder made."""
    home = traversable_tmp / "home"
    home.mkdir()
    os.chown(home, unprivileged_user.uid, unprivileged_user.gid)
    root = home / ".local/share/cortexfs/storage/current"
    steps = f"unset CTX_STORAGE XDG_DATA_HOME\n{readme_tools_steps()}"

    ran = run_script(steps, home, root, unprivileged_user)

    assert ran.returncode == 0, ran.stderr
    assert "installed time.get_current_time in tier system" in ran.stdout
    assert "type: directory" in ran.stdout, ran.stdout  # ctx run --agent coder fs.stat
    identity = json.loads((root / "agent/coder.d/identity").read_text())
    assert identity["uid"] == unprivileged_user.uid
    check_the_projected_tool_answers_coder(home, root, unprivileged_user)


@needs_mcp_server_time
def test_an_ordinary_users_loose_mcp_configuration_is_refused_for_what_it_is(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """The tool runs offline in a user namespace where root's directories show the overflow
    uid: the host holds the configuration to StrictModes and names the real fault, not '/'."""
    home = traversable_tmp / "home"
    home.mkdir()
    os.chown(home, unprivileged_user.uid, unprivileged_user.gid)
    root = home / ".local/share/cortexfs/storage/current"
    assert run_script(readme_tools_steps(), home, root, unprivileged_user).returncode == 0
    (home / "ctx-first/mcp/mcp.json").chmod(0o664)

    with pytest.raises(AssertionError) as refused:
        check_the_projected_tool_answers_coder(home, root, unprivileged_user)

    assert "is writable by its group or by others (mode 0664)" in str(refused.value)
    assert "65534" not in str(refused.value)


def commands_and_samples(text: str) -> list[tuple[str, list[str]]]:
    """Each ``$ command`` of the sample blocks of ``text`` with the lines printed under it
    (continued lines joined, elisions left out)."""
    found: list[tuple[str, list[str]]] = []
    for language, block in fenced_blocks(text):
        if language:
            continue
        lines = iter(block.splitlines())
        for line in lines:
            if line.startswith("$ "):
                command = line[2:]
                while command.endswith("\\"):
                    command = command[:-1] + next(lines).strip()
                found.append((command, []))
            elif found and line.strip() and line.strip() not in ELISIONS:
                found[-1][1].append(line)
    return found


def control_listing(text: str) -> dict[str, str]:
    """The worked example's listing of controls: each file and the text shown for it."""
    [listing] = [
        block
        for language, block in fenced_blocks(text)
        if not language and block.startswith("agent/coder.d/identity")
    ]
    controls: dict[str, list[str]] = {}
    for line in listing.splitlines():
        if not line.strip():
            continue
        if line[0] != " ":
            name, value = line.split(maxsplit=1)
            controls[name] = [value]
        else:
            controls[name].append(line.strip())
    return {name: "\n".join(lines) for name, lines in controls.items()}


def rules(policy: str) -> list[str]:
    return [line for line in policy.splitlines() if line and not line.startswith("#")]


@needs_root
def test_the_policy_worked_example_prints_what_docs_policy_shows(traversable_tmp: Path) -> None:
    example = section(REPO / "docs" / "policy.md", "## Worked examples")
    [(_, setup)] = [block for block in fenced_blocks(example) if block[0] == "sh"]
    root, scratch = traversable_tmp / "root", traversable_tmp / "scratch"
    scratch.mkdir()
    # The default root is the example's; a scratch one stands in for it, and for /tmp.
    setup = setup.replace("/tmp/", f"{scratch}/").replace(DEFAULT_ROOT, str(root))
    made = run_script(f"ctx bootstrap >/dev/null\n{setup}", traversable_tmp, root)
    assert made.returncode == 0, made.stderr

    for name, shown in control_listing(example).items():
        actual = (root / name).read_text().replace(str(root), DEFAULT_ROOT)
        if name.endswith("/policy"):
            assert rules(actual) == rules(shown), name
        elif name.endswith(("/mount", "/identity")):
            assert json.loads(actual) == json.loads(shown), name
        else:
            assert actual.strip() == shown, name

    samples = commands_and_samples(example)
    assert len(samples) == 6
    for command, printed in samples:
        words = shlex.split(command)
        assert words[0] == "ctx"
        ran = subprocess.run(
            [str(VENV_BIN / "ctx"), *words[1:]],
            cwd=root,
            env=environment(root),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        output = (ran.stdout + ran.stderr).replace(str(root), DEFAULT_ROOT).splitlines()
        # Every line the document prints appears, in its order; elided lines may lie between.
        remaining = iter(output)
        missing = [line for line in printed if line not in remaining]
        assert not missing, f"$ {command}\nprinted by the document, not by ctx: {missing}\n" + (
            "\n".join(output)
        )
