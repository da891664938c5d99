"""Where the storage root is (SPEC R-1) and what ``ctx bootstrap`` says when it cannot be made."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cortexfs.queue.claim_order import hint_path
from cortexfs.storage import SYSTEM_DEFAULT_ROOT, default_root
from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import UnprivilegedUser, find_or_create_user
from tests.support.users import unprivileged_user as unprivileged_user

TAIL = Path("cortexfs/storage/current")


def test_root_s_default_is_the_system_root() -> None:
    assert default_root(0, {"HOME": "/home/x", "XDG_DATA_HOME": "/d"}) == SYSTEM_DEFAULT_ROOT


def test_an_absolute_xdg_data_home_holds_the_root() -> None:
    assert default_root(4242, {"HOME": "/home/x", "XDG_DATA_HOME": "/data"}) == "/data" / TAIL


@pytest.mark.parametrize("data_home", ["", "relative", "./here", "~/data"])
def test_a_relative_or_empty_xdg_data_home_is_ignored(data_home: str) -> None:
    """The XDG base directory specification: a relative path there is invalid and ignored."""
    found = default_root(4242, {"HOME": "/home/x", "XDG_DATA_HOME": data_home})

    assert found == Path("/home/x/.local/share") / TAIL


@pytest.mark.parametrize("home", [None, "", "relative"])
def test_without_an_absolute_home_the_password_database_names_it(home: str | None) -> None:
    environ = {} if home is None else {"HOME": home}

    found = default_root(4242, environ)

    assert found.is_absolute(), found
    try:
        expected = Path(pwd.getpwuid(4242).pw_dir) / ".local/share" / TAIL
    except KeyError:
        expected = Path("/.local/share") / TAIL
    assert found == expected


@pytest.mark.parametrize("cache_home", ["", "relative", "./here"])
def test_the_claim_order_hint_never_lands_in_the_current_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cache_home: str
) -> None:
    """A relative XDG_CACHE_HOME is ignored, as a relative XDG_DATA_HOME is: the hint is this
    user's cache file, not one made wherever ctx was started."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", cache_home)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    hint = hint_path(tmp_path / "queue")

    assert hint.is_absolute(), hint
    if os.geteuid() == 0:
        assert hint.is_relative_to("/var/cache/cortexfs"), hint
    else:
        assert hint.is_relative_to(tmp_path / "home" / ".cache" / "cortexfs"), hint


def test_an_absolute_xdg_cache_home_holds_the_hint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    assert hint_path(tmp_path / "queue").is_relative_to(tmp_path / "cache" / "cortexfs")


def test_a_user_s_missing_data_home_is_made_private(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """The XDG base directory specification: a missing ~/.local/share (and ~/.local) is made
    mode 0700; the storage root below it is made as any other."""
    home = traversable_tmp / "home"
    home.mkdir()
    os.chown(home, unprivileged_user.uid, unprivileged_user.gid)

    made = subprocess.run(
        [sys.executable, "-m", "cortexfs", "bootstrap"],
        user=unprivileged_user.uid,
        group=unprivileged_user.gid,
        extra_groups=[],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home)},
        cwd=home,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert made.returncode == 0, made.stderr
    modes = {
        name: stat.S_IMODE(os.stat(home / name).st_mode)
        for name in (".local", ".local/share", ".local/share/cortexfs/storage/current")
    }
    assert modes == {
        ".local": 0o700,
        ".local/share": 0o700,
        ".local/share/cortexfs/storage/current": 0o755,
    }


