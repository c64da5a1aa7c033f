"""Attributes of the ``phaze`` dialect.

Analysis results live in *discardable* attributes with the ``phaze.`` prefix (MLIR's convention
for facts that passes add and that other tools may ignore).  Structured results use
:class:`RecordAttr`, a parametrized attribute printed with named fields::

    #phaze.layer_info<index = 3, kind = block, module = "transformer.h.2", same_as = 1, ...>

Field values are Python ``int``, ``float`` or ``str`` (stored as ``IntAttr``, ``FloatData``
and ``StringAttr``), which keeps the syntax short, readable and exactly round-trippable.
Upstream MLIR (``--allow-unregistered-dialect``) reads such attributes as opaque dialect
attributes, so the files stay parseable there too.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from functools import cache
from typing import ClassVar, get_type_hints

from xdsl.dialects.builtin import FloatData, IntAttr, StringAttr
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import Attribute, ParametrizedAttribute, SpacedOpaqueSyntaxAttribute
from xdsl.irdl import irdl_attr_definition
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.utils.bitwise_casts import convert_f64_to_u64
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum

from phaze_ir.op_kinds import LAYER_MEMORY_FIELDS, RecomputePolicy

FieldValue = int | float | str


# --------------------------------------------------------------------------------------------
# Enums: the fields and markers that take one of a fixed set of words
# --------------------------------------------------------------------------------------------


class LayerKind(StrEnum):
    PROLOGUE = "prologue"
    BLOCK = "block"
    HEAD = "head"


class Unit(StrEnum):
    TENSOR = "tensor"
    VECTOR = "vector"
    NETWORK = "network"
    NONE = "none"


class Bound(StrEnum):
    COMPUTE = "compute"
    GLB = "glb"
    HBM = "hbm"
    NETWORK = "network"
    NONE = "none"
    POWER = "power"


class ScheduleStatus(StrEnum):
    OPTIMAL = "optimal"
    GAPLIMIT = "gaplimit"
    NODELIMIT = "nodelimit"
    TIMELIMIT = "timelimit"
    HEURISTIC = "heuristic"


class YesNo(StrEnum):
    YES = "yes"
    NO = "no"


@irdl_attr_definition
class LayerKindAttr(EnumAttribute[LayerKind], SpacedOpaqueSyntaxAttribute):
    """What a layer is: ``#phaze<layer_kind block>``."""

    name = "phaze.layer_kind"


@irdl_attr_definition
class UnitAttr(EnumAttribute[Unit], SpacedOpaqueSyntaxAttribute):
    """The unit an op runs on: ``#phaze<unit tensor>``."""

    name = "phaze.unit"


@irdl_attr_definition
class BoundAttr(EnumAttribute[Bound], SpacedOpaqueSyntaxAttribute):
    """What bounds an op's latency: ``#phaze<bound hbm>``."""

    name = "phaze.bound"


@irdl_attr_definition
class ScheduleStatusAttr(EnumAttribute[ScheduleStatus], SpacedOpaqueSyntaxAttribute):
    """How a layer schedule's solve ended: ``#phaze<schedule_status optimal>``."""

    name = "phaze.schedule_status"


@irdl_attr_definition
# RecomputePolicy is the standard library's StrEnum (declared where the algorithms, which import
# no xDSL, read it too); xDSL's EnumAttribute works with it, but its type bound names xDSL's own.
class RecomputePolicyAttr(EnumAttribute[RecomputePolicy], SpacedOpaqueSyntaxAttribute):  # type: ignore[type-var]
    """A recompute policy: ``#phaze<recompute_policy selective>`` (also the ``phaze.recompute``
    marker on the forward ops that selective recompute re-runs)."""

    name = "phaze.recompute_policy"


@irdl_attr_definition
class YesNoAttr(EnumAttribute[YesNo], SpacedOpaqueSyntaxAttribute):
    """A yes/no field: ``#phaze<yes_no yes>``."""

    name = "phaze.yes_no"


ENUM_ATTRS: tuple[type[EnumAttribute], ...] = (
    LayerKindAttr,
    UnitAttr,
    BoundAttr,
    ScheduleStatusAttr,
    RecomputePolicyAttr,
    YesNoAttr,
)


MAX_INT_BITS = 4096
I64_MAX = 2**63 - 1
"""Record integers are arbitrary precision up to this many bits (sign apart): far beyond any
count of bytes, FLOPs or cycles, and well inside what Python prints and reads back in decimal."""
#: The most a count of the plan may be (devices, batch, degrees): the options' bound,
#: ``passes.algorithms.placement.MAX_COUNT`` (tests/test_refusals_plan_fields.py holds them equal).
COUNT_MAX = 2**31 - 1


def format_float(value: float) -> str:
    """The MLIR literal of a float (an f64) that reads back as the same float, bit for bit; the
    one float printer of phaze's attributes.

    Finite values print as Python's shortest round-trip ``repr`` with the fraction MLIR's grammar
    requires (``[-+]?[0-9]+[.][0-9]*([eE][-+]?[0-9]+)?``): ``8e-08`` becomes ``8.0e-08``, ``1e+22``
    becomes ``1.0e+22``; ``-0.0`` stays.  Infinities and NaNs, which have no decimal literal, print
    as their IEEE-754 bits in hex, as MLIR prints them: ``0x7FF0000000000000`` is ``inf``.
    """
    value = float(value)
    if not math.isfinite(value):
        return f"0x{struct.unpack('>Q', struct.pack('>d', value))[0]:016X}"
    mantissa, e, exponent = repr(value).partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + e + exponent


def float_from_bits(bits: int) -> float:
    """The f64 whose IEEE-754 bits are ``bits`` (how MLIR reads a hex literal of a float)."""
    return struct.unpack(">d", struct.pack(">Q", bits))[0]


def _to_attr(value: FieldValue) -> Attribute:
    # bool is an int in Python; refuse it so that a typo does not silently become 0/1.
    if isinstance(value, bool):
        raise TypeError("record fields do not take bool; use 0/1 or a string")
    if isinstance(value, int):
        if abs(value).bit_length() > MAX_INT_BITS:
            raise ValueError(
                f"record integers hold at most {MAX_INT_BITS} bits; this one has {abs(value).bit_length()}"
            )
        return IntAttr(int(value))
    if isinstance(value, float):
        return FloatData(float(value))
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(
                f"record string field is not valid Unicode text (it cannot be UTF-8 encoded): {e}"
            ) from None
        return StringAttr(str(value))
    raise TypeError(f"unsupported record field value {value!r}")


@cache
def _field_types(cls: type) -> dict[str, type]:
    """Each field's declared attribute class (``IntAttr``, ``FloatData``, ...), by name."""
    return {f: hint for f, hint in get_type_hints(cls).items() if isinstance(hint, type)}


