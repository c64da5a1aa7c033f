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
   ``t`` of the ``N`` devices), with ``*_lb`` :func:`~phaze.search.schedule_bounds.group_lower_bound`;
   and per block of :data:`BOUND_BATCH` architectures, the *floor bound*: one DP per setting on
   the block's least bound times at its largest HBM, which counts the step's communication
   (:meth:`_BranchAndBound.floor_next_block`);
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

**Identical inputs, a budget.**  Chips whose every input to a setting's schedules is equal
(their signature, :meth:`~phaze.search.pricing.Pricing.signatures`) share their makespans,
refined bounds and exact DP results.  A search over its :class:`SearchBudget` (exact
evaluations, also counted ahead: :meth:`_BranchAndBound.check_ahead`; DP bound solves counted
by their layers) refuses in one line (:class:`SearchTooLarge`), saying the best found so far.

**Where.**  The bounds are :mod:`phaze.search.bounds`'s, the exact prices (schedules, the DP,
the objective) :mod:`phaze.search.pricing`'s; :class:`Evaluator` joins them for the search and
the baselines.  The search itself is :class:`_BranchAndBound` (the stages), with
:class:`_Frontier` (the architectures not decided yet, in the order it takes them) and
:class:`_Answer` (the incumbent and the rules of the answer).

**Determinism.**  Batches have fixed sizes and a fixed order, solves use a node limit rather
than the clock (see :class:`SolverLimits`), and backends only change where a schedule is
computed, never which: ``-j 1``, ``-j N`` and Ray give the same bytes.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import numpy as np

from passes.algorithms import _phaze_rs
from passes.algorithms import schedule as sched
from passes.algorithms.placement_options import PlacementOptions
from phaze.search.bounds import Bounds
from phaze.search.pricing import COUNTS as COUNTS
from phaze.search.pricing import TIMERS as TIMERS
from phaze.search.pricing import Pricing
from phaze.search.setting import Setting
from phaze_ir.errors import PhazeError

#: Relative tolerance when comparing a bound with the incumbent (bounds and exact values are
#: summed in different orders; a bound may exceed its exact value by rounding only).
TOL = 1e-9
#: Architectures per DP-bound batch and per exact batch (fixed: results and statistics do not
#: depend on the number of workers).
BOUND_BATCH = 256
EXACT_BATCH = 8


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
        """The limits of the driver's :class:`~phaze.options.Options` (0: no limit)."""
        return cls(
            time_limit=opts.schedule_time_limit,
            gap_limit=opts.schedule_gap,
            node_limit=opts.schedule_nodes or None,
            max_binaries=opts.schedule_max_binaries or None,
        )


@dataclass(frozen=True)
class SearchBudget:
    """The most work one search does before it refuses (:class:`SearchTooLarge`), in counts,
    never the clock, so that the same question is answered or refused alike on any machine.
    A model whose step is fixed costs (a tiny one) scores within a few percent on every chip
    of a space, closer than its bounds can tell apart, and would be evaluated exactly on
    thousands of chips; the published models need 8 to 71.  0: no limit."""

    #: Architectures evaluated exactly (stage 4), also counted ahead
    #: (:meth:`_BranchAndBound.check_ahead`): the published models need 8 to 71 and count at
    #: most 340 ahead (OPT-350m), a tiny Llama (hidden 64, 8 layers) 6,579 on the paper space
    #: and 1,129 ahead after two exact batches (docs/benchmarks.md).
    exact: int = 1024
    #: DP solves on bound times (stages 2 and 3, and a block's floor and ceiling), each counted
    #: by its layers (a DP's cost grows with them: about 0.4 ms at 10 layers, 7 ms at 129 on
    #: the 2-core development machine): GPT-2 XL's search 10,127 × 50 (506,350) before the
    #: floor bounds, 1,453 × 50 since; the tiny Llama's 65,040 × 10 at 8 layers and 30,228 ×
    #: 129 (3.9 million) at 127 before them.
    dp_bound_layers: int = 2_000_000

    def check(
        self,
        what: str,
        used: int,
        label: str,
        archs: int,
        so_far: Callable[[], str] = lambda: "",
        ahead: int | None = None,
    ) -> None:
        """Refuse in one line when ``used`` of the budget ``what`` (a field) is over it,
        saying what the search knows so far (``so_far()``: the best found and how far the
        bounds left lie above it, or '').  ``ahead``: counted ahead, the exact evaluations
        made, ``used`` adding the architectures left whose DP bounds reach the best score found
        (:meth:`_BranchAndBound.check_ahead`)."""
        cap = getattr(self, what)
        if cap and used > cap:
            work = {"exact": "exact evaluations", "dp_bound_layers": "DP bound solves×layers"}[what]
            flag = {"exact": "--max-exact", "dp_bound_layers": "--max-dp-bound"}[what]
            where = "the architecture search" + ("" if label == "search" else f" ({label})")
            known = so_far()
            why = (
                ""
                if ahead is None
                else f" ahead, {ahead:,} made and {used - ahead:,} due (architectures left whose DP bounds reach the "
                "best score found),"
            )
            raise SearchTooLarge(
                f"{where}: more than {cap:,} {work} (its budget){why} over {archs:,} architectures, whose bounds "
                f"cannot tell them apart (a step this small costs about the same on every chip){known}; "
                f"give --hw CHIP to compile for one chip, a smaller --space, or a larger {flag}"
            )


