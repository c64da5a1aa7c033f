"""``phaze-group-layers``: find the layers (prologue, repeated blocks, head) of a step."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, ModuleOp
from xdsl.passes import ModulePass

from passes.algorithms.layers import analyze_layers
from passes.graph_view import build_graph, step_function
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.attributes import LayerInfoAttr


@dataclass(frozen=True)
class GroupLayersPass(ModulePass):
    """Give every op a ``phaze.layer`` index and the module a ``phaze.layers`` list of
    ``#phaze.layer_info`` records (kind, source module, structural class ``same_as``, parameter,
    saved-activation and boundary bytes, FLOPs per phase).  Blocks come from the module
    hierarchy (the integer-indexed children holding the most forward ops), identical blocks
    from a structural hash.  Requires ``phaze.phase``/``phaze.module`` from the importer.
    """

    name = "phaze-group-layers"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        fn = step_function(op)
        graph, ops = build_graph(fn)
        layer_of, infos = analyze_layers(graph)
        for o, layer in zip(ops, layer_of):
            o.attributes[keys.LAYER] = ph.int_attr(layer)
        op.attributes[keys.LAYERS] = ArrayAttr([LayerInfoAttr.make(**vars(i)) for i in infos])
