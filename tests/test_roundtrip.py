"""The IR round-trips for every value it can hold.

Every record attribute of the phaze dialect (found in the dialect, not listed by hand) is built
with arbitrary field values (floats: huge, tiny, subnormal, ±0, ±inf, NaNs; integers up to the
records' limit; strings with quotes, backslashes, control and non-ASCII characters, long ones),
put on ops of a small module, and printed -> parsed -> printed, in the custom and in the generic
form: the bytes must be identical and the values the same, bit for bit.  Then the README's main
command (`phazec MODEL --space ... -o plan.mlir`) on a small space, and `phaze-opt plan.mlir`
must print the plan byte for byte.
"""

from __future__ import annotations

import io
import math
import re
import struct
import time
import typing

import pytest
from conftest import EXAMPLES, module_text, run_main
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from xdsl.dialects.builtin import (
    ArrayAttr,
    DictionaryAttr,
    FloatAttr,
    FloatData,
    IntAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    TensorType,
    UnitAttr,
    f16,
    f64,
    i64,
)
from xdsl.dialects.func import FuncOp, ReturnOp
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import Block, Region

from phaze_ir import ir
from phaze_ir.attributes import MAX_INT_BITS, RecordAttr, float_from_bits, format_float
from phaze_ir.dialect import Phaze
from phaze_ir.ir import parse_module, print_module

RECORDS = sorted(
    (a for a in Phaze.attributes if isinstance(a, type) and issubclass(a, RecordAttr)), key=lambda a: a.name
)

