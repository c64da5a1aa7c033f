"""Plans you can launch: a plan as the command-line arguments of Megatron-LM or torchtitan.

``phazec MODEL.py --hw CHIP --export megatron FILE --export torchtitan FILE`` writes, next to the
plan, the arguments that make either framework run it: parallel degrees, pipeline schedule and
split, sequence parallelism, recompute, micro- and global batch, optimizer sharding, precision.
What each target cannot express exactly is refused for that target in one line (a
:class:`PhazeError`), never approximated.  The rules and their reasons are in
docs/launch.md; ``tests/test_export.py`` loads what is written through the real consumers
(torchtitan's ``ConfigManager``, megatron-core's config dataclasses and Megatron-LM's flag list).

An export file holds **one command-line argument per line** (``--flag=value`` or a bare
``--flag``), nothing else: ``mapfile -t ARGS < FILE`` and ``"${ARGS[@]}"`` pass it to a launcher
unchanged (a Megatron pipeline layout holds ``*`` and ``|``, which an unquoted ``$(cat FILE)``
would expand).

The functions here are pure: a plan dict, as ``phaze/plan_output.py`` ``plan_json`` writes it, and the
:class:`ModelFacts` of the traced model, to text (phazec writes the files with its other outputs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from phaze_ir.errors import PhazeError
from phaze_ir.op_kinds import RecomputePolicy

TARGETS = ("megatron", "torchtitan")


def pipeline_outermost_only(exports: list[tuple[str, str]] | None, expert_parallel: str) -> bool:
    """Whether the plan must number its devices ``tp-dp-pp`` to be launched by every export
    asked for: torchtitan's device mesh is (pp, dp, tp) whatever it is told, and Megatron-LM's
    ``--use-tp-pp-dp-mapping`` puts expert parallelism inside the pipeline, not inside data
    parallelism as phaze prices it."""
    targets = {target for target, _ in exports or ()}
    return "torchtitan" in targets or ("megatron" in targets and expert_parallel != "1")


# Sources the mapping relies on (docs/launch.md cites them):
#: Megatron-LM's argument parser, read for the flags below (tests/data/megatron_training_flags.txt).
MEGATRON_LM = (
    "https://github.com/NVIDIA/Megatron-LM/blob/d98e8a64ddf34856e74b24714e3bedb2f5a39553/megatron/training/arguments.py"
)
#: torchtitan 0.3.0 (PyPI): torchtitan/config/configs.py, torchtitan/distributed/pipeline_parallel.py.
TORCHTITAN = "torchtitan==0.3.0"

#: Every Megatron-LM flag :func:`megatron_args` can write (checked against Megatron-LM's parser:
#: tests/data/megatron_training_flags.txt, made by tests/data/megatron_training_flags.py).
MEGATRON_FLAGS = (
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--num-virtual-stages-per-pipeline-rank",
    "--pipeline-model-parallel-layout",
    "--context-parallel-size",
    "--cp-comm-type",
    "--tp-comm-overlap",
    "--sequence-parallel",
    "--expert-model-parallel-size",
    "--moe-expert-capacity-factor",
    "--moe-pad-expert-input-to-capacity",
    "--moe-token-dispatcher-type",
    "--micro-batch-size",
    "--global-batch-size",
    "--num-layers",
    "--seq-length",
    "--recompute-granularity",
    "--recompute-method",
    "--recompute-num-layers",
    "--use-distributed-optimizer",
    "--use-megatron-fsdp",
    "--data-parallel-sharding-strategy",
    "--ckpt-format",
    "--overlap-grad-reduce",
    "--overlap-param-gather",
    "--attention-dropout",
    "--hidden-dropout",
    "--use-tp-pp-dp-mapping",
    "--fp16",
    "--bf16",
    "--fp8-format",
    "--fp8-recipe",
    "--optimizer",
    # the model's shape (ModelFacts.shape)
    "--hidden-size",
    "--num-attention-heads",
    "--group-query-attention",
    "--num-query-groups",
    "--kv-channels",
    "--ffn-hidden-size",
    "--swiglu",
    "--normalization",
    "--norm-epsilon",
    "--position-embedding-type",
    "--rotary-base",
    "--max-position-embeddings",
    "--vocab-size",
    "--make-vocab-size-divisible-by",
    "--untie-embeddings-and-output-weights",
    "--disable-bias-linear",
    "--add-qkv-bias",
    "--num-experts",
    "--moe-router-topk",
    "--moe-ffn-hidden-size",
)

#: The CUDA compute capability from which a GPU has bf16 tensor cores (Ampere, sm_80: the CUDA
#: programming guide's bf16 arithmetic); a chip without a compute capability is no CUDA GPU
#: but a TPU-like accelerator, whose tensor units take bf16 (the paper's TPUv4 and its space).
CUDA_BF16_FROM = 8.0


@dataclass(frozen=True)
class ModelFacts:
    """What an export needs to know of the model and the run beyond the plan dict: the kind of
    every layer in order (``prologue``, ``block``, ``head``: ``phaze.layers``), the sequence
    length traced, the model's shape (``phaze.model_shape``: :mod:`phaze_ir.frontend.shape`),
    phazec's ``--dtype``, ``--optimizer``, ``--dp-overlap`` and ``--selective-recompute``, and
    whether the chip has bf16."""

    layer_kinds: tuple[str, ...]
    seq_len: int | None = None
    dtype: str = "float16"
    #: whether the user asked for ``dtype`` (phazec's ``--dtype``), or it is the default
    dtype_asked: bool = False
    optimizer: str = "adam"
    dp_overlap: bool = False
    #: FP8 primary weights (phazec's ``--fp8-params``)
    fp8_params: bool = False
    #: what the plan's selective recompute re-runs (phazec's ``--selective-recompute``)
    selective_recompute: str = "attention"
    #: whose kernels the plan was priced as (phazec's ``--kernels``)
    kernels: str = "ops"
    shape: dict[str, Any] = field(default_factory=dict, compare=False)
    bf16: bool = True

    @property
    def num_blocks(self) -> int:
        return sum(1 for k in self.layer_kinds if k == "block")


def precision(facts: ModelFacts) -> str | None:
    """The launch precision of the run: ``bf16``, ``fp16`` or ``fp32`` (None: ``--dtype model``,
    the model's own, which phaze does not know). Both targets launch 16-bit training as mixed
    precision with fp32 master weights (phaze's Adam prices it so); fp16 and bf16 move the same
    bytes at the same tensor rate on every chip phaze prices, so phazec's default (float16, not
    asked) launches bf16 wherever the chip has it (no loss scaling to tune), and fp16 when asked
    (``--dtype float16`` or ``amp-float16``) or on a chip without bf16."""
    if facts.dtype == "float32":
        return "fp32"
    if facts.dtype in ("bfloat16", "amp-bfloat16", "fp8"):  # fp8: bf16 but its FP8 linears
        return "bf16"
    if facts.dtype == "amp-float16":
        return "fp16"
    if facts.dtype == "float16":
        return "bf16" if facts.bf16 and not facts.dtype_asked else "fp16"
    return None


def chip_has_bf16(accelerator: dict[str, Any] | None) -> bool:
    """Whether the plan's chip (``plan["accelerator"]``) has bf16 (:data:`CUDA_BF16_FROM`)."""
    capability = (accelerator or {}).get("compute_capability")
    return capability is None or float(capability) >= CUDA_BF16_FROM


@dataclass(frozen=True)
class Settings:
    """The plan's parallel settings, checked for an export (one line each when not)."""

    dp: int
    pp: int
    tp: int
    #: the context-parallel degree (devices splitting each sequence; 1: none)
    cp: int
    micro_batch: int
    num_micro_batches: int
    global_batch: int
    devices_used: int
    sequence_parallel: bool
    #: the TP collectives priced overlapped with their GEMMs (``--tp-overlap``)
    tp_overlap: bool
    virtual_stages: int
    zero: int
    expert_parallel: int
    #: how the plan numbers the devices into groups (``tp-dp-pp`` or ``tp-pp-dp``): the same
    #: numbering when ``dp`` or ``pp`` is 1
    rank_order: str
    #: the MoE capacity factor the expert GEMMs were padded to; None: dropless
    capacity_factor: float | None
    recompute: str
    #: transformer blocks of each pipeline chunk (model chunk) in layer order: ``pp`` of them,
    #: ``pp * virtual_stages`` under interleaving; chunk ``i`` runs on pipeline rank ``i % pp``.
    chunk_blocks: tuple[int, ...]


def _int(plan: dict[str, Any], key: str, target: str) -> int:
    value = plan.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PhazeError(f"--export {target}: the plan's {key} is {value!r}, not a positive integer")
    return value


def settings(plan: dict[str, Any], facts: ModelFacts, target: str) -> Settings:
    """The checked settings of ``plan`` (``plan_json``'s dict) for ``target``."""
    if not plan.get("feasible"):
        why = plan.get("binding") or "infeasible"
        raise PhazeError(f"--export {target}: the plan is not feasible ({why}); there is nothing to launch")
    dp, pp, tp = _int(plan, "dp", target), _int(plan, "pp", target), _int(plan, "tp", target)
    cp = _int(plan, "cp", target) if "cp" in plan else 1  # (a plan of before context parallelism)
    b, m = _int(plan, "micro_batch_size", target), _int(plan, "num_micro_batches", target)
    gb = _int(plan, "global_batch", target)
    sp = bool(plan["sequence_parallel"])
    if plan.get("pipeline_transfer") == "split" and tp > 1 and pp > 1 and not sp:
        raise PhazeError(
            f"--export {target}: the plan splits its pipeline transfers over the TP group (--pipeline-transfer "
            f"split, DeepSpeed's pipeline engine); {target} sends them whole: price it with --pipeline-transfer whole"
        )
    v = int(plan["virtual_stages"])
    zero = int(plan["zero"])
    ep = int(plan["expert_parallel"])
    devices_used = int(plan.get("devices_used", dp * pp * tp * cp))
    if dp * b * m != gb:
        raise PhazeError(
            f"--export {target}: the global batch {gb} is not DP {dp} x micro-batch {b} x {m} micro-batches"
        )
    if devices_used != dp * pp * tp * cp:
        product = "DP x PP x TP" + (" x CP" if cp > 1 else "")
        used = dp * pp * tp * cp
        raise PhazeError(f"--export {target}: the plan uses {devices_used} devices, not {product} = {used}")
    if zero not in (0, 1, 2, 3):
        raise PhazeError(f"--export {target}: ZeRO stage {zero} is not 0, 1, 2 or 3")
    if v < 1 or ep < 1:
        raise PhazeError(f"--export {target}: virtual_stages {v} and expert_parallel {ep} must be positive")
    if v > 1 and pp == 1:
        raise PhazeError(f"--export {target}: interleaved 1F1B ({v} chunks per device) needs pipeline parallelism")
    # The numberings a plan may have (the placement's settings less auto, docs/design.md §5.5):
    # Megatron-LM's default and --use-tp-pp-dp-mapping; torchtitan runs the first only. Imported
    # here: phazec checks its --export outputs through this module before anything slow.
    from passes.algorithms.placement import RANK_ORDER_SETTINGS

    order = plan.get("rank_order")
    orders = RANK_ORDER_SETTINGS[1:]
    if order not in orders:
        raise PhazeError(f"--export {target}: the plan's rank_order is {order!r}, not one of {', '.join(orders)}")
    capacity = plan.get("capacity_factor")
    if capacity is not None and (
        isinstance(capacity, bool)
        or not isinstance(capacity, (int, float))
        or not math.isfinite(capacity)
        or capacity < 1
    ):
        raise PhazeError(f"--export {target}: the plan's capacity_factor is {capacity!r}, not a number >= 1")
    return Settings(
        dp=dp,
        pp=pp,
        tp=tp,
        cp=cp,
        micro_batch=b,
        num_micro_batches=m,
        global_batch=gb,
        devices_used=devices_used,
        sequence_parallel=sp,
        tp_overlap=bool(plan.get("tp_overlap", False)) and tp > 1,
        virtual_stages=v,
        zero=zero,
        expert_parallel=ep,
        rank_order=order,
        capacity_factor=None if capacity is None else float(capacity),
        recompute=_one_recompute(plan, target),
        chunk_blocks=_chunk_blocks(plan, facts, pp, v, target),
    )


def _one_recompute(plan: dict[str, Any], target: str) -> str:
    """The recompute policy of every stage: both targets set one for the whole model."""
    policies = sorted({str(s.get("recompute")) for s in plan.get("stages", [])})
    if len(policies) != 1:
        raise PhazeError(
            f"--export {target}: the stages use different recompute policies ({', '.join(policies)}) and "
            f"{target} sets one for every stage; compile with --recompute none|selective|full"
        )
    (policy,) = policies
    if policy not in UNIFORM_RECOMPUTE:
        raise PhazeError(f"--export {target}: unknown recompute policy {policy!r}")
    return policy


def _chunk_blocks(plan: dict[str, Any], facts: ModelFacts, pp: int, v: int, target: str) -> tuple[int, ...]:
    """Transformer blocks per pipeline chunk, in layer order, with every chunk where both targets
    put it (chunk ``i`` on pipeline rank ``i % pp``), the embedding (prologue) on the first and
    the head on the last; a one-line refusal otherwise."""
    kinds = facts.layer_kinds
    for i, kind in enumerate(kinds):
        allowed = {"block"} | ({"prologue"} if i == 0 else set()) | ({"head"} if i == len(kinds) - 1 else set())
        if kind not in allowed:
            raise PhazeError(
                f"--export {target}: layer {i} is a {kind}; an export needs the embedding (prologue), "
                "transformer blocks, then the head"
            )
    if facts.num_blocks == 0:
        raise PhazeError(f"--export {target}: the model has no transformer block (phaze.layers)")
    stages = plan.get("stages", [])
    if len(stages) != pp * v:
        raise PhazeError(f"--export {target}: the plan lists {len(stages)} stages, not PP x chunks = {pp * v}")
    chunks = []
    expect_first = 0
    for i, stage in enumerate(stages):
        first, last = (int(x) for x in stage["layers"])
        if first != expect_first or last < first or last >= len(kinds):
            raise PhazeError(
                f"--export {target}: stage {i} holds layers {first}..{last}; "
                f"the stages must cover layers 0..{len(kinds) - 1} in order"
            )
        rank = stage.get("rank", i % pp)
        if rank != i % pp:
            raise PhazeError(
                f"--export {target}: chunk {i} runs on pipeline rank {rank}; {target} runs chunk i on rank i mod {pp}"
            )
        chunks.append(sum(1 for k in kinds[first : last + 1] if k == "block"))
        expect_first = last + 1
    if expect_first != len(kinds):
        raise PhazeError(f"--export {target}: the stages end at layer {expect_first - 1} of {len(kinds) - 1}")
    return tuple(chunks)


# --- Megatron-LM ----------------------------------------------------------------------------


def megatron_layout(chunk_blocks: Sequence[int]) -> str:
    """Megatron-LM's ``--pipeline-model-parallel-layout`` of a split: one ``|``-separated entry per
    chunk (virtual stage), ``E`` the embedding on the first, ``L`` the loss (head) on the last,
    ``t*n`` its ``n`` transformer layers; e.g. ``Et*3|t*4|t*4|t*3L``."""
    parts = []
    for i, n in enumerate(chunk_blocks):
        layers = "" if n == 0 else "t" if n == 1 else f"t*{n}"
        parts.append(("E" if i == 0 else "") + layers + ("L" if i == len(chunk_blocks) - 1 else ""))
    return "|".join(parts)


#: The model flags Megatron-LM's GPT builder cannot do without (its validate_args asserts them).
MEGATRON_REQUIRED = ("--hidden-size", "--num-attention-heads")


def megatron_model_args(facts: ModelFacts) -> tuple[list[str], list[str]]:
    """The model's flags of Megatron-LM's GPT builder from the traced model's shape
    (:attr:`ModelFacts.shape`), and what the shape did not tell (said by phazec, in words)."""
    shape = facts.shape
    args: list[str] = []
    unknown: list[str] = []

    def put(flag: str, key: str) -> None:
        if key in shape:
            args.append(f"{flag}={shape[key]}")
        else:
            unknown.append(flag)

    put("--hidden-size", "hidden_size")
    put("--num-attention-heads", "num_attention_heads")
    if "num_query_groups" in shape:
        args += ["--group-query-attention", f"--num-query-groups={shape['num_query_groups']}"]
    if "kv_channels" in shape:
        args.append(f"--kv-channels={shape['kv_channels']}")
    put("--ffn-hidden-size", "ffn_hidden_size")
    activation = str(shape.get("activation", ""))
    if activation == "swiglu":
        args.append("--swiglu")
    elif not activation.startswith("gelu"):  # Megatron-LM's MLP is GeLU unless told --swiglu
        unknown.append(f"the {activation or 'unknown'} activation (Megatron-LM's MLP is GeLU or SwiGLU)")
    if shape.get("normalization") in ("LayerNorm", "RMSNorm"):
        args.append(f"--normalization={shape['normalization']}")
    else:
        unknown.append("--normalization")
    if "norm_epsilon" in shape:
        args.append(f"--norm-epsilon={shape['norm_epsilon']!r}")
    position = shape.get("position_embedding")
    if position in ("rope", "learned_absolute", "none"):
        args.append(f"--position-embedding-type={position}")
        if position == "rope" and "rotary_base" in shape:
            args.append(f"--rotary-base={shape['rotary_base']}")
    else:
        unknown.append("--position-embedding-type")
    if position == "rope" and "max_position_embeddings" in shape and facts.seq_len:
        # Rotary positions have no table: Megatron-LM's validate_args still asks for at least
        # the sequence length, which a run longer than the config's (a 128k Llama 3) needs.
        args.append(f"--max-position-embeddings={max(int(shape['max_position_embeddings']), facts.seq_len)}")
    else:
        put("--max-position-embeddings", "max_position_embeddings")
    if "vocab_size" in shape:
        # The model's embedding rows as they are: Megatron-LM pads a vocabulary to a multiple of
        # 128 x TP unless told otherwise (1: only to the TP width, which shards it).
        args += [f"--vocab-size={shape['vocab_size']}", "--make-vocab-size-divisible-by=1"]
    else:
        unknown.append("--vocab-size")
    # Megatron-LM drops 0.1 of both unless told (TransformerConfig's attention_dropout and
    # hidden_dropout at d98e8a64): the model's own, 0 for a Llama.
    put("--attention-dropout", "attention_dropout")
    put("--hidden-dropout", "hidden_dropout")
    if shape.get("tied_embeddings") is False:
        args.append("--untie-embeddings-and-output-weights")
    if shape.get("linear_bias") is False:
        args.append("--disable-bias-linear")
        if shape.get("qkv_bias"):
            args.append("--add-qkv-bias")
    if "num_experts" in shape:
        args.append(f"--num-experts={shape['num_experts']}")
        if "moe_router_topk" in shape:
            args.append(f"--moe-router-topk={shape['moe_router_topk']}")
        if "moe_ffn_hidden_size" in shape:
            args.append(f"--moe-ffn-hidden-size={shape['moe_ffn_hidden_size']}")
    return args, unknown


def megatron_args(plan: dict[str, Any], facts: ModelFacts) -> list[str]:
    """Megatron-LM (``pretrain_gpt.py``) arguments of the plan, one per list item: the model's
    shape as traced (:func:`megatron_model_args`), ``--num-layers`` and ``--seq-length``, and
    every parallel, batch, recompute, optimizer and precision setting. The tokenizer and the
    data are the user's."""
    s = settings(plan, facts, "megatron")
    args = [
        f"--tensor-model-parallel-size={s.tp}",
        f"--pipeline-model-parallel-size={s.pp}",
    ]
    chunks = s.chunk_blocks
    if len(set(chunks)) != 1:
        # Megatron's default split is even; any other (per chunk, embedding and loss included)
        # is exact as a layout, which also sets the virtual stages (one entry per chunk).
        args.append(f"--pipeline-model-parallel-layout={megatron_layout(chunks)}")
    elif s.virtual_stages > 1:
        args.append(f"--num-virtual-stages-per-pipeline-rank={s.virtual_stages}")
    if s.cp > 1:
        # The ring of point-to-point transfers phaze prices (Transformer Engine's P2P ring
        # attention; p2p is Megatron-LM's default, written to say which was priced).
        args += [f"--context-parallel-size={s.cp}", "--cp-comm-type=p2p"]
    if s.sequence_parallel and s.tp > 1:  # Megatron-LM drops SP at TP 1 (it shards nothing)
        args.append("--sequence-parallel")
    if s.tp_overlap:  # Transformer Engine's userbuffers, as priced (docs/design.md §5.2a)
        args.append("--tp-comm-overlap")
    if s.expert_parallel > 1:
        if s.tp > 1 and not s.sequence_parallel:
            raise PhazeError(
                "--export megatron: expert parallelism with tensor parallelism needs sequence parallelism in "
                "Megatron-LM (its token dispatcher splits the tokens over the TP ranks): compile with "
                "--sequence-parallel on"
            )
        # phaze prices the all-to-all dispatcher (Megatron-LM's default gathers every token
        # on every EP rank instead).
        args += [f"--expert-model-parallel-size={s.expert_parallel}", "--moe-token-dispatcher-type=alltoall"]
    if s.capacity_factor is not None:
        # Padded to capacity, not merely capped: every expert runs exactly C rows, as priced.
        args += [f"--moe-expert-capacity-factor={s.capacity_factor!r}", "--moe-pad-expert-input-to-capacity"]
    args += [
        f"--micro-batch-size={s.micro_batch}",
        f"--global-batch-size={s.global_batch}",
        f"--num-layers={facts.num_blocks}",
    ]
    if facts.seq_len:
        args.append(f"--seq-length={facts.seq_len}")
    if s.recompute == "full":
        # phaze's full recompute stashes each block's input and re-runs the block: Megatron's
        # uniform method over groups of one layer.
        args += ["--recompute-granularity=full", "--recompute-method=uniform", "--recompute-num-layers=1"]
    elif s.recompute == RecomputePolicy.SELECTIVE:
        if (why := selective_refusal("megatron", facts.selective_recompute)) is not None:
            raise PhazeError(why)
        args.append("--recompute-granularity=selective")  # the attention core (core_attn), as phaze's
    if s.zero >= 1:
        args.append("--use-distributed-optimizer")
    if s.zero >= 2:
        # ZeRO-2 and ZeRO-3 are Megatron-FSDP's optim_grads and optim_grads_params strategies
        # (docs/user-guide/features/megatron_fsdp.md), which need its checkpoint format.
        strategy = "optim_grads" if s.zero == 2 else "optim_grads_params"
        args += ["--use-megatron-fsdp", f"--data-parallel-sharding-strategy={strategy}", "--ckpt-format=fsdp_dtensor"]
    if facts.dp_overlap and s.dp > 1:
        args.append("--overlap-grad-reduce")
        if s.zero >= 1:  # the distributed optimizer's parameter all-gather, overlapped as priced
            args.append("--overlap-param-gather")
    if s.rank_order == "tp-pp-dp" and s.dp > 1 and s.pp > 1:
        if s.expert_parallel > 1:
            raise PhazeError(
                "--export megatron: the plan numbers devices tp-pp-dp, and Megatron-LM's --use-tp-pp-dp-mapping "
                "puts expert parallelism inside the pipeline, not inside data parallelism as phaze priced it: "
                "compile with --rank-order tp-dp-pp"
            )
        # Megatron-LM's default numbering is tp-cp-ep-dp-pp (pipeline outermost).
        args.append("--use-tp-pp-dp-mapping")
    kind = precision(facts)
    if kind in ("fp16", "bf16"):
        args.append(f"--{kind}")
    if facts.dtype == "fp8":
        # Transformer Engine's FP8 linears as priced: E4M3 forward, E5M2 gradients, delayed
        # per-tensor scaling (docs/design.md §5.11.5); the FP8 parameter all-gather is not priced.
        args += ["--fp8-format=hybrid", "--fp8-recipe=delayed"]
        if facts.fp8_params:
            # FP8 primary weights as priced (--fp8-params): Megatron-LM keeps the linears'
            # weights as TE's FP8 tensors and all-gathers them in FP8 under its distributed
            # optimizer (the all-gather's bytes are priced as bf16's, docs/design.md §6.5)
            args.append("--fp8-param-gather")
    if facts.optimizer == "sgd":
        args.append("--optimizer=sgd")
    if facts.optimizer == "adam-bf16":
        # Megatron-core's precision-aware optimizer keeps its main parameters in fp32 or fp16
        # (--main-params-dtype), not bf16 as Apex's DistributedFusedAdam with dtype bf16 does
        raise PhazeError(
            "--export megatron: --optimizer adam-bf16 (Apex's DistributedFusedAdam, state in bf16) has no "
            "Megatron-LM flags (--main-params-dtype is fp32 or fp16): compile with --optimizer adam"
        )
    return megatron_model_args(facts)[0] + args


# --- torchtitan -----------------------------------------------------------------------------


def torchtitan_stage_blocks(
    num_stages: int, num_layers: int, input_weight: int, output_weight: int
) -> list[int] | None:
    """Transformer layers per pipeline stage as torchtitan 0.3.0 splits them
    (``_generate_llm_fqn_per_model_part`` in torchtitan/distributed/pipeline_parallel.py: the
    embedding counts as ``input_weight`` layers, the head as ``output_weight``, the sum is spread
    evenly, the first stages taking the remainder); None where torchtitan refuses the split.
    tests/test_export.py compares it with torchtitan's own function."""
    if num_stages == 1:
        return [num_layers]
    effective = num_layers + input_weight + output_weight
    if num_stages > effective:
        return None
    per_stage, extra = divmod(effective, num_stages)
    if per_stage == 0 or input_weight > per_stage or output_weight > per_stage:
        return None
    counts = []
    current = 0
    for i in range(num_stages):
        n = per_stage + (1 if i < extra else 0)
        if i == 0:
            n -= input_weight
        elif i == num_stages - 1:
            n -= output_weight
        n = max(0, min(n, num_layers - current))
        counts.append(n)
        current += n
    return counts


def torchtitan_split(chunk_blocks: Sequence[int], interleaved: bool) -> tuple[int, int, int | None] | None:
    """``(first_stage_less_layers, last_stage_less_layers, layers_per_stage)`` with which torchtitan
    splits its layers exactly as ``chunk_blocks`` (the fewest weights that do), or None if none
    does. ``layers_per_stage`` is None for a single-stage schedule (one chunk per rank); an
    interleaved schedule sets it so that torchtitan makes ``len(chunk_blocks)`` stages."""
    num_stages, num_layers = len(chunk_blocks), sum(chunk_blocks)
    target = list(chunk_blocks)
    weights = sorted(
        ((i, o) for i in range(num_layers + 1) for o in range(num_layers + 1)), key=lambda w: (w[0] + w[1], w)
    )
    for i, o in weights:
        if torchtitan_stage_blocks(num_stages, num_layers, i, o) != target:
            continue
        if not interleaved:
            return i, o, None
        effective = num_layers + i + o
        per_stage = math.ceil(effective / num_stages)
        if math.ceil(effective / per_stage) == num_stages:
            return i, o, per_stage
    return None


def torchtitan_args(plan: dict[str, Any], facts: ModelFacts) -> list[str]:
    """torchtitan 0.3.0 (``torchtitan.train``) arguments of the plan, one per list item; the run
    also needs ``--module M --config F`` (the model), which is the user's.

    The activation-checkpoint subcommand is the last item: tyro reads what follows it as its
    options, so a user's own flags go before the file's."""
    target = "torchtitan"
    s = settings(plan, facts, target)
    _torchtitan_can_run(s.zero, facts.optimizer)
    if s.rank_order == "tp-pp-dp" and s.dp > 1 and s.pp > 1:
        raise PhazeError(
            "--export torchtitan: the plan numbers devices tp-pp-dp (data parallelism outermost); torchtitan's "
            "device mesh is pp, dp, tp (pipeline outermost): compile with --rank-order tp-dp-pp"
        )
    if s.capacity_factor is not None:
        raise PhazeError(
            f"--export torchtitan: the plan pads the experts to capacity factor {s.capacity_factor:g}; torchtitan "
            "0.3.0's MoE is dropless (HybridEP's non_blocking_capacity_factor bounds a receive buffer, it does not "
            "pad each expert): compile without --capacity-factor"
        )
    if s.cp > 1 and s.zero != 3:
        raise PhazeError(_TORCHTITAN_CP_ZERO.format(zero=s.zero))
    if s.tp_overlap and facts.kernels != "inductor":
        raise PhazeError(_TORCHTITAN_ASYNC_TP)
    replicate, shard = (1, s.dp) if s.zero == 3 else (s.dp, 1)
    p = "--parallelism."
    args = [
        f"{p}data_parallel_replicate_degree={replicate}",
        f"{p}data_parallel_shard_degree={shard}",
        f"{p}tensor_parallel_degree={s.tp}",
        # torchtitan's SP is on by default and only acts with TP: written both ways.
        f"{p}{'' if s.sequence_parallel and s.tp > 1 else 'no-'}enable_sequence_parallel",
        f"{p}context_parallel_degree={s.cp}",
        f"{p}expert_parallel_degree={s.expert_parallel}",
        f"{p}pipeline_parallel_degree={s.pp}",
    ]
    if s.zero == 3:
        # phaze's ZeRO-3 gathers each layer's parameters in forward and again in backward;
        # torchtitan's default keeps them gathered from forward to backward under PP.
        args.append(f"{p}fsdp_reshard_after_forward=always")
    if s.pp > 1:
        interleaved = s.virtual_stages > 1
        split = torchtitan_split(s.chunk_blocks, interleaved)
        if split is None:
            raise PhazeError(
                f"--export torchtitan: torchtitan cannot split the {sum(s.chunk_blocks)} blocks as the plan does "
                f"({', '.join(map(str, s.chunk_blocks))} per chunk)"
            )
        first_less, last_less, per_stage = split
        args += [
            f"{p}pipeline_parallel_schedule={'Interleaved1F1B' if interleaved else '1F1B'}",
            f"{p}pipeline_parallel_microbatch_size={s.micro_batch}",
            f"{p}pipeline_parallel_first_stage_less_layers={first_less}",
            f"{p}pipeline_parallel_last_stage_less_layers={last_less}",
            f"{p}pipeline_parallel_layers_per_stage={per_stage}",
            f"{p}module_fqns_per_model_part=None",
            "--training.disable_cuda_graphs",  # torchtitan refuses CUDA graphs under PP
            # Under PP a rank's batch is cut into micro-batches; without it, accumulated.
            f"--training.local_batch_size={s.micro_batch * s.num_micro_batches}",
        ]
    else:
        args.append(f"--training.local_batch_size={s.micro_batch}")
    if s.tp_overlap:  # priced as Transformer Engine's overlap; torch's micro-pipelined TP is alike
        args += ["--compile.enable", "--compile.enable_async_tensor_parallel"]
    args.append(f"--training.global_batch_size={s.global_batch}")
    if facts.seq_len:
        args.append(f"--training.seq_len={facts.seq_len}")
    kind = precision(facts)
    if kind == "fp16":
        raise PhazeError(_TORCHTITAN_FP16)
    if facts.dtype == "fp8":
        raise PhazeError(_TORCHTITAN_FP8)
    if kind is not None:
        # Mixed precision with fp32 master weights, as phaze's Adam (precision(): the same as
        # the Megatron-LM export's).
        mixed = "float32" if kind == "fp32" else "bfloat16"
        args += ["--training.dtype=float32", f"--training.mixed_precision_param={mixed}"]
    args.append(f"activation-checkpoint:{_torchtitan_checkpoint(s.recompute, facts.selective_recompute)}")
    return args


def _torchtitan_checkpoint(recompute: str, selective: str) -> str:
    """torchtitan 0.3.0's activation-checkpoint subcommand of a uniform recompute policy."""
    if recompute == "full":
        return "full"
    if recompute != RecomputePolicy.SELECTIVE or selective == "attention":
        # Megatron's selective recompute re-runs the attention core. torchtitan's attention is
        # a fused SDPA kernel that keeps no s x s tensor and recomputes it in backward: that is
        # what the policy buys, so it runs without checkpointing.
        return "none"
    if (why := selective_refusal("torchtitan", selective)) is not None:
        raise PhazeError(why)
    return "selective"  # SelectiveAC: torchtitan's per-op policy, as phaze prices it


def selective_refusal(target: str, selective: str) -> str | None:
    """Why ``target`` cannot launch selective recompute that re-runs ``selective``
    (``--selective-recompute``), in one line; None when it can."""
    if target == "megatron" and selective != "attention":
        return (
            f"--export megatron: the plan's selective recompute is torchtitan's ({selective}); Megatron-LM's "
            "re-runs the attention core: compile with --selective-recompute attention"
        )
    if target == "torchtitan" and selective not in ("attention", "op"):
        return (
            f"--export torchtitan: torchtitan 0.3.0 has no selective layer checkpointing ({selective}; its "
            "SelectiveAC is per op): compile with --selective-recompute op"
        )
    return None


# --- the command line ---------------------------------------------------------------------------


def render(target: str, plan: dict[str, Any], facts: ModelFacts) -> str:
    """The text of one export file: one argument per line."""
    if target == "megatron":
        args = megatron_args(plan, facts)
    elif target == "torchtitan":
        args = torchtitan_args(plan, facts)
    else:
        raise PhazeError(f"--export {target}: unknown target (choose from {', '.join(TARGETS)})")
    return "".join(a + "\n" for a in args)


_TORCHTITAN_CP_ZERO = (
    "--export torchtitan: torchtitan 0.3.0 shards the weights over its CP group (FSDP over data_parallel_shard x "
    "context_parallel, torchtitan/distributed/parallel_dims.py), which ZeRO {zero} does not: compile with --zero 3"
)
_TORCHTITAN_ASYNC_TP = (
    "--export torchtitan: torchtitan 0.3.0's async TP runs under torch.compile only (CompileConfig asks "
    "--compile.enable): compile with --kernels inductor, or --tp-overlap off"
)
_TORCHTITAN_FP8 = (
    "--export torchtitan: torchtitan 0.3.0's float8 converter runs rowwise scaling (E4M3 throughout), set in a "
    "Python config (models/llama3/config_registry.py), not Transformer Engine's per-tensor hybrid recipe phaze "
    "priced: launch it with --export megatron"
)
_TORCHTITAN_FP16 = (
    "--export torchtitan: torchtitan 0.3.0 has no fp16 mixed precision (bf16 or fp32): compile with --dtype "
    "bfloat16 or amp-bfloat16 (the same price)"
)


def torchtitan_flavour(facts: ModelFacts) -> tuple[list[str], list[str]]:
    """The fields of torchtitan's model flavour (0.3.0: a ``Llama3Model.Config`` built by
    ``torchtitan/models/llama3/__init__.py``, ``_build_llama3_layers`` and its rope config),
    which no command-line flag of torchtitan sets, as ``name=value``; and the fields the traced
    shape did not tell. phazec says them when it writes the export; ``--module``/``--config``
    name the flavour registered with them."""
    shape = facts.shape
    fields: list[str] = [f"n_layers={facts.num_blocks}"]
    unknown: list[str] = []
    for name, key in (
        ("dim", "hidden_size"),
        ("n_heads", "num_attention_heads"),
        ("n_kv_heads", "num_query_groups"),
        ("hidden_dim", "ffn_hidden_size"),
        ("vocab_size", "vocab_size"),
        ("norm_eps", "norm_epsilon"),
        ("rope.theta", "rotary_base"),
        ("rope.max_seq_len", "max_position_embeddings"),
    ):
        if key in shape:
            fields.append(f"{name}={shape[key]}")
        elif name == "n_kv_heads" and "num_attention_heads" in shape:
            fields.append(f"n_kv_heads={shape['num_attention_heads']}")  # multi-head attention
        else:
            unknown.append(name)
    return fields, unknown


def _torchtitan_can_run(zero: int, optimizer: str) -> None:
    """torchtitan's refusal of a ZeRO stage or an optimizer it has not (known from the options,
    before any work, when they fix them)."""
    if zero in (1, 2):
        raise PhazeError(
            f"--export torchtitan: ZeRO-{zero} shards the optimizer state{' and gradients' if zero == 2 else ''} "
            "but not the parameters; torchtitan shards all three (FSDP, ZeRO-3) or none: compile with --zero 0 or 3"
        )
    if optimizer != "adam":
        raise PhazeError(f"--export torchtitan: torchtitan 0.3.0 has no {optimizer} optimizer (Adam, AdamW, DistMuon)")


def export_outputs(args) -> list[tuple[str, str]]:
    """``(flag, path)`` of each of phazec's ``--export TARGET FILE`` (its ``refuse_clashes`` checks
    them with its other outputs), after checking each target and file name, before any work."""
    requests = getattr(args, "export", None) or []
    if requests and (args.hw is None or args.emit != "plan"):
        raise PhazeError(
            "--export needs a plan for one accelerator (--hw CHIP, --emit plan): a searched chip cannot be launched"
        )
    outputs = []
    for target, path in requests:
        if target not in TARGETS:
            raise PhazeError(f"--export {target}: unknown target (choose from {', '.join(TARGETS)})")
        if path in ("", "-"):
            raise PhazeError(f"--export {target} needs a file name (not stdout)")
        if target == "torchtitan":
            zero = str(getattr(args, "zero", "0"))
            _torchtitan_can_run(int(zero) if zero.isdigit() else 0, getattr(args, "optimizer", "adam"))
            if getattr(args, "dtype", None) in ("float16", "amp-float16"):  # fp16 asked by name
                raise PhazeError(_TORCHTITAN_FP16)
            if getattr(args, "dtype", None) == "fp8":
                raise PhazeError(_TORCHTITAN_FP8)
            cp = str(getattr(args, "context_parallel", "1"))
            if cp.isdigit() and int(cp) > 1 and zero not in ("3", "auto"):
                raise PhazeError(_TORCHTITAN_CP_ZERO.format(zero=zero))
            if getattr(args, "tp_overlap", "off") == "on" and getattr(args, "kernels", None) != "inductor":
                raise PhazeError(_TORCHTITAN_ASYNC_TP)
        selective = getattr(args, "selective_recompute", None) or "attention"
        if getattr(args, "recompute", None) == "selective" and (why := selective_refusal(target, selective)):
            raise PhazeError(why)
        outputs.append((f"--export {target}", path))
    return outputs


#: What the search may choose under ``auto`` that each target runs: the ZeRO stages it has
#: (torchtitan: none or FSDP; Megatron-LM: all four, ``megatron_args``), and one recompute
#: policy for every stage (both set one for the whole model; ``auto`` lets the placement DP
#: choose per stage, and the DP has no "one for all" setting: each uniform policy is a search
#: of its own). The rank order is :func:`pipeline_outermost_only`'s; the pipeline schedules
#: both run (an interleaved split is even, which torchtitan's weights always express).
LAUNCHABLE_ZERO = {"megatron": ("0", "1", "2", "3"), "torchtitan": ("0", "3")}
UNIFORM_RECOMPUTE = tuple(p.value for p in RecomputePolicy)


def launchable_choices(
    exports: Sequence[Sequence[str]] | None,
    zero: str,
    recompute: str,
    selective: str = "attention",
    context_parallel: str = "1",
) -> list[dict[str, str]]:
    """The narrowings of ``--zero`` and ``--recompute`` under which every plan the search can
    choose is launched by every ``--export`` target asked for: one dict of driver options
    (``zero``, ``recompute``) per search to run, the best of which is the best launchable plan
    (``[{}]``: no narrowing needed); ``selective``: what selective recompute re-runs, which a
    target may not have (:func:`selective_refusal`); ``context_parallel``: phazec's
    ``--context-parallel``, under which torchtitan runs ZeRO-3 only (it shards the weights over
    its CP group; under ``auto`` too, the CP 1 points with them). A fixed choice a target cannot
    run was refused before, by :func:`export_outputs`."""
    targets = {target for target, _ in exports or ()}
    if not targets:
        return [{}]
    zeros = [zero]
    if zero == "auto":
        allowed = set.intersection(*(set(LAUNCHABLE_ZERO[t]) for t in targets))
        if "torchtitan" in targets and context_parallel != "1":
            allowed &= {"3"}
        if allowed != set(LAUNCHABLE_ZERO["megatron"]):
            zeros = sorted(allowed)
    policies = list(UNIFORM_RECOMPUTE) if recompute == "auto" else [recompute]
    if any(selective_refusal(t, selective) for t in targets) and recompute == "auto":
        policies.remove(RecomputePolicy.SELECTIVE)
    choices = [
        {**({"zero": z} if z != zero else {}), **({"recompute": r} if r != recompute else {})}
        for z in zeros
        for r in policies
    ]
    return choices if choices != [{}] else [{}]


def model_facts(module, opts) -> ModelFacts:
    """The :class:`ModelFacts` of a compiled module and phazec's driver options."""
    from phaze_ir import keys
    from phaze_ir.attributes import LayerInfoAttr

    layers = keys.records_of(module, keys.LAYERS, LayerInfoAttr)
    seq_len = keys.int_of(module, keys.SEQ_LEN, 0)
    shape = keys.dict_of(module, keys.MODEL_SHAPE)
    return facts_of([str(layer.as_dict()["kind"]) for layer in layers], seq_len or None, opts, shape)


def facts_of(
    layer_kinds: Sequence[str],
    seq_len: int | None,
    opts,
    shape: dict[str, Any] | None = None,
    plan: dict[str, Any] | None = None,
) -> ModelFacts:
    """The :class:`ModelFacts` of a model's layer kinds, traced sequence length and shape (a
    compiled module's, or those kept with a cached answer), phazec's driver options and the
    plan's chip (``plan["accelerator"]``: whether it has bf16)."""
    return ModelFacts(
        layer_kinds=tuple(layer_kinds),
        seq_len=seq_len,
        dtype=opts.dtype,
        optimizer=opts.optimizer,
        dp_overlap=opts.dp_overlap,
        fp8_params=bool(getattr(opts, "fp8_params", False)),
        selective_recompute=opts.selective_recompute,
        kernels=opts.kernels,
        shape=dict(shape or {}),
        bf16=chip_has_bf16((plan or {}).get("accelerator")),
    )


def refusals(requests: Sequence[Sequence[str]] | None, plan: dict[str, Any], facts: ModelFacts) -> list[str]:
    """The one-line refusal of each ``--export`` target that cannot launch ``plan`` (none: it
    launches in all)."""
    out = []
    for target, _ in requests or []:
        try:
            render(target, plan, facts)
        except PhazeError as e:
            out.append(str(e))
    return out


def export_files(
    requests: Sequence[Sequence[str]] | None, plan: dict[str, Any], facts: ModelFacts, log
) -> tuple[list[tuple[str, str, str]], list[str]]:
    """``(path, text, what it is)`` of every ``--export TARGET FILE`` of a feasible plan that its
    target launches, all rendered before any is written, and the one-line refusal of each that
    it does not (phazec writes the others and exits :data:`phaze.messages.PARTIAL`). What a
    target's command line cannot carry (torchtitan's model flavour, a flag the traced shape did
    not tell) is said in ``log``. An infeasible plan exports none (phazec then exits 1 saying
    which constraint binds)."""
    if requests and not plan.get("feasible"):
        log("--export: nothing written, no placement fits")
        return [], []
    files, refused = [], []
    for target, path in requests or []:
        try:
            text = render(target, plan, facts)
        except PhazeError as e:
            refused.append(f"{e}; {path} not written")
            continue
        files.append((path, text, f"{target} arguments"))
        if target == "megatron":
            unknown = megatron_model_args(facts)[1]
            if unknown:
                log(f"--export megatron: the model does not tell {', '.join(unknown)}: add them to {path}'s")
        else:
            fields, unknown = torchtitan_flavour(facts)
            missing = f" (the model does not tell {', '.join(unknown)})" if unknown else ""
            log(
                f"--export torchtitan: its model flavour (torchtitan's --module/--config, no command-line field): "
                f"{', '.join(fields)}{missing}"
            )
    return files, refused
