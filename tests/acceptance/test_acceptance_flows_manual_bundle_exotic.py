"""Unusual ways to name, damage, rebuild and read the manual bundle (SPEC §12 D-1, X-2, R-2,
R-5; docs/tools.md "ctx bootstrap" and ``ctx man``): topic spellings by case, suffix, prefix,
path separators and dots; installed pages emptied, truncated on a line or inside a character,
grown past 1 MiB, replaced by a socket; directories above a page that may be searched but not
listed by a non-root reader; ``ctx man`` writing into a pipe that is gone, a full device and a
closed descriptor; ``ctx bootstrap SOURCE`` given relative paths, linked ``docs/spec``
directories, extra and oversized pages, pages that are not UTF-8 and a ``pyproject.toml`` that
is a FIFO or endless; the bundle read by ``ctx man`` through an agent's mounted view; and the
bundle granting nothing: an agent's view and its reads are the same with or without a
``shared:cortexfs-docs read`` rule."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
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
    new_scratch_dir,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

SCRATCH = scratch_top(__file__)
SPEC_PAGES = REPO / "docs" / "spec"
BUNDLE = Path("shared") / "cortexfs-docs"
# topic -> the bundle's file, README first, as ``ctx man`` lists them
PAGES = {"README": "README.md", **{topic: f"man/{page}" for topic, page in MAN_PAGES.items()}}
MIB = 1024 * 1024
NOBODY = 65534  # the uid an agent created by root runs as when no --user is given

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (other uids, mknod)")


# ------------------------------------------------------------------------------ helpers


def on(root: Path) -> dict[str, str]:
    return clean_env(CTX_STORAGE=str(root))


def built_in(rel: str) -> bytes:
    """This version's page (the built-in copy, the same bytes as ``docs/spec/``)."""
    return (SPEC_PAGES / Path(rel).name).read_bytes()


def page_path(root: Path, topic: str) -> Path:
    return root / BUNDLE / PAGES[topic]


def replace_page(root: Path, topic: str, data: bytes) -> Path:
    """Put ``data`` in the place of ``topic``'s installed page (a new writable file)."""
    page = page_path(root, topic)
    page.unlink()
    page.write_bytes(data)
    return page


def man_json(root: Path, topic: str) -> tuple[dict, str]:
    shown = ctx_run("man", topic, "--json", env=on(root))
    assert shown.rc == 0, shown
    return shown.json(), shown.err


def nothing_to_do(root: Path) -> None:
    again = ctx_run("bootstrap", env=on(root))
    assert (again.rc, again.err) == (0, ""), again
    assert again.lines()[-1] == "nothing to do: the storage root is complete", again


def source_tree(where: Path) -> Path:
    """A tree of the pages alone (no pyproject.toml: the administrator's own pages), a copy of
    this version's ``docs/spec`` (the repository's is a link: copied as regular files)."""
    shutil.copytree(SPEC_PAGES, where / "docs" / "spec")
    for page in (where / "docs" / "spec").iterdir():
        page.chmod(0o644)
    return where


def bind_socket(path: Path) -> None:
    """A Unix socket bound at ``path`` (by a child working in its directory: a socket's
    address is short), left there once the child is gone, as a crashed server leaves one."""
    bind = "import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])"
    subprocess.run([sys.executable, "-c", bind, path.name], cwd=path.parent, check=True)
    assert stat.S_ISSOCK(path.lstat().st_mode), path


