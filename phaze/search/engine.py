"""The exact architecture × placement search: branch and bound over candidate chips.

**What is searched.**  An *architecture* is a candidate chip of the space (cores, PE arrays,
global buffer: a row of ``configs``) with an HBM capacity.  For each model, a *setting* is a
micro-batch size and a TP width (:class:`~phaze.search.setting.Setting`); inside a setting the
Rust DP picks data and pipeline parallelism and per-stage recompute (or evaluates a fixed
placement).  An architecture's throughput on a model is the best over its settings; its *score*
is the mean over the models (one model: its throughput).  The best architecture maximizes the
score; ties go to the smaller area, then the smaller HBM, then the earlier candidate, and a
model's tied settings to the smaller micro-batch, then the smaller TP width.

**Exact, with bounds.**  Every layer time the DP sees is a scheduled makespan (SCIP, through
:class:`~passes.algorithms.schedule.ScheduleCache`).  Four stages, each an upper bound on the
score that is cheaper than the next, prune any architecture whose bound is below the best score
found (the DP's time is monotone in the layer times, so lower bounds on the times give upper
bounds on the throughput):

1. **work bound** (all candidates at once, numpy): a setting's throughput is at most
   ``b·N / (t·Σ_layers (fwd_lb + bwd_lb))`` (every micro-batch crosses every layer on a group of
   ``t`` of the ``N`` devices), with ``*_lb`` :func:`~passes.algorithms.schedule_bounds.group_lower_bound`;
2. **DP bound**: the Rust DP run on those lower-bound times, for each setting and HBM capacity
   (identical bound vectors are solved once), under the same recompute setting as the exact
   DP (a fixed policy restricts both alike: the same feasible set, each plan's time monotone).
   Skipped with ``dp_overlap``: when the DP all-reduce hides behind a stage's backward, a
   shorter backward exposes more of it, so the DP is not monotone in the layer times and its
   value on lower bounds bounds nothing (random problems show it); the work bound, which counts
   no communication nor recompute, still holds;
3. **refined bound**: before an architecture is scheduled, the DP bound again on each layer's
   own combinatorial bound, or its makespan where its schedule is known
   (:meth:`Evaluator.refined_lower_bounds`): milliseconds where a schedule costs tenths of a
   second;
4. **exact**: the settings whose bound can still matter are scheduled and placed exactly.

Architectures are visited best bound first, so the incumbent rises fast and the search stops
as soon as no remaining bound can beat it.  Nothing is pruned that could win, ties included
(bounds are compared with a relative tolerance of :data:`TOL`), so the answer is the answer of
plain enumeration (``prune=False``; tested on a small space).

**Determinism.**  Batches have fixed sizes and a fixed order, solves use a node limit rather
than the clock (see :class:`SolverLimits`), and backends only change where a schedule is
computed, never which: ``-j 1``, ``-j N`` and Ray give the same bytes.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from passes.algorithms import _phaze_rs
from passes.algorithms import placement as pl
from passes.algorithms import schedule as sched
from passes.algorithms.latency import estimate_op, estimate_space
from passes.algorithms.schedule_bounds import group_lower_bound
from phaze.search.objective import Objective
from phaze.search.setting import Setting

#: Relative tolerance when comparing a bound with the incumbent (bounds and exact values are
#: summed in different orders; a bound may exceed its exact value by rounding only).
TOL = 1e-9
#: Architectures per DP-bound batch and per exact batch (fixed: results and statistics do not
#: depend on the number of workers).
BOUND_BATCH = 256
EXACT_BATCH = 8
#: From this many chips on, the settings' vectorized lower bounds are computed on the workers
#: (:meth:`Evaluator.prepare_lower_bounds`); below, shipping a setting costs more than its bounds.
PARALLEL_BOUNDS_CONFIGS = 1000
#: The evaluator's timers (seconds) and counts, in the JSON's order (``search.wall_s`` after the
#: phases, ``search.evaluator``).
TIMERS = ("estimate", "dp_bound", "schedule", "dp_exact")
COUNTS = ("dp_bound_solves", "schedules_solved", "schedules_cached", "dp_exact_solves", "over_power_cap")


@dataclass(frozen=True)
class SolverLimits:
    """Limits of each layer schedule.  The search stops SCIP by nodes (the default 1: the root
    node, after the warm start's local search) so that a schedule never depends on how loaded
    the machine is; the time limit is only a safety net."""

    time_limit: float = 60.0
    gap_limit: float = 0.005
    node_limit: int | None = 1
    #: Larger MILPs keep the warm start (BERT-large's block backward on a 2-vector-core chip has
    #: ~10,000 binaries and its root LP alone takes ~40 s).
    max_binaries: int | None = 2000
    seed: int = 0

    @classmethod
    def of_options(cls, opts: Any) -> SolverLimits:
        """The limits of the driver's :class:`~phaze.driver.Options` (0: no limit)."""
        return cls(
            time_limit=opts.schedule_time_limit,
            gap_limit=opts.schedule_gap,
            node_limit=opts.schedule_nodes or None,
            max_binaries=opts.schedule_max_binaries or None,
        )


@dataclass
class Candidates:
    """The chips searched: ``configs`` (rows of ``CONFIG_DTYPE``), the HBM options, the template
    that gives clock, bandwidths and network, and how to build a chip's
    :class:`~phaze_ir.hardware.Accelerator`."""

    name: str
    configs: np.ndarray
    hbm: tuple[int, ...]
    template: Any
    make: Callable[[int, int], Any]

    @classmethod
    def of_space(cls, space) -> Candidates:
        """Every candidate of an :class:`~passes.algorithms.arch_space.ArchSpace`."""
        return cls(
            space.spec.name,
            space.configs,
            tuple(space.hbm_options),
            space.spec.template,
            lambda c, h: space.accelerator(c, h),
        )

    @classmethod
    def of_accelerator(cls, acc) -> Candidates:
        """One chip as it is (its own HBM)."""
        from passes.algorithms.latency import config_of

        return cls(acc.name, config_of(acc), (acc.hbm.bytes,), acc, lambda c, h: acc)


@dataclass
class ModelTask:
    """One model of the search: its settings and the placement (None: the DP searches it;
    ``(pp, dp, tp)``: that placement, at each micro-batch size)."""

    name: str
    settings: list[Setting]
    fixed: tuple[int, int, int] | None = None

    def usable(self) -> list[int]:
        """Indices of the settings this placement can use."""
        return [i for i, s in enumerate(self.settings) if self.fixed is None or s.tp == self.fixed[2]]


@dataclass
class Params:
    """The cluster and the training step; ``recompute``: ``auto`` (the DP picks each stage's
    policy) or the policy of every stage; ``zero``: ``auto`` (the DP picks) or a ZeRO stage;
    ``pipeline_schedule``: ``auto`` (the DP picks), ``1f1b`` or ``interleaved:V``;
    ``rank_order``: ``auto`` (the DP picks), ``tp-dp-pp`` or ``tp-pp-dp``;
    ``pipeline_transfer``: ``whole`` or ``split`` (how the launcher sends a stage boundary's
    values; a setting sharded with sequence parallelism sends its own shard either way).  The
    defaults are the paper's placement space, with the device numbering chosen."""

    devices: int
    global_batch: int
    dp_overlap: bool = False
    recompute: str = "auto"
    zero: str = "0"
    pipeline_schedule: str = "1f1b"
    #: What the search maximizes (:data:`phaze.search.objective.OBJECTIVES`).
    objective: str = "throughput"
    #: None, or the most a chip may draw (W): a setting whose plan's chip power is above it
    #: scores 0 (the plan the DP finds, the fastest; a slower one under the cap is not sought).
    power_cap_w: float | None = None
    rank_order: str = "auto"
    pipeline_transfer: str = "whole"
    #: The fraction of HBM every device leaves free (``Options.memory_headroom``).
    memory_headroom: float = 0.0

    @classmethod
    def of_options(cls, opts: Any, objective: str | None = None) -> Params:
        """From the driver's :class:`~phaze.driver.Options` (``objective``: instead of theirs)."""
        return cls(
            opts.devices,
            opts.global_batch,
            opts.dp_overlap,
            opts.recompute,
            opts.zero,
            opts.pipeline_schedule,
            objective or opts.objective,
            opts.power_cap_w,
            opts.rank_order,
            opts.pipeline_transfer,
            opts.memory_headroom,
        )


@dataclass
class Evaluated:
    """One exactly evaluated architecture: per model, the best setting (index into the model's
    settings, -1 if nothing fits) with its objective value and DP result; ``score``, the mean
    of the models' objective values; ``throughput``, the mean of their throughputs (the score
    itself under the throughput objective); ``power_w``, the mean of the chip's power at the
    models' plans (:meth:`Evaluator.chip_power`; None when the chip has no ``[energy]`` table
    or nothing fits)."""

    config: int
    hbm: int
    score: float
    area_um2: float
    best: list[tuple[int, float, _phaze_rs.ResultDict | None]]
    throughput: float = 0.0
    power_w: float | None = None


@dataclass
class Result:
    """What a search returns: the best architecture (None when nothing fits anywhere), every
    architecture evaluated exactly, and the statistics."""

    best: Evaluated | None
    evaluated: list[Evaluated]
    stats: dict[str, Any] = field(default_factory=dict)


class Progress(Protocol):
    """Progress callbacks (the CLI shows them with rich; :class:`NoProgress` does nothing)."""

    def start(self, description: str, total: int) -> None: ...

    def advance(self, n: int = 1) -> None: ...

    def stop(self) -> None: ...


class NoProgress:
    """The :class:`Progress` that shows nothing."""

    def start(self, description: str, total: int) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass

    def stop(self) -> None:
        pass


def _solve_one(args: tuple[sched.Problem, SolverLimits]) -> sched.Schedule:
    """Worker entry point: solve one canonical problem (no cache in the worker: the parent
    keeps it, so that every backend sees the same entries)."""
    problem, lim = args
    return sched.solve(
        problem,
        time_limit=lim.time_limit,
        seed=lim.seed,
        gap_limit=lim.gap_limit,
        node_limit=lim.node_limit,
        max_binaries=lim.max_binaries,
    )


class Evaluator:
    """Prices settings on candidates: vectorized bounds, exact schedules (through the cache and
    the backend), the DP.  Shared by the main search and the baselines, so that every number
    comes from the same place and each schedule is solved once."""

    def __init__(self, params: Params, limits: SolverLimits, cache: sched.ScheduleCache, backend=None):
        self.params = params
        self.limits = limits
        self.cache = cache
        self.backend = backend
        self.timers = dict.fromkeys(TIMERS, 0.0)
        self.counts = dict.fromkeys(COUNTS, 0)
        self._lb: dict[tuple[int, int], np.ndarray] = {}
        self._dp_memo: dict[tuple, float] = {}
        self._exact_ms: dict[tuple[int, int, int], np.ndarray] = {}
        #: canonical problem key -> its combinatorial lower bound (:meth:`refined_lower_bounds`)
        self._problem_lb: dict[str, float] = {}
        self._levels: dict[int, list] = {}
        self._objectives: dict[int, Objective] = {}

    def objective(self, cands: Candidates) -> Objective:
        """The search's objective on ``cands`` (built once per candidates)."""
        obj = self._objectives.get(id(cands))
        if obj is None:
            obj = Objective(self.params.objective, cands, self.params.global_batch, self.params.power_cap_w is not None)
            self._objectives[id(cands)] = obj
        return obj

    def chip_power(self, cands: Candidates, settings: Sequence[Setting | None], config: int, results) -> float | None:
        """The mean over models of the chip's power (W, the busiest device's average over the
        step) at each model's plan ``results[m]`` of ``settings[m]`` on ``config``; None when
        the template has no ``[energy]`` table or no model has a plan.  It is what the
        throughput-power front of the JSON and the report is drawn from."""
        if cands.template.energy is None:
            return None
        obj = self.objective(cands)
        t0 = time.perf_counter()
        watts = [
            obj.plan_power(setting, config, r["plan"]).chip_power_w
            for setting, r in zip(settings, results)
            if setting is not None and r is not None and r.get("feasible") and r.get("plan")
        ]
        self.timers["estimate"] += time.perf_counter() - t0
        return sum(watts) / len(watts) if watts else None

    # -- bounds -----------------------------------------------------------------------------------

    def lower_bounds(self, cands: Candidates, setting: Setting) -> np.ndarray:
        """``[groups, configs]`` lower bounds on every group's makespan."""
        key = (id(cands), id(setting))
        if key not in self._lb:
            t0 = time.perf_counter()
            self._lb[key] = _lower_bounds((setting, cands.configs, cands.template))
            self.timers["estimate"] += time.perf_counter() - t0
        return self._lb[key]

    def prepare_lower_bounds(self, cands: Candidates, settings: Sequence[Setting]) -> None:
        """:meth:`lower_bounds` of each of ``settings`` not known yet, computed on the backend's
        workers at once (the same function, so the same floats): a search needs them for every
        setting before anything else, tenths of a second each on a space's tens of thousands of
        chips, while the workers have nothing else to do.  In-process without a backend, for a
        few chips, or for one setting (shipping them would cost more)."""
        todo = list({id(s): s for s in settings if (id(cands), id(s)) not in self._lb}.values())
        if self.backend is None or len(todo) < 2 or len(cands.configs) < PARALLEL_BOUNDS_CONFIGS:
            return
        t0 = time.perf_counter()
        for s, lb in zip(todo, self.backend.map(_lower_bounds, [(s, cands.configs, cands.template) for s in todo])):
            self._lb[(id(cands), id(s))] = lb
        self.timers["estimate"] += time.perf_counter() - t0

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
        (:meth:`_BranchAndBound.refine`).  A calibrated chip keeps the vectorized bounds."""
        lb = self.lower_bounds(cands, setting)[:, list(configs)].copy()
        if getattr(cands.template, "calibration", None) is not None:
            return lb
        t0 = time.perf_counter()
        limits = self._cache_limits()
        lat = estimate_space(setting.table, cands.configs[list(configs)], cands.template, cache=None)
        for col, c in enumerate(configs):
            known = self._exact_ms.get((id(cands), id(setting), c))
            if known is not None:
                lb[:, col] = known
                continue
            cores = _cores(cands, c)
            for g in setting.priced_groups():
                canon = setting.group_problem(g, lat.one[:, col], lat.split[:, col], cores).canonical()
                schedule = self.cache.lookup(canon, limits)
                if schedule is not None:
                    lb[g, col] = schedule.makespan
                    continue
                key = canon.key()
                bound = self._problem_lb.get(key)
                if bound is None:
                    bound = self._problem_lb[key] = sched.makespan_lower_bound(canon)
                lb[g, col] = max(lb[g, col], bound)
        self.timers["estimate"] += time.perf_counter() - t0
        return lb

    def work_bound(self, cands: Candidates, setting: Setting, fixed: tuple[int, int, int] | None = None) -> np.ndarray:
        """Stage 1: ``[configs]`` upper bounds on the setting's objective (throughput:
        samples/s, :meth:`least_time`; the others: :meth:`Objective.bound`, at the smallest HBM
        option); ``fixed``: the task's fixed placement (None: searched)."""
        total = self.total_lb(cands, setting)
        obj = self.objective(cands)
        if not obj.throughput:
            t0 = time.perf_counter()
            with np.errstate(divide="ignore"):
                out = np.where(total > 0, obj.bound(setting, total, np.arange(len(total)), min(cands.hbm)), np.inf)
            self.timers["estimate"] += time.perf_counter() - t0
            return out
        least = self.least_time(cands, setting, fixed)
        with np.errstate(divide="ignore"):
            return np.where(least > 0, self.params.global_batch / least, np.inf)

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
            layer = np.zeros_like(total)
            for g in (lr.fwd, lr.bwd):
                if g >= 0:
                    layer += lb[g]
            heaviest = np.maximum(heaviest, layer)
        B, N, b, t = self.params.global_batch, self.params.devices, setting.micro_batch, setting.tp
        v = pl.parse_pipeline_schedule(self.params.pipeline_schedule)
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

    def problem(self, cands: Candidates, setting: Setting, makespans: np.ndarray, hbm: int) -> _phaze_rs.ProblemDict:
        """The DP problem of ``setting`` with group makespans ``makespans`` and HBM ``hbm``."""
        levels = self._levels.get(id(cands))
        if levels is None:
            levels = self._levels[id(cands)] = pl.network_levels(cands.template.to_dict()["network"])
        return pl.problem(
            setting.layer_dicts(makespans),
            devices=self.params.devices,
            hbm_bytes=hbm,
            levels=levels,
            global_batch=self.params.global_batch,
            micro_batch=setting.micro_batch,
            tp=setting.tp,
            dp_overlap=self.params.dp_overlap,
            recompute=self.params.recompute,
            zero=self.params.zero,
            pipeline_schedule=self.params.pipeline_schedule,
            blocks=setting.blocks,
            rank_order=self.params.rank_order,
            # as phaze-place-devices: under sequence parallelism each rank sends its own shard
            pipeline_transfer="whole" if setting.sequence_parallel else self.params.pipeline_transfer,
            grads_freed=setting.grads_freed,
            memory_headroom=self.params.memory_headroom,
        )

    def place(
        self, problems: list[_phaze_rs.ProblemDict], fixed: tuple[int, int, int] | None
    ) -> list[_phaze_rs.ResultDict]:
        """Run the DP (or evaluate the fixed placement) on each problem."""
        if fixed is None:
            return _phaze_rs.solve_placement_batch(problems)
        return _phaze_rs.evaluate_placement_batch(problems, fixed[0], fixed[1])

    @staticmethod
    def throughput(result: _phaze_rs.ResultDict) -> float:
        plan = result.get("plan")
        return float(plan["throughput_samples_per_s"]) if result.get("feasible") and plan else 0.0

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
        obj = self.objective(cands)
        setting = task.settings[setting_idx]
        configs = np.asarray([c for c, _ in pairs], dtype=np.int64)
        columns = self.lower_bounds(cands, setting)[:, configs] if lb is None else lb
        if not obj.throughput:
            hbm = np.asarray([h for _, h in pairs], dtype=np.float64)
            total = _layers_total(setting, columns)
            with np.errstate(divide="ignore"):
                return np.where(total > 0, obj.bound(setting, total, configs, hbm), np.inf)
        if self.params.dp_overlap:
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
                todo[k] = self.problem(cands, setting, columns[:, i], h)
        if todo:
            results = self.place(list(todo.values()), task.fixed)
            self.counts["dp_bound_solves"] += len(todo)
            for k, r in zip(todo, results):
                self._dp_memo[k] = self.throughput(r)
        self.timers["dp_bound"] += time.perf_counter() - t0
        return np.asarray([self._dp_memo[k] for k in keys])

    def first_chip_result(self, cands: Candidates, task: ModelTask, s: int) -> _phaze_rs.ResultDict:
        """The DP's result for setting ``s`` of ``task`` on the first chip with the largest HBM,
        at lower-bound times.  Whether a placement fits (memory, batch, devices, stages) does
        not depend on the chip's speed, only on its HBM: infeasible here is infeasible on every
        chip of ``cands``."""
        setting = task.settings[s]
        lb = self.lower_bounds(cands, setting)[:, 0]
        return self.place([self.problem(cands, setting, lb, max(cands.hbm))], task.fixed)[0]

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
            failed.append((f"b {setting.micro_batch} TP {setting.tp}", pl.binding_message(r) or "infeasible"))
        if not failed:
            return ""
        (where, msg), rest = failed[0], [w for w, _ in failed[1:]]
        return f"{where}: {msg}" + (f" (nothing fits at {', '.join(rest)} either)" if rest else "")

    # -- exact ------------------------------------------------------------------------------------

    def makespans(self, cands: Candidates, jobs: Sequence[tuple[Setting, int]]) -> list[np.ndarray]:
        """Exact group makespans of each ``(setting, config)``; the schedules the cache lacks are
        solved through the backend, each distinct canonical problem once."""
        t0 = time.perf_counter()
        limits = self._cache_limits()
        out: list[np.ndarray | None] = [None] * len(jobs)
        wanted, pending = self._group_problems(cands, jobs, limits, out)
        self.counts["schedules_cached"] += len({p.key() for _, _, p in wanted}) - len(pending)
        if pending:
            self._solve_and_store(list(pending.values()), limits)
        makespans: dict[int, np.ndarray] = {}
        for j, g, canon in wanted:
            arr = makespans.setdefault(j, np.zeros(len(jobs[j][0].groups)))
            schedule = self.cache.lookup(canon, limits)
            assert schedule is not None  # cached or solved and stored above
            arr[g] = schedule.makespan
        for j, arr in makespans.items():
            setting, config = jobs[j]
            self._exact_ms[(id(cands), id(setting), config)] = arr
            out[j] = arr
        self.timers["schedule"] += time.perf_counter() - t0
        done = [arr for arr in out if arr is not None]
        assert len(done) == len(jobs)  # every job was cached or has just been solved
        return done

    def _cache_limits(self):
        """The cache's key for this search's solver limits (a schedule is reused only under the
        limits that made it)."""
        lim = self.limits
        return self.cache.limits(lim.time_limit, lim.gap_limit, lim.node_limit, lim.max_binaries)

    def _group_problems(
        self, cands: Candidates, jobs: Sequence[tuple[Setting, int]], limits, out: list[np.ndarray | None]
    ) -> tuple[list[tuple[int, int, sched.Problem]], dict[str, sched.Problem]]:
        """The canonical schedule problem of every priced group of each job whose makespans are
        not memoized (those that are go straight into ``out``): ``(wanted, pending)``, where
        ``wanted`` lists ``(job, group, problem)`` and ``pending`` the distinct problems the
        cache lacks.  Latencies are estimated once per setting for all its configs."""
        wanted: list[tuple[int, int, sched.Problem]] = []
        pending: dict[str, sched.Problem] = {}
        by_setting: dict[int, list[int]] = {}
        for j, (setting, _config) in enumerate(jobs):
            by_setting.setdefault(id(setting), []).append(j)
        calibration = getattr(cands.template, "calibration", None)
        for idxs in by_setting.values():
            setting = jobs[idxs[0]][0]
            configs = [jobs[j][1] for j in idxs]
            if calibration is None:
                lat = estimate_space(setting.table, cands.configs[configs], cands.template, cache=None)
                one, split = lat.one, lat.split
            else:
                one, split = _one_chip_latencies(setting, cands, len(configs))
            needed = setting.priced_groups()
            for col, j in enumerate(idxs):
                key = (id(cands), id(setting), configs[col])
                if key in self._exact_ms:
                    out[j] = self._exact_ms[key]
                    continue
                cores = _cores(cands, configs[col])
                if calibration is not None and calibration.serial:
                    # One op at a time, issued by the host (phaze-schedule-ops does the same):
                    # no solver, no cache, the problem in program order as the IR has it.
                    arr = np.zeros(len(setting.groups))
                    for g in needed:
                        problem = setting.group_problem(g, one[:, col], split[:, col], cores)
                        arr[g] = sched.serial_schedule(problem, calibration.host_dispatch_s).makespan
                    self._exact_ms[key] = out[j] = arr
                    continue
                for g in needed:
                    canon = setting.group_problem(g, one[:, col], split[:, col], cores).canonical()
                    wanted.append((j, g, canon))
                    if self.cache.lookup(canon, limits) is None:
                        pending.setdefault(canon.key(), canon)
        return wanted, pending

    def _solve_and_store(self, problems: list[sched.Problem], limits) -> None:
        """Solve ``problems`` through the backend (in-process without one) and cache them."""
        items = [(p, self.limits) for p in problems]
        results = self.backend.map(_solve_one, items) if self.backend is not None else [_solve_one(a) for a in items]
        for p, r in zip(problems, results):
            self.cache.store(p, r, limits)
        self.counts["schedules_solved"] += len(problems)

    def exact(
        self, cands: Candidates, tasks: Sequence[ModelTask], jobs: Sequence[tuple[int, int, int, int]]
    ) -> list[tuple[float, _phaze_rs.ResultDict]]:
        """Exact objective value (throughput by default) and DP result of each ``(task,
        setting, config, hbm)``."""
        makespans = self.makespans(cands, [(tasks[m].settings[s], c) for m, s, c, _ in jobs])
        t0 = time.perf_counter()
        by_task: dict[int, list[int]] = {}
        for j, (m, _, _, _) in enumerate(jobs):
            by_task.setdefault(m, []).append(j)
        out: dict[int, tuple[float, _phaze_rs.ResultDict]] = {}
        for m, idxs in by_task.items():
            problems = [self.problem(cands, tasks[m].settings[jobs[j][1]], makespans[j], jobs[j][3]) for j in idxs]
            obj = self.objective(cands)
            cap = self.params.power_cap_w
            for j, dp_result in zip(idxs, self.place(problems, tasks[m].fixed)):
                _, s, c, h = jobs[j]
                setting = tasks[m].settings[s]
                score = obj.score(setting, c, h, dp_result)
                if cap is not None and score > 0 and obj.plan_power(setting, c, dp_result["plan"]).chip_power_w > cap:
                    score = 0.0  # over the power cap: as if it did not fit
                    self.counts["over_power_cap"] += 1
                out[j] = (score, dp_result)
            self.counts["dp_exact_solves"] += len(idxs)
        self.timers["dp_exact"] += time.perf_counter() - t0
        return [out[j] for j in range(len(jobs))]


