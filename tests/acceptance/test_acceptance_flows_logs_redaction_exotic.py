"""What the logs of a call keep when its input, argv, output or error holds secrets in unusual
shapes (SPEC S-2, S-3, S-4, T-3, T-7, W-1; docs/sessions.md "What logs may say (S-4)",
docs/tools.md "The result", docs/workers.md).

Real tools installed with ``ctx object install`` are called through ``ctx run`` (terminal and
``--native``) and through ``ctx queue work`` by agent ``coder``, which runs as the real test
user ``ctxtest``.  Every record of a call — the session's ``events.jsonl``, the tool's
``tool/<name>.d/log`` and ``ctx session show`` (text and ``--json``, run by root and by the
agent's own uid) — must hold none of the secrets, be strict UTF-8 and one JSON object a line,
and hold the summaries the documented rule gives, spelt out here case by case: keys in mixed
case, with Unicode or punctuation inside, keys that merely contain a secret word (or an
ordinary word that starts with one), name/value pairs, command lines as JSON lists and as
argv (bytes that are not UTF-8 among them), values shaped like well-known tokens under any
key, strings and keys at and around the 200-character cut in multi-byte text, the 8 KiB size
note, and error messages that quote what the input's summary hid.  What the caller gets (the
``result`` frame, a queue job's result) keeps the data whole."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    scratch_top,
    tool_manifest,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, find_or_create_user, run_as

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="needs root: the agent runs as the test user's uid"
)

SCRATCH = scratch_top(__file__)
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
R = "[redacted]"
TOOLS = ("demo.echo", "demo.args", "demo.refuse")

# Prints its JSON input back (native); in terminal mode prints nothing.
ECHO = """#!/bin/sh
input=$(cat)
printf '%s\\n' "$input"
"""
# Prints its argv as one JSON list.
ARGS = """#!/usr/bin/python3 -I
import json, sys
print(json.dumps(sys.argv[1:]))
"""
# Fails, quoting on the last line of its stderr what it was given: the word after --token in
# the input's "cmd", or else the input's "password" as Python's json writes it by default.
REFUSE = """#!/usr/bin/python3 -I
import json, sys
given = json.load(sys.stdin)
print("an earlier stderr line EARLY-0", file=sys.stderr)
if "cmd" in given:
    words = given["cmd"].split()
    print("deploy: the registry refused token " + words[words.index("--token") + 1],
          file=sys.stderr)
else:
    print(json.dumps({"error": "login refused", "tried": given["password"]}), file=sys.stderr)
sys.exit(3)
"""


# ---------------------------------------------------------------------------------- helpers


@dataclass
class World:
    """A storage root every uid may search, with the three demo tools and agent ``coder``
    (the test user) allowed to run them; each test records in sessions of its own."""

    top: Path
    storage: Path
    user: UnprivilegedUser

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage), PATH=PATH)

    def ctx(self, *args, **kw) -> Run:
        return ctx_run(*args, env=self.env, **kw)

    def session_file(self, session: str) -> Path:
        home = self.storage / "home" / str(self.user.uid)
        return home / "agent" / "coder" / "session" / session / "events.jsonl"

    def log(self, tool: str) -> Path:
        return self.storage / "tool" / f"{tool}.d" / "log"

    def native(self, tool: str, value, session: str) -> dict:
        text = value if isinstance(value, str) else json.dumps(value)
        ran = self.ctx(
            "run", "--agent", "coder", "--native", "--session", session, tool, input=text
        )
        frames = [json.loads(line) for line in ran.lines() if line.strip()]
        assert frames and frames[-1]["type"] == "result", ran
        return frames[-1]

    def events(self, session: str) -> list[dict]:
        return strict_lines(self.session_file(session))

    def call_events(self, session: str, call: str) -> tuple[dict, dict]:
        """The ``tool_call`` and ``tool_result`` of call ``call``, each exactly once."""
        mine = [e for e in self.events(session) if e.get("call") == call]
        assert [e["type"] for e in mine] == ["tool_call", "tool_result"], mine
        return mine[0], mine[1]

    def log_line(self, tool: str, call: str) -> dict:
        mine = [e for e in strict_lines(self.log(tool)) if e.get("call") == call]
        assert len(mine) == 1, mine
        return mine[0]

    def shown(self, session: str) -> list[str]:
        """``ctx session show`` of ``session``: text by root, ``--json`` by the agent's own uid
        (the owner of the home session), each line of it one JSON object."""
        argv = ["session", "show", "coder", "--session", session]
        text = self.ctx(*argv)
        assert text.rc == 0, text
        lines = run_as(self.user, [*CTX_ARGV, *argv, "--json"], env=self.env, cwd=self.top)
        assert lines.returncode == 0, lines
        shown = [json.loads(line) for line in lines.stdout.splitlines()]
        assert [e["call"] for e in shown if "call" in e] == [
            e["call"] for e in self.events(session) if "call" in e
        ], shown
        return [text.out, lines.stdout]

    def all_records(self, session: str) -> str:
        """Every byte the call records hold, what ``ctx session show`` prints of them, and
        every key and text of their events as a reader gets it back from the JSON."""
        paths = [self.session_file(session), *(self.log(tool) for tool in TOOLS)]
        texts = [path.read_bytes().decode("utf-8") for path in paths]
        texts += self.shown(session)
        texts += [text for path in paths for event in strict_lines(path) for text in strings(event)]
        return "\n".join(texts)


def strings(value) -> list[str]:
    """Every key and string of a parsed JSON value."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for key, item in value.items() for text in [key, *strings(item)]]
    if isinstance(value, list):
        return [text for item in value for text in strings(item)]
    return []


