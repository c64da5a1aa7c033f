"""Checks of the numbers on a tool's command line, shared by ``phazec`` and ``phaze-validate``:
each is done before any work, and a bad number is one line naming its flag; and their cache's
size (``--cache-limit``), kept after the run."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from phaze_ir.errors import PhazeError

#: The largest integer any flag may be: a 32-bit int, as Megatron-LM and torchtitan take these
#: flags (far beyond any real run; a larger one would overflow the DP's or torch's sizes instead).
MAX_INT = 2**31 - 1

#: The solver's counts, 0 meaning no limit.
SOLVER_COUNTS = ("solver_nodes", "solver_max_binaries")

#: The fields of ``phaze.options.Options`` that are the operator-scheduling solver's flags
#: (``--solver-time-limit``, ...), in the order the tools show them.
SOLVER_FIELDS = ("schedule_time_limit", "schedule_nodes", "schedule_max_binaries", "schedule_gap")


class ToolParser(argparse.ArgumentParser):
    """argparse as phaze's tools use it: a bad command line is one line naming what is wrong
    (``phazec: error: argument --devices: invalid int value: 'nan' (phazec --help lists the
    options)``), not the usage dump; a value that begins with ``-`` (``--cache-limit -1GiB``)
    reaches its flag's own check instead of being read as an unknown flag; ``--version``."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        from phaze import __version__

        self.add_argument("--version", action="version", version=f"%(prog)s {__version__}")

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} ({self.prog} --help lists the options)\n")

    def parse_known_args(self, args=None, namespace=None):
        import sys

        return super().parse_known_args(self._values_glued(list(sys.argv[1:] if args is None else args)), namespace)

    def _values_glued(self, argv: list[str]) -> list[str]:
        """``--flag -x`` as ``--flag=-x`` where ``--flag`` takes one value and ``-x`` is not a
        flag of this tool: argparse would otherwise say "expected one argument"."""
        one_value = [a for a in self._actions if a.option_strings and a.nargs is None and a.const is None]
        takes_one = {s for a in one_value for s in a.option_strings if s.startswith("--")}
        flags = {s for a in self._actions for s in a.option_strings}
        out: list[str] = []
        i = 0
        while i < len(argv):
            word = argv[i]
            if word == "--":
                out += argv[i:]
                break
            follows = argv[i + 1] if i + 1 < len(argv) else None
            dashed = follows is not None and follows.startswith("-") and follows.split("=")[0] not in flags
            if word in takes_one and dashed:
                out.append(f"{word}={follows}")
                i += 2
                continue
            out.append(word)
            i += 1
        return out


#: Where the search's candidates, or the validation's runs, are evaluated (``--backend``).
BACKENDS = ("local", "ray")

_VALUE_TYPES: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}


def add_option_arguments(
    group: argparse._ActionsContainer,
    options: type,
    names: Iterable[str],
    defaults: Mapping[str, object] | None = None,
    default_words: Mapping[str, str] | None = None,
    notes: Mapping[str, str] | None = None,
    required: Iterable[str] = (),
) -> None:
    """A flag for each field of the dataclass ``options`` in ``names``, from what the field
    declares (:func:`passes.algorithms.placement_options.option`): its flag (default
    ``--global-batch`` for ``global_batch``), its type, its choices or the shape of its value,
    its help. A bool is a switch; a tuple takes one value (``--micro-batch 4``: only that
    one, :func:`option_values`). The default is the field's (a tuple's: None, the field's
    own) unless ``defaults`` gives another, and the help says it, in ``default_words``' words,
    else the field's, else as a value; ``notes`` adds what this tool says of a flag, and a
    flag ``required`` has no default."""
    fields = {f.name: f for f in dataclasses.fields(options)}
    required = set(required)
    for name in names:
        f = fields[name]
        meta = f.metadata
        flag = meta.get("flag") or "--" + name.replace("_", "-")
        help_text = meta["help"] + (f"; {notes[name]}" if notes and name in notes else "")
        kind, one_of_tuple = _value_type(f.type)
        if kind is bool:
            group.add_argument(flag, action="store_true", help=help_text)
            continue
        choices = meta.get("choices")
        if isinstance(choices, str):  # the dotted name of the tuple that declares them
            module, _, attribute = choices.rpartition(".")
            choices = tuple(getattr(importlib.import_module(module), attribute))
        keywords: dict[str, Any] = {"type": kind, "choices": choices, "metavar": meta.get("metavar")}
        if name in required:
            group.add_argument(flag, required=True, help=help_text, **keywords)
            continue
        default = (defaults or {}).get(name, None if one_of_tuple else f.default)
        said = (default_words or {}).get(name) or meta.get("default_words") or str(default)
        group.add_argument(flag, default=default, help=f"{help_text} (default: {said})", **keywords)


def _value_type(annotation: object) -> tuple[type, bool]:
    """The type of a flag's value for a field annotated ``annotation`` (a string, as the
    dataclasses of ``from __future__ import annotations`` keep it), and whether the field is a
    tuple of them (``tuple[int, ...] | None``: int, True)."""
    text = str(getattr(annotation, "__name__", annotation)).removesuffix(" | None")
    if text.startswith("tuple[") and text.endswith(", ...]"):
        return _VALUE_TYPES[text[len("tuple[") : -len(", ...]")]], True
    return _VALUE_TYPES[text], False


