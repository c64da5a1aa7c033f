"""Operator scheduling of one layer on one chip: minimize the makespan of a DAG of ops.

Pure code (no xDSL): ``phaze-schedule-ops`` builds a :class:`Problem` per layer and phase from
the IR (:func:`schedule_layers`) and solves it through a :class:`ScheduleCache`.

**The problem.**  Op ``i`` runs on a *unit kind* (``tensor``, ``vector``, ``network``; ``none``
for views, which take no time) that has ``cores[kind]`` identical cores.  It either runs on one
core for ``one`` seconds or is *split* over all cores of its kind for ``split`` seconds
(intra-op parallelism).  Precedence comes from the dataflow edges.  Resources are cumulative:
at any instant a kind runs at most ``cores[kind]`` single-core ops, and a split op runs alone on
its kind.  A kind with one core (the network link) runs its ops one at a time, each in
``min(one, split)``.  Minimize the makespan.

**Formulation (MILP; DESIGN §5).**  Time is scaled so that the warm start's makespan ``UB`` is
1000 units.

- Ops of unit ``none`` and ops of duration 0 are contracted away first; their precedence is
  kept through them.  Only the edges of the transitive reduction of what is left become rows.
- ``y_i ∈ {0,1}`` (split or one core) only where there is a choice (``cores > 1`` and
  ``split < one``; a split that is not faster is dominated: longer and more cores).
  ``p_i = one_i + (split_i − one_i)·y_i``; ``t_j ≥ t_i + p_i`` on the reduction's edges;
  ``T ≥ t_i + p_i`` for its sinks; ``head_i ≤ t_i ≤ UB − tail_i − p_i`` (longest paths with
  the shortest durations before and after the op); ``LB ≤ T ≤ UB``.
- Disjunctions only for pairs the graph leaves unordered (incomparable pairs of the same kind)
  *and* whose windows ``[head, UB − tail]`` intersect (any other pair is ordered in every schedule
  as good as the warm start).  ``x_ij = 1``: ``i`` ends before ``j`` starts,
  ``t_j ≥ t_i + p_i − M_ij·(1 − x_ij)`` with the tightest valid ``M_ij = UB − tail_i − head_j``;
  ``x_ij + x_ji ≤ 1``; a split op overlaps nothing of its kind: ``x_ij + x_ji ≥ y_i, y_j``; one
  core: ``x_ij + x_ji = 1``.
- Core counts ``1 < C``: every ``C+1`` ops of a kind that may pairwise overlap must contain an
  ordered pair, ``Σ_{pairs in S} (x_ij + x_ji) ≥ 1`` (sound: ops running at one instant overlap
  pairwise; complete: intervals that pairwise overlap share an instant (Helly), so a schedule
  with no ordered pair among ``C+1`` ops would run them all at once).  A kind with ``C`` at
  least the largest such set gets no row: its core count cannot bind.  When there are more than
  :data:`MAX_ANTICHAINS` such sets, a resource-flow formulation is used instead (Artigues,
  Michelon & Reusser, EJOR 2003): op ``i`` holds ``d_i = 1 + (C − 1)·y_i`` cores, continuous
  flows pass cores from ops to ops ordered by the graph or by ``x`` (``f_ij ≤ cap·x_ij``) from a
  source holding ``C``; every op receives exactly ``d_i`` and passes on at most ``d_i``.
- Energetic rows (the LP bound of big-M rows stays at the critical path otherwise): for a kind,
  the ops with ``head ≥ r`` and ``tail ≥ q`` all run within ``[r, T − q]``, so
  ``T ≥ r + q + Σ (core-seconds of op i in its mode) / C``; the :data:`ENERGY_CUTS` strongest
  ``(r, q)`` per kind.
- Lower bounds reported: the critical path with each op at ``min(one, split)``, and the
  energetic bound above with every op at its least core-seconds ``min(one, C·split)`` (``r = q
  = 0`` is the plain work bound ``Σ min(one, C·split) / C``); both hold for every schedule; and
  SCIP's dual bound.

**Solver.**  The model is built directly with pyscipopt (``backend="scip"``, the default):
cvxpy's SCIP interface ignores warm starts, goes through a ``dok_array`` and reports
``optimal_inaccurate`` at a time limit, while here the list schedule is handed to SCIP as its
first incumbent and SCIP's real status and dual bound are read.  The same model is also written
in cvxpy (``backend="cvxpy"``, ``cp.SCIP``; status and dual bound from cvxpy's
``solver_stats.extra_stats``); the tests check both agree.  SCIP's separators are off (they cost
most of the time and barely move big-M bounds).  Durations shorter than ``FLOOR·UB`` are raised
to it in the MILP (SCIP's 1e-6 tolerances cannot order shorter ops: see :func:`_floored`); the
returned schedule uses the true durations and the reported bound is lowered by the total raise.

**Warm start.**  A serial schedule generation scheme with insertion over a usage profile per
kind (a portfolio of priority rules: critical path, earliest start, latest start; and of mode
rules: earliest finish, one core, split, one core while the slack allows), each improved by
forward-backward justification; then a seeded local search over the op list and the modes
(:func:`_improve`, a fixed number of decodes: deterministic).  These heuristics are in Rust
(``rust/phaze-sched``, through the extension): a search schedules thousands of layers, and in
Python this local search was most of their time.  It is the upper bound ``UB``,
the incumbent handed to SCIP and the fallback.  When it meets the lower bound no MILP is built.

**Result.**  Only the discrete choices of SCIP's solution are kept (``y`` and ``x``): start times
are recomputed exactly as earliest starts under the graph plus that order, and the schedule is
checked (:func:`check_schedule`) before it is returned.  ``status``: ``"optimal"``, ``"gaplimit"``,
``"nodelimit"``,
``"timelimit"`` (the best schedule found and the proven ``gap``) or ``"heuristic"``.  Results are
deterministic unless a time limit cuts a solve short (fixed seeds).
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

from passes.algorithms.graph import Graph

UNITS = ("tensor", "vector", "network", "none")
_SCALE = 1000.0  # the list schedule's makespan, in the solver's time unit
ENERGY_CUTS = 8  # energetic cuts per unit kind in the MILP
MAX_ANTICHAINS = 20000  # above this many (C+1)-antichains a kind's capacity is a resource flow
#: Steps of the antichain enumeration before it gives up (and the kind becomes a resource flow):
#: a near-complete overlap graph without a (C+1)-clique makes it exponential (BERT-large's
#: forward, 104 vector ops on 64 cores, ran for hours).
MAX_ANTICHAIN_STEPS = 200_000
#: Bumped when a change makes :func:`solve` return different schedules for the same problem and
#: limits: cached entries of another revision are not reused unless proven optimal.
SOLVER_REVISION = 3
FLOOR = 1e-5  # durations below FLOOR * UB are raised to it in the MILP (see _floored)
LOCAL_SEARCH_BASE = 200  # decodes of the warm start's local search: BASE + PER_OP * ops
LOCAL_SEARCH_PER_OP = 10


# ---------------------------------------------------------------------------------------------
# Problem and result
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Op:
    """One op: ``unit`` kind, seconds on one core (``one``) and split over all cores (``split``)."""

    unit: str
    one: float
    split: float

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"op unit {self.unit!r}: expected one of {', '.join(UNITS)}")
        for name in ("one", "split"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"op {name} = {v!r}: expected a finite duration >= 0 (s)")


@dataclass(frozen=True)
class Problem:
    """A DAG of :class:`Op` (edges ``(i, j)``: ``j`` reads what ``i`` wrote) and the number of
    cores of each unit kind (``cores``, sorted ``(kind, count)`` pairs)."""

    ops: tuple[Op, ...]
    edges: tuple[tuple[int, int], ...]
    cores: tuple[tuple[str, int], ...]

    @classmethod
    def make(
        cls, ops: Iterable[Op | tuple[str, float, float]], edges: Iterable[tuple[int, int]], cores: Mapping[str, int]
    ) -> Problem:
        ops_t = tuple(o if isinstance(o, Op) else Op(*o) for o in ops)
        n = len(ops_t)
        es = tuple(sorted({(int(i), int(j)) for i, j in edges}))
        for i, j in es:
            if not (0 <= i < n and 0 <= j < n) or i == j:
                raise ValueError(f"edge ({i}, {j}) is not between two distinct ops of {n}")
        for k, c in cores.items():
            if k not in UNITS or k == "none" or not isinstance(c, int) or c < 1:
                raise ValueError(f"cores[{k!r}] = {c!r}: expected a unit kind and a count >= 1")
        problem = cls(ops_t, es, tuple(sorted(cores.items())))
        problem.topological_order()  # raises on a cycle
        for o in ops_t:
            if o.unit != "none" and o.unit not in cores and min(o.one, o.split) > 0:
                raise ValueError(f"no core count for unit {o.unit!r}")
        return problem

    @property
    def core_count(self) -> dict[str, int]:
        return dict(self.cores)

    def canonical(self) -> Problem:
        """The same problem with each core count ``C ≥ 2`` lowered to ``max(2, n)``, ``n`` the
        number of ops of that kind: ``n`` single-core ops never need more cores and a split op
        holds all of them whatever their number, so the feasible schedules (and the MILP's
        optimum) are the same.  Candidate chips that differ only in a core count no op can use
        then share one cache entry and one solve."""
        count: dict[str, int] = {}
        for o in self.ops:
            count[o.unit] = count.get(o.unit, 0) + 1
        cores = tuple((k, c if c < 2 else max(2, min(c, count.get(k, 0)))) for k, c in self.cores)
        return self if cores == self.cores else Problem(self.ops, self.edges, cores)

    def key(self) -> str:
        """A hash of everything that determines the optimum (floats exactly, via ``hex``)."""
        h = hashlib.sha256()
        h.update(repr(self.cores).encode())
        h.update(";".join(f"{o.unit},{float(o.one).hex()},{float(o.split).hex()}" for o in self.ops).encode())
        h.update(repr(self.edges).encode())
        return h.hexdigest()

    def topological_order(self) -> list[int]:
        n = len(self.ops)
        succ: list[list[int]] = [[] for _ in range(n)]
        indeg = [0] * n
        for i, j in self.edges:
            succ[i].append(j)
            indeg[j] += 1
        ready = [i for i in range(n) if indeg[i] == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for j in succ[i]:
                indeg[j] -= 1
                if indeg[j] == 0:
                    heapq.heappush(ready, j)
        if len(order) != n:
            raise ValueError("the op graph has a cycle")
        return order


@dataclass(frozen=True)
class Schedule:
    """A schedule of a :class:`Problem` (seconds).

    - ``start``/``end``: per op; ``cores``: cores it holds (``C`` if split, 1 on one core, 0 for
      ops that take no time); ``split``: whether it runs split.
    - ``makespan``; ``status``: ``"optimal"`` (proven, by SCIP or because a heuristic schedule
      meets the lower bound), ``"timelimit"`` (the time limit stopped SCIP: the best schedule
      found, ``gap`` > 0 possibly) or ``"heuristic"`` (the solver failed or was not run: the
      list schedule); ``gap`` = ``(makespan − lower_bound) / makespan`` (0 when optimal).
    - ``lower_bound``: the best proven bound (SCIP's dual bound, the critical path, the work
      bound); ``cp_bound``, ``work_bound``: the two combinatorial bounds; ``list_makespan``:
      the warm start's makespan; ``method``: ``"ilp"``, ``"list"`` (the list schedule was proven
      optimal by the bounds) or ``"trivial"`` (no op takes time).
    - ``num_binaries``/``solve_s``: size of the MILP and wall time of :func:`solve`.
    """

    start: tuple[float, ...]
    end: tuple[float, ...]
    cores: tuple[int, ...]
    split: tuple[bool, ...]
    makespan: float
    status: str
    gap: float
    lower_bound: float
    cp_bound: float
    work_bound: float
    list_makespan: float
    method: str
    num_binaries: int = 0
    solve_s: float = 0.0
    warm_start_accepted: bool | None = None

    def to_json(self) -> dict:
        return asdict(self)

    def on(self, problem: Problem) -> Schedule:
        """This schedule (of ``problem.canonical()``) as a schedule of ``problem``: split ops
        hold all of ``problem``'s cores of their kind."""
        caps = problem.core_count
        cores = tuple(caps[o.unit] if sp else c for o, sp, c in zip(problem.ops, self.split, self.cores))
        return self if cores == self.cores else replace(self, cores=cores)

    @classmethod
    def from_json(cls, d: Mapping) -> Schedule:
        d = dict(d)
        for k in ("start", "end", "cores", "split"):
            d[k] = tuple(d[k])
        return cls(**d)


