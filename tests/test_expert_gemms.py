"""Expert GEMMs priced at the shape one member of an EP group runs them
(``passes/algorithms/expert_gemms.py``; docs/design.md §6.8)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from passes.algorithms import _phaze_rs
from passes.algorithms import placement as pl
from passes.algorithms.expert_gemms import ExpertGemm, ExpertTimes, ep_degrees, expert_gemm_times, member_gemm
from passes.algorithms.latency import MatmulDesc, estimate_chip
from passes.algorithms.placement_options import PlacementOptions
from passes.algorithms.priced_step import PricedStep
from passes.algorithms.tiling import tile_gemm_scalar
from phaze_ir.hardware import load_hardware


def _gemm(batch: int, m: int, n: int, k: int, *, weight_rhs: bool = True, launches: int = 1) -> MatmulDesc:
    """A bf16 expert GEMM of ``batch`` experts: ``[batch, m, k] x [batch, k, n]``."""
    return MatmulDesc(
        batch=batch,
        m=m,
        n=n,
        k=k,
        a_elem=2,
        b_elem=2,
        c_elem=2,
        a_bytes=batch * m * k * 2,
        b_bytes=batch * k * n * 2,
        rhs_batched=True,
        launches=launches,
    )


def _layer_gemms(experts: int, rows: int, hidden: int, ffn: int) -> list[ExpertGemm]:
    """A SwiGLU MoE layer's expert GEMMs as the trace holds them: the forward's gate-up
    ``[E, r, H] x [E, H, 2F]`` and down ``[E, r, F] x [E, F, H]``, and the backward's input
    gradients (rows on M) and weight gradients ``[E, H, r] x [E, r, 2F]`` (rows on K)."""
    up, down = _gemm(experts, rows, 2 * ffn, hidden), _gemm(experts, rows, hidden, ffn)
    return [
        ExpertGemm(up, backward=False),
        ExpertGemm(down, backward=False),
        ExpertGemm(_gemm(experts, ffn, hidden, rows), backward=True),  # down's weight gradient
        ExpertGemm(_gemm(experts, rows, ffn, hidden), backward=True),  # down's input gradient
        ExpertGemm(_gemm(experts, hidden, 2 * ffn, rows), backward=True),  # gate-up's weight gradient
        ExpertGemm(_gemm(experts, rows, hidden, 2 * ffn), backward=True),  # gate-up's input gradient
    ]


def _price(acc):
    tc = acc.tensor_cores

    def price(descs: list[MatmulDesc]) -> list[float]:
        tilings = [tile_gemm_scalar(d.batch, d.m, d.n, d.k, tc.pe_x, tc.pe_y, tc.count, tc.buffer_bytes) for d in descs]
        out = estimate_chip(descs, acc, tilings)
        return [float(out.split[i, 0]) for i in range(len(descs))]

    return price


def test_the_member_runs_e_times_the_rows_on_a_1_e_share_of_the_experts():
    fwd = _gemm(256, 128, 4096, 7168, launches=256)
    at8 = member_gemm(fwd, 8, rows=128)
    assert (at8.batch, at8.m, at8.n, at8.k, at8.launches) == (32, 1024, 4096, 7168, 32)
    assert at8.flops == fwd.flops and at8.a_bytes == fwd.a_bytes and at8.c_bytes == fwd.c_bytes
    assert at8.b_bytes == fwd.b_bytes // 8  # the member's own experts' weights
    wgrad = _gemm(256, 7168, 4096, 128)  # [E, H, r] x [E, r, N]: the rows are K
    at8 = member_gemm(wgrad, 8, rows=128)
    assert (at8.batch, at8.m, at8.n, at8.k) == (32, 7168, 4096, 1024)
    assert at8.flops == wgrad.flops and at8.b_bytes == wgrad.b_bytes and at8.c_bytes == wgrad.c_bytes // 8
    # e = 1, an e that does not divide the experts, a GEMM without the rows: as traced
    assert member_gemm(fwd, 1, 128) is fwd and member_gemm(fwd, 3, 128) is fwd and member_gemm(fwd, 2, 77) is fwd
    assert ep_degrees(12) == [1, 2, 3, 4, 6, 12]


def test_fine_grained_experts_memory_bound_at_e_1_get_faster_with_e():
    """DeepSeek-V3's MoE layer (256 experts, top-8, hidden 7168, expert FFN 2048) at 4096
    tokens: 128 rows an expert; all 256 experts' weights read for them, the traced GEMMs are
    HBM-bound on an H100; a member of EP 64 holds 4 experts on 8192 rows each."""
    acc = load_hardware("h100")
    gemms = _layer_gemms(256, 128, 7168, 2048)
    traced = estimate_chip([g.desc for g in gemms], acc)
    assert all(traced.op(i).bound == "hbm" for i in range(2))
    times = expert_gemm_times(gemms, 256, 128, _price(acc))
    assert [t.e for t in times] == ep_degrees(256)
    one = times[0]
    price = _price(acc)
    assert one.fwd_s == sum(price([g.desc for g in gemms if not g.backward]))  # e = 1: the traced shape's
    assert one.recompute_s == (0.0, 0.0, one.fwd_s)
    fwd = [t.fwd_s for t in times]
    bwd = [t.bwd_s for t in times]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(fwd, fwd[1:]))
    by_e = {t.e: t for t in times}
    assert by_e[64].fwd_s < 0.6 * one.fwd_s and by_e[64].bwd_s < 0.6 * one.bwd_s
    assert min(bwd) < one.bwd_s


def test_coarse_experts_change_little():
    """Grok-1's MoE layer (8 experts, top-2, hidden 6144, expert FFN 32768) at 8192 tokens:
    2048 rows an expert, compute-bound as traced; EP 8 changes its expert GEMMs by little."""
    acc = load_hardware("h100")
    times = expert_gemm_times(_layer_gemms(8, 2048, 6144, 32768), 8, 2048, _price(acc))
    one = times[0]
    for t in times[1:]:
        assert t.fwd_s == pytest.approx(one.fwd_s, rel=0.05) and t.bwd_s == pytest.approx(one.bwd_s, rel=0.05)


def _step(expert_gemm_s: tuple[ExpertTimes, ...]) -> PricedStep:
    layer = pl.LayerNumbers(
        fwd_s=0.010,
        bwd_s=0.020,
        recompute_s=(0.0, 0.0, 0.010),
        saved_bytes=(1 << 20, 1 << 19, 1 << 10),
        param_bytes=1 << 24,
        grad_bytes=1 << 24,
        optimizer_bytes=3 << 25,
        workspace_bytes=1 << 20,
        boundary_bytes=1 << 20,
        experts=8,
        expert_param_bytes=1 << 23,
        expert_grad_bytes=1 << 23,
        expert_optimizer_bytes=3 << 24,
        dispatch_bytes=1 << 20,
        expert_gemm_s=expert_gemm_s,
    )
    return PricedStep(layers=[layer] * 4, micro_batch=1, tp=1)


def _evaluate(step: PricedStep, ep: str) -> dict:
    """``step`` on 8 H100s as 8 replicas of one stage, EP ``ep``."""
    acc = load_hardware("h100")
    options = PlacementOptions(devices=8, global_batch=16, expert_parallel=ep)
    problem = pl.problem(step, options, hbm_bytes=acc.hbm.bytes, levels=acc.network, memory_bound_Bps=3e12)
    result = _phaze_rs.evaluate_placement(problem, 1, 8)
    assert result["feasible"] and result["plan"] is not None, result["violations"]
    return dict(result["plan"])


def test_the_plan_at_e_prices_the_members_expert_gemms_and_ep_1_is_as_before():
    times = (
        ExpertTimes(1, 0.006, 0.012, (0.0, 0.0, 0.006)),
        ExpertTimes(2, 0.004, 0.008, (0.0, 0.0, 0.004)),
        ExpertTimes(4, 0.003, 0.006, (0.0, 0.0, 0.003)),
        ExpertTimes(8, 0.003, 0.006, (0.0, 0.0, 0.003)),
    )
    plain, priced = _step(()), _step(times)
    # EP 1: the same plan, to the float, as without the expert GEMMs' times
    assert _evaluate(priced, "1") == _evaluate(plain, "1")
    # EP 4: each layer's forward and backward fall by (0.006 - 0.003) + (0.012 - 0.006)
    before, after = _evaluate(plain, "4"), _evaluate(priced, "4")
    assert before["expert_parallel"] == after["expert_parallel"] == 4
    (b,), (a,) = before["stages"], after["stages"]
    assert b["time_parts"]["compute_s"] - a["time_parts"]["compute_s"] == pytest.approx(4 * 0.009, rel=1e-9)
    assert after["time_per_batch_s"] < before["time_per_batch_s"]


def test_the_numbers_round_trip_and_bad_ones_are_refused():
    step = _step((ExpertTimes(1, 0.006, 0.012, (0.0, 0.0, 0.006)), ExpertTimes(2, 0.004, 0.008, (0.0, 0.0, 0.004))))
    layer = step.layers[0]
    assert pl.LayerNumbers.from_json(layer.as_dict()) == layer
    assert "expert_gemm_s" not in replace(layer, expert_gemm_s=()).as_dict()
    bad = {**layer.as_dict(), "expert_gemm_s": [{"e": 0, "fwd_s": 0.0, "bwd_s": 0.0, "recompute_s": [0.0, 0.0, 0.0]}]}
    with pytest.raises(ValueError, match="expert_gemm_s"):
        pl.LayerNumbers.from_json(bad)
    three = replace(layer, expert_gemm_s=(ExpertTimes(3, 0.0, 0.0, (0.0, 0.0, 0.0)),))
    with pytest.raises(Exception, match="expert_gemm_s"):
        _evaluate(replace(step, layers=[three]), "1")


def test_the_searchs_bounds_stay_below_the_priced_step(tmp_path):
    """The tiny Mixtral's setting carries its expert GEMMs at EP 2 and 4 (the change from the
    traced shape, exact on each chip): on chips of the small space its vectorized work bound and
    the DP on its lower-bound times stay at or below the time the DP prices from its makespans,
    EP chosen by the DP, where the expert GEMMs' change is not 0."""
    import numpy as np
    from conftest import EXAMPLES
    from test_moe_conv import MIXTRAL

    from passes.algorithms.schedule import ScheduleCache
    from phaze.options import Options
    from phaze.search.arch_space import load_space
    from phaze.search.engine import Candidates, Evaluator, Params, SolverLimits
    from phaze.search.setting import prepare_settings

    model = tmp_path / "tiny_mixtral.py"
    model.write_text(MIXTRAL.format(seq=32))
    (setting,) = prepare_settings(str(model), 2, (1,), Options(micro_batches=(2,), tp_widths=(1,)))
    assert setting.expert_sums and all(lr.experts for lr in setting.layers if lr.numbers.experts)
    cands = Candidates.of_space(load_space(str(EXAMPLES / "spaces" / "small.toml")))
    configs = list(range(0, len(cands.configs), max(1, len(cands.configs) // 3)))[:3]
    ev = Evaluator(Params(devices=4, global_batch=8, expert_parallel="auto"), SolverLimits(), ScheduleCache(None))
    lb = ev.lower_bounds(cands, setting)[:, configs]
    exact = ev.makespans(cands, [(setting, c) for c in configs])
    least = ev.bounds.least_time(cands, setting, None)[configs]
    hbm = max(cands.hbm)
    changes = []
    for col in range(len(configs)):
        assert (lb[len(setting.groups) :, col] == exact[col][len(setting.groups) :]).all()  # exact, not bounded
        changes.append(exact[col][len(setting.groups) :])
        priced = ev.place([ev.problem(cands, setting, exact[col], hbm)], None)[0]
        bounded = ev.place([ev.problem(cands, setting, lb[:, col], hbm)], None)[0]
        assert priced["feasible"] and bounded["feasible"]
        time = priced["plan"]["time_per_batch_s"]
        assert bounded["plan"]["time_per_batch_s"] <= time * (1 + 1e-12)
        assert least[col] <= time * (1 + 1e-12)
    assert np.any(np.concatenate(changes) != 0)
