"""What logs may say: facts, not secrets or long text (SPEC S-4)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cortexfs.shared.redact import (
    MAX_ITEMS,
    MAX_SUMMARY_BYTES,
    MAX_TEXT,
    REDACTED,
    bounded_summary,
    redact_text,
    summarize,
    summarize_argv,
)
from cortexfs.shared.redact_quoted import hidden_values, without_hidden
from cortexfs.shared.secret_keys import SECRET_WORDS


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


def _names_no_secret(text: str) -> bool:
    letters = re.sub(r"[^a-z0-9]", "", text.lower())
    # A URL with a password, and the programs whose options may hold one, name a secret too.
    secrets = (
        *SECRET_WORDS,
        "auth",
        "bearer",
        "basic",
        "privatekey",
        "curl",
        "mysql",
        "mariadb",
        "sshpass",
        "login",
        "openssl",
        "htpasswd",
    )
    return "://" not in text and not any(word in letters for word in secrets)


@given(st.text(max_size=MAX_TEXT).filter(_names_no_secret))
def test_short_ordinary_text_is_kept_as_it_is(text: str) -> None:
    assert summarize(text) == text


@pytest.mark.parametrize(
    ("text", "logged"),
    [
        ('{"password":"hunter2"} and more', '{"password":"[redacted]"} and more'),
        ("password=hunter2, user=ana", "password=[redacted], user=ana"),
        ("Authorization: Bearer xyz\nHost: example", "Authorization: [redacted]\nHost: example"),
        ("Cookie: sid=1; theme=dark", "Cookie: [redacted]"),
        ("see https://h/?api_key=abc&page=2", "see https://h/?api_key=[redacted]&page=2"),
        ("curl -H 'x: 1' -u ana Basic YW5hOnB3", "curl -H 'x: 1' -u ana Basic [redacted]"),
        (
            "key:\n-----BEGIN PRIVATE KEY-----\nMII\n-----END PRIVATE KEY-----\n",
            "key:\n[redacted]\n",
        ),
        ("user: ana, path: /tmp", "user: ana, path: /tmp"),
        # JSON inside a double-quoted shell word: its quotes are escaped.
        (
            'curl -d "{\\"password\\":\\"hunter2\\"}" http://h',
            'curl -d "{\\"password\\":\\"[redacted]\\"}" http://h',
        ),
        ('echo "{\\"token\\": \\"tk88\\"}"', 'echo "{\\"token\\": \\"[redacted]\\"}"'),
        (
            '{\\"access_token\\":\\"t5\\",\\"n\\":1}',
            '{\\"access_token\\":\\"[redacted]\\",\\"n\\":1}',
        ),
    ],
)
def test_secrets_inside_free_text_lose_their_values(text: str, logged: str) -> None:
    """S-4: an output that is not JSON, a message, an argv word: the same rule as for keys."""
    assert summarize(text) == logged
    assert summarize({"output": text}) == {"output": logged}


@pytest.mark.parametrize(
    ("text", "logged"),
    [
        # GitHub's API takes ``Authorization: token …`` as well as ``Bearer``.
        ("curl -H 'Authorization: token gh5x' h", "curl -H 'Authorization: [redacted]' h"),
        ('curl -H "Authorization:token gh5x" h', 'curl -H "Authorization: [redacted]" h'),
        ("curl -H 'Cookie: theme=dark; sid=s9' h", "curl -H 'Cookie: [redacted]' h"),
        ("-H 'X-Auth: key s9' -H 'Accept: a b'", "-H 'X-Auth: [redacted]' -H 'Accept: a b'"),
        (
            'sh -c "curl -H \\"Authorization: token gh5x\\" h"',
            'sh -c "curl -H \\"Authorization: [redacted]\\" h"',
        ),
        (
            "failed with Authorization: token gh5x, retrying",
            "failed with Authorization: [redacted], retrying",
        ),
        ("the token expired: retry", "the token expired: retry"),
    ],
)
def test_a_header_in_a_quoted_text_or_after_its_scheme_loses_its_whole_value(
    text: str, logged: str
) -> None:
    """S-4: a header that opens a quoted text (``curl -H '…'``) loses everything up to the
    closing quote, and an authorisation header's credential goes after any scheme word, not
    only after ``Bearer`` or ``Basic``: a whole secret was logged otherwise."""
    assert summarize(text) == logged


def test_header_style_argv_secrets_are_redacted() -> None:
    argv = ["-H", "Authorization: Bearer xyz", "-H", "Cookie: sid=1", "Authorization:", "Bearer"]
    argv += ["abc", "--header", "Accept: text/plain", "Authorization:", "token", "gh5x"]

    assert summarize_argv(argv) == [
        "-H",
        f"Authorization: {REDACTED}",
        "-H",
        f"Cookie: {REDACTED}",
        "Authorization:",
        "Bearer",
        REDACTED,
        "--header",
        "Accept: text/plain",
        "Authorization:",
        "token",
        REDACTED,
    ]


def test_a_cut_never_keeps_the_start_of_a_secret() -> None:
    text = "x" * (MAX_TEXT - 12) + " password=hunter2hunter2"

    assert "hunter" not in summarize(text)


def test_an_object_keeps_its_first_keys_and_says_how_many_went() -> None:
    """As a list keeps its first items: an input of 20 000 keys costs its logging what one
    of 20 does (each key is summarised and searched for secrets like any text)."""
    wide = {"path": "/etc/hostname", **{f"Bearer {i}": i for i in range(20_000)}}

    summary = summarize(wide)

    assert len(summary) == MAX_ITEMS + 1 and summary["path"] == "/etc/hostname"
    assert summary[f"[+{20_001 - MAX_ITEMS} keys]"] is None
    assert list(summary)[1:3] == ["[redacted]", "[redacted]#2"]


def test_a_huge_structure_becomes_a_size_note() -> None:
    wide = {f"k{i}": [{"v": "x" * MAX_TEXT} for _ in range(MAX_ITEMS)] for i in range(50)}

    assert bounded_summary(wide).startswith("[summary of ")


def test_the_size_note_counts_the_bytes_an_event_holds_not_characters() -> None:
    """Twenty keys of 200 four-byte characters are 4 000 characters but 16 000 bytes of an
    event line: over the 8 KiB of a summary (docs/sessions.md), so they become its size note,
    the size the summary has in the event; the same keys of ASCII text stay whole."""
    emoji = {f"k{i}": "\U0001f389" * 200 for i in range(20)}
    ascii_only = {f"k{i}": "y" * 200 for i in range(20)}

    note = bounded_summary(emoji)
    size = len(json.dumps(summarize(emoji), ensure_ascii=False, separators=(",", ":")).encode())

    assert note == f"[summary of {size} bytes elided]" and size > 16_000
    assert bounded_summary(ascii_only) == summarize(ascii_only)


KNOWN_TOKENS = [
    "ghp_" + "a1B2" * 9,
    "github_pat_11ABCDEFG0123456789_abcdefghij",
    "sk-proj-" + "Ab3_" * 8,
    "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc",
    "xoxb-123456789012-abcdefghijkl",
    "AKIAIOSFODNN7EXAMPLE",
    "AIza" + "SyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
    "glpat-" + "x1Y2z3" * 4,
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
]


@pytest.mark.parametrize("token", KNOWN_TOKENS)
def test_tokens_of_well_known_services_are_redacted_wherever_they_are(token: str) -> None:
    said = summarize({"cmd": f"echo {token} > out", "note": f"key {token}."})
    argv = summarize_argv(["curl", "-H", f"X-Key: {token}", token])

    assert token not in json.dumps(said) and token not in json.dumps(argv)
    assert said == {"cmd": f"echo {REDACTED} > out", "note": f"key {REDACTED}."}
    assert argv[-1] == REDACTED


def test_words_that_merely_start_like_a_token_are_kept() -> None:
    text = "sk-learn ghp_x AKIA xoxb- eyJ.eyJ. task-list"
    assert summarize(text) == text


GITHUB_TOKEN = "ghp_" + "b" * 36


def test_a_credential_used_as_a_key_is_replaced() -> None:
    summary = summarize({"repos": {GITHUB_TOKEN: 1, "db": {"password": "x"}}})

    assert summary == {"repos": {REDACTED: 1, "db": {"password": REDACTED}}}


def test_keys_that_become_alike_stay_apart() -> None:
    """Two tokens as keys, and a key that already read ``[redacted]``: no entry is merged."""
    other = "ghp_" + "c" * 36

    summary = summarize({GITHUB_TOKEN: 1, other: 2, REDACTED: 3})

    assert summary == {REDACTED: 1, f"{REDACTED}#2": 2, f"{REDACTED}#3": 3}


def test_a_long_key_is_shortened_like_any_text() -> None:
    (key,) = summarize({"k" * 5000: 1})

    assert key.startswith("k" * MAX_TEXT) and key.endswith(f"[+{5000 - MAX_TEXT} chars]")


@given(
    st.dictionaries(st.sampled_from(KNOWN_TOKENS) | st.text(), st.integers(), max_size=MAX_ITEMS)
)
def test_keys_keep_no_token_and_none_is_merged_away(value: dict[str, int]) -> None:
    summary = summarize(value)

    assert len(summary) == len(value)
    assert not any(token in key for key in summary for token in KNOWN_TOKENS)


@pytest.mark.parametrize(
    ("text", "logged"),
    [
        pytest.param(
            'true # {"password": ["hunter2", "x]y"]}',
            'true # {"password": [redacted]}',
            id="json-list",
        ),
        pytest.param(
            '{"credentials": {"user": "a", "pass": "b}"}, "n": 1}',
            '{"credentials": [redacted], "n": 1}',
            id="json-object",
        ),
        pytest.param(
            'echo "{\\"password\\": [\\"hunter2\\"]}" | jq .',
            'echo "{\\"password\\": [redacted]}" | jq .',
            id="escaped-json-list",
        ),
        pytest.param("{'token': ['hunter2']}", "{'token': [redacted]}", id="python-repr-list"),
        pytest.param(
            'true # {"password": ["hunter2", ',
            'true # {"password": [redacted]',
            id="list-cut-short",
        ),
        pytest.param(
            'true # {:password => "hunter2"}', 'true # {:password => "[redacted]"}', id="ruby"
        ),
        pytest.param(
            "$cfg = ['secret' => 'hunter2'];", "$cfg = ['secret' => '[redacted]'];", id="php"
        ),
    ],
)
def test_a_secret_keys_whole_value_goes_in_text(text: str, logged: str) -> None:
    """``key: value``, ``key => value``: the value is what JSON would take there, a whole
    list or object included."""
    assert summarize(text) == logged
    assert "hunter2" not in summarize({"note": text})["note"]
    assert summarize(logged) == logged


@pytest.mark.parametrize(
    ("text", "logged"),
    [
        pytest.param(
            "password:\n  hunter2\nuser: ana\n",
            "password:\n  [redacted]\nuser: ana\n",
            id="next-line",
        ),
        pytest.param(
            "db:\n  secrets:\n    api: hunter2\n    db: hunter3\n  host: h\n",
            "db:\n  secrets:\n    [redacted]\n  host: h\n",
            id="nested-mapping",
        ),
        pytest.param(
            "db:\n  password: |\n    hunter2\n    hunter3\n  user: ana\n",
            "db:\n  password: |\n    [redacted]\n  user: ana\n",
            id="block-scalar",
        ),
        pytest.param(
            "token:\n  - hunter2\n  - hunter3\n",
            "token:\n  [redacted]\n",
            id="sequence",
        ),
        pytest.param(
            'printf "password:\\n  hunter2\\n" > c.yml',
            'printf "password:\\n  [redacted]\\n" > c.yml',
            id="written-with-escapes",
        ),
    ],
)
def test_a_yaml_secret_on_the_lines_below_its_key_goes(text: str, logged: str) -> None:
    assert summarize(text) == logged
    assert summarize(logged) == logged


@pytest.mark.parametrize(
    "text",
    [
        "if token:\n    return token\n",  # code: the key does not begin its line
        "password:\nnext: 1\n",  # nothing indented below: no value
        "user:\n  ana\n",
    ],
)
def test_a_colon_at_the_end_of_a_line_takes_only_a_yaml_value(text: str) -> None:
    assert summarize(text) == text


PGP_KEY = (
    "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF-hunter2\n=ab12\n"
    "-----END PGP PRIVATE KEY BLOCK-----\n"
)


@pytest.mark.parametrize(
    ("text", "logged"),
    [
        pytest.param(f"key:\n{PGP_KEY}after", f"key:\n{REDACTED}\nafter", id="pgp"),
        pytest.param(PGP_KEY, REDACTED, id="pgp-value"),
        pytest.param(
            f"printf -- '{PGP_KEY.replace(chr(10), chr(92) + 'n')}'",
            f"printf -- '{REDACTED}\\n'",
            id="pgp-written-with-escapes",
        ),
    ],
)
def test_an_armored_private_key_goes_whole(text: str, logged: str) -> None:
    assert summarize(text) == logged
    assert "hunter2" not in str(summarize({"content": text}))
    assert summarize(logged) == logged


DOCKER_AUTH = "dXNlcjpodW50ZXIyLVk="


def test_a_docker_config_auth_goes_and_its_registries_stay() -> None:
    config = {"auths": {"reg.example": {"auth": DOCKER_AUTH}}, "proxyAuth": "u:p"}
    as_text = json.dumps(config)

    assert summarize(config) == {
        "auths": {"reg.example": {"auth": REDACTED}},
        "proxyAuth": REDACTED,
    }
    assert summarize(as_text) == json.dumps(
        {"auths": {"reg.example": {"auth": REDACTED}}, "proxyAuth": REDACTED}
    )


def test_a_netrc_password_goes() -> None:
    netrc = 'machine api.example login ana password hunter2\nmachine b\n  password "p w"\n'

    assert summarize({"content": netrc}) == {
        "content": f"machine api.example login ana password {REDACTED}\n"
        f"machine b\n  password {REDACTED}\n"
    }


@pytest.mark.parametrize(
    "value",
    [
        {"author": "Ana", "passenger": "Bo", "tokenizer": "bert", "secretary": "Cy"},
        {"auth_url": "https://id.example/v3", "auth_type": "password", "oauth_scope": "read"},
        "author: Ana, passenger: Bo, tokenizer: bert, auth_url=https://id.example",
        "Enter your password to continue; the tokenizer splits words.",
        "- author: Ana\n  passengers:\n    - Bo\n",
    ],
    ids=["keys", "auth-as-a-first-word", "text", "prose", "yaml"],
)
def test_ordinary_words_that_look_like_secret_names_are_kept(value: object) -> None:
    assert summarize(value) == value


def test_keys_in_compatibility_forms_name_the_secret_they_spell() -> None:
    """S-4: a fullwidth PASSWORD is the key it spells once NFKC-normalised, as the program
    that reads the input may well take it; a fullwidth ordinary word stays ordinary."""

    def fullwidth(word: str) -> str:
        return "".join(chr(ord(c) + 0xFEE0) for c in word)

    password, token, author = fullwidth("PASSWORD"), fullwidth("Token"), fullwidth("author")
    summary = summarize({password: "p", token: "t", author: "a"})
    assert summary == {password: REDACTED, token: REDACTED, author: "a"}


def test_ordinary_words_keep_nothing_they_are_joined_to() -> None:
    assert summarize({"tokenizer_secret": "s", "author_password": "p"}) == {
        "tokenizer_secret": REDACTED,
        "author_password": REDACTED,
    }
    assert summarize_argv(["--author", "ana", "--tokenizer", "bert", "--auth", "u:p"]) == [
        "--author",
        "ana",
        "--tokenizer",
        "bert",
        "--auth",
        REDACTED,
    ]


@pytest.mark.parametrize(
    ("value", "logged"),
    [
        (["mysql", "--password", "pw7"], ["mysql", "--password", REDACTED]),
        (["curl", "-u", "ana:pw7", "h"], ["curl", "-u", f"ana:{REDACTED}", "h"]),
        (["env", "API_TOKEN=pw7", "run"], ["env", f"API_TOKEN={REDACTED}", "run"]),
        (["Cookie", "sid=pw7"], ["Cookie", REDACTED]),
        ({"name": "API_TOKEN", "value": "pw7"}, {"name": "API_TOKEN", "value": REDACTED}),
        (
            {"Name": "Authorization", "Value": "token pw7"},
            {"Name": "Authorization", "Value": REDACTED},
        ),
        ({"key": "db_password", "value": 7}, {"key": "db_password", "value": REDACTED}),
        # What names no secret is kept.
        (["docker", "run", "-p", "8080:80"], ["docker", "run", "-p", "8080:80"]),
        (["user", "ana"], ["user", "ana"]),
        ({"name": "PATH", "value": "/bin"}, {"name": "PATH", "value": "/bin"}),
    ],
)
def test_command_lines_and_name_value_pairs_in_json_lose_their_secrets(
    value: object, logged: object
) -> None:
    """S-4: a native input carries a command line as a JSON list of words and a header or an
    environment variable as a name/value pair (a two-word list, or an object with ``name``
    and ``value`` as Kubernetes and HAR files write them): the secret goes as it would in an
    argv or under a secret-naming key."""
    assert summarize({"input": value}) == {"input": logged}


@pytest.mark.parametrize(
    ("text", "logged"),
    [
        # RFC 7235: the credentials after a scheme are one token68 or a list of auth-params,
        # and Digest's are the latter: its response is worth as much as the password.
        (
            'failed with Authorization: Digest username="ana", response="6629fae4", retrying',
            "failed with Authorization: [redacted], retrying",
        ),
        (
            'sh -c "echo Authorization: Digest username=\\"ana\\", response=\\"6629fae4\\""',
            'sh -c "echo Authorization: [redacted]"',
        ),
        # The header written as a key and its value, with '=' or a blank before the colon.
        ("sent Authorization=token gh5x to h", "sent Authorization=[redacted] to h"),
        ("sent authorization : token gh5x to h", "sent authorization : [redacted] to h"),
    ],
)
def test_an_authorisation_header_in_a_text_loses_all_its_credentials(
    text: str, logged: str
) -> None:
    """S-4: after the scheme word (``token``, ``Digest``…) the whole credential goes, whatever
    separates the header's name from it."""
    assert summarize(text) == logged


