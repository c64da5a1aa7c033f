"""``phaze-shard-tensor-parallel``: Megatron tensor parallelism on the training graph.

On GPT-3 175B at width 8: the matmul FLOPs per device are 1/8 of the step's, every block
all-reduces twice in forward and twice in backward, its parameters are 1/8.  On every example
and the tiny models: the IR verifies and round-trips, the blocks keep Megatron's collective
counts.  Widths that do not divide the heads are refused; the pass is deterministic.  The pure
algorithm is tested on its own (view mapping, column/row pairing, demotion).
"""

from __future__ import annotations

import functools
import math
import sys
from collections import Counter

import pytest
from conftest import EXAMPLES, MODELS, compiled

from passes.algorithms import tp_rules
from passes.algorithms.tp_rules import RULES, rule_for
from passes.algorithms.tp_shard import (
    PARTIAL,
    REPLICATED,
    ShardError,
    Split,
    SplitCannotPass,
    TGraph,
    TOp,
    map_view,
    permute_split,
    reshape_split,
    shard,
)
from passes.graph_view import arg_role, step_function
from passes.group_layers import GroupLayersPass
from passes.mark_saved import MarkSavedPass
from passes.shard_tensor_parallel import ShardTensorParallelPass
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.errors import PhazeError
from phaze_ir.ir import parse_module, print_module

# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _facts(module) -> dict:
    """Matmul FLOPs (per layer and total), collectives per (layer, phase), layer records."""
    fn = step_function(module)
    mm = Counter()
    coll = Counter()
    coll_bytes = Counter()
    kinds = Counter()  # (layer, phase, kind) -> count
    ops = []  # (layer, phase, kind, bytes of the full tensor) of every collective
    for op in fn.body.block.ops:
        layer = op.attributes[keys.LAYER].value.data if keys.LAYER in op.attributes else -1
        if isinstance(op, ph.MatmulOp):
            mm[layer] += op.flops()
        elif isinstance(op, ph.CollectiveOp):
            phase = op.attributes[keys.PHASE].data
            kinds[layer, phase, op.kind.data] += 1
            ops.append(
                (layer, phase, op.kind.data, max(ph.tensor_bytes(op.input.type), ph.tensor_bytes(op.result.type)))
            )
            if op.kind.data == "all_reduce":
                coll[layer, phase] += 1
                coll_bytes[layer, phase] += ph.tensor_bytes(op.input.type)
    layers = [r.as_dict() for r in module.attributes[keys.LAYERS].data]
    return {
        "mm": mm,
        "mm_total": sum(mm.values()),
        "coll": coll,
        "coll_bytes": coll_bytes,
        "kinds": kinds,
        "collectives": ops,
        "layers": layers,
        "arg_bytes": sum(ph.tensor_bytes(a.type) for a in fn.body.block.args),
    }


@functools.cache
def sharded(path: str, width: int, micro_batch: int = 1, sequence_parallel: bool = False):
    """(facts before, facts after, sharded module, seconds of the pass) of a model file (an SDPA
    model's attention kept, as a GPU runtime runs it: ``--kernels eager``)."""
    import time

    text = compiled(path, "training", micro_batch, kernels="eager" if "sdpa" in path else None)
    module = parse_module(text)
    before = _facts(module)
    t0 = time.perf_counter()
    ShardTensorParallelPass(width=width, sequence_parallel=sequence_parallel).apply(None, module)
    seconds = time.perf_counter() - t0
    # As the fixed pipeline does: one device's saved bytes and layers, counted again.
    MarkSavedPass().apply(None, module)
    GroupLayersPass().apply(None, module)
    module.verify()
    return before, _facts(module), module, seconds


def _blocks(facts) -> list[int]:
    return [r["index"] for r in facts["layers"] if r["kind"] == "block"]


def _check_blocks(before, after, width, per_phase=2, param_tol=0.02):
    """Every block: ``per_phase`` all-reduces in forward and in backward, matmul FLOPs and
    parameter bytes 1/width (within ``param_tol``: norms and row-parallel biases stay whole)."""
    blocks = _blocks(after)
    assert blocks and blocks == _blocks(before)
    for b in blocks:
        assert after["coll"][b, "fwd"] == per_phase, (b, after["coll"])
        assert after["coll"][b, "bwd"] == per_phase, (b, after["coll"])
        assert after["coll"][b, "opt"] == 0
        # (within 0.5 %: a row-parallel bias is added whole)
        assert abs(after["mm"][b] * width / before["mm"][b] - 1) < 0.005, (b, after["mm"][b], before["mm"][b])
        pb, pa = before["layers"][b]["param_bytes"], after["layers"][b]["param_bytes"]
        assert pb / width <= pa <= pb / width * (1 + param_tol), (b, pb, pa)


# --------------------------------------------------------------------------------------------
# GPT-3 175B at width 8
# --------------------------------------------------------------------------------------------

GPT3 = str(EXAMPLES / "gpt3_175b.py")


