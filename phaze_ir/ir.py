"""Context, parsing and printing of phaze IR (one place, so every tool agrees on them)."""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from xdsl.context import Context
from xdsl.dialects import builtin, func
from xdsl.dialects.builtin import DenseArrayBase, IntegerType, ModuleOp
from xdsl.ir import Attribute, TypeAttribute
from xdsl.irdl.declarative_assembly_format import DenseArrayAttributeVariable
from xdsl.parser import Parser
from xdsl.printer import Printer
from xdsl.utils.exceptions import MultipleSpansParseError, ParseError, VerifyException
from xdsl.utils.lexer import Input, Span
from xdsl.utils.mlir_lexer import MLIRTokenKind, StringLiteral

from phaze_ir import keys
from phaze_ir.attributes import RecordAttr
from phaze_ir.dialect import Phaze
from phaze_ir.errors import PhazeError
from phaze_ir.files import printable, shorten

EXCERPT_CHARS = 40
"""Most characters of source that a parse error quotes from its column on (or, at the end of a
line, before it): a plan can hold a line of several MB, which an error must not print."""


def make_context() -> Context:
    """A context with the dialects phaze IR uses: builtin, func and phaze."""
    ctx = Context()
    ctx.load_dialect(builtin.Builtin)
    ctx.load_dialect(func.Func)
    ctx.load_dialect(Phaze)
    return ctx


#: The messages of a value out of its range (``phaze_ir.attributes``: a record field's range,
#: an integer past 64 bits; an attribute its own verifier refused, :func:`parse_text`): the value
#: was read whole and the message names the field, its record and the value, so it is shown in
#: one line, without the excerpt; so is a record's unknown or missing field (a value spelt wrong,
#: ``8e-08`` for a float, is a syntax error: its caret shows where).
NAMES_ITS_FIELD = re.compile(
    r"field '[^']*' of \S+( = |: integer out of range)|attribute '|unknown field '|\S+ is missing field"
)


@dataclass
class MLIRParseError(PhazeError, ParseError):
    """A syntax error in MLIR text, shown in one line as MLIR's tools begin theirs, with the
    source found at the error's column quoted after it::

        plan.mlir:16:2022: error: field 'fwd_s' of phaze.layer_latency takes a float literal, with
        a '.' (...) (at '8e-08, bwd_s = 3.9054501874947155e-0…')

    The quote is the line from the column on, at most ``EXCERPT_CHARS`` characters ("…" marks a
    cut), or, where nothing is left of the line there (an end of input), what comes before the
    column (``after '…%x = '``): so that an error in a line of several MB stays short and is still
    found; what the message quotes of the input is cut too (:func:`phaze_ir.files.shorten`), and
    every control character is escaped (:func:`phaze_ir.files.printable`).  It is an xDSL
    ``ParseError`` (its ``span`` and ``msg``; xDSL's tools move the span for
    ``--split-input-file``) and a :class:`PhazeError` (the tools print it without a traceback).
    """

    @property
    def location(self) -> str:
        """``file:line:col`` of the error (MLIR counts columns from 1)."""
        return str(self.span.get_location())

    def excerpt(self) -> str:
        """The source the error's line quotes: ``at '...'`` (the line from the column on, cut),
        ``after '...'`` (the end of the line before the column, where nothing follows it), or
        ``''`` (a blank line)."""
        return _excerpt(self.span)

    def message_lines(self) -> list[str]:
        """One line, ``file:line:col: error: message (at '...')``, safe to print."""
        # xDSL's messages quote what they could not read whole (``Operation <name> is not
        # registered``, ``undefined symbol alias '<name>'``): a name of 2 MB is cut there too.
        line = printable(f"{self.location}: error: {shorten(self.msg)}")
        if NAMES_ITS_FIELD.match(self.msg) or _is_blank(self.span.input.content):
            return [line]  # a value read whole but out of its field's range: the line names both
        quoted = self.excerpt()
        return [f"{line} ({quoted})" if quoted else line]

    def __str__(self) -> str:
        return "\n".join(self.message_lines())


def _excerpt(span: Span[str] | Span[bytes]) -> str:
    content = span.input.content
    start = span.input.get_start_of_line(span.start)
    end = span.input.get_end_of_line(span.start)
    # Cut bytes may split a UTF-8 sequence: shown with replacement characters, display only.
    after = _text(content[span.start : min(end, span.start + EXCERPT_CHARS + 1)]).rstrip("\r")
    if after.strip():
        return f"at '{_quoted(after)}'"
    before = _text(content[max(start, span.start - EXCERPT_CHARS - 1) : span.start]).rstrip()
    if before.strip():
        return f"after '{_quoted(before, from_end=True)}'"
    return ""


