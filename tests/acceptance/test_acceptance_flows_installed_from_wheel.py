"""CortexFS installed as a package, not run from the checkout: an sdist and a wheel are built
from the working tree (``python -m build``, which builds the wheel from the sdist, and ``pip
wheel`` of the tree), the wheel is installed with its dependencies into a brand-new venv (with
the ``fuse`` extra, and once more without it), and that venv's ``ctx`` and ``ctxmcp`` are run
from a directory outside the repository, with no PYTHONPATH and no repository path on PATH.

Covered: what the package carries (entry points, the core tool manifests and manual pages read
at run time, no tests or caches, metadata: Requires-Python and every distribution the code
imports declared); ``ctx --version`` / ``--help``; R-1 and R-5 (bootstrap of a fresh root, as
root and as an ordinary user on the embedded default); T-2, T-3, P-6 (the core tools through
``ctx run`` and ``ctx run --native`` as an agent with another uid); Q-1 to Q-5 and W-1, W-2,
W-5 (publish, claim, finish, recover, a draining worker, the shell worker); D-1 (the manual
bundle and the built-in copy); M-1, M-3 (``ctxmcp`` projecting a stdio server, the candidate
installed and run); A-1, A-2, H-1 (an agent terminal running tools through tsh); F-1 (the
mount), and both without the ``fuse`` extra.

The sdist, the wheels and the two venvs are built once per run of this file: the first pytest
process to need them builds them under a lock in ``/tmp/<file stem>-<uid>/``, the others
reuse them, and the last one leaves removes them.  Building and installing take about fifteen
seconds (pip reaches the package index, or its cache, for the build backend and the
dependencies); the whole file about forty with ``-n 2``."""

from __future__ import annotations

import ast
import contextlib
import fcntl
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    MAN_PAGES,
    QUEUE_SUBDIRS,
    REPO,
    ROOT_ENTRIES,
    SUFFIX,
    kill_processes_of,
    mounted_at,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    wait_for,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, Raw
from tests.support.mcp_wire import WIRE
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
BASE_PYTHON = Path(sys.base_prefix) / "bin" / "python3"
SPEC_DOCS = REPO / "docs" / "spec"
CORE_MANIFESTS = REPO / "cortexfs" / "tools" / "core" / "manifests"
CORE_TOOLS = ("fs.read", "fs.list", "fs.stat", "fs.write", "shell.exec", "tsh.config")
CTX_COMMANDS = {"agent", "bootstrap", "man", "mount", "object", "policy", "queue", "run",
                "session", "shared", "tool", "umount"}  # fmt: skip
LABEL = "coder_t"
BUILD_BOUND = 600  # seconds: only a hung build or install reaches it
CACHE_SUFFIXES = (".pyc", ".pyo")
CACHE_PARTS = {"__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis", ".venv", ".git"}

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acts as a second uid: needs root")


# ------------------------------------------------------------------------------ the install


@dataclass(frozen=True)
class Install:
    """What one build made: the sdist (None when ``build`` could not be installed), the
    wheel installed (``python -m build``'s, made from the sdist, else ``pip wheel``'s), the
    wheel ``pip wheel`` made of the tree, a venv with the ``fuse`` extra (``fuse``: whether
    the extra installed) and a ``bare`` venv without it."""

    top: Path
    sdist: Path | None
    wheel: Path
    tree_wheel: Path
    venv: Path
    bare: Path
    fuse: bool

    def program(self, name: str, bare: bool = False) -> Path:
        return (self.bare if bare else self.venv) / "bin" / name

    def site_packages(self) -> Path:
        (found,) = (self.venv / "lib").glob("python3*/site-packages")
        return found


def _quiet(argv: list, **kw) -> subprocess.Popen:
    return subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, preexec_fn=lambda: os.umask(0o022),
                            **kw)  # fmt: skip


def _finished(*procs: subprocess.Popen) -> list[tuple[int, str]]:
    done = []
    for proc in procs:
        out, _ = proc.communicate(timeout=BUILD_BOUND)
        done.append((proc.returncode, out.decode("utf-8", "replace")))
    return done


def _build_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("CTX_")}  # fmt: skip
    env.update(extra)
    return env


