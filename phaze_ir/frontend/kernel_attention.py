"""Attention with a sliding window or attention sinks, traced as the one fused kernel a GPU runs.

transformers runs such attention through torch's math path: GPT-OSS (``models/gpt_oss``,
transformers 5.25) has no SDPA (``_supports_sdpa = False``; its eager attention concatenates a
learned per-head "sink" logit to the scores), Gemma-2 none either (logit soft-capping), and
Mistral/Qwen2/Gemma-3 pass SDPA a sliding-window mask, which with grouped-query K/V torch's
fused kernels do not take (``gpu_dispatch``).  Traced so, every layer writes and saves its
s x s scores and prices the whole square, the window ignored.

The runtimes that train these models run one kernel instead, which computes only the score
tiles inside the causal window (about s·w of the s² scores) and saves no s² tensor:

- FlashAttention's ``window_size`` (Dao-AILab/flash-attention v2.3+): transformers 5.25's
  ``modeling_flash_attention_utils.py`` passes ``(sliding_window - 1, sliding_window - 1)``
  with ``causal=True`` when the keys outnumber the window, and the sinks as ``s_aux`` to
  FlashAttention-3 on Hopper (``kernels-community/vllm-flash-attn3``, which its GPT-OSS loads);
- Transformer Engine's cuDNN fused attention, ``window_size`` and ``softmax_type="learnable"``
  (a ``softmax_offset`` parameter per head; TE 2.20.0.dev0 d0067d0,
  ``transformer_engine/pytorch/attention/dot_product_attention/dot_product_attention.py``), as
  Megatron-LM runs GPT-OSS (d98e8a64, ``examples/gptoss/02_train.sh``: ``--softmax-type
  learnable --window-attn-skip-freq 2 --window-size 127,0``, a window of 128 keys on alternate
  layers).

:func:`attention` is that kernel as a transformers attention function (``AttentionInterface``,
registered as :data:`KERNEL_ATTENTION`): ``phaze::window_attention(q, k, v, sinks, window, scale,
dropout_p) -> (out, lse)``, causal, with grouped-query K/V as they are, and its backward
``phaze::window_attention_backward``, which also gives the sinks' gradient.  The importer expands
them as it expands torch's flash attention (``importer._attention``), the window and the sinks in
the op's ``phaze.fused`` name (``... window W sinks causal``), and the pricing counts the window's
work (``phaze_ir.op_kinds.causal_fraction``).  :func:`switch` (``loader.with_kernel_attention``)
switches a model whose attention has a window shorter than the sequence, or sinks, to it; in
such a model that has SDPA a layer with neither goes through SDPA as before, and a model with
neither is not switched (its plans are byte for byte what they were).  Both ops are traced on
fake tensors only: they have no kernel here.
"""

from __future__ import annotations

import functools
from typing import Any

#: The name phaze registers its attention function under (transformers' ``AttentionInterface``).
KERNEL_ATTENTION = "phaze_kernel"
#: The traced ops' names (``aten_map.FUSED_ATTENTION``; the forward's is a prefix of its backward's).
WINDOW_ATTENTION = "window_attention"


@functools.cache
def _ops():
    """The forward and backward custom ops (defined once per process)."""
    import torch

    fwd_schema = (
        "(Tensor q, Tensor k, Tensor v, Tensor? sinks, int window, float scale, float dropout_p) -> (Tensor, Tensor)"
    )
    bwd_schema = (
        "(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor? sinks, Tensor out, Tensor lse, int window, "
        "float scale, float dropout_p) -> (Tensor, Tensor, Tensor, Tensor)"
    )

    @torch.library.custom_op(f"phaze::{WINDOW_ATTENTION}", mutates_args=(), schema=fwd_schema)
    def forward(q, k, v, sinks, window, scale, dropout_p):
        raise NotImplementedError("phaze::window_attention is traced on fake tensors, never run")

    @forward.register_fake
    def _(q, k, v, sinks, window, scale, dropout_p):
        # out like q [b, h, s, d_v]; the log-sum-exp of each query row in fp32, as flash keeps it
        out = q.new_empty((*q.shape[:-1], v.shape[-1]))
        return out, q.new_empty(q.shape[:-1], dtype=torch.float32)

    @torch.library.custom_op(f"phaze::{WINDOW_ATTENTION}_backward", mutates_args=(), schema=bwd_schema)
    def backward(grad_out, q, k, v, sinks, out, lse, window, scale, dropout_p):
        raise NotImplementedError("phaze::window_attention_backward is traced on fake tensors, never run")

    @backward.register_fake
    def _(grad_out, q, k, v, sinks, out, lse, window, scale, dropout_p):
        # the sinks' gradient [h] in fp32 (a reduction over the batch and the rows); [0] without
        dsinks = q.new_empty((0,) if sinks is None else tuple(sinks.shape), dtype=torch.float32)
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsinks

    def setup_context(ctx, inputs, output):
        q, k, v, sinks, window, scale, dropout_p = inputs
        ctx.save_for_backward(q, k, v, sinks, *output)
        ctx.args = (window, scale, dropout_p)
        ctx.sinks_dtype = None if sinks is None else sinks.dtype

    def grad(ctx, grad_out, _grad_lse):
        q, k, v, sinks, out, lse = ctx.saved_tensors
        dq, dk, dv, dsinks = torch.ops.phaze.window_attention_backward(grad_out, q, k, v, sinks, out, lse, *ctx.args)
        return dq, dk, dv, (None if ctx.sinks_dtype is None else dsinks.to(ctx.sinks_dtype)), None, None, None

    forward.register_autograd(grad, setup_context=setup_context)
    return torch.ops.phaze.window_attention.default


