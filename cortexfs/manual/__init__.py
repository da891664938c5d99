"""The manual bundle ``shared/cortexfs-docs/`` and ``ctx man`` (SPEC R-5, X-2, §12 D-1).

The pages ship with the package in ``pages/`` (``README.md`` and one ``ctx.<topic>.md`` per
topic): that is the built-in copy, and the repository's ``docs/spec/`` is the same directory.
``ctx bootstrap`` installs them as ``shared/cortexfs-docs/README.md`` and
``shared/cortexfs-docs/man/ctx.<topic>.md``, read-only (0444), from the built-in copy or, with
``ctx bootstrap SOURCE``, from ``SOURCE/docs/spec/`` of a source tree.  A page whose bytes
differ from its source is stale and replaced, atomically: a reader sees the old page or the
new one, never a mixture; so is one another uid than the storage root's owner (or root) owns,
and a link, FIFO or socket in a page's place.  The two directories are given back their mode
(0755) and owner before a page is written in them (:mod:`cortexfs.bootstrap_repair`).  Each
page is a step of its own: one that cannot be written (a full disk, a file-size limit, an
immutable page or ``man/``) is a problem naming that page, and the others are installed.
``man/`` mirrors the pages installed: a ``ctx.*.md`` there that is not one of them (a page an
older release had) is removed.  Anything else in the bundle is left alone.

``ctx bootstrap SOURCE`` is for rebuilding the bundle from the source tree ctx was installed
from (D-1: "a stale bundle is rebuilt from the tree of the matching version"), and refuses,
before anything changes, a tree whose pages would be stale as soon as installed.  The version
its ``pyproject.toml`` declares tells two releases apart only when they declare different
ones, and every release so far has declared the same: so a tree that declares this ctx's
version must also hold this ctx's pages, byte for byte (the tree of the same release does, its
``docs/spec/`` being the very directory ctx was built with), and one whose pages differ is
refused naming them.  A tree that declares no version (the pages alone, no ``pyproject.toml``)
is an administrator's own pages, taken as they are.

``ctx man TOPIC`` reads the installed page and falls back to the built-in copy when there is
none.  Topics are short aliases (``agent``) of the page names (``ctx.agent.md``), which keep
the ``ctx.*.md`` namespace on disk; ``README`` (also ``readme``, ``README.md``) is the bundle's
``README.md``.  The pages are documents: reading them grants nothing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from cortexfs import __version__, beneath, bootstrap_repair, durable, storage
from cortexfs.errors import CtxError, invalid, not_found
from cortexfs.file_attributes import attribute_refusal, entry_attribute_refusal
from cortexfs.regular_file import read_regular_file

BUNDLE = storage.DOCS_BUNDLE
README = "README.md"
TOPICS = ("agent", "tool", "model", "coreutils", "root-abi", "session", "provider")
PAGE_MODE = 0o444
DIRECTORY_MODE = 0o755
BUILT_IN = Path(__file__).parent / "pages"
SOURCE_PAGES = Path("docs") / "spec"  # where a source tree keeps the pages
_MAX_PAGE_BYTES = 1024 * 1024
# Never through a symlink, and never waiting on a FIFO someone put in a page's place: what is
# opened is checked to be a regular file before it is read.
_READ_PAGE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


# The bundle's README.md is a topic too: ``ctx man README`` (or ``readme``, ``README.md``).
README_TOPIC = "README"
ALL_TOPICS = (README_TOPIC, *TOPICS)


def page_name(topic: str) -> str:
    return README if topic == README_TOPIC else f"ctx.{topic}.md"


def topic_of(name: str) -> str:
    """The topic a user names: ``agent``, ``ctx.agent`` or ``ctx.agent.md``; ``README`` in
    any case, with or without ``.md``, for the bundle's README (a file name, which users
    spell as their systems show it)."""
    if name.lower() in (README_TOPIC.lower(), README.lower()):
        return README_TOPIC
    topic = name.removesuffix(".md").removeprefix("ctx.")
    if topic not in TOPICS:
        raise not_found(f"no manual page {name!r}; the topics are {', '.join(ALL_TOPICS)}")
    return topic


class Pages(NamedTuple):
    """The contents of a bundle: its README and each topic's page."""

    readme: bytes
    man: dict[str, bytes]  # topic -> page

    @classmethod
    def load(cls, directory: Path) -> Pages:
        """The pages in ``directory`` (flat: ``README.md`` and ``ctx.<topic>.md``)."""
        return cls(
            _read_page(directory / README),
            {topic: _read_page(directory / page_name(topic)) for topic in TOPICS},
        )