@cache
def _field_index(cls: type[RecordAttr]) -> dict[str, int]:
    """Each field's position in ``cls.FIELDS``, by name."""
    return {f: i for i, f in enumerate(cls.FIELDS)}


#: How :meth:`RecordAttr.print_parameters` prints a field of each declared kind.
_FLOAT, _STRING, _WORD = "float", "string", "word"


@cache
def _print_kinds(cls: type[RecordAttr]) -> tuple[str, ...]:
    """How each field of ``cls`` prints, in ``FIELDS`` order: a float by :func:`format_float`, a
    string as a literal, an integer or an enum's word as it reads.  A field of another declared
    kind is a record class's error, refused when the class is first printed."""
    types = _field_types(cls)
    kinds = []
    for f in cls.FIELDS:
        kind = types.get(f)
        if kind is FloatData:
            kinds.append(_FLOAT)
        elif kind is StringAttr:
            kinds.append(_STRING)
        elif kind is IntAttr or (kind is not None and issubclass(kind, EnumAttribute)):
            kinds.append(_WORD)
        else:
            raise TypeError(f"{cls.__name__}.{f}: unsupported record field kind {kind}")
    return tuple(kinds)


def _from_attr(attr: Attribute) -> FieldValue:
    if isinstance(attr, EnumAttribute):
        return str(attr.data.value)
    if isinstance(attr, IntAttr):
        return attr.data
    if isinstance(attr, FloatData):
        return attr.data
    if isinstance(attr, StringAttr):
        return attr.data
    raise TypeError(f"unsupported record field attribute {attr}")


@cache
def _enum_words(kind: type[EnumAttribute]) -> tuple[str, ...]:
    return tuple(str(e.value) for e in kind.enum_type)


@cache
def _enum_word_attr(kind: type[EnumAttribute], word: str) -> EnumAttribute:
    """One attribute per (enum, word): records are written for every op of a step."""
    return kind(kind.enum_type(word))


#: Most records :meth:`RecordAttr.make` keeps to give again (then it forgets them all): far
#: more than one model's distinct records, a bound on a long search's memory.
MADE_RECORDS = 65_536
_MADE: dict[tuple, RecordAttr] = {}


