"""Which keys name a secret: the first part of the logging rule of :mod:`cortexfs.shared.redact`
(SPEC S-4), shared by its JSON, free-text and command-line parts."""

from __future__ import annotations

import re
import unicodedata

REDACTED = "[redacted]"

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
# Ordinary words that start with a secret's name and name none: a key holding one is judged
# on the rest of it (``tokenizer`` names no secret, ``tokenizer_secret`` does).  Each is
# looked for inside one word of the key, never across two: ``secret_args``, ``SecretArchive``
# and ``access_token_issued`` hold no ``secretary`` or ``tokenise``, and name a secret.
_ORDINARY_WORDS = re.compile(r"tokeni[sz]|secretar")
# The words of a key, as snake_case, kebab-case and camelCase write them.  ``auth`` names a
# secret only as the last word of a key (``basic_auth``, ``X-Auth``): too many words start
# with it (``author``), and ``auth_url`` or ``auth_type`` name none.
KEY_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
_KEY_CHARACTERS = re.compile(r"[^a-z0-9]")
# An option or argv key: ``--api-key``, ``TOKEN``.
ARGV_KEY = re.compile(r"-*[A-Za-z0-9_.]+(?:-[A-Za-z0-9_.]+)*")


def is_secret_key(key: str) -> bool:
    """Whether ``key`` names a secret (see the rule of :mod:`cortexfs.shared.redact`)."""
    # Compatibility forms first: a fullwidth ``ＰＡＳＳＷＯＲＤ`` or a ligature names the same
    # key to the program that reads it, and is beyond ASCII, which the rule drops.
    key = unicodedata.normalize("NFKC", key)
    normalised = _KEY_CHARACTERS.sub("", key.lower())
    if any(word in normalised for word in SECRET_WORDS):
        ordinary_removed = _KEY_CHARACTERS.sub("", _without_ordinary_words(key).lower())
        if any(word in ordinary_removed for word in SECRET_WORDS):
            return True
    if not normalised.endswith("auth"):
        return False
    words = KEY_WORDS.findall(key)
    return bool(words) and words[-1].lower() == "auth"


def _without_ordinary_words(key: str) -> str:
    """``key`` with the ordinary words (:data:`_ORDINARY_WORDS`) taken out of each of its
    words; what is between its words (``_``, ``-``, a letter beyond ASCII) is kept, so that
    the key is then judged as the rule reads it, all but letters and digits dropped."""
    return KEY_WORDS.sub(lambda word: _ORDINARY_WORDS.sub("", word[0].lower()), key)
