"""``phaze-shard-tensor-parallel``: one device's share of a training step under Megatron-style
tensor parallelism."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects import func
from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    FunctionType,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    TensorType,
    UnitAttr,
    i64,
)
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter

from passes.algorithms.layers import analyze_layers
from passes.algorithms.tp_shard import ShardError, ShardPlan, TGraph, TOp, shard
from passes.graph_view import arg_role, build_graph, step_function
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.attributes import LayerInfoAttr, ReplicatedLinearsAttr
from phaze_ir.errors import PhazeError
from phaze_ir.warning import ReplicatedLinearsWarning


def _layers(module: ModuleOp, fn: func.FuncOp, ops: list[Operation]) -> tuple[list[int], list[tuple[str, str]]]:
    """Layer of every op and (kind, module) of every layer: from ``phaze-group-layers``'s
    attributes when present, else from its algorithm."""
    records = module.attributes.get(keys.LAYERS)
    if isinstance(records, ArrayAttr) and all(keys.LAYER in o.attributes for o in ops):
        kinds = [(str(r.get("kind")), str(r.get("module"))) for r in records.data if isinstance(r, LayerInfoAttr)]
        return [keys.require(o, keys.LAYER, IntegerAttr).value.data for o in ops], kinds
    graph, _ = build_graph(fn, require_phase=False)
    layer_of, infos = analyze_layers(graph)
    return layer_of, [(i.kind, i.module) for i in infos]


def build_tgraph(module: ModuleOp, fn: func.FuncOp) -> tuple[TGraph, list[SSAValue], list[Operation]]:
    """The algorithm's graph of ``fn``, its values (index = value id) and ops (the last one is
    the ``func.return``)."""
    block = fn.body.block
    ops = list(block.ops)
    ret = ops[-1]
    if not isinstance(ret, func.ReturnOp):
        raise PhazeError("phaze-shard-tensor-parallel: the step function does not end with func.return")
    layer_of, layers = _layers(module, fn, ops[:-1])
    g = TGraph(
        layers=layers,
        micro_batch=keys.int_of(module, keys.MICRO_BATCH_SIZE, 1),
        seq_len=keys.int_of(module, keys.SEQ_LEN, 0),
    )
    values: list[SSAValue] = []
    ids: dict[SSAValue, int] = {}
    params: dict[str, int] = {}

    def add(v: SSAValue, role: str = "", producer: int = -1) -> int:
        if not isinstance(v.type, TensorType):
            raise PhazeError(f"phaze-shard-tensor-parallel: value of type {v.type} is not a ranked tensor")
        ids[v] = g.add_value(v.type.get_shape(), role, producer)
        values.append(v)
        return ids[v]

    for i, arg in enumerate(block.args):
        role, name = arg_role(fn, i)
        vid = add(arg, role)
        if role == "param":
            params[name] = vid
    for index, op in enumerate(ops[:-1]):
        operands = [ids[o] for o in op.operands]
        props = op.properties
        kind = props.get("kind")
        aten = props.get("aten")
        dims = props.get("dims")
        dim = props.get("dim")
        nrank = props.get("normalized_rank")
        g.ops.append(
            _top(
                op,
                operands,
                [add(r, producer=index) for r in op.results],
                kind.data if isinstance(kind, StringAttr) else "",
                aten.data if isinstance(aten, StringAttr) else "",
                tuple(dims.get_values()) if isinstance(dims, DenseArrayBase) else (),
                dim.value.data if isinstance(dim, IntegerAttr) else 0,
                nrank.value.data if isinstance(nrank, IntegerAttr) else 1,
                keys.string_of(op, keys.PHASE) or "fwd",
                layer_of[index],
                keys.string_of(op, keys.MODULE),
            )
        )
    roles, rparams = [], []
    res_attrs = fn.res_attrs.data if fn.res_attrs is not None else [None] * len(ret.operands)
    for attrs in res_attrs:
        d = attrs.data if attrs is not None else {}
        role, param = "", -1
        if keys.LOSS in d:
            role = "loss"
        for key, r in ((keys.GRAD, "grad"), (keys.UPDATED, "updated")):
            source = d.get(key)
            if isinstance(source, StringAttr):
                role, param = r, params.get(source.data, -1)
        roles.append(role)
        rparams.append(param)
    g.ops.append(
        _top(
            ret,
            [ids[o] for o in ret.operands],
            [],
            "",
            "",
            (),
            0,
            1,
            "",
            0,
            "",
            name="return",
            roles=roles,
            rparams=rparams,
        )
    )
    return g, values, ops


def _top(op, operands, results, kind, aten, dims, dim, nrank, phase, layer, module, name=None, roles=(), rparams=()):
    scales = op.attributes.get(keys.FP8_SCALES)
    return TOp(
        name or op.name.removeprefix("phaze."),
        kind,
        operands,
        results,
        phase=phase,
        layer=layer,
        module=module,
        aten=aten,
        dims=dims,
        dim=dim,
        normalized_rank=nrank,
        result_roles=list(roles),
        result_params=list(rparams),
        fp8_rowwise=isinstance(scales, StringAttr) and scales.data == "rowwise",
    )


def _provenance(src: Operation, new: Operation) -> None:
    for key in keys.PROVENANCE:  # (its layer: phaze-group-layers, run again on the sharded step)
        if key in src.attributes:
            new.attributes[key] = src.attributes[key]


_SUFFIX = {"all_reduce": "ar", "reduce_scatter": "rs", "all_gather": "ag"}


def _collective(
    kind: str, value: SSAValue, width: int, src: Operation, shape: tuple[int, ...] | None = None
) -> ph.CollectiveOp:
    """A ``phaze.collective`` of ``kind`` over ``width`` devices on ``value``, with the result
    shape ``shape`` (default: ``value``'s) and the provenance of ``src``."""
    assert isinstance(value.type, TensorType)
    rtype = value.type if shape is None else TensorType(value.type.element_type, shape)
    op = ph.CollectiveOp.build(
        operands=[value],
        result_types=[rtype],
        properties={"kind": StringAttr(kind), "group_size": IntegerAttr(width, i64)},
    )
    _provenance(src, op)
    if value.name_hint:
        op.result.name_hint = f"{value.name_hint}_{_SUFFIX[kind]}"
    return op


def _all_reduce(value: SSAValue, width: int, src: Operation) -> ph.CollectiveOp:
    return _collective("all_reduce", value, width, src)


def _apply_gathers(
    block: Block,
    plan: ShardPlan,
    graph: TGraph,
    values: list[SSAValue],
    scattered: dict[int, SSAValue],
    ops: list[Operation],
) -> list[Operation]:
    """Insert the all-gathers of sequence parallelism (whole shape) and re-run the views between
    a gathered storage and its readers on the whole value.  Returns the views this may have left
    without users."""
    orphans: list[Operation] = []
    for ga in plan.gathers:
        at = ops[ga.before_op]
        src = scattered[ga.value] if ga.reduced else values[ga.value]
        new = _collective("all_gather", src, plan.width, at, graph.values[ga.value].shape)
        block.insert_op_before(new, at)
        last: Operation = new
        clones: dict[tuple[int, ...], SSAValue] = {(): new.result}
        for j, k, chain in ga.uses:
            for n in range(1, len(chain) + 1):
                if chain[:n] in clones:
                    continue
                view = ops[chain[n - 1]]
                res = view.results[0]
                assert isinstance(view, ph.LayoutOp) and isinstance(res.type, TensorType)
                whole = graph.values[graph.ops[chain[n - 1]].results[0]].shape
                clone = ph.LayoutOp.build(
                    operands=[[clones[chain[: n - 1]]]],
                    result_types=[[TensorType(res.type.element_type, whole)]],
                    properties=dict(view.properties),
                    attributes=dict(view.attributes),
                )
                _provenance(at, clone)
                if res.name_hint:
                    clone.results[0].name_hint = f"{res.name_hint}_ag"
                block.insert_op_after(clone, last)
                last = clone
                clones[chain[:n]] = clone.results[0]
            ops[j].operands[k] = clones[chain]
            orphans.extend(ops[p] for p in reversed(chain))
    return orphans


def _erase_unused(orphans: list[Operation]) -> None:
    changed = True
    while changed:
        changed = False
        for view in orphans:
            if view.parent is not None and all(not r.uses for r in view.results):
                view.detach()
                view.erase()
                changed = True


def apply_plan(fn: func.FuncOp, plan: ShardPlan, graph: TGraph, values: list[SSAValue], ops: list[Operation]) -> None:
    """Rewrite ``fn`` as ``plan`` says: local types, all-reduces (reduce-scatters and
    all-gathers under sequence parallelism), softmax statistics."""
    values = list(values)
    for vid, shape in sorted(plan.shapes.items()):
        v = values[vid]
        assert isinstance(v.type, TensorType)  # build_tgraph took only ranked tensors
        values[vid] = Rewriter.replace_value_with_new_type(v, TensorType(v.type.element_type, shape))
    block = fn.body.block
    last_after: dict[int, Operation] = {}
    scattered: dict[int, SSAValue] = {}
    for red in plan.all_reduces:
        producer = ops[red.after_op]
        if red.scatter is None:
            new = _all_reduce(values[red.value], plan.width, ops[red.source_op])
        else:
            new = _collective("reduce_scatter", values[red.value], plan.width, ops[red.source_op], red.scatter_shape)
            scattered[red.value] = new.result
        if red.per_step:
            first = ops[min(j for j, _ in red.uses)]
            new.attributes[keys.PHASE] = StringAttr("opt")
            if keys.MODULE in first.attributes:
                new.attributes[keys.MODULE] = first.attributes[keys.MODULE]
            block.insert_op_before(new, first)
        else:
            block.insert_op_after(new, last_after.get(red.after_op, producer))
            last_after[red.after_op] = new
        for j, k in red.uses:
            ops[j].operands[k] = new.result
    orphans = _apply_gathers(block, plan, graph, values, scattered, ops)
    for pad in plan.pads:
        v = values[pad.value]
        assert isinstance(v.type, TensorType)
        producer = ops[pad.after_op]
        padded = ph.LayoutOp.build(
            operands=[[v]],
            result_types=[[TensorType(v.type.element_type, graph.values[pad.value].shape)]],
            properties={"kind": StringAttr("zero_pad"), "aten": StringAttr("aten.slice_backward.default")},
        )
        _provenance(producer, padded)
        if v.name_hint:
            padded.results[0].name_hint = f"{v.name_hint}_pad"
        block.insert_op_after(padded, last_after.get(pad.after_op, producer))
        last_after[pad.after_op] = padded
        for j, k in pad.uses:
            ops[j].operands[k] = padded.results[0]
    for stat in plan.stats:
        at = ops[stat.before_op]
        v = values[stat.value]
        assert isinstance(v.type, TensorType)
        stat_op = ph.ReductionOp.build(
            operands=[[v]],
            result_types=[[TensorType(v.type.element_type, stat.shape)]],
            properties={
                "kind": StringAttr(stat.kind),
                "dims": DenseArrayBase.from_list(i64, [stat.dim]),
                "aten": StringAttr("aten.amax.default" if stat.kind == "max" else "aten.sum.dim_IntList"),
            },
        )
        _provenance(at, stat_op)
        if v.name_hint:
            stat_op.results[0].name_hint = f"{v.name_hint}_{stat.kind}"
        block.insert_op_before(stat_op, at)
        block.insert_op_before(_all_reduce(stat_op.results[0], plan.width, at), at)
    _erase_unused(orphans)
    ret = block.last_op
    assert isinstance(ret, func.ReturnOp)
    fn.function_type = FunctionType.from_lists([a.type for a in block.args], [o.type for o in ret.operands])


def _say_replicated(module: ModuleOp, plan: ShardPlan) -> None:
    """The linears left replicated where Megatron would shard them: one warning line each, and
    one ``#phaze.replicated_linears`` record each in the module's ``phaze.tp_replicated``, which
    the plan's JSON lists after the importer's ``phaze.warnings``."""
    records = []
    for note in plan.replicated:
        warnings.warn(note.message, ReplicatedLinearsWarning, stacklevel=3)
        records.append(
            ReplicatedLinearsAttr.make(
                reason=note.reason,
                width=plan.width,
                count=note.count,
                total=note.total,
                module=note.module,
                flops_share=note.flops_share,
                param_share=note.param_share,
            )
        )
    module.attributes.pop(keys.TP_REPLICATED, None)
    if records:
        module.attributes[keys.TP_REPLICATED] = ArrayAttr(records)


@dataclass(frozen=True)
class ShardTensorParallelPass(ModulePass):
    """Rewrite a training step into what ONE device of a Megatron tensor-parallel group of
    ``width`` devices runs: column-parallel QKV and first MLP GEMMs, row-parallel attention
    output and second MLP GEMMs, attention heads split, vocabulary-parallel embedding and LM
    head (padded to a multiple of ``vocab_multiple * width`` rows), a ``phaze.collective
    "all_reduce"`` wherever a partial sum meets a consumer that needs it whole (Megatron's f/g:
    two per block forward, two backward), and the vocabulary-parallel cross-entropy's small
    all-reduces.  Parameter arguments, gradients and optimizer updates of split weights get
    their local types.  The structure is found by sharding propagation, never from names:
    ``passes/algorithms/tp_shard.py`` runs the driver (``tp_propagation.py``) with one rule per
    op kind (``tp_rules.py``'s ``RULES``); this pass builds its graph and applies its plan.

    At a width above 1 it drops ``phaze.saved_bytes``, ``phaze.layer`` and ``phaze.layers``
    (they counted the whole step): run ``phaze-mark-saved`` and ``phaze-group-layers`` after it
    for one device's bytes and FLOPs (the fixed pipeline does).  The module gets
    ``phaze.tp_width``.  A collective's bytes are its operand's type.
    ``width=1`` changes nothing but ``phaze.tp_width``.  A width that does not divide the
    attention heads or a column-parallel linear's output size is refused, and so is one that
    neither divides nor is a multiple of the key/value heads of grouped-query attention (as
    Megatron-core refuses it); with fewer key/value heads than the width the k and v
    projections stay replicated (docs/design.md §5.2).  Linears left replicated where Megatron
    would shard them are said (``PhazeWarning``) and recorded as ``#phaze.replicated_linears``
    in the module's ``phaze.tp_replicated``.

    ``sequence_parallel=true`` (Megatron-SP, Korthikanti et al. 2022): what lies between a
    row-parallel output and the next column-parallel input (dropout, residual adds, norms) runs
    on ``s/width`` tokens per device: each partial activation is reduce-scattered
    (``phaze.collective "reduce_scatter"``) instead of all-reduced, and the column-parallel
    GEMMs (and any other op that needs the whole) read an ``"all_gather"``; in backward the
    mirror (all-gather of the output gradient before the row-parallel GEMMs, reduce-scatter of
    the column-parallel input gradient) plus the re-gather of each column-parallel input for its
    weight gradient, so that only the split input is saved.  Needs ``phaze.seq_len`` on the
    module, divisible by the width.  At a width above 1 the module gets
    ``phaze.sequence_parallel``.
    """

    name = "phaze-shard-tensor-parallel"
    width: int = 1
    vocab_multiple: int = 128
    sequence_parallel: bool = False

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.width < 1:
            raise PhazeError(f"{self.name}: width={self.width}: expected a positive integer")
        if self.vocab_multiple < 1:
            raise PhazeError(f"{self.name}: vocab_multiple={self.vocab_multiple}: expected a positive integer")
        fn = step_function(op)
        if keys.TP_WIDTH in op.attributes:
            raise PhazeError(f"{self.name}: the step is already sharded")
        if self.width > 1:
            graph, values, ops = build_tgraph(op, fn)
            try:
                plan = shard(graph, self.width, self.vocab_multiple, self.sequence_parallel)
            except ShardError as e:
                raise PhazeError(f"{self.name}: {e}") from None
            _say_replicated(op, plan)
            apply_plan(fn, plan, graph, values, ops)
            # What phaze-mark-saved and phaze-group-layers wrote counted the whole step's bytes
            # and FLOPs: drop it; the pipeline runs those passes again on the sharded step.
            for o in fn.body.block.ops:
                o.attributes.pop(keys.SAVED_BYTES, None)
                o.attributes.pop(keys.LAYER, None)
            op.attributes.pop(keys.LAYERS, None)
        op.attributes[keys.TP_WIDTH] = ph.int_attr(self.width)
        if self.sequence_parallel and self.width > 1:
            op.attributes[keys.SEQUENCE_PARALLEL] = UnitAttr()
