"""What logs and events may say about a call: facts and errors, not secrets or long text (S-4).

The rule, applied to every input, argv and output summary before it reaches ``events.jsonl``
or an object's ``log`` (docs/sessions.md states it for users):

* a key names a secret when, lower-cased and with everything but letters and digits dropped,
  it contains ``password``, ``passwd``, ``passphrase``, ``secret``, ``token``, ``apikey``,
  ``authorization``, ``credential``, ``privatekey`` or ``cookie`` — not counting the ordinary
  words that merely start with one (``tokenizer``, ``secretary``) where they are a word of the
  key (``secret_args`` and ``access_token_issued`` name a secret) — or when its last word is
  ``auth`` (``auth``, ``X-Auth``, ``basicAuth``; not ``author``, ``auth_url``);
* the value under such a key, whatever its JSON type, is replaced by ``"[redacted]"``; a
  string that looks like a credential whatever its key (``Bearer …``/``Basic …``
  authorisation values, armored private keys) is replaced too; so is the value, of any
  type, of a name/value pair naming a secret (``{"name": "API_TOKEN", "value": …}``,
  ``{"ParameterKey": …, "ParameterValue": …}``, ``["Cookie", …]``, ``{"name": "DB
  Password", "value": …}``);
* keys are summarised like any other text, so a credential used as a key is replaced; keys
  that become equal are told apart (``[redacted]``, ``[redacted]#2``) so none is merged away;
* inside any other text — an output that is not JSON, a message, an argv word, a shell
  command line — the same facts are found and only their values replaced.  A value follows
  a secret-naming key written as ``key=value``, ``key: value``, ``key => value`` or
  ``"key": value`` (quotes escaped too), and is what JSON would take there: a quoted string,
  a bare word, or a whole ``[…]``/``{…}``.  A key that begins its line (or opens a quoted
  text) and ends it with ``:`` (YAML; a block indicator ``|``/``>`` may follow) has as value
  the lines after it that are indented deeper.  A header line ``Authorization: …`` or
  ``Cookie: …`` whose name names a secret loses everything after the colon, and so does one
  that opens a quoted text (``curl -H 'Cookie: …'``), up to its closing quote; elsewhere such
  a header (after ``:``, ``=`` or ``=>``) loses the credentials after its scheme word
  (``Authorization: token …``), one token or Digest's list of ``name=value`` parameters;
  ``Bearer``/``Basic`` credentials lose the credential; the password of a URL's
  ``user:password@`` goes; in a text with a netrc entry (``machine NAME``) the word after
  ``password`` goes; an armored private key
  (``-----BEGIN … PRIVATE KEY…-----``: PEM, OpenSSH, PGP) goes whole up to its ``END`` line,
  and so does a token of a well-known service, recognised by the prefix its issuer documents
  (:data:`_KNOWN_TOKEN`: GitHub ``ghp_…``/``github_pat_…``, ``sk-…`` API keys, Slack
  ``xox…-``, AWS key ids ``AKIA…``/``ASIA…``, Google ``AIza…``, GitLab ``glpat-…``, Stripe
  ``sk_live_…``, and JSON Web Tokens);
* in a command line, an argv (a JSON list of words too, numbers among them) or one written
  in a text: the word after a secret-naming option (``--password X``, ``--api-key X``) is
  redacted; and so are the values of the options that mean a secret only in a known
  program's command
  (:mod:`cortexfs.shared.redact_commands`): curl's
  ``-u``/``--user``/``-U``/``--proxy-user user:password`` lose the password, MySQL's and
  MariaDB's ``-pPASSWORD`` (glued; ``-p`` alone asks for one), sshpass's ``-p PASSWORD``,
  the ``-p PASSWORD`` of a ``login`` subcommand (``docker login``, ``podman login``,
  ``az login``), openssl's ``-k``/``-K`` value and the secret of its ``-pass``/``-passin``/
  ``-passout pass:SECRET``, and htpasswd's last operand when ``-b`` gives the password
  there.  Elsewhere these options mean no secret (``mkdir -p``, ``docker run -u 1000:1000``)
  and are left alone;
* in an argv, ``--token=X`` / ``TOKEN=X`` keep the key and lose the value, the word after a
  secret-naming header name (``Authorization:``) is redacted, and so is the word after
  ``Bearer`` or ``Basic``; a header's value goes on over the next word while a word ends
  with ``,`` or ``;`` (Digest's parameters, cookies);
* a string longer than :data:`MAX_TEXT` characters keeps its first :data:`MAX_TEXT` and says
  how many it dropped; a list keeps :data:`MAX_ITEMS` items and an object its first
  :data:`MAX_ITEMS` keys (``"[+N keys]": null`` says how many went); nesting deeper than
  :data:`MAX_DEPTH` is elided;
* a summary (of an input, an argv or an output) whose JSON is still longer than
  :data:`MAX_SUMMARY_BYTES` is replaced by a note of its size, so one event stays one short
  line.

Which keys name a secret is :mod:`cortexfs.shared.secret_keys`; the command-line part is
:mod:`cortexfs.shared.redact_commands`; what a message about a call may not quote (the values
a summary hid) is :mod:`cortexfs.shared.redact_quoted`.  Policy v0 has no class for
logging, so this rule holds for every caller; a tool that needs the whole payload recorded
writes it to a file of its own.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence
from typing import Any

from cortexfs import jsontext
from cortexfs.shared.redact_commands import command_secrets, redact_command_lines
from cortexfs.shared.secret_keys import ARGV_KEY, KEY_WORDS, REDACTED, is_secret_key

MAX_TEXT = 200
MAX_ITEMS = 20
MAX_DEPTH = 6
MAX_SUMMARY_BYTES = 8 * 1024

_ARMORED_PRIVATE_KEY = r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z0-9 ]*-----"
_CREDENTIAL_VALUE = re.compile(
    rf"\s*(?:(?:bearer|basic)\s+\S+|{_ARMORED_PRIVATE_KEY})", re.IGNORECASE
)
_AUTH_SCHEMES = ("bearer", "basic")
# The words that may follow an authorisation header's name before its credential
# (``Authorization: token …`` is GitHub's); only there do they introduce a secret.
_HEADER_SCHEMES = ("bearer", "basic", "token", "digest", "negotiate", "ntlm")

# What a secret looks like inside free text (see the module's rule).  Each pattern keeps what
# names the secret and replaces what follows it.
_PRIVATE_KEY_BLOCK = re.compile(
    rf"{_ARMORED_PRIVATE_KEY}.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY[A-Z0-9 ]*-----|\Z)",
    re.DOTALL,
)
_HEADER_LINE = re.compile(r"^(?P<name>[ \t]*[A-Za-z0-9_-]+:)(?P<value>[ \t]*\S[^\r\n]*)", re.M)
# A header that opens a quoted text (``curl -H 'Cookie: a=1; sid=…'``, ``-H "Authorization:
# token …"``, and the same with its quotes escaped inside JSON): its value is the rest of that
# text, up to the closing quote, however many words or cookies it holds.  A value that starts
# on the next line is a YAML block (``printf "password:\n  …"``), which _block_value reads.
_QUOTED_HEADERS = tuple(
    re.compile(rf"(?P<name>{opening}[ \t]*[A-Za-z0-9_-]+:)(?P<value>[ \t]*(?![|>\\\s])(?:{body})+)")
    for opening, body in (
        (r'\\"', r'(?!\\")[^\r\n]'),
        (r'(?<!\\)"', r'[^"\\\r\n]|\\[^\r\n]'),
        (r"'", r"[^'\r\n]"),
    )
)
# An authorisation header anywhere in a text (``failed with Authorization: token …``,
# ``Authorization=token …``): after its scheme word, the credentials go too, not the scheme
# alone — by RFC 7235 one token68 or a list of auth-params, which is how Digest sends its
# response (``username="ana", response="…"``; quoted, and the quotes escaped inside JSON).
_AUTH_PARAM = (
    r"[A-Za-z0-9!#$%&*+.^_`|~-]+[ \t]*=[ \t]*"
    r"""(?:\\"(?:[^\\]|\\[^"])*\\"|"(?:[^"\\]|\\.)*"|[^\s,;"'\\]+)"""
)
_HEADER_SCHEME_CREDENTIAL = re.compile(
    r"(?P<name>(?<![A-Za-z0-9_-])[A-Za-z0-9_-]+)(?P<separator>[ \t]*(?:=>|[:=])[ \t]*)"
    rf"(?:{'|'.join(_HEADER_SCHEMES)})[ \t]+(?!\[redacted\])"
    rf"(?:{_AUTH_PARAM}(?:[ \t]*,[ \t]*{_AUTH_PARAM})*|[^\s,;\"'\\]+)",
    re.IGNORECASE,
)
_AUTH_CREDENTIAL = re.compile(r"\b(?P<scheme>bearer|basic)(?P<gap>\s+)[^\s,;\"']+", re.IGNORECASE)
# A key may be quoted, and its quotes escaped: JSON inside a double-quoted shell word
# (``curl -d "{\"password\":\"…\"}"``) is written with ``\"``.
# A key starts where a run of key characters starts (the lookbehind): tried from inside a
# run too, a long word with no separator would cost its length squared.
_SECRET_KEY_SEPARATOR = re.compile(
    r"""(?<![A-Za-z0-9_.-])(?P<key>\\?["']?[A-Za-z0-9_.-]+\\?["']?)"""
    r"""[ \t]*(?P<separator>=>|[:=])[ \t]*"""
)
_VALUE = re.compile(
    r"""(?!\[redacted\])"""
    r"""(?:\\"(?:[^\\]|\\[^"])*\\"|"(?:[^"\\]|\\.)*"|'[^']*'|[^\s,;&"'}\])]+)"""
)
# The parts of a ``[…]`` or ``{…}`` value: quoted strings (their brackets do not count),
# runs of other characters, and single brackets.
_BRACKETED_PART = re.compile(
    r"""\\"(?:[^\\]|\\[^"])*\\"|"(?:[^"\\]|\\.)*"|'[^']*'|[^\[\]{}"'\\]+|.""", re.DOTALL
)
# A YAML block value: the key's line ends after the colon (or a block indicator); a line
# break is a real one or one written as ``\n`` in a shell word or a JSON string.
_BLOCK_START = re.compile(r"(?:[|>][-+0-9]*)?[ \t]*(?:\r?\n|\\(?:r\\)?n)")
_BLOCK_INDICATOR = re.compile(r"[ \t]*[|>][-+0-9]*[ \t]*")
_BLOCK_LINE = re.compile(r"(?P<indent>[ \t]*)(?P<content>(?:[^\r\n\\]|\\(?!n|r\\n))*)")
_LINE_BREAK = re.compile(r"\r?\n|\\(?:r\\)?n")
# Tokens that say what they are by a prefix their issuers document, so that they are found
# in any text, under any key: long enough after the prefix not to take ordinary words.
_KNOWN_TOKEN = re.compile(
    r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|sk-[A-Za-z0-9_-]{20,}|[rs]k_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|xox[abposr]-[A-Za-z0-9-]{10,}|(?:AKIA|ASIA)[0-9A-Z]{16}\b"
    r"|AIza[0-9A-Za-z_-]{35}|glpat-[A-Za-z0-9_-]{20,}"
    r"|eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]+)"
)
# scheme://user:password@host: the password goes (up to the last '@' before the path).
_URL_PASSWORD = re.compile(
    r"(?P<lead>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:\[\]]*:)(?!\[redacted\]@)[^\s/?#]+@"
)
# A netrc entry (``machine api.example login ana password hunter2``), which separates its
# keys from their values by blanks.
_NETRC_ENTRY = re.compile(r"(?<![\w-])machine[ \t]+\S")
_NETRC_PASSWORD = re.compile(
    r"""(?P<key>(?<![\w-])password[ \t]+)(?!\[redacted\])(?:"(?:[^"\\]|\\.)*"|[^\s"'\\]+)"""
)


def bounded_summary(value: Any) -> Any:
    """:func:`summarize`, then a size note instead when even that is too long."""
    return _within_size(summarize(value))


def bounded_argv_summary(argv: Sequence[str]) -> list[str] | str:
    """:func:`summarize_argv`, then a size note instead when even that is too long: twenty
    words of two hundred emoji are 16 000 bytes, and an argv is summarised as an input is."""
    return _within_size(summarize_argv(argv))


def _within_size(summary: Any) -> Any:
    """``summary``, or the note of its size when its JSON is longer than
    :data:`MAX_SUMMARY_BYTES`."""
    # Its bytes as an event holds them, where a character of CJK text or an emoji is three
    # or four: counted in characters, a summary of such text could fill four times the line.
    size = len(jsontext.dumps_utf8(summary, separators=(",", ":"), default=str))
    return summary if size <= MAX_SUMMARY_BYTES else f"[summary of {size} bytes elided]"


def summarize(value: Any, depth: int = 0) -> Any:
    """A JSON value safe to log: secrets redacted, long strings and lists shortened."""
    if isinstance(value, str):
        return _short_text(value)
    if isinstance(value, dict):
        if depth >= MAX_DEPTH:
            return f"[{len(value)} keys elided]"
        summary: dict[str, Any] = {}
        names_a_secret = _names_a_secret(value)
        for key, item in itertools.islice(value.items(), MAX_ITEMS):
            key = str(key)
            logged_key = _distinct(_short_text(key), summary)
            secret = is_secret_key(key) or (names_a_secret and _is_a_value_key(key))
            summary[logged_key] = REDACTED if secret else summarize(item, depth + 1)
        if len(value) > MAX_ITEMS:
            summary[_distinct(f"[+{len(value) - MAX_ITEMS} keys]", summary)] = None
        return summary
    if isinstance(value, list | tuple):
        if depth >= MAX_DEPTH:
            return [f"[{len(value)} items elided]"]
        if len(value) == 2 and _is_secret_name(value[0]):
            # A pair: ["Cookie", "sid=…"]; its value goes whatever its type, as under a key.
            kept = [_short_text(value[0]), REDACTED]
        elif _is_a_command_line(value):
            kept = _summarize_command_line(value[:MAX_ITEMS])
        else:
            kept = [summarize(item, depth + 1) for item in value[:MAX_ITEMS]]
        if len(value) > MAX_ITEMS:
            kept.append(f"[+{len(value) - MAX_ITEMS} items]")
        return kept
    if value is None or isinstance(value, bool | int | float):
        return value
    return _short_text(str(value))


def _distinct(key: str, taken: dict[str, Any]) -> str:
    """``key``, or ``key#2``, ``key#3``… when a summarised key already took it: two keys
    whose secrets were both redacted stay two entries."""
    if key not in taken:
        return key
    number = 2
    while f"{key}#{number}" in taken:
        number += 1
    return f"{key}#{number}"


def _is_a_command_line(value: Sequence[Any]) -> bool:
    """Whether the JSON list ``value`` is judged as a command line: words, some of which
    JSON may give as numbers or booleans (``["psql", "--port", 5432, "--password", …]``)."""
    return any(isinstance(item, str) for item in value) and all(
        item is None or isinstance(item, str | bool | int | float) for item in value
    )


def _summarize_command_line(value: Sequence[Any]) -> list[Any]:
    """:func:`_summarize_words` of a command line given as a JSON list: a number or boolean
    is judged as the word it would be, and kept as it was unless it is a secret."""
    words = [item if isinstance(item, str) else json.dumps(item) for item in value]
    return [
        said if isinstance(item, str) or said != word else item
        for item, word, said in zip(value, words, _summarize_words(words), strict=True)
    ]


# The name of a pair: a word, or words a form or a variable set writes apart (``DB
# Password``); the key rule then judges them as one key (``dbpassword``).
_PAIR_NAME = re.compile(rf"{ARGV_KEY.pattern}(?:[ \t]+{ARGV_KEY.pattern})*")


def _is_secret_name(value: Any) -> bool:
    """Whether ``value`` is a name naming a secret, as the name of a pair is."""
    return isinstance(value, str) and bool(_PAIR_NAME.fullmatch(value)) and is_secret_key(value)


def _names_a_secret(value: dict[Any, Any]) -> bool:
    """Whether ``value`` is a name/value pair naming a secret: ``{"name": "API_TOKEN",
    "value": …}`` as Kubernetes writes an environment, ``{"name": "Authorization", "value":
    …}`` as a HAR file writes a header."""
    return any(_is_a_name_key(key) and _is_secret_name(name) for key, name in value.items())


def _is_a_name_key(key: Any) -> bool:
    """``name``, ``key``, or a key ending in one (``ParameterKey`` as CloudFormation writes a
    parameter, ``OptionName`` as Elastic Beanstalk writes a setting)."""
    words = KEY_WORDS.findall(str(key))
    return bool(words) and words[-1].lower() in ("name", "key")


def _is_a_value_key(key: str) -> bool:
    """``value``, or a key ending in it (``ParameterValue``): a pair's value."""
    words = KEY_WORDS.findall(key)
    return bool(words) and words[-1].lower() == "value"


def summarize_argv(argv: Sequence[str]) -> list[str]:
    """An argv safe to log: secret option values redacted, long words shortened, and a byte
    that is not UTF-8 (which Python gives as a lone surrogate) written as ``\\xNN`` text: a
    lone surrogate in a record is a line strict readers of other languages refuse."""
    kept = _summarize_words([_as_text(word) for word in argv[:MAX_ITEMS]])
    if len(argv) > MAX_ITEMS:
        kept.append(f"[+{len(argv) - MAX_ITEMS} words]")
    return kept


def _as_text(word: str) -> str:
    try:
        return word.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate of no byte: its escape, as text
        return word.encode("utf-8", "backslashreplace").decode()


def _summarize_words(argv: Sequence[str]) -> list[str]:
    """Words safe to log, judged as a command line: a terminal call's argv, and any JSON list
    of strings (``{"argv": ["mysql", "--password", …]}``), since a native input carries its
    command lines that way."""
    words = list(argv)
    hidden = command_secrets(words)
    kept: list[str] = []
    # hide_next: the next word is (or goes on) a secret; scheme_next: it may be the scheme
    # word of a header; in_header: the secret is a header's value, which goes on over the
    # next word while a word ends an item of a list (',' between Digest's auth-params, ';'
    # between cookies).
    hide_next = scheme_next = in_header = False
    for index, word in enumerate(words):
        if hide_next:
            # `Authorization: token xyz` as three words: the scheme stays, the credential goes.
            schemes = _HEADER_SCHEMES if scheme_next else _AUTH_SCHEMES
            scheme = word.lower() in schemes
            kept.append(word if scheme else REDACTED)
            hide_next = scheme or (in_header and word.endswith((",", ";")))
            scheme_next, in_header = False, in_header and hide_next
            continue
        key, equals, value = word.partition("=")
        if index in hidden:
            kept.append(hidden[index])
        elif equals and ARGV_KEY.fullmatch(key) and is_secret_key(key):
            kept.append(f"{key}={REDACTED}")
            # `Authorization=token xyz`: the value was the scheme, the credential comes next.
            hide_next = in_header = value.lower() in _HEADER_SCHEMES or value.endswith((",", ";"))
        elif _introduces_a_secret(word):
            kept.append(word)
            hide_next, scheme_next = True, word.endswith(":")
            in_header = scheme_next
        else:
            kept.append(_short_text(word))
    return kept


def _introduces_a_secret(word: str) -> bool:
    """A secret-naming header name (``Authorization:``) or authorisation scheme
    (``Bearer``): the next word is the secret."""
    if word.lower() in _AUTH_SCHEMES:
        return True
    return word.endswith(":") and is_secret_key(word)


# A terminal's control sequences: CSI (colours, cursor moves), also as its 8-bit C1 byte, OSC
# (titles, hyperlinks) and the two-character escapes.
_TERMINAL_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]"
)


