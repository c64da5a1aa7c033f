"""Latency of every op on one accelerator, or on a whole architecture space at once.

Pure Python and numpy (no xDSL).  An op comes in as a *description* (:class:`MatmulDesc`,
:class:`VectorDesc`, :class:`CollectiveDesc`, :class:`ViewDesc`: plain numbers that
``passes/estimate_latency.py`` reads off the IR through the ``ComputeOp`` interface), and goes out
as two latencies in seconds:

- ``one_s``: the op alone on ONE core of its type (what the operator scheduler uses when ops
  run side by side on different cores);
- ``split_s``: the op split over ALL cores of its type (intra-op parallel; it then runs alone).

Each is a roofline: the largest of the compute time and every memory level's traffic over its
bandwidth.  Which one wins is the op's *bound*: ``"compute"``, ``"glb"``, ``"hbm"``,
``"network"``, or ``"none"`` for ops that cost nothing.  The memory system is assumed to be the
op's alone (the GLB and HBM bandwidths are chip-wide figures, and a single busy core may draw all
of them).

Tensor cores (``phaze.matmul``)
-------------------------------
Compute: the cycles of :mod:`passes.algorithms.tiling` (weight-stationary, K on the depth, N on
the width, M streamed) over the clock.  Memory, two levels:

- **global buffer ↔ cores** (at the GLB bandwidth).  The array re-reads what it cannot reuse:
  every tile streams its ``m_block × K`` rows of ``A`` (so ``A`` is streamed once per weight
  column, ``tiles_n`` times) and loads the ``K × pe_x`` weights of its column (so ``B`` is
  loaded once per M block, ``batch · tiles_m`` times; the per-core buffer holds a tile's partial
  sums, and a smaller buffer means smaller M blocks and more weight reloads); ``C`` is written
  once (partial sums stay in the accumulators across K) and the bias read once.  Split over the
  cores, tiles are dealt N-first and the cores busy at a time share an M block, so the GLB
  broadcasts each row of ``A`` to ``min(count, tiles_n)`` cores: ``A`` is streamed
  ``ceil(tiles_n / min(count, tiles_n))`` times.
- **HBM ↔ global buffer** (at the HBM bandwidth).  At least every operand is read once and the
  result written once.  When one product's working set ``A + B + C`` does not fit the global
  buffer, it is blocked: half the buffer holds a block of one operand while the other streams
  past it once per block; of the two choices the cheaper is taken,
  ``min(B + A·ceil(B / (G/2)), A + B·ceil(A / (G/2))) + C``.  Batched products whose ``B`` is
  batched too are blocked per batch index; a ``B`` shared by the batch (a weight) is one product
  of ``batch · M`` rows.

Vector cores (every other compute op)
-------------------------------------
``width`` lanes per core, one operation per lane per cycle (``peak_vector_flops``).  An op
costs ``work = max(FLOPs, result elements)`` lane operations (its ``flops()`` per element, and
at least one operation per element produced: a copy, a convert or a gather is not free):
``cycles_one = ceil(work / width)``, ``cycles_split = ceil(work / (width · count))``.  Memory:

- **HBM**: the op's ``bytes_read + bytes_written`` (unfused: every op reads its operands from
  and writes its results to HBM; views move nothing, an embedding lookup reads only the rows it
  gathers, the optimizer its state too).
- **global buffer ↔ cores**: the same, except that multi-pass ops (softmax: 3 passes, max,
  exp-sum, normalize; norms and their gradients, softmax gradients, variance: 2) re-read their
  input once per pass when one reduced row (the inputs' slices along the reduced dims) does not
  fit half a vector core's buffer.  When it does not fit half the global buffer either, the
  passes re-read HBM too.

Collectives (``phaze.collective``): the α–β model of :mod:`passes.algorithms.network` on the
innermost network level that holds the group (ring all-reduce, all-gather, reduce-scatter,
send/recv), identical to the placement DP's Rust formulas; ``one_s == split_s``.

Views (``phaze.layout`` of a view kind) cost 0.

A calibrated chip (the hardware's optional ``[calibration]`` table, :class:`~phaze_ir.hardware.
Calibration`; real GPUs) is priced by the same rooflines with what it achieves: the tensor
compute time over ``tensor_efficiency`` (with wave quantisation, when given: a GEMM split over
the chip takes its waves of ``wave_tile_m × wave_tile_n`` output tiles over ``wave_units``
units, as a GPU's GEMM library deals tiles to SMs, instead of the PE-array tiling's cycles),
the HBM bandwidth times ``memory_efficiency``, and ``kernel_overhead_s``
added to every GEMM and vector op.  Only :func:`estimate_op` prices calibrated chips; the
vectorized model is the ideal one (an architecture space's chips have no calibration).

API
---
- :func:`estimate_op` (one description, one :class:`~phaze_ir.hardware.Accelerator`) ->
  :class:`OpLatency`; plain Python, cached by (description, accelerator).
- :func:`estimate_space` (a table of unique descriptions, the structured ``configs`` array of an
  :class:`~passes.algorithms.arch_space.ArchSpace`, the fixed part of the hardware) ->
  :class:`SpaceLatency` with ``[unique ops × configs]`` arrays, numpy-vectorized over configs and
  cached per (description, configs, fixed hardware).  :func:`estimate_space` equals
  :func:`estimate_op` on every configuration, bit for bit.
- :func:`layer_totals`: per-layer, per-phase serial sums.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from functools import lru_cache

import numpy as np

from passes.algorithms import network
from passes.algorithms.cache_file import is_int
from passes.algorithms.tiling import ScalarTiling, tile_gemm, tile_gemm_scalar

__all__ = [
    "BOUNDS",
    "UNITS",
    "MatmulDesc",
    "VectorDesc",
    "CollectiveDesc",
    "ViewDesc",
    "OpDesc",
    "DESC_KINDS",
    "desc_to_json",
    "desc_from_json",
    "OpLatency",
    "FixedParams",
    "OpTable",
    "SpaceLatency",
    "LatencyCache",
    "estimate_op",
    "estimate_matmul",
    "estimate_space",
    "config_of",
    "layer_totals",
    "hbm_matmul_bytes",
    "glb_matmul_bytes",
    "vector_traffic",
    "matmul_traffic_space",
    "vector_traffic_space",
    "CONFIG_FIELDS",
    "wave_s",
]

#: Bound labels; :attr:`SpaceLatency.bound` holds indices into this tuple.
BOUNDS = ("compute", "glb", "hbm", "network", "none")
#: Unit labels (the kind of core an op runs on).
UNITS = ("tensor", "vector", "network", "none")

_COMPUTE, _GLB, _HBM, _NETWORK, _NONE = range(len(BOUNDS))


# --------------------------------------------------------------------------------------------
# Op descriptions
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MatmulDesc:
    """A (batched) GEMM ``C[b] = A[b]·B[b] (+ bias)``: ``batch`` products of ``M×K · K×N``.

    ``a_elem``/``b_elem``/``c_elem`` are the element sizes (bytes) of ``A``, ``B`` and ``C``;
    ``rhs_batched`` is true when ``B`` has its own batch dims (attention's ``Q·Kᵀ``), false when
    one ``B`` serves the whole batch (a weight); ``bias_bytes`` the bias operand's bytes (0 if
    none).  ``a_bytes``/``b_bytes`` are the operands' real sizes (a broadcast operand counted
    once), for the compulsory HBM traffic.
    """

    batch: int
    m: int
    n: int
    k: int
    a_elem: int
    b_elem: int
    c_elem: int
    a_bytes: int
    b_bytes: int
    bias_bytes: int = 0
    rhs_batched: bool = False
    #: bytes of the compulsory traffic (operands read, result written) that stay on chip inside
    #: a fused kernel (``phaze.kernel``): such a GEMM's HBM traffic is the rest, unblocked
    onchip_bytes: int = 0
    #: part of a causal attention kernel: only the lower triangle of the s x s scores is
    #: computed, ``(s + 1) / 2s`` of the work (s: the longest of M, N, K)
    causal: bool = False
    #: kernel launches the GEMM pays (0 inside a kernel another op launches); more than 1: its
    #: batch's products run as that many kernels one after another (a grouped GEMM's per-expert
    #: fallback), each quantised into its own waves
    launches: int = 1
    #: an IEEE fp32 GEMM run where PyTorch runs it by default, on the CUDA cores (TF32 off):
    #: priced at the chip's ``fp32_gemm_flops`` when it has one
    fp32: bool = False
    #: device-to-host synchronizations the GEMM makes (a grouped GEMM's fallback reads its
    #: offsets on the host), each ``host_sync_s`` of the chip idle
    syncs: int = 0

    unit = "tensor"

    @property
    def c_bytes(self) -> int:
        return self.batch * self.m * self.n * self.c_elem

    @property
    def flops(self) -> int:
        return self.batch * (2 * self.m * self.n * self.k + (self.m * self.n if self.bias_bytes else 0))


@dataclass(frozen=True)
class VectorDesc:
    """An op for the vector cores: ``work`` lane operations, ``read_bytes``/``write_bytes`` to
    and from memory, ``passes`` over its input (1, or 2–3 for norms and softmax) and
    ``row_bytes``, the bytes of one reduced row of its inputs (what must stay in a buffer for
    the passes not to re-read memory; 0 for single-pass ops)."""

    work: int
    read_bytes: int
    write_bytes: int
    passes: int = 1
    row_bytes: int = 0
    #: kernel launches the op pays (0 inside a kernel another op launches; a multi-tensor
    #: optimizer op may launch several)
    launches: int = 1

    unit = "vector"


@dataclass(frozen=True)
class CollectiveDesc:
    """A collective of ``kind`` over ``group_size`` devices moving ``nbytes`` (the full tensor:
    the larger of input and result)."""

    kind: str
    group_size: int
    nbytes: int

    unit = "network"


@dataclass(frozen=True)
class ViewDesc:
    """A view: no data moves, no time passes."""

    unit = "none"


OpDesc = MatmulDesc | VectorDesc | CollectiveDesc | ViewDesc

#: The name of each kind of description in JSON (:func:`desc_to_json`).
DESC_KINDS: dict[str, type] = {
    "matmul": MatmulDesc,
    "vector": VectorDesc,
    "collective": CollectiveDesc,
    "view": ViewDesc,
}


def desc_to_json(d: OpDesc) -> dict:
    """``d`` as plain JSON data: ``{"desc": "matmul", field: value, ...}`` (every field)."""
    name = next(k for k, cls in DESC_KINDS.items() if type(d) is cls)
    return {"desc": name, **{f.name: getattr(d, f.name) for f in fields(d)}}


def desc_from_json(data: object) -> OpDesc:
    """The description :func:`desc_to_json` wrote, checked: its kind, exactly its fields, each of
    its type (counts and sizes are integers >= 0, a collective's kind is one of
    :data:`~passes.algorithms.network.COLLECTIVES` and its group holds a device); a
    ``ValueError`` saying what is wrong otherwise."""
    if not isinstance(data, dict) or data.get("desc") not in DESC_KINDS:
        raise ValueError(f"not an op description (desc one of {', '.join(DESC_KINDS)})")
    name = data["desc"]
    cls = DESC_KINDS[name]
    names = [f.name for f in fields(cls)]
    if sorted(data) != sorted(["desc", *names]):
        raise ValueError(f"a {name} description has the fields {', '.join(names) or 'none'}, not {sorted(data)}")
    for f in fields(cls):
        v = data[f.name]
        kind = str(f.type)  # the annotation's text (this module's annotations are postponed)
        if kind == "bool":
            ok = isinstance(v, bool)
        elif kind == "str":
            ok = isinstance(v, str)
        else:
            ok = is_int(v) and v >= 0
        if not ok:
            expected = {"bool": "a boolean", "str": "a string"}.get(kind, "an integer >= 0")
            raise ValueError(f"{name} {f.name} = {v!r}: expected {expected}")
    if cls is CollectiveDesc and (data["kind"] not in network.COLLECTIVES or data["group_size"] < 1):
        raise ValueError(f"collective {data['kind']!r} over {data['group_size']}: not a collective phaze prices")
    return cls(**{n: data[n] for n in names})


@dataclass(frozen=True)
class OpLatency:
    """Latency of one op on one accelerator (seconds) and what bounds it.

    ``bound`` is the bound of ``split_s`` and ``bound_one`` that of ``one_s``.  ``tiling`` is the
    GEMM's tiling (tensor ops only); ``level`` the network level index (collectives only)."""

    one_s: float
    split_s: float
    unit: str
    bound: str
    bound_one: str
    tiling: ScalarTiling | None = field(default=None, compare=False)
    level: int | None = None


