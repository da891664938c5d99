"""Object and job names (SPEC R-3, §2.1)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cortexfs.names import is_job_name, job_name_problem

PIECES = st.sampled_from(
    ["a", "Z", "0", "9", ".", "_", "-", "/", "é", " ", ".d", ".req.json", "x" * 27]
)


@settings(max_examples=3000)
@given(st.lists(PIECES, max_size=10).map("".join))
def test_the_fast_job_name_test_agrees_with_the_rules(name: str) -> None:
    assert is_job_name(name) == (job_name_problem(name) is None)


@pytest.mark.parametrize(
    ("name", "legal"),
    [
        ("a.req.json", True),
        ("a" * 55 + ".req.json", True),  # 64 bytes
        ("a" * 56 + ".req.json", False),  # 65 bytes
        (".req.json", False),
        ("-a.req.json", False),
        ("a.req.json.tmp", False),
        ("é.req.json", False),
        (None, False),
    ],
)
def test_job_names_at_the_edges(name: object, legal: bool) -> None:
    assert is_job_name(name) is legal
    assert (job_name_problem(name) is None) is legal