def _quoted(text: str, from_end: bool = False) -> str:
    """``text`` cut to ``EXCERPT_CHARS`` characters ("…" where cut), its control characters
    escaped (a tab as ``\\t``), a quote as ``\\'``."""
    if len(text) > EXCERPT_CHARS:
        text = "…" + text[-EXCERPT_CHARS:] if from_end else text[:EXCERPT_CHARS] + "…"
    return printable(text).replace("'", "\\'")


def _text(chunk: str | bytes) -> str:
    return chunk.decode("utf-8", "replace") if isinstance(chunk, bytes) else chunk


_BLANK = re.compile(r"(?:\s|//[^\n]*)*")
_BLANK_BYTES = re.compile(rb"(?:\s|//[^\n]*)*")


def _is_blank(text: str | bytes) -> bool:
    """Whether ``text`` holds nothing but whitespace and ``//`` comments."""
    pattern = _BLANK_BYTES if isinstance(text, bytes) else _BLANK
    match = pattern.match(text)  # type: ignore[arg-type]
    return match is not None and match.end() == len(text)


def _message(error: ParseError) -> str:
    """xDSL's message, reworded where it would puzzle a user."""
    msg = error.msg.strip()
    at_end = error.span.start >= len(error.span.input)
    if msg == "Could not parse entire input!":
        msg = "expected an operation"
    elif error.msg.startswith(" "):  # xDSL sometimes gives only the context (" in block definition")
        msg = f"unexpected {'end of input' if at_end else 'token'} {msg}"
    elif at_end and "end of input" not in msg:
        msg = f"unexpected end of input: {msg}"
    if isinstance(error, MultipleSpansParseError):
        notes = [f"{span.get_location()}: note: {note}" for span, note in error.refs if note]
        msg = "; ".join([msg, *notes])
    return msg


#: Spellings a plan repeats by the ten thousand (an op's records, its tensor types, its layer
#: and stage), read once per parse (``_Parser._read_once``): a record from ``#phaze.`` to its
#: ``>`` (no bracket inside but in a string literal), a static tensor type, an ``i64`` integer
#: (whole: not the start of a longer type's name).
_READ_ONCE = re.compile(
    r'#phaze\.[a-z_]+<(?:[^<>"]|"(?:[^"\\]|\\.)*")*>|tensor<(?:[0-9]+x)*[a-z][a-z0-9]*>|-?[0-9]+ : i64(?![\w$.])'
)

_Read = TypeVar("_Read")


class _Parser(Parser):
    """xDSL's parser, reading back the strings phaze prints.  MLIR prints a string's non-ASCII
    bytes as escapes (``"\\C3\\BC"`` for ``ü``); xDSL 0.74 lexes a literal with such escapes as
    bytes, so a module path or model name with a non-ASCII letter would not parse back as the
    string it was.  A literal whose bytes are UTF-8 is a string here, as it is in MLIR.

    And faster on a plan: xDSL lexes every attribute and type token by token (GPT-3 175B's
    11 MB plan: 28 s), while a plan spells the same few thousand of them over and over; the
    second time a spelling is met, the attribute read the first time is given again."""

    def parse_optional_attribute(self) -> Attribute | None:
        return self._read_once(super().parse_optional_attribute)

    def parse_optional_type(self) -> TypeAttribute | None:
        return self._read_once(super().parse_optional_type)

    def _read_once(self, read: Callable[[], _Read]) -> _Read:
        """What ``read()`` reads at the current token, given again without reading when this
        parser read the same spelling (one ``_READ_ONCE`` matches there) before."""
        content = self.lexer.input.content
        start = self._current_token.span.start
        spelled = _READ_ONCE.match(content, start) if isinstance(content, str) else None
        if spelled is None:
            return read()
        known: dict[tuple[object, str], Any] = self.__dict__.setdefault("_known", {})
        key = (getattr(read, "__func__", read), spelled.group())  # an attribute's and a type's apart
        value = known.get(key)
        if value is not None:
            self._resume_from(spelled.end())
            return value
        value = read()
        # Kept when what was read is exactly the text matched: it ends where the match ends
        # and only blanks are between it and the next token (a comment can hold a '>'), so the
        # value is that text's (attributes and types read the same wherever they stand).
        end, following = spelled.end(), self._current_token.span.start
        if value is not None and following >= end and not content[end:following].strip():
            known[key] = value
        return value

    def parse_optional_str_literal(self) -> str | None:
        text = super().parse_optional_str_literal()
        if text is not None or self._current_token.kind != MLIRTokenKind.BYTES_LIT:
            return text
        try:
            text = StringLiteral.from_span(self._current_token.span).bytes_contents.decode("utf-8")
        except UnicodeDecodeError:
            return None  # bytes indeed (a BytesAttr)
        self._consume_token(MLIRTokenKind.BYTES_LIT)
        return text


