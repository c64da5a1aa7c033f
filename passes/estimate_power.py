"""``phaze-estimate-power``: the energy of a training step under the plan, and the chip's power."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from passes.algorithms.energy import LayerEnergy, power_headroom_w, power_limited_step_s, power_of_plan
from phaze_ir import keys
from phaze_ir.attributes import LatencyAttr, LayerEnergyAttr, LayerMemoryAttr, PlanAttr, PowerAttr, StageInfoAttr
from phaze_ir.errors import PhazeError
from phaze_ir.hardware_ir import module_accelerator


@dataclass(frozen=True)
class EstimatePowerPass(ModulePass):
    """Give the module a ``phaze.power`` record: the energy of one training step under
    ``phaze.plan`` (every device, static power and network included), the chip's average
    power over the step (the busiest pipeline rank's), one die's static power, the network's
    share, the energy per sample (the model is ``plan_power`` in
    ``passes/algorithms/energy.py``), and ``power_limit_s``, what the chip's power limit adds
    to the placement's step (the step lasts at least its energy over the limit): the plan's
    time is ``phaze.plan``'s plus it (:func:`phaze.plan.plan_output.plan_record`; this pass writes
    nothing else).

    Requires ``phaze.plan`` and ``phaze.stages`` (``phaze-place-devices``),
    ``phaze.layer_energy`` (``phaze-estimate-energy``) and ``phaze.layer_memory``
    (``phaze-insert-recompute``: the gradient bytes the data-parallel collective moves).  An
    infeasible plan gets no record.
    """

    name = "phaze-estimate-power"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        plan_attr = keys.require(op, keys.PLAN, PlanAttr)
        plan = plan_attr.as_dict()
        if plan["feasible"] != "yes":
            keys.put(op, keys.POWER, None)
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
        # The step lasts at least its energy over the power limit (the ops' own bound, in their
        # latencies, leaves what runs side by side): a longer step is the step's time, said in
        # phaze.power's power_limit_s (phaze.plan stays the placement's:
        # phaze.plan.plan_output.plan_record gives the step's time).
        step = float(plan["time_per_batch_s"])
        limited = power_limited_step_s(power, step, power_headroom_w(acc))
        if limited > step:
            plan = {**plan, "time_per_batch_s": limited}
            power = power_of_plan(plan, records, layers, grads, acc, static_w)
        per_sample = power.step_energy_j / int(plan["global_batch"])
        limit = acc.energy.power_limit_w
        op.attributes[keys.POWER] = PowerAttr.make(
            **vars(power),
            energy_per_sample_j=per_sample,
            power_limit_w=0.0 if limit is None else float(limit),
            clock_limited_share=1.0 if limited > step else _power_bound_share(op),
            power_limit_s=limited - step,
        )


def _power_bound_share(module: ModuleOp) -> float:
    """Of the step's ops' time (each op once, ``split_s``), the share of the ops whose latency
    the power limit sets (bound ``power``)."""
    total = limited = 0.0
    for o in module.walk():
        lat = o.attributes.get(keys.LATENCY)
        if isinstance(lat, LatencyAttr):
            r = lat.as_dict()
            total += float(r["split_s"])
            limited += float(r["split_s"]) if str(r["bound"]) == "power" else 0.0
    return limited / total if total > 0 else 0.0
