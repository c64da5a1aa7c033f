"""Latency model: rooflines on the presets, monotonicity in every bandwidth, the space estimate's
cache, the α–β network formulas (by hand and against the Rust DP), and the
``phaze-estimate-latency`` pass on real IR, pricing as the architecture search does."""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest
from xdsl.dialects.builtin import ModuleOp

from passes.algorithms import network
from passes.algorithms.latency import (
    BOUNDS,
    CollectiveDesc,
    FixedParams,
    LatencyCache,
    MatmulDesc,
    OpTable,
    VectorDesc,
    ViewDesc,
    config_of,
    estimate_chip,
    estimate_matmul,
    estimate_op,
    estimate_space,
    glb_matmul_bytes,
    hbm_matmul_bytes,
    layer_totals,
)
from passes.algorithms.tiling import tile_gemm_scalar
from passes.cost_view import describe_op, op_table
from phaze.search.arch_space import paper_space
from phaze_ir import dialect as ph
from phaze_ir.errors import PhazeError
from phaze_ir.hardware import load_hardware
from phaze_ir.hardware_ir import set_accelerator
from phaze_ir.ir import make_context, parse_module, print_module

TPU = load_hardware("tpuv4")


def _run(module, spec):
    from xdsl.passes import PassPipeline

    from passes import ALL_PASSES

    PassPipeline.parse_spec(ALL_PASSES, spec).apply(make_context(), module)


def gemm(batch, m, n, k, elem=2, rhs_batched=False, bias=False) -> MatmulDesc:
    return MatmulDesc(
        batch=batch,
        m=m,
        n=n,
        k=k,
        a_elem=elem,
        b_elem=elem,
        c_elem=elem,
        a_bytes=batch * m * k * elem,
        b_bytes=(batch if rhs_batched else 1) * k * n * elem,
        bias_bytes=n * elem if bias else 0,
        rhs_batched=rhs_batched,
    )


def single_op_module(op_text: str, args: str) -> ModuleOp:
    return parse_module(f"builtin.module {{\n  func.func @f({args}) {{\n    {op_text}\n    func.return\n  }}\n}}\n")


# ---- rooflines --------------------------------------------------------------------------------


def test_large_gemm_runs_near_peak_on_tpuv4():
    d = gemm(1, 8192, 8192, 8192)
    lat = estimate_op(d, TPU)
    assert lat.unit == "tensor" and lat.bound == "compute"
    achieved = d.flops / lat.split_s
    assert achieved >= 0.95 * TPU.peak_tensor_flops
    # One core of eight: about an eighth of that.
    assert lat.one_s == pytest.approx(8 * lat.split_s, rel=1e-9)


def test_llama_sized_gemm_is_compute_bound():
    lat = estimate_op(gemm(1, 4096, 4096, 4096), TPU)
    assert lat.bound == "compute"
    assert 2 * 4096**3 / lat.split_s >= 0.95 * TPU.peak_tensor_flops


def test_memory_bound_elementwise_runs_at_its_bandwidth_bound():
    module = single_op_module(
        '%y = phaze.elementwise "add" %a, %b aten "aten.add.Tensor" : '
        "(tensor<67108864xf16>, tensor<67108864xf16>) -> tensor<67108864xf16>",
        "%a: tensor<67108864xf16>, %b: tensor<67108864xf16>",
    )
    (op,) = [o for o in module.walk() if isinstance(o, ph.ElementwiseOp)]
    d = describe_op(op)
    assert d == VectorDesc(work=2**26, read_bytes=2**28, write_bytes=2**27)
    lat = estimate_op(d, TPU)
    assert lat.bound == "hbm" and lat.split_s == (2**28 + 2**27) / TPU.hbm.bandwidth_Bps
    # One vector core alone (128 lanes at 1.05 GHz) cannot keep up with HBM: compute-bound.
    assert lat.bound_one == "compute" and lat.one_s == 2**26 / 128 / TPU.clock_hz


def test_small_gemm_with_big_operands_is_hbm_bound():
    # 4096 x 4096 x 128 with a batch of 32 (attention's P·V backward shapes): little reuse.
    lat = estimate_op(gemm(32, 4096, 128, 4096, rhs_batched=True), TPU)
    assert lat.bound == "hbm"


