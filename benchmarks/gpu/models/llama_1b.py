"""A 1.2 B-parameter Llama (16 layers, hidden 2048, 16 heads of 128, SwiGLU MLP 5504,
vocabulary 32,000), sequence length 2048.

Built from its configuration on the meta device: no weights, no downloads.  One of the models
whose single-GPU training step ``benchmarks/gpu/train_step.py`` measures and
``benchmarks/gpu/price_train_step.py`` prices (data/h100/README.md).
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

NAME = "llama-1b"
SEQ_LEN = 2048


def config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=32000,
        hidden_size=2048,
        intermediate_size=5504,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=16,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        attn_implementation="eager",
    )


def get_model() -> torch.nn.Module:
    return LlamaForCausalLM(config())


def get_inputs(micro_batch_size: int, seq_len: int = SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
