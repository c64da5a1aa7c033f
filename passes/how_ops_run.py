"""How ops run beside others, as ``phaze-estimate-latency`` prices them: the rings of context
parallelism (:func:`ring_latencies`, the attentions ``phaze-context-parallel`` marks) and the TP
collectives overlapped with their GEMMs (:func:`overlap_latencies`, those
``phaze-overlap-tensor-parallel`` marks).  Shared by those passes (which mark) and the pass that
prices (the one writer of ``phaze.latency``); a helper, not a pass (the marks' rules and sources
are in ``passes/algorithms/context_parallel.py`` and ``passes/algorithms/tp_overlap.py``)."""

from __future__ import annotations

from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr, TensorType
from xdsl.ir import BlockArgument, Operation, SSAValue

from passes.algorithms.context_parallel import (
    RingTensors,
    backward_passes,
    backward_ring,
    forward_passes,
    forward_ring,
    off_diagonal_gemm,
    ring_s,
    ring_step_s,
)
from passes.algorithms.expert_gemms import ExpertGemm, ExpertTimes
from passes.algorithms.expert_gemms import expert_gemm_times as times_of
from passes.algorithms.latency import DescRows, MatmulDesc, VectorDesc, estimate_chip
from passes.algorithms.tiling import tile_gemm_scalar
from passes.algorithms.tp_overlap import (
    FUSED_ALL_GATHER_MATMUL,
    FUSED_MATMUL_REDUCE_SCATTER,
    PLAIN,
    added_s,
    chunk_gemm,
    method_of,
    micro_pipelined_added_s,
    partials_pass,
)
from passes.cost_view import describe_op, rowwise_gemm, skipped_flops
from passes.graph_view import arg_role, grouped_key, step_function
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.attributes import LatencyAttr, LayerInfoAttr
from phaze_ir.errors import PhazeError

#: How far through views and pointwise ops a collective's GEMMs are looked for (the casts,
#: reshapes and residual adds between a TP collective and its linear).
_REACH = 4
#: The collectives TE overlaps (an all-reduce without sequence parallelism is not overlapped).
_OVERLAPPED = ("all_gather", "reduce_scatter")


# -- context parallelism ----------------------------------------------------------------------


