"""Fit the ``[energy]`` table of ``phaze_ir/hw_presets/h100.toml`` on the energy measured on one
H100 (``data/h100/power.csv``, taken by ``benchmarks/gpu/measure_power.py``; data/h100/README.md) and
print the fit, its error on each kernel, and the run-to-run spread (``power_repeat.csv``).

    python benchmarks/gpu/fit_h100_energy.py [DATA_DIR]

The model is phaze's own (``passes/algorithms/energy.py``): an op's dynamic energy is its actions
(:func:`passes.algorithms.energy.op_actions`: the MACs a GEMM's PE arrays issue, the vector-lane
operations, the bytes through a core's buffer, the global buffer and HBM, counted as the latency
model counts them on the h100 description) times the chip's energy per action; the chip adds its
static power.  Fitted:

* ``static_w_per_mm2``: the power of the GPU idle with a CUDA context (the ``idle`` row) over the
  die's area.  Every other row's *dynamic* energy is its energy less that power times its time.
* ``mac_j``, ``vector_op_j``, ``hbm_j_per_byte`` and the global buffer's (L2's) energy per byte:
  non-negative least squares on the dynamic energy of the GEMMs and memory-bound kernels, each
  row weighted by 1/its energy (relative error), with the core buffers' SRAM energy per byte
  held at the preset's published figures (a 64 KiB buffer is not separable from the L2 by
  these kernels: every byte a vector op moves passes both).

The training steps are not fitted: ``benchmarks/gpu/price_power.py`` compares them
with what phaze predicts.
"""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from passes.algorithms.energy import OpActions, op_actions, sram_j_per_byte
from passes.algorithms.latency import MatmulDesc
from passes.cost_view import vector_desc
from phaze_ir.hardware import load_hardware
from phaze_ir.ir import parse_module

ROOT = Path(__file__).resolve().parents[2]

DATA = ROOT / "data" / "h100"
BF16 = 2
#: the phaze op of each memory-bound kernel of power.csv, as the importer writes the aten op
#: (``T``: the operand type; norms and softmax over rows of 1024, their statistics in fp32)
KERNEL_IR = {
    "copy": ('phaze.elementwise "copy" %x aten "aten.copy_.default"', "(T) -> T"),
    "add": ('phaze.elementwise "add" %x, %y aten "aten.add.Tensor"', "(T, T) -> T"),
    "gelu": ('phaze.elementwise "gelu" %x aten "aten.gelu.default"', "(T) -> T"),
    "layer_norm": ('phaze.norm "layer_norm" %x normalized_rank 1', "(T) -> (T, S, S)"),
    "softmax": ('phaze.softmax "softmax" %x dim -1', "(T) -> T"),
}
#: the fitted per-action energies, in the order of the design matrix's columns
FITTED = ("mac_j", "vector_op_j", "global_buffer_j_per_byte", "hbm_j_per_byte")


@dataclass(frozen=True)
class Row:
    """One measured workload of power.csv."""

    workload: str
    kind: str
    time_s: float  # per call
    energy_j: float  # per call
    power_w: float
    sm_clock_hz: float
    capped: bool  # the power limit lowered the clocks (NVML clock-event reason 0x4)


def load(path: Path) -> list[Row]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    bad = [r["workload"] for r in rows if r["kind"].startswith("error")]
    if bad:
        raise SystemExit(f"{path}: workloads that failed on the GPU: {', '.join(bad)}")
    return [
        Row(
            r["workload"],
            r["kind"],
            float(r["time_per_call_s"]),
            float(r["energy_per_call_j"]),
            float(r["power_w"]),
            float(r["sm_clock_median_hz"]),
            bool(int(r["clock_event_reasons"], 16) & 0x4),
        )
        for r in rows
    ]


