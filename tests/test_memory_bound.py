"""The sweep's memory bound (``passes.algorithms.memory.logits_grad_bytes``): a lower bound on
every placement's memory of a point, from the model's shapes, which ``phaze/search/sweep.py`` prunes
points by before tracing them.  Held against the layers' memory the pipeline computes: the
largest ``workspace_bytes`` of a point's layers (what every placement of it holds, under every
recompute policy) is at least the bound, so a point the bound prunes could not have fit."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import EXAMPLES, MODELS, compiled_with

from passes.algorithms.memory import logits_grad_bytes
from phaze.search import sweep

LLAMA = str(MODELS / "tiny_llama_sdpa.py")  # vocabulary 256, 32 tokens
GPT2 = str(MODELS / "tiny_gpt2.py")


def _largest_workspace(text: str) -> int:
    from phaze_ir import keys
    from phaze_ir.attributes import LayerMemoryAttr
    from phaze_ir.ir import parse_module

    records = keys.require_records(parse_module(text), keys.LAYER_MEMORY, LayerMemoryAttr)
    return max(int(r.as_dict()["workspace_bytes"]) for r in records)


def test_the_model_gives_its_output_width():
    from phaze_ir.frontend import load_model_file
    from phaze_ir.frontend.trace import check_model_size

    assert check_model_size(load_model_file(LLAMA)) == 256
    assert check_model_size(load_model_file(str(EXAMPLES / "mlp.py"))) is None  # no LM head: nothing pruned


@pytest.mark.parametrize(
    ("model", "b", "t", "c", "flags"),
    [
        (LLAMA, 1, 1, 1, ()),  # the paper's ops, float32
        (LLAMA, 2, 2, 1, ("--hw", "h100", "--kernels", "eager")),  # bf16 autocast, flash attention
        (LLAMA, 1, 2, 1, ("--hw", "h100", "--kernels", "megatron", "--dtype", "bfloat16", "--sequence-parallel", "on")),
        (LLAMA, 2, 1, 2, ("--hw", "h100", "--kernels", "eager", "--context-parallel", "2")),  # S/2 a device
        (LLAMA, 1, 1, 1, ("--hw", "h100", "--kernels", "inductor")),  # fused kernels keep their own on chip
        (GPT2, 2, 2, 1, ("--hw", "a100", "--kernels", "eager")),  # tied embeddings
    ],
)
def test_the_bound_is_below_the_layers_memory(model, b, t, c, flags):
    from phaze_ir.frontend import load_model_file
    from phaze_ir.frontend.trace import check_model_size

    spec = load_model_file(model)
    vocab = check_model_size(spec)
    assert vocab is not None and spec.seq_len is not None
    cp = ("--seq-len", str(spec.seq_len)) if c > 1 else ()
    text = compiled_with(model, "recompute", "--micro-batch", str(b), "--tp", str(t), *cp, *flags)
    bound = logits_grad_bytes(b, spec.seq_len, vocab, t, c)
    workspace = _largest_workspace(text)
    assert 0 < bound <= workspace, (bound, workspace)


def test_a_point_is_pruned_only_past_the_chips_hbm():
    """``beyond_hbm``: a point whose bound exceeds the HBM is named with the bound in GiB; one
    at or under it, or a model without an LM head or a sequence length, is not pruned."""
    gib = 2**30
    acc = SimpleNamespace(hbm=SimpleNamespace(bytes=80 * gib))
    # Llama 3 8B at 128k tokens: micro-batch 4 at TP 1 needs 4 x 131,071 x 128,256 x 2 bytes
    why = sweep.beyond_hbm(4, 1, 1, 131072, 128256, acc)
    assert why.startswith("the gradient of the logits alone (125.2 GiB") and why.endswith("80 GiB of HBM")
    assert sweep.beyond_hbm(4, 4, 1, 131072, 128256, acc) == ""  # TP 4 splits the vocabulary
    assert sweep.beyond_hbm(4, 1, 2, 131072, 128256, acc) == ""  # CP 2 halves the tokens
    assert sweep.beyond_hbm(4, 1, 1, 131072, None, acc) == ""
    assert sweep.beyond_hbm(4, 1, 1, None, 128256, acc) == ""
    exact = SimpleNamespace(hbm=SimpleNamespace(bytes=logits_grad_bytes(4, 131072, 128256, 1, 1)))
    assert sweep.beyond_hbm(4, 1, 1, 131072, 128256, exact) == ""  # at the HBM: may fit
