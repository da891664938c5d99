"""Acceptance tests of §7 (tsh, ``tool/tsh.d/config``, ``ctx tool``: H-1..H-5), of the
invocation modes and the CTX_PATH lookup of §6 (T-2, T-3, T-4) and of ``ctx object which`` and
``ctx object list`` (T-8a), run against the installed commands: a standalone human tsh
(``bin/tsh``), a real agent terminal (``ctx agent start``) and ``ctx`` itself."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, clean_env, ctx_run, tool_manifest

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="runs tools as another uid")
needs_terminal = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs root, bubblewrap and /dev/fuse",
)

# A tool that shows what it was started with: each argument on a line of its own between
# brackets, then its standard input, and leaves a mark that it ran.
ARGS_TOOL = """\
#!/bin/sh
touch "$0.ran" 2>/dev/null
printf 'argc=%s\\n' "$#"
for a in "$@"; do printf '[%s]\\n' "$a"; done
if [ -t 0 ] && [ -t 1 ]; then echo tty=yes; fi
if [ "$CTX_MODE" = native ] || [ ! -t 0 ]; then printf 'stdin=%s\\n' "$(cat)"; fi
"""


def install(storage: Path, name: str, program: str, tier: str = "system") -> Path:
    """Install tool ``name`` into ``tier`` with ``ctx object install``; its executable's path."""
    manifests = storage.parent / "manifests" / tier.replace(":", "-")
    path = tool_manifest(manifests, name, program, side_effects=True)
    r = ctx_run("object", "install", path, "--tier", tier, env=clean_env(CTX_STORAGE=str(storage)))
    assert r.rc == 0, r
    if tier == "system":
        return storage / "tool" / name
    if tier == "user":
        return storage / "home" / str(os.getuid()) / "tool" / name
    return storage / "shared" / tier.removeprefix("shared:") / "tool" / name


