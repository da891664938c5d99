"""The policy v0 language, line by line (SPEC P-1..P-4, P-7)."""

from __future__ import annotations

import errno
import itertools

import pytest

from cortexfs.errors import CtxError
from cortexfs.policy import (
    CLASS_PERMISSIONS,
    PolicySyntaxError,
    Rule,
    make_rule,
    parse_rule,
    parse_rules,
    parse_rules_bytes,
)

ALL_PERMISSIONS = sorted({perm for perms in CLASS_PERMISSIONS.values() for perm in perms})
A_NAME_OF = {
    "tool": "fs.read",
    "model": "openai/gpt-5.6",
    "shared": "project-a",
    "session": "design-review",
    "mount": "workspace",
    "agent": "review-1",
    "network": "default",
}


def test_the_classes_and_permissions_are_exactly_those_of_p3() -> None:
    assert dict(CLASS_PERMISSIONS) == {
        "tool": ("execute",),
        "model": ("use",),
        "shared": ("read", "write"),
        "session": ("read", "write", "resume"),
        "mount": ("read", "write"),
        "agent": ("create", "start", "stop", "read", "write"),
        "network": ("connect",),
    }


@pytest.mark.parametrize(
    ("object_class", "permission"), list(itertools.product(CLASS_PERMISSIONS, ALL_PERMISSIONS))
)
def test_every_class_with_every_permission(object_class: str, permission: str) -> None:
    name = A_NAME_OF[object_class]
    line = f"allow coder_t {object_class}:{name} {permission}"
    if permission in CLASS_PERMISSIONS[object_class]:
        assert parse_rule(line) == Rule("coder_t", object_class, name, permission)
    else:
        with pytest.raises(CtxError) as raised:
            parse_rule(line)
        assert raised.value.errno == errno.EINVAL
        assert f"not of {object_class}" in raised.value.message


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        # P-2: no deny, glob, priority, inheritance, variables, paths or templates.
        ("deny coder_t tool:fs.read execute", "there is no 'deny'"),
        ("allow coder_t agent:* create", "globs are not supported"),
        ("allow coder_t tool:fs.* execute", "globs are not supported"),
        ("allow coder_t tool:fs.rea? execute", "globs are not supported"),
        ("allow coder_t tool:fs.[rw] execute", "globs are not supported"),
        ("allow *_t tool:fs.read execute", "globs are not supported"),
        ("allow coder_t tool:fs.read execute 10", "unexpected text after the permission"),
        ("priority 10 allow coder_t tool:fs.read execute", "unknown statement 'priority'"),
        ("inherit coder_t parent_t", "unknown statement 'inherit'"),
        ("allow coder_t tool:$TOOL execute", "variables are not supported"),
        ("allow coder_t tool:${tool} execute", "variables are not supported"),
        ("allow $SUBJECT tool:fs.read execute", "variables are not supported"),
        ("allow coder_t tool:%{name} execute", "variables are not supported"),
        ("allow coder_t tool:/ctx/tool/fs.read execute", "paths are not supported"),
        ("allow coder_t shared:project-a/data read", "paths are not supported"),
        ("allow coder_t tool:{name} execute", "templates are not supported"),
        ("allow coder_t agent:<child> create", "templates are not supported"),
        # P-3, P-4: unknown class, unknown permission, a permission of another class.
        ("allow coder_t file:README read", "unknown class 'file'"),
        ("allow coder_t Tool:fs.read execute", "unknown class 'Tool'"),
        ("allow coder_t tool:fs.read run", "unknown permission 'run'"),
        ("allow coder_t tool:fs.read read", "is a permission of"),
        ("allow coder_t model:openai/gpt-5.6 execute", "is a permission of tool"),
        ("allow coder_t network:default use", "is a permission of model"),
        # Trailing tokens and comments after a rule.
        ("allow coder_t tool:fs.read execute # fine?", "unexpected text after the permission"),
        ("allow coder_t tool:fs.read execute extra words", "unexpected text after the permission"),
        # Incomplete rules and malformed objects.
        ("allow", "the subject type is missing"),
        ("allow coder_t", "the CLASS:NAME object is missing"),
        ("allow coder_t tool:fs.read", "the permission is missing"),
        ("allow coder_t fs.read execute", "expected CLASS:NAME"),
        ("allow coder_t tool: execute", "must not be empty"),
        ("allow coder_t tool:a:b execute", "holds ':'"),
        ("Allow coder_t tool:fs.read execute", "unknown statement 'Allow'"),
        # Subject types (an object name; the _t suffix is a convention, not a rule).
        ("allow coder.d tool:fs.read execute", "reserved for control directories"),
        ("allow _t tool:fs.read execute", "illegal subject type"),
        ("allow -coder_t tool:fs.read execute", "illegal subject type"),
        (f"allow {'c' * 63}_t tool:fs.read execute", "at most 64 are allowed"),
        # Object names, models (<provider>/<model>) and the one network object.
        ("allow coder_t tool:.hidden execute", "must start with a letter or digit"),
        ("allow coder_t tool:.. execute", "must start with a letter or digit"),
        ("allow coder_t tool:fs.d execute", "reserved for control directories"),
        (f"allow coder_t tool:{'t' * 65} execute", "at most 64 are allowed"),
        ("allow coder_t model:gpt-5.6 use", "a model name is <provider>/<model>"),
        ("allow coder_t model:a/b/c use", "a model name is <provider>/<model>"),
        ("allow coder_t model:openai/ use", "must not be empty"),
        ("allow coder_t model:openai.d/gpt-5.6 use", "reserved for control directories"),
        ("allow coder_t model:openai/gpt-5.6.d use", "reserved for control directories"),
        ("allow coder_t model:openai/* use", "globs are not supported"),
        ("allow coder_t network:internet connect", "the only network object is 'default'"),
        ("allow coder_t network:Default connect", "the only network object is 'default'"),
        # Characters: printable ASCII and tabs only.
        ("allow coder_t tool:fs.read execute\r", "carriage return"),
        ("allow\u3000coder_t tool:fs.read execute", "is not allowed in a rule"),
        ("allow coder_t tool:fs.réad execute", "is not allowed in a rule"),
        ("allow coder_t\x0ctool:fs.read execute", "is not allowed in a rule"),
        ("allow coder_t tool:fs.read\x00 execute", "is not allowed in a rule"),
    ],
)
def test_invalid_forms_are_einval_with_a_reason(line: str, reason: str) -> None:
    with pytest.raises(CtxError) as raised:
        parse_rule(line)
    assert raised.value.errno == errno.EINVAL
    assert reason in raised.value.message


