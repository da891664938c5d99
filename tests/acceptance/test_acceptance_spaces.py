"""Acceptance tests of §9 (shared spaces, X-1 and X-2), §12 (the manual bundle, D-1) and §13
(``ctx mount``, F-1), run against the installed ``ctx``: the layout a space gets, who the
kernel lets into it, the pages ``ctx man`` prints and ``ctx bootstrap`` rebuilds, and what a
FUSE mount of the storage root shows, refuses and keeps."""

from __future__ import annotations

import contextlib
import errno
import grp
import json
import os
import shutil
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    MAN_PAGES,
    MOUNT_WAIT,
    QUEUE_SUBDIRS,
    REPO,
    ROOT_ENTRIES,
    clean_env,
    ctx_mount,
    ctx_run,
    mounted_at,
    needs_fuse_as_root,
    request,
    snapshot,
    write_durably,
)
from tests.support.storage import traversable_tmp as traversable_tmp
from tests.support.users import UnprivilegedUser, access_as, run_as
from tests.support.users import unprivileged_user as unprivileged_user

SPACE_PARTS = {"tool", "data", "queue", "agent"}
DOCS_SPEC = REPO / "docs" / "spec"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")


def env_for(storage: Path) -> dict[str, str]:
    return clean_env(CTX_STORAGE=str(storage))


def other_group(user: UnprivilegedUser) -> grp.struct_group:
    """A group the test user is not in by default: the one a space is given in these tests."""
    for name in ("users", "staff", "adm", "daemon"):
        with contextlib.suppress(KeyError):
            group = grp.getgrnam(name)
            if group.gr_gid not in (0, user.gid) and user.name not in group.gr_mem:
                return group
    pytest.skip("no system group to give a space")


def make_space(storage: Path, name: str, *args: str) -> None:
    made = ctx_run("shared", "create", name, *args, env=env_for(storage))
    assert made.rc == 0, made


# ------------------------------------------------------------------ the space's layout


def test_x1_shared_create_makes_tool_data_queue_and_agent(storage: Path) -> None:
    """X-1: ``shared/<name>/`` holds ``tool/``, ``data/``, ``queue/`` (with the six queue
    directories of §2) and ``agent/``."""
    make_space(storage, "project-a")
    space = storage / "shared" / "project-a"
    assert space.is_dir() and not space.is_symlink()
    assert set(os.listdir(space)) >= SPACE_PARTS
    for part in SPACE_PARTS:
        assert (space / part).is_dir() and not (space / part).is_symlink(), part
    assert set(os.listdir(space / "queue")) >= QUEUE_SUBDIRS
    # a space is made under shared/, never at the root.
    assert set(os.listdir(storage)) == ROOT_ENTRIES


def test_x1_shared_create_again_keeps_what_members_made(storage: Path) -> None:
    """X-1: "advanced agents just create ordinary files": creating the space again neither
    fails nor touches the files made in it."""
    make_space(storage, "project-a")
    note = storage / "shared" / "project-a" / "data" / "notes.txt"
    note.write_text("plan\n")
    make_space(storage, "project-a")
    assert note.read_text() == "plan\n"


def test_x1_the_space_queue_is_usable_by_ctx_queue(storage: Path) -> None:
    """X-1 with §2: the space's ``queue/`` is the project queue ``ctx queue --project`` uses."""
    make_space(storage, "project-a")
    env = env_for(storage)
    published = ctx_run("queue", "publish", "--project", "project-a", "--name", "a", "-",
                        input=json.dumps(request()), env=env)  # fmt: skip
    assert published.rc == 0, published
    assert os.listdir(storage / "shared" / "project-a" / "queue" / "pending") == ["a.req.json"]


@pytest.mark.parametrize("name", ["9", "x" * 64, "a.b_c-1"])
def test_x1_every_legal_object_name_makes_a_space(storage: Path, name: str) -> None:
    """X-1 with R-3: a space name is any object name, 1 to 64 bytes of [A-Za-z0-9._-]."""
    make_space(storage, name)
    assert (storage / "shared" / name / "data").is_dir()


