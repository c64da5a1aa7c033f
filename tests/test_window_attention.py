"""Sliding-window attention and attention sinks traced as the one fused kernel a GPU runs
(phaze_ir/frontend/kernel_attention.py) and priced at the window's work: a tiny GPT-OSS (sinks
on every layer, a window on alternate ones), a tiny Mistral (one window on every layer), and the
models without a window shorter than the sequence, which trace as before."""

from __future__ import annotations

import functools
import json
import math
import tempfile
from pathlib import Path

import pytest

from passes.algorithms.kernels import attention_backend
from phaze_ir.op_kinds import causal_fraction, causal_mask

SEQ, WINDOW = 128, 32

GPT_OSS = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "attention_bias": True,
    "attention_dropout": 0.0,
    "head_dim": 16,
    "hidden_act": "silu",
    "hidden_size": 64,
    "intermediate_size": 64,
    "layer_types": ["sliding_attention", "full_attention"],
    "max_position_embeddings": 4096,
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "num_local_experts": 4,
    "rms_norm_eps": 1e-05,
    "rope_parameters": {"rope_theta": 150000.0, "rope_type": "default"},
    "sliding_window": WINDOW,
    "tie_word_embeddings": False,
    "vocab_size": 256,
}
MISTRAL = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_act": "silu",
    "hidden_size": 64,
    "intermediate_size": 96,
    "max_position_embeddings": 4096,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-05,
    "rope_theta": 10000.0,
    "sliding_window": WINDOW,
    "tie_word_embeddings": False,
    "vocab_size": 256,
}


@functools.cache
def _module(config: str, seq: int = SEQ):
    """The config (JSON text) compiled on one h100 at ``seq`` tokens, priced (``--emit latency``)."""
    from phaze.tools.phazec import _parser, compile_model
    from phaze_ir.ir import parse_module

    path = Path(tempfile.mkdtemp()) / "config.json"
    path.write_text(config)
    args = _parser().parse_args(
        [str(path), "--hw", "h100", "--emit", "latency", "--seq-len", str(seq), "--micro-batch", "1", "--tp", "1"]
        + ["--devices", "1", "--global-batch", "1", "-q", "--no-cache"]
    )
    text, failure = compile_model(args, lambda msg: None)
    assert failure is None, failure
    return parse_module(text)


def _ops(module):
    from passes.graph_view import step_function

    return list(step_function(module).body.walk())


def _fused(module) -> set[str]:
    from phaze_ir import keys

    return {keys.string_of(o, keys.FUSED, "") for o in _ops(module)} - {""}


def _attention_gemms(module):
    """``(fused name, phase, op)`` of every GEMM of a window attention kernel."""
    from phaze_ir import dialect as ph
    from phaze_ir import keys

    return [
        (keys.string_of(o, keys.FUSED, ""), keys.string_of(o, keys.PHASE, "fwd"), o)
        for o in _ops(module)
        if isinstance(o, ph.MatmulOp) and keys.string_of(o, keys.FUSED, "").startswith("window_attention")
    ]


def _square_outside_kernels(module, seq: int) -> list[str]:
    """Ops outside a fused kernel with a [.., s, s] result: the math path's scores."""
    from xdsl.dialects.builtin import TensorType

    from phaze_ir import keys

    out = []
    for o in _ops(module):
        if keys.string_of(o, keys.FUSED, ""):
            continue
        for r in o.results:
            if isinstance(r.type, TensorType) and list(r.type.get_shape())[-2:] == [seq, seq]:
                out.append(o.name)
    return out


# --- the mask's share of the square ------------------------------------------------------------


def test_the_window_computes_its_band_and_a_window_as_long_as_the_sequence_is_causal():
    s = 4096
    # row i computes min(i + 1, w) scores: w·s - w(w - 1)/2 of s²
    assert causal_fraction(s, s, 64, 128) == pytest.approx((128 * s - 128 * 127 / 2) / s**2, rel=1e-12)
    assert sum(min(i + 1, 128) for i in range(s)) == 128 * s - 128 * 127 // 2
    assert causal_fraction(s, s, 64, 1) == (s + 1) / (2.0 * s)  # bit for bit as before
    assert causal_fraction(s, s, 64, s) == causal_fraction(s, s, 64)
    assert causal_fraction(s, 64, s, 128) < 0.032


