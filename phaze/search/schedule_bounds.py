"""Lower bounds on a layer's scheduled makespan over many architectures at once (numpy).

The architecture search needs, for each of tens of thousands of candidate chips, a number that
no schedule of :mod:`passes.algorithms.schedule` can beat, without solving anything.  For one
scheduling problem (a DAG of ops, each on a unit kind with ``cores[kind]`` cores, lasting
``one`` on one core or ``split`` over all of them) and a vector of candidates, this returns
``max(critical path, energetic bound)`` per candidate:

- **critical path**: the longest path with every op at its shortest duration ``min(one, split)``;
- **energetic bound** per unit kind: every op of the kind starts no earlier than the smallest
  head ``r`` of the kind's ops (longest path before it) and ends no later than ``T − q`` with
  ``q`` the smallest tail; the kind's ``C`` cores then need ``Σ w_i / C`` more, with
  ``w_i = min(one_i, C·split_i)`` the least core-seconds op ``i`` can take:
  ``T ≥ r + q + Σ w_i / C``.

Both hold for every feasible schedule (they are two of the bounds :func:`schedule.solve`
reports, the energetic one at a single ``(r, q)``), so the search may prune a candidate whose
throughput with these layer times cannot beat the best one found.  The arithmetic differs from
the scalar solver's, so callers compare with a small relative tolerance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def group_lower_bound(
    units: Sequence[str],
    edges: Sequence[tuple[int, int]],
    one: np.ndarray,
    split: np.ndarray,
    cores: Mapping[str, np.ndarray | int],
) -> np.ndarray:
    """Lower bound on the makespan of one problem on ``C`` candidates.

    ``units[i]``: op ``i``'s unit kind (``none`` takes no time); ``edges``: ``(i, j)`` with
    ``i < j`` (ops in a topological order, as a layer's ops in program order are); ``one``,
    ``split``: ``[n, C]`` seconds; ``cores[kind]``: the kind's core count per candidate (an array
    of ``C`` or a scalar; a kind that is absent has one core).  Returns ``[C]`` seconds."""
    n = len(units)
    C = one.shape[1] if one.ndim == 2 else 1
    if n == 0:
        return np.zeros(C)
    one = np.asarray(one, dtype=np.float64).reshape(n, C)
    split = np.asarray(split, dtype=np.float64).reshape(n, C)
    none = np.asarray([u == "none" for u in units])
    pmin = np.minimum(one, split)
    pmin[none] = 0.0
    preds: list[list[int]] = [[] for _ in range(n)]
    succs: list[list[int]] = [[] for _ in range(n)]
    for i, j in edges:
        if not i < j:
            raise ValueError(f"edge ({i}, {j}): ops must be in topological order (i < j)")
        preds[j].append(i)
        succs[i].append(j)
    head = np.zeros((n, C))
    for j in range(n):
        for i in preds[j]:
            np.maximum(head[j], head[i] + pmin[i], out=head[j])
    tail = np.zeros((n, C))
    for i in reversed(range(n)):
        for j in succs[i]:
            np.maximum(tail[i], tail[j] + pmin[j], out=tail[i])
    best = (head + pmin + tail).max(axis=0)
    for kind in sorted(set(units) - {"none"}):
        rows = np.asarray([k for k, u in enumerate(units) if u == kind])
        c = np.broadcast_to(np.asarray(cores.get(kind, 1), dtype=np.float64), (C,))
        work = np.minimum(one[rows], c * split[rows]) / c
        energetic = head[rows].min(axis=0) + tail[rows].min(axis=0) + work.sum(axis=0)
        np.maximum(best, energetic, out=best)
    return best
