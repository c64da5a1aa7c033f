"""Time and memory of generating the paper's architecture space (75,712 candidates -> 29,360).

    python benchmarks/bench_arch_space.py [--repeat N]

Prints: generation time (best and median of N runs, area model included), the size of the
resulting structured array, the peak memory allocated during one generation (tracemalloc, which
sees numpy's buffers), the time to load the same space from examples/spaces/paper.toml, and the
time to turn every candidate into an ``Accelerator``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from phaze.search.arch_space import ArchSpace, load_space, paper_spec  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()

    spec = paper_spec()
    ArchSpace.generate(spec)  # warm-up (imports, caches)
    times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        space = ArchSpace.generate(spec)
        times.append(time.perf_counter() - t0)

    tracemalloc.start()
    space = ArchSpace.generate(spec)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    t0 = time.perf_counter()
    load_space(REPO / "examples" / "spaces" / "paper.toml")
    t_toml = time.perf_counter() - t0

    t0 = time.perf_counter()
    for i in range(len(space)):
        space.accelerator(i)
    t_acc = time.perf_counter() - t0

    print(f"paper space: {len(space):,} of {space.num_candidates:,} candidates")
    print(
        f"generate:    best {min(times) * 1e3:.2f} ms, median {statistics.median(times) * 1e3:.2f} ms "
        f"({args.repeat} runs)"
    )
    print(
        f"memory:      configs array {space.configs.nbytes / 2**20:.2f} MiB "
        f"({space.configs.itemsize} B per candidate); peak during generation {peak / 2**20:.2f} MiB"
    )
    print(f"from TOML:   {t_toml * 1e3:.2f} ms (examples/spaces/paper.toml, template and budget included)")
    print(
        f"as objects:  {t_acc * 1e3:.0f} ms for all {len(space):,} Accelerator objects "
        f"({t_acc / len(space) * 1e6:.1f} us each)"
    )


if __name__ == "__main__":
    main()
