"""The architecture search under its options end to end: the placement dimensions left to it
(sequence parallelism, ZeRO, the interleaved schedule), every objective, a power cap and split
pipeline transfers; under each, pruning finds what plain enumeration finds.  Apart from
``test_search.py`` so that the two run on different test workers (each is minutes)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from conftest import MODELS, run_main
from test_search import TINY, TINY_SPACE, search

DEEP = str(MODELS / "tiny_gpt2_deep.py")
#: The placement settings practitioners set, all left to the search (issue 13).
NEW_DIMS = ["--sequence-parallel", "auto", "--zero", "auto", "--pipeline-schedule", "auto"]


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    """One cache for this file's searches over the tiny space at 8 devices: an enumeration and
    its pruned search, or the searches of two objectives, price the same stages (only what
    is made of them differs), so each stage is priced once."""
    return tmp_path_factory.mktemp("objectives") / "cache"


def test_search_with_the_new_dimensions_equals_plain_enumeration(tmp_path, shared_cache):
    """Sequence parallelism as a setting (TP 2 with and without), ZeRO and the interleaved
    schedule in the DP: the bounds still hold (a shorter layer never slows a plan), so pruning
    finds what enumeration finds; the winner's plan recompiles to the search's figure."""
    base = ["--space", TINY_SPACE, "--devices", "8", "--global-batch", "8", "--micro-batch", "1", "--tp", "2"]
    base += ["--seq-len", "64"]
    base += [*NEW_DIMS, "--no-baselines"]
    _, plain, _ = search(tmp_path, "plain", "--no-prune", base=base, model=DEEP, cache=shared_cache)
    _, got, _ = search(tmp_path, "pruned", base=base, model=DEEP, cache=shared_cache)
    assert got["accelerator"] == plain["accelerator"]
    assert got["throughput_samples_per_s"] == plain["throughput_samples_per_s"]
    assert got["search"]["settings"] == 2  # TP 2 without and with sequence parallelism
    best = max(p["throughput_samples_per_s"] for p in plain["search"]["points"])
    assert best == got["throughput_samples_per_s"]


def test_search_chooses_the_interleaved_schedule(tmp_path, shared_cache):
    """At a fixed PP 2 × DP 4 with 2 micro-batches per replica (a bubble as long as the work)
    and sequences long enough for the work to outweigh the extra point-to-point messages, the
    search's DP picks the interleaved schedule over plain 1F1B; the baselines' table and
    the plan say so."""
    base = ["--space", TINY_SPACE, "--devices", "8", "--global-batch", "8", "--micro-batch", "1"]
    base += ["--seq-len", "64"]
    base += ["--placement", "expert:2,4,1", "--no-baselines"]
    _, plain, _ = search(tmp_path, "1f1b", base=base, model=DEEP, cache=shared_cache)
    _, got, _ = search(
        tmp_path, "auto", "--pipeline-schedule", "auto", "--zero", "auto", base=base, model=DEEP, cache=shared_cache
    )
    assert plain["virtual_stages"] == 1 and got["virtual_stages"] >= 2
    assert got["throughput_samples_per_s"] > plain["throughput_samples_per_s"]
    co = next(b for b in got["baselines"] if b["name"] == "co-optimized")
    assert (co["virtual_stages"], co["sequence_parallel"]) == (got["virtual_stages"], False)


@pytest.mark.parametrize("objective", ["perf-per-watt", "perf-per-dollar", "energy", "carbon"])
def test_search_for_every_objective_equals_plain_enumeration(objective, tmp_path, shared_cache):
    """Under each objective the bounds (``phaze/search/objective.py``) hold, so pruning finds
    what enumeration finds, ties included; the winner's plan, recompiled through the pipeline,
    gives the search's value (checked for the objectives the plan's JSON prices directly)."""
    base = ["--space", TINY_SPACE, "--devices", "8", "--global-batch", "16", "--micro-batch", "2"]
    base += ["--objective", objective, "--no-baselines"]
    _, plain, _ = search(tmp_path, "plain", "--no-prune", base=base, cache=shared_cache)
    _, got, _ = search(tmp_path, "pruned", base=base, cache=shared_cache)
    assert got["search"]["objective"] == objective
    assert got["accelerator"] == plain["accelerator"]
    assert got["throughput_samples_per_s"] == plain["throughput_samples_per_s"]
    best = max(p["score"] for p in plain["search"]["points"])
    (winner,) = [p for p in got["search"]["points"] if p["best"]]
    assert winner["score"] == best
    assert got["search"]["pruned"]["work_bound"] + got["search"]["pruned"]["dp_bound"] > 0  # the bounds prune
    n, thr, power = got["devices_used"], got["throughput_samples_per_s"], got["power"]
    if objective == "perf-per-watt":
        assert winner["score"] == pytest.approx(thr / (n * power["chip_power_w"]), rel=1e-9)
    if objective == "energy":
        assert winner["score"] == pytest.approx(16 / power["step_energy_j"], rel=1e-9)
    if objective == "perf-per-dollar":
        assert winner["score"] == pytest.approx(thr / got["cost"]["cluster_usd"], rel=1e-9)
    if objective == "carbon":
        assert winner["score"] == pytest.approx(1 / got["carbon"]["kgco2e_per_sample"], rel=1e-9)


def test_objective_needs_its_tables_and_the_search(tmp_path):
    bare = tmp_path / "bare.toml"
    bare.write_text(
        Path(TINY_SPACE).read_text().replace('hardware = "tpuv4"', f'hardware = "{tmp_path / "chip.toml"}"')
    )
    from phaze_ir.hardware import dumps_toml, load_hardware

    chip = load_hardware("tpuv4")
    (tmp_path / "chip.toml").write_text(dumps_toml(dataclasses.replace(chip, energy=None)))
    r = run_main("phazec", TINY, "--space", str(bare), "--objective", "energy", "-o", str(tmp_path / "p.mlir"))
    assert r.returncode != 0
    assert "--objective energy needs a [energy] table in the hardware of the space" in r.stderr
    r = run_main("phazec", TINY, "--hw", "a100", "--objective", "carbon", "-o", str(tmp_path / "p.mlir"))
    assert r.returncode != 0 and "--objective carbon is for the architecture search" in r.stderr


def test_search_under_a_power_cap_equals_plain_enumeration(tmp_path, shared_cache):
    """A power cap turns the chips whose plans draw more into misfits: the search still finds
    what enumeration finds, and the chip it picks draws at most the cap."""
    base = ["--space", TINY_SPACE, "--devices", "8", "--global-batch", "16", "--micro-batch", "2", "--no-baselines"]
    _, free, _ = search(tmp_path, "free", base=base, cache=shared_cache)
    cap = 0.95 * free["power"]["chip_power_w"]
    capped = [*base, "--power-cap", f"{cap:.6g}"]
    _, plain, _ = search(tmp_path, "plain", "--no-prune", base=capped, cache=shared_cache)
    _, got, _ = search(tmp_path, "pruned", base=capped, cache=shared_cache)
    assert got["accelerator"] == plain["accelerator"] != free["accelerator"]
    assert got["throughput_samples_per_s"] == plain["throughput_samples_per_s"] < free["throughput_samples_per_s"]
    assert got["power"]["chip_power_w"] <= cap
    assert got["search"]["evaluator"]["over_power_cap"] > 0
    # Every point carries its chip power; the winner's is its recompiled plan's.
    (winner,) = [p for p in free["search"]["points"] if p["best"]]
    assert winner["power_w"] == pytest.approx(free["power"]["chip_power_w"], rel=1e-9)
    # The throughput-power-area front of the plain enumeration (every architecture): by definition.
    pts, front = plain["search"]["points"], plain["search"]["pareto_front"]
    assert front["axes"] == ["throughput_samples_per_s", "power_w", "area_mm2"]
    rows = [(-p["throughput_samples_per_s"], p["power_w"], p["area_mm2"]) for p in pts]
    want = [
        i
        for i, r in enumerate(rows)
        if pts[i]["throughput_samples_per_s"] > 0
        and not any(all(x <= y for x, y in zip(q, r)) and q != r for j, q in enumerate(rows) if pts[j]["power_w"])
    ]
    assert sorted(front["points"]) == want and len(want) > 1
    r = run_main("phazec", TINY, *base, "--power-cap", "1", "--no-cache", "-o", str(tmp_path / "none.mlir"))
    assert r.returncode != 0 and "draws more than --power-cap 1 W per chip" in r.stderr, r.stderr


def test_search_prices_split_pipeline_transfers(tmp_path, shared_cache):
    """``--pipeline-transfer split`` (DeepSpeed's pipeline engine) is how the search prices a
    pipelined plan too: the winner recompiles through phaze-place-devices to the search's
    figure (the check that fails loudly otherwise), and the plan says it priced split transfers,
    slower than whole ones at this fixed PP 2 x DP 2 x TP 2."""
    base = ["--space", TINY_SPACE, "--devices", "8", "--global-batch", "8", "--micro-batch", "1"]
    base += ["--seq-len", "64", "--placement", "expert:2,2,2", "--no-baselines"]
    _, whole, _ = search(tmp_path, "whole", base=base, model=DEEP, cache=shared_cache)
    _, split, _ = search(tmp_path, "split", "--pipeline-transfer", "split", base=base, model=DEEP, cache=shared_cache)
    assert (whole["pipeline_transfer"], split["pipeline_transfer"]) == ("whole", "split")
    assert (split["pp"], split["dp"], split["tp"]) == (2, 2, 2)
    assert split["throughput_samples_per_s"] < whole["throughput_samples_per_s"]
