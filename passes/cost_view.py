"""The IR as the cost models see it: the bridge between ``phaze`` ops and the pure models of
``passes/algorithms`` (shared by the cost passes and the architecture search).

:func:`describe_op` reads an op through the ``ComputeOp`` interface into a description of
``passes.algorithms.latency``, :func:`op_signature` names what an op computes (ops with equal
signatures cost the same), :func:`op_table` deduplicates a module's ops for
:func:`~passes.algorithms.latency.estimate_space`, :func:`read_latencies` reads back what
``phaze-estimate-latency`` wrote, and :func:`core_counts` the capacities a schedule has.
"""

from __future__ import annotations

import math

from xdsl.dialects.builtin import ArrayAttr, IntegerAttr, ModuleOp, StringAttr, TensorType
from xdsl.ir import Operation, SSAValue

from passes.algorithms import schedule as sched
from passes.algorithms.attention import BACKENDS, PASSES
from passes.algorithms.kernels import SDPA_ORDERS, TORCH_GROUPED_MM, TRACED_ATTENTION, attention_backend
from passes.algorithms.latency import (
    CollectiveDesc,
    MatmulDesc,
    OpDesc,
    OpTable,
    VectorDesc,
    ViewDesc,
    causal_fraction,
    layer_totals,
)
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.attributes import KernelAttr, LatencyAttr, LayerLatencyAttr
from phaze_ir.errors import PhazeError
from phaze_ir.hardware_ir import module_accelerator

#: Passes over the input of multi-pass vector ops (softmax: max, exp-sum, normalize; its
#: gradient: the row sum, then the elementwise update; norms: statistics, then normalize).
SOFTMAX_PASSES = {"softmax": 3, "log_softmax": 3, "softmax_grad": 2, "log_softmax_grad": 2}
NORM_PASSES = 2
REDUCTION_PASSES = {"var": 2}


def op_signature(op: Operation) -> str:
    """What an op computes, without where it is: name, properties, operand and result types,
    and its ``phaze.kernel`` record but for the kernel's id (what of its traffic stays on chip).
    Ops with equal signatures have equal descriptions and latencies."""
    props = ",".join(f"{k}={ph.attr_text(v)}" for k, v in sorted(op.properties.items()))
    operands = ",".join(ph.attr_text(o.type) for o in op.operands)
    results = ",".join(ph.attr_text(r.type) for r in op.results)
    kernel = _kernel(op)
    fused = "" if kernel is None else "|{launch},{onchip_read},{onchip_written},{causal}".format(**kernel)
    if kernel is not None and (traced := _traced_attention(op)):  # a fused attention's pass and kernel
        fused += f"|{traced}|{keys.string_of(op, keys.PHASE, 'fwd')}"
    if isinstance(op, ph.MatmulOp):
        lhs, rhs = op.lhs.type, op.rhs.type
        assert isinstance(lhs, TensorType) and isinstance(rhs, TensorType)
        # the backward's FP8 GEMMs run at another rate than the forward's of the same types
        if _split_accumulation(op, lhs, rhs):
            fused += "|split"
        if (rowwise := rowwise_gemm(op)) is not None:
            fused += f"|rowwise {rowwise}"
    if keys.COLUMN_KERNEL in op.attributes:
        fused += "|column"
    return f"{op.name}|{props}|{operands}|{results}{fused}"


def _traced_attention(op: Operation) -> str:
    """The fused attention kernel the op is part of as traced (``flash2``, ``efficient``,
    ``cudnn``: the aten op of its ``phaze.fused``), "" when it is not part of one."""
    fused = op.attributes.get(keys.FUSED)
    if not isinstance(fused, StringAttr):
        return ""
    return next((k for name, k in TRACED_ATTENTION.items() if fused.data.startswith(name)), "")


def attention_codes(op: Operation) -> tuple[int, int]:
    """``(attention, backend)`` of a description (``MatmulDesc.attention``): the pass (1 forward,
    2 backward) and the kernel (an index into ``attention.BACKENDS``) of the fused attention
    kernel the op is part of, as its module's runtime runs it on its chip
    (``kernels.attention_backend``); ``(0, 0)`` when it is not part of one."""
    kernel = _kernel(op)
    fused = op.attributes.get(keys.FUSED)
    if kernel is None or not isinstance(fused, StringAttr) or not _traced_attention(op):
        return 0, 0
    module = _module(op)
    if module is None:
        return 0, 0
    try:
        cc = module_accelerator(module, "phaze-estimate-latency").calibration
    except PhazeError:  # a module without a chip prices no kernel table
        return 0, 0
    compute_capability = None if cc is None else cc.compute_capability
    order = keys.string_of(module, keys.SDPA_ORDER, SDPA_ORDERS[0])
    backend = attention_backend(_runtime(op), compute_capability, fused.data, order)
    if backend is None:
        return 0, 0
    phase = keys.string_of(op, keys.PHASE, "fwd")
    return PASSES.index("bwd" if phase == "bwd" else "fwd") + 1, BACKENDS.index(backend)


