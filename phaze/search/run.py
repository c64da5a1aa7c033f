"""``phazec`` without ``--hw``: prepare the settings, run the search and the baselines, write
the best chip and its plans (one module per model), the JSON and the report.

Phases (each timed, with a progress bar unless ``-q``):

1. **prepare**: each model traced once per micro-batch size and sharded for each TP width
   (:mod:`phaze.search.setting`), in parallel over the backend, cached on disk by the model
   file's bytes, the options and phaze's own source (as checked JSON, never a pickle: see
   :func:`prepare`);
2. **baselines**: the TPUv4-like chip with the expert placement and with the searched one, and
   the decoupled search (the best chip under the expert placement);
3. **search**: the co-optimized search over the space (:mod:`phaze.search.engine`), and with
   several models each model's own best (for the loss of the common chip);
4. **plan**: the winner compiled through the IR pipeline (``phazec --hw`` on that chip, same
   solver limits and schedule cache), checked against the search's figure.

Each stage's result is also kept in the cache directory by its inputs
(:mod:`phaze.search.warm`, in the cache's store): a rerun computes only the stages whose inputs changed, and one with
nothing changed reads the answer (:func:`answer`) without importing a model.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from passes.algorithms.option_values import Dtype, Recompute, Runtime, Tristate
from passes.cache_file import BadEntry, Store, digest, fields, is_int, is_number, need
from phaze.model_key import model_key, model_known
from phaze.plan import plan_template
from phaze.search import warm
from phaze.search.engine import (
    COUNTS,
    TIMERS,
    Candidates,
    Evaluator,
    ModelTask,
    Params,
    Progress,
    Result,
    SearchBudget,
    SolverLimits,
    search,
)
from phaze.search.objective import UNITS, check_tables
from phaze.search.pareto import front_indices
from phaze_ir import keys
from phaze_ir.errors import PhazeError, PhazeWarning

BASELINE_CHIP = "tpuv4"
#: The same chip on TPU v4's 3-D torus (docs/design.md §5.5), reported beside the flat one.
TORUS_CHIP = "tpuv4_torus"
#: Names of the baselines, in report order.
BASELINES = ("tpuv4+expert", "tpuv4+phaze", "tpuv4-torus+phaze", "decoupled", "co-optimized")
#: What a cold search's workers import before preparing settings (``start_fork_server``: once, in
#: the server they fork from; a module that is not installed is left out).
WORKER_MODULES = ("torch", "transformers.modeling_utils")
#: The phases of a search, in the order of the JSON's ``search.wall_s``.
PHASES = ("prepare", "baselines", "search", "plan")


@dataclass
class SearchOptions:
    """What ``phazec`` takes for a search besides the driver's options."""

    space: str | None = None  # a space TOML file; None: the paper's space
    jobs: int = 1
    backend: str = "local"
    address: str | None = None
    cache_dir: str | None = None  # None: nothing kept on disk
    limits: SolverLimits = field(default_factory=SolverLimits)
    baselines: bool = True
    prune: bool = True
    #: the most work a search does before refusing (``--max-exact``, ``--max-dp-bound``)
    budget: SearchBudget = field(default_factory=SearchBudget)


#: The store's kind of entry holding one model's settings at one micro-batch (:func:`prepare`).
SETTINGS_KIND = "settings"


def _prepare_worker(args: tuple[str, int, tuple[int, ...], Any]) -> list:
    from phaze.search.setting import prepare_settings

    path, micro_batch, tps, opts = args
    return prepare_settings(path, micro_batch, tps, opts)


def _check_settings(micro_batch: int, tps: tuple[int, ...]):
    """The check of a ``settings`` payload: settings of a model at ``micro_batch``, sharded for
    some of ``tps`` (:class:`BadEntry` otherwise)."""
    from phaze.search.setting import Setting

    def check(payload: Any) -> list:
        need(isinstance(payload, list) and bool(payload), "a list of settings")
        try:
            settings = [Setting.from_json(s) for s in payload]
        except ValueError as e:
            raise BadEntry(f"does not hold valid settings ({e})") from None
        if any(s.micro_batch != micro_batch or s.tp not in tps for s in settings):
            raise BadEntry(f"holds settings of another micro-batch or TP width than {micro_batch} and {tps}")
        return settings

    return check


