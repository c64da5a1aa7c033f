"""The MILP of a prepared problem (docs/design.md §5.6): variables, four families of rows, the warm
start's values, and a solution's discrete choices decoded back into start times.

Time is scaled so that the warm start's makespan ``UB`` is :data:`SCALE` units (the *horizon*).

- **Variables.**  ``t_i`` (:attr:`MilpVariables.start`) per real op; ``y_i ∈ {0,1}``
  (:attr:`MilpVariables.split`: split or one core) only where there is a choice;
  ``p_i = one_i + (split_i − one_i)·y_i``; ``T`` (:attr:`MilpVariables.makespan`) with
  ``LB ≤ T ≤ UB``; ``head_i ≤ t_i ≤ UB − tail_i − p_i``.
- **Precedence rows.**  ``t_j ≥ t_i + p_i`` on the transitive reduction's edges; ``T ≥ t_i +
  p_i`` for its sinks.
- **Energetic rows** (the LP bound of big-M rows stays at the critical path otherwise): for a
  kind, the ops with ``head ≥ r`` and ``tail ≥ q`` all run within ``[r, T − q]``, so ``T ≥ r +
  q + Σ (core-seconds of op i in its mode) / C``; the :data:`ENERGY_CUTS` strongest ``(r, q)``
  per kind.
- **Disjunctive order rows**, only for pairs the graph leaves unordered (incomparable pairs of
  the same kind) *and* whose windows ``[head, UB − tail]`` intersect (any other pair is ordered
  in every schedule as good as the warm start).  ``x_ij = 1`` (:attr:`MilpVariables.order`):
  ``i`` ends before ``j`` starts, ``t_j ≥ t_i + p_i − M_ij·(1 − x_ij)`` with the tightest valid
  ``M_ij = UB − tail_i − head_j``; ``x_ij + x_ji ≤ 1``; a split op overlaps nothing of its
  kind: ``x_ij + x_ji ≥ y_i, y_j``; one core: ``x_ij + x_ji = 1``.
- **Capacity rows** for core counts ``1 < C``: every ``C+1`` ops of a kind that may pairwise
  overlap must contain an ordered pair, ``Σ_{pairs in S} (x_ij + x_ji) ≥ 1`` (sound: ops running
  at one instant overlap pairwise; complete: intervals that pairwise overlap share an instant
  (Helly), so a schedule with no ordered pair among ``C+1`` ops would run them all at once).  A
  kind with ``C`` at least the largest such set gets no row: its core count cannot bind.  When
  there are more than :data:`MAX_ANTICHAINS` such sets, a resource-flow formulation is used
  instead (Artigues, Michelon & Reusser, EJOR 2003): op ``i`` holds ``d_i = 1 + (C − 1)·y_i``
  cores, continuous flows (:attr:`MilpVariables.flow`) pass cores from ops to ops ordered by the
  graph or by ``x`` (``f_ij ≤ cap·x_ij``) from a source holding ``C``; every op receives exactly
  ``d_i`` and passes on at most ``d_i``.

Durations shorter than ``FLOOR·UB`` are raised to it before the MILP is built
(:func:`floored`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from passes.algorithms.schedule.prepared import Prepared, energy_sets, with_times

SCALE = 1000.0  # the list schedule's makespan, in the solver's time unit
ENERGY_CUTS = 8  # energetic cuts per unit kind in the MILP
MAX_ANTICHAINS = 20000  # above this many (C+1)-antichains a kind's capacity is a resource flow
#: Steps of the antichain enumeration before it gives up (and the kind becomes a resource flow):
#: a near-complete overlap graph without a (C+1)-clique makes it exponential (BERT-large's
#: forward, 104 vector ops on 64 cores, ran for hours).
MAX_ANTICHAIN_STEPS = 200_000
FLOOR = 1e-5  # durations below FLOOR * UB are raised to it in the MILP (see floored)


class Milp:
    """A solver-neutral MILP: variables with bounds and integrality, rows ``lo ≤ a·x ≤ hi``,
    minimize one variable."""

    def __init__(self) -> None:
        self.lower: list[float] = []
        self.upper: list[float] = []
        self.integer: list[bool] = []
        self.names: list[str] = []
        self.rows: list[tuple[list[int], list[float], float, float]] = []
        self.objective = -1

    def var(self, name: str, lower: float, upper: float, integer: bool = False) -> int:
        self.lower.append(lower)
        self.upper.append(upper)
        self.integer.append(integer)
        self.names.append(name)
        return len(self.lower) - 1

    def row(self, idx: list[int], coef: list[float], lo: float, hi: float) -> None:
        self.rows.append((idx, coef, lo, hi))


@dataclass
class MilpVariables:
    """The indices of the model's variables, per real op or pair of real ops."""

    start: list[int]  # t_i
    split: list[int | None]  # y_i, where op i has a choice of mode
    makespan: int  # T
    order: dict[tuple[int, int], int]  # x_ab: a ends before b starts
    flow: dict[tuple[int, int], int]  # f_ab: cores passed from a to b; a = -1 is the source
    flow_kinds: set[str]  # the kinds whose capacity is a resource flow


