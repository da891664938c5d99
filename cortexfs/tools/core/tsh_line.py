"""Reading one command line at a terminal, whole, however long it is.

In its canonical mode the terminal driver edits a line for the program that reads it, but
keeps at most 4095 bytes of it (Linux's ``N_TTY_BUF_SIZE`` less the line break; POSIX calls the
bound ``MAX_CANON``) and drops what is typed beyond that: an ``agent.update`` of a 6 KiB
prompt, which the host accepts (A-5), would reach tsh cut, as an unclosed quotation.  So while tsh
waits for a line it turns the driver's canonical mode, echo and extended input processing off
and does their work itself, as line editors do: it echoes what is typed, erases a character
(``VERASE``), a word (``VWERASE``) or the line (``VKILL``), and ends the input at ``VEOF`` on an
empty line.  Signals stay the driver's: Ctrl-C is SIGINT, shown as ``^C``.  The terminal's
mode is put back before the line runs, so every tool finds the terminal as it was.

The reader takes one byte at a time and stops at the line break: what is typed after it
belongs to the tool the line runs (its stdin), not to tsh.  What tsh reads it echoes, as a
line editor does, so a line typed ahead while a tool ran is shown again after the prompt.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import termios

MAX_LINE_BYTES = 1 << 20  # a command line longer than this is refused, not held in memory
_IFLAG, _OFLAG, _CFLAG, _LFLAG, _ISPEED, _OSPEED, _CC = range(7)
_ERASE_ONE = b"\b \b"


class LineTooLong(Exception):
    """A line over :data:`MAX_LINE_BYTES` was typed; it was read to its end and dropped."""


def read_terminal_line(fd: int, echo_fd: int, prompt: bytes) -> bytes | None:
    """The next line typed at terminal ``fd`` after ``prompt``, without its line break; None
    at end of input (``VEOF`` on an empty line, or the terminal gone).  ``echo_fd`` is where
    the prompt and the typing are shown.  KeyboardInterrupt (Ctrl-C) drops the line."""
    saved = termios.tcgetattr(fd)
    editing = list(saved)
    editing[_LFLAG] &= ~(termios.ICANON | termios.ECHO | termios.IEXTEN)
    editing[_CC] = list(saved[_CC])
    editing[_CC][termios.VMIN] = 1
    editing[_CC][termios.VTIME] = 0
    editor = _Editor(fd, echo_fd, saved)
    termios.tcsetattr(fd, termios.TCSANOW, editing)
    try:
        # Only now: what is typed once the prompt shows is edited here, never by the driver.
        os.write(echo_fd, prompt)
        return editor.read()
    except KeyboardInterrupt:
        # Here, not in the editor: a Ctrl-C typed as soon as the prompt showed may land
        # before the editor's first read, and is shown all the same.
        editor.show_interrupt()
        raise
    except OSError as exc:
        if exc.errno != errno.EIO:
            raise
        return None  # the terminal hung up: its other side is closed
    finally:
        with contextlib.suppress(termios.error, OSError):  # a terminal gone keeps no mode
            termios.tcsetattr(fd, termios.TCSANOW, saved)


class _Editor:
    def __init__(self, fd: int, echo_fd: int, mode: list) -> None:
        self.fd = fd
        self.echo_fd = echo_fd
        self.echoes = bool(mode[_LFLAG] & termios.ECHO)
        self.shows_controls = bool(mode[_LFLAG] & termios.ECHOCTL)
        control = mode[_CC]
        self.erase, self.kill, self.word_erase, self.end = (
            _key(control[index])
            for index in (termios.VERASE, termios.VKILL, termios.VWERASE, termios.VEOF)
        )
        self.line_ends = {b"\n", _key(control[termios.VEOL]), _key(control[termios.VEOL2])}
        self.line_ends.discard(None)
        self.line = bytearray()
        self.too_long = False

    def show_interrupt(self) -> None:
        if self.echoes and self.shows_controls:
            os.write(self.echo_fd, b"^C")

    def read(self) -> bytes | None:
        while True:
            byte = os.read(self.fd, 1)
            if not byte:
                return None if not self.line else self._done()
            if byte in self.line_ends:
                self._show(b"\n")
                return self._done()
            if byte == self.end:
                if not self.line:
                    return None
            elif byte == self.erase:
                self._erase(1)
            elif byte == self.kill:
                self._erase(len(self.line))
            elif byte == self.word_erase:
                self._erase(_last_word_length(self.line))
            else:
                self._take(byte)

    def _done(self) -> bytes:
        if self.too_long:
            raise LineTooLong
        return bytes(self.line)

    def _take(self, byte: bytes) -> None:
        if len(self.line) >= MAX_LINE_BYTES:
            self.too_long = True
            return
        self.line += byte
        if byte < b" " and byte != b"\t" and self.shows_controls:
            self._show(b"^" + bytes([byte[0] + 64]))
        else:
            self._show(byte)

    def _erase(self, characters: int) -> None:
        """Drop the last ``characters`` characters, a UTF-8 sequence being one, and wipe
        them from the screen (two columns for a control shown as ``^X``)."""
        for _ in range(characters):
            if not self.line:
                return
            end = len(self.line) - 1
            while end > 0 and 0x80 <= self.line[end] < 0xC0:
                end -= 1  # a continuation byte: the character starts before it
            character = bytes(self.line[end:])
            del self.line[end:]
            wide = character < b" " and character != b"\t" and self.shows_controls
            self._show(_ERASE_ONE * (2 if wide else 1))

    def _show(self, data: bytes) -> None:
        if self.echoes:
            os.write(self.echo_fd, data)


def _key(value: bytes | int) -> bytes | None:
    """A control character of ``termios``' ``cc`` list as one byte; None when disabled."""
    key = value if isinstance(value, bytes) else bytes([value])
    return None if key == b"\0" else key


