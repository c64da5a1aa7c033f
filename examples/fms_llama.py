"""IBM's fms LLaMA as fms-fsdp trained it in 2024: the model whose steps the fms-fsdp rows of
data/published/multi_gpu_runs.csv measured, op for op (not transformers' Llama).

A port of foundation-model-stack at f206f3eb (2024-03-22; its llama.py, modules/attention.py,
positions.py, layernorm.py, feedforward.py and embedding.py are the same code from the
"Contiguous Rope" commit b85a0d8c of 2024-02-26 to the fused QKV of 26b293ee, 2024-05-17, so
for both fms-fsdp READMEs' tables, 4ffb9bdf of 2024-03-21 and ed74fd5d of 2024-05-09), with the
loss fms-fsdp's training loop computes (``fms_fsdp/utils/train_utils.py`` ``train``:
``CrossEntropyLoss()(output.view(-1, V), label.view(-1).long())`` on the model's logits) and
its sizes (``fms_fsdp/utils/config_utils.py`` ``get_model_config``). The parameters are the
same as Llama 2's, and so are the GEMMs; what differs from transformers' Llama is what runs
between them:

- RoPE (``RotaryEmbedding.adjusted_qk``): q and k cast to fp32, each pair of elements
  multiplied by a 2 x 2 rotation as a broadcast product of B x L x H x D/2 x 2 x 2 fp32
  elements (twice q's elements, at 4 bytes each), summed over its last dimension and cast back
  to bf16, the rotations gathered from a cached fp32 table by position; transformers' rotates
  in the activations' dtype (``q * cos + rotate_half(q) * sin``).
- grouped-query K and V expanded to every query head before SDPA (``expand`` then
  ``flatten``: a copy), as fms's ``MultiHeadAttention`` did before SDPA took GQA.
- the loss on the bf16 logits as the model returns them (transformers' casts them to fp32).

Everything else (RMSNorm in fp32 with ``use_high_precision_pow``, SwiGLU as ``wg``/``w1``/
``w2``, separate query/key/value linears, SDPA with ``is_causal``, an untied head) is as
transformers' Llama 2 has it. Built on the meta device by phaze: no weights, no downloads.
"""

import torch
from torch import nn
from torch.nn import functional as F

NAME = "fms-llama2-7b"
SEQ_LEN = 4096

#: fms-fsdp's model variants (fms_fsdp/utils/config_utils.py, 4ffb9bdf and ed74fd5d alike):
#: emb_dim, nheads, kvheads (0: as nheads), nlayers, hidden_grow_factor, multiple_of; the
#: vocabulary (32,000) and norm eps (1e-5) are LLaMAConfig's defaults.
VARIANTS = {
    "7b": (4096, 32, 0, 32, 8 / 3, 256),
    "13b": (5120, 40, 0, 40, 13824 / 5120, 256),
    "34b": (8192, 64, 8, 48, 22016 / 8192, 256),
    "70b": (8192, 64, 8, 80, 28672 / 8192, 4096),
}
VOCAB = 32_000
NORM_EPS = 1e-5


class LayerNormParameterized(nn.Module):
    """fms's RMSNorm (``use_mean=False``, ``elementwise_scale=True``, ``use_high_precision_pow=True``)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        x = xf.type_as(x)
        return self.weight * x


class RotaryEmbedding(nn.Module):
    """fms's RotaryEmbedding (positions.py): the rotations of every position cached as an fp32
    table of ``max_seq_len x dim/2 x 2 x 2`` (a buffer here, where fms keeps a dict of tensors;
    ``adjusted_qk`` casts what it gathers to fp32 either way), applied as fms applies them."""

    def __init__(self, dim: int, max_seq_len: int, ratio: float = 10_000.0):
        super().__init__()
        freqs = 1.0 / (ratio ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
        t = torch.arange(max_seq_len, dtype=freqs.dtype)
        freqs = torch.outer(t, freqs).float()
        table = torch.stack([torch.cos(freqs), -torch.sin(freqs), torch.sin(freqs), torch.cos(freqs)], dim=2)
        self.register_buffer("cached_freqs", table.view(*freqs.size(), 2, 2), persistent=False)

    def adjusted_qk(self, q, k):
        """q, k: B x L x H x Eh, rotated as fms's ``adjusted_qk`` (no cache, no position ids given)."""
        seq_len = max(k.size(1), q.size(1))
        position_ids = torch.arange(0, seq_len, dtype=torch.long, device=q.device).repeat(k.size(0), 1)
        q_ = q.float().view(*q.size()[:-1], -1, 2)  # B L H D/2 2
        k_ = k.float().view(*k.size()[:-1], -1, 2)  # B L H D/2 2
        freqs = self.cached_freqs[position_ids]
        freqs = freqs.float()  # B L D/2 2 2
        q_out = freqs[:, -q.size(1) :, None, :, :, :].mul(q_.unsqueeze(-2)).sum(5).flatten(3).type_as(q)
        k_out = freqs[:, -k.size(1) :, None, :, :, :].mul(k_.unsqueeze(-2)).sum(5).flatten(3).type_as(k)
        return q_out.view_as(q), k_out.view_as(k)


