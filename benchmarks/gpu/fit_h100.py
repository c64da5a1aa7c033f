"""Fit the ``[calibration]`` table of ``phaze_ir/hw_presets/h100.toml`` on the kernel times
measured on one H100 (``data/h100/``, data/h100/README.md) and print the fit and the error of the
fitted model on each file.

    python benchmarks/gpu/fit_h100.py [DATA_DIR]

The model is the one ``[calibration]`` describes (:class:`phaze_ir.hardware.Calibration`), one
kernel at a time on the whole chip:

* a GEMM ``M×K · K×N`` (batch ``b``) takes ``max(waves / e, L2, HBM) + o``: ``waves`` is the time
  of ``ceil(b · ceil(M/tm) · ceil(N/tn) / units)`` waves of full ``tm × tn`` output tiles at the
  tensor peak (``2·tm·tn·K·units / peak`` each), ``e`` the tensor efficiency, L2 and HBM phaze's
  traffic terms (:func:`passes.algorithms.latency.hbm_matmul_bytes`, the L2 term of
  ``estimate_matmul``) over the L2 bandwidth and over ``memory_efficiency`` × the HBM bandwidth,
  ``o`` the kernel overhead;
* a memory-bound kernel takes ``bytes / (memory_efficiency · HBM bandwidth) + o``, ``bytes`` what
  it reads and writes (the vector compute term is a few per cent of that for these ops in bf16).

The waves stand *in place of* phaze's ideal PE-array tiling (16 × 32 arrays, 512-row tiles, no
split-K), as ``estimate_matmul`` does on a chip with wave quantisation: the larger of the two
would price narrow long-K GEMMs (weight gradients) up to 6x too slow.  The report also prices the
GEMMs with ``estimate_matmul`` on the preset, which must agree with the fitted model.

What is fitted, and how (deterministic: grids and weighted medians, numpy only):

* per candidate wave tile (:data:`CANDIDATE_TILES`: the CTA tiles cuBLAS/CUTLASS use on Hopper),
  ``e`` and ``o`` minimise the mean relative |error| on ``gemm.csv`` (for each ``e`` on a grid,
  the best ``o`` is a weighted median; the grid is refined around the best ``e``); the tile of
  the smallest mean |error| is kept; ``units`` is the GPU's SM count (``environment.json``);
* ``memory_efficiency`` minimises the mean relative |error| on ``memory_bound.csv``'s large
  kernels (at least :data:`LARGE_ELEMENTS` elements, where the overhead is small), with ``o``
  from the GEMMs; the GEMM fit's HBM term depends on it, so both are iterated to a fixed point.
"""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from passes.algorithms.latency import MatmulDesc, estimate_op, glb_matmul_bytes, hbm_matmul_bytes, wave_s
from passes.algorithms.tiling import tile_gemm_scalar
from phaze_ir.hardware import load_hardware

ROOT = Path(__file__).resolve().parents[2]

DATA = ROOT / "data" / "h100"
#: Output tiles (rows, columns) a GEMM kernel's thread blocks compute on Hopper (CUTLASS / cuBLAS).
CANDIDATE_TILES = ((64, 64), (64, 128), (128, 64), (128, 128), (128, 256), (256, 128))
#: memory_bound.csv rows used for memory_efficiency: at least 2^24 elements (32 MiB in bf16).
LARGE_ELEMENTS = 2**24
#: Bytes (read, written) per element of each memory_bound.csv op, as the op model counts them.
MEMORY_OPS = {
    "copy": (2, 2),
    "add": (4, 2),
    "gelu": (2, 2),
    "dropout": (2, 3),
    "layer_norm": (2, 2),
    "softmax": (2, 2),
}
BF16 = 2


# ------------------------------------------------------------------------------------------
# The data
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gemms:
    """GEMMs (arrays of one entry per kernel) and their measured seconds."""

    label: list[str]
    batch: np.ndarray
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    rhs_batched: np.ndarray
    time_s: np.ndarray


@dataclass(frozen=True)
class MemoryKernels:
    op: list[str]
    elements: np.ndarray
    bytes_moved: np.ndarray
    time_s: np.ndarray


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def load_gemms(data: Path = DATA) -> Gemms:
    rows = _rows(Path(data) / "gemm.csv")
    n = len(rows)
    return Gemms(
        label=[r["example"] for r in rows],
        batch=np.ones(n, dtype=np.int64),
        m=np.array([int(r["m"]) for r in rows], dtype=np.int64),
        n=np.array([int(r["n"]) for r in rows], dtype=np.int64),
        k=np.array([int(r["k"]) for r in rows], dtype=np.int64),
        rhs_batched=np.zeros(n, dtype=bool),
        time_s=np.array([float(r["time_s"]) for r in rows]),
    )