def as_uid(uid: int, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, user=uid, group=uid, extra_groups=[], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip


# ------------------------------------------------------------------ topic spellings

ACCEPTED = {
    "agent": "agent",
    "ctx.agent": "agent",
    "ctx.agent.md": "agent",
    "agent.md": "agent",  # the suffix alone
    "root-abi": "root-abi",
    "ctx.root-abi.md": "root-abi",
    "README": "README",
    "readme": "README",
    "ReadMe": "README",
    "README.md": "README",
    "readme.md": "README",
    "README.MD": "README",
}
REFUSED = [
    "AGENT",
    "Agent",
    "CTX.agent.md",
    "ctx.agent.MD",
    "ctx.agent.md.md",
    "ctx.ctx.agent",
    "",
    " agent",
    "agent\n",
    "man/ctx.agent.md",
    "shared/cortexfs-docs/man/ctx.agent.md",
    "./agent",
    "agent/.",
    "..",
    ".",
    "ctx.",
    "ctx.md",
    "ctx..md",
    "root_abi",
    "ROOT-ABI",
    "ctx.README.md",
    "ctx.readme",
    "README.md/",
    "-h",
    "--json",
]


def test_each_accepted_spelling_prints_the_installed_page_of_its_topic(storage: Path) -> None:
    """D-1 (``agent`` … are aliases of ``ctx.agent.md`` …; docs/tools.md: ``README``,
    ``readme`` and ``README.md`` name the bundle's README): each spelling prints the installed
    page, exit 0, nothing on stderr, and ``--json`` names the topic it resolved to."""
    for name, topic in ACCEPTED.items():
        shown = ctx_run("man", "--", name, env=on(storage))
        assert (shown.rc, shown.err) == (0, ""), shown
        assert shown.out == page_path(storage, topic).read_text(), name
    for name in ("agent.md", "ctx.root-abi.md", "ReadMe", "README.MD"):
        page, err = man_json(storage, name)
        assert (page["topic"], page["origin"], err) == (ACCEPTED[name], "installed", ""), page


def test_each_other_spelling_is_an_unknown_topic_enoent_naming_it_and_listing_the_topics(
    storage: Path,
) -> None:
    """D-1 (only the topics and their aliases are pages): another case of a topic, a doubled
    prefix or suffix, blanks, a path into or out of the bundle, dots, an empty name and names
    spelt like options (after ``--``) are each ENOENT, exit 1, nothing on stdout, the message
    quoting the name and listing the topics; ``--json`` gives it as one error object."""
    for name in REFUSED:
        shown = ctx_run("man", "--", name, env=on(storage))
        assert (shown.rc, shown.out) == (1, ""), shown
        assert shown.err.startswith(f"ctx: ENOENT: no manual page {name!r}"), shown
        assert shown.err.rstrip().endswith(
            "the topics are README, agent, tool, model, coreutils, root-abi, session, provider"
        ), shown
    for name in ("", "AGENT", "man/ctx.agent.md", "..", "-h"):
        as_json = ctx_run("man", "--json", "--", name, env=on(storage))
        assert as_json.rc == 1, as_json
        error = as_json.json()
        assert (error["error"], error["errno"]) == ("ENOENT", 2), as_json
        assert repr(name) in error["message"], as_json


def test_two_topics_at_once_are_a_usage_error(storage: Path) -> None:
    """``ctx man`` takes one TOPIC: a second is a usage error (EINVAL, exit 2), as one JSON
    error object with ``--json``, and nothing is printed on stdout otherwise."""
    shown = ctx_run("man", "agent", "tool", env=on(storage))
    assert (shown.rc, shown.out) == (2, ""), shown
    assert shown.err.rstrip().endswith("ctx: EINVAL: Got unexpected extra argument (tool)"), shown
    as_json = ctx_run("man", "agent", "tool", "--json", env=on(storage))
    assert as_json.rc == 2 and as_json.json()["error"] == "EINVAL", as_json


# ------------------------------------------------------------- installed pages damaged


def test_emptied_truncated_oversized_and_socket_pages_are_shown_or_passed_over_then_rebuilt(
    storage: Path,
) -> None:
    """D-1, R-5: an emptied page is still the installed page (shown empty with the note that it
    is not this version's, its summary empty in the listing); a page cut on a line end is
    shown cut, with the note; one cut inside a character is not UTF-8 and passed over for the
    built-in copy, saying so; a socket in a page's place is passed over for the built-in copy;
    ``ctx bootstrap`` rebuilds each (the socket reported as one), and then has nothing to do
    and ``ctx man`` reads every page with no note."""
    agent_page = built_in(PAGES["agent"])
    cut_on_line = agent_page[: agent_page.index(b"\n", 200) + 1]
    dash = built_in(PAGES["model"]).index("—".encode())
    replace_page(storage, "tool", b"")
    replace_page(storage, "agent", cut_on_line)
    replace_page(storage, "model", built_in(PAGES["model"])[: dash + 1])
    replace_page(storage, "coreutils", built_in(PAGES["coreutils"]) + b"x" * (2 * MIB))
    page_path(storage, "session").unlink()
    bind_socket(page_path(storage, "session"))

    empty, err = man_json(storage, "tool")
    assert (empty["origin"], empty["text"], empty["summary"]) == ("installed", "", ""), empty
    assert "is not the page of this version of ctx" in err, err
    printed = ctx_run("man", "tool", env=on(storage))
    assert (printed.rc, printed.out.strip()) == (0, ""), printed
    listing = ctx_run("man", env=on(storage))
    assert "tool" in [line.split()[0] for line in listing.lines()], listing
    assert [line for line in listing.lines() if line.startswith("tool ")] == [
        "tool         [installed]"
    ], listing

    cut, err = man_json(storage, "agent")
    assert (cut["origin"], cut["text"]) == ("installed", cut_on_line.decode()), cut
    assert "is not the page of this version of ctx" in err, err

    model, err = man_json(storage, "model")
    assert (model["origin"], model["path"]) == ("built-in", None), model
    assert model["text"] == built_in(PAGES["model"]).decode()
    assert err.startswith(f"ctx man: {page_path(storage, 'model')} is not UTF-8 text"), err

    session, err = man_json(storage, "session")
    assert (session["origin"], session["path"]) == ("built-in", None), session
    assert session["text"] == built_in(PAGES["session"]).decode()
    assert str(page_path(storage, "session")) in err and "built into ctx" in err, err

    rebuilt = ctx_run("bootstrap", "--json", env=on(storage))
    assert rebuilt.rc == 0, rebuilt
    where = f"{BUNDLE}/man"
    assert sorted(rebuilt.json()["repaired"]) == sorted([
        f"{where}/{MAN_PAGES['tool']}", f"{where}/{MAN_PAGES['agent']}",
        f"{where}/{MAN_PAGES['model']}", f"{where}/{MAN_PAGES['coreutils']}",
        f"{where}/{MAN_PAGES['session']} (it was a socket)",
    ]), rebuilt  # fmt: skip
    for topic, rel in PAGES.items():
        page = page_path(storage, topic)
        assert page.read_bytes() == built_in(rel), topic
        assert stat.S_IMODE(page.lstat().st_mode) == 0o444, topic
        shown, err = man_json(storage, topic)
        assert (shown["origin"], err) == ("installed", ""), (topic, err)
    nothing_to_do(storage)


@pytest.mark.parametrize("filler", ["ascii", "three-byte characters"])
def test_a_page_over_one_mebibyte_is_never_shown_cut_short_without_saying_so(
    storage: Path, filler: str
) -> None:
    """D-1 (``ctx man`` reads the installed file; a page not this version's is shown with a
    note): a tampered page of valid UTF-8 text longer than 1 MiB is either printed whole or
    passed over with a note that says it is too large — never printed cut short under the
    note "ctx man shows the installed page", nor called "not UTF-8 text"."""
    head = built_in(PAGES["tool"])
    if filler == "ascii":
        body = head + b"x" * (2 * MIB) + b"\nTHE END\n"
    else:  # the 1 MiB mark falls inside a three-byte character
        pad = b"a" * ((MIB - len(head)) % 3 + 2)
        body = head + pad + "—".encode() * MIB + b"\nTHE END\n"
    replace_page(storage, "tool", body)
    shown = ctx_run("man", "tool", env=on(storage))
    assert shown.rc == 0, shown.err
    assert "not UTF-8" not in shown.err, shown.err
    told = any(word in shown.err.lower() for word in ("mib", "larger", "too large", "cut", "trunc"))
    whole = shown.out == body.decode()
    assert whole or told, (len(shown.out), len(body), shown.err)


def test_a_socket_in_a_pages_place_is_named_as_not_a_regular_file(storage: Path) -> None:
    """D-1 (docs/tools.md: ``ctx man`` falls back to the built-in copy when what is there is
    "not a regular file — saying so, and why"): a socket bound at a page's name is passed over
    with the same words as a FIFO there, "is not a regular file"."""
    page = page_path(storage, "provider")
    page.unlink()
    bind_socket(page)
    shown, err = man_json(storage, "provider")
    assert (shown["origin"], shown["path"]) == ("built-in", None), shown
    assert err.startswith(f"ctx man: {page} is not a regular file"), err


# ------------------------------------------------------------- non-root readers


@needs_root
@pytest.mark.parametrize("searchable_only", [".", f"{BUNDLE}/man"])
def test_a_page_the_reader_can_open_is_read_even_when_a_directory_above_it_cannot_be_listed(
    searchable_storage: Path, unprivileged_user: UnprivilegedUser, searchable_only: str
) -> None:
    """D-1 (``ctx man`` reads the installed file): with the storage root or the bundle's
    ``man/`` made 0711 (searchable, not listable — a common way to hide names), a
    non-root reader may still open the page by its path (``cat`` reads it), and ``ctx man``
    reads it too: ``installed``, no note."""
    root = searchable_storage
    (root / searchable_only).chmod(0o711)
    page = page_path(root, "agent")
    cat = run_as(unprivileged_user, ["cat", str(page)])
    assert (cat.returncode, cat.stdout) == (0, page.read_text()), cat
    shown = run_as(unprivileged_user, [*CTX_ARGV, "man", "agent", "--json"], env=on(root))
    assert shown.returncode == 0, shown
    answer = json.loads(shown.stdout)
    assert (answer["origin"], answer["path"], shown.stderr) == ("installed", str(page), ""), (
        answer["origin"],
        shown.stderr,
    )


@needs_root
def test_a_bundle_the_reader_may_not_enter_gives_built_in_pages_saying_why_and_bootstrap_opens_it(
    searchable_storage: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """D-1, X-2: with the bundle made 0700 (root's), a non-root reader's ``ctx man`` shows every
    page from the built-in copy, exit 0, each saying the installed page cannot be read
    (Permission denied); root still reads the installed pages; ``ctx bootstrap`` gives the
    bundle back its 0755, after which the reader reads the installed pages with no note."""
    root = searchable_storage
    (root / BUNDLE).chmod(0o700)
    listing = run_as(unprivileged_user, [*CTX_ARGV, "man", "--json"], env=on(root))
    assert listing.returncode == 0, listing
    assert {entry["origin"] for entry in json.loads(listing.stdout)} == {"built-in"}, listing
    for topic, rel in PAGES.items():
        shown = run_as(unprivileged_user, [*CTX_ARGV, "man", topic], env=on(root))
        assert (shown.returncode, shown.stdout) == (0, built_in(rel).decode()), topic
        assert shown.stderr == (
            f"ctx man: {page_path(root, topic)} cannot be read (Permission denied); "
            "this is the copy built into ctx\n"
        ), shown.stderr
        assert man_json(root, topic)[0]["origin"] == "installed", topic

    rebuilt = ctx_run("bootstrap", "--json", env=on(root))
    assert rebuilt.rc == 0, rebuilt
    assert rebuilt.json()["repaired"] == [f"{BUNDLE} (mode 0700, now 0755)"], rebuilt
    again = run_as(unprivileged_user, [*CTX_ARGV, "man", "--json"], env=on(root))
    assert (again.returncode, again.stderr) == (0, ""), again
    assert {entry["origin"] for entry in json.loads(again.stdout)} == {"installed"}, again


# ------------------------------------------------------------- standard output


def test_a_page_holding_control_characters_is_escaped_in_a_pipe_too_and_raw_in_json(
    storage: Path,
) -> None:
    """docs/tools.md (a character of the page that is not printable, but for line ends and
    tabs, is shown escaped): with stdout a pipe, not a terminal, a tampered page's ESC, BEL,
    NUL and DEL reach the reader escaped while its tabs and newlines stay; ``--json`` carries
    the text exactly, in JSON's own escapes."""
    text = "# ctx.tool — tampered\n\tindented\x1b[2Jcleared\x07bell\x00nul\x7fdel\nend\n"
    replace_page(storage, "tool", text.encode())
    shown = ctx_run("man", "tool", env=on(storage))
    assert shown.rc == 0, shown
    for raw in ("\x1b", "\x07", "\x00", "\x7f"):
        assert raw not in shown.out, (raw, shown.out)
    assert "\\x1b[2Jcleared" in shown.out and "\\x00nul" in shown.out, shown.out
    assert shown.out.startswith("# ctx.tool — tampered\n\tindented"), shown.out
    assert shown.out.endswith("\nend\n"), shown.out
    page, _ = man_json(storage, "tool")
    assert page["text"] == text, page


@pytest.mark.parametrize("argv", [("man", "agent"), ("man",), ("man", "README", "--json")])
def test_a_reader_gone_before_ctx_man_writes_ends_it_quietly_with_141(
    storage: Path, argv: tuple[str, ...]
) -> None:
    """Like ``ctx run --native … | head -1`` (docs/tools.md: a reader that left ends the
    command quietly, exit 141): ``ctx man`` writing a page, the listing or JSON into a pipe
    whose reader has closed it exits 141 with nothing on stderr, never a traceback."""
    reading, writing = os.pipe()
    os.close(reading)
    try:
        done = subprocess.run([*CTX_ARGV, *argv], stdin=subprocess.DEVNULL, stdout=writing,
                              stderr=subprocess.PIPE, env=on(storage), timeout=60)  # fmt: skip
    finally:
        os.close(writing)
    assert (done.returncode, done.stderr) == (141, b""), done


@pytest.mark.parametrize("argv", [("man", "agent"), ("man",), ("man", "tool", "--json")])
def test_ctx_man_into_a_full_device_is_enospc_exit_74(storage: Path, argv: tuple[str, ...]) -> None:
    """As every command (docs/queue.md: a standard output that refuses what is written ends the
    command with ``ctx: ENOSPC: cannot write standard output (…)`` and exit 74): ``ctx man``
    into ``/dev/full`` says so, exit 74, no traceback."""
    with open("/dev/full", "wb") as full:
        done = subprocess.run([*CTX_ARGV, *argv], stdin=subprocess.DEVNULL, stdout=full,
                              stderr=subprocess.PIPE, env=on(storage), timeout=60)  # fmt: skip
    err = done.stderr.decode()
    assert done.returncode == 74, err
    assert err.startswith("ctx: ENOSPC: cannot write standard output"), err
    assert "Traceback" not in err


def test_ctx_man_with_stdout_closed_runs_quietly_and_an_unknown_topic_still_fails(
    storage: Path,
) -> None:
    """docs/queue.md (commands other than the queue's that answer on stdout run as usual with
    it closed, their text going nowhere): ``ctx man agent >&-`` exits 0 with nothing on
    stderr; a page passed over still says so on stderr; an unknown topic is still ENOENT,
    exit 1, on stderr."""

    def closed(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", "-c", '"$@" >&-', "sh", *CTX_ARGV, *argv], text=True,
                              capture_output=True, env=on(storage), timeout=60)  # fmt: skip

    quiet = closed("man", "agent")
    assert (quiet.returncode, quiet.stderr) == (0, ""), quiet
    page_path(storage, "agent").unlink()
    noted = closed("man", "agent")
    assert noted.returncode == 0, noted
    assert noted.stderr.startswith("ctx man: no page is installed at "), noted
    unknown = closed("man", "nosuch")
    assert unknown.returncode == 1, unknown
    assert unknown.stderr.startswith("ctx: ENOENT: no manual page 'nosuch'"), unknown


# ------------------------------------------------------------- ctx bootstrap SOURCE


def test_bootstrap_source_given_relative_linked_or_holding_extra_pages_rebuilds_the_bundle(
    storage: Path, tmp_path: Path
) -> None:
    """D-1, R-5: ``ctx bootstrap SOURCE`` rebuilds a stale bundle from SOURCE given relative to
    the working directory (with a trailing slash too), from a tree whose ``docs/spec`` is a
    link to the pages (as the repository's own is), and from the repository itself; a page
    SOURCE holds that is no topic is not installed and is no topic of ``ctx man``."""
    env = on(storage)
    tree = source_tree(tmp_path / "checkout" / "tree")
    (tree / "docs" / "spec" / "ctx.site.md").write_text("# ctx.site — site notes\n")
    tool = page_path(storage, "tool")
    replace_page(storage, "tool", b"# ctx.tool \xe2\x80\x94 stale\n")

    relative = ctx_run("bootstrap", "--json", "tree/", env=env, cwd=tmp_path / "checkout")
    assert relative.rc == 0, relative
    assert relative.json()["repaired"] == [f"{BUNDLE}/man/{MAN_PAGES['tool']}"], relative
    assert tool.read_bytes() == built_in(PAGES["tool"])
    assert not (storage / BUNDLE / "man" / "ctx.site.md").exists()
    site = ctx_run("man", "site", env=env)
    assert site.rc == 1 and site.err.startswith("ctx: ENOENT: "), site

    linked = tmp_path / "linked"
    (linked / "docs").mkdir(parents=True)
    (linked / "docs" / "spec").symlink_to("../../checkout/tree/docs/spec")
    replace_page(storage, "tool", b"# ctx.tool \xe2\x80\x94 stale again\n")
    via_link = ctx_run("bootstrap", "--json", linked, env=env)
    assert via_link.rc == 0, via_link
    assert via_link.json()["repaired"] == [f"{BUNDLE}/man/{MAN_PAGES['tool']}"], via_link
    assert tool.read_bytes() == built_in(PAGES["tool"])

    replace_page(storage, "tool", b"# ctx.tool \xe2\x80\x94 stale once more\n")
    repository = ctx_run("bootstrap", "--json", REPO, env=env)
    assert repository.rc == 0, repository
    assert repository.json()["repaired"] == [f"{BUNDLE}/man/{MAN_PAGES['tool']}"], repository
    assert tool.read_bytes() == built_in(PAGES["tool"])
    nothing_to_do(storage)


def test_bootstrap_source_that_is_no_tree_of_pages_is_refused_naming_why_and_changes_nothing(
    storage: Path, tmp_path: Path
) -> None:
    """D-1, R-5: SOURCE naming the storage root, the bundle itself, the pages' directory
    instead of the tree, a copy whose ``docs/spec`` link dangles, an empty string, or a tree
    holding a page over 1 MiB is refused (EINVAL, exit 2), saying what it lacks or what is
    wrong, and nothing in the storage root changes."""
    oversized = source_tree(tmp_path / "oversized")
    with open(oversized / "docs" / "spec" / MAN_PAGES["model"], "ab") as page:
        page.write(b"y" * (MIB + 1))
    dangling = tmp_path / "dangling"
    (dangling / "docs").mkdir(parents=True)
    (dangling / "docs" / "spec").symlink_to("../cortexfs/manual/pages")
    before = snapshot(storage)
    refusals = {
        str(storage): f"cannot read {storage}/docs/spec/README.md",
        str(storage / BUNDLE): f"cannot read {storage / BUNDLE}/docs/spec/README.md",
        str(SPEC_PAGES): "docs/spec/docs/spec/README.md",
        str(dangling): f"cannot read {dangling}/docs/spec/README.md",
        "": "an empty string names no path",
        str(oversized): f"{MAN_PAGES['model']} (larger than 1048576 bytes)",
    }
    for source, said in refusals.items():
        refused = ctx_run("bootstrap", "--json", source, env=on(storage))
        assert refused.rc == 2, (source, refused)
        error = refused.json()
        assert (error["error"], error["errno"]) == ("EINVAL", 22), refused
        assert said in error["message"], (said, refused)
        assert snapshot(storage) == before, source


def test_bootstrap_source_refuses_a_page_that_is_not_utf8_text(
    storage: Path, tmp_path: Path
) -> None:
    """D-1 (manuals are documents ``ctx man`` reads; docs/tools.md: SOURCE's pages are read
    only as regular files of at most 1 MiB): an administrator's tree whose agent page is not
    UTF-8 text would install a page ``ctx man`` always passes over for the built-in copy; the
    tree is refused (EINVAL, exit 2) naming the page, and the bundle is unchanged."""
    tree = source_tree(tmp_path / "tree")
    (tree / "docs" / "spec" / MAN_PAGES["agent"]).write_bytes(b"# ctx.agent \xff\xfe latin-1\n")
    before = snapshot(storage / BUNDLE)
    done = ctx_run("bootstrap", "--json", tree, env=on(storage))
    assert snapshot(storage / BUNDLE) == before, done
    assert done.rc == 2, done
    assert done.json()["error"] == "EINVAL" and MAN_PAGES["agent"] in done.json()["message"]


def _no_more_than_a_gibibyte() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1024 * MIB, 1024 * MIB))


