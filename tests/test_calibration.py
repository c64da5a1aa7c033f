"""The hardware's ``[calibration]`` table (issue 14 item 2): what a real chip achieves below the
ideal model.  Parsing and its one-line errors; an absent or neutral table leaves every latency
as it was; each field moves exactly the term it names; the serial schedule (one op at a time,
issued by the host) against its closed form and the schedule checker; and phazec on a
calibrated chip end to end: every layer's phase is the serial sum of its ops."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from conftest import EXAMPLES, run_main

from passes.algorithms.latency import (
    CollectiveDesc,
    FixedParams,
    MatmulDesc,
    VectorDesc,
    ViewDesc,
    estimate_op,
)
from passes.algorithms.schedule import Op, Problem, check_schedule, serial_schedule
from phaze_ir.hardware import Calibration, HardwareError, dumps_toml, load_hardware, loads_toml

#: The a100 description without its calibration: the ideal model of that chip.
# without its power limit too (docs/energy.md): these tests price the calibration's terms alone
_A100 = load_hardware("a100")
A100 = dataclasses.replace(_A100, calibration=None, energy=dataclasses.replace(_A100.energy, power_limit_w=None))
GEMM = MatmulDesc(
    batch=1, m=4096, n=4096, k=4096, a_elem=2, b_elem=2, c_elem=2, a_bytes=2 * 4096**2, b_bytes=2 * 4096**2
)
NORM = VectorDesc(work=8 * 2**20, read_bytes=2**24, write_bytes=2**24, passes=2, row_bytes=2048)
ALLREDUCE = CollectiveDesc(kind="all_reduce", group_size=8, nbytes=2**26)


def calibrated(**fields) -> object:
    return dataclasses.replace(A100, calibration=Calibration(**fields))


# ---- the table -------------------------------------------------------------------------------


def test_a_neutral_table_prices_as_the_ideal_model():
    """``[calibration]`` with every default is the ideal model, op for op."""
    neutral = calibrated()
    for d in (GEMM, NORM, ALLREDUCE, ViewDesc()):
        assert estimate_op(d, neutral) == estimate_op(d, A100)


def test_round_trips_through_toml_and_the_ir():
    from phaze_ir.hardware_ir import from_attr, to_attr

    acc = calibrated(
        execution="serial",
        kernel_overhead_s=3e-6,
        host_dispatch_s=2e-5,
        tensor_efficiency=0.7,
        memory_efficiency=0.9,
        wave_tile_m=64,
        wave_tile_n=64,
        wave_units=108,
    )
    assert loads_toml(dumps_toml(acc)) == acc
    assert type(acc).from_dict(from_attr(to_attr(acc.to_dict()))) == acc
    assert "calibration" not in A100.to_dict()


@pytest.mark.parametrize(
    "line, message",
    [
        ("tensor_efficiency = 0", "calibration.tensor_efficiency = 0: expected a number in (0, 1]"),
        ("memory_efficiency = 1.5", "calibration.memory_efficiency = 1.5: expected a number in (0, 1]"),
        ('execution = "parallel"', 'calibration.execution = "parallel": expected one of "concurrent", "serial"'),
        ("kernel_overhead_s = -1e-6", "calibration.kernel_overhead_s = -1e-6: expected a non-negative number"),
        ("wave_units = 108", "wave_tile_m, wave_tile_n and wave_units: expected all three or none"),
        ("launch_s = 1e-6", "unknown key 'calibration.launch_s'"),
    ],
)
def test_bad_values_say_which_key(line, message):
    text = dumps_toml(A100).replace("\n[[network]]", f"\n[calibration]\n{line}\n\n[[network]]", 1)
    with pytest.raises(HardwareError) as info:
        loads_toml(text, "x.toml")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_space_template_must_be_ideal():
    with pytest.raises(ValueError, match="has no \\[calibration\\]"):
        FixedParams.of(calibrated(tensor_efficiency=0.5))


# ---- each field moves its own term -----------------------------------------------------------


def test_tensor_efficiency_scales_compute_bound_gemms():
    ideal = estimate_op(GEMM, A100)
    half = estimate_op(GEMM, calibrated(tensor_efficiency=0.5))
    assert ideal.bound == "compute" and half.split_s == pytest.approx(2 * ideal.split_s, rel=1e-12)
    assert half.one_s == pytest.approx(2 * ideal.one_s, rel=1e-12)


def test_memory_efficiency_scales_hbm_bound_ops():
    ideal = estimate_op(NORM, A100)
    slower = estimate_op(NORM, calibrated(memory_efficiency=0.8))
    assert ideal.bound == "hbm" and slower.split_s == pytest.approx(ideal.split_s / 0.8, rel=1e-12)


def test_overhead_is_added_to_computing_ops_only():
    cal = calibrated(kernel_overhead_s=5e-6)
    for d in (GEMM, NORM):
        assert estimate_op(d, cal).split_s == pytest.approx(estimate_op(d, A100).split_s + 5e-6, rel=1e-12)
    assert estimate_op(ALLREDUCE, cal) == estimate_op(ALLREDUCE, A100)
    assert estimate_op(ViewDesc(), cal).split_s == 0.0


def test_waves_of_tiles():
    """64 x 64 tiles on 108 units: 108 tiles are one wave at the full peak; one more row of
    tiles (M + 1) is a second wave, twice the time."""
    cal = calibrated(wave_tile_m=64, wave_tile_n=64, wave_units=108)
    m, n, k = 64 * 12, 64 * 9, 8192  # 12 x 9 = 108 tiles
    one_wave = MatmulDesc(1, m, n, k, 2, 2, 2, 2 * m * k, 2 * k * n)
    peak_s = 2 * m * n * k / A100.peak_tensor_flops
    assert estimate_op(one_wave, cal).split_s == pytest.approx(peak_s, rel=1e-12)
    two_waves = dataclasses.replace(one_wave, m=m + 1, a_bytes=2 * (m + 1) * k)
    assert estimate_op(two_waves, cal).split_s == pytest.approx(2 * peak_s, rel=1e-12)
    # a skinny product (16 x 2 tiles: one partial wave) takes one full wave
    skinny = MatmulDesc(1, 1024, 96, 1024, 2, 2, 2, 2 * 1024 * 1024, 2 * 1024 * 96)
    assert estimate_op(skinny, cal).split_s == pytest.approx(2 * 64 * 64 * 1024 * 108 / A100.peak_tensor_flops)


def test_a_misaligned_gemm_runs_at_its_efficiency():
    """A GEMM with a dimension not a multiple of 16 bytes (K = 4,100 bf16 elements) computes at
    ``misaligned_gemm_efficiency`` of the aligned rate; an FP8 chip prices it so too (the FP8
    rate's branch once left this term unreachable, after a ``raise``)."""
    cal = calibrated(misaligned_gemm_efficiency=0.25, fp8_gemm_flops=2 * A100.peak_tensor_flops)
    aligned = dataclasses.replace(GEMM, k=4104, a_bytes=2 * 4096 * 4104, b_bytes=2 * 4104 * 4096)
    bad = dataclasses.replace(GEMM, k=4100, a_bytes=2 * 4096 * 4100, b_bytes=2 * 4100 * 4096)
    ideal = estimate_op(bad, A100)
    slow = estimate_op(bad, cal)
    assert ideal.bound == slow.bound == "compute"
    assert slow.split_s == pytest.approx(ideal.split_s / 0.25, rel=1e-12)
    assert estimate_op(aligned, cal).split_s == pytest.approx(estimate_op(aligned, A100).split_s, rel=1e-12)


# ---- the serial schedule ---------------------------------------------------------------------


def _problem(durations: list[tuple[str, float]]) -> Problem:
    ops = [Op(u, d * 432 if u != "network" else d, d) for u, d in durations]
    return Problem.make(ops, [(i, i + 1) for i in range(len(ops) - 1)], {"tensor": 432, "vector": 432, "network": 1})


def test_serial_schedule_is_the_sum():
    p = _problem([("tensor", 3e-6), ("vector", 1e-6), ("none", 0.0), ("network", 2e-6), ("tensor", 4e-6)])
    s = serial_schedule(p)
    assert s.makespan == pytest.approx(10e-6) and s.method == "serial" and s.gap == 0.0
    assert check_schedule(p, s.start, s.end, s.cores) == []
    assert s.cores == (432, 432, 0, 1, 432)


def test_the_host_paces_short_ops_and_long_ones_hide_it():
    """Ten 1 us ops issued every 5 us: the last starts when issued, 50 us; then one 100 us op
    and ten more short ones: the host runs ahead during the long op."""
    short = [("vector", 1e-6)] * 10
    s = serial_schedule(_problem(short), dispatch_s=5e-6)
    assert s.makespan == pytest.approx(51e-6)
    p = _problem([("tensor", 100e-6)] + short)
    s = serial_schedule(p, dispatch_s=5e-6)
    assert s.makespan == pytest.approx(5e-6 + 100e-6 + 10e-6)  # the ten were issued by 55 us
    assert check_schedule(p, s.start, s.end, s.cores) == []


# ---- phazec on a calibrated chip -------------------------------------------------------------


def test_phazec_on_a_serial_chip(tmp_path):
    """Every layer's forward is the sum of its ops' split latencies (nothing overlaps), and the
    calibrated chip is slower than the ideal one."""
    text = dumps_toml(A100).replace(
        "\n[[network]]",
        '\n[calibration]\nexecution = "serial"\nkernel_overhead_s = 4e-6\ntensor_efficiency = 0.7\n\n[[network]]',
        1,
    )
    hw = tmp_path / "gpu.toml"
    hw.write_text(text)
    ideal = tmp_path / "ideal.toml"
    ideal.write_text(dumps_toml(A100))
    args = [str(EXAMPLES / "mlp.py"), "--micro-batch", "4", "--tp", "1", "--devices", "8", "--global-batch", "64", "-q"]
    outs = {}
    for name, chip in (("ideal", str(ideal)), ("serial", str(hw))):
        r = run_main(
            "phazec",
            *args,
            "--hw",
            chip,
            "-o",
            str(tmp_path / f"{name}.mlir"),
            "--json",
            str(tmp_path / f"{name}.json"),
        )
        assert r.returncode == 0, r.stderr
        outs[name] = (tmp_path / f"{name}.mlir").read_text(), json.loads((tmp_path / f"{name}.json").read_text())
    mlir, plan = outs["serial"]
    assert plan["time_per_batch_s"] > outs["ideal"][1]["time_per_batch_s"]
    assert plan["accelerator"]["calibration"]["execution"] == "serial"
    fwd = {int(i): float(t) for i, t in re.findall(r"#phaze.layer_schedule<index = (\d+), fwd_s = ([0-9.e+-]+)", mlir)}
    sums: dict[int, float] = {}
    for line in mlir.splitlines():
        lat = re.search(r"phaze.latency = #phaze.latency<one_s = [^,]+, split_s = ([0-9.e+-]+)", line)
        layer = re.search(r"phaze.layer = (\d+)", line)
        if lat and layer and 'phaze.phase = "bwd"' not in line and 'phaze.phase = "opt"' not in line:
            sums[int(layer.group(1))] = sums.get(int(layer.group(1)), 0.0) + float(lat.group(1))
    assert fwd and all(fwd[i] == pytest.approx(sums.get(i, 0.0), rel=1e-9) for i in fwd)
