"""How far the layer schedules' lower bounds lie under the makespans the search finds.

    python benchmarks/bench_layer_bounds.py [--model examples/opt_350m.py] [-j 2]

Runs the model's full architecture search (``phazec MODEL.py``, cold, no baselines) and keeps
every layer problem it schedules with the schedule found; then prints, for the plain
combinatorial bound (the critical path and the energetic bound at every head and tail
threshold, ``schedule.lower_bounds``) and for the search's refined bound
(``schedule.makespan_lower_bound``, which adds the forced-split bound), how far the makespan
lies above each (median, 75th and 90th percentile, mean) and what the bounds cost.  The
search's stage 3 prunes an architecture on these bounds before scheduling it
(docs/design.md §7.2): the closer they are, the fewer architectures are scheduled.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(REPO / "examples" / "opt_350m.py"))
    p.add_argument("-j", "--jobs", type=int, default=2)
    args = p.parse_args()

    from passes.algorithms import schedule as sched
    from phaze.search import engine
    from phaze.tools.phazec import main as phazec

    solved: list[tuple[sched.Problem, sched.Schedule]] = []
    solve_and_store = engine.Evaluator._solve_and_store

    def keep(self, problems, limits) -> None:
        solve_and_store(self, problems, limits)
        solved.extend((problem, self.cache.lookup(problem, limits)) for problem in problems)

    engine.Evaluator._solve_and_store = keep  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        argv = [args.model, "-o", str(Path(tmp, "plan.mlir")), "-j", str(args.jobs), "--cache", tmp, "-q"]
        if phazec([*argv, "--no-baselines"]) != 0:
            sys.exit("the search failed")
    engine.Evaluator._solve_and_store = solve_and_store  # type: ignore[method-assign]

    makespans = np.array([s.makespan for _, s in solved])
    rows = []
    for name, bound in (("plain", lambda q: max(sched.lower_bounds(q))), ("refined", sched.makespan_lower_bound)):
        t0 = time.perf_counter()
        values = np.array([bound(q) for q, _ in solved])
        seconds = time.perf_counter() - t0
        over = (makespans / np.maximum(values, 1e-300) - 1) * 100
        rows.append((name, over, seconds))
    print(f"model: {Path(args.model).name}  layer schedules solved by the search: {len(solved)}")
    print("bound     makespan above the bound (%): median    p75    p90   mean   time")
    for name, over, seconds in rows:
        q = np.percentile(over, [50, 75, 90])
        print(f"{name:8s}  {'':30s}{q[0]:6.2f} {q[1]:6.2f} {q[2]:6.2f} {over.mean():6.2f}   {seconds:.2f} s")


if __name__ == "__main__":
    main()
