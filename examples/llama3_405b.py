"""Llama-3.1-405B (126 layers, hidden 16384, 128 heads, 16 key/value heads: grouped-query
attention, MLP 53248, vocabulary 128,256), sequence length 8192: the shape of the NVIDIA DGX Cloud
benchmarking recipe's ``llama3.1/llama3.1_405b.yaml`` (NVIDIA/dgxc-benchmarking at ``35a9aec``),
which is Meta's published Llama 3.1 405B configuration.

Built from its configuration on the meta device: no weights, no downloads.  Attention is SDPA, as in the
other examples (flash attention on a GPU; ``--kernels ops``, the paper's runtime, runs it as its
matmuls and softmax: phaze.driver.with_runtime_attention).
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

NAME = "llama3-405b"
SEQ_LEN = 8192


def config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=128256,
        hidden_size=16384,
        intermediate_size=53248,
        num_hidden_layers=126,
        num_attention_heads=128,
        num_key_value_heads=16,
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
