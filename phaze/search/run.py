"""``phazec`` without ``--hw``: prepare the settings, run the search and the baselines, write
the best chip and its plans (one module per model), the JSON and the report.

Phases (each timed, with a progress bar unless ``-q``):

1. **prepare**: each model traced once per micro-batch size and sharded for each TP width
   (:mod:`phaze.search.setting`), in parallel over the backend, cached on disk by the model
   file's bytes, the options and phaze's own source;
2. **baselines**: the TPUv4-like chip with the expert placement and with the searched one, and
   the decoupled search (the best chip under the expert placement);
3. **search**: the co-optimized search over the space (:mod:`phaze.search.engine`), and with
   several models each model's own best (for the loss of the common chip);
4. **plan**: the winner compiled through the IR pipeline (``phazec --hw`` on that chip, same
   solver limits and schedule cache), checked against the search's figure.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from phaze.search import engine as E
from phaze_ir.errors import PhazeError

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
    limits: E.SolverLimits = field(default_factory=E.SolverLimits)
    baselines: bool = True
    prune: bool = True


def _source_digest() -> str:
    """A digest of phaze's Python sources: a cached setting is reused only by the code that made it."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[2]
    for pkg in ("phaze_ir", "passes"):
        for p in sorted((root / pkg).rglob("*.py")):
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _prepare_worker(args: tuple[str, int, tuple[int, ...], Any]) -> list:
    from phaze.search.setting import prepare_settings

    path, b, tps, opts = args
    return prepare_settings(path, b, tps, opts)


def prepare(paths: list[str], opts, tps: tuple[int, ...], sopts: SearchOptions, backend, log) -> list[list]:
    """Settings of every model (``[model][setting]``, micro-batch-major), from the cache where
    it has them."""
    digest = _source_digest()
    items, keys, where = [], [], []
    out: list[list] = [[None] * len(opts.micro_batches) for _ in paths]
    for m, path in enumerate(paths):
        data = Path(path).read_bytes()
        for k, b in enumerate(opts.micro_batches):
            h = hashlib.sha256(data)
            h.update(repr((digest, b, tps, opts.seq_len, opts.dtype, opts.optimizer, opts.strict)).encode())
            key = h.hexdigest()[:32]
            file = Path(sopts.cache_dir, "settings", key + ".pkl") if sopts.cache_dir else None
            if file is not None and file.exists():
                try:
                    out[m][k] = pickle.loads(file.read_bytes())
                    continue
                except Exception:
                    pass
            items.append((path, b, tps, opts))
            keys.append(file)
            where.append((m, k))
    if items:
        log(
            f"preparing {len(items)} model setting(s) (trace at each micro-batch, shard at TP {tps})"
            + (f" on {backend.jobs} {backend.name} worker(s)" if backend.jobs > 1 else "")
        )
        for (m, k), file, settings in zip(where, keys, backend.map(_prepare_worker, items)):
            out[m][k] = settings
            if file is not None:
                file.parent.mkdir(parents=True, exist_ok=True)
                tmp = file.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_bytes(pickle.dumps(settings))
                os.replace(tmp, file)
    return [[s for group in per_model for s in group] for per_model in out]


def _baseline_record(name: str, res: E.Result | None, cands: E.Candidates | None, tasks, note: str = "") -> dict:
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
    b = res.best
    acc = cands.make(b.config, b.hbm)
    s, thr, r = b.best[0]
    plan = r["plan"]
    d = acc.to_dict()
    d["hbm_bytes"] = b.hbm
    area = acc.modeled_area_um2 if acc.modeled_area_um2 is not None else acc.area_um2
    d["area_mm2"] = area / 1e6 if area is not None else None
    rec.update(
        throughput_samples_per_s=b.score,
        accelerator=d,
        dp=plan["dp"],
        pp=plan["pp"],
        tp=plan["tp"],
        micro_batch_size=plan["micro_batch"],
        area_mm2=d["area_mm2"],
        hbm_bytes=b.hbm,
    )
    if len(tasks) > 1:
        rec["per_model"] = [{"model": t.name, "throughput_samples_per_s": x[1]} for t, x in zip(tasks, b.best)]
    return rec


def _why_not(res: E.Result, ev: E.Evaluator, cands: E.Candidates, tasks) -> str:
    """'' when ``res`` found a chip; else why the first model that fits nowhere does not fit
    (on the largest HBM; "no placement fits" when the DP gives no reason)."""
    if res.best is not None:
        return ""
    for t in tasks:
        why = ev.why_not(cands, t)
        if why:
            return (f"{t.name}: " if len(tasks) > 1 else "") + why
    return "no placement fits"


