"""``phaze-estimate-latency``: every op's latency on the module's accelerator."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, Float64Type, FloatAttr, IntegerAttr, ModuleOp, i64
from xdsl.ir import Operation
from xdsl.passes import ModulePass

from passes.algorithms.latency import MatmulDesc, OpDesc, estimate_chip, fp8_problem
from passes.algorithms.tiling import ScalarTiling
from passes.cost_view import Describer, sum_layer_latencies
from passes.how_ops_run import layer_flops, overlap_latencies, ring_latencies
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.attributes import LatencyAttr, LayerFlopsAttr, TileAttr
from phaze_ir.errors import PhazeError
from phaze_ir.hardware_ir import module_accelerator


@dataclass(frozen=True)
class EstimateLatencyPass(ModulePass):
    """Give every compute op and collective a ``phaze.latency`` record (seconds on one core of
    its unit and split over all of them, the unit, what bounds it; see
    ``passes/algorithms/latency.py``) on the module's accelerator (``phaze.target``), and the
    module a ``phaze.layer_latency`` list (per layer of ``phaze.layer``: serial sums of the
    ``split_s`` of its forward, backward and optimizer ops) and a ``phaze.layer_flops`` list
    (per layer, the FLOPs its ops run as they run: :func:`~passes.how_ops_run.layer_flops`).

    Each op is priced as it runs, which the passes before it say on the module (this pass is
    the one writer of ``phaze.latency``, ``phaze.layer_latency``, ``phaze.layer_flops`` and
    ``phaze.cp_ring``):
    ``phaze.context_parallel = c`` (``phaze-context-parallel``): every fused attention a ring of
    c steps (:func:`~passes.how_ops_run.ring_latencies`; the module gets ``phaze.cp_ring``);
    ``phaze.tp_overlap`` (``phaze-overlap-tensor-parallel``): each sequence-parallel TP
    all-gather and reduce-scatter at what it adds to the GEMMs beside it
    (:func:`~passes.how_ops_run.overlap_latencies`), after the rings.  Running it
    again prices the module again, to the same figures.

    Requires the accelerator and, on every ``phaze.matmul``, the ``phaze.tile`` that
    ``phaze-tile-pe-array`` wrote for it (read, not recomputed: a tile of PE arrays of another
    shape is refused).  Ops with equal signatures are priced once, and all of them in one call
    of the model the architecture search prices its candidates with
    (:func:`~passes.algorithms.latency.estimate_chip`: this chip is that model's one
    configuration), so that a plan and a search price an op alike by construction.
    """

    name = "phaze-estimate-latency"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
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
        c = keys.int_of(op, keys.CONTEXT_PARALLEL, 1)
        ring: dict[str, float] | None = None
        if c > 1:
            ring, kv, scaled = ring_latencies(op, acc, c)
            for o, new in scaled:
                o.attributes[keys.LATENCY] = LatencyAttr.make(**new)
        if keys.TP_OVERLAP in op.attributes:
            for o, new in overlap_latencies(op, acc, self.name):
                o.attributes[keys.LATENCY] = LatencyAttr.make(**new)
        sum_layer_latencies(op)
        flops = layer_flops(op)
        keys.put(op, keys.LAYER_FLOPS, ArrayAttr([LayerFlopsAttr.make(**d) for d in flops]) if flops else None)
        ring_attr = None
        if ring is not None:
            ring_attr = DictionaryAttr(
                {k: FloatAttr(v, Float64Type()) for k, v in ring.items()} | {"kv_bytes": IntegerAttr(kv, i64)}
            )
        keys.put(op, keys.CP_RING, ring_attr)
