"""HSDP (``--dp-shard N``: torch's fully_shard on a 2-D mesh) and the cluster files of
``data/clusters/`` (docs/design.md §6.5, docs/validation.md)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import MODELS

from phaze.plan.plan_output import hsdp_shard
from phaze_ir.hardware import load_hardware

ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = ROOT / "data" / "clusters"


def _plan(capsys, tmp_path: Path, name: str, *flags: str) -> tuple[dict, str]:
    """``phazec`` in this process (what is checked is the plan and the refusals' words, not the
    process: a subprocess would import torch again, most of its cost): its JSON and stderr."""
    from phaze.tools import phazec

    out = tmp_path / f"{name}.json"
    capsys.readouterr()
    rc = phazec.main([
        str(MODELS / "tiny_llama_sdpa.py"), "--hw", "h100", "--devices", "16", "--global-batch", "16",
        "--micro-batch", "1", "--tp", "1", "--placement", "expert:1,16,1", "--kernels", "eager", "--json", str(out),
        "-o", str(tmp_path / f"{name}.mlir"), *flags,
    ])  # fmt: skip
    return (json.loads(out.read_text()) if rc == 0 else {}), capsys.readouterr().err


def test_hsdp_holds_more_and_says_so(capsys, tmp_path):
    """HSDP over 8 of DP 16 holds each device's shard of 8 (more memory than FSDP's of 16),
    says its shard group in the JSON and the summary, and FSDP's plan has no shard group."""
    fsdp, err = _plan(capsys, tmp_path, "fsdp", "--zero", "3")
    assert fsdp, err
    hsdp, err = _plan(capsys, tmp_path, "hsdp", "--zero", "3", "--dp-shard", "8")
    assert hsdp, err
    assert fsdp["dp_shard"] is None and hsdp["dp_shard"] == 8
    mem = lambda p: p["stages"][0]["memory"]  # noqa: E731
    assert mem(hsdp)["optimizer"] > 1.9 * mem(fsdp)["optimizer"]
    assert "HSDP (sharded over 8, 2 replicas)" in hsdp["summary"]["placement"]
    # The replicas' all-reduce is across nodes (two nodes of 8): it costs time exposed, and
    # overlapped it takes the cross-node level's SMs from the compute beside it. On this tiny,
    # latency-bound model the overlapped per-layer rings cost as much as one exposed ring.
    slow, err = _plan(capsys, tmp_path, "slow", "--zero", "3", "--dp-shard", "8", "--no-dp-overlap")
    assert slow, err
    for plan in (slow, hsdp):
        assert plan["time_per_batch_s"] > plan["breakdown_s"]["compute_s"] + plan["breakdown_s"]["optimizer_s"]


def test_hsdp_needs_zero_2_or_3_and_a_divisor_of_dp(capsys, tmp_path):
    plan, err = _plan(capsys, tmp_path, "zero1", "--zero", "1", "--dp-shard", "8")
    assert not plan
    assert err.strip().endswith("--dp-shard 8: HSDP shards as FSDP does: expected --zero 2 or 3, not 1")
    assert len(err.strip().splitlines()) == 1
    plan, err = _plan(capsys, tmp_path, "odd", "--zero", "3", "--dp-shard", "3")
    assert not plan
    assert err.strip().endswith(
        "--dp-shard 3: expected a shard group that divides the 16 ranks of DP x CP (--placement expert:1,16,1)"
    )


def test_a_plan_is_hsdp_only_where_the_shard_group_divides_dp():
    plan = {"dp": 16, "cp": 1, "zero": 3}
    assert hsdp_shard(plan, 8) == 8
    assert hsdp_shard(plan, 16) is None  # the whole group: FSDP
    assert hsdp_shard(plan, 0) is None
    assert hsdp_shard({**plan, "zero": 1}, 8) is None


@pytest.mark.parametrize(
    ("name", "chip", "nic_Bps", "uplink_Bps"),
    [
        ("aws_p4de", "a100", 10.445e9, 41.78e9),  # 4 x 100 Gb/s EFA an instance, as NCCL achieves it
        ("aws_p5", "h100", 50e9, 400e9),  # 32 x 100 Gb/s EFA an instance
        ("ibm_h100_800g", "h100", 50e9, 100e9),  # 800 Gb/s a node
    ],
)
def test_cluster_files_are_their_chip_on_their_network(name, chip, nic_Bps, uplink_Bps):
    acc = load_hardware(CLUSTERS / f"{name}.toml")
    base = load_hardware(chip)
    assert acc.name == chip  # the chip's error bands apply
    # the node level is the chip's own but for the SMs its ring collectives hold (below)
    assert replace(acc.network[0], collective_compute_share=None) == replace(
        base.network[0], collective_compute_share=None
    )
    cluster = acc.network[-1]
    assert (cluster.bandwidth_Bps, cluster.uplink_Bps) == (nic_Bps, uplink_Bps)
    assert acc.hbm == base.hbm and acc.calibration == base.calibration


@pytest.mark.parametrize(("name", "cluster_channels"), [("aws_p4de", 8), ("ibm_h100_800g", 8)])
def test_fsdp_clusters_collectives_hold_nccls_channels(name, cluster_channels):
    """NCCL 2.20.5 runs a ring collective in an 8-GPU NVSwitch node on 24 channels (6 rings,
    doubled by ncclTopoDupChannels and by ncclTopoPostset) and across nodes on 2 per NIC's ring
    (4 NICs of p4de at 12 GB/s are not doubled by ncclTopoDupChannels, IBM's 2 NICs at 48 GB/s
    are): one CTA, one SM, each, beside FSDP's compute (docs/design.md §6.5)."""
    acc = load_hardware(CLUSTERS / f"{name}.toml")
    sms = acc.calibration.wave_units
    node, cluster = acc.network[0], acc.network[-1]
    assert node.collective_compute_share == pytest.approx(24 / sms, abs=1e-4)
    assert cluster.collective_compute_share == pytest.approx(cluster_channels / sms, abs=1e-4)
