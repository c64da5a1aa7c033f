"""Fit one network level's α–β constants on measured NCCL all-reduce times.

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

from passes.algorithms.network import Level, ring_all_reduce_s


@dataclass(frozen=True)
class Measurement:
    devices: int
    nbytes: int
    time_s: float


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
