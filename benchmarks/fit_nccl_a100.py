"""Fit the A100 node level (NVLink/NVSwitch) on vTrain's measured NCCL all-reduce times and
print the fits, the presets' constants and their bus-bandwidth errors per GPU count and
message size; then the h100 preset's node against NCCL's published figures for 8 H100s
(``data/published/nccl_h100.csv``) and its bus bandwidth from 1 MiB to 1 GiB.

    python benchmarks/fit_nccl_a100.py [--data data/vtrain/nccl_allreduce_a100]

Two descriptions of the same node: one ring for every size (``fit_level``: the ``a100`` node
level's own bandwidth and latency, which price point-to-point transfers and cap the rails) and
the two protocols of its ``[[network.protocols]]``, the faster taken (``fit_protocols``;
docs/design.md §5.5), which price its ring collectives.  The
error is nccl-tests' bus bandwidth's, ``busbw = algbw · 2(g−1)/g``: predicted over measured,
minus 1 (= measured time over predicted time, minus 1).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np

from passes.algorithms.network import collective_s, levels_of
from phaze.calibration.nccl_fit import (
    Measurement,
    busbw_errors,
    fit_level,
    fit_protocols,
    load_nccl_tables,
    load_published,
    published_busbw_error,
)
from phaze_ir.hardware import load_hardware

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20
#: Message-size ranges of the error table, [low, high) in MiB.
RANGES = ((1, 8), (8, 64), (64, 1025), (1, 1025))


def summary(name: str, errors: np.ndarray) -> str:
    a = np.abs(errors)
    return (
        f"{name:<34} median |err| {100 * np.median(a):5.1f} %  p90 {100 * np.percentile(a, 90):5.1f} %  "
        f"max {100 * a.max():5.1f} %  over 15 %: {int((a > 0.15).sum())} of {a.size}"
    )


def table(data: list[Measurement], errors: np.ndarray) -> None:
    """|busbw error| median / p90 / max per GPU count and size range."""
    print("GPUs " + "".join(f"{f'{lo}-{hi - 1} MiB':>22}" for lo, hi in RANGES))
    g = np.array([d.devices for d in data])
    n = np.array([d.nbytes for d in data])
    a = np.abs(errors)
    for devices in sorted(set(g.tolist())):
        cells = []
        for lo, hi in RANGES:
            k = (g == devices) & (n >= lo * MiB) & (n < hi * MiB)
            cells.append(f"{100 * np.median(a[k]):6.1f}/{100 * np.percentile(a[k], 90):5.1f}/{100 * a[k].max():5.1f}")
        print(f"{devices:>4} " + "".join(f"{c:>22}" for c in cells))
    print("     (median / p90 / max |error| in %)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(ROOT / "data" / "vtrain" / "nccl_allreduce_a100"))
    args = p.parse_args()
    data = load_nccl_tables(args.data)
    print(f"{len(data)} measurements, 2-8 GPUs, 1 MiB - 1 GiB")

    fit = fit_level(data)
    node = load_hardware("a100").network[0]
    print("\none ring (a100's node level, bandwidth_Bps and latency_s):")
    print(f"  fit:    bandwidth_Bps = {fit.bandwidth_Bps:.4g}, latency_s = {fit.latency_s:.4g}")
    print(f"  preset: bandwidth_Bps = {node.bandwidth_Bps:.4g}, latency_s = {node.latency_s:.4g}")

    print("\nprotocols (a100's node level; the faster of the two):")
    fits = fit_protocols(data)
    a100 = load_hardware("a100")
    preset = a100.network[0].protocols or ()
    for f, q in zip(fits, preset, strict=True):
        print(
            f"  fit    {q.name:<7} base_s = {f.base_s:.4g}, latency_s = {f.latency_s:.4g}, "
            f"bandwidth_Bps = {f.bandwidth_Bps:.4g}, shard_Bps = {f.shard_Bps:.4g} "
            f"(the faster for {f.measurements})"
        )
        print(
            f"  preset {q.name:<7} base_s = {q.base_s:.4g}, latency_s = {q.latency_s:.4g}, "
            f"bandwidth_Bps = {q.bandwidth_Bps:.4g}, shard_Bps = {q.shard_Bps:.4g}"
        )

    print("\nbus bandwidth error, predicted over measured:")
    one_ring = (dataclasses.replace(a100.network[0], protocols=None), *a100.network[1:])
    errors = {
        "one ring": busbw_errors(data, list(levels_of(one_ring))),
        "a100 (protocols)": busbw_errors(data, list(levels_of(a100.network))),
    }
    for name, e in errors.items():
        print(summary(f"preset {name}", e))
    for name, e in errors.items():
        print(f"\n{name}:")
        table(data, e)
    worst = np.argsort(-np.abs(errors["a100 (protocols)"]))[:12]
    print("\na100's largest errors (GPUs, MiB, measured busbw GB/s, error):")
    for i in sorted(worst.tolist(), key=lambda i: (data[i].devices, data[i].nbytes)):
        d = data[i]
        busbw = d.nbytes / d.time_s * 2 * (d.devices - 1) / d.devices
        print(f"  {d.devices} {d.nbytes // MiB:>5} {busbw / 1e9:7.1f} {100 * errors['a100 (protocols)'][i]:+6.1f} %")
    h100_node()


def h100_node() -> None:
    """The h100 preset's node level (its NVLS and ring protocols) and the line rate as one ring,
    against the published figures, then its predicted bus bandwidth by size on 8 GPUs."""
    h100 = load_hardware("h100")
    now = list(levels_of(h100.network))
    one_ring = list(levels_of((dataclasses.replace(h100.network[0], protocols=None), *h100.network[1:])))
    print("\nh100's node against NCCL's published bus bandwidth (data/published/nccl_h100.csv):")
    for r in load_published(ROOT / "data" / "published" / "nccl_h100.csv"):
        print(
            f"  {r.devices} GPUs {r.collective:<15} ({r.algorithm}) {r.nbytes // MiB:>5} MiB: published "
            f"{r.busbw_Bps / 1e9:5.0f} GB/s, h100 {100 * published_busbw_error(r, now):+5.1f} %, "
            f"one ring at the line rate {100 * published_busbw_error(r, one_ring):+5.1f} %"
        )
    print("h100's predicted bus bandwidth on 8 GPUs (GB/s; no published sweep to compare):")
    print("    MiB  all_reduce  all_gather")
    for mib in (1, 4, 16, 64, 256, 1024):
        n = float(mib * MiB)
        ar, _ = collective_s("all_reduce", n, 8, now)
        ag, _ = collective_s("all_gather", n, 8, now)
        print(f"  {mib:>5} {2 * 7 / 8 * n / ar / 1e9:11.1f} {7 / 8 * n / ag / 1e9:11.1f}")


if __name__ == "__main__":
    main()