def prepare(
    paths: list[str], models: tuple[str, ...], opts, tps: tuple[int, ...], stages: Store, backend, log
) -> list[list]:
    """Settings of every model (``[model][setting]``, micro-batch-major), from the cache's store
    ``stages`` where it has them (``settings`` entries, checked before use: never code);
    ``models``: each model's digest (:func:`phaze.model_key.model_key`)."""
    items, keys, where = [], [], []
    out: list[list] = [[None] * len(opts.micro_batches) for _ in paths]
    for m, path in enumerate(paths):
        for k, micro_batch in enumerate(opts.micro_batches):
            traced_as = (micro_batch, opts.seq_len, opts.traced_dtype, opts.optimizer, opts.strict)
            # the CP degrees (each traced at S/c), the experts' padding at import, the kernels formed
            runtime = (opts.context_parallel, opts.devices, opts.capacity_factor, opts.kernels)
            how = (traced_as, opts.selective_recompute, runtime)  # and what the selective policy re-runs
            key = stages.key(SETTINGS_KIND, models[m], tps, opts.sequence_parallel, how)
            cached = stages.load(SETTINGS_KIND, key, _check_settings(micro_batch, tps), again="prepared again")
            if cached is not None:
                out[m][k] = cached
                continue
            items.append((path, micro_batch, tps, opts))
            keys.append(key)
            where.append((m, k))
    if items:
        log(
            f"preparing {len(items)} model setting(s) (trace at each micro-batch, shard at TP {tps})"
            + (f" on {backend.jobs} {backend.name} worker(s)" if backend.jobs > 1 else "")
        )
        for (m, k), key, settings in zip(where, keys, backend.map(_prepare_worker, items)):
            out[m][k] = settings
            stages.keep(SETTINGS_KIND, key, [s.to_json() for s in settings])
    return [[s for group in per_model for s in group] for per_model in out]


def _baseline_record(name: str, res: Result | None, cands: Candidates | None, tasks, note: str = "") -> dict:
    """The JSON record of a baseline (or of the co-optimized answer): its chip, throughput and
    placement, or zeros and a note saying why there is none."""
    rec = {
        "name": name,
        "throughput_samples_per_s": 0.0,
        "score": 0.0,
        "accelerator": None,
        "dp": 0,
        "pp": 0,
        "tp": 0,
        "micro_batch_size": 0,
        "sequence_parallel": False,
        "virtual_stages": 0,
        "zero": 0,
        "rank_order": "",
        "area_mm2": None,
        "hbm_bytes": 0,
        "note": note,
    }
    if res is None or res.best is None:
        if not note:
            rec["note"] = "no placement fits"
        return rec
    winner = res.best
    assert cands is not None  # a result comes with its candidates
    acc = cands.make(winner.config, winner.hbm)
    # The record shows the placement of the first model that fits on the winner (with several
    # models, one may fit nowhere on it: its throughput is 0 in the mean).
    chosen = [
        (tasks[m].settings[s], dp_result["plan"])
        for m, (s, _, dp_result) in enumerate(winner.best)
        if dp_result is not None and dp_result["plan"] is not None
    ]
    setting, plan = chosen[0] if chosen else (None, None)
    chip = acc.to_dict()
    chip["hbm_bytes"] = winner.hbm
    area = acc.modeled_area_um2 if acc.modeled_area_um2 is not None else acc.area_um2
    chip["area_mm2"] = area / 1e6 if area is not None else None
    rec.update(
        throughput_samples_per_s=winner.throughput,
        score=winner.score,
        accelerator=chip,
        dp=plan["dp"] if plan else 0,
        pp=plan["pp"] if plan else 0,
        tp=plan["tp"] if plan else 0,
        micro_batch_size=plan["micro_batch"] if plan else 0,
        sequence_parallel=setting.sequence_parallel if setting else False,
        virtual_stages=plan["virtual_stages"] if plan else 0,
        zero=plan["zero"] if plan else 0,
        rank_order=plan["rank_order"] if plan else "",
        area_mm2=chip["area_mm2"],
        hbm_bytes=winner.hbm,
    )
    if len(tasks) > 1:
        rec["per_model"] = [
            {"model": t.name, "throughput_samples_per_s": Evaluator.throughput(x[2]) if x[2] else 0.0, "score": x[1]}
            for t, x in zip(tasks, winner.best)
        ]
    return rec


def _why_not(res: Result, ev: Evaluator, cands: Candidates, tasks) -> str:
    """'' when ``res`` found a chip; else why the first model that fits nowhere does not fit
    (on the largest HBM; "no placement fits" when the DP gives no reason)."""
    if res.best is not None:
        return ""
    for t in tasks:
        why = ev.why_not(cands, t)
        if why:
            return (f"{t.name}: " if len(tasks) > 1 else "") + why
    if ev.params.power_cap_w is not None and ev.counts["over_power_cap"]:
        return f"every plan that fits draws more than --power-cap {ev.params.power_cap_w:g} W per chip"
    return "no placement fits"


@contextmanager
def _timed(walls: dict[str, float], phase: str) -> Iterator[None]:
    """Record the wall time of a phase in ``walls`` (the JSON's ``search.wall_s``)."""
    t0 = time.perf_counter()
    yield
    walls[phase] = time.perf_counter() - t0


@dataclass
class _Keys:
    """What the stage cache's keys are made of (:mod:`phaze.search.warm`): the SHA-256 of each
    model file's bytes, the driver's options and the solver limits (their ``repr``), and digests
    of the space, of the baselines' chip and of that chip on its torus."""

    models: tuple[str, ...]
    opts: str
    limits: str
    space: str
    chip: str
    torus: str

    def common(self, *more: object) -> tuple:
        """The parts of every search stage's key (the models, the options, the limits), and ``more``."""
        return (self.models, self.opts, self.limits, *more)


