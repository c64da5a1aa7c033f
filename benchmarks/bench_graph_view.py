"""What the light graph's analysis cache (``passes.graph_view.GraphCache``) saves a compilation:
a model compiled through the training, tiled and latency stages (``phaze.pipeline.compile_module``),
its pipeline's ``build_graph`` calls counted and timed as they run, then, on the compiled
function, one fresh build (``cache=None``), one cache hit, and the cost of the pipeline's calls
were every one a fresh build.

    python benchmarks/bench_graph_view.py [--model examples/gpt2_xl.py] [--micro-batch 4]
                                          [--hw h100] [--stage latency]

Printed: the stage's wall time, the pipeline's ``build_graph`` calls (how many, how many built,
seconds), and per call a fresh build's and a hit's seconds.  The cache pays when a hit (the
identity check of every input) is well below a build: measured on GPT-2 XL (micro-batch 4,
h100, this 2-core machine, issue 43): 5 calls, 1 build, about 0.35 s a build and 0.1 s a hit.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(REPO / "examples" / "gpt2_xl.py"))
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--hw", default="h100")
    ap.add_argument("--stage", default="latency")
    args = ap.parse_args()

    from passes import graph_view
    from phaze.options import Options
    from phaze.pipeline import compile_module
    from phaze_ir.frontend.loader import load_model_file
    from phaze_ir.frontend.trace import trace_model

    calls = {"calls": 0, "builds": 0, "seconds": 0.0}
    real_graph, real_build = graph_view.GraphCache.graph, graph_view._build

    def counted_graph(self, *a, **kw):
        t = time.perf_counter()
        try:
            return real_graph(self, *a, **kw)
        finally:
            calls["calls"] += 1
            calls["seconds"] += time.perf_counter() - t

    def counted_build(*a, **kw):
        calls["builds"] += 1
        return real_build(*a, **kw)

    graph_view.GraphCache.graph = counted_graph  # type: ignore[method-assign]
    graph_view._build = counted_build  # type: ignore[assignment]

    traced = trace_model(load_model_file(args.model), args.micro_batch)
    opts = Options(emit=args.stage, hw=args.hw, micro_batches=(args.micro_batch,))
    start = time.perf_counter()
    module = compile_module(traced, args.stage, 1, opts)
    wall = time.perf_counter() - start
    graph_view.GraphCache.graph, graph_view._build = real_graph, real_build  # type: ignore[method-assign]
    print(f"{args.stage} stage: {wall:.2f} s")
    print(f"pipeline's build_graph: {calls['calls']} calls, {calls['builds']} built, {calls['seconds']:.3f} s")

    fn = graph_view.step_function(module)
    t = time.perf_counter()
    graph_view.build_graph(fn, cache=None)
    fresh = time.perf_counter() - t
    cache = graph_view.GraphCache()
    graph_view.build_graph(fn, cache=cache)
    t = time.perf_counter()
    graph_view.build_graph(fn, cache=cache)
    hit = time.perf_counter() - t
    print(f"one fresh build {fresh:.3f} s, one hit {hit:.3f} s")
    print(f"the pipeline's calls all built afresh: about {calls['calls'] * fresh:.2f} s")


if __name__ == "__main__":
    main()
