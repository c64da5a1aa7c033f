"""Time and peak memory of `phazec MODEL --emit training` (trace, import, training passes,
print) on the large examples; each model runs in a fresh process so its peak is its own.

    python benchmarks/bench_frontend.py [model ...]    # default: llama2_7b gpt3_175b
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(model: str) -> tuple[float, float, int]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "t.mlir"
        start = time.perf_counter()
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "phaze.tools.phazec",
                str(ROOT / "examples" / f"{model}.py"),
                "--emit",
                "training",
                "-o",
                str(out),
                "-q",
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - start
        if r.returncode != 0:
            sys.exit(f"{model}: phazec failed: {r.stderr.strip()}")
        # ru_maxrss of children is the largest child so far: run each model in this loop order.
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        return wall, max(peak_kib, before) / 2**20, out.stat().st_size


def main() -> None:
    models = sys.argv[1:] or ["llama2_7b", "gpt3_175b"]
    print(f"{'model':<12} {'wall s':>8} {'peak GiB':>9} {'output MB':>10}   (targets: < 60 s, < 3 GB)")
    for m in models:
        wall, peak, size = run(m)
        print(f"{m:<12} {wall:>8.1f} {peak:>9.2f} {size / 1e6:>10.1f}")


if __name__ == "__main__":
    main()
