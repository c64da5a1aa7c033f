"""Tiling of a GEMM onto the tensor cores (systolic PE arrays), vectorized over configurations.

Pure numpy (no xDSL).  Every function takes numpy arrays or scalars that broadcast together, so
one call prices one GEMM on one core configuration or on a whole architecture space at once.

The dataflow: weight-stationary
-------------------------------
A GEMM ``C[b] = A[b] · B[b]`` with ``A: M × K``, ``B: K × N`` (``batch`` independent products)
runs on ``count`` tensor cores of ``pe_x × pe_y`` processing elements (``pe_x`` = the paper's
width W, ``pe_y`` = its depth D):

- **K along the depth** (``pe_y`` rows) and **N along the width** (``pe_x`` columns): a weight
  tile of ``pe_y × pe_x`` elements of ``B`` sits in the PEs, one per PE.
- **M is streamed**: rows of ``A`` (each a ``pe_y``-long slice of K) enter from the array's edge,
  skewed one cycle per row, one row per cycle; partial sums flow down the ``pe_y`` rows and leave
  at the bottom, ``pe_x`` of them per cycle, into the core's fp32 accumulators.
- **A tile** is one output block: ``m_block`` rows × ``pe_x`` columns of ``C`` for one batch
  index.  The core makes ``tiles_k = ceil(K / pe_y)`` passes over it, one per weight tile along
  K, chained back to back: the next weight tile loads (``pe_y`` cycles, one row per cycle) into
  the double-buffered weight registers while the current one streams, so a pass costs
  ``max(m_block, pe_y)`` cycles, and the accumulators add the passes up in place.  The pipeline
  fills and drains once per tile: ``pe_y + pe_x - 1`` cycles (the skew across the depth, then
  across the width).  Hence

      tile_cycles = tiles_k · max(m_block, pe_y) + pe_y + pe_x − 1.

- **m_block** (rows per tile) is bounded by the accumulators: ``m_block × pe_x`` fp32 partial
  sums in half of the per-core buffer (the other half stages the streamed rows and the next
  weight tile): ``m_rows = max(1, (buffer_bytes / 2) // (4 · pe_x))`` (for the area model's
  16 B per PE this is ``2 · pe_y``).  M is cut into ``tiles_m = ceil(M / m_rows)`` blocks of
  equal size ``m_block = ceil(M / tiles_m)`` (at most ``tiles_m − 1`` rows of padding).
- **Padding**: N pads up to a multiple of ``pe_x`` and K to a multiple of ``pe_y``;
  ``utilization = useful MACs / issued MACs = M·N·K / (tiles_m·m_block · tiles_n·pe_x ·
  tiles_k·pe_y)``.
- **Cores**: the ``tiles = batch · tiles_m · tiles_n`` tiles (K is never split across cores, so
  no core-to-core reduction) are dealt to the ``count`` cores; ``cores = min(count, tiles)`` are
  busy and the slowest does ``ceil(tiles / count)`` of them (the ceil-division imbalance):

      cycles_one   = tiles · tile_cycles                 (the op alone on one core)
      cycles_split = ceil(tiles / count) · tile_cycles   (split over all ``count`` cores)

  Tiles are dealt N-first (the cores busy at a time share an m-block), which is what lets the
  global buffer broadcast one stream of ``A`` rows to ``min(count, tiles_n)`` cores (see
  :mod:`passes.algorithms.latency`).

Counts are int64 (what a space's arrays hold): a GEMM whose cycles pass 2**63 (about 9.2e18)
is outside the model, and :func:`tile_gemm_scalar` refuses it.

This is the model of SCALE-Sim-style analytical simulators (fill/drain + streaming per fold),
with folds along K chained as the TPU's matrix units do.  Memory bandwidth is not here: the
rooflines of :mod:`passes.algorithms.latency` bound these cycles from below.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

__all__ = [
    "ACC_BYTES",
    "Tiling",
    "m_rows",
    "tile_cycles",
    "tile_gemm",
    "tile_gemm_scalar",
    "ScalarTiling",
]

#: Bytes of one partial sum in the accumulators (fp32).
ACC_BYTES = 4


def _i64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int64)


def _cdiv(a, b):
    """Ceil division of non-negative integers (numpy or Python ints)."""
    return -(-a // b)


def m_rows(buffer_bytes, pe_x):
    """Most rows of ``A`` one tile may stream: ``m_rows × pe_x`` fp32 partial sums in half the
    per-core buffer, at least 1."""
    return np.maximum(1, (_i64(buffer_bytes) // 2) // (ACC_BYTES * _i64(pe_x)))


def tile_cycles(tiles_k, m_block, pe_x, pe_y):
    """Cycles of one output tile: ``tiles_k`` passes of ``max(m_block, pe_y)`` cycles each (a
    weight tile loads behind the stream of the one before), then the pipeline's fill and drain."""
    return tiles_k * np.maximum(m_block, pe_y) + pe_y + pe_x - 1


