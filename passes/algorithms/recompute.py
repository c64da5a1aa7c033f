"""Activation recomputation: what each layer stashes for its backward under three policies.

Pure code (no xDSL); ``phaze-insert-recompute`` runs it on the IR's light graph.

- **none**: keep everything autograd saves for the layer's backward (the forward tensors its
  backward ops read, resolved to storage through views, each counted once; what
  ``#phaze.layer_info``'s ``saved_bytes`` counts).  Given a
  :class:`~passes.algorithms.partition.Partition` (a step compiled by ``torch.compile``, whose
  kernels are Inductor's), what AOTAutograd's min-cut partitioner keeps for it instead
  (:func:`passes.algorithms.partition.layer_saved`: the saved values its backward reaches
  through the forward ops it reruns); selective starts from that set, full is the same either
  way (the layer's input and what its backward reads from outside the layer).
- **selective** (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
  Models", 2022): recompute the attention core in backward and keep the rest.  The core is found
  by structure, not by names: a softmax between two batched matmuls whose operands are both
  activations (no parameter), i.e. ``Q·Kᵀ`` and ``P·V``; the core is every forward op of the
  layer on a path from the first matmul to the second (inclusive): scaling, masking, the
  softmax, converts, dropout and its mask (re-drawn from the saved RNG state).  Its saved
  outputs (the ``b·heads·s²`` score tensors) leave the stash; anything the core reads that the
  stash does not hold already (and that is not rebuilt from nothing, like a causal mask) joins
  it.
- **full**: keep only the layer's input and re-run its whole forward in backward.  The stash is
  the data-dependent activations the layer's forward reads from outside the layer (the hidden
  state for a transformer block; token ids and labels for the prologue and head), plus any
  other tensor from outside the layer that its backward reads.

Extra forward time per micro-batch: ``full`` re-runs the forward (its scheduled makespan);
``selective`` the core (the makespan of the core's ops scheduled on their own).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from passes.algorithms.graph import Graph
from passes.algorithms.partition import Partition, layer_saved
from passes.algorithms.saved import saved_storages
from phaze_ir.op_kinds import RecomputePolicy

POLICIES = tuple(p.value for p in RecomputePolicy)

_KIND = re.compile(r'kind="([^"]*)"')


def op_name(graph: Graph, i: int) -> str:
    """The op's name (``phaze.matmul``), from its signature."""
    return graph.ops[i].signature.split("|", 1)[0]


def op_kind(graph: Graph, i: int) -> str:
    """The op's ``kind`` property (``"softmax"``), from its signature ("" if it has none)."""
    parts = graph.ops[i].signature.split("|")
    m = _KIND.search(parts[1]) if len(parts) > 1 else None
    return m.group(1) if m else ""


@dataclass
class LayerRecompute:
    """One layer under the three policies (bytes per micro-batch; ``*_ops`` are op ids)."""

    index: int
    none_bytes: int
    selective_bytes: int
    full_bytes: int
    selective_ops: list[int] = field(default_factory=list)
    fwd_ops: list[int] = field(default_factory=list)
    none_storages: set[int] = field(default_factory=set)
    selective_storages: set[int] = field(default_factory=set)
    full_storages: set[int] = field(default_factory=set)
    #: under a partition: the forward ops the layer's backward reruns with no recompute policy
    none_recomputed: list[int] = field(default_factory=list)

    def saved_bytes(self) -> list[int]:
        """``[none, selective, full]``, the order of the placement DP."""
        return [self.none_bytes, self.selective_bytes, self.full_bytes]


def _is_activation(graph: Graph, v: int) -> bool:
    s = graph.storage(v)
    return graph.values[s].role != "param"


