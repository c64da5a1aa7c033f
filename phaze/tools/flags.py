"""The command lines of ``phazec`` and ``phaze-validate``, what they share: their option flags,
built from the fields that declare the options (``passes.algorithms.placement_options.option``)
and checked by those fields' checks before any work, a bad value one line naming its flag; their
workers, their output and their cache's size (``--cache-limit``), kept after the run."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import math
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from passes.algorithms.placement_options import (
    OptionError,
    check_option,
    declared_choices,
    field_type,
    option_flag,
    parsed_option,
    positive_count,
)
from phaze_ir.errors import PhazeError

#: The fields of ``phaze.options.Options`` that are the operator-scheduling solver's flags
#: (``--solver-time-limit``, ...), in the order the tools show them.
SOLVER_FIELDS = ("schedule_time_limit", "schedule_nodes", "schedule_max_binaries", "schedule_gap")


def print_checked(parser: argparse.ArgumentParser, message: str | None, file=None) -> None:
    """What argparse prints (``--help``, ``--version``, a usage error), stdout's checked as
    :func:`phaze.outputs.write_stdout` writes it: argparse drops a write's ``OSError``, so
    ``--help`` to a full device or a closed pipe ended with exit 0 and nothing said."""
    import sys

    if not message:
        return
    if file is not None and file is not sys.stdout:
        try:
            file.write(message)
        except (AttributeError, OSError):
            pass  # stderr gone: nothing left to say it on
        return
    from phaze.outputs import write_stdout

    try:
        write_stdout(message)
    except PhazeError as e:
        parser.exit(1, f"{parser.prog}: error: {e}\n")


class ToolParser(argparse.ArgumentParser):
    """argparse as phaze's tools use it: a bad command line is one line naming what is wrong
    (``phazec: error: argument --devices: invalid int value: 'nan' (phazec --help lists the
    options)``), not the usage dump; a value that begins with ``-`` (``--cache-limit -1GiB``)
    reaches its flag's own check instead of being read as an unknown flag; ``--version``; a
    help's ``{dotted.name}`` is spelled as what it names when the help is shown (:func:`spelled`:
    a run that does not show it need not import it)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        from phaze import __version__

        self.add_argument("--version", action="version", version=f"%(prog)s {__version__}")

    def format_help(self) -> str:
        for action in self._actions:
            if action.help:
                action.help = spelled(action.help)
        return super().format_help()

    def error(self, message: str):
        self.exit(2, one_line_error(self, message))

    def _print_message(self, message, file=None):
        print_checked(self, message, file)

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


def one_line_error(parser: argparse.ArgumentParser, message: str) -> str:
    """A bad command line as one line: ``<prog>: error: <message>`` (its control characters
    escaped), a did-you-mean for each unknown flag close to one of the parser's
    (:func:`did_you_mean`), and where the options are listed."""
    from phaze_ir.files import printable  # an option's value may hold control characters

    hint = did_you_mean(parser, message)
    return f"{parser.prog}: error: {printable(message + hint)} ({parser.prog} --help lists the options)\n"


def did_you_mean(parser: argparse.ArgumentParser, message: str) -> str:
    """``; --devics: did you mean --devices?`` for each unknown flag of argparse's
    ``unrecognized arguments: ...`` close to one of the parser's long flags (difflib's ratio
    of at least 0.6: a letter or two wrong, missing or swapped), else ""."""
    import difflib

    prefix = "unrecognized arguments: "
    if not message.startswith(prefix):
        return ""
    flags = sorted({s for a in parser._actions for s in a.option_strings if s.startswith("--")})
    hints = []
    for word in message[len(prefix) :].split():
        unknown = word.split("=")[0]
        if unknown.startswith("--") and unknown not in flags:
            close = difflib.get_close_matches(unknown, flags, n=1, cutoff=0.6)
            if close:
                hints.append(f"{unknown}: did you mean {close[0]}?")
    return "; " + "; ".join(hints) if hints else ""


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
    its help. A bool is a switch (with ``--no-FLAG`` too where ``defaults`` gives it None: the
    caller decides when neither is given); a tuple takes one value (``--micro-batch 4``: only that
    one, :func:`option_values`). The default is the field's (a tuple's: None, the field's
    own) unless ``defaults`` gives another, and the help says it, in ``default_words``' words,
    else the field's, else as a value; ``notes`` adds what this tool says of a flag, and a
    flag ``required`` has no default."""
    fields = {f.name: f for f in dataclasses.fields(options)}
    required = set(required)
    for name in names:
        f = fields[name]
        meta = f.metadata
        flag = option_flag(f)
        help_text = meta["help"] + (f"; {notes[name]}" if notes and name in notes else "")
        kind, one_of_tuple = _value_type(f)
        if kind is bool and (defaults or {}).get(name, False) is None:  # decided later: --flag and --no-flag
            said = (default_words or {}).get(name) or meta.get("default_words") or "off"
            help_text += f" (default: {said})"
            group.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
            continue
        if kind is bool:
            group.add_argument(flag, action="store_true", help=help_text)
            continue
        choices = declared_choices(f) if meta.get("choices") is not None else None
        keywords: dict[str, Any] = {"type": kind, "choices": choices, "metavar": meta.get("metavar")}
        if name in required:
            group.add_argument(flag, required=True, help=help_text, **keywords)
            continue
        default = (defaults or {}).get(name, None if one_of_tuple else f.default)
        said = (default_words or {}).get(name) or meta.get("default_words") or str(default)
        group.add_argument(flag, default=default, help=f"{help_text} (default: {said})", **keywords)


def _value_type(f: dataclasses.Field) -> tuple[type, bool]:
    """The type of a flag's value for field ``f``, and whether the field is a tuple of them
    (``tuple[int, ...] | None``: int, True); a typed option's is its text, which its field's
    ``parse`` reads."""
    if f.metadata.get("parse") is not None:
        return str, False
    text = field_type(f).removesuffix(" | None")
    if text.startswith("tuple[") and text.endswith(", ...]"):
        return _VALUE_TYPES[text[len("tuple[") : -len(", ...]")]], True
    return _VALUE_TYPES[text], False


def option_dest(options: type, name: str) -> str:
    """The argparse destination of field ``name``'s flag (``solver_gap`` for ``schedule_gap``)."""
    f = next(f for f in dataclasses.fields(options) if f.name == name)
    return option_flag(f).lstrip("-").replace("-", "_")