@pytest.mark.parametrize("pyproject", ["fifo", "link to /dev/zero"])
def test_bootstrap_source_whose_pyproject_is_no_regular_file_answers_at_once_with_einval(
    storage: Path, tmp_path: Path, pyproject: str
) -> None:
    """D-1, docs/tools.md (SOURCE's pages are read only as regular files of at most 1 MiB; a
    FIFO is EINVAL, exit 2, before anything changes): the version SOURCE declares is read the
    same way — a ``pyproject.toml`` that is a FIFO or a link to an endless device is refused
    at once, EINVAL, exit 2, and the storage root is unchanged."""
    tree = source_tree(tmp_path / "tree")
    declared = tree / "pyproject.toml"
    if pyproject == "fifo":
        os.mkfifo(declared)
    else:
        declared.symlink_to("/dev/zero")
    before = snapshot(storage)
    proc = subprocess.Popen([*CTX_ARGV, "bootstrap", "--json", str(tree)], env=on(storage),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            preexec_fn=_no_more_than_a_gibibyte)  # fmt: skip
    wchan = Path(f"/proc/{proc.pid}/wchan")

    def waiting_on_the_fifo() -> bool:
        with contextlib.suppress(OSError):
            return wchan.read_text() == "wait_for_partner"
        return False

    wait_for(lambda: proc.poll() is not None or waiting_on_the_fifo(), 30, 0.02)
    if proc.poll() is None:
        proc.kill()
        proc.communicate()
        pytest.fail("ctx bootstrap SOURCE waits on SOURCE/pyproject.toml, a FIFO")
    out, err = proc.communicate()
    assert snapshot(storage) == before
    assert proc.returncode == 2, err.decode()
    assert json.loads(out)["error"] == "EINVAL", out