def _lower_bounds(args: tuple[Setting, np.ndarray, Any]) -> np.ndarray:
    """``[groups, configs]`` lower bounds on every priced group's makespan of a setting on the
    chips ``configs`` of ``template`` (:meth:`Evaluator.lower_bounds`; a worker's entry point
    too, :meth:`Evaluator.prepare_lower_bounds`)."""
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
    return lb


def _cores(cands: Candidates, config: int) -> dict[str, int]:
    """The core count of each unit kind of chip ``config`` (one network link)."""
    configs = cands.configs
    return {"tensor": int(configs["num_tc"][config]), "vector": int(configs["num_vc"][config]), "network": 1}


def _layers_total(setting: Setting, lb: np.ndarray) -> np.ndarray:
    """``lb``'s (``[groups, ...]``) forward and backward groups summed over the layers."""
    total = np.zeros(lb.shape[1:])
    for lr in setting.layers:
        for g in (lr.fwd, lr.bwd):
            if g >= 0:
                total += lb[g]
    return total


def _one_chip_latencies(setting: Setting, cands: Candidates, columns: int) -> tuple[np.ndarray, np.ndarray]:
    """``(one, split)``, ``[rows × columns]`` seconds of the setting's op table on a calibrated
    chip (a GPU: kernel efficiencies and launch costs, which the vectorized model of a space
    does not have), priced op by op as ``phaze-estimate-latency`` prices them; the chip is
    ``cands``' only one, so every column is the same."""
    if len(cands.configs) != 1:
        raise ValueError(f"{cands.name}: a calibrated chip is priced alone, not as a space")
    rows = [estimate_op(d, cands.template) for d in setting.table.descs]
    one = np.repeat(np.asarray([r.one_s for r in rows], dtype=np.float64)[:, None], columns, axis=1)
    split = np.repeat(np.asarray([r.split_s for r in rows], dtype=np.float64)[:, None], columns, axis=1)
    return one, split