def ring_latencies(
    module: ModuleOp, acc, c: int
) -> tuple[dict[str, float], int, list[tuple[Operation, dict[str, float | str]]]]:
    """The context-parallel ring of a module of degree ``c`` whose ops
    ``phaze-estimate-latency`` has priced as traced: each fused attention kernel's ops at the
    ring's time (the c steps, the diagonal one the traced (causal) attention, the c−1 others
    its GEMMs unmasked over half the square, with the hops of its keys and values (backward:
    and their gradients) beside the steps as Transformer Engine orders them, on the network
    level of the c·t devices of the ring, and TE's memory-bound passes around the steps:
    ``forward_passes``, ``backward_passes``), each op in proportion (a step is the traced kernel).
    Returns the ``phaze.cp_ring`` fields (the ring summed over the attentions), the bytes one
    forward hop of the first attention carries, and each op's new ``phaze.latency`` fields;
    what ``phaze-estimate-latency`` writes."""
    tp = keys.int_of(module, keys.TP_WIDTH, 1)
    groups = attention_kernels(module)
    ring = dict.fromkeys(("fwd_step_s", "fwd_hop_s", "fwd_ring_s", "bwd_step_s", "bwd_hop_s", "bwd_ring_s"), 0.0)
    tensors_of_layer: dict[int, RingTensors] = {}
    for ops in groups.values():
        if keys.string_of(ops[0], keys.PHASE, "fwd") == "fwd":
            tensors_of_layer.setdefault(layer_of(ops[0]), ring_tensors(ops))
    off_s = off_diagonal_seconds(groups, acc)
    passes_s = _PassSeconds(acc)
    scaled: list[tuple[Operation, dict[str, float | str]]] = []
    for name, ops in groups.items():
        lats = [keys.require(o, keys.LATENCY, LatencyAttr).as_dict() for o in ops]
        local = sum(float(lat["split_s"]) for lat in lats)
        if local <= 0:
            continue
        backward = keys.string_of(ops[0], keys.PHASE, "fwd") == "bwd"
        tensors = tensors_of_layer.get(layer_of(ops[0])) or ring_tensors(ops)
        kv = tensors.kv
        hop, level = ring_step_s(acc.network, kv, c, tp)
        share = acc.network[level].collective_compute_share or 0.0
        off = off_s.get(name, local)
        if backward:
            grad_hop, _ = ring_step_s(acc.network, 2 * kv, c, tp)
            steps = backward_passes(tensors, c).around(backward_ring(local, off, hop, grad_hop, c), passes_s)
        else:
            steps = forward_passes(tensors, c).around(forward_ring(local, off, hop, c), passes_s)
        total = ring_s(steps, share)
        factor = total / local
        phase = "bwd" if backward else "fwd"
        # a step: the mean of the ring's c; a hop: its transfers over the c−1 hops of the ring
        ring[f"{phase}_step_s"] += sum(x for x, _ in steps) / c
        ring[f"{phase}_hop_s"] += sum(r for _, r in steps) / (c - 1)
        ring[f"{phase}_ring_s"] += total
        for o, lat in zip(ops, lats):
            scaled.append(
                (
                    o,
                    {
                        "one_s": float(lat["one_s"]) * factor,
                        "split_s": float(lat["split_s"]) * factor,
                        "unit": str(lat["unit"]),
                        "bound": str(lat["bound"]),
                    },
                )
            )
    return ring, next((t.kv for t in tensors_of_layer.values()), 0), scaled


class _PassSeconds:
    """Seconds of a ring's memory-bound passes on ``acc``, each priced once as
    ``phaze-estimate-latency`` prices a vector op (its bytes at the chip's HBM rate, its launches)."""

    def __init__(self, acc) -> None:
        self.acc = acc
        self.seconds: dict[VectorDesc, float] = {}

    def __call__(self, d: VectorDesc) -> float:
        if d not in self.seconds:
            self.seconds[d] = float(estimate_chip([d], self.acc).split[0, 0])
        return self.seconds[d]


def ring_tensors(ops: list[Operation]) -> RingTensors:
    """One device's queries, keys and values, and output of a forward attention kernel's ops,
    in bytes, as TE's ring merges them: the first GEMM's left operand (Q), the keys and values of
    :func:`kv_bytes`, the last GEMM's result (the output, ``P·V``)."""
    gemms = [o for o in ops if isinstance(o, ph.MatmulOp)]
    q, out = ph.tensor_type(gemms[0].lhs), ph.tensor_type(gemms[-1].results[0])
    return RingTensors(
        q=ph.tensor_bytes(q), kv=kv_bytes(ops), out=ph.tensor_bytes(out), elem=ph.element_bytes(q.element_type)
    )


def off_diagonal_twin(o: Operation) -> MatmulDesc | None:
    """The off-diagonal step's twin of a fused causal attention GEMM (None for any other op)."""
    d = describe_op(o) if isinstance(o, ph.MatmulOp) else None
    return off_diagonal_gemm(d) if isinstance(d, MatmulDesc) else None


