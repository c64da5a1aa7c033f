"""How phaze's tools show a :class:`~phaze_ir.errors.PhazeWarning`: one line,
``phazec: warning: <message>``, instead of Python's ``file:line: Category: message`` and the
source line, and each message once per process (from whichever line of phaze, or worker, it comes)."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable

from phaze_ir.errors import PhazeError, PhazeWarning


def show_warnings_as(tool: str) -> None:
    """Print phaze's warnings as ``<tool>: warning: ...``; every other warning as before."""
    previous = warnings.showwarning
    shown: set[str] = set()  # Python's filter is per source line; the same message can come from two

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, PhazeWarning):
            if str(message) not in shown:
                shown.add(str(message))
                print(f"{tool}: warning: {message}", file=file or sys.stderr, flush=True)
        else:
            previous(message, category, filename, lineno, file, line)

    warnings.showwarning = show


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


def exit_status(tool: str, debug: bool, body: Callable[[], object]) -> int:
    """Run a tool's ``body`` and say how it ended: 0; a :class:`PhazeError` as one line
    ``<tool>: error: ...`` and 1 (``debug``: raised, with its traceback), a
    :class:`PartialOutput` as one such line per output not written and :data:`PARTIAL`; Ctrl-C
    as ``<tool>: interrupted`` and 130."""
    try:
        body()
    except PhazeError as e:
        if debug:
            raise
        for line in str(e).splitlines():
            print(f"{tool}: error: {line}", file=sys.stderr)
        return getattr(e, "status", 1)
    except KeyboardInterrupt:
        print(f"{tool}: interrupted", file=sys.stderr)
        return INTERRUPTED
    return 0
