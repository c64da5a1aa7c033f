"""The rail-aware ring bandwidth of passes/algorithms/network.py on the a100 preset's levels.

A group that spans several groups of the level below drives one link per member in each of
them (NCCL's channels over one NIC per GPU on DGX A100): ``min(per_inner · bw_i, bw_{i−1})``.
"""

from __future__ import annotations

import pytest

from passes.algorithms import network

# The a100 preset's levels: nodes of 8 GPUs at a fitted 216.5e9 B/s (6.34 us per ring step), the
# cluster over one 200 Gb/s HDR NIC per GPU, 25e9 B/s (5 us).
NODE = network.Level(8, 216.5e9, 6.34e-6)
CLUSTER = network.Level(4096, 25e9, 5e-6)
A100 = (NODE, CLUSTER)


def test_tp_16_over_two_nodes_rings_at_eight_nics():
    index, ring = network.group_level(A100, 16)
    assert index == 1 and network.per_inner(16, 1, 8) == 8
    assert ring.bandwidth_Bps == network.ring_bandwidth_Bps(A100, 1, 16) == min(8 * 25e9, 216.5e9) == 200e9
    assert (ring.group_size, ring.latency_s) == (4096, 5e-6)
    n = 1e9
    s, level = network.collective_s("all_reduce", n, 16, A100)
    assert level == 1 and s == 2.0 * 15.0 / 16.0 * n / 200e9 + 2.0 * 15.0 * 5e-6
    assert network.collective_s("all_gather", n, 16, A100)[0] == 15.0 / 16.0 * n / 200e9 + 15.0 * 5e-6
    assert network.collective_s("reduce_scatter", n, 16, A100)[0] == 15.0 / 16.0 * n / 200e9 + 15.0 * 5e-6
    # send_recv keeps the level's own bandwidth.
    assert network.collective_s("send_recv", n, 16, A100)[0] == 5e-6 + n / 25e9


def test_a_dp_group_of_one_gpu_per_node_has_one_nic():
    # TP 8 fills each node: the DP group's members lie 8 apart, one per node, one NIC each.
    for d in (2, 4, 512):
        index, ring = network.group_level(A100, d, stride=8)
        assert index == 1 and network.per_inner(d, 8, 8) == 1 and ring.bandwidth_Bps == 25e9
    # TP 16 (stride 16 > a node): still one NIC.
    assert network.group_level(A100, 2, stride=16)[1].bandwidth_Bps == 25e9
    # TP 4: two members per node, two NICs; TP 2, PP 2 (stride 4): the same.
    assert network.group_level(A100, 8, stride=4)[1].bandwidth_Bps == 50e9
    # Stride 3 (PP 3): 8 // 3 = 2 per node.
    assert network.group_level(A100, 10, stride=3)[1].bandwidth_Bps == 50e9


@pytest.mark.parametrize("g", [1, 2, 3, 4, 5, 7, 8])
@pytest.mark.parametrize("kind", network.COLLECTIVES)
def test_single_node_groups_are_unchanged(g, kind):
    n = 123_456_789
    s, level = network.collective_s(kind, n, g, A100)
    assert level == 0
    if g == 1:
        assert s == 0.0
    elif kind == "all_reduce":
        assert s == network.ring_all_reduce_s(n, g, NODE)
    elif kind == "send_recv":
        assert s == network.send_recv_s(n, NODE)
    else:
        assert s == network.all_gather_s(n, g, NODE)
    # Level 0's bandwidth is its own whatever the stride.
    assert network.ring_bandwidth_Bps(A100, 0, g, 4) == NODE.bandwidth_Bps


def test_the_uplink_caps_a_node_with_fewer_nics_than_gpus():
    """The a100 preset's cluster level (the measured runs' nodes send 800 Gb/s in all): TP 16
    rings at 100e9, not eight NICs' 200e9. Groups that leave a node at once share its uplink:
    with k members per node, 8 / k groups, each ``100e9 · k / 8``."""
    from phaze_ir.hardware import load_hardware

    levels = load_hardware("a100").network
    assert levels[1].uplink_Bps == 100e9 and levels[0].uplink_Bps is None
    assert network.ring_bandwidth_Bps(levels, 1, 16) == 100e9
    # TP 4: a DP group has 2 members per node (two NICs, 50e9), 4 such groups share 100e9.
    assert network.ring_bandwidth_Bps(levels, 1, 8, stride=4) == 25e9
    # TP 8: one member per node (one NIC, 25e9), 8 groups share 100e9.
    assert network.ring_bandwidth_Bps(levels, 1, 4, stride=8) == 12.5e9
    capped = (NODE, network.Level(4096, 25e9, 5e-6, uplink_Bps=60e9))
    shares = [network.ring_bandwidth_Bps(capped, 1, 16, s) for s in (1, 2, 4, 8)]
    assert shares == [60e9, 60e9 * 4 / 8, 60e9 * 2 / 8, 60e9 / 8]
    # Without an uplink nothing is shared: the rails alone.
    assert [network.ring_bandwidth_Bps(A100, 1, 16, s) for s in (1, 2, 4, 8)] == [200e9, 100e9, 50e9, 25e9]


def test_pipeline_transfers_share_the_uplink():
    """min(stride, 8) GPUs of a node send to the next stage at once: each gets the uplink over
    them, at most its own NIC."""
    from phaze_ir.hardware import load_hardware

    levels = load_hardware("a100").network
    assert network.p2p_bandwidth_Bps(levels, 1, 8) == network.p2p_bandwidth_Bps(levels, 1, 64) == 12.5e9
    assert network.p2p_bandwidth_Bps(levels, 1, 4) == 25e9
    assert network.p2p_bandwidth_Bps(levels, 1, 1) == 25e9
    assert network.p2p_bandwidth_Bps(levels, 0, 8) == levels[0].bandwidth_Bps
    assert network.p2p_bandwidth_Bps(A100, 1, 8) == 25e9


def test_the_inner_level_caps_the_rails():
    slow = (network.Level(8, 150e9, 6.34e-6), CLUSTER)
    assert network.ring_bandwidth_Bps(slow, 1, 16) == 150e9
    assert network.ring_bandwidth_Bps(slow, 1, 8, 2) == 100e9
    # One member per inner group: the level's own bandwidth, even above the inner one's.
    assert network.ring_bandwidth_Bps((network.Level(8, 1e9, 0.0), CLUSTER), 1, 2, 8) == 25e9


def test_three_levels_count_members_in_the_level_just_below():
    levels = (network.Level(4, 100e9, 1e-6), network.Level(32, 10e9, 2e-6), network.Level(1024, 2e9, 3e-6))
    # 64 contiguous devices on level 2: 32 inside each level-1 group -> min(32 · 2e9, 10e9).
    assert network.group_level(levels, 64)[1].bandwidth_Bps == 10e9
    # 8 members 16 apart span 128: level 2, 2 per level-1 group -> 4e9.
    assert network.group_level(levels, 8, stride=16)[1].bandwidth_Bps == 4e9
    # 8 contiguous: level 1, 4 per tray -> min(4 · 10e9, 100e9) = 40e9.
    assert network.group_level(levels, 8)[1].bandwidth_Bps == 40e9


def test_per_inner():
    cases = {(16, 1): 8, (4, 1): 4, (8, 2): 4, (8, 3): 2, (2, 8): 1, (2, 16): 1, (1, 1): 1}
    assert {gs: network.per_inner(*gs, 8) for gs in cases} == cases
    with pytest.raises(ValueError, match="stride"):
        network.per_inner(2, 0, 8)