def parse_text(
    text: str | bytes, name: str = "<input>", ctx: Context | None = None, allow_implicit_module: bool = True
) -> ModuleOp:
    """Parse MLIR text (not verified); a syntax error raises :class:`MLIRParseError`, an empty
    input (only whitespace and comments) too, with a message that says so."""
    if _is_blank(text):
        # One constructor call per content type: a Span holds str or bytes, not a mix.
        span: Span[str] | Span[bytes] = (
            Span(0, 0, Input(text, name)) if isinstance(text, str) else Span(0, 0, Input(text, name))
        )
        raise MLIRParseError(span, "empty input: expected an MLIR module (the file holds no operation)")
    parser = _Parser(ctx or make_context(), text, name)
    try:
        return parser.parse_module(allow_implicit_module)
    except MLIRParseError:
        raise
    except ParseError as e:
        raise MLIRParseError(e.span, _message(e)) from None
    except RecursionError:  # xDSL's parser recurses once per bracket or region
        raise MLIRParseError(parser._current_token.span, "nested too deeply for the parser") from None
    except VerifyException as e:
        # An attribute the parser built and its own verifier refused (``99999999999999999999 :
        # i64``: xDSL's IntegerAttr, out of its type's range), raised with no place: said where
        # the parser stands (just past the value), in one line, as a field's value is.
        raise MLIRParseError(parser._current_token.span, f"attribute {_attribute_name(parser)}: {e}") from None


def _attribute_name(parser: Parser) -> str:
    """``'name'`` of the last ``name = value`` that the parser read (where an attribute that
    failed its verifier was written), escaped; ``'?'`` when none is found."""
    content = parser._current_token.span.input.content
    before = content[max(0, parser._current_token.span.start - 400) : parser._current_token.span.start]
    text = before.decode("utf-8", "replace") if isinstance(before, bytes) else before
    found = re.findall(r'([\w.$-]+|"[^"\n]*")\s*=(?!=)', text)
    return "'" + printable(shorten(found[-1].strip('"'))) + "'" if found else "'?'"


def parse_module(text: str | bytes, name: str = "<input>") -> ModuleOp:
    """Parse MLIR text into a verified module.  A syntax error raises :class:`MLIRParseError`
    (a :class:`PhazeError`), which names ``file:line:col`` and shows a short excerpt."""
    module = parse_text(text, name)
    module.verify()
    keys.check_module(module)  # the module keys' types and the plan's relations
    return module


#: Each byte as it appears inside an MLIR string literal: printable ASCII as itself (a
#: backslash doubled), a quote, a control or a non-ASCII byte as ``\XX`` (xDSL's escapes).
_ESCAPED = tuple(
    "\\\\" if b == 0x5C else f"\\{b:02X}" if b < 0x20 or b > 0x7E or b == 0x22 else chr(b) for b in range(256)
)


#: Attributes printed once per module, their text copied after: they repeat on most ops (an
#: op's phase and module, its layer and stage, its tensor types), hash cheaply, hold no newline,
#: and equal ones print alike (xDSL compares attributes by value).
_PRINTED_ONCE = (builtin.StringAttr, builtin.IntegerAttr, builtin.TensorType)


