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

The functions here are pure: a plan dict, as ``phaze/plan/plan_output.py`` ``plan_json`` writes it, and the
:class:`ModelFacts` of the traced model, to text (phazec writes the files with its other outputs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from passes.algorithms.option_values import (
    Auto,
    Dtype,
    Fp8RecipeSetting,
    Optimizer,
    RankOrder,
    Recompute,
    Runtime,
    SdpaOrder,
    Tristate,
    Zero,
)
from phaze_ir.errors import PhazeError
from phaze_ir.op_kinds import RecomputePolicy

TARGETS = ("megatron", "torchtitan")


def pipeline_outermost_only(exports: list[tuple[str, str]] | None, expert_parallel: int | Auto | None) -> bool:
    """Whether the plan must number its devices ``tp-dp-pp`` to be launched by every export
    asked for: torchtitan's device mesh is (pp, dp, tp) whatever it is told, and Megatron-LM's
    ``--use-tp-pp-dp-mapping`` puts expert parallelism inside the pipeline, not inside data
    parallelism as phaze prices it (``expert_parallel``: the parsed option, None not given: 1)."""
    targets = {target for target, _ in exports or ()}
    return "torchtitan" in targets or ("megatron" in targets and expert_parallel not in (None, 1))


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
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
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
    "--grad-reduce-in-bf16",
    "--accumulate-allreduce-grads-in-fp32",
    "--fp8-format",
    "--fp8-recipe",
    "--optimizer",
    "--transformer-impl",
    "--attention-backend",
    # the tokenizer and data: placeholders (MEGATRON_PLACEHOLDERS)
    "--tokenizer-type",
    "--tokenizer-model",
    "--data-path",
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

#: The key of :attr:`ModelFacts.shape` (kept with a cached answer) under which :func:`model_facts`
#: puts the traced attention's fused aten op (:attr:`ModelFacts.attention`).
TRACED_ATTENTION_KEY = "traced_attention"


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
    optimizer: Optimizer = Optimizer.ADAM
    dp_overlap: bool = False
    #: FP8 primary weights (phazec's ``--fp8-params``)
    fp8_params: bool = False
    #: how the FP8 linears scale their casts (phazec's ``--fp8-recipe``, resolved)
    fp8_recipe: str = "delayed"
    #: the dtype the DP gradient collectives were priced in (phazec's ``--reduce-dtype``)
    reduce_dtype: str = "fp32"
    #: HSDP's shard group (phazec's ``--dp-shard``; 0: ZeRO shards over the whole DP group)
    dp_shard: int = 0
    #: what the plan's selective recompute re-runs (phazec's ``--selective-recompute``)
    selective_recompute: str = "attention"
    #: whose kernels the plan was priced as (phazec's ``--kernels``)
    kernels: Runtime = Runtime.OPS
    #: torch's SDPA backend order the plan was priced under (phazec's ``--sdpa-order``)
    sdpa_order: SdpaOrder = SdpaOrder.CUDNN_FIRST
    shape: dict[str, Any] = field(default_factory=dict, compare=False)
    bf16: bool = True
    #: the plan's chip's CUDA compute capability (None: no CUDA GPU, or not known)
    compute_capability: float | None = None

    @property
    def attention(self) -> str | None:
        """The attention as traced: the aten op of its fused kernel (``phaze.fused``, e.g.
        ``_scaled_dot_product_flash_attention causal``), ``""`` when the model's attention was
        traced as separate matmuls and softmax (eager attention), None when not known (a model
        without attention, an answer cached before this was kept)."""
        value = self.shape.get(TRACED_ATTENTION_KEY)
        return None if value is None else str(value)

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
    if facts.dtype == Dtype.FLOAT32:
        return "fp32"
    if facts.dtype in (Dtype.BFLOAT16, Dtype.AMP_BFLOAT16, Dtype.FP8):  # fp8: bf16 but its FP8 linears
        return "bf16"
    if facts.dtype == Dtype.AMP_FLOAT16:
        return "fp16"
    if facts.dtype == Dtype.FLOAT16:
        return "bf16" if facts.bf16 and not facts.dtype_asked else "fp16"
    return None


def chip_has_bf16(accelerator: dict[str, Any] | None) -> bool:
    """Whether the plan's chip (``plan["accelerator"]``) has bf16 (:data:`CUDA_BF16_FROM`)."""
    capability = _capability(accelerator)
    return capability is None or capability >= CUDA_BF16_FROM


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
    #: the width each expert's weights split over: ``tp``, or below it the experts' own mesh
    #: (Megatron-core's MoE parallel folding)
    expert_tensor_parallel: int
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
    etp = int(plan.get("expert_tensor_parallel") or tp)  # (a plan of before expert tensor parallelism: tp)
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
        expert_tensor_parallel=etp,
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
    if _hsdp(s, facts):
        raise PhazeError(
            f"--export megatron: the plan is HSDP (--dp-shard {facts.dp_shard}: sharded over {facts.dp_shard} of the "
            f"{s.dp * s.cp} DP ranks, replicated over the rest), which this export does not write for Megatron-LM: "
            "export it to torchtitan, or compile without --dp-shard"
        )
    args = [
        f"--tensor-model-parallel-size={s.tp}",
        f"--pipeline-model-parallel-size={s.pp}",
    ]
    chunks = s.chunk_blocks
    ends = megatron_uneven_ends(chunks) if s.virtual_stages == 1 else None
    if ends is not None:
        # Uneven first and/or last stage, the middle ones even: Megatron-LM's own flags for it.
        first, last = ends
        if first is not None:
            args.append(f"--decoder-first-pipeline-num-layers={first}")
        if last is not None:
            args.append(f"--decoder-last-pipeline-num-layers={last}")
    elif len(set(chunks)) != 1:
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
        if s.cp > 1 and s.expert_tensor_parallel == s.tp:
            # phaze prices EP under CP as Megatron-core 0.9 numbered it (tp-cp-ep-dp-pp: the EP
            # group is the replicas at one CP rank, docs/design.md §6.8); the Megatron-LM this
            # export targets (d98e8a64) builds the expert ranks with cp=1, folding the EP group
            # over the CP and DP ranks (parallel_state.py, expert_decoder_rank_generator): another
            # all-to-all group than the one priced.
            raise PhazeError(
                f"--export megatron: expert parallelism {s.expert_parallel} with context parallelism {s.cp} is "
                "priced as Megatron-core 0.9 placed it (the EP group within one CP rank); today's Megatron-LM folds "
                "the EP group over the CP ranks, so the run would not be the plan priced: compile with "
                "--context-parallel 1 or --expert-parallel 1"
            )
        # phaze prices the all-to-all dispatcher (Megatron-LM's default gathers every token
        # on every EP rank instead).
        args += [f"--expert-model-parallel-size={s.expert_parallel}", "--moe-token-dispatcher-type=alltoall"]
    if s.expert_tensor_parallel != s.tp:
        # The experts' own mesh as priced (MoE parallel folding: Megatron-core's expert rank
        # generator, ETP x EP x EDP over TP x CP x DP, docs/design.md §6.8).
        args.append(f"--expert-tensor-parallel-size={s.expert_tensor_parallel}")
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
    if s.recompute == RecomputePolicy.FULL:
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
    if s.rank_order == RankOrder.TP_PP_DP and s.dp > 1 and s.pp > 1:
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
    # The gradients reduced as priced (--reduce-dtype; Megatron-LM d98e8a64, arguments.py: --bf16
    # reduces in fp32 unless --grad-reduce-in-bf16, --fp16 in fp16 unless
    # --accumulate-allreduce-grads-in-fp32; docs/design.md §6.5)
    if kind == "bf16" and facts.reduce_dtype != "fp32":
        args.append("--grad-reduce-in-bf16")
    if kind == "fp16" and facts.reduce_dtype == "fp32":
        args.append("--accumulate-allreduce-grads-in-fp32")
    if facts.dtype == Dtype.FP8:
        # Transformer Engine's FP8 linears as priced: E4M3 forward, E5M2 gradients, delayed or
        # current per-tensor scaling (Megatron-LM d98e8a64, arguments.py: --fp8-recipe
        # delayed, tensorwise; docs/design.md §5.11.5); the FP8 parameter all-gather is not priced.
        recipe = MEGATRON_FP8_RECIPES.get(facts.fp8_recipe)
        if recipe is None:
            raise PhazeError(_MEGATRON_TORCHAO.format(recipe=facts.fp8_recipe))
        args += ["--fp8-format=hybrid", f"--fp8-recipe={recipe}"]
        if facts.fp8_params:
            # FP8 primary weights as priced (--fp8-params): Megatron-LM keeps the linears'
            # weights as TE's FP8 tensors and all-gathers them in FP8 under its distributed
            # optimizer (the all-gather's bytes are priced as bf16's, docs/design.md §6.5)
            args.append("--fp8-param-gather")
    if facts.optimizer == Optimizer.SGD:
        args.append("--optimizer=sgd")
    if facts.optimizer == Optimizer.ADAM_BF16:
        # Megatron-core's precision-aware optimizer keeps its main parameters in fp32 or fp16
        # (--main-params-dtype), not bf16 as Apex's DistributedFusedAdam with dtype bf16 does
        raise PhazeError(
            "--export megatron: --optimizer adam-bf16 (Apex's DistributedFusedAdam, state in bf16) has no "
            "Megatron-LM flags (--main-params-dtype is fp32 or fp16): compile with --optimizer adam"
        )
    if facts.optimizer == Optimizer.ADAM_FOREACH:
        # Megatron-LM steps Adam with one fused kernel (Transformer Engine's or Apex's FusedAdam)
        raise PhazeError(
            "--export megatron: --optimizer adam-foreach (torch's foreach AdamW, eight kernels a step) is not "
            "Megatron-LM's fused Adam: compile with --optimizer adam"
        )
    # Transformer Engine's layers (Megatron-LM's default, written to say which runs: its
    # --tp-comm-overlap and FP8 need them); the attention kernel as priced where Megatron-LM
    # has it (megatron_attention_backend; runtime_differences says where not).
    args.append("--transformer-impl=transformer_engine")
    backend = megatron_attention_backend(facts)
    if backend is not None:
        args.append(f"--attention-backend={backend[0]}")
    return megatron_model_args(facts)[0] + args + list(MEGATRON_PLACEHOLDERS)


#: The tokenizer and the data, which are the user's: clearly marked placeholders (a run does not
#: start until they are replaced; Megatron-LM's parser takes them as they are).
MEGATRON_PLACEHOLDERS = (
    "--tokenizer-type=HuggingFaceTokenizer",
    "--tokenizer-model=<REPLACE:tokenizer-name-or-path>",
    "--data-path=<REPLACE:data-prefix>",
)


def megatron_uneven_ends(chunks: Sequence[int]) -> tuple[int | None, int | None] | None:
    """``(first, last)`` for Megatron-LM's ``--decoder-first-pipeline-num-layers`` and
    ``--decoder-last-pipeline-num-layers`` (None: that flag not written) when that is how the
    one-chunk-per-rank split ``chunks`` is made: the first and/or last stage uneven, every middle
    stage the same, none empty (megatron-core's TransformerConfig: each given stage > 0, the
    middle layers even over the middle stages); None otherwise (even, or another split)."""
    if len(chunks) < 2 or len(set(chunks)) == 1 or min(chunks) < 1:
        return None
    if len(chunks) == 2:
        return chunks[0], None  # the last stage takes the rest
    middle = chunks[1:-1]
    if len(set(middle)) != 1:
        return None
    first = chunks[0] if chunks[0] != middle[0] else None
    last = chunks[-1] if chunks[-1] != middle[0] else None
    return first, last


#: Megatron-LM's --attention-backend (AttnBackend at d98e8a64) of each fused attention kernel
#: phaze prices (passes/algorithms/attention.py's BACKENDS): Transformer Engine's FusedAttention
#: is cuDNN's, its FlashAttention backend FlashAttention-2 as NVIDIA's containers ship it.
MEGATRON_ATTENTION = {"cudnn": "fused", "flash2": "flash"}


def megatron_attention_backend(facts: ModelFacts) -> tuple[str, str | None] | None:
    """Megatron-LM's ``--attention-backend`` for the plan and the kernel phaze priced (None:
    priced unfused); None when the traced attention is not known (no flag: Megatron-LM's auto).

    The kernel priced is ``passes.algorithms.kernels.attention_backend`` of the plan's
    ``--kernels`` on its chip; an attention traced unfused (eager attention) runs as TE's
    UnfusedDotProductAttention (``unfused``: matmul, fused softmax, matmul); a fused kernel
    Megatron-LM has is asked for by name; one it has not (xFormers' memory-efficient, or
    ``--kernels ops``'s expansion of a fused attention) gets the kernel Megatron-LM would choose
    on the chip, which :func:`runtime_differences` says."""
    traced = facts.attention
    if traced is None or facts.compute_capability is None:
        return None
    if traced == "":
        return "unfused", None
    from passes.algorithms.kernels import attention_backend

    priced = attention_backend(facts.kernels, facts.compute_capability, traced, facts.sdpa_order)
    if priced in MEGATRON_ATTENTION:
        return MEGATRON_ATTENTION[priced], priced
    ran = attention_backend("megatron", facts.compute_capability, traced)
    return MEGATRON_ATTENTION.get(str(ran), "auto"), priced


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


#: torchtitan 0.3.0's registered Llama 3 runs (``--module llama3 --config NAME``,
#: torchtitan/models/llama3/config_registry.py) and the model of each (its flavour in
#: torchtitan/models/llama3/__init__.py: ``_8b``, ``_70b``), as :func:`torchtitan_flavour`
#: names the fields; tests/test_export.py builds them with torchtitan. Not ``llama3_405b``: its
#: model is converted to rowwise Float8 and compiled in Python (no flag turns them off), which
#: phaze does not price; a 405B model gets its flavour file.
TORCHTITAN_REGISTERED = {
    "llama3_8b": {"n_layers": 32, "dim": 4096, "n_heads": 32, "n_kv_heads": 8, "hidden_dim": 14336},
    "llama3_70b": {"n_layers": 80, "dim": 8192, "n_heads": 64, "n_kv_heads": 8, "hidden_dim": 28672},
}
#: What every registered Llama 3 flavour shares: its vocabulary and RoPE base.
TORCHTITAN_LLAMA3_COMMON = {"vocab_size": 128256, "rope.theta": 500000}
#: The run a flavour-registration file starts from (its model replaced), and the function it defines.
TORCHTITAN_BASE_CONFIG = "llama3_8b"
TORCHTITAN_PLAN_CONFIG = "phaze_plan"


def torchtitan_llama_differences(facts: ModelFacts) -> list[str]:
    """What torchtitan 0.3.0's Llama 3 (SwiGLU, RMSNorm, RoPE, untied embeddings, no biases,
    head size dim / n_heads) cannot run as the traced model has it, in words; empty when it runs
    the model as traced."""
    shape = facts.shape
    out = []
    for key, want, words in (
        ("activation", "swiglu", "activation"),
        ("normalization", "RMSNorm", "normalization"),
        ("position_embedding", "rope", "position embedding"),
        ("tied_embeddings", False, "tied embeddings"),
        ("linear_bias", False, "linear biases"),
    ):
        if key in shape and shape[key] != want:
            out.append(f"{words} {shape[key]}")
    if shape.get("qkv_bias"):
        out.append("QKV biases")
    heads, dim, kv = shape.get("num_attention_heads"), shape.get("hidden_size"), shape.get("kv_channels")
    if kv and heads and dim and int(kv) * int(heads) != int(dim):
        out.append(f"head size {kv} (torchtitan's is dim / n_heads = {int(dim) // int(heads)})")
    if "num_experts" in shape:
        out.append(f"{shape['num_experts']} experts")
    return out


def torchtitan_registered(facts: ModelFacts) -> str | None:
    """The registered torchtitan run (:data:`TORCHTITAN_REGISTERED`) whose model is the traced
    one, or None; None under ``--dtype fp8`` too: torchtitan 0.3.0 sets its float8 converter in
    Python only (``model_registry(flavor, converters=[...])``, no flag), which the flavour file
    does (:func:`torchtitan_flavour_file`)."""
    if facts.dtype == Dtype.FP8 or torchtitan_llama_differences(facts):
        return None
    fields, unknown = torchtitan_flavour(facts)
    if unknown:
        return None
    values = dict(f.split("=", 1) for f in fields)
    for name, flavour in TORCHTITAN_REGISTERED.items():
        want = {**flavour, **TORCHTITAN_LLAMA3_COMMON}
        if all(float(values[k]) == float(v) for k, v in want.items()):
            return name
    return None


def torchtitan_module_name(path: str) -> str:
    """The Python module of the flavour-registration file written beside the export ``path``."""
    import re
    from pathlib import Path

    name = re.sub(r"\W", "_", Path(path).name) + "_flavour"
    return name if name[0].isalpha() or name[0] == "_" else f"_{name}"


def torchtitan_flavour_file(facts: ModelFacts, module: str) -> str:
    """The flavour-registration file of a model torchtitan has not registered: torchtitan 0.3.0's
    Llama 3 built with the traced shape (the fields :func:`torchtitan_flavour` names; a field the
    shape did not tell keeps torchtitan's default), registered in ``llama3_configs`` as
    ``phaze:MODULE``, and the run :data:`TORCHTITAN_PLAN_CONFIG` (``llama3_8b``'s with that model),
    which ``--module=MODULE --config=phaze_plan`` loads."""
    values = dict(f.split("=", 1) for f in torchtitan_flavour(facts)[0])
    dim, heads = int(values.get("dim", 256)), int(values.get("n_heads", 16))
    vocab = int(values.get("vocab_size", 2000))
    layer_kw = [f"n_layers={int(values['n_layers'])}", f"dim={dim}", f"n_heads={heads}"]
    for name in ("n_kv_heads", "hidden_dim"):
        if name in values:
            layer_kw.append(f"{name}={int(values[name])}")
    rope = [f"dim={dim // heads}"]
    if "rope.max_seq_len" in values or facts.seq_len:
        longest = max(int(values.get("rope.max_seq_len", 0)), facts.seq_len or 0)
        rope.append(f"max_seq_len={longest}")
    if "rope.theta" in values:
        rope.append(f"theta={float(values['rope.theta'])!r}")
    eps = f", eps={float(values['norm_eps'])!r}" if "norm_eps" in values else ""
    converters, converter_import, fp8_words = "", "", ""
    if facts.dtype == Dtype.FP8:
        # torchao's Float8Linear as priced (--fp8-recipe rowwise): every linear but the LM head
        # (phaze's FP8 linears; torchtitan's llama3_405b filters it alike), whose sizes are
        # multiples of 16 (the converter's own filter, torchtitan 0.3.0
        # components/quantization/float8.py, utils.module_filter_fn)
        compiled = facts.kernels == Runtime.INDUCTOR
        converters = (
            f", converters=[Float8LinearConverter.Config(recipe_name={facts.fp8_recipe!r}, "
            f'filter_fqns=["lm_head"], model_compile_enabled={compiled})]'
        )
        converter_import = "from torchtitan.components.quantization import Float8LinearConverter\n"
        fp8_words = f" Its linears run torchao's float8 ({facts.fp8_recipe} scaling), as the plan was priced."
    return f'''"""torchtitan 0.3.0 model flavour of a plan, written by phazec --export torchtitan.

torchtitan imports it through the export's --module={module} --config={TORCHTITAN_PLAN_CONFIG}: run
torchtitan from this file's directory, or put the directory on PYTHONPATH. The model is torchtitan's
Llama 3 (torchtitan/models/llama3) with the traced shape; the run's other settings are
{TORCHTITAN_BASE_CONFIG}'s, which the export's arguments override.{fp8_words}
"""

{converter_import}from torchtitan.models import llama3
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.models.llama3.config_registry import {TORCHTITAN_BASE_CONFIG}

FLAVOUR = "phaze:{module}"


def _flavour(attn_backend, tp_gemm_backend="default"):
    return llama3.Llama3Model.Config(
        dim={dim},
        vocab_size={vocab},
        tok_embeddings=Embedding.Config(num_embeddings={vocab}, embedding_dim={dim}, param_init=llama3._EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape={dim}{eps}, param_init=llama3._NORM_INIT),
        lm_head=Linear.Config(in_features={dim}, out_features={vocab}, param_init=llama3._output_linear_init({dim})),
        layers=llama3._build_llama3_layers(
            fuse_qkv=True,
            {", ".join(layer_kw)},
            rope=ComplexRoPE.Config({", ".join(rope)}),
            attn_backend=attn_backend,
            tp_gemm_backend=tp_gemm_backend,
        ),
    )


llama3.llama3_configs[FLAVOUR] = _flavour


def {TORCHTITAN_PLAN_CONFIG}():
    config = {TORCHTITAN_BASE_CONFIG}()
    config.model_spec = llama3.model_registry(FLAVOUR{converters})
    config.loss.loss_fn.global_vocab_size = decoder_vocab_size(config.model_spec)
    return config
'''


def torchtitan_args(plan: dict[str, Any], facts: ModelFacts, module: str = "phaze_flavour") -> list[str]:
    """torchtitan 0.3.0 (``torchtitan.train``) arguments of the plan, one per list item, starting
    with ``--module`` and ``--config``: the registered run whose model is the traced one
    (:func:`torchtitan_registered`), else ``module`` (the flavour-registration file
    :func:`torchtitan_flavour_file` written beside the arguments) and its ``phaze_plan``.

    The activation-checkpoint subcommand is the last item: tyro reads what follows it as its
    options, so a user's own flags go before the file's."""
    target = "torchtitan"
    s = settings(plan, facts, target)
    _torchtitan_can_run(s.zero, facts.optimizer)
    if s.rank_order == RankOrder.TP_PP_DP and s.dp > 1 and s.pp > 1:
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
    if s.expert_tensor_parallel != s.tp:
        # torchtitan (b5bcd76c, config/configs.py: ParallelismConfig has expert_parallel_degree
        # and no expert tensor-parallel width) has no such field to write.
        raise PhazeError(
            f"--export torchtitan: the plan splits each expert over {s.expert_tensor_parallel} devices (expert "
            f"tensor parallel) at TP {s.tp}; torchtitan has no expert tensor-parallel setting: compile without "
            "--expert-tensor-parallel"
        )
    if s.tp_overlap and facts.kernels != Runtime.INDUCTOR:
        raise PhazeError(_TORCHTITAN_ASYNC_TP)
    replicate, shard = (1, s.dp) if s.zero == 3 else (s.dp, 1)
    if _hsdp(s, facts):
        # HSDP: torchtitan's 2-D mesh (parallel_dims.py): FSDP over dp_shard x cp ranks, the
        # replicas over dp_replicate; phaze's shard group counts the CP ranks in it.
        if facts.dp_shard % s.cp:
            raise PhazeError(
                f"--export torchtitan: the plan shards over {facts.dp_shard} ranks of DP x CP, which torchtitan "
                f"cannot (its FSDP mesh is data_parallel_shard_degree x CP {s.cp}): use a multiple of {s.cp}"
            )
        shard = facts.dp_shard // s.cp
        replicate = s.dp // shard
    p = "--parallelism."
    registered = torchtitan_registered(facts)
    args = [
        "--module=llama3" if registered else f"--module={module}",
        f"--config={registered or TORCHTITAN_PLAN_CONFIG}",
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
    if facts.kernels == Runtime.INDUCTOR:  # priced as torch.compile's kernels: the model compiled
        args.append("--compile.enable")
    if s.tp_overlap:  # priced as torch's micro-pipelined TP runs (a plan priced with --kernels inductor)
        args.append("--compile.enable_async_tensor_parallel")
    args.append(f"--training.global_batch_size={s.global_batch}")
    if facts.seq_len:
        args.append(f"--training.seq_len={facts.seq_len}")
    kind = precision(facts)
    if kind == "fp16":
        raise PhazeError(_TORCHTITAN_FP16)
    if facts.dtype == Dtype.FP8 and (why := torchtitan_fp8_refusal(facts.fp8_recipe, facts.fp8_params)):
        raise PhazeError(why)
    if facts.reduce_dtype != "fp32" and s.dp > 1:
        raise PhazeError(_TORCHTITAN_REDUCE)
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


def render(target: str, plan: dict[str, Any], facts: ModelFacts, module: str = "phaze_flavour") -> str:
    """The text of one export file: one argument per line (``module``: torchtitan's flavour
    module, :func:`torchtitan_args`)."""
    if target == "megatron":
        args = megatron_args(plan, facts)
    elif target == "torchtitan":
        args = torchtitan_args(plan, facts, module)
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
_TORCHTITAN_REDUCE = (
    "--export torchtitan: torchtitan 0.3.0 reduces FSDP's gradients in float32 only (training.mixed_precision_reduce "
    "takes just float32); price the plan with --reduce-dtype fp32"
)
#: Megatron-LM's ``--fp8-recipe`` (d98e8a64, ``megatron/training/arguments.py``: delayed,
#: tensorwise, mxfp8, blockwise) of each TE recipe phaze prices: ``tensorwise`` is TE's
#: ``Float8CurrentScaling`` (``megatron/core/fp8_utils.py``).
MEGATRON_FP8_RECIPES = {"delayed": "delayed", "current": "tensorwise"}
_MEGATRON_TORCHAO = (
    "--export megatron: the plan's FP8 linears are torchao's ({recipe} scaling, torchtitan's float8), which "
    "Megatron-LM does not run (its FP8 is Transformer Engine's): compile with --fp8-recipe delayed or current"
)
#: torchtitan 0.3.0's ``Float8LinearConverter.Config.recipe_name`` choices
#: (``torchtitan/components/quantization/float8.py``) that phaze prices.
TORCHTITAN_FP8_RECIPES = ("rowwise",)


def torchtitan_fp8_refusal(recipe: str, fp8_params: bool = False) -> str | None:
    """Why torchtitan 0.3.0 cannot launch an FP8 plan priced with ``recipe`` (phazec's
    ``--fp8-recipe``), in one line; None when it can."""
    if recipe in ("delayed", "current"):
        return (
            f"--export torchtitan: the plan's FP8 linears are Transformer Engine's ({recipe} scaling), which "
            "torchtitan does not run (its float8 converter is torchao's Float8Linear): compile with "
            "--fp8-recipe rowwise, or launch it with --export megatron"
        )
    if recipe not in TORCHTITAN_FP8_RECIPES:
        return (
            f"--export torchtitan: torchtitan 0.3.0's float8 converter takes recipe_name rowwise or "
            f"rowwise_with_gw_hp, not torchao's {recipe}: compile with --fp8-recipe rowwise"
        )
    if fp8_params:
        return (
            "--export torchtitan: torchtitan 0.3.0's float8 converter keeps bf16 weights (no FP8 all-gather or "
            "primary weights in its rowwise recipe): compile without --fp8-params"
        )
    return None


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


def _torchtitan_can_run(zero: int, optimizer: Optimizer) -> None:
    """torchtitan's refusal of a ZeRO stage or an optimizer it has not (known from the options,
    before any work, when they fix them)."""
    if zero in (1, 2):
        raise PhazeError(
            f"--export torchtitan: ZeRO-{zero} shards the optimizer state{' and gradients' if zero == 2 else ''} "
            "but not the parameters; torchtitan shards all three (FSDP, ZeRO-3) or none: compile with --zero 0 or 3"
        )
    if optimizer == Optimizer.ADAM_FOREACH:
        raise PhazeError(
            "--export torchtitan: --optimizer adam-foreach: the job it writes leaves torchtitan's optimizer at its "
            "defaults, which phaze prices as --optimizer adam: compile with --optimizer adam"
        )
    if optimizer != Optimizer.ADAM:
        raise PhazeError(f"--export torchtitan: torchtitan 0.3.0 has no {optimizer} optimizer (Adam, AdamW, DistMuon)")


def export_outputs(args) -> list[tuple[str, str]]:
    """``(flag, path)`` of each of phazec's ``--export TARGET FILE`` (its ``refuse_clashes`` checks
    them with its other outputs), after checking each target and file name, before any work."""
    requests = getattr(args, "export", None) or []
    from phaze.options import Stage

    if requests and (args.hw is None or args.emit != Stage.PLAN):
        raise PhazeError(
            "--export needs a plan for one accelerator (--hw CHIP, --emit plan): a searched chip cannot be launched"
        )
    from phaze.options import Options
    from phaze.tools.flags import parsed_flag

    # the flags that decide a refusal, as the run takes them (None: not given)
    dtype, asked_recipe = parsed_flag(args, Options, "dtype"), parsed_flag(args, Options, "fp8_recipe")
    outputs = []
    for target, path in requests:
        if target not in TARGETS:
            raise PhazeError(f"--export {target}: unknown target (choose from {', '.join(TARGETS)})")
        if path in ("", "-"):
            raise PhazeError(f"--export {target} needs a file name (not stdout)")
        if target == "torchtitan":
            from phaze.options import context_parallel_degree, zero_stage

            # the options given (Options' defaults for the others), typed as the run takes them
            given = Options(
                **{
                    k: v
                    for k in ("zero", "context_parallel", "tp_overlap", "kernels")
                    if (v := getattr(args, k, None)) is not None
                }
            )
            zero = zero_stage(given)  # None: auto
            _torchtitan_can_run(zero or 0, parsed_flag(args, Options, "optimizer") or Optimizer.ADAM)
            if dtype in (Dtype.FLOAT16, Dtype.AMP_FLOAT16):  # fp16 asked by name
                raise PhazeError(_TORCHTITAN_FP16)
            if dtype is Dtype.FP8:
                from phaze_ir.frontend.float8_linear import resolve_recipe

                recipe = resolve_recipe(asked_recipe or Fp8RecipeSetting.AUTO, torchtitan=True).value
                if why := torchtitan_fp8_refusal(recipe, bool(getattr(args, "fp8_params", False))):
                    raise PhazeError(why)
            if context_parallel_degree(given) > 1 and zero not in (3, None):
                raise PhazeError(_TORCHTITAN_CP_ZERO.format(zero=zero))
            if given.tp_overlap is Tristate.ON and given.kernels is not Runtime.INDUCTOR:
                raise PhazeError(_TORCHTITAN_ASYNC_TP)
        if target == "megatron" and dtype is Dtype.FP8:
            if asked_recipe not in (None, Fp8RecipeSetting.AUTO, *MEGATRON_FP8_RECIPES):
                raise PhazeError(_MEGATRON_TORCHAO.format(recipe=asked_recipe))
        if dtype is Dtype.FP8 and {t for t, _ in requests} >= {"megatron", "torchtitan"}:
            raise PhazeError(
                "--export megatron and torchtitan with --dtype fp8: no FP8 recipe runs on both (Megatron-LM's is "
                "Transformer Engine's, torchtitan's torchao's): export one"
            )
        selective = getattr(args, "selective_recompute", None) or "attention"
        if parsed_flag(args, Options, "recompute") is Recompute.SELECTIVE and (
            why := selective_refusal(target, selective)
        ):
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
    context_parallel: int | Auto = 1,
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
    if zero == Zero.AUTO:
        allowed = set.intersection(*(set(LAUNCHABLE_ZERO[t]) for t in targets))
        if "torchtitan" in targets and context_parallel != 1:  # a degree past 1, or auto
            allowed &= {"3"}
        if allowed != set(LAUNCHABLE_ZERO["megatron"]):
            zeros = sorted(allowed)
    policies = list(UNIFORM_RECOMPUTE) if recompute == Recompute.AUTO else [recompute]
    if any(selective_refusal(t, selective) for t in targets) and recompute == Recompute.AUTO:
        policies.remove(RecomputePolicy.SELECTIVE)
    choices = [
        {**({"zero": z} if z != zero else {}), **({"recompute": r} if r != recompute else {})}
        for z in zeros
        for r in policies
    ]
    return choices if choices != [{}] else [{}]


@dataclass(frozen=True)
class Launchable:
    """What every ``--export`` target asked for launches, as the ``--hw`` sweep narrows its plan
    to it (``phaze.search.sweep.compile_launchable``): the targets in the order asked, the
    narrowings of :func:`launchable_choices` (each a search of the sweep's settings) and the
    options a placement's refusal depends on (``--selective-recompute``, ``--optimizer``)."""

    targets: tuple[str, ...]
    choices: tuple[dict[str, str], ...]
    selective: str
    optimizer: Optimizer

    def refusal(self, zero: int, cp: int, policies: Sequence[str]) -> str | None:
        """The first target's one-line refusal of a placement for its ZeRO stage, context
        parallelism or stage recompute policies alone (None: none refuses it for those; the
        compiled plan may still be refused for another reason, :func:`refusals`): the same
        checks, in the same words, as :func:`render` makes of the compiled plan."""
        stages = {"stages": [{"recompute": str(p).lower()} for p in policies]}
        for target in self.targets:
            try:
                policy = _one_recompute(stages, target)
                if target == "torchtitan":
                    _torchtitan_can_run(zero, self.optimizer)
                    if cp > 1 and zero != 3:
                        raise PhazeError(_TORCHTITAN_CP_ZERO.format(zero=zero))
                    _torchtitan_checkpoint(policy, self.selective)
                elif policy == RecomputePolicy.SELECTIVE and (why := selective_refusal(target, self.selective)):
                    raise PhazeError(why)
            except PhazeError as e:
                return str(e)
        return None


def launchable(exports: Sequence[Sequence[str]] | None, opts) -> Launchable | None:
    """The :class:`Launchable` of phazec's ``--export`` requests under the driver options
    ``opts`` (None: the search can choose no plan a target refuses for its placement, so
    nothing is narrowed)."""
    choices = launchable_choices(exports, opts.zero, opts.recompute, opts.selective_recompute, opts.context_parallel)
    if choices == [{}]:
        return None
    targets = tuple(dict.fromkeys(target for target, _ in exports or ()))
    return Launchable(targets, tuple(choices), opts.selective_recompute, opts.optimizer)


def model_facts(module, opts) -> ModelFacts:
    """The :class:`ModelFacts` of a compiled module and phazec's driver options."""
    from phaze_ir import keys
    from phaze_ir.attributes import LayerInfoAttr

    layers = keys.records_of(module, keys.LAYERS, LayerInfoAttr)
    seq_len = keys.sample_seq_len(module)
    shape = dict(keys.dict_of(module, keys.MODEL_SHAPE))
    if "num_attention_heads" in shape:  # a transformer: its attention as traced (ModelFacts.attention)
        shape[TRACED_ATTENTION_KEY] = traced_attention(module)
    return facts_of([str(layer.as_dict()["kind"]) for layer in layers], seq_len or None, opts, shape)


def traced_attention(module) -> str:
    """The fused attention aten op the model was traced with (the first op's ``phaze.fused``
    naming one), or ``""`` when its attention was traced as separate ops (eager attention)."""
    from passes.algorithms.kernels import TRACED_ATTENTION
    from phaze_ir import keys

    for op in module.walk():
        fused = keys.string_of(op, keys.FUSED, "")
        if fused.startswith(tuple(TRACED_ATTENTION)):
            return fused
    return ""


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
        fp8_recipe=opts.fp8.value if hasattr(opts, "fp8") else "delayed",
        reduce_dtype=str(getattr(opts, "reduce_dtype", "fp32")),
        dp_shard=int(getattr(opts, "dp_shard", 0) or 0),
        selective_recompute=opts.selective_recompute,
        kernels=opts.kernels,
        sdpa_order=opts.sdpa_order,
        shape=dict(shape or {}),
        bf16=chip_has_bf16((plan or {}).get("accelerator")),
        compute_capability=_capability((plan or {}).get("accelerator")),
    )


def _hsdp(s: Settings, facts: ModelFacts) -> bool:
    """Whether the plan is HSDP: ZeRO 2/3 over a shard group smaller than DP x CP, which it divides
    (the DP prices HSDP only then: ``hsdp_divides`` in rust/phaze-dp/src/search.rs)."""
    n = facts.dp_shard
    return s.zero >= 2 and 0 < n < s.dp * s.cp and (s.dp * s.cp) % n == 0


def _capability(accelerator: dict[str, Any] | None) -> float | None:
    """The CUDA compute capability of the plan's chip (``plan["accelerator"]``: its calibration's,
    as the hardware file has it), None for a chip without one."""
    accelerator = accelerator or {}
    capability = (accelerator.get("calibration") or {}).get("compute_capability", accelerator.get("compute_capability"))
    return None if capability is None else float(capability)


#: What each ``--kernels`` runtime is, in the words of a warning (passes/algorithms/kernels.py).
KERNELS_WORDS = {
    "ops": "every op its own kernel",
    "eager": "PyTorch eager",
    "inductor": "torch.compile's",
    "megatron": "Megatron-LM's with Transformer Engine",
}


def runtime_differences(target: str, plan: dict[str, Any], facts: ModelFacts) -> list[str]:
    """Where ``target``'s launch runs another runtime than the one the plan was priced as
    (kernels, precision, attention, the model), one line each; empty when it runs the priced one.
    Only for a plan the target launches (:func:`render` does not refuse it)."""
    out = []
    priced = f"--kernels {facts.kernels} ({KERNELS_WORDS.get(facts.kernels, facts.kernels)} kernels)"
    if target == "megatron":
        if facts.kernels != Runtime.MEGATRON:
            out.append(
                f"--export megatron: the plan was priced with {priced}; Megatron-LM runs Transformer Engine's "
                "fused kernels: price it with --kernels megatron"
            )
        backend = megatron_attention_backend(facts)
        if backend is not None and backend[0] not in ("unfused",) and MEGATRON_ATTENTION.get(str(backend[1])) is None:
            out.append(
                f"--export megatron: the attention was priced as {backend[1] or 'separate ops (no fused kernel)'}; "
                f"Megatron-LM has no such backend and runs {backend[0]} (--attention-backend={backend[0]})"
            )
        if precision(facts) is None:
            out.append(
                "--export megatron: the plan was priced in the model's own dtype (--dtype model), which the "
                "launch does not set: Megatron-LM runs fp32 unless told --bf16 or --fp16"
            )
        return out
    if facts.kernels not in (Runtime.EAGER, Runtime.INDUCTOR):
        out.append(
            f"--export torchtitan: the plan was priced with {priced}; torchtitan runs PyTorch eager, or "
            "torch.compile's kernels: price it with --kernels eager or inductor"
        )
    if facts.attention is not None:
        kernel = facts.attention.split()[0] if facts.attention else "separate matmul and softmax ops"
        out.append(
            f"--export torchtitan: the attention was priced as the model runs it ({kernel}); torchtitan 0.3.0's "
            "Llama 3 runs FlexAttention (attn_backend flex, block-causal), which phaze does not price"
        )
    if differences := torchtitan_llama_differences(facts):
        out.append(
            "--export torchtitan: torchtitan runs the model as its Llama 3 (SwiGLU, RMSNorm, RoPE, untied, no "
            f"biases), not as the model has it ({', '.join(differences)})"
        )
    return out


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


def export_warnings(requests: Sequence[Sequence[str]] | None, plan: dict[str, Any], facts: ModelFacts) -> list[str]:
    """:func:`runtime_differences` of every ``--export`` target that launches ``plan``, added to
    the plan: its ``warnings`` (kind ``export-runtime``, with the target) and its summary's lines
    (``warning: ...``), once each (a second call adds none)."""
    if not plan.get("feasible"):
        return []
    said = {w.get("message") for w in plan.get("warnings", []) if w.get("kind") == "export-runtime"}
    new = []
    for target, _ in requests or []:
        try:
            render(target, plan, facts)
        except PhazeError:
            continue  # refused: its refusal says why
        for line in runtime_differences(target, plan, facts):
            if line not in said:
                said.add(line)
                new.append(line)
                plan.setdefault("warnings", []).append({"kind": "export-runtime", "target": target, "message": line})
                if plan.get("summary"):
                    plan["summary"].setdefault("warnings", []).append(line)
                    plan["summary"]["lines"].append(f"warning: {line}")
    return new


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
        if target == "megatron":
            files.append((path, text, f"{target} arguments"))
            unknown = megatron_model_args(facts)[1]
            if unknown:
                log(f"--export megatron: the model does not tell {', '.join(unknown)}: add them to {path}'s")
            continue
        module = torchtitan_module_name(path)
        text = render(target, plan, facts, module)
        files.append((path, text, f"{target} arguments"))
        fields, unknown = torchtitan_flavour(facts)
        registered = torchtitan_registered(facts)
        if registered:
            log(f"--export torchtitan: the model is torchtitan's registered {registered} ({', '.join(fields)})")
            continue
        from pathlib import Path

        flavour = str(Path(path).with_name(f"{module}.py"))
        files.append((flavour, torchtitan_flavour_file(facts, module), "torchtitan model flavour"))
        missing = f" (the model does not tell {', '.join(unknown)}: torchtitan's defaults)" if unknown else ""
        vocab = facts.shape.get("vocab_size")
        tokenizer = (
            f"; its tokenizer is yours (--hf_assets_path: {TORCHTITAN_BASE_CONFIG}'s is Llama 3.1's, "
            f"{TORCHTITAN_LLAMA3_COMMON['vocab_size']} tokens, not {vocab})"
            if vocab != TORCHTITAN_LLAMA3_COMMON["vocab_size"]
            else ""
        )
        log(
            f"--export torchtitan: its model flavour ({', '.join(fields)}){missing} is registered by {flavour}, "
            f"which --module={module} imports: run torchtitan from its directory or put it on PYTHONPATH{tokenizer}"
        )
    return files, refused