def off_diagonal_seconds(groups: dict[str, list[Operation]], acc) -> dict[str, float]:
    """Seconds of one off-diagonal step of each attention kernel (by its ``phaze.fused`` name):
    its GEMMs as their unmasked twins over half the rows (``off_diagonal_gemm``), priced on
    ``acc`` as ``phaze-estimate-latency`` prices any GEMM, its other ops as traced. A kernel
    with no such GEMM (not causal) is left out: every step is the traced one."""
    twins: list[MatmulDesc] = []
    at: dict[str, list[tuple[int, float]]] = {}  # kernel -> (twin row, the traced GEMM's seconds)
    for name, ops in groups.items():
        for o in ops:
            twin = off_diagonal_twin(o)
            if twin is not None:
                at.setdefault(name, []).append(
                    (len(twins), float(keys.require(o, keys.LATENCY, LatencyAttr).as_dict()["split_s"]))
                )
                twins.append(twin)
    if not twins:
        return {}
    priced = estimate_chip(twins, acc)
    out = {}
    for name, rows in at.items():
        local = sum(float(keys.require(o, keys.LATENCY, LatencyAttr).as_dict()["split_s"]) for o in groups[name])
        out[name] = local + sum(float(priced.split[i, 0]) - traced for i, traced in rows)
    return out


def attention_kernels(module: ModuleOp) -> dict[str, list[Operation]]:
    """The priced ops (:func:`~passes.cost_view.describe_op`) of each fused attention kernel of
    the step, by its ``phaze.fused`` name (a fused dropout, which has no GEMM, is not one), in
    program order."""
    groups: dict[str, list[Operation]] = {}
    for o in step_function(module).body.block.ops:
        fused = o.attributes.get(keys.FUSED)
        if isinstance(fused, StringAttr) and describe_op(o) is not None:
            groups.setdefault(fused.data, []).append(o)
    return {k: ops for k, ops in groups.items() if any(isinstance(o, ph.MatmulOp) for o in ops)}


def kv_bytes(ops: list[Operation]) -> int:
    """The bytes of the keys and values one hop of the ring carries: twice those of the
    forward attention's first GEMM's right operand (``Kᵀ``; V is as large) as the kernel reads
    it, before the kernel's own layout ops (a grouped-query attention's repeat of its K/V heads,
    which TE's kernels do not make), one device's TP share as the step is sharded (a backward
    hop carries these and their gradients)."""
    first = next(o for o in ops if isinstance(o, ph.MatmulOp))
    value = first.rhs
    smallest = ph.tensor_bytes(value.type) if isinstance(value.type, TensorType) else 0
    # back through the kernel's own layout ops (Kᵀ's transpose, a GQA's repeat of the K/V heads)
    inside = {id(o) for o in ops}
    while isinstance(owner := getattr(value, "owner", None), ph.LayoutOp) and id(owner) in inside:
        value = owner.operands[0]
        if isinstance(value.type, TensorType):
            smallest = min(smallest, ph.tensor_bytes(value.type))
    return 2 * smallest


def layer_flops(module: ModuleOp) -> list[dict[str, int]]:
    """Per layer of ``phaze.layers`` (its ``index``, ``fwd_flops``, ``bwd_flops``,
    ``opt_flops``), the FLOPs one device runs as the ops run: the traced ones less what a
    causal attention kernel skips (:func:`~passes.cost_view.skipped_flops`, by the ops'
    ``phaze.kernel``) and, under ``phaze.context_parallel = c``, each fused attention's c - 1
    further ring steps (an off-diagonal step computes half the traced kernel's square,
    unmasked: its GEMMs half their FLOPs, :func:`off_diagonal_twin`; its other ops what the
    traced kernel's compute).  Empty without ``phaze.layers``."""
    records = keys.records_of(module, keys.LAYERS, LayerInfoAttr)
    if not records:
        return []
    delta: dict[tuple[int, str], int] = {}
    for o in step_function(module).body.block.ops:
        skipped = skipped_flops(o)
        if skipped and isinstance(o.attributes.get(keys.LAYER), IntegerAttr):
            key = (layer_of(o), keys.string_of(o, keys.PHASE, "fwd"))
            delta[key] = delta.get(key, 0) - skipped
    c = keys.int_of(module, keys.CONTEXT_PARALLEL, 1)
    for ops in attention_kernels(module).values() if c > 1 else ():
        key = (layer_of(ops[0]), keys.string_of(ops[0], keys.PHASE, "fwd"))
        computed = sum(
            o.flops() // 2 if off_diagonal_twin(o) else o.flops() - skipped_flops(o)
            for o in ops
            if isinstance(o, ph.ComputeOp)
        )
        delta[key] = delta.get(key, 0) + (c - 1) * computed
    out = []
    for r in records:
        d = r.as_dict()
        i = int(d["index"])
        out.append(
            {
                "index": i,
                "fwd_flops": int(d["fwd_flops"]) + delta.get((i, "fwd"), 0),
                "bwd_flops": int(d["bwd_flops"]) + delta.get((i, "bwd"), 0),
                "opt_flops": int(d["opt_flops"]),
            }
        )
    return out


