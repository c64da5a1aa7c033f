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
  past it once per block, ``B + A·ceil(B / (G/2))`` or ``A + B·ceil(A / (G/2))``, or it holds an
  ``r × c`` block of the result's fp32 partial sums (``4·r·c ≤ G/2``, as square as ``M`` and
  ``N`` allow) while ``A``'s rows and ``B``'s columns stream past along K, ``A·ceil(N / c) +
  B·ceil(M / r)``: a GPU's GEMM library keeps each output tile's sums on chip over the whole K
  (CUTLASS's mainloop), so a long K (a weight gradient's, every token of the batch) streams
  rather than making the K-long panels thin; the cheapest is taken, ``+ C``.  The third is a
  calibrated chip's with wave tiles (``chip_cfg``'s ``stream_k``); a space's ideal chips keep
  the two panels.
  Batched products whose ``B`` is
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
added to every GEMM and vector op.  Only one chip is priced calibrated (:func:`estimate_chip`):
an architecture space's chips are ideal, a calibration being measured on one chip.

API
---
The model is written once, numpy-vectorized: every formula takes a chunk of ops as ``[u, 1]``
columns and the configurations as ``[1, C]`` arrays and broadcasts.  A pass is the
one-configuration case of what the architecture search runs on many, so a plan and a search
price an op alike by construction (no twin to keep equal).

- :func:`estimate_space` (a table of unique descriptions, the structured ``configs`` array of an
  :class:`~phaze.search.arch_space.ArchSpace`, the fixed part of the hardware) ->
  :class:`SpaceLatency` with ``[unique ops × configs]`` arrays, cached per (description,
  configs, fixed hardware).
- :func:`estimate_chip` (a table, one :class:`~phaze_ir.hardware.Accelerator`, calibrated or
  not, and optionally the GEMMs' own tilings) -> a one-column :class:`SpaceLatency`: what
  ``phaze-estimate-latency`` calls, once for all of a module's ops.
- :func:`estimate_op`, :func:`estimate_matmul`, :func:`hbm_matmul_bytes`,
  :func:`glb_matmul_bytes`, :func:`vector_traffic`: one op through the same code (a one-row
  table; cached by (description, accelerator) for :func:`estimate_op`), for the energy model,
  the fits and the tests; :func:`op_columns` and :func:`chip_cfg` give one op's columns and one
  chip's configuration as the formulas take them (what the energy model prices one op with).
- :func:`layer_totals`: per-layer, per-phase serial sums.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from passes.algorithms import network
from passes.algorithms.tiling import ACC_BYTES, ScalarTiling, Tiling, tile_gemm
from passes.cache_file import is_int
from phaze_ir.op_kinds import causal_fraction

if TYPE_CHECKING:
    from phaze_ir.hardware import Calibration

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
    "estimate_chip",
    "op_overheads",
    "op_overhead_s",
    "config_of",
    "chip_cfg",
    "op_columns",
    "layer_totals",
    "hbm_matmul_bytes",
    "glb_matmul_bytes",
    "vector_traffic",
    "matmul_traffic_space",
    "vector_traffic_space",
    "CONFIG_FIELDS",
    "CONFIG_DTYPE",
    "wave_s",
]

#: Bound labels; :attr:`SpaceLatency.bound` holds indices into this tuple.
BOUNDS = ("compute", "glb", "hbm", "network", "none", "power")
#: Unit labels (the kind of core an op runs on).
UNITS = ("tensor", "vector", "network", "none")