def load_memory_bound(data: Path = DATA) -> MemoryKernels:
    rows = _rows(Path(data) / "memory_bound.csv")
    return MemoryKernels(
        op=[r["op"] for r in rows],
        elements=np.array([int(r["elements"]) for r in rows], dtype=np.int64),
        bytes_moved=np.array([int(r["bytes_moved"]) for r in rows], dtype=np.float64),
        time_s=np.array([float(r["time_s"]) for r in rows]),
    )


def load_environment(data: Path = DATA) -> dict:
    with open(Path(data) / "environment.json") as f:
        return json.load(f)


# ------------------------------------------------------------------------------------------
# The model
# ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """The fitted ``[calibration]`` values."""

    tile_m: int
    tile_n: int
    units: int
    tensor_efficiency: float
    kernel_overhead_s: float
    memory_efficiency: float


def _desc(batch: int, m: int, n: int, k: int, rhs_batched: bool) -> MatmulDesc:
    """A bf16 GEMM as phaze describes it (``rhs_batched``: attention's batched products)."""
    return MatmulDesc(
        batch=batch,
        m=m,
        n=n,
        k=k,
        a_elem=BF16,
        b_elem=BF16,
        c_elem=BF16,
        a_bytes=batch * m * k * BF16,
        b_bytes=(batch if rhs_batched else 1) * k * n * BF16,
        rhs_batched=rhs_batched,
    )


@dataclass(frozen=True)
class GemmTerms:
    """What phaze's GEMM model charges besides the fitted values: the L2 seconds and the HBM
    bytes (both as ``estimate_matmul`` counts them), the FLOPs and the measured seconds."""

    glb_s: np.ndarray
    hbm_bytes: np.ndarray
    time_s: np.ndarray
    batch: np.ndarray
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray


def gemm_terms(g: Gemms, acc) -> GemmTerms:
    tc = acc.tensor_cores
    glb, hbm = [], []
    for b, m, n, k, rb in zip(g.batch.tolist(), g.m.tolist(), g.n.tolist(), g.k.tolist(), g.rhs_batched.tolist()):
        d = _desc(b, m, n, k, rb)
        t = tile_gemm_scalar(b, m, n, k, tc.pe_x, tc.pe_y, tc.count, tc.buffer_bytes)
        glb.append(glb_matmul_bytes(d, t, min(tc.count, t.tiles_n)) / acc.global_buffer.bandwidth_Bps)
        hbm.append(hbm_matmul_bytes(d, acc.global_buffer.bytes, stream_k=True))  # a GPU's waves of output tiles
    return GemmTerms(np.array(glb), np.array(hbm, dtype=np.float64), g.time_s, g.batch, g.m, g.n, g.k)


def waves_s(terms: GemmTerms, tile_m: int, tile_n: int, units: int, peak_flops: float) -> np.ndarray:
    """Seconds of the GEMMs' waves of full output tiles at the tensor peak (latency.wave_s)."""
    return wave_s(terms.batch, terms.m, terms.n, terms.k, tile_m, tile_n, units, peak_flops)


def predict_gemm(terms: GemmTerms, cal: Calibration, acc) -> np.ndarray:
    compute = waves_s(terms, cal.tile_m, cal.tile_n, cal.units, acc.peak_tensor_flops) / cal.tensor_efficiency
    hbm = terms.hbm_bytes / (acc.hbm.bandwidth_Bps * cal.memory_efficiency)
    return np.maximum(np.maximum(compute, terms.glb_s), hbm) + cal.kernel_overhead_s


def predict_memory(k: MemoryKernels, cal: Calibration, acc) -> np.ndarray:
    return k.bytes_moved / (acc.hbm.bandwidth_Bps * cal.memory_efficiency) + cal.kernel_overhead_s


