"""Ops traced as a CUDA GPU dispatches them, not as the CPU would.

phaze traces on fake CPU tensors, so two of torch's dispatch decisions would be the CPU's:

**Scaled dot-product attention.**  ``F.scaled_dot_product_attention`` would dispatch as on a
CPU: torch's CPU selector (``aten/src/ATen/native/transformers/sdp_utils_cpp.cpp``) refuses its
flash kernel when there is dropout, and the math fallback then *materialises* the attention
(``q kᵀ``, ``_safe_softmax``, dropout, ``@ v``: every s² tensor written and saved for backward).
A GPU runs one fused kernel instead: :func:`as_on_cuda` calls the kernel torch's CUDA selector
picks (``select_sdp_backend`` in ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``,
default priority flash, then memory efficient, then math), by the rules of that file that a
traced shape decides:

- **flash** (``aten._scaled_dot_product_flash_attention``): 16-bit q, k, v, no ``attn_mask``,
  q, k and v of one head dim (``check_head_dim_size_flash``), at most 256 and a multiple of 8;
  it takes grouped-query K/V as they are (``enable_gqa``: fewer K/V heads than query heads);
- **memory efficient** (``aten._scaled_dot_product_efficient_attention``): any floating dtype,
  an additive ``attn_mask`` (a boolean mask becomes ``-inf`` where false, as
  ``convert_boolean_attn_mask`` does), q and k of one head dim and v's another
  (``check_head_dim_size_mem_efficient``): multi-head latent attention (DeepSeek-V3's d_qk 192,
  d_v 128, which transformers passes without a mask) runs it; it does not take grouped-query
  K/V;
- otherwise (a mask with grouped-query K/V, or a head dim neither takes) the call is left to
  torch, which traces the math path.

Both kernels' forward and backward are single aten ops whose meta functions need no GPU; the
importer expands them into matmul/softmax semantics with no s² tensor saved
(``importer._attention``: ``QKᵀ`` over d_qk, ``PV`` yielding d_v), and ``phaze-form-kernels``
prices each as one kernel, the one the runtime runs (``kernels.attention_backend``: cuDNN's on
an H100 under torch 2.15, whose ``check_cudnn_tensor_shapes`` takes d_qk and d_v apart, and
under Transformer Engine, whose ``get_attention_backend`` keeps FusedAttention for
d_qk ≠ d_v with separate q, k, v tensors and drops FlashAttention: docs/design.md §5.11.3).

**Autocast.**  CPU autocast (what runs on fake CPU tensors) keeps in 16 bits many ops CUDA
autocast runs in fp32: ``aten/src/ATen/autocast_mode.cpp`` puts on CUDA's ``fp32`` list the
transcendental pointwise ops (``pow``, ``exp``, ``log``, ``rsqrt``, ...), the norms and the
losses, and on its ``fp32_set_opt_dtype`` list ``softmax``, ``log_softmax``, ``sum``,
``cumsum``, ``prod`` and the vector norms (computed and returned in fp32 unless a dtype is
given); CPU's lists have few of them (``tests/test_kernels.py`` checks the difference).  While
autocast is on, :func:`as_on_cuda` applies CUDA's two policies to those functions before CPU
autocast sees them: 16-bit floating arguments cast to fp32, or ``dtype=torch.float32`` passed.
The interception is a ``TorchFunctionMode``: it also sees a model that imported the functions
by name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

#: Largest head dimension torch's flash kernel takes (sdp_utils.cpp ``check_head_dim_size_flash``).
FLASH_MAX_HEAD_DIM = 256


def _gpu_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """The attention through the kernel a CUDA GPU would run (module docstring); None when torch's
    own dispatch should trace it."""
    import torch

    if torch.is_autocast_enabled("cpu"):
        # SDPA is on autocast's lower-precision list (CUDA's as CPU's, autocast_mode.cpp): it
        # would cast its floating inputs to the autocast dtype below this interception.
        low = torch.get_autocast_dtype("cpu")
        query, key, value = (t.to(low) if t.is_floating_point() else t for t in (query, key, value))
        if attn_mask is not None and attn_mask.is_floating_point():
            attn_mask = attn_mask.to(low)
    head_dim = query.shape[-1]
    grouped = key.shape[-3] != query.shape[-3]
    low_precision = query.dtype in (torch.float16, torch.bfloat16)
    if (
        attn_mask is None
        and low_precision
        and head_dim <= FLASH_MAX_HEAD_DIM
        and head_dim % 8 == 0
        and value.shape[-1] == head_dim
    ):
        return torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p, is_causal, False, scale=scale
        )[0]
    if grouped:
        return None
    bias = attn_mask
    if bias is not None and bias.dtype == torch.bool:
        bias = torch.zeros(bias.shape, dtype=query.dtype, device=bias.device).masked_fill(~bias, float("-inf"))
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, bias, True, dropout_p, is_causal, scale=scale
    )[0]


#: CUDA autocast's ``fp32`` policy (``autocast_mode.cpp``, ``AT_FORALL_FP32``), by the name of
#: the Python function or method that reaches it.
CUDA_FP32 = frozenset(
    {
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
        "rsqrt", "sinh", "tan", "pow", "__pow__", "__rpow__", "softplus", "layer_norm", "group_norm",
        "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "hinge_embedding_loss",
        "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
        "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
        "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    }
)  # fmt: skip
#: CUDA autocast's ``fp32_set_opt_dtype`` policy (``AT_FORALL_FP32_SET_OPT_DTYPE``).
CUDA_FP32_SET_OPT_DTYPE = frozenset({"prod", "softmax", "log_softmax", "cumprod", "cumsum", "sum", "vector_norm"})


def _is_16_bit(t) -> bool:
    import torch

    return isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16)


def _autocast_as_cuda(func, args: tuple, kwargs: dict):
    """``(args, kwargs)`` of ``func`` as CUDA autocast would run it (module docstring), or None
    when CUDA autocast leaves the call as it is."""
    import torch

    name = getattr(func, "__name__", "")
    if name in CUDA_FP32:
        if not any(_is_16_bit(a) for a in (*args, *kwargs.values())):
            return None
        cast = lambda a: a.float() if _is_16_bit(a) else a  # noqa: E731
        return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}
    if name in CUDA_FP32_SET_OPT_DTYPE and args and _is_16_bit(args[0]) and kwargs.get("dtype") is None:
        return args, {**kwargs, "dtype": torch.float32}
    return None


@contextlib.contextmanager
def as_on_cuda() -> Iterator[None]:
    """While active, scaled dot-product attention and autocast trace as on a CUDA GPU (module
    docstring)."""
    import torch
    from torch.overrides import TorchFunctionMode

    sdpa = torch._C._nn.scaled_dot_product_attention

    class _Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is sdpa:
                out = _gpu_sdpa(*args, **kwargs)
                if out is not None:
                    return out
            elif torch.is_autocast_enabled("cpu"):
                changed = _autocast_as_cuda(func, args, kwargs)
                if changed is not None:
                    args, kwargs = changed
            return func(*args, **kwargs)

    with _Mode():
        yield