def _module(op: Operation) -> ModuleOp | None:
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, ModuleOp):
        parent = parent.parent_op()
    return parent


def _kernel(op: Operation) -> dict | None:
    """The op's ``phaze.kernel`` record as a dict (``phaze-form-kernels``), None without one."""
    k = op.attributes.get(keys.KERNEL)
    return k.as_dict() if isinstance(k, KernelAttr) else None


def _scores_side(op: Operation) -> int:
    """s when the op's largest tensor is ``[..., s, s]`` (attention scores), 0 else."""
    types = [v.type for v in (*op.operands, *op.results) if isinstance(v.type, TensorType)]
    if not types:
        return 0
    shape = _shape(max(types, key=ph.numel))
    return shape[-1] if len(shape) >= 2 and shape[-1] == shape[-2] > 1 else 0


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


def skipped_flops(op: Operation) -> int:
    """The FLOPs of ``op`` (``op.flops()``) its kernel does not compute: a causal attention
    kernel's GEMMs and its ops over the s x s scores compute ``(s + 1) / 2s`` of them
    (:func:`~passes.algorithms.latency.causal_fraction`); 0 for every other op.  What the
    devices run (HFU, ``phaze.layers``) is ``op.flops() - skipped_flops(op)``."""
    kernel = _kernel(op)
    if kernel is None or not kernel["causal"] or not isinstance(op, ph.ComputeOp):
        return 0
    if isinstance(op, ph.MatmulOp):
        _, m, n, k = op.mnk()
        frac = float(causal_fraction(m, n, k, kernel["causal"]))
    elif scores := _scores_side(op):
        frac = float(causal_fraction(scores, scores, scores, kernel["causal"]))
    else:
        return 0
    flops = op.flops()
    return flops - math.ceil(flops * frac)


def vector_desc(op: ph.ComputeOp) -> VectorDesc:
    out_elems = sum(ph.numel(r.type) for r in op.results if isinstance(r.type, TensorType))
    work = max(op.flops(), out_elems)
    kernel = _kernel(op) or {"launch": 1, "onchip_read": 0, "onchip_written": 0, "causal": 0}
    scores = _scores_side(op)
    if kernel["causal"] and scores:  # a causal kernel skips the upper triangle
        work = math.ceil(work * float(causal_fraction(scores, scores, scores, kernel["causal"])))
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
    attention, backend = attention_codes(op)
    return VectorDesc(
        work=work,
        read_bytes=max(0, op.bytes_read() - kernel["onchip_read"]),
        write_bytes=max(0, op.bytes_written() - kernel["onchip_written"]),
        passes=passes,
        row_bytes=row if passes > 1 else 0,
        launches=kernel["launch"],
        column=keys.COLUMN_KERNEL in op.attributes,
        attention=attention,
        backend=backend,
    )


def matmul_desc(op: ph.MatmulOp) -> MatmulDesc:
    batch_shape, m, n, k = op.mnk()
    lhs, rhs, result = op.lhs.type, op.rhs.type, op.result.type
    assert isinstance(lhs, TensorType) and isinstance(rhs, TensorType) and isinstance(result, TensorType)
    kernel = _kernel(op) or {"launch": 1, "onchip_read": 0, "onchip_written": 0, "causal": 0}
    fp32 = ph.element_bytes(lhs.element_type) == 4 and ph.element_bytes(rhs.element_type) == 4
    attention, backend = attention_codes(op)
    rowwise = rowwise_gemm(op)
    c_elem = ph.element_bytes(result.element_type)
    post_bytes, post_launches = _post_scale(rowwise, m, n, math.prod(batch_shape), c_elem)
    return MatmulDesc(
        batch=math.prod(batch_shape),
        m=m,
        n=n,
        k=k,
        a_elem=ph.element_bytes(lhs.element_type),
        b_elem=ph.element_bytes(rhs.element_type),
        c_elem=c_elem,
        a_bytes=ph.tensor_bytes(lhs),
        b_bytes=ph.tensor_bytes(rhs),
        bias_bytes=ph.tensor_bytes(op.bias.type) if op.bias is not None else 0,
        rhs_batched=math.prod(rhs.get_shape()[:-2]) > 1,
        onchip_bytes=kernel["onchip_read"] + kernel["onchip_written"],
        causal=int(kernel["causal"]),
        launches=kernel["launch"],
        fp32=fp32 and _runtime(op) in TORCH_GROUPED_MM,
        # launched once per expert: torch's grouped GEMM fallback, after its host sync
        syncs=1 if kernel["launch"] > 1 else 0,
        split_accumulation=_split_accumulation(op, lhs, rhs),
        rowwise=rowwise is not None,
        post_scale_bytes=post_bytes,
        post_scale_launches=post_launches,
        attention=attention,
        backend=backend,
    )


