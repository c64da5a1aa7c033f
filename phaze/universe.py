"""The ``xdsl.universe`` entry point: stock xDSL tools (``xdsl-opt``) see phaze's dialect and
passes through it (``[project.entry-points."xdsl.universe"]`` in ``pyproject.toml``).

phaze's errors are xDSL diagnostics (``PhazeError`` is a ``DiagnosticException``).  Stock
``xdsl-opt`` prints a diagnostic only under ``--verify-diagnostics`` and otherwise lets it
escape as a traceback; so that a phaze pass run by stock ``xdsl-opt`` on IR that lacks what it
needs says so in one line, as ``mlir-opt`` would, loading this universe installs an exception
hook that prints an uncaught ``PhazeError`` as ``error: <message>`` (exit status 1) and
leaves every other exception to the hook it found (``PHAZE_DEBUG=1`` keeps the traceback).
"""

import os
import sys

from xdsl.universe import Universe

from passes import ALL_PASSES
from phaze_ir.errors import PhazeError


def _phaze_dialect():
    from phaze_ir.dialect import Phaze

    return Phaze


def _print_phaze_errors(previous):
    def hook(kind, value, traceback):
        if isinstance(value, PhazeError) and not os.environ.get("PHAZE_DEBUG"):
            print(f"error: {value}", file=sys.stderr)
            return
        previous(kind, value, traceback)

    hook.phaze = True
    return hook


if not getattr(sys.excepthook, "phaze", False):
    sys.excepthook = _print_phaze_errors(sys.excepthook)

PHAZE_UNIVERSE = Universe(all_dialects={"phaze": _phaze_dialect}, all_passes=dict(ALL_PASSES))