def _copy_source(into: Path) -> None:
    """The files of the working tree that git does not ignore, as an sdist would see them."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True, check=True,
    )  # fmt: skip
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file() and not source.is_symlink():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)


def _build(top: Path) -> dict:
    """Build the sdist and the wheels of the working tree and install them into two venvs."""
    for source in ("src", "src-tree"):
        _copy_source(top / source)
    env = _build_env()
    first = _finished(
        _quiet([sys.executable, "-m", "pip", "install", "-q", "--target", top / "buildtool",
                "build"], env=env),
        _quiet([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", top / "tree",
                top / "src-tree"], env=env),
        _quiet([BASE_PYTHON, "-m", "venv", top / "venv"], env=env),
        _quiet([BASE_PYTHON, "-m", "venv", top / "bare"], env=env),
    )  # fmt: skip
    for rc, out in first[1:]:
        assert rc == 0, out
    (tree_wheel,) = (top / "tree").glob("cortexfs-*.whl")
    sdist = None
    wheel = tree_wheel
    if first[0][0] == 0:
        [(rc, out)] = _finished(
            _quiet([sys.executable, "-m", "build", "--outdir", top / "dist", top / "src"],
                   env=_build_env(PYTHONPATH=str(top / "buildtool")))
        )  # fmt: skip
        assert rc == 0, out
        (sdist,) = (top / "dist").glob("cortexfs-*.tar.gz")
        (wheel,) = (top / "dist").glob("cortexfs-*.whl")
    pip = ["-m", "pip", "install", "-q", "--disable-pip-version-check"]
    full, bare = _finished(
        _quiet([top / "venv" / "bin" / "python", *pip, f"{wheel}[fuse]"], env=env),
        _quiet([top / "bare" / "bin" / "python", *pip, wheel], env=env),
    )
    assert bare[0] == 0, bare[1]
    fuse = full[0] == 0
    if not fuse:  # pyfuse3 did not install (no wheel, nothing to build it with)
        [(rc, out)] = _finished(_quiet([top / "venv" / "bin" / "python", *pip, wheel], env=env))
        assert rc == 0, out
    return {"sdist": sdist and str(sdist), "wheel": str(wheel), "tree_wheel": str(tree_wheel),
            "fuse": fuse}  # fmt: skip


def _run_key(config: pytest.Config) -> str:
    """The same for every pytest process of one run (xdist gives its workers one id)."""
    worker_input = getattr(config, "workerinput", None)
    if worker_input and worker_input.get("testrunuid"):
        return str(worker_input["testrunuid"])
    return f"p{os.getpid()}"


def _remove_unused_builds(keep: Path) -> None:
    """Builds of earlier runs that no process holds any more (each holder keeps a shared
    lock on its ``inuse`` file for as long as it uses the build)."""
    for top in SCRATCH.glob("build-*"):
        if top == keep:
            continue
        try:
            holder = open(top / "inuse")  # noqa: SIM115 - kept open to hold the lock
        except OSError:
            shutil.rmtree(top, ignore_errors=True)
            continue
        with holder:
            try:
                fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def install(request: pytest.FixtureRequest) -> Iterator[Install]:
    SCRATCH.mkdir(mode=0o755, exist_ok=True)
    SCRATCH.chmod(0o755)
    top = SCRATCH / f"build-{_run_key(request.config)}"
    with open(SCRATCH / "lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _remove_unused_builds(keep=top)
        if not (top / "ready").exists():
            shutil.rmtree(top, ignore_errors=True)
            top.mkdir(mode=0o755)
            top.chmod(0o755)
            (top / "inuse").touch()
            (top / "ready").write_text(json.dumps(_build(top)))
        holder = open(top / "inuse")  # noqa: SIM115 - held until the module is done
        fcntl.flock(holder, fcntl.LOCK_SH)
    built = json.loads((top / "ready").read_text())
    try:
        yield Install(
            top=top,
            sdist=Path(built["sdist"]) if built["sdist"] else None,
            wheel=Path(built["wheel"]),
            tree_wheel=Path(built["tree_wheel"]),
            venv=top / "venv",
            bare=top / "bare",
            fuse=built["fuse"],
        )
    finally:
        with open(SCRATCH / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            fcntl.flock(holder, fcntl.LOCK_UN)
            try:
                fcntl.flock(holder, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass  # another process of this run still uses it
            else:
                shutil.rmtree(top, ignore_errors=True)
            holder.close()


# ------------------------------------------------------------------------------ running it


@dataclass(repr=False)
class Ran:
    argv: list[str]
    rc: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)

    def frames(self) -> list[dict]:
        return [json.loads(line) for line in self.out.splitlines() if line.strip()]

    def __repr__(self) -> str:
        return (
            f"$ {' '.join(self.argv)}\nexit {self.rc}\nstdout: {self.out!r}\nstderr: {self.err!r}"
        )


def user_env(venv: Path, **extra: str) -> dict[str, str]:
    """A shell of someone who activated ``venv``: its bin first on PATH, nothing of the
    checkout on PATH, no PYTHONPATH, no CortexFS setting."""
    env = _build_env()
    kept = [p for p in env.get("PATH", "/usr/bin:/bin").split(":")
            if p and not p.startswith(str(REPO))]  # fmt: skip
    env["PATH"] = ":".join([str(venv / "bin"), *kept])
    env.update(extra)
    return env


def run(
    program: Path,
    *args,
    cwd: Path,
    env: dict[str, str],
    input: str = "",
    user: UnprivilegedUser | None = None,
    timeout: float = 60,
) -> Ran:
    assert REPO not in cwd.resolve().parents and cwd.resolve() != REPO
    as_user = {} if user is None else {"user": user.uid, "group": user.gid, "extra_groups": []}
    argv = [str(program), *map(str, args)]
    proc = subprocess.run(argv, input=input.encode(), capture_output=True, env=env, cwd=cwd,
                          timeout=timeout, **as_user)  # fmt: skip
    return Ran(argv, proc.returncode, proc.stdout.decode("utf-8", "replace"),
               proc.stderr.decode("utf-8", "replace"))  # fmt: skip


@dataclass
class World:
    """A user's directory outside the checkout: a storage root (not made yet), a workspace
    the agent may write, and the installed ``ctx`` aimed at that root."""

    install: Install
    top: Path

    @property
    def storage(self) -> Path:
        return self.top / "storage"

    @property
    def ws(self) -> Path:
        return self.top / "ws"

    def env(self, bare: bool = False, **extra: str) -> dict[str, str]:
        venv = self.install.bare if bare else self.install.venv
        return user_env(venv, CTX_STORAGE=str(self.storage), **extra)

    def ctx(self, *args, bare: bool = False, cwd: Path | None = None, **kw) -> Ran:
        kw.setdefault("env", self.env(bare))
        return run(self.install.program("ctx", bare), *args, cwd=cwd or self.ws, **kw)

    def ctxmcp(self, *args, **kw) -> Ran:
        return run(self.install.program("ctxmcp"), *args, cwd=self.ws, env=self.env(), **kw)

    def bootstrap(self, bare: bool = False) -> Ran:
        r = self.ctx("bootstrap", "--storage", self.storage, bare=bare)
        assert r.rc == 0, r
        return r

    def coder(
        self, user: UnprivilegedUser, tools: list[str], *extra_mounts: list, bare: bool = False
    ) -> None:
        """Agent ``coder`` (label coder_t) running as ``user``, ``tools`` allowed in both
        policy layers (P-6)."""
        request = {"name": "coder", "label": LABEL, "tools": tools,
                   "mount": [[str(self.ws), "/workspace", "rw"], *extra_mounts]}  # fmt: skip
        path = self.top / "coder.json"
        path.write_text(json.dumps(request))
        r = self.ctx("agent", "create", "--user", user.name, path, bare=bare)
        assert r.rc == 0, r
        for tool in tools:
            with (self.storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
                policy.write(f"allow {LABEL} tool:{tool} execute\n")

    def session_events(self, user: UnprivilegedUser, session: str = "default") -> list[dict]:
        where = self.storage / "home" / str(user.uid) / "agent" / "coder" / "session"
        return read_jsonl(where / session / "events.jsonl")


@pytest.fixture
def world(install: Install) -> Iterator[World]:
    top = new_scratch_dir(SCRATCH, "world-")
    (top / "ws").mkdir()
    (top / "ws").chmod(0o777)
    try:
        yield World(install, top)
    finally:
        kill_processes_of(top)
        for mountpoint in sorted(top.rglob("mnt*"), reverse=True):
            if mounted_at(mountpoint):
                subprocess.run(["umount", "-l", str(mountpoint)], check=False)
        shutil.rmtree(top, ignore_errors=True)


def spec_pages() -> dict[str, bytes]:
    """D-1: the bundle's README.md and man pages, as docs/spec holds them."""
    return {path.name: path.read_bytes() for path in SPEC_DOCS.glob("*.md")}


