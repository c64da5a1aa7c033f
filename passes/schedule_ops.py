"""``phaze-schedule-ops``: schedule every layer's ops on one chip with SCIP."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, ModuleOp

from passes.algorithms import schedule as sched
from passes.cost_view import core_counts, read_latencies, serial_dispatch_s
from passes.graph_view import build_graph, read_layers, step_function
from passes.solver_options import SolverOptions
from phaze_ir import keys
from phaze_ir.attributes import LayerScheduleAttr, SchedAttr


def scheduled_layers(module: ModuleOp, pass_name: str, limits: dict, cache: sched.ScheduleCache):
    """The step's graph and ops, and the schedules of its layers (see ``schedule_layers``)."""
    fn = step_function(module)
    graph, ops = build_graph(fn, signatures=False)
    cores = core_counts(module, pass_name)
    latency = read_latencies(ops)
    layer_of = read_layers(ops)
    serial = serial_dispatch_s(module, pass_name)
    layers = sched.schedule_layers(graph, layer_of, latency, cores, cache=cache, serial_dispatch_s=serial, **limits)
    return graph, ops, layer_of, latency, cores, layers


@dataclass(frozen=True)
class ScheduleOpsPass(SolverOptions):
    """Minimize the makespan of each layer's forward, backward and optimizer ops on the
    module's accelerator (``passes/algorithms/schedule/``: a MILP solved by SCIP, warm started
    from a list schedule; each op on one core or split over all cores of its unit; ops the
    graph leaves unordered may overlap on different cores).  Structurally identical layers are
    solved once (through the schedule cache, keyed by the ops' latencies, edges and core counts).

    Writes ``phaze.sched = #phaze.sched<start_s, end_s, cores>`` on every op (times from the
    start of its layer's phase) and ``phaze.layer_schedule`` on the module (per layer: forward
    and backward makespans per micro-batch, the optimizer step's, solver status and gap).

    Requires ``phaze.latency`` (``phaze-estimate-latency``), ``phaze.layer``
    (``phaze-group-layers``) and the accelerator.  Options: ``time_limit`` (seconds per solve;
    the best schedule found and its proven gap are kept when it runs out), ``gap_limit`` (stop
    a solve once its relative gap is that small; default 0, prove optimality), ``node_limit``
    (stop after that many branch-and-bound nodes; default 0, no limit: a node limit, unlike the
    clock, gives the same schedules on any machine), ``max_binaries`` (a MILP with more binaries
    keeps its warm start instead; default 0, no limit), ``seed`` (SCIP's random seed).  The
    optimizer step is a group of its own (once per batch), not folded into the backward.
    On a chip whose hardware says ``[calibration] execution = "serial"`` (a GPU), each layer's
    ops run one after the other, each on all cores of its unit, as the host issues them: no
    solver.
    """

    name = "phaze-schedule-ops"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        _, ops, _, _, _, layers = scheduled_layers(op, self.name, self.solver_limits(), self.schedule_cache())
        for layer in layers:
            for phase, (ids, s) in layer.groups.items():
                if phase == "cast":  # the forward's casts again, alone: their times are the forward's
                    continue
                for k, i in enumerate(ids):
                    ops[i].attributes[keys.SCHED] = SchedAttr.make(
                        start_s=float(s.start[k]), end_s=float(s.end[k]), cores=int(s.cores[k])
                    )
        op.attributes[keys.LAYER_SCHEDULE] = ArrayAttr([LayerScheduleAttr.make(**layer.summary()) for layer in layers])