class MilpTooLarge(Exception):
    """The MILP would exceed ``max_binaries`` (``args[0]``: its candidate binaries)."""


class _Builder:
    """The rows of one MILP, family by family, over shared variables (times in solver units)."""

    def __init__(self, prep: Prepared, list_makespan: float, lower_bound: float) -> None:
        self.prep = prep
        self.scale = scale = SCALE / list_makespan
        m = len(prep.real)
        self.model = model = Milp()
        self.horizon = horizon = SCALE
        self.durations = [[d * scale for d, _ in prep.modes[k]] for k in range(m)]
        self.head = head = [h * scale for h in prep.head]
        self.tail = tail = [t * scale for t in prep.tail]
        shortest = [min(p) for p in self.durations]
        start = [model.var(f"t{k}", head[k], max(head[k], horizon - tail[k] - shortest[k])) for k in range(m)]
        split: list[int | None] = [
            model.var(f"y{k}", 0, 1, True) if len(self.durations[k]) > 1 else None for k in range(m)
        ]
        makespan = model.var("T", min(lower_bound * scale, horizon), horizon)
        model.objective = makespan
        self.vars = MilpVariables(start, split, makespan, {}, {}, set())
        # Two ops may overlap only when the graph leaves them unordered and their time windows
        # [head, UB - tail] (every schedule at least as good as the warm start keeps them)
        # intersect; any other pair is ordered in every such schedule and needs no variable.
        # Touching windows count as intersecting (conservative).
        self.latest_end = [horizon - tail[k] for k in range(m)]
        self.eps = 1e-9 * horizon

    def duration_terms(self, k: int) -> tuple[list[int], list[float], float]:
        """p_k as (vars, coefs, constant)."""
        split = self.vars.split[k]
        durations = self.durations[k]
        if split is None:
            return [], [], durations[0]
        return [split], [durations[1] - durations[0]], durations[0]

    def may_overlap(self, a: int, b: int) -> bool:
        head, latest_end = self.head, self.latest_end
        return not self.prep.comparable(a, b) and max(head[a], head[b]) < min(latest_end[a], latest_end[b]) + self.eps

    def order_var(self, a: int, b: int) -> int:
        """x_ab, created with its big-M row on first use."""
        order, model, start = self.vars.order, self.model, self.vars.start
        if (a, b) not in order:
            order[(a, b)] = model.var(f"x{a}_{b}", 0, 1, True)
            vi, vc, c0 = self.duration_terms(a)
            big_m = max(0.0, self.horizon - self.tail[a] - self.head[b])
            # t_b - t_a - p_a + M (1 - x_ab) >= 0  <=>  t_b - t_a - p_a - M x_ab >= -M
            model.row(
                [start[b], start[a], order[(a, b)]] + vi, [1.0, -1.0, -big_m] + [-c for c in vc], c0 - big_m, math.inf
            )
        return order[(a, b)]

    def precedence_rows(self) -> None:
        """t_k ≥ t_p + p_p on the reduction's edges, T ≥ t_k + p_k for its sinks."""
        prep, model, start, makespan = self.prep, self.model, self.vars.start, self.vars.makespan
        m = len(prep.real)
        has_succ = [False] * m
        for k in range(m):
            for p in prep.preds[k]:
                has_succ[p] = True
                vi, vc, c0 = self.duration_terms(p)
                # t_k - t_p - p_p >= 0
                model.row([start[k], start[p]] + vi, [1.0, -1.0] + [-c for c in vc], c0, math.inf)
        for k in range(m):
            if not has_succ[k]:
                vi, vc, c0 = self.duration_terms(k)
                model.row([makespan, start[k]] + vi, [1.0, -1.0] + [-c for c in vc], c0, math.inf)

    def energetic_rows(self) -> None:
        """Energetic cuts (valid for every schedule; they lift the LP bound, which big-M rows
        leave at the critical path): T ≥ r + q + the core-seconds of the ops in the window / C."""
        prep, split, durations = self.prep, self.vars.split, self.durations
        for _, _kind, rq, ops in energy_sets(prep, limit=ENERGY_CUTS):
            c = prep.cap[ops[0]]
            idx, coef, const = [self.vars.makespan], [1.0], rq * self.scale
            for k in ops:
                y = split[k]
                if y is None:
                    const += durations[k][0] * prep.modes[k][0][1] / c
                else:
                    const += durations[k][0] / c  # one core: one_k core-seconds
                    idx.append(y)
                    coef.append(-(durations[k][1] * c - durations[k][0]) / c)  # split: C * split_k
            self.model.row(idx, coef, const, math.inf)

    def one_core_rows(self, pairs: list[tuple[int, int]]) -> None:
        """A kind with one core: every pair that may overlap is ordered one way."""
        for a, b in pairs:
            self.model.row([self.order_var(a, b), self.order_var(b, a)], [1.0, 1.0], 1.0, 1.0)

    def antichain_rows(self, antichains: list[list[int]], pairs: list[tuple[int, int]]) -> None:
        """Any cap+1 ops that may all overlap hold cap+1 cores at a common instant if no two of
        them are ordered (intervals that pairwise overlap share a point); a split op overlaps
        nothing of its kind."""
        model, order, split = self.model, self.vars.order, self.vars.split
        for antichain in antichains:
            idx = []
            for ia, a in enumerate(antichain):
                for b in antichain[ia + 1 :]:
                    idx += [self.order_var(a, b), self.order_var(b, a)]
            model.row(idx, [1.0] * len(idx), 1.0, math.inf)
        for a, b in pairs:
            if split[a] is None and split[b] is None:
                if (a, b) in order:
                    model.row([order[(a, b)], order[(b, a)]], [1.0, 1.0], -math.inf, 1.0)
                continue
            xa, xb = self.order_var(a, b), self.order_var(b, a)
            model.row([xa, xb], [1.0, 1.0], -math.inf, 1.0)
            for y in (split[a], split[b]):
                if y is not None:  # a split op overlaps nothing of its kind
                    model.row([xa, xb, y], [1.0, 1.0, -1.0], 0.0, math.inf)

    def flow_rows(self, kind: str, members: list[int], cap: int, pairs: list[tuple[int, int]]) -> None:
        """The kind's cores as a resource flow from a source holding ``cap``."""
        prep, model, split, flow, order = self.prep, self.model, self.vars.split, self.vars.flow, self.vars.order
        self.vars.flow_kinds.add(kind)
        most_held = {k: (cap if split[k] is not None else 1) for k in members}
        inflow: dict[int, list[int]] = {k: [] for k in members}
        outflow: dict[int, list[int]] = {k: [] for k in members}
        from_source: list[int] = []
        for k in members:
            v = model.var(f"f_s_{k}", 0, most_held[k])
            flow[(-1, k)] = v
            inflow[k].append(v)
            from_source.append(v)
        for a in members:
            for b in members:
                if a == b:
                    continue
                flow_bound = float(min(most_held[a], most_held[b]))
                if self.may_overlap(a, b):
                    v = model.var(f"f{a}_{b}", 0, flow_bound)
                    model.row([v, self.order_var(a, b)], [1.0, -flow_bound], -math.inf, 0.0)
                elif (prep.reach[b] >> a) & 1 or (
                    not prep.comparable(a, b) and self.latest_end[a] <= self.latest_end[b]
                ):
                    v = model.var(f"f{a}_{b}", 0, flow_bound)  # a ends before b starts in every schedule
                else:
                    continue
                flow[(a, b)] = v
                outflow[a].append(v)
                inflow[b].append(v)
        for a, b in pairs:
            model.row([order[(a, b)], order[(b, a)]], [1.0, 1.0], -math.inf, 1.0)
        model.row(from_source, [1.0] * len(from_source), -math.inf, float(cap))
        for k in members:
            # demand d_k = 1 + (cap - 1) y_k: received exactly, passed on at most
            y = split[k]
            demand_vars, demand_coefs = ([y], [-(cap - 1.0)]) if y is not None else ([], [])
            model.row(inflow[k] + demand_vars, [1.0] * len(inflow[k]) + demand_coefs, 1.0, 1.0)
            if outflow[k]:
                model.row(outflow[k] + demand_vars, [1.0] * len(outflow[k]) + demand_coefs, -math.inf, 1.0)


