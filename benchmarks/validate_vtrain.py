"""How long ``phaze-validate`` takes on the vTrain measurements, and what it finds: the wall time,
the time per phase (trace, compile, place: seconds summed over the workers), the peak memory of
a worker, and the error summary per split.

    python benchmarks/validate_vtrain.py [RUNS.csv] [--hw a100] [-j 2] [--rows LIST] [--json FILE]

Default: ``data/vtrain/ground_truth_single.csv`` (1,440 runs on one node of 8
A100s) beside the checkout, on the ``a100`` preset, with as many workers as CPUs.  Nothing is
cached between runs: every figure is from a cold start (in-memory schedule caches only).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DEFAULT = ROOT / "data" / "vtrain" / "ground_truth_single.csv"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv", nargs="?", default=str(DEFAULT))
    p.add_argument("--hw", default="a100")
    p.add_argument("-j", "--jobs", type=int, default=max(1, len(os.sched_getaffinity(0))))
    p.add_argument("--rows", default=None, help="only these rows, e.g. '1-100'")
    p.add_argument("--json", default=None, help="also write phaze-validate's JSON here")
    p.add_argument("-v", "--verbose", action="store_true", help="show phaze-validate's progress")
    args = p.parse_args()

    from phaze import validate as v
    from phaze.outputs import write_atomically
    from phaze.tools.phaze_validate import parse_rows

    start = time.perf_counter()
    runs = v.assign_splits(v.read_runs(args.csv))
    if args.rows:
        chosen = parse_rows(args.rows, len(runs))
        runs = [r for r in runs if r.row in chosen]
    settings = v.Settings(hw=args.hw, quiet=not args.verbose)
    priced, timing = v.validate(runs, settings, args.jobs)
    wall = time.perf_counter() - start
    result = v.Validation(runs, priced, settings, args.csv, timing=timing)
    peak = max(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    )
    print(f"{args.csv}: {len(runs)} runs on {args.hw}, -j {args.jobs}")
    print(
        f"  work: {timing['traces']} traces (shape, micro-batch), {timing['compilations']} compilations "
        f"(shape, micro-batch, TP), {timing['placements']} placements"
    )
    print(f"  wall: {wall:.1f} s in all ({timing['wall_s']:.1f} s pricing)")
    busy = timing["trace_s"] + timing["compile_s"] + timing["place_s"]
    for phase in ("trace", "compile", "place"):
        s = timing[f"{phase}_s"]
        print(f"  {phase:<8} {s:8.1f} s summed over the workers ({100 * s / max(busy, 1e-9):4.1f} %)")
    print(f"  peak memory of one process: {peak / 2**20:.2f} GiB")
    print()
    print(v.report_text(result, per_run=False), end="")
    if args.json:
        write_atomically(args.json, json.dumps(result.to_json(), indent=2) + "\n")


if __name__ == "__main__":
    main()
