"""``phaze-opt``: run any pipeline of phaze (and xDSL) passes over a ``.mlir`` file.

Like ``mlir-opt``/``xdsl-opt``: ``phaze-opt in.mlir -p "phaze-group-layers,pass{opt=v}"``
parses, verifies, runs the passes and prints the result (``--print-op-generic`` for MLIR's
generic form).  Passes of other packages registered under the ``xdsl.universe`` entry point are
available too; that is how users add their own passes.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Sequence

from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException, ParseError
from xdsl.xdsl_opt_main import xDSLOptMain

from passes import ALL_PASSES
from phaze.outputs import refuse_clashes, write_atomically
from phaze_ir import keys
from phaze_ir.errors import PhazeError
from phaze_ir.files import read_regular, shorten
from phaze_ir.ir import MLIRParseError, parse_text


class _BufferedOutput(io.StringIO):
    """An output stream that keeps what was written when xDSL's driver closes it."""

    text = ""

    def close(self) -> None:
        self.text = self.getvalue()
        super().close()


class PhazeOptMain(xDSLOptMain):
    """xDSL's opt driver with phaze's dialect and passes always registered (also when the
    package's entry point is not installed, e.g. when run from a source tree)."""

    version_format = "phaze-opt (xdsl {xdsl_version})"

    def register_all_dialects(self):
        super().register_all_dialects()
        from phaze_ir.dialect import Phaze

        if "phaze" not in self.ctx.registered_dialect_names:
            self.ctx.register_dialect("phaze", lambda: Phaze)

    def register_all_passes(self):
        super().register_all_passes()
        for name, factory in ALL_PASSES.items():
            self.available_passes.setdefault(name, factory)

    def register_all_frontends(self):
        super().register_all_frontends()

        def parse_mlir(stream):
            # phaze's parser: a syntax error names file:line:col with a short excerpt, never a
            # whole (possibly multi-MB) line, and an empty file says so.
            module = parse_text(
                stream.read(), self.get_input_name(), self.ctx, allow_implicit_module=not self.args.no_implicit_module
            )
            keys.check_module(module)  # what the dialect's attributes cannot say: a module key's type
            return module

        self.available_frontends["mlir"] = parse_mlir

    def get_input_stream(self):
        # Only a regular file, of a bounded size, opened without blocking: a FIFO or /dev/zero
        # as the input is one line, not a hang or a read until memory runs out.
        if self.args.input_file is None:
            return super().get_input_stream()
        data = read_regular(self.args.input_file, 1 << 30, ".mlir file")
        return io.BytesIO(data), os.path.splitext(self.args.input_file)[1].replace(".", "")

    def prepare_output(self):
        # The output is kept in memory and written (atomically) only after the whole run has
        # succeeded: `phaze-opt x.mlir -o x.mlir` must not truncate its own input before reading
        # it, and a failed run must leave the previous output file as it was.
        if self.args.output_file is None:
            return super().prepare_output()
        refuse_clashes([("the input file", self.args.input_file)], [("-o", self.args.output_file)])
        self._buffered = _BufferedOutput()
        return self._buffered

    def run(self):
        self._buffered: _BufferedOutput | None = None
        super().run()
        if self._buffered is not None:
            write_atomically(self.args.output_file, self._buffered.text)

    def output_resulting_program(self, prog):
        # One trailing newline, as phazec writes: `phaze-opt f.mlir` reproduces f.mlir byte for byte.
        return super().output_resulting_program(prog).rstrip("\n") + "\n"

    def register_all_arguments(self, arg_parser):
        super().register_all_arguments(arg_parser)
        arg_parser.add_argument("--debug", action="store_true", help="show Python tracebacks on errors")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        PhazeOptMain(description="Run phaze pass pipelines over MLIR files", args=args).run()
    except (
        PhazeError,
        ParseError,
        DiagnosticException,
        ArgSpecParseError,
        OSError,
        ValueError,
    ) as e:
        if debug:
            os.environ["PHAZE_DEBUG"] = "1"  # phaze's universe hook then keeps the traceback too
            raise
        if isinstance(e, ParseError):
            # As MLIR's tools: `file:line:col: error: message`, then a short excerpt and a caret.
            error = e if isinstance(e, MLIRParseError) else MLIRParseError(e.span, e.msg.strip())
            print(error, file=sys.stderr)
            return 1
        message = str(e).strip()
        if not isinstance(e, PhazeError):
            # xDSL's messages (a verifier's, a pass option's) quote the input whole: cut them.
            # phaze's own quote excerpts already, and may name a file whose path is long.
            message = shorten(message)
        if isinstance(e, OSError) and e.filename:
            message = f"{e.filename}: {e.strerror}"
        print(f"phaze-opt: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("phaze-opt: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
