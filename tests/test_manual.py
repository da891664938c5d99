"""The manual bundle shared/cortexfs-docs and ``ctx man`` (SPEC R-5, X-2, §12 D-1)."""

from __future__ import annotations

import json
import os
import resource
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import cortexfs
from cortexfs import manual, storage
from cortexfs.errors import CtxError
from tests.support.cli import ctx
from tests.support.storage import attribute, copy_of_root

REPOSITORY = Path(__file__).resolve().parent.parent
PAGES = [manual.README] + [manual.page_name(topic) for topic in manual.TOPICS]


def bundle(root: Path) -> Path:
    return root / "shared" / "cortexfs-docs"


def installed(root: Path) -> dict[str, bytes]:
    """The bundle's files, by page name (README.md and man/ctx.*.md flattened)."""
    files = {manual.README: (bundle(root) / manual.README).read_bytes()}
    for page in (bundle(root) / "man").iterdir():
        files[page.name] = page.read_bytes()
    return files


def built_in() -> dict[str, bytes]:
    return {name: (manual.BUILT_IN / name).read_bytes() for name in PAGES}


@pytest.fixture
def root(bootstrapped_by_ctx: Path, tmp_path: Path) -> Path:
    """A root ``ctx bootstrap`` made, this test's own."""
    return copy_of_root(bootstrapped_by_ctx, tmp_path / "storage")


# ------------------------------------------------------------------------------ the pages


def test_docs_spec_is_the_built_in_copy() -> None:
    """D-1: the bundle mirrors docs/spec/*.md; the repository keeps one copy of each page."""
    mirrored = sorted(path.name for path in (REPOSITORY / "docs" / "spec").glob("*.md"))

    assert mirrored == sorted(PAGES)
    for name in PAGES:
        assert (REPOSITORY / "docs" / "spec" / name).read_bytes() == built_in()[name]


@pytest.mark.parametrize("topic", manual.TOPICS)
def test_every_page_names_its_topic_and_the_readme_lists_it(topic: str) -> None:
    page = built_in()[manual.page_name(topic)].decode()

    assert manual.summary(page).startswith(f"ctx.{topic} — ")
    assert manual.page_name(topic) in built_in()[manual.README].decode()


# -------------------------------------------------------------------------------- install