def redact_text(text: str) -> str:
    """``text`` with the values of the secrets it names replaced (the free-text rule).

    A tool's coloured output puts control sequences between a secret's name and its value
    (``ESC[1mPassword:ESC[0m value``), where the rule would take a sequence for the value.
    Such text is judged without its sequences too; when that finds more to hide, the text
    is kept without them (the secret matters more than its colours), else as it was."""
    redacted = _redact_plain(text)
    if "\x1b" not in text and "\x9b" not in text:
        return redacted
    plain = _TERMINAL_SEQUENCE.sub("", text)
    plain_redacted = _redact_plain(plain)
    if _TERMINAL_SEQUENCE.sub("", redacted) == plain_redacted:
        return redacted
    return plain_redacted


def _redact_plain(text: str) -> str:
    if "-----BEGIN" in text:
        text = _PRIVATE_KEY_BLOCK.sub(REDACTED, text)
    text = _KNOWN_TOKEN.sub(REDACTED, text)
    text = _HEADER_LINE.sub(_redact_header, text)
    for quoted_header in _QUOTED_HEADERS:
        text = quoted_header.sub(_redact_header, text)
    text = _HEADER_SCHEME_CREDENTIAL.sub(_redact_scheme_credential, text)
    text = _AUTH_CREDENTIAL.sub(lambda m: f"{m['scheme']}{m['gap']}{REDACTED}", text)
    text = _URL_PASSWORD.sub(lambda m: f"{m['lead']}{REDACTED}@", text)
    if _NETRC_ENTRY.search(text):
        text = _NETRC_PASSWORD.sub(lambda m: f"{m['key']}{REDACTED}", text)
    return redact_command_lines(_redact_key_values(text))


