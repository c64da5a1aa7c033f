"""Which ``phaze`` op each aten op becomes.

Keyed by the aten overload *packet* name (``aten.mul.Tensor`` -> ``"mul"``); in-place variants
(``div_``) map like their functional twins, because the traced graph is used as SSA: every
in-place node yields the value that later nodes read.  An aten op missing here becomes
``phaze.opaque`` with a warning (an error under ``--strict``); add it here to give it semantics.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import MappingProxyType

# packet -> elementwise kind
ELEMENTWISE: dict[str, str] = {
    "add": "add",
    "sub": "sub",
    "rsub": "sub",
    "mul": "mul",
    "div": "div",
    "neg": "neg",
    "abs": "abs",
    "maximum": "max",
    "minimum": "min",
    "pow": "pow",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "exp": "exp",
    "log": "log",
    "tanh": "tanh",
    "sigmoid": "sigmoid",
    "erf": "erf",
    "sin": "sin",
    "cos": "cos",
    "gelu": "gelu",
    "silu": "silu",
    "relu": "relu",
    "reciprocal": "div",
    "square": "mul",
    "log1p": "log",
    "expm1": "exp",
    "exp2": "exp",
    "log2": "log",
    "floor": "relu",  # one compare-and-select an element (torchao's power-of-two scales)
    "gelu_backward": "gelu_grad",
    "tanh_backward": "tanh_grad",
    "sigmoid_backward": "sigmoid_grad",
    "silu_backward": "silu_grad",
    "threshold_backward": "relu_grad",
    "eq": "compare",
    "ne": "compare",
    "lt": "compare",
    "le": "compare",
    "gt": "compare",
    "ge": "compare",
    "where": "where",
    "logical_not": "logical",
    "logical_and": "logical",
    "logical_or": "logical",
    "bitwise_not": "logical",
    "bitwise_and": "logical",
    "bitwise_or": "logical",
    "clamp": "clamp",
    "clamp_min": "clamp",
    "clamp_max": "clamp",
    "masked_fill": "masked_fill",
    "_to_copy": "convert",
    "to": "convert",
    "type_as": "convert",
    "copy": "copy",
    "lift_fresh_copy": "copy",
    "fill": "fill",
    "zero": "fill",
    "zeros": "fill",
    "ones": "fill",
    "full": "fill",
    "empty": "fill",
    "zeros_like": "fill",
    "ones_like": "fill",
    "full_like": "fill",
    "empty_like": "fill",
    "new_zeros": "fill",
    "new_ones": "fill",
    "new_empty": "fill",
    "new_full": "fill",
    "scalar_tensor": "fill",
    "empty_strided": "fill",
    "new_empty_strided": "fill",
    "arange": "arange",
    "bernoulli": "random",
    "rand": "random",
    "randn": "random",
    "rand_like": "random",
    "randn_like": "random",
    "uniform": "random",
    "floor_divide": "div",
    "native_dropout_backward": "dropout",
    "nll_loss_backward": "nll_loss_grad",
}

# packet -> reduction kind
REDUCTION: dict[str, str] = {
    "sum": "sum",
    "mean": "mean",
    "amax": "max",
    "amin": "min",
    "max": "max",
    "min": "min",
    "prod": "prod",
    "argmax": "argmax",
    "var": "var",
    "var_mean": "var",
    "linalg_vector_norm": "norm",
    "nll_loss_forward": "nll_loss",
    "any": "any",
    "all": "all",
    "cumsum": "sum",
}

# packet -> layout kind (views alias storage; the rest copy)
LAYOUT: dict[str, str] = {
    "view": "view",
    "_unsafe_view": "view",
    "reshape": "reshape",
    "t": "transpose",
    "transpose": "transpose",
    "permute": "permute",
    "expand": "expand",
    "squeeze": "squeeze",
    "unsqueeze": "unsqueeze",
    "slice": "slice",
    "select": "select",
    "alias": "alias",
    "split": "split",
    "split_with_sizes": "split",
    "unbind": "unbind",
    "as_strided": "as_strided",
    "detach": "detach",
    "diagonal": "diagonal",
    "clone": "clone",
    "contiguous": "clone",
    "cat": "cat",
    "stack": "stack",
    "constant_pad_nd": "pad",
    "index": "index",
    "gather": "gather",
    "scatter": "scatter",
    "scatter_add": "scatter",
    "index_put": "scatter",
    "index_select": "index",
    "repeat": "repeat",
    "flip": "flip",
    "roll": "roll",
    "tril": "tril",
    "triu": "triu",
    "slice_backward": "zero_pad",
    "select_backward": "zero_pad",
    "slice_scatter": "scatter",
    "select_scatter": "scatter",
    "new_zeros_like": "zero_pad",
}

#: ``_scaled_mm``: an FP8 GEMM (its operands, then their scales: scalars its epilogue reads)
MATMUL = {"mm", "bmm", "addmm", "baddbmm", "_scaled_mm"}
SOFTMAX = {
    "_softmax": "softmax",
    "softmax": "softmax",
    # SDPA's math path (a fully masked row gives 0, not NaN): the same softmax for pricing
    "_safe_softmax": "softmax",
    "_log_softmax": "log_softmax",
    "log_softmax": "log_softmax",
    "_softmax_backward_data": "softmax_grad",
    "_log_softmax_backward_data": "log_softmax_grad",
}
NORM = {
    "native_layer_norm": "layer_norm",
    "native_layer_norm_backward": "layer_norm_grad",
    "_fused_rms_norm": "rms_norm",
    "_fused_rms_norm_backward": "rms_norm_grad",
    "native_group_norm": "group_norm",
    "native_group_norm_backward": "group_norm_grad",
    "native_batch_norm": "batch_norm",
    "_native_batch_norm_legit": "batch_norm",
    "_native_batch_norm_legit_functional": "batch_norm",
    "native_batch_norm_backward": "batch_norm_grad",
}
EMBEDDING = {"embedding": "lookup", "embedding_dense_backward": "grad", "embedding_backward": "grad"}
# Fused attention kernels: expanded into matmul/softmax semantics (see importer._attention).
FUSED_ATTENTION = {
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_cudnn_attention_backward",
    # phaze's causal kernel with a sliding window and/or sinks (frontend/kernel_attention.py)
    "window_attention",
    "window_attention_backward",
}
# GEMMs that are expanded into views and phaze.matmul (see importer._grouped_mm, _convolution):
# a grouped GEMM over experts as a batched matmul with per-expert weights (torch's, or
# Transformer Engine's on FP8 operands: phaze::fp8_grouped_mm, float8_linear.py), a convolution
# as an implicit GEMM per group.
GROUPED_MM = {"_grouped_mm", "fp8_grouped_mm"}
CONVOLUTION = {"convolution", "_convolution"}
CONVOLUTION_BACKWARD = {"convolution_backward"}
# Selections along one dim (MoE routing: top-k experts, sort by expert, tokens per expert):
# phaze.reduction of that kind over that dim (histc over every element).
SELECTION = {"topk": "topk", "sort": "sort", "histc": "histc"}
# Dropout that torch keeps as one op: treated as elementwise (mask generation and scaling).
DROPOUT = {"native_dropout": "dropout"}

#: The importer's dispatch: which of its builders (``importer.BUILDERS``, by name) makes the
#: phaze op of an aten op in each table above.  Ordered: a packet in two tables gets the first
#: one's builder.  A builder may decline (an elementwise op with several results, a grouped
#: GEMM of a form it does not know): the op is then ``phaze.opaque``, as is an op in no table.
DISPATCH: tuple[tuple[str, Collection[str]], ...] = (
    ("matmul", MATMUL),
    ("softmax", SOFTMAX),
    ("norm", NORM),
    ("embedding", EMBEDDING),
    ("reduction", REDUCTION),
    ("dropout", DROPOUT),
    ("attention", FUSED_ATTENTION),
    ("grouped_mm", GROUPED_MM),
    ("convolution", CONVOLUTION),
    ("convolution_backward", CONVOLUTION_BACKWARD),
    ("selection", SELECTION),
    ("elementwise", ELEMENTWISE),
    ("layout", LAYOUT),
)


def _builder_of() -> Mapping[str, str]:
    """Packet -> builder name, the first table of :data:`DISPATCH` that has the packet winning
    (one lookup per traced node instead of a test per table)."""
    out: dict[str, str] = {}
    for builder, packets in DISPATCH:
        for packet in packets:
            out.setdefault(packet, builder)
    return MappingProxyType(out)


#: Packet -> the name of the importer's builder for it: read-only, derived from :data:`DISPATCH`
#: once, at import (an entry added to a table at run time is not seen; add it in this file).
BUILDER_OF: Mapping[str, str] = _builder_of()


def packet_name(target) -> str:
    """``aten.mul.Tensor`` -> ``"mul"``; in-place ``div_`` -> ``"div"``."""
    name = getattr(target, "_opname", None) or getattr(target, "__name__", str(target)).split(".")[0]
    if name.endswith("_") and not name.endswith("__") and name not in ("_",):
        name = name[:-1]
    return name


def aten_name(target) -> str:
    """The full aten name kept on ops, e.g. ``"aten.mul.Tensor"``."""
    return str(target)