def parsed_flag(args: argparse.Namespace, options: type, name: str) -> Any:
    """Field ``name``'s flag as ``options`` holds it: its text parsed by the field's ``parse``
    (:func:`~passes.algorithms.placement_options.option`); a text it refuses as given (for the
    flag's check to name), a default as it is (typed already), None when the flag is not given."""
    value = getattr(args, option_dest(options, name), None)
    if not isinstance(value, str):
        return value
    try:
        return parsed_option(next(f for f in dataclasses.fields(options) if f.name == name), value)
    except ValueError:
        return value


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
            values[name] = (value,) if _value_type(fields[name])[1] else value
    return values


def check_option_flags(args: argparse.Namespace, options: type, names: Iterable[str] | None = None) -> None:
    """The option flags of the command line ``args`` that are fields of ``options`` (those
    ``names``, default every one given), each checked by the check its field declares
    (:func:`passes.algorithms.placement_options.check_option`), before any work: a bad value
    is one line naming its flag (``--solver-gap 1.0: expected a relative gap in [0, 1)``)."""
    fields = {f.name: f for f in dataclasses.fields(options)}
    for name, value in option_values(args, options, names).items():
        try:
            check_option(fields[name], value)
        except OptionError as e:
            raise PhazeError(e.named(e.flag)) from e


def check_jobs(args: argparse.Namespace) -> None:
    """``-j`` (when given): a count of worker processes."""
    problem = None if args.jobs is None else positive_count(args.jobs)
    if problem is not None:
        raise PhazeError(f"-j/--jobs {args.jobs}: {problem}")


#: A ``{dotted.name}`` in a help text (:func:`spelled`).
_NAMED = re.compile(r"\{([A-Za-z_]\w*(?:\.\w+)+)\}")


def spelled(text: str) -> str:
    """``text`` with each ``{dotted.name}`` in it spelled as the value it names
    (:func:`named_value`): a tuple as its items (``a100, h100``), a number as ``%g`` does."""

    def spell(match: re.Match) -> str:
        value = named_value(match.group(1))
        if isinstance(value, (tuple, list)):
            return ", ".join(map(str, value))
        return f"{value:g}" if isinstance(value, float) else str(value)

    return _NAMED.sub(spell, text)


def named_value(dotted: str) -> Any:
    """What ``dotted`` names: an attribute (or an attribute's attribute) of the longest prefix
    that is a module (``phaze.search.engine.SolverLimits.time_limit``), called when it is a
    function (``phaze_ir.hardware.preset_names``)."""
    parts = dotted.split(".")
    for i in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:i])
        try:
            value: Any = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:  # the module is there; something it imports is not
                raise
            continue
        for attribute in parts[i:]:
            value = getattr(value, attribute)
        return value() if inspect.isfunction(value) else value
    raise ValueError(f"{dotted}: names no module's attribute")


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
    group.add_argument(
        "-q", "--quiet", action="store_true", help="errors and warnings only: nothing on stderr on success"
    )
    group.add_argument("--debug", action="store_true", help="show Python tracebacks on errors")


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
    size = float(m.group(1)) * _SIZE_UNITS[unit] if m is not None and unit in _SIZE_UNITS else math.nan
    if not math.isfinite(size):  # (1e400 reads as infinity)
        raise argparse.ArgumentTypeError(f"{text!r}: expected a size such as 4GiB, 500MB or 0 (no limit)")
    return int(size)


def trim_cache_dir(directory: str, limit: int, log) -> None:
    """Keep ``directory`` (a cache) under ``limit`` bytes (0: no limit) after a run: its least
    recently used entries go first (``passes.cache_file.trim``), said in one line."""
    if limit <= 0 or not os.path.isdir(directory):
        return
    from passes.cache_file import trim

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
