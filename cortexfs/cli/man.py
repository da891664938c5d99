"""``ctx man``: the manual pages of shared/cortexfs-docs (SPEC §12 D-1)."""

from __future__ import annotations

from pathlib import Path

import click

from cortexfs import manual
from cortexfs.cli.common import (
    echo_printable,
    emit_json,
    handles_errors,
    json_option,
    resolve_storage,
    storage_option,
)
from cortexfs.printable import printable_text


@click.command("man")
@click.argument("topic", required=False)
@storage_option
@json_option
@handles_errors
def man(topic: str | None, storage_dir: Path | None, as_json: bool) -> None:
    """Print the manual page of TOPIC, or list the topics.

    Topics: README (the bundle's overview; also readme, README.md), agent, tool, model,
    coreutils, root-abi, session, provider (also accepted as ctx.agent or ctx.agent.md,
    the page's file name).  The page is read from the storage root's bundle,
    shared/cortexfs-docs/README.md or shared/cortexfs-docs/man/ctx.TOPIC.md; where none is
    installed, from the copy built into ctx (a note on stderr says so; 'ctx bootstrap'
    installs the bundle); an installed page that is not this version's is shown with a
    note saying so.  Exit 1 (ENOENT) for an unknown topic.
    """
    root = resolve_storage(storage_dir)
    if topic is None:
        _list_topics(root, as_json)
        return
    page = manual.read_manual(root, topic)
    _note_built_in(page)
    if as_json:
        emit_json(_describe(page) | {"text": page.text})
        return
    # An installed page is a file of the storage root: what it holds reaches the reader's
    # terminal only escaped (a page of this version holds no control character).
    text = printable_text(page.text)
    click.echo(text, nl=not text.endswith("\n"))


def _list_topics(root: Path, as_json: bool) -> None:
    pages = [manual.read_manual(root, topic) for topic in manual.ALL_TOPICS]
    if as_json:
        emit_json([_describe(page) for page in pages])
        return
    for page in pages:
        echo_printable(f"{page.topic:<10} {manual.summary(page.text)}  [{page.origin}]")


def _describe(page: manual.Manual) -> dict[str, object]:
    return {
        "topic": page.topic,
        "page": manual.page_name(page.topic),
        "summary": manual.summary(page.text),
        "origin": page.origin,
        "path": None if page.path is None else str(page.path),
    }


def _note_built_in(page: manual.Manual) -> None:
    if page.path is None:
        echo_printable(
            f"ctx man: {page.why_built_in}; this is the copy built into ctx",
            err=True,
        )
    elif page.differs_from_built_in():
        echo_printable(
            f"ctx man: note: {page.path} is not the page of this version of ctx; "
            "'ctx bootstrap' installs it (ctx man shows the installed page)",
            err=True,
        )
