"""Group a training step's ops into layers: prologue, the repeated blocks, head.

Blocks are found from the module hierarchy, never from names: the *block container* is the
module whose integer-indexed children (an ``nn.ModuleList``/``nn.Sequential``) hold the most
forward ops.  Each child is a block; forward ops before the first block form the prologue and
those after the last block the head (loss included).  Backward ops follow the forward module
they differentiate; optimizer ops follow their parameter's first forward use.  Blocks with the
same structure (same ops, types and internal wiring) share a ``same_as`` class so that later
passes solve each distinct layer once.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from passes.algorithms.graph import Graph
from passes.algorithms.saved import saved_storages


@dataclass
class LayerInfo:
    """Per-layer facts (the fields of ``#phaze.layer_info``; see ``phaze_ir.attributes.LayerInfoAttr``)."""

    index: int
    kind: str
    module: str
    same_as: int
    param_bytes: int
    saved_bytes: int
    boundary_bytes: int
    grad_boundary_bytes: int
    fwd_flops: int
    bwd_flops: int
    opt_flops: int
    num_ops: int
    experts: int
    dispatch_bytes: int


def _indexed_children(path: str) -> list[tuple[str, int, str]]:
    """Every (container, index, child path) pair along ``path`` (``a.h.3.attn`` -> (``a.h``, 3, ``a.h.3``))."""
    parts = path.split(".") if path else []
    out = []
    for i, p in enumerate(parts):
        if p.isdigit():
            out.append((".".join(parts[:i]), int(p), ".".join(parts[: i + 1])))
    return out


def find_block_container(graph: Graph) -> str | None:
    """The module whose integer-indexed children hold the most forward ops (None if no
    module has two or more such children)."""
    counts: dict[str, int] = {}
    children: dict[str, set[int]] = {}
    for op in graph.ops:
        if op.phase != "fwd":
            continue
        for container, idx, _ in _indexed_children(op.module):
            counts[container] = counts.get(container, 0) + 1
            children.setdefault(container, set()).add(idx)
    candidates = [c for c in counts if len(children[c]) >= 2]
    if not candidates:
        return None
    # Most ops wins; on a tie the outermost container (shortest path), then by name for determinism.
    return min(candidates, key=lambda c: (-counts[c], c.count(".") if c else -1, c))


def _block_of(module: str, container: str) -> str | None:
    for cont, _, child in _indexed_children(module):
        if cont == container:
            return child
    return None


def assign_layers(graph: Graph) -> tuple[list[int], list[tuple[str, str]]]:
    """Layer index of every op and (kind, module) of every layer, in execution order."""
    container = find_block_container(graph)
    n = len(graph.ops)
    # Forward: blocks by first appearance; the rest by position.
    fwd_block: list[str | None] = [None] * n
    block_order: list[str] = []
    for i, op in enumerate(graph.ops):
        if op.phase == "fwd" and container is not None:
            b = _block_of(op.module, container)
            if b is not None:
                fwd_block[i] = b
                if b not in block_order:
                    block_order.append(b)
    fwd_positions = [i for i, op in enumerate(graph.ops) if op.phase == "fwd"]
    block_positions = [i for i in fwd_positions if fwd_block[i] is not None]
    first_block = block_positions[0] if block_positions else None
    last_block = block_positions[-1] if block_positions else None

    # Provisional labels: ("prologue",), ("block", path), ("head",)
    label: list[tuple[str, str] | None] = [None] * n
    current: tuple[str, str] | None = None
    for i in fwd_positions:
        block = fwd_block[i]
        if block is not None:
            current = ("block", block)
        elif first_block is None or i < first_block:
            current = ("prologue", "")
        elif last_block is not None and i > last_block:  # (set whenever first_block is)
            current = ("head", "")
        # between blocks: stays in the block that ran last
        label[i] = current
    # Which layers each module's forward ops fall in (for backward ops).
    module_labels: dict[str, set] = {}
    for i in fwd_positions:
        module_labels.setdefault(graph.ops[i].module, set()).add(label[i])
    head = (
        ("head", "")
        if any(label[i] == ("head", "") for i in fwd_positions)
        else (label[fwd_positions[-1]] if fwd_positions else ("head", ""))
    )
    previous = head
    for i, op in enumerate(graph.ops):
        if op.phase != "bwd":
            continue
        b = _block_of(op.module, container) if container is not None else None
        # The root module ('') holds no layer of its own: its forward ops are the loss (or a
        # step run outside any submodule), its backward ones the loss's gradient and the adds
        # autograd inserts to accumulate a gradient, which run inside a block's backward.
        labels = module_labels.get(op.module, set()) if op.module else set()
        if b is not None:
            label[i] = ("block", b)
        elif len(labels) == 1:
            label[i] = next(iter(labels))
        else:
            # Unknown or ambiguous module: backward runs layer after layer, so the op belongs
            # with the backward ops around it.
            label[i] = previous
        previous = label[i]
    # Optimizer ops follow the parameter they update (its first forward consumer's layer).
    first_use: dict[int, tuple[str, str] | None] = {}
    for i in fwd_positions:
        for v in graph.ops[i].operands:
            s = graph.storage(v)
            if graph.values[s].producer < 0:
                first_use.setdefault(s, label[i])
    # An optimizer-phase op on a gradient, not a parameter (sequence parallelism's all-reduce
    # of a norm's weight gradient), follows the layer whose backward made that gradient.
    for i, op in enumerate(graph.ops):
        if op.phase == "opt":
            param = graph.storage(op.operands[0]) if op.operands else -1
            made_by = graph.values[param].producer if param >= 0 else -1
            label[i] = first_use.get(param) or (label[made_by] if made_by >= 0 else None) or head
        elif label[i] is None:
            label[i] = head

    order: list[tuple[str, str]] = []
    if any(lbl == ("prologue", "") for lbl in label):
        order.append(("prologue", ""))
    order += [("block", b) for b in block_order]
    if any(lbl == ("head", "") for lbl in label):
        order.append(("head", ""))
    index = {lbl: k for k, lbl in enumerate(order)}
    layer_of = [index[lbl] for lbl in label]  # type: ignore[index]
    return layer_of, order


def _layer_hash(graph: Graph, layer_of: list[int], layer: int, ops: list[int]) -> str:
    local: dict[int, tuple[int, int]] = {}
    h = hashlib.sha256()
    for k, i in enumerate(ops):
        op = graph.ops[i]
        refs: list[tuple[str | int, ...]] = []
        for v in op.operands:
            if v in local:
                refs.append(("L", *local[v]))
            else:
                val = graph.values[v]
                refs.append(("X", val.role, val.nbytes))
        h.update(repr((op.signature, op.phase, refs)).encode())
        for j, r in enumerate(op.results):
            local[r] = (k, j)
    return h.hexdigest()


def analyze_layers(graph: Graph) -> tuple[list[int], list[LayerInfo]]:
    """Layer of every op and the per-layer facts (see :class:`LayerInfo`)."""
    layer_of, order = assign_layers(graph)
    n_layers = len(order)
    ops_of: list[list[int]] = [[] for _ in range(n_layers)]
    for i, layer in enumerate(layer_of):
        ops_of[layer].append(i)

    flops = {ph: [0] * n_layers for ph in ("fwd", "bwd", "opt")}
    for i, op in enumerate(graph.ops):
        flops.setdefault(op.phase, [0] * n_layers)[layer_of[i]] += op.flops

    # Parameters each layer's forward reads (a tied parameter counts in every layer using it).
    params: list[set[int]] = [set() for _ in range(n_layers)]
    for i, op in enumerate(graph.ops):
        if op.phase == "fwd":
            for v in op.operands:
                s = graph.storage(v)
                if graph.values[s].role == "param":
                    params[layer_of[i]].add(s)

    # Saved activations, attributed to the layer whose backward reads them (a pipeline stage
    # stashes what its own backward needs, including the input it received).
    saved = [
        sum(graph.values[s].nbytes for s in saved_storages(graph, set(ops_of[layer]))) for layer in range(n_layers)
    ]

    # Cut bytes between layer i and i+1: every forward value produced at or before i and read
    # by a forward op after i, counted once per cut (a difference array over its layer span).
    # Its gradient crosses the same cut back when it is a float tensor that depends on a
    # parameter (integer ids and masks have no gradient).  Values that depend on no input
    # (a causal mask from ``arange``) are rebuilt where needed and cross nothing.
    dep = graph.data_dependent()
    grad = graph.differentiable()
    fwd_cut = [0] * (n_layers + 1)
    bwd_cut = [0] * (n_layers + 1)
    last_use: dict[int, int] = {}
    for i, op in enumerate(graph.ops):
        if op.phase != "fwd":
            continue
        for v in op.operands:
            s = graph.storage(v)
            val = graph.values[s]
            if val.producer >= 0 and dep[s] and graph.ops[val.producer].phase == "fwd":
                last_use[s] = max(last_use.get(s, -1), layer_of[i])
    for s, last in last_use.items():
        first = layer_of[graph.values[s].producer]
        if last > first:
            nbytes = graph.values[s].nbytes
            fwd_cut[first] += nbytes
            fwd_cut[last] -= nbytes
            if grad[s]:
                bwd_cut[first] += nbytes
                bwd_cut[last] -= nbytes
    boundary, grad_boundary, acc_f, acc_b = [], [], 0, 0
    for layer in range(n_layers):
        acc_f += fwd_cut[layer]
        acc_b += bwd_cut[layer]
        boundary.append(acc_f)
        grad_boundary.append(acc_b)

    # MoE layers: the experts of their expert GEMMs, and the tokens one forward routes to them
    # (what expert parallelism's all-to-all dispatches, and the combine brings back): the left
    # operand of the layer's first forward expert GEMM (the routed rows x the hidden size).
    experts = [0] * n_layers
    dispatch = [0] * n_layers
    for i, op in enumerate(graph.ops):
        if op.experts and op.phase == "fwd":
            layer = layer_of[i]
            if not experts[layer]:
                dispatch[layer] = graph.values[graph.cast_source(op.operands[0])].nbytes
            experts[layer] = max(experts[layer], op.experts)

    hashes = [_layer_hash(graph, layer_of, layer, ops_of[layer]) for layer in range(n_layers)]
    first_with: dict[str, int] = {}
    infos = []
    for layer, (kind, module) in enumerate(order):
        same = first_with.setdefault(hashes[layer], layer)
        infos.append(
            LayerInfo(
                index=layer,
                kind=kind,
                module=module,
                same_as=same,
                param_bytes=sum(graph.values[s].nbytes for s in params[layer]),
                saved_bytes=saved[layer],
                boundary_bytes=boundary[layer],
                grad_boundary_bytes=grad_boundary[layer],
                fwd_flops=flops["fwd"][layer],
                bwd_flops=flops["bwd"][layer],
                opt_flops=flops["opt"][layer],
                num_ops=len(ops_of[layer]),
                experts=experts[layer],
                dispatch_bytes=dispatch[layer],
            )
        )
    return layer_of, infos