@dataclass
class _Inputs:
    """The checked inputs of a search: the space, the models' names, per model the placement
    given with ``--placement`` (None: searched) and the paper's expert one (None: unknown), the
    TP widths to prepare, and what the stage cache keys on."""

    space: Any
    names: list[str]
    fixed: list[tuple[int, int, int] | None]
    experts: list[tuple[int, int, int] | None]
    tps: tuple[int, ...]
    keys: _Keys


def _space_digest(space) -> str:
    """A digest of everything a space gives the search: its spec (template chip included), its
    candidates and its HBM options."""
    h = hashlib.sha256(repr((space.spec, tuple(space.hbm_options))).encode())
    h.update(space.configs.tobytes())
    return h.hexdigest()


def _model_names(paths: list[str], stages: Store) -> tuple[list[str], tuple[str, ...]]:
    """Each model's name and its digest (:func:`phaze.model_key.model_key`: the file's bytes
    and those of the helpers it imports)."""
    keys = [model_key(path, stages) for path in paths]
    return [k.name for k in keys], tuple(k.digest for k in keys)


def _read_inputs(paths: list[str], opts, sopts: SearchOptions, stages: Store) -> _Inputs:
    """Load the space and the model files and check them, before anything slow (a wrong
    argument is a one-line error, not one after the preparation)."""
    from passes.algorithms.placement import EXPERT_PLACEMENTS, PlacementError, parse_placement
    from phaze.driver import check_options
    from phaze.options import DEFAULT_TP_WIDTHS, Stage
    from phaze.pipeline import load_accelerator
    from phaze.search.arch_space import load_space, paper_space
    from phaze_ir.area import FP8_RATE
    from phaze_ir.hardware import HardwareError

    if opts.emit is not Stage.PLAN:
        raise PhazeError("the architecture search writes a plan: give --hw to stop at an earlier stage")
    check_options(opts)
    try:
        # the chips of the run's precision: with the FP8 datapath under --dtype fp8, without otherwise
        fp8 = opts.dtype is Dtype.FP8
        space = load_space(sopts.space) if sopts.space else paper_space(fp8_rate=(FP8_RATE,) if fp8 else (0,))
        space = space.for_fp8(fp8)
    except HardwareError as e:
        raise PhazeError(str(e)) from e
    try:
        check_tables(
            opts.objective, space.spec.template, f"the space '{space.spec.name}'", opts.power_cap_w is not None
        )
    except ValueError as e:
        raise PhazeError(str(e)) from e
    calibration = getattr(space.spec.template, "calibration", None)
    if opts.kernels is not Runtime.OPS and calibration is not None and calibration.compute_capability is not None:
        # the settings' kernels are formed as on a chip without one (phaze.search.setting._settings_of)
        raise PhazeError(
            f"--kernels {opts.kernels}: the space '{space.spec.name}''s template has a CUDA compute capability; "
            "the search forms kernels for chips without one (use --kernels ops, or --hw CHIP)"
        )
    if opts.context_parallel != 1 and opts.seq_len is not None:  # a degree past 1, or auto
        from phaze.search.setting import cp_degrees

        cp_degrees(opts, None)  # a degree that cannot split the sequence: one line, before anything slow
    names, digests = _model_names(paths, stages)
    if len(set(names)) != len(names):
        raise PhazeError(f"the same model twice: {', '.join(names)}")
    try:
        fixed = [parse_placement(opts.placement, n) for n in names]
    except PlacementError as e:
        raise PhazeError(f"--placement: {e}") from e
    experts = [EXPERT_PLACEMENTS.get(n) for n in names]
    # Besides the widths searched, those of the given placements and of the experts' baselines.
    tps = tuple(opts.tp_widths or DEFAULT_TP_WIDTHS)
    extra = {f[2] for f in fixed if f} | {x[2] for x in experts if x and sopts.baselines}
    chip = repr(load_accelerator(BASELINE_CHIP))
    torus = repr(load_accelerator(TORUS_CHIP))
    keys = _Keys(digests, repr(opts), repr(sopts.limits), _space_digest(space), digest(chip), digest(torus))
    return _Inputs(space, names, fixed, experts, tuple(sorted(set(tps) | extra)), keys)


def _tasks_for(names: list[str], settings: list[list], placements: list, allowed: set[int]) -> list[ModelTask]:
    """One task per model under ``placements`` (None: searched, on the TP widths ``allowed``; a
    placement: the settings of its TP width)."""
    out = []
    for name, model_settings, placement in zip(names, settings, placements):
        keep = [
            s
            for s in model_settings
            if (placement is not None and s.tp == placement[2]) or (placement is None and s.tp in allowed)
        ]
        out.append(ModelTask(name, keep, placement))
    return out


