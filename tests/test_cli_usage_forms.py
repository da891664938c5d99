"""Usage errors read alike however the line went wrong: an option left without its value
shows its command's usage lines as any other, the error object goes to stdout only for a line
that asked for ``--json`` as an option (not as another option's value, nor as a tool's
argument), an empty path or tier is refused as malformed (EINVAL, exit 2), and ``ctx run``
takes its options spelt out, as click takes every other command's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.cli import ctx


def test_an_option_without_its_value_shows_its_commands_usage(tmp_path: Path) -> None:
    refused = ctx(tmp_path, "queue", "status", "--project")
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith("Usage: ctx queue status [OPTIONS]\n")
    assert refused.stderr.endswith("EINVAL: Option '--project' requires an argument.\n")


@pytest.mark.parametrize(
    ("args", "asked"),
    [
        (["queue", "status", "--json", "--bogus"], True),
        (["queue", "claim", "-p", "proj", "--worker", "--json", "--ttl", "0"], False),
        (["tool", "--nosuch", "tsh.config", "--json"], False),
        (["tool", "--json", "--nosuch", "tsh.config"], True),
        (["policy", "query", "--policy", "--json", "a_t", "tool:x"], False),
        (["queue", "status", "--bogus", "--", "--json"], False),
    ],
)
def test_the_error_object_goes_to_stdout_only_when_json_was_asked(
    tmp_path: Path, args: list[str], asked: bool
) -> None:
    refused = ctx(tmp_path, *args)
    assert refused.returncode == 2, refused
    if asked:
        assert json.loads(refused.stdout)["error"] == "EINVAL", refused
    else:
        assert refused.stdout == "", refused


@pytest.mark.parametrize(
    "args",
    [
        ["object", "list", "--tier="],
        ["policy", "query", "--policy=", "a_t", "tool:x", "execute"],
        ["policy", "check", ""],
    ],
)
def test_an_empty_tier_or_policy_file_is_malformed(tmp_path: Path, args: list[str]) -> None:
    refused = ctx(tmp_path, *args)
    assert refused.returncode == 2 and "EINVAL" in refused.stderr, refused


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--agen", "coder", "fs.stat"], "No such option '--agen'. Did you mean '--agent'?"),
        (["--agent", "coder", "--nat", "fs.stat"], "No such option '--nat'. Did you mean"),
        (["--agent=coder", "--tim=3", "fs.stat"], "No such option '--tim'. Did you mean"),
        (["--agent", "coder", "-x", "fs.stat"], "No such option '-x'."),
        (["--help", "--agen", "coder", "fs.stat"], "No such option '--agen'."),
    ],
)
def test_ctx_run_refuses_a_shortened_or_unknown_option_as_click_does(
    tmp_path: Path, args: list[str], said: str
) -> None:
    refused = ctx(tmp_path, "run", *args)
    assert refused.returncode == 2 and refused.stdout == "", refused
    assert refused.stderr.startswith("Usage: ctx run [OPTIONS] TOOL [ARGS]...\n"), refused
    assert f"ctx: EINVAL: {said}" in refused.stderr, refused


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["queue", "recover", "-p", "p", "--grace", "1e309"], "'1e309' is not a finite number"),
        (["queue", "claim", "-p", "p", "--ttl", "1e-400"], "'--ttl': 1e-400 is not in the range"),
        (["queue", "claim", "-p", "p", "--pid", "0" * 40 + "1"], "has more than 40 digits"),
    ],
)
def test_a_number_out_of_its_range_is_named_as_it_was_typed(
    tmp_path: Path, args: list[str], said: str
) -> None:
    refused = ctx(tmp_path, *args)
    assert refused.returncode == 2 and refused.stdout == "", refused
    assert said in refused.stderr, refused