def _setting_order(task: ModelTask, setting_idx: int) -> tuple[int, int, bool]:
    """A model's tie-break between settings of equal throughput: the smaller micro-batch, then
    the smaller TP width, then without sequence parallelism (as ``phazec --hw`` breaks them)."""
    setting = task.settings[setting_idx]
    return (setting.micro_batch, setting.tp, setting.sequence_parallel)


#: An exact job: ``(model index, setting index, config index, HBM bytes)``, as :meth:`Evaluator.exact` takes it.
ExactJob = tuple[int, int, int, int]
#: A setting waiting for the second exact round: ``(architecture, model index, setting index, DP bound)``.
PendingJob = tuple[int, int, int, float]
#: One model's exactly priced setting: ``(setting index, throughput, DP result)``.
PricedSetting = tuple[int, float, "_phaze_rs.ResultDict | None"]  # the stub's type, named lazily


def search(
    cands: Candidates,
    tasks: Sequence[ModelTask],
    evaluator: Evaluator,
    *,
    prune: bool = True,
    progress: Progress | None = None,
    label: str = "search",
) -> Result:
    """The best architecture of ``cands`` for ``tasks`` (see the module docstring).
    ``prune=False`` evaluates every architecture exactly (plain enumeration, for tests)."""
    return _BranchAndBound(cands, tasks, evaluator, prune, progress or NoProgress(), label).run()


