"""Secrets in command lines: the command-line part of the logging rule of
:mod:`cortexfs.shared.redact` (SPEC S-4), for an argv and for commands written in a text.

The word after a secret-naming option is a secret everywhere; the options of
:data:`_PROGRAMS` hold one only in that program's command (``curl -u``, ``mysql -pX``,
``openssl -pass pass:X``, ``htpasswd -b … PASSWORD``), and mean none elsewhere.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from cortexfs.shared.secret_keys import ARGV_KEY, REDACTED, is_secret_key

# The words of a command line written in a text (quoted parts kept whole), and the operators
# that end one command and start the next.
_SHORT_OPTIONS = re.compile(r"-[A-Za-z]+")
_SHELL_WORD = re.compile(r"""(?:"(?:[^"\\]|\\.)*"|'[^']*'|[^\s"';&|])+|[;&|]+""")
_REDIRECTION = re.compile(r"[0-9]*[<>]")

# How the value of an option that names a secret is hidden: whole, the password of
# ``user:password``, or the secret of openssl's ``pass:SECRET``.  ``_GLUED`` values count
# only glued to their option (``-pX``).
_WHOLE, _PASSWORD_PART, _PASS_ARGUMENT, _GLUED = "whole", "password", "pass:", "glued"
_CURL_OPTIONS = {
    "-u": _PASSWORD_PART,
    "--user": _PASSWORD_PART,
    "-U": _PASSWORD_PART,
    "--proxy-user": _PASSWORD_PART,
}
_OPENSSL_OPTIONS = {
    "-k": _WHOLE,
    "-K": _WHOLE,
    "-pass": _PASS_ARGUMENT,
    "-passin": _PASS_ARGUMENT,
    "-passout": _PASS_ARGUMENT,
}
# The programs whose options hold a secret where the same options elsewhere mean none, and
# whether their short options are getopt's (given together, ``-su``, or glued, ``-uX``).
_PROGRAMS: dict[str, tuple[dict[str, str], bool]] = {
    "curl": (_CURL_OPTIONS, True),
    "mysql": ({"-p": _GLUED}, True),  # -p alone asks for the password; the next word is a db
    "mariadb": ({"-p": _GLUED}, True),
    "sshpass": ({"-p": _WHOLE}, True),
    "login": ({"-p": _WHOLE}, True),  # as a subcommand of one of the _LOGIN_CLIENTS
    "openssl": (_OPENSSL_OPTIONS, False),
    "htpasswd": ({}, True),  # -b: the password is the last operand (_htpasswd_password)
}
# The clients whose ``login`` subcommand takes the password with -p.
_LOGIN_CLIENTS = {"docker", "podman", "nerdctl", "buildah", "skopeo", "oras", "helm", "az", "cf"}


def command_secrets(words: Sequence[str]) -> dict[int, str]:
    """In the words of one command, what to log instead of those that hold a secret: the
    word after a secret-naming option, and the secret values of the :data:`_PROGRAMS`."""
    hidden: dict[int, str] = {}
    program = ""
    next_value: str | None = None
    for index, word in enumerate(words):
        if next_value is not None:
            replacement = _hidden_value(word, next_value)
            if replacement is not None:
                hidden[index] = replacement
            next_value = None
            continue
        bare = _unquoted(word)
        if not program:
            program = _program(bare, words[:index])
            if program == "htpasswd":
                operand = _htpasswd_password(words, index)
                if operand is not None:
                    hidden[operand] = _hidden_value(words[operand], _WHOLE) or words[operand]
        # The program's own options first: mysql's -pPassword123 is a password given in the
        # word, not an option named "password" whose value is the next word.
        how = _program_option(word, bare, program, hidden, index) if program else None
        if how is not None:
            next_value = how or None
            continue
        if bare.startswith("-") and ARGV_KEY.fullmatch(bare) and is_secret_key(bare):
            next_value = _WHOLE
    return hidden


def _program(word: str, before: Sequence[str]) -> str:
    """The :data:`_PROGRAMS` entry that ``word`` runs, or "" (``before``: the command's words
    before it)."""
    name = word.rpartition("/")[2]
    if name.startswith(("mysql", "mariadb")):  # mysqldump, mariadb-dump…
        return name[:5] if name.startswith("mysql") else name[:7]
    if name == "login":
        # Only a subcommand of a registry or cloud client (``docker --config d login``,
        # ``az acr login``): login(1) itself keeps the environment with -p, and in another
        # program's command the word is an operand (``grep login -p file``).
        clients = (_unquoted(earlier).rpartition("/")[2] for earlier in before)
        return name if any(client in _LOGIN_CLIENTS for client in clients) else ""
    return name if name in _PROGRAMS else ""


def _program_option(
    word: str, bare: str, program: str, hidden: dict[int, str], index: int
) -> str | None:
    """If ``word`` is one of the ``program``'s secret-bearing options: hide a value glued to
    it (in ``hidden``) and return how the next word is to be hidden ("" when it is not);
    None when the word is none of them."""
    options, getopt = _PROGRAMS[program]
    for option, how in options.items():
        if how != _GLUED and (bare == option or (getopt and _in_a_cluster(bare, option))):
            return how
        glued = _glued_value(bare, option) if getopt else None
        if glued is not None:
            replacement = _hidden_value(glued, how)
            if replacement is not None:
                hidden[index] = word.replace(glued, replacement, 1)
            return ""
    return None


def _htpasswd_password(words: Sequence[str], program_at: int) -> int | None:
    """Where htpasswd's password is: with ``-b`` (batch), its last operand
    (``htpasswd -b FILE USER PASSWORD``, ``htpasswd -nb USER PASSWORD``); without, it asks."""
    batch, operand, option_value = False, None, False
    for index in range(program_at + 1, len(words)):
        word = _unquoted(words[index])
        if _REDIRECTION.match(word):
            break
        if option_value:
            option_value = False
        elif _SHORT_OPTIONS.fullmatch(word):
            batch = batch or "b" in word
            option_value = word[-1] in "Cr"  # -C cost, -r rounds
        else:
            operand = index
    return operand if batch else None


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
    if how == _PASS_ARGUMENT:
        # env:VAR, file:PATH, fd:N and stdin say where the secret is, not what it is.
        if not value.startswith(_PASS_ARGUMENT) or value == _PASS_ARGUMENT + REDACTED:
            return None
        return f"{quote}{_PASS_ARGUMENT}{REDACTED}{quote}"
    return f"{quote}{REDACTED}{quote}"


def redact_command_lines(text: str) -> str:
    """The command-line rule (:func:`command_secrets`) for each command written in
    ``text``: a command ends at a line break or at ``;``, ``&`` or ``|``."""
    pieces, kept_up_to = [], 0
    command: list[re.Match[str]] = []
    for word in [*_SHELL_WORD.finditer(text), None]:
        ends = word is None or word[0][0] in ";&|"
        if command and not ends and "\n" in text[command[-1].end() : word.start()]:
            ends = True
        if ends and command:
            for index, replacement in sorted(command_secrets([w[0] for w in command]).items()):
                found = command[index]
                pieces += [text[kept_up_to : found.start()], replacement]
                kept_up_to = found.end()
            command = []
        if word is not None and word[0][0] not in ";&|":
            command.append(word)
    return "".join(pieces) + text[kept_up_to:]
