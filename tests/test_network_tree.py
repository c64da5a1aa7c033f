"""NCCL's tree all-reduce on a level above the innermost (``tree = true``, docs/design.md §5.5):
the formula on hand-worked cases, the less of ring and tree taken, levels without it unchanged
bit for bit, the TOML key and its errors, and the placement DP (Rust) pricing it bit for bit as
passes/algorithms/network.py."""

from __future__ import annotations

import dataclasses

import pytest

from passes.algorithms import network
from phaze_ir.hardware import Accelerator, HardwareError, dumps_toml, load_hardware, loads_toml
from tests.test_network_topology import _layer, _network, _problem, _rust

# The a100 preset's levels without its protocols: nodes of 8 GPUs (216.5e9 B/s, 6.34 us per
# step), the cluster over one NIC per GPU (25e9 B/s, 5 us); the cluster may run trees.
NODE = network.Level(8, 216.5e9, 6.34e-6)
RINGS = (NODE, network.Level(4096, 25e9, 5e-6))
TREES = (NODE, network.Level(4096, 25e9, 5e-6, tree=True))


def _ring(n: float, g: int, bw: float) -> float:
    return 2.0 * (g - 1.0) / g * n / bw + 2.0 * (g - 1.0) * 5e-6


# ---- the formula ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("g", "stride", "steps"),
    [
        (16, 8, (0, 4)),  # one GPU in each of 16 nodes: no chain, depth log2 16
        (5, 8, (0, 3)),  # 5 nodes: depth ⌈log2 5⌉
        (64, 1, (7, 3)),  # 8 whole nodes: a chain of 8 GPUs in each, depth 3
        (24, 1, (7, 2)),  # 3 nodes: ⌈log2 3⌉ = 2
        (16, 2, (3, 2)),  # 4 per node over 4 nodes
        (8, 1, (7, 0)),  # one node (asked directly: such a group uses the node level)
    ],
)
def test_tree_steps(g, stride, steps):
    assert network.tree_steps(TREES, 1, g, stride) == steps


def test_the_tree_by_hand():
    n = 1e3
    # 16 nodes, one GPU each: 2n / 25e9 + 2·4 cluster latencies.
    tree = 2.0 * n / 25e9 + 2.0 * 0.0 * 6.34e-6 + 2.0 * 4.0 * 5e-6
    assert network.tree_all_reduce_s(TREES, 1, n, 16, 8, 25e9) == tree
    assert network.all_reduce_s(TREES, n, 16, 8) == tree
    assert tree == pytest.approx(4.008e-5)
    # 64 contiguous GPUs (the rails: min(8 · 25e9, 216.5e9) = 200e9): a chain of 7 NVLink
    # steps and 3 cluster levels, each way.
    tree = 2.0 * n / 200e9 + 2.0 * 7.0 * 6.34e-6 + 2.0 * 3.0 * 5e-6
    assert network.all_reduce_s(TREES, n, 64) == tree
    assert network.collective_s("all_reduce", n, 64, TREES) == (tree, 1)


@pytest.mark.parametrize(("g", "stride", "bw"), [(16, 8, 25e9), (64, 1, 200e9), (32, 8, 25e9), (16, 2, 100e9)])
def test_the_tree_wins_small_messages_and_the_ring_large_ones(g, stride, bw):
    # (On 64 GPUs the ring's 2·63 latencies outweigh its 1/32 fewer bytes up to ~3.3 GB.)
    small, large = 1e4, 1e10
    chain, depth = network.tree_steps(TREES, 1, g, stride)

    def tree(n: float) -> float:
        return 2.0 * n / bw + 2.0 * chain * 6.34e-6 + 2.0 * depth * 5e-6

    assert network.ring_bandwidth_Bps(TREES, 1, g, stride) == bw
    assert tree(small) < _ring(small, g, bw)
    assert network.all_reduce_s(TREES, small, g, stride) == tree(small)
    assert _ring(large, g, bw) < tree(large)
    assert network.all_reduce_s(TREES, large, g, stride) == _ring(large, g, bw)
    # Without the key, rings only.
    assert network.all_reduce_s(RINGS, small, g, stride) == _ring(small, g, bw)