class RecordAttr(ParametrizedAttribute):
    """Base of attributes that are a fixed list of named scalar fields.

    Subclasses declare ``FIELDS`` (names in print order) and one IRDL parameter per field, each
    annotated ``IntAttr``, ``FloatData``, ``StringAttr`` or one of the enum attributes above (a
    field that takes one of a fixed set of words: printed bare, ``unit = tensor``, and refused
    when it is not one of them).  Build them with :meth:`make` from keyword values and read
    them with :meth:`get` or :meth:`as_dict` (an enum field reads as its word, a ``str``).
    Floats are printed by :func:`format_float`, which round-trips them bit for bit.
    """

    FIELDS: ClassVar[tuple[str, ...]] = ()
    #: The values a number field may hold, where its writer bounds them (an i64 of the
    #: placement DP, a count): ``(least, most)``, a float field also finite.  Read back from
    #: text, a field out of its range is a parse error at the field.
    RANGES: ClassVar[dict[str, tuple[float, float]]] = {}

    @classmethod
    def make(cls, **values: FieldValue):
        """Build the attribute from keyword values; every declared field is required.  Equal
        values give the same attribute (attributes are immutable): the records of an op repeat
        over a model's alike layers (GPT-3 175B's pipeline: 33,662 records, 1,022 distinct),
        and building one verifies each of its fields.  A float is keyed by its bits, as xDSL
        compares ``FloatData``: -0.0 and 0.0 are equal floats but print apart."""
        try:
            bits = convert_f64_to_u64
            key = (cls, *((k, type(v), bits(v) if isinstance(v, float) else v) for k, v in values.items()))
            made = _MADE.get(key)
        except TypeError:  # a value that cannot be a key cannot be a field either: say why
            return cls._build(values)
        if made is None:
            made = cls._build(values)
            if len(_MADE) >= MADE_RECORDS:
                _MADE.clear()
            _MADE[key] = made
        return made

    @classmethod
    def _build(cls, values: dict[str, FieldValue]):
        missing = [f for f in cls.FIELDS if f not in values]
        extra = [k for k in values if k not in cls.FIELDS]
        if missing or extra:
            raise TypeError(f"{cls.name}: missing fields {missing}, unknown fields {extra}")
        enums = cls.enum_fields()
        return cls(*(cls._enum_attr(f, values[f]) if f in enums else _to_attr(values[f]) for f in cls.FIELDS))

    @classmethod
    @cache
    def enum_fields(cls) -> dict[str, type[EnumAttribute]]:
        """The fields that are enum attributes, with their attribute class."""
        hints = get_type_hints(cls)
        return {
            f: hint for f in cls.FIELDS if isinstance(hint := hints.get(f), type) and issubclass(hint, EnumAttribute)
        }

    @classmethod
    def _enum_attr(cls, field: str, value: FieldValue) -> EnumAttribute:
        kind = cls.enum_fields()[field]
        words = _enum_words(kind)
        if not isinstance(value, str) or value not in words:
            raise ValueError(f"{cls.name}: {field} = {value!r} is not one of {', '.join(words)}")
        return _enum_word_attr(kind, value)

    def with_field(self, field: str, value: FieldValue):
        """This record with ``field`` set to ``value``, the other fields' attributes shared: equal to
        :meth:`make` of the same values, without converting and checking every field again (the
        deepened winner renumbers each copied op's kernel record, ``phaze/deepen_compiled.py``)."""
        index = self.FIELDS.index(field)
        params = list(self.parameters)
        params[index] = self._enum_attr(field, value) if field in self.enum_fields() else _to_attr(value)
        return type(self)(*params)

    def get(self, field: str) -> FieldValue:
        """The Python value of one field (a ValueError for a name that is not one)."""
        index = _field_index(type(self)).get(field)
        return self.values()[index if index is not None else self.FIELDS.index(field)]

    def as_dict(self) -> dict[str, FieldValue]:
        """All fields as a plain ``dict`` in declaration order (a new one at every call)."""
        return dict(zip(self.FIELDS, self.values()))

    def values(self) -> tuple[FieldValue, ...]:
        """Every field's Python value, in ``FIELDS`` order.  Read once per attribute object and
        kept on it (a record is immutable, and not a field: equality and hashing, which compare
        the parameters, do not see it): the passes read the same records again and again (GPT-3
        175B's plan compile: 112,176 ``get`` and 83,408 ``as_dict``, a tenth of its time)."""
        got = self.__dict__.get("_field_values")
        if got is None:
            got = tuple(_from_attr(p) for p in self.parameters)
            object.__setattr__(self, "_field_values", got)
        return got

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> Sequence[Attribute]:
        values: dict[str, Attribute] = {}

        def parse_field() -> None:
            key = parser.parse_identifier(" (a field name of " + cls.name + ")")
            if key not in cls.FIELDS:
                parser.raise_error(f"unknown field '{key}' of {cls.name}; expected one of {', '.join(cls.FIELDS)}")
            parser.parse_punctuation("=")
            if key in cls.enum_fields():
                word = parser.parse_optional_str_literal() or parser.parse_identifier(f" (a word for {key})")
                try:
                    values[key] = cls._enum_attr(key, word)
                except ValueError as e:
                    parser.raise_error(str(e))
                return
            token = parser._current_token
            values[key] = cls._parse_value(parser, key)
            wrong = cls._out_of_range(key, values[key])
            if wrong:
                parser.raise_error(f"field {wrong}", token.span)

        parser.parse_comma_separated_list(parser.Delimiter.ANGLE, parse_field)
        missing = [f for f in cls.FIELDS if f not in values]
        if missing:
            parser.raise_error(f"{cls.name} is missing field(s) {', '.join(missing)}")
        return [values[f] for f in cls.FIELDS]

    @classmethod
    def _out_of_range(cls, key: str, value: Attribute) -> str | None:
        """What is wrong with field ``key`` holding ``value`` (its :attr:`RANGES`), or None."""
        if key not in cls.RANGES or not isinstance(value, (IntAttr, FloatData)):
            return None
        least, most = cls.RANGES[key]
        number = value.data
        # (an integer is finite: math.isfinite would convert one past a float's range)
        if least <= number <= most and (isinstance(value, IntAttr) or math.isfinite(number)):
            return None
        shown = number if isinstance(value, IntAttr) else format_float(number)
        expected = f"from {least} to {most}" if most < math.inf else f">= {least}"
        kind = "an integer" if isinstance(value, IntAttr) else "a finite number"
        return f"'{key}' of {cls.name} = {shown}: expected {kind} {expected}"

    def verify(self) -> None:
        for key, value in zip(self.FIELDS, self.parameters):
            wrong = self._out_of_range(key, value)
            if wrong:
                raise VerifyException(wrong)

    @classmethod
    def _parse_value(cls, parser: AttrParser, key: str) -> Attribute:
        """One string, integer or float field value, checked against the field's declared type.
        A float field also reads MLIR's hex form of a float's bits (``0x7FF0000000000000``)."""
        declared = _field_types(cls).get(key)
        token = parser._current_token
        text = parser.parse_optional_str_literal()
        if text is None and (raw := parser.parse_optional_bytes_literal()) is not None:
            # xDSL lexes a string whose escapes spell non-ASCII bytes (the printer's "\C3\A9"
            # for "é") as bytes: they are the UTF-8 of the text.
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                parser.raise_error(f"field '{key}' of {cls.name}: the string is not valid UTF-8", token.span)
        if text is not None:
            if declared not in (None, StringAttr):
                parser.raise_error(f"field '{key}' of {cls.name} takes a number, not a string")
            return StringAttr(text)
        if declared is StringAttr:
            parser.raise_error(f"field '{key}' of {cls.name} takes a string literal")
        token = parser._current_token  # the number's spelling tells hex bits from a decimal
        hex_literal = token.text[:2] in ("0x", "0X")
        number = parser.parse_number(context_msg=f" (field '{key}' of {cls.name})")
        if declared is FloatData:
            if isinstance(number, float):
                return FloatData(number)
            if hex_literal and number.bit_length() <= 64:
                return FloatData(float_from_bits(number))
            parser.raise_error(
                f"field '{key}' of {cls.name} takes a float literal, with a '.' (like 1.0 or 8.0e-08; "
                f"0x7FF0000000000000 for the bits of inf/nan)",
                token.span,
            )
        if isinstance(number, float):
            if declared is IntAttr:
                parser.raise_error(f"field '{key}' of {cls.name} takes an integer, not {token.text}", token.span)
            return FloatData(number)
        if number.bit_length() > MAX_INT_BITS:
            parser.raise_error(f"field '{key}' of {cls.name}: integer out of range (> {MAX_INT_BITS} bits)")
        return IntAttr(number)

    def print_parameters(self, printer: Printer) -> None:
        # The fields are joined into one piece of text for the printer: an op carries three
        # records (latency, energy, schedule), and field by field through the printer's lists
        # was a third of printing a plan.  A string field goes through the printer's literal.
        # The values are the record's kept Python values (:meth:`values`), printed as their
        # declared kind prints them: reading the parameters again (xDSL's ``parameters``
        # property, a getattr per field) was a third of printing GPT-3 175B's plan.
        kinds = _print_kinds(type(self))
        text = "<"
        for i, (key, kind, value) in enumerate(zip(self.FIELDS, kinds, self.values())):
            text += f"{', ' if i else ''}{key} = "
            if kind is _FLOAT:
                text += format_float(value)  # type: ignore[arg-type]
            elif kind is _STRING:
                printer.print_string(text)
                printer.print_string_literal(value)  # type: ignore[arg-type]
                text = ""
            else:  # an integer, or an enum's word
                text += str(value)
        printer.print_string(text + ">")


@irdl_attr_definition
class LayerInfoAttr(RecordAttr):
    """One layer of the model, as found by ``phaze-group-layers``.

    Syntax::

        #phaze.layer_info<index = 1, kind = block, module = "transformer.h.0", same_as = 1,
                     param_bytes = 63, saved_bytes = 4096, boundary_bytes = 512,
                     grad_boundary_bytes = 512, fwd_flops = 1, bwd_flops = 2, opt_flops = 0,
                     num_ops = 120, experts = 0, dispatch_bytes = 0>

    - ``index``: position in execution order (0 = prologue).
    - ``kind``: ``"prologue"`` (embeddings and input handling), ``"block"`` (one child of the
      repeated module list) or ``"head"`` (everything after the last block, loss included).
    - ``module``: the source module path the layer was cut from.
    - ``same_as``: index of the first layer that is structurally identical (itself if none);
      later passes solve each distinct ``same_as`` once.
    - ``param_bytes``: bytes of the parameters the layer's forward reads (a tied parameter is
      counted in every layer that uses it, as a pipeline stage must hold a copy).
    - ``saved_bytes``: activation bytes that autograd saves for this layer's backward, per
      micro-batch (storage resolved through views, each tensor counted once).
    - ``boundary_bytes``: forward activation bytes crossing from this layer to the layers after
      it (summed over every edge of the cut; values that depend on no input, like a causal
      mask built from ``arange``, are rematerializable and not counted).
    - ``grad_boundary_bytes``: gradient bytes crossing the same cut in backward.
    - ``fwd_flops``/``bwd_flops``/``opt_flops``: FLOPs per phase.
    - ``num_ops``: number of ops in the layer.
    - ``experts``: the experts of an MoE layer (the leading dimension of its per-expert weights,
      read by its expert GEMMs); 0 in a dense layer.
    - ``dispatch_bytes``: the bytes of the tokens one forward of the layer routes to its experts
      (the left operand of its first expert GEMM: routed rows x hidden size), what expert
      parallelism's all-to-all dispatches (and the combine brings back); 0 in a dense layer.
    """

    name = "phaze.layer_info"
    FIELDS = (
        "index",
        "kind",
        "module",
        "same_as",
        "param_bytes",
        "saved_bytes",
        "boundary_bytes",
        "grad_boundary_bytes",
        "fwd_flops",
        "bwd_flops",
        "opt_flops",
        "num_ops",
        "experts",
        "dispatch_bytes",
    )

    index: IntAttr
    kind: LayerKindAttr
    module: StringAttr
    same_as: IntAttr
    param_bytes: IntAttr
    saved_bytes: IntAttr
    boundary_bytes: IntAttr
    grad_boundary_bytes: IntAttr
    fwd_flops: IntAttr
    bwd_flops: IntAttr
    opt_flops: IntAttr
    num_ops: IntAttr
    experts: IntAttr
    dispatch_bytes: IntAttr


