"""Build the xDSL-free :class:`passes.algorithms.graph.Graph` of a ``phaze`` function.

The algorithms in ``passes/algorithms`` work on that light graph; passes use this module to
make it from the IR and keep the op list to write results back.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from dataclasses import dataclass

from xdsl.dialects import func
from xdsl.dialects.builtin import IntegerAttr, StringAttr, TensorType
from xdsl.ir import Operation, SSAValue

from passes.algorithms.graph import Graph
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.errors import PhazeError


def step_function(module) -> func.FuncOp:
    """The module's one step function (``@train_step`` or ``@forward``)."""
    fns = [op for op in module.ops if isinstance(op, func.FuncOp)]
    if len(fns) != 1:
        raise PhazeError(f"expected exactly one func.func in the module, found {len(fns)}")
    return fns[0]


def arg_role(fn: func.FuncOp, index: int) -> tuple[str, str]:
    """(role, source name) of argument ``index``: role is param/buffer/input or ""."""
    if fn.arg_attrs is None:
        return "", ""
    attrs = fn.arg_attrs.data[index].data
    for role, key in keys.ARG_ROLES.items():
        a = attrs.get(key)
        if isinstance(a, StringAttr):
            return role, a.data
    return "", ""


def _element_bytes(t) -> int:
    """Bytes of one element of a tensor type (0 when it is not one, or not known)."""
    try:
        return ph.element_bytes(t.element_type) if isinstance(t, TensorType) else 0
    except ValueError:
        return 0


def _is_float(t) -> bool:
    return isinstance(t, TensorType) and not type(t.element_type).__name__.startswith("Integer")


def op_signature(op: Operation) -> str:
    """What an op does, without where it came from: name, properties and result types."""
    props = ",".join(f"{k}={ph.attr_text(v)}" for k, v in sorted(op.properties.items()))
    return f"{op.name}|{props}|{','.join(ph.attr_text(r.type) for r in op.results)}"


def _is_dropout_mask(op: Operation, masks: set[SSAValue]) -> bool:
    """Whether ``op`` makes a dropout mask: a Bernoulli draw, or the draw scaled by a constant
    (``div_``/``mul`` whose only operands are masks).  The trace decomposes ``native_dropout``
    into these ops on the activation's dtype, but eager PyTorch (``native_dropout``) and
    Megatron's fused kernels keep the mask as one byte per element: the graph counts it so."""
    if not isinstance(op, ph.ElementwiseOp):
        return False
    kind = op.kind.data
    if kind == "random":
        return op.aten.data.startswith("aten.bernoulli")
    return kind in ("div", "mul") and bool(op.operands) and all(o in masks for o in op.operands)


def _expert_gemm_experts(op: Operation, graph: Graph, ids: dict[SSAValue, int], params: dict[int, SSAValue]) -> int:
    """The experts of an expert GEMM, 0 for any other op: a ``phaze.matmul`` whose right
    operand is batched (rank 3) and a view of a parameter (the per-expert weights of an MoE
    layer, ``aten._grouped_mm`` expanded by the importer), or of an FP8 copy of it
    (``Graph.cast_source``); the parameter's leading dimension."""
    if not isinstance(op, ph.MatmulOp) or len(op.operands) < 2:
        return 0
    rhs = op.operands[1]
    if len(ph.tensor_type(rhs).get_shape()) != 3:
        return 0
    param = params.get(graph.cast_source(ids[rhs]))
    if param is None:
        return 0
    shape = ph.tensor_type(param).get_shape()
    return shape[0] if len(shape) == 3 else 0


@dataclass
class _Kept:
    """A graph built from ``fn`` and what it was built from (:func:`_inputs`), held so that no
    object among them can be freed and its identity taken by a new one while the entry lives."""

    inputs: list[object]
    graph: Graph
    ops: list[Operation]
    phased: bool  # every op had a phaze.phase
    signed: bool  # the graph's ops carry their signatures


def _inputs(fn: func.FuncOp) -> list[object]:
    """Every IR object the graph of ``fn`` is made from, in order: the argument attributes and
    types, and each op with its operands, results, result types, phase and module attributes
    and properties (names and values).  IR attributes are immutable, so an unchanged list of
    identities is an unchanged graph; any pass that rewrites, adds, removes, reorders or
    retypes an op, or gives it another phase, module or property, changes it."""
    block = fn.body.block
    inputs: list[object] = [fn.arg_attrs, *block.args, *(a.type for a in block.args)]
    add = inputs.extend
    for op in block.ops:
        attrs, props, results = op.attributes, op.properties, op.results
        add((op, attrs.get(keys.PHASE), attrs.get(keys.MODULE), *op.operands, *results))
        add((*[r.type for r in results], *props, *props.values()))
    return inputs


def _same(a: list[object], b: list[object]) -> bool:
    """Whether two input lists hold the very same objects, in order."""
    return len(a) == len(b) and all(map(operator.is_, a, b))