# ---------------------------------------------------------------------------------------------
# Graph preparation: contraction, reachability, transitive reduction
# ---------------------------------------------------------------------------------------------


@dataclass
class _Prepared:
    problem: Problem
    order: list[int]  # topological order of all ops
    real: list[int]  # ops that take time (indices into problem.ops)
    pos: dict[int, int]  # op -> index in real
    kind: list[str]  # per real op
    cap: list[int]  # per real op: cores of its kind
    modes: list[list[tuple[float, int]]]  # per real op: (duration, cores held); mode 1 = split
    preds: list[list[int]]  # transitive-reduction predecessors (real indices)
    reach: list[int]  # bitset of real ancestors
    pmin: list[float]
    head: list[float] = field(default_factory=list)  # longest path to the op's start
    tail: list[float] = field(default_factory=list)  # longest path after the op's end

    def comparable(self, a: int, b: int) -> bool:
        return bool((self.reach[b] >> a) & 1 or (self.reach[a] >> b) & 1)


def _prepare(problem: Problem) -> _Prepared:
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
    rpreds_bits = [direct[i] for i in real]
    for k in range(m):
        b = rpreds_bits[k]
        acc = b
        while b:
            low = b & -b
            acc |= reach[low.bit_length() - 1]
            b ^= low
        reach[k] = acc
    preds: list[list[int]] = []
    for k in range(m):
        ps = _bits(rpreds_bits[k])
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
    return _timed(_Prepared(problem, order, real, pos, kind, cap, modes, preds, reach, []))


