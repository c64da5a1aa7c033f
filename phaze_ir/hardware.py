"""The hardware description: one accelerator chip and the network that connects many of them.

Everything here is data.  An :class:`Accelerator` comes from a TOML file, from a preset name
(``tpuv4``, ``a100``, ``h100``) or from a plain dict (:meth:`Accelerator.from_dict`, the form the
``phaze.accelerator`` op carries in the IR); :meth:`Accelerator.to_dict` gives that dict back
(JSON-able, fixed key order) and ``from_dict(to_dict(a)) == a`` exactly.

Units are SI throughout, and every quantity carries its unit in its name:

========================  =====================================================
suffix / name             unit
========================  =====================================================
``*_hz``                  hertz (cycles per second)
``bytes``, ``*_bytes``    bytes
``*_Bps``                 bytes per second (capital B: bytes, not bits)
``*_s``                   seconds
``*_w``                   watts
``*_usd``                 US dollars
``*_mm2`` / ``*_um2``     square millimetres / square micrometres
FLOP/s (derived)          floating-point operations per second (a MAC is 2)
========================  =====================================================

The TOML format mirrors :meth:`Accelerator.to_dict`: top-level scalars (``name``, ``clock_hz``,
``bytes_per_element``, optional ``power_w``, ``cost_usd``, ``area_mm2``), the tables
``[tensor_cores]``, ``[vector_cores]``, ``[global_buffer]``, ``[hbm]``, and one ``[[network]]``
array entry per network level, innermost first.  Integers may be written as integral floats
(``bytes = 32e9``); booleans are never numbers.  Malformed input raises :class:`HardwareError`
with a one-line message naming the file, the key path, the value and what was expected.

Presets live in ``phaze_ir/hw_presets/<name>.toml`` (inside the package, so that they are found
in a regular wheel install as well as in an editable one); ``examples/hw/`` links to them.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import numbers
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import tomllib

from phaze_ir import area
from phaze_ir.files import EXCERPT_CHARS, RefusedFile, excerpt, read_regular, shorten

__all__ = [
    "HardwareError",
    "Bound",
    "field_bound",
    "TensorCores",
    "VectorCores",
    "GlobalBuffer",
    "HBM",
    "NetworkLevel",
    "NetworkProtocol",
    "TOPOLOGIES",
    "PROTOCOL_ALGORITHMS",
    "Calibration",
    "EXECUTION_MODES",
    "Accelerator",
    "load_hardware",
    "loads_toml",
    "dumps_toml",
    "preset_names",
    "preset_path",
    "PRESET_DIR",
    "KiB",
    "MiB",
    "GiB",
]

KiB = 1024
MiB = 1024**2
GiB = 1024**3
#: The largest TOML file read (a hardware description or a space): the presets are about 10 kB.
TOML_LIMIT = 1 * MiB
#: The longest file name Linux takes (PATH_MAX): a longer "source" names no real file.
PATH_MAX = 4096

# The presets are package data: ``Path(__file__).parent`` is ``<repo>/phaze_ir`` in an editable
# install (maturin's editable mode puts the repository root on sys.path) and
# ``site-packages/phaze_ir`` in a regular install (maturin packages every file under the
# ``phaze_ir/`` python-source directory, the TOML files included).  They are not looked up under
# ``examples/``, which a wheel does not contain; ``examples/hw/*.toml`` are links to these files.
PRESET_DIR = Path(__file__).resolve().parent / "hw_presets"


class HardwareError(ValueError):
    """A malformed hardware description.

    The message is one line: ``<source>: <key path> = <value>: expected <what>`` (or a variant for
    unknown / missing keys, syntax errors, missing files and unknown presets).  ``source`` is the
    file (as the user named it) or a label such as ``<dict>``; ``key_path`` is the dotted path of
    the offending key (``tensor_cores.pe_x``, ``network[1].group_size``) or ``None``.
    """

    def __init__(self, message: str, *, source: str | None = None, key_path: str | None = None):
        # What the message quotes of the input (a key, a value, a name) is cut where it is
        # built (:func:`_show`); cut here too for what others build (a space's errors).  The
        # source is the file as the user named it: cut only beyond any real file name's length.
        message = shorten(message)
        if source is not None and len(source) > PATH_MAX:
            source = excerpt(source)
        self.source = source
        self.key_path = key_path
        self.detail = message
        super().__init__(f"{source}: {message}" if source else message)


# --------------------------------------------------------------------------------------------
# Field checking, shared by the dataclass constructors and the dict/TOML loader
# --------------------------------------------------------------------------------------------

np_bool: type
try:  # numpy is a dependency of the package, but this module does not need it otherwise
    from numpy import bool_ as np_bool
except ImportError:  # pragma: no cover
    np_bool = bool

#: How a chip runs the ops of a layer (``[calibration] execution``): ``concurrent``, the paper's
#: model (ops the dataflow leaves unordered may run side by side on different cores), or
#: ``serial`` (one kernel at a time on the whole chip, as a GPU runs a training framework's single
#: stream).
EXECUTION_MODES = ("concurrent", "serial")

#: The topologies a ``[[network]]`` level may have (``topology``; absent is ``"switch"``):
#: docs/design.md §5.5.
TOPOLOGIES = ("switch", "torus", "fat_tree")

#: The algorithms a ``[[network.protocols]]`` entry may run (``algorithm``; absent is ``"ring"``):
#: ``nvls`` is NVLink SHARP, an all-reduce reduced inside the NVSwitch (docs/design.md §5.5).
PROTOCOL_ALGORITHMS = ("ring", "nvls")

#: The largest integer a hardware field may hold: the IR stores integers as signed 64-bit.
I64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Bound:
    """The most a field may be: ``value``, with ``why`` (a phrase the refusal quotes)."""

    value: float
    why: str

    def text(self) -> str:
        return str(self.value) if isinstance(self.value, int) else _fmt_float(self.value)


# Plausibility bounds.  A value beyond what any real chip, memory or network reaches by a wide
# margin is a typo or a hostile input, not a design (pe_x = 2^63 - 1 was accepted and priced at
# 2.7e15 W per chip): it is refused, naming the field, its value and the bound.  Each bound is
# the largest real figure (its source beside it) times a generous factor, so that no design
# phaze could be asked about, today's or a bolder one, is refused; a bound never changes a value.
#: Cores of one chip: Cerebras WSE-3, 900,000 cores on a whole wafer (Cerebras, 2024-03-13).
CORES = Bound(2**24, "18x the 900,000 cores of Cerebras WSE-3, the largest chip built")
#: A PE array's side, a vector core's lanes, a wave tile's side: TPU v1's 256 x 256 systolic
#: array (Jouppi et al., ISCA 2017), the paper's space's widest too (256).
ARRAY_SIDE = Bound(2**16, "256x the 256-wide systolic array of TPU v1")
#: FP8 MACs per PE and cycle over the bf16 ones: Hopper's 2 (NVIDIA H100 datasheet: 1,979 dense FP8
#: against 989 bf16 TFLOP/s); the area model prices that one rate (checked beside it).
FP8_RATE_BOUND = Bound(64, "32x the 2 FP8 MACs per bf16 MAC of NVIDIA Hopper")
#: A core's own buffer: the default (16 B per PE, :func:`default_tc_buffer_bytes`) of the
#: largest array allowed, so that a default is never refused.
CORE_BUFFER = Bound(16 * 2**32, "16 B per PE of a 65536 x 65536 array")
#: On-chip SRAM: Cerebras WSE-3, 44 GB (Cerebras, 2024-03-13).
SRAM_BYTES = Bound(2**42, "100x the 44 GB of SRAM of Cerebras WSE-3")
#: On-chip SRAM bandwidth: Cerebras WSE-3, 21 PB/s (Cerebras, 2024-03-13).
SRAM_BANDWIDTH = Bound(1e18, "48x the 21 PB/s of Cerebras WSE-3's SRAM")
#: HBM on one chip: 288 GB (NVIDIA B300, 2025; AMD Instinct MI355X, 2025).
HBM_BYTES = Bound(2**46, "240x the 288 GB of HBM of NVIDIA B300 or AMD MI355X")
#: HBM bandwidth: 8 TB/s (NVIDIA B200, 2024; AMD Instinct MI355X, 2025).
HBM_BANDWIDTH = Bound(1e15, "125x the 8 TB/s of HBM of NVIDIA B200")
#: Clock: 6.2 GHz, the fastest shipped processor's boost (Intel Core i9-14900KS, 2024).
CLOCK = Bound(1e11, "16x the 6.2 GHz of the fastest shipped processor")
#: Bytes of one element: complex128, the widest dtype torch has.
ELEMENT_BYTES = Bound(16, "complex128, the widest element torch has")
#: Peak FLOP/s of one chip (tensor or vector cores, or a GPU's fp32 cores): Cerebras WSE-3,
#: 125 PFLOP/s (Cerebras, 2024-03-13).  Bounds the product count x array x clock, which the
#: bounds of each factor alone would let reach 1e28.
FLOPS = Bound(1e19, "80x the 125 PFLOP/s of Cerebras WSE-3")
#: A chip's power: a Cerebras CS-3 system, 23 kW (Cerebras CS-3 datasheet, 2024).
POWER = Bound(1e6, "40x the 23 kW of a Cerebras CS-3 system")
#: Die area: Cerebras WSE-3, 46,225 mm^2, most of a 300 mm wafer (Cerebras, 2024-03-13).
AREA_MM2 = Bound(1e6, "20x the 46,225 mm^2 of Cerebras WSE-3")
#: A chip's price: a Cerebras CS-2 system, reported in the press at about USD 2.5 million.
COST_USD = Bound(1e9, "400x the USD 2.5 million of a Cerebras CS-2 system")
#: Devices of a network level: the most devices ``phazec --devices`` takes (2^31 - 1, as
#: Megatron-LM and torchtitan take their sizes), far beyond the largest cluster (~10^5 GPUs).
DEVICES = Bound(2**31 - 1, "the most devices phazec's --devices takes")
#: A device's link bandwidth, per direction: NVLink 5, 900 GB/s (NVIDIA Blackwell, 2024).
LINK_BANDWIDTH = Bound(1e14, "110x the 900 GB/s per direction of NVLink 5")
#: A group's bandwidth out of its level, all its devices together: the link bound for each of
#: 10,000 devices (an uplink carries a whole group of the level below).
UPLINK_BANDWIDTH = Bound(1e18, "the link bound for each of 10,000 devices")
#: A network latency: a message half around the Earth, 20,000 km of fibre at 2e8 m/s = 0.1 s.
LATENCY = Bound(1.0, "10x a message's 0.1 s half around the Earth")
#: A per-op overhead of a real chip: a CUDA kernel launch is about 5 us.
OVERHEAD = Bound(1.0, "200,000x a CUDA kernel launch's 5 us")
#: CUDA compute capability: 12.x is the newest (NVIDIA Blackwell, 2025).
COMPUTE_CAPABILITY = Bound(100.0, "8x the newest CUDA compute capability, 12.x")
#: One MAC or vector op: a 45 nm fp32 multiply and add, 3.7 + 0.9 pJ (Horowitz, "Computing's
#: energy problem", ISSCC 2014), at an older node and a wider type than any chip described.
OP_ENERGY = Bound(1e-9, "200x a 45 nm fp32 multiply-add's 4.6 pJ")
#: A byte of SRAM: a 64-bit read of a 1 MB SRAM at 45 nm, 100 pJ, 12.5 pJ/B (Horowitz 2014).
SRAM_ENERGY = Bound(1e-8, "800x a 45 nm 1 MB SRAM's 12.5 pJ/B")
#: A byte of DRAM: a 64-bit DRAM access at 45 nm, up to 2.6 nJ, 325 pJ/B (Horowitz 2014).
DRAM_ENERGY = Bound(1e-7, "300x a 45 nm DRAM access's 325 pJ/B")
#: A byte sent on a network: the DRAM access (325 pJ/B) again, which costs more than a link's
#: few pJ per bit through NIC, optics and switch.
NETWORK_ENERGY = Bound(1e-6, "3,000x a 45 nm DRAM access's 325 pJ/B")
#: Power per mm^2: NVIDIA H100 SXM, 700 W over 814 mm^2 = 0.86 W/mm^2 (all of its power, not
#: just the leakage this bounds).
POWER_DENSITY = Bound(10.0, "12x the 0.86 W/mm^2 of NVIDIA H100's whole power")
#: A wafer's price: TSMC 7 nm, USD 9,346 (Khan & Mann, CSET 2020); about USD 30,000 at 2 nm
#: (reported, 2024).
WAFER_USD = Bound(1e7, "300x a 2 nm wafer's reported USD 30,000")
#: A wafer's diameter: 300 mm in production, 450 mm the largest ever made (SEMI's 450 mm).
WAFER_MM = Bound(1000.0, "2x the 450 mm wafer, the largest ever made")
#: Defects: TSMC N7, 0.0009 per mm^2 (TSMC, reported by AnandTech, 2020-08-25).
VOLTAGE_EXPONENT = Bound(4.0, "2x the 2 of dynamic energy per op falling as V^2 with V proportional to f")
DEFECTS = Bound(1.0, "1,000x TSMC N7's 0.0009 per mm^2")
#: HBM's price: about USD 17 per GiB (Raymond James estimate, TechSpot 2023).
HBM_USD = Bound(1e-5, "600x HBM's USD 17 per GiB")
#: Embodied carbon of a die: 0.02 kg CO2e per mm^2 at 7 nm (ACT, Gupta et al., ISCA 2022).
DIE_CARBON = Bound(10.0, "500x a 7 nm die's 0.02 kg CO2e per mm^2")
#: Embodied carbon of memory: 65 g CO2e per GB of DRAM (ACT, Gupta et al., ISCA 2022).
MEMORY_CARBON = Bound(1e-7, "1,500x DRAM's 65 g CO2e per GB")
#: Embodied carbon of a package: 150 g CO2e (ACT, Gupta et al., ISCA 2022).
PACKAGE_CARBON = Bound(1000.0, "6,700x an IC package's 150 g CO2e")
#: PUE: 1.58, the industry-average data centre in 2023 (Uptime Institute).
PUE = Bound(10.0, "6x the 1.58 of the average data centre")
#: Grid carbon: coal power, 820 g CO2e per kWh = 2.3e-7 kg/J (IPCC AR5, lifecycle median).
GRID_CARBON = Bound(1e-5, "44x coal power's 820 g CO2e per kWh")
#: The memory headroom: a plan must have some HBM left to fill.
HEADROOM = Bound(0.9, "nine tenths of HBM")
#: A chip's service life: a century.
LIFETIME = Bound(3.2e9, "100 years")

# kind -> what the message says is expected
_EXPECTED = {
    "pos_int": "a positive integer",
    "pos_float": "a positive number",
    "nonneg_float": "a non-negative number",
    "fraction": "a number in (0, 1]",
    "name": "a non-empty string",
    "execution": "one of " + ", ".join(f'"{m}"' for m in EXECUTION_MODES),
    "size_table": "a table of capacities in bytes (positive integers) to positive numbers",
    "topology": "one of " + ", ".join(f'"{t}"' for t in TOPOLOGIES),
    "algorithm": "one of " + ", ".join(f'"{a}"' for a in PROTOCOL_ALGORITHMS),
    "dims": "an array of 2 or 3 positive integers (the torus's dimensions, the first fastest)",
    "ratio": "a number >= 1",
    "bool": "true or false",
}


def _show(value: Any) -> str:
    """Render a value as it would appear in TOML, for error messages (at most an excerpt)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return excerpt(json.dumps(value))
    if isinstance(value, dict):
        return "{...} (a table)"
    if isinstance(value, (list, tuple)):
        if value and len(value) <= 8 and all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value):
            return "[" + ", ".join(_show(v) for v in value) + "]"  # e.g. a torus's dimensions
        return "[...] (an array)"
    if isinstance(value, float):
        return _fmt_float(value)
    if isinstance(value, int) and value.bit_length() > 3.33 * EXCERPT_CHARS:  # (str() of 4,300 digits raises)
        return f"an integer of about {round(value.bit_length() * math.log10(2))} digits"
    return excerpt(str(value))


