"""Memory of each layer on one device, for the placement DP.

Pure code (no xDSL); ``phaze-insert-recompute`` writes the numbers as ``#phaze.layer_memory``.

Per layer (bytes):

- ``param_bytes``: the parameters its forward reads (a tied parameter counts in every layer that
  reads it: a pipeline stage holding that layer holds a copy); ``grad_bytes``: their gradients
  (same dtype as the parameters, as in mixed-precision training); ``optimizer_bytes``: their
  optimizer state, read from the ``phaze.optimizer_update`` ops (``state_bytes`` per element:
  12 for mixed-precision Adam, fp32 master weight and two moments; 4 for SGD's fp32 master), or
  given per optimizer kind.
- ``expert_param_bytes``, ``expert_optimizer_bytes``: the part of ``param_bytes`` (and of the
  gradients) and of ``optimizer_bytes`` that is per-expert weights of an MoE layer (read by its
  expert GEMMs): what expert parallelism divides over its group.
- ``fp8_weight_bytes``: the FP8 copies of its weights (rowwise and columnwise) that
  Transformer Engine caches for the whole step (:mod:`passes.algorithms.recompute`): held once
  beside the weights, not per micro-batch; under ZeRO-3 (FSDP) none are kept (TE 2.20.0.dev0,
  ``module/linear.py``: with FSDP2 the forward casts rowwise only and saves no workspace,
  ``wt_save = None``, and the backward casts again from the re-gathered weight), which the
  placement DP applies.
- ``saved_{none,selective,full}_bytes``: activations stashed per micro-batch under each recompute
  policy (:mod:`passes.algorithms.recompute`).  Under 1F1B stage ``k`` of ``p`` holds
  ``min(p − k, m)`` micro-batches of them.
- ``workspace_bytes``: the largest transient live set while the layer's forward or backward
  runs: tensors its ops produce that are neither stashed for backward nor parameter gradients,
  live from their producer to their last reader within the phase (to the phase's end when a
  later layer reads them), in program order.  Inputs from other layers are counted by whoever
  holds them (the stash, or the previous layer's workspace).  A tensor one fused kernel makes
  and only it reads (``kernel_of``, ``phaze-form-kernels``: flash attention's scores and
  probabilities, an Inductor kernel's intermediates) never reaches HBM and is not counted.
- ``recompute_workspace_bytes``: the same bound when the layer's forward is re-run for its
  backward: ``max(fwd_peak, bwd_peak + saved_none − saved_full)`` (the rematerialized
  activations are live while its backward runs), an upper bound for every policy.

Memory of a stage (:func:`stage_bytes`): ``Σ (param + grad + optimizer) + in_flight · Σ saved[policy]
+ max workspace[policy]``, the placement DP's formula.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from passes.algorithms.graph import Graph
from passes.algorithms.recompute import POLICIES, LayerRecompute
from phaze_ir.op_kinds import LAYER_MEMORY_FIELDS, OPTIMIZER_KINDS

#: Optimizer state bytes per parameter element, by optimizer (``phaze_ir.op_kinds.OPTIMIZER_KINDS``').
STATE_BYTES_PER_ELEMENT = {kind: state for kind, (_, state) in OPTIMIZER_KINDS.items()}


@dataclass
class LayerMemory:
    """One layer's memory (bytes; see the module docstring)."""

    index: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    saved_none_bytes: int
    saved_selective_bytes: int
    saved_full_bytes: int
    workspace_bytes: int
    recompute_workspace_bytes: int
    expert_param_bytes: int = 0
    expert_optimizer_bytes: int = 0
    fp8_weight_bytes: int = 0
    fwd_peak_bytes: int = 0
    bwd_peak_bytes: int = 0

    def saved(self, policy: str) -> int:
        return (self.saved_none_bytes, self.saved_selective_bytes, self.saved_full_bytes)[POLICIES.index(policy)]

    def workspace(self, policy: str) -> int:
        """Peak transient bytes under ``policy`` (rematerialized activations included)."""
        if policy == "none":
            return self.workspace_bytes
        return max(self.fwd_peak_bytes, self.bwd_peak_bytes + self.saved_none_bytes - self.saved(policy))

    @property
    def static_bytes(self) -> int:
        """Weights (and their FP8 copies), gradients and optimizer state, without ZeRO."""
        return self.param_bytes + self.fp8_weight_bytes + self.grad_bytes + self.optimizer_bytes

    def record(self) -> dict[str, int]:
        """The fields of ``#phaze.layer_memory``, in its order."""
        return {k: getattr(self, k) for k in LAYER_MEMORY_FIELDS}


def _peak(graph: Graph, ops: Sequence[int], excluded: set[int], readers: Mapping[int, list[int]]) -> int:
    """Largest live set of the storages ``ops`` produce (not ``excluded``), in program order;
    ``readers[s]``: the ops reading storage ``s`` (through views)."""
    if not ops:
        return 0
    pos = {i: k for k, i in enumerate(ops)}
    end = len(ops) - 1
    delta = [0] * (len(ops) + 1)
    for i in ops:
        for r in graph.ops[i].results:
            if graph.storage(r) != r or r in excluded:
                continue
            last = pos[i]
            for j in readers.get(r, ()):
                last = max(last, pos.get(j, end))
            delta[pos[i]] += graph.values[r].nbytes
            delta[last + 1] -= graph.values[r].nbytes
    peak = live = 0
    for d in delta[:-1]:
        live += d
        peak = max(peak, live)
    return peak


