"""Llama-2-70B (80 layers, hidden 8192, 64 heads, 8 key/value heads: grouped-query attention,
MLP 28672), sequence length 4096.

Built from its configuration on the meta device: no weights, no downloads.  Under tensor
parallelism each device holds 64/t query heads and 8/t key/value heads (t must divide 8, as in
Megatron-LM, whose ``num_query_groups`` must be divisible by the TP size).
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

NAME = "llama2-70b"
SEQ_LEN = 4096


def config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=32000,
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        attn_implementation="sdpa",
    )


def get_model() -> torch.nn.Module:
    return LlamaForCausalLM(config())


def get_inputs(micro_batch_size: int, seq_len: int = SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
