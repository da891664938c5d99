"""End-to-end flows of the manual bundle's life (SPEC §12 D-1, X-2, R-5; docs/tools.md "ctx
bootstrap" and ``ctx man``; the bundle's own README): a fresh root's read-only
``shared/cortexfs-docs/``, read with ``ctx man`` under each alias; the bundle gone stale in
many ways at once and what ``ctx bootstrap`` and ``ctx bootstrap SOURCE`` report and rebuild,
never following a link, with nothing left to do on the next run; ``ctx man`` falling back to
the built-in copy, saying why; the bundle refused as a space; and an agent reading the manual
through ``ctx run`` and its mounted view, never writing it."""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    MAN_PAGES,
    REPO,
    clean_env,
    ctx_mount,
    ctx_run,
    needs_fuse_as_root,
)

SPEC_PAGES = REPO / "docs" / "spec"
BUNDLE = Path("shared") / "cortexfs-docs"
# topic -> the bundle's file, README first, as ``ctx man`` lists them
PAGES = {"README": "README.md", **{topic: f"man/{page}" for topic, page in MAN_PAGES.items()}}
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid (nobody)")


def on(root: Path) -> dict[str, str]:
    return clean_env(CTX_STORAGE=str(root))


def built_in(rel: str) -> bytes:
    """This version's page: the built-in copy, the same bytes as ``docs/spec/``."""
    return (SPEC_PAGES / Path(rel).name).read_bytes()


def man_json(root: Path, topic: str) -> tuple[dict, str]:
    shown = ctx_run("man", topic, "--json", env=on(root))
    assert shown.rc == 0, shown
    return shown.json(), shown.err


def bundle_state(root: Path) -> dict[str, tuple[str, int, int, bytes | str | None]]:
    """Every entry of the bundle: kind, mode, owner and content (a link's target)."""
    bundle = root / BUNDLE
    found = {}
    for path in [bundle, *sorted(bundle.rglob("*"))]:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            kind, data = "link", os.readlink(path)
        elif stat.S_ISDIR(st.st_mode):
            kind, data = "dir", None
        elif stat.S_ISREG(st.st_mode):
            kind, data = "file", path.read_bytes()
        else:
            kind, data = "other", None
        found[str(path.relative_to(root))] = (kind, stat.S_IMODE(st.st_mode), st.st_uid, data)
    return found


def this_versions_bundle(root: Path) -> None:
    """Every page is this version's, a regular file of mode 0444 in directories of 0755."""
    for rel in PAGES.values():
        page = root / BUNDLE / rel
        st = page.lstat()
        assert stat.S_ISREG(st.st_mode), rel
        assert stat.S_IMODE(st.st_mode) == 0o444, (rel, oct(st.st_mode))
        assert page.read_bytes() == built_in(rel), rel
    for rel in (BUNDLE, BUNDLE / "man"):
        st = (root / rel).lstat()
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o755, rel


def nothing_to_do(root: Path, *source: Path) -> None:
    again = ctx_run("bootstrap", *source, env=on(root))
    assert (again.rc, again.err) == (0, ""), again
    assert again.lines() == [f"storage root: {root}", "nothing to do: the storage root is complete"]


# --- 1. a fresh root ---------------------------------------------------------------------------