def strict_lines(path: Path) -> list[dict]:
    """The events of a log, each line strict UTF-8 holding one JSON object, no NaN."""

    def refuse(constant: str):
        raise AssertionError(f"{path} holds {constant}, which strict JSON has not")

    events = []
    for raw in path.read_bytes().splitlines():
        event = json.loads(raw.decode("utf-8"), parse_constant=refuse)
        assert isinstance(event, dict), raw
        events.append(event)
    return events


def leaked(text: str, secrets: list[str]) -> list[str]:
    return [secret for secret in secrets if secret in text]


def cut(text: str) -> str:
    """The documented summary of a text holding no secret: its first 200 characters and how
    many it dropped."""
    return text if len(text) <= 200 else f"{text[:200]}…[+{len(text) - 200} chars]"


def summaries(world: World, tool: str, session: str, frame: dict) -> list:
    """The input and output summaries of one native call, from the session and the log."""
    call, done = world.call_events(session, frame["call"])
    logged = world.log_line(tool, frame["call"])
    return [call["input"], done.get("output"), logged["input"], logged.get("output")]


@pytest.fixture(scope="module")
def user() -> UnprivilegedUser:
    return find_or_create_user()


@pytest.fixture(scope="module")
def world(_template: Path, user: UnprivilegedUser) -> Iterator[World]:
    top = new_scratch_dir(SCRATCH, "w")
    try:
        made = World(top, copy_of_root(_template, top / "storage"), user)
        for name, program in (("demo.echo", ECHO), ("demo.args", ARGS), ("demo.refuse", REFUSE)):
            manifest = tool_manifest(top / "src", name, program)
            done = made.ctx("object", "install", manifest, "--tier", "system")
            assert done.rc == 0, done
            with made.log(name).with_name("policy").open("a") as policy:
                policy.write(f"allow coder_t tool:{name} execute\n")
        request = {"name": "coder", "label": "coder_t", "tools": list(TOOLS), "mount": []}
        created = made.ctx("agent", "create", "-", "--user", user.name, input=json.dumps(request))
        assert created.rc == 0, created
        yield made
    finally:
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------------- which keys count


