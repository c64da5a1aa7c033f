"""Load a user's ``MODEL.py``.

The contract of a model file:

- ``get_model()`` returns a ``torch.nn.Module`` (build it on the ``meta`` device or from a
  config: phaze never needs weights);
- ``get_inputs(micro_batch_size)`` (optionally ``get_inputs(micro_batch_size, seq_len)``)
  returns the example inputs of one micro-batch, as a tuple of positional arguments or a dict
  of keyword arguments;
- optional ``NAME`` (str) and ``SEQ_LEN`` (int);
- optional ``loss_fn(output)`` mapping the model's output to a scalar loss (by default the
  output's ``.loss``, else the output itself when it is a scalar, else its sum).

A model file may import helpers that sit beside it (or any module of the user's). The files of
those modules are the model's *sources* (:attr:`ModelSpec.sources`): what a cached answer about
the model must be keyed on besides the model file itself (:mod:`phaze.search.warm`).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import sys
import sysconfig
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from phaze_ir.errors import PhazeError
from phaze_ir.files import shorten


@dataclass
class ModelSpec:
    """What a model file provides (see the module docstring)."""

    path: Path
    name: str
    get_model: Callable[[], Any]
    get_inputs: Callable[..., Any]
    seq_len: int | None
    loss_fn: Callable[[Any], Any] | None
    takes_seq_len: bool
    #: The other Python files of the user's that importing the model file loaded, sorted (see
    #: :func:`user_sources`).
    sources: tuple[Path, ...] = ()

    def inputs(self, micro_batch_size: int, seq_len: int | None = None) -> tuple[tuple, dict]:
        """The example inputs as ``(args, kwargs)``."""
        if seq_len is not None and not self.takes_seq_len:
            raise PhazeError(f"{self.path.name}: --seq-len was given but get_inputs() takes no seq_len argument")
        if self.takes_seq_len:
            out = self.get_inputs(micro_batch_size, seq_len if seq_len is not None else self.seq_len)
        else:
            out = self.get_inputs(micro_batch_size)
        if isinstance(out, dict):
            return (), dict(out)
        if isinstance(out, (tuple, list)):
            return tuple(out), {}
        return (out,), {}


def _user_frame(exc: BaseException, path: Path) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
    if frames:
        return f"{path.name}:{frames[-1].lineno}: "
    return f"{path.name}: "


def _quoted_error(e: BaseException) -> str:
    """``Type: message`` of an exception the model file raised, its message as a message quotes
    the input (:func:`shorten`: a word of 2 MB is cut)."""
    return f"{type(e).__name__}: {shorten(str(e))}"


def _syntax_error(e: SyntaxError, path: Path) -> str:
    """``FILE:LINE:COL: syntax error: MESSAGE`` for a syntax error met importing the model file
    ``path``: in the file it is in (the model file, or a module it imports, named as its path
    relative to the model's directory), at the line and column Python gives.  Python gives
    neither file nor line for a file holding a NUL byte ("source code string cannot contain null
    bytes"): the model file's first NUL then, or the model's line that imported the module that
    holds one.  Code the model compiles itself (``exec``, ``compile``) has no file: the model
    file's line that ran it, with the line in the code."""
    msg = e.msg or "invalid syntax"
    line, col = e.lineno, e.offset
    if e.filename is None and "null bytes" in msg:  # Python names neither the file nor the line
        line, col = _first_nul(path)
        if line is None:  # not the model file: a module it imports, at the model's import line
            return f"{_user_frame(e, path)}syntax error in a module the model file imports: {msg}"
        return f"{path.name}:{line}:{col}: syntax error: {msg}"
    if not e.filename or e.filename.startswith("<"):  # exec("..."), compile(...): where the model ran it
        at = f" (at line {line} of the code it compiles)" if line else ""
        return f"{_user_frame(e, path)}syntax error in code the model file compiles: {msg}{at}"
    file = Path(e.filename).resolve()
    name = file.relative_to(path.parent) if file.is_relative_to(path.parent) else file
    imported = "" if file == path else f" (imported by {path.name})"
    if line is None:
        return f"{name}: syntax error: {msg}{imported} (Python gives no line for it)"
    return f"{name}:{line}{f':{col}' if col else ''}: syntax error: {msg}{imported}"


def _first_nul(file: Path) -> tuple[int | None, int | None]:
    """Line and column (from 1) of the first NUL byte of ``file`` (None, None: none, or unread)."""
    try:
        data = file.read_bytes()
    except OSError:
        return None, None
    at = data.find(b"\0")
    if at < 0:
        return None, None
    start = data.rfind(b"\n", 0, at) + 1
    return data.count(b"\n", 0, at) + 1, at - start + 1


def load_model_file(path: str | os.PathLike) -> ModelSpec:
    """Import ``path`` as a module and check that it follows the model-file contract."""
    # No hub traffic, ever: models are built from configs in code.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # transformers' info-level chatter (e.g. about the default loss) is noise on phazec's stderr.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    p = Path(path)
    if not p.exists():
        raise PhazeError(f"{path}: no such file")
    if p.is_dir():
        raise PhazeError(f"{path}: is a directory, expected a MODEL.py file")
    p = p.resolve()
    module_name = f"phaze_model_{p.stem}_{abs(hash(str(p)))}"
    spec = importlib.util.spec_from_file_location(module_name, p)
    if spec is None or spec.loader is None:
        raise PhazeError(f"{path}: cannot be imported as a Python file")
    module: ModuleType = importlib.util.module_from_spec(spec)
    # Model files may import helpers that sit beside them: as they are on disk now, not as an
    # earlier model file of this process imported them.
    _forget_modules_under(p.parent)
    sys.path.insert(0, str(p.parent))
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        raise PhazeError(_syntax_error(e, p)) from e
    except Exception as e:  # the user's module raised while importing
        raise PhazeError(f"{_user_frame(e, p)}error while importing the model file: {_quoted_error(e)}") from e
    except SystemExit as e:  # phaze would exit with the model's status and say nothing
        where = _user_frame(e, p)
        raise PhazeError(f"{where}the model file called sys.exit({e.code!r}) while being imported") from None
    except KeyboardInterrupt:  # the user's Ctrl-C stays one
        raise
    except BaseException as e:  # a BaseException subclass of the model's own: one line, not a traceback
        where = _user_frame(e, p)
        raise PhazeError(f"{where}error while importing the model file: {_quoted_error(e)}") from None
    finally:
        sys.path.remove(str(p.parent))
    get_model = getattr(module, "get_model", None)
    get_inputs = getattr(module, "get_inputs", None)
    if not callable(get_model):
        raise PhazeError(f"{p.name}: defines no get_model() function (it must return a torch.nn.Module)")
    if not callable(get_inputs):
        raise PhazeError(f"{p.name}: defines no get_inputs(micro_batch_size) function")
    seq_len = getattr(module, "SEQ_LEN", None)
    if seq_len is not None and (not isinstance(seq_len, int) or seq_len <= 0):
        raise PhazeError(f"{p.name}: SEQ_LEN = {seq_len!r}: expected a positive integer")
    name = getattr(module, "NAME", p.stem)
    params = list(inspect.signature(get_inputs).parameters)
    return ModelSpec(
        path=p,
        name=str(name),
        get_model=get_model,
        get_inputs=get_inputs,
        seq_len=seq_len,
        loss_fn=getattr(module, "loss_fn", None),
        takes_seq_len=len(params) >= 2,
        sources=tuple(f for f in user_sources() if f != p),
    )


@functools.cache
def _resolved(file: str) -> Path:
    """``Path(file).resolve()``, once per file name: both scans below resolve every module of
    ``sys.modules`` (thousands with torch): 0.21 s of every model load, 0.07 s with this."""
    return Path(file).resolve()


def _installed_roots() -> tuple[Path, ...]:
    """Where code that is not the user's lives: the standard library, the installed packages
    and phaze's own packages (the cache keys on those by version and source digest)."""
    paths = sysconfig.get_paths()
    kinds = ("stdlib", "platstdlib", "purelib", "platlib", "scripts")
    roots = {Path(paths[k]).resolve() for k in kinds if k in paths}
    phaze_root = Path(__file__).resolve().parents[2]
    roots |= {phaze_root / pkg for pkg in ("phaze_ir", "passes", "phaze")}
    return tuple(sorted(roots))


def _forget_modules_under(directory: Path) -> None:
    """Drop the user's modules loaded from ``directory`` (or below) from ``sys.modules``, so that a
    model file importing them gets them as they are now (phaze's own modules are never dropped)."""
    roots = _installed_roots()
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and file:
            path = _resolved(file)
            if path.is_relative_to(directory) and not any(path.is_relative_to(r) for r in roots):
                del sys.modules[name]


def user_sources() -> list[Path]:
    """The files of the modules loaded in this process that are the user's: neither the standard
    library, nor an installed package, nor phaze.  After a model file is imported, these include
    every helper it imported at module level (directly or not, loaded now or before); a superset
    at worst (another model file's helpers), which only makes a cached answer recomputed more
    often.  Modules imported inside a function (``get_model``) are not loaded yet and not seen."""
    roots = _installed_roots()
    out = set()
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not isinstance(file, str) or not file:
            continue
        path = _resolved(file)
        if path.is_file() and not any(path.is_relative_to(r) for r in roots):
            out.add(path)
    return sorted(out)