def gemm_actions(workload: str, acc) -> OpActions:
    """``gemm_MxNxK``: a bf16 ``M×K · K×N`` as phaze describes it, its actions on ``acc``."""
    m, n, k = (int(x) for x in workload.split("_", 1)[1].split("x"))
    d = MatmulDesc(
        batch=1, m=m, n=n, k=k, a_elem=BF16, b_elem=BF16, c_elem=BF16, a_bytes=m * k * BF16, b_bytes=k * n * BF16
    )
    return op_actions(d, acc)


def memory_actions(workload: str, acc) -> OpActions:
    """``OP_WHERE_ELEMENTS``: the kernel's phaze op (:data:`KERNEL_IR`), its actions on ``acc``."""
    op, where, elements = workload.rsplit("_", 2)
    rows = int(elements) // 1024
    body, signature = KERNEL_IR[op]
    types = {"T": f"tensor<{rows}x1024xbf16>", "S": f"tensor<{rows}x1xf32>"}
    signature = "".join(types.get(c, c) for c in signature)
    t = types["T"]
    results = "%r, %mean, %rstd" if op == "layer_norm" else "%r"
    text = f"func.func @k(%x: {t}, %y: {t}) {{\n  {results} = {body} : {signature}\n"
    module = parse_module(text + "  func.return\n}\n", workload)
    (func,) = module.ops
    a = op_actions(vector_desc(next(iter(func.body.ops))), acc)
    # phaze has every vector op read and write HBM (a training step's tensors are larger than
    # the L2); a kernel run on L2-resident operands moves nothing there, and measures the L2
    return replace(a, hbm_bytes=0.0) if where == "l2" else a


def actions(row: Row, acc) -> OpActions:
    return gemm_actions(row.workload, acc) if row.kind == "gemm" else memory_actions(row.workload, acc)


@dataclass(frozen=True)
class EnergyFit:
    static_w: float  # the idle power
    static_w_per_mm2: float
    core_buffer_j_per_byte: float  # held at the preset's (published) figure
    values: dict[str, float]  # FITTED -> J per action
    rows: list[Row]  # the fitted rows
    predicted_j: np.ndarray  # per call, static included
    measured_j: np.ndarray


def _columns(a: OpActions) -> list[float]:
    return [a.macs, a.vector_ops, a.global_buffer_bytes, a.hbm_bytes]


def fit(data: Path = DATA, acc=None) -> EnergyFit:
    acc = acc or load_hardware("h100")
    rows = load(Path(data) / "power.csv")
    (idle,) = [r for r in rows if r.kind == "idle"]
    static_w = idle.power_w
    fitted = [r for r in rows if r.kind == "gemm" or r.kind.startswith("memory")]
    acts = [actions(r, acc) for r in fitted]
    x = np.array([_columns(a) for a in acts])
    # the core buffers at the preset's SRAM figure; the accumulators are registers (0 J/B)
    fixed = np.array([a.energy(acc).core_buffer_j for a in acts])
    measured = np.array([r.energy_j for r in fitted])
    dynamic = measured - static_w * np.array([r.time_s for r in fitted]) - fixed
    w = 1.0 / measured
    coef, _ = nnls(x * w[:, None], dynamic * w)
    predicted = x @ coef + fixed + static_w * np.array([r.time_s for r in fitted])
    return EnergyFit(
        static_w=static_w,
        static_w_per_mm2=static_w / acc.area_mm2,
        core_buffer_j_per_byte=sram_j_per_byte(acc.energy.sram_j_per_byte, acc.tensor_cores.buffer_bytes),
        values=dict(zip(FITTED, coef.tolist(), strict=True)),
        rows=fitted,
        predicted_j=predicted,
        measured_j=measured,
    )


def spread(data: Path = DATA) -> list[tuple[str, float, float]]:
    """(workload, power.csv's energy per call, power_repeat.csv's) of the workloads both hold."""
    again = {r.workload: r for r in load(Path(data) / "power_repeat.csv")}
    return [
        (r.workload, r.energy_j, again[r.workload].energy_j)
        for r in load(Path(data) / "power.csv")
        if r.workload in again
    ]


