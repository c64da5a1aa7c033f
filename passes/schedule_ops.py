"""``phaze-schedule-ops``: schedule every layer's ops on one chip with SCIP."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, IntegerAttr, ModuleOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass

from passes.algorithms import schedule as sched
from passes.graph_view import build_graph, step_function
from phaze_ir import dialect as ph
from phaze_ir.attributes import LatencyAttr, LayerScheduleAttr, SchedAttr
from phaze_ir.errors import PhazeError
from phaze_ir.hardware_ir import module_accelerator

SCHED_ATTR = "phaze.sched"
LAYER_SCHEDULE_ATTR = "phaze.layer_schedule"
LATENCY_ATTR = "phaze.latency"


def core_counts(module: ModuleOp, pass_name: str) -> dict[str, int]:
    """Cores per unit kind of the module's accelerator (the network is one shared link)."""
    acc = module_accelerator(module, pass_name)
    return {"tensor": acc.tensor_cores.count, "vector": acc.vector_cores.count, "network": 1}


def read_latencies(ops: list[Operation], pass_name: str) -> list[sched.Op]:
    out = []
    for o in ops:
        lat = o.attributes.get(LATENCY_ATTR)
        if not isinstance(lat, LatencyAttr):
            raise PhazeError(f"'{o.name}' op requires '{LATENCY_ATTR}'; run phaze-estimate-latency first ({pass_name})")
        out.append(sched.Op(lat.get("unit"), lat.get("one_s"), lat.get("split_s")))
    return out


def read_layers(ops: list[Operation], pass_name: str) -> list[int]:
    out = []
    for o in ops:
        layer = o.attributes.get(ph.LAYER_ATTR)
        if not isinstance(layer, IntegerAttr):
            raise PhazeError(f"'{o.name}' op requires '{ph.LAYER_ATTR}'; run phaze-group-layers first ({pass_name})")
        out.append(layer.value.data)
    return out


def solver_limits(
    pass_name: str, time_limit: float, seed: int, gap_limit: float = 0.0, node_limit: int = 0, max_binaries: int = 0
) -> dict:
    """The pass options, checked, as :func:`passes.algorithms.schedule.solve` takes them (a
    node or binaries limit of 0, no limit, becomes None)."""
    if node_limit < 0:
        raise PhazeError(f"{pass_name}: node_limit={node_limit}: expected a number of nodes >= 0 (0: no limit)")
    if not time_limit > 0:
        raise PhazeError(f"{pass_name}: time_limit={time_limit}: expected a positive number of seconds")
    if not 0 <= gap_limit < 1:
        raise PhazeError(f"{pass_name}: gap_limit={gap_limit}: expected a relative gap in [0, 1)")
    return {
        "time_limit": time_limit,
        "seed": seed,
        "gap_limit": gap_limit,
        "node_limit": node_limit if node_limit > 0 else None,
        "max_binaries": max_binaries if max_binaries > 0 else None,
    }


def scheduled_layers(
    module: ModuleOp,
    pass_name: str,
    time_limit: float,
    seed: int,
    gap_limit: float = 0.0,
    node_limit: int = 0,
    max_binaries: int = 0,
):
    """The step's graph and ops, and the schedules of its layers (see ``schedule_layers``)."""
    limits = solver_limits(pass_name, time_limit, seed, gap_limit, node_limit, max_binaries)
    fn = step_function(module)
    graph, ops = build_graph(fn)
    cores = core_counts(module, pass_name)
    latency = read_latencies(ops, pass_name)
    layer_of = read_layers(ops, pass_name)
    layers = sched.schedule_layers(graph, layer_of, latency, cores, **limits)
    return graph, ops, layer_of, latency, cores, layers


@dataclass(frozen=True)
class SolverOptions(ModulePass):
    """The layer-schedule solver's options, shared by the passes that schedule layers
    (``phaze-schedule-ops``, ``phaze-insert-recompute``; see the former for their meaning)."""

    time_limit: float | int = 10.0
    seed: int = 0
    gap_limit: float | int = 0.0
    node_limit: int = 0
    max_binaries: int = 0

    def solver_limits(self) -> dict:
        """These options, checked, as keyword arguments of the solver (see :func:`solver_limits`)."""
        return solver_limits(self.name, self.time_limit, self.seed, self.gap_limit, self.node_limit, self.max_binaries)


@dataclass(frozen=True)
class ScheduleOpsPass(SolverOptions):
    """Minimize the makespan of each layer's forward, backward and optimizer ops on the
    module's accelerator (``passes/algorithms/schedule.py``: a MILP solved by SCIP, warm started
    from a list schedule; each op on one core or split over all cores of its unit; ops the
    graph leaves unordered may overlap on different cores).  Structurally identical layers are
    solved once (a process-wide cache keyed by the ops' latencies, edges and core counts).

    Writes ``phaze.sched = #phaze.sched<start_s, end_s, cores>`` on every op (times from the
    start of its layer's phase) and ``phaze.layer_schedule`` on the module (per layer: forward
    and backward makespans per micro-batch, the optimizer step's, solver status and gap).

    Requires ``phaze.latency`` (``phaze-estimate-latency``), ``phaze.layer``
    (``phaze-group-layers``) and the accelerator.  Options: ``time_limit`` (seconds per solve;
    the best schedule found and its proven gap are kept when it runs out), ``gap_limit`` (stop
    a solve once its relative gap is that small; default 0, prove optimality), ``node_limit``
    (stop after that many branch-and-bound nodes; default 0, no limit: a node limit, unlike the
    clock, gives the same schedules on any machine), ``max_binaries`` (a MILP with more binaries
    keeps its warm start instead; default 0, no limit), ``seed`` (SCIP's random seed).  The optimizer step is a group of its own (once per batch), not folded into
    the backward.
    """

    name = "phaze-schedule-ops"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        _, ops, _, _, _, layers = scheduled_layers(
            op, self.name, self.time_limit, self.seed, self.gap_limit, self.node_limit, self.max_binaries
        )
        for layer in layers:
            for ids, s in layer.groups.values():
                for k, i in enumerate(ids):
                    ops[i].attributes[SCHED_ATTR] = SchedAttr.make(
                        start_s=float(s.start[k]), end_s=float(s.end[k]), cores=int(s.cores[k])
                    )
        op.attributes[LAYER_SCHEDULE_ATTR] = ArrayAttr([LayerScheduleAttr.make(**l.summary()) for l in layers])