def test_key_spellings_are_judged_by_the_documented_key_rule(world: World) -> None:
    """S-4: a key names a secret when, lower-cased with all but letters and digits dropped, it
    contains a secret word (not counting ``tokenizer``/``secretary``), or its last word is
    ``auth``: mixed case, a space, a soft hyphen, a Kelvin sign that lower-cases to ``k``,
    ``X-Auth``/``proxyAuth``, ``tokenizer_secret``, and the documented over-hiding of
    ``max_tokens``/``token_count`` all lose their values whatever their JSON type; the
    ordinary words (``tokenizer``, ``secretary``, ``passenger``, ``author``, ``auth_url``,
    ``oauth``, a German ``Passwörter``) keep theirs."""
    secret_keys = {
        "PassWord": "PWk-01",
        "pass word": "PWk-02",
        "pass\u00adword": "PWk-03",
        "TO\u212aEN": "TKk-04",
        "X-Auth": "XAk-05",
        "proxyAuth": "PAk-06",
        "tokenizer_secret": "TSk-07",
        "max_tokens": 1024,
        "token_count": 77,
        "passwordless": True,
        "API_KEY": None,
        "Cookie": {"sid": "CKk-08"},
        "credentials": ["CRk-09", {"inner": "CRk-10"}],
    }
    plain_keys = {
        "tokenizer": "bpe",
        "secretary": "ana",
        "passenger": "bo",
        "author": "cy",
        "auth_url": "https://id.example/auth",
        "oauth": "enabled",
        "Passwörter": "sind-geheim",
    }
    value = {**secret_keys, **plain_keys}
    frame = world.native("demo.echo", value, "keys")
    assert frame["status"] == "ok" and frame["output"] == value, frame
    expected = {**dict.fromkeys(secret_keys, R), **plain_keys}
    for summary in summaries(world, "demo.echo", "keys", frame):
        assert summary == expected, summary
    secrets = [v for v in secret_keys.values() if isinstance(v, str)]
    secrets += ["CKk-08", "CRk-09", "CRk-10", "1024"]
    assert leaked(world.all_records("keys"), secrets) == []


def test_keys_that_only_look_like_the_ordinary_words_still_name_a_secret(world: World) -> None:
    """S-4: only the ordinary words ``tokenizer``/``tokenize…``/``secretary`` are not counted;
    ``secret_args``, ``SecretArchive`` and ``access_token_issued`` hold ``secret`` and
    ``token`` as words of their own and lose their values."""
    value = {
        "secret_args": ["--key-file", "SAk-11"],
        "SecretArchive": "SAk-12",
        "access_token_issued": "TKk-13",
    }
    frame = world.native("demo.echo", value, "ordinary")
    assert frame["output"] == value, frame
    for summary in summaries(world, "demo.echo", "ordinary", frame):
        assert summary == dict.fromkeys(value, R), summary
    assert leaked(world.all_records("ordinary"), ["SAk-11", "SAk-12", "TKk-13"]) == []


# --------------------------------------------------------------- depth, pairs, command lines


def test_nested_pairs_and_command_lines_keep_only_what_the_rule_keeps(world: World) -> None:
    """S-4: a secret five objects deep loses its value, the sixth level becomes a note; header
    pairs in a list of lists, Kubernetes/HAR/CloudFormation/Beanstalk name-value objects
    (whatever the value's type), and command lines given as JSON lists (mysql ``-pX``,
    ``docker login -p X``, curl ``-u user:X``, openssl ``-pass pass:X``, sshpass, htpasswd
    ``-b``, ``--password`` with a number) lose exactly their secrets; the same options of
    other programs (``mkdir -p``, ``ssh -p``, ``openssl -pass env:VAR``) are kept."""
    value = {
        "l1": {"l2": {"l3": {"l4": {"l5": {"password": "PWn-01", "l6": {"x": "NOTE-02"}}}}}},
        "headers": [["Cookie", "sid=CKn-03"], ["X-Api-Key", 44556677], ["Accept", "json"]],
        "env": [{"name": "DB_PASSWORD", "value": "PWn-04"}, {"name": "HOME", "value": "/root"}],
        "params": [
            {"ParameterKey": "DbPassword", "ParameterValue": "PWn-05"},
            {"OptionName": "ApiToken", "Value": ["TKn-06"]},
        ],
        "har": {"Name": "Authorization", "Value": "token GHn-07"},
        "cmds": [
            ["mysql", "-uroot", "-pPWn-08", "app"],
            ["docker", "login", "-u", "me", "-p", "PWn-09"],
            ["curl", "-u", "admin:PWn-10", "https://x.example"],
            ["openssl", "enc", "-pass", "pass:PWn-11", "-in", "f"],
            ["sshpass", "-p", "PWn-12", "ssh", "h"],
            ["htpasswd", "-b", "users", "ana", "PWn-13"],
            ["psql", "--port", 5432, "--password", 99887766],
            ["openssl", "enc", "-pass", "env:VAR"],
            ["mkdir", "-p", "dir"],
            ["ssh", "-p", "2222", "host"],
        ],
    }
    expected = {
        "l1": {"l2": {"l3": {"l4": {"l5": {"password": R, "l6": "[1 keys elided]"}}}}},
        "headers": [["Cookie", R], ["X-Api-Key", R], ["Accept", "json"]],
        "env": [{"name": "DB_PASSWORD", "value": R}, {"name": "HOME", "value": "/root"}],
        "params": [
            {"ParameterKey": "DbPassword", "ParameterValue": R},
            {"OptionName": "ApiToken", "Value": R},
        ],
        "har": {"Name": "Authorization", "Value": R},
        "cmds": [
            ["mysql", "-uroot", f"-p{R}", "app"],
            ["docker", "login", "-u", "me", "-p", R],
            ["curl", "-u", f"admin:{R}", "https://x.example"],
            ["openssl", "enc", "-pass", f"pass:{R}", "-in", "f"],
            ["sshpass", "-p", R, "ssh", "h"],
            ["htpasswd", "-b", "users", "ana", R],
            ["psql", "--port", 5432, "--password", R],
            ["openssl", "enc", "-pass", "env:VAR"],
            ["mkdir", "-p", "dir"],
            ["ssh", "-p", "2222", "host"],
        ],
    }
    frame = world.native("demo.echo", value, "nested")
    assert frame["output"] == value, frame
    for summary in summaries(world, "demo.echo", "nested", frame):
        assert summary == expected, summary
    secrets = [f"n-{i:02d}" for i in range(1, 14)] + ["44556677", "99887766"]
    assert leaked(world.all_records("nested"), secrets) == []


