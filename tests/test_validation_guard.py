"""The regression guard of the calibration (issue 14 item 5; docs/validation.md): a fixed
subset of vTrain's development runs (data/vtrain/ground_truth_single.csv: hidden 1024, 16
layers, micro-batch 1 and 4, TP 1 to 8, PP 1 to 8, one run per (TP, micro-batch, PP)) priced
with the calibrated ``a100`` description, priced as they ran: Megatron's fused kernels
(``--kernels megatron``, what the a100's calibration is fitted on).  It fails when the subset's median or p90 |error|
grows past what the calibration reached (plus a small margin), so a change of the cost model
cannot silently undo the calibration; a change that improves it should lower the bounds."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import ROOT

from phaze.validate import Settings, assign_splits, pricing_options, read_runs, validate

ROWS = (5, 30, 38, 76, 133, 154, 194, 220, 222, 230, 253, 408, 667, 697, 864, 1177, 1386, 1426)
#: What the subset reaches with the calibrated a100 (docs/validation.md), and the bounds.
MEDIAN_BOUND = 0.06  # reached: 3.8 %
P90_BOUND = 0.24  # reached: 21.1 %


def subset(rows) -> list:
    return [r for r in assign_splits(read_runs(ROOT / "data" / "vtrain" / "ground_truth_single.csv")) if r.row in rows]


@pytest.fixture(scope="module")
def errors() -> np.ndarray:
    runs = subset(ROWS)
    assert sorted(r.row for r in runs) == sorted(ROWS) and {r.split for r in runs} == {"dev"}
    priced, _ = validate(runs, Settings(pricing_options("a100", kernels="megatron"), quiet=True), jobs=1)
    return np.array([priced[r.row].predicted_s / r.measured_s - 1 for r in runs])


def test_the_subset_stays_calibrated(errors):
    assert np.median(np.abs(errors)) <= MEDIAN_BOUND, np.round(errors, 3)
    assert np.percentile(np.abs(errors), 90) <= P90_BOUND, np.round(errors, 3)


def test_the_ideal_model_fails_the_guard():
    """The guard can fail: the same runs on the a100 without its calibration miss it."""
    import dataclasses

    from phaze_ir.hardware import load_hardware

    runs = [
        r for r in assign_splits(read_runs(ROOT / "data" / "vtrain" / "ground_truth_single.csv")) if r.row in ROWS[:6]
    ]
    ideal = dataclasses.replace(load_hardware("a100"), calibration=None)
    # The ideal chip's layers are scheduled by SCIP: a node limit (the search's, 1) gives the
    # same six errors (57 % median) in 14 CPU seconds, not 33 (phazec's default, no limit).
    options = pricing_options("a100", kernels="megatron", schedule_nodes=1)
    settings = Settings(options, accelerator=ideal, quiet=True)
    priced, _ = validate(runs, settings, jobs=1)
    e = np.abs([priced[r.row].predicted_s / r.measured_s - 1 for r in runs])
    assert np.median(e) > MEDIAN_BOUND


#: Development runs of ground_truth_multi.csv with tensor parallelism across two nodes (the 3.6B
#: GPT at TP 16, DP 4 on 64 GPUs, micro-batch 8 and 4), and one with data parallelism across
#: 16 nodes at TP 4 (two GPUs per node in each DP group: two NICs).
MULTI_ROWS = (24, 25, 10)
MULTI_BOUND = 0.08  # reached: +0.6 %, -2.9 %, -7.0 %


def test_tensor_parallelism_across_nodes_stays_calibrated():
    """TP 16 spans two nodes, whose 8 GPUs share the node's 800 Gb/s (the a100 preset's
    cluster ``uplink_Bps``): priced at 8 NICs' worth instead, the TP 16 runs came out 20 % fast."""
    runs = [
        r for r in assign_splits(read_runs(ROOT / "data" / "vtrain" / "ground_truth_multi.csv")) if r.row in MULTI_ROWS
    ]
    assert sorted(r.row for r in runs) == sorted(MULTI_ROWS) and {r.split for r in runs} == {"dev"}
    priced, _ = validate(runs, Settings(pricing_options("a100", kernels="megatron"), quiet=True), jobs=1)
    errors = {r.row: priced[r.row].predicted_s / r.measured_s - 1 for r in runs}
    assert all(abs(e) <= MULTI_BOUND for e in errors.values()), errors
