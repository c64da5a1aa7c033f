"""``phaze-opt``: run any pipeline of phaze (and xDSL) passes over a ``.mlir`` file.

Like ``mlir-opt``/``xdsl-opt``: ``phaze-opt in.mlir -p "phaze-group-layers,pass{opt=v}"``
parses, verifies, runs the passes and prints the result (``--print-op-generic`` for MLIR's
generic form).  Passes of other packages registered under the ``xdsl.universe`` entry point are
available too; that is how users add their own passes.

``phaze-opt --help`` lists phaze's passes first, each with its one-line description and its
options, then the other passes by name; ``--help-pass NAME`` prints a pass's whole description
and ``--list-passes`` the listing alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import io
import os
import re
import shutil
import sys
import textwrap
from collections.abc import Callable, Sequence

from xdsl.passes import PassPipeline
from xdsl.utils.exceptions import ArgSpecParseError, DiagnosticException, ParseError
from xdsl.xdsl_opt_main import xDSLOptMain

from passes import ALL_PASSES
from phaze.messages import install_error_hook, message_lines
from phaze.outputs import refuse_clashes, write_atomically, write_stdout
from phaze.tools.flags import one_line_error, print_checked
from phaze_ir import keys
from phaze_ir.errors import PhazeError
from phaze_ir.files import printable, read_regular, shorten
from phaze_ir.ir import MLIRParseError, parse_text

#: The option types a pipeline spec can write (``pass{name=value}``): a field of another type
#: (``phaze-schedule-ops``' ``cache``, a Python object) is set by phazec from Python, never on a
#: command line, and is not listed as an option.
_SPEC_TYPES = frozenset({"str", "int", "float", "bool", "None"})

#: The longest one-line description before it is cut at its first colon (what follows a colon
#: in phaze's docstrings details the records a pass writes: the --help-pass text has them).
_SUMMARY_CHARS = 100


def _plain(text: str) -> str:
    """A docstring's reST as a terminal shows it: ````x```` as `x`."""
    return text.replace("``", "`")


def _without_parentheses(text: str) -> str:
    """``text`` without its parenthesised asides (nested ones too) and the space before each."""
    out, depth = [], 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
        elif not depth:
            out.append(ch)
    return re.sub(r" +([,.;:])", r"\1", re.sub(r" {2,}", " ", "".join(out))).strip()


def _docstring(cls: type) -> str:
    """The pass class's own docstring, dedented ("" without one: not a base class's, which
    inspect.getdoc would give, nor the signature dataclasses write for a class without one)."""
    doc = cls.__dict__.get("__doc__")
    if not isinstance(doc, str) or doc.startswith(f"{cls.__name__}("):
        return ""
    return inspect.cleandoc(doc)


def pass_summary(cls: type) -> str:
    """A pass's one-line description: its docstring's first sentence without the asides in
    parentheses (cut at its first colon when still long); "" for a pass without a docstring."""
    doc = _docstring(cls)
    if not doc:
        return ""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    sentence = re.split(r"(?<=\.)\s+(?=[A-Z`])", _without_parentheses(_plain(first)), maxsplit=1)[0]
    if len(sentence) > _SUMMARY_CHARS and ": " in sentence:
        sentence = sentence.split(": ", 1)[0]
    return sentence.rstrip(".:;, ") + "."


