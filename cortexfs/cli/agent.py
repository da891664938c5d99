"""``ctx agent``: create agents and look at them, on the host side (SPEC A-3)."""

from __future__ import annotations

import os
import pwd
import sys
from pathlib import Path

import click

from cortexfs.agents.create import create_agent, identity_json
from cortexfs.agents.request import RequestError, load_request, parse_request_bytes
from cortexfs.agents.view import AgentView
from cortexfs.cli.common import (
    emit_json,
    fail_with_problems,
    handles_errors,
    json_option,
    resolve_storage,
    storage_option,
    usage_problem,
)
from cortexfs.errors import invalid
from cortexfs.policy import Identity

STDIN = "-"


@click.group()
def agent() -> None:
    """Agents: host-owned identities, mounts and policies (SPEC §8).

    \b
    An agent is agent/<name> (its executable entry) plus agent/<name>.d/ controls:
    label, policy, identity, mount, model, system.md, prompt.template.md, log.
    See docs/tools.md for how a tool call uses them.
    """


@agent.command()
@click.argument("request", type=click.Path(path_type=Path))
@click.option(
    "--user",
    help="Run the agent as this user (name or uid); default: you, so root must name one "
    "(an agent never runs as root).",
)
@click.option("--gid", type=int, help="Its primary group (default: the user's).")
@click.option(
    "--groups", help="Its supplementary groups, comma-separated ids (default: the user's)."
)
@storage_option
@json_option
@handles_errors
def create(
    request: Path,
    user: str | None,
    gid: int | None,
    groups: str | None,
    storage_dir: Path | None,
    as_json: bool,
) -> None:
    """Create the agent described by REQUEST ('-' reads standard input) (SPEC A-3).

    \b
    REQUEST is one JSON object:
      {"name": "reviewer", "label": "reviewer_t", "model": ["openai/gpt-5.6"],
       "tools": ["fs.read"], "shared": {"project-a": ["read"]},
       "mount": [["/work", "/work", "ro"]]}
    The policy grants exactly the listed tools, models, shared spaces and mounts; the
    storage root is mounted read-only at /ctx.  Only root or the owner of the storage root
    may create agents; an existing agent is never overwritten.  An agent never runs as root.
    """
    root = resolve_storage(storage_dir)
    try:
        if str(request) == STDIN:
            parsed = parse_request_bytes(sys.stdin.buffer.read(), "<stdin>", root)
        else:
            parsed = load_request(request, root)
    except RequestError as exc:
        fail_with_problems(request, exc, exc.problems, as_json)
    created = create_agent(root, parsed, _identity(user, gid, groups))
    if as_json:
        emit_json(created.to_json())
    else:
        ids = created.identity
        click.echo(f"created agent {created.name}: {created.entry} (uid {ids.uid}, gid {ids.gid})")


@agent.command()
@click.argument("name")
@storage_option
@json_option
@handles_errors
def show(name: str, storage_dir: Path | None, as_json: bool) -> None:
    """Show what the runtime derives from agent NAME's controls.

    Its identity, label, CTX_PATH, the mounts its tools may use, and its working directory.
    """
    view = AgentView.load(resolve_storage(storage_dir), name)
    cwd, _ = view.working_directory()
    facts = {
        "name": view.name,
        "label": view.label or None,
        "identity": identity_json(view.identity),
        "ctx_path": view.ctx_path(),
        "mounts": [
            [str(m.source), str(m.target), "rw" if m.writable else "ro"]
            for m in view.visible_mounts()
        ],
        "cwd": str(cwd),
    }
    if as_json:
        emit_json(facts)
        return
    for key, value in facts.items():
        click.echo(f"{key}: {value}")


def _identity(user: str | None, gid: int | None, groups: str | None) -> Identity | None:
    """The identity the options describe; None (the creating user) when none is given."""
    if user is None and gid is None and groups is None:
        return None
    if user is None:
        uid, primary, extra = os.getuid(), os.getgid(), frozenset(os.getgroups())
    else:
        entry = _lookup_user(user)
        if entry is None:
            if gid is None:
                raise usage_problem(invalid(f"uid {user} is not a known user; give --gid too"))
            uid, primary, extra = int(user), gid, frozenset()
        else:
            uid, primary = entry.pw_uid, entry.pw_gid
            extra = frozenset(os.getgrouplist(entry.pw_name, entry.pw_gid))
    if gid is not None:
        primary = gid
    if groups is not None:
        try:
            extra = frozenset(int(group) for group in groups.split(",") if group)
        except ValueError:
            raise usage_problem(invalid(f"--groups takes group ids: {groups!r}")) from None
    return Identity(uid, primary, extra)


def _lookup_user(user: str) -> pwd.struct_passwd | None:
    """The user database entry of a name or uid; None for a uid it does not know."""
    try:
        return pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except KeyError:
        if user.isdigit():
            return None
        raise usage_problem(invalid(f"no such user: {user!r}")) from None
