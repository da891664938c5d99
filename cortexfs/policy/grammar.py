"""The policy v0 language (SPEC P-1..P-4, P-7): one ``allow`` rule per line, nothing else.

::

    allow <subject_type> <object_class>:<object_name> <permission>

* Blank lines and lines whose first non-blank character is ``#`` are ignored (P-1).  Blanks are
  spaces and tabs; words are separated by them.  A rule line holds printable ASCII only.
* There is no ``deny``, glob, priority, inheritance, variable, path or template (P-2): such a
  line is not a rule, it is ``EINVAL``.  Comments go on their own line; trailing text is
  ``EINVAL`` too, so a rule can never carry more meaning than its four words.
* The classes and their permissions are fixed (P-3, :data:`CLASS_PERMISSIONS`).
* A subject type is an object name (R-3).  The type of agent ``<a>`` is conventionally
  ``<a>_t`` (``coder_t``, ``review-1_t``; A-5 writes ``<agent>_t``), but SPEC P-1 asks only for
  a ``<subject_type>`` and writes ``allow X network:default connect``, so the suffix is a
  convention the manuals follow, not a rule the reader enforces.
* Object names are concrete (P-7): an object name (R-3) for ``tool``, ``shared``, ``session``,
  ``mount`` and ``agent``; ``<provider>/<model>`` for ``model``; exactly ``default`` for
  ``network`` (P-4).

A policy with any invalid line is invalid as a whole; :func:`parse_rules` reports every bad
line, each as ``SOURCE:LINE: EINVAL: <reason>``.  Nothing here touches the filesystem.
"""

from __future__ import annotations

import codecs
import errno
import re
from collections.abc import Iterable, Iterator, Sequence
from types import MappingProxyType
from typing import NamedTuple

from cortexfs.errors import CtxError, invalid
from cortexfs.names import MAX_NAME_BYTES, object_name_problem
from cortexfs.printable import quoted, shortened

CLASS_PERMISSIONS = MappingProxyType(
    {
        "tool": ("execute",),
        "model": ("use",),
        "shared": ("read", "write"),
        "session": ("read", "write", "resume"),
        "mount": ("read", "write"),
        "agent": ("create", "start", "stop", "read", "write"),
        "network": ("connect",),
    }
)
NETWORK_OBJECT = "default"
RULE_VERB = "allow"
_SHAPE = "'allow SUBJECT CLASS:NAME PERMISSION'"

# A rule line: tabs and printable ASCII.  Checked before splitting so that no other whitespace
# (form feed, NBSP, U+3000…) can act as a word separator the reader does not see.
_RULE_CHARACTERS = re.compile(r"[\t\x20-\x7e]*")
_BLANKS = " \t"
# The fast path (a 10 000-rule policy must parse in < 100 ms): one regular expression that
# matches only well-formed rules, then the per-class checks.  It accepts nothing the
# word-by-word parser would refuse; every line it does not accept goes through that parser,
# which has the last word and says what is wrong.
_NAME_PATTERN = rf"[A-Za-z0-9][A-Za-z0-9._-]{{0,{MAX_NAME_BYTES - 1}}}"
_SUBJECT_TYPE = re.compile(_NAME_PATTERN)
_WELL_FORMED_RULE = re.compile(
    rf"[ \t]*{RULE_VERB}[ \t]+({_SUBJECT_TYPE.pattern})[ \t]+([a-z]+):"
    rf"({_NAME_PATTERN}(?:/{_NAME_PATTERN})?)[ \t]+([a-z]+)[ \t]*"
)
_PERMITTED = frozenset(
    (object_class, permission)
    for object_class, permissions in CLASS_PERMISSIONS.items()
    for permission in permissions
)

# P-2 forbids these constructs outright; naming them in the error beats "illegal character".
_FORBIDDEN_CONSTRUCTS = (
    ("*?[]", "globs are not supported (P-2); name each object"),
    ("$%", "variables are not supported (P-2); write the concrete name"),
    ("{}<>", "templates are not supported (P-2); write the concrete name"),
)


class Rule(NamedTuple):
    """One ``allow`` rule.  A plain 4-tuple, so a decision is a single set lookup."""

    subject: str
    object_class: str
    object_name: str
    permission: str

    def __str__(self) -> str:
        return (
            f"{RULE_VERB} {self.subject} {self.object_class}:{self.object_name} {self.permission}"
        )


