"""Chip-area model of the paper's architecture space (22 nm, areas in µm²), vectorized with numpy.

    A = n_tc · (PE · W · D + SRAM(b_tc))  +  n_vc · (LANE · Wv + SRAM(b_vc))  +  GLB(g)

with W × D the tensor-core PE array, Wv the vector width, b_tc = max(1 KiB, 16·W·D) bytes and
b_vc = max(1 KiB, 16·Wv) bytes the per-core buffers (16 B per PE or lane, at least 1 KiB), g the
global-buffer size, ``SRAM`` and ``GLB`` tables by capacity.  A PE with the FP8 datapath (the
space's ``fp8_rate`` axis: FP8 GEMMs at twice the bf16 rate) is ``FP8_PE_AREA_RATIO`` times a bf16
PE (``[fp8_datapath]`` of ``area_22nm.toml``, with its source).

Provenance: these are the 22 nm estimates (Accelergy) behind the paper's public code; the model
reproduces every one of the 29,360 rows of its ``cores.json`` (the reference list of valid
configurations, with areas) to within 1e-7 µm² (the float rounding of its printed values).
The two per-unit constants were recovered from those rows by least squares as exactly
``760.041386`` µm² per PE and ``759.823853`` µm² per vector lane (docs/design.md §4.2; rounded to
760.0414 and 759.8239; with the rounded values the areas drift by up to 13 µm², 6e-8 relative).
The numbers live in ``area_22nm.toml`` beside this file, each with its source (docs/design.md §4.2).

The TPUv4-like chip (8 tensor cores of 128 × 128, 2 vector cores of width 128, 128 MiB global
buffer) is 278,826,676.31216 µm² = 278.83 mm²: the paper's area budget.

Everything takes numpy arrays (or scalars, broadcast together) and is pure: no xDSL, no phaze IR.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import tomllib

__all__ = [
    "AreaModelError",
    "PE_AREA_UM2",
    "VC_LANE_AREA_UM2",
    "SRAM_AREA_UM2",
    "GLB_AREA_UM2",
    "BUFFER_BYTES_PER_UNIT",
    "MIN_CORE_BUFFER_BYTES",
    "tc_buffer_bytes",
    "vc_buffer_bytes",
    "sram_area_um2",
    "glb_area_um2",
    "tensor_core_area_um2",
    "vector_core_area_um2",
    "chip_area_um2",
    "in_domain",
    "FP8_RATE",
    "FP8_PE_AREA_RATIO",
    "FP8_MAC_ENERGY_RATIO",
    "fp8_pe_factor",
    "fp8_mac_j",
]

KiB = 1024
MiB = 1024**2

#: The model's numbers, with their sources: a TOML file beside this one.
AREA_TABLE = Path(__file__).with_name("area_22nm.toml")


def _load_table(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        data = tomllib.load(f)
    return {
        **data,
        "sram_um2": {int(k): float(v) for k, v in data["sram_um2"].items()},
        "glb_um2": {int(k): float(v) for k, v in data["glb_um2"].items()},
    }


_TABLE = _load_table(AREA_TABLE)
#: Area of one tensor-core processing element (a MAC with its registers), µm².
PE_AREA_UM2: float = float(_TABLE["pe_um2"])
#: Area of one vector-core lane, µm².
VC_LANE_AREA_UM2: float = float(_TABLE["lane_um2"])
#: Per-core buffer (the reference's "L2") SRAM area by capacity: bytes -> µm².
SRAM_AREA_UM2: dict[int, float] = _TABLE["sram_um2"]
#: Global-buffer SRAM area by capacity: bytes -> µm².
GLB_AREA_UM2: dict[int, float] = _TABLE["glb_um2"]
#: Bytes of per-core buffer per PE (tensor core) or per lane (vector core).
BUFFER_BYTES_PER_UNIT: int = int(_TABLE["buffer_bytes_per_unit"])
#: Smallest per-core buffer, bytes.
MIN_CORE_BUFFER_BYTES: int = int(_TABLE["min_core_buffer_bytes"])
#: The FP8 datapath of a PE (``[fp8_datapath]``): FP8 MACs per cycle as a multiple of the bf16
#: ones (the one rate modelled), the PE's area with it over the PE's without, and one FP8 MAC's
#: energy over one bf16 MAC's.
FP8_RATE: int = int(_TABLE["fp8_datapath"]["rate"])
FP8_PE_AREA_RATIO: float = float(_TABLE["fp8_datapath"]["pe_area_ratio"])
FP8_MAC_ENERGY_RATIO: float = float(_TABLE["fp8_datapath"]["mac_energy_ratio"])

_SRAM_KEYS = np.array(sorted(SRAM_AREA_UM2), dtype=np.int64)
_SRAM_VALS = np.array([SRAM_AREA_UM2[k] for k in sorted(SRAM_AREA_UM2)], dtype=np.float64)
_GLB_KEYS = np.array(sorted(GLB_AREA_UM2), dtype=np.int64)
_GLB_VALS = np.array([GLB_AREA_UM2[k] for k in sorted(GLB_AREA_UM2)], dtype=np.float64)

ArrayLike = npt.ArrayLike


class AreaModelError(ValueError):
    """A configuration outside the area model's domain (a buffer size its tables do not list)."""


