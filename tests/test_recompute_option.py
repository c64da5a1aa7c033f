"""A fixed recompute setting (``--recompute auto|none|selective|full``, issue 13 item 4): the
Rust DP against the brute-force oracle with the policy restricted, the pass option on a priced
module, phazec's flag end to end (``auto`` is today's plan byte for byte), an infeasible
setting that names the memory constraint, the search under a fixed setting against plain
enumeration, and bad values said in one line."""

from __future__ import annotations

import json
import random
import re

import pytest
from conftest import EXAMPLES, MODELS, compiled, run_main

rs = pytest.importorskip("passes.algorithms._phaze_rs")

# The random problems and the oracle of the DP's own tests (importing the module loads the
# oracle; no test function is imported, so none runs twice).
from test_placement_dp import RandomDraw, check_against_oracle, close, make_problem, oracle  # noqa: E402

TINY = str(MODELS / "tiny_gpt2.py")
MLP = str(EXAMPLES / "mlp.py")
TINY_SPACE = str(MODELS.parent / "data" / "tiny_space.toml")
SETTINGS = ("auto", "none", "selective", "full")
POLICIES = ("none", "selective", "full")
#: phazec on one chip at one point of the sweep (fast), 64 devices.
ONE_POINT = ["--hw", "tpuv4", "--micro-batch", "1", "--tp", "1", "--devices", "64", "--global-batch", "64", "-q"]


# ---- the DP ----------------------------------------------------------------------------------


def test_dp_with_a_fixed_policy_matches_brute_force():
    """Random problems under each setting: the DP's optimum is the oracle's over the plans that
    use only that policy (the reason and bytes too when nothing fits), every stage uses it, and
    restricting never helps (so a bound computed with every policy still bounds it)."""
    rng = random.Random(13)
    seen: dict[tuple[str, str], int] = {}
    for seed in range(1500):
        problem = make_problem(RandomDraw(70_000 + seed))
        setting = rng.choice(POLICIES)
        fixed = dict(problem, recompute=setting)
        got = rs.solve_placement(fixed)
        try:
            kind = check_against_oracle(fixed, got)
        except AssertionError as e:
            raise AssertionError(f"seed {seed}, recompute {setting}: {e}\n{fixed}") from e
        seen[setting, kind] = seen.get((setting, kind), 0) + 1
        auto = rs.solve_placement(problem)
        assert rs.solve_placement(dict(problem, recompute="auto")) == auto
        if got["feasible"]:
            assert all(s["recompute"] == setting for s in got["plan"]["stages"])
            assert auto["feasible"]
            assert auto["plan"]["time_per_batch_s"] <= got["plan"]["time_per_batch_s"] * (1 + 1e-12)
        elif kind == "memory":
            assert f"recompute {setting}" in got["violations"][0]["message"]
            if not auto["feasible"]:
                assert auto["violations"][0]["needed_bytes"] <= got["violations"][0]["needed_bytes"]
    for setting in POLICIES:  # each setting both fits and does not, often
        assert seen.get((setting, "feasible"), 0) > 150 and seen.get((setting, "memory"), 0) > 50, seen


def test_evaluate_with_a_fixed_policy_matches_brute_force():
    for seed in range(600):
        draw = RandomDraw(90_000 + seed)
        problem = dict(make_problem(draw), recompute=POLICIES[seed % 3])
        L = len(problem["layers"])
        pp, dp = draw.int(1, L + 1), draw.int(1, 8)
        got = rs.evaluate_placement(problem, pp, dp)
        want = oracle.brute_force_fixed(problem, pp, dp)
        kinds = {v["kind"] for v in got["violations"]}
        ctx = f"seed {seed}, pp {pp}, dp {dp}: {got}"
        assert kinds == want.violations, ctx
        if want.time is None:
            assert got["plan"] is None, ctx
            continue
        plan = got["plan"]
        assert close(plan["time_per_batch_s"], want.time), ctx
        assert all(s["recompute"] == problem["recompute"] for s in plan["stages"]), ctx
        if "memory" in kinds:
            (v,) = [v for v in got["violations"] if v["kind"] == "memory"]
            assert v["needed_bytes"] == want.needed_bytes == plan["max_memory_bytes"], ctx
            assert f"recompute {problem['recompute']}" in v["message"], ctx


