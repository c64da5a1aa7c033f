"""The plan's time per batch by part (``breakdown_s`` in the JSON, ``plan_output.time_breakdown``):
the parts add up to ``time_per_batch_s`` on placements of every shape (one stage, several, data
parallelism, ZeRO, tensor parallelism), and each says what it should (docs/design.md §6.2)."""

from __future__ import annotations

import functools

import pytest
from conftest import MODELS, run_main

from passes.algorithms.schedule.layers import network_alone_s
from passes.place_devices import PlaceDevicesPass
from phaze.plan import plan_output
from phaze_ir import keys
from phaze_ir.attributes import LayerScheduleAttr, StageInfoAttr
from phaze_ir.ir import parse_module

TINY = str(MODELS / "tiny_gpt2.py")
REL = 1e-9


@functools.cache
def _recompute_text(tp: int) -> str:
    """tiny-gpt2 (a prologue, 2 blocks, a head) on tpuv4 at micro-batch 1 and TP ``tp``, up to
    the recompute stage: what the placement pass reads."""
    r = run_main("phazec", TINY, "--hw", "tpuv4", "--micro-batch", "1", "--tp", str(tp), "--emit", "recompute", "-q")
    assert r.returncode == 0, r.stderr
    return r.stdout


def _placed(tp: int, **options):
    module = parse_module(_recompute_text(tp))
    PlaceDevicesPass(devices=64, global_batch=64, **options).apply(None, module)  # type: ignore[arg-type]
    return module


def _sums_to_the_time(module) -> tuple[dict, dict, list[dict]]:
    plan = plan_output.plan_record(module)
    breakdown = plan_output.time_breakdown(module)
    assert breakdown is not None and tuple(breakdown) == plan_output.BREAKDOWN_PARTS
    assert all(v >= 0 for v in breakdown.values()), breakdown
    assert sum(breakdown.values()) == pytest.approx(plan["time_per_batch_s"], rel=REL)
    stages = [s.as_dict() for s in keys.records_of(module, keys.STAGES, StageInfoAttr)]
    for s in stages:
        assert sum(float(s[part]) for part in plan_output.TIME_PARTS) == pytest.approx(s["time_s"], rel=REL)
    return plan, breakdown, stages


def _layer_opt_s(module) -> dict[int, float]:
    return {
        int(r.as_dict()["index"]): float(r.as_dict()["opt_s"])
        for r in keys.records_of(module, keys.LAYER_SCHEDULE, LayerScheduleAttr)
    }


@pytest.mark.parametrize(
    "tp, placement, zero",
    [
        (1, "expert:1,1,1", "0"),  # one stage, one device
        (1, "expert:4,1,1", "0"),  # several stages
        (1, "expert:2,8,1", "0"),  # DP > 1 and stages
        (1, "expert:1,8,1", "1"),  # ZeRO-1
        (1, "expert:2,4,1", "3"),  # ZeRO-3: per-micro-batch collectives
        (2, "expert:2,4,2", "0"),  # TP > 1
        (2, "phaze", "auto"),  # the searched plan
    ],
)
def test_the_parts_add_up_to_the_time_per_batch(tp, placement, zero):
    module = _placed(tp, placement=placement, zero=zero)
    plan, b, stages = _sums_to_the_time(module)
    assert plan["feasible"] == "yes"
    m, p, d = plan["num_micro_batches"], plan["pp"], plan["dp"]
    slowest = max(s["time_s"] for s in stages)
    assert b["bubble_s"] == pytest.approx((p - 1) * slowest, rel=REL)
    assert (b["pp_comm_s"] > 0) == (p > 1)
    assert (b["dp_comm_s"] > 0) == (d > 1)
    assert (b["tp_comm_s"] > 0) == (tp > 1)
    assert b["compute_s"] > 0 and b["ep_comm_s"] == 0
    # The optimizer step: the largest stage's, its layers' scheduled opt_s (1/d under ZeRO).
    opt = _layer_opt_s(module)
    shards = d if plan["zero"] >= 1 else 1
    want = max(sum(opt[i] for i in range(s["first_layer"], s["last_layer"] + 1)) / shards for s in stages)
    assert b["optimizer_s"] == pytest.approx(want, rel=REL) and want > 0
    # With the recompute the plan chose, m times the slowest stage's work: compute, TP, recompute.
    worst = stages[[s["time_s"] for s in stages].index(slowest)]
    assert b["compute_s"] + b["tp_comm_s"] == pytest.approx(m * worst["compute_s"], rel=REL)


def test_zero_1_divides_the_optimizer_step_by_the_replicas():
    plain = _placed(1, placement="expert:1,8,1", zero="0")
    sharded = _placed(1, placement="expert:1,8,1", zero="1")
    _, b0, _ = _sums_to_the_time(plain)
    _, b1, _ = _sums_to_the_time(sharded)
    assert b1["optimizer_s"] == pytest.approx(b0["optimizer_s"] / 8, rel=REL)
    # Everything before the optimizer step is the same (ZeRO-1 moves the bytes of the all-reduce).
    for part in ("compute_s", "recompute_s", "pp_comm_s", "bubble_s"):
        assert b1[part] == pytest.approx(b0[part], rel=REL)


def test_full_recompute_is_its_own_part():
    module = _placed(1, placement="expert:2,4,1", recompute="full")
    _, b, stages = _sums_to_the_time(module)
    assert all(s["recompute"] == "full" for s in stages) and b["recompute_s"] > 0


def test_network_alone_counts_only_unhidden_collectives():
    # A GEMM 0-4, a collective 3-6 (1 s hidden behind the GEMM), another collective 5-7 (its
    # first second already counted), a vector op 6.5-8: alone 4-6.5 = 2.5 s.
    units = ["tensor", "network", "network", "vector", "none"]
    start = [0.0, 3.0, 5.0, 6.5, 8.0]
    end = [4.0, 6.0, 7.0, 8.0, 8.0]
    assert network_alone_s(units, start, end) == pytest.approx(2.5)
    assert network_alone_s(["tensor"], [0.0], [1.0]) == 0.0
    assert network_alone_s(["network", "network"], [0.0, 2.0], [1.0, 3.0]) == pytest.approx(2.0)


def test_the_summary_prints_the_breakdown():
    module = _placed(2, placement="expert:2,4,2", zero="0")
    text = plan_output.summary(module)
    assert "time per batch" in text and "TP comm" in text and "bubble" in text and "optimizer" in text
