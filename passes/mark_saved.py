"""``phaze-mark-saved``: mark the forward tensors that autograd saves for backward."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from passes.algorithms.saved import saved_bytes_per_op
from passes.graph_view import build_graph, step_function
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.errors import PhazeError


@dataclass(frozen=True)
class MarkSavedPass(ModulePass):
    """Annotate every forward op whose results backward reads with ``phaze.saved_bytes``
    (bytes of those results; a view used by backward keeps its base storage alive, so the
    base op is marked).  Requires a training graph (``phazec --emit training``).
    """

    name = "phaze-mark-saved"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        fn = step_function(op)
        graph, ops = build_graph(fn, signatures=False)
        if not any(o.phase == "bwd" for o in graph.ops):
            raise PhazeError(f"{self.name}: the step has no backward ops; import it with phazec --emit training")
        for o in ops:
            o.attributes.pop(keys.SAVED_BYTES, None)
        for index, nbytes in sorted(saved_bytes_per_op(graph).items()):
            ops[index].attributes[keys.SAVED_BYTES] = ph.int_attr(nbytes)
