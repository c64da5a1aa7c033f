"""Latency of every op of Llama-2-7B's training step on all 29,360 configurations of the paper's
architecture space (micro-batch 1, sequence 4096, TP 1, fp16, Adam).

    python benchmarks/bench_latency.py [--model examples/llama2_7b.py] [--seq-len 4096]

The model is traced and imported in-process (its time is printed but is not part of the
figure).  The figure is the wall time from the module to the ``[unique ops × configs]`` latency
arrays: describing and deduplicating the ops (by signature, then by description), and the
vectorized estimate over the space, with a cold cache.  Also printed: peak memory (the process'
``ru_maxrss``, tracing included, and the estimate's own peak from ``tracemalloc``), unique
signatures vs ops, configurations per second, the warm-cache time, and the best configurations
by serial step time (every op split over its cores, one after the other).
Targets: under 30 s and under 4 GB on a 2-core machine.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing


def load_module(model: str, seq_len: int | None):
    from xdsl.passes import PassPipeline

    from passes import ALL_PASSES, TRAINING_PIPELINE
    from phaze_ir.frontend import import_graph, load_model_file, trace_model
    from phaze_ir.ir import make_context

    spec = load_model_file(model)
    traced = trace_model(spec, 1, seq_len, training=True, dtype="float16")
    module = import_graph(traced)
    PassPipeline.parse_spec(ALL_PASSES, TRAINING_PIPELINE).apply(make_context(), module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(REPO / "examples" / "llama2_7b.py"))
    parser.add_argument("--seq-len", type=int, default=4096)
    args = parser.parse_args()

    t0 = time.perf_counter()
    module = load_module(args.model, args.seq_len)
    t_trace = time.perf_counter() - t0
    rss_trace = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20

    from passes.algorithms.latency import BOUNDS, LatencyCache, config_of, estimate_op, estimate_space
    from passes.cost_view import op_table
    from phaze.search.arch_space import paper_space
    from phaze_ir.hardware import load_hardware

    space = paper_space()
    configs, template = space.configs, space.spec.template

    t0 = time.perf_counter()
    table, row_of, ops, signatures = op_table(module)
    t_table = time.perf_counter() - t0
    cache = LatencyCache()
    t0 = time.perf_counter()
    lat = estimate_space(table, configs, template, cache=cache)
    t_space = time.perf_counter() - t0
    t0 = time.perf_counter()
    estimate_space(table, configs, template, cache=cache)
    t_warm = time.perf_counter() - t0
    # The estimate's own peak (numpy buffers included), measured on a separate uncached run:
    # tracemalloc slows Python down, so it stays out of the timed runs.
    tracemalloc.start()
    again = estimate_space(table, configs, template, cache=None)
    _, peak_est = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert np.array_equal(again.split, lat.split)
    del again
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20

    total = t_table + t_space
    U, C = lat.split.shape
    print(f"model:       {Path(args.model).name}, training step, micro-batch 1, seq {args.seq_len}, TP 1")
    print(f"trace+import {t_trace:.1f} s (not counted)")
    print(
        f"ops:         {len(ops):,} priced ops, {len(signatures):,} unique signatures, "
        f"{U} unique descriptions ({len(table.rows['tensor'])} tensor, {len(table.rows['vector'])} vector, "
        f"{len(table.rows['network'])} network, {len(table.rows['none'])} view)"
    )
    print(f"space:       {C:,} configurations (paper space, template {template.name})")
    print(
        f"time:        {total:.2f} s = describe+dedup {t_table:.2f} s + estimate {t_space:.2f} s "
        f"({C / t_space:,.0f} configs/s; {U * C / t_space / 1e6:.1f} M op-configs/s); warm cache {t_warm:.2f} s"
    )
    print(
        f"memory:      peak RSS {rss:.2f} GiB (after tracing: {rss_trace:.2f} GiB); estimate's own peak "
        f"{peak_est / 2**30:.2f} GiB (tracemalloc); result arrays "
        f"{sum(a.nbytes for a in (lat.one, lat.split, lat.bound, lat.bound_one)) / 2**20:.0f} MiB"
    )

    # Every op's latency on every config is split[row_of[i], c]; summed per config that is the
    # serial step time (counts of each unique row times its latency).
    counts = np.bincount(np.asarray(row_of), minlength=U).astype(np.float64)
    step = counts @ lat.split
    order = np.argsort(step, kind="stable")
    tpu = space.find(num_tc=8, num_vc=2, width=128, depth=128, glb_bytes=128 * 2**20)
    print("serial step time (sum over ops of split latency):")
    if tpu is not None:
        print(f"  tpuv4-like (8 TC 128x128, 2 VC, 128 MiB):  {step[tpu]:.3f} s")
    for rank, c in enumerate(order[:3]):
        r = configs[c]
        print(
            f"  best #{rank + 1}: {step[c]:.3f} s  {r['num_tc']} TC {r['width']}x{r['depth']}, "
            f"{r['num_vc']} VC x{r['width_vc']}, "
            f"GLB {r['glb_bytes'] // 2**20} MiB"
        )
    share = np.bincount(lat.bound.ravel(), weights=np.repeat(counts, C) * lat.split.ravel() / C, minlength=len(BOUNDS))
    print(
        "time share by bound (averaged over configs): "
        + ", ".join(f"{b} {s / share.sum():.0%}" for b, s in zip(BOUNDS, share) if s > 0)
    )

    # Cross-check: the space's tpuv4 row equals the scalar model of the pass on the preset.
    if tpu is not None:
        acc = load_hardware("tpuv4")
        scalar = np.asarray([estimate_op(d, acc).split_s for d in table.descs])
        vec = estimate_space(table, config_of(acc), acc, cache=None).split[:, 0]
        print(
            f"check:       scalar == vectorized on tpuv4: {bool(np.array_equal(scalar, vec))}; "
            f"space row == preset: {bool(np.array_equal(lat.split[:, tpu], vec))}"
        )


if __name__ == "__main__":
    main()