class SearchTooLarge(PhazeError):
    """A search over its :class:`SearchBudget`: refused in one line, before minutes are spent."""


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
        """Every candidate of an :class:`~phaze.search.arch_space.ArchSpace`."""
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


@dataclass(frozen=True)
class Params(PlacementOptions):
    """The cluster, the training step and the placement options
    (:class:`~passes.algorithms.placement_options.PlacementOptions`: ``placement`` is the run's;
    the settings hold an MoE layer's expert numbers, which ``phazec --hw``'s sweep places with
    its ``expert_parallel``), and what the search maximizes."""

    #: What the search maximizes (:data:`phaze.search.objective.OBJECTIVES`).
    objective: str = "throughput"
    #: None, or the most a chip may draw (W): a setting whose plan's chip power is above it
    #: scores 0 (the plan the DP finds, the fastest; a slower one under the cap is not sought).
    power_cap_w: float | None = None

    @classmethod
    def of_options(cls, opts: Any, objective: str | None = None) -> Params:
        """From the driver's :class:`~phaze.options.Options` (``objective``: instead of theirs)."""
        return cls(
            **{f.name: getattr(opts, f.name) for f in fields(PlacementOptions)},
            objective=objective or opts.objective,
            power_cap_w=opts.power_cap_w,
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


class Evaluator(Pricing):
    """Prices settings on candidates (:class:`~phaze.search.pricing.Pricing`: exact schedules,
    the DP, the objective) and bounds them (:class:`~phaze.search.bounds.Bounds`, its
    :attr:`bounds`).  One object for the search and the baselines, so that every number comes
    from the same place, each schedule is solved once and each bound computed once; the bounds
    the search uses are named here so that a caller (or a test replacing one) needs no other."""

    def __init__(self, params: Params, limits: SolverLimits, cache: sched.ScheduleCache, backend=None):
        super().__init__(params, limits, cache, backend)
        self.bounds = Bounds(self)

    @property
    def _lb(self) -> dict[tuple[int, int], np.ndarray]:
        """The vectorized bounds computed so far (:meth:`Bounds.lower_bounds`)."""
        return self.bounds._lb

    def lower_bounds(self, cands: Candidates, setting: Setting) -> np.ndarray:
        """:meth:`Bounds.lower_bounds`."""
        return self.bounds.lower_bounds(cands, setting)

    def prepare_lower_bounds(self, cands: Candidates, settings: Sequence[Setting]) -> None:
        """:meth:`Bounds.prepare_lower_bounds`."""
        self.bounds.prepare_lower_bounds(cands, settings)

    def work_bound(self, cands: Candidates, setting: Setting, fixed: tuple[int, int, int] | None = None) -> np.ndarray:
        """:meth:`Bounds.work_bound`."""
        return self.bounds.work_bound(cands, setting, fixed)

    def dp_bounds(
        self,
        cands: Candidates,
        task_id: int,
        task: ModelTask,
        setting_idx: int,
        pairs: Sequence[tuple[int, int]],
        lb: np.ndarray | None = None,
    ) -> np.ndarray:
        """:meth:`Bounds.dp_bounds`."""
        return self.bounds.dp_bounds(cands, task_id, task, setting_idx, pairs, lb)

    def refined_lower_bounds(self, cands: Candidates, setting: Setting, configs: Sequence[int]) -> np.ndarray:
        """:meth:`Bounds.refined_lower_bounds`."""
        return self.bounds.refined_lower_bounds(cands, setting, configs)

    def fits_somewhere(self, cands: Candidates, task: ModelTask) -> list[int]:
        """:meth:`Bounds.fits_somewhere`."""
        return self.bounds.fits_somewhere(cands, task)

    def why_not(self, cands: Candidates, task: ModelTask) -> str:
        """:meth:`Bounds.why_not`."""
        return self.bounds.why_not(cands, task)


def _setting_order(task: ModelTask, setting_idx: int) -> tuple[int, int, int, bool]:
    """A model's tie-break between settings of equal throughput: the smaller micro-batch, then
    the smaller context-parallel degree, then the smaller TP width, then without sequence
    parallelism (as ``phazec --hw`` breaks them: ``driver.compile_model``'s order)."""
    setting = task.settings[setting_idx]
    return (setting.micro_batch, setting.cp, setting.tp, setting.sequence_parallel)


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
    budget: SearchBudget | None = None,
) -> Result:
    """The best architecture of ``cands`` for ``tasks`` (see the module docstring).
    ``prune=False`` evaluates every architecture exactly (plain enumeration, for tests; no
    ``budget`` then).  Over ``budget`` (None: no limit), :class:`SearchTooLarge`."""
    b = budget if budget is not None and prune else SearchBudget(exact=0, dp_bound_layers=0)
    return _BranchAndBound(cands, tasks, evaluator, prune, progress or NoProgress(), label, b).run()


