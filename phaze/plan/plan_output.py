"""The plan as ``phazec`` writes it, read from a placed module's attributes (``phaze.plan``:
:func:`plan_record`; ``phaze.stages``, ``phaze.power``, ``phaze.layer_schedule``, ...): its JSON
(:func:`plan_json`, the schema in docs/usage.md, "The plan as JSON": the plan, its stages, the
time per batch by part, power, cost and carbon, warnings, the sweep's :class:`Candidate` points,
the summary of :mod:`phaze.plan.summary`) and the text said on stderr (:func:`summary`,
:func:`placement_table`, :func:`power_line`, :func:`cost_line`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xdsl.dialects.builtin import ModuleOp

from phaze_ir import keys
from phaze_ir.attributes import PlanAttr, RecordAttr, ReplicatedLinearsAttr, StageInfoAttr, UnpricedOpAttr
from phaze_ir.errors import PhazeError

#: The JSON's ``stages[].memory`` parts, by the ``#phaze.stage_info`` field each is read from.
MEMORY_PARTS = {
    "params": "param_bytes",
    "grads": "grad_bytes",
    "optimizer": "optimizer_bytes",
    "activations": "activation_bytes",
    "workspace": "workspace_bytes",
}


#: A stage's time per micro-batch by part (``#phaze.stage_info``'s fields, the JSON's
#: ``stages[].time_parts``): they add up to its ``time_s``.
TIME_PARTS = ("compute_s", "recompute_s", "pp_comm_s", "zero_comm_s", "ep_comm_s")


#: The plan's time per batch by part (the JSON's ``breakdown_s``, :func:`time_breakdown`), in
#: the order a step runs them; they add up to ``time_per_batch_s``.
BREAKDOWN_PARTS = (
    "compute_s",
    "tp_comm_s",
    "recompute_s",
    "pp_comm_s",
    "ep_comm_s",
    "bubble_s",
    "dp_comm_s",
    "optimizer_s",
    "power_limit_s",
)


@dataclass
class Candidate:
    """One (micro-batch, TP width, sequence parallelism) point of the plan sweep, as the plan's
    JSON lists it (``candidates``; :mod:`phaze.points` judges them)."""

    micro_batch: int
    tp: int
    throughput: float = 0.0
    note: str = ""
    sequence_parallel: bool = False
    #: the context-parallel degree the point is priced for (1: none)
    context_parallel: int = 1


def hsdp_shard(plan: dict[str, Any], dp_shard: int) -> int | None:
    """The shard group of an HSDP plan (``--dp-shard`` N: ZeRO 2/3 over N of the DP x CP ranks,
    which N divides, replicated over the rest), None where the plan is not HSDP."""
    group = int(plan.get("dp", 0)) * int(plan.get("cp", 1))
    if dp_shard and int(plan.get("zero", 0)) >= 2 and dp_shard < group and group % dp_shard == 0:
        return dp_shard
    return None


def plan_record(module: ModuleOp) -> dict[str, Any]:
    """``phaze.plan`` of a module as a dict (empty if absent), its time the step's: the
    placement's (``phaze-place-devices``') plus what the chip's power limit adds
    (``phaze.power``'s ``power_limit_s``, ``phaze-estimate-power``'s), its throughput the
    global batch over that time."""
    attr = module.attributes.get(keys.PLAN)
    if not isinstance(attr, PlanAttr):
        return {}
    plan = dict(attr.as_dict())
    if (limit := _power_limit_s(module)) > 0:
        from passes.algorithms.energy import lengthened_step_s  # (numpy: only for a limited step)

        time = lengthened_step_s(float(plan["time_per_batch_s"]), limit)
        plan["time_per_batch_s"] = time
        plan["throughput_samples_per_s"] = int(plan["global_batch"]) / time
    return plan


def plan_json(
    module: ModuleOp, candidates: list[Candidate], recompute: str = "auto", headroom: float = 0.0, dp_shard: int = 0
) -> dict[str, Any]:
    """The plan as JSON (the schema is in docs/usage.md, "The plan as JSON"); ``recompute``: the
    setting it was placed under (``Options.recompute``; each stage's policy is in its stage);
    ``headroom``: the fraction of HBM it was placed to leave free (``Options.memory_headroom``).
    Its ``summary`` is :func:`phaze.plan.summary.build`'s (None when the plan does not fit).
    Under interleaved 1F1B (``virtual_stages`` > 1) ``stages`` lists the model chunks, each
    with the ``rank`` that runs it and that rank's numbers, its ``memory`` by part included."""
    from phaze_ir.hardware_ir import module_accelerator

    plan = plan_record(module)
    if not plan:
        raise PhazeError("--json needs the plan stage (--emit plan)")
    acc = module_accelerator(module, "phazec --json")
    accelerator = acc.to_dict()
    accelerator["hbm_bytes"] = acc.hbm.bytes
    area = acc.area_um2
    accelerator["area_mm2"] = area / 1e6 if area is not None else None
    stages = [s.as_dict() for s in keys.records_of(module, keys.STAGES, StageInfoAttr)]
    out: dict[str, Any] = {
        "model": keys.string_of(module, keys.MODEL),
        "devices": plan["devices"],
        "global_batch": plan["global_batch"],
        "dp": plan["dp"],
        "pp": plan["pp"],
        "tp": plan["tp"],
        "cp": plan["cp"],
        "sequence_parallel": keys.SEQUENCE_PARALLEL in module.attributes,
        "tp_overlap": keys.TP_OVERLAP in module.attributes,
        # the context-parallel ring of one micro-batch on one device (null without CP)
        "cp_ring": keys.dict_of(module, keys.CP_RING) or None,
        "virtual_stages": plan["virtual_stages"],
        "zero": plan["zero"],
        # HSDP's shard group (``--dp-shard``) where the plan is HSDP, else null
        "dp_shard": hsdp_shard(plan, dp_shard),
        "expert_parallel": plan["expert_parallel"],
        # the width each expert's weights split over: tp, or below it the experts' own mesh
        "expert_tensor_parallel": plan["expert_tensor_parallel"],
        "rank_order": plan["rank_order"],
        "pipeline_transfer": plan["pipeline_transfer"],
        "capacity_factor": capacity_factor(module),
        "micro_batch_size": plan["micro_batch_size"],
        "num_micro_batches": plan["num_micro_batches"],
        "time_per_batch_s": plan["time_per_batch_s"],
        # the time per batch by part (they add up to it; None when no plan has numbers)
        "breakdown_s": time_breakdown(module),
        "throughput_samples_per_s": plan["throughput_samples_per_s"],
        "devices_used": plan["devices_used"],
        "max_memory_bytes": plan["max_memory_bytes"],
        "placement": plan["placement"],
        "recompute": recompute,
        "feasible": plan["feasible"] == "yes",
        "binding": plan["binding"],
        "accelerator": accelerator,
        "stages": [
            {
                "rank": s["rank"],
                "layers": [s["first_layer"], s["last_layer"]],
                "devices": s["devices"],
                "time_s": s["time_s"],
                # time_s by part, as the DP adds it up
                "time_parts": {part: s[part] for part in TIME_PARTS},
                "memory_bytes": s["memory_bytes"],
                # memory_bytes by part, as the DP counts it (the parts add up to it)
                "memory": {part: s[field] for part, field in MEMORY_PARTS.items()},
                "recompute": s["recompute"],
                "in_flight": s["in_flight"],
                "exposed_dp_s": s["exposed_dp_s"],
                "optimizer_s": s["optimizer_s"],
            }
            for s in stages
        ],
        "power": power_json(module, plan, acc.power_w),
        **cost_json(module, plan, acc),
        "warnings": unpriced_ops(module),
        "candidates": [
            {
                "micro_batch_size": c.micro_batch,
                "tp": c.tp,
                "sequence_parallel": c.sequence_parallel,
                "cp": c.context_parallel,
                "throughput_samples_per_s": c.throughput,
                "note": c.note,
            }
            for c in candidates
        ],
    }
    if out["feasible"] and stages:
        from phaze.plan import summary as plan_summary

        others = [line for line in (power_line(module), cost_line(module, plan)) if line]
        out["summary"] = plan_summary.build(module, out, placement_table(module), others, headroom)
    else:
        out["summary"] = None
    return out


def time_breakdown(module: ModuleOp) -> dict[str, float] | None:
    """The plan's time per batch by part (:data:`BREAKDOWN_PARTS`, seconds; None when the plan
    has no stages), from ``phaze.plan``, ``phaze.stages`` and ``phaze.layer_schedule``.  The
    time is ``(m + (p − 1)/v) · T + E + O`` (docs/design.md §6.2), T the slowest rank's time per
    micro-batch, E the largest exposed once-per-step DP collectives, O the largest optimizer
    step; the parts split it so that they add up to it (but for rounding):

    - ``compute_s``, ``recompute_s``, ``pp_comm_s``, ``ep_comm_s``: m times the slowest rank's
      scheduled forward and backward work (without its TP collectives), its recompute, its
      boundary transfers, its expert all-to-alls;
    - ``tp_comm_s``: m times the TP collectives of that rank's layers that their schedules do
      not hide behind compute (``phaze.layer_schedule``'s ``tp_comm_s``, inside their
      ``fwd_s + bwd_s``: split out of the compute);
    - ``bubble_s``: ``(p − 1)/v · T``, the pipeline's fill and drain;
    - ``dp_comm_s``: m times ZeRO-2/3's per-micro-batch collectives of that rank, plus E;
    - ``optimizer_s``: O, the optimizer step after the flush."""
    from phaze_ir.attributes import LayerScheduleAttr

    plan = plan_record(module)
    stages = [s.as_dict() for s in keys.records_of(module, keys.STAGES, StageInfoAttr)]
    if not plan or not stages:
        return None
    m = int(plan["num_micro_batches"])
    p, v = int(plan["pp"]), int(plan["virtual_stages"])
    times = [float(s["time_s"]) for s in stages]
    slowest = stages[times.index(max(times))]
    # The rank's layers: its stage's, or under interleaving its v chunks'.
    layers = {
        i
        for s in stages
        if s["rank"] == slowest["rank"]
        for i in range(int(s["first_layer"]), int(s["last_layer"]) + 1)
    }
    records = keys.records_of(module, keys.LAYER_SCHEDULE, LayerScheduleAttr)
    tp = sum(float(r.as_dict()["tp_comm_s"]) for r in records if int(r.as_dict()["index"]) in layers)
    compute = float(slowest["compute_s"])
    tp = min(tp, compute)
    return {
        "compute_s": m * (compute - tp),
        "tp_comm_s": m * tp,
        "recompute_s": m * float(slowest["recompute_s"]),
        "pp_comm_s": m * float(slowest["pp_comm_s"]),
        "ep_comm_s": m * float(slowest["ep_comm_s"]),
        "bubble_s": (p - 1) / v * max(times),
        "dp_comm_s": m * float(slowest["zero_comm_s"]) + max(float(s["exposed_dp_s"]) for s in stages),
        "optimizer_s": max(float(s["optimizer_s"]) for s in stages),
        # what the chip's power limit adds to the step as a whole (phaze.power's power_limit_s)
        "power_limit_s": _power_limit_s(module),
    }


def _power_limit_s(module: ModuleOp) -> float:
    from phaze_ir.attributes import PowerAttr

    attr = module.attributes.get(keys.POWER)
    return float(attr.as_dict()["power_limit_s"]) if isinstance(attr, PowerAttr) else 0.0


def capacity_factor(module: ModuleOp) -> float | None:
    """The MoE capacity factor the module's expert GEMMs were padded to (``phaze.capacity_factor``),
    None when they were not (dropless, or no experts)."""
    from xdsl.dialects.builtin import FloatAttr

    attr = module.attributes.get(keys.CAPACITY_FACTOR)
    return float(attr.value.data) if isinstance(attr, FloatAttr) else None


def unpriced_ops(module: ModuleOp) -> list[dict[str, Any]]:
    """What the plan leaves out, as JSON: the opaque ops it does not price (``unpriced-op``,
    ``phaze.warnings``) and the linears tensor parallelism keeps replicated
    (``replicated-linears``, ``phaze.tp_replicated``); empty when none."""
    kinds = {UnpricedOpAttr: "unpriced-op", ReplicatedLinearsAttr: "replicated-linears"}
    return [
        {"kind": kinds[type(r)], **r.as_dict()}
        for key in (keys.WARNINGS, keys.TP_REPLICATED)
        for r in keys.records_of(module, key, RecordAttr)
        if type(r) in kinds
    ]


def power_json(module: ModuleOp, plan: dict[str, Any], published_w: float | None) -> dict[str, Any] | None:
    """The plan's ``phaze.power`` as JSON, with the energy per token and the chip's published
    power (``power_w``, its TDP) beside the predicted one; None when the step was not priced
    in energy (a chip without an ``[energy]`` table, or an infeasible plan)."""
    from phaze_ir.attributes import PowerAttr

    attr = module.attributes.get(keys.POWER)
    if not isinstance(attr, PowerAttr):
        return None
    out: dict[str, Any] = dict(attr.as_dict())
    seq = keys.sample_seq_len(module)  # 0: a model without a sequence
    out["energy_per_token_j"] = float(out["step_energy_j"]) / (int(plan["global_batch"]) * seq) if seq else None
    out["published_power_w"] = published_w
    return out


def cost_json(module: ModuleOp, plan: dict[str, Any], acc) -> dict[str, Any]:
    """The plan's ``cost`` and ``carbon`` (``passes/algorithms/cost.py``), each None when the
    hardware lacks what prices it (``[manufacturing]``; ``[deployment]`` and ``[energy]`` for
    the step's carbon) or the plan is infeasible."""
    from passes.algorithms.cost import plan_cost
    from phaze_ir.attributes import PowerAttr

    if plan.get("feasible") != "yes":
        return {"cost": None, "carbon": None}
    attr = module.attributes.get(keys.POWER)
    energy = float(attr.as_dict()["step_energy_j"]) if isinstance(attr, PowerAttr) else None
    step_s = float(plan["time_per_batch_s"])
    c = plan_cost(acc, int(plan["devices_used"]), step_s, energy)
    if c is None:
        return {"cost": None, "carbon": None}
    cost = {
        "die_usd": c.die_usd,
        "die_yield": c.die_yield,
        "chip_usd": c.chip_usd,
        "cluster_usd": c.cluster_usd,
        "samples_per_s_per_kusd": float(plan["throughput_samples_per_s"]) / (c.cluster_usd / 1e3),
    }
    carbon: dict[str, Any] | None = None
    if c.embodied_kgco2e_per_step is not None:
        samples = int(plan["global_batch"])
        seq = keys.sample_seq_len(module)
        operational = c.operational_kgco2e_per_step
        total = c.embodied_kgco2e_per_step + (operational or 0.0) if operational is not None else None
        carbon = {
            "embodied_kgco2e_per_chip": c.embodied_kgco2e_per_chip,
            "embodied_kgco2e_per_step": c.embodied_kgco2e_per_step,
            "operational_kgco2e_per_step": operational,
            "kgco2e_per_step": total,
            "kgco2e_per_sample": total / samples if total is not None else None,
            "kgco2e_per_token": total / (samples * seq) if total is not None and seq else None,
        }
    return {"cost": cost, "carbon": carbon}


def summary(module: ModuleOp, candidates: Sequence[Candidate] = (), headroom: float = 0.0) -> str:
    """The plan's summary (:mod:`phaze.plan.summary`) as text for stderr ("" when it does not fit)."""
    if plan_record(module).get("feasible") != "yes":
        return ""
    found = plan_json(module, list(candidates), headroom=headroom)["summary"]
    return "\n".join(found["lines"]) if found else ""


def placement_table(module: ModuleOp) -> str:
    """The plan's placement as a one-row table (and the capacity factor the expert GEMMs are
    padded to, if any)."""
    plan = plan_record(module)
    stages = [s.as_dict() for s in keys.records_of(module, keys.STAGES, StageInfoAttr)]
    recompute = ",".join(sorted({str(s["recompute"]) for s in stages}))
    mem = max(int(s["memory_bytes"]) for s in stages) / 2**30
    v = int(plan["virtual_stages"])
    schedule = "1f1b" if v == 1 else f"interleaved:{v}"
    sp = "on" if keys.SEQUENCE_PARALLEL in module.attributes else "off"
    # A CP column only under context parallelism: the tables of every other plan stay as they were.
    cp = int(plan["cp"])
    head = (
        f"{'DP':>5} "
        + (f"{'CP':>4} " if cp > 1 else "")
        + f"{'PP':>4} {'TP':>4} {'SP':>3} {'schedule':>13} {'ZeRO':>4} {'EP':>3} {'ranks':>8} "
        f"{'micro-batch':>11} {'recompute':>14} {'s/batch':>10} {'samples/s':>11} {'GiB/device':>11}"
    )
    row = (
        f"{plan['dp']:>5} "
        + (f"{cp:>4} " if cp > 1 else "")
        + f"{plan['pp']:>4} {plan['tp']:>4} {sp:>3} {schedule:>13} {plan['zero']:>4} "
        f"{plan['expert_parallel']:>3} {plan['rank_order']:>8} "
        f"{plan['micro_batch_size']:>11} {recompute:>14} "
        f"{plan['time_per_batch_s']:>10.4g} {plan['throughput_samples_per_s']:>11.5g} {mem:>11.2f}"
    )
    factor = capacity_factor(module)
    note = "" if factor is None else f"\nexpert GEMMs padded to capacity factor {factor:g}"
    return head + "\n" + row + note


def power_line(module: ModuleOp) -> str:
    """One line of the plan's power for stderr ("" when not priced)."""
    from phaze_ir.attributes import PowerAttr

    attr = module.attributes.get(keys.POWER)
    if not isinstance(attr, PowerAttr):
        return ""

    p = {k: float(v) for k, v in attr.as_dict().items()}
    network = f" ({p['network_energy_j'] / 1e3:.4g} kJ of it the network's)" if p["network_energy_j"] > 0 else ""
    line = (
        f"power: {p['chip_power_w']:.1f} W per chip ({p['static_power_w']:.1f} W static), "
        f"{p['step_energy_j'] / 1e3:.4g} kJ per step{network}, {p['energy_per_sample_j']:.4g} J per sample"
    )
    limit = p["power_limit_w"]
    if limit > 0 and (p["clock_limited_share"] > 0 or p["chip_power_w"] >= limit * (1 - 1e-9)):
        # A chip at its power limit lowers its clock (the H100's GEMMs run at 1335-1500 MHz
        # under 700 W, data/h100/power.csv); the ops it slows, and the step, are priced so.
        whole = f", the step {p['power_limit_s']:.4g} s longer" if p["power_limit_s"] > 0 else ""
        # (one line: a summary line's line break would be escaped, printed as a literal "\n")
        line += f"; at the {limit:g} W limit: clock-limited, {100 * p['clock_limited_share']:.3g} % of the step{whole}"
    return line


def cost_line(module: ModuleOp, plan: dict[str, Any]) -> str:
    """One line of the plan's cost and carbon for stderr ("" when not priced)."""
    from phaze_ir.hardware_ir import module_accelerator

    priced = cost_json(module, plan, module_accelerator(module, "phazec"))
    cost, carbon = priced["cost"], priced["carbon"]
    if cost is None:
        return ""
    line = (
        f"cost to make: ${cost['chip_usd']:,.0f} per chip (die ${cost['die_usd']:,.0f} at "
        f"{cost['die_yield']:.1%} yield), ${cost['cluster_usd']:,.0f} for the cluster"
    )
    if carbon is not None and carbon["kgco2e_per_step"] is not None:
        share = carbon["embodied_kgco2e_per_step"] / carbon["kgco2e_per_step"]
        line += f"; {carbon['kgco2e_per_step'] * 1e3:.4g} g CO2e per step ({share:.1%} embodied)"
    return line
