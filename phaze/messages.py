"""How phaze's tools show a :class:`~phaze_ir.errors.PhazeWarning`: one line,
``phazec: warning: <message>``, instead of Python's ``file:line: Category: message`` and the
source line.  Python's own filter already shows a recurring message once per process."""

from __future__ import annotations

import sys
import warnings

from phaze_ir.errors import PhazeWarning


def show_warnings_as(tool: str) -> None:
    """Print phaze's warnings as ``<tool>: warning: ...``; every other warning as before."""
    previous = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, PhazeWarning):
            print(f"{tool}: warning: {message}", file=file or sys.stderr, flush=True)
        else:
            previous(message, category, filename, lineno, file, line)

    warnings.showwarning = show
