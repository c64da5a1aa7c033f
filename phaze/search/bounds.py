"""Bounds on what a setting can score on candidate chips, for the branch and bound of
:mod:`phaze.search.engine` (its module docstring gives the stages).

Every bound here starts from :func:`~phaze.search.schedule_bounds.group_lower_bound`, a
lower bound on each group's makespan for all the chips of a space at once (numpy):

- the *work bound* (:meth:`Bounds.work_bound`): the batch's work spread evenly over the
  pipeline, no communication, in closed form;
- the *DP bound* (:meth:`Bounds.dp_bounds`): the Rust DP on the lower-bound times, through the
  same problem assembly as the exact price (:meth:`~phaze.search.pricing.Pricing.problem`);
- the *refined bound* (:meth:`Bounds.refined_lower_bounds`): each group's own combinatorial
  bound, or its makespan once known (priced or cached), as the DP's times.

Whether a setting fits anywhere (:meth:`Bounds.fits_somewhere`, :meth:`Bounds.why_not`) is read
from the DP on lower-bound times too: memory, batch and devices do not depend on the chip's
speed.

It is apart from the exact pricing (:mod:`phaze.search.pricing`) so that what may only
*bound* a value (memoized by bound times) is never confused with the value: it uses the
pricing (its DP assembly, its objective, the makespans it has priced), and adds to its timers
and counts, but keeps its own memos.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from passes.algorithms import _phaze_rs
from passes.algorithms import placement as pl
from passes.algorithms import schedule as sched
from passes.algorithms.latency import estimate_chip, estimate_space
from phaze.search.pricing import Pricing, chip_cores
from phaze.search.schedule_bounds import group_lower_bound
from phaze.search.setting import Setting

if TYPE_CHECKING:  # the engine imports this module; these only annotate
    from phaze.search.engine import Candidates, ModelTask

#: From this many chips on, the settings' vectorized lower bounds are computed on the workers
#: (:meth:`Bounds.prepare_lower_bounds`); below, shipping a setting costs more than its bounds.
PARALLEL_BOUNDS_CONFIGS = 1000


class Bounds:
    """Upper bounds on a setting's objective, from lower bounds on its groups' makespans: one
    per stage of the search (work, DP, refined), each memoized (by candidates and setting, or
    by the bound times the DP saw), and whether a setting fits anywhere."""

    def __init__(self, pricing: Pricing):
        self.pricing = pricing
        #: (candidates, setting) -> ``[groups, configs]`` vectorized bounds (:meth:`lower_bounds`)
        self._lb: dict[tuple[int, int], np.ndarray] = {}
        #: DP-bound key (candidates, task, placement, setting, bound times, HBM) -> its throughput
        self._dp_memo: dict[tuple, float] = {}
        #: canonical problem key -> its combinatorial lower bound (:meth:`refined_lower_bounds`)
        self._problem_lb: dict[str, float] = {}
        #: (candidates, setting, chip signature) -> ``(cache size, scheduled, bound)``
        #: (:meth:`_problem_bounds`): chips of one signature
        #: (:meth:`~phaze.search.pricing.Pricing.signatures`) have the same problems, so the
        #: same schedules and bounds while the cache holds the same schedules
        self._refined_memo: dict[tuple[int, int, bytes], tuple[int, np.ndarray, np.ndarray]] = {}

    def lower_bounds(self, cands: Candidates, setting: Setting) -> np.ndarray:
        """``[groups, configs]`` lower bounds on every group's makespan."""
        key = (id(cands), id(setting))
        if key not in self._lb:
            t0 = time.perf_counter()
            self._lb[key] = _lower_bounds((setting, cands.configs, cands.template))
            self.pricing.timers["estimate"] += time.perf_counter() - t0
        return self._lb[key]

    def prepare_lower_bounds(self, cands: Candidates, settings: Sequence[Setting]) -> None:
        """:meth:`lower_bounds` of each of ``settings`` not known yet, computed on the backend's
        workers at once (the same function, so the same floats): a search needs them for every
        setting before anything else, tenths of a second each on a space's tens of thousands of
        chips, while the workers have nothing else to do.  In-process without a backend, for a
        few chips, or for one setting (shipping them would cost more)."""
        todo = list({id(s): s for s in settings if (id(cands), id(s)) not in self._lb}.values())
        backend = self.pricing.backend
        if backend is None or len(todo) < 2 or len(cands.configs) < PARALLEL_BOUNDS_CONFIGS:
            return
        t0 = time.perf_counter()
        for s, lb in zip(todo, backend.map(_lower_bounds, [(s, cands.configs, cands.template) for s in todo])):
            self._lb[(id(cands), id(s))] = lb
        self.pricing.timers["estimate"] += time.perf_counter() - t0

    def total_lb(self, cands: Candidates, setting: Setting) -> np.ndarray:
        """``[configs]`` lower bounds on one micro-batch's forward and backward time summed over
        the layers (seconds)."""
        return _layers_total(setting, self.lower_bounds(cands, setting))

    def refined_lower_bounds(self, cands: Candidates, setting: Setting, configs: Sequence[int]) -> np.ndarray:
        """``[groups, len(configs)]``: :meth:`lower_bounds` on ``configs``, tightened group by
        group: the makespan itself where the group's schedule is known (memoized or cached),
        else the larger of the vectorized bound and the problem's own combinatorial bound
        (:func:`~passes.algorithms.schedule.makespan_lower_bound`: on each op's window raised
        by the work of its ancestors and descendants, the energetic bound at every head and
        tail threshold, not only the smallest, and with the ops too long for one core in their
        window charged split).  2-6 ms per problem against SCIP's tenths of a second, so the
        search runs it on an architecture before scheduling it
        (:meth:`~phaze.search.engine._BranchAndBound.refine`).  A calibrated chip keeps the vectorized bounds."""
        lb = self.lower_bounds(cands, setting)[:, list(configs)].copy()
        if getattr(cands.template, "calibration", None) is not None:
            return lb
        t0 = time.perf_counter()
        limits = self.pricing.cache_limits()
        lat = estimate_space(setting.table, cands.configs[list(configs)], cands.template, cache=None)
        signatures = self.pricing.signatures(cands, setting, lat.one, lat.split, configs)
        # what the cache holds decides a column (a schedule known is its makespan): a column is
        # reused while the cache has not grown since it was computed
        for col, c in enumerate(configs):
            known = self.pricing.known_makespans(cands, setting, c, signatures[col])
            if known is not None:
                lb[:, col] = known
                continue
            memo_key = (id(cands), id(setting), signatures[col])
            memo = self._refined_memo.get(memo_key)
            if memo is None or memo[0] != len(self.pricing.cache):
                scheduled, bound = self._problem_bounds(cands, setting, lat, col, c, limits)
                memo = self._refined_memo[memo_key] = (len(self.pricing.cache), scheduled, bound)
            _, scheduled, bound = memo
            lb[:, col] = np.where(scheduled, bound, np.maximum(lb[:, col], bound))
        self.pricing.timers["estimate"] += time.perf_counter() - t0
        return lb

    def _problem_bounds(self, cands: Candidates, setting: Setting, lat, col: int, c: int, limits) -> tuple:
        """``(scheduled, bound)``, ``[groups]`` each, of chip ``c`` (column ``col`` of the
        latencies ``lat``): per priced group, whether the cache holds its schedule, and then its
        makespan, else its problem's combinatorial bound (0 for the groups not priced)."""
        # the expert GEMMs' changes at each EP degree (after the groups) are exact: "scheduled"
        experts = setting.expert_seconds(lat.split[:, col])
        scheduled = np.concatenate([np.zeros(len(setting.groups), dtype=bool), np.ones(len(experts), dtype=bool)])
        bound = np.concatenate([np.zeros(len(setting.groups)), experts])
        cores = chip_cores(cands, c)
        for g in setting.priced_groups():
            canon = setting.group_problem(g, lat.one[:, col], lat.split[:, col], cores, cands.template.network)
            canon = canon.canonical()
            schedule = self.pricing.cache.lookup(canon, limits)
            if schedule is not None:
                scheduled[g], bound[g] = True, schedule.makespan
                continue
            key = canon.key()
            value = self._problem_lb.get(key)
            if value is None:
                value = self._problem_lb[key] = sched.makespan_lower_bound(canon)
            bound[g] = value
        return scheduled, bound

    def work_bound(self, cands: Candidates, setting: Setting, fixed: tuple[int, int, int] | None = None) -> np.ndarray:
        """Stage 1: ``[configs]`` upper bounds on the setting's objective (throughput:
        samples/s, :meth:`least_time`; the others: :meth:`Objective.bound`, at the smallest HBM
        option); ``fixed``: the task's fixed placement (None: searched)."""
        total = self.total_lb(cands, setting)
        obj = self.pricing.objective(cands)
        if not obj.throughput:
            t0 = time.perf_counter()
            with np.errstate(divide="ignore"):
                out = np.where(total > 0, obj.bound(setting, total, np.arange(len(total)), min(cands.hbm)), np.inf)
            self.pricing.timers["estimate"] += time.perf_counter() - t0
            return out
        least = self.least_time(cands, setting, fixed)
        with np.errstate(divide="ignore"):
            return np.where(least > 0, self.pricing.params.global_batch / least, np.inf)

    def least_time(self, cands: Candidates, setting: Setting, fixed: tuple[int, int, int] | None) -> np.ndarray:
        """``[configs]`` lower bounds on the time per batch (s): the least, over the pipeline
        depths p the DP may choose (``fixed``: its own) with the most data parallelism d that
        divides the batch, of ``(m + (p − 1)/v) · max(Σ T / p, max T)``, where m = B / (b·d)
        micro-batches, v the chunks per device (1 for 1F1B; the bubble counts nothing under
        ``auto``), Σ T the layers' lower-bound forward and backward times and max T the
        heaviest layer's: the DP's time is ``(m + (p − 1)/v) · max_k T_k`` plus communication,
        and a stage holds at least 1/p of the work and at least one whole layer.  ``inf`` when no
        (p, d) divides the batch (the setting fits nowhere, see :meth:`fits_somewhere`)."""
        total = self.total_lb(cands, setting)
        lb = self.lower_bounds(cands, setting)
        heaviest = np.zeros_like(total)
        for lr in setting.layers:
            heaviest = np.maximum(heaviest, _layer_lb(setting, lr, lb))
        # a replica of a context-parallel setting spans t·c devices (the DP's p·d·t·c <= N)
        B, N, b, t = self.pricing.params.global_batch, self.pricing.params.devices, setting.micro_batch, setting.tp
        t *= setting.cp
        v = self.pricing.params.pipeline_schedule.virtual_stages
        bubble = 0.0 if v is None else 1.0 / v
        if fixed is not None:
            options = [(fixed[0], fixed[1])]
        else:
            options = []
            for p in range(1, len(setting.layers) + 1):
                d = next((d for d in range(N // (p * t), 0, -1) if B % (b * d) == 0), 0)
                if d:
                    options.append((p, d))
        least = np.full_like(total, np.inf)
        for p, d in options:
            if d < 1 or B % (b * d):
                continue
            m = B // (b * d)
            least = np.minimum(least, (m + (p - 1) * bubble) * np.maximum(total / p, heaviest))
        return least

    def dp_bounds(
        self,
        cands: Candidates,
        task_id: int,
        task: ModelTask,
        setting_idx: int,
        pairs: Sequence[tuple[int, int]],
        lb: np.ndarray | None = None,
    ) -> np.ndarray:
        """Stage 2: the DP's throughput on lower-bound times for each ``(config, hbm)`` pair
        (no bound, ``inf``, with ``dp_overlap``: see the module docstring).  Under another
        objective, its bound at the pair's HBM (:meth:`Objective.bound`: the DP bounds time,
        not energy or cost).  ``lb``: ``[groups, len(pairs)]`` lower bounds to use instead of
        the vectorized ones (:meth:`refined_lower_bounds`)."""
        obj = self.pricing.objective(cands)
        setting = task.settings[setting_idx]
        configs = np.asarray([c for c, _ in pairs], dtype=np.int64)
        columns = self.lower_bounds(cands, setting)[:, configs] if lb is None else lb
        if not obj.throughput:
            hbm = np.asarray([h for _, h in pairs], dtype=np.float64)
            total = _layers_total(setting, columns)
            with np.errstate(divide="ignore"):
                return np.where(total > 0, obj.bound(setting, total, configs, hbm), np.inf)
        if self.pricing.params.dp_overlap:
            return np.full(len(pairs), np.inf)
        t0 = time.perf_counter()
        # The placement is part of the key: the baselines evaluate the expert one on the same
        # candidates and settings, and its value bounds nothing for a searched placement.
        keys = [
            (id(cands), task_id, task.fixed, setting_idx, columns[:, i].tobytes(), h) for i, (_, h) in enumerate(pairs)
        ]
        todo = {}
        for i, (k, (_, h)) in enumerate(zip(keys, pairs)):
            if k not in self._dp_memo and k not in todo:
                todo[k] = self.pricing.problem(cands, setting, columns[:, i], h)
        if todo:
            results = self.pricing.place(list(todo.values()), task.fixed)
            self.pricing.counts["dp_bound_solves"] += len(todo)
            for k, r in zip(todo, results):
                self._dp_memo[k] = self.pricing.throughput(r)
        self.pricing.timers["dp_bound"] += time.perf_counter() - t0
        return np.asarray([self._dp_memo[k] for k in keys])

    def first_chip_result(self, cands: Candidates, task: ModelTask, s: int) -> _phaze_rs.ResultDict:
        """The DP's result for setting ``s`` of ``task`` on the first chip with the largest HBM,
        at lower-bound times.  Whether a placement fits (memory, batch, devices, stages) does
        not depend on the chip's speed, only on its HBM: infeasible here is infeasible on every
        chip of ``cands``."""
        setting = task.settings[s]
        lb = self.lower_bounds(cands, setting)[:, 0]
        return self.pricing.place([self.pricing.problem(cands, setting, lb, max(cands.hbm))], task.fixed)[0]

    def fits_somewhere(self, cands: Candidates, task: ModelTask) -> list[int]:
        """The usable settings of ``task`` that fit on some chip of ``cands``
        (:meth:`first_chip_result`): a search need not bound or price the others (they score 0
        everywhere; e.g. the expert placement's data parallelism not dividing the batch)."""
        return [s for s in task.usable() if self.first_chip_result(cands, task, s).get("feasible")]

    def why_not(self, cands: Candidates, task: ModelTask) -> str:
        """Why no setting of ``task`` fits on ``cands`` ('' when one does on its first chip): the
        DP's binding constraint at the first setting (the others are named), on the first chip
        with the largest HBM.  Memory, batch and device constraints do not depend on the chip's
        speed, so the bound times give the same reasons as exact ones."""
        failed: list[tuple[str, str]] = []
        for s in task.usable():
            setting = task.settings[s]
            r = self.first_chip_result(cands, task, s)
            if r.get("feasible"):
                return ""
            cp = f" CP {setting.cp}" if setting.cp > 1 else ""
            failed.append((f"b {setting.micro_batch} TP {setting.tp}{cp}", pl.binding_message(r) or "infeasible"))
        if not failed:
            return ""
        (where, msg), rest = failed[0], [w for w, _ in failed[1:]]
        return f"{where}: {msg}" + (f" (nothing fits at {', '.join(rest)} either)" if rest else "")


def _lower_bounds(args: tuple[Setting, np.ndarray, Any]) -> np.ndarray:
    """``[groups, configs]`` lower bounds on every priced group's makespan of a setting on the
    chips ``configs`` of ``template`` (:meth:`Bounds.lower_bounds`; a worker's entry point
    too, :meth:`Bounds.prepare_lower_bounds`)."""
    setting, configs, template = args
    lat = estimate_space(setting.table, configs, template, cache=None)
    cores: dict[str, np.ndarray | int] = {
        "tensor": configs["num_tc"].astype(np.float64),
        "vector": configs["num_vc"].astype(np.float64),
        "network": 1,
    }
    lb = np.zeros((len(setting.groups), len(configs)))
    for g in setting.priced_groups():
        grp = setting.groups[g]
        rows = list(grp.rows)
        lb[g] = group_lower_bound(setting.group_units(g), grp.edges, lat.one[rows], lat.split[rows], cores)
    # then the MoE layers' expert GEMMs' changes at each EP degree, exact (Setting.with_experts):
    # on a calibrated chip from the latencies its pricing reads (estimate_chip's, power-limited)
    split = lat.split
    if setting.expert_sums and getattr(template, "calibration", None) is not None:
        split = np.repeat(estimate_chip(setting.table, template).split, len(configs), axis=1)
    return setting.with_experts(lb, split)


def _bounded_groups(lr) -> list[int]:
    """The groups of a layer whose makespans bound its time per micro-batch from below: its
    forward and backward; not the forward of a layer with FP8 weight casts, whose time per
    micro-batch is the forward's less the casts (``timed``), which a lower bound on the
    forward's makespan does not bound."""
    return [g for g in ((lr.fwd if lr.cast < 0 else -1), lr.bwd) if g >= 0]


def _layer_lb(setting: Setting, lr, lb: np.ndarray) -> np.ndarray:
    """A lower bound on layer ``lr``'s forward and backward time per micro-batch at any EP
    degree from ``lb`` (``[groups + expert sums, ...]``): its :func:`_bounded_groups`, and
    for an MoE layer the least change its expert GEMMs make at an EP degree (none at e = 1;
    the forward's only where its makespan is counted)."""
    out = np.zeros(lb.shape[1:])
    for g in _bounded_groups(lr):
        out = out + lb[g]
    if lr.experts:
        base = len(setting.groups)
        least = np.zeros(lb.shape[1:])
        for _, f, b, _ in lr.experts:
            change = np.zeros(lb.shape[1:])
            if f >= 0 and lr.fwd >= 0 and lr.cast < 0:
                change = change + lb[base + f]
            if b >= 0:
                change = change + lb[base + b]
            least = np.minimum(least, change)
        out = out + least
    return out


def _layers_total(setting: Setting, lb: np.ndarray) -> np.ndarray:
    """``lb``'s (``[groups + expert sums, ...]``) :func:`_layer_lb` summed over the layers."""
    total = np.zeros(lb.shape[1:])
    for lr in setting.layers:
        total += _layer_lb(setting, lr, lb)
    return total
