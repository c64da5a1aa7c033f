"""The H100's energy table is a fit you can show: fitted on the energy of kernels measured on one
H100 (data/h100/power.csv) on phaze's own action counts, the preset's ``[energy]`` holds the
fit's values, the fit meets the kernels, and the preset predicts the power of measured training
steps it was not fitted on (benchmarks/gpu/fit_h100_energy.py, benchmarks/gpu/price_power.py;
data/h100/README.md)."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import numpy as np
from conftest import ROOT, gpu_script

from phaze_ir.hardware import load_hardware

DATA = ROOT / "data" / "h100"


fit_h100_energy = gpu_script("fit_h100_energy")
price_power = gpu_script("price_power")


def test_the_preset_holds_the_fit():
    acc = load_hardware("h100")
    fit = fit_h100_energy.fit(DATA, acc)
    e = acc.energy
    assert e is not None and e.accumulator_j_per_byte == 0.0
    assert math.isclose(e.mac_j, fit.values["mac_j"], rel_tol=1e-3)
    assert math.isclose(e.vector_op_j, fit.values["vector_op_j"], rel_tol=1e-3)
    assert math.isclose(e.hbm_j_per_byte, fit.values["hbm_j_per_byte"], rel_tol=1e-3)
    assert math.isclose(
        dict(e.sram_j_per_byte)[acc.global_buffer.bytes], fit.values["global_buffer_j_per_byte"], rel_tol=1e-3
    )
    assert math.isclose(e.static_w_per_mm2, fit.static_w_per_mm2, rel_tol=1e-3)


def test_the_fit_meets_the_kernels():
    fit = fit_h100_energy.fit(DATA)
    err = fit.predicted_j / fit.measured_j - 1
    gemm = np.array([r.kind == "gemm" for r in fit.rows])
    assert gemm.sum() == 8 and len(err) == 16
    assert np.abs(err[gemm]).max() < 0.08  # every GEMM
    assert np.median(np.abs(err)) < 0.05 and np.abs(err).max() < 0.20
    # Physically sane: more energy per HBM byte than per L2 byte, a MAC below a pJ and a half.
    v = fit.values
    assert v["hbm_j_per_byte"] > v["global_buffer_j_per_byte"] > 0 and 0.3e-12 < v["mac_j"] < 1.5e-12


def test_two_machines_measure_the_same_energy():
    """power_repeat.csv: the same workloads on another H100 machine the same day."""
    spread = fit_h100_energy.spread(DATA)
    assert len(spread) >= 15
    assert all(abs(a / b - 1) < 0.06 for _, a, b in spread)


def test_the_preset_predicts_a_measured_training_steps_power():
    """Not fitted on: GPT-2 small at micro-batch 16, one H100 (540.2 W measured)."""
    (step,) = [s for s in price_power.measured_steps(DATA / "power.csv") if s["model"] == "gpt2-small"]
    with tempfile.TemporaryDirectory() as tmp:
        predicted = price_power.predict(step["model"], step["micro_batch"], "h100", Path(tmp))
    assert abs(predicted["power_w"] / step["power_w"] - 1) < 0.15
    # The step's energy follows its time, which phaze prices short on eager AMP steps
    # (docs/validation.md): both are low, by about as much.
    assert predicted["energy_j"] < step["energy_j"] and predicted["step_s"] < step["step_s"]
    assert abs(predicted["energy_j"] / step["energy_j"] - predicted["step_s"] / step["step_s"]) < 0.1