def effective_window(window: Any, keys: int) -> int:
    """The sliding window a kernel applies over ``keys`` keys: the keys a query sees, itself
    included (transformers' ``sliding_window``: ``kv_idx > q_idx - sliding_window``); 0 when it
    sees every earlier key (no window, or one at least as long as the keys)."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1 or window >= keys:
        return 0
    return window


def attention(
    module,
    query,
    key,
    value,
    attention_mask,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    s_aux=None,
    **kwargs,
):
    """A transformers attention function (``AttentionInterface``): causal attention over
    ``query [b, h, s, d]`` and ``key``/``value [b, h_kv, s, d]`` as one fused kernel with the
    layer's ``sliding_window`` and sinks (``s_aux``: one logit per head), out ``[b, s, h, d]``
    (what ``sdpa_attention_forward`` returns).  A layer with neither goes through SDPA where the
    model has it (transformers' causal flash attention, as before).  ``attention_mask`` is not
    read: this kernel's mask is the causal window (phaze traces unpadded training batches,
    whose masks say no more), and transformers builds none under this name
    (``masking_utils``: an implementation without a mask function gets None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from phaze_ir.errors import PhazeError

    window = effective_window(sliding_window, key.shape[-2])
    if window == 1:  # (the kernel field that carries the window reads 1 as causal: latency.causal_fraction)
        raise PhazeError(f"{type(module).__name__}: sliding_window = 1: a window of one key is not priced")
    if s_aux is None and not window and getattr(module.config, "_phaze_sdpa", False):
        return sdpa_attention_forward(module, query, key, value, None, dropout=dropout, scaling=scaling, **kwargs)
    scale = float(query.shape[-1] ** -0.5 if scaling is None else scaling)
    out, _ = _ops()(query, key, value, s_aux, window, scale, float(dropout))
    return out.transpose(1, 2).contiguous(), None


@functools.cache
def register() -> str:
    """:func:`attention` registered with transformers as :data:`KERNEL_ATTENTION` (once)."""
    from transformers import AttentionInterface

    AttentionInterface.register(KERNEL_ATTENTION, attention)
    return KERNEL_ATTENTION


def runs_in_kernel(model, seq_len: int | None = None) -> bool:
    """Whether ``model``'s attention has what only this kernel runs fused: a sliding window
    (``config.sliding_window``) shorter than ``seq_len`` (None: any), or attention sinks (a
    ``sinks`` parameter of an attention module, GPT-OSS's), in a transformers decoder whose
    attention goes through ``AttentionInterface`` (``_supports_attention_backend``)."""
    import torch

    config = getattr(model, "config", None)
    if config is None or not getattr(model, "_supports_attention_backend", False):
        return False
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "eager"):
        return False
    if getattr(config, "is_encoder_decoder", False):
        return False
    window = getattr(config, "sliding_window", None)
    if isinstance(window, int) and not isinstance(window, bool) and (seq_len is None or window < seq_len):
        return True
    return any(isinstance(getattr(m, "sinks", None), torch.nn.Parameter) for m in model.modules())


def switch(model, seq_len: int | None = None):
    """``model`` switched to :data:`KERNEL_ATTENTION` when :func:`runs_in_kernel`; as it is else."""
    if not runs_in_kernel(model, seq_len):
        return model
    config = model.config
    if getattr(config, "sliding_window", None) == 1:  # before the trace, in one line
        from phaze_ir.errors import PhazeError

        raise PhazeError(f"{type(model).__name__}: sliding_window = 1: a window of one key is not priced")
    sdpa = config._attn_implementation == "sdpa"
    model.set_attn_implementation(register())
    # Layers with neither a window nor sinks keep SDPA where the model had it (attention()).
    for c in {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}.values():
        c._phaze_sdpa = sdpa
    return model