def _type_hint(value: Any) -> str:
    if isinstance(value, bool):
        return " (got a boolean)"
    if isinstance(value, str):
        return " (got a string; units are in the key name, write a bare number)"
    if isinstance(value, dict):
        return " (got a table)"
    if isinstance(value, (list, tuple)):
        return " (got an array)"
    return ""


def _fail(source: str | None, path: str, value: Any, expected: str) -> HardwareError:
    return HardwareError(f"{path} = {_show(value)}: expected {expected}", source=source, key_path=path)


def _check(kind: str, value: Any, path: str, source: str | None, at_most: Bound | None = None) -> Any:
    """Validate and normalise one scalar field; returns the normalised value.  ``at_most``: the
    field's plausibility bound (a number above it is refused)."""
    if kind == "size_table":  # the bound is each entry's
        return _check_size_table(value, path, source, at_most)
    checked = _check_kind(kind, value, path, source)
    if at_most is not None and isinstance(checked, (int, float)) and checked > at_most.value:
        expected = _EXPECTED[kind.removeprefix("opt_")]
        raise _fail(source, path, value, f"{expected} at most {at_most.text()} ({at_most.why})")
    return checked


def _check_kind(kind: str, value: Any, path: str, source: str | None) -> Any:
    optional = kind.startswith("opt_")
    base = kind[4:] if optional else kind
    if value is None and optional:
        return None
    expected = _EXPECTED[base]
    raw = value  # as written, for the message
    if base == "execution":
        if value not in EXECUTION_MODES:
            raise _fail(source, path, value, expected)
        return value
    if base == "topology":
        if value not in TOPOLOGIES:
            raise _fail(source, path, value, expected)
        return value
    if base == "algorithm":
        if value not in PROTOCOL_ALGORITHMS:
            raise _fail(source, path, value, expected)
        return value
    if base == "bool":
        if not isinstance(value, (bool, np_bool)):
            raise _fail(source, path, value, expected)
        return bool(value)
    if base == "dims":
        ok = isinstance(value, (list, tuple)) and len(value) in (2, 3)
        if ok:
            try:
                return tuple(_check("pos_int", v, path, source) for v in value)
            except HardwareError:
                pass
        raise _fail(source, path, value, expected)
    if base == "name":
        if not isinstance(value, str):
            raise _fail(source, path, value, expected + _type_hint(value))
        if not value.strip():
            raise _fail(source, path, value, expected)
        return value
    # numbers.Real covers int, float and numpy scalars; bool is an int to Python, never here.
    if isinstance(value, (bool, np_bool)) or not isinstance(value, numbers.Real):
        raise _fail(source, path, value, expected + _type_hint(value))
    if not isinstance(value, numbers.Integral):
        value = float(value)
        if not math.isfinite(value):
            raise _fail(source, path, value, expected)
    if base == "pos_int":
        if isinstance(value, float):
            if not value.is_integer():
                raise _fail(source, path, value, expected)
            value = int(value)
        if value <= 0:
            raise _fail(source, path, value, expected)
        if value > I64_MAX:  # the IR keeps every integer field as an i64
            raise _fail(source, path, raw, f"{expected} at most {I64_MAX} (2^63 - 1: the IR stores it as i64)")
        return int(value)
    if base == "pos_float":
        if value <= 0:
            raise _fail(source, path, value, expected)
        return float(value)
    if base == "nonneg_float":
        if value < 0:
            raise _fail(source, path, value, expected)
        return float(value)
    if base == "ratio":
        if value < 1:
            raise _fail(source, path, value, expected)
        return float(value)
    if base == "fraction":
        if not 0 < value <= 1:
            raise _fail(source, path, value, expected)
        return float(value)
    raise AssertionError(kind)  # pragma: no cover


