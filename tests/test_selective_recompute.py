"""What the selective recompute policy re-runs (``--selective-recompute``,
passes/algorithms/recompute.py): Megatron-LM's attention core, torchtitan's per-op policy and
torchtitan's every-N-th-block checkpointing and fms-fsdp's share of the blocks, on the tiny SDPA
Llama (GQA) by hand."""

from __future__ import annotations

import functools
import json

import pytest
from conftest import MODELS, compiled, run_main

from passes.algorithms.recompute import _checkpointed, analyze_recompute, op_name, parse_selective, selective_problem
from passes.graph_view import build_graph, step_function
from phaze_ir import keys
from phaze_ir.ir import parse_module

# tests/models/tiny_llama_sdpa.py as traced (float16): tokens, hidden, K/V width, MLP width, heads.
T, H, KV, FFN, HEADS = 32, 64, 32, 176, 4
F16, F32 = 2, 4


@functools.cache
def _step():
    # (SDPA attention as a GPU runtime runs it; ops, the paper's default, runs it eager)
    module = parse_module(compiled(str(MODELS / "tiny_llama_sdpa.py"), "training", kernels="eager"))
    graph, ops = build_graph(step_function(module))
    layer_of = [o.attributes[keys.LAYER].value.data for o in ops]
    kinds = [str(r.as_dict()["kind"]) for r in module.attributes[keys.LAYERS].data]
    return graph, layer_of, kinds


def _policies(selective: str):
    graph, layer_of, kinds = _step()
    return kinds, analyze_recompute(graph, layer_of, None, parse_selective(selective), kinds)


def test_torchtitans_op_policy_keeps_every_other_linear_and_attention():
    """A block stashes its input, the outputs of its 1st, 3rd, 5th and 7th linear (q, v, gate,
    down: the counter torchtitan keeps per block), and flash attention's output and
    log-sum-exp; it re-runs the rest of its forward (k, o, up among them)."""
    graph, _, _ = _step()
    kinds, rcs = _policies("op")
    _, attention = _policies("attention")
    linears = T * H * F16 + T * KV * F16 + T * FFN * F16 + T * H * F16  # q, v, gate, down
    flash = T * H * F16 + HEADS * T * F32  # output, log-sum-exp
    blocks = [rc for kind, rc in zip(kinds, rcs) if kind == "block"]
    assert len(blocks) == 2
    for rc in blocks:
        assert rc.selective_bytes == rc.full_bytes + linears + flash
        assert rc.full_bytes < rc.selective_bytes < rc.none_bytes
        rerun_linears = [i for i in rc.selective_ops if op_name(graph, i) == "phaze.matmul"]
        assert len(rerun_linears) == 3  # k, o, up; the attention matmuls are saved with their kernel
        assert set(rc.selective_ops) < set(rc.fwd_ops)
    # Layers that are not blocks are not checkpointed: selective is none there.
    for kind, rc, att in zip(kinds, rcs, attention):
        if kind != "block":
            assert (rc.selective_bytes, rc.selective_ops) == (rc.none_bytes, [])
            assert rc.saved_bytes() == [rc.none_bytes, rc.none_bytes, att.full_bytes]


@pytest.mark.parametrize(
    ("selective", "checkpointed"),
    [
        ("layer:1", [True, True]),
        ("layer:2", [False, True]),
        ("layer:3", [False, False]),
        ("share:1", [True, True]),
        ("share:1/2", [True, False]),
        ("share:0.3", [False, True]),
    ],
)
def test_whole_block_checkpointing_takes_its_blocks_whole(selective, checkpointed):
    """``layer:N``: block k (from 0) is fully checkpointed when (k + 1) % N == 0, as torchtitan's
    counter from 1; ``share:P`` as fms-fsdp spaces them (below); a checkpointed block's
    selective is full's stash and forward, the others none's."""
    kinds, rcs = _policies(selective)
    blocks = [rc for kind, rc in zip(kinds, rcs) if kind == "block"]
    for rc, whole in zip(blocks, checkpointed):
        if whole:
            assert (rc.selective_bytes, rc.selective_ops) == (rc.full_bytes, rc.fwd_ops)
        else:
            assert (rc.selective_bytes, rc.selective_ops) == (rc.none_bytes, [])


@pytest.mark.parametrize(
    ("share", "pattern"),
    [  # fms-fsdp's own examples (apply_fsdp_checkpointing's docstring, ed74fd5d), 1 a block taken
        ("1/2", "101010"),
        ("1/3", "010010"),
        ("2/3", "101101"),
        ("1", "111111"),
        ("0.75", "11011101"),
    ],
)
def test_share_checkpointing_spaces_its_blocks_as_fms_fsdp_does(share, pattern):
    """``share:P``: a counter k over the blocks from 1 and a cut-off from 1/2; block k is taken
    when k·P reaches the cut-off, which then grows by 1. Layers that are not blocks never are."""
    kinds = ["embedding", *["block"] * len(pattern), "head"]
    taken = _checkpointed(parse_selective(f"share:{share}"), kinds)
    assert taken == [False, *(c == "1" for c in pattern), False]


