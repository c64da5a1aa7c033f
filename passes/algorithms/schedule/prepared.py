"""The problem as the solvers see it, the combinatorial lower bounds, and the way back.

- Ops of unit ``none`` and ops of duration 0 are contracted away (:func:`prepare`); their
  precedence is kept through them.  What is left are the *real* ops, in topological order, with
  the predecessors of the transitive reduction, the reachability bitsets and each op's *modes*
  ``(duration, cores held)``: one core, and split when there is a choice (``cores > 1`` and
  ``split < one``; a split that is not faster is dominated: longer and more cores).
- ``head``/``tail``: the longest paths before and after each op with the shortest durations.
- Lower bounds (:func:`lower_bounds`): the critical path with each op at ``min(one, split)``,
  and the energetic bound: for a kind with ``C`` cores, the ops with ``head ≥ r`` and ``tail ≥
  q`` all run within ``[r, T − q]``, so ``T ≥ r + q + Σ min(one, C·split) / C`` (``r = q = 0``
  is the plain work bound).  Both hold for every schedule.
- :func:`to_schedule`: start times and modes of the real ops back as a :class:`Schedule` of the
  whole problem (contracted ops start when their last predecessor ends and take no time).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from passes.algorithms.schedule.problem import Problem, Schedule


@dataclass
class Prepared:
    """A problem's real ops (those that take time) and what the solvers need of them; every
    per-op list is indexed by the op's position in ``real``."""

    problem: Problem
    order: list[int]  # topological order of all ops
    real: list[int]  # ops that take time (indices into problem.ops)
    pos: dict[int, int]  # op -> index in real
    kind: list[str]  # per real op
    cap: list[int]  # per real op: cores of its kind
    modes: list[list[tuple[float, int]]]  # per real op: (duration, cores held); mode 1 = split
    preds: list[list[int]]  # transitive-reduction predecessors (real indices)
    reach: list[int]  # bitset of real ancestors
    pmin: list[float]  # per real op: its shortest mode's duration
    head: list[float] = field(default_factory=list)  # longest path to the op's start
    tail: list[float] = field(default_factory=list)  # longest path after the op's end

    def comparable(self, a: int, b: int) -> bool:
        """Whether the graph orders real ops ``a`` and ``b`` (one is an ancestor of the other)."""
        return bool((self.reach[b] >> a) & 1 or (self.reach[a] >> b) & 1)


def prepare(problem: Problem) -> Prepared:
    """Contract the ops that take no time, reduce the graph transitively, list the modes."""
    order = problem.topological_order()
    cores = problem.core_count
    n = len(problem.ops)
    preds_all: list[list[int]] = [[] for _ in range(n)]
    for i, j in problem.edges:
        preds_all[j].append(i)
    is_real = [o.unit != "none" and min(o.one, o.split) > 0 for o in problem.ops]
    real = [i for i in order if is_real[i]]
    pos = {i: k for k, i in enumerate(real)}
    # Real predecessors of each op, through contracted ops (bitsets over real indices).
    direct = [0] * n
    for i in order:
        bits = 0
        for p in preds_all[i]:
            bits |= (1 << pos[p]) if is_real[p] else direct[p]
        direct[i] = bits
    m = len(real)
    reach = [0] * m
    direct_real = [direct[i] for i in real]
    for k in range(m):
        b = direct_real[k]
        ancestors = b
        while b:
            low = b & -b
            ancestors |= reach[low.bit_length() - 1]
            b ^= low
        reach[k] = ancestors
    preds: list[list[int]] = []
    for k in range(m):
        ps = bit_indices(direct_real[k])
        # i is redundant when another direct predecessor already has it as an ancestor.
        covered = 0
        for q in ps:
            covered |= reach[q]
        preds.append([p for p in ps if not (covered >> p) & 1])
    kind, cap, modes = [], [], []
    for i in real:
        o = problem.ops[i]
        c = cores[o.unit]
        kind.append(o.unit)
        cap.append(c)
        if c == 1:
            modes.append([(min(o.one, o.split), 1)])
        elif o.split < o.one:
            modes.append([(o.one, 1), (o.split, c)])
        else:
            modes.append([(o.one, 1)])
    return with_times(Prepared(problem, order, real, pos, kind, cap, modes, preds, reach, []))


def with_times(prep: Prepared) -> Prepared:
    """Fill ``pmin``, ``head`` and ``tail`` from the modes."""
    m = len(prep.real)
    pmin = prep.pmin = [min(d for d, _ in prep.modes[k]) for k in range(m)]
    preds = prep.preds
    head = [0.0] * m
    for k in range(m):
        head[k] = max((head[p] + pmin[p] for p in preds[k]), default=0.0)
    succs: list[list[int]] = [[] for _ in range(m)]
    for k in range(m):
        for p in preds[k]:
            succs[p].append(k)
    tail = [0.0] * m
    for k in reversed(range(m)):
        tail[k] = max((tail[s] + pmin[s] for s in succs[k]), default=0.0)
    prep.head, prep.tail = head, tail
    return prep