# ------------------------------------------------------------- the mount and agents


def make_agent(root: Path, name: str, **shared: list[str]) -> None:
    """Agent ``name`` (label ``<name>_t``, uid nobody) with fs.read and fs.list in both layers
    of P-6, and the ``shared`` grants given."""
    request: dict = {"name": name, "label": f"{name}_t", "tools": ["fs.read", "fs.list"]}
    if shared:
        request["shared"] = {space.replace("_", "-"): perms for space, perms in shared.items()}
    made = ctx_run("agent", "create", "-", input=json.dumps(request), env=on(root))
    assert made.rc == 0, made
    for tool in request["tools"]:
        with open(root / "tool" / f"{tool}.d" / "policy", "a") as policy:
            policy.write(f"allow {name}_t tool:{tool} execute\n")


@needs_root
@needs_fuse_as_root
def test_ctx_man_reads_the_bundle_through_an_agents_mounted_view_and_sees_repairs_at_once(
    searchable_storage: Path,
) -> None:
    """D-1, F-1, T-5: run as the agent's uid with the agent's mounted view as its storage root,
    ``ctx man`` lists every topic as installed from the view (``VIEW/shared/cortexfs-docs/…``)
    with this version's text and no note; a page tampered in the storage root shows at once
    through the view, with the note; once ``ctx bootstrap`` rebuilds it, the view gives this
    version's page again, with no note."""
    root = searchable_storage
    make_agent(root, "reader")
    view = new_scratch_dir(SCRATCH, "view-") / "ctx"
    as_agent = [*CTX_ARGV, "man", "--storage", str(view)]
    with ctx_mount(root, view, "--as", "reader"):
        listing = as_uid(NOBODY, [*as_agent, "--json"], clean_env())
        assert (listing.returncode, listing.stderr) == (0, ""), listing
        assert [(e["topic"], e["origin"], e["path"]) for e in json.loads(listing.stdout)] == [
            (topic, "installed", str(view / BUNDLE / rel)) for topic, rel in PAGES.items()
        ], listing.stdout
        for topic, rel in PAGES.items():
            shown = as_uid(NOBODY, [*as_agent, topic], clean_env())
            assert (shown.returncode, shown.stdout, shown.stderr) == (
                0, built_in(rel).decode(), ""), topic  # fmt: skip

        tampered = built_in(PAGES["session"]).replace(b"session", b"SESSION", 1)
        replace_page(root, "session", tampered)
        stale = as_uid(NOBODY, [*as_agent, "session"], clean_env())
        assert (stale.returncode, stale.stdout) == (0, tampered.decode()), stale
        assert "is not the page of this version of ctx" in stale.stderr, stale.stderr

        rebuilt = ctx_run("bootstrap", env=on(root))
        assert rebuilt.rc == 0, rebuilt
        fresh = as_uid(NOBODY, [*as_agent, "session"], clean_env())
        assert (fresh.returncode, fresh.stderr) == (0, ""), fresh
        assert fresh.stdout == built_in(PAGES["session"]).decode()
    shutil.rmtree(view.parent, ignore_errors=True)