def _check_size_table(
    value: Any, path: str, source: str | None, at_most: Bound | None = None
) -> tuple[tuple[int, float], ...]:
    """A ``{bytes = number}`` table (TOML keys are strings of digits; a tuple of pairs as
    :class:`Energy` holds it is accepted too) as pairs in increasing capacity."""
    pairs = value.items() if isinstance(value, dict) else value
    if not isinstance(pairs, (list, tuple)) and not isinstance(value, dict):
        raise _fail(source, path, value, _EXPECTED["size_table"] + _type_hint(value))
    out: dict[int, float] = {}
    for entry in pairs:
        if not isinstance(entry, (list, tuple)) or len(entry) != 2:
            raise _fail(source, path, value, _EXPECTED["size_table"])
        key, number = entry
        text = str(key)
        where = f"{path}.{excerpt(text)}"
        # ASCII digits only ("²" is a digit to str.isdigit, not to int), read only when short
        # enough to be a size at all (int() refuses 4,300 digits and more with a traceback).
        digits = text.lstrip("0")
        if isinstance(key, bool) or not (text.isascii() and text.isdigit()) or not digits:
            raise _fail(source, where, key, "a capacity in bytes (a positive integer key)")
        if len(digits) > len(str(SRAM_BYTES.value)) or int(digits) > SRAM_BYTES.value:
            raise _fail(source, where, key, f"a capacity at most {SRAM_BYTES.text()} bytes ({SRAM_BYTES.why})")
        out[int(digits)] = _check("pos_float", number, where, source, at_most)
    if not out:
        raise _fail(source, path, value, _EXPECTED["size_table"] + " (at least one entry)")
    return tuple(sorted(out.items()))


def field_bound(cls: type, name: str) -> Bound | None:
    """The plausibility bound of field ``name`` of the hardware class ``cls`` (``TensorCores``,
    ``"count"``), or None: what a space's axes can be checked against before any chip is built."""
    return next(f.metadata["at_most"] for f in dataclasses.fields(cls) if f.name == name)


def _spec(kind: str, doc: str, at_most: Bound | None = None, **kw: Any) -> Any:
    """A dataclass field carrying its validation kind, its documentation (meaning + unit) and
    its plausibility bound (``at_most``; ``None``: none beyond what the kind says)."""
    return field(metadata={"kind": kind, "doc": doc, "at_most": at_most}, **kw)


_SCALAR_FIELDS: dict[type, tuple[tuple[str, str, Bound | None], ...]] = {}


def _validate_fields(obj: Any) -> None:
    """``__post_init__`` body: check and normalise every scalar field of a frozen dataclass."""
    cls = type(obj)
    scalars = _SCALAR_FIELDS.get(cls)
    if scalars is None:  # (name, kind, bound) of the scalar fields, computed once per class
        scalars = tuple(
            (f.name, f.metadata["kind"], f.metadata["at_most"])
            for f in dataclasses.fields(cls)
            if f.metadata.get("kind") not in ("table", "opt_table", "levels", "protocols")
        )
        _SCALAR_FIELDS[cls] = scalars
    for name, kind, at_most in scalars:
        value = getattr(obj, name)
        checked = _check(kind, value, name, cls.__name__, at_most)
        if checked is not value:
            object.__setattr__(obj, name, checked)


# --------------------------------------------------------------------------------------------
# The description
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorCores:
    """The chip's tensor cores: ``count`` identical systolic PE arrays of ``pe_x × pe_y`` MACs.

    Attributes:
        count: number of tensor cores on the chip.
        pe_x: PE-array width W (the paper's ``width``), in processing elements.
        pe_y: PE-array depth D (the paper's ``depth``), in processing elements.
        buffer_bytes: each core's private buffer (the area model's L2), in bytes.  Defaults to
            what the area model assumes, ``max(1 KiB, 16·pe_x·pe_y)`` bytes (16 B per PE).
        fp8_rate: optional; the PEs have the FP8 datapath of the area model (``[fp8_datapath]``
            of ``phaze_ir/area_22nm.toml``, its one rate: 2) and run a GEMM on FP8 operands
            (``--dtype fp8``) at that many MACs per PE and cycle, its PE-array cycles over
            ``fp8_rate``; each PE is ``pe_area_ratio`` times larger and an FP8 MAC costs
            ``mac_energy_ratio`` times ``[energy] mac_j`` unless ``fp8_mac_j`` gives it.  For
            an ideal chip (an architecture space's: no ``[calibration]``, whose FP8 rate is
            ``fp8_gemm_flops``).  Absent: no FP8 datapath, ``--dtype fp8`` refused.
    """

    count: int = _spec("pos_int", "number of tensor cores", at_most=CORES)
    pe_x: int = _spec("pos_int", "PE-array width W (PEs)", at_most=ARRAY_SIDE)
    pe_y: int = _spec("pos_int", "PE-array depth D (PEs)", at_most=ARRAY_SIDE)
    buffer_bytes: int = _spec(
        "opt_pos_int", "per-core buffer (bytes); default max(1 KiB, 16*pe_x*pe_y)", at_most=CORE_BUFFER, default=None
    )
    fp8_rate: int | None = _spec(
        "opt_pos_int",
        "FP8 MACs per PE and cycle, a multiple of the bf16 ones (the area model's FP8 datapath: 2)",
        at_most=FP8_RATE_BOUND,
        default=None,
    )

    def __post_init__(self) -> None:
        _validate_fields(self)
        if self.buffer_bytes is None:
            object.__setattr__(self, "buffer_bytes", default_tc_buffer_bytes(self.pe_x, self.pe_y))
        if self.fp8_rate is not None and self.fp8_rate != area.FP8_RATE:
            raise HardwareError(
                f"tensor_cores.fp8_rate = {self.fp8_rate}: expected {area.FP8_RATE}, the FP8 datapath's rate "
                "the area model prices (phaze_ir/area_22nm.toml [fp8_datapath])",
                source="TensorCores",
                key_path="tensor_cores.fp8_rate",
            )

    @property
    def macs_per_cycle(self) -> int:
        """Multiply-accumulates per clock cycle over all tensor cores (count·pe_x·pe_y)."""
        return self.count * self.pe_x * self.pe_y


@dataclass(frozen=True)
class VectorCores:
    """The chip's vector (SIMD) cores: ``count`` cores of ``width`` lanes, one op per lane per cycle.

    Attributes:
        count: number of vector cores on the chip.
        width: lanes per core (the paper's ``width_vc``); each lane does one element op per cycle.
        buffer_bytes: each core's private buffer, in bytes.  Defaults to what the area model
            assumes, ``max(1 KiB, 16·width)`` bytes.
    """

    count: int = _spec("pos_int", "number of vector cores", at_most=CORES)
    width: int = _spec("pos_int", "lanes per vector core", at_most=ARRAY_SIDE)
    buffer_bytes: int = _spec(
        "opt_pos_int", "per-core buffer (bytes); default max(1 KiB, 16*width)", at_most=CORE_BUFFER, default=None
    )

    def __post_init__(self) -> None:
        _validate_fields(self)
        if self.buffer_bytes is None:
            object.__setattr__(self, "buffer_bytes", default_vc_buffer_bytes(self.width))


@dataclass(frozen=True)
class GlobalBuffer:
    """The on-chip global buffer (SRAM) shared by all cores.

    Attributes:
        bytes: capacity, in bytes.
        bandwidth_Bps: bandwidth between the global buffer and the cores, in bytes per second.
    """

    bytes: int = _spec("pos_int", "capacity (bytes)", at_most=SRAM_BYTES)
    bandwidth_Bps: float = _spec("pos_float", "bandwidth to the cores (bytes/s)", at_most=SRAM_BANDWIDTH)

    def __post_init__(self) -> None:
        _validate_fields(self)


@dataclass(frozen=True)
class HBM:
    """Off-chip high-bandwidth memory of one accelerator.

    Attributes:
        bytes: capacity, in bytes.
        bandwidth_Bps: bandwidth between HBM and the chip, in bytes per second.
    """

    bytes: int = _spec("pos_int", "capacity (bytes)", at_most=HBM_BYTES)
    bandwidth_Bps: float = _spec("pos_float", "bandwidth to the chip (bytes/s)", at_most=HBM_BANDWIDTH)

    def __post_init__(self) -> None:
        _validate_fields(self)


@dataclass(frozen=True)
class NetworkProtocol:
    """One protocol of a level's collectives (``[[network.protocols]]``, innermost level only;
    docs/design.md §5.5): an all-reduce of ``n`` bytes over ``g`` devices costs the least over
    the level's protocols of ``base_s + 2(g−1)·latency_s + 2(g−1)/g · n / bandwidth_Bps [+ n/g /
    shard_Bps]`` (a ring: NCCL's LL, LL128 and Simple trade latency for bandwidth this way) or,
    with ``algorithm = "nvls"``, ``base_s + 2·latency_s + n / bandwidth_Bps [+ n/g /
    shard_Bps]`` (NVLink SHARP: each device sends its ``n`` bytes into the switch, which reduces
    them, and takes the sum back, whatever ``g``); reduce-scatters and all-gathers cost the
    least over the ring protocols of their half.

    Attributes:
        name: label (``"ll128"``, ``"simple"``), unique within the level.
        bandwidth_Bps: per-device, per-direction bandwidth (bytes/s): the ring's, or with
            ``nvls`` the all-reduce's algorithm bandwidth (``n`` over its time).
        latency_s: per ring step, or per switch pass with ``nvls`` (s).
        base_s: per collective, whatever its size (launch, pipeline fill) (s).
        shard_Bps: optional; a pass over a device's own ``n/g`` bytes that does not overlap
            the ring (bytes/s).
        algorithm: optional; ``"ring"`` (absent: the same) or ``"nvls"`` (all-reduces only;
            a level needs at least one ring protocol for its other collectives).
    """

    name: str = _spec("name", "label of the protocol")
    bandwidth_Bps: float = _spec("pos_float", "per-device, per-direction bandwidth (bytes/s)", at_most=LINK_BANDWIDTH)
    latency_s: float = _spec("nonneg_float", "per ring step or switch pass (s)", at_most=LATENCY)
    base_s: float = _spec("nonneg_float", "per collective (s)", at_most=LATENCY, default=0.0)
    shard_Bps: float | None = _spec(
        "opt_pos_float", "pass over a device's own shard (bytes/s)", at_most=HBM_BANDWIDTH, default=None
    )
    algorithm: str | None = _spec("opt_algorithm", "ring (absent) or nvls", default=None)

    def __post_init__(self) -> None:
        _validate_fields(self)


