"""``phaze-estimate-energy``: every op's energy on the module's accelerator, and each layer's."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, ModuleOp
from xdsl.passes import ModulePass

from passes.algorithms.context_parallel import off_diagonal_gemm
from passes.algorithms.energy import (
    OpEnergy,
    clocked_energy,
    estimate_energy,
    layer_energies,
    power_headroom_w,
    ring_energy,
)
from passes.algorithms.latency import MatmulDesc, VectorDesc, op_columns, op_overhead_s
from passes.algorithms.recompute import parse_selective
from passes.algorithms.tiling import ScalarTiling
from passes.cost_view import Describer
from passes.graph_view import build_graph, read_layers, step_function
from passes.how_ops_run import attention_kernels
from passes.recompute_view import static_costs
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.attributes import EnergyAttr, LatencyAttr, LayerEnergyAttr, TileAttr
from phaze_ir.errors import PhazeError
from phaze_ir.files import excerpt
from phaze_ir.hardware_ir import module_accelerator


@dataclass(frozen=True)
class EstimateEnergyPass(ModulePass):
    """Give every compute op and collective a ``phaze.energy`` record (joules of one execution
    on one device, by where they go; ``passes/algorithms/energy.py``) on the module's
    accelerator, and the module a ``phaze.layer_energy`` list (per layer: its forward and
    backward per micro-batch, its optimizer per step, its recomputation under each policy).

    Under a power limit with ``[energy] clock_energy_exponent`` > 0, a GEMM's or vector op's
    die energy is what it spends at the clock the limit leaves it (its ``phaze.latency``'s
    ``split_s``: ``energy.clocked_energy``, docs/energy.md), so those ops need their latency.

    Under context parallelism (``phaze.context_parallel`` = c, ``phaze-context-parallel``) each
    op of a fused attention kernel spends what its ring's c steps do (``energy.ring_energy``:
    the op once, its off-diagonal twin c − 1 times), at the ring's time its latency holds.

    Requires the accelerator, its ``[energy]`` table, the layers (``phaze-group-layers``) and,
    on every ``phaze.matmul``, its ``phaze.tile`` (read, as ``phaze-estimate-latency`` reads
    it).  A module whose accelerator has no ``[energy]`` table is refused with the reason.
    """

    name = "phaze-estimate-energy"
    #: what the selective recompute policy re-runs, as ``phaze-insert-recompute``'s option of the
    #: same name (``Options.selective_recompute``): its ``selective_j`` prices those ops
    selective: str = "attention"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        acc = module_accelerator(op, self.name)
        if acc.energy is None:
            raise PhazeError(
                f"{self.name}: hardware '{acc.name}' has no [energy] table (energy per MAC, per byte "
                "of each memory level, static power per mm^2); add one to price energy and power"
            )
        clocked = power_headroom_w(acc) is not None and acc.energy.clock_energy_exponent > 0
        graph, ops = build_graph(step_function(op))
        layer_of = read_layers(ops)
        describe = Describer()
        # Under context parallelism each fused attention's ops run as a ring of c steps
        # (phaze-context-parallel): c steps' work, at the ring's time (their latencies).
        c = keys.int_of(op, keys.CONTEXT_PARALLEL, 1)
        ring = {id(o) for group in attention_kernels(op).values() for o in group} if c > 1 else set()
        # Ops with equal signatures (and, in a ring, equal times) are priced once and share one
        # record (attributes are immutable).
        priced: dict[object, tuple[OpEnergy, EnergyAttr]] = {}
        energies: list[OpEnergy] = []
        for o in ops:
            sig, desc = describe(o)
            if desc is None:
                energies.append(OpEnergy())
                continue
            in_ring = id(o) in ring
            on_clock = clocked and isinstance(desc, MatmulDesc | VectorDesc)
            split = float(keys.require(o, keys.LATENCY, LatencyAttr).as_dict()["split_s"]) if on_clock else 0.0
            key = (sig, split) if in_ring else sig
            if key not in priced:
                tiling = None
                if isinstance(o, ph.MatmulOp):
                    tile = keys.require(o, keys.TILE, TileAttr)
                    tiling = ScalarTiling(**tile.as_dict())  # type: ignore[arg-type]  # the record's fields
                e = estimate_energy(desc, acc, tiling)
                if in_ring:
                    twin = off_diagonal_gemm(desc) if isinstance(desc, MatmulDesc) else None
                    e = ring_energy(e, e if twin is None else estimate_energy(twin, acc), c)
                if on_clock and isinstance(desc, MatmulDesc | VectorDesc):
                    unit = "tensor" if isinstance(desc, MatmulDesc) else "vector"
                    overhead = op_overhead_s(op_columns(desc), unit, acc.calibration) * (c if in_ring else 1)
                    e = clocked_energy(e, split, overhead, acc)
                priced[key] = (e, EnergyAttr.make(**vars(e)))
            e, record = priced[key]
            energies.append(e)
            o.attributes[keys.ENERGY] = record
        phases = [g.phase for g in graph.ops]
        # The ops the selective policy re-runs, as phaze-insert-recompute finds them (the same
        # analysis and option), so the power limit prices the recompute the plan runs.
        try:
            policy = parse_selective(self.selective)
        except ValueError as err:
            raise PhazeError(f"{self.name}: selective={excerpt(self.selective)}: {err}") from None
        _, rc_ops, _, recompute, _ = static_costs(op, "", self.name, policy)
        at = {id(o): i for i, o in enumerate(ops)}
        selective = {rc.index: [at[id(rc_ops[i])] for i in rc.selective_ops] for rc in recompute}
        op.attributes[keys.LAYER_ENERGY] = ArrayAttr(
            [LayerEnergyAttr.make(**vars(le)) for le in layer_energies(layer_of, phases, energies, selective)]
        )
