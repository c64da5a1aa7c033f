"""Cost and carbon of a plan: dies per wafer and yield by hand, the composition of a chip's
cost and carbon, ``phazec``'s ``cost`` and ``carbon`` in the JSON, and the hardware tables that
price them."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from passes.algorithms.cost import die_yield, dies_per_wafer, plan_cost
from phaze_ir.hardware import Deployment, HardwareError, Manufacturing, dumps_toml, load_hardware, loads_toml
from tests.conftest import MODELS, run_main

# without its power limit: the chips made up here (a die past the wafer) would fail that check first
_A100 = load_hardware("a100")
A100 = dataclasses.replace(_A100, energy=dataclasses.replace(_A100.energy, power_limit_w=None))


def test_dies_per_wafer_and_yield_by_hand():
    # 100 mm^2 on a 300 mm wafer with 5 mm edge loss: pi 145^2 / 100 - pi 290 / sqrt(200).
    assert dies_per_wafer(100.0, 300.0, 5.0) == pytest.approx(math.pi * 145**2 / 100 - math.pi * 290 / math.sqrt(200))
    assert dies_per_wafer(826.0, 300.0, 5.0) == pytest.approx(57.55, abs=0.01)
    # Negative binomial: (1 + D0 A / alpha)^-alpha, Poisson in the limit.
    assert die_yield(826.0, 0.0009, 10.0) == pytest.approx((1 + 0.0009 * 826 / 10) ** -10)
    assert die_yield(826.0, 0.0009, 1e9) == pytest.approx(math.exp(-0.0009 * 826), rel=1e-6)
    assert die_yield(100.0, 0.0, 10.0) == 1.0


def test_a_plans_cost_and_carbon_compose():
    c = plan_cost(A100, devices_used=8, step_s=2.0, step_energy_j=1000.0)
    assert c is not None
    mf, dep = A100.manufacturing, A100.deployment
    assert mf is not None and dep is not None
    area = 826.0
    good = die_yield(area, mf.defect_density_per_mm2, mf.yield_clustering)
    assert c.die_yield == good
    assert c.die_usd == pytest.approx(mf.wafer_usd / (dies_per_wafer(area, 300.0, 5.0) * good))
    assert c.chip_usd == pytest.approx(c.die_usd + mf.hbm_usd_per_byte * 80 * 2**30)
    assert c.cluster_usd == pytest.approx(8 * c.chip_usd)
    embodied = mf.die_kgco2e_per_mm2 * area / good + mf.hbm_kgco2e_per_byte * 80 * 2**30 + mf.package_kgco2e
    assert c.embodied_kgco2e_per_chip == pytest.approx(embodied)
    assert c.embodied_kgco2e_per_step == pytest.approx(8 * embodied * 2.0 / dep.lifetime_s)
    assert c.operational_kgco2e_per_step == pytest.approx(1000.0 * dep.pue * dep.grid_kgco2e_per_j)
    # Without [deployment], no carbon per step; without [manufacturing] or an area, no cost.
    bare = dataclasses.replace(A100, deployment=None)
    assert plan_cost(bare, 8, 2.0, 1000.0).embodied_kgco2e_per_step is None  # type: ignore[union-attr]
    assert plan_cost(dataclasses.replace(A100, manufacturing=None), 8, 2.0, 1000.0) is None
    with pytest.raises(ValueError, match="does not fit a 300 mm wafer"):
        plan_cost(dataclasses.replace(A100, area_mm2=80_000.0), 1, 1.0, None)


def test_phazec_writes_cost_and_carbon(tmp_path):
    tpu = load_hardware("tpuv4")
    out = tmp_path / "plan.json"
    args = ["--devices", "4", "--global-batch", "8", "--micro-batch", "2", "--tp", "1", "--json", str(out)]
    res = run_main("phazec", str(MODELS / "tiny_gpt2.py"), "--hw", "tpuv4", *args, "-o", str(tmp_path / "p.mlir"))
    assert res.returncode == 0, res.stderr
    assert "cost to make: $" in res.stderr and "g CO2e per step" in res.stderr
    plan = json.loads(out.read_text())
    cost, carbon, power = plan["cost"], plan["carbon"], plan["power"]
    assert cost["cluster_usd"] == pytest.approx(plan["devices_used"] * cost["chip_usd"], rel=1e-12)
    assert cost["samples_per_s_per_kusd"] == pytest.approx(
        plan["throughput_samples_per_s"] / (cost["cluster_usd"] / 1e3), rel=1e-12
    )
    dep = tpu.deployment
    assert dep is not None
    assert carbon["operational_kgco2e_per_step"] == pytest.approx(
        power["step_energy_j"] * dep.pue * dep.grid_kgco2e_per_j, rel=1e-12
    )
    total = carbon["operational_kgco2e_per_step"] + carbon["embodied_kgco2e_per_step"]
    assert carbon["kgco2e_per_step"] == pytest.approx(total, rel=1e-12)
    assert carbon["kgco2e_per_token"] == pytest.approx(total / (8 * 16), rel=1e-12)  # tiny_gpt2: SEQ_LEN 16
    # A chip without the tables: no cost, no carbon, no line.
    bare = tmp_path / "bare.toml"
    bare.write_text(dumps_toml(dataclasses.replace(tpu, manufacturing=None, deployment=None)))
    res = run_main("phazec", str(MODELS / "tiny_gpt2.py"), "--hw", str(bare), *args, "-o", str(tmp_path / "q.mlir"))
    assert res.returncode == 0, res.stderr
    plan = json.loads(out.read_text())
    assert plan["cost"] is None and plan["carbon"] is None and "cost to make" not in res.stderr


def test_cost_tables_are_checked_and_round_trip():
    assert loads_toml(dumps_toml(A100)) == A100
    text = dumps_toml(A100)
    with pytest.raises(HardwareError, match=r"^bad\.toml: manufacturing\.wafer_usd = -1: expected a positive number$"):
        loads_toml(text.replace("wafer_usd = 9346.0", "wafer_usd = -1"), source="bad.toml")
    with pytest.raises(HardwareError, match=r"unknown key 'deployment\.grid_g_per_kwh' \(did you mean"):
        loads_toml(text.replace("grid_kgco2e_per_j", "grid_g_per_kwh"), source="bad.toml")
    with pytest.raises(HardwareError, match=r"missing required key 'deployment\.lifetime_s'"):
        loads_toml(text.replace("lifetime_s = ", "# lifetime_s = "), source="bad.toml")
    assert isinstance(A100.manufacturing, Manufacturing) and isinstance(A100.deployment, Deployment)
