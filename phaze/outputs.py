"""Writing what phaze produces without ever losing what was there, or harming what is there.

Every output file goes to a temporary file beside it and is renamed into place only once it is
complete (a rename within a directory is atomic), so a run that fails or is stopped part-way, a
full disk included, leaves the previous file as it was; a run's several outputs are renamed
only once all of them are complete, so they land together or not at all.  A target that is not
a regular file (``/dev/null``, a terminal, a FIFO, a socket, ``/dev/stdout``) is written in
place, never renamed over, every byte checked; a disk or a memory device is refused.  stdout is
written the same checked way (:func:`write_stdout`): a full device, a file-size limit or a
closed pipe is one line and a non-zero exit, never a cut plan and exit 0.  And a run whose
output would be one of its own inputs, or two of whose outputs are the same file, or one of
whose outputs cannot be written, is refused before any work.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
import tempfile
from collections.abc import Iterable, Sequence

from phaze_ir.errors import PhazeError

STDOUT = "-"


def write_atomically(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8, ``\\n`` newlines) to ``path`` by way of a temporary file in the
    same directory, renamed into place once complete (a target that is not a regular file, in
    place: :func:`write_together`); a :class:`PhazeError` when it cannot be, and then a regular
    ``path`` is untouched."""
    write_together([(path, text)])


def write_together(files: Sequence[tuple[str | os.PathLike[str], str]]) -> None:
    """Write each ``(path, text)`` (UTF-8, ``\\n`` newlines) as one transaction: every text
    for a regular file (or a new one) goes to a temporary file beside it first, and only once
    all are complete are they renamed into place; a :class:`PhazeError` when one cannot be
    written, and then no regular file is touched.

    A target that is not a regular file (a character device such as ``/dev/null``, a FIFO, a
    socket, a descriptor such as ``/dev/stdout``, or a symbolic link to one) is written in place,
    never renamed over, after the regular files are staged and before they are renamed: its
    write error (a full device, a file-size limit, a reader gone) is a :class:`PhazeError` and
    then no regular file is touched either (what a device took cannot be taken back: the error
    names the ones written).  A symbolic link to a regular file stays a link: the file it points
    to is replaced."""
    targets = [(os.fspath(path), *_target(os.fspath(path)), text) for path, text in files]
    staged: list[tuple[str, str, str]] = []  # (temporary file, path renamed over, path as given)
    written: list[str] = []  # the targets written in place

    def failed(shown: str, e: OSError) -> PhazeError:
        done = ", ".join(written)
        return PhazeError(f"{shown}: cannot write: {_why(e)}" + (f" (written: {done})" if done else ""))

    try:
        for shown, where, in_place, text in targets:
            if not in_place:
                try:
                    staged.append((_staged(where, text), where, shown))
                except OSError as e:
                    raise PhazeError(f"{shown}: cannot write: {_why(e)}") from e
        for shown, where, in_place, text in targets:
            if in_place:
                try:
                    _write_in_place(where, text.encode("utf-8"))
                except OSError as e:
                    raise failed(shown, e) from e
                written.append(shown)
        for tmp, where, shown in staged:
            try:
                os.replace(tmp, where)
            except OSError as e:
                raise failed(shown, e) from e
            written.append(shown)
    finally:
        for tmp, _, _ in staged:
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


def _why(e: OSError) -> str:
    """An OSError's reason without its path (the message names the target as given)."""
    return e.strerror or str(e)


#: Character devices that are memory, not a stream (Linux's Documentation/admin-guide/devices.txt,
#: major 1: minor 1 ``/dev/mem``, 2 ``/dev/kmem``, 4 ``/dev/port``): writing a plan to one, as
#: root, overwrites the machine's memory or I/O ports; refused like a block device (a disk).
MEMORY_DEVICES = {(1, 1): "/dev/mem", (1, 2): "/dev/kmem", (1, 4): "/dev/port"}

#: How long a write to a FIFO waits for a process to open it for reading (``cat > fifo`` would
#: wait forever): a FIFO nothing reads is one line after this, not a hang.
FIFO_READER_WAIT_S = 30.0


