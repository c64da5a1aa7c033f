"""Llama 3.2 1B's shapes (16 layers, hidden 2048, 32 query heads sharing 8 key/value heads,
SwiGLU MLP 8192, vocabulary 128,256, tied embeddings; Meta's published configuration) at a long
sequence, 8,192 tokens: grouped-query attention where flash attention's work dominates.

Built from its configuration on the meta device: no weights, no downloads.  One of the models
whose single-GPU training step ``benchmarks/gpu/train_step_runtimes.py`` measures and
``benchmarks/gpu/price_train_step.py`` prices (data/h100/README.md).
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

NAME = "llama3-1b-8k"
SEQ_LEN = 8192


def config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )


def get_model() -> torch.nn.Module:
    return LlamaForCausalLM(config())


def get_inputs(micro_batch_size: int, seq_len: int = SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
