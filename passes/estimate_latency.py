"""``phaze-estimate-latency``: every op's latency on the module's accelerator.

Also the bridge between the IR and the pure latency model: :func:`describe_op` reads an op
through the ``ComputeOp`` interface into a description of ``passes.algorithms.latency``,
:func:`op_signature` names what an op does (ops with equal signatures cost the same), and
:func:`op_table` deduplicates a module's ops for :func:`~passes.algorithms.latency.estimate_space`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, IntegerAttr, ModuleOp, StringAttr, TensorType
from xdsl.ir import Operation
from xdsl.passes import ModulePass

from passes.algorithms.latency import (
    CollectiveDesc,
    MatmulDesc,
    OpDesc,
    OpTable,
    VectorDesc,
    ViewDesc,
    estimate_matmul,
    estimate_op,
    layer_totals,
)
from passes.algorithms.tiling import tile_gemm_scalar
from phaze_ir import dialect as ph
from phaze_ir.attributes import LatencyAttr, LayerLatencyAttr, TileAttr
from phaze_ir.errors import PhazeError
from phaze_ir.hardware_ir import module_accelerator

__all__ = [
    "LATENCY_ATTR",
    "TILE_ATTR",
    "LAYER_LATENCY_ATTR",
    "EstimateLatencyPass",
    "op_signature",
    "describe_op",
    "op_table",
    "tiling_of",
]

TILE_ATTR = "phaze.tile"
LATENCY_ATTR = "phaze.latency"
LAYER_LATENCY_ATTR = "phaze.layer_latency"

#: Passes over the input of multi-pass vector ops (softmax: max, exp-sum, normalize; its
#: gradient: the row sum, then the elementwise update; norms: statistics, then normalize).
SOFTMAX_PASSES = {"softmax": 3, "log_softmax": 3, "softmax_grad": 2, "log_softmax_grad": 2}
NORM_PASSES = 2
REDUCTION_PASSES = {"var": 2}


def op_signature(op: Operation) -> str:
    """What an op computes, without where it is: name, properties, operand and result types.
    Ops with equal signatures have equal descriptions and latencies."""
    props = ",".join(f"{k}={v}" for k, v in sorted(op.properties.items()))
    operands = ",".join(str(o.type) for o in op.operands)
    results = ",".join(str(r.type) for r in op.results)
    return f"{op.name}|{props}|{operands}|{results}"


def _shape(t) -> tuple[int, ...]:
    return tuple(t.get_shape()) if isinstance(t, TensorType) else ()


def _row_bytes(op: Operation, shape: tuple[int, ...], row_elems: int) -> int:
    """Bytes of one reduced row over the inputs of the op's full iteration shape."""
    per = sum(
        ph.element_bytes(v.type.element_type)
        for v in op.operands
        if isinstance(v.type, TensorType) and _shape(v.type) == shape
    )
    return row_elems * per


def _vector_desc(op: ph.ComputeOp) -> VectorDesc:
    out_elems = sum(ph.numel(r.type) for r in op.results if isinstance(r.type, TensorType))
    work = max(op.flops(), out_elems)
    passes, row = 1, 0
    if isinstance(op, ph.SoftmaxOp) and op.inputs:
        shape = _shape(op.result.type)
        passes = SOFTMAX_PASSES.get(op.kind.data, 1)
        dim = op.dim.value.data % max(1, len(shape)) if shape else 0
        row = _row_bytes(op, shape, shape[dim] if shape else 1)
    elif isinstance(op, ph.NormOp) and op.inputs:
        shape = _shape(op.inputs[0].type)
        passes = NORM_PASSES
        r = op.normalized_rank.value.data
        row = _row_bytes(op, shape, math.prod(shape[len(shape) - r :]) if r > 0 else 1)
    elif isinstance(op, ph.ReductionOp) and op.inputs and op.kind.data in REDUCTION_PASSES:
        shape = _shape(op.inputs[0].type)
        passes = REDUCTION_PASSES[op.kind.data]
        dims = op.dims.get_values()
        reduced = {d % len(shape) for d in dims} if shape and dims else set(range(len(shape)))
        row = _row_bytes(op, shape, math.prod(shape[d] for d in reduced))
    return VectorDesc(
        work=work,
        read_bytes=op.bytes_read(),
        write_bytes=op.bytes_written(),
        passes=passes,
        row_bytes=row if passes > 1 else 0,
    )


def _matmul_desc(op: ph.MatmulOp) -> MatmulDesc:
    batch_shape, m, n, k = op.mnk()
    lhs, rhs = op.lhs.type, op.rhs.type
    return MatmulDesc(
        batch=math.prod(batch_shape),
        m=m,
        n=n,
        k=k,
        a_elem=ph.element_bytes(lhs.element_type),
        b_elem=ph.element_bytes(rhs.element_type),
        c_elem=ph.element_bytes(op.result.type.element_type),
        a_bytes=ph.tensor_bytes(lhs),
        b_bytes=ph.tensor_bytes(rhs),
        bias_bytes=ph.tensor_bytes(op.bias.type) if op.bias is not None else 0,
        rhs_batched=math.prod(rhs.get_shape()[:-2]) > 1,
    )


