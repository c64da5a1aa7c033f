"""``phaze-overlap-tensor-parallel``: mark the TP all-gathers and reduce-scatters as overlapped with
the GEMMs beside them, as Transformer Engine's userbuffers run them (``phaze-estimate-latency``
prices them so)."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import ModuleOp, UnitAttr
from xdsl.ir import BlockArgument, Operation, SSAValue
from xdsl.passes import ModulePass

from passes.algorithms.tp_overlap import added_s, method_of
from passes.cost_view import refuse_priced
from passes.graph_view import arg_role, step_function
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.attributes import LatencyAttr
from phaze_ir.errors import PhazeError
from phaze_ir.hardware_ir import module_accelerator

#: How far through views and pointwise ops a collective's GEMMs are looked for (the casts,
#: reshapes and residual adds between a TP collective and its linear).
_REACH = 4
#: The collectives TE overlaps (an all-reduce without sequence parallelism is not overlapped).
_OVERLAPPED = ("all_gather", "reduce_scatter")


@dataclass(frozen=True)
class OverlapTensorParallelPass(ModulePass):
    """Mark each TP all-gather and reduce-scatter of a step sharded with sequence parallelism as
    run beside its GEMMs (those that read its result, for an all-gather; those whose output it
    reduces, for a reduce-scatter; through views and pointwise ops), by Transformer Engine's
    method for it: the module gets ``phaze.tp_overlap``, which ``phaze-estimate-latency`` reads
    to price each such collective at what it adds to those GEMMs, each GEMM hiding at most its
    own time once, in program order (:func:`overlap_latencies`; rules and sources in
    ``passes/algorithms/tp_overlap.py``).

    Run before ``phaze-estimate-latency`` (it says how the collectives run; that pass prices
    them): a module whose ops are priced already is refused. Needs the chip's SM count
    (``[calibration] wave_units``: TE's communication kernels hold some of them) and a step
    sharded with sequence parallelism."""

    name = "phaze-overlap-tensor-parallel"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if keys.TP_OVERLAP in op.attributes:
            raise PhazeError(
                f"{self.name}: the module is priced with TP overlap already: compile the step again to price it without"
            )
        tp = keys.int_of(op, keys.TP_WIDTH, 1)
        if tp == 1:
            return
        if keys.SEQUENCE_PARALLEL not in op.attributes:
            raise PhazeError(
                f"{self.name}: TP overlap runs on sequence parallelism's all-gathers and reduce-scatters; the step "
                "is sharded without it (phaze-shard-tensor-parallel{sequence_parallel=true})"
            )
        sm_count(module_accelerator(op, self.name), self.name)
        refuse_priced(op, self.name)
        op.attributes[keys.TP_OVERLAP] = UnitAttr()


def overlap_latencies(module: ModuleOp, acc, pass_name: str) -> list[tuple[Operation, dict[str, float | str]]]:
    """Each overlapped TP collective of a module marked ``phaze.tp_overlap`` whose ops
    ``phaze-estimate-latency`` has priced, with its new ``phaze.latency`` fields: what it adds
    to the GEMMs beside it (:func:`overlapped`) by Transformer Engine's method on the chip's
    SMs, each GEMM hiding at most its own time once (in program order); what
    ``phaze-estimate-latency`` writes."""
    tp = keys.int_of(module, keys.TP_WIDTH, 1)
    sms = sm_count(acc, pass_name)
    budget: dict[int, float] = {}  # seconds of each GEMM not yet hiding a collective
    out: list[tuple[Operation, dict[str, float | str]]] = []
    for o, method, gemms in overlapped(step_function(module)):
        beside = 0.0
        for g in gemms:
            beside += budget.setdefault(id(g), _split(g))
        lat = keys.require(o, keys.LATENCY, LatencyAttr).as_dict()
        comm = float(lat["split_s"])
        added = added_s(method, comm, beside, tp, sms)
        hidden = comm - added if added < comm else 0.0
        for g in gemms:  # the time it hid is no longer free beside these GEMMs
            take = min(budget[id(g)], hidden)
            budget[id(g)] -= take
            hidden -= take
        out.append((o, {"one_s": added, "split_s": added, "unit": str(lat["unit"]), "bound": str(lat["bound"])}))
    return out


def overlapped(fn: func.FuncOp) -> list[tuple[ph.CollectiveOp, str, list[ph.MatmulOp]]]:
    """Each TP all-gather and reduce-scatter of the step ``fn``, in program order, with
    Transformer Engine's method for it and the GEMMs beside it (those that read its result, for
    an all-gather; those whose output it reduces, for a reduce-scatter): what the pass overlaps,
    and what the ``--hw`` sweep's settings record of it (``phaze/search/setting.py``)."""
    params = {fn.body.block.args[i] for i in range(len(fn.body.block.args)) if arg_role(fn, i)[0] == "param"}
    out = []
    for o in fn.body.block.ops:
        if not (isinstance(o, ph.CollectiveOp) and o.kind.data in _OVERLAPPED):
            continue
        gather = o.kind.data == "all_gather"
        gemms = _gemms(o, forward=gather)
        phase = keys.string_of(o, keys.PHASE, "fwd")
        feeds = gather and any(_reads_weight(g, params) for g in gemms)
        out.append((o, method_of(o.kind.data, phase, feeds), gemms))
    return out


def sm_count(acc, pass_name: str) -> int:
    """The chip's SMs (``[calibration] wave_units``), or a one-line error without them."""
    units = acc.calibration.wave_units if acc.calibration is not None else None
    if not units:
        raise PhazeError(
            f"{pass_name}: chip '{acc.name}' has no SM count ([calibration] wave_units): TP overlap is priced by "
            "the SMs Transformer Engine's communication kernels hold"
        )
    return int(units)


def _split(o: Operation) -> float:
    return float(keys.require(o, keys.LATENCY, LatencyAttr).as_dict()["split_s"])


def _passes_through(o: Operation) -> bool:
    """A view or a pointwise op between a collective and its GEMM."""
    return isinstance(o, (ph.LayoutOp, ph.ElementwiseOp))


def _gemms(c: ph.CollectiveOp, forward: bool) -> list[ph.MatmulOp]:
    """The GEMMs an all-gather's result reaches (``forward``), or that reach a reduce-scatter's
    operand, through at most :data:`_REACH` views and pointwise ops."""
    found: list[ph.MatmulOp] = []
    frontier: list[SSAValue] = list(c.results) if forward else list(c.operands)
    seen: set[int] = set()
    for _ in range(_REACH + 1):
        nxt: list[SSAValue] = []
        for v in frontier:
            nearby = [u.operation for u in v.uses] if forward else [v.owner]
            for o in nearby:
                if not isinstance(o, Operation) or id(o) in seen:
                    continue
                seen.add(id(o))
                if isinstance(o, ph.MatmulOp):
                    found.append(o)
                elif _passes_through(o):
                    nxt += list(o.results) if forward else list(o.operands)
        frontier = nxt
    return found


def _reads_weight(g: ph.MatmulOp, params: set) -> bool:
    """Whether the GEMM multiplies by a weight (an input-gradient or forward GEMM, not a
    weight-gradient one): an operand that is a parameter, through views."""
    for v in (g.lhs, g.rhs):
        for _ in range(_REACH + 1):
            if isinstance(v, BlockArgument):
                if v in params:
                    return True
                break
            owner = v.owner
            if not isinstance(owner, ph.LayoutOp) or not owner.operands:
                break
            v = owner.operands[0]
    return False
