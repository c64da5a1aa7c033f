"""Import a traced aten graph (:class:`TracedGraph`) into the ``phaze`` dialect.

One ``func.func`` holds the step (``@train_step`` for a training trace, ``@forward`` for a
forward-only one).  Its arguments are the parameters, buffers and inputs (``phaze.param``,
``phaze.buffer``, ``phaze.input`` argument attributes with their source names); its results are
the loss (``phaze.loss``) and, for training, one gradient per parameter (``phaze.grad``).
Every op carries ``phaze.module`` (source module path) and ``phaze.phase`` (``fwd``/``bwd``);
SSA names come from the fx node names.
"""

from __future__ import annotations

import functools
import math
import operator
import re
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    BFloat16Type,
    DenseArrayBase,
    DictionaryAttr,
    Float8E4M3FNType,
    Float8E5M2Type,
    Float16Type,
    Float32Type,
    Float64Type,
    FloatAttr,
    FunctionType,
    IntegerAttr,
    IntegerType,
    ModuleOp,
    Signedness,
    StringAttr,
    TensorType,
    UnitAttr,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, Region, SSAValue

from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.attributes import UnpricedOpAttr
from phaze_ir.errors import PhazeError, PhazeWarning
from phaze_ir.frontend import aten_map as amap
from phaze_ir.frontend.kernel_attention import WINDOW_ATTENTION
from phaze_ir.frontend.trace import TracedGraph
from phaze_ir.op_kinds import causal_fraction, causal_mask

_Op = TypeVar("_Op", bound=Operation)

# What MLIR allows in an SSA name (ASCII only: Python's \w would let `ü` through, which no MLIR
# parser reads back).
_NAME_OK = re.compile(r"[^A-Za-z0-9_$.-]")


@functools.cache
def _element_type(dtype) -> Attribute:
    import torch

    table = {
        torch.float16: Float16Type(),
        torch.bfloat16: BFloat16Type(),
        torch.float32: Float32Type(),
        torch.float64: Float64Type(),
        # FP8 training's casts (--dtype fp8: phaze_ir/frontend/float8_linear.py)
        torch.float8_e4m3fn: Float8E4M3FNType(),
        torch.float8_e5m2: Float8E5M2Type(),
        torch.int64: IntegerType(64),
        torch.int32: IntegerType(32),
        torch.int16: IntegerType(16),
        torch.int8: IntegerType(8),
        torch.uint8: IntegerType(8, Signedness.UNSIGNED),
        # the random seed and offset a CUDA flash or memory-efficient attention kernel returns
        torch.uint64: IntegerType(64, Signedness.UNSIGNED),
        torch.bool: IntegerType(1),
    }
    if dtype not in table:
        raise PhazeError(f"unsupported tensor dtype {dtype}")
    return table[dtype]


def _op(
    cls: type[_Op], operands: Sequence[SSAValue], result_types: Sequence[Attribute], properties: dict[str, Attribute]
) -> _Op:
    """``cls.build(...)`` of an op with at most one variadic operand list and one variadic
    result list (so the flat lists are its segments), without IRDL's check of each argument
    against the op's definition at construction: that check was half of the import (GPT-3
    175B: 15,000 ops).  What it checks, the module's verification checks after the pipeline,
    as it does every compilation's (``tests/test_frontend.py`` verifies what the import
    builds)."""
    return cls.create(operands=operands, result_types=result_types, properties=properties)


def _tensor_type(val) -> TensorType:
    return _tensor_type_of(val.dtype, tuple(int(s) for s in val.shape))


@functools.lru_cache(maxsize=1 << 16)
def _tensor_type_of(dtype, shape: tuple[int, ...]) -> TensorType:
    """One ``TensorType`` per (dtype, shape): building and verifying one per fx value was a
    third of an import (types are immutable, so sharing them changes nothing)."""
    return TensorType(_element_type(dtype), list(shape))


def _tensors_of(val) -> list[tuple[int, Any]]:
    """(index, tensor) for every tensor in an fx value (single tensor or tuple/list)."""
    import torch

    if isinstance(val, torch.Tensor):
        return [(0, val)]
    if isinstance(val, (tuple, list)):
        return [(i, v) for i, v in enumerate(val) if isinstance(v, torch.Tensor)]
    return []


def _name(text: str) -> str:
    text = _NAME_OK.sub("_", text)
    return text if text and not text[0].isdigit() else "v" + text


class UnknownOpError(PhazeError):
    """An aten op with no semantics under ``--strict``: a property of the model, not of one
    micro-batch size or TP width (a sweep stops at the first, instead of trying every point)."""


def check_capacity_factor(factor: float | None) -> float | None:
    """``factor`` as a float (None: no capacity factor, dropless experts), or a one-line
    :class:`PhazeError` when it is not a finite number of at least 1 (:func:`capacity_factor_problem`)."""
    if factor is None:
        return None
    problem = capacity_factor_problem(factor)
    if problem is not None:
        raise PhazeError(f"--capacity-factor {factor}: {problem}")
    return float(factor)


def capacity_factor_problem(factor: object) -> str | None:
    """What is wrong with a capacity factor, in words (None: nothing); phazec's
    ``--capacity-factor`` is checked by it too (``phaze.options.Options``).

    Below 1 an expert's capacity is less than the rows balanced routing gives it, so Megatron-LM
    drops routed tokens: a different model is trained (fewer token-expert products), and with
    every expert equally loaded phaze would price a fixed share of every expert's tokens away,
    where real routing drops only what overflows the busiest experts.  Refused rather than
    priced (docs/design.md §2)."""
    try:
        value = float(factor)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        value = math.nan
    if isinstance(factor, bool) or not math.isfinite(value) or value < 1:
        return (
            "expected a finite number >= 1 (below 1 the experts drop routed tokens, a different model that phaze "
            "does not price)"
        )
    return None


def expert_capacity(rows: int, experts: int, factor: float) -> int:
    """Rows each expert processes under capacity factor ``factor`` when ``rows`` routed rows
    (tokens x top-k) go to ``experts`` experts: Megatron-LM's ``get_capacity``
    (megatron/core/transformer/moe/moe_utils.py), ``ceil(rows / experts * factor)``, computed
    as it computes it so that both round alike."""
    return math.ceil((rows / experts) * factor)


#: What a builder gives: one op, or the ops one aten op expands into and the values standing
#: for its tensor outputs (in order).
_Built = Operation | tuple[list[Operation], list[SSAValue]]


@dataclass(frozen=True)
class _Call:
    """One traced aten call as the builders read it: computed once, whichever builder runs."""

    node: Any
    #: aten overload packet (``aten_map.packet_name``), the dispatch's key
    packet: str
    aten: StringAttr
    ins: list[SSAValue]
    rtypes: list[TensorType]