@dataclass(frozen=True)
class NetworkLevel:
    """One level of the cluster network (levels are listed innermost first).

    Devices are grouped hierarchically: a group of ``group_size`` devices shares this level (e.g.
    8 GPUs of a node on NVLink); each level's groups are made of whole groups of the level below,
    and the last level spans the cluster (its ``group_size`` is the largest cluster the
    description is meant for).  A flat network is the one-level case.

    Attributes:
        name: label of the level (``"node"``, ``"cluster"``, ...), unique within the network.
        group_size: number of devices in one group at this level.
        bandwidth_Bps: bandwidth one device can send to the others of its group at this level,
            per direction, in bytes per second (the β of an α–β model is ``1 / bandwidth_Bps``).
        latency_s: per-message (per-step) latency at this level, in seconds (the α).
        uplink_Bps: optional; the most one group of the level below sends into this level at
            once, all its devices together, per direction, in bytes per second (a node's NICs
            together: 4 x 200 Gb/s HDR = 100e9).  Absent: only ``bandwidth_Bps`` per device
            limits it.  Not allowed on the innermost level (nothing lies below it).
        energy_j_per_byte: optional; energy to move one byte from a device to another at this
            level (links, switches, NICs), in joules.  Absent: the level's traffic is not priced
            in energy.
        power_w_per_device: optional; what this level's network draws per device attached to
            it, in watts: its share of the NICs, optics and switch ports (their datasheet
            power, which hardly depends on the traffic: links stay up and switches powered
            whether or not bytes flow).  A plan pays it on every level it reaches (more devices
            than one group of the level below) for its whole step.  Absent: 0.
        topology: optional; ``"switch"`` (absent: the same), ``"torus"`` or ``"fat_tree"``
            (docs/design.md §5.5).  On a torus ``bandwidth_Bps`` is one link's, per direction.
        torus_dims: with a torus, its 2 or 3 dimensions, the first fastest in device order:
            in devices (their product is ``group_size``), or on a torus level above a torus
            level in inner tori (their product times the inner ``group_size``).
        leaf_size: with a fat tree, the devices under one leaf switch (a multiple of the inner
            level's ``group_size`` dividing this level's).
        oversubscription: with a fat tree, a leaf's down-link over its up-link bandwidth
            (>= 1): a ring that leaves its leaf runs at ``1/oversubscription`` of the rate.
        protocols: optional, innermost switch level only; the ring collectives' protocols
            (:class:`NetworkProtocol`), which then price them instead of ``bandwidth_Bps`` and
            ``latency_s`` (these still price point-to-point transfers and cap the rails above).
        tree: optional, a switch or fat-tree level above the innermost only; ``true``: its
            all-reduces may also run as NCCL's tree (a chain inside each group of the level
            below, a binary tree across them), and cost the less of ring and tree
            (docs/design.md §5.5).  Absent (or ``false``): rings only.
        collective_compute_share: optional; the fraction of a device's compute that a
            collective on this level takes while it runs (NCCL runs each channel as one CTA that
            holds one SM: its channels over the chip's SMs).  An overlapped collective of ``X``
            seconds beside ``C`` seconds of compute then ends the two at ``max(X, C + share·min(X, C))``
            (docs/design.md §6.5).  Absent: overlap is free (``max(X, C)``).
    """

    name: str = _spec("name", "label of the level")
    group_size: int = _spec("pos_int", "devices per group at this level", at_most=DEVICES)
    bandwidth_Bps: float = _spec("pos_float", "per-device, per-direction bandwidth (bytes/s)", at_most=LINK_BANDWIDTH)
    latency_s: float = _spec("nonneg_float", "per-message latency (s)", at_most=LATENCY)
    uplink_Bps: float | None = _spec(
        "opt_pos_float",
        "bandwidth out of one group of the level below, its devices together (bytes/s)",
        at_most=UPLINK_BANDWIDTH,
        default=None,
    )
    energy_j_per_byte: float | None = _spec(
        "opt_nonneg_float", "energy per byte sent (J/B)", at_most=NETWORK_ENERGY, default=None
    )
    power_w_per_device: float | None = _spec(
        "opt_nonneg_float", "the level's network power per device attached (W)", at_most=POWER, default=None
    )
    topology: str | None = _spec("opt_topology", "switch, torus or fat_tree", default=None)
    torus_dims: tuple[int, ...] | None = _spec("opt_dims", "torus dimensions, the first fastest", default=None)
    leaf_size: int | None = _spec(
        "opt_pos_int", "devices under one leaf switch (fat tree)", at_most=DEVICES, default=None
    )
    oversubscription: float | None = _spec("opt_ratio", "leaf down-link over up-link bandwidth", default=None)
    protocols: tuple[NetworkProtocol, ...] | None = _spec("protocols", "ring protocols", default=None)
    tree: bool | None = _spec("opt_bool", "all-reduces may also run as NCCL's tree", default=None)
    collective_compute_share: float | None = _spec(
        "opt_fraction", "fraction of the device's compute a collective on this level takes", default=None
    )

    def __post_init__(self) -> None:
        _validate_fields(self)
        if self.protocols is not None:
            items = tuple(self.protocols) if isinstance(self.protocols, (list, tuple)) else self.protocols
            if not isinstance(items, tuple) or not items or not all(isinstance(p, NetworkProtocol) for p in items):
                raise _fail("NetworkLevel", "protocols", self.protocols, "one or more NetworkProtocol")
            object.__setattr__(self, "protocols", items)


@dataclass(frozen=True)
class Calibration:
    """What a real chip achieves below the ideal model (the optional ``[calibration]`` table).

    Without it a chip is priced by the ideal model (the paper's: every unit at its peak, ops
    overlapping where the dataflow allows); the architecture search's chips have none.  A
    description of a real chip (``a100``, ``h100``) states here what was measured or fitted, each
    number with its source in the file (docs/validation.md):

    Attributes:
        execution: ``"concurrent"`` (default) or ``"serial"``: one op at a time, each split over
            all cores of its unit (a GPU running a framework's one CUDA stream).
        kernel_overhead_s: seconds added to every op that computes (GEMMs and vector ops; not
            views, not collectives): the kernel's launch latency, prologue and tail on the chip.
        host_dispatch_s: with serial execution, the host issues one op (one kernel or
            collective) every ``host_dispatch_s`` seconds (a framework's Python and launch
            cost), ahead of the chip: an op starts once it is issued and the op before it has
            ended, so short ops wait for the host and long ones hide it.
        tensor_efficiency: achieved fraction of the tensor cores' peak on a GEMM whose tiles
            fill every wave (the rest of the gap is wave quantisation, below).
        memory_efficiency: achieved fraction of the HBM bandwidth.
        misaligned_gemm_efficiency: the fraction of its time a GEMM achieves when one of its
            dimensions is not a multiple of 16 bytes (the GEMM library cannot use its fast,
            aligned kernels: a vocabulary of 50,257 or 30,522 in the LM head).
        wave_tile_m, wave_tile_n, wave_units: wave quantisation of a GEMM split over the chip
            (all three or none): its output is cut into ``wave_tile_m × wave_tile_n`` tiles,
            dealt to ``wave_units`` units (a GPU's SMs) in waves; a GEMM split over the chip
            takes as long as its waves of full tiles (instead of the PE-array tiling's cycles).
        compute_capability: optional; the CUDA compute capability (9.0: Hopper, 8.0: A100).
            Where torch's kernels depend on it (a bf16 grouped GEMM is one CUTLASS kernel on
            9.x and 10.x only, ``passes/algorithms/kernels.py``).  Absent: not a CUDA GPU, every
            grouped GEMM is one kernel.
        fp32_gemm_flops: optional; the IEEE fp32 peak (FLOP/s) of the CUDA cores, where PyTorch
            runs an fp32 GEMM by default (TF32 off).  Under ``--kernels eager|inductor`` an fp32
            GEMM's compute time is scaled by ``peak tensor / fp32_gemm_flops``.  Absent: fp32
            GEMMs are priced at the tensor cores' rate.
        fp8_gemm_flops: optional; the dense FP8 peak (FLOP/s) of the tensor cores.  A GEMM on
            FP8 operands (``--dtype fp8``: Transformer Engine's linears) is priced at it: its
            compute time scaled by ``peak tensor / fp8_gemm_flops``, with the tensor efficiency
            and wave tiles of the chip's other GEMMs.  Absent: the chip has no FP8 GEMM, and
            ``--dtype fp8`` is refused on it.
        fp8_split_accumulation_efficiency: the fraction of the FP8 rate an FP8 GEMM keeps when
            it promotes its partial sums to fp32 every few steps of K ("split accumulator",
            cuBLASLt without ``CUBLASLT_MATMUL_DESC_FAST_ACCUM``), as Transformer Engine and
            torchao run the two backward GEMMs of an FP8 linear (their forward GEMM
            accumulates fast).  Default 1: no slower.
        fp8_rowwise_gemm_efficiency: the fraction of the FP8 rate an FP8 GEMM with one scale a
            row of each operand keeps with fast accumulation, where PyTorch runs it as its own
            CUTLASS kernel (``f8f8bf16_rowwise``) rather than cuBLAS's per-tensor one (torchao's
            rowwise recipe, its forward GEMM).  Default 1: no slower.
        column_read_efficiency: the fraction of its memory-bound rate a compiled kernel keeps
            when it reduces across a tensor's rows as they lie in memory and writes the result
            (torchao's column-wise float8 scales and the cast that reads them): its reads are
            not coalesced.  Default 1: no slower.
        host_sync_s: optional; the seconds the chip idles at one device-to-host
            synchronization (a grouped GEMM's fallback copies its offsets to the host: the copy's
            latency while the queue is empty).  Absent: 0.
        memory_headroom: optional; the fraction of HBM a plan leaves free by default (phazec's
            ``--memory-headroom``): what the runtime holds that the memory model does not count
            (the CUDA context, the caching allocator's fragmentation) and the model's own error
            as measured on this chip.  Absent: 0.
        attention_kernels: optional; the name of a table of the fused attention kernels'
            achieved FLOP/s by kernel, pass, mask, head dimension and sequence length
            (``phaze_ir/hw_presets/attention/NAME.toml``, or a path to such a TOML file;
            ``passes/algorithms/attention.py``): a fused attention's GEMMs are priced at it.
            Absent: at ``tensor_efficiency``, as a GEMM.
        fitted_power_limit_w: optional; the power limit (W) of the chip the GEMM efficiency was
            fitted on, when it is not this chip's (``[energy] power_limit_w``): a sibling's
            calibration reused on a part with a lower limit.  The fitted GEMMs drew at most what
            that limit left, which the power bound reads their energy against (docs/energy.md).
    """

    execution: str = _spec("execution", "concurrent or serial op execution", default="concurrent")
    kernel_overhead_s: float = _spec(
        "nonneg_float", "time added to every computing op (s)", at_most=OVERHEAD, default=0.0
    )
    host_dispatch_s: float = _spec(
        "nonneg_float", "host time to issue one op, serial execution (s)", at_most=OVERHEAD, default=0.0
    )
    tensor_efficiency: float = _spec("fraction", "achieved fraction of peak tensor FLOP/s", default=1.0)
    memory_efficiency: float = _spec("fraction", "achieved fraction of HBM bandwidth", default=1.0)
    misaligned_gemm_efficiency: float = _spec(
        "fraction", "fraction of its speed a GEMM keeps with a dimension not a multiple of 16 bytes", default=1.0
    )
    wave_tile_m: int | None = _spec(
        "opt_pos_int", "GEMM output tile rows (wave quantisation)", at_most=ARRAY_SIDE, default=None
    )
    wave_tile_n: int | None = _spec(
        "opt_pos_int", "GEMM output tile columns (wave quantisation)", at_most=ARRAY_SIDE, default=None
    )
    wave_units: int | None = _spec(
        "opt_pos_int", "units the tiles are dealt to (a GPU's SMs)", at_most=CORES, default=None
    )
    compute_capability: float | None = _spec(
        "opt_pos_float", "CUDA compute capability (9.0: Hopper)", at_most=COMPUTE_CAPABILITY, default=None
    )
    fp32_gemm_flops: float | None = _spec(
        "opt_pos_float", "fp32 GEMM peak of the CUDA cores (FLOP/s)", at_most=FLOPS, default=None
    )
    fp8_gemm_flops: float | None = _spec(
        "opt_pos_float", "dense FP8 GEMM peak of the tensor cores (FLOP/s)", at_most=FLOPS, default=None
    )
    fp8_split_accumulation_efficiency: float = _spec(
        "fraction", "fraction of the FP8 rate an FP8 GEMM keeps with split (fp32) accumulation", default=1.0
    )
    fp8_rowwise_gemm_efficiency: float = _spec(
        "fraction", "fraction of the FP8 rate a rowwise-scaled FP8 GEMM keeps (PyTorch's CUTLASS kernel)", default=1.0
    )
    column_read_efficiency: float = _spec(
        "fraction", "fraction of its memory-bound rate a kernel reducing across rows keeps", default=1.0
    )
    host_sync_s: float | None = _spec(
        "opt_nonneg_float", "chip idle per device-to-host sync (s)", at_most=OVERHEAD, default=None
    )
    memory_headroom: float | None = _spec(
        "opt_nonneg_float", "fraction of HBM a plan leaves free by default", at_most=HEADROOM, default=None
    )
    attention_kernels: str | None = _spec(
        "opt_name", "the fused attention kernels' table (phaze_ir/hw_presets/attention/NAME.toml)", default=None
    )
    fitted_power_limit_w: float | None = _spec(
        "opt_pos_float", "the power limit of the chip the GEMM times were fitted on (W)", at_most=POWER, default=None
    )

    def __post_init__(self) -> None:
        _validate_fields(self)
        wave = (self.wave_tile_m, self.wave_tile_n, self.wave_units)
        if any(v is None for v in wave) and any(v is not None for v in wave):
            raise HardwareError(
                "wave_tile_m, wave_tile_n and wave_units: expected all three or none",
                source="Calibration",
                key_path="calibration",
            )

    @property
    def serial(self) -> bool:
        return self.execution == "serial"

    @property
    def waves(self) -> bool:
        return self.wave_units is not None