def _timed(prep: _Prepared) -> _Prepared:
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
    return prep


def _bits(x: int) -> list[int]:
    out = []
    while x:
        low = x & -x
        out.append(low.bit_length() - 1)
        x ^= low
    return out


def lower_bounds(problem: Problem) -> tuple[float, float]:
    """``(critical_path, work_bound)`` in seconds (see the module docstring)."""
    return _bounds(_prepare(problem))


def _energy_sets(prep: _Prepared, limit: int | None = None) -> list[tuple[float, str, float, list[int]]]:
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


def _bounds(prep: _Prepared) -> tuple[float, float]:
    """(critical path, energetic bound); the latter includes the work bound (``r = q = 0``)."""
    m = len(prep.real)
    cp = max((prep.head[k] + prep.pmin[k] + prep.tail[k] for k in range(m)), default=0.0)
    sets = _energy_sets(prep, limit=1)
    return cp, (sets[0][0] if sets else 0.0)


def _cliques(
    members: Sequence[int], nbrs: Mapping[int, set[int]], size: int, limit: int, steps: int = MAX_ANTICHAIN_STEPS
) -> list[list[int]] | None:
    """Every set of ``size`` ops among ``members`` that are pairwise neighbours in ``nbrs`` (None
    when there are more than ``limit``, or when the enumeration takes more than ``steps`` steps:
    a count, not the clock, so the answer does not depend on the machine)."""
    out: list[list[int]] = []
    budget = [steps]

    def rec(chosen: list[int], cand: list[int]) -> bool:
        budget[0] -= 1
        if budget[0] < 0:
            return False
        if len(chosen) == size:
            out.append(list(chosen))
            return len(out) <= limit
        if len(chosen) + len(cand) < size:
            return True
        for i, a in enumerate(cand):
            chosen.append(a)
            ok = rec(chosen, [b for b in cand[i + 1 :] if b in nbrs[a]])
            chosen.pop()
            if not ok:
                return False
        return True

    return out if rec([], sorted(members)) else None


# ---------------------------------------------------------------------------------------------
# List schedule (warm start, upper bound, fallback)
# ---------------------------------------------------------------------------------------------


def _rs_instance(prep: _Prepared) -> tuple[list[int], list[int], list[list[tuple[float, int]]], list[list[int]]]:
    """``prep`` as the Rust warm start's instance: kind indices, cores per kind, modes, preds."""
    kinds = sorted(set(prep.kind))
    index = {k: i for i, k in enumerate(kinds)}
    caps = [0] * len(kinds)
    for kd, c in zip(prep.kind, prep.cap):
        caps[index[kd]] = c
    return [index[kd] for kd in prep.kind], caps, prep.modes, prep.preds


def _best_list(prep: _Prepared) -> tuple[list[float], list[int], float]:
    """The best of a portfolio of list schedules (serial generation with insertion; priority
    rules critical path, earliest start, latest start × mode rules earliest finish, one core,
    split, one core while the slack allows), each improved by forward-backward justification
    (``phaze-sched``'s ``best_list``, through the Rust extension)."""
    from passes.algorithms import _phaze_rs

    if not prep.real:
        return [], [], 0.0
    return _phaze_rs.best_list_schedule(*_rs_instance(prep))


def _improve(
    prep: _Prepared, start: list[float], mode: list[int], mk: float, iterations: int, seed: int
) -> tuple[list[float], list[int], float]:
    """Local search on a schedule (``phaze-sched``'s ``improve``): move one op (and, sometimes,
    flip its mode) to a random place of the op list allowed by precedence, decode by serial
    generation with insertion and justification, keep the result when it is not worse.
    ``iterations`` decodes, seeded: deterministic."""
    from passes.algorithms import _phaze_rs

    if len(prep.real) < 2 or iterations <= 0:
        return start, mode, mk
    return _phaze_rs.improve_schedule(*_rs_instance(prep), start, mode, mk, iterations, seed)


def _decode_justified(prep: _Prepared, order: Sequence[int], mode: Sequence[int]) -> tuple[list[float], float]:
    """An op list (precedence-feasible) decoded with fixed modes, then justified."""
    from passes.algorithms import _phaze_rs

    if not prep.real:
        return [], 0.0
    return _phaze_rs.decode_justified(*_rs_instance(prep), list(order), list(mode))


