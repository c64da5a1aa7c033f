"""Llama-2-7B (32 layers, hidden 4096, 32 heads, MLP 11008), sequence length 4096.

Built from its configuration on the meta device: no weights, no downloads.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

NAME = "llama2-7b"
SEQ_LEN = 4096


def config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        attn_implementation="sdpa",
    )


def get_model() -> torch.nn.Module:
    return LlamaForCausalLM(config())


def get_inputs(micro_batch_size: int, seq_len: int = SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
