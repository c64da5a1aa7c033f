"""Schedules by problem, in memory and optionally on disk: identical layers, and the same layer
of another architecture candidate, are solved once.

On disk, one entry per problem in the cache's store (:class:`passes.cache_file.Store`:
kind ``schedule``, ``<directory>/schedule/<key>.json``, keyed by the canonical problem's
:meth:`~.problem.Problem.key` under :data:`ENVIRONMENT`; its file holds that key as input hash
and a content hash).  Its environment is the solver's revision, not the sources' digest the
computed stages are keyed by: a schedule is checked against its problem when it is read (below),
so it outlives any edit that does not change the solver (which bumps :data:`SOLVER_REVISION`).
In memory, the schedules read or solved are kept by the same keys.  A file is
data that whoever can write the directory may have changed, so an entry read from it is used
only once it is checked against the problem it is looked up for (:func:`check_entry`): the
hashes, the schema, a valid schedule of that problem (:func:`~.problem.check_schedule`), its
makespan, and its bounds against the critical path and the energetic (work) bound recomputed
from the problem.  An entry that fails is ignored with a one-line :class:`~phaze_ir.warning.PhazeWarning`
naming the file and the reason, solved again and overwritten.  What stays unchecked: a valid
schedule that is slower than the solver's and says so consistently (only solving again tells).
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import fields
from pathlib import Path
from typing import Any

from passes.algorithms.schedule.prepared import lower_bounds
from passes.algorithms.schedule.problem import Problem, Schedule, check_schedule
from passes.algorithms.schedule.solve import SOLVER_REVISION, solve
from passes.cache_file import BadEntry, StaleEntry, Store, is_int, is_number
from phaze_ir.warning import PhazeWarning

#: The store's kind of entry a schedule is, and what its entries belong to (in every key).
KIND = "schedule"
ENVIRONMENT = f"schedule solver revision {SOLVER_REVISION}"
#: What a schedule's ``status`` and ``method`` may be (see :class:`~.problem.Schedule`).
STATUSES = ("optimal", "gaplimit", "nodelimit", "timelimit", "heuristic")
METHODS = ("ilp", "list", "trivial", "serial")
_LIMIT_KEYS = ("time_limit", "gap_limit", "node_limit", "max_binaries", "revision")
_REL = 1e-9


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= _REL * max(abs(a), abs(b), 1e-300)


def _schedule_of(d: Any, n: int) -> Schedule:
    """The :class:`Schedule` of a payload's ``schedule`` for a problem of ``n`` ops, or
    :class:`BadEntry` if it does not have the schema (types, lengths, known names)."""
    names = [f.name for f in fields(Schedule)]
    if not isinstance(d, dict) or sorted(d) != sorted(names):
        raise BadEntry(f"has a schedule without exactly the fields {', '.join(names)}")
    for k in ("start", "end", "cores", "split"):
        if not isinstance(d[k], list) or len(d[k]) != n:
            raise BadEntry(f"has {k} that is not a list of {n} values (one per op)")
    if not all(is_number(x) for x in d["start"] + d["end"]):
        raise BadEntry("has start or end times that are not finite numbers")
    if not all(is_int(c) and c >= 0 for c in d["cores"]) or not all(isinstance(b, bool) for b in d["split"]):
        raise BadEntry("has core counts that are not counts or split flags that are not booleans")
    for k in ("makespan", "gap", "lower_bound", "cp_bound", "work_bound", "list_makespan", "solve_s"):
        if not is_number(d[k]) or d[k] < 0:
            raise BadEntry(f"has a {k} that is not a finite number >= 0")
    if d["status"] not in STATUSES:
        raise BadEntry(f"has a status {d['status']!r} not one of {', '.join(STATUSES)}")
    if d["method"] not in METHODS:
        raise BadEntry(f"has a method {d['method']!r} not one of {', '.join(METHODS)}")
    if not is_int(d["num_binaries"]) or d["num_binaries"] < 0:
        raise BadEntry("has a num_binaries that is not a count")
    if d["warm_start_accepted"] not in (None, True, False):
        raise BadEntry("has a warm_start_accepted that is not a boolean or null")
    return Schedule.from_json(d)


def _limits_of(d: Any) -> tuple:
    if not isinstance(d, dict) or sorted(d) != sorted((*_LIMIT_KEYS, "schedule")):
        raise BadEntry(f"has not exactly the fields {', '.join(_LIMIT_KEYS)}, schedule")
    if not (is_number(d["time_limit"]) or d["time_limit"] is None) or not is_number(d["gap_limit"]):
        raise BadEntry("has a time or gap limit that is not a number")
    for k in ("node_limit", "max_binaries"):
        if d[k] is not None and not is_int(d[k]):
            raise BadEntry(f"has a {k} that is not an integer or null")
    if not is_int(d["revision"]):
        raise BadEntry("has a solver revision that is not an integer")
    time_limit = math.inf if d["time_limit"] is None else d["time_limit"]  # JSON has no infinity
    return ScheduleCache.limits(time_limit, *(d[k] for k in _LIMIT_KEYS[1:]))


def check_entry(problem: Problem, schedule: Schedule) -> str | None:
    """Why ``schedule`` cannot be what :func:`solve` returned for ``problem`` (None when it can):
    a schedule that breaks the problem's rules, a makespan that is not its last end, bounds that
    are not the problem's own (critical path, work bound) or that a valid schedule could not
    have (a makespan below them, a lower bound above the makespan), a gap that does not follow."""
    errors = check_schedule(problem, schedule.start, schedule.end, schedule.cores)
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return f"is not a valid schedule of its problem: {errors[0]}{more}"
    caps = problem.core_count
    for i, (o, c, sp) in enumerate(zip(problem.ops, schedule.cores, schedule.split)):
        if sp != (c > 1) or (sp and c != caps.get(o.unit)):
            return f"has op {i} split={sp} on {c} core(s)"
    makespan = max(schedule.end, default=0.0)
    if not _close(schedule.makespan, makespan):
        return f"has a makespan {schedule.makespan!r} that is not its last end {makespan!r}"
    cp, work = lower_bounds(problem)
    if not (_close(schedule.cp_bound, cp) and _close(schedule.work_bound, work)):
        return (
            f"has bounds (critical path {schedule.cp_bound!r}, work {schedule.work_bound!r}) that are "
            f"not its problem's ({cp!r}, {work!r})"
        )
    bound = max(cp, work)
    if makespan < bound * (1 - _REL):
        return f"has a makespan {makespan!r} below its problem's lower bound {bound!r}"
    if not (bound * (1 - _REL) <= schedule.lower_bound <= makespan * (1 + _REL)):
        return f"has a lower bound {schedule.lower_bound!r} not between {bound!r} and its makespan {makespan!r}"
    if makespan > schedule.list_makespan * (1 + _REL):
        return f"has a makespan {makespan!r} above its warm start's {schedule.list_makespan!r}"
    gap = (makespan - schedule.lower_bound) / makespan if makespan > 0 else 0.0
    if abs(schedule.gap - gap) > 1e-9:
        return f"has a gap {schedule.gap!r} that does not follow from its makespan and lower bound ({gap!r})"
    return None


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
        self.entries = Store(Path(directory) if directory is not None else None, ENVIRONMENT)
        self._mem: dict[str, tuple[Schedule, tuple]] = {}
        self.hits = 0
        self.misses = 0

    @property
    def directory(self) -> Path | None:
        """The cache directory whose ``schedule/`` entries are read and written (None: memory only)."""
        return self.entries.directory

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

    def key(self, canonical: Problem) -> str:
        """The store's key of a canonical problem's entry."""
        return self.entries.key(KIND, canonical.key())

    def file(self, canonical: Problem) -> Path | None:
        """Where a canonical problem's entry lies (None without a directory)."""
        return self.entries.file(KIND, self.key(canonical))

    def _entry(self, canonical: Problem) -> tuple[Schedule, tuple] | None:
        key = self.key(canonical)
        entry = self._mem.get(key)
        if entry is None and self.entries.directory is not None:
            try:
                entry = self._read(key, canonical)
            except StaleEntry:
                # One line for all of them: a cache from before a format change holds many.
                warnings.warn(
                    f"schedule cache {self.entries.directory}: entries of another format version are "
                    "ignored and solved again",
                    PhazeWarning,
                    stacklevel=2,
                )
                return None
            except BadEntry as e:
                file = self.entries.file(KIND, key)
                warnings.warn(f"schedule cache entry {file} {e}: ignored, solved again", PhazeWarning, stacklevel=2)
                return None
            if entry is not None:
                self._mem[key] = entry
        return entry

    def _read(self, key: str, canonical: Problem) -> tuple[Schedule, tuple] | None:
        """The stored entry of ``key`` for ``canonical``, checked (:func:`check_entry`), None when
        there is none, or :class:`BadEntry` saying why it cannot be used."""
        payload = self.entries.read(KIND, key)
        if payload is None:
            return None
        limits = _limits_of(payload)
        schedule = _schedule_of(payload["schedule"], len(canonical.ops))
        why = check_entry(canonical, schedule)
        if why is not None:
            raise BadEntry(why)
        return schedule, limits

    def lookup(self, canonical: Problem, limits: tuple) -> Schedule | None:
        """The cached schedule of a canonical problem under ``limits`` (:meth:`limits`)."""
        entry = self._entry(canonical)
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
        key = self.key(canonical)
        self._mem[key] = (schedule, limits)
        if self.entries.directory is not None:
            time_limit, gap_limit, node_limit, max_binaries, revision = limits
            payload = {
                "time_limit": time_limit if math.isfinite(time_limit) else None,
                "gap_limit": gap_limit,
                "node_limit": node_limit,
                "max_binaries": max_binaries,
                "revision": revision,
                "schedule": schedule.to_json(),
            }
            try:
                self.entries.write(KIND, key, payload)
            except OSError as e:
                warnings.warn(
                    f"schedule cache directory {self.entries.directory} is not usable ({e.strerror or e}); "
                    "schedules are kept in memory only",
                    PhazeWarning,
                    stacklevel=2,
                )
                self.entries.directory = None

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