class _Importer:
    """One import: the SSA value of every fx value so far, and what its warnings say at the end
    (opaque ops, uneven expert splits), which builders of single ops cannot keep."""

    def __init__(self, traced: TracedGraph, strict: bool, capacity_factor: float | None = None):
        self.traced = traced
        self.strict = strict
        self.capacity_factor = check_capacity_factor(capacity_factor)
        #: (grouped operand [T, K], experts) -> its rows padded to the experts' capacity
        #: [E, C, K]: the forward's padded expert input is what the weight gradient reads (and so
        #: what autograd saves), as Megatron-LM's padded GEMM input is.
        self.padded: dict[tuple[SSAValue, int], SSAValue] = {}
        #: an expert GEMM padded to the experts' capacity -> (routed rows, rows it runs): the
        #: model FLOPs count the routed rows alone (:func:`model_flops`)
        self.routed: dict[Operation, tuple[int, int]] = {}
        #: expert GEMMs (aten._grouped_mm) expanded
        self.grouped = 0
        self.values: dict[Any, list[tuple[int, SSAValue]] | SSAValue] = {}
        self.unknown: Counter[str] = Counter()
        self.unknown_where: dict[str, str] = {}
        self.unknown_flops: dict[str, int | None] = {}  # None: torch has no FLOP formula for it
        self.unknown_bytes: Counter[str] = Counter()
        #: expert counts of grouped GEMMs whose rows do not divide evenly -> first module
        self.uneven: dict[int, str] = {}

    # -- provenance --------------------------------------------------------------------------
    def provenance(self, node) -> tuple[str, str]:
        return provenance(self.traced, node)

    # -- operands ----------------------------------------------------------------------------
    def value_of(self, arg) -> SSAValue | None:
        v = self.values.get(arg)
        if isinstance(v, SSAValue):
            return v
        return None

    def tensor_operands(self, node) -> list[SSAValue]:
        import torch.fx as fx

        out: list[SSAValue] = []

        def visit(a):
            if isinstance(a, fx.Node):
                v = self.value_of(a)
                if v is not None:
                    out.append(v)
            elif isinstance(a, (list, tuple)):
                for x in a:
                    visit(x)

        for a in node.args:
            visit(a)
        for a in node.kwargs.values():
            visit(a)
        return out

    # -- ops ---------------------------------------------------------------------------------
    def build(self, node) -> _Built:
        """The op for ``node``, or, when one aten op expands into several phaze ops, those ops
        and the values standing for the node's tensor outputs (in order).  Which builder makes
        it is a table (``aten_map.DISPATCH``), so that giving an aten op semantics is a line
        there, not a branch here."""
        call = _Call(
            node=node,
            packet=amap.packet_name(node.target),
            aten=StringAttr(amap.aten_name(node.target)),
            rtypes=[_tensor_type(t) for _, t in _tensors_of(node.meta.get("val"))],
            ins=self.tensor_operands(node),
        )
        builder = amap.BUILDER_OF.get(call.packet)
        built = BUILDERS[builder](self, call) if builder is not None else None
        return built if built is not None else self.opaque(call)

    def grouped_mm(self, call: _Call) -> _Built | None:
        """An expert GEMM (:func:`_grouped_mm`) under this import's capacity factor, counted,
        and its uneven split of the tokens noted (warned once per expert count by :meth:`run`)."""
        ins, rtypes = call.ins, call.rtypes
        grouped = _grouped_mm(call.node, ins, rtypes, call.aten.data, self.capacity_factor, self.padded)
        if grouped is not None:
            self.grouped += 1
            experts, rows = _grouped_split(ins, rtypes)
            cap = _capacity(rows, experts, self.capacity_factor)
            if cap is not None:
                for op in grouped[0]:
                    if isinstance(op, ph.MatmulOp):
                        self.routed[op] = (rows, experts * cap)
            if rows % experts and self.capacity_factor is None:  # padded, the experts stay one GEMM
                self.uneven.setdefault(experts, self.provenance(call.node)[0] or "<root>")
        return grouped

    def opaque(self, call: _Call) -> Operation:
        """``phaze.opaque`` for an op with no semantics known: kept, counted for the warning
        that says how much work it leaves unpriced, or refused under ``--strict``."""
        node, aten = call.node, call.aten
        module, _ = self.provenance(node)
        if self.strict:
            raise UnknownOpError(
                f"unknown aten op {aten.data} (from module '{module or '<root>'}'); "
                "add it to phaze_ir/frontend/aten_map.py or drop --strict"
            )
        self.unknown[aten.data] += 1
        self.unknown_where.setdefault(aten.data, module or "<root>")
        flops = _torch_flops(node)
        before = self.unknown_flops.get(aten.data, 0)
        self.unknown_flops[aten.data] = None if flops is None or before is None else before + flops
        self.unknown_bytes[aten.data] += _node_bytes(node)
        return _op(ph.OpaqueOp, operands=call.ins, result_types=call.rtypes, properties={"aten": aten})

    # -- driver ------------------------------------------------------------------------------
    def run(self) -> ModuleOp:
        traced = self.traced
        graph = traced.graph_module.graph
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(traced.placeholders):
            raise AssertionError("placeholder bookkeeping out of sync with the traced graph")
        arg_types = [_tensor_type(n.meta["val"]) for n in placeholders]
        block = Block(arg_types=arg_types)
        arg_attrs = []
        for n, (role, name), arg in zip(placeholders, traced.placeholders, block.args):
            arg.name_hint = _name(name)
            self.values[n] = arg
            arg_attrs.append(DictionaryAttr({keys.ARG_ROLES[role]: StringAttr(name)}))

        for node in graph.nodes:
            if node.op == "call_function":
                if node.target is operator.getitem:
                    src, idx = node.args
                    produced = self.values.get(src)
                    if isinstance(produced, list):
                        match = [v for i, v in produced if i == idx]
                        if match:
                            self.values[node] = match[0]
                            match[0].name_hint = _name(node.name)
                    continue
                built = self.build(node)
                ops, res = built if isinstance(built, tuple) else ([built], list(built.results))
                module, phase = self.provenance(node)
                fused = _fused_name(node) if len(ops) > 1 else None
                for op in ops:
                    op.attributes[keys.MODULE] = StringAttr(module)
                    op.attributes[keys.PHASE] = StringAttr(phase)
                    if fused is not None:
                        op.attributes[keys.FUSED] = fused
                    block.add_op(op)
                val = node.meta.get("val")
                tensors = _tensors_of(val)
                if isinstance(val, (tuple, list)):
                    self.values[node] = [(i, r) for (i, _), r in zip(tensors, res)]
                elif res:
                    res[0].name_hint = _name(node.name)
                    self.values[node] = res[0]
            elif node.op == "get_attr":
                val = node.meta.get("val")
                if val is None:
                    val = getattr(traced.graph_module, node.target)
                op = ph.ElementwiseOp.build(
                    operands=[[]],
                    result_types=[_tensor_type(val)],
                    properties={"kind": StringAttr("fill"), "aten": StringAttr("constant")},
                )
                op.attributes[keys.MODULE] = StringAttr("")
                op.attributes[keys.PHASE] = StringAttr("fwd")
                op.results[0].name_hint = _name(node.name)
                block.add_op(op)
                self.values[node] = op.results[0]
            elif node.op == "output":
                outs = node.args[0]
                outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
                ret_vals, res_attrs = [], []
                names = ["<loss>"] + traced.grad_names
                for i, o in enumerate(outs):
                    v = self.value_of(o)
                    if v is None:
                        continue
                    ret_vals.append(v)
                    if i == 0:
                        res_attrs.append(DictionaryAttr({keys.LOSS: UnitAttr()}))
                    else:
                        res_attrs.append(DictionaryAttr({keys.GRAD: StringAttr(names[i])}))
                block.add_op(func.ReturnOp(*ret_vals))
                fn_type = FunctionType.from_lists(arg_types, [v.type for v in ret_vals])
                fname = "train_step" if traced.training else "forward"
                fn = func.FuncOp(
                    fname, fn_type, Region(block), arg_attrs=ArrayAttr(arg_attrs), res_attrs=ArrayAttr(res_attrs)
                )
        attrs: dict[str, Attribute] = {
            keys.MODEL: StringAttr(traced.model_name),
            keys.MICRO_BATCH_SIZE: IntegerAttr(traced.micro_batch_size, i64),
        }
        if traced.seq_len is not None:
            attrs[keys.SEQ_LEN] = IntegerAttr(traced.seq_len, i64)
        if traced.shape:
            attrs[keys.MODEL_SHAPE] = _shape_attr(traced.shape)
        parameters = sum(
            math.prod(t.get_shape()) for t, (role, _) in zip(arg_types, traced.placeholders) if role == "param"
        )
        if parameters:
            attrs[keys.PARAMETERS] = IntegerAttr(parameters, i64)
        flops = model_flops(fn, self.routed) if traced.training else 0
        if 0 < flops < 2**63:  # beyond i64 (10^19 FLOPs a micro-batch) the summary shows no MFU
            attrs[keys.MODEL_FLOPS] = IntegerAttr(flops, i64)
            attention, causal, window_skipped = attention_flops(fn)
            if 0 < attention < 2**63:
                attrs[keys.ATTENTION_FLOPS] = IntegerAttr(attention, i64)
            if 0 < causal < 2**63:
                attrs[keys.CAUSAL_ATTENTION_FLOPS] = IntegerAttr(causal, i64)
            if 0 < window_skipped < 2**63:
                attrs[keys.WINDOW_SKIPPED_FLOPS] = IntegerAttr(window_skipped, i64)
        if self.unknown:
            attrs[keys.WARNINGS] = ArrayAttr(self.unpriced(graph))
        if self.capacity_factor is not None:
            if self.grouped:
                attrs[keys.CAPACITY_FACTOR] = FloatAttr(self.capacity_factor, Float64Type())
            else:
                # Not recorded: nothing was padded, and a plan (or an export) must not claim a
                # capacity factor that a dense model does not have.
                warnings.warn(
                    f"--capacity-factor {self.capacity_factor:g}: the model has no expert GEMMs "
                    "(aten._grouped_mm); the capacity factor changes nothing and is not recorded",
                    PhazeWarning,
                    stacklevel=3,
                )
        for experts, module in sorted(self.uneven.items()):
            # No figure that scales with the micro-batch: said once however many are traced.
            warnings.warn(
                f"aten._grouped_mm (first in module '{module}'): the routed tokens do not divide evenly over "
                f"the {experts} experts, so each grouped GEMM is priced as two batched GEMMs (experts with "
                "one row more, the rest), whose sliced expert weights tensor parallelism keeps replicated: "
                "with --tp > 1 those GEMMs are not split",
                PhazeWarning,
                stacklevel=3,
            )
        return ModuleOp([fn], attributes=attrs)

    def unpriced(self, graph) -> list[UnpricedOpAttr]:
        """The opaque ops as ``phaze.warnings`` records, each also said once as a warning: the
        plan prices them by their bytes only, so it must say how much work that leaves out."""
        step_flops = sum(_torch_flops(n) or 0 for n in graph.nodes if n.op == "call_function")
        records = []
        for aten, count in sorted(self.unknown.items()):
            flops = self.unknown_flops[aten]
            share = flops / step_flops if flops is not None and step_flops > 0 else -1.0
            # Said once however many micro-batch sizes are traced: no figure that scales with it here.
            if flops is None:
                work = "torch knows no FLOP formula for it"
            else:
                work = f"{share:.0%} of the step's FLOPs unpriced" if share >= 0 else "its FLOPs unpriced"
            warnings.warn(
                f"unknown aten op {aten} ({count}x, first in module '{self.unknown_where[aten]}') imported as "
                f"phaze.opaque and priced by the bytes it moves only ({work}); the plan understates its time "
                "(--strict refuses such a model)",
                PhazeWarning,
                stacklevel=3,
            )
            records.append(
                UnpricedOpAttr.make(
                    aten=aten,
                    count=count,
                    module=self.unknown_where[aten],
                    flops=-1 if flops is None else flops,
                    bytes=self.unknown_bytes[aten],
                    flops_share=share,
                )
            )
        return records