@pytest.mark.parametrize("bad", ["most", "Full", "", 2, True])
def test_dp_rejects_a_bad_setting(bad):
    from test_placement_dp import small_problem

    with pytest.raises(ValueError, match=r"problem\.recompute") as info:
        rs.solve_placement(small_problem(recompute=bad))
    assert "auto, none, selective, full" in str(info.value)
    assert rs.solve_placement(small_problem(recompute=None)) == rs.solve_placement(small_problem())


# ---- the pass option -------------------------------------------------------------------------


def place(text: str, options: str = "") -> tuple[dict, list[dict]]:
    """``phaze-place-devices{OPTIONS}`` on a priced module (in-process): the plan and its stages."""
    from xdsl.passes import PassPipeline

    from passes import ALL_PASSES
    from phaze_ir import keys
    from phaze_ir.attributes import PlanAttr, StageInfoAttr
    from phaze_ir.ir import make_context, parse_module

    module = parse_module(text)
    spec = f"phaze-place-devices{{devices=64 global_batch=64 {options}}}"
    PassPipeline.parse_spec(ALL_PASSES, spec).apply(make_context(), module)
    plan = module.attributes[keys.PLAN]
    assert isinstance(plan, PlanAttr)
    return plan.as_dict(), [s.as_dict() for s in keys.records_of(module, keys.STAGES, StageInfoAttr)]


@pytest.mark.parametrize("model", [TINY, MLP], ids=["tiny_gpt2", "mlp"])
def test_pass_option_fixes_every_stage(model):
    text = compiled(model, "recompute")
    auto_plan, auto_stages = place(text)
    assert place(text, "recompute=auto") == (auto_plan, auto_stages)
    assert auto_plan["feasible"] == "yes"
    for policy in POLICIES:
        plan, stages = place(text, f"recompute={policy}")
        assert plan["feasible"] == "yes"
        assert {s["recompute"] for s in stages} == {policy}
        assert plan["time_per_batch_s"] >= auto_plan["time_per_batch_s"] * (1 - 1e-12)
    # Auto chose its policies among these: the fixed setting of that policy is the same plan.
    chosen = {s["recompute"] for s in auto_stages}
    if len(chosen) == 1:
        assert place(text, f"recompute={chosen.pop()}") == (auto_plan, auto_stages)


def test_pass_option_with_a_fixed_placement():
    """``--placement expert:PP,DP,TP`` and ``--recompute`` together: exactly that configuration."""
    text = compiled(TINY, "recompute")
    plan, stages = place(text, 'placement="expert:2,4,1" recompute=selective')
    assert (plan["pp"], plan["dp"], plan["tp"], plan["placement"]) == (2, 4, 1, "expert:2,4,1")
    assert [s["recompute"] for s in stages] == ["selective", "selective"]


def test_bad_pass_option_is_one_line():
    text = compiled(TINY, "recompute")
    r = run_main("phaze-opt", "-p", "phaze-place-devices{recompute=most}", input=text)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "phaze-place-devices: recompute 'most': expected one of auto, none, selective, full" in r.stderr


# ---- phazec ----------------------------------------------------------------------------------


def phazec(tmp_path, name: str, *args: str) -> tuple[str, dict]:
    out = tmp_path / name
    r = run_main("phazec", *args, "-o", str(out.with_suffix(".mlir")), "--json", str(out.with_suffix(".json")))
    assert r.returncode == 0, r.stderr
    return out.with_suffix(".mlir").read_text(), json.loads(out.with_suffix(".json").read_text())


def test_phazec_full_against_auto(tmp_path):
    """``auto`` is the plan without the flag, byte for byte; ``full`` puts every stage on full
    recompute, is no faster, and the JSON says the setting."""
    plain_mlir, plain = phazec(tmp_path, "plain", TINY, *ONE_POINT)
    auto_mlir, auto = phazec(tmp_path, "auto", TINY, *ONE_POINT, "--recompute", "auto")
    assert auto_mlir == plain_mlir and auto == plain and auto["recompute"] == "auto"
    full_mlir, full = phazec(tmp_path, "full", TINY, *ONE_POINT, "--recompute", "full")
    assert full["feasible"] and full["recompute"] == "full"
    assert [s["recompute"] for s in full["stages"]] == ["full"] * full["pp"]
    assert re.findall(r"#phaze.stage_info<[^>]*recompute = (\w+)", full_mlir) == ["full"] * full["pp"]
    assert full["time_per_batch_s"] >= auto["time_per_batch_s"]


