"""Operator scheduling of one layer on one chip: minimize the makespan of a DAG of ops.

Pure code (no xDSL): ``phaze-schedule-ops`` builds a :class:`Problem` per layer and phase from
the IR (:func:`schedule_layers`) and solves it through a :class:`ScheduleCache`.  One module per
idea:

- :mod:`.problem`: the problem (:class:`Op`, :class:`Problem`), a :class:`Schedule` and
  :func:`check_schedule`;
- :mod:`.prepared`: the problem as the solvers see it (ops that take time, the transitive
  reduction, heads and tails), the combinatorial lower bounds, and a schedule of those ops back
  as a :class:`Schedule` of the problem;
- :mod:`.windows`: heads and tails raised by the work of each op's ancestors and descendants;
- :mod:`.forced_split`: :func:`makespan_lower_bound`, the combinatorial bounds on those windows
  with the ops too long for one core in theirs charged split (the search's refined bound);
- :mod:`.warm_start`: the list schedules and the local search (in Rust, ``rust/phaze-sched``):
  the upper bound, SCIP's first incumbent and the fallback;
- :mod:`.milp`: the MILP (its variables and its four families of rows: precedence, energetic,
  disjunctive order, core capacity by antichains or resource flows), its warm-start values and
  the decoding of a solution;
- :mod:`.solve`: :func:`solve` (SCIP through pyscipopt, or cvxpy) and :data:`SOLVER_REVISION`;
- :mod:`.serial`: :func:`serial_schedule`, the exact schedule of a chip that runs one op at a
  time (a GPU's stream), no solver;
- :mod:`.layers`: the groups of a training step (layer × phase) and :func:`schedule_layers`;
- :mod:`.cache`: :class:`ScheduleCache` (in memory and on disk), handed to whoever solves.
"""

from passes.algorithms.schedule.cache import ScheduleCache
from passes.algorithms.schedule.forced_split import makespan_lower_bound
from passes.algorithms.schedule.layers import (
    PHASE_GROUPS,
    LayerSchedule,
    cast_groups,
    group_edges,
    group_problem,
    phase_groups,
    schedule_group,
    schedule_layers,
)
from passes.algorithms.schedule.milp import ENERGY_CUTS, FLOOR, MAX_ANTICHAIN_STEPS, MAX_ANTICHAINS
from passes.algorithms.schedule.prepared import lower_bounds
from passes.algorithms.schedule.problem import UNITS, Op, Problem, Schedule, check_schedule
from passes.algorithms.schedule.serial import serial_schedule, serial_times
from passes.algorithms.schedule.solve import SOLVER_REVISION, solve
from passes.algorithms.schedule.warm_start import LOCAL_SEARCH_BASE, LOCAL_SEARCH_PER_OP, list_schedule

__all__ = [
    "ENERGY_CUTS",
    "FLOOR",
    "LOCAL_SEARCH_BASE",
    "LOCAL_SEARCH_PER_OP",
    "MAX_ANTICHAINS",
    "MAX_ANTICHAIN_STEPS",
    "PHASE_GROUPS",
    "SOLVER_REVISION",
    "UNITS",
    "LayerSchedule",
    "Op",
    "Problem",
    "Schedule",
    "ScheduleCache",
    "cast_groups",
    "check_schedule",
    "group_edges",
    "group_problem",
    "list_schedule",
    "lower_bounds",
    "makespan_lower_bound",
    "phase_groups",
    "schedule_group",
    "schedule_layers",
    "serial_schedule",
    "serial_times",
    "solve",
]