def build_milp(
    prep: Prepared,
    list_makespan: float,
    lower_bound: float,
    capacity_model: str = "auto",
    max_binaries: int | None = None,
) -> tuple[Milp, MilpVariables]:
    """The MILP of ``prep`` (see the module docstring), scaled so that ``list_makespan`` (the
    warm start's, seconds) is :data:`SCALE`; ``lower_bound`` (seconds) bounds ``T`` below.
    Raises :class:`MilpTooLarge` before building anything costly when it would need more than
    ``max_binaries`` binaries."""
    builder = _Builder(prep, list_makespan, lower_bound)
    builder.precedence_rows()
    builder.energetic_rows()
    by_kind: dict[str, list[int]] = {}
    for k in range(len(prep.real)):
        by_kind.setdefault(prep.kind[k], []).append(k)
    pairs_of = {
        kind: [(a, b) for ia, a in enumerate(members) for b in members[ia + 1 :] if builder.may_overlap(a, b)]
        for kind, members in by_kind.items()
    }
    # The size rule, before anything costly is built: a mode per splittable op and two order
    # variables per pair of ops of a kind that may overlap (what a disjunctive model needs).
    candidates = sum(v is not None for v in builder.vars.split) + 2 * sum(len(v) for v in pairs_of.values())
    if max_binaries is not None and candidates > max_binaries:
        raise MilpTooLarge(candidates)
    for kind, members in by_kind.items():
        cap = prep.cap[members[0]]
        pairs = pairs_of[kind]
        if not pairs:
            continue
        if cap == 1:
            builder.one_core_rows(pairs)
            continue
        antichains = None
        if capacity_model != "flow":
            neighbours: dict[int, set[int]] = {k: set() for k in members}
            for a, b in pairs:
                neighbours[a].add(b)
                neighbours[b].add(a)
            antichains = (
                cliques(members, neighbours, cap + 1, MAX_ANTICHAINS)
                if capacity_model == "auto"
                else cliques(members, neighbours, cap + 1, 10**9, steps=10**18)
            )
        if antichains is not None:
            builder.antichain_rows(antichains, pairs)
        else:
            builder.flow_rows(kind, members, cap, pairs)
    return builder.model, builder.vars


