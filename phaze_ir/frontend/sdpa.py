"""Scaled dot-product attention traced as a CUDA GPU runs it, not as the CPU would.

phaze traces on fake CPU tensors, so ``F.scaled_dot_product_attention`` would dispatch as on a
CPU: torch's CPU selector (``aten/src/ATen/native/transformers/sdp_utils_cpp.cpp``) refuses its
flash kernel when there is dropout, and the math fallback then *materialises* the attention
(``q kᵀ``, ``_safe_softmax``, dropout, ``@ v``: every s² tensor written and saved for backward).
A GPU runs one fused kernel instead.  While tracing, :func:`sdpa_as_on_gpu` intercepts the call
(a ``TorchFunctionMode``: it also sees a model that imported the function by name) and calls the
kernel torch's CUDA selector picks (``select_sdp_backend`` in
``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``, default priority flash, then memory
efficient, then math), by the rules of that file that a traced shape decides:

- **flash** (``aten._scaled_dot_product_flash_attention``): 16-bit q, k, v, no ``attn_mask``,
  head dim at most 256 and a multiple of 8; it takes grouped-query K/V as they are
  (``enable_gqa``: fewer K/V heads than query heads);
- **memory efficient** (``aten._scaled_dot_product_efficient_attention``): any floating dtype,
  an additive ``attn_mask`` (a boolean mask becomes ``-inf`` where false, as
  ``convert_boolean_attn_mask`` does); it does not take grouped-query K/V;
- otherwise (a mask with grouped-query K/V, or a head dim neither takes) the call is left to
  torch, which traces the math path.

Both kernels' forward and backward are single aten ops whose meta functions need no GPU; the
importer expands them into matmul/softmax semantics with no s² tensor saved
(``importer._attention``), and ``phaze-form-kernels`` prices each as one kernel.
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


@contextlib.contextmanager
def sdpa_as_on_gpu() -> Iterator[None]:
    """While active, ``F.scaled_dot_product_attention`` traces as CUDA runs it (module docstring)."""
    import torch
    from torch.overrides import TorchFunctionMode

    target = torch._C._nn.scaled_dot_product_attention

    class _Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is target:
                out = _gpu_sdpa(*args, **kwargs)
                if out is not None:
                    return out
            return func(*args, **kwargs)

    with _Mode():
        yield