def built_in_pages() -> Pages:
    return Pages.load(BUILT_IN)


def source_pages(source: Path) -> Pages:
    """The pages of source tree ``source``; EINVAL naming the first one it lacks."""
    try:
        return Pages.load(source / SOURCE_PAGES)
    except OSError as exc:
        raise invalid(
            f"{source} is not a CortexFS source tree: cannot read {exc.filename} "
            f"({exc.strerror}); SOURCE must hold the manual pages in {SOURCE_PAGES}/"
        ) from None


def _read_page(path: Path) -> bytes:
    """A page's bytes, read only from a regular file: a link in a SOURCE tree could lead to a
    file its owner may not read, which would become a page everyone reads, and a FIFO would
    block bootstrap for good."""
    try:
        data = read_regular_file(path, _MAX_PAGE_BYTES)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "a symbolic link, never followed", str(path)) from None
        raise
    try:
        data.decode("utf-8")  # installed, it would be passed over by every reader of it
    except UnicodeDecodeError as exc:
        raise OSError(errno.EILSEQ, f"byte {exc.start} is not UTF-8 text", str(path)) from None
    return data


# ---------------------------------------------------------------------------------- install


def check_source(source: Path | None) -> None:
    """Refuse an unusable SOURCE before bootstrap changes anything: one without the pages, or
    the tree of another version of CortexFS (D-1: a stale bundle is rebuilt from the tree of
    the matching version; another version's pages would be stale as soon as installed).

    Another version is one that declares another, or declares this one and holds other
    pages: releases have not changed the declared version, so only the pages themselves tell
    an older tree from this one's."""
    if source is None:
        return
    pages = source_pages(source)
    version = source_version(source)
    if version is None:
        return  # a tree of the pages alone: the administrator's own, taken as they are
    if version != __version__:
        raise invalid(
            f"{source} is the source tree of cortexfs {version}, but this ctx is {__version__}: "
            f"its manual pages are not this version's (D-1); give the tree of cortexfs "
            f"{__version__}, or run 'ctx bootstrap' without SOURCE for the pages built into ctx"
        )
    differing = pages_differing(pages, built_in_pages())
    if differing:
        shown = ", ".join(str(SOURCE_PAGES / name) for name in differing)
        shown += " differs" if len(differing) == 1 else " differ"
        raise invalid(
            f"{source} declares cortexfs {version}, as this ctx does, but its manual pages are "
            f"not this ctx's ({shown}): it is the tree of another release, whose pages "
            "would be stale as soon as installed (D-1); nothing was changed: run 'ctx "
            "bootstrap' without SOURCE for the pages built into this ctx, or install the ctx of "
            "that tree and bootstrap with it"
        )


def pages_differing(pages: Pages, others: Pages) -> list[str]:
    """The names of the pages (``README.md``, ``ctx.<topic>.md``) whose bytes differ."""
    differing = [README] if pages.readme != others.readme else []
    return differing + [
        page_name(topic) for topic in TOPICS if pages.man[topic] != others.man[topic]
    ]