class _Work:
    """What computing a stage needs, made when a stage first needs it: the backend (workers,
    a Ray instance), the settings (the models traced), the evaluator.  A rerun that finds every
    stage in the cache makes none of them."""

    def __init__(
        self, paths: list[str], opts, inputs: _Inputs, sopts: SearchOptions, stages: Store, schedules, log
    ) -> None:
        self.paths, self.opts, self.inputs, self.sopts = paths, opts, inputs, sopts
        self.stages, self.schedules, self.log = stages, schedules, log
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> _Work:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    @cached_property
    def backend(self):
        from phaze.search.backend import make_backend

        sopts = self.sopts
        return self._stack.enter_context(make_backend(sopts.backend, sopts.jobs, sopts.address))

    @cached_property
    def settings(self) -> list[list]:
        return prepare(
            self.paths, self.inputs.keys.models, self.opts, self.inputs.tps, self.stages, self.backend, self.log
        )

    @cached_property
    def evaluator(self) -> Evaluator:
        return Evaluator(Params.of_options(self.opts), self.sopts.limits, self.schedules, self.backend)

    @cached_property
    def chip_cands(self) -> Candidates:
        from phaze.pipeline import load_accelerator

        return Candidates.of_accelerator(load_accelerator(BASELINE_CHIP))

    @cached_property
    def torus_cands(self) -> Candidates:
        from phaze.pipeline import load_accelerator

        return Candidates.of_accelerator(load_accelerator(TORUS_CHIP))

    def tasks_for(self, placements: list) -> list[ModelTask]:
        from phaze.options import DEFAULT_TP_WIDTHS

        allowed = set(self.opts.tp_widths or DEFAULT_TP_WIDTHS)
        return _tasks_for(self.inputs.names, self.settings, placements, allowed)

    def counted(self, compute):
        """``compute()`` and the evaluator's counts it cost."""
        before = dict(self.evaluator.counts)
        out = compute()
        return out, {k: self.evaluator.counts[k] - before[k] for k in COUNTS}


def _check_baseline(payload: Any) -> tuple[dict, dict[str, int]]:
    """A ``baseline`` stage entry: ``(record, counts)``."""
    d = fields(payload, ("record", "counts"), "a baseline")
    return warm.check_record(d["record"]), warm.check_counts(d["counts"], COUNTS)


def _baseline_plan(inputs: _Inputs, sopts: SearchOptions, stages: Store) -> list[tuple[str, str]]:
    """The baselines to search, in order, with their stage keys: the TPUv4-like chip with the
    expert placement (unless a model has none) and with the searched one, on its flat network
    and on its torus, then the decoupled search (the space's best chip under the expert
    placement, pruned as the search is)."""
    k = inputs.keys
    out = []
    if all(inputs.experts):
        out.append(("tpuv4+expert", stages.key("baseline", "tpuv4+expert", *k.common(k.chip))))
    out.append(("tpuv4+phaze", stages.key("baseline", "tpuv4+phaze", *k.common(k.chip))))
    out.append(("tpuv4-torus+phaze", stages.key("baseline", "tpuv4-torus+phaze", *k.common(k.torus))))
    if all(inputs.experts):
        out.append(("decoupled", stages.key("baseline", "decoupled", *k.common(k.space, sopts.prune))))
    return out


def _run_baselines(
    inputs: _Inputs,
    work: _Work,
    cands: Candidates,
    cached: dict[str, tuple[dict, dict[str, int]] | None],
    keys: dict[str, str],
    stages: Store,
    progress: Progress | None,
) -> tuple[dict[str, dict], list[dict[str, int]]]:
    """The baselines' records and the evaluator's counts of each: read from the stage cache
    (``cached``) or searched, in :func:`_baseline_plan`'s order, on the same evaluator (the
    schedules they solve are the search's to reuse, and the evaluator's counts depend on the
    order), and kept."""
    names, experts = inputs.names, inputs.experts
    baselines: dict[str, dict] = {}
    counts: list[dict[str, int]] = []
    if not all(experts):
        missing = ", ".join(n for n, x in zip(names, experts) if not x)
        for name in ("tpuv4+expert", "decoupled"):
            baselines[name] = _baseline_record(name, None, None, [], f"no expert placement known for {missing}")
    budget = replace(work.sopts.budget, exact=0)
    for name, key in keys.items():
        hit = cached[name]
        if hit is None:
            placements = [None] * len(names) if name.endswith("+phaze") else experts
            if name == "tpuv4-torus+phaze":
                on = work.torus_cands
            elif name.startswith("tpuv4"):
                on = work.chip_cands
            else:
                on = cands
            prune = work.sopts.prune if name == "decoupled" else True

            def compute(on=on, placements=placements, prune=prune, name=name) -> dict:
                tasks = work.tasks_for(placements)
                # A baseline is a comparison, not the answer asked: the decoupled one (the expert
                # placement fixed, every chip) evaluates more than the search (OPT-350m on the
                # paper space: over 1,024), so only the DP-bound budget holds it.
                res = search(on, tasks, work.evaluator, prune=prune, progress=progress, label=name, budget=budget)
                return _baseline_record(name, res, on, tasks, _why_not(res, work.evaluator, on, tasks))

            rec, delta = work.counted(compute)
            stages.keep("baseline", key, {"record": rec, "counts": delta})
            hit = rec, delta
        baselines[name] = hit[0]
        counts.append(hit[1])
    return baselines, counts


