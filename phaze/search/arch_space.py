"""The accelerator architecture space: every on-chip configuration the search may pick.

A candidate is ``(num_tc, num_vc, width, depth, width_vc, glb_bytes, fp8_rate)``: ``num_tc`` tensor
cores of ``width × depth`` PEs (``pe_x × pe_y`` in :mod:`phaze_ir.hardware`), with the FP8 datapath
when ``fp8_rate`` is 2 (FP8 GEMMs at twice the bf16 rate, each PE larger: ``[fp8_datapath]`` of
``phaze_ir/area_22nm.toml``), ``num_vc`` vector cores of ``width_vc`` lanes and a global buffer of
``glb_bytes``.  A candidate is kept when its area ``A``
(:mod:`phaze_ir.area`, µm²) satisfies ``lower_fraction · budget ≤ A ≤ budget``; the
lower bound is waived when ``num_tc == 1`` or ``num_vc == 1`` (as in the paper's code).

Everything else (clock, precision, HBM and global-buffer bandwidths, network) comes from a
*template* accelerator.  HBM capacity is a separate axis (``hbm_bytes`` options): it costs no chip
area and changes no per-operator latency, only what fits in memory, so it is not multiplied into
the candidates; :meth:`ArchSpace.accelerator` takes the HBM capacity as an argument.

The paper's space (:func:`paper_space`, ``examples/spaces/paper.toml``): num_tc, num_vc ∈ {1 … 4096},
width, depth ∈ {2 … 256}, width_vc = width, global buffer ∈ {2 … 128} MiB, all powers of two:
75,712 candidates, 29,360 within the area rule, HBM ∈ {32, 64, 80} GiB, budget = the area of the
TPUv4-like chip (278.83 mm²).

**Order.**  Candidates are enumerated lexicographically over the axes ``num_tc, num_vc, width,
depth, width_vc, glb_bytes`` (``num_tc`` outermost), each axis in the order its values are given;
``{min, max}`` ranges run from ``max`` down to ``min``.  For the paper's space this is exactly the
order of the reference's ``cores.json`` (descending), so row ``i`` here is row ``i`` there.

Generation is vectorized: the area is computed by broadcasting over the axes (no Python loop over
candidates) and the kept candidates are one structured numpy array, :attr:`ArchSpace.configs`.

Space files (TOML), units in key names (``glb_MiB``, ``hbm_GiB``, ``budget_mm2``)::

    name = "paper"
    [template]                  # everything not searched
    hardware = "tpuv4"          # a preset name, or a TOML path relative to this file
    clock_hz = 1.05e9           # optional overrides, same keys as a hardware file
    [area]
    budget_of = "tpuv4"         # the area of that hardware (preset or path); or budget_mm2 = 278.83
    lower_fraction = 0.3        # optional, default 0.3
    waive_lower_bound_single_core = true   # optional, default true
    [search]                    # each: an integer, a list, or {min = a, max = b} (powers of two)
    num_tc = { min = 1, max = 4096 }
    num_vc = { min = 1, max = 4096 }
    width = { min = 2, max = 256 }
    depth = { min = 2, max = 256 }
    width_vc = "width"          # tied to width (or "depth"), or values like the others
    glb_MiB = { min = 2, max = 128 }
    hbm_GiB = [32, 64, 80]      # optional, default the template's HBM
    fp8_rate = [0, 2]           # optional, default [0]: the FP8 datapath (innermost axis); a search
                                # takes the chips of its precision (ArchSpace.for_fp8)

**Checks**, when the space is read, before any model is traced: every value of an axis within the
plausibility bound of the hardware field it becomes (:func:`phaze_ir.hardware.field_bound`; for
the PE arrays, vector widths and global buffers the area model's tables are tighter), the budget
within a chip's area bound, and every kept chip's peak FLOP/s within
:data:`phaze_ir.hardware.FLOPS`.  With a template ``[manufacturing]`` table, the chips whose die
does not fit its wafer are left out, with one :class:`~phaze_ir.warning.PhazeWarning`
(:func:`_on_the_wafer` says why).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import math
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from passes.algorithms.cost import die_fits, unfit_die
from passes.algorithms.latency import CONFIG_DTYPE
from phaze_ir import area as area_model
from phaze_ir.files import EXCERPT_CHARS, RefusedFile, excerpt, read_regular
from phaze_ir.hardware import (
    FLOPS,
    HBM,
    I64_MAX,
    TOML_LIMIT,
    Accelerator,
    Bound,
    GiB,
    GlobalBuffer,
    HardwareError,
    MiB,
    TensorCores,
    VectorCores,
    _spec,
    field_bound,
    load_hardware,
    parse_toml,
)
from phaze_ir.warning import PhazeWarning

__all__ = [
    "ArchSpaceError",
    "SpaceSpec",
    "ArchSpace",
    "CONFIG_DTYPE",
    "AXES",
    "paper_spec",
    "paper_space",
    "load_space",
    "loads_space",
    "spec_from_dict",
]

#: The searched axes, outermost first (the enumeration order); ``fp8_rate`` innermost, so that the
#: chips of one FP8 choice keep the order of a space without that axis.
AXES = ("num_tc", "num_vc", "width", "depth", "width_vc", "glb_bytes", "fp8_rate")

_TIES = ("width", "depth")

#: The hardware field each axis becomes in a candidate (:meth:`ArchSpace.accelerator`): a value
#: beyond that field's plausibility bound (:func:`phaze_ir.hardware.field_bound`) is refused
#: when the space is read, not when the search builds the chip after tracing the models.
_AXIS_FIELDS: dict[str, tuple[type, str]] = {
    "num_tc": (TensorCores, "count"),
    "num_vc": (VectorCores, "count"),
    "width": (TensorCores, "pe_x"),
    "depth": (TensorCores, "pe_y"),
    "width_vc": (VectorCores, "width"),
    "glb_bytes": (GlobalBuffer, "bytes"),
    "hbm_bytes": (HBM, "bytes"),
}


def _axis_bound(axis: str) -> Bound | None:
    cls, name = _AXIS_FIELDS[axis]
    return field_bound(cls, name)


def _in_unit(nbytes: float, unit: int) -> str:
    """``nbytes`` in ``unit`` as the space file writes it (every digit: ``8388608``, not ``8.39e+06``)."""
    value = nbytes / unit
    return str(int(value)) if value == int(value) else repr(value)


def _check_bounds(spec: SpaceSpec, src: str, paths: dict[str, str] | None = None) -> None:
    """Every value of every axis at most the bound of the hardware field it becomes; say which
    key (``paths``: the space file's, ``glb_MiB`` and ``hbm_GiB`` in their units), value and bound.

    Checked after :func:`_check_domain`: for the axes the area model's tables limit (PE arrays,
    vector widths, global buffers), the tables are the tighter limit and the message that lists
    what they hold is the more useful one; the core counts and HBM are bounded only here."""
    p = {axis: axis for axis in _AXIS_FIELDS} | (paths or {})
    for axis in _AXIS_FIELDS:
        values = getattr(spec, axis)
        bound = _axis_bound(axis)
        if isinstance(values, str) or not values or bound is None or max(values) <= bound.value:
            continue
        scale = MiB if p[axis].endswith("MiB") else GiB if p[axis].endswith("GiB") else 1
        shown, most = _in_unit(max(values), scale), _in_unit(bound.value, scale) if scale > 1 else bound.text()
        what = "a positive number" if scale > 1 else "a positive integer"
        raise ArchSpaceError(
            f"{p[axis]} = {shown}: expected {what} at most {most} ({bound.why})", source=src, key_path=p[axis]
        )


def _area_bound() -> Bound | None:
    """The budget is a chip's area: bounded as a hardware file's ``area_mm2`` is (mm²)."""
    return field_bound(Accelerator, "area_mm2")


class ArchSpaceError(HardwareError):
    """A malformed architecture space (file or :class:`SpaceSpec`).  A :class:`HardwareError`, so
    one ``except`` clause catches errors of the space file and of the hardware it names; the
    message has the same one-line form (``<file>: <key path> = <value>: expected <what>``)."""


@dataclass(frozen=True)
class SpaceSpec:
    """What to enumerate.  Value tuples are in enumeration order.

    Attributes:
        template: the accelerator that supplies everything not searched (clock, precision, HBM
            and global-buffer bandwidths, network); its core counts, shapes and buffer sizes are
            replaced by each candidate's.
        num_tc: tensor-core counts.
        num_vc: vector-core counts.
        width: PE-array widths W (PEs), the hardware's ``pe_x``.
        depth: PE-array depths D (PEs), the hardware's ``pe_y``.
        width_vc: vector widths (lanes), or ``"width"`` / ``"depth"`` to tie it to that axis.
        glb_bytes: global-buffer capacities, bytes.
        budget_um2: the area budget, µm².
        lower_fraction: candidates below ``lower_fraction · budget_um2`` are dropped...
        waive_lower_bound_single_core: ...unless ``num_tc == 1`` or ``num_vc == 1`` and this is set.
        hbm_bytes: HBM capacity options, bytes (empty: the template's).
        name: label of the space (prefix of candidate names).
        fp8_rate: the FP8 datapath of the PE arrays, each 0 (none) or the area model's rate
            (:data:`phaze_ir.area.FP8_RATE`: FP8 GEMMs at twice the bf16 rate, PEs
            :data:`~phaze_ir.area.FP8_PE_AREA_RATIO` times larger).  Default ``(0,)``: the
            paper's chips.  A search takes the chips of its precision only
            (:meth:`ArchSpace.for_fp8`).
    """

    template: Accelerator
    num_tc: tuple[int, ...]
    num_vc: tuple[int, ...]
    width: tuple[int, ...]
    depth: tuple[int, ...]
    width_vc: tuple[int, ...] | str
    glb_bytes: tuple[int, ...]
    budget_um2: float
    lower_fraction: float = 0.3
    waive_lower_bound_single_core: bool = True
    hbm_bytes: tuple[int, ...] = ()
    name: str = "space"
    fp8_rate: tuple[int, ...] = (0,)

    def __post_init__(self) -> None:
        src = f"SpaceSpec {self.name!r}"
        object.__setattr__(self, "fp8_rate", _fp8_rates(self.fp8_rate, "fp8_rate", src))
        if not isinstance(self.template, Accelerator):
            raise ArchSpaceError(f"template = {excerpt(repr(self.template))}: expected an Accelerator", source=src)
        for axis in ("num_tc", "num_vc", "width", "depth", "glb_bytes", "hbm_bytes"):
            value = getattr(self, axis)
            if axis == "hbm_bytes" and value == ():
                continue
            object.__setattr__(self, axis, _int_values(value, axis, src))
        if isinstance(self.width_vc, str):
            if self.width_vc not in _TIES:
                raise ArchSpaceError(
                    f"width_vc = {_show(self.width_vc)}: expected values or one of "
                    f"{', '.join(repr(t) for t in _TIES)} (a tie)",
                    source=src,
                )
        else:
            object.__setattr__(self, "width_vc", _int_values(self.width_vc, "width_vc", src))
        budget = self.budget_um2
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
            raise ArchSpaceError(f"budget_um2 = {_show(budget)}: expected a positive number", source=src)
        area = _area_bound()
        if area is not None and budget > area.value * 1e6:
            raise ArchSpaceError(
                f"budget_um2 = {_show(budget)}: expected a positive number at most {area.value * 1e6:g} ({area.why})",
                source=src,
            )
        object.__setattr__(self, "budget_um2", float(budget))
        frac = self.lower_fraction
        if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac <= 1:
            raise ArchSpaceError(f"lower_fraction = {_show(frac)}: expected a number in [0, 1]", source=src)
        object.__setattr__(self, "lower_fraction", float(frac))
        if not isinstance(self.waive_lower_bound_single_core, bool):
            raise ArchSpaceError(
                f"waive_lower_bound_single_core = {_show(self.waive_lower_bound_single_core)}: expected a boolean",
                source=src,
            )

    @property
    def hbm_options(self) -> tuple[int, ...]:
        """HBM capacities (bytes) the candidates may be paired with."""
        return self.hbm_bytes or (self.template.hbm.bytes,)

    @property
    def num_candidates(self) -> int:
        """Size of the grid before the area rule."""
        n = len(self.num_tc) * len(self.num_vc) * len(self.width) * len(self.depth) * len(self.glb_bytes)
        return n * (1 if isinstance(self.width_vc, str) else len(self.width_vc)) * len(self.fp8_rate)


def _fp8_rates(value: Any, path: str, src: str) -> tuple[int, ...]:
    """The ``fp8_rate`` axis: distinct values, each 0 (no FP8 datapath) or the area model's rate."""
    allowed = (0, area_model.FP8_RATE)
    values = (value,) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else value
    try:
        values = tuple(values)
    except TypeError:
        values = (value,)
    ok = bool(values) and all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) and int(v) in allowed for v in values
    )
    if not ok or len(set(values)) != len(values):
        raise ArchSpaceError(
            f"{path} = {_show(value)}: expected distinct values of {allowed[0]} (no FP8 datapath) and "
            f"{allowed[1]} (FP8 GEMMs at {allowed[1]}x the bf16 rate: phaze_ir/area_22nm.toml [fp8_datapath])",
            source=src,
            key_path=path,
        )
    return tuple(int(v) for v in values)


