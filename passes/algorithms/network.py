"""α–β cost of collectives on the levels of the cluster network (pure Python, no xDSL).

These are the formulas of the placement DP's Rust core (``rust/phaze-dp/src/model.rs``:
``Problem::level_for``, ``ring_bandwidth_bps``, ``ring_allreduce_s``, ``p2p_s``), written the
same way, operation for operation, so that Python and Rust give bit-identical floats:

- a group of ``g`` devices communicates on the innermost level whose ``group_size >= g`` (the
  outermost level when none is that large); a group whose consecutive members lie a stride ``s``
  apart is asked with its span ``g · s``;
- a ring over the group runs at the **rail-aware** bandwidth ``bw`` of that level ``i``: at
  ``i = 0`` the level's own ``bandwidth_Bps``; at ``i > 0``, with ``k`` = the group's members
  inside one group of level ``i − 1`` = ``max(1, min(g, inner // s))`` (``inner`` =
  ``levels[i−1].group_size``; contiguous groups, ``s = 1``: ``min(g, inner)``), it is
  ``min(k · bw_i, bw_{i−1})``, and ``bw_i`` itself when ``k = 1``; a level with an ``uplink``
  (the most one inner group sends into it at once, e.g. a node's NICs together) caps it
  further: ``min(…, uplink_i)``;
- ring all-reduce of ``n`` bytes: ``2(g−1)/g · n / bw + 2(g−1) · lat`` (0 when ``g <= 1``);
- point-to-point (``send_recv``) of ``n`` bytes: ``lat + n / bw`` with the level's own ``bw``.

Added here (the DP has no use for them), in the same form:

- ring all-gather and reduce-scatter of ``n`` bytes (``n`` = the *full* tensor: the all-gather's
  result, the reduce-scatter's input): ``(g−1)/g · n / bw + (g−1) · lat`` (0 when ``g <= 1``),
  with the same rail-aware ``bw``.

``bw`` is a level's per-device, per-direction bandwidth (bytes/s) and ``lat`` its per-message
latency (s).  A level is anything with ``group_size``, ``bandwidth_Bps`` and ``latency_s``
(:class:`phaze_ir.hardware.NetworkLevel` or :class:`Level`).

Why rail-aware: NCCL splits a collective over several channels, one ring each, and on a node
with one NIC per GPU (DGX A100: 8 × 200 Gb/s HDR InfiniBand ConnectX-6, one per GPU, DGX A100
datasheet; DGX H100: 8 × 400 Gb/s NDR) the channels' cross-node hops leave through different
NICs ("rail-optimised").  A group with ``k`` members in each node therefore moves ``k`` NICs'
worth of data across nodes at once: on the a100 preset a TP group of 16 GPUs over 2 nodes rings
at ``min(8 × 25e9, 216.5e9) = 200e9`` B/s, not one NIC's 25e9; a DP group of one GPU per node
(TP 8 inside it) is held to its one NIC, 25e9.  Still assumed: the device order puts TP
innermost (then PP, then DP, as the placement DP lays replicas out); groups that share links do
not contend (the concurrent groups of a placement together use at most one NIC per GPU);
point-to-point transfers are unchanged.  :func:`collective_s` prices the IR's tensor-parallel
collectives, whose groups are contiguous (``s = 1``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "COLLECTIVES",
    "Level",
    "level_for",
    "per_inner",
    "ring_bandwidth_Bps",
    "group_level",
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

    @property
    def uplink_Bps(self) -> float | None: ...


@dataclass(frozen=True)
class Level:
    """One network level (innermost first in a sequence)."""

    group_size: int
    bandwidth_Bps: float
    latency_s: float
    uplink_Bps: float | None = None


def level_for(levels: Sequence[LevelLike], g: int) -> int:
    """Index of the level a group of ``g`` devices uses: the innermost with ``group_size >= g``,
    else the last (as ``Problem::level_for`` in Rust)."""
    if not levels:
        raise ValueError("no network levels")
    for i, lv in enumerate(levels):
        if lv.group_size >= g:
            return i
    return len(levels) - 1


def per_inner(g: int, stride: int, inner: int) -> int:
    """Members of a group of ``g`` devices, consecutive members ``stride`` apart, inside one
    group of ``inner`` devices of the level below: ``max(1, min(g, inner // stride))`` (as
    ``per_inner`` in Rust)."""
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    return max(1, min(g, inner // stride))


def ring_bandwidth_Bps(levels: Sequence[LevelLike], index: int, g: int, stride: int = 1) -> float:
    """Rail-aware per-device bandwidth (bytes/s) of a ring over ``g`` devices, consecutive
    members ``stride`` apart, on ``levels[index]`` (module docstring; as
    ``Problem::ring_bandwidth_bps`` in Rust): the level's own at index 0 or with one member per
    inner group, else ``min(k · bw_index, bw_{index−1})``; either capped by the level's ``uplink_Bps``."""
    level = levels[index]
    if index == 0:
        return level.bandwidth_Bps
    below = levels[index - 1]
    k = per_inner(g, stride, below.group_size)
    bw = level.bandwidth_Bps if k <= 1 else min(float(k) * level.bandwidth_Bps, below.bandwidth_Bps)
    return bw if level.uplink_Bps is None else min(bw, level.uplink_Bps)


def group_level(levels: Sequence[LevelLike], g: int, stride: int = 1) -> tuple[int, Level]:
    """(index, effective level) of a ring over ``g`` devices whose consecutive members lie
    ``stride`` apart: the level of the span ``g · stride`` (:func:`level_for`), with its
    bandwidth replaced by :func:`ring_bandwidth_Bps` (its group size and latency kept).  The
    ring formulas below take that level."""
    index = level_for(levels, g * stride)
    level = levels[index]
    bandwidth = ring_bandwidth_Bps(levels, index, g, stride)
    return index, Level(level.group_size, bandwidth, level.latency_s, level.uplink_Bps)


def ring_all_reduce_s(nbytes: float, g: int, level: LevelLike) -> float:
    """``2(g−1)/g · n / bw + 2(g−1) · lat``; 0 when ``g <= 1``.  ``level`` gives ``bw``: pass
    :func:`group_level`'s for a group that spans several inner groups (rail-aware)."""
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


def bytes_sent(kind: str, nbytes: float, g: int) -> float:
    """Bytes one device sends in a collective of ``kind`` over ``g`` devices on a ring (the
    traffic of the time formulas above): ``2(g−1)/g · n`` for an all-reduce, ``(g−1)/g · n``
    for an all-gather or a reduce-scatter, ``n`` for a send/recv; 0 when ``g <= 1``."""
    if kind not in COLLECTIVES:
        raise ValueError(f"unknown collective kind {kind!r}; expected one of {', '.join(COLLECTIVES)}")
    if g <= 1:
        return 0.0
    if kind == "send_recv":
        return float(nbytes)
    share = (g - 1.0) / g * float(nbytes)
    return 2.0 * share if kind == "all_reduce" else share


def collective_s(kind: str, nbytes: float, g: int, levels: Sequence[LevelLike]) -> tuple[float, int]:
    """(seconds, level index) of one collective of ``kind`` over ``g`` contiguous devices (the
    IR's tensor-parallel groups).  ``nbytes`` is the full tensor (the larger of input and
    result).  The rings run at the rail-aware bandwidth; ``send_recv`` at the level's own.  A
    group of one device sends nothing (0 s)."""
    if kind not in COLLECTIVES:
        raise ValueError(f"unknown collective kind {kind!r}; expected one of {', '.join(COLLECTIVES)}")
    index = level_for(levels, g)
    if g <= 1:
        return 0.0, index
    if kind == "send_recv":
        return send_recv_s(nbytes, levels[index]), index
    _, ring = group_level(levels, g)
    if kind == "all_reduce":
        return ring_all_reduce_s(nbytes, g, ring), index
    return all_gather_s(nbytes, g, ring), index
