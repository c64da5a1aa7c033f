"""Fit the A100 node level (NVLink/NVSwitch) on vTrain's measured NCCL all-reduce times and
print the fit, the preset's constants and the error of each per GPU count and message size.

    python benchmarks/fit_nccl_a100.py [--data data/vtrain/nccl_allreduce_a100]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from passes.algorithms.network import Level
from phaze.calibration.nccl_fit import fit_level, load_nccl_tables, relative_errors
from phaze_ir.hardware import load_hardware

ROOT = Path(__file__).resolve().parents[1]


def summary(name: str, errors: np.ndarray) -> str:
    a = np.abs(errors)
    return (
        f"{name:<28} median |err| {100 * np.median(a):5.1f} %  p90 {100 * np.percentile(a, 90):5.1f} %  "
        f"max {100 * a.max():5.1f} %  mean signed {100 * errors.mean():+5.1f} %"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(ROOT / "data" / "vtrain" / "nccl_allreduce_a100"))
    args = p.parse_args()
    data = load_nccl_tables(args.data)
    fit = fit_level(data)
    node = load_hardware("a100").network[0]
    preset = Level(node.group_size, node.bandwidth_Bps, node.latency_s)
    fitted = Level(node.group_size, fit.bandwidth_Bps, fit.latency_s)
    print(f"{len(data)} measurements, 2-8 GPUs, 1 MiB - 1 GiB")
    print(f"fit:    bandwidth_Bps = {fit.bandwidth_Bps:.4g}, latency_s = {fit.latency_s:.4g}")
    print(f"preset: bandwidth_Bps = {preset.bandwidth_Bps:.4g}, latency_s = {preset.latency_s:.4g}")
    print(summary("preset a100 node level", relative_errors(data, preset)))
    print(summary("fit", relative_errors(data, fitted)))
    sizes = (2**20, 2**24, 2**27, 2**30)
    print("\nsigned error of the preset, by GPUs (rows) and message size (columns):")
    print("GPUs " + "".join(f"{s >> 20:>10} MiB" for s in sizes))
    errs = relative_errors(data, preset)
    for g in sorted({d.devices for d in data}):
        cells = []
        for s in sizes:
            k = [i for i, d in enumerate(data) if d.devices == g and d.nbytes == s]
            cells.append(f"{100 * errs[k[0]]:>+13.1f}%" if k else " " * 14)
        print(f"{g:>4} " + "".join(cells))


if __name__ == "__main__":
    main()