@pytest.mark.parametrize("how", ["--storage", "CTX_STORAGE"])
def test_a_relative_root_from_a_removed_directory_is_named_in_the_refusal(
    tmp_path: Path, how: str
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    env = {**os.environ, "CTX_STORAGE": "rel"} if how == "CTX_STORAGE" else os.environ
    args = ["--storage", "rel"] if how == "--storage" else []
    script = (
        "import os, sys; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]); "
        "from cortexfs.cli import main; sys.argv = ['ctx', *sys.argv[2:]]; main()"
    )

    done = subprocess.run(
        [sys.executable, "-c", script, str(gone), *args, "queue", "status", "--project", "p"],
        capture_output=True,
        text=True,
        env=env,
    )

    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr == (
        f"ctx: ENOENT: {how} rel is relative, and the current directory no longer exists; "
        "give an absolute path, or change to a directory that exists\n"
    )


@pytest.mark.parametrize("option", ["--queue", "--project"])
def test_a_relative_queue_path_from_a_removed_directory_is_named_in_the_refusal(
    tmp_path: Path, option: str
) -> None:
    """As for a relative root: getcwd's bare "No such file or directory" names nothing."""
    gone = tmp_path / "gone"
    gone.mkdir()
    script = (
        "import os, sys; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]); "
        "from cortexfs.cli import main; sys.argv = ['ctx', *sys.argv[2:]]; main()"
    )
    command = ["queue", "status", "--storage", str(tmp_path / "root"), option, "q/queue"]

    done = subprocess.run(
        [sys.executable, "-c", script, str(gone), *command], capture_output=True, text=True
    )

    if option == "--project":  # a relative project path must name an existing queue
        assert done.returncode == 2 and "is neither a project name" in done.stderr
        return
    assert (done.returncode, done.stderr) == (
        1,
        f"ctx: ENOENT: {option} q/queue is relative, and the current directory no longer "
        "exists; give an absolute path, or change to a directory that exists\n",
    )


@pytest.mark.parametrize("command", [["mount", "mnt"], ["umount", "mnt"]])
def test_any_relative_path_from_a_removed_directory_is_refused_with_the_reason(
    tmp_path: Path, command: list[str]
) -> None:
    """Where no command names the path itself, the refusal still says what went wrong, not
    getcwd's bare "No such file or directory"."""
    gone = tmp_path / "gone"
    gone.mkdir()
    script = (
        "import os, sys; os.chdir(sys.argv[1]); os.rmdir(sys.argv[1]); "
        "from cortexfs.cli import main; sys.argv = ['ctx', *sys.argv[2:]]; main()"
    )
    root = ["--storage", str(tmp_path / "root")]
    subprocess.run([sys.executable, "-m", "cortexfs", *root, "bootstrap"], check=True)

    done = subprocess.run(
        [sys.executable, "-c", script, str(gone), *root, *command], capture_output=True, text=True
    )

    assert (done.returncode, done.stderr) == (
        1,
        "ctx: ENOENT: the current directory no longer exists, and a relative path given is "
        "read against it; give absolute paths, or change to a directory that exists\n",
    )


@pytest.mark.parametrize("command", [["bootstrap"], ["queue", "init", "--project", "p"]])
def test_an_empty_ctx_storage_is_refused_rather_than_read_as_unset(
    traversable_tmp: Path, command: list[str]
) -> None:
    """An empty CTX_STORAGE is most often a variable that failed to expand: falling back to the
    default root (for root, the system's) would act on a root nobody named, so it is EINVAL,
    as an empty --storage is.  Run as a user, whose default root is below XDG_DATA_HOME."""
    xdg = traversable_tmp / "xdg"
    env = {**os.environ, "CTX_STORAGE": "", "XDG_DATA_HOME": str(xdg)}
    credentials: dict[str, object] = {}
    if os.geteuid() == 0:
        user = find_or_create_user()
        credentials = {"user": user.uid, "group": user.gid, "extra_groups": []}

    done = subprocess.run(
        [str(Path(sys.executable).with_name("ctx")), *command],
        capture_output=True,
        text=True,
        env=env,
        **credentials,  # type: ignore[call-overload]
    )

    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("ctx: EINVAL: CTX_STORAGE is set but empty"), done.stderr
    assert not xdg.exists()


def _ctx(*args: str | Path) -> subprocess.CompletedProcess[str]:
    ctx = str(Path(sys.executable).with_name("ctx"))
    return subprocess.run([ctx, *map(str, args)], capture_output=True, text=True)


def test_a_root_named_by_a_loop_of_links_is_eloop_saying_so(tmp_path: Path) -> None:
    loop = tmp_path / "current"
    loop.symlink_to("current")

    done = _ctx("--storage", loop, "queue", "status", "--project", "p")

    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        f"ctx: ELOOP: storage root {loop} is a symbolic link to current that the kernel will "
        "not follow (the links lead round in a loop); point the link at the storage root, or "
        "name another root (--storage DIR or CTX_STORAGE)\n"
    )


def test_bootstrap_makes_a_new_root_in_a_directory_reached_through_a_link(tmp_path: Path) -> None:
    """R-1, R-5: the administrator's path to a root may pass through links (``/srv/ctx ->
    /data/ctx``); bootstrap follows them as every command does."""
    (tmp_path / "data").mkdir()
    (tmp_path / "srv").symlink_to("data")

    made = _ctx("--storage", tmp_path / "srv" / "deeper" / "st", "bootstrap")

    assert made.returncode == 0, made.stderr
    assert (tmp_path / "data" / "deeper" / "st" / "tool").is_dir()
    init = _ctx("--storage", tmp_path / "srv" / "deeper" / "st", "queue", "init", "-p", "p")
    assert init.returncode == 0, init.stderr
