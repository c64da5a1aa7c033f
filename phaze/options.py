"""What a compilation is asked besides the model file: :class:`Options` (phazec's options, and
``phaze.compile``'s), with the stages an ``--emit`` may stop after (:data:`STAGES`; what each
adds is in :mod:`phaze.pipeline`) and the sweep's default micro-batch sizes and TP widths."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from passes.algorithms.option_values import (
    AUTO,
    Auto,
    Dtype,
    Fp8RecipeSetting,
    Optimizer,
    Recompute,
    Runtime,
    SdpaOrder,
    TextEnum,
    Tristate,
    Zero,
)
from passes.algorithms.placement_options import (
    PlacementOptions,
    count_limit,
    option,
    positive_count,
    positive_number,
    relative_gap,
    time_limit_seconds,
)


class Stage(TextEnum):
    """A stage of the pipeline (``phazec --emit STAGE`` stops after STAGE; :mod:`phaze.pipeline`)."""

    IR = "ir"
    TRAINING = "training"
    SHARDED = "sharded"
    TILED = "tiled"
    LATENCY = "latency"
    SCHEDULED = "scheduled"
    RECOMPUTE = "recompute"
    PLAN = "plan"


#: The pipeline's stages, in order.
STAGES = tuple(Stage)
DEFAULT_MICRO_BATCHES = (1, 2, 4, 8)
DEFAULT_TP_WIDTHS = (1, 2, 4, 8)


@dataclass(frozen=True)
class Options(PlacementOptions):
    """What a compilation needs besides the model file (phazec's options): the placement
    options (declared in :class:`~passes.algorithms.placement_options.PlacementOptions`) and
    these. Those that are command-line options are declared as the placement options are
    (:func:`~passes.algorithms.placement_options.option`: the check of a value, help, choices,
    flag), and phazec's and phaze-validate's flags are built from them (``phaze.tools.flags``);
    :meth:`check` checks every option by its field's check (or as one of its choices), as the
    flags are checked: a value is refused alike by a command line, ``phaze.compile`` and a pass
    that takes the same quantity (``phaze-schedule-ops{node_limit=...}``)."""

    emit: Stage = option(Stage.PLAN, help="last stage to run and print", choices=STAGES, parse=Stage)

    @property
    def fp8(self):
        """The FP8 recipe (:class:`~phaze_ir.frontend.float8_linear.Fp8Recipe`) of ``fp8_recipe``,
        ``auto`` read as no export (phazec resolves it by its exports first)."""
        from phaze_ir.frontend.float8_linear import resolve_recipe

        return resolve_recipe(self.fp8_recipe)

    @property
    def traced_dtype(self) -> str:
        """The precision as the trace takes it, for cache keys: ``dtype``, and for ``fp8`` its
        recipe but the default (``fp8:current``...)."""
        if self.dtype is not Dtype.FP8 or self.fp8.value == "delayed":
            return self.dtype
        return f"fp8:{self.fp8.value}"

    #: The micro-batch sizes the plan stage sweeps; the stages before it compile the first.
    micro_batches: tuple[int, ...] = option(
        DEFAULT_MICRO_BATCHES,
        positive_count,
        "micro-batch size",
        metavar="N",
        flag="--micro-batch",
        default_words=f"{DEFAULT_MICRO_BATCHES[0]}, and the plan stage tries "
        + ", ".join(map(str, DEFAULT_MICRO_BATCHES)),
    )
    #: None: the TP width of a fixed ``placement``, else :data:`DEFAULT_TP_WIDTHS`.
    tp_widths: tuple[int, ...] | None = option(
        None,
        positive_count,
        "tensor-parallel width",
        metavar="N",
        flag="--tp",
        default_words=f"{DEFAULT_TP_WIDTHS[0]}, and the plan stage tries " + ", ".join(map(str, DEFAULT_TP_WIDTHS)),
    )
    seq_len: int | None = option(
        None,
        positive_count,
        "sequence length",
        metavar="N",
        default_words="the model file's SEQ_LEN, a config.json's max_position_embeddings",
    )
    #: :data:`AUTO` or a degree; a compilation of one point holds its degree (the sweep resolves
    #: ``auto``, :func:`phaze.points.context_parallel_points`).
    context_parallel: int | Auto = option(
        1,
        "passes.algorithms.context_parallel.context_parallel_problem",
        "context parallelism: each sequence split over N devices (2N load-balanced chunks), its attention a ring "
        "of N steps passing keys and values point to point (Megatron-LM's --context-parallel-size, torchtitan's "
        "context_parallel_degree); auto tries 1 and the powers of two that leave at least "
        "{passes.algorithms.context_parallel.AUTO_MIN_LOCAL_TOKENS} tokens a device. "
        "Attention runs fused (a transformers model is built with SDPA)",
        metavar="N|auto",
        parse="passes.algorithms.context_parallel.parse_context_parallel",
    )
    #: ``phaze-overlap-tensor-parallel`` on the points it applies to (rules in
    #: ``passes/algorithms/tp_overlap.py``).
    tp_overlap: Tristate = option(
        Tristate.OFF,
        help="the TP all-gathers and reduce-scatters overlapped with their GEMMs, as Transformer Engine's userbuffers "
        "run them (Megatron-LM's --tp-comm-overlap), or under --kernels inductor as torch's micro-pipelined TP fuses "
        "them (torchtitan's async TP): on, at every point (needs "
        "--sequence-parallel on); auto, at the points with sequence parallelism; off",
        choices="passes.algorithms.tp_overlap.TP_OVERLAP_SETTINGS",
        parse=Tristate,
    )
    dtype: Dtype = option(
        Dtype.FLOAT16,
        help="training precision of weights and activations; amp-bfloat16, amp-float16: torch.autocast's mixed "
        "precision, fp32 weights and gradients; fp8: bf16 with Transformer Engine's FP8 linears (E4M3 forward, E5M2 "
        "gradients, delayed per-tensor scaling: Megatron-LM's --fp8-format hybrid), on a chip with an "
        "fp8_gemm_flops, or searched over the space's chips with the FP8 datapath (fp8_rate); 'model' keeps "
        "the model's",
        choices="phaze_ir.frontend.trace.DTYPES",
        parse=Dtype,
        default_words="on a GPU amp-bfloat16 (bfloat16 under --kernels megatron; amp-float16/float16 before "
        "Ampere), elsewhere float16, which --export launches as bf16 where the chip has it",
    )
    #: How ``--dtype fp8``'s linears scale their casts (``phaze_ir/frontend/float8_linear.py``);
    #: ``auto`` is resolved where the exports are known (:meth:`fp8`).
    fp8_recipe: Fp8RecipeSetting = option(
        Fp8RecipeSetting.AUTO,
        help="how --dtype fp8 scales its casts, as the runtime that launches it: delayed, Transformer Engine's "
        "delayed per-tensor scaling (Megatron-LM's --fp8-recipe delayed); current, TE's per-tensor current "
        "scaling (an amax pass before each cast: Megatron-LM's --fp8-recipe tensorwise); tensorwise, rowwise: "
        "torchao's Float8Linear with dynamic per-tensor or per-row scales (torchtitan's float8 converter), "
        "which keeps the bf16 operands for the backward and casts them again there",
        choices="phaze_ir.frontend.float8_linear.FP8_RECIPE_CHOICES",
        default_words="auto: rowwise when --export torchtitan is asked, else delayed",
        parse=Fp8RecipeSetting,
    )
    optimizer: Optimizer = option(
        Optimizer.ADAM,
        help="optimizer of the training step",
        choices="phaze_ir.op_kinds.OPTIMIZER_KINDS",
        default_words="adam, mixed precision",
        parse=Optimizer,
    )
    hw: str = option(
        "tpuv4",
        help="the accelerator: a preset ({phaze_ir.hardware.preset_names}) or a hardware TOML file",
        metavar="NAME|FILE",
    )
    #: None (default: dropless experts, every routed row and no more), or F >= 1: every expert
    #: GEMM runs on its experts' capacity ``ceil(T/E * F)`` rows, padded with zeros, as
    #: Megatron-LM's ``--moe-expert-capacity-factor F --moe-pad-expert-input-to-capacity``
    #: (the importer pads, ``phaze.capacity_factor``; docs/design.md §2).
    capacity_factor: float | None = option(
        None,
        "phaze_ir.frontend.importer.capacity_factor_problem",  # (the importer checks it too)
        "MoE expert capacity factor, F >= 1: every expert processes ceil(F x routed rows / experts) rows, "
        "padded with zeros (Megatron-LM's --moe-expert-capacity-factor F --moe-pad-expert-input-to-capacity)",
        metavar="F",
        default_words="none, dropless",
    )
    #: What the architecture search maximizes (``phaze.search.objective``).
    objective: str = option(
        "throughput",
        help="what the architecture search maximizes: throughput (samples/s), perf-per-watt (samples/s per W of "
        "the chips at the plan's power), perf-per-dollar (samples/s per USD of the chips' cost to make), energy "
        "(samples per joule), carbon (samples per kg CO2e, operational and embodied); the space's template needs "
        "the tables that price it",
        choices="phaze.search.objective.OBJECTIVES",
    )
    #: None (default: no cap), or W > 0: the sweep keeps only plans whose predicted chip power
    #: (``phaze.power``'s ``chip_power_w``) is at most W watts; needs an ``[energy]`` table.
    power_cap_w: float | None = option(
        None,
        positive_number("a positive number of watts"),
        "keep only plans whose predicted chip power (phaze.power's chip_power_w, the busiest device's "
        "average over the step) is at most W watts: with --hw the sweep's points, in the search each chip's "
        "settings; needs a chip (or a space template) with an [energy] table",
        metavar="W",
        flag="--power-cap",
        default_words="no cap",
    )
    #: ``auto`` compiles both and keeps the faster plan
    #: (``phaze-shard-tensor-parallel{sequence_parallel=...}``).
    sequence_parallel: Tristate = option(
        Tristate.OFF,
        help="Megatron sequence parallelism at TP > 1: on, off, or auto, which compiles both and keeps the faster",
        choices="phaze.options.SEQUENCE_PARALLEL_SETTINGS",
        parse=Tristate,
    )
    #: Whose kernels the step runs as (``phaze-form-kernels{runtime=...}``, rules and sources in
    #: ``passes/algorithms/kernels.py``).
    kernels: Runtime = option(
        Runtime.OPS,
        help="the runtime whose kernels the step is priced as: ops, every op its own kernel; eager, PyTorch eager "
        "(flash attention, fused AdamW); inductor, torch.compile's fusion; megatron, Megatron-LM's fused kernels",
        choices="passes.algorithms.kernels.RUNTIMES",
        parse=Runtime,
    )
    #: the attention backend order the step runs under: torch's SDPA's, or Transformer Engine's
    #: under megatron kernels (``phaze-form-kernels{sdpa_order=...}``, ``passes/algorithms/kernels.py``).
    sdpa_order: SdpaOrder = option(
        SdpaOrder.CUDNN_FIRST,
        help="the attention backend order: torch's SDPA under eager or inductor kernels, Transformer Engine's "
        "under megatron: cudnn-first, torch 2.15's and TE's (cuDNN attention on compute capability 9.x and "
        "10.x); flash-first, a torch of before (its order flash, memory-efficient, math) or "
        "TORCH_CUDNN_SDPA_DEPRIORITIZED=1, or TE with NVTE_FUSED_ATTN=0 (NeMo's launcher's setting from "
        "2024-02 to 2024-07): FlashAttention-2 runs",
        choices="passes.algorithms.kernels.SDPA_ORDERS",
        parse=SdpaOrder,
    )
    #: What the ``selective`` recompute policy re-runs (``phaze-insert-recompute{selective=...}``,
    #: rules and sources in ``passes/algorithms/recompute.py``).
    selective_recompute: str = option(
        "attention",
        "passes.algorithms.recompute.selective_problem",
        "what --recompute selective re-runs: attention, Megatron-LM's (the attention core); op, torchtitan's "
        "per-op checkpointing of each block (saves the matmuls' and attention's outputs but every second "
        "matmul's, re-runs the rest); layer:N, torchtitan's every N-th block checkpointed whole; share:P, "
        "fms-fsdp's share P of the blocks (0 < P <= 1) checkpointed whole, evenly spaced",
        metavar="attention|op|layer:N|share:P",
    )
    strict: bool = option(False, help="unknown aten ops are errors, not phaze.opaque")
    #: When no placement fits: True (default) compiles the best unfit point from the whole model
    #: into a plan that says which constraint binds; False stops with :class:`NoPlanFits` as soon
    #: as the sweep knows (``phazec`` without ``--write-infeasible``, which writes nothing then:
    #: a 20,000-block model that cannot fit is not compiled whole to be thrown away).
    unfit_plan: bool = True
    # SCIP stops a layer's schedule at 0.5 % proven gap or after 10 s (the gap limit makes the
    # plan sweep several times faster than proving optimality, and deterministic in practice).
    # Their checks are the scheduling passes' (``passes/solver_options.py``): the same limits.
    schedule_time_limit: float = option(
        10.0,
        time_limit_seconds,
        "SCIP time limit per layer schedule, seconds",
        metavar="S",
        flag="--solver-time-limit",
    )
    schedule_gap: float = option(
        0.005, relative_gap, "stop a layer's schedule at this proven relative gap", metavar="G", flag="--solver-gap"
    )
    #: The search sets it (see phaze/search): unlike the clock, it gives the same plan on any machine.
    schedule_nodes: int = option(
        0,
        count_limit,
        "SCIP branch-and-bound nodes per layer schedule, 0 for no limit",
        metavar="N",
        flag="--solver-nodes",
    )
    #: The search sets it (see phaze/search).
    schedule_max_binaries: int = option(
        0,
        count_limit,
        "a layer MILP with more binaries keeps its list schedule, 0 for no limit",
        metavar="N",
        flag="--solver-max-binaries",
    )
    #: The schedule cache the scheduling passes solve through (a ``ScheduleCache``; the search
    #: hands in its own).  None: one per :func:`~phaze.driver.compile_model`, on disk under
    #: ``$PHAZE_SCHEDULE_CACHE`` when that is set, else in memory.
    schedule_cache: Any = field(default=None, compare=False, repr=False)


def context_parallel_degree(opts: Options) -> int:
    """The context-parallel degree one compilation of ``opts`` is priced for: its degree, 1
    while it is still ``auto`` (a stage before the sweep resolves it)."""
    return 1 if opts.context_parallel is AUTO else opts.context_parallel


def narrowed(opts: Options, choice: Mapping[str, str]) -> Options:
    """``opts`` with ``--zero`` and ``--recompute`` narrowed as ``choice`` says (one of
    ``phaze.plan.export.launchable_choices``: what an ``--export`` target launches)."""
    return replace(
        opts, zero=Zero(choice.get("zero", opts.zero)), recompute=Recompute(choice.get("recompute", opts.recompute))
    )


def zero_stage(opts: Options) -> int | None:
    """The ZeRO stage ``opts`` fixes (0 to 3), None under ``auto`` (the placement chooses)."""
    return Zero(opts.zero).stage


def traced_seq_len(opts: Options) -> int | None:
    """The tokens per sample the step of ``opts`` is traced with: ``--seq-len`` (None: the
    model's), one device's S/c under context parallelism (the sweep sets ``seq_len`` then)."""
    c = context_parallel_degree(opts)
    return opts.seq_len if opts.seq_len is None or c == 1 else opts.seq_len // c


#: The settings of ``--sequence-parallel``.
SEQUENCE_PARALLEL_SETTINGS = tuple(Tristate)
