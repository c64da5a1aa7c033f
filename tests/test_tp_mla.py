"""DeepSeek-V3's multi-head latent attention (MLA) as Megatron-core runs it.

The attention (d_qk = 48 != d_v = 32 in the tiny model, 192 != 128 in DeepSeek-V3) traces as
one fused kernel (torch's memory-efficient attention: flash needs equal head dims), with no
s x s tensor saved.  Tensor parallelism splits the up projections (``q_b_proj``,
``kv_b_proj``) column-wise over the heads and ``o_proj`` row-wise, and keeps the down
projections (``q_a_proj``, ``kv_a_proj_with_mqa``, whose latents are normalized whole) and the
router replicated, by design, as Megatron-core's ``MLASelfAttention`` and ``TopKRouter`` do:
nothing is said kept whole.  Under sequence parallelism the down projections run on the
device's tokens and their weight gradients are all-reduced once per step.  A per-head norm
(Qwen3's ``q_norm``) is no latent: its projections are split as usual.
"""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
from conftest import MODELS, compiled
from xdsl.context import Context
from xdsl.dialects.builtin import TensorType

from passes.algorithms.tp_shard import Split, shard
from passes.graph_view import step_function
from passes.shard_tensor_parallel import ShardTensorParallelPass, build_tgraph
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.ir import parse_module
from phaze_ir.warning import PhazeWarning

DSV3 = str(MODELS / "tiny_deepseek_v3.py")
HEADS, D_QK, D_V, SEQ, HIDDEN = 4, 48, 32, 64, 256


@pytest.fixture(scope="module")
def dsv3_text() -> str:
    return compiled(DSV3, kernels="megatron")


def _plan(text: str, width: int, sequence_parallel: bool = False):
    module = parse_module(text)
    graph, _, _ = build_tgraph(module, step_function(module))
    return graph, shard(graph, width, sequence_parallel=sequence_parallel)


def _sharded(text: str, width: int, sequence_parallel: bool = False):
    """The module sharded by the pass, and the PhazeWarnings it said."""
    module = parse_module(text)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        ShardTensorParallelPass(width=width, sequence_parallel=sequence_parallel).apply(Context(), module)
    return module, [str(r.message) for r in record if issubclass(r.category, PhazeWarning)]


def _args(module) -> dict[str, tuple[int, ...]]:
    return {
        str(a.name_hint): tuple(a.type.get_shape())
        for a in step_function(module).body.block.args
        if isinstance(a.type, TensorType)
    }


def test_unequal_head_dims_trace_one_fused_kernel(dsv3_text):
    """Flash attention refuses d_qk != d_v; memory-efficient attention takes it: every
    attention is one fused kernel whose GEMMs are QKᵀ (d_qk) and PV (d_v), and no s x s tensor
    is saved for the backward (the math path would save the scores, 4 GiB a layer at 4k tokens
    in DeepSeek-V3)."""
    fn = step_function(parse_module(dsv3_text))
    fused = [op for op in fn.body.block.ops if keys.FUSED in op.attributes]
    names = {op.attributes[keys.FUSED].data.split()[0].rstrip("_0123456789") for op in fused}
    assert names == {"_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward"}
    fwd = [op for op in fused if isinstance(op, ph.MatmulOp) and op.attributes[keys.PHASE].data == "fwd"]
    assert len(fwd) == 2 * 2  # two GEMMs in each of the two blocks
    # QKᵀ contracts d_qk, PV yields d_v: the kernel's FLOPs 2·h·s²·(d_qk + d_v) a block
    assert sum(op.flops() for op in fwd) == 2 * 2 * HEADS * SEQ * SEQ * (D_QK + D_V)
    for op in fn.body.block.ops:
        shape = op.results[0].type.get_shape() if op.results and hasattr(op.results[0].type, "get_shape") else ()
        if len(shape) == 4 and tuple(shape[1:]) == (HEADS, SEQ, SEQ):  # [b, heads, s, s]: scores
            assert keys.SAVED_BYTES not in op.attributes, op  # no score matrix saved