def test_softmax_rereads_per_pass_when_a_row_does_not_fit():
    module = single_op_module(
        '%y = phaze.softmax "softmax" %x dim -1 : (tensor<32x4096x4096xf32>) -> tensor<32x4096x4096xf32>',
        "%x: tensor<32x4096x4096xf32>",
    )
    (op,) = [o for o in module.walk() if isinstance(o, ph.SoftmaxOp)]
    d = describe_op(op)
    n = 32 * 4096 * 4096
    assert (d.passes, d.row_bytes, d.work) == (3, 4096 * 4, 5 * n)
    slow_glb = dataclasses.replace(TPU, global_buffer=dataclasses.replace(TPU.global_buffer, bandwidth_Bps=1e9))
    lat = estimate_op(d, slow_glb)
    assert lat.bound == "glb" and lat.split_s == (3 * 4 * n + 4 * n) / 1e9
    big_buffer = dataclasses.replace(slow_glb, vector_cores=dataclasses.replace(TPU.vector_cores, buffer_bytes=1 << 16))
    assert estimate_op(d, big_buffer).split_s == (4 * n + 4 * n) / 1e9


def test_norm_is_two_passes_over_its_rows():
    module = single_op_module(
        '%y, %m, %r = phaze.norm "layer_norm" %x, %w, %b normalized_rank 1 : '
        "(tensor<8x1024xf16>, tensor<1024xf16>, tensor<1024xf16>) -> "
        "(tensor<8x1024xf16>, tensor<8x1xf32>, tensor<8x1xf32>)",
        "%x: tensor<8x1024xf16>, %w: tensor<1024xf16>, %b: tensor<1024xf16>",
    )
    (op,) = [o for o in module.walk() if isinstance(o, ph.NormOp)]
    d = describe_op(op)
    assert (d.passes, d.row_bytes, d.work) == (2, 2048, 8 * 8 * 1024)


def test_hbm_traffic_blocks_when_the_gemm_does_not_fit_the_global_buffer():
    d = gemm(1, 64, 64, 32)  # A 4 KiB, B 4 KiB, C 8 KiB
    assert hbm_matmul_bytes(d, 1 << 20) == 4096 + 4096 + 8192
    # A 4 KiB buffer: 2 KiB blocks of one operand, the other streamed twice.
    assert hbm_matmul_bytes(d, 4096) == 4096 + 2 * 4096 + 8192


def test_a_long_k_gemm_keeps_its_result_on_chip_and_streams_its_operands():
    """A weight gradient's K is every token of the micro-batch: K-long panels of either operand
    would be thin (a 25 MiB panel of 131,072 x 2 bytes rows is 100 columns wide) and the other
    operand re-read ~80 times, a traffic growing as K squared.  A GEMM library keeps each output
    tile's partial sums on chip over the whole K (CUTLASS's mainloop), so the result's block
    stays and A and B stream past once per block: linear in K."""
    glb = 50 * 2**20
    d = gemm(1, 8192, 3584, 131072)  # Llama 3 70B's FC2 weight gradient at TP 8 over 16 x 8,192 tokens
    a, b, c = 8192 * 131072 * 2, 131072 * 3584 * 2, 8192 * 3584 * 2
    # half the buffer holds 2,560 x 2,560 fp32 sums: A read twice (3,584 columns), B 4 times (8,192 rows)
    assert hbm_matmul_bytes(d, glb, stream_k=True) == 2 * a + 4 * b + c
    assert hbm_matmul_bytes(gemm(1, 8192, 3584, 2 * 131072), glb, stream_k=True) == 2 * (2 * a + 4 * b) + c
    # the architecture space's ideal chips keep the K-long panels: B's 36 panels, A past each
    assert hbm_matmul_bytes(d, glb) == b + 36 * a + c
    lat = estimate_op(d, load_hardware("h100"))
    assert lat.bound != "hbm"  # data/h100/gemm.csv's K = 16,384 weight gradients ran at the forward's rate


def test_glb_traffic_streams_a_once_per_group_of_sharing_cores():
    d = gemm(2, 200, 200, 1000)
    t = tile_gemm_scalar(2, 200, 200, 1000, 128, 128, 8, 256 * 1024)  # 2 weight columns, 1 M block
    assert (t.tiles_n, t.tiles_m) == (2, 1)
    a, b_loads, c = 2 * 200 * 1000 * 2, 2 * 1 * 1000 * 200 * 2, 2 * 200 * 200 * 2
    assert glb_matmul_bytes(d, t, 1) == 2 * a + b_loads + c
    assert glb_matmul_bytes(d, t, 2) == a + b_loads + c


