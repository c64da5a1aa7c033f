"""Interleaved 1F1B's boundary transfers as Megatron-LM runs them (docs/design.md §6.6).

Megatron-LM's training sets ``deallocate_pipeline_outputs`` (``megatron/training/argument_utils.py``
at d98e8a64), so ``forward_backward_pipelining_with_interleaving`` waits on every chunk's forward
send right after posting it: one transfer per chunk and micro-batch on the compute stream. The
receives and the backward sends it overlaps with the next compute (``overlap_p2p_comm``), which
they slow by the pipeline level's ``collective_compute_share``. Before, every transfer was taken
as overlapped, so on NVLink (no share) a rank's v chunks' transfers cost nothing and a 7B model on
64 H100s planned PP 2 × 16 one-block chunks over plain DP.
"""

from __future__ import annotations

import json
import math
import os

import pytest

rs = pytest.importorskip("passes.algorithms._phaze_rs")

#: One transfer: the level's latency plus the boundary over its bandwidth.
LAT, BW, BOUNDARY = 1e-6, 1e10, 10**9
X = LAT + BOUNDARY / BW


def problem(share: float, v: int) -> dict:
    """Four equal blocks (forward 1 s, backward 2 s, no state), two devices on one level, a
    batch of 4 micro-batches: fixed at PP 2, DP 1 it runs 2·v chunks, chunk c on rank c mod 2."""
    layer = {
        "fwd_s": 1.0,
        "bwd_s": 2.0,
        "recompute_s": [0.0, 0.5, 1.0],
        "saved_bytes": [100, 50, 10],
        "param_bytes": 0,
        "grad_bytes": 0,
        "optimizer_bytes": 0,
        "workspace_bytes": 4,
        "boundary_bytes": BOUNDARY,
    }
    level = {"group_size": 2, "bandwidth_Bps": BW, "latency_s": LAT, "collective_compute_share": share}
    return {
        "layers": [dict(layer) for _ in range(4)],
        "devices": 2,
        "hbm_bytes": 10**6,
        "levels": [level],
        "global_batch": 4,
        "micro_batch": 1,
        "tp": 1,
        "dp_overlap": True,
        "zero": "0",
        "recompute": "none",
        "virtual_stages": v,
    }


def ranks(plan: dict) -> dict[int, dict]:
    return {s["rank"]: s for s in plan["stages"]}


@pytest.mark.parametrize("share", [0.0, 0.25])
def test_the_forward_sends_are_waited_on_and_the_rest_overlapped(share):
    plan = rs.evaluate_placement(problem(share, 2), 2, 1)["plan"]
    assert plan["virtual_stages"] == 2 and len(plan["stages"]) == 4
    r = ranks(plan)
    # Rank 0 runs chunks 0 and 2: both send forward (2 transfers waited on); the other four
    # transfers (chunk 0's gradient back in, chunk 2's activation in and gradient out, and
    # chunk 2's gradient back in) run beside its 6 s of compute, slowed by the share.
    assert math.isclose(r[0]["time_parts"]["pp_comm_s"], 2 * X + share * 4 * X, rel_tol=1e-12)
    # Rank 1 runs chunks 1 and 3: chunk 3 is the model's last, so only chunk 1 sends forward.
    assert math.isclose(r[1]["time_parts"]["pp_comm_s"], X + share * 5 * X, rel_tol=1e-12)
    # (m + (p − 1)/v) · max T: the bubble of Narayanan et al. over the slower rank.
    t = 6.0 + 2 * X + share * 4 * X
    assert math.isclose(plan["max_stage_time_s"], t, rel_tol=1e-12)
    assert math.isclose(plan["time_per_batch_s"], (4 + 1 / 2) * t, rel_tol=1e-12)


def test_on_a_level_with_no_share_the_transfers_still_cost_the_sends():
    # The old price: every transfer hidden behind compute, free where the level takes no SMs.
    r = ranks(rs.evaluate_placement(problem(0.0, 2), 2, 1)["plan"])
    assert r[0]["time_parts"]["pp_comm_s"] > 0 and r[1]["time_parts"]["pp_comm_s"] > 0


def test_more_chunks_wait_on_more_sends():
    # v chunks per rank send v times per micro-batch (the last rank once fewer): the exposed
    # transfers grow with v while the bubble shrinks, so interleaving deeper is not free.
    def p2p(v: int) -> list[float]:
        r = ranks(rs.evaluate_placement(problem(0.0, v), 2, 1)["plan"])
        return [r[0]["time_parts"]["pp_comm_s"], r[1]["time_parts"]["pp_comm_s"]]

    p = problem(0.0, 4)
    p["layers"] = p["layers"] * 2  # 8 blocks: 4 chunks per rank of one block each
    r = ranks(rs.evaluate_placement(p, 2, 1)["plan"])
    assert math.isclose(r[0]["time_parts"]["pp_comm_s"], 4 * X, rel_tol=1e-12)
    assert math.isclose(r[1]["time_parts"]["pp_comm_s"], 3 * X, rel_tol=1e-12)
    assert p2p(2) == pytest.approx([2 * X, X], rel=1e-12)


def test_plain_1f1b_keeps_every_transfer_on_the_critical_path():
    # The control: without virtual stages Megatron-LM turns overlap_p2p_comm off, and a stage
    # pays each boundary's two transfers (its activation, its gradient) in full.
    r = ranks(rs.evaluate_placement(problem(0.25, 1), 2, 1)["plan"])
    assert math.isclose(r[0]["time_parts"]["pp_comm_s"], 2 * X, rel_tol=1e-12)
    assert math.isclose(r[1]["time_parts"]["pp_comm_s"], 2 * X, rel_tol=1e-12)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("examples/hf/mistral-7b/config.json"), reason="run from the repository root")
def test_mistral_7b_on_64_h100s_plans_without_pp():
    # Issue 57's check at one setting (micro-batch 1, TP 1, where PP 2 × 16 chunks had won):
    # with the forward sends priced, plain DP 64 is faster.
    import phaze

    plan = phaze.compile(
        "examples/hf/mistral-7b/config.json",
        hw="h100",
        devices=64,
        global_batch=512,
        seq_len=4096,
        micro_batch=1,
        tp=1,
        cache=None,
    )
    data = json.loads(plan.to_json())
    assert data["pp"] == 1, data["summary"]["placement"]
    assert plan.mfu >= 0.30