def layer_of(o: Operation) -> int:
    """The op's ``phaze.layer`` (0 is the prologue's), -1 without one."""
    layer = o.attributes.get(keys.LAYER)
    return layer.value.data if isinstance(layer, IntegerAttr) else -1


# -- TP overlap ------------------------------------------------------------------------------


def overlap_sm_margin(module: ModuleOp) -> bool:
    """Whether the module's overlapped GEMMs run without the communication's SMs: Transformer
    Engine launches the GEMMs of its pipeline and bulk overlaps so (``tp_overlap.py``); torch's
    micro-pipelined TP (torchtitan's async TP, the compiled runtime's) keeps every SM for them."""
    return not micro_pipelined(module)


def micro_pipelined(module: ModuleOp) -> bool:
    """Whether the module's TP overlap is torch's micro-pipelined TP (``--kernels inductor``:
    torchtitan's async TP), not Transformer Engine's userbuffers (``tp_overlap.py``)."""
    runtime = module.attributes.get(keys.KERNELS)
    return isinstance(runtime, StringAttr) and runtime.data == "inductor"


def overlap_latencies(module: ModuleOp, acc, pass_name: str) -> list[tuple[Operation, dict[str, float | str]]]:
    """Each overlapped TP collective of a module marked ``phaze.tp_overlap`` whose ops
    ``phaze-estimate-latency`` has priced, with its new ``phaze.latency`` fields: what it adds
    to the GEMMs beside it (:func:`overlapped`), by Transformer Engine's method on the chip's
    SMs, each GEMM hiding at most its own time once (in program order); or, torch's
    micro-pipelined TP, by its fused op with each GEMM's chunks priced at their shape
    (:func:`micro_pipelined_latencies`); what ``phaze-estimate-latency`` writes."""
    tp = keys.int_of(module, keys.TP_WIDTH, 1)
    sms = sm_count(acc, pass_name)
    if micro_pipelined(module):
        return micro_pipelined_latencies(module, acc)
    margin = overlap_sm_margin(module)
    budget: dict[int, float] = {}  # seconds of each GEMM not yet hiding a collective
    out: list[tuple[Operation, dict[str, float | str]]] = []
    for o, method, gemms in overlapped(step_function(module)):
        beside = 0.0
        for g in gemms:
            beside += budget.setdefault(id(g), _split(g))
        lat = keys.require(o, keys.LATENCY, LatencyAttr).as_dict()
        comm = float(lat["split_s"])
        added = added_s(method, comm, beside, tp, sms, margin)
        hidden = comm - added if added < comm else 0.0
        for g in gemms:  # the time it hid is no longer free beside these GEMMs
            take = min(budget[id(g)], hidden)
            budget[id(g)] -= take
            hidden -= take
        out.append((o, {"one_s": added, "split_s": added, "unit": str(lat["unit"]), "bound": str(lat["bound"])}))
    return out