@pytest.mark.parametrize(
    ("argv", "logged"),
    [
        (
            ["curl", "-H", "Authorization:", "Digest", 'username="a",', 'response="6629fae4"'],
            ["curl", "-H", "Authorization:", "Digest", REDACTED, REDACTED],
        ),
        (["http", "h", "Cookie:", "a=1;", "sid=pw7"], ["http", "h", "Cookie:", REDACTED, REDACTED]),
        (
            ["curl", "-H", "Authorization=token", "pw7"],
            ["curl", "-H", f"Authorization={REDACTED}", REDACTED],
        ),
    ],
)
def test_a_header_split_over_words_loses_each_word_of_its_value(
    argv: list[str], logged: list[str]
) -> None:
    """S-4: a header's value goes on over the next word while a word ends with ``,`` (an
    auth-param list) or ``;`` (a cookie list), and a scheme word given as ``name=scheme``
    hides the credential after it."""
    assert summarize_argv(argv) == logged
    assert summarize({"argv": argv}) == {"argv": logged}


@pytest.mark.parametrize(
    ("value", "logged"),
    [
        # A pair's value of any JSON type, as an object's under a secret-naming key.
        (["db_password", 123456], ["db_password", REDACTED]),
        (["API_TOKEN", ["a", "b"]], ["API_TOKEN", REDACTED]),
        # A command line with numbers among its words.
        (
            ["psql", "--port", 5432, "--password", "pw7"],
            ["psql", "--port", 5432, "--password", REDACTED],
        ),
        (
            ["mysql", "--password", 123456, "-v", True],
            ["mysql", "--password", REDACTED, "-v", True],
        ),
        # Name/value pairs as CloudFormation and Elastic Beanstalk write them.
        (
            {"ParameterKey": "DbPassword", "ParameterValue": "pw7"},
            {"ParameterKey": "DbPassword", "ParameterValue": REDACTED},
        ),
        (
            {"Namespace": "aws:env", "OptionName": "DB_PASSWORD", "Value": "pw7"},
            {"Namespace": "aws:env", "OptionName": "DB_PASSWORD", "Value": REDACTED},
        ),
        # What names no secret is kept.
        (["PATH", 5], ["PATH", 5]),
        (["seq", 1, 10], ["seq", 1, 10]),
        (
            {"ParameterKey": "DbHost", "ParameterValue": "db"},
            {"ParameterKey": "DbHost", "ParameterValue": "db"},
        ),
    ],
)
def test_pairs_and_command_lines_keep_no_secret_whatever_its_json_type(
    value: object, logged: object
) -> None:
    """S-4: a secret given as a number or a list is still a secret, in a pair and in a
    command line written as a JSON list; and a pair's name and value may be under other keys
    than ``name`` and ``value``."""
    assert summarize({"input": value}) == {"input": logged}