@irdl_attr_definition
class ReplicatedLinearsAttr(RecordAttr):
    """Linears that ``phaze-shard-tensor-parallel`` keeps replicated where Megatron would shard
    them (module attribute ``phaze.tp_replicated``; the importer's ``#phaze.unpriced_op`` are in
    ``phaze.warnings``): their FLOPs are not divided over the tensor-parallel group, so the plan
    says so.

    Syntax::

        #phaze.replicated_linears<reason = "kv_heads", width = 4, count = 4, total = 14,
                                  module = "model.layers.0.self_attn.k_proj", flops_share = 0.06,
                                  param_share = 0.05>

    - ``reason``: ``kv_heads`` (the key/value projections of grouped-query attention with fewer
      key/value heads than the width, docs/design.md §5.2), ``demoted`` (linears of the blocks
      that an op between them keeps from splitting) or ``outside_blocks`` (forward linears
      outside the repeated blocks that hold more than 10 % of the linear FLOPs).
    - ``width``: the tensor-parallel width; ``count``: how many linears; ``total``: the linears
      of the blocks (all forward linears for ``outside_blocks``); ``module``: the first one.
    - ``flops_share``: their share of the forward linears' FLOPs.
    - ``param_share``: their weights' share of the step's parameters.
    - ``reason`` ``weights``: matrices the blocks read that stay whole and no other record
      names (no rule recognized them as a linear's weight); ``count`` of ``total`` matrices the
      blocks read, ``module`` the first op reading one, ``flops_share`` 0.
    """

    name = "phaze.replicated_linears"
    FIELDS = ("reason", "width", "count", "total", "module", "flops_share", "param_share")

    reason: StringAttr
    width: IntAttr
    count: IntAttr
    total: IntAttr
    module: StringAttr
    flops_share: FloatData
    param_share: FloatData


@irdl_attr_definition
class UnpricedOpAttr(RecordAttr):
    """Ops of one aten kind that the importer kept as ``phaze.opaque`` (module attribute
    ``phaze.warnings``): the cost model prices them only by the bytes they move, so a plan of a
    model where they are heavy understates its time, and says so.

    Syntax::

        #phaze.unpriced_op<aten = "aten.convolution.default", count = 2, module = "conv1",
                           flops = 75497472, bytes = 1589248, flops_share = 0.93>

    - ``count``: how many of them in the step; ``module``: where the first one is called.
    - ``flops``: their FLOPs per micro-batch (torch's own formulas,
      ``torch.utils.flop_counter``), -1 when torch knows no formula for the op.
    - ``bytes``: the bytes of their operands and results.
    - ``flops_share``: ``flops`` over the step's FLOPs as torch counts them, -1 when unknown.
    """

    name = "phaze.unpriced_op"
    FIELDS = ("aten", "count", "module", "flops", "bytes", "flops_share")

    aten: StringAttr
    count: IntAttr
    module: StringAttr
    flops: IntAttr
    bytes: IntAttr
    flops_share: FloatData


@irdl_attr_definition
class KernelAttr(RecordAttr):
    """The kernel an op runs in, as the module's runtime forms them (``phaze-form-kernels``; the
    rules are in ``passes/algorithms/kernels.py``).

    Syntax::

        #phaze.kernel<id = 12, launch = 1, onchip_read = 0, onchip_written = 6291456, causal = 0>

    - ``id``: the kernel's index in the step (ops with equal ids are one kernel).
    - ``launch``: 1 on the op that launches the kernel (it pays the kernel's launch cost), 0 on
      the others.
    - ``onchip_read``/``onchip_written``: bytes of what the op reads and writes that stay on chip
      (made and used inside its kernel, or read once already by it), so do not cross HBM.
    - ``causal``: 1 when the op is part of a causal fused attention kernel, which computes only
      the lower triangle of the s x s scores (half the work); w >= 2 when that kernel's mask is
      also a sliding window of w keys, whose band it computes (about s·w of the scores:
      ``phaze_ir.op_kinds.causal_fraction``); 0 else.
    """

    name = "phaze.kernel"
    FIELDS = ("id", "launch", "onchip_read", "onchip_written", "causal")

    id: IntAttr
    launch: IntAttr
    onchip_read: IntAttr
    onchip_written: IntAttr
    causal: IntAttr


@irdl_attr_definition
class TileAttr(RecordAttr):
    """How ``phaze-tile-pe-array`` tiles a ``phaze.matmul`` onto the accelerator's tensor cores
    (weight-stationary: K along the depth ``pe_y``, N along the width ``pe_x``, M streamed;
    the model is in ``passes/algorithms/tiling.py``).

    Syntax::

        #phaze.tile<pe_x = 128, pe_y = 128, m_block = 256, tiles_m = 16, tiles_n = 32,
                    tiles_k = 32, tiles = 512, cores = 8, utilization = 1.0,
                    cycles_one = 4325376, cycles_split = 540672>

    - ``pe_x``/``pe_y``: the PE array it was tiled for (width, depth).
    - ``m_block``: rows of the left operand streamed per tile.
    - ``tiles_m``/``tiles_n``/``tiles_k``: blocks along M, weight tiles along N and along K.
    - ``tiles``: output tiles, ``batch · tiles_m · tiles_n``; ``cores``: cores busy when split.
    - ``utilization``: useful / issued MACs (padding of N to ``pe_x`` and K to ``pe_y``).
    - ``cycles_one``/``cycles_split``: compute cycles on one core / split over all tensor cores
      (fill and drain included; memory bounds are ``phaze.latency``'s business).
    """

    name = "phaze.tile"
    FIELDS = (
        "pe_x",
        "pe_y",
        "m_block",
        "tiles_m",
        "tiles_n",
        "tiles_k",
        "tiles",
        "cores",
        "utilization",
        "cycles_one",
        "cycles_split",
    )

    pe_x: IntAttr
    pe_y: IntAttr
    m_block: IntAttr
    tiles_m: IntAttr
    tiles_n: IntAttr
    tiles_k: IntAttr
    tiles: IntAttr
    cores: IntAttr
    utilization: FloatData
    cycles_one: IntAttr
    cycles_split: IntAttr


