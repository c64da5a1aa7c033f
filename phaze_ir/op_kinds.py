"""Vocabularies that both the dialect and the pure algorithms need: op kinds, optimizer kinds, the
fields of the layer-memory record (plain Python, no xDSL: ``passes/algorithms`` may import it)."""

from enum import StrEnum


class RecomputePolicy(StrEnum):
    """What a stage's backward recomputes (``#phaze<recompute_policy ...>``, the DP's policies,
    ``--recompute``'s words besides ``auto``): the one declaration of these words."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


#: ``phaze.layout`` kinds that alias their first operand's storage (views: no data moves).
VIEW_KINDS = (
    "view",
    "reshape",
    "transpose",
    "permute",
    "expand",
    "squeeze",
    "unsqueeze",
    "slice",
    "select",
    "alias",
    "split",
    "unbind",
    "as_strided",
    "detach",
    "diagonal",
    # A convolution's operand unfolded into GEMM rows (im2col) and a GEMM result folded back into
    # an image (col2im): implicit GEMM never materializes them, so they cost nothing and alias
    # their operand (docs/design.md §2, §5.3).
    "im2col",
    "col2im",
)


OPTIMIZER_KINDS = {
    # kind -> (FLOPs per parameter, optimizer-state bytes per parameter in fp32)
    "adam": (12, 12),  # mixed precision: fp32 master weight + first and second moment
    "sgd": (2, 4),  # fp32 master weight (momentum-free SGD)
    # Adam with its whole state in bf16: a bf16 copy of the weight and the two moments, 2 bytes
    # each; Apex's DistributedFusedAdam with dtype=torch.bfloat16 (its StateBucket keeps
    # params_shard, exp_avg_shard and exp_avg_sq_shard in that dtype, store_params=True by
    # default; apex/contrib/optimizers/distributed_fused_adam.py), which NeMo's
    # MegatronDistributedFusedAdam runs for a config's ``optim.dtype: bf16``
    # (nemo/core/optim/distributed_adam.py); docs/design.md §6.2
    "adam-bf16": (12, 6),
    # Adam(W) as torch.optim runs it without ``fused=True``: its default ``foreach``
    # (``_default_to_fused_or_foreach``, torch/optim/optimizer.py), the same state as "adam", each
    # step of the update its own multi-tensor kernel (OPTIMIZER_FOREACH_* below); IBM's fms-fsdp
    # (``optim.AdamW(model.parameters(), lr, betas, weight_decay)``, main_training.py)
    "adam-foreach": (12, 12),
}

#: Kernels of ``adam-foreach``'s step and the bytes they move per parameter beyond the fused
#: step's (which reads the fp32 master weight, gradient and two moments once and writes the
#: weight and moments once: 16 bytes read, 12 written).  torch 2.15's ``_multi_tensor_adam``
#: (torch/optim/adam.py, ``capturable=False``, ``decoupled_weight_decay`` as AdamW) runs eight
#: ``_foreach_*`` kernels over the fp32 tensors: ``mul_`` (params by 1 - lr*wd: 4 read, 4
#: written), ``lerp_`` (exp_avg toward grad: 8, 4), ``mul_`` (exp_avg_sq by beta2: 4, 4),
#: ``addcmul_`` (exp_avg_sq += (1 - beta2) grad^2: 8, 4), ``sqrt`` (a new tensor: 4, 4),
#: ``div_`` and ``add_`` on it (4, 4 each), ``addcdiv_`` (params: 12, 4): 48 read and 32 written,
#: 32 and 20 more than the fused step's.
OPTIMIZER_FOREACH_KERNELS = {"adam-foreach": 8}
OPTIMIZER_EXTRA_BYTES = {"adam-foreach": (32, 20)}

#: The bytes per element of an optimizer's master weight that an fp32 parameter (autocast's
#: mixed precision) is itself, and so does not need again: fp32 for Adam and SGD; none for
#: ``adam-bf16``, whose bf16 copy of the weight Apex keeps whatever the parameter's dtype.
OPTIMIZER_FP32_MASTER_BYTES = {"adam": 4, "sgd": 4, "adam-bf16": 0, "adam-foreach": 4}

#: The fields of one layer's memory (``#phaze.layer_memory``, ``passes/algorithms/memory.py``'s
#: ``LayerMemory``), in the attribute's order.
LAYER_MEMORY_FIELDS = (
    "index",
    "param_bytes",
    "grad_bytes",
    "optimizer_bytes",
    "saved_none_bytes",
    "saved_selective_bytes",
    "saved_full_bytes",
    "workspace_bytes",
    "recompute_workspace_bytes",
    "expert_param_bytes",
    "expert_optimizer_bytes",
    "fp8_weight_bytes",
)


def causal_mask(fused: str) -> int:
    """The mask of the fused attention kernel an op is part of (its ``phaze.fused`` name), as
    ``#phaze.kernel``'s ``causal`` field holds it: 0 none (or not an attention), 1 causal, w >= 2
    causal within a sliding window of w keys (``... window W ... causal``: each query sees
    itself and the w - 1 keys before it; ``phaze_ir/frontend/kernel_attention.py``)."""
    if not fused.endswith(" causal"):
        return 0
    words = fused.split()
    at = words.index("window") + 1 if "window" in words else 0
    return int(words[at]) if at and at < len(words) and words[at].isdigit() and int(words[at]) >= 2 else 1


def causal_fraction(m, n, k, causal=1):
    """The share of a causal attention GEMM's s x s work that its kernel computes, s the longest
    of M, N, K (integers or numpy arrays that broadcast): ``(s + 1) / 2s`` under a causal mask
    (``causal`` 1: the lower triangle, diagonal included); ``(w·s - w(w - 1)/2) / s²`` within a
    sliding window of ``w = causal`` keys shorter than s (row i computes min(i + 1, w) scores:
    FlashAttention and cuDNN skip the tiles outside the band, so the kernel's work is the band's)."""
    import numpy as np

    s = np.maximum(np.maximum(m, n), k)
    whole = (s + 1) / (2.0 * s)
    w = np.asarray(causal)
    if not ((w >= 2) & (w < s)).any():
        return whole  # (exactly the causal share as before: plans without a window are unchanged)
    band = np.minimum(np.maximum(w, 1), s)
    return np.where((w >= 2) & (w < s), (band * s - band * (band - 1) / 2.0) / (1.0 * s * s), whole)
