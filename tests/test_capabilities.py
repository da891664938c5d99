"""What a root that holds only part of root's capabilities is told it lacks
(cortexfs.capabilities; the commands that ask are tested in
tests/acceptance/test_acceptance_flows_root_with_fewer_capabilities.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cortexfs import capabilities

REPO = Path(__file__).resolve().parent.parent


pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv"
)

ASK = (
    "from cortexfs import capabilities as c\n"
    "print(c.lacking(c.CAP_SETUID, c.CAP_SETGID, c.CAP_CHOWN, c.CAP_FSETID))\n"
    "c.require('giving a directory away', c.CAP_CHOWN)\n"
)


def asked_without(*dropped: str) -> subprocess.CompletedProcess[str]:
    bounding = ",".join(f"-{name}" for name in dropped)
    argv = ["setpriv", "--bounding-set", bounding, "--inh-caps", "-all", "--ambient-caps", "-all"]
    return subprocess.run(
        [*argv, sys.executable, "-c", ASK], capture_output=True, text=True, cwd=REPO, timeout=60
    )


def test_a_full_root_lacks_nothing() -> None:
    assert capabilities.lacking(capabilities.CAP_SETUID, capabilities.CAP_CHOWN) == []
    capabilities.require("anything", capabilities.CAP_SETUID)


def test_a_root_without_some_is_told_which_and_refused_with_eperm() -> None:
    asked = asked_without("setuid", "chown")

    assert asked.stdout == "['CAP_SETUID', 'CAP_CHOWN']\n", asked
    assert asked.returncode != 0
    assert "CtxError: EPERM: giving a directory away needs CAP_CHOWN" in asked.stderr, asked.stderr


def test_a_process_that_is_not_root_is_never_refused_on_their_account() -> None:
    argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    asked = subprocess.run(
        [*argv, sys.executable, "-c", ASK], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert (asked.returncode, asked.stdout) == (0, "[]\n"), asked


def test_root_acting_for_a_while_as_another_uid_holds_its_capabilities_again() -> None:
    """The kernel clears the effective set when the effective uid leaves 0 and gives it back
    on the return: a set first read while acting as another uid is not root's afterwards."""
    acting = (
        "import os\n"
        "from cortexfs import capabilities as c\n"
        "os.seteuid(65534)\n"
        "print(c.lacking(c.CAP_CHOWN))\n"
        "os.seteuid(0)\n"
        "print(c.lacking(c.CAP_CHOWN))\n"
    )
    asked = subprocess.run(
        [sys.executable, "-c", acting], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert (asked.returncode, asked.stdout) == (0, "[]\n[]\n"), asked