class PolicyProblem(NamedTuple):
    """One invalid line of one policy source."""

    source: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: EINVAL: {self.reason}"


class PolicySyntaxError(CtxError):
    """EINVAL for a policy holding invalid lines; :attr:`problems` lists every one of them."""

    def __init__(self, problems: Sequence[PolicyProblem]) -> None:
        first = problems[0]
        others = len(problems) - 1
        more = f" (and {others} more invalid line{'s' if others > 1 else ''})" if others else ""
        super().__init__(errno.EINVAL, f"{first.source}:{first.line}: {first.reason}{more}")
        self.problems = tuple(problems)


def parse_rules(text: str, source: str = "<policy>") -> list[Rule]:
    """Every rule of a policy text, in order; :class:`PolicySyntaxError` if any line is bad."""
    return _collect(source, enumerate(text.split("\n"), start=1))


def parse_rules_bytes(data: bytes, source: str = "<policy>") -> list[Rule]:
    """:func:`parse_rules` for raw file contents.

    Comment lines are ignored whatever bytes they hold (P-1), so a comment may be written in
    any language; a rule line must be ASCII.
    """
    try:
        return _collect(source, _decoded_lines(data))
    except PolicySyntaxError as exc:
        first = exc.problems[0]
        if not (data.startswith(codecs.BOM_UTF8) and first.line == 1):
            raise
        # Some editors save UTF-8 with a byte-order mark in front: say that, not "not ASCII".
        marked = PolicyProblem(
            source,
            1,
            "the file starts with a UTF-8 byte-order mark (U+FEFF), which no rule line may "
            "hold, not even a comment: save it without the mark",
        )
        raise PolicySyntaxError([marked, *exc.problems[1:]]) from None


def parse_rule(line: str) -> Rule | None:
    """The rule on one line, or None for a blank or comment line; EINVAL for anything else."""
    well_formed = _WELL_FORMED_RULE.fullmatch(line)
    if well_formed is not None:
        rule = Rule(*well_formed.groups())
        if _passes_class_checks(rule):
            return rule
    return _parse_rule_word_by_word(line)


def _parse_rule_word_by_word(line: str) -> Rule | None:
    """:func:`parse_rule` without the fast path: the authority, and the explanation of faults."""
    if _is_blank_or_comment(line):
        return None
    if _RULE_CHARACTERS.fullmatch(line) is None:
        raise invalid(_character_problem(line))
    verb, *words = line.split()
    if verb != RULE_VERB:
        raise invalid(_verb_problem(verb))
    if len(words) < 3:
        missing = ("subject type", "CLASS:NAME object", "permission")[len(words)]
        raise invalid(f"incomplete rule: the {missing} is missing; expected {_SHAPE}")
    if len(words) > 3:
        raise invalid(
            f"unexpected text after the permission: {quoted(' '.join(words[3:]))}; a rule "
            "has exactly four words and a comment needs a line of its own"
        )
    return make_rule(*words)


def make_rule(subject: str, object_ref: str, permission: str) -> Rule:
    """Validate the three words of a rule (or of a query) and build it; EINVAL names the fault."""
    check_subject_type(subject)
    object_class, object_name = split_object_ref(object_ref)
    check_object(object_class, object_name, permission)
    return Rule(subject, object_class, object_name, permission)


def check_object(object_class: str, object_name: str, permission: str) -> None:
    """EINVAL unless ``CLASS:NAME PERM`` names a class, a permission of it and a legal name."""
    if object_class not in CLASS_PERMISSIONS:
        raise invalid(
            f"unknown class {quoted(object_class)}; the classes are {_listing(CLASS_PERMISSIONS)}"
        )
    check_permission(object_class, permission)
    check_policy_object_name(object_class, object_name)


def check_subject_type(subject: str) -> str:
    if _SUBJECT_TYPE.fullmatch(subject) is None or subject.endswith(".d"):
        raise invalid(_subject_problem(subject))
    return subject


def split_object_ref(object_ref: str) -> tuple[str, str]:
    """``CLASS:NAME`` → ``(class, name)``; :func:`check_object` judges the parts."""
    object_class, colon, object_name = object_ref.partition(":")
    if not colon:
        raise invalid(
            f"{quoted(object_ref)} is not an object; expected CLASS:NAME, e.g. tool:fs.read"
        )
    return object_class, object_name