def _int_values(value: Any, axis: str, src: str) -> tuple[int, ...]:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value,)
    try:
        values = tuple(value)
    except TypeError:
        raise ArchSpaceError(f"{axis} = {_show(value)}: expected a sequence of positive integers", source=src) from None
    if not values:
        raise ArchSpaceError(f"{axis} = (): expected at least one value", source=src)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise ArchSpaceError(f"{axis} = {_show(values)}: expected positive integers (not {_show(v)})", source=src)
    if len(set(values)) != len(values):
        raise ArchSpaceError(f"{axis} = {_show(values)}: expected distinct values", source=src)
    return tuple(int(v) for v in values)


class ArchSpace:
    """The candidates of a :class:`SpaceSpec` that satisfy its area rule.

    ``len(space)`` candidates; ``space[i]`` is candidate ``i`` as an :class:`Accelerator` (with the
    first HBM option); :meth:`accelerator` picks the HBM capacity.  :attr:`configs` is the
    read-only structured array of all of them (fields of :data:`CONFIG_DTYPE`), the form the
    vectorized cost passes use.
    """

    def __init__(self, spec: SpaceSpec, configs: np.ndarray, source: str | None = None):
        if configs.dtype != CONFIG_DTYPE:
            raise TypeError(f"configs must have dtype CONFIG_DTYPE, not {configs.dtype}")
        configs.flags.writeable = False
        self.spec = spec
        self.configs = configs
        self.source = source

    # -- generation ------------------------------------------------------------------------------

    @classmethod
    def generate(cls, spec: SpaceSpec, *, source: str | None = None, paths: dict[str, str] | None = None) -> ArchSpace:
        """Enumerate ``spec``'s grid, compute every candidate's area by broadcasting over the axes,
        keep those within the area rule, in the documented lexicographic order.

        The kept chips' peak FLOP/s must be within :data:`phaze_ir.hardware.FLOPS` (else the
        space is refused, naming the chip); when the template has a ``[manufacturing]`` table,
        chips whose die does not fit its wafer are left out with a :class:`PhazeWarning` (the
        space is refused when none fits).  ``paths``: the space file's key of each axis
        (``search.glb_MiB`` for ``glb_bytes``), for the messages."""
        src = source or f"SpaceSpec {spec.name!r}"
        tied = isinstance(spec.width_vc, str)
        axis_values = [spec.num_tc, spec.num_vc, spec.width, spec.depth]
        if not tied:
            axis_values.append(spec.width_vc)  # type: ignore[arg-type]
        axis_values.append(spec.glb_bytes)
        axis_values.append(spec.fp8_rate)
        ndim = len(axis_values)

        def along(k: int) -> np.ndarray:
            shape = [1] * ndim
            shape[k] = -1
            return np.asarray(axis_values[k], dtype=np.int64).reshape(shape)

        ntc, nvc, w, d = along(0), along(1), along(2), along(3)
        wv = {"width": w, "depth": d}[spec.width_vc] if tied else along(4)  # type: ignore[index]
        glb, fp8 = along(ndim - 2), along(ndim - 1)
        _check_domain(spec, src, paths)
        _check_bounds(spec, src, paths)

        area = area_model.chip_area_um2(ntc, w, d, nvc, wv, glb, fp8_rate=fp8)
        area = np.broadcast_to(area, tuple(len(v) for v in axis_values))
        budget = spec.budget_um2
        keep = area <= budget
        lower_ok = area >= spec.lower_fraction * budget
        if spec.waive_lower_bound_single_core:
            lower_ok = lower_ok | (ntc == 1) | (nvc == 1)
        keep &= lower_ok

        flat = np.flatnonzero(keep)  # C order: lexicographic over the axes, num_tc outermost
        if len(flat) == 0:
            lo = spec.lower_fraction * budget
            raise ArchSpaceError(
                f"no candidate satisfies the area rule {lo / 1e6:.4g} mm^2 <= area <= {budget / 1e6:.4g} mm^2 "
                f"(the grid's areas run from {area.min() / 1e6:.4g} to {area.max() / 1e6:.4g} mm^2)",
                source=src,
            )
        index = np.unravel_index(flat, keep.shape)
        configs = _configs(spec, index, area.reshape(-1)[flat])
        _check_peaks(spec, configs, src, paths)
        configs = _on_the_wafer(spec, configs, src)
        return cls(spec, configs, source=source)

    # -- container protocol ----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.configs)

    def __getitem__(self, i: int) -> Accelerator:
        return self.accelerator(i)

    def __iter__(self) -> Iterator[Accelerator]:
        for i in range(len(self)):
            yield self.accelerator(i)

    def __repr__(self) -> str:
        return (
            f"ArchSpace({self.spec.name!r}: {len(self)} of {self.num_candidates} candidates, "
            f"budget {self.spec.budget_um2 / 1e6:.2f} mm^2)"
        )

    @property
    def num_candidates(self) -> int:
        """Size of the grid before the area rule (75,712 for the paper's space)."""
        return self.spec.num_candidates

    @property
    def hbm_options(self) -> tuple[int, ...]:
        """HBM capacities (bytes) a candidate may be paired with."""
        return self.spec.hbm_options

    def column(self, name: str) -> np.ndarray:
        """One field of :attr:`configs` (read-only view): ``num_tc``, ..., ``area_um2``."""
        return self.configs[name]

    def accelerator(self, i: int, hbm_bytes: int | None = None) -> Accelerator:
        """Candidate ``i`` as a full :class:`Accelerator`: its cores and global buffer, per-core
        buffers as the area model assumes, HBM of ``hbm_bytes`` (default: the first option), the
        rest from the template: its energy per action, manufacturing and deployment data too
        (they describe the technology and the data centre, not one chip).  Power, cost and given
        area are not carried over."""
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"candidate {i} out of range for a space of {n}")
        row = self.configs[i]
        hbm = self.hbm_options[0] if hbm_bytes is None else int(hbm_bytes)
        name = f"{self.spec.name}:{_chip(row)}-hbm{_fmt_size(hbm)}"
        try:
            return self._build(name, row, hbm)
        except HardwareError as e:
            # The space's checks keep every candidate within the hardware's bounds; should one
            # still fail (an HBM capacity given here), the message names the space and the
            # candidate, on one line.
            src = self.source or f"SpaceSpec {_show(self.spec.name)}"
            raise ArchSpaceError(f"candidate {i}, {excerpt(name)}: {e}", source=src) from None

    def _build(self, name: str, row: np.void, hbm: int) -> Accelerator:
        t = self.spec.template
        glb = int(row["glb_bytes"])
        fp8 = int(row["fp8_rate"]) or None
        energy = None if t.energy is None else dataclasses.replace(t.energy, power_limit_w=None)
        if energy is not None and fp8 and energy.fp8_mac_j is None:  # the FP8 datapath's MAC (area_22nm.toml)
            energy = dataclasses.replace(energy, fp8_mac_j=area_model.fp8_mac_j(energy.mac_j))
        return Accelerator(
            name=name,
            clock_hz=t.clock_hz,
            tensor_cores=TensorCores(
                count=int(row["num_tc"]),
                pe_x=int(row["width"]),
                pe_y=int(row["depth"]),
                buffer_bytes=int(row["tc_buffer_bytes"]),
                fp8_rate=fp8,
            ),
            vector_cores=VectorCores(
                count=int(row["num_vc"]), width=int(row["width_vc"]), buffer_bytes=int(row["vc_buffer_bytes"])
            ),
            global_buffer=GlobalBuffer(bytes=glb, bandwidth_Bps=t.global_buffer.bandwidth_Bps),
            hbm=HBM(bytes=hbm, bandwidth_Bps=t.hbm.bandwidth_Bps),
            bytes_per_element=t.bytes_per_element,
            network=t.network,
            # a space's chips are ideal (no calibration) and of other areas than the template's part:
            # its power limit, a property of that part, is not theirs (docs/energy.md)
            energy=energy,
            manufacturing=t.manufacturing,
            deployment=t.deployment,
        )

    def for_fp8(self, fp8: bool) -> ArchSpace:
        """The chips a search of one precision takes (``fp8``: ``--dtype fp8``).  Under FP8, the
        chips with the FP8 datapath only: one without it cannot run the FP8 linears (the
        runtimes refuse them, Transformer Engine's ``check_fp8_support`` on a GPU without FP8
        tensor cores, as ``--hw`` does), so it is left out rather than priced at its bf16
        rate.  Otherwise the chips without it only: with no FP8 GEMM the datapath is area and
        nothing else, and a space whose ``fp8_rate`` axis is absent (``(0,)``) is searched as
        it always was, the same chips in the same order (a space of FP8 chips only is searched
        whole).  Refused in one line when ``fp8`` and none has the datapath."""
        keep = (self.configs["fp8_rate"] > 0) == fp8
        if keep.all() or (not fp8 and not keep.any()):  # a space of FP8 chips only runs 16-bit GEMMs too
            return self
        if not keep.any():
            raise ArchSpaceError(
                f"--dtype fp8: no chip of the space has the FP8 datapath: give search.fp8_rate = "
                f"[{area_model.FP8_RATE}] (or [0, {area_model.FP8_RATE}])",
                source=self.source or f"SpaceSpec {_show(self.spec.name)}",
                key_path="search.fp8_rate",
            )
        return ArchSpace(self.spec, self.configs[keep], self.source)

    def find(
        self,
        *,
        num_tc: int,
        num_vc: int,
        width: int,
        depth: int,
        glb_bytes: int,
        width_vc: int | None = None,
        fp8_rate: int = 0,
    ) -> int | None:
        """Index of the candidate with these values (``width_vc`` defaults to the tie or to
        ``width``; ``fp8_rate`` to none), or ``None`` if it is not in the space."""
        if width_vc is None:
            width_vc = depth if self.spec.width_vc == "depth" else width
        c = self.configs
        hit = np.flatnonzero(
            (c["fp8_rate"] == fp8_rate)
            & (c["num_tc"] == num_tc)
            & (c["num_vc"] == num_vc)
            & (c["width"] == width)
            & (c["depth"] == depth)
            & (c["width_vc"] == width_vc)
            & (c["glb_bytes"] == glb_bytes)
        )
        return int(hit[0]) if len(hit) else None

    def records(self) -> list[dict[str, Any]]:
        """The candidates as plain dicts (field names of :data:`CONFIG_DTYPE`)."""
        names = CONFIG_DTYPE.names
        assert names is not None
        cols = [self.configs[n].tolist() for n in names]
        return [dict(zip(names, row)) for row in zip(*cols)]


