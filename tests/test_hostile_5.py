"""A fresh hostile round (issue 58's classes, session 61): each probe that failed, kept as the
test of what it checks. Options from Python with a newline or of numpy's integer types, a
factory named with control characters, a config.json whose RoPE scaling transformers cannot
build, a loop in a model's forward that the leaf bound cannot see (bounded by its torch calls,
counted, never timed), and a plan whose power record or per-layer records contradict it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from phaze_ir.errors import ModelTooLarge, PhazeError

LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 256,
    "max_position_embeddings": 128,
}  # fmt: skip

LOOP = """\
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)
    def forward(self, x):
        for _ in range({n}):
            x = self.lin(x)
        return x
def get_model():
    return M()
def get_inputs(micro_batch_size):
    return (torch.zeros(micro_batch_size, 16),)
def loss_fn(out):
    return out.sum()
"""


def test_an_api_option_with_a_newline_is_refused_in_one_escaped_line():
    from phaze.api import options

    with pytest.raises(PhazeError) as info:
        options("h100", placement="expert:1,2,\n3")
    said = str(info.value)
    assert "\n" not in said and "'expert:1,2,\\n3'" in said, said


def test_numpy_integers_and_floats_are_numbers_to_the_api():
    from phaze.api import options

    opts = options("h100", devices=np.int64(8), tp=np.int32(2), memory_headroom=np.float64(0.1))
    assert (opts.devices, opts.tp_widths, opts.memory_headroom) == (8, (2,), 0.1)
    assert type(opts.devices) is int and type(opts.memory_headroom) is float
    cp = options("h100", context_parallel=np.int64(2)).context_parallel
    assert cp == 2 and type(cp) is int  # (the degree, parsed from its word)
    with pytest.raises(PhazeError, match=r"^phaze\.compile: devices=np\.True_: expected an integer$"):
        options("h100", devices=np.True_)


def test_a_factory_name_with_control_characters_is_escaped():
    from phaze.api import factory_spec

    spec = factory_spec(lambda: None, lambda b, s: (), None, "net\x1b[31m\nerror: forged")
    assert spec.name == "net\\x1b[31m\\nerror: forged"


def test_a_rope_type_transformers_cannot_build_is_refused_naming_the_key(tmp_path):
    from phaze_ir.frontend.loader import load_hf_config

    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "rope_scaling": {"type": "\x1b[31m", "factor": 2}}))
    with pytest.raises(PhazeError) as info:
        load_hf_config(tmp_path / "config.json")  # before the model is built, not at get_model()
    said = str(info.value)
    assert said.startswith('config.json: rope_scaling: rope_type "\\u001b[31m": transformers '), said
    assert "has no such RoPE scaling (it knows default, " in said and "llama3" in said and "\x1b" not in said


def test_a_known_rope_type_is_taken(tmp_path):
    from phaze_ir.frontend.loader import load_hf_config

    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "rope_scaling": rope}))
    load_hf_config(tmp_path / "config.json").get_model()


def test_a_loop_in_the_forward_is_refused_by_its_torch_calls(tmp_path, monkeypatch):
    """One linear applied 400 times: 1 leaf module, within MAX_LEAF_MODULES, but 400 linears to
    trace and compile; refused at the trace's call bound (here lowered to 256: the real one, at
    least 16,384 calls, about 20 s of CPU, a test would not wait for)."""
    from phaze_ir.frontend import trace
    from phaze_ir.frontend.loader import load_model_file

    monkeypatch.setattr(trace, "MIN_TRACED_CALLS", 256)
    file = tmp_path / "loop.py"
    file.write_text(LOOP.format(n=400))
    with pytest.raises(ModelTooLarge, match=r"^loop\.py: its step makes more than 256 torch calls .* about 309$"):
        trace.trace_model(load_model_file(file), 1)
    file.write_text(LOOP.format(n=20))
    trace.trace_model(load_model_file(file), 1)  # within it: traced


def test_phazec_refuses_a_loop_once_without_compiling_every_point_again(tmp_path, monkeypatch, capsys):
    """The sweep's fallback (a cut trace that fails: compile every point through the pipeline)
    does not take a size refusal: it would trace the model again to the same end."""
    from phaze.tools import phazec
    from phaze_ir.frontend import trace

    monkeypatch.setattr(trace, "MIN_TRACED_CALLS", 256)
    file = tmp_path / "loop.py"
    file.write_text(LOOP.format(n=400))
    rc = phazec.main([str(file), "--hw", "h100", "--devices", "8", "--no-cache", "-q", "-o", str(tmp_path / "p.mlir")])
    err = capsys.readouterr().err
    assert rc == 1, err
    assert err.count("torch calls") == 1 and "compiling every point" not in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_the_call_bound_grows_with_the_modules_and_takes_published_models_traced_whole():
    """64 calls a leaf module, from 16,384 to 65,536: a loop of one linear gets the least; GPT-3
    175B (965 leaves, about 36,000 calls traced whole) and Llama-3.1-405B (1,264) more than
    they make; a model at MAX_LEAF_MODULES at most the cap."""
    import torch

    from phaze_ir.frontend.trace import MAX_LEAF_MODULES, MAX_TRACED_CALLS, MIN_TRACED_CALLS, traced_calls_bound

    with torch.device("meta"):
        one = torch.nn.Linear(16, 16)
        gpt3 = torch.nn.Sequential(*[torch.nn.ReLU() for _ in range(965)])
        at_bound = torch.nn.Sequential(*[torch.nn.ReLU() for _ in range(MAX_LEAF_MODULES)])
    assert traced_calls_bound(one) == MIN_TRACED_CALLS == 16_384
    assert traced_calls_bound(gpt3) == 64 * 965 > 36_000
    assert traced_calls_bound(at_bound) == MAX_TRACED_CALLS == 65_536 > 127 * 309
