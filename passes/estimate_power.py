"""``phaze-estimate-power``: the energy of a training step under the plan, and the chip's power."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from passes.algorithms.energy import LayerEnergy, power_of_plan
from phaze_ir import keys
from phaze_ir.attributes import LayerEnergyAttr, LayerMemoryAttr, PlanAttr, PowerAttr, StageInfoAttr
from phaze_ir.errors import PhazeError
from phaze_ir.hardware_ir import module_accelerator


@dataclass(frozen=True)
class EstimatePowerPass(ModulePass):
    """Give the module a ``phaze.power`` record: the energy of one training step under
    ``phaze.plan`` (every device, static power and network included), the chip's average
    power over the step (the busiest pipeline rank's), one die's static power, the network's
    share, the energy per sample (the model is ``plan_power`` in
    ``passes/algorithms/energy.py``).

    Requires ``phaze.plan`` and ``phaze.stages`` (``phaze-place-devices``),
    ``phaze.layer_energy`` (``phaze-estimate-energy``) and ``phaze.layer_memory``
    (``phaze-insert-recompute``: the gradient bytes the data-parallel collective moves).  An
    infeasible plan gets no record.
    """

    name = "phaze-estimate-power"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        op.attributes.pop(keys.POWER, None)
        plan_attr = keys.require(op, keys.PLAN, PlanAttr)
        plan = plan_attr.as_dict()
        if plan["feasible"] != "yes":
            return
        acc = module_accelerator(op, self.name)
        if acc.energy is None:  # reached when the pass is run by hand on such a chip's plan
            raise PhazeError(
                f"{self.name}: hardware '{acc.name}' has no [energy] table (energy per MAC, per byte "
                "of each memory level, static power per mm^2); add one to price energy and power"
            )
        area = acc.area_um2
        if area is None and acc.energy.static_w_per_mm2 > 0:
            raise PhazeError(
                f"{self.name}: hardware '{acc.name}' has no area (give area_mm2) to price its static power"
            )
        static_w = 0.0 if area is None else acc.energy.static_w_per_mm2 * area / 1e6
        layers: dict[int, LayerEnergy] = {}
        for a in keys.require_records(op, keys.LAYER_ENERGY, LayerEnergyAttr):
            r = a.as_dict()
            parts = {k: float(r[k]) for k in LayerEnergyAttr.FIELDS if k != "index"}
            layers[int(r["index"])] = LayerEnergy(int(r["index"]), **parts)
        grads: dict[int, int] = {}
        for m in keys.require_records(op, keys.LAYER_MEMORY, LayerMemoryAttr):
            r = m.as_dict()
            grads[int(r["index"])] = int(r["grad_bytes"])
        records = [s.as_dict() for s in keys.require_records(op, keys.STAGES, StageInfoAttr)]
        power = power_of_plan(plan, records, layers, grads, acc, static_w)
        per_sample = power.step_energy_j / int(plan["global_batch"])
        op.attributes[keys.POWER] = PowerAttr.make(**vars(power), energy_per_sample_j=per_sample)
