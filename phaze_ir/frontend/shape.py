"""The model's shape as a launcher builds it: what Megatron-LM's GPT builder and a torchtitan
model flavour need beyond the parallel settings (hidden size, heads, query groups, FFN size,
activation, normalization, positions, vocabulary, tied embeddings, biases, experts).

Read from the model object before tracing (``trace_model``) and kept as the module attribute
``phaze.model_shape`` (:data:`phaze_ir.keys.MODEL_SHAPE`), so that it survives the IR round
trip and a cached answer.  A Hugging Face model says most of it in its ``config``; the rest (and
a model without one) is read from its modules: the input embedding's rows and width, the norms'
classes, the linears' biases, a gated MLP's ``gate_proj``.  What neither tells (a plain
module's head count) is left out, and an export leaves its flag out and says so.

Every field is a scalar (an int, a float, a string or a bool)::

    hidden_size, num_attention_heads, num_query_groups, kv_channels, ffn_hidden_size,
    activation ("swiglu", "gelu", "relu", ... the config's word), normalization ("RMSNorm" |
    "LayerNorm"), norm_epsilon, position_embedding ("rope" | "learned_absolute" | "none"),
    rotary_base, vocab_size, max_position_embeddings, tied_embeddings, linear_bias,
    qkv_bias, num_experts, moe_router_topk, moe_ffn_hidden_size, attention_dropout,
    hidden_dropout
"""

from __future__ import annotations

from typing import Any

Shape = dict[str, "int | float | str | bool"]

# Hugging Face config fields of each shape field, in the order a config is asked (models name
# them differently: GPT-2 n_embd, OPT ffn_dim, BERT layer_norm_eps, Mixtral num_local_experts).
_CONFIG_FIELDS: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head"),
    "num_query_groups": ("num_key_value_heads",),
    "kv_channels": ("head_dim",),
    "ffn_hidden_size": ("intermediate_size", "n_inner", "ffn_dim"),
    "norm_epsilon": ("rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "norm_eps"),
    "rotary_base": ("rope_theta",),
    "vocab_size": ("vocab_size",),
    "max_position_embeddings": ("max_position_embeddings", "n_positions"),
    "num_experts": ("num_local_experts", "num_experts"),
    "moe_router_topk": ("num_experts_per_tok",),
    "moe_ffn_hidden_size": ("moe_intermediate_size",),
}
_ACTIVATION_FIELDS = ("hidden_act", "activation_function")
#: Dropout probabilities (0 is a value here, unlike the sizes above): the attention probabilities'
#: (Llama attention_dropout, GPT-2 attn_pdrop, BERT attention_probs_dropout_prob) and the hidden
#: states' after attention and MLP (GPT-2 resid_pdrop, BERT hidden_dropout_prob, OPT dropout).
_DROPOUT_FIELDS: dict[str, tuple[str, ...]] = {
    "attention_dropout": ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob"),
    "hidden_dropout": ("hidden_dropout", "resid_pdrop", "hidden_dropout_prob", "dropout"),
}
#: The linears whose bias Megatron-LM sets apart (``--add-qkv-bias``): attention's q, k, v.
_QKV_NAMES = ("q_proj", "k_proj", "v_proj", "query", "key", "value", "qkv_proj", "c_attn")


def _config_value(config: Any, names: tuple[str, ...]) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return value
    return None


