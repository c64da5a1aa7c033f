"""NeMo's Nemotron-22B (40 layers, hidden 6144, 48 heads, multi-head attention, MLP 24576 with squared
ReLU, LayerNorm with the +1 ("layernorm1p"), rotary embeddings on half of each head, no biases,
untied embeddings, vocabulary 256,000), sequence length 4096: the shape of
``launcher_scripts/conf/training/nemotron/nemotron_22b.yaml`` (NVIDIA/NeMo-Framework-Launcher at
tag 24.07, ``8325688d``), as transformers' ``NemotronForCausalLM`` builds it.

Built from its configuration on the meta device: no weights, no downloads.  Attention is SDPA, as in the
other examples (flash attention on a GPU; ``--kernels ops``, the paper's runtime, runs it as its
matmuls and softmax: phaze.driver.with_runtime_attention).
"""

import torch
from transformers import NemotronConfig, NemotronForCausalLM

NAME = "nemotron-22b"
SEQ_LEN = 4096


def config() -> NemotronConfig:
    return NemotronConfig(
        vocab_size=256000,
        hidden_size=6144,
        intermediate_size=24576,
        num_hidden_layers=40,
        num_attention_heads=48,
        num_key_value_heads=48,
        head_dim=128,
        hidden_act="relu2",
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )


def get_model() -> torch.nn.Module:
    return NemotronForCausalLM(config())


def get_inputs(micro_batch_size: int, seq_len: int = SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
