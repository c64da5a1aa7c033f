"""How phaze's tools show a :class:`~phaze_ir.errors.PhazeWarning`: one line,
``phazec: warning: <message>``, instead of Python's ``file:line: Category: message`` and the
source line, and each message once per process (from whichever line of phaze, or worker, it comes);
and an uncaught :class:`~phaze_ir.errors.PhazeError` as ``error: <message>``
(:func:`install_error_hook`, which the tools' ``main`` calls: importing phaze changes nothing).

Every message is printed safe (:func:`message_lines`, :func:`phaze_ir.files.printable`): a
control character quoted from the input (a file name, a config value, an option's value) is
escaped, so an escape code cannot colour or move the terminal and a newline or carriage return
cannot forge a second ``error:`` line; a refusal is one line (an error that is several lines by
design, one line per output not written, says its lines itself)."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Iterator

from phaze_ir.errors import PhazeError, PhazeWarning
from phaze_ir.files import printable
from phaze_ir.warning import first_line as _first_line
from phaze_ir.warning import route_transformers, routed_for_the_process


def message_lines(error: BaseException) -> list[str]:
    """The lines ``error`` prints, each safe (:func:`phaze_ir.files.printable`): one line, its
    message with every control character escaped (a newline quoted from the input included);
    the lines of an error that has its own (its ``message_lines()``: a parse error's one line
    that quotes the source, one line per output not written)."""
    own = getattr(error, "message_lines", None)
    lines = own() if callable(own) else [str(error).strip()]
    return [printable(line) for line in lines] or [""]


def log_line(tool: str, message: str, block: bool = False) -> str:
    """``<tool>: <message>``, one line, the message safe; ``block``: a message several lines by
    design (``plan:`` and the summary, whose lines are escaped where they are made), each line
    escaped."""
    if not block:
        return f"{tool}: {printable(message)}"
    return "\n".join(printable(line) for line in f"{tool}: {message}".split("\n"))


def show_warnings_as(tool: str) -> None:
    """Print every warning as one line, ``<tool>: warning: ...``, each message once: phaze's as
    they are, a library's (torch's, transformers') with its category and the package it came
    from, never Python's ``file:line: Category: message`` and the source line under it; and
    transformers' logged warnings the same way (:func:`transformers_through_warnings`, for the
    life of the process: a tool owns it)."""
    shown: set[str] = set()  # Python's filter is per source line; the same message can come from two

    def show(message, category, filename, lineno, file=None, line=None):
        said = printable(warning_text(message, category, filename))
        if said not in shown:
            shown.add(said)
            print(f"{tool}: warning: {said}", file=file or sys.stderr, flush=True)

    warnings.showwarning = show
    route_transformers(True, for_the_process=True)


def warning_text(message: Warning | str, category: type[Warning], filename: str) -> str:
    """What a tool says of a warning after ``<tool>: warning:``: phaze's message whole (its
    newlines escaped when printed), a library's or a model file's with its category and the
    package it came from, its first line only."""
    said = str(message).strip()
    if issubclass(category, PhazeWarning):
        return said
    return f"{category.__name__} from {_package_of(str(filename))}: {_first_line(said)}"


def _package_of(filename: str) -> str:
    """The top package of the file a warning names (``transformers``, ``torch``), not its path."""
    parts = filename.replace("\\", "/").split("/")
    for root in ("site-packages", "dist-packages"):
        if root in parts and parts.index(root) + 1 < len(parts):
            return parts[parts.index(root) + 1].removesuffix(".py")
    return os.path.basename(filename).removesuffix(".py") or "python"


@contextlib.contextmanager
def transformers_through_warnings() -> Iterator[None]:
    """transformers' logged warnings said through :mod:`warnings` while the block runs
    (``phaze.compile``: the caller's process keeps its logging as it was afterwards)."""
    if routed_for_the_process():  # a tool's, for the whole process
        yield
        return
    import transformers  # noqa: F401  (its logger and handler, made on import, to be filtered)

    route_transformers(True)
    try:
        yield
    finally:
        route_transformers(False)


#: The exit status after Ctrl-C (128 + SIGINT, as a shell reports a process it interrupted).
INTERRUPTED = 130
#: The exit status of a run that wrote some of its outputs but not all: an ``--export`` whose
#: target cannot launch the plan (phazec writes ``-o``, ``--json``, ``--report`` and the other
#: exports, and says the refused one in one line). 1 is an error with nothing written, 2
#: argparse's usage error.
PARTIAL = 4


class PartialOutput(PhazeError):
    """Some outputs were written and these were not (one line each): exit :data:`PARTIAL`."""

    status = PARTIAL

    def __init__(self, *lines: str) -> None:
        super().__init__("\n".join(lines))
        self.lines = list(lines)

    def message_lines(self) -> list[str]:
        return self.lines


def _require_temporary_folder() -> None:
    """A usable temporary folder, or one line before any work: importing torch writes there, and
    without one (a full disk, ``ulimit -f 0``: ``tempfile`` probes each folder by writing) the
    first import fails inside a library that goes on without it, and the model file's own
    ``import torch`` then says only that torch cannot be initialized twice."""
    import tempfile

    try:
        tempfile.gettempdir()
    except OSError as e:
        raise PhazeError(f"no usable temporary folder (TMPDIR): {e.strerror or e}") from None


def exit_status(tool: str, debug: bool, body: Callable[[], object]) -> int:
    """Run a tool's ``body`` and say how it ended: 0; a :class:`PhazeError` as one line
    ``<tool>: error: ...`` and 1 (``debug``: raised, with its traceback), a
    :class:`PartialOutput` as one such line per output not written and :data:`PARTIAL`; Ctrl-C
    as ``<tool>: interrupted`` and 130."""
    try:
        _require_temporary_folder()
        body()
    except PhazeError as e:
        if debug:
            raise
        for line in message_lines(e):
            print(f"{tool}: error: {line}", file=sys.stderr)
        return getattr(e, "status", 1)
    except KeyboardInterrupt:
        print(f"{tool}: interrupted", file=sys.stderr)
        return INTERRUPTED
    return 0


def install_error_hook(tool: str | None = None, debug: bool = False) -> None:
    """Print an uncaught :class:`PhazeError` as ``<tool>: error: <line>`` (``error: <line>``
    without a tool, as ``mlir-opt`` says it), one per line of its message, and exit with status 1;
    every other exception goes to the hook found.  ``debug`` (or ``PHAZE_DEBUG=1`` in the
    environment) keeps the traceback.

    The exception hook is the process's, so only what owns the process calls this: phaze's
    tools' ``main`` (``phazec``, ``phaze-opt``, ``phaze-validate``), and a stock xDSL tool when
    it builds one of phaze's passes from phaze's universe (``phaze/universe.py``; importing that
    module installs nothing).  Called again, it replaces its own hook (the new tool and
    ``debug``) rather than wrapping it."""
    previous = sys.excepthook
    previous = getattr(previous, "phaze_previous", previous)
    prefix = f"{tool}: error: " if tool else "error: "

    def hook(kind, value, traceback):
        if isinstance(value, PhazeError) and not debug and not os.environ.get("PHAZE_DEBUG"):
            for line in message_lines(value):
                print(f"{prefix}{line}", file=sys.stderr)
            return
        previous(kind, value, traceback)

    hook.phaze_previous = previous  # type: ignore[attr-defined]
    sys.excepthook = hook


def error_hook_installed() -> bool:
    """Whether :func:`install_error_hook` installed the process's exception hook."""
    return hasattr(sys.excepthook, "phaze_previous")