@pytest.mark.parametrize(
    "line",
    ["", "   ", "\t", "#", "# allow coder_t tool:* execute", "   \t# indented comment"],
)
def test_blank_and_comment_lines_are_ignored(line: str) -> None:
    assert parse_rule(line) is None


def test_words_may_be_separated_by_runs_of_spaces_and_tabs() -> None:
    rule = parse_rule("  allow\tcoder_t   tool:fs.read \t execute  ")
    assert rule == Rule("coder_t", "tool", "fs.read", "execute")


@pytest.mark.parametrize(
    "subject", ["coder_t", "reviewer_t", "parent_t", "review-1_t", "a.b_t", "X_t", "9_t"]
)
def test_subject_types_are_object_names_ending_in_t(subject: str) -> None:
    assert make_rule(subject, "tool:fs.read", "execute").subject == subject


def test_the_longest_subject_type_is_64_bytes() -> None:
    subject = "c" * 62 + "_t"
    assert make_rule(subject, "agent:reviewer", "start").subject == subject


def test_a_rule_prints_as_the_line_it_came_from() -> None:
    line = "allow coder_t model:openai/gpt-5.6 use"
    assert str(parse_rule(line)) == line


def test_every_bad_line_is_reported_with_its_number() -> None:
    text = "\n".join(
        [
            "# policy of coder",
            "allow coder_t tool:fs.read execute",
            "allow coder_t agent:* create",
            "",
            "deny coder_t tool:shell.exec execute",
            "allow coder_t tool:fs.write execute",
            "allow coder_t tool:fs.write write",
        ]
    )
    with pytest.raises(PolicySyntaxError) as raised:
        parse_rules(text, source="agent/coder.d/policy")
    rendered = [str(problem) for problem in raised.value.problems]
    assert [problem.line for problem in raised.value.problems] == [3, 5, 7]
    assert rendered[0] == (
        "agent/coder.d/policy:3: EINVAL: agent:*: globs are not supported (P-2); name each object"
    )
    assert all(line.startswith("agent/coder.d/policy:") for line in rendered)
    assert raised.value.errno == errno.EINVAL
    assert "(and 2 more invalid lines)" in raised.value.message


