"""Exact pricing of settings on candidate chips, for the search (:mod:`phaze.search.engine`).

A setting is priced on a chip in three steps: each priced group of ops is scheduled (SCIP,
through :class:`~passes.algorithms.schedule.ScheduleCache` and the search's backend, each
distinct problem once), the group makespans become a placement problem for the Rust DP
(:meth:`Pricing.problem`), and the DP's plan is scored by the search's objective (throughput,
or :class:`~phaze.search.objective.Objective`'s others; zero over the power cap).

It is apart from the bounds (:mod:`phaze.search.bounds`) because it is the one place an exact
number comes from: the bounds run the same DP assembly on lower-bound times, so that a bound
and the value it bounds differ only in the layer times, and read the makespans priced here
(:meth:`Pricing.known_makespans`) to tighten theirs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from passes.algorithms import _phaze_rs
from passes.algorithms import placement as pl
from passes.algorithms import schedule as sched
from passes.algorithms.energy import lengthened_step_s, power_headroom_w, power_limited_step_s
from passes.algorithms.latency import FixedParams, estimate_chip, estimate_space
from phaze.search.objective import Objective
from phaze.search.setting import Setting
from phaze_ir.errors import PhazeError

if TYPE_CHECKING:  # the engine imports this module; these only annotate
    from phaze.search.engine import Candidates, ModelTask, Params, SolverLimits

#: The evaluator's timers (seconds) and counts, in the JSON's order (``search.wall_s`` after the
#: phases, ``search.evaluator``).
TIMERS = ("estimate", "dp_bound", "schedule", "dp_exact")
COUNTS = ("dp_bound_solves", "schedules_solved", "schedules_cached", "dp_exact_solves", "over_power_cap")


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


class Pricing:
    """Prices settings on candidates exactly: schedules (through the cache and the backend), the
    DP problem of a setting (:meth:`problem`, which the bounds share), the DP, the objective.
    It keeps the timers and counts of the JSON's ``search.evaluator`` for the bounds too."""

    def __init__(self, params: Params, limits: SolverLimits, cache: sched.ScheduleCache, backend=None):
        self.params = params
        self.limits = limits
        self.cache = cache
        self.backend = backend
        self.timers = dict.fromkeys(TIMERS, 0.0)
        self.counts = dict.fromkeys(COUNTS, 0)
        #: (candidates, setting, config) -> the group makespans priced (:meth:`makespans`)
        self._exact_ms: dict[tuple[int, int, int], np.ndarray] = {}
        #: (candidates, setting, chip signature) -> the group makespans priced: chips whose
        #: every input to a setting's schedules is equal (:meth:`signatures`) share them
        self._ms_by_sig: dict[tuple[int, int, bytes], np.ndarray] = {}
        #: (candidates, placement, setting, makespans, HBM) -> the DP's result (:meth:`exact`):
        #: equal inputs, the same problem, so the same result
        self._dp_exact: dict[tuple, _phaze_rs.ResultDict] = {}
        #: setting -> the most ops of each unit kind in one of its priced groups
        self._unit_counts: dict[int, dict[str, int]] = {}
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

    def power_limited(self, cands: Candidates, setting: Setting, config: int, result: _phaze_rs.ResultDict):
        """``result`` with its plan's step lasting at least its energy over the chip's power
        limit (``power_limited_step_s``, as ``phaze-estimate-power`` lengthens a compiled plan's);
        unchanged on a chip without a limit or when the limit allows the step."""
        headroom = power_headroom_w(cands.template)
        plan = result.get("plan") if result.get("feasible") else None
        if headroom is None or not plan:
            return result
        step = float(plan["time_per_batch_s"])
        limited = power_limited_step_s(self.objective(cands).plan_power(setting, config, plan), step, headroom)
        if limited <= step:
            return result
        time = lengthened_step_s(step, limited - step)  # as a compiled plan's reader sums it
        plan = {**plan, "time_per_batch_s": time, "throughput_samples_per_s": self.params.global_batch / time}
        return {**result, "plan": plan}  # the DP's result, its plan's time longer

    def problem(self, cands: Candidates, setting: Setting, makespans: np.ndarray, hbm: int) -> _phaze_rs.ProblemDict:
        """The DP problem of ``setting`` with group makespans ``makespans`` and HBM ``hbm``: its
        :meth:`~phaze.search.setting.Setting.priced_step` assembled as ``phaze-place-devices``
        assembles the pipeline's (:func:`passes.algorithms.placement.problem`); a placement option
        the step cannot take (``--expert-parallel 2`` on a model without experts) is the
        one-line error it raises."""
        try:
            return pl.problem(
                setting.priced_step(makespans),
                self.params,
                hbm_bytes=hbm,
                levels=cands.template.network,
                memory_bound_Bps=FixedParams.of(cands.template, chip=True).hbm_Bps,
            )
        except pl.PlacementError as e:
            raise PhazeError(str(e)) from e

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

    # -- exact ------------------------------------------------------------------------------------

    def makespans(self, cands: Candidates, jobs: Sequence[tuple[Setting, int]]) -> list[np.ndarray]:
        """Exact group makespans of each ``(setting, config)``; the schedules the cache lacks are
        solved through the backend, each distinct canonical problem once, and a chip whose
        signature (:meth:`signatures`) was priced before, or earlier in ``jobs``, takes its
        makespans without its problems being built again."""
        t0 = time.perf_counter()
        limits = self.cache_limits()
        out: list[np.ndarray | None] = [None] * len(jobs)
        experts: dict[int, np.ndarray] = {}  # job -> its setting's expert_seconds on its chip
        wanted, pending, sigs, twins = self._group_problems(cands, jobs, limits, out, experts)
        self.counts["schedules_cached"] += len({p.key() for _, _, p in wanted}) - len(pending)
        if pending:
            self._solve_and_store(list(pending.values()), limits)
        makespans: dict[int, np.ndarray] = {}
        for j, g, canon in wanted:
            arr = makespans.get(j)
            if arr is None:  # the groups' makespans, then the expert GEMMs' changes at each EP degree
                arr = makespans[j] = np.concatenate([np.zeros(len(jobs[j][0].groups)), experts[j]])
            schedule = self.cache.lookup(canon, limits)
            assert schedule is not None  # cached or solved and stored above
            arr[g] = schedule.makespan
        for j, first in twins.items():
            makespans[j] = makespans[first]
        for j, arr in makespans.items():
            setting, config = jobs[j]
            self._exact_ms[(id(cands), id(setting), config)] = arr
            if j in sigs:
                self._ms_by_sig[(id(cands), id(setting), sigs[j])] = arr
            out[j] = arr
        self.timers["schedule"] += time.perf_counter() - t0
        done = [arr for arr in out if arr is not None]
        assert len(done) == len(jobs)  # every job was cached or has just been solved
        return done

    def cache_limits(self):
        """The cache's key for this search's solver limits (a schedule is reused only under the
        limits that made it)."""
        lim = self.limits
        return self.cache.limits(lim.time_limit, lim.gap_limit, lim.node_limit, lim.max_binaries)

    def known_makespans(
        self, cands: Candidates, setting: Setting, config: int, signature: bytes | None = None
    ) -> np.ndarray | None:
        """The group makespans of ``setting`` on chip ``config`` if :meth:`makespans` has priced
        them, on it or on a chip of the same ``signature`` (:meth:`signatures`; a refined bound
        is then the makespans themselves), else None."""
        known = self._exact_ms.get((id(cands), id(setting), config))
        if known is None and signature is not None:
            known = self._ms_by_sig.get((id(cands), id(setting), signature))
        return known

    def signatures(
        self, cands: Candidates, setting: Setting, one: np.ndarray, split: np.ndarray, configs
    ) -> list[bytes]:
        """Per column of the latencies ``one``/``split`` (``[rows, len(configs)]``, chips
        ``configs``), the chip's *signature* for ``setting``: its latencies and its core counts,
        each lowered to the most ops of that kind in one of the setting's priced groups (as
        :meth:`~passes.algorithms.schedule.Problem.canonical` lowers them, group by group).
        Everything a group's problem is built from but the setting and the template, which a
        search shares: chips of equal signatures have the same canonical problems, so the same
        makespans, DP problems and exact values (a tiny model's step is fixed costs that hardly
        depend on the chip: the paper space's 29,360 chips have about 5,000 signatures each).
        Not for a calibrated chip (priced alone)."""
        counts = self._unit_counts.get(id(setting))
        if counts is None:
            counts = {}
            for g in setting.priced_groups():
                per: dict[str, int] = {}
                for u in setting.group_units(g):
                    per[u] = per.get(u, 0) + 1
                for u, n in per.items():
                    counts[u] = max(counts.get(u, 0), n)
            self._unit_counts[id(setting)] = counts
        cores = np.stack(
            [
                _lowered(cands.configs["num_tc"][list(configs)], counts.get("tensor", 0)),
                _lowered(cands.configs["num_vc"][list(configs)], counts.get("vector", 0)),
            ],
            axis=1,
        )
        return [one[:, col].tobytes() + split[:, col].tobytes() + cores[col].tobytes() for col in range(len(configs))]

    def _group_problems(
        self,
        cands: Candidates,
        jobs: Sequence[tuple[Setting, int]],
        limits,
        out: list[np.ndarray | None],
        experts: dict[int, np.ndarray],
    ) -> tuple[list[tuple[int, int, sched.Problem]], dict[str, sched.Problem], dict[int, bytes], dict[int, int]]:
        """The canonical schedule problem of every priced group of each job whose makespans are
        not memoized (those that are go straight into ``out``: by config, or by the chip's
        signature, :meth:`signatures`): ``(wanted, pending, sigs, twins)``, where ``wanted``
        lists ``(job, group, problem)``, ``pending`` the distinct problems the cache lacks,
        ``sigs`` the signature of each job of ``wanted`` and ``twins`` maps a job to the earlier
        job of the same setting and signature whose problems stand for its own; ``experts`` gets
        each job of ``wanted`` its setting's :meth:`~phaze.search.setting.Setting.expert_seconds`
        on its chip, which follow the groups' makespans in its array.  Latencies are
        estimated once per setting for all its configs."""
        wanted: list[tuple[int, int, sched.Problem]] = []
        pending: dict[str, sched.Problem] = {}
        sigs: dict[int, bytes] = {}
        twins: dict[int, int] = {}
        by_setting: dict[int, list[int]] = {}
        for j, (setting, _config) in enumerate(jobs):
            by_setting.setdefault(id(setting), []).append(j)
        calibration = getattr(cands.template, "calibration", None)
        network = cands.template.network  # a context-parallel setting's rings run on it
        units = getattr(calibration, "wave_units", None)
        sms = int(units) if units else None  # a TP-overlapped setting's collectives hold some (sm_count)
        for idxs in by_setting.values():
            setting = jobs[idxs[0]][0]
            configs = [jobs[j][1] for j in idxs]
            if calibration is None:
                lat = estimate_space(setting.table, cands.configs[configs], cands.template, cache=None)
                one, split = lat.one, lat.split
                signature = self.signatures(cands, setting, one, split, configs)
            else:
                one, split = _one_chip_latencies(setting, cands, len(configs))
                signature = []
            needed = setting.priced_groups()
            first_of: dict[bytes, int] = {}
            for col, j in enumerate(idxs):
                key = (id(cands), id(setting), configs[col])
                if key in self._exact_ms:
                    out[j] = self._exact_ms[key]
                    continue
                if signature:
                    sig = signature[col]
                    known = self._ms_by_sig.get((id(cands), id(setting), sig))
                    if known is not None:
                        self._exact_ms[key] = out[j] = known
                        continue
                    if sig in first_of:
                        twins[j] = first_of[sig]
                        continue
                    first_of[sig] = j
                    sigs[j] = sig
                cores = chip_cores(cands, configs[col])
                experts[j] = setting.expert_seconds(split[:, col])
                if calibration is not None and calibration.serial:
                    # One op at a time, issued by the host (phaze-schedule-ops does the same):
                    # no solver, no cache, the problem in program order as the IR has it.
                    arr = np.concatenate([np.zeros(len(setting.groups)), experts[j]])
                    for g in needed:
                        problem = setting.group_problem(g, one[:, col], split[:, col], cores, network, sms)
                        arr[g] = sched.serial_schedule(problem, calibration.host_dispatch_s).makespan
                    self._exact_ms[key] = out[j] = arr
                    continue
                for g in needed:
                    canon = setting.group_problem(g, one[:, col], split[:, col], cores, network, sms).canonical()
                    wanted.append((j, g, canon))
                    if self.cache.lookup(canon, limits) is None:
                        pending.setdefault(canon.key(), canon)
        return wanted, pending, sigs, twins

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
        setting, config, hbm)``.  The DP runs once per distinct problem (the same setting,
        placement, makespans and HBM: chips of one signature, :meth:`signatures`); the power
        limit, the objective and the power cap, which read the chip itself, are applied per job."""
        makespans = self.makespans(cands, [(tasks[m].settings[s], c) for m, s, c, _ in jobs])
        t0 = time.perf_counter()
        by_task: dict[int, list[int]] = {}
        for j, (m, _, _, _) in enumerate(jobs):
            by_task.setdefault(m, []).append(j)
        out: dict[int, tuple[float, _phaze_rs.ResultDict]] = {}
        obj = self.objective(cands)
        cap = self.params.power_cap_w
        for m, idxs in by_task.items():
            fixed = tasks[m].fixed
            keys = [
                (id(cands), fixed, id(tasks[m].settings[jobs[j][1]]), makespans[j].tobytes(), jobs[j][3]) for j in idxs
            ]
            todo: dict[tuple, _phaze_rs.ProblemDict] = {}
            for j, k in zip(idxs, keys):
                if k not in self._dp_exact and k not in todo:
                    todo[k] = self.problem(cands, tasks[m].settings[jobs[j][1]], makespans[j], jobs[j][3])
            if todo:
                for k, r in zip(todo, self.place(list(todo.values()), fixed)):
                    self._dp_exact[k] = r
                self.counts["dp_exact_solves"] += len(todo)
            for j, k in zip(idxs, keys):
                _, s, c, h = jobs[j]
                setting = tasks[m].settings[s]
                dp_result = self.power_limited(cands, setting, c, self._dp_exact[k])
                score = obj.score(setting, c, h, dp_result)
                if cap is not None and score > 0 and obj.plan_power(setting, c, dp_result["plan"]).chip_power_w > cap:
                    score = 0.0  # over the power cap: as if it did not fit
                    self.counts["over_power_cap"] += 1
                out[j] = (score, dp_result)
        self.timers["dp_exact"] += time.perf_counter() - t0
        return [out[j] for j in range(len(jobs))]


def _lowered(cores: np.ndarray, most: int) -> np.ndarray:
    """Core counts ``cores`` as the canonical problems see them when a group has at most
    ``most`` ops of their kind: a count of 2 or more lowered to ``max(2, most)``."""
    cores = np.asarray(cores, dtype=np.int64)
    return np.where(cores < 2, cores, np.maximum(2, np.minimum(cores, most)))


def chip_cores(cands: Candidates, config: int) -> dict[str, int]:
    """The core count of each unit kind of chip ``config`` (one network link)."""
    configs = cands.configs
    return {"tensor": int(configs["num_tc"][config]), "vector": int(configs["num_vc"][config]), "network": 1}


def _one_chip_latencies(setting: Setting, cands: Candidates, columns: int) -> tuple[np.ndarray, np.ndarray]:
    """``(one, split)``, ``[rows × columns]`` seconds of the setting's op table on a calibrated
    chip (a GPU: kernel efficiencies and launch costs, which a space's chips do not have),
    priced as ``phaze-estimate-latency`` prices them (``estimate_chip``, one call for all the
    ops); the chip is ``cands``' only one, so every column is the same."""
    if len(cands.configs) != 1:
        raise ValueError(f"{cands.name}: a calibrated chip is priced alone, not as a space")
    lat = estimate_chip(setting.table, cands.template)
    return np.repeat(lat.one, columns, axis=1), np.repeat(lat.split, columns, axis=1)
