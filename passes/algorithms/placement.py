"""Assemble the device-placement problem that the Rust DP (``passes.algorithms._phaze_rs``) solves, from
per-layer numbers, and read its answer back.  Pure Python: the pass ``phaze-place-devices``
gathers the numbers from the IR; the model itself (1F1B, α–β network, memory) is documented in
the crate docs of ``rust/phaze-dp``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from passes.algorithms import _phaze_rs
from passes.algorithms.expert_gemms import ExpertTimes
from passes.algorithms.option_values import AUTO, Auto, PipelineSchedule, RankOrder, Zero
from passes.cache_file import is_int, is_number
from phaze_ir.files import excerpt, si_count
from phaze_ir.op_kinds import RecomputePolicy

if TYPE_CHECKING:
    from passes.algorithms.placement_options import PlacementOptions
    from passes.algorithms.priced_step import PricedStep

#: The paper's "expert" placements as (PP, DP, TP) (docs/design.md §6.4), by model name.
EXPERT_PLACEMENTS: dict[str, tuple[int, int, int]] = {
    "opt-350m": (12, 85, 1),
    "bert-large": (8, 128, 1),
    "gpt2-xl": (32, 32, 1),
    "llama2-7b": (8, 128, 1),
    "megatron-gpt2-8.3b": (8, 16, 8),
    "gpt3-175b": (32, 8, 4),
}


#: The recompute settings a user may give (``--recompute``): ``auto`` lets the DP choose each
#: stage's policy, a policy fixes it for every stage (docs/design.md §6.4).
RECOMPUTE_SETTINGS: tuple[_phaze_rs.RecomputeSetting, ...] = ("auto", *(p.value for p in RecomputePolicy))


#: The ZeRO settings a user may give (``--zero``): ``auto`` lets the DP choose, a stage fixes it.
ZERO_SETTINGS: tuple[_phaze_rs.ZeroSetting, ...] = ("auto", "0", "1", "2", "3")
#: How devices are numbered into groups, TP innermost (docs/design.md §5.5): ``tp-dp-pp``
#: (pipeline outermost: Megatron-LM's, torchtitan's and Megatron-DeepSpeed's default),
#: ``tp-pp-dp`` (data parallelism outermost: Megatron-LM's ``--use-tp-pp-dp-mapping``).
RANK_ORDER_SETTINGS: tuple[_phaze_rs.RankOrderSetting, ...] = ("auto", "tp-dp-pp", "tp-pp-dp")

#: How a pipeline transfer crosses a stage boundary: ``whole`` (every TP rank sends all of it,
#: Megatron-LM today) or ``split`` (each TP rank sends 1/t, the receiving TP group all-gathers:
#: DeepSpeed's pipeline engine, Megatron-LM's scatter-gather before sequence parallelism).
PIPELINE_TRANSFERS = ("whole", "split")
#: The dtypes the DP gradient collectives can run in, and the bytes of an element of each
#: (docs/design.md §5, "Gradient reduction dtype").
REDUCE_DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2}
#: The FSDP implementations a ZeRO-3 plan can run under, as the DP names them: torch's
#: ``fully_shard`` (FSDP2) and ``FullyShardedDataParallel`` (FSDP1), whose copies into and out
#: of their flat buffers differ (docs/design.md §6.5, "FSDP's copies").
FSDP_VERSIONS = {"2": "fsdp2", "1": "fsdp1"}
#: Bytes of FSDP's fp32 sharded parameter (its master copy) per element.
FSDP_MASTER_BYTES = 4


#: The runtimes (``phaze.kernels``) whose training loop frees the gradients after each step, so
#: that the first micro-batch's backward allocates them layer by layer: PyTorch's
#: ``Optimizer.zero_grad`` and ``Module.zero_grad`` default to ``set_to_none=True`` (torch 2.15,
#: torch/optim/optimizer.py, torch/nn/modules/module.py), which the Hugging Face Trainer's and
#: torchtitan's loops call, compiled or not, and ``AccumulateGrad`` keeps the first gradient it
#: is given (torch/csrc/autograd/functions/accumulate_grad.h). Megatron-LM allocates one
#: gradient buffer for the whole run and zeroes it (megatron/core/distributed/
#: param_and_grad_buffer.py), and ``ops`` is the paper's model: both hold every gradient.
GRADS_FREED_RUNTIMES = frozenset({"eager", "inductor"})


def parse_pipeline_transfer(text: str) -> bool:
    """Whether a ``pipeline_transfer`` setting splits the transfers over the TP group."""
    if text not in PIPELINE_TRANSFERS:
        raise PlacementError(f"pipeline transfer '{excerpt(text)}': expected one of {', '.join(PIPELINE_TRANSFERS)}")
    return text == "split"


def parse_reduce_dtype(text: str) -> int:
    """The bytes of one gradient element as a ``reduce_dtype`` setting moves it over the DP group."""
    if text not in REDUCE_DTYPES:
        raise PlacementError(f"reduce dtype '{excerpt(text)}': expected one of {', '.join(REDUCE_DTYPES)}")
    return REDUCE_DTYPES[text]


def parse_fsdp_version(text: str) -> str:
    """The DP's name of an ``fsdp_version`` setting's implementation."""
    if text not in FSDP_VERSIONS:
        raise PlacementError(f"fsdp version '{excerpt(text)}': expected one of {', '.join(FSDP_VERSIONS)}")
    return FSDP_VERSIONS[text]


_SCHEDULE = re.compile(r"^(auto|1f1b|interleaved:([1-9][0-9]*))$")


#: The most devices or samples a placement takes: 2^31 - 1, the bound of phazec's --devices and
#: --global-batch (a 32-bit int, as Megatron-LM and torchtitan take them; far beyond any real run).
MAX_COUNT = 2**31 - 1


class PlacementError(ValueError):
    """A bad placement option (its message is one line, for the user)."""


def _count(digits: str) -> int | None:
    """``digits`` as an integer when it is one of at most :data:`MAX_COUNT` (None otherwise):
    a larger one would reach the DP as an overflow, and ``int()`` of 4,300 digits or more
    raises instead of giving one."""
    if not digits.isdecimal() or len(digits.lstrip("0")) > len(str(MAX_COUNT)):  # ("²" is a digit, not decimal)
        return None
    value = int(digits)
    return value if value <= MAX_COUNT else None


def parse_recompute(text: str) -> _phaze_rs.RecomputeSetting:
    """A recompute setting, checked: one of :data:`RECOMPUTE_SETTINGS` (the Rust DP checks it
    again; this says it to the user before any work)."""
    for setting in RECOMPUTE_SETTINGS:
        if text == setting:
            return setting
    raise PlacementError(f"recompute '{excerpt(text)}': expected one of {', '.join(RECOMPUTE_SETTINGS)}")


def parse_zero(text: str) -> _phaze_rs.ZeroSetting:
    """A ZeRO setting, checked: one of :data:`ZERO_SETTINGS`."""
    for setting in ZERO_SETTINGS:
        if text == setting:
            return setting
    raise PlacementError(f"zero '{excerpt(text)}': expected one of {', '.join(ZERO_SETTINGS)}")


def parse_rank_order(text: str) -> _phaze_rs.RankOrderSetting:
    """A rank-order setting, checked: one of :data:`RANK_ORDER_SETTINGS` (``auto``: the DP
    chooses per option)."""
    for setting in RANK_ORDER_SETTINGS:
        if text == setting:
            return setting
    raise PlacementError(f"rank order '{excerpt(text)}': expected one of {', '.join(RANK_ORDER_SETTINGS)}")


def parse_expert_parallel(text: str) -> int | None:
    """An expert-parallel setting as the DP's ``expert_parallel``: ``auto`` -> None (the DP
    chooses among the degrees that divide both d and the experts), ``E`` -> E (>= 1)."""
    if text == "auto":
        return None
    degree = _count(text)
    if degree is not None and degree >= 1:
        return degree
    raise PlacementError(f"expert parallel '{excerpt(text)}': expected auto or a degree from 1 to {MAX_COUNT}")


def parse_pipeline_schedule(text: str) -> int | None:
    """A pipeline schedule setting as the DP's ``virtual_stages``: ``auto`` -> None (the DP
    chooses 1F1B or an interleaving), ``1f1b`` -> 1, ``interleaved:V`` -> V (V >= 2)."""
    m = _SCHEDULE.match(text)
    if not m:
        raise PlacementError(
            f"pipeline schedule '{excerpt(text)}': expected auto, 1f1b or interleaved:V (V >= 2 chunks per device)"
        )
    if m.group(1) == "auto":
        return None
    if m.group(1) == "1f1b":
        return 1
    v = _count(m.group(2))
    if v is None:
        raise PlacementError(f"pipeline schedule '{excerpt(text)}': expected interleaved:V with V at most {MAX_COUNT}")
    if v < 2:
        raise PlacementError(
            f"pipeline schedule '{excerpt(text)}': interleaved needs V >= 2 chunks per device (1 is 1f1b)"
        )
    return v


def pipeline_schedule(text: str) -> PipelineSchedule:
    """``--pipeline-schedule``'s text parsed once (``placement_options.option``'s ``parse``):
    what it reads as and the DP's ``virtual_stages`` (:func:`parse_pipeline_schedule`, whose
    ``PlacementError`` refuses a bad one)."""
    return PipelineSchedule(text, parse_pipeline_schedule(text))


def expert_parallel(text: str) -> int | Auto:
    """``--expert-parallel``'s text parsed once: :data:`AUTO` or the degree
    (:func:`parse_expert_parallel`, whose ``PlacementError`` refuses a bad one)."""
    degree = parse_expert_parallel(text)
    return AUTO if degree is None else degree


def block_range(kinds: list[str]) -> tuple[int, int] | None:
    """(first layer, count) of the ``block`` layers (``phaze.layer_info`` kinds), which must be
    contiguous; None when there are none (then interleaving splits every layer)."""
    idx = [i for i, k in enumerate(kinds) if k == "block"]
    if not idx:
        return None
    if idx != list(range(idx[0], idx[-1] + 1)):
        raise PlacementError(f"the block layers {idx} are not contiguous")
    return idx[0], len(idx)


@dataclass(frozen=True)
class LayerNumbers:
    """What the DP needs of one layer, for one micro-batch at the traced micro-batch size and TP
    width (see ``LayerDict`` in ``passes/algorithms/_phaze_rs.pyi``).  The TP all-reduces are ops
    of the layer (``phaze.collective``), priced by the latency pass and placed by the scheduler:
    they are in ``fwd_s``/``bwd_s``.  ``opt_s`` is the layer's optimizer step, once per batch
    (the scheduled makespan of its optimizer ops, ``phaze.layer_schedule``), and
    ``expert_opt_s`` the part of it that updates the experts' state (:func:`expert_part`)."""

    fwd_s: float
    bwd_s: float
    recompute_s: tuple[float, float, float]
    saved_bytes: tuple[int, int, int]
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    workspace_bytes: int
    boundary_bytes: int
    # An MoE layer's experts and the parts of the bytes above that are theirs, and the tokens
    # one forward dispatches to them (what expert parallelism divides and moves); 0 when dense.
    experts: int = 0
    expert_param_bytes: int = 0
    expert_grad_bytes: int = 0
    expert_optimizer_bytes: int = 0
    dispatch_bytes: int = 0
    opt_s: float = 0.0
    expert_opt_s: float = 0.0
    #: the FP8 weight casts of one forward (``phaze.layer_schedule``'s ``cast_s``), not in
    #: ``fwd_s`` nor ``recompute_s``: the DP prices them once a step below ZeRO-3 and in every
    #: forward under it (docs/design.md §5.11.5); ``expert_cast_s`` the experts' part
    #: (:func:`expert_part` of the weights), which EP divides by e
    cast_s: float = 0.0
    expert_cast_s: float = 0.0
    #: peak transient bytes while the backward runs after the forward was re-run (full
    #: recompute): ``memory.LayerMemory.recompute_workspace_bytes``
    recompute_workspace_bytes: int = 0
    #: the FP8 weight copies kept for the step (``memory.LayerMemory.fp8_weight_bytes``): held
    #: beside the weights, none under ZeRO-3
    fp8_weight_bytes: int = 0
    #: an MoE layer's expert GEMMs at each EP degree, at the EP member's shape
    #: (``expert_gemms.expert_gemm_times``; e = 1 the traced shape's, in the times above): the
    #: DP prices the layer at e with theirs at e in place of theirs at 1. Empty: the traced
    #: shape at every e
    expert_gemm_s: tuple[ExpertTimes, ...] = ()

    def as_dict(self) -> _phaze_rs.LayerDict:
        d = self._dict()
        if self.expert_gemm_s:
            d["expert_gemm_s"] = [x.as_dict() for x in self.expert_gemm_s]  # type: ignore[misc]
        return d

    def _dict(self) -> _phaze_rs.LayerDict:
        return {
            "fwd_s": self.fwd_s,
            "bwd_s": self.bwd_s,
            "recompute_s": list(self.recompute_s),
            "opt_s": self.opt_s,
            "expert_opt_s": self.expert_opt_s,
            "cast_s": self.cast_s,
            "expert_cast_s": self.expert_cast_s,
            "saved_bytes": list(self.saved_bytes),
            "param_bytes": self.param_bytes,
            "grad_bytes": self.grad_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "workspace_bytes": self.workspace_bytes,
            "recompute_workspace_bytes": self.recompute_workspace_bytes,
            "boundary_bytes": self.boundary_bytes,
            "experts": self.experts,
            "expert_param_bytes": self.expert_param_bytes,
            "expert_grad_bytes": self.expert_grad_bytes,
            "expert_optimizer_bytes": self.expert_optimizer_bytes,
            "dispatch_bytes": self.dispatch_bytes,
            "fp8_weight_bytes": self.fp8_weight_bytes,
        }

    @classmethod
    def from_json(cls, data: object) -> LayerNumbers:
        """The numbers :meth:`as_dict` wrote (as JSON), checked: exactly its keys (the expert
        ones may be missing, as a dense layer written before them), the times finite numbers
        >= 0 (the experts' optimizer step part of the layer's), the byte counts integers >= 0,
        three of each per recompute policy; a ``ValueError`` saying what is wrong otherwise."""
        names = ("fwd_s", "bwd_s", "recompute_s", *_OPT_FIELDS, "saved_bytes", *_BYTE_FIELDS)
        gemms: tuple[ExpertTimes, ...] = ()
        if isinstance(data, dict) and "expert_gemm_s" in data:  # an MoE layer priced at each EP degree
            data = dict(data)
            gemms = _expert_times_from_json(data.pop("expert_gemm_s"))
        if isinstance(data, dict) and not any(k in data for k in _EXPERT_FIELDS):
            data = {**data, **dict.fromkeys(_EXPERT_FIELDS, 0)}
        if isinstance(data, dict) and "fp8_weight_bytes" not in data:  # written before FP8's copies
            data = {**data, "fp8_weight_bytes": 0}
        if isinstance(data, dict) and "cast_s" not in data and "expert_cast_s" not in data:  # before the casts
            data = {**data, "cast_s": 0.0, "expert_cast_s": 0.0}
        if not isinstance(data, dict) or sorted(data) != sorted(names):
            raise ValueError(f"layer numbers have the fields {', '.join(names)}")

        def seconds(v: object) -> bool:
            return is_number(v) and v >= 0

        def count(v: object) -> bool:
            return is_int(v) and v >= 0

        for name, ok in (("recompute_s", seconds), ("saved_bytes", count)):
            v = data[name]
            if not (isinstance(v, list) and len(v) == 3 and all(ok(x) for x in v)):
                raise ValueError(f"layer {name} = {v!r}: expected three " + ("times" if ok is seconds else "counts"))
        for name in ("fwd_s", "bwd_s", *_OPT_FIELDS):
            if not seconds(data[name]):
                raise ValueError(f"layer {name} = {data[name]!r}: expected a time >= 0")
        if data["expert_opt_s"] > data["opt_s"]:
            raise ValueError(f"layer expert_opt_s = {data['expert_opt_s']!r}: more than its opt_s")
        if data["expert_cast_s"] > data["cast_s"]:
            raise ValueError(f"layer expert_cast_s = {data['expert_cast_s']!r}: more than its cast_s")
        for name in _BYTE_FIELDS:
            if not count(data[name]):
                raise ValueError(f"layer {name} = {data[name]!r}: expected a count >= 0")
        rs, sb = data["recompute_s"], data["saved_bytes"]
        return cls(
            fwd_s=float(data["fwd_s"]),
            bwd_s=float(data["bwd_s"]),
            recompute_s=(float(rs[0]), float(rs[1]), float(rs[2])),
            saved_bytes=(sb[0], sb[1], sb[2]),
            **{name: data[name] for name in _BYTE_FIELDS},
            opt_s=float(data["opt_s"]),
            expert_opt_s=float(data["expert_opt_s"]),
            cast_s=float(data["cast_s"]),
            expert_cast_s=float(data["expert_cast_s"]),
            expert_gemm_s=gemms,
        )