def test_gpt3_width8_flops_collectives_params():
    before, after, module, seconds = sharded(GPT3, 8)
    # Matmul FLOPs per device: 1/8 of the step (the vocabulary, padded 50257 -> 51200, adds
    # a little to the LM head).
    ratio = after["mm_total"] / before["mm_total"]
    assert abs(ratio * 8 - 1) < 0.01, ratio
    blocks = _blocks(after)
    assert len(blocks) == 96
    _check_blocks(before, after, 8)
    hidden_bytes = 1 * 2048 * 12288 * 2
    for b in blocks:
        assert after["coll_bytes"][b, "fwd"] == after["coll_bytes"][b, "bwd"] == 2 * hidden_bytes
    # Prologue: the vocabulary-parallel embedding's partial output.  Head: max and sum of the
    # vocabulary-parallel cross-entropy ([tokens] each) and the partial loss; backward, the LM
    # head's partial input gradient.
    prologue, head = 0, len(after["layers"]) - 1
    assert after["coll"][prologue, "fwd"] == 1 and after["coll"][prologue, "bwd"] == 0
    assert after["coll"][head, "fwd"] == 3 and after["coll"][head, "bwd"] == 1
    assert after["coll_bytes"][head, "fwd"] == 2 * 2048 * 4 + 4
    assert sum(after["coll"].values()) == 2 * 2 * 96 + 1 + 4
    # Parameters, gradients and optimizer state shrink ~8x.
    assert 7.9 < before["arg_bytes"] / after["arg_bytes"] <= 8
    assert module.attributes["phaze.tp_width"].value.data == 8
    fn = step_function(module)
    wte = fn.body.block.args[0]
    assert wte.type.get_shape() == (51200 // 8, 12288)
    assert all(keys.LAYER in op.attributes for op in fn.body.block.ops if not op.name.startswith("func."))
    print(
        f"\nGPT-3 175B, width 8: matmul FLOPs x{ratio:.5f}, {sum(after['coll'].values())} all-reduces, "
        f"pass {seconds:.2f} s"
    )


# --------------------------------------------------------------------------------------------
# Every example, the tiny models
# --------------------------------------------------------------------------------------------


def _with_blocks(path, example, blocks: int):
    """A model file at ``path`` that is ``example`` with its configuration's ``blocks`` layers
    (``num_hidden_layers``, GPT-2's ``n_layer`` through its attribute map)."""
    path.write_text(
        "import importlib.util\n"
        f"_spec = importlib.util.spec_from_file_location('example', {str(example)!r})\n"
        "_example = importlib.util.module_from_spec(_spec)\n"
        "_spec.loader.exec_module(_example)\n"
        "_config = _example.config\n"
        "def config():\n"
        "    c = _config()\n"
        f"    c.num_hidden_layers = {blocks}\n"
        "    return c\n"
        "_example.config = config\n"
        "globals().update({k: v for k, v in vars(_example).items() if not k.startswith('_') and k != 'config'})\n"
    )
    return path


@pytest.mark.parametrize(
    "name, width, per_phase",
    [
        ("mlp", 2, 1),  # no attention: each block's up (column) / down (row) pair, one f and one g
        ("bert_large", 2, 2),
        ("opt_350m", 2, 2),
        ("llama2_7b", 2, 2),
        ("gpt2_xl", 5, 2),  # 25 heads: 5 per device
    ],
)
def test_examples(name, width, per_phase, tmp_path_factory):
    """Each example's blocks as they are (widths, heads, biases, norms), three of them: the pass
    shards every block alike, so the whole depth adds only time (GPT-3 175B, above, is sharded
    whole)."""
    path = EXAMPLES / f"{name}.py"
    if name != "mlp":  # its blocks are few already
        path = _with_blocks(tmp_path_factory.mktemp(name) / f"{name}_3_blocks.py", path, 3)
    before, after, module, _ = sharded(str(path), width)
    assert len(_blocks(after)) == (3 if name != "mlp" else len(_blocks(before)))
    _check_blocks(before, after, width, per_phase)
    assert after["mm_total"] < before["mm_total"]
    text = print_module(module)
    assert print_module(parse_module(text)) == text
    generic = print_module(module, generic=True)
    assert print_module(parse_module(generic)) == text


@pytest.mark.parametrize("model", ["tiny_gpt2", "tiny_llama"])
@pytest.mark.parametrize("width", [2, 4])
def test_tiny_models(model, width):
    before, after, module, _ = sharded(str(MODELS / f"{model}.py"), width)
    _check_blocks(before, after, width, param_tol=0.05)  # hidden 64: the norms weigh more
    text = print_module(module)
    assert print_module(parse_module(text)) == text


@pytest.mark.parametrize("model", ["tiny_gpt2", "tiny_llama"])
def test_micro_batch_merged_with_heads(model):
    # Micro-batch 4 = 4 heads: the batched matmuls run on b*heads, and several transposes of
    # [b, heads, s, d] keep the shape (the split must still follow the heads).
    before, after, module, _ = sharded(str(MODELS / f"{model}.py"), 2, 4)
    _check_blocks(before, after, 2, param_tol=0.05)


def test_mlp_head_and_prologue_stay_replicated():
    before, after, module, _ = sharded(str(EXAMPLES / "mlp.py"), 2)
    fn = step_function(module)
    types = {a.name_hint: a.type.get_shape() for a in fn.body.block.args}
    assert types["embed.weight"] == (256, 784) and types["head.weight"] == (10, 256)
    assert types["blocks.0.up.weight"] == (512, 256) and types["blocks.0.down.weight"] == (256, 512)
    assert types["blocks.0.down.bias"] == (256,) and types["blocks.0.norm.weight"] == (256,)
    first, last = 0, len(after["layers"]) - 1
    assert after["mm"][first] == before["mm"][first] and after["mm"][last] == before["mm"][last]


def test_width_one_changes_only_the_attribute():
    text = compiled(str(MODELS / "tiny_gpt2.py"))
    module = parse_module(text)
    ShardTensorParallelPass(width=1).apply(None, module)
    out = print_module(module)
    assert out.count("phaze.tp_width = 1 : i64") == 1
    assert out.replace(", phaze.tp_width = 1 : i64", "") == text


def test_sharding_drops_what_it_makes_stale():
    """The whole step's saved bytes and layers no longer hold on one device: the pass drops
    them (it does not re-run phaze-mark-saved and phaze-group-layers behind the user's back)."""
    module = parse_module(compiled(str(MODELS / "tiny_gpt2.py")))
    assert keys.LAYERS in module.attributes
    ShardTensorParallelPass(width=2).apply(None, module)
    assert keys.LAYERS not in module.attributes
    ops = list(step_function(module).body.block.ops)
    assert not any(keys.SAVED_BYTES in o.attributes or keys.LAYER in o.attributes for o in ops)


def test_deterministic():
    text = compiled(str(MODELS / "tiny_llama.py"))
    outs = []
    for _ in range(2):
        module = parse_module(text)
        ShardTensorParallelPass(width=2).apply(None, module)
        outs.append(print_module(module))
    assert outs[0] == outs[1]


# --------------------------------------------------------------------------------------------
# Refusals
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, width, message",
    [
        (
            str(EXAMPLES / "gpt2_xl.py"),
            2,
            "phaze-shard-tensor-parallel: width 2 does not divide the 25 attention heads of layer 1 (transformer.h.0)",
        ),
        (
            str(EXAMPLES / "gpt2_xl.py"),
            3,
            "phaze-shard-tensor-parallel: width 3 does not divide the 25 attention heads of layer 1 (transformer.h.0)",
        ),
        (
            str(MODELS / "tiny_gpt2.py"),
            8,
            "phaze-shard-tensor-parallel: width 8 does not divide the 4 attention heads of layer 1 (transformer.h.0)",
        ),
        (
            str(MODELS / "tiny_llama.py"),
            3,
            "phaze-shard-tensor-parallel: width 3 does not divide the 4 attention heads of layer 1 (model.layers.0)",
        ),
        (
            str(EXAMPLES / "mlp.py"),
            3,
            "phaze-shard-tensor-parallel: width 3 does not divide the output size 1024 of the column-parallel "
            "linear blocks.0.up in layer 1 (blocks.0)",
        ),
    ],
)
def test_refuses_widths_that_do_not_divide(path, width, message):
    module = parse_module(compiled(path))
    with pytest.raises(PhazeError) as e:
        ShardTensorParallelPass(width=width).apply(None, module)
    assert str(e.value) == message


