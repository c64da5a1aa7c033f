"""phaze's passes: one file per pass, each a thin xDSL ``ModulePass`` over an algorithm in
``passes/algorithms`` (pure code, no xDSL).  ``ALL_PASSES`` is what ``phaze-opt`` and the
``xdsl.universe`` entry point register."""

from __future__ import annotations

from collections.abc import Callable

from xdsl.passes import ModulePass


def _group_layers():
    from passes.group_layers import GroupLayersPass

    return GroupLayersPass


def _insert_optimizer():
    from passes.insert_optimizer import InsertOptimizerPass

    return InsertOptimizerPass


def _mark_saved():
    from passes.mark_saved import MarkSavedPass

    return MarkSavedPass


def _shard_tensor_parallel():
    from passes.shard_tensor_parallel import ShardTensorParallelPass

    return ShardTensorParallelPass


def _context_parallel():
    from passes.context_parallel import ContextParallelPass

    return ContextParallelPass


def _overlap_tensor_parallel():
    from passes.overlap_tensor_parallel import OverlapTensorParallelPass

    return OverlapTensorParallelPass


def _form_kernels():
    from passes.form_kernels import FormKernelsPass

    return FormKernelsPass


def _tile_pe_array():
    from passes.tile_pe_array import TilePEArrayPass

    return TilePEArrayPass


def _estimate_latency():
    from passes.estimate_latency import EstimateLatencyPass

    return EstimateLatencyPass


def _estimate_energy():
    from passes.estimate_energy import EstimateEnergyPass

    return EstimateEnergyPass


def _estimate_power():
    from passes.estimate_power import EstimatePowerPass

    return EstimatePowerPass


def _schedule_ops():
    from passes.schedule_ops import ScheduleOpsPass

    return ScheduleOpsPass


def _insert_recompute():
    from passes.insert_recompute import InsertRecomputePass

    return InsertRecomputePass


def _place_devices():
    from passes.place_devices import PlaceDevicesPass

    return PlaceDevicesPass


ALL_PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "phaze-context-parallel": _context_parallel,
    "phaze-estimate-energy": _estimate_energy,
    "phaze-estimate-latency": _estimate_latency,
    "phaze-estimate-power": _estimate_power,
    "phaze-form-kernels": _form_kernels,
    "phaze-group-layers": _group_layers,
    "phaze-insert-optimizer": _insert_optimizer,
    "phaze-insert-recompute": _insert_recompute,
    "phaze-mark-saved": _mark_saved,
    "phaze-overlap-tensor-parallel": _overlap_tensor_parallel,
    "phaze-place-devices": _place_devices,
    "phaze-schedule-ops": _schedule_ops,
    "phaze-shard-tensor-parallel": _shard_tensor_parallel,
    "phaze-tile-pe-array": _tile_pe_array,
}

#: The passes that turn an imported joint graph into the training graph, in order.
TRAINING_PIPELINE = "phaze-insert-optimizer,phaze-mark-saved,phaze-group-layers"
