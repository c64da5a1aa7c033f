"""The 34B Llama 2 shape (48 layers, hidden 8192, 64 heads, 8 key/value heads: grouped-query
attention, MLP 22016; Code Llama 34B's shape, fms-fsdp's ``llama2_34b``), sequence length 4096.

Built from its configuration on the meta device: no weights, no downloads.  Attention is SDPA, as in the
other examples (flash attention on a GPU; ``--kernels ops``, the paper's runtime, runs it as its
matmuls and softmax: phaze.driver.with_runtime_attention).
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

NAME = "llama2-34b"
SEQ_LEN = 4096


def config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=32000,
        hidden_size=8192,
        intermediate_size=22016,
        num_hidden_layers=48,
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