def test_only_all_reduces_run_as_trees():
    for g, stride in ((16, 8), (64, 1), (4, 1)):
        for n in (1.0, 1e4, 1e9):
            assert network.half_ring_s(TREES, n, g, stride) == network.half_ring_s(RINGS, n, g, stride)
            for kind in ("all_gather", "reduce_scatter", "send_recv"):
                assert network.collective_s(kind, n, g, TREES) == network.collective_s(kind, n, g, RINGS)


def test_groups_inside_a_node_are_unchanged():
    for g, stride in ((2, 1), (8, 1), (2, 4)):
        for n in (1.0, 1e4, 1e9):
            assert network.all_reduce_s(TREES, n, g, stride) == network.all_reduce_s(RINGS, n, g, stride)


def test_a_level_without_tree_is_unchanged_bit_for_bit():
    # The a100 preset's levels with the tree switched off (the preset runs trees across nodes).
    levels = network.levels_of([dataclasses.replace(lv, tree=None) for lv in load_hardware("a100").network])
    assert not any(lv.tree for lv in levels)
    explicit = tuple(dataclasses.replace(lv, tree=False) for lv in levels)
    for g, s in ((2, 1), (8, 1), (16, 1), (4, 8), (64, 2), (512, 1)):
        for n in (1, 12345678, 7e9):
            mine = network.all_reduce_s(levels, n, g, s)
            assert mine == network.all_reduce_s(explicit, n, g, s)
            if g * s > 8:  # the cluster's rail-aware ring, as before
                bw = network.ring_bandwidth_Bps(levels, 1, g, s)
                assert mine == 2.0 * (g - 1.0) / g * float(n) / bw + 2.0 * float(g - 1) * 5e-6


# ---- the TOML key ---------------------------------------------------------------------------

BASE = dumps_toml(load_hardware("tpuv4")).split("[[network]]")[0]
LEVEL = '[[network]]\nname = "{name}"\ngroup_size = {g}\nbandwidth_Bps = 50e9\nlatency_s = 1e-6\n'


def test_the_key_round_trips():
    acc = loads_toml(BASE + LEVEL.format(name="n", g=8) + LEVEL.format(name="c", g=64) + "tree = true\n")
    assert [lv.tree for lv in acc.network] == [None, True]
    assert acc.to_dict()["network"][1]["tree"] is True and "tree" not in acc.to_dict()["network"][0]
    assert loads_toml(dumps_toml(acc)) == acc and Accelerator.from_dict(acc.to_dict()) == acc
    assert network.levels_of(acc.network)[1].tree is True


@pytest.mark.parametrize(
    ("levels", "message"),
    [
        (
            (LEVEL.format(name="n", g=8) + "tree = true\n", LEVEL.format(name="c", g=64)),
            "x.toml: network[0].tree = true: expected no value: NCCL's tree crosses the groups of the level below",
        ),
        (
            (
                LEVEL.format(name="c", g=64) + 'topology = "torus"\ntorus_dims = [4, 4, 4]\n',
                LEVEL.format(name="p", g=4096) + 'topology = "torus"\ntorus_dims = [4, 4, 4]\ntree = true\n',
            ),
            "x.toml: network[1].tree = true: expected no value: NCCL's tree crosses",
        ),
        (
            (LEVEL.format(name="n", g=8), LEVEL.format(name="c", g=64) + "tree = 1\n"),
            "x.toml: network[1].tree = 1: expected true or false",
        ),
    ],
)
def test_bad_trees_are_named(levels, message):
    with pytest.raises(HardwareError) as info:
        loads_toml(BASE + "\n".join(levels), source="x.toml")
    assert str(info.value).startswith(message), str(info.value)


# ---- the placement DP prices it as Python does, bit for bit ---------------------------------