def option_dest(options: type, name: str) -> str:
    """The argparse destination of field ``name``'s flag (``solver_gap`` for ``schedule_gap``)."""
    f = next(f for f in dataclasses.fields(options) if f.name == name)
    return (f.metadata.get("flag") or name).lstrip("-").replace("-", "_")


def option_values(args: argparse.Namespace, options: type, names: Iterable[str] | None = None) -> dict[str, Any]:
    """The fields ``names`` of ``options`` (default: each that is a flag of the command line
    ``args``) as ``args`` gives them: a flag not given (None) is left out, for the field's
    default or the caller's; a tuple's one value is the tuple of it."""
    fields = {f.name: f for f in dataclasses.fields(options)}
    if names is None:
        names = [n for n, f in fields.items() if f.metadata.get("help") and hasattr(args, option_dest(options, n))]
    values: dict[str, Any] = {}
    for name in names:
        value = getattr(args, option_dest(options, name))
        if value is not None:
            values[name] = (value,) if _value_type(fields[name].type)[1] else value
    return values


def add_worker_arguments(group: argparse._ActionsContainer, what: str) -> None:
    """``-j``, ``--backend`` and ``--address``: where the tool's work (``what``: its candidates,
    its runs) is done."""
    group.add_argument(
        "-j",
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="worker processes (default: the CPUs of this machine; 1 runs in-process)",
    )
    group.add_argument(
        "--backend",
        default="local",
        choices=BACKENDS,
        help=f"where {what} are evaluated: local processes (default) or a Ray cluster",
    )
    group.add_argument(
        "--address",
        default=None,
        metavar="ADDR",
        help="Ray cluster address (default: start a local Ray instance with -j CPUs)",
    )


def add_cache_limit_argument(group: argparse._ActionsContainer) -> None:
    """``--cache-limit``: the cache's size kept after the run (:func:`trim_cache_dir`)."""
    group.add_argument(
        "--cache-limit",
        type=cache_size,
        default=DEFAULT_CACHE_LIMIT,
        metavar="SIZE",
        help="after the run, remove the least recently used cache entries until the cache holds at most "
        "SIZE (bytes, or with a unit: 500MB, 4GiB; 0: no limit; default 4GiB)",
    )


def add_output_arguments(group: argparse._ActionsContainer) -> None:
    """``-q`` and ``--debug``: what the tool says on stderr."""
    group.add_argument("-q", "--quiet", action="store_true", help="no progress messages on stderr")
    group.add_argument("--debug", action="store_true", help="show Python tracebacks on errors")


def flag_name(dest: str) -> str:
    """The flag of an argparse destination, as the user may have typed it."""
    return "-j/--jobs" if dest == "jobs" else "--" + dest.replace("_", "-")


def check_positive_ints(args: argparse.Namespace, dests: Iterable[str]) -> None:
    """Each of ``dests`` (when given) in 1..MAX_INT."""
    for dest in dests:
        value = getattr(args, dest, None)
        if value is not None and not 1 <= value <= MAX_INT:
            raise PhazeError(f"{flag_name(dest)} {value}: expected a positive integer up to {MAX_INT}")


def check_solver_limits(args: argparse.Namespace) -> None:
    """The SCIP limits (when given): counts in 0..MAX_INT, a positive, finite time limit and a
    relative gap in [0, 1)."""
    for dest in SOLVER_COUNTS:
        value = getattr(args, dest, None)
        if value is not None and not 0 <= value <= MAX_INT:
            raise PhazeError(f"{flag_name(dest)} {value}: expected a number from 0 (no limit) to {MAX_INT}")
    limit = args.solver_time_limit
    if limit is not None and not (math.isfinite(limit) and limit > 0):
        raise PhazeError(f"--solver-time-limit {limit}: expected a positive, finite number of seconds")
    if not (math.isfinite(args.solver_gap) and 0 <= args.solver_gap < 1):
        raise PhazeError(f"--solver-gap {args.solver_gap}: expected a relative gap in [0, 1)")


#: A cache's size after a run, unless ``--cache-limit`` says otherwise (bytes): room for a few
#: hundred GPT-3 175B answers (each keeps its 11 MB plan; a search's keeps it twice, as its plan
#: stage and its answer) or thousands of smaller ones.
DEFAULT_CACHE_LIMIT = 4 * 2**30

_SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_SIZE_UNITS.update({"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40})


def cache_size(text: str) -> int:
    """``--cache-limit``'s value in bytes: a number with an optional unit (B, kB, MB, GB, TB or
    KiB, MiB, GiB, TiB, any case); 0 is no limit."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).upper() if m else ""
    if m is None or unit not in _SIZE_UNITS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a size such as 4GiB, 500MB or 0 (no limit)")
    return int(float(m.group(1)) * _SIZE_UNITS[unit])


def trim_cache_dir(directory: str, limit: int, log) -> None:
    """Keep ``directory`` (a cache) under ``limit`` bytes (0: no limit) after a run: its least
    recently used entries go first (``passes.algorithms.cache_file.trim``), said in one line."""
    if limit <= 0 or not os.path.isdir(directory):
        return
    from passes.algorithms.cache_file import trim

    removed, freed = trim(directory, limit)
    if removed:
        log(
            f"cache: removed the {removed} least recently used entries ({_size_text(freed)}) to keep "
            f"{directory} under {_size_text(limit)} (--cache-limit)"
        )


def _size_text(n: int) -> str:
    """``n`` bytes in the largest binary unit that keeps a number >= 1 (1.5 MiB)."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