#: What the pass that scales a rowwise FP8 GEMM's output costs, by how it runs
#: (:func:`rowwise_gemm`): ``(passes over the output, over the fp32 product of the scales,
#: kernels)``.  ``fwd``: PyTorch's CUTLASS rowwise kernel scales in its epilogue: no pass.
#: ``eager``: ``a_inverse_scale * b_inverse_scale`` is an ``[M, N]`` fp32 tensor (written, one
#: kernel) that ``output *=`` reads with the output, which it writes back (a second kernel);
#: ``own``: Inductor's one pointwise kernel, the output read and written, the two scale vectors
#: broadcast; ``fused``: Inductor folds the multiply into the output's next op, which reads the
#: output anyway: nothing more.  A pass reads the two scale vectors (fp32) once.
POST_SCALE = {"fwd": (0, 0, 0), "eager": (2, 2, 2), "own": (2, 0, 1), "fused": (0, 0, 0)}
FP32_BYTES = 4


def rowwise_gemm(op: ph.MatmulOp) -> str | None:
    """How torchao 0.10-0.19 runs an FP8 GEMM with rowwise scales (``phaze.fp8_scales``), None
    for any other GEMM: ``fwd`` (fast accumulation: PyTorch's CUTLASS ``f8f8bf16_rowwise``, the
    scales applied in its epilogue), else a backward GEMM (split accumulation) run as cuBLAS's
    per-tensor GEMM at unit scales and then a pointwise pass that scales its output
    (``torchao/float8/float8_ops.py``, ``addmm_float8_unwrapped``: "The rowwise CUTLASS-based
    kernel is so slow without fast-accum that we'd rather use the tensorwise cuBLAS-based kernel
    and do the scaling manually afterwards (hoping Inductor will be able to fuse it)"): ``eager``
    without Inductor, ``fused`` under Inductor when every op that reads the output (through
    views) is a pointwise op or a reduction of the same backward graph, which Inductor fuses
    the multiply into, ``own`` otherwise (the output leaves the graph: a weight gradient, a
    collective's operand, an attention kernel's input)."""
    scales = op.attributes.get(keys.FP8_SCALES)
    if not (isinstance(scales, StringAttr) and scales.data == "rowwise"):
        return None
    lhs, rhs = op.lhs.type, op.rhs.type
    assert isinstance(lhs, TensorType) and isinstance(rhs, TensorType)
    if not _split_accumulation(op, lhs, rhs):
        return "fwd"
    if _runtime(op) != "inductor":
        return "eager"
    return "fused" if _fusable_readers(op) else "own"


def _fusable_readers(op: ph.MatmulOp) -> bool:
    """Whether every reader of the GEMM's output, through views, is a pointwise op, a reduction
    or a norm of the backward (Inductor fuses a pointwise producer into them), and one at least."""
    frontier: list[SSAValue] = [op.result]
    readers = 0
    while frontier:
        value = frontier.pop()
        for use in value.uses:
            reader = use.operation
            if isinstance(reader, ph.LayoutOp) and reader.is_view:
                frontier.extend(reader.results)
                continue
            if not isinstance(reader, (ph.ElementwiseOp, ph.ReductionOp, ph.NormOp)):
                return False
            if keys.string_of(reader, keys.PHASE, "fwd") != "bwd":
                return False
            readers += 1
    return readers > 0


def _post_scale(how: str | None, m: int, n: int, batch: int, c_elem: int) -> tuple[int, int]:
    """``(bytes, kernels)`` of the pass that scales a rowwise GEMM's ``batch`` outputs of ``m × n``
    elements of ``c_elem`` bytes (:data:`POST_SCALE`); ``(0, 0)`` for any other GEMM."""
    outputs, products, kernels = POST_SCALE[how] if how is not None else (0, 0, 0)
    if kernels == 0:
        return 0, 0
    per_output = outputs * m * n * c_elem + products * m * n * FP32_BYTES + (m + n) * FP32_BYTES
    return batch * per_output, kernels


