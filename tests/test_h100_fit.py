"""The H100 calibration is a fit you can show: fitted on the kernels measured on one H100
(data/h100/), the preset's ``[calibration]`` holds the fit's values, and the fitted model meets
the measurements (benchmarks/gpu/fit_h100.py; data/h100/README.md)."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
from conftest import ROOT, gpu_script

from phaze_ir.hardware import load_hardware

DATA = ROOT / "data" / "h100"


fit_h100 = gpu_script("fit_h100")


def _preset_calibration():
    cal = load_hardware("h100").calibration
    return fit_h100.Calibration(
        cal.wave_tile_m,
        cal.wave_tile_n,
        cal.wave_units,
        cal.tensor_efficiency,
        cal.kernel_overhead_s,
        cal.memory_efficiency,
    )


def test_the_preset_holds_the_fit():
    fit = fit_h100.fit(DATA).calibration
    cal = load_hardware("h100").calibration
    assert cal is not None and cal.serial
    assert (cal.wave_tile_m, cal.wave_tile_n, cal.wave_units) == (fit.tile_m, fit.tile_n, fit.units) == (64, 64, 132)
    assert math.isclose(cal.tensor_efficiency, fit.tensor_efficiency, rel_tol=1e-3)
    assert math.isclose(cal.kernel_overhead_s, fit.kernel_overhead_s, rel_tol=1e-3)
    assert math.isclose(cal.memory_efficiency, fit.memory_efficiency, rel_tol=1e-3)


def test_the_preset_meets_the_gemms():
    acc = load_hardware("h100")
    gemms = fit_h100.load_gemms(DATA)
    assert len(gemms.m) == 1157
    e = fit_h100.relative_errors(
        fit_h100.predict_gemm(fit_h100.gemm_terms(gemms, acc), _preset_calibration(), acc), gemms.time_s
    )
    a = np.abs(e)
    # Reached: median 6.8 %, p90 20.7 %, mean signed -0.4 %; GEMMs of 1 ms and more: median 2.6 %.
    assert np.median(a) < 0.075 and np.percentile(a, 90) < 0.23 and abs(e.mean()) < 0.02
    assert np.median(a[gemms.time_s >= 1e-3]) < 0.035


def test_the_preset_meets_the_large_memory_bound_kernels():
    acc = load_hardware("h100")
    mem = fit_h100.load_memory_bound(DATA)
    big = mem.elements >= fit_h100.LARGE_ELEMENTS
    e = fit_h100.relative_errors(fit_h100.predict_memory(mem, _preset_calibration(), acc), mem.time_s)[big]
    # Reached: median 12.4 %, p90 29.8 % (layer_norm and softmax run ~30 % below copy's bandwidth).
    assert big.sum() == 18 and np.median(np.abs(e)) < 0.14 and np.percentile(np.abs(e), 90) < 0.32


def test_the_fit_recovers_known_constants(tmp_path):
    """On times made by the model itself, the fit returns the tile and constants that made them."""
    acc = load_hardware("h100")
    truth = fit_h100.Calibration(128, 128, 132, 0.8, 2.5e-6, 0.9)
    shapes = [(m, n, k) for m in (128, 1000, 4096, 8192) for n in (256, 1600, 5000) for k in (512, 2048, 8192)]
    g = fit_h100.Gemms(
        [""] * len(shapes),
        *(np.array(c) for c in ([1] * len(shapes), *zip(*shapes))),
        np.zeros(len(shapes), bool),
        np.ones(len(shapes)),
    )
    times = fit_h100.predict_gemm(fit_h100.gemm_terms(g, acc), truth, acc)
    with open(tmp_path / "gemm.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["example", "m", "n", "k", "dtype", "time_s", "tflops"])
        w.writerows(
            [f"x/{i}/fwd", m, n, k, "bf16", repr(float(t)), 0] for i, ((m, n, k), t) in enumerate(zip(shapes, times))
        )
    sizes = [2**s for s in (20, 22, 24, 26, 28)]
    with open(tmp_path / "memory_bound.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["op", "elements", "bytes_moved", "time_s", "GBps"])
        for n in sizes:
            t = 4 * n / (acc.hbm.bandwidth_Bps * truth.memory_efficiency) + truth.kernel_overhead_s
            w.writerow(["copy", n, 4 * n, repr(float(t)), 0])
    (tmp_path / "environment.json").write_text(json.dumps({"sms": 132}))
    got = fit_h100.fit(tmp_path, acc).calibration
    assert (got.tile_m, got.tile_n, got.units) == (128, 128, 132)
    assert math.isclose(got.tensor_efficiency, 0.8, rel_tol=1e-4)
    assert math.isclose(got.kernel_overhead_s, 2.5e-6, rel_tol=1e-3)
    assert math.isclose(got.memory_efficiency, 0.9, rel_tol=1e-6)


def test_phaze_prices_the_gemms_as_the_fit_does():
    """estimate_matmul on the preset is the fitted model (the waves in place of the PE-array
    tiling: the larger of the two prices long-K weight gradients up to 6x too slow)."""
    acc = load_hardware("h100")
    gemms = fit_h100.load_gemms(DATA)
    fitted = fit_h100.predict_gemm(fit_h100.gemm_terms(gemms, acc), _preset_calibration(), acc)
    np.testing.assert_allclose(fit_h100.phaze_gemm_s(gemms, acc), fitted, rtol=1e-9)