def test_a_name_value_pair_whose_name_is_written_with_spaces_loses_its_value(
    world: World,
) -> None:
    """S-4: ``{"name": "DB Password", "value": …}`` is a name/value pair naming a secret
    (``DB Password`` lower-cased, letters and digits only, is ``dbpassword``), as a form or
    a variable set writes it: its value goes."""
    value = {
        "fields": [{"name": "DB Password", "value": "PWs-01"}, {"name": "User", "value": "ana"}]
    }
    frame = world.native("demo.echo", value, "spaced")
    expected = {"fields": [{"name": "DB Password", "value": R}, {"name": "User", "value": "ana"}]}
    for summary in summaries(world, "demo.echo", "spaced", frame):
        assert summary == expected, summary
    assert leaked(world.all_records("spaced"), ["PWs-01"]) == []


# ----------------------------------------------------------------- values shaped like tokens


def test_token_shaped_values_and_keys_go_under_any_key(world: World) -> None:
    """S-4: the well-known tokens (GitHub, ``sk-``, Stripe, Slack, AWS, Google, GitLab, JWT),
    ``Bearer``/``Basic`` values of any case, an armored EC key, URL passwords (an empty user
    too) lose their secrets under ordinary keys and inside prose; two tokens used as keys
    become ``[redacted]`` and ``[redacted]#2``, both entries kept."""
    gh = "ghp_" + "A1" * 18
    value = {
        "gh": gh,
        "pat": "github_pat_" + "B2" * 15,
        "openai": "sk-" + "C3" * 12,
        "stripe": "sk_live_" + "D4" * 10,
        "slack": "xoxb-1234567890-abcdefgh",
        "aws": "AKIAIOSFODNN7EXAMPLE",
        "google": "AIza" + "E5" * 17 + "e",
        "gitlab": "glpat-" + "F6" * 11,
        "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTYifQ.sig-G7g7",
        "bearer": "BEARER H8h8h8h8",
        "basic": "basic SUk5aTk5",
        "pem": "-----BEGIN EC PRIVATE KEY-----\nJ10j10j10\n-----END EC PRIVATE KEY-----",
        "prose": f"set it to {gh} and retry",
        "ghp_" + "K1" * 18: 1,
        "ghp_" + "L2" * 18: 2,
        "url": "postgres://app:PWu-01@db/app",
        "cache": "redis://:PWu-02@cache:6379/0",
    }
    expected = {key: R for key in list(value)[:12]}
    expected.update(
        {
            "prose": f"set it to {R} and retry",
            R: 1,
            f"{R}#2": 2,
            "url": f"postgres://app:{R}@db/app",
            "cache": f"redis://:{R}@cache:6379/0",
        }
    )
    frame = world.native("demo.echo", value, "tokens")
    assert frame["output"] == value, frame
    for summary in summaries(world, "demo.echo", "tokens", frame):
        assert summary == expected, summary
    secrets = ["A1A1A1", "B2B2B2", "C3C3C3", "D4D4D4", "1234567890-abcdefgh", "IOSFODNN7",
               "E5E5E5", "F6F6F6", "eyJzdWIi", "H8h8h8h8", "SUk5aTk5", "J10j10j10", "K1K1K1",
               "L2L2L2", "PWu-01", "PWu-02"]  # fmt: skip
    assert leaked(world.all_records("tokens"), secrets) == []