# Hypothesis: the same examples on every run, a bounded number, no example database on disk.
ROUNDTRIP = settings(
    max_examples=30, derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

# MLIR's float literal (mlir/docs/LangRef: float-literal) or the hex form of a float's bits.
MLIR_FLOAT = re.compile(r"[-+]?[0-9]+[.][0-9]*([eE][-+]?[0-9]+)?|0x[0-9A-F]{16}")

LIMIT = 2**MAX_INT_BITS - 1

INTS = st.one_of(
    st.integers(),
    st.integers(-(2**63), 2**64),
    st.integers(-LIMIT, LIMIT),
    st.sampled_from([0, -1, 2**63 - 1, -(2**63), 2**64, LIMIT, -LIMIT]),
)
FLOATS = st.one_of(
    st.floats(),  # with NaNs (several payloads, both signs), infinities, subnormals, -0.0
    st.sampled_from([0.0, -0.0, 8e-08, 1e22, 1e16, 5e-324, -5e-324, 1.7976931348623157e308, math.inf, -math.inf]),
    st.integers(0, 2**64 - 1).map(float_from_bits),  # any bit pattern at all
)
SPECIAL = '"\\<>{}[]()=,#%@^!:;\n\r\t\x00\x7f é漢\U0001f600'
STRINGS = st.one_of(
    st.text(),
    st.text(alphabet=SPECIAL, max_size=40),
    st.text(max_size=4).map(lambda s: s * 100),  # long strings
    st.sampled_from(["", '"', "\\", '\\"', "a>b", "}", "8e-08", "é", "\x00", "transformer.h.0." * 200]),
)


def _field_strategy(hint: type) -> st.SearchStrategy:
    if isinstance(hint, type) and issubclass(hint, EnumAttribute):
        return st.sampled_from([str(e.value) for e in hint.enum_type])
    return {IntAttr: INTS, FloatData: FLOATS, StringAttr: STRINGS}[hint]


def _ranged(hint: type, least: float, most: float) -> st.SearchStrategy:
    """Values of a field bounded by its class's ``RANGES`` (the record refuses others)."""
    if hint is IntAttr:
        return st.one_of(st.integers(int(least), int(min(most, 2**63 - 1))), st.sampled_from([int(least)]))
    return st.floats(least, most, allow_infinity=False, allow_nan=False)


def records(cls: type[RecordAttr]) -> st.SearchStrategy[RecordAttr]:
    """Instances of ``cls`` with arbitrary values of each field's declared type (within the
    field's range, where the class bounds it)."""
    hints = typing.get_type_hints(cls)
    fields = {
        f: _ranged(hints[f], *cls.RANGES[f]) if f in cls.RANGES else _field_strategy(hints[f]) for f in cls.FIELDS
    }
    return st.fixed_dictionaries(fields).map(lambda v: cls.make(**v))


def _module(attrs: list[RecordAttr]) -> ModuleOp:
    """A module holding the records as op attributes: on the module itself, one by one and as
    a list (as phaze's module attributes do), and on an op inside it."""
    body = FuncOp("f", ([], []), Region(Block([ReturnOp()])))
    for i, a in enumerate(attrs):
        body.attributes[f"phaze.r{i}"] = a
    module = ModuleOp([body])
    module.attributes["phaze.all"] = ArrayAttr(attrs)
    module.attributes["phaze.first"] = attrs[0]
    return module


def _records_of(module: ModuleOp) -> list[RecordAttr]:
    return list(module.attributes["phaze.all"].data)


def _bits(value):
    return struct.pack(">d", value) if isinstance(value, float) else value


def test_every_record_class_is_covered():
    assert len(RECORDS) >= 11, [a.name for a in RECORDS]
    for cls in RECORDS:
        hints = typing.get_type_hints(cls)
        for f in cls.FIELDS:  # every field has a type the generator knows
            _field_strategy(hints[f])


@pytest.mark.parametrize("cls", RECORDS, ids=lambda c: c.name)
@ROUNDTRIP
@given(data=st.data())
def test_record_round_trips(cls, data):
    attrs = data.draw(st.lists(records(cls), min_size=1, max_size=2))
    module = _module(attrs)
    for generic in (False, True):
        text = print_module(module, generic=generic)
        parsed = parse_module(text)
        assert print_module(parsed, generic=generic) == text
        back = _records_of(parsed)
        assert back == attrs  # FloatData compares bits: -0.0 and NaN payloads survive
        for a, b in zip(attrs, back):
            assert {k: _bits(v) for k, v in a.as_dict().items()} == {k: _bits(v) for k, v in b.as_dict().items()}
    # The generic form reads back to the custom one too.
    assert print_module(parse_module(print_module(module, generic=True))) == print_module(module)


def _xdsl_printed(module: ModuleOp, generic: bool) -> str:
    """``module`` as xDSL's own printer prints it (phaze's ``print_module`` adds a newline)."""
    from xdsl.printer import Printer

    out = io.StringIO()
    Printer(stream=out, print_generic_format=generic).print_op(module)
    return out.getvalue() + "\n"


@given(st.lists(st.text(alphabet=st.characters(codec="utf-8"), max_size=40), min_size=1, max_size=4))
@settings(max_examples=50, deadline=None, derandomize=True)
def test_string_literals_print_as_xdsls_printer_prints_them(strings):
    """phaze prints a string literal in one piece (``phaze_ir.ir._Printer``); xDSL's printer a
    character at a time: the same bytes, in both forms, and they read back."""
    module = ModuleOp([], attributes={f"s{i}": StringAttr(t) for i, t in enumerate(strings)})
    for generic in (False, True):
        text = print_module(module, generic=generic)
        assert text == _xdsl_printed(module, generic)
        assert [a.data for a in parse_module(text).attributes.values()] == strings


@given(data=st.data())
@settings(max_examples=40, deadline=None, derandomize=True, database=None)
def test_attribute_dictionaries_print_as_xdsls_printer_prints_them(data):
    """phaze prints an attribute dictionary as one piece and copies the text of an attribute
    it printed before (strings, integers, tensor types by value; records by identity): the
    same bytes as xDSL's printer, whatever the names (quoted or bare), the values (unit, a
    value printed piece by piece, a record repeated as the same object or as an equal other,
    another record of its kind) and their order, on ops and nested in arrays and dictionaries."""
    cls = data.draw(st.sampled_from(RECORDS))
    record, other = data.draw(records(cls)), data.draw(records(cls))
    equal = cls(*record.parameters)  # equal, another object
    pool = [
        UnitAttr(),
        StringAttr("fwd"),
        StringAttr('a "b"\n'),
        IntegerAttr(3, i64),
        FloatAttr(0.5, f64),
        TensorType(f16, [2, 3]),
        record,
        equal,
        other,
        ArrayAttr([record, equal, other, StringAttr("fwd")]),
        DictionaryAttr({"a b": UnitAttr(), "c": record}),
    ]
    names = st.lists(st.text(min_size=1, max_size=6) | st.sampled_from(["phaze.layer", "a-b", "_x"]), unique=True)
    ops = [ModuleOp([], attributes={n: data.draw(st.sampled_from(pool)) for n in data.draw(names)}) for _ in range(3)]
    module = ModuleOp(ops, attributes={n: data.draw(st.sampled_from(pool)) for n in data.draw(names)})
    for generic in (False, True):
        assert print_module(module, generic=generic) == _xdsl_printed(module, generic)


def test_every_byte_is_escaped_as_xdsl_escapes_it():
    from xdsl.printer import Printer

    every = bytes(range(256))
    ours, theirs = io.StringIO(), io.StringIO()
    ir._Printer(stream=ours).print_bytes_literal(every)
    Printer(stream=theirs).print_bytes_literal(every)
    assert ours.getvalue() == theirs.getvalue()


@ROUNDTRIP
@given(FLOATS)
def test_format_float_is_an_mlir_literal_of_the_same_bits(value):
    text = format_float(value)
    assert MLIR_FLOAT.fullmatch(text), text
    back = float_from_bits(int(text, 16)) if text.startswith("0x") else float(text)
    assert struct.pack(">d", back) == struct.pack(">d", value)


@pytest.mark.parametrize(
    "value, text",
    [
        (8e-08, "8.0e-08"),
        (1e22, "1.0e+22"),
        (1.5e300, "1.5e+300"),
        (0.1, "0.1"),
        (123.0, "123.0"),
        (-0.0, "-0.0"),
        (5e-324, "5.0e-324"),
        (math.inf, "0x7FF0000000000000"),  # as MLIR prints an f64 infinity
        (-math.inf, "0xFFF0000000000000"),
        (math.nan, "0x7FF8000000000000"),
    ],
)
def test_format_float_examples(value, text):
    assert format_float(value) == text


def test_records_refuse_what_they_cannot_hold():
    from xdsl.utils.exceptions import VerifyException

    from phaze_ir.attributes import LayerLatencyAttr, PlanAttr

    with pytest.raises(ValueError, match="at most 4096 bits"):
        LayerLatencyAttr.make(index=2**MAX_INT_BITS, fwd_s=0.0, bwd_s=0.0, opt_s=0.0)
    ok = LayerLatencyAttr.make(index=LIMIT, fwd_s=0.0, bwd_s=0.0, opt_s=0.0)
    assert ok.get("index") == LIMIT
    with pytest.raises(VerifyException, match="expected an integer >= 0"):  # a per-layer record's numbers
        LayerLatencyAttr.make(index=-1, fwd_s=0.0, bwd_s=0.0, opt_s=0.0)
    with pytest.raises(TypeError, match="bool"):
        LayerLatencyAttr.make(index=True, fwd_s=0.0, bwd_s=0.0, opt_s=0.0)
    plan = {f: 0 for f in PlanAttr.FIELDS} | {
        "time_per_batch_s": 0.0,
        "throughput_samples_per_s": 0.0,
        "placement": "phaze",
        "feasible": "yes",
        "binding": "\ud800",  # a lone surrogate: not text that UTF-8 (or MLIR) can hold
    }
    with pytest.raises(ValueError, match="UTF-8"):
        PlanAttr.make(**plan)


@pytest.mark.parametrize(
    "body, message",
    [
        ("index = 1, fwd_s = 8e-08, bwd_s = 0.0, opt_s = 0.0", "takes a float literal"),
        ("index = 1.0, fwd_s = 0.0, bwd_s = 0.0, opt_s = 0.0", "takes an integer"),
        ('index = "1", fwd_s = 0.0, bwd_s = 0.0, opt_s = 0.0', "takes a number"),
        ("index = 1, fwd_s = -0x7FF0000000000000, bwd_s = 0.0, opt_s = 0.0", "takes a float literal"),
    ],
)
def test_mistyped_field_is_a_clear_parse_error(body, message):
    from phaze_ir.ir import MLIRParseError

    with pytest.raises(MLIRParseError, match=message) as info:
        parse_module(f"builtin.module attributes {{x = #phaze.layer_latency<{body}>}} {{\n}}\n")
    assert ":1:" in str(info.value).splitlines()[0]


def test_hex_float_bits_parse():
    """A float field without bounds (an op's energy) keeps every bit pattern; a per-layer
    record's times are finite and >= 0, and a hex infinity there is refused at the field."""
    from phaze_ir.ir import MLIRParseError

    text = (
        "builtin.module attributes {x = #phaze.energy<compute_j = 0x7FF0000000000000, "
        "core_buffer_j = 0xFFF0000000000000, global_buffer_j = 0x7FF8000000000001, hbm_j = 0.0, "
        "network_j = 0.0>} {\n}\n"
    )
    attr = parse_module(text).attributes["x"]
    assert attr.get("compute_j") == math.inf and attr.get("core_buffer_j") == -math.inf
    assert math.isnan(attr.get("global_buffer_j"))
    assert print_module(parse_module(text)) == text
    bounded = "builtin.module attributes {x = #phaze.layer_latency<index = 0, fwd_s = 0x7FF0000000000000, "
    with pytest.raises(MLIRParseError, match="fwd_s.*expected a finite number >= 0"):
        parse_module(bounded + "bwd_s = 0.0, opt_s = 0.0>} {\n}\n")


def test_main_command_output_reads_back_byte_for_byte(tmp_path):
    """The README's main command, on the small space with one micro-batch size and TP width
    (about 40-50 s on the 2-core machine, cold cache), and phaze-opt on its output (about 20 s
    for the 4 MB plan).  The generic form of every record is covered above."""
    plan = tmp_path / "plan.mlir"
    start = time.perf_counter()
    r = run_main(
        "phazec",
        str(EXAMPLES / "gpt2_xl.py"),
        "--space",
        str(EXAMPLES / "spaces" / "small.toml"),
        "--micro-batch",
        "1",
        "--tp",
        "1",
        "-j",
        "1",
        "--cache",
        str(tmp_path / "cache"),
        "-q",
        "-o",
        str(plan),
    )
    search_s = time.perf_counter() - start
    assert r.returncode == 0, r.stderr[-3000:]
    text = plan.read_text()
    assert "#phaze.baseline<" in text and "#phaze.plan<" in text
    back = run_main("phaze-opt", str(plan))
    assert back.returncode == 0, back.stderr[-3000:]
    assert back.stdout == module_text(text)
    print(f"phazec search {search_s:.1f} s, phaze-opt {time.perf_counter() - start - search_s:.1f} s")


def test_print_module_from_prints_only_the_new_header():
    """``print_module_from``: a module printed, then given one more attribute, prints as the text
    with its header printed again (what the search writes: its winner's plan with the
    baselines); a text of another module is printed in full."""
    module = ModuleOp([FuncOp("f", ([], []), Region(Block([ReturnOp()])))], {"phaze.model": StringAttr("m")})
    text = print_module(module)
    module.attributes["phaze.baselines"] = ArrayAttr([StringAttr("a } {")])
    assert ir.print_module_from(text, module, "phaze.baselines") == print_module(module)
    other = "builtin.module {\n}\n"
    assert ir.print_module_from(other, module, "phaze.baselines") == print_module(module)
    module.sym_name = StringAttr("named")
    assert ir.print_module_from(text, module, "phaze.baselines") == print_module(module)


def test_spellings_read_once_parse_as_xdsls_parser_reads_them():
    """phaze's parser gives a record, a tensor type or an ``i64`` integer it read before again
    when it meets the same spelling (``phaze_ir.ir._Parser._read_once``); what it reads must be
    what xDSL's own parser reads, also where a comment inside a record holds a ``>`` and two
    records begin alike up to it, where a string field holds brackets and quotes, and where
    an integer's type goes on past ``i64``."""
    from xdsl.parser import Parser

    records = [
        f"#phaze.latency<one_s = 1.0, // x > y\n split_s = {s}, unit = tensor, bound = hbm>"
        for s in ("2.0", "3.0", "2.0")
    ]
    strings = [
        f'#phaze.layer_info<index = {i}, kind = block, module = "a>b\\"<c", same_as = 1, '
        + "param_bytes = 1, saved_bytes = 2, boundary_bytes = 3, grad_boundary_bytes = 4, fwd_flops = 5, "
        + "bwd_flops = 6, opt_flops = 7, num_ops = 8, experts = 0, dispatch_bytes = 0>"
        for i in (1, 2, 1)
    ]
    entries = [*records, *strings, "1 : i64", "1 : i64", "2 : i64", "-1 : i64", "1 : i640", "1 : i64"]
    body = ",\n  ".join(f"a{i} = {e}" for i, e in enumerate(entries))
    types = "(tensor<2x3xf16>, tensor<2x3xf16>, tensor<2x3xf32>, tensor<2x3xf16>) -> ()"
    inner = f"builtin.module attributes {{a = tensor<2x3xf16>, t = {types}}} {{\n  }}"
    text = f"builtin.module attributes {{{body}}} {{\n  {inner}\n}}\n"
    ours = print_module(ir.parse_text(text))
    theirs = print_module(Parser(ir.make_context(), text).parse_module())
    assert ours == theirs
    assert "split_s = 3.0" in ours and "index = 2" in ours and "1 : i640" in ours


def test_dims_and_repeated_types_print_as_xdsls_printer_prints_them():
    """A view's or a reduction's ``dims`` (printed without xDSL's generic ``isa``,
    ``ir._integer_arrays_printed_fast``) and attributes met again as the same object or as an
    equal other (found by identity first, ``_Printer._once``): the same bytes as xDSL's
    printer, in both forms; xDSL's own method is back after the print."""
    from xdsl.dialects.builtin import DenseArrayBase, i64
    from xdsl.irdl.declarative_assembly_format import DenseArrayAttributeVariable

    from phaze_ir.dialect import ReductionOp

    shared = TensorType(f16, [2, 3])
    arg_types = [shared, TensorType(f16, [2, 3]), shared]
    block = Block(arg_types=arg_types)
    ops = []
    for k, dims in enumerate(([0], [0, 1], [], [1])):
        kind = StringAttr("sum")
        op = ReductionOp.create(
            operands=[block.args[k % 3]],
            result_types=[TensorType(f16, [2]) if k % 2 else shared],
            properties={"kind": kind, "dims": DenseArrayBase.from_list(i64, dims), "aten": StringAttr("aten.sum")},
            attributes={"phaze.phase": StringAttr("fwd"), "phaze.layer": IntegerAttr(k, i64), "phaze.t": shared},
        )
        ops.append(op)
    block.add_ops([*ops, ReturnOp()])
    func = FuncOp("f", (arg_types, []), Region(block))
    module = ModuleOp([func])
    before = DenseArrayAttributeVariable.print_attr
    for generic in (False, True):
        text = print_module(module, generic=generic)
        assert text == _xdsl_printed(module, generic)
        assert DenseArrayAttributeVariable.print_attr is before
    assert "dims [0, 1] aten" in print_module(module)