def source_version(source: Path) -> str | None:
    """The version ``SOURCE/pyproject.toml`` declares (``[project] version``); None when it
    declares none, or has no such file (a tree of the pages alone)."""
    import tomllib

    try:
        # As a page is read: a FIFO there would block bootstrap for good, and a link to
        # /dev/zero fill its memory.
        data = read_regular_file(source / "pyproject.toml", _MAX_PAGE_BYTES)
        project = tomllib.loads(data.decode("utf-8")).get("project", {})
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise invalid(
            f"{source}/pyproject.toml cannot be read ({exc.strerror}): SOURCE must be a "
            "CortexFS source tree, whose pyproject.toml is a regular file"
        ) from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise invalid(f"{source}/pyproject.toml cannot be read as TOML ({exc})") from None
    version = project.get("version") if isinstance(project, dict) else None
    return version if isinstance(version, str) else None


def install_bundle(root: Path, source: Path | None, report: storage.BootstrapReport) -> None:
    """The bootstrap step: create the bundle, replace its stale pages, report what changed.
    What keeps the bundle from being made is a problem naming it; each page is a step of its
    own (:func:`_install_page`)."""
    with report.step(f"shared/{BUNDLE}"):
        _install_bundle(root, built_in_pages() if source is None else source_pages(source), report)


def _install_bundle(root: Path, pages: Pages, report: storage.BootstrapReport) -> None:
    ops = durable.default_ops()
    try:
        shared_fd = durable.open_dir_path(ops, str(root / "shared"))
    except (OSError, CtxError):
        return  # ensure_root_abi has reported what is in the way of shared/
    owner = bootstrap_repair.storage_owner(root)
    if bootstrap_repair.untrusted(os.fstat(shared_fd), owner):
        # Whoever else could change shared/ could swap the bundle for their own pages, which
        # every agent reads: nothing is written there (the root's step reports shared/).
        ops.close(shared_fd)
        return
    try:
        bundle_fd = _open_bundle_dir(ops, shared_fd, BUNDLE, f"shared/{BUNDLE}", owner, report)
    finally:
        ops.close(shared_fd)
    if bundle_fd is None:
        return
    try:
        where = f"shared/{BUNDLE}"
        bootstrap_repair.sweep_temporaries(ops, bundle_fd, [README], where, report)
        _install_page(ops, bundle_fd, README, pages.readme, where, owner, report)
        where = f"shared/{BUNDLE}/man"
        man_fd = _open_bundle_dir(ops, bundle_fd, "man", where, owner, report)
        if man_fd is None:
            return
        try:
            names = [page_name(topic) for topic in pages.man]
            bootstrap_repair.sweep_temporaries(ops, man_fd, names, where, report)
            for topic, page in pages.man.items():
                _install_page(ops, man_fd, page_name(topic), page, where, owner, report)
            with report.step(where):
                _remove_other_pages(
                    ops, man_fd, {page_name(topic) for topic in pages.man}, where, report
                )
        finally:
            ops.close(man_fd)
    finally:
        ops.close(bundle_fd)


def _remove_other_pages(
    ops: durable.FsOps, man_fd: int, pages: set[str], where: str, report: storage.BootstrapReport
) -> None:
    """Remove each ``ctx.*.md`` of ``man/`` that is not one of ``pages``: ``man/`` mirrors the
    pages of the version installed (D-1), and a page an older release installed and this one
    dropped would be read as current.  Other names (a note someone left) are not pages, and a
    directory is not one either: left, the directory reported."""
    stale = []
    for name in sorted(os.listdir(man_fd)):
        if not (name.startswith("ctx.") and name.endswith(".md")) or name in pages:
            continue
        status = durable.lstat_at(man_fd, name)
        if status is None:
            continue
        if stat.S_ISDIR(status.st_mode):
            report.problems.append(f"{where}/{name}: a directory, not a page; left untouched")
            continue
        stale.append(name)
    if not stale:
        return
    durable.remove_entries(ops, [(man_fd, name, False) for name in stale])
    durable.sync_dir(ops, man_fd)
    report.repaired += [f"{where}/{name} (removed: not a page of this version)" for name in stale]