def test_a_fresh_root_under_umask_077_holds_a_read_only_bundle_ctx_man_reads_under_each_alias(
    tmp_path: Path,
) -> None:
    """R-5, X-2, D-1: ``ctx bootstrap`` run under ``umask 077`` creates the bundle (reported in
    ``created``) as exactly README.md and the seven pages, 0444 files in 0755 directories of
    the root's owner, this version's bytes; ``ctx man`` reads each installed page alike under
    its topic, ``ctx.TOPIC`` and ``ctx.TOPIC.md`` (``README``/``readme``/``README.md``), text
    and ``--json`` saying ``installed`` and where, with no note; an unknown topic is ENOENT."""
    root = tmp_path / "root"
    made = subprocess.run(
        ["sh", "-c", 'umask 077; exec "$@"', "sh", *CTX_ARGV, "bootstrap", "--json"],
        capture_output=True, text=True, env=on(root), timeout=60,
    )  # fmt: skip
    assert (made.returncode, made.stderr) == (0, ""), made
    report = json.loads(made.stdout)
    bundle_created = [e for e in report["created"] if e.startswith(str(BUNDLE))]
    assert bundle_created == [
        str(BUNDLE), f"{BUNDLE}/README.md", f"{BUNDLE}/man",
        *(f"{BUNDLE}/man/{page}" for page in MAN_PAGES.values()),
    ], report  # fmt: skip
    assert (report["problems"], report["warnings"]) == ([], []), report

    state = bundle_state(root)
    assert set(state) == {str(BUNDLE), f"{BUNDLE}/man"} | {f"{BUNDLE}/{r}" for r in PAGES.values()}
    assert {uid for _, _, uid, _ in state.values()} == {os.getuid()}
    this_versions_bundle(root)
    assert not any(mode & 0o333 for kind, mode, _, _ in state.values() if kind == "file")

    for topic, rel in PAGES.items():
        installed = (root / BUNDLE / rel).read_text()
        names = (
            ("README", "readme", "README.md")
            if topic == "README"
            else (topic, f"ctx.{topic}", f"ctx.{topic}.md")
        )
        for name in names:
            page, err = man_json(root, name)
            assert err == "", (name, err)
            assert page == {
                "topic": topic, "page": Path(rel).name, "summary": page["summary"],
                "origin": "installed", "path": str(root / BUNDLE / rel), "text": installed,
            }, name  # fmt: skip
            assert installed.startswith(f"# {page['summary']}\n"), page["summary"]
        printed = ctx_run("man", names[-1], env=on(root))
        assert (printed.rc, printed.out, printed.err) == (0, installed, ""), printed

    listing = ctx_run("man", env=on(root))
    assert listing.rc == 0 and len(listing.lines()) == len(PAGES), listing
    assert [line.split()[0] for line in listing.lines()] == list(PAGES)
    assert all(line.endswith("  [installed]") for line in listing.lines()), listing

    unknown = ctx_run("man", "ctx.legacy.md", env=on(root))
    assert (unknown.rc, unknown.out) == (1, ""), unknown
    assert unknown.err.startswith("ctx: ENOENT: ") and "root-abi" in unknown.err, unknown
    nothing_to_do(root)


# --- 2. a bundle gone stale in many ways -------------------------------------------------------


