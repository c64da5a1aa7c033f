"""The chip's power limit as physics (``[energy] power_limit_w``, docs/energy.md): every op lasts
at least its dynamic energy over the limit less the static power, and so does a step."""

from __future__ import annotations

import dataclasses

import pytest

from passes.algorithms.energy import PlanPower, estimate_energy, power_headroom_w, power_limited_step_s
from passes.algorithms.latency import MatmulDesc, VectorDesc, estimate_chip, estimate_op
from phaze_ir.hardware import HardwareError, load_hardware

TPU = load_hardware("tpuv4")  # no calibration: no launch cost, the bound is E / headroom exactly
H100 = load_hardware("h100")
COPY = VectorDesc(work=2**24, read_bytes=2**25, write_bytes=2**25)


def _limited(acc, watts):
    return dataclasses.replace(acc, energy=dataclasses.replace(acc.energy, power_limit_w=watts))


def test_the_bound_binds_by_hand():
    """A copy's energy over (limit - static) when that is longer than its roofline."""
    free = estimate_op(COPY, TPU)
    joules = estimate_energy(COPY, TPU).chip_j
    static = TPU.static_power_w
    limit = static + 0.5 * joules / free.split_s  # half the power it draws unlimited
    lat = estimate_op(COPY, _limited(TPU, limit))
    assert lat.split_s == pytest.approx(joules / (limit - static), rel=1e-12)
    assert lat.split_s == pytest.approx(2 * free.split_s, rel=1e-12)
    assert lat.bound == "power" and lat.one_s == free.one_s  # one core draws a fraction of the chip


def test_the_bound_does_not_bind_by_hand():
    free = estimate_op(COPY, TPU)
    joules = estimate_energy(COPY, TPU).chip_j
    limit = TPU.static_power_w + 2 * joules / free.split_s  # twice what it draws
    assert estimate_op(COPY, _limited(TPU, limit)) == free


def test_fitted_gemms_keep_their_fitted_time_at_the_limit_they_were_fitted_at():
    """The h100's GEMM efficiency was fitted at its 700 W limit: a bf16 GEMM is not slowed twice,
    an FP8 GEMM spends fp8_mac_j per MAC, and a lower limit slows GEMMs: by the ratio of the
    headrooms with energy per op held (clock_energy_exponent 0), by less where the lower clock's
    lower voltage saves energy (the preset's)."""
    shapes = [(2048, 2048, 2048), (8192, 8192, 8192), (16384, 16384, 16384), (4096, 14336, 4096), (128, 1024, 512)]
    bf16 = [MatmulDesc(1, m, n, k, 2, 2, 2, 2 * m * k, 2 * k * n) for m, n, k in shapes]
    capped, free = estimate_chip(bf16, H100), estimate_chip(bf16, _limited(H100, None))
    assert (capped.split == free.split).all()
    fp8 = MatmulDesc(1, 8192, 8192, 8192, 1, 1, 2, 8192**2, 8192**2)
    e8, e16 = estimate_energy(fp8, H100), estimate_energy(bf16[1], H100)
    assert e8.compute_j == pytest.approx(e16.compute_j * H100.energy.fp8_mac_j / H100.energy.mac_j, rel=1e-12)
    # published: FP8 8192^3 at ~1,614.5 TFLOP/s and bf16 at 797.5 under the same cap spend in that ratio
    assert e8.chip_j / e16.chip_j == pytest.approx(797.5 / 1614.5, rel=1e-3)
    low = load_hardware("h100_hbm2e")  # 500 W, the h100's calibration fitted at 700 W
    big = MatmulDesc(1, 16384, 16384, 16384, 2, 2, 2, 2 * 16384**2, 2 * 16384**2)
    held = dataclasses.replace(low, energy=dataclasses.replace(low.energy, clock_energy_exponent=0.0))
    at_500, at_700 = estimate_op(big, held).split_s, estimate_op(big, H100).split_s
    overhead = H100.calibration.kernel_overhead_s
    headrooms = (700 - H100.static_power_w) / (500 - H100.static_power_w)
    assert (at_500 - overhead) == pytest.approx((at_700 - overhead) * headrooms, rel=1e-9)
    assert low.energy.clock_energy_exponent > 0
    assert at_700 < estimate_op(big, low).split_s < at_500


def test_a_step_lasts_at_least_its_energy_over_the_headroom():
    power = PlanPower(
        step_energy_j=0.0, chip_power_w=900.0, mean_chip_power_w=900.0, static_power_w=100.0, network_energy_j=0.0
    )
    assert power_limited_step_s(power, 2.0, 400.0) == pytest.approx(4.0)  # 800 W dynamic over 400 W
    assert power_limited_step_s(power, 2.0, 1000.0) == 2.0
    assert power_limited_step_s(power, 2.0, None) == 2.0
    assert power_headroom_w(H100) == pytest.approx(700 - H100.static_power_w)
    assert power_headroom_w(TPU) is None


