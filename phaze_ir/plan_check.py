"""The relations between a plan's numbers, verified wherever a plan is read.

Each record of ``phaze.plan`` and ``phaze.stages`` checks its own fields' ranges when it is
parsed (:class:`~phaze_ir.attributes.RecordAttr`); what no single field can say is whether they
agree with each other, and with the module they describe. :func:`check_plan` verifies that, as
``phaze-place-devices`` writes a plan (``passes/place_devices.py``, the Rust DP's
``plan_of_stages`` in ``rust/phaze-dp/src/search.rs``):

- ``devices_used = dp·pp·tp·cp <= devices``;
- ``micro_batch_size·num_micro_batches·dp = global_batch`` (``num_micro_batches >= 1``);
- ``throughput_samples_per_s = global_batch / time_per_batch_s``;
- ``time_per_batch_s = (m + (pp − 1)/v)·max time_s + max exposed_dp_s + max optimizer_s`` over
  the stages (the placement's step: what the power limit adds is ``phaze.power``'s
  ``power_limit_s``), ``max_memory_bytes`` their largest ``memory_bytes``;
- each stage's parts add up to it (``compute_s + recompute_s + pp_comm_s + zero_comm_s +
  ep_comm_s = time_s``, the memory parts to ``memory_bytes``);
- ``pp·v`` stages, stage k on rank ``k mod pp`` with ``tp`` devices, holding consecutive layers
  from the first of ``phaze.layers`` to its last;
- the plan against the ops' sharding: ``tp = phaze.tp_width``, ``cp = phaze.context_parallel``,
  ``micro_batch_size = phaze.micro_batch_size``, ``expert_parallel`` dividing ``dp`` (with
  ``expert_tensor_parallel`` below ``tp``, which it divides: ``expert_tensor_parallel·expert_parallel``
  dividing ``tp·cp·dp``, the experts' own mesh), and each op's ``phaze.stage`` the stage that
  holds its ``phaze.layer``;
- ``phaze.layers`` numbered 0..n−1 in order, and each per-layer record (``phaze.layer_latency``,
  ``_energy``, ``_schedule``, ``_recompute``, ``_memory``) one per layer with those indices;
- ``phaze.power``: ``energy_per_sample_j = step_energy_j / global_batch``,
  ``network_energy_j <= step_energy_j``, ``static_power_w <= mean_chip_power_w <= chip_power_w``
  ``chip_power_w <= power_limit_w`` where the chip states a limit (each field also >= 0,
  ``clock_limited_share`` at most 1: ``phaze_ir/attributes.py``);
- a fixed placement's ``placement = "expert:PP,DP,TP"`` the plan's own ``pp``, ``dp`` and ``tp``;
- ``feasible = yes`` exactly when ``binding`` is empty; a placed plan's ``rank_order`` and
  ``pipeline_transfer`` one of their words, and each stage's ``in_flight >= 1``.

A plan where nothing fits (``dp = 0``) has no stages. Times compare within a relative 1e-9
(the DP's sums in another order), counts and bytes exactly. A broken relation is one
:class:`PhazeError` line naming it.
"""

from __future__ import annotations

import math
import re
from typing import NoReturn

from xdsl.dialects.builtin import ArrayAttr, IntegerAttr
from xdsl.ir import Operation

from phaze_ir import keys
from phaze_ir.attributes import LayerInfoAttr, PlanAttr, PowerAttr, RecordAttr, StageInfoAttr
from phaze_ir.errors import PhazeError

__all__ = ["check_plan"]

#: Relative tolerance of a time compared with the sum or product it is made of.
_REL = 1e-9
_TIME_PARTS = ("compute_s", "recompute_s", "pp_comm_s", "zero_comm_s", "ep_comm_s")
#: The busiest chip's power against its limit: phaze-estimate-power lengthens the step to
#: dynamic energy / (limit - static), so it lands on the limit within rounding.
_POWER_REL = 1e-6
#: The words a placed plan's rank_order and pipeline_transfer take (the Rust DP's RankOrder names,
#: passes/algorithms/placement.py's PIPELINE_TRANSFERS).
_RANK_ORDERS = ("tp-dp-pp", "tp-pp-dp")
_PIPELINE_TRANSFERS = ("whole", "split")
#: A fixed placement as the plan records it (``expert:PP,DP,TP``: ``--placement``'s words).
_FIXED_PLACEMENT = re.compile(r"expert:(\d{1,19}),(\d{1,19}),(\d{1,19})")
_MEMORY_PARTS = ("param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes", "workspace_bytes")


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=_REL, abs_tol=1e-300)