def micro_pipelined_latencies(module: ModuleOp, acc) -> list[tuple[Operation, dict[str, float | str]]]:
    """Each TP all-gather and reduce-scatter of the module as torch's micro-pipelined TP runs it
    (:func:`overlapped` with ``micro_pipelined``), with its new ``phaze.latency`` fields: what
    its fused op adds to its GEMMs as traced, the GEMMs' chunks (``tp_overlap.chunk_gemm``) and
    the partials' sum (``tp_overlap.partials_pass``) priced on ``acc`` as any op is
    (:func:`~passes.algorithms.latency.estimate_chip`); a plain one, all of its time."""
    tp = keys.int_of(module, keys.TP_WIDTH, 1)
    found = overlapped(step_function(module), micro_pipelined=True)
    rows_of = DescRows()
    row, descs = rows_of.row, rows_of.descs
    wanted = []
    for _, method, gemms in found:
        whole = [describe_op(g) for g in gemms]
        chunks = [row(chunk_gemm(d, tp)) for d in whole if isinstance(d, MatmulDesc)]
        last = whole[-1] if whole else None
        reduce = (
            row(partials_pass(last, tp))
            if method == FUSED_MATMUL_REDUCE_SCATTER and isinstance(last, MatmulDesc)
            else None
        )
        wanted.append((chunks, reduce))
    priced = estimate_chip(descs, acc) if descs else None
    out: list[tuple[Operation, dict[str, float | str]]] = []
    for (o, method, gemms), (chunks, reduce) in zip(found, wanted):
        lat = keys.require(o, keys.LATENCY, LatencyAttr).as_dict()
        chunk_s = sum(float(priced.split[r, 0]) for r in chunks) if priced is not None else 0.0
        reduce_s = float(priced.split[reduce, 0]) if priced is not None and reduce is not None else 0.0
        gemm_s = sum(_split(g) for g in gemms)
        added = micro_pipelined_added_s(method, float(lat["split_s"]), gemm_s, chunk_s, tp, reduce_s)
        out.append((o, {"one_s": added, "split_s": added, "unit": str(lat["unit"]), "bound": str(lat["bound"])}))
    return out


def overlapped(fn: func.FuncOp, micro_pipelined: bool = False) -> list[tuple[ph.CollectiveOp, str, list[ph.MatmulOp]]]:
    """Each TP all-gather and reduce-scatter of the step ``fn``, in program order, with
    Transformer Engine's method for it and the GEMMs beside it (those that read its result, for
    an all-gather; those whose output it reduces, for a reduce-scatter): what the pass overlaps,
    and what the ``--hw`` sweep's settings record of it (``phaze/search/setting.py``).
    ``micro_pipelined``: as torch's micro-pipelined TP fuses them instead
    (``passes/algorithms/tp_overlap.py``): an all-gather with the GEMMs that multiply its result
    by a weight (its matmuls' left operand; the weight gradient's reads it transposed), a
    reduce-scatter with the one GEMM whose output it reduces through views alone (an add of
    several GEMMs' outputs, a backward's input gradient summed over q, k and v, matches no
    pattern); each GEMM in one fused op, the first; the rest plain, with no GEMM."""
    params = {fn.body.block.args[i] for i in range(len(fn.body.block.args)) if arg_role(fn, i)[0] == "param"}
    out = []
    fused: set[int] = set()
    for o in fn.body.block.ops:
        if not (isinstance(o, ph.CollectiveOp) and o.kind.data in _OVERLAPPED):
            continue
        gather = o.kind.data == "all_gather"
        gemms = _gemms(o, forward=gather)
        if gather and any(rowwise_gemm(g) is not None for g in gemms):
            # torch's micro-pipelined TP (the one runtime of torchao's rowwise GEMMs) fuses their
            # matmul-reduce-scatters but not their all-gather-matmuls (pytorch/pytorch issue
            # 149990, 2025-03, open): the all-gather runs whole before them, nothing beside it
            gemms = []
        phase = keys.string_of(o, keys.PHASE, "fwd")
        if micro_pipelined:
            if gather:
                gemms = [g for g in _consumer_gemms(o) if id(g) not in fused]
            else:
                gemms = _gemms(o, forward=False, through=_is_view)
                gemms = gemms if len(gemms) == 1 and id(gemms[0]) not in fused else []
            fused.update(id(g) for g in gemms)
            method = (FUSED_ALL_GATHER_MATMUL if gather else FUSED_MATMUL_REDUCE_SCATTER) if gemms else PLAIN
            out.append((o, method, gemms))
            continue
        feeds = gather and any(_reads_weight(g, params) for g in gemms)
        out.append((o, method_of(o.kind.data, phase, feeds), gemms))
    return out


