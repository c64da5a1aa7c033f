"""``phaze-overlap-tensor-parallel``: mark the TP all-gathers and reduce-scatters as overlapped with
the GEMMs beside them, as Transformer Engine's userbuffers run them, or, under ``--kernels inductor``,
as torch's micro-pipelined TP fuses them (``phaze-estimate-latency`` prices them so)."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, UnitAttr
from xdsl.passes import ModulePass

from passes.cost_view import refuse_priced
from passes.how_ops_run import overlapped, sm_count  # noqa: F401  (overlapped: setting.py)
from phaze_ir import keys
from phaze_ir.errors import PhazeError
from phaze_ir.hardware_ir import module_accelerator


@dataclass(frozen=True)
class OverlapTensorParallelPass(ModulePass):
    """Mark each TP all-gather and reduce-scatter of a step sharded with sequence parallelism as
    run beside its GEMMs (those that read its result, for an all-gather; those whose output it
    reduces, for a reduce-scatter; through views and pointwise ops), by Transformer Engine's
    method for it (the compiled runtime's: by torch's micro-pipelined TP's fused ops, the
    collectives Inductor does not fuse left whole): the module gets ``phaze.tp_overlap``, which
    ``phaze-estimate-latency`` reads to price each such collective at what it adds to those
    GEMMs, each GEMM hiding at most its own time once, in program order
    (:func:`passes.how_ops_run.overlap_latencies`; rules and sources in
    ``passes/algorithms/tp_overlap.py``).

    Run before ``phaze-estimate-latency`` (it says how the collectives run; that pass prices
    them): a module whose ops are priced already is refused. Needs the chip's SM count
    (``[calibration] wave_units``: TE's communication kernels hold some of them) and a step
    sharded with sequence parallelism."""

    name = "phaze-overlap-tensor-parallel"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if keys.TP_OVERLAP in op.attributes:
            raise PhazeError(
                f"{self.name}: the module is priced with TP overlap already: compile the step again to price it without"
            )
        tp = keys.int_of(op, keys.TP_WIDTH, 1)
        if tp == 1:
            return
        if keys.SEQUENCE_PARALLEL not in op.attributes:
            raise PhazeError(
                f"{self.name}: TP overlap runs on sequence parallelism's all-gathers and reduce-scatters; the step "
                "is sharded without it (phaze-shard-tensor-parallel{sequence_parallel=true})"
            )
        sm_count(module_accelerator(op, self.name), self.name)
        refuse_priced(op, self.name)
        op.attributes[keys.TP_OVERLAP] = UnitAttr()
