"""``fs.write``: write a whole file inside the agent's writable mounts, atomically (SPEC R-5).

Input ``{"path": str, "content": str, "encoding": "utf-8"|"base64" = "utf-8",
"overwrite": bool = true}``.  The new contents go to a hidden temporary file in the same
directory, are fsynced, and replace the file in one rename (or, with ``overwrite`` false, are
moved in without replacing anything: EEXIST when the file exists); the directory is synced
before the tool answers, through :mod:`cortexfs.durable` (its whole filesystem, where the
agent may write and search the directory but not read it: a drop box).  A replaced file keeps
its permission bits whatever the umask (never setuid, setgid or sticky bits); a new one gets
0644 less the umask.  Native output ``{"path", "bytes", "created"}``.

The shorthand ``fs.write PATH < FILE`` takes the contents from stdin: it stands for
``{"path": PATH, "content": …}``, UTF-8 text as it is, other bytes in base64.  Nothing on
stdin (empty, or a terminal) is no content, refused like a JSON object without ``content``:
an empty file is written with ``{"path": PATH, "content": ""}``, never by accident.
"""

from __future__ import annotations

import base64
import binascii
import errno
import os
import stat

from cortexfs import durable
from cortexfs.file_attributes import refusing_attribute
from cortexfs.tools.core import confine
from cortexfs.tools.core.toolio import (
    Reply,
    ToolFailure,
    core_main,
    main_parameter,
    read_stdin,
    require,
)

MAX_CONTENT_BYTES = 16 * 1024 * 1024


def write(request: dict[str, object], native: bool) -> Reply:
    view = confine.View.from_environment(os.environ)
    place = view.locate(require(request, "path", str), write=True)
    data = _content(request)
    overwrite = require(request, "overwrite", bool, True)
    ops = durable.default_ops()
    parent = confine.open_parent(place, writable=True)
    try:
        existing = confine.lstat_at(parent, place.name)
        confine.refuse_link(place, existing)
        confine.refuse_file_named_as_directory(place, existing)
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            raise ToolFailure(errno.EISDIR, f"{place.view} is a directory; fs.write writes a file")
        if existing is not None and not stat.S_ISREG(existing.st_mode):
            raise ToolFailure(
                errno.EINVAL,
                f"{place.view} exists and is a {_kind(existing)}, not a regular file; nothing "
                "was written",
            )
        if place.names_directory:
            raise ToolFailure(
                errno.EISDIR, f"{place.view}/ names a directory; fs.write writes a file"
            )
        if existing is not None and not overwrite:
            raise ToolFailure(errno.EEXIST, f"{place.view} exists and overwrite is false")
        directory_readable = confine.readable(parent)
        if directory_readable:
            _refuse_append_only(place, parent)
        elif not durable.syncfs_is_a_barrier(parent):
            raise ToolFailure(
                errno.EACCES,
                f"{place.view}: the agent may not read {place.view.parent}, and on its "
                "filesystem only a sync of the directory itself makes a new name durable; "
                "nothing was written",
            )
        # A replacement keeps the permission bits it replaces, whatever this process's umask
        # (a group-writable file in a shared space stays so); never setuid, setgid or sticky
        # bits on content the agent wrote.
        mode = existing.st_mode & 0o777 if existing else 0o644
        # Root (a person running the tool, an agent with uid 0) keeps the owner and group of
        # the file it replaces, as GNU sed -i does: another user's file stays theirs.
        owned_by = existing if existing is not None and os.geteuid() == 0 else None
        temporary = _temporary_name(place.name)
        with confine.reporting(place):
            # In a drop box, the new file's own descriptor is the way to sync its filesystem.
            written = durable.write_file_synced(
                ops,
                parent,
                temporary,
                data,
                mode,
                exact_mode=existing is not None,
                owner=None if owned_by is None else owned_by.st_uid,
                owner_group=-1 if owned_by is None else owned_by.st_gid,
                keep_open=not directory_readable,
            )
            try:
                # With overwrite, a file another writer made since the look above is replaced
                # as one found there would be: the call asked for this content at the name.
                if written is not None:
                    durable.move_synced_through_filesystem(
                        ops, parent, temporary, place.name, written, replace=overwrite
                    )
                elif overwrite:
                    durable.replace_synced(ops, parent, temporary, parent, place.name)
                else:
                    durable.move_noreplace(ops, parent, temporary, parent, place.name)
            except BaseException:
                durable.remove_entries(ops, [(parent, temporary, False)])
                raise
            finally:
                if written is not None:
                    os.close(written)
    finally:
        os.close(parent)
    # A name that is not UTF-8 (as fs.list gives it, "\udce9" for the byte 0xe9) is told
    # in the bytes it has, as fs.list and fs.stat tell it: never a failure after the write.
    text = os.fsencode(f"wrote {len(data)} bytes to {place.view}\n")
    return Reply(
        {"path": str(place.view), "bytes": len(data), "created": existing is None}, text=text
    )


