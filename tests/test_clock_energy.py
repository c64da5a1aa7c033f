"""The power limit with voltage (``[energy] clock_energy_exponent``, gamma; docs/energy.md): an
op above the headroom runs at the clock ratio ``s`` solving ``E_die·s^(1+gamma) + E_hbm·s =
headroom · t0``, lasts ``t0 / s`` and spends ``E_die·s^gamma + E_hbm``; gamma = 0 is energy per
op held.  One law at every site: the op's time, its ``phaze.energy``, the search's energies."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from passes.algorithms.energy import (
    clock_limited_time_s,
    clock_ratio,
    clocked_energy,
    die_energy_scale,
    energy_space,
    estimate_energy,
    power_headroom_w,
)
from passes.algorithms.latency import (
    MatmulDesc,
    OpTable,
    VectorDesc,
    config_of,
    estimate_chip,
    op_columns,
    op_overhead_s,
    op_overheads,
)
from phaze_ir.hardware import HardwareError, load_hardware

LOW = load_hardware("h100_hbm2e")  # 500 W, the h100's GEMM fit taken at 700 W
RNG = np.random.default_rng(55)
DIE = RNG.uniform(1e-3, 1.0, 200)
HBM = DIE * RNG.uniform(0.0, 1.0, 200)
SECONDS = RNG.uniform(1e-4, 5e-3, 200)
HEADROOM = 377.6


def _gamma(acc, gamma):
    return dataclasses.replace(acc, energy=dataclasses.replace(acc.energy, clock_energy_exponent=gamma))


def test_gamma_zero_is_the_energy_held_floor_to_the_bit():
    overhead = 3.877e-6
    chip = DIE + HBM
    floor = clock_limited_time_s(chip, HBM, SECONDS + overhead, overhead, HEADROOM, 0.0)
    assert (floor == np.where(chip > 0, chip / HEADROOM + overhead, 0.0)).all()
    s = clock_ratio(DIE, HBM, SECONDS, HEADROOM, 0.0)
    over = chip > HEADROOM * SECONDS
    assert np.allclose(s[over], HEADROOM * SECONDS[over] / chip[over], rtol=1e-12) and (s[~over] == 1).all()
    assert (die_energy_scale(chip, HBM, floor, overhead, HEADROOM, 0.0) == 1).all()


@pytest.mark.parametrize("gamma", [0.5, 1.0, 2.0])
def test_a_lower_clock_spends_less_and_is_held_to_the_headroom(gamma):
    """t between t0 and the gamma = 0 floor; energy at most E; power at most the headroom."""
    overhead = 3.877e-6
    chip = DIE + HBM
    t0 = SECONDS + overhead
    held = clock_limited_time_s(chip, HBM, t0, overhead, HEADROOM, 0.0)
    t = clock_limited_time_s(chip, HBM, t0, overhead, HEADROOM, gamma)
    over = chip > HEADROOM * SECONDS
    assert over.any() and (~over).any()
    assert (t[over] > t0[over]).all() and (t[over] <= held[over] * (1 + 1e-12)).all()
    assert (t[over] < held[over]).any()
    s = clock_ratio(DIE, HBM, SECONDS, HEADROOM, gamma)
    # the equation the clock solves, and the energy it leaves
    assert np.allclose(DIE * s ** (1 + gamma) + HBM * s, np.where(over, HEADROOM * SECONDS, chip), rtol=1e-9)
    spent = DIE * s**gamma + HBM
    assert (spent <= chip * (1 + 1e-12)).all()
    assert (spent[over] / (t[over] - overhead) <= HEADROOM * (1 + 1e-9)).all()
    # what phaze.energy and the search read from the op's time: the same energy
    k = die_energy_scale(chip, HBM, np.where(over, t, t0), overhead, HEADROOM, gamma)
    assert np.allclose(DIE * k + HBM, spent, rtol=1e-9)
    assert (k[~over] == 1).all()


def test_the_exponent_is_a_checked_hardware_constant():
    assert load_hardware("h100").energy.clock_energy_exponent == LOW.energy.clock_energy_exponent > 0
    assert load_hardware("tpuv4").energy.clock_energy_exponent == 0.0  # default: energy per op held
    with pytest.raises(HardwareError, match="clock_energy_exponent") as e:
        _gamma(LOW, -1.0)
    assert "\n" not in str(e.value)


DESCS = [
    MatmulDesc(1, 16384, 16384, 16384, 2, 2, 2, 2 * 16384**2, 2 * 16384**2),
    MatmulDesc(1, 8192, 8192, 8192, 1, 1, 2, 8192**2, 8192**2),  # FP8
    MatmulDesc(8, 4096, 4096, 128, 2, 2, 2, 8 * 4096 * 128 * 2, 8 * 4096 * 128 * 2),
    VectorDesc(work=8 * 2**28, read_bytes=2**29, write_bytes=2**29),  # gelu-like
    VectorDesc(work=2**24, read_bytes=2**25, write_bytes=2**25),  # a copy
]


@pytest.mark.parametrize("acc", [LOW, load_hardware("h100")], ids=["h100_hbm2e", "h100"])
def test_the_chips_ops_run_at_their_clock_and_every_site_prices_one_energy(acc):
    """estimate_chip's times against the held-energy ones; each op's energy at its clock (the
    pass's records) equal to the search's energy_space to the last bit, its power at most the
    headroom."""
    table = OpTable(DESCS)
    lat = estimate_chip(table, acc)
    held = estimate_chip(table, _gamma(acc, 0.0))
    free = estimate_chip(table, dataclasses.replace(acc, energy=dataclasses.replace(acc.energy, power_limit_w=None)))
    assert (lat.split >= free.split).all() and (lat.split <= held.split).all()
    assert (lat.split < held.split).any()
    headroom = power_headroom_w(acc)
    chip, _ = energy_space(table, config_of(acc), acc, split_s=lat.split)
    overheads = op_overheads(table, acc)
    for i, d in enumerate(DESCS):
        unit = "tensor" if isinstance(d, MatmulDesc) else "vector"
        overhead = op_overhead_s(op_columns(d), unit, acc.calibration)
        assert overhead == overheads[i]
        plain = estimate_energy(d, acc)
        e = clocked_energy(plain, float(lat.split[i, 0]), overhead, acc)
        assert e.total_j == chip[i, 0]  # the pass's record is the search's energy, to the bit
        assert e.total_j <= plain.total_j and e.hbm_j == plain.hbm_j
        assert e.chip_j / (lat.split[i, 0] - overhead) <= headroom * (1 + 1e-9)
        if lat.bound_names()[i, 0] == "power":
            assert e.chip_j < plain.chip_j
    # without split_s (a space's search, or gamma 0): the energies as priced
    assert (
        energy_space(table, config_of(acc), _gamma(acc, 0.0), split_s=lat.split)[0]
        == energy_space(table, config_of(acc), acc)[0]
    ).all()
