"""Acceptance tests of §7 (tsh, its configuration, ``ctx tool``), §8 (the agent terminal),
§10 (ctxmcp), §11 and §12 (``ctx man``), run against the installed commands: unusual but
legal inputs, closed streams, repeated commands and the exact shape of what they print."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import clean_env, ctx_run


def tool_env(storage: Path, **extra: str) -> dict[str, str]:
    """The environment of a host user whose CTX_PATH is the storage root's system tier."""
    return clean_env(CTX_STORAGE=str(storage), CTX_PATH=str(storage / "tool"), **extra)


def config_of(storage: Path) -> Path:
    return storage / "tool" / "tsh.d" / "config"


# ------------------------------------------------------------------ H-4: tsh.d/config


@pytest.mark.parametrize("digits", ["²", "٣", "６４"])
def test_tsh_config_refuses_digits_that_are_not_ascii(storage, digits):
    """H-4: settings are decimal numbers; other scripts' digits are refused with EINVAL (exit
    2), and the file is left as it was."""
    before = config_of(storage).read_bytes()
    r = ctx_run("tool", "tsh.config", f"cache_capacity={digits}", env=tool_env(storage))
    assert r.rc == 2, r
    assert r.err.startswith("ctx: EINVAL: tsh.config: cache_capacity must be"), r
    assert "Traceback" not in r.err
    set_json = json.dumps({"set": {"cache_capacity": digits}})
    r = ctx_run("tool", "--json", "tsh.config", set_json, env=tool_env(storage))
    assert r.rc == 2, r
    assert r.json()["error"] == "EINVAL"
    assert config_of(storage).read_bytes() == before


def test_a_config_line_with_a_superscript_is_reported_not_a_crash(storage):
    """H-4: a config line tsh cannot use is a problem that bootstrap, ctx tool and tsh report;
    the defaults apply to it and nothing crashes."""
    config = config_of(storage)
    config.chmod(0o644)
    with config.open("a") as text:
        text.write("cache_capacity=²\n")
    r = ctx_run("bootstrap", "--storage", storage)
    assert r.rc == 1, r
    assert "tool/tsh.d/config:5: cache_capacity must be a positive integer" in r.out, r
    r = ctx_run("tool", "tsh.config", env=tool_env(storage))
    assert r.rc == 0, r
    assert "cache_capacity=32" in r.lines()
    tsh = subprocess.run(
        [storage / "bin" / "tsh", "tools"], capture_output=True, text=True,
        env=tool_env(storage), timeout=60,
    )  # fmt: skip
    assert tsh.returncode == 0, tsh
    assert "tsh.config" in tsh.stdout.split()
    assert "cache_capacity must be a positive integer" in tsh.stderr
    assert "Traceback" not in tsh.stderr


def test_a_numeric_string_in_set_is_written_as_a_number(storage):
    r = ctx_run(
        "tool", "--json", "tsh.config", '{"set": {"cache_capacity": "48"}}', env=tool_env(storage)
    )
    assert r.rc == 0, r
    assert r.json()["config"]["cache_capacity"] == 48
    assert r.json()["changed"] == ["cache_capacity"]
    assert "cache_capacity=48" in config_of(storage).read_text().splitlines()
