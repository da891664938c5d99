"""Exit statuses and error lines the command groups share (SPEC §2.4 convention, R-5, T-8)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import ctx
from tests.support.storage import copy_of_root
from tests.support.storage import traversable_tmp as traversable_tmp


@pytest.fixture
def storage(bootstrapped_by_ctx: Path, tmp_path: Path) -> Path:
    """A root ``ctx bootstrap`` made, this test's own."""
    return copy_of_root(bootstrapped_by_ctx, tmp_path / "storage")


@pytest.mark.parametrize(
    "args",
    [
        ("shared", "create", "bad/x"),
        ("object", "which", "bad/name"),
        ("queue", "init", "--project", "a b"),
    ],
)
def test_a_malformed_name_on_the_command_line_is_a_usage_error(
    storage: Path, args: tuple[str, ...]
) -> None:
    refused = ctx(storage, *args)

    assert refused.returncode == 2 and "EINVAL" in refused.stderr


def test_bootstrap_exits_1_when_it_leaves_a_problem(storage: Path, tmp_path: Path) -> None:
    (storage / "model").rmdir()
    (storage / "model").write_text("in the way")

    refused = ctx(storage, "bootstrap")

    assert refused.returncode == 1 and "problem   model" in refused.stdout
    assert (storage / "model").read_text() == "in the way"  # never destroys user data
    assert ctx(storage, "bootstrap", str(tmp_path / "no-such-source")).returncode == 2


def test_a_refused_file_lists_each_reason_once_with_its_own_errno(
    storage: Path, tmp_path: Path
) -> None:
    missing = ctx(storage, "object", "check", str(tmp_path / "none.json"))
    invalid = ctx(storage, "agent", "create", "--user", "nobody", "-", stdin='{"name": "a"}')

    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines() == [
        f"{tmp_path / 'none.json'}: ENOENT: cannot read {tmp_path / 'none.json'}: "
        "No such file or directory; nothing was checked or installed"
    ]
    assert invalid.returncode == 1
    assert invalid.stderr.strip().splitlines() == [
        "ctx: EINVAL: <stdin>: request: 'label' is a required property"
    ]


def test_install_lists_each_problem_of_a_manifest_in_the_ctx_form(
    storage: Path, tmp_path: Path
) -> None:
    manifest = tmp_path / "bad.json"
    manifest.write_text('{"manifest": 2, "kind": "tool", "name": "x.d"}')

    refused = ctx(storage, "object", "install", str(manifest), "--tier", "system")
    checked = ctx(storage, "object", "check", str(manifest))

    assert refused.returncode == 1
    lines = refused.stderr.strip().splitlines()
    assert len(lines) > 1  # every problem, not the first one only
    assert all(line.startswith(f"ctx: EINVAL: {manifest}: ") for line in lines), lines
    # a check reports on files as a linter does, like 'ctx policy check' (P-8)
    assert checked.stderr.strip().splitlines() == [
        line.replace("ctx: EINVAL: ", "").replace(": ", ": EINVAL: ", 1) for line in lines
    ]


def test_the_manual_bundle_is_not_a_shared_space(storage: Path) -> None:
    for args in (
        ("shared", "create", "cortexfs-docs"),
        ("queue", "init", "--project", "cortexfs-docs"),
    ):
        refused = ctx(storage, *args)
        # a name no space may take is a malformed argument, like an illegal one: exit 2
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.startswith("ctx: EINVAL: ")
        assert "manual bundle (X-2)" in refused.stderr
    # Bootstrap installed the bundle; neither command added a space's parts to it.
    assert sorted(os.listdir(storage / "shared" / "cortexfs-docs")) == ["README.md", "man"]


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (
            ("policy", "query", "--policy", "p", "coder_t", "tool:fs.read"),
            "Missing argument 'PERM'",
        ),
        (("queue", "claim", "--project", "p", "--bogus"), "No such option '--bogus'"),
        (
            ("queue", "claim", "--project", "p", "--ttl", "soon"),
            "'soon' is not a number of seconds",
        ),
        (("no-such-command",), "No such command 'no-such-command'"),
    ],
)
def test_a_malformed_command_line_exits_2_with_einval(
    storage: Path, args: tuple[str, ...], reason: str
) -> None:
    refused = ctx(storage, *args)

    assert refused.returncode == 2 and refused.stdout == ""
    last = refused.stderr.splitlines()[-1]
    assert last.startswith("ctx: EINVAL: ") and reason in last, refused.stderr


def test_a_malformed_command_line_asking_for_json_also_gets_the_error_object(
    storage: Path,
) -> None:
    """A --json caller reads stdout: a usage error is an object there too, as a refusal is."""
    refused = ctx(storage, "queue", "list", "--project", "p", "--state", "nowhere", "--json")

    assert refused.returncode == 2
    error = json.loads(refused.stdout)
    assert error["error"] == "EINVAL" and error["errno"] == 22
    assert "--state" in error["message"]
    assert refused.stderr.splitlines()[-1] == f"ctx: EINVAL: {error['message']}"