# --------------------------------------------------------------------------------------------
# Scalar model (one op, one accelerator)
# --------------------------------------------------------------------------------------------


def _roofline(compute_s: float, glb_s: float, hbm_s: float) -> tuple[float, str]:
    """The largest term and its label (ties go to compute, then GLB)."""
    best, label = compute_s, "compute"
    if glb_s > best:
        best, label = glb_s, "glb"
    if hbm_s > best:
        best, label = hbm_s, "hbm"
    return best, label


def misaligned(d: MatmulDesc) -> bool:
    """Whether one of the GEMM's dimensions is not a multiple of 16 bytes of its operands (the
    alignment cuBLAS's fast Hopper and Ampere kernels need of every leading dimension)."""
    elem = max(d.a_elem, d.b_elem)
    return any(x * elem % 16 for x in (d.m, d.n, d.k))


def causal_fraction(m, n, k):
    """The share of a causal attention GEMM's work that its kernel computes: ``(s + 1) / 2s``
    of the s x s scores' blocks, s the longest of M, N, K (integers or numpy arrays)."""
    s = np.maximum(np.maximum(m, n), k)
    return (s + 1) / (2.0 * s)


def hbm_matmul_bytes(d: MatmulDesc, glb_bytes: int) -> int:
    """HBM traffic of a GEMM with a global buffer of ``glb_bytes`` (see the module docstring)."""
    if d.onchip_bytes > 0:  # inside a fused kernel, which tiles to keep its working set on chip
        return max(0, d.a_bytes + d.b_bytes + d.c_bytes + d.bias_bytes - d.onchip_bytes)
    problems = d.batch if d.rhs_batched else 1
    rows = d.m if d.rhs_batched else d.batch * d.m
    a1 = rows * d.k * d.a_elem
    b1 = d.k * d.n * d.b_elem
    c1 = rows * d.n * d.c_elem
    compulsory = d.a_bytes + d.b_bytes + d.c_bytes + d.bias_bytes
    if a1 + b1 + c1 <= glb_bytes:
        return compulsory
    half = max(1, glb_bytes // 2)
    keep_b = b1 + a1 * (-(-b1 // half)) + c1
    keep_a = a1 + b1 * (-(-a1 // half)) + c1
    return max(compulsory, problems * min(keep_b, keep_a) + d.bias_bytes)


def glb_matmul_bytes(d: MatmulDesc, t: ScalarTiling, sharers: int) -> int:
    """Bytes a GEMM moves between the global buffer and the cores (module docstring): ``A``
    streamed once per group of ``sharers`` weight columns, ``B`` loaded once per M block,
    ``C`` written and the bias read once."""
    a_stream = d.batch * d.m * d.k * d.a_elem
    b_loads = d.batch * t.tiles_m * d.k * d.n * d.b_elem
    return a_stream * (-(-t.tiles_n // sharers)) + b_loads + d.c_bytes + d.bias_bytes


def estimate_matmul(d: MatmulDesc, acc, tiling: ScalarTiling | None = None) -> OpLatency:
    """Latency of a GEMM on ``acc``'s tensor cores (``tiling`` if already computed)."""
    tc = acc.tensor_cores
    cal = acc.calibration
    t = tiling or tile_gemm_scalar(d.batch, d.m, d.n, d.k, tc.pe_x, tc.pe_y, tc.count, tc.buffer_bytes)
    clock = acc.clock_hz
    glb_bw = acc.global_buffer.bandwidth_Bps
    hbm_s = hbm_matmul_bytes(d, acc.global_buffer.bytes) / _hbm_Bps(acc)
    compute_one, compute_split = t.cycles_one / clock, t.cycles_split / clock
    if cal is not None:
        if cal.waves:  # a GPU's GEMM library deals output tiles to SMs: not the PE-array tiling
            compute_split = _wave_s(d, acc)
        compute_one /= cal.tensor_efficiency
        compute_split /= cal.tensor_efficiency
        if d.fp32 and cal.fp32_gemm_flops is not None:  # CUDA cores, not tensor cores
            slower = acc.peak_tensor_flops / cal.fp32_gemm_flops
            compute_one *= slower
            compute_split *= slower
        if misaligned(d):
            compute_one /= cal.misaligned_gemm_efficiency
            compute_split /= cal.misaligned_gemm_efficiency
    if d.causal:
        frac = float(causal_fraction(d.m, d.n, d.k))
        compute_one, compute_split = compute_one * frac, compute_split * frac
    one_s, bound_one = _roofline(compute_one, glb_matmul_bytes(d, t, 1) / glb_bw, hbm_s)
    sharers = min(tc.count, t.tiles_n)
    split_s, bound = _roofline(compute_split, glb_matmul_bytes(d, t, sharers) / glb_bw, hbm_s)
    overhead = _overhead_s(acc) * d.launches
    if d.syncs and cal is not None and cal.host_sync_s is not None:
        overhead += cal.host_sync_s * d.syncs
    return OpLatency(one_s + overhead, split_s + overhead, "tensor", bound, bound_one, tiling=t)


def _hbm_Bps(acc) -> float:
    """The HBM bandwidth ops achieve: the peak, times the calibrated efficiency if any."""
    cal = acc.calibration
    return acc.hbm.bandwidth_Bps * (1.0 if cal is None else cal.memory_efficiency)


def _overhead_s(acc) -> float:
    """The calibrated time added to every computing op (0 on an ideal chip)."""
    return 0.0 if acc.calibration is None else acc.calibration.kernel_overhead_s


def _wave_s(d: MatmulDesc, acc) -> float:
    """Seconds of a GEMM split over the chip in waves of output tiles (the ``[calibration]``
    wave quantisation, :func:`wave_s`); a GEMM launched as several kernels (``launches`` > 1)
    is quantised per kernel, each ``ceil(batch / launches)`` products."""
    cal = acc.calibration
    kernels = max(1, min(d.launches, d.batch))
    per = -(-d.batch // kernels)
    one = wave_s(per, d.m, d.n, d.k, cal.wave_tile_m, cal.wave_tile_n, cal.wave_units, acc.peak_tensor_flops)
    return one * kernels


def wave_s(batch, m, n, k, tile_m: int, tile_n: int, units: int, peak_flops: float):
    """Seconds of GEMMs in waves of full output tiles: ``batch · ceil(M / tile_m) · ceil(N /
    tile_n)`` tiles dealt to ``units`` units, each wave as long as one full tile at a unit's
    share of ``peak_flops``.  Integers, or numpy integer arrays of GEMMs (element by element,
    the same floats: ``benchmarks/gpu/fit_h100.py`` fits with it)."""
    tiles = batch * (-(-m // tile_m)) * (-(-n // tile_n))
    waves = -(-tiles // units)
    return waves * 2.0 * tile_m * tile_n * k * units / peak_flops


def vector_traffic(d: VectorDesc, buffer_bytes: int) -> int:
    """Bytes a vector op moves into a buffer of ``buffer_bytes`` from the level below: its
    reads (once per pass when one reduced row does not fit half the buffer) and writes."""
    reads = d.read_bytes * d.passes if d.passes > 1 and d.row_bytes > buffer_bytes // 2 else d.read_bytes
    return reads + d.write_bytes


def _estimate_vector(d: VectorDesc, acc) -> OpLatency:
    vc = acc.vector_cores
    clock = acc.clock_hz
    glb_s = vector_traffic(d, vc.buffer_bytes) / acc.global_buffer.bandwidth_Bps
    hbm_s = vector_traffic(d, acc.global_buffer.bytes) / _hbm_Bps(acc)
    one_s, bound_one = _roofline((-(-d.work // vc.width)) / clock, glb_s, hbm_s)
    split_s, bound = _roofline((-(-d.work // (vc.width * vc.count))) / clock, glb_s, hbm_s)
    overhead = _overhead_s(acc) * d.launches
    return OpLatency(one_s + overhead, split_s + overhead, "vector", bound, bound_one)


@lru_cache(maxsize=65536)
def estimate_op(d: OpDesc, acc) -> OpLatency:
    """Latency of one op on accelerator ``acc`` (a :class:`phaze_ir.hardware.Accelerator`);
    cached by (description, accelerator), both hashable."""
    if isinstance(d, MatmulDesc):
        return estimate_matmul(d, acc)
    if isinstance(d, VectorDesc):
        return _estimate_vector(d, acc)
    if isinstance(d, CollectiveDesc):
        s, level = network.collective_s(d.kind, d.nbytes, d.group_size, acc.network)
        return OpLatency(s, s, "network", "network", "network", level=level)
    if isinstance(d, ViewDesc):
        return OpLatency(0.0, 0.0, "none", "none", "none")
    raise TypeError(f"not an op description: {d!r}")


# --------------------------------------------------------------------------------------------
# Vectorized model (unique ops × configurations)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FixedParams:
    """What an architecture space does not search: clock, bandwidths, network levels."""

    clock_hz: float
    glb_bandwidth_Bps: float
    hbm_bandwidth_Bps: float
    levels: tuple[network.Level, ...]

    @classmethod
    def of(cls, hw) -> FixedParams:
        """From an :class:`~phaze_ir.hardware.Accelerator` (a space's template) or a FixedParams."""
        if isinstance(hw, FixedParams):
            return hw
        if getattr(hw, "calibration", None) is not None:
            # The vectorized model is the ideal one: a calibrated chip is priced by estimate_op.
            raise ValueError(f"{hw.name}: an architecture space's template has no [calibration]")
        return cls(
            clock_hz=float(hw.clock_hz),
            glb_bandwidth_Bps=float(hw.global_buffer.bandwidth_Bps),
            hbm_bandwidth_Bps=float(hw.hbm.bandwidth_Bps),
            levels=network.levels_of(hw.network),
        )


def config_of(acc) -> np.ndarray:
    """One accelerator's on-chip configuration as a 1-row array of ``CONFIG_DTYPE`` (the form
    :func:`estimate_space` takes; ``area_um2`` is NaN when outside the area model)."""
    from passes.algorithms.arch_space import CONFIG_DTYPE

    tc, vc = acc.tensor_cores, acc.vector_cores
    row = np.zeros(1, dtype=CONFIG_DTYPE)
    row["num_tc"], row["num_vc"] = tc.count, vc.count
    row["width"], row["depth"], row["width_vc"] = tc.pe_x, tc.pe_y, vc.width
    row["glb_bytes"] = acc.global_buffer.bytes
    row["tc_buffer_bytes"], row["vc_buffer_bytes"] = tc.buffer_bytes, vc.buffer_bytes
    area = acc.modeled_area_um2
    row["area_um2"] = np.nan if area is None else area
    return row


_MM_FIELDS = (
    "batch",
    "m",
    "n",
    "k",
    "a_elem",
    "b_elem",
    "c_elem",
    "a_bytes",
    "b_bytes",
    "bias_bytes",
    "rhs_batched",
    "onchip_bytes",
    "causal",
)
_VEC_FIELDS = ("work", "read_bytes", "write_bytes", "passes", "row_bytes")


class OpTable:
    """Unique op descriptions, grouped by unit into int64 column arrays.

    Row ``i`` of every ``[ops × configs]`` result is ``descs[i]``.  Build with
    :meth:`build` from descriptions (duplicates are kept as given; deduplicate first)."""

    def __init__(self, descs: Sequence[OpDesc]):
        self.descs: tuple[OpDesc, ...] = tuple(descs)
        self.rows: dict[str, np.ndarray] = {}
        self.cols: dict[str, dict[str, np.ndarray]] = {}
        groups: dict[str, list[int]] = {"tensor": [], "vector": [], "network": [], "none": []}
        for i, d in enumerate(self.descs):
            if not isinstance(d, (MatmulDesc, VectorDesc, CollectiveDesc, ViewDesc)):
                raise TypeError(f"not an op description: {d!r}")
            groups[d.unit].append(i)
        for unit, rows in groups.items():
            self.rows[unit] = np.asarray(rows, dtype=np.int64)
        self.cols["tensor"] = {
            f: np.asarray([int(getattr(self.descs[i], f)) for i in groups["tensor"]], dtype=np.int64)
            for f in _MM_FIELDS
        }
        self.cols["vector"] = {
            f: np.asarray([getattr(self.descs[i], f) for i in groups["vector"]], dtype=np.int64) for f in _VEC_FIELDS
        }

    @classmethod
    def build(cls, descs: Iterable[OpDesc]) -> OpTable:
        return cls(list(descs))

    def __len__(self) -> int:
        return len(self.descs)

    @property
    def units(self) -> tuple[str, ...]:
        return tuple(d.unit for d in self.descs)


@dataclass
class SpaceLatency:
    """Latencies of ``U`` unique ops on ``C`` configurations.

    ``one``/``split``: float64 ``[U, C]`` seconds; ``bound``/``bound_one``: uint8 ``[U, C]``
    indices into :data:`BOUNDS` (of ``split`` and of ``one``); ``units``: the unit of each row."""

    one: np.ndarray
    split: np.ndarray
    bound: np.ndarray
    bound_one: np.ndarray
    units: tuple[str, ...]

    def bound_names(self, which: str = "split") -> np.ndarray:
        """The bound labels as a string array."""
        codes = self.bound if which == "split" else self.bound_one
        return np.asarray(BOUNDS, dtype=object)[codes]


def _roofline_v(compute_s: np.ndarray, glb_s: np.ndarray, hbm_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    best = compute_s
    code = np.zeros(np.broadcast_shapes(compute_s.shape, glb_s.shape, hbm_s.shape), dtype=np.uint8)
    best = np.broadcast_to(best, code.shape)
    glb_wins = glb_s > best
    best = np.where(glb_wins, glb_s, best)
    code[glb_wins] = _GLB
    hbm_wins = hbm_s > best
    best = np.where(hbm_wins, hbm_s, best)
    code[hbm_wins] = _HBM
    return best, code


def _cdiv(a, b):
    return -(-a // b)


def matmul_traffic_space(cols: dict[str, np.ndarray], cfg: dict[str, np.ndarray]):
    """The tiling and traffic of a chunk of GEMMs on configurations ([u, 1] columns, [1, C]
    configs): ``(tiling, hbm_bytes, glb_one_bytes, glb_split_bytes)``, [u, C] each (the
    vectorized :func:`hbm_matmul_bytes` and :func:`glb_matmul_bytes`, on one core and split)."""
    batch, m, n, k = cols["batch"], cols["m"], cols["n"], cols["k"]
    a_elem, b_elem, c_elem = cols["a_elem"], cols["b_elem"], cols["c_elem"]
    bias, rhs_batched = cols["bias_bytes"], cols["rhs_batched"].astype(bool)
    t = tile_gemm(batch, m, n, k, cfg["width"], cfg["depth"], cfg["num_tc"], cfg["tc_buffer_bytes"])
    c_bytes = batch * m * n * c_elem
    # HBM (depends on the global buffer size only)
    glb = cfg["glb_bytes"]
    rows = np.where(rhs_batched, m, batch * m)
    problems = np.where(rhs_batched, batch, 1)
    a1, b1, c1 = rows * k * a_elem, k * n * b_elem, rows * n * c_elem
    compulsory = cols["a_bytes"] + cols["b_bytes"] + c_bytes + bias
    half = np.maximum(1, glb // 2)
    keep_b = b1 + a1 * _cdiv(b1, half) + c1
    keep_a = a1 + b1 * _cdiv(a1, half) + c1
    blocked = np.maximum(compulsory, problems * np.minimum(keep_b, keep_a) + bias)
    hbm_bytes = np.where(a1 + b1 + c1 <= glb, compulsory, blocked)
    onchip = cols["onchip_bytes"]
    hbm_bytes = np.where(onchip > 0, np.maximum(0, compulsory - onchip), hbm_bytes)
    # GLB <-> cores
    a_stream = batch * m * k * a_elem
    rest = batch * t.tiles_m * k * n * b_elem + c_bytes + bias
    sharers = np.minimum(cfg["num_tc"], t.tiles_n)
    return t, hbm_bytes, a_stream * t.tiles_n + rest, a_stream * _cdiv(t.tiles_n, sharers) + rest


def _matmul_space(cols: dict[str, np.ndarray], cfg: dict[str, np.ndarray], fx: FixedParams):
    """[u, C] arrays for a chunk of GEMMs (columns are [u, 1], configs [1, C])."""
    t, hbm_bytes, glb_one, glb_split = matmul_traffic_space(cols, cfg)
    hbm_s = hbm_bytes / fx.hbm_bandwidth_Bps
    compute_one, compute_split = t.cycles_one / fx.clock_hz, t.cycles_split / fx.clock_hz
    causal = cols["causal"].astype(bool)
    if causal.any():
        frac = causal_fraction(cols["m"], cols["n"], cols["k"])
        compute_one = np.where(causal, compute_one * frac, compute_one)
        compute_split = np.where(causal, compute_split * frac, compute_split)
    one, bound_one = _roofline_v(compute_one, glb_one / fx.glb_bandwidth_Bps, hbm_s)
    split, bound = _roofline_v(compute_split, glb_split / fx.glb_bandwidth_Bps, hbm_s)
    return one, split, bound, bound_one


def vector_traffic_space(cols: dict[str, np.ndarray], cfg: dict[str, np.ndarray]):
    """The traffic of a chunk of vector ops on configurations: ``(core_bytes, hbm_bytes)``,
    [u, C] each (the vectorized :func:`vector_traffic` into a vector core's buffer and into
    the global buffer)."""
    read, write = cols["read_bytes"], cols["write_bytes"]
    passes, row = cols["passes"], cols["row_bytes"]
    multi = passes > 1
    core_reads = np.where(multi & (row > cfg["vc_buffer_bytes"] // 2), read * passes, read)
    hbm_reads = np.where(multi & (row > cfg["glb_bytes"] // 2), read * passes, read)
    return core_reads + write, hbm_reads + write


def _vector_space(cols: dict[str, np.ndarray], cfg: dict[str, np.ndarray], fx: FixedParams):
    core_bytes, hbm_bytes = vector_traffic_space(cols, cfg)
    glb_s = core_bytes / fx.glb_bandwidth_Bps
    hbm_s = hbm_bytes / fx.hbm_bandwidth_Bps
    work, width = cols["work"], cfg["width_vc"]
    one, bound_one = _roofline_v(_cdiv(work, width) / fx.clock_hz, glb_s, hbm_s)
    split, bound = _roofline_v(_cdiv(work, width * cfg["num_vc"]) / fx.clock_hz, glb_s, hbm_s)
    return one, split, bound, bound_one


class LatencyCache:
    """Rows of :func:`estimate_space` results by (op description, configs key, fixed params),
    least recently used first out once ``max_bytes`` is exceeded."""

    def __init__(self, max_bytes: int = 512 * 2**20):
        self.max_bytes = max_bytes
        self._rows: OrderedDict[tuple, tuple[np.ndarray, ...]] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple):
        row = self._rows.get(key)
        if row is None:
            self.misses += 1
            return None
        self._rows.move_to_end(key)
        self.hits += 1
        return row

    def put(self, key: tuple, row: tuple[np.ndarray, ...]) -> None:
        size = sum(a.nbytes for a in row)
        if size > self.max_bytes:
            return
        old = self._rows.pop(key, None)
        if old is not None:
            self._bytes -= sum(a.nbytes for a in old)
        self._rows[key] = row
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, dropped = self._rows.popitem(last=False)
            self._bytes -= sum(a.nbytes for a in dropped)

    def clear(self) -> None:
        self._rows.clear()
        self._bytes = 0
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._rows)


#: The cache :func:`estimate_space` uses unless given another (``cache=None`` disables caching).
DEFAULT_CACHE = LatencyCache()

CONFIG_FIELDS = ("num_tc", "num_vc", "width", "depth", "width_vc", "glb_bytes", "tc_buffer_bytes", "vc_buffer_bytes")


def configs_key(configs: np.ndarray) -> str:
    """A digest identifying a configs array by content (the fields the latency model reads)."""
    h = hashlib.blake2b(digest_size=16)
    for f in CONFIG_FIELDS:
        h.update(np.ascontiguousarray(configs[f], dtype=np.int64).tobytes())
    return h.hexdigest()


def estimate_space(
    op_table: OpTable | Sequence[OpDesc],
    configs: np.ndarray,
    fixed,
    *,
    cache: LatencyCache | None = DEFAULT_CACHE,
    chunk: int = 32,
) -> SpaceLatency:
    """Latency of every op of ``op_table`` on every row of ``configs``.

    ``configs``: a structured array with the fields of
    :data:`~passes.algorithms.arch_space.CONFIG_DTYPE` (``ArchSpace.configs``, or
    :func:`config_of` for one accelerator); ``fixed``: the template
    :class:`~phaze_ir.hardware.Accelerator` (or :class:`FixedParams`) giving the clock, the
    bandwidths and the network.  Rows are computed ``chunk`` ops at a time (bounding the
    temporaries to ``chunk × configs``) and cached per op description in ``cache``.
    """
    table = op_table if isinstance(op_table, OpTable) else OpTable(op_table)
    fx = FixedParams.of(fixed)
    configs = np.asarray(configs)
    C = configs.shape[0]
    U = len(table)
    one = np.empty((U, C), dtype=np.float64)
    split = np.empty((U, C), dtype=np.float64)
    bound = np.empty((U, C), dtype=np.uint8)
    bound_one = np.empty((U, C), dtype=np.uint8)
    cfg = {f: np.ascontiguousarray(configs[f], dtype=np.int64)[None, :] for f in CONFIG_FIELDS}
    base_key = (configs_key(configs), fx) if cache is not None else None

    def cached(i: int) -> bool:
        if cache is None or base_key is None:
            return False
        row = cache.get((table.descs[i], *base_key))
        if row is None:
            return False
        one[i], split[i], bound[i], bound_one[i] = row
        return True

    def store(i: int) -> None:
        if cache is not None and base_key is not None:
            cache.put(
                (table.descs[i], *base_key), (one[i].copy(), split[i].copy(), bound[i].copy(), bound_one[i].copy())
            )

    for unit, fn in (("tensor", _matmul_space), ("vector", _vector_space)):
        rows = table.rows[unit]
        todo = np.asarray([j for j, i in enumerate(rows) if not cached(int(i))], dtype=np.int64)
        for s in range(0, len(todo), chunk):
            sel = todo[s : s + chunk]
            cols = {f: v[sel][:, None] for f, v in table.cols[unit].items()}
            o, sp, b, bo = fn(cols, cfg, fx)
            idx = rows[sel]
            one[idx], split[idx], bound[idx], bound_one[idx] = o, sp, b, bo
            for i in idx:
                store(int(i))
    for i in table.rows["network"]:
        d = table.descs[int(i)]
        assert isinstance(d, CollectiveDesc)  # the "network" rows are the collectives
        seconds, _ = network.collective_s(d.kind, d.nbytes, d.group_size, fx.levels)
        one[i] = split[i] = seconds
        bound[i] = bound_one[i] = _NETWORK
    for i in table.rows["none"]:
        one[i] = split[i] = 0.0
        bound[i] = bound_one[i] = _NONE
    return SpaceLatency(one, split, bound, bound_one, table.units)


# --------------------------------------------------------------------------------------------
# Layer totals
# --------------------------------------------------------------------------------------------


def layer_totals(layers: Sequence[int], phases: Sequence[str], seconds: Sequence[float]) -> dict[int, dict[str, float]]:
    """Serial sums per layer and phase: ``{layer: {"fwd": s, "bwd": s, "opt": s}}`` (ops with a
    negative layer are skipped; an unknown phase counts as ``fwd``).  Summed in op order."""
    out: dict[int, dict[str, float]] = {}
    for layer, phase, s in zip(layers, phases, seconds):
        if layer < 0:
            continue
        acc = out.setdefault(layer, {"fwd": 0.0, "bwd": 0.0, "opt": 0.0})
        acc[phase if phase in acc else "fwd"] += s
    return dict(sorted(out.items()))
