"""Object-name syntax (SPEC R-3).

Tools, agents, shared spaces, sessions and queue job base names share one syntax: 1 to 64
bytes of ASCII ``[A-Za-z0-9._-]``, first byte alphanumeric, not ``.``/``..``, not ending in
``.d`` (that suffix belongs to control directories).  Model names are ``<provider>/<model>``
with each part an object name.  Queue jobs additionally end in ``.req.json`` (SPEC §2.1).
"""

from __future__ import annotations

import re

from cortexfs.errors import invalid

MAX_NAME_BYTES = 64
JOB_SUFFIX = ".req.json"

_OBJECT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_FOREIGN = re.compile(r"[^A-Za-z0-9._-]")  # a character no object name may hold
_ALNUM = re.compile(r"[A-Za-z0-9]")  # what a name starts with: str.isalnum() takes 'é' too
# Every rule of job_name_problem in one pattern (64 bytes at most, .req.json included): the
# test a scan of pending/ makes for each of its entries, up to 100 000 of them.
_JOB_STEM_MAX = MAX_NAME_BYTES - 1 - len(JOB_SUFFIX)
_JOB_NAME = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{_JOB_STEM_MAX}}}{re.escape(JOB_SUFFIX)}")


def is_decimal(text: str) -> bool:
    """Whether ``text`` is a number written in ASCII digits.  ``str.isdigit`` alone lets
    through superscripts (``²``), which ``int`` cannot read, and digits of other scripts
    (``٣``), which it reads where a person or a shell would not."""
    return text.isascii() and text.isdigit()


MAX_ID = 2**32 - 2  # the largest uid or gid: (uid_t) -1 is "no id" to the kernel


def is_id(value: object) -> bool:
    """Whether ``value`` is a uid or gid: an int (not a bool) from 0 to :data:`MAX_ID`."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_ID


# Python reads at most this many digits into an int (``sys.get_int_max_str_digits``) and
# raises ValueError past it; an id, a count or a size needs far fewer.
_MOST_DIGITS = 4300


def decimal_value(text: str) -> int | None:
    """The integer ``text`` writes in ASCII digits (:func:`is_decimal`), or None: where it is
    not one, and where it has more digits than Python reads into an int, which no id, count
    or size of ours needs (so its caller's range check refuses it, rather than a traceback)."""
    if is_decimal(text) and len(text) <= _MOST_DIGITS:
        return int(text)
    return None


def shown_number(text: str, most: int = 40) -> str:
    """``text`` quoted for a message that refuses it as a number, cut to ``most`` characters
    with the length said: a refused value of thousands of digits is named, not reprinted."""
    if len(text) <= most:
        return repr(text)
    return f"{text[:most]!r}… ({len(text)} characters)"


def object_name_problem(name: object) -> str | None:
    """Why ``name`` is not a legal object name, every rule it breaks, or None when it is."""
    if not isinstance(name, str):
        return "a name must be a string"
    if _OBJECT_NAME.fullmatch(name) and not name.endswith(".d"):
        return None  # the common case, in one test
    if not name:
        return "a name must not be empty"
    problems = []
    size = _byte_length(name)
    too_long = size > MAX_NAME_BYTES
    if too_long:
        problems.append(f"is {size} bytes long; at most {MAX_NAME_BYTES} are allowed")
    if not _ALNUM.fullmatch(name[0]) or _FOREIGN.search(name):
        problems += _character_problems(name)
    if name.endswith(".d"):
        problems.append("ends in '.d', which is reserved for control directories")
    if not problems:
        return None
    shown = f"{name[:20]!r}…" if too_long else repr(name)
    return f"{shown} " + "; and it ".join(problems)


# The characters a refusal names of those a name may not hold; the rest are counted.
_MOST_CHARACTERS_NAMED = 8


def _character_problems(name: str) -> list[str]:
    """What is wrong with the characters of ``name``, a name the pattern refused: its first
    character, the characters no name may hold (a letter outside ASCII among them), or both —
    each named, so that the user sees which one to change."""
    problems = []
    if not _ALNUM.fullmatch(name[0]):
        problems.append(f"must start with a letter or digit, not {name[0]!r}")
    rest = name[1:]  # a foreign first character is named once, by the rule above
    foreign = list(dict.fromkeys(_FOREIGN.findall(rest)))  # each once, in order of appearance
    if foreign:
        quoted = [repr(char) for char in foreign[:_MOST_CHARACTERS_NAMED]]
        others = len(foreign) - len(quoted)
        if others:  # a long argument of foreign text is not listed back whole
            listed = f"{', '.join(quoted)} and {others} other character{'s' * (others > 1)}"
        elif len(quoted) == 1:
            listed = quoted[0]
        else:
            listed = f"{', '.join(quoted[:-1])} and {quoted[-1]}"
        problems.append(
            f"holds {listed}, which an object name may not hold (allowed: A-Z a-z 0-9 . _ -)"
        )
    return problems


def _byte_length(name: str) -> int:
    """How many bytes ``name`` is on disk (R-3 counts bytes): UTF-8, a file name's byte that
    is not UTF-8 counted as the one byte it is."""
    try:
        return len(name.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:  # a lone surrogate that stands for no byte
        return len(name.encode("utf-8", "surrogatepass"))


def is_object_name(name: object) -> bool:
    return object_name_problem(name) is None


def check_object_name(name: object, kind: str = "object") -> str:
    """Return ``name`` when legal, else raise EINVAL naming the rule it breaks."""
    problem = object_name_problem(name)
    if problem is not None:
        raise invalid(f"illegal {kind} name: {problem}")
    assert isinstance(name, str)
    return name


def job_name_problem(name: object) -> str | None:
    """Why ``name`` is not a queue job name (an object name ending in ``.req.json``)."""
    problem = object_name_problem(name)
    if problem is not None:
        return problem
    assert isinstance(name, str)
    if not name.endswith(JOB_SUFFIX) or name == JOB_SUFFIX:
        return f"{name!r} does not end in {JOB_SUFFIX!r}"
    return None


def is_job_name(name: object) -> bool:
    return isinstance(name, str) and _JOB_NAME.fullmatch(name) is not None


def job_name(name: str) -> str:
    """Normalise a user-supplied job name: add ``.req.json`` when absent, then validate.

    The reason for a refusal speaks of the name the user gave: an empty name is empty (not
    ``'.req.json'``), and one too long for the suffix says how long it may be without it.
    """
    given = name
    if isinstance(name, str) and not name.endswith(JOB_SUFFIX):
        if not name:
            raise invalid("illegal job name: a name must not be empty")
        name = name + JOB_SUFFIX
    problem = job_name_problem(name)
    if problem is not None:
        if given != name and name.isascii() and len(name) > MAX_NAME_BYTES:
            problem = (
                f"{given[:20]!r}… is {len(given)} bytes long, {len(name)} with the "
                f"{JOB_SUFFIX!r} suffix added; at most {MAX_NAME_BYTES} are allowed "
                f"({_JOB_STEM_MAX + 1} before the suffix)"
            )
        raise invalid(f"illegal job name: {problem}")
    return name


__all__ = [
    "JOB_SUFFIX",
    "MAX_NAME_BYTES",
    "check_object_name",
    "is_job_name",
    "is_object_name",
    "job_name",
    "job_name_problem",
    "object_name_problem",
]