class _BranchAndBound:
    """One search: its stages, one method each, over the state they share: the architectures
    not decided yet (:class:`_Frontier`) and the answer so far (:class:`_Answer`).

    An *architecture* is an index into :attr:`archs`, a ``(config index, HBM index)`` pair; a
    *score bound* is an upper bound on its score (the mean over models of each model's best
    setting)."""

    #: The architectures not decided yet (set by :meth:`run`: their order is the work bound's).
    frontier: _Frontier

    def __init__(
        self,
        cands: Candidates,
        tasks: Sequence[ModelTask],
        evaluator: Evaluator,
        prune: bool,
        progress: Progress,
        label: str,
        budget: SearchBudget,
    ):
        self.cands = cands
        self.budget = budget
        #: DP solves on bound times so far, each counted by its layers (:attr:`budget`)
        self.dp_bound_layers = 0
        #: the best score bound of the architectures taken from the frontier and not yet decided
        #: (the block or batch at hand: what :meth:`so_far` says of the bounds left)
        self.in_hand = -np.inf
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
        self.answer = _Answer(cands, tasks, evaluator, prune)
        #: whether an architecture has had its bounds refined (:meth:`refine`, which needs an
        #: incumbent): the exact budget is projected from then on (:meth:`check_ahead`)
        self.refined_any = False
        #: block start -> :meth:`block_ceiling`
        self.ceilings: dict[int, float] = {}
        #: whether blocks get a floor bound (:meth:`floor_next_block`): pruning, and the DP
        #: bounds the objective (throughput without ``dp_overlap``)
        self.floors = prune and evaluator.objective(cands).throughput and not evaluator.params.dp_overlap
        #: [model][setting] -> [configs]: each setting's work bound (set by run()).
        self.setting_work_bound: list[dict[int, np.ndarray]] = []

    def run(self) -> Result:
        """Stage 1 on every candidate, then stages 2 to 4 interleaved, best bound first, until
        no bound left can beat the incumbent."""
        t_start = time.perf_counter()
        self.frontier = _Frontier(self.archs, self.work_bound_of_configs(), self.answer.area_key)
        self.progress.start(f"{self.label}: architectures", len(self.archs))
        while (stage := self.next_stage()) is not None:
            if stage == "floor":
                self.floor_next_block()
            elif stage == "dp_bound":
                if self.floors and not self.answer.pruning():
                    self.queue_by_floor()
                else:
                    self.check_ahead()
                    self.dp_bound_next_block()
            else:
                self.evaluate_exactly(self.pop_exact_batch())
                self.check_ahead()
        self.count_unvisited_as_pruned()
        self.progress.stop()
        return self.answer.result(len(self.archs), self.n_settings, time.perf_counter() - t_start)

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

    # -- choosing the next stage ------------------------------------------------------------------

    def next_stage(self) -> str | None:
        """``"floor"`` when the next block of unvisited architectures comes first and its floor
        bound (:meth:`floor_next_block`) is not known yet, ``"dp_bound"`` when it comes first
        and its floor is known (the best unvisited bound is the smaller of the next work bound
        and that floor), ``"exact"`` when a queued architecture comes first, None when neither
        can beat the incumbent (or nothing is left): the search is over.  A block whose floor
        is below the incumbent is pruned whole on the way."""
        while True:
            next_unvisited, next_queued = self.frontier.best_bounds()
            best_left = max(next_unvisited, next_queued)
            if best_left == -np.inf or self.answer.below_incumbent(best_left):
                return None
            if next_unvisited >= next_queued and self.frontier.unvisited():
                if self.floors and self.frontier.next_floor() is None:
                    return "floor"
                if self.answer.below_incumbent(next_unvisited):  # its floor: the whole block
                    block = self.frontier.visit(BOUND_BATCH)
                    self.answer.pruned["dp_bound"] += len(block)
                    self.progress.advance(len(block))
                    continue
                return "dp_bound"
            return "exact"

    # -- stage 2a: the floor of a block -----------------------------------------------------------

    def floor_next_block(self) -> None:
        """The *floor bound* of the next :data:`BOUND_BATCH` architectures of the visit order:
        one score bound for all of them, from one DP per setting on the block's least
        lower-bound time of each group (the elementwise minimum over its chips) at its largest
        HBM.  The DP's time is non-decreasing in every layer time and its feasible set grows
        with the HBM, so that DP's throughput is at least each chip's DP bound (stage 2); taken
        with the block's best work bound, per setting.  A step of fixed costs (the DP's
        communication, which no chip changes) is most of a small model's time, which the work
        bound does not count: the floor then lies near the DP bounds and prunes or postpones a
        block for one DP per setting instead of one per chip (docs/design.md §7.2)."""
        frontier = self.frontier
        block = frontier.order[frontier.visited : frontier.visited + BOUND_BATCH]
        configs = sorted({self.archs[a][0] for a in block})
        hbm = max(self.cands.hbm[self.archs[a][1]] for a in block)
        need = self.needed_bounds(configs).max(axis=1)  # the most any config of the block needs
        per_model = np.zeros(self.n_models)
        per_setting: list[np.ndarray] = []  # [model][usable setting]: its DP floor (inf: not run)
        for m, task in enumerate(self.tasks):
            floors = np.full(len(self.usable[m]), np.inf)
            for k, s in enumerate(self.usable[m]):
                bound = float(self.setting_work_bound[m][s][configs].max())
                if bound >= need[m] and bound > 0:
                    least = self.evaluator.lower_bounds(self.cands, task.settings[s])[:, configs].min(axis=1)
                    floors[k] = float(self.counted_dp_bounds(m, s, [(configs[0], hbm)], lb=least[:, None])[0])
                per_model[m] = max(per_model[m], min(bound, floors[k]))
            per_setting.append(floors)
        frontier.set_next_floor(float(per_model.mean()), per_setting)

    def block_ceiling(self, start: int) -> float:
        """A lower bound on the DP bound (stage 2) of every architecture of the block starting at
        ``start`` in the visit order: per setting, the DP on the block's largest lower-bound
        time of each group at its smallest HBM (the DP's time is non-decreasing in the layer
        times and its feasible set shrinks with the HBM), each model at its best setting.
        Memoized by block."""
        ceiling = self.ceilings.get(start)
        if ceiling is None:
            block = self.frontier.order[start : start + BOUND_BATCH]
            configs = sorted({self.archs[a][0] for a in block})
            hbm = min(self.cands.hbm[self.archs[a][1]] for a in block)
            per_model = []
            for m, task in enumerate(self.tasks):
                best = 0.0
                for s in self.usable[m]:
                    most = self.evaluator.lower_bounds(self.cands, task.settings[s])[:, configs].max(axis=1)
                    best = max(best, float(self.counted_dp_bounds(m, s, [(configs[0], hbm)], lb=most[:, None])[0]))
                per_model.append(best)
            ceiling = self.ceilings[start] = float(np.mean(per_model))
        return ceiling

    def check_ahead(self) -> None:
        """The exact budget, ahead of the evaluations: refuse (:class:`SearchTooLarge`) when the
        architectures evaluated exactly, with those left whose DP bounds reach the incumbent,
        are more than ``--max-exact``.  Those left are counted without being bounded one by
        one: the queued ones by their bounds (a block queued by its floor, by its ceiling),
        then the blocks not visited yet, whole, while a block's ceiling
        (:meth:`block_ceiling`, a lower bound on each one's DP bound) reaches the incumbent.
        Each of them is evaluated exactly unless its refined bound or a chip found later
        scores below it: a projection, counted from once the exact stage takes architectures by
        refined bounds (:meth:`refine`; the first batch, taken by floor bounds alone, makes an
        incumbent that later ones may overtake by percents).  A model whose step is fixed
        costs scores within a percent on thousands of chips, below what the bounds separate,
        and is refused here after two exact batches instead of after a thousand evaluations;
        the published models' searches count at most tens (docs/design.md §7.2)."""
        cap = self.budget.exact
        if not cap or not self.floors or not self.refined_any:
            return
        target = self.answer.incumbent() * (1 - TOL)
        done = len(self.answer.evaluated) + self.answer.pruned["exact"]
        frontier = self.frontier
        left = 0
        for neg_bound, _, a in frontier.queue:
            start = frontier.floor_queued.get(a)
            left += (-neg_bound if start is None else self.block_ceiling(start)) >= target
        start = frontier.visited
        while done + left <= cap and start < len(frontier.order) and self.block_ceiling(start) >= target:
            left += len(frontier.order[start : start + BOUND_BATCH])
            start += BOUND_BATCH
        self.budget.check("exact", done + left, self.label, len(self.archs), self.so_far, ahead=done)

    def queue_by_floor(self) -> None:
        """Before any incumbent: queue the next block of the visit order by its floor bounds
        (:meth:`floor_next_block`), each architecture's setting bounded by the smaller of its
        own work bound and the block's DP floor, with no DP of its own: no bound can prune
        before an incumbent, and the first exact batch makes one (a deep model's DP costs
        milliseconds a chip; the exact stage refines what it takes, :meth:`refine`)."""
        frontier = self.frontier
        floors = frontier.next_setting_floors()
        start = frontier.visited
        block = frontier.visit(BOUND_BATCH)
        self.in_hand = float(frontier.work_bound[self.archs[block[0]][0]]) if block else -np.inf
        for a in block:
            c = self.archs[a][0]
            bounds = [
                np.minimum(np.asarray([self.setting_work_bound[m][s][c] for s in self.usable[m]]), floors[m])
                for m in range(self.n_models)
            ]
            score = float(np.mean([b.max() if len(b) else 0.0 for b in bounds]))
            frontier.push(a, score, bounds)
            frontier.floor_queued[a] = start

    # -- stage 2: the DP bound --------------------------------------------------------------------

    def dp_bound_next_block(self) -> None:
        """Stage 2 on the next :data:`BOUND_BATCH` architectures of the visit order: the DP on
        lower-bound times for each setting; an architecture whose score bound cannot beat the
        incumbent is pruned, the others are queued for stage 3 by that bound."""
        block = self.frontier.visit(BOUND_BATCH)
        # in hand until queued: the best work bound among them (the first's) bounds them
        self.in_hand = float(self.frontier.work_bound[self.archs[block[0]][0]]) if block else -np.inf
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
            if self.answer.below_incumbent(score_bound[i]):
                self.answer.pruned["dp_bound"] += 1
                self.progress.advance()
                continue
            self.frontier.push(a, score_bound[i], [per_setting[m][i] for m in range(self.n_models)])

    def needed_bounds(self, configs: list[int]) -> np.ndarray:
        """``[models, configs]``: the least score bound each model's setting must reach on each
        config to lift it to the incumbent, every other model at its best work bound there
        (``-inf``, nothing needed, without pruning, an incumbent or the throughput objective)."""
        need = np.full((self.n_models, len(configs)), -np.inf)
        if not (self.answer.pruning() and self.evaluator.objective(self.cands).throughput):
            return need
        best_work = np.zeros((self.n_models, len(configs)))
        for k in range(self.n_models):
            for bound in self.setting_work_bound[k].values():
                best_work[k] = np.maximum(best_work[k], bound[configs])
        others = best_work.sum(axis=0) - best_work
        return (self.n_models * self.answer.incumbent() - others) * (1 - TOL)

    def setting_dp_bounds(self, m: int, s: int, pairs: list[tuple[int, int]], need: np.ndarray) -> np.ndarray:
        """Model ``m``'s setting ``s``'s score bounds on ``pairs``: the DP bound, except where
        the setting's work bound is below ``need`` (:meth:`needed_bounds`): it cannot lift the
        architecture to the incumbent, and the work bound (itself an upper bound) stands in, the
        DP not run.  Such a setting is skipped by the exact stage and kept in its check
        (:meth:`exact_jobs`, :meth:`_Answer.accept`) all the same."""
        out = np.asarray([self.setting_work_bound[m][s][c] for c, _ in pairs], dtype=np.float64)
        idx = np.flatnonzero(out >= need)
        if len(idx):
            out[idx] = self.counted_dp_bounds(m, s, [pairs[i] for i in idx])
        return out

    def counted_dp_bounds(
        self, m: int, s: int, pairs: list[tuple[int, int]], lb: np.ndarray | None = None
    ) -> np.ndarray:
        """:meth:`Evaluator.dp_bounds`, its solves counted against the budget (by their layers)."""
        counts = self.evaluator.counts
        before = counts["dp_bound_solves"]
        out = self.evaluator.dp_bounds(self.cands, m, self.tasks[m], s, pairs, lb=lb)
        self.dp_bound_layers += (counts["dp_bound_solves"] - before) * len(self.tasks[m].settings[s].layers)
        self.budget.check("dp_bound_layers", self.dp_bound_layers, self.label, len(self.archs), self.so_far)
        return out

    # -- stages 3 and 4: the refined bound, exact ------------------------------------------------

    def pop_exact_batch(self) -> list[int]:
        """Up to :data:`EXACT_BATCH` queued architectures, best bound first, each with its
        bounds refined (:meth:`refine`, which queues it again by its refined bound); those that
        the incumbent has overtaken are pruned on the way."""
        frontier = self.frontier
        batch: list[int] = []
        self.in_hand = -np.inf
        while frontier.queue and len(batch) < EXACT_BATCH:
            fresh: list[int] = []
            while frontier.queue and len(batch) + len(fresh) < EXACT_BATCH:
                bound, a = frontier.pop()
                self.in_hand = max(self.in_hand, bound)
                if self.answer.below_incumbent(bound):
                    self.drop(a)
                elif a in frontier.refined or not self.refining():
                    batch.append(a)
                else:
                    fresh.append(a)
            self.refine(fresh)
        return batch

    def drop(self, a: int) -> None:
        """Prune queued architecture ``a`` (popped): by its refined bound if it has one, else by
        its DP bound."""
        self.answer.pruned[self.frontier.pruned_by(a)] += 1
        self.frontier.release(a)
        self.progress.advance()

    def refining(self) -> bool:
        """Whether stage 3 can prune: pruning is on, there is an incumbent, and the DP bounds
        something (not the throughput under ``dp_overlap``)."""
        ev = self.evaluator
        bounds_something = not (ev.params.dp_overlap and ev.objective(self.cands).throughput)
        return self.answer.pruning() and bounds_something

    def refine(self, archs: list[int]) -> None:
        """Stage 3 on ``archs`` (popped from the queue, :meth:`refining`): the DP bound again
        on :meth:`Evaluator.refined_lower_bounds`, each layer's own combinatorial bound or its
        known makespan, for the settings :meth:`exact_jobs` would schedule (the others keep
        their bound); each architecture is pruned when its refined score bound cannot beat the
        incumbent, else queued again by it.  The refined bounds cost milliseconds a layer, the
        schedules they may spare tenths of a second."""
        dp_bounds_of = self.frontier.dp_bounds_of
        todo: dict[tuple[int, int], list[int]] = {}  # (model, setting) -> archs
        for a in archs:
            for m in range(self.n_models):
                for _, s in self.answer.worth(dp_bounds_of[a], m, self.usable[m])[0]:
                    todo.setdefault((m, s), []).append(a)
        for (m, s), owners in todo.items():
            k = self.usable[m].index(s)
            pairs = [(self.archs[a][0], self.cands.hbm[self.archs[a][1]]) for a in owners]
            setting = self.tasks[m].settings[s]
            lb = self.evaluator.refined_lower_bounds(self.cands, setting, [c for c, _ in pairs])
            refined = self.counted_dp_bounds(m, s, pairs, lb=lb)
            for a, bound in zip(owners, refined):
                old = dp_bounds_of[a][m]
                old[k] = min(old[k], float(bound))
        self.refined_any = self.refined_any or bool(archs)
        for a in archs:
            self.frontier.refined.add(a)
            self.frontier.floor_queued.pop(a, None)
            bound = float(np.mean([b.max() if len(b) else 0.0 for b in dp_bounds_of[a]]))
            if self.answer.below_incumbent(bound):
                self.drop(a)
            else:
                self.frontier.push(a, bound)

    def exact_jobs(
        self, batch: list[int]
    ) -> tuple[list[ExactJob], list[int], list[PendingJob], dict[int, list[float]]]:
        """The settings of ``batch`` worth scheduling exactly, in two rounds: ``(first, the
        architecture of each first job, the rest, per architecture and model the best DP bound
        of the settings skipped)``.  The first round is, per architecture and model, the setting
        of the highest DP bound; the rest waits for its exact value (:meth:`evaluate_exactly`).

        A setting is skipped when nothing fits (memory does not depend on the chip's speed) or
        when even its DP bound, with every other model at its best bound, cannot lift the
        architecture to the incumbent; :meth:`_Answer.accept` checks afterwards that no skipped
        setting could have beaten the model's choice."""
        n_models = self.n_models
        first: list[ExactJob] = []
        owner: list[int] = []
        rest: list[PendingJob] = []
        skipped: dict[int, list[float]] = {}
        for a in batch:
            c, h = self.archs[a]
            bounds = self.frontier.release(a)
            skipped[a] = [0.0] * n_models
            for m in range(n_models):
                worth, skipped[a][m] = self.answer.worth(bounds, m, self.usable[m])
                if not worth:
                    continue
                # The likeliest best first (ties: the model's tie-break order).
                worth.sort(key=lambda x: (-x[0],) + _setting_order(self.tasks[m], x[1]))
                first.append((m, worth[0][1], c, self.cands.hbm[h]))
                owner.append(a)
                rest += [(a, m, s, bound) for bound, s in worth[1:]]
        return first, owner, rest, skipped

    def evaluate_exactly(self, batch: list[int]) -> None:
        """Stage 3 on ``batch``: schedule and place its settings exactly, score each architecture
        and keep it (as the incumbent when it beats it).  Two rounds: each architecture's
        best-bound setting per model, then only the settings whose DP bound can still reach
        (or tie) the best exact throughput the first round found for that model (a bound below
        it proves the setting loses; it counts as skipped, so :meth:`_Answer.accept` keeps the
        score exact)."""
        if not batch:
            return
        done = len(self.answer.evaluated) + self.answer.pruned["exact"]
        bounds_of = self.frontier.dp_bounds_of
        self.in_hand = max(float(np.mean([b.max() if len(b) else 0.0 for b in bounds_of[a]])) for a in batch)
        self.budget.check("exact", done + len(batch), self.label, len(self.archs), self.so_far)
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
            self.answer.accept(self.answer.evaluate(c, self.cands.hbm[h], priced[a]), skipped[a])
            self.progress.advance()

    def price(self, jobs: list[ExactJob], owner: list[int], priced: dict[int, list[list[PricedSetting]]]) -> None:
        """Price ``jobs`` exactly (``owner``: each one's architecture) into ``priced``."""
        for (m, s, _, _), a, (thr, dp_result) in zip(jobs, owner, self.evaluator.exact(self.cands, self.tasks, jobs)):
            priced[a][m].append((s, thr, dp_result))

    def so_far(self) -> str:
        """What a refusal says the search knows (:meth:`SearchBudget.check`): the best
        architecture found, its score, and how far above it the best bound left lies (the most
        any architecture not yet decided could score); '' before the first."""
        best = self.answer.best
        if best is None:
            return ""
        from phaze.search.objective import UNITS

        name = self.cands.make(best.config, best.hbm).name
        unit = UNITS.get(self.evaluator.params.objective, "")
        left = max(*self.frontier.best_bounds(), self.in_hand)
        gap = f", at most {100 * (left / best.score - 1):.2g} % below the best" if np.isfinite(left) else ""
        score = f"{best.score:,.0f}" if abs(best.score) >= 1e4 else f"{best.score:,.6g}"
        return f"; the best found so far, {name}, scores {score} {unit}{gap}"

    # -- the end ----------------------------------------------------------------------------------

    def count_unvisited_as_pruned(self) -> None:
        """Architectures never reached count as pruned by the bound that stopped them: the work
        bound for those never visited, the DP bound for those still queued."""
        remaining = self.frontier.unvisited()
        self.answer.pruned["work_bound"] += remaining
        for _, _, a in self.frontier.queue:
            self.answer.pruned[self.frontier.pruned_by(a)] += 1
        self.progress.advance(remaining + len(self.frontier.queue))


