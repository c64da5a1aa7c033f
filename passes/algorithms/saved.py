"""Which forward tensors autograd saves for backward.

In the joint graph traced from ``torch.autograd.grad`` the backward ops read forward values
directly: exactly the tensors autograd saved.  A saved *view* keeps its base storage alive, so
every use is resolved to its storage; parameters are not activations and are skipped.
"""

from __future__ import annotations

from passes.algorithms.graph import Graph


def saved_storages(graph: Graph, consumers: set[int] | None = None) -> set[int]:
    """Storage value ids that backward ops (all of them, or those in ``consumers``) read and
    that forward ops produced or the step's inputs provide."""
    saved: set[int] = set()
    for i in range(len(graph.ops)) if consumers is None else consumers:
        op = graph.ops[i]
        if op.phase != "bwd":
            continue
        for v in op.operands:
            s = graph.storage(v)
            val = graph.values[s]
            if val.producer >= 0:
                if graph.ops[val.producer].phase == "fwd":
                    saved.add(s)
            elif val.role == "input":
                saved.add(s)
    return saved


def saved_bytes_per_op(graph: Graph) -> dict[int, int]:
    """Forward op index -> bytes of its results that backward reads (through views)."""
    out: dict[int, int] = {}
    for s in saved_storages(graph):
        producer = graph.values[s].producer
        if producer >= 0:
            out[producer] = out.get(producer, 0) + graph.values[s].nbytes
    return out
