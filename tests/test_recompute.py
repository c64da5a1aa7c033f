"""Activation recompute (passes/algorithms/recompute.py), layer memory (passes/algorithms/memory.py)
and phaze-insert-recompute.

Checks: with no recompute the stash is what autograd saves (``#phaze.layer_info`` saved_bytes); full
recompute stashes exactly the layer's input (the previous layer's boundary, the hidden state
``b·s·h`` for a block); selective recompute saves exactly the attention-score tensors
(``b·heads·s²`` elements each) that autograd saves in the block; on the tiny GPT-2 and Llama
and on an example model.  Memory numbers of a tiny model by hand.
"""

from __future__ import annotations

import functools
import math

import pytest
from conftest import EXAMPLES, MODELS, compiled

from passes.algorithms.graph import Graph
from passes.algorithms.memory import LayerMemory, layer_memory, stage_bytes
from passes.algorithms.recompute import analyze_recompute, attention_cores
from passes.graph_view import build_graph, step_function
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.attributes import RecomputePolicy, RecomputePolicyAttr
from phaze_ir.ir import parse_module

# (batch, sequence, hidden, heads) of the tiny models as traced here.  Tiny GPT-2 runs at
# sequence 32: at its own 16 the head dim equals the sequence and Q, K, V would look like scores.
TINY = {"tiny_gpt2": (1, 32, 64, 4), "tiny_llama": (1, 32, 64, 4)}


@functools.cache
def _compiled_seq(model_path: str, seq_len: int) -> str:
    from phaze.tools.phazec import _parser, compile_model

    args = _parser().parse_args([model_path, "--emit", "training", "--seq-len", str(seq_len), "-q"])
    out = compile_model(args, lambda msg: None)
    return out[0] if isinstance(out, tuple) else out


def _analyzed(path: str, emit: str = "training", seq_len: int | None = None):
    module = parse_module(compiled(path, emit) if seq_len is None else _compiled_seq(path, seq_len))
    graph, ops = build_graph(step_function(module))
    layer_of = [o.attributes[keys.LAYER].value.data for o in ops]
    layers = [layer.as_dict() for layer in module.attributes[keys.LAYERS].data]
    return module, graph, ops, layer_of, layers, analyze_recompute(graph, layer_of)


def _score_bytes(ops, layer: int, b: int, heads: int, s: int) -> int:
    """Bytes autograd saves of the layer's b·heads·s² tensors (read off the ops' saved bytes)."""
    total = 0
    for o in ops:
        if o.attributes[keys.LAYER].value.data != layer or keys.SAVED_BYTES not in o.attributes:
            continue
        shapes = [tuple(r.type.get_shape()) for r in o.results]
        if any(sh[-2:] == (s, s) and math.prod(sh) == b * heads * s * s for sh in shapes):
            total += o.attributes[keys.SAVED_BYTES].value.data
    return total


def _check_policies(ops, layers, rcs, b, s, h, heads, elem=2):
    blocks = [layer for layer in layers if layer["kind"] == "block"]
    assert blocks
    for layer, rc in zip(layers, rcs):
        assert rc.none_bytes == layer["saved_bytes"]
        assert rc.full_bytes <= rc.none_bytes or layer["kind"] != "block"
        if layer["kind"] != "block":
            assert not rc.selective_ops and rc.selective_bytes == rc.none_bytes
            continue
        # Full: only the layer's input, the hidden state from the layer before.
        assert rc.full_bytes == layers[layer["index"] - 1]["boundary_bytes"]
        # Selective: the saving is exactly the saved attention scores.
        scores = _score_bytes(ops, layer["index"], b, heads, s)
        assert scores > 0
        assert rc.none_bytes - rc.selective_bytes == scores
    return blocks