NODE_SPEC = {"name": "node", "group_size": 8, "bandwidth_Bps": 216.5e9, "latency_s": 6.34e-6}
CLUSTER_SPEC = {"name": "cluster", "group_size": 4096, "bandwidth_Bps": 25e9, "latency_s": 5e-6, "tree": True}
NETWORKS = {
    "two_levels": [NODE_SPEC, CLUSTER_SPEC],
    "uplink": [NODE_SPEC, {**CLUSTER_SPEC, "uplink_Bps": 100e9}],
    # The inner level's protocols price its own rings; the tree's chain takes its latency_s.
    "a100": [load_hardware("a100").to_dict()["network"][0], {**CLUSTER_SPEC, "uplink_Bps": 100e9}],
    "fat_tree": [NODE_SPEC, {**CLUSTER_SPEC, "topology": "fat_tree", "leaf_size": 256, "oversubscription": 3.0}],
}


@pytest.mark.parametrize("net", sorted(NETWORKS))
@pytest.mark.parametrize("rank_order", ["tp-dp-pp", "tp-pp-dp"])
@pytest.mark.parametrize(
    ("d", "p", "t"),
    [(2, 1, 1), (8, 1, 1), (16, 1, 1), (3, 1, 8), (5, 2, 4), (24, 1, 1), (64, 1, 1), (2, 2, 16), (64, 2, 4)],
)
@pytest.mark.parametrize("nbytes", [1, 12345, 10**6, 7 * 10**9])
def test_the_dp_all_reduce_is_bit_identical(net, rank_order, d, p, t, nbytes):
    rs = _rust()
    chip = _network(NETWORKS[net])
    problem = {**_problem(chip, [_layer(nbytes) for _ in range(p)], d, t), "rank_order": rank_order}
    assert chip[1].tree is True
    ev = rs.evaluate_placement(problem, p, d)
    assert ev["feasible"], ev["violations"]
    levels = network.levels_of(chip)
    stride = t if rank_order == "tp-dp-pp" else p * t
    mine = network.all_reduce_s(levels, nbytes, d, stride)
    assert [s["dp_comm_s"] for s in ev["plan"]["stages"]] == [mine] * p
    # The search prices its plan the same (its classes of p know the tree).
    plan = rs.solve_placement(problem)["plan"]
    stride = t if rank_order == "tp-dp-pp" else plan["pp"] * t
    for stage in plan["stages"]:
        grads = (stage["last_layer"] - stage["first_layer"] + 1) * nbytes
        assert stage["dp_comm_s"] == network.all_reduce_s(levels, grads, plan["dp"], stride)


def test_the_dp_rejects_a_tree_on_the_innermost_level():
    rs = _rust()
    level = {"group_size": 4, "bandwidth_Bps": 1e9, "latency_s": 0.0, "tree": True}
    with pytest.raises(ValueError, match="tree"):
        rs.solve_placement(_problem([level], [_layer(1)], 1, 1))


def test_a_chip_with_trees_compiles_and_its_plan_reads_back(tmp_path):
    """End to end: phazec on the a100 preset, whose cluster level runs trees, writes ``tree =
    true`` into the plan's accelerator, and phaze-opt reads the plan back to the same bytes."""
    from tests.conftest import MODELS, module_text, run_main

    assert load_hardware("a100").network[1].tree is True
    plan = tmp_path / "plan.mlir"
    args = [
        "--devices",
        "16",
        "--global-batch",
        "32",
        "--micro-batch",
        "2",
        "--tp",
        "1",
        "--placement",
        "expert:1,16,1",
    ]
    res = run_main("phazec", str(MODELS / "tiny_gpt2.py"), "--hw", "a100", *args, "-o", str(plan))
    assert res.returncode == 0, res.stderr
    text = plan.read_text()
    assert "tree = true" in text
    again = run_main("phaze-opt", str(plan))
    assert again.returncode == 0 and again.stdout == module_text(text)
