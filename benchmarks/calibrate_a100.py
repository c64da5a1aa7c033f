"""Fit the ``[calibration]`` of the ``a100`` description on the development part of vTrain's
measured runs (data/vtrain/; the held-apart fifth is never read here).

    python benchmarks/calibrate_a100.py [-j N]

Fixed, not fitted: ``execution = "serial"`` (Megatron runs one CUDA stream: one kernel at a time
on the whole GPU) and the wave quantisation, 64 x 64 output tiles over A100's 108 SMs (the tile
that best explains the H100 GEMM measurements, ``benchmarks/gpu/fit_h100.py``; there are no A100
GEMM measurements here).  Fitted, one set for all runs of both files: ``tensor_efficiency``,
``memory_efficiency``, ``kernel_overhead_s`` and ``host_dispatch_s``.

How: every (model, micro-batch, TP) of the development runs is traced and compiled once through
the cost passes (``phaze.validate.compiled_modules``); what the fit needs is kept: each op's
description and its (layer, phase), and each layer's numbers for the placement DP.  A candidate
calibration is then priced exactly as the pipeline prices it, without recompiling: each op's
latency by ``estimate_op`` on the calibrated chip, each layer's forward and backward as the
serial schedule of its ops (``passes/algorithms/schedule/serial.py``), and each run by the Rust
DP at its fixed placement.  The fit minimises the mean squared log error of each file, averaged
over the two files (each file weighs the same), by Nelder-Mead from a grid's best point.
``--keep FILE`` keeps the compilations (about 15 minutes on 2 cores) for the next run (a
minute).  It prints the TOML to paste into ``phaze_ir/hw_presets/a100.toml`` and the
development error; the figures to report are ``phaze-validate``'s with that file (they agree
with the ones here: same formulas).
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
from passes.algorithms.latency import ViewDesc, estimate_op  # noqa: E402
from passes.algorithms.schedule import phase_groups, serial_times  # noqa: E402
from passes.cost_view import Describer  # noqa: E402
from passes.graph_view import build_graph, read_layers, step_function  # noqa: E402
from passes.place_devices import build_problem  # noqa: E402
from phaze.search.backend import make_backend  # noqa: E402
from phaze.validate import JobResult, Settings, assign_splits, compiled_modules, jobs_of, read_runs  # noqa: E402
from phaze_ir.errors import PhazeError  # noqa: E402
from phaze_ir.hardware import Calibration, load_hardware  # noqa: E402

FILES = [os.path.join(ROOT, "data", "vtrain", f) for f in ("ground_truth_single.csv", "ground_truth_multi.csv")]
WAVE = {"wave_tile_m": 64, "wave_tile_n": 64, "wave_units": 108}  #: A100: 108 SMs (whitepaper)
PARAMS = ("tensor_efficiency", "memory_efficiency", "kernel_overhead_s", "host_dispatch_s")


def extract(work) -> list[dict]:
    """What pricing needs of a job's compiled modules, one dict per TP width (a worker's task)."""
    settings, job = work
    out = []
    for _tp, runs, module, _, _ in compiled_modules(job, settings, JobResult([])):
        if isinstance(module, PhazeError):
            continue
        graph, ops = build_graph(step_function(module))
        describe = Describer()
        descs = []
        for o in ops:
            d = describe(o)[1]
            descs.append(ViewDesc() if d is None else d)
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
                    r.gpus,
                    r.global_batch,
                    False,
                    "fit",
                    "full",
                    pipeline_schedule=r.pipeline_schedule,
                    rank_order=r.rank_order,
                    pipeline_transfer=r.pipeline_transfer,
                ),
            )
            for r in runs
        ]
        out.append({"descs": descs, "groups": groups, "runs": problems})
    return out


class Fit:
    """The development runs, ready to be priced at any calibration: ``items`` as :func:`extract`
    gives them, in file order, ``sizes`` the number of runs of each file."""

    def __init__(self, items: list[dict], sizes: list[int]):
        self.descs: list = []
        index: dict = {}
        self.items = []
        for it in items:
            idx = np.array([index.setdefault(d, len(index)) for d in it["descs"]], dtype=np.int64)
            groups = {key: idx[np.asarray(ids)] for key, ids in it["groups"].items()}
            self.items.append((groups, it["runs"]))
        self.descs = list(index)
        self.measured = np.array([r[1] for _, runs in self.items for r in runs])
        #: the runs of each file (slices of ``measured`` and of what ``predict`` returns)
        self.parts: list[slice] = []
        start = 0
        for n in sizes:
            self.parts.append(slice(start, start + n))
            start += n

    def predict(self, values: dict) -> np.ndarray:
        cal = Calibration(execution="serial", **WAVE, **values)
        acc = dataclasses.replace(load_hardware("a100"), calibration=cal)
        lat = np.array([estimate_op(d, acc).split_s for d in self.descs])
        out = []
        for groups, runs in self.items:
            span = {key: serial_times(lat[ids].tolist(), cal.host_dispatch_s)[1] for key, ids in groups.items()}
            for _, _, pp, dp, problem in runs:
                layers = [dict(x) for x in problem["layers"]]
                for i, layer in enumerate(layers):
                    fwd = span.get((i, "fwd"), 0.0)
                    layer["fwd_s"] = fwd
                    layer["bwd_s"] = span.get((i, "bwd"), 0.0)
                    rec = list(layer["recompute_s"])
                    rec[2] = fwd
                    layer["recompute_s"] = rec
                res = _phaze_rs.evaluate_placement({**problem, "layers": layers}, pp, dp)
                out.append(res["plan"]["time_per_batch_s"] if res["feasible"] else np.nan)
        return np.array(out)

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
        "--keep",
        metavar="FILE",
        help="keep what the compilations give in FILE (a pickle this script wrote) and reuse it on the "
        "next run: the network, the hardware and the fit can change, not the models or the passes",
    )
    args = ap.parse_args()

    start = time.perf_counter()
    base = dataclasses.replace(load_hardware("a100"), calibration=Calibration(execution="serial", **WAVE))
    settings = Settings(hw="a100", accelerator=base, quiet=True)
    items: list[dict] = []
    if args.keep and os.path.exists(args.keep):
        with open(args.keep, "rb") as f:
            items = pickle.load(f)
    else:
        for path in FILES:
            file_runs = [r for r in assign_splits(read_runs(path)) if r.split == "dev"]
            with make_backend("local", args.jobs, None) as be:
                for res in be.map(extract, [(settings, j) for j in jobs_of(file_runs)]):
                    items += res
        if args.keep:
            with open(args.keep, "wb") as f:
                pickle.dump(items, f)
    sizes = [sum(1 for r in assign_splits(read_runs(path)) if r.split == "dev") for path in FILES]
    fit = Fit(items, sizes)
    print(f"compiled {len(fit.measured)} development runs in {time.perf_counter() - start:.0f} s", file=sys.stderr)

    zero = {"tensor_efficiency": 1.0, "memory_efficiency": 1.0, "kernel_overhead_s": 0.0, "host_dispatch_s": 0.0}
    print(f"serial + waves, nothing fitted: {fit.summaries(zero)}")
    start = time.perf_counter()
    grid = itertools.product((0.6, 0.7, 0.8, 0.9, 1.0), (0.6, 0.8, 1.0), (0.0, 5e-6), (15e-6, 25e-6, 35e-6))
    x0 = min(grid, key=fit.loss)
    # Nelder-Mead on scaled variables (seconds in microseconds), from the grid's best point.
    scale = np.array([1.0, 1.0, 1e-6, 1e-6])
    res = minimize(
        lambda y: fit.loss(y * scale),
        np.array(x0) / scale,
        method="Nelder-Mead",
        options={"xatol": 1e-3, "fatol": 1e-6, "maxfev": 300, "initial_simplex": None},
    )
    x = res.x * scale
    values = dict(zip(PARAMS, x, strict=True))
    print(f"fitted in {time.perf_counter() - start:.0f} s ({res.nfev} evaluations)", file=sys.stderr)
    print(f"fitted: {fit.summaries(values)}")
    print("[calibration]")
    print('execution = "serial"')
    for k in PARAMS:
        v = values[k]
        print(f"{k} = {v:.3g}" if k.endswith("_s") else f"{k} = {v:.3f}")
    for k, v in WAVE.items():
        print(f"{k} = {v}")


if __name__ == "__main__":
    main()
