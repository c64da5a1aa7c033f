"""Fit the ``[calibration]`` of the ``a100`` description on the development part of vTrain's
measured runs (data/vtrain/; the held-apart fifth is never read here).

    python benchmarks/calibrate_a100.py [-j N] [--kernels megatron|ops|eager|inductor] [--keep FILE]

Fixed, not fitted: ``execution = "serial"`` (Megatron runs one CUDA stream: one kernel at a time
on the whole GPU) and the wave quantisation, 64 x 64 output tiles over A100's 108 SMs (the tile
that best explains the H100 GEMM measurements, ``benchmarks/gpu/fit_h100.py``; there are no A100
GEMM measurements here).  Fitted, one set for all runs of both files: ``tensor_efficiency``,
``memory_efficiency``, ``kernel_overhead_s`` and ``host_dispatch_s``.

The runs are priced as the runtime that ran them launched its kernels: ``--kernels megatron``
(default: the vTrain runs are Megatron-DeepSpeed's GPT, with Megatron's fused kernels;
``phaze-form-kernels{runtime=megatron}``, ``phazec --kernels megatron``); ``--kernels ops`` (every
op its own kernel, phaze's model before kernels were formed) fits the same four numbers on the
unfused graph, to compare.  The ``phaze-validate`` figures of a fit need the same ``--kernels``.

How: every (model, micro-batch, TP) of the development runs is traced and compiled once through
the cost passes (``phaze.validate.compiled_modules``, the kernels formed as ``--kernels`` says);
what the fit needs is kept: each op's description (its kernel's launches and on-chip bytes
included) and its (layer, phase), and each layer's numbers for the placement DP.  A candidate
calibration is then priced exactly as the pipeline prices it, without recompiling: each op's
latency by ``estimate_chip`` on the calibrated chip, each layer's forward, backward and optimizer
step as the serial schedule of its ops (``passes/algorithms/schedule/serial.py``), and each run
by the Rust DP at its fixed placement.  The fit minimises the mean squared log error of each
file, averaged over the two files (each file weighs the same), by Powell's method within the
bounds from a grid's best point.  ``--keep FILE`` keeps the compilations (about 15 minutes on 2
cores, quiet) for the next run (minutes); a kept file answers only the ``--kernels`` it was
compiled for.  It prints the TOML to paste into ``phaze_ir/hw_presets/a100.toml`` and the
development error, at the fit and at the preset's values; the figures to report are
``phaze-validate``'s with that file and the same ``--kernels`` (they agree with the ones here:
same formulas).  ``--kinds`` also prints, at the fitted values, each op kind's share of a
layer's time and how it goes with the error (which kinds the runs priced high or low spend
their time in).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import pickle
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from passes.algorithms import _phaze_rs  # noqa: E402
from passes.algorithms.latency import ViewDesc, estimate_chip  # noqa: E402
from passes.algorithms.placement_options import PlacementOptions  # noqa: E402
from passes.algorithms.schedule import phase_groups, serial_times  # noqa: E402
from passes.cost_view import Describer  # noqa: E402
from passes.graph_view import build_graph, read_layers, step_function  # noqa: E402
from passes.place_devices import build_problem  # noqa: E402
from phaze.search.backend import make_backend  # noqa: E402
from phaze.validate import (  # noqa: E402
    KERNELS,
    JobResult,
    Settings,
    assign_splits,
    compiled_modules,
    jobs_of,
    pricing_options,
    read_runs,
)
from phaze_ir.errors import PhazeError  # noqa: E402
from phaze_ir.hardware import Calibration, load_hardware  # noqa: E402

FILES = [os.path.join(ROOT, "data", "vtrain", f) for f in ("ground_truth_single.csv", "ground_truth_multi.csv")]
WAVE = {"wave_tile_m": 64, "wave_tile_n": 64, "wave_units": 108}  #: A100: 108 SMs (whitepaper)
PARAMS = ("tensor_efficiency", "memory_efficiency", "kernel_overhead_s", "host_dispatch_s")
#: What a --keep file holds (a file of another version or runtime is compiled again).
KEEP_VERSION = 2


def op_label(o) -> str:
    """What kind of op ``o`` is, for ``--kinds``: ``matmul``, ``elementwise:gelu``, ... (its name
    without the dialect, and its ``kind`` property when it has one)."""
    name = o.name.removeprefix("phaze.")
    kind = o.properties.get("kind")
    return f"{name}:{kind.data}" if kind is not None and hasattr(kind, "data") else name


def extract(work) -> list[dict]:
    """What pricing needs of a job's compiled modules, one dict per TP width (a worker's task)."""
    settings, job = work
    out = []
    for _key, runs, module, _, _ in compiled_modules(job, settings, JobResult([])):
        if isinstance(module, PhazeError):
            continue
        graph, ops = build_graph(step_function(module))
        describe = Describer()
        descs = []
        for o in ops:
            d = describe(o)[1]
            descs.append(ViewDesc() if d is None else d)
        labels = [op_label(o) for o in ops]
        groups = phase_groups(graph, read_layers(ops))
        # Priced as phaze-validate prices the run: full recompute (the vTrain runs'), its
        # pipeline schedule, rank order (Megatron-DeepSpeed numbered them tp-dp-pp) and
        # pipeline transfers (split over the TP group by DeepSpeed's pipeline engine).
        problems = [
            (
                r.row,
                r.measured_s,
                r.pp,
                r.dp,
                build_problem(
                    module,
                    PlacementOptions(
                        devices=r.gpus,
                        global_batch=r.global_batch,
                        recompute="full",
                        pipeline_schedule=r.pipeline_schedule,
                        rank_order=r.rank_order,
                        pipeline_transfer=r.pipeline_transfer,
                    ),
                    "fit",
                ),
            )
            for r in runs
        ]
        out.append({"descs": descs, "labels": labels, "groups": groups, "runs": problems})
    return out


class Fit:
    """The development runs, ready to be priced at any calibration: ``items`` as :func:`extract`
    gives them, in file order, ``sizes`` the number of runs of each file."""

    def __init__(self, items: list[dict], sizes: list[int]):
        self.descs: list = []
        index: dict = {}
        self.items = []
        #: per item, each (layer, phase)'s op labels (``--kinds``)
        self.labels: list[dict] = []
        for it in items:
            idx = np.array([index.setdefault(d, len(index)) for d in it["descs"]], dtype=np.int64)
            groups = {key: idx[np.asarray(ids)] for key, ids in it["groups"].items()}
            self.items.append((groups, it["runs"]))
            self.labels.append({key: [it["labels"][i] for i in ids] for key, ids in it["groups"].items()})
        self.descs = list(index)
        self.measured = np.array([r[1] for _, runs in self.items for r in runs])
        #: the runs of each file (slices of ``measured`` and of what ``predict`` returns)
        self.parts: list[slice] = []
        start = 0
        for n in sizes:
            self.parts.append(slice(start, start + n))
            start += n

    def latencies(self, values: dict) -> tuple[np.ndarray, float]:
        """Each distinct op's latency on the a100 calibrated with ``values``, and the host's
        seconds per issued op."""
        cal = Calibration(execution="serial", **WAVE, **values)
        acc = dataclasses.replace(load_hardware("a100"), calibration=cal)
        return estimate_chip(self.descs, acc).split[:, 0], cal.host_dispatch_s

    def predict(self, values: dict) -> np.ndarray:
        lat, dispatch = self.latencies(values)
        out = []
        for groups, runs in self.items:
            span = {key: serial_times(lat[ids].tolist(), dispatch)[1] for key, ids in groups.items()}
            for _, _, pp, dp, problem in runs:
                layers = [dict(x) for x in problem["layers"]]
                for i, layer in enumerate(layers):
                    fwd = span.get((i, "fwd"), 0.0)
                    layer["fwd_s"] = fwd
                    layer["bwd_s"] = span.get((i, "bwd"), 0.0)
                    rec = list(layer["recompute_s"])
                    rec[2] = fwd
                    layer["recompute_s"] = rec
                    # the optimizer step, once per batch, priced as phaze-schedule-ops prices it
                    old_opt = layer["opt_s"]
                    layer["opt_s"] = span.get((i, "opt"), 0.0)
                    share = layer["expert_opt_s"] / old_opt if old_opt > 0 else 0.0
                    layer["expert_opt_s"] = min(layer["opt_s"], layer["opt_s"] * share)
                res = _phaze_rs.evaluate_placement({**problem, "layers": layers}, pp, dp)
                out.append(res["plan"]["time_per_batch_s"] if res["feasible"] else np.nan)
        return np.array(out)

    def kinds(self, values: dict, top: int = 16) -> str:
        """Per file, each op kind's share of a micro-batch's time per layer (forward twice, for
        the full recompute, and backward; the host's waits as ``(host wait)``; the optimizer
        step apart) at ``values``: its mean over the runs, over the runs priced more than 10 %
        high and more than 10 % low, and its correlation with the log error."""
        lat, dispatch = self.latencies(values)
        log_err = np.log(self.predict(values) / self.measured)
        shares: list[dict[str, float]] = []
        for (groups, runs), labels in zip(self.items, self.labels, strict=True):
            t: dict[str, float] = {"(host wait)": 0.0}
            for key, ids in groups.items():
                if key[1] == "opt":
                    continue
                weight = 2.0 if key[1] == "fwd" else 1.0  # full recompute: the forward again
                x = lat[ids]
                for label, sec in zip(labels[key], x, strict=True):
                    t[label] = t.get(label, 0.0) + weight * sec
                t["(host wait)"] += weight * (serial_times(x.tolist(), dispatch)[1] - float(x.sum()))
            total = sum(t.values()) or 1.0
            shares += [{k: v / total for k, v in t.items()} for _ in runs]
        lines = []
        for path, part in zip(FILES, self.parts, strict=True):
            e = log_err[part]
            ok = np.isfinite(e)
            rows = [shares[i] for i in range(part.start, part.stop)]
            names = sorted({k for r in rows for k in r}, key=lambda k: -np.mean([r.get(k, 0.0) for r in rows]))
            high, low = e > np.log(1.1), e < np.log(0.9)
            lines.append(
                f"{os.path.basename(path)}: {int(ok.sum())} runs, {int(high.sum())} priced > +10 %, "
                f"{int(low.sum())} < -10 %"
            )
            lines.append(f"  {'op kind':<28} {'share':>6} {'> +10%':>7} {'< -10%':>7} {'corr':>6}")
            for k in names[:top]:
                x = np.array([r.get(k, 0.0) for r in rows])
                corr = np.corrcoef(x[ok], e[ok])[0, 1] if np.std(x[ok]) > 0 else 0.0
                hi = f"{np.mean(x[high]):7.1%}" if high.any() else f"{'-':>7}"
                lo = f"{np.mean(x[low]):7.1%}" if low.any() else f"{'-':>7}"
                lines.append(f"  {k:<28} {np.mean(x):6.1%} {hi} {lo} {corr:+6.2f}")
        return "\n".join(lines)

    def summaries(self, values: dict) -> str:
        p = self.predict(values)
        return "; ".join(
            f"{os.path.basename(path)}: {summary(p[part], self.measured[part])}"
            for path, part in zip(FILES, self.parts, strict=True)
        )

    def loss(self, x) -> float:
        values = dict(zip(PARAMS, x, strict=True))
        if not (0 < values["tensor_efficiency"] <= 1 and 0 < values["memory_efficiency"] <= 1):
            return 1e9
        if values["kernel_overhead_s"] < 0 or values["host_dispatch_s"] < 0:
            return 1e9
        p = self.predict(values)
        # Each file weighs the same: the single-node file has 13x the runs of the multi-node
        # one, and a loss per run would fit one node and leave the large runs behind.
        total = 0.0
        for part in self.parts:
            ok = np.isfinite(p[part])
            total += float(np.mean(np.log(p[part][ok] / self.measured[part][ok]) ** 2))
        return total / len(self.parts)


def summary(pred: np.ndarray, measured: np.ndarray) -> str:
    ok = np.isfinite(pred)
    e = np.abs(pred[ok] / measured[ok] - 1)
    mean = np.mean(pred[ok] / measured[ok] - 1)
    return f"median |error| {np.median(e):.1%}, p90 {np.percentile(e, 90):.1%}, mean {mean:+.1%} ({ok.sum()} runs)"


def main() -> None:
    from scipy.optimize import minimize

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument(
        "--kernels",
        default="megatron",
        choices=KERNELS,
        help="the runtime whose kernels price the runs (default megatron: Megatron's fused kernels, as the "
        "vTrain runs ran; ops: every op its own kernel)",
    )
    ap.add_argument(
        "--fix",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"hold a parameter at VALUE instead of fitting it (of {', '.join(PARAMS)}; repeatable)",
    )
    ap.add_argument(
        "--kinds", action="store_true", help="also print each op kind's share of the runs' time, and its error"
    )
    ap.add_argument(
        "--keep",
        metavar="FILE",
        help="keep what the compilations give in FILE (a pickle this script wrote) and reuse it on the "
        "next run: the network, the hardware and the fit can change, not the models or the passes",
    )
    args = ap.parse_args()

    fixed: dict[str, float] = {}
    for item in args.fix:
        name, _, value = item.partition("=")
        try:
            fixed[name] = float(value)
        except ValueError:
            ap.error(f"--fix {item}: expected NAME=VALUE with a number")
        if name not in PARAMS:
            ap.error(f"--fix {item}: {name!r} is not one of {', '.join(PARAMS)}")
    start = time.perf_counter()
    base = dataclasses.replace(load_hardware("a100"), calibration=Calibration(execution="serial", **WAVE))
    settings = Settings(pricing_options("a100", kernels=args.kernels), accelerator=base, quiet=True)
    items: list[dict] = []
    kept = None
    if args.keep and os.path.exists(args.keep):
        with open(args.keep, "rb") as f:
            kept = pickle.load(f)
        if not (isinstance(kept, dict) and kept.get("version") == KEEP_VERSION):
            sys.exit(f"calibrate_a100: {args.keep} is not a file this version of the script kept; delete it")
        if kept["kernels"] != args.kernels:
            sys.exit(f"calibrate_a100: {args.keep} holds the compilations of --kernels {kept['kernels']}")
        items = kept["items"]
    else:
        for path in FILES:
            file_runs = [r for r in assign_splits(read_runs(path)) if r.split == "dev"]
            with make_backend("local", args.jobs, None) as be:
                for res in be.map(extract, [(settings, j) for j in jobs_of(file_runs)]):
                    items += res
        if args.keep:
            with open(args.keep, "wb") as f:
                pickle.dump({"version": KEEP_VERSION, "kernels": args.kernels, "items": items}, f)
    sizes = [sum(1 for r in assign_splits(read_runs(path)) if r.split == "dev") for path in FILES]
    fit = Fit(items, sizes)
    took = time.perf_counter() - start
    print(f"compiled {len(fit.measured)} development runs ({args.kernels} kernels) in {took:.0f} s", file=sys.stderr)

    zero = {"tensor_efficiency": 1.0, "memory_efficiency": 1.0, "kernel_overhead_s": 0.0, "host_dispatch_s": 0.0}
    print(f"serial + waves, nothing fitted: {fit.summaries(zero)}")
    start = time.perf_counter()
    # Powell's line searches within the bounds on scaled variables (seconds in microseconds),
    # from the grid's best point, over the parameters not held by --fix.  (Nelder-Mead stalled
    # here: its simplex shrank onto the host's seconds, whose loss has kinks, and left both
    # efficiencies at the grid's point.)
    axes = {
        "tensor_efficiency": ((0.6, 0.7, 0.8, 0.9, 1.0), (0.05, 1.0), 1.0),
        "memory_efficiency": ((0.6, 0.8, 1.0), (0.05, 1.0), 1.0),
        "kernel_overhead_s": ((0.0, 5e-6), (0.0, 20.0), 1e-6),
        "host_dispatch_s": ((15e-6, 25e-6, 35e-6), (0.0, 100.0), 1e-6),
    }
    free = [k for k in PARAMS if k not in fixed]

    def full(y) -> list[float]:
        at = dict(zip(free, y, strict=True))
        return [at[k] if k in at else fixed[k] for k in PARAMS]

    x0 = min(itertools.product(*(axes[k][0] for k in free)), key=lambda y: fit.loss(full(y)))
    scale = np.array([axes[k][2] for k in free])
    res = minimize(
        lambda y: fit.loss(full(y * scale)),
        np.array(x0) / scale,
        method="Powell",
        bounds=[axes[k][1] for k in free],
        options={"xtol": 1e-3, "ftol": 1e-7, "maxfev": 400},
    )
    values = dict(zip(PARAMS, full(res.x * scale), strict=True))
    print(f"fitted in {time.perf_counter() - start:.0f} s ({res.nfev} evaluations)", file=sys.stderr)
    print(f"fitted: {fit.summaries(values)}")
    preset = load_hardware("a100").calibration
    if preset is not None:
        now = {k: getattr(preset, k) for k in PARAMS}
        print(f"the a100 preset's values: {fit.summaries(now)}")
    if args.kinds:
        print(fit.kinds(values))
    print("[calibration]")
    print('execution = "serial"')
    for k in PARAMS:
        v = values[k]
        print(f"{k} = {v:.3g}" if k.endswith("_s") else f"{k} = {v:.3f}")
    for k, v in WAVE.items():
        print(f"{k} = {v}")


if __name__ == "__main__":
    main()