def test_presets_load_with_their_limits():
    expected = {"h100": (700, 80), "h100_hbm2e": (500, 96), "a100": (400, 80), "a100_40gb": (400, 40)}
    for name, (watts, gib) in expected.items():
        acc = load_hardware(name)
        assert acc.energy.power_limit_w == watts and acc.power_w == watts
        assert acc.hbm.bytes == gib * 2**30
        assert acc.static_power_w < watts
    assert load_hardware("a100_40gb").hbm.bandwidth_Bps == 1.555e12


def test_a_limit_below_the_static_power_is_refused_in_one_line():
    with pytest.raises(HardwareError, match="power_limit_w") as e:
        _limited(H100, 100.0)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "flags",
    [
        ("--dtype", "amp-bfloat16"),
        ("--dtype", "fp8"),
        ("--dtype", "amp-bfloat16", "--seq-len", "4096"),
    ],
    ids=["bf16", "fp8", "long-sequence"],
)
def test_a_plans_power_is_never_above_the_limit(tmp_path, flags):
    """On an h100 held to 250 W (most of its ops bound by it), bf16, FP8 and a long sequence."""
    import json

    from conftest import MODELS, run_main

    from phaze.plan.plan_output import plan_record
    from phaze_ir import keys
    from phaze_ir.hardware import dumps_toml
    from phaze_ir.ir import parse_module

    hw = tmp_path / "h100_250w.toml"
    hw.write_text(dumps_toml(dataclasses.replace(_limited(H100, 250.0), name="h100_250w")))
    out = tmp_path / "plan.json"
    res = run_main(
        "phazec", str(MODELS / "tiny_llama_sdpa.py"), "--hw", str(hw), "--devices", "2", "--global-batch", "8",
        "--micro-batch", "2", "--tp", "1", "--kernels", "megatron", "--json", str(out), "-o", str(tmp_path / "p.mlir"),
        *flags,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    plan = json.loads(out.read_text())
    power = plan["power"]
    assert power["chip_power_w"] <= 250.0 * (1 + 1e-9)
    # phaze.plan is the placement's (phaze-place-devices its one writer); the step's time adds
    # what the limit adds (phaze.power's power_limit_s), as the JSON and plan_record give it
    module = parse_module((tmp_path / "p.mlir").read_text())
    placed = float(module.attributes[keys.PLAN].as_dict()["time_per_batch_s"])
    assert plan["time_per_batch_s"] == plan_record(module)["time_per_batch_s"]
    assert plan["time_per_batch_s"] == pytest.approx(placed + power["power_limit_s"], rel=1e-12)
    assert plan["throughput_samples_per_s"] == pytest.approx(8 / plan["time_per_batch_s"], rel=1e-12)
    assert power["clock_limited_share"] > 0 and "at the 250 W limit: clock-limited" in res.stderr


def test_a_fused_attentions_own_ops_keep_the_time_its_table_was_measured_in():
    """The attention table's rates are whole kernels timed at the chip's 700 W (the FA3 paper's
    H100 SXM5): its softmax adds no power floor of its own, where the same op outside a fused
    attention is bound by its energy; on a 500 W part the kernel's GEMM is slowed, by at most the
    ratio of the headrooms."""
    from passes.algorithms import attention as at

    cudnn = at.BACKENDS.index("cudnn")
    softmax = VectorDesc(work=5 * 2**28, read_bytes=2**29, write_bytes=2**29, launches=0, attention=1, backend=cudnn)
    free = _limited(H100, None)
    assert estimate_op(softmax, H100) == estimate_op(softmax, free)
    alone = dataclasses.replace(softmax, attention=0, backend=0)
    assert estimate_op(alone, H100).bound == "power"
    assert estimate_op(alone, H100).split_s > estimate_op(alone, free).split_s
    s, d, heads = 4096, 128, 32
    qk = MatmulDesc(
        batch=heads, m=s, n=s, k=d, a_elem=2, b_elem=2, c_elem=2, a_bytes=heads * s * d * 2, b_bytes=heads * s * d * 2,
        rhs_batched=True, onchip_bytes=heads * s * s * 2, causal=True, launches=0, attention=1, backend=cudnn,
    )  # fmt: skip
    assert estimate_op(qk, H100) == estimate_op(qk, free)
    low = load_hardware("h100_hbm2e")
    at_500, unlimited = estimate_op(qk, low).split_s, estimate_op(qk, _limited(low, None)).split_s
    headrooms = (700 - low.static_power_w) / (500 - low.static_power_w)
    assert unlimited < at_500 <= unlimited * headrooms * (1 + 1e-12)
