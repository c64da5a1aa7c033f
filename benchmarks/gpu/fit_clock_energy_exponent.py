"""What ``data/h100/power.csv`` says of ``[energy] clock_energy_exponent`` (gamma): how a GEMM's
die energy per op changes with the clock the 700 W limit leaves it.

    python benchmarks/gpu/fit_clock_energy_exponent.py [DATA_DIR]

Every GEMM of power.csv ran at the enforced 700 W, its SM clock lowered to 1,335-1,500 MHz
(``sm_clock_median_hz``).  With the h100 preset's actions and energies
(:mod:`benchmarks.gpu.fit_h100_energy`'s model) each GEMM's dynamic energy (its energy less the
idle power times its time) is fitted as ``k · die_j · (f / 1,350 MHz)^gamma + hbm_j`` (``die_j``:
its MACs', core and global buffers' joules; ``hbm_j``: its HBM bytes'), ``k`` by weighted least
squares at each gamma of a grid; printed: each GEMM's clock and measured / modelled energy, and
the fit's rms and worst relative error at each gamma.  The clocks span 12 %, so the scan bounds
gamma more than it fixes it (docs/energy.md, "The power limit").
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fit_h100_energy import DATA, actions, load  # the energy fit's model, as it prices

from phaze_ir.hardware import load_hardware

GAMMAS = np.arange(0.0, 3.01, 0.25)
REFERENCE_HZ = 1.35e9  # the 8192^3 GEMM's clock at the cap, the energy fit's anchor


def scan(data: Path = DATA) -> list[tuple[float, float, float, float]]:
    """``(gamma, k, rms, worst)`` of the fit at each gamma of :data:`GAMMAS`."""
    acc = load_hardware("h100")
    rows = load(Path(data) / "power.csv")
    (idle,) = [r for r in rows if r.kind == "idle"]
    gemms = [r for r in rows if r.kind == "gemm"]
    parts = [actions(r, acc).energy(acc) for r in gemms]
    die = np.array([p.compute_j + p.core_buffer_j + p.global_buffer_j for p in parts])
    hbm = np.array([p.hbm_j for p in parts])
    dynamic = np.array([r.energy_j - idle.power_w * r.time_s for r in gemms])
    clock = np.array([r.sm_clock_hz for r in gemms]) / REFERENCE_HZ
    for r, d, m, c in zip(gemms, dynamic, die + hbm, clock, strict=True):
        print(f"  {r.workload:26s} clock {c:.3f} x 1,350 MHz   measured / modelled energy {d / m:.3f}")
    out = []
    w = 1.0 / dynamic
    for gamma in GAMMAS:
        x = die * clock**gamma
        k = float(np.sum(w * w * x * (dynamic - hbm)) / np.sum(w * w * x * x))
        err = (k * x + hbm) / dynamic - 1
        out.append((float(gamma), k, float(np.sqrt(np.mean(err**2))), float(np.abs(err).max())))
    return out


def main() -> None:
    data = Path(sys.argv[1]) if len(sys.argv) > 1 else DATA
    for gamma, k, rms, worst in scan(data):
        print(f"gamma {gamma:4.2f}: k {k:.3f}, rms {100 * rms:.2f} %, worst {100 * worst:.2f} %")


if __name__ == "__main__":
    main()