def _full_schedule(
    prep: _Prepared, start_r: Sequence[float], mode_r: Sequence[int]
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
            dur, held = prep.modes[k][mode_r[k]]
            start[i], end[i] = float(start_r[k]), float(start_r[k]) + dur
            cores[i] = held
            split[i] = held > 1
        else:
            start[i] = end[i] = max((end[q] for q in preds_all[i]), default=0.0)
    return start, end, cores, split


def list_schedule(problem: Problem) -> Schedule:
    """The best of the list schedules (see :func:`_best_list`), as a :class:`Schedule`
    with status ``"heuristic"`` (``"optimal"`` when it meets the lower bound)."""
    prep = _prepare(problem)
    return _list_result(prep, time.perf_counter())


def _list_result(prep: _Prepared, t0: float) -> Schedule:
    s, md, mk = _best_list(prep)
    cp, work = _bounds(prep)
    lb = max(cp, work)
    proven = mk <= lb * (1 + 1e-9)
    return _result(prep, s, md, "list", mk if proven else lb, cp, work, mk, t0, "optimal" if proven else "heuristic")


def _result(
    prep: _Prepared,
    start_r,
    mode_r,
    method: str,
    lb: float,
    cp: float,
    work: float,
    list_mk: float,
    t0: float,
    status: str,
    nbin: int = 0,
    warm: bool | None = None,
) -> Schedule:
    start, end, cores, split = _full_schedule(prep, start_r, mode_r)
    mk = max(end, default=0.0)
    if not prep.real:
        method = "trivial"
    lb = min(lb, mk)
    gap = (mk - lb) / mk if mk > 0 and mk > lb * (1 + 1e-12) else 0.0
    return Schedule(
        tuple(start),
        tuple(end),
        tuple(cores),
        tuple(split),
        mk,
        status,
        gap,
        lb,
        cp,
        work,
        list_mk,
        method,
        nbin,
        time.perf_counter() - t0,
        warm,
    )


# ---------------------------------------------------------------------------------------------
# The MILP
# ---------------------------------------------------------------------------------------------


class _Model:
    """A solver-neutral MILP: variables with bounds and integrality, rows ``lo ≤ a·x ≤ hi``,
    minimize one variable."""

    def __init__(self) -> None:
        self.lb: list[float] = []
        self.ub: list[float] = []
        self.integer: list[bool] = []
        self.names: list[str] = []
        self.rows: list[tuple[list[int], list[float], float, float]] = []
        self.objective = -1

    def var(self, name: str, lb: float, ub: float, integer: bool = False) -> int:
        self.lb.append(lb)
        self.ub.append(ub)
        self.integer.append(integer)
        self.names.append(name)
        return len(self.lb) - 1

    def row(self, idx: list[int], coef: list[float], lo: float, hi: float) -> None:
        self.rows.append((idx, coef, lo, hi))


@dataclass
class _Vars:
    t: list[int]
    y: list[int | None]
    T: int
    x: dict[tuple[int, int], int]  # (a, b) -> var: a ends before b starts
    f: dict[tuple[int, int], int]  # flows; -1 = source
    flow_kinds: set[str]


class _TooLarge(Exception):
    """The MILP would exceed ``max_binaries`` (``args[0]``: its candidate binaries)."""


def _build(
    prep: _Prepared, ub: float, lb: float, capacity_model: str = "auto", max_binaries: int | None = None
) -> tuple[_Model, _Vars]:
    scale = _SCALE / ub
    m = len(prep.real)
    mdl = _Model()
    UB = _SCALE
    pdur = [[d * scale for d, _ in prep.modes[k]] for k in range(m)]
    head = [h * scale for h in prep.head]
    tail = [t * scale for t in prep.tail]
    pmin = [min(p) for p in pdur]
    t = [mdl.var(f"t{k}", head[k], max(head[k], UB - tail[k] - pmin[k])) for k in range(m)]
    y: list[int | None] = [mdl.var(f"y{k}", 0, 1, True) if len(pdur[k]) > 1 else None for k in range(m)]
    T = mdl.var("T", min(lb * scale, UB), UB)
    mdl.objective = T

    def dur_terms(k: int) -> tuple[list[int], list[float], float]:
        """p_k as (vars, coefs, constant)."""
        if y[k] is None:
            return [], [], pdur[k][0]
        return [y[k]], [pdur[k][1] - pdur[k][0]], pdur[k][0]

    has_succ = [False] * m
    for k in range(m):
        for p in prep.preds[k]:
            has_succ[p] = True
            vi, vc, c0 = dur_terms(p)
            # t_k - t_p - p_p >= 0
            mdl.row([t[k], t[p]] + vi, [1.0, -1.0] + [-c for c in vc], c0, math.inf)
    for k in range(m):
        if not has_succ[k]:
            vi, vc, c0 = dur_terms(k)
            mdl.row([T, t[k]] + vi, [1.0, -1.0] + [-c for c in vc], c0, math.inf)

    # Energetic cuts (valid for every schedule; they lift the LP bound, which big-M rows leave
    # at the critical path): T >= r + q + sum of the core-seconds of the ops in the window / C.
    for _, kd, rq, ops in _energy_sets(prep, limit=ENERGY_CUTS):
        c = prep.cap[ops[0]]
        idx, coef, const = [T], [1.0], rq * scale
        for k in ops:
            if y[k] is None:
                const += pdur[k][0] * prep.modes[k][0][1] / c
            else:
                const += pdur[k][0] / c  # one core: one_k core-seconds
                idx.append(y[k])
                coef.append(-(pdur[k][1] * c - pdur[k][0]) / c)  # split: C * split_k
        mdl.row(idx, coef, const, math.inf)

    by_kind: dict[str, list[int]] = {}
    for k in range(m):
        by_kind.setdefault(prep.kind[k], []).append(k)
    x: dict[tuple[int, int], int] = {}
    f: dict[tuple[int, int], int] = {}
    flow_kinds: set[str] = set()

    def order_var(a: int, b: int) -> int:
        if (a, b) not in x:
            x[(a, b)] = mdl.var(f"x{a}_{b}", 0, 1, True)
            vi, vc, c0 = dur_terms(a)
            big_m = max(0.0, UB - tail[a] - head[b])
            # t_b - t_a - p_a + M (1 - x_ab) >= 0  <=>  t_b - t_a - p_a - M x_ab >= -M
            mdl.row([t[b], t[a], x[(a, b)]] + vi, [1.0, -1.0, -big_m] + [-c for c in vc], c0 - big_m, math.inf)
        return x[(a, b)]

    # Two ops may overlap only when the graph leaves them unordered and their time windows
    # [head, UB - tail] (every schedule at least as good as the warm start keeps them) intersect;
    # any other pair is ordered in every such schedule and needs no variable.  Touching windows
    # count as intersecting (conservative).
    latest_end = [UB - tail[k] for k in range(m)]
    eps = 1e-9 * UB

    def may_overlap(a: int, b: int) -> bool:
        return not prep.comparable(a, b) and max(head[a], head[b]) < min(latest_end[a], latest_end[b]) + eps

    pairs_of = {
        kd: [(a, b) for ia, a in enumerate(members) for b in members[ia + 1 :] if may_overlap(a, b)]
        for kd, members in by_kind.items()
    }
    # The size rule, before anything costly is built: a mode per splittable op and two order
    # variables per pair of ops of a kind that may overlap (what a disjunctive model needs).
    candidates = sum(v is not None for v in y) + 2 * sum(len(v) for v in pairs_of.values())
    if max_binaries is not None and candidates > max_binaries:
        raise _TooLarge(candidates)
    for kd, members in by_kind.items():
        cap = prep.cap[members[0]]
        pairs = pairs_of[kd]
        if not pairs:
            continue
        if cap == 1:
            for a, b in pairs:
                mdl.row([order_var(a, b), order_var(b, a)], [1.0, 1.0], 1.0, 1.0)
            continue
        cliques = None
        if capacity_model != "flow":
            nbrs: dict[int, set[int]] = {k: set() for k in members}
            for a, b in pairs:
                nbrs[a].add(b)
                nbrs[b].add(a)
            cliques = (
                _cliques(members, nbrs, cap + 1, MAX_ANTICHAINS)
                if capacity_model == "auto"
                else _cliques(members, nbrs, cap + 1, 10**9, steps=10**18)
            )
        if cliques is not None:
            # Antichains: any cap+1 ops that may all overlap hold cap+1 cores at a common instant
            # if no two of them are ordered (intervals that pairwise overlap share a point).
            for clique in cliques:
                idx = []
                for ia, a in enumerate(clique):
                    for b in clique[ia + 1 :]:
                        idx += [order_var(a, b), order_var(b, a)]
                mdl.row(idx, [1.0] * len(idx), 1.0, math.inf)
            for a, b in pairs:
                if y[a] is None and y[b] is None:
                    if (a, b) in x:
                        mdl.row([x[(a, b)], x[(b, a)]], [1.0, 1.0], -math.inf, 1.0)
                    continue
                xa, xb = order_var(a, b), order_var(b, a)
                mdl.row([xa, xb], [1.0, 1.0], -math.inf, 1.0)
                for yy in (y[a], y[b]):
                    if yy is not None:  # a split op overlaps nothing of its kind
                        mdl.row([xa, xb, yy], [1.0, 1.0, -1.0], 0.0, math.inf)
            continue
        # Resource flow.
        flow_kinds.add(kd)
        dmax = {k: (cap if y[k] is not None else 1) for k in members}
        inflow: dict[int, list[int]] = {k: [] for k in members}
        outflow: dict[int, list[int]] = {k: [] for k in members}
        src_out: list[int] = []
        for k in members:
            v = mdl.var(f"f_s_{k}", 0, dmax[k])
            f[(-1, k)] = v
            inflow[k].append(v)
            src_out.append(v)
        for a in members:
            for b in members:
                if a == b:
                    continue
                ub_f = float(min(dmax[a], dmax[b]))
                if may_overlap(a, b):
                    v = mdl.var(f"f{a}_{b}", 0, ub_f)
                    mdl.row([v, order_var(a, b)], [1.0, -ub_f], -math.inf, 0.0)
                elif (prep.reach[b] >> a) & 1 or (not prep.comparable(a, b) and latest_end[a] <= latest_end[b]):
                    v = mdl.var(f"f{a}_{b}", 0, ub_f)  # a ends before b starts in every schedule
                else:
                    continue
                f[(a, b)] = v
                outflow[a].append(v)
                inflow[b].append(v)
        for a, b in pairs:
            mdl.row([x[(a, b)], x[(b, a)]], [1.0, 1.0], -math.inf, 1.0)
        mdl.row(src_out, [1.0] * len(src_out), -math.inf, float(cap))
        for k in members:
            # demand d_k = 1 + (cap - 1) y_k: received exactly, passed on at most
            dv, dc = ([y[k]], [-(cap - 1.0)]) if y[k] is not None else ([], [])
            mdl.row(inflow[k] + dv, [1.0] * len(inflow[k]) + dc, 1.0, 1.0)
            if outflow[k]:
                mdl.row(outflow[k] + dv, [1.0] * len(outflow[k]) + dc, -math.inf, 1.0)
    return mdl, _Vars(t, y, T, x, f, flow_kinds)


def _warm_values(
    prep: _Prepared, vars_: _Vars, start_r: Sequence[float], mode_r: Sequence[int], ub: float
) -> dict[int, float]:
    """The list schedule as values of every model variable (flows allocated greedily)."""
    scale = _SCALE / ub
    m = len(prep.real)
    dur = [prep.modes[k][mode_r[k]][0] for k in range(m)]
    s = [start_r[k] * scale for k in range(m)]
    e = [(start_r[k] + dur[k]) * scale for k in range(m)]
    vals: dict[int, float] = {}
    for k in range(m):
        vals[vars_.t[k]] = s[k]
        if vars_.y[k] is not None:
            vals[vars_.y[k]] = float(mode_r[k])
    vals[vars_.T] = max(e, default=0.0)
    tol = 1e-9 * _SCALE
    for (a, b), v in vars_.x.items():
        vals[v] = 1.0 if e[a] <= s[b] + tol and not (e[b] <= s[a] + tol and b < a) else 0.0
    for v in vars_.f.values():
        vals[v] = 0.0
    for kd in vars_.flow_kinds:
        members = [k for k in range(m) if prep.kind[k] == kd]
        cap = prep.cap[members[0]]
        held = {k: (prep.modes[k][mode_r[k]][1]) for k in members}
        avail: dict[int, float] = {-1: float(cap)}
        for k in sorted(members, key=lambda k: (s[k], e[k])):
            need = float(held[k])
            donors = [-1] + sorted(
                (a for a in avail if a >= 0 and e[a] <= s[k] + tol and (a, k) in vars_.f), key=lambda a: e[a]
            )
            for a in donors:
                if need <= 0:
                    break
                give = min(need, avail[a])
                if give <= 0:
                    continue
                vals[vars_.f[(a, k)]] += give
                avail[a] -= give
                need -= give
            avail[k] = float(held[k])
    return vals


def _solve_scip(
    mdl: _Model,
    time_limit: float,
    seed: int,
    warm: dict[int, float] | None,
    gap_limit: float = 0.0,
    node_limit: int | None = None,
):
    import pyscipopt

    model = pyscipopt.Model()
    model.hideOutput()
    model.setParam("limits/time", float(time_limit))
    if node_limit is not None:
        model.setParam("limits/nodes", int(node_limit))
    model.setParam("limits/gap", float(gap_limit))
    model.setParam("randomization/randomseedshift", int(seed))
    model.setParam("randomization/permutationseed", int(seed))
    model.setParam("randomization/lpseed", int(seed))
    # Cutting planes barely move the bound of big-M disjunctions and cost most of the time
    # (measured on Llama-2-7B's layers: 1-3 s with them, ~1 s without); the energetic rows
    # above are the cuts that matter.
    model.setSeparating(pyscipopt.SCIP_PARAMSETTING.OFF)
    xs = []
    for i in range(len(mdl.lb)):
        vt = "B" if mdl.integer[i] and mdl.lb[i] == 0 and mdl.ub[i] == 1 else ("I" if mdl.integer[i] else "C")
        xs.append(
            model.addVar(
                name=mdl.names[i], vtype=vt, lb=mdl.lb[i], ub=mdl.ub[i], obj=1.0 if i == mdl.objective else 0.0
            )
        )
    for idx, coef, lo, hi in mdl.rows:
        expr = pyscipopt.quicksum(c * xs[v] for v, c in zip(idx, coef))
        if lo == hi:
            model.addCons(expr == lo)
        else:
            if lo != -math.inf:
                model.addCons(expr >= lo)
            if hi != math.inf:
                model.addCons(expr <= hi)
    accepted = None
    if warm is not None:
        sol = model.createSol()
        for v, val in warm.items():
            model.setSolVal(sol, xs[v], val)
        accepted = bool(model.addSol(sol, free=True))
    model.optimize()
    status = model.getStatus()
    values = None
    if model.getNSols() > 0:
        best = model.getBestSol()
        values = [model.getSolVal(best, v) for v in xs]
    dual = model.getDualbound() if status != "infeasible" else math.inf
    return status, values, dual, accepted


def _solve_cvxpy(mdl: _Model, time_limit: float, seed: int, gap_limit: float = 0.0):
    import cvxpy as cp
    import numpy as np
    import scipy.sparse as sp

    n = len(mdl.lb)
    int_idx = [i for i in range(n) if mdl.integer[i]]
    con_idx = [i for i in range(n) if not mdl.integer[i]]
    where = {}
    for a, i in enumerate(int_idx):
        where[i] = (0, a)
    for a, i in enumerate(con_idx):
        where[i] = (1, a)
    xi = cp.Variable(len(int_idx), integer=True) if int_idx else None
    xc = cp.Variable(len(con_idx)) if con_idx else None
    rows_i, rows_c = ([], [], []), ([], [], [])
    lo_list, hi_list = [], []
    for r, (idx, coef, lo, hi) in enumerate(mdl.rows):
        for v, c in zip(idx, coef):
            blk, a = where[v]
            tgt = rows_i if blk == 0 else rows_c
            tgt[0].append(r)
            tgt[1].append(a)
            tgt[2].append(c)
        lo_list.append(lo)
        hi_list.append(hi)
    nr = len(mdl.rows)
    expr = 0
    if xi is not None:
        expr = expr + sp.csr_matrix((rows_i[2], (rows_i[0], rows_i[1])), shape=(nr, len(int_idx))) @ xi
    if xc is not None:
        expr = expr + sp.csr_matrix((rows_c[2], (rows_c[0], rows_c[1])), shape=(nr, len(con_idx))) @ xc
    lo_a, hi_a = np.array(lo_list), np.array(hi_list)
    cons = []
    fin_hi = np.isfinite(hi_a)
    fin_lo = np.isfinite(lo_a)
    if fin_hi.any():
        cons.append(expr[np.flatnonzero(fin_hi)] <= hi_a[fin_hi])
    if fin_lo.any():
        cons.append(expr[np.flatnonzero(fin_lo)] >= lo_a[fin_lo])
    for blk_var, idx in ((xi, int_idx), (xc, con_idx)):
        if blk_var is None:
            continue
        lb = np.array([mdl.lb[i] for i in idx])
        ub = np.array([mdl.ub[i] for i in idx])
        cons += [blk_var >= lb, blk_var <= ub]
    blk, a = where[mdl.objective]
    obj_var = (xi if blk == 0 else xc)[a]
    prob = cp.Problem(cp.Minimize(obj_var), cons)
    prob.solve(
        solver=cp.SCIP,
        scip_params={
            "limits/time": float(time_limit),
            "limits/gap": float(gap_limit),
            "randomization/randomseedshift": int(seed),
        },
    )
    extra = prob.solver_stats.extra_stats or {}
    status = extra.get("scip_status", prob.status)
    model = extra.get("model")
    dual = model.getDualbound() if model is not None and status != "infeasible" else -math.inf
    values = None
    if prob.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        values = [0.0] * n
        for i in range(n):
            blk, a = where[i]
            values[i] = float((xi if blk == 0 else xc).value[a])
    return status, values, dual, None


def _decode(prep: _Prepared, vars_: _Vars, values: Sequence[float]) -> tuple[list[float], list[int]] | None:
    """Start times from the solution's discrete choices: earliest starts under the graph and
    the chosen order ``x`` (None if that order has a cycle, which a valid solution never has)."""
    m = len(prep.real)
    mode = [0 if vars_.y[k] is None else int(round(values[vars_.y[k]])) for k in range(m)]
    preds = [list(p) for p in prep.preds]
    for (a, b), v in vars_.x.items():
        if values[v] > 0.5:
            preds[b].append(a)
    succs: list[list[int]] = [[] for _ in range(m)]
    indeg = [0] * m
    for b in range(m):
        for a in preds[b]:
            succs[a].append(b)
            indeg[b] += 1
    ready = [k for k in range(m) if indeg[k] == 0]
    start = [0.0] * m
    seen = 0
    while ready:
        a = ready.pop()
        seen += 1
        fa = start[a] + prep.modes[a][mode[a]][0]
        for b in succs[a]:
            start[b] = max(start[b], fa)
            indeg[b] -= 1
            if indeg[b] == 0:
                ready.append(b)
    if seen != m:
        return None
    return start, mode


def _floored(prep: _Prepared, delta: float) -> tuple[_Prepared, int]:
    """The problem with every duration raised to at least ``delta`` (and how many were raised).

    SCIP's tolerances (1e-6 absolute on rows, on integrality too, so a big-M row may be slack by
    ``M·1e-6``) cannot separate ops shorter than that: with them as they are, a solution may
    order a few near-zero ops in a cycle.  The MILP is therefore built on durations of at least
    ``delta = FLOOR·UB``; a schedule for longer durations stays valid when they shrink back (the
    returned schedule uses the true durations), and the proven lower bound is lowered by the
    total increase, so the reported gap stays honest."""
    raised = 0
    modes = []
    for ms in prep.modes:
        new = []
        for d, h in ms:
            if d < delta:
                raised += 1
                d = delta
            new.append((d, h))
        modes.append(new)
    if not raised:
        return prep, 0
    fl = _Prepared(
        prep.problem, prep.order, prep.real, prep.pos, prep.kind, prep.cap, modes, prep.preds, prep.reach, []
    )
    return _timed(fl), raised


def solve(
    problem: Problem,
    time_limit: float = 10.0,
    seed: int = 0,
    backend: str = "scip",
    capacity_model: str = "auto",
    gap_limit: float = 0.0,
    node_limit: int | None = None,
    max_binaries: int | None = None,
) -> Schedule:
    """Minimize the makespan of ``problem`` (see the module docstring).  ``time_limit`` bounds
    SCIP's time (s); ``gap_limit`` stops it once the relative gap is that small (0: prove
    optimality); ``node_limit`` stops it after that many branch-and-bound nodes (``None``: no
    limit; unlike a time limit, a node limit gives the same answer on a loaded or idle machine,
    which is what the architecture search needs); ``max_binaries``: a MILP that would need more binaries
    (a mode per splittable op, two order variables per pair of same-kind ops that may overlap) is
    not built, the warm start is the answer (status ``"heuristic"``, ``num_binaries`` that count;
    such a MILP's root LP alone can take a minute: a size rule keeps the search's cost bounded and
    machine-independent);
    ``seed`` its random seeds; ``backend`` is ``"scip"`` (pyscipopt, warm
    started) or ``"cvxpy"`` (the same model through cvxpy, no warm start).  ``capacity_model``
    (``"auto"``, ``"antichain"``, ``"flow"``) picks how core counts between 2 and the width are
    modelled (``auto``: antichains unless there are more than ``MAX_ANTICHAINS``)."""
    if backend not in ("scip", "cvxpy"):
        raise ValueError(f"backend {backend!r}: expected 'scip' or 'cvxpy'")
    if capacity_model not in ("auto", "antichain", "flow"):
        raise ValueError(f"capacity_model {capacity_model!r}: expected 'auto', 'antichain' or 'flow'")
    t0 = time.perf_counter()
    prep = _prepare(problem)
    s_list, md_list, ub = _best_list(prep)
    cp, work = _bounds(prep)
    lb = max(cp, work)
    if not prep.real or ub <= lb * (1 + 1e-9):
        return _result(prep, s_list, md_list, "list", ub, cp, work, ub, t0, "optimal")
    s_list, md_list, ub = _improve(
        prep, s_list, md_list, ub, LOCAL_SEARCH_BASE + LOCAL_SEARCH_PER_OP * len(prep.real), seed
    )
    if ub <= lb * (1 + 1e-9):
        return _result(prep, s_list, md_list, "list", ub, cp, work, ub, t0, "optimal")
    # The model's problem: durations floored (see _floored), its own list schedule as warm start.
    delta = FLOOR * ub
    mprep, raised = _floored(prep, delta)
    if raised:
        # The improved schedule's op order and modes, decoded with the floored durations.
        order = sorted(range(len(prep.real)), key=lambda k: (s_list[k], k))
        ms_list, mub = _decode_justified(mprep, order, md_list)
        mmd_list = list(md_list)
    else:
        ms_list, mmd_list, mub = s_list, md_list, ub
    mcp, mwork = _bounds(mprep)
    try:
        mdl, vars_ = _build(mprep, mub, max(mcp, mwork), capacity_model, max_binaries)
    except _TooLarge as e:
        return _result(prep, s_list, md_list, "list", lb, cp, work, ub, t0, "heuristic", nbin=e.args[0])
    nbin = sum(mdl.integer)
    try:
        if backend == "scip":
            warm = _warm_values(mprep, vars_, ms_list, mmd_list, mub)
            status, values, dual, accepted = _solve_scip(mdl, time_limit, seed, warm, gap_limit, node_limit)
        else:
            status, values, dual, accepted = _solve_cvxpy(mdl, time_limit, seed, gap_limit)
    except Exception:
        return _result(prep, s_list, md_list, "list", lb, cp, work, ub, t0, "heuristic", nbin=nbin)
    best_s, best_md, method, best_mk = s_list, md_list, "list", ub
    if values is not None:
        decoded = _decode(prep, vars_, values)
        if decoded is not None:
            s_ilp, md_ilp = decoded
            mk = max((s_ilp[k] + prep.modes[k][md_ilp[k]][0] for k in range(len(s_ilp))), default=0.0)
            cand = _full_schedule(prep, s_ilp, md_ilp)
            if not check_schedule(problem, cand[0], cand[1], cand[2]) and mk <= ub:
                best_s, best_md, method, best_mk = s_ilp, md_ilp, "ilp", mk
    # SCIP's dual bound is for the floored durations: lower it by the total increase.
    dual_s = dual * mub / _SCALE - raised * delta if dual is not None and math.isfinite(dual) else 0.0
    lb = max(lb, dual_s)
    model_opt_s = dual * mub / _SCALE if dual is not None and math.isfinite(dual) else math.inf
    if status == "optimal" and best_mk <= model_opt_s * (1 + 1e-9):
        # Optimal for the model; exactly so unless durations were floored (then the gap says
        # how far from the true optimum it can be).
        lb = best_mk if not raised else lb
        out = "optimal"
    elif status == "gaplimit":
        out = "gaplimit"
    elif status in ("nodelimit", "totalnodelimit", "stallnodelimit"):
        out = "nodelimit"
    elif status in ("timelimit", "memlimit"):
        out = "timelimit"
    else:
        out = "optimal" if best_mk <= lb * (1 + 1e-9) else "heuristic"
    return _result(prep, best_s, best_md, method, lb, cp, work, ub, t0, out, nbin=nbin, warm=accepted)


# ---------------------------------------------------------------------------------------------
# Checking
# ---------------------------------------------------------------------------------------------


def check_schedule(
    problem: Problem, start: Sequence[float], end: Sequence[float], cores: Sequence[int], rel_tol: float = 1e-9
) -> list[str]:
    """Every way the schedule breaks the problem's rules (empty when it is valid): durations,
    precedence, at most ``C`` cores of a kind busy at once, a split op alone on its kind."""
    errors: list[str] = []
    caps = problem.core_count
    mk = max(end, default=0.0)
    tol = rel_tol * max(mk, 1e-300)
    for i, o in enumerate(problem.ops):
        d = end[i] - start[i]
        if start[i] < -tol:
            errors.append(f"op {i} starts before 0")
        if o.unit == "none" or min(o.one, o.split) == 0:
            if abs(d) > tol:
                errors.append(f"op {i} takes no time but lasts {d}")
            continue
        c = caps[o.unit]
        allowed = {(min(o.one, o.split), 1)} if c == 1 else {(o.one, 1), (o.split, c)}
        if not any(abs(d - a) <= tol and cores[i] == h for a, h in allowed):
            errors.append(f"op {i} lasts {d} on {cores[i]} cores; allowed {sorted(allowed)}")
    for i, j in problem.edges:
        if start[j] < end[i] - tol:
            errors.append(f"edge {i}->{j}: starts at {start[j]} before {end[i]}")
    by_kind: dict[str, list[int]] = {}
    for i, o in enumerate(problem.ops):
        if o.unit != "none" and end[i] - start[i] > tol:
            by_kind.setdefault(o.unit, []).append(i)
    for kd, ops in by_kind.items():
        c = caps[kd]
        events = sorted([(end[i] - tol, -cores[i]) for i in ops] + [(start[i], cores[i]) for i in ops])
        used = 0
        for _, delta in events:
            used += delta
            if used > c:
                errors.append(f"{kd}: {used} cores busy at once, {c} exist")
                break
    return errors


# ---------------------------------------------------------------------------------------------
# Layers of a training step
# ---------------------------------------------------------------------------------------------

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


@dataclass
class LayerSchedule:
    """The schedules of one layer: ``groups[phase] = (op ids, Schedule)`` for ``fwd`` and
    ``bwd`` (per micro-batch) and ``opt`` (the optimizer step, once per batch: a group of its
    own, not folded into the backward)."""

    index: int
    groups: dict[str, tuple[list[int], Schedule]]

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
            "status": self.status,
            "gap": self.gap,
        }