# -- builders: the phaze op of one aten call, by aten_map.DISPATCH's tables ----------------------
# Each takes the importer (for what an import keeps across ops) and the call; None declines (the
# op is then opaque).


def _build_matmul(imp: _Importer, c: _Call) -> _Built:
    if c.packet in ("addmm", "baddbmm"):
        return ph.MatmulOp(c.ins[1], c.ins[2], c.rtypes[0], bias=c.ins[0])
    op = ph.MatmulOp(c.ins[0], c.ins[1], c.rtypes[0])
    if c.packet == "_scaled_mm" and _rowwise_scales(c.node):
        # how the GEMM runs depends on it (passes/cost_view.py: PyTorch's CUTLASS rowwise kernel
        # forward, torchao's cuBLAS GEMM and scaling pass backward), and the scales are not operands
        op.attributes[keys.FP8_SCALES] = StringAttr("rowwise")
    return op


def _rowwise_scales(node: Any) -> bool:
    """Whether an ``aten._scaled_mm`` call scales its operands one scale a row: a ``[M, 1]``
    scale of its ``[M, K]`` first operand and a ``[1, N]`` one of its ``[K, N]`` second, the
    shapes torch's ``_scaled_mm`` takes as rowwise scaling (``Blas.cpp``)."""
    vals: list[Any] = [getattr(v, "meta", {}).get("val") for v in node.args[:4]]
    if len(vals) < 4 or any(t is None for t in vals):
        return False
    a, b, scale_a, scale_b = vals
    return tuple(scale_a.shape) == (a.shape[0], 1) and tuple(scale_b.shape) == (1, b.shape[1])


def _build_softmax(imp: _Importer, c: _Call) -> _Built:
    dim = c.node.args[2] if c.packet.endswith("_backward_data") else c.node.args[1]
    return _op(
        ph.SoftmaxOp,
        operands=c.ins,
        result_types=c.rtypes[:1],
        properties={"kind": StringAttr(amap.SOFTMAX[c.packet]), "dim": IntegerAttr(int(dim), i64)},
    )


def _build_norm(imp: _Importer, c: _Call) -> _Built:
    args = c.node.args
    shape_arg = args[2] if c.packet.endswith("_backward") else (args[1] if len(args) > 1 else [])
    rank = len(shape_arg) if isinstance(shape_arg, (list, tuple)) else 1
    return _op(
        ph.NormOp,
        operands=c.ins,
        result_types=c.rtypes,
        properties={"kind": StringAttr(amap.NORM[c.packet]), "normalized_rank": IntegerAttr(rank, i64)},
    )


def _build_embedding(imp: _Importer, c: _Call) -> _Built:
    return _op(
        ph.EmbeddingOp,
        operands=c.ins[:2],
        result_types=c.rtypes[:1],
        properties={"kind": StringAttr(amap.EMBEDDING[c.packet])},
    )


def _build_reduction(imp: _Importer, c: _Call) -> _Built:
    """A reduction over the dims its second argument names (the loss's ``nll_loss_forward``
    reads all its operands and reduces over none it names)."""
    args, packet = c.node.args, c.packet
    dims: list[int] = []
    if len(args) > 1 and packet != "nll_loss_forward":
        d = args[1]
        if isinstance(d, int) and not isinstance(d, bool):
            dims = [d]
        elif isinstance(d, (list, tuple)) and all(isinstance(x, int) for x in d):
            dims = list(d)
    return _op(
        ph.ReductionOp,
        operands=c.ins[:1] if packet != "nll_loss_forward" else c.ins,
        result_types=c.rtypes,
        properties={
            "kind": StringAttr(amap.REDUCTION[packet]),
            "aten": c.aten,
            "dims": DenseArrayBase.from_list(i64, dims),
        },
    )


def _build_dropout(imp: _Importer, c: _Call) -> _Built:
    """``native_dropout(x) -> (y, mask)``: a random mask, then the masked scaling (two ops, so
    that the mask is a value the backward can be seen to read)."""
    mask = _op(
        ph.ElementwiseOp,
        operands=c.ins[:1],
        result_types=[c.rtypes[1]],
        properties={"kind": StringAttr("random"), "aten": c.aten},
    )
    out = _op(
        ph.ElementwiseOp,
        operands=[c.ins[0], mask.results[0]],
        result_types=[c.rtypes[0]],
        properties={"kind": StringAttr("dropout"), "aten": c.aten},
    )
    return [mask, out], [out.results[0], mask.results[0]]


