"""``phaze-context-parallel``: mark the step as one device of a context-parallel group (its
attentions rings of c steps, which ``phaze-estimate-latency`` prices)."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, IntegerAttr, ModuleOp, StringAttr, TensorType
from xdsl.ir import Operation
from xdsl.passes import ModulePass

from passes.algorithms.context_parallel import backward_ring, forward_ring, off_diagonal_gemm, ring_s, ring_step_s
from passes.algorithms.latency import MatmulDesc, estimate_chip
from passes.cost_view import describe_op, refuse_priced, skipped_flops
from passes.graph_view import step_function
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.attributes import LatencyAttr, LayerInfoAttr
from phaze_ir.errors import PhazeError


@dataclass(frozen=True)
class ContextParallelPass(ModulePass):
    """Mark the step, traced at S/c tokens per sample, as one device of a context-parallel
    group of ``degree`` c: the module gets ``phaze.context_parallel = c``, which
    ``phaze-estimate-latency`` reads to price every fused attention (the ops of one
    ``phaze.fused`` attention kernel) as a ring attention of c steps (:func:`ring_latencies`;
    rules and sources in ``passes/algorithms/context_parallel.py``) and the placement reads for
    its devices; ``phaze.seq_len`` and ``phaze.model_flops`` become the whole sample's, and
    ``phaze.layers``' FLOPs count each attention's c steps (what the devices compute).

    Run before ``phaze-estimate-latency`` (it says how the attentions run; that pass prices
    them): a module whose ops are priced already is refused. Refused on a module with no fused
    attention: the runtimes' context parallelism is ring flash attention (an eager attention
    with its scores in memory has no ring)."""

    name = "phaze-context-parallel"
    degree: int = 1

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        c = self.degree
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            raise PhazeError(f"{self.name}: degree={c!r}: expected a context-parallel degree >= 1")
        if keys.CONTEXT_PARALLEL in op.attributes:
            raise PhazeError(
                f"{self.name}: the module is priced for context parallelism already (its attention, tokens and "
                "FLOPs are scaled): compile the step again to price another degree"
            )
        if c == 1:
            return
        refuse_priced(op, self.name)
        groups = attention_kernels(op)
        if not groups:
            raise PhazeError(
                f"{self.name}: context parallelism {c} needs a fused attention (SDPA, flash attention): the "
                "step has none; build the model with attn_implementation='sdpa'"
            )
        _count_ring_flops(op, groups, c)
        _whole_sequence(op, groups, c)
        op.attributes[keys.CONTEXT_PARALLEL] = ph.int_attr(c)


def ring_latencies(
    module: ModuleOp, acc, c: int
) -> tuple[dict[str, float], int, list[tuple[Operation, dict[str, float | str]]]]:
    """The context-parallel ring of a module of degree ``c`` whose ops
    ``phaze-estimate-latency`` has priced as traced: each fused attention kernel's ops at the
    ring's time (the c steps, the diagonal one the traced (causal) attention, the c−1 others
    its GEMMs unmasked over half the square, with the hops of its keys and values (backward:
    and their gradients) beside the steps as Transformer Engine orders them, on the network
    level of the c·t devices of the ring), each op in proportion (a step is the traced kernel).
    Returns the ``phaze.cp_ring`` fields (the ring summed over the attentions), the bytes one
    forward hop of the first attention carries, and each op's new ``phaze.latency`` fields;
    what ``phaze-estimate-latency`` writes."""
    tp = keys.int_of(module, keys.TP_WIDTH, 1)
    groups = attention_kernels(module)
    ring = dict.fromkeys(("fwd_step_s", "fwd_hop_s", "fwd_ring_s", "bwd_step_s", "bwd_hop_s", "bwd_ring_s"), 0.0)
    kv_of_layer: dict[int, int] = {}
    for ops in groups.values():
        if keys.string_of(ops[0], keys.PHASE, "fwd") == "fwd":
            kv_of_layer.setdefault(_layer(ops[0]), kv_bytes(ops))
    off_s = off_diagonal_seconds(groups, acc)
    scaled: list[tuple[Operation, dict[str, float | str]]] = []
    for name, ops in groups.items():
        lats = [keys.require(o, keys.LATENCY, LatencyAttr).as_dict() for o in ops]
        local = sum(float(lat["split_s"]) for lat in lats)
        if local <= 0:
            continue
        backward = keys.string_of(ops[0], keys.PHASE, "fwd") == "bwd"
        kv = kv_of_layer.get(_layer(ops[0])) or kv_bytes(ops)
        hop, level = ring_step_s(acc.network, kv, c, tp)
        share = acc.network[level].collective_compute_share or 0.0
        off = off_s.get(name, local)
        if backward:
            grad_hop, _ = ring_step_s(acc.network, 2 * kv, c, tp)
            steps = backward_ring(local, off, hop, grad_hop, c)
        else:
            steps = forward_ring(local, off, hop, c)
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
    return ring, next(iter(kv_of_layer.values()), 0), scaled


def _count_ring_flops(module: ModuleOp, groups: dict[str, list[Operation]], c: int) -> None:
    """``phaze.layers``' FLOPs with each attention run c times (the ring's c steps): what the
    devices compute, which the plan's hardware FLOPs (HFU) count."""
    extra: dict[tuple[int, str], int] = {}
    for ops in groups.values():
        key = (_layer(ops[0]), keys.string_of(ops[0], keys.PHASE, "fwd"))
        # each off-diagonal step computes half the traced kernel's square, unmasked: its GEMMs
        # half their FLOPs (off_diagonal_gemm), its other ops what the traced kernel's compute
        computed = sum(
            o.flops() // 2 if _off_diagonal(o) else o.flops() - skipped_flops(o)
            for o in ops
            if isinstance(o, ph.ComputeOp)
        )
        extra[key] = extra.get(key, 0) + (c - 1) * computed
    records = keys.records_of(module, keys.LAYERS, LayerInfoAttr)
    if not records or not extra:
        return
    out = []
    for r in records:
        d = r.as_dict()
        i = int(d["index"])
        d["fwd_flops"] = int(d["fwd_flops"]) + extra.get((i, "fwd"), 0)
        d["bwd_flops"] = int(d["bwd_flops"]) + extra.get((i, "bwd"), 0)
        out.append(LayerInfoAttr.make(**d))
    module.attributes[keys.LAYERS] = ArrayAttr(out)