def sm_count(acc, pass_name: str) -> int:
    """The chip's SMs (``[calibration] wave_units``), or a one-line error without them."""
    units = acc.calibration.wave_units if acc.calibration is not None else None
    if not units:
        raise PhazeError(
            f"{pass_name}: chip '{acc.name}' has no SM count ([calibration] wave_units): TP overlap is priced by "
            "the SMs Transformer Engine's communication kernels hold"
        )
    return int(units)


def _split(o: Operation) -> float:
    return float(keys.require(o, keys.LATENCY, LatencyAttr).as_dict()["split_s"])


def _passes_through(o: Operation) -> bool:
    """A view or a pointwise op between a collective and its GEMM."""
    return isinstance(o, (ph.LayoutOp, ph.ElementwiseOp))


def _is_view(o: Operation) -> bool:
    """A view between a collective and its GEMM (the reshapes Inductor's patterns allow)."""
    return isinstance(o, ph.LayoutOp)


def _gemms(c: ph.CollectiveOp, forward: bool, through=_passes_through) -> list[ph.MatmulOp]:
    """The GEMMs an all-gather's result reaches (``forward``), or that reach a reduce-scatter's
    operand, through at most :data:`_REACH` ops ``through`` lets pass (views and pointwise ops)."""
    found: list[ph.MatmulOp] = []
    frontier: list[SSAValue] = list(c.results) if forward else list(c.operands)
    seen: set[int] = set()
    for _ in range(_REACH + 1):
        nxt: list[SSAValue] = []
        for v in frontier:
            nearby = [u.operation for u in v.uses] if forward else [v.owner]
            for o in nearby:
                if not isinstance(o, Operation) or id(o) in seen:
                    continue
                seen.add(id(o))
                if isinstance(o, ph.MatmulOp):
                    found.append(o)
                elif through(o):
                    nxt += list(o.results) if forward else list(o.operands)
        frontier = nxt
    return found


def _consumer_gemms(c: ph.CollectiveOp) -> list[ph.MatmulOp]:
    """The GEMMs an all-gather's result reaches as their left operand, through at most
    :data:`_REACH` views and pointwise ops, split along its rows (M, the gathered tokens; not K
    as the weight gradient's ``Xᵀ·dY`` is): the consumers Inductor's ``micro_pipeline_tp`` fuses
    with it (``_find_consumer_matmuls``)."""
    result = c.results[0]
    shape = result.type.get_shape() if isinstance(result.type, TensorType) else ()
    rows = 1
    for x in shape[:-1]:
        rows *= x
    found: list[ph.MatmulOp] = []
    frontier: list[SSAValue] = [result]
    seen: set[int] = set()
    for _ in range(_REACH + 1):
        nxt: list[SSAValue] = []
        for v in frontier:
            for u in v.uses:
                o = u.operation
                if id(o) in seen:
                    continue
                if isinstance(o, ph.MatmulOp):
                    d = describe_op(o)
                    if u.index == 0 and isinstance(d, MatmulDesc) and not d.rhs_batched and d.batch * d.m == rows:
                        seen.add(id(o))
                        found.append(o)
                elif _passes_through(o):
                    seen.add(id(o))
                    nxt += list(o.results)
        frontier = nxt
    return found


