"""The frontend: a ``MODEL.py`` file -> a traced torch.fx graph -> the ``phaze`` dialect."""

from phaze_ir.frontend.deepen import trace_cut_or_whole, trace_step, trace_step_checked_later
from phaze_ir.frontend.importer import UnknownOpError, import_graph
from phaze_ir.frontend.loader import (
    ModelSpec,
    load_model_file,
    with_eager_attention,
    with_fused_attention,
    with_kernel_attention,
)
from phaze_ir.frontend.trace import TracedGraph, trace_model

__all__ = [
    "ModelSpec",
    "load_model_file",
    "with_eager_attention",
    "with_fused_attention",
    "with_kernel_attention",
    "TracedGraph",
    "trace_model",
    "trace_step",
    "trace_cut_or_whole",
    "trace_step_checked_later",
    "import_graph",
    "UnknownOpError",
]
