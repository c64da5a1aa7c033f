"""One FLOP convention (issues 55 and 58): the summary's MFU counts a causal attention as its
kernels compute it, half its square, as time and HFU do, so MFU <= HFU <= what the chip's
kernels reach on every kind of model (a causal transformer at a long sequence, under CP, a
CNN, an MoE), with and without recompute; PaLM's whole-square MFU is given beside it, labelled.
Each plan is one small model on one chip (``phaze.compile``), its figures read from the summary."""

from __future__ import annotations

import functools
import textwrap
import warnings

import pytest
from conftest import MODELS

import phaze
from phaze.plan import summary as plan_summary

MOE = textwrap.dedent(
    """
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    NAME = "tiny-mixtral-sdpa"
    SEQ_LEN = 256


    def get_model():
        return MixtralForCausalLM(
            MixtralConfig(
                vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                max_position_embeddings=256, attn_implementation="sdpa",
            )
        )


    def get_inputs(b, seq_len=SEQ_LEN):
        ids = torch.zeros(b, seq_len, dtype=torch.long)
        return {"input_ids": ids, "labels": ids}
    """
)


@functools.cache
def _moe_file(tmp: str) -> str:
    from pathlib import Path

    path = Path(tmp) / "tiny_mixtral_sdpa.py"
    path.write_text(MOE)
    return str(path)


@functools.cache
def _summary(model: str, hw: str, recompute: str, **given) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a tiny model beyond its max_position_embeddings
        plan = phaze.compile(model, hw=hw, micro_batch=1, recompute=recompute, **given)
    assert plan.feasible and plan.summary is not None
    return plan.summary


LLAMA = str(MODELS / "tiny_llama_sdpa.py")
CASES = {
    # a causal transformer at a long sequence, Megatron-LM's fused causal kernels
    "llama-8k": (LLAMA, "h100", dict(devices=1, global_batch=1, tp=1, seq_len=8192, kernels="megatron")),
    # the same split over two devices by context parallelism
    "llama-cp2": (
        LLAMA,
        "h100",
        dict(devices=2, global_batch=1, tp=1, seq_len=8192, kernels="megatron", context_parallel=2),
    ),
    "cnn": (str(MODELS / "tiny_cnn.py"), "a100", dict(devices=1, global_batch=8, tp=1)),
}


def _case(name: str, recompute: str, tmp_path_factory) -> dict:
    if name.startswith("moe"):
        model = _moe_file(str(tmp_path_factory.getbasetemp()))
        # moe-cf2: every expert padded to twice its share of the routed tokens
        extra = {"capacity_factor": 2.0} if name == "moe-cf2" else {}
        return _summary(model, "h100", recompute, devices=1, global_batch=1, tp=1, **extra)
    model, hw, given = CASES[name]
    return _summary(model, hw, recompute, **given)


@pytest.mark.parametrize(
    "name, recompute",
    [(n, r) for n in ("llama-8k", "llama-cp2", "cnn", "moe", "moe-cf2") for r in ("none", "full")]
    + [("llama-8k", "selective"), ("moe", "selective")],
)
def test_mfu_is_at_most_hfu_at_most_the_kernels(name, recompute, tmp_path_factory):
    s = _case(name, recompute, tmp_path_factory)
    assert 0 < s["mfu_causal"] <= s["hfu"] <= s["hfu_ceiling"] <= 1
    assert s["mfu_causal"] <= s["mfu_palm"]
    assert s["model_flops_causal_per_batch"] <= s["model_flops_palm_per_batch"] <= s["hardware_flops_per_batch"] * 2
    assert not [w for w in s["warnings"] if "pricing error" in w], s["warnings"]


@pytest.mark.parametrize("name", ["llama-8k", "llama-cp2", "moe"])
def test_a_causal_models_two_conventions_and_their_labels(name, tmp_path_factory):
    """A causal attention's square is half computed: PaLM's MFU counts the other half too (at
    8k tokens most of the work is attention: PaLM's MFU passes HFU), and says so."""
    s = _case(name, "none", tmp_path_factory)
    assert s["mfu_causal"] < s["mfu_palm"]
    if name != "moe":
        assert s["hfu"] < s["mfu_palm"]
    assert s["mfu_causal_convention"] == plan_summary.MFU_CONVENTION and "Megatron" in s["mfu_causal_convention"]
    assert s["mfu_palm_convention"] == plan_summary.MFU_PALM_CONVENTION and "PaLM" in s["mfu_palm_convention"]
    rate = next(line for line in s["lines"] if "tokens/s" in line)
    assert f"MFU {plan_summary.percent(s['mfu_causal'])}, HFU" in rate
    (said,) = [line for line in s["lines"] if line.startswith("MFU convention: ")]
    assert said.startswith(f"MFU convention: {plan_summary.MFU_CONVENTION}; ")
    assert f"MFU {plan_summary.percent(s['mfu_palm'])} with {plan_summary.MFU_PALM_CONVENTION}" in said


def test_a_cnn_has_one_mfu():
    """No attention: both conventions count the same FLOPs, and the summary gives one figure."""
    model, hw, given = CASES["cnn"]
    s = _summary(model, hw, "none", **given)
    assert s["mfu_causal"] == s["mfu_palm"]
    (said,) = [line for line in s["lines"] if line.startswith("MFU convention: ")]
    assert "PaLM" not in said


def test_cp_counts_the_causal_half_as_one_device_does(tmp_path_factory):
    """Under CP the model FLOPs are the whole sequence's in both conventions (the trace is one
    device's share of it): the same as the one-device plan's."""
    one, two = (_case(n, "none", tmp_path_factory) for n in ("llama-8k", "llama-cp2"))
    for key in ("model_flops_causal_per_batch", "model_flops_palm_per_batch"):
        assert two[key] == pytest.approx(one[key], rel=1e-12)


def test_an_moes_model_flops_are_the_routed_tokens(tmp_path_factory):
    """Padded to a capacity factor of 2, the experts run twice the rows (HFU counts them) but
    the model FLOPs are the tokens routed, top-k experts each (Megatron-LM's count)."""
    dropless, padded = (_case(n, "none", tmp_path_factory) for n in ("moe", "moe-cf2"))
    for key in ("model_flops_causal_per_batch", "model_flops_palm_per_batch"):
        assert padded[key] == dropless[key]
    assert padded["hardware_flops_per_batch"] > dropless["hardware_flops_per_batch"] * 1.3


def test_utilisation_warnings_name_mfu_above_hfu():
    said = plan_summary.utilisation_warnings(0.5, 0.4, 0.7)
    assert said == ["MFU 50% is above HFU 40%: model FLOPs not run, a pricing error"]
    assert plan_summary.utilisation_warnings(0.4, 0.4, 0.7) == []
    (beyond,) = plan_summary.utilisation_warnings(0.4, 0.8, 0.7)
    assert beyond.startswith("HFU 80% is above the 70%")