@dataclass(frozen=True)
class Energy:
    """What the chip spends per action, and at rest (the optional ``[energy]`` table).

    Dynamic energy is counted from the same tiling and traffic the latency model counts
    (``passes/algorithms/energy.py``): the multiply-accumulates a GEMM's PE arrays issue, the
    vector lanes' operations, the bytes each memory level moves.  Static power is the die's
    leakage, proportional to its area.  Every number is data with its source beside it in the
    hardware file (docs/design.md §5.9); a chip without this table has no energy or power.

    Attributes:
        mac_j: one multiply-accumulate on a tensor-core PE at the training precision
            (the multiply and the fp32 accumulation), in joules.
        vector_op_j: one vector-lane operation, in joules.
        sram_j_per_byte: energy per byte read or written in an SRAM, by the SRAM's capacity:
            ``((bytes, joules_per_byte), ...)`` in increasing capacity (TOML: a table
            ``{ 8192 = 0.94e-12, 1048576 = 1.75e-12 }``).  A buffer between two capacities is
            interpolated linearly in log2 of its size; one outside takes the nearest entry.
            Prices the per-core buffers and the global buffer by their sizes.
        hbm_j_per_byte: one byte moved between HBM and the chip, in joules.
        static_w_per_mm2: static (leakage) power per mm² of die, in watts.
        accumulator_j_per_byte: optional; one byte of partial sums written to or read from the
            tensor cores' accumulators, in joules.  Absent: they are SRAM of the per-core
            buffer's size (a systolic array's accumulator memory).  0 where ``mac_j`` already
            counts them (a GPU's measured MMA energy, whose accumulators are registers).
        fp8_mac_j: optional; one multiply-accumulate on FP8 operands (``--dtype fp8``'s GEMMs),
            in joules.  Absent: ``mac_j``.
        power_limit_w: optional; the power the chip (with its HBM) is held to, in watts: a
            GPU's board power limit (its TDP by default), at which it lowers its clock.  Every
            op then lasts at least its dynamic energy over ``power_limit_w`` less the static
            power, and so does a step (docs/energy.md).  Absent: no limit.
        clock_energy_exponent: optional (default 0); gamma, how an op's dynamic energy on the
            die falls when the limit lowers its clock: clock ratio ``s`` (< 1) scales the MACs',
            core buffers' and global buffer's energy by ``s**gamma`` (a lower clock runs at a
            lower voltage; energy per switch ~ V^2), HBM's not.  0: energy per op held.
    """

    mac_j: float = _spec("pos_float", "energy of one tensor-core MAC (J)", at_most=OP_ENERGY)
    vector_op_j: float = _spec("pos_float", "energy of one vector-lane operation (J)", at_most=OP_ENERGY)
    sram_j_per_byte: tuple[tuple[int, float], ...] = _spec(
        "size_table", "SRAM energy per byte by capacity (J/B)", at_most=SRAM_ENERGY
    )
    hbm_j_per_byte: float = _spec("pos_float", "energy per byte of HBM traffic (J/B)", at_most=DRAM_ENERGY)
    static_w_per_mm2: float = _spec("nonneg_float", "static power per mm^2 of die (W/mm^2)", at_most=POWER_DENSITY)
    accumulator_j_per_byte: float | None = _spec(
        "opt_nonneg_float",
        "energy per byte of partial sums in the accumulators (J/B)",
        at_most=SRAM_ENERGY,
        default=None,
    )
    fp8_mac_j: float | None = _spec(
        "opt_pos_float", "energy of one tensor-core MAC on FP8 operands (J)", at_most=OP_ENERGY, default=None
    )
    power_limit_w: float | None = _spec(
        "opt_pos_float", "the power the chip is held to, its clock lowered (W)", at_most=POWER, default=None
    )
    clock_energy_exponent: float = _spec(
        "nonneg_float",
        "gamma: the die's dynamic energy per op scales as (clock ratio)^gamma under the limit",
        at_most=VOLTAGE_EXPONENT,
        default=0.0,
    )

    def __post_init__(self) -> None:
        _validate_fields(self)


@dataclass(frozen=True)
class Manufacturing:
    """What making the chip costs, in money and carbon (the optional ``[manufacturing]``
    table; the model is ``passes/algorithms/cost.py``, docs/design.md §5.10).

    Attributes:
        wafer_usd: the foundry's price of one wafer at the chip's node, US dollars.
        wafer_diameter_mm: the wafer's diameter, mm.
        edge_loss_mm: the unusable ring at the wafer's edge, mm.
        defect_density_per_mm2: defects per mm² (D0).
        yield_clustering: the clustering α of the negative binomial yield ``(1 + D0·A/α)^(−α)``.
        hbm_usd_per_byte: the HBM's price per byte, US dollars.
        die_kgco2e_per_mm2: embodied carbon of a mm² of processed wafer, kg CO2e.
        hbm_kgco2e_per_byte: embodied carbon of a byte of HBM, kg CO2e.
        package_kgco2e: embodied carbon of the chip's package, kg CO2e.
    """

    wafer_usd: float = _spec("pos_float", "price of one wafer (USD)", at_most=WAFER_USD)
    wafer_diameter_mm: float = _spec("pos_float", "wafer diameter (mm)", at_most=WAFER_MM)
    edge_loss_mm: float = _spec("nonneg_float", "unusable wafer edge (mm)", at_most=WAFER_MM)
    defect_density_per_mm2: float = _spec("nonneg_float", "defects per mm^2", at_most=DEFECTS)
    yield_clustering: float = _spec("pos_float", "negative binomial clustering alpha")
    hbm_usd_per_byte: float = _spec("nonneg_float", "HBM price per byte (USD)", at_most=HBM_USD)
    die_kgco2e_per_mm2: float = _spec("nonneg_float", "embodied carbon per mm^2 of wafer (kg CO2e)", at_most=DIE_CARBON)
    hbm_kgco2e_per_byte: float = _spec(
        "nonneg_float", "embodied carbon per byte of HBM (kg CO2e)", at_most=MEMORY_CARBON
    )
    package_kgco2e: float = _spec("nonneg_float", "embodied carbon of the package (kg CO2e)", at_most=PACKAGE_CARBON)

    def __post_init__(self) -> None:
        _validate_fields(self)


@dataclass(frozen=True)
class Deployment:
    """Where the cluster runs (the optional ``[deployment]`` table): what turns a step's
    energy into operational carbon and spreads the chips' embodied carbon over their life.

    Attributes:
        pue: the data centre's power usage effectiveness (facility energy over IT energy).
        grid_kgco2e_per_j: the grid's carbon intensity, kg CO2e per joule (g/kWh ÷ 3.6e9).
        lifetime_s: the chips' service life, seconds.
    """

    pue: float = _spec("pos_float", "power usage effectiveness", at_most=PUE)
    grid_kgco2e_per_j: float = _spec("nonneg_float", "grid carbon intensity (kg CO2e/J)", at_most=GRID_CARBON)
    lifetime_s: float = _spec("pos_float", "service life (s)", at_most=LIFETIME)

    def __post_init__(self) -> None:
        _validate_fields(self)


