"""The search's stage cache: a rerun skips every stage whose inputs did not change.

A search (:func:`phaze.search.run.answer`) runs in stages: the model files are imported (for
their names; torch with them), the settings are prepared, each baseline is searched, then the
co-optimized search, the winner is compiled through the IR pipeline and the output is printed.
Besides the settings and the schedules (``settings/``, ``schedules/``), the cache directory keeps
each stage's result under ``stages/<kind>/<key>.json``, one
:mod:`passes.algorithms.cache_file` entry each (plain JSON with its input and content hashes,
checked on load: never code), keyed by a SHA-256 of :func:`environment_digest` and everything
the result depends on:

- ``model``: a model file's bytes -> its name and its *sources*, the other files of the user's
  its import loaded (helpers beside it), each with the digest of its bytes then (a warm rerun
  imports no model, nor torch, while those files are unchanged).  Every other key holds the
  model's :func:`model_key` digest: the model file's bytes and its sources' paths and bytes, so
  that editing a helper the model imports is a new question (files it *reads*, and modules it
  imports only inside a function, are not seen: ``--no-cache`` asks afresh);
- ``baseline``: the models' digests, the driver's options (their ``repr``), the solver limits, the
  chip searched (the TPUv4-like one; the space and pruning for ``decoupled``) -> the baseline's
  JSON record and the evaluator's counts it cost;
- ``search``: the same on the space, with pruning -> the co-optimized record, the statistics,
  the winner (chip, each model's micro-batch, TP width and throughput), the per-model detail
  and the counts;
- ``plan``: one model's digest, the options at the winner's setting and the winner chip -> its
  plan module as MLIR text;
- ``answer``: all of the above, the baselines and pruning flags and the printed form (generic
  or not) -> the output module's text and the JSON without its wall times.

A rerun with nothing changed reads one ``answer`` entry: no model imported, no worker started,
nothing parsed.  With something changed, each stage whose key did not change is read (a
``plan`` is parsed back: printing and parsing round-trip byte for byte, and its throughput is
checked against the search's again) and the others are computed and kept.  The evaluator's
counts in the JSON are those of the runs that computed each stage (a warm rerun's JSON is the
cold run's, wall times apart); ``search.wall_s`` is the rerun's own.

The environment digest makes every entry belong to the code that made it: phaze's Python
sources, the Rust extension's bytes, Python's version and those of the packages the pipeline's
numbers come from.  An entry that fails a check (its hashes, its version, what its payload must
hold) is said in one warning line and computed again; as with the schedules, an entry rewritten
consistently by someone who knows the format is trusted as far as these checks go.
"""

from __future__ import annotations

import functools
import hashlib
import platform
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

from passes.algorithms.cache_file import BadEntry, is_int, is_number, read_entry, write_entry
from phaze_ir.errors import PhazeError, PhazeWarning

#: The stage entries' file format and its version (in every key too: entries of another version
#: are never looked up).
STAGE_FORMAT = "phaze-search-stage"
STAGE_VERSION = 1
#: Packages whose version can change a number of the search or a byte of its output.
PACKAGES = ("torch", "transformers", "xdsl", "numpy", "pyscipopt", "cvxpy")

T = TypeVar("T")


@functools.cache
def source_digest() -> str:
    """A digest of phaze's Python sources: a cached result is reused only by the code that made it."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[2]
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
    :data:`PACKAGES`: what every cached result of the search depends on besides its inputs."""
    from passes.algorithms import _phaze_rs

    h = hashlib.sha256(source_digest().encode())
    h.update(Path(_phaze_rs.__file__ or "").read_bytes())
    h.update(repr((platform.python_version(), [(p, _version(p)) for p in PACKAGES])).encode())
    return h.hexdigest()[:32]


