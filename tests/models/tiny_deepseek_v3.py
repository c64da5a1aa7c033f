"""A DeepSeek-V3 of 2 blocks (one dense, one MoE) built from its configuration: multi-head latent
attention (a 96-wide query latent, a 64-wide key/value latent, query/key heads of 32 + 16 rotary,
value heads of 32: d_qk 48 != d_v 32), a grouped sigmoid router (2 groups of 2 experts) and a
shared expert; fused attention (sdpa, transformers' default)."""

import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

NAME = "tiny-deepseek-v3"
SEQ_LEN = 64


def get_model():
    return DeepseekV3ForCausalLM(
        DeepseekV3Config(
            vocab_size=256,
            hidden_size=256,
            intermediate_size=512,
            moe_intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            n_routed_experts=4,
            n_shared_experts=1,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            first_k_dense_replace=1,
            kv_lora_rank=64,
            q_lora_rank=96,
            qk_rope_head_dim=16,
            qk_nope_head_dim=32,
            v_head_dim=32,
            max_position_embeddings=128,
            attn_implementation="sdpa",
        )
    )


def get_inputs(micro_batch_size, seq_len=SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
