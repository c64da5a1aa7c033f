"""A lower bound on a layer's makespan that knows an op too long for its window must be split.

The energetic bound (:func:`~.prepared.energy_sets`) charges every op its least core-seconds,
``min(one, C·split)``: an op that is cheaper on one core counts as if it could be spread over the
``C`` cores.  But in a schedule of makespan ``T`` op ``i`` runs within ``[head_i, T − tail_i]``,
so on one core it needs ``one_i ≤ T − head_i − tail_i``; when its single-core time does not fit
that window it *must* run split, holding all ``C`` cores for ``split_i``.  So, for a kind with
``C`` cores and thresholds ``r`` (a head) and ``q`` (a tail), the ops with ``head ≥ r`` and
``tail ≥ q`` all run within ``[r, T − q]`` and

    ``r + q + Σ_i w_i(T) ≤ T``,   ``w_i(T) = split_i`` if ``one_i > T − head_i − tail_i``,
    else ``min(one_i / C, split_i)``

(a kind with one core: ``w_i = min(one, split)``).  A ``T`` that violates this for some kind and
thresholds is below every feasible makespan.  ``w_i(T)`` does not grow with ``T``, so the
violated ``T`` form an interval above the plain bounds: :func:`forced_split_bound` bisects for
its end and returns the largest ``T`` it proved violated (a valid bound, never above the least
makespan).

Why it matters: a head's two GEMMs after a long vector chain, each far cheaper in core-seconds on
one core but too long to run on one core in the time left, serialize split; the energetic bound
saw them overlap on single cores.  Measured on the 547 and 576 schedules OPT-350m's and
Llama-2-7B's searches solved before it (1-4 ms a problem; ``benchmarks/bench_layer_bounds.py``
prints these figures for a search's schedules): the makespan found is over this bound by a
median 0.04 % and 1.5 % (over the plain bounds: 0.2 % and 1.7 %), at the 75th percentile by
0.4 % and 3.1 % (6.0 % and 5.0 %).
"""

from __future__ import annotations

import numpy as np

from passes.algorithms.schedule.prepared import Prepared, combinatorial_bounds, prepare
from passes.algorithms.schedule.problem import Problem
from passes.algorithms.schedule.windows import least_kind_time, raise_windows

#: Bisection stops when the interval is this small relative to its end.
RELATIVE_TOLERANCE = 1e-7
#: At most this many bisection steps (each halves the interval).
MAX_STEPS = 60


class _Kind:
    """One unit kind's ops as the test of a makespan ``T`` needs them."""

    def __init__(self, prep: Prepared, members: list[int], least: np.ndarray) -> None:
        head = np.array([prep.head[k] for k in members])
        tail = np.array([prep.tail[k] for k in members])
        self.free = least[members]  # least_kind_time: the op's least share of the kind
        if prep.cap[members[0]] == 1:
            self.forced = self.free
            self.threshold = np.full(len(members), -np.inf)  # nothing to force
        else:
            one = np.array([prep.modes[k][0][0] for k in members])
            split = np.array([prep.modes[k][1][0] if len(prep.modes[k]) > 1 else np.inf for k in members])
            # An op without a split mode whose one-core time does not fit is below the critical
            # path, which the bisection starts above: charging it its free share is still valid.
            self.forced = np.where(np.isfinite(split), split, self.free)
            self.threshold = head + tail + one  # below this T the op must run split
        r, q = np.meshgrid(np.unique(head), np.unique(tail), indexing="ij")
        r, q = r.ravel(), q.ravel()
        member = (head[None, :] >= r[:, None]) & (tail[None, :] >= q[:, None])
        some = member.any(axis=1)
        self.member = member[some].astype(np.float64)
        self.window_start = (r + q)[some]

    def refutes(self, t: float) -> bool:
        """Whether some threshold pair's ops cannot fit a makespan of ``t``."""
        w = np.where(t < self.threshold, self.forced, self.free)
        return bool(np.any(self.window_start + self.member @ w > t))


def forced_split_bound(prep: Prepared, lower: float) -> float:
    """The forced-split energetic bound of ``prep`` (see the module docstring), at least
    ``lower``, which must be at least the energetic bound (:func:`~.prepared.combinatorial_bounds`)."""
    m = len(prep.real)
    if m == 0:
        return lower
    by_kind: dict[str, list[int]] = {}
    for k in range(m):
        by_kind.setdefault(prep.kind[k], []).append(k)
    # A kind where no op can be forced at a makespan >= lower charges every op its least
    # core-seconds there: the energetic bound, which ``lower`` is at least.  Only the others can
    # refute a makespan (most problems have none: nothing to build).
    least = least_kind_time(prep)
    kinds = [
        _Kind(prep, members, least)
        for _, members in sorted(by_kind.items())
        if any(len(prep.modes[k]) > 1 and prep.head[k] + prep.tail[k] + prep.modes[k][0][0] > lower for k in members)
    ]
    if not kinds:
        return lower

    def refuted(t: float) -> bool:
        return any(kind.refutes(t) for kind in kinds)

    if not refuted(lower):
        return lower
    lo = lower
    hi = float(sum(prep.pmin))  # one op at a time, each in its fastest mode: a feasible makespan
    for _ in range(MAX_STEPS):
        if hi - lo <= RELATIVE_TOLERANCE * hi:
            break
        mid = 0.5 * (lo + hi)
        if refuted(mid):
            lo = mid
        else:
            hi = mid
    return lo


def makespan_lower_bound(problem: Problem) -> float:
    """The strongest of phaze's combinatorial bounds on ``problem``'s least makespan (seconds):
    the critical path, the energetic bound at every head and tail threshold and the forced-split
    bound, all on the windows raised by the work of each op's ancestors and descendants
    (:func:`~.windows.raise_windows`)."""
    prep = raise_windows(prepare(problem))
    return forced_split_bound(prep, max(combinatorial_bounds(prep)))
