"""Writing what phaze produces without ever losing what was there.

Every output file goes to a temporary file beside it and is renamed into place only once it is
complete (a rename within a directory is atomic), so a run that fails or is stopped part-way, a
full disk included, leaves the previous file as it was; a run's several outputs are renamed
only once all of them are complete, so they land together or not at all.  And a run whose
output would be one of its own inputs, or two of whose outputs are the same file, or one of
whose outputs cannot be written, is refused before any work.
"""

from __future__ import annotations

import errno
import os
import sys
import tempfile
from collections.abc import Iterable, Sequence

from phaze_ir.errors import PhazeError

STDOUT = "-"


def write_atomically(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8, ``\\n`` newlines) to ``path`` by way of a temporary file in the
    same directory, renamed into place once complete; a :class:`PhazeError` when it cannot be,
    and then ``path`` is untouched."""
    write_together([(path, text)])


def write_together(files: Sequence[tuple[str | os.PathLike[str], str]]) -> None:
    """Write each ``(path, text)`` (UTF-8, ``\\n`` newlines) as one transaction: every text goes
    to a temporary file beside its path first, and only once all are complete are they renamed
    into place; a :class:`PhazeError` when one cannot be written, and then no path is touched."""
    staged: list[tuple[str, str]] = []  # (temporary file, path)
    try:
        for path, text in files:
            path = os.fspath(path)
            try:
                staged.append((_staged(path, text), path))
            except OSError as e:
                raise PhazeError(f"{path}: cannot write: {e.strerror or e}") from e
        for k, (tmp, path) in enumerate(staged):
            try:
                os.replace(tmp, path)
            except OSError as e:
                written = ", ".join(p for _, p in staged[:k])
                raise PhazeError(
                    f"{path}: cannot write: {e.strerror or e}" + (f" (written: {written})" if written else "")
                ) from e
    finally:
        for tmp, _ in staged:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _staged(path: str, text: str) -> str:
    """A complete temporary file beside ``path`` holding ``text``, with the permissions
    ``path`` has (or a new file would get); none left behind when it cannot be made."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(path):  # keep the permissions of the file it replaces
            os.chmod(tmp, os.stat(path).st_mode & 0o7777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def refuse_clashes(inputs: Iterable[tuple[str, str | None]], outputs: Iterable[tuple[str, str | None]]) -> None:
    """Refuse, in one line, an output (``(flag, path)``; ``None`` or ``-`` for none) that is one
    of the inputs (``(what it is, path)``, e.g. ``("the model file", "m.py")``) or the same file
    as another output: writing it would destroy what the run reads, or what it wrote a moment
    before."""

    def same(a: str, b: str) -> bool:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
        return os.path.realpath(a) == os.path.realpath(b)

    given_inputs = [(flag, p) for flag, p in inputs if p and p != STDOUT]
    seen: list[tuple[str, str]] = []
    for flag, path in outputs:
        if not path or path == STDOUT:
            continue
        for what, in_path in given_inputs:
            if same(path, in_path):
                raise PhazeError(f"{flag} {path} is {what}: refusing to overwrite it")
        for out_flag, out_path in seen:
            if same(path, out_path):
                raise PhazeError(f"{flag} {path} is also {out_flag}: give each output its own file")
        seen.append((flag, path))
        _check_writable(flag, path)


def _check_writable(flag: str, path: str) -> None:
    """An output that cannot be written is said before the run's work, not after it."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise PhazeError(f"{flag} {path}: is a directory, expected a file name")
    if not os.path.isdir(directory):
        raise PhazeError(f"{flag} {path}: cannot write: no directory {directory}")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PhazeError(f"{flag} {path}: cannot write: the directory {directory} is not writable")
    try:  # what os.access cannot tell (a read-only or pseudo file system, such as /proc, as root)
        fd, probe = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    except OSError as e:
        # /proc answers "No such file or directory" for a directory that exists: not said.
        why = "" if e.errno == errno.ENOENT else f" ({e.strerror})"
        raise PhazeError(f"{flag} {path}: cannot write: the directory {directory} takes no new file{why}") from e
    os.close(fd)
    os.unlink(probe)
    if _unreplaceable(path):
        raise PhazeError(f"{flag} {path}: cannot write: the file is immutable or append-only (lsattr shows it)")


#: Linux's FS_IOC_GETFLAGS request and its immutable and append-only flags (linux/fs.h,
#: ``_IOR('f', 1, long)`` on a 64-bit kernel): a file so marked cannot be replaced, not even by
#: root, and no permission bit or probe file in its directory tells it.
_FS_IOC_GETFLAGS = 0x80086601
_FS_NO_REPLACE_FLAGS = 0x00000010 | 0x00000020  # FS_IMMUTABLE_FL | FS_APPEND_FL


def _unreplaceable(path: str) -> bool:
    """Whether the existing file ``path`` is marked immutable or append-only (False where the
    file system or the platform cannot say)."""
    if not sys.platform.startswith("linux") or not os.path.isfile(path):
        return False
    import array
    import fcntl

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        flags = array.array("l", [0])
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, flags, True)
    except OSError:  # a file system without these flags
        return False
    finally:
        os.close(fd)
    return bool(flags[0] & _FS_NO_REPLACE_FLAGS)
