"""Which ops of a training step run together as one GPU kernel, for a named runtime.

Pure Python (no xDSL): ``passes/form_kernels.py`` reads the IR into :class:`KOp` records and
writes back one :class:`Kernel` per op.  A kernel's time is priced from the bytes that cross its
boundary and the work inside it (``passes/algorithms/latency.py``): an op of a kernel reads from
HBM only what no earlier op of its kernel made or read, writes to HBM only what is used outside
its kernel, and only the op that launches the kernel pays the launch cost.

Runtimes (``RUNTIMES``), each from the source of the version named (docs/design.md §5.11):

``ops``
    Every op its own kernel, even what aten runs as one (fused attention priced as its
    matmul/softmax expansion with every intermediate in HBM): phaze's model before kernels were
    formed, kept to compare.

``eager``
    PyTorch eager (torch 2.15): one kernel per aten op.  What aten runs as one kernel but phaze
    expands into several ops (``phaze.fused``: FlashAttention or memory-efficient attention
    forward and backward, dropout with its mask) is one kernel whose s x s scores never reach
    HBM.  The fused AdamW step (``torch.optim.AdamW(fused=True)``: ``_fused_adamw_``) is one
    multi-tensor kernel per chunk list: ``multi_tensor_apply_for_fused_optimizer<4>`` in
    ``aten/src/ATen/native/cuda/MultiTensorApply.cuh`` deals 65,536-element chunks of at most 36
    tensors and 320 blocks to one launch (``depth_to_max_tensors``, ``depth_to_max_blocks``,
    ``kChunkSize``).  Each layer's parameters are dealt on their own (a launch's last chunk list
    closes where the layer ends): a step is priced as the sum of its layers (the placement DP
    and the ``--hw`` sweep price per layer, a block's cost taken from the model cut to 3 and 4
    blocks), which a packing across layers would not be; torch deals a rank's whole list, so
    this counts at most one launch per layer more (a few microseconds per layer a step).

``inductor``
    ``torch.compile`` (Inductor, torch 2.15): GEMMs, collectives, fused attention and the
    embedding's backward scatter stay library kernels; pointwise and reduction ops fuse, in
    program order, with a producer's kernel (vertical) or with a kernel that reads the same
    input (horizontal) when their iteration sizes agree, as ``SIMDScheduling.can_fuse``
    (``torch/_inductor/codegen/simd.py``) allows: two pointwise ops of equal numel, two
    reductions of equal ``(numel, rnumel)``, a pointwise op of ``numel * rnumel`` elements (a
    prologue) or of ``numel`` elements (an epilogue) with a reduction; at most
    ``max_fusion_size = 64`` ops (``torch/_inductor/config.py``); never a fusion that would make
    a cycle (``Scheduler.will_fusion_create_cycle``): here a kernel only takes an op whose other
    inputs were all made before the kernel's first op.  Views are free (index arithmetic).  The
    optimizer step is not compiled (the model is): it runs as in ``eager``.

``megatron``
    Megatron-LM with Transformer Engine (megatron-core 0.16, ``megatron/core/fusions/``): its
    fused kernels join chains of pointwise ops (``fused_bias_gelu``, ``fused_bias_swiglu``,
    ``fused_bias_dropout``: bias, activation, dropout and residual add as one kernel) and a
    softmax with the pointwise ops before it (``fused_softmax``: scale, mask, softmax); a norm
    traced as one aten op (``native_layer_norm``) is one kernel, as ``fused_layer_norm`` is, but a
    norm or rotary embedding traced as its ops (transformers' RMSNorm: a ``mean`` between pointwise
    chains, three kernels) is priced as the kernels those ops form, where Transformer Engine runs
    one (docs/validation.md says what that costs the Llama rows); attention and the optimizer as in
    ``eager`` (flash attention, ``FusedAdam``, a multi-tensor kernel like torch's).  Reductions
    never fuse with each other and there is no horizontal fusion.

Expert GEMMs (one ``aten._grouped_mm``, which the importer expands into batched matmuls over the
experts, docs/design.md §2) under ``eager`` and ``inductor`` are launched as torch 2.15 runs them
(``_grouped_mm_cuda`` in ``aten/src/ATen/native/cuda/GroupedBlas.cpp``): when its operands and
result are bf16 on a chip of compute capability 9.x or 10.x (``_scaled_mm_allowed_device(sm90_only,
sm100_only)``) one CUTLASS grouped kernel (``bf16bf16_grouped_mm``, no host sync); otherwise
``_grouped_mm_fallback`` (``aten/src/ATen/native/GroupedMMUtils.h``): the offsets copied to the
host (``offs.cpu()``, a device-to-host synchronization) and one ``mm_out`` per expert, E kernels.
Under ``torch.compile`` the same holds: transformers 5.24 calls ``F.grouped_mm`` for bf16 weights
and its own ``transformers::grouped_mm_fallback`` custom op (a loop of ``torch.mm`` after one
``offs.tolist()``) otherwise (``integrations/moe.py``, ``_can_use_grouped_mm``).  A chip with no
compute capability (not a CUDA GPU) runs a grouped GEMM as one kernel.  ``megatron`` runs
Transformer Engine's grouped GEMM, one kernel; ``ops`` one kernel per op as ever.

Which fused attention kernel a runtime runs (:func:`attention_backend`; its rate by shape is
``passes/algorithms/attention.py``'s table of the chip):

- ``eager`` and ``inductor`` run ``F.scaled_dot_product_attention``, which torch 2.15 dispatches
  by ``select_sdp_backend`` (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``): its
  priority order is flash, memory-efficient, math, unless ``check_prefer_cudnn_attention()``
  (cuDNN newer than 9.15.0 on compute capability 9.x or 10.x, as torch's CUDA 13 wheels ship;
  not when ``TORCH_CUDNN_SDPA_DEPRIORITIZED`` is set) puts cuDNN first. cuDNN takes an additive
  mask (``check_attn_mask_shape``) and grouped-query K/V (``check_batch_size_and_num_heads_dense
  <supports_gqa=true>``), so on an H100 a traced fused attention runs as cuDNN's, but for a
  dropout probability that is not a multiple of 1/16 (``check_cudnn_dropout``: GPT-2's 0.1,
  the `` dropout P`` of its ``phaze.fused``), which runs the kernel traced. Below 9.x, and
  there: the kernel traced (flash: FlashAttention-2, torch's copy; memory-efficient: xFormers'
  CUTLASS kernel).
  Which torch ran a step decides this order: ``sdpa_order`` ``cudnn-first`` (the default) is the
  one above; ``flash-first`` is torch's order before cuDNN was preferred (``priority_order``:
  flash, memory-efficient, math, then cuDNN where torch has it), or with
  ``TORCH_CUDNN_SDPA_DEPRIORITIZED=1``: the kernel traced runs (FlashAttention-2 for a traced
  flash attention), as in IBM's fms-fsdp runs of 2024 (its README: "SDPA implementation of Flash
  attention v2").
- ``megatron`` runs Transformer Engine's ``DotProductAttention`` (TE 2.20, d0067d0,
  ``transformer_engine/pytorch/attention/dot_product_attention/utils.py``,
  ``get_attention_backend``): when both FlashAttention (2, 3 or 4) and FusedAttention (cuDNN)
  can run, compute capability 9.0 and up disables FlashAttention "to give FusedAttention
  preference on Hopper+ for performance reasons", FA3 installed or not; below, FlashAttention
  (FlashAttention-2, which NVIDIA's PyTorch containers ship) runs. ``sdpa_order``
  ``flash-first`` is TE run with ``NVTE_FUSED_ATTN=0``, which leaves FusedAttention out
  (``self.use_fused_attention = int(os.getenv("NVTE_FUSED_ATTN", "1"))``, TE 1.4's
  ``transformer_engine/pytorch/attention.py``; TE 2.20's ``get_attention_backend`` alike), so
  FlashAttention-2 runs on every chip, context parallelism's ring included (TE 1.4's
  ``AttnFuncWithCP`` with ``use_fused_attention=False``: ``_flash_attn_forward`` and
  ``_flash_attn_backward`` at each step). NeMo's launcher set it for every training job from
  2024-02-13 to 2024-07-15 (NVIDIA/NeMo-Framework-Launcher ``launcher_scripts/conf/config.yaml``
  ``env_vars``: ``NVTE_FUSED_ATTN: 0 # Disable cudnn FA until we've tested it more``, commits
  562dcb4 to a6490ff; tags 24.01 to 24.07, whose default containers run to NeMo 24.05).
- ``ops`` has no fused attention (the matmul/softmax expansion, scores in HBM).
- A chip with no compute capability (not a CUDA GPU) has none of these kernels: its attention is
  priced as its GEMMs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

RUNTIMES = ("ops", "eager", "inductor", "megatron")
#: Runtimes that launch expert GEMMs as torch's ``_grouped_mm`` does (module docstring).
TORCH_GROUPED_MM = ("eager", "inductor")
#: Major compute capabilities whose bf16 grouped GEMM torch 2.15 runs as one CUTLASS kernel
#: (``_scaled_mm_allowed_device(/*sm90_only*/true, /*sm100_only*/true)`` in ``GroupedBlas.cpp``).
GROUPED_MM_ONE_KERNEL_MAJORS = (9, 10)

#: torch's multi-tensor apply for the fused Adam(W) step (MultiTensorApply.cuh, depth 4: params,
#: grads, exp_avg, exp_avg_sq): elements per chunk (one CUDA block each), tensors and blocks per launch.
ADAM_CHUNK_ELEMENTS = 65_536
ADAM_MAX_TENSORS = 36
ADAM_MAX_BLOCKS = 320
#: Inductor's largest fusion (``torch._inductor.config.max_fusion_size``).
MAX_FUSION_SIZE = 64

#: What an op is to kernel formation.
KINDS = ("view", "pointwise", "reduction", "library", "optimizer")


@dataclass(frozen=True)
class KOp:
    """One op: its ``kind`` (:data:`KINDS`; ``library``: a kernel of its own that nothing fuses
    into, e.g. a GEMM or a collective), ``phase``, operand and result value ids, ``numel`` (a
    pointwise op's result elements, a reduction's output elements), ``rnumel`` (a reduction's
    elements reduced into each output; 1 else), ``fused`` (the aten op it is part of when aten
    runs that op as one kernel, "" else), ``causal`` (part of a causal attention kernel: 1, or
    w >= 2 within a sliding window of w keys, ``phaze_ir.op_kinds.causal_mask``),
    for the optimizer ``param_elements`` (the elements it updates) and ``layer`` (the layer the
    update is part of, -1 when layers are not grouped), and ``softmax``."""

    kind: str
    phase: str
    operands: tuple[int, ...]
    results: tuple[int, ...]
    numel: int = 1
    rnumel: int = 1
    fused: str = ""
    causal: int = 0
    param_elements: int = 0
    layer: int = -1
    #: the multi-tensor kernels the optimizer's step runs over each chunk list (1: fused; torch's
    #: ``foreach`` Adam 8, ``phaze_ir.op_kinds.OPTIMIZER_FOREACH_KERNELS``)
    optimizer_kernels: int = 1
    #: a softmax (Megatron fuses the pointwise ops before a softmax only)
    softmax: bool = False
    #: an expert GEMM: the key of the ``aten._grouped_mm`` it is part of ("" else), the experts
    #: whose products it computes, whether its operands and result are all bf16, and whether
    #: its operands are FP8 and its result bf16 (``aten._scaled_grouped_mm``)
    grouped: str = ""
    experts: int = 0
    bf16: bool = False
    fp8: bool = False


@dataclass(frozen=True)
class Kernel:
    """An op's kernel: its ``id``, how many launches the op accounts for (``launch``: 1 on a
    kernel's first op, 0 on the others; a multi-tensor optimizer op may start several), the bytes
    of its reads and writes that stay on chip, and the mask of the causal attention it is part of
    (:attr:`KOp.causal`)."""

    id: int
    launch: int
    onchip_read: int
    onchip_written: int
    causal: int = 0


@dataclass
class StepValues:
    """The step's values as kernel formation needs them: ``nbytes[v]``, ``view_of[v]`` (the
    value a view aliases, None else) and ``outputs`` (values the step returns)."""

    nbytes: list[int]
    view_of: list[int | None]
    outputs: frozenset[int]

    def root(self, v: int) -> int:
        while (w := self.view_of[v]) is not None:
            v = w
        return v


#: The aten ops of torch's fused attention by the kernel they run when traced
#: (``aten_map.FUSED_ATTENTION``; the forward's name is a prefix of its backward's).
TRACED_ATTENTION = {
    "_scaled_dot_product_flash_attention": "flash2",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "window_attention": "flash2",  # (which FlashAttention, or cuDNN, runs it: attention_backend)
}
#: phaze's traced kernel for attention with a sliding window or sinks
#: (``phaze_ir/frontend/kernel_attention.py``), which no torch SDPA backend runs: FlashAttention
#: (FA3 on Hopper, whose sinks kernel transformers' GPT-OSS loads, ``vllm-flash-attn3``; FA2's
#: ``window_size`` else) under the torch runtimes, Transformer Engine's cuDNN fused attention
#: (``window_size``, ``softmax_type="learnable"``) under Megatron-LM on Hopper and later.
WINDOW_ATTENTION = "window_attention"
#: Compute capabilities (major) FlashAttention-3 runs on (flash-attention ``hopper/``: sm90 only).
FLASH3_MAJORS = (9,)
#: The attention backend orders a step may run under (module docstring): ``cudnn-first``, torch
#: 2.15's on the :data:`CUDNN_FIRST_MAJORS` and TE's on Hopper+; ``flash-first``, torch's order
#: before it (the kernel traced) and TE with ``NVTE_FUSED_ATTN=0`` (FlashAttention-2).
SDPA_ORDERS = ("cudnn-first", "flash-first")
#: Compute capabilities (major) on which torch 2.15 puts cuDNN attention first
#: (``check_prefer_cudnn_attention`` in ``sdp_utils.cpp``).
CUDNN_FIRST_MAJORS = (9, 10)


def attention_backend(
    runtime: str, compute_capability: float | None, traced: str, sdpa_order: str = SDPA_ORDERS[0]
) -> str | None:
    """The fused attention kernel ``runtime`` runs on a chip of ``compute_capability`` for an
    attention traced as the aten op ``traced`` (its node name, ``_scaled_dot_product_flash_attention_3``
    or its backward's), under the runtime's attention backend order ``sdpa_order``
    (:data:`SDPA_ORDERS`: torch's SDPA order, or TE's with or without ``NVTE_FUSED_ATTN=0``): one
    of :data:`passes.algorithms.attention.BACKENDS`, or None when there is no fused kernel to price
    by the kernels' tables (module docstring)."""
    if runtime == "ops" or compute_capability is None:
        return None
    if traced.startswith(WINDOW_ATTENTION):
        if runtime == "megatron":
            return "cudnn" if compute_capability >= 9.0 and sdpa_order == SDPA_ORDERS[0] else "flash2"
        return "flash3" if int(compute_capability) in FLASH3_MAJORS else "flash2"
    kernel = next((k for name, k in TRACED_ATTENTION.items() if traced.startswith(name)), None)
    if kernel is None:
        return None
    if runtime == "megatron":
        return "cudnn" if compute_capability >= 9.0 and sdpa_order == SDPA_ORDERS[0] else "flash2"
    cudnn_first = sdpa_order == SDPA_ORDERS[0] and int(compute_capability) in CUDNN_FIRST_MAJORS
    if cudnn_first and _cudnn_dropout(traced):
        return "cudnn"
    return kernel


def _cudnn_dropout(traced: str) -> bool:
    """Whether cuDNN takes the attention's dropout (none, or a multiple of 1/16:
    ``check_cudnn_dropout``); ``traced`` is its ``phaze.fused`` (`` dropout P`` when it has one)."""
    words = traced.split()
    if "dropout" not in words or words.index("dropout") + 1 >= len(words):
        return True
    p = float(words[words.index("dropout") + 1])
    return p * 16.0 == math.floor(p * 16.0)


def grouped_mm_one_kernel(bf16: bool, compute_capability: float | None) -> bool:
    """Whether torch runs a grouped GEMM as one kernel (else one per expert after a host sync):
    bf16 (``bf16``: also FP8 operands with a bf16 result, ``_scaled_grouped_mm``, which has only
    the grouped kernel) on a chip of compute capability 9.x or 10.x; always on a chip with none
    (not a CUDA GPU, e.g. an ideal chip: priced as one batched GEMM)."""
    if compute_capability is None:
        return True
    return bf16 and int(compute_capability) in GROUPED_MM_ONE_KERNEL_MAJORS


def form_kernels(
    ops: list[KOp], values: StepValues, runtime: str, compute_capability: float | None = None
) -> list[Kernel | None]:
    """One :class:`Kernel` per op (None for views), in ``runtime``'s kernels; expert GEMMs
    launched as torch launches them on a chip of ``compute_capability`` (module docstring)."""
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime {runtime!r}: expected one of {', '.join(RUNTIMES)}")
    if runtime == "ops":
        group = [i if o.kind != "view" else -1 for i, o in enumerate(ops)]
    elif runtime == "eager":
        group = _eager_groups(ops)
    else:
        group = _fused_groups(ops, values, horizontal=runtime == "inductor", reductions=runtime == "inductor")
    launches = _launches(ops, group, optimizer_chunks=runtime != "ops")
    if runtime in TORCH_GROUPED_MM:
        _grouped_launches(ops, launches, compute_capability)
    return _boundaries(ops, values, group, launches)


def _grouped_launches(ops: list[KOp], launches: list[int], compute_capability: float | None) -> None:
    """Expert GEMMs' launches as torch launches them: one grouped kernel for the whole
    ``aten._grouped_mm`` (its first part launches it; a split the experts do not divide evenly
    is two parts), or one kernel per expert."""
    seen: set[str] = set()
    for i, o in enumerate(ops):
        if not o.grouped:
            continue
        if grouped_mm_one_kernel(o.bf16 or o.fp8, compute_capability):
            launches[i] = 0 if o.grouped in seen else 1
        else:
            launches[i] = max(1, o.experts)
        seen.add(o.grouped)


def _eager_groups(ops: list[KOp]) -> list[int]:
    """Kernel of each op (-1: a view, no kernel): its own, or its ``fused`` aten op's."""
    first: dict[str, int] = {}
    group = []
    for i, o in enumerate(ops):
        if o.kind == "view":
            group.append(-1)
        elif o.fused:
            group.append(first.setdefault(o.fused, i))
        else:
            group.append(i)
    return group


@dataclass
class _Open:
    """A kernel being formed: its first op, its ops' count, its iteration group and the values
    its ops read (roots)."""

    start: int
    size: int
    numel: int
    rnumel: int
    reads: set[int]


def _fits(k: _Open, o: KOp, reductions: bool) -> tuple[int, int] | None:
    """The kernel's iteration group after taking ``o``, or None when the sizes do not fuse
    (``SIMDScheduling.can_fuse``; without ``reductions``, Megatron's fused kernels: pointwise
    chains, and a softmax-like reduction after them)."""
    if k.size >= MAX_FUSION_SIZE:
        return None
    o_red = o.kind == "reduction"
    k_red = k.rnumel > 1
    if not o_red and not k_red:
        return (k.numel, 1) if o.numel == k.numel else None
    if o_red and k_red:
        return (k.numel, k.rnumel) if reductions and (o.numel, o.rnumel) == (k.numel, k.rnumel) else None
    if o_red:  # a pointwise kernel as the reduction's prologue (Megatron: a softmax's only)
        prologue = reductions or o.softmax
        return (o.numel, o.rnumel) if prologue and k.numel == o.numel * o.rnumel else None
    if not reductions:  # Megatron: nothing fuses after a reduction
        return None
    return (k.numel, k.rnumel) if o.numel in (k.numel * k.rnumel, k.numel) else None


def _fused_groups(ops: list[KOp], values: StepValues, horizontal: bool, reductions: bool) -> list[int]:
    """Inductor's (``horizontal``, ``reductions``) or Megatron's fusion, greedily in program
    order (module docstring)."""
    group = _eager_groups(ops)
    producer: dict[int, int] = {}
    for i, o in enumerate(ops):
        for r in o.results:
            producer[r] = i
    kernels: dict[int, _Open] = {}
    readers: dict[int, list[int]] = {}  # root value -> open kernels that read it
    for i, o in enumerate(ops):
        if o.kind not in ("pointwise", "reduction") or o.fused:
            continue
        roots = [values.root(v) for v in o.operands]
        made = [group[producer[r]] for r in roots if r in producer and group[producer[r]] >= 0]
        candidates = [g for g in made if g in kernels]
        if horizontal:
            candidates += [g for r in roots for g in readers.get(r, []) if g in kernels and g not in candidates]
        chosen = None
        for g in candidates:
            k = kernels[g]
            if ops[g].phase != o.phase:
                continue
            # every input made inside the kernel or before it began (no cycle through another kernel)
            if any(r in producer and group[producer[r]] != g and producer[r] > k.start for r in roots):
                continue
            fit = _fits(k, o, reductions)
            if fit is not None:
                chosen = (g, fit)
                break
        if chosen is None:
            kernels[i] = _Open(i, 1, o.numel, o.rnumel, set(roots))
            for r in roots:
                readers.setdefault(r, []).append(i)
            continue
        g, (numel, rnumel) = chosen
        k = kernels[g]
        group[i] = g
        k.size, k.numel, k.rnumel = k.size + 1, numel, rnumel
        for r in roots:
            if r not in k.reads:
                k.reads.add(r)
                readers.setdefault(r, []).append(g)
    return group


def _launches(ops: list[KOp], group: list[int], optimizer_chunks: bool) -> list[int]:
    """Launches each op accounts for: 1 on a kernel's first op; the optimizer's multi-tensor
    kernels as ``MultiTensorApply.cuh`` deals the parameters' chunks to launches, layer by
    layer (module docstring)."""
    out = [0] * len(ops)
    seen: set[int] = set()
    tensors = blocks = 0
    last_update = -1  # the optimizer op that would close a partly filled launch
    for i, o in enumerate(ops):
        if o.kind == "optimizer" and optimizer_chunks:
            if blocks > 0 and ops[last_update].layer != o.layer:  # a new layer's list (docstring)
                out[last_update] += ops[last_update].optimizer_kernels
                tensors = blocks = 0
            last_update = i
            chunks = max(1, -(-o.param_elements // ADAM_CHUNK_ELEMENTS))
            tensors += 1
            for c in range(chunks):
                blocks += 1
                if blocks == ADAM_MAX_BLOCKS or (c == chunks - 1 and tensors == ADAM_MAX_TENSORS):
                    out[i] += o.optimizer_kernels
                    blocks = 0
                    tensors = 0 if c == chunks - 1 else 1
            continue
        if group[i] >= 0 and group[i] not in seen:
            seen.add(group[i])
            out[i] = 1
    if optimizer_chunks and blocks > 0:  # the last, partly filled launch
        out[last_update] += ops[last_update].optimizer_kernels
    return out


def _boundaries(ops: list[KOp], values: StepValues, group: list[int], launches: list[int]) -> list[Kernel | None]:
    """Each op's on-chip reads and writes in its kernel (module docstring)."""
    # the kernels that use each root value (an op reading a view of it uses it)
    users: dict[int, set[int]] = {}
    for i, o in enumerate(ops):
        g = group[i] if group[i] >= 0 else -1 - i  # a view's users are its readers: followed below
        if g < 0:
            continue
        for v in o.operands:
            users.setdefault(values.root(v), set()).add(g)
    producer_group: dict[int, int] = {}
    for i, o in enumerate(ops):
        if group[i] >= 0:
            for r in o.results:
                producer_group[r] = group[i]
    read_by: dict[int, set[int]] = {}  # kernel -> roots it has read from HBM
    out: list[Kernel | None] = []
    for i, o in enumerate(ops):
        g = group[i]
        if g < 0:
            out.append(None)
            continue
        seen = read_by.setdefault(g, set())
        onchip_read = 0
        for v in dict.fromkeys(o.operands):
            r = values.root(v)
            if producer_group.get(r) == g or r in seen:
                onchip_read += values.nbytes[v]
            else:
                seen.add(r)
        onchip_written = sum(
            values.nbytes[r] for r in o.results if r not in values.outputs and users.get(r, set()) <= {g} and r in users
        )
        out.append(Kernel(g, launches[i], onchip_read, onchip_written, o.causal))
    return out