def test_hidden_values_are_what_the_summary_redacted_as_a_message_quotes_them() -> None:
    """A message about the input (a schema's refusal of ``/passwords/0``) loses the values the
    input's summary redacted, and nothing else: a short value or one kept stays."""
    called_with = {
        "passwords": ["PW1", 12345],
        "token": {"github": "ghx-123"},
        "user": "alice",
        "pin": "7",
    }
    hidden = hidden_values(called_with)
    assert hidden == {"PW1", "12345", "ghx-123"}
    said = "at /passwords/0: 'PW1' is not of type 'integer'; alice; 12345; ghx-123"
    assert without_hidden(said, hidden) == (
        "at /passwords/0: '[redacted]' is not of type 'integer'; alice; [redacted]; [redacted]"
    )


def test_hidden_values_of_an_argv_are_the_values_of_its_secret_options() -> None:
    assert hidden_values(["tool", "--password=hunter2", "--api-key", "k-456", "plain"]) == {
        "hunter2",
        "k-456",
    }


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("\x1b[1mPassword:\x1b[0m s3cret-value", "Password: [redacted]"),
        ("\x1b[1mpassword\x1b[0m: s3cret-value", "password: [redacted]"),
        # The rule found the secret through the colours: the text keeps them.
        (
            "\x1b[31mfailed\x1b[0m: password=s3cret-value",
            "\x1b[31mfailed\x1b[0m: password=[redacted]",
        ),
        ("\x1b[2J no secret here", "\x1b[2J no secret here"),
    ],
)
def test_a_secret_behind_a_terminals_colours_is_redacted(text: str, kept: str) -> None:
    assert redact_text(text) == kept


def test_the_note_of_keys_left_out_never_replaces_a_kept_key() -> None:
    value = {"[+1 keys]": "first", **{f"k{n}": n for n in range(20)}}
    summary = summarize(value)
    assert summary["[+1 keys]"] == "first" and summary["[+1 keys]#2"] is None
    assert len(summary) == 21


def test_argv_bytes_that_are_not_utf8_are_logged_as_text_not_lone_surrogates() -> None:
    assert summarize_argv(["caf\udce9", "\ud800", "ok"]) == ["caf\\xe9", "\\ud800", "ok"]


@pytest.mark.parametrize("order", [("abcd", "bcde"), ("bcde", "abcd")])
def test_overlapping_hidden_values_leave_nothing_of_either_whatever_their_order(
    order: tuple[str, str],
) -> None:
    """A message quoting ``abcde``, where ``abcd`` and ``bcde`` are both hidden, loses the
    whole of it: replacing one value after the other left a letter of the second, which
    letter depending on the order the set gave (the hash seed)."""
    hidden = frozenset(order)
    assert without_hidden("status 3: abcde.", hidden) == "status 3: [redacted]."
    assert without_hidden("abcd, bcde and abcd", hidden) == "[redacted], [redacted] and [redacted]"