# ------------------------------------------------------------------------ a terminal's argv


def test_terminal_argv_secrets_in_every_case_and_bytes_that_are_not_utf8(world: World) -> None:
    """S-4, T-3: ``ctx run`` in terminal mode with secret options in upper, lower and mixed
    case, glued and apart, environment assignments, a header name as a word of its own, a
    shell command line as one word, and words holding bytes that are not UTF-8 (``\\xNN`` in
    the records): the tool gets its argv as given, the records keep every word but the
    secrets, strict UTF-8."""
    argv = [
        "--PASSWORD=PWa-01", "--Password", "PWa-02", "DB_PASSWORD=PWa-03",
        "--db-password=PWa-04", "--client-secret=SCa-05", "Api-Key=AKa-06", "--TOKEN",
        "TKa-07", "X-Api-Key:", "AKa-08", "--verbose", "-p", "2222",
        "mysql -uroot -pPWa-09 app | curl -u admin:PWa-10 https://x.example",
    ]  # fmt: skip
    raw = [b"--password=\xffPWa-11", b"caf\xe9", b"--api-key", b"\xfe\xfdAKa-12"]
    words = argv + [os.fsdecode(b) for b in raw]
    ran = world.ctx("run", "--agent", "coder", "--session", "argv", "demo.args", *words)
    assert ran.rc == 0, ran
    assert json.loads(ran.out) == words, ran  # the tool's argv, as given
    expected = [
        f"--PASSWORD={R}", "--Password", R, f"DB_PASSWORD={R}", f"--db-password={R}",
        f"--client-secret={R}", f"Api-Key={R}", "--TOKEN", R, "X-Api-Key:", R, "--verbose",
        "-p", "2222", f"mysql -uroot -p{R} app | curl -u admin:{R} https://x.example",
        f"--password={R}", "caf\\xe9", "--api-key", R,
    ]  # fmt: skip
    call = next(e for e in world.events("argv") if e["type"] == "tool_call")
    assert call["argv"] == expected, call
    done = next(e for e in world.events("argv") if e["type"] == "tool_result")
    assert world.log_line("demo.args", done["call"])["argv"] == expected
    secrets = [f"a-{i:02d}" for i in range(1, 13)]
    assert leaked(world.all_records("argv"), secrets) == []


def test_a_terminal_argv_summary_over_8_kib_becomes_a_note_of_its_size(world: World) -> None:
    """S-4 (docs/sessions.md: every input, argv and output summary goes through one rule; a
    summary still longer than 8 KiB becomes a note of its size): 25 words of 250 emoji
    summarise to 20 words of 200 emoji and a count, over 16 000 bytes; what the records
    keep of the argv is at most 8 KiB."""
    words = ["\U0001f600" * 250] * 25
    ran = world.ctx("run", "--agent", "coder", "--session", "wide", "demo.args", *words)
    assert ran.rc == 0, ran
    call = next(e for e in world.events("wide") if e["type"] == "tool_call")
    logged = world.log_line("demo.args", call["call"])
    for argv in (call["argv"], logged["argv"]):
        size = len(json.dumps(argv, ensure_ascii=False, separators=(",", ":")).encode())
        assert size <= 8 * 1024, size


# ---------------------------------------------------------------- the 200-character boundary