def test_megatrons_selective_recompute_is_the_default():
    """Without a setting, selective re-runs the attention core (Megatron-LM's), as before."""
    graph, layer_of, kinds = _step()
    default = analyze_recompute(graph, layer_of)
    _, attention = _policies("attention")
    assert [rc.saved_bytes() for rc in default] == [rc.saved_bytes() for rc in attention]
    assert [rc.selective_ops for rc in default] == [rc.selective_ops for rc in attention]
    with pytest.raises(ValueError, match="needs the layers' kinds"):
        analyze_recompute(graph, layer_of, None, parse_selective("op"))


@pytest.mark.parametrize(
    "text",
    ["layer:0", "layer:", "layer:-1", "layer:1.5", "ops", "", "Attention", 2, None]
    + ["share:0", "share:1.5", "share:3/2", "share:", "share:-0.5", "share:1/0", "share:0/4", "share:nan"]
    + ["share:1e-3"],
)
def test_bad_settings_are_refused_in_words(text):
    assert selective_problem(text) == (
        "expected attention, op, layer:N or share:P (N a positive integer, up to 999999; P a share of the "
        "blocks above 0 and at most 1, as 0.75 or 3/4)"
    )
    with pytest.raises(ValueError):
        parse_selective(text)


@pytest.mark.parametrize("text", ["attention", "op", "layer:1", "layer:2", "layer:999999", "share:1", "share:3/4"])
def test_good_settings_read_back(text):
    assert selective_problem(text) is None
    assert str(parse_selective(text)) == text


def test_a_decimal_share_reads_back_as_its_fraction():
    assert str(parse_selective("share:0.75")) == "share:3/4"
    assert parse_selective("share:0.70") == parse_selective("share:7/10")


def test_phazec_prices_each_setting_from_one_cache(tmp_path):
    """``phazec --hw --recompute selective --selective-recompute X`` with one cache: each setting
    is its own answer (the cache's keys see it), torchtitan's policies re-run more than
    Megatron's and stash less."""
    model = str(MODELS / "tiny_llama_sdpa.py")
    fixed = ["--hw", "h100", "--devices", "1", "--placement", "expert:1,1,1", "--global-batch", "4"]
    fixed += ["--micro-batch", "4", "--tp", "1", "--recompute", "selective", "--kernels", "eager"]
    fixed += ["--cache", str(tmp_path / "cache"), "-q"]
    plans = {}
    for selective in ("attention", "op", "layer:2"):
        out = tmp_path / f"{selective}.json"
        r = run_main("phazec", model, *fixed, "--selective-recompute", selective, "--json", str(out))
        assert r.returncode == 0, r.stderr
        plans[selective] = json.loads(out.read_text())
    recompute = {k: p["breakdown_s"]["recompute_s"] for k, p in plans.items()}
    memory = {k: p["stages"][0]["memory_bytes"] for k, p in plans.items()}
    assert recompute["attention"] < recompute["layer:2"] < recompute["op"]
    assert memory["op"] < memory["layer:2"] < memory["attention"]


def test_torchtitans_op_policy_counts_fp8_linears_as_mms():
    """torchao's Float8Linear calls ``torch.mm`` on float8 tensors, which torchtitan's policy
    sees as ``aten.mm``: under FP8 a block still re-runs every second linear (k, o, up), as in
    bf16, rather than keeping every FP8 GEMM's output as if both its operands were activations
    (its weight operand is the weight's FP8 copy)."""
    from conftest import compiled_with

    flags = ("--micro-batch", "1", "--kernels", "eager", "--dtype", "fp8", "--fp8-recipe", "rowwise")
    module = parse_module(compiled_with(str(MODELS / "tiny_llama_sdpa.py"), "training", *flags))
    graph, ops = build_graph(step_function(module))
    layer_of = [o.attributes[keys.LAYER].value.data for o in ops]
    kinds = [str(r.as_dict()["kind"]) for r in module.attributes[keys.LAYERS].data]
    rcs = analyze_recompute(graph, layer_of, None, parse_selective("op"), kinds)
    blocks = [rc for kind, rc in zip(kinds, rcs) if kind == "block"]
    assert len(blocks) == 2
    for rc in blocks:
        rerun = [i for i in rc.selective_ops if op_name(graph, i) == "phaze.matmul"]
        assert len(rerun) == 3
        assert all(graph.values[graph.ops[i].operands[0]].element_bytes == 1 for i in rerun)
