"""phaze-place-devices and phazec's plan stage end to end: the plan fits, recomputes from its
stages by the 1F1B formula, round-trips, and says which constraint binds when nothing fits."""

from __future__ import annotations

import json

import pytest
from conftest import EXAMPLES, MODELS, module_text, run_main

TINY = str(MODELS / "tiny_gpt2.py")


def check_plan(plan: dict) -> None:
    """The invariants every feasible plan must satisfy."""
    assert plan["feasible"] and plan["dp"] * plan["pp"] * plan["tp"] <= plan["devices"]
    assert plan["devices_used"] == plan["dp"] * plan["pp"] * plan["tp"]
    hbm = plan["accelerator"]["hbm_bytes"]
    stages = plan["stages"]
    assert len(stages) == plan["pp"]
    assert all(s["memory_bytes"] <= hbm for s in stages)
    assert stages[0]["layers"][0] == 0
    assert all(a["layers"][1] + 1 == b["layers"][0] for a, b in zip(stages, stages[1:]))
    m, p = plan["num_micro_batches"], plan["pp"]
    assert m * plan["micro_batch_size"] * plan["dp"] == plan["global_batch"]
    expected = (
        (m + p - 1) * max(s["time_s"] for s in stages)
        + max(s["exposed_dp_s"] for s in stages)
        + max(s["optimizer_s"] for s in stages)
    )
    assert plan["time_per_batch_s"] == pytest.approx(expected, rel=1e-9)
    # the breakdown of the time per batch adds up to it, and each stage's time parts to its time
    assert sum(plan["breakdown_s"].values()) == pytest.approx(plan["time_per_batch_s"], rel=1e-9)
    assert all(v >= 0 for v in plan["breakdown_s"].values())
    for s in stages:
        assert sum(s["time_parts"].values()) == pytest.approx(s["time_s"], rel=1e-9)
    assert plan["throughput_samples_per_s"] == pytest.approx(plan["global_batch"] / plan["time_per_batch_s"], rel=1e-9)


