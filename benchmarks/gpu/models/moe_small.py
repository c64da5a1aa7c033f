"""A small Mixtral-shaped mixture of experts (4 layers, hidden 1024, 16 query heads sharing 4
key/value heads, 8 experts of SwiGLU MLP 3584 with top-2 routing, vocabulary 32,000; 0.4 B
parameters, 0.13 B active per token), sequence length 2048: Mixtral 8x7B's structure at a size
one GPU trains in seconds.  transformers runs its experts through ``_grouped_mm`` (its default
``experts_implementation``), so the step measures the expert GEMMs as torch launches them.

Built from its configuration on the meta device: no weights, no downloads.  One of the models
whose single-GPU training step ``benchmarks/gpu/train_step_runtimes.py`` measures and
``benchmarks/gpu/price_train_step.py`` prices (data/h100/README.md).
"""

import torch
from transformers import MixtralConfig, MixtralForCausalLM

NAME = "moe-small"
SEQ_LEN = 2048


def config() -> MixtralConfig:
    return MixtralConfig(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=3584,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=4,
        num_local_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=4096,
        rms_norm_eps=1e-5,
        sliding_window=None,
        attn_implementation="sdpa",
    )


def get_model() -> torch.nn.Module:
    return MixtralForCausalLM(config())


def get_inputs(micro_batch_size: int, seq_len: int = SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
