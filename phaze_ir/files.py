"""Reading an input file without hanging or running out of memory.

A path given as a hardware description, a space or a cache entry may be anything the file
system holds: a FIFO (opening it blocks until a writer comes), ``/dev/zero`` (endless), a
device, or a regular file of several GB.  :func:`read_regular` reads only a regular file of at
most ``limit`` bytes, and says in a :class:`RefusedFile` why it will not read anything else,
before reading it.

And :func:`excerpt`, how an error message quotes what it read: a name, a key or a value the user
wrote may be megabytes long (one line of a file, a flag), and a message echoes at most a short
excerpt of it.  (Here, not in :mod:`phaze_ir.errors`: the hardware loader and ``passes.algorithms``
use it too, and they import no xDSL.)
"""

from __future__ import annotations

import errno
import os
import re
import stat

#: The most characters of the user's input an error message quotes: enough to recognise a name
#: or a value, short enough that a message stays one readable line (a terminal's width).
EXCERPT_CHARS = 80

#: The most characters of a message written by code that is not phaze's (xDSL's parser, a model
#: file's exception) after :func:`shorten` has cut its long words: many short words quoted from
#: the input (a list of 100,000 undefined names) are cut here.
MESSAGE_CHARS = 1000


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """``text`` as an error message quotes it: whole when it has at most ``limit`` characters,
    else its first ``limit`` characters and "…" (which says that it was cut)."""
    return text if len(text) <= limit else text[:limit] + "…"


_SI_PREFIXES = ((10**18, "E"), (10**15, "P"), (10**12, "T"), (10**9, "G"), (10**6, "M"), (10**3, "k"))


def si_count(n: int) -> str:
    """A count as a message says it: up to 99,999 in full with thousands separators
    (``4,096``); longer, to 3 significant digits with an SI prefix (powers of 1000: k, M, G, T,
    P, E) and the exact value after it, ``2.15 G (2,147,483,647)``, so that a long number is
    read at a glance and still exact."""
    if abs(n) < 100_000:
        return f"{n:,}"
    for scale, prefix in _SI_PREFIXES:
        if abs(n) >= scale:
            return f"{n / scale:.3g} {prefix} ({n:,})"
    return f"{n:,}"


def printable(text: str) -> str:
    """``text`` as a message prints it: every character a terminal acts on (a control character
    such as a newline, a carriage return or the escape that starts a colour code; a line or
    paragraph separator; a bidirectional override; any other character Python does not call
    printable) written as Python writes it in a string literal (``\\n``, ``\\r``, ``\\x1b``,
    ``\\u202e``).  A file name, a value or a key quoted from the input then prints as its
    characters: it cannot colour the terminal, move the cursor, or forge a second ``error:``
    line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _ESCAPES.get(c) or _escaped(c) for c in text)


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


_LONG_WORD = re.compile(r"\S{" + str(EXCERPT_CHARS + 1) + ",}")


def shorten(message: str) -> str:
    """A message that may quote the input whole (xDSL's ``Operation <name> is not registered``),
    its quotes cut: each run of more than ``EXCERPT_CHARS`` non-blank characters as
    :func:`excerpt` cuts it (but one holding "…", an excerpt already, with its quotes and
    punctuation), then the whole to at most ``MESSAGE_CHARS`` characters."""
    if len(message) <= EXCERPT_CHARS:
        return message
    cut = _LONG_WORD.sub(lambda m: m.group() if "…" in m.group() else excerpt(m.group()), message)
    return excerpt(cut, MESSAGE_CHARS)


class RefusedFile(OSError):
    """A file :func:`read_regular` will not read: not a regular file, or too large (its
    ``strerror`` says which, as a phrase that follows the file's name)."""


def read_regular(path: str | os.PathLike[str], limit: int, kind: str = "file") -> bytes:
    """The bytes of the regular file ``path``; a :class:`RefusedFile` when it is not a regular
    file (``kind`` names what was expected there, e.g. ``"TOML file"``) or holds more than
    ``limit`` bytes (an :class:`OSError` when it cannot be opened).  The file is opened
    non-blocking, so a FIFO is refused, not waited on."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise RefusedFile(errno.EISDIR, f"is a directory, expected a {kind}", os.fspath(path))
        if not stat.S_ISREG(st.st_mode):
            raise RefusedFile(errno.EINVAL, f"is not a regular file, expected a {kind}", os.fspath(path))
        if st.st_size > limit:
            raise RefusedFile(errno.EFBIG, _too_large(st.st_size, limit, kind), os.fspath(path))
        chunks = []
        size = 0
        while size <= limit:  # the file may grow while it is read: never past the limit
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise RefusedFile(errno.EFBIG, _too_large(size, limit, kind), os.fspath(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def _too_large(size: int, limit: int, kind: str) -> str:
    return f"holds {_bytes(size)}, more than the {_bytes(limit)} a {kind} may hold"


def _bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"
