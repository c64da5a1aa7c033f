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
"""

from __future__ import annotations

import hashlib
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from passes.algorithms.cache_file import BadEntry, read_entry, write_entry
from phaze.search.engine import (
    Candidates,
    Evaluated,
    Evaluator,
    ModelTask,
    Params,
    Progress,
    Result,
    SolverLimits,
    search,
)
from phaze_ir import keys
from phaze_ir.errors import PhazeError, PhazeWarning

BASELINE_CHIP = "tpuv4"
#: Names of the baselines, in report order.
BASELINES = ("tpuv4+expert", "tpuv4+phaze", "decoupled", "co-optimized")


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


#: The settings cache's file format (:mod:`passes.algorithms.cache_file`) and its version.
SETTINGS_FORMAT = "phaze-settings"
SETTINGS_VERSION = 1


def _source_digest() -> str:
    """A digest of phaze's Python sources: a cached setting is reused only by the code that made it."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[2]
    for pkg in ("phaze_ir", "passes", "phaze"):
        for p in sorted((root / pkg).rglob("*.py")):
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _prepare_worker(args: tuple[str, int, tuple[int, ...], Any]) -> list:
    from phaze.search.setting import prepare_settings

    path, micro_batch, tps, opts = args
    return prepare_settings(path, micro_batch, tps, opts)


def _cached_settings(file: Path, input_hash: str, micro_batch: int, tps: tuple[int, ...]) -> list | None:
    """The settings kept in ``file`` for ``input_hash`` (a model at ``micro_batch``, sharded for
    some of ``tps``), or None when there is no such file or it fails a check (the format, the
    version, the hashes, the schema: then one warning says which and why)."""
    from phaze.search.setting import Setting

    if not file.exists():
        return None
    try:
        payload = read_entry(file, SETTINGS_FORMAT, SETTINGS_VERSION, input_hash)
        if not isinstance(payload, list) or not payload:
            raise BadEntry("does not hold a list of settings")
        try:
            settings = [Setting.from_json(s) for s in payload]
        except ValueError as e:
            raise BadEntry(f"does not hold valid settings ({e})") from None
        if any(s.micro_batch != micro_batch or s.tp not in tps for s in settings):
            raise BadEntry(f"holds settings of another micro-batch or TP width than {micro_batch} and {tps}")
    except BadEntry as e:
        warnings.warn(f"settings cache entry {file} {e}: ignored, prepared again", PhazeWarning, stacklevel=2)
        return None
    return settings


def _keep_settings(file: Path, input_hash: str, settings: list) -> bool:
    """Write ``settings`` to ``file``; False (after a warning) when the directory is not usable."""
    try:
        write_entry(file, SETTINGS_FORMAT, SETTINGS_VERSION, input_hash, [s.to_json() for s in settings])
    except OSError as e:
        warnings.warn(
            f"cache directory {file.parent} is not usable ({e.strerror or e}); prepared settings are not kept",
            PhazeWarning,
            stacklevel=2,
        )
        return False
    return True


def prepare(paths: list[str], opts, tps: tuple[int, ...], sopts: SearchOptions, backend, log) -> list[list]:
    """Settings of every model (``[model][setting]``, micro-batch-major), from the cache where
    it has them (``<cache>/settings/<key>.json``, checked before use: never code)."""
    digest = _source_digest()
    items, files, where = [], [], []
    out: list[list] = [[None] * len(opts.micro_batches) for _ in paths]
    for m, path in enumerate(paths):
        data = Path(path).read_bytes()
        for k, micro_batch in enumerate(opts.micro_batches):
            h = hashlib.sha256(data)
            h.update(repr((digest, micro_batch, tps, opts.seq_len, opts.dtype, opts.optimizer, opts.strict)).encode())
            input_hash = h.hexdigest()
            file = Path(sopts.cache_dir, "settings", input_hash[:32] + ".json") if sopts.cache_dir else None
            if file is not None:
                cached = _cached_settings(file, input_hash, micro_batch, tps)
                if cached is not None:
                    out[m][k] = cached
                    continue
            items.append((path, micro_batch, tps, opts))
            files.append((file, input_hash))
            where.append((m, k))
    if items:
        log(
            f"preparing {len(items)} model setting(s) (trace at each micro-batch, shard at TP {tps})"
            + (f" on {backend.jobs} {backend.name} worker(s)" if backend.jobs > 1 else "")
        )
        keep = True
        for (m, k), (file, input_hash), settings in zip(where, files, backend.map(_prepare_worker, items)):
            out[m][k] = settings
            if file is not None and keep:
                keep = _keep_settings(file, input_hash, settings)
    return [[s for group in per_model for s in group] for per_model in out]


