"""How phaze's tools show a :class:`~phaze_ir.errors.PhazeWarning`: one line,
``phazec: warning: <message>``, instead of Python's ``file:line: Category: message`` and the
source line, and each message once per process (from whichever line of phaze, or worker, it comes)."""

from __future__ import annotations

import sys
import warnings

from phaze_ir.errors import PhazeWarning


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
