"""The warm start: list schedules and a local search, in Rust (``rust/phaze-sched``).

A serial schedule generation scheme with insertion over a usage profile per kind (a portfolio
of priority rules: critical path, earliest start, latest start; and of mode rules: earliest
finish, one core, split, one core while the slack allows), each improved by forward-backward
justification; then a seeded local search over the op list and the modes (:func:`improve`, a
fixed number of decodes: deterministic).  These heuristics are in Rust (through the extension
``passes.algorithms._phaze_rs``): a search schedules thousands of layers, and in Python this
local search was most of their time.  Its makespan is the MILP's upper bound ``UB``, its
schedule the incumbent handed to SCIP and the fallback.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from passes.algorithms.schedule.prepared import Prepared, combinatorial_bounds, prepare, to_schedule
from passes.algorithms.schedule.problem import Problem, Schedule

LOCAL_SEARCH_BASE = 200  # decodes of the warm start's local search: BASE + PER_OP * ops
LOCAL_SEARCH_PER_OP = 10


def rust_instance(prep: Prepared) -> tuple[list[int], list[int], list[list[tuple[float, int]]], list[list[int]]]:
    """``prep`` as the Rust warm start's instance: kind indices, cores per kind, modes, preds."""
    kinds = sorted(set(prep.kind))
    index = {k: i for i, k in enumerate(kinds)}
    caps = [0] * len(kinds)
    for kind, count in zip(prep.kind, prep.cap):
        caps[index[kind]] = count
    return [index[kind] for kind in prep.kind], caps, prep.modes, prep.preds


def best_list(prep: Prepared) -> tuple[list[float], list[int], float]:
    """The best of a portfolio of list schedules (serial generation with insertion; priority
    rules critical path, earliest start, latest start × mode rules earliest finish, one core,
    split, one core while the slack allows), each improved by forward-backward justification
    (``phaze-sched``'s ``best_list``, through the Rust extension)."""
    from passes.algorithms import _phaze_rs

    if not prep.real:
        return [], [], 0.0
    return _phaze_rs.best_list_schedule(*rust_instance(prep))


def improve(
    prep: Prepared, start: list[float], mode: list[int], makespan: float, iterations: int, seed: int
) -> tuple[list[float], list[int], float]:
    """Local search on a schedule (``phaze-sched``'s ``improve``): move one op (and, sometimes,
    flip its mode) to a random place of the op list allowed by precedence, decode by serial
    generation with insertion and justification, keep the result when it is not worse.
    ``iterations`` decodes, seeded: deterministic."""
    from passes.algorithms import _phaze_rs

    if len(prep.real) < 2 or iterations <= 0:
        return start, mode, makespan
    return _phaze_rs.improve_schedule(*rust_instance(prep), start, mode, makespan, iterations, seed)


def decode_justified(prep: Prepared, order: Sequence[int], mode: Sequence[int]) -> tuple[list[float], float]:
    """An op list (precedence-feasible) decoded with fixed modes, then justified."""
    from passes.algorithms import _phaze_rs

    if not prep.real:
        return [], 0.0
    return _phaze_rs.decode_justified(*rust_instance(prep), list(order), list(mode))


def list_schedule(problem: Problem) -> Schedule:
    """The best of the list schedules (see :func:`best_list`), as a :class:`Schedule`
    with status ``"heuristic"`` (``"optimal"`` when it meets the lower bound)."""
    prep = prepare(problem)
    t0 = time.perf_counter()
    start, mode, makespan = best_list(prep)
    cp, work = combinatorial_bounds(prep)
    lower_bound = max(cp, work)
    proven = makespan <= lower_bound * (1 + 1e-9)
    status = "optimal" if proven else "heuristic"
    return to_schedule(prep, start, mode, "list", makespan if proven else lower_bound, cp, work, makespan, t0, status)
