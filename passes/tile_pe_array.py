"""``phaze-tile-pe-array``: tile every GEMM onto the accelerator's tensor cores."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from passes.algorithms.tiling import tile_gemm_scalar
from passes.cost_view import matmul_desc, op_signature
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.attributes import TileAttr
from phaze_ir.hardware_ir import module_accelerator


@dataclass(frozen=True)
class TilePEArrayPass(ModulePass):
    """Give every ``phaze.matmul`` a ``phaze.tile`` record: its weight-stationary tiling onto the
    ``pe_x × pe_y`` PE arrays of the module's accelerator (``phaze.target``): tiles along M, N
    and K, cores busy, padding utilization, and compute cycles on one core and split over all
    tensor cores (model: ``passes/algorithms/tiling.py``).  Requires the accelerator; ops with
    equal signatures are tiled once.
    """

    name = "phaze-tile-pe-array"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        acc = module_accelerator(op, self.name)
        done: dict[str, TileAttr] = {}
        for o in op.walk():
            if not isinstance(o, ph.MatmulOp):
                continue
            sig = op_signature(o)
            attr = done.get(sig)
            if attr is None:
                d = matmul_desc(o)
                tc = acc.tensor_cores
                t = tile_gemm_scalar(d.batch, d.m, d.n, d.k, tc.pe_x, tc.pe_y, tc.count, tc.buffer_bytes)
                attr = done[sig] = TileAttr.make(**{f: getattr(t, f) for f in TileAttr.FIELDS})
            o.attributes[keys.TILE] = attr