def _redact_header(match: re.Match[str]) -> str:
    if not is_secret_key(match["name"]) or _BLOCK_INDICATOR.fullmatch(match["value"]):
        return match[0]  # a block indicator: the value is the block below (_block_value)
    return f"{match['name']} {REDACTED}"


def _redact_scheme_credential(match: re.Match[str]) -> str:
    if not is_secret_key(match["name"]):
        return match[0]
    return f"{match['name']}{match['separator']}{REDACTED}"


def _redact_key_values(text: str) -> str:
    """``key=value``, ``key: value``, ``key => value``, ``"key": value`` and a YAML block:
    the value goes when the key names a secret.  A key that names none consumes nothing, so
    ``https://h/?api_key=…`` is still read as far as its ``api_key``."""
    pieces, kept_up_to, position = [], 0, 0
    while (found := _SECRET_KEY_SEPARATOR.search(text, position)) is not None:
        position = found.end()
        if not is_secret_key(found["key"]):
            position = found.start() + len(found["key"])
            continue
        value = _secret_value(text, found)
        if value is None:
            continue
        start, end, quote = value
        pieces += [text[kept_up_to:start], f"{quote}{REDACTED}{quote}"]
        kept_up_to = position = end
    return "".join(pieces) + text[kept_up_to:]


