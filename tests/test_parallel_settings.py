"""ZeRO stages and interleaved 1F1B on compiled models (issue 13 items 2-4): the pass options
and phazec's flags end to end, the memory a ZeRO stage saves against the layer records, the
interleaved plan's chunks and time formula, ``auto`` no slower than any fixed setting, and bad
settings said in one line.  The DP itself is checked exhaustively against brute force in
rust/phaze-dp/tests/brute_force_settings.rs."""

from __future__ import annotations

import json
import math

import pytest
from conftest import MODELS, compiled, run_main

rs = pytest.importorskip("passes.algorithms._phaze_rs")

from test_recompute_option import place  # noqa: E402

TINY = str(MODELS / "tiny_gpt2.py")
DEEP = str(MODELS / "tiny_gpt2_deep.py")


def layer_sums(text: str) -> dict[str, int]:
    """Σ over the layers of the ``phaze.layer_memory`` byte fields."""
    from phaze_ir import keys
    from phaze_ir.attributes import LayerMemoryAttr
    from phaze_ir.ir import parse_module

    module = parse_module(text)
    records = [r.as_dict() for r in keys.records_of(module, keys.LAYER_MEMORY, LayerMemoryAttr)]
    return {f: sum(int(r[f]) for r in records) for f in ("param_bytes", "grad_bytes", "optimizer_bytes")}


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_zero_divides_the_sharded_state_by_the_dp_degree(zero):
    """One stage, DP 8 (``expert:1,8,1``): ZeRO-1 holds 1/8 of the optimizer state, ZeRO-2 also
    of the gradients, ZeRO-3 also of the parameters (plus two layers' gathered parameters);
    nothing else of the stage's memory moves."""
    text = compiled(TINY, "recompute")
    sums = layer_sums(text)
    # gradients reduced in their own 16-bit dtype, so that ZeRO-1's reduce-scatter and
    # all-gather move what the all-reduce does (in fp32 the gradients' half moves twice the bytes)
    wire = 'reduce_dtype="fp16"'
    base, [s0] = place(text, f'placement="expert:1,8,1" recompute=none zero="0" {wire}')
    plan, [s] = place(text, f'placement="expert:1,8,1" recompute=none zero="{zero}" {wire}')
    assert (plan["zero"], base["zero"]) == (zero, 0)
    saved = 0
    for field, from_stage in (("optimizer_bytes", 1), ("grad_bytes", 2), ("param_bytes", 3)):
        if zero >= from_stage:
            saved += sums[field] - math.ceil(sums[field] / 8)
    if zero == 3:
        from phaze_ir import keys
        from phaze_ir.attributes import LayerMemoryAttr
        from phaze_ir.ir import parse_module

        layers = keys.records_of(parse_module(text), keys.LAYER_MEMORY, LayerMemoryAttr)
        saved -= 2 * max(int(r.as_dict()["param_bytes"]) for r in layers)
    assert s0["memory_bytes"] - s["memory_bytes"] == saved
    # The stage's record says where: its parts add up to its memory, each sharded part is the
    # layers' sum over d (rounded up), and the activations and workspace do not move.
    parts = ("param_bytes", "grad_bytes", "optimizer_bytes", "activation_bytes", "workspace_bytes")
    assert sum(s[f] for f in parts) == s["memory_bytes"] and sum(s0[f] for f in parts) == s0["memory_bytes"]
    for field, from_stage in (("optimizer_bytes", 1), ("grad_bytes", 2)):
        assert (s0[field], s[field]) == (sums[field], math.ceil(sums[field] / 8) if zero >= from_stage else sums[field])
    assert (s["activation_bytes"], s["workspace_bytes"]) == (s0["activation_bytes"], s0["workspace_bytes"])
    # Each of the 8 replicas updates 1/8 of the optimizer state after the flush.
    assert s["optimizer_s"] == pytest.approx(s0["optimizer_s"] / 8, rel=1e-12) and s0["optimizer_s"] > 0
    # Before it, ZeRO-1 moves the same bytes as the all-reduce (a reduce-scatter and an
    # all-gather); ZeRO-2 and 3 pay per micro-batch, so they are no faster.
    before, before0 = plan["time_per_batch_s"] - s["optimizer_s"], base["time_per_batch_s"] - s0["optimizer_s"]
    if zero == 1:
        assert before == pytest.approx(before0, rel=1e-12)
    else:
        assert before >= before0 * (1 - 1e-12)


def test_zero_auto_is_no_slower_than_any_stage():
    text = compiled(TINY, "recompute")
    auto, _ = place(text, 'zero="auto"')
    for zero in "0123":
        fixed, _ = place(text, f'zero="{zero}"')
        assert auto["time_per_batch_s"] <= fixed["time_per_batch_s"] * (1 + 1e-12)