@irdl_attr_definition
class LatencyAttr(RecordAttr):
    """An op's latency on the module's accelerator, from ``phaze-estimate-latency``
    (the model is in ``passes/algorithms/latency.py``).

    Syntax::

        #phaze.latency<one_s = 1.6e-05, split_s = 2.1e-06, unit = tensor, bound = compute>

    - ``one_s``: seconds on ONE core of its unit; ``split_s``: seconds split over ALL cores of
      its unit (equal for collectives and views).
    - ``unit``: ``"tensor"`` (tensor cores), ``"vector"`` (vector cores), ``"network"``
      (collectives) or ``"none"`` (views: no data moves).
    - ``bound``: what limits ``split_s``: ``"compute"``, ``"glb"`` (global-buffer bandwidth),
      ``"hbm"`` (HBM bandwidth), ``"network"`` or ``"none"``.
    """

    name = "phaze.latency"
    FIELDS = ("one_s", "split_s", "unit", "bound")

    one_s: FloatData
    split_s: FloatData
    unit: UnitAttr
    bound: BoundAttr


@irdl_attr_definition
class LayerLatencyAttr(RecordAttr):
    """Per-layer latency totals (module attribute ``phaze.layer_latency``, one per layer index
    of ``phaze.layer``), from ``phaze-estimate-latency``.

    Syntax::

        #phaze.layer_latency<index = 1, fwd_s = 0.0021, bwd_s = 0.0043, opt_s = 0.0002>

    ``fwd_s``/``bwd_s``/``opt_s``: the serial sum of the ``split_s`` of the layer's ops of that
    ``phaze.phase``, in seconds: every op split over all cores of its unit, one after the other
    (an upper bound on what the operator scheduler achieves by overlapping ops on different cores).
    """

    name = "phaze.layer_latency"
    FIELDS = ("index", "fwd_s", "bwd_s", "opt_s")

    index: IntAttr
    fwd_s: FloatData
    bwd_s: FloatData
    opt_s: FloatData


@irdl_attr_definition
class LayerFlopsAttr(RecordAttr):
    """The FLOPs one device runs per layer as its ops run (module attribute ``phaze.layer_flops``,
    one per layer of ``phaze.layers``), from ``phaze-estimate-latency``: ``phaze.layers``' FLOPs
    (the ops as traced) less what a causal attention kernel skips above the diagonal
    (``cost_view.skipped_flops``) and, under context parallelism of degree c, with each fused
    attention's c - 1 further ring steps (an off-diagonal step: half its GEMMs' square,
    unmasked).  What the summary's HFU counts.

    Syntax::

        #phaze.layer_flops<index = 1, fwd_flops = 1000, bwd_flops = 2000, opt_flops = 10>
    """

    name = "phaze.layer_flops"
    FIELDS = ("index", "fwd_flops", "bwd_flops", "opt_flops")

    index: IntAttr
    fwd_flops: IntAttr
    bwd_flops: IntAttr
    opt_flops: IntAttr


@irdl_attr_definition
class EnergyAttr(RecordAttr):
    """An op's energy on the module's accelerator, from ``phaze-estimate-energy`` (the model is
    in ``passes/algorithms/energy.py``): joules of one execution on one device, by where they go.

    Syntax::

        #phaze.energy<compute_j = 0.012, core_buffer_j = 0.009, global_buffer_j = 0.0004,
                      hbm_j = 0.0011, network_j = 0.0>

    - ``compute_j``: the MACs of the PE arrays or the vector lanes' operations;
    - ``core_buffer_j``/``global_buffer_j``/``hbm_j``: the bytes each memory level moves;
    - ``network_j``: the bytes a collective sends over the network.
    """

    name = "phaze.energy"
    FIELDS = ("compute_j", "core_buffer_j", "global_buffer_j", "hbm_j", "network_j")

    compute_j: FloatData
    core_buffer_j: FloatData
    global_buffer_j: FloatData
    hbm_j: FloatData
    network_j: FloatData


@irdl_attr_definition
class LayerEnergyAttr(RecordAttr):
    """Per-layer energy on one device (module attribute ``phaze.layer_energy``, one per layer
    index of ``phaze.layer``), from ``phaze-estimate-energy``.

    Syntax::

        #phaze.layer_energy<index = 1, fwd_j = 0.21, bwd_j = 0.43, opt_j = 0.02,
                            selective_j = 0.03, full_j = 0.21, network_j = 0.01>

    - ``fwd_j``/``bwd_j``: the layer's ops of that phase, per micro-batch; ``opt_j``: its
      optimizer ops, per step.
    - ``selective_j``/``full_j``: what recomputing the layer spends per micro-batch under that
      policy (the attention core again; the whole forward again).
    - ``network_j``: the network part of ``fwd_j + bwd_j`` (its tensor-parallel collectives).
    """

    name = "phaze.layer_energy"
    FIELDS = ("index", "fwd_j", "bwd_j", "opt_j", "selective_j", "full_j", "network_j")

    index: IntAttr
    fwd_j: FloatData
    bwd_j: FloatData
    opt_j: FloatData
    selective_j: FloatData
    full_j: FloatData
    network_j: FloatData


@irdl_attr_definition
class SchedAttr(RecordAttr):
    """Where ``phaze-schedule-ops`` places an op in its layer's schedule (the model is in
    ``passes/algorithms/schedule/``).

    Syntax::

        #phaze.sched<start_s = 0.0012, end_s = 0.0015, cores = 8>

    - ``start_s``/``end_s``: seconds from the start of the op's group (its layer's forward,
      backward or optimizer ops, each scheduled on its own from 0).
    - ``cores``: cores of its unit the op holds: all of them when split, 1 on one core, 0 for
      ops that take no time (views).
    """

    name = "phaze.sched"
    FIELDS = ("start_s", "end_s", "cores")

    start_s: FloatData
    end_s: FloatData
    cores: IntAttr