def describe_op(op: Operation) -> OpDesc | None:
    """The latency model's description of ``op``; ``None`` for ops that are not priced
    (anything that is not a ``ComputeOp``: ``func.return``, ``phaze.accelerator``)."""
    if isinstance(op, ph.MatmulOp):
        return _matmul_desc(op)
    if isinstance(op, ph.CollectiveOp):
        nbytes = max(ph.tensor_bytes(op.input.type), ph.tensor_bytes(op.result.type))
        return CollectiveDesc(op.kind.data, op.group_size.value.data, nbytes)
    if isinstance(op, ph.LayoutOp) and op.is_view:
        return ViewDesc()
    if isinstance(op, ph.ComputeOp):
        return _vector_desc(op)
    return None


class _Describer:
    """:func:`describe_op` memoized by signature (a transformer repeats its ops many times)."""

    def __init__(self) -> None:
        self.by_signature: dict[str, OpDesc | None] = {}

    def __call__(self, op: Operation) -> tuple[str, OpDesc | None]:
        sig = op_signature(op)
        if sig not in self.by_signature:
            self.by_signature[sig] = describe_op(op)
        return sig, self.by_signature[sig]


def op_table(module: ModuleOp) -> tuple[OpTable, list[int], list[Operation], dict[str, int]]:
    """The module's priced ops deduplicated: ``(table, row_of_op, ops, signatures)``.

    ``ops`` are the priced ops in walk order, ``row_of_op[i]`` the row of ``ops[i]`` in
    ``table`` (ops with equal signatures share a row, and so do different signatures with
    equal descriptions), ``signatures`` maps each distinct signature to its row."""
    describe = _Describer()
    rows: dict[OpDesc, int] = {}
    descs: list[OpDesc] = []
    row_of: list[int] = []
    ops: list[Operation] = []
    sig_rows: dict[str, int] = {}
    for op in module.walk():
        sig, desc = describe(op)
        if desc is None:
            continue
        if desc not in rows:
            rows[desc] = len(descs)
            descs.append(desc)
        row_of.append(rows[desc])
        sig_rows[sig] = rows[desc]
        ops.append(op)
    return OpTable(descs), row_of, ops, sig_rows


def tiling_of(op: ph.MatmulOp, acc, desc: MatmulDesc | None = None):
    """The tiling ``phaze-tile-pe-array`` gives ``op`` on ``acc`` (a ``ScalarTiling``)."""
    d = desc or _matmul_desc(op)
    tc = acc.tensor_cores
    return tile_gemm_scalar(d.batch, d.m, d.n, d.k, tc.pe_x, tc.pe_y, tc.count, tc.buffer_bytes)


@dataclass(frozen=True)
class EstimateLatencyPass(ModulePass):
    """Give every compute op and collective a ``phaze.latency`` record (seconds on one core of
    its unit and split over all of them, the unit, what bounds it; see
    ``passes/algorithms/latency.py``) on the module's accelerator (``phaze.target``), and the
    module a ``phaze.layer_latency`` list (per layer of ``phaze.layer``: serial sums of the
    ``split_s`` of its forward, backward and optimizer ops).

    Requires the accelerator and, on every ``phaze.matmul``, the ``phaze.tile`` of
    ``phaze-tile-pe-array`` for that accelerator.  Ops with equal signatures are priced once.
    """

    name = "phaze-estimate-latency"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        acc = module_accelerator(op, self.name)
        describe = _Describer()
        priced: dict[str, object] = {}
        layers: list[int] = []
        phases: list[str] = []
        seconds: list[float] = []
        for o in op.walk():
            sig, desc = describe(o)
            if desc is None:
                continue
            if isinstance(o, ph.MatmulOp):
                tile = o.attributes.get(TILE_ATTR)
                if not isinstance(tile, TileAttr):
                    raise PhazeError(f"'{o.name}' op requires '{TILE_ATTR}'; run phaze-tile-pe-array first")
                expected = tiling_of(o, acc, desc)
                if tile.as_dict() != {f: getattr(expected, f) for f in TileAttr.FIELDS}:
                    raise PhazeError(
                        f"'{o.name}' op has a '{TILE_ATTR}' that does not match the accelerator "
                        f"'{acc.name}' ({acc.tensor_cores.count} tensor cores of {acc.tensor_cores.pe_x} x "
                        f"{acc.tensor_cores.pe_y}); run phaze-tile-pe-array again"
                    )
            lat = priced.get(sig)
            if lat is None:
                lat = estimate_matmul(desc, acc, expected) if isinstance(o, ph.MatmulOp) else estimate_op(desc, acc)
                priced[sig] = lat
            o.attributes[LATENCY_ATTR] = LatencyAttr.make(
                one_s=float(lat.one_s), split_s=float(lat.split_s), unit=lat.unit, bound=lat.bound
            )
            layer = o.attributes.get(ph.LAYER_ATTR)
            if isinstance(layer, IntegerAttr):
                phase = o.attributes.get(ph.PHASE_ATTR)
                layers.append(layer.value.data)
                phases.append(phase.data if isinstance(phase, StringAttr) else "fwd")
                seconds.append(lat.split_s)
        op.attributes.pop(LAYER_LATENCY_ATTR, None)
        if layers:
            totals = layer_totals(layers, phases, seconds)
            op.attributes[LAYER_LATENCY_ATTR] = ArrayAttr(
                [
                    LayerLatencyAttr.make(index=i, fwd_s=t["fwd"], bwd_s=t["bwd"], opt_s=t["opt"])
                    for i, t in totals.items()
                ]
            )