def test_json_after_a_double_dash_is_an_operand_not_the_option(storage: Path) -> None:
    refused = ctx(storage, "queue", "show", "--project", "p", "--bogus", "--", "--json")

    assert refused.returncode == 2 and refused.stdout == ""


def test_ctxmcp_reports_a_malformed_command_line_the_same_way() -> None:
    refused = subprocess.run(
        [sys.executable, "-c", "from cortexfs.cli.ctxmcp import main; main()", "list"],
        capture_output=True,
        text=True,
    )

    assert refused.returncode == 2
    assert refused.stderr.splitlines()[-1] == "ctxmcp: EINVAL: Missing option '--config'."


def _in(directory: Path, *argv: str, stdin: int | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*argv],
        cwd=directory,
        stdin=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "CTX_STORAGE"},
    )


@pytest.mark.parametrize(
    "args",
    [
        ("--storage", "", "bootstrap"),
        ("queue", "init", "--queue", ""),
        ("run", "--storage", "", "--agent", "a", "fs.read"),
        ("queue", "recover", "--project", "p", "--grace", "nan"),
        ("queue", "work", "--project", "p", "--agent", "a", "--timeout", "inf"),
        ("run", "--agent", "a", "--timeout", "inf", "fs.read"),
        ("agent", "show", "bad/x"),
        ("shared", "create", "s8", "--group", "4294967296"),
    ],
)
def test_an_empty_path_an_endless_duration_or_a_bad_id_is_a_usage_error(
    storage: Path, tmp_path: Path, args: tuple[str, ...]
) -> None:
    """An empty string would be the current directory; nan and inf are no durations; a gid of
    2**32 overflows.  Each is EINVAL (exit 2) with nothing made, here or in the root."""
    here = tmp_path / "here"
    here.mkdir()
    before = sorted(p.name for p in storage.rglob("*"))

    refused = _in(here, sys.executable, "-m", "cortexfs", "--storage", str(storage), *args)
    if args[0] == "--storage":  # the group's own --storage: give it alone
        refused = _in(here, sys.executable, "-m", "cortexfs", *args)

    assert refused.returncode == 2, refused.stderr
    assert "ctx: EINVAL: " in refused.stderr and "Traceback" not in refused.stderr
    assert os.listdir(here) == []
    assert sorted(p.name for p in storage.rglob("*")) == before


@pytest.mark.parametrize(
    "args",
    [
        ("queue", "publish", "--project", "p", "-"),
        ("agent", "create", "-"),
        ("run", "--agent", "a", "--native", "fs.read"),
    ],
)
def test_a_closed_stdin_reads_as_empty_not_as_a_crash(
    storage: Path, tmp_path: Path, args: tuple[str, ...]
) -> None:
    assert ctx(storage, "queue", "init", "--project", "p").returncode == 0
    argv = [sys.executable, "-m", "cortexfs", "--storage", str(storage), *args]
    if args[0] == "run":
        argv = [sys.executable, "-m", "cortexfs", *args[:1], "--storage", str(storage), *args[1:]]
    # fd 0 closed in the child: sh's '<&-', here through a shell
    refused = subprocess.run(
        ["/bin/sh", "-c", '"$@" <&-', "sh", *argv], capture_output=True, text=True, timeout=60
    )

    assert refused.returncode in (1, 2), refused.stderr
    assert "Traceback" not in refused.stderr
    said = refused.stderr.splitlines() + [  # native mode answers in its result frame
        f"ctx: {frame['error']['error']}" for frame in map(json.loads, refused.stdout.splitlines())
    ]
    assert any(line.startswith("ctx: E") for line in said), said
    assert os.listdir(storage / "shared" / "p" / "queue" / "pending") == []


