"""Brute-force oracle for the placement DP (test-only).

Enumerates every DP degree d, stage count p, contiguous split and recompute policy per stage,
and prices each plan with the formulas of ``rust/phaze-dp`` (crate docs), written here
independently and literally: ``(m + p − 1) · max T + max E + max O``, O a stage's optimizer
step (plain data parallelism: all of its layers' ``opt_s``). Exponential: for instances of a
handful of layers only.

Problems are the dicts that ``passes.algorithms._phaze_rs.solve_placement`` takes.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field

import numpy as np

POLICIES = ("none", "selective", "full")


def policies(problem: dict) -> tuple[int, ...]:
    """The policy indices a stage may take: all three under ``recompute`` "auto" (or none
    given), else the fixed one."""
    setting = problem.get("recompute") or "auto"
    return tuple(range(3)) if setting == "auto" else (POLICIES.index(setting),)


ORDERS = ("tp-dp-pp", "tp-pp-dp")


def orders(problem: dict) -> tuple[str, ...]:
    """The rank orders a plan may use: both under ``rank_order`` "auto" (or none given), else
    the fixed one."""
    setting = problem.get("rank_order") or "auto"
    return ORDERS if setting == "auto" else (setting,)


def level_for(levels: list[dict], g: int) -> int:
    """Innermost level whose group_size >= g, else the last one."""
    for i, lv in enumerate(levels):
        if lv["group_size"] >= g:
            return i
    return len(levels) - 1


def ring_allreduce(levels: list[dict], nbytes: float, g: int, lv: int, stride: int = 1) -> float:
    """Ring over g devices whose consecutive members lie `stride` apart, on level lv.  Rail-aware:
    k = max(1, min(g, inner // stride)) members in each group of the level below drive k of its
    links at once, so bw = min(k · bw_lv, bw_{lv−1}) when lv > 0 and k > 1."""
    if g <= 1:
        return 0.0
    bw, lat = levels[lv]["bandwidth_Bps"], levels[lv]["latency_s"]
    if lv > 0:
        k = max(1, min(g, levels[lv - 1]["group_size"] // stride))
        if k > 1:
            bw = min(k * bw, levels[lv - 1]["bandwidth_Bps"])
    return 2.0 * (g - 1) / g * nbytes / bw + 2.0 * (g - 1) * lat


def p2p(levels: list[dict], nbytes: float, lv: int) -> float:
    return levels[lv]["latency_s"] + nbytes / levels[lv]["bandwidth_Bps"]


@dataclass
class Priced:
    """One explicit plan and its cost."""

    d: int
    p: int
    ends: tuple[int, ...]
    policies: tuple[int, ...]
    time: float
    stage_times: list[float] = field(default_factory=list)
    stage_memory: list[int] = field(default_factory=list)
    stage_exposed: list[float] = field(default_factory=list)
    stage_optimizer: list[float] = field(default_factory=list)

    @property
    def max_memory(self) -> int:
        return max(self.stage_memory)


class Stages:
    """Per-(d, p) stage costs of a problem, memoized by (first, last, policy[, in flight])."""

    def __init__(self, problem: dict, d: int, p: int, order: str = "tp-pp-dp"):
        self.pr = problem
        self.layers = problem["layers"]
        self.L = len(self.layers)
        self.d, self.p = d, p
        self.m = problem["global_batch"] // (problem["micro_batch"] * d)
        levels = problem["levels"]
        t = problem["tp"]
        # tp-pp-dp: a replica's p·t devices are contiguous, a DP group's members p·t apart;
        # tp-dp-pp: a DP group's members t apart, pipeline neighbours d·t apart.
        self.stride = p * t if order == "tp-pp-dp" else t
        self.pp_lv = level_for(levels, p * t if order == "tp-pp-dp" else d * p * t)
        self.dp_lv = level_for(levels, d * self.stride)
        self._time: dict = {}
        self._mem: dict = {}
        self._exp: dict = {}
        self._opt: dict = {}

    def time(self, i: int, j: int, r: int) -> float:
        key = (i, j, r)
        if key not in self._time:
            ls = self.layers[i : j + 1]
            compute = sum(x["fwd_s"] + x["bwd_s"] + x["recompute_s"][r] for x in ls)
            levels = self.pr["levels"]
            if i > 0:
                compute += 2 * p2p(levels, self.layers[i - 1]["boundary_bytes"], self.pp_lv)
            if j < self.L - 1:
                compute += 2 * p2p(levels, self.layers[j]["boundary_bytes"], self.pp_lv)
            self._time[key] = compute
        return self._time[key]

    def memory(self, i: int, j: int, r: int, k: int) -> int:
        f = min(self.p - k, self.m)
        key = (i, j, r, f)
        if key not in self._mem:
            ls = self.layers[i : j + 1]
            fixed = sum(x["param_bytes"] + x["grad_bytes"] + x["optimizer_bytes"] for x in ls)
            # under full recompute the re-run forward's activations are live during the backward
            ws = max(
                max(x["workspace_bytes"], x.get("recompute_workspace_bytes", 0)) if r == 2 else x["workspace_bytes"]
                for x in ls
            )
            self._mem[key] = fixed + f * sum(x["saved_bytes"][r] for x in ls) + ws
        return self._mem[key]

    def exposed(self, i: int, j: int) -> float:
        key = (i, j)
        if key not in self._exp:
            ls = self.layers[i : j + 1]
            grad = float(round(sum(x["grad_bytes"] for x in ls) * self.pr.get("grad_reduce_scale", 1.0)))
            ar = ring_allreduce(self.pr["levels"], grad, self.d, self.dp_lv, self.stride)
            bwd = sum(x["bwd_s"] for x in ls)
            # overlapped, the all-reduce still takes its level's share of the compute beside it
            share = self.pr["levels"][self.dp_lv].get("collective_compute_share") or 0.0
            self._exp[key] = max(ar - bwd, share * min(ar, bwd)) if self.pr["dp_overlap"] else ar
        return self._exp[key]

    def optimizer(self, i: int, j: int) -> float:
        """The stage's optimizer step after the flush: its layers' ``opt_s`` (0 when not given),
        all of it on each device under plain data parallelism."""
        key = (i, j)
        if key not in self._opt:
            self._opt[key] = sum(x.get("opt_s", 0.0) for x in self.layers[i : j + 1])
        return self._opt[key]


def splits(L: int, p: int):
    """Every contiguous split of L layers into p stages, as tuples of stage last layers."""
    for cuts in itertools.combinations(range(L - 1), p - 1):
        yield tuple(cuts) + (L - 1,)


def plans(problem: dict, d: int, p: int, hbm: int | None = None):
    """Every plan of (d, p): every split, every policy per stage. Yields (Priced, fits)."""
    hbm = problem["hbm_bytes"] if hbm is None else hbm
    st = Stages(problem, d, p)
    for ends in splits(st.L, p):
        firsts = (0,) + tuple(e + 1 for e in ends[:-1])
        for pols in itertools.product(policies(problem), repeat=p):
            times = [st.time(i, j, r) for i, j, r in zip(firsts, ends, pols)]
            mems = [st.memory(i, j, r, k) for k, (i, j, r) in enumerate(zip(firsts, ends, pols))]
            exps = [st.exposed(i, j) for i, j in zip(firsts, ends)]
            opts = [st.optimizer(i, j) for i, j in zip(firsts, ends)]
            time = (st.m + p - 1) * max(times) + max(exps) + max(opts)
            yield Priced(d, p, ends, pols, time, times, mems, exps, opts), max(mems) <= hbm


def allowed(problem: dict):
    """Every (d, p) that satisfies the batch, device and stage constraints."""
    B, b, t, N = problem["global_batch"], problem["micro_batch"], problem["tp"], problem["devices"]
    L = len(problem["layers"])
    pmax = min(L, problem.get("max_stages") or L)
    for d in range(1, B // b + 1):
        if B % (b * d):
            continue
        for p in range(1, pmax + 1):
            if d * p * t <= N:
                yield d, p


@dataclass
class Optimum:
    """What the oracle says about a problem."""

    feasible: bool
    reason: str | None = None  # "batch", "devices", "memory" when infeasible
    time: float | None = None
    best: Priced | None = None
    needed_bytes: int | None = None  # least max-stage memory over every option (memory case)


def best_of(problem: dict, d: int, p: int, hbm: int | None = None) -> tuple[Priced | None, int]:
    """Fastest fitting plan of (d, p) and the least max-stage memory of any plan of it.

    Same enumeration as `plans` (every split, every allowed policy per stage), with the policy
    combinations of a split evaluated at once as a numpy array (max is exact, and the final
    multiply-add is the same IEEE operation as the scalar one).
    """
    hbm = problem["hbm_bytes"] if hbm is None else hbm
    best, best_time, least = None, math.inf, None
    for order in orders(problem):
        b, lm = _best_of_order(Stages(problem, d, p, order), policies(problem), hbm)
        least = lm if least is None else min(least, lm)
        if b is not None and b.time < best_time:
            best, best_time = b, b.time
    return best, least


def _best_of_order(st: Stages, allowed_pols: tuple[int, ...], hbm: int) -> tuple[Priced | None, int]:
    """`best_of` under one rank order."""
    d, p = st.d, st.p
    best, best_time, least = None, math.inf, None
    for ends in splits(st.L, p):
        firsts = (0,) + tuple(e + 1 for e in ends[:-1])
        rows = list(zip(firsts, ends))
        t_rows = [np.array([st.time(i, j, r) for r in allowed_pols]) for i, j in rows]
        m_rows = [
            np.array([st.memory(i, j, r, k) for r in allowed_pols], dtype=object) for k, (i, j) in enumerate(rows)
        ]
        max_t = functools.reduce(np.maximum.outer, t_rows)
        max_m = functools.reduce(np.maximum.outer, m_rows)
        max_e = max(st.exposed(i, j) for i, j in rows)
        max_o = max(st.optimizer(i, j) for i, j in rows)
        time = (st.m + p - 1) * max_t + max_e + max_o
        lm = min(np.ravel(max_m))
        least = lm if least is None else min(least, lm)
        masked = np.where(max_m <= hbm, time, np.inf).astype(float)
        flat = int(np.argmin(masked))
        if masked.flat[flat] < best_time:
            best_time = float(masked.flat[flat])
            pols = tuple(allowed_pols[int(x)] for x in np.unravel_index(flat, (len(allowed_pols),) * p))
            best = Priced(d, p, ends, pols, best_time)
    return best, least


def brute_force(problem: dict) -> Optimum:
    """The optimum of a problem, or why nothing fits."""
    B, b = problem["global_batch"], problem["micro_batch"]
    if B % b:
        return Optimum(False, "batch")
    if problem["tp"] > problem["devices"]:
        return Optimum(False, "devices")
    best, least = None, None
    for d, p in allowed(problem):
        pl, lm = best_of(problem, d, p)
        least = lm if least is None else min(least, lm)
        if pl is not None and (best is None or pl.time < best.time):
            best = pl
    if best is None:
        return Optimum(False, "memory", needed_bytes=least)
    return Optimum(True, time=best.time, best=best)


@dataclass
class Fixed:
    """What the oracle says about a fixed (pp, dp)."""

    violations: set[str]
    time: float | None = None  # of the fastest plan within HBM, or within needed_bytes
    needed_bytes: int | None = None


def brute_force_fixed(problem: dict, pp: int, dp: int) -> Fixed:
    B, b, t, N = problem["global_batch"], problem["micro_batch"], problem["tp"], problem["devices"]
    L = len(problem["layers"])
    v = set()
    if pp > L or (problem.get("max_stages") is not None and pp > problem["max_stages"]):
        v.add("stages")
    if dp * pp * t > N:
        v.add("devices")
    if B % (b * dp):
        v.add("batch")
    if pp > L or B % (b * dp):
        return Fixed(v)
    best, least = best_of(problem, dp, pp)
    if best is not None:
        return Fixed(v, time=best.time)
    v.add("memory")
    best, _ = best_of(problem, dp, pp, hbm=least)
    return Fixed(v, time=best.time, needed_bytes=least)


def price_plan(problem: dict, plan: dict) -> Priced:
    """Prices a plan dict returned by the binding, from scratch."""
    stages = plan["stages"]
    d, p = plan["dp"], plan["pp"]
    st = Stages(problem, d, p, plan["rank_order"])
    firsts = tuple(s["first_layer"] for s in stages)
    ends = tuple(s["last_layer"] for s in stages)
    pols = tuple(POLICIES.index(s["recompute"]) for s in stages)
    times = [st.time(i, j, r) for i, j, r in zip(firsts, ends, pols)]
    mems = [st.memory(i, j, r, k) for k, (i, j, r) in enumerate(zip(firsts, ends, pols))]
    exps = [st.exposed(i, j) for i, j in zip(firsts, ends)]
    opts = [st.optimizer(i, j) for i, j in zip(firsts, ends)]
    time = (st.m + p - 1) * max(times) + max(exps) + max(opts)
    return Priced(d, p, ends, pols, time, times, mems, exps, opts)
