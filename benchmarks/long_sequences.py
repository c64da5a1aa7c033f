"""Long sequences on H100s (issue 45 item 4): Llama 3 8B at 128k tokens and Llama 3 70B at 32k,
each on 64 and on 512 GPUs, with context parallelism searched (``--context-parallel auto``: CP 1
and the powers of two that leave at least 4096 tokens a device, all with SDPA), Megatron-LM's
fused kernels, sequence parallelism, and recompute and ZeRO ``auto``.

    python benchmarks/long_sequences.py              # all four, about 30 minutes on 2 cores
    python benchmarks/long_sequences.py --only 8b-64  # one case

Prints, per case, the plan (DP x CP x PP x TP, ZeRO, recompute), its time per batch by part, its
memory per device by part, tokens/s, MFU (causal attention as computed; also in PaLM's
convention, its whole square) and HFU, or the constraint that binds when nothing fits; and the
best point without CP (CP 1), or why none fits.
Each runs ``phazec`` in a fresh process, as a user would; the compiled points are kept in a
cache under the temporary directory of one run of this script only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = {
    # name: (model file, sequence length, devices, global batch)
    "8b-64": ("examples/llama3_8b.py", 131072, 64, 64),
    "8b-512": ("examples/llama3_8b.py", 131072, 512, 512),
    "70b-64": ("examples/llama3_70b.py", 32768, 64, 64),
    "70b-512": ("examples/llama3_70b.py", 32768, 512, 256),
}
COMMON = ["--hw", "h100", "--kernels", "megatron", "--micro-batch", "1", "--recompute", "auto", "--zero", "auto",
          "--sequence-parallel", "on", "--context-parallel", "auto", "-q"]  # fmt: skip


def run(model: str, seq: int, devices: int, batch: int, cache: str) -> dict:
    """The plan JSON of one phazec run (its ``binding`` says why when nothing fits)."""
    out = Path(cache) / f"plan-{Path(model).stem}-{devices}.json"
    cmd = [sys.executable, "-m", "phaze.tools.phazec", str(ROOT / model), *COMMON, "--seq-len", str(seq),
           "--devices", str(devices), "--global-batch", str(batch), "--json", str(out), "--write-infeasible",
           "--cache", cache]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode not in (0, 1) or not out.exists():
        raise SystemExit(f"phazec failed ({r.returncode}): {r.stderr.strip()[-2000:]}")
    return json.loads(out.read_text())


def describe(name: str, plan: dict) -> list[str]:
    head = f"{name}: "
    if not plan["feasible"]:
        return [head + f"does not fit: {plan['binding']}"]
    s = plan["summary"]
    parts = ", ".join(f"{k.removesuffix('_s')} {v:.3g}" for k, v in plan["breakdown_s"].items() if v > 0)
    memory = ", ".join(f"{k} {v / 1e9:.3g}" for k, v in s["memory_bytes"].items())
    return [
        head + s["placement"],
        f"  {plan['time_per_batch_s']:.4g} s a batch ({parts}); {s['tokens_per_s']:,.0f} tokens/s,"
        + f" MFU {s['mfu_causal']:.1%}"
        + f" ({s['mfu_palm']:.1%} in PaLM's convention, causal attention's whole square)"
        + f", HFU {s['hfu']:.1%}",
        f"  memory {plan['max_memory_bytes'] / 1e9:.3g} GB a device of {s['hbm_bytes'] / 1e9:.3g} ({memory})",
        "  " + without_cp(plan),
    ]


def without_cp(plan: dict) -> str:
    """The best point of the sweep at CP 1, against the plan, or why none fits."""
    points = [c for c in plan["candidates"] if c["cp"] == 1]
    best = max(points, key=lambda c: c["throughput_samples_per_s"], default=None)
    if best is None:
        return "without CP: no point (the sweep tried none)"
    if best["throughput_samples_per_s"] <= 0:
        return f"without CP: nothing fits ({best['note'][:160]})"
    share = best["throughput_samples_per_s"] / plan["throughput_samples_per_s"]
    return f"without CP: {share:.0%} of the plan's samples/s (TP {best['tp']})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(CASES), help="run one case")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        for name, (model, seq, devices, batch) in CASES.items():
            if args.only and name != args.only:
                continue
            plan = run(model, seq, devices, batch, cache)
            for line in describe(f"{Path(model).stem} at {seq} tokens on {devices} H100s", plan):
                print(line, flush=True)


if __name__ == "__main__":
    main()