_COMPUTE, _GLB, _HBM, _NETWORK, _NONE, _POWER = range(len(BOUNDS))


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
    #: part of a causal attention kernel (``#phaze.kernel``'s ``causal``: 1, or w >= 2 within a
    #: sliding window of w keys): only the lower triangle of the s x s scores, or its band of
    #: width w, is computed (``causal_fraction``; s: the longest of M, N, K)
    causal: int = 0
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
    #: an FP8 GEMM that promotes its partial sums to fp32 as it goes (split accumulation: the
    #: backward GEMMs of Transformer Engine's and torchao's FP8 linears), priced at the chip's
    #: ``fp8_split_accumulation_efficiency`` of its FP8 rate
    split_accumulation: bool = False
    #: an FP8 GEMM with one scale a row of each operand (torchao's rowwise recipe): with fast
    #: accumulation (the forward's) PyTorch's CUTLASS rowwise kernel, priced at the chip's
    #: ``fp8_rowwise_gemm_efficiency`` of its FP8 rate; the backward's run as a per-tensor GEMM
    #: and then a pass scaling the output (``post_scale_*``)
    rowwise: bool = False
    #: the bytes and kernels of the pointwise pass that scales the output of a backward rowwise
    #: GEMM (torchao's ``output *= a_inverse_scale * b_inverse_scale``), after the GEMM, at the
    #: chip's memory-bound rate (0: none, or fused into the output's next op)
    post_scale_bytes: int = 0
    post_scale_launches: int = 0
    #: part of a fused attention kernel: 1 its forward, 2 its backward (0: not); priced at the
    #: rate the kernel ``backend`` (an index into ``attention.BACKENDS``) reaches at its shape
    #: when the chip's ``attention_kernels`` table has it (``passes/algorithms/attention.py``)
    attention: int = 0
    backend: int = 0

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
    #: part of a kernel that reads a tensor across its slow dimension (a max across rows: torchao's
    #: column-wise float8 scales, ``phaze.column_kernel``): its memory traffic at the chip's
    #: ``column_read_efficiency`` of its memory-bound rate
    column: bool = False
    #: part of a fused attention kernel (as :attr:`MatmulDesc.attention`, ``backend``): when the
    #: chip's table prices that kernel, its published rate covers the softmax too, and the op
    #: costs only its traffic
    attention: int = 0
    backend: int = 0

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

    ``bound`` is the bound of ``split_s`` and ``bound_one`` that of ``one_s``."""

    one_s: float
    split_s: float
    unit: str
    bound: str
    bound_one: str


# --------------------------------------------------------------------------------------------
# What the model reads: the hardware (fixed part and configurations) and the op table
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FixedParams:
    """What an architecture space does not search: clock, bandwidths, network levels, and, for
    one real chip, its ``[calibration]``."""

    clock_hz: float
    glb_bandwidth_Bps: float
    hbm_bandwidth_Bps: float
    levels: tuple[network.Level, ...]
    calibration: Calibration | None = None

    @classmethod
    def of(cls, hw, *, chip: bool = False) -> FixedParams:
        """From an :class:`~phaze_ir.hardware.Accelerator` or a FixedParams.  A space's template
        (``chip`` false) must be ideal: a calibration is measured on one chip (its SMs, its
        kernels), so it cannot hold for a space's other core counts; one chip keeps its own."""
        if isinstance(hw, FixedParams):
            return hw
        calibration = getattr(hw, "calibration", None)
        if calibration is not None and not chip:
            raise ValueError(f"{hw.name}: an architecture space's template has no [calibration]")
        return cls(
            clock_hz=float(hw.clock_hz),
            glb_bandwidth_Bps=float(hw.global_buffer.bandwidth_Bps),
            hbm_bandwidth_Bps=float(hw.hbm.bandwidth_Bps),
            levels=network.levels_of(hw.network),
            calibration=calibration,
        )

    @property
    def hbm_Bps(self) -> float:
        """The HBM bandwidth ops achieve: the peak, times the calibrated efficiency if any."""
        return self.hbm_bandwidth_Bps * (1.0 if self.calibration is None else self.calibration.memory_efficiency)


CONFIG_FIELDS = (
    "num_tc",
    "num_vc",
    "width",
    "depth",
    "width_vc",
    "glb_bytes",
    "tc_buffer_bytes",
    "vc_buffer_bytes",
    "fp8_rate",
)

#: One row of a space's candidates (:attr:`phaze.search.arch_space.ArchSpace.configs`) and of
#: :func:`config_of`: :data:`CONFIG_FIELDS` and the chip's area.  Buffers in bytes, area in µm².
CONFIG_DTYPE = np.dtype(
    [
        ("num_tc", np.int64),
        ("num_vc", np.int64),
        ("width", np.int64),
        ("depth", np.int64),
        ("width_vc", np.int64),
        ("glb_bytes", np.int64),
        ("tc_buffer_bytes", np.int64),
        ("vc_buffer_bytes", np.int64),
        ("area_um2", np.float64),
        ("fp8_rate", np.int64),
    ]
)


def _config_values(acc) -> dict[str, int]:
    """One accelerator's values of :data:`CONFIG_FIELDS`."""
    tc, vc = acc.tensor_cores, acc.vector_cores
    return {
        "num_tc": tc.count,
        "num_vc": vc.count,
        "width": tc.pe_x,
        "depth": tc.pe_y,
        "width_vc": vc.width,
        "glb_bytes": acc.global_buffer.bytes,
        "tc_buffer_bytes": tc.buffer_bytes,
        "vc_buffer_bytes": vc.buffer_bytes,
        "fp8_rate": tc.fp8_rate or 0,  # 0: no FP8 datapath (a calibrated chip's FP8 is fp8_gemm_flops)
    }


def chip_cfg(acc) -> dict[str, np.ndarray]:
    """One accelerator's configuration as the formulas take a space's: ``[1, 1]`` int64 arrays
    by :data:`CONFIG_FIELDS`, and ``stream_k``: 1 where its GEMMs run as a library's waves of
    output tiles (a calibration with wave tiles), whose HBM traffic may stream K
    (:func:`_hbm_matmul_bytes`); a space's ideal chips have none."""
    cfg = {f: np.asarray([[v]], dtype=np.int64) for f, v in _config_values(acc).items()}
    cal = acc.calibration
    cfg["stream_k"] = np.asarray([[int(cal is not None and cal.waves)]], dtype=np.int64)
    return cfg


def config_of(acc) -> np.ndarray:
    """One accelerator's on-chip configuration as a 1-row array of ``CONFIG_DTYPE`` (the form
    :func:`estimate_space` takes; ``area_um2`` is NaN when outside the area model)."""
    row = np.zeros(1, dtype=CONFIG_DTYPE)
    for f, v in _config_values(acc).items():
        row[f] = v
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
    "launches",
    "fp32",
    "syncs",
    "split_accumulation",
    "rowwise",
    "post_scale_bytes",
    "post_scale_launches",
    "attention",
    "backend",
)
_VEC_FIELDS = ("work", "read_bytes", "write_bytes", "passes", "row_bytes", "launches", "column", "attention", "backend")


