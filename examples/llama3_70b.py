"""Llama-3-70B (80 layers, hidden 8192, 64 heads, 8 key/value heads: grouped-query attention,
MLP 28672, vocabulary 128,256), sequence length 8192.

Built from its configuration on the meta device: no weights, no downloads.  Attention is SDPA, as in the
other examples (flash attention on a GPU; ``--kernels ops``, the paper's runtime, runs it as its
matmuls and softmax: phaze.driver.with_runtime_attention).
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

NAME = "llama3-70b"
SEQ_LEN = 8192


def config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=128256,
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        attn_implementation="sdpa",
    )


def get_model() -> torch.nn.Module:
    return LlamaForCausalLM(config())


def get_inputs(micro_batch_size: int, seq_len: int = SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