def _co_optimize(
    cands: Candidates, tasks: list[ModelTask], ev: Evaluator, sopts: SearchOptions, progress: Progress | None
) -> tuple[Result, list[Result]]:
    """The search proper, and with several models each model's own best (for the loss each
    model takes on the common chip)."""
    result = search(cands, tasks, ev, prune=sopts.prune, progress=progress, label="search", budget=sopts.budget)
    own: list[Result] = []
    if len(tasks) > 1:
        for t in tasks:
            alone = f"{t.name} alone"
            own.append(search(cands, [t], ev, prune=sopts.prune, progress=progress, label=alone, budget=sopts.budget))
    return result, own


def _search_stage(
    inputs: _Inputs, work: _Work, cands: Candidates, sopts: SearchOptions, progress: Progress | None
) -> dict:
    """The co-optimized search as the stage cache keeps it (:func:`_check_search`): its record,
    the winner (config and HBM, score, per model ``[micro-batch, TP width, sequence parallel,
    throughput, context-parallel degree]``), the
    JSON's ``search`` object (wall times and counts to be filled in), the per-model detail (None
    with one model) and the evaluator's counts it cost.  No chip fitting is the one-line error."""
    names = inputs.names

    def compute() -> tuple[Result, list[Result], list[ModelTask]]:
        tasks = work.tasks_for(inputs.fixed)
        return (*_co_optimize(cands, tasks, work.evaluator, sopts, progress), tasks)

    (result, own, tasks), counts = work.counted(compute)
    if result.best is None:
        raise PhazeError(
            "no chip of the space fits a placement of "
            + ", ".join(names)
            + f" on {work.opts.devices} devices: {_why_not(result, work.evaluator, cands, tasks)}"
        )
    best = result.best
    winner_settings = []
    for m in range(len(names)):
        setting_idx, _, dp_result = best.best[m]
        thr = Evaluator.throughput(dp_result) if dp_result else 0.0
        setting = tasks[m].settings[setting_idx]
        winner_settings.append([setting.micro_batch, setting.tp, setting.sequence_parallel, thr, setting.cp])
    return {
        "record": _baseline_record("co-optimized", result, cands, tasks),
        "winner": {"config": best.config, "hbm": best.hbm, "score": best.score, "settings": winner_settings},
        "stats": _search_statistics(result, inputs.space, cands, sopts.limits, work.opts.objective),
        "models_detail": _models_detail(names, [Evaluator.throughput(x[2]) if x[2] else 0.0 for x in best.best], own)
        if len(names) > 1
        else None,
        "counts": counts,
    }


def _check_search(inputs: _Inputs, opts) -> Any:
    """The check of a ``search`` stage entry (:func:`_search_stage`) for these inputs: the
    winner a candidate of the space, one setting per model among those searched."""

    def check(payload: Any) -> dict:
        d = fields(payload, ("record", "winner", "stats", "models_detail", "counts"), "a search")
        warm.check_record(d["record"])
        warm.check_stats(d["stats"])
        warm.check_counts(d["counts"], COUNTS)
        w = fields(d["winner"], ("config", "hbm", "score", "settings"), "a winner")
        need(is_int(w["config"]) and 0 <= w["config"] < len(inputs.space.configs), "a candidate of the space")
        need(is_int(w["hbm"]) and w["hbm"] in inputs.space.hbm_options, "an HBM option of the space")
        need(is_number(w["score"]) and w["score"] > 0, "a winner that fits")
        settings = w["settings"]
        need(isinstance(settings, list) and len(settings) == len(inputs.names), "one setting per model")
        for s in settings:
            need(
                isinstance(s, list) and len(s) == 5,
                "settings [micro-batch, TP width, sequence parallel, throughput, context-parallel degree]",
            )
            need(
                s[0] in opts.micro_batches
                and s[1] in inputs.tps
                and isinstance(s[2], bool)
                and is_number(s[3])
                and is_int(s[4])
                and s[4] >= 1,
                "a setting searched",
            )
        detail = d["models_detail"]
        need((detail is None) == (len(inputs.names) == 1) and (detail is None or isinstance(detail, list)), "details")
        return d

    return check


def _add_speedups(baselines: dict[str, dict], score: float) -> None:
    """Each baseline's ``speedup``: the co-optimized ``score`` over its own (the objective's
    values: throughputs under the default objective; None for 0)."""
    for name in BASELINES:
        rec = baselines.get(name)
        if rec is not None:
            theirs = rec["score"]
            rec["speedup"] = score / theirs if theirs else None


def _winner_options(opts, limits: SolverLimits, cache):
    """The driver's options for recompiling the winner: the search's solver limits and its
    schedule cache, handed over so that the winner's layer schedules (solved already) are
    looked up, not solved again.  The micro-batch and TP width are set per model."""
    return replace(
        opts,
        schedule_time_limit=limits.time_limit,
        schedule_gap=limits.gap_limit,
        schedule_nodes=limits.node_limit or 0,
        schedule_max_binaries=limits.max_binaries or 0,
        micro_batches=(1,),
        tp_widths=None,
        schedule_cache=cache,
    )


def _check_plan(payload: Any) -> str:
    """A ``plan`` stage entry: a plan module's MLIR text."""
    d = fields(payload, ("text",), "a plan")
    need(isinstance(d["text"], str), "a plan's text")
    return d["text"]


