"""DeepSeek-V3 671B (61 layers, hidden 7168; multi-head latent attention with 128 heads, query and
key head dim 192 = 128 + 64 rotary, value head dim 128, latent ranks 1536 and 512; the first 3
layers dense (MLP 18432), the other 58 mixture-of-experts with 256 routed experts of MLP 2048,
top-8, and one shared expert; vocabulary 129280), sequence length 4096.

Built from its published configuration (deepseek-ai/DeepSeek-V3 ``config.json``) as transformers'
``DeepseekV3ForCausalLM`` on the meta device: no weights, no downloads. Not built: the
multi-token-prediction module (``num_nextn_predict_layers`` 1, which transformers' model does not
have) and YaRN's rope scaling (it changes no op's cost). The routed tokens are priced as spread
evenly over the experts (docs/design.md §2); under expert parallelism each EP member runs its
E/e experts on the tokens dispatched to it (§6.8). Under tensor parallelism the latent down
projections and the router stay whole, as Megatron-core's MLA runs them (§5.2).
"""

import torch
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

NAME = "deepseek-v3-671b"
SEQ_LEN = 4096


def config(num_hidden_layers: int = 61) -> DeepseekV3Config:
    return DeepseekV3Config(
        vocab_size=129280,
        hidden_size=7168,
        intermediate_size=18432,
        moe_intermediate_size=2048,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=128,
        num_key_value_heads=128,
        n_shared_experts=1,
        n_routed_experts=256,
        routed_scaling_factor=2.5,
        kv_lora_rank=512,
        q_lora_rank=1536,
        qk_rope_head_dim=64,
        v_head_dim=128,
        qk_nope_head_dim=128,
        n_group=8,
        topk_group=4,
        num_experts_per_tok=8,
        first_k_dense_replace=3,
        norm_topk_prob=True,
        max_position_embeddings=163840,
        rms_norm_eps=1e-6,
        rope_theta=10000,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )


def get_model() -> torch.nn.Module:
    return DeepseekV3ForCausalLM(config())


def get_inputs(micro_batch_size: int, seq_len: int = SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"input_ids": ids, "labels": ids}