def test_a_given_tiling_is_priced_not_recomputed():
    """The pass prices a GEMM with its ``phaze.tile`` as written: on fewer cores, longer."""
    d = gemm(1, 4096, 4096, 4096)
    tc = TPU.tensor_cores
    own = tile_gemm_scalar(1, 4096, 4096, 4096, tc.pe_x, tc.pe_y, tc.count, tc.buffer_bytes)
    half = tile_gemm_scalar(1, 4096, 4096, 4096, tc.pe_x, tc.pe_y, tc.count // 2, tc.buffer_bytes)
    assert estimate_matmul(d, TPU, own) == estimate_op(d, TPU)
    slow = estimate_matmul(d, TPU, half)
    assert slow.bound == "compute" and slow.split_s == half.cycles_split / TPU.clock_hz
    assert slow.split_s == pytest.approx(2 * estimate_op(d, TPU).split_s, rel=1e-3)
    with pytest.raises(ValueError, match="every GEMM's tiling"):
        estimate_chip([d, gemm(1, 8, 8, 8)], TPU, [own, None])


def test_views_are_free_and_copies_are_not():
    assert estimate_op(ViewDesc(), TPU).split_s == 0.0
    module = single_op_module(
        '%t = phaze.layout "transpose" %x aten "aten.t.default" : (tensor<64x32xf16>) -> tensor<32x64xf16>\n'
        '    %c = phaze.layout "clone" %x aten "aten.clone.default" : (tensor<64x32xf16>) -> tensor<64x32xf16>',
        "%x: tensor<64x32xf16>",
    )
    view, copy = [describe_op(o) for o in module.walk() if isinstance(o, ph.LayoutOp)]
    assert view == ViewDesc()
    assert copy == VectorDesc(work=2048, read_bytes=4096, write_bytes=4096)
    assert estimate_op(copy, TPU).split_s > 0


def test_split_never_slower_than_one_core():
    rng = random.Random(5)
    space = paper_space()
    for _ in range(300):
        d = random_desc(rng)
        acc = space.accelerator(rng.randrange(len(space)))
        lat = estimate_op(d, acc)
        assert 0.0 <= lat.split_s <= lat.one_s


# ---- monotonicity in bandwidth ------------------------------------------------------------------


def random_desc(rng: random.Random):
    kind = rng.choice(["mm", "mm", "vec", "vec", "net"])
    logu = lambda lo, hi: int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))  # noqa: E731
    if kind == "mm":
        batch = rng.choice([1, 1, 4, 32])
        d = gemm(
            batch,
            logu(1, 16384),
            logu(1, 16384),
            logu(1, 16384),
            rng.choice([2, 4]),
            rhs_batched=batch > 1 and rng.random() < 0.5,
            bias=rng.random() < 0.3,
        )
        if rng.random() < 0.3:  # inside a fused kernel (phaze.kernel): some traffic on chip, maybe causal
            onchip = rng.randrange(1, d.a_bytes + d.b_bytes + d.c_bytes + 1)
            d = dataclasses.replace(d, onchip_bytes=onchip, causal=rng.random() < 0.5, launches=rng.choice([0, 1]))
        return d
    if kind == "vec":
        passes = rng.choice([1, 1, 2, 3])
        return VectorDesc(
            work=logu(1, 1 << 32),
            read_bytes=logu(1, 1 << 33),
            write_bytes=logu(1, 1 << 32),
            passes=passes,
            row_bytes=logu(1, 1 << 28) if passes > 1 else 0,
        )
    return CollectiveDesc(
        rng.choice(network.COLLECTIVES), rng.choice([1, 2, 3, 4, 8, 64, 1024, 8192]), logu(1, 1 << 34)
    )


def _halve(acc, what: str):
    r = dataclasses.replace
    if what == "hbm":
        return r(acc, hbm=r(acc.hbm, bandwidth_Bps=acc.hbm.bandwidth_Bps / 2))
    if what == "glb":
        return r(acc, global_buffer=r(acc.global_buffer, bandwidth_Bps=acc.global_buffer.bandwidth_Bps / 2))
    if what == "network":
        return r(acc, network=tuple(r(lv, bandwidth_Bps=lv.bandwidth_Bps / 2) for lv in acc.network))
    i = int(what.removeprefix("level"))
    return r(
        acc,
        network=tuple(r(lv, bandwidth_Bps=lv.bandwidth_Bps / 2) if j == i else lv for j, lv in enumerate(acc.network)),
    )