def _build_attention(imp: _Importer, c: _Call) -> _Built:
    backward = c.packet.endswith("_backward")
    if c.packet.startswith(WINDOW_ATTENTION):  # (q, k, v, sinks?) / (dout, q, k, v, sinks?, out, lse)
        has_sinks = len(c.ins) == (7 if backward else 4)
        sinks = c.ins[4 if backward else 3] if has_sinks else None
        ins = [x for x in c.ins if x is not sinks]
        return _attention(ins, c.rtypes, backward, sinks)
    # cuDNN's backward reads out and logsumexp before its other tensors; the others last
    return _attention(c.ins[:6] if backward and "cudnn" in c.packet else c.ins, c.rtypes, backward)


def _build_convolution(imp: _Importer, c: _Call) -> _Built:
    return _convolution(c.node, c.ins, c.rtypes, c.aten.data)


def _build_convolution_backward(imp: _Importer, c: _Call) -> _Built:
    return _convolution_backward(c.node, c.ins, c.rtypes, c.aten.data)


def _build_selection(imp: _Importer, c: _Call) -> _Built:
    return _op(
        ph.ReductionOp,
        operands=c.ins[:1],
        result_types=c.rtypes,
        properties={
            "kind": StringAttr(amap.SELECTION[c.packet]),
            "aten": c.aten,
            "dims": DenseArrayBase.from_list(i64, _selection_dims(c.packet, c.node)),
        },
    )


def _build_elementwise(imp: _Importer, c: _Call) -> _Built | None:
    """Declines an op of several results: ``phaze.elementwise`` has one."""
    if len(c.rtypes) != 1:
        return None
    return _op(
        ph.ElementwiseOp,
        operands=c.ins,
        result_types=c.rtypes,
        properties={"kind": StringAttr(amap.ELEMENTWISE[c.packet]), "aten": c.aten},
    )


def _build_layout(imp: _Importer, c: _Call) -> _Built:
    return _op(
        ph.LayoutOp,
        operands=c.ins,
        result_types=c.rtypes,
        properties={"kind": StringAttr(amap.LAYOUT[c.packet]), "aten": c.aten},
    )


#: ``aten_map.DISPATCH``'s builder names -> the builders (read-only).
BUILDERS: Mapping[str, Callable[[_Importer, _Call], _Built | None]] = MappingProxyType(
    {
        "matmul": _build_matmul,
        "softmax": _build_softmax,
        "norm": _build_norm,
        "embedding": _build_embedding,
        "reduction": _build_reduction,
        "dropout": _build_dropout,
        "attention": _build_attention,
        "grouped_mm": _Importer.grouped_mm,
        "convolution": _build_convolution,
        "convolution_backward": _build_convolution_backward,
        "selection": _build_selection,
        "elementwise": _build_elementwise,
        "layout": _build_layout,
    }
)
if set(BUILDERS) != {name for name, _ in amap.DISPATCH}:  # a table of aten_map.py without its builder
    raise AssertionError(f"builders {sorted(BUILDERS)} do not match aten_map.DISPATCH")


def provenance(traced: TracedGraph, node) -> tuple[str, str]:
    """``(module path, "fwd" | "bwd")`` of a traced node: a forward node's innermost module, a
    backward node's through its autograd sequence number (``trace.py``)."""
    phase = "bwd" if node.meta.get("custom", {}).get("phaze_phase") == "bwd" else "fwd"
    if phase == "fwd":
        stack = node.meta.get("nn_module_stack")
        module = list(stack)[-1] if stack else ""
    else:
        module = traced.seq_module.get(node.meta.get("seq_nr"), "")
    return module, phase


def _torch_flops(node) -> int | None:
    """FLOPs of an aten call by torch's own formulas (``torch.utils.flop_counter``), from the
    traced shapes; None when torch has no formula for the op (it then counts it as 0)."""
    from torch.fx.node import Node, map_aggregate
    from torch.utils.flop_counter import flop_registry

    formula = flop_registry.get(getattr(node.target, "overloadpacket", None))
    if formula is None:
        return None

    def val(a):
        return a.meta.get("val") if isinstance(a, Node) else a

    try:
        return int(formula(*map_aggregate(node.args, val), **map_aggregate(node.kwargs, val), out_val=node.meta["val"]))
    except Exception:  # a formula that cannot read these arguments: no count rather than a wrong one
        return None


def _node_bytes(node) -> int:
    """Bytes of an aten call's tensor operands and results."""
    values = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    return sum(t.numel() * t.element_size() for v in values for _, t in _tensors_of(v))


def _attention(ins: list[SSAValue], rtypes: list[TensorType], backward: bool, sinks: SSAValue | None = None):
    """Expand a fused attention kernel into its matmul/softmax semantics.

    Forward ``(q, k, v) -> (out, logsumexp)``: ``S = q kᵀ``, ``P = softmax(S)``, ``out = P v``.
    Backward ``(dout, q, k, v, out, lse) -> (dq, dk, dv)``: flash attention keeps no ``S``/``P``
    and recomputes them, then ``dv = Pᵀ dout``, ``dP = dout vᵀ``, ``dS = softmax_grad(dP, P)``,
    ``dq = dS k``, ``dk = dSᵀ q``: the FLOPs and the (small) saved tensors the kernel really has.
    Grouped-query attention repeats k and v over the query heads and sums their gradients back.
    Attention ``sinks`` (one logit per head, GPT-OSS's) are one more column of the softmax, read
    by the forward's; their gradient ``dsink_h = -Σ exp(sink_h - lse) · D`` over the batch and
    the rows is a reduction of the backward's ``D`` and ``lse`` (FlashAttention-3's ``s_aux``).
    """
    ops: list[Operation] = []

    def add(op: Operation) -> SSAValue:
        ops.append(op)
        return op.results[0]

    def layout(kind: str, x: SSAValue, shape: list[int]) -> SSAValue:
        return add(
            ph.LayoutOp.build(
                operands=[[x]],
                result_types=[[TensorType(ph.tensor_type(x).element_type, shape)]],
                properties={"kind": StringAttr(kind), "aten": StringAttr("attention")},
            )
        )

    def transpose(x: SSAValue) -> SSAValue:
        shape = list(ph.tensor_type(x).get_shape())
        return layout("transpose", x, shape[:-2] + [shape[-1], shape[-2]])

    def matmul(a: SSAValue, b: SSAValue) -> SSAValue:
        a_type = ph.tensor_type(a)
        shape = list(a_type.get_shape())[:-1] + [ph.tensor_type(b).get_shape()[-1]]
        return add(ph.MatmulOp(a, b, TensorType(a_type.element_type, shape)))

    def softmax(kind: str, *xs: SSAValue) -> SSAValue:
        return add(
            ph.SoftmaxOp.build(
                operands=[list(xs)],
                result_types=[xs[0].type],
                properties={"kind": StringAttr(kind), "dim": IntegerAttr(-1, i64)},
            )
        )

    grad_out, (q, k, v) = (ins[0], ins[1:4]) if backward else (None, ins[:3])
    q_shape = list(ph.tensor_type(q).get_shape())
    heads, kv_heads = q_shape[-3], ph.tensor_type(k).get_shape()[-3]
    if kv_heads != heads:  # grouped-query attention
        k = layout("repeat", k, q_shape[:-1] + [ph.tensor_type(k).get_shape()[-1]])
        v = layout("repeat", v, q_shape[:-1] + [ph.tensor_type(v).get_shape()[-1]])
    if not backward:
        scores = matmul(q, transpose(k))
        p = softmax("softmax", scores, *([sinks] if sinks is not None else []))
        out = matmul(p, v)
        lse = add(
            ph.ReductionOp.build(
                operands=[[scores]],
                result_types=[[rtypes[1]]],
                properties={
                    "kind": StringAttr("sum"),
                    "aten": StringAttr("attention"),
                    "dims": DenseArrayBase.from_list(i64, [-1]),
                },
            )
        )
        return ops, [out, lse][: len(rtypes)]
    # The kernel reads the saved output and log-sum-exp: P is rebuilt from S and lse, and
    # D = rowsum(dout * out) enters the softmax gradient.
    assert grad_out is not None  # set when backward
    out, lse = ins[-2], ins[-1]  # after the additive mask, when the memory-efficient kernel has one
    p = softmax("softmax", matmul(q, transpose(k)), lse)
    prod = add(
        ph.ElementwiseOp.build(
            operands=[[grad_out, out]],
            result_types=[out.type],
            properties={"kind": StringAttr("mul"), "aten": StringAttr("attention")},
        )
    )
    d = add(
        ph.ReductionOp.build(
            operands=[[prod]],
            result_types=[[lse.type]],
            properties={
                "kind": StringAttr("sum"),
                "aten": StringAttr("attention"),
                "dims": DenseArrayBase.from_list(i64, [-1]),
            },
        )
    )
    dv = matmul(transpose(p), grad_out)
    ds = softmax("softmax_grad", matmul(grad_out, transpose(v)), p, d)
    dq = matmul(ds, k)
    dk = matmul(transpose(ds), q)
    grads = [dq, dk, dv]
    if sinks is not None and len(rtypes) > 3:
        scaled = add(
            ph.ElementwiseOp.build(
                operands=[[d, lse]],
                result_types=[lse.type],
                properties={"kind": StringAttr("mul"), "aten": StringAttr("attention")},
            )
        )
        grads.append(
            add(
                ph.ReductionOp.build(
                    operands=[[scaled]],
                    result_types=[[rtypes[3]]],
                    properties={
                        "kind": StringAttr("sum"),
                        "aten": StringAttr("attention"),
                        "dims": DenseArrayBase.from_list(i64, [0, 2]),
                    },
                )
            )
        )
    for i in (1, 2):
        if grads[i].type != rtypes[i]:  # sum the repeated heads' gradients back to the kv heads
            grads[i] = add(
                ph.ReductionOp.build(
                    operands=[[grads[i]]],
                    result_types=[[rtypes[i]]],
                    properties={
                        "kind": StringAttr("sum"),
                        "aten": StringAttr("attention"),
                        "dims": DenseArrayBase.from_list(i64, [1]),
                    },
                )
            )
    return ops, grads


