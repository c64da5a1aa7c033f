"""The error bands a plan's summary states (phaze/plan/error_bands.py, data/published/error_bands.json):
the table is what benchmarks/price_published.py computes from the CSV's runs and their stored
errors, a run's and a plan's regime, and the summary's line.  Nothing here runs phazec."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from test_time_breakdown import _placed

from phaze.plan import error_bands, plan_output

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT / "data" / "published" / "multi_gpu_runs.csv"


def _load():
    spec = importlib.util.spec_from_file_location("price_published", ROOT / "benchmarks" / "price_published.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["price_published"] = mod
    spec.loader.exec_module(mod)
    return mod


pp = _load()


def test_the_band_table_is_regenerated_from_the_csv_and_its_stored_errors():
    """Every run of the CSV is in the table under its regime, and the regimes' figures are what
    the benchmark computes from the runs' stored states and errors: regenerating the file from
    them (``price_published.py --from-json data/published/error_bands.json --write-bands``)
    gives the same file."""
    rows = pp.read_rows(CSV)
    with open(error_bands.BANDS, encoding="utf-8") as f:
        stored = json.load(f)
    assert set(stored["runs"]) == {r.id for r in rows}
    for r in rows:
        assert stored["runs"][r.id]["regime"] == pp.row_regime(r).key, r.id
    results = pp.results_of_json(str(error_bands.BANDS))
    assert pp.band_table(rows, results) == stored
    priced = [v for v in stored["runs"].values() if v["state"] == "priced"]
    assert all(v["error"] is not None for v in priced)
    assert sum(e["runs"] for e in stored["regimes"].values()) == len(rows)


def test_regenerating_writes_the_same_bytes(tmp_path):
    out = tmp_path / "bands.json"
    assert pp.main(["--from-json", str(error_bands.BANDS), "--write-bands", str(out)]) == 0
    assert out.read_bytes() == error_bands.BANDS.read_bytes()


def test_the_statistics():
    errors = [-0.3, -0.1, 0.05, 0.2, -0.02, 0.01, -0.5, 0.4, 0.03, -0.04]
    s = pp.error_stats(errors)
    # nearest rank: the 9th of the 10 sorted |errors| (0.01 ... 0.4, 0.5)
    assert s["p90_abs_error"] == 0.4
    assert s["median_abs_error"] == pytest.approx((0.05 + 0.1) / 2)
    assert s["mean_error"] == pytest.approx(sum(errors) / 10, abs=1e-4)
    assert pp.p90([0.2]) == 0.2
    assert pp.error_stats([]) == {"median_abs_error": None, "p90_abs_error": None, "mean_error": None}


def test_a_runs_regime():
    rows = {r.id: r for r in pp.read_rows(CSV)}
    g = pp.row_regime(rows["nemo-l3-70b-cp2"])
    assert g.key == "h100/megatron/fp8/short/cp/eager/dense"
    assert g.words() == "H100 Megatron-style FP8 runs with CP, below 16k tokens"
    assert pp.row_regime(rows["fms-70b"]).key == "a100/fsdp/16-bit/short/no-cp/eager/dense"
    assert pp.row_regime(rows["fms-h100-70b-compile"]).key == "h100/fsdp/16-bit/short/no-cp/compiled/dense"
    assert pp.row_regime(rows["k22-175b-sp-sel"]).style == "megatron"  # ZeRO 0
    long = error_bands.regime("h100", 1, False, 131072, 8, "megatron", True)
    assert long.key == "h100/megatron/16-bit/long/cp/eager/moe"
    assert long.words() == "H100 Megatron-style 16-bit MoE runs with CP, at least 16k tokens"


def test_a_band_and_its_line():
    g = error_bands.regime("h100", 3, False, 4096, 1, "inductor", False)
    table = {"regimes": {g.key: {"priced": 4, "refused": 1, "p90_abs_error": 0.2345, "median_abs_error": 0.1,
                                 "mean_error": -0.15}}}  # fmt: skip
    b = error_bands.band(g, table)
    assert b["runs"] == 4 and b["style"] == "fsdp" and b["compile"] is True
    assert error_bands.line(b) == (
        "expected error ±23% (p90 |error| of 4 published H100 FSDP 16-bit compiled runs below 16k tokens; "
        "median 10%, priced faster by 15% on average, 1 more refused)"
    )
    none = error_bands.band(error_bands.regime("h100", 3, True, 4096, 1, "inductor", False), table)
    assert none["runs"] == 0
    assert error_bands.line(none) == (
        "expected error: no published runs of this regime (H100 FSDP FP8 compiled runs below 16k tokens)"
    )
    assert error_bands.band(g, None)["runs"] == 0  # no table: no band


def test_a_plans_regime_and_summary_line():
    """A plan is classified from its own JSON and module: its chip, ZeRO stage, sequence, CP,
    kernels and experts; the summary's last line states its band (tiny-gpt2 on the tpuv4: no
    published runs), in the JSON's summary too."""
    module = _placed(2, placement="expert:2,4,2")
    plan = plan_output.plan_json(module, [])
    g = error_bands.plan_regime(module, plan)
    assert g == error_bands.Regime("tpuv4", "megatron", "16-bit", False, False, False, False)
    s = plan["summary"]
    assert s["error_band"]["regime"] == "tpuv4/megatron/16-bit/short/no-cp/eager/dense"
    assert s["error_band"]["runs"] == 0
    assert s["lines"][-1] == error_bands.line(s["error_band"])
    assert s["lines"][-1].startswith("expected error: no published runs of this regime (TPUV4 Megatron-style")
    zero3 = _placed(2, placement="expert:1,8,2", zero="3")
    assert error_bands.plan_regime(zero3, plan_output.plan_json(zero3, [])).style == "fsdp"


def test_a_published_regime_has_its_band_in_the_committed_table():
    """The regime of NeMo's Llama 3 70B (H100, Megatron-style, FP8, CP, 8k tokens) has a band:
    its priced runs are the CSV rows of that regime the table holds as priced."""
    rows = {r.id: r for r in pp.read_rows(CSV)}
    g = pp.row_regime(rows["nemo-l3-70b-cp2"])
    table = error_bands.table()
    b = error_bands.band(g, table)
    priced = [i for i, v in table["runs"].items() if v["regime"] == g.key and v["state"] == "priced"]
    assert b["runs"] == len(priced) > 0
    assert b["p90_abs_error"] == pp.error_stats([table["runs"][i]["error"] for i in priced])["p90_abs_error"]
    assert error_bands.line(b).startswith(f"expected error ±{b['p90_abs_error']:.0%} (p90 |error| of {len(priced)} ")