@needs_root
def test_a_shared_cortexfs_docs_read_rule_changes_nothing_an_agent_sees_or_reads(
    searchable_storage: Path,
) -> None:
    """D-1 (manuals grant nothing), X-2, T-5 (docs/mount.md: an agent's ``shared/`` shows the
    spaces its policy lets it read, and the manual bundle): of two agents, one granted
    ``shared:cortexfs-docs read`` and one not, each lists ``/ctx/shared`` as the bundle alone,
    lists the same pages and reads each page as ``ctx man`` prints it; their ``CTX_PATH`` holds
    nothing of the bundle."""
    root = searchable_storage
    make_agent(root, "plain")
    make_agent(root, "granted", cortexfs_docs=["read"])
    seen = {}
    for agent in ("plain", "granted"):

        def run(*argv: str, agent: str = agent):
            return ctx_run("run", "--agent", agent, *argv, env=on(root))

        shared = run("fs.list", "/ctx/shared")
        assert (shared.rc, shared.out) == (0, "cortexfs-docs/\n"), shared
        pages = run("fs.list", "/ctx/shared/cortexfs-docs/man")
        assert pages.rc == 0 and pages.lines() == sorted(MAN_PAGES.values()), pages
        for rel in (PAGES["README"], PAGES["agent"]):
            read = run("fs.read", f"/ctx/shared/cortexfs-docs/{rel}")
            assert (read.rc, read.out) == (0, built_in(rel).decode()), (agent, rel, read)
        shown = ctx_run("agent", "show", agent, "--json", env=on(root))
        assert shown.rc == 0, shown
        assert "cortexfs-docs" not in shown.json()["ctx_path"], shown.json()["ctx_path"]
        seen[agent] = (shared.out, pages.out)
    assert seen["plain"] == seen["granted"]