def _target(path: str) -> tuple[str, bool]:
    """Where ``path`` is written and whether in place: ``(the file renamed over, False)`` for a
    regular file or a new one (a symbolic link's target: the link stays), ``(path, True)`` for
    anything else that can take a stream of bytes; a :class:`PhazeError` for a directory, a
    disk or a memory device."""
    where, descriptor = _resolve(path)
    if path.endswith(("/", os.sep)) and not os.path.isdir(path):
        # `-o out/`: a directory's name, not a file to make (os.path.basename is "", and the
        # file was once made as `out` without the slash)
        raise PhazeError(f"{path}: names a directory (it ends in /), expected a file name")
    try:
        st = os.stat(path)
    except FileNotFoundError:  # a new file (or a link to one not yet made: made where it points)
        return where, False
    except OSError as e:  # a loop of links, a directory on the way that cannot be searched
        raise PhazeError(f"{path}: cannot write: {_why(e)}") from e
    refusal = _refusal(st)
    if refusal:
        raise PhazeError(f"{path}: {refusal}")
    if stat.S_ISREG(st.st_mode) and not descriptor:
        return where, False
    return path, True


def _refusal(st: os.stat_result) -> str | None:
    """Why a file of this kind is never written, or None."""
    if stat.S_ISDIR(st.st_mode):
        return "is a directory, expected a file name"
    if stat.S_ISBLK(st.st_mode):
        return "is a block device (a disk): refusing to write onto it"
    if stat.S_ISCHR(st.st_mode) and (os.major(st.st_rdev), os.minor(st.st_rdev)) in MEMORY_DEVICES:
        device = MEMORY_DEVICES[(os.major(st.st_rdev), os.minor(st.st_rdev))]
        return f"is the memory device {device}: refusing to write onto it"
    return None


#: A process's open file, as Linux's /proc shows it (/proc/self/fd/1: what /dev/stdout names).
_DESCRIPTOR = re.compile(r"/proc/[^/]+/fd/[^/]+")


def _resolve(path: str) -> tuple[str, bool]:
    """``path`` with its symbolic links followed, and whether it is a process's descriptor in
    ``/proc`` (as ``/dev/stdout`` and ``/dev/fd/N`` lead to: a regular file reached so is a
    shell's redirection, written in place, as ``tee /dev/stdout`` writes it)."""
    p = os.path.abspath(path)
    for _ in range(40):  # Linux's limit of links followed in one lookup (MAXSYMLINKS)
        p = os.path.join(os.path.realpath(os.path.dirname(p)), os.path.basename(p))
        if _DESCRIPTOR.fullmatch(p):
            return p, True
        if not os.path.islink(p):
            return p, False
        p = os.path.join(os.path.dirname(p), os.readlink(p))
    return p, False  # a loop: os.stat says so


def _write_in_place(path: str, data: bytes) -> None:
    """Write ``data`` to the existing non-regular file ``path``: every byte, or an OSError."""
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is not None and stat.S_ISSOCK(st.st_mode):
        _send(path, data)
        return
    fd = _open_in_place(path)
    try:
        refusal = _refusal(os.fstat(fd))  # what was opened, not what the name was a moment before
        if refusal:
            raise PhazeError(f"{path}: {refusal}")
        _write_all(fd, data)
    finally:
        os.close(fd)


def _open_in_place(path: str) -> int:
    """``path`` opened for writing without blocking on a FIFO that nothing reads yet (waiting
    :data:`FIFO_READER_WAIT_S` for a reader), then made blocking again for the writes."""
    import fcntl
    import time

    # O_TRUNC empties a regular file reached through /proc (tee's way); a device or FIFO ignores it
    flags = os.O_WRONLY | os.O_TRUNC | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    deadline = None
    while True:
        try:
            fd = os.open(path, flags)
            break
        except OSError as e:
            if e.errno != errno.ENXIO or not stat.S_ISFIFO(os.stat(path).st_mode):
                raise
            if _resolve(path)[1]:  # a process's pipe (/dev/stdout): its reader is gone for good
                raise OSError(errno.EPIPE, "the pipe has no reader") from None
            deadline = deadline if deadline is not None else time.monotonic() + FIFO_READER_WAIT_S
            if time.monotonic() >= deadline:
                raise OSError(
                    errno.ENXIO, f"the FIFO has no reader (waited {FIFO_READER_WAIT_S:g} s for one)"
                ) from None
            time.sleep(0.05)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def _send(path: str, data: bytes) -> None:
    """Write ``data`` to the Unix socket ``path`` (a stream socket, as ``socat - UNIX:path``)."""
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        s.sendall(data)


