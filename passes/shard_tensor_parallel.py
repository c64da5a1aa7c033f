"""``phaze-shard-tensor-parallel``: one device's share of a training step under Megatron-style
tensor parallelism."""

from __future__ import annotations

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
    i64,
)
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter

from passes.algorithms.layers import analyze_layers
from passes.algorithms.tp_shard import ShardError, ShardPlan, TGraph, TOp, shard
from passes.graph_view import arg_role, build_graph, step_function
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.attributes import LayerInfoAttr
from phaze_ir.errors import PhazeError


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
    g = TGraph(layers=layers, micro_batch=keys.int_of(module, keys.MICRO_BATCH_SIZE, 1))
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
    )


def _provenance(src: Operation, new: Operation) -> None:
    for key in (keys.PHASE, keys.MODULE, keys.LAYER):
        if key in src.attributes:
            new.attributes[key] = src.attributes[key]


def _all_reduce(value: SSAValue, width: int, src: Operation) -> ph.CollectiveOp:
    op = ph.CollectiveOp.build(
        operands=[value],
        result_types=[value.type],
        properties={"kind": StringAttr("all_reduce"), "group_size": IntegerAttr(width, i64)},
    )
    _provenance(src, op)
    if value.name_hint:
        op.result.name_hint = f"{value.name_hint}_ar"
    return op


def apply_plan(fn: func.FuncOp, plan: ShardPlan, values: list[SSAValue], ops: list[Operation]) -> None:
    """Rewrite ``fn`` as ``plan`` says: local types, all-reduces, softmax statistics."""
    values = list(values)
    for vid, shape in sorted(plan.shapes.items()):
        v = values[vid]
        assert isinstance(v.type, TensorType)  # build_tgraph took only ranked tensors
        values[vid] = Rewriter.replace_value_with_new_type(v, TensorType(v.type.element_type, shape))
    block = fn.body.block
    last_after: dict[int, Operation] = {}
    for red in plan.all_reduces:
        producer = ops[red.after_op]
        new = _all_reduce(values[red.value], plan.width, ops[red.source_op])
        block.insert_op_after(new, last_after.get(red.after_op, producer))
        last_after[red.after_op] = new
        for j, k in red.uses:
            ops[j].operands[k] = new.result
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
    ret = block.last_op
    assert isinstance(ret, func.ReturnOp)
    fn.function_type = FunctionType.from_lists([a.type for a in block.args], [o.type for o in ret.operands])


@dataclass(frozen=True)
class ShardTensorParallelPass(ModulePass):
    """Rewrite a training step into what ONE device of a Megatron tensor-parallel group of
    ``width`` devices runs: column-parallel QKV and first MLP GEMMs, row-parallel attention
    output and second MLP GEMMs, attention heads split, vocabulary-parallel embedding and LM
    head (padded to a multiple of ``vocab_multiple * width`` rows), a ``phaze.collective
    "all_reduce"`` wherever a partial sum meets a consumer that needs it whole (Megatron's f/g:
    two per block forward, two backward), and the vocabulary-parallel cross-entropy's small
    all-reduces.  Parameter arguments, gradients and optimizer updates of split weights get
    their local types.  The structure is found by sharding propagation (see
    ``passes/algorithms/tp_shard.py``), never from names.

    At a width above 1 it drops ``phaze.saved_bytes``, ``phaze.layer`` and ``phaze.layers``
    (they counted the whole step): run ``phaze-mark-saved`` and ``phaze-group-layers`` after it
    for one device's bytes and FLOPs (the fixed pipeline does).  The module gets
    ``phaze.tp_width``.  A collective's bytes are its operand's type.
    ``width=1`` changes nothing but ``phaze.tp_width``.  A width that does not divide the
    attention heads or a column-parallel linear's output size is refused.
    """

    name = "phaze-shard-tensor-parallel"
    width: int = 1
    vocab_multiple: int = 128

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
                plan = shard(graph, self.width, self.vocab_multiple)
            except ShardError as e:
                raise PhazeError(f"{self.name}: {e}") from None
            apply_plan(fn, plan, values, ops)
            # What phaze-mark-saved and phaze-group-layers wrote counted the whole step's bytes
            # and FLOPs: drop it; the pipeline runs those passes again on the sharded step.
            for o in fn.body.block.ops:
                o.attributes.pop(keys.SAVED_BYTES, None)
                o.attributes.pop(keys.LAYER, None)
            op.attributes.pop(keys.LAYERS, None)
        op.attributes[keys.TP_WIDTH] = ph.int_attr(self.width)
