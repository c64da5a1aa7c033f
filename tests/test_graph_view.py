"""The graph a function's passes share (passes/graph_view.py ``build_graph``): built once, given
again while nothing it is made from changed, built afresh after any change that could change it.

Checks, on the tiny GPT-2's training step: asked twice, the same graph; after each kind of
change a pass can make (an op's result retyped, an op added, one removed, its phase, its module,
a property, an argument's attributes) a new graph equal to one built on a clone (never the kept
one); an attribute the graph does not read (the layer index) keeps it; signatures asked for
after a build without them are filled in as a fresh build names them; a function that lost a
phase still fails when phases are required, even after a build that did not require them.
The cache is an object of its own (``GraphCache``): nothing is written on the IR, it keeps the
last few functions asked for, and ``cache=None`` builds afresh.
"""

from __future__ import annotations

from dataclasses import asdict

import pytest
from xdsl.dialects.builtin import ArrayAttr, DictionaryAttr, StringAttr, TensorType
from xdsl.rewriter import Rewriter

from passes.graph_view import GraphCache, build_graph, step_function
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.errors import PhazeError


def _fresh(fn):
    """The graph of ``fn`` built from scratch (on a clone, and through no cache)."""
    return build_graph(fn.clone(), cache=None)[0]


def _first(fn, kind):
    return next(op for op in fn.body.block.ops if isinstance(op, kind))


def test_asked_twice_the_same_graph(tiny_gpt2_module):
    fn = step_function(tiny_gpt2_module)
    graph, ops = build_graph(fn)
    again, ops_again = build_graph(fn, require_phase=False, signatures=False)
    assert again is graph and ops_again is ops
    assert asdict(graph) == asdict(_fresh(fn))


def test_an_attribute_it_does_not_read_keeps_it(tiny_gpt2_module):
    fn = step_function(tiny_gpt2_module)
    graph, ops = build_graph(fn)
    ops[0].attributes[keys.LAYER] = ph.int_attr(7)
    assert build_graph(fn)[0] is graph


def _retype(fn):
    op = _first(fn, ph.MatmulOp)
    t = op.results[0].type
    assert isinstance(t, TensorType)
    Rewriter.replace_value_with_new_type(op.results[0], TensorType(t.element_type, [2 * d for d in t.get_shape()]))


def _add(fn):
    op = _first(fn, ph.MatmulOp)
    op.parent_block().insert_op_after(op.clone(), op)


def _remove(fn):
    # the last op before the return reads others and is read by nothing but the return
    block = fn.body.block
    last = block.last_op
    assert last is not None
    victim = last.prev_op
    assert victim is not None and all(use.operation is last for r in victim.results for use in r.uses)
    last.operands = tuple(o for o in last.operands if o not in victim.results)
    victim.detach()
    victim.erase()


def _phase(fn):
    op = _first(fn, ph.MatmulOp)
    op.attributes[keys.PHASE] = StringAttr("bwd" if op.attributes[keys.PHASE].data == "fwd" else "fwd")


def _module(fn):
    _first(fn, ph.MatmulOp).attributes[keys.MODULE] = StringAttr("elsewhere")


def _property(fn):
    op = _first(fn, ph.ElementwiseOp)
    op.properties["aten"] = StringAttr("aten.changed.default")


def _argument(fn):
    attrs = list(fn.arg_attrs.data)
    attrs[0] = DictionaryAttr({})  # the first parameter loses its role
    fn.arg_attrs = ArrayAttr(attrs)


@pytest.mark.parametrize("change", [_retype, _add, _remove, _phase, _module, _property, _argument])
def test_any_change_it_reads_builds_it_again(tiny_gpt2_module, change):
    fn = step_function(tiny_gpt2_module)
    graph, _ = build_graph(fn)
    before = asdict(graph)
    change(fn)
    rebuilt, ops = build_graph(fn)
    assert rebuilt is not graph
    assert asdict(rebuilt) == asdict(_fresh(fn))
    assert asdict(rebuilt) != before
    assert ops == [op for op in fn.body.block.ops if op is not fn.body.block.last_op]


def test_signatures_filled_in_when_asked_for_later(tiny_gpt2_module):
    fn = step_function(tiny_gpt2_module)
    unsigned, _ = build_graph(fn, signatures=False)
    assert all(node.signature == "" for node in unsigned.ops)
    signed, _ = build_graph(fn)
    assert signed is unsigned
    assert [n.signature for n in signed.ops] == [n.signature for n in _fresh(fn).ops]
    assert all(n.signature for n in signed.ops)


def test_a_missing_phase_fails_even_after_a_build_that_allowed_it(tiny_gpt2_module):
    fn = step_function(tiny_gpt2_module)
    del _first(fn, ph.MatmulOp).attributes[keys.PHASE]
    build_graph(fn, require_phase=False)
    with pytest.raises(PhazeError, match="has no 'phaze.phase' attribute"):
        build_graph(fn)


def test_the_cache_writes_nothing_on_the_ir(tiny_gpt2_module):
    fn = step_function(tiny_gpt2_module)
    before = dict(vars(fn))
    build_graph(fn)
    assert vars(fn).keys() == before.keys()


def test_a_cache_of_its_own_and_none(tiny_gpt2_module):
    fn = step_function(tiny_gpt2_module)
    shared, _ = build_graph(fn)
    mine = GraphCache()
    own, _ = build_graph(fn, cache=mine)
    assert own is not shared and build_graph(fn, cache=mine)[0] is own
    fresh, _ = build_graph(fn, cache=None)
    assert fresh is not shared and fresh is not own and asdict(fresh) == asdict(own)


def test_the_cache_keeps_the_last_functions_asked_for(tiny_gpt2_module):
    import gc
    import weakref

    cache = GraphCache(size=2)
    fns = [step_function(tiny_gpt2_module).clone() for _ in range(3)]
    graphs = [build_graph(f, cache=cache)[0] for f in fns]
    assert build_graph(fns[2], cache=cache)[0] is graphs[2]
    assert build_graph(fns[1], cache=cache)[0] is graphs[1]
    again = build_graph(fns[0], cache=cache)[0]  # dropped by the third: built again, the same
    assert again is not graphs[0] and asdict(again) == asdict(graphs[0])
    assert build_graph(fns[1], cache=cache)[0] is graphs[1]
    # A function the cache dropped is not kept alive by it.
    gone = weakref.ref(fns[2])
    del fns[2], graphs[2]
    gc.collect()
    assert gone() is None
    cache.clear()
    assert build_graph(fns[1], cache=cache)[0] is not graphs[1]
