"""A model file as phaze's cache keys it: its name and a digest of its bytes and of its
*sources*' (the other files of the user's that importing it loaded: helpers beside it).

Every cached answer about a model (the search's stages, ``phazec --hw``'s answers, sweep
settings and plan templates) holds the model's :attr:`ModelKey.digest` among its key's parts, so
that editing a helper the model imports is a new question.  Files the model *reads*, and modules
it imports only inside a function, are not seen: ``--no-cache`` asks afresh.

Finding a model's sources means importing it (torch with it: seconds), so they are kept as a
``model`` entry of the cache's store (:class:`passes.cache_file.Store`), keyed by the
model file's bytes: while every source it names still has the bytes it had, a model is keyed
without being imported.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from passes.cache_file import Store, digest, fields, need
from phaze_ir.errors import PhazeError

#: The store's kind of entry holding a model file's name and sources.
KIND = "model"


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


def model_key(path: str, store: Store) -> ModelKey:
    """The model file ``path`` as the cache keys it (see the module docstring).  Its ``model``
    entry in ``store`` gives its name and sources while every source still has the bytes it
    had; otherwise the file is imported (torch with it: seconds) and the entry written anew.  A
    file that cannot be read or imported is the loader's one-line error."""
    from phaze_ir.frontend import load_model_file

    try:
        if not Path(path).is_file():  # a FIFO would block the read, a device never end it
            raise FileNotFoundError(errno.ENOENT, "not a regular file")
        data = Path(path).read_bytes()
    except OSError as e:
        load_model_file(path)  # its one-line error: no such file, a directory, a FIFO...
        raise PhazeError(f"{path}: cannot be read ({e.strerror or e})") from None
    file_digest = digest(data)
    hit = _model_entry(file_digest, store)
    if hit is not None:
        name, sources = hit
    else:
        spec = load_model_file(path)
        name, sources = spec.name, [(str(f), _file_digest(str(f))) for f in spec.sources]
        store.keep(KIND, store.key(KIND, file_digest), {"name": name, "sources": [list(x) for x in sources]})
    return ModelKey(name, digest(repr((file_digest, sources))))


def _model_entry(file_digest: str, store: Store) -> tuple[str, list[tuple[str, str]]] | None:
    """The ``model`` entry of a model file of digest ``file_digest`` while every source it names
    still has the bytes it had (None otherwise)."""
    hit = store.load(KIND, store.key(KIND, file_digest), check_model)
    return hit if hit is not None and all(_file_digest(p) == d for p, d in hit[1]) else None


def model_known(path: str, store: Store) -> bool:
    """Whether :func:`model_key` can key ``path`` from its ``model`` entry, without importing the
    file (False when the file cannot be read: the import says why)."""
    try:
        if not Path(path).is_file():  # a FIFO or a device: the import says why
            return False
        data = Path(path).read_bytes()
    except OSError:
        return False
    return _model_entry(digest(data), store) is not None


def check_model(payload: Any) -> tuple[str, list[tuple[str, str]]]:
    """A ``model`` payload: the model's name and its sources ``(path, digest of its bytes)``."""
    d = fields(payload, ("name", "sources"), "a model name and its sources")
    need(isinstance(d["name"], str) and d["name"] != "", "a model name")
    sources = d["sources"]
    need(isinstance(sources, list), "the model's sources")
    ok = all(isinstance(x, list) and len(x) == 2 and all(isinstance(v, str) for v in x) for x in sources)
    need(ok, "(path, digest) of each source")
    return d["name"], [(x[0], x[1]) for x in sources]
