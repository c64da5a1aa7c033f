"""GPT-3 175B on 64 A100s, global batch 64, micro-batch 1: Megatron-LM's published setting
against a plain one and against phaze's own plan (issue 13's check).

    python benchmarks/megatron_gpt3_175b.py      # about 7 minutes on 2 cores

1. Megatron-LM's run: TP 8, PP 8, DP 1, sequence parallelism, selective recompute, interleaved
   1F1B with 3 model chunks per device (``--placement expert:8,1,8 --sequence-parallel on
   --recompute selective --pipeline-schedule interleaved:3``);
2. the same degrees without any of it (``--sequence-parallel off --recompute full
   --pipeline-schedule 1f1b``);
3. phaze at TP 8 with everything ``auto`` (placement, SP, recompute, schedule, ZeRO).

Prints each plan's time per batch, memory and settings, and whether 2 is slower than 1 and 3 is
at least as fast as both.  Each runs ``phazec`` in a fresh process, as a user would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMON = ["--hw", "a100", "--kernels", "megatron", "--devices", "64", "--global-batch", "64", "--micro-batch", "1",
          "-q"]  # fmt: skip
RUNS = {
    "megatron": ["--placement", "expert:8,1,8", "--sequence-parallel", "on", "--recompute", "selective",
                 "--pipeline-schedule", "interleaved:3"],
    "plain": ["--placement", "expert:8,1,8", "--sequence-parallel", "off", "--recompute", "full",
              "--pipeline-schedule", "1f1b"],
    "phaze auto": ["--tp", "8", "--sequence-parallel", "auto", "--recompute", "auto", "--pipeline-schedule", "auto",
                   "--zero", "auto"],
}  # fmt: skip


def run(args: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan"
        cmd = [sys.executable, "-m", "phaze.tools.phazec", str(ROOT / "examples" / "gpt3_175b.py"), *COMMON, *args]
        r = subprocess.run(
            [*cmd, "-o", f"{out}.mlir", "--json", f"{out}.json"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            check=False,
        )
        if r.returncode != 0:
            raise SystemExit(f"phazec {' '.join(args)} failed: {r.stderr.strip()}")
        return json.loads(out.with_suffix(".json").read_text())


def main() -> None:
    plans = {name: run(args) for name, args in RUNS.items()}
    print(
        f"{'run':<11} {'DP':>3} {'PP':>3} {'TP':>3} {'SP':>4} {'v':>2} {'ZeRO':>4} {'recompute':>15} "
        f"{'s/batch':>8} {'GiB':>6}"
    )
    for name, p in plans.items():
        pols = ",".join(sorted({s["recompute"] for s in p["stages"]}))
        print(
            f"{name:<11} {p['dp']:>3} {p['pp']:>3} {p['tp']:>3} {'on' if p['sequence_parallel'] else 'off':>4} "
            f"{p['virtual_stages']:>2} {p['zero']:>4} {pols:>15} {p['time_per_batch_s']:>8.3f} "
            f"{p['max_memory_bytes'] / 2**30:>6.1f}"
        )
    t = {name: p["time_per_batch_s"] for name, p in plans.items()}
    print(f"plain slower than Megatron's setting: {t['plain'] > t['megatron']}")
    print(f"phaze auto at least as fast as both: {t['phaze auto'] <= min(t['plain'], t['megatron'])}")


if __name__ == "__main__":
    main()