def _configs(spec: SpaceSpec, index: tuple[np.ndarray, ...], area_um2: np.ndarray) -> np.ndarray:
    """The structured rows of the grid points at ``index`` (one array per axis of the grid)."""
    tied = isinstance(spec.width_vc, str)
    configs = np.empty(len(area_um2), dtype=CONFIG_DTYPE)
    configs["num_tc"] = np.asarray(spec.num_tc, dtype=np.int64)[index[0]]
    configs["num_vc"] = np.asarray(spec.num_vc, dtype=np.int64)[index[1]]
    configs["width"] = np.asarray(spec.width, dtype=np.int64)[index[2]]
    configs["depth"] = np.asarray(spec.depth, dtype=np.int64)[index[3]]
    configs["width_vc"] = configs[spec.width_vc] if tied else np.asarray(spec.width_vc, dtype=np.int64)[index[4]]
    configs["glb_bytes"] = np.asarray(spec.glb_bytes, dtype=np.int64)[index[-2]]
    configs["fp8_rate"] = np.asarray(spec.fp8_rate, dtype=np.int64)[index[-1]]
    configs["tc_buffer_bytes"] = area_model.tc_buffer_bytes(configs["width"], configs["depth"])
    configs["vc_buffer_bytes"] = area_model.vc_buffer_bytes(configs["width_vc"])
    configs["area_um2"] = area_um2
    return configs


