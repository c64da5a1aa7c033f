"""GPT-2 XL (1.5 B parameters, 48 layers, hidden 1600, 25 heads), sequence length 1024.

Built from its configuration on the meta device: no weights, no downloads.
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

NAME = "gpt2-xl"
SEQ_LEN = 1024


def config() -> GPT2Config:
    return GPT2Config(
        vocab_size=50257,
        n_positions=1024,
        n_embd=1600,
        n_layer=48,
        n_head=25,
        attn_implementation="sdpa",
    )


def get_model() -> torch.nn.Module:
    return GPT2LMHeadModel(config())


def get_inputs(micro_batch_size: int, seq_len: int = SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
