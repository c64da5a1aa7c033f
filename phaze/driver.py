"""What drives one compilation of a model file for ``phazec`` (and ``phaze.compile``, and the
search's recompiled winners): the question checked (:func:`check_question`: the options, the
chip loaded once, the power cap against it; each error in one line before anything slow), a
compilation started from it (:func:`start_compilation`: the model file and its fixed placement
too) and the model compiled to ``opts.emit`` (:func:`compile_model`: for the plan stage, the
sweep over micro-batch sizes and TP widths, every point through the pipeline).

What it drives lives beside it: the options (:mod:`phaze.options`), the pass pipeline on a
traced step (:mod:`phaze.pipeline`), the sweep's points (:mod:`phaze.points`) and the plan's JSON
and text (:mod:`phaze.plan.plan_output`).  ``phazec --hw`` asks through :mod:`phaze.hw_answer` (its
cached answer), whose sweep is priced from the search's settings (:mod:`phaze.search.sweep`, which
falls back to :func:`compile_model`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from xdsl.dialects.builtin import ModuleOp

from passes.algorithms.option_values import Dtype, Runtime, Tristate, Zero
from phaze.options import STAGES, Options, Stage, context_parallel_degree, traced_seq_len
from phaze.pipeline import (
    compile_from,
    compile_module,
    copy_for,
    few_collections,
    load_accelerator,
    traced_line,
    training_step,
)
from phaze.plan.plan_output import Candidate
from phaze.points import (
    Log,
    chosen_point,
    context_parallel_points,
    judge_point,
    point_label,
    tp_points,
    tp_widths_of,
)
from phaze_ir.errors import PhazeError
from phaze_ir.files import si_count

if TYPE_CHECKING:
    from phaze_ir.frontend.trace import TracedGraph
    from phaze_ir.hardware import Accelerator


def check_question(opts: Options, accelerator: Accelerator | None = None) -> Accelerator | None:
    """Check a question before anything slow, each error in one line: its options
    (:func:`check_options`), its chip (``accelerator``, else ``opts.hw`` loaded: from the
    ``tiled`` stage on; None before it) and ``--power-cap`` against that chip.  The chip is
    returned to be handed on (``phazec --hw``'s answer keys its cache by it and compiles on it):
    a question loads its hardware file once."""
    check_options(opts)
    if accelerator is None and STAGES.index(opts.emit) >= STAGES.index(Stage.TILED):
        accelerator = load_accelerator(opts.hw)
    check_power_cap(opts, accelerator)
    check_tp_overlap(opts, accelerator)
    check_cluster_size(opts, accelerator)
    if opts.dtype is Dtype.FP8 and accelerator is not None:
        from passes.algorithms.latency import fp8_problem

        if why := fp8_problem(accelerator):
            raise PhazeError(why)
    if why := bf16_problem(opts.dtype, accelerator):
        raise PhazeError(why)
    return accelerator


def bf16_problem(dtype: str, accelerator: Accelerator | None) -> str | None:
    """Why ``--dtype dtype`` (``bfloat16`` or ``amp-bfloat16``) cannot run as priced on
    ``accelerator``, None when it can: a CUDA GPU below compute capability 8.0 (Volta, Turing)
    has no bf16 tensor cores (:data:`phaze.plan.export.CUDA_BF16_FROM`).  torch 2.15 runs bf16 there
    by emulation (``torch/cuda/__init__.py``, ``is_bf16_supported``: a major of 8 and up, else
    ``including_emulation``), at a rate phaze does not price: its GEMMs would be priced at the
    fp16 tensor cores' peak.  A chip without a compute capability (the paper's TPU-like chips
    and the search's) takes bf16."""
    from phaze.plan.export import CUDA_BF16_FROM

    if dtype not in ("bfloat16", "amp-bfloat16") or accelerator is None or accelerator.calibration is None:
        return None
    capability = accelerator.calibration.compute_capability
    if capability is None or capability >= CUDA_BF16_FROM:
        return None
    fp16 = dtype.replace("bfloat16", "float16")
    return (
        f"--dtype {dtype}: {accelerator.name} (compute capability {capability:.1f}) has no bf16 tensor cores "
        f"(CUDA GPUs have them from {CUDA_BF16_FROM:.1f}, Ampere); torch emulates bf16 there, at a rate phaze "
        f"does not price: give --dtype {fp16}"
    )


def check_cluster_size(opts: Options, accelerator: Accelerator | None) -> None:
    """``--devices`` within the cluster the chip's file describes (its network's last level's
    ``group_size``, e.g. the a100's 4,096: the largest cluster the description is meant for):
    a larger one would be priced on a network that no level of the file describes."""
    if accelerator is not None and opts.devices > accelerator.max_devices:
        raise PhazeError(
            f"--devices {si_count(opts.devices)}: the {accelerator.name} description holds at most "
            f"{si_count(accelerator.max_devices)} devices (its last network level's group_size, "
            f"{accelerator.network[-1].name!r}); give a hardware file with a larger one"
        )


def check_options(opts: Options) -> None:
    """The one-line error of an option out of range (stage, sizes, placement settings), before
    anything slow; ``phazec --hw`` and the architecture search both check through here."""
    from passes.algorithms.placement import PlacementError, parse_placement
    from passes.algorithms.placement_options import OptionError

    try:
        opts.check()  # each option by its field's check or choices, named by its flag
    except OptionError as e:
        raise PhazeError(e.named(e.flag)) from e
    if opts.dp_shard and opts.zero not in (Zero.GRADIENTS, Zero.PARAMETERS):
        raise PhazeError(
            f"--dp-shard {opts.dp_shard}: HSDP shards as FSDP does: expected --zero 2 or 3, not {opts.zero}"
        )
    if opts.dp_shard > opts.devices:  # a shard group of DP ranks, at most every device
        raise PhazeError(f"--dp-shard {opts.dp_shard}: expected a shard group of at most --devices {opts.devices}")
    if opts.fp8_params and opts.dtype is not Dtype.FP8:  # the FP8 linears are --dtype fp8's: known before any trace
        raise PhazeError(f"--fp8-params: FP8 primary weights are the FP8 linears' of --dtype fp8, not {opts.dtype}")
    if opts.placement.startswith("expert:"):  # its degrees are known without the model
        try:
            fixed = parse_placement(opts.placement, "")
            check_placement_devices(fixed, opts.devices, context_parallel_degree(opts))
        except PlacementError as e:
            raise PhazeError(f"--placement: {e}") from e
        c = context_parallel_degree(opts)
        if fixed is not None and opts.dp_shard and (fixed[1] * c) % opts.dp_shard:
            raise PhazeError(
                f"--dp-shard {opts.dp_shard}: expected a shard group that divides the {fixed[1] * c} ranks of DP x CP "
                f"(--placement {opts.placement})"
            )
    if opts.emit is Stage.PLAN and all(opts.global_batch % b for b in opts.micro_batches):
        sizes = ", ".join(map(str, opts.micro_batches))
        raise PhazeError(
            f"--global-batch {opts.global_batch} is not a multiple of the micro-batch size ({sizes}): "
            "expected a micro-batch size that divides the global batch"
        )


def check_placement_devices(fixed: tuple[int, int, int] | None, devices: int, c: int = 1) -> None:
    """A fixed placement (PP, DP, TP) that needs more devices than the run has is refused, with
    a fixed context-parallel degree's ``c`` devices for each of its TP groups
    (:func:`~phaze.options.context_parallel_degree`: 1 under ``auto``)."""
    if fixed is not None and fixed[0] * fixed[1] * fixed[2] * c > devices:
        pp, dp, tp = fixed
        with_cp = f" x --context-parallel {c}" if c > 1 else ""
        raise PhazeError(
            f"--placement expert:{pp},{dp},{tp}{with_cp} needs {pp * dp * tp * c} devices: expected at most "
            f"--devices {devices}"
        )


def check_tp_overlap(opts: Options, accelerator) -> None:
    """Refuse ``--tp-overlap on`` without sequence parallelism (what Transformer Engine overlaps
    is its all-gathers and reduce-scatters), and any overlap on a chip without an SM count."""
    if opts.tp_overlap is Tristate.ON and opts.sequence_parallel is not Tristate.ON:
        raise PhazeError(
            "--tp-overlap on: the overlapped collectives are sequence parallelism's all-gathers and reduce-scatters "
            "(Megatron-LM's --tp-comm-overlap asserts --sequence-parallel): add --sequence-parallel on, or use "
            "--tp-overlap auto"
        )
    if opts.tp_overlap is not Tristate.OFF and accelerator is not None:
        from passes.overlap_tensor_parallel import sm_count

        try:
            sm_count(accelerator, f"--tp-overlap {opts.tp_overlap}")
        except PhazeError as e:
            raise PhazeError(str(e)) from e


def check_power_cap(opts: Options, accelerator) -> None:
    """Refuse ``--power-cap`` on a chip (None: not loaded) without an ``[energy]`` table."""
    if opts.power_cap_w is not None and (accelerator is None or accelerator.energy is None):
        name = accelerator.name if accelerator is not None else opts.hw
        raise PhazeError(f"--power-cap: hardware '{name}' has no [energy] table, so its plans have no predicted power")


def default_memory_headroom(hw: str) -> float:
    """The memory headroom a plan on chip ``hw`` leaves when none is asked: the chip's
    ``calibration.memory_headroom``, 0 without one (phazec's and ``phaze.compile``'s default)."""
    calibration = load_accelerator(hw).calibration
    return (calibration.memory_headroom or 0.0) if calibration is not None else 0.0


#: The options whose default is the runtime a practitioner runs on the chip (:func:`runtime_defaults`).
RUNTIME_FIELDS = (
    "kernels",
    "dtype",
    "zero",
    "sequence_parallel",
    "pipeline_schedule",
    "dp_overlap",
    "selective_recompute",
)

#: The kernels each ``--export`` target launches when none are asked (Megatron-LM: its fused
#: kernels and Transformer Engine's; torchtitan: PyTorch eager unless ``--compile.enable``,
#: which phazec does not ask by default).
EXPORT_KERNELS = {"megatron": "megatron", "torchtitan": "eager"}


def runtime_defaults(hw: str, exports: tuple[str, ...] = (), kernels: str | None = None) -> dict[str, str | bool]:
    """The defaults of :data:`RUNTIME_FIELDS` on chip ``hw`` (phazec's and ``phaze.compile``'s,
    where the caller gives none): on a CUDA GPU (a chip whose calibration has a
    ``compute_capability``: a100, h100...) the runtime a practitioner runs when nothing is
    said: PyTorch eager kernels (SDPA attention, fused AdamW), or the first ``exports``
    target's (:data:`EXPORT_KERNELS`), or ``kernels`` where they are asked (the defaults that
    follow from the runtime follow them); torch.autocast's bf16 mixed precision where the chip has
    bf16 (``phaze.plan.export.CUDA_BF16_FROM``), fp16 otherwise, and under Megatron-LM's kernels its
    ``--bf16`` (``--fp16``): the module in that dtype, fp32 main parameters in the optimizer; ``auto`` ZeRO, sequence
    parallelism and pipeline schedule (recompute's default is ``auto`` on every chip); the
    data-parallel collectives overlapped with the backward under PyTorch's kernels, as its DDP
    (``torch/nn/parallel/distributed.py``: the reducer all-reduces each gradient bucket as the
    backward fills it) and FSDP (prefetched all-gathers, asynchronous reduce-scatters) run them,
    not under Megatron-LM's, whose ``--overlap-grad-reduce`` is off unless asked
    (``megatron/training/arguments.py``); and a selective recompute as each runtime's users
    run it: torchtitan's per-op checkpointing under PyTorch's kernels (``op``: its Llama 3
    training configs' ``[activation_checkpoint] mode = "selective", selective_ac_option =
    "op"``), Megatron-LM's attention core under its own (``attention``, ``--recompute-granularity
    selective``). On any
    other chip (the paper's TPUv4-like accelerators and its architecture space) nothing: the
    paper's settings, ``Options``' defaults (``ops`` kernels, float16, ZeRO 0, no sequence
    parallelism, 1F1B, no DP overlap)."""
    from phaze.plan.export import CUDA_BF16_FROM

    calibration = load_accelerator(hw).calibration
    capability = None if calibration is None else calibration.compute_capability
    if capability is None:
        return {}
    # the kernels asked, else the first export target's, else PyTorch eager's; the DP overlap and
    # selective recompute follow the kernels
    kernels = kernels or next((EXPORT_KERNELS[t] for t in exports if t in EXPORT_KERNELS), "eager")
    return {
        "kernels": kernels,
        # Megatron-LM does not autocast: --bf16 keeps the module in bf16 and fp32 main params in
        # its optimizer (megatron/core/transformer/module.py Float16Module), phaze's bfloat16
        # with mixed-precision Adam; PyTorch's runtimes autocast an fp32 module
        "dtype": ("" if kernels == "megatron" else "amp-")
        + ("bfloat16" if capability >= CUDA_BF16_FROM else "float16"),
        "zero": Zero.AUTO,
        "sequence_parallel": Tristate.AUTO,
        "pipeline_schedule": "auto",
        "dp_overlap": kernels != "megatron",
        "selective_recompute": "attention" if kernels == "megatron" else "op",
    }


def with_runtime_attention(spec, opts: Options):
    """The model ``spec`` with the attention the runtime of ``opts`` runs: fused (SDPA) under
    context parallelism (ring flash attention); its matmuls and softmax with ``--kernels ops``
    (the paper's runtime: no fused attention, as the paper priced it and its search still
    does); otherwise as the model file builds it (every shipped example and a config.json
    whose architecture has it: SDPA, which the GPU runtimes run as flash attention), except
    attention with a sliding window shorter than the sequence or with sinks: the one fused
    kernel FlashAttention or cuDNN runs for it (``phaze_ir/frontend/kernel_attention.py``)."""
    from phaze_ir.frontend import with_eager_attention, with_fused_attention, with_kernel_attention

    if opts.context_parallel != 1:  # a degree past 1, or auto
        return with_fused_attention(spec)
    if opts.kernels is Runtime.OPS:
        return with_eager_attention(spec)
    return with_kernel_attention(spec, opts.seq_len or spec.seq_len)


def schedule_cache(opts: Options):
    """The schedule cache a compilation solves through (see ``Options.schedule_cache``)."""
    from passes.algorithms import schedule as sched

    if opts.schedule_cache is not None:
        return opts.schedule_cache
    return sched.ScheduleCache(os.environ.get("PHAZE_SCHEDULE_CACHE") or None)


@dataclass(frozen=True)
class Compilation:
    """What every compilation of a model file starts from (:func:`start_compilation`): the
    options checked, with their schedule cache; the chip (None before the ``tiled`` stage); the
    model file; its fixed placement (None: searched); the TP widths to try."""

    opts: Options
    accelerator: Any
    spec: Any
    fixed: tuple[int, int, int] | None
    tp_widths: tuple[int, ...]
    #: the width of the model's output projection (its vocabulary; None: it has none), which
    #: bounds the memory of a point from below (``phaze.search.sweep``'s pruning)
    vocab: int | None = None


def start_compilation(model_path: str, opts: Options, accelerator=None) -> Compilation:
    """Check the question (:func:`check_question`) and load what a compilation of ``model_path``
    needs besides, each error in one line before anything slow (``compile_model`` and
    ``phazec --hw``'s settings sweep start here)."""
    from passes.algorithms.placement import PlacementError, parse_placement
    from phaze_ir.frontend import load_model_file
    from phaze_ir.frontend.trace import check_model

    accelerator = check_question(opts, accelerator)
    opts = replace(opts, schedule_cache=schedule_cache(opts))
    spec = with_runtime_attention(load_model_file(model_path), opts)
    vocab, heads = check_model(spec)  # a model beyond the size bound: one line now, not one per trace
    if spec.no_seq_len is not None and opts.seq_len is None:  # one line now, not after a trace
        raise PhazeError(spec.no_seq_len)
    try:
        fixed = parse_placement(opts.placement, spec.name)
    except PlacementError as e:
        raise PhazeError(f"--placement: {e}") from e
    check_placement_devices(fixed, opts.devices, context_parallel_degree(opts))
    widths = tp_widths_of(opts, fixed)
    k = opts.expert_tensor_parallel
    if k and (w := next((w for w in widths if w % k), None)) is not None:  # one line now, not after a trace
        raise PhazeError(f"--expert-tensor-parallel {k}: expected a width that divides the TP width {w}")
    if STAGES.index(opts.emit) >= STAGES.index(Stage.SHARDED):
        check_tp_heads(widths, heads, spec.name, opts.placement if fixed is not None and not opts.tp_widths else None)
    return Compilation(opts, accelerator, spec, fixed, widths, vocab)


def check_tp_heads(widths: tuple[int, ...], heads: tuple[int, int] | None, name: str, placement: str | None) -> None:
    """Refuse, before any trace, TP widths of which none can split the model's attention heads
    (``heads``: its config's query and key/value heads, None: not known before the trace): a
    width must divide the query heads and divide or be a multiple of the key/value heads, as
    phaze-shard-tensor-parallel requires (``tp_structure.GraphStructure._check_heads``, after
    Megatron-core's transformer_config.py). A width among others that cannot is left to the
    sweep, which skips it with its reason."""
    if heads is None or not widths:
        return
    q, kv = heads

    def why(t: int) -> str | None:
        if q % t:
            return f"does not divide the {q} attention heads of {name} (its config's num_attention_heads)"
        if kv % t and t % kv:
            return (
                f"neither divides nor is a multiple of the {kv} key/value heads of {name} (its config's "
                "num_key_value_heads; Megatron requires one or the other)"
            )
        return None

    reasons = [why(t) for t in widths]
    if all(reasons):
        fits = [t for t in range(1, q + 1) if q % t == 0 and why(t) is None]
        flag = f"--placement {placement}" if placement else f"--tp {','.join(map(str, widths))}"
        others = f" (nor can {', '.join(map(str, widths[1:]))})" if len(widths) > 1 else ""
        raise PhazeError(
            f"{flag}: width {widths[0]} {reasons[0]}{others}: expected a width among {', '.join(map(str, fits))}"
        )


class _NotTheWholeStep(Exception):
    """A deepened step's check trace, run beside its compilation, disagreed with it."""


def compile_model(
    model_path: str, opts: Options, log: Log, accelerator=None, seconds: dict[str, float] | None = None
) -> tuple[ModuleOp, list[Candidate]]:
    """Compile a model file to ``opts.emit``.  For the plan stage, sweep micro-batch sizes and
    TP widths and return the module of the best feasible plan (the highest throughput; ties go
    to the smaller micro-batch, then the smaller TP width) and every point of the sweep.
    ``accelerator``: the chip (default: ``opts.hw``).  ``seconds``, when given, gets the wall
    time spent per phase added to it: ``trace``, ``import`` (import and training passes shared
    by a micro-batch's points) and ``points`` (the rest of the pipeline, every point).

    A deepened step is compiled while its check trace runs beside it
    (``trace_step_checked_later``), and each micro-batch's points are kept only once the check
    agreed; when it does not (a model whose blocks trace alike five at a time but not six),
    the compilation starts again from steps traced as ``trace_step`` traces them."""
    seconds = {} if seconds is None else seconds
    for phase in ("trace", "import", "points"):
        seconds.setdefault(phase, 0.0)
    # The trace allocates as the pipeline does (nodes, fake tensors, their metadata): at
    # Python's default thresholds its collections were 0.6 s of GPT-3 175B's 2.4 s trace.
    with few_collections():
        try:
            return _compile_model(model_path, opts, log, accelerator, seconds, check_later=True)
        except _NotTheWholeStep:
            log("the deepened step is not what the model traces to: compiling again from a whole trace")
            return _compile_model(model_path, opts, log, accelerator, seconds, check_later=False)


def _compile_model(
    model_path: str, opts: Options, log: Log, accelerator, seconds: dict[str, float], check_later: bool
) -> tuple[ModuleOp, list[Candidate]]:
    from phaze_ir.frontend import UnknownOpError, trace_step, trace_step_checked_later
    from phaze_ir.frontend.trace import whole_sequence

    begun = start_compilation(model_path, opts, accelerator)
    opts, accelerator, spec, tp_widths = begun.opts, begun.accelerator, begun.spec, begun.tp_widths
    stage = opts.emit
    training = STAGES.index(stage) >= STAGES.index(Stage.TRAINING)
    sweep = stage == "plan"
    micro_batches = opts.micro_batches if sweep else opts.micro_batches[:1]
    tp_widths = tp_widths if sweep else tp_widths[:1]
    degrees = context_parallel_points(opts, spec.seq_len)
    degrees = degrees if sweep else degrees[:1]

    best: tuple[float, ModuleOp] | None = None
    candidates: list[Candidate] = []
    fallback: ModuleOp | None = None
    for b, point_opts in ((b, o) for b in micro_batches for o in degrees):  # each with its CP degree
        c = context_parallel_degree(point_opts)
        seq = traced_seq_len(point_opts) or spec.seq_len
        log(
            f"tracing {spec.name} ({'training step' if training else 'forward'}, micro-batch {b}"
            + (f", seq {seq}" if seq else "")
            + (f", one of CP {c}: {point_opts.seq_len} tokens a sample" if c > 1 else "")
            + ")"
        )
        start = time.perf_counter()
        seq_len = traced_seq_len(point_opts)
        whole = point_opts.seq_len if c > 1 else None  # a CP part of a sample: the whole one is checked
        how = {"training": training, "dtype": point_opts.dtype, "fp8_recipe": point_opts.fp8}
        points = tp_points(point_opts, tp_widths)
        # One point of a plan (the architecture search's winner): compiled from the model cut
        # to 5 and 6 blocks and deepened when that is the whole step's module (design §2.1.5)
        from_cut, uncut = (
            _one_point_from_cut(spec, b, seq_len, how, whole, points, point_opts, accelerator)
            if sweep
            else (None, None)
        )
        check: Callable[[], bool] = _always
        with whole_sequence(whole):
            if from_cut is not None:
                traced = None
            elif uncut is not None:  # a model with nothing to cut, traced once
                traced = uncut
            elif check_later:
                traced, check = trace_step_checked_later(spec, b, seq_len, **how)
            else:
                traced = trace_step(spec, b, seq_len, **how)

        def holds(check=check, whole=whole) -> bool:  # the check trace may run later, here
            with whole_sequence(whole):
                return check()

        seconds["trace"] += time.perf_counter() - start
        if traced is not None:
            log(traced_line(traced))
        else:
            log("compiled the model cut to 5 and 6 blocks, deepened to all of them")
        # The training step before sharding is the same at every TP width: import it and run
        # the training passes once per micro-batch, and give each point a copy.
        shared: ModuleOp | None = None
        if len(points) > 1 and STAGES.index(stage) > STAGES.index(Stage.TRAINING):
            start = time.perf_counter()
            try:
                shared = training_step(traced, point_opts, accelerator)
            except PhazeError:
                shared = None  # each point says why itself
            seconds["import"] += time.perf_counter() - start
        for k, (t, sp) in enumerate(points):
            start = time.perf_counter()
            where = point_label(b, t, sp, c)
            if sweep and c > 1 and t * c > point_opts.devices:  # no replica fits: said without compiling
                note = f"devices: t·c = {t}·{c} exceeds N = {point_opts.devices}"
                candidates.append(Candidate(b, t, note=note, sequence_parallel=sp, context_parallel=c))
                log(f"{where}: does not fit: {note}")
                continue
            try:
                if from_cut is not None:
                    module = from_cut
                elif shared is not None:
                    step = copy_for(shared, k, len(points))
                    module = compile_from(step, "training", stage, t, point_opts, sp, verify=not sweep)
                else:
                    # (a plan is verified once, when chosen)
                    module = compile_module(traced, stage, t, point_opts, accelerator, sp, verify=not sweep)
            except UnknownOpError:
                _confirm(holds)
                raise  # the model's, not this point's: every point would say it again
            except PhazeError as e:
                if not sweep:
                    _confirm(holds)
                    raise
                candidates.append(Candidate(b, t, note=str(e), sequence_parallel=sp, context_parallel=c))
                log(f"{where}: skipped: {e}")
                continue
            finally:
                seconds["points"] += time.perf_counter() - start
            if not sweep:
                _confirm(holds)
                log(f"built {sum(1 for _ in module.walk())} ops in {time.perf_counter() - start:.1f} s")
                return module, candidates
            cand, unfit = judge_point(module, b, t, sp, point_opts, log, f" [{time.perf_counter() - start:.1f} s]")
            candidates.append(cand)
            if cand.throughput > 0 and (best is None or cand.throughput > best[0]):
                best = (cand.throughput, module)
            if unfit:
                fallback = fallback or module
        _confirm(holds)
    return chosen_point(best[1] if best is not None else None, fallback, candidates, opts)


def _always() -> bool:
    return True


def _one_point_from_cut(
    spec, b: int, seq_len, how: dict, whole, points, opts: Options, accelerator
) -> tuple[ModuleOp | None, TracedGraph | None]:
    """``(module, None)``: the plan module of the only point of micro-batch ``b`` compiled from
    the model cut to 5 and 6 blocks (:func:`phaze.deepen_compiled.compile_from_cut`, not
    verified: the sweep verifies the plan it chooses); ``(None, step)``: a model with nothing to
    cut, its whole step as traced; ``(None, None)``: more than one point, no replica fits, the
    model is not cut (:func:`phaze_ir.frontend.deepen.trace_cut`), the deepened module is not
    the whole step's, or compiling raised (the whole trace's compilation then says why, as it
    always did)."""
    from phaze.deepen_compiled import compile_from_cut
    from phaze_ir.frontend.deepen import trace_cut
    from phaze_ir.frontend.trace import whole_sequence

    if len(points) != 1:
        return None, None
    t, sp = points[0]
    if context_parallel_degree(opts) > 1 and t * context_parallel_degree(opts) > opts.devices:
        return None, None
    with whole_sequence(whole):
        cut = trace_cut(spec, b, seq_len, **how)
    if cut is None:
        return None, None
    if cut.blocks is None:  # nothing to cut: the whole step
        return None, cut
    try:
        module = compile_from_cut(cut, t, opts, accelerator, sp, verify=False)
    except PhazeError:
        return None, None
    return module, None


def _confirm(holds: Callable[[], bool]) -> None:
    """Go on only when the step compiled was the whole model's (waiting for its check)."""
    if not holds():
        raise _NotTheWholeStep
