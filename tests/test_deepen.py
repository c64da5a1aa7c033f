"""The whole model's step deepened from a trace cut to 5 of its repeated blocks
(phaze_ir/frontend/deepen.py, docs/design.md §2): the same IR bytes as the whole model traced,
for every example and for small models of each family at two micro-batch sizes; and the whole
model traced wherever the cut step is not what its blocks repeat."""

from __future__ import annotations

import pytest
from conftest import EXAMPLES, MODELS
from test_cut_trace import _HEAD, _MODELS, _special

from phaze_ir.frontend import import_graph, load_model_file, trace_model, trace_step, trace_step_checked_later
from phaze_ir.frontend.deepen import CUT, DEEPEN_FROM, deepen

#: A small GPT-2 (the examples' GPT-2 XL and GPT-3 175B class) for ``_HEAD``.
_GPT2 = ("GPT2Config", "GPT2LMHeadModel", "vocab_size=256, n_embd=64, n_layer=6, n_head=4, n_positions=64")


def _ir(traced) -> str:
    return str(import_graph(traced))


def _same_as_whole(model: str, micro_batch: int, seq_len: int | None = None) -> None:
    spec = load_model_file(model)
    fast = trace_step(spec, micro_batch, seq_len)
    assert fast.deepened_from == CUT and fast.blocks is None
    whole = trace_model(spec, micro_batch, seq_len)
    assert whole.deepened_from is None and whole.blocks is None
    assert _ir(fast) == _ir(whole)


@pytest.mark.parametrize("name", ["gpt2", *_MODELS])
def test_a_deepened_step_is_the_whole_models(tmp_path, name):
    """Small models of each family, 12 blocks (7 copies of the template), micro-batch 1 (a
    size-1 dim: another graph) and 2."""
    cfg, cls, args, inputs = (*_GPT2, _MODELS["llama"][3]) if name == "gpt2" else _MODELS[name]
    path = tmp_path / f"{name}.py"
    args = args.replace("num_hidden_layers=6", f"num_hidden_layers={DEEPEN_FROM}")
    args = args.replace("n_layer=6", f"n_layer={DEEPEN_FROM}")
    path.write_text(_HEAD.format(cfg=cfg, cls=cls, name=f"tiny-{name}", args=args, inputs=inputs))
    for micro_batch in (1, 2):
        _same_as_whole(str(path), micro_batch)


def test_a_model_of_few_blocks_is_traced_whole(tmp_path, monkeypatch):
    """Below ``DEEPEN_FROM`` blocks the two cut traces would cost what the whole one does: one
    cut trace (which finds the blocks), then the whole model."""
    import phaze_ir.frontend.trace as tr

    calls = []
    real = tr.trace_model
    monkeypatch.setattr(tr, "trace_model", lambda *a, **kw: calls.append(kw.get("max_blocks")) or real(*a, **kw))
    got = trace_step(load_model_file(str(MODELS / "tiny_gpt2_deep.py")), 1)
    assert calls == [CUT, None] and got.deepened_from is None


@pytest.mark.parametrize("example", ["gpt2_xl", "bert_large"])
def test_real_examples_deepen_to_their_whole_trace(example):
    """The same IR bytes as a whole trace for real examples of many blocks: GPT-2 XL's 48 (25
    heads, Conv1D linears) and BERT-large's 24 (an encoder).  Every family's deepening is checked
    above on 12 blocks (:func:`test_a_deepened_step_is_the_whole_models`: GPT-2, Llama, OPT,
    BERT, Mixtral); the other examples are those blocks, more of them and wider, and their whole
    traces (10-20 s each) would test nothing these do not."""
    _same_as_whole(str(EXAMPLES / f"{example}.py"), 1)


@pytest.mark.parametrize("special", [-1, 0, 2, 3, 5])
def test_a_block_treated_apart_is_traced_whole(tmp_path, special):
    """A forward that does something after one block only: after block 0, 2 or 3 the cut's
    middle blocks differ (after block 0, its backward sits between the backward of blocks 1
    and 0: block 1's), after block 5 the 6-block check differs, so the model is traced whole
    (and its IR is right); with no block apart (-1) it is deepened."""
    spec = load_model_file(_special(tmp_path, f"apart{special}", "8", special, blocks=DEEPEN_FROM))
    got = trace_step(spec, 2)
    assert got.deepened_from == (CUT if special == -1 else None)
    assert _ir(got) == _ir(trace_model(spec, 2))


def test_deepen_refuses_a_step_not_cut_to_five_blocks():
    spec = load_model_file(str(MODELS / "tiny_gpt2_deep.py"))
    with pytest.raises(ValueError, match="cut to 5 blocks"):
        deepen(trace_model(spec, 1, max_blocks=3), 8)
    with pytest.raises(ValueError, match="cut to 5 blocks"):
        deepen(trace_model(spec, 1), 8)