_TABLES: dict[str, type] = {
    "tensor_cores": TensorCores,
    "vector_cores": VectorCores,
    "global_buffer": GlobalBuffer,
    "hbm": HBM,
    "calibration": Calibration,
    "energy": Energy,
    "manufacturing": Manufacturing,
    "deployment": Deployment,
}

#: The tables a description may leave out.
_OPTIONAL_TABLES = ("calibration", "energy", "manufacturing", "deployment")


@dataclass(frozen=True)
class Accelerator:
    """One accelerator chip, its memory, its precision and the network of the cluster it is in.

    Attributes:
        name: label of the chip (``"tpuv4"``).
        clock_hz: core clock, in hertz.
        tensor_cores: the systolic PE arrays, see :class:`TensorCores`.
        vector_cores: the SIMD cores, see :class:`VectorCores`.
        global_buffer: the shared on-chip SRAM, see :class:`GlobalBuffer`.
        hbm: the off-chip memory, see :class:`HBM`.
        bytes_per_element: bytes of one tensor element at the training precision (2 for fp16).
        network: the network levels, innermost first, see :class:`NetworkLevel`.
        calibration: optional, what the real chip achieves below the ideal model, see
            :class:`Calibration` (``None``: the ideal model).
        energy: optional, energy per action and static power, see :class:`Energy` (``None``:
            no energy or power is priced).
        manufacturing: optional, die cost and embodied carbon, see :class:`Manufacturing`.
        deployment: optional, PUE, grid carbon and service life, see :class:`Deployment`.
        power_w: optional published chip power (TDP), in watts; what the plan's predicted
            power is reported against.  The limit the pricing obeys is the ``[energy]`` table's
            ``power_limit_w``.
        cost_usd: optional chip cost, in US dollars (informative).
        area_mm2: optional chip area as given (e.g. a datasheet die size), in mm².  When the
            configuration is within the area model's domain, :attr:`area_um2` uses the model
            instead.

    Derived: :attr:`peak_tensor_flops`, :attr:`peak_vector_flops`, :attr:`area_um2`.
    """

    name: str = _spec("name", "label of the chip")
    clock_hz: float = _spec("pos_float", "core clock (Hz)", at_most=CLOCK)
    tensor_cores: TensorCores = _spec("table", "tensor cores")
    vector_cores: VectorCores = _spec("table", "vector cores")
    global_buffer: GlobalBuffer = _spec("table", "global buffer")
    hbm: HBM = _spec("table", "HBM")
    bytes_per_element: int = _spec("pos_int", "bytes per element (precision)", at_most=ELEMENT_BYTES)
    network: tuple[NetworkLevel, ...] = _spec("levels", "network levels, innermost first")
    power_w: float | None = _spec("opt_pos_float", "chip power (W)", at_most=POWER, default=None)
    cost_usd: float | None = _spec("opt_pos_float", "chip cost (USD)", at_most=COST_USD, default=None)
    area_mm2: float | None = _spec("opt_pos_float", "given chip area (mm^2)", at_most=AREA_MM2, default=None)
    calibration: Calibration | None = _spec("opt_table", "what the real chip achieves", default=None)
    energy: Energy | None = _spec("opt_table", "energy per action and static power", default=None)
    manufacturing: Manufacturing | None = _spec("opt_table", "die cost and embodied carbon", default=None)
    deployment: Deployment | None = _spec("opt_table", "PUE, grid carbon, service life", default=None)

    # Top-level scalar keys first, then tables, then the network array: the order of to_dict()
    # and of the TOML files (TOML needs the scalars before the first table).
    _KEY_ORDER: ClassVar[tuple[str, ...]] = (
        "name",
        "clock_hz",
        "bytes_per_element",
        "power_w",
        "cost_usd",
        "area_mm2",
        "tensor_cores",
        "vector_cores",
        "global_buffer",
        "hbm",
        "calibration",
        "energy",
        "manufacturing",
        "deployment",
        "network",
    )

    def __post_init__(self) -> None:
        _validate_fields(self)
        for key, cls in _TABLES.items():
            value = getattr(self, key)
            if value is None and key in _OPTIONAL_TABLES:
                continue
            if not isinstance(value, cls):
                raise HardwareError(f"{key} = {value!r}: expected a {cls.__name__}", source="Accelerator", key_path=key)
        levels = tuple(self.network) if isinstance(self.network, (list, tuple)) else self.network
        if not isinstance(levels, tuple) or not all(isinstance(lv, NetworkLevel) for lv in levels):
            raise HardwareError(
                f"network = {self.network!r}: expected a sequence of NetworkLevel",
                source="Accelerator",
                key_path="network",
            )
        _check_network(levels, "Accelerator")
        object.__setattr__(self, "network", levels)
        _check_peaks(self.clock_hz, self.tensor_cores, self.vector_cores, "Accelerator")
        if self.calibration is not None and self.tensor_cores.fp8_rate is not None:
            raise HardwareError(
                "tensor_cores.fp8_rate: expected on an ideal chip only; a calibrated chip's FP8 rate is "
                "[calibration] fp8_gemm_flops",
                source=self.name,
                key_path="tensor_cores.fp8_rate",
            )
        limit = None if self.energy is None else self.energy.power_limit_w
        if limit is not None and self.static_power_w >= limit:
            raise HardwareError(
                f"energy.power_limit_w = {_show(limit)}: expected more than the chip's static power, "
                f"{self.static_power_w:.4g} W (static_w_per_mm2 x area)",
                source=self.name,
                key_path="energy.power_limit_w",
            )

    # -- derived quantities --------------------------------------------------------------------

    @property
    def peak_tensor_flops(self) -> float:
        """Peak tensor-core throughput in FLOP/s: 2 · count · pe_x · pe_y · clock (a MAC is 2)."""
        return 2.0 * self.tensor_cores.macs_per_cycle * self.clock_hz

    @property
    def peak_vector_flops(self) -> float:
        """Peak vector-core throughput in FLOP/s: count · width · clock (one op per lane per cycle)."""
        return float(self.vector_cores.count * self.vector_cores.width) * self.clock_hz

    @property
    def modeled_area_um2(self) -> float | None:
        """Chip area in µm² from the 22 nm area model (``phaze_ir.area``), or ``None``
        when the configuration is outside the model's domain (a per-core buffer or a global
        buffer size that its SRAM tables do not list)."""
        tc, vc = self.tensor_cores, self.vector_cores
        if not area.in_domain(tc.buffer_bytes, vc.buffer_bytes, self.global_buffer.bytes):
            return None
        return float(
            area.chip_area_um2(
                tc.count,
                tc.pe_x,
                tc.pe_y,
                vc.count,
                vc.width,
                self.global_buffer.bytes,
                tc_buffer_bytes=tc.buffer_bytes,
                vc_buffer_bytes=vc.buffer_bytes,
                fp8_rate=tc.fp8_rate,
            )
        )

    @property
    def area_um2(self) -> float | None:
        """Chip area in µm²: the area model's when in its domain, else the given ``area_mm2``
        (converted), else ``None``."""
        modeled = self.modeled_area_um2
        if modeled is not None:
            return modeled
        return None if self.area_mm2 is None else self.area_mm2 * 1e6

    @property
    def static_power_w(self) -> float:
        """One die's static power (W): ``[energy] static_w_per_mm2`` times the area (0 without an
        ``[energy]`` table or an area)."""
        area = self.area_um2
        if self.energy is None or area is None:
            return 0.0
        return self.energy.static_w_per_mm2 * area / 1e6

    @property
    def max_devices(self) -> int:
        """Largest number of devices the network describes (the last level's group size)."""
        return self.network[-1].group_size

    def network_level(self, num_devices: int) -> NetworkLevel:
        """The innermost level whose groups hold ``num_devices`` devices (a group of that many
        devices communicates at that level's bandwidth and latency)."""
        for level in self.network:
            if num_devices <= level.group_size:
                return level
        raise ValueError(
            f"{num_devices} devices exceed the network of {self.name!r} "
            f"(largest level {self.network[-1].name!r} holds {self.max_devices})"
        )

    # -- plain data ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A plain JSON-able dict, keys in a fixed order (scalars, tables, network); optional
        fields that are ``None`` are left out.  ``Accelerator.from_dict(a.to_dict()) == a``."""
        out: dict[str, Any] = {}
        for key in self._KEY_ORDER:
            value = getattr(self, key)
            if value is None:
                continue
            if key in _TABLES:
                table = {f.name: _plain(getattr(value, f.name), f) for f in dataclasses.fields(value)}
                out[key] = {k: v for k, v in table.items() if v is not None}
            elif key == "network":
                out[key] = [_level_dict(lv) for lv in value]
            else:
                out[key] = value
        return out

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<dict>", prefix: str = "") -> Accelerator:
        """Build an accelerator from a plain dict (the form of :meth:`to_dict` and of the TOML
        files), checking every key.  ``source`` names where the dict came from in error messages;
        ``prefix`` is prepended to key paths (for a description nested in a larger file)."""
        schema().check(data, source, prefix)  # keys, tables and types: the first refusal, in its words
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name not in data:
                continue
            path = prefix + f.name
            kind = f.metadata["kind"]
            value = data[f.name]
            if kind in ("table", "opt_table"):
                kwargs[f.name] = _parse_table(_TABLES[f.name], value, path, source)
            elif kind == "levels":
                kwargs[f.name] = _parse_levels(value, path, source)
            else:
                kwargs[f.name] = _check(kind, value, path, source, f.metadata["at_most"])
        _check_peaks(kwargs["clock_hz"], kwargs["tensor_cores"], kwargs["vector_cores"], source, prefix)
        return cls(**kwargs)


def _check_peaks(clock_hz: float, tc: TensorCores, vc: VectorCores, source: str | None, prefix: str = "") -> None:
    """The chip's peak FLOP/s within :data:`FLOPS`: the bounds of its factors alone (cores,
    array sides, clock) would let a chip reach 1e28 FLOP/s, and a power to match."""
    peaks = (
        ("tensor_cores", "2*count*pe_x*pe_y*clock_hz", 2.0 * tc.macs_per_cycle * clock_hz),
        ("vector_cores", "count*width*clock_hz", float(vc.count * vc.width) * clock_hz),
    )
    for key, formula, flops in peaks:
        if flops > FLOPS.value:
            raise HardwareError(
                f"{prefix}{key}: peak {formula} = {flops:.3g} FLOP/s: "
                f"expected at most {FLOPS.text()} FLOP/s ({FLOPS.why})",
                source=source,
                key_path=prefix + key,
            )


def _level_dict(level: NetworkLevel) -> dict[str, Any]:
    """A network level as plain data (fields that are ``None`` left out; the torus's dimensions
    and the protocols as lists)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(level):
        value = getattr(level, f.name)
        if value is None:
            continue
        if f.name == "torus_dims":
            value = list(value)
        elif f.name == "protocols":
            value = [
                {g.name: getattr(p, g.name) for g in dataclasses.fields(p) if getattr(p, g.name) is not None}
                for p in value
            ]
        out[f.name] = value
    return out