def cliques(
    members: Sequence[int],
    neighbours: Mapping[int, set[int]],
    size: int,
    limit: int,
    steps: int = MAX_ANTICHAIN_STEPS,
) -> list[list[int]] | None:
    """Every set of ``size`` ops among ``members`` that are pairwise neighbours in
    ``neighbours`` (None when there are more than ``limit``, or when the enumeration takes more
    than ``steps`` steps: a count, not the clock, so the answer does not depend on the
    machine)."""
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
            ok = rec(chosen, [b for b in cand[i + 1 :] if b in neighbours[a]])
            chosen.pop()
            if not ok:
                return False
        return True

    return out if rec([], sorted(members)) else None


def warm_values(
    prep: Prepared,
    variables: MilpVariables,
    real_start: Sequence[float],
    real_mode: Sequence[int],
    list_makespan: float,
) -> dict[int, float]:
    """The list schedule as values of every model variable (flows allocated greedily)."""
    scale = SCALE / list_makespan
    m = len(prep.real)
    duration = [prep.modes[k][real_mode[k]][0] for k in range(m)]
    s = [real_start[k] * scale for k in range(m)]
    e = [(real_start[k] + duration[k]) * scale for k in range(m)]
    vals: dict[int, float] = {}
    for k in range(m):
        vals[variables.start[k]] = s[k]
        y = variables.split[k]
        if y is not None:
            vals[y] = float(real_mode[k])
    vals[variables.makespan] = max(e, default=0.0)
    tol = 1e-9 * SCALE
    for (a, b), v in variables.order.items():
        vals[v] = 1.0 if e[a] <= s[b] + tol and not (e[b] <= s[a] + tol and b < a) else 0.0
    for v in variables.flow.values():
        vals[v] = 0.0
    for kind in variables.flow_kinds:
        members = [k for k in range(m) if prep.kind[k] == kind]
        cap = prep.cap[members[0]]
        held = {k: (prep.modes[k][real_mode[k]][1]) for k in members}
        avail: dict[int, float] = {-1: float(cap)}
        for k in sorted(members, key=lambda k: (s[k], e[k])):
            need = float(held[k])
            donors = [-1] + sorted(
                (a for a in avail if a >= 0 and e[a] <= s[k] + tol and (a, k) in variables.flow), key=lambda a: e[a]
            )
            for a in donors:
                if need <= 0:
                    break
                give = min(need, avail[a])
                if give <= 0:
                    continue
                vals[variables.flow[(a, k)]] += give
                avail[a] -= give
                need -= give
            avail[k] = float(held[k])
    return vals


