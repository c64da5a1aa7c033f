"""Pareto fronts of the architectures a search evaluated (pure Python, no xDSL).

A point is on the front when no other point is at least as good on every axis and better on
one; exact duplicates of a front point are all on it.  Every axis is minimized (negate one to
maximize it).  Points in lexicographic order can only be dominated by earlier ones, and a point
dominated by a dominated point is dominated by that one's dominator too, so each point is
checked against the front found so far: ``O(n · front)``, not ``O(n²)``, which matters for a
``--no-prune`` search of the paper's space (about 88,000 points).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["front_indices"]


def _dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    return all(x <= y for x, y in zip(a, b)) and any(x < y for x, y in zip(a, b))


def front_indices(rows: Sequence[Sequence[float | None]]) -> list[int]:
    """Indices of the Pareto-optimal rows (every coordinate minimized), in lexicographic order
    of the rows (then index).  Rows with a missing or non-finite coordinate are never on it."""
    keyed: list[tuple[tuple[float, ...], int]] = []
    for i, row in enumerate(rows):
        values = [x for x in row if x is not None and math.isfinite(x)]
        if len(values) == len(row):
            keyed.append((tuple(values), i))
    keyed.sort()
    front: list[tuple[tuple[float, ...], int]] = []
    for row, i in keyed:
        if not any(_dominates(f, row) for f, _ in front):
            front.append((row, i))
    return [i for _, i in front]