def _chip(row: np.void) -> str:
    """A candidate as its name says it (without the space's name and the HBM)."""
    fp8 = int(row["fp8_rate"])
    return (
        f"tc{int(row['num_tc'])}x{int(row['width'])}x{int(row['depth'])}" + (f"-fp8x{fp8}" if fp8 else "") + "-vc"
        f"{int(row['num_vc'])}x{int(row['width_vc'])}-glb{_fmt_size(int(row['glb_bytes']))}"
    )


def _check_peaks(spec: SpaceSpec, configs: np.ndarray, src: str, paths: dict[str, str] | None) -> None:
    """The kept chips' peak FLOP/s within :data:`FLOPS`, as a hardware file's are (each axis
    alone is within its bound, the product need not be).  Checked on the chips the area rule
    keeps, not on the grid's corner: a wide grid whose largest corner is over budget is fine."""
    p = {axis: axis for axis in AXES} | (paths or {})
    clock = spec.template.clock_hz
    peaks = (
        (("num_tc", "width", "depth"), "2*num_tc*width*depth*clock_hz", 2.0 * clock),
        (("num_vc", "width_vc"), "num_vc*width_vc*clock_hz", clock),
    )
    for axes, formula, scale in peaks:
        flops = scale * np.prod([configs[a].astype(np.float64) for a in axes], axis=0)
        i = int(np.argmax(flops))
        if flops[i] > FLOPS.value:
            chip = ", ".join(f"{p[a]} = {int(configs[i][a])}" for a in axes)
            raise ArchSpaceError(
                f"{chip}: peak {formula} = {flops[i]:.3g} FLOP/s (the template's clock_hz = {clock:g}): "
                f"expected at most {FLOPS.text()} FLOP/s ({FLOPS.why})",
                source=src,
                key_path=p[axes[0]],
            )