def digest(data: bytes | str) -> str:
    """The SHA-256 of ``data`` (text as UTF-8), hex."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


@dataclass
class StageCache:
    """The stage entries under ``directory`` (None: nothing kept, nothing found)."""

    directory: Path | None
    env: str = field(default_factory=environment_digest)
    #: Set when the directory could not be written (said once; nothing more is tried).
    broken: bool = False

    @classmethod
    def of(cls, cache_dir: str | None) -> StageCache:
        """The stage cache of the search's cache directory (``--cache``; None: ``--no-cache``)."""
        return cls(Path(cache_dir, "stages") if cache_dir else None)

    def key(self, kind: str, *parts: object) -> str:
        """The key of a ``kind`` entry computed from ``parts`` (plain values whose ``repr`` is
        stable: strings, numbers, booleans, tuples of them)."""
        return digest(repr((STAGE_FORMAT, STAGE_VERSION, self.env, kind, parts)))

    def file(self, kind: str, key: str) -> Path | None:
        return Path(self.directory, kind, key[:32] + ".json") if self.directory is not None else None

    def load(self, kind: str, key: str, check: Callable[[Any], T]) -> T | None:
        """The payload of the ``kind`` entry for ``key`` as ``check`` returns it (``check`` raises
        :class:`BadEntry` when the payload does not hold what it must), or None when there is
        none or it fails a check (then one warning says which file and why)."""
        file = self.file(kind, key)
        if file is None or not file.exists():
            return None
        try:
            return check(read_entry(file, STAGE_FORMAT, STAGE_VERSION, key))
        except (BadEntry, LookupError, TypeError, AttributeError, ArithmeticError) as e:
            # a payload of the right hashes but the wrong shape, where a check reads past what it holds
            why = e if isinstance(e, BadEntry) else f"does not hold what it must ({type(e).__name__}: {e})"
            warnings.warn(f"search cache entry {file} {why}: ignored, computed again", PhazeWarning, stacklevel=2)
            return None

    def keep(self, kind: str, key: str, payload: Any) -> None:
        """Write ``payload`` as the ``kind`` entry for ``key``.  A payload that JSON cannot hold
        (NaN, infinity) is not kept; a directory that cannot be written costs one warning."""
        file = self.file(kind, key)
        if file is None or self.broken:
            return
        try:
            write_entry(file, STAGE_FORMAT, STAGE_VERSION, key, payload)
        except ValueError:  # a NaN or an infinity: computed again next time
            return
        except OSError as e:
            self.broken = True
            warnings.warn(
                f"cache directory {self.directory} is not usable ({e.strerror or e}); search stages are not kept",
                PhazeWarning,
                stacklevel=2,
            )


@dataclass(frozen=True)
class ModelKey:
    """A model file as the cache keys it: its name and the digest of its bytes and of its
    sources' paths and bytes."""

    name: str
    digest: str


def _file_digest(path: str) -> str:
    """The digest of a file's bytes ("" when it cannot be read: a deleted helper is a change)."""
    try:
        return digest(Path(path).read_bytes())
    except OSError:
        return ""


def model_key(path: str, stages: StageCache) -> ModelKey:
    """The model file ``path`` as the cache keys it (see the module docstring).  Its ``model``
    entry gives its name and sources while every source still has the bytes it had; otherwise
    the file is imported (torch with it: seconds) and the entry written anew.  A file that cannot
    be read or imported is the loader's one-line error."""
    from phaze_ir.frontend import load_model_file

    try:
        data = Path(path).read_bytes()
    except OSError as e:
        load_model_file(path)  # its one-line error: no such file, a directory...
        raise PhazeError(f"{path}: cannot be read ({e.strerror or e})") from None
    file_digest = digest(data)
    hit = _model_entry(file_digest, stages)
    if hit is not None:
        name, sources = hit
    else:
        spec = load_model_file(path)
        name, sources = spec.name, [(str(f), _file_digest(str(f))) for f in spec.sources]
        stages.keep("model", stages.key("model", file_digest), {"name": name, "sources": [list(x) for x in sources]})
    return ModelKey(name, digest(repr((file_digest, sources))))