@pytest.mark.parametrize("name", ["../escape", ".hidden", "tools.d", "x" * 65, "sp ace"])
def test_x1_an_illegal_space_name_is_einval(storage: Path, name: str) -> None:
    """R-3 for shared spaces: an illegal name is rejected with EINVAL and nothing is made."""
    before = snapshot(storage)
    refused = ctx_run("shared", "create", name, env=env_for(storage))
    assert refused.rc != 0, refused
    assert "EINVAL" in refused.err, refused
    assert snapshot(storage) == before


@needs_root
def test_x1_space_directories_belong_to_its_group_and_are_setgid(
    storage: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """X-1, a Linux-permission shared space: every directory of the space is the space's group
    and setgid, so what is made inside, by anyone, belongs to that group."""
    group = other_group(unprivileged_user)
    make_space(storage, "project-a", "--group", group.gr_name)
    space = storage / "shared" / "project-a"
    directories = [space, *(space / p for p in SPACE_PARTS)]
    directories += [space / "queue" / sub for sub in QUEUE_SUBDIRS]
    for directory in directories:
        info = directory.lstat()
        assert info.st_gid == group.gr_gid, directory
        assert info.st_mode & stat.S_ISGID, f"{directory} is not setgid"
    made = space / "data" / "made-by-root"
    made.write_text("x")
    assert made.stat().st_gid == group.gr_gid
    (space / "data" / "sub").mkdir()
    assert (space / "data" / "sub").stat().st_gid == group.gr_gid


@needs_root
def test_x1_shared_create_takes_the_group_by_gid_too(
    storage: Path, unprivileged_user: UnprivilegedUser
) -> None:
    group = other_group(unprivileged_user)
    make_space(storage, "project-b", "--group", str(group.gr_gid))
    assert (storage / "shared" / "project-b" / "data").stat().st_gid == group.gr_gid


@needs_root
def test_x1_members_share_data_and_others_do_not_see_in(
    traversable_tmp: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """X-1 visibility by uid/gid and directory permissions: a member of the space's group
    reads and writes ``data/`` and what it makes keeps the space's group; a uid outside the
    group can neither list the space nor write in it."""
    storage = traversable_tmp / "storage"
    assert ctx_run("bootstrap", "--storage", storage).rc == 0
    group = other_group(unprivileged_user)
    make_space(storage, "project-a", "--group", group.gr_name)
    space = storage / "shared" / "project-a"
    data = space / "data"

    outsider = access_as(unprivileged_user, [(str(space), "r"), (str(data), "w")])
    assert outsider == [False, False]
    listing = run_as(unprivileged_user, ["ls", str(space)])
    assert listing.returncode != 0

    member = access_as(unprivileged_user, [(str(space), "rx"), (str(data), "rwx")], [group.gr_gid])
    assert member == [True, True]
    wrote = run_as(unprivileged_user, ["sh", "-c", f"echo hi > {data}/from-member"],
                   [group.gr_gid])  # fmt: skip
    assert wrote.returncode == 0, wrote.stderr
    made = (data / "from-member").stat()
    assert made.st_uid == unprivileged_user.uid
    assert made.st_gid == group.gr_gid


# ------------------------------------------------------------------ the manual bundle space


def test_x2_cortexfs_docs_is_not_a_space_anyone_creates(storage: Path) -> None:
    """X-2: ``shared/cortexfs-docs/`` is the system-maintained manual bundle, not a space made
    with ``ctx shared create``; asking for it changes nothing in the bundle."""
    docs = storage / "shared" / "cortexfs-docs"
    before = snapshot(docs)
    refused = ctx_run("shared", "create", "cortexfs-docs", env=env_for(storage))
    assert refused.rc != 0, refused
    assert snapshot(docs) == before
    assert not (docs / "queue").exists() and not (docs / "data").exists()


def test_x2_bootstrap_makes_the_bundle_under_shared(storage: Path) -> None:
    """X-2 and R-5: bootstrap installs the bundle at ``shared/cortexfs-docs/``."""
    docs = storage / "shared" / "cortexfs-docs"
    assert (docs / "README.md").is_file()
    assert {f.name for f in (docs / "man").iterdir()} >= set(MAN_PAGES.values())


# ------------------------------------------------------------------ D-1: pages, ctx man, rebuild


def installed_page(storage: Path, page: str) -> Path:
    bundle = storage / "shared" / "cortexfs-docs"
    return bundle / "README.md" if page == "README.md" else bundle / "man" / page


def overwrite(path: Path, text: str) -> None:
    """Change an installed page (it is read-only) the way an old install or an editor would."""
    path.chmod(0o644)
    path.write_text(text)


def test_d1_the_bundle_mirrors_docs_spec(storage: Path) -> None:
    """D-1: ``README.md`` and ``man/ctx.*.md`` mirror ``docs/spec/*.md`` of this version."""
    for page in [*MAN_PAGES.values(), "README.md"]:
        source = DOCS_SPEC / page
        assert source.is_file(), source
        assert installed_page(storage, page).read_bytes() == source.read_bytes(), page


def test_d1_installed_pages_are_read_only_documents(storage: Path) -> None:
    """D-1: "Manuals are read-only documents": no installed page is writable by anyone."""
    for page in [*MAN_PAGES.values(), "README.md"]:
        mode = installed_page(storage, page).lstat().st_mode
        assert stat.S_ISREG(mode)
        assert not mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH), (page, oct(mode))


@pytest.mark.parametrize("topic", sorted(MAN_PAGES))
def test_d1_ctx_man_topic_alias_prints_its_page(storage: Path, topic: str) -> None:
    """D-1: ``agent``, ``model``, … are CLI aliases of ``ctx.agent.md``, …; ``ctx man`` prints
    the page, the same under the alias and under the page's file name."""
    page = MAN_PAGES[topic]
    by_alias = ctx_run("man", topic, env=env_for(storage))
    assert by_alias.rc == 0, by_alias
    assert by_alias.out == (DOCS_SPEC / page).read_text()
    by_file_name = ctx_run("man", page, env=env_for(storage))
    assert by_file_name.rc == 0, by_file_name
    assert by_file_name.out == by_alias.out


def test_d1_ctx_man_reads_the_installed_file(storage: Path) -> None:
    """D-1: "``ctx man TOPIC`` reads the installed file", not only a copy inside ctx."""
    overwrite(installed_page(storage, "ctx.model.md"), "# locally edited model page\n")
    shown = ctx_run("man", "model", env=env_for(storage))
    assert shown.rc == 0, shown
    assert "locally edited model page" in shown.out


def test_d1_ctx_man_honours_the_storage_option(storage: Path) -> None:
    """D-1 with R-1: the installed file is the one of the storage root ``--storage`` names."""
    overwrite(installed_page(storage, "ctx.session.md"), "# session page of this root\n")
    shown = ctx_run("man", "--storage", storage, "session")
    assert shown.rc == 0, shown
    assert "session page of this root" in shown.out


def test_d1_ctx_man_falls_back_to_the_built_in_copy(storage: Path) -> None:
    """D-1: without an installed bundle ``ctx man`` falls back to a built-in copy."""
    bundle = storage / "shared" / "cortexfs-docs"
    for path in bundle.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    shutil.rmtree(bundle)
    for topic, page in MAN_PAGES.items():
        shown = ctx_run("man", topic, env=env_for(storage))
        assert shown.rc == 0, shown
        assert shown.out == (DOCS_SPEC / page).read_text(), topic
    assert not bundle.exists(), "reading a manual must not write the bundle"


def test_d1_ctx_man_works_without_any_storage_root(tmp_path: Path) -> None:
    """D-1: the built-in copy serves where no storage root exists at all."""
    shown = ctx_run("man", "--storage", tmp_path / "missing", "agent")
    assert shown.rc == 0, shown
    assert shown.out == (DOCS_SPEC / "ctx.agent.md").read_text()
    assert not (tmp_path / "missing").exists()


def test_d1_ctx_man_of_an_unknown_topic_fails(storage: Path) -> None:
    """D-1 names the topics; another is no page (a failure, not an empty success)."""
    shown = ctx_run("man", "no-such-topic", env=env_for(storage))
    assert shown.rc != 0, shown
    assert shown.out == ""


def test_d1_a_stale_bundle_is_rebuilt_by_bootstrap(storage: Path) -> None:
    """D-1: "A stale bundle is rebuilt by ``ctx bootstrap``": an edited page is replaced, a
    missing one restored, the README too."""
    overwrite(installed_page(storage, "ctx.tool.md"), "# stale tool page\n")
    overwrite(installed_page(storage, "README.md"), "# stale readme\n")
    installed_page(storage, "ctx.provider.md").unlink()
    rebuilt = ctx_run("bootstrap", "--storage", storage)
    assert rebuilt.rc == 0, rebuilt
    for page in [*MAN_PAGES.values(), "README.md"]:
        assert installed_page(storage, page).read_bytes() == (DOCS_SPEC / page).read_bytes()
    shown = ctx_run("man", "tool", env=env_for(storage))
    assert shown.out == (DOCS_SPEC / "ctx.tool.md").read_text()


def test_d1_bootstrap_from_a_source_tree_rebuilds_the_bundle(storage: Path, tmp_path: Path) -> None:
    """D-1: ``ctx bootstrap SOURCE`` rebuilds a stale bundle from a source tree of the matching
    version (its ``docs/spec/*.md``)."""
    source = tmp_path / "cortexfs-src"
    shutil.copytree(DOCS_SPEC, source / "docs" / "spec")
    shutil.copy(REPO / "pyproject.toml", source / "pyproject.toml")
    for tree in (source, REPO):
        overwrite(installed_page(storage, "ctx.agent.md"), "# stale agent page\n")
        rebuilt = ctx_run("bootstrap", "--storage", storage, tree)
        assert rebuilt.rc == 0, rebuilt
        assert (
            installed_page(storage, "ctx.agent.md").read_bytes()
            == (DOCS_SPEC / "ctx.agent.md").read_bytes()
        )


def test_d1_bootstrap_leaves_user_data_beside_the_bundle(storage: Path) -> None:
    """D-1 with R-5: rebuilding the bundle never destroys user data elsewhere in shared/."""
    make_space(storage, "project-a")
    keep = storage / "shared" / "project-a" / "data" / "keep.txt"
    keep.write_text("mine")
    overwrite(installed_page(storage, "ctx.model.md"), "# stale\n")
    assert ctx_run("bootstrap", "--storage", storage).rc == 0
    assert keep.read_text() == "mine"


# ------------------------------------------------------------------ F-1: ctx mount


def wait_exit(proc: subprocess.Popen) -> int:
    proc.wait(timeout=MOUNT_WAIT)
    return proc.returncode


@needs_fuse_as_root
def test_f1_mount_shows_the_root_abi(storage: Path, tmp_path: Path) -> None:
    """F-1: ``ctx mount MOUNTPOINT`` mounts the storage root as the root ABI (R-2)."""
    with ctx_mount(storage, tmp_path / "ctx") as _:
        view = tmp_path / "ctx"
        assert set(os.listdir(view)) == ROOT_ENTRIES
        assert (view / "tool" / "fs.read").is_file()
        assert os.access(view / "tool" / "fs.read", os.X_OK)
        page = view / "shared" / "cortexfs-docs" / "man" / "ctx.agent.md"
        assert page.read_bytes() == (DOCS_SPEC / "ctx.agent.md").read_bytes()


@needs_fuse_as_root
def test_f1_ctx_umount_unmounts_and_the_mount_process_exits(storage: Path, tmp_path: Path) -> None:
    """F-1: ``ctx umount`` unmounts cleanly; the mount process ends with it."""
    with ctx_mount(storage, tmp_path / "ctx") as proc:
        done = ctx_run("umount", tmp_path / "ctx")
        assert done.rc == 0, done
        assert wait_exit(proc) == 0
        assert not mounted_at(tmp_path / "ctx")
        assert os.listdir(tmp_path / "ctx") == []


@needs_fuse_as_root
def test_f1_sigterm_unmounts_cleanly(storage: Path, tmp_path: Path) -> None:
    """F-1: SIGTERM to ``ctx mount`` unmounts cleanly: no mount left behind, no dead
    endpoint (ENOTCONN), the process exits normally."""
    with ctx_mount(storage, tmp_path / "ctx") as proc:
        proc.send_signal(signal.SIGTERM)
        assert wait_exit(proc) == 0
        assert not mounted_at(tmp_path / "ctx")
        os.listdir(tmp_path / "ctx")  # no "Transport endpoint is not connected"


@needs_fuse_as_root
def test_f1_writes_through_the_mount_are_durable_after_fsync(storage: Path, tmp_path: Path) -> None:
    """F-1: a write through the mount, once ``fsync`` returns, is the write of the file behind
    it; a rename through the mount is there too once the directory is fsynced."""
    make_space(storage, "project-a")
    with ctx_mount(storage, tmp_path / "ctx"):
        data = tmp_path / "ctx" / "shared" / "project-a" / "data"
        write_durably(data, "final.txt", b"durable through the mount\n")
        behind = storage / "shared" / "project-a" / "data"
        assert (behind / "final.txt").read_bytes() == b"durable through the mount\n"
        assert not (behind / "tmp.part").exists()


@needs_fuse_as_root
def test_f1_the_queue_works_through_the_mount(storage: Path, tmp_path: Path) -> None:
    """F-1 with §2: the queue protocol (no-replace moves, fsync) runs through the mount and
    leaves the same evidence on the storage root."""
    view = tmp_path / "ctx"
    with ctx_mount(storage, view):
        env = clean_env(CTX_STORAGE=str(view))
        published = ctx_run("queue", "publish", "--project", "proj", "--name", "a", "-",
                            input=json.dumps(request()), env=env)  # fmt: skip
        assert published.rc == 0, published
        again = ctx_run("queue", "publish", "--project", "proj", "--name", "a", "-",
                        input=json.dumps(request()), env=env)  # fmt: skip
        assert again.rc == 1, again
        claimed = ctx_run("queue", "claim", "--project", "proj", env=env)
        assert claimed.rc == 0 and claimed.out.strip() == "a.req.json", claimed
        finished = ctx_run("queue", "finish", "--project", "proj", "a.req.json", "--ok", "-",
                           input="{}", env=env)  # fmt: skip
        assert finished.rc == 0, finished
    done = storage / "shared" / "proj" / "queue" / "done"
    assert sorted(os.listdir(done)) == ["a.req.json", "a.req.json.result"]


@needs_fuse_as_root
def test_f1_a_missing_agent_mounts_nothing(storage: Path, tmp_path: Path) -> None:
    """F-1: ``--as AGENT`` shows AGENT's view; for no such agent there is no view to show."""
    mountpoint = tmp_path / "ctx"
    mountpoint.mkdir()
    refused = ctx_run("mount", "--storage", storage, "--as", "nobody-here", mountpoint,
                      timeout=MOUNT_WAIT)  # fmt: skip
    assert refused.rc != 0, refused
    assert not mounted_at(mountpoint)


def tool_policy_allows(storage: Path, tool: str, label: str) -> None:
    """P-6: the tool's own policy must allow the label too (installing grants nothing)."""
    policy = storage / "tool" / f"{tool}.d" / "policy"
    text = policy.read_text()
    rule = f"allow {label} tool:{tool} execute"
    if rule not in text.splitlines():
        policy.chmod(policy.stat().st_mode | stat.S_IWUSR)
        policy.write_text(text + rule + "\n")


@pytest.fixture
def agent_root(traversable_tmp: Path, unprivileged_user: UnprivilegedUser) -> Path:
    """A storage root every uid may reach, with spaces ``proj`` (the agent's group), ``other``,
    and agents ``coder`` (fs.read; shared proj read+write) and ``reader`` (shared proj read),
    both running as the test user."""
    storage = traversable_tmp / "storage"
    assert ctx_run("bootstrap", "--storage", storage).rc == 0
    make_space(storage, "proj", "--group", str(unprivileged_user.gid))
    make_space(storage, "other")
    agents = {
        "coder": {"tools": ["fs.read"], "shared": {"proj": ["read", "write"]}},
        "reader": {"tools": [], "shared": {"proj": ["read"]}},
    }
    for name, grants in agents.items():
        req = {"name": name, "label": f"{name}_t", **grants}
        made = ctx_run("agent", "create", "--user", str(unprivileged_user.uid), "-",
                       input=json.dumps(req), env=env_for(storage))  # fmt: skip
        assert made.rc == 0, made
    tool_policy_allows(storage, "fs.read", "coder_t")
    (storage / "shared" / "proj" / "data" / "plan.txt").write_text("the plan\n")
    (storage / "shared" / "other" / "data" / "secret.txt").write_text("not yours\n")
    return storage


@needs_fuse_as_root
def test_f1_an_agent_view_lists_only_what_its_authority_lets_it_see(
    agent_root: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """F-1 and T-5: ``--as AGENT`` is the filtered projection: only tools the whole chain lets
    it execute, only the spaces its policy lets it read (X-1 visibility by policy v0), only its
    own agent entry; a hidden name cannot be reached (reads and executes are checked)."""
    view = agent_root.parent / "view"
    with ctx_mount(agent_root, view, "--as", "coder"):
        assert set(os.listdir(view)) <= ROOT_ENTRIES
        tools = set(os.listdir(view / "tool"))
        assert "fs.read" in tools
        assert not tools & {"fs.write", "shell.exec", "fs.write.d", "shell.exec.d"}
        spaces = set(os.listdir(view / "shared"))
        assert "proj" in spaces and "other" not in spaces
        assert "reader" not in os.listdir(view / "agent")
        assert (view / "shared" / "proj" / "data" / "plan.txt").read_text() == "the plan\n"
        with pytest.raises(FileNotFoundError):
            (view / "shared" / "other" / "data" / "secret.txt").read_text()
        with pytest.raises(FileNotFoundError):
            os.stat(view / "tool" / "shell.exec")
        with pytest.raises(FileNotFoundError):
            subprocess.run([str(view / "tool" / "fs.write")], capture_output=True, check=False)


@needs_fuse_as_root
def test_f1_an_agent_view_creates_no_persistent_file(agent_root: Path) -> None:
    """F-1: "no persistent file is created as a side effect" of building the agent's view and
    of authorising what it looks at."""
    before = snapshot(agent_root)
    view = agent_root.parent / "view"
    with ctx_mount(agent_root, view, "--as", "coder"):
        for top, _dirs, files in os.walk(view):
            for name in files:
                with contextlib.suppress(OSError):
                    Path(top, name).read_bytes()
        os.listdir(view / "home")
        with contextlib.suppress(OSError):
            os.stat(view / "shared" / "other")
    assert snapshot(agent_root) == before


@needs_fuse_as_root
def test_f1_an_agent_view_writes_only_where_policy_allows(agent_root: Path) -> None:
    """F-1: writes are checked with the same chain: ``shared:proj write`` lets coder write in
    the space (and the file lands on the storage root, with the space's group), reader's
    ``shared:proj read`` does not; neither may write the manual bundle, which grants nothing."""
    proj = agent_root / "shared" / "proj"
    view = agent_root.parent / "view"
    with ctx_mount(agent_root, view, "--as", "coder"):
        target = view / "shared" / "proj" / "data" / "from-coder.txt"
        target.write_text("coder was here\n")
        assert (proj / "data" / "from-coder.txt").read_text() == "coder was here\n"
        assert (proj / "data" / "from-coder.txt").stat().st_gid == proj.stat().st_gid
        with pytest.raises(OSError):
            (view / "shared" / "cortexfs-docs" / "note.md").write_text("x")
        with pytest.raises(OSError):
            (view / "tool" / "fs.read").write_text("replaced")
    view2 = agent_root.parent / "view2"
    with ctx_mount(agent_root, view2, "--as", "reader"):
        assert (view2 / "shared" / "proj" / "data" / "plan.txt").read_text() == "the plan\n"
        with pytest.raises(OSError) as refused:
            (view2 / "shared" / "proj" / "data" / "from-reader.txt").write_text("x")
        assert refused.value.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
        assert "cortexfs-docs" in os.listdir(view2 / "shared")
    assert not (proj / "data" / "from-reader.txt").exists()
    assert not (agent_root / "shared" / "cortexfs-docs" / "note.md").exists()
    assert "replaced" not in (agent_root / "tool" / "fs.read").read_text(errors="replace")


@needs_root
def test_x1_an_agent_records_its_sessions_in_the_space(agent_root: Path) -> None:
    """X-1: a space holds ``agent/<agent>/session/<session>/``; S-1: each with
    ``events.jsonl``.  A call recorded in the space (``ctx run --project``) lands there."""
    read = json.dumps({"path": "/ctx/shared/proj/data/plan.txt"})
    called = ctx_run("run", "--agent", "coder", "--project", "proj", "--session", "review",
                     "--native", "fs.read", input=read, env=env_for(agent_root))  # fmt: skip
    assert called.rc == 0, called
    session = agent_root / "shared" / "proj" / "agent" / "coder" / "session" / "review"
    assert session.is_dir()
    events = [json.loads(line) for line in (session / "events.jsonl").read_text().splitlines()]
    assert events, "the call left no event in the space's session"
    assert (session.stat().st_gid, (session / "events.jsonl").stat().st_gid) == (
        (agent_root / "shared" / "proj").stat().st_gid,
    ) * 2


@needs_fuse_as_root
def test_x1_a_space_the_agents_uid_may_not_enter_is_not_in_its_view(agent_root: Path) -> None:
    """X-1: visibility is decided by the agent's uid/gid, label, mount file, *directory
    permissions* and policy v0 together; F-1: "only objects that pass the effective authority
    check are listed" and "reads ... are checked with the same chain" (P-5 step 2: Linux mode
    bits).  ``other`` is root's group, mode 3770: its policy grant alone does not show it."""
    policy = agent_root / "agent" / "coder.d" / "policy"
    policy.chmod(0o644)
    policy.write_text(policy.read_text() + "allow coder_t shared:other read\n")
    view = agent_root.parent / "view"
    with ctx_mount(agent_root, view, "--as", "coder"):
        assert "other" not in os.listdir(view / "shared")
        with pytest.raises(OSError):
            (view / "shared" / "other" / "data" / "secret.txt").read_text()


@needs_fuse_as_root
def test_x1_a_link_in_a_spaces_place_is_not_in_the_view(agent_root: Path) -> None:
    """F-1: only what passes the effective authority check is listed, and the chain follows no
    symbolic link (P-5 step 2): a link named like a space the policy grants, to a directory
    every uid may enter, is no space of the view."""
    policy = agent_root / "agent" / "coder.d" / "policy"
    policy.chmod(0o644)
    policy.write_text(policy.read_text() + "allow coder_t shared:elsewhere read\n")
    outside = agent_root.parent / "outside"
    (outside / "data").mkdir(parents=True)
    outside.chmod(0o755)
    (agent_root / "shared" / "elsewhere").symlink_to(outside)
    view = agent_root.parent / "view"
    with ctx_mount(agent_root, view, "--as", "coder"):
        assert "elsewhere" not in os.listdir(view / "shared")
        assert "proj" in os.listdir(view / "shared")


@needs_fuse_as_root
def test_x1_a_space_seen_only_through_an_ungranted_mount_is_not_in_the_view(
    agent_root: Path,
) -> None:
    """X-1: visibility depends on the agent's *mount file* too (P-5 step 3, mount
    visibility): with ``allow coder_t mount:ctx read`` taken out of its policy, the storage
    root is no mount it may use, so no space of it passes the effective authority check."""
    policy = agent_root / "agent" / "coder.d" / "policy"
    policy.chmod(0o644)
    kept = [line for line in policy.read_text().splitlines() if "mount:" not in line]
    policy.write_text("\n".join(kept) + "\n")
    view = agent_root.parent / "view"
    with ctx_mount(agent_root, view, "--as", "coder"):
        assert "fs.read" not in os.listdir(view / "tool")  # the chain already says so
        assert "proj" not in os.listdir(view / "shared")


def test_d1_a_rebuilt_bundle_holds_no_page_of_another_version(storage: Path) -> None:
    """D-1: ``man/ctx.*.md`` mirror ``docs/spec/*.md``; a stale bundle is rebuilt by
    ``ctx bootstrap`` (the design text: a stale tree is rebuilt from the tree of the matching
    version). A page an older release installed and this one dropped is stale content."""
    old_page = storage / "shared" / "cortexfs-docs" / "man" / "ctx.legacy.md"
    old_page.write_text("# ctx.legacy — a page of an older release\n")
    old_page.chmod(0o444)
    assert ctx_run("bootstrap", "--storage", storage).rc == 0
    mirrored = {p.name for p in DOCS_SPEC.glob("*.md")} - {"README.md"}
    assert {p.name for p in old_page.parent.glob("*.md")} == mirrored