def bit_indices(x: int) -> list[int]:
    """The indices of the set bits of ``x``, lowest first."""
    out = []
    while x:
        low = x & -x
        out.append(low.bit_length() - 1)
        x ^= low
    return out


def lower_bounds(problem: Problem) -> tuple[float, float]:
    """``(critical_path, work_bound)`` in seconds (see the module docstring)."""
    return combinatorial_bounds(prepare(problem))


def energy_sets(prep: Prepared, limit: int | None = None) -> list[tuple[float, str, float, list[int]]]:
    """Energetic bounds: for a kind with ``C`` cores and thresholds ``r`` (a head) and ``q`` (a
    tail), the ops of that kind with ``head ≥ r`` and ``tail ≥ q`` all run within
    ``[r, T − q]``, so ``T ≥ r + q + Σ w_i / C`` with ``w_i = min(one_i, C·split_i)`` the least
    core-seconds op ``i`` needs (``r = q = 0`` is the plain work bound).  Returns
    ``(bound, kind, r + q, ops)``, strongest first, at most ``limit`` per kind."""
    m = len(prep.real)
    out = []
    by_kind: dict[str, list[int]] = {}
    for k in range(m):
        by_kind.setdefault(prep.kind[k], []).append(k)
    for kd, members in by_kind.items():
        c = prep.cap[members[0]]
        w = {
            k: min(prep.problem.ops[prep.real[k]].one, c * prep.problem.ops[prep.real[k]].split) / c
            if c > 1
            else prep.pmin[k]
            for k in members
        }
        found: dict[tuple[int, ...], tuple[float, float]] = {}
        for r in sorted({prep.head[k] for k in members}):
            for q in sorted({prep.tail[k] for k in members}):
                ops = tuple(k for k in members if prep.head[k] >= r and prep.tail[k] >= q)
                if not ops:
                    continue
                bound = r + q + sum(w[k] for k in ops)
                if ops not in found or found[ops][0] < bound:
                    found[ops] = (bound, r + q)
        sets = sorted(((b, kd, rq, list(ops)) for ops, (b, rq) in found.items()), key=lambda e: -e[0])
        out.extend(sets[:limit] if limit is not None else sets)
    out.sort(key=lambda e: -e[0])
    return out


def combinatorial_bounds(prep: Prepared) -> tuple[float, float]:
    """(critical path, energetic bound); the latter includes the work bound (``r = q = 0``)."""
    m = len(prep.real)
    cp = max((prep.head[k] + prep.pmin[k] + prep.tail[k] for k in range(m)), default=0.0)
    sets = energy_sets(prep, limit=1)
    return cp, (sets[0][0] if sets else 0.0)


def full_schedule(
    prep: Prepared, real_start: Sequence[float], real_mode: Sequence[int]
) -> tuple[list[float], list[float], list[int], list[bool]]:
    """Start/end/cores/split of every op from those of the real ops (contracted ops start when
    their last predecessor ends and take no time)."""
    p = prep.problem
    n = len(p.ops)
    start = [0.0] * n
    end = [0.0] * n
    cores = [0] * n
    split = [False] * n
    preds_all: list[list[int]] = [[] for _ in range(n)]
    for i, j in p.edges:
        preds_all[j].append(i)
    for i in prep.order:
        if i in prep.pos:
            k = prep.pos[i]
            duration, held = prep.modes[k][real_mode[k]]
            start[i], end[i] = float(real_start[k]), float(real_start[k]) + duration
            cores[i] = held
            split[i] = held > 1
        else:
            start[i] = end[i] = max((end[q] for q in preds_all[i]), default=0.0)
    return start, end, cores, split


def to_schedule(
    prep: Prepared,
    real_start: Sequence[float],
    real_mode: Sequence[int],
    method: str,
    lower_bound: float,
    cp_bound: float,
    work_bound: float,
    list_makespan: float,
    t0: float,
    status: str,
    num_binaries: int = 0,
    warm_start_accepted: bool | None = None,
) -> Schedule:
    """The :class:`Schedule` of the whole problem from the real ops' starts and modes, with the
    bounds and provenance given (``t0``: when the solve started, for ``solve_s``)."""
    start, end, cores, split = full_schedule(prep, real_start, real_mode)
    makespan = max(end, default=0.0)
    if not prep.real:
        method = "trivial"
    lower_bound = min(lower_bound, makespan)
    gap = (makespan - lower_bound) / makespan if makespan > 0 and makespan > lower_bound * (1 + 1e-12) else 0.0
    return Schedule(
        tuple(start),
        tuple(end),
        tuple(cores),
        tuple(split),
        makespan,
        status,
        gap,
        lower_bound,
        cp_bound,
        work_bound,
        list_makespan,
        method,
        num_binaries,
        time.perf_counter() - t0,
        warm_start_accepted,
    )