def test_refuses_bad_options_and_a_second_run():
    module = parse_module(compiled(str(MODELS / "tiny_gpt2.py")))
    with pytest.raises(PhazeError, match="width=0: expected a positive integer"):
        ShardTensorParallelPass(width=0).apply(None, module)
    ShardTensorParallelPass(width=2).apply(None, module)
    with pytest.raises(PhazeError, match="already sharded"):
        ShardTensorParallelPass(width=2).apply(None, module)


# --------------------------------------------------------------------------------------------
# The algorithm on its own
# --------------------------------------------------------------------------------------------


def test_reshape_maps_the_split_by_its_flat_stride():
    # [b, s, h] split on h (t = 5) -> [b, s, heads, head_dim]: the heads split.
    assert reshape_split((1, 16, 1600), (1, 16, 25, 64), Split(2, 320), 5) == Split(2, 5)
    # 25 heads, width 2: the split cuts through a head.
    with pytest.raises(SplitCannotPass):
        reshape_split((1, 16, 1600), (1, 16, 25, 64), Split(2, 800), 2)
    # Heads merged with the micro-batch (b = 2, 4 heads, t = 2): the split sits inside the dim.
    assert reshape_split((2, 4, 16, 8), (8, 16, 8), Split(1, 2), 2) == Split(0, 2)
    assert reshape_split((8, 16, 8), (2, 4, 16, 8), Split(0, 2), 2) == Split(1, 2)
    # Size-1 dims appear and vanish around the split.
    assert reshape_split((16, 64), (1, 16, 64), Split(1, 32), 2) == Split(2, 32)
    # A padded (vocabulary) dim must survive whole.
    assert reshape_split((1, 16, 50257), (16, 50257), Split(2, 6400, 943), 8) == Split(1, 6400, 943)


def test_transposes_are_read_off_the_shapes():
    assert map_view("transpose", "aten.transpose.int", (1, 16, 4, 16), (1, 4, 16, 16), Split(2, 2), 2) == Split(1, 2)
    assert map_view("transpose", "aten.t.default", (64, 192), (192, 64), Split(1, 96), 2) == Split(0, 96)
    # Same shape, several swaps fit: the matmul idiom (last two dims) is taken.
    assert permute_split((4, 4, 16, 16), (4, 4, 16, 16), Split(1, 2), "transpose", "aten.transpose.int") == Split(1, 2)
    assert map_view("permute", "aten.permute.default", (2, 16, 4, 8), (2, 4, 8, 16), Split(2, 2), 2) == Split(1, 2)


def _mlp_graph(n_linears: int) -> tuple[TGraph, list[int]]:
    """x -> (linear -> gelu) * n -> layer norm -> sum, forward only, no blocks."""
    g = TGraph(layers=[("prologue", "")])
    x = g.add_value((4, 8), role="input")
    h, mms = x, []
    for k in range(n_linears):
        w = g.add_value((8, 8), role="param")
        mms.append(g.add_op("matmul", "", [h, w], [(4, 8)], module=f"l{k}"))
        a = g.add_op("elementwise", "gelu", [g.ops[mms[-1]].results[0]], [(4, 8)])
        h = g.ops[a].results[0]
    norm = g.add_op("norm", "layer_norm", [h], [(4, 8), (4, 1), (4, 1)], normalized_rank=1)
    loss = g.add_op("reduction", "sum", [g.ops[norm].results[0]], [()])
    g.add_op("return", "", [g.ops[loss].results[0]], [], result_roles=["loss"], result_params=[-1])
    return g, mms


def test_column_row_pairs_and_demotion():
    g, mms = _mlp_graph(3)
    plan = shard(g, 2)
    # l0 column, l1 row (its partial output all-reduced before the gelu), l2 would be a column
    # whose split output reaches the norm: demoted to replicated.
    assert plan.column == [mms[0]] and plan.row == [mms[1]] and plan.demoted == [mms[2]]
    assert plan.rounds == 2
    assert [a.value for a in plan.all_reduces] == [g.ops[mms[1]].results[0]]
    assert plan.states[g.ops[mms[0]].results[0]] == Split(1, 4)
    assert plan.states[g.ops[mms[2]].results[0]] is REPLICATED
    assert plan.shapes[g.ops[mms[0]].results[0]] == (4, 4)
    g, mms = _mlp_graph(2)
    plan = shard(g, 2)
    assert plan.column == [mms[0]] and plan.row == [mms[1]] and not plan.demoted
    assert plan.states[g.ops[mms[1]].results[0]] == PARTIAL


