"""A refused object name says which of its characters is at fault (SPEC R-3).

Reported: ``ctx object which 'bad/name'`` and a policy rule naming ``tool:a:b`` both said the
name "must start with a letter or digit", though both do: the message must name the
character that is wrong, so that the user knows what to change.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cortexfs.names import object_name_problem

ALLOWED = "(allowed: A-Z a-z 0-9 . _ -)"


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("bad/name", f"'bad/name' holds '/', which an object name may not hold {ALLOWED}"),
        ("a:b", f"'a:b' holds ':', which an object name may not hold {ALLOWED}"),
        ("a b:c/d:e", "'a b:c/d:e' holds ' ', ':' and '/', which an object name may not hold"),
        ("a\nb", "'a\\nb' holds '\\n', which"),
        (".hidden", "'.hidden' must start with a letter or digit, not '.'"),
        ("-x", "'-x' must start with a letter or digit, not '-'"),
        ("/x", "'/x' must start with a letter or digit, not '/'"),
        ("../x", "'../x' must start with a letter or digit, not '.'; and it holds '/', which"),
        ("a:/ !@#$%", "'a:/ !@#$%' holds ':', '/', ' ', '!', '@', '#', '$' and '%', which"),
        ("a:/ !@#$%^&", "'a:/ !@#$%^&' holds ':', '/', ' ', '!', '@', '#', '$', '%' and 2 other"),
    ],
)
def test_the_problem_names_the_offending_characters(name: str, problem: str) -> None:
    found = object_name_problem(name)

    assert found is not None and found.startswith(problem), found
    if name[0].isalnum():
        assert "start with" not in found


def run_ctx(root: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cortexfs", *arguments],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "CTX_STORAGE": str(root)},
        timeout=60,
    )


def test_ctx_object_which_and_policy_check_name_the_character(tmp_path: Path) -> None:
    policy = tmp_path / "policy"
    policy.write_text("allow coder_t tool:a:b execute\n")

    which = run_ctx(tmp_path / "storage", "object", "which", "bad/name")
    checked = run_ctx(tmp_path / "storage", "policy", "check", str(policy))

    assert which.returncode == 2
    assert which.stderr == (
        f"ctx: EINVAL: illegal tool name: 'bad/name' holds '/', which an object name may not "
        f"hold {ALLOWED}\n"
    )
    assert checked.returncode == 1
    assert "'a:b' holds ':', which an object name may not hold" in checked.stderr
    assert "start with" not in checked.stderr


@pytest.mark.parametrize(
    ("name", "problems"),
    [
        ("a/b.d", ["holds '/'", "ends in '.d'"]),
        ("x" * 70 + ".d", ["is 72 bytes long", "ends in '.d'"]),
        ("-" + "y" * 70, ["is 71 bytes long", "must start with a letter or digit"]),
    ],
)
def test_every_rule_a_name_breaks_is_named(name: str, problems: list[str]) -> None:
    """T-8: an invalid manifest is refused with every reason listed, its name's too."""
    found = object_name_problem(name)

    assert found is not None
    assert all(problem in found for problem in problems), found


@pytest.mark.parametrize(
    ("name", "problems"),
    [
        ("café.d", ["holds 'é', which", "ends in '.d'"]),
        ("é" * 40, ["is 80 bytes long", "must start with a letter or digit, not 'é'"]),
        ("naïve name", ["holds 'ï' and ' ', which"]),
    ],
)
def test_a_name_with_non_ascii_characters_is_told_every_rule_it_breaks(
    name: str, problems: list[str]
) -> None:
    """R-3 counts bytes, and a character outside ASCII is one an object name may not hold: it
    is named as any other, beside the length in bytes and a '.d' ending."""
    found = object_name_problem(name)

    assert found is not None
    assert all(problem in found for problem in problems), found


def test_a_long_refused_name_is_shown_shortened() -> None:
    """However long the name, the message shows its first 20 characters."""
    found = object_name_problem("é" * 100_000)

    assert found is not None and len(found) < 300, found[:400]
    assert "is 200000 bytes long" in found


def test_a_long_name_of_foreign_characters_is_refused_in_one_short_line() -> None:
    """A name of 5000 characters no name may hold names eight of them and counts the rest,
    as it shortens the name itself: the refusal is a line to read, not the argument back."""
    name = "a" + "".join(chr(0x4E00 + n) for n in range(5000))
    found = object_name_problem(name)

    assert found is not None and len(found) < 400, len(found or "")
    assert "is 15001 bytes long" in found and "and 4992 other characters, which" in found
