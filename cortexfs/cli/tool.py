"""``ctx tool NAME [ARG…]``: the safe core CLIs, run inside ctx as the caller (SPEC H-3).

A tool found on ``CTX_PATH`` is an executable anyone could start; running it *as an agent*
goes through the authority chain (``ctx run``).  ``ctx tool`` is the other way in, for the
few core CLIs that carry no permission of their own and are implemented inside ctx: it runs
their code in this process, as the caller, on the core tool that ``CTX_PATH`` shows.  Every
other name is refused, ordinary tools and the core tools that act with an agent's
permissions (``fs.*``, ``shell.exec``) alike, because starting them here would bypass the
agent and tool policies.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import click

from cortexfs.cli.common import (
    for_this_storage,
    handles_errors,
    object_name_argument,
    resolve_storage,
    storage_option,
)
from cortexfs.errors import CtxError, denied
from cortexfs.fuse.mounts import cortexfs_mount_holding
from cortexfs.tools.controls import (
    ToolObject,
    damaged,
    read_controls,
    readable_layout_problems,
    require_available,
)
from cortexfs.tools.core import CORE_TOOLS, tsh_config
from cortexfs.tools.core.toolio import NATIVE
from cortexfs.tools.ctxpath import which_on_user_path
from cortexfs.tools.record import record_host_call

# name -> the CLI: (the executable CTX_PATH resolved, its arguments) -> exit status
SAFE_CORE_CLIS: dict[str, Callable[[Path, list[str]], int]] = {
    "tsh.config": lambda executable, argv: tsh_config.run_configure(
        tsh_config.config_path(str(executable)), argv, program="ctx", suggest=for_this_storage
    ),
}


class _NameAfterDoubleDash(click.Command):
    """Notes whether NAME came after a ``--``: then it is a name, whatever it starts with,
    and is judged as one; before one, a word starting with ``-`` is an unknown option."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        after = args[args.index("--") + 1 :] if "--" in args else []
        ctx.meta[_AFTER_DOUBLE_DASH] = after[:1]
        return super().parse_args(ctx, args)


_AFTER_DOUBLE_DASH = "cortexfs.tool.after_double_dash"


@click.command(
    "tool",
    cls=_NameAfterDoubleDash,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.argument("name")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("--json", "as_json", is_flag=True, help="Native output: one JSON object.")
@storage_option
@handles_errors
def tool(name: str, args: tuple[str, ...], as_json: bool, storage_dir: Path | None) -> None:
    """Run NAME, a safe core CLI implemented inside ctx (tsh.config), as you.

    NAME must be visible on CTX_PATH ($CTX_HOME/.tshrc, else $CTX_PATH, else
    /ctx/tool:/ctx/home/<uid>/tool), and what it resolves to must be the core tool of
    the storage root's tool/ directory.  Ordinary tools and the core tools that act
    with an agent's permissions (fs.read, fs.write, shell.exec, ...) are refused with
    EACCES: run them as an agent with 'ctx run --agent AGENT NAME'.  Options of ctx
    tool go before NAME; everything after NAME is the CLI's.  The exit status is the
    CLI's (0 done, 1 refused, 2 bad input); ENOENT (exit 1) when NAME is not visible.

    \b
    Example:  ctx tool tsh.config                  print the tsh configuration
              ctx tool tsh.config cache_capacity=64 window_percent=2
    """
    context = click.get_current_context()
    if name.startswith("-") and context.meta.get(_AFTER_DOUBLE_DASH) != [name]:
        # Unknown options are left to the CLI after NAME (ignore_unknown_options), so one
        # before NAME arrives here as NAME: it is a usage error of ctx tool, as it reads.
        raise click.NoSuchOption(name.split("=", 1)[0], ctx=context)
    name = object_name_argument(name, "tool")
    root = resolve_storage(storage_dir)
    found, _ = which_on_user_path(root, name, uid=os.getuid(), environ=os.environ)
    cli = SAFE_CORE_CLIS.get(name)
    if cli is None:
        kind = (
            "a core tool that acts with an agent's permissions"
            if name in CORE_TOOLS
            else ("an ordinary tool")
        )
        raise denied(
            f"{name} is {kind}; ctx tool runs only the safe core CLIs "
            f"({', '.join(SAFE_CORE_CLIS)}): run it as an agent with "
            f"'ctx run --agent AGENT {name}'"
        )
    core = root / "tool" / name
    if not _is_core_tool(found.executable, core):
        raise denied(
            f"{name} on CTX_PATH is {found.executable}, not the core tool {core}; "
            "ctx tool runs only the core CLIs"
        )
    # The tool's controls hold for this way in too (T-1): a damaged tool is refused (ENOEXEC),
    # one its administrator disabled too (EACCES), and the call is logged (T-7).  A control
    # the caller may not read is its own refusal (EACCES, saying who may), no damage that
    # bootstrap would mend.  Its hooks run under an agent's identity, for agent calls; this
    # call is the caller's own.
    core_tool = ToolObject(name, root / "tool")
    log = PurePosixPath("tool", *core_tool.relative_control("log").parts)
    try:
        # Every control, its own policy too: no chain runs here to refuse a tool without one.
        problems = readable_layout_problems(core_tool)
        if problems:
            raise damaged(core_tool, problems[0])
        require_available(core_tool, read_controls(core_tool))
    except CtxError as refusal:
        record_host_call(root, log, f"tool/{name}", list(args), None, refusal)
        raise
    if as_json:
        os.environ["CTX_MODE"] = NATIVE
    status = cli(core, list(args))
    record_host_call(root, log, f"tool/{name}", list(args), status)
    sys.exit(status)


def _is_core_tool(found: Path, core: Path) -> bool:
    """Whether the file CTX_PATH resolved is the core tool ``core``, whatever name the path
    gave the storage root: the same file (reached through a symbolic link, ``..``, a bind
    mount), or that file shown by a CortexFS mount of the root (``ctx mount /ctx``, whose
    ``/ctx/tool`` leads the default CTX_PATH), at ``tool/<name>`` of the mount.  A mount shows
    each file under the storage's own inode number (cortexfs/fuse/inodes.py), so the tool and
    its directory must carry the numbers of ``core`` and of ``tool/``."""
    try:
        if os.path.samefile(found, core):
            return True
        shown = Path(os.path.realpath(found.parent)) / found.name
        mount = cortexfs_mount_holding(shown)
        if mount is None or shown.relative_to(mount).parts != ("tool", core.name):
            return False
        return all(
            os.stat(seen).st_ino == os.stat(own).st_ino
            for seen, own in ((shown, core), (shown.parent, core.parent))
        )
    except (OSError, ValueError):
        return False
