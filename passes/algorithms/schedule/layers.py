"""The layers of a training step as scheduling problems: one group per ``(layer, phase)``
(forward, backward, optimizer step), each solved through a :class:`~.cache.ScheduleCache`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from passes.algorithms.graph import Graph
from passes.algorithms.schedule.cache import ScheduleCache
from passes.algorithms.schedule.problem import Op, Problem, Schedule
from passes.algorithms.schedule.serial import serial_schedule

PHASE_GROUPS = ("fwd", "bwd", "opt")
_STATUS_RANK = {"optimal": 0, "gaplimit": 1, "nodelimit": 2, "timelimit": 3, "heuristic": 4}


def phase_groups(graph: Graph, layer_of: Sequence[int]) -> dict[tuple[int, str], list[int]]:
    """The ops of each ``(layer, phase)`` in program order (a phase outside
    :data:`PHASE_GROUPS` counts as ``fwd``): the groups that are scheduled one by one."""
    groups: dict[tuple[int, str], list[int]] = {}
    for i, op in enumerate(graph.ops):
        phase = op.phase if op.phase in PHASE_GROUPS else "fwd"
        groups.setdefault((layer_of[i], phase), []).append(i)
    return groups


def cast_groups(graph: Graph, groups: Mapping[tuple[int, str], Sequence[int]]) -> dict[int, list[int]]:
    """Each layer's FP8 weight casts (the forward ops that make :meth:`Graph.fp8_weight_copies`:
    a weight's cast and its transposed copy), in program order; none without FP8 linears.
    Scheduled alone (``cast`` beside :data:`PHASE_GROUPS`), their makespan is what the placement
    DP prices once a step rather than per micro-batch (Transformer Engine's cached FP8 weights,
    docs/design.md §5.11.5); they stay in the forward's group too."""
    copies = graph.fp8_weight_copies()
    if not copies:
        return {}
    out: dict[int, list[int]] = {}
    for (layer, phase), ids in groups.items():
        if phase == "fwd":
            casts = [i for i in ids if any(r in copies for r in graph.ops[i].results)]
            if casts:
                out[layer] = casts
    return out