def _baseline_record(name: str, res: Result | None, cands: Candidates | None, tasks, note: str = "") -> dict:
    """The JSON record of a baseline (or of the co-optimized answer): its chip, throughput and
    placement, or zeros and a note saying why there is none."""
    rec = {
        "name": name,
        "throughput_samples_per_s": 0.0,
        "accelerator": None,
        "dp": 0,
        "pp": 0,
        "tp": 0,
        "micro_batch_size": 0,
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
    plans = [dp_result["plan"] for _, _, dp_result in winner.best if dp_result is not None]
    plan = next((p for p in plans if p is not None), None)
    chip = acc.to_dict()
    chip["hbm_bytes"] = winner.hbm
    area = acc.modeled_area_um2 if acc.modeled_area_um2 is not None else acc.area_um2
    chip["area_mm2"] = area / 1e6 if area is not None else None
    rec.update(
        throughput_samples_per_s=winner.score,
        accelerator=chip,
        dp=plan["dp"] if plan else 0,
        pp=plan["pp"] if plan else 0,
        tp=plan["tp"] if plan else 0,
        micro_batch_size=plan["micro_batch"] if plan else 0,
        area_mm2=chip["area_mm2"],
        hbm_bytes=winner.hbm,
    )
    if len(tasks) > 1:
        rec["per_model"] = [{"model": t.name, "throughput_samples_per_s": x[1]} for t, x in zip(tasks, winner.best)]
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
    return "no placement fits"


@contextmanager
def _timed(walls: dict[str, float], phase: str) -> Iterator[None]:
    """Record the wall time of a phase in ``walls`` (the JSON's ``search.wall_s``)."""
    t0 = time.perf_counter()
    yield
    walls[phase] = time.perf_counter() - t0


@dataclass
class _Inputs:
    """The checked inputs of a search: the space, the models' names, per model the placement
    given with ``--placement`` (None: searched) and the paper's expert one (None: unknown), and
    the TP widths to prepare."""

    space: Any
    names: list[str]
    fixed: list[tuple[int, int, int] | None]
    experts: list[tuple[int, int, int] | None]
    tps: tuple[int, ...]


def _read_inputs(paths: list[str], opts, sopts: SearchOptions) -> _Inputs:
    """Load the space and the model files and check them, before anything slow (a wrong
    argument is a one-line error, not one after the preparation)."""
    from passes.algorithms.arch_space import load_space, paper_space
    from passes.algorithms.placement import EXPERT_PLACEMENTS, PlacementError, parse_placement, parse_recompute
    from phaze import driver
    from phaze_ir.frontend import load_model_file
    from phaze_ir.hardware import HardwareError

    if opts.emit != "plan":
        raise PhazeError("the architecture search writes a plan: give --hw to stop at an earlier stage")
    try:
        space = load_space(sopts.space) if sopts.space else paper_space()
    except HardwareError as e:
        raise PhazeError(str(e)) from e
    specs = [load_model_file(p) for p in paths]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise PhazeError(f"the same model twice: {', '.join(names)}")
    try:
        fixed = [parse_placement(opts.placement, n) for n in names]
    except PlacementError as e:
        raise PhazeError(f"--placement: {e}") from e
    try:
        parse_recompute(opts.recompute)
    except PlacementError as e:
        raise PhazeError(f"--recompute: {e}") from e
    experts = [EXPERT_PLACEMENTS.get(n) for n in names]
    # Besides the widths searched, those of the given placements and of the experts' baselines.
    tps = tuple(opts.tp_widths or driver.DEFAULT_TP_WIDTHS)
    extra = {f[2] for f in fixed if f} | {x[2] for x in experts if x and sopts.baselines}
    return _Inputs(space, names, fixed, experts, tuple(sorted(set(tps) | extra)))


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


def _run_baselines(
    inputs: _Inputs,
    tasks_for: Callable[[list], list[ModelTask]],
    ev: Evaluator,
    cands: Candidates,
    chip_cands: Candidates,
    sopts: SearchOptions,
    progress: Progress | None,
) -> dict[str, dict]:
    """The baselines' records: the TPUv4-like chip with the expert placement and with the
    searched one, and the decoupled search (the space's best chip under the expert placement).
    They run before the co-optimized search, in this order, on the same evaluator: the schedules
    they solve are the search's to reuse, and the evaluator's counts depend on the order."""
    names, experts = inputs.names, inputs.experts
    baselines: dict[str, dict] = {}
    if all(experts):
        exp_tasks = tasks_for(experts)
        res = search(chip_cands, exp_tasks, ev, progress=progress, label="tpuv4+expert")
        baselines["tpuv4+expert"] = _baseline_record(
            "tpuv4+expert", res, chip_cands, exp_tasks, _why_not(res, ev, chip_cands, exp_tasks)
        )
    else:
        missing = ", ".join(n for n, x in zip(names, experts) if not x)
        for name in ("tpuv4+expert", "decoupled"):
            baselines[name] = _baseline_record(name, None, None, [], f"no expert placement known for {missing}")
    ph_tasks = tasks_for([None] * len(names))
    res = search(chip_cands, ph_tasks, ev, progress=progress, label="tpuv4+phaze")
    baselines["tpuv4+phaze"] = _baseline_record(
        "tpuv4+phaze", res, chip_cands, ph_tasks, _why_not(res, ev, chip_cands, ph_tasks)
    )
    if all(experts):
        res = search(cands, exp_tasks, ev, prune=sopts.prune, progress=progress, label="decoupled")
        baselines["decoupled"] = _baseline_record(
            "decoupled", res, cands, exp_tasks, _why_not(res, ev, cands, exp_tasks)
        )
    return baselines


def _co_optimize(
    cands: Candidates, tasks: list[ModelTask], ev: Evaluator, sopts: SearchOptions, progress: Progress | None
) -> tuple[Result, list[Result]]:
    """The search proper, and with several models each model's own best (for the loss each
    model takes on the common chip)."""
    result = search(cands, tasks, ev, prune=sopts.prune, progress=progress, label="search")
    own: list[Result] = []
    if len(tasks) > 1:
        for t in tasks:
            own.append(search(cands, [t], ev, prune=sopts.prune, progress=progress, label=f"{t.name} alone"))
    return result, own


def _add_speedups(baselines: dict[str, dict], best: Evaluated) -> None:
    """Each baseline's ``speedup``: the co-optimized score over its throughput (None for 0)."""
    for name in BASELINES:
        rec = baselines.get(name)
        if rec is not None:
            thr = rec["throughput_samples_per_s"]
            rec["speedup"] = best.score / thr if thr else None


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


def _compile_winner(
    paths: list[str], names: list[str], tasks: list[ModelTask], best: Evaluated, acc, wopts, log
) -> list:
    """Each model's plan module on the winning chip, through the IR pipeline (``phazec --hw``)
    at the setting the search chose: the plan file's numbers come from the passes, and each
    must equal the search's figure."""
    from phaze import driver

    modules = []
    for m, path in enumerate(paths):
        setting_idx, thr, _ = best.best[m]
        setting = tasks[m].settings[setting_idx]
        log(f"compiling the plan of {names[m]} on {acc.name} (micro-batch {setting.micro_batch}, TP {setting.tp})")
        mopts = replace(wopts, micro_batches=(setting.micro_batch,), tp_widths=(setting.tp,))
        module, _ = driver.compile_model(path, mopts, lambda msg: None, accelerator=acc)
        _check_plan_matches_search(names[m], driver.plan_record(module).get("throughput_samples_per_s", 0.0), thr)
        modules.append(module)
    return modules


def _check_plan_matches_search(name: str, got: float, thr: float) -> None:
    """The compiled plan's throughput must be the search's (same schedules, same DP): a
    difference is a bug, never the user's input."""
    if abs(got - thr) > 1e-9 * max(thr, 1.0):
        raise PhazeError(
            f"internal error: the plan of {name} gives {got} samples/s, the search {thr}; please report this"
        )


def _search_statistics(
    result: Result, space, walls: dict[str, float], ev: Evaluator, cands: Candidates, limits: SolverLimits
) -> dict[str, Any]:
    """The JSON's ``search`` object: the search's counts, then the space, the wall times, the
    evaluator's counts, every architecture evaluated exactly (the report's scatter plot) and
    the solver limits."""
    stats = dict(result.stats)
    stats.update(
        space=space.spec.name,
        wall_s=walls,
        evaluator=ev.counts,
        points=[
            {
                "area_mm2": e.area_um2 / 1e6,
                "throughput_samples_per_s": e.score,
                "hbm_bytes": e.hbm,
                "label": cands.make(e.config, e.hbm).name,
                "best": e is result.best,
            }
            for e in result.evaluated
        ],
        solver={
            "time_limit_s": limits.time_limit,
            "gap_limit": limits.gap_limit,
            "node_limit": limits.node_limit,
            "max_binaries": limits.max_binaries,
            "seed": limits.seed,
        },
    )
    return stats


def _models_detail(names: list[str], best: Evaluated, own: list[Result]) -> list[dict]:
    """With several models: each model's throughput on the common chip, on its own best chip,
    and the loss between the two."""
    details = []
    for m, name in enumerate(names):
        on_common = best.best[m][1]
        own_best = own[m].best
        details.append(
            {
                "model": name,
                "throughput_samples_per_s": on_common,
                "own_best_samples_per_s": own_best.score if own_best else 0.0,
                "loss": 1 - on_common / own_best.score if own_best and own_best.score else None,
            }
        )
    return details


def run(paths: list[str], opts, sopts: SearchOptions, log, progress: Progress | None = None):
    """The whole search; returns ``(module, json_dict)``: the phases of the module docstring,
    each timed into ``search.wall_s`` (with the evaluator's own timers after them)."""
    from passes.algorithms import schedule as sched
    from phaze import driver
    from phaze.search.backend import make_backend

    t_all = time.perf_counter()
    walls: dict[str, float] = {}
    inputs = _read_inputs(paths, opts, sopts)
    space, names = inputs.space, inputs.names
    log(
        f"space '{space.spec.name}': {len(space):,} chips x {len(space.hbm_options)} HBM options; "
        f"micro-batch {list(opts.micro_batches)}, TP {list(inputs.tps)}; {opts.devices} devices, "
        f"global batch {opts.global_batch}" + (f"; recompute {opts.recompute}" if opts.recompute != "auto" else "")
    )

    with make_backend(sopts.backend, sopts.jobs, sopts.address) as backend:
        with _timed(walls, "prepare"):
            settings = prepare(paths, opts, inputs.tps, sopts, backend, log)
        cache = sched.ScheduleCache(Path(sopts.cache_dir, "schedules") if sopts.cache_dir else None)
        ev = Evaluator(
            Params(opts.devices, opts.global_batch, opts.dp_overlap, opts.recompute), sopts.limits, cache, backend
        )
        cands = Candidates.of_space(space)
        chip_cands = Candidates.of_accelerator(driver.load_accelerator(BASELINE_CHIP))
        allowed = set(opts.tp_widths or driver.DEFAULT_TP_WIDTHS)

        def tasks_for(placements: list) -> list[ModelTask]:
            return _tasks_for(names, settings, placements, allowed)

        with _timed(walls, "baselines"):
            baselines = (
                _run_baselines(inputs, tasks_for, ev, cands, chip_cands, sopts, progress) if sopts.baselines else {}
            )
        with _timed(walls, "search"):
            tasks = tasks_for(inputs.fixed)
            result, own = _co_optimize(cands, tasks, ev, sopts, progress)
    if result.best is None:
        raise PhazeError(
            "no chip of the space fits a placement of "
            + ", ".join(names)
            + f" on {opts.devices} devices: {_why_not(result, ev, cands, tasks)}"
        )
    best = result.best
    baselines["co-optimized"] = _baseline_record("co-optimized", result, cands, tasks)
    _add_speedups(baselines, best)

    with _timed(walls, "plan"):
        acc = cands.make(best.config, best.hbm)
        modules = _compile_winner(paths, names, tasks, best, acc, _winner_options(opts, sopts.limits, cache), log)
    walls["total"] = time.perf_counter() - t_all
    walls.update(ev.timers)

    search_stats = _search_statistics(result, space, walls, ev, cands, sopts.limits)
    module, data = _assemble(
        modules, names, [baselines[b] for b in BASELINES if b in baselines], search_stats, opts.recompute
    )
    if len(tasks) > 1:
        data["models_detail"] = _models_detail(names, best, own)
    return module, data


def _assemble(modules, names, baselines, stats, recompute: str = "auto"):
    """The output module (one model: its plan module; several: a module holding the chip's plan
    module of each model) with ``phaze.baselines``, and the JSON (``recompute``: the setting
    the plans were placed under)."""
    from xdsl.dialects.builtin import ArrayAttr, ModuleOp, StringAttr

    from phaze import driver
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
        p = driver.plan_json(module, [], recompute)
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
    return module, data