@pytest.mark.parametrize("seed", range(3))
def test_halving_any_bandwidth_never_makes_an_op_faster(seed):
    rng = random.Random(seed)
    space = paper_space()
    for _ in range(150):
        d = random_desc(rng)
        acc = space.accelerator(rng.randrange(len(space)))
        base = estimate_op(d, acc)
        for what in ("hbm", "glb", "network", "level0", "level1"):
            slow = estimate_op(d, _halve(acc, what))
            assert slow.one_s >= base.one_s and slow.split_s >= base.split_s, (what, d, acc)


def test_halving_bandwidth_in_the_vectorized_space_estimate():
    rng = random.Random(11)
    descs = list(dict.fromkeys(random_desc(rng) for _ in range(60)))
    configs = paper_space().configs[::97]
    fx = FixedParams.of(TPU)
    base = estimate_space(descs, configs, fx, cache=None)
    for slow in (
        dataclasses.replace(fx, hbm_bandwidth_Bps=fx.hbm_bandwidth_Bps / 2),
        dataclasses.replace(fx, glb_bandwidth_Bps=fx.glb_bandwidth_Bps / 2),
        dataclasses.replace(
            fx, levels=tuple(dataclasses.replace(lv, bandwidth_Bps=lv.bandwidth_Bps / 2) for lv in fx.levels)
        ),
    ):
        got = estimate_space(descs, configs, slow, cache=None)
        assert (got.one >= base.one).all() and (got.split >= base.split).all()


# ---- the space estimate's cache -------------------------------------------------------------------


def test_space_estimate_is_cached_per_description_and_configs():
    rng = random.Random(9)
    descs = list(dict.fromkeys(random_desc(rng) for _ in range(30)))
    configs = paper_space().configs[:500]
    cache = LatencyCache()
    first = estimate_space(descs, configs, TPU, cache=cache)
    computed = sum(1 for d in descs if not isinstance(d, (CollectiveDesc, ViewDesc)))
    assert cache.misses == computed and cache.hits == 0 and len(cache) == computed
    second = estimate_space(OpTable(descs[::-1]), configs, TPU, cache=cache)
    assert cache.hits == computed
    assert np.array_equal(second.split[::-1], first.split) and np.array_equal(second.one[::-1], first.one)
    # Other configurations are other entries.
    estimate_space(descs, configs[:10], TPU, cache=cache)
    assert len(cache) == 2 * computed


# ---- network ---------------------------------------------------------------------------------------


def test_alpha_beta_by_hand():
    levels = TPU.network  # tray: 4 devices, 100 GB/s, 1 us; pod: 4096 devices, 100 GB/s, 2 us
    assert network.level_for(levels, 1) == 0 and network.level_for(levels, 4) == 0
    assert network.level_for(levels, 5) == 1 and network.level_for(levels, 10**6) == 1
    mb = 100e6
    s, lvl = network.collective_s("all_reduce", mb, 4, levels)
    assert lvl == 0 and s == pytest.approx(2 * 3 / 4 * mb / 100e9 + 2 * 3 * 1e-6)  # 1.5 ms + 6 us
    assert s == pytest.approx(1.506e-3)
    s, lvl = network.collective_s("all_reduce", mb, 8, levels)
    assert lvl == 1 and s == pytest.approx(2 * 7 / 8 * 1e-3 + 14 * 2e-6)  # 1.75 ms + 28 us
    assert network.collective_s("all_gather", mb, 8, levels)[0] == pytest.approx(7 / 8 * 1e-3 + 7 * 2e-6)
    assert network.collective_s("reduce_scatter", mb, 8, levels)[0] == pytest.approx(7 / 8 * 1e-3 + 7 * 2e-6)
    assert network.collective_s("send_recv", mb, 2, levels)[0] == pytest.approx(1e-6 + 1e-3)
    assert network.collective_s("all_reduce", mb, 1, levels)[0] == 0.0
    with pytest.raises(ValueError, match="unknown collective"):
        network.collective_s("broadcast", mb, 2, levels)
    lat = estimate_op(CollectiveDesc("all_reduce", 4, int(mb)), TPU)
    assert (lat.one_s, lat.split_s, lat.unit, lat.bound) == (
        lat.split_s,
        network.ring_all_reduce_s(mb, 4, levels[0]),
        "network",
        "network",
    )


