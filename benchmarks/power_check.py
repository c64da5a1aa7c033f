"""Predicted chip power against published power: every hardware preset with an ``[energy]``
table and a published ``power_w``, on a GEMM-bound training step and on a transformer's.

    python benchmarks/power_check.py [--hw a100 tpuv4] [--json FILE]

Each workload is compiled with ``phazec --hw CHIP`` on one device: ``benchmarks/models/wide_mlp.py``
at micro-batch 8192, 8 micro-batches per step (GEMMs are ~97 % of the A100's time; one
micro-batch per step would leave the optimizer step, memory-bound, up to a fifth of it, which
the time per batch counts: not a GEMM-bound step) and GPT-2 XL at micro-batch 8, one per step
(about half of its time in memory-bound vector ops on the A100).  Printed per chip and
workload: the predicted chip power
(``phaze.power``'s ``chip_power_w``), the published figure (the preset's ``power_w``: the A100
SXM4's 400 W TDP, at which a GEMM-bound A100 runs power-limited; the TPUv4's measured 192 W
maximum, chip and HBM), their difference, the share of the step's time in tensor-core ops,
and where the dynamic power goes (compute, core buffers, global buffer, HBM), from the ops'
``phaze.energy`` records (each forward and backward op once per micro-batch, each optimizer op
once: recomputation and the sharding of the optimizer are in the predicted power, not in the
parts).

The check of issue 16: on the GEMM-bound step, within 20 % of the published figure (also a
test: ``tests/test_energy.py::test_gemm_bound_power_is_within_20_percent_of_published``).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: Each workload's model, micro-batch size and micro-batches per step.
WORKLOADS = {
    "wide-mlp (GEMM-bound)": (REPO / "benchmarks" / "models" / "wide_mlp.py", 8192, 8),
    "gpt2-xl": (REPO / "examples" / "gpt2_xl.py", 8, 1),
}
PARTS = ("compute_j", "core_buffer_j", "global_buffer_j", "hbm_j")


def price(model: Path, micro_batch: int, micro_batches: int, hw: str, tmp: Path) -> dict:
    """The plan JSON of ``model`` on one ``hw`` chip at ``micro_batch``, ``micro_batches`` of
    them per step, with the dynamic power by part (the ops' ``phaze.energy`` over the step's
    time)."""
    out, ir = tmp / "plan.json", tmp / "plan.mlir"
    cmd = [sys.executable, "-m", "phaze.tools.phazec", str(model), "--hw", hw, "--devices", "1"]
    cmd += ["--global-batch", str(micro_batch * micro_batches), "--micro-batch", str(micro_batch), "--tp", "1"]
    cmd += ["--json", str(out), "-o", str(ir), "-q"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr}")
    plan = json.loads(out.read_text())
    text = ir.read_text()
    parts = dict.fromkeys(PARTS, 0.0)
    busy: dict[str, float] = {}
    for line in text.splitlines():
        times = 1 if 'phaze.phase = "opt"' in line else micro_batches  # the optimizer once a step
        record = re.search(r"#phaze\.energy<([^>]*)>", line)
        if record is not None:
            for field in record.group(1).split(", "):
                key, value = field.split(" = ")
                if key in parts:
                    parts[key] += times * float(value)
        lat = re.search(r"split_s = ([^,]*), unit = (\w+)", line)
        if lat is not None:
            busy[lat.group(2)] = busy.get(lat.group(2), 0.0) + times * float(lat.group(1))
    plan["dynamic_w_by_part"] = {k: v / plan["time_per_batch_s"] for k, v in parts.items()}
    plan["tensor_time_share"] = busy.get("tensor", 0.0) / max(sum(busy.values()), 1e-30)
    return plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hw", nargs="+", default=["a100", "tpuv4", "h100"], help="presets (default: a100 tpuv4 h100)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="phaze-power-") as tmp:
        for hw in args.hw:
            for name, (model, b, m) in WORKLOADS.items():
                plan = price(model, b, m, hw, Path(tmp))
                power = plan["power"]
                published = power["published_power_w"]
                rows.append(
                    {
                        "hw": hw,
                        "workload": name,
                        "predicted_w": power["chip_power_w"],
                        "published_w": published,
                        "error": power["chip_power_w"] / published - 1.0,
                        "static_w": power["static_power_w"],
                        "tensor_time_share": plan["tensor_time_share"],
                        "dynamic_w_by_part": plan["dynamic_w_by_part"],
                    }
                )
    head = f"{'chip':<7}{'workload':<24}{'predicted W':>12}{'published W':>12}{'error':>8}{'GEMM time':>10}"
    print(head + "  dynamic W by part")
    for r in rows:
        parts = ", ".join(f"{k.removesuffix('_j')} {v:.0f}" for k, v in r["dynamic_w_by_part"].items())
        print(
            f"{r['hw']:<7}{r['workload']:<24}{r['predicted_w']:>12.1f}{r['published_w']:>12.0f}"
            f"{r['error']:>+8.1%}{r['tensor_time_share']:>10.0%}  {parts}, static {r['static_w']:.0f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