def test_a_bundle_stale_in_every_way_falls_back_to_built_in_then_is_rebuilt_never_via_a_link(
    storage: Path, tmp_path: Path
) -> None:
    """D-1, R-5, X-2: with a page edited, one loosened to 0644, one deleted, one a symlink to a
    private file, one not UTF-8, one a directory, the README a FIFO, an older release's page,
    notes and the bundle 0777, ``ctx man`` shows the edited page with a note and falls back to
    the built-in copy for the others saying why (``--json`` origin ``built-in``, path null);
    ``ctx bootstrap`` lists each repair, reports the directory as the one problem (exit 1),
    keeps the notes and never touches what the link named; once the directory is moved away,
    the next run writes the page and the one after has nothing to do."""
    bundle = storage / BUNDLE
    man = bundle / "man"
    private = tmp_path / "private.md"
    private.write_text("# not a page: someone's private file\n")
    private.chmod(0o600)
    for page in man.iterdir():
        page.chmod(0o644)
    (man / MAN_PAGES["tool"]).write_text(built_in("ctx.tool.md").decode() + "\nmy own note\n")
    (man / MAN_PAGES["model"]).chmod(0o644)  # the same bytes, another mode
    (man / MAN_PAGES["session"]).unlink()
    (man / MAN_PAGES["agent"]).unlink()
    (man / MAN_PAGES["agent"]).symlink_to(private)
    (man / MAN_PAGES["root-abi"]).write_bytes(b"# ctx.root-abi \xff\xfe latin-1 garbage\n")
    (man / MAN_PAGES["provider"]).unlink()
    (man / MAN_PAGES["provider"]).mkdir()
    (man / MAN_PAGES["provider"] / "draft.txt").write_text("a draft\n")
    (man / MAN_PAGES["coreutils"]).chmod(0o444)
    (bundle / "README.md").unlink()
    os.mkfifo(bundle / "README.md")
    (man / "ctx.legacy.md").write_text("# ctx.legacy: a page of an older release\n")
    (man / "notes.txt").write_text("kept\n")
    (bundle / "NOTES.txt").write_text("kept too\n")
    bundle.chmod(0o777)

    listing = ctx_run("man", "--json", env=on(storage), timeout=20)
    assert listing.rc == 0, listing
    origins = {entry["topic"]: (entry["origin"], entry["path"]) for entry in listing.json()}
    fell_back = {"README", "agent", "session", "root-abi", "provider"}
    assert origins == {
        topic: ("built-in", None) if topic in fell_back else ("installed", str(bundle / rel))
        for topic, rel in PAGES.items()
    }, origins
    why = {
        "README": f"{bundle / 'README.md'} is not a regular file",
        "agent": f"{man / MAN_PAGES['agent']} is a symbolic link, never followed",
        "session": f"no page is installed at {man / MAN_PAGES['session']}",
        "root-abi": f"{man / MAN_PAGES['root-abi']} is not UTF-8 text",
        "provider": f"{man / MAN_PAGES['provider']} is not a regular file",
    }
    for topic, reason in why.items():
        page, err = man_json(storage, topic)
        assert (page["origin"], page["path"]) == ("built-in", None), page
        assert page["text"] == built_in(PAGES[topic]).decode(), topic
        assert err.startswith(f"ctx man: {reason}") and err.rstrip().endswith(
            "this is the copy built into ctx"
        ), (topic, err)
    edited, err = man_json(storage, "tool")
    assert edited["origin"] == "installed" and edited["text"].endswith("\nmy own note\n")
    assert "is not the page of this version of ctx" in err and "ctx bootstrap" in err, err
    model, err = man_json(storage, "model")
    assert (model["origin"], err) == ("installed", ""), err  # its bytes are this version's
    assert private.read_text() == "# not a page: someone's private file\n"

    first = ctx_run("bootstrap", "--json", env=on(storage))
    assert first.rc == 1, first
    report = first.json()
    where = f"{BUNDLE}/man"
    assert report["created"] == [f"{where}/{MAN_PAGES['session']}"], report
    assert report["repaired"] == [
        f"{BUNDLE} (mode 0777, now 0755)",
        f"{BUNDLE}/README.md (it was a FIFO)",
        f"{where}/{MAN_PAGES['agent']} (it was a symbolic link)",
        f"{where}/{MAN_PAGES['tool']}",
        f"{where}/{MAN_PAGES['model']}",
        f"{where}/{MAN_PAGES['root-abi']}",
        f"{where}/ctx.legacy.md (removed: not a page of this version)",
    ], report
    assert report["problems"] == [
        f"{where}/{MAN_PAGES['provider']}: a directory, not a page; left untouched"
    ], report
    assert first.err.startswith("ctx: EEXIST: ") and MAN_PAGES["provider"] in first.err, first
    assert private.read_text() == "# not a page: someone's private file\n"
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert (man / MAN_PAGES["provider"] / "draft.txt").read_text() == "a draft\n"
    assert (man / "notes.txt").read_text() == "kept\n"
    assert (bundle / "NOTES.txt").read_text() == "kept too\n"
    assert not (man / "ctx.legacy.md").exists()
    still = ctx_run("bootstrap", env=on(storage))  # the problem stays until a person acts
    assert still.rc == 1 and still.lines()[1:] == [
        f"problem   {where}/{MAN_PAGES['provider']}: a directory, not a page; left untouched"
    ], still

    shutil.move(man / MAN_PAGES["provider"], tmp_path / "provider-drafts")
    second = ctx_run("bootstrap", "--json", env=on(storage))
    assert second.rc == 0, second
    assert {k: v for k, v in second.json().items() if k != "root"} == {
        "created": [f"{where}/{MAN_PAGES['provider']}"], "repaired": [], "problems": [],
        "warnings": [],
    }, second  # fmt: skip
    this_versions_bundle(storage)
    before = bundle_state(storage)
    nothing_to_do(storage)
    assert bundle_state(storage) == before
    for topic in PAGES:
        page, err = man_json(storage, topic)
        assert (page["origin"], err) == ("installed", ""), (topic, err)


