"""The third hostile pass (issue 58 item 4): a model within the loader's own bounds that would
trace for an hour (a config.json of 10,000 layers, an MLP of 20,000 blocks) is refused in one
line before any trace, by its size (``phaze_ir.frontend.trace.MAX_LEAF_MODULES``), not a clock;
the bound is the most a published model needs (a 1T GPT: 1,285 leaves), where a model at it
compiles in about the CPU time of that model (30-36 s; a config.json of 204 layers took 34 s, 1,000
layers 114 s: docs/benchmarks.md), and a model beyond it is refused once, when
the compilation starts, not by each of the sweep's traces."""

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
    assert f"more than phaze compiles ({MAX_LEAF_MODULES:,};" in said, said


def test_an_mlp_of_20000_blocks_is_refused_before_its_trace(tmp_path):
    from phaze_ir.frontend.loader import load_model_file
    from phaze_ir.frontend.trace import trace_model

    file = tmp_path / "mlp.py"
    file.write_text(MLP.format(n=20_000))
    with pytest.raises(PhazeError, match=r"^mlp\.py: more than 1,344 leaf modules .*a 1T GPT, has 1,285$"):
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
    assert MAX_LEAF_MODULES > 1_264  # Llama-3.1-405B's leaves, the most of examples/ (next test)


def _leaves(path) -> int:
    from phaze_ir.frontend.loader import load_model_file
    from phaze_ir.frontend.trace import _model_on_meta

    model = _model_on_meta(load_model_file(path))
    return sum(1 for m in model.modules() if next(m.children(), None) is None)


def test_every_example_model_is_within_the_bound():
    """The bound refuses no model of examples/ (the published ones: GPT-3 175B, Llama-3.1-405B...)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "examples"
    files = sorted(root.glob("*.py")) + sorted(root.glob("hf/*/config.json"))
    counts = {f.name if f.suffix == ".py" else f.parent.name: _leaves(f) for f in files}
    assert counts["llama3_405b.py"] == 1_264
    assert max(counts.values()) == 1_264, counts
    assert max(counts.values()) <= MAX_LEAF_MODULES


def test_the_largest_published_run_is_within_the_bound(tmp_path):
    """The 1T GPT of data/published/korthikanti2022.csv (128 layers, as phaze-validate builds
    it): 1,285 leaves, priced, not refused (a bound of 1,280 refused it)."""
    import dataclasses
    import importlib.util
    import sys
    from pathlib import Path

    from phaze import validate as v

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("price_published", root / "benchmarks" / "price_published.py")
    pp = importlib.util.module_from_spec(spec)
    sys.modules["price_published"] = pp
    spec.loader.exec_module(pp)
    shape = dataclasses.replace(pp.gpt_shape("gpt:h25600-a160-l128-v50257"), seq_len=2048)
    assert _leaves(v.write_model_file(shape, tmp_path)) == 1_285 <= MAX_LEAF_MODULES


def _config(tmp_path, layers: int):
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": layers, "vocab_size": 256,
        "max_position_embeddings": 128,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path / "config.json"


@pytest.fixture
def no_trace(monkeypatch):
    """Any trace fails the test: what is refused must be refused before one."""
    from phaze_ir.frontend import trace

    def traced(*args, **kwargs):
        raise AssertionError("a trace was started")

    monkeypatch.setattr(trace, "_make_fx", traced)


def test_a_config_json_within_the_depth_check_but_beyond_the_bound_is_refused_once_before_any_trace(
    tmp_path, no_trace, capsys
):
    """256 tiny Llama layers: 512 linears by the config's count (within the depth check), 2,564
    leaves once built: refused in one line by phazec when it starts, not by the sweep's first
    cut trace and again by the whole model's (which said it twice, after 25 s)."""
    from phaze.tools import phazec

    file = _config(tmp_path, 256)
    assert _leaves(file) == 2_564 > MAX_LEAF_MODULES >= 2 * 256
    rc = phazec.main([str(file), "--hw", "h100", "--devices", "8", "--no-cache", "-o", str(tmp_path / "p.mlir")])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert err.strip().splitlines() == [
        "phazec: error: config.json: more than 1,344 leaf modules (linears, norms, activations), the most phaze "
        "compiles (its compilation grows with them: about half a minute of CPU at the bound); the largest published "
        "model phaze prices, a 1T GPT, has 1,285"
    ], err
    assert not (tmp_path / "p.mlir").exists()


def test_a_model_at_the_bound_is_not_refused(tmp_path):
    """134 tiny Llama layers: 1,344 leaves, at the bound: the compilation starts."""
    from phaze.driver import start_compilation
    from phaze.options import Options

    file = _config(tmp_path, 134)
    (tmp_path / "over").mkdir()
    assert _leaves(file) == 1_344 == MAX_LEAF_MODULES < _leaves(_config(tmp_path / "over", 135)) == 1_354
    start_compilation(str(file), Options(hw="h100", devices=8))


def test_the_api_refuses_a_model_beyond_the_bound_before_any_trace(tmp_path, no_trace):
    import phaze

    with pytest.raises(PhazeError, match=r"^config\.json: more than 1,344 leaf modules"):
        phaze.compile(str(_config(tmp_path, 256)), "h100", devices=8)
