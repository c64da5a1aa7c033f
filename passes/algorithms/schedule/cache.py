"""Schedules by problem, in memory and optionally on disk: identical layers, and the same layer
of another architecture candidate, are solved once."""

from __future__ import annotations

import json
import os

from passes.algorithms.schedule.problem import Problem, Schedule
from passes.algorithms.schedule.solve import SOLVER_REVISION, solve


class ScheduleCache:
    """Schedules by problem (:meth:`Problem.key` of :meth:`Problem.canonical`: ops' units and
    durations, edges, the core counts that matter): identical layers, and the same layer under
    the same latencies in another architecture candidate, are solved once.  An optional
    directory keeps them across processes and runs (one JSON file per key, written atomically;
    an interrupted search resumes from it).

    A result is reused only for the solver limits it was computed with (time, gap, node and
    binaries limits) and by the same :data:`SOLVER_REVISION`, or whatever they are when it is
    proven optimal: a cached answer is then always the
    answer a fresh solve would give (exactly so when the node limit, not the clock, stops SCIP)."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self._mem: dict[str, tuple[Schedule, tuple]] = {}
        self.directory = os.fspath(directory) if directory is not None else None
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._mem)

    def clear(self) -> None:
        """Forget the in-process entries (the directory, if any, stays)."""
        self._mem.clear()
        self.hits = self.misses = 0

    @staticmethod
    def limits(
        time_limit: float,
        gap_limit: float,
        node_limit: int | None,
        max_binaries: int | None = None,
        revision: int = SOLVER_REVISION,
    ) -> tuple:
        """What a cached entry must match to be reused (unless optimal): the limits and the
        solver's revision."""
        return (
            float(time_limit),
            float(gap_limit),
            None if node_limit is None else int(node_limit),
            None if max_binaries is None else int(max_binaries),
            int(revision),
        )

    def _entry(self, key: str) -> tuple[Schedule, tuple] | None:
        entry = self._mem.get(key)
        if entry is None and self.directory is not None:
            path = os.path.join(self.directory, key + ".json")
            if os.path.exists(path):
                try:
                    with open(path) as fh:
                        data = json.load(fh)
                    entry = (
                        Schedule.from_json(data["schedule"]),
                        self.limits(
                            data["time_limit"],
                            data["gap_limit"],
                            data.get("node_limit"),
                            data.get("max_binaries"),
                            data.get("revision", 1),
                        ),
                    )
                except (OSError, ValueError, KeyError, TypeError):
                    return None  # a torn or foreign file: solve again and overwrite it
                self._mem[key] = entry
        return entry

    def lookup(self, canonical: Problem, limits: tuple) -> Schedule | None:
        """The cached schedule of a canonical problem under ``limits`` (:meth:`limits`)."""
        entry = self._entry(canonical.key())
        if entry is not None and (entry[0].status == "optimal" or entry[1] == limits):
            return entry[0]
        return None

    def get(
        self,
        problem: Problem,
        time_limit: float = 10.0,
        gap_limit: float = 0.0,
        node_limit: int | None = None,
        max_binaries: int | None = None,
    ) -> Schedule | None:
        hit = self.lookup(problem.canonical(), self.limits(time_limit, gap_limit, node_limit, max_binaries))
        return hit.on(problem) if hit is not None else None

    def store(self, canonical: Problem, schedule: Schedule, limits: tuple) -> None:
        """Keep the schedule of a canonical problem solved under ``limits``."""
        key = canonical.key()
        self._mem[key] = (schedule, limits)
        if self.directory is not None:
            os.makedirs(self.directory, exist_ok=True)
            tmp = os.path.join(self.directory, f".{key}.{os.getpid()}.tmp")
            time_limit, gap_limit, node_limit, max_binaries, revision = limits
            with open(tmp, "w") as fh:
                json.dump(
                    {
                        "time_limit": time_limit,
                        "gap_limit": gap_limit,
                        "node_limit": node_limit,
                        "max_binaries": max_binaries,
                        "revision": revision,
                        "schedule": schedule.to_json(),
                    },
                    fh,
                )
            os.replace(tmp, os.path.join(self.directory, key + ".json"))

    def put(
        self,
        problem: Problem,
        schedule: Schedule,
        time_limit: float,
        gap_limit: float = 0.0,
        node_limit: int | None = None,
        max_binaries: int | None = None,
    ) -> None:
        """Keep ``schedule``, a schedule of ``problem.canonical()`` (what :meth:`solve` solves)."""
        self.store(problem.canonical(), schedule, self.limits(time_limit, gap_limit, node_limit, max_binaries))

    def solve(
        self,
        problem: Problem,
        time_limit: float = 10.0,
        seed: int = 0,
        backend: str = "scip",
        gap_limit: float = 0.0,
        node_limit: int | None = None,
        max_binaries: int | None = None,
    ) -> Schedule:
        """:func:`solve` through the cache (on the canonical problem, so that the answer does
        not depend on which equivalent problem was asked first)."""
        canonical = problem.canonical()
        limits = self.limits(time_limit, gap_limit, node_limit, max_binaries)
        hit = self.lookup(canonical, limits)
        if hit is not None:
            self.hits += 1
            return hit.on(problem)
        self.misses += 1
        schedule = solve(
            canonical,
            time_limit=time_limit,
            seed=seed,
            backend=backend,
            gap_limit=gap_limit,
            node_limit=node_limit,
            max_binaries=max_binaries,
        )
        self.store(canonical, schedule, limits)
        return schedule.on(problem)