# --- 3. ctx bootstrap SOURCE -------------------------------------------------------------------


def source_tree(where: Path, version: str | None) -> Path:
    """A source tree as the bundle's README describes one: the pages in ``docs/spec/``, and a
    ``pyproject.toml`` declaring ``version`` (none: the administrator's own pages)."""
    shutil.copytree(SPEC_PAGES, where / "docs" / "spec")
    if version is not None:
        declared = f'[project]\nname = "cortexfs"\nversion = "{version}"\n'
        (where / "pyproject.toml").write_text(declared)
    return where


def test_bootstrap_source_installs_an_administrators_pages_refuses_other_trees_and_runs_idempotent(
    storage: Path, tmp_path: Path
) -> None:
    """D-1, R-5: ``ctx bootstrap SOURCE`` refuses (EINVAL, exit 2, ``--json`` error object,
    nothing changed) a path that is no directory, a tree without the pages, the tree of
    another declared version and one declaring this version whose pages differ (named);
    an administrator's own tree (no pyproject.toml) is installed as it is, page by page
    (``repaired``), read by ``ctx man`` with its note, and a second run from it has nothing
    to do; the tree of this version, and then plain ``ctx bootstrap``, put this version's
    pages back and leave nothing to do."""
    asked = ctx_run("--version")
    assert asked.rc == 0 and asked.out.startswith("ctx, version "), asked
    version = asked.out.split()[-1]
    bundle = storage / BUNDLE
    before = bundle_state(storage)

    own = source_tree(tmp_path / "own", None)
    site_page = built_in("ctx.tool.md").decode() + "\nSite: ask ops.\n"
    (own / "docs/spec/ctx.tool.md").write_text(site_page)
    (own / "docs/spec/README.md").write_text(built_in("README.md").decode() + "\nSite README.\n")
    other = source_tree(tmp_path / "other", "9.9.9")
    differing = source_tree(tmp_path / "differing", version)
    (differing / "docs/spec/ctx.session.md").write_text("# ctx.session — an older page\n")
    lacking = source_tree(tmp_path / "lacking", None)
    (lacking / "docs/spec/ctx.provider.md").unlink()
    a_file = tmp_path / "a-file"
    a_file.write_text("not a tree\n")

    refusals = {
        tmp_path / "missing": ["missing", "does not exist"],
        a_file: ["a-file", "is a file"],
        lacking: ["ctx.provider.md"],
        other: ["9.9.9", version],
        differing: ["docs/spec/ctx.session.md differs"],
    }
    for source, named in refusals.items():
        refused = ctx_run("bootstrap", "--json", source, env=on(storage))
        assert refused.rc == 2, refused
        assert refused.err.splitlines()[-1].startswith("ctx: EINVAL: "), refused
        error = refused.json()
        assert (error["error"], error["errno"]) == ("EINVAL", 22), refused
        for word in named:
            assert word in error["message"], (word, refused)
        assert bundle_state(storage) == before, source

    installed = ctx_run("bootstrap", "--json", own, env=on(storage))
    assert installed.rc == 0, installed
    report = installed.json()
    assert (report["created"], report["problems"]) == ([], []), report
    assert report["repaired"] == [f"{BUNDLE}/README.md", f"{BUNDLE}/man/ctx.tool.md"], report
    assert (bundle / "man/ctx.tool.md").read_bytes() == (own / "docs/spec/ctx.tool.md").read_bytes()
    assert stat.S_IMODE((bundle / "man/ctx.tool.md").stat().st_mode) == 0o444
    page, err = man_json(storage, "tool")
    assert page["origin"] == "installed" and page["text"].endswith("\nSite: ask ops.\n"), page
    assert err.startswith(f"ctx man: note: {bundle / 'man/ctx.tool.md'} is not the page"), err
    nothing_to_do(storage, own)

    this = source_tree(tmp_path / "this", version)
    back = ctx_run("bootstrap", "--json", this, env=on(storage))
    assert back.rc == 0, back
    assert back.json()["repaired"] == [f"{BUNDLE}/README.md", f"{BUNDLE}/man/ctx.tool.md"], back
    this_versions_bundle(storage)
    nothing_to_do(storage, this)
    nothing_to_do(storage)
    assert bundle_state(storage) == before


