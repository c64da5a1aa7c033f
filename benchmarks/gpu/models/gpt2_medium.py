"""GPT-2 medium (355 M parameters: 24 layers, hidden 1024, 16 heads), sequence length 1024.

Built from its configuration on the meta device: no weights, no downloads.  One of the models
whose single-GPU training step ``benchmarks/gpu/train_step.py`` measures and
``benchmarks/gpu/price_train_step.py`` prices (data/h100/README.md).
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

NAME = "gpt2-medium"
SEQ_LEN = 1024


def config() -> GPT2Config:
    return GPT2Config(
        vocab_size=50257, n_positions=1024, n_embd=1024, n_layer=24, n_head=16, attn_implementation="eager"
    )


def get_model() -> torch.nn.Module:
    return GPT2LMHeadModel(config())


def get_inputs(micro_batch_size: int, seq_len: int = SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
