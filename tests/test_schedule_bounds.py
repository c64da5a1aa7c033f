"""The vectorized makespan lower bounds of the search never exceed a schedule's makespan, and
match the solver's own critical-path bound."""

from __future__ import annotations

import random

import numpy as np
import pytest

from passes.algorithms import schedule as S
from phaze.search.schedule_bounds import group_lower_bound


def random_problem(rng: random.Random, n: int, cores: dict[str, int]) -> S.Problem:
    ops = []
    for _ in range(n):
        unit = rng.choice(["tensor", "vector", "vector", "network", "none"])
        one = 0.0 if unit == "none" else rng.uniform(0.1, 5.0)
        ops.append(S.Op(unit, one, 0.0 if unit == "none" else one / rng.uniform(0.5, 8.0)))
    edges = [(i, j) for j in range(n) for i in range(j) if rng.random() < 0.2]
    return S.Problem.make(ops, edges, cores)


@pytest.mark.parametrize("seed", range(8))
def test_bound_is_below_the_schedule_and_at_least_the_critical_path(seed):
    rng = random.Random(seed)
    configs = [{"tensor": rng.choice([1, 2, 4]), "vector": rng.choice([1, 2, 8]), "network": 1} for _ in range(5)]
    base = random_problem(rng, rng.randint(3, 12), configs[0])
    # The same graph on five "chips": durations scaled per unit, core counts varied.
    scale = np.asarray([[rng.uniform(0.5, 2.0) for _ in configs] for _ in base.ops])
    one = np.asarray([[o.one for _ in configs] for o in base.ops]) * scale
    split = np.asarray([[o.split for _ in configs] for o in base.ops]) * scale
    cores = {k: np.asarray([c[k] for c in configs]) for k in ("tensor", "vector", "network")}
    units = [o.unit for o in base.ops]
    lb = group_lower_bound(units, base.edges, one, split, cores)
    for c, cfg in enumerate(configs):
        p = S.Problem.make(
            [S.Op(u, float(one[i, c]), float(split[i, c])) for i, u in enumerate(units)], base.edges, cfg
        )
        sched = S.solve(p, time_limit=5.0)
        assert lb[c] <= sched.makespan * (1 + 1e-9)
        cp, _ = S.lower_bounds(p)
        assert lb[c] >= cp * (1 - 1e-9)
        if sched.status == "optimal":
            assert lb[c] <= sched.lower_bound * (1 + 1e-9)


def test_empty_and_unordered_edges():
    assert group_lower_bound([], [], np.zeros((0, 3)), np.zeros((0, 3)), {}).tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="topological"):
        group_lower_bound(["vector", "vector"], [(1, 0)], np.ones((2, 1)), np.ones((2, 1)), {"vector": 1})