# --- 4. never a space --------------------------------------------------------------------------


def test_the_bundle_is_refused_as_a_space_a_queue_and_a_tier_and_stays_as_it_is(
    storage: Path,
) -> None:
    """X-2, D-1, T-8 (docs/queue.md, docs/sessions.md, docs/tools.md): ``ctx queue init
    --project cortexfs-docs`` and ``ctx shared create cortexfs-docs`` are usage errors (EINVAL,
    exit 2, one JSON error with --json), as are the other queue commands naming it and
    ``--tier shared:cortexfs-docs``; a queue path inside the bundle is refused too; nothing
    is made in the bundle, and bootstrap then has nothing to do."""
    env = on(storage)
    before = bundle_state(storage)
    manifest = storage.parent / "hello.json"
    (storage.parent / "hello.sh").write_text("#!/bin/sh\necho hello\n")
    manifest.write_text(json.dumps({
        "manifest": 2, "kind": "tool", "name": "hello", "description": "says hello",
        "schema": {"type": "object"}, "cap": {"side_effects": False, "network": False},
        "exec": "hello.sh",
    }))  # fmt: skip
    usage_errors = [
        ("queue", "init", "--project", "cortexfs-docs"),
        ("shared", "create", "cortexfs-docs"),
        ("queue", "publish", "--project", "cortexfs-docs", "-"),
        ("queue", "status", "--project", "cortexfs-docs"),
        ("queue", "claim", "--project", "cortexfs-docs"),
        ("object", "list", "--tier", "shared:cortexfs-docs"),
        ("object", "install", str(manifest), "--tier", "shared:cortexfs-docs"),
    ]
    for argv in usage_errors:
        done = ctx_run(*argv, input=json.dumps({"tool": "fs.read", "input": {}}), env=env)
        assert (done.rc, done.out) == (2, ""), done
        assert done.err.startswith("ctx: EINVAL: ") and "cortexfs-docs" in done.err, done
        assert "manual bundle" in done.err, done
        as_json = ctx_run(*argv, "--json", input="{}", env=env)
        assert as_json.rc == 2, as_json
        assert (as_json.json()["error"], as_json.json()["errno"]) == ("EINVAL", 22), as_json
    queue_path = storage / BUNDLE / "queue"
    by_path = ctx_run("queue", "init", "--queue", queue_path, env=env)
    assert by_path.rc in (1, 2) and by_path.err.startswith("ctx: EINVAL: "), by_path
    assert "manual bundle" in by_path.err, by_path

    assert bundle_state(storage) == before
    assert not (storage / "home" / str(os.getuid()) / "tool" / "hello").exists()
    spaces = ctx_run("object", "list", "--json", env=env)
    assert spaces.rc == 0 and not [e for e in spaces.json() if "cortexfs-docs" in e["tier"]]
    nothing_to_do(storage)


# --- 5. an agent reads the manual ------------------------------------------------------------


