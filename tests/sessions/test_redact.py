"""What logs may say: facts, not secrets or long text (SPEC S-4)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from cortexfs.shared.redact import (
    MAX_ITEMS,
    MAX_SUMMARY_BYTES,
    MAX_TEXT,
    REDACTED,
    bounded_summary,
    summarize,
    summarize_argv,
)


def test_secret_keys_are_redacted_whatever_their_spelling() -> None:
    summary = summarize(
        {
            "API_KEY": "k",
            "password": "p",
            "db": {"Auth-Token": "t", "host": "db.example"},
            "privateKey": "-----",
            "cookie_jar": ["a"],
            "path": "README.md",
        }
    )

    assert summary == {
        "API_KEY": REDACTED,
        "password": REDACTED,
        "db": {"Auth-Token": REDACTED, "host": "db.example"},
        "privateKey": REDACTED,
        "cookie_jar": REDACTED,
        "path": "README.md",
    }


def test_credential_looking_values_are_redacted_under_any_key() -> None:
    pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIE..."

    assert summarize({"header": "Bearer abc.def", "body": pem, "x": "bearer"}) == {
        "header": REDACTED,
        "body": REDACTED,
        "x": "bearer",
    }


def test_long_text_and_long_lists_are_shortened_and_say_so() -> None:
    summary = summarize({"prompt": "p" * 5000, "items": list(range(100))})

    assert summary["prompt"].startswith("p" * MAX_TEXT)
    assert summary["prompt"].endswith(f"[+{5000 - MAX_TEXT} chars]")
    assert summary["items"][:MAX_ITEMS] == list(range(MAX_ITEMS))
    assert summary["items"][-1] == f"[+{100 - MAX_ITEMS} items]"


def test_argv_secrets_are_redacted() -> None:
    argv = ["--token=abc", "--password", "hunter2", "API_KEY=zzz", "--verbose", "file.txt"]

    assert summarize_argv(argv) == [
        f"--token={REDACTED}",
        "--password",
        REDACTED,
        f"API_KEY={REDACTED}",
        "--verbose",
        "file.txt",
    ]


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=40) | st.dictionaries(st.text(), inner, max_size=40),
    max_leaves=400,
)


@given(_JSON)
def test_a_bounded_summary_is_json_and_short(value: object) -> None:
    encoded = json.dumps(bounded_summary(value), ensure_ascii=False)

    assert len(encoded) <= MAX_SUMMARY_BYTES + 2


@given(st.text(max_size=MAX_TEXT).filter(lambda text: "bearer" not in text.lower()))
def test_short_ordinary_text_is_kept_as_it_is(text: str) -> None:
    if "basic" not in text.lower() and "PRIVATE KEY" not in text:
        assert summarize(text) == text


def test_a_huge_structure_becomes_a_size_note() -> None:
    wide = {f"k{i}": [{"v": "x" * MAX_TEXT} for _ in range(MAX_ITEMS)] for i in range(50)}

    assert bounded_summary(wide).startswith("[summary of ")
