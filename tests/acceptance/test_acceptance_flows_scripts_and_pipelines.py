"""``ctx`` composed in shell scripts and pipelines (SPEC §2.4, Q-3, Q-5, I-4, T-2, T-3; README;
docs/queue.md *Command line*, docs/tools.md *Terminal CLI mode*): real ``bash -c`` and
``bash -euo pipefail`` scripts that publish from heredocs, here-strings, process substitution
and ``xargs -P``, work the queue in a ``while J=$(ctx queue claim …)`` loop until claim exits 3,
finish from subshells, renew from a background loop, stop half-way under ``set -e``, parse
``--json`` output with ``python3``, run tools in pipelines and nested in other tools, and start
``ctx`` from ``/``, from a removed directory and with ``env -i``.  What is checked: each exit
status against the documented table, standard output holding exactly the answer (the job name,
one JSON document, nothing on an error), the lease held by the process §2.4 names, and no job
lost, run twice or left half-done."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    REPO,
    QueueCLI,
    clean_env,
    new_scratch_dir,
    scratch_top,
    snapshot,
    tool_manifest,
    wait_for,
)
from tests.acceptance.workercli import AGENT, LABEL
from tests.acceptance.workercli import agent as agent
from tests.acceptance.workercli import storage as storage
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
BIN = REPO / ".venv" / "bin"
CTX = str(BIN / "ctx")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
FS_STAT = {"tool": "fs.stat", "input": {"path": "/"}}

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="an agent's tool runs as another uid: needs root"
)


# ------------------------------------------------------------------------------ helpers


@pytest.fixture
def scratch() -> Iterator[Path]:
    top = new_scratch_dir(SCRATCH, "s")
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


def shell_env(queue: QueueCLI, scratch: Path, **extra: str) -> dict[str, str]:
    """A user's shell: the venv's ``ctx`` first on PATH, the storage root in CTX_STORAGE, a
    claim-order cache of the test's own, ``P`` the project and ``OUT`` a scratch directory."""
    return clean_env(
        PATH=f"{BIN}:{SYSTEM_PATH}",
        CTX_STORAGE=str(queue.storage),
        XDG_CACHE_HOME=str(scratch / "cache"),
        P=queue.project,
        OUT=str(scratch),
        **extra,
    )


