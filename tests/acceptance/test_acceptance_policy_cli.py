"""§5 P-8: ``ctx policy check`` and ``ctx policy query``, their exact outputs and exit statuses
(with P-1..P-4 and the two-layer rule of P-6 as seen through them)."""

from __future__ import annotations

import json
import re

import pytest

from tests.acceptance.ctxcli import ctx_run

VALID = """\
# coder may read files and use one model
allow coder_t tool:fs.read execute
allow coder_t tool:shell.exec execute

   # an indented comment is still a comment
allow coder_t model:openai/gpt-5.6 use
allow coder_t shared:project-a read
allow coder_t shared:project-a write
allow coder_t session:design-review resume
allow coder_t mount:workspace read
allow coder_t network:default connect
allow parent_t agent:review-1 create
allow parent_t agent:review-1 start
allow parent_t agent:review-1 stop
allow parent_t agent:review-1 read
allow parent_t agent:review-1 write
"""

# Each line breaks exactly one rule of P-1..P-3; the numbers are their line numbers in INVALID.
INVALID_LINES = {
    2: "allow coder_t gadget:fs.read execute",  # unknown class
    3: "allow coder_t tool:fs.read run",  # unknown permission
    4: "allow coder_t tool:fs.read use",  # a permission of another class
    5: "allow coder_t agent:* create",  # glob (P-2)
    6: "deny coder_t tool:fs.read execute",  # no deny (P-2)
    7: "allow coder_t tool:fs.read",  # missing permission
    8: "allow coder_t fs.read execute",  # no CLASS:NAME
}
INVALID = (
    "allow coder_t tool:fs.read execute\n"
    + "".join(INVALID_LINES[n] + "\n" for n in sorted(INVALID_LINES))
    + "# trailing comment\n"
)

ERROR_LINE = re.compile(r"^(?P<file>.+):(?P<line>\d+): EINVAL: (?P<reason>\S.*)$")


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_check_accepts_every_class_permission_comments_and_blank_lines(tmp_path):
    """P-8, P-1, P-3: a valid policy exits 0 and reports no error."""
    policy = write(tmp_path, "policy", VALID)
    r = ctx_run("policy", "check", policy)
    assert r.rc == 0, r
    assert "EINVAL" not in r.err


def test_check_reports_one_einval_line_per_invalid_line(tmp_path):
    """P-8: exit 1 and, on stderr, exactly one ``FILE:LINE: EINVAL: <reason>`` line per error.

    # reading: FILE is the path exactly as given on the command line; LINE counts from 1
    # and includes blank and comment lines.
    """
    policy = write(tmp_path, "bad.policy", INVALID)
    r = ctx_run("policy", "check", policy)
    assert r.rc == 1, r
    errors = [ERROR_LINE.match(line) for line in r.err.splitlines() if line.strip()]
    assert all(errors), r
    assert [m["file"] for m in errors] == [str(policy)] * len(INVALID_LINES)
    assert sorted(int(m["line"]) for m in errors) == sorted(INVALID_LINES)


def test_check_reports_errors_of_every_file_given(tmp_path):
    """P-8: ``check FILE...`` checks every file; errors name their own file and line."""
    good = write(tmp_path, "good.policy", VALID)
    bad1 = write(tmp_path, "one.policy", "allow a_t tool:x execute\nallow a_t tool:x fly\n")
    bad2 = write(tmp_path, "two.policy", "\n\n\nallow b_t nothing:x read\n")
    r = ctx_run("policy", "check", good, bad1, bad2)
    assert r.rc == 1, r
    errors = [ERROR_LINE.match(line) for line in r.err.splitlines() if line.strip()]
    assert all(errors), r
    assert sorted((m["file"], int(m["line"])) for m in errors) == [(str(bad1), 2), (str(bad2), 4)]


def test_check_of_valid_files_only_exits_zero(tmp_path):
    """P-8: several valid files: exit 0."""
    a = write(tmp_path, "a", VALID)
    b = write(tmp_path, "b", "# nothing allowed\n\n")
    r = ctx_run("policy", "check", a, b)
    assert r.rc == 0, r


@pytest.fixture
def layers(tmp_path):
    """An agent policy and a tool policy in the shape of P-6."""
    agent = write(
        tmp_path,
        "agent.policy",
        "allow coder_t tool:fs.read execute\nallow coder_t tool:shell.exec execute\n",
    )
    tool = write(
        tmp_path, "tool.policy", "# fs.read's own policy\nallow coder_t tool:fs.read execute\n"
    )
    return agent, tool


def query(*policies, subject="coder_t", obj="tool:fs.read", perm="execute"):
    args = []
    for p in policies:
        args += ["--policy", p]
    return ctx_run("policy", "query", *args, subject, obj, perm)


