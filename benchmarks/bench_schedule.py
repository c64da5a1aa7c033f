"""Operator scheduling of every unique layer of Llama-2-7B's training step (forward, backward and
optimizer ops) on one TPUv4-like accelerator, and what a search over the paper's architecture
space would need (micro-batch 1, sequence 4096, TP 1, fp16, Adam).

    python benchmarks/bench_schedule.py [--model examples/llama2_7b.py] [--time-limits 2,10]
                                        [--gap-limit 0] [--sample 6]

The model is traced, imported and priced in-process (``phaze-estimate-latency`` on the tpuv4
preset; not counted).  Printed:

- **cold**: scheduling every layer with an empty cache, once per time limit (seconds per solve):
  wall time, and per unique problem its size, solve time, status, gap and makespan vs the list
  schedule and the lower bound.  Target: under 5 s.
- **warm**: the same again from the cache (the algorithm's part, and with the IR read too).
  Target: under 50 ms.
- **search**: with one cache shared by the whole search, the ILPs needed over the paper's 29,360
  candidates are the distinct (core counts, latency vector) pairs of each unique layer problem
  (latencies from ``estimate_space`` over the space), and the time per ILP measured on a seeded
  sample of candidates.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing


def load_module(model: str, seq_len: int | None, hw: str):
    from xdsl.passes import PassPipeline

    from passes import ALL_PASSES, TRAINING_PIPELINE
    from phaze_ir.frontend import import_graph, load_model_file, trace_model
    from phaze_ir.hardware import load_hardware
    from phaze_ir.hardware_ir import set_accelerator
    from phaze_ir.ir import make_context

    spec = load_model_file(model)
    traced = trace_model(spec, 1, seq_len, training=True, dtype="float16")
    module = import_graph(traced)
    PassPipeline.parse_spec(ALL_PASSES, TRAINING_PIPELINE).apply(make_context(), module)
    set_accelerator(module, load_hardware(hw))
    PassPipeline.parse_spec(ALL_PASSES, "phaze-tile-pe-array,phaze-estimate-latency").apply(make_context(), module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(REPO / "examples" / "llama2_7b.py"))
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--hw", default="tpuv4")
    parser.add_argument("--time-limits", default="2,10", help="seconds per solve, one cold run each")
    parser.add_argument("--gap-limit", type=float, default=0.0)
    parser.add_argument("--sample", type=int, default=6, help="candidates sampled to time ILPs over the space")
    parser.add_argument("--sample-time-limit", type=float, default=2.0)
    args = parser.parse_args()

    t0 = time.perf_counter()
    module = load_module(args.model, args.seq_len, args.hw)
    t_load = time.perf_counter() - t0

    from passes.algorithms import schedule as S
    from passes.cost_view import core_counts, read_latencies
    from passes.graph_view import build_graph, read_layers, step_function
    from passes.schedule_ops import scheduled_layers

    layers_attr = [layer.as_dict() for layer in module.attributes["phaze.layers"].data]
    same_as = {layer["index"]: layer["same_as"] for layer in layers_attr}
    print(
        f"model:   {Path(args.model).name}, micro-batch 1, seq {args.seq_len}, TP 1, on {args.hw} "
        f"(trace + import + latency {t_load:.1f} s, not counted)"
    )
    print(
        f"layers:  {len(layers_attr)} ({len(set(same_as.values()))} unique: "
        + ", ".join(f"{layer['kind']} {layer['index']}" for layer in layers_attr if layer["same_as"] == layer["index"])
        + ")"
    )

    # ---- cold and warm ------------------------------------------------------------------------
    for limit in [float(x) for x in args.time_limits.split(",")]:
        cache = S.ScheduleCache()
        t0 = time.perf_counter()
        graph, ops = build_graph(step_function(module))
        latency, layer_of = read_latencies(ops), read_layers(ops)
        cores = core_counts(module, "bench")
        t_read = time.perf_counter() - t0
        t0 = time.perf_counter()
        layers = S.schedule_layers(graph, layer_of, latency, cores, cache, time_limit=limit, gap_limit=args.gap_limit)
        t_cold = time.perf_counter() - t0
        print(
            f"\ncold, time limit {limit:g} s per solve, gap limit {args.gap_limit:g}: {t_cold:.2f} s "
            f"({cache.misses} problems solved, {cache.hits} from the cache; reading the "
            f"IR, not counted: {t_read:.2f} s)"
        )
        print(
            f"  {'layer':<12}{'phase':<6}{'ops':>5}{'real':>5}{'bin':>6}{'solve s':>9}  {'status':<10}{'gap':>9}"
            f"{'makespan s':>13}{'list / ms':>10}{'LB / ms':>9}"
        )
        for layer in layers:
            if same_as.get(layer.index, layer.index) != layer.index:
                continue
            for phase, (ids, s) in layer.groups.items():
                real = sum(1 for c in s.cores if c > 0)
                kind = layers_attr[layer.index]["kind"] if layer.index < len(layers_attr) else "?"
                print(
                    f"  {kind + ' ' + str(layer.index):<12}{phase:<6}{len(ids):>5}{real:>5}{s.num_binaries:>6}"
                    f"{s.solve_s:>9.2f}  {s.status:<10}{s.gap:>9.2e}{s.makespan:>13.4e}"
                    f"{s.list_makespan / s.makespan:>10.4f}{s.lower_bound / s.makespan:>9.4f}"
                )
        t0 = time.perf_counter()
        S.schedule_layers(graph, layer_of, latency, cores, cache, time_limit=limit, gap_limit=args.gap_limit)
        t_warm = time.perf_counter() - t0
        t0 = time.perf_counter()
        scheduled_layers(module, "bench", {"time_limit": limit, "seed": 0, "gap_limit": args.gap_limit}, cache)
        t_warm_ir = time.perf_counter() - t0
        total = {p: sum(layer.makespan(p) for layer in layers) for p in ("fwd", "bwd", "opt")}
        print(
            f"warm (from the cache): {t_warm * 1e3:.1f} ms (schedule_layers); {t_warm_ir * 1e3:.0f} ms with "
            f"the IR read again (graph, latencies, layers)"
        )
        print(
            f"step: fwd {total['fwd']:.4f} s + bwd {total['bwd']:.4f} s per micro-batch, opt {total['opt']:.4f} s; "
            f"serial sum of split latencies "
            + ", ".join(
                f"{p} {sum(latency[i].split for i, o in enumerate(graph.ops) if o.phase == p):.4f} s"
                for p in ("fwd", "bwd", "opt")
            )
        )

    # ---- the architecture search ------------------------------------------------------------
    from passes.algorithms.latency import estimate_space
    from passes.cost_view import op_table
    from phaze.search.arch_space import paper_space

    space = paper_space()
    configs = space.configs
    t0 = time.perf_counter()
    table, row_of, priced_ops, _ = op_table(module)
    lat = estimate_space(table, configs, space.spec.template)
    t_space = time.perf_counter() - t0
    fn = step_function(module)
    graph, ops = build_graph(fn)
    row = {id(o): r for o, r in zip(priced_ops, row_of)}
    op_rows = np.asarray([row[id(o)] for o in ops])
    groups: dict[tuple[int, str], list[int]] = {}
    for i, o in enumerate(graph.ops):
        groups.setdefault((layer_of[i], o.phase), []).append(i)
    unique = {(layer, p): ids for (layer, p), ids in groups.items() if same_as.get(layer, layer) == layer}
    n_tc = configs["num_tc"].astype(np.float64)
    n_vc = configs["num_vc"].astype(np.float64)
    C = len(configs)
    distinct = {}
    for key, ids in sorted(unique.items()):
        rows = np.unique(op_rows[ids])
        block = np.vstack([n_tc, n_vc, lat.one[rows], lat.split[rows]])  # [2 + 2·rows, C]
        distinct[key] = np.unique(block, axis=1).shape[1]
    n_ilp = sum(distinct.values())
    print(
        f"\nsearch: {C:,} candidates (paper space), latencies of {len(table)} unique ops in {t_space:.1f} s; "
        f"{len(unique)} unique layer problems (layer x phase)"
    )
    print(
        "  distinct (core counts, latency vector) per problem: "
        + ", ".join(f"{layers_attr[layer]['kind']} {p} {n:,}" for (layer, p), n in sorted(distinct.items()))
    )
    print(
        f"  ILPs for the whole space with a shared cache: {n_ilp:,} (vs {C * len(groups):,} "
        f"layer-phase solves without any cache, {C * len(unique):,} with identical layers merged only)"
    )

    # Time per ILP, per problem, on a seeded sample of candidates; the space's total is the sum
    # over problems of (distinct instances x mean time).
    rng = random.Random(0)
    sample = rng.sample(range(C), min(args.sample, C))
    print(
        f"  time per ILP on {len(sample)} sampled candidates (time limit {args.sample_time_limit:g} s, "
        f"gap limit {args.gap_limit:g}):"
    )
    total_s = 0.0
    worst_gap = 0.0
    for key in sorted(unique):
        times, statuses = [], []
        for c in sample:
            cores = {"tensor": int(configs["num_tc"][c]), "vector": int(configs["num_vc"][c]), "network": 1}
            ops_c = [S.Op(lat.units[r], float(lat.one[r, c]), float(lat.split[r, c])) for r in op_rows[unique[key]]]
            problem = S.group_problem(graph, unique[key], _index(ops_c, unique[key]), cores)
            s = S.solve(problem, time_limit=args.sample_time_limit, gap_limit=args.gap_limit)
            times.append(s.solve_s)
            statuses.append(s.status)
            worst_gap = max(worst_gap, s.gap)
        mean = statistics.mean(times)
        total_s += distinct[key] * mean
        print(
            f"    {layers_attr[key[0]]['kind']:<9}{key[1]:<4} mean {mean:6.3f} s, max {max(times):6.3f} s, "
            f"{statuses.count('optimal')}/{len(statuses)} optimal"
        )
    print(
        f"  => {total_s / 3600:.1f} CPU-hours for the {n_ilp:,} ILPs of the space (largest sampled gap "
        f"{worst_gap:.2e}); micro-batch sizes and TP widths change the latencies and multiply it"
    )


def _index(ops_c, ids):
    """Latencies indexed by graph op id (what ``group_problem`` reads) for the ops ``ids``."""
    out = {}
    for i, o in zip(ids, ops_c):
        out[i] = o
    return out


if __name__ == "__main__":
    main()