def test_mla_tp2_splits_the_up_projections_and_keeps_the_latents_whole(dsv3_text):
    graph, plan = _plan(dsv3_text, 2)
    module, said = _sharded(dsv3_text, 2)
    assert said == []  # the latents and the router are replicated by design, not said
    whole, local = _args(parse_module(dsv3_text)), _args(module)
    for block in (0, 1):
        p = f"model.layers.{block}.self_attn."
        for name in ("q_b_proj", "kv_b_proj"):  # column-parallel over the heads
            rows, cols = whole[p + name + ".weight"]
            assert local[p + name + ".weight"] == (rows // 2, cols)
        rows, cols = whole[p + "o_proj.weight"]  # row-parallel
        assert local[p + "o_proj.weight"] == (rows, cols // 2)
        for name in ("q_a_proj.weight", "kv_a_proj_with_mqa.weight", "q_a_layernorm.weight", "kv_a_layernorm.weight"):
            assert local[p + name] == whole[p + name]  # duplicated, as Megatron's TELinear
    assert local["model.layers.1.mlp.gate.weight"] == whole["model.layers.1.mlp.gate.weight"]
    by_design = Counter((graph.ops[i].module.rsplit(".", 1)[-1], why) for i, why in plan.by_design.items())
    assert by_design == Counter({("q_a_proj", "latent"): 2, ("kv_a_proj_with_mqa", "latent"): 2, ("gate", "router"): 1})
    assert plan.demoted == []
    # the attention runs on each device's 2 of the 4 heads
    fn = step_function(module)
    attention = [op for op in fn.body.block.ops if isinstance(op, ph.MatmulOp) and keys.FUSED in op.attributes]
    assert attention and all(op.results[0].type.get_shape()[1] == HEADS // 2 for op in attention)


def test_mla_sequence_parallel_runs_the_latents_on_the_devices_tokens(dsv3_text):
    """Under SP the down projections read the sequence-split input as it is (s/t tokens, no
    all-gather of the hidden states: Megatron's duplicated TELinear), so their GEMMs are 1/t of
    the whole, and their weight gradients, partial, are all-reduced once per step."""
    graph, plan = _plan(dsv3_text, 2, sequence_parallel=True)
    assert plan.demoted == []
    latents = {i for i, why in plan.by_design.items() if why == "latent"}
    for i in latents:
        assert isinstance(plan.states[graph.ops[i].results[0]], Split)  # its tokens only
        assert plan.shapes[graph.ops[i].operands[0]][0] == SEQ // 2
    per_step = {graph.values[a.value].shape for a in plan.all_reduces if a.per_step}
    for i in latents:
        weight = graph.values[graph.ops[i].operands[1]].shape  # (in, out): the transposed weight
        assert (weight[1], weight[0]) in per_step
    # the whole step's matmul FLOPs: SP saves the latents' duplicated GEMMs
    module_sp, said = _sharded(dsv3_text, 2, sequence_parallel=True)
    module, _ = _sharded(dsv3_text, 2)
    assert said == []

    def flops(m) -> int:
        return sum(op.flops() for op in step_function(m).body.block.ops if isinstance(op, ph.MatmulOp))

    latents_fwd = 2 * SEQ * HIDDEN * (96 + 64 + 16)  # q_a_proj's and kv_a_proj_with_mqa's forward GEMMs
    # two blocks, each latent's forward and two backward GEMMs, half of each on a device
    assert flops(module) - flops(module_sp) == 2 * 3 * latents_fwd // 2


_QWEN3 = """
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

NAME = "tiny-qwen3"
SEQ_LEN = 32


def get_model():
    return Qwen3ForCausalLM(Qwen3Config(vocab_size=256, hidden_size=128, intermediate_size=256,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=64, attn_implementation="sdpa"))


def get_inputs(micro_batch_size, seq_len=SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
"""


def test_a_per_head_norm_is_no_latent(tmp_path):
    """Qwen3 normalizes each head of q and k (``q_norm``, ``k_norm`` over the head dim): its
    projections are split over the heads as usual, nothing replicated by design."""
    path = tmp_path / "tiny_qwen3.py"
    path.write_text(_QWEN3)
    text = compiled(str(path), kernels="megatron")
    graph, plan = _plan(text, 2)
    assert plan.by_design == {} and plan.demoted == []
    column = {graph.ops[i].module.rsplit(".", 1)[-1] for i in plan.column}
    assert {"q_proj", "k_proj", "v_proj"} <= column


_MIXTRAL = """
import torch
from transformers import MixtralConfig, MixtralForCausalLM

NAME = "tiny-mixtral"
SEQ_LEN = 32


def get_model():
    return MixtralForCausalLM(MixtralConfig(vocab_size=256, hidden_size=64, intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
        num_experts_per_tok=2, max_position_embeddings=64, attn_implementation="sdpa"))


def get_inputs(micro_batch_size, seq_len=SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
"""


def test_a_softmax_router_is_replicated_by_design_and_unsaid(tmp_path):
    """Mixtral's router (a linear, a softmax, a top-k) stays whole, as Megatron's TopKRouter
    does, and is not said kept whole (it was, before routers were known by structure)."""
    path = tmp_path / "tiny_mixtral.py"
    path.write_text(_MIXTRAL)
    text = compiled(str(path), kernels="megatron")
    graph, plan = _plan(text, 2)
    assert sorted(graph.ops[i].module for i in plan.by_design) == ["model.layers.0.mlp.gate", "model.layers.1.mlp.gate"]
    assert set(plan.by_design.values()) == {"router"} and plan.demoted == []
    _, said = _sharded(text, 2)
    assert said == []