def decode_solution(
    prep: Prepared, variables: MilpVariables, values: Sequence[float]
) -> tuple[list[float], list[int]] | None:
    """Start times from the solution's discrete choices: earliest starts under the graph and
    the chosen order ``x`` (None if that order has a cycle, which a valid solution never has)."""
    m = len(prep.real)
    mode = [0 if (y := variables.split[k]) is None else int(round(values[y])) for k in range(m)]
    preds = [list(p) for p in prep.preds]
    for (a, b), v in variables.order.items():
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
        end_a = start[a] + prep.modes[a][mode[a]][0]
        for b in succs[a]:
            start[b] = max(start[b], end_a)
            indeg[b] -= 1
            if indeg[b] == 0:
                ready.append(b)
    if seen != m:
        return None
    return start, mode


def floored(prep: Prepared, delta: float) -> tuple[Prepared, int]:
    """The problem with every duration raised to at least ``delta`` (and how many were raised).

    SCIP's tolerances (1e-6 absolute on rows, on integrality too, so a big-M row may be slack by
    ``M·1e-6``) cannot separate ops shorter than that: with them as they are, a solution may
    order a few near-zero ops in a cycle.  The MILP is therefore built on durations of at least
    ``delta = FLOOR·UB``; a schedule for longer durations stays valid when they shrink back (the
    returned schedule uses the true durations), and the proven lower bound is lowered by the
    total increase, so the reported gap stays honest."""
    raised = 0
    modes = []
    for op_modes in prep.modes:
        new = []
        for duration, held in op_modes:
            if duration < delta:
                raised += 1
                duration = delta
            new.append((duration, held))
        modes.append(new)
    if not raised:
        return prep, 0
    raised_prep = Prepared(
        prep.problem, prep.order, prep.real, prep.pos, prep.kind, prep.cap, modes, prep.preds, prep.reach, []
    )
    return with_times(raised_prep), raised
