"""phaze's predicted energy and power of the single-GPU training steps whose energy was measured on
one H100 (``data/h100/power.csv``'s ``train_step`` rows, ``benchmarks/gpu/measure_power.py``), against the
measurements: the validation of the h100 preset's ``[energy]`` table, which is fitted on kernels
only (``benchmarks/gpu/fit_h100_energy.py``), never on these steps.

    python benchmarks/gpu/price_power.py [--csv data/h100/power.csv] [--hw h100] [--json FILE]

Each step is priced as ``phazec MODEL.py --hw h100 --placement expert:1,1,1 --devices 1
--global-batch B --micro-batch B --recompute none --dtype bfloat16`` (one GPU, one micro-batch):
the plan's ``power`` record gives the step's energy (``step_energy_j``: every op once, the
optimizer once) and the chip's power (that energy over the plan's time per batch, plus static).
Printed per step: measured and predicted seconds, joules and watts, and their errors; the
predicted energy split into static (static power x the predicted time) and dynamic, against the
measured dynamic energy (the measured less the idle power x the measured time).  The measured
step is torch AMP (fp32 weights cast to bf16 for each GEMM, softmax, norms and the loss in
fp32, fused AdamW); phaze prices a bf16 step (data/h100/README.md, price_train_step.py).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from price_train_step import MODEL_FILES  # the model file of each model name (this script's folder)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def measured_steps(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    (idle,) = [r for r in rows if r["kind"] == "idle"]
    out = []
    for r in rows:
        if r["kind"] != "train_step":
            continue
        model = r["workload"].removeprefix("step_").rsplit("_b", 1)[0]
        step_s, energy_j = float(r["time_per_call_s"]), float(r["energy_per_call_j"])
        out.append(
            {
                "model": model,
                "micro_batch": int(r["micro_batch"]),
                "step_s": step_s,
                "energy_j": energy_j,
                "power_w": float(r["power_w"]),
                "dynamic_j": energy_j - float(idle["power_w"]) * step_s,
            }
        )
    return out


def predict(model: str, micro_batch: int, hw: str, tmp: Path) -> dict:
    out = tmp / "plan.json"
    cmd = [sys.executable, "-m", "phaze.tools.phazec", str(MODEL_FILES[model]), "--hw", hw, "--devices", "1"]
    cmd += ["--placement", "expert:1,1,1", "--global-batch", str(micro_batch), "--micro-batch", str(micro_batch)]
    cmd += ["--recompute", "none", "--dtype", "bfloat16", "--json", str(out), "-o", str(tmp / "plan.mlir"), "-q"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr}")
    plan = json.loads(out.read_text())
    power = plan["power"]
    if power is None:
        raise SystemExit(f"hardware {hw!r} has no [energy] table: its plans have no power")
    step_s = float(plan["time_per_batch_s"])
    static_j = power["static_power_w"] * step_s
    return {
        "step_s": step_s,
        "energy_j": power["step_energy_j"],
        "power_w": power["chip_power_w"],
        "dynamic_j": power["step_energy_j"] - static_j,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", default=str(ROOT / "data" / "h100" / "power.csv"))
    p.add_argument("--hw", default="h100")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for m in measured_steps(Path(args.csv)):
            print(f"pricing {m['model']} b={m['micro_batch']} ...", file=sys.stderr, flush=True)
            rows.append({"measured": m, "predicted": predict(m["model"], m["micro_batch"], args.hw, Path(tmp))})

    def err(r: dict, key: str) -> float:
        return r["predicted"][key] / r["measured"][key] - 1

    print(f"{'step':<18}{'s meas':>8}{'pred':>8}{'err':>7}  {'J meas':>7}{'pred':>7}{'err':>7}", end="")
    print(f"  {'dyn J':>6}{'pred':>7}{'err':>7}  {'W meas':>7}{'pred':>7}{'err':>7}")
    for r in rows:
        m, q = r["measured"], r["predicted"]
        print(
            f"{m['model'] + ' b' + str(m['micro_batch']):<18}{m['step_s']:8.4f}{q['step_s']:8.4f}"
            f"{100 * err(r, 'step_s'):+6.1f}%  {m['energy_j']:7.1f}{q['energy_j']:7.1f}"
            f"{100 * err(r, 'energy_j'):+6.1f}%"
            f"  {m['dynamic_j']:6.1f}{q['dynamic_j']:7.1f}{100 * err(r, 'dynamic_j'):+6.1f}%"
            f"  {m['power_w']:7.1f}{q['power_w']:7.1f}{100 * err(r, 'power_w'):+6.1f}%"
        )
    for key, name in (
        ("step_s", "time"),
        ("energy_j", "energy"),
        ("dynamic_j", "dynamic energy"),
        ("power_w", "power"),
    ):
        e = np.array([err(r, key) for r in rows])
        print(f"{name:<15} median |error| {100 * np.median(np.abs(e)):5.1f} %, mean signed {100 * e.mean():+6.1f} %")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