class _Frontier:
    """The architectures of a search not decided yet, and the order it takes them in: those
    never visited, best work bound first (then in the tie-break order of the answer, so that
    the first exact evaluations are the likeliest winners), and those past the DP bound in a
    heap, best score bound first (ties: the visit order), each with its per-model DP bounds
    while it waits.  That order is what makes the search deterministic, so it is kept here, in
    one place, away from the stages that decide what to push and pop."""

    def __init__(self, archs: list[tuple[int, int]], work_bound: np.ndarray, area_key: np.ndarray):
        #: The work bound of each config (stage 1).
        self.work_bound = work_bound
        self.archs = archs
        #: Every architecture in visit order.
        self.order = sorted(
            range(len(archs)),
            key=lambda a: (-work_bound[archs[a][0]], area_key[archs[a][0]], archs[a][1], archs[a][0]),
        )
        self.rank = {a: r for r, a in enumerate(self.order)}
        self.visited = 0
        #: Architectures past the DP bound, best first: ``(-score bound, visit rank, arch)``.
        self.queue: list[tuple[float, int, int]] = []
        #: arch -> per model, its DP bounds (one per usable setting), while it is queued.
        self.dp_bounds_of: dict[int, list[np.ndarray]] = {}
        #: Queued architectures whose DP bounds have been refined (:meth:`_BranchAndBound.refine`).
        self.refined: set[int] = set()
        #: The floor bound of a block of unvisited architectures, by where it starts in
        #: :attr:`order` (blocks are visited whole, so they start at multiples of the batch).
        self.floors: dict[int, tuple[float, list[np.ndarray]]] = {}
        #: Queued architectures bounded by their block's floor (not refined yet): arch -> where
        #: its block starts in :attr:`order`.
        self.floor_queued: dict[int, int] = {}

    def unvisited(self) -> int:
        """How many architectures were never visited."""
        return len(self.order) - self.visited

    def best_bounds(self) -> tuple[float, float]:
        """``(the best bound of the unvisited architectures, the best queued score bound)``, each
        ``-inf`` when there is none: the next unvisited architecture's work bound, or the next
        block's floor bound (:meth:`_BranchAndBound.floor_next_block`) when known and smaller."""
        if self.visited < len(self.order):
            next_unvisited = float(self.work_bound[self.archs[self.order[self.visited]][0]])
            floor = self.next_floor()
            if floor is not None:
                next_unvisited = min(next_unvisited, floor)
        else:
            next_unvisited = -np.inf
        return next_unvisited, -self.queue[0][0] if self.queue else -np.inf

    def next_floor(self) -> float | None:
        """The floor bound of the next block of unvisited architectures (the next
        :data:`BOUND_BATCH` of the visit order), None while not computed."""
        floor = self.floors.get(self.visited)
        return None if floor is None else floor[0]

    def next_setting_floors(self) -> list[np.ndarray]:
        """The next block's DP floor of each model's usable settings (inf: not run)."""
        return self.floors[self.visited][1]

    def set_next_floor(self, bound: float, per_setting: list[np.ndarray]) -> None:
        """Keep ``bound`` as the next block's floor bound, ``per_setting`` its DP floors."""
        self.floors[self.visited] = (bound, per_setting)

    def visit(self, n: int) -> list[int]:
        """The next ``n`` unvisited architectures (fewer at the end), now visited."""
        block = self.order[self.visited : self.visited + n]
        self.visited += len(block)
        return block

    def push(self, a: int, bound: float, dp_bounds: list[np.ndarray] | None = None) -> None:
        """Queue architecture ``a`` by its score bound ``bound`` (with its per-model DP bounds
        ``dp_bounds`` the first time; queued again, it keeps its own)."""
        if dp_bounds is not None:
            self.dp_bounds_of[a] = dp_bounds
        heapq.heappush(self.queue, (-bound, self.rank[a], a))

    def pop(self) -> tuple[float, int]:
        """``(score bound, architecture)`` of the best queued architecture, unqueued (its DP
        bounds are kept until :meth:`release`)."""
        neg_bound, _, a = heapq.heappop(self.queue)
        return -neg_bound, a

    def pruned_by(self, a: int) -> str:
        """The bound that prunes queued architecture ``a``: the refined bound once refined, else
        the DP bound (a key of the search's pruning counts)."""
        return "refined_bound" if a in self.refined else "dp_bound"

    def release(self, a: int) -> list[np.ndarray]:
        """Architecture ``a``'s DP bounds, forgotten here (it leaves the search: pruned or
        evaluated)."""
        self.refined.discard(a)
        self.floor_queued.pop(a, None)
        return self.dp_bounds_of.pop(a)