def group_edges(graph: Graph, op_ids: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """The dataflow edges among the ops ``op_ids`` of ``graph``, as sorted pairs of positions in
    ``op_ids`` (values from outside the group are ready at time 0)."""
    pos = {i: k for k, i in enumerate(op_ids)}
    edges = set()
    for i in op_ids:
        for v in graph.ops[i].operands:
            p = graph.values[v].producer
            if p in pos:
                edges.add((pos[p], pos[i]))
    return tuple(sorted(edges))


def group_problem(
    graph: Graph, op_ids: Sequence[int], latency: Sequence[Op] | Mapping[int, Op], cores: Mapping[str, int]
) -> Problem:
    """The scheduling problem of the ops ``op_ids`` of ``graph`` (one layer's ops of one phase):
    their latencies (``latency[i]`` for op ``i``) and :func:`group_edges`."""
    return Problem.make([latency[i] for i in op_ids], group_edges(graph, op_ids), cores)


def network_alone_s(units: Sequence[str], start: Sequence[float], end: Sequence[float]) -> float:
    """The seconds of a schedule in which a ``network`` op (a collective) runs and no other op
    does: the collectives the schedule does not hide behind compute.  ``units[i]`` is op
    ``i``'s unit kind, ``start``/``end`` its times."""
    net = sorted((a, b) for u, a, b in zip(units, start, end) if u == "network" and b > a)
    if not net:
        return 0.0
    busy = sorted((a, b) for u, a, b in zip(units, start, end) if u not in ("network", "none") and b > a)
    # The union of the compute intervals, merged.
    merged: list[list[float]] = []
    for a, b in busy:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    total, reach = 0.0, -float("inf")
    for a, b in net:
        a = max(a, reach)  # the part an earlier collective already counted
        if b <= a:
            continue
        reach = b
        alone = b - a
        for c, d in merged:
            if d > a and c < b:
                alone -= min(b, d) - max(a, c)
        total += alone
    return total


@dataclass
class LayerSchedule:
    """The schedules of one layer: ``groups[phase] = (op ids, Schedule)`` for ``fwd`` and
    ``bwd`` (per micro-batch) and ``opt`` (the optimizer step, once per batch: a group of its
    own, not folded into the backward), and ``cast`` (its forward's FP8 weight casts alone,
    :func:`cast_groups`); ``alone[phase]``: the seconds of that phase's makespan
    in which only collectives run (:func:`network_alone_s`)."""

    index: int
    groups: dict[str, tuple[list[int], Schedule]]
    alone: dict[str, float] = field(default_factory=dict)

    def makespan(self, phase: str) -> float:
        g = self.groups.get(phase)
        return g[1].makespan if g else 0.0

    @property
    def status(self) -> str:
        return max((s.status for _, s in self.groups.values()), key=_STATUS_RANK.__getitem__, default="optimal")

    @property
    def gap(self) -> float:
        return max((s.gap for _, s in self.groups.values()), default=0.0)

    def summary(self) -> dict:
        """The fields of ``#phaze.layer_schedule``."""
        return {
            "index": self.index,
            "fwd_s": self.makespan("fwd"),
            "bwd_s": self.makespan("bwd"),
            "opt_s": self.makespan("opt"),
            "cast_s": self.makespan("cast"),
            "tp_comm_s": self.alone.get("fwd", 0.0) + self.alone.get("bwd", 0.0),
            "status": self.status,
            "gap": self.gap,
        }


def schedule_group(problem: Problem, cache: ScheduleCache, serial_dispatch_s: float | None, **limits: Any) -> Schedule:
    """One group's schedule: solved through ``cache`` (``limits`` as :meth:`ScheduleCache.solve`
    takes them), or, when ``serial_dispatch_s`` is not None (a chip that runs one op at a time,
    issued by the host every that many seconds), :func:`serial_schedule` (no solver, no cache)."""
    if serial_dispatch_s is not None:
        return serial_schedule(problem, serial_dispatch_s)
    return cache.solve(problem, **limits)


def schedule_layers(
    graph: Graph,
    layer_of: Sequence[int],
    latency: Sequence[Op],
    cores: Mapping[str, int],
    cache: ScheduleCache,
    time_limit: float = 10.0,
    seed: int = 0,
    gap_limit: float = 0.0,
    node_limit: int | None = None,
    max_binaries: int | None = None,
    serial_dispatch_s: float | None = None,
) -> list[LayerSchedule]:
    """Schedule every layer's forward, backward and optimizer ops (``latency[i]`` of op ``i``;
    ``layer_of[i]`` its layer).  Identical layers (and any repeated problem) are solved once
    through ``cache``.  ``serial_dispatch_s`` (not None): the chip runs one op at a time, issued by
    the host every that many seconds (:func:`serial_schedule`; no solver, no cache)."""
    groups: dict[tuple[int, str], list[int]] = phase_groups(graph, layer_of)
    groups.update({(layer, "cast"): ids for layer, ids in cast_groups(graph, groups).items()})
    order = (*PHASE_GROUPS, "cast")
    out: dict[int, LayerSchedule] = {}
    for (layer, phase), ids in sorted(groups.items(), key=lambda kv: (kv[0][0], order.index(kv[0][1]))):
        problem = group_problem(graph, ids, latency, cores)
        schedule = schedule_group(
            problem,
            cache,
            serial_dispatch_s,
            time_limit=time_limit,
            seed=seed,
            gap_limit=gap_limit,
            node_limit=node_limit,
            max_binaries=max_binaries,
        )
        entry = out.setdefault(layer, LayerSchedule(layer, {}))
        entry.groups[phase] = (ids, schedule)
        entry.alone[phase] = network_alone_s([o.unit for o in problem.ops], schedule.start, schedule.end)
    return [out[k] for k in sorted(out)]