def _rust():
    return pytest.importorskip("passes.algorithms._phaze_rs")


def _layer(**over) -> dict:
    layer = {
        "fwd_s": 0.0,
        "bwd_s": 0.0,
        "recompute_s": [0.0, 0.0, 0.0],
        "saved_bytes": [0, 0, 0],
        "param_bytes": 0,
        "grad_bytes": 0,
        "optimizer_bytes": 0,
        "workspace_bytes": 0,
        "boundary_bytes": 0,
    }
    layer.update(over)
    return layer


LEVELS = [network.Level(4, 1.7e9, 1.3e-6), network.Level(32, 3.1e8, 4.7e-6), network.Level(1024, 1.1e8, 9.1e-6)]


def _problem(layers, devices, dp) -> dict:
    return {
        "layers": layers,
        "devices": devices,
        "hbm_bytes": 10**15,
        # a level's optional keys are given or absent (the stub's rule: None is not "absent")
        "levels": [{k: v for k, v in dataclasses.asdict(lv).items() if v is not None} for lv in LEVELS],
        "global_batch": dp,
        "micro_batch": 1,
        "tp": 1,
        "dp_overlap": False,
        "zero": "0",
        "virtual_stages": 1,
    }


@pytest.mark.parametrize("d", [2, 3, 4, 5, 8, 32, 33, 1024, 2048])
@pytest.mark.parametrize("nbytes", [1, 12345, 7 * 10**9])
def test_all_reduce_is_bit_identical_to_the_rust_dp(d, nbytes):
    rs = _rust()
    # One layer, one stage, d data-parallel replicas: the stage's DP all-reduce is a ring
    # all-reduce of the gradient bytes over d devices on level_for(d).
    ev = rs.evaluate_placement(_problem([_layer(grad_bytes=nbytes)], d, d), 1, d)
    got = ev["plan"]["stages"][0]["dp_comm_s"]
    mine, _ = network.collective_s("all_reduce", nbytes, d, LEVELS)
    assert got == mine


@pytest.mark.parametrize(
    ("d", "p", "t"),
    [(2, 1, 2), (2, 1, 4), (4, 1, 2), (8, 1, 2), (8, 2, 1), (3, 3, 1), (4, 3, 1), (16, 1, 2), (16, 2, 2), (5, 1, 8)]
    + [(2, 1, 8), (4, 1, 4), (4, 2, 4), (32, 1, 4), (9, 2, 2), (2, 3, 16), (64, 1, 16), (2, 1, 1024)],
)
@pytest.mark.parametrize("nbytes", [1, 12345, 7 * 10**9])
@pytest.mark.parametrize("order", ["tp-pp-dp", "tp-dp-pp"])
def test_strided_all_reduce_is_bit_identical_to_the_rust_dp(d, p, t, nbytes, order):
    rs = _rust()
    # p stages of one layer each, TP t, d replicas: numbered TP, PP, DP, a DP group's members
    # lie p·t apart and span d·p·t devices; numbered TP, DP, PP, t apart over d·t devices. With
    # several members inside one group of the level below (per_inner > 1) the ring is rail-aware.
    problem = _problem([_layer(grad_bytes=nbytes) for _ in range(p)], d * p * t, d)
    problem["tp"] = t
    problem["rank_order"] = order
    ev = rs.evaluate_placement(problem, p, d)
    assert ev["feasible"], ev["violations"]
    assert ev["plan"]["rank_order"] == order
    stride = p * t if order == "tp-pp-dp" else t
    index, ring = network.group_level(LEVELS, d, stride)
    assert index == network.level_for(LEVELS, d * stride)
    mine = network.ring_all_reduce_s(nbytes, d, ring)
    assert [s["dp_comm_s"] for s in ev["plan"]["stages"]] == [mine] * p


