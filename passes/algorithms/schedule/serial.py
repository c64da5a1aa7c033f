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

from passes.algorithms.schedule.problem import Problem, Schedule


def serial_schedule(problem: Problem, dispatch_s: float = 0.0) -> Schedule:
    """Every op of ``problem`` after the one before it (program order is a topological order:
    an op's operands are produced before it), on all cores of its unit, each no sooner than the
    host issues it (every ``dispatch_s`` seconds)."""
    caps = problem.core_count
    start, end, cores, split = [], [], [], []
    t = 0.0
    issued = 0
    for o in problem.ops:
        c = caps.get(o.unit, 0)
        takes = 0.0 if o.unit == "none" else (o.split if c > 1 else min(o.one, o.split))
        if takes == 0:
            start.append(t)
            end.append(t)
            cores.append(0)
            split.append(False)
            continue
        issued += 1
        t = max(t, issued * dispatch_s)
        start.append(t)
        t += takes
        end.append(t)
        cores.append(c)
        split.append(c > 1)
    return Schedule(
        start=tuple(start),
        end=tuple(end),
        cores=tuple(cores),
        split=tuple(split),
        makespan=t,
        status="optimal",
        gap=0.0,
        lower_bound=t,
        cp_bound=t,
        work_bound=t,
        list_makespan=t,
        method="serial",
    )