def _split_accumulation(op: ph.MatmulOp, lhs: TensorType, rhs: TensorType) -> bool:
    """An FP8 GEMM of the backward: Transformer Engine runs the input- and weight-gradient
    GEMMs with split accumulation (``_2X_ACC_DGRAD = _2X_ACC_WGRAD = True``, ``_2X_ACC_FPROP =
    False`` in ``transformer_engine/pytorch/module/base.py``, TE 2.20.0.dev0), and so does
    torchao (``Float8LinearConfig``: ``use_fast_accum`` only for the output's GEMM,
    ``torchao/float8/config.py``, torchao 0.19.0)."""
    fp8 = ph.element_bytes(lhs.element_type) == 1 and ph.element_bytes(rhs.element_type) == 1
    return fp8 and keys.string_of(op, keys.PHASE, "fwd") == "bwd"


def _runtime(op: Operation) -> str:
    """The runtime the op's module forms kernels for (``phaze.kernels``), "ops" without one."""
    parent = _module(op)
    kernels = parent.attributes.get(keys.KERNELS) if parent is not None else None
    return kernels.data if isinstance(kernels, StringAttr) else "ops"


def describe_op(op: Operation) -> OpDesc | None:
    """The latency model's description of ``op``; ``None`` for ops that are not priced
    (anything that is not a ``ComputeOp``: ``func.return``, ``phaze.accelerator``)."""
    if isinstance(op, ph.MatmulOp):
        return matmul_desc(op)
    if isinstance(op, ph.CollectiveOp):
        nbytes = max(ph.tensor_bytes(op.input.type), ph.tensor_bytes(op.result.type))
        return CollectiveDesc(op.kind.data, op.group_size.value.data, nbytes)
    if isinstance(op, ph.LayoutOp) and op.is_view:
        return ViewDesc()
    if isinstance(op, ph.ComputeOp):
        return vector_desc(op)
    return None


class Describer:
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
    describe = Describer()
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


def read_latencies(ops: list[Operation]) -> list[sched.Op]:
    """What the scheduler needs of each op: its unit and its ``phaze.latency`` on one core and
    split over all cores of that unit."""
    out = []
    for o in ops:
        lat = keys.require(o, keys.LATENCY, LatencyAttr)
        out.append(sched.Op(str(lat.get("unit")), float(lat.get("one_s")), float(lat.get("split_s"))))
    return out


def serial_dispatch_s(module: ModuleOp, pass_name: str) -> float | None:
    """``None`` when the module's accelerator runs ops side by side (the ideal model); the
    host's seconds per issued op when it runs them one at a time (``[calibration] execution =
    "serial"``, a GPU)."""
    cal = module_accelerator(module, pass_name).calibration
    return cal.host_dispatch_s if cal is not None and cal.serial else None


def core_counts(module: ModuleOp, pass_name: str) -> dict[str, int]:
    """Cores per unit kind of the module's accelerator (the network is one shared link)."""
    acc = module_accelerator(module, pass_name)
    return {"tensor": acc.tensor_cores.count, "vector": acc.vector_cores.count, "network": 1}


def sum_layer_latencies(module: ModuleOp) -> None:
    """``phaze.layer_latency`` summed from the ops' ``split_s``, as ``phaze-estimate-latency``
    (its one writer) writes it (none without an op in a layer)."""
    layers: list[int] = []
    phases: list[str] = []
    seconds: list[float] = []
    for o in module.walk():
        lat = o.attributes.get(keys.LATENCY)
        layer = o.attributes.get(keys.LAYER)
        if isinstance(lat, LatencyAttr) and isinstance(layer, IntegerAttr):
            layers.append(layer.value.data)
            phases.append(keys.string_of(o, keys.PHASE, "fwd"))
            seconds.append(float(lat.as_dict()["split_s"]))
    totals = layer_totals(layers, phases, seconds) if layers else {}
    records = [
        LayerLatencyAttr.make(index=i, fwd_s=t["fwd"], bwd_s=t["bwd"], opt_s=t["opt"]) for i, t in totals.items()
    ]
    keys.put(module, keys.LAYER_LATENCY, ArrayAttr(records) if records else None)


def refuse_priced(module: ModuleOp, pass_name: str) -> None:
    """A :class:`PhazeError` when ``module``'s ops are priced already (``phaze.layer_latency``
    or an op's ``phaze.latency``): ``pass_name`` says how ops run, which
    ``phaze-estimate-latency`` prices, so it runs before that pass."""
    if keys.LAYER_LATENCY in module.attributes or any(keys.LATENCY in o.attributes for o in module.walk()):
        raise PhazeError(
            f"{pass_name}: the module's ops are priced already ({keys.LATENCY}); run it before "
            "phaze-estimate-latency, which prices what it marks"
        )