class _Printer(Printer):
    """xDSL's printer (pinned in pyproject.toml), faster where it prints most: a string literal
    goes to the stream in one piece (xDSL's ``print_bytes_literal`` prints it a character at a
    time: GPT-3 175B's plan, 2.5 million calls), and a piece without a newline is written to
    the stream as is (xDSL's ``print_string`` goes through ``print()``); attributes that repeat
    are printed once per module and their text copied (:meth:`_once`), and an op's attribute
    dictionary is joined into one piece where its entries are such.  GPT-3 175B's plan prints
    in about 1.5 s instead of 4.5 s; the same bytes (``tests/test_roundtrip.py``)."""

    def print_string(self, text: str, *, indent: int | None = None) -> None:
        if "\n" in text or self.stream is None:
            super().print_string(text, indent=indent)
            return
        self._current_column += len(text)  # what xDSL's does for text without a newline
        self.stream.write(text)

    def print_bytes_literal(self, bytestring: bytes) -> None:
        self.print_string('"' + "".join([_ESCAPED[b] for b in bytestring]) + '"')

    def _captured(self, print_it) -> str:
        """What ``print_it()`` prints, as text instead of on the stream."""
        stream, self.stream = self.stream, io.StringIO()
        column = self._current_column
        try:
            print_it()
            return self.stream.getvalue()
        finally:
            self.stream, self._current_column = stream, column

    def _once(self, attribute: Attribute) -> str | None:
        """``attribute``'s text, printed the first time it is met, when it is one printed once:
        one of ``_PRINTED_ONCE`` (by value), or a phaze record (by identity: records are made
        once per value, ``RecordAttr.make``, and xDSL hashes one field by field); else None.
        An attribute object met before is found by its identity first: hashing one by value
        (a tensor type hashes its shape element by element) was a third of the time."""
        state = self.__dict__
        seen: dict[int, tuple[Attribute, str | None]] | None = state.get("_seen")
        if seen is None:
            seen = state["_seen"] = {}
        hit = seen.get(id(attribute))
        if hit is not None and hit[0] is attribute:  # (kept beside its text: no other takes its id)
            return hit[1]
        kind = type(attribute)
        if kind in _PRINTED_ONCE:
            key: object = attribute
        elif issubclass(kind, RecordAttr):
            key = id(attribute)
        else:
            seen[id(attribute)] = (attribute, None)
            return None
        texts: dict[object, tuple[Attribute, str]] = state.setdefault("_texts", {})
        entry = texts.get(key)
        if entry is None:
            entry = texts[key] = (attribute, self._captured(partial(super().print_attribute, attribute)))
        seen[id(attribute)] = (attribute, entry[1])
        return entry[1]

    def print_attribute(self, attribute: Attribute) -> None:
        text = self._once(attribute)
        if text is None:
            super().print_attribute(attribute)
        else:
            self.print_string(text)

    def print_attr_dict(self, attr_dict) -> None:
        # xDSL's prints each entry piece by piece (name, " = ", value, ", "): a plan's ops carry
        # about ten entries each.  Here the names' and the repeated values' texts are joined
        # and printed as one piece; another value is printed by print_attribute where it falls.
        names: dict[str, str] = self.__dict__.setdefault("_names", {})
        pieces = ["{"]
        for i, (name, attribute) in enumerate(attr_dict.items()):
            if i:
                pieces.append(", ")
            key = names.get(name)
            if key is None:
                key = names[name] = self._captured(partial(self.print_identifier_or_string_literal, name))
            pieces.append(key)
            if isinstance(attribute, builtin.UnitAttr):
                continue
            pieces.append(" = ")
            text = self._once(attribute)
            if text is None:
                self.print_string("".join(pieces))
                pieces = []
                super().print_attribute(attribute)  # (not printed once: no need to ask again)
            else:
                pieces.append(text)
        pieces.append("}")
        self.print_string("".join(pieces))


def print_module(module: ModuleOp, generic: bool = False) -> str:
    """Print a module as text; with ``generic`` in MLIR's generic op form."""
    out = io.StringIO()
    with _integer_arrays_printed_fast():
        _Printer(stream=out, print_generic_format=generic).print_op(module)
    out.write("\n")
    return out.getvalue()


@contextlib.contextmanager
def _integer_arrays_printed_fast():
    """While active, xDSL's declarative format prints a dense array of integers (a view's
    ``dims``) without asking ``isa(attr, DenseArrayBase[IntegerType])``, which builds the
    generic type's constraint anew at each call (xDSL 0.74, ``DenseArrayAttributeVariable.
    print_attr``: a fifth of a plan's printing); the same text, and any other attribute is
    printed by xDSL's own method."""
    original = DenseArrayAttributeVariable.print_attr

    def print_attr(self: DenseArrayAttributeVariable, printer: Printer, attr: Attribute) -> None:
        if type(attr) is DenseArrayBase and isinstance(attr.elt_type, IntegerType):
            with printer.in_square_brackets():
                printer.print_list(attr.iter_values(), printer.print_int)
        else:
            original(self, printer, attr)

    DenseArrayAttributeVariable.print_attr = print_attr
    try:
        yield
    finally:
        DenseArrayAttributeVariable.print_attr = original


def print_module_from(text: str, module: ModuleOp, added: str) -> str:
    """``print_module(module)``, given ``text``: ``module`` printed (custom form) before its
    attribute ``added`` was set.  Only the header (the module's attributes) is printed again,
    not the body, which the attribute does not change: the search's output is its winner's plan
    with ``phaze.baselines`` added, and printing GPT-3 175B's plan takes seconds.  Printed in
    full when ``text`` does not begin with that header."""
    before = {k: v for k, v in module.attributes.items() if k != added}
    old, new = _header(module, before), _header(module, module.attributes)
    if added not in module.attributes or not text.startswith(old + " {\n"):
        return print_module(module)
    return new + text[len(old) :]


def module_header(module: ModuleOp) -> str:
    """What :func:`print_module` writes of ``module`` (custom form) before `` {`` and its body:
    its name and attributes."""
    return _header(module, module.attributes)


def _header(module: ModuleOp, attributes) -> str:
    """What ``print_module`` writes of ``module`` with ``attributes`` before its body: its name
    and attributes (printed from an empty module holding them)."""
    empty = ModuleOp([], attributes=dict(attributes))
    empty.sym_name = module.sym_name
    return print_module(empty).removesuffix(" {\n}\n")
