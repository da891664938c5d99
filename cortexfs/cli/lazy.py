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

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """As click resolves it, but a name that is no command is answered with the commands
        it is close to among all of them: click looks only among those loaded, which for a
        lazy group is none of the lazy ones (``ctx qeueu`` suggested nothing)."""
        name = args[0]
        # A word that looks like an option is click's to parse (``--help`` after the group).
        looks_like_a_name = name[:1].isalnum() and ctx.token_normalize_func is None
        if looks_like_a_name and not ctx.resilient_parsing and self.get_command(ctx, name) is None:
            raise click.UsageError(_no_such_command(name, self.list_commands(ctx)), ctx)
        return super().resolve_command(ctx, args)


def _no_such_command(name: str, commands: list[str]) -> str:
    """click's own words for an unknown command, with its suggestions (click 8.4 and later)."""
    import difflib  # with heapq, a few milliseconds of every start; only a typo needs it

    close = sorted(difflib.get_close_matches(name, commands))
    message = f"No such command {name!r}."
    if len(close) == 1:
        return f"{message} Did you mean {close[0]!r}?"
    if close:
        return f"{message} (Did you mean one of: {', '.join(map(repr, close))}?)"
    return message