class DescRows:
    """Op descriptions, each once, in the order first seen: :meth:`row` is the row of one
    (appended when new), :attr:`descs` the list an :class:`OpTable` is then built from; started
    from a table's descriptions to add the rows a later pricing needs (chunks, ring steps)."""

    def __init__(self, descs: Iterable[OpDesc] = ()):
        self.descs: list[OpDesc] = list(descs)
        self._row_of = {d: r for r, d in enumerate(self.descs)}

    def row(self, d: OpDesc) -> int:
        if d not in self._row_of:
            self._row_of[d] = len(self.descs)
            self.descs.append(d)
        return self._row_of[d]


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
        for unit, names in (("tensor", _MM_FIELDS), ("vector", _VEC_FIELDS)):
            self.cols[unit] = {
                f: np.asarray([int(getattr(self.descs[i], f)) for i in groups[unit]], dtype=np.int64) for f in names
            }

    @classmethod
    def build(cls, descs: Iterable[OpDesc]) -> OpTable:
        return cls(list(descs))

    def __len__(self) -> int:
        return len(self.descs)

    @property
    def units(self) -> tuple[str, ...]:
        return tuple(d.unit for d in self.descs)


def op_columns(d: MatmulDesc | VectorDesc) -> dict[str, int]:
    """One description's columns as Python integers (the formulas below take them as they
    take ``[u, 1]`` arrays)."""
    return {f: int(getattr(d, f)) for f in (_MM_FIELDS if isinstance(d, MatmulDesc) else _VEC_FIELDS)}


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

    def op(self, row: int, config: int = 0) -> OpLatency:
        """Op ``row`` on configuration ``config`` as Python numbers."""
        return OpLatency(
            float(self.one[row, config]),
            float(self.split[row, config]),
            self.units[row],
            BOUNDS[self.bound[row, config]],
            BOUNDS[self.bound_one[row, config]],
        )


# --------------------------------------------------------------------------------------------
# The formulas, each written once.  They take a chunk of ops' columns ([u, 1] arrays) and the
# configurations ([1, C] arrays) and broadcast: the same code prices a module's ops on its one
# chip and a table of ops on a whole architecture space.  The traffic formulas also take one
# op's Python integers (the per-op counts of the energy model).
# --------------------------------------------------------------------------------------------


