"""What logs and events may say about a call: facts and errors, not secrets or long text (S-4).

The rule, applied to every input, argv and output summary before it reaches ``events.jsonl``
or an object's ``log`` (docs/sessions.md states it for users):

* a value under a key that names a secret — after lower-casing and dropping everything but
  letters and digits, the key contains ``password``, ``passwd``, ``passphrase``, ``secret``,
  ``token``, ``apikey``, ``authorization``, ``credential``, ``privatekey`` or ``cookie`` — is
  replaced by ``"[redacted]"``;
* a string that looks like a credential whatever its key (``Bearer …``/``Basic …``
  authorisation values, PEM private keys) is replaced by ``"[redacted]"``;
* inside any other text — an output that is not JSON, a message, an argv word, a shell
  command line — the same facts are found and only their values replaced: a header line
  ``Authorization: …`` or ``Cookie: …`` whose name names a secret loses everything after the
  colon, ``key=value``, ``key: value`` and ``"key": "value"`` lose the value when the key
  names a secret, ``Bearer``/``Basic`` credentials lose the credential, the password of a
  URL's ``user:password@`` goes, a PEM private key block goes whole, and so does a token of
  a well-known service, recognised by the prefix its issuer documents (:data:`_KNOWN_TOKEN`:
  GitHub ``ghp_…``/``github_pat_…``, ``sk-…`` API keys, Slack ``xox…-``, AWS key ids
  ``AKIA…``/``ASIA…``, Google ``AIza…``, GitLab ``glpat-…``, Stripe ``sk_live_…``, and JSON
  Web Tokens);
* in a command line, an argv or one written in a text: the word after a secret-naming
  option (``--password X``, ``--api-key X``) is redacted; and a few programs' options that
  mean a secret only there: curl's ``-u``/``--user``/``-U``/``--proxy-user user:password``
  lose the password, MySQL's and MariaDB's ``-pPASSWORD`` (glued; ``-p`` alone asks for one)
  and sshpass's ``-p PASSWORD`` the password.  Elsewhere these options mean no secret
  (``mkdir -p``, ``docker run -u 1000:1000``) and are left alone;
* in an argv, ``--token=X`` / ``TOKEN=X`` keep the key and lose the value, the word after a
  secret-naming header name (``Authorization:``) is redacted, and so is the word after
  ``Bearer`` or ``Basic``;
* a string longer than :data:`MAX_TEXT` characters keeps its first :data:`MAX_TEXT` and says
  how many it dropped; a list keeps :data:`MAX_ITEMS` items; nesting deeper than
  :data:`MAX_DEPTH` is elided;
* a summary whose JSON is still longer than :data:`MAX_SUMMARY_BYTES` is replaced by a note
  of its size, so one event stays one short line.

Policy v0 has no class for logging, so this rule holds for every caller; a tool that needs
the whole payload recorded writes it to a file of its own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

REDACTED = "[redacted]"
MAX_TEXT = 200
MAX_ITEMS = 20
MAX_DEPTH = 6
MAX_SUMMARY_BYTES = 8 * 1024

SECRET_WORDS = (
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "apikey",
    "authorization",
    "credential",
    "privatekey",
    "cookie",
)
_CREDENTIAL_VALUE = re.compile(
    r"\s*(?:(?:bearer|basic)\s+\S+|-----BEGIN [A-Z ]*PRIVATE KEY-----)", re.IGNORECASE
)
_KEY_CHARACTERS = re.compile(r"[^a-z0-9]")
_AUTH_SCHEMES = ("bearer", "basic")

# What a secret looks like inside free text (see the module's rule).  Each pattern keeps what
# names the secret and replaces what follows it.
_PEM_BLOCK = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.DOTALL
)
_HEADER_LINE = re.compile(r"^(?P<name>[ \t]*[A-Za-z0-9_-]+:)(?P<value>[ \t]*\S[^\r\n]*)", re.M)
_AUTH_CREDENTIAL = re.compile(r"\b(?P<scheme>bearer|basic)(?P<gap>\s+)[^\s,;\"']+", re.IGNORECASE)
# A key may be quoted, and its quotes escaped: JSON inside a double-quoted shell word
# (``curl -d "{\"password\":\"…\"}"``) is written with ``\"``.
_SECRET_KEY_SEPARATOR = re.compile(r"""(?P<key>\\?["']?[A-Za-z0-9_.-]+\\?["']?)[ \t]*[:=][ \t]*""")
_VALUE = re.compile(
    r"""(?!\[redacted\])"""
    r"""(?:\\"(?:[^\\]|\\[^"])*\\"|"(?:[^"\\]|\\.)*"|'[^']*'|[^\s,;&"'}\])]+)"""
)
_ARGV_KEY = re.compile(r"-*[A-Za-z0-9_.]+(?:-[A-Za-z0-9_.]+)*")
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
# The words of a command line written in a text (quoted parts kept whole), and the operators
# that end one command and start the next.
_SHORT_OPTIONS = re.compile(r"-[A-Za-z]+")
_SHELL_WORD = re.compile(r"""(?:"(?:[^"\\]|\\.)*"|'[^']*'|[^\s"';&|])+|[;&|]+""")

# How the value of an option that names a secret is hidden: whole, or the password of
# ``user:password``.  ``_GLUED`` values count only glued to their option (``-pX``).
_WHOLE, _PASSWORD_PART, _GLUED = "whole", "password", "glued"
_CURL_OPTIONS = {
    "-u": _PASSWORD_PART,
    "--user": _PASSWORD_PART,
    "-U": _PASSWORD_PART,
    "--proxy-user": _PASSWORD_PART,
}


def is_secret_key(key: str) -> bool:
    normalised = _KEY_CHARACTERS.sub("", key.lower())
    return any(word in normalised for word in SECRET_WORDS)


def bounded_summary(value: Any) -> Any:
    """:func:`summarize`, then a size note instead when even that is too long."""
    summary = summarize(value)
    size = len(json.dumps(summary, ensure_ascii=False))
    return summary if size <= MAX_SUMMARY_BYTES else f"[summary of {size} bytes elided]"


def summarize(value: Any, depth: int = 0) -> Any:
    """A JSON value safe to log: secrets redacted, long strings and lists shortened."""
    if isinstance(value, str):
        return _short_text(value)
    if isinstance(value, dict):
        if depth >= MAX_DEPTH:
            return f"[{len(value)} keys elided]"
        return {
            str(key): REDACTED if is_secret_key(str(key)) else summarize(item, depth + 1)
            for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        if depth >= MAX_DEPTH:
            return [f"[{len(value)} items elided]"]
        kept = [summarize(item, depth + 1) for item in value[:MAX_ITEMS]]
        if len(value) > MAX_ITEMS:
            kept.append(f"[+{len(value) - MAX_ITEMS} items]")
        return kept
    if value is None or isinstance(value, bool | int | float):
        return value
    return _short_text(str(value))


def summarize_argv(argv: Sequence[str]) -> list[str]:
    """An argv safe to log: secret option values redacted, long words shortened."""
    words = list(argv[:MAX_ITEMS])
    hidden = _command_secrets(words)
    kept: list[str] = []
    hide_next = False
    for index, word in enumerate(words):
        if hide_next:
            # `Authorization: Bearer xyz` as three words: the scheme stays, the credential goes.
            scheme = word.lower() in _AUTH_SCHEMES
            kept.append(word if scheme else REDACTED)
            hide_next = scheme
            continue
        key, equals, _ = word.partition("=")
        if index in hidden:
            kept.append(hidden[index])
        elif equals and _ARGV_KEY.fullmatch(key) and is_secret_key(key):
            kept.append(f"{key}={REDACTED}")
        elif _introduces_a_secret(word):
            kept.append(word)
            hide_next = True
        else:
            kept.append(_short_text(word))
    if len(argv) > MAX_ITEMS:
        kept.append(f"[+{len(argv) - MAX_ITEMS} words]")
    return kept


def _introduces_a_secret(word: str) -> bool:
    """A secret-naming header name (``Authorization:``) or authorisation scheme
    (``Bearer``): the next word is the secret."""
    if word.lower() in _AUTH_SCHEMES:
        return True
    return word.endswith(":") and is_secret_key(word)


def _command_secrets(words: Sequence[str]) -> dict[int, str]:
    """In the words of one command, what to log instead of those that hold a secret: the
    word after a secret-naming option, and the secret values of :func:`_program_options`."""
    hidden: dict[int, str] = {}
    options: dict[str, str] = {}
    next_value: str | None = None
    for index, word in enumerate(words):
        if next_value is not None:
            replacement = _hidden_value(word, next_value)
            if replacement is not None:
                hidden[index] = replacement
            next_value = None
            continue
        bare = _unquoted(word)
        options = options or _program_options(bare.rpartition("/")[2])
        # The program's own options first: mysql's -pPassword123 is a password given in the
        # word, not an option named "password" whose value is the next word.
        how = _program_option(word, bare, options, hidden, index)
        if how is not None:
            next_value = how or None
            continue
        if bare.startswith("-") and _ARGV_KEY.fullmatch(bare) and is_secret_key(bare):
            next_value = _WHOLE
    return hidden


def _program_option(
    word: str, bare: str, options: dict[str, str], hidden: dict[int, str], index: int
) -> str | None:
    """If ``word`` is one of the program's secret-bearing ``options``: hide a value glued to
    it (in ``hidden``) and return how the next word is to be hidden ("" when it is not);
    None when the word is none of them."""
    for option, how in options.items():
        if how != _GLUED and (bare == option or _in_a_cluster(bare, option)):
            return how
        glued = _glued_value(bare, option)
        if glued is not None:
            replacement = _hidden_value(glued, how)
            if replacement is not None:
                hidden[index] = word.replace(glued, replacement, 1)
            return ""
    return None


def _program_options(program: str) -> dict[str, str]:
    """The options whose value is a secret in ``program``'s command line only (their common
    meaning elsewhere — ``mkdir -p``, ``docker run -u 1000:1000`` — is no secret)."""
    if program == "curl":
        return _CURL_OPTIONS
    if program.startswith(("mysql", "mariadb")):
        return {"-p": _GLUED}  # -p alone asks for the password; the next word is a database
    if program == "sshpass":
        return {"-p": _WHOLE}
    return {}


def _in_a_cluster(word: str, option: str) -> bool:
    """``-su`` for ``-u``: short options given together, the one taking a value last."""
    short = not option.startswith("--")
    return short and word.endswith(option[1]) and _SHORT_OPTIONS.fullmatch(word) is not None


def _glued_value(word: str, option: str) -> str | None:
    """The value given in the same word as ``option`` (``-uVALUE``, ``--user=VALUE``)."""
    given_as = option + ("=" if option.startswith("--") else "")
    return word[len(given_as) :] if word.startswith(given_as) and word != given_as else None


def _unquoted(word: str) -> str:
    if len(word) >= 2 and word[0] == word[-1] and word[0] in "\"'":
        return word[1:-1]
    return word


def _hidden_value(word: str, how: str) -> str | None:
    """``word`` with its secret replaced, quotes kept; None when it holds none to hide."""
    quote = word[0] if _unquoted(word) != word else ""
    value = _unquoted(word)
    if not value or value == REDACTED:
        return None
    if how == _PASSWORD_PART:
        user, colon, password = value.partition(":")
        if not colon or not password or password == REDACTED:
            return None  # no password given: the program asks for it
        return f"{quote}{user}:{REDACTED}{quote}"
    return f"{quote}{REDACTED}{quote}"


def redact_text(text: str) -> str:
    """``text`` with the values of the secrets it names replaced (the free-text rule)."""
    text = _PEM_BLOCK.sub(REDACTED, text)
    text = _KNOWN_TOKEN.sub(REDACTED, text)
    text = _HEADER_LINE.sub(_redact_header, text)
    text = _AUTH_CREDENTIAL.sub(lambda m: f"{m['scheme']}{m['gap']}{REDACTED}", text)
    text = _URL_PASSWORD.sub(lambda m: f"{m['lead']}{REDACTED}@", text)
    return _redact_command_lines(_redact_key_values(text))


def _redact_command_lines(text: str) -> str:
    """The command-line rule (:func:`_command_secrets`) for each command written in
    ``text``: a command ends at a line break or at ``;``, ``&`` or ``|``."""
    pieces, kept_up_to = [], 0
    command: list[re.Match[str]] = []
    for word in [*_SHELL_WORD.finditer(text), None]:
        ends = word is None or word[0][0] in ";&|"
        if command and not ends and "\n" in text[command[-1].end() : word.start()]:
            ends = True
        if ends and command:
            for index, replacement in sorted(_command_secrets([w[0] for w in command]).items()):
                found = command[index]
                pieces += [text[kept_up_to : found.start()], replacement]
                kept_up_to = found.end()
            command = []
        if word is not None and word[0][0] not in ";&|":
            command.append(word)
    return "".join(pieces) + text[kept_up_to:]


def _redact_header(match: re.Match[str]) -> str:
    if not is_secret_key(match["name"]):
        return match[0]
    return f"{match['name']} {REDACTED}"


def _redact_key_values(text: str) -> str:
    """``key=value``, ``key: value``, ``"key": "value"``: the value goes when the key names a
    secret.  A key that names none consumes nothing, so ``https://h/?api_key=…`` is still read
    as far as its ``api_key``."""
    pieces, kept_up_to, position = [], 0, 0
    while (found := _SECRET_KEY_SEPARATOR.search(text, position)) is not None:
        position = found.end()
        if not is_secret_key(found["key"]):
            position = found.start() + len(found["key"])
            continue
        value = _VALUE.match(text, found.end())
        if value is None:
            continue
        quote = value[0][:2] if value[0].startswith('\\"') else value[0][0]
        quote = quote if quote in ('\\"', '"', "'") else ""
        pieces += [text[kept_up_to : found.end()], f"{quote}{REDACTED}{quote}"]
        kept_up_to = position = value.end()
    return "".join(pieces) + text[kept_up_to:]


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
