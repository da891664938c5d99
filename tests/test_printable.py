"""Suggested commands that a shell reads back as the very words, however odd the words."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cortexfs.printable import printable, shell_word, shell_words
from tests.support.cli import ctx

ODD_WORDS = [
    "plain",
    "/with space/and 'quote'",
    "line\nbreak and \x1b[31mescape",
    "back\\slash and $dollar and `tick`",
    os.fsdecode(b"not-utf8-\xff\xfe"),
    "\u202eright-to-left",
    "",
]


@pytest.mark.parametrize("word", ODD_WORDS)
def test_a_shell_word_reads_back_as_the_word_and_shows_as_it_is(word: str) -> None:
    """What :func:`printable` shows of a suggestion is the suggestion itself, and bash,
    given it, has the word's very bytes."""
    spelled = shell_word(word)
    assert printable(spelled) == spelled
    read_back = subprocess.run(
        ["bash", "-c", f"printf %s {spelled}"], capture_output=True, check=True
    ).stdout
    assert read_back == os.fsencode(word)


def test_shell_words_is_a_command_line_of_them() -> None:
    spelled = shell_words(ODD_WORDS)
    read_back = subprocess.run(
        ["bash", "-c", f'for word in {spelled}; do printf "%s\\0" "$word"; done'],
        capture_output=True,
        check=True,
    ).stdout
    assert read_back.split(b"\0")[:-1] == [os.fsencode(word) for word in ODD_WORDS]


def test_a_suggested_command_run_as_shown_acts_on_the_root_it_was_given(tmp_path: Path) -> None:
    """R-1, §2.4: a storage root whose path holds a line break and an escape: the ``ctx queue
    init`` an ENOENT suggests, copied from the terminal into bash, makes the queue in that
    root, not in a second root of another name."""
    root = tmp_path / "a b\nc\x1b[31mred" / "st"
    assert ctx(root, "bootstrap").returncode == 0
    missing = subprocess.run(
        [sys.executable, "-m", "cortexfs", "queue", "status", "--storage", root, "-p", "nosuch"],
        capture_output=True,
        text=True,
        errors="surrogateescape",
    )
    assert missing.returncode == 1, missing.stderr
    suggested = missing.stderr.split("'ctx ", 1)[1].rsplit("'", 1)[0]
    done = subprocess.run(
        ["bash", "-c", f"{sys.executable} -m cortexfs {suggested}"], capture_output=True, text=True
    )
    assert done.returncode == 0, (suggested, done.stderr)
    assert (root / "shared" / "nosuch" / "queue" / "pending").is_dir()
    assert sorted(os.listdir(tmp_path)) == ["a b\nc\x1b[31mred"]