def marker_tool(directory: Path, name: str, mark: Path, mode: int = 0o755) -> Path:
    """A bare executable ``directory/name`` that creates ``mark`` when anything runs it."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\ntouch {mark}\necho ran\n")
    path.chmod(mode)
    return path


def human_env(storage: Path, home: Path, **extra: str) -> dict[str, str]:
    """A host user's environment: this storage root, ``home`` as CTX_HOME (no .tshrc unless a
    test writes one) and nothing else of CortexFS unless given."""
    home.mkdir(parents=True, exist_ok=True)
    return clean_env(CTX_STORAGE=str(storage), CTX_HOME=str(home), **extra)


def tsh(storage: Path, *args: str, env: dict[str, str], script: str | None = None):
    """The storage root's ``bin/tsh`` as a standalone human tsh (H-2): ``tsh ARGS`` or, given a
    script, command lines read from stdin."""
    return subprocess.run(
        [storage / "bin" / "tsh", *args],
        input=script if script is not None else "",
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


# ------------------------------------------------------------------ H-1: tsh is no host shell


def test_h1_bootstrap_installs_ctxterm_and_tsh_where_h1_names_them(storage):
    """H-1: /ctx/bin/ctxterm, /ctx/bin/tsh and /ctx/tool/tsh exist, executable."""
    for entry in ("bin/ctxterm", "bin/tsh", "tool/tsh"):
        path = storage / entry
        assert path.is_file() and os.access(path, os.X_OK), entry
    assert (storage / "tool" / "tsh.d").is_dir()


@pytest.mark.parametrize(
    "line",
    ["hostcmd", "{marker_dir}/hostcmd", "sh -c 'touch {marker}'", "touch {marker}", "env"],
)
def test_h1_tsh_never_runs_a_host_command_from_path(storage, tmp_path, line):
    """H-1: "tsh is not a host shell: it never runs host commands from PATH; it only resolves
    and runs CortexFS tool objects through CTX_PATH".  A program on PATH (or named by its
    path) is not found, nor run, whether given as tsh's argv or typed as a command line."""
    bindir = tmp_path / "hostbin"
    marker = tmp_path / "host-ran"
    marker_tool(bindir, "hostcmd", marker)
    empty = tmp_path / "ctxpath"
    empty.mkdir()
    env = human_env(storage, tmp_path / "home", CTX_PATH=str(empty))
    env["PATH"] = f"{bindir}:{env.get('PATH', '/usr/bin:/bin')}"
    line = line.format(marker=marker, marker_dir=bindir)
    r = tsh(storage, env=env, script=line + "\n")
    assert r.returncode != 0, r
    assert "ran" not in r.stdout
    assert not marker.exists()
    argv = subprocess.run(
        ["/bin/sh", "-c", f'exec "$0" {line}', storage / "bin" / "tsh"],
        capture_output=True, text=True, env=env, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert argv.returncode != 0, argv
    assert not marker.exists()


def test_h1_tsh_finds_a_name_on_ctx_path_and_not_on_path(storage, tmp_path):
    """H-1, T-4: ``which`` answers from CTX_PATH alone."""
    bindir, tools = tmp_path / "hostbin", tmp_path / "tools"
    marker_tool(bindir, "onlyhost", tmp_path / "m1")
    tool = marker_tool(tools, "onlyctx", tmp_path / "m2")
    env = human_env(storage, tmp_path / "home", CTX_PATH=str(tools))
    env["PATH"] = f"{bindir}:/usr/bin:/bin"
    r = tsh(storage, "which", "onlyctx", env=env)
    assert (r.returncode, r.stdout) == (0, f"{tool}\n"), r
    r = tsh(storage, "which", "onlyhost", env=env)
    assert r.returncode != 0 and r.stdout == "", r
    assert not (tmp_path / "m1").exists() and not (tmp_path / "m2").exists()


# ------------------------------------------------------------------ H-2: a human tsh runs nothing


def test_h2_a_standalone_tsh_discovers_tools_and_reads_their_metadata(storage, tmp_path):
    """H-2: "A standalone human tsh can discover tools and read metadata"."""
    install(storage, "demo.meta", ARGS_TOOL)
    env = human_env(storage, tmp_path / "home", CTX_PATH=str(storage / "tool"))
    r = tsh(storage, "tools", env=env)
    assert r.returncode == 0, r
    assert {"demo.meta", "fs.read", "tsh.config"} <= set(r.stdout.split()), r
    r = tsh(storage, "which", "demo.meta", env=env)
    assert (r.returncode, r.stdout) == (0, f"{storage}/tool/demo.meta\n"), r
    r = tsh(storage, "describe", "demo.meta", env=env)
    assert r.returncode == 0, r
    described = json.loads(r.stdout)
    assert described["name"] == "demo.meta"
    assert described["description"].strip() == "The demo.meta test tool."
    assert described["schema"] == {"type": "object"}
    assert not (storage / "tool" / "demo.meta.ran").exists(), "describing runs nothing"


@pytest.mark.parametrize(
    "forged",
    [
        {},
        {"CTX_AGENT": "coder", "CTX_SESSION": "default", "CTX_MODE": "terminal"},
        {"CTX_AGENT": "coder", "CTX_CALL": "1", "CTX_TOOL": "demo.mark", "CTX_RUN_CAPABILITY": "0"},
        {"CTX_AGENT": "coder", "CTX_RUN_SOCKET": "/nonexistent/run.sock"},
    ],
)
def test_h2_a_standalone_tsh_cannot_run_a_tool_even_claiming_an_agent(storage, tmp_path, forged):
    """H-2: a standalone human tsh "cannot execute tools as an agent (it cannot forge agent
    identity)": the tool does not run, in argv mode or from a script, whatever agent the
    environment claims, and nothing is recorded for that agent."""
    request = json.dumps({"name": "coder", "label": "coder_t", "tools": ["demo.mark"]})
    assert ctx_run("agent", "create", "-", "--storage", storage, input=request).rc == 0
    tool = install(storage, "demo.mark", ARGS_TOOL)
    with (storage / "tool" / "demo.mark.d" / "policy").open("a") as policy:
        policy.write("allow coder_t tool:demo.mark execute\n")
    env = human_env(storage, tmp_path / "home", CTX_PATH=str(storage / "tool"), **forged)
    r = tsh(storage, "demo.mark", "x", env=env)
    assert r.returncode != 0, r
    assert "argc=" not in r.stdout
    r = tsh(storage, env=env, script="demo.mark x\n")
    assert r.returncode != 0, r
    assert "argc=" not in r.stdout
    assert not Path(f"{tool}.ran").exists()
    assert not list(storage.glob("home/*/agent/coder/session/*/events.jsonl"))


# ------------------------------------------------------------------ H-3: ctx tool


def test_h3_ctx_tool_runs_the_safe_core_cli_tsh_config(storage, tmp_path):
    """H-3: ``ctx tool tsh.config`` runs the safe core CLI; H-4: its updates reach the file."""
    env = human_env(storage, tmp_path / "home", CTX_PATH=str(storage / "tool"))
    r = ctx_run("tool", "tsh.config", env=env)
    assert r.rc == 0, r
    assert {"max_loaded_tools=64", "cache_capacity=32", "window_percent=1"} <= set(r.lines()), r
    r = ctx_run("tool", "tsh.config", "cache_capacity=48", env=env)
    assert r.rc == 0, r
    config = (storage / "tool" / "tsh.d" / "config").read_text().splitlines()
    assert "cache_capacity=48" in config and "cache_capacity=32" not in config
    assert "max_loaded_tools=64" in config and "window_percent=1" in config


@pytest.mark.parametrize("name", ["fs.write", "shell.exec"])
def test_h3_ctx_tool_refuses_permission_bearing_core_tools(storage, tmp_path, name):
    """H-3: ctx tool "MUST refuse ... permission-bearing core tools (fs.write, shell.exec)":
    refused, and nothing they were asked to do happens."""
    target = tmp_path / "written"
    env = human_env(storage, tmp_path / "home", CTX_PATH=str(storage / "tool"))
    if name == "fs.write":
        argument = json.dumps({"path": str(target), "content": "x"})
    else:
        argument = json.dumps({"cmd": f"touch {target}"})
    for args in ((name, argument), ("--json", name, argument)):
        r = ctx_run("tool", *args, env=env)
        assert r.rc != 0, r
        assert "EACCES" in r.err or "EACCES" in r.out, r
        assert not target.exists()


def test_h3_ctx_tool_refuses_an_ordinary_visible_tool(storage, tmp_path):
    """H-3: ctx tool "MUST refuse ordinary visible tools": a tool installed on CTX_PATH is
    refused and does not run."""
    tool = install(storage, "demo.plain", ARGS_TOOL)
    env = human_env(storage, tmp_path / "home", CTX_PATH=str(storage / "tool"))
    assert ctx_run("object", "which", "demo.plain", env=env).out == f"{tool}\n"
    r = ctx_run("tool", "demo.plain", "a", env=env)
    assert r.rc != 0, r
    assert "argc=" not in r.out
    assert not Path(f"{tool}.ran").exists()


@pytest.mark.parametrize("source", ["env", "tshrc"])
def test_h3_ctx_tool_needs_the_name_visible_on_ctx_path(storage, tmp_path, source):
    """H-3: "NAME must still be visible on CTX_PATH": with a CTX_PATH (from the environment or
    from .tshrc, T-4) that does not hold tsh.config, ctx tool refuses and changes nothing."""
    empty = tmp_path / "empty"
    empty.mkdir()
    home = tmp_path / "home"
    if source == "env":
        env = human_env(storage, home, CTX_PATH=str(empty))
    else:
        env = human_env(storage, home, CTX_PATH=str(storage / "tool"))
        (home / ".tshrc").write_text(f"CTX_PATH={empty}\n")
    config = storage / "tool" / "tsh.d" / "config"
    before = config.read_bytes()
    r = ctx_run("tool", "tsh.config", "cache_capacity=50", env=env)
    assert r.rc != 0, r
    assert config.read_bytes() == before


def test_h3_ctx_tool_takes_the_core_tool_under_another_name_of_the_root(storage, tmp_path):
    """H-3: "NAME must still be visible on CTX_PATH"; the storage root's own tool/ reached
    through a symbolic link, or with ``..`` in the entry, is that visible core tool."""
    link = tmp_path / "root-link"
    link.symlink_to(storage)
    config = storage / "tool" / "tsh.d" / "config"
    for value, ctx_path in ((40, f"{link}/tool"), (41, f"{storage}/bin/../tool")):
        env = human_env(storage, tmp_path / "home", CTX_PATH=ctx_path)
        r = ctx_run("tool", "tsh.config", f"cache_capacity={value}", env=env)
        assert r.rc == 0, r
        assert f"cache_capacity={value}" in config.read_text().splitlines()
    env = human_env(link, tmp_path / "home", CTX_PATH=f"{storage}/tool")
    r = ctx_run("tool", "tsh.config", env=env)
    assert (r.rc, r.lines()[1:2]) == (0, ["cache_capacity=41"]), r


@pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or os.geteuid() != 0,
    reason="ctx mount needs /dev/fuse and root",
)
def test_h3_ctx_tool_takes_the_core_tool_seen_through_ctx_mount(storage, tmp_path):
    """H-3 with §0's usual layout: the storage root mounted (``ctx mount``, normally at
    /ctx) and CTX_PATH naming the mount's tool/ (the default is ``/ctx/tool``): tsh.config
    there is the visible core tool, and its update reaches the storage root's config."""
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    env = clean_env(CTX_STORAGE=str(storage))
    daemon = subprocess.Popen(
        [*CTX_ARGV, "mount", str(mountpoint)], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (mountpoint / "tool").exists() and time.monotonic() < deadline:
            assert daemon.poll() is None, daemon.stderr.read()
            time.sleep(0.1)
        env = human_env(storage, tmp_path / "home", CTX_PATH=str(mountpoint / "tool"))
        assert ctx_run("object", "which", "tsh.config", env=env).out == (
            f"{mountpoint}/tool/tsh.config\n"
        )
        r = ctx_run("tool", "tsh.config", "cache_capacity=42", env=env)
        assert r.rc == 0, r
        config = storage / "tool" / "tsh.d" / "config"
        assert "cache_capacity=42" in config.read_text().splitlines()
    finally:
        ctx_run("umount", mountpoint, env=env)
        daemon.wait(timeout=30)


def test_h3_a_program_named_tsh_config_earlier_on_ctx_path_is_never_run(storage, tmp_path):
    """H-3: the safe core CLIs are "implemented inside ctx": ctx tool never executes what
    CTX_PATH holds under that name (T-4 would pick the decoy, which is no core CLI)."""
    decoys = tmp_path / "decoys"
    marker = tmp_path / "decoy-ran"
    marker_tool(decoys, "tsh.config", marker)
    env = human_env(storage, tmp_path / "home", CTX_PATH=f"{decoys}:{storage / 'tool'}")
    r = ctx_run("tool", "tsh.config", env=env)
    assert "ran" not in r.out.split(), r
    assert not marker.exists()


# ------------------------------------------------------------------ H-4: tool/tsh.d/config


def test_h4_the_config_is_data_with_blank_lines_and_comments(storage, tmp_path):
    """H-4: blank lines, ``#`` comments and the three keys; the file is read, never run."""
    marker = tmp_path / "config-ran"
    config = storage / "tool" / "tsh.d" / "config"
    config.write_text(
        "# my settings\n\n   \nmax_loaded_tools=7\n# cache_capacity=1\ncache_capacity=9\n"
        "window_percent=3\n"
    )
    env = human_env(storage, tmp_path / "home", CTX_PATH=str(storage / "tool"))
    r = ctx_run("tool", "tsh.config", env=env)
    assert r.rc == 0, r
    assert {"max_loaded_tools=7", "cache_capacity=9", "window_percent=3"} <= set(r.lines()), r
    config.write_text(
        f"touch {marker}\nmax_loaded_tools=$(touch {marker})\n`touch {marker}`\ncache_capacity=9\n"
    )
    r = ctx_run("tool", "tsh.config", env=env)
    assert "cache_capacity=9" in r.lines(), r
    assert "max_loaded_tools=64" in r.lines(), r  # the unusable line's key keeps its default
    s = tsh(storage, env=env, script="which fs.read\n")
    assert (s.returncode, s.stdout) == (0, f"{storage}/tool/fs.read\n"), s
    assert not marker.exists()


def loaded_names(output: str, separator: str) -> list[str]:
    """The names ``loaded`` printed: the lines after the last ``separator`` line."""
    lines = output.splitlines()
    last = max(i for i, line in enumerate(lines) if line == separator)
    return [line.split(":", 1)[0] for line in lines[last + 1 :]]


def test_h4_max_loaded_tools_bounds_the_unpinned_context(storage, tmp_path):
    """H-4: "max_loaded_tools bounds unpinned tool metadata loaded into the tsh context";
    "Pinned tools are exempt from unload"."""
    env = human_env(storage, tmp_path / "home", CTX_PATH=str(storage / "tool"))
    assert ctx_run("tool", "tsh.config", "max_loaded_tools=2", env=env).rc == 0
    separator = f"{storage}/tool/fs.read"
    script = "pin fs.read\nload fs.list\nload fs.stat\nload fs.write\nload shell.exec\n"
    r = tsh(storage, env=env, script=script + "which fs.read\nloaded\n")
    assert r.returncode == 0, r
    names = loaded_names(r.stdout, separator)
    assert "fs.read" in names, r  # pinned: never unloaded
    unpinned = [name for name in names if name != "fs.read"]
    assert len(unpinned) == 2, r
    assert set(unpinned) == {"fs.write", "shell.exec"}, r  # the most recent stay


@pytest.mark.parametrize("pinned", [False, True])
@pytest.mark.parametrize("capacity", ["1", "32"])
def test_h4_the_path_cache_never_changes_what_ctx_path_resolves(storage, tmp_path, pinned,
                                                                capacity):  # fmt: skip
    """H-4, T-4: the W-TinyLFU tool-path cache (and a pinned tool's path) only spares lookups:
    an earlier file that becomes executable (chmod, which leaves its directory as it was) or
    appears wins at once, and one that stops being executable stops being the hit."""
    zero, first, second = tmp_path / "zero", tmp_path / "first", tmp_path / "second"
    zero.mkdir()
    earlier = marker_tool(first, "demo.moving", tmp_path / "m", mode=0o644)
    winner = marker_tool(second, "demo.moving", tmp_path / "m")
    env = human_env(storage, tmp_path / "home", CTX_PATH=f"{zero}:{first}:{second}")
    (storage / "tool" / "tsh.d" / "config").write_text(
        f"max_loaded_tools=4\ncache_capacity={capacity}\nwindow_percent=1\n"
    )
    proc = subprocess.Popen(
        [storage / "bin" / "tsh"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:

        def which() -> str:
            proc.stdin.write("which demo.moving\n")
            proc.stdin.flush()
            return proc.stdout.readline().strip()

        if pinned:
            proc.stdin.write("pin demo.moving\n")
            proc.stdin.flush()
            assert proc.stdout.readline().startswith("demo.moving:")
        for _ in range(3):
            assert which() == str(winner)
        earlier.chmod(0o755)
        assert which() == str(earlier)
        earlier.chmod(0o644)
        assert which() == str(winner)
        newest = marker_tool(zero, "demo.moving", tmp_path / "m")
        assert which() == str(newest)
        for path in (newest, earlier, winner):
            path.unlink()
        proc.stdin.write("which demo.moving\n")
        proc.stdin.flush()
    finally:
        out, err = proc.communicate(timeout=60)
    assert out == "", (out, err)


# ------------------------------------------------------------------ T-2: tools are executables


def test_t2_a_tool_file_is_an_executable_with_stdin_and_stdout(storage, tmp_path):
    """T-2: ``/ctx/tool/fs.read '{"path":"README.md"}'`` and
    ``echo '{"cmd":"pwd"}' | /ctx/tool/shell.exec`` — the tool file itself is run."""
    (tmp_path / "README.md").write_text("hello from the readme\n")
    env = clean_env()
    r = subprocess.run(
        [storage / "tool" / "fs.read", '{"path":"README.md"}'], capture_output=True, text=True,
        env=env, cwd=tmp_path, timeout=60, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert r.returncode == 0, r
    assert "hello from the readme" in r.stdout
    r = subprocess.run(
        [storage / "tool" / "shell.exec"], input='{"cmd":"pwd"}', capture_output=True,
        text=True, env=env, cwd=tmp_path, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r
    assert r.stdout.strip() == str(tmp_path)


# ------------------------------------------------------------------ T-3: the invocation modes


@pytest.fixture(scope="session")
def _world_template() -> Iterator[Path]:
    """The tools of :func:`world`, bootstrapped and installed once per test process."""
    top = Path(tempfile.mkdtemp(prefix="cortexfs-tsh-template-", dir="/tmp"))
    top.chmod(0o755)
    storage = top / "storage"
    try:
        assert ctx_run("bootstrap", "--storage", storage).rc == 0
        assert ctx_run("shared", "create", "lab", "--storage", storage).rc == 0
        for directory in ("lab", "lab/tool"):  # Linux permissions let every uid look in
            (storage / "shared" / directory).chmod(0o755)
        install(storage, "demo.args", ARGS_TOOL)
        install(storage, "demo.lab", ARGS_TOOL, tier="shared:lab")
        for policy_file, tool in (
            (storage / "tool" / "demo.args.d" / "policy", "demo.args"),
            (storage / "shared" / "lab" / "tool" / "demo.lab.d" / "policy", "demo.lab"),
        ):
            with policy_file.open("a") as policy:
                policy.write(f"allow coder_t tool:{tool} execute\n")
        yield storage
    finally:
        shutil.rmtree(top)


@pytest.fixture
def world(_world_template: Path) -> Iterator[Path]:
    """A storage root every uid may search, with agent ``coder`` allowed to run ``demo.args``
    and, from the space ``lab`` it may read, ``demo.lab`` (both policies, P-6), and agent
    ``other`` allowed nothing."""
    top = Path(tempfile.mkdtemp(prefix="cortexfs-tsh-", dir="/tmp"))
    top.chmod(0o755)
    storage = top / "storage"
    try:
        subprocess.run(["cp", "-a", _world_template, storage], check=True)
        for name in ("coder", "other"):
            # made here, not copied: an agent's controls name the storage root it was made in
            request = {"name": name, "label": f"{name}_t", "tools": [], "mount": []}
            if name == "coder":
                request["tools"] = ["demo.args", "demo.lab"]
                request["shared"] = {"lab": ["read"]}
            r = ctx_run("agent", "create", "-", "--storage", storage, input=json.dumps(request))
            assert r.rc == 0, r
        yield storage
    finally:
        shutil.rmtree(top)


@needs_root
def test_t3_terminal_mode_keeps_argv_and_inherits_stdin(world):
    """T-3 terminal CLI: argv kept (spaces, empty words, ``--``, option-like words), stdin and
    stdout the caller's, plain text out, and an empty argv is not refused before the tool
    runs."""
    env = clean_env(CTX_STORAGE=str(world))
    args = ["a b", "", "--", "-x", "--native", "é"]
    r = ctx_run("run", "--agent", "coder", "demo.args", *args, input="piped in", env=env)
    assert r.rc == 0, r
    assert r.lines() == ["argc=6", *(f"[{a}]" for a in args), "stdin=piped in"], r
    r = ctx_run("run", "--agent", "coder", "demo.args", env=env)
    assert r.rc == 0, r
    assert r.lines()[0] == "argc=0", r


@needs_root
def test_t3_native_mode_reads_json_and_writes_jsonl_frames(world):
    """T-3 agent native: structured JSON input, JSONL frames out."""
    env = clean_env(CTX_STORAGE=str(world))
    r = ctx_run("run", "--native", "--agent", "coder", "demo.args", input='{"k": 1}', env=env)
    assert r.rc == 0, r
    frames = [json.loads(line) for line in r.lines()]
    assert frames and all(isinstance(frame, dict) for frame in frames), r
    assert frames[-1]["type"] == "result", r
    assert "stdin=" in json.dumps(frames[-1]) and '\\"k\\": 1' in json.dumps(frames[-1]), r


@needs_root
def test_t3_both_modes_go_through_the_same_authorization(world):
    """T-3: "Both go through the same authorization": an agent without the grant is refused
    in either mode, and the tool does not run."""
    env = clean_env(CTX_STORAGE=str(world))
    marker = world / "tool" / "demo.args.ran"
    r = ctx_run("run", "--agent", "other", "demo.args", "x", env=env)
    assert r.rc != 0 and "argc=" not in r.out, r
    assert "EACCES" in r.err, r
    r = ctx_run("run", "--native", "--agent", "other", "demo.args", input="{}", env=env)
    assert r.rc != 0, r
    assert json.loads(r.lines()[-1])["type"] == "result", r
    assert "EACCES" in r.out, r
    assert not marker.exists()


# ------------------------------------------------------------------ T-4: CTX_PATH lookup


def test_t4_left_to_right_the_first_executable_wins(storage, tmp_path):
    """T-4: left to right, the first directory holding an executable file of that name wins;
    a non-executable file is not a hit."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    marker_tool(a, "demo.x", tmp_path / "m", mode=0o644)
    in_b = marker_tool(b, "demo.x", tmp_path / "m")
    marker_tool(c, "demo.x", tmp_path / "m")
    env = human_env(storage, tmp_path / "home", CTX_PATH=f"{a}:{b}:{c}")
    r = ctx_run("object", "which", "demo.x", env=env)
    assert (r.rc, r.out) == (0, f"{in_b}\n"), r
    assert tsh(storage, "which", "demo.x", env=env).stdout == f"{in_b}\n"
    (a / "demo.x").chmod(0o755)
    assert ctx_run("object", "which", "demo.x", env=env).out == f"{a / 'demo.x'}\n"
    assert not (tmp_path / "m").exists()


def test_t4_the_control_dir_comes_from_the_directory_of_the_executable(storage, tmp_path):
    """T-4: "the control dir .d/ comes from the directory that held the executable": a
    ``.d/`` earlier on the path, beside a file that is no hit, is not used."""
    real = install(storage, "demo.ctl", ARGS_TOOL)
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    shutil.copy2(real, decoy / "demo.ctl")
    (decoy / "demo.ctl").chmod(0o644)
    shutil.copytree(storage / "tool" / "demo.ctl.d", decoy / "demo.ctl.d")
    (decoy / "demo.ctl.d" / "description").write_text("the decoy's description\n")
    env = human_env(storage, tmp_path / "home", CTX_PATH=f"{decoy}:{storage / 'tool'}")
    r = tsh(storage, "describe", "demo.ctl", env=env)
    assert r.returncode == 0, r
    described = json.loads(r.stdout)
    assert described["path"] == str(real)
    assert described["description"].strip() == "The demo.ctl test tool."


def test_t4_the_search_path_sources_in_their_order(storage, tmp_path):
    """T-4: (1) ``CTX_PATH=`` in ``$CTX_HOME/.tshrc``, (2) the process CTX_PATH, (3) the
    default ``/ctx/tool:/ctx/home/<uid>/tool`` (``/ctx`` being this storage root, not mounted
    here)."""
    from_rc, from_env = tmp_path / "rc", tmp_path / "env"
    in_rc = marker_tool(from_rc, "demo.src", tmp_path / "m")
    in_env = marker_tool(from_env, "demo.src", tmp_path / "m")
    in_user = install(storage, "demo.src", ARGS_TOOL, tier="user")
    home = tmp_path / "home"
    home.mkdir()
    for env_path, tshrc, expected in [
        (str(from_env), f"# mine\n\nCTX_PATH={from_rc}\n", in_rc),
        (str(from_env), "# no CTX_PATH here\n", in_env),
        (None, None, in_user),
        (None, f"CTX_PATH={from_rc}\n", in_rc),
    ]:
        (home / ".tshrc").unlink(missing_ok=True)
        if tshrc is not None:
            (home / ".tshrc").write_text(tshrc)
        extra = {"CTX_PATH": env_path} if env_path else {}
        env = human_env(storage, home, **extra)
        r = ctx_run("object", "which", "demo.src", env=env)
        assert (r.rc, r.out) == (0, f"{expected}\n"), (tshrc, env_path, r)
        t = tsh(storage, "which", "demo.src", env=env)
        assert (t.returncode, t.stdout) == (0, f"{expected}\n"), (tshrc, env_path, t)


def test_t4_the_default_path_puts_the_system_tier_before_the_user_tier(storage, tmp_path):
    """T-4: default ``/ctx/tool:/ctx/home/<uid>/tool``: a name in both tiers is the system's."""
    system = install(storage, "demo.both", ARGS_TOOL)
    install(storage, "demo.both", ARGS_TOOL, tier="user")
    env = human_env(storage, tmp_path / "home")
    assert ctx_run("object", "which", "demo.both", env=env).out == f"{system}\n"


@pytest.mark.parametrize(
    "tshrc",
    [
        "touch {marker}\nCTX_PATH={path}\n",
        "CTX_PATH={path}\n$(touch {marker})\n`touch {marker}`\n",
        "CTX_PATH={path}:$(touch {marker})\n",
        "export CTX_PATH={path}; touch {marker}\nCTX_PATH={path}\n",
    ],
)
def test_t4_tshrc_is_data_never_code(storage, tmp_path, tshrc):
    """T-4: ".tshrc is data, never code": nothing written in it is run, by ctx or by tsh."""
    marker = tmp_path / "tshrc-ran"
    tools = tmp_path / "tools"
    tool = marker_tool(tools, "demo.rc", tmp_path / "m")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".tshrc").write_text(tshrc.format(marker=marker, path=tools))
    env = human_env(storage, home)
    r = ctx_run("object", "which", "demo.rc", env=env)
    assert (r.rc, r.out) == (0, f"{tool}\n"), r
    t = tsh(storage, "which", "demo.rc", env=env)
    assert t.stdout == f"{tool}\n", t
    tsh(storage, env=env, script="tools\n")
    ctx_run("tool", "tsh.config", env=env)
    assert not marker.exists()


@needs_root
def test_t4_an_agent_s_runtime_ctx_path_is_authoritative(world, tmp_path):
    """T-4: "Inside an agent terminal the runtime-injected CTX_PATH ... is authoritative": the
    caller's CTX_PATH and a .tshrc do not choose what ``ctx run --agent`` runs."""
    rogue = tmp_path / "rogue"
    marker = tmp_path / "rogue-ran"
    marker_tool(rogue, "demo.args", marker)
    shutil.copytree(world / "tool" / "demo.args.d", rogue / "demo.args.d")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".tshrc").write_text(f"CTX_PATH={rogue}\n")
    env = clean_env(CTX_STORAGE=str(world), CTX_PATH=str(rogue), CTX_HOME=str(home))
    r = ctx_run("run", "--agent", "coder", "demo.args", "q", env=env)
    assert r.rc == 0, r
    assert r.lines()[:2] == ["argc=1", "[q]"], r
    assert not marker.exists()


@needs_root
def test_t4_an_agent_s_path_holds_the_spaces_its_policy_lets_it_read(world):
    """T-4: the agent's CTX_PATH is "derived from policy, mounts and uid/gid": a tool of a
    space the agent may read (``shared:lab read``) is found; without that grant it is not on
    the path at all."""
    env = clean_env(CTX_STORAGE=str(world))
    r = ctx_run("run", "--agent", "coder", "demo.lab", "v", env=env)
    assert r.rc == 0, r
    assert r.lines()[:2] == ["argc=1", "[v]"], r
    policy = world / "agent" / "coder.d" / "policy"
    rules = policy.read_text().splitlines(keepends=True)
    policy.write_text("".join(rule for rule in rules if "shared:lab" not in rule))
    r = ctx_run("run", "--agent", "coder", "demo.lab", "v", env=env)
    assert r.rc != 0 and "argc=" not in r.out, r
    assert "ENOENT" in r.err, r


@needs_root
def test_t4_an_agent_call_takes_the_controls_beside_the_executable(world):
    """T-4: the controls come from the directory that held the executable: a ``.d/`` whose
    policy would allow the call, beside a file of that name that is no hit (no execute bit)
    in an earlier directory of the agent's path, grants nothing."""
    env = clean_env(CTX_STORAGE=str(world))
    lab = world / "shared" / "lab" / "tool"
    shutil.copy2(lab / "demo.lab", world / "tool" / "demo.lab")
    (world / "tool" / "demo.lab").chmod(0o644)
    shutil.copytree(lab / "demo.lab.d", world / "tool" / "demo.lab.d")
    (lab / "demo.lab.d" / "policy").write_text("# nobody\n")
    r = ctx_run("run", "--agent", "coder", "demo.lab", "v", env=env)
    assert r.rc != 0 and "argc=" not in r.out, r
    assert "EACCES" in r.err and "demo.lab.d/policy" in r.err, r
    assert "shared/lab/tool/demo.lab.d/policy" in r.err or "step 6" in r.err, r


# ------------------------------------------------------------------ T-8a: which and list


def test_t8a_which_prints_the_path_or_exits_1(storage, tmp_path):
    """T-8a: ``ctx object which NAME`` prints the path CTX_PATH resolves NAME to (exit 1 when
    none)."""
    env = human_env(storage, tmp_path / "home")
    r = ctx_run("object", "which", "fs.read", env=env)
    assert (r.rc, r.out) == (0, f"{storage / 'tool' / 'fs.read'}\n"), r
    r = ctx_run("object", "which", "no.such.tool", env=env)
    assert (r.rc, r.out) == (1, ""), r
    empty = tmp_path / "empty"
    empty.mkdir()
    r = ctx_run("object", "which", "fs.read", env=human_env(storage, tmp_path / "h2",
                                                            CTX_PATH=str(empty)))  # fmt: skip
    assert (r.rc, r.out) == (1, ""), r


def test_t8a_list_shows_every_tier_and_filters_by_tier(storage, tmp_path):
    """T-8a: ``ctx object list [--tier T]`` lists installed objects, of every tier without
    --tier and of that tier alone with it."""
    env = human_env(storage, tmp_path / "home")
    assert ctx_run("shared", "create", "lab", env=env).rc == 0
    install(storage, "demo.sys", ARGS_TOOL)
    install(storage, "demo.mine", ARGS_TOOL, tier="user")
    install(storage, "demo.lab", ARGS_TOOL, tier="shared:lab")
    r = ctx_run("object", "list", env=env)
    assert r.rc == 0, r
    names = {line.split()[0] for line in r.lines() if line.strip()}
    assert {"demo.sys", "demo.mine", "demo.lab", "fs.read", "tsh.config", "tsh"} <= names, r
    r = ctx_run("object", "list", "--json", env=env)
    tiers = {entry["name"]: entry["tier"] for entry in r.json()}
    assert tiers["demo.sys"] == "system" and tiers["demo.mine"] == "user", r
    assert tiers["demo.lab"] == "shared:lab", r
    for tier, name in (("system", "demo.sys"), ("user", "demo.mine"), ("shared:lab", "demo.lab")):
        r = ctx_run("object", "list", "--tier", tier, env=env)
        assert r.rc == 0, r
        names = {line.split()[0] for line in r.lines() if line.strip()}
        assert name in names, r
        assert not {"demo.sys", "demo.mine", "demo.lab"} - {name} & names, r


# ------------------------------------------------------------------ H-1, H-2, H-5, T-3, T-4 live


class Terminal:
    """An attached client of an agent terminal's socket (A-2): type lines, wait for output."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.sendall(b"attach\n")
        self.seen = b""

    def wait_for(self, text: str, timeout: float = 30) -> str:
        """Read until ``text`` has appeared since the last wait; what was read up to it."""
        deadline = time.monotonic() + timeout
        needle = text.encode()
        while needle not in self.seen and time.monotonic() < deadline:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.1))
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            self.seen += chunk
        assert needle in self.seen, (text, self.seen.decode("utf-8", "replace")[-2000:])
        before, _, self.seen = self.seen.partition(needle)
        return before.decode("utf-8", "replace").replace("\r\n", "\n")

    def type(self, line: str) -> None:
        self.sock.sendall(line.encode() + b"\r")


@pytest.fixture
def terminal(world: Path) -> Iterator[tuple[Path, Terminal, Path]]:
    """A running terminal of agent ``coder``, granted ``demo.args`` and tools ``bash`` and
    ``tmux`` (H-5);
    a .tshrc in the agent's home names a rogue directory (T-4).  Yields the storage root, an
    attached client and the session directory."""
    sockets = world.parent / "tmux"  # the agent's to write, removed with the storage root
    sockets.mkdir()
    sockets.chmod(0o1777)
    multiplexer = f'#!/bin/sh\nSHELL=/bin/sh exec tmux -f /dev/null -S "{sockets}/$$" new-session\n'
    for name, program in (
        ("bash", "#!/bin/sh\nexec /bin/bash --norc --noprofile -i\n"),
        ("tmux", multiplexer),
    ):
        install(world, name, program)
        for policy_file in (
            world / "tool" / f"{name}.d" / "policy",
            world / "agent" / "coder.d" / "policy",
        ):
            with policy_file.open("a") as policy:
                policy.write(f"allow coder_t tool:{name} execute\n")
    uid = ctx_run("agent", "show", "coder", "--json", "--storage", world).json()["identity"]["uid"]
    home = world / "home" / str(uid)
    home.mkdir(parents=True, exist_ok=True)
    rogue = world.parent / "rogue"
    marker_tool(rogue, "demo.args", world.parent / "rogue-ran")
    (home / ".tshrc").write_text(f"CTX_PATH={rogue}\n")
    session = f"s{uuid.uuid4().hex[:12]}"
    where = ["coder", "--session", session, "--storage", world]
    started = ctx_run("agent", "start", *where, "--no-workspace", "--json")
    assert started.rc == 0, started
    try:
        client = Terminal(started.json()["listening_at"])
        client.wait_for("coder$ ")
        yield world, client, home / "agent" / "coder" / "session" / session
        client.sock.close()
    finally:
        ctx_run("agent", "stop", *where)


@needs_terminal
def test_h2_t3_an_agent_terminal_runs_tools_with_argv_kept(terminal):
    """H-2: in an agent terminal tsh runs a granted tool as the agent; T-3: ``tsh TOOL ARG...``
    keeps argv, an empty argv included; T-7: the call is in the session's events."""
    _, client, session = terminal
    client.type("demo.args 'a b' '' c")
    shown = client.wait_for("coder$ ")
    assert "argc=3\n[a b]\n[]\n[c]\ntty=yes\n" in shown, shown  # the terminal's own streams
    client.type("demo.args")
    shown = client.wait_for("coder$ ")
    assert "argc=0" in shown, shown
    events = [json.loads(line) for line in (session / "events.jsonl").read_text().splitlines()]
    called = [e for e in events if e.get("type") in ("tool_call", "tool.call")]
    assert any("demo.args" in json.dumps(e) for e in called), events


@needs_terminal
def test_h1_t4_an_agent_terminal_runs_no_host_command_and_ignores_tshrc(terminal):
    """H-1: typed in the agent terminal, a host command is not run; T-4: the runtime's
    CTX_PATH is authoritative, so the .tshrc in the agent's home does not redirect a name."""
    world, client, _ = terminal
    client.type(f"touch {world.parent}/never")
    shown = client.wait_for("coder$ ")
    assert "touch" in shown, shown
    never = world.parent / "never"
    for line in (f"x > {never}", f"y; touch {never}", f"z | tee {never}", f"$(touch {never})"):
        client.type(f"demo.args {line}")  # no redirection, list, pipe or substitution
        client.wait_for("coder$ ")
    client.type("which demo.args")
    shown = client.wait_for("coder$ ")
    assert "/ctx/tool/demo.args" in shown, shown
    assert "rogue" not in shown
    assert not never.exists()
    client.type("demo.args z")
    shown = client.wait_for("coder$ ")
    assert "argc=1\n[z]" in shown, shown
    assert not (world.parent / "rogue-ran").exists()


@needs_terminal
def test_h2_a_host_process_cannot_use_the_terminal_s_run_socket(terminal):
    """H-2: a tsh outside the agent terminal cannot forge the agent's identity, even given
    the terminal's own run socket (as root, who can reach it): the tool does not run."""
    world, _, session = terminal
    run_socket = next(
        Path("/run/cortexfs/terminal").glob(f"*/*/coder/{session.name}/private/run.sock")
    )
    env = clean_env(CTX_STORAGE=str(world), CTX_RUN_SOCKET=str(run_socket),
                    CTX_PATH=str(world / "tool"), CTX_AGENT="coder")  # fmt: skip
    r = tsh(world, "demo.args", "forged", env=env)
    assert r.returncode != 0, r
    assert "argc=" not in r.stdout
    assert not (world / "tool" / "demo.args.ran").exists()


@needs_terminal
@pytest.mark.parametrize(
    "shell",
    [
        "bash",
        pytest.param(
            "tmux", marks=pytest.mark.skipif(shutil.which("tmux") is None, reason="no tmux")
        ),
    ],
)
def test_h5_shells_and_multiplexers_are_ordinary_tools_and_exit_returns_to_tsh(terminal, shell):
    """H-5: an interactive shell or a multiplexer is an ordinary tool; ``exit`` in it returns
    to tsh."""
    _, client, _ = terminal
    client.type(shell)
    client.type("echo inside-$((6*7))")
    client.wait_for("inside-42")
    client.type("exit")
    client.wait_for("coder$ ")
    client.type("which demo.args")
    shown = client.wait_for("coder$ ")
    assert "/ctx/tool/demo.args" in shown, shown