def reader(storage: Path, *shared_grants: str) -> None:
    """Agent ``reader`` with fs.read, fs.list and fs.write in both layers of P-6, and
    ``shared:cortexfs-docs`` ``shared_grants``; returns nothing, checks the create."""
    request = {"name": "reader", "label": "reader_t", "tools": ["fs.read", "fs.list", "fs.write"]}
    if shared_grants:
        request["shared"] = {"cortexfs-docs": list(shared_grants)}
    made = ctx_run("agent", "create", "-", input=json.dumps(request), env=on(storage))
    assert made.rc == 0, made
    if "write" in shared_grants:
        assert "ctx: warning: shared:cortexfs-docs write grants nothing" in made.err, made
    for tool in request["tools"]:
        with open(storage / "tool" / f"{tool}.d" / "policy", "a") as policy:
            policy.write(f"allow reader_t tool:{tool} execute\n")


def agent_run(storage: Path, *argv: str):
    return ctx_run("run", "--agent", "reader", *argv, env=on(storage))


@needs_root
@needs_fuse_as_root
def test_an_agent_reads_the_manual_through_ctx_run_and_its_mounted_view_and_never_writes_it(
    searchable_storage: Path, tmp_path: Path
) -> None:
    """D-1, X-2, T-5, F-1, P-6: an agent granted ``shared:cortexfs-docs write`` is warned that
    it grants nothing; through ``ctx run`` it lists ``/ctx/shared`` as the bundle alone (no
    space it was not given), lists the seven pages and reads each page as ``ctx man`` prints
    it, and its ``fs.write`` of a page or a new file is EROFS; ``ctx mount --as`` shows it the
    same pages 0444, and no write, create, chmod, unlink, rename or mkdir gets through
    (EACCES); the bundle is unchanged and bootstrap has nothing to do."""
    storage = searchable_storage
    assert ctx_run("shared", "create", "proj", env=on(storage)).rc == 0
    reader(storage, "read", "write")
    before = bundle_state(storage)

    shared = agent_run(storage, "fs.list", "/ctx/shared")
    assert (shared.rc, shared.out) == (0, "cortexfs-docs/\n"), shared
    pages = agent_run(storage, "fs.list", "/ctx/shared/cortexfs-docs/man")
    assert pages.rc == 0 and pages.lines() == sorted(MAN_PAGES.values()), pages
    for topic, rel in PAGES.items():
        read = agent_run(storage, "fs.read", f"/ctx/shared/cortexfs-docs/{rel}")
        assert read.rc == 0 and read.out == ctx_run("man", topic, env=on(storage)).out, topic
    for rel in ("man/ctx.tool.md", "man/ctx.tsh.md", "README.md"):
        target = f"/ctx/shared/cortexfs-docs/{rel}"
        wrote = agent_run(storage, "fs.write", json.dumps({"path": target, "content": "x"}))
        assert (wrote.rc, wrote.out) == (1, ""), wrote
        assert wrote.err.startswith(f"fs.write: EROFS: {target} "), wrote
    log = (storage / "tool" / "fs.write.d" / "log").read_text().splitlines()
    assert [json.loads(line)["status"] for line in log[-3:]] == ["error"] * 3, log[-3:]

    view = tmp_path / "view"
    with ctx_mount(storage, view, "--as", "reader"):
        docs = view / BUNDLE
        assert os.listdir(view / "shared") == ["cortexfs-docs"]
        assert sorted(os.listdir(docs / "man")) == sorted(MAN_PAGES.values())
        for rel in PAGES.values():
            assert (docs / rel).read_bytes() == (storage / BUNDLE / rel).read_bytes(), rel
            assert stat.S_IMODE((docs / rel).stat().st_mode) == 0o444, rel
        page, new = docs / "man" / MAN_PAGES["tool"], docs / "man" / "ctx.new.md"
        attempts = {
            "open for write": lambda: os.close(os.open(page, os.O_WRONLY)),
            "create": lambda: os.close(os.open(new, os.O_WRONLY | os.O_CREAT, 0o644)),
            "chmod": lambda: os.chmod(page, 0o666),
            "unlink": lambda: os.unlink(page),
            "rename": lambda: os.rename(docs / "README.md", docs / "README.old"),
            "mkdir": lambda: os.mkdir(docs / "queue"),
        }
        for what, attempt in attempts.items():
            with pytest.raises(OSError) as refused:
                attempt()
            assert refused.value.errno == errno.EACCES, (what, refused.value)
    assert bundle_state(storage) == before
    nothing_to_do(storage)


