"""``phaze-insert-recompute``: activation memory and recompute time per layer and policy, and the
layers' memory for the placement DP."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, ModuleOp

from passes.algorithms import schedule as sched
from passes.algorithms.memory import STATE_BYTES_PER_ELEMENT
from passes.algorithms.recompute import parse_selective
from passes.cost_view import core_counts, read_latencies, serial_dispatch_s
from passes.recompute_view import static_costs
from passes.solver_options import SolverOptions
from phaze_ir import keys
from phaze_ir.attributes import (
    LayerMemoryAttr,
    LayerRecomputeAttr,
    LayerScheduleAttr,
    RecomputePolicy,
    RecomputePolicyAttr,
)
from phaze_ir.errors import PhazeError
from phaze_ir.files import excerpt


@dataclass(frozen=True)
class InsertRecomputePass(SolverOptions):
    """Price activation recomputation per layer (``passes/algorithms/recompute.py``) and the
    layers' memory (``passes/algorithms/memory.py``).

    Writes ``phaze.recompute = #phaze<recompute_policy selective>`` on the forward ops that selective recompute re-runs
    in backward (each attention core: ``Q·Kᵀ``, scaling and mask, softmax, dropout, ``·V``,
    found by structure), and on the module ``phaze.layer_recompute`` (per layer:
    ``#phaze.layer_recompute`` with the bytes stashed per micro-batch under none / selective / full
    recompute and the extra forward time of selective and full: the scheduled makespan of the
    attention cores, of the whole forward) and ``phaze.layer_memory`` (``#phaze.layer_memory``:
    parameters, gradients, optimizer state, stashes, workspace).  A step whose kernels are
    Inductor's (``phaze.kernels = "inductor"``) stashes with no recompute what
    ``torch.compile``'s min-cut partitioner saves (``passes/algorithms/partition.py``), not
    what eager autograd saves.

    Requires ``phaze-schedule-ops`` (``phaze.layer_schedule``; the attention cores are scheduled
    here, through the schedule cache handed in, as ``phaze-schedule-ops`` does).  Options:
    ``selective`` = ``attention`` (default: Megatron-LM's selective recompute, above), ``op``
    (torchtitan's per-op selective checkpointing), ``layer:N`` (torchtitan's every N-th block
    checkpointed whole) or ``share:P`` (fms-fsdp's share P of the blocks checkpointed whole):
    what the selective policy re-runs (``passes/algorithms/recompute.py``);
    ``optimizer`` = ``""`` (default: the optimizer state the ``phaze.optimizer_update`` ops carry;
    Adam's 12 bytes per parameter element when there are none), ``adam`` or ``sgd``;
    ``time_limit``, ``gap_limit``, ``node_limit``, ``max_binaries`` and ``seed`` as
    ``phaze-schedule-ops``.
    """

    name = "phaze-insert-recompute"
    optimizer: str = ""
    selective: str = "attention"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.optimizer not in ("",) + tuple(STATE_BYTES_PER_ELEMENT):
            raise PhazeError(
                f"{self.name}: optimizer={self.optimizer}: expected one of "
                f"{', '.join(STATE_BYTES_PER_ELEMENT)} (or nothing: read the optimizer updates)"
            )
        try:
            selective = parse_selective(self.selective)
        except ValueError as err:
            raise PhazeError(f"{self.name}: selective={excerpt(self.selective)}: {err}") from None
        limits = self.solver_limits()
        cache = self.schedule_cache()
        records = keys.require_records(op, keys.LAYER_SCHEDULE, LayerScheduleAttr)
        fwd_s = {r.get("index"): r.get("fwd_s") for r in records}
        graph, ops, layer_of, recompute, memory = static_costs(op, self.optimizer, self.name, selective)
        latency = read_latencies(ops)
        cores = core_counts(op, self.name)
        serial = serial_dispatch_s(op, self.name)
        missing = sorted(set(layer_of) - set(fwd_s))
        if missing:
            raise PhazeError(
                f"{self.name}: '{keys.LAYER_SCHEDULE}' has no record of layer {missing[0]}; "
                "run phaze-schedule-ops again"
            )

        selective_s = []
        for rc in recompute:
            if rc.selective_ops:
                problem = sched.group_problem(graph, rc.selective_ops, latency, cores)
                selective_s.append(sched.schedule_group(problem, cache, serial, **limits).makespan)
            else:
                selective_s.append(0.0)

        for o in ops:
            o.attributes.pop(keys.RECOMPUTE, None)
        for rc in recompute:
            for i in rc.selective_ops:
                ops[i].attributes[keys.RECOMPUTE] = RecomputePolicyAttr(RecomputePolicy.SELECTIVE)
        op.attributes[keys.LAYER_RECOMPUTE] = ArrayAttr(
            [
                LayerRecomputeAttr.make(
                    index=rc.index,
                    none_bytes=rc.none_bytes,
                    selective_bytes=rc.selective_bytes,
                    full_bytes=rc.full_bytes,
                    selective_s=float(selective_s[rc.index]),
                    full_s=float(fwd_s[rc.index]),
                )
                for rc in recompute
            ]
        )
        op.attributes[keys.LAYER_MEMORY] = ArrayAttr([LayerMemoryAttr.make(**m.record()) for m in memory])
