"""The plan summary (``phaze/plan/summary.py``): its figures recomputed here from the plan's own
numbers and the model's shape, the same lines on stderr, in the plan file's comment block and
in the JSON; and ``--memory-headroom`` (the DP's HBM, the refusal's words, the flag's checks)."""

from __future__ import annotations

import json

import pytest
from conftest import MODELS, run_main
from test_time_breakdown import _placed

from passes.algorithms import placement as pl
from passes.algorithms.placement_options import PlacementOptions
from phaze.plan import plan_output
from phaze.plan import summary as plan_summary
from phaze_ir import keys
from phaze_ir.hardware_ir import module_accelerator
from phaze_ir.ir import parse_module

TINY = str(MODELS / "tiny_gpt2.py")


def test_model_flops_are_the_closed_form_of_gpt2():
    """3x the forward GEMMs of tiny-gpt2 (h 64, 2 layers, vocabulary 128, s 16, b 1): per token
    24·h² weights and 9·h biases per layer (Conv1D's addmm), 4·s·h of attention (QKᵀ and PV),
    2·h·V of the LM head; and the parameters, each tensor once (the LM head tied)."""
    module = _placed(2, placement="expert:1,1,2")
    h, layers, vocab, s, positions = 64, 2, 128, 16, 64
    per_token = layers * (24 * h * h + 9 * h + 4 * s * h) + 2 * h * vocab
    assert keys.int_of(module, keys.MODEL_FLOPS, 0) == 3 * s * per_token
    per_layer = 12 * h * h + 13 * h  # c_attn, c_proj, c_fc, mlp c_proj and two layer norms
    assert keys.int_of(module, keys.PARAMETERS, 0) == layers * per_layer + vocab * h + positions * h + 2 * h


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_the_summary_figures_follow_from_the_plan(recompute):
    module = _placed(2, placement="expert:2,4,2", recompute=recompute)
    plan = plan_output.plan_json(module, [])
    s = plan["summary"]
    peak = module_accelerator(module, "test").peak_tensor_flops
    denominator = plan["time_per_batch_s"] * plan["devices_used"] * peak
    model_flops = keys.int_of(module, keys.MODEL_FLOPS, 0) / 1 * plan["global_batch"]  # traced at micro-batch 1
    assert s["mfu_palm"] == pytest.approx(model_flops / denominator)
    # no causal fused attention (tiny-gpt2 on a TPU): both conventions count the same FLOPs
    assert s["mfu_causal"] == s["mfu_palm"] and s["model_flops_causal_per_batch"] == s["model_flops_palm_per_batch"]
    # The hardware runs the model's GEMMs and the vector work besides, and re-runs the forward
    # under full recompute.
    assert s["hfu"] > s["mfu_causal"] > 0
    if recompute == "full":
        plain = plan_output.plan_json(_placed(2, placement="expert:2,4,2", recompute="none"), [])["summary"]
        assert s["hardware_flops_per_batch"] > plain["hardware_flops_per_batch"]
        assert s["model_flops_causal_per_batch"] == plain["model_flops_causal_per_batch"]
    assert s["tokens_per_s"] == pytest.approx(plan["throughput_samples_per_s"] * 16)
    assert sum(s["breakdown_s"].values()) == pytest.approx(plan["time_per_batch_s"], rel=1e-9)
    assert sum(s["memory_bytes"].values()) == s["max_memory_bytes"] == plan["max_memory_bytes"]
    assert s["hbm_bytes"] == plan["accelerator"]["hbm_bytes"]
    text = "\n".join(s["lines"])
    assert plan_output.summary(module) == text
    for said in ("model tiny-gpt2", "chip tpuv4", "DP 4 x PP 2 x TP 2", "MFU", "HFU", "tokens/s", "memory per device"):
        assert said in text


def test_the_runner_up_says_by_how_much_it_lost():
    cands = [
        {"micro_batch_size": 1, "tp": 1, "sequence_parallel": False, "throughput_samples_per_s": 100.0},
        {"micro_batch_size": 2, "tp": 2, "sequence_parallel": True, "throughput_samples_per_s": 80.0},
        {"micro_batch_size": 4, "tp": 1, "sequence_parallel": False, "throughput_samples_per_s": 0.0},
    ]
    r = plan_summary.runner_up(cands, 100.0)
    assert r["name"] == "micro-batch 2, TP 2, sequence parallel" and r["slower_by"] == pytest.approx(0.2)
    assert plan_summary.runner_up(cands[:1], 100.0) is None


def test_si_and_counts_in_words():
    assert plan_summary.si(85899345920, "B") == "85.9 GB"
    assert plan_summary.si(989.4e12, "FLOP/s") == "989 TFLOP/s"
    assert plan_summary.si(512, "B") == "512 B"
    # memory in binary units wherever a person reads it: the H100's 85.9 GB is 80 GiB
    assert plan_summary.binary_bytes(85899345920) == "80 GiB"
    assert plan_summary.binary_bytes(52428800) == "50 MiB" and plan_summary.binary_bytes(512) == "512 B"
    assert plan_summary.count_words(1_557_611_200) == "1.56 billion"
    assert plan_summary.count_words(133_440) == "133,440"