def test_width_must_divide_a_column_output():
    g, _ = _mlp_graph(2)
    with pytest.raises(ShardError, match="width 3 does not divide the output size 8"):
        shard(g, 3)


def test_rules_are_a_documented_table_by_kind():
    # One rule per op kind, each saying what it does; a kind with a rule of its own is found
    # before its op's rule, and an op without a rule takes every operand whole.
    for key, rule in RULES.items():
        assert rule.__doc__ and len(rule.__doc__.split()) > 10, key
    g, _ = _mlp_graph(2)
    ops = {(op.name, op.kind): op for op in g.ops}
    assert rule_for(ops["matmul", ""]) is tp_rules.matmul
    assert rule_for(ops["reduction", "sum"]) is tp_rules.reduction
    assert rule_for(ops["return", ""]) is tp_rules.function_results
    nll = TOp("reduction", "nll_loss", [], [])
    assert rule_for(nll) is tp_rules.cross_entropy_loss
    assert rule_for(TOp("layout", "cat", [], [])) is tp_rules.concat
    assert rule_for(TOp("layout", "view", [], [])) is tp_rules.layout
    assert rule_for(TOp("elementwise", "random", [], [])) is tp_rules.shape_only
    assert rule_for(TOp("opaque", "aten._safe_softmax", [], [])) is tp_rules.whole_operands
    assert rule_for(TOp("something_new", "", [], [])) is tp_rules.whole_operands


# --------------------------------------------------------------------------------------------
# Sequence parallelism (Megatron-SP, Korthikanti et al. 2022)
# --------------------------------------------------------------------------------------------


def _collective_s(facts, layer: int, phase: str, levels) -> float:
    from passes.algorithms.network import collective_s

    return sum(
        collective_s(kind, nbytes, 8, levels)[0]
        for lay, ph_, kind, nbytes in facts["collectives"]
        if lay == layer and ph_ == phase
    )


def test_gpt3_width8_sequence_parallel_collectives():
    """Each block: the forward's two all-reduces become reduce-scatter + all-gather pairs (same
    bytes, same time on one ring; on the a100's NCCL protocols the pair pays a second
    collective's fixed time); the backward mirrors them and re-gathers the two column-parallel
    inputs for their weight gradients (1.5x the backward bytes: Megatron-SP's re-gather, which
    it overlaps with the input-gradient GEMM).  The norm and row-parallel bias gradients are
    all-reduced once per step (phase opt), each in the layer whose backward made the gradient."""
    import dataclasses

    from phaze_ir.hardware import load_hardware

    _, tp, _, _ = sharded(GPT3, 8)
    before, sp, module, seconds = sharded(GPT3, 8, 1, True)
    assert keys.SEQUENCE_PARALLEL in module.attributes
    assert sp["mm_total"] == tp["mm_total"]
    a100 = load_hardware("a100").network
    levels = (dataclasses.replace(a100[0], protocols=None), *a100[1:])  # one ring
    blocks = _blocks(sp)
    assert len(blocks) == 96
    hidden_bytes = 1 * 2048 * 12288 * 2
    for b in blocks:
        k = sp["kinds"]
        assert (k[b, "fwd", "reduce_scatter"], k[b, "fwd", "all_gather"], k[b, "fwd", "all_reduce"]) == (2, 2, 0)
        assert (k[b, "bwd", "reduce_scatter"], k[b, "bwd", "all_gather"], k[b, "bwd", "all_reduce"]) == (2, 4, 0)
        assert all(n == hidden_bytes for lay, ph_, _, n in sp["collectives"] if lay == b and ph_ != "opt")
        # Per step: its 4 norm vectors and 2 row-parallel biases, in the block that made them.
        assert k[b, "opt", "all_reduce"] == 6
    b = blocks[0]
    fwd_tp, fwd_sp = _collective_s(tp, b, "fwd", levels), _collective_s(sp, b, "fwd", levels)
    assert fwd_sp == pytest.approx(fwd_tp, rel=1e-12)
    assert _collective_s(sp, b, "bwd", levels) == pytest.approx(1.5 * _collective_s(tp, b, "bwd", levels), rel=1e-12)
    # With the protocols, each of the pair's two collectives has its own fixed time (base_s):
    # dearer than the one all-reduce by at most that fixed time per pair.
    fwd_tp, fwd_sp = _collective_s(tp, b, "fwd", a100), _collective_s(sp, b, "fwd", a100)
    most_fixed = max(p.base_s for p in a100[0].protocols or ())
    assert fwd_tp < fwd_sp <= fwd_tp + 2 * (most_fixed + hidden_bytes / 8 / min(p.shard_Bps for p in a100[0].protocols))
    # Prologue: the embedding's partial output reduce-scattered; backward, its gradient gathered
    # for the two embedding gradients.  Head: the final norm's output gathered for the LM head.
    prologue, head = 0, len(sp["layers"]) - 1
    assert (sp["kinds"][prologue, "fwd", "reduce_scatter"], sp["kinds"][prologue, "bwd", "all_gather"]) == (1, 1)
    assert sp["kinds"][head, "fwd", "all_gather"] == 1 and sp["kinds"][head, "fwd", "all_reduce"] == 3
    assert sp["kinds"][head, "bwd", "reduce_scatter"] == 1
    # Per step: the final norm's 2 vectors in the head (the blocks' are in the blocks, above).
    assert sp["kinds"][head, "opt", "all_reduce"] == 2
    assert sum(n for lay, ph_, _, n in sp["collectives"] if ph_ == "opt") == (6 * 96 + 2) * 12288 * 2
    # Saved activations of a block: the regions outside the GEMMs shrink by 8.
    for b in blocks:
        assert sp["layers"][b]["saved_bytes"] < tp["layers"][b]["saved_bytes"]
    print(f"\nGPT-3 175B, width 8, sequence parallel: pass {seconds:.2f} s")