def _expert_times_from_json(data: object) -> tuple[ExpertTimes, ...]:
    """``LayerNumbers.expert_gemm_s`` as ``as_dict`` wrote it, checked (a ``ValueError`` saying
    what is wrong): a list of dicts with an EP degree >= 1 and finite times (from a common base:
    the search's are the changes from e = 1, of either sign), three recompute ones."""
    out = []
    for x in data if isinstance(data, list) else [None]:
        ok = (
            isinstance(x, dict)
            and sorted(x) == ["bwd_s", "e", "fwd_s", "recompute_s"]
            and is_int(x["e"])
            and x["e"] >= 1
            and all(is_number(x[k]) for k in ("fwd_s", "bwd_s"))
            and isinstance(x["recompute_s"], list)
            and len(x["recompute_s"]) == 3
            and all(is_number(v) for v in x["recompute_s"])
        )
        if not ok:
            raise ValueError(f"layer expert_gemm_s = {data!r}: expected a list of {{e, fwd_s, bwd_s, recompute_s}}")
        assert isinstance(x, dict)
        rs = x["recompute_s"]
        recompute = (float(rs[0]), float(rs[1]), float(rs[2]))
        out.append(ExpertTimes(x["e"], float(x["fwd_s"]), float(x["bwd_s"]), recompute))
    return tuple(out)