def _secret_value(text: str, found: re.Match[str]) -> tuple[int, int, str] | None:
    """Where the value after the secret-naming key ``found`` starts and ends, and the quote
    to keep around its replacement; None when there is none (or it is already redacted)."""
    start = found.end()
    if text.startswith(REDACTED, start):
        return None
    if found["separator"] == ":":
        block = _block_value(text, start, _line_indent(text, found))
        if block is not None:
            return (*block, "")
    if text.startswith(("[", "{"), start):
        return start, _bracketed_end(text, start), ""
    value = _VALUE.match(text, start)
    if value is None:
        return None
    quote = value[0][:2] if value[0].startswith('\\"') else value[0][0]
    return start, value.end(), quote if quote in ('\\"', '"', "'") else ""


def _line_indent(text: str, found: re.Match[str]) -> int | None:
    """How deep the key ``found`` is indented when it begins a line; 0 when it opens a quoted
    text (``printf "password:\\n  …"``, its quote not closed before the colon); None when
    other text comes first on its line."""
    key_start = line_start = found.start()
    while line_start and text[line_start - 1] in " \t":
        line_start -= 1
    if not line_start or text[line_start - 1] == "\n" or text.endswith("\\n", 0, line_start):
        return key_start - line_start
    key = found["key"]
    return 0 if key[0] in "\"'" and key[-1] != key[0] else None