@irdl_attr_definition
class LayerScheduleAttr(RecordAttr):
    """The schedule of one layer (module attribute ``phaze.layer_schedule``, one per layer index
    of ``phaze.layer``), from ``phaze-schedule-ops``.

    Syntax::

        #phaze.layer_schedule<index = 1, fwd_s = 0.028, bwd_s = 0.056, opt_s = 0.001,
                              cast_s = 0.0, tp_comm_s = 0.004, status = optimal, gap = 0.0>

    - ``fwd_s``/``bwd_s``: makespans of the layer's forward and backward ops, per micro-batch;
      ``opt_s``: of its optimizer ops (once per batch), in seconds.
    - ``cast_s``: of its forward's FP8 weight casts scheduled alone (the ops that make
      ``Graph.fp8_weight_copies``; 0 without FP8 linears), part of ``fwd_s``: Transformer
      Engine casts once a step, not per micro-batch, below ZeRO-3 (the placement DP's
      ``cast_s``).
    - ``tp_comm_s``: of ``fwd_s + bwd_s``, the seconds in which a collective runs and nothing
      else does: the layer's TP collectives that its schedules do not hide behind compute.
    - ``status``: the weakest of the three solves: ``optimal``, ``gaplimit`` (stopped at the
      gap limit), ``nodelimit`` (at the node limit), ``timelimit`` (at the time limit; the best
      schedule found is kept) or ``heuristic`` (the warm start: the MILP was not run or failed).
    - ``gap``: the largest proven relative gap ``(makespan − lower bound) / makespan``.
    """

    name = "phaze.layer_schedule"
    FIELDS = ("index", "fwd_s", "bwd_s", "opt_s", "cast_s", "tp_comm_s", "status", "gap")

    index: IntAttr
    fwd_s: FloatData
    bwd_s: FloatData
    opt_s: FloatData
    cast_s: FloatData
    tp_comm_s: FloatData
    status: ScheduleStatusAttr
    gap: FloatData


@irdl_attr_definition
class LayerRecomputeAttr(RecordAttr):
    """Activation memory and extra time of one layer under each recompute policy (module
    attribute ``phaze.layer_recompute``), from ``phaze-insert-recompute`` (the model is in
    ``passes/algorithms/recompute.py``).

    Syntax::

        #phaze.layer_recompute<index = 1, none_bytes = 3986718720, selective_bytes = 765460480,
                         full_bytes = 33554432, selective_s = 0.01, full_s = 0.028>

    - ``none_bytes``/``selective_bytes``/``full_bytes``: activation bytes stashed per micro-batch
      for the layer's backward with no recompute (what autograd saves), with the attention core
      recomputed, and with only the layer's input kept.
    - ``selective_s``/``full_s``: extra forward time per micro-batch (s): the scheduled makespan
      of the recomputed attention core, of the whole forward.
    """

    name = "phaze.layer_recompute"
    FIELDS = ("index", "none_bytes", "selective_bytes", "full_bytes", "selective_s", "full_s")

    index: IntAttr
    none_bytes: IntAttr
    selective_bytes: IntAttr
    full_bytes: IntAttr
    selective_s: FloatData
    full_s: FloatData


@irdl_attr_definition
class LayerMemoryAttr(RecordAttr):
    """Memory of one layer on one device (module attribute ``phaze.layer_memory``), from
    ``phaze-insert-recompute`` (the model is in ``passes/algorithms/memory.py``).

    Syntax::

        #phaze.layer_memory<index = 1, param_bytes = 404750336, grad_bytes = 404750336,
                            optimizer_bytes = 2428502016, saved_none_bytes = 3986718720,
                            saved_selective_bytes = 765460480, saved_full_bytes = 33554432,
                            workspace_bytes = 2147483648, recompute_workspace_bytes = 6100000000,
                            expert_param_bytes = 0, expert_optimizer_bytes = 0,
                            fp8_weight_bytes = 0>

    - ``param_bytes``/``grad_bytes``: weights the layer's forward reads and their gradients;
      ``optimizer_bytes``: their optimizer state (e.g. fp32 master copy and Adam moments).
    - ``expert_param_bytes``/``expert_optimizer_bytes``: the part of ``param_bytes`` (and of the
      gradients) and of ``optimizer_bytes`` that is an MoE layer's per-expert weights, which
      expert parallelism divides over its group (0 in a dense layer).
    - ``saved_*_bytes``: activations stashed per micro-batch under each recompute policy (as in
      ``#phaze.layer_recompute``).
    - ``workspace_bytes``: the largest transient live set while the layer's forward or backward
      runs, beyond the stash and the gradients; ``recompute_workspace_bytes``: the same with
      the largest rematerialization (full recompute: the layer's activations rebuilt for its
      backward), a bound for every policy.
    - ``fp8_weight_bytes``: the FP8 copies of its weights that Transformer Engine keeps for
      the whole step (``--dtype fp8``; 0 otherwise), held beside the weights but under ZeRO-3.
    """

    name = "phaze.layer_memory"
    FIELDS = LAYER_MEMORY_FIELDS

    index: IntAttr
    param_bytes: IntAttr
    grad_bytes: IntAttr
    optimizer_bytes: IntAttr
    saved_none_bytes: IntAttr
    saved_selective_bytes: IntAttr
    saved_full_bytes: IntAttr
    workspace_bytes: IntAttr
    recompute_workspace_bytes: IntAttr
    expert_param_bytes: IntAttr
    expert_optimizer_bytes: IntAttr
    fp8_weight_bytes: IntAttr