class _BranchAndBound:
    """One search: the state shared by its stages (the incumbent, the queue of architectures
    waiting for an exact evaluation, the pruning counts), with one method per stage.

    An *architecture* is an index into :attr:`archs`, a ``(config index, HBM index)`` pair; a
    *score bound* is an upper bound on its score (the mean over models of each model's best
    setting)."""

    def __init__(
        self,
        cands: Candidates,
        tasks: Sequence[ModelTask],
        evaluator: Evaluator,
        prune: bool,
        progress: Progress,
        label: str,
    ):
        self.cands = cands
        self.tasks = tasks
        self.evaluator = evaluator
        self.prune = prune
        self.progress = progress
        self.label = label
        self.n_models = len(tasks)
        evaluator.prepare_lower_bounds(cands, [s for task in tasks for s in (task.settings[i] for i in task.usable())])
        self.usable = [evaluator.fits_somewhere(cands, task) for task in tasks]
        self.n_settings = sum(len(u) for u in self.usable)
        self.archs = [(c, h) for c in range(len(cands.configs)) for h in range(len(cands.hbm))]
        self.area = np.asarray(cands.configs["area_um2"], dtype=np.float64)  # NaN outside the area model
        #: The area as a sort key: a chip outside the area model sorts after every modelled one.
        self.area_key = np.where(np.isfinite(self.area), self.area, np.inf)
        self.best: Evaluated | None = None
        self.evaluated: list[Evaluated] = []
        self.pruned = {"work_bound": 0, "dp_bound": 0, "refined_bound": 0, "exact": 0}
        #: Architectures past the DP bound, best first: ``(-DP score bound, visit rank, arch)``.
        self.queue: list[tuple[float, int, int]] = []
        #: arch -> per model, its DP bounds (one per usable setting), while it is queued.
        self.dp_bounds_of: dict[int, list[np.ndarray]] = {}
        #: Queued architectures whose DP bounds have been refined (:meth:`refine`).
        self.refined: set[int] = set()
        # Set by run(): the work bound of each config, the visit order, how far it has got.
        self.work_bound = np.zeros(0)
        #: [model][setting] -> [configs]: each setting's work bound (set by run()).
        self.setting_work_bound: list[dict[int, np.ndarray]] = []
        self.order: list[int] = []
        self.rank: dict[int, int] = {}
        self.visited = 0

    def run(self) -> Result:
        """Stage 1 on every candidate, then stages 2 to 4 interleaved, best bound first, until
        no bound left can beat the incumbent."""
        t_start = time.perf_counter()
        self.work_bound = self.work_bound_of_configs()
        self.order = self.visit_order()
        self.rank = {a: r for r, a in enumerate(self.order)}
        self.progress.start(f"{self.label}: architectures", len(self.archs))
        while (stage := self.next_stage()) is not None:
            if stage == "dp_bound":
                self.dp_bound_next_block()
            else:
                self.evaluate_exactly(self.pop_exact_batch())
        self.count_unvisited_as_pruned()
        self.progress.stop()
        self.evaluated.sort(key=lambda e: (e.config, e.hbm))
        return Result(self.best, self.evaluated, self.statistics(time.perf_counter() - t_start))

    # -- the incumbent ----------------------------------------------------------------------------

    def incumbent(self) -> float:
        """The best score found so far (-inf before the first)."""
        return self.best.score if self.best is not None else -np.inf

    def below_incumbent(self, bound: float) -> bool:
        """Whether a score bound proves an architecture cannot win (never without pruning or an
        incumbent; the tolerance keeps ties, see :data:`TOL`)."""
        return self.prune and self.best is not None and bound < self.incumbent() * (1 - TOL)

    def answer_key(self, evaluated: Evaluated) -> tuple:
        """The order of the answer: the higher score, then the smaller area, HBM, config index."""
        return (-evaluated.score, self.area_key[evaluated.config], evaluated.hbm, evaluated.config)

    # -- stage 1: the work bound ------------------------------------------------------------------

    def work_bound_of_configs(self) -> np.ndarray:
        """Stage 1 on every candidate at once: ``[configs]`` score bounds, the mean over models of
        each model's best work bound over its settings.  It does not depend on the HBM (the work
        bound ignores memory), so one value serves every HBM option of a config."""
        self.progress.start(f"{self.label}: bounds", self.n_settings)
        per_setting = self.setting_work_bound
        for m, task in enumerate(self.tasks):
            per_setting.append({})
            for s in self.usable[m]:
                per_setting[m][s] = self.evaluator.work_bound(self.cands, task.settings[s], task.fixed)
                self.progress.advance()
        self.progress.stop()
        n_configs = len(self.cands.configs)
        per_model = np.stack(
            [
                np.max(np.stack([per_setting[m][s] for s in self.usable[m]]), axis=0)
                if self.usable[m]
                else np.zeros(n_configs)
                for m in range(self.n_models)
            ]
        )
        return per_model.mean(axis=0)

    def visit_order(self) -> list[int]:
        """Every architecture, best work bound first, then in the tie-break order of the answer,
        so that the first exact evaluations are the likeliest winners."""
        archs, work_bound, area_key = self.archs, self.work_bound, self.area_key
        return sorted(
            range(len(archs)),
            key=lambda a: (-work_bound[archs[a][0]], area_key[archs[a][0]], archs[a][1], archs[a][0]),
        )

    # -- choosing the next stage ------------------------------------------------------------------

    def next_stage(self) -> str | None:
        """``"dp_bound"`` when the best unvisited work bound is at least the best queued DP bound,
        ``"exact"`` when a queued architecture comes first, None when neither can beat the
        incumbent (or nothing is left): the search is over."""
        next_unvisited = (
            self.work_bound[self.archs[self.order[self.visited]][0]] if self.visited < len(self.order) else -np.inf
        )
        next_queued = -self.queue[0][0] if self.queue else -np.inf
        best_left = max(next_unvisited, next_queued)
        if best_left == -np.inf or self.below_incumbent(best_left):
            return None
        if next_unvisited >= next_queued and self.visited < len(self.order):
            return "dp_bound"
        return "exact"

    # -- stage 2: the DP bound --------------------------------------------------------------------

    def dp_bound_next_block(self) -> None:
        """Stage 2 on the next :data:`BOUND_BATCH` architectures of the visit order: the DP on
        lower-bound times for each setting; an architecture whose score bound cannot beat the
        incumbent is pruned, the others are queued for stage 3 by that bound."""
        block = self.order[self.visited : self.visited + BOUND_BATCH]
        self.visited += len(block)
        pairs = [(self.archs[a][0], self.cands.hbm[self.archs[a][1]]) for a in block]
        model_bound = np.zeros((len(block), self.n_models))  # best setting's bound per model
        per_setting: dict[int, np.ndarray] = {}  # model -> [block, usable settings]
        need = self.needed_bounds([c for c, _ in pairs])
        for m in range(self.n_models):
            cols = [self.setting_dp_bounds(m, s, pairs, need[m]) for s in self.usable[m]]
            per_setting[m] = np.stack(cols, axis=1) if cols else np.zeros((len(block), 0))
            model_bound[:, m] = per_setting[m].max(axis=1) if cols else 0.0
        score_bound = model_bound.mean(axis=1)
        for i, a in enumerate(block):
            if self.below_incumbent(score_bound[i]):
                self.pruned["dp_bound"] += 1
                self.progress.advance()
                continue
            self.dp_bounds_of[a] = [per_setting[m][i] for m in range(self.n_models)]
            heapq.heappush(self.queue, (-score_bound[i], self.rank[a], a))

    def needed_bounds(self, configs: list[int]) -> np.ndarray:
        """``[models, configs]``: the least score bound each model's setting must reach on each
        config to lift it to the incumbent, every other model at its best work bound there
        (``-inf``, nothing needed, without pruning, an incumbent or the throughput objective)."""
        need = np.full((self.n_models, len(configs)), -np.inf)
        if not (self.prune and self.best is not None and self.evaluator.objective(self.cands).throughput):
            return need
        best_work = np.zeros((self.n_models, len(configs)))
        for k in range(self.n_models):
            for bound in self.setting_work_bound[k].values():
                best_work[k] = np.maximum(best_work[k], bound[configs])
        others = best_work.sum(axis=0) - best_work
        return (self.n_models * self.incumbent() - others) * (1 - TOL)

    def setting_dp_bounds(self, m: int, s: int, pairs: list[tuple[int, int]], need: np.ndarray) -> np.ndarray:
        """Model ``m``'s setting ``s``'s score bounds on ``pairs``: the DP bound, except where
        the setting's work bound is below ``need`` (:meth:`needed_bounds`): it cannot lift the
        architecture to the incumbent, and the work bound (itself an upper bound) stands in, the
        DP not run.  Such a setting is skipped by the exact stage and kept in its check
        (:meth:`exact_jobs`, :meth:`accept`) all the same."""
        out = np.asarray([self.setting_work_bound[m][s][c] for c, _ in pairs], dtype=np.float64)
        idx = np.flatnonzero(out >= need)
        if len(idx):
            out[idx] = self.evaluator.dp_bounds(self.cands, m, self.tasks[m], s, [pairs[i] for i in idx])
        return out

    # -- stages 3 and 4: the refined bound, exact ------------------------------------------------

    def pop_exact_batch(self) -> list[int]:
        """Up to :data:`EXACT_BATCH` queued architectures, best bound first, each with its
        bounds refined (:meth:`refine`, which queues it again by its refined bound); those that
        the incumbent has overtaken are pruned on the way."""
        batch: list[int] = []
        while self.queue and len(batch) < EXACT_BATCH:
            fresh: list[int] = []
            while self.queue and len(batch) + len(fresh) < EXACT_BATCH:
                neg_bound, _, a = heapq.heappop(self.queue)
                if self.below_incumbent(-neg_bound):
                    self.drop(a)
                elif a in self.refined or not self.refining():
                    batch.append(a)
                else:
                    fresh.append(a)
            self.refine(fresh)
        return batch

    def drop(self, a: int) -> None:
        """Prune queued architecture ``a`` (popped): by its refined bound if it has one, else by
        its DP bound."""
        self.pruned["refined_bound" if a in self.refined else "dp_bound"] += 1
        self.refined.discard(a)
        del self.dp_bounds_of[a]
        self.progress.advance()

    def refining(self) -> bool:
        """Whether stage 3 can prune: pruning is on, there is an incumbent, and the DP bounds
        something (not the throughput under ``dp_overlap``)."""
        ev = self.evaluator
        bounds_something = not (ev.params.dp_overlap and ev.objective(self.cands).throughput)
        return self.prune and self.best is not None and bounds_something

    def refine(self, archs: list[int]) -> None:
        """Stage 3 on ``archs`` (popped from the queue, :meth:`refining`): the DP bound again
        on :meth:`Evaluator.refined_lower_bounds`, each layer's own combinatorial bound or its
        known makespan, for the settings :meth:`exact_jobs` would schedule (the others keep
        their bound); each architecture is pruned when its refined score bound cannot beat the
        incumbent, else queued again by it.  The refined bounds cost milliseconds a layer, the
        schedules they may spare tenths of a second."""
        todo: dict[tuple[int, int], list[int]] = {}  # (model, setting) -> archs
        for a in archs:
            for m in range(self.n_models):
                for _, s in self.worth(self.dp_bounds_of[a], m)[0]:
                    todo.setdefault((m, s), []).append(a)
        for (m, s), owners in todo.items():
            k = self.usable[m].index(s)
            pairs = [(self.archs[a][0], self.cands.hbm[self.archs[a][1]]) for a in owners]
            setting = self.tasks[m].settings[s]
            lb = self.evaluator.refined_lower_bounds(self.cands, setting, [c for c, _ in pairs])
            refined = self.evaluator.dp_bounds(self.cands, m, self.tasks[m], s, pairs, lb=lb)
            for a, bound in zip(owners, refined):
                old = self.dp_bounds_of[a][m]
                old[k] = min(old[k], float(bound))
        for a in archs:
            self.refined.add(a)
            bound = float(np.mean([b.max() if len(b) else 0.0 for b in self.dp_bounds_of[a]]))
            if self.below_incumbent(bound):
                self.drop(a)
            else:
                heapq.heappush(self.queue, (-bound, self.rank[a], a))

    def worth(self, bounds: list[np.ndarray], m: int) -> tuple[list[tuple[float, int]], float]:
        """Model ``m``'s settings on an architecture whose DP bounds are ``bounds`` (per model,
        one per usable setting), split: ``(worth, skipped)``, ``worth`` the ``(bound, setting)``
        of those that fit and whose bound, with every other model at its best bound, can lift
        the architecture to the incumbent (all that fit, without pruning or an incumbent), and
        ``skipped`` the best bound of the other ones that fit (0.0 if none)."""
        need = -np.inf
        if self.prune and self.best is not None:
            best = [float(b.max()) if len(b) else 0.0 for b in bounds]
            need = (self.n_models * self.incumbent() - (sum(best) - best[m])) * (1 - TOL)
        worth: list[tuple[float, int]] = []
        skipped = 0.0
        for k, s in enumerate(self.usable[m]):
            bound = float(bounds[m][k])
            if bound <= 0:
                continue
            if bound >= need:
                worth.append((bound, s))
            else:
                skipped = max(skipped, bound)
        return worth, skipped

    def exact_jobs(
        self, batch: list[int]
    ) -> tuple[list[ExactJob], list[int], list[PendingJob], dict[int, list[float]]]:
        """The settings of ``batch`` worth scheduling exactly, in two rounds: ``(first, the
        architecture of each first job, the rest, per architecture and model the best DP bound
        of the settings skipped)``.  The first round is, per architecture and model, the setting
        of the highest DP bound; the rest waits for its exact value (:meth:`evaluate_exactly`).

        A setting is skipped when nothing fits (memory does not depend on the chip's speed) or
        when even its DP bound, with every other model at its best bound, cannot lift the
        architecture to the incumbent; :meth:`accept` checks afterwards that no skipped setting
        could have beaten the model's choice."""
        n_models = self.n_models
        first: list[ExactJob] = []
        owner: list[int] = []
        rest: list[PendingJob] = []
        skipped: dict[int, list[float]] = {}
        for a in batch:
            c, h = self.archs[a]
            bounds = self.dp_bounds_of.pop(a)
            self.refined.discard(a)
            skipped[a] = [0.0] * n_models
            for m in range(n_models):
                worth, skipped[a][m] = self.worth(bounds, m)
                if not worth:
                    continue
                # The likeliest best first (ties: the model's tie-break order).
                worth.sort(key=lambda x: (-x[0],) + _setting_order(self.tasks[m], x[1]))
                first.append((m, worth[0][1], c, self.cands.hbm[h]))
                owner.append(a)
                rest += [(a, m, s, bound) for bound, s in worth[1:]]
        return first, owner, rest, skipped

    def best_settings(self, priced: list[list[PricedSetting]]) -> list[PricedSetting]:
        """Per model, its best exactly priced setting (ties: :func:`_setting_order`), or
        ``(-1, 0.0, None)`` when none fits."""
        chosen: list[PricedSetting] = []
        for m in range(self.n_models):
            fits = [o for o in priced[m] if o[1] > 0]
            if fits:
                chosen.append(min(fits, key=lambda o: (-o[1],) + _setting_order(self.tasks[m], o[0])))
            else:
                chosen.append((-1, 0.0, None))
        return chosen

    def evaluate_exactly(self, batch: list[int]) -> None:
        """Stage 3 on ``batch``: schedule and place its settings exactly, score each architecture
        and keep it (as the incumbent when it beats it).  Two rounds: each architecture's
        best-bound setting per model, then only the settings whose DP bound can still reach
        (or tie) the best exact throughput the first round found for that model (a bound below
        it proves the setting loses; it counts as skipped, so :meth:`accept` keeps the score
        exact)."""
        if not batch:
            return
        first, owner, rest, skipped = self.exact_jobs(batch)
        priced: dict[int, list[list[PricedSetting]]] = {a: [[] for _ in range(self.n_models)] for a in batch}
        self.price(first, owner, priced)
        second: list[ExactJob] = []
        owner = []
        for a, m, s, bound in rest:
            found = max((o[1] for o in priced[a][m]), default=0.0)
            if not self.prune or bound >= found * (1 - TOL):
                c, h = self.archs[a]
                second.append((m, s, c, self.cands.hbm[h]))
                owner.append(a)
            else:
                skipped[a][m] = max(skipped[a][m], bound)
        self.price(second, owner, priced)
        for a in batch:
            c, h = self.archs[a]
            chosen = self.best_settings(priced[a])
            score = sum(x[1] for x in chosen) / self.n_models
            throughput = sum(self.evaluator.throughput(x[2]) for x in chosen if x[2] is not None) / self.n_models
            settings = [self.tasks[m].settings[s] if s >= 0 else None for m, (s, _, _) in enumerate(chosen)]
            power = self.evaluator.chip_power(self.cands, settings, c, [x[2] for x in chosen])
            evaluated = Evaluated(c, self.cands.hbm[h], score, float(self.area[c]), chosen, throughput, power)
            self.accept(evaluated, skipped[a])
            self.progress.advance()

    def price(self, jobs: list[ExactJob], owner: list[int], priced: dict[int, list[list[PricedSetting]]]) -> None:
        """Price ``jobs`` exactly (``owner``: each one's architecture) into ``priced``."""
        for (m, s, _, _), a, (thr, dp_result) in zip(jobs, owner, self.evaluator.exact(self.cands, self.tasks, jobs)):
            priced[a][m].append((s, thr, dp_result))

    def accept(self, evaluated: Evaluated, skipped: list[float]) -> None:
        """Keep an exactly evaluated architecture.  Its score is exact when no skipped setting
        could have beaten a model's choice; otherwise the architecture provably scores below the
        incumbent (see :meth:`exact_jobs`) and counts as pruned at the exact stage."""
        if all(skipped[m] <= evaluated.best[m][1] * (1 + TOL) for m in range(self.n_models)):
            self.evaluated.append(evaluated)
            if evaluated.score > 0 and (self.best is None or self.answer_key(evaluated) < self.answer_key(self.best)):
                self.best = evaluated
        else:
            self.pruned["exact"] += 1

    # -- the end ----------------------------------------------------------------------------------

    def count_unvisited_as_pruned(self) -> None:
        """Architectures never reached count as pruned by the bound that stopped them: the work
        bound for those never visited, the DP bound for those still queued."""
        remaining = len(self.order) - self.visited
        self.pruned["work_bound"] += remaining
        for _, _, a in self.queue:
            self.pruned["refined_bound" if a in self.refined else "dp_bound"] += 1
        self.progress.advance(remaining + len(self.queue))

    def statistics(self, wall_s: float) -> dict[str, Any]:
        """The search's counts (the JSON's ``search`` object starts with them)."""
        return {
            "candidates": len(self.archs) * self.n_settings,
            "architectures": len(self.archs),
            "settings": self.n_settings,
            "pruned": self.pruned,
            "evaluated": len(self.evaluated),
            "wall_s": wall_s,
        }
