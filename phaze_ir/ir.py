"""Context, parsing and printing of phaze IR (one place, so every tool agrees on them)."""

from __future__ import annotations

import io

from xdsl.context import Context
from xdsl.dialects import builtin, func
from xdsl.dialects.builtin import ModuleOp
from xdsl.parser import Parser
from xdsl.printer import Printer

from phaze_ir.dialect import Phaze


def make_context() -> Context:
    """A context with the dialects phaze IR uses: builtin, func and phaze."""
    ctx = Context()
    ctx.load_dialect(builtin.Builtin)
    ctx.load_dialect(func.Func)
    ctx.load_dialect(Phaze)
    return ctx


def parse_module(text: str, name: str = "<input>") -> ModuleOp:
    """Parse MLIR text into a verified module (raises xDSL's ParseError with line and column)."""
    module = Parser(make_context(), text, name).parse_module()
    module.verify()
    return module


def print_module(module: ModuleOp, generic: bool = False) -> str:
    """Print a module as text; with ``generic`` in MLIR's generic op form."""
    out = io.StringIO()
    Printer(stream=out, print_generic_format=generic).print_op(module)
    out.write("\n")
    return out.getvalue()