def _out(x: np.ndarray) -> Any:
    """Scalars in, Python scalars out; arrays in, arrays out."""
    return x.item() if x.ndim == 0 else x


def tc_buffer_bytes(pe_x: ArrayLike, pe_y: ArrayLike) -> Any:
    """Per-tensor-core buffer the model assumes: max(1 KiB, 16 B · pe_x · pe_y)."""
    prod = np.asarray(pe_x, dtype=np.int64) * np.asarray(pe_y, dtype=np.int64)
    return _out(np.maximum(MIN_CORE_BUFFER_BYTES, BUFFER_BYTES_PER_UNIT * prod))


def vc_buffer_bytes(width: ArrayLike) -> Any:
    """Per-vector-core buffer the model assumes: max(1 KiB, 16 B · width)."""
    return _out(np.maximum(MIN_CORE_BUFFER_BYTES, BUFFER_BYTES_PER_UNIT * np.asarray(width, dtype=np.int64)))


def _lookup(keys: np.ndarray, vals: np.ndarray, nbytes: ArrayLike, what: str) -> np.ndarray:
    x = np.asarray(nbytes, dtype=np.int64)
    idx = np.clip(np.searchsorted(keys, x), 0, len(keys) - 1)
    ok = keys[idx] == x
    if not np.all(ok):
        bad = int(x[~ok].flat[0]) if x.ndim else int(x)
        sizes = ", ".join(_fmt_bytes(int(k)) for k in keys)
        raise AreaModelError(f"no {what} area for {bad} bytes ({_fmt_bytes(bad)}): the 22 nm table lists {sizes}")
    return vals[idx]


def _fmt_bytes(n: int) -> str:
    if n % MiB == 0:
        return f"{n // MiB} MiB"
    if n % KiB == 0:
        return f"{n // KiB} KiB"
    return f"{n} B"


def sram_area_um2(nbytes: ArrayLike) -> Any:
    """Area (µm²) of a per-core buffer of ``nbytes`` (1 KiB … 1 MiB, powers of two)."""
    return _out(_lookup(_SRAM_KEYS, _SRAM_VALS, nbytes, "per-core buffer"))


def glb_area_um2(nbytes: ArrayLike) -> Any:
    """Area (µm²) of a global buffer of ``nbytes`` (2 MiB … 128 MiB, powers of two)."""
    return _out(_lookup(_GLB_KEYS, _GLB_VALS, nbytes, "global buffer"))


