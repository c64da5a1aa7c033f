"""examples/fms_llama.py, IBM's fms LLaMA as fms-fsdp trained it: the parameters of Llama 2 at
each variant (the GEMMs are the same), and what differs in between traced as fms runs it:
RoPE as an fp32 broadcast product of twice q's elements summed over its last dimension,
grouped-query K and V copied to every query head before SDPA, the loss on the bf16 logits."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from phaze_ir.frontend import load_model_file, trace_model

ROOT = Path(__file__).resolve().parents[1]
FMS = ROOT / "examples" / "fms_llama.py"


def _fms():
    spec = importlib.util.spec_from_file_location("_test_fms_llama", FMS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "variant, example", [("7b", "llama2_7b"), ("13b", "llama2_13b"), ("34b", "llama2_34b"), ("70b", "llama2_70b")]
)
def test_every_variant_has_llama_2s_parameters(variant, example):
    spec = importlib.util.spec_from_file_location(f"_test_{example}", ROOT / "examples" / f"{example}.py")
    hf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hf)
    with torch.device("meta"):
        ours = sum(p.numel() for p in _fms().get_model(variant).parameters())
        theirs = sum(p.numel() for p in hf.get_model().parameters())
    assert ours == theirs


def _traced(micro_batch: int = 1, seq: int = 128):
    traced = trace_model(load_model_file(FMS), micro_batch, seq, training=True, dtype="bfloat16", max_blocks=3)
    vals = [n.meta.get("val") for n in traced.graph_module.graph.nodes if n.op == "call_function"]
    return [(tuple(v.shape), v.dtype) for v in vals if isinstance(v, torch.Tensor)]


def test_rope_runs_in_fp32_and_the_loss_on_bf16_logits():
    b, s, heads, head_dim = 1, 128, 32, 128
    values = _traced(b, s)
    rotation = (b, s, heads, head_dim // 2, 2, 2)  # q's pairs times their 2 x 2 rotations
    assert (rotation, torch.float32) in values
    assert ((b, s, heads, head_dim // 2, 2), torch.float32) in values  # summed, before the cast back
    logits = (b * s, 32_000)
    assert (logits, torch.bfloat16) in values and (logits, torch.float32) not in values