def test_strings_and_keys_at_the_cut_keep_whole_characters_and_say_what_they_dropped(
    world: World,
) -> None:
    """S-4: strings of 199, 200 and 201 characters of two-, three- and four-byte UTF-8 keep
    their first 200 characters (never part of one) and say how many they dropped; a
    combining accent and a joined emoji cut between characters stay valid text; a key of 201
    characters is cut the same way, and two long keys that become alike stay two entries
    (``#2``); the records stay strict UTF-8."""
    value = {}
    for label, char in (("e2", "\u00e9"), ("cjk", "\u5b57"), ("emoji", "\U0001f600")):
        for n in (199, 200, 201):
            value[f"{label}-{n}"] = char * n
    value["combining"] = "e\u0301" * 101
    value["zwj"] = "x" * 199 + "\U0001f468\u200d\U0001f469"
    long_a, long_b = "\u00e9" * 201 + "a", "\u00e9" * 201 + "b"
    value[long_a] = 1
    value[long_b] = 2
    assert len(value) <= 20
    frame = world.native("demo.echo", value, "cut")
    assert frame["output"] == value, frame
    key_summary = cut(long_a)
    assert key_summary == cut(long_b) == "\u00e9" * 200 + "…[+2 chars]"
    expected = {k: cut(v) for k, v in value.items() if isinstance(v, str)}
    expected[key_summary] = 1
    expected[f"{key_summary}#2"] = 2
    for summary in summaries(world, "demo.echo", "cut", frame):
        assert summary == expected, summary
    assert expected["emoji-200"] == "\U0001f600" * 200
    assert expected["emoji-201"] == "\U0001f600" * 200 + "…[+1 chars]"
    assert expected["zwj"] == "x" * 199 + "\U0001f468…[+2 chars]"
    world.all_records("cut")  # strict UTF-8 throughout


def test_a_secret_straddling_the_cut_leaves_none_of_its_characters(world: World) -> None:
    """S-4: a text is searched a little beyond the 200 characters it keeps, so a credential
    that starts before the cut and ends after it leaves not even its first characters:
    ``key=value``, ``Bearer``, a GitHub token, a URL password, an armored key and a YAML
    block, each starting a few characters before character 200 of multi-byte text."""
    pad = "\u00e9" * 185
    tails = {
        "kv": " password=ZQ1wx9longsecretvalue",
        "bearer": " Bearer ZQ2wx9longsecretvalue",
        "gh": " ghp_" + "ZQ3" * 12,
        "url": " https://ana:ZQ4wx9longsecret@git.example/r",
        "pem": " -----BEGIN RSA PRIVATE KEY-----\nZQ5wx9\n-----END RSA PRIVATE KEY-----",
        "yaml": "\npassword:\n  ZQ6wx9longsecretvalue\nuser: ana",
    }
    value = {key: pad + tail for key, tail in tails.items()}
    frame = world.native("demo.echo", value, "straddle")
    assert frame["output"] == value, frame
    for summary in summaries(world, "demo.echo", "straddle", frame):
        for key, text in summary.items():
            assert text.startswith(pad) and text.endswith(f"…[+{len(value[key]) - 200} chars]")
            assert "ZQ" not in text and "ghp_" not in text, (key, text)
    assert leaked(world.all_records("straddle"), ["ZQ1", "ZQ2", "ZQ3", "ZQ4", "ZQ5", "ZQ6"]) == []


def test_an_input_summary_over_8_kib_becomes_the_note_of_its_exact_size(world: World) -> None:
    """S-4: 20 keys holding 300 CJK characters each summarise to 20 cut strings of 600 bytes
    and more, over 8 KiB: the records keep ``[summary of N bytes elided]``, N the summary's
    size in UTF-8 as the rule measures it; a key beyond the first 20 is left out."""
    value = {f"k{i:02d}": "\u5b57" * 300 for i in range(20)}
    frame = world.native("demo.echo", value, "note")
    assert frame["output"] == value, frame
    summary = {key: cut(text) for key, text in value.items()}
    size = len(json.dumps(summary, ensure_ascii=False, separators=(",", ":")).encode())
    assert size > 8 * 1024
    for logged in summaries(world, "demo.echo", "note", frame):
        assert logged == f"[summary of {size} bytes elided]", logged


# ---------------------------------------------------------------- errors that quote secrets


def test_a_message_quoting_a_secret_that_ended_a_command_line_loses_it(world: World) -> None:
    """S-4: the tool's last stderr line quotes the token that ended the input's ``cmd``
    (which the input's summary redacted): the records' message has it as ``[redacted]``;
    the earlier stderr line is in neither record; the ``result`` frame keeps both."""
    frame = world.native("demo.refuse", {"cmd": "deploy --token TKe-01"}, "quote-end")
    assert frame["exit_status"] == 3 and "TKe-01" in frame["error"]["message"], frame
    assert "EARLY-0" in frame["stderr"], frame
    call, done = world.call_events("quote-end", frame["call"])
    assert call["input"] == {"cmd": f"deploy --token {R}"}, call
    assert done["message"] == (
        f"demo.refuse exited with status 3: deploy: the registry refused token {R}"
    ), done
    assert leaked(world.all_records("quote-end"), ["TKe-01", "EARLY-0"]) == []