def relative_errors(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """predicted / measured - 1."""
    return predicted / measured - 1.0


# ------------------------------------------------------------------------------------------
# The fit
# ------------------------------------------------------------------------------------------


def _weighted_median(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Per row of ``x`` (2-D), the value minimising ``sum(w · |x - v|)`` (the lower weighted
    median; ``w`` is one weight per column)."""
    order = np.argsort(x, axis=1, kind="stable")
    xs = np.take_along_axis(x, order, axis=1)
    cw = np.cumsum(w[order], axis=1)
    idx = np.argmax(cw >= cw[:, -1:] / 2, axis=1)
    return xs[np.arange(x.shape[0]), idx]


def _fit_e_o(compute1: np.ndarray, floor: np.ndarray, t: np.ndarray, grid: np.ndarray):
    """For each tensor efficiency ``e`` of ``grid``, the overhead ``o >= 0`` minimising the mean
    relative |error| of ``max(compute1 / e, floor) + o``; the best (e, o, mean |error|)."""
    base = np.maximum(compute1[None, :] / grid[:, None], floor[None, :])
    o = np.maximum(_weighted_median(t[None, :] - base, 1.0 / t), 0.0)
    cost = np.mean(np.abs((base + o[:, None]) / t[None, :] - 1.0), axis=1)
    i = int(np.argmin(cost))
    return float(grid[i]), float(o[i]), float(cost[i])


def fit_gemm(terms: GemmTerms, tile: tuple[int, int], units: int, memory_efficiency: float, acc):
    """(tensor_efficiency, kernel_overhead_s, mean |error|) of one wave tile."""
    compute1 = waves_s(terms, tile[0], tile[1], units, acc.peak_tensor_flops)
    floor = np.maximum(terms.glb_s, terms.hbm_bytes / (acc.hbm.bandwidth_Bps * memory_efficiency))
    e, _, _ = _fit_e_o(compute1, floor, terms.time_s, np.round(np.arange(0.300, 1.0005, 0.001), 6))
    fine = np.round(np.arange(e - 0.002, e + 0.002 + 5e-7, 1e-5), 8)
    return _fit_e_o(compute1, floor, terms.time_s, fine[(fine > 0) & (fine <= 1)])


def fit_memory_efficiency(k: MemoryKernels, overhead_s: float, acc) -> float:
    """``memory_efficiency`` minimising the mean relative |error| of ``bytes / (me · bw) + o``
    on the kernels of at least :data:`LARGE_ELEMENTS` elements (a weighted median in 1/me)."""
    big = k.elements >= LARGE_ELEMENTS
    a = k.bytes_moved[big] / (acc.hbm.bandwidth_Bps * k.time_s[big])  # seconds at peak / measured
    c = 1.0 - overhead_s / k.time_s[big]
    inv = _weighted_median((c / a)[None, :], a)[0]
    return float(min(1.0, 1.0 / inv))


@dataclass(frozen=True)
class TileFit:
    tile: tuple[int, int]
    tensor_efficiency: float
    kernel_overhead_s: float
    mean_abs_error: float


@dataclass(frozen=True)
class Fit:
    calibration: Calibration
    tiles: list[TileFit]  #: every candidate tile, at the fitted memory efficiency
    iterations: int


def fit(data: Path = DATA, acc=None, tiles=CANDIDATE_TILES) -> Fit:
    """The calibration of ``data`` (see the module docstring)."""
    acc = acc or load_hardware("h100")
    units = int(load_environment(data)["sms"])
    terms = gemm_terms(load_gemms(data), acc)
    mem = load_memory_bound(data)
    me, previous, iterations = 1.0, None, 0
    while iterations < 50:
        iterations += 1
        per_tile = [TileFit(t, *fit_gemm(terms, t, units, me, acc)) for t in tiles]
        best = min(per_tile, key=lambda f: f.mean_abs_error)
        me = fit_memory_efficiency(mem, best.kernel_overhead_s, acc)
        current = (best.tile, best.tensor_efficiency, best.kernel_overhead_s, me)
        if current == previous:
            break
        previous = current
    cal = Calibration(best.tile[0], best.tile[1], units, best.tensor_efficiency, best.kernel_overhead_s, me)
    return Fit(cal, per_tile, iterations)


# ------------------------------------------------------------------------------------------
# Attention (unfused: what a model traced with eager attention runs) from the fitted parts
# ------------------------------------------------------------------------------------------


def attention_kernels(batch: int, heads: int, seq: int, head_dim: int, backward: bool):
    """The kernels of ``softmax(Q·Kᵀ · d^-½)·V`` (no mask) as ``benchmarks/gpu/measure_kernels.py``
    runs it: GEMMs as (batch, M, N, K) and memory-bound kernels as bytes moved."""
    bh, s, d, scores = batch * heads, seq, head_dim, batch * heads * seq * seq
    gemms = [(bh, s, s, d), (bh, s, d, s)]  # Q·Kᵀ, P·V
    moves = [4 * scores, 4 * scores]  # scale, softmax (bf16 in and out)
    if backward:
        gemms += [(bh, s, s, d), (bh, s, d, s), (bh, s, d, s), (bh, s, d, s)]  # dP, dV, dQ, dK
        moves += [6 * scores, 4 * scores]  # softmax backward (P, dP -> dS), scale backward
    return gemms, moves


def price_attention(rows: list[dict[str, str]], cal: Calibration, acc) -> tuple[np.ndarray, np.ndarray]:
    """(predicted, measured) seconds of attention.csv's unfused rows (OOM rows left out)."""
    pred, meas = [], []
    for r in rows:
        t = float(r["time_s"])
        if r["impl"] != "unfused" or not np.isfinite(t):
            continue
        gemms, moves = attention_kernels(
            int(r["batch"]), int(r["heads"]), int(r["seq"]), int(r["head_dim"]), r["pass"] != "fwd"
        )
        g = Gemms(
            label=[""] * len(gemms),
            batch=np.array([x[0] for x in gemms]),
            m=np.array([x[1] for x in gemms]),
            n=np.array([x[2] for x in gemms]),
            k=np.array([x[3] for x in gemms]),
            rhs_batched=np.ones(len(gemms), dtype=bool),
            time_s=np.ones(len(gemms)),
        )
        v = MemoryKernels(
            [""] * len(moves), np.zeros(len(moves)), np.array(moves, dtype=np.float64), np.ones(len(moves))
        )
        pred.append(predict_gemm(gemm_terms(g, acc), cal, acc).sum() + predict_memory(v, cal, acc).sum())
        meas.append(t)
    return np.array(pred), np.array(meas)


# ------------------------------------------------------------------------------------------
# What phaze prices today, on the preset
# ------------------------------------------------------------------------------------------


def phaze_gemm_s(g: Gemms, acc) -> np.ndarray:
    """Seconds of each GEMM as phaze prices it on ``acc`` (estimate_matmul, split over the chip)."""
    out = []
    for b, m, n, k, rb in zip(g.batch.tolist(), g.m.tolist(), g.n.tolist(), g.k.tolist(), g.rhs_batched.tolist()):
        out.append(estimate_op(_desc(b, m, n, k, rb), acc).split_s)
    return np.array(out)


# ------------------------------------------------------------------------------------------
# The report
# ------------------------------------------------------------------------------------------


def summary(errors: np.ndarray) -> str:
    a = np.abs(errors)
    return (
        f"n {len(a):>4}  median |err| {100 * np.median(a):5.1f} %  p90 {100 * np.percentile(a, 90):5.1f} %  "
        f"max {100 * a.max():6.1f} %  mean signed {100 * errors.mean():+6.1f} %"
    )


def toml_table(cal: Calibration) -> str:
    """The ``[calibration]`` values as the preset writes them (4 significant digits)."""
    return "\n".join(
        [
            "[calibration]",
            'execution = "serial"',
            f"kernel_overhead_s = {cal.kernel_overhead_s:.4g}",
            f"tensor_efficiency = {cal.tensor_efficiency:.4g}",
            f"memory_efficiency = {cal.memory_efficiency:.4g}",
            f"wave_tile_m = {cal.tile_m}",
            f"wave_tile_n = {cal.tile_n}",
            f"wave_units = {cal.units}",
        ]
    )


def _shown(path: Path) -> str:
    """``path`` relative to the repository when inside it (the same output on any checkout)."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def report(data: Path = DATA) -> str:
    acc = load_hardware("h100")
    f = fit(data, acc)
    cal = f.calibration
    env = load_environment(data)
    gemms = load_gemms(data)
    terms = gemm_terms(gemms, acc)
    mem = load_memory_bound(data)
    out = [
        f"{_shown(data)}: {env['gpu']}, {env['sms']} SMs, torch {env['torch']}, CUDA {env['cuda']}",
        f"peak tensor {acc.peak_tensor_flops / 1e12:.1f} TFLOP/s, HBM {acc.hbm.bandwidth_Bps / 1e12:.2f} TB/s "
        f"(phaze_ir/hw_presets/h100.toml); fixed point after {f.iterations} iterations",
        "",
        f"GEMM wave tile candidates (gemm.csv, {len(gemms.m)} kernels; memory_efficiency {cal.memory_efficiency:.4g}):",
        f"  {'tile':>8} {'tensor_eff':>10} {'overhead':>9}  mean |err|",
    ]
    for t in f.tiles:
        mark = " <- kept" if t.tile == (cal.tile_m, cal.tile_n) else ""
        out.append(
            f"  {t.tile[0]:>4}x{t.tile[1]:<3} {t.tensor_efficiency:>10.4f} {t.kernel_overhead_s * 1e6:>6.2f} us"
            f"  {100 * t.mean_abs_error:7.2f} %{mark}"
        )
    out += ["", "fitted:", toml_table(cal), ""]

    e = relative_errors(predict_gemm(terms, cal, acc), gemms.time_s)
    out.append("gemm.csv, the fitted model, error per kernel (predicted / measured - 1):")
    out.append(f"  {'all':<22} {summary(e)}")
    kind = np.array([s.rsplit("/", 1)[-1] for s in gemms.label])
    for k in ("fwd", "dgrad", "wgrad"):
        out.append(f"  {k:<22} {summary(e[kind == k])}")
    for lo, hi, name in (
        (0, 1e-5, "< 10 us"),
        (1e-5, 1e-4, "10-100 us"),
        (1e-4, 1e-3, "0.1-1 ms"),
        (1e-3, 1e9, ">= 1 ms"),
    ):
        s = (gemms.time_s >= lo) & (gemms.time_s < hi)
        out.append(f"  {name:<22} {summary(e[s])}")
    s = gemms.k <= 512
    out.append(f"  {'K = 512':<22} {summary(e[s])}")
    preset = acc.calibration
    if preset is not None:
        ep = relative_errors(phaze_gemm_s(gemms, acc), gemms.time_s)
        out.append(f"  {'phaze, h100 preset':<22} {summary(ep)}  (estimate_matmul)")
    out.append("")

    em = relative_errors(predict_memory(mem, cal, acc), mem.time_s)
    big = mem.elements >= LARGE_ELEMENTS
    ops = np.array(mem.op)
    sizes = sorted(set(mem.elements.tolist()))
    out.append("memory_bound.csv, the fitted model (bytes / (me * bw) + o), signed error per kernel by elements:")
    out.append(f"  {'op':<11}" + "".join(f"{'2^' + str(n.bit_length() - 1):>7}" for n in sizes))
    for op in MEMORY_OPS:
        cells = []
        for n in sizes:
            s = (ops == op) & (mem.elements == n)
            cells.append(f"{100 * em[s][0]:>+6.0f}%" if s.any() else " " * 7)
        out.append(f"  {op:<11}" + "".join(cells))
    out.append(f"  {'all sizes':<22} {summary(em)}")
    out.append(f"  {'>= 2^' + str(LARGE_ELEMENTS.bit_length() - 1) + ' (the fit)':<22} {summary(em[big])}")
    achieved = mem.bytes_moved[big] / mem.time_s[big] / 1e12
    fitted_tbps = cal.memory_efficiency * acc.hbm.bandwidth_Bps / 1e12
    out.append(f"  large kernels achieve {achieved.min():.2f}-{achieved.max():.2f} TB/s (fitted {fitted_tbps:.2f})")
    out.append("")

    rows = _rows(Path(data) / "attention.csv")
    for pas in ("fwd", "fwd+bwd"):
        p, m = price_attention([r for r in rows if r["pass"] == pas], cal, acc)
        out.append(f"attention.csv, unfused {pas:<8} (sum of the fitted kernels) {summary(p / m - 1)}")
    out.append("")

    oh = {(r["kernel"], r["launch"]): float(r["time_s"]) for r in _rows(Path(data) / "overhead.csv")}
    out.append(
        "overhead.csv: per tiny kernel "
        + ", ".join(f"{k} {v * 1e6:.2f} us" for (k, v) in ((f"{a} {b}", t) for (a, b), t in oh.items()))
        + f"; fitted kernel_overhead_s {cal.kernel_overhead_s * 1e6:.2f} us"
    )
    return "\n".join(out)


def main() -> None:
    print(report(Path(sys.argv[1]) if len(sys.argv) > 1 else DATA))


if __name__ == "__main__":
    main()