#: Where a fused attention op has ``is_causal`` among its positional arguments (aten's schemas).
_CAUSAL_ARG = {
    "_scaled_dot_product_flash_attention": 4,
    "_scaled_dot_product_flash_attention_backward": 11,
    "_scaled_dot_product_flash_attention_for_cpu": 4,
    "_scaled_dot_product_flash_attention_for_cpu_backward": 7,
    "_scaled_dot_product_efficient_attention": 6,
    "_scaled_dot_product_efficient_attention_backward": 11,
    "_scaled_dot_product_cudnn_attention": 6,
    "_scaled_dot_product_cudnn_attention_backward": 14,
}
#: Where phaze's window attention (``kernel_attention``) has its sinks, window and dropout_p.
_WINDOW_ARGS = {WINDOW_ATTENTION: (3, 4, 6), f"{WINDOW_ATTENTION}_backward": (4, 7, 9)}


#: Where a fused attention op has ``dropout_p`` among its positional arguments (aten's schemas).
_DROPOUT_ARG = {
    "_scaled_dot_product_flash_attention": 3,
    "_scaled_dot_product_flash_attention_backward": 10,
    "_scaled_dot_product_efficient_attention": 5,
    "_scaled_dot_product_efficient_attention_backward": 9,
    "_scaled_dot_product_cudnn_attention": 5,
    "_scaled_dot_product_cudnn_attention_backward": 12,
}


def _fused_name(node) -> StringAttr | None:
    """``phaze.fused`` of the ops an aten op expands into when aten runs it as one kernel (fused
    attention, dropout): the traced node's name, `` dropout P`` added for an attention with
    dropout (which kernel runs it depends on P: ``kernels.attention_backend``), then `` causal``
    for a causal attention."""
    packet = amap.packet_name(node.target)
    if packet not in amap.FUSED_ATTENTION and packet not in amap.DROPOUT:
        return None
    if packet in _WINDOW_ARGS:  # always causal; its window (0: none) and sinks said before it
        at_sinks, at_window, at_dropout = _WINDOW_ARGS[packet]
        window, dropout = node.args[at_window], node.args[at_dropout]
        drop = f" dropout {dropout:g}" if isinstance(dropout, float) and dropout > 0 else ""
        said = (f" window {window}" if window else "") + (" sinks" if node.args[at_sinks] is not None else "")
        return StringAttr(node.name + drop + said + " causal")
    at = _CAUSAL_ARG.get(packet)
    causal = node.kwargs.get("is_causal", False)
    if at is not None and len(node.args) > at:
        causal = node.args[at]
    at = _DROPOUT_ARG.get(packet)
    dropout = node.kwargs.get("dropout_p", 0.0)
    if at is not None and len(node.args) > at:
        dropout = node.args[at]
    drop = f" dropout {dropout:g}" if isinstance(dropout, float) and dropout > 0 else ""
    return StringAttr(node.name + drop + (" causal" if causal is True else ""))


def _selection_dims(packet: str, node) -> list[int]:
    """The dim a ``topk``/``sort`` selects along (``histc``: every element)."""
    if packet == "histc":
        return []
    args = node.args
    at = 2 if packet == "topk" else 1  # topk(x, k, dim=-1, ...), sort(x, dim=-1, ...)
    dim = args[at] if len(args) > at else node.kwargs.get("dim", -1)
    return [dim if isinstance(dim, int) and not isinstance(dim, bool) else -1]


class _Expansion:
    """Builds the phaze ops one aten op expands into (views, matmuls, copies), each keeping the
    aten name of the op it comes from."""

    def __init__(self, aten: str):
        self.ops: list[Operation] = []
        self.aten = StringAttr(aten)

    def add(self, op: Operation) -> SSAValue:
        self.ops.append(op)
        return op.results[0]

    @staticmethod
    def shape(x: SSAValue) -> list[int]:
        return list(ph.tensor_type(x).get_shape())

    def layout(self, kind: str, xs: list[SSAValue], shape: list[int]) -> SSAValue:
        elem = ph.tensor_type(xs[0]).element_type
        return self.add(
            ph.LayoutOp.build(
                operands=[xs],
                result_types=[[TensorType(elem, shape)]],
                properties={"kind": StringAttr(kind), "aten": self.aten},
            )
        )

    def view(self, x: SSAValue, shape: list[int]) -> SSAValue:
        return x if self.shape(x) == list(shape) else self.layout("view", [x], list(shape))

    def permute(self, x: SSAValue, perm: tuple[int, ...]) -> SSAValue:
        if perm == tuple(range(len(perm))):
            return x
        shape = self.shape(x)
        return self.layout("permute", [x], [shape[p] for p in perm])

    def transpose(self, x: SSAValue) -> SSAValue:
        shape = self.shape(x)
        return self.layout("transpose", [x], shape[:-2] + [shape[-1], shape[-2]])

    def slice(self, x: SSAValue, dim: int, start: int, stop: int) -> SSAValue:
        shape = self.shape(x)
        if (start, stop) == (0, shape[dim]):
            return x
        shape[dim] = stop - start
        return self.layout("slice", [x], shape)

    def cat(self, xs: list[SSAValue], dim: int) -> SSAValue:
        if len(xs) == 1:
            return xs[0]
        shape = self.shape(xs[0])
        shape[dim] = sum(self.shape(x)[dim] for x in xs)
        return self.layout("cat", xs, shape)

    def pad(self, x: SSAValue, dim: int, size: int) -> SSAValue:
        """``x`` padded with zeros along ``dim`` to ``size`` (a copy, as Megatron-LM writes its
        padded expert input)."""
        shape = self.shape(x)
        if shape[dim] == size:
            return x
        shape[dim] = size
        return self.layout("pad", [x], shape)

    def zeros(self, shape: list[int], elem: Attribute) -> SSAValue:
        return self.add(
            ph.ElementwiseOp.build(
                operands=[[]],
                result_types=[TensorType(elem, shape)],
                properties={"kind": StringAttr("fill"), "aten": self.aten},
            )
        )

    def matmul(self, a: SSAValue, b: SSAValue, elem: Attribute, bias: SSAValue | None = None) -> SSAValue:
        sa, sb = self.shape(a), self.shape(b)
        batch = sa[:-2] if len(sa) >= len(sb) else sb[:-2]
        return self.add(ph.MatmulOp(a, b, TensorType(elem, [*batch, sa[-2], sb[-1]]), bias=bias))