def test_the_kernels_mask_is_read_from_its_fused_name():
    assert causal_mask("_scaled_dot_product_flash_attention_3 causal") == 1
    assert causal_mask("window_attention_2 window 128 sinks causal") == 128
    assert causal_mask("window_attention_1 sinks causal") == 1
    assert causal_mask("_scaled_dot_product_efficient_attention") == 0


@pytest.mark.parametrize(
    ("runtime", "cc", "want"),
    [("eager", 9.0, "flash3"), ("inductor", 8.0, "flash2"), ("megatron", 9.0, "cudnn"), ("megatron", 8.0, "flash2")],
)
def test_a_window_kernel_is_flash_attention_under_torch_and_cudnn_under_megatron(runtime, cc, want):
    assert attention_backend(runtime, cc, "window_attention_backward_1 window 128 sinks causal") == want


# --- GPT-OSS: sinks on every layer, a window on alternate ones ---------------------------------


def test_gpt_oss_attention_is_the_fused_kernel_with_its_window_and_sinks():
    module = _module(json.dumps(GPT_OSS))
    fused = _fused(module)
    assert f"window_attention window {WINDOW} sinks causal" in fused  # layer 0: sliding
    assert "window_attention_1 sinks causal" in fused  # layer 1: full, still its sinks' column
    assert any(f.startswith("window_attention_backward") and f"window {WINDOW}" in f for f in fused)
    assert _square_outside_kernels(module, SEQ) == []  # no s² scores written, none saved


def test_gpt_oss_sinks_get_their_gradient():
    from phaze_ir import keys

    module = _module(json.dumps(GPT_OSS))
    grads = [keys.string_of(o, keys.FUSED, "") for o in _ops(module) if o.name == "phaze.reduction"]
    # the backward's dsink reduction (over the batch and the rows) in each layer's kernel
    assert sum(f.startswith("window_attention_backward") for f in grads) >= 2 * 3


def test_gpt_oss_window_layers_are_priced_at_the_windows_work():
    from passes.cost_view import skipped_flops
    from phaze_ir import keys
    from phaze_ir.attributes import KernelAttr

    module = _module(json.dumps(GPT_OSS))
    gemms = _attention_gemms(module)
    windowed = [o for f, _, o in gemms if f" window {WINDOW} " in f]
    full = [o for f, _, o in gemms if " window " not in f]
    assert windowed and full
    for o in windowed:
        assert keys.require(o, keys.KERNEL, KernelAttr).as_dict()["causal"] == WINDOW
        computed = o.flops() - skipped_flops(o)
        want = (WINDOW * SEQ - WINDOW * (WINDOW - 1) / 2) / SEQ**2
        assert computed / o.flops() == pytest.approx(want, rel=1e-3)
    for o in full:
        assert keys.require(o, keys.KERNEL, KernelAttr).as_dict()["causal"] == 1
        assert (o.flops() - skipped_flops(o)) / o.flops() == pytest.approx((SEQ + 1) / (2 * SEQ), rel=1e-3)


def test_gpt_oss_mfu_takes_off_what_the_window_skips():
    from phaze_ir import keys

    module = _module(json.dumps(GPT_OSS))
    attention = keys.int_of(module, keys.ATTENTION_FLOPS, 0)
    causal = keys.int_of(module, keys.CAUSAL_ATTENTION_FLOPS, 0)
    skipped = keys.int_of(module, keys.WINDOW_SKIPPED_FLOPS, 0)
    assert attention and causal == attention // 2  # the full layer's half of the squares
    band = (WINDOW * SEQ - WINDOW * (WINDOW - 1) / 2) / SEQ**2
    assert skipped == pytest.approx((attention - causal) * (1 - band), rel=1e-6)


# --- Mistral: a window on every layer; without one shorter than the sequence, as before ----------


def test_mistral_beyond_its_window_runs_the_window_kernel():
    module = _module(json.dumps(MISTRAL))
    fused = _fused(module)
    assert any(f.startswith("window_attention") and f.endswith(f"window {WINDOW} causal") for f in fused), fused
    assert not any(f.startswith("_scaled_dot_product") for f in fused)
    assert _square_outside_kernels(module, SEQ) == []
    gemms = _attention_gemms(module)
    assert {p for _, p, _ in gemms} == {"fwd", "bwd"}


