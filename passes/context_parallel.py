"""``phaze-context-parallel``: mark the step as one device of a context-parallel group (its
attentions rings of c steps, which ``phaze-estimate-latency`` prices)."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from passes.cost_view import refuse_priced
from passes.how_ops_run import attention_kernels
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.errors import PhazeError


@dataclass(frozen=True)
class ContextParallelPass(ModulePass):
    """Mark the step, traced at S/c tokens per sample, as one device of a context-parallel
    group of ``degree`` c: the module gets ``phaze.context_parallel = c``, which
    ``phaze-estimate-latency`` reads to price every fused attention (the ops of one
    ``phaze.fused`` attention kernel) as a ring attention of c steps
    (:func:`passes.how_ops_run.ring_latencies`;
    rules and sources in ``passes/algorithms/context_parallel.py``) and the placement reads for
    its devices (the whole sample's tokens and model FLOPs, :func:`phaze_ir.keys.sample_seq_len`
    and :func:`~phaze_ir.keys.sample_model_flops`, scale the traced ones by it; the FLOPs the
    devices run, each attention's c steps, are ``phaze-estimate-latency``'s ``phaze.layer_flops``).

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
                f"{self.name}: the module is priced for context parallelism already (its attention and "
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
        op.attributes[keys.CONTEXT_PARALLEL] = ph.int_attr(c)