def _even_groups(total: int, groups: int) -> list[tuple[int, int, int, int]]:
    """``total`` rows spread as evenly as possible over ``groups`` experts: the first
    ``total % groups`` take one row more.  Each part is ``(first expert, experts, first row,
    rows per expert)``; a part with no expert is left out."""
    q, r = divmod(total, groups)
    parts = [(0, r, 0, q + 1), (r, groups - r, r * (q + 1), q)]
    return [p for p in parts if p[1] > 0]


def _grouped_split(ins: list[SSAValue], rtypes: list[TensorType]) -> tuple[int, int]:
    """``(experts, rows split over them)`` of an expanded ``_grouped_mm`` (rows: the grouped dim)."""
    sa, sb = ph.tensor_type(ins[0]).get_shape(), ph.tensor_type(ins[1]).get_shape()
    if len(sa) == 2 and len(sb) == 3:
        return sb[0], sa[0]
    if len(sa) == 2 and len(sb) == 2:
        return rtypes[0].get_shape()[0], sa[1]
    if len(sa) == 3 and len(sb) == 2:
        return sa[0], sb[1]
    return 1, 0


def _capacity(rows: int, experts: int, factor: float | None) -> int | None:
    """Rows per expert when the experts are padded to capacity under ``factor``; None when they
    are not (no factor, or a capacity that is exactly the even split: the dropless IR)."""
    if factor is None:
        return None
    cap = expert_capacity(rows, experts, factor)
    return None if rows % experts == 0 and cap == rows // experts else cap


def _padded_rows(e: _Expansion, x: SSAValue, experts: int, cap: int) -> SSAValue:
    """``x [T, K]``, its rows spread evenly over the experts (:func:`_even_groups`), as
    ``[E, C, K]``: each expert's rows padded with zeros to its capacity ``C``."""
    total, k = e.shape(x)
    elem = ph.tensor_type(x).element_type
    pieces = []
    for _e0, ne, s0, rows in _even_groups(total, experts):
        if rows == 0:  # fewer routed rows than experts: these experts get padding only
            pieces.append(e.zeros([ne, cap, k], elem))
            continue
        part = e.view(e.slice(x, 0, s0, s0 + ne * rows), [ne, rows, k])
        pieces.append(e.pad(part, 1, cap))
    return e.cat(pieces, 0)


def _real_rows(e: _Expansion, y: SSAValue, total: int) -> SSAValue:
    """The ``total`` real rows ``[T, N]`` of a padded expert GEMM's result ``y [E, C, N]`` (the
    inverse of :func:`_padded_rows`: the padding's rows dropped)."""
    experts, _cap, n = e.shape(y)
    pieces = []
    for e0, ne, _s0, rows in _even_groups(total, experts):
        if rows:
            pieces.append(e.view(e.slice(e.slice(y, 0, e0, e0 + ne), 1, 0, rows), [ne * rows, n]))
    return e.cat(pieces, 0)


def _padded_cols(e: _Expansion, x: SSAValue, experts: int, cap: int) -> SSAValue:
    """``x [M, T]``, its columns spread evenly over the experts, as ``[E, M, C]`` (each expert's
    columns padded with zeros to its capacity)."""
    m, total = e.shape(x)
    elem = ph.tensor_type(x).element_type
    pieces = []
    for _e0, ne, s0, cols in _even_groups(total, experts):
        if cols == 0:
            pieces.append(e.zeros([ne, m, cap], elem))
            continue
        part = e.permute(e.view(e.slice(x, 1, s0, s0 + ne * cols), [m, ne, cols]), (1, 0, 2))
        pieces.append(e.pad(part, 2, cap))
    return e.cat(pieces, 0)