#: In a new process (whose autograd has not run, unless argv[2] asks: a child forked after it
#: has cannot run it), the step of the model file argv[1] traced with its check beside it:
#: prints whether the check held, the blocks this process traced itself, and the step's IR.
_BESIDE = """
import sys
import torch
if sys.argv[2:] == ["after-autograd"]:  # a gradient this process traced, not through phaze
    from torch.fx.experimental.proxy_tensor import make_fx
    x = torch.ones(2, requires_grad=True)
    make_fx(lambda x: torch.autograd.grad((x * x).sum(), [x]), tracing_mode="fake")(x)
import phaze_ir.frontend.trace as tr
from phaze_ir.frontend import import_graph, load_model_file, trace_step_checked_later
calls = []
real = tr.trace_model
tr.trace_model = lambda *a, **kw: calls.append(kw.get("max_blocks")) or real(*a, **kw)
step, holds = trace_step_checked_later(load_model_file(sys.argv[1]), 2)
print(holds(), calls, step.deepened_from)
print(import_graph(step))
"""


def _beside(model: str, *flags: str) -> tuple[str, str]:
    import subprocess
    import sys

    from conftest import ROOT

    out = subprocess.run(
        [sys.executable, "-c", _BESIDE, model, *flags], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    said, _, ir = out.partition("\n")
    return said, ir


@pytest.mark.parametrize("special", [-1, 5])
def test_the_check_runs_beside_in_a_child(tmp_path, special):
    """In a process new to autograd the check trace runs in a forked child: this process traces
    only the cut, and the child's answer decides; a model it refutes (something after block
    5 only) says so, and its step is the deepened one, for the caller to trace again."""
    path = _special(tmp_path, f"apart{special}", "8", special, blocks=DEEPEN_FROM)
    said, ir = _beside(path)
    assert said == f"{special == -1} [{CUT}] {CUT}"
    whole = _ir(trace_model(load_model_file(path), 2))
    assert (ir.strip() == whole.strip()) == (special == -1)


def test_a_child_that_cannot_trace_leaves_the_check_here(tmp_path):
    """A child forked after this process ran autograd outside phaze's traces cannot trace (torch
    refuses); the check is then traced here, with the same answers."""
    for special in (-1, 5):
        path = _special(tmp_path, f"apart{special}", "8", special, blocks=DEEPEN_FROM)
        said, _ = _beside(path, "after-autograd")
        assert said == f"{special == -1} [{CUT}, {CUT + 1}] {CUT}"


def test_no_child_after_a_trace_here(tmp_path, monkeypatch):
    """After a training step was traced in this process no child is forked (it could not run
    autograd); the check is traced here, with the same answers."""
    import threading

    import phaze_ir.frontend.trace as tr
    from phaze_ir.frontend.deepen import _CheckTrace

    trace_model(load_model_file(str(MODELS / "tiny_gpt2.py")), 1)  # autograd has run here
    assert tr.autograd_ran()
    monkeypatch.setattr(threading, "active_count", lambda: 1)  # as if alone (a test runner has threads)
    check = _CheckTrace(lambda: trace_model(load_model_file(str(MODELS / "tiny_gpt2.py")), 1))
    check.start_beside()
    assert check._child is None
    calls: list = []
    real = tr.trace_model
    monkeypatch.setattr(tr, "trace_model", lambda *a, **kw: calls.append(kw.get("max_blocks")) or real(*a, **kw))
    for special, holds_then in ((-1, True), (5, False)):
        spec = load_model_file(_special(tmp_path, f"apart{special}", "8", special, blocks=DEEPEN_FROM))
        calls.clear()
        step, holds = trace_step_checked_later(spec, 2)
        assert holds() is holds_then and calls == [CUT, CUT + 1] and step.deepened_from == CUT


def test_compile_model_starts_again_when_the_check_refutes(tmp_path):
    """The driver compiles a deepened step while its check runs, and keeps the result only
    when the check agrees: a refuted step is compiled again from the whole trace, and says so."""
    from phaze.driver import compile_model
    from phaze.options import Options
    from phaze.pipeline import compile_module
    from phaze_ir.ir import print_module

    path = _special(tmp_path, "apart5", "8", 5, blocks=DEEPEN_FROM)
    said: list[str] = []
    module, _ = compile_model(path, Options(emit="training", micro_batches=(2,)), said.append)
    assert any("compiling again from a whole trace" in m for m in said)
    whole = compile_module(trace_model(load_model_file(path), 2), "training", 1, Options(emit="training"))
    assert print_module(module) == print_module(whole)
