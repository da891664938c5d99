"""tsh splits a command line as shlex.split() does, in linear time (tsh_line.split_words)."""

from __future__ import annotations

import shlex

from hypothesis import given, settings
from hypothesis import strategies as st

from cortexfs.tools.core.tsh_line import split_words

# Every character the POSIX rules treat apart, and a few they do not.
LINES = st.text(alphabet=list("ab \t\r\n'\"\\$\x0bé"), max_size=24)


def _outcome(split, line: str) -> tuple[str, object]:
    try:
        return "words", split(line)
    except ValueError as exc:
        return "refused", str(exc)


@settings(max_examples=3000, deadline=None)
@given(LINES)
def test_the_words_and_the_refusals_are_shlexs(line: str) -> None:
    assert _outcome(split_words, line) == _outcome(shlex.split, line)


def test_a_word_of_a_mebibyte_and_one_of_many_pieces_are_read_whole() -> None:
    escaped = '"' + '\\"' * (1 << 18) + '"'  # a quarter of a million pieces in one word
    assert split_words("x" * (1 << 20) + " " + escaped) == ["x" * (1 << 20), '"' * (1 << 18)]
