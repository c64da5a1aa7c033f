"""What the architecture search maximizes (``--objective``), exactly and as an upper bound.

Every objective is "more is better", per model, on the plan the placement DP finds for a
setting (the fastest: the DP maximizes throughput, and the objective ranks the chips by that
plan).  With ``B`` the global batch, ``T`` the plan's time per batch, ``n`` its devices,
``E`` its step energy (every device, static and network included; :func:`plan_power`),
``P`` the chip's power at the plan (the busiest rank's), ``$`` a chip's cost to make and ``C``
its embodied carbon over a life ``L``:

=================  ======================================  =====================
objective          exact                                   unit
=================  ======================================  =====================
throughput         ``B / T``                               samples/s
perf-per-watt      ``B / T / (n · P)``                     samples/s per W
perf-per-dollar    ``B / T / (n · $)``                     samples/s per USD
energy             ``B / E``                               samples per J
carbon             ``B / (E · pue · grid + n · C · T / L)``  samples per kg CO2e
=================  ======================================  =====================

**Bounds.**  Each non-throughput objective is ``B / (α · E' + β · n · T)`` for some energy
``E'`` of the step and constants ``α, β ≥ 0`` of the chip.  Whatever the placement:

- ``n · T ≥ W = (B/b) · t · Σ_layers (fwd_lb + bwd_lb)``, the device-seconds of the work
  bound (``T ≥ m · Σ_k T_k / p`` with ``n = d · p · t`` and ``m = B / (b · d)``;
  ``docs/design.md`` §7.2), and
- the devices spend at least ``(B/b) · t`` times each layer's forward and backward energy per
  micro-batch (recomputation, the optimizer and the data-parallel collectives only add), and
  ``n · P · T`` at least that (chip part) plus ``n · T`` times the static power;

so ``B / (α · E_lb + β · W)`` bounds the objective from above, for every placement.  The search
uses it at its first stage and, for these objectives, at the second too (the DP on
lower-bound times bounds the time, not the energy), and prunes only below it: the answer is
plain enumeration's (``tests/test_search_options.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from passes.algorithms.cost import chip_usd, embodied_kgco2e
from passes.algorithms.energy import (
    LayerEnergy,
    die_energy_scale,
    energy_parts,
    energy_space,
    power_headroom_w,
    power_of_plan,
    ring_energy,
)
from passes.algorithms.latency import OpTable, estimate_chip, op_overheads

__all__ = ["OBJECTIVES", "UNITS", "Objective", "check_tables"]

OBJECTIVES = ("throughput", "perf-per-watt", "perf-per-dollar", "energy", "carbon")
UNITS = {
    "throughput": "samples/s",
    "perf-per-watt": "samples/s/W",
    "perf-per-dollar": "samples/s/USD",
    "energy": "samples/J",
    "carbon": "samples/kgCO2e",
}
#: What each objective needs of the hardware description.
_NEEDS = {
    "throughput": (),
    "perf-per-watt": ("energy",),
    "perf-per-dollar": ("manufacturing",),
    "energy": ("energy",),
    "carbon": ("energy", "manufacturing", "deployment"),
}


def check_tables(name: str, template, where: str, power_cap: bool = False) -> None:
    """ValueError naming the table the hardware ``template`` (of ``where``) lacks for objective
    ``name`` (and for a power cap, ``[energy]``), or for an unknown objective."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; expected one of {', '.join(OBJECTIVES)}")
    if power_cap and template.energy is None:
        raise ValueError(
            f"--power-cap needs an [energy] table in the hardware of {where} (its template '{template.name}' has none)"
        )
    for table in _NEEDS[name]:
        if getattr(template, table) is None:
            raise ValueError(
                f"--objective {name} needs a [{table}] table in the hardware of {where} "
                f"(its template '{template.name}' has none)"
            )


