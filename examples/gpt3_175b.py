"""GPT-3 175B (96 layers, hidden 12288, 96 heads), sequence length 2048.

The GPT-3 architecture is GPT-2's at a larger scale (the paper's dense variant), so it is built
as a ``GPT2LMHeadModel`` from a configuration on the meta device: no weights, no downloads.
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

NAME = "gpt3-175b"
SEQ_LEN = 2048


def config() -> GPT2Config:
    return GPT2Config(
        vocab_size=50257,
        n_positions=2048,
        n_embd=12288,
        n_layer=96,
        n_head=96,
        attn_implementation="sdpa",
    )


def get_model() -> torch.nn.Module:
    return GPT2LMHeadModel(config())


def get_inputs(micro_batch_size: int, seq_len: int = SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