@pytest.mark.parametrize("name", sorted(TINY))
def test_policies_on_tiny_models(name):
    b, s, h, heads = TINY[name]
    _, graph, ops, layer_of, layers, rcs = _analyzed(str(MODELS / f"{name}.py"), seq_len=s)
    _check_policies(ops, layers, rcs, b, s, h, heads)
    for layer, rc in zip(layers, rcs):
        if layer["kind"] == "block":
            # GPT-2's block input is the hidden state alone (b·s·h fp16); Llama's also carries
            # the attention mask, which depends on the input ids.
            assert rc.full_bytes >= b * s * h * 2
            names = {ops[i].name for i in rc.selective_ops}
            assert {"phaze.matmul", "phaze.softmax"} <= names
            assert sum(ops[i].name == "phaze.matmul" for i in rc.selective_ops) == 2
            assert all(graph.ops[i].phase == "fwd" and layer_of[i] == layer["index"] for i in rc.selective_ops)
    assert next(rc for layer, rc in zip(layers, rcs) if layer["kind"] == "block").full_bytes == (
        b * s * h * 2 if name == "tiny_gpt2" else b * s * h * 2 + b * s * s * 2
    )


def test_policies_on_an_example():
    # OPT-350M: 24 blocks, hidden 1024, 16 heads, sequence 2048, micro-batch 1.
    _, _, ops, _, layers, rcs = _analyzed(str(EXAMPLES / "opt_350m.py"))
    blocks = _check_policies(ops, layers, rcs, 1, 2048, 1024, 16)
    first = blocks[0]["index"]
    assert rcs[first].full_bytes == 1 * 2048 * 1024 * 2
    # fp32 softmax output and its fp16 copy: 6 bytes per score element.
    assert rcs[first].none_bytes - rcs[first].selective_bytes == 16 * 2048 * 2048 * 6


def test_attention_core_is_found_by_structure():
    # x -> q = x@Wq, k = x@Wk, v = x@Wv; s = q@k; p = softmax(s); o = p@v; y = o@Wo
    g = Graph()
    x = g.add_value(64, role="input")
    w = [g.add_value(32, role="param") for _ in range(4)]

    def mm(a, bb, phase="fwd"):
        i = g.add_op(phase, "attn", [a, bb], [64], signature="phaze.matmul||")
        return i, g.ops[i].results[0]

    _, q = mm(x, w[0])
    _, k = mm(x, w[1])
    _, v = mm(x, w[2])
    s_op, sc = mm(q, k)
    p_op = g.add_op("fwd", "attn", [sc], [64], signature='phaze.softmax|kind="softmax"|')
    pv_op, o = mm(g.ops[p_op].results[0], v)
    mm(o, w[3])
    fwd = list(range(len(g.ops)))
    assert attention_cores(g, fwd) == [[s_op, p_op, pv_op]]


def test_memory_by_hand_on_tiny_gpt2():
    module, graph, ops, layer_of, layers, rcs = _analyzed(str(MODELS / "tiny_gpt2.py"))
    state = {}
    for i, o in enumerate(ops):
        if isinstance(o, ph.OptimizerUpdateOp):
            state[graph.storage(graph.ops[i].operands[0])] = o.state_bytes_total()
    mem = layer_memory(graph, layer_of, rcs, state)
    block = mem[1]
    # A GPT-2 block of width 64: ln_1, ln_2 (2 x 64 each), c_attn 64x192 + 192, c_proj 64x64 + 64,
    # mlp c_fc 64x256 + 256, c_proj 256x64 + 64: 49,984 parameters, fp16.
    n = 2 * 2 * 64 + 64 * 192 + 192 + 64 * 64 + 64 + 64 * 256 + 256 + 256 * 64 + 64
    assert n == 49984
    assert block.param_bytes == block.grad_bytes == 2 * n == layers[1]["param_bytes"]
    assert block.optimizer_bytes == 12 * n  # Adam: fp32 master weight + two fp32 moments
    # Dropout masks count one byte per element (passes/graph_view.py): the two hidden-state
    # masks 2 x 1,024 bytes and the attention mask 4 x 16 x 16 = 1,024 bytes (recomputed, with
    # the rest of the attention core, under selective).
    assert (block.saved_none_bytes, block.saved_selective_bytes, block.saved_full_bytes) == (68736, 68736 - 5120, 2048)
    assert 0 < block.workspace_bytes <= block.recompute_workspace_bytes
    assert block.recompute_workspace_bytes == max(
        block.fwd_peak_bytes, block.bwd_peak_bytes + block.saved_none_bytes - block.saved_full_bytes
    )
    # Stage memory: the placement DP's formula.
    two = mem[1:3]
    assert stage_bytes(two, in_flight=3, policy="full") == (
        2 * (2 * n + 2 * n + 12 * n) + 3 * 2 * 2048 + block.recompute_workspace_bytes
    )


