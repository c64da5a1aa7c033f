"""An example out-of-tree pass for phaze.

``count-ops{op="phaze.matmul"}`` counts the ops named ``op`` in the step and writes the count
on the module as ``count_ops.<op>`` (an integer attribute), and per layer as
``count_ops.per_layer`` when ``phaze-group-layers`` has run.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, IntegerAttr, ModuleOp, i64
from xdsl.passes import ModulePass
from xdsl.universe import Universe


@dataclass(frozen=True)
class CountOpsPass(ModulePass):
    """Count the ops named ``op`` (default ``phaze.matmul``), in total and per layer."""

    name = "count-ops"
    op: str = "phaze.matmul"

    def apply(self, ctx: Context, module: ModuleOp) -> None:
        per_layer: dict[int, int] = {}
        total = 0
        for o in module.walk():
            if o.name != self.op:
                continue
            total += 1
            layer = o.attributes.get("phaze.layer")
            if isinstance(layer, IntegerAttr):
                per_layer[layer.value.data] = per_layer.get(layer.value.data, 0) + 1
        module.attributes[f"count_ops.{self.op}"] = IntegerAttr(total, i64)
        if per_layer:
            n = max(per_layer) + 1
            module.attributes["count_ops.per_layer"] = ArrayAttr(
                [IntegerAttr(per_layer.get(i, 0), i64) for i in range(n)]
            )


UNIVERSE = Universe(all_passes={"count-ops": lambda: CountOpsPass})