def _whole_sequence(module: ModuleOp, groups: dict[str, list[Operation]], c: int) -> None:
    """``phaze.seq_len`` and ``phaze.model_flops`` of a whole sample (the trace's are one
    device's S/c): c times the tokens; c times the GEMMs' model FLOPs but attention's, whose
    score and context GEMMs grow with the square of the sequence, c² times."""
    seq = keys.int_of(module, keys.SEQ_LEN, 0)
    if seq:
        module.attributes[keys.SEQ_LEN] = ph.int_attr(seq * c)
    flops = keys.int_of(module, keys.MODEL_FLOPS, 0)
    if flops:
        # phaze.model_flops is the unsharded step's: the attention of the TP-sharded step (its
        # heads split over the TP width) times the width.
        attention = (
            3
            * keys.int_of(module, keys.TP_WIDTH, 1)
            * sum(
                o.flops()
                for ops in groups.values()
                for o in ops
                if isinstance(o, ph.MatmulOp) and keys.string_of(o, keys.PHASE) == "fwd"
            )
        )
        whole = c * (flops - attention) + c * c * attention
        if whole < 2**63:
            module.attributes[keys.MODEL_FLOPS] = ph.int_attr(whole)
        else:
            module.attributes.pop(keys.MODEL_FLOPS)


def _off_diagonal(o: Operation) -> MatmulDesc | None:
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
            twin = _off_diagonal(o)
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


def _layer(o: Operation) -> int:
    """The op's ``phaze.layer`` (0 is the prologue's), -1 without one."""
    layer = o.attributes.get(keys.LAYER)
    return layer.value.data if isinstance(layer, IntegerAttr) else -1