def attention_cores(graph: Graph, fwd_ops: Sequence[int]) -> list[list[int]]:
    """The attention cores among ``fwd_ops`` (one layer's forward ops, in program order): for
    every softmax, the ops on paths from the nearest activation×activation matmul before it to
    the nearest one after it (both included).  Sorted op-id lists, one per core."""
    in_layer = set(fwd_ops)
    producer = {}
    for i in fwd_ops:
        for r in graph.ops[i].results:
            producer[r] = i
    preds: dict[int, set[int]] = {i: {producer[v] for v in graph.ops[i].operands if v in producer} for i in fwd_ops}
    succs: dict[int, set[int]] = {i: set() for i in fwd_ops}
    for i, ps in preds.items():
        for p in ps:
            succs[p].add(i)

    def closure(start: int, nxt: Mapping[int, set[int]]) -> set[int]:
        seen = {start}
        stack = [start]
        while stack:
            u = stack.pop()
            for w in nxt[u]:
                if w not in seen:
                    seen.add(w)
                    stack.append(w)
        return seen

    act_mm = {
        i
        for i in fwd_ops
        if op_name(graph, i) == "phaze.matmul"
        and len(graph.ops[i].operands) >= 2
        and all(_is_activation(graph, v) for v in graph.ops[i].operands[:2])
    }
    cores: list[list[int]] = []
    taken: set[int] = set()
    for s in fwd_ops:
        if op_name(graph, s) != "phaze.softmax" or op_kind(graph, s) not in ("softmax", "log_softmax") or s in taken:
            continue
        up = closure(s, preds) & act_mm
        down = closure(s, succs) & act_mm
        if not up or not down:
            continue
        first = max(up)  # the nearest (latest) score matmul before the softmax
        second = min(down)  # the nearest context matmul after it
        core = closure(first, succs) & closure(second, preds) & in_layer
        if core & taken:
            continue
        taken |= core
        cores.append(sorted(core))
    return cores


def analyze_recompute(
    graph: Graph, layer_of: Sequence[int], partition: Partition | None = None
) -> list[LayerRecompute]:
    """The three policies of every layer (see the module docstring); ``partition``: what a
    compiled step saves (None: eager autograd)."""
    n_layers = max(layer_of, default=-1) + 1
    fwd: list[list[int]] = [[] for _ in range(n_layers)]
    bwd: list[set[int]] = [set() for _ in range(n_layers)]
    for i, op in enumerate(graph.ops):
        if op.phase == "fwd":
            fwd[layer_of[i]].append(i)
        elif op.phase == "bwd":
            bwd[layer_of[i]].add(i)
    dep = graph.data_dependent()

    def nbytes(storages: set[int]) -> int:
        return sum(graph.values[s].nbytes for s in storages)

    compiled = layer_saved(graph, partition, layer_of) if partition is not None else None
    out = []
    for layer in range(n_layers):
        # Statistics a partition saves that are not values (a softmax's), op -> bytes.
        stats: dict[int, int] = {}
        autograd = saved_storages(graph, bwd[layer])
        none = autograd
        if compiled is not None:
            none, stats = compiled[layer].storages, compiled[layer].stats
        own = {r for i in fwd[layer] for r in graph.ops[i].results}
        # Full: the data-dependent inputs of the forward, plus whatever else from outside the
        # layer its backward reads (parameters are not activations).
        inputs = set()
        for i in fwd[layer]:
            for v in graph.ops[i].operands:
                s = graph.storage(v)
                val = graph.values[s]
                if s in own or val.role == "param" or not dep[s]:
                    continue
                if val.producer >= 0 or val.role == "input":
                    inputs.add(s)
        full = inputs | {s for s in autograd if s not in own}
        # Selective: the attention cores' saved outputs go; what the cores read joins.
        core_ops = sorted(i for core in attention_cores(graph, fwd[layer]) for i in core)
        core_out = {r for i in core_ops for r in graph.ops[i].results}
        core_set = set(core_ops)
        selective = {s for s in none if s not in core_out}
        for i in core_ops:
            for v in graph.ops[i].operands:
                s = graph.storage(v)
                val = graph.values[s]
                if s in core_out or val.role == "param" or not dep[s]:
                    continue
                if val.producer >= 0 and val.producer in core_set:
                    continue
                selective.add(s)
        out.append(
            LayerRecompute(
                index=layer,
                none_bytes=nbytes(none) + sum(stats.values()),
                selective_bytes=nbytes(selective) + sum(b for i, b in stats.items() if i not in core_set),
                full_bytes=nbytes(full),
                selective_ops=core_ops,
                fwd_ops=list(fwd[layer]),
                none_storages=none,
                selective_storages=selective,
                full_storages=full,
                none_recomputed=sorted(compiled[layer].recomputed) if compiled is not None else [],
            )
        )
    return out