def _model_entry(file_digest: str, stages: StageCache) -> tuple[str, list[tuple[str, str]]] | None:
    """The ``model`` entry of a model file of digest ``file_digest`` while every source it names
    still has the bytes it had (None otherwise)."""
    hit = stages.load("model", stages.key("model", file_digest), check_model)
    return hit if hit is not None and all(_file_digest(p) == d for p, d in hit[1]) else None


def model_known(path: str, stages: StageCache) -> bool:
    """Whether :func:`model_key` can key ``path`` from its ``model`` entry, without importing the
    file (False when the file cannot be read: the import says why)."""
    try:
        data = Path(path).read_bytes()
    except OSError:
        return False
    return _model_entry(digest(data), stages) is not None


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


def check_model(payload: Any) -> tuple[str, list[tuple[str, str]]]:
    """A ``model`` payload: the model's name and its sources ``(path, digest of its bytes)``."""
    d = fields(payload, ("name", "sources"), "a model name and its sources")
    need(isinstance(d["name"], str) and d["name"] != "", "a model name")
    sources = d["sources"]
    need(isinstance(sources, list), "the model's sources")
    ok = all(isinstance(x, list) and len(x) == 2 and all(isinstance(v, str) for v in x) for x in sources)
    need(ok, "(path, digest) of each source")
    return d["name"], [(x[0], x[1]) for x in sources]


def check_counts(x: Any, keys: tuple[str, ...]) -> dict[str, int]:
    """The evaluator's counts: ``keys``, each a count >= 0."""
    need(isinstance(x, dict) and list(x) == list(keys), f"the counts {', '.join(keys)}")
    need(all(is_int(v) and v >= 0 for v in x.values()), "counts >= 0")
    return x


_RECORD = (
    "name",
    "throughput_samples_per_s",
    "score",
    "accelerator",
    "dp",
    "pp",
    "tp",
    "micro_batch_size",
    "sequence_parallel",
    "virtual_stages",
    "zero",
    "note",
)


def check_record(x: Any) -> dict:
    """A baseline's record (:func:`phaze.search.run._baseline_record`), as far as the summary
    that ``phazec`` prints reads it."""
    rec = fields(x, _RECORD, "a baseline record")
    need(isinstance(rec["name"], str) and isinstance(rec["note"], str), "a baseline record's name and note")
    need(is_number(rec["throughput_samples_per_s"]) and rec["throughput_samples_per_s"] >= 0, "a throughput >= 0")
    need(is_number(rec["score"]) and rec["score"] >= 0, "a score >= 0")
    degrees = ("dp", "pp", "tp", "micro_batch_size", "virtual_stages", "zero")
    need(all(is_int(rec[k]) and rec[k] >= 0 for k in degrees), "degrees >= 0")
    need(isinstance(rec["sequence_parallel"], bool), "sequence parallelism true or false")
    acc = rec["accelerator"]
    need(acc is None or (isinstance(acc, dict) and isinstance(acc.get("name"), str)), "a chip with a name")
    sp = rec.get("speedup")
    need(sp is None or (is_number(sp) and sp > 0), "a speed-up > 0")
    return rec


def check_stats(x: Any) -> dict:
    """The JSON's ``search`` object (its wall times and counts left out), as far as ``phazec``'s
    summary and the report's statistics read it."""
    st = fields(x, ("architectures", "settings", "pruned", "evaluated", "points", "wall_s", "evaluator"), "statistics")
    need(all(is_int(st[k]) and st[k] >= 0 for k in ("architectures", "settings", "evaluated")), "counts >= 0")
    pruned = st["pruned"]
    need(isinstance(pruned, dict) and all(is_int(v) and v >= 0 for v in pruned.values()), "pruning counts")
    need(isinstance(st["points"], list) and all(isinstance(p, dict) for p in st["points"]), "the points evaluated")
    return st