def test_query_prints_allow_and_exits_0_when_the_rule_is_present(layers):
    """P-8: a query the policy allows prints ``allow`` and exits 0."""
    agent, _ = layers
    r = query(agent)
    assert (r.rc, r.out) == (0, "allow\n"), r


@pytest.mark.parametrize(
    ("subject", "obj", "perm"),
    [
        ("reviewer_t", "tool:fs.read", "execute"),  # another subject
        ("coder_t", "network:default", "connect"),  # P-4: no rule, no network
    ],
)
def test_query_prints_deny_and_exits_1_without_a_matching_rule(layers, subject, obj, perm):
    """P-8, P-2: anything not explicitly allowed prints ``deny`` and exits 1."""
    agent, _ = layers
    r = query(agent, subject=subject, obj=obj, perm=perm)
    assert (r.rc, r.out) == (1, "deny\n"), r


def test_query_requires_every_policy_to_allow(layers):
    """P-8, P-6: with several --policy every layer must allow (agent and tool policy)."""
    agent, tool = layers
    both = query(agent, tool)
    assert (both.rc, both.out) == (0, "allow\n"), both
    only_agent = query(agent, tool, obj="tool:shell.exec")
    assert (only_agent.rc, only_agent.out) == (1, "deny\n"), only_agent


@pytest.mark.parametrize(
    ("obj", "perm"),
    [
        ("gadget:fs.read", "execute"),  # unknown class
        ("tool:fs.read", "fly"),  # unknown permission
        ("tool:*", "execute"),  # glob
    ],
)
def test_malformed_query_exits_2_with_einval(layers, obj, perm):
    """P-8, P-3: a malformed query is exit 2 with EINVAL, neither allow nor deny.

    # reading: EINVAL is reported on stderr and stdout carries no decision.
    """
    agent, _ = layers
    r = query(agent, obj=obj, perm=perm)
    assert r.rc == 2, r
    assert "EINVAL" in r.err
    assert r.out.strip() not in ("allow", "deny")


def test_query_against_a_malformed_policy_exits_2_with_einval(tmp_path):
    """P-8: a malformed policy makes the query exit 2 with EINVAL, even if a line would allow."""
    policy = write(
        tmp_path,
        "mixed.policy",
        "allow coder_t tool:fs.read execute\nallow coder_t tool:fs.read fly\n",
    )
    r = query(policy)
    assert r.rc == 2, r
    assert "EINVAL" in r.err
    assert r.out.strip() not in ("allow", "deny")


def test_query_without_any_policy_is_a_usage_error():
    """P-8: ``query --policy FILE [--policy FILE ...]``: at least one policy is required;
    without one the query is malformed (exit 2) and decides nothing."""
    r = ctx_run("policy", "query", "coder_t", "tool:fs.read", "execute")
    assert r.rc == 2, r
    assert r.out.strip() not in ("allow", "deny")


def test_check_json_lists_each_file_and_each_invalid_line(tmp_path):
    """The stderr lines of P-8 stay; --json adds the same verdicts on stdout."""
    good = write(tmp_path, "good.policy", VALID)
    bad = write(tmp_path, "bad.policy", "allow a_t tool:x execute\nallow a_t tool:x fly\n")
    r = ctx_run("policy", "check", good, bad, "--json")
    assert r.rc == 1, r
    assert ERROR_LINE.match(r.err.splitlines()[0]), r
    report = json.loads(r.out)
    assert report["valid"] is False
    verdicts = [(f["file"], f["valid"]) for f in report["files"]]
    assert verdicts == [(str(good), True), (str(bad), False)]
    (problem,) = report["files"][1]["problems"]
    assert (problem["line"], problem["error"], problem["errno"]) == (2, "EINVAL", 22)


def test_query_json_gives_the_decision_and_each_layers_answer(layers):
    agent, tool = layers
    r = ctx_run("policy", "query", "--policy", agent, "--policy", tool, "--json",
                "coder_t", "tool:fs.read", "execute")  # fmt: skip
    answer = json.loads(r.out)
    assert r.rc == 0 and answer["decision"] == "allow", r
    assert answer["rule"] == "allow coder_t tool:fs.read execute"
    assert answer["policies"] == [
        {"policy": str(agent), "allows": True},
        {"policy": str(tool), "allows": True},
    ]
    denied = ctx_run("policy", "query", "--policy", agent, "--policy", tool, "--json",
                     "coder_t", "tool:shell.exec", "execute")  # fmt: skip
    assert denied.rc == 1 and json.loads(denied.out)["decision"] == "deny", denied
    assert [p["allows"] for p in json.loads(denied.out)["policies"]] == [True, False]
    malformed = ctx_run("policy", "query", "--policy", agent, "--json",
                        "coder_t", "bogus:x", "execute")  # fmt: skip
    assert malformed.rc == 2 and json.loads(malformed.out)["error"] == "EINVAL"