def bash(
    script: str, env: dict[str, str], *args: str, cwd: Path | str | None = None, timeout=60
) -> subprocess.CompletedProcess[str]:
    """``bash -c SCRIPT bash ARGS…`` in a session of its own, its output captured as text;
    on a timeout its whole process group (background loops included) is killed."""
    proc = subprocess.Popen(
        ["bash", "-c", script, "bash", *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def no_traceback(text: str) -> None:
    assert "Traceback" not in text and "Exception" not in text, text


def install_tool(storage: Path, scratch: Path, name: str, program: str) -> None:
    """A v2 tool ``name`` (shell text ``program``) installed in the system tier, allowed to
    agent ``ci`` in both layers of P-6."""
    manifest = tool_manifest(scratch / "src", name, program)
    done = subprocess.run([CTX, "object", "install", "--storage", str(storage), str(manifest),
                           "--tier", "system"], capture_output=True, text=True,
                          env=clean_env())  # fmt: skip
    assert done.returncode == 0, done
    rule = f"allow {LABEL} tool:{name} execute\n"
    for policy in (storage / "tool" / f"{name}.d" / "policy", storage / "agent" / "ci.d/policy"):
        with open(policy, "a") as out:
            out.write(rule)


# ------------------------------------------------------------------------------ the queue


# Reads ``ctx queue show --json`` on stdin: the job, its lease's pid and the holder's state.
SHOW_HOLDER = """import json, sys
d = json.load(sys.stdin)
print(d["name"], d["lease"]["pid"], d["holder"]["state"])"""

WORKER_LOOP = r"""
set -euo pipefail
{
    ctx queue publish -p "$P" --name from-heredoc - <<'EOF'
{"tool": "fs.stat", "input": {"path": "/"}, "via": "heredoc"}
EOF
    ctx queue publish -p "$P" --name from-herestring - <<< '{"tool": "fs.stat", "input": {}}'
    ctx queue publish -p "$P" --name from-procsub <(printf '{"tool": "fs.stat", "input": {}}')
    printf '%s\n' "$OUT"/req-*.json | xargs -P 2 -n 1 ctx queue publish -p "$P"
    ctx queue publish -p "$P" --batch - <<'EOF'
{"tool": "fs.stat", "input": {"n": 1}}
EOF
} > "$OUT/published"
echo "$$" > "$OUT/script"
while J=$(ctx queue claim -p "$P" --worker shloop); do
    printf '%s\n' "$J" >> "$OUT/claimed"
    # The first claim's holder, as show judges it while the script runs; every job's result
    # names its holder too.
    [ -e "$OUT/holders" ] \
        || ctx queue show -p "$P" "$J" --json | python3 -c "$SHOW" > "$OUT/holders"
    (
        printf '{"job": "%s", "by": %s}' "$J" "$BASHPID" \
            | ctx queue finish -p "$P" "$J" --ok - > /dev/null
    )
done
rc=0
ctx queue claim -p "$P" > "$OUT/last" || rc=$?
echo "$rc" > "$OUT/rc"
"""


def test_a_set_euo_pipefail_worker_loop_drains_what_every_kind_of_input_published(
    queue: QueueCLI, scratch: Path
) -> None:
    """§2.4, Q-1, Q-3, I-4, README *The queue in five commands*: a ``bash -euo pipefail``
    script publishes from a heredoc, a here-string, a process substitution (``/dev/fd/N``, a
    pipe), two files through ``xargs -P 2`` and a ``--batch`` heredoc; each publish prints the
    job name alone.  Its ``while J=$(ctx queue claim …)`` loop gets exactly a job name on stdout
    each time, the lease names the script itself (the parent of the claim) as a live holder,
    a subshell finishes the job, and the loop ends when claim exits 3 with nothing on stdout:
    every job done once with the output the subshell gave, the queue consistent."""
    for n in range(2):
        (scratch / f"req-{n}.json").write_text(json.dumps({**FS_STAT, "n": n}))
    ran = bash(WORKER_LOOP, shell_env(queue, scratch, SHOW=SHOW_HOLDER))
    assert ran.returncode == 0, ran
    no_traceback(ran.stderr)
    published = (scratch / "published").read_text().splitlines()
    assert len(published) == 6 and len(set(published)) == 6, published
    assert {"from-heredoc.req.json", "from-herestring.req.json", "from-procsub.req.json"} <= set(
        published
    )
    claimed = (scratch / "claimed").read_text().splitlines()
    assert sorted(claimed) == sorted(published), (claimed, published)  # each exactly once
    script = int((scratch / "script").read_text())
    holder = (scratch / "holders").read_text().split()
    assert holder == [claimed[0], str(script), "alive"], holder
    assert ((scratch / "rc").read_text().strip(), (scratch / "last").read_text()) == ("3", "")
    for job in claimed:
        state, res = queue.only_result(job)
        assert state == "done" and res["output"]["job"] == job, res
        # Finished from a subshell: the result names the holder, the script, not the subshell.
        assert res["worker"]["pid"] == script and res["output"]["by"] != script, res
        assert res["worker"]["id"] == "shloop", res
    heredoc = json.loads((queue.dir / "done" / "from-heredoc.req.json").read_text())
    assert heredoc["via"] == "heredoc" and heredoc["tool"] == "fs.stat", heredoc
    queue.assert_settled()


SHARED_LOOP = r"""
set -u
work() {
    me=$BASHPID
    while J=$(ctx queue claim -p "$P" --worker "w$1"); do
        echo "$J $me" >> "$OUT/claims-$1"
        printf '{"by": %s}' "$me" | ctx queue finish -p "$P" "$J" --ok - > /dev/null \
            || echo "finish $J failed" >> "$OUT/problems"
    done
    echo "$?" > "$OUT/end-$1"
}
work 1 & work 2 & work 3 &
wait
"""


def test_background_shell_workers_share_the_queue_and_each_subshell_holds_its_own_claims(
    queue: QueueCLI, scratch: Path
) -> None:
    """§2.4, I-4, W-3: three ``work &`` functions of one script (three subshells) claim in a
    loop on one queue.  Each job is claimed by exactly one of them, its lease and result name
    the subshell that claimed it (the claim's parent, which goes on working), and every loop
    ends on exit 3 with nothing lost or left claimed."""
    jobs = [queue.publish(dict(FS_STAT, n=n), name=f"bg-{n}") for n in range(5)]
    ran = bash(SHARED_LOOP, shell_env(queue, scratch))
    assert ran.returncode == 0, ran
    no_traceback(ran.stderr)
    assert not (scratch / "problems").exists(), (scratch / "problems").read_text()
    claims: dict[str, int] = {}
    for n in (1, 2, 3):
        log = scratch / f"claims-{n}"
        for line in log.read_text().splitlines() if log.exists() else []:
            job, pid = line.split()
            assert job not in claims, (job, "claimed twice")
            claims[job] = int(pid)
    assert sorted(claims) == sorted(jobs), claims
    for job, pid in claims.items():
        state, res = queue.only_result(job)
        assert state == "done" and res["worker"]["pid"] == pid == res["output"]["by"], res
    queue.assert_settled()


RENEWER = r"""
set -u
J=$(ctx queue claim -p "$P" --ttl 1)
echo "$J" > "$OUT/job"
# A loop in the background is a subshell: it renews on behalf of the script with --pid $$.
( while sleep 0.2; do ctx queue renew -p "$P" "$J" --pid $$ --ttl 5 > /dev/null || exit; done ) &
renewer=$!
echo "$renewer" > "$OUT/renewer"
# The same without --pid: the subshell is not the holder.
(
    ctx queue renew -p "$P" "$J" --ttl 600 > "$OUT/stray.out" 2> "$OUT/stray.err"
    echo $? > "$OUT/stray.rc"
)
until [ -e "$OUT/go" ]; do sleep 0.05; done
printf '{"renewed": true}' | ctx queue finish -p "$P" "$J" --ok - > /dev/null
echo $? > "$OUT/finish.rc"
wait "$renewer"
echo $? > "$OUT/renewer.rc"
"""


def test_a_background_renewal_loop_keeps_a_short_lease_past_its_first_expiry(
    queue: QueueCLI, scratch: Path
) -> None:
    """§2.4, Q-3, Q-5, docs/queue.md (renew "only for the process that holds it"; ``--pid``):
    a script claims with ``--ttl 1`` and renews from a background loop with ``--pid $$``
    (``--ttl 5``).
    Past the first expiry the job is still claimed by the script, recover leaves it alone; the
    same renew from a subshell without ``--pid`` is refused (EACCES, exit 1, nothing on stdout,
    the lease unchanged), saying that ``--pid`` names the holder.  The script finishes the job,
    and the loop's next renew ends the loop (the lease is gone), so nothing is left running or
    claimed."""
    job = queue.publish(name="renewed")
    proc = subprocess.Popen(["bash", "-c", RENEWER], env=shell_env(queue, scratch),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert wait_for(lambda: (scratch / "stray.rc").exists(), 30), proc.poll()
        assert (scratch / "job").read_text().strip() == job
        first = queue.lease(job)
        assert first["pid"] == proc.pid, first
        first_expiry = datetime.fromisoformat(first["expires_at"])
        # Not the 600 s the stray renew asked for: that one changed nothing.
        assert (first_expiry - datetime.now(UTC)).total_seconds() < 10, first
        assert (scratch / "stray.rc").read_text().strip() == "1"
        assert (scratch / "stray.out").read_text() == ""
        stray = (scratch / "stray.err").read_text()
        assert "EACCES" in stray and "name the holder with --pid" in stray, stray
        # Wait until the lease the claim took has run out, then look: renewed, still ours.
        assert wait_for(lambda: datetime.now(UTC) > first_expiry, 30)
        assert wait_for(
            lambda: datetime.fromisoformat(queue.lease(job)["expires_at"]) > first_expiry, 30
        )
        r = queue.run("recover", "--json")
        assert r.rc == 0 and r.json()["requeued"] == [], r
        lease = queue.lease(job)
        assert lease["pid"] == proc.pid and "renewed_at" in lease, lease
        assert queue.state(job) == "claimed"
        (scratch / "go").touch()
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        renewer = scratch / "renewer"
        if renewer.exists():
            subprocess.run(["kill", "-9", renewer.read_text().strip()], capture_output=True)
    assert proc.returncode == 0, err
    assert (scratch / "finish.rc").read_text().strip() == "0"
    assert (scratch / "renewer.rc").read_text().strip() == "1"  # renew of a finished job
    state, res = queue.only_result(job)
    assert state == "done" and res["output"] == {"renewed": True}, res
    queue.assert_settled()


STOPS_EARLY = r"""
set -e
J=$(ctx queue claim -p "$P")
echo "$J" > "$OUT/stopped-job"
false                     # the job's work fails; set -e ends the script here
ctx queue finish -p "$P" "$J" --ok
"""

TRAPPED = r"""
set -e
J=$(ctx queue claim -p "$P")
echo "$J" > "$OUT/trapped-job"
trap 'printf "{\"why\": \"exit %s\"}" "$?" \
    | ctx queue finish -p "$P" "$J" --error - > /dev/null' EXIT
false
"""


def test_a_set_e_script_that_stops_mid_job_leaves_it_for_recover_or_fails_it_in_its_trap(
    queue: QueueCLI, scratch: Path
) -> None:
    """§2.4, Q-5, I-1: a ``set -e`` script that claims a job and stops on an error leaves the
    job claimed under a lease whose holder (the script) is gone: ``show`` says so, and recover
    requeues it once.  The same script with an EXIT trap finishes the job it claims in
    ``failed/`` with the reason it gave, and the one job left is claimed next: no job is lost,
    run twice or left half-done."""
    stopped = queue.publish(name="stopped")
    trapped = queue.publish(name="trapped")
    env = shell_env(queue, scratch)
    ran = bash(STOPS_EARLY, env)
    assert ran.returncode == 1 and ran.stdout == "", ran
    no_traceback(ran.stderr)
    assert (scratch / "stopped-job").read_text().strip() == stopped
    shown = queue.run("show", stopped, "--json")
    assert shown.rc == 0 and shown.json()["holder"]["state"] == "gone", shown
    r = queue.run("recover", "--json")
    assert r.rc == 0 and [e["job"] for e in r.json()["requeued"]] == [stopped], r
    assert queue.state(stopped) == "pending"

    ran = bash(TRAPPED, env)
    assert ran.returncode == 1 and ran.stdout == "", ran
    no_traceback(ran.stderr)
    failed = (scratch / "trapped-job").read_text().strip()
    assert failed in (stopped, trapped), failed
    state, res = queue.only_result(failed)
    assert state == "failed" and res["output"] == {"why": "exit 1"}, res
    other = trapped if failed == stopped else stopped
    assert queue.claim("--pid", str(os.getpid())) == other  # the one job left, once
    queue.finish(other)
    queue.assert_settled()


# Each: a command line, its documented exit status, and the errno its error must name.
ERRORS = [
    ("ctx queue claim -p nosuch", 1, "ENOENT"),
    ('ctx queue claim -p "$P" --ttl 0', 2, "EINVAL"),
    ('ctx queue claim -p "$P"', 3, ""),
    (
        'ctx queue publish -p "$P" --name taken - <<< \'{"tool": "fs.stat", "input": {}}\'',
        1,
        "EEXIST",
    ),
    ('ctx queue publish -p "$P" - < /dev/null', 1, "EINVAL"),
    ('ctx queue publish -p "$P" - <&-', 1, "EBADF"),
    ('ctx queue finish -p "$P" taken --ok', 1, "EEXIST"),
    ('ctx queue renew -p "$P" taken', 1, "ENOENT"),
    ("ctx queue bogus", 2, "EINVAL"),
]
# Read by ``python3`` from a ``--json`` pipeline: the error name of the one object on its
# stdin, or an empty line when there is nothing to read.
READER = """import json, sys
text = sys.stdin.read()
print(json.loads(text)["error"] if text else "")"""


def set_e_sweep(errors: list[tuple[str, int, str]]) -> str:
    """One script running each command of ``errors`` (N from 1) in a ``set -e`` subshell,
    its status in ``$OUT/rc.N`` and its output in ``out.N`` and ``err.N``; then, where the
    command line takes ``--json`` (no redirection of its own), once more with ``--json``
    through ``python3 -c "$READER"`` under ``pipefail``: ``jrc.N`` and ``json.N``."""
    lines = []
    for n, (command, _status, _errno) in enumerate(errors, start=1):
        lines.append(f'( set -e; {command}; echo AFTER ) > "$OUT/out.{n}" 2> "$OUT/err.{n}" '
                     f'< /dev/null; echo $? > "$OUT/rc.{n}"')  # fmt: skip
        if "<" not in command and "bogus" not in command:
            lines.append(f'( set -o pipefail; {command} --json | python3 -c "$READER" ) '
                         f'> "$OUT/json.{n}" 2> /dev/null < /dev/null; '
                         f'echo $? > "$OUT/jrc.{n}"')  # fmt: skip
    return "\n".join(lines) + "\n"


def test_each_error_ends_a_set_e_script_with_its_documented_status_and_an_empty_stdout(
    queue: QueueCLI, scratch: Path
) -> None:
    """§2.4 (0 success, 1 refused, 2 usage, 3 nothing to claim), README (errors read
    ``ctx: ERRNO: …`` on stderr; with ``--json`` one error object on stdout, usage errors
    included): in a ``set -e`` subshell each failing command ends it with its own status and
    prints nothing on stdout; with ``--json`` under ``pipefail`` stdout is one error object a
    ``python3`` reader parses (nothing at all for claim's exit 3); nothing was changed."""
    taken = queue.publish(dict(FS_STAT), name="taken")
    assert queue.claim("--pid", str(os.getpid())) == taken
    queue.finish(taken)
    before = snapshot(queue.dir)
    ran = bash(set_e_sweep(ERRORS), shell_env(queue, scratch, READER=READER), timeout=120)
    assert ran.returncode == 0, ran
    problems = []
    for n, (command, status, errno_name) in enumerate(ERRORS, start=1):
        rc = int((scratch / f"rc.{n}").read_text())
        out = (scratch / f"out.{n}").read_text()
        err = (scratch / f"err.{n}").read_text()
        if (rc, out) != (status, "") or errno_name not in err or "Traceback" in err:
            problems.append((command, rc, out, err[-300:]))
        if (scratch / f"jrc.{n}").exists():
            answer = (int((scratch / f"jrc.{n}").read_text()), (scratch / f"json.{n}").read_text())
            if answer != (status, errno_name + "\n"):
                problems.append((command, "--json", answer))
    assert problems == []
    assert snapshot(queue.dir) == before


JSON_PIPELINE = r"""
set -euo pipefail
parse() { python3 -c "import json, sys; d = json.load(sys.stdin); print($1)"; }
J=$(ctx queue claim -p "$P" --pid $$ --json \
    | parse 'd["name"], d["request"]["tool"], d["lease"]["pid"]')
echo "claim $J"
read -r name _ _ <<< "$J"
ctx queue status -p "$P" --json | parse '"status", d["pending"], d["claimed"]'
ctx queue list -p "$P" --state claimed --json | parse '"list", [e["name"] for e in d]'
ctx queue show -p "$P" "$name" --json | parse '"show", d["state"], d["holder"]["state"]'
ctx queue renew -p "$P" "$name" --json | parse '"renew", sorted(d)'
ctx queue finish -p "$P" "$name" --ok --json < /dev/null | parse '"finish", sorted(d)'
ctx queue recover -p "$P" --json | parse '"recover", d["consistent"]'
"""


def test_every_json_answer_is_one_document_a_python_pipeline_reads_whole(
    queue: QueueCLI, scratch: Path
) -> None:
    """§2.4 (``--json`` gives machine-readable output on stdout; ``claim`` one object with at
    least ``name`` and ``request``), README: ``ctx … --json | python3 -c 'json.load(…)'``
    under ``pipefail`` reads one whole document from claim (``--pid $$``, as docs/queue.md
    says of a claim in a pipeline: the lease names the script), status, list, show, renew,
    finish and recover; no note on stdout breaks the parse."""
    job = queue.publish(dict(FS_STAT), name="piped")
    queue.publish(dict(FS_STAT), name="waiting")
    proc = subprocess.Popen(["bash", "-c", JSON_PIPELINE], env=shell_env(queue, scratch),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, (out, err)
    no_traceback(err)
    lines = out.splitlines()
    assert lines[0] == f"claim {job} fs.stat {proc.pid}", lines
    assert lines[1] == "status 1 1", lines
    assert lines[2] == f"list ['{job}']", lines
    assert lines[3] == "show claimed alive", lines
    assert lines[4].startswith("renew [") and lines[5].startswith("finish ["), lines
    assert lines[6] == "recover True", lines
    assert queue.only_result(job)[0] == "done"
    assert queue.state("waiting.req.json") == "pending"


# ------------------------------------------------------------------------------ odd starts


def test_ctx_started_from_root_or_a_removed_directory_under_env_i_works_on_a_given_root(
    queue: QueueCLI, scratch: Path
) -> None:
    """R-1, §2.4, D-1: with ``env -i`` (only PATH, or nothing at all) and the current directory
    ``/`` (a CTX_STORAGE relative to ``/``) or a directory removed under the script (an
    absolute ``--storage``), publish, claim and finish work and claim's stdout is the job
    name; ``ctx man tool | head -1`` gives the page's title and ``ctx --help | grep`` finds
    the queue command; a relative ``--storage`` in the removed directory is refused (ENOENT,
    exit 1, naming why), never a traceback."""
    relative = str(queue.storage).lstrip("/")
    script = r"""
set -u
publish() { printf '{"tool": "fs.stat", "input": {}}' | "$@" queue publish -p proj -; }
cd /
J1=$(env -i PATH=/usr/bin:/bin CTX_STORAGE="$REL" "$CTX" queue publish -p proj --name at-root \
     - <<< '{"tool": "fs.stat", "input": {}}')
C1=$(env -i CTX_STORAGE="$REL" "$CTX" queue claim -p proj)
env -i CTX_STORAGE="$REL" "$CTX" queue finish -p proj "$C1" --ok < /dev/null > /dev/null
echo "root $J1 $C1 $?"
mkdir "$OUT/gone" && cd "$OUT/gone" && rmdir "$OUT/gone"
J2=$(publish env -i "$CTX" --storage "$ABS")
C2=$(env -i "$CTX" --storage "$ABS" queue claim -p proj)
env -i "$CTX" --storage "$ABS" queue finish -p proj "$C2" --ok < /dev/null > /dev/null
echo "gone $J2 $C2 $?"
env -i PATH=/usr/bin:/bin "$CTX" --storage "$ABS" man tool | head -1
env -i "$CTX" --help | grep -c 'queue'
env -i "$CTX" --storage . queue status -p proj
echo "relative $?"
"""
    env = clean_env(CTX=CTX, REL=relative, ABS=str(queue.storage), OUT=str(scratch))
    ran = bash(script, env, cwd=scratch)
    no_traceback(ran.stderr)
    lines = ran.stdout.splitlines()
    assert lines[0] == "root at-root.req.json at-root.req.json 0", ran
    gone = lines[1].split()
    assert gone[0] == "gone" and gone[1] == gone[2] and gone[3] == "0", ran
    assert gone[1].startswith("job-") and gone[1].endswith(".req.json"), ran
    assert lines[2].startswith("# ctx.tool"), ran
    assert int(lines[3]) >= 1, ran
    assert lines[4] == "relative 1", ran
    assert "ctx: ENOENT: --storage . is relative" in ran.stderr, ran
    for job in (lines[0].split()[1], gone[1]):
        assert queue.only_result(job)[0] == "done"
    queue.assert_settled()


# ------------------------------------------------------------------------------ ctx run


@needs_root
def test_ctx_run_in_a_pipeline_passes_standard_streams_through_and_141_back(
    queue: QueueCLI, agent: str, scratch: Path
) -> None:
    """T-3, docs/tools.md *Terminal CLI mode* ("stdin, stdout and stderr are the caller's";
    "``ctx run`` exits with the tool's status"): a tool reading stdin and writing stdout, in
    the middle of a pipeline fed by a here-string and a slow writer, passes the bytes through
    (``ctx run`` itself prints nothing on stdout); a tool that writes for ever, read by
    ``head -1``, ends as the shell would end it: ``ctx run`` exits 141, nothing on stderr."""
    install_tool(queue.storage, scratch, "t.upper", "#!/bin/sh\nexec tr a-z A-Z\n")
    install_tool(queue.storage, scratch, "t.loud", "#!/bin/sh\nwhile :; do echo loud; done\n")
    script = r"""
ctx run --agent ci t.upper <<< 'from a here-string' | tr ' ' '_'
{ echo first; sleep 0.3; echo second; } | ctx run --agent ci t.upper | sed 's/^/> /'
ctx run --agent ci t.loud | head -1
echo "loud=${PIPESTATUS[0]}"
"""
    ran = bash(script, shell_env(queue, scratch), timeout=60)
    assert ran.stdout.splitlines() == [
        "FROM_A_HERE-STRING",
        "> FIRST",
        "> SECOND",
        "loud",
        "loud=141",
    ], ran
    assert ran.stderr == "", ran


@needs_root
def test_a_shell_exec_command_whose_reader_left_ends_as_sh_ends_it(
    queue: QueueCLI, agent: str, scratch: Path
) -> None:
    """T-2, T-3, docs/tools.md (shell.exec: "The tool then *becomes* the shell … its exit
    status the call's"; ``ctx run`` "exits with the tool's status"), README (141 "when the
    reader of the output left"): ``ctx run --agent ci shell.exec '{"cmd": "yes"}' | head -1``
    must end as ``sh -c yes | head -1`` does and as a tool of one's own does (previous test):
    exit 141, nothing on stderr.  Inside a job, ``yes | head -n 1`` must leave the result's
    stderr empty, as it does in any shell."""
    script = r"""
sh -c yes | head -1; echo "sh=${PIPESTATUS[0]}"
ctx run --agent ci shell.exec '{"cmd": "yes"}' | head -1; echo "ctx=${PIPESTATUS[0]}"
"""
    ran = bash(script, shell_env(queue, scratch), timeout=60)
    native = subprocess.run(
        [CTX, "run", "--agent", AGENT, "--native", "shell.exec"],
        input=json.dumps({"cmd": "yes | head -n 1"}), capture_output=True, text=True,
        env=shell_env(queue, scratch), timeout=60,
    )  # fmt: skip
    frame = json.loads(native.stdout.splitlines()[-1])
    assert (frame["status"], frame["output"]) == ("ok", "y\n"), frame
    assert (ran.stdout.splitlines(), ran.stderr, frame["stderr"]) == (
        ["y", "sh=141", "y", "ctx=141"],
        "",
        "",
    )


@needs_root
def test_a_job_whose_shell_loop_pipes_into_head_ends_with_head(
    queue: QueueCLI, agent: str, scratch: Path
) -> None:
    """T-2, W-1, W-4: a job's command ``while :; do echo y; done 2> /dev/null | head -n 1``
    ends in any shell as soon as ``head`` has its line (SIGPIPE ends the loop; ``bash -c``
    of the same line ends at once).  Run by shell.exec with a 1 s timeout, it must be ``ok``
    with output ``y``, not killed at its timeout; a worker's job would hang the same way."""
    native = subprocess.run(
        [CTX, "run", "--agent", AGENT, "--native", "--timeout", "1", "shell.exec"],
        input=json.dumps({"cmd": "while :; do echo y; done 2> /dev/null | head -n 1"}),
        capture_output=True, text=True, env=shell_env(queue, scratch), timeout=60,
    )  # fmt: skip
    frame = json.loads(native.stdout.splitlines()[-1])
    assert (frame["status"], frame["output"], frame["error"]) == ("ok", "y\n", None), frame
    assert native.returncode == 0, native.stderr[-500:]


NESTED = r"""
set -euo pipefail
ctx queue init -p proj > /dev/null
printf '%s' '{"name": "nest", "label": "nest_t", "tools": ["shell.exec", "fs.stat"]}' \
    | ctx agent create - > /dev/null
for tool in shell.exec fs.stat; do
    echo "allow nest_t tool:$tool execute" >> "$CTX_STORAGE/tool/$tool.d/policy"
done
ctx run --agent nest shell.exec "$PUBLISHES" > "$OUT/publishes.out"
ctx run --agent nest shell.exec "$RUNS" > "$OUT/runs.out"
ctx queue publish -p proj --name parent - <<< "$PARENT" > /dev/null
ctx queue work -p proj --agent nest --drain --json > "$OUT/work.jsonl"
"""


def test_tools_that_publish_a_job_or_run_another_tool_from_their_own_program(
    scratch: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """T-2, T-3, W-1, W-2, §2.4, docs/queue.md (``publish`` fills ``from`` with ``$CTX_AGENT``),
    docs/tools.md (the owner of a storage root runs its agents, under its own uid): a user's
    agent runs shell.exec whose command calls ``ctx`` itself, with ``--storage`` since a tool
    gets no CTX_STORAGE.  A nested ``publish`` prints the job name through the outer call's
    stdout and records the agent as ``from``; a nested ``ctx run`` of another tool prints its
    answer and both calls are recorded in the session; a job whose tool publishes a child job
    is drained by one ``ctx queue work --drain``, the child included, each job once."""
    user = unprivileged_user
    home = scratch / "user"
    home.mkdir()
    os.chown(home, user.uid, user.gid)
    root = home / "storage"
    child = {"tool": "shell.exec", "input": {"cmd": "echo child-ran"}}
    stat_ctx = {"tool": "fs.stat", "input": {"path": "/ctx"}}
    nested_publish = (
        f"printf '%s' {shlex.quote(json.dumps(stat_ctx))} "
        f"| {CTX} --storage {root} queue publish -p proj --name nested -"
    )
    nested_run = f"{CTX} --storage {root} run --agent nest fs.stat /ctx; echo nested=$?"
    publishes_child = (
        f"printf '%s' {shlex.quote(json.dumps(child))} "
        f"| {CTX} --storage {root} queue publish -p proj --name child -"
    )
    env = clean_env(
        PATH=f"{BIN}:{SYSTEM_PATH}",
        HOME=str(home),
        CTX_STORAGE=str(root),
        OUT=str(home),
        PUBLISHES=json.dumps({"cmd": nested_publish}),
        RUNS=json.dumps({"cmd": nested_run}),
        PARENT=json.dumps({"tool": "shell.exec", "input": {"cmd": publishes_child}}),
    )
    ran = run_as(user, ["bash", "-c", NESTED], env=env, cwd=home)
    assert ran.returncode == 0, ran
    no_traceback(ran.stderr)
    queue = QueueCLI(root, "proj")

    assert (home / "publishes.out").read_text() == "nested.req.json\n"
    state, res = queue.only_result("nested.req.json")
    nested = json.loads((queue.dir / state / "nested.req.json").read_text())
    assert nested["from"] == "nest" and nested["input"] == stat_ctx["input"], nested

    runs = (home / "runs.out").read_text()
    assert "path: /ctx" in runs and runs.endswith("nested=0\n"), runs
    session = root / "home" / str(user.uid) / "agent" / "nest" / "session" / "default"
    events = [json.loads(line) for line in (session / "events.jsonl").read_text().splitlines()]
    results = [(e["object"], e["status"]) for e in events if e["type"] == "tool_result"]
    assert ("tool/fs.stat", "ok") in results, results
    assert results.count(("tool/shell.exec", "ok")) == 2, results

    finished = [
        (e["job"], e["state"])
        for e in map(json.loads, (home / "work.jsonl").read_text().splitlines())
        if e.get("event") == "finish"
    ]
    assert sorted(finished) == [
        ("child.req.json", "done"),
        ("nested.req.json", "done"),
        ("parent.req.json", "done"),
    ], finished
    state, res = queue.only_result("child.req.json")
    assert res["output"] == "child-ran\n", res
    assert json.loads((queue.dir / "done" / "child.req.json").read_text())["from"] == "nest"


@needs_root
def test_a_shell_exec_command_past_its_file_size_limit_ends_as_sh_ends_it(
    queue: QueueCLI, agent: str, scratch: Path
) -> None:
    """T-2, T-3 (docs/tools.md: shell.exec's command gets SIGXFSZ at its default, as a shell
    gives it): a write past ``ulimit -f`` ends the writer with SIGXFSZ, so ``ulimit -f 1;
    yes > f`` reports 153 (128 + 25) to the shell around it, as ``sh -c`` does."""
    command = "ulimit -f 1; yes > big; echo status=$?"
    direct = subprocess.run(["sh", "-c", command], cwd=scratch, capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    native = subprocess.run(
        [CTX, "run", "--agent", AGENT, "--native", "shell.exec"],
        input=json.dumps({"cmd": command}), capture_output=True, text=True,
        env=shell_env(queue, scratch), timeout=60,
    )  # fmt: skip
    frame = json.loads(native.stdout.splitlines()[-1])
    assert direct.stdout == "status=153\n", direct
    assert (frame["status"], frame["output"]) == ("ok", "status=153\n"), frame