def test_mistral_within_its_window_traces_torchs_flash_attention_as_before():
    module = _module(json.dumps({**MISTRAL, "sliding_window": 4096}))
    fused = _fused(module)
    assert fused and all(f.startswith("_scaled_dot_product_flash_attention") for f in fused), fused


GEMMA_2 = {
    "architectures": ["Gemma2ForCausalLM"],
    "model_type": "gemma2",
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "max_position_embeddings": 4096,
    "sliding_window": WINDOW,
    "vocab_size": 256,
    "query_pre_attn_scalar": 16,
    "attn_logit_softcapping": 50.0,
    "final_logit_softcapping": 30.0,
}
GEMMA_3 = {
    **{k: v for k, v in GEMMA_2.items() if "softcapping" not in k},
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "layer_types": ["sliding_attention", "full_attention"],
}


@pytest.mark.parametrize(
    ("config", "full_layer"),
    [(GEMMA_2, "window_attention_1 causal"), (GEMMA_3, "_scaled_dot_product_flash_attention causal")],
)
def test_gemma_window_layers_run_the_window_kernel(config, full_layer):
    """Gemma-2 (no SDPA: soft-capping) runs both layers in the kernel, its full one causal;
    Gemma-3 (SDPA) its full layer through torch's flash attention as before."""
    module = _module(json.dumps(config))
    fused = _fused(module)
    assert f"window_attention window {WINDOW} causal" in fused and full_layer in fused, fused
    assert _square_outside_kernels(module, SEQ) == []


def test_a_window_of_one_key_is_refused_in_one_line():
    from phaze.tools.phazec import _parser, compile_model
    from phaze_ir.errors import PhazeError

    path = Path(tempfile.mkdtemp()) / "config.json"
    path.write_text(json.dumps({**MISTRAL, "sliding_window": 1}))
    args = _parser().parse_args([str(path), "--hw", "h100", "--seq-len", "64", "--micro-batch", "1", "-q"])
    with pytest.raises(
        PhazeError, match=r"^MistralForCausalLM: sliding_window = 1: a window of one key is not priced$"
    ):
        compile_model(args, lambda msg: None)


def test_a_model_without_window_or_sinks_is_not_switched():
    from transformers import LlamaConfig, LlamaForCausalLM

    from phaze_ir.frontend import kernel_attention

    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_attention_heads=2, num_hidden_layers=1, vocab_size=64
    )
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config)
    assert not kernel_attention.runs_in_kernel(model, 128)
    assert kernel_attention.switch(model, 128).config._attn_implementation == "sdpa"


def test_the_time_of_a_window_layers_attention_is_a_fraction_of_a_full_ones():
    """At 4k tokens the window layer's attention GEMMs (32 keys a query: 1.6 % of the causal
    work) take a fraction of the full layer's time: compute no longer bounds them (their Q, K, V
    and output through HBM do, at this tiny width)."""
    from phaze_ir import keys
    from phaze_ir.attributes import LatencyAttr

    module = _module(json.dumps(GPT_OSS), 4096)

    def seconds(pick):
        return sum(
            float(keys.require(o, keys.LATENCY, LatencyAttr).as_dict()["split_s"])
            for f, p, o in _attention_gemms(module)
            if pick(f)
        )

    windowed, full = seconds(lambda f: " window " in f), seconds(lambda f: " window " not in f)
    assert math.isfinite(full) and 0 < windowed < full / 4, (windowed, full)


def test_gpt_oss_plan_counts_the_window_alike_in_mfu_and_hfu():
    """The plan's MFU takes the window's skipped square off, as its HFU and time do: MFU at most
    HFU, PaLM's whole-square MFU above both, and the convention line says so."""
    from phaze.tools.phazec import main

    tmp = Path(tempfile.mkdtemp())
    (tmp / "config.json").write_text(json.dumps(GPT_OSS))
    argv = [str(tmp / "config.json"), "--hw", "h100", "--seq-len", "4096", "--micro-batch", "1", "--devices", "1"]
    argv += ["--global-batch", "1", "--tp", "1", "--no-cache", "-q", "--json", str(tmp / "plan.json")]
    assert main(argv) == 0
    summary = json.loads((tmp / "plan.json").read_text())["summary"]
    assert summary["mfu_causal"] <= summary["hfu"] < summary["mfu_palm"]
    assert "sliding window's band" in summary["mfu_causal_convention"]
