"""A real CortexFS world for tests: a bootstrapped storage root, a real unprivileged agent user,
its workspace, and helpers that go through the same library calls as ``ctx``."""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import cortexfs.tools.core.bootstrap  # noqa: F401  (registers the core tools' bootstrap step)
from cortexfs import storage
from cortexfs.agents.create import CreatedAgent, create_agent
from cortexfs.agents.request import parse_request
from cortexfs.policy import Identity
from cortexfs.shared.events import read_events
from cortexfs.shared.sessions import SessionRef
from cortexfs.tools.core import confine
from cortexfs.tools.core.toolio import ToolFailure
from cortexfs.tools.install import Installed, install_manifest, parse_tier
from cortexfs.tools.manifest import parse_manifest
from cortexfs.tools.result import ToolResult
from cortexfs.tools.runner import run_native
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser

ANY_INPUT = {"type": "object"}


@dataclass
class World:
    root: Path
    user: UnprivilegedUser
    workspace: Path
    scratch: Path

    def agent(
        self,
        name: str = "coder",
        *,
        tools: Sequence[str] = (),
        shared: dict[str, list[str]] | None = None,
        mounts: Sequence[Sequence[str]] | None = None,
        groups: Sequence[int] = (),
        uid: int | None = None,
    ) -> CreatedAgent:
        """An agent made by ``ctx agent create``'s library call, as the test user."""
        request: dict[str, Any] = {"name": name, "label": f"{name}_t", "tools": list(tools)}
        if shared:
            request["shared"] = shared
        request["mount"] = (
            [[str(self.workspace), "/workspace", "rw"]] if mounts is None else list(mounts)
        )
        identity = Identity(self.user.uid if uid is None else uid, self.user.gid, frozenset(groups))
        return create_agent(self.root, parse_request(request, "test", self.root), identity)

    def allow_tool(self, tool: str, label: str = "coder_t", location: str = "tool") -> None:
        """Add the tool's own half of P-6 (the agent's half comes from its request)."""
        with open(self.root / location / f"{tool}.d" / "policy", "a") as policy:
            policy.write(f"allow {label} tool:{tool} execute\n")

    def install(
        self,
        name: str,
        program: str,
        *,
        schema: dict[str, Any] | None = None,
        tier: str = "system",
        extra: dict[str, Any] | None = None,
    ) -> Installed:
        """Install a tool from a manifest and a program, as ``ctx object install`` does.

        The ``user`` tier is the test user's (``home/<uid>/tool``), as if they installed it.
        """
        source = self.scratch / f"{name}.program"
        source.write_text(program)
        document = {
            "manifest": 2,
            "kind": "tool",
            "name": name,
            "description": f"test tool {name}",
            "schema": ANY_INPUT if schema is None else schema,
            "cap": {"side_effects": False, "network": False},
            "exec": str(source),
            **(extra or {}),
        }
        manifest_path = self.scratch / f"{name}.manifest.json"
        manifest_path.write_text(json.dumps(document))
        manifest = parse_manifest(document, source=manifest_path)
        target = parse_tier(self.root, tier, uid=self.user.uid)
        return install_manifest(self.root, manifest, target)

    def run(
        self, tool: str, input_value: Any = None, agent: str = "coder", **kwargs: Any
    ) -> ToolResult:
        return run_native(
            self.root, agent, tool, {} if input_value is None else input_value, **kwargs
        )

    def events(self, agent: str = "coder", session: str = "default") -> list[dict[str, Any]]:
        ref = SessionRef.home(self.root, self.user.uid, agent, session)
        return read_events(ref.events_path).events

    def tool_log(self, tool: str, location: str = "tool") -> list[dict[str, Any]]:
        return read_events(self.root / location / f"{tool}.d" / "log").events


@contextlib.contextmanager
def effective_user(user: UnprivilegedUser) -> Iterator[None]:
    """Act as ``user`` (effective uid and gid) inside this process, then become root again.

    The venv's interpreter may live where another uid cannot execute it, so a test of "not
    the host administrator" switches this process's effective ids instead of spawning one.
    """
    os.setegid(user.gid)
    os.seteuid(user.uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


_templates: dict[int, Path] = {}  # effective uid -> the root it bootstrapped for copies


def bootstrapped_root(root: Path) -> Path:
    """A storage root ``ctx bootstrap`` made at ``root``, it and its six directories open to
    the test user (0755): a copy of one this process bootstrapped as this user
    (:func:`~tests.support.storage.copy_of_root`)."""
    template = _templates.get(os.geteuid())
    if template is None:
        template = Path(tempfile.mkdtemp(prefix="cortexfs-template-")) / "storage"
        report = storage.bootstrap(template)
        assert not report.problems, report.problems
        atexit.register(shutil.rmtree, template.parent, True)
        _templates[os.geteuid()] = template
    copy_of_root(template, root)
    for entry in (root, *root.iterdir()):
        entry.chmod(0o755)
    return root


def plant_secret(world: World, space: str, text: str) -> Path:
    """``shared/<space>/data/s.txt`` holding ``text``, readable by the test user's group:
    the mode bits let the test user read it, so only policy can keep it out of reach."""
    secret = world.root / "shared" / space / "data" / "s.txt"
    secret.write_text(text)
    os.chown(secret, 0, world.user.gid)
    secret.chmod(0o640)
    return secret


@pytest.fixture
def world(traversable_tmp: Path, unprivileged_user: UnprivilegedUser) -> Iterator[World]:
    root = bootstrapped_root(traversable_tmp / "storage")
    workspace = traversable_tmp / "work"
    workspace.mkdir()
    os.chown(workspace, unprivileged_user.uid, unprivileged_user.gid)
    scratch = traversable_tmp / "scratch"
    scratch.mkdir()
    yield World(root, unprivileged_user, workspace, scratch)


def reaches(view: confine.View, path: str, *, write: bool = False) -> bool:
    """Whether a tool with ``view`` (its CTX_MOUNTS) reaches ``path``, to write it with
    ``write``; a refusal must be EACCES or EROFS, never anything else."""
    try:
        place = view.locate(path, write=write)
    except ToolFailure as refused:
        assert refused.errno in (errno.EACCES, errno.EROFS), refused
        return False
    return bool(place.parts) if write else True  # the top of a mount is no file to write


def storage_paths(root: Path, depth: int, top: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every path below ``root/top``, as parts from ``root``, down to ``depth`` parts; links
    are listed, never entered."""
    pending: list[tuple[str, ...]] = [top]
    while pending:
        parts = pending.pop()
        directory = root.joinpath(*parts)
        if len(parts) >= depth or directory.is_symlink() or not directory.is_dir():
            continue
        for name in sorted(os.listdir(directory)):
            yield (*parts, name)
            pending.append((*parts, name))
