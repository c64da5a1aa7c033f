"""phaze's one cache: its entries' file format, its key scheme, its store and its eviction.

Every cached result (the search's stages and settings, ``phazec --hw``'s answers, sweep
settings and plan templates, the schedules) is an entry of a :class:`Store`: one key scheme
(:meth:`Store.key`), one path layout (:meth:`Store.file`), one file format (below), one eviction
(:func:`trim`).  The module keeps its first name, ``cache_file``: what it defines is the cache's
files (how they are named, written, checked, read back and trimmed); its JSON number checks
(:func:`is_int`, :func:`is_number`) are read by modules that keep no entry; and
:mod:`passes.algorithms.schedule.cache` (the schedules' checks and their in-memory front, keyed
by this store's keys) is another module.

**Keys and paths.**  An entry is of a *kind* (``schedule``, ``model``, ``hw-answer``...) and is
keyed by the SHA-256 of the store's format and version, its *environment* (what every entry of
the store belongs to: :func:`environment_digest` for the computed stages, the solver's revision
for the schedules, which are checked against their problem on load) and everything its result
depends on (:meth:`Store.key`).  It lies at ``<cache>/<kind>/<first 32 hex digits of the
key>.json``.  (The layouts before, ``schedules/<key>.json``, ``settings/`` and
``stages/<kind>/`` of the formats ``phaze-schedule``, ``phaze-settings`` and
``phaze-search-stage``, are never looked up: the least recently used, they go first when the
directory is trimmed.)

**Files.**  A file is one JSON object::

    {"format": "phaze-cache", "version": 1,
     "input_hash": "<the entry's key: a sha256 of what it was computed from>",
     "content_hash": "<sha256 of the canonical JSON of payload>",
     "payload": ...}

The canonical JSON is :func:`canonical_json` (sorted keys, no spaces, no NaN or infinity): the
payload read back from the file gives the same text, so its hash is recomputed on load.
:func:`read_entry` returns the payload only when the format, the version, the input hash (the
caller's, for what it is looking up) and the content hash all agree; otherwise it raises
:class:`BadEntry` with the reason (:class:`StaleEntry` for a file of another format version, as
an older phaze leaves behind).  What the payload must hold is the caller's check
(:meth:`Store.load`'s ``check``, :meth:`~passes.algorithms.schedule.cache.ScheduleCache.lookup`): an entry
whose hashes agree may still have been written with doctored numbers by whoever can write the
directory, so the callers check the numbers against what they are for.

:func:`write_entry` writes atomically (a temporary file in the same directory, renamed into
place), so a reader never sees half a file.

A cache only grows as it is written, so :func:`trim` keeps a directory of entries under a size,
removing the least recently used first: an entry's modification time is when it was written or
last read back whole (:func:`read_entry` touches it), so what a user keeps asking stays.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import stat
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, TypeGuard, TypeVar

from phaze_ir.files import read_regular
from phaze_ir.warning import PhazeWarning

#: Every entry's file format and its version (in every key too: an entry of another version is
#: never looked up).
FORMAT = "phaze-cache"
VERSION = 1
#: Packages whose version can change a number of phaze's answers or a byte of its output.
PACKAGES = ("torch", "transformers", "xdsl", "numpy", "pyscipopt", "cvxpy")

T = TypeVar("T")

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


# -- keys -----------------------------------------------------------------------------------------


@functools.cache
def source_digest() -> str:
    """A digest of phaze's Python sources: a cached result is reused only by the code that made it."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for pkg in ("phaze_ir", "passes", "phaze"):
        for p in sorted((root / pkg).rglob("*.py")):
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


@functools.cache
def environment_digest() -> str:
    """:func:`source_digest`, the Rust extension's bytes, Python's version and those of
    :data:`PACKAGES`: what every computed result depends on besides its inputs."""
    from passes.algorithms import _phaze_rs

    h = hashlib.sha256(source_digest().encode())
    h.update(Path(_phaze_rs.__file__ or "").read_bytes())
    h.update(repr((platform.python_version(), [(p, _version(p)) for p in PACKAGES])).encode())
    return h.hexdigest()[:32]