class _Answer:
    """The answer of a search as it grows, apart from how the search gets there: the incumbent,
    every architecture evaluated exactly, the pruning counts, and the rules that make the
    answer, each in one place: its order (:meth:`answer_key`), the tolerance every stage prunes
    with (:meth:`below_incumbent`; :meth:`worth`, which of a model's settings can still lift an
    architecture to the incumbent), how an architecture's exactly priced settings become its
    :class:`Evaluated`, and when that score is exact (:meth:`accept`)."""

    def __init__(self, cands: Candidates, tasks: Sequence[ModelTask], evaluator: Evaluator, prune: bool):
        self.cands = cands
        self.tasks = tasks
        self.evaluator = evaluator
        self.prune = prune
        self.n_models = len(tasks)
        self.area = np.asarray(cands.configs["area_um2"], dtype=np.float64)  # NaN outside the area model
        #: The area as a sort key: a chip outside the area model sorts after every modelled one.
        self.area_key = np.where(np.isfinite(self.area), self.area, np.inf)
        self.best: Evaluated | None = None
        self.evaluated: list[Evaluated] = []
        self.pruned = {"work_bound": 0, "dp_bound": 0, "refined_bound": 0, "exact": 0}

    def incumbent(self) -> float:
        """The best score found so far (-inf before the first)."""
        return self.best.score if self.best is not None else -np.inf

    def pruning(self) -> bool:
        """Whether a bound can prune now: pruning is on and there is an incumbent."""
        return self.prune and self.best is not None

    def below_incumbent(self, bound: float) -> bool:
        """Whether a score bound proves an architecture cannot win (never without pruning or an
        incumbent; the tolerance keeps ties, see :data:`TOL`)."""
        return self.pruning() and bound < self.incumbent() * (1 - TOL)

    def worth(self, bounds: list[np.ndarray], m: int, usable: list[int]) -> tuple[list[tuple[float, int]], float]:
        """Model ``m``'s settings ``usable`` on an architecture whose DP bounds are ``bounds``
        (per model, one per usable setting), split: ``(worth, skipped)``, ``worth`` the
        ``(bound, setting)`` of those that fit and whose bound, with every other model at its
        best bound, can lift the architecture to the incumbent (all that fit, without pruning
        or an incumbent), and ``skipped`` the best bound of the other ones that fit (0.0 if
        none)."""
        need = -np.inf
        if self.pruning():
            best = [float(b.max()) if len(b) else 0.0 for b in bounds]
            need = (self.n_models * self.incumbent() - (sum(best) - best[m])) * (1 - TOL)
        worth: list[tuple[float, int]] = []
        skipped = 0.0
        for k, s in enumerate(usable):
            bound = float(bounds[m][k])
            if bound <= 0:
                continue
            if bound >= need:
                worth.append((bound, s))
            else:
                skipped = max(skipped, bound)
        return worth, skipped

    def answer_key(self, evaluated: Evaluated) -> tuple:
        """The order of the answer: the higher score, then the smaller area, HBM, config index."""
        return (-evaluated.score, self.area_key[evaluated.config], evaluated.hbm, evaluated.config)

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

    def evaluate(self, config: int, hbm: int, priced: list[list[PricedSetting]]) -> Evaluated:
        """Chip ``config`` with ``hbm`` bytes, each model at its best of the settings ``priced``
        (:meth:`best_settings`): the mean score, throughput and chip power over the models."""
        chosen = self.best_settings(priced)
        score = sum(x[1] for x in chosen) / self.n_models
        throughput = sum(self.evaluator.throughput(x[2]) for x in chosen if x[2] is not None) / self.n_models
        settings = [self.tasks[m].settings[s] if s >= 0 else None for m, (s, _, _) in enumerate(chosen)]
        power = self.evaluator.chip_power(self.cands, settings, config, [x[2] for x in chosen])
        return Evaluated(config, hbm, score, float(self.area[config]), chosen, throughput, power)

    def accept(self, evaluated: Evaluated, skipped: list[float]) -> None:
        """Keep an exactly evaluated architecture.  Its score is exact when no skipped setting
        could have beaten a model's choice; otherwise the architecture provably scores below the
        incumbent (see :meth:`_BranchAndBound.exact_jobs`) and counts as pruned at the exact
        stage."""
        if all(skipped[m] <= evaluated.best[m][1] * (1 + TOL) for m in range(self.n_models)):
            self.evaluated.append(evaluated)
            if evaluated.score > 0 and (self.best is None or self.answer_key(evaluated) < self.answer_key(self.best)):
                self.best = evaluated
        else:
            self.pruned["exact"] += 1

    def result(self, architectures: int, settings: int, wall_s: float) -> Result:
        """What the search returns: the best architecture, every one evaluated (in config and
        HBM order), and the search's counts (the JSON's ``search`` object starts with them):
        ``architectures`` searched, ``settings`` in all over the models, in ``wall_s`` s."""
        self.evaluated.sort(key=lambda e: (e.config, e.hbm))
        stats = {
            "candidates": architectures * settings,
            "architectures": architectures,
            "settings": settings,
            "pruned": self.pruned,
            "evaluated": len(self.evaluated),
            "wall_s": wall_s,
        }
        return Result(self.best, self.evaluated, stats)
