"""A tiny BERT masked LM with SDPA attention (transformers' default) and a padding mask."""

import torch
from transformers import BertConfig, BertForMaskedLM

NAME = "tiny-bert-sdpa"
SEQ_LEN = 32


def get_model():
    return BertForMaskedLM(
        BertConfig(
            vocab_size=256,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=64,
            attn_implementation="sdpa",
        )
    )


def get_inputs(micro_batch_size, seq_len=SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    mask = torch.ones(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": mask, "labels": ids}