def test_interleaved_plan_lists_its_chunks():
    """8 blocks at p = 2, v = 2: four chunks of two blocks, the embedding with the first and the
    head with the last, on ranks 0, 1, 0, 1; time per batch (m + (p − 1)/v) · max T + max E +
    max O (the optimizer step after the flush)."""
    text = compiled(DEEP, "recompute")
    plan, stages = place(text, 'placement="expert:2,4,1" pipeline_schedule="interleaved:2"')
    assert (plan["pp"], plan["virtual_stages"], plan["feasible"]) == (2, 2, "yes")
    assert [s["rank"] for s in stages] == [0, 1, 0, 1]
    assert [(s["first_layer"], s["last_layer"]) for s in stages] == [(0, 2), (3, 4), (5, 6), (7, 9)]
    m = plan["num_micro_batches"]
    want = (
        (m + 1 / 2) * max(s["time_s"] for s in stages)
        + max(s["exposed_dp_s"] for s in stages)
        + max(s["optimizer_s"] for s in stages)
    )
    assert plan["time_per_batch_s"] == pytest.approx(want, rel=1e-12)
    # Megatron's schedule: rank 0 runs 2(p−1) + (v−1)p = 4 warm-up forwards, then one more.
    assert [s["in_flight"] for s in stages] == [5, 3, 5, 3]
    plain, _ = place(text, 'placement="expert:2,4,1" pipeline_schedule="1f1b"')
    assert plain["virtual_stages"] == 1
    auto, _ = place(text, 'placement="expert:2,4,1" pipeline_schedule="auto"')
    assert auto["time_per_batch_s"] <= min(plan["time_per_batch_s"], plain["time_per_batch_s"]) * (1 + 1e-12)


def test_interleaving_blocks_that_do_not_split_evenly_takes_nemos_deepseek_layout():
    """8 blocks over p = 2, v = 3 = 6 chunks: neither evenly nor with the embedding and/or loss
    counted as a block; as NeMo lays out DeepSeek-V3 (⌈8/6⌉ = 2 a chunk from the
    first on, every later chunk keeping one): [2, 2, 1, 1, 1, 1] blocks, the embedding with the
    first chunk and the head with the last, on ranks 0, 1, 0, 1, 0, 1. The bubble takes the
    slowest rank: (m + (p − 1)/v) · max T + max E + max O."""
    text = compiled(DEEP, "recompute")
    plan, stages = place(text, 'placement="expert:2,4,1" pipeline_schedule="interleaved:3"')
    assert plan["feasible"] == "yes" and plan["virtual_stages"] == 3
    assert [(s["first_layer"], s["last_layer"]) for s in stages] == [(0, 2), (3, 4), (5, 5), (6, 6), (7, 7), (8, 9)]
    assert [s["rank"] for s in stages] == [0, 1, 0, 1, 0, 1]
    # A rank's chunks share its time: rank 0 holds 2 + 1 + 1 blocks and the embedding, rank 1
    # 2 + 1 + 1 and the head.
    assert all(s["time_s"] == stages[s["rank"]]["time_s"] for s in stages)
    m = plan["num_micro_batches"]
    want = (
        (m + 1 / 3) * max(s["time_s"] for s in stages)
        + max(s["exposed_dp_s"] for s in stages)
        + max(s["optimizer_s"] for s in stages)
    )
    assert plan["time_per_batch_s"] == pytest.approx(want, rel=1e-12)


def test_interleaving_the_blocks_cannot_take_is_refused_with_the_reason():
    text = compiled(DEEP, "recompute")
    plan, stages = place(text, 'placement="expert:2,4,1" pipeline_schedule="interleaved:5"')
    assert plan["feasible"] == "no" and stages == []
    assert plan["binding"] == (
        "stages: interleaved:5 needs p >= 2 stages, p·v chunks of at least one of the 8 blocks each and p "
        "dividing the m micro-batches; got p = 2, p·v = 10, m = 16"
    )


def test_phazec_flags_end_to_end(tmp_path):
    out = tmp_path / "plan"
    args = [DEEP, "--hw", "a100", "--micro-batch", "1", "--tp", "1", "--devices", "8", "--global-batch", "64", "-q"]
    r = run_main(
        "phazec",
        *args,
        "--placement",
        "expert:2,4,1",
        "--pipeline-schedule",
        "interleaved:2",
        "--zero",
        "1",
        "-o",
        f"{out}.mlir",
        "--json",
        f"{out}.json",
    )
    assert r.returncode == 0, r.stderr
    plan = json.loads(out.with_suffix(".json").read_text())
    assert (plan["virtual_stages"], plan["zero"], plan["sequence_parallel"]) == (2, 1, False)
    assert [s["rank"] for s in plan["stages"]] == [0, 1, 0, 1]
    text = out.with_suffix(".mlir").read_text()
    assert "virtual_stages = 2, zero = 1" in text
    # The plan parses back.
    from phaze_ir.ir import parse_module

    parse_module(text)


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--pipeline-schedule", "interleaved:1", "interleaved needs V >= 2 chunks per device (1 is 1f1b)"),
        ("--pipeline-schedule", "zigzag", "expected auto, 1f1b or interleaved:V"),
    ],
)
def test_bad_schedule_is_one_line(flag, value, message):
    r = run_main("phazec", TINY, "--hw", "a100", "--micro-batch", "1", "--tp", "1", flag, value)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert message in r.stderr


def test_search_refuses_bad_settings():
    """The search takes SP, the schedule, ZeRO (tests/test_search.py) and expert parallelism
    (tests/test_search_dims.py); a bad value is the same one-line error as with --hw, before
    anything is traced."""
    r = run_main("phazec", TINY, "--no-cache", "--expert-parallel", "0")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "--expert-parallel" in r.stderr and "expected auto or a degree from 1" in r.stderr
    r = run_main("phazec", TINY, "--no-cache", "--pipeline-schedule", "interleaved:1")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "--pipeline-schedule: pipeline schedule 'interleaved:1': interleaved needs V >= 2" in r.stderr