@pytest.mark.parametrize("model", ["tiny_gpt2", "tiny_llama"])
@pytest.mark.parametrize("width", [2, 4])
def test_tiny_models_sequence_parallel(model, width):
    before, tp, _, _ = sharded(str(MODELS / f"{model}.py"), width)
    _, sp, module, _ = sharded(str(MODELS / f"{model}.py"), width, 1, True)
    assert sp["mm_total"] == tp["mm_total"]
    for b in _blocks(sp):
        k = sp["kinds"]
        assert (k[b, "fwd", "reduce_scatter"], k[b, "fwd", "all_gather"], k[b, "fwd", "all_reduce"]) == (2, 2, 0)
        # (Llama's q, k and v projections read three views of one normed tensor: one gather)
        assert (k[b, "bwd", "reduce_scatter"], k[b, "bwd", "all_gather"], k[b, "bwd", "all_reduce"]) == (2, 4, 0)
        assert sp["layers"][b]["saved_bytes"] < tp["layers"][b]["saved_bytes"]
        assert sp["layers"][b]["param_bytes"] == tp["layers"][b]["param_bytes"]
    text = print_module(module)
    assert print_module(parse_module(text)) == text
    assert "phaze.sequence_parallel" in text


def test_sequence_parallel_llama2_7b():
    _, sp, _, _ = sharded(str(EXAMPLES / "llama2_7b.py"), 2, 1, True)
    for b in _blocks(sp):
        k = sp["kinds"]
        assert (k[b, "fwd", "reduce_scatter"], k[b, "fwd", "all_gather"]) == (2, 2)
        assert (k[b, "bwd", "reduce_scatter"], k[b, "bwd", "all_gather"]) == (2, 4)


def test_sequence_parallel_deterministic_and_width_one():
    text = compiled(str(MODELS / "tiny_llama.py"))
    outs = []
    for _ in range(2):
        module = parse_module(text)
        ShardTensorParallelPass(width=2, sequence_parallel=True).apply(None, module)
        outs.append(print_module(module))
    assert outs[0] == outs[1]
    module = parse_module(text)
    ShardTensorParallelPass(width=1, sequence_parallel=True).apply(None, module)
    assert keys.SEQUENCE_PARALLEL not in module.attributes  # nothing to split over


def test_sequence_parallel_needs_a_sequence_it_can_split():
    module = parse_module(compiled(str(MODELS / "tiny_gpt2.py")))
    del module.attributes[keys.SEQ_LEN]
    with pytest.raises(PhazeError, match="sequence parallelism needs the sequence length traced"):
        ShardTensorParallelPass(width=2, sequence_parallel=True).apply(None, module)
    g, _ = _mlp_graph(2)
    g.seq_len = 3
    with pytest.raises(ShardError, match="width 2 does not divide the sequence length 3"):
        shard(g, 2, sequence_parallel=True)


def test_sequence_parallel_algorithm():
    # x -> column -> gelu -> row -> norm -> sum, 4 tokens: the row output is reduce-scattered
    # (split along the tokens), the norm runs on 2 tokens, the loss is a partial sum.
    g, mms = _mlp_graph(2)
    g.seq_len = 4
    plan = shard(g, 2, sequence_parallel=True)
    assert plan.sequence_parallel and plan.column == [mms[0]] and plan.row == [mms[1]]
    rs = [a for a in plan.all_reduces if a.scatter is not None]
    assert [a.value for a in rs] == [g.ops[mms[1]].results[0]]
    assert rs[0].scatter == Split(0, 2) and rs[0].scatter_shape == (2, 8)
    norm = next(op for op in g.ops if op.name == "norm")
    assert plan.shapes[norm.results[0]] == (2, 8)
    assert not plan.gathers


def test_sequence_parallel_reads_its_tokens_of_a_replicated_addend():
    # x -> column -> gelu -> row, reduce-scattered, plus gelu(x), replicated over the devices
    # (an MoE layer's output beside the residual): each device adds its own tokens of the
    # replicated addend, as Megatron-core's scatter_to_sequence_parallel_region splits without
    # communication; the sum stays split and the norm runs on 2 tokens, nothing gathered.
    g = TGraph(layers=[("prologue", "")], seq_len=4)
    x = g.add_value((4, 8), role="input")
    h = x
    mms = []
    for k in range(2):
        w = g.add_value((8, 8), role="param")
        mms.append(g.add_op("matmul", "", [h, w], [(4, 8)], module=f"l{k}"))
        h = g.ops[g.add_op("elementwise", "gelu", [g.ops[mms[-1]].results[0]], [(4, 8)])].results[0]
    other = g.ops[g.add_op("elementwise", "gelu", [x], [(4, 8)])].results[0]
    total = g.ops[g.add_op("elementwise", "add", [h, other], [(4, 8)])].results[0]
    norm = g.add_op("norm", "layer_norm", [total], [(4, 8), (4, 1), (4, 1)], normalized_rank=1)
    loss = g.add_op("reduction", "sum", [g.ops[norm].results[0]], [()])
    g.add_op("return", "", [g.ops[loss].results[0]], [], result_roles=["loss"], result_params=[-1])
    plan = shard(g, 2, sequence_parallel=True)
    assert plan.column == [mms[0]] and plan.row == [mms[1]] and not plan.demoted
    row_out = g.ops[mms[1]].results[0]
    assert plan.all_reduces[0].value == row_out and plan.all_reduces[0].scatter == Split(0, 2)
    assert plan.states[h] == Split(0, 2) and plan.states[other] is REPLICATED and plan.states[total] == Split(0, 2)
    assert plan.shapes[g.ops[norm].results[0]] == (2, 8)
    assert not plan.gathers


# --------------------------------------------------------------------------------------------
# Grouped-query attention
# --------------------------------------------------------------------------------------------

_GQA = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM

NAME = "tiny-gqa"
SEQ_LEN = 32


def get_model():
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=176,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            attn_implementation="eager",
        )
    )


