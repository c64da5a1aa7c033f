"""What tracing a model costs per micro-batch size, and what tracing it once symbolically does.

    python benchmarks/bench_trace.py [MODEL.py] [--micro-batches 1,2,4,8] [--seq-len N]
                                     [--blocks N] [--symbolic [--check]] [--deepen [--check]]

Without ``--symbolic``: the time of ``trace_model`` at each micro-batch size, as ``phazec``
traces them (one concrete ``make_fx`` trace per size), and the peak RSS.

With ``--symbolic``: the step traced once symbolically per family (micro-batch 1, and 2 and
more: ``phaze_ir/frontend/symbolic_trace.py``, as the sweep's settings share it) and specialised
at each micro-batch, with the time of each; a point its checks refuse says so (its own trace
then); ``--check`` also says whether each specialised step's IR is byte-identical to the
concrete trace's.  ``--blocks N``: every trace of the model cut to N blocks (as the settings').

With ``--deepen``: the time of ``trace_step`` (``phaze_ir/frontend/deepen.py``: the model traced
cut to 5 and 6 blocks, the 5-block step deepened to all of them, as phazec traces a whole model)
at each size; ``--check`` says whether its IR is byte-identical to the whole trace's.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from phaze.pipeline import few_collections  # noqa: E402
from phaze_ir.frontend import import_graph, load_model_file, trace_model, trace_step  # noqa: E402
from phaze_ir.ir import print_module  # noqa: E402


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=str(ROOT / "examples" / "gpt3_175b.py"))
    ap.add_argument("--micro-batches", default="1,2,4,8")
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--blocks", type=int, default=None, help="trace the model cut to this many blocks")
    ap.add_argument("--symbolic", action="store_true", help="also trace once symbolically and specialise each size")
    ap.add_argument("--deepen", action="store_true", help="also trace each size cut to 5 blocks and deepen it")
    ap.add_argument("--check", action="store_true", help="compare the bound (deepened) IR with the concrete trace's")
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    spec = load_model_file(a.model)
    sizes = [int(b) for b in a.micro_batches.split(",")]
    seq = a.seq_len if a.seq_len is not None else spec.seq_len
    print(f"{spec.name}, seq {seq}, {a.dtype}: one concrete trace per micro-batch (as phazec traces)")
    concrete: dict[int, Any] = {}
    for b in sizes:
        start = time.perf_counter()
        traced = trace_model(spec, b, a.seq_len, training=True, dtype=a.dtype, max_blocks=a.blocks)
        print(
            f"  micro-batch {b}: {time.perf_counter() - start:6.1f} s  "
            f"({len(traced.graph_module.graph.nodes)} aten nodes), peak RSS {peak_gib():.2f} GiB"
        )
        if a.check:
            concrete[b] = traced
        del traced
    if a.deepen:
        print("trace_step: cut to 5 and 6 blocks, deepened (as phazec traces a whole model)")
        for b in sizes:
            start = time.perf_counter()
            traced = trace_step(spec, b, a.seq_len, training=True, dtype=a.dtype)
            line = f"  micro-batch {b}: {time.perf_counter() - start:6.1f} s  " + (
                f"(deepened from {traced.deepened_from} blocks)" if traced.deepened_from else "(traced whole)"
            )
            if a.check:
                same = print_module(import_graph(traced)) == print_module(import_graph(concrete[b]))
                line += ", IR " + ("byte-identical to the whole trace's" if same else "DIFFERS from the whole trace's")
            print(line + f", peak RSS {peak_gib():.2f} GiB")
            del traced
    if not a.symbolic:
        return
    from phaze_ir.frontend.symbolic_trace import trace_family

    families: dict[bool, Any] = {}
    for b in sizes:
        if (b == 1) not in families:
            start = time.perf_counter()
            families[b == 1] = family = trace_family(spec, b, a.seq_len, a.dtype, a.blocks)
            guards = [str(g.expr) for g in family.sizes.env.guards]
            print(
                f"symbolic trace at micro-batch {b}: {time.perf_counter() - start:6.1f} s  "
                f"({len(family.traced.graph_module.graph.nodes)} nodes), guards {guards or 'none'}, "
                f"peak RSS {peak_gib():.2f} GiB"
            )
        start = time.perf_counter()
        with few_collections():  # as the pipeline imports: young-generation GC every 50,000 allocations
            served = families[b == 1].at(spec, b, a.seq_len)
        line = f"  specialised to micro-batch {b}: {time.perf_counter() - start:6.2f} s"
        if served is None:
            line += " (a check fails there: this size needs its own trace)"
        elif a.check:
            same = print_module(import_graph(served)) == print_module(import_graph(concrete[b]))
            line += ", IR " + ("byte-identical to" if same else "DIFFERS from") + " the concrete trace's"
        print(line)
    print(f"peak RSS {peak_gib():.2f} GiB")


if __name__ == "__main__":
    main()