def _cdiv(a, b):
    return -(-a // b)


def _roofline(compute_s: np.ndarray, glb_s: np.ndarray, hbm_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The largest term and the index of its label in :data:`BOUNDS` (ties go to compute,
    then GLB)."""
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


#: The one line a chip without an FP8 GEMM rate answers a step with FP8 GEMMs (``--dtype fp8``).
FP8_REFUSAL = (
    "--dtype fp8: {chip} has no FP8 GEMM rate ([calibration] fp8_gemm_flops): FP8 training needs a chip "
    "with FP8 tensor cores and that figure in its hardware file"
)


#: The one line a chip of an architecture space without the FP8 datapath answers FP8 GEMMs with.
FP8_DATAPATH_REFUSAL = (
    "--dtype fp8: {chip} has no FP8 datapath in its PE arrays (tensor_cores.fp8_rate): FP8 training needs "
    "tensor cores that take FP8 operands"
)


def fp8_problem(accelerator) -> str | None:
    """Why ``--dtype fp8`` cannot run on ``accelerator`` (a :class:`~phaze_ir.hardware.Accelerator`),
    None when it can: what a driver checks before any work.  A calibrated chip runs FP8 at its
    ``[calibration] fp8_gemm_flops``, an ideal one (an architecture space's) on the FP8
    datapath of its PE arrays (``tensor_cores.fp8_rate``)."""
    cal = accelerator.calibration
    if cal is None:
        return None if accelerator.tensor_cores.fp8_rate else FP8_DATAPATH_REFUSAL.format(chip=accelerator.name)
    return FP8_REFUSAL.format(chip=accelerator.name) if cal.fp8_gemm_flops is None else None


def fp8_gemms(cols):
    """Which GEMMs run on FP8 operands: both of one byte (the importer's ``f8E4M3FN`` and
    ``f8E5M2`` casts of ``--dtype fp8``; no other one-byte GEMM is traced)."""
    return (cols["a_elem"] == 1) & (cols["b_elem"] == 1)


def misaligned(cols):
    """Whether one of a GEMM's dimensions is not a multiple of 16 bytes of its operands (the
    alignment cuBLAS's fast Hopper and Ampere kernels need of every leading dimension)."""
    elem = np.maximum(cols["a_elem"], cols["b_elem"])
    return (cols["m"] * elem % 16 != 0) | (cols["n"] * elem % 16 != 0) | (cols["k"] * elem % 16 != 0)


def wave_s(batch, m, n, k, tile_m: int, tile_n: int, units: int, peak_flops):
    """Seconds of GEMMs in waves of full output tiles: ``batch · ceil(M / tile_m) · ceil(N /
    tile_n)`` tiles dealt to ``units`` units, each wave as long as one full tile at a unit's
    share of ``peak_flops``.  Integers, or numpy arrays that broadcast (element by element, the
    same floats: ``benchmarks/gpu/fit_h100.py`` fits with it)."""
    tiles = batch * (-(-m // tile_m)) * (-(-n // tile_n))
    waves = -(-tiles // units)
    return waves * 2.0 * tile_m * tile_n * k * units / peak_flops


def _hbm_matmul_bytes(cols, glb_bytes, stream_k=0):
    """HBM traffic of GEMMs with a global buffer of ``glb_bytes`` (module docstring); ``stream_k``
    (nonzero: a chip whose GEMMs run as waves of output tiles) adds the blocking that keeps the
    result and streams K."""
    batch, m, n, k = cols["batch"], cols["m"], cols["n"], cols["k"]
    rhs_batched, bias = cols["rhs_batched"] != 0, cols["bias_bytes"]
    rows = np.where(rhs_batched, m, batch * m)
    problems = np.where(rhs_batched, batch, 1)
    a1, b1, c1 = rows * k * cols["a_elem"], k * n * cols["b_elem"], rows * n * cols["c_elem"]
    compulsory = cols["a_bytes"] + cols["b_bytes"] + batch * m * n * cols["c_elem"] + bias
    half = np.maximum(1, glb_bytes // 2)
    keep_b = b1 + a1 * _cdiv(b1, half) + c1
    keep_a = a1 + b1 * _cdiv(a1, half) + c1
    kept = np.minimum(keep_b, keep_a)
    # or, on a GPU, the result stays: an r x c block of fp32 partial sums in half the buffer while
    # A's r rows and B's c columns stream past along K, A once per column block, B once per row
    # block (CUTLASS's mainloop: each output tile accumulates over the whole K on chip); the
    # K-long panels above get thin when K is long (a weight gradient's K is every token)
    sums = np.maximum(1, half // ACC_BYTES)
    r = np.minimum(rows, np.maximum(1, np.sqrt(sums).astype(np.int64)))
    c = np.minimum(n, np.maximum(1, sums // r))
    r = np.minimum(rows, np.maximum(1, sums // c))
    keep_c = a1 * _cdiv(n, c) + b1 * _cdiv(rows, r) + c1
    kept = np.where(np.asarray(stream_k) != 0, np.minimum(kept, keep_c), kept)
    blocked = np.maximum(compulsory, problems * kept + bias)
    hbm_bytes = np.where(a1 + b1 + c1 <= glb_bytes, compulsory, blocked)
    # inside a fused kernel, which tiles to keep its working set on chip: the rest, unblocked
    onchip = cols["onchip_bytes"]
    return np.where(onchip > 0, np.maximum(0, compulsory - onchip), hbm_bytes)


def _glb_matmul_bytes(cols, tiles_m, tiles_n, sharers):
    """Bytes GEMMs move between the global buffer and the cores (module docstring), on one core
    and split: ``A`` streamed once per weight column, or per group of ``sharers`` of them; ``B``
    loaded once per M block, ``C`` written and the bias read once."""
    batch, m, n, k = cols["batch"], cols["m"], cols["n"], cols["k"]
    a_stream = batch * m * k * cols["a_elem"]
    rest = batch * tiles_m * k * n * cols["b_elem"] + batch * m * n * cols["c_elem"] + cols["bias_bytes"]
    return a_stream * tiles_n + rest, a_stream * _cdiv(tiles_n, sharers) + rest


def matmul_traffic_space(cols: dict[str, np.ndarray], cfg: dict[str, np.ndarray], tiling: Tiling | None = None):
    """The tiling and traffic of a chunk of GEMMs on configurations ([u, 1] columns, [1, C]
    configs): ``(tiling, hbm_bytes, glb_one_bytes, glb_split_bytes)``, [u, C] each.  ``tiling``:
    the GEMMs' own (a pass's ``phaze.tile``), else tiled here."""
    t = tiling
    if t is None:
        shape = (cols["batch"], cols["m"], cols["n"], cols["k"])
        t = tile_gemm(*shape, cfg["width"], cfg["depth"], cfg["num_tc"], cfg["tc_buffer_bytes"])
    hbm_bytes = _hbm_matmul_bytes(cols, cfg["glb_bytes"], cfg.get("stream_k", 0))
    glb_one, glb_split = _glb_matmul_bytes(cols, t.tiles_m, t.tiles_n, np.minimum(cfg["num_tc"], t.tiles_n))
    return t, hbm_bytes, glb_one, glb_split


def _matmul_space(cols: dict[str, np.ndarray], cfg: dict[str, np.ndarray], fx: FixedParams, tiling=None):
    """``(one, split, bound, bound_one)``, [u, C] arrays for a chunk of GEMMs.  A calibrated
    chip's terms apply in the order they always have (the floats of every plan depend on it)."""
    t, hbm_bytes, glb_one, glb_split = matmul_traffic_space(cols, cfg, tiling)
    cal = fx.calibration
    compute_one, compute_split = t.cycles_one / fx.clock_hz, t.cycles_split / fx.clock_hz
    if cal is not None:
        peak = 2.0 * (cfg["num_tc"] * cfg["width"] * cfg["depth"]) * fx.clock_hz  # peak_tensor_flops
        if cal.waves:  # a GPU's GEMM library deals output tiles to SMs: not the PE-array tiling
            # a GEMM launched as several kernels (launches > 1) is quantised per kernel, each
            # ceil(batch / launches) products
            kernels = np.maximum(1, np.minimum(cols["launches"], cols["batch"]))
            per = _cdiv(cols["batch"], kernels)
            assert cal.wave_tile_m is not None and cal.wave_tile_n is not None and cal.wave_units is not None
            compute_split = wave_s(
                per, cols["m"], cols["n"], cols["k"], cal.wave_tile_m, cal.wave_tile_n, cal.wave_units, peak
            )
            compute_split = compute_split * kernels
        compute_one = compute_one / cal.tensor_efficiency
        compute_split = compute_split / cal.tensor_efficiency
        if cal.fp32_gemm_flops is not None:  # fp32 GEMMs on the CUDA cores, not tensor cores
            fp32, slower = cols["fp32"] != 0, peak / cal.fp32_gemm_flops
            compute_one = np.where(fp32, compute_one * slower, compute_one)
            compute_split = np.where(fp32, compute_split * slower, compute_split)
        fp8 = fp8_gemms(cols)
        if fp8.any():  # FP8 GEMMs at the tensor cores' FP8 rate
            if cal.fp8_gemm_flops is None:
                raise ValueError(FP8_REFUSAL.format(chip="the chip"))
            faster = peak / cal.fp8_gemm_flops
            compute_one = np.where(fp8, compute_one * faster, compute_one)
            compute_split = np.where(fp8, compute_split * faster, compute_split)
            split_acc = fp8 & (cols["split_accumulation"] != 0)
            slower = 1.0 / cal.fp8_split_accumulation_efficiency
            compute_one = np.where(split_acc, compute_one * slower, compute_one)
            compute_split = np.where(split_acc, compute_split * slower, compute_split)
            cutlass = fp8 & (cols["rowwise"] != 0) & ~split_acc  # PyTorch's rowwise kernel, not cuBLAS
            if cutlass.any():
                slower = 1.0 / cal.fp8_rowwise_gemm_efficiency
                compute_one = np.where(cutlass, compute_one * slower, compute_one)
                compute_split = np.where(cutlass, compute_split * slower, compute_split)
        bad = misaligned(cols)
        compute_one = np.where(bad, compute_one / cal.misaligned_gemm_efficiency, compute_one)
        compute_split = np.where(bad, compute_split / cal.misaligned_gemm_efficiency, compute_split)
    elif (fp8 := fp8_gemms(cols)).any():  # FP8 GEMMs on the PE arrays' FP8 datapath: fp8_rate MACs a cycle
        rate = cfg["fp8_rate"]
        if (fp8 & (rate <= 0)).any():
            raise ValueError(FP8_DATAPATH_REFUSAL.format(chip="the chip"))
        faster = np.where(fp8, 1.0 / np.maximum(rate, 1), 1.0)  # exactly 1.0 for the GEMMs of 16 bits
        compute_one, compute_split = compute_one * faster, compute_split * faster
    causal = cols["causal"] != 0
    if causal.any():
        frac = causal_fraction(cols["m"], cols["n"], cols["k"], cols["causal"])
        compute_one = np.where(causal, compute_one * frac, compute_one)
        compute_split = np.where(causal, compute_split * frac, compute_split)
    kernel_s = attention_compute_s(cols, cfg, fx)
    if kernel_s is not None:  # fused attention at its kernel's rate for its shape: the published
        # rate is the whole kernel's, its tiles' trips through the L2 included (the scores stay
        # in the SMs), so no GLB term; its HBM traffic (the boundary's) still bounds it
        priced = ~np.isnan(kernel_s)
        compute_split = np.where(priced, kernel_s, compute_split)
        compute_one = np.where(priced, kernel_s * cfg["num_tc"], compute_one)
        glb_one, glb_split = np.where(priced, 0, glb_one), np.where(priced, 0, glb_split)
    hbm_s = hbm_bytes / fx.hbm_Bps
    one, bound_one = _roofline(compute_one, glb_one / fx.glb_bandwidth_Bps, hbm_s)
    split, bound = _roofline(compute_split, glb_split / fx.glb_bandwidth_Bps, hbm_s)
    if cal is not None:
        overhead = cal.kernel_overhead_s * cols["launches"]
        if cal.host_sync_s is not None:
            overhead = overhead + cal.host_sync_s * cols["syncs"]
        one, split = one + overhead, split + overhead
    if (cols["post_scale_launches"] > 0).any():  # the pass after the GEMM, memory bound, in its own kernels
        post = cols["post_scale_bytes"] / fx.hbm_Bps
        if cal is not None:
            post = post + cal.kernel_overhead_s * cols["post_scale_launches"]
        one, split = one + post, split + post
    return one, split, bound, bound_one


def attention_table(fx: FixedParams):
    """The chip's attention kernel table (``[calibration] attention_kernels``), None without one."""
    from passes.algorithms import attention

    cal = fx.calibration
    name = None if cal is None else getattr(cal, "attention_kernels", None)
    return None if name is None else attention.load(name)


def attention_priced(cols, fx: FixedParams) -> np.ndarray | None:
    """Which rows of a chunk are ops of a fused attention kernel the chip's table prices (a
    boolean array like ``cols["attention"]``), None when none is."""
    from passes.algorithms.attention import BACKENDS

    table = attention_table(fx)
    if table is None or not (cols["attention"] != 0).any():
        return None
    known = np.asarray([table.has(b) for b in BACKENDS])
    return (cols["attention"] != 0) & known[np.clip(cols["backend"], 0, len(BACKENDS) - 1)]


def attention_compute_s(cols, cfg, fx: FixedParams) -> np.ndarray | None:
    """The compute seconds of a chunk's fused attention GEMMs at their kernel's rate for their
    shape (``passes/algorithms/attention.py``): the FLOPs the kernel computes (the causal share
    of the square under a causal mask) over ``peak · efficiency``; NaN on the other rows, None
    when no row is one.  The sequence length is the GEMM's longest dimension, the head
    dimension its shortest (``QKᵀ``: s×d·d×s; the others s×s·s×d)."""
    from passes.algorithms import attention

    priced = attention_priced(cols, fx)
    if priced is None or not priced.any():
        return None
    table = attention_table(fx)
    assert table is not None
    peak = 2.0 * (cfg["num_tc"] * cfg["width"] * cfg["depth"]) * fx.clock_hz
    m, n, k = (np.broadcast_to(cols[f], priced.shape) for f in ("m", "n", "k"))
    out = np.full(np.broadcast_shapes(priced.shape, peak.shape), np.nan)
    for idx in zip(*np.nonzero(priced)):
        row = {f: int(np.broadcast_to(cols[f], priced.shape)[idx]) for f in ("attention", "backend", "causal", "batch")}
        mm, nn, kk = int(m[idx]), int(n[idx]), int(k[idx])
        seq, head_dim = max(mm, nn, kk), min(mm, nn, kk)
        flops = 2.0 * row["batch"] * mm * nn * kk
        if row["causal"]:
            flops *= float(causal_fraction(mm, nn, kk, row["causal"]))
        if 2 <= row["causal"] < seq:  # a window of w keys: looked up as the causal kernel whose
            # rows are as long on average (s/2 keys at s = 2w): each query tile loops over w keys
            seq = 2 * row["causal"]
        p = float(np.broadcast_to(peak, out.shape)[idx])
        eff = attention.efficiency(
            table,
            attention.BACKENDS[row["backend"]],
            attention.PASSES[row["attention"] - 1],
            bool(row["causal"]),
            seq,
            head_dim,
            p,
        )
        if eff is not None:
            out[idx] = flops / (p * eff)
    return out


def _vector_bytes(cols, buffer_bytes):
    """Bytes vector ops move into a buffer of ``buffer_bytes`` from the level below: their
    reads (once per pass when one reduced row does not fit half the buffer) and writes."""
    read, passes = cols["read_bytes"], cols["passes"]
    reads = np.where((passes > 1) & (cols["row_bytes"] > buffer_bytes // 2), read * passes, read)
    return reads + cols["write_bytes"]


def vector_traffic_space(cols: dict[str, np.ndarray], cfg: dict[str, np.ndarray]):
    """The traffic of a chunk of vector ops on configurations: ``(core_bytes, hbm_bytes)``,
    [u, C] each (into a vector core's buffer and into the global buffer)."""
    return _vector_bytes(cols, cfg["vc_buffer_bytes"]), _vector_bytes(cols, cfg["glb_bytes"])


def _vector_space(cols: dict[str, np.ndarray], cfg: dict[str, np.ndarray], fx: FixedParams):
    """``(one, split, bound, bound_one)``, [u, C] arrays for a chunk of vector ops."""
    core_bytes, hbm_bytes = vector_traffic_space(cols, cfg)
    glb_s = core_bytes / fx.glb_bandwidth_Bps
    hbm_s = hbm_bytes / fx.hbm_Bps
    if fx.calibration is not None and (cols["column"] != 0).any():  # reads across the slow dimension
        hbm_s = np.where(cols["column"] != 0, hbm_s / fx.calibration.column_read_efficiency, hbm_s)
    work, width = cols["work"], cfg["width_vc"]
    priced = attention_priced(cols, fx)
    if priced is not None:  # inside a fused attention priced by its kernel's rate: no own compute
        work = np.where(priced, 0, work)
    one, bound_one = _roofline(_cdiv(work, width) / fx.clock_hz, glb_s, hbm_s)
    split, bound = _roofline(_cdiv(work, width * cfg["num_vc"]) / fx.clock_hz, glb_s, hbm_s)
    if fx.calibration is not None:
        overhead = fx.calibration.kernel_overhead_s * cols["launches"]
        one, split = one + overhead, split + overhead
    return one, split, bound, bound_one


# --------------------------------------------------------------------------------------------
# Pricing a table: on a space (cached) or on one chip
# --------------------------------------------------------------------------------------------


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
    :data:`CONFIG_DTYPE` (``ArchSpace.configs``, or
    :func:`config_of` for one accelerator); ``fixed``: the template
    :class:`~phaze_ir.hardware.Accelerator` (or :class:`FixedParams`) giving the clock, the
    bandwidths and the network (ideal: a calibrated chip is priced by :func:`estimate_chip`).
    Rows are computed ``chunk`` ops at a time (bounding the temporaries to ``chunk × configs``)
    and cached per op description in ``cache``.
    """
    configs = np.asarray(configs)
    cfg = {f: np.ascontiguousarray(configs[f], dtype=np.int64)[None, :] for f in CONFIG_FIELDS}
    fx = FixedParams.of(fixed)
    key = (configs_key(configs), fx) if cache is not None else None
    return _estimate(op_table, cfg, fx, chunk=chunk, cache=cache, key=key)


def estimate_chip(
    op_table: OpTable | Sequence[OpDesc], acc, tilings: Sequence[ScalarTiling | None] | None = None
) -> SpaceLatency:
    """Latency of every op of ``op_table`` on the one accelerator ``acc`` (calibrated or not):
    :func:`estimate_space`'s model on a single configuration, every op priced in one call
    (``[U, 1]`` arrays).  ``tilings``: each row's GEMM tiling (a pass's ``phaze.tile``), given
    for every GEMM row or for none (then tiled here)."""
    fx = FixedParams.of(acc, chip=True)
    table = op_table if isinstance(op_table, OpTable) else OpTable(op_table)
    out = _estimate(table, chip_cfg(acc), fx, chunk=max(1, len(table)), tilings=tilings)
    return _power_limited(out, table, acc, tilings)


def _power_limited(
    lat: SpaceLatency, table: OpTable, acc, tilings: Sequence[ScalarTiling | None] | None
) -> SpaceLatency:
    """``lat`` with every GEMM and vector op run at the clock the chip's power limit allows
    (``[energy] power_limit_w``; docs/energy.md): an op drawing more than the limit less the
    chip's static power lasts ``(t0 − launch costs) / s`` plus its launch costs, ``s`` the clock
    ratio at which its power fits (``energy.clock_ratio``; its die's energy per op falling as
    ``s^gamma``, ``[energy] clock_energy_exponent``; 0: the op lasts its dynamic energy over
    the headroom).  An op the limit lengthens is bound by ``"power"``.  Split over the chip
    only (an op alone on one core draws a fraction of the chip's power).  Unchanged without a
    limit."""
    from passes.algorithms.energy import chip_energy_parts, clock_limited_time_s, power_headroom_w

    headroom = power_headroom_w(acc)
    if headroom is None:
        return lat
    rows = table.rows["tensor"]
    tiles = _tiling_rows(tilings, rows) if tilings is not None and len(rows) else None
    # a calibrated GEMM's energy is read against its fitted time (energy.fitted_share): the
    # limit slows only what the fit did not see (FP8's MACs, a lower limit than the fit's)
    energy, hbm = chip_energy_parts(table, acc, tiles)
    overheads = op_overheads(table, acc)
    capped = _attention_energy_at_the_tables_limit(energy, lat, table, acc, overheads)
    if capped is not energy:  # an attention kernel's energy held to its table's limit: HBM's alike
        hbm = hbm * np.divide(capped, energy, out=np.ones_like(energy), where=energy > 0)
    gamma = acc.energy.clock_energy_exponent
    floor = clock_limited_time_s(capped, hbm, lat.split[:, 0], overheads, headroom, gamma)
    slower = floor > lat.split[:, 0] * (1 + 1e-12)
    if not slower.any():
        return lat
    split = lat.split.copy()
    bound = lat.bound.copy()
    split[slower, 0] = floor[slower]
    bound[slower, 0] = _POWER
    return SpaceLatency(lat.one, split, bound, lat.bound_one, lat.units)


def op_overheads(table: OpTable, acc) -> np.ndarray:
    """Each op's launch costs on ``acc`` (``[U]`` seconds: a calibrated chip's
    ``kernel_overhead_s`` per launch, and a GEMM's ``host_sync_s`` per sync; 0 elsewhere):
    the part of an op's time the power limit's clock does not stretch."""
    overheads = np.zeros(len(table))
    cal = acc.calibration
    if cal is not None:
        for unit in ("tensor", "vector"):
            rows = table.rows[unit]
            if len(rows):
                overheads[rows] = op_overhead_s(table.cols[unit], unit, cal)
    return overheads


def op_overhead_s(cols: Mapping[str, Any], unit: str, cal) -> Any:
    """The launch costs of ops of ``unit`` (``tensor`` or ``vector``) with columns ``cols``
    (arrays or one description's :func:`op_columns`) under calibration ``cal`` (None: 0)."""
    if cal is None:
        return 0.0
    overhead = cal.kernel_overhead_s * cols["launches"]
    if unit == "tensor" and cal.host_sync_s is not None:
        overhead = overhead + cal.host_sync_s * cols["syncs"]
    return overhead


def _attention_energy_at_the_tables_limit(
    energy: np.ndarray, lat: SpaceLatency, table: OpTable, acc, overheads: np.ndarray
) -> np.ndarray:
    """``energy`` with each op of a fused attention kernel the chip's table prices spending at
    most what the limit the table was measured under (``[calibration] fitted_power_limit_w``,
    else ``[energy] power_limit_w``, less the static power) allows over its priced time.  The
    table's rates are whole kernels timed on the part at that limit (the FlashAttention-3 paper's
    H100 SXM5 at its 700 W; phaze's own ``data/h100/attention.csv``: torch's SDPA at cuDNN's
    rates), so their time already holds the clock the limit allowed, softmax included: the
    softmax, its row sums and the GQA repeats inside the kernel (work the table's time holds,
    their own priced time none or their bytes) add no floor of their own, and on a part with a
    lower limit the kernel's GEMMs are slowed by the ratio of the headrooms, as a fitted GEMM is
    (``energy.fitted_share``).  Unchanged without a table."""
    fx = FixedParams.of(acc, chip=True)
    e, cal = acc.energy, acc.calibration
    allowed = ((cal.fitted_power_limit_w if cal is not None else None) or e.power_limit_w) - acc.static_power_w
    out = energy
    for unit in ("tensor", "vector"):
        rows = table.rows[unit]
        priced = attention_priced(table.cols[unit], fx) if len(rows) else None
        if priced is None or not priced.any():
            continue
        idx = rows[priced]
        seconds = np.maximum(lat.split[idx, 0] - overheads[idx], 0.0)
        if out is energy:
            out = energy.copy()
        out[idx] = np.minimum(energy[idx], allowed * seconds)
    return out


def _tiling_rows(tilings: Sequence[ScalarTiling | None], rows: np.ndarray) -> dict[str, np.ndarray]:
    """The :class:`Tiling` fields of the given GEMM rows, one array each."""
    given = [tilings[int(i)] for i in rows]
    if any(t is None for t in given):
        raise ValueError("estimate_chip: tilings must give every GEMM's tiling, or be None")
    return {f.name: np.asarray([getattr(t, f.name) for t in given]) for f in fields(Tiling)}


def _estimate(
    op_table: OpTable | Sequence[OpDesc],
    cfg: dict[str, np.ndarray],
    fx: FixedParams,
    *,
    chunk: int,
    cache: LatencyCache | None = None,
    key: tuple | None = None,
    tilings: Sequence[ScalarTiling | None] | None = None,
) -> SpaceLatency:
    table = op_table if isinstance(op_table, OpTable) else OpTable(op_table)
    C = cfg["num_tc"].shape[1]
    U = len(table)
    one = np.empty((U, C), dtype=np.float64)
    split = np.empty((U, C), dtype=np.float64)
    bound = np.empty((U, C), dtype=np.uint8)
    bound_one = np.empty((U, C), dtype=np.uint8)

    def cached(i: int) -> bool:
        if cache is None or key is None:
            return False
        row = cache.get((table.descs[i], *key))
        if row is None:
            return False
        one[i], split[i], bound[i], bound_one[i] = row
        return True

    def store(i: int) -> None:
        if cache is not None and key is not None:
            cache.put((table.descs[i], *key), (one[i].copy(), split[i].copy(), bound[i].copy(), bound_one[i].copy()))

    for unit in ("tensor", "vector"):
        rows = table.rows[unit]
        todo = np.asarray([j for j, i in enumerate(rows) if not cached(int(i))], dtype=np.int64)
        tiles = _tiling_rows(tilings, rows) if unit == "tensor" and tilings is not None else None
        for s in range(0, len(todo), chunk):
            sel = todo[s : s + chunk]
            cols = {f: v[sel][:, None] for f, v in table.cols[unit].items()}
            if unit == "vector":
                o, sp, b, bo = _vector_space(cols, cfg, fx)
            else:
                t = None if tiles is None else Tiling(**{f: v[sel][:, None] for f, v in tiles.items()})
                o, sp, b, bo = _matmul_space(cols, cfg, fx, t)
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
# One op: the same model on a one-row table
# --------------------------------------------------------------------------------------------


@lru_cache(maxsize=65536)
def estimate_op(d: OpDesc, acc) -> OpLatency:
    """Latency of one op on accelerator ``acc`` (a :class:`phaze_ir.hardware.Accelerator`);
    cached by (description, accelerator), both hashable."""
    return estimate_chip([d], acc).op(0)


def estimate_matmul(d: MatmulDesc, acc, tiling: ScalarTiling | None = None) -> OpLatency:
    """Latency of a GEMM on ``acc``'s tensor cores (``tiling`` if already computed)."""
    return estimate_chip([d], acc, None if tiling is None else [tiling]).op(0)


def hbm_matmul_bytes(d: MatmulDesc, glb_bytes: int, stream_k: bool = False) -> int:
    """HBM traffic of a GEMM with a global buffer of ``glb_bytes`` (see the module docstring);
    ``stream_k``: on a chip whose GEMMs run as waves of output tiles (a GPU's)."""
    return int(_hbm_matmul_bytes(op_columns(d), glb_bytes, int(stream_k)))


def glb_matmul_bytes(d: MatmulDesc, t: ScalarTiling, sharers: int) -> int:
    """Bytes a GEMM moves between the global buffer and the cores, ``A`` streamed once per
    group of ``sharers`` weight columns (module docstring)."""
    return int(_glb_matmul_bytes(op_columns(d), t.tiles_m, t.tiles_n, sharers)[1])


def vector_traffic(d: VectorDesc, buffer_bytes: int) -> int:
    """Bytes a vector op moves into a buffer of ``buffer_bytes`` from the level below."""
    return int(_vector_bytes(op_columns(d), buffer_bytes))


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
