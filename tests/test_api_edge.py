"""The Python API as strict as the command line (issue 58, item 5): every argument of
``phaze.compile`` checked where it is given, before any work, in one line naming it as the
caller wrote it (a wrong type is an ``OptionTypeError``: a ``PhazeError`` and a ``TypeError``);
the warnings of a compilation said once each, from the caller's line, and kept in the plan."""

from __future__ import annotations

import json
import types
import warnings

import pytest
from conftest import MODELS

import phaze
from passes.algorithms.option_values import Tristate, Zero
from phaze import api, hw_answer
from phaze.api import OptionTypeError
from phaze_ir.errors import PhazeError, PhazeWarning

TINY = str(MODELS / "tiny_gpt2.py")
PRESETS = "a100, a100_40gb, h100, h100_hbm2e, tpuv4, tpuv4_torus"


@pytest.fixture
def no_work(monkeypatch):
    """A compilation that must not start: the arguments are refused before it."""

    def answer(*args, **kwargs):
        raise AssertionError("the compilation started")

    monkeypatch.setattr(hw_answer, "answer", answer)


@pytest.mark.parametrize(
    "given, said",
    [
        ({"memory_headroom": "0.1"}, "memory_headroom='0.1': expected a number"),
        ({"hw": None}, f"hw=None: expected a preset name ({PRESETS}) or the path of a hardware TOML file"),
        ({"hw": 3}, f"hw=3: expected a preset name ({PRESETS})"),
        ({"tp": "2"}, "tp='2': expected an integer"),
        ({"devices": "8"}, "devices='8': expected an integer"),
        ({"micro_batch": True}, "micro_batch=True: expected an integer"),
        ({"micro_batches": [1, "2"]}, "micro_batches='2': expected an integer"),
        ({"dp_overlap": 1}, "dp_overlap=1: expected True or False"),
        ({"context_parallel": 2.5}, "context_parallel=2.5: expected a string or an integer"),
        ({"power_cap_w": "300"}, "power_cap_w='300': expected a number or None"),
        ({"seq_len": 8.0}, "seq_len=8.0: expected an integer or None"),
        ({"log": 3}, "log=3: expected a function or None"),
        ({"name": 3}, "name=3: expected a string or None"),
        ({"cache": 3}, "cache=3: expected a directory or None"),
    ],
)
def test_a_wrong_type_is_one_line_naming_the_argument(no_work, given, said):
    given = {"hw": "tpuv4"} | given
    with pytest.raises(OptionTypeError) as e:
        phaze.compile(TINY, **given)
    assert str(e.value) == f"phaze.compile: {said}" or str(e.value).startswith(f"phaze.compile: {said}")
    assert isinstance(e.value, TypeError) and isinstance(e.value, PhazeError) and "\n" not in str(e.value)


def test_a_model_that_is_nothing_is_refused(no_work):
    with pytest.raises(OptionTypeError, match=r"^phaze.compile: model=3: expected a model file, a config.json"):
        phaze.compile(3, hw="tpuv4")


@pytest.mark.parametrize(
    "given, said",
    [
        ({"tp": 0}, "tp=0: expected a positive integer up to 2.15 G (2,147,483,647)"),
        ({"micro_batch": 0}, "micro_batch=0: expected a positive integer up to 2.15 G (2,147,483,647)"),
        ({"context_parallel": 0}, "context_parallel='0': expected auto or a degree N >= 1"),
        ({"zero": 7}, "zero: zero '7': expected one of auto, 0, 1, 2, 3"),
        ({"sequence_parallel": 3}, "sequence_parallel='3': expected one of auto, on, off"),
        ({"memory_headroom": float("nan")}, "memory_headroom: memory headroom nan: expected a fraction of HBM"),
        ({"micro_batch": 2, "micro_batches": (1, 2)}, "micro_batches and micro_batch both given: give one"),
    ],
)
def test_a_value_out_of_range_is_named_as_the_caller_named_it(no_work, given, said):
    with pytest.raises(PhazeError) as e:
        phaze.compile(TINY, hw="tpuv4", **given)
    assert str(e.value).startswith(f"phaze.compile: {said}"), str(e.value)
    assert not isinstance(e.value, TypeError)


def test_a_whole_number_is_the_word_of_a_degree_and_a_bool_is_on_or_off():
    opts = api.options("tpuv4", context_parallel=2, zero=1, expert_parallel=2, sequence_parallel=True, tp=2)
    assert (opts.context_parallel, opts.zero, opts.expert_parallel, opts.sequence_parallel) == (2, "1", 2, "on")
    assert (
        type(opts.context_parallel) is int
        and type(opts.expert_parallel) is int
        and opts.sequence_parallel is Tristate.ON
        and opts.zero is Zero.OPTIMIZER
    )
    assert opts.tp_widths == (2,)


def _fake_answer(said_by_phaze: int, fail: bool = False):
    """hw_answer.answer as a compilation whose every layer warns the same (as the sweep's
    points and workers do), then answers (or fails)."""

    def answer(*args, **kwargs):
        for _ in range(said_by_phaze):
            warnings.warn("tiny.json: no intermediate_size: priced at a default", PhazeWarning, stacklevel=1)
        warnings.warn("another", PhazeWarning, stacklevel=1)
        if fail:
            raise PhazeError("no micro-batch size and TP width could be compiled")
        return types.SimpleNamespace(
            plan={"feasible": True}, text="builtin.module {}\n", layer_kinds=(), seq_len=8, model_shape={}
        )

    return answer


def test_warnings_are_said_once_from_the_callers_line_and_kept_in_the_plan(monkeypatch):
    monkeypatch.setattr(hw_answer, "answer", _fake_answer(4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = phaze.compile(TINY, hw="tpuv4")
    phaze_said = [w for w in caught if issubclass(w.category, PhazeWarning)]
    assert [str(w.message) for w in phaze_said] == ["tiny.json: no intermediate_size: priced at a default", "another"]
    assert {w.filename for w in phaze_said} == {__file__}  # this line, not phaze's
    assert plan.warnings == ("tiny.json: no intermediate_size: priced at a default", "another")


def test_warnings_are_said_when_the_compilation_fails(monkeypatch):
    monkeypatch.setattr(hw_answer, "answer", _fake_answer(2, fail=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(PhazeError, match="no micro-batch size"):
            phaze.compile(TINY, hw="tpuv4")
    assert len([w for w in caught if issubclass(w.category, PhazeWarning)]) == 2


def test_a_config_json_that_leaves_a_size_to_a_default_warns_once(tmp_path):
    """End to end: the loader's warning (said by each point that loads the model) once."""
    config = tmp_path / "tiny.json"
    config.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "vocab_size": 256,
                "hidden_size": 64,
                "num_hidden_layers": 1,
                "num_attention_heads": 4,
                "max_position_embeddings": 32,
            }
        )
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = phaze.compile(str(config), hw="tpuv4", devices=4, global_batch=8, micro_batch=2, tp=1)
    said = [str(w.message) for w in caught if issubclass(w.category, PhazeWarning)]
    assert said == [w for w in plan.warnings] and len(said) == len(set(said))
    assert any("no intermediate_size" in w for w in said) and plan.feasible


@pytest.mark.parametrize("target, kind", [("nope", PhazeError), (3, OptionTypeError), (None, OptionTypeError)])
def test_an_export_target_is_named_as_the_call_wrote_it(target, kind):
    from phaze.options import Options

    plan = api.Plan(text="", data={"feasible": True}, options=Options())
    with pytest.raises(kind) as e:
        plan.export(target)
    assert str(e.value) == f"Plan.export: target={target!r}: expected one of megatron, torchtitan"