def schedule_layers(
    graph: Graph,
    layer_of: Sequence[int],
    latency: Sequence[Op],
    cores: Mapping[str, int],
    time_limit: float = 10.0,
    seed: int = 0,
    cache: ScheduleCache | None = None,
    gap_limit: float = 0.0,
    node_limit: int | None = None,
    max_binaries: int | None = None,
) -> list[LayerSchedule]:
    """Schedule every layer's forward, backward and optimizer ops (``latency[i]`` of op ``i``;
    ``layer_of[i]`` its layer).  Identical layers (and any repeated problem) are solved once
    through ``cache`` (the process-wide :data:`DEFAULT_CACHE` unless given)."""
    cache = DEFAULT_CACHE if cache is None else cache
    groups = phase_groups(graph, layer_of)
    out: dict[int, LayerSchedule] = {}
    for (layer, phase), ids in sorted(groups.items(), key=lambda kv: (kv[0][0], PHASE_GROUPS.index(kv[0][1]))):
        problem = group_problem(graph, ids, latency, cores)
        sched = cache.solve(
            problem,
            time_limit=time_limit,
            seed=seed,
            gap_limit=gap_limit,
            node_limit=node_limit,
            max_binaries=max_binaries,
        )
        out.setdefault(layer, LayerSchedule(layer, {})).groups[phase] = (ids, sched)
    return [out[k] for k in sorted(out)]