def test_phazec_none_that_does_not_fit_names_memory(tmp_path):
    """On one device with 2,080,000 bytes of HBM, the tiny GPT-2 fits only by recomputing in
    full (none needs 2,121,424 bytes, selective 2,111,184, full 2,043,264 with its re-run
    forward's activations): ``auto`` finds a plan, ``none`` says the memory constraint binds
    under it and writes the plan as infeasible; ``full`` fits."""
    hw = tmp_path / "small.toml"
    preset = (EXAMPLES / "hw" / "tpuv4.toml").read_text()
    small = re.sub(r"(\[hbm\][^\[]*?bytes\s*=\s*)[^\n]+", r"\g<1>2_080_000", preset, count=1, flags=re.S)
    assert small != preset
    hw.write_text(small)
    args = [TINY, "--hw", str(hw), "--micro-batch", "1", "--tp", "1", "--devices", "1", "--global-batch", "1", "-q"]
    _, auto = phazec(tmp_path, "auto", *args)
    assert auto["feasible"] and {s["recompute"] for s in auto["stages"]} != {"none"}
    out = tmp_path / "none"
    flags = ["--recompute", "none", "-o", f"{out}.mlir", "--json", f"{out}.json", "--write-infeasible"]
    r = run_main("phazec", *args, *flags)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("phazec: error: memory: no placement fits") and "recompute none" in r.stderr
    none = json.loads(out.with_suffix(".json").read_text())
    assert not none["feasible"] and none["binding"].startswith("memory") and none["recompute"] == "none"
    _, full = phazec(tmp_path, "full", *args, "--recompute", "full")
    assert full["feasible"] and [s["recompute"] for s in full["stages"]] == ["full"]


def test_bad_recompute_flag_is_a_usage_error():
    r = run_main("phazec", TINY, "--hw", "tpuv4", "--recompute", "most")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "argument --recompute: invalid choice: 'most'" in r.stderr


def test_driver_refuses_a_bad_setting():
    from phaze.driver import compile_model
    from phaze.options import Options
    from phaze_ir.errors import PhazeError

    with pytest.raises(PhazeError, match="--recompute: recompute 'most': expected one of"):
        compile_model(TINY, Options(recompute="most"), lambda msg: None)


# ---- the architecture search -------------------------------------------------------------------


def test_search_with_full_recompute_equals_plain_enumeration(tmp_path):
    """The bounds stay bounds under a fixed policy: the pruned search finds what enumeration
    finds, its winner (recompiled through the IR, checked against the search's figure) uses
    full recompute in every stage, and the settings cache serves every recompute setting."""
    common = [TINY, "--space", TINY_SPACE, "--devices", "64", "--global-batch", "64", "--micro-batch", "8"]
    common += ["--tp", "1", "--no-baselines", "-q", "--recompute", "full"]
    _, plain = phazec(tmp_path, "plain", *common, "--no-prune", "--no-cache")
    cache = ["--cache", str(tmp_path / "cache")]
    _, got = phazec(tmp_path, "pruned", *common, *cache)
    assert got["accelerator"] == plain["accelerator"]
    assert got["throughput_samples_per_s"] == plain["throughput_samples_per_s"]
    assert (got["dp"], got["pp"], got["tp"], got["micro_batch_size"]) == (
        plain["dp"],
        plain["pp"],
        plain["tp"],
        plain["micro_batch_size"],
    )
    assert got["recompute"] == "full" and {s["recompute"] for s in got["stages"]} == {"full"}
    assert got["search"]["evaluated"] < plain["search"]["evaluated"]

    # Auto on the same cache: nothing is prepared again (settings do not depend on the
    # setting), and it is at least as fast.  Not rewritten = the same files (write_entry
    # replaces a file by a new one; reading an entry touches its time, for the cache's LRU).
    def written() -> dict:
        return {p: (p.stat().st_ino, p.read_bytes()) for p in (tmp_path / "cache" / "settings").iterdir()}

    settings = written()
    assert settings
    r = run_main("phazec", *common[:-2], *cache, "-o", str(tmp_path / "a.mlir"), "--json", str(tmp_path / "a.json"))
    assert r.returncode == 0, r.stderr
    assert written() == settings
    auto = json.loads((tmp_path / "a.json").read_text())
    assert auto["recompute"] == "auto"
    assert auto["throughput_samples_per_s"] >= got["throughput_samples_per_s"]