def _reads_weight(g: ph.MatmulOp, params: set) -> bool:
    """Whether the GEMM multiplies by a weight (an input-gradient or forward GEMM, not a
    weight-gradient one): an operand that is a parameter, through views."""
    for v in (g.lhs, g.rhs):
        for _ in range(_REACH + 1):
            if isinstance(v, BlockArgument):
                if v in params:
                    return True
                break
            owner = v.owner
            if not isinstance(owner, ph.LayoutOp) or not owner.operands:
                break
            v = owner.operands[0]
    return False


# -- expert parallelism ----------------------------------------------------------------------


def expert_gemm_ops(module: ModuleOp) -> dict[int, tuple[int, int, list[tuple[Operation, MatmulDesc, bool]]]]:
    """Per MoE layer (by ``phaze.layer``): its experts, its routed rows per expert and its
    expert GEMMs in program order, each with its description and whether the backward runs it.
    A layer's expert GEMMs are the ``phaze.matmul`` ops of its forward and backward cut from an
    ``aten._grouped_mm`` (``graph_view.grouped_key``) over all of its experts
    (``phaze.layers``' ``experts``); its rows per expert are the rows of its first forward one
    (the dispatched tokens, as ``dispatch_bytes`` reads them).  None without ``phaze.layers``."""
    infos = (a.as_dict() for a in keys.records_of(module, keys.LAYERS, LayerInfoAttr))
    experts = {int(r["index"]): int(r["experts"]) for r in infos}
    fn = step_function(module)
    ids: dict[SSAValue, int] = {}
    for a in fn.body.block.args:
        ids.setdefault(a, len(ids))
    for o in fn.body.block.ops:
        for v in o.results:
            ids.setdefault(v, len(ids))
    found: dict[int, list[tuple[Operation, MatmulDesc, bool]]] = {}
    rows: dict[int, int] = {}
    for o in fn.body.block.ops:
        layer = layer_of(o)
        if not isinstance(o, ph.MatmulOp) or experts.get(layer, 0) <= 0 or not grouped_key(o, ids):
            continue
        d = describe_op(o)
        phase = keys.string_of(o, keys.PHASE, "fwd")
        if not isinstance(d, MatmulDesc) or d.batch != experts[layer] or phase not in ("fwd", "bwd"):
            continue
        if phase == "fwd":
            rows.setdefault(layer, d.m)
        found.setdefault(layer, []).append((o, d, phase == "bwd"))
    return {layer: (experts[layer], rows[layer], gemms) for layer, gemms in found.items() if layer in rows}


def expert_gemm_times(module: ModuleOp, acc) -> dict[int, tuple[ExpertTimes, ...]]:
    """Per MoE layer (by ``phaze.layer``), its expert GEMMs (:func:`expert_gemm_ops`) at every
    EP degree, at the shape one member of the EP group runs them
    (``passes/algorithms/expert_gemms.py``), priced on ``acc`` as ``phaze-estimate-latency``
    prices any GEMM (each tiled as ``phaze-tile-pe-array`` tiles it, then
    :func:`~passes.algorithms.latency.estimate_chip`: at e = 1 the traced GEMMs' own
    ``split_s``); selective recompute re-runs those ``phaze-insert-recompute`` marks."""
    tc = acc.tensor_cores

    def price(descs: list[MatmulDesc]) -> list[float]:
        tilings = [tile_gemm_scalar(d.batch, d.m, d.n, d.k, tc.pe_x, tc.pe_y, tc.count, tc.buffer_bytes) for d in descs]
        priced = estimate_chip(descs, acc, tilings)
        return [float(priced.split[i, 0]) for i in range(len(descs))]

    out = {}
    for layer, (experts, rows, ops) in expert_gemm_ops(module).items():
        gemms = [ExpertGemm(d, backward, not backward and keys.RECOMPUTE in o.attributes) for o, d, backward in ops]
        out[layer] = times_of(gemms, experts, rows, price)
    return out
