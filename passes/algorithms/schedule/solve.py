"""Solve a scheduling problem: the warm start, then the MILP by SCIP; the result checked.

**Solver.**  The model is built directly with pyscipopt (``backend="scip"``, the default):
cvxpy's SCIP interface ignores warm starts, goes through a ``dok_array`` and reports
``optimal_inaccurate`` at a time limit, while here the list schedule is handed to SCIP as its
first incumbent and SCIP's real status and dual bound are read.  The same model is also written
in cvxpy (``backend="cvxpy"``, ``cp.SCIP``; status and dual bound from cvxpy's
``solver_stats.extra_stats``); the tests check both agree.  SCIP's separators are off (they cost
most of the time and barely move big-M bounds).  Durations shorter than ``FLOOR·UB`` are raised
to it in the MILP (SCIP's 1e-6 tolerances cannot order shorter ops: see
:func:`~.milp.floored`); the returned schedule uses the true durations and the reported bound is
lowered by the total raise.  When the warm start meets the lower bound no MILP is built.

**Result.**  Only the discrete choices of SCIP's solution are kept (``y`` and ``x``): start times
are recomputed exactly as earliest starts under the graph plus that order, and the schedule is
checked (:func:`~.problem.check_schedule`) before it is returned.  ``status``: ``"optimal"``,
``"gaplimit"``, ``"nodelimit"``, ``"timelimit"`` (the best schedule found and the proven
``gap``) or ``"heuristic"``.  Lower bounds reported: the critical path and the energetic bound
(:func:`~.prepared.lower_bounds`), and SCIP's dual bound.  Results are deterministic unless a
time limit cuts a solve short (fixed seeds).
"""

from __future__ import annotations

import math
import time
from typing import Any

from passes.algorithms.schedule.milp import (
    FLOOR,
    SCALE,
    Milp,
    MilpTooLarge,
    build_milp,
    decode_solution,
    floored,
    warm_values,
)
from passes.algorithms.schedule.prepared import combinatorial_bounds, full_schedule, prepare, to_schedule
from passes.algorithms.schedule.problem import Problem, Schedule, check_schedule
from passes.algorithms.schedule.warm_start import (
    LOCAL_SEARCH_BASE,
    LOCAL_SEARCH_PER_OP,
    best_list,
    decode_justified,
    improve,
)

#: Bumped when a change makes :func:`solve` return different schedules for the same problem and
#: limits: cached entries of another revision are not reused unless proven optimal.
SOLVER_REVISION = 3


def solve_with_scip(
    milp: Milp,
    time_limit: float,
    seed: int,
    warm: dict[int, float] | None,
    gap_limit: float = 0.0,
    node_limit: int | None = None,
) -> tuple[str, list[float] | None, float, bool | None]:
    """Solve ``milp`` with pyscipopt, ``warm`` (values by variable) as the first incumbent:
    ``(SCIP's status, the best solution's values or None, the dual bound, whether SCIP accepted
    the warm start)``."""
    import pyscipopt

    model = pyscipopt.Model()
    model.hideOutput()
    model.setParam("limits/time", float(time_limit))
    if node_limit is not None:
        model.setParam("limits/nodes", int(node_limit))
    model.setParam("limits/gap", float(gap_limit))
    model.setParam("randomization/randomseedshift", int(seed))
    model.setParam("randomization/permutationseed", int(seed))
    model.setParam("randomization/lpseed", int(seed))
    # Cutting planes barely move the bound of big-M disjunctions and cost most of the time
    # (measured on Llama-2-7B's layers: 1-3 s with them, ~1 s without); the energetic rows
    # above are the cuts that matter.
    model.setSeparating(pyscipopt.SCIP_PARAMSETTING.OFF)
    scip_vars = []
    for i in range(len(milp.lower)):
        integer = milp.integer[i]
        vtype = "B" if integer and milp.lower[i] == 0 and milp.upper[i] == 1 else ("I" if integer else "C")
        scip_vars.append(
            model.addVar(
                name=milp.names[i],
                vtype=vtype,
                lb=milp.lower[i],
                ub=milp.upper[i],
                obj=1.0 if i == milp.objective else 0.0,
            )
        )
    for idx, coef, lo, hi in milp.rows:
        expr = pyscipopt.quicksum(c * scip_vars[v] for v, c in zip(idx, coef))
        if lo == hi:
            model.addCons(expr == lo)
        else:
            if lo != -math.inf:
                model.addCons(expr >= lo)
            if hi != math.inf:
                model.addCons(expr <= hi)
    accepted = None
    if warm is not None:
        sol = model.createSol()
        for v, val in warm.items():
            model.setSolVal(sol, scip_vars[v], val)
        accepted = bool(model.addSol(sol, free=True))
    model.optimize()
    status = model.getStatus()
    if status == "userinterrupt":
        # SCIP catches Ctrl-C while it solves (Python's handler never sees it) and only stops
        # this solve: pass the interrupt on, or the run would go on to the next one.
        raise KeyboardInterrupt
    values = None
    if model.getNSols() > 0:
        best = model.getBestSol()
        values = [model.getSolVal(best, v) for v in scip_vars]
    dual = model.getDualbound() if status != "infeasible" else math.inf
    return status, values, dual, accepted