class MultiHeadAttention(nn.Module):
    """fms's MultiHeadAttention, self-attention with a causal mask and no cache."""

    def __init__(self, emb_dim: int, nheads: int, kvheads: int):
        super().__init__()
        self.nheads, self.kvheads = nheads, kvheads
        self.head_dim = emb_dim // nheads
        self.query = nn.Linear(emb_dim, nheads * self.head_dim, bias=False)
        self.key = nn.Linear(emb_dim, kvheads * self.head_dim, bias=False)
        self.value = nn.Linear(emb_dim, kvheads * self.head_dim, bias=False)
        self.dense = nn.Linear(nheads * self.head_dim, emb_dim, bias=False)

    def forward(self, x, rotary: RotaryEmbedding):
        b, q_len, _ = x.size()
        queries = self.query(x).view(b, q_len, self.nheads, self.head_dim)
        keys = self.key(x).view(b, q_len, self.kvheads, self.head_dim)
        values = self.value(x).view(b, q_len, self.kvheads, self.head_dim)
        queries, keys = rotary.adjusted_qk(queries, keys)
        queries = queries.transpose(2, 1)
        keys = keys.transpose(2, 1)
        values = values.transpose(2, 1)
        expansion = self.nheads // self.kvheads
        if expansion != 1:
            keys = keys.unsqueeze(2).expand(-1, -1, expansion, -1, -1).flatten(1, 2)
            values = values.unsqueeze(2).expand(-1, -1, expansion, -1, -1).flatten(1, 2)
        attn = F.scaled_dot_product_attention(queries, keys, values, attn_mask=None, dropout_p=0.0, is_causal=True)
        attn = attn.transpose(2, 1).contiguous().view(b, q_len, self.nheads * self.head_dim)
        return self.dense(attn)


class GatedLinearUnit(nn.Module):
    """fms's GatedLinearUnit with SiLU (``activation_fn="swish"``), no bias, no dropout."""

    def __init__(self, emb_dim: int, hidden_grow_factor: float, multiple_of: int):
        super().__init__()
        hidden = int(hidden_grow_factor * emb_dim)
        hidden = multiple_of * ((hidden + multiple_of - 1) // multiple_of)
        self.w1 = nn.Linear(emb_dim, hidden, bias=False)
        self.wg = nn.Linear(emb_dim, hidden, bias=False)
        self.a = nn.SiLU()
        self.w2 = nn.Linear(hidden, emb_dim, bias=False)

    def forward(self, x):
        return self.w2(self.a(self.wg(x)) * self.w1(x))


class LLaMABlock(nn.Module):
    """fms's LLaMABlock: pre-norm attention and SwiGLU, each with its residual add."""

    def __init__(self, emb_dim, nheads, kvheads, hidden_grow_factor, multiple_of):
        super().__init__()
        self.ln = LayerNormParameterized(emb_dim, NORM_EPS)
        self.ff_ln = LayerNormParameterized(emb_dim, NORM_EPS)
        self.attn = MultiHeadAttention(emb_dim, nheads, kvheads)
        self.ff_sub_layer = GatedLinearUnit(emb_dim, hidden_grow_factor, multiple_of)

    def forward(self, x, rotary: RotaryEmbedding):
        x = self.attn(self.ln(x), rotary) + x
        return self.ff_sub_layer(self.ff_ln(x)) + x


class WordEmbedding(nn.Module):
    """fms's WordEmbedding with ``reversible=True, tie_weights=False``: an embedding and a head."""

    def __init__(self, vocab: int, emb_dim: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, emb_dim)
        self.head = nn.Linear(emb_dim, vocab, bias=False)

    def forward(self, inp, reverse=False):
        return self.head(inp) if reverse else self.emb(inp)


class LLaMA(nn.Module):
    """fms's LLaMA (no cache, no mask: causal), returning the logits."""

    def __init__(self, variant: str = "7b", max_seq_len: int = SEQ_LEN):
        super().__init__()
        emb_dim, nheads, kvheads, nlayers, grow, multiple_of = VARIANTS[variant]
        kvheads = kvheads or nheads
        self.shared = WordEmbedding(VOCAB, emb_dim)
        self.rot_emb = RotaryEmbedding(emb_dim // nheads, max_seq_len)
        self.layers = nn.ModuleList(LLaMABlock(emb_dim, nheads, kvheads, grow, multiple_of) for _ in range(nlayers))
        self.dec_norm = LayerNormParameterized(emb_dim, NORM_EPS)

    def forward(self, x):
        x = self.shared(x)
        for layer in self.layers:
            x = layer(x, self.rot_emb)
        return self.shared(self.dec_norm(x), reverse=True)


class FmsFsdpStep(nn.Module):
    """fms-fsdp's training step's forward: the model, then the cross-entropy of its logits."""

    def __init__(self, variant: str = "7b", max_seq_len: int = SEQ_LEN):
        super().__init__()
        self.model = LLaMA(variant, max_seq_len)

    def forward(self, input, label):
        output = self.model(input)
        return nn.CrossEntropyLoss()(output.view(-1, output.size(-1)), label.view(-1).long())


def get_model(variant: str = "7b") -> nn.Module:
    return FmsFsdpStep(variant)


def get_inputs(micro_batch_size: int, seq_len: int = SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return (ids, ids)