def wheel_names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def wheel_text(wheel: Path, suffix: str) -> str:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(suffix)]
        return archive.read(name).decode()


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(metadata: str) -> dict[str, str | None]:
    """Requires-Dist of METADATA: canonical distribution name -> extra (None: always)."""
    found: dict[str, str | None] = {}
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist:"):
            requirement = line.split(":", 1)[1].strip()
            name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)
            extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", requirement)
            found[canonical(name)] = extra.group(1) if extra else None
    return found


def top_level_imports(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


# ========================================================================== the package


def test_the_wheel_carries_the_package_its_run_time_data_and_entry_points_only(install):
    names = wheel_names(install.wheel)
    tops = {name.split("/")[0] for name in names}
    assert tops == {"cortexfs", install.wheel.name.split("-py")[0] + ".dist-info"}, tops
    shipped_caches = [n for n in names
                      if n.endswith(CACHE_SUFFIXES) or set(n.split("/")) & CACHE_PARTS]  # fmt: skip
    assert shipped_caches == []
    tests_shipped = [
        n for n in names if re.search(r"(^|/)(tests?/|conftest\.py$|test_[^/]*\.py$)", n)
    ]
    assert tests_shipped == []
    # Every module of the checkout's package is there.
    package = {str(p.relative_to(REPO)) for p in (REPO / "cortexfs").rglob("*.py")
               if "__pycache__" not in p.parts}  # fmt: skip
    assert package - set(names) == set()
    # Data read at run time: each core tool's manifest as the checkout holds it, and the
    # manual pages that mirror docs/spec (D-1).
    with zipfile.ZipFile(install.wheel) as archive:
        for manifest in CORE_MANIFESTS.glob("*.json"):
            inside = f"cortexfs/tools/core/manifests/{manifest.name}"
            assert archive.read(inside) == manifest.read_bytes(), inside
        pages = {n.rsplit("/", 1)[1]: archive.read(n) for n in names
                 if n.startswith("cortexfs/manual/pages/") and n.endswith(".md")}  # fmt: skip
    assert pages == spec_pages()
    assert {f"ctx.{topic}.md" for topic in MAN_PAGES} | {"README.md"} == set(pages)
    entry_points = wheel_text(install.wheel, ".dist-info/entry_points.txt")
    scripts = re.findall(r"^(\S+)\s*=\s*(\S+)\s*$", entry_points.split("[console_scripts]")[1],
                         flags=re.MULTILINE)  # fmt: skip
    assert dict(scripts) == {"ctx": "cortexfs.cli:main", "ctxmcp": "cortexfs.cli.ctxmcp:main"}


def test_the_metadata_names_the_python_and_every_distribution_the_code_imports(install):
    metadata = wheel_text(install.wheel, ".dist-info/METADATA")
    assert re.search(r"^Requires-Python: >=3\.11$", metadata, flags=re.MULTILINE), metadata
    assert re.search(r"^Version: 0\.1\.0$", metadata, flags=re.MULTILINE)
    # The licence the metadata declares comes with the wheel, as its text.
    assert re.search(r"^License-Expression: Apache-2\.0$", metadata, flags=re.MULTILINE)
    assert re.search(r"^License-File: LICENSE$", metadata, flags=re.MULTILINE), metadata
    licence = wheel_text(install.wheel, ".dist-info/licenses/LICENSE")
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    requires = declared(metadata)
    assert {"click", "psutil", "jsonschema"} <= {n for n, extra in requires.items() if not extra}
    assert {"pyfuse3", "trio"} <= {n for n, extra in requires.items() if extra == "fuse"}
    # The third-party modules the installed code imports, and the distributions that give
    # them in the venv: each must be declared, unconditionally outside cortexfs/fuse/.
    imported: dict[str, set[str]] = {}
    with zipfile.ZipFile(install.wheel) as archive:
        for name in archive.namelist():
            if name.endswith(".py"):
                for module in top_level_imports(archive.read(name).decode()):
                    if module not in sys.stdlib_module_names and module != "cortexfs":
                        imported.setdefault(module, set()).add(name)
    assert {"click", "psutil", "jsonschema"} <= set(imported)
    mapping = subprocess.run(
        [install.program("python"), "-I", "-c",
         "import importlib.metadata as m, json; print(json.dumps(m.packages_distributions()))"],
        capture_output=True, text=True, check=True, cwd=install.top,
    )  # fmt: skip
    distributions = json.loads(mapping.stdout)
    undeclared = {}
    for module, where in imported.items():
        given_by = {canonical(d) for d in distributions.get(module, [])}
        needed_always = any(not name.startswith("cortexfs/fuse/") for name in where)
        ok = {d for d in given_by if d in requires and (requires[d] is None or not needed_always)}
        if not ok:
            undeclared[module] = sorted(where)
    assert undeclared == {}


@pytest.mark.skipif(shutil.which("tar") is None, reason="needs tar")
def test_the_sdist_holds_the_sources_and_builds_the_same_wheel_as_the_tree(install):
    if install.sdist is None:
        pytest.skip("the build frontend could not be installed from the package index")
    with tarfile.open(install.sdist) as archive:
        names = [member.name.split("/", 1)[1] for member in archive.getmembers()
                 if "/" in member.name]  # fmt: skip
    assert {"pyproject.toml", "README.md", "PKG-INFO"} <= set(names)
    caches = [n for n in names if n.endswith(CACHE_SUFFIXES) or set(n.split("/")) & CACHE_PARTS
              or n.startswith(("build/", "dist/"))]  # fmt: skip
    assert caches == []
    for manifest in CORE_MANIFESTS.glob("*.json"):
        assert f"cortexfs/tools/core/manifests/{manifest.name}" in names
    for page in spec_pages():
        assert f"cortexfs/manual/pages/{page}" in names
    # What a package index user builds from the sdist is what pip builds from the checkout.
    assert sorted(wheel_names(install.wheel)) == sorted(wheel_names(install.tree_wheel))


def test_version_and_help_of_both_commands_from_outside_the_checkout(install, tmp_path):
    tmp_path.chmod(0o755)
    env = user_env(install.venv)
    located = subprocess.run(
        [install.program("python"), "-c", "import cortexfs; print(cortexfs.__file__)"],
        capture_output=True, text=True, env=env, cwd=tmp_path, check=True,
    )  # fmt: skip
    assert Path(located.stdout.strip()).is_relative_to(install.site_packages()), located.stdout
    for program in ("ctx", "ctxmcp"):
        version = run(install.program(program), "--version", cwd=tmp_path, env=env)
        assert version.rc == 0 and version.out.strip() == f"{program}, version 0.1.0", version
    module = subprocess.run([install.program("python"), "-m", "cortexfs", "--version"],
                            capture_output=True, text=True, env=env, cwd=tmp_path)  # fmt: skip
    assert module.returncode == 0 and "0.1.0" in module.stdout, module
    helped = run(install.program("ctx"), "--help", cwd=tmp_path, env=env)
    assert helped.rc == 0 and helped.err == "", helped
    listed = set(re.findall(r"^  (\S+)\s", helped.out.split("Commands:")[1], flags=re.MULTILINE))
    assert listed == CTX_COMMANDS, helped
    mcp_help = run(install.program("ctxmcp"), "--help", cwd=tmp_path, env=env)
    assert mcp_help.rc == 0 and {"list", "project"} <= set(mcp_help.out.split()), mcp_help
    bad = run(install.program("ctx"), "no-such-command", cwd=tmp_path, env=env)
    assert bad.rc == 2 and "Traceback" not in bad.err, bad


# ========================================================================== bootstrap, tools


def test_bootstrap_of_a_fresh_root_installs_the_core_tools_and_manual_from_the_package(world):
    made = world.bootstrap()
    assert "Traceback" not in made.err, made
    root = world.storage
    assert {p.name for p in root.iterdir()} == ROOT_ENTRIES
    site = world.install.site_packages()
    for tool in CORE_TOOLS:
        entry = root / "tool" / tool
        assert entry.is_file() and os.stat(entry).st_mode & stat.S_IXOTH, tool
        origin = json.loads((root / "tool" / f"{tool}.d" / "origin").read_text())
        assert Path(origin["manifest"]).is_relative_to(site), origin
    assert (root / "tool" / "tsh.d" / "config").is_file()
    for name in ("tsh", "ctxterm"):
        assert (root / "bin" / name).is_file()
    bundle = root / "shared" / "cortexfs-docs"
    installed = {"README.md": (bundle / "README.md").read_bytes()}
    installed.update({p.name: p.read_bytes() for p in (bundle / "man").iterdir()})
    assert installed == spec_pages()
    before = {str(p.relative_to(root)) for p in root.rglob("*")}
    again = world.bootstrap()
    assert {str(p.relative_to(root)) for p in root.rglob("*")} == before, again
    # Nothing the installed ctx wrote points back into the checkout.
    checkout = str(REPO).encode()
    mentions = [str(p) for p in root.rglob("*")
                if p.is_file() and not p.is_symlink() and checkout in p.read_bytes()]  # fmt: skip
    assert mentions == []


@needs_root
def test_core_tools_run_as_an_agent_of_another_uid_in_both_modes(world, unprivileged_user):
    user = unprivileged_user
    world.bootstrap()
    world.coder(user, ["fs.read", "fs.list", "fs.stat", "fs.write", "shell.exec"])
    (world.ws / "note.txt").write_text("hello from the host\n")
    ran = world.ctx("run", "--agent", "coder", "fs.read", "/workspace/note.txt")
    assert ran.rc == 0 and ran.out == "hello from the host\n", ran
    listed = world.ctx("run", "--agent", "coder", "fs.list", "/workspace")
    assert listed.rc == 0 and "note.txt" in listed.out.split(), listed
    stat_of = world.ctx("run", "--native", "--agent", "coder", "fs.stat",
                        input=json.dumps({"path": "/workspace/note.txt"}))  # fmt: skip
    assert stat_of.rc == 0 and stat_of.frames()[-1]["status"] == "ok", stat_of
    assert stat_of.frames()[-1]["output"]["size"] == len("hello from the host\n"), stat_of
    written = {"path": "/workspace/out.txt", "content": "made"}
    wrote = world.ctx("run", "--native", "--agent", "coder", "fs.write",
                      input=json.dumps(written))  # fmt: skip
    assert wrote.rc == 0 and wrote.frames()[-1]["status"] == "ok", wrote
    assert (world.ws / "out.txt").read_text() == "made"
    assert (world.ws / "out.txt").stat().st_uid == user.uid
    shell = world.ctx("run", "--native", "--agent", "coder", "shell.exec",
                      input=json.dumps({"cmd": "id -u"}))  # fmt: skip
    result = shell.frames()[-1]
    assert shell.rc == 0 and result["status"] == "ok", shell
    assert str(result["output"]).strip() == str(user.uid), shell
    # A tool the agent's policy does not allow is refused (P-6), in terminal mode 126.
    (world.storage / "tool" / "fs.read.d" / "policy").write_text("")
    refused = world.ctx("run", "--agent", "coder", "fs.read", "/workspace/note.txt")
    assert refused.rc == 126 and "EACCES" in refused.err and refused.out == "", refused
    events = world.session_events(user)
    results = [e for e in events if e["type"] == "tool_result"]
    assert len(results) == 6, events
    assert [e["status"] for e in results].count("ok") == 5, events
    # The package directory holds what pip installed and nothing the runs wrote.
    site = world.install.site_packages()
    record = (next(site.glob("cortexfs-*.dist-info")) / "RECORD").read_text()
    recorded = {line.split(",")[0] for line in record.splitlines()}
    present = {str(p.relative_to(site)) for p in (site / "cortexfs").rglob("*")
               if p.is_file() and "__pycache__" not in p.parts}  # fmt: skip
    assert present - recorded == set()


# ========================================================================== queue, workers


@needs_root
def test_publish_claim_finish_recover_and_workers_from_the_installed_package(
    world, unprivileged_user
):
    user = unprivileged_user
    world.bootstrap()
    world.coder(user, ["shell.exec", "fs.stat"])
    assert world.ctx("queue", "init", "--project", "build").rc == 0
    queue = world.storage / "shared" / "build" / "queue"
    assert {p.name for p in queue.iterdir() if p.is_dir()} == QUEUE_SUBDIRS

    def publish(name: str, request: dict) -> str:
        r = world.ctx("queue", "publish", "--project", "build", "--name", name, "-",
                      input=json.dumps(request))  # fmt: skip
        assert r.rc == 0 and r.out == f"{name}{SUFFIX}\n", r
        return r.out.strip()

    first = publish("first", {"tool": "fs.stat", "input": {"path": "/workspace"}})
    twice = world.ctx("queue", "publish", "--project", "build", "--name", "first", "-",
                      input=json.dumps({"tool": "fs.stat", "input": {}}))  # fmt: skip
    assert twice.rc == 1 and "EEXIST" in twice.err, twice
    claimed = world.ctx("queue", "claim", "--project", "build", "--ttl", "60")
    assert claimed.rc == 0 and claimed.out.strip() == first, claimed
    lease = json.loads((queue / "lease" / first / "worker").read_text())
    assert lease["pid"] == os.getpid(), lease
    finished = world.ctx("queue", "finish", "--project", "build", first, "--ok", "-",
                         input=json.dumps({"by": "hand"}))  # fmt: skip
    assert finished.rc == 0, finished
    assert json.loads((queue / "done" / f"{first}.result").read_text())["status"] == "ok"
    # A claim whose holder is gone goes back to pending.
    second = publish("second", {"tool": "shell.exec", "input": {"cmd": "id -u > who"}})
    holder = subprocess.Popen(["sleep", "60"])
    try:
        got = world.ctx("queue", "claim", "--project", "build", "--pid", str(holder.pid))
        assert got.rc == 0 and got.out.strip() == second, got
    finally:
        holder.kill()
        holder.wait()
    recovered = world.ctx("queue", "recover", "--project", "build", "--json")
    assert recovered.rc == 0, recovered
    assert [job["job"] for job in recovered.json()["requeued"]] == [second], recovered
    assert (queue / "pending" / second).is_file()
    # The worker runs it as the agent (W-1) and exits when the queue is empty (W-2).
    worked = world.ctx("queue", "work", "--project", "build", "--agent", "coder", "--drain",
                       "--json", timeout=120)  # fmt: skip
    assert worked.rc == 0, worked
    assert (world.ws / "who").read_text().strip() == str(user.uid)
    # The ready shell worker of W-5, as the package gives it.
    third = publish("third", {"tool": "shell.exec", "input": {"cmd": "echo third > third"}})
    shell = world.ctx("queue", "work", "--kind", "shell", "--project", "build", "--agent",
                      "coder", "--drain", timeout=120)  # fmt: skip
    assert shell.rc == 0, shell
    assert (world.ws / "third").read_text() == "third\n"
    status = world.ctx("queue", "status", "--project", "build", "--json").json()
    assert status["counts"]["done"] == 3 and status["counts"]["pending"] == 0, status
    for job in (first, second, third):
        assert (queue / "done" / job).is_file() and (queue / "done" / f"{job}.result").is_file()


@needs_root
def test_an_ordinary_user_bootstraps_the_embedded_default_and_uses_the_queue(
    install, unprivileged_user
):
    user = unprivileged_user
    top = new_scratch_dir(SCRATCH, "home-")
    try:
        home = top / "home"
        home.mkdir()
        os.chown(home, user.uid, user.gid)
        env = user_env(install.venv, HOME=str(home), USER=user.name, LOGNAME=user.name)
        env.pop("XDG_DATA_HOME", None)

        def ctx(*args, input: str = "") -> Ran:
            return run(install.program("ctx"), *args, cwd=home, env=env, input=input, user=user)

        made = ctx("bootstrap")
        assert made.rc == 0, made
        root = home / ".local" / "share" / "cortexfs" / "storage" / "current"
        assert {p.name for p in root.iterdir()} == ROOT_ENTRIES, made
        assert root.stat().st_uid == user.uid
        assert ctx("queue", "init", "--project", "mine").rc == 0
        published = ctx("queue", "publish", "--project", "mine", "-",
                        input=json.dumps({"tool": "fs.stat", "input": {"path": "/"}}))  # fmt: skip
        assert published.rc == 0, published
        job = published.out.strip()
        claimed = ctx("queue", "claim", "--project", "mine")
        assert claimed.rc == 0 and claimed.out.strip() == job, claimed
        finished = ctx("queue", "finish", "--project", "mine", job, "--error", "-", input="{}")
        assert finished.rc == 0, finished
        queue = root / "shared" / "mine" / "queue"
        assert (queue / "failed" / job).is_file() and (queue / "failed" / f"{job}.result").is_file()
        page = ctx("man", "session")
        assert page.rc == 0 and page.out.encode() == (SPEC_DOCS / "ctx.session.md").read_bytes()
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ========================================================================== the manual


def test_the_manual_comes_from_the_package_before_bootstrap_and_from_the_bundle_after(world):
    for topic, page in MAN_PAGES.items():
        built_in = world.ctx("man", topic)
        assert built_in.rc == 0, built_in
        assert built_in.out.encode() == (SPEC_DOCS / page).read_bytes(), topic
        assert "built into ctx" in built_in.err, built_in
    assert not world.storage.exists()  # reading the manual made no storage root
    world.bootstrap()
    listed = world.ctx("man")
    assert listed.rc == 0, listed
    assert set(MAN_PAGES) | {"README"} <= {line.split()[0] for line in listed.out.splitlines()}
    for topic, page in MAN_PAGES.items():
        installed = world.ctx("man", topic)
        assert installed.rc == 0 and installed.err == "", installed
        assert installed.out.encode() == (SPEC_DOCS / page).read_bytes(), topic
    readme = world.ctx("man", "README")
    assert readme.rc == 0 and readme.out.encode() == (SPEC_DOCS / "README.md").read_bytes()
    unknown = world.ctx("man", "nonesuch")
    assert unknown.rc == 1 and "ENOENT" in unknown.err, unknown


# ========================================================================== ctxmcp


ECHO_SERVER = (
    WIRE
    + r"""
while True:
    message = receive()
    if "id" not in message:
        continue
    method = message["method"]
    if method == "initialize":
        answer = {"protocolVersion": message["params"]["protocolVersion"],
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "echo", "version": "1"}}
    elif method == "tools/list":
        answer = {"tools": [
            {"name": "say", "description": "Echo the text.",
             "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}},
                             "required": ["text"]}},
            {"name": "bad/name", "description": "Not an object name.",
             "inputSchema": {"type": "object"}}]}
    elif method == "tools/call":
        answer = {"content": [{"type": "text",
                               "text": "said " + message["params"]["arguments"]["text"]}]}
    else:
        send({"jsonrpc": "2.0", "id": message["id"],
              "error": {"code": -32601, "message": "unknown method"}})
        continue
    send({"jsonrpc": "2.0", "id": message["id"], "result": answer})
"""
)


@needs_root
def test_ctxmcp_projects_a_stdio_server_whose_tool_then_runs_as_an_agent(world, unprivileged_user):
    world.bootstrap()
    mcp = world.top / "mcp"
    mcp.mkdir(mode=0o755)
    (mcp / "server.py").write_text(ECHO_SERVER)
    config = {"mcpServers": {"echo": {"command": str(BASE_PYTHON),
                                      "args": [str(mcp / "server.py")]}}}  # fmt: skip
    (mcp / "mcp.json").write_text(json.dumps(config))
    for name in ("server.py", "mcp.json"):
        (mcp / name).chmod(0o644)
    listed = world.ctxmcp("list", "--config", mcp / "mcp.json", "--server", "echo")
    assert "echo.say\tEcho the text." in listed.out.splitlines(), listed
    before = sorted(p.name for p in world.storage.rglob("*"))
    out = world.top / "candidates"
    projected = world.ctxmcp("project", "--config", mcp / "mcp.json", "--runtime-config",
                             "/mcp/mcp.json", "--server", "echo", "--out", out)  # fmt: skip
    # M-3: the illegal projected name is reported and skipped (exit 1), the other written.
    assert projected.rc == 1 and "bad/name" in projected.err, projected
    assert sorted(p.name for p in out.iterdir()) == ["echo.say.manifest.json"], projected
    assert sorted(p.name for p in world.storage.rglob("*")) == before  # M-1: nothing installed
    manifest = json.loads((out / "echo.say.manifest.json").read_text())
    assert manifest["mcp"] == {"transport": "stdio", "config": "/mcp/mcp.json",
                               "server": "echo", "tool": "say"}  # fmt: skip
    installed = world.ctx("object", "install", out / "echo.say.manifest.json", "--tier", "system")
    assert installed.rc == 0, installed
    world.coder(unprivileged_user, ["echo.say"], [str(mcp), "/mcp", "ro"])
    said = world.ctx("run", "--native", "--agent", "coder", "echo.say",
                     input=json.dumps({"text": "hi"}))  # fmt: skip
    result = said.frames()[-1]
    assert said.rc == 0 and result["status"] == "ok", said
    assert result["output"]["content"] == [{"type": "text", "text": "said hi"}], said


# ========================================================================== terminal, mount


def needs_fuse_extra(install: Install) -> None:
    if not install.fuse:
        pytest.skip("the fuse extra (pyfuse3) did not install")
    if not os.path.exists("/dev/fuse") or shutil.which("bwrap") is None:
        pytest.skip("needs /dev/fuse and bubblewrap")


@needs_root
def test_an_agent_terminal_of_the_installed_package_runs_tools_through_tsh(
    world, unprivileged_user
):
    needs_fuse_extra(world.install)
    world.bootstrap()
    world.coder(unprivileged_user, ["fs.read"])
    (world.ws / "note.txt").write_text("seen by tsh\n")
    started = world.ctx("agent", "start", "coder", "--json", timeout=60)
    assert started.rc == 0, started
    try:
        link = Path(started.json()["socket"])
        assert link == (world.storage / "home" / str(unprivileged_user.uid) / "agent" / "coder"
                        / "session" / "default" / "terminal" / "main.sock")  # fmt: skip
        client = Raw(link, b"attach\n")
        try:
            assert client.shows(AGENT_PROMPT), client.text()
            assert client.answer("fs.read note.txt") == "seen by tsh\n"
            refused = client.answer("fs.list /workspace")
            assert "fs.list: not a tool on CTX_PATH" in refused, refused  # not granted
        finally:
            client.close()
    finally:
        stopped = world.ctx("agent", "stop", "coder")
    assert stopped.rc == 0, stopped
    assert wait_for(lambda: not link.exists(), 10)


@needs_root
def test_the_mount_of_the_installed_package_shows_the_root_abi_and_runs_tools(world):
    needs_fuse_extra(world.install)
    world.bootstrap()
    where = world.top / "mnt"
    where.mkdir()
    log = world.top / "mount.stderr"
    with open(log, "wb") as err:
        daemon = subprocess.Popen(
            [world.install.program("ctx"), "mount", "--storage", world.storage, where],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, cwd=world.ws,
            env=world.env(), start_new_session=True,
        )  # fmt: skip
    try:
        assert wait_for(lambda: mounted_at(where) or daemon.poll() is not None, 15)
        assert mounted_at(where), log.read_text()
        assert {p.name for p in where.iterdir()} == ROOT_ENTRIES
        page = where / "shared" / "cortexfs-docs" / "man" / "ctx.tool.md"
        assert page.read_bytes() == (SPEC_DOCS / "ctx.tool.md").read_bytes()
        stat_of = subprocess.run(
            [where / "tool" / "fs.stat", json.dumps({"path": "/"})],
            capture_output=True, text=True, cwd=world.ws, timeout=60,
        )  # fmt: skip
        assert stat_of.returncode == 0 and "type: directory" in stat_of.stdout, stat_of
    finally:
        unmounted = world.ctx("umount", where)
        with contextlib.suppress(subprocess.TimeoutExpired):
            daemon.wait(timeout=15)
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert unmounted.rc == 0 and not mounted_at(where), unmounted
    assert daemon.returncode == 0, log.read_text()


# ========================================================================== without the extra


def test_without_the_fuse_extra_the_queue_works_and_the_mount_names_the_extra(world):
    world.bootstrap(bare=True)
    assert world.ctx("queue", "init", "--project", "p", bare=True).rc == 0
    request = {"tool": "fs.stat", "input": {"path": "/"}}
    published = world.ctx("queue", "publish", "--project", "p", "-", bare=True,
                          input=json.dumps(request))  # fmt: skip
    assert published.rc == 0, published
    where = world.top / "mnt"
    where.mkdir()
    mounted = world.ctx("mount", "--storage", world.storage, where, bare=True, timeout=30)
    assert mounted.rc == 1 and not mounted_at(where), mounted
    assert "fuse" in mounted.err and "Traceback" not in mounted.err, mounted


@needs_root
def test_without_the_fuse_extra_an_agent_start_names_what_to_install(world, unprivileged_user):
    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap")
    world.bootstrap(bare=True)
    world.coder(unprivileged_user, ["fs.read"], bare=True)
    started = world.ctx("agent", "start", "coder", bare=True, timeout=60)
    assert started.rc != 0 and "Traceback" not in started.err, started
    assert "fuse" in started.err, started