def solve_with_cvxpy(
    milp: Milp, time_limit: float, seed: int, gap_limit: float = 0.0
) -> tuple[str, list[float] | None, float, None]:
    """The same as :func:`solve_with_scip` through cvxpy's SCIP interface (no warm start)."""
    import cvxpy as cp
    import numpy as np
    import scipy.sparse as sp

    n = len(milp.lower)
    int_idx = [i for i in range(n) if milp.integer[i]]
    con_idx = [i for i in range(n) if not milp.integer[i]]
    block_of = {}
    for a, i in enumerate(int_idx):
        block_of[i] = (0, a)
    for a, i in enumerate(con_idx):
        block_of[i] = (1, a)
    int_vars = cp.Variable(len(int_idx), integer=True) if int_idx else None
    cont_vars = cp.Variable(len(con_idx)) if con_idx else None
    # (row, column, coefficient) triplets of the integer and the continuous block
    rows_i: tuple[list[int], list[int], list[float]] = ([], [], [])
    rows_c: tuple[list[int], list[int], list[float]] = ([], [], [])
    lo_list, hi_list = [], []
    for r, (idx, coef, lo, hi) in enumerate(milp.rows):
        for v, c in zip(idx, coef):
            block, a = block_of[v]
            target = rows_i if block == 0 else rows_c
            target[0].append(r)
            target[1].append(a)
            target[2].append(c)
        lo_list.append(lo)
        hi_list.append(hi)
    num_rows = len(milp.rows)
    expr: Any = 0
    if int_vars is not None:
        expr = expr + sp.csr_matrix((rows_i[2], (rows_i[0], rows_i[1])), shape=(num_rows, len(int_idx))) @ int_vars
    if cont_vars is not None:
        expr = expr + sp.csr_matrix((rows_c[2], (rows_c[0], rows_c[1])), shape=(num_rows, len(con_idx))) @ cont_vars
    lo_a, hi_a = np.array(lo_list), np.array(hi_list)
    cons = []
    fin_hi = np.isfinite(hi_a)
    fin_lo = np.isfinite(lo_a)
    if fin_hi.any():
        cons.append(expr[np.flatnonzero(fin_hi)] <= hi_a[fin_hi])
    if fin_lo.any():
        cons.append(expr[np.flatnonzero(fin_lo)] >= lo_a[fin_lo])
    for block_vars, idx in ((int_vars, int_idx), (cont_vars, con_idx)):
        if block_vars is None:
            continue
        lower = np.array([milp.lower[i] for i in idx])
        upper = np.array([milp.upper[i] for i in idx])
        cons += [block_vars >= lower, block_vars <= upper]
    block, a = block_of[milp.objective]
    vars_of_block = {0: int_vars, 1: cont_vars}
    obj_block = vars_of_block[block]
    assert obj_block is not None  # the objective's block holds it
    obj_var = obj_block[a]
    cvx_problem = cp.Problem(cp.Minimize(obj_var), cons)
    cvx_problem.solve(
        solver=cp.SCIP,
        scip_params={
            "limits/time": float(time_limit),
            "limits/gap": float(gap_limit),
            "randomization/randomseedshift": int(seed),
        },
    )
    extra = cvx_problem.solver_stats.extra_stats or {}
    status = extra.get("scip_status", cvx_problem.status)
    model = extra.get("model")
    dual = model.getDualbound() if model is not None and status != "infeasible" else -math.inf
    values = None
    if cvx_problem.status in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        values = [0.0] * n
        for i in range(n):
            block, a = block_of[i]
            block_vars = vars_of_block[block]
            assert block_vars is not None and block_vars.value is not None
            values[i] = float(block_vars.value[a])
    return status, values, dual, None


