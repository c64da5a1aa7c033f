"""Mixtral-8x7B (32 layers, hidden 4096, 32 heads with 8 KV heads, 8 experts of MLP 14336, top-2
routing, vocabulary 32000), sequence length 4096.

Built from its published configuration on the meta device: no weights, no downloads. The expert
GEMMs (``aten._grouped_mm``) become batched ``phaze.matmul`` over the experts; the tokens each
expert gets are data, unknown on meta tensors, so the routed tokens are priced as spread evenly
over the experts (docs/design.md §2). Under ``--kernels eager|inductor`` they are launched as
torch runs ``_grouped_mm`` (§5.11): one grouped kernel in bf16 on an H100, one GEMM per expert
otherwise; under ``--dtype amp-bfloat16`` transformers' experts read the fp32 weights, so their
GEMMs run in fp32 on the CUDA cores. Experts are not placed on separate devices (no expert
parallelism): each device holds every expert, or its tensor-parallel share of every expert.
"""

import torch
from transformers import MixtralConfig, MixtralForCausalLM

NAME = "mixtral-8x7b"
SEQ_LEN = 4096


def config(num_hidden_layers: int = 32) -> MixtralConfig:
    return MixtralConfig(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_local_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=32768,
        rms_norm_eps=1e-5,
        rope_theta=1e6,
        sliding_window=None,
        attn_implementation="sdpa",
    )


def get_model() -> torch.nn.Module:
    return MixtralForCausalLM(config())


def get_inputs(micro_batch_size: int, seq_len: int = SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