def check_plan(module: Operation) -> None:
    """A :class:`PhazeError` naming the first relation of ``module``'s plan that does not hold
    (none without a ``phaze.plan``)."""
    plan_attr = module.attributes.get(keys.PLAN)
    stages_attr = module.attributes.get(keys.STAGES)
    if plan_attr is None:
        if stages_attr is not None:
            _fail(module, f"{keys.STAGES} without {keys.PLAN}")
        return
    if not isinstance(plan_attr, PlanAttr):
        _fail(module, f"{keys.PLAN} = {str(plan_attr)[:60]}: expected a #phaze.plan")
    p = plan_attr.as_dict()
    stages = [s.as_dict() for s in keys.require_records(module, keys.STAGES, StageInfoAttr)]
    dp, pp, tp, cp = (int(p[k]) for k in ("dp", "pp", "tp", "cp"))
    v, m, b = (int(p[k]) for k in ("virtual_stages", "num_micro_batches", "micro_batch_size"))
    batch, used, devices = (int(p[k]) for k in ("global_batch", "devices_used", "devices"))
    time, rate = float(p["time_per_batch_s"]), float(p["throughput_samples_per_s"])
    if (p["feasible"] == "yes") != (p["binding"] == ""):
        _fail(module, f"feasible = {p['feasible']} with binding = {str(p['binding'])[:60]!r}: expected a binding "
              "constraint exactly when the plan does not fit")  # fmt: skip
    if dp == 0:  # nothing fits: the DP's counts are 0 and there are no stages
        if p["feasible"] == "yes" or stages or used or pp or m or time or rate:
            _fail(module, "dp = 0 (no placement fits), expected feasible = no, no stages and zero counts and times")
        return
    ep = int(p["expert_parallel"])
    for name, value in (("pp", pp), ("virtual_stages", v), ("num_micro_batches", m), ("expert_parallel", ep)):
        if value < 1:
            _fail(module, f"{name} = {value} with dp = {dp}: expected >= 1")
    if used != dp * pp * tp * cp:
        _fail(module, f"devices_used = {used}, expected dp·pp·tp·cp = {dp}·{pp}·{tp}·{cp} = {dp * pp * tp * cp}")
    if used > devices:
        _fail(module, f"devices_used = {used} on {devices} devices: expected at most devices")
    if b * m * dp != batch:
        _fail(
            module,
            f"micro_batch_size·num_micro_batches·dp = {b}·{m}·{dp} = {b * m * dp}, expected global_batch = {batch}",
        )
    if not time > 0 or not _close(rate, batch / time):
        _fail(
            module,
            f"throughput_samples_per_s = {rate:.6g}, expected global_batch / time_per_batch_s = "
            f"{batch} / {time:.6g} s = {batch / time if time > 0 else math.inf:.6g}",
        )
    etp = int(p["expert_tensor_parallel"])
    if etp == tp:
        if dp % ep:
            _fail(module, f"expert_parallel = {ep} does not divide dp = {dp}")
    elif tp % etp or (tp * cp * dp) % (etp * ep):
        _fail(
            module,
            f"expert_tensor_parallel = {etp} with expert_parallel = {ep}: expected a width dividing tp = {tp} "
            f"and etp·ep dividing tp·cp·dp = {tp * cp * dp}",
        )
    for name, words in (("rank_order", _RANK_ORDERS), ("pipeline_transfer", _PIPELINE_TRANSFERS)):
        if p[name] not in words:
            _fail(module, f"{name} = {str(p[name])[:40]!r} with dp = {dp}: expected one of {', '.join(words)}")
    fixed = _FIXED_PLACEMENT.fullmatch(str(p["placement"]))
    if fixed and tuple(map(int, fixed.groups())) != (pp, dp, tp):
        _fail(module, f"placement = {str(p['placement'])!r} with pp = {pp}, dp = {dp}, tp = {tp}: expected "
              f"expert:{pp},{dp},{tp}, the degrees the placement fixed")  # fmt: skip
    _check_sharding(module, tp, cp, b)
    _check_layer_records(module)
    _check_stages(module, stages, p, pp, v, tp, m, time)
    _check_power(module, batch)