def solve(
    problem: Problem,
    time_limit: float = 10.0,
    seed: int = 0,
    backend: str = "scip",
    capacity_model: str = "auto",
    gap_limit: float = 0.0,
    node_limit: int | None = None,
    max_binaries: int | None = None,
) -> Schedule:
    """Minimize the makespan of ``problem`` (see the module docstring).  ``time_limit`` bounds
    SCIP's time (s); ``gap_limit`` stops it once the relative gap is that small (0: prove
    optimality); ``node_limit`` stops it after that many branch-and-bound nodes (``None``: no
    limit; unlike a time limit, a node limit gives the same answer on a loaded or idle machine,
    which is what the architecture search needs); ``max_binaries``: a MILP that would need more binaries
    (a mode per splittable op, two order variables per pair of same-kind ops that may overlap) is
    not built, the warm start is the answer (status ``"heuristic"``, ``num_binaries`` that count;
    such a MILP's root LP alone can take a minute: a size rule keeps the search's cost bounded and
    machine-independent);
    ``seed`` its random seeds; ``backend`` is ``"scip"`` (pyscipopt, warm
    started) or ``"cvxpy"`` (the same model through cvxpy, no warm start).  ``capacity_model``
    (``"auto"``, ``"antichain"``, ``"flow"``) picks how core counts between 2 and the width are
    modelled (``auto``: antichains unless there are more than :data:`~.milp.MAX_ANTICHAINS`)."""
    if backend not in ("scip", "cvxpy"):
        raise ValueError(f"backend {backend!r}: expected 'scip' or 'cvxpy'")
    if capacity_model not in ("auto", "antichain", "flow"):
        raise ValueError(f"capacity_model {capacity_model!r}: expected 'auto', 'antichain' or 'flow'")
    t0 = time.perf_counter()
    prep = prepare(problem)
    list_start, list_mode, list_makespan = best_list(prep)
    cp, work = combinatorial_bounds(prep)
    lower_bound = max(cp, work)
    if not prep.real or list_makespan <= lower_bound * (1 + 1e-9):
        return to_schedule(prep, list_start, list_mode, "list", list_makespan, cp, work, list_makespan, t0, "optimal")
    decodes = LOCAL_SEARCH_BASE + LOCAL_SEARCH_PER_OP * len(prep.real)
    list_start, list_mode, list_makespan = improve(prep, list_start, list_mode, list_makespan, decodes, seed)
    if list_makespan <= lower_bound * (1 + 1e-9):
        return to_schedule(prep, list_start, list_mode, "list", list_makespan, cp, work, list_makespan, t0, "optimal")

    def fallback(num_binaries: int) -> Schedule:
        """The warm start, when there is no MILP or it fails."""
        return to_schedule(
            prep, list_start, list_mode, "list", lower_bound, cp, work, list_makespan, t0, "heuristic", num_binaries
        )

    # The model's problem: durations floored (see floored), its own list schedule as warm start.
    delta = FLOOR * list_makespan
    model_prep, raised = floored(prep, delta)
    if raised:
        # The improved schedule's op order and modes, decoded with the floored durations.
        order = sorted(range(len(prep.real)), key=lambda k: (list_start[k], k))
        model_start, model_makespan = decode_justified(model_prep, order, list_mode)
        model_mode = list(list_mode)
    else:
        model_start, model_mode, model_makespan = list_start, list_mode, list_makespan
    model_cp, model_work = combinatorial_bounds(model_prep)
    try:
        milp, variables = build_milp(
            model_prep, model_makespan, max(model_cp, model_work), capacity_model, max_binaries
        )
    except MilpTooLarge as e:
        return fallback(e.args[0])
    num_binaries = sum(milp.integer)
    try:
        if backend == "scip":
            warm = warm_values(model_prep, variables, model_start, model_mode, model_makespan)
            status, values, dual, accepted = solve_with_scip(milp, time_limit, seed, warm, gap_limit, node_limit)
        else:
            status, values, dual, accepted = solve_with_cvxpy(milp, time_limit, seed, gap_limit)
    except Exception:
        return fallback(num_binaries)
    best_start, best_mode, method, best_makespan = list_start, list_mode, "list", list_makespan
    if values is not None:
        decoded = decode_solution(prep, variables, values)
        if decoded is not None:
            milp_start, milp_mode = decoded
            makespan = max(
                (milp_start[k] + prep.modes[k][milp_mode[k]][0] for k in range(len(milp_start))), default=0.0
            )
            start, end, cores, _ = full_schedule(prep, milp_start, milp_mode)
            if not check_schedule(problem, start, end, cores) and makespan <= list_makespan:
                best_start, best_mode, method, best_makespan = milp_start, milp_mode, "ilp", makespan
    # SCIP's dual bound is for the floored durations: lower it by the total increase.
    finite_dual = dual is not None and math.isfinite(dual)
    dual_s = dual * model_makespan / SCALE - raised * delta if finite_dual else 0.0
    lower_bound = max(lower_bound, dual_s)
    model_optimum_s = dual * model_makespan / SCALE if finite_dual else math.inf
    if status == "optimal" and best_makespan <= model_optimum_s * (1 + 1e-9):
        # Optimal for the model; exactly so unless durations were floored (then the gap says
        # how far from the true optimum it can be).
        lower_bound = best_makespan if not raised else lower_bound
        out = "optimal"
    elif status == "gaplimit":
        out = "gaplimit"
    elif status in ("nodelimit", "totalnodelimit", "stallnodelimit"):
        out = "nodelimit"
    elif status in ("timelimit", "memlimit"):
        out = "timelimit"
    else:
        out = "optimal" if best_makespan <= lower_bound * (1 + 1e-9) else "heuristic"
    return to_schedule(
        prep, best_start, best_mode, method, lower_bound, cp, work, list_makespan, t0, out, num_binaries, accepted
    )