def _plain(value: Any, f: dataclasses.Field) -> Any:
    """A table field as plain data: a size table as ``{"bytes": number}``."""
    if f.metadata.get("kind") == "size_table":
        return {str(size): number for size, number in value}
    return value


def default_tc_buffer_bytes(pe_x: int, pe_y: int) -> int:
    """The per-tensor-core buffer the area model assumes: max(1 KiB, 16 B per PE)."""
    return max(KiB, 16 * pe_x * pe_y)


def default_vc_buffer_bytes(width: int) -> int:
    """The per-vector-core buffer the area model assumes: max(1 KiB, 16 B per lane)."""
    return max(KiB, 16 * width)


# --------------------------------------------------------------------------------------------
# Parsing helpers
# --------------------------------------------------------------------------------------------


def _unknown_key(key: Any, cls: type, prefix: str, source: str | None) -> HardwareError:
    known = [f.name for f in dataclasses.fields(cls)]
    close = difflib.get_close_matches(excerpt(str(key)), known, n=1, cutoff=0.6)
    hint = f" (did you mean '{close[0]}'?)" if close else f" (known keys: {', '.join(known)})"
    where = prefix + excerpt(str(key))
    return HardwareError(f"unknown key '{where}'{hint}", source=source, key_path=where)


def _missing(kind: str, path: str, source: str | None, table: type | None = None) -> HardwareError:
    if kind == "table":
        assert table is not None
        keys = ", ".join(f.name for f in dataclasses.fields(table))
        what = f"a table with {keys}"
    elif kind == "levels":
        what = "one or more [[network]] levels"
    else:
        what = _EXPECTED[kind.removeprefix("opt_")]
    return HardwareError(f"missing required key '{path}' ({what})", source=source, key_path=path)


def _parse_table(cls: type, value: dict, path: str, source: str | None) -> Any:
    """A table the schema has checked (:func:`schema`): its fields normalised (``32e9`` bytes an
    integer) and the dataclass built, which checks what spans its fields."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in value:
            continue
        fpath = f"{path}.{f.name}"
        if f.metadata["kind"] == "protocols":
            kwargs[f.name] = _parse_protocols(value[f.name], fpath, source)
            continue
        kwargs[f.name] = _check(f.metadata["kind"], value[f.name], fpath, source, f.metadata["at_most"])
    return cls(**kwargs)


#: What an array of tables must be, by its field's kind.
_ARRAYS = {
    "levels": "one or more [[network]] levels (an array of tables)",
    "protocols": "one or more [[network.protocols]] tables (an array of tables)",
}


def _parse_protocols(value: list, path: str, source: str | None) -> tuple[NetworkProtocol, ...]:
    protocols = tuple(_parse_table(NetworkProtocol, p, f"{path}[{i}]", source) for i, p in enumerate(value))
    names = [p.name for p in protocols]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise _fail(source, f"{path}[{i}].name", name, "a name not used by another protocol of the level")
    return protocols


def _parse_levels(value: list, path: str, source: str | None) -> tuple[NetworkLevel, ...]:
    levels = tuple(_parse_table(NetworkLevel, lv, f"{path}[{i}]", source) for i, lv in enumerate(value))
    _check_network(levels, source, path)
    return levels


def _check_network(levels: tuple[NetworkLevel, ...], source: str | None, path: str = "network") -> None:
    if not levels:
        raise HardwareError(f"{path} = []: expected one or more network levels", source=source, key_path=path)
    seen: set[str] = set()
    for i, level in enumerate(levels):
        if level.name in seen:
            raise _fail(source, f"{path}[{i}].name", level.name, "a name not used by another level")
        seen.add(level.name)
        _check_topology(levels, i, source, path)
        if i == 0:
            if level.uplink_Bps is not None:
                raise _fail(
                    source,
                    f"{path}[0].uplink_Bps",
                    level.uplink_Bps,
                    "no value: the innermost level has no level below it to leave",
                )
            continue
        inner = levels[i - 1].group_size
        if level.group_size <= inner or level.group_size % inner:
            raise _fail(
                source,
                f"{path}[{i}].group_size",
                level.group_size,
                f"a multiple of {path}[{i - 1}].group_size = {inner} larger than it "
                "(levels go innermost first, each made of whole groups of the one before)",
            )


def _check_topology(levels: tuple[NetworkLevel, ...], i: int, source: str | None, path: str) -> None:
    """A level's topology and the keys that go with it (docs/design.md §5.5)."""
    level = levels[i]
    at = f"{path}[{i}]"
    topology = level.topology or "switch"
    inner = levels[i - 1] if i > 0 else None
    for key, needs in (("torus_dims", "torus"), ("leaf_size", "fat_tree"), ("oversubscription", "fat_tree")):
        value = getattr(level, key)
        if value is not None and topology != needs:
            raise _fail(source, f"{at}.{key}", value, f'no value: it goes with topology = "{needs}"')
        if value is None and topology == needs:
            kind = {"torus_dims": "dims", "leaf_size": "pos_int", "oversubscription": "ratio"}[key]
            raise _missing(kind, f"{at}.{key}", source)
    if level.protocols is not None and (i > 0 or topology != "switch"):
        raise _fail(
            source,
            f"{at}.protocols",
            level.protocols,
            "no value: protocols are fitted inside one group of the innermost level (a switch)",
        )
    if level.protocols is not None and all(p.algorithm == "nvls" for p in level.protocols):
        raise _fail(
            source,
            f"{at}.protocols",
            level.protocols,
            'at least one ring protocol (no algorithm, or algorithm = "ring"): NVLink SHARP '
            "prices all-reduces only, a ring the reduce-scatters and all-gathers",
        )
    if level.tree and (i == 0 or topology == "torus"):
        raise _fail(
            source,
            f"{at}.tree",
            level.tree,
            "no value: NCCL's tree crosses the groups of the level below (not on the innermost level) "
            "through switches (not on a torus)",
        )
    if topology == "torus" and level.uplink_Bps is not None:
        raise _fail(
            source,
            f"{at}.uplink_Bps",
            level.uplink_Bps,
            "no value: a torus has no uplink (its chips' own links carry every transfer)",
        )
    if topology == "torus":
        dims = level.torus_dims
        assert dims is not None
        product = math.prod(dims)
        if inner is not None and (inner.topology or "switch") == "torus":
            inner_dims = inner.torus_dims
            assert inner_dims is not None
            if len(inner_dims) != len(dims):
                raise _fail(
                    source,
                    f"{at}.torus_dims",
                    dims,
                    f"{len(inner_dims)} dimensions, as the inner torus {path}[{i - 1}].torus_dims",
                )
            product *= inner.group_size
            what = f"dimensions in inner tori whose product times {path}[{i - 1}].group_size = {inner.group_size}"
        elif inner is not None:
            raise _fail(
                source,
                f"{at}.topology",
                level.topology,
                "a torus only as the innermost level or on a torus level (its dimensions count devices or inner tori)",
            )
        else:
            what = "dimensions whose product"
        if product != level.group_size:
            raise _fail(source, f"{at}.torus_dims", list(dims), f"{what} is group_size = {level.group_size}")
    if topology == "fat_tree":
        leaf = level.leaf_size
        assert leaf is not None
        below = inner.group_size if inner is not None else 1
        if leaf % below or level.group_size % leaf:
            raise _fail(
                source,
                f"{at}.leaf_size",
                leaf,
                f"a multiple of the inner group ({below} devices) that divides group_size = {level.group_size}",
            )


# --------------------------------------------------------------------------------------------
# The schema (pydantic): built from the fields' declarations above
# --------------------------------------------------------------------------------------------


def _kind_schema(f: dataclasses.Field) -> Any:
    """The core schema of a value field, from its kind and bound (what :func:`_check_kind`
    accepts of a TOML value; the field's check words the refusal)."""
    from pydantic_core import core_schema as cs

    from phaze_ir.schema import number

    kind = f.metadata["kind"].removeprefix("opt_")
    bound = f.metadata["at_most"]
    le = None if bound is None else bound.value
    if kind == "pos_int":
        return number(integer=True, gt=0, le=I64_MAX if le is None else min(le, I64_MAX))
    if kind == "pos_float":
        return number(gt=0, le=le)
    if kind == "nonneg_float":
        return number(ge=0, le=le)
    if kind == "ratio":
        return number(ge=1, le=le)
    if kind == "fraction":
        return number(gt=0, le=1 if le is None else min(le, 1))
    if kind == "name":
        return cs.str_schema(strict=True, pattern=r"\S")
    if kind in ("execution", "topology", "algorithm"):
        return cs.literal_schema(
            list({"execution": EXECUTION_MODES, "topology": TOPOLOGIES}.get(kind, PROTOCOL_ALGORITHMS))
        )
    if kind == "bool":
        return cs.bool_schema(strict=True)
    if kind == "dims":
        return cs.list_schema(number(integer=True, gt=0, le=I64_MAX), min_length=2, max_length=3)
    if kind == "size_table":
        return cs.dict_schema(cs.str_schema(pattern=r"^[0-9]+$"), number(gt=0, le=le), min_length=1, strict=True)
    raise AssertionError(kind)  # pragma: no cover


