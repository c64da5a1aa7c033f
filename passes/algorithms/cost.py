"""What a plan costs: the chip's price from its die area, the cluster's, and the carbon of a
training step, operational and embodied.

Pure Python (no xDSL).  The inputs are the hardware description's optional ``[manufacturing]``
and ``[deployment]`` tables (:class:`phaze_ir.hardware.Manufacturing`,
:class:`phaze_ir.hardware.Deployment`), each number with its source in the file, and a plan's
energy (:mod:`passes.algorithms.energy`).

Die cost (the model of Feng & Ma's Chiplet Actuary, DAC 2022):

- dies per wafer ``π (d/2 − e)² / A − π (d − 2e) / √(2A)``, with ``d`` the wafer diameter,
  ``e`` the edge loss and ``A`` the die area;
- die yield, negative binomial ``(1 + D0 · A / α)^(−α)`` with ``D0`` the defect density and
  ``α`` the defects' clustering (α → ∞ is Poisson's ``exp(−D0 · A)``);
- a good die costs ``wafer price / (dies per wafer · yield)``; a chip, that plus its HBM
  (``hbm_usd_per_byte`` × capacity); the cluster, the devices the plan uses times a chip.

Carbon (the model of ACT, Gupta et al., ISCA 2022):

- embodied, per chip: ``die_kgco2e_per_mm2 · A / yield`` (the wafer area spent on good dies)
  plus ``hbm_kgco2e_per_byte`` × capacity plus ``package_kgco2e``; a step's share is the
  cluster's embodied carbon times the step's time over the chips' ``lifetime_s``;
- operational, per step: its energy (static and network included) × ``pue`` × the grid's
  ``grid_kgco2e_per_j``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["PlanCost", "chip_usd", "dies_per_wafer", "die_yield", "embodied_kgco2e", "plan_cost"]


def dies_per_wafer(die_mm2, wafer_diameter_mm: float, edge_loss_mm: float):
    """Whole dies of ``die_mm2`` on a wafer (not rounded): ``π (d/2 − e)² / A − π (d − 2e) / √(2A)``
    (a number, or numpy arrays element by element)."""
    usable = wafer_diameter_mm - 2.0 * edge_loss_mm
    return math.pi * (usable / 2.0) ** 2 / die_mm2 - math.pi * usable / (2.0 * die_mm2) ** 0.5


def die_yield(die_mm2, defects_per_mm2: float, clustering: float):
    """The fraction of good dies, negative binomial ``(1 + D0·A/α)^(−α)`` (numbers or arrays)."""
    return (1.0 + defects_per_mm2 * die_mm2 / clustering) ** (-clustering)


@dataclass(frozen=True)
class PlanCost:
    """A plan's cost and carbon (SI units; money in US dollars, carbon in kg CO2e).

    ``die_usd`` one good die; ``chip_usd`` a die with its HBM; ``cluster_usd`` the devices the
    plan uses; ``die_yield``; ``embodied_kgco2e_per_chip``; ``embodied_kgco2e_per_step`` and
    ``operational_kgco2e_per_step`` the step's two shares (None when the hardware has no
    ``[deployment]`` table)."""

    die_usd: float
    chip_usd: float
    cluster_usd: float
    die_yield: float
    embodied_kgco2e_per_chip: float
    embodied_kgco2e_per_step: float | None
    operational_kgco2e_per_step: float | None


def chip_usd(mf, die_mm2, hbm_bytes):
    """A chip's cost to make: a good die (``wafer_usd / (dies per wafer · yield)``) and its HBM;
    ``mf`` a :class:`phaze_ir.hardware.Manufacturing` (numbers or numpy arrays)."""
    good = die_yield(die_mm2, mf.defect_density_per_mm2, mf.yield_clustering)
    dies = dies_per_wafer(die_mm2, mf.wafer_diameter_mm, mf.edge_loss_mm)
    return mf.wafer_usd / (dies * good) + mf.hbm_usd_per_byte * hbm_bytes


def embodied_kgco2e(mf, die_mm2, hbm_bytes):
    """A chip's embodied carbon: its die's wafer area over the yield, its HBM, its package."""
    good = die_yield(die_mm2, mf.defect_density_per_mm2, mf.yield_clustering)
    return mf.die_kgco2e_per_mm2 * die_mm2 / good + mf.hbm_kgco2e_per_byte * hbm_bytes + mf.package_kgco2e


def plan_cost(acc, devices_used: int, step_s: float, step_energy_j: float | None) -> PlanCost | None:
    """The :class:`PlanCost` of a plan on ``acc`` using ``devices_used`` chips, a step of
    ``step_s`` seconds and ``step_energy_j`` joules (None: not priced in energy); None when the
    hardware has no ``[manufacturing]`` table or no area."""
    mf = acc.manufacturing
    area_um2 = acc.area_um2
    if mf is None or area_um2 is None:
        return None
    area = area_um2 / 1e6
    dies = dies_per_wafer(area, mf.wafer_diameter_mm, mf.edge_loss_mm)
    if dies < 1:
        raise ValueError(f"a die of {area:.1f} mm^2 does not fit a {mf.wafer_diameter_mm:g} mm wafer")
    good = die_yield(area, mf.defect_density_per_mm2, mf.yield_clustering)
    die_usd = mf.wafer_usd / (dies * good)
    chip = chip_usd(mf, area, acc.hbm.bytes)
    embodied = embodied_kgco2e(mf, area, acc.hbm.bytes)
    dep = acc.deployment
    embodied_step = operational_step = None
    if dep is not None:
        embodied_step = devices_used * embodied * step_s / dep.lifetime_s
        if step_energy_j is not None:
            operational_step = step_energy_j * dep.pue * dep.grid_kgco2e_per_j
    return PlanCost(
        die_usd=die_usd,
        chip_usd=chip,
        cluster_usd=devices_used * chip,
        die_yield=good,
        embodied_kgco2e_per_chip=embodied,
        embodied_kgco2e_per_step=embodied_step,
        operational_kgco2e_per_step=operational_step,
    )
