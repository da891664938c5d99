"""``ctx bootstrap`` for tools: the core tools, tsh and ctxterm, ``tool/tsh.d/config``,
interrupted installs (R-5, H-1).

Each core tool is installed through the ordinary lifecycle (:func:`cortexfs.tools.install.
install_tool`) from its manifest in ``manifests/`` and the self-contained launcher that
:mod:`cortexfs.tools.core.launcher` renders.  A core tool is reinstalled when it is missing,
damaged, or differs from what this version would install; its policy, status, log and hooks
are kept (:mod:`cortexfs.tools.pairs`).  Whatever stands in its place and was not written by
an install (a directory at ``tool/<name>``, a file at ``tool/<name>.d``…) is the user's: it is
reported as a problem and left untouched.  ``tool/tsh.d/config`` is created with the defaults
of H-4 when missing and never overwritten.

H-1 names ``/ctx/bin/ctxterm``, ``/ctx/bin/tsh`` and ``/ctx/tool/tsh``: ``tool/tsh`` is an
ordinary tool object (its manifest ``manifests/tsh.json``, its policy granting nothing, its
controls in ``tool/tsh.d/`` beside ``config``) whose program is ``bin/tsh``'s, and
``bin/ctxterm`` starts an agent terminal in the foreground (:mod:`cortexfs.cli.ctxterm`).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from pathlib import Path

from cortexfs import durable, storage
from cortexfs.errors import CtxError
from cortexfs.tools.controls import (
    STATUS_UNAVAILABLE,
    ToolObject,
    layout_problems,
    read_control,
)
from cortexfs.tools.core import CORE_TOOLS, tsh_config
from cortexfs.tools.core.launcher import (
    bundled_modules,
    core_interpreter,
    package_parent,
    render_ctxterm,
    render_launcher,
)
from cortexfs.tools.install import (
    TOOL_KIND,
    Tier,
    all_tiers,
    install_tool,
    list_tools,
    parse_tier,
    repair_tier,
    tool_obstacles,
)
from cortexfs.tools.manifest import Manifest, parse_manifest

MANIFESTS = Path(__file__).parent / "manifests"


def bootstrap_tools(root: Path, source: Path | None, report: storage.BootstrapReport) -> None:
    """The bootstrap step: finish interrupted installs, then the core tools, the tsh config
    and bin/tsh; last, report every tool of every tier that C-2 makes unavailable.

    Each part stands alone: a problem in one (reported, its cause left untouched) does not keep
    bootstrap from the others."""
    for tier in all_tiers(root, os.getuid()):
        with report.step(tier.location):
            report.repaired += repair_tier(tier)
    interpreter, problem = core_interpreter()
    if problem:
        report.add_problem(problem, errno.ENOEXEC)
    modules = bundled_modules(interpreter, package_parent())  # shared by every core tool
    system = parse_tier(root, "system")
    tsh = render_launcher(interpreter, modules, "tsh")
    if _is_real_directory(system.directory):  # else ensure_root_abi reported what is there
        for name, module in CORE_TOOLS.items():
            with report.step(f"tool/{name}"):
                launcher = render_launcher(interpreter, modules, module)
                _install_core_tool(system, name, launcher, report)
        with report.step("tool/tsh"):  # H-1: tsh is a tool object too; tsh.d/ its controls
            _install_core_tool(system, "tsh", tsh, report)
        with report.step("tool/tsh.d/config"):
            _ensure_tsh_config(root, report)
    if _is_real_directory(root / "bin"):
        with report.step("bin/tsh"):
            _install_program(root, "bin/tsh", tsh, report)
        with report.step("bin/ctxterm"):
            _install_program(root, "bin/ctxterm", render_ctxterm(root), report)
    for tier in all_tiers(root, os.getuid()):
        with report.step(tier.location):
            _report_unavailable_programs(tier, report)


def _report_unavailable_programs(tier: Tier, report: storage.BootstrapReport) -> None:
    """C-2: a tool whose ``program`` control is malformed is unavailable.  The control is the
    author's declaration, so it is reported, not rewritten; reinstalling the tool fixes it."""
    for listing in list_tools([tier]):
        if listing.problems and listing.status == STATUS_UNAVAILABLE:
            report.add_problem(
                f"{tier.location}/{listing.name}: unavailable: {listing.reason}; left untouched",
                errno.ENOEXEC,
            )