def toml_table(f: EnergyFit, acc) -> str:
    v = f.values
    table = dict(acc.energy.sram_j_per_byte)
    table[acc.global_buffer.bytes] = v["global_buffer_j_per_byte"]
    sram = ", ".join(f"{size} = {j:.4g}" for size, j in sorted(table.items()))
    return "\n".join(
        [
            "[energy]",
            f"mac_j = {v['mac_j']:.4g}",
            f"vector_op_j = {v['vector_op_j']:.4g}",
            f"sram_j_per_byte = {{ {sram} }}",
            f"hbm_j_per_byte = {v['hbm_j_per_byte']:.4g}",
            f"static_w_per_mm2 = {f.static_w_per_mm2:.4g}",
            "accumulator_j_per_byte = 0.0",
        ]
    )


def report(data: Path = DATA) -> str:
    acc = load_hardware("h100")
    f = fit(data, acc)
    env = json.loads((Path(data) / "power_environment.json").read_text())
    v = f.values
    out = [
        f"{Path(data).name}/power.csv: {env['gpu']}, power limit {env['power_limit_w']:.0f} W, "
        f"torch {env['torch']}, {env['date_utc']}",
        f"idle (CUDA context, no work): {f.static_w:.1f} W = {f.static_w_per_mm2:.4f} W/mm^2 "
        f"over {acc.area_mm2:g} mm^2",
        f"core buffers (held, the preset's SRAM table at {acc.tensor_cores.buffer_bytes} B): "
        f"{f.core_buffer_j_per_byte * 1e12:.3f} pJ/B",
        "fitted (non-negative least squares, relative):",
        f"  mac_j                    {v['mac_j'] * 1e12:8.3f} pJ  ({v['mac_j'] / 2 * 1e12:.3f} pJ/FLOP)",
        f"  vector_op_j              {v['vector_op_j'] * 1e12:8.3f} pJ",
        f"  L2 (global buffer)       {v['global_buffer_j_per_byte'] * 1e12:8.3f} pJ/B",
        f"  hbm_j_per_byte           {v['hbm_j_per_byte'] * 1e12:8.3f} pJ/B "
        f"({v['hbm_j_per_byte'] * 1e12 / 8:.2f} pJ/bit)",
        "",
        f"  {'workload':<26} {'W':>6} {'SM MHz':>7} {'capped':>6} {'J/call':>10} {'phaze':>10} {'error':>7}",
    ]
    for r, p, m in zip(f.rows, f.predicted_j, f.measured_j, strict=True):
        out.append(
            f"  {r.workload:<26} {r.power_w:6.1f} {r.sm_clock_hz / 1e6:7.0f} {'yes' if r.capped else 'no':>6}"
            f" {m:10.4g} {p:10.4g} {100 * (p / m - 1):+6.1f}%"
        )
    err = np.abs(f.predicted_j / f.measured_j - 1)
    out.append(f"  |error| of the energy per call: median {100 * np.median(err):.1f} %, max {100 * err.max():.1f} %")
    out += ["", "run to run (power.csv vs power_repeat.csv, another H100 machine the same day):"]
    s = [(w, a, b) for w, a, b in spread(data)]
    d = np.array([abs(a / b - 1) for _, a, b in s])
    worst = max(s, key=lambda t: abs(t[1] / t[2] - 1))
    out.append(
        f"  {len(s)} workloads, energy per call differs by median {100 * np.median(d):.1f} %, "
        f"max {100 * d.max():.1f} % ({worst[0]})"
    )
    out += ["", "the table (phaze_ir/hw_presets/h100.toml):", toml_table(f, acc)]
    return "\n".join(out)


def main() -> None:
    print(report(Path(sys.argv[1]) if len(sys.argv) > 1 else DATA))


if __name__ == "__main__":
    main()