def _write_all(fd: int, data: bytes) -> None:
    """Every byte of ``data`` to ``fd``, or an OSError: a short write is written on from where
    it stopped, so a file-size limit or a full device is an error, never a silent cut."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]


def write_stdout(text: str) -> None:
    """Write ``text`` to stdout, checked: every byte, or a :class:`PhazeError` in one line (a
    file-size limit, a full device, a closed pipe).  Python's own buffered stdout loses what a
    short write leaves and says nothing (``ulimit -f 40``: the plan cut at 40,960 bytes, exit
    0); this writes the descriptor itself, on from where a short write stopped.  After an error
    stdout is pointed at the null device, so that Python's flush at exit says nothing more."""
    stream = sys.stdout
    if stream is None:  # started with stdout closed (>&-)
        raise PhazeError("stdout: cannot write: it is closed")
    try:
        stream.flush()
    except ValueError as e:  # closed
        raise PhazeError("stdout: cannot write: it is closed") from e
    except OSError as e:
        _abandon(stream)
        raise PhazeError(f"stdout: cannot write: {_why(e)}") from e
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):  # a stream without a descriptor (a test's capture)
        stream.write(text)
        stream.flush()
        return
    try:
        _write_all(fd, text.encode(getattr(stream, "encoding", None) or "utf-8", errors="replace"))
    except OSError as e:
        _abandon(stream)
        raise PhazeError(f"stdout: cannot write: {_why(e)}") from e


def _abandon(stream) -> None:
    """Point ``stream``'s descriptor at the null device (what Python's documentation advises
    after a broken pipe), so that its flush at exit neither fails again nor prints."""
    try:
        fd = stream.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
    except (OSError, ValueError, AttributeError):
        return
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def refuse_clashes(inputs: Iterable[tuple[str, str | None]], outputs: Iterable[tuple[str, str | None]]) -> None:
    """Refuse, in one line, an output (``(flag, path)``; ``None`` or ``-`` for none) that is one
    of the inputs (``(what it is, path)``, e.g. ``("the model file", "m.py")``) or the same file
    as another output (two outputs to one character device, such as ``/dev/null`` or a
    terminal, are fine: each is a stream), or that cannot be written: writing it would destroy
    what the run reads, or what it wrote a moment before."""

    def same(a: str, b: str) -> bool:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
        return os.path.realpath(a) == os.path.realpath(b)

    given_inputs = [(flag, p) for flag, p in inputs if p and p != STDOUT]
    seen: list[tuple[str, str]] = []
    for flag, path in outputs:
        if path is None or path == STDOUT:
            continue
        if not path:  # `--json ''`: not "no output", which would write nothing and say nothing
            raise PhazeError(f"{flag} '': expected a file name")
        for what, in_path in given_inputs:
            if same(path, in_path):
                raise PhazeError(f"{flag} {path} is {what}: refusing to overwrite it")
        for out_flag, out_path in seen:
            if same(path, out_path) and not _character_device(path):
                raise PhazeError(f"{flag} {path} is also {out_flag}: give each output its own file")
        seen.append((flag, path))
        _check_writable(flag, path)


def _character_device(path: str) -> bool:
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def _check_writable(flag: str, path: str) -> None:
    """An output that cannot be written is said before the run's work, not after it."""
    try:
        where, in_place = _target(path)
    except PhazeError as e:
        raise PhazeError(f"{flag} {e}") from None
    if in_place:  # a device, a FIFO, a socket: written where it is, no file made beside it
        if not os.access(path, os.W_OK):
            raise PhazeError(f"{flag} {path}: cannot write: permission denied")
        return
    directory = os.path.dirname(where)
    if not os.path.isdir(directory):
        raise PhazeError(f"{flag} {path}: cannot write: no directory {directory}")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PhazeError(f"{flag} {path}: cannot write: the directory {directory} is not writable")
    try:  # what os.access cannot tell (a read-only or pseudo file system, such as /proc, as root)
        fd, probe = tempfile.mkstemp(prefix=f".{os.path.basename(where)}.", suffix=".tmp", dir=directory)
    except OSError as e:
        # /proc answers "No such file or directory" for a directory that exists: not said.
        why = "" if e.errno == errno.ENOENT else f" ({e.strerror})"
        raise PhazeError(f"{flag} {path}: cannot write: the directory {directory} takes no new file{why}") from e
    os.close(fd)
    os.unlink(probe)
    if _unreplaceable(where):
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
