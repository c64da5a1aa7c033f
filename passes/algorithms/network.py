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
  further by the group's share: ``min(…, uplink_i · k / inner)`` (the groups of one kind, a
  placement's DP or EP groups, run at once and cover every device, so the ``inner / k`` with
  members in one node share its uplink evenly: contention);
- ring all-reduce of ``n`` bytes: ``2(g−1)/g · n / bw + 2(g−1) · lat`` (0 when ``g <= 1``; a
  level with ``tree`` may run it as NCCL's tree instead, below);
- point-to-point (``send_recv``) of ``n`` bytes: ``lat + n / bw`` with the level's own ``bw``;
  a pipeline's transfers between neighbours ``s`` devices apart on a level ``i > 0`` with an
  uplink get at most ``uplink_i / min(s, inner)`` (:func:`p2p_bandwidth_Bps`: that many devices
  of a node send across at once).

Added here (the DP has no use for them), in the same form:

- ring all-gather and reduce-scatter of ``n`` bytes (``n`` = the *full* tensor: the all-gather's
  result, the reduce-scatter's input): ``(g−1)/g · n / bw + (g−1) · lat`` (0 when ``g <= 1``),
  with the same rail-aware ``bw``.

``bw`` is a level's per-device, per-direction bandwidth (bytes/s) and ``lat`` its per-message
latency (s).  A level is anything with ``group_size``, ``bandwidth_Bps`` and ``latency_s``
(:class:`phaze_ir.hardware.NetworkLevel` or :class:`Level`).

Topologies and protocols (``docs/design.md`` §5.5), each a field of a level, absent on the
levels above, which stay as they were bit for bit:

- ``topology = "switch"`` (or absent): the rail-aware rings above.  The a100/h100 presets'
  inner levels are *switched NVLink domains* (every GPU one hop from every other through
  NVSwitch) and their outer levels *rail-optimised GPU pods* (one NIC per GPU, ``k`` rails).
- ``topology = "fat_tree"``: the same rings; a group whose span ``g · s`` exceeds
  ``leaf_size`` crosses leaf switches and its bandwidth is divided by ``oversubscription``
  (the leaves' down-links over their up-links).
- ``topology = "torus"``: :func:`torus_rings` cuts the group into per-dimension rings of
  lengths ``c_j`` (device order: the first dimension fastest; a torus on a torus level counts
  the inner tori's dimensions first, then its own, per axis).  The all-reduce runs the
  dimensions concurrently (the data split over them, each part reduce-scattered dimension by
  dimension, then all-gathered back), so a device's ``2(g−1)/g · n`` bytes leave on ``L``
  links at once, ``L = Σ_j`` 2 for a closed ring of more than 2 (both directions) or 1 for an
  open line or a pair, and the latency is paid per step of every dimension's ring:
  ``2(g−1)/g · n / (L · bw) + 2 · Σ_j (c_j − 1) · lat``.
- ``protocols`` (innermost level only): NCCL-like protocols, each its own α–β with a fixed
  ``base_s`` and an optional un-overlapped pass over a device's shard (``n/g`` at
  ``shard_Bps``); an all-reduce costs the least of them, a ring protocol's
  ``base + 2(g−1)·lat_p + 2(g−1)/g · n / bw_p [+ n/g / shard_p]`` and an NVLink SHARP one's
  (``algorithm = "nvls"``: every device sends its ``n`` bytes into the NVSwitch, which reduces
  them and multicasts the sum back) ``base + 2·lat_p + n / bw_p [+ n/g / shard_p]``; the
  halves (reduce-scatter, all-gather) the least over the ring protocols of
  ``base + (g−1)·lat_p + (g−1)/g · n / bw_p [+ n/g / shard_p]``.
- ``tree = true`` (a switch or fat-tree level ``i > 0`` only; opt-in): an all-reduce there may
  also run as NCCL's tree (a chain through the group's ``k`` members inside each inner group, a
  double binary tree across the ``m = ⌈g / k⌉`` inner groups, pipelined) and costs the less of
  the ring and ``2 · n / bw + 2 · (k − 1) · lat_{i−1} + 2 · ⌈log2 m⌉ · lat_i``
  (:func:`tree_all_reduce_s`), with the same rail-aware ``bw``: NCCL's own tuning model
  (``src/graph/tuning.cc``: the tree's algorithm bandwidth is half its bus bandwidth, its
  latency ``2 · ((k−1) · lat_intra + log2(nodes) · lat_inter)``), which its tuner uses to pick
  the tree for small and medium messages over many nodes (the ring's latency grows with ``g``,
  the tree's with ``log2 m``).  Reduce-scatters, all-gathers and all-to-alls stay rings.

Why rail-aware: NCCL splits a collective over several channels, one ring each, and on a node
with one NIC per GPU (DGX A100: 8 × 200 Gb/s HDR InfiniBand ConnectX-6, one per GPU, DGX A100
datasheet; DGX H100: 8 × 400 Gb/s NDR) the channels' cross-node hops leave through different
NICs ("rail-optimised").  A group with ``k`` members in each node therefore moves ``k`` NICs'
worth of data across nodes at once, up to the node's uplink: on the a100 preset (25e9 per NIC,
a node's 100e9 uplink) a TP group of 16 GPUs over 2 nodes rings at ``min(8 × 25e9, 216.5e9,
100e9) = 100e9`` B/s, not one NIC's 25e9.  Groups that run at once share the uplink: with TP 8
inside each node, the node's 8 GPUs are in 8 DP groups and each rings at ``100e9 / 8 =
12.5e9`` (one NIC, 25e9, without the uplink).  Still assumed: rail links are not shared (one NIC
per device), the groups of one kind run at the same time (a placement's DP all-reduces after
the pipeline's flush), and groups of different kinds do not overlap.  :func:`collective_s`
prices the IR's tensor-parallel collectives, whose groups are contiguous (``s = 1``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol as _Interface

__all__ = [
    "COLLECTIVES",
    "TOPOLOGIES",
    "Level",
    "Protocol",
    "levels_of",
    "torus_rings",
    "ring_steps",
    "all_reduce_s",
    "tree_steps",
    "tree_all_reduce_s",
    "half_ring_s",
    "level_for",
    "per_inner",
    "ring_bandwidth_Bps",
    "p2p_bandwidth_Bps",
    "group_level",
    "ring_all_reduce_s",
    "all_gather_s",
    "reduce_scatter_s",
    "send_recv_s",
    "collective_s",
]

#: The collective kinds priced here (those of ``phaze.collective``).
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")

#: The topologies a level may have (``topology``; absent is ``"switch"``).
TOPOLOGIES = ("switch", "torus", "fat_tree")


class LevelLike(_Interface):
    """What the formulas read from a network level (read-only: frozen dataclasses qualify)."""

    @property
    def group_size(self) -> int: ...

    @property
    def bandwidth_Bps(self) -> float: ...

    @property
    def latency_s(self) -> float: ...

    @property
    def uplink_Bps(self) -> float | None: ...

    @property
    def topology(self) -> str | None: ...

    @property
    def torus_dims(self) -> tuple[int, ...] | None: ...

    @property
    def leaf_size(self) -> int | None: ...

    @property
    def oversubscription(self) -> float | None: ...

    @property
    def protocols(self) -> Sequence[ProtocolLike] | None: ...

    @property
    def tree(self) -> bool | None: ...


class ProtocolLike(_Interface):
    """What the formulas read from a level's protocol."""

    @property
    def bandwidth_Bps(self) -> float: ...

    @property
    def latency_s(self) -> float: ...

    @property
    def base_s(self) -> float: ...

    @property
    def shard_Bps(self) -> float | None: ...

    @property
    def algorithm(self) -> str | None: ...


@dataclass(frozen=True)
class Protocol:
    """One protocol of a level's collectives (module docstring): a fixed ``base_s`` per
    collective, ``latency_s`` per ring step (per switch pass with NVLS), ``bandwidth_Bps`` per
    device and direction, an optional ``shard_Bps`` for the pass over a device's own ``n/g``
    bytes, and its ``algorithm``: ``None`` or ``"ring"``, or ``"nvls"`` (all-reduces only)."""

    bandwidth_Bps: float
    latency_s: float
    base_s: float = 0.0
    shard_Bps: float | None = None
    algorithm: str | None = None


def _nvls(p: ProtocolLike) -> bool:
    """Whether ``p`` is NVLink SHARP (an all-reduce reduced in the switch), not a ring."""
    return p.algorithm == "nvls"


@dataclass(frozen=True)
class Level:
    """One network level (innermost first in a sequence).  ``topology`` ``None`` is a switch;
    ``torus_dims`` with a torus; ``leaf_size`` and ``oversubscription`` with a fat tree;
    ``protocols`` (innermost level only) price its ring collectives instead of
    ``bandwidth_Bps`` and ``latency_s``; ``tree`` (a level above the innermost) lets its
    all-reduces run as NCCL's tree when that is faster."""

    group_size: int
    bandwidth_Bps: float
    latency_s: float
    uplink_Bps: float | None = None
    topology: str | None = None
    torus_dims: tuple[int, ...] | None = None
    leaf_size: int | None = None
    oversubscription: float | None = None
    protocols: tuple[Protocol, ...] | None = None
    tree: bool = False


def levels_of(network: Sequence[LevelLike]) -> tuple[Level, ...]:
    """:class:`Level` copies of a description's levels (``Accelerator.network``), every
    field the formulas read kept."""
    out = []
    for lv in network:
        protocols = lv.protocols
        out.append(
            Level(
                int(lv.group_size),
                float(lv.bandwidth_Bps),
                float(lv.latency_s),
                lv.uplink_Bps,
                lv.topology,
                lv.torus_dims,
                lv.leaf_size,
                lv.oversubscription,
                None
                if protocols is None
                else tuple(
                    Protocol(p.bandwidth_Bps, p.latency_s, p.base_s, p.shard_Bps, p.algorithm) for p in protocols
                ),
                bool(lv.tree),
            )
        )
    return tuple(out)


def _topology(level: LevelLike) -> str:
    return level.topology or "switch"


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
    inner group, else ``min(k · bw_index, bw_{index−1})``; either capped by the group's share of
    the level's ``uplink_Bps``, ``uplink · k / inner``."""
    level = levels[index]
    topology = _topology(level)
    if topology == "torus":
        _, links = torus_rings(levels, index, g, stride)
        return float(max(1, links)) * level.bandwidth_Bps
    if index == 0:
        bw = level.bandwidth_Bps
    else:
        below = levels[index - 1]
        k = per_inner(g, stride, below.group_size)
        bw = level.bandwidth_Bps if k <= 1 else min(float(k) * level.bandwidth_Bps, below.bandwidth_Bps)
        bw = bw if level.uplink_Bps is None else min(bw, level.uplink_Bps * float(k) / float(below.group_size))
    if topology == "fat_tree" and level.leaf_size is not None and g * stride > level.leaf_size:
        bw = bw / (level.oversubscription or 1.0)
    return bw


def torus_rings(levels: Sequence[LevelLike], index: int, g: int, stride: int = 1) -> tuple[list[int], int]:
    """(ring length per axis, links ``L``) of a group of ``g`` devices, consecutive members
    ``stride`` apart, on the torus level ``levels[index]`` (as ``Problem::torus_rings`` in
    Rust).  The device order runs the digits of a mixed radix, fastest first: the level's
    ``torus_dims`` (in devices), or, on a torus level above a torus level, the inner torus's
    dimensions then the level's own (in inner tori), axis by axis.  The stride skips whole
    digits (or part of one); the group takes ``min(rest, radix // pos)`` along each digit
    after it, the rest rounded up (a group that is no sub-block is priced as the block that
    holds it).  An axis's ring is closed when it fills the axis of the inner torus (the
    wraparound, or the inner tori's circuit switches, close it) or the level's own, open
    otherwise; ``L`` adds 2 for a closed ring longer than 2 (both directions) and 1 for an open
    one or a pair."""
    level = levels[index]
    dims = list(level.torus_dims or ())
    axes = len(dims)
    inner: list[int] = []
    if index > 0 and _topology(levels[index - 1]) == "torus":
        inner = list(levels[index - 1].torus_dims or ())
    radices = inner + dims
    counts = [1] * len(radices)
    pos = stride
    rest = g
    for i, radix in enumerate(radices):
        if rest <= 1:
            break
        if pos >= radix:
            pos = pos // radix
            continue
        take = min(rest, radix // pos)
        counts[i] = take
        rest = (rest + take - 1) // take
        pos = 1
    if rest > 1:
        counts[-1] = counts[-1] * rest
    lengths = []
    links = 0
    for j in range(axes):
        if inner:
            c = counts[j] * counts[axes + j]
            closed = counts[j] == inner[j] or counts[axes + j] == dims[j]
        else:
            c = counts[j]
            closed = c == dims[j]
        lengths.append(c)
        if c > 1:
            links += 2 if closed and c > 2 else 1
    return lengths, links


def ring_steps(levels: Sequence[LevelLike], index: int, g: int, stride: int = 1) -> int:
    """Steps of one half (reduce-scatter or all-gather) of a ring collective over ``g``
    devices on ``levels[index]``: ``g − 1``, or ``Σ_j (c_j − 1)`` on a torus (as
    ``Problem::ring_steps`` in Rust)."""
    if _topology(levels[index]) == "torus":
        lengths, _ = torus_rings(levels, index, g, stride)
        return sum(c - 1 for c in lengths)
    return g - 1


def all_reduce_s(levels: Sequence[LevelLike], nbytes: float, g: int, stride: int = 1) -> float:
    """All-reduce of ``n`` bytes over ``g`` devices, consecutive members ``stride`` apart, on
    the level of the span ``g · stride`` (module docstring; as ``Problem::ring_allreduce_s``
    in Rust): the least of the level's protocols, or ``2(g−1)/g · n / bw + 2 · steps · lat``
    with :func:`ring_bandwidth_Bps` and :func:`ring_steps`, or on a level with ``tree`` the
    less of that and :func:`tree_all_reduce_s`; 0 when ``g <= 1``."""
    if g <= 1:
        return 0.0
    index = level_for(levels, g * stride)
    level = levels[index]
    gf = float(g)
    protocols = level.protocols
    if protocols:
        best = math.inf
        for p in protocols:
            if _nvls(p):
                t = p.base_s + 2.0 * p.latency_s + float(nbytes) / p.bandwidth_Bps
            else:
                t = p.base_s + 2.0 * (gf - 1.0) * p.latency_s + 2.0 * (gf - 1.0) / gf * float(nbytes) / p.bandwidth_Bps
            if p.shard_Bps is not None:
                t = t + float(nbytes) / gf / p.shard_Bps
            best = min(best, t)
        return best
    bw = ring_bandwidth_Bps(levels, index, g, stride)
    steps = float(ring_steps(levels, index, g, stride))
    ring = 2.0 * (gf - 1.0) / gf * float(nbytes) / bw + 2.0 * steps * level.latency_s
    if index > 0 and level.tree:
        return min(ring, tree_all_reduce_s(levels, index, nbytes, g, stride, bw))
    return ring


def tree_steps(levels: Sequence[LevelLike], index: int, g: int, stride: int = 1) -> tuple[int, int]:
    """(steps of the chain inside an inner group, depth of the tree across them) of NCCL's tree
    all-reduce over ``g`` devices, consecutive members ``stride`` apart, on ``levels[index]``
    (``index > 0``; as ``Problem::tree_steps`` in Rust): ``k − 1`` with ``k`` =
    :func:`per_inner` members per inner group, and ``⌈log2 m⌉`` over the ``m = ⌈g / k⌉`` inner
    groups spanned."""
    k = per_inner(g, stride, levels[index - 1].group_size)
    m = (g + k - 1) // k
    return k - 1, (m - 1).bit_length()


def tree_all_reduce_s(levels: Sequence[LevelLike], index: int, nbytes: float, g: int, stride: int, bw: float) -> float:
    """NCCL's tree all-reduce of ``n`` bytes over ``g`` devices on ``levels[index]`` (``index >
    0``; module docstring): ``2 · n / bw + 2 · (k − 1) · lat_{index−1} + 2 · ⌈log2 m⌉ ·
    lat_index`` with :func:`tree_steps` and ``bw`` the rail-aware ring bandwidth (as
    ``Problem::tree_allreduce_s`` in Rust).  The inner level's ``latency_s`` is taken even
    where protocols price its own rings."""
    chain, depth = tree_steps(levels, index, g, stride)
    return (
        2.0 * float(nbytes) / bw
        + 2.0 * float(chain) * levels[index - 1].latency_s
        + 2.0 * float(depth) * levels[index].latency_s
    )


def half_ring_s(levels: Sequence[LevelLike], nbytes: float, g: int, stride: int = 1) -> float:
    """Reduce-scatter (or all-gather) whose full tensor is ``n`` bytes, as :func:`all_reduce_s`
    with half its traffic and steps (as ``Problem::ring_reduce_scatter_s`` in Rust)."""
    if g <= 1:
        return 0.0
    index = level_for(levels, g * stride)
    level = levels[index]
    gf = float(g)
    protocols = level.protocols
    if protocols:
        best = math.inf
        for p in protocols:
            if _nvls(p):  # NVLink SHARP reduces all-reduces only
                continue
            t = p.base_s + (gf - 1.0) * p.latency_s + (gf - 1.0) / gf * float(nbytes) / p.bandwidth_Bps
            if p.shard_Bps is not None:
                t = t + float(nbytes) / gf / p.shard_Bps
            best = min(best, t)
        return best
    bw = ring_bandwidth_Bps(levels, index, g, stride)
    steps = float(ring_steps(levels, index, g, stride))
    return (gf - 1.0) / gf * float(nbytes) / bw + steps * level.latency_s


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


def p2p_bandwidth_Bps(levels: Sequence[LevelLike], index: int, stride: int) -> float:
    """Per-device bandwidth (bytes/s) of a pipeline's point-to-point transfers on
    ``levels[index]``, neighbours ``stride`` devices apart (as ``Problem::p2p_bandwidth_bps``
    in Rust): the level's own, at most ``uplink / min(stride, inner)`` on a level with an
    uplink (that many devices of one inner group send across at once)."""
    level = levels[index]
    if index == 0 or level.uplink_Bps is None:
        return level.bandwidth_Bps
    senders = max(1, min(stride, levels[index - 1].group_size))
    return min(level.bandwidth_Bps, level.uplink_Bps / float(senders))


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
    if kind == "all_reduce":
        return all_reduce_s(levels, nbytes, g), index
    return half_ring_s(levels, nbytes, g), index