def test_a_message_quoting_a_secret_from_the_middle_of_a_command_line_loses_it(
    world: World,
) -> None:
    """S-4: every value the input's summary redacted is replaced wherever the message quotes
    it: the token in the middle of ``deploy --token X --verbose`` is redacted in the input's
    summary, so the message quoting it loses it too."""
    value = {"cmd": "deploy --token TKe-02 --verbose"}
    frame = world.native("demo.refuse", value, "quote-mid")
    assert "TKe-02" in frame["error"]["message"], frame
    call, done = world.call_events("quote-mid", frame["call"])
    assert call["input"] == {"cmd": f"deploy --token {R} --verbose"}, call
    assert leaked(world.all_records("quote-mid"), ["TKe-02"]) == [], done["message"]


def test_a_message_quoting_a_secret_as_json_escapes_it_loses_it(world: World) -> None:
    """S-4: a tool that reports its input with Python's ``json.dumps`` (non-ASCII escaped as
    ``\\uXXXX``, quotes as ``\\"``) quotes the password the input's summary redacted: the
    message in the records holds it in neither spelling."""
    passwords = ["h\u00fcnter2-PWj1", 'quo"te-PWj2', "\u5bc6\u7801-PWj3"]
    for password in passwords:
        frame = world.native("demo.refuse", {"password": password}, "quote-json")
        assert frame["exit_status"] == 3, frame
    spelt = [json.dumps(p)[1:-1] for p in passwords]
    assert leaked(world.all_records("quote-json"), [*passwords, *spelt]) == []


# -------------------------------------------------------------------------------- a worker


def test_a_worker_logs_jobs_and_refusals_without_their_secrets(world: World) -> None:
    """W-1, S-4 (docs/workers.md): ``ctx queue work`` runs a published job whose input holds
    secrets in a nested pair, a list command line and a mixed-case key, a job whose tool
    fails quoting secrets on stderr, and refuses a hand-written request whose ``tool`` holds
    a Bearer header: the worker's session and the tools' logs hold none of the secrets, the
    refusal's reason says why without it; the queue's result keeps the job's output whole."""
    queue = QueueCLI(world.storage, "proj")
    good = {
        "tool": "demo.echo",
        "input": {
            "db": {"PassWord": "PWw-01", "env": [{"name": "API_KEY", "value": "AKw-02"}]},
            "argv": ["mysql", "-uroot", "-pPWw-03", "app"],
        },
    }
    failing = {"tool": "demo.refuse", "input": {"cmd": "deploy --token TKw-04"}}
    good_job = queue.publish(good, name="wgood")
    failing_job = queue.publish(failing, name="wfail")
    bad = {"tool": "Authorization: Bearer BRw-05", "input": {}, "from": "t"}
    bad["created"] = "2026-06-22T12:00:00Z"
    bad_job = queue.drop("wbad", bad)
    worked = world.ctx("queue", "work", "--project", "proj", "--agent", "coder", "--drain")
    assert worked.rc == 0, worked
    state, done = queue.only_result(good_job)
    assert state == "done" and done["output"] == good["input"], done
    assert queue.only_result(failing_job)[0] == "failed"
    assert queue.only_result(bad_job)[0] == "failed"
    events = world.events("worker")
    refusal = next(e for e in events if e["type"] == "queue.refuse")
    assert refusal["object"] == f"queue/{bad_job}" and "BRw-05" not in refusal["reason"]
    assert "Authorization: [redacted]" in refusal["reason"], refusal
    call = next(e for e in events if e["type"] == "tool_call" and e.get("job") == good_job)
    assert call["input"] == {
        "db": {"PassWord": R, "env": [{"name": "API_KEY", "value": R}]},
        "argv": ["mysql", "-uroot", f"-p{R}", "app"],
    }, call
    secrets = ["PWw-01", "AKw-02", "PWw-03", "TKw-04", "BRw-05", "EARLY-0"]
    assert leaked(world.all_records("worker"), secrets) == []
