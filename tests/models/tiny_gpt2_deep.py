"""An 8-block GPT-2, as small as tiny_gpt2 otherwise: enough blocks for interleaved pipelines
(p = 2 with v = 2 or 4 chunks per device) in the placement tests."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

NAME = "tiny-gpt2-deep"
SEQ_LEN = 16


def get_model():
    return GPT2LMHeadModel(
        GPT2Config(
            vocab_size=128,
            n_positions=64,
            n_embd=64,
            n_layer=8,
            n_head=4,
            bos_token_id=0,
            eos_token_id=0,
            attn_implementation="eager",
        )
    )


def get_inputs(micro_batch_size, seq_len=SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
