"""Every example model imports, verifies and round-trips; the matmul FLOPs of the training
graphs of GPT-2 XL and Llama-2-7B match the textbook count (within 2 %)."""

from __future__ import annotations

import pytest
from conftest import EXAMPLES, compiled
from flops_check import matmul_flops_from_generic, textbook_gpt2, textbook_llama

from phaze_ir.ir import parse_module, print_module

#: An example of each kind of block.  GPT-3 175B is GPT-2 XL's blocks, 96 of them and wider: the
#: README's Megatron-LM command compiles and prices it whole, and test_tp_shard shards it whole.
EXAMPLE_MODELS = ["mlp", "bert_large", "opt_350m", "gpt2_xl", "llama2_7b"]


@pytest.mark.parametrize("name", EXAMPLE_MODELS)
def test_example_round_trips(name):
    text = compiled(str(EXAMPLES / f"{name}.py"))
    module = parse_module(text)
    assert print_module(module) == text
    generic = print_module(module, generic=True)
    assert print_module(parse_module(generic)) == text
    layers = module.attributes["phaze.layers"].data
    blocks = [layer for layer in layers if layer.get("kind") == "block"]
    assert len(blocks) >= 4 and len({layer.get("same_as") for layer in blocks}) == 1


@pytest.mark.parametrize(
    "name, textbook",
    [
        ("gpt2_xl", textbook_gpt2(layers=48, hidden=1600, vocab=50257, seq=1024)),
        ("llama2_7b", textbook_llama(layers=32, hidden=4096, ffn=11008, vocab=32000, seq=4096)),
    ],
)
def test_training_flops_match_textbook(name, textbook):
    generic = print_module(parse_module(compiled(str(EXAMPLES / f"{name}.py"))), generic=True)
    flops = matmul_flops_from_generic(generic)
    assert abs(flops / textbook - 1) < 0.02, (flops, textbook)


@pytest.mark.parametrize("name", EXAMPLE_MODELS)
def test_cost_passes_on_every_example(name):
    """The cost passes price every op of every example on the default chip, and every unique
    layer's SCIP schedule is no worse than the list schedule and no better than the critical
    path and work bounds."""
    from xdsl.passes import PassPipeline

    from passes import ALL_PASSES
    from phaze_ir import dialect as ph
    from phaze_ir.hardware import load_hardware
    from phaze_ir.hardware_ir import set_accelerator
    from phaze_ir.ir import make_context

    module = parse_module(compiled(str(EXAMPLES / f"{name}.py")))
    set_accelerator(module, load_hardware("tpuv4"))
    PassPipeline.parse_spec(ALL_PASSES, "phaze-tile-pe-array,phaze-estimate-latency").apply(make_context(), module)
    ops = [o for o in module.walk() if isinstance(o, ph.ComputeOp)]
    missing = [o.name for o in ops if "phaze.latency" not in o.attributes]
    assert ops and not missing, missing[:5]
    timed = [o.attributes["phaze.latency"].get("split_s") for o in ops if isinstance(o, ph.MatmulOp)]
    assert all(t > 0 for t in timed)

    from passes.algorithms import schedule as sched
    from passes.schedule_ops import scheduled_layers

    *_, layers = scheduled_layers(
        module, "test", {"time_limit": 2.0, "seed": 0, "gap_limit": 0.005}, sched.ScheduleCache()
    )
    for layer in layers:
        for _ids, s in layer.groups.values():
            assert s.makespan <= s.list_makespan * (1 + 1e-12)
            assert s.makespan >= max(s.cp_bound, s.work_bound) * (1 - 1e-9)


def test_example_hardware_files_are_real_files_equal_to_the_presets():
    """examples/hw/ travels when examples/ is copied: real files, not links into phaze_ir; each
    one that is a preset's is that preset, byte for byte (an edit to one is made to both)."""
    from phaze_ir.hardware import preset_names, preset_path

    files = sorted((EXAMPLES / "hw").glob("*.toml"))
    assert files and not any(f.is_symlink() for f in files)
    presets = [f for f in files if f.stem in preset_names()]
    assert {f.stem for f in presets} >= {"a100", "a100_40gb", "h100", "h100_hbm2e", "tpuv4", "tpuv4_torus"}
    for f in presets:
        assert f.read_bytes() == preset_path(f.stem).read_bytes(), f"{f} differs from the {f.stem} preset"