def test_a_native_call_with_stdin_closed_is_ebadf_and_nothing_is_recorded(storage: Path) -> None:
    """No input at all is not an empty input: ``ctx run --native … <&-`` is refused as the
    queue commands refuse it, before the call is recorded in any session."""
    argv = [sys.executable, "-m", "cortexfs", "run", "--storage", str(storage), "--native"]
    refused = subprocess.run(
        ["/bin/sh", "-c", '"$@" <&-', "sh", *argv, "--agent", "a", "fs.read"],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert refused.returncode == 1 and refused.stdout == "", refused
    assert refused.stderr.startswith("ctx: EBADF: standard input is closed"), refused.stderr
    assert not (storage / "home").exists() or not any((storage / "home").rglob("events.jsonl"))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to read as another uid")
@pytest.mark.parametrize("command", [("object", "check"), ("agent", "create")])
def test_an_unreadable_file_is_eacces_exit_1_like_a_missing_one_is_enoent(
    storage: Path, traversable_tmp: Path, command: tuple[str, ...]
) -> None:
    unreadable = traversable_tmp / "unreadable.json"  # reachable, so only its mode refuses
    unreadable.write_text("{}")
    unreadable.chmod(0)
    argv = [sys.executable, "-m", "cortexfs", "--storage", str(storage), *command]

    refused = subprocess.run(
        [*argv, str(unreadable)], capture_output=True, text=True, user=65534, group=65534
    )

    assert refused.returncode == 1, refused.stderr
    assert "EACCES" in refused.stderr and "Traceback" not in refused.stderr


def _in_1_gib() -> None:
    """Run with 1 GiB of address space: an input read whole would end in MemoryError."""
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ("agent", "create", "-"),
            "ctx: EFBIG: <stdin>: a request is at most 262144 bytes; nothing was created\n",
        ),
        (
            ("run", "--agent", "a", "--native", "fs.read"),
            "ctx: EFBIG: standard input holds more than 16777216 bytes, more than a tool's "
            "input may; nothing was run\n",
        ),
    ],
)
def test_a_stdin_that_never_ends_is_refused_past_the_limit_of_the_input(
    storage: Path, args: tuple[str, ...], said: str
) -> None:
    """The same limit as the command's FILE (a request), or as a core tool's input: no more
    than a byte past it read, where reading stdin whole would exhaust memory."""
    before = sorted(p.name for p in storage.rglob("*"))
    with open("/dev/zero", "rb") as zeros:
        refused = subprocess.run(
            [sys.executable, "-m", "cortexfs", *args],
            stdin=zeros,
            env={**os.environ, "CTX_STORAGE": str(storage)},
            capture_output=True,
            text=True,
            preexec_fn=_in_1_gib,
            timeout=60,
        )

    assert (refused.returncode, refused.stdout, refused.stderr) == (1, "", said)
    assert sorted(p.name for p in storage.rglob("*")) == before


def _to_full_disk(storage: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``ctx ARGS > /dev/full``: every write to standard output fails with ENOSPC."""
    with open("/dev/full", "w") as full:
        return subprocess.run(
            [sys.executable, "-m", "cortexfs", *args],
            stdin=subprocess.DEVNULL,
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "CTX_STORAGE": str(storage)},
            timeout=60,
        )


@pytest.mark.parametrize(
    "args",
    [
        ("policy", "query", "--policy", "{policy}", "coder_t", "tool:fs.read", "execute"),
        ("policy", "query", "--policy", "{policy}", "coder_t", "tool:fs.write", "execute"),
        ("policy", "check", "--json", "{policy}"),
        ("agent", "list", "--json"),
        ("object", "list"),
        ("--help",),
    ],
)
def test_an_answer_that_cannot_be_written_is_enospc_exit_74_not_an_answer(
    storage: Path, tmp_path: Path, args: tuple[str, ...]
) -> None:
    """Exit 1 would read as a denial (policy query, P-8), an invalid file or a conflict found;
    the answer was lost, which 74 alone says, with no traceback."""
    policy = tmp_path / "coder.policy"
    policy.write_text("allow coder_t tool:fs.read execute\n")

    lost = _to_full_disk(storage, *(arg.format(policy=policy) for arg in args))

    assert (lost.returncode, lost.stderr) == (
        74,
        "ctx: ENOSPC: cannot write standard output (No space left on device)\n",
    )


@pytest.mark.parametrize("as_json", [[], ["--json"]])
def test_a_usage_error_stays_exit_2_when_its_json_cannot_be_written(
    storage: Path, as_json: list[str]
) -> None:
    refused = _to_full_disk(storage, "queue", "status", *as_json)

    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert refused.stderr.splitlines()[-1].startswith("ctx: EINVAL: missing --project")


def test_a_change_whose_output_cannot_be_written_says_it_was_made(
    storage: Path, tmp_path: Path
) -> None:
    """The change is made and durable before its acknowledgement is printed: a bare ENOSPC
    would have the user make it again (a job finished twice is refused as already done)."""
    assert ctx(storage, "queue", "init", "--project", "p").returncode == 0
    request = tmp_path / "req.json"
    request.write_text(json.dumps({"tool": "fs.read", "input": {}}))
    assert ctx(storage, "queue", "publish", "--project", "p", "--name", "j1", str(request)).stdout
    assert ctx(storage, "queue", "claim", "--project", "p").stdout == "j1.req.json\n"

    made = {
        "finish": _to_full_disk(storage, "queue", "finish", "--project", "p", "j1", "--ok"),
        "space": _to_full_disk(storage, "shared", "create", "q9"),
        "queue": _to_full_disk(storage, "queue", "init", "--project", "q8", "--json"),
        "root": _to_full_disk(tmp_path / "new-root", "bootstrap"),
    }

    lost = "ctx: ENOSPC: cannot write standard output (No space left on device); "
    said = {what: done.stderr for what, done in made.items()}
    assert said == {
        "finish": lost + "job j1.req.json was finished in done/ (do not finish it again)\n",
        "space": lost + f"shared space q9 is complete ({storage / 'shared' / 'q9'})\n",
        "queue": lost
        + f"queue {storage / 'shared' / 'q8' / 'queue'} was made (12 entries created)\n",
        "root": lost + f"the storage root {tmp_path / 'new-root'} was bootstrapped "
        "(running it again is safe)\n",
    }
    assert {done.returncode for done in made.values()} == {74}
    assert ctx(storage, "queue", "list", "--project", "p").stdout.split() == ["done", "j1.req.json"]
