"""The scheduling problem of one layer on one chip, its schedules, and their check.

Op ``i`` runs on a *unit kind* (``tensor``, ``vector``, ``network``; ``none`` for views, which
take no time) that has ``cores[kind]`` identical cores.  It either runs on one core for ``one``
seconds or is *split* over all cores of its kind for ``split`` seconds (intra-op parallelism).
Precedence comes from the dataflow edges.  Resources are cumulative: at any instant a kind runs
at most ``cores[kind]`` single-core ops, and a split op runs alone on its kind.  A kind with one
core (the network link) runs its ops one at a time, each in ``min(one, split)``.  Minimize the
makespan.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace

UNITS = ("tensor", "vector", "network", "none")


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
        graph = edges if isinstance(edges, tuple) else tuple((int(i), int(j)) for i, j in edges)
        try:
            es = _checked_edges(n, graph)
        except TypeError:  # a tuple of unhashable pairs (lists): checked without the memo
            es = _checked_edges.__wrapped__(n, graph)
        for k, c in cores.items():
            if k not in UNITS or k == "none" or not isinstance(c, int) or c < 1:
                raise ValueError(f"cores[{k!r}] = {c!r}: expected a unit kind and a count >= 1")
        problem = cls(ops_t, es, tuple(sorted(cores.items())))
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
        """A hash of everything that determines the optimum (floats exactly, via ``hex``).
        Computed once per problem and kept on it (the search looks a problem up, queues it and
        stores it, each by key; the problem is frozen, so the key cannot go stale)."""
        key = self.__dict__.get("_key")
        if key is None:
            h = hashlib.sha256()
            h.update(repr(self.cores).encode())
            h.update(";".join(f"{o.unit},{float(o.one).hex()},{float(o.split).hex()}" for o in self.ops).encode())
            h.update(repr(self.edges).encode())
            key = h.hexdigest()
            object.__setattr__(self, "_key", key)
        return key

    def topological_order(self) -> list[int]:
        return _topological_order(len(self.ops), self.edges)


def _topological_order(n: int, edges: Iterable[tuple[int, int]]) -> list[int]:
    """The ops ``0 .. n-1`` in a topological order of ``edges`` (the smallest ready op first);
    :class:`ValueError` on a cycle."""
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = [0] * n
    for i, j in edges:
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


@functools.lru_cache(maxsize=4096)
def _checked_edges(n: int, edges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """``edges`` between ``n`` ops, sorted and without repeats, checked (ends in range and
    distinct, no cycle; else :class:`ValueError`): :meth:`Problem.make`'s graph, done once
    per graph, since the architecture search makes a layer's problem on many chips."""
    es = tuple(sorted({(int(i), int(j)) for i, j in edges}))
    for i, j in es:
        if not (0 <= i < n and 0 <= j < n) or i == j:
            raise ValueError(f"edge ({i}, {j}) is not between two distinct ops of {n}")
    _topological_order(n, es)  # raises on a cycle
    return es


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
      optimal by the bounds), ``"trivial"`` (no op takes time) or ``"serial"`` (a chip that runs one
      op at a time: :mod:`.serial`; its bounds are its makespan).
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