def check_permission(object_class: str, permission: str) -> str:
    allowed = CLASS_PERMISSIONS[object_class]
    if permission in allowed:
        return permission
    owners = [name for name, perms in CLASS_PERMISSIONS.items() if permission in perms]
    if owners:
        raise invalid(
            f"{permission!r} is a permission of {_listing(owners)}, not of {object_class}; "
            f"{object_class} has {_listing(allowed)}"
        )
    raise invalid(
        f"unknown permission {quoted(permission)}; {object_class} has {_listing(allowed)}"
    )


def check_policy_object_name(object_class: str, object_name: str) -> str:
    """The name rule of each class (P-4, P-7, R-3); EINVAL with the rule it breaks."""
    problem = policy_object_name_problem(object_class, object_name)
    if problem is not None:
        raise invalid(problem)
    return object_name


def policy_object_name_problem(object_class: str, object_name: str) -> str | None:
    what = shortened(f"{object_class}:{object_name}")
    if object_class == "network":
        if object_name == NETWORK_OBJECT:
            return None
        return f"{what}: the only network object is {NETWORK_OBJECT!r} (P-4)"
    parts = object_name.split("/") if object_class == "model" else [object_name]
    if object_class == "model" and len(parts) != 2:
        construct = _forbidden_construct(object_name)
        return f"{what}: {construct or 'a model name is <provider>/<model>'}"
    for part in parts:
        problem = object_name_problem(part)
        if problem is not None:
            if "/" in part:
                return f"{what}: paths are not supported (P-2); name the object, not its path"
            return f"{what}: {_forbidden_construct(part) or problem}"
    return None


def _collect(source: str, lines: Iterator[tuple[int, str | None]]) -> list[Rule]:
    rules: list[Rule] = []
    problems: list[PolicyProblem] = []
    for number, line in lines:
        if line is None:
            problems.append(PolicyProblem(source, number, "a rule line must be ASCII text"))
            continue
        try:
            rule = parse_rule(line)
        except CtxError as exc:
            problems.append(PolicyProblem(source, number, exc.message))
            continue
        if rule is not None:
            rules.append(rule)
    if problems:
        raise PolicySyntaxError(problems)
    return rules


def _decoded_lines(data: bytes) -> Iterator[tuple[int, str | None]]:
    """Number each line; None marks a rule line that is not ASCII.  Comments are not decoded."""
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if raw.lstrip(b" \t").startswith(b"#"):
            continue
        try:
            yield number, raw.decode("ascii")
        except UnicodeDecodeError:
            yield number, None


def _passes_class_checks(rule: Rule) -> bool:
    """What :data:`_WELL_FORMED_RULE` leaves to check: the permission and name rule of a class."""
    if (rule.object_class, rule.permission) not in _PERMITTED or rule.subject.endswith(".d"):
        return False
    name = rule.object_name
    if rule.object_class == "network":
        return name == NETWORK_OBJECT
    if rule.object_class == "model":
        return name.count("/") == 1 and not name.endswith(".d") and ".d/" not in name
    return "/" not in name and not name.endswith(".d")


def _is_blank_or_comment(line: str) -> bool:
    stripped = line.lstrip(_BLANKS)
    return not stripped or stripped.startswith("#")


def _character_problem(line: str) -> str:
    offender = next(ch for ch in line if _RULE_CHARACTERS.fullmatch(ch) is None)
    if offender == "\r":
        return "carriage return in a rule line; save the policy with Unix line endings"
    return f"character {offender!r} is not allowed in a rule; rules are printable ASCII"


def _verb_problem(verb: str) -> str:
    if verb == "deny":
        return "there is no 'deny' (P-2): policy v0 denies whatever no rule allows"
    return f"unknown statement {quoted(verb)}; every rule has the form {_SHAPE}"


def _subject_problem(subject: str) -> str:
    construct = _forbidden_construct(subject)
    if construct:
        return f"subject {quoted(subject)}: {construct}"
    problem = object_name_problem(subject)
    if problem is not None:
        return f"illegal subject type: {problem}"
    return f"illegal subject type {quoted(subject)}"


def _forbidden_construct(word: str) -> str | None:
    for characters, reason in _FORBIDDEN_CONSTRUCTS:
        if any(ch in word for ch in characters):
            return reason
    return None


def _listing(words: Iterable[str]) -> str:
    return ", ".join(words)
