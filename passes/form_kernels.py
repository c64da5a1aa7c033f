"""``phaze-form-kernels``: group the step's ops into the kernels a named runtime launches."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import BFloat16Type, IntegerAttr, ModuleOp, StringAttr, TensorType, UnitAttr
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass

from passes.algorithms.kernels import RUNTIMES, SDPA_ORDERS, KOp, StepValues, form_kernels
from passes.algorithms.option_values import SdpaOrder
from passes.graph_view import grouped_key, step_function
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.attributes import KernelAttr
from phaze_ir.errors import PhazeError
from phaze_ir.hardware_ir import module_accelerator
from phaze_ir.op_kinds import OPTIMIZER_FOREACH_KERNELS, causal_mask

bf16_type = BFloat16Type()

#: Reduction kinds that are not loops Inductor or Megatron fuse (sorts and selections).
_LIBRARY_REDUCTIONS = ("topk", "sort", "histc", "argmax")


def _numel(v: SSAValue) -> int:
    return ph.numel(v.type) if isinstance(v.type, TensorType) else 1


def _reduction(total: int, out: int) -> tuple[int, int]:
    """``(numel, rnumel)`` of a reduction of ``total`` elements into ``out``."""
    out = max(1, out)
    return out, max(1, total // out)


def kop(o: Operation, ids: dict[SSAValue, int]) -> KOp:
    """What kernel formation needs of one op (``passes/algorithms/kernels.py``).  Each record
    is made once, with the fields its kind needs (a sweep forms the kernels of every op at every
    TP width of every setting: copying a record per op with ``dataclasses.replace`` was a
    seventh of the pass)."""
    phase, fused = keys.string_of(o, keys.PHASE, "fwd"), keys.string_of(o, keys.FUSED, "")
    operands, results = tuple(ids[v] for v in o.operands), tuple(ids[r] for r in o.results)

    def made(kind: str, **fields: Any) -> KOp:
        return KOp(kind, phase, operands, results, fused=fused, causal=causal_mask(fused), **fields)

    def out_numel() -> int:
        return max((_numel(r) for r in o.results), default=1)

    if isinstance(o, ph.LayoutOp):
        return made("view" if o.is_view else "pointwise", numel=out_numel())
    if isinstance(o, ph.ElementwiseOp):
        return made("pointwise", numel=out_numel())
    if isinstance(o, ph.EmbeddingOp):
        return made("pointwise" if o.kind.data == "lookup" else "library", numel=out_numel())
    if isinstance(o, ph.ReductionOp) and o.inputs and o.kind.data not in _LIBRARY_REDUCTIONS:
        numel, rnumel = _reduction(_numel(o.inputs[0]), _numel(o.results[0]))
        return made("reduction" if rnumel > 1 else "pointwise", numel=numel, rnumel=rnumel)
    if isinstance(o, ph.SoftmaxOp) and o.inputs:
        shape = list(ph.tensor_type(o.inputs[0]).get_shape())
        row = shape[o.dim.value.data % len(shape)] if shape else 1
        numel, rnumel = _reduction(_numel(o.inputs[0]), _numel(o.inputs[0]) // max(1, row))
        return made("reduction", numel=numel, rnumel=rnumel, softmax=o.kind.data == "softmax")
    if isinstance(o, ph.NormOp) and o.inputs:
        shape = list(ph.tensor_type(o.inputs[0]).get_shape())
        rank = o.normalized_rank.value.data
        row = math.prod(shape[len(shape) - rank :]) if rank > 0 else 1
        numel, rnumel = _reduction(_numel(o.inputs[0]), _numel(o.inputs[0]) // max(1, row))
        return made("reduction", numel=numel, rnumel=rnumel)
    if isinstance(o, ph.OptimizerUpdateOp):
        layer = o.attributes.get(keys.LAYER)
        return made(
            "optimizer",
            param_elements=_numel(o.param),
            layer=layer.value.data if isinstance(layer, IntegerAttr) else -1,
            optimizer_kernels=OPTIMIZER_FOREACH_KERNELS.get(o.kind.data, 1),
        )
    if isinstance(o, ph.MatmulOp) and (key := grouped_key(o, ids)):
        batch, _m, _n, _k = o.mnk()
        types = (o.lhs.type, o.rhs.type, o.result.type)
        bf16 = all(isinstance(t, TensorType) and t.element_type == bf16_type for t in types)
        fp8 = all(ph.element_bytes(ph.tensor_type(v).element_type) == 1 for v in (o.lhs, o.rhs))
        fp8 = fp8 and ph.tensor_type(o.result).element_type == bf16_type
        return made("library", grouped=key, experts=math.prod(batch), bf16=bf16, fp8=fp8)
    return made("library")


@dataclass(frozen=True)
class FormKernelsPass(ModulePass):
    """Give every op a ``phaze.kernel`` record: the kernel it runs in when ``runtime`` runs the
    step (``ops``, ``eager``, ``inductor`` or ``megatron``; rules and sources in
    ``passes/algorithms/kernels.py``), with the bytes of its reads and writes that stay on chip
    and the launches it accounts for; the module gets ``phaze.kernels = runtime``, and
    ``phaze.sdpa_order`` when ``sdpa_order`` is not torch 2.15's (``flash-first``: the SDPA of a
    torch that ran FlashAttention-2 where cuDNN's would run now).  Expert GEMMs
    are launched as torch launches them on the module's accelerator (its compute capability;
    one grouped kernel when the module has no accelerator).
    ``phaze-estimate-latency`` prices the ops by these records.  Views get none (they launch
    nothing).  Run after the step is complete (optimizer, sharding), before the latency.
    """

    name = "phaze-form-kernels"
    runtime: str = "eager"
    sdpa_order: str = SDPA_ORDERS[0]

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.runtime not in RUNTIMES:
            raise PhazeError(f"{self.name}: runtime={self.runtime}: expected one of {', '.join(RUNTIMES)}")
        if self.sdpa_order not in SDPA_ORDERS:
            raise PhazeError(f"{self.name}: sdpa_order={self.sdpa_order}: expected one of {', '.join(SDPA_ORDERS)}")
        sdpa_order = SdpaOrder(self.sdpa_order)  # the pass option's text, parsed once
        fn = step_function(op)
        ids: dict[SSAValue, int] = {}
        nbytes: list[int] = []
        view_of: list[int | None] = []

        def add(v: SSAValue, alias: int | None) -> None:
            ids[v] = len(nbytes)
            nbytes.append(ph.tensor_bytes(v.type) if isinstance(v.type, TensorType) else 0)
            view_of.append(alias)

        for a in fn.body.block.args:
            add(a, None)
        ops: list[Operation] = []
        kops: list[KOp] = []
        outputs: set[int] = set()
        for o in fn.body.block.ops:
            if isinstance(o, func.ReturnOp):
                outputs.update(ids[v] for v in o.operands)
                continue
            if not isinstance(o, ph.ComputeOp):
                continue
            view = isinstance(o, ph.LayoutOp) and o.is_view and bool(o.operands)
            for r in o.results:
                add(r, ids[o.operands[0]] if view else None)
            ops.append(o)
            kops.append(kop(o, ids))
        kernels = form_kernels(
            kops, StepValues(nbytes, view_of, frozenset(outputs)), self.runtime, _compute_capability(op, self.name)
        )
        columns = {k.id for o, k in zip(ops, kernels) if k is not None and column_max(o)}
        for o, k in zip(ops, kernels):
            o.attributes.pop(keys.COLUMN_KERNEL, None)
            if k is None:
                o.attributes.pop(keys.KERNEL, None)
                continue
            o.attributes[keys.KERNEL] = KernelAttr.make(
                id=k.id,
                launch=k.launch,
                onchip_read=k.onchip_read,
                onchip_written=k.onchip_written,
                causal=int(k.causal),
            )
            if k.id in columns:
                o.attributes[keys.COLUMN_KERNEL] = UnitAttr()
        op.attributes[keys.KERNELS] = StringAttr(self.runtime)
        if sdpa_order is not SdpaOrder.CUDNN_FIRST:  # (the default leaves the module as it was)
            op.attributes[keys.SDPA_ORDER] = StringAttr(self.sdpa_order)
        else:
            op.attributes.pop(keys.SDPA_ORDER, None)


def column_max(o: Operation) -> bool:
    """A max across a tensor's rows as they lie in memory: a ``phaze.reduction "max"`` that leaves
    out the dimension its input is contiguous along (:func:`_contiguous_dim`), of more than one
    element (torchao's column-wise amax of a rowwise float8 cast, ``tensor_to_amax`` along the
    tokens of an activation or along the output features of a weight), so it reads across the
    slow dimension."""
    if not (isinstance(o, ph.ReductionOp) and o.kind.data == "max" and o.inputs):
        return False
    shape = tuple(ph.tensor_type(o.inputs[0]).get_shape())
    if len(shape) < 2 or not o.dims.get_values():
        return False
    inner = _contiguous_dim(o.inputs[0])
    return shape[inner] > 1 and inner not in {d % len(shape) for d in o.dims.get_values()}


def _contiguous_dim(v: SSAValue) -> int:
    """The dimension of ``v`` its elements are contiguous along: the last, or the one before it
    when ``v`` is pointwise ops of a transposed 2-D view (``w.t()``, read as the weight's rows)."""
    rank = len(ph.tensor_type(v).get_shape())
    flipped = False
    while isinstance(owner := v.owner, Operation):
        if isinstance(owner, ph.LayoutOp) and owner.kind.data == "transpose" and rank == 2 and owner.operands:
            flipped, v = not flipped, owner.operands[0]
            continue
        shape = ph.tensor_type(v).get_shape()
        same = [u for u in owner.operands if isinstance(u.type, TensorType) and u.type.get_shape() == shape]
        if not (isinstance(owner, ph.ElementwiseOp) and same):
            break
        v = same[0]
    return rank - 2 if flipped else rank - 1


def _compute_capability(module: ModuleOp, pass_name: str) -> float | None:
    """The module's accelerator's CUDA compute capability (``[calibration]``), None without an
    accelerator or without that figure."""
    try:
        acc = module_accelerator(module, pass_name)
    except PhazeError:
        return None
    return None if acc.calibration is None else acc.calibration.compute_capability
