"""BERT-large (24 layers, hidden 1024, 16 heads), masked-LM pre-training, sequence length 512.

Built from its configuration on the meta device: no weights, no downloads.
"""

import torch
from transformers import BertConfig, BertForMaskedLM

NAME = "bert-large"
SEQ_LEN = 512


def config() -> BertConfig:
    return BertConfig(
        vocab_size=30522,
        hidden_size=1024,
        num_hidden_layers=24,
        num_attention_heads=16,
        intermediate_size=4096,
        max_position_embeddings=512,
        attn_implementation="sdpa",
    )


def get_model() -> torch.nn.Module:
    return BertForMaskedLM(config())


def get_inputs(micro_batch_size: int, seq_len: int = SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
