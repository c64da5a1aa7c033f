"""FP8 linears as Transformer Engine runs them, for tracing ``--dtype fp8``.

``--dtype fp8`` is Megatron-LM's ``--fp8-format hybrid`` with its default recipe
(``megatron/core/transformer/transformer_config.py`` of megatron-core 0.16.1: ``fp8_recipe =
"delayed"``): Transformer Engine's ``DelayedScaling`` with ``Format.HYBRID``, E4M3 for the
forward's tensors (inputs, weights) and E5M2 for the output gradients, one scale per tensor.
Everything else (norms, attention, the loss, the LM head, the weights and gradients) stays in
bf16, and the optimizer keeps its fp32 state.  While tracing, each linear that Transformer
Engine would run in FP8 runs :func:`float8_linear` instead of ``F.linear``: the ops a TE
``Linear`` launches, on fake tensors of the real dtypes, so that the traced step carries the
casts, the FP8 GEMMs (``aten._scaled_mm``) and what the backward keeps, as the runtime does.

What it follows, in Transformer Engine 2.20.0.dev0 (``transformer_engine/pytorch/module/
linear.py``, ``_Linear.forward`` / ``backward``):

- the input is cast to E4M3 with its columnwise (transposed) copy, which the weight gradient
  reads, once for all the linears that read it (Megatron's fused ``linear_qkv`` and
  ``linear_fc1``); the forward keeps only that copy for the backward ("Discard row-wise data
  since it is not needed in backward pass"), 1 byte per element where bf16 keeps 2;
- the weight is cast to E4M3 with its transposed copy (the FP8 workspace, ``weightmat``), saved
  for the input gradient (``wt_save = weightmat``);
- the output gradient is cast to E5M2 with its transposed copy, for the two backward GEMMs;
- the GEMMs run on FP8 operands with a bf16 result (``general_gemm``);
- with delayed scaling the scale comes from the amax history, and each cast kernel records the
  tensor's amax as it casts (no separate amax pass); the history's update after the step is a
  few small kernels and an all-reduce of a few kB, not traced.

Which linears: every ``torch.nn.Linear`` (and transformers' ``Conv1D``) whose weight TE's FP8
GEMM takes (``check_dim_for_fp8_exec`` in ``transformer_engine/pytorch/utils.py``: rows a
multiple of 8, columns of 16), but the model's output embedding (the LM head): Megatron-LM
builds its ``output_layer`` as a plain ``ColumnParallelLinear``, not a TE module.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

#: TE's ``check_dim_for_fp8_exec``: an FP8 GEMM operand's rows are a multiple of 8, its columns of 16.
FP8_ROWS, FP8_COLUMNS = 8, 16


def _float8_dtypes():
    import torch

    return torch.float8_e4m3fn, torch.float8_e5m2


def _cast(x, dtype):
    """``x`` cast to an FP8 ``dtype`` as a TE cast-transpose kernel writes it: the rowwise
    copy, and the columnwise one (``x.t()`` made contiguous).  The rowwise copy is row-major
    whatever ``x``'s strides (a ``Conv1D``'s weight is a transposed view): otherwise its
    transpose would already be contiguous and the columnwise copy no copy at all."""
    import torch

    fp8 = x.to(dtype, memory_format=torch.contiguous_format)
    return fp8, fp8.t().contiguous()


#: The scale inverses a TE linear keeps (its ``fp8_meta``: fp32 scalars the amax history sets
#: after each step), one per tensor it casts, registered as buffers of each FP8 linear so that
#: the traced step reads them as it reads any buffer, no op making them.
SCALE_BUFFERS = ("fp8_input_scale_inv", "fp8_weight_scale_inv", "fp8_grad_output_scale_inv")


def _make_function():
    import torch

    e4m3, e5m2 = _float8_dtypes()

    class _Float8Matmul(torch.autograd.Function):
        """``x @ w.t()`` with FP8 operands, forward and backward as TE's ``_Linear``."""

        @staticmethod
        def forward(ctx, x2d, weight, x_row, x_col, x_scale, w_scale, g_scale):
            # x [M, K] @ w^T [K, N]: _scaled_mm reads its first operand row-major, its second
            # column-major (the rowwise copy of w [N, K], transposed as a view); the input's
            # casts come made (:func:`float8_linear`: shared by the linears that read it)
            w_row, w_col = _cast(weight, e4m3)
            out = torch._scaled_mm(x_row, w_row.t(), x_scale, w_scale, out_dtype=x2d.dtype)
            # the backward reads the columnwise copies: the input's and the weight's
            ctx.save_for_backward(x_col, w_col, x_scale, w_scale, g_scale)
            ctx.dtype = x2d.dtype
            return out

        @staticmethod
        def backward(ctx, grad_out):
            x_col, w_col, x_scale, w_scale, g_scale = ctx.saved_tensors
            g_row, g_col = _cast(grad_out.contiguous(), e5m2)
            # input gradient [M, K] = g [M, N] @ w [N, K]; weight gradient [N, K] = g^T [N, M] @ x [M, K]
            grad_x = torch._scaled_mm(g_row, w_col.t(), g_scale, w_scale, out_dtype=ctx.dtype)
            grad_w = torch._scaled_mm(g_col, x_col.t(), g_scale, x_scale, out_dtype=ctx.dtype)
            return grad_x, grad_w, None, None, None, None, None

    return _Float8Matmul


