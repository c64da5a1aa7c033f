"""A *setting* of the search: one model traced at one micro-batch size and sharded for one TP
width, reduced to the plain data that pricing it on any architecture needs.

The IR pipeline runs once per setting, up to ``phaze-shard-tensor-parallel``; what follows it in
``phazec --hw`` (tiling, latency, scheduling, recompute, placement) depends on the accelerator
and is redone here over many candidates without the IR:

- the op table (unique op descriptions) that :func:`~passes.algorithms.latency.estimate_space`
  prices on every candidate at once;
- the scheduling *groups*: each layer's forward, backward and optimizer ops, and the attention
  cores that selective recompute re-runs, as rows of that table plus their edges, deduplicated
  (a transformer's blocks share theirs);
- per layer, what the placement DP needs that no accelerator changes (memory, boundary bytes).

A :class:`Setting` is picklable (no xDSL objects), so worker processes and Ray can price it; it is
also what the search's on-disk cache keeps per (model, micro-batch, TP).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from passes.algorithms import schedule as sched
from passes.algorithms.latency import OpTable
from passes.algorithms.placement import LayerNumbers
from phaze_ir import keys


@dataclass(frozen=True)
class Group:
    """One scheduling problem's shape: its ops as rows of the setting's op table (``rows[i]``
    for the ``i``-th op of the group, in program order) and the edges between them."""

    rows: tuple[int, ...]
    edges: tuple[tuple[int, int], ...]


@dataclass
class LayerRef:
    """One layer: the groups of its forward, backward, optimizer ops and of its selective
    recompute (-1 when it has none), and what the DP needs of it that no accelerator changes
    (``numbers``, its times left at 0: :meth:`Setting.layer_numbers` fills them in)."""

    fwd: int
    bwd: int
    opt: int
    selective: int
    numbers: LayerNumbers


@dataclass
class Setting:
    """A model at micro-batch ``micro_batch`` and TP width ``tp`` (see the module docstring)."""

    model: str
    micro_batch: int
    tp: int
    table: OpTable
    groups: list[Group]
    layers: list[LayerRef]
    prepare_s: float = 0.0
    units: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        self.units = self.table.units

    def priced_groups(self) -> list[int]:
        """The groups whose makespans the DP reads (forward, backward, selective recompute; the
        optimizer step is not in the DP), sorted."""
        return sorted({g for lr in self.layers for g in (lr.fwd, lr.bwd, lr.selective) if g >= 0})

    def group_units(self, g: int) -> tuple[str, ...]:
        return tuple(self.units[r] for r in self.groups[g].rows)

    def group_problem(self, g: int, one: np.ndarray, split: np.ndarray, cores: dict[str, int]) -> sched.Problem:
        """The scheduling problem of group ``g`` with the table's latencies ``one``/``split``
        (``[rows]`` seconds on one candidate): the same problem, bit for bit, as
        ``phaze-schedule-ops`` builds from the IR on that candidate (so they share cache
        entries)."""
        grp = self.groups[g]
        ops = [sched.Op(self.units[r], float(one[r]), float(split[r])) for r in grp.rows]
        return sched.Problem.make(ops, grp.edges, cores)

    def layer_numbers(self, makespan: np.ndarray) -> list[LayerNumbers]:
        """The DP's layers given each group's makespan (``makespan[g]``, seconds)."""
        out = []
        for lr in self.layers:
            fwd = float(makespan[lr.fwd]) if lr.fwd >= 0 else 0.0
            sel = float(makespan[lr.selective]) if lr.selective >= 0 else 0.0
            bwd = float(makespan[lr.bwd]) if lr.bwd >= 0 else 0.0
            out.append(replace(lr.numbers, fwd_s=fwd, bwd_s=bwd, recompute_s=(0.0, sel, fwd)))
        return out


def setting_from_module(module, model: str, micro_batch: int, tp: int) -> Setting:
    """Reduce a module sharded by ``phaze-shard-tensor-parallel`` to a :class:`Setting` (the
    optimizer state is read from its ``phaze.optimizer_update`` ops, as the pipeline does)."""
    from passes.cost_view import op_table
    from passes.insert_recompute import static_costs

    name = "phaze-search"
    table, row_of, priced_ops, _ = op_table(module)
    row_by_op = {id(o): r for o, r in zip(priced_ops, row_of)}
    graph, ops, layer_of, recompute, memory = static_costs(module, "", name)
    rows = [row_by_op[id(o)] for o in ops]
    layers_attr = [a.as_dict() for a in module.attributes[keys.LAYERS].data]

    groups: list[Group] = []
    index: dict[Group, int] = {}

    def group_of(ids: list[int]) -> int:
        if not ids:
            return -1
        g = Group(tuple(rows[i] for i in ids), sched.group_edges(graph, ids))
        if g not in index:
            index[g] = len(groups)
            groups.append(g)
        return index[g]

    by_phase = sched.phase_groups(graph, layer_of)
    layers = []
    for la, rc, mem in zip(layers_attr, recompute, memory):
        k = la["index"]
        layers.append(
            LayerRef(
                fwd=group_of(by_phase.get((k, "fwd"), [])),
                bwd=group_of(by_phase.get((k, "bwd"), [])),
                opt=group_of(by_phase.get((k, "opt"), [])),
                selective=group_of(rc.selective_ops),
                numbers=LayerNumbers(
                    fwd_s=0.0,
                    bwd_s=0.0,
                    recompute_s=(0.0, 0.0, 0.0),
                    saved_bytes=(rc.none_bytes, rc.selective_bytes, rc.full_bytes),
                    param_bytes=mem.param_bytes,
                    grad_bytes=mem.grad_bytes,
                    optimizer_bytes=mem.optimizer_bytes,
                    workspace_bytes=mem.record()["workspace_bytes"],
                    boundary_bytes=la["boundary_bytes"],
                ),
            )
        )
    return Setting(model, micro_batch, tp, table, groups, layers)


def prepare_settings(model_path: str, micro_batch: int, tps: tuple[int, ...], opts: Any) -> list[Setting]:
    """Trace ``model_path`` at ``micro_batch`` once and make a :class:`Setting` per TP width
    (``opts``: the driver's :class:`~phaze.driver.Options`).  A TP width the model cannot be
    sharded for is left out (its reason is in the exception's message when none is left)."""
    from phaze.driver import compile_module
    from phaze_ir.errors import PhazeError
    from phaze_ir.frontend import load_model_file, trace_model

    spec = load_model_file(model_path)
    t0 = time.perf_counter()
    traced = trace_model(spec, micro_batch, opts.seq_len, training=True, dtype=opts.dtype)
    trace_s = time.perf_counter() - t0
    out = []
    errors = []
    for t in tps:
        t1 = time.perf_counter()
        try:
            module = compile_module(traced, "sharded", t, opts)
        except PhazeError as e:
            errors.append(f"TP {t}: {e}")
            continue
        s = setting_from_module(module, spec.name, micro_batch, t)
        s.prepare_s = time.perf_counter() - t1 + trace_s / len(tps)
        out.append(s)
    if not out:
        raise PhazeError(f"{spec.name} at micro-batch {micro_batch}: " + "; ".join(errors))
    return out
