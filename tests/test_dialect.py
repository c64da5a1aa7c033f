"""The phaze dialect: verifiers, the compute interface (FLOPs, bytes), attributes, printing."""

from __future__ import annotations

import pytest
from xdsl.dialects.builtin import Float16Type, Float32Type, TensorType
from xdsl.utils.exceptions import VerifyException

from phaze_ir import dialect as ph
from phaze_ir.attributes import LayerInfoAttr
from phaze_ir.ir import parse_module, print_module

F16 = Float16Type()


def t(*shape, dtype=F16):
    return TensorType(dtype, list(shape))


def module_with(body: str, args: str) -> str:
    return f"builtin.module {{\n  func.func @f({args}) {{\n{body}\n    func.return\n  }}\n}}\n"


def test_matmul_flops_and_bytes():
    text = module_with(
        "    %y = phaze.matmul %x, %w, %b : (tensor<8x64xf16>, tensor<64x32xf16>, tensor<32xf16>) -> tensor<8x32xf16>",
        "%x: tensor<8x64xf16>, %w: tensor<64x32xf16>, %b: tensor<32xf16>",
    )
    m = parse_module(text)
    mm = next(o for o in m.walk() if isinstance(o, ph.MatmulOp))
    assert mm.iteration_space() == (8, 32, 64)
    assert mm.flops() == 2 * 8 * 32 * 64 + 8 * 32
    assert mm.bytes_read() == (8 * 64 + 64 * 32 + 32) * 2
    assert mm.bytes_written() == 8 * 32 * 2


def test_batched_matmul_broadcasts():
    text = module_with(
        "    %y = phaze.matmul %x, %w : (tensor<4x8x16xf16>, tensor<16x2xf16>) -> tensor<4x8x2xf16>",
        "%x: tensor<4x8x16xf16>, %w: tensor<16x2xf16>",
    )
    mm = next(o for o in parse_module(text).walk() if isinstance(o, ph.MatmulOp))
    assert mm.flops() == 4 * 2 * 8 * 2 * 16


@pytest.mark.parametrize(
    "body, message",
    [
        (
            "%y = phaze.matmul %x, %x : (tensor<8x64xf16>, tensor<8x64xf16>) -> tensor<8x64xf16>",
            "contracting dimensions differ: lhs has K = 64, rhs has K = 8",
        ),
        (
            '%y = phaze.elementwise "frobnicate" %x aten "aten.x" : (tensor<8x64xf16>) -> tensor<8x64xf16>',
            'unknown kind "frobnicate"',
        ),
        (
            '%y = phaze.softmax "softmax" %x dim 5 : (tensor<8x64xf16>) -> tensor<8x64xf16>',
            "dim 5 is out of range for rank 2",
        ),
        (
            '%y = phaze.collective "all_reduce" %x group_size 0 : (tensor<8x64xf16>) -> tensor<8x64xf16>',
            "group_size must be >= 1",
        ),
    ],
)
def test_verifier_messages(body, message):
    with pytest.raises(VerifyException, match=message):
        parse_module(module_with("    " + body, "%x: tensor<8x64xf16>"))


def test_optimizer_update_counts_state():
    text = module_with(
        '    %u = phaze.optimizer_update "adam" %w, %g state_bytes 12 : '
        "(tensor<64x32xf16>, tensor<64x32xf16>) -> tensor<64x32xf16>",
        "%w: tensor<64x32xf16>, %g: tensor<64x32xf16>",
    )
    op = next(o for o in parse_module(text).walk() if isinstance(o, ph.OptimizerUpdateOp))
    n = 64 * 32
    assert op.state_bytes_total() == 12 * n
    assert op.bytes_read() == 2 * n * 2 + 12 * n
    assert op.flops() == 12 * n


def test_views_move_no_bytes_copies_do():
    text = module_with(
        '    %v = phaze.layout "transpose" %x aten "aten.t.default" : (tensor<8x64xf16>) -> tensor<64x8xf16>\n'
        '    %c = phaze.layout "clone" %v aten "aten.clone.default" : (tensor<64x8xf16>) -> tensor<64x8xf16>',
        "%x: tensor<8x64xf16>",
    )
    view, copy = [o for o in parse_module(text).walk() if isinstance(o, ph.LayoutOp)]
    assert view.is_view and view.bytes_read() == view.bytes_written() == 0
    assert not copy.is_view and copy.bytes_written() == 8 * 64 * 2


