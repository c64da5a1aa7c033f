"""``phaze-place-devices``: choose data, pipeline and tensor parallelism, the micro-batch count
and the recompute policy per stage, and write the plan into the IR."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ArrayAttr, IntegerAttr, ModuleOp, StringAttr
from xdsl.passes import ModulePass
from xdsl.utils.arg_spec import ArgSpec

from passes.algorithms import _phaze_rs
from passes.algorithms import placement as pl
from passes.algorithms.latency import FixedParams
from passes.algorithms.placement_options import PlacementOptions
from passes.algorithms.priced_step import PricedStep, static_numbers, timed
from passes.graph_view import arg_role, step_function
from passes.how_ops_run import expert_gemm_times
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.attributes import (
    LayerInfoAttr,
    LayerMemoryAttr,
    LayerRecomputeAttr,
    LayerScheduleAttr,
    PlanAttr,
    RecordAttr,
    StageInfoAttr,
)
from phaze_ir.errors import PhazeError
from phaze_ir.hardware_ir import module_accelerator
from phaze_ir.plan_check import check_plan


def _records(module: ModuleOp, key: keys.Key, kind: type[RecordAttr]) -> list[dict]:
    return [r.as_dict() for r in keys.require_records(module, key, kind)]


def priced_step(module: ModuleOp, pass_name: str) -> PricedStep:
    """The step as the cost passes priced it on the module's accelerator
    (:class:`~passes.algorithms.priced_step.PricedStep`): each layer's numbers from
    ``phaze.layers``, ``phaze.layer_schedule`` (scheduled makespans: forward and backward per
    micro-batch, the optimizer step once per batch), ``phaze.layer_recompute`` and
    ``phaze.layer_memory``, and the module's micro-batch, TP width, context-parallel degree,
    sequence parallelism, repeated blocks, runtime and gradient dtype."""
    infos = _records(module, keys.LAYERS, LayerInfoAttr)
    schedule = _records(module, keys.LAYER_SCHEDULE, LayerScheduleAttr)
    recompute = _records(module, keys.LAYER_RECOMPUTE, LayerRecomputeAttr)
    memory = _records(module, keys.LAYER_MEMORY, LayerMemoryAttr)
    by_index = [{r["index"]: r for r in rs} for rs in (schedule, recompute, memory)]
    # an MoE layer's expert GEMMs at each EP degree: the DP prices the plan's e at its shape
    gemms = expert_gemm_times(module, module_accelerator(module, pass_name))
    layers = []
    for info in infos:
        i = info["index"]
        try:
            s, r, m = (d[i] for d in by_index)
        except KeyError:
            raise PhazeError(
                f"{pass_name}: layer {i} has no schedule, recompute or memory record; "
                "rerun the pipeline after phaze-group-layers"
            ) from None
        saved = (r["none_bytes"], r["selective_bytes"], r["full_bytes"])
        layers.append(
            timed(
                static_numbers(info, m, saved),
                fwd_s=s["fwd_s"],
                bwd_s=s["bwd_s"],
                selective_s=r["selective_s"],
                full_s=r["full_s"],
                opt_s=s["opt_s"],
                cast_s=s["cast_s"],
                expert_gemm_s=gemms.get(i, ()),
            )
        )
    tp = tp_width(module, pass_name)
    try:
        blocks = pl.block_range([str(info["kind"]) for info in infos])
    except pl.PlacementError as e:
        raise PhazeError(f"{pass_name}: {e}") from e
    return PricedStep(
        layers=layers,
        micro_batch=keys.int_of(module, keys.MICRO_BATCH_SIZE, 1),
        tp=tp,
        cp=keys.int_of(module, keys.CONTEXT_PARALLEL, 1),
        sequence_parallel=keys.SEQUENCE_PARALLEL in module.attributes,
        blocks=blocks,
        grads_freed=frees_grads(module),
        grad_element_bytes=grad_element_bytes(module),
    )


def build_problem(module: ModuleOp, options: PlacementOptions, pass_name: str) -> _phaze_rs.ProblemDict:
    """The DP problem of a module annotated by the cost passes, under the placement
    ``options``: its :func:`priced_step` on its accelerator's HBM and network, assembled by
    the one assembly (:func:`passes.algorithms.placement.problem`)."""
    step = priced_step(module, pass_name)
    acc = module_accelerator(module, pass_name)
    try:
        return pl.problem(
            step,
            options,
            hbm_bytes=acc.hbm.bytes,
            levels=acc.network,
            memory_bound_Bps=FixedParams.of(acc, chip=True).hbm_Bps,
        )
    except pl.PlacementError as e:
        raise PhazeError(f"{pass_name}: {e}") from e


def tp_width(module: ModuleOp, pass_name: str) -> int:
    """``phaze.tp_width``, checked against how the step is sharded: every collective
    ``phaze-shard-tensor-parallel`` inserted spans ``width`` devices, and a width above 1 has
    some (a width edited in a plan would price the step as another width than its ops').  A step
    function holding nothing but its return is a plan template's skeleton
    (``phaze/search/plan_template.py``): the layers' numbers it is placed from were checked when
    the template was made, and it has no ops to check against."""
    width = keys.int_of(module, keys.TP_WIDTH, 1)
    ops = list(step_function(module).body.block.ops)
    if len(ops) == 1 and isinstance(ops[0], func.ReturnOp):
        return width
    groups = sorted({o.group_size.value.data for o in ops if isinstance(o, ph.CollectiveOp)})
    if any(g != width for g in groups) or (width > 1 and not groups):
        spans = f"collectives of group size {', '.join(map(str, groups))}" if groups else "no collective"
        raise PhazeError(
            f"{pass_name}: phaze.tp_width = {width} is not how the step is sharded (it has {spans}); "
            f"expected the width phaze-shard-tensor-parallel wrote"
        )
    return width


def grad_element_bytes(module: ModuleOp) -> int:
    """The bytes of one gradient element as the memory pass counts ``grad_bytes`` (a gradient
    in its parameter's dtype): the element width that holds most of the parameters' bytes, 4
    under autocast's mixed precision or --dtype float32, else 2."""
    fn = step_function(module)
    by_width: dict[int, int] = {}
    for i, a in enumerate(fn.body.block.args):
        if arg_role(fn, i)[0] == "param":
            width = ph.element_bytes(ph.tensor_type(a).element_type)
            by_width[width] = by_width.get(width, 0) + ph.tensor_bytes(a.type)
    return 4 if by_width.get(4, 0) > by_width.get(2, 0) else 2


def frees_grads(module: ModuleOp) -> bool:
    """Whether the runtime whose kernels the module is priced as (``phaze.kernels``) frees the
    gradients after each step (:data:`placement.GRADS_FREED_RUNTIMES`)."""
    runtime = module.attributes.get(keys.KERNELS)
    return isinstance(runtime, StringAttr) and runtime.data in pl.GRADS_FREED_RUNTIMES


def solve(problem: _phaze_rs.ProblemDict, fixed: tuple[int, int, int] | None) -> _phaze_rs.ResultDict:
    """Run the Rust DP: the optimum, or the evaluation of a fixed (PP, DP, TP)."""
    if fixed is None:
        return _phaze_rs.solve_placement(problem)
    mismatch = pl.fixed_tp_mismatch(fixed, problem["tp"], problem["devices"], problem["cp"])
    if mismatch:
        raise PhazeError(mismatch)
    return _phaze_rs.evaluate_placement(problem, fixed[0], fixed[1])


def write_plan(
    module: ModuleOp,
    problem: _phaze_rs.ProblemDict,
    result: _phaze_rs.ResultDict,
    placement: str,
    memory_headroom: float = 0.0,
) -> None:
    """Write ``phaze.plan``, ``phaze.stages`` and each op's ``phaze.stage`` (``memory_headroom``:
    the fraction of HBM the problem's ``hbm_bytes`` left free, said in a memory refusal)."""
    plan = result.get("plan")
    fits = plan is not None
    dp: Mapping[str, Any] = plan if plan is not None else {}  # the DP's numbers, 0 (and "") when nothing fits
    module.attributes[keys.PLAN] = PlanAttr.make(
        devices=problem["devices"],
        global_batch=problem["global_batch"],
        tp=problem["tp"],
        cp=problem["cp"],
        expert_tensor_parallel=problem.get("expert_tensor_parallel") or problem["tp"],
        micro_batch_size=problem["micro_batch"],
        **{name: dp[name] if fits else 0 for name in _PLAN_COUNTS},
        **{name: float(dp[name]) if fits else 0.0 for name in ("time_per_batch_s", "throughput_samples_per_s")},
        rank_order=dp["rank_order"] if fits else "",
        pipeline_transfer=("split" if problem["pipeline_split"] else "whole") if fits else "",
        placement=placement,
        feasible="yes" if result["feasible"] else "no",
        binding=pl.binding_message(result, memory_headroom),
    )
    stages = dp["stages"] if fits else []
    module.attributes[keys.STAGES] = ArrayAttr([_stage_info(k, s) for k, s in enumerate(stages)])
    # The power priced for the plan this one replaces (a plan placed again: other devices, another
    # batch) is not this plan's: phaze-estimate-power, after this pass, prices this one.
    module.attributes.pop(keys.POWER, None)
    stage_of = stage_of_layers(stages)
    for op in step_function(module).body.block.ops:
        layer = op.attributes.get(keys.LAYER)
        if isinstance(layer, IntegerAttr) and layer.value.data in stage_of:
            op.attributes[keys.STAGE] = ph.int_attr(stage_of[layer.value.data])


#: The plan's counts as the DP returns them, by their ``phaze.plan`` names.
_PLAN_COUNTS = (
    "dp",
    "pp",
    "virtual_stages",
    "zero",
    "expert_parallel",
    "num_micro_batches",
    "max_memory_bytes",
    "devices_used",
)
#: A stage's memory parts as the DP names them, by their ``#phaze.stage_info`` names.
_STAGE_MEMORY = {
    "param_bytes": "params",
    "grad_bytes": "grads",
    "optimizer_bytes": "optimizer",
    "activation_bytes": "activations",
    "workspace_bytes": "workspace",
}


def _stage_info(index: int, stage: Mapping[str, Any]) -> StageInfoAttr:
    """A DP stage as ``#phaze.stage_info``: its counts and seconds, its time and memory by part."""
    seconds = {name: stage[name] for name in ("time_s", "exposed_dp_s", "optimizer_s")} | stage["time_parts"]
    return StageInfoAttr.make(
        index=index,
        **{name: stage[name] for name in ("rank", "first_layer", "last_layer", "devices", "memory_bytes")},
        **{name: float(v) for name, v in seconds.items()},
        **{name: stage["memory"][part] for name, part in _STAGE_MEMORY.items()},
        recompute=stage["recompute"],
        in_flight=stage["in_flight"],
    )


def stage_of_layers(stages: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    """Each layer's stage (its index in ``stages``, each with ``first_layer`` and ``last_layer``:
    the DP's stages or ``phaze.stages``' records): the ``phaze.stage`` of the layer's ops."""
    return {layer: k for k, s in enumerate(stages) for layer in range(s["first_layer"], s["last_layer"] + 1)}


@dataclass(frozen=True)
class PlaceDevicesPass(PlacementOptions, ModulePass):
    """Find the fastest placement of the training step on ``devices`` accelerators (exact DP
    in Rust over data parallelism, contiguous pipeline stages under 1F1B, recompute policy per
    stage, at the module's TP width and micro-batch size) and write it: ``phaze.plan`` and
    ``phaze.stages`` on the module, ``phaze.stage`` on every op.

    Its options are the placement options, declared with their help in
    ``passes/algorithms/placement_options.py``. A fixed placement
    (``placement="expert:PP,DP,TP"``) or a fixed recompute policy that does not fit is still
    written, with ``feasible = "no"`` and the binding constraint. Requires the cost annotations
    of ``phaze-schedule-ops`` and ``phaze-insert-recompute`` and a ``phaze.accelerator``.
    """

    name = "phaze-place-devices"

    @classmethod
    def from_spec(cls, spec: ArgSpec) -> PlaceDevicesPass:
        # A typed option (one that declares a parse: --zero, --pipeline-schedule, ...) is text
        # in a spec, as xDSL's options are ints, floats, bools and strings: it is read by its
        # field's parse (PlacementOptions.__post_init__), the one parser the command line and
        # the API share, not checked against the field's type by xDSL.
        given = spec.normalize_parameter_names().parameters
        typed = {f.name for f in dataclasses.fields(cls) if f.metadata.get("parse") is not None}
        texts: dict[str, Any] = {name: _spec_text(values) for name, values in given.items() if name in typed}
        made = super().from_spec(ArgSpec(spec.name, {n: v for n, v in given.items() if n not in typed}))
        if texts:
            made = dataclasses.replace(made, **texts)
        # Which options the spec leaves out: on a module placed already, those are the plan's
        # own (its devices and global batch), not the pass's defaults.
        object.__setattr__(made, "_unset", frozenset(f for f in _PLAN_SETTINGS if f not in given))
        return made

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        unset: frozenset[str] = getattr(self, "_unset", frozenset())
        plan = op.attributes.get(keys.PLAN)
        if unset and isinstance(plan, PlanAttr):
            own = {f: plan.get(f) for f in unset}
            replaced = dataclasses.replace(self, **own)  # type: ignore[arg-type]  # the plan's ints
            object.__setattr__(replaced, "_unset", frozenset())
            replaced.apply(ctx, op)
            return
        try:
            self.check()
            fixed = pl.parse_placement(self.placement, keys.string_of(op, keys.MODEL))
        except pl.PlacementError as e:
            raise PhazeError(f"{self.name}: {e}") from e
        problem = build_problem(op, self, self.name)
        result = solve(problem, fixed)
        label = "phaze" if fixed is None else "expert:{},{},{}".format(*fixed)
        write_plan(op, problem, result, label, self.memory_headroom)
        check_plan(op)  # a plan that contradicts itself (or the ops) is never left written


def _spec_text(values: tuple) -> str:
    """A typed option's text as a spec gives it: one string, or one int (a degree, as
    :meth:`~xdsl.utils.arg_spec.ArgSpecConvertible.spec` writes a pass holding one); anything
    else refused as xDSL refuses a value not of a text option's type."""
    if len(values) == 1 and isinstance(values[0], str):
        return values[0]
    if len(values) == 1 and isinstance(values[0], int) and not isinstance(values[0], bool):
        return str(values[0])
    raise ValueError(f"Incompatible types: given {values}, expected {str}")


#: The settings a plan records, which a pass run on it without them takes from it.
_PLAN_SETTINGS = ("devices", "global_batch")