def _on_the_wafer(spec: SpaceSpec, configs: np.ndarray, src: str) -> np.ndarray:
    """The candidates whose die fits the wafer of the template's ``[manufacturing]`` table (all
    of them when it has none).

    A die the wafer cannot hold is a chip that cannot be made, nor priced (its count of dies per
    wafer is below 1 or negative: a negative price would rank it first under perf-per-dollar,
    and the winner's plan could not be costed).  Such chips are left out, as the area rule
    leaves out those over the budget, and the rest is searched: a space is a grid written wide
    on purpose (ranges of powers of two), so a corner of it beyond the wafer is expected, not a
    mistake to refuse the whole space for.  But the budget let them in, so the user is told,
    once, how many and from what area on.  Only a space with no chip left is refused."""
    mf = spec.template.manufacturing
    if mf is None:
        return configs
    area_mm2 = configs["area_um2"] / 1e6
    fits = die_fits(mf, area_mm2)
    if fits.all():
        return configs
    if not fits.any():
        i = int(np.argmin(area_mm2))
        raise ArchSpaceError(
            f"no candidate can be made, each too large for the wafer: the smallest within the area rule, "
            f"{_chip(configs[i])}: {unfit_die(mf, float(area_mm2[i]))}",
            source=src,
        )
    out = ~fits
    i = int(np.argmin(np.where(out, area_mm2, np.inf)))
    warnings.warn(
        PhazeWarning(
            f"{src}: {int(out.sum()):,} of {len(configs):,} candidates within the area rule are left out, "
            f"too large for the wafer: the smallest, {_chip(configs[i])}: {unfit_die(mf, float(area_mm2[i]))}"
        ),
        stacklevel=3,
    )
    return configs[fits]


def _fmt_size(nbytes: int) -> str:
    if nbytes % GiB == 0:
        return f"{nbytes // GiB}GiB"
    if nbytes % MiB == 0:
        return f"{nbytes // MiB}MiB"
    return f"{nbytes}B"


def _check_domain(spec: SpaceSpec, src: str, paths: dict[str, str] | None = None) -> None:
    """Every value must be inside the area model's tables; say which axis value is not."""
    p = {"width": "width", "depth": "depth", "width_vc": "width_vc", "glb_bytes": "glb_bytes"}
    p.update(paths or {})
    sram = ", ".join(area_model._fmt_bytes(k) for k in area_model.SRAM_AREA_UM2)
    for g in spec.glb_bytes:
        if g not in area_model.GLB_AREA_UM2:
            sizes = ", ".join(area_model._fmt_bytes(k) for k in area_model.GLB_AREA_UM2)
            shown = _in_unit(g, MiB) if p["glb_bytes"].endswith("MiB") else str(g)
            raise ArchSpaceError(
                f"{p['glb_bytes']} = {shown}: expected a global buffer the area model lists ({sizes})",
                source=src,
                key_path=p["glb_bytes"],
            )
    for w in spec.width:
        for d in spec.depth:
            buf = area_model.tc_buffer_bytes(w, d)
            if buf not in area_model.SRAM_AREA_UM2:
                raise ArchSpaceError(
                    f"{p['width']} = {w} with {p['depth']} = {d}: a {w} x {d} PE array has a "
                    f"{area_model._fmt_bytes(buf)} per-core buffer (16 B per PE), outside the area "
                    f"model's table ({sram})",
                    source=src,
                    key_path=p["width"],
                )
    vc_axis = p[spec.width_vc] if isinstance(spec.width_vc, str) else p["width_vc"]
    vc_values = getattr(spec, spec.width_vc) if isinstance(spec.width_vc, str) else spec.width_vc
    for wv in vc_values:
        buf = area_model.vc_buffer_bytes(wv)
        if buf not in area_model.SRAM_AREA_UM2:
            raise ArchSpaceError(
                f"{vc_axis} = {wv}: a {wv}-lane vector core has a {area_model._fmt_bytes(buf)} "
                f"per-core buffer (16 B per lane), outside the area model's table ({sram})",
                source=src,
                key_path=vc_axis,
            )


# --------------------------------------------------------------------------------------------
# The paper's space
# --------------------------------------------------------------------------------------------


def _pow2_desc(lo: int, hi: int) -> tuple[int, ...]:
    out = []
    v = hi
    while v >= lo:
        out.append(v)
        v //= 2
    return tuple(out)


def paper_spec(template: Accelerator | None = None, fp8_rate: tuple[int, ...] = (0,)) -> SpaceSpec:
    """The paper's space (see the module docstring); template and budget: the ``tpuv4`` preset;
    ``fp8_rate``: its FP8 axis (the paper's chips have none)."""
    tpu = load_hardware("tpuv4")
    budget = tpu.area_um2
    assert budget is not None
    return SpaceSpec(
        name="paper",
        template=template or tpu,
        num_tc=_pow2_desc(1, 4096),
        num_vc=_pow2_desc(1, 4096),
        width=_pow2_desc(2, 256),
        depth=_pow2_desc(2, 256),
        width_vc="width",
        glb_bytes=tuple(m * MiB for m in _pow2_desc(2, 128)),
        hbm_bytes=(32 * GiB, 64 * GiB, 80 * GiB),
        budget_um2=budget,
        lower_fraction=0.3,
        waive_lower_bound_single_core=True,
        fp8_rate=fp8_rate,
    )


def paper_space(template: Accelerator | None = None, fp8_rate: tuple[int, ...] = (0,)) -> ArchSpace:
    """The paper's 29,360 candidates (of 75,712), in the reference's order; with ``fp8_rate``
    ``(2,)`` the same grid with the FP8 datapath (fewer within the budget: larger PEs)."""
    return ArchSpace.generate(paper_spec(template, fp8_rate))


# --------------------------------------------------------------------------------------------
# Space files
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Template:
    """[template]: the hardware not searched, a description and overrides of its keys (checked
    as a hardware description once laid over it)."""

    hardware: str = _spec("hardware_ref", "a preset name, or a TOML path relative to this file")