def _open_bundle_dir(
    ops: durable.FsOps,
    parent_fd: int,
    name: str,
    where: str,
    owner: int,
    report: storage.BootstrapReport,
) -> int | None:
    """The bundle directory ``name``, made when missing or in place of a stand-in, and made
    the storage root's owner's and exactly :data:`DIRECTORY_MODE` when it is not; None (and
    a problem) when something other than a directory holds its name."""
    replaced = bootstrap_repair.remove_stand_in(ops, parent_fd, name)
    # Exactly DIRECTORY_MODE whatever the umask (every agent reads it), set on the new
    # directory's descriptor.  An existing one is given back before a page is written in it:
    # what bootstrap keeps there, it compares byte for byte (:mod:`cortexfs.bootstrap_repair`).
    if durable.make_dir_synced(ops, parent_fd, name, DIRECTORY_MODE, exact_mode=True):
        if replaced:
            report.repaired.append(f"{where} (it was a {replaced})")
        else:
            report.created.append(where)
    else:
        changed = bootstrap_repair.tighten(parent_fd, name, owner, where, mode=DIRECTORY_MODE)
        if changed:
            report.repaired.append(f"{where} ({changed})")
    try:
        return ops.open_dir(name, parent_fd)
    except OSError:
        report.problems.append(f"{where}: exists but is not a directory; left untouched")
        return None


def _install_page(
    ops: durable.FsOps,
    dir_fd: int,
    name: str,
    page: bytes,
    where: str,
    owner: int,
    report: storage.BootstrapReport,
) -> None:
    """Page ``name`` of ``dir_fd`` (``where`` in the root) made, or replaced when stale.  A
    step of its own (R-5 repairs what it can): a page that cannot be written (a full disk,
    an immutable page) is a problem naming it, and the pages after it are installed all the
    same."""
    shown = f"{where}/{name}"
    with report.step(shown):
        existing = durable.lstat_at(dir_fd, name)
        replaced = ""
        if existing is not None:
            if stat.S_ISDIR(existing.st_mode):
                report.problems.append(f"{shown}: a directory, not a page; left untouched")
                return
            kind = bootstrap_repair.stand_in(existing)
            if kind:
                # The bundle is the system's: a link, FIFO or socket at a page's name is
                # replaced by the page, the rename never following it to what it names.
                replaced = f" (it was a {kind})"
            elif (
                stat.S_IMODE(existing.st_mode) == PAGE_MODE
                and existing.st_uid in (0, owner)  # else its owner could chmod it and rewrite it
                and _read_at(dir_fd, name, page) == page
            ):
                return
        try:
            durable.replace_file_synced(ops, dir_fd, name, page, PAGE_MODE)
        except OSError as exc:
            raise _not_written(exc, dir_fd, name, report.root / shown) from None
        (report.created if existing is None else report.repaired).append(f"{shown}{replaced}")


def _not_written(exc: OSError, dir_fd: int, name: str, path: Path) -> OSError | CtxError:
    """The error of page ``name`` of ``dir_fd`` (``path``) that could not be written: the
    kernel names the temporary file the page was written to, removed by now, or nothing at
    all (a full disk refuses a ``write``), where the page is what was not installed.  An
    EPERM that an attribute of the page or of its directory explains names that attribute
    and the ``chattr`` that lifts it: no mode explains it, to root least of all."""
    if exc.errno == errno.EPERM:
        action = f"write the manual page {name}"
        refused = entry_attribute_refusal(dir_fd, name, action, path)
        if refused is not None:
            return refused
        with contextlib.suppress(OSError):
            directory_fd = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
            refused = attribute_refusal(directory_fd, action, path.parent)  # closes it
        if refused is not None:
            return refused
    return OSError(exc.errno, exc.strerror, str(path))


def _read_at(dir_fd: int, name: str, expected: bytes) -> bytes | None:
    """The installed page, as far as it could equal ``expected``; None when unreadable."""
    try:
        fd = os.open(name, _READ_PAGE, dir_fd=dir_fd)
    except OSError:
        return None
    with open(fd, "rb") as page:
        return page.read(len(expected) + 1)