def _last_word_length(line: bytearray) -> int:
    """How many characters ``VWERASE`` takes: blanks at the end, then the word before them."""
    text = bytes(line).decode("utf-8", "replace")
    kept = text.rstrip(" \t")
    kept = kept[: len(kept) - len(kept.split()[-1])] if kept.split() else kept
    return len(text) - len(kept)


# ------------------------------------------------------------------------------- words

# The words of a line as shlex.split() makes them (POSIX rules: blanks are space, tab, CR and
# LF; a backslash outside quotes takes the next character as it is; nothing is special in
# single quotes; in double quotes a backslash escapes only " and itself), in linear time:
# shlex builds each word a character at a time, which for a word of a megabyte (a line tsh
# accepts) costs tens of seconds.
_PIECE = re.compile(
    r"""(?P<blank>[ \t\r\n]+)
      | (?P<plain>[^ \t\r\n'"\\]+)
      | \\(?P<escaped>.)
      | '(?P<single>[^']*)'
      | "(?P<double>(?:[^"\\]+|\\.)*)"
    """,
    re.DOTALL | re.VERBOSE,
)
_ESCAPED_IN_DOUBLE_QUOTES = re.compile(r'\\(["\\])')
_DOUBLE_QUOTED_PREFIX = re.compile(r'(?:[^"\\]+|\\.)*', re.DOTALL)


def split_words(line: str) -> list[str]:
    """``shlex.split(line)``: the same words, and ValueError with the same message ("No
    closing quotation", "No escaped character") for a line it refuses."""
    words: list[str] = []
    word: list[str] | None = None  # the pieces of the word being read, None between words
    position = 0
    while position < len(line):
        piece = _PIECE.match(line, position)
        if piece is None:
            raise ValueError(_unfinished(line, position))
        position = piece.end()
        kind = piece.lastgroup
        if kind == "blank":
            if word is not None:
                words.append("".join(word))
                word = None
            continue
        text = piece.group(kind)
        if kind == "double":
            text = _ESCAPED_IN_DOUBLE_QUOTES.sub(r"\1", text)
        if word is None:
            word = []
        word.append(text)
    if word is not None:
        words.append("".join(word))
    return words


def _unfinished(line: str, position: int) -> str:
    """Why no word can be read at ``position``: an open quote, or a backslash at the end."""
    if line[position] == "\\":
        return "No escaped character"
    if line[position] == '"':
        inside = _DOUBLE_QUOTED_PREFIX.match(line, position + 1)
        assert inside is not None
        if line[inside.end() :] == "\\":
            return "No escaped character"
    return "No closing quotation"
