"""The model FLOPs count only the backward GEMMs the step computes (issue 58, item 6): a CNN's
first convolution reads the image, which has no gradient, so its backward is its weight
gradient alone; counted three times, the model FLOPs exceeded the FLOPs the devices run (MFU
above HFU).  A transformer's count is the convention's 3 x its forward GEMMs, as before."""

from __future__ import annotations

import pytest
from conftest import MODELS, compiled

from phaze_ir import keys
from phaze_ir.dialect import MatmulOp
from phaze_ir.ir import parse_module


def _forward_gemms(model: str) -> tuple[int, dict[str, int]]:
    """``phaze.model_flops`` of the traced step, and the forward GEMM FLOPs by module."""
    module = parse_module(compiled(str(MODELS / model)))
    by_module: dict[str, int] = {}
    for op in module.walk():
        if isinstance(op, MatmulOp) and keys.string_of(op, keys.PHASE) == "fwd":
            name = keys.string_of(op, keys.MODULE)
            by_module[name] = by_module.get(name, 0) + op.flops()
    return module.attributes[keys.MODEL_FLOPS].value.data, by_module


def test_a_cnns_first_convolution_counts_no_input_gradient():
    flops, fwd = _forward_gemms("tiny_cnn.py")
    assert set(fwd) == {"conv1", "conv2", "head"}
    assert flops == 2 * fwd["conv1"] + 3 * (fwd["conv2"] + fwd["head"])  # was 3 x all


def test_a_transformer_counts_three_times_its_forward_gemms():
    flops, fwd = _forward_gemms("tiny_gpt2.py")
    assert flops == 3 * sum(fwd.values())


@pytest.mark.parametrize("model", ["tiny_cnn.py"])
def test_mfu_is_at_most_hfu(model):
    """The plan's own figures (the summary's MFU and HFU over the same time and peak)."""
    import json

    from phaze.tools.phazec import _parser
    from phaze.tools.phazec import compiled as run

    args = _parser().parse_args(
        [str(MODELS / model), "--hw", "a100", "--devices", "1", "--global-batch", "8", "--micro-batch", "8",
         "--tp", "1", "-q", "--json", "unused.json"]
    )  # fmt: skip
    _, failure, files = run(args, lambda msg: None)
    assert failure is None
    summary = json.loads(next(text for path, text, _ in files if path == "unused.json"))["summary"]
    assert 0 < summary["mfu_causal"] <= summary["hfu"]
