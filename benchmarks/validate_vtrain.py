"""How long ``phaze-validate`` takes on the vTrain measurements, and what it finds: the wall time,
the time per phase (trace, compile, place: seconds summed over the workers), the peak memory of
a worker, and the error summary per split, for each runtime's kernels asked for.

    python benchmarks/validate_vtrain.py [RUNS.csv ...] [--hw a100] [--kernels ops[,megatron,...]]
                                         [-j 2] [--rows LIST] [--json FILE]

Default: ``data/vtrain/ground_truth_single.csv`` (1,440 runs on one node of 8
A100s) beside the checkout, on the ``a100`` preset, priced as ``phaze-validate`` prices them by
default, every op its own kernel (the preset's calibration is that fit; ``--kernels megatron``
prices them as Megatron-DeepSpeed ran them, as ``phaze-validate --kernels``), with as many
workers as CPUs.  Several runtimes (``--kernels ops,megatron``) price every run as each,
in one validation (each run shape traced once, compiled once per runtime), and the end is a
Markdown table of the figures per file, runtime and part (docs/validation.md's).  Nothing is
cached between runs: every figure is from a cold start (in-memory schedule caches only).
"""

from __future__ import annotations

import argparse
import dataclasses
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
    from phaze import validate as v

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv", nargs="*", default=[str(DEFAULT)])
    p.add_argument("--hw", default="a100")
    p.add_argument(
        "--kernels",
        default="ops",
        metavar="LIST",
        help="the runtimes whose kernels price the runs, comma-separated, of "
        f"{', '.join(v.KERNELS)} (default ops, the a100 preset's fit; megatron: as the vTrain runs ran)",
    )
    p.add_argument("-j", "--jobs", type=int, default=max(1, len(os.sched_getaffinity(0))))
    p.add_argument("--rows", default=None, help="only these rows, e.g. '1-100'")
    p.add_argument("--json", default=None, help="also write phaze-validate's JSON here (one file and runtime)")
    p.add_argument("-v", "--verbose", action="store_true", help="show phaze-validate's progress")
    args = p.parse_args()
    runtimes = list(dict.fromkeys(k.strip() for k in args.kernels.split(",")))
    if bad := [k for k in runtimes if k not in v.KERNELS]:
        p.error(f"--kernels {args.kernels}: {bad[0]!r} is not one of {', '.join(v.KERNELS)}")
    if args.json and (len(runtimes) > 1 or len(args.csv) > 1):
        p.error("--json writes one file's validation as one runtime")

    table = []
    for path in args.csv:
        for runtime, result in validate_file(v, path, runtimes, args):
            table.append((path, runtime, result))
            if args.json:
                from phaze.outputs import write_atomically

                write_atomically(args.json, json.dumps(result.to_json(), indent=2) + "\n")
    if len(table) > 1:
        print("| file | kernels | part | runs | median \\|error\\| | p90 \\|error\\| | mean error |")
        print("|---|---|---|---|---|---|---|")
        for path, runtime, result in table:
            for part in ("dev", "holdout"):
                m = result.summary(part)
                if m["priced"]:
                    print(
                        f"| `{os.path.basename(path)}` | {runtime} | {part} | {m['priced']} | "
                        f"{100 * m['median_abs_error']:.1f} % | {100 * m['p90_abs_error']:.1f} % | "
                        f"{100 * m['mean_error']:+.1f} % |"
                    )


def validate_file(v, path: str, runtimes: list[str], args: argparse.Namespace) -> list:
    """Price the runs of ``path`` as each runtime's kernels in one validation, print what it took
    and each runtime's summary; ``(runtime, Validation)`` per runtime."""
    from phaze.tools.phaze_validate import parse_rows

    start = time.perf_counter()
    runs = v.assign_splits(v.read_runs(path))
    if args.rows:
        chosen = parse_rows(args.rows, len(runs))
        runs = [r for r in runs if r.row in chosen]
    # Each runtime's copy of a run under a row of its own: one validation shares the traces.
    offset = max(r.row for r in runs) + 1
    every = [dataclasses.replace(r, row=r.row + k * offset, kernels=rt) for k, rt in enumerate(runtimes) for r in runs]
    settings = v.Settings(v.pricing_options(args.hw, kernels=runtimes[0]), quiet=not args.verbose)
    priced, timing = v.validate(every, settings, args.jobs)
    wall = time.perf_counter() - start
    peak = max(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    )
    print(f"{path}: {len(runs)} runs on {args.hw}, {' and '.join(runtimes)} kernels, -j {args.jobs}")
    print(
        f"  work: {timing['traces']} traces (shape, micro-batch), {timing['compilations']} compilations "
        f"(shape, micro-batch, TP, kernels), {timing['placements']} placements"
    )
    print(f"  wall: {wall:.1f} s in all ({timing['wall_s']:.1f} s pricing)")
    busy = timing["trace_s"] + timing["compile_s"] + timing["place_s"]
    for phase in ("trace", "compile", "place"):
        s = timing[f"{phase}_s"]
        print(f"  {phase:<8} {s:8.1f} s summed over the workers ({100 * s / max(busy, 1e-9):4.1f} %)")
    print(f"  peak memory of one process: {peak / 2**20:.2f} GiB")
    out = []
    for k, runtime in enumerate(runtimes):
        mine = {r.row: dataclasses.replace(priced[r.row + k * offset], row=r.row) for r in runs}
        priced_as = dataclasses.replace(settings, options=dataclasses.replace(settings.options, kernels=runtime))
        result = v.Validation(runs, mine, priced_as, path, timing=timing)
        print(f"\n{runtime} kernels:")
        print(v.report_text(result, per_run=False), end="")
        out.append((runtime, result))
    print()
    return out


if __name__ == "__main__":
    main()