def in_domain(tc_buffer: ArrayLike, vc_buffer: ArrayLike, glb_bytes: ArrayLike) -> Any:
    """Whether the tables cover these buffer sizes (elementwise for arrays)."""
    tcb, vcb, glb = (np.asarray(a, dtype=np.int64) for a in (tc_buffer, vc_buffer, glb_bytes))
    return _out(np.isin(tcb, _SRAM_KEYS) & np.isin(vcb, _SRAM_KEYS) & np.isin(glb, _GLB_KEYS))


def fp8_pe_factor(fp8_rate: ArrayLike) -> np.ndarray:
    """A PE's area over a bf16 PE's: :data:`FP8_PE_AREA_RATIO` with the FP8 datapath
    (``fp8_rate`` > 0), exactly 1.0 without (0)."""
    return np.where(np.asarray(fp8_rate, dtype=np.int64) > 0, FP8_PE_AREA_RATIO, 1.0)


def fp8_mac_j(mac_j: float) -> float:
    """One FP8 MAC's energy (J) on the FP8 datapath of a PE whose bf16 MAC costs ``mac_j``."""
    return mac_j * FP8_MAC_ENERGY_RATIO


def tensor_core_area_um2(
    pe_x: ArrayLike, pe_y: ArrayLike, buffer_bytes: ArrayLike | None = None, fp8_rate: ArrayLike | None = None
) -> Any:
    """Area (µm²) of one tensor core: its PEs and its buffer (default :func:`tc_buffer_bytes`);
    ``fp8_rate`` > 0: PEs with the FP8 datapath (:func:`fp8_pe_factor`; None or 0: without)."""
    w = np.asarray(pe_x, dtype=np.int64)
    d = np.asarray(pe_y, dtype=np.int64)
    buf = tc_buffer_bytes(w, d) if buffer_bytes is None else buffer_bytes
    pe = PE_AREA_UM2 if fp8_rate is None else PE_AREA_UM2 * fp8_pe_factor(fp8_rate)  # x 1.0: the same float
    return _out(pe * w * d + _lookup(_SRAM_KEYS, _SRAM_VALS, buf, "per-core buffer"))


def vector_core_area_um2(width: ArrayLike, buffer_bytes: ArrayLike | None = None) -> Any:
    """Area (µm²) of one vector core: its lanes and its buffer (default :func:`vc_buffer_bytes`)."""
    wv = np.asarray(width, dtype=np.int64)
    buf = vc_buffer_bytes(wv) if buffer_bytes is None else buffer_bytes
    return _out(VC_LANE_AREA_UM2 * wv + _lookup(_SRAM_KEYS, _SRAM_VALS, buf, "per-core buffer"))


def chip_area_um2(
    num_tc: ArrayLike,
    pe_x: ArrayLike,
    pe_y: ArrayLike,
    num_vc: ArrayLike,
    width_vc: ArrayLike,
    glb_bytes: ArrayLike,
    *,
    tc_buffer_bytes: ArrayLike | None = None,
    vc_buffer_bytes: ArrayLike | None = None,
    fp8_rate: ArrayLike | None = None,
) -> Any:
    """Area (µm²) of whole chips, elementwise over broadcast arrays (a float for scalars).

    ``num_tc`` tensor cores of ``pe_x × pe_y`` PEs, ``num_vc`` vector cores of ``width_vc`` lanes,
    a global buffer of ``glb_bytes``; per-core buffers default to what the model assumes;
    ``fp8_rate`` > 0: PE arrays with the FP8 datapath (:data:`FP8_PE_AREA_RATIO` per PE).
    Raises :class:`AreaModelError` for a buffer size outside the tables.
    """
    ntc = np.asarray(num_tc, dtype=np.int64)
    nvc = np.asarray(num_vc, dtype=np.int64)
    area = (
        ntc * tensor_core_area_um2(pe_x, pe_y, tc_buffer_bytes, fp8_rate)
        + nvc * vector_core_area_um2(width_vc, vc_buffer_bytes)
        + _lookup(_GLB_KEYS, _GLB_VALS, glb_bytes, "global buffer")
    )
    return _out(np.asarray(area, dtype=np.float64))
