"""``phaze-estimate-latency``: every op's latency on the module's accelerator."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass

from passes.algorithms.latency import MatmulDesc, OpDesc, estimate_chip, fp8_problem
from passes.algorithms.tiling import ScalarTiling
from passes.cost_view import Describer, sum_layer_latencies
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.attributes import LatencyAttr, TileAttr
from phaze_ir.errors import PhazeError
from phaze_ir.hardware_ir import module_accelerator


@dataclass(frozen=True)
class EstimateLatencyPass(ModulePass):
    """Give every compute op and collective a ``phaze.latency`` record (seconds on one core of
    its unit and split over all of them, the unit, what bounds it; see
    ``passes/algorithms/latency.py``) on the module's accelerator (``phaze.target``), and the
    module a ``phaze.layer_latency`` list (per layer of ``phaze.layer``: serial sums of the
    ``split_s`` of its forward, backward and optimizer ops).

    Refused on a module whose latencies later passes have priced further (``phaze.context_parallel``:
    its attentions made rings; ``phaze.tp_overlap``: its TP collectives overlapped): pricing its ops
    again would drop those while the module still says them.

    Requires the accelerator and, on every ``phaze.matmul``, the ``phaze.tile`` that
    ``phaze-tile-pe-array`` wrote for it (read, not recomputed: a tile of PE arrays of another
    shape is refused).  Ops with equal signatures are priced once, and all of them in one call
    of the model the architecture search prices its candidates with
    (:func:`~passes.algorithms.latency.estimate_chip`: this chip is that model's one
    configuration), so that a plan and a search price an op alike by construction.
    """

    name = "phaze-estimate-latency"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        refuse_repricing(op, self.name)
        acc = module_accelerator(op, self.name)
        describe = Describer()
        row_of: dict[str, int] = {}  # signature -> row of the table priced
        descs: list[OpDesc] = []
        tilings: list[ScalarTiling | None] = []
        priced: list[tuple[Operation, int]] = []
        for o in op.walk():
            sig, desc = describe(o)
            if desc is None:
                continue
            tiling = None
            if isinstance(o, ph.MatmulOp):
                tile = keys.require(o, keys.TILE, TileAttr)
                tc = acc.tensor_cores
                fields = tile.as_dict()
                if (fields["pe_x"], fields["pe_y"]) != (tc.pe_x, tc.pe_y) or int(fields["cores"]) > tc.count:
                    raise PhazeError(
                        f"'{o.name}' op has a '{keys.TILE}' of another accelerator than '{acc.name}' "
                        f"({tc.count} tensor cores of {tc.pe_x} x {tc.pe_y}); run phaze-tile-pe-array again"
                    )
                tiling = ScalarTiling(**fields)  # type: ignore[arg-type]  # the record's fields, typed by TileAttr
            if isinstance(desc, MatmulDesc) and desc.a_elem == desc.b_elem == 1 and (why := fp8_problem(acc)):
                raise PhazeError(why)  # an FP8 GEMM (--dtype fp8) on a chip without that rate
            if sig not in row_of:
                row_of[sig] = len(descs)
                descs.append(desc)
                tilings.append(tiling)
            priced.append((o, row_of[sig]))
        latency = estimate_chip(descs, acc, tilings)
        lats = [latency.op(i) for i in range(len(descs))]
        for o, row in priced:
            lat = lats[row]
            o.attributes[keys.LATENCY] = LatencyAttr.make(
                one_s=lat.one_s, split_s=lat.split_s, unit=lat.unit, bound=lat.bound
            )
        sum_layer_latencies(op)


def refuse_repricing(module: ModuleOp, pass_name: str) -> None:
    """A :class:`PhazeError` when ``module``'s latencies carry what a later pass priced on them
    (a context-parallel ring, TP overlap), which pricing the ops again would drop."""
    c = keys.int_of(module, keys.CONTEXT_PARALLEL, 1)
    if c > 1:
        raise PhazeError(
            f"{pass_name}: the module is priced for context parallelism {c} ({keys.CONTEXT_PARALLEL}: its attentions "
            "are rings); pricing its ops again would drop the ring: compile the step again"
        )
    if keys.TP_OVERLAP in module.attributes:
        raise PhazeError(
            f"{pass_name}: the module is priced with TP overlap ({keys.TP_OVERLAP}); pricing its ops again would drop "
            "it: compile the step again"
        )
