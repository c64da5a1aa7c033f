"""Fit one network level's α–β constants on measured NCCL all-reduce times.

Two fits of the ``a100`` preset's ``node`` level: :func:`fit_level`, one ring for every size
(its own ``bandwidth_Bps`` and ``latency_s``), and :func:`fit_protocols`, its protocols
(``[[network.protocols]]``; docs/design.md §5.5): NCCL runs small and large messages with different protocols
(LL128, Simple), each its own α–β, and the all-reduce takes the faster.

phaze prices a ring all-reduce of ``n`` bytes over ``g`` devices as
``2(g−1)/g · n / bw + 2(g−1) · lat`` (:func:`passes.algorithms.network.ring_all_reduce_s`, the
same formula as the placement DP's).  Both unknowns enter linearly (``1/bw`` and ``lat``), so the
fit is a linear least-squares problem; it minimises the *relative* error (each equation divided
by its measured time), so that 1 MiB and 1 GiB messages weigh alike.

The data are nccl-tests tables (``data/vtrain/nccl_allreduce_a100/``): size in bytes, count,
type, then time (ns) and bus bandwidth out-of-place, then in-place; the fit takes the mean of the
two times.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from passes.algorithms.network import Level, LevelLike, all_reduce_s, collective_s, ring_all_reduce_s


@dataclass(frozen=True)
class Measurement:
    devices: int
    nbytes: int
    time_s: float


@dataclass(frozen=True)
class PublishedBusBandwidth:
    """One published NCCL figure (a row of ``data/published/nccl_h100.csv``): the bus bandwidth
    (bytes/s) of ``collective`` over ``devices`` GPUs at ``nbytes``, as NCCL ran it
    (``algorithm``), and where it was published."""

    devices: int
    collective: str
    algorithm: str
    nbytes: int
    busbw_Bps: float
    source: str


@dataclass(frozen=True)
class Fit:
    bandwidth_Bps: float
    latency_s: float


def load_nccl_tables(directory: str | Path) -> list[Measurement]:
    """Every row of the ``AR_GPU<g>_*.csv`` tables in ``directory``."""
    out = []
    files = sorted(Path(directory).glob("AR_GPU*_*.csv"))
    if not files:
        raise FileNotFoundError(f"{directory}: no AR_GPU<g>_*.csv tables")
    for path in files:
        m = re.match(r"AR_GPU(\d+)_", path.name)
        assert m is not None
        g = int(m.group(1))
        with open(path, newline="") as fh:
            rows = list(csv.reader(fh))
        for row in rows[1:]:
            out.append(Measurement(g, int(row[0]), (float(row[3]) + float(row[5])) / 2 * 1e-9))
    return out


def load_published(path: str | Path) -> list[PublishedBusBandwidth]:
    """The rows of a published bus-bandwidth table (``gpus, collective, nccl algorithm, bytes,
    bus bandwidth (GB/s), source``; lines starting with ``#`` are comments)."""
    with open(path, newline="") as fh:
        rows = [r for r in csv.reader(fh) if r and not r[0].startswith("#")]
    return [
        PublishedBusBandwidth(int(g), kind, algo, int(n), float(bw) * 1e9, src) for g, kind, algo, n, bw, src in rows
    ]


def published_busbw_error(row: PublishedBusBandwidth, levels: list[LevelLike]) -> float:
    """``predicted / published − 1`` of ``row``'s bus bandwidth as phaze prices its collective
    on ``levels`` (nccl-tests' ``busbw``: ``n / t`` times ``2(g−1)/g`` for an all-reduce,
    ``(g−1)/g`` for the others)."""
    g, n = row.devices, float(row.nbytes)
    seconds, _ = collective_s(row.collective, n, g, levels)
    factor = 2.0 * (g - 1) / g if row.collective == "all_reduce" else (g - 1) / g
    return factor * n / seconds / row.busbw_Bps - 1.0


def fit_level(data: list[Measurement]) -> Fit:
    """``bw`` and ``lat`` minimising the squared relative error of the ring all-reduce formula."""
    g = np.array([d.devices for d in data], dtype=float)
    n = np.array([d.nbytes for d in data], dtype=float)
    t = np.array([d.time_s for d in data])
    a = np.stack([2 * (g - 1) / g * n, 2 * (g - 1)], axis=1) / t[:, None]
    (inv_bw, lat), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    return Fit(bandwidth_Bps=float(1 / inv_bw), latency_s=float(lat))


def relative_errors(data: list[Measurement], level: Level) -> np.ndarray:
    """``predicted / measured − 1`` of each measurement, by phaze's own formula."""
    return np.array([ring_all_reduce_s(d.nbytes, d.devices, level) / d.time_s - 1 for d in data])


@dataclass(frozen=True)
class ProtocolFit:
    """One protocol's constants (the keys of ``[[network.protocols]]``) and how many
    measurements it is the faster for."""

    base_s: float
    latency_s: float
    bandwidth_Bps: float
    shard_Bps: float
    measurements: int


def _columns(data: list[Measurement]) -> tuple[np.ndarray, np.ndarray]:
    """The protocol formula's terms, one column per unknown (``base_s``, ``latency_s``,
    ``1/bandwidth_Bps``, ``1/shard_Bps``), and the measured times."""
    g = np.array([d.devices for d in data], dtype=float)
    n = np.array([d.nbytes for d in data], dtype=float)
    t = np.array([d.time_s for d in data])
    return np.stack([np.ones_like(g), 2 * (g - 1), 2 * (g - 1) / g * n, n / g], axis=1), t


def fit_protocols(data: list[Measurement], split_bytes: int = 32 * 2**20, rounds: int = 200) -> list[ProtocolFit]:
    """Two protocols' constants, smaller messages' first: least squares on the relative
    error, alternated with the assignment of each measurement to the protocol that prices it
    faster (the all-reduce takes the least), from a first split at ``split_bytes``.  When the
    assignment comes back to one seen before (a measurement at the crossing flips), the
    cycle's assignment of least squared error is kept.  Every constant must come out positive."""
    cols, t = _columns(data)
    scaled = cols / t[:, None]

    def solve(mask: np.ndarray) -> np.ndarray:
        x, *_ = np.linalg.lstsq(scaled[mask], np.ones(int(mask.sum())), rcond=None)
        return x

    n = np.array([d.nbytes for d in data])
    mask = n < split_bytes
    seen: list[bytes] = []
    states: list[tuple[float, np.ndarray, np.ndarray, np.ndarray]] = []
    for _ in range(rounds):
        key = np.packbits(mask).tobytes()
        x0, x1 = solve(mask), solve(~mask)
        p0, p1 = cols @ x0, cols @ x1
        sse = float(np.sum((np.minimum(p0, p1) / t - 1) ** 2))
        if key in seen:
            states = states[seen.index(key) :]
            break
        seen.append(key)
        states.append((sse, mask, x0, x1))
        mask = p0 <= p1
    _, mask, x0, x1 = min(states, key=lambda s: s[0])
    out = []
    for x, m in ((x0, mask), (x1, ~mask)):
        if not np.all(x > 0):
            raise ValueError(f"the protocol fit gave a non-positive constant: {x}")
        out.append(ProtocolFit(float(x[0]), float(x[1]), float(1 / x[2]), float(1 / x[3]), int(m.sum())))
    return out


def time_errors(data: list[Measurement], levels: list[LevelLike]) -> np.ndarray:
    """``predicted / measured − 1`` of each all-reduce time on ``levels`` (as phaze prices a
    group of ``g`` devices there: protocols, topology and all)."""
    return np.array([all_reduce_s(levels, d.nbytes, d.devices) / d.time_s - 1 for d in data])


def busbw_errors(data: list[Measurement], levels: list[LevelLike]) -> np.ndarray:
    """``predicted / measured − 1`` of each all-reduce's bus bandwidth (nccl-tests' ``busbw =
    algbw · 2(g−1)/g``, ``algbw = n / t``): ``measured time / predicted time − 1``."""
    return np.array([d.time_s / all_reduce_s(levels, d.nbytes, d.devices) - 1 for d in data])