def _compile_winner(
    paths: list[str], inputs: _Inputs, winner: dict, acc, wopts, stages: Store, log, templated: bool = False
) -> tuple[list, list[str]]:
    """Each model's plan module on the winning chip, through the IR pipeline (``phazec --hw``)
    at the setting the search chose, or parsed from the stage cache (kept by the model file,
    the options and the chip): the plan file's numbers come from the passes, and each must
    equal the search's figure.  With each module, its text (printed, or the entry's).
    ``templated`` (one model, printed in the custom form): a point compiled before on that chip
    is placed from its template (:mod:`phaze.plan.plan_template`; the module is then its
    placed skeleton), and a compiled one leaves its template."""
    from phaze.driver import compile_model
    from phaze.plan.plan_output import plan_record
    from phaze.points import point_label
    from phaze_ir.ir import print_module

    modules, texts = [], []
    chip = repr(acc)
    for m, path in enumerate(paths):
        micro_batch, tp, sp, thr, cp = winner["settings"][m]
        name = inputs.names[m]
        sp_setting = Tristate.ON if sp else Tristate.OFF
        # At the winner's CP degree (the pipeline traces its step at S/c, as the setting was);
        # CP 1 under auto stays auto: the pipeline then fuses the attention at every degree, as
        # the search's settings have it (setting.prepare_settings), so the sweep of the winner's
        # point over the degrees keeps the degree the search chose (ties: the smaller, as both do).
        degree = cp if cp > 1 else wopts.context_parallel
        mopts = replace(
            wopts, micro_batches=(micro_batch,), tp_widths=(tp,), sequence_parallel=sp_setting, context_parallel=degree
        )
        templates = None
        if templated and stages.directory is not None:
            templates = plan_template.Templates(stages, inputs.keys.models[m], digest(chip), mopts)
        module = templates.placed(plan_template.Point(micro_batch, tp, sp, cp)) if templates is not None else None
        if module is not None and templates is not None:
            try:
                _check_plan_matches_search(name, plan_record(module).get("throughput_samples_per_s", 0.0), thr)
            except PhazeError as e:
                templates.reject(module, f"the plan of {name} ({e})")
            else:
                log(f"the plan of {name} on {acc.name} is placed from its compiled plan (in the cache)")
                modules.append(module)
                texts.append(templates.text(module))
                continue
        key = stages.key("plan", inputs.keys.models[m], repr(mopts), chip)
        text = stages.load("plan", key, _check_plan)
        module = _cached_plan(text, name, thr, stages.file("plan", key)) if text is not None else None
        if module is not None:
            log(f"the plan of {name} on {acc.name} is in the cache")
        else:
            where = point_label(micro_batch, tp, sp, cp)
            log(f"compiling the plan of {name} on {acc.name} ({where})")
            module, _ = compile_model(path, mopts, lambda msg: None, accelerator=acc)
            _check_plan_matches_search(name, plan_record(module).get("throughput_samples_per_s", 0.0), thr)
            text = print_module(module)
            stages.keep("plan", key, {"text": text})
            if templates is not None:
                templates.keep(module, text, [])
        assert text is not None  # the entry's, or the module's printed
        modules.append(module)
        texts.append(text)
    return modules, texts


def _cached_plan(text: str, name: str, thr: float, file):
    """The plan module of a ``plan`` stage entry, parsed and verified, if it gives the search's
    throughput ``thr``; else None after one warning (it is compiled again)."""
    from phaze.plan.plan_output import plan_record
    from phaze_ir.ir import parse_module

    try:
        module = parse_module(text, str(file))
        _check_plan_matches_search(name, plan_record(module).get("throughput_samples_per_s", 0.0), thr)
    except Exception as e:  # anything the text makes the parser, the verifier or the plan raise
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        warnings.warn(
            f"cache entry {file} does not hold the plan of {name} ({why}): ignored, computed again",
            PhazeWarning,
            stacklevel=2,
        )
        return None
    return module


def _check_plan_matches_search(name: str, got: float, thr: float) -> None:
    """The compiled plan's throughput must be the search's (same schedules, same DP): a
    difference is a bug, never the user's input."""
    if got != thr:  # no tolerance: both sum the same terms in the same order
        raise PhazeError(
            f"internal error: the plan of {name} gives {got} samples/s, the search {thr}; please report this"
        )


def _search_statistics(
    result: Result, space, cands: Candidates, limits: SolverLimits, objective: str
) -> dict[str, Any]:
    """The JSON's ``search`` object: the search's counts, then the space, the wall times and the
    evaluator's counts (None here: :func:`run` fills them in), every architecture evaluated
    exactly (the report's scatter plot) and the solver limits."""
    stats = dict(result.stats)
    points = []
    for e in result.evaluated:
        point = {
            "area_mm2": e.area_um2 / 1e6,
            "throughput_samples_per_s": e.throughput,
            "score": e.score,
            "hbm_bytes": e.hbm,
            "label": cands.make(e.config, e.hbm).name,
            "best": e is result.best,
        }
        if cands.template.energy is not None:
            point["power_w"] = e.power_w
        points.append(point)
    stats.update(
        objective=objective,
        objective_unit=UNITS[objective],
        space=space.spec.name,
        wall_s=None,
        evaluator=None,
        points=points,
        pareto_front=_pareto_front(points),
        solver={
            "time_limit_s": limits.time_limit,
            "gap_limit": limits.gap_limit,
            "node_limit": limits.node_limit,
            "max_binaries": limits.max_binaries,
            "seed": limits.seed,
        },
    )
    return stats


