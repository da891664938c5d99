"""``ctx bootstrap`` for tools: the core tools, tsh and ctxterm, ``tool/tsh.d/config``,
interrupted installs (R-5, H-1).

Each core tool is installed through the ordinary lifecycle (:func:`cortexfs.tools.install.
install_tool`) from its manifest in ``manifests/`` and the self-contained launcher that
:mod:`cortexfs.tools.core.launcher` renders.  A core tool is reinstalled when it is missing,
damaged, or differs from what this version would install; its policy, status, log and hooks
are kept (:mod:`cortexfs.tools.pairs`).  Whatever stands in its place and was not written by
an install (a directory at ``tool/<name>``, a file at ``tool/<name>.d``…) is the user's: it is
reported as a problem and left untouched.  ``tool/tsh.d/config`` is created with the defaults
of H-4 when missing and never overwritten.  What another uid could change is never given back
here: an executable or defined control is written anew by the reinstall, and the
administrator's files (policy, status, log, hooks, config) and the directories holding them
are reported and left as they are (:mod:`cortexfs.bootstrap_repair`).

H-1 names ``/ctx/bin/ctxterm``, ``/ctx/bin/tsh`` and ``/ctx/tool/tsh``: ``tool/tsh`` is an
ordinary tool object (its manifest ``manifests/tsh.json``, its policy granting nothing, its
controls in ``tool/tsh.d/`` beside ``config``) whose program is ``bin/tsh``'s, and
``bin/ctxterm`` starts an agent terminal in the foreground (:mod:`cortexfs.cli.ctxterm`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from pathlib import Path

from cortexfs import bootstrap_repair, durable, storage
from cortexfs.errors import CtxError
from cortexfs.regular_file import read_regular_file
from cortexfs.tools.controls import (
    HOOK_DIRS,
    REQUIRED_FILES,
    STATUS_UNAVAILABLE,
    ToolObject,
    layout_problems,
    read_control,
)
from cortexfs.tools.core import BOOTSTRAP_TOOLS, CORE_TOOLS, tsh_config
from cortexfs.tools.core.installed import administrators_manifest, origin_names_core_manifest
from cortexfs.tools.core.launcher import (
    bundled_modules,
    core_interpreter,
    ctxterm_root,
    package_parent,
    render_ctxterm,
    render_launcher,
    same_program,
)
from cortexfs.tools.install import (
    STATUS_DAMAGED,
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
from cortexfs.tools.pairs import give_if_roots
from cortexfs.tools.remedy import reinstall_advice

MANIFESTS = Path(__file__).parent / "manifests"
# How pair_layout.Obstacle calls a stand-in (a link, a FIFO, a socket, a device).
_STAND_IN_OBSTACLES = ("a symbolic link", "a special file")
# A core tool's controls whose content is the administrator's, not the manifest's.
ADMINISTRATORS_CONTROLS = sorted(set(REQUIRED_FILES) - TOOL_KIND.defined)
# How long bootstrap waits for the lock of a tier other than the system tier: an install
# there takes a moment; a holder that keeps it longer is reported, its tier left as it is.
OTHER_TIER_LOCK_WAIT = 10.0


def bootstrap_tools(root: Path, source: Path | None, report: storage.BootstrapReport) -> None:
    """The bootstrap step: finish the system tier's interrupted installs, then the core
    tools, the tsh config and bin/tsh, then the other tiers' interrupted installs; last,
    report every tool of every tier that C-2 makes unavailable.

    Each part stands alone: a problem in one (reported, its cause left untouched) does not keep
    bootstrap from the others.  The system tier comes first, and another tier's lock is
    waited for :data:`OTHER_TIER_LOCK_WAIT` seconds at most: whoever may write a space's
    ``tool/`` (its group, in a space an older version made) may hold a lock file of its own
    there for ever, which must keep neither the core tools nor the other tiers from their
    repair.  Nothing is written into ``tool/``, a core tool's control
    directory or its hook directories while another uid could change them: they hold the
    administrator's policies and hooks, which bootstrap cannot vouch for
    (:mod:`cortexfs.bootstrap_repair`; ``tool/`` itself is reported by the root's step)."""
    owner = bootstrap_repair.storage_owner(root)
    system = parse_tier(root, "system")
    system_usable = _is_real_directory(system.directory) and not bootstrap_repair.untrusted(
        system.directory.lstat(), owner
    )
    if system_usable:
        with report.step(system.location):
            report.repaired += repair_tier(system)
    interpreter, problem = core_interpreter()
    if problem:
        report.add_problem(problem, errno.ENOEXEC)
    modules = bundled_modules(interpreter, package_parent())  # shared by every core tool
    tsh = render_launcher(interpreter, modules, "tsh")
    if system_usable:  # else the root's step reported what is there
        for name, module in CORE_TOOLS.items():
            if _reported_as_administrators(system, name, report):
                continue
            with report.step(f"tool/{name}"):
                if not _report_held_directories(root, name, owner, report):
                    launcher = render_launcher(interpreter, modules, module)
                    _install_core_tool(system, name, launcher, owner, report)
            _report_held_files(root, name, owner, report)
        if not _reported_as_administrators(system, "tsh", report):
            with report.step("tool/tsh"):  # H-1: tsh is a tool object too; tsh.d/ its controls
                if not _report_held_directories(root, "tsh", owner, report):
                    _install_core_tool(system, "tsh", tsh, owner, report)
                    with report.step("tool/tsh.d/config"):
                        _ensure_tsh_config(root, owner, report)
            _report_held_files(root, "tsh", owner, report)
    if _is_real_directory(root / "bin"):
        with report.step("bin/tsh"):
            _install_program(root, "bin/tsh", tsh, owner, report)
        with report.step("bin/ctxterm"):
            _install_program(root, "bin/ctxterm", _ctxterm_of(root), owner, report)
    # Never a tier reached through a link ('shared' or a space's 'tool' made one by a user):
    # what it leads to is outside the root, and no repair or report of bootstrap's.
    tiers = [tier for tier in all_tiers(root, os.getuid()) if tier.reached_without_links()]
    for tier in tiers:
        if tier.name != "system":
            with report.step(tier.location):
                report.repaired += repair_tier(tier, wait=OTHER_TIER_LOCK_WAIT)
    for tier in tiers:
        with report.step(tier.location):
            _report_tools_it_does_not_repair(tier, report)


def _reported_as_administrators(tier: Tier, name: str, report: storage.BootstrapReport) -> bool:
    """True, after reporting it as a problem, when the tool at core name ``name`` is an
    administrator's own, installed before the name became core
    (:func:`cortexfs.tools.core.installed.administrators_manifest`): putting the core tool in
    its place would destroy it (R-5), and hand its policy and every agent's grant of it to a
    tool that may do far more.  It is left as it is, and so the core tool is not installed.
    True too when whose it is could not be judged (reported by the step)."""
    with report.step(f"tool/{name}"):
        manifest = administrators_manifest(tier, name)
        if manifest is None:
            return False
        report.add_problem(
            f"tool/{name} is an administrator's tool (installed from {manifest}) with the name "
            f"of a core tool of this version, so bootstrap leaves it as it is and installs no "
            f"core {name}: reinstall it under another name ('ctx object install'), moving the "
            f"policy lines and agents' grants that name {name} to the new name, remove "
            f"{tier.directory / name} and {tier.directory / name}.d, then run 'ctx bootstrap' "
            "again",
            errno.EEXIST,
        )
    # Not judged (the step reported why: no descriptor left...): nothing is replaced on
    # a guess, and the next bootstrap judges it.
    return True


def _report_tools_it_does_not_repair(tier: Tier, report: storage.BootstrapReport) -> None:
    """C-2: a tool whose ``program`` control is malformed is unavailable.  The control is the
    author's declaration, so it is reported, not rewritten; reinstalling the tool fixes it.

    A damaged tool other than the core tools (a user's, a shared space's, or one installed in
    the system tier) is its installer's: bootstrap has no manifest to reinstall it from, so it
    says so in a warning, with the reinstall that fixes it, rather than call the root
    complete."""
    for listing in list_tools([tier]):
        if listing.problems and listing.status == STATUS_UNAVAILABLE:
            report.add_problem(
                f"{tier.location}/{listing.name}: unavailable: {listing.reason}; left untouched",
                errno.ENOEXEC,
            )
        elif listing.status == STATUS_DAMAGED and not (
            tier.name == "system" and listing.name in BOOTSTRAP_TOOLS
        ):
            advice = reinstall_advice(tier.directory, listing.name)
            report.warnings.append(
                f"{tier.location}/{listing.name} is damaged ({listing.problems[0]}); {advice}"
            )


def _is_real_directory(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


# How much larger than the launcher this process renders an installed one is read, at most:
# its bytecode may differ in marshal's flags and back-references alone (same_program).
_READ_LIMIT_FACTOR = 2


def _ctxterm_of(root: Path) -> bytes:
    """``bin/ctxterm`` for ``root``, naming the root as the installed one does when that
    names this very directory: a root bootstrapped through a link to it, and then by its own
    path, would otherwise have its ctxterm rewritten at each run (R-5: a second run changes
    nothing).  A link such as ``storage/current`` stays the name a switch of it is followed
    by."""
    program = render_ctxterm(root)
    try:
        installed = read_regular_file(root / "bin" / "ctxterm", _READ_LIMIT_FACTOR * len(program))
    except (OSError, CtxError):
        return program
    path = ctxterm_root(installed)
    if path is None or os.path.realpath(path) != os.path.realpath(root):
        return program
    return render_ctxterm(Path(path))


def _install_program(
    root: Path, where: str, program: bytes, owner: int, report: storage.BootstrapReport
) -> None:
    """``bin/<name>``: a program of the root ABI (H-1), replaced whole when it differs, when a
    stand-in holds its name, or when another uid could change it: a new file, never the old
    one given back (whoever could write the old one may still hold it open for writing).
    ``bin/`` itself was given back before (the root's step)."""
    path = root / where
    ops = durable.default_ops()
    directory = durable.open_dir_path(ops, str(path.parent))
    try:
        shown = where.rpartition("/")[0]
        bootstrap_repair.sweep_temporaries(ops, directory, [path.name], shown, report)
        status = durable.lstat_at(directory, path.name)
        replaced = bootstrap_repair.stand_in(status)
        if status is not None and not (replaced or stat.S_ISREG(status.st_mode)):
            report.add_problem(f"{where}: not a regular file; left untouched", errno.EEXIST)
            return
        loose = "" if replaced else bootstrap_repair.untrusted(status, owner)
        if (
            status is not None
            and not replaced
            and not loose
            and status.st_mode & stat.S_IXUSR
            and same_program(
                _read_at(directory, path.name, _READ_LIMIT_FACTOR * len(program)) or b"", program
            )
        ):
            return
        durable.replace_file_synced(ops, directory, path.name, program, 0o755)
    finally:
        ops.close(directory)
    if status is None:
        report.created.append(where)
    elif replaced:
        report.repaired.append(f"{where} (it was a {replaced})")
    else:
        report.repaired.append(f"{where} ({loose}, rewritten)" if loose else where)


def _read_at(dir_fd: int, name: str, limit: int) -> bytes | None:
    """What the regular file ``name`` of ``dir_fd`` holds, when it is at most ``limit``
    bytes long, never through a link; None when it cannot be read."""
    try:
        return read_regular_file(name, limit, dir_fd=dir_fd)
    except OSError:
        return None


def core_manifest(name: str, exec_path: Path) -> Manifest:
    """The packaged manifest of a core tool, with ``exec`` naming its rendered launcher."""
    path = MANIFESTS / f"{name}.json"
    document = json.loads(path.read_text())
    document["exec"] = str(exec_path)
    return parse_manifest(document, source=path)


def _install_core_tool(
    tier: Tier, name: str, launcher: bytes, owner: int, report: storage.BootstrapReport
) -> None:
    """Install core tool ``name`` unless it is complete and this version's, and no other uid
    than root and ``owner`` could change its executable or a control its manifest defines
    (those are then written anew, never given back: :mod:`cortexfs.bootstrap_repair`).
    A stand-in
    (:func:`cortexfs.bootstrap_repair.stand_in`) at its executable or at a control its
    manifest defines is bootstrap's own to replace; anything else in the way is the user's:
    every obstacle is then reported and nothing is changed."""
    in_the_way = tool_obstacles(tier, name)
    written_whole = {name, *(f"{name}.d/{control}" for control in TOOL_KIND.defined)}
    stand_ins = [
        obstacle.path
        for obstacle in in_the_way
        if obstacle.path in written_whole and obstacle.found in _STAND_IN_OBSTACLES
    ]
    if len(stand_ins) < len(in_the_way):
        for obstacle in in_the_way:
            report.add_problem(
                f"{tier.location}/{obstacle.sentence()}; left untouched", errno.EEXIST
            )
        return
    tool = tier.tool(name)
    present = os.path.lexists(tool.executable)
    replaced = _remove_stand_ins(tier, stand_ins)
    line = f"tool/{name}" + (f" ({'; '.join(replaced)})" if replaced else "")
    try:
        with tempfile.TemporaryDirectory(prefix="cortexfs-core-") as scratch:
            exec_path = Path(scratch) / name
            exec_path.write_bytes(launcher)
            manifest = core_manifest(name, exec_path)

            def current() -> bool:
                return _is_current(tool, manifest, launcher, owner)

            if present and not replaced and current():
                return
            # Asked again under the tier's lock: a bootstrap running at the same time may
            # have installed this very version while this one waited for the lock.
            installed = install_tool(tier, manifest, launcher, unless_current=current)
    except BaseException:
        if replaced:  # what was removed is said, even when the install then failed
            report.repaired.append(line)
        raise
    if installed is None and not replaced:
        return
    (report.repaired if present else report.created).append(line)


def _remove_stand_ins(tier: Tier, relatives: list[str]) -> list[str]:
    """Unlink the stand-ins at ``relatives`` (``fs.list``, ``fs.list.d/cap``) of ``tier``,
    never following one; ``["tool/fs.list.d/cap was a symbolic link", …]``."""
    ops = durable.default_ops()
    removed = []
    tier_fd = durable.open_dir_path(ops, str(tier.directory))
    try:
        for relative in relatives:
            parent, _, name = relative.rpartition("/")
            dir_fd = ops.open_dir(parent, tier_fd) if parent else os.dup(tier_fd)
            try:
                kind = bootstrap_repair.remove_stand_in(ops, dir_fd, name)
            finally:
                ops.close(dir_fd)
            if kind:
                removed.append(f"{tier.location}/{relative} was a {kind}")
    finally:
        ops.close(tier_fd)
    return removed


def _report_held_directories(
    root: Path, name: str, owner: int, report: storage.BootstrapReport
) -> bool:
    """Report core tool ``name``'s control directory and hook directories that another uid
    could change; True when there is one, and bootstrap then leaves the tool as it is.

    They hold the administrator's policy, status, log and hooks: whoever could write one of
    them could have renamed, replaced or removed what is in it (a guard hook taken away, a
    file of root's moved over the policy), and giving the directory back, or reinstalling
    the tool, which carries that state into a new directory of root's, would make the
    authority chain trust it (:mod:`cortexfs.bootstrap_repair`)."""
    ops = durable.default_ops()
    found = False
    tool_fd = durable.open_dir_path(ops, str(root / "tool"))
    try:
        for relative in [f"{name}.d", *(f"{name}.d/{directory}" for directory in HOOK_DIRS)]:
            status = bootstrap_repair.status_beneath(tool_fd, relative)
            if status is None or not stat.S_ISDIR(status.st_mode):
                continue  # missing, or not a directory: the install reports or makes it
            if bootstrap_repair.untrusted(status, owner):
                shown = f"tool/{relative}"
                path = str(root / shown)
                problem = bootstrap_repair.kept_problem(shown, status, owner, path)
                report.add_problem(problem, errno.EACCES)
                found = True
    finally:
        ops.close(tool_fd)
    return found


def _report_held_files(root: Path, name: str, owner: int, report: storage.BootstrapReport) -> None:
    """Report core tool ``name``'s files that hold the administrator's content (its policy,
    status and log, its hooks, ``tsh.d/config``) when another uid could have changed them.
    They are never given back nor chmodded: what they say is not bootstrap's to vouch for.
    A post-hook runs as the agent alone, so the authority chain lets the agent's uid own it:
    only its mode is judged here."""
    kept = [f"{name}.d/{control}" for control in ADMINISTRATORS_CONTROLS]
    if name == "tsh":
        kept.append("tsh.d/config")
    ops = durable.default_ops()
    # A step that fails (tool/ cannot be opened: no descriptor left) is reported by the step
    # and leaves nothing to judge.
    statuses: list[tuple[str, os.stat_result | None, int | None]] = []
    with report.step("tool"):
        tool_fd = durable.open_dir_path(ops, str(root / "tool"))
        try:
            statuses += [(r, bootstrap_repair.status_beneath(tool_fd, r), owner) for r in kept]
            for phase, owners in (("pre.d", owner), ("post.d", None)):
                relative = f"{name}.d/hooks/{phase}"
                for hook in _hooks(tool_fd, relative):
                    path = f"{relative}/{hook}"
                    statuses.append((path, bootstrap_repair.status_beneath(tool_fd, path), owners))
        finally:
            ops.close(tool_fd)
    for relative, status, judged_owner in statuses:
        if status is None or not stat.S_ISREG(status.st_mode):
            continue  # missing, a link...: the chain refuses it and its own step reports it
        if relative.startswith(f"{name}.d/hooks/") and not status.st_mode & 0o111:
            continue  # not run as a hook
        # A post-hook (judged_owner None) may be the agent's, whoever that is: only its mode.
        judged_owner = status.st_uid if judged_owner is None else judged_owner
        if bootstrap_repair.untrusted(status, judged_owner):
            shown = f"tool/{relative}"
            path = str(root / shown)
            problem = bootstrap_repair.kept_problem(shown, status, judged_owner, path)
            report.add_problem(problem, errno.EACCES)


def _hooks(tool_fd: int, relative: str) -> list[str]:
    """The names in hook directory ``relative`` of ``tool_fd``, reached without following a
    link; none when it is missing or not a real directory."""
    fd = -1
    try:
        fd = os.dup(tool_fd)
        for part in relative.split("/"):
            inner = os.open(
                part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd
            )
            passed, fd = fd, inner  # rebound before the close: the cleanup after a Ctrl-C
            os.close(passed)  # between the two must not close this one again
        return sorted(os.listdir(fd))
    except OSError:
        return []
    finally:
        if fd >= 0:
            os.close(fd)


def _is_current(tool: ToolObject, manifest: Manifest, launcher: bytes, owner: int) -> bool:
    """Complete, and the executable and every control the manifest defines are this version's
    and beyond the reach of any uid but root and ``owner``.  What the administrator sets
    (policy, status, hooks) is not compared: it is not damage."""
    if layout_problems(tool):
        return False
    written = [tool.executable, *(tool.control_dir / control for control in TOOL_KIND.defined)]
    for path in written:
        with contextlib.suppress(FileNotFoundError):
            if bootstrap_repair.untrusted(path.lstat(), owner):
                return False
    try:
        # Never through a link, and at most twice what this version renders (its bytecode
        # may differ only in marshal's flags and back-references): a program grown sparse to
        # gigabytes costs nothing to find different.
        installed = read_regular_file(tool.executable, _READ_LIMIT_FACTOR * len(launcher))
        if not same_program(installed, launcher):
            return False
        wanted = manifest.controls()
        unwanted = TOOL_KIND.defined - wanted.keys() - {"origin"}
        # The origin names the manifest of whichever copy of ctx installed it, so it is not
        # compared byte for byte; one that is gone or names no core manifest is damage to
        # bootstrap's install like any other, and put back.
        return (
            all(read_control(tool, control) == data for control, data in wanted.items())
            and all(read_control(tool, control) is None for control in unwanted)
            and origin_names_core_manifest(tool)
        )
    except (OSError, CtxError):
        return False


def _ensure_tsh_config(root: Path, owner: int, report: storage.BootstrapReport) -> None:
    """H-4: ``tool/tsh.d/config`` with its defaults, also in place of a stand-in (a link, a
    FIFO…); an existing file is only checked, read without following a link or waiting on a
    FIFO.  ``tool/tsh.d`` is checked first: nothing is read or written in it while another
    uid could change it (:func:`_report_held_directories` reported it)."""
    ops = durable.default_ops()
    # The config is the storage root's owner's to change (H-4), also in a root that root
    # bootstraps for another uid: its directory (where an update takes its lock) and the file.
    receiver = owner if os.geteuid() == 0 and owner != 0 else None
    tool_fd = durable.open_dir_path(ops, str(root / "tool"))
    try:
        # Made by this bootstrap, here or as tool/tsh's control directory just before.
        made = "tool/tsh" in report.created
        if durable.make_dir_synced(ops, tool_fd, "tsh.d", 0o755):
            report.created.append("tool/tsh.d")
            made = True
        controls = durable.lstat_at(tool_fd, "tsh.d")
        if controls is None or not stat.S_ISDIR(controls.st_mode):
            report.add_problem("tool/tsh.d is not a directory; left untouched", errno.ENOTDIR)
            return
        config_dir = ops.open_dir("tsh.d", tool_fd)
    finally:
        ops.close(tool_fd)
    try:
        if bootstrap_repair.untrusted(os.fstat(config_dir), owner):
            return  # reported by _report_held_directories
        if receiver is not None and os.fstat(config_dir).st_uid == 0:
            ops.chown_opened(config_dir, receiver)
            if not made:
                report.repaired.append(_given("tool/tsh.d", receiver))
        bootstrap_repair.sweep_temporaries(ops, config_dir, ["config"], "tool/tsh.d", report)
        existing = durable.lstat_at(config_dir, "config")
        if existing is None:
            temporary = durable.temporary_name("config")
            durable.write_file_synced(
                ops, config_dir, temporary, tsh_config.DEFAULT_TEXT.encode(), owner=receiver
            )
            try:
                durable.move_noreplace(ops, config_dir, temporary, config_dir, "config")
            except FileExistsError:
                # Made meanwhile, by a bootstrap running at the same time or a tsh.config
                # update: that one stands, and is checked below as any config found is.
                durable.remove_entries(ops, [(config_dir, temporary, False)])
                existing = durable.lstat_at(config_dir, "config")
            else:
                report.created.append("tool/tsh.d/config")
                return
        if existing is None:
            return  # made and removed again meanwhile: the next bootstrap makes it
        if bootstrap_repair.stand_in(existing):
            # Nobody's settings: tsh and tsh.config refuse to read through it.
            durable.replace_file_synced(
                ops, config_dir, "config", tsh_config.DEFAULT_TEXT.encode(), tsh_config.CONFIG_MODE
            )
            report.repaired.append(
                f"tool/tsh.d/config (it was a {bootstrap_repair.stand_in(existing)})"
            )
        elif not stat.S_ISREG(existing.st_mode):
            report.add_problem(
                "tool/tsh.d/config is not a regular file; left untouched", errno.EEXIST
            )
        else:
            if receiver is not None and give_if_roots(ops, config_dir, "config", receiver):
                report.repaired.append(_given("tool/tsh.d/config", receiver))
            data = read_regular_file("config", tsh_config.MAX_CONFIG_BYTES, dir_fd=config_dir)
            for problem in tsh_config.problems(data.decode("utf-8", "replace")):
                report.add_problem(f"tool/{problem}", errno.EINVAL)
    finally:
        ops.close(config_dir)


def _given(shown: str, receiver: int) -> str:
    """What a repair says of a control root had that it gave the storage root's owner."""
    return f"{shown}: owner uid 0, now uid {receiver}, the storage root's owner, who changes it"


storage.register_bootstrap_step(bootstrap_tools)