def expert_part(seconds: float, nbytes: int, expert_bytes: int) -> float:
    """The part of a layer's memory-bound work over ``nbytes`` (``seconds``) that is over its
    experts' ``expert_bytes`` of them: the optimizer step over the optimizer state (it reads
    and writes each byte once), the FP8 weight casts over the weights (each read once); the
    time goes with the bytes; 0 in a dense layer."""
    if expert_bytes <= 0 or nbytes <= 0:
        return 0.0
    return min(seconds, seconds * expert_bytes / nbytes)


_OPT_FIELDS = ("opt_s", "expert_opt_s", "cast_s", "expert_cast_s")
_EXPERT_FIELDS = ("experts", "expert_param_bytes", "expert_grad_bytes", "expert_optimizer_bytes", "dispatch_bytes")
_BYTE_FIELDS = (
    "param_bytes",
    "grad_bytes",
    "optimizer_bytes",
    "workspace_bytes",
    "recompute_workspace_bytes",
    "boundary_bytes",
    *_EXPERT_FIELDS,
    "fp8_weight_bytes",
)


def check_memory_headroom(fraction: float) -> None:
    """The one-line refusal of a ``memory_headroom`` outside [0, 1)."""
    if not 0.0 <= fraction < 1.0:  # also NaN
        raise PlacementError(f"memory headroom {fraction!r}: expected a fraction of HBM from 0 up to (not including) 1")