def test_layer_attr_round_trips():
    attr = LayerInfoAttr.make(
        index=2,
        kind="block",
        module="m.h.1",
        same_as=1,
        param_bytes=10,
        saved_bytes=20,
        boundary_bytes=30,
        grad_boundary_bytes=30,
        fwd_flops=5,
        bwd_flops=10,
        opt_flops=1,
        num_ops=7,
        experts=8,
        dispatch_bytes=4096,
    )
    assert attr.get("module") == "m.h.1" and attr.as_dict()["bwd_flops"] == 10
    from xdsl.dialects.builtin import ArrayAttr, ModuleOp

    m = ModuleOp([], attributes={"phaze.layers": ArrayAttr([attr])})
    text = print_module(m)
    assert '#phaze.layer_info<index = 2, kind = block, module = "m.h.1", same_as = 1' in text
    assert "num_ops = 7, experts = 8, dispatch_bytes = 4096>" in text
    assert print_module(parse_module(text)) == text


def test_layer_attr_rejects_missing_field():
    with pytest.raises(TypeError, match="missing fields"):
        LayerInfoAttr.make(index=0)


def test_tensor_bytes_and_element_types():
    assert ph.tensor_bytes(t(4, 4)) == 32
    assert ph.tensor_bytes(t(4, dtype=Float32Type())) == 16
    assert ph.numel(t()) == 1


def test_enum_fields_take_only_their_words():
    """A kind, unit, bound, status, policy or yes/no field is an enum attribute: printed bare,
    refused when it is not one of its words, whether built in Python or parsed."""
    from xdsl.utils.exceptions import ParseError

    from phaze_ir.attributes import LatencyAttr

    attr = LatencyAttr.make(one_s=1.0, split_s=0.5, unit="vector", bound="hbm")
    assert attr.get("unit") == "vector" and type(attr.get("unit")) is str
    with pytest.raises(ValueError, match="unit = 'gpu' is not one of tensor, vector, network, none"):
        LatencyAttr.make(one_s=1.0, split_s=0.5, unit="gpu", bound="hbm")
    text = "builtin.module attributes {x = #phaze.latency<one_s = 1.0, split_s = 0.5, unit = gpu, bound = hbm>} {\n}\n"
    with pytest.raises(ParseError, match="unit = 'gpu' is not one of"):
        parse_module(text)
    good = parse_module(text.replace("gpu", "tensor"))
    assert "unit = tensor, bound = hbm" in print_module(good)


def test_equal_records_are_one_attribute_and_signed_zeros_two():
    """RecordAttr.make gives equal values the same attribute, tells -0.0 from 0.0 (which print
    apart), an int from a float, and still refuses what it refused before it kept any."""
    from phaze_ir.attributes import SchedAttr

    a = SchedAttr.make(start_s=0.0, end_s=1.5, cores=2)
    assert SchedAttr.make(cores=2, start_s=0.0, end_s=1.5) == a
    assert SchedAttr.make(start_s=0.0, end_s=1.5, cores=2) is a
    negative = SchedAttr.make(start_s=-0.0, end_s=1.5, cores=2)
    assert negative is not a and str(negative) != str(a) and "-0.0" in str(negative)
    with pytest.raises(TypeError, match="bool"):
        SchedAttr.make(start_s=0.0, end_s=1.5, cores=True)
    with pytest.raises(TypeError, match="unsupported record field value"):
        SchedAttr.make(start_s=0.0, end_s=1.5, cores=[2])
    with pytest.raises(VerifyException):
        SchedAttr.make(start_s=0.0, end_s=1.5, cores=2.0)
    with pytest.raises(TypeError, match="missing fields"):
        SchedAttr.make(start_s=0.0, end_s=1.5)


def test_a_record_with_one_field_set_is_the_record_made_so():
    """RecordAttr.with_field (the deepened winner's kernel ids): equal to make of the same
    values, printed alike, the record it came from unchanged; an enum word and an integer
    checked as make checks them."""
    from phaze_ir.attributes import LatencyAttr, SchedAttr

    a = SchedAttr.make(start_s=-0.0, end_s=1.5, cores=2)
    b = a.with_field("cores", 7)
    assert b == SchedAttr.make(start_s=-0.0, end_s=1.5, cores=7) and str(b) == str(SchedAttr.make(**b.as_dict()))
    assert a.get("cores") == 2 and b.get("cores") == 7 and b.get("start_s") == -0.0
    latency = LatencyAttr.make(one_s=1.0, split_s=0.5, unit="vector", bound="hbm")
    assert latency.with_field("unit", "tensor") == LatencyAttr.make(one_s=1.0, split_s=0.5, unit="tensor", bound="hbm")
    with pytest.raises(ValueError, match="unit = 'gpu' is not one of"):
        latency.with_field("unit", "gpu")
    with pytest.raises(TypeError, match="bool"):
        a.with_field("cores", True)
    with pytest.raises(VerifyException):
        a.with_field("cores", 2.0)
    with pytest.raises(ValueError):
        a.with_field("nope", 1)