# ---------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------


class ScheduleCache:
    """Schedules by problem (:meth:`Problem.key` of :meth:`Problem.canonical`: ops' units and
    durations, edges, the core counts that matter): identical layers, and the same layer under
    the same latencies in another architecture candidate, are solved once.  An optional
    directory keeps them across processes and runs (one JSON file per key, written atomically;
    an interrupted search resumes from it).

    A result is reused only for the solver limits it was computed with (time, gap, node and
    binaries limits) and by the same :data:`SOLVER_REVISION`, or whatever they are when it is
    proven optimal: a cached answer is then always the
    answer a fresh solve would give (exactly so when the node limit, not the clock, stops SCIP)."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self._mem: dict[str, tuple[Schedule, tuple]] = {}
        self.directory = os.fspath(directory) if directory is not None else None
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._mem)

    def clear(self) -> None:
        """Forget the in-process entries (the directory, if any, stays)."""
        self._mem.clear()
        self.hits = self.misses = 0

    @staticmethod
    def limits(
        time_limit: float,
        gap_limit: float,
        node_limit: int | None,
        max_binaries: int | None = None,
        revision: int = SOLVER_REVISION,
    ) -> tuple:
        """What a cached entry must match to be reused (unless optimal): the limits and the
        solver's revision."""
        return (
            float(time_limit),
            float(gap_limit),
            None if node_limit is None else int(node_limit),
            None if max_binaries is None else int(max_binaries),
            int(revision),
        )

    def _entry(self, key: str) -> tuple[Schedule, tuple] | None:
        entry = self._mem.get(key)
        if entry is None and self.directory is not None:
            path = os.path.join(self.directory, key + ".json")
            if os.path.exists(path):
                try:
                    with open(path) as fh:
                        data = json.load(fh)
                    entry = (
                        Schedule.from_json(data["schedule"]),
                        self.limits(
                            data["time_limit"],
                            data["gap_limit"],
                            data.get("node_limit"),
                            data.get("max_binaries"),
                            data.get("revision", 1),
                        ),
                    )
                except (OSError, ValueError, KeyError, TypeError):
                    return None  # a torn or foreign file: solve again and overwrite it
                self._mem[key] = entry
        return entry

    def lookup(self, canonical: Problem, limits: tuple) -> Schedule | None:
        """The cached schedule of a canonical problem under ``limits`` (:meth:`limits`)."""
        entry = self._entry(canonical.key())
        if entry is not None and (entry[0].status == "optimal" or entry[1] == limits):
            return entry[0]
        return None

    def get(
        self,
        problem: Problem,
        time_limit: float = 10.0,
        gap_limit: float = 0.0,
        node_limit: int | None = None,
        max_binaries: int | None = None,
    ) -> Schedule | None:
        hit = self.lookup(problem.canonical(), self.limits(time_limit, gap_limit, node_limit, max_binaries))
        return hit.on(problem) if hit is not None else None

    def store(self, canonical: Problem, sched: Schedule, limits: tuple) -> None:
        """Keep the schedule of a canonical problem solved under ``limits``."""
        key = canonical.key()
        self._mem[key] = (sched, limits)
        if self.directory is not None:
            os.makedirs(self.directory, exist_ok=True)
            tmp = os.path.join(self.directory, f".{key}.{os.getpid()}.tmp")
            time_limit, gap_limit, node_limit, max_binaries, revision = limits
            with open(tmp, "w") as fh:
                json.dump(
                    {
                        "time_limit": time_limit,
                        "gap_limit": gap_limit,
                        "node_limit": node_limit,
                        "max_binaries": max_binaries,
                        "revision": revision,
                        "schedule": sched.to_json(),
                    },
                    fh,
                )
            os.replace(tmp, os.path.join(self.directory, key + ".json"))

    def put(
        self,
        problem: Problem,
        sched: Schedule,
        time_limit: float,
        gap_limit: float = 0.0,
        node_limit: int | None = None,
        max_binaries: int | None = None,
    ) -> None:
        """Keep ``sched``, a schedule of ``problem.canonical()`` (what :meth:`solve` solves)."""
        self.store(problem.canonical(), sched, self.limits(time_limit, gap_limit, node_limit, max_binaries))

    def solve(
        self,
        problem: Problem,
        time_limit: float = 10.0,
        seed: int = 0,
        backend: str = "scip",
        gap_limit: float = 0.0,
        node_limit: int | None = None,
        max_binaries: int | None = None,
    ) -> Schedule:
        """:func:`solve` through the cache (on the canonical problem, so that the answer does
        not depend on which equivalent problem was asked first)."""
        canonical = problem.canonical()
        limits = self.limits(time_limit, gap_limit, node_limit, max_binaries)
        hit = self.lookup(canonical, limits)
        if hit is not None:
            self.hits += 1
            return hit.on(problem)
        self.misses += 1
        sched = solve(
            canonical,
            time_limit=time_limit,
            seed=seed,
            backend=backend,
            gap_limit=gap_limit,
            node_limit=node_limit,
            max_binaries=max_binaries,
        )
        self.store(canonical, sched, limits)
        return sched.on(problem)


#: The process-wide cache the passes share (an architecture search re-running the passes over
#: many candidates solves each distinct layer problem once).
DEFAULT_CACHE = ScheduleCache(os.environ.get("PHAZE_SCHEDULE_CACHE") or None)
