"""Every help page fits an 80-column terminal: a line the terminal folds breaks a word, and a
page written with hand-broken lines longer than that is folded on the most common width."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]
CTXMCP = [sys.executable, "-c", "from cortexfs.cli.ctxmcp import main; main()"]
AT_80 = {**os.environ, "COLUMNS": "80"}


def help_page(program: list[str], words: tuple[str, ...]) -> str:
    shown = subprocess.run(
        [*program, *words, "--help"], capture_output=True, text=True, env=AT_80, check=False
    )
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def every_command(program: list[str]) -> list[tuple[str, ...]]:
    """The words of every command and group of ``program``, from its help pages."""
    found: list[tuple[str, ...]] = [()]
    for words in found:
        listing = re.search(r"\nCommands:\n(.*)", help_page(program, words), re.DOTALL)
        if listing is None:
            continue
        for line in listing.group(1).splitlines():
            if re.match(r"  \S", line):
                found.append((*words, line.split()[0]))
    return found


@pytest.mark.parametrize(("program", "name"), [(CTX, "ctx"), (CTXMCP, "ctxmcp")])
def test_every_help_page_fits_80_columns(program: list[str], name: str) -> None:
    pages = every_command(program)
    assert len(pages) > (30 if name == "ctx" else 2), pages
    wide = {
        " ".join((name, *words)): [
            line for line in help_page(program, words).splitlines() if len(line) > 80
        ]
        for words in pages
    }
    assert {page: lines for page, lines in wide.items() if lines} == {}
