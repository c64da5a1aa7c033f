"""Tighter windows: an op's head and tail raised by the work of its ancestors and descendants.

:func:`~.prepared.with_times` gives each op a *head* (the longest path of shortest durations
before it) and a *tail* (after it), as if its ancestors could all run at once.  They cannot
beyond their kind's cores: every ancestor of op ``j`` of a kind with ``C`` cores has finished
when ``j`` starts, and those with ``head ≥ r`` started at ``r`` or later, so

    ``head_j ≥ r + Σ_{ancestors i of that kind, head_i ≥ r} w_i``

with ``w_i = min(one_i / C, split_i)`` the least time op ``i`` takes of the whole kind (one core:
``min(one, split)``); likewise ``tail_j`` with its descendants and their tails.  One pass in
topological order raises every head (an op's ancestors come first, their heads final), one in
reverse order every tail.  Every schedule keeps each op in its raised window, so every bound
computed from heads and tails (critical path, energetic, forced split) stays valid and gets
tighter: on the 576 schedules Llama-2-7B's search solved before these bounds, the forced-split
bound on raised windows is a median 0.2 % under the makespan found (1.5 % on plain windows),
1.4 % at the 75th percentile (3.1 %), 3.0 % at the 90th (5.3 %).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from passes.algorithms.schedule.prepared import Prepared, bit_indices


def least_kind_time(prep: Prepared) -> np.ndarray:
    """Per real op, the least time it holds the whole of its kind (``w_i`` above): its least
    core-seconds over the kind's cores, or its shortest duration on a one-core kind."""
    out = np.empty(len(prep.real))
    for k, i in enumerate(prep.real):
        op, cores = prep.problem.ops[i], prep.cap[k]
        out[k] = min(op.one / cores, op.split) if cores > 1 else prep.pmin[k]
    return out


def _raised(
    order: list[int],
    near: list[list[int]],
    far: list[np.ndarray],
    start: list[float],
    prep: Prepared,
    w: np.ndarray,
    kind: np.ndarray,
) -> list[float]:
    """Heads (or tails) raised in ``order``: ``near`` the direct predecessors (successors),
    ``far`` all ancestors (descendants), ``start`` the plain heads (tails)."""
    pmin = prep.pmin
    value = np.array(start, dtype=np.float64)
    for j in order:
        best = max((value[p] + pmin[p] for p in near[j]), default=0.0)
        others = far[j]
        for kd in np.unique(kind[others]) if len(others) else ():
            same = others[kind[others] == kd]
            r = value[same]
            idx = np.argsort(-r, kind="stable")
            best = max(best, float(np.max(r[idx] + np.cumsum(w[same][idx]))))
        value[j] = max(value[j], best)
    return value.tolist()


def raise_windows(prep: Prepared) -> Prepared:
    """``prep`` with every head and tail raised (see the module docstring)."""
    m = len(prep.real)
    if m == 0:
        return prep
    w = least_kind_time(prep)
    kinds = sorted(set(prep.kind))
    kind = np.array([kinds.index(x) for x in prep.kind])
    ancestors = [np.array(bit_indices(prep.reach[k]), dtype=np.int64) for k in range(m)]
    succs: list[list[int]] = [[] for _ in range(m)]
    below: list[list[int]] = [[] for _ in range(m)]
    for k in range(m):
        for p in prep.preds[k]:
            succs[p].append(k)
        for a in ancestors[k]:
            below[int(a)].append(k)
    descendants = [np.array(d, dtype=np.int64) for d in below]
    head = _raised(list(range(m)), prep.preds, ancestors, prep.head, prep, w, kind)
    tail = _raised(list(reversed(range(m))), succs, descendants, prep.tail, prep, w, kind)
    return replace(prep, head=head, tail=tail)
