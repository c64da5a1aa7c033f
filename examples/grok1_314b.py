"""Grok-1 314B as NVIDIA's DGX Cloud benchmarking recipe trains it (64 layers, hidden 6144, 48
heads with 8 key/value groups, 8 experts of MLP 32768 with GeGLU, top-2 routing, RMSNorm, rotary
embeddings, no biases, untied embeddings, Llama 3's vocabulary of 128,256), sequence length 8192:
the shape of ``grok1/grok1_314b.yaml`` in NVIDIA/dgxc-benchmarking at ``35a9aecc`` (Megatron-core's
GPT with ``num_moe_experts: 8``, ``moe_router_topk: 2``, ``activation: fast-geglu``,
``num_query_groups: 8``, ``normalization: rmsnorm``, ``tokenizer ... Meta-Llama-3-70B``).

Built on the meta device as transformers' ``MixtralForCausalLM`` (the same block: attention, a
linear router, experts ``down(act(gate(x)) * up(x))``) with the tanh GELU as the gate's activation,
Megatron's "fast-geglu": no weights, no downloads. The recipe's synthetic data needs no tokenizer
beyond its vocabulary size. Expert GEMMs are priced as in ``mixtral_8x7b.py``.
"""

import torch
from transformers import MixtralConfig, MixtralForCausalLM

NAME = "grok1-314b"
SEQ_LEN = 8192


def config(num_hidden_layers: int = 64) -> MixtralConfig:
    return MixtralConfig(
        vocab_size=128256,
        hidden_size=6144,
        intermediate_size=32768,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=48,
        num_key_value_heads=8,
        num_local_experts=8,
        num_experts_per_tok=2,
        hidden_act="gelu_pytorch_tanh",
        max_position_embeddings=32768,
        rms_norm_eps=1e-5,
        rope_theta=1e6,
        sliding_window=None,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )


def get_model() -> torch.nn.Module:
    return MixtralForCausalLM(config())


def get_inputs(micro_batch_size: int, seq_len: int = SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
