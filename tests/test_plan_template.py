"""A point compiled once is placed again from its template (``phaze/plan/plan_template.py``):
another question on it (devices, batch, placement, the placement's options) gives, byte for
byte, the plan and JSON that compiling it again gives, with no model imported; a template
that would not give its own text back is not kept; the generic form is compiled as before."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import MODELS, ROOT

from phaze import hw_answer
from phaze.options import Options
from phaze.plan import plan_template

DEEP = str(MODELS / "tiny_gpt2_deep.py")
PLACED = "from its compiled plan (in the cache)"
FIXED = Options(hw="a100", devices=8, global_batch=8, placement="expert:2,2,2", micro_batches=(1,))


def _ask(opts: Options, cache: Path | None, generic: bool = False) -> tuple[hw_answer.Answer, list[str]]:
    logged: list[str] = []
    answer = hw_answer.answer(DEEP, opts, str(cache) if cache else None, logged.append, generic=generic)
    return answer, logged


def _templates(cache: Path) -> list[Path]:
    return sorted((cache / plan_template.KIND).glob("*.json"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """A cache holding the template of micro-batch 1, TP 2 (asked as PP 2 x DP 2 x TP 2)."""
    cache = tmp_path_factory.mktemp("templates") / "cache"
    first, logged = _ask(FIXED, cache)
    assert not any(PLACED in line for line in logged)
    assert first.plan is not None and first.plan["feasible"] and len(_templates(cache)) == 1
    return cache


@pytest.mark.parametrize(
    "change",
    [
        {"devices": 16, "global_batch": 32, "placement": "expert:2,4,2"},  # more replicas, more micro-batches
        {"devices": 8, "global_batch": 8, "placement": "expert:4,1,2", "pipeline_schedule": "interleaved:2"},
        {"devices": 8, "global_batch": 16, "zero": "1", "rank_order": "tp-pp-dp", "pipeline_transfer": "split"},
        {"devices": 8, "global_batch": 8, "placement": "phaze", "tp_widths": (2,), "recompute": "full"},
        # cannot divide 8 samples over 3 replicas: the plan says what binds, and its ops carry no stage
        {"devices": 12, "global_batch": 8, "placement": "expert:2,3,2"},
    ],
)
def test_another_placement_is_the_compiled_plan_byte_for_byte(cache, change):
    opts = replace(FIXED, **change)
    placed, logged = _ask(opts, cache)
    assert any(PLACED in line for line in logged), logged
    assert not any("traced" in line for line in logged)
    compiled, _ = _ask(opts, None)
    assert placed.text == compiled.text
    assert placed.plan == compiled.plan
    assert placed.summary == compiled.summary
    assert (placed.layer_kinds, placed.seq_len) == (compiled.layer_kinds, compiled.seq_len)
    if "expert:2,3,2" in change.values():
        assert placed.plan is not None and not placed.plan["feasible"] and "phaze.stage =" not in placed.text
    else:
        assert placed.plan is not None and placed.plan["feasible"] and "phaze.stage = 0 : i64" in placed.text
    assert len(_templates(cache)) == 1  # a placed skeleton keeps no template of its own


def test_a_placement_from_the_template_imports_no_model_nor_torch(cache, tmp_path):
    args = [DEEP, "--hw", "a100", "--micro-batch", "1", "--devices", "32", "--global-batch", "64"]
    args += ["--placement", "expert:2,8,2", "--cache", str(cache), "-o", str(tmp_path / "plan.mlir")]
    # the runtime the cached template was compiled at (Options' defaults, the paper's), not a GPU's
    args += ["--kernels", "ops", "--dtype", "float16", "--zero", "0", "--sequence-parallel", "off"]
    args += ["--pipeline-schedule", "1f1b", "--no-dp-overlap", "--selective-recompute", "attention"]
    code = (
        "import sys; from phaze.tools.phazec import main; rc = main(sys.argv[1:]); "
        "print(rc, 'torch' in sys.modules, any(m.startswith('transformers') for m in sys.modules))"
    )
    answers = sorted((cache / hw_answer.KIND).glob("*.json"))
    run = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT)
    assert run.stdout.split() == ["0", "False", "False"], run.stderr
    assert PLACED in run.stderr
    # An answer one template away is not kept again (each would be the size of its plan).
    assert sorted((cache / hw_answer.KIND).glob("*.json")) == answers


def test_the_best_point_of_a_sweep_is_placed_from_its_template(tmp_path):
    """The sweep prices its points from the settings; a best point compiled before is placed from
    its template, and must still give the settings' throughput (micro-batch 1's TP widths: the
    points the best is chosen from)."""
    cache = tmp_path / "cache"
    sweep = Options(hw="a100", devices=8, global_batch=8, micro_batches=(1,), tp_widths=(1, 2))
    _, logged = _ask(sweep, cache)
    assert not any(PLACED in line for line in logged) and len(_templates(cache)) == 1
    again = replace(sweep, devices=16, global_batch=16)
    placed, logged = _ask(again, cache)
    compiled, _ = _ask(again, None)
    assert any("placing the best point" in line for line in logged), logged
    assert (placed.text, placed.plan) == (compiled.text, compiled.plan)


def test_the_generic_form_is_compiled(cache):
    opts = replace(FIXED, devices=16, global_batch=16, placement="expert:2,4,2")
    generic, logged = _ask(opts, cache, generic=True)
    assert not any(PLACED in line for line in logged)
    assert generic.text == _ask(opts, None, generic=True)[0].text


def test_a_template_that_does_not_give_its_text_back_is_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(plan_template, "text_of", lambda template, placed: "not the plan")
    cache = tmp_path / "cache"
    _ask(FIXED, cache)
    assert _templates(cache) == []


def test_a_causal_attention_placed_from_its_template_has_the_compiled_summary(tmp_path):
    """The summary's MFU takes off the half of the square a causal attention skips
    (``phaze.causal_attention_flops``, a module attribute): a template's skeleton, which has no
    step body, gives the same summary as the compiled plan (it once counted the whole square:
    4.02 % against 2.11 %)."""
    model = str(MODELS / "tiny_llama_sdpa.py")
    cache = tmp_path / "cache"
    fixed = replace(FIXED, kernels="eager")  # flash attention (the "ops" runtime traces it eager)
    hw_answer.answer(model, fixed, str(cache), lambda line: None)
    assert len(_templates(cache)) == 1
    opts = replace(fixed, devices=16, global_batch=32, placement="expert:2,4,2")
    logged: list[str] = []
    placed = hw_answer.answer(model, opts, str(cache), logged.append)
    assert any(PLACED in line for line in logged), logged
    compiled = hw_answer.answer(model, opts, None, lambda line: None)
    assert placed.plan is not None and compiled.plan is not None
    assert placed.summary and placed.summary == compiled.summary
    assert placed.plan["summary"] == compiled.plan["summary"]
    s = placed.plan["summary"]
    assert s["mfu_causal"] < s["mfu_palm"]  # the causal half is taken off