class GraphCache:
    """An analysis cache: the light graph of a function, given again while nothing it was
    built from changed (a pipeline asks for it eight times, and most passes only write
    attributes it does not read: a third of GPT-3 175B's pipeline went to building it again).

    **Invalidation rule.**  An entry is given again only while every IR object the graph is
    made from (:func:`_inputs`) is the very object it was built from, compared with ``is``; the
    entry holds them, so none can be freed and its place taken.  Any change a pass can make
    that the graph reads (an op rewritten, added, removed, reordered or retyped, another phase,
    module, property or argument attribute) replaces one of them, and the graph is built again;
    no pass needs to say what it changed.  A hit is therefore the graph a fresh build would give
    (``tests/test_graph_view.py`` checks each kind of change against a build on a clone).

    **Lifetime.**  The last ``size`` functions asked for, the least recently asked dropped
    first: the passes of a pipeline ask for their function's graph one after the other, and a
    process compiling many modules (a sweep, a search) keeps only the last few alive.

    :data:`GRAPHS` is the one :func:`build_graph` uses by default; its answers never differ from
    a build's, only its time."""

    def __init__(self, size: int = 4):
        self.size = size
        self._kept: OrderedDict[func.FuncOp, _Kept] = OrderedDict()  # an op hashes by identity

    def graph(self, fn: func.FuncOp, require_phase: bool, signatures: bool) -> tuple[Graph, list[Operation]]:
        """:func:`build_graph` through the cache."""
        inputs = _inputs(fn)
        kept = self._kept.get(fn)
        if kept is not None and _same(kept.inputs, inputs) and (kept.phased or not require_phase):
            self._kept.move_to_end(fn)
            if signatures and not kept.signed:
                for node, op in zip(kept.graph.ops, kept.ops):
                    node.signature = op_signature(op)
                kept.signed = True
            return kept.graph, kept.ops
        graph, ops, phased = _build(fn, require_phase, signatures)
        self._kept.pop(fn, None)
        self._kept[fn] = _Kept(inputs, graph, ops, phased, signatures)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)
        return graph, ops

    def clear(self) -> None:
        """Forget every graph (and let the functions they were built from go)."""
        self._kept.clear()


#: The graphs :func:`build_graph` keeps (see :class:`GraphCache` for when one is given again).
GRAPHS = GraphCache()


def build_graph(
    fn: func.FuncOp, require_phase: bool = True, signatures: bool = True, cache: GraphCache | None = GRAPHS
) -> tuple[Graph, list[Operation]]:
    """The light graph of ``fn`` and its ops (index i of the graph is ``ops[i]``).  A dropout
    mask counts one byte per element (:func:`_is_dropout_mask`).  ``signatures=False`` may
    leave every op's ``signature`` empty, for callers that neither group layers nor read op
    kinds (naming every op is a fifth of the build).

    The graph comes from ``cache`` while nothing it was built from changed (:class:`GraphCache`;
    None: built afresh), so it may be shared: read it, do not change it."""
    if cache is None:
        return _build(fn, require_phase, signatures)[:2]
    return cache.graph(fn, require_phase, signatures)


def _build(fn: func.FuncOp, require_phase: bool, signatures: bool) -> tuple[Graph, list[Operation], bool]:
    """:func:`build_graph` from scratch, and whether every op had a phase."""
    graph = Graph()
    ids: dict[SSAValue, int] = {}
    masks: set[SSAValue] = set()
    params: dict[int, SSAValue] = {}
    for i, arg in enumerate(fn.body.block.args):
        role, name = arg_role(fn, i)
        ids[arg] = graph.add_value(ph.tensor_bytes(arg.type), role=role, name=name, is_float=_is_float(arg.type))
        if role == "param":
            params[ids[arg]] = arg
    ops: list[Operation] = []
    phased = True
    for op in fn.body.block.ops:
        if isinstance(op, func.ReturnOp):
            continue
        phase = op.attributes.get(keys.PHASE)
        if not isinstance(phase, StringAttr):
            if require_phase:
                raise PhazeError(f"'{op.name}' op has no '{keys.PHASE}' attribute; import the model with phazec first")
            phased = False
        experts = _expert_gemm_experts(op, graph, ids, params)
        is_mask = _is_dropout_mask(op, masks)
        if is_mask:
            masks.update(op.results)
        index = graph.add_op(
            keys.string_of(op, keys.PHASE, "fwd"),
            keys.string_of(op, keys.MODULE),
            [ids[o] for o in op.operands],
            [ph.numel(r.type) if is_mask else ph.tensor_bytes(r.type) for r in op.results],
            flops=op.flops() if isinstance(op, ph.ComputeOp) else 0,
            signature=op_signature(op) if signatures else "",
            view=isinstance(op, ph.LayoutOp) and op.is_view,
            result_float=[_is_float(r.type) for r in op.results],
            experts=experts,
            result_element_bytes=[_element_bytes(r.type) for r in op.results],
        )
        for r, v in zip(op.results, graph.ops[index].results):
            ids[r] = v
        ops.append(op)
    return graph, ops, phased


def read_layers(ops: list[Operation]) -> list[int]:
    """The ``phaze.layer`` of every op (written by ``phaze-group-layers``)."""
    return [keys.require(o, keys.LAYER, IntegerAttr).value.data for o in ops]


#: The aten names (overload aside) the importer gives the views and copies an expert GEMM
#: expands into: torch's, or Transformer Engine's on FP8 operands (``float8_linear.py``).
_GROUPED_MM = ("aten._grouped_mm", "phaze.fp8_grouped_mm")


def _grouped_source(v: SSAValue) -> SSAValue | None:
    """The operand of an ``aten._grouped_mm`` that ``v`` was cut from by the importer's
    expansion (its views and copies keep that aten name), None when ``v`` is not."""
    found = None
    while isinstance(v.owner, ph.LayoutOp) and v.owner.aten.data.startswith(_GROUPED_MM) and v.owner.operands:
        v = v.owner.operands[0]
        found = v
    return found


def grouped_key(o: ph.MatmulOp, ids: dict[SSAValue, int]) -> str:
    """The ``aten._grouped_mm`` an expert GEMM is part of, as the ids of the two values it was
    expanded from ("" for any other matmul): the parts of one uneven split share it."""
    sources = [_grouped_source(v) for v in (o.lhs, o.rhs)]
    if all(s is None for s in sources):
        return ""
    return ",".join(str(ids[s if s is not None else v]) for s, v in zip(sources, (o.lhs, o.rhs)))
