"""Policy v0 (SPEC §5, P-1..P-8) read by its three readers: ``ctx policy check`` and ``ctx policy
query`` on policy files, and the authority chain of ``ctx policy explain`` and ``ctx run``.

Arbitrary text (random rule lines, near misses, junk bytes, CRLF, a BOM, tabs, NUL, invalid
UTF-8, comments in any bytes, long lines, many rules) is judged against a reference reading of
P-1..P-4 written here from the specification and docs/policy.md: ``check`` accepts exactly what
that reading accepts and names every other line ``FILE:LINE: EINVAL``; ``query`` and
``explain`` read the same file the same way.  Random small agent and object policies, labels
and requests give one verdict through ``query``, ``explain`` and the real ``ctx run --agent A
TOOL``: default deny, both layers of P-6, an invalid line never overridden, the first denying
step named (P-5).  ``explain``'s text and ``--json`` say the same, and the paths it echoes
reach the terminal escaped."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.acceptance.ctxcli import OnStorage, Run, clean_env, ctx_run, scratch_top, tool_manifest

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents as another uid")

SCRATCH = scratch_top(__file__)
ECHO = "#!/bin/sh\ncat\n"  # prints its input back
TOOLS = ("demo.echo", "demo.two")
# agent -> (label, the tools its request lists)
AGENTS = {
    "coder": ("coder_t", ["demo.echo", "demo.two"]),
    "rev": ("rev_t", ["demo.echo"]),
    "reader": ("reader_t", []),
}
MODEL = "prov/m1"
STEP_NAMES = [
    "peer credentials",
    "mode bits",
    "mount visibility",
    "agent label",
    "object policy",
    "tool/model policy",
]
FAST = settings(
    max_examples=10,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# ====================================================================== the reference reading

# P-3, to the letter.
P3 = {
    "tool": ("execute",),
    "model": ("use",),
    "shared": ("read", "write"),
    "session": ("read", "write", "resume"),
    "mount": ("read", "write"),
    "agent": ("create", "start", "stop", "read", "write"),
    "network": ("connect",),
}
OBJECT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
RULE_BYTES = frozenset(range(0x20, 0x7F)) | {0x09}
BAD = "bad"


def legal_name(word: str) -> bool:
    """R-3: 1..64 bytes of [A-Za-z0-9._-], first alphanumeric, not ending in ``.d``."""
    return OBJECT_NAME.fullmatch(word) is not None and not word.endswith(".d")


def reference_line(raw: bytes) -> tuple[str, str, str, str] | str | None:
    """One line as P-1..P-4 and docs/policy.md read it: None (blank or comment), the rule's
    four fields, or BAD."""
    body = raw.lstrip(b" \t")
    if not body or body.startswith(b"#"):
        return None
    if not set(raw) <= RULE_BYTES:
        return BAD
    words = [word for word in re.split(r"[ \t]+", raw.decode("ascii")) if word]
    if len(words) != 4 or words[0] != "allow":
        return BAD
    _, subject, ref, perm = words
    cls, colon, name = ref.partition(":")
    if not (colon and cls in P3 and perm in P3[cls] and legal_name(subject)):
        return BAD
    if cls == "network":
        ok = name == "default"
    elif cls == "model":
        parts = name.split("/")
        ok = len(parts) == 2 and all(map(legal_name, parts))
    else:
        ok = legal_name(name)
    return (subject, cls, name, perm) if ok else BAD


def reference(data: bytes) -> tuple[set[tuple[str, str, str, str]], list[int]]:
    """The rules of a policy and the numbers of its invalid lines (lines end at LF only)."""
    rules, bad = set(), []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        read = reference_line(raw)
        if read == BAD:
            bad.append(number)
        elif read is not None:
            rules.add(read)
    return rules, bad


def rule_text(rule: tuple[str, str, str, str]) -> str:
    subject, cls, name, perm = rule
    return f"allow {subject} {cls}:{name} {perm}"


# ====================================================================== generated policies

SUBJECTS = ["coder_t", "rev_t", "reader_t", "x", "A-1.b_t", "s" * 64, "Coder_t"]
NAMES = {
    "tool": ["demo.echo", "demo.two", "fs.read", "t" * 64],
    "model": [MODEL, "openai/gpt-5.6"],
    "shared": ["project-a"],
    "session": ["s1"],
    "mount": ["ctx", "workspace"],
    "agent": ["kid", "coder"],
    "network": ["default"],
}
FRAGMENTS = [
    "*", "?", "[", "]", "$X", "%{n}", "{n}", "<c>", "/", ".d", "\t", " ", "\r", "\x00",
    "\x1b[31m", "\x0b", "\x0c", "\x7f", "\x85", "é", "\ufeff", "\u00a0", "\u2028", "#", ":",
    "deny", "Allow", "allow", "A", "-", "_", "x" * 70, "..",
]  # fmt: skip
RAW_FRAGMENTS = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\r"]
LONG_LINES = [
    b"allow coder_t tool:demo.echo execute " + b"y " * 30000,
    b"allow coder_t tool:" + b"x" * 100000 + b" execute",
    b"z" * 200000,
    b"#" + bytes(range(256)).replace(b"\n", b"") * 100,
]


@st.composite
def valid_rules(draw: st.DrawFn) -> bytes:
    cls = draw(st.sampled_from(sorted(P3)))
    name = draw(st.sampled_from(NAMES[cls]))
    perm = draw(st.sampled_from(P3[cls]))
    subject = draw(st.sampled_from(SUBJECTS))
    seps = [draw(st.sampled_from([" ", "\t", "  ", " \t"])) for _ in range(3)]
    lead = draw(st.sampled_from(["", "", " ", "\t"]))
    trail = draw(st.sampled_from(["", "", " ", "\t"]))
    words = ["allow", subject, f"{cls}:{name}", perm]
    line = (
        lead
        + words[0]
        + "".join(sep + word for sep, word in zip(seps, words[1:], strict=True))
        + trail
    )
    return line.encode()


@st.composite
def near_misses(draw: st.DrawFn) -> bytes:
    line = draw(valid_rules())
    at = draw(st.integers(0, len(line)))
    how = draw(st.sampled_from(["insert", "replace", "delete", "raw"]))
    if how == "raw":
        return line[:at] + draw(st.sampled_from(RAW_FRAGMENTS)) + line[at:]
    fragment = draw(st.sampled_from(FRAGMENTS)).encode()
    if how == "insert":
        return line[:at] + fragment + line[at:]
    if how == "replace":
        return line[:at] + fragment + line[at + len(fragment) :]
    return line[:at] + line[at + draw(st.integers(1, 6)) :]


comments = st.builds(
    lambda lead, body: lead + b"#" + body,
    st.sampled_from([b"", b" ", b"\t", b" \t "]),
    st.binary(max_size=24).map(lambda b: b.replace(b"\n", b"")),
)
blanks = st.sampled_from([b"", b" ", b"\t", b" \t \t"])
junk = st.binary(max_size=24)
lines = st.one_of(
    valid_rules(),
    valid_rules(),
    near_misses(),
    near_misses(),
    comments,
    blanks,
    junk,
    st.sampled_from(LONG_LINES),
)


@st.composite
def documents(draw: st.DrawFn, extra: list[bytes] | None = None) -> bytes:
    """A policy file's bytes: generated lines (plus ``extra``), shuffled, joined by LF or
    CRLF, maybe after a BOM, maybe without a final newline."""
    body = draw(st.lists(lines, max_size=8)) + list(extra or [])
    body = draw(st.permutations(body)) if body else body
    ending = draw(st.sampled_from([b"\n", b"\n", b"\n", b"\r\n"]))
    data = ending.join(body) + draw(st.sampled_from([ending, b""]))
    if draw(st.integers(0, 9)) == 0:
        data = b"\xef\xbb\xbf" + data
    return data


# ====================================================================== the world


@dataclass
class World(OnStorage):
    """A bootstrapped storage root every uid may search, with tools :data:`TOOLS` (running
    ``cat``), the agents of :data:`AGENTS` made by ``ctx agent create``, model
    :data:`MODEL` and a directory for policy files."""

    top: Path

    @property
    def storage(self) -> Path:
        return self.top / "storage"

    @property
    def files(self) -> Path:
        return self.top / "files"

    def control(self, rel: str, data: bytes, mode: int = 0o644) -> None:
        """``storage/rel`` written as the host writes a control: a root-owned temp file renamed
        over it."""
        path = self.storage / rel
        temp = path.with_name(path.name + ".edit")
        temp.write_bytes(data)
        temp.chmod(mode)
        os.replace(temp, path)

    def policy_file(self, name: str, data: bytes) -> Path:
        path = self.files / name
        path.write_bytes(data)
        return path

    def explain(self, agent: str, obj: str, perm: str, *extra: str) -> tuple[Run, dict]:
        r = self.ctx("policy", "explain", agent, obj, perm, "--json", *extra)
        assert r.rc in (0, 1) and no_traceback(r.err), r
        verdict = r.json()
        assert verdict["allowed"] is (r.rc == 0), r
        return r, verdict

    def run_tool(self, agent: str, tool: str, n: int = 1) -> tuple[Run, str]:
        value = json.dumps({"n": n})
        return self.ctx("run", "--agent", agent, tool, input=value, timeout=60), value


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    SCRATCH.mkdir(mode=0o755, exist_ok=True)
    SCRATCH.chmod(0o755)
    top = Path(tempfile.mkdtemp(prefix="agree-", dir=SCRATCH))
    top.chmod(0o755)
    w = World(top)
    try:
        w.files.mkdir()
        assert ctx_run("bootstrap", "--storage", w.storage).rc == 0
        for tool in TOOLS:
            manifest = tool_manifest(top / "src", tool, ECHO)
            r = w.ctx("object", "install", manifest, "--tier", "system")
            assert r.rc == 0, r
        for agent, (label, tools) in AGENTS.items():
            req = {"name": agent, "label": label, "tools": tools}
            r = w.ctx("agent", "create", "-", input=json.dumps(req))
            assert r.rc == 0, r
        provider = w.storage / "model" / MODEL.split("/")[0]
        provider.mkdir(mode=0o755)
        (provider / "m1").write_text("a model entry\n")
        (provider / "m1.d").mkdir(mode=0o755)
        w.control(f"model/{MODEL}.d/policy", b"")
        yield w
    finally:
        shutil.rmtree(top, ignore_errors=True)


ERROR_LINE = re.compile(r"(?P<file>.*):(?P<line>[0-9]+): EINVAL: (?P<reason>\S.*)")


def no_traceback(text: str) -> bool:
    """No Python traceback (a policy line quoting the word is no traceback)."""
    return re.search(r"^Traceback \(most recent call last\)", text, re.MULTILINE) is None


def terminal_safe(text: str) -> bool:
    """No control character (nor DEL, nor a C1 control) but the line ends."""
    return not any((ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) < 0xA0 for c in text)


def einval_lines(r: Run) -> list[tuple[str, int, str]]:
    """Every stderr line of a refused ``check``/``query`` as (file, line, reason); each must be
    ``FILE:LINE: EINVAL: <reason>`` and safe on a terminal."""
    assert no_traceback(r.err) and terminal_safe(r.err), r
    found = []
    for text in r.err.splitlines():
        match = ERROR_LINE.fullmatch(text)
        assert match, (text, r)
        found.append((match["file"], int(match["line"]), match["reason"]))
    return found


# ====================================================================== check, query, explain


@settings(FAST, max_examples=25)
@given(st.lists(documents(), min_size=3, max_size=3), documents())
@example(
    [
        b"\xef\xbb\xbf# a comment after a BOM\nallow coder_t tool:demo.echo execute\n",
        b"allow coder_t tool:demo.echo execute\r\n\r\n# crlf comment\r\n",
        b"allow\tcoder_t\ttool:demo.echo\texecute\t\n  \t# tabs\n\t\n",
    ],
    b"# \xff\xfe \x00 \x1b[2J comment\nallow coder_t tool:demo.echo exe\x00cute\n\xff\n",
)
@example(
    [
        b"".join(b"allow a%d_t tool:t%d execute\n" % (i, i) for i in range(10000)),
        b"allow coder_t model:prov/m1 use\nallow coder_t model:prov use\n"
        b"allow coder_t model:p/m/x use\nallow coder_t model:p.d/m use\n",
        b"allow " + b"s" * 64 + b" tool:" + b"t" * 64 + b" execute\n"
        b"allow " + b"s" * 65 + b" tool:t execute\nallow s_t tool:" + b"t" * 65 + b" execute\n",
    ],
    b"allow x network:default connect\nallow x network:Default connect\n"
    b"allow x.d tool:t execute\nallow x tool:t.d execute\nallow x tool:t read\n",
)
def test_check_accepts_exactly_the_grammar_and_names_every_other_line(
    world: World, docs: list[bytes], piped: bytes
) -> None:
    """P-1..P-4, P-8: ``ctx policy check --json`` on three files and a pipe (``-``) of arbitrary
    text accepts each file exactly when the reference reading of P-1..P-4 finds no invalid
    line; otherwise it exits 1 with one ``FILE:LINE: EINVAL: <reason>`` line per invalid line
    (LINE counting blank and comment lines), each safe on a terminal, and the same lines in
    its JSON; never a traceback."""
    names = [str(world.policy_file(f"doc{i}", data)) for i, data in enumerate(docs)]
    r = world.ctx("policy", "check", *names, "-", "--json", input=piped)
    expected = {
        name: reference(data)[1] for name, data in zip([*names, "-"], [*docs, piped], strict=True)
    }
    valid = all(not bad for bad in expected.values())
    assert r.rc == (0 if valid else 1), (r, expected)
    said = einval_lines(r)
    assert [(f, n) for f, n, _ in said] == [(f, n) for f, bad in expected.items() for n in bad]
    report = r.json()
    assert report["valid"] is valid
    assert [f["file"] for f in report["files"]] == [*names, "-"]
    for entry in report["files"]:
        problems = entry["problems"]
        assert entry["valid"] is (not expected[entry["file"]]), entry
        assert [p["line"] for p in problems] == expected[entry["file"]], entry
        assert {(p["error"], p["errno"]) for p in problems} <= {("EINVAL", 22)}, entry
        reasons = [reason for f, _, reason in said if f == entry["file"]]
        assert [p["message"] for p in problems] == reasons, entry


NETWORK_RULE = ("reader_t", "network", "default", "connect")


@settings(FAST, max_examples=10)
@given(documents(extra=[rule_text(NETWORK_RULE).encode()]) | documents())
@example(b"allow reader_t network:default connect\ndeny reader_t network:default connect\n")
@example(b"deny reader_t network:default connect\nallow reader_t network:default connect\n")
@example(b"allow reader_t network:default connect # granted\n")
@example(b"\xef\xbb\xbf# BOM\r\nallow reader_t network:default connect\r\n")
@example(b"allow reader_t network:* connect\nallow reader_t\tnetwork:default  connect\n")
def test_what_check_accepts_query_and_explain_read_the_same_way(world: World, data: bytes) -> None:
    """P-1, P-2, P-5 (step 5), P-8: one arbitrary text as a policy file and as agent
    ``reader``'s policy.  Valid for the reference reading (which ``check`` follows, above):
    ``query`` (given it as a file and again as ``-``) and ``explain`` grant ``reader_t
    network:default connect`` exactly when the text holds that rule.  Invalid: ``query``
    exits 2 naming every invalid line as ``FILE:LINE: EINVAL``, and ``explain`` denies at
    step 5 with EACCES naming ``agent/reader.d/policy``, the first invalid line and the same
    reason — an invalid line is never overridden by a valid rule, before or after it."""
    rules, bad = reference(data)
    path = world.policy_file("one", data)
    q = world.ctx("policy", "query", "--policy", path, "--policy", "-", "reader_t",
                  "network:default", "connect", input=data)  # fmt: skip
    if bad:
        assert (q.rc, q.out) == (2, ""), q
        said = einval_lines(q)
        assert [(f, n) for f, n, _ in said] == [(str(path), n) for n in bad], q
        reasons = [reason for _, _, reason in said]
    else:
        granted = NETWORK_RULE in rules
        assert (q.rc, q.out) == ((0, "allow\n") if granted else (1, "deny\n")), q

    world.control("agent/reader.d/policy", data)
    _, verdict = world.explain("reader", "network:default", "connect")
    if bad:
        assert (verdict["step"], verdict["errno"]) == (5, "EACCES"), verdict
        where = f"step 5 (object policy): agent/reader.d/policy:{bad[0]}: {reasons[0]}"
        assert verdict["reason"].startswith(where), (verdict, where)
        assert verdict["reason"].endswith("; an invalid policy grants nothing"), verdict
    else:
        assert verdict["allowed"] is (NETWORK_RULE in rules), verdict
        if not verdict["allowed"]:
            assert verdict["step"] == 5, verdict
            assert f"has no rule '{rule_text(NETWORK_RULE)}'" in verdict["reason"], verdict


# ====================================================================== three readers, one verdict

REQUESTS = [
    ("tool", "demo.echo", "execute"),
    ("tool", "demo.two", "execute"),
    ("model", MODEL, "use"),
    ("network", "default", "connect"),
    ("agent", "kid", "create"),
    ("agent", "coder", "read"),
]
LABELS = {"coder": "coder_t", "rev": "rev_t"}


@st.composite
def small_policies(draw: st.DrawFn, agent_label: str) -> bytes:
    """A few lines over the names the requests use: the exact rules, near relatives (another
    subject, class, name or permission), the mount grant, comments, and now and then a line
    P-2 forbids."""
    subjects = [agent_label, "coder_t", "rev_t", "x"]
    pool = []
    for cls, name, perm in REQUESTS:
        for subject in subjects:
            pool.append(f"allow {subject} {cls}:{name} {perm}")
    pool += [
        f"allow {s} mount:ctx {p}" for s in subjects for p in ("read", "write")
    ]  # fmt: skip
    pool += [
        f"allow {agent_label} agent:demo.echo read",
        f"allow {agent_label} session:demo.echo read",
        f"allow {agent_label} tool:demo.echoes execute",
        "# a comment",
        "",
    ]
    forbidden = [
        f"deny {agent_label} tool:demo.echo execute",
        f"allow {agent_label} tool:* execute",
        f"allow {agent_label} tool:demo.echo execute 10",
        f"allow {agent_label} tool:demo.echo execute\r",
        f"allow {agent_label} tool:/ctx/tool/demo.echo execute",
        "allow $LABEL tool:demo.echo execute",
        f"allow {agent_label} tool:demo.echo read",
    ]
    chosen = draw(st.lists(st.sampled_from(pool), max_size=7))
    if draw(st.integers(0, 4)) == 0:
        chosen.insert(draw(st.integers(0, len(chosen))), draw(st.sampled_from(forbidden)))
    return "".join(line + "\n" for line in chosen).encode()


@st.composite
def scenarios(draw: st.DrawFn) -> dict:
    agent = draw(st.sampled_from(sorted(LABELS)))
    label = draw(st.sampled_from([LABELS[agent]] * 6 + ["rev_t", "x", "a.d", "c*_t"]))
    return {
        "agent": agent,
        "label": label,
        "request": draw(st.sampled_from(REQUESTS)),
        "agent_policy": draw(small_policies(LABELS[agent])),
        "object_policy": draw(small_policies(LABELS[agent])),
        "n": draw(st.integers(0, 10**6)),
    }


def expected_verdict(s: dict) -> tuple[int | None, str]:
    """P-5 and P-6 with every object present and visible (steps 1-3 pass): the first denying
    step and the text its reason must hold, or (None, "") when allowed."""
    agent, label = s["agent"], s["label"]
    cls, name, perm = s["request"]
    if not legal_name(label):
        return 4, f"agent/{agent}.d/label is invalid"
    rule = (label, cls, name, perm)
    agent_rules, agent_bad = reference(s["agent_policy"])
    if agent_bad:
        return 5, f"agent/{agent}.d/policy:{agent_bad[0]}: "
    if rule not in agent_rules:
        return 5, f"agent/{agent}.d/policy has no rule '{rule_text(rule)}'"
    if cls != "network" and (label, "mount", "ctx", "read") not in agent_rules:
        return 5, f"lacks 'allow {label} mount:ctx read'"
    if cls not in ("tool", "model"):
        return None, ""
    own = f"{cls}/{name}.d/policy"
    object_rules, object_bad = reference(s["object_policy"])
    if object_bad:
        return 6, f"{own}:{object_bad[0]}: "
    if rule not in object_rules:
        return 6, f"{own} has no rule '{rule_text(rule)}'"
    return None, ""


@settings(FAST, max_examples=10)
@given(scenarios())
@example(
    {
        "agent": "coder",
        "label": "coder_t",
        "request": ("tool", "demo.echo", "execute"),
        "agent_policy": b"allow coder_t mount:ctx read\nallow coder_t tool:demo.echo execute\n",
        "object_policy": b"allow coder_t tool:demo.echo execute\n",
        "n": 7,
    }
)
@example(
    {
        "agent": "rev",
        "label": "rev_t",
        "request": ("tool", "demo.two", "execute"),
        "agent_policy": b"allow rev_t mount:ctx read\nallow rev_t tool:demo.two execute\n",
        "object_policy": b"allow rev_t tool:demo.two execute\n"
        b"allow rev_t tool:demo.two execute 0\n",
        "n": 8,
    }
)
def test_query_explain_and_run_give_one_verdict(world: World, scenario: dict) -> None:
    """P-2, P-5, P-6, P-8: for a random agent label, agent policy, object policy and request
    (tool, model, network, agent), ``query`` over the layers that apply, ``explain`` and, for
    a tool, the real ``ctx run --agent A TOOL`` agree: allowed only when
    every layer holds the exact rule (and the agent's policy grants ``mount:ctx``, through
    which the object is seen), otherwise denied with EACCES at the first step that denies,
    ``run`` refusing with exit 126 and the very reason ``explain`` gives."""
    s = scenario
    agent, label = s["agent"], s["label"]
    cls, name, perm = s["request"]
    world.control(f"agent/{agent}.d/label", f"{label}\n".encode())
    world.control(f"agent/{agent}.d/policy", s["agent_policy"])
    own = f"{cls}/{name}.d/policy"
    if cls in ("tool", "model"):
        world.control(own, s["object_policy"])
    step, says = expected_verdict(s)

    # query: every layer must allow; a malformed subject or layer is exit 2, EINVAL.
    layers = [world.policy_file("agent", s["agent_policy"])]
    if cls in ("tool", "model"):
        layers.append(world.policy_file("object", s["object_policy"]))
    args = [arg for layer in layers for arg in ("--policy", layer)]
    q = world.ctx("policy", "query", *args, label, f"{cls}:{name}", perm)
    malformed = not legal_name(label) or any(reference(p.read_bytes())[1] for p in layers)
    if malformed:
        assert q.rc == 2 and "EINVAL" in q.err and q.out == "", q
    else:
        rule = (label, cls, name, perm)
        granted = all(rule in reference(p.read_bytes())[0] for p in layers)
        assert (q.rc, q.out) == ((0, "allow\n") if granted else (1, "deny\n")), q
        if step is None:
            assert granted, (q, s)  # explain may deny more, never allow more

    # explain
    _, verdict = world.explain(agent, f"{cls}:{name}", perm)
    assert verdict["step"] == step, (verdict, says)
    results = [entry["result"] for entry in verdict["steps"]]
    if step is None:
        assert set(results) <= {"pass", "n/a"}, verdict
    else:
        assert verdict["errno"] == "EACCES" and says in verdict["reason"], (verdict, says)
        assert verdict["reason"].startswith(f"step {step} ({STEP_NAMES[step - 1]}): ")
        assert results[step - 1] == "deny" and set(results[: step - 1]) <= {"pass", "n/a"}
        assert results[step:] == ["not reached"] * (6 - step), verdict

    # run: the real decision, for a tool
    if cls == "tool":
        r, value = world.run_tool(agent, name, s["n"])
        assert no_traceback(r.err), r
        if step is None:
            assert (r.rc, r.out) == (0, value), r
        else:
            assert r.rc == 126 and r.out == "", r
            assert f"ctx: EACCES: {verdict['reason']}" in r.err.splitlines(), r


# ====================================================================== the first denial decides


def test_the_first_denying_step_decides_and_no_later_allow_overrides_it(world: World) -> None:
    """P-5 (the order of checks: any denial denies, the decision records which step denied),
    P-2, P-6: with several steps failing at once, ``explain`` and ``ctx run`` name the earliest;
    a valid grant never outweighs a bad line, whether that line is in the agent's policy or
    the tool's, before or after the grant; the rule written in the agent's prompts or in an
    ``agent/<name>.d/tool`` file grants nothing (P-6)."""
    tool, agent, label = "demo.two", "reader", "reader_t"
    grant = f"allow {label} tool:{tool} execute\n"
    good_agent = f"allow {label} mount:ctx read\n{grant}".encode()
    executable = world.storage / "tool" / tool
    for not_a_policy in ("system.md", "prompt.template.md", "tool"):
        world.control(f"agent/{agent}.d/{not_a_policy}", grant.encode())
    only_mount = f"allow {label} mount:ctx read\n".encode()
    cases = [
        # (what is wrong, mode of the executable, agent policy, its mode, label, tool policy,
        #  expected step, text the reason holds)
        ("x bit, agent and tool policy", 0o744, b"deny x\n", 0o644, label, b"", 2, "needs --x"),
        ("agent's policy writable, and invalid", 0o755, b"deny x\n" + good_agent, 0o666, label,
         grant.encode(), 4, "writable by its group or by others"),
        ("label and policy invalid", 0o755, b"allow reader_t tool:* execute\n", 0o644, "p.d",
         grant.encode(), 4, "label is invalid"),
        ("agent lacks the rule, tool's policy invalid", 0o755, only_mount, 0o644, label,
         b"deny reader_t tool:demo.two execute\n", 5, "has no rule"),
        ("the grant only in prompts and a tool file", 0o755, only_mount, 0o644, label,
         grant.encode(), 5, "has no rule"),
        ("a bad line after the agent's grant", 0o755, good_agent + grant[:-1].encode()
         + b" # me\n", 0o644, label, grant.encode(), 5, "policy:3: unexpected text"),
        ("a bad line before the tool's grant", 0o755, good_agent, 0o644, label,
         b"allow reader_t tool:demo.two execute\r\n" + grant.encode(), 6, "policy:1: carriage"),
        ("both good", 0o755, good_agent, 0o644, label, grant.encode(), None, ""),
    ]  # fmt: skip
    try:
        for n, (what, xmode, agent_policy, amode, lab, tool_policy, step, says) in enumerate(cases):
            executable.chmod(xmode)
            world.control(f"agent/{agent}.d/policy", agent_policy, amode)
            world.control(f"agent/{agent}.d/label", f"{lab}\n".encode())
            world.control(f"tool/{tool}.d/policy", tool_policy)
            _, verdict = world.explain(agent, f"tool:{tool}", "execute")
            assert verdict["step"] == step, (what, verdict)
            assert says in (verdict["reason"] or ""), (what, verdict)
            r, value = world.run_tool(agent, tool, n)
            if step is None:
                assert (r.rc, r.out) == (0, value), (what, r)
            else:
                assert r.rc == 126 and r.out == "", (what, r)
                assert f"ctx: EACCES: {verdict['reason']}" in r.err.splitlines(), (what, r)
    finally:
        executable.chmod(0o755)
        world.control(f"agent/{agent}.d/label", f"{label}\n".encode())


# ====================================================================== many rules


def test_many_rules_and_one_bad_line_at_the_end(world: World) -> None:
    """P-1, P-2, P-6, P-8: an agent policy and a tool policy of 10 000 rules each, the grant
    among the last: ``check`` accepts both, ``query``, ``explain`` and ``run`` allow; one
    invalid line appended after them all makes ``check`` name that line, ``query`` exit 2,
    and ``explain`` and ``run`` deny at step 5 naming the same line."""
    agent, label, tool = "rev", "rev_t", "demo.echo"
    grant = f"allow {label} tool:{tool} execute"
    filler = "".join(f"allow a{i}_t tool:t{i} execute\n" for i in range(10000))
    agent_text = f"allow {label} mount:ctx read\n{filler}{grant}\n".encode()
    tool_text = f"{filler}{grant}\n".encode()
    world.control(f"agent/{agent}.d/label", f"{label}\n".encode())
    world.control(f"tool/{tool}.d/policy", tool_text)
    for bad in (None, b"allow rev_t tool:demo.echo execute;\n"):
        text = agent_text + (bad or b"")
        world.control(f"agent/{agent}.d/policy", text)
        a = world.policy_file("many-agent", text)
        t = world.policy_file("many-tool", tool_text)
        checked = world.ctx("policy", "check", a, t)
        q = world.ctx("policy", "query", "--policy", a, "--policy", t, label, f"tool:{tool}",
                      "execute")  # fmt: skip
        _, verdict = world.explain(agent, f"tool:{tool}", "execute")
        r, value = world.run_tool(agent, tool)
        if bad is None:
            assert (checked.rc, checked.err) == (0, ""), checked
            assert (q.rc, q.out) == (0, "allow\n"), q
            assert verdict["allowed"] is True, verdict
            assert (r.rc, r.out) == (0, value), r
            continue
        line = text.count(b"\n")
        assert checked.rc == 1 and [n for _, n, _ in einval_lines(checked)] == [line], checked
        assert q.rc == 2 and [n for _, n, _ in einval_lines(q)] == [line], q
        assert verdict["step"] == 5, verdict
        assert f"agent/{agent}.d/policy:{line}: " in verdict["reason"], verdict
        assert r.rc == 126 and f"ctx: EACCES: {verdict['reason']}" in r.err.splitlines(), r


# ====================================================================== explain's output

STEP_LINE = re.compile(
    r"  (?P<step>[1-6]) (?P<name>.{18}) (?P<verdict>.{12}) (?P<detail>.*)"
)  # fmt: skip


def text_and_json_agree(world: World, agent: str, obj: str, perm: str) -> dict:
    """``explain`` as text and as ``--json``: the same verdict, step by step."""
    text = world.ctx("policy", "explain", agent, obj, perm)
    r, verdict = world.explain(agent, obj, perm)
    assert text.rc == r.rc and no_traceback(text.err) and terminal_safe(text.out), text
    head, *rows, last = text.lines()
    assert head == f"agent {agent}: {obj} {perm}", text
    assert len(rows) == 6 and len(verdict["steps"]) == 6, text
    for row, entry, name in zip(rows, verdict["steps"], STEP_NAMES, strict=True):
        match = STEP_LINE.fullmatch(row)
        assert match, row
        assert (int(match["step"]), match["name"].rstrip()) == (entry["step"], name), row
        assert entry["name"] == name, entry
        shown = entry["result"] + (f" {entry['errno']}" if entry["errno"] else "")
        assert match["verdict"].rstrip() == shown, (row, entry)
        if entry["detail"].isprintable():
            assert match["detail"] == entry["detail"], (row, entry)
    if verdict["allowed"]:
        assert last == "allow" and verdict["step"] is None, text
        assert verdict["reason"].startswith("allowed"), verdict
    else:
        assert verdict["step_name"] == STEP_NAMES[verdict["step"] - 1], verdict
        assert last == f"deny: {verdict['errno']}: {verdict['reason']}", text
        assert verdict["reason"].startswith(f"step {verdict['step']} ({verdict['step_name']}): "), (
            verdict
        )
    assert (verdict["agent"], verdict["object"], verdict["permission"]) == (agent, obj, perm)
    return verdict


def test_explain_text_and_json_name_the_step_and_the_file_that_decided(world: World) -> None:
    """P-5, P-6, P-8 (docs/policy.md, Commands): ``explain`` prints the six steps in order, each
    with its result, and a last line ``allow`` or ``deny: ERRNO: step N (name): reason`` that
    names the policy file and the rule (or line) that decided; ``--json`` carries the same
    verdict, step, step name, errno, reason and steps."""
    agent, label, tool = "rev", "rev_t", "demo.echo"
    rule = f"allow {label} tool:{tool} execute"
    world.control(f"agent/{agent}.d/label", f"{label}\n".encode())
    world.control(f"agent/{agent}.d/policy", f"allow {label} mount:ctx read\n{rule}\n".encode())
    world.control(f"tool/{tool}.d/policy", f"# own\n{rule}\n".encode())
    allowed = text_and_json_agree(world, agent, f"tool:{tool}", "execute")
    assert allowed["allowed"] is True
    details = [entry["detail"] for entry in allowed["steps"]]
    assert details[4].startswith(f"agent/{agent}.d/policy: {rule}"), details
    assert details[5] == f"tool/{tool}.d/policy: {rule}", details

    world.control(f"tool/{tool}.d/policy", f"# own\n\n{rule} # note\n".encode())
    at6 = text_and_json_agree(world, agent, f"tool:{tool}", "execute")
    assert (at6["step"], at6["errno"]) == (6, "EACCES"), at6
    assert at6["reason"].startswith(f"step 6 (tool/model policy): tool/{tool}.d/policy:3: ")

    world.control(f"tool/{tool}.d/policy", f"{rule}\n".encode())
    at5 = text_and_json_agree(world, agent, "network:default", "connect")
    assert [s["result"] for s in at5["steps"]] == ["pass", "n/a", "n/a", "pass", "deny",
                                                   "not reached"]  # fmt: skip
    assert (
        f"agent/{agent}.d/policy has no rule 'allow {label} network:default connect'"
        in (at5["reason"])
    )
    missing = text_and_json_agree(world, agent, "tool:no.such", "execute")
    assert (missing["step"], missing["errno"]) == (2, "ENOENT"), missing


def test_explain_escapes_control_bytes_of_the_paths_it_echoes(world: World) -> None:
    """P-5 (steps 2 and 3 name what they judged), P-8: a storage root copied to a directory
    whose name holds ESC and a newline denies the agent's call at step 3 (its mount names the
    old root) and an agent whose mount source has such a name is denied at step 2: ``explain``
    names both paths with the control bytes escaped in its text, ``--json`` holds them
    exactly, and the verdicts agree."""
    odd = world.top / "r\x1b[31m\nX"
    shutil.copytree(world.storage, odd / "storage", symlinks=True)
    try:
        env = clean_env(CTX_STORAGE=str(odd / "storage"))
        text = ctx_run("policy", "explain", "rev", "tool:demo.echo", "execute", env=env)
        js = ctx_run("policy", "explain", "rev", "tool:demo.echo", "execute", "--json", env=env)
        assert (text.rc, js.rc) == (1, 1), (text, js)
        verdict = js.json()
        assert verdict["step"] == 3 and str(odd / "storage") in verdict["reason"], verdict
        assert terminal_safe(text.out) and "r\\x1b[31m" in text.out, text

        source = odd / "src"
        source.mkdir(mode=0o700)
        req = {"name": "oddmount", "label": "oddmount_t", "tools": [],
               "mount": [[str(source), "/w", "ro"]]}  # fmt: skip
        made = world.ctx("agent", "create", "-", input=json.dumps(req))
        assert made.rc == 0 and terminal_safe(made.out + made.err), made
        text = world.ctx("policy", "explain", "oddmount", "mount:w", "read")
        _, verdict = world.explain("oddmount", "mount:w", "read")
        assert (text.rc, verdict["step"]) == (1, 2), (text, verdict)
        assert str(source) in verdict["reason"], verdict
        assert terminal_safe(text.out) and "r\\x1b[31m" in text.out, text
    finally:
        shutil.rmtree(odd, ignore_errors=True)


def test_run_escapes_the_control_bytes_of_the_reason_it_shares_with_explain(world: World) -> None:
    """P-5, P-8 and §0 (a refusal is shown safely): on a storage root copied to a directory
    whose name holds ESC, ``ctx run`` and ``explain`` deny the call at step 3 for the same
    reason; ``run`` must print it on the terminal as ``explain`` does, the ESC escaped."""
    odd = world.top / "run\x1b]0;title\x07\x1b[2J"
    shutil.copytree(world.storage, odd / "storage", symlinks=True)
    try:
        env = clean_env(CTX_STORAGE=str(odd / "storage"))
        explained = ctx_run("policy", "explain", "rev", "tool:demo.echo", "execute", env=env)
        assert explained.rc == 1 and terminal_safe(explained.out), explained
        r = ctx_run("run", "--agent", "rev", "demo.echo", input="{}", env=env)
        assert r.rc == 126 and "EACCES: step 3 (mount visibility)" in r.err, r
        assert terminal_safe(r.err), r
        said = explained.lines()[-1].removeprefix("deny: ")
        assert r.err.splitlines() == [f"ctx: {said}"], (explained, r)
    finally:
        shutil.rmtree(odd, ignore_errors=True)