def _memory_breakdown(module) -> list[dict[str, int]]:
    """Per stage of the module's plan: parameters, gradients, optimizer state, stashed
    activations, workspace (bytes; they add up to the stage's ``memory_bytes``)."""
    stages = [s.as_dict() for s in module.attributes["phaze.stages"].data]
    mem = {r["index"]: r for r in (a.as_dict() for a in module.attributes["phaze.layer_memory"].data)}
    rc = {r["index"]: r for r in (a.as_dict() for a in module.attributes["phaze.layer_recompute"].data)}
    out = []
    for s in stages:
        layers = range(s["first_layer"], s["last_layer"] + 1)
        params = sum(mem[i]["param_bytes"] for i in layers)
        grads = sum(mem[i]["grad_bytes"] for i in layers)
        opt = sum(mem[i]["optimizer_bytes"] for i in layers)
        acts = s["in_flight"] * sum(rc[i][f"{s['recompute']}_bytes"] for i in layers)
        out.append(
            {
                "params": params,
                "grads": grads,
                "optimizer": opt,
                "activations": acts,
                "workspace": max(0, s["memory_bytes"] - params - grads - opt - acts),
            }
        )
    return out


def run(paths: list[str], opts, sopts: SearchOptions, log, progress: E.Progress | None = None):
    """The whole search; returns ``(module, json_dict)``."""
    from passes.algorithms import schedule as sched
    from passes.algorithms.arch_space import load_space, paper_space
    from passes.algorithms.placement import EXPERT_PLACEMENTS, PlacementError, parse_placement
    from phaze import driver
    from phaze.search.backend import make_backend
    from phaze_ir.frontend import load_model_file
    from phaze_ir.hardware import HardwareError

    t_all = time.perf_counter()
    walls: dict[str, float] = {}
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
    experts = [EXPERT_PLACEMENTS.get(n) for n in names]
    tps = tuple(opts.tp_widths or driver.DEFAULT_TP_WIDTHS)
    extra = {f[2] for f in fixed if f} | {x[2] for x in experts if x and sopts.baselines}
    tps = tuple(sorted(set(tps) | extra))
    log(
        f"space '{space.spec.name}': {len(space):,} chips x {len(space.hbm_options)} HBM options; "
        f"micro-batch {list(opts.micro_batches)}, TP {list(tps)}; {opts.devices} devices, "
        f"global batch {opts.global_batch}"
    )

    with make_backend(sopts.backend, sopts.jobs, sopts.address) as backend:
        t0 = time.perf_counter()
        settings = prepare(paths, opts, tps, sopts, backend, log)
        walls["prepare"] = time.perf_counter() - t0
        cache = sched.ScheduleCache(Path(sopts.cache_dir, "schedules") if sopts.cache_dir else None)
        params = E.Params(opts.devices, opts.global_batch, opts.dp_overlap)
        ev = E.Evaluator(params, sopts.limits, cache, backend)
        cands = E.Candidates.of_space(space)
        chip = driver.load_accelerator(BASELINE_CHIP)
        chip_cands = E.Candidates.of_accelerator(chip)
        allowed = set(opts.tp_widths or driver.DEFAULT_TP_WIDTHS)

        def tasks_for(placements):
            out = []
            for n, ss, f in zip(names, settings, placements):
                keep = [s for s in ss if (f is not None and s.tp == f[2]) or (f is None and s.tp in allowed)]
                out.append(E.ModelTask(n, keep, f))
            return out

        baselines: dict[str, dict] = {}
        t0 = time.perf_counter()
        if sopts.baselines:
            if all(experts):
                exp_tasks = tasks_for(experts)
                res = E.search(chip_cands, exp_tasks, ev, progress=progress, label="tpuv4+expert")
                baselines["tpuv4+expert"] = _baseline_record(
                    "tpuv4+expert", res, chip_cands, exp_tasks, _why_not(res, ev, chip_cands, exp_tasks)
                )
            else:
                missing = ", ".join(n for n, x in zip(names, experts) if not x)
                for b in ("tpuv4+expert", "decoupled"):
                    baselines[b] = _baseline_record(b, None, None, [], f"no expert placement known for {missing}")
            ph_tasks = tasks_for([None] * len(names))
            res = E.search(chip_cands, ph_tasks, ev, progress=progress, label="tpuv4+phaze")
            baselines["tpuv4+phaze"] = _baseline_record(
                "tpuv4+phaze", res, chip_cands, ph_tasks, _why_not(res, ev, chip_cands, ph_tasks)
            )
            if all(experts):
                res = E.search(cands, exp_tasks, ev, prune=sopts.prune, progress=progress, label="decoupled")
                baselines["decoupled"] = _baseline_record(
                    "decoupled", res, cands, exp_tasks, _why_not(res, ev, cands, exp_tasks)
                )
        walls["baselines"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        tasks = tasks_for(fixed)
        result = E.search(cands, tasks, ev, prune=sopts.prune, progress=progress, label="search")
        own: list[E.Result] = []
        if len(tasks) > 1:
            for t in tasks:
                own.append(E.search(cands, [t], ev, prune=sopts.prune, progress=progress, label=f"{t.name} alone"))
        walls["search"] = time.perf_counter() - t0
    if result.best is None:
        raise PhazeError(
            "no chip of the space fits a placement of "
            + ", ".join(names)
            + f" on {opts.devices} devices: {_why_not(result, ev, cands, tasks)}"
        )
    best = result.best
    baselines["co-optimized"] = _baseline_record("co-optimized", result, cands, tasks)
    for name in BASELINES:
        rec = baselines.get(name)
        if rec is not None:
            thr = rec["throughput_samples_per_s"]
            rec["speedup"] = best.score / thr if thr else None

    # The winner through the IR pipeline, same limits and cache: the plan file's numbers.
    t0 = time.perf_counter()
    acc = cands.make(best.config, best.hbm)
    lim = sopts.limits
    popts = replace(
        opts,
        schedule_time_limit=lim.time_limit,
        schedule_gap=lim.gap_limit,
        schedule_nodes=lim.node_limit or 0,
        schedule_max_binaries=lim.max_binaries or 0,
        micro_batches=(1,),
        tp_widths=None,
        schedule_cache=cache,  # the search's schedules: the winner's layers are solved already
    )
    modules = []
    for m, path in enumerate(paths):
        s, thr, _ = best.best[m]
        st = tasks[m].settings[s]
        log(f"compiling the plan of {names[m]} on {acc.name} (micro-batch {st.micro_batch}, TP {st.tp})")
        mopts = replace(popts, micro_batches=(st.micro_batch,), tp_widths=(st.tp,))
        module, _ = driver.compile_model(path, mopts, lambda msg: None, accelerator=acc)
        got = driver.plan_record(module).get("throughput_samples_per_s", 0.0)
        if abs(got - thr) > 1e-9 * max(thr, 1.0):
            raise PhazeError(
                f"internal error: the plan of {names[m]} gives {got} samples/s, "
                f"the search {thr}; please report this"
            )
        modules.append(module)
    walls["plan"] = time.perf_counter() - t0
    walls["total"] = time.perf_counter() - t_all
    walls.update({k: v for k, v in ev.timers.items()})

    search_stats = dict(result.stats)
    search_stats.update(
        space=space.spec.name,
        wall_s=walls,
        evaluator=ev.counts,
        points=[
            {
                "area_mm2": e.area_um2 / 1e6,
                "throughput_samples_per_s": e.score,
                "hbm_bytes": e.hbm,
                "label": cands.make(e.config, e.hbm).name,
                "best": e is best,
            }
            for e in result.evaluated
        ],
        solver={
            "time_limit_s": lim.time_limit,
            "gap_limit": lim.gap_limit,
            "node_limit": lim.node_limit,
            "max_binaries": lim.max_binaries,
            "seed": lim.seed,
        },
    )
    module, data = _assemble(modules, names, [baselines[b] for b in BASELINES if b in baselines], search_stats)
    if len(tasks) > 1:
        data["models_detail"] = [
            {
                "model": n,
                "throughput_samples_per_s": best.best[m][1],
                "own_best_samples_per_s": own[m].best.score if own[m].best else 0.0,
                "loss": 1 - best.best[m][1] / own[m].best.score if own[m].best and own[m].best.score else None,
            }
            for m, n in enumerate(names)
        ]
    return module, data


def _assemble(modules, names, baselines, stats):
    """The output module (one model: its plan module; several: a module holding the chip's plan
    module of each model) with ``phaze.baselines``, and the JSON."""
    from xdsl.dialects.builtin import ArrayAttr, ModuleOp, StringAttr

    from phaze import driver
    from phaze_ir.attributes import BaselineAttr

    attr = ArrayAttr(
        [
            BaselineAttr.make(
                label=b["name"],
                throughput_samples_per_s=float(b["throughput_samples_per_s"]),
                dp=b["dp"],
                pp=b["pp"],
                tp=b["tp"],
                micro_batch_size=b["micro_batch_size"],
                accelerator=(b["accelerator"] or {}).get("name", ""),
                area_um2=float((b["area_mm2"] or 0.0) * 1e6),
                hbm_bytes=int(b["hbm_bytes"]),
                note=b["note"],
            )
            for b in baselines
        ]
    )
    plans = []
    for module in modules:
        p = driver.plan_json(module, [])
        p.pop("candidates", None)
        for st, mem in zip(p["stages"], _memory_breakdown(module)):
            st["memory"] = mem
        plans.append(p)
    if len(modules) == 1:
        module = modules[0]
        module.attributes["phaze.baselines"] = attr
        data = dict(plans[0])
    else:
        for mod, n in zip(modules, names):
            mod.sym_name = StringAttr(n.replace("-", "_").replace(".", "_"))
        module = ModuleOp(
            list(modules),
            attributes={"phaze.baselines": attr, "phaze.models": ArrayAttr([StringAttr(n) for n in names])},
        )
        data = {k: v for k, v in plans[0].items() if k != "model"}
        data["models"] = names
        data["plans"] = plans
    data["baselines"] = baselines
    data["search"] = stats
    return module, data
