"""α–β cost of collectives on the levels of the cluster network (pure Python, no xDSL).

These are the formulas of the placement DP's Rust core (``rust/phaze-dp/src/model.rs``:
``Problem::level_for``, ``ring_allreduce_s``, ``p2p_s``), written the same way, operation for
operation, so that Python and Rust give bit-identical floats:

- a group of ``g`` devices communicates on the innermost level whose ``group_size >= g`` (the
  outermost level when none is that large);
- ring all-reduce of ``n`` bytes: ``2(g−1)/g · n / bw + 2(g−1) · lat`` (0 when ``g <= 1``);
- point-to-point (``send_recv``) of ``n`` bytes: ``lat + n / bw``.

Added here (the DP has no use for them), in the same form:

- ring all-gather and reduce-scatter of ``n`` bytes (``n`` = the *full* tensor: the all-gather's
  result, the reduce-scatter's input): ``(g−1)/g · n / bw + (g−1) · lat`` (0 when ``g <= 1``).

``bw`` is a level's per-device, per-direction bandwidth (bytes/s) and ``lat`` its per-message
latency (s).  A level is anything with ``group_size``, ``bandwidth_Bps`` and ``latency_s``
(:class:`phaze_ir.hardware.NetworkLevel` or :class:`Level`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "COLLECTIVES",
    "Level",
    "level_for",
    "ring_all_reduce_s",
    "all_gather_s",
    "reduce_scatter_s",
    "send_recv_s",
    "collective_s",
]

#: The collective kinds priced here (those of ``phaze.collective``).
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")


class LevelLike(Protocol):
    """What the formulas read from a network level (read-only: frozen dataclasses qualify)."""

    @property
    def group_size(self) -> int: ...

    @property
    def bandwidth_Bps(self) -> float: ...

    @property
    def latency_s(self) -> float: ...


@dataclass(frozen=True)
class Level:
    """One network level (innermost first in a sequence)."""

    group_size: int
    bandwidth_Bps: float
    latency_s: float


def level_for(levels: Sequence[LevelLike], g: int) -> int:
    """Index of the level a group of ``g`` devices uses: the innermost with ``group_size >= g``,
    else the last (as ``Problem::level_for`` in Rust)."""
    if not levels:
        raise ValueError("no network levels")
    for i, lv in enumerate(levels):
        if lv.group_size >= g:
            return i
    return len(levels) - 1


def ring_all_reduce_s(nbytes: float, g: int, level: LevelLike) -> float:
    """``2(g−1)/g · n / bw + 2(g−1) · lat``; 0 when ``g <= 1``."""
    if g <= 1:
        return 0.0
    gf = float(g)
    return 2.0 * (gf - 1.0) / gf * float(nbytes) / level.bandwidth_Bps + 2.0 * (gf - 1.0) * level.latency_s


def all_gather_s(nbytes: float, g: int, level: LevelLike) -> float:
    """Ring all-gather whose *result* is ``n`` bytes: ``(g−1)/g · n / bw + (g−1) · lat``."""
    if g <= 1:
        return 0.0
    gf = float(g)
    return (gf - 1.0) / gf * float(nbytes) / level.bandwidth_Bps + (gf - 1.0) * level.latency_s


def reduce_scatter_s(nbytes: float, g: int, level: LevelLike) -> float:
    """Ring reduce-scatter whose *input* is ``n`` bytes: the same cost as an all-gather of ``n``."""
    return all_gather_s(nbytes, g, level)


def send_recv_s(nbytes: float, level: LevelLike) -> float:
    """Point-to-point transfer: ``lat + n / bw``."""
    return level.latency_s + float(nbytes) / level.bandwidth_Bps


def collective_s(kind: str, nbytes: float, g: int, levels: Sequence[LevelLike]) -> tuple[float, int]:
    """(seconds, level index) of one collective of ``kind`` over ``g`` devices.  ``nbytes`` is the
    full tensor (the larger of input and result).  A group of one device sends nothing (0 s)."""
    if kind not in COLLECTIVES:
        raise ValueError(f"unknown collective kind {kind!r}; expected one of {', '.join(COLLECTIVES)}")
    index = level_for(levels, g)
    level = levels[index]
    if g <= 1:
        return 0.0, index
    if kind == "all_reduce":
        return ring_all_reduce_s(nbytes, g, level), index
    if kind == "send_recv":
        return send_recv_s(nbytes, level), index
    return all_gather_s(nbytes, g, level), index