def test_one_more_invalid_line_is_said_in_the_singular() -> None:
    with pytest.raises(PolicySyntaxError) as raised:
        parse_rules("allow a agent:* create\nallow a tool:x write\n", source="p")
    assert raised.value.message.endswith("(and 1 more invalid line)"), raised.value.message


LONG = "x" * 100_000


@pytest.mark.parametrize(
    "line",
    [
        LONG,
        f"allow {LONG} tool:fs.read execute",
        f"allow coder_t {LONG}:fs.read execute",
        f"allow coder_t tool:{LONG} execute",
        f"allow coder_t tool:fs.*{LONG} execute",
        f"allow coder_t model:openai/{LONG}/x use",
        f"allow coder_t tool:fs.read {LONG}",
        f"allow coder_t tool:fs.read execute {LONG}",
        f"allow coder_t {LONG} execute",
    ],
)
def test_an_error_quotes_a_long_word_only_in_part(line: str) -> None:
    """A megabyte-long line gets a one-line reason, not the megabyte back on stderr."""
    with pytest.raises(PolicySyntaxError) as raised:
        parse_rules(line, source="p")

    (problem,) = raised.value.problems
    assert len(str(problem)) < 300, str(problem)


def test_a_valid_policy_yields_its_rules_in_order() -> None:
    text = (
        "allow coder_t tool:fs.read execute\n"
        "\n"
        "# the network is off unless allowed (P-4)\n"
        "allow coder_t network:default connect\n"
    )
    assert parse_rules(text) == [
        Rule("coder_t", "tool", "fs.read", "execute"),
        Rule("coder_t", "network", "default", "connect"),
    ]


def test_an_empty_policy_is_valid_and_holds_nothing() -> None:
    assert parse_rules("") == []
    assert parse_rules_bytes(b"\n\n# nothing\n") == []


def test_comments_in_bytes_may_hold_any_text() -> None:
    data = "# 允许 coder 读文件\nallow coder_t tool:fs.read execute\n".encode()
    assert parse_rules_bytes(data) == [Rule("coder_t", "tool", "fs.read", "execute")]
    assert parse_rules_bytes(b"# \xff\xfe not even UTF-8\n") == []


def test_a_rule_line_in_bytes_must_be_ascii() -> None:
    with pytest.raises(PolicySyntaxError) as raised:
        parse_rules_bytes(b"allow coder_t tool:fs.read execute\nallow coder_t tool:\xff execute\n")
    (problem,) = raised.value.problems
    assert (problem.line, problem.reason) == (2, "a rule line must be ASCII text")


def test_a_subject_type_is_any_object_name() -> None:
    """SPEC P-1 writes ``<subject_type>`` and ``allow X network:default connect``; ``_t`` is
    the convention of the examples, not part of the syntax."""
    text = "allow X network:default connect\nallow coder tool:fs.read execute\n"

    assert parse_rules(text) == [
        Rule("X", "network", "default", "connect"),
        Rule("coder", "tool", "fs.read", "execute"),
    ]


def test_a_byte_order_mark_in_front_is_named_as_such() -> None:
    """An editor's UTF-8 byte-order mark is refused on line 1 by name, not as 'not ASCII';
    the other lines are judged as ever."""
    data = b"\xef\xbb\xbf# rules of coder\nallow coder_t tool:fs.read execute\nallow x\xff\n"
    with pytest.raises(PolicySyntaxError) as raised:
        parse_rules_bytes(data, "p")
    first, second = raised.value.problems
    assert first.line == 1 and "byte-order mark (U+FEFF)" in first.reason
    assert (second.line, second.reason) == (3, "a rule line must be ASCII text")
