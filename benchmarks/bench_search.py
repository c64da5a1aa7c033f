"""The full architecture × placement search of one model, timed: what ``phazec MODEL.py`` does
with no ``--hw`` (the paper's space, HBM {32, 64, 80} GiB, micro-batch {1, 2, 4, 8}, TP
{1, 2, 4, 8}, recompute policies; 1024 devices, global batch 4096; the baselines).

    python benchmarks/bench_search.py [--model examples/llama2_7b.py] [-j 2] [--space FILE]
                                      [--cache DIR] [--seq-len N]

Targets (issue 6): under 10 minutes and 6 GB peak memory on the 2-core development machine for
Llama-2-7B (seq 4096), GPT-2 XL, BERT-large and OPT-350m, from a cold cache.  Printed: wall time
per phase, the split of time between estimation (latencies and bounds), scheduling (SCIP) and
the DP, configurations (architecture × setting) resolved per second, pruning per stage, and the
peak resident memory of this process and of its workers.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(REPO / "examples" / "llama2_7b.py"))
    p.add_argument("-j", "--jobs", type=int, default=2)
    p.add_argument("--space", default=None)
    p.add_argument("--cache", default=None, help="cache directory (default: a fresh temporary one: cold)")
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--backend", default="local")
    args = p.parse_args()

    from phaze.tools.phazec import main as phazec

    with tempfile.TemporaryDirectory() as tmp:
        cache = args.cache or str(Path(tmp, "cache"))
        out = Path(tmp, "plan.json")
        argv = [
            args.model,
            "-o",
            str(Path(tmp, "plan.mlir")),
            "--json",
            str(out),
            "-j",
            str(args.jobs),
            "--cache",
            cache,
            "--backend",
            args.backend,
            "-q",
        ]
        if args.space:
            argv += ["--space", args.space]
        if args.seq_len:
            argv += ["--seq-len", str(args.seq_len)]
        t0 = time.perf_counter()
        rc = phazec(argv)
        wall = time.perf_counter() - t0
        if rc != 0:
            sys.exit(rc)
        data = json.loads(out.read_text())
    st = data["search"]
    w = st["wall_s"]
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    print(f"model: {data['model']}  space: {st['space']}  jobs: {args.jobs}")
    print(
        f"answer: {data['accelerator']['name']}  DP {data['dp']} PP {data['pp']} TP {data['tp']} "
        f"b {data['micro_batch_size']}: {data['throughput_samples_per_s']:.6g} samples/s"
    )
    for b in data["baselines"]:
        sp = f"{b['speedup']:.3f}x" if b.get("speedup") else "-"
        print(f"  {b['name']:<14} {b['throughput_samples_per_s']:>12.6g} samples/s  speed-up {sp}")
    print(f"wall: {wall:.1f} s total; " + ", ".join(f"{k} {v:.1f} s" for k, v in w.items() if k != "total"))
    print(
        f"split: estimation {w['estimate']:.1f} s, scheduling {w['schedule']:.1f} s, "
        f"DP {w['dp_bound'] + w['dp_exact']:.1f} s (bounds {w['dp_bound']:.1f}, exact {w['dp_exact']:.1f})"
    )
    print(
        f"configurations: {st['candidates']:,} (architectures {st['architectures']:,} x settings "
        f"{st['settings']}), resolved at {st['candidates'] / max(w['search'], 1e-9):,.0f} per second of search"
    )
    print("pruned: " + ", ".join(f"{k} {v:,}" for k, v in st["pruned"].items()) + f"; exact {st['evaluated']:,}")
    print(f"solver: {st['evaluator']}")
    print(f"peak RSS: this process {own:.2f} GiB, largest worker {kids:.2f} GiB")


if __name__ == "__main__":
    main()
