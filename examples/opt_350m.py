"""OPT-350M (24 layers, hidden 1024, 16 heads, word embeddings projected from 512), sequence
length 2048.

Built from its configuration on the meta device: no weights, no downloads.
"""

import torch
from transformers import OPTConfig, OPTForCausalLM

NAME = "opt-350m"
SEQ_LEN = 2048


def config() -> OPTConfig:
    return OPTConfig(
        vocab_size=50272,
        hidden_size=1024,
        num_hidden_layers=24,
        ffn_dim=4096,
        num_attention_heads=16,
        max_position_embeddings=2048,
        word_embed_proj_dim=512,
        do_layer_norm_before=False,
        attn_implementation="sdpa",
    )


def get_model() -> torch.nn.Module:
    return OPTForCausalLM(config())


def get_inputs(micro_batch_size: int, seq_len: int = SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