@irdl_attr_definition
class PlanAttr(RecordAttr):
    """The parallelization plan of a training step (module attribute ``phaze.plan``), from
    ``phaze-place-devices``; its stages are ``phaze.stages``.

    Syntax::

        #phaze.plan<devices = 1024, global_batch = 4096, dp = 32, pp = 8, tp = 4, cp = 1,
                    virtual_stages = 1, zero = 0, expert_parallel = 1, expert_tensor_parallel = 4,
                    rank_order = "tp-dp-pp",
                    pipeline_transfer = "whole", micro_batch_size = 1, num_micro_batches = 128, time_per_batch_s = 12.5,
                    throughput_samples_per_s = 327.7, max_memory_bytes = 30000000000,
                    devices_used = 1024, placement = "phaze", feasible = yes, binding = "">

    - ``dp``/``pp``/``tp``/``cp``: data-parallel replicas, pipeline stages, tensor-parallel
      width, context-parallel degree (devices splitting each sequence, ``phaze.context_parallel``);
      ``devices_used = dp·pp·tp·cp ≤ devices``; the gradients are shared over the ``dp·cp``
      devices of the DP×CP group.
    - ``virtual_stages``: model chunks per pipeline rank, ``v``: 1 is plain 1F1B, ``v >= 2``
      Megatron's interleaved 1F1B (``phaze.stages`` then lists the ``p·v`` chunks).
    - ``zero``: how the DP group shares the training state: 0 plain data parallelism, 1 the
      optimizer state sharded (Megatron's distributed optimizer), 2 and the gradients, 3 and
      the parameters (FSDP).
    - ``expert_parallel``: the EP degree e: each MoE layer's experts split over e consecutive
      data-parallel replicas, tokens dispatched to them and combined back by all-to-alls (1:
      every replica holds every expert; a dense model). With ``expert_tensor_parallel``
      below ``tp`` the EP group is e devices of the experts' own mesh instead (below).
    - ``expert_tensor_parallel``: the width k each expert's weights are split over (Megatron-core's
      ``--expert-tensor-parallel-size``): ``tp`` (the default: the experts split like the other
      linears, the EP group made of replicas) or a width dividing it, when the experts have their
      own mesh over a stage's ``tp·cp·dp`` devices, k innermost, then the EP group of e devices k
      apart, then the ``tp·cp·dp/(k·e)`` devices holding the same experts ("MoE parallel folding":
      e may exceed ``dp``).
    - ``rank_order``: how the devices are numbered into groups, TP innermost: ``"tp-dp-pp"``
      (pipeline outermost: Megatron-LM's and torchtitan's default) or ``"tp-pp-dp"`` (data
      parallelism outermost: Megatron-LM's ``--use-tp-pp-dp-mapping``); it decides which
      network level each group's collectives cross. Empty when no plan fits.
    - ``pipeline_transfer``: how the plan priced a boundary's activation between two pipeline
      stages: ``"whole"`` (every TP rank sends it: Megatron-LM, torchtitan) or ``"split"``
      (each rank sends 1/t, the next stage's TP group all-gathers it: DeepSpeed's pipeline
      engine). Under sequence parallelism the boundary is already sharded: ``"whole"``. Empty
      when no plan fits.
    - ``num_micro_batches``: micro-batches per replica per batch, ``global_batch / (micro_batch_size·dp)``.
    - ``time_per_batch_s``: ``(m + (p − 1)/v)·max stage time + max exposed DP collectives +
      max optimizer step`` (``phaze.stages``' ``time_s``, ``exposed_dp_s``, ``optimizer_s``):
      the pipeline with its bubble, then the gradients' collectives, then the optimizer step,
      as a measured iteration runs them.
    - ``placement``: ``"phaze"`` (searched) or ``"expert:PP,DP,TP"`` (evaluated as given).
    - ``feasible``: ``"yes"`` or ``"no"``; ``binding``: when not feasible, the constraint that
      binds (e.g. ``"memory: ..."``), else empty.
    """

    name = "phaze.plan"
    FIELDS = (
        "devices",
        "global_batch",
        "dp",
        "pp",
        "tp",
        "cp",
        "virtual_stages",
        "zero",
        "expert_parallel",
        "expert_tensor_parallel",
        "rank_order",
        "pipeline_transfer",
        "micro_batch_size",
        "num_micro_batches",
        "time_per_batch_s",
        "throughput_samples_per_s",
        "max_memory_bytes",
        "devices_used",
        "placement",
        "feasible",
        "binding",
    )

    devices: IntAttr
    global_batch: IntAttr
    dp: IntAttr
    pp: IntAttr
    tp: IntAttr
    cp: IntAttr
    virtual_stages: IntAttr
    zero: IntAttr
    expert_parallel: IntAttr
    expert_tensor_parallel: IntAttr
    rank_order: StringAttr
    pipeline_transfer: StringAttr
    micro_batch_size: IntAttr
    num_micro_batches: IntAttr
    time_per_batch_s: FloatData
    throughput_samples_per_s: FloatData
    max_memory_bytes: IntAttr
    devices_used: IntAttr
    placement: StringAttr
    feasible: YesNoAttr
    binding: StringAttr

    RANGES = {
        # (the counts within what the options take: a plan over 2^31 - 1 devices cannot be
        # re-placed, phaze-place-devices{devices=...} refuses it)
        **{f: (1, COUNT_MAX) for f in ("devices", "global_batch", "micro_batch_size")},
        **{f: (0, COUNT_MAX) for f in ("dp", "pp", "tp", "virtual_stages", "expert_parallel", "num_micro_batches")},
        "expert_tensor_parallel": (1, COUNT_MAX),
        "cp": (1, COUNT_MAX),
        "devices_used": (0, COUNT_MAX),
        "max_memory_bytes": (0, I64_MAX),
        "zero": (0, 3),
        **{f: (0, math.inf) for f in ("time_per_batch_s", "throughput_samples_per_s")},
    }


@irdl_attr_definition
class StageInfoAttr(RecordAttr):
    """One pipeline stage of ``phaze.plan`` (module attribute ``phaze.stages``): under plain
    1F1B the layers of one pipeline rank, under interleaved 1F1B one model chunk.

    Syntax::

        #phaze.stage_info<index = 0, rank = 0, first_layer = 0, last_layer = 12, devices = 4, time_s = 0.09,
                     compute_s = 0.08, recompute_s = 0.006, pp_comm_s = 0.004, zero_comm_s = 0.0,
                     ep_comm_s = 0.0, memory_bytes = 30000000000, param_bytes = 3000000000,
                     grad_bytes = 3000000000, optimizer_bytes = 18000000000,
                     activation_bytes = 5000000000, workspace_bytes = 1000000000,
                     recompute = selective, in_flight = 8, exposed_dp_s = 0.2, optimizer_s = 0.01>

    - ``rank``: the pipeline rank that runs it (``index`` under 1F1B, ``index mod pp`` under
      interleaving); ``time_s`` and its parts, ``memory_bytes``, ``recompute``, ``in_flight``,
      ``exposed_dp_s`` and ``optimizer_s`` are that rank's.
    - ``first_layer``/``last_layer``: the layer indices (``phaze.layer``) it holds, inclusive.
    - ``devices``: devices per replica of the stage (the TP width).
    - ``time_s``: forward + backward (+ recompute) + TP and boundary transfers per micro-batch.
    - ``compute_s``, ``recompute_s``, ``pp_comm_s``, ``zero_comm_s``, ``ep_comm_s``: ``time_s``
      by part, as the placement DP adds it up (they add up to it but for rounding): the
      layers' scheduled forward and backward (their TP collectives inside), the recompute's
      extra work, the boundary transfers, ZeRO-2/3's per-micro-batch collectives not hidden,
      expert parallelism's all-to-alls.
    - ``memory_bytes``: per device: weights, gradients, optimizer state (each divided over the
      DP group where ``zero`` shards it), ``in_flight`` micro-batches of stashed activations
      (chunk-micro-batches under interleaving), workspace.
    - ``param_bytes``, ``grad_bytes``, ``optimizer_bytes``, ``activation_bytes``,
      ``workspace_bytes``: ``memory_bytes`` by part, as the placement DP counts it (they add
      up to it): the state parts already sharded (ZeRO-3's parameters with its two gathered
      layers), the activations the schedule's peak stash.
    - ``recompute``: ``"none"``, ``"selective"`` or ``"full"``.
    - ``exposed_dp_s``: the stage's once-per-step data-parallel collectives (the gradient
      all-reduce, or ZeRO's reduce-scatter and all-gather) not hidden by compute.
    - ``optimizer_s``: the stage's optimizer step after the flush, on one device: its layers'
      ``opt_s``, 1/dp of it when ``zero`` >= 1 shards the state.
    """

    name = "phaze.stage_info"
    FIELDS = (
        "index",
        "rank",
        "first_layer",
        "last_layer",
        "devices",
        "time_s",
        "compute_s",
        "recompute_s",
        "pp_comm_s",
        "zero_comm_s",
        "ep_comm_s",
        "memory_bytes",
        "param_bytes",
        "grad_bytes",
        "optimizer_bytes",
        "activation_bytes",
        "workspace_bytes",
        "recompute",
        "in_flight",
        "exposed_dp_s",
        "optimizer_s",
    )

    index: IntAttr
    rank: IntAttr
    first_layer: IntAttr
    last_layer: IntAttr
    devices: IntAttr
    time_s: FloatData
    compute_s: FloatData
    recompute_s: FloatData
    pp_comm_s: FloatData
    zero_comm_s: FloatData
    ep_comm_s: FloatData
    memory_bytes: IntAttr
    param_bytes: IntAttr
    grad_bytes: IntAttr
    optimizer_bytes: IntAttr
    activation_bytes: IntAttr
    workspace_bytes: IntAttr
    recompute: RecomputePolicyAttr
    in_flight: IntAttr
    exposed_dp_s: FloatData
    optimizer_s: FloatData


