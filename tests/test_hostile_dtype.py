"""The third hostile pass (issue 58 item 6): ``--dtype fp8`` on a model with no linear that
Transformer Engine would run in FP8 (a CNN: its GEMMs are convolutions) changes nothing, and
says so in one warning instead of pricing bf16 silently."""

from __future__ import annotations

from conftest import MODELS, run_tool

WORDS = "the model has no linear Transformer Engine runs in FP8"


def test_fp8_that_cannot_apply_is_said_in_one_warning(tmp_path):
    r = run_tool(
        "phazec", str(MODELS / "tiny_cnn.py"), "--hw", "h100", "--devices", "2", "--global-batch", "8",
        "--dtype", "fp8", "-o", str(tmp_path / "plan.mlir"),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if WORDS in line]
    assert len(said) == 1, r.stderr
    assert said[0].startswith("phazec: warning: --dtype fp8: ") and "priced in bf16" in said[0]


def test_fp8_linears_of_a_transformer_are_found():
    """The rule the warning applies: tiny GPT-2's linears (Conv1D) are TE's FP8 linears."""
    import torch

    from phaze_ir.frontend.float8_linear import fp8_linears
    from phaze_ir.frontend.loader import load_model_file

    spec = load_model_file(MODELS / "tiny_gpt2.py")
    with torch.device("meta"):
        model = spec.get_model()
    assert fp8_linears(model)
    cnn = load_model_file(MODELS / "tiny_cnn.py")
    with torch.device("meta"):
        assert fp8_linears(cnn.get_model()) == []