def _grouped_mm(
    node,
    ins: list[SSAValue],
    rtypes: list[TensorType],
    aten: str,
    capacity_factor: float | None = None,
    padded: dict[tuple[SSAValue, int], SSAValue] | None = None,
):
    """``aten._grouped_mm(A, B, offs)``, a GEMM per expert over a ragged split of the tokens, as
    batched ``phaze.matmul`` with per-expert weights.

    The split (``offs``) is data: on fake tensors it is unknown, so the routed rows are priced as
    spread evenly over the experts (``⌊T/E⌋`` or ``⌈T/E⌉`` each, :func:`_even_groups`): one
    batched matmul over the experts with equal rows, two when ``E`` does not divide ``T`` (their
    results concatenated).  FLOPs are exactly ``2·T·K·N`` in total whatever the split.  Forms:

    - ``A [T, K] × B [E, K, N] -> [T, N]`` (forward, input gradient): rows of A grouped;
    - ``A [M, T] × B [T, N] -> [E, M, N]`` (weight gradient): the contracted dim grouped;
    - ``A [E, M, K] × B [K, N] -> [M, N]``: columns of B grouped;
    - ``A [E, M, K] × B [E, K, N] -> [E, M, N]``: a plain batched matmul.

    With a ``capacity_factor`` F (Megatron-LM's ``--moe-expert-capacity-factor F
    --moe-pad-expert-input-to-capacity``) every expert processes exactly its capacity
    ``C = ⌈T/E·F⌉`` rows: the grouped operand is padded with zeros to ``[E, C, ·]`` (a ``pad``
    copy per expert part), one batched matmul runs over all E experts (``2·E·C·K·N`` FLOPs), and
    a grouped result takes its T real rows back.  A grouped operand padded once is reused
    (``padded``): the weight gradient reads the forward's padded input, which autograd so saves.
    F that gives ``C = T/E`` exactly leaves the dropless IR unchanged.

    ``phaze::fp8_grouped_mm(A, B, A's scale, B's scale, offs)`` (Transformer Engine's grouped
    GEMM on FP8 operands, ``float8_linear.py``) is expanded alike: its matmuls read the FP8
    operands, the scales are not GEMM operands.

    None (the op stays opaque) for a bias or a form not listed."""
    bias = node.args[3] if aten.startswith("aten.") and len(node.args) > 3 else node.kwargs.get("bias")
    if bias is not None or len(ins) < 2 or len(rtypes) != 1:
        return None
    a, b = ins[0], ins[1]
    e = _Expansion(aten)
    sa, sb, out = e.shape(a), e.shape(b), list(rtypes[0].get_shape())
    elem = rtypes[0].element_type
    cache: dict[tuple[SSAValue, int], SSAValue] = padded if padded is not None else {}

    def rows_padded(x: SSAValue, experts: int, cap: int) -> SSAValue:
        if (x, experts) not in cache:
            cache[x, experts] = _padded_rows(e, x, experts, cap)
        return cache[x, experts]

    if len(sa) == 3 and len(sb) == 3:
        return ph.MatmulOp(a, b, rtypes[0])
    if len(sa) == 2 and len(sb) == 3:  # rows of A grouped
        experts, k, n = sb
        cap = _capacity(sa[0], experts, capacity_factor)
        if cap is not None:
            result = _real_rows(e, e.matmul(rows_padded(a, experts, cap), b, elem), sa[0])
        else:
            pieces = []
            for e0, ne, s0, rows in _even_groups(sa[0], experts):
                if rows == 0:
                    continue
                lhs = e.view(e.slice(a, 0, s0, s0 + ne * rows), [ne, rows, k])
                part = e.matmul(lhs, e.slice(b, 0, e0, e0 + ne), elem)
                pieces.append(e.view(part, [ne * rows, n]))
            result = e.cat(pieces, 0)
    elif len(sa) == 2 and len(sb) == 2 and len(out) == 3:  # the contracted dim grouped
        experts, m, n = out
        cap = _capacity(sa[1], experts, capacity_factor)
        if cap is not None:  # the padding rows are zeros: they add nothing to the gradient
            result = e.matmul(_padded_cols(e, a, experts, cap), rows_padded(b, experts, cap), elem)
        else:
            pieces = []
            for _e0, ne, s0, rows in _even_groups(sa[1], experts):
                if rows == 0:
                    pieces.append(e.zeros([ne, m, n], elem))  # experts without tokens: a zero gradient
                    continue
                lhs = e.permute(e.view(e.slice(a, 1, s0, s0 + ne * rows), [m, ne, rows]), (1, 0, 2))
                rhs = e.view(e.slice(b, 0, s0, s0 + ne * rows), [ne, rows, n])
                pieces.append(e.matmul(lhs, rhs, elem))
            result = e.cat(pieces, 0)
    elif len(sa) == 3 and len(sb) == 2:  # columns of B grouped
        experts, m, k = sa
        cap = _capacity(sb[1], experts, capacity_factor)
        if cap is not None:
            # [E, M, C] -> the real columns of each expert part, back as [M, T]
            part = e.matmul(a, _padded_cols(e, b, experts, cap), elem)
            pieces = []
            for e0, ne, _s0, cols in _even_groups(sb[1], experts):
                if cols:
                    real = e.slice(e.slice(part, 0, e0, e0 + ne), 2, 0, cols)
                    pieces.append(e.view(e.permute(real, (1, 0, 2)), [m, ne * cols]))
            result = e.cat(pieces, 1)
        else:
            pieces = []
            for e0, ne, s0, cols in _even_groups(sb[1], experts):
                if cols == 0:
                    continue
                rhs = e.permute(e.view(e.slice(b, 1, s0, s0 + ne * cols), [k, ne, cols]), (1, 0, 2))
                part = e.matmul(e.slice(a, 0, e0, e0 + ne), rhs, elem)
                pieces.append(e.view(e.permute(part, (1, 0, 2)), [m, ne * cols]))
            result = e.cat(pieces, 1)
    else:
        return None
    if e.shape(result) != out:
        raise AssertionError(f"{aten}: expanded to shape {e.shape(result)}, expected {out}")
    return e.ops, [result]


class _ConvGemm:
    """A convolution as implicit GEMMs (docs/design.md §2).

    Every convolution, transposed or not, relates an image ``D [N, G·c_d, *S_d]`` that windows
    slide over, an image ``P [N, G·c_p, *S_p]`` with one pixel per window position, and a weight
    ``w [G·c_p, c_d, *k]`` (a plain convolution: D is the input, P the output; a transposed one:
    the other way round).  With ``M = N·∏S_p``, ``K = c_d·∏k`` and per group ``g``:

    1. ``P = im2col(D) · W``         ``[M, K] × [K, c_p]``
    2. ``D = col2im(P · Wᵀ)``        ``[M, c_p] × [c_p, K]``
    3. ``dW = im2col(D)ᵀ · P``       ``[K, M] × [M, c_p]``

    each ``2·G·M·K·c_p`` FLOPs, a batched ``phaze.matmul`` over the G groups.  A plain
    convolution's forward is (1), its input gradient (2), its weight gradient (3); a transposed
    one's forward is (2), its input gradient (1).  ``im2col``/``col2im`` are views: implicit GEMM
    reads the image in place, it never writes the unfolded matrix."""

    def __init__(self, e: _Expansion, w_shape: list[int], groups: int, d_shape: list[int], p_shape: list[int]):
        self.e, self.g = e, groups
        self.w_shape, self.d_shape, self.p_shape = w_shape, d_shape, p_shape
        self.c_p = w_shape[0] // groups
        self.k = math.prod(w_shape[1:])  # c_d · ∏k
        self.n = p_shape[0]
        self.pixels = math.prod(p_shape[2:])
        self.m = self.n * self.pixels

    def unfolded(self, d: SSAValue) -> SSAValue:
        return self.e.layout("im2col", [d], [self.g, self.m, self.k])

    def rows(self, p: SSAValue) -> SSAValue:
        """``P [N, G·c_p, *S_p]`` as GEMM rows ``[G, M, c_p]`` (implicit GEMM indexes it so)."""
        e = self.e
        x = e.view(p, [self.n, self.g, self.c_p, self.pixels])
        return e.view(e.permute(x, (1, 0, 3, 2)), [self.g, self.m, self.c_p])

    def image(self, rows: SSAValue) -> SSAValue:
        """GEMM rows ``[G, M, c_p]`` written as the image ``P``."""
        e = self.e
        x = e.view(rows, [self.g, self.n, self.pixels, self.c_p])
        return e.view(e.permute(x, (1, 0, 3, 2)), self.p_shape)

    def weight(self, w: SSAValue) -> SSAValue:
        """``w`` as ``[G, c_p, K]`` (``Wᵀ`` per group)."""
        return self.e.view(w, [self.g, self.c_p, self.k])

    def product1(self, d: SSAValue, w: SSAValue, elem: Attribute, bias: SSAValue | None = None) -> SSAValue:
        b = self.e.view(bias, [self.g, 1, self.c_p]) if bias is not None else None
        return self.image(self.e.matmul(self.unfolded(d), self.e.transpose(self.weight(w)), elem, bias=b))

    def product2(self, p: SSAValue, w: SSAValue, elem: Attribute) -> SSAValue:
        cols = self.e.matmul(self.rows(p), self.weight(w), elem)
        return self.e.layout("col2im", [cols], self.d_shape)

    def product3(self, d: SSAValue, p: SSAValue, elem: Attribute) -> SSAValue:
        e = self.e
        dw = e.matmul(e.transpose(self.unfolded(d)), self.rows(p), elem)
        return e.view(e.transpose(dw), self.w_shape)


def _conv_args(node, first: int) -> tuple[bool, int]:
    """``(transposed, groups)`` of a convolution call whose ``stride`` argument is at ``first``
    (``stride, padding, dilation, transposed, output_padding, groups`` follow in that order)."""
    args = node.args
    return bool(args[first + 3]), int(args[first + 5])


def _convolution(node, ins: list[SSAValue], rtypes: list[TensorType], aten: str):
    """``aten.convolution(x, w, bias, stride, padding, dilation, transposed, output_padding,
    groups)`` as an implicit GEMM (:class:`_ConvGemm`); the bias is the matmul's (a plain
    convolution) or an add after the col2im (a transposed one)."""
    transposed, groups = _conv_args(node, 3)
    x, w = ins[0], ins[1]
    bias = ins[2] if node.args[2] is not None and len(ins) > 2 else None
    e = _Expansion(aten)
    out = list(rtypes[0].get_shape())
    elem = rtypes[0].element_type
    if not transposed:
        conv = _ConvGemm(e, e.shape(w), groups, e.shape(x), out)
        return e.ops, [conv.product1(x, w, elem, bias)]
    conv = _ConvGemm(e, e.shape(w), groups, out, e.shape(x))
    y = conv.product2(x, w, elem)
    if bias is not None:
        b = e.view(bias, [out[1]] + [1] * (len(out) - 2))
        y = e.add(
            ph.ElementwiseOp.build(
                operands=[[y, b]], result_types=[rtypes[0]], properties={"kind": StringAttr("add"), "aten": e.aten}
            )
        )
    return e.ops, [y]