def _pareto_front(points: list[dict]) -> dict[str, Any]:
    """The JSON's ``search.pareto_front``: the indices of ``points`` on the Pareto front of
    (max throughput, min chip power, min area) (without power when the chips have no
    ``[energy]`` table); a point that fits nothing is never on it.  It is the front of the
    architectures evaluated exactly: a pruned one could lie on the true front, so only a
    ``--no-prune`` search gives the front of the whole space."""
    axes = [("throughput_samples_per_s", "max")]
    if points and "power_w" in points[0]:
        axes.append(("power_w", "min"))
    axes.append(("area_mm2", "min"))
    rows = [
        tuple(-p[k] if sense == "max" else p[k] for k, sense in axes) if p["throughput_samples_per_s"] > 0 else (None,)
        for p in points
    ]
    return {"axes": [k for k, _ in axes], "senses": [s for _, s in axes], "points": front_indices(rows)}


def _models_detail(names: list[str], on_common: list[float], own: list[Result]) -> list[dict]:
    """With several models: each model's throughput on the common chip, on its own best chip,
    and the loss between the two."""
    details = []
    for m, name in enumerate(names):
        own_best = own[m].best
        details.append(
            {
                "model": name,
                "throughput_samples_per_s": on_common[m],
                "own_best_samples_per_s": own_best.throughput if own_best else 0.0,
                "loss": 1 - on_common[m] / own_best.throughput if own_best and own_best.throughput else None,
            }
        )
    return details


def run(
    paths: list[str],
    opts,
    sopts: SearchOptions,
    log,
    progress: Progress | None = None,
    *,
    stages: Store | None = None,
    inputs: _Inputs | None = None,
    generic: bool = False,
) -> tuple[str, dict]:
    """The whole search; returns ``(the output module printed, json_dict)`` (``generic``: in
    MLIR's generic op form): the phases of the module docstring,
    each timed into ``search.wall_s`` (with the evaluator's own timers after them).  A stage
    whose inputs the stage cache (``stages``; default: that of ``sopts.cache_dir``) has seen is
    read from it, not computed."""
    from passes.algorithms import schedule as sched
    from phaze_ir.ir import print_module, print_module_from

    t_all = time.perf_counter()
    walls: dict[str, float] = {}
    stages = stages if stages is not None else Store.of(sopts.cache_dir)
    inputs = inputs if inputs is not None else _read_inputs(paths, opts, sopts, stages)
    space, names, k = inputs.space, inputs.names, inputs.keys
    log(
        f"space '{space.spec.name}': {len(space):,} chips x {len(space.hbm_options)} HBM options; "
        f"micro-batch {list(opts.micro_batches)}, TP {list(inputs.tps)}; {opts.devices} devices, "
        f"global batch {opts.global_batch}"
        + (f"; recompute {opts.recompute}" if opts.recompute is not Recompute.AUTO else "")
    )
    cands = Candidates.of_space(space)
    # What the cache holds decides what is computed (nothing is prepared when nothing is).
    baseline_keys = dict(_baseline_plan(inputs, sopts, stages)) if sopts.baselines else {}
    cached = {name: stages.load("baseline", key, _check_baseline) for name, key in baseline_keys.items()}
    search_key = stages.key("search", *k.common(k.space, sopts.prune))
    found = stages.load("search", search_key, _check_search(inputs, opts))
    for name, hit in cached.items():
        if hit is not None:
            log(f"baseline {name} is in the cache")
    if found is not None:
        log("the search's result is in the cache")
    schedules = sched.ScheduleCache(sopts.cache_dir)
    with _Work(paths, opts, inputs, sopts, stages, schedules, log) as work:
        with _timed(walls, "prepare"):
            if found is None or any(hit is None for hit in cached.values()):
                work.settings  # noqa: B018 (prepared here, so that the phase's time is its own)
        with _timed(walls, "baselines"):
            baselines, counts = _run_baselines(inputs, work, cands, cached, baseline_keys, stages, progress)
        with _timed(walls, "search"):
            if found is None:
                found = _search_stage(inputs, work, cands, sopts, progress)
                stages.keep("search", search_key, found)
        timers = dict(work.evaluator.timers) if "evaluator" in work.__dict__ else dict.fromkeys(TIMERS, 0.0)
    counts.append(found["counts"])
    baselines["co-optimized"] = found["record"]
    winner = found["winner"]
    _add_speedups(baselines, winner["score"])

    with _timed(walls, "plan"):
        acc = cands.make(winner["config"], winner["hbm"])
        wopts = _winner_options(opts, sopts.limits, schedules)
        templated = len(paths) == 1 and not generic
        modules, texts = _compile_winner(paths, inputs, winner, acc, wopts, stages, log, templated)
    walls["total"] = time.perf_counter() - t_all
    walls.update(timers)

    stats = dict(found["stats"])
    stats["wall_s"] = walls
    stats["evaluator"] = {c: sum(d[c] for d in counts) for c in COUNTS}
    chosen = [baselines[b] for b in BASELINES if b in baselines]
    module, data = _assemble(modules, names, chosen, stats, opts.recompute, opts.memory_headroom)
    if found["models_detail"] is not None:
        data["models_detail"] = found["models_detail"]
    if len(modules) == 1 and not generic:  # the winner's plan with phaze.baselines: its body printed once
        return print_module_from(texts[0], module, keys.BASELINES), data
    return print_module(module, generic=generic), data