def _weight(linear):
    """The ``[out, in]`` weight of a linear: ``nn.Linear``'s own, the transpose of a
    transformers ``Conv1D``'s ``[in, out]`` (GPT-2's linears, which Megatron-LM builds as TE
    linears too).  An op while tracing: called only where the GEMM reads it."""
    import torch

    return linear.weight if isinstance(linear, torch.nn.Linear) else linear.weight.t()


def _out_in(linear) -> tuple[int, int]:
    """The ``(out, in)`` features of a linear, read off its weight's shape with no op: choosing
    the linears runs inside the traced step, where a transpose taken only for its shape would be
    recorded as a dead op on the weight before any layer (and pull every ``Conv1D`` weight into
    the model's first layer, hence its first pipeline stage)."""
    import torch

    rows, columns = linear.weight.shape
    return (rows, columns) if isinstance(linear, torch.nn.Linear) else (columns, rows)


def float8_linear(linear, x, matmul, casts: dict) -> Any:
    """``linear(x)`` through the FP8 GEMMs of ``matmul`` (``_make_function()``).  The input is
    cast once for every linear that reads it (``casts``, by the input's identity): Megatron-LM
    runs q, k and v as one TE linear (``linear_qkv``), and gate and up (``linear_fc1``), which
    cast their shared input once and keep one FP8 copy of it.  A bias is added after the GEMM
    (TE adds it in the GEMM's epilogue)."""
    import torch

    x2d = x.reshape(-1, x.shape[-1])
    if id(x) not in casts:
        with torch.no_grad():  # an FP8 cast has no gradient: the GEMMs' backward is x's
            casts[id(x)] = (x, *_cast(x2d, _float8_dtypes()[0]))  # x kept: its id stays its own
    _, x_row, x_col = casts[id(x)]
    scales = (getattr(linear, name) for name in SCALE_BUFFERS)
    out = matmul.apply(x2d, _weight(linear), x_row, x_col, *scales)
    bias = linear.bias
    out = out.reshape(*x.shape[:-1], out.shape[-1])
    return out if bias is None else out + bias


def _conv1d_class() -> type | None:
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # transformers absent: no such linears
        return None
    return Conv1D


def fp8_linears(model) -> list[Any]:
    """The linears of ``model`` that Transformer Engine runs in FP8 (module docstring)."""
    import torch

    kinds: tuple[type, ...] = tuple(k for k in (torch.nn.Linear, _conv1d_class()) if k is not None)
    head = getattr(model, "get_output_embeddings", lambda: None)()
    found = []
    for m in model.modules():
        weight = getattr(m, "weight", None)
        if not isinstance(m, kinds) or m is head or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            continue
        out_features, in_features = _out_in(m)
        if out_features % FP8_ROWS == 0 and in_features % FP8_COLUMNS == 0:
            found.append(m)
    return found


def register_fp8_scales(model) -> None:
    """Give every linear of :func:`fp8_linears` its scale buffers (:data:`SCALE_BUFFERS`), on
    the device of its weight: before the step's buffers are listed."""
    import torch

    for m in fp8_linears(model):
        for name in SCALE_BUFFERS:
            m.register_buffer(name, torch.ones((), dtype=torch.float32, device=m.weight.device))


@contextlib.contextmanager
def fp8_linears_patched(model) -> Iterator[int]:
    """While open, every linear of :func:`fp8_linears` (given its scales by
    :func:`register_fp8_scales`) runs its FP8 GEMMs; yields how many."""
    matmul = _make_function()
    casts: dict = {}
    linears = [m for m in fp8_linears(model) if hasattr(m, SCALE_BUFFERS[0])]
    for m in linears:
        # an instance attribute: ``m(x)`` still runs the module's hooks (its provenance), and
        # reads the weight and scales ``functional_call`` put in place
        m.forward = lambda x, m=m: float8_linear(m, x, matmul, casts)
    try:
        yield len(linears)
    finally:
        for m in linears:
            del m.forward
