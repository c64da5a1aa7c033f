"""The on-disk entries of phaze's caches (the search's settings, the schedules): plain JSON, never
code, each checked before it is used.

A file is one JSON object::

    {"format": "phaze-schedule", "version": 2,
     "input_hash": "<sha256 of what the entry was computed from>",
     "content_hash": "<sha256 of the canonical JSON of payload>",
     "payload": ...}

The canonical JSON is :func:`canonical_json` (sorted keys, no spaces, no NaN or infinity): the
payload read back from the file gives the same text, so its hash is recomputed on load.
:func:`read_entry` returns the payload only when the format, the version, the input hash (the
caller's, for what it is looking up) and the content hash all agree; otherwise it raises
:class:`BadEntry` with the reason (:class:`StaleEntry` for a file of another format version, as
an older phaze leaves behind).  What the payload must hold is the caller's check
(:meth:`~passes.algorithms.schedule.cache.ScheduleCache.lookup`, ``Setting.from_json``): an entry
whose hashes agree may still have been written with doctored numbers by whoever can write the
directory, so the callers check the numbers against what they are for.

:func:`write_entry` writes atomically (a temporary file in the same directory, renamed into
place), so a reader never sees half a file.

A cache only grows as it is written, so :func:`trim` keeps a directory of entries under a size,
removing the least recently used first: an entry's modification time is when it was written or
last read back whole (:func:`read_entry` touches it), so what a user keeps asking stays.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import tempfile
from typing import Any, TypeGuard

from phaze_ir.files import read_regular

_KEYS = {"format", "version", "input_hash", "content_hash", "payload"}


#: The largest entry read back: a plan template of GPT-3 175B is about 12 MB; a file much
#: larger than any entry phaze writes is not read whole into memory to find that out.
ENTRY_LIMIT = 256 << 20


class BadEntry(ValueError):
    """A cache file that is not to be used (the message says why, in a few words)."""


class StaleEntry(BadEntry):
    """A cache file of another format version (or the unversioned layout before it)."""


def is_int(x: object) -> TypeGuard[int]:
    """A JSON integer (not a boolean, which Python counts as one)."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: object) -> TypeGuard[int | float]:
    """A finite JSON number, integer or not (not a boolean)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def canonical_json(payload: Any) -> str:
    """The one JSON text of ``payload`` that its hash is taken over."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False)


def content_hash(payload: Any) -> str:
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a cache entry may hold")


def read_entry(path: str | os.PathLike[str], fmt: str, version: int, input_hash: str) -> Any:
    """The payload of the cache file ``path`` if it is a ``fmt`` file of ``version`` for
    ``input_hash`` whose content hash holds; :class:`BadEntry` (or :class:`StaleEntry`) with
    the reason otherwise."""
    try:
        raw = read_regular(path, ENTRY_LIMIT, "cache entry")
    except OSError as e:
        raise BadEntry(f"cannot be read ({e.strerror or e})") from e
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BadEntry("is not JSON") from e
    if not isinstance(data, dict):
        raise BadEntry("is not a JSON object")
    if "format" not in data and "version" not in data:
        raise StaleEntry("has no format version (written by an older phaze)")
    if data.get("format") != fmt:
        raise BadEntry(f"is not a {fmt} file")
    if data.get("version") != version:
        raise StaleEntry(f"is of version {data.get('version')!r}, not {version}")
    if set(data) != _KEYS:
        raise BadEntry(f"has keys {sorted(data)}, expected {sorted(_KEYS)}")
    if data["input_hash"] != input_hash:
        raise BadEntry("was computed from other inputs (its input hash differs)")
    try:  # a number JSON reads as infinity (1e999) has no canonical text
        computed = content_hash(data["payload"])
    except (ValueError, RecursionError) as e:
        raise BadEntry("holds a number out of range or nesting too deep") from e
    if not isinstance(data["content_hash"], str) or data["content_hash"] != computed:
        raise BadEntry("does not match its content hash")
    try:  # used now: the last to go when the directory is trimmed (a read-only cache stays as it is)
        os.utime(path)
    except OSError:
        pass
    return data["payload"]


#: How every entry file begins (:func:`write_entry` writes ``format`` first, and every phaze
#: format is named ``phaze-...``): :func:`trim` removes no other file, whatever directory it is
#: pointed at.
_ENTRY_HEAD = b'{"format": "phaze-'


def _is_entry(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(len(_ENTRY_HEAD)) == _ENTRY_HEAD
    except OSError:
        return False


def trim(directory: str | os.PathLike[str], max_bytes: int) -> tuple[int, int]:
    """Remove the least recently used entries (``*.json`` files written by :func:`write_entry`,
    oldest modification time first, then by path) under ``directory`` until the entries left
    hold at most ``max_bytes``; returns (files removed, bytes removed).  Nothing else is ever
    removed (a user's own JSON files in a directory given as ``--cache`` included); files that
    vanish meanwhile (another process trimming) are skipped."""
    candidates: list[tuple[float, str, int]] = []
    for root, _dirs, files in os.walk(directory):
        for name in files:
            if not name.endswith(".json") or name.startswith("."):  # write_entry's names only
                continue
            path = os.path.join(root, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):  # a FIFO would block the open of _is_entry
                continue
            candidates.append((st.st_mtime, path, st.st_size))
    # Entries are some of these files: when all of them fit, so do the entries, and no file is
    # opened (the usual run, far under the limit, only lists the directory).
    if sum(size for _, _, size in candidates) <= max_bytes:
        return 0, 0
    entries = [c for c in candidates if _is_entry(c[1])]
    total = sum(size for _, _, size in entries)
    removed = freed = 0
    for _, path, size in sorted(entries):
        if total <= max_bytes:
            break
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        else:
            removed += 1
            freed += size
        total -= size
    return removed, freed


def write_entry(path: str | os.PathLike[str], fmt: str, version: int, input_hash: str, payload: Any) -> None:
    """Write ``payload`` as a ``fmt`` cache file at ``path``, atomically (``OSError`` when the
    directory cannot be written; ``path`` is then untouched).  ``fmt`` is named ``phaze-...``
    (what :func:`trim` recognises an entry by)."""
    if not fmt.startswith("phaze-"):
        raise ValueError(f"cache entry format {fmt!r}: expected a name starting with 'phaze-'")
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    text = json.dumps(
        {
            "format": fmt,
            "version": version,
            "input_hash": input_hash,
            "content_hash": content_hash(payload),
            "payload": payload,
        },
        allow_nan=False,
    )
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        umask = os.umask(0)  # mkstemp's file is private: give it the mode open() would have
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