def get_inputs(micro_batch_size, seq_len=SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
"""

# Llama-2-70B's layer (examples/llama2_70b.py) at 2 layers: the per-layer sharding does not
# depend on the depth.
_LLAMA70B_2 = f"""
import sys

sys.path.insert(0, {str(EXAMPLES)!r})
from llama2_70b import LlamaForCausalLM, config as _config, get_inputs, NAME, SEQ_LEN  # noqa: E402


def get_model():
    c = _config()
    c.num_hidden_layers = 2
    return LlamaForCausalLM(c)
"""


@pytest.fixture(scope="module")
def gqa_path(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("gqa") / "tiny_gqa.py"
    path.write_text(_GQA)
    return str(path)


def test_gqa_shards_when_the_width_divides_the_kv_heads(gqa_path):
    before, after, module, _ = sharded(gqa_path, 2)
    _check_blocks(before, after, 2, param_tol=0.05)


# Grouped-query attention with SDPA (transformers' default): a Llama and a Qwen2 (q, k and v
# projections with biases) of 2 blocks, hidden 256, 8 query heads of 32, built from their
# configurations (no download).  SDPA traces as the fused kernel, which the importer expands
# with a ``repeat`` of K and V; the eager ``tiny_gqa`` above has transformers' own ``repeat_kv``
# (expand, copy, view) instead.
_GQA_SDPA = """
import torch
from transformers import {config}, {model}

NAME = "gqa-{kind}-kv{kv}"
SEQ_LEN = 32


def get_model():
    return {model}(
        {config}(
            vocab_size=256,
            hidden_size=256,
            intermediate_size=512,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads={kv},
            max_position_embeddings=64,
            attn_implementation="sdpa",
        )
    )


def get_inputs(micro_batch_size, seq_len=SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {{"input_ids": ids, "labels": ids}}
"""
_GQA_KINDS = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM")}

# The block linears as Megatron shards them: (weight, dim split) of column- and row-parallel ones.
_COLUMN = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
_ROW = ("self_attn.o_proj", "mlp.down_proj")
PHASES = ("fwd", "bwd", "opt")


@pytest.fixture(scope="module")
def gqa_sdpa(tmp_path_factory):
    """The path of the SDPA model ``(kind, kv)``."""
    root = tmp_path_factory.mktemp("gqa_sdpa")

    def path(kind: str, kv: int) -> str:
        config, model = _GQA_KINDS[kind]
        p = root / f"gqa_{kind}_kv{kv}.py"
        if not p.exists():
            p.write_text(_GQA_SDPA.format(config=config, model=model, kind=kind, kv=kv))
        return str(p)

    return path


def _args(module) -> dict[str, tuple[int, ...]]:
    return {a.name_hint: a.type.get_shape() for a in step_function(module).body.block.args}


def _layer_params(before: dict, after: dict, block: int) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """(whole, local) shape of every parameter of block ``block``, by its name in the block."""
    p = f"model.layers.{block}."
    return {k[len(p) :]: (before[k], after[k]) for k in before if k.startswith(p)}


def _per_block_collectives(after) -> dict[tuple[int, str], Counter]:
    """(block, phase) -> collectives of each kind."""
    out: dict[tuple[int, str], Counter] = {(b, phase): Counter() for b in _blocks(after) for phase in PHASES}
    for (layer, phase, kind), n in after["kinds"].items():
        if (layer, phase) in out:
            out[layer, phase][kind] += n
    return out


def _said(path: str, width: int, kernels: str | None = None) -> tuple[list[str], str]:
    """The PhazeWarnings the pass says on ``path`` at ``width`` (compiled with ``--kernels``
    ``kernels``), and the module it prints."""
    import warnings

    from phaze_ir.warning import PhazeWarning

    module = parse_module(compiled(path, kernels=kernels))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        ShardTensorParallelPass(width=width).apply(None, module)
    return [str(r.message) for r in record if issubclass(r.category, PhazeWarning)], print_module(module)


@pytest.mark.parametrize(
    "kind, kv, width",
    [("llama", 4, 2), ("llama", 4, 4), ("qwen2", 4, 2), ("qwen2", 4, 4), ("qwen2", 2, 2)],
)
def test_gqa_sdpa_shards_every_block_linear(gqa_sdpa, kind, kv, width):
    """Width dividing the key/value heads: q, k, v, gate and up column-parallel, o and down
    row-parallel (their biases with them), ``kv/width`` key/value heads and ``8/width`` query
    heads per device, the importer's repeat of K and V local; Megatron's 2 all-reduces per block
    forward and 2 backward, FLOPs and parameters 1/width.  (Before the grouped-query rules the
    repeat could not take the split and left q, k, v and o replicated.)"""
    path = gqa_sdpa(kind, kv)
    text = compiled(path, kernels="eager")
    assert 'phaze.layout "repeat"' in text and 'aten "attention"' in text  # the importer's repeat
    before, after, module, _ = sharded(path, width)
    _check_blocks(before, after, width, param_tol=0.01)
    whole = _args(parse_module(text))
    local = _args(module)
    per_block = _per_block_collectives(after)
    for b in _blocks(after):
        assert per_block[b, "fwd"] == Counter(all_reduce=2) and per_block[b, "bwd"] == Counter(all_reduce=2)
    for block in (0, 1):
        params = _layer_params(whole, local, block)
        for name in _COLUMN:
            (rows, cols), shape = params[f"{name}.weight"]
            assert shape == (rows // width, cols), (name, shape)
            if kind == "qwen2" and name.startswith("self_attn"):
                assert params[f"{name}.bias"][1] == (rows // width,)
        for name in _ROW:
            (rows, cols), shape = params[f"{name}.weight"]
            assert shape == (rows, cols // width), (name, shape)
        assert params["self_attn.k_proj.weight"][1][0] == kv // width * 32  # kv/width heads of 32
    fn = step_function(module)
    scores = [
        op.result.type.get_shape()
        for op in fn.body.block.ops
        if isinstance(op, ph.SoftmaxOp) and op.attributes[keys.PHASE].data == "fwd"
    ]
    assert scores and all(s[1] == 8 // width for s in scores[:2]), scores
    said, printed = _said(path, width)
    assert said == [] and "phaze.replicated_linears" not in printed


def _check_kv_replicated(path: str, width: int, kv: int, heads: int, head_dim: int, bias: bool) -> str:
    """Fewer key/value heads than devices: k and v projections whole, every other block linear
    split as Megatron splits it, ``heads/width`` query heads per device, 2 all-reduces per block
    forward and 4 backward (Megatron's 2 and the gradients of the replicated K and V, each of
    their output's size), said in a warning and a ``phaze.tp_replicated`` record.  Returns the
    printed module."""
    before, after, module, _ = sharded(path, width)
    whole, local = _args(parse_module(compiled(path))), _args(module)
    for block in (0, 1):
        params = _layer_params(whole, local, block)
        for name in ("self_attn.k_proj", "self_attn.v_proj"):
            w, shape = params[f"{name}.weight"]
            assert shape == w and w[0] == kv * head_dim, (name, shape)
            if bias:
                assert params[f"{name}.bias"][1] == (kv * head_dim,)
        for name in ("self_attn.q_proj", "mlp.gate_proj", "mlp.up_proj"):
            (rows, cols), shape = params[f"{name}.weight"]
            assert shape == (rows // width, cols), (name, shape)
        for name in _ROW:
            (rows, cols), shape = params[f"{name}.weight"]
            assert shape == (rows, cols // width), (name, shape)
    kv_bytes = 2 * 32 * kv * head_dim  # one micro-batch of 32 tokens, fp16
    for b in _blocks(after):
        assert after["coll"][b, "fwd"] == 2 and after["coll"][b, "bwd"] == 4, after["coll"]
        small = sorted(n for layer, phase, k, n in after["collectives"] if (layer, phase) == (b, "bwd"))[:2]
        assert small == [kv_bytes, kv_bytes], small
    fn = step_function(module)
    scores = [
        op.result.type.get_shape()
        for op in fn.body.block.ops
        if isinstance(op, ph.SoftmaxOp) and op.attributes[keys.PHASE].data == "fwd"
    ]
    assert scores and all(s[1] == heads // width for s in scores[:2]), scores
    said, printed = _said(path, width)
    assert len(said) == 1 and said[0].startswith(
        f"tensor parallelism (width {width}) keeps the 4 key/value projections of grouped-query attention "
        f"replicated (first: model.layers.0.self_attn.k_proj in layer 1 (model.layers.0)): {kv} key/value heads "
        f"for {width} devices"
    ), said
    assert (
        f'phaze.tp_replicated = [#phaze.replicated_linears<reason = "kv_heads", width = {width}, count = 4, '
        'total = 14, module = "model.layers.0.self_attn.k_proj", flops_share = '
    ) in printed
    return printed


def test_gqa_sdpa_fewer_kv_heads_than_devices_replicates_k_and_v(gqa_sdpa):
    """Qwen2 with 2 key/value heads at width 4: Megatron-core keeps one key/value head per
    device, shared by 2 devices; phaze keeps the k and v projections (and biases) replicated
    and repeats K and V into each device's 2 query heads, and says so."""
    _check_kv_replicated(gqa_sdpa("qwen2", 2), 4, kv=2, heads=8, head_dim=32, bias=True)


def test_gqa_repeat_kv_fewer_kv_heads_than_devices(gqa_path):
    """transformers' ``repeat_kv`` (eager ``tiny_gqa``: 4 query heads, 2 key/value heads) at
    width 4: the view of the repeated heads' gradient into ``[b, kv, groups, s, d]`` cannot
    carry the split, so it reads it zero-padded and the sum over the groups is partial."""
    text = compiled(gqa_path)
    assert 'phaze.layout "expand"' in text and 'phaze.layout "repeat"' not in text  # transformers' repeat_kv
    printed = _check_kv_replicated(gqa_path, 4, kv=2, heads=4, head_dim=16, bias=False)
    assert printed.count('phaze.layout "zero_pad" %') - text.count('phaze.layout "zero_pad" %') == 4  # K, V per block


def test_gqa_replicated_kv_reaches_the_plan_json(gqa_sdpa):
    from phaze.plan.plan_output import unpriced_ops

    _, _, module, _ = sharded(gqa_sdpa("qwen2", 2), 4)
    (record,) = unpriced_ops(module)
    fn = step_function(parse_module(compiled(gqa_sdpa("qwen2", 2), "training", 1, kernels="eager")))
    args = [(arg_role(fn, i), a.type.get_shape()) for i, a in enumerate(fn.body.block.args)]
    params = {name: math.prod(shape) for (role, name), shape in args if role == "param"}
    kv = sum(n for name, n in params.items() if name.endswith(("k_proj.weight", "v_proj.weight")))
    assert record == {
        "kind": "replicated-linears",
        "reason": "kv_heads",
        "width": 4,
        "count": 4,
        "total": 14,
        "module": "model.layers.0.self_attn.k_proj",
        # forward linear FLOPs in units of 2·tokens·256: k and v 64 each, q and o 256, the MLP's
        # three 512, per block; the LM head 256
        "flops_share": pytest.approx(2 * (64 + 64) / (2 * (2 * 64 + 2 * 256 + 3 * 512) + 256), rel=1e-12),
        "param_share": pytest.approx(kv / sum(params.values()), rel=1e-12),
    }


_GQA_REFUSED = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM

NAME = "tiny-gqa-kv3"
SEQ_LEN = 16


def get_model():
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=128,
            hidden_size=96,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=3,
            max_position_embeddings=32,
        )
    )


def get_inputs(micro_batch_size, seq_len=SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
"""


def test_gqa_refuses_a_width_megatron_refuses(tmp_path):
    """3 key/value heads at width 2: neither divides the other (Megatron-core's
    TransformerConfig raises a ValueError)."""
    path = tmp_path / "tiny_gqa_kv3.py"
    path.write_text(_GQA_REFUSED)
    module = parse_module(compiled(str(path)))
    with pytest.raises(PhazeError) as e:
        ShardTensorParallelPass(width=2).apply(None, module)
    assert str(e.value) == (
        "phaze-shard-tensor-parallel: width 2 neither divides nor is a multiple of the 3 key/value heads of "
        "layer 1 (model.layers.0) (grouped-query attention, 6 query heads); Megatron requires one or the other"
    )


def test_llama2_70b_width8_shards_qkvo(tmp_path, monkeypatch):
    # the model file puts examples/ on sys.path itself (the loader keeps what a model file adds:
    # its functions may need it): taken off again when the test ends
    monkeypatch.setattr(sys, "path", list(sys.path))
    path = tmp_path / "llama2_70b_2.py"
    path.write_text(_LLAMA70B_2)
    before, after, module, _ = sharded(str(path), 8)
    _check_blocks(before, after, 8)
    fn = step_function(module)
    shapes = {a.name_hint: a.type.get_shape() for a in fn.body.block.args}
    p = "model.layers.0."
    # q and o: 64 heads of 128 -> 8 per device; k and v: 8 key/value heads -> 1 per device.
    assert shapes[p + "self_attn.q_proj.weight"] == (1024, 8192)
    assert shapes[p + "self_attn.k_proj.weight"] == (128, 8192)
    assert shapes[p + "self_attn.v_proj.weight"] == (128, 8192)
    assert shapes[p + "self_attn.o_proj.weight"] == (8192, 1024)
    assert shapes[p + "mlp.gate_proj.weight"] == (28672 // 8, 8192)
    assert shapes[p + "mlp.down_proj.weight"] == (8192, 28672 // 8)
    # The attention scores: 8 heads per device.
    scores = [
        op.result.type.get_shape()
        for op in fn.body.block.ops
        if isinstance(op, ph.SoftmaxOp) and op.attributes[keys.PHASE].data == "fwd"
    ]
    assert scores[0] == (1, 8, 4096, 4096)


# --------------------------------------------------------------------------------------------
# Linears that stay replicated are said
# --------------------------------------------------------------------------------------------

_T5 = """
import torch
from transformers import T5Config, T5ForConditionalGeneration

NAME = "tiny-t5"
SEQ_LEN = 16


def get_model():
    return T5ForConditionalGeneration(
        T5Config(
            vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
            decoder_start_token_id=0,
        )
    )


def get_inputs(micro_batch_size, seq_len=SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
"""


def test_t5_replicated_linears_are_said(tmp_path):
    """T5: the layer grouping takes the decoder's blocks as the blocks, so the encoder's are
    the prologue and its linears stay whole: said in one warning line and one
    ``#phaze.replicated_linears`` record instead of silently.  (The decoder's attention, SDPA
    traced as the fused kernel with T5's position bias, shards: its linears are not demoted.
    They were while SDPA traced as the CPU's math path, whose ``aten._safe_softmax`` the
    frontend imported as an opaque op.)"""
    path = tmp_path / "tiny_t5.py"
    path.write_text(_T5)
    messages, printed = _said(str(path), 2, kernels="eager")  # SDPA kept, as a GPU runtime runs it
    assert len(messages) == 1, messages
    assert "linears outside the repeated blocks replicated" in messages[0] and "encoder.block.0." in messages[0]
    assert '#phaze.replicated_linears<reason = "outside_blocks", width = 2, count = 12, ' in printed
    assert 'reason = "demoted"' not in printed


def test_no_warning_on_the_examples():
    import warnings

    from phaze_ir.warning import PhazeWarning

    for name in ("mlp", "opt_350m"):
        module = parse_module(compiled(str(EXAMPLES / f"{name}.py")))
        with warnings.catch_warnings():
            warnings.simplefilter("error", PhazeWarning)
            ShardTensorParallelPass(width=2).apply(None, module)


def test_a_vocabulary_parallel_head_is_not_said_replicated():
    """The LM head of a tied GPT-2 is sharded over the vocabulary (not a column/row linear):
    no warning about it."""
    import warnings

    from phaze_ir.warning import PhazeWarning

    module = parse_module(compiled(str(MODELS / "tiny_gpt2.py")))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PhazeWarning)
        ShardTensorParallelPass(width=2).apply(None, module)


_UNRECOGNIZED = """
import torch
from torch import nn

NAME = "tiny-unrecognized"


class Block(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        # a weight read through an op of two parameters: no rule sees a linear's weight
        self.w2 = nn.Parameter(torch.zeros(4 * d, d))
        self.w2_delta = nn.Parameter(torch.zeros(4 * d, d))

    def forward(self, x):
        return x + torch.relu(self.fc1(self.norm(x))) @ (self.w2 + self.w2_delta)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x.pow(2).mean()


def get_model():
    return Model()


def get_inputs(micro_batch_size):
    return (torch.zeros(micro_batch_size, 16, 64),)
"""


def test_weights_no_rule_recognizes_are_said(tmp_path):
    """A block's weight that no rule takes for a linear's (read through an op of two
    parameters) stays whole at TP 2: said in a ``weights`` record with its share of the
    parameters, and in the summary's words, rather than priced whole in silence."""
    from phaze.plan.plan_output import unpriced_ops
    from phaze.plan.summary import warning_words

    path = tmp_path / "tiny_unrecognized.py"
    path.write_text(_UNRECOGNIZED)
    messages, printed = _said(str(path), 2)
    assert any("weight matrices of the blocks whole" in m for m in messages), messages
    records = [r for r in unpriced_ops(parse_module(printed)) if r["reason"] == "weights"]
    assert len(records) == 1 and records[0]["count"] == 4 and records[0]["module"] == "blocks.0"
    d = 64  # w2 and w2_delta of 2 blocks, of: norm 2d, fc1 4d*d + 4d, the two w2s 2 * 4d*d, per block
    assert records[0]["param_share"] == pytest.approx(2 * 4 * d * d / (2 * d + 4 * d * d + 4 * d + 2 * 4 * d * d))
    (words,) = [w for w in warning_words([{"kind": "replicated-linears", **records[0]}])]
    assert words.startswith("TP 2 keeps 4 of 6 weight matrices of the blocks whole (no rule recognized") and (
        "66.1% of the parameters" in words
    ), words
