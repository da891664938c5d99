"""The one strict JSON reader: what other readers would disagree on, or fail on, is refused."""

from __future__ import annotations

import json
import sys

import pytest

from cortexfs import jsontext
from cortexfs.jsontext import MAX_DEPTH, NotAJsonNumber, loads_strict


def nested(levels: int, inner: str = "1") -> str:
    return "[" * levels + inner + "]" * levels


def test_a_document_as_deep_as_the_limit_is_read() -> None:
    value = loads_strict(nested(MAX_DEPTH))
    for _ in range(MAX_DEPTH - 1):
        value = value[0]
    assert value == [1]


@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 5_000, 100_000])
def test_a_deeper_document_is_malformed_json_at_the_first_bracket_too_many(levels: int) -> None:
    """Python's reader stops at its recursion limit with RecursionError (a traceback to every
    caller), and below it the writer or a schema check would; refused as malformed instead."""
    with pytest.raises(json.JSONDecodeError) as caught:
        loads_strict(nested(levels))
    assert caught.value.msg == f"nested deeper than {MAX_DEPTH} levels"
    assert caught.value.pos == MAX_DEPTH


def test_brackets_inside_strings_do_not_count_as_levels() -> None:
    text = '{"note": "[[[{\\"[", "deep": ' + nested(MAX_DEPTH) + "}"
    with pytest.raises(json.JSONDecodeError) as caught:
        loads_strict(text)
    assert text[caught.value.pos] == "[" and caught.value.pos == text.index("[[[[") + MAX_DEPTH - 1
    assert loads_strict('{"note": "' + "[" * 1000 + '"}')["note"] == "[" * 1000


def test_objects_count_as_levels_too() -> None:
    deep = '{"a":' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1)
    with pytest.raises(json.JSONDecodeError, match="nested deeper"):
        loads_strict(deep, unique_names=False)


@pytest.mark.parametrize("spelling", ["1e999", "-1e999", "1E400", "123456789e999"])
def test_a_number_beyond_a_float_is_refused(spelling: str) -> None:
    """Python reads it as infinity, which JSON cannot spell: written back, it would be
    ``Infinity``, no JSON at all."""
    with pytest.raises(NotAJsonNumber, match=spelling.replace("+", r"\+")):
        loads_strict('{"x": ' + spelling + "}")


def test_the_largest_floats_are_still_numbers() -> None:
    assert loads_strict("[1.7976931348623157e308, -1e-400]") == [1.7976931348623157e308, -0.0]


def test_an_integer_of_too_many_digits_is_malformed_json() -> None:
    digits = sys.get_int_max_str_digits()
    assert loads_strict("9" * digits) == int("9" * digits)
    with pytest.raises(json.JSONDecodeError) as caught:
        loads_strict('{"n": ' + "9" * (digits + 1) + "}")
    assert f"more than {digits} digits" in caught.value.msg
    assert "set_int_max_str_digits" not in caught.value.msg  # not advice for a user


def test_duplicate_names_and_constants_are_still_refused() -> None:
    with pytest.raises(jsontext.DuplicateNames):
        loads_strict('{"a": 1, "a": 2}')
    with pytest.raises(NotAJsonNumber):
        loads_strict("[NaN]")
    with pytest.raises(UnicodeDecodeError):
        loads_strict(b"\xff")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b'{"a": NaN}', "NaN is not a JSON number"),
        (b'{"a": 1e999}', "1e999 (beyond the largest float) is not a JSON number"),
        (b'{"a": 1, "a": 2}', "it gives the name 'a' twice in one object"),
        (b"\xef\xbb\xbf{", "Expecting property name enclosed in double quotes at line 1"),
    ],
)
def test_a_control_file_is_read_as_strictly_as_a_manifest(data: bytes, reason: str) -> None:
    """loads_text, which reads the controls on disk, refuses what loads_strict refuses, in
    words a person repairing the file can follow."""
    with pytest.raises(ValueError) as refused:
        jsontext.loads_text(data)
    assert str(refused.value).startswith(reason), refused.value


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ({1: "a", "1": "b"}, "1"),
        ({True: 1, "true": 2}, "true"),
        ({None: 1, "null": 2}, "null"),
        ({"outer": [{2.5: 1, "2.5": 2}]}, "2.5"),
    ],
)
def test_a_value_whose_keys_collide_once_written_as_text_is_unwritable(
    value: object, name: str
) -> None:
    """``json.dumps`` writes a key that is no str as text: two keys may become one name,
    which every strict reader of the document then refuses (or reads one of)."""
    with pytest.raises(jsontext.Unwritable) as caught:
        jsontext.dumps_document(value)
    assert f"gives the name {name!r} twice in one object once its keys are written" in str(
        caught.value
    )


def test_keys_that_are_no_str_but_give_distinct_names_are_written() -> None:
    written = jsontext.dumps_document({7: "a", "2": "b", False: "c", None: "d"})
    assert loads_strict(written) == {"7": "a", "2": "b", "false": "c", "null": "d"}


def test_a_message_spells_a_documents_value_as_json_does() -> None:
    assert [jsontext.spelt(v) for v in (True, None, ["/tmp"], {"page": 2}, "1000")] == [
        "true",
        "null",
        '["/tmp"]',
        '{"page": 2}',
        '"1000"',
    ]
    assert jsontext.spelt("x" * 200, 20) == '"' + "x" * 16 + "..."


def test_a_value_of_the_wrong_shape_is_named_as_json_names_it() -> None:
    values = [None, True, 0, 1.5, "x", [], {}]
    named = ["null", "a boolean", "a number", "a number", "a string", "an array", "an object"]
    assert [jsontext.what_it_is(value) for value in values] == named