def digest(data: bytes | str) -> str:
    """The SHA-256 of ``data`` (text as UTF-8), hex."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


# -- the store ------------------------------------------------------------------------------------


@dataclass
class Store:
    """The entries under ``directory`` (None: nothing kept, nothing found), each of one kind,
    keyed by :meth:`key` and lying at :meth:`file`.  ``env`` is what every entry of the store
    belongs to (in every key): :func:`environment_digest` unless the caller says otherwise."""

    directory: Path | None
    env: str = field(default_factory=environment_digest)
    #: Set when the directory could not be written (said once by :meth:`keep`; nothing more is tried).
    broken: bool = False

    @classmethod
    def of(cls, cache_dir: str | os.PathLike[str] | None) -> Store:
        """The store of the cache directory ``cache_dir`` (``--cache``; None: ``--no-cache``)."""
        return cls(Path(cache_dir) if cache_dir is not None else None)

    def key(self, kind: str, *parts: object) -> str:
        """The key of a ``kind`` entry computed from ``parts`` (plain values whose ``repr`` is
        stable: strings, numbers, booleans, None, tuples of them)."""
        return digest(repr((FORMAT, VERSION, self.env, kind, parts)))

    def file(self, kind: str, key: str) -> Path | None:
        """Where the ``kind`` entry of ``key`` lies (None without a directory)."""
        return Path(self.directory, kind, key[:32] + ".json") if self.directory is not None else None

    def read(self, kind: str, key: str) -> Any:
        """The payload of the ``kind`` entry for ``key``, its format and hashes checked
        (:func:`read_entry`: :class:`BadEntry` or :class:`StaleEntry` saying why not); None
        when there is no such file.  What the payload must hold is the caller's check."""
        file = self.file(kind, key)
        if file is None or not file.exists():
            return None
        return read_entry(file, FORMAT, VERSION, key)

    def write(self, kind: str, key: str, payload: Any) -> None:
        """Write ``payload`` as the ``kind`` entry for ``key`` (atomically: :func:`write_entry`;
        ``ValueError`` for a NaN or an infinity, ``OSError`` when the directory cannot be
        written; nothing without a directory)."""
        file = self.file(kind, key)
        if file is not None:
            write_entry(file, FORMAT, VERSION, key, payload)

    def load(self, kind: str, key: str, check: Callable[[Any], T], again: str = "computed again") -> T | None:
        """The payload of the ``kind`` entry for ``key`` as ``check`` returns it (``check`` raises
        :class:`BadEntry` when the payload does not hold what it must), or None when there is
        none or it fails a check (then one warning says which file, why, and that it is
        ``again``)."""
        try:
            payload = self.read(kind, key)
            return None if payload is None else check(payload)
        except (BadEntry, LookupError, TypeError, AttributeError, ArithmeticError) as e:
            # a payload of the right hashes but the wrong shape, where a check reads past what it holds
            why = e if isinstance(e, BadEntry) else f"does not hold what it must ({type(e).__name__}: {e})"
            warnings.warn(f"cache entry {self.file(kind, key)} {why}: ignored, {again}", PhazeWarning, stacklevel=2)
            return None

    def keep(self, kind: str, key: str, payload: Any) -> None:
        """Write ``payload`` as the ``kind`` entry for ``key``.  A payload that JSON cannot hold
        (NaN, infinity) is not kept; a directory that cannot be written costs one warning."""
        if self.broken:
            return
        try:
            self.write(kind, key, payload)
        except ValueError:  # a NaN or an infinity: computed again next time
            return
        except OSError as e:
            self.broken = True
            warnings.warn(
                f"cache directory {self.directory} is not usable ({e.strerror or e}); results are not kept",
                PhazeWarning,
                stacklevel=2,
            )


# -- what the payloads must hold ------------------------------------------------------------------


def need(ok: bool, what: str) -> None:
    """Raise :class:`BadEntry` saying the payload does not hold ``what`` unless ``ok``."""
    if not ok:
        raise BadEntry(f"does not hold {what}")


def fields(x: object, keys: tuple[str, ...], what: str) -> dict:
    """``x`` if it is a dict with ``keys`` (and maybe more), else :class:`BadEntry`."""
    need(isinstance(x, dict) and all(k in x for k in keys), what)
    assert isinstance(x, dict)
    return x
