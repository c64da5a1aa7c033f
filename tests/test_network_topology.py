"""Topologies and protocols of a network level (docs/design.md §5.5): the torus's rings, the fat
tree's oversubscription, the protocols' least time; the TOML keys and their errors; and the
placement DP (Rust) pricing every one of them bit for bit as passes/algorithms/network.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from passes.algorithms import network
from phaze_ir.hardware import Accelerator, HardwareError, NetworkLevel, dumps_toml, load_hardware, loads_toml

CUBE = network.Level(64, 50e9, 1e-6, topology="torus", torus_dims=(4, 4, 4))
POD = network.Level(4096, 50e9, 2e-6, topology="torus", torus_dims=(4, 4, 4))
TORUS = (CUBE, POD)


# ---- the torus ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("g", "stride", "lengths", "links"),
    [
        (2, 1, [2, 1, 1], 1),  # a pair: one link
        (4, 1, [4, 1, 1], 2),  # fills x of the cube: a closed ring, both directions
        (16, 1, [4, 4, 1], 4),
        (64, 1, [4, 4, 4], 6),  # the cube: six links
        (8, 8, [1, 2, 4], 3),  # y half-filled (open), z filled
        (32, 2, [2, 4, 4], 5),
    ],
)
def test_rings_of_a_cube(g, stride, lengths, links):
    assert network.torus_rings(TORUS, 0, g, stride) == (lengths, links)
    assert network.ring_bandwidth_Bps(TORUS, 0, g, stride) == links * 50e9
    assert network.ring_steps(TORUS, 0, g, stride) == sum(c - 1 for c in lengths)


def test_rings_across_cubes_multiply_per_axis_and_close_through_the_switches():
    # 128 contiguous chips: a whole cube and a second along X: 8 x 4 x 4 chips, every axis a ring.
    assert network.torus_rings(TORUS, 1, 128, 1) == ([8, 4, 4], 6)
    # The pod: 16 x 16 x 16.
    assert network.torus_rings(TORUS, 1, 4096, 1) == ([16, 16, 16], 6)
    # One chip per cube (a DP group under TP 64): X, Y, Z of the cubes, each filled: closed.
    assert network.torus_rings(TORUS, 1, 64, 64) == ([4, 4, 4], 6)
    # Two cubes, one chip each: a pair.
    assert network.torus_rings(TORUS, 1, 2, 64) == ([2, 1, 1], 1)


def test_the_torus_all_reduce_grows_with_the_dimensions_used():
    n = 1e9
    one = network.all_reduce_s(TORUS, n, 4)  # one axis: 2 links
    three = network.all_reduce_s(TORUS, n, 64)  # three axes: 6 links
    assert one == 2.0 * 3.0 / 4.0 * n / 100e9 + 2.0 * 3.0 * 1e-6
    assert three == 2.0 * 63.0 / 64.0 * n / 300e9 + 2.0 * 9.0 * 1e-6
    # Against the flat tpuv4 (every ring at 2 links): the cube's all-reduce is ~3x faster.
    flat = network.levels_of(load_hardware("tpuv4").network)
    assert 2.9 < network.all_reduce_s(flat, n, 64) / three < 3.1
    assert network.collective_s("all_reduce", n, 64, TORUS) == (three, 0)
    assert network.collective_s("reduce_scatter", n, 64, TORUS)[0] == 63.0 / 64.0 * n / 300e9 + 9.0 * 1e-6


# ---- the fat tree ---------------------------------------------------------------------------


def test_the_fat_tree_divides_rings_that_leave_their_leaf():
    node = network.Level(8, 200e9, 5e-6)
    tree = network.Level(1024, 25e9, 5e-6, topology="fat_tree", leaf_size=32, oversubscription=2.0)
    switch = network.Level(1024, 25e9, 5e-6)
    for g, stride in ((16, 1), (4, 8), (32, 1), (8, 4)):  # inside one leaf of 32: as a switch
        assert network.ring_bandwidth_Bps((node, tree), 1, g, stride) == network.ring_bandwidth_Bps(
            (node, switch), 1, g, stride
        )
    for g, stride in ((64, 1), (8, 8), (2, 32)):  # across leaves: halved
        assert network.ring_bandwidth_Bps((node, tree), 1, g, stride) == (
            network.ring_bandwidth_Bps((node, switch), 1, g, stride) / 2.0
        )


# ---- the protocols --------------------------------------------------------------------------


def test_protocols_take_the_least():
    small, large = network.Protocol(200e9, 2e-6, 30e-6, 500e9), network.Protocol(240e9, 3e-6, 120e-6)
    level = network.Level(8, 216e9, 6e-6, protocols=(small, large))
    for n in (2**20, 2**30):
        a = 30e-6 + 2.0 * 7.0 * 2e-6 + 2.0 * 7.0 / 8.0 * n / 200e9 + n / 8.0 / 500e9
        b = 120e-6 + 2.0 * 7.0 * 3e-6 + 2.0 * 7.0 / 8.0 * n / 240e9
        assert network.all_reduce_s([level], n, 8) == min(a, b)
    assert network.all_reduce_s([level], 2**20, 8) < network.all_reduce_s([level], 2**30, 8)
    assert network.all_reduce_s([level], 2**20, 1) == 0.0


def test_nvls_prices_all_reduces_only():
    """NVLink SHARP: two passes through the switch and n bytes each way whatever g, so it wins
    the all-reduce on 8 GPUs and loses it on 2 (where a ring sends n too, at more bandwidth);
    reduce-scatters and all-gathers take the ring."""
    ring, nvls = network.Protocol(370e9, 2e-6), network.Protocol(275e9, 2e-6, algorithm="nvls")
    level = network.Level(8, 450e9, 2e-6, protocols=(ring, nvls))
    n = 2**30
    assert network.all_reduce_s([level], n, 8) == 2.0 * 2e-6 + n / 275e9
    assert network.all_reduce_s([level], n, 2) == 2.0 * 1.0 * 2e-6 + 2.0 * 1.0 / 2.0 * n / 370e9
    assert network.half_ring_s([level], n, 8) == 7.0 * 2e-6 + 7.0 / 8.0 * n / 370e9
    assert network.collective_s("all_gather", n, 8, [level]) == (network.half_ring_s([level], n, 8), 0)
    # Without the NVLS protocol, the ring's all-reduce: 14 steps and 7/4 n.
    alone = network.Level(8, 450e9, 2e-6, protocols=(ring,))
    assert network.all_reduce_s([alone], n, 8) == 14.0 * 2e-6 + 2.0 * 7.0 / 8.0 * n / 370e9


# ---- the TOML keys --------------------------------------------------------------------------

BASE = dumps_toml(load_hardware("tpuv4")).split("[[network]]")[0]
LEVEL = '[[network]]\nname = "{name}"\ngroup_size = {g}\nbandwidth_Bps = 50e9\nlatency_s = 1e-6\n'


def _toml(*levels: str) -> str:
    return BASE + "\n".join(levels)


@pytest.mark.parametrize(
    ("levels", "message"),
    [
        (
            (LEVEL.format(name="c", g=64) + 'topology = "ring"\n',),
            'x.toml: network[0].topology = "ring": expected one of "switch", "torus", "fat_tree"',
        ),
        (
            (LEVEL.format(name="c", g=64) + 'topology = "torus"\ntorus_dims = [4, 4, 5]\n',),
            "x.toml: network[0].torus_dims = [4, 4, 5]: expected dimensions whose product is group_size = 64",
        ),
        (
            (LEVEL.format(name="c", g=64) + 'topology = "torus"\ntorus_dims = [64]\n',),
            "x.toml: network[0].torus_dims = [64]: expected an array of 2 or 3 positive integers",
        ),
        (
            (LEVEL.format(name="c", g=64) + 'topology = "torus"\n',),
            "x.toml: missing required key 'network[0].torus_dims'",
        ),
        (
            (LEVEL.format(name="c", g=64) + "torus_dims = [8, 8]\n",),
            'x.toml: network[0].torus_dims = [8, 8]: expected no value: it goes with topology = "torus"',
        ),
        (
            (
                LEVEL.format(name="n", g=8),
                LEVEL.format(name="p", g=64) + 'topology = "torus"\ntorus_dims = [2, 2, 2]\n',
            ),
            'x.toml: network[1].topology = "torus": expected a torus only as the innermost level or on a torus',
        ),
        (
            (
                LEVEL.format(name="c", g=64) + 'topology = "torus"\ntorus_dims = [4, 4, 4]\n',
                LEVEL.format(name="p", g=4096) + 'topology = "torus"\ntorus_dims = [8, 8]\n',
            ),
            "x.toml: network[1].torus_dims = [8, 8]: expected 3 dimensions, as the inner torus",
        ),
        (
            (
                LEVEL.format(name="c", g=64) + 'topology = "torus"\ntorus_dims = [4, 4, 4]\n',
                LEVEL.format(name="p", g=4096) + 'topology = "torus"\ntorus_dims = [4, 4, 4]\nuplink_Bps = 1e11\n',
            ),
            "x.toml: network[1].uplink_Bps = 1e11: expected no value: a torus has no uplink",
        ),
        (
            (
                LEVEL.format(name="n", g=8),
                LEVEL.format(name="p", g=64) + 'topology = "fat_tree"\nleaf_size = 12\noversubscription = 2\n',
            ),
            "x.toml: network[1].leaf_size = 12: expected a multiple of the inner group (8 devices) that divides",
        ),
        (
            (
                LEVEL.format(name="n", g=8),
                LEVEL.format(name="p", g=64) + 'topology = "fat_tree"\nleaf_size = 16\noversubscription = 0.5\n',
            ),
            "x.toml: network[1].oversubscription = 0.5: expected a number >= 1",
        ),
        (
            (
                LEVEL.format(name="n", g=8),
                LEVEL.format(name="p", g=64)
                + "[[network.protocols]]\nname = 'a'\nbandwidth_Bps = 1e9\nlatency_s = 0\n",
            ),
            "x.toml: network[1].protocols = [...] (an array): expected no value: protocols are fitted inside one",
        ),
        (
            (
                LEVEL.format(name="n", g=8)
                + "[[network.protocols]]\nname = 'a'\nbandwidth_Bps = 1e9\nlatency_s = 0\nalgorithm = 'tree'\n",
            ),
            'x.toml: network[0].protocols[0].algorithm = "tree": expected one of "ring", "nvls"',
        ),
        (
            (
                LEVEL.format(name="n", g=8)
                + "[[network.protocols]]\nname = 'a'\nbandwidth_Bps = 1e9\nlatency_s = 0\nalgorithm = 'nvls'\n",
            ),
            "x.toml: network[0].protocols = [...] (an array): expected at least one ring protocol",
        ),
    ],
)
def test_bad_topologies_are_named(levels, message):
    with pytest.raises(HardwareError) as info:
        loads_toml(_toml(*levels), source="x.toml")
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize("name", ["tpuv4_torus", "a100", "h100"])
def test_presets_round_trip(name):
    acc = load_hardware(name)
    assert loads_toml(dumps_toml(acc)) == acc and Accelerator.from_dict(acc.to_dict()) == acc


def test_switch_is_the_default_bit_for_bit():
    levels = network.levels_of(load_hardware("a100").network)
    explicit = tuple(dataclasses.replace(lv, topology="switch") for lv in levels)
    for g, s in ((2, 1), (8, 1), (16, 1), (4, 8), (64, 2)):
        assert network.all_reduce_s(levels, 12345678, g, s) == network.all_reduce_s(explicit, 12345678, g, s)
        assert network.half_ring_s(levels, 12345678, g, s) == network.half_ring_s(explicit, 12345678, g, s)


def test_the_torus_preset_is_tpuv4_but_for_its_network():
    flat, torus = load_hardware("tpuv4"), load_hardware("tpuv4_torus")
    assert dataclasses.replace(torus, name="tpuv4", network=flat.network) == flat
    assert [lv.torus_dims for lv in torus.network] == [(4, 4, 4), (4, 4, 4)]


# ---- the placement DP prices them as Python does, bit for bit --------------------------------


def _rust():
    return pytest.importorskip("passes.algorithms._phaze_rs")


def _layer(grad_bytes: int) -> dict:
    return {
        "fwd_s": 1e-3,
        "bwd_s": 2e-3,
        "recompute_s": [0.0, 0.0, 0.0],
        "saved_bytes": [0, 0, 0],
        "param_bytes": 0,
        "grad_bytes": grad_bytes,
        "optimizer_bytes": 0,
        "workspace_bytes": 0,
        "boundary_bytes": 0,
    }


def _network(spec: list[dict]) -> tuple[NetworkLevel, ...]:
    """The network levels of the description ``spec`` (the hardware file's ``network``), as a
    chip holds them: what phaze-place-devices gives the DP."""
    return Accelerator.from_dict({**load_hardware("tpuv4").to_dict(), "network": spec}).network


def _problem(levels: Sequence, layers: list[dict], d: int, t: int) -> dict:
    """A fixed-placement problem of ``layers`` (one stage each) at DP ``d``, TP ``t`` on the
    network ``levels`` (a chip's, or their dicts): plain 1F1B, no ZeRO, one micro-batch per
    replica."""
    return {
        "layers": layers,
        "devices": d * len(layers) * t,
        "hbm_bytes": 10**15,
        "levels": levels,
        "global_batch": d,
        "micro_batch": 1,
        "tp": t,
        "dp_overlap": False,
        "zero": "0",
        "virtual_stages": 1,
    }


NETWORKS = {
    "tpuv4_torus": load_hardware("tpuv4_torus").to_dict()["network"],
    "a100": load_hardware("a100").to_dict()["network"],
    "h100": load_hardware("h100").to_dict()["network"],  # a ring and an NVLS protocol
    "fat_tree": [
        {"name": "node", "group_size": 8, "bandwidth_Bps": 216.5e9, "latency_s": 6.34e-6},
        {
            "name": "cluster",
            "group_size": 4096,
            "bandwidth_Bps": 25e9,
            "latency_s": 5e-6,
            "uplink_Bps": 100e9,
            "topology": "fat_tree",
            "leaf_size": 256,
            "oversubscription": 3.0,
        },
    ],
}


@pytest.mark.parametrize("net", sorted(NETWORKS))
@pytest.mark.parametrize(
    ("d", "p", "t"), [(2, 1, 1), (4, 1, 1), (8, 1, 1), (4, 1, 2), (16, 1, 4), (64, 1, 1), (2, 2, 16), (64, 1, 64)]
)
@pytest.mark.parametrize("nbytes", [1, 12345, 7 * 10**9])
def test_the_dp_all_reduce_is_bit_identical(net, d, p, t, nbytes):
    rs = _rust()
    chip = _network(NETWORKS[net])
    problem = _problem(chip, [_layer(nbytes) for _ in range(p)], d, t)
    ev = rs.evaluate_placement(problem, p, d)
    assert ev["feasible"], ev["violations"]
    levels = network.levels_of(chip)
    mine = network.all_reduce_s(levels, nbytes, d, p * t)
    assert [s["dp_comm_s"] for s in ev["plan"]["stages"]] == [mine] * p
    # ZeRO-1 prices a reduce-scatter of the gradients and an all-gather of the (here 0)
    # parameters instead: the half rings.
    ev1 = rs.evaluate_placement({**problem, "zero": "1"}, p, d)
    half = network.half_ring_s(levels, nbytes, d, p * t) + network.half_ring_s(levels, 0, d, p * t)
    assert [s["dp_comm_s"] for s in ev1["plan"]["stages"]] == [half] * p


@pytest.mark.parametrize("net", sorted(NETWORKS))
@pytest.mark.parametrize("rank_order", ["tp-dp-pp", "tp-pp-dp"])
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize(("d", "p", "t"), [(2, 2, 1), (4, 2, 2), (2, 4, 4), (8, 2, 8), (1, 16, 1)])
def test_the_pipeline_transfer_is_bit_identical(net, rank_order, split, d, p, t):
    """Stage 0's time, with no compute, is its two transfers to stage 1 (activation, gradient),
    priced on the level of the pipeline's span (the rank order's) with the node uplink's share
    (p2p_bandwidth_Bps); split over the TP group, 1/t each and the TP group's all-gather."""
    rs = _rust()
    chip = _network(NETWORKS[net])
    nbytes = 12345678
    layer = {**_layer(0), "fwd_s": 0.0, "bwd_s": 0.0, "boundary_bytes": nbytes}
    problem = {**_problem(chip, [layer] * p, d, t), "rank_order": rank_order, "pipeline_split": split}
    ev = rs.evaluate_placement(problem, p, d)
    assert ev["feasible"], ev["violations"]
    levels = network.levels_of(chip)
    stride = d * t if rank_order == "tp-dp-pp" else t
    index = network.level_for(levels, p * stride)
    bw = network.p2p_bandwidth_Bps(levels, index, stride)
    if split and t > 1:
        mine = (levels[index].latency_s + nbytes / t / bw) + network.half_ring_s(levels, nbytes, t)
    else:
        mine = levels[index].latency_s + nbytes / bw
    assert ev["plan"]["stages"][0]["time_s"] == 2.0 * mine


def test_the_dp_rejects_a_torus_without_dimensions():
    rs = _rust()
    problem = {
        "layers": [_layer(1)],
        "devices": 4,
        "hbm_bytes": 10**15,
        "levels": [{"group_size": 4, "bandwidth_Bps": 1e9, "latency_s": 0.0, "topology": "torus"}],
        "global_batch": 1,
        "micro_batch": 1,
        "tp": 1,
        "dp_overlap": False,
    }
    with pytest.raises(ValueError, match="torus_dims"):
        rs.solve_placement(problem)