def test_the_equivalence_cases_span_levels_with_several_members_per_inner_group():
    # The cases above do exercise the rail rule: groups on level > 0 with per_inner 1 and > 1.
    seen = set()
    for d, p, t in [(8, 1, 2), (8, 2, 1), (4, 3, 1), (16, 2, 2), (2, 1, 8), (4, 1, 4), (2, 3, 16), (64, 1, 16)]:
        index = network.level_for(LEVELS, d * p * t)
        if index > 0:
            seen.add(network.per_inner(d, p * t, LEVELS[index - 1].group_size))
    assert 1 in seen and max(seen) >= 4
    for d in (8, 32, 33, 1024):  # the contiguous cases of the first test
        index = network.level_for(LEVELS, d)
        assert index > 0 and network.per_inner(d, 1, LEVELS[index - 1].group_size) > 1


@pytest.mark.parametrize("devices", [2, 4, 5, 64, 2048])
@pytest.mark.parametrize("nbytes", [1, 999_999, 3 * 10**9])
@pytest.mark.parametrize("order", ["tp-pp-dp", "tp-dp-pp"])
def test_send_recv_is_bit_identical_to_the_rust_dp(devices, nbytes, order):
    rs = _rust()
    # Two layers in two stages, replicated devices/2 times: stage 0 pays 2 p2p transfers of its
    # boundary bytes (activation out, gradient back) on the level of the pipeline: numbered
    # TP, PP, DP that of p*t = 2; numbered TP, DP, PP (neighbours d*t apart) that of all d*p*t.
    problem = _problem([_layer(boundary_bytes=nbytes), _layer()], devices, devices // 2)
    problem["rank_order"] = order
    ev = rs.evaluate_placement(problem, 2, devices // 2)
    got = ev["plan"]["stages"][0]["time_s"]
    span = 2 if order == "tp-pp-dp" else 2 * (devices // 2)
    mine, level = network.collective_s("send_recv", nbytes, span, LEVELS)
    assert level == network.level_for(LEVELS, span) and got == 0.0 + 2.0 * mine


# ---- layer totals ---------------------------------------------------------------------------------


def test_layer_totals_are_serial_sums_per_phase():
    got = layer_totals(
        [0, 0, 1, 0, 1, -1], ["fwd", "bwd", "fwd", "opt", "weird", "fwd"], [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    )
    assert got == {0: {"fwd": 1.0, "bwd": 2.0, "opt": 8.0}, 1: {"fwd": 20.0, "bwd": 0.0, "opt": 0.0}}


# ---- the pass on real IR ------------------------------------------------------------------------------


def test_every_compute_op_of_tiny_gpt2_gets_a_latency(tiny_gpt2_module):
    module = tiny_gpt2_module
    set_accelerator(module, TPU)
    _run(module, "phaze-tile-pe-array,phaze-estimate-latency")
    ops = [o for o in module.walk() if isinstance(o, ph.ComputeOp)]
    assert len(ops) > 100
    for o in ops:
        lat = o.attributes["phaze.latency"].as_dict()
        assert math.isfinite(lat["split_s"]) and 0.0 <= lat["split_s"] <= lat["one_s"]
        assert lat["unit"] in ("tensor", "vector", "network", "none") and lat["bound"] in BOUNDS
        if isinstance(o, ph.MatmulOp):
            assert lat["unit"] == "tensor" and "phaze.tile" in o.attributes and lat["split_s"] > 0
        elif isinstance(o, ph.LayoutOp) and o.is_view:
            assert lat["unit"] == "none" and lat["one_s"] == 0.0
        else:
            assert lat["unit"] == "vector"
    layers = module.attributes["phaze.layers"].data
    totals = [a.as_dict() for a in module.attributes["phaze.layer_latency"].data]
    assert [t["index"] for t in totals] == [a.get("index") for a in layers]
    # Identical blocks cost the same; a block's backward costs more than its forward.
    blocks = [t for t, a in zip(totals, layers) if a.get("kind") == "block"]
    assert len(blocks) >= 2 and all(b == {**blocks[0], "index": b["index"]} for b in blocks)
    assert blocks[0]["bwd_s"] > blocks[0]["fwd_s"] > 0
    text = print_module(module)
    assert print_module(parse_module(text)) == text


def test_the_pass_needs_an_accelerator_and_tiles_for_it(tiny_gpt2_module):
    with pytest.raises(PhazeError, match="requires a 'phaze.accelerator' op for phaze-estimate-latency"):
        _run(tiny_gpt2_module, "phaze-estimate-latency")
    set_accelerator(tiny_gpt2_module, TPU)
    with pytest.raises(PhazeError, match=r"'phaze.matmul' op requires 'phaze.tile'; run phaze-tile-pe-array first"):
        _run(tiny_gpt2_module, "phaze-estimate-latency")
    _run(tiny_gpt2_module, "phaze-tile-pe-array")
    set_accelerator(tiny_gpt2_module, load_hardware("a100"))  # the tiles are for another chip now
    with pytest.raises(PhazeError, match="'phaze.matmul' op has a 'phaze.tile' of another accelerator than 'a100'"):
        _run(tiny_gpt2_module, "phaze-estimate-latency")


def _priced(module) -> list[dict]:
    return [o.attributes["phaze.latency"].as_dict() for o in op_table(module)[2]]


def test_the_pass_prices_every_op_as_the_search_prices_its_configuration(tiny_gpt2_text):
    """A plan's latencies are the search's on the chip the search picked, bit for bit: the pass
    on candidate ``i`` of the paper's space equals ``estimate_space`` on row ``i`` (and on a
    preset, its :func:`config_of`), op by op, bound by bound."""
    space = paper_space()
    template = space.spec.template
    chips = [(space.accelerator(int(i)), space.configs[[i]]) for i in (0, len(space) // 3, len(space) - 1)]
    chips.append((TPU, config_of(TPU)))
    for acc, configs in chips:
        module = parse_module(tiny_gpt2_text)
        set_accelerator(module, acc)
        _run(module, "phaze-tile-pe-array,phaze-estimate-latency")
        table, row_of, _, _ = op_table(module)
        lat = estimate_space(table, configs, TPU if acc is TPU else template, cache=None)
        got = _priced(module)
        assert len(got) == len(row_of) > 100
        for rec, row in zip(got, row_of, strict=True):
            want = (lat.one[row, 0], lat.split[row, 0], BOUNDS[lat.bound[row, 0]])
            assert (rec["one_s"], rec["split_s"], rec["bound"]) == want, acc.name


def test_the_pass_prices_a_weight_gradient_over_many_tokens_as_its_input_gradient():
    """Llama 3 70B's gate projection at TP 8 over 16 x 8,192 tokens on the 500 W H100 (torchtitan's
    runs): its forward (K = 8,192) and its weight gradient xᵀ·dy (K = the 131,072 tokens) do the
    same FLOPs on operands of the same size; the second was priced HBM-bound at 2.7x the first."""
    x, xt = "tensor<131072x8192xbf16>", "tensor<8192x131072xbf16>"  # the normed input, transposed
    w, y = "tensor<8192x3584xbf16>", "tensor<131072x3584xbf16>"  # the weight, the output (its gradient)
    module = single_op_module(
        f"%y = phaze.matmul %x, %w : ({x}, {w}) -> {y}\n    %dw = phaze.matmul %xt, %dy : ({xt}, {y}) -> {w}",
        f"%x: {x}, %w: {w}, %xt: {xt}, %dy: {y}",
    )
    set_accelerator(module, load_hardware("h100_hbm2e"))
    _run(module, "phaze-tile-pe-array,phaze-estimate-latency")
    fwd, dw = (o.attributes["phaze.latency"].as_dict() for o in module.walk() if isinstance(o, ph.MatmulOp))
    assert dw["bound"] != "hbm" and dw["split_s"] < 1.05 * fwd["split_s"]


def test_the_pass_prices_a_calibrated_chip_as_the_search_does(tiny_gpt2_text):
    """On a GPU (calibrated: efficiencies, waves, launch costs) the search prices the chip's
    one configuration with :func:`estimate_chip`, which is what the pass calls."""
    h100 = load_hardware("h100")
    module = parse_module(tiny_gpt2_text)
    set_accelerator(module, h100)
    _run(module, "phaze-tile-pe-array,phaze-estimate-latency")
    table, row_of, _, _ = op_table(module)
    lat = estimate_chip(table, h100)
    ideal = estimate_chip(table, dataclasses.replace(h100, calibration=None))
    for rec, row in zip(_priced(module), row_of, strict=True):
        assert (rec["one_s"], rec["split_s"]) == (lat.one[row, 0], lat.split[row, 0])
        if rec["unit"] in ("tensor", "vector"):  # the calibration slows every computing op
            assert rec["split_s"] > ideal.split[row, 0]
