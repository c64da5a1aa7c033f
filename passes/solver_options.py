"""The layer-schedule solver's options, shared by the passes that schedule layers
(``phaze-schedule-ops`` and ``phaze-insert-recompute``). The checks of their values are
declared in ``passes/algorithms/placement_options.py`` (a module light to import), where
phazec's ``--solver-*`` flags (``phaze.options.Options``' ``schedule_*`` fields) take them too:
the same quantities, under other names."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from xdsl.passes import ModulePass

from passes.algorithms import schedule as sched
from passes.algorithms.placement_options import (
    OptionError,
    check_option,
    count_limit,
    option,
    relative_gap,
    time_limit_seconds,
)
from phaze_ir.errors import PhazeError


@dataclass(frozen=True)
class SolverOptions(ModulePass):
    """The solver's options (see ``phaze-schedule-ops`` for their meaning) and the schedule
    cache the pass solves through.

    ``cache`` is not a pipeline option: the compiler driver and the architecture search hand
    theirs in (``dataclasses.replace(pass_, cache=...)``) so that the passes of one compilation,
    and the candidates of one sweep, share solved layers; with none, the pass solves through a
    fresh in-memory cache of its own."""

    time_limit: float | int = option(10.0, time_limit_seconds, "seconds per solve")
    seed: int = option(0, help="SCIP's random seed")
    gap_limit: float | int = option(0.0, relative_gap, "stop a solve at this proven relative gap (0: prove optimality)")
    node_limit: int = option(0, count_limit, "stop a solve after this many branch-and-bound nodes (0: no limit)")
    max_binaries: int = option(0, count_limit, "a MILP with more binaries keeps its warm start (0: no limit)")
    cache: sched.ScheduleCache | None = field(default=None, compare=False, repr=False)

    def solver_limits(self) -> dict:
        """These options, checked (a bad one is said by its pass option, ``phaze-schedule-ops:
        node_limit=-1: expected ...``), as :func:`passes.algorithms.schedule.solve` takes them
        (a node or binaries limit of 0, no limit, becomes None)."""
        for f in fields(SolverOptions):
            try:
                check_option(f, getattr(self, f.name))
            except OptionError as e:
                raise PhazeError(f"{self.name}: {e}") from e
        return {
            "time_limit": self.time_limit,
            "seed": self.seed,
            "gap_limit": self.gap_limit,
            "node_limit": self.node_limit if self.node_limit > 0 else None,
            "max_binaries": self.max_binaries if self.max_binaries > 0 else None,
        }

    def schedule_cache(self) -> sched.ScheduleCache:
        """The cache handed in, else a fresh in-memory one."""
        return self.cache if self.cache is not None else sched.ScheduleCache(None)