def test_workspace_is_the_largest_live_set():
    # fwd: a = f(x) 100 B, b = g(a) 10 B, c = h(b) 1000 B; a is dead after b; c is saved.
    g = Graph()
    x = g.add_value(8, role="input")
    a = g.add_op("fwd", "", [x], [100])
    b = g.add_op("fwd", "", [g.ops[a].results[0]], [10])
    c = g.add_op("fwd", "", [g.ops[b].results[0]], [1000])
    g.add_op("bwd", "", [g.ops[c].results[0]], [4])
    rcs = analyze_recompute(g, [0, 0, 0, 0])
    assert rcs[0].none_bytes == 1000
    m = layer_memory(g, [0, 0, 0, 0], rcs, {})[0]
    assert m.fwd_peak_bytes == 110  # a and b live together; c is the stash, not workspace
    assert m.bwd_peak_bytes == 4
    assert isinstance(m, LayerMemory) and m.workspace_bytes == 110


def test_pass_marks_the_core_and_annotates_the_module():
    from xdsl.dialects.builtin import StringAttr

    from passes.insert_recompute import InsertRecomputePass
    from passes.schedule_ops import ScheduleOpsPass
    from phaze_ir.attributes import LayerMemoryAttr, LayerRecomputeAttr
    from phaze_ir.ir import make_context, print_module

    module = parse_module(compiled(str(MODELS / "tiny_gpt2.py"), "latency"))
    ScheduleOpsPass(time_limit=2.0).apply(make_context(), module)
    InsertRecomputePass(optimizer="sgd").apply(make_context(), module)
    recs = [r.as_dict() for r in module.attributes["phaze.layer_recompute"].data]
    mems = [r.as_dict() for r in module.attributes["phaze.layer_memory"].data]
    scheds = [r.as_dict() for r in module.attributes["phaze.layer_schedule"].data]
    assert all(isinstance(r, LayerRecomputeAttr) for r in module.attributes["phaze.layer_recompute"].data)
    assert all(isinstance(r, LayerMemoryAttr) for r in module.attributes["phaze.layer_memory"].data)
    # The attention core: scores, probabilities and a 1-byte dropout mask.
    assert recs[1]["none_bytes"] - recs[1]["selective_bytes"] == 5120
    assert recs[1]["full_s"] == scheds[1]["fwd_s"]
    assert 0 < recs[1]["selective_s"] < recs[1]["full_s"]
    assert recs[0]["selective_s"] == 0.0
    assert mems[1]["optimizer_bytes"] == 2 * mems[1]["param_bytes"]  # SGD: 4 bytes per fp16 element
    marked = [
        o for o in module.walk() if o.attributes.get(keys.RECOMPUTE) == RecomputePolicyAttr(RecomputePolicy.SELECTIVE)
    ]
    assert len(marked) == 24 and all(o.attributes["phaze.phase"] == StringAttr("fwd") for o in marked)
    text = print_module(module)
    assert print_module(parse_module(text)) == text


def test_pass_requires_the_schedule():
    from passes.insert_recompute import InsertRecomputePass
    from phaze_ir.errors import PhazeError
    from phaze_ir.ir import make_context

    module = parse_module(compiled(str(MODELS / "tiny_gpt2.py"), "latency"))
    with pytest.raises(PhazeError, match="requires 'phaze.layer_schedule'.*run phaze-schedule-ops first"):
        InsertRecomputePass().apply(make_context(), module)