def _refuse_append_only(place: confine.Place, parent: int) -> None:
    """EPERM, before anything is written, when the directory holding ``place`` (open as
    ``parent``) is append-only: it would let the temporary file in, and neither move it to
    its name nor remove it again.  (An immutable one refuses the temporary file itself.)"""
    attribute = refusing_attribute(parent)
    if attribute is None or attribute.letter != "a":
        return
    raise ToolFailure(
        errno.EPERM,
        f"{place.view}: {place.view.parent} is {attribute.name} (attribute "
        f"'{attribute.letter}', which 'lsattr -d' shows): {attribute.in_directory}, by root "
        "too, so the temporary file fs.write writes first could not be renamed to its name; "
        f"nothing was written; have root lift it with 'chattr -{attribute.letter}' on that "
        "directory",
    )


# The longest name a directory entry may have (NAME_MAX of Linux's filesystems), in bytes.
_NAME_MAX = 255


def _temporary_name(name: str) -> str:
    """A hidden name beside ``name`` for its new contents: ``name``'s own with a random part,
    or the random part alone where that would pass :data:`_NAME_MAX` (a legal name of 238
    bytes or more could not be written)."""
    random_part = f".{os.urandom(6).hex()}.tmp"
    temporary = f".{name}{random_part}"
    return temporary if len(os.fsencode(temporary)) <= _NAME_MAX else f".fs.write{random_part}"


def _kind(status: os.stat_result) -> str:
    """A word for what is at a name that is no regular file nor directory."""
    for test, word in (
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
    ):
        if test(status.st_mode):
            return word
    return "special file"


def path_and_stdin(arguments: list[str]) -> dict[str, object]:
    """``fs.write PATH < FILE``: the request for PATH with what arrives on stdin."""
    request = main_parameter("path")(arguments)
    data = read_stdin(MAX_CONTENT_BYTES, "content")
    if not data:
        # An empty or absent stdin is far more often a forgotten redirection than a wish to
        # empty the file: replacing it would lose its contents.
        raise ToolFailure(
            errno.EINVAL,
            "'content' is required: pipe the new contents on stdin (fs.write PATH < FILE), "
            'or give {"path": …, "content": …} (an empty file: "content": "")',
            usage=True,
        )
    try:
        return {**request, "content": data.decode("utf-8"), "encoding": "utf-8"}
    except UnicodeDecodeError:
        return {**request, "content": base64.b64encode(data).decode("ascii"), "encoding": "base64"}


def _content(request: dict[str, object]) -> bytes:
    content = require(request, "content", str)
    encoding = require(request, "encoding", str, "utf-8")
    if encoding == "utf-8":
        data = content.encode()
    elif encoding == "base64":
        try:
            data = base64.b64decode(content, validate=True)
        except binascii.Error as exc:
            raise ToolFailure(errno.EINVAL, f"content is not base64: {exc}", usage=True) from None
    else:
        raise ToolFailure(errno.EINVAL, "encoding must be 'utf-8' or 'base64'", usage=True)
    if len(data) > MAX_CONTENT_BYTES:
        raise ToolFailure(errno.EFBIG, f"content is larger than {MAX_CONTENT_BYTES} bytes")
    return data


def run() -> int:
    return core_main("fs.write", path_and_stdin, write)