def _check_sharding(module: Operation, tp: int, cp: int, b: int) -> None:
    """The plan's degrees as the ops are sharded and traced."""
    for field, value, key in (
        ("tp", tp, keys.TP_WIDTH),
        ("cp", cp, keys.CONTEXT_PARALLEL),
        ("micro_batch_size", b, keys.MICRO_BATCH_SIZE),
    ):
        if key == keys.MICRO_BATCH_SIZE and key not in module.attributes:
            continue
        own = keys.int_of(module, key, 1)
        if value != own:
            _fail(module, f"{field} = {value}, but the ops are priced for {key} = {own}")


def _check_stages(
    module: Operation, stages: list[dict], p: dict, pp: int, v: int, tp: int, m: int, time: float
) -> None:
    if len(stages) != pp * v:
        _fail(module, f"{len(stages)} stages in {keys.STAGES}, expected pp·virtual_stages = {pp}·{v} = {pp * v}")
    layers = keys.records_of(module, keys.LAYERS, LayerInfoAttr)
    indices = [int(r.as_dict()["index"]) for r in layers]
    expected_first = min(indices) if indices else int(stages[0]["first_layer"])
    for k, s in enumerate(stages):
        where = f"stage {k}"
        if s["index"] != k or s["rank"] != k % pp:
            _fail(module, f"{where} has index {s['index']} and rank {s['rank']}, expected {k} and {k % pp}")
        if s["devices"] != tp:
            _fail(module, f"{where} has devices = {s['devices']}, expected the plan's tp = {tp}")
        first, last = int(s["first_layer"]), int(s["last_layer"])
        if first != expected_first or last < first:
            _fail(module, f"{where} holds layers {first}..{last}, expected consecutive layers from {expected_first}")
        expected_first = last + 1
        parts = sum(float(s[n]) for n in _TIME_PARTS)
        if not _close(parts, float(s["time_s"])):
            _fail(
                module,
                f"{where} time_s = {float(s['time_s']):.6g} s, expected the sum of its parts {parts:.6g} s",
            )
        if int(s["in_flight"]) < 1:
            _fail(module, f"{where} in_flight = {s['in_flight']}: expected >= 1 (the micro-batch it runs)")
        memory = sum(int(s[n]) for n in _MEMORY_PARTS)
        if memory != s["memory_bytes"]:
            _fail(module, f"{where} memory_bytes = {s['memory_bytes']}, expected the sum of its parts {memory}")
    if indices and expected_first != max(indices) + 1:
        _fail(module, f"the stages end at layer {expected_first - 1}, expected the last layer {max(indices)}")
    peak = max(int(s["memory_bytes"]) for s in stages)
    if p["max_memory_bytes"] != peak:
        _fail(module, f"max_memory_bytes = {p['max_memory_bytes']}, expected the largest stage's {peak}")
    factor = m + (pp - 1) / v
    longest = max(float(s["time_s"]) for s in stages)
    expected = factor * longest + max(float(s["exposed_dp_s"]) for s in stages)
    expected += max(float(s["optimizer_s"]) for s in stages)
    if not _close(time, expected):
        _fail(
            module,
            f"time_per_batch_s = {time:.6g} s, expected (m + (pp - 1)/v)·max stage time + max exposed DP + max "
            f"optimizer = {expected:.6g} s",
        )
    _check_op_stages(module, stages)


def _check_op_stages(module: Operation, stages: list[dict]) -> None:
    """Each op's ``phaze.stage`` is the stage that holds its ``phaze.layer``."""
    stage_of = {
        layer: k for k, s in enumerate(stages) for layer in range(int(s["first_layer"]), int(s["last_layer"]) + 1)
    }
    for op in module.walk():
        stage = op.attributes.get(keys.STAGE)
        if stage is None:
            continue
        layer = op.attributes.get(keys.LAYER)
        if not isinstance(stage, IntegerAttr) or not isinstance(layer, IntegerAttr):
            _fail(module, f"an op '{op.name}' has {keys.STAGE} = {stage} without an integer {keys.LAYER}")
        want = stage_of.get(layer.value.data)
        if stage.value.data != want:
            _fail(
                module,
                f"an op '{op.name}' of layer {layer.value.data} has {keys.STAGE} = {stage.value.data}, expected the "
                f"stage that holds its layer ({want})",
            )