@dataclass(frozen=True, kw_only=True)
class _Area:
    """[area]: the area rule, lower_fraction x budget <= area <= budget (exactly one of
    budget_mm2 and budget_of)."""

    budget_mm2: float | None = _spec(
        "budget_mm2", "the area budget (mm^2)", at_most=field_bound(Accelerator, "area_mm2"), default=None
    )
    budget_of: str | None = _spec(
        "budget_ref", "the area of this hardware is the budget: a preset name or a TOML path", default=None
    )
    lower_fraction: float = _spec("unit_interval", "the smallest area kept, a fraction of the budget", default=0.3)
    waive_lower_bound_single_core: bool = _spec(
        "bool", "a chip of one tensor core or one vector core is kept however small", default=True
    )


@dataclass(frozen=True, kw_only=True)
class _Search:
    """[search]: the axes.  Each an integer, a list, or {min = a, max = b} (powers of two, run
    from max down to min)."""

    num_tc: Any = _spec("axis", "tensor cores")
    num_vc: Any = _spec("axis", "vector cores")
    width: Any = _spec("axis", "PE-array width (PEs)")
    depth: Any = _spec("axis", "PE-array depth (PEs)")
    width_vc: Any = _spec("width_vc", 'vector core lanes, or "width" / "depth" to tie it to that axis')
    glb_MiB: Any = _spec("axis_MiB", "global buffer (MiB)")
    hbm_GiB: Any = _spec("axis_GiB", "HBM capacity (GiB); default the template's", default=None)
    fp8_rate: Any = _spec(
        "fp8_axis",
        "the PE arrays' FP8 datapath: 0 none, 2 FP8 GEMMs at twice the bf16 rate (phaze_ir/area_22nm.toml); default 0",
        default=None,
    )


@dataclass(frozen=True, kw_only=True)
class _Range:
    """{min = a, max = b}: the powers of two from b down to a."""

    min: int = _spec("pow2", "the smallest power of two")
    max: int = _spec("pow2", "the largest power of two")


@dataclass(frozen=True, kw_only=True)
class _SpaceFile:
    """An architecture space file (phaze/search/arch_space.py)."""

    name: str | None = _spec("space_name", "label of the space; default the file's name", default=None)
    template: _Template = _spec("open", "the hardware not searched")
    area: _Area = _spec("table", "the area rule")
    search: _Search = _spec("table", "the axes searched")