def _nested(f: dataclasses.Field) -> tuple[str, type] | None:
    kind = f.metadata["kind"]
    if kind in ("table", "opt_table"):
        return ("table", _TABLES[f.name])
    if kind == "levels":
        return ("list", NetworkLevel)
    if kind == "protocols":
        return ("list", NetworkProtocol)
    return None


def _word_missing(f: dataclasses.Field, path: str, source: str) -> HardwareError:
    return _missing(f.metadata["kind"], path, source, _TABLES.get(f.name))


def _word_not_table(cls: type | None, path: str, value: Any, source: str) -> HardwareError:
    if cls is None:  # the description itself
        return HardwareError(
            f"{path or 'hardware description'} = {_show(value)}: expected a table", source=source, key_path=path or None
        )
    return _fail(source, path, value, "a table" + _type_hint(value))


def _word_not_list(f: dataclasses.Field, path: str, value: Any, source: str) -> HardwareError:
    return _fail(source, path, value, _ARRAYS[f.metadata["kind"]])


def _word_value(f: dataclasses.Field, path: str, value: Any, source: str) -> HardwareError | None:
    try:
        _check(f.metadata["kind"], value, path, source, f.metadata["at_most"])
    except HardwareError as exc:
        return exc
    return None


_SCHEMA: Any = None


def schema() -> Any:
    """The hardware description's :class:`phaze_ir.schema.Schema` (built once): what
    :meth:`Accelerator.from_dict` validates a file with, and the JSON Schema for editors
    (``python -m phaze_ir.hardware --json-schema``, ``docs/schema/hardware.schema.json``)."""
    global _SCHEMA
    if _SCHEMA is None:
        from phaze_ir.schema import Schema, Wording

        _SCHEMA = Schema(
            Accelerator,
            kind_schema=_kind_schema,
            nested=_nested,
            wording=Wording(
                unknown=_unknown_key,
                missing=_word_missing,
                not_table=_word_not_table,
                not_list=_word_not_list,
                value=_word_value,
            ),
            title="phaze hardware description",
            description=(
                "One accelerator chip and the network of the cluster it is in (phaze_ir/hardware.py). "
                "Units are SI and named in each key: *_hz Hz, bytes / *_bytes bytes, *_Bps bytes per second, "
                "*_s seconds, *_w watts, *_usd US dollars, *_mm2 mm^2."
            ),
            extend=_extend_json_schema,
        )
    return _SCHEMA


def _extend_json_schema(out: dict[str, Any]) -> None:
    """What a file may hold beyond the description's fields: ``base``, a description to start
    from (:func:`_read_with_base`)."""
    out["properties"] = {
        "base": {
            "title": "base",
            "description": "a preset name or a TOML path (relative to this file) to start from: "
            "each top-level key given here replaces the base's",
            "type": "string",
            "minLength": 1,
        },
        **out["properties"],
    }


# --------------------------------------------------------------------------------------------
# Files and presets
# --------------------------------------------------------------------------------------------


def _quoted(name: str) -> str:
    """``'name'``, with control characters escaped (a message stays one line), at most an excerpt."""
    return "'" + excerpt(json.dumps(name, ensure_ascii=False)[1:-1]) + "'"


def preset_names() -> list[str]:
    """Names of the hardware presets shipped with the package, sorted."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def preset_path(name: str) -> Path:
    """The TOML file of preset ``name``; :class:`HardwareError` listing the known ones if none."""
    path = PRESET_DIR / f"{name}.toml"
    try:
        found = path.is_file()
    except OSError:  # a name too long for a file name (ENAMETOOLONG): no preset either
        found = False
    if not found:
        known = preset_names()
        close = difflib.get_close_matches(excerpt(name), known, n=1, cutoff=0.6)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise HardwareError(
            f"unknown hardware preset {_quoted(name)}{hint}; known presets: {', '.join(known)} "
            "(or give the path of a .toml file)"
        )
    return path


def _looks_like_path(name: str) -> bool:
    return "/" in name or os.sep in name or name.endswith(".toml") or name.startswith(".")


def load_hardware(name_or_path: str | os.PathLike[str]) -> Accelerator:
    """Load an accelerator from a preset name (``tpuv4``, ``a100``, ``h100``: see
    :func:`preset_names`) or from the path of a TOML file.  A string with a ``/`` or ending in
    ``.toml`` is a path; any other string is a preset name."""
    if isinstance(name_or_path, str) and not _looks_like_path(name_or_path):
        path = preset_path(name_or_path)
        return _load_file(path, source=path.name)
    path = Path(name_or_path)
    return _load_file(path, source=str(name_or_path))


def _load_file(path: Path, source: str) -> Accelerator:
    return Accelerator.from_dict(_read_with_base(path, source, ()), source=source)


def _read_toml_file(path: Path, source: str) -> dict[str, Any]:
    try:
        text = read_regular(path, TOML_LIMIT, "TOML file").decode("utf-8")
    except FileNotFoundError:
        raise HardwareError("no such file", source=source) from None
    except RefusedFile as exc:
        raise HardwareError(str(exc.strerror), source=source) from None
    except UnicodeDecodeError as exc:
        raise HardwareError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", source=source) from None
    except OSError as exc:
        raise HardwareError(f"cannot read: {exc.strerror}", source=source) from None
    return parse_toml(text, source)


def _read_with_base(path: Path, source: str, seen: tuple[Path, ...]) -> dict[str, Any]:
    """The TOML of ``path`` as a plain dict, on top of its ``base`` when it names one.

    ``base = "a100"`` (a preset, or a TOML path relative to the file) starts the description
    from that one: each top-level key the file gives (``name``, a table such as ``[energy]``,
    the whole ``[[network]]`` list) replaces the base's, the rest is the base's.  So a variant
    of a chip (the same die on another network, say) is written once, without copying it."""
    data = _read_toml_file(path, source)
    if "base" not in data:
        return data
    base = data.pop("base")
    if not isinstance(base, str) or not base:
        raise HardwareError(
            f"base = {_show(base)}: expected a preset name or a TOML path", source=source, key_path="base"
        )
    if "name" not in data:
        raise HardwareError("a description with a base needs its own 'name'", source=source, key_path="name")
    if _looks_like_path(base):
        base_path, base_source = (path.parent / base), str(path.parent / base)
    else:
        base_path = preset_path(base)
        base_source = base_path.name
    if base_path.resolve() in seen + (path.resolve(),):
        raise HardwareError(
            f"base = {_quoted(base)}: a description cannot be its own base", source=source, key_path="base"
        )
    return {**_read_with_base(base_path, base_source, seen + (path.resolve(),)), **data}


def parse_toml(text: str, source: str, error: type[HardwareError] = HardwareError) -> dict[str, Any]:
    """``tomllib.loads`` with syntax errors turned into ``error`` with the message
    ``<source>: TOML syntax error: <what> (at line L, column C)``.  A UTF-8 byte-order mark
    before the text is skipped (an editor on Windows writes one; the CSV reader skips it too):
    TOML 1.0 does not mention it, and tomllib takes it for a key and fails."""
    text = text.removeprefix("\ufeff")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"TOML syntax error: {exc}", source=source) from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise error("arrays or inline tables nested too deeply", source=source) from None
    except ValueError:  # int() of a literal of more digits than sys.get_int_max_str_digits()
        limit = sys.get_int_max_str_digits()
        long = re.search("[0-9][0-9_]{" + str(limit) + ",}", text)
        where = f" (at line {text.count(chr(10), 0, long.start()) + 1})" if long else ""
        raise error(f"TOML syntax error: an integer of more than {limit} digits{where}", source=source) from None


def loads_toml(text: str, source: str = "<string>") -> Accelerator:
    """Parse a hardware description from TOML text; ``source`` names it in error messages."""
    data = parse_toml(text, source)
    return Accelerator.from_dict(data, source=source)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):  # a level's tree
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, int):
        return f"{value:_}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, float):
        return _fmt_float(value)
    if isinstance(value, list):  # the torus's dimensions
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table (a size table: its keys are digits, bare keys)
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(value)  # pragma: no cover


def _fmt_float(value: float) -> str:
    """Shortest text that reads back as the same float, in scientific form for large or small
    magnitudes (1050000000.0 -> 1.05e9); valid TOML for finite values."""
    text = repr(value)
    if "e" in text:  # 2e-06 -> 2e-6
        mantissa, exponent = text.split("e")
        return f"{mantissa}e{int(exponent)}"
    if math.isfinite(value) and (abs(value) >= 1e6 or 0 < abs(value) < 1e-3):
        for digits in range(17):
            sci = f"{value:.{digits}e}"
            if float(sci) == value:
                mantissa, exponent = sci.split("e")
                return f"{mantissa}e{int(exponent)}"
    return text


def dumps_toml(acc: Accelerator) -> str:
    """The TOML text of an accelerator (the format of the preset files, without their comments);
    ``loads_toml(dumps_toml(a)) == a``."""
    data = acc.to_dict()
    lines = [
        "# phaze hardware description. Units are SI and named in each key: *_hz Hz, bytes / *_bytes",
        "# bytes, *_Bps bytes per second, *_s seconds, *_w watts, *_usd US dollars, *_mm2 mm^2.",
    ]
    for key, value in data.items():
        if not isinstance(value, (dict, list)):
            lines.append(f"{key} = {_toml_value(value)}")
    for key, value in data.items():
        if isinstance(value, dict):
            lines.append("")
            lines.append(f"[{key}]")
            lines.extend(f"{k} = {_toml_value(v)}" for k, v in value.items())
    for level in data["network"]:
        lines.append("")
        lines.append("[[network]]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in level.items() if k != "protocols")
        for protocol in level.get("protocols", ()):
            lines.append("[[network.protocols]]")
            lines.extend(f"{k} = {_toml_value(v)}" for k, v in protocol.items())
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m phaze_ir.hardware --json-schema > hardware.schema.json
    import argparse

    from phaze_ir import hardware as _hardware  # the module's own classes, not __main__'s copies

    _parser = argparse.ArgumentParser(prog="python -m phaze_ir.hardware", description=__doc__.split("\n")[0])
    _parser.add_argument("--json-schema", action="store_true", help="write the JSON Schema of a hardware TOML file")
    _args = _parser.parse_args()
    if not _args.json_schema:
        _parser.error("nothing to do: give --json-schema")
    sys.stdout.write(_hardware.schema().json_schema_text())