@dataclass(frozen=True)
class Tiling:
    """A GEMM tiled onto the tensor cores; every field an int64 (float64 for ``utilization``)
    array of the broadcast shape of the inputs.

    Attributes:
        m_block: rows of ``A`` streamed per tile (the M extent of a tile).
        tiles_m: M blocks, ``ceil(M / m_rows)``.
        tiles_n: weight-tile columns, ``ceil(N / pe_x)``.
        tiles_k: weight-tile rows (passes per tile), ``ceil(K / pe_y)``.
        tiles: tiles to run, ``batch · tiles_m · tiles_n``.
        cores: busy cores when split, ``min(count, tiles)``.
        tile_cycles: cycles of one tile, ``tiles_k · max(m_block, pe_y) + pe_y + pe_x − 1``.
        cycles_one: cycles on one core, ``tiles · tile_cycles``.
        cycles_split: cycles over all cores, ``ceil(tiles / count) · tile_cycles``.
        utilization: useful MACs / issued MACs (padding waste only; fill/drain is in the cycles).
    """

    m_block: np.ndarray
    tiles_m: np.ndarray
    tiles_n: np.ndarray
    tiles_k: np.ndarray
    tiles: np.ndarray
    cores: np.ndarray
    tile_cycles: np.ndarray
    cycles_one: np.ndarray
    cycles_split: np.ndarray
    utilization: np.ndarray


def tile_gemm(batch, m, n, k, pe_x, pe_y, count, buffer_bytes) -> Tiling:
    """Tile ``batch`` GEMMs of ``M × K · K × N`` onto ``count`` cores of ``pe_x × pe_y`` PEs with
    ``buffer_bytes`` of per-core buffer (see the module docstring).  Arguments broadcast."""
    batch, m, n, k = _i64(batch), _i64(m), _i64(n), _i64(k)
    pe_x, pe_y, count = _i64(pe_x), _i64(pe_y), _i64(count)
    tiles_m = np.maximum(1, _cdiv(m, m_rows(buffer_bytes, pe_x)))
    m_block = np.maximum(1, _cdiv(m, tiles_m))
    tiles_n = np.maximum(1, _cdiv(n, pe_x))
    tiles_k = np.maximum(1, _cdiv(k, pe_y))
    tiles = batch * tiles_m * tiles_n
    cores = np.minimum(count, tiles)
    cycles = tile_cycles(tiles_k, m_block, pe_x, pe_y)
    issued = (tiles_m * m_block).astype(np.float64) * (tiles_n * pe_x) * (tiles_k * pe_y)
    useful = m.astype(np.float64) * n * k
    return Tiling(
        m_block=m_block,
        tiles_m=tiles_m,
        tiles_n=tiles_n,
        tiles_k=tiles_k,
        tiles=tiles,
        cores=cores,
        tile_cycles=cycles,
        cycles_one=tiles * cycles,
        cycles_split=_cdiv(tiles, count) * cycles,
        utilization=useful / issued,
    )


@dataclass(frozen=True)
class ScalarTiling:
    """:class:`Tiling` of one GEMM on one configuration, as Python numbers: the fields of a
    ``#phaze.tile`` record, so that a pass can rebuild it from the IR."""

    pe_x: int
    pe_y: int
    m_block: int
    tiles_m: int
    tiles_n: int
    tiles_k: int
    tiles: int
    cores: int
    utilization: float
    cycles_one: int
    cycles_split: int

    @property
    def tile_cycles(self) -> int:
        """Cycles of one output tile (:func:`tile_cycles`; the record does not store it)."""
        return int(tile_cycles(self.tiles_k, self.m_block, self.pe_x, self.pe_y))

    def as_dict(self) -> dict[str, int | float]:
        return dict(vars(self))

    def as_tiling(self) -> Tiling:
        """This tiling as a one-GEMM :class:`Tiling` (0-d arrays), as the formulas take a space's."""
        return Tiling(**{f.name: np.asarray(getattr(self, f.name)) for f in fields(Tiling)})


def tile_gemm_scalar(
    batch: int, m: int, n: int, k: int, pe_x: int, pe_y: int, count: int, buffer_bytes: int
) -> ScalarTiling:
    """:func:`tile_gemm` of one GEMM on one configuration (the per-module passes' tiling), its
    numbers as Python ``int`` and ``float``; :class:`OverflowError` where a count passes int64."""
    with np.errstate(over="raise"):  # int64 scalars report a wrap past 2**63 (arrays would not)
        try:
            t = tile_gemm(batch, m, n, k, pe_x, pe_y, count, buffer_bytes)
        except FloatingPointError as e:
            raise OverflowError(
                f"tiling a {batch} x {m} x {n} x {k} GEMM on {pe_x} x {pe_y} PEs: more cycles than int64 holds"
            ) from e
    row = {f.name: getattr(t, f.name).item() for f in fields(ScalarTiling) if f.name not in ("pe_x", "pe_y")}
    return ScalarTiling(pe_x=int(pe_x), pe_y=int(pe_y), **row)