def kernel_internal(graph: Graph, kernel_of: Sequence[int | None], readers: Mapping[int, list[int]]) -> set[int]:
    """The storages a fused kernel writes and only its own ops read (views aside): kept on chip,
    never allocated in HBM.  ``kernel_of[i]``: op ``i``'s kernel id (None: no kernel record)."""
    out = set()
    for i, op in enumerate(graph.ops):
        k = kernel_of[i]
        if k is None:
            continue
        for r in op.results:
            if graph.storage(r) != r:
                continue
            users = [j for j in readers.get(r, ()) if not _is_view(graph, j)]
            if users and all(kernel_of[j] == k for j in users):
                out.add(r)
    return out


def _is_view(graph: Graph, i: int) -> bool:
    return any(graph.values[r].view_of is not None for r in graph.ops[i].results)


def layer_memory(
    graph: Graph,
    layer_of: Sequence[int],
    recompute: Sequence[LayerRecompute],
    state_bytes: Mapping[int, int],
    kernel_of: Sequence[int | None] | None = None,
) -> list[LayerMemory]:
    """Every layer's memory.  ``state_bytes[p]``: optimizer-state bytes of parameter ``p`` (a
    value id, the storage of a ``param`` argument); parameters missing from it have none.
    ``kernel_of``: each op's kernel id when the kernels were formed (:func:`kernel_internal`)."""
    n_layers = len(recompute)
    params: list[set[int]] = [set() for _ in range(n_layers)]
    phase_ops: dict[tuple[int, str], list[int]] = {}
    grads: set[int] = set()
    readers = graph.readers()
    for i, op in enumerate(graph.ops):
        phase_ops.setdefault((layer_of[i], op.phase), []).append(i)
        if op.phase == "fwd":
            for v in op.operands:
                s = graph.storage(v)
                if graph.values[s].role == "param":
                    params[layer_of[i]].add(s)
        elif op.phase == "opt" and len(op.operands) >= 2:
            grads.add(graph.storage(op.operands[1]))  # the gradient the update reads
    on_chip = kernel_internal(graph, kernel_of, readers) if kernel_of is not None else set()
    out = []
    for layer in range(n_layers):
        rc = recompute[layer]
        pbytes = sum(graph.values[s].nbytes for s in params[layer])
        experts = graph.expert_params(phase_ops.get((layer, "fwd"), [])) & params[layer]
        stash = rc.none_storages
        fwd_peak = _peak(graph, phase_ops.get((layer, "fwd"), []), stash | on_chip | rc.fp8_weight_storages, readers)
        bwd_peak = _peak(graph, phase_ops.get((layer, "bwd"), []), grads | on_chip, readers)
        out.append(
            LayerMemory(
                index=layer,
                param_bytes=pbytes,
                grad_bytes=pbytes,
                optimizer_bytes=sum(state_bytes.get(s, 0) for s in params[layer]),
                saved_none_bytes=rc.none_bytes,
                saved_selective_bytes=rc.selective_bytes,
                saved_full_bytes=rc.full_bytes,
                workspace_bytes=max(fwd_peak, bwd_peak),
                recompute_workspace_bytes=max(fwd_peak, bwd_peak + rc.none_bytes - rc.full_bytes),
                expert_param_bytes=sum(graph.values[s].nbytes for s in experts),
                expert_optimizer_bytes=sum(state_bytes.get(s, 0) for s in experts),
                fp8_weight_bytes=rc.fp8_weight_bytes,
                fwd_peak_bytes=fwd_peak,
                bwd_peak_bytes=bwd_peak,
            )
        )
    return out


#: The narrowest element a training step's logits and their gradient take (bytes): bf16 or
#: fp16 (fp32 under ``--dtype float32``, and the loss's fp32 upcast under autocast, are wider;
#: FP8 linears' outputs are bf16: Transformer Engine casts only GEMM operands to FP8).
LOGITS_MIN_ELEMENT_BYTES = 2


def logits_grad_bytes(micro_batch: int, seq_len: int, vocab: int, tp: int, cp: int) -> int:
    """A lower bound on the memory of every placement of a point (micro-batch, TP width, CP
    degree) of a language model whose output projection has ``vocab`` columns, at ``seq_len``
    tokens a sample: the gradient of its logits, ``micro_batch · (seq_len/cp − 1) ·
    ⌊vocab/tp⌋`` elements of at least :data:`LOGITS_MIN_ELEMENT_BYTES`.

    Why it is a bound: that gradient is a tensor the backward produces (the loss's backward
    makes it, the output projection's backward GEMMs read it: no one kernel both makes and
    reads it), neither stashed nor a parameter's gradient, so it is in the backward peak of the
    layer that makes it (:func:`layer_memory`), so in its ``workspace_bytes``, which the
    placement DP holds under every recompute policy (the larger of it and
    ``recompute_workspace_bytes`` under full recompute; ``rust/phaze-dp/src/search.rs``).  A
    stage's memory (the DP's formula, :func:`stage_bytes`) holds the largest workspace of its
    layers, and no ZeRO stage,
    pipeline depth or schedule divides a workspace; its rows are one device's tokens (S/c under
    context parallelism; one fewer where the labels are shifted) and its columns at least the
    vocabulary split TP ways (a vocab-parallel head pads, never drops, columns).  A point whose
    bound exceeds the chip's HBM cannot fit under any placement."""
    rows = micro_batch * max(seq_len // cp - 1, 0)
    return rows * (vocab // tp) * LOGITS_MIN_ELEMENT_BYTES


def stage_bytes(layers: Sequence[LayerMemory], in_flight: int, policy: str = "none") -> int:
    """Bytes per device of a pipeline stage holding ``layers`` with ``in_flight`` micro-batches
    stashed under ``policy`` (the placement DP's memory formula)."""
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r}: expected one of {', '.join(POLICIES)}")
    return (
        sum(layer.static_bytes for layer in layers)
        + in_flight * sum(layer.saved(policy) for layer in layers)
        + max((layer.workspace(policy) for layer in layers), default=0)
    )