def _is_real_directory(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _install_program(
    root: Path, where: str, program: bytes, report: storage.BootstrapReport
) -> None:
    """``bin/<name>``: a program of the root ABI (H-1), replaced whole when it differs."""
    path = root / where
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        status = None
    if status is not None and not stat.S_ISREG(status.st_mode):
        report.add_problem(f"{where}: not a regular file; left untouched", errno.EEXIST)
        return
    current = None if status is None else path.read_bytes()
    if current == program and os.access(path, os.X_OK):
        return
    ops = durable.default_ops()
    directory = durable.open_dir_path(ops, str(path.parent))
    try:
        durable.replace_file_synced(ops, directory, path.name, program, 0o755)
    finally:
        ops.close(directory)
    (report.created if current is None else report.repaired).append(where)


def core_manifest(name: str, exec_path: Path) -> Manifest:
    """The packaged manifest of a core tool, with ``exec`` naming its rendered launcher."""
    path = MANIFESTS / f"{name}.json"
    document = json.loads(path.read_text())
    document["exec"] = str(exec_path)
    return parse_manifest(document, source=path)


def _install_core_tool(
    tier: Tier, name: str, launcher: bytes, report: storage.BootstrapReport
) -> None:
    in_the_way = tool_obstacles(tier, name)
    if in_the_way:
        for obstacle in in_the_way:
            report.add_problem(
                f"{tier.location}/{obstacle.sentence()}; left untouched", errno.EEXIST
            )
        return
    with tempfile.TemporaryDirectory(prefix="cortexfs-core-") as scratch:
        exec_path = Path(scratch) / name
        exec_path.write_bytes(launcher)
        manifest = core_manifest(name, exec_path)
        tool = tier.tool(name)
        present = os.path.lexists(tool.executable)
        if present and _is_current(tool, manifest, launcher):
            return
        install_tool(tier, manifest, launcher)
    (report.repaired if present else report.created).append(f"tool/{name}")


def _is_current(tool: ToolObject, manifest: Manifest, launcher: bytes) -> bool:
    """Complete, and the executable and every control the manifest defines are this version's.
    What the administrator sets (policy, status, hooks) is not compared: it is not damage."""
    if layout_problems(tool):
        return False
    try:
        if tool.executable.read_bytes() != launcher:
            return False
        wanted = manifest.controls()
        unwanted = TOOL_KIND.defined - wanted.keys() - {"origin"}
        return all(read_control(tool, control) == data for control, data in wanted.items()) and all(
            read_control(tool, control) is None for control in unwanted
        )
    except (OSError, CtxError):
        return False


def _ensure_tsh_config(root: Path, report: storage.BootstrapReport) -> None:
    """H-4: ``tool/tsh.d/config`` with its defaults; an existing one is only checked."""
    ops = durable.default_ops()
    tool_fd = durable.open_dir_path(ops, str(root / "tool"))
    try:
        if durable.make_dir_synced(ops, tool_fd, "tsh.d", 0o755):
            report.created.append("tool/tsh.d")
        controls = durable.lstat_at(tool_fd, "tsh.d")
        if controls is None or not stat.S_ISDIR(controls.st_mode):
            report.add_problem("tool/tsh.d is not a directory; left untouched", errno.ENOTDIR)
            return
        config_dir = ops.open_dir("tsh.d", tool_fd)
    finally:
        ops.close(tool_fd)
    try:
        existing = durable.lstat_at(config_dir, "config")
        if existing is None:
            temporary = f".config.{os.urandom(6).hex()}.tmp"
            durable.write_file_synced(ops, config_dir, temporary, tsh_config.DEFAULT_TEXT.encode())
            durable.move_noreplace(ops, config_dir, temporary, config_dir, "config")
            report.created.append("tool/tsh.d/config")
        elif not stat.S_ISREG(existing.st_mode):
            report.add_problem(
                "tool/tsh.d/config is not a regular file; left untouched", errno.EEXIST
            )
        else:
            text = (root / "tool/tsh.d/config").read_text()
            for problem in tsh_config.problems(text):
                report.add_problem(f"tool/{problem}", errno.EINVAL)
    finally:
        ops.close(config_dir)


storage.register_bootstrap_step(bootstrap_tools)