def test_bootstrap_installs_the_bundle_read_only(root: Path) -> None:
    assert installed(root) == built_in()
    for directory in (bundle(root), bundle(root) / "man"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o755
    for name in PAGES:
        path = bundle(root) / (name if name == manual.README else f"man/{name}")
        assert stat.S_IMODE(path.stat().st_mode) == 0o444, name


def test_the_bundle_is_readable_by_everyone_whatever_the_umask(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    assert ctx(root, "bootstrap", umask=0o077).returncode == 0

    assert stat.S_IMODE((bundle(root) / "man").stat().st_mode) == 0o755
    page = bundle(root) / "man" / "ctx.tool.md"
    assert stat.S_IMODE(page.stat().st_mode) == 0o444


def test_a_second_bootstrap_leaves_a_current_bundle_alone(root: Path) -> None:
    before = {p: p.stat().st_ino for p in (bundle(root) / "man").iterdir()}

    again = ctx(root, "bootstrap", "--json")

    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert not [p for p in report["created"] + report["repaired"] if "cortexfs-docs" in p]
    assert {p: p.stat().st_ino for p in (bundle(root) / "man").iterdir()} == before


def test_bootstrap_replaces_a_stale_page_and_restores_a_missing_one(root: Path) -> None:
    stale = bundle(root) / "man" / "ctx.session.md"
    stale.chmod(0o644)
    stale.write_text("# an older page\n")
    (bundle(root) / "man" / "ctx.agent.md").unlink()

    done = ctx(root, "bootstrap", "--json")

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert "shared/cortexfs-docs/man/ctx.session.md" in report["repaired"]
    assert "shared/cortexfs-docs/man/ctx.agent.md" in report["created"]
    assert installed(root) == built_in()
    assert stat.S_IMODE(stale.stat().st_mode) == 0o444


def test_a_page_made_writable_is_stale_even_with_the_right_text(root: Path) -> None:
    page = bundle(root) / "man" / "ctx.tool.md"
    page.chmod(0o666)

    report = storage.bootstrap(root)

    assert "shared/cortexfs-docs/man/ctx.tool.md" in report.repaired
    assert stat.S_IMODE(page.stat().st_mode) == 0o444


def test_bootstrap_replaces_a_link_at_a_pages_name_without_following_it(
    root: Path, tmp_path: Path
) -> None:
    """The bundle is the system's (X-2): a link there is replaced by the page, and what it
    pointed to is neither read nor changed; a directory at a page's name is left alone."""
    secret = tmp_path / "secret.md"
    secret.write_text("not for agents\n")
    page = bundle(root) / "man" / "ctx.model.md"
    page.unlink()
    page.symlink_to(secret)
    in_the_way = bundle(root) / "man" / "ctx.session.md"
    in_the_way.unlink()
    in_the_way.mkdir()
    note = bundle(root) / "man" / "notes.md"
    note.write_text("a local note\n")

    done = ctx(root, "bootstrap")

    assert done.returncode == 1
    assert "man/ctx.model.md (it was a symbolic link)" in done.stdout
    assert "ctx.session.md: a directory, not a page; left untouched" in done.stdout
    assert not page.is_symlink() and page.read_bytes() == built_in()["ctx.model.md"]
    assert secret.read_text() == "not for agents\n"
    assert in_the_way.is_dir() and note.read_text() == "a local note\n"
    shown = ctx(root, "man", "model")
    assert shown.returncode == 0 and shown.stdout == built_in()["ctx.model.md"].decode()


def test_something_else_in_the_bundles_place_is_a_problem_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    storage.ensure_root_abi(root)
    (root / "shared" / "cortexfs-docs").write_text("in the way\n")

    done = ctx(root, "bootstrap")

    assert done.returncode == 1
    assert "shared/cortexfs-docs: exists but is not a directory; left untouched" in done.stdout
    assert (root / "shared" / "cortexfs-docs").read_text() == "in the way\n"


def _problems(stdout: str, below: str = "") -> list[str]:
    """The ``problem`` lines of a bootstrap's output, without the word, on paths ``below``."""
    lines = [line.split(None, 1)[1] for line in stdout.splitlines() if line.startswith("problem")]
    return [line for line in lines if line.startswith(below)]


def _limited_bootstrap(root: Path, file_size: int) -> subprocess.CompletedProcess[str]:
    """``ctx bootstrap`` in a process that may write no file larger than ``file_size`` bytes
    (SIGXFSZ ignored, as ctx ignores it): a write past it fails EFBIG."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    return subprocess.run(
        [sys.executable, "-m", "cortexfs", "--storage", str(root), "bootstrap"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        preexec_fn=limit,
        timeout=120,
    )


def test_each_page_is_its_own_step_one_not_written_keeps_none_of_the_others_out(
    root: Path,
) -> None:
    """R-5 (repairs what it can), ``ctx bootstrap --help`` (every problem names its path):
    every page removed, and no file larger than 8 KiB may be written.  The pages that fit
    (README.md, ctx.model.md, ctx.provider.md) are installed, whatever their order among the
    others; each page that does not is a problem naming it (EFBIG), never the module that
    installs them nor the temporary name it wrote; a run without the limit installs them."""
    pages = {name: bundle(root) / name for name in PAGES}
    pages.update({name: bundle(root) / "man" / name for name in PAGES if name != manual.README})
    for path in pages.values():
        path.unlink()
    limit = 8192
    fitting = {name for name, data in built_in().items() if len(data) <= limit}
    assert fitting and fitting != set(PAGES)

    cut = _limited_bootstrap(root, limit)
    completed = ctx(root, "bootstrap")

    assert cut.returncode == 1, cut.stdout
    assert cut.stderr.startswith("ctx: EFBIG: "), cut.stderr
    where = {name: str(path.relative_to(root)) for name, path in pages.items()}
    created = [line.split()[1] for line in cut.stdout.splitlines() if line.startswith("created")]
    assert sorted(created) == sorted(where[name] for name in fitting), cut.stdout
    # The core tools, whose launchers are written to a scratch file to be compared, meet the
    # limit too: only the bundle's problems are this test's.
    assert _problems(cut.stdout, "shared/") == [
        f"{where[name]}: File too large ({root}/{where[name]}); left as it was"
        for name in PAGES
        if name not in fitting
    ], cut.stdout
    assert not [name for name in os.listdir(bundle(root) / "man") if name.startswith(".")]
    assert completed.returncode == 0, completed.stdout
    assert installed(root) == built_in()


@pytest.mark.parametrize("immutable", ["page", "man"])
def test_a_page_an_attribute_keeps_from_being_written_names_it_and_its_chattr(
    root: Path, immutable: str
) -> None:
    """R-5, D-1: ``ctx.agent.md`` is stale and ``ctx.provider.md`` removed; the stale page
    (or the whole ``man/``) is immutable.  What is refused is a problem naming the page, the
    attribute and the ``chattr -i`` that lifts it (EPERM); ``ctx.provider.md`` is put back
    unless ``man/`` itself refuses it, which is then a problem of its own."""
    man = bundle(root) / "man"
    agent, provider = man / "ctx.agent.md", man / "ctx.provider.md"
    agent.chmod(0o644)
    agent.write_text("# a page of another release\n")
    agent.chmod(0o444)
    provider.unlink()
    held = agent if immutable == "page" else man

    with attribute(held, "i"):
        done = ctx(root, "bootstrap")

    assert done.returncode == 1, done.stdout
    assert done.stderr.startswith("ctx: EPERM: "), done.stderr
    problems = _problems(done.stdout)
    refused = ["ctx.agent.md"] if immutable == "page" else ["ctx.agent.md", "ctx.provider.md"]
    assert [line.split(":")[0] for line in problems] == [
        f"shared/cortexfs-docs/man/{name}" for name in refused
    ], done.stdout
    for line in problems:
        assert f"{held} is immutable (attribute 'i'" in line, line
        assert f"'chattr -i {held}'" in line and ".tmp" not in line, line
    assert provider.is_file() is (immutable == "page")
    assert ("created   shared/cortexfs-docs/man/ctx.provider.md" in done.stdout) is (
        immutable == "page"
    )


def test_bootstrap_source_installs_the_pages_of_that_tree(root: Path, tmp_path: Path) -> None:
    source = tmp_path / "checkout"
    (source / "docs" / "spec").mkdir(parents=True)
    for name, data in built_in().items():
        (source / "docs" / "spec" / name).write_bytes(data)
    newer = b"# ctx.tool \xe2\x80\x94 the next version's page\n"
    (source / "docs" / "spec" / "ctx.tool.md").write_bytes(newer)

    done = ctx(root, "bootstrap", str(source), "--json")

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["repaired"] == ["shared/cortexfs-docs/man/ctx.tool.md"]
    assert (bundle(root) / "man" / "ctx.tool.md").read_bytes() == newer
    assert ctx(root, "man", "tool").stdout == newer.decode()


@pytest.mark.parametrize("version", ["0.0.1", "9.9.9"])
def test_the_source_tree_of_another_version_is_refused_before_anything_changes(
    root: Path, tmp_path: Path, version: str
) -> None:
    """D-1: a stale bundle is rebuilt from the tree of the matching version."""
    source = tmp_path / "checkout"
    (source / "docs" / "spec").mkdir(parents=True)
    for name, data in built_in().items():
        (source / "docs" / "spec" / name).write_bytes(data + b"\nanother version\n")
    (source / "pyproject.toml").write_text(f'[project]\nname = "cortexfs"\nversion = "{version}"\n')
    before = (bundle(root) / "man" / "ctx.tool.md").read_bytes()

    done = ctx(root, "bootstrap", str(source))

    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith("ctx: EINVAL: ") and f"cortexfs {version}" in done.stderr
    assert (bundle(root) / "man" / "ctx.tool.md").read_bytes() == before
    for name, data in built_in().items():  # the tree of this very release
        (source / "docs" / "spec" / name).write_bytes(data)
    (source / "pyproject.toml").write_text(
        f'[project]\nname = "cortexfs"\nversion = "{cortexfs.__version__}"\n'
    )
    assert ctx(root, "bootstrap", str(source)).returncode == 0


def test_a_tree_declaring_this_version_with_other_pages_is_refused_naming_them(
    root: Path, tmp_path: Path
) -> None:
    """D-1: every release has declared the same version, so the tree of an older one (its
    pages saying what no longer holds) declares this ctx's: its pages tell it apart."""
    source = tmp_path / "older-checkout"
    (source / "docs" / "spec").mkdir(parents=True)
    for name, data in built_in().items():
        (source / "docs" / "spec" / name).write_bytes(data)
    (source / "docs" / "spec" / "ctx.session.md").write_bytes(b"# ctx.session - home 0750\n")
    (source / "pyproject.toml").write_text(
        f'[project]\nname = "cortexfs"\nversion = "{cortexfs.__version__}"\n'
    )
    before = installed(root)

    done = ctx(root, "bootstrap", str(source))

    assert done.returncode == 2, done.stdout
    assert done.stderr.startswith(
        f"ctx: EINVAL: {source} declares cortexfs {cortexfs.__version__}, as this ctx does, but "
        "its manual pages are not this ctx's (docs/spec/ctx.session.md differs)"
    )
    assert "run 'ctx bootstrap' without SOURCE for the pages built into this ctx" in done.stderr
    assert installed(root) == before


def test_a_source_without_the_pages_is_refused_before_anything_is_made(tmp_path: Path) -> None:
    source = tmp_path / "not-a-checkout"
    (source / "docs" / "spec").mkdir(parents=True)
    (source / "docs" / "spec" / manual.README).write_text("# CortexFS manuals\n")
    root = tmp_path / "storage"

    done = ctx(root, "bootstrap", str(source))

    assert done.returncode == 2
    assert "EINVAL" in done.stderr and "ctx.agent.md" in done.stderr
    assert not root.exists()
    with pytest.raises(CtxError):
        storage.bootstrap(root, source)
    assert not root.exists()


def test_the_bundle_is_not_a_shared_space(root: Path) -> None:
    refused = ctx(root, "object", "list", "--tier", "shared:cortexfs-docs")
    assert refused.returncode != 0 and "manual bundle" in refused.stderr
    listed = ctx(root, "object", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "cortexfs-docs" not in listed.stdout


# ---------------------------------------------------------------------------------- ctx man


@pytest.mark.parametrize("name", ["session", "ctx.session", "ctx.session.md"])
def test_man_prints_the_installed_page_by_topic_or_page_name(root: Path, name: str) -> None:
    page = bundle(root) / "man" / "ctx.session.md"
    page.chmod(0o644)
    page.write_text("# ctx.session — as installed here\n")

    shown = ctx(root, "man", name)

    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == "# ctx.session — as installed here\n"
    # D-1: the bundle is out of line with this ctx, and the reader is told so
    assert shown.stderr == (
        f"ctx man: note: {page} is not the page of this version of ctx; 'ctx bootstrap' "
        "installs it (ctx man shows the installed page)\n"
    )
    assert ctx(root, "man", "agent").stderr == ""  # a current page, read without a note


def test_man_without_a_bundle_falls_back_to_the_built_in_copy(tmp_path: Path) -> None:
    nowhere = tmp_path / "no-storage"

    shown = ctx(nowhere, "man", "coreutils", "--json")

    assert shown.returncode == 0, shown.stderr
    page = json.loads(shown.stdout)
    assert page["origin"] == "built-in" and page["path"] is None
    assert page["text"] == built_in()["ctx.coreutils.md"].decode()
    assert "ctx bootstrap" in shown.stderr
    assert not nowhere.exists(), "reading a manual creates nothing"


def test_man_lists_every_topic(root: Path) -> None:
    listed = ctx(root, "man", "--json")

    assert listed.returncode == 0, listed.stderr
    topics = json.loads(listed.stdout)
    assert [entry["topic"] for entry in topics] == ["README", *manual.TOPICS]
    assert {entry["origin"] for entry in topics} == {"installed"}
    text = ctx(root, "man").stdout.splitlines()
    assert [line.split()[0] for line in text] == ["README", *manual.TOPICS]


@pytest.mark.parametrize("name", ["README", "readme", "README.md"])
def test_man_readme_prints_the_bundles_readme(root: Path, name: str) -> None:
    readme = bundle(root) / manual.README
    readme.chmod(0o644)
    readme.write_text("# CortexFS manuals, as installed here\n")

    shown = ctx(root, "man", name)

    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == "# CortexFS manuals, as installed here\n"
    assert shown.stderr.startswith(f"ctx man: note: {readme} is not the page of this version")


def test_man_readme_without_a_bundle_is_the_built_in_readme(tmp_path: Path) -> None:
    shown = ctx(tmp_path / "no-storage", "man", "README", "--json")

    assert shown.returncode == 0, shown.stderr
    page = json.loads(shown.stdout)
    assert (page["topic"], page["page"], page["origin"]) == ("README", "README.md", "built-in")
    assert page["text"] == built_in()[manual.README].decode()


def test_an_unknown_topic_is_enoent_with_the_topics_listed(root: Path) -> None:
    shown = ctx(root, "man", "queue")

    assert shown.returncode == 1
    assert "ENOENT" in shown.stderr and "root-abi" in shown.stderr
    assert shown.stdout == ""


@pytest.mark.parametrize("make", [os.mkfifo, os.mkdir], ids=["fifo", "directory"])
def test_what_is_not_a_file_in_a_pages_place_is_never_waited_on(
    root: Path, make: Callable[[Path], None]
) -> None:
    """ctx man falls back at once; bootstrap replaces a FIFO and leaves a directory alone."""
    page = bundle(root) / "man" / "ctx.provider.md"
    page.unlink()
    make(page)
    directory = page.is_dir()

    shown = ctx(root, "man", "provider")  # would hang on open() without O_NONBLOCK
    again = ctx(root, "bootstrap")

    assert shown.returncode == 0 and shown.stdout == built_in()["ctx.provider.md"].decode()
    if directory:
        assert again.returncode == 1 and "ctx.provider.md: a directory, not a page" in again.stdout
        assert page.is_dir()
    else:
        assert again.returncode == 0 and "ctx.provider.md (it was a FIFO)" in again.stdout
        assert page.read_bytes() == built_in()["ctx.provider.md"]


def test_a_page_that_is_not_utf8_falls_back_and_the_listing_still_lists(root: Path) -> None:
    """D-1: one damaged page does not take 'ctx man' down; the note says what is wrong with
    it, and bootstrap replaces it."""
    page = bundle(root) / "man" / "ctx.model.md"
    page.chmod(0o644)
    page.write_bytes(b"# ctx.model \xff\xfe damaged\n")

    shown = ctx(root, "man", "model")
    listed = ctx(root, "man", "--json")

    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == built_in()["ctx.model.md"].decode()
    assert f"ctx man: {page} is not UTF-8 text ('ctx bootstrap' replaces it)" in shown.stderr
    assert listed.returncode == 0, listed.stderr
    origins = {entry["topic"]: entry["origin"] for entry in json.loads(listed.stdout)}
    assert origins["model"] == "built-in" and origins["agent"] == "installed"
    assert ctx(root, "bootstrap").returncode == 0
    assert page.read_bytes() == built_in()["ctx.model.md"]


def test_a_symlink_in_a_pages_place_is_named_as_such(root: Path) -> None:
    page = bundle(root) / "man" / "ctx.tool.md"
    page.unlink()
    page.symlink_to("/etc/passwd")

    shown = ctx(root, "man", "tool")

    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == built_in()["ctx.tool.md"].decode()
    assert f"{page} is a symbolic link, never followed" in shown.stderr
    assert "no page is installed" not in shown.stderr