def _keys(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


_TOP_KEYS = _keys(_SpaceFile)
_AREA_KEYS = _keys(_Area)
_SEARCH_KEYS = _keys(_Search)
_RANGE_KEYS = _keys(_Range)
_SPACE_TABLES: dict[str, type] = {"template": _Template, "area": _Area, "search": _Search}
#: The space file's key of each axis, for the messages.
_FILE_PATHS = {axis: f"search.{axis}" for axis in AXES} | {"glb_bytes": "search.glb_MiB", "hbm_bytes": "search.hbm_GiB"}


def _err(src: str, path: str, value: Any, expected: str) -> ArchSpaceError:
    return ArchSpaceError(f"{path} = {_show(value)}: expected {expected}", source=src, key_path=path)


def _show(value: Any) -> str:
    """A value as the message quotes it: as TOML writes it, at most an excerpt."""
    return excerpt(_render(value, EXCERPT_CHARS + 1))


def _render(value: Any, room: int) -> str:
    """``value`` as TOML writes it, stopping once more than ``room`` characters are written (a
    list of a million numbers is not rendered whole to be cut to 80 characters)."""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value[:room], ensure_ascii=False)  # escaped: a message stays one line
    if isinstance(value, (int, np.integer)):
        if int(value).bit_length() > 3.33 * EXCERPT_CHARS:  # str() of 4,300 digits raises; cut anyway
            return f"an integer of about {round(int(value).bit_length() * math.log10(2))} digits"
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    if isinstance(value, dict):
        open_, close = "{", "}"
        parts: Iterator[tuple[str, Any]] = ((f"{excerpt(str(k))} = ", v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        open_, close = "[", "]"
        parts = (("", v) for v in value)
    else:
        return repr(value)[: room + 1]
    text = open_
    for n, (head, part) in enumerate(parts):
        if len(text) > room:
            return text
        text += (", " if n else "") + head + _render(part, room - len(text))
    return text + close


def _unknown_key(key: Any, known: Sequence[str], prefix: str, src: str) -> ArchSpaceError:
    name = excerpt(str(key))
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    hint = f" (did you mean '{close[0]}'?)" if close else f" (known keys: {', '.join(known)})"
    # The quoted key, its opening quote and prefix included, is an excerpt: a key of
    # words (a quoted TOML key may hold blanks) is cut as one without them is.
    quoted = excerpt(f"'{prefix}{key}") + "'"
    return ArchSpaceError(f"unknown key {quoted}{hint}", source=src, key_path=excerpt(prefix + str(key)))


def _unknown(data: dict, known: Sequence[str], prefix: str, src: str) -> None:
    for key in data:
        if key not in known:
            raise _unknown_key(key, known, prefix, src)


def _is_pos_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _is_pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _axis(value: Any, path: str, src: str, *, unit_scale: int = 1, allow_fraction: bool = False) -> tuple[int, ...]:
    """An integer, a list, or a ``{min, max}`` power-of-two range (descending), scaled to bytes."""
    what = "a positive number" if allow_fraction else "a positive integer"

    def one(v: Any, where: str) -> int:
        ok = (
            isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 and (allow_fraction or isinstance(v, int))
        )
        if not ok:
            raise _err(src, where, v, what)
        scaled = v * unit_scale
        if scaled > I64_MAX:  # the IR keeps sizes as i64 (and inf is not a size)
            raise _err(src, where, v, f"{what} at most {I64_MAX // unit_scale} (the IR stores sizes in bytes as i64)")
        if scaled != int(scaled):
            raise _err(src, where, v, f"a whole number of bytes ({what} times {unit_scale})")
        return int(scaled)

    if isinstance(value, dict):
        _unknown(value, _RANGE_KEYS, path + ".", src)
        for k in _RANGE_KEYS:
            if k not in value:
                raise ArchSpaceError(
                    f"missing required key '{path}.{k}' (a power of two)", source=src, key_path=f"{path}.{k}"
                )
            v = value[k]
            if not _is_pos_int(v) or not _is_pow2(v):
                raise _err(src, f"{path}.{k}", v, "a power of two (ranges run over powers of two)")
        lo, hi = value["min"], value["max"]
        if lo > hi:
            raise _err(src, path, value, "min <= max")
        return tuple(one(v, path) for v in _pow2_desc(lo, hi))
    if isinstance(value, list):
        if not value:
            raise _err(src, path, value, f"a non-empty list of {what}s")
        out = tuple(one(v, f"{path}[{i}]") for i, v in enumerate(value))
        if len(set(out)) != len(out):
            raise _err(src, path, value, "distinct values")
        return out
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (one(value, path),)
    raise _err(src, path, value, f"{what}, a list of them, or a range {{min = a, max = b}}")


def _resolve(ref: str, base_dir: Path | None) -> str | Path:
    """A preset name stays a name; a path is taken relative to the space file's directory."""
    if "/" in ref or os.sep in ref or ref.endswith(".toml") or ref.startswith("."):
        p = Path(ref)
        return p if p.is_absolute() or base_dir is None else base_dir / p
    return ref


def _deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _check_name(name: Any, path: str, src: str) -> None:
    if not isinstance(name, str) or not name:
        raise _err(src, path, name, "a non-empty string")


def _check_ref(ref: Any, path: str, src: str) -> None:
    if not isinstance(ref, str) or not ref:
        raise _err(src, path, ref, "a preset name or a TOML path")


def _check_budget_ref(ref: Any, path: str, src: str) -> None:
    if not isinstance(ref, str) or not ref:
        raise _err(src, path, ref, "a preset name or a hardware TOML path")


def _check_budget_mm2(b: Any, path: str, src: str) -> None:
    if isinstance(b, bool) or not isinstance(b, (int, float)) or not b > 0 or b != b or b == float("inf"):
        raise _err(src, path, b, "a positive number")
    area_bound = _area_bound()
    if area_bound is not None and b > area_bound.value:
        raise _err(src, path, b, f"a positive number at most {area_bound.text()} ({area_bound.why})")


def _check_unit_interval(frac: Any, path: str, src: str) -> None:
    if isinstance(frac, bool) or not isinstance(frac, (int, float)) or not 0 <= frac <= 1:
        raise _err(src, path, frac, "a number in [0, 1]")


def _check_bool(waive: Any, path: str, src: str) -> None:
    if not isinstance(waive, bool):
        raise _err(src, path, waive, "true or false")


def _width_vc(wv: Any, path: str, src: str) -> tuple[int, ...] | str:
    if isinstance(wv, str):
        if wv not in _TIES:
            raise _err(src, path, wv, 'values, or "width" / "depth" to tie it to that axis')
        return wv
    return _axis(wv, path, src)


#: Each value kind of a space file: its check (raising the refusal in the file's words).
_SPACE_CHECKS: dict[str, Any] = {
    "space_name": _check_name,
    "hardware_ref": _check_ref,
    "budget_ref": _check_budget_ref,
    "budget_mm2": _check_budget_mm2,
    "unit_interval": _check_unit_interval,
    "bool": _check_bool,
    "axis": _axis,
    "axis_MiB": lambda v, path, src: _axis(v, path, src, unit_scale=MiB, allow_fraction=True),
    "axis_GiB": lambda v, path, src: _axis(v, path, src, unit_scale=GiB, allow_fraction=True),
    "width_vc": _width_vc,
    "fp8_axis": lambda v, path, src: _fp8_rates(v, path, src),
}

#: What a missing key of each kind should be, as its refusal says.
_MISSING = {
    "hardware_ref": "a preset name or a TOML path",
    "axis": "an integer, a list, or {min = a, max = b}",
    "axis_MiB": "an integer, a list, or {min = a, max = b}",
    "width_vc": "an integer, a list, or {min = a, max = b}",
}


def _space_kind_schema(f: dataclasses.Field) -> Any:
    """The core schema of a space file's value (what its check in :data:`_SPACE_CHECKS` takes;
    those check what a schema does not say: powers of two, distinct values, whole bytes)."""
    from pydantic_core import core_schema as cs

    from phaze_ir.schema import number

    kind = f.metadata["kind"]
    text = cs.str_schema(strict=True, min_length=1)
    if kind in ("space_name", "hardware_ref", "budget_ref"):
        return text
    if kind == "budget_mm2":
        bound = f.metadata["at_most"]
        return number(gt=0, le=None if bound is None else bound.value)
    if kind == "unit_interval":
        return number(ge=0, le=1)
    if kind == "bool":
        return cs.bool_schema(strict=True)
    if kind == "fp8_axis":
        rate = cs.literal_schema([0, area_model.FP8_RATE])
        return cs.union_schema([rate, cs.list_schema(rate, min_length=1)])
    one = cs.int_schema(strict=True, gt=0) if kind in ("axis", "width_vc") else number(gt=0)
    pow2 = cs.int_schema(strict=True, gt=0, metadata={"pydantic_js_updates": {"description": "a power of two"}})
    range_ = cs.typed_dict_schema(
        {k: cs.typed_dict_field(pow2) for k in _RANGE_KEYS},
        extra_behavior="forbid",
        metadata={"pydantic_js_updates": {"description": _Range.__doc__}},
    )
    axis = cs.union_schema([one, cs.list_schema(one, min_length=1), range_])
    if kind == "width_vc":
        return cs.union_schema([cs.literal_schema(list(_TIES)), axis])
    return axis


def _space_nested(f: dataclasses.Field) -> tuple[str, type] | None:
    kind = f.metadata["kind"]
    return (kind, _SPACE_TABLES[f.name]) if kind in ("table", "open") else None


def _word_missing(f: dataclasses.Field, path: str, src: str) -> ArchSpaceError:
    if f.metadata["kind"] in ("table", "open"):
        return ArchSpaceError(f"missing required table [{path}]", source=src, key_path=path)
    return ArchSpaceError(f"missing required key '{path}' ({_MISSING[f.metadata['kind']]})", source=src, key_path=path)


def _word_not_table(cls: type | None, path: str, value: Any, src: str) -> ArchSpaceError:
    if cls is None:
        return ArchSpaceError(f"space = {_show(value)}: expected a table", source=src)
    return _err(src, path, value, "a table")


def _word_value(f: dataclasses.Field, path: str, value: Any, src: str) -> ArchSpaceError | None:
    try:
        _SPACE_CHECKS[f.metadata["kind"]](value, path, src)
    except ArchSpaceError as exc:
        return exc
    return None


_SCHEMA: Any = None


def schema() -> Any:
    """The space file's :class:`phaze_ir.schema.Schema` (built once): what
    :func:`spec_from_dict` validates a file with, and the JSON Schema for editors
    (``python -m phaze.search.arch_space --json-schema``, ``docs/schema/space.schema.json``)."""
    global _SCHEMA
    if _SCHEMA is None:
        from phaze_ir.schema import Schema, Wording

        _SCHEMA = Schema(
            _SpaceFile,
            kind_schema=_space_kind_schema,
            nested=_space_nested,
            wording=Wording(
                unknown=lambda key, cls, prefix, src: _unknown_key(key, _keys(cls), prefix, src),
                missing=_word_missing,
                not_table=_word_not_table,
                not_list=lambda f, path, value, src: _err(src, path, value, "a table"),  # (none in a space)
                value=_word_value,
            ),
            title="phaze architecture space",
            description=(
                "The accelerator architectures a search may pick (phaze/search/arch_space.py): a template "
                "chip, an area rule and the axes searched. Units are in the key names (glb_MiB, hbm_GiB, budget_mm2)."
            ),
            extend=_extend_json_schema,
        )
    return _SCHEMA


def _extend_json_schema(out: dict[str, Any]) -> None:
    """[template] takes, besides ``hardware``, any key of a hardware description, each optional
    (an override of the template's): the hardware schema's, every key made optional."""
    from pydantic.json_schema import GenerateJsonSchema

    from phaze_ir import hardware

    override = GenerateJsonSchema().generate(hardware.schema().core_schema(partial=True))
    defs = override.pop("$defs", {})
    out["$defs"] |= defs
    template = out["$defs"]["Template"]
    template["properties"] |= override["properties"]
    template["additionalProperties"] = False


def spec_from_dict(data: Any, *, source: str = "<dict>", base_dir: str | os.PathLike[str] | None = None) -> SpaceSpec:
    """Build a :class:`SpaceSpec` from the dict form of a space file (see the module docstring).
    ``base_dir`` resolves relative hardware paths (the space file's directory)."""
    src = source
    base = Path(base_dir) if base_dir is not None else None
    schema().check(data, src)  # keys, tables and types: the first refusal, in its words

    name = data.get("name", Path(source).stem if source and not source.startswith("<") else "space")
    _check_name(name, "name", src)

    # [template]: a hardware reference plus optional overrides of its keys.
    tmpl = data["template"]
    template = load_hardware(_resolve(tmpl["hardware"], base))
    overrides = {k: v for k, v in tmpl.items() if k != "hardware"}
    if overrides:
        template = Accelerator.from_dict(_deep_merge(template.to_dict(), overrides), source=src, prefix="template.")

    # [area]: the budget is a chip's area, bounded as a hardware file's area_mm2 is.
    area = data["area"]
    area_bound = _area_bound()
    if ("budget_mm2" in area) == ("budget_of" in area):
        raise ArchSpaceError(
            "[area] needs exactly one of 'budget_mm2' (a positive number) and "
            "'budget_of' (a preset name or hardware TOML path)",
            source=src,
            key_path="area",
        )
    if "budget_mm2" in area:
        budget_um2 = float(area["budget_mm2"]) * 1e6
    else:
        ref = area["budget_of"]
        hw = load_hardware(_resolve(ref, base))
        if hw.area_um2 is None:
            raise _err(
                src, "area.budget_of", ref, "hardware with an area (in the area model's domain, or with area_mm2 given)"
            )
        budget_um2 = hw.area_um2
        if area_bound is not None and budget_um2 > area_bound.value * 1e6:
            raise _err(
                src,
                "area.budget_of",
                ref,
                f"hardware of at most {area_bound.text()} mm^2 ({area_bound.why}), not {budget_um2 / 1e6:,.0f} mm^2",
            )
    frac = area.get("lower_fraction", 0.3)
    waive = area.get("waive_lower_bound_single_core", True)

    # [search]
    search = data["search"]
    axes = {k: _axis(search[k], f"search.{k}", src) for k in ("num_tc", "num_vc", "width", "depth")}
    width_vc = _width_vc(search["width_vc"], "search.width_vc", src)
    glb = _SPACE_CHECKS["axis_MiB"](search["glb_MiB"], "search.glb_MiB", src)
    hbm: tuple[int, ...] = ()
    if search.get("hbm_GiB") is not None:
        hbm = _SPACE_CHECKS["axis_GiB"](search["hbm_GiB"], "search.hbm_GiB", src)
    fp8 = (0,) if search.get("fp8_rate") is None else _fp8_rates(search["fp8_rate"], "search.fp8_rate", src)

    spec = SpaceSpec(
        template=template,
        width_vc=width_vc,
        glb_bytes=glb,
        budget_um2=budget_um2,
        lower_fraction=frac,
        waive_lower_bound_single_core=waive,
        hbm_bytes=hbm,
        name=name,
        fp8_rate=fp8,
        **axes,
    )
    _check_domain(spec, src, _FILE_PATHS)
    # Each value within the bound of the hardware field it becomes: refused here, naming the key,
    # not when the search builds the chip, after tracing the models.
    _check_bounds(spec, src, _FILE_PATHS)
    return spec


def loads_space(text: str, *, source: str = "<string>", base_dir: str | os.PathLike[str] | None = None) -> ArchSpace:
    """Parse a space from TOML text and generate it."""
    data = parse_toml(text, source, ArchSpaceError)
    return ArchSpace.generate(spec_from_dict(data, source=source, base_dir=base_dir), source=source, paths=_FILE_PATHS)


def load_space(path: str | os.PathLike[str]) -> ArchSpace:
    """Load a space file (TOML, see the module docstring) and generate its candidates."""
    p = Path(path)
    try:
        text = read_regular(p, TOML_LIMIT, "TOML file").decode("utf-8")
    except FileNotFoundError:
        raise ArchSpaceError("no such file", source=str(path)) from None
    except RefusedFile as exc:
        raise ArchSpaceError(str(exc.strerror), source=str(path)) from None
    except UnicodeDecodeError as exc:
        raise ArchSpaceError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", source=str(path)) from None
    except OSError as exc:
        raise ArchSpaceError(f"cannot read: {exc.strerror}", source=str(path)) from None
    return loads_space(text, source=str(path), base_dir=p.parent)


if __name__ == "__main__":  # python -m phaze.search.arch_space --json-schema > space.schema.json
    import argparse
    import sys

    from phaze.search import arch_space as _space  # the module's own classes, not __main__'s copies

    _parser = argparse.ArgumentParser(prog="python -m phaze.search.arch_space", description=__doc__.split("\n")[0])
    _parser.add_argument("--json-schema", action="store_true", help="write the JSON Schema of a space TOML file")
    _args = _parser.parse_args()
    if not _args.json_schema:
        _parser.error("nothing to do: give --json-schema")
    sys.stdout.write(_space.schema().json_schema_text())