def _check_answer(payload: Any) -> tuple[str, dict]:
    """An ``answer`` stage entry: ``(the output module's text, the JSON)``, the JSON's wall times
    left out."""
    d = fields(payload, ("text", "data"), "an answer")
    need(isinstance(d["text"], str), "the output's text")
    data = fields(d["data"], ("baselines", "search"), "the JSON")
    need(isinstance(data["baselines"], list), "the baselines")
    for rec in data["baselines"]:
        warm.check_record(rec)
    need(warm.check_stats(data["search"])["wall_s"] is None, "an answer without wall times")
    return d["text"], data


def answer(
    paths: list[str], opts, sopts: SearchOptions, log, progress: Progress | None = None, *, generic: bool = False
) -> tuple[str, dict]:
    """The search's output, ``(the module printed, in the generic form if asked, the JSON)``: from
    the stage cache when it holds the answer for these inputs (no model imported, nothing
    computed: only ``search.wall_s`` is this run's), else :func:`run`'s, kept for next time."""
    t0 = time.perf_counter()
    stages = Store.of(sopts.cache_dir)
    if sopts.backend == "local" and sopts.jobs > 1 and not all(model_known(p, stages) for p in paths):
        # A model the cache has not seen: it is imported now (torch with it), and its settings
        # will be prepared on the workers, which fork from a server importing torch meanwhile.
        from phaze.search.backend import start_fork_server

        start_fork_server(WORKER_MODULES)
    inputs = _read_inputs(paths, opts, sopts, stages)
    k = inputs.keys
    key = stages.key("answer", *k.common(k.space, k.chip, sopts.baselines, sopts.prune, generic))
    hit = stages.load("answer", key, _check_answer)
    if hit is not None:
        text, data = hit
        log("the answer is in the cache: nothing to compute")
        walls = dict.fromkeys(PHASES, 0.0)
        walls["total"] = time.perf_counter() - t0
        walls.update(dict.fromkeys(TIMERS, 0.0))
        data["search"]["wall_s"] = walls
        return text, data
    text, data = run(paths, opts, sopts, log, progress, stages=stages, inputs=inputs, generic=generic)
    walls = data["search"]["wall_s"]
    data["search"]["wall_s"] = None
    stages.keep("answer", key, {"text": text, "data": data})
    data["search"]["wall_s"] = walls
    return text, data


def _assemble(modules, names, baselines, stats, recompute: str = "auto", headroom: float = 0.0):
    """The output module (one model: its plan module; several: a module holding the chip's plan
    module of each model) with ``phaze.baselines``, and the JSON (``recompute``: the setting
    the plans were placed under)."""
    from xdsl.dialects.builtin import ArrayAttr, ModuleOp, StringAttr

    from phaze.plan.plan_output import plan_json
    from phaze_ir.attributes import BaselineAttr

    attr = ArrayAttr(
        [
            BaselineAttr.make(
                label=rec["name"],
                throughput_samples_per_s=float(rec["throughput_samples_per_s"]),
                dp=rec["dp"],
                pp=rec["pp"],
                tp=rec["tp"],
                micro_batch_size=rec["micro_batch_size"],
                accelerator=(rec["accelerator"] or {}).get("name", ""),
                area_um2=float((rec["area_mm2"] or 0.0) * 1e6),
                hbm_bytes=int(rec["hbm_bytes"]),
                note=rec["note"],
            )
            for rec in baselines
        ]
    )
    plans = []
    for module in modules:
        p = plan_json(module, [], recompute, headroom)
        p.pop("candidates", None)
        plans.append(p)
    if len(modules) == 1:
        module = modules[0]
        module.attributes[keys.BASELINES] = attr
        data = dict(plans[0])
    else:
        for mod, n in zip(modules, names):
            mod.sym_name = StringAttr(n.replace("-", "_").replace(".", "_"))
        module = ModuleOp(
            list(modules),
            attributes={keys.BASELINES: attr, keys.MODELS: ArrayAttr([StringAttr(n) for n in names])},
        )
        data = {k: v for k, v in plans[0].items() if k != "model"}
        data["models"] = names
        data["plans"] = plans
        data["warnings"] = [{**w, "model": n} for p, n in zip(plans, names) for w in p["warnings"]]
    data["baselines"] = baselines
    data["search"] = stats
    if data.get("summary"):  # one model: its plan's summary, against the best other baseline
        from phaze.plan import summary as plan_summary

        data["summary"] = plan_summary.with_runner_up(data["summary"], plan_summary.search_runner_up(baselines, data))
    return module, data