@pytest.fixture(scope="module")
def tiny_plan(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan")
    r = run_main(
        "phazec",
        TINY,
        "--hw",
        "tpuv4",
        "--micro-batch",
        "1",
        "--tp",
        "1",
        "--devices",
        "64",
        "--global-batch",
        "64",
        "-o",
        str(d / "plan.mlir"),
        "--json",
        str(d / "plan.json"),
    )
    assert r.returncode == 0, r.stderr
    return d, r.stderr


def test_tiny_plan_is_consistent(tiny_plan):
    d, stderr = tiny_plan
    plan = json.loads((d / "plan.json").read_text())
    check_plan(plan)
    for key in (
        "model",
        "devices",
        "global_batch",
        "dp",
        "pp",
        "tp",
        "micro_batch_size",
        "num_micro_batches",
        "time_per_batch_s",
        "throughput_samples_per_s",
        "accelerator",
        "stages",
    ):
        assert key in plan
    assert plan["model"] == "tiny-gpt2" and plan["accelerator"]["area_mm2"] == pytest.approx(278.83, abs=0.01)
    assert "samples/s" in stderr and "GiB/device" in stderr  # the summary table


def test_plan_round_trips_and_annotates_every_layer(tiny_plan):
    d, _ = tiny_plan
    text = (d / "plan.mlir").read_text()
    assert "phaze.plan = #phaze.plan<" in text and "phaze.stages = [#phaze.stage_info<index = 0" in text
    r = run_main("phaze-opt", str(d / "plan.mlir"))
    assert r.returncode == 0 and r.stdout == module_text(text)
    body = [line for line in text.splitlines() if "phaze.layer = " in line]
    assert body and all("phaze.stage = " in line for line in body)


def test_expert_placement_is_evaluated(tmp_path):
    out = tmp_path / "p.json"
    r = run_main(
        "phazec",
        TINY,
        "--hw",
        "tpuv4",
        "--micro-batch",
        "1",
        "--devices",
        "8",
        "--global-batch",
        "16",
        "--placement",
        "expert:2,4,1",
        "-o",
        str(tmp_path / "p.mlir"),
        "--json",
        str(out),
        "-q",
    )
    assert r.returncode == 0, r.stderr
    plan = json.loads(out.read_text())
    assert (plan["pp"], plan["dp"], plan["tp"]) == (2, 4, 1) and plan["placement"] == "expert:2,4,1"
    check_plan(plan)


def test_nothing_fits_names_the_binding_constraint(tmp_path):
    hw = tmp_path / "small.toml"
    preset = (EXAMPLES / "hw" / "tpuv4.toml").read_text()
    import re

    small = re.sub(r"(\[hbm\][^\[]*?bytes\s*=\s*)[^\n]+", r"\g<1>65536", preset, count=1, flags=re.S)
    assert small != preset
    hw.write_text(small)
    r = run_main(
        "phazec",
        TINY,
        "--micro-batch",
        "1",
        "--tp",
        "1",
        "--devices",
        "4",
        "--global-batch",
        "4",
        "--hw",
        str(hw),
        "-o",
        str(tmp_path / "p.mlir"),
        "--json",
        str(tmp_path / "p.json"),
        "--write-infeasible",
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "phazec: error: memory: no placement fits" in r.stderr
    plan = json.loads((tmp_path / "p.json").read_text())
    assert not plan["feasible"] and plan["binding"].startswith("memory")


def test_place_devices_requires_the_cost_passes(tmp_path):
    training = run_main("phazec", TINY, "--emit", "training", "-q")
    r = run_main("phaze-opt", "-p", "phaze-place-devices", input=training.stdout)
    assert r.returncode == 1 and "'builtin.module' op requires 'phaze.layer_schedule'" in r.stderr
    latency = run_main("phazec", TINY, "--emit", "latency", "-q")
    r = run_main("phaze-opt", "-p", "phaze-place-devices", input=latency.stdout)
    assert (
        r.returncode == 1
        and "'builtin.module' op requires 'phaze.layer_schedule'; run phaze-schedule-ops first" in r.stderr
    )


def test_bad_placement_option():
    r = run_main("phazec", TINY, "--hw", "tpuv4", "--placement", "expert:1,2")
    assert r.returncode == 1 and "expected 'phaze', 'expert' or 'expert:PP,DP,TP'" in r.stderr


def test_rank_order_auto_keeps_the_faster_numbering(tmp_path):
    """On the a100 (nodes of 8 GPUs) with PP 2, DP 8, TP 1 the two numberings put the DP
    all-reduce and the pipeline transfers on different levels, so they price differently;
    ``--rank-order auto`` (the default) writes the faster one and its name."""
    got = {}
    for order in ("auto", "tp-dp-pp", "tp-pp-dp"):
        out = tmp_path / f"{order}.json"
        r = run_main(
            "phazec", TINY, "--hw", "a100", "--micro-batch", "1", "--devices", "16", "--global-batch", "32",
            "--placement", "expert:2,8,1", "--rank-order", order, "-o", str(tmp_path / f"{order}.mlir"),
            "--json", str(out), "-q",
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        got[order] = json.loads(out.read_text())
        check_plan(got[order])
    fixed = {o: got[o]["time_per_batch_s"] for o in ("tp-dp-pp", "tp-pp-dp")}
    assert fixed["tp-dp-pp"] != fixed["tp-pp-dp"]
    assert got["tp-pp-dp"]["rank_order"] == "tp-pp-dp" and got["tp-dp-pp"]["rank_order"] == "tp-dp-pp"
    faster = min(fixed, key=fixed.__getitem__)
    assert got["auto"]["rank_order"] == faster and got["auto"]["time_per_batch_s"] == fixed[faster]
    assert f'rank_order = "{faster}"' in (tmp_path / "auto.mlir").read_text()