def usable_hbm(hbm_bytes: int, memory_headroom: float) -> int:
    """The HBM bytes a plan may fill when it leaves ``memory_headroom`` of ``hbm_bytes`` free:
    what the memory model does not see (the CUDA context, the allocator's fragmentation) and
    its own error (docs/validation.md, "Memory")."""
    check_memory_headroom(memory_headroom)
    return int(hbm_bytes * (1.0 - memory_headroom))


def problem(
    step: PricedStep,
    options: PlacementOptions,
    *,
    hbm_bytes: int,
    levels: Sequence[_phaze_rs.Level],
    memory_bound_Bps: float,
) -> _phaze_rs.ProblemDict:
    """The problem dict of ``solve_placement`` / ``evaluate_placement``: the placement
    ``options`` (their values parsed here, each once) on the priced ``step``
    (:class:`~passes.algorithms.priced_step.PricedStep`: its layers, micro-batch, TP width,
    context-parallel degree, sequence parallelism, repeated blocks, freed gradients and gradient
    element bytes), with the chip's ``hbm_bytes`` (less the options' headroom, :func:`usable_hbm`)
    and network ``levels`` (the accelerator's own, ``acc.network``: the DP reads them by
    attribute), and the rate its memory-bound kernels move bytes at, ``memory_bound_Bps``
    (``latency.FixedParams.hbm_Bps``), at which FSDP's copies are priced under ZeRO-3 (the
    options' ``fsdp_version`` says whose).  The one assembly of the DP's problem: ``phaze-place-devices`` and the search
    (and the ``--hw`` sweep) both call it.  Under sequence parallelism a boundary's values are
    sharded over the TP group already and each rank sends its own (the options'
    ``pipeline_transfer`` does not apply); the options' ``reduce_dtype`` rescales the DP's
    gradient collectives from the step's gradient element bytes.  A layer repeated in
    ``step.layers`` (the same object) becomes one dict, shared."""
    # Named as the user set them (phazec's flags, phaze-place-devices' options), up to the
    # bound phazec's flags have: beyond it the DP's own check would name its field instead
    # ("problem.devices: expected a non-negative integer").
    if not 1 <= options.devices <= MAX_COUNT:
        raise PlacementError(f"devices = {options.devices}: expected a positive integer up to {si_count(MAX_COUNT)}")
    if not 1 <= options.global_batch <= MAX_COUNT:
        raise PlacementError(
            f"global batch = {options.global_batch}: expected a positive integer up to {si_count(MAX_COUNT)}"
        )
    ep = None if options.expert_parallel is AUTO else options.expert_parallel
    if step.grad_element_bytes not in (2, 4):
        raise PlacementError(f"gradient element bytes {step.grad_element_bytes!r}: expected 2 or 4")
    reduce_scale = parse_reduce_dtype(options.reduce_dtype) / step.grad_element_bytes
    made: dict[int, _phaze_rs.LayerDict] = {}  # a layer's dict by its object's id: repeated ones shared
    layer_dicts = []
    for layer in step.layers:
        d = made.get(id(layer))
        if d is None:
            d = made[id(layer)] = layer.as_dict()
        layer_dicts.append(d)
    if options.fp8_params:
        # FP8 primary weights: the weight is its FP8 copies (Transformer Engine 2.20.0.dev0,
        # module/base.py's get_weight_workspace: a weight that is a QuantizedTensor already is
        # the GEMM's operand, no workspace is cast or cached), at the 2 bytes an element (rowwise and columnwise
        # data) the bf16 weight's param_bytes count; docs/design.md §6.5. ZeRO's parameter
        # all-gathers move the FP8 data alone, 1 byte an element (Megatron-LM's uint8
        # parameter buffer, the transpose made after the gather): fp8_weight_bytes / 2 fewer
        if not any(int(layer["fp8_weight_bytes"]) for layer in layer_dicts):
            raise PlacementError("fp8 params: the step has no FP8 linears to keep their weights in FP8 (--dtype fp8)")
        # Nor is a weight cast in any micro-batch: the casts' time goes too.
        layer_dicts = [
            {
                **layer,
                "cast_s": 0.0,
                "expert_cast_s": 0.0,
                "fp8_weight_bytes": 0,
                "param_gather_bytes": fp8_param_gather_bytes(int(layer["param_bytes"]), int(layer["fp8_weight_bytes"])),
            }
            for layer in layer_dicts
        ]
    if step.sequence_parallel and step.tp > 1 and any(int(layer["dispatch_bytes"]) for layer in layer_dicts):
        # Under sequence parallelism each TP rank all-to-alls its own 1/t of the routed tokens
        # over the EP group, and the TP group all-gathers what arrives before the expert GEMMs
        # (the gathered operand that dispatch_bytes reads; Megatron-core 0.9,
        # megatron/core/transformer/moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher's
        # token_permutation: all_to_all, then gather_from_sequence_parallel_region; the combine
        # mirrors it): the DP's all-to-alls move 1/t of the bytes a device.
        layer_dicts = [
            {**layer, "dispatch_bytes": -(-int(layer["dispatch_bytes"]) // step.tp)} for layer in layer_dicts
        ]
    if options.dp_shard and options.zero not in (Zero.GRADIENTS, Zero.PARAMETERS):
        raise PlacementError(
            f"dp shard {options.dp_shard}: HSDP shards as FSDP does (ZeRO 2 or 3); expected --zero 2 or 3"
        )
    experts = max((int(layer["experts"]) for layer in layer_dicts), default=0)
    if ep is not None and ep > 1 and experts == 0:
        raise PlacementError(f"expert parallel {ep}: the model has no experts (no MoE layer); expected 1 or auto")
    if ep is not None and ep > 1 and experts % ep:
        raise PlacementError(f"expert parallel {ep}: expected a degree that divides the model's {experts} experts")
    etp = options.expert_tensor_parallel or step.tp
    if etp != step.tp:
        # Megatron-core 0.10's expert mesh (parallel_state.py, initialize_model_parallel: ETP x EP
        # x EDP over the TP x CP x DP ranks of a stage, in the order tp-ep-dp-pp); the widths
        # priced here are those that divide the traced TP width (the experts' bytes scale by t/k).
        if step.tp % etp:
            raise PlacementError(f"expert tensor parallel {etp}: expected a width that divides the TP width {step.tp}")
        if experts == 0:
            raise PlacementError(f"expert tensor parallel {etp}: the model has no experts (no MoE layer)")
        if options.dp_shard:
            raise PlacementError(
                f"expert tensor parallel {etp} with dp shard {options.dp_shard}: experts are not folded over HSDP"
            )
        if options.rank_order == RankOrder.TP_PP_DP:
            raise PlacementError(
                f"expert tensor parallel {etp} with rank order tp-pp-dp: the expert mesh is numbered tp-ep-dp-pp"
            )
    return {
        "layers": layer_dicts,
        "devices": options.devices,
        "hbm_bytes": usable_hbm(hbm_bytes, options.memory_headroom),
        "levels": levels,
        "global_batch": options.global_batch,
        "micro_batch": step.micro_batch,
        "tp": step.tp,
        "cp": step.cp,
        "dp_overlap": options.dp_overlap,
        "recompute": parse_recompute(options.recompute),
        "zero": parse_zero(options.zero),
        "virtual_stages": options.pipeline_schedule.virtual_stages,
        "blocks": list(step.blocks) if step.blocks is not None else None,
        "expert_parallel": ep,
        "expert_tensor_parallel": etp if etp != step.tp else None,
        "rank_order": parse_rank_order(options.rank_order),
        "pipeline_split": not step.sequence_parallel and parse_pipeline_transfer(options.pipeline_transfer),
        "grads_freed": step.grads_freed,
        "grad_reduce_scale": reduce_scale,
        "dp_shard": options.dp_shard or None,
        "fsdp_copies": {
            "bandwidth_Bps": memory_bound_Bps,
            "implementation": parse_fsdp_version(options.fsdp_version),
            "master_scale": FSDP_MASTER_BYTES / step.grad_element_bytes,
        },
    }


def fp8_param_gather_bytes(param_bytes: int, fp8_weight_bytes: int) -> int:
    """The bytes a ZeRO parameter all-gather of a layer moves under FP8 primary weights: its
    ``param_bytes`` (the FP8 linears' weights counted at 2 bytes an element, as their bf16
    twins) less one byte an element of those weights, ``fp8_weight_bytes / 2`` (the rowwise and
    columnwise copies, 2 bytes an element), since the gather moves the rowwise FP8 data alone
    (Megatron-LM d98e8a64, ``megatron/core/distributed/param_and_grad_buffer.py``
    ``group_params_for_buffers``: a quantized parameter's buffer is ``torch.uint8``)."""
    return max(0, param_bytes - fp8_weight_bytes // 2)


_EXPERT = re.compile(r"^expert(?::(\d+),(\d+),(\d+))?$")


def parse_placement(text: str, model: str) -> tuple[int, int, int] | None:
    """``""``/``"phaze"`` -> None (search); ``"expert:PP,DP,TP"`` -> that placement;
    ``"expert"`` -> the paper's expert placement of ``model``."""
    if text in ("", "phaze"):
        return None
    m = _EXPERT.match(text)
    if not m:
        raise PlacementError(f"placement '{excerpt(text)}': expected 'phaze', 'expert' or 'expert:PP,DP,TP'")
    if m.group(1) is None:
        if model not in EXPERT_PLACEMENTS:
            raise PlacementError(
                f"placement 'expert': no expert placement known for model '{model}' "
                f"(known: {', '.join(sorted(EXPERT_PLACEMENTS))}); give expert:PP,DP,TP"
            )
        return EXPERT_PLACEMENTS[model]
    pp, dp, tp = (_count(g) for g in m.groups())
    if pp is None or dp is None or tp is None or min(pp, dp, tp) < 1:
        raise PlacementError(f"placement '{excerpt(text)}': PP, DP and TP must be from 1 to {MAX_COUNT}")
    return pp, dp, tp


def fixed_tp_mismatch(fixed: tuple[int, int, int], tp: int, devices: int | None = None, cp: int = 1) -> str:
    """Why the fixed placement ``(pp, dp, tp)`` cannot place a step sharded for TP ``tp`` on
    ``devices`` devices with context parallelism ``cp`` ("" when it can)."""
    pp, dp, t = fixed
    if t != tp:
        return f"placement expert:{pp},{dp},{t} has TP {t} but the module is sharded for TP {tp}; compile with --tp {t}"
    if devices is not None and pp * dp * t * cp > devices:
        factors = f"PP {pp} x DP {dp} x TP {t}" + (f" x CP {cp}" if cp > 1 else "")
        need = pp * dp * t * cp
        return f"placement expert:{pp},{dp},{t} needs {need} devices ({factors}) but the cluster has {devices}"
    return ""


def binding_message(result: _phaze_rs.ResultDict, memory_headroom: float = 0.0) -> str:
    """The constraints that make a result infeasible, joined ('' when feasible); under a
    ``memory_headroom`` the DP's "HBM" is the part of it a plan may fill, and a memory
    refusal says so."""
    said = []
    for v in result.get("violations", []):
        message = v["message"]
        if memory_headroom > 0 and "but HBM is" in message:
            share = f"{1 - memory_headroom:.4g}"
            message = message.replace("but HBM is", f"but the HBM a plan may fill ({share} of it) is")
            message += f" (--memory-headroom {memory_headroom:g})"
        said.append(message)
    return "; ".join(said)