def model_shape(model: Any) -> Shape:
    """The shape fields of ``model`` (a ``torch.nn.Module``) that it tells (see the module
    docstring); never raises on a model it does not understand, it says less."""
    import torch

    shape: Shape = {}
    config = getattr(model, "config", None)
    if config is not None:
        for field, names in _CONFIG_FIELDS.items():
            value = _config_value(config, names)
            if value is not None and value > 0:
                shape[field] = value
        rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
        if "rotary_base" not in shape and isinstance(rope, dict):  # transformers 5 keeps rope_theta there
            theta = rope.get("rope_theta")
            if isinstance(theta, (int, float)) and not isinstance(theta, bool) and theta > 0:
                shape["rotary_base"] = theta
        for name in _ACTIVATION_FIELDS:
            act = getattr(config, name, None)
            if isinstance(act, str):
                shape["activation"] = act
                break
    modules = list(model.named_modules())
    _dropouts(shape, config, modules)
    embedding = _input_embedding(model)
    if embedding is not None:
        shape.setdefault("vocab_size", int(embedding.num_embeddings))
        shape.setdefault("hidden_size", int(embedding.embedding_dim))
    # A gated MLP: Llama's gate_proj, Mixtral's experts' fused gate_up_proj (or w1 and w3).
    leaf_names = [name.rsplit(".", 1)[-1] for name, _ in [*modules, *model.named_parameters()]]
    gated = any(n in ("gate_proj", "gate_up_proj", "w1", "w3") for n in leaf_names)
    if gated and shape.get("activation") in ("silu", "swish", None):
        shape["activation"] = "swiglu"  # silu(gate) * up: Megatron-LM's --swiglu
    norms = {type(m).__name__ for _, m in modules if type(m).__name__.endswith("Norm")}
    if any("RMSNorm" in n for n in norms):
        shape["normalization"] = "RMSNorm"
    elif any(isinstance(m, torch.nn.LayerNorm) for _, m in modules):
        shape["normalization"] = "LayerNorm"
    position = _position_embedding(config, modules, shape.get("max_position_embeddings"))
    if position is not None:
        shape["position_embedding"] = position
    if position != "rope":
        shape.pop("rotary_base", None)
    if "rotary_base" in shape and float(shape["rotary_base"]).is_integer():
        shape["rotary_base"] = int(shape["rotary_base"])  # Megatron-LM's --rotary-base is an int
    tied = _tied(model, config)
    if tied is not None:
        shape["tied_embeddings"] = tied
    biased = [
        name.rsplit(".", 1)[-1]
        for name, m in modules
        if (isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D") and getattr(m, "bias", None) is not None
    ]
    if any(isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D" for _, m in modules):
        shape["linear_bias"] = any(n not in _QKV_NAMES for n in biased)
        shape["qkv_bias"] = any(n in _QKV_NAMES for n in biased)
    heads, hidden = shape.get("num_attention_heads"), shape.get("hidden_size")
    if heads is not None and shape.get("num_query_groups") == heads:
        del shape["num_query_groups"]  # plain multi-head attention
    if isinstance(heads, int) and isinstance(hidden, int) and shape.get("kv_channels") == hidden // heads:
        del shape["kv_channels"]  # the default head width
    if "ffn_hidden_size" not in shape and config is not None and isinstance(hidden, int):
        if getattr(config, "model_type", "") == "gpt2":  # GPT-2's n_inner None means 4 x n_embd
            shape["ffn_hidden_size"] = 4 * hidden
    if "num_experts" in shape and "moe_ffn_hidden_size" not in shape and "ffn_hidden_size" in shape:
        shape["moe_ffn_hidden_size"] = shape["ffn_hidden_size"]  # Mixtral: intermediate_size is an expert's
    return shape


def _dropouts(shape: Shape, config: Any, modules: list) -> None:
    """``attention_dropout`` and ``hidden_dropout`` from the config (:data:`_DROPOUT_FIELDS`); a
    probability the config does not name is 0 when the model has no dropout module at all (Llama
    names only its attention's, and drops nothing else), else left out (unknown)."""
    import torch

    has_dropout = any(isinstance(m, torch.nn.Dropout) for _, m in modules)
    for field, names in _DROPOUT_FIELDS.items():
        for name in names:
            value = getattr(config, name, None) if config is not None else None
            if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1:
                shape[field] = float(value)
                break
        else:
            if not has_dropout:
                shape[field] = 0.0


def _input_embedding(model: Any) -> Any:
    import torch

    get = getattr(model, "get_input_embeddings", None)
    try:
        emb = get() if callable(get) else None
    except Exception:  # a model whose hook is not implemented (transformers raises NotImplementedError)
        emb = None
    if isinstance(emb, torch.nn.Embedding):
        return emb
    return next((m for m in model.modules() if isinstance(m, torch.nn.Embedding)), None)


def _position_embedding(config: Any, modules: list[tuple[str, Any]], positions: Any) -> str | None:
    import torch

    if any("rotary" in name.lower() or "rotary" in type(m).__name__.lower() for name, m in modules):
        return "rope"
    if config is not None and (
        getattr(config, "rope_theta", None) is not None or getattr(config, "rope_parameters", None) is not None
    ):
        return "rope"
    if isinstance(positions, int):
        # A learned table has a row per position (OPT's keeps 2 more, its offset).
        if any(
            isinstance(m, torch.nn.Embedding) and m.num_embeddings in (positions, positions + 2) for _, m in modules
        ):
            return "learned_absolute"
    if config is not None:
        return "none"
    return None


def _tied(model: Any, config: Any) -> bool | None:
    get_out, get_in = getattr(model, "get_output_embeddings", None), getattr(model, "get_input_embeddings", None)
    try:
        out, inp = (get_out() if callable(get_out) else None), (get_in() if callable(get_in) else None)
    except Exception:
        out, inp = None, None
    if out is not None and inp is not None:
        return getattr(out, "weight", None) is getattr(inp, "weight", None)
    value = getattr(config, "tie_word_embeddings", None) if config is not None else None
    return value if isinstance(value, bool) else None
