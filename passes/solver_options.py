"""The layer-schedule solver's options, shared by the passes that schedule layers
(``phaze-schedule-ops`` and ``phaze-insert-recompute``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.passes import ModulePass

from passes.algorithms import schedule as sched
from phaze_ir.errors import PhazeError


def solver_limits(
    pass_name: str, time_limit: float, seed: int, gap_limit: float = 0.0, node_limit: int = 0, max_binaries: int = 0
) -> dict:
    """The pass options, checked, as :func:`passes.algorithms.schedule.solve` takes them (a
    node or binaries limit of 0, no limit, becomes None)."""
    if node_limit < 0:
        raise PhazeError(f"{pass_name}: node_limit={node_limit}: expected a number of nodes >= 0 (0: no limit)")
    if not time_limit > 0:
        raise PhazeError(f"{pass_name}: time_limit={time_limit}: expected a positive number of seconds")
    if not 0 <= gap_limit < 1:
        raise PhazeError(f"{pass_name}: gap_limit={gap_limit}: expected a relative gap in [0, 1)")
    return {
        "time_limit": time_limit,
        "seed": seed,
        "gap_limit": gap_limit,
        "node_limit": node_limit if node_limit > 0 else None,
        "max_binaries": max_binaries if max_binaries > 0 else None,
    }


@dataclass(frozen=True)
class SolverOptions(ModulePass):
    """The solver's options (see ``phaze-schedule-ops`` for their meaning) and the schedule
    cache the pass solves through.

    ``cache`` is not a pipeline option: the compiler driver and the architecture search hand
    theirs in (``dataclasses.replace(pass_, cache=...)``) so that the passes of one compilation,
    and the candidates of one sweep, share solved layers; with none, the pass solves through a
    fresh in-memory cache of its own."""

    time_limit: float | int = 10.0
    seed: int = 0
    gap_limit: float | int = 0.0
    node_limit: int = 0
    max_binaries: int = 0
    cache: sched.ScheduleCache | None = field(default=None, compare=False, repr=False)

    def solver_limits(self) -> dict:
        """These options, checked, as keyword arguments of the solver (see :func:`solver_limits`)."""
        return solver_limits(self.name, self.time_limit, self.seed, self.gap_limit, self.node_limit, self.max_binaries)

    def schedule_cache(self) -> sched.ScheduleCache:
        """The cache handed in, else a fresh in-memory one."""
        return self.cache if self.cache is not None else sched.ScheduleCache(None)