def _block_value(text: str, start: int, indent: int | None) -> tuple[int, int] | None:
    """The span of a YAML block value after a key of that ``indent``: from the first
    character of the next line to the end of the last line indented deeper than the key."""
    head = _BLOCK_START.match(text, start) if indent is not None else None
    if head is None:
        return None
    assert indent is not None
    first = last = None
    position = head.end()
    while (line := _BLOCK_LINE.match(text, position)) and len(line["indent"]) > indent:
        if not line["content"].strip():
            break
        first = line.start("content") if first is None else first
        last = line.end()
        if (line_break := _LINE_BREAK.match(text, last)) is None:
            break
        position = line_break.end()
    return None if first is None or last is None else (first, last)


def _bracketed_end(text: str, start: int) -> int:
    """Where the ``[…]`` or ``{…}`` starting at ``start`` ends: after its closing bracket, or
    at the end of a text cut before it."""
    depth, position = 0, start
    while position < len(text):
        part = _BRACKETED_PART.match(text, position)
        assert part is not None  # its last alternative takes any character
        position = part.end()
        if part[0] in ("[", "{"):
            depth += 1
        elif part[0] in ("]", "}"):
            depth -= 1
            if not depth:
                return position
    return position


# Text beyond what is kept is still read this far for secrets, so that a cut never leaves the
# first characters of a credential that started before it.
_REDACTION_WINDOW = 4 * MAX_TEXT


def _short_text(text: str) -> str:
    if _CREDENTIAL_VALUE.match(text):
        return REDACTED
    redacted = redact_text(text[:_REDACTION_WINDOW])
    if len(text) <= MAX_TEXT and len(redacted) <= MAX_TEXT:
        return redacted
    return f"{redacted[:MAX_TEXT]}…[+{max(len(text) - MAX_TEXT, 1)} chars]"