def _convolution_backward(node, ins: list[SSAValue], rtypes: list[TensorType], aten: str):
    """``aten.convolution_backward(dy, x, w, bias_sizes, stride, padding, dilation, transposed,
    output_padding, groups, output_mask) -> (dx, dw, db)``: the input and weight gradients as
    implicit GEMMs (:class:`_ConvGemm`), the bias gradient as a sum of ``dy``; only the
    gradients of ``output_mask``."""
    transposed, groups = _conv_args(node, 4)
    dy, x, w = ins[0], ins[1], ins[2]
    e = _Expansion(aten)
    if transposed:
        conv = _ConvGemm(e, e.shape(w), groups, e.shape(dy), e.shape(x))
    else:
        conv = _ConvGemm(e, e.shape(w), groups, e.shape(x), e.shape(dy))
    outs: list[SSAValue] = []
    for (index, _), rtype in zip(_tensors_of(node.meta.get("val")), rtypes):
        elem = rtype.element_type
        if index == 0:
            outs.append(conv.product1(dy, w, elem) if transposed else conv.product2(dy, w, elem))
        elif index == 1:
            outs.append(conv.product3(dy, x, elem) if transposed else conv.product3(x, dy, elem))
        else:
            dims = [d for d in range(len(e.shape(dy))) if d != 1]
            outs.append(
                e.add(
                    ph.ReductionOp.build(
                        operands=[[dy]],
                        result_types=[[rtype]],
                        properties={
                            "kind": StringAttr("sum"),
                            "aten": e.aten,
                            "dims": DenseArrayBase.from_list(i64, dims),
                        },
                    )
                )
            )
    for v, rtype in zip(outs, rtypes):
        if v.type != rtype:
            raise AssertionError(f"{aten}: expanded to {v.type}, expected {rtype}")
    return e.ops, outs


def model_flops(fn: func.FuncOp, routed: Mapping[Operation, tuple[int, int]] | None = None) -> int:
    """The model FLOPs of one training micro-batch (``phaze.model_flops``): three times the
    forward GEMMs' FLOPs (the backward computes two GEMMs of each forward one's size), the
    attention's score and context GEMMs included, nothing else.  For a transformer this is the
    convention MFU is quoted in: 6·N per token for the N weights that a GEMM reads (the embedding
    lookup is not a GEMM; a tied LM head is), plus 12·L·H·Q·T per token of attention (PaLM,
    Chowdhery et al. 2022, appendix B; torchtitan's ``get_num_flop_per_token``).  An MoE layer
    counts the tokens routed to its experts (the active parameters): an expert GEMM padded to
    the experts' capacity (``routed``: the op -> its routed rows and the rows it runs, the
    importer's) counts its routed rows alone, as Megatron-LM's ``num_floating_point_operations``
    counts ``moe_router_topk`` experts a token whatever the capacity (``num_experts_routed_to``,
    ``megatron/training/training.py`` at d98e8a64dd); the padding is work the
    devices run (HFU), not the model's.  Flash attention's causal half is not taken off here
    (PaLM's convention counts the whole square; the summary takes it off for its MFU, and gives
    PaLM's beside it).

    The two backward GEMMs are those of the operands whose gradient the step computes (each the
    forward's size): an operand that depends on no parameter has none, which the convention's
    3 assumes away.  So a CNN's first convolution, whose input is the image, counts twice its
    forward FLOPs (its weight gradient only: the backward has no input-gradient GEMM for it, and
    counted, the model FLOPs would exceed the FLOPs the devices run, MFU above HFU); a GEMM of
    buffers and inputs alone (a rotary embedding's frequencies times the positions) once.  A
    transformer's GEMMs all read the embedding's output or a weight: 3, as before."""
    needs_grad = _needs_grad(fn)
    total = 0
    for op in fn.body.walk():
        if isinstance(op, ph.MatmulOp) and keys.string_of(op, keys.PHASE) == "fwd":
            flops = op.flops()
            if routed is not None and op in routed:
                rows, run = routed[op]
                flops = flops * rows // run
            total += flops * (1 + (op.lhs in needs_grad) + (op.rhs in needs_grad))
    return total


def attention_flops(fn: func.FuncOp) -> tuple[int, int, int]:
    """Of ``phaze.model_flops``, the fused attentions' share (``phaze.attention_flops``), the
    causal ones' (``phaze.causal_attention_flops``) and what the windowed ones' kernels do not
    compute (``phaze.window_skipped_flops``): three times the forward GEMMs of the ops one
    ``phaze.fused`` aten op stands for (the score and context GEMMs of an SDPA or flash
    attention; a fused dropout has none), of the whole, unsharded step as traced.  These grow
    with the square of the sequence (a context-parallel step's whole sample: c² times the
    traced S/c's, :func:`phaze_ir.keys.sample_model_flops`), a causal kernel skips the half
    above the diagonal and a sliding-window one all but the window's band
    (:func:`~phaze_ir.op_kinds.causal_fraction`): the summary's MFU takes them off."""
    attention = causal = window_skipped = 0
    for op in fn.body.walk():
        fused = op.attributes.get(keys.FUSED)
        if isinstance(op, ph.MatmulOp) and isinstance(fused, StringAttr) and keys.string_of(op, keys.PHASE) == "fwd":
            flops = 3 * op.flops()
            attention += flops
            mask = causal_mask(fused.data)
            if mask == 1:
                causal += flops
            elif mask:
                _, m, n, k = op.mnk()
                window_skipped += flops - math.ceil(flops * float(causal_fraction(m, n, k, mask)))
    return attention, causal, window_skipped


def _needs_grad(fn: func.FuncOp) -> set[SSAValue]:
    """The values of ``fn`` that depend on a parameter (a ``phaze.param`` argument), whose
    gradient the training step computes; a model input or a buffer has none."""
    attrs = fn.arg_attrs.data if fn.arg_attrs is not None else ()
    out: set[SSAValue] = {
        arg for arg, a in zip(fn.body.block.args, attrs) if isinstance(a, DictionaryAttr) and keys.PARAM in a.data
    }
    for op in fn.body.walk():  # in program order: an op after the values it reads
        if any(v in out for v in op.operands):
            out.update(op.results)
    return out


def import_graph(traced: TracedGraph, strict: bool = False, capacity_factor: float | None = None) -> ModuleOp:
    """Build the ``phaze`` module of a traced step.  ``strict`` turns unknown aten ops into
    errors instead of opaque ops; ``capacity_factor`` (None: dropless) pads every expert GEMM to
    the experts' capacity (:func:`_grouped_mm`) and is recorded as ``phaze.capacity_factor``."""
    return _Importer(traced, strict, capacity_factor).run()


def _shape_attr(shape: dict[str, Any]) -> DictionaryAttr:
    """``phaze.model_shape`` of a traced model's shape (``phaze_ir.frontend.shape``): a bool as
    an ``i1``, an integer as an ``i64``, a float as an ``f64``, a string as a string."""
    out: dict[str, Attribute] = {}
    for name, value in sorted(shape.items()):
        if isinstance(value, bool):
            out[name] = IntegerAttr(int(value), IntegerType(1))
        elif isinstance(value, int):
            out[name] = IntegerAttr(value, i64)
        elif isinstance(value, float):
            out[name] = FloatAttr(value, Float64Type())
        else:
            out[name] = StringAttr(str(value))
    return DictionaryAttr(out)
