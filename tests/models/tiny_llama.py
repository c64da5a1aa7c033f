"""A 2-layer Llama (RMSNorm, rotary embeddings, SiLU MLP) for fast frontend tests."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

NAME = "tiny-llama"
SEQ_LEN = 32


def get_model():
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=176,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=64,
            attn_implementation="eager",
        )
    )


def get_inputs(micro_batch_size, seq_len=SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