def test_headroom_shrinks_the_hbm_the_dp_fills():
    from passes.algorithms.priced_step import PricedStep

    step = PricedStep([pl.LayerNumbers(0.0, 0.0, (0.0, 0.0, 0.0), (0, 0, 0), 0, 0, 0, 0, 0)], micro_batch=1, tp=1)
    options = PlacementOptions(devices=1, global_batch=1)
    assert pl.problem(step, options, hbm_bytes=1000, levels=[], memory_bound_Bps=1e12)["hbm_bytes"] == 1000
    headroom = PlacementOptions(devices=1, global_batch=1, memory_headroom=0.25)
    assert pl.problem(step, headroom, hbm_bytes=1000, levels=[], memory_bound_Bps=1e12)["hbm_bytes"] == 750
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(pl.PlacementError, match="memory headroom"):
            pl.usable_hbm(1000, bad)


def test_a_memory_refusal_under_headroom_says_which_hbm():
    said = "memory: the largest stage needs at least 90 GB per device (DP 1), but HBM is 77.3 GB (77309411328 bytes)"
    message = pl.binding_message({"violations": [{"message": said}]}, 0.1)
    assert "the HBM a plan may fill (0.9 of it) is 77.3 GB" in message and "--memory-headroom 0.1" in message
    assert pl.binding_message({"violations": [{"message": said}]}) == said


def test_phazec_writes_the_summary_everywhere_and_leaves_the_headroom(tmp_path):
    """One compilation: the same lines on stderr, as the plan file's comment block (which MLIR
    parsers skip: the file still parses) and in the JSON; the headroom said in it."""
    out, js = tmp_path / "plan.mlir", tmp_path / "plan.json"
    r = run_main(
        "phazec", TINY, "--hw", "tpuv4", "--devices", "4", "--global-batch", "8", "--micro-batch", "2", "--tp", "1",
        "--memory-headroom", "0.25", "-o", str(out), "--json", str(js),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    s = json.loads(js.read_text())["summary"]
    assert s["memory_headroom"] == 0.25 and "(24 GiB usable: 25% headroom)" in "\n".join(s["lines"])
    text = out.read_text()
    comment = [line[3:] for line in text.splitlines() if line.startswith("//")]
    assert comment == ["phaze plan", *s["lines"]]
    assert all(line in r.stderr for line in s["lines"])
    parse_module(text)  # the comment block does not stop it parsing
    for bad in ("1", "nan"):
        r = run_main("phazec", TINY, "--hw", "tpuv4", "--memory-headroom", bad)
        assert r.returncode != 0 and r.stderr.count("\n") == 1 and "--memory-headroom" in r.stderr, r.stderr


def test_quiet_says_nothing_on_success(tmp_path):
    """-q: errors and warnings only; a run that succeeds without a warning prints nothing."""
    out = tmp_path / "plan.mlir"
    r = run_main("phazec", TINY, "--hw", "tpuv4", "--devices", "4", "--global-batch", "8", "-o", str(out), "-q")
    assert r.returncode == 0 and r.stderr == "" and r.stdout == "", r.stderr
    assert out.read_text().startswith("// phaze plan")


def test_a_search_names_its_best_other_baseline_and_what_it_ran_on():
    won = {"name": "small:x"}
    plan = {"throughput_samples_per_s": 100.0, "accelerator": won, "dp": 4, "pp": 1, "tp": 1, "micro_batch_size": 8}

    def base(name, thr, chip, dp):
        acc = {"name": chip} if chip else None
        return {"name": name, "throughput_samples_per_s": thr, "accelerator": acc, "dp": dp, "pp": 1, "tp": 1,
                "micro_batch_size": 8, "area_mm2": 278.8, "hbm_bytes": 34359738368}  # fmt: skip

    baselines = [
        base("co-optimized", 100.0, "small:x", 4),
        base("tpuv4+phaze", 75.0, "tpuv4", 8),
        base("x", 0.0, "", 0),
    ]
    r = plan_summary.search_runner_up(baselines, plan)
    assert r["name"] == "baseline tpuv4+phaze" and r["slower_by"] == pytest.approx(0.25)
    assert "on tpuv4, 278.8 mm², 32 GiB HBM; DP 8 x PP 1 x TP 1" in r["why"]
    lines = ["model m", "memory per device 1 B of 2 B HBM = params 1 B", "runner-up old: gone", "power: 1 W"]
    s = plan_summary.with_runner_up({"lines": lines, "runner_up": {"name": "old"}}, r)
    assert s["lines"] == [*lines[:2], f"runner-up baseline tpuv4+phaze: {r['why']}", "power: 1 W"]
    assert plan_summary.search_runner_up(baselines[:1], plan) is None