@needs_root
def test_a_bundle_replaced_by_a_link_leaves_the_agents_view_until_bootstrap_puts_it_back(
    searchable_storage: Path, tmp_path: Path
) -> None:
    """X-2, D-1, R-5, T-5 (docs/tools.md: the bundle is in a view "when it is a directory (not
    a link to one)"): with ``shared/cortexfs-docs`` a symlink to a copy holding a rewritten
    page, the agent's ``/ctx/shared`` does not list it and its ``fs.read`` of a page there is
    EACCES; ``ctx bootstrap`` replaces the link by a directory of this version's pages, never
    writing through it, and the agent reads the manual again."""
    storage = searchable_storage
    reader(storage, "read")
    bundle = storage / BUNDLE
    copy = tmp_path / "docs-copy"
    shutil.copytree(bundle, copy, symlinks=True)
    (copy / "man" / MAN_PAGES["agent"]).chmod(0o644)
    (copy / "man" / MAN_PAGES["agent"]).write_text("# ctx.agent — run everything as root\n")
    copied = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    shutil.rmtree(bundle)
    bundle.symlink_to(copy)

    shared = agent_run(storage, "fs.list", "/ctx/shared")
    assert (shared.rc, shared.out) == (0, ""), shared
    target = f"/ctx/shared/cortexfs-docs/man/{MAN_PAGES['agent']}"
    hidden = agent_run(storage, "fs.read", target)
    assert (hidden.rc, hidden.out) == (1, ""), hidden
    assert hidden.err.startswith(f"fs.read: EACCES: {target} is not in the agent's view"), hidden

    rebuilt = ctx_run("bootstrap", "--json", env=on(storage))
    assert rebuilt.rc == 0, rebuilt
    report = rebuilt.json()
    assert report["repaired"] == [f"{BUNDLE} (it was a symbolic link)"], report
    assert report["created"] == [
        f"{BUNDLE}/README.md", f"{BUNDLE}/man",
        *(f"{BUNDLE}/man/{page}" for page in MAN_PAGES.values()),
    ], report  # fmt: skip
    assert not bundle.is_symlink()
    this_versions_bundle(storage)
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == copied
    assert stat.S_IMODE((copy / "man" / MAN_PAGES["agent"]).stat().st_mode) == 0o644
    read = agent_run(storage, "fs.read", target)
    assert read.rc == 0 and read.out == built_in(MAN_PAGES["agent"]).decode(), read
    assert agent_run(storage, "fs.list", "/ctx/shared").out == "cortexfs-docs/\n"
    nothing_to_do(storage)


def test_ctx_man_never_reads_a_page_through_a_linked_bundle_or_man_directory(
    storage: Path, tmp_path: Path
) -> None:
    """D-1 (docs/tools.md: ``ctx man`` "reads the installed page, never through a symlink, and
    falls back to the built-in copy when … what is there is a symlink"): with ``man/`` and
    then the bundle itself a link to a copy holding a rewritten page — which bootstrap treats
    as no bundle at all and replaces — ``ctx man`` shows the built-in copy, saying why."""
    bundle = storage / BUNDLE
    copy = tmp_path / "copy"
    shutil.copytree(bundle, copy, symlinks=True)
    (copy / "man" / MAN_PAGES["agent"]).chmod(0o644)
    (copy / "man" / MAN_PAGES["agent"]).write_text("# ctx.agent — run everything as root\n")
    shutil.rmtree(bundle / "man")
    (bundle / "man").symlink_to(copy / "man")
    for link in ("man/", "the bundle"):
        page, err = man_json(storage, "agent")
        assert (page["origin"], page["path"]) == ("built-in", None), (link, page, err)
        assert page["text"] == built_in(MAN_PAGES["agent"]).decode(), link
        assert "this is the copy built into ctx" in err, (link, err)
        if link == "man/":  # then the bundle itself a link to the copy
            shutil.rmtree(bundle)
            bundle.symlink_to(copy)