class Objective:
    """One objective on one set of candidates (``cands``: the search's
    :class:`~phaze.search.engine.Candidates`; ``global_batch``: B).  Per setting it prices the
    layers' energy on every candidate once (:func:`energy_space`), cached."""

    def __init__(self, name: str, cands: Any, global_batch: int, power_cap: bool = False):
        template = cands.template
        check_tables(name, template, f"'{cands.name}'", power_cap)
        self.name = name
        self.cands = cands
        self.global_batch = global_batch
        area = np.asarray(cands.configs["area_um2"], dtype=np.float64)
        if template.area_um2 is not None:  # one chip outside the area model: its given area
            area = np.where(np.isfinite(area), area, template.area_um2)
        self.area_mm2 = area / 1e6
        e = template.energy
        self.static_w = np.nan_to_num(self.area_mm2 * e.static_w_per_mm2) if e is not None else 0.0
        self._layers: dict[int, tuple[np.ndarray, ...]] = {}

    @property
    def throughput(self) -> bool:
        return self.name == "throughput"

    # -- per setting: the layers' energy on every candidate ---------------------------------------

    def layers(self, setting) -> tuple[np.ndarray, ...]:
        """``(fwd, bwd, opt, selective, network)``, each ``[layers × configs]`` joules on one
        device (``network``: the network part of forward and backward)."""
        key = id(setting)
        if key not in self._layers:
            split = self._clocked_split(setting)
            chip, net = energy_space(setting.table, self.cands.configs, self.cands.template, split_s=split)
            total = chip + net
            rings = self._ring_energies(setting, split)
            n_layers, n_configs = len(setting.layers), len(self.cands.configs)
            out = np.zeros((5, n_layers, n_configs))
            # a group is shared by the layers that repeat it (a deep model's blocks): summed once
            group_sum: dict[int, np.ndarray] = {}
            net_sum: dict[tuple[int, int], np.ndarray] = {}
            for i, lr in enumerate(setting.layers):
                for part, g in enumerate((lr.fwd, lr.bwd, lr.opt, lr.selective)):
                    if g >= 0:
                        if g not in group_sum:
                            group_sum[g] = _in_order(_group_ops(total, setting.groups[g], g, rings))
                        out[part, i] = group_sum[g]
                # the forward's then the backward's, one sum (as layer_energies adds them)
                pair = (lr.fwd, lr.bwd)
                if pair not in net_sum:
                    rows = [r for g in pair if g >= 0 for r in setting.groups[g].rows]
                    net_sum[pair] = _in_order(net[rows]) if rows else np.zeros(n_configs)
                out[4, i] = net_sum[pair]
            self._layers[key] = tuple(out)
        return self._layers[key]

    def _ring_energies(self, setting, split: np.ndarray | None) -> dict[tuple[int, int], np.ndarray]:
        """Under context parallelism, ``(g, i)`` -> the joules (``[configs]``) of op ``i`` of group
        ``g`` when it is one of a fused attention kernel's, run as a ring of c steps: the op and
        its off-diagonal twin c − 1 times (``energy.ring_energy``), its die's part at the clock
        the power limit leaves it over the ring's time (``split``, the chip's table latencies,
        times the kernel's :meth:`~phaze.search.setting.Setting.ring_factors`), as
        ``phaze-estimate-energy`` prices the ring's ops; empty without a ring."""
        c, kernels = setting.cp, setting.kernels
        if c <= 1 or not kernels:
            return {}
        template = self.cands.template
        need = sorted({r for k in kernels for r in k.rows} | {t for k in kernels for t, _ in k.twins})
        at = {r: j for j, r in enumerate(need)}
        parts = energy_parts(OpTable([setting.table.descs[r] for r in need]), self.cands.configs, template)
        twin_of = [{r: t for t, r in k.twins} for k in kernels]
        # where the power limit lowers the ops' clock: each kernel's ring factor, each row's
        # launch costs and the limit's headroom, computed once for the setting
        clock = None
        if split is not None:
            clock = (
                setting.ring_factors(split[:, 0], template.network),
                op_overheads(setting.table, template),
                power_headroom_w(template),
            )
        gamma = template.energy.clock_energy_exponent
        out: dict[tuple[int, int], np.ndarray] = {}
        for g, grp in enumerate(setting.groups):
            for i, k in grp.ring:
                r = grp.rows[i]
                compute, core, glb, hbm = ring_energy(parts[:, at[r]], parts[:, at[twin_of[k].get(r, r)]], c)
                if split is None or clock is None:
                    out[(g, i)] = compute + core + glb + hbm
                    continue
                factors, overheads, headroom = clock
                f = factors[k]
                ring_s = split[r] * f if f is not None else split[r]
                scale = die_energy_scale(compute + core + glb + hbm, hbm, ring_s, overheads[r] * c, headroom, gamma)
                out[(g, i)] = compute * scale + core * scale + glb * scale + hbm
        return out

    def _clocked_split(self, setting) -> np.ndarray | None:
        """The ops' priced times (``[ops × configs]``) where the template's power limit lowers
        their die energy with their clock (``[energy] clock_energy_exponent`` > 0): the one
        chip's, as ``phaze-estimate-latency`` prices them (``estimate_chip``), which
        ``phaze-estimate-energy`` reads from the ops' latencies; None elsewhere."""
        template = self.cands.template
        e = template.energy
        if e is None or e.power_limit_w is None or e.clock_energy_exponent == 0 or len(self.cands.configs) != 1:
            return None
        return estimate_chip(setting.table, template).split

    def _per_chip(self, configs, hbm):
        """``($, C)`` per chip of ``configs`` with ``hbm`` bytes of HBM."""
        mf = self.cands.template.manufacturing
        area = self.area_mm2[configs]
        return chip_usd(mf, area, hbm), embodied_kgco2e(mf, area, hbm)

    # -- the bound --------------------------------------------------------------------------------

    def bound(self, setting, total_lb: np.ndarray, configs, hbm) -> np.ndarray:
        """Upper bounds on the objective of ``setting`` on ``configs`` (indices) with ``hbm``
        bytes of HBM (a number or one per config), from ``total_lb``, their lower bounds on
        one micro-batch's forward and backward time summed over the layers (seconds)."""
        configs = np.asarray(configs)
        k = self.global_batch / setting.micro_batch * setting.tp
        work = k * total_lb
        fwd, bwd, _, _, network = self.layers(setting)
        e_all = k * (fwd[:, configs] + bwd[:, configs]).sum(axis=0)
        static = np.broadcast_to(self.static_w, self.area_mm2.shape)[configs] * work
        with np.errstate(divide="ignore"):
            if self.name == "perf-per-watt":
                return self.global_batch / (e_all - k * network[:, configs].sum(axis=0) + static)
            if self.name == "energy":
                return self.global_batch / (e_all + static)
            usd, carbon = self._per_chip(configs, hbm)
            if self.name == "perf-per-dollar":
                return self.global_batch / (usd * work)
            dep = self.cands.template.deployment
            operational = (e_all + static) * dep.pue * dep.grid_kgco2e_per_j
            return self.global_batch / (operational + carbon * work / dep.lifetime_s)

    # -- the exact value --------------------------------------------------------------------------

    def score(self, setting, config: int, hbm: int, result) -> float:
        """The objective of the plan ``result`` (the DP's) of ``setting`` on ``config`` with
        ``hbm`` bytes of HBM; 0 when nothing fits."""
        plan = result.get("plan") if result.get("feasible") else None
        if not plan:
            return 0.0
        thr = float(plan["throughput_samples_per_s"])
        if self.throughput:
            return thr
        n, step_s = int(plan["devices_used"]), float(plan["time_per_batch_s"])
        if self.name == "perf-per-dollar":
            usd, _ = self._per_chip(np.asarray([config]), hbm)
            return thr / (n * float(usd[0]))
        power = self.plan_power(setting, config, plan)
        if self.name == "perf-per-watt":
            return thr / (n * power.chip_power_w)
        if self.name == "energy":
            return self.global_batch / power.step_energy_j
        _, carbon = self._per_chip(np.asarray([config]), hbm)
        dep = self.cands.template.deployment
        embodied = n * float(carbon[0]) * step_s / dep.lifetime_s
        return self.global_batch / (power.step_energy_j * dep.pue * dep.grid_kgco2e_per_j + embodied)

    def plan_power(self, setting, config: int, plan):
        """:func:`plan_power` of a DP plan of ``setting`` on ``config``."""
        fwd, bwd, opt, selective, network = (a[:, config] for a in self.layers(setting))
        layers = {
            i: LayerEnergy(i, fwd[i], bwd[i], opt[i], selective[i], fwd[i], network[i])
            for i in range(len(setting.layers))
        }
        grads = {i: lr.numbers.grad_bytes for i, lr in enumerate(setting.layers)}
        static = float(np.broadcast_to(self.static_w, self.area_mm2.shape)[config])
        return power_of_plan(plan, plan["stages"], layers, grads, self.cands.template, static)


def _in_order(per_op: np.ndarray) -> np.ndarray:
    """The sum of ``per_op``'s rows (each ``[configs]``, one op's) added one after another in
    program order, as ``phaze-estimate-energy`` sums a layer's ops (:func:`~passes.algorithms.energy.layer_energies`):
    numpy's ``sum`` adds pairwise, which differs in the last bits, and the search's price of a
    power-limited step must be the compiled plan's to the last bit."""
    return np.cumsum(per_op, axis=0)[-1]


def _group_ops(total: np.ndarray, grp, g: int, rings: dict[tuple[int, int], np.ndarray]) -> np.ndarray:
    """``[ops of group g × configs]``: each op's joules, from its row of ``total``, a ring's op
    (:meth:`Objective._ring_energies`) from ``rings``."""
    per_op = total[list(grp.rows)]
    for i, _ in grp.ring:
        per_op[i] = rings[(g, i)]
    return per_op
