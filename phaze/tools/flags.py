"""Checks of the numbers on a tool's command line, shared by ``phazec`` and ``phaze-validate``:
each is done before any work, and a bad number is one line naming its flag."""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterable

from phaze_ir.errors import PhazeError

#: The largest integer any flag may be: a 32-bit int, as Megatron-LM and torchtitan take these
#: flags (far beyond any real run; a larger one would overflow the DP's or torch's sizes instead).
MAX_INT = 2**31 - 1

#: The solver's counts, 0 meaning no limit.
SOLVER_COUNTS = ("solver_nodes", "solver_max_binaries")


def flag_name(dest: str) -> str:
    """The flag of an argparse destination, as the user may have typed it."""
    return "-j/--jobs" if dest == "jobs" else "--" + dest.replace("_", "-")


def check_positive_ints(args: argparse.Namespace, dests: Iterable[str]) -> None:
    """Each of ``dests`` (when given) in 1..MAX_INT."""
    for dest in dests:
        value = getattr(args, dest, None)
        if value is not None and not 1 <= value <= MAX_INT:
            raise PhazeError(f"{flag_name(dest)} {value}: expected a positive integer up to {MAX_INT}")


def check_solver_limits(args: argparse.Namespace) -> None:
    """The SCIP limits (when given): counts in 0..MAX_INT, a positive, finite time limit and a
    relative gap in [0, 1)."""
    for dest in SOLVER_COUNTS:
        value = getattr(args, dest, None)
        if value is not None and not 0 <= value <= MAX_INT:
            raise PhazeError(f"{flag_name(dest)} {value}: expected a number from 0 (no limit) to {MAX_INT}")
    limit = args.solver_time_limit
    if limit is not None and not (math.isfinite(limit) and limit > 0):
        raise PhazeError(f"--solver-time-limit {limit}: expected a positive, finite number of seconds")
    if not (math.isfinite(args.solver_gap) and 0 <= args.solver_gap < 1):
        raise PhazeError(f"--solver-gap {args.solver_gap}: expected a relative gap in [0, 1)")
