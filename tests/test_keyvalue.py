"""The key=value data files' lines (queue/config, tool/tsh.d/config, .tshrc)."""

from __future__ import annotations

from cortexfs import keyvalue


def test_blank_lines_and_comments_say_nothing_and_the_rest_is_numbered_as_in_an_editor() -> None:
    text = (
        "# a comment\n\n  max = 3 \n   # indented comment\nno equals sign\n=orphan value\nk=a=b\n"
    )

    lines = list(keyvalue.lines(text))

    assert [(line.number, line.key, line.value) for line in lines] == [
        (3, "max", "3"),
        (5, None, ""),
        (6, None, "orphan value"),
        (7, "k", "a=b"),
    ]
    assert lines[1].raw == "no equals sign"
