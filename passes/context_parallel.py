"""``phaze-context-parallel``: mark the step as one device of a context-parallel group (its
attentions rings of c steps, which ``phaze-estimate-latency`` prices)."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, ModuleOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass

from passes.cost_view import refuse_priced, skipped_flops
from passes.how_ops_run import (  # noqa: F401  (kv_bytes: setting.py)
    attention_kernels,
    kv_bytes,
    layer_of,
    off_diagonal_twin,
)
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.attributes import LayerInfoAttr
from phaze_ir.errors import PhazeError


@dataclass(frozen=True)
class ContextParallelPass(ModulePass):
    """Mark the step, traced at S/c tokens per sample, as one device of a context-parallel
    group of ``degree`` c: the module gets ``phaze.context_parallel = c``, which
    ``phaze-estimate-latency`` reads to price every fused attention (the ops of one
    ``phaze.fused`` attention kernel) as a ring attention of c steps
    (:func:`passes.how_ops_run.ring_latencies`;
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


def _count_ring_flops(module: ModuleOp, groups: dict[str, list[Operation]], c: int) -> None:
    """``phaze.layers``' FLOPs with each attention run c times (the ring's c steps): what the
    devices compute, which the plan's hardware FLOPs (HFU) count."""
    extra: dict[tuple[int, str], int] = {}
    for ops in groups.values():
        key = (layer_of(ops[0]), keys.string_of(ops[0], keys.PHASE, "fwd"))
        # each off-diagonal step computes half the traced kernel's square, unmasked: its GEMMs
        # half their FLOPs (off_diagonal_gemm), its other ops what the traced kernel's compute
        computed = sum(
            o.flops() // 2 if off_diagonal_twin(o) else o.flops() - skipped_flops(o)
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
