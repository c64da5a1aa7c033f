"""The full architecture × placement search of one model, timed: what ``phazec MODEL.py`` does
with no ``--hw`` (the paper's space, HBM {32, 64, 80} GiB, micro-batch {1, 2, 4, 8}, TP
{1, 2, 4, 8}, recompute policies; 1024 devices, global batch 4096; the baselines).

    python benchmarks/bench_search.py [--model examples/llama2_7b.py] [-j 2] [--space FILE]
                                      [--cache DIR] [--seq-len N] [--no-warm]
                                      [--dims paper|practice|both]

Targets (issue 6): under 10 minutes and 6 GB peak memory on the 2-core development machine for
Llama-2-7B (seq 4096), GPT-2 XL, BERT-large and OPT-350m, from a cold cache.  Printed: wall time
per phase, the split of time between estimation (latencies and bounds), scheduling (SCIP) and
the DP, configurations (architecture × setting) resolved per second, pruning per stage, and the
peak resident memory of this process and of its workers.

Then (unless ``--no-warm``) the same search again from the cache the first run filled, as a
user reruns it: ``phazec`` in a new process, timed from start to exit (target, issue 15: a few
seconds), with its wall time per phase and whether its plan and JSON (wall times apart) are the
first run's bytes.

``--dims`` picks the placement space: ``paper`` (default; DP × 1F1B PP × TP, micro-batch,
recompute), ``practice`` (also what practitioners set, left to the search: sequence
parallelism, ZeRO 0-3 and the interleaved schedule, ``--sequence-parallel auto --zero auto
--pipeline-schedule auto``), or ``both``: the two searches cold, one after the other, and the
ratio of their wall times (issue 13: at most 2x).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
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
    p.add_argument("--no-warm", action="store_true", help="do not rerun the search from the warm cache")
    p.add_argument("--dims", choices=("paper", "practice", "both"), default="paper", help="the placement space")
    args = p.parse_args()
    runs = ("paper", "practice") if args.dims == "both" else (args.dims,)
    if args.cache and len(runs) > 1:
        sys.exit("--dims both times two cold searches: leave out --cache")
    walls = {dims: bench(args, dims) for dims in runs}
    if len(runs) > 1:
        ratio = walls["practice"] / walls["paper"]
        print(
            f"placement space: paper {walls['paper']:.1f} s, practice (+SP, ZeRO, interleaved) "
            f"{walls['practice']:.1f} s cold: {ratio:.2f}x"
        )


#: The search flags of each placement space (``--dims``).
DIMS = {"paper": [], "practice": ["--sequence-parallel", "auto", "--zero", "auto", "--pipeline-schedule", "auto"]}


def bench(args: argparse.Namespace, dims: str) -> float:
    """One cold search (and its warm rerun unless ``--no-warm``) with the placement space
    ``dims``, its figures printed; returns its wall time."""
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
            *DIMS[dims],
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
        warm = None if args.no_warm else rerun(argv, Path(tmp), data)
    st = data["search"]
    w = st["wall_s"]
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
    print(f"model: {data['model']}  space: {st['space']}  placement space: {dims}  jobs: {args.jobs}")
    print(
        f"answer: {data['accelerator']['name']}  DP {data['dp']} PP {data['pp']} TP {data['tp']} "
        f"SP {'on' if data['sequence_parallel'] else 'off'} v {data['virtual_stages']} ZeRO {data['zero']} "
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
    if warm is not None:
        warm_wall, walls, same = warm
        print(
            f"warm rerun: {warm_wall:.1f} s (a new phazec process, start to exit); "
            + ", ".join(f"{k} {v:.2f} s" for k, v in walls.items() if k in ("prepare", "baselines", "search", "plan"))
            + f", total in the search {walls['total']:.2f} s; same plan and JSON as the first run: {same}"
        )
    return wall


def rerun(argv: list[str], tmp: Path, first: dict) -> tuple[float, dict, str]:
    """The search of ``argv`` (whose outputs are in ``tmp``) again, from the cache the first run
    filled, as a user runs it (a new process): its wall time from start to exit, its
    ``search.wall_s`` and whether its plan and JSON (wall times apart) are the first run's."""
    argv = list(argv)
    outputs = {"-o": tmp / "warm.mlir", "--json": tmp / "warm.json"}
    for flag, path in outputs.items():
        argv[argv.index(flag) + 1] = str(path)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "phaze.tools.phazec", *argv], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"the warm rerun failed:\n{r.stderr}")
    data = json.loads(outputs["--json"].read_text())
    walls = data["search"]["wall_s"]
    data["search"]["wall_s"] = first["search"]["wall_s"]
    plan = outputs["-o"].read_text() == (tmp / "plan.mlir").read_text()
    same = "yes" if plan and data == first else f"NO (plan {'same' if plan else 'differs'}, JSON differs)"
    return wall, walls, same


if __name__ == "__main__":
    main()
