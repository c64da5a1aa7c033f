"""User-facing errors.

A :class:`PhazeError` is a problem with the user's input (a file, a model, an option, IR that
lacks what a pass needs).  It is an xDSL ``DiagnosticException``, so xDSL's tools treat it as a
diagnostic (``xdsl-opt --verify-diagnostics`` prints it; phaze's universe makes stock
``xdsl-opt`` print it as one line, see ``phaze/universe.py``), and phaze's own tools print its
message on one line and exit non-zero, without a traceback unless ``--debug``.  Anything else
escaping the tools is a bug in phaze and keeps its traceback.
"""

from xdsl.utils.exceptions import DiagnosticException

from phaze_ir.warning import PhazeWarning

__all__ = ["PhazeError", "PhazeWarning"]


class PhazeError(DiagnosticException):
    """A clear, one-line problem with the user's input."""


class ModelTooLarge(PhazeError):
    """A model beyond phaze's size bounds (``phaze_ir/frontend/trace.py``): refused as it is,
    never retried another way (the sweep's fallback would trace it again)."""
