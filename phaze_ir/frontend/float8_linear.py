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

**Recipes** (:class:`Fp8Recipe`, phazec's ``--fp8-recipe``), each traced as its runtime runs it:

- ``delayed`` (above): TE's ``DelayedScaling``, Megatron-LM's ``--fp8-recipe delayed``.
- ``current``: TE's ``Float8CurrentScaling`` (Megatron-LM's ``--fp8-recipe tensorwise``), the same
  casts and saved copies, but each cast first reads its tensor for its amax: TE 2.x's
  ``Float8CurrentScalingQuantizer`` runs ``nvte_compute_amax`` (one reduction kernel over the
  tensor), ``nvte_compute_scale_from_amax``, then the cast (``transformer_engine/pytorch/csrc/
  extensions/cast.cpp``, ``quantize``), traced as one reduction (``linalg_vector_norm``, ord inf)
  and the scale's scalar ops before the cast.  The amax all-reduce over the TP group of a
  sequence-parallel input (``with_amax_reduction``) is a scalar collective, not traced.
- ``tensorwise`` and ``rowwise``: torchao's ``Float8Linear`` (torchao 0.18.0,
  ``torchao/float8/float8_linear.py`` ``matmul_with_hp_or_float8_args``, recipes of
  ``Float8LinearConfig.from_recipe_name`` in ``config.py``), what torchtitan 0.3.0's
  ``Float8LinearConverter`` swaps in (``torchtitan/components/quantization/float8.py``).  Dynamic
  scaling: every cast is ``hp_tensor_to_float8_dynamic``: the amax (``abs`` then ``max``, or
  ``amax`` along the scaled axis, ``float8_utils.tensor_to_amax``), the scale (``amax_to_scale``,
  rounded down to a power of two for ``rowwise``), then ``x.float() * scale``, clamped, cast
  (``_ToFloat8ConstrFunc``, ``to_fp8_saturated``): eager runs each as its own kernel, torch.compile
  fuses them, as phaze's kernel formation does.  Nothing FP8 is kept: the forward saves the
  bf16 input and weight (``ctx.save_for_backward(input_hp, weight_hp_t)``) and the backward
  casts them again (the weight for the input gradient, the input and the output gradient for the
  weight gradient, with the other axis's scales under ``rowwise``), and ``_scaled_mm``'s layout
  (``float8_ops.preprocess_addmm``: first operand row-major, second column-major) copies the
  backward's transposed operands.  ``tensorwise``: E4M3 forward, E5M2 output gradients, one scale
  per tensor; ``rowwise``: E4M3 throughout, one scale per row (per column for the weight
  gradient's operands).  Every linear whose features are both multiples of 16
  (torchtitan's ``module_filter_fn``) but the LM head (its export filters ``lm_head``, as
  torchtitan's own ``llama3_405b`` does).  The forward GEMM accumulates fast, the backward's
  split (``gemm_config_output.use_fast_accum=True``, the others False), as TE's do.  The FSDP
  all-gather stays bf16 (``enable_fsdp_float8_all_gather`` is off in both recipes).

Which linears: every ``torch.nn.Linear`` (and transformers' ``Conv1D``) whose weight TE's FP8
GEMM takes (``check_dim_for_fp8_exec`` in ``transformer_engine/pytorch/utils.py``: rows a
multiple of 8, columns of 16), but the model's output embedding (the LM head): Megatron-LM
builds its ``output_layer`` as a plain ``ColumnParallelLinear``, not a TE module.

**Experts.** transformers' MoE experts are no linears: their per-expert weights are one
``[experts, out, in]`` parameter each, run through ``_grouped_linear`` (``aten._grouped_mm``,
transformers 5.25 ``integrations/moe.py``, ``grouped_mm_experts_forward``).  Megatron-core with
FP8 runs them in FP8 under TE's recipes: ``TEGroupedMLP`` (``--moe-grouped-gemm``,
``megatron/core/transformer/moe/experts.py``) as TE ``GroupedLinear`` modules
(``TEColumnParallelGroupedLinear`` / ``TERowParallelGroupedLinear`` of
``megatron/core/extensions/transformer_engine.py``, megatron-core d98e8a64), and
``SequentialMLP`` as one TE linear per expert.  TE 2.20.0.dev0's ``_GroupedLinear.forward``
(``transformer_engine/pytorch/module/grouped_linear.py``) is ``_Linear``'s per expert: the
input split by expert and cast to E4M3 with its columnwise copy (``_split_quantize``), which
alone the backward keeps; each expert's weight cast with its transpose (``quantize_weight``,
kept for the step as a linear's workspace and saved for the backward); one grouped GEMM
(``general_grouped_gemm``, ``tex.te_general_grouped_gemm``); the backward casts the output
gradient to E5M2 and runs the input- and weight-gradient grouped GEMMs with split
accumulation (``_2X_ACC_DGRAD``, ``_2X_ACC_WGRAD``).  While tracing, ``_grouped_linear`` runs
:func:`_make_grouped_function`'s ops for every expert weight of :func:`fp8_expert_weights`:
the casts as a linear's (the input cast once for every weight that reads it), the GEMMs as
``phaze::fp8_grouped_mm`` (torch's ``aten._scaled_grouped_mm`` takes E4M3 operands only), which
the importer expands over the experts as ``aten._grouped_mm``.  The token permutation and the
all-to-alls stay bf16 (megatron-core's ``moe_dispatch_fwd_dtype`` defaults to ``bf16``).
torchao's recipes leave the experts bf16: torchtitan 0.3.0's ``Float8LinearConverter`` swaps
``nn.Linear`` modules only (its grouped-GEMM FP8 is a separate prototype converter, not offered).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from enum import Enum
from typing import Any


class Fp8Recipe(str, Enum):
    """How FP8 linears scale their casts (module docstring); the runtime that runs each is
    :attr:`runtime`."""

    DELAYED = "delayed"
    CURRENT = "current"
    TENSORWISE = "tensorwise"
    ROWWISE = "rowwise"

    @property
    def runtime(self) -> str:
        """``te`` (Transformer Engine, Megatron-LM) or ``torchao`` (torchtitan)."""
        return "te" if self in (Fp8Recipe.DELAYED, Fp8Recipe.CURRENT) else "torchao"


#: phazec's ``--fp8-recipe`` choices (``auto``: :func:`resolve_recipe`).
FP8_RECIPES = tuple(r.value for r in Fp8Recipe)
FP8_RECIPE_CHOICES = ("auto", *FP8_RECIPES)


def resolve_recipe(asked: str, torchtitan: bool = False) -> Fp8Recipe:
    """The recipe of ``--fp8-recipe asked``: ``auto`` is torchao's ``rowwise`` when the plan is
    exported to torchtitan (its float8 converter's default recipe), else TE's ``delayed``
    (Megatron-LM's default)."""
    if asked == "auto":
        return Fp8Recipe.ROWWISE if torchtitan else Fp8Recipe.DELAYED
    return Fp8Recipe(asked)


#: torchao's smallest amax (``float8_utils.EPS``), which ``amax_to_scale`` clamps to.
TORCHAO_EPS = 1e-12

#: TE's ``check_dim_for_fp8_exec``: an FP8 GEMM operand's rows are a multiple of 8, its columns of 16.
FP8_ROWS, FP8_COLUMNS = 8, 16
#: torchtitan's ``module_filter_fn``: a linear's in and out features both multiples of 16.
TORCHAO_MULTIPLE = 16


def _float8_dtypes():
    import torch

    return torch.float8_e4m3fn, torch.float8_e5m2


def _cast(x, dtype, scale_inv, current: bool = False):
    """``x`` cast to an FP8 ``dtype`` as a TE cast-transpose kernel writes it: the rowwise
    copy, the columnwise one (``x.t()`` made contiguous), and the scale inverse the GEMM reads.
    The rowwise copy is row-major whatever ``x``'s strides (a ``Conv1D``'s weight is a
    transposed view): otherwise its transpose would already be contiguous and the columnwise
    copy no copy at all.  Delayed scaling reads ``scale_inv`` (a buffer: the amax history's);
    ``current`` scaling first reads ``x`` for its amax (one reduction kernel) and makes the
    scale inverse from it, which the cast applies as it casts (module docstring)."""
    import torch

    if current:
        scale_inv = torch.linalg.vector_norm(x, float("inf")).float() / torch.finfo(dtype).max
    fp8 = x.to(dtype, memory_format=torch.contiguous_format)
    # a batch of per-expert weights [E, N, K] keeps each expert's transpose [E, K, N]
    columnwise = fp8.t() if fp8.dim() == 2 else fp8.transpose(-2, -1)
    return fp8, columnwise.contiguous(), scale_inv


#: The scale inverses a TE linear keeps (its ``fp8_meta``: fp32 scalars the amax history sets
#: after each step), one per tensor it casts, registered as buffers of each FP8 linear so that
#: the traced step reads them as it reads any buffer, no op making them.
SCALE_BUFFERS = ("fp8_input_scale_inv", "fp8_weight_scale_inv", "fp8_grad_output_scale_inv")


def _make_function(recipe: Fp8Recipe = Fp8Recipe.DELAYED):
    import torch

    if recipe.runtime == "torchao":
        return _make_torchao_function(recipe)
    e4m3, e5m2 = _float8_dtypes()
    current = recipe is Fp8Recipe.CURRENT

    class _Float8Matmul(torch.autograd.Function):
        """``x @ w.t()`` with FP8 operands, forward and backward as TE's ``_Linear``."""

        @staticmethod
        def forward(ctx, x2d, weight, x_row, x_col, x_scale, w_scale, g_scale):
            # x [M, K] @ w^T [K, N]: _scaled_mm reads its first operand row-major, its second
            # column-major (the rowwise copy of w [N, K], transposed as a view); the input's
            # casts come made (:func:`float8_linear`: shared by the linears that read it)
            w_row, w_col, w_scale = _cast(weight, e4m3, w_scale, current)
            out = torch._scaled_mm(x_row, w_row.t(), x_scale, w_scale, out_dtype=x2d.dtype)
            # the backward reads the columnwise copies: the input's and the weight's
            ctx.save_for_backward(x_col, w_col, x_scale, w_scale, g_scale)
            ctx.dtype = x2d.dtype
            return out

        @staticmethod
        def backward(ctx, grad_out):
            x_col, w_col, x_scale, w_scale, g_scale = ctx.saved_tensors
            g_row, g_col, g_scale = _cast(grad_out.contiguous(), e5m2, g_scale, current)
            # input gradient [M, K] = g [M, N] @ w [N, K]; weight gradient [N, K] = g^T [N, M] @ x [M, K]
            grad_x = torch._scaled_mm(g_row, w_col.t(), g_scale, w_scale, out_dtype=ctx.dtype)
            grad_w = torch._scaled_mm(g_col, x_col.t(), g_scale, x_scale, out_dtype=ctx.dtype)
            return grad_x, grad_w, None, None, None, None, None

    return _Float8Matmul


#: The grouped FP8 GEMM TE launches (``general_grouped_gemm``, ``module/grouped_linear.py``):
#: no torch op is one (``aten._scaled_grouped_mm`` takes E4M3 operands only, TE's gradients are
#: E5M2), so it is traced as this op, which the importer expands as ``aten._grouped_mm``.
FP8_GROUPED_MM = "fp8_grouped_mm"


@functools.cache
def _fp8_grouped_mm():
    """``phaze::fp8_grouped_mm(a, b, a_scale_inv, b_scale_inv, offs, out_dtype)``: the shapes of
    ``aten._grouped_mm`` (``a [T, K] x b [E, K, N] -> [T, N]``; ``a [M, T] x b [T, N] ->
    [E, M, N]``, the tokens grouped by ``offs``) on FP8 operands with one scale inverse each,
    ``out_dtype`` out.  Traced only, on fake tensors: it has no kernel here."""
    import torch

    schema = "(Tensor a, Tensor b, Tensor a_scale_inv, Tensor b_scale_inv, Tensor offs, ScalarType out_dtype) -> Tensor"

    @torch.library.custom_op(f"phaze::{FP8_GROUPED_MM}", mutates_args=(), schema=schema)
    def fp8_grouped_mm(a, b, a_scale_inv, b_scale_inv, offs, out_dtype):
        raise NotImplementedError("phaze::fp8_grouped_mm is traced on fake tensors, never run")

    @fp8_grouped_mm.register_fake
    def _(a, b, a_scale_inv, b_scale_inv, offs, out_dtype):
        shape = (a.shape[0], b.shape[-1]) if b.dim() == 3 else (offs.shape[0], a.shape[0], b.shape[-1])
        return a.new_empty(shape, dtype=out_dtype)

    return torch.ops.phaze.fp8_grouped_mm.default


def _make_grouped_function(recipe: Fp8Recipe = Fp8Recipe.DELAYED):
    """The experts' GEMMs with FP8 operands, forward and backward as TE's ``_GroupedLinear``
    (module docstring, "Experts"): :func:`_make_function`'s per expert, one grouped GEMM
    (:func:`_fp8_grouped_mm`) for all of them."""
    import torch

    e4m3, e5m2 = _float8_dtypes()
    current = recipe is Fp8Recipe.CURRENT
    grouped_mm = _fp8_grouped_mm()

    class _Float8GroupedMatmul(torch.autograd.Function):
        """``x @ w[e].t()`` for each expert ``e``'s rows of ``x`` (``offs``), FP8 operands."""

        @staticmethod
        def forward(ctx, x2d, weight, offs, x_row, x_col, x_scale, w_scale, g_scale):
            # weight [E, N, K]: its rowwise copy, each expert's transposed as a view, is [E, K, N]
            w_row, w_col, w_scale = _cast(weight, e4m3, w_scale, current)
            out = grouped_mm(x_row, w_row.transpose(-2, -1), x_scale, w_scale, offs, x2d.dtype)
            # the backward reads the columnwise copies, as for a linear
            ctx.save_for_backward(x_col, w_col, offs, x_scale, w_scale, g_scale)
            ctx.dtype = x2d.dtype
            return out

        @staticmethod
        def backward(ctx, grad_out):
            x_col, w_col, offs, x_scale, w_scale, g_scale = ctx.saved_tensors
            g_row, g_col, g_scale = _cast(grad_out.contiguous(), e5m2, g_scale, current)
            # input gradient [T, K] = g [T, N] @ w[e] [N, K] per expert (w's columnwise copy
            # [E, K, N], transposed as a view); weight gradient [E, N, K] = g^T [N, T] @ x [T, K],
            # the tokens grouped by expert (the columnwise copies, x's transposed as a view)
            grad_x = grouped_mm(g_row, w_col.transpose(-2, -1), g_scale, w_scale, offs, ctx.dtype)
            grad_w = grouped_mm(g_col, x_col.t(), g_scale, x_scale, offs, ctx.dtype)
            return grad_x, grad_w, None, None, None, None, None, None

    return _Float8GroupedMatmul


def _torchao_cast(x, dtype, axis: int | None, power_of_2: bool):
    """``hp_tensor_to_float8_dynamic`` of torchao 0.18.0 as eager runs it: the amax over the
    whole tensor (``axis`` None: tensorwise) or along ``axis`` (rowwise), the scale
    (``amax_to_scale``: in float64, rounded down to a power of two for ``rowwise``), the
    scaled, saturated cast; returns the FP8 data (``x``'s layout) and the scale inverse
    ``_scaled_mm`` reads (``float8_ops``: ``a_scale.reciprocal()``)."""
    import torch

    with torch.no_grad():  # a cast has no gradient: the GEMMs' backward is the operands'
        amax = torch.max(torch.abs(x)) if axis is None else torch.amax(torch.abs(x), dim=axis, keepdim=True)
        top = torch.finfo(dtype).max
        scale = (top / torch.clamp(amax.to(torch.float64), min=TORCHAO_EPS)).to(torch.float32)
        if power_of_2:  # _round_scale_down_to_power_of_2
            scale = torch.exp2(torch.floor(torch.log2(scale)))
        data = (x.to(torch.float32) * scale).clamp(min=-top, max=top).to(dtype)
        return data, scale.reciprocal()


def _make_torchao_function(recipe: Fp8Recipe):
    """``matmul_with_hp_or_float8_args`` of torchao 0.18.0 for ``recipe`` (module docstring)."""
    import torch

    e4m3, e5m2 = _float8_dtypes()
    rowwise = recipe is Fp8Recipe.ROWWISE
    grad_dtype = e4m3 if rowwise else e5m2

    def axis(dim: int) -> int | None:
        return dim if rowwise else None

    class _TorchaoFloat8Matmul(torch.autograd.Function):
        """``x @ w.t()`` as torchao's ``Float8Linear`` runs it: casts in the GEMMs' function."""

        @staticmethod
        def forward(ctx, x2d, weight):
            # the input scaled per row, the weight per output feature (its transpose's dim 0):
            # x [M, K] row-major, w^T [K, N] column-major, as _scaled_mm reads them
            x8, x_inv = _torchao_cast(x2d, e4m3, axis(-1), rowwise)
            wt8, w_inv = _torchao_cast(weight.t(), e4m3, axis(0), rowwise)
            out = torch._scaled_mm(x8, wt8, x_inv, w_inv, out_dtype=x2d.dtype, use_fast_accum=True)
            ctx.save_for_backward(x2d, weight)  # the bf16 operands, not their casts
            return out

        @staticmethod
        def backward(ctx, grad_out):
            x2d, weight = ctx.saved_tensors
            g = grad_out.contiguous()
            # input gradient [M, K] = g [M, N] @ w [N, K]: g scaled per row, w^T per K (its
            # dim -1); w's cast is row-major [N, K], which _scaled_mm takes column-major: a copy
            g8, g_inv = _torchao_cast(g, grad_dtype, axis(-1), rowwise)
            wt8, w_inv = _torchao_cast(weight.t(), e4m3, axis(-1), rowwise)
            w8 = wt8.contiguous().t()
            grad_x = torch._scaled_mm(g8, w8, g_inv, w_inv.t(), out_dtype=x2d.dtype)
            # weight gradient [N, K] = g^T [N, M] @ x [M, K], both scaled along M (dim 0) and
            # copied to the layouts _scaled_mm reads (g^T row-major, x column-major)
            gw8, gw_inv = _torchao_cast(g, grad_dtype, axis(0), rowwise)
            xw8, xw_inv = _torchao_cast(x2d, e4m3, axis(0), rowwise)
            grad_w = torch._scaled_mm(
                gw8.t().contiguous(), xw8.t().contiguous().t(), gw_inv.t(), xw_inv, out_dtype=x2d.dtype
            )
            return grad_x, grad_w

    return _TorchaoFloat8Matmul


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


def float8_linear(linear, x, matmul, casts: dict, recipe: Fp8Recipe = Fp8Recipe.DELAYED) -> Any:
    """``linear(x)`` through the FP8 GEMMs of ``matmul`` (``_make_function()``).  The input is
    cast once for every linear that reads it (``casts``, by the input's identity): Megatron-LM
    runs q, k and v as one TE linear (``linear_qkv``), and gate and up (``linear_fc1``), which
    cast their shared input once and keep one FP8 copy of it.  A bias is added after the GEMM
    (TE adds it in the GEMM's epilogue)."""
    import torch

    x2d = x.reshape(-1, x.shape[-1])
    if recipe.runtime == "torchao":  # each Float8Linear casts its own input, in its function
        out = matmul.apply(x2d, _weight(linear))
    else:
        scales = [getattr(linear, name) for name in SCALE_BUFFERS]
        if id(x) not in casts:
            with torch.no_grad():  # an FP8 cast has no gradient: the GEMMs' backward is x's
                cast = _cast(x2d, _float8_dtypes()[0], scales[0], recipe is Fp8Recipe.CURRENT)
                casts[id(x)] = (x, *cast)  # x kept: its id stays its own
        _, x_row, x_col, x_scale = casts[id(x)]
        out = matmul.apply(x2d, _weight(linear), x_row, x_col, x_scale, *scales[1:])
    bias = linear.bias
    out = out.reshape(*x.shape[:-1], out.shape[-1])
    return out if bias is None else out + bias


def _conv1d_class() -> type | None:
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # transformers absent: no such linears
        return None
    return Conv1D


def fp8_linears(model, recipe: Fp8Recipe = Fp8Recipe.DELAYED) -> list[Any]:
    """The linears of ``model`` that ``recipe``'s runtime runs in FP8 (module docstring): TE's
    sizes (rows a multiple of 8, columns of 16), torchao's (both of 16), never the LM head."""
    import torch

    rows = FP8_ROWS if recipe.runtime == "te" else TORCHAO_MULTIPLE
    kinds: tuple[type, ...] = tuple(k for k in (torch.nn.Linear, _conv1d_class()) if k is not None)
    head = getattr(model, "get_output_embeddings", lambda: None)()
    found = []
    for m in model.modules():
        weight = getattr(m, "weight", None)
        if not isinstance(m, kinds) or m is head or not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            continue
        out_features, in_features = _out_in(m)
        if out_features % rows == 0 and in_features % FP8_COLUMNS == 0:
            found.append(m)
    return found


#: The per-expert weights of transformers' experts modules (``integrations/moe.py``,
#: ``grouped_mm_experts_forward``): the first projection (gate and up concatenated, or up alone)
#: and the second, each ``[experts, out, in]`` (``[experts, in, out]`` when ``is_transposed``).
EXPERT_WEIGHTS = ("gate_up_proj", "up_proj", "down_proj")


def fp8_expert_weights(model, recipe: Fp8Recipe = Fp8Recipe.DELAYED) -> list[tuple[Any, str]]:
    """``(experts module, weight name)`` of each batch of per-expert weights that ``recipe``'s
    runtime runs in FP8 (module docstring, "Experts"): TE's recipes only, on transformers'
    experts modules that run ``grouped_mm`` (their ``config._experts_implementation``), each
    expert's weight of TE's FP8 sizes."""
    import torch

    if recipe.runtime != "te":
        return []
    found = []
    for m in model.modules():
        config = getattr(m, "config", None)
        if not hasattr(m, "is_transposed") or getattr(config, "_experts_implementation", None) != "grouped_mm":
            continue
        for name in EXPERT_WEIGHTS:
            weight = getattr(m, name, None)
            if not isinstance(weight, torch.Tensor) or weight.dim() != 3:
                continue
            _experts, rows, columns = weight.shape
            out_features, in_features = (columns, rows) if m.is_transposed else (rows, columns)
            if out_features % FP8_ROWS == 0 and in_features % FP8_COLUMNS == 0:
                found.append((m, name))
    return found


def _expert_scale_names(name: str) -> tuple[str, ...]:
    """The scale buffers (:data:`SCALE_BUFFERS`) of the expert weight ``name``."""
    return tuple(f"{name}_{buffer}" for buffer in SCALE_BUFFERS)


def register_fp8_scales(model, recipe: Fp8Recipe = Fp8Recipe.DELAYED) -> None:
    """Give every linear of :func:`fp8_linears` its scale buffers (:data:`SCALE_BUFFERS`), and
    every expert weight of :func:`fp8_expert_weights` its own, on the device of its weight:
    before the step's buffers are listed.  Delayed scaling reads them; current scaling keeps them
    too (TE's ``fp8_meta``), torchao keeps none."""
    import torch

    if recipe.runtime != "te":
        return
    for m in fp8_linears(model, recipe):
        for name in SCALE_BUFFERS:
            m.register_buffer(name, torch.ones((), dtype=torch.float32, device=m.weight.device))
    for m, weight in fp8_expert_weights(model, recipe):
        for name in _expert_scale_names(weight):
            m.register_buffer(name, torch.ones((), dtype=torch.float32, device=getattr(m, weight).device))


def _float8_grouped_linear(experts: list[tuple[Any, str]], matmul, casts: dict, recipe: Fp8Recipe, bf16_grouped_linear):
    """transformers' ``_grouped_linear`` (``integrations/moe.py``) with the expert weights of
    ``experts`` run through ``matmul`` (:func:`_make_grouped_function`), the input cast once as
    for a linear (:func:`float8_linear`); any other weight (one too small for TE's FP8 GEMM) runs
    ``bf16_grouped_linear``.  The weight is told by its identity: ``functional_call`` puts the
    step's tensor in place, so the module's attribute is the tensor the experts pass."""
    import torch

    def grouped_linear(input, weight, offs, bias=None, is_transposed=False):
        found = next(((m, name) for m, name in experts if getattr(m, name) is weight), None)
        if found is None or not hasattr(found[0], _expert_scale_names(found[1])[0]):
            return bf16_grouped_linear(input, weight, offs, bias=bias, is_transposed=is_transposed)
        scales = [getattr(found[0], name) for name in _expert_scale_names(found[1])]
        if id(input) not in casts:
            with torch.no_grad():  # an FP8 cast has no gradient: the GEMMs' backward is the input's
                cast = _cast(input, _float8_dtypes()[0], scales[0], recipe is Fp8Recipe.CURRENT)
                casts[id(input)] = (input, *cast)
        _, x_row, x_col, x_scale = casts[id(input)]
        out_in = weight.transpose(-2, -1) if is_transposed else weight  # [experts, out, in]
        out = matmul.apply(input, out_in, offs, x_row, x_col, x_scale, *scales[1:])
        return out if bias is None else out + bias

    return grouped_linear


@contextlib.contextmanager
def fp8_linears_patched(model, recipe: Fp8Recipe = Fp8Recipe.DELAYED) -> Iterator[int]:
    """While open, every linear of :func:`fp8_linears` and every expert weight of
    :func:`fp8_expert_weights` (given their scales by :func:`register_fp8_scales`) runs its FP8
    GEMMs as ``recipe`` does; yields how many."""
    matmul = _make_function(recipe)
    casts: dict = {}
    linears = [m for m in fp8_linears(model, recipe) if recipe.runtime != "te" or hasattr(m, SCALE_BUFFERS[0])]
    for m in linears:
        # an instance attribute: ``m(x)`` still runs the module's hooks (its provenance), and
        # reads the weight and scales ``functional_call`` put in place
        m.forward = lambda x, m=m: float8_linear(m, x, matmul, casts, recipe)
    experts = fp8_expert_weights(model, recipe)
    restore: list[tuple[Any, Any]] = []
    if experts:  # the experts' forward calls the module's global: replaced while open
        from transformers.integrations import moe

        restore.append((moe, moe._grouped_linear))
        grouped = _make_grouped_function(recipe)
        moe._grouped_linear = _float8_grouped_linear(experts, grouped, casts, recipe, moe._grouped_linear)
    try:
        yield len(linears) + len(experts)
    finally:
        for m in linears:
            del m.forward
        for owner, bf16_grouped_linear in restore:
            owner._grouped_linear = bf16_grouped_linear