@irdl_attr_definition
class PowerAttr(RecordAttr):
    """Energy and power of one training step under ``phaze.plan`` (module attribute
    ``phaze.power``), from ``phaze-estimate-power`` (the model is in
    ``passes/algorithms/energy.py``, ``plan_power``).

    Syntax::

        #phaze.power<step_energy_j = 1.2e6, chip_power_w = 312.5, mean_chip_power_w = 301.2,
                     static_power_w = 58.0, network_energy_j = 2.0e4, energy_per_sample_j = 290.0,
                     power_limit_w = 400.0, clock_limited_share = 0.12, power_limit_s = 0.0>

    - ``step_energy_j``: every device's energy over one step (``phaze.plan``'s time per batch),
      static power and network included.
    - ``chip_power_w``: the busiest device's average power over the step: its chip's dynamic
      energy (compute, buffers, HBM) over the step's time plus the die's static power;
      ``mean_chip_power_w``: the same averaged over the pipeline ranks.
    - ``static_power_w``: one die's static power (``static_w_per_mm2 · area``).
    - ``network_energy_j``: the network's share of ``step_energy_j`` (not in the chip's power).
    - ``energy_per_sample_j``: ``step_energy_j`` over the global batch.
    - ``power_limit_w``: the chip's power limit (``[energy] power_limit_w``; 0: none).
    - ``clock_limited_share``: the share of the step the limit sets the clock of: of its ops'
      time, the ops the limit lengthens (latency bound ``power``); 1 when the step itself is
      lengthened.
    - ``power_limit_s``: what the limit adds to the step as a whole, in seconds (its dynamic
      energy over the limit less the static power, beyond the scheduled time; in
      ``phaze.plan``'s ``time_per_batch_s``).
    """

    name = "phaze.power"
    FIELDS = (
        "step_energy_j",
        "chip_power_w",
        "mean_chip_power_w",
        "static_power_w",
        "network_energy_j",
        "energy_per_sample_j",
        "power_limit_w",
        "clock_limited_share",
        "power_limit_s",
    )

    step_energy_j: FloatData
    chip_power_w: FloatData
    mean_chip_power_w: FloatData
    static_power_w: FloatData
    network_energy_j: FloatData
    energy_per_sample_j: FloatData
    power_limit_w: FloatData
    clock_limited_share: FloatData
    power_limit_s: FloatData


@irdl_attr_definition
class BaselineAttr(RecordAttr):
    """One baseline of an architecture search (module attribute ``phaze.baselines``), so that the
    search's speed-ups can be recomputed from the plan file alone: ``phaze.plan``'s
    ``throughput_samples_per_s`` over the baseline's.

    Syntax::

        #phaze.baseline<label = "tpuv4+expert", throughput_samples_per_s = 300.5, dp = 128, pp = 8,
                        tp = 1, micro_batch_size = 1, accelerator = "tpuv4", area_um2 = 278826676.3,
                        hbm_bytes = 34359738368, note = "">

    - ``label``: ``tpuv4+expert`` (the TPUv4-like chip, the paper's expert placement),
      ``tpuv4+phaze`` (that chip, the searched placement), ``decoupled`` (the best chip of the
      space under the expert placement), ``co-optimized`` (the search's answer).
    - ``throughput_samples_per_s``: 0 when nothing fits or the baseline does not apply (``note``
      says why); with several models, the mean over them (``dp``, ``pp``... are then those of the
      first model).
    - ``accelerator``: the chip's name; ``area_um2``: its modelled area (0 when outside the model).
    """

    name = "phaze.baseline"
    FIELDS = (
        "label",
        "throughput_samples_per_s",
        "dp",
        "pp",
        "tp",
        "micro_batch_size",
        "accelerator",
        "area_um2",
        "hbm_bytes",
        "note",
    )

    label: StringAttr
    throughput_samples_per_s: FloatData
    dp: IntAttr
    pp: IntAttr
    tp: IntAttr
    micro_batch_size: IntAttr
    accelerator: StringAttr
    area_um2: FloatData
    hbm_bytes: IntAttr
    note: StringAttr


def _non_negative(cls: type[RecordAttr], **also: tuple[float, float]) -> None:
    """Bound every number field of ``cls`` to ``>= 0`` (an index, a count, bytes, seconds,
    joules, watts: none of its writers makes a negative one) and ``also``'s fields as given, so
    that a plan read back with a negative time, energy or size is refused at the field."""
    for field, kind in _field_types(cls).items():
        if kind in (IntAttr, FloatData):  # (no upper bound: a FLOP count may pass an i64's)
            cls.RANGES = {**cls.RANGES, field: (0, math.inf)}
    cls.RANGES = {**cls.RANGES, **also}


for _record in (
    LayerInfoAttr,
    LayerLatencyAttr,
    LayerEnergyAttr,
    LayerScheduleAttr,
    LayerRecomputeAttr,
    LayerMemoryAttr,
    StageInfoAttr,
):
    _non_negative(_record)
# The share of the step the power limit sets the clock of: a fraction.
_non_negative(PowerAttr, clock_limited_share=(0, 1))