storage.register_bootstrap_step(install_bundle, check_source=check_source)


# ------------------------------------------------------------------------------------- read


class Manual(NamedTuple):
    """One page as ``ctx man`` shows it, and where it came from."""

    topic: str
    text: str
    path: Path | None  # the installed page read; None for the built-in copy
    why_built_in: str = ""  # for the built-in copy: why no installed page was read

    @property
    def origin(self) -> str:
        return "built-in" if self.path is None else "installed"

    def differs_from_built_in(self) -> bool:
        """Whether an installed page is not the copy this version of ctx carries: the
        bundle is out of line with it (D-1), and 'ctx bootstrap' puts it back in line."""
        if self.path is None:
            return False
        pages = built_in_pages()
        built_in = pages.readme if self.topic == README_TOPIC else pages.man[self.topic]
        return self.text != _decode(built_in, BUILT_IN)


def installed_page(root: Path, topic: str) -> Path:
    if topic == README_TOPIC:
        return root / "shared" / BUNDLE / README
    return root / "shared" / BUNDLE / "man" / page_name(topic)


def read_manual(root: Path | None, name: str) -> Manual:
    """Topic ``name``'s page: the installed one when there is one, else the built-in copy.

    The installed page is opened without following a symlink and must be a regular file of
    UTF-8 text; anything else there is passed over for the built-in copy, and
    ``why_built_in`` says what was found.
    """
    topic = topic_of(name)
    why = "there is no storage root"
    if root is not None:
        path = installed_page(root, topic)
        text, why = _read_installed(root, path)
        if text is not None:
            return Manual(topic, text, path)
    pages = built_in_pages()
    built_in = pages.readme if topic == README_TOPIC else pages.man[topic]
    return Manual(topic, _decode(built_in, BUILT_IN), None, why)


_MOVE_IT = "move it away; 'ctx bootstrap' then installs the page"


def _read_installed(root: Path, path: Path) -> tuple[str | None, str]:
    """The text of the installed page at ``path`` in ``root``, or None and why it cannot be
    shown.  No link below the root is followed: not the page, nor ``man/`` or the bundle in
    its place, which bootstrap would replace and an agent's view does not show.  The
    directories on the way are only searched (``O_PATH``): a reader who may pass through one
    (mode 0711) but not list it reads the page as ``cat`` would."""
    top = Path(os.path.realpath(root))  # the root itself may be reached through a link
    relative = PurePosixPath(path.relative_to(root))
    try:
        data = beneath.read_file(top, relative, _MAX_PAGE_BYTES)
    except FileNotFoundError:
        return None, f"no page is installed at {path} ('ctx bootstrap' installs the bundle)"
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a link, on the way or at the page
            link = _link_on_the_way(top, relative)
            if link is not None:
                return None, f"{root / link} is a symbolic link, never followed ({_MOVE_IT})"
        if exc.errno == errno.EINVAL:  # a directory, FIFO, socket or device
            return None, f"{path} is not a regular file ({_MOVE_IT})"
        if exc.errno == errno.EFBIG:  # shown cut short, the page would seem whole
            return None, f"{path} is larger than {_MAX_PAGE_BYTES} bytes, more than any page"
        return None, f"{path} cannot be read ({exc.strerror})"
    try:
        return data.decode("utf-8"), ""
    except UnicodeDecodeError:
        return None, f"{path} is not UTF-8 text ('ctx bootstrap' replaces it)"


def _link_on_the_way(top: Path, relative: PurePosixPath) -> str | None:
    """The path below ``top`` of the link a walk to ``relative`` ended at, if it did."""
    try:
        ended = beneath.walk(top, relative)[-1]
    except OSError:
        return None
    return ended.shown if ended.is_link else None


def _decode(data: bytes, where: Path) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CtxError(errno.EILSEQ, f"{where}: the manual page is not UTF-8 ({exc})") from None


def summary(page: str) -> str:
    """A page's one-line summary: its first heading, without the ``#``."""
    for line in page.splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return ""
