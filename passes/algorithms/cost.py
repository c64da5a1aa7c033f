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

import numpy as np

from phaze_ir.files import excerpt
from phaze_ir.hardware import HardwareError

__all__ = [
    "PlanCost",
    "check_die_fits",
    "chip_usd",
    "dies_per_wafer",
    "die_fits",
    "die_yield",
    "embodied_kgco2e",
    "max_die_mm2",
    "plan_cost",
    "unfit_die",
]


def dies_per_wafer(die_mm2, wafer_diameter_mm: float, edge_loss_mm: float):
    """Whole dies of ``die_mm2`` on a wafer (not rounded): ``π (d/2 − e)² / A − π (d − 2e) / √(2A)``
    (a number, or numpy arrays element by element)."""
    usable = wafer_diameter_mm - 2.0 * edge_loss_mm
    return math.pi * (usable / 2.0) ** 2 / die_mm2 - math.pi * usable / (2.0 * die_mm2) ** 0.5


def max_die_mm2(wafer_diameter_mm: float, edge_loss_mm: float) -> float:
    """The largest die (mm²) of which :func:`dies_per_wafer` counts at least one: the root of
    ``π r² / A − π u / √(2A) = 1`` (``u = d − 2e``, ``r = u / 2``), a quadratic in ``√A``; 0 when
    the edge loss leaves no wafer.  (The count falls below 1 at that area and stays below: it
    is decreasing while positive and negative beyond.)"""
    usable = wafer_diameter_mm - 2.0 * edge_loss_mm
    if usable <= 0:
        return 0.0
    b = math.pi * usable / math.sqrt(2.0)
    root = (math.sqrt(b * b + math.pi * usable * usable) - b) / 2.0
    return root * root


def die_fits(mf, die_mm2):
    """Whether a die of ``die_mm2`` can be cut from the wafer of ``mf`` (a
    :class:`phaze_ir.hardware.Manufacturing`): :func:`dies_per_wafer` counts at least one whole
    die, on a wafer that its edge loss leaves something of (a number, or arrays element by
    element).  A die that does not fit has no cost: its count is below 1 or negative (a price
    below zero), and with an edge loss past the radius the formula would count dies again."""
    area = np.asarray(die_mm2, dtype=np.float64)
    usable = mf.wafer_diameter_mm - 2.0 * mf.edge_loss_mm
    with np.errstate(divide="ignore", invalid="ignore"):
        fits = (area > 0) & (dies_per_wafer(area, mf.wafer_diameter_mm, mf.edge_loss_mm) >= 1.0) & (usable > 0)
    return fits if fits.ndim else bool(fits)


def unfit_die(mf, die_mm2: float) -> str | None:
    """None when a die of ``die_mm2`` fits the wafer of ``mf`` (:func:`die_fits`), else what is
    wrong, as a phrase for a one-line message: the die, the wafer, the largest die it takes."""
    if die_fits(mf, die_mm2):
        return None
    wafer = f"a {mf.wafer_diameter_mm:g} mm wafer with {mf.edge_loss_mm:g} mm of edge loss ([manufacturing])"
    largest = max_die_mm2(mf.wafer_diameter_mm, mf.edge_loss_mm)
    if largest <= 0:
        return f"{wafer} has no room for a die"
    return f"a die of {die_mm2:,.0f} mm^2 does not fit {wafer}, whose largest die is {largest:,.0f} mm^2"


def check_die_fits(acc, source: str | None = None) -> None:
    """Refuse the accelerator ``acc`` whose die does not fit the wafer of its ``[manufacturing]``
    table: a :class:`HardwareError` (a ``ValueError``) of one line, naming ``source`` (the
    hardware file, as the user named it; default: the chip's name).  Nothing to check without
    that table or an area.

    A chip that cannot be made has no cost to make: a tool that loads hardware calls this
    before any work, rather than learning it when the plan is priced; :func:`plan_cost` calls
    it too, for whoever did not."""
    mf = acc.manufacturing
    area_um2 = acc.area_um2
    if mf is None or area_um2 is None:
        return
    unfit = unfit_die(mf, area_um2 / 1e6)
    if unfit is not None:
        raise HardwareError(
            f"{unfit}: a chip that cannot be made has no cost (without the [manufacturing] table it is planned "
            "unpriced)",
            source=source or f"hardware '{excerpt(acc.name)}'",
            key_path="manufacturing.wafer_diameter_mm",
        )


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
    hardware has no ``[manufacturing]`` table or no area.  A die that does not fit the wafer of
    that table is refused (:func:`check_die_fits`: a one-line :class:`HardwareError`)."""
    mf = acc.manufacturing
    area_um2 = acc.area_um2
    if mf is None or area_um2 is None:
        return None
    check_die_fits(acc)
    area = area_um2 / 1e6
    dies = dies_per_wafer(area, mf.wafer_diameter_mm, mf.edge_loss_mm)
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