#: The per-layer records of the module, each one record per layer of ``phaze.layers``.
_LAYER_RECORDS = (
    keys.LAYER_LATENCY,
    keys.LAYER_ENERGY,
    keys.LAYER_SCHEDULE,
    keys.LAYER_RECOMPUTE,
    keys.LAYER_MEMORY,
)


def _check_layer_records(module: Operation) -> None:
    """``phaze.layers`` numbered 0, 1, ... in order, and each per-layer record the module has
    (latency, energy, schedule, recompute, memory) one per layer, with the same indices."""
    reference, layers = keys.LAYERS, None
    if keys.LAYERS in module.attributes:
        layers = [int(r.as_dict()["index"]) for r in keys.records_of(module, keys.LAYERS, LayerInfoAttr)]
        if layers != list(range(len(layers))):
            _fail(module, f"{keys.LAYERS} has indices {_indices(layers)}, expected 0..{len(layers) - 1} in order")
    for key in _LAYER_RECORDS:
        attr = module.attributes.get(key)
        if not isinstance(attr, ArrayAttr):
            continue
        own = [int(r.as_dict()["index"]) for r in attr.data if isinstance(r, RecordAttr)]
        if layers is None:  # a module without phaze.layers (a pass's test input): its first per-layer record
            if own != list(range(len(own))):
                _fail(module, f"{key} has indices {_indices(own)}, expected 0..{len(own) - 1} in order")
            reference, layers = key, own
        elif own != layers:
            _fail(module, f"{key} has indices {_indices(own)}, expected those of {reference} (0..{len(layers) - 1})")


def _indices(values: list[int]) -> str:
    """A list of layer indices as a message quotes it: the first 8, then how many more."""
    shown = ", ".join(str(v) for v in values[:8])
    return f"[{shown}{f', ... ({len(values) - 8} more)' if len(values) > 8 else ''}]"


def _check_power(module: Operation, batch: int) -> None:
    """``phaze.power`` as ``phaze-estimate-power`` writes it: the energy per sample is the step's
    over the global batch, the network's a share of the step's, and the busiest chip's power at
    least the chips' mean, which is at least one die's static power."""
    power = module.attributes.get(keys.POWER)
    if not isinstance(power, PowerAttr):
        return
    w = {k: float(v) for k, v in power.as_dict().items()}  # (every field a number)
    step, per_sample = w["step_energy_j"], w["energy_per_sample_j"]
    if not _close(per_sample, step / batch):
        _fail(
            module,
            f"{keys.POWER} energy_per_sample_j = {per_sample:.6g} J, expected step_energy_j / global_batch = "
            f"{step:.6g} / {batch} = {step / batch:.6g} J",
        )
    if w["network_energy_j"] > step * (1 + _REL):
        _fail(
            module, f"{keys.POWER} network_energy_j = {w['network_energy_j']:.6g} J, more than the step's {step:.6g} J"
        )
    low, mean, high, limit = w["static_power_w"], w["mean_chip_power_w"], w["chip_power_w"], w["power_limit_w"]
    if limit > 0 and high > limit * (1 + _POWER_REL):  # (0: the chip states no limit)
        _fail(
            module,
            f"{keys.POWER} chip_power_w = {high:.6g} W above power_limit_w = {limit:.6g} W: expected the step "
            "lengthened until the busiest chip draws at most its limit (power_limit_s)",
        )
    if not (low <= mean * (1 + _REL) and mean <= high * (1 + _REL)):
        _fail(
            module,
            f"{keys.POWER} static_power_w = {low:.6g} W, mean_chip_power_w = {mean:.6g} W, chip_power_w = "
            f"{high:.6g} W: expected static <= mean <= the busiest chip's",
        )


def _fail(module: Operation, relation: str) -> NoReturn:
    raise PhazeError(f"'{module.name}' op {keys.PLAN} contradicts itself: {relation}")