def test_a_records_values_are_read_once_and_equal_its_parameters():
    """RecordAttr.values is kept on the attribute after its first read: what get and as_dict
    give equals the parameters read one by one (a parsed record, built without make, too), a
    changed as_dict does not change the record, equality and hashing ignore the kept values,
    and a name that is not a field is still a ValueError."""
    from phaze_ir.attributes import LatencyAttr, _from_attr

    text = (
        "builtin.module attributes {x = #phaze.latency<one_s = 1.0, split_s = -0.0, unit = vector, bound = hbm>} {\n}\n"
    )
    parsed = parse_module(text).attributes["x"]
    assert isinstance(parsed, LatencyAttr)
    made = LatencyAttr.make(one_s=1.0, split_s=-0.0, unit="vector", bound="hbm")
    hashed = hash(made)
    for attr in (parsed, made):
        plain = {f: _from_attr(p) for f, p in zip(attr.FIELDS, attr.parameters)}
        first = attr.as_dict()
        assert first == plain and [type(v) for v in first.values()] == [type(v) for v in plain.values()]
        first["unit"] = "tensor"
        assert attr.as_dict() == plain and attr.get("unit") == "vector" and attr.values() is attr.values()
        assert all(attr.get(f) == v for f, v in plain.items())
        with pytest.raises(ValueError):
            attr.get("nope")
    assert parsed == made and hash(made) == hashed and hash(parsed) == hashed
    assert print_module(parse_module(text)) == text


def test_a_record_prints_from_its_kept_values_as_from_its_parameters():
    """print_parameters prints the kept values (RecordAttr.values) as each field's declared
    kind prints: the very text the parameters print field by field (escaped strings, -0.0,
    inf and nan, enum words), for every record class."""
    import io
    import math

    from phaze_ir import attributes as A
    from phaze_ir.ir import _Printer

    def subclasses(c):
        for s in c.__subclasses__():
            yield s
            yield from subclasses(s)

    floats = (-0.0, math.inf, 1.0e-300, math.nan, 2.5)
    for cls in sorted(set(subclasses(A.RecordAttr)), key=lambda c: c.__name__):
        types = A._field_types(cls)
        values = {}
        for i, f in enumerate(cls.FIELDS):
            kind = types[f]
            if issubclass(kind, A.EnumAttribute):
                values[f] = A._enum_words(kind)[i % len(A._enum_words(kind))]
            elif kind is A.FloatData:
                values[f] = floats[i % len(floats)] if f not in cls.RANGES else float(cls.RANGES[f][0])
            elif kind is A.StringAttr:
                values[f] = 'a "quoted"\n\\ name \u00e9'
            else:
                values[f] = i if f not in cls.RANGES else int(cls.RANGES[f][0])
        attr = cls._build(values)
        out = io.StringIO()
        attr.print_parameters(_Printer(stream=out))
        assert out.getvalue() == parameters_text(attr), cls.__name__


def parameters_text(attr) -> str:
    """A record's text printed field by field from xDSL's parameters, the reference of the
    printer that prints the record's kept values."""
    import io

    from phaze_ir import attributes as A
    from phaze_ir.ir import _Printer

    text = "<"
    for i, (key, param) in enumerate(zip(attr.FIELDS, attr.parameters)):
        text += f"{', ' if i else ''}{key} = "
        if isinstance(param, A.EnumAttribute):
            text += str(param.data.value)
        elif isinstance(param, A.FloatData):
            text += A.format_float(param.data)
        elif isinstance(param, A.IntAttr):
            text += str(param.data)
        else:
            assert isinstance(param, A.StringAttr), param
            out = io.StringIO()
            _Printer(stream=out).print_string_literal(param.data)
            text += out.getvalue()
    return text + ">"
