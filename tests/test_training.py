"""The training-graph analyses: saved activations, layers, optimizer step (algorithms on
hand-made graphs, and the passes on traced models)."""

from __future__ import annotations

import pytest
from conftest import MODELS, compiled

from passes.algorithms.graph import Graph
from passes.algorithms.layers import analyze_layers, find_block_container
from passes.algorithms.saved import saved_bytes_per_op
from passes.graph_view import step_function
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.attributes import LayerInfoAttr


def two_block_graph() -> Graph:
    """x -> embed -> block0 -> block1 -> loss, and a backward through both blocks."""
    g = Graph()
    x = g.add_value(64, role="input")
    w_e = g.add_value(100, role="param")
    w0 = g.add_value(400, role="param")
    w1 = g.add_value(400, role="param")
    mask = g.add_op("fwd", "", [], [4096], signature="fill")  # no input: rematerializable
    e = g.add_op("fwd", "embed", [w_e, x], [128], signature="emb")
    h0 = g.add_op("fwd", "blocks.0", [g.ops[e].results[0], w0, g.ops[mask].results[0]], [128], signature="mm")
    h1 = g.add_op("fwd", "blocks.1", [g.ops[h0].results[0], w1, g.ops[mask].results[0]], [128], signature="mm")
    loss = g.add_op("fwd", "", [g.ops[h1].results[0]], [4], signature="loss")
    dl = g.add_op("bwd", "", [g.ops[loss].results[0], g.ops[h1].results[0]], [128], signature="loss_bwd")
    d1 = g.add_op("bwd", "blocks.1", [g.ops[dl].results[0], g.ops[h0].results[0], w1], [128, 400], signature="mm_bwd")
    g.add_op("bwd", "blocks.0", [g.ops[d1].results[0], g.ops[e].results[0], w0], [128, 400], signature="mm_bwd")
    return g


def test_block_container_and_layers():
    g = two_block_graph()
    assert find_block_container(g) == "blocks"
    layer_of, infos = analyze_layers(g)
    assert [i.kind for i in infos] == ["prologue", "block", "block", "head"]
    assert [i.module for i in infos] == ["", "blocks.0", "blocks.1", ""]
    assert infos[2].same_as == 1  # identical blocks share a class
    assert layer_of[-1] == 1 and layer_of[-2] == 2 and layer_of[-3] == 3  # backward follows forward modules
    # The mask depends on no input: it crosses no cut.  The hidden state (128 B) crosses each.
    assert [i.boundary_bytes for i in infos] == [128, 128, 128, 0]
    assert [i.grad_boundary_bytes for i in infos] == [128, 128, 128, 0]
    # Backward of block 1 reads block 0's output (saved where it is read); params are not saved.
    assert infos[2].saved_bytes == 128 and infos[1].saved_bytes == 128
    assert infos[3].saved_bytes == 4 + 128  # the loss and the last hidden state
    assert infos[1].param_bytes == 400 and infos[0].param_bytes == 100


def test_saved_bytes_resolve_views_to_storage():
    g = Graph()
    x = g.add_value(64, role="input")
    a = g.add_op("fwd", "m", [x], [64], signature="exp")
    v = g.add_op("fwd", "m", [g.ops[a].results[0]], [64], signature="view", view=True)
    g.add_op("bwd", "m", [g.ops[v].results[0]], [64], signature="exp_bwd")
    assert saved_bytes_per_op(g) == {a: 64}


def test_no_blocks_gives_single_layer():
    g = Graph()
    x = g.add_value(8, role="input")
    g.add_op("fwd", "lin", [x], [8])
    _, infos = analyze_layers(g)
    assert len(infos) == 1 and infos[0].kind == "prologue"


@pytest.fixture(scope="module")
def mlp_module():
    from phaze_ir.ir import parse_module

    return parse_module(compiled(str(MODELS.parent.parent / "examples" / "mlp.py")))


def layers_of(module) -> list[dict]:
    return [a.as_dict() for a in module.attributes[keys.LAYERS].data]


def test_mlp_layers(mlp_module):
    layers = layers_of(mlp_module)
    assert [layer["kind"] for layer in layers] == ["prologue", "block", "block", "block", "block", "head"]
    assert {layer["same_as"] for layer in layers if layer["kind"] == "block"} == {1}
    h, b = 256, 1
    block = layers[1]
    # Linear(256,1024) + Linear(1024,256) + LayerNorm(256), fp16.
    assert block["param_bytes"] == 2 * (h * 4 * h + 4 * h + 4 * h * h + h + 2 * h)
    assert block["fwd_flops"] > 0 and block["bwd_flops"] > 1.9 * block["fwd_flops"] - 1
    assert block["boundary_bytes"] == b * h * 2
    fn = step_function(mlp_module)
    assert all(keys.LAYER in o.attributes for o in fn.body.block.ops if o.name.startswith("phaze."))


def test_tiny_gpt2_layers_and_saved(tiny_gpt2_module):
    layers = layers_of(tiny_gpt2_module)
    assert [layer["kind"] for layer in layers] == ["prologue", "block", "block", "head"]
    assert layers[2]["same_as"] == 1
    s, h, heads = 16, 64, 4
    # One block's attention saves its softmax output and dropout mask, b*heads*s^2 each (fp16).
    fn = step_function(tiny_gpt2_module)
    softmax = [o for o in fn.body.block.ops if isinstance(o, ph.SoftmaxOp) and o.kind.data == "softmax"]
    assert all(o.attributes[keys.SAVED_BYTES].value.data == heads * s * s * 2 for o in softmax)
    # Tied embedding: counted in the prologue (lookup) and in the head (LM head).
    vocab_bytes = 128 * h * 2
    assert layers[0]["param_bytes"] >= vocab_bytes and layers[-1]["param_bytes"] >= vocab_bytes
    assert layers[0]["boundary_bytes"] == s * h * 2


def test_optimizer_kinds():
    from phaze_ir.ir import parse_module

    sgd = parse_module(compiled(str(MODELS / "tiny_gpt2.py")))
    upd = [o for o in sgd.walk() if isinstance(o, ph.OptimizerUpdateOp)]
    assert upd and all(o.kind.data == "adam" and o.state_bytes.value.data == 12 for o in upd)
    fn = step_function(sgd)
    updated = [a for a in fn.res_attrs.data if keys.UPDATED in a.data]
    assert len(updated) == len(upd)


def test_layer_attr_fields_match_layer_info():
    import dataclasses

    from passes.algorithms.layers import LayerInfo

    assert tuple(f.name for f in dataclasses.fields(LayerInfo)) == LayerInfoAttr.FIELDS
