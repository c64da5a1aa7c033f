"""The sweep's winner compiled from the model cut to 5 and 6 blocks (phaze/deepen_compiled.py,
docs/design.md §2): the 5-block step compiled to the latency stage and deepened is, byte for
byte, the whole model's step compiled, through to the plan, for small GPT-2 and Llama models;
and a model whose blocks differ, or a compiled step not laid out as five blocks, is refused
(the caller then compiles the whole trace)."""

from __future__ import annotations

import pytest
from test_cut_trace import _HEAD, _MODELS, _special
from test_deepen import _GPT2

from phaze.deepen_compiled import CannotDeepen, compile_from_cut, deepen_compiled
from phaze.options import Options
from phaze.pipeline import compile_module, load_accelerator
from phaze_ir.frontend import load_model_file, trace_step
from phaze_ir.frontend.deepen import CUT, DEEPEN_FROM, deepen, trace_cut


def _model(tmp_path, name: str, blocks: int = DEEPEN_FROM) -> str:
    cfg, cls, args, inputs = (*_GPT2, _MODELS["llama"][3]) if name == "gpt2" else _MODELS[name]
    args = args.replace("num_hidden_layers=6", f"num_hidden_layers={blocks}").replace("n_layer=6", f"n_layer={blocks}")
    path = tmp_path / f"{name}.py"
    path.write_text(_HEAD.format(cfg=cfg, cls=cls, name=f"tiny-{name}", args=args, inputs=inputs))
    return str(path)


@pytest.mark.parametrize(
    ("name", "kernels", "tp", "sp"),
    [("gpt2", "eager", 2, True), ("llama", "ops", 1, False), ("llama", "eager", 2, True)],
)
def test_the_deepened_compile_is_the_whole_models(tmp_path, name, kernels, tp, sp):
    """12 blocks (7 copies of the template), micro-batch 2: the plan module's bytes equal."""
    spec = load_model_file(_model(tmp_path, name))
    opts = Options(hw="a100", kernels=kernels, devices=8, global_batch=16)
    acc = load_accelerator("a100")
    cut = trace_cut(spec, 2)
    assert cut is not None and cut.blocks == (CUT, DEEPEN_FROM)
    fast = compile_from_cut(cut, tp, opts, acc, sp)
    assert fast is not None
    whole = compile_module(trace_step(spec, 2), "plan", tp, opts, acc, sp)
    assert str(fast) == str(whole)


@pytest.mark.slow
def test_a_context_parallel_step_is_deepened_with_its_ring_priced_again(tmp_path):
    """Under context parallelism (degree 2, the step traced at half of its 16 tokens) the
    module's ``phaze.cp_ring`` holds float sums over the attentions, which the 5- and 6-block
    modules cannot extrapolate: the deepened module is priced again (deepen_compiled's
    ``_priced_again``) and is, byte for byte, the whole model's step compiled (before, the
    sweep's CP winner fell back to compiling the whole trace: 'phaze.cp_ring differs')."""
    from phaze.driver import with_runtime_attention
    from phaze_ir import keys
    from phaze_ir.frontend.trace import whole_sequence

    opts = Options(hw="a100", kernels="eager", devices=8, global_batch=16, context_parallel="2", seq_len=16)
    spec = with_runtime_attention(load_model_file(_model(tmp_path, "llama")), opts)
    acc = load_accelerator("a100")
    with whole_sequence(16):
        cut = trace_cut(spec, 2, 8)
        assert cut is not None and cut.blocks == (CUT, DEEPEN_FROM)
        fast = compile_from_cut(cut, 2, opts, acc, True)
        whole = compile_module(trace_step(spec, 2, 8), "plan", 2, opts, acc, True)
    assert fast is not None
    assert keys.dict_of(fast, keys.CP_RING)  # the ring priced (degree 2)
    assert str(fast) == str(whole)


def test_deepened_at_the_latency_stage_to_any_depth(tmp_path):
    """The 5-block module deepened to 6 and to 14 blocks is the module those steps compile to."""
    spec = load_model_file(_model(tmp_path, "gpt2", 14))
    cut = trace_cut(spec, 1)
    assert cut is not None
    opts = Options(hw="a100", kernels="eager")

    def compiled(blocks: int):
        return compile_module(deepen(cut, blocks), "latency", 2, opts, sequence_parallel=True)

    five, six = compiled(CUT), compiled(CUT + 1)
    for blocks in (CUT + 1, 14):
        assert str(deepen_compiled(five, six, blocks)) == str(compiled(blocks))
    assert str(deepen_compiled(five, six, CUT)) == str(five)


@pytest.mark.parametrize("special", [0, 3, 5])
def test_a_model_whose_blocks_differ_is_not_cut(tmp_path, special):
    """A forward that does something after one block only: no cut step to compile (the
    winner is compiled from the whole trace); with no block apart there is one."""
    spec = load_model_file(_special(tmp_path, f"apart{special}", "8", special, blocks=DEEPEN_FROM))
    assert trace_cut(spec, 2) is None
    alike = load_model_file(_special(tmp_path, "alike", "8", -1, blocks=DEEPEN_FROM))
    assert trace_cut(alike, 2) is not None


def test_a_module_not_of_five_blocks_is_refused(tmp_path):
    spec = load_model_file(_model(tmp_path, "gpt2"))
    cut = trace_cut(spec, 1)
    assert cut is not None
    opts = Options(hw="a100")
    six = compile_module(deepen(cut, CUT + 1), "latency", 1, opts)
    with pytest.raises(CannotDeepen, match="6 block layers, expected 5"):
        deepen_compiled(six, six, 12)
    with pytest.raises(CannotDeepen, match="cannot deepen"):
        deepen_compiled(six, six, 3)


def test_the_drivers_one_point_plan_is_compiled_from_the_cut(tmp_path, monkeypatch):
    """``driver.compile_model`` with one point (the architecture search's winner): the plan
    compiled from the cut step, the same bytes and candidates as compiled from the whole trace."""
    from phaze import driver
    from phaze_ir.ir import print_module

    path = _model(tmp_path, "gpt2")
    opts = Options(hw="a100", devices=8, global_batch=16, micro_batches=(2,), tp_widths=(2,), sequence_parallel="on")
    said: list[str] = []
    fast, fast_points = driver.compile_model(path, opts, said.append)
    assert any("cut to 5 and 6 blocks" in m for m in said)
    monkeypatch.setattr(driver, "_one_point_from_cut", lambda *a: (None, None))
    said.clear()
    slow, slow_points = driver.compile_model(path, opts, said.append)
    assert any("deepened from 5 blocks" in m for m in said)
    assert print_module(fast) == print_module(slow) and fast_points == slow_points


def test_a_model_with_nothing_to_cut_is_traced_once(tmp_path, monkeypatch):
    """A model of no more than ``CUT`` blocks: the trace at ``CUT`` blocks is its whole step
    (``blocks`` None), which the winner's compilation takes, not tracing it again."""
    from phaze import driver
    from phaze_ir.frontend import deepen as deepen_module

    path = _model(tmp_path, "gpt2", blocks=3)
    whole = trace_cut(load_model_file(path), 2)
    assert whole is not None and whole.blocks is None
    traces = []
    real = deepen_module._traced
    monkeypatch.setattr(deepen_module, "_traced", lambda *a: traces.append(a[-1]) or real(*a))
    opts = Options(hw="a100", devices=8, global_batch=16, micro_batches=(2,), tp_widths=(1,))
    driver.compile_model(path, opts, lambda m: None)
    assert traces == [CUT]  # one trace, at the cut's blocks: nothing was cut
