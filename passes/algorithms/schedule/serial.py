"""The schedule of a chip that runs one op at a time (``[calibration] execution = "serial"``).

A GPU running a training framework's single CUDA stream executes one kernel after the other,
each on the whole chip: a layer's ops run in program order, every op split over all cores of its
unit, none beside another.  The host issues them one every ``dispatch_s`` seconds, ahead of the
chip (launches are asynchronous): op ``i`` is issued at ``(i + 1) · dispatch_s`` (counting the ops
that take time) and starts at the later of that and the end of op ``i - 1``.  Long ops hide the
host; a run of short ones waits for it.  That schedule is the model's exact answer (nothing to
search, no solver); with ``dispatch_s = 0`` its makespan is the sum of the ops' times.
"""

from __future__ import annotations

from collections.abc import Sequence

from passes.algorithms.schedule.problem import Problem, Schedule


def serial_times(durations: Sequence[float], dispatch_s: float = 0.0) -> tuple[list[float], float]:
    """(start of each op, makespan) of ops of these durations run one after the other, each no
    sooner than the host issues it: the ``i``-th op that takes time is issued at
    ``i · dispatch_s`` (ops that take no time start where the chip is and are not issued)."""
    start = []
    t = 0.0
    issued = 0
    for takes in durations:
        if takes > 0:
            issued += 1
            t = max(t, issued * dispatch_s)
        start.append(t)
        t += takes
    return start, t


def serial_schedule(problem: Problem, dispatch_s: float = 0.0) -> Schedule:
    """Every op of ``problem`` after the one before it (program order is a topological order:
    an op's operands are produced before it), on all cores of its unit, each no sooner than the
    host issues it (every ``dispatch_s`` seconds)."""
    caps = problem.core_count
    held = [0 if o.unit == "none" else caps.get(o.unit, 0) for o in problem.ops]
    # split over all cores of its unit; a unit of one core (the network) runs the faster form
    takes = [
        0.0 if c == 0 else (o.split if c > 1 else min(o.one, o.split)) for o, c in zip(problem.ops, held, strict=True)
    ]
    start, makespan = serial_times(takes, dispatch_s)
    cores = [c if d > 0 else 0 for c, d in zip(held, takes, strict=True)]
    return Schedule(
        start=tuple(start),
        end=tuple(a + d for a, d in zip(start, takes, strict=True)),
        cores=tuple(cores),
        split=tuple(c > 1 for c in cores),
        makespan=makespan,
        status="optimal",
        gap=0.0,
        lower_bound=makespan,
        cp_bound=makespan,
        work_bound=makespan,
        list_makespan=makespan,
        method="serial",
    )
