"""The third hostile pass (issue 58 item 4): a model within the loader's own bounds that would
trace for an hour (a config.json of 10,000 layers, an MLP of 20,000 blocks) is refused in one
line before any trace, by its size (``phaze_ir.frontend.trace.MAX_LEAF_MODULES``), not a clock."""

from __future__ import annotations

import json

import pytest

from phaze_ir.errors import PhazeError
from phaze_ir.frontend.trace import MAX_LEAF_MODULES

MLP = """\
import torch
def get_model():
    return torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()) for _ in range({n})])
def get_inputs(micro_batch_size):
    return (torch.zeros(micro_batch_size, 16),)
def loss_fn(out):
    return out.sum()
"""


def test_a_config_json_of_10000_layers_is_refused_before_it_is_built(tmp_path):
    from phaze_ir.frontend.loader import load_hf_config

    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 10_000, "vocab_size": 256,
        "max_position_embeddings": 128,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = load_hf_config(tmp_path / "config.json")
    with pytest.raises(PhazeError) as info:
        spec.get_model()
    said = str(info.value)
    assert "\n" not in said
    assert said.startswith("config.json: num_hidden_layers = 10,000: at least 20,000 leaf modules"), said


def test_an_mlp_of_20000_blocks_is_refused_before_its_trace(tmp_path):
    from phaze_ir.frontend.loader import load_model_file
    from phaze_ir.frontend.trace import trace_model

    file = tmp_path / "mlp.py"
    file.write_text(MLP.format(n=20_000))
    with pytest.raises(PhazeError, match=r"^mlp\.py: more than 16,384 leaf modules .*Llama-3\.1-405B has 1,264$"):
        trace_model(load_model_file(file), 1)


def test_the_bound_is_inclusive_and_far_above_published_models():
    import torch

    from phaze_ir.frontend.trace import _check_size

    class Spec:
        path = __import__("pathlib").Path("m.py")

    with torch.device("meta"):
        at = torch.nn.Sequential(*[torch.nn.ReLU() for _ in range(MAX_LEAF_MODULES)])
    _check_size(at, Spec)  # type: ignore[arg-type]
    at.append(torch.nn.ReLU())
    with pytest.raises(PhazeError):
        _check_size(at, Spec)  # type: ignore[arg-type]
    assert MAX_LEAF_MODULES > 10 * 1_264  # Llama-3.1-405B's leaves, ten times over