@needs_root
def test_policy_explain_tells_an_agent_without_a_rule_that_it_may_read_the_manual(
    searchable_storage: Path,
) -> None:
    """D-1, X-2, P-5 (``ctx policy explain`` walks the chain the view and the tools apply):
    for an agent with no ``shared:cortexfs-docs`` rule, which lists and reads the bundle, the
    explanation of reading ``shared:cortexfs-docs`` ends in ``allow`` (exit 0), as it does for
    an agent granted the rule that grants nothing more."""
    root = searchable_storage
    make_agent(root, "plain")
    make_agent(root, "granted", cortexfs_docs=["read"])
    read = ctx_run("run", "--agent", "plain", "fs.read",
                   f"/ctx/shared/cortexfs-docs/{PAGES['agent']}", env=on(root))  # fmt: skip
    assert (read.rc, read.out) == (0, built_in(PAGES["agent"]).decode()), read
    granted = ctx_run("policy", "explain", "granted", "shared:cortexfs-docs", "read", env=on(root))
    assert granted.rc == 0 and granted.lines()[-1] == "allow", granted
    plain = ctx_run("policy", "explain", "plain", "shared:cortexfs-docs", "read", env=on(root))
    assert (plain.rc, plain.lines()[-1]) == (0, "allow"), plain