def _spec_value(value, text: bool = False) -> str:
    """A default as a pipeline spec writes it: ``"adam"``, ``true``, ``10.0`` (``text``: a
    typed option's, as its text: ``"1"``)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str) or text:
        return f'"{value}"'
    return repr(value)


def _spec_kind(field: dataclasses.Field, nameless: str = "") -> str:
    """The type a pipeline spec gives option ``field`` as: its annotation (``int | None``), or
    ``str`` for a typed option (one that declares a parse: ``zero: Zero``), whose text the pass
    parses as phazec does (``passes/algorithms/placement_options.py``); ``nameless`` for a type
    object without a name."""
    if field.metadata.get("parse") is not None:
        return "str"
    return field.type if isinstance(field.type, str) else getattr(field.type, "__name__", nameless)


def pass_options(cls: type) -> list[str]:
    """A pass's options as ``name: type = default`` (``name: type`` for a required one), in the
    order of its dataclass fields: the ones a pipeline spec can set (:data:`_SPEC_TYPES`)."""
    out = []
    for field in dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ():
        if field.name == "name" or not field.init:
            continue
        kind = _spec_kind(field, str(field.type))
        if not {t.strip() for t in kind.split("|")} <= _SPEC_TYPES and not kind.startswith(("tuple[", "list[")):
            continue
        if field.default is not dataclasses.MISSING:
            out.append(f"{field.name}: {kind} = {_spec_value(field.default, kind == 'str')}")
        elif field.default_factory is not dataclasses.MISSING:
            out.append(f"{field.name}: {kind} = {_spec_value(field.default_factory())}")
        else:
            out.append(f"{field.name}: {kind} (required)")
    return out


def _width() -> int:
    return max(60, min(100, shutil.get_terminal_size((100, 24)).columns) - 2)


def passes_listing(available: dict[str, Callable[[], type]], width: int | None = None) -> str:
    """phaze's passes, each with its one-line description and its options, then the others
    (xDSL's, and those of installed packages) by name."""
    width = width or _width()
    lines = ["phaze's passes (-p 'NAME{OPTION=VALUE ...}'; --help-pass NAME: a pass's whole description):"]
    for name, factory in ALL_PASSES.items():
        cls = factory()
        lines.append(f"  {name}")
        summary = pass_summary(cls)
        if summary:
            lines += textwrap.wrap(summary, width, initial_indent=" " * 6, subsequent_indent=" " * 6)
        options = pass_options(cls)
        if options:
            # Each option on one line: its spaces made unbreakable for the wrap (a no-break
            # space is not whitespace to textwrap), then plain again.
            text = "options: " + ", ".join(o.replace(" ", "\xa0") for o in options)
            wrapped = textwrap.wrap(text, width, initial_indent=" " * 6, subsequent_indent=" " * 15)
            lines += [line.replace("\xa0", " ") for line in wrapped]
    others = sorted(n for n in available if n not in ALL_PASSES)
    lines += ["", f"other passes (xDSL's, and those of installed packages: {len(others)}):"]
    lines += textwrap.wrap(
        ", ".join(others), width, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False
    )
    return "\n".join(lines) + "\n"


def pass_help(name: str, available: dict[str, Callable[[], type]]) -> str:
    """``--help-pass NAME``: the pass's whole docstring and its options (a :class:`PhazeError`
    naming the closest pass when there is no such pass)."""
    factory = available.get(name)
    if factory is None:
        near = difflib.get_close_matches(name, list(available), n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise PhazeError(f"--help-pass {shorten(name)}: no such pass{hint}; phaze-opt --list-passes lists them")
    cls = factory()
    doc = _plain(_docstring(cls))
    lines = [name, ""]
    for paragraph in (doc or "(no description)").split("\n\n"):
        lines += textwrap.wrap(" ".join(paragraph.split()), _width(), initial_indent="  ", subsequent_indent="  ")
        lines.append("")
    options = pass_options(cls)
    if not options:
        return "\n".join([*lines, "no options"]) + "\n"
    lines.append("options:")
    helps = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}
    for option in options:
        lines.append(f"  {option}")
        help_text = helps[option.split(":")[0]]
        lines += textwrap.wrap(
            help_text, _width(), initial_indent=" " * 6, subsequent_indent=" " * 6, break_on_hyphens=False
        )
    return "\n".join(lines) + "\n"


#: What a pass option of each type takes, in words (a pipeline spec's value of another type).
_OPTION_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false"}


def _spec_error_line(spec: str, e: ArgSpecParseError) -> str:
    """xDSL's pipeline syntax error (a heading, ``pass-pipeline:LINE:COL``, the spec, a caret
    and the reason: five lines) in one: the column, the reason and the text there."""
    lines = str(e).strip().split("\n")
    where = re.search(r":(\d+):(\d+)$", lines[1].strip()) if len(lines) > 1 else None
    why = lines[-1].strip() if len(lines) > 2 else "cannot be parsed"
    col = int(where[2]) if where else 0
    at = f" at column {col} ('{printable(spec[col - 1 : col + 19])}')" if col else ""
    return (
        f"-p '{printable(shorten(spec))}': {why.rstrip('.').lower()}{at}; a value holding ':', ',' or spaces is "
        'quoted: NAME{OPTION="a:b,c"}'
    )


def check_pipeline_spec(spec: str | None, available: dict[str, Callable[[], type]]) -> None:
    """A pipeline spec that xDSL cannot parse, or a phaze pass option whose value is of the
    wrong type, in one line naming the pass and the option (xDSL says five lines, or
    "Incompatible types: given (3,), expected <class 'str'>" naming neither)."""
    if not spec:
        return
    from xdsl.utils.arg_spec import parse_pipeline

    try:
        specs = list(parse_pipeline(spec))
    except ArgSpecParseError as e:
        raise PhazeError(_spec_error_line(spec, e)) from None
    for one in specs:
        if one.name not in ALL_PASSES:
            continue  # an unknown pass: xDSL names it; another package's pass: its own checks
        cls = ALL_PASSES[one.name]()
        kinds = {f.name: _spec_kind(f) for f in dataclasses.fields(cls)}
        for option, values in one.parameters.items():
            kind = {k.strip() for k in str(kinds.get(option, "")).split("|")} - {"None"}
            if option not in kinds or len(values) != 1:
                continue  # xDSL names an unknown option; a list is for the pass to check
            value = values[0]
            ok = (
                ("str" in kind and isinstance(value, str))
                or ("bool" in kind and isinstance(value, bool))
                or ("int" in kind and isinstance(value, int) and not isinstance(value, bool))
                or ("float" in kind and isinstance(value, (int, float)) and not isinstance(value, bool))
            )
            if ok or not kind <= {"str", "int", "float", "bool"}:
                continue
            shown = printable(shorten(str(value).lower() if isinstance(value, bool) else str(value)))
            if isinstance(value, str):  # quoted in the spec, or a word such as nan
                shown = f'"{shown}"' if not re.fullmatch(r"[A-Za-z_][\w.-]*", shown) or value.isdigit() else shown
            if "str" in kind:
                expected = f'a string (quote it: {option}="{shown}")'
            else:
                expected = " or ".join(_OPTION_WORDS[k] for k in sorted(kind - {"int"} if "float" in kind else kind))
            raise PhazeError(f"{one.name}: {option}={shown}: expected {expected}")


#: The most bytes phaze-opt reads as its input (a file or stdin).
_INPUT_LIMIT = 1 << 30


class _BufferedOutput(io.StringIO):
    """An output stream that keeps what was written when xDSL's driver closes it."""

    text = ""

    def close(self) -> None:
        self.text = self.getvalue()
        super().close()


class _CheckedStdout(io.StringIO):
    """stdout for xDSL's driver: each write goes out at once, checked
    (:func:`phaze.outputs.write_stdout`: a full device or a file-size limit is an error, not a
    module cut short with exit 0), in order with what xDSL prints between modules."""

    def write(self, text: str) -> int:
        write_stdout(text)
        return len(text)

    def flush(self) -> None:
        pass


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

    def setup_pipeline(self):
        check_pipeline_spec(self.args.passes, self.available_passes)
        # After each pass, the module's keys and its plan's relations are verified again
        # (phaze_ir.plan_check): a pass that would leave a plan contradicting itself (a TP
        # width its plan was not placed for) is refused, naming the pass and the relation.
        super().setup_pipeline()
        xdsl_callback = self.pipeline.callback

        def callback(previous_pass, module, next_pass) -> None:
            if xdsl_callback is not None:
                xdsl_callback(previous_pass, module, next_pass)
            if previous_pass is not None:
                try:
                    keys.check_module(module)
                except PhazeError as e:
                    raise PhazeError(f"{previous_pass.name} would leave the module contradicting itself: {e}") from e

        self.pipeline = PassPipeline(self.pipeline.passes, callback)

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

    def get_input_name(self):
        return "stdin" if self.args.input_file in (None, "-") else self.args.input_file

    def get_input_stream(self):
        # Only a regular file, of a bounded size, opened without blocking: a FIFO or /dev/zero
        # as the input is one line, not a hang or a read until memory runs out.  "-" is stdin,
        # as mlir-opt reads it; stdin too is read up to the bound.
        if self.args.input_file in (None, "-"):
            data = sys.stdin.buffer.read(_INPUT_LIMIT + 1)
            if len(data) > _INPUT_LIMIT:
                raise PhazeError(f"stdin: holds more than the {_INPUT_LIMIT >> 30} GiB an .mlir input may hold")
            return io.BytesIO(data), "mlir"
        data = read_regular(self.args.input_file, _INPUT_LIMIT, ".mlir file")
        return io.BytesIO(data), os.path.splitext(self.args.input_file)[1].replace(".", "")

    def prepare_output(self):
        # The output is kept in memory and written (atomically) only after the whole run has
        # succeeded: `phaze-opt x.mlir -o x.mlir` must not truncate its own input before reading
        # it, and a failed run must leave the previous output file as it was.
        if self.args.output_file is None:
            return _CheckedStdout()
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
        available = self.available_passes
        arg_parser.prog = "phaze-opt"  # not "phaze_opt.py" under python -m
        # A bad command line in one line, with a did-you-mean for a misspelt flag (as phazec's).
        arg_parser.error = lambda message: arg_parser.exit(2, one_line_error(arg_parser, message))
        # --version (and anything else argparse prints) on stdout, checked
        arg_parser._print_message = lambda message, file=None: print_checked(arg_parser, message, file)
        # The pass listing keeps its own line breaks (argparse would refill it into one paragraph).
        arg_parser.formatter_class = argparse.RawDescriptionHelpFormatter
        # xDSL's -p help is every pass's name in one paragraph, phaze's lost among them: the
        # listing after the options says them, phaze's first with their descriptions.
        actions = arg_parser._option_string_actions  # (argparse keeps them by option string)
        actions["--version"].help = "print phaze-opt's version and exit"
        pipeline = "the pass pipeline: comma-separated NAME or NAME{OPTION=VALUE ...} (the passes are listed below)"
        actions["--passes"].help = pipeline

        class ListingHelp(argparse.Action):
            """-h/--help, with the pass listing as its epilog: made only when asked for (the
            descriptions import every phaze pass, 0.7 s that no other run of phaze-opt needs)."""

            def __call__(self, parser, namespace, values, option_string=None):
                parser.epilog = passes_listing(available)
                write_stdout(parser.format_help())  # checked: a full device is an error, not exit 0
                parser.exit()

        actions["--help"].__class__ = ListingHelp

        class ListPasses(argparse.Action):
            def __call__(self, parser, namespace, values, option_string=None):
                write_stdout(passes_listing(available))
                parser.exit()

        class HelpPass(argparse.Action):
            def __call__(self, parser, namespace, values, option_string=None):
                write_stdout(pass_help(values, available))
                parser.exit()

        arg_parser.add_argument(
            "--list-passes", nargs=0, action=ListPasses, help="list the passes (phaze's with their options) and exit"
        )
        arg_parser.add_argument(
            "--help-pass",
            metavar="NAME",
            action=HelpPass,
            help="print a pass's whole description and options, and exit",
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    install_error_hook("phaze-opt", debug)  # before xDSL builds a pass from phaze's universe
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
            raise  # with its traceback (phaze's hook, installed with debug, passes it on)
        if isinstance(e, ParseError):
            # As MLIR's tools begin: `file:line:col: error: message (at '...')`, in one line.
            error = e if isinstance(e, MLIRParseError) else MLIRParseError(e.span, e.msg.strip())
            print("\n".join(error.message_lines()), file=sys.stderr)
            return 1
        if isinstance(e, PhazeError):
            lines = message_lines(e)  # each line safe to print
        elif isinstance(e, ArgSpecParseError):
            # xDSL's pipeline error: a heading, the spec's line around the error and a caret
            lines = [printable(shorten(line)) for line in str(e).strip().split("\n")]
        elif isinstance(e, OSError) and e.filename:
            lines = [printable(f"{e.filename}: {e.strerror}")]
        else:
            # xDSL's messages (a verifier's, a pass option's) quote the input whole: cut them.
            lines = [printable(shorten(str(e).strip()))]
        print("\n".join([f"phaze-opt: error: {lines[0]}", *lines[1:]]), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("phaze-opt: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
