"""Command groups that import a subcommand's module only when that subcommand runs.

``ctx`` is started for every queue step a shell script takes; importing every command's
library (jsonschema, the tool runner, the policy engine…) on each start would cost more than
the step itself.  A :class:`LazyGroup` knows its subcommands by name and ``module:attribute``.
"""

from __future__ import annotations

import importlib

import click


class LazyGroup(click.Group):
    def __init__(self, *args: object, lazy: dict[str, str] | None = None, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy and cmd_name not in self.commands:
            module_name, attribute = self.lazy[cmd_name].split(":")
            command = getattr(importlib.import_module(module_name), attribute)
            self.add_command(command, cmd_name)
        return super().get_command(ctx, cmd_name)
