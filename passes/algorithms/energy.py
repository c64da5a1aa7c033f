"""Energy of every op on one accelerator, and the power of a training step's plan.

Pure Python (no xDSL).  An op comes in as the description the latency model prices
(:mod:`passes.algorithms.latency`: :class:`MatmulDesc`, :class:`VectorDesc`,
:class:`CollectiveDesc`, :class:`ViewDesc`) and goes out as the joules one execution spends on one
device, by where they go (:class:`OpEnergy`).  The counts are the latency model's, each times the
chip's energy per action (its ``[energy]`` table, :class:`phaze_ir.hardware.Energy`):

GEMMs (tensor cores), as the op runs split over the chip (the tiling's ``tiles`` of
``tiles_k`` passes, module docstring of :mod:`passes.algorithms.tiling`):

- **compute**: the MACs the PE arrays issue, padding included (a padded PE is clocked as any
  other): ``tiles · tiles_k · m_block · pe_x · pe_y``, times ``mac_j``;
- **core buffer**: per pass, the ``m_block × pe_y`` streamed elements of ``A`` and the
  ``pe_y × pe_x`` weights of ``B``, each written into the core's buffer on arrival and read out
  into the array (twice their bytes), times the SRAM energy per byte at the core buffer's size;
  and the ``m_block × pe_x`` fp32 partial sums, written to the accumulators and read back once
  per pass, times ``accumulator_j_per_byte`` (absent: the core buffer's SRAM energy);
- **global buffer**: the bytes the latency model counts between the global buffer and the cores
  (:func:`~passes.algorithms.latency.glb_matmul_bytes`, with the split run's broadcast of ``A``),
  times the SRAM energy per byte at the global buffer's size;
- **HBM**: the bytes the latency model counts between HBM and the global buffer
  (:func:`~passes.algorithms.latency.hbm_matmul_bytes`).

Vector ops: ``work`` lane operations times ``vector_op_j``; the bytes the latency model moves into
a core's buffer (:func:`~passes.algorithms.latency.vector_traffic`) count once at the core buffer
and once at the global buffer, those it moves from HBM at HBM.

SRAM energy per byte by size (:func:`sram_j_per_byte`): the ``sram_j_per_byte`` table of the
``[energy]`` table, linear in log2 of the capacity between its entries (an access's energy grows
with the array's wires, about with the log of its size over this range: 7.5, 8.5 and 14 pJ per
64-bit read for 8 KiB, 32 KiB and 1 MiB at 7 nm), the nearest entry outside them.

Collectives: the bytes one device sends (:func:`~passes.algorithms.network.bytes_sent`) times the
``energy_j_per_byte`` of the network level that carries them (0 when the level has none), and
the same bytes read from and written to HBM (the data sent is read, the data received written).

Views cost nothing.

Power of a plan (:func:`plan_power`): each device of a pipeline stage runs its layers'
forward and backward ``m`` times per step (``m`` micro-batches), their recomputation under the
stage's policy, and the optimizer once (over its ``1/d`` shard under ZeRO ≥ 1); the
gradients of its layers go once through the data-parallel collective.  A device's energy per
step over the step's time, plus the die's static power (``static_w_per_mm2 · area``), is its
average power; the chip's power is the busiest device's.  Network energy is counted in the
step's energy but not in the chip's power: links, switches and NICs lie outside the chip's
power budget (its TDP).  Besides the bytes it carries, the network draws its own power for the
whole step (:func:`network_power_w`: the ``power_w_per_device`` of every level the plan
reaches), because NICs, optics and switches draw about their datasheet power whether or not
bytes flow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass
from functools import lru_cache

import numpy as np

from passes.algorithms import network
from passes.algorithms.latency import (
    CONFIG_FIELDS,
    CollectiveDesc,
    MatmulDesc,
    OpDesc,
    OpTable,
    VectorDesc,
    ViewDesc,
    causal_fraction,
    chip_cfg,
    fp8_gemms,
    matmul_traffic_space,
    op_columns,
    vector_traffic_space,
)
from passes.algorithms.tiling import ACC_BYTES, ScalarTiling, Tiling
from phaze_ir.op_kinds import RecomputePolicy

__all__ = [
    "ENERGY_PARTS",
    "OpEnergy",
    "OpActions",
    "op_actions",
    "LayerEnergy",
    "StageWork",
    "PlanPower",
    "estimate_energy",
    "energy_space",
    "energy_parts",
    "ring_energy",
    "sram_j_per_byte",
    "layer_energies",
    "network_power_w",
    "chip_energies",
    "power_headroom_w",
    "clock_ratio",
    "clocked_energy",
    "clock_limited_time_s",
    "die_energy_scale",
    "chip_energy_parts",
    "power_limited_step_s",
    "lengthened_step_s",
    "plan_power",
    "power_of_plan",
    "stage_works",
]

#: Where an op's energy goes, in the order of :class:`OpEnergy`'s fields.
ENERGY_PARTS = ("compute_j", "core_buffer_j", "global_buffer_j", "hbm_j", "network_j")


@dataclass(frozen=True)
class OpEnergy:
    """Joules one execution of an op spends on one device, by where they go."""

    compute_j: float = 0.0
    core_buffer_j: float = 0.0
    global_buffer_j: float = 0.0
    hbm_j: float = 0.0
    network_j: float = 0.0

    @property
    def total_j(self) -> float:
        return self.compute_j + self.core_buffer_j + self.global_buffer_j + self.hbm_j + self.network_j

    @property
    def chip_j(self) -> float:
        """What the chip and its HBM spend (everything but the network)."""
        return self.compute_j + self.core_buffer_j + self.global_buffer_j + self.hbm_j


def sram_j_per_byte(table, capacity):
    """Energy per byte of an SRAM of ``capacity`` bytes (a number or a numpy array) from an
    ``[energy]`` ``sram_j_per_byte`` table (``((bytes, J/B), ...)``, increasing): linear in
    log2 of the capacity between entries, the nearest entry outside them."""
    sizes = np.log2(np.array([size for size, _ in table], dtype=np.float64))
    values = np.array([j for _, j in table], dtype=np.float64)
    out = np.interp(np.log2(np.asarray(capacity, dtype=np.float64)), sizes, values)
    return float(out) if np.ndim(out) == 0 else out


@dataclass(frozen=True)
class OpActions:
    """What one execution of a GEMM or vector op does on one device that costs energy: the
    counts an ``[energy]`` table's per-action energies multiply (:func:`op_actions`).  Kept apart
    so that a calibration fits those energies on the very counts phaze prices
    (``benchmarks/gpu/fit_h100_energy.py``)."""

    macs: float = 0.0  #: MACs the PE arrays issue, padding included
    vector_ops: float = 0.0  #: vector-lane operations
    core_buffer_bytes: float = 0.0  #: bytes written to and read from a core's buffer
    accumulator_bytes: float = 0.0  #: fp32 partial sums written to and read from the accumulators
    global_buffer_bytes: float = 0.0  #: bytes between the global buffer and the cores
    hbm_bytes: float = 0.0  #: bytes between HBM and the global buffer
    fp8_macs: float = 0.0  #: MACs on FP8 operands (``--dtype fp8``), padding included; not in ``macs``

    def energy(self, acc) -> OpEnergy:
        """These actions priced with ``acc``'s ``[energy]`` table."""
        e = acc.energy
        core_j = sram_j_per_byte(e.sram_j_per_byte, _core_buffer_bytes(self, acc))
        glb_j = sram_j_per_byte(e.sram_j_per_byte, acc.global_buffer.bytes)
        fp8_j = float(space_fp8_mac_j(e, np.asarray(acc.tensor_cores.fp8_rate or 0)))
        return OpEnergy(*(float(j) for j in _priced(astuple(self), e, core_j, glb_j, fp8_j)))


def _core_buffer_bytes(a: OpActions, acc) -> int:
    """The size of the core buffer ``a``'s bytes pass through: a tensor core's for a GEMM (it
    issues MACs), a vector core's otherwise."""
    return acc.tensor_cores.buffer_bytes if a.macs or a.fp8_macs else acc.vector_cores.buffer_bytes


def _gemm_actions(cols, cfg, tiling: Tiling | None = None) -> tuple:
    """The actions of a chunk of GEMMs as they run split over the chip (``[u, 1]`` columns,
    ``[1, C]`` configurations; ``tiling``: theirs, else tiled here), in :class:`OpActions`'
    field order: every pass of a tile through the array does ``m_block · pe_x · pe_y`` MACs,
    streams its A rows and B tile through the core buffer (written and read: twice) and writes
    and reads ``m_block · pe_x`` partial sums."""
    t, hbm_bytes, _, glb_split = matmul_traffic_space(cols, cfg, tiling)
    pe_x, pe_y = cfg["width"], cfg["depth"]
    passes = t.tiles * t.tiles_k
    # A causal attention kernel computes the lower triangle's blocks only, (s + 1) / 2s of them
    # (the share its time is priced at): the MACs, the core buffer's and the global buffer's
    # traffic scale with it; what it reads from HBM (Q, K, V once) does not.
    share = np.where(cols["causal"] != 0, causal_fraction(cols["m"], cols["n"], cols["k"], cols["causal"]), 1.0)
    macs = np.multiply(passes * t.m_block, pe_x * pe_y, dtype=np.float64) * share
    streamed = passes * (t.m_block * pe_y * cols["a_elem"] + pe_y * pe_x * cols["b_elem"]) * share
    partial_sums = passes * t.m_block * pe_x * ACC_BYTES * share
    fp8 = fp8_gemms(cols)
    fp8_macs = np.where(fp8, macs, 0.0)
    macs = np.where(fp8, 0.0, macs)
    return macs, 0.0, 2 * streamed, 2 * partial_sums, glb_split * share, hbm_bytes, fp8_macs


def _vector_actions(cols, cfg) -> tuple:
    """The actions of a chunk of vector ops (as :func:`_gemm_actions`): ``work`` lane
    operations, the bytes moved into a vector core's buffer counted there and at the global
    buffer, those moved from HBM at HBM."""
    core_bytes, hbm_bytes = vector_traffic_space(cols, cfg)
    return 0.0, cols["work"], core_bytes, 0.0, core_bytes, hbm_bytes, 0.0


def _priced(actions: tuple, e, core_j, glb_j, fp8_j=None) -> tuple:
    """``(compute, core buffer, global buffer, HBM)`` joules of ``actions`` (the fields of
    :class:`OpActions`, numbers or arrays) with the ``[energy]`` table ``e``, ``core_j`` and
    ``glb_j`` the SRAM energy per byte of the core buffer and of the global buffer (numbers or
    ``[1, C]`` arrays): the one pricing of :func:`estimate_energy` and :func:`energy_space`.
    ``fp8_j``: one FP8 MAC's energy on each configuration (:func:`space_fp8_mac_j`), else the
    table's."""
    macs, vector_ops, core_bytes, accumulator_bytes, glb_bytes, hbm_bytes, fp8_macs = actions
    acc_j = core_j if e.accumulator_j_per_byte is None else e.accumulator_j_per_byte
    if fp8_j is None:
        fp8_j = e.mac_j if e.fp8_mac_j is None else e.fp8_mac_j
    return (
        macs * e.mac_j + fp8_macs * fp8_j + vector_ops * e.vector_op_j,
        core_bytes * core_j + accumulator_bytes * acc_j,
        glb_bytes * glb_j,
        hbm_bytes * e.hbm_j_per_byte,
    )


def op_actions(d: MatmulDesc | VectorDesc, acc, tiling: ScalarTiling | None = None) -> OpActions:
    """The actions of one execution of ``d`` on ``acc`` (a GEMM as it runs split over the chip,
    tiled as ``tiling`` or here); needs no ``[energy]`` table.  The one-row case of what
    :func:`energy_space` prices on a space."""
    cols, cfg = op_columns(d), chip_cfg(acc)
    if isinstance(d, VectorDesc):
        actions = _vector_actions(cols, cfg)
    elif tiling is None:
        actions = _gemm_actions(cols, cfg)
    else:  # priced on the PE arrays the record was tiled for
        actions = _gemm_actions(cols, cfg | {"width": tiling.pe_x, "depth": tiling.pe_y}, tiling.as_tiling())
    return OpActions(*(float(np.asarray(a).reshape(-1)[0]) for a in actions))


def collective_energy(kind: str, nbytes: float, g: int, acc, span: int | None = None) -> OpEnergy:
    """One device's energy in a collective of ``kind`` over ``g`` devices moving ``nbytes``
    (the full tensor, as :func:`passes.algorithms.network.collective_s` takes it); ``span``:
    how many consecutive devices the group spans (``g`` for a contiguous group), which picks
    the network level that carries it."""
    sent = network.bytes_sent(kind, nbytes, g)
    level = acc.network[network.level_for(acc.network, span or g)]
    per_byte = level.energy_j_per_byte or 0.0
    return OpEnergy(network_j=sent * per_byte, hbm_j=2.0 * sent * acc.energy.hbm_j_per_byte)


def _gemm_energy(d: MatmulDesc, acc, tiling: ScalarTiling | None = None) -> OpEnergy:
    """One GEMM's energy: its actions priced, times its :func:`fitted_share`."""
    energy = op_actions(d, acc, tiling).energy(acc)
    cfg = chip_cfg(acc)
    t = None
    if tiling is not None:
        cfg = cfg | {"width": np.asarray([[tiling.pe_x]]), "depth": np.asarray([[tiling.pe_y]])}
        t = tiling.as_tiling()
    share = float(
        np.asarray(fitted_share({k: np.asarray([[v]]) for k, v in op_columns(d).items()}, cfg, acc, t)).reshape(-1)[0]
    )
    if share == 1.0:
        return energy
    return OpEnergy(*(j * share for j in astuple(energy)))


@lru_cache(maxsize=65536)
def _cached(d: OpDesc, acc) -> OpEnergy:
    if isinstance(d, MatmulDesc):
        return _gemm_energy(d, acc)
    if isinstance(d, VectorDesc):
        return op_actions(d, acc).energy(acc)
    if isinstance(d, CollectiveDesc):
        return collective_energy(d.kind, d.nbytes, d.group_size, acc)
    if isinstance(d, ViewDesc):
        return OpEnergy()
    raise TypeError(f"not an op description: {d!r}")


def estimate_energy(d: OpDesc, acc, tiling: ScalarTiling | None = None) -> OpEnergy:
    """Energy of one execution of op ``d`` on ``acc`` (which must have an ``[energy]`` table);
    a GEMM's ``tiling`` if already computed (``phaze.tile``), else tiled here.  Cached by
    (description, accelerator) when no tiling is given."""
    if acc.energy is None:
        raise ValueError(f"hardware {acc.name!r} has no [energy] table")
    if tiling is not None and isinstance(d, MatmulDesc):
        return _gemm_energy(d, acc, tiling)
    return _cached(d, acc)


def space_fp8_mac_j(e, fp8_rate: np.ndarray) -> np.ndarray:
    """One FP8 MAC's energy (J) on each configuration of a space (``fp8_rate``, ``[1, C]``): the
    template's ``fp8_mac_j`` where given, else on a chip with the FP8 datapath its MAC's
    (:func:`phaze_ir.area.fp8_mac_j`, what :meth:`ArchSpace.accelerator` writes into the
    chip's ``[energy]``), else ``mac_j``."""
    from phaze_ir import area

    if e.fp8_mac_j is not None:
        return np.full(np.shape(fp8_rate), e.fp8_mac_j)
    return np.where(fp8_rate > 0, area.fp8_mac_j(e.mac_j), e.mac_j)


def energy_space(
    table: OpTable, configs: np.ndarray, template, chunk: int = 32, split_s: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(chip_j, network_j)``, each ``[ops × configs]``: the energy of one execution of every
    op of ``table`` on every row of ``configs`` (an architecture space's structured array),
    with the ``[energy]`` table and network of ``template``, the network part apart.  Equal
    to :func:`estimate_energy` on each configuration (the same actions, priced by the same
    code); GEMMs ``chunk`` at a time.  ``split_s``: the ops' priced times (``[ops ×
    configs]``, :func:`~passes.algorithms.latency.estimate_chip`'s on a one-chip template),
    where the template's power limit lowers each op's die energy with its clock
    (:func:`die_energy_scale`, as ``phaze-estimate-energy`` does with the ops' latencies)."""
    from passes.algorithms.latency import op_overheads

    e = template.energy
    if e is None:
        raise ValueError(f"hardware {template.name!r} has no [energy] table")
    configs = np.asarray(configs)
    chip = np.zeros((len(table), configs.shape[0]))
    net = np.zeros_like(chip)
    headroom = power_headroom_w(template)
    clocked = split_s is not None and headroom is not None and e.clock_energy_exponent > 0
    overheads = op_overheads(table, template)[:, None] if clocked else None
    for rows, (compute, core, glb, hbm) in _chip_parts(table, configs, template, chunk):
        if not clocked:  # the four parts summed as OpEnergy.chip_j sums them
            chip[rows] = compute + core + glb + hbm
            continue
        assert split_s is not None and overheads is not None
        k = die_energy_scale(
            compute + core + glb + hbm, hbm, split_s[rows], overheads[rows], headroom, e.clock_energy_exponent
        )
        chip[rows] = compute * k + core * k + glb * k + hbm  # the die's parts at the op's clock
    for i in table.rows["network"]:
        d = table.descs[int(i)]
        assert isinstance(d, CollectiveDesc)  # the "network" rows are the collectives
        op = collective_energy(d.kind, d.nbytes, d.group_size, template)
        chip[i], net[i] = op.chip_j, op.network_j
    return chip, net


def _chip_parts(table: OpTable, configs: np.ndarray, template, chunk: int = 32):
    """``(rows, (compute, core, glb, hbm))``: the joules of one execution of ``table``'s GEMMs
    (``chunk`` at a time, each part times its :func:`fitted_share`) and then of its vector ops
    on every row of ``configs``, by part, at the full clock: what :func:`energy_space` and
    :func:`energy_parts` price, by the same code as :func:`estimate_energy`."""
    e = template.energy
    cfg = {f: np.ascontiguousarray(configs[f], dtype=np.int64)[None, :] for f in CONFIG_FIELDS}
    glb_j = sram_j_per_byte(e.sram_j_per_byte, cfg["glb_bytes"])
    tc_j = sram_j_per_byte(e.sram_j_per_byte, cfg["tc_buffer_bytes"])
    vc_j = sram_j_per_byte(e.sram_j_per_byte, cfg["vc_buffer_bytes"])
    fp8_j = space_fp8_mac_j(e, cfg["fp8_rate"])
    rows = table.rows["tensor"]
    for s in range(0, len(rows), chunk):
        sel = np.arange(s, min(s + chunk, len(rows)))
        cols = {f: v[sel][:, None] for f, v in table.cols["tensor"].items()}
        compute, core, glb, hbm = _priced(_gemm_actions(cols, cfg), e, tc_j, glb_j, fp8_j)
        # a calibrated template is one chip (FixedParams.of refuses it as a space's)
        # each part times the share, then summed: as _gemm_energy and OpEnergy.total_j sum them
        # (the compiled plan's energies), to the last bit
        share = fitted_share(cols, cfg, template)
        yield rows[sel], (compute * share, core * share, glb * share, hbm * share)
    rows = table.rows["vector"]
    if len(rows):
        cols = {f: v[:, None] for f, v in table.cols["vector"].items()}
        yield rows, _priced(_vector_actions(cols, cfg), e, vc_j, glb_j)


def energy_parts(table: OpTable, configs: np.ndarray, template) -> np.ndarray:
    """``[4, ops, configs]`` joules: the compute, core buffer, global buffer and HBM parts of
    one execution of each GEMM and vector op of ``table`` on every row of ``configs`` at the
    full clock (0 for collectives and views): :func:`energy_space`'s before the power limit's
    clock, which a context-parallel ring's ops need summed over its steps first
    (:func:`ring_energy`)."""
    configs = np.asarray(configs)
    out = np.zeros((4, len(table), configs.shape[0]))
    for rows, parts in _chip_parts(table, configs, template):
        for p, joules in enumerate(parts):
            out[p, rows] = joules
    return out


def ring_energy(traced, off_diagonal, c: int):
    """One op of a fused attention kernel run as a context-parallel ring of ``c`` steps: the
    diagonal step runs the op as traced (``traced`` joules), each of the other c - 1 its
    off-diagonal twin (``off_diagonal``: the unmasked GEMM over half the rows,
    ``context_parallel.off_diagonal_gemm``; the op itself where it has none), so the die and
    HBM do c steps' work (docs/design.md §6.8a).  Numbers, arrays or :class:`OpEnergy` (by
    field): one sum for ``phaze-estimate-energy`` and the search, equal to the last bit."""
    if isinstance(traced, OpEnergy):
        return OpEnergy(*(ring_energy(a, b, c) for a, b in zip(astuple(traced), astuple(off_diagonal))))
    return traced + (c - 1) * off_diagonal


def clocked_energy(e: OpEnergy, split_s: float, overhead_s: float, acc) -> OpEnergy:
    """``e``, one GEMM's or vector op's energy, at the clock ``acc``'s power limit leaves it
    (its die's parts times :func:`die_energy_scale`, HBM's kept), the op priced at ``split_s``
    with launch costs ``overhead_s``: ``phaze-estimate-energy``'s records, as
    :func:`energy_space` prices them.  ``e`` itself where the limit does not bind."""
    headroom = power_headroom_w(acc)
    gamma = acc.energy.clock_energy_exponent
    if headroom is None or gamma == 0:
        return e
    k = float(die_energy_scale(np.float64(e.chip_j), np.float64(e.hbm_j), split_s, overhead_s, headroom, gamma))
    if k == 1.0:
        return e
    return OpEnergy(e.compute_j * k, e.core_buffer_j * k, e.global_buffer_j * k, e.hbm_j, e.network_j)


def fitted_share(cols, cfg, acc, tiling: Tiling | None = None):
    """The share of its energy as priced that each of a chunk of GEMMs spends on ``acc`` (``[u,
    1]`` columns, one chip's ``[1, 1]`` configuration): at most 1, and less where its twin on the
    fitted operands (bf16: an FP8 GEMM on two-byte operands) would draw more, over its fitted
    time, than the power limit the chip's GEMM efficiency was fitted under left
    (``[calibration] fitted_power_limit_w``, else ``[energy] power_limit_w``, less the static
    power).  The fitted time of a GEMM measured at its limit already holds the clock the limit
    allowed; the energy model, fitted on a few large GEMMs, can say more than that limit allows
    of others, and the limit is the measurement.  1 on a chip without a calibration or a limit
    (docs/energy.md)."""
    e, cal = acc.energy, acc.calibration
    if cal is None or e is None or e.power_limit_w is None:
        return 1.0
    from passes.algorithms.latency import FixedParams, _matmul_space  # the fitted time, as priced

    fp8 = fp8_gemms(cols)
    twin = dict(cols)
    for elem, size in (("a_elem", "a_bytes"), ("b_elem", "b_bytes")):
        twin[elem] = np.where(fp8, 2, cols[elem])
        twin[size] = np.where(fp8, 2 * cols[size], cols[size])
    _, split, _, _ = _matmul_space(twin, cfg, FixedParams.of(acc, chip=True), tiling)
    overhead = cal.kernel_overhead_s * cols["launches"]
    if cal.host_sync_s is not None:
        overhead = overhead + cal.host_sync_s * cols["syncs"]
    seconds = split - overhead
    tc_j = sram_j_per_byte(e.sram_j_per_byte, acc.tensor_cores.buffer_bytes)
    glb_j = sram_j_per_byte(e.sram_j_per_byte, acc.global_buffer.bytes)
    joules = sum(_priced(_gemm_actions(twin, cfg, tiling), e, tc_j, glb_j))
    drawn = np.divide(
        joules, seconds, out=np.zeros(np.broadcast_shapes(np.shape(joules), np.shape(seconds))), where=seconds > 0
    )
    allowed = (cal.fitted_power_limit_w or e.power_limit_w) - acc.static_power_w
    return np.where(drawn > allowed, allowed / np.where(drawn > 0, drawn, 1.0), 1.0)


def power_headroom_w(acc) -> float | None:
    """What the chip may spend on its ops (W): its ``[energy]`` ``power_limit_w`` less its
    static power (None without a limit)."""
    e = acc.energy
    if e is None or e.power_limit_w is None:
        return None
    return e.power_limit_w - acc.static_power_w


def chip_energies(table: OpTable, acc, tiling_cols: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
    """The dynamic energy (J) the chip and its HBM spend in one execution of each op of
    ``table`` on ``acc`` (an ``[U]`` array: GEMMs and vector ops as :func:`estimate_energy`
    prices them, collectives and views 0: a collective's time is its network's).
    ``tiling_cols``: the GEMM rows' own tilings (the :class:`Tiling` fields as ``[u]``
    arrays), else tiled here.  What :func:`passes.algorithms.latency.estimate_chip` bounds
    each op's time with under a power limit."""
    return chip_energy_parts(table, acc, tiling_cols)[0]


def chip_energy_parts(
    table: OpTable, acc, tiling_cols: Mapping[str, np.ndarray] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(chip, hbm)``: :func:`chip_energies` and, of it, what HBM spends (``[U]`` arrays; the
    rest is the die's: MACs, vector lanes, core and global buffers, what a lower clock's lower
    voltage saves on, :func:`clock_ratio`)."""
    e = acc.energy
    out = np.zeros(len(table))
    hbm = np.zeros(len(table))
    cfg = chip_cfg(acc)
    rows = table.rows["tensor"]
    if len(rows):
        cols = {f: v[:, None] for f, v in table.cols["tensor"].items()}
        t = None if tiling_cols is None else Tiling(**{f: v[:, None] for f, v in tiling_cols.items()})
        tc_j = sram_j_per_byte(e.sram_j_per_byte, acc.tensor_cores.buffer_bytes)
        glb_j = sram_j_per_byte(e.sram_j_per_byte, acc.global_buffer.bytes)
        fp8_j = space_fp8_mac_j(e, cfg["fp8_rate"])
        parts = _priced(_gemm_actions(cols, cfg, t), e, tc_j, glb_j, fp8_j)
        share = fitted_share(cols, cfg, acc, t)
        joules = sum(parts) * share
        out[rows] = np.broadcast_to(joules, (len(rows), 1))[:, 0]
        hbm[rows] = np.broadcast_to(parts[3] * share, (len(rows), 1))[:, 0]
    rows = table.rows["vector"]
    if len(rows):
        cols = {f: v[:, None] for f, v in table.cols["vector"].items()}
        vc_j = sram_j_per_byte(e.sram_j_per_byte, acc.vector_cores.buffer_bytes)
        glb_j = sram_j_per_byte(e.sram_j_per_byte, acc.global_buffer.bytes)
        parts = _priced(_vector_actions(cols, cfg), e, vc_j, glb_j)
        out[rows] = np.broadcast_to(sum(parts), (len(rows), 1))[:, 0]
        hbm[rows] = np.broadcast_to(parts[3], (len(rows), 1))[:, 0]
    return out, hbm


#: Newton steps of :func:`clock_ratio` (from s = 1 on a convex increasing function: each step
#: lands above the root and at least halves the gap; 60 leave it at the float's last bits)
_NEWTON_STEPS = 60


def clock_ratio(die_j, hbm_j, seconds, headroom_w: float, gamma: float) -> np.ndarray:
    """The clock ratio ``s`` (in (0, 1]) an op runs at under the power limit: priced at
    ``seconds`` (its time at the unlimited clock, launch costs apart) and spending ``die_j`` on
    the die and ``hbm_j`` in HBM there, it draws ``(die_j + hbm_j) / seconds``; above the
    headroom ``headroom_w`` (the limit less static power) the chip lowers its clock until
    ``die_j · s^(1+gamma) + hbm_j · s = headroom_w · seconds``: the op lasts ``seconds / s`` and
    spends ``die_j · s^gamma + hbm_j`` (a lower clock runs at a lower voltage, the die's energy
    per op ~V^2: ``gamma``, ``[energy] clock_energy_exponent``; HBM's energy per byte does not
    follow the core's clock).  ``gamma = 0``: ``s = headroom_w · seconds / (die_j + hbm_j)``,
    energy per op held.  1 where the op draws at most the headroom, or has no time."""
    die_j, hbm_j, seconds = np.broadcast_arrays(*(np.asarray(x, dtype=np.float64) for x in (die_j, hbm_j, seconds)))
    budget = headroom_w * seconds
    over = (seconds > 0) & (die_j + hbm_j > budget)
    s = np.ones(die_j.shape)
    if not over.any():
        return s
    d, h, b = die_j[over], hbm_j[over], budget[over]
    x = np.ones(d.shape)
    for _ in range(_NEWTON_STEPS):  # f(x) = d x^(1+g) + h x - b: convex, increasing, f(1) > 0
        f = d * x ** (1.0 + gamma) + h * x - b
        x = x - f / ((1.0 + gamma) * d * x**gamma + h)
    s[over] = np.clip(x, np.finfo(np.float64).tiny, 1.0)
    return s


def clock_limited_time_s(chip_j, hbm_j, split_s, overhead_s, headroom_w: float, gamma: float) -> np.ndarray:
    """Each op's time under the power limit: priced at ``split_s`` (launch costs
    ``overhead_s`` included) spending ``chip_j`` (of which ``hbm_j`` in HBM), it lasts
    ``(split_s - overhead_s) / s + overhead_s`` at the :func:`clock_ratio` ``s`` its power
    allows; 0 for an op that spends nothing.  ``gamma = 0`` is the energy held per op:
    ``chip_j / headroom_w + overhead_s``, as the floor has always been written."""
    chip_j = np.asarray(chip_j, dtype=np.float64)
    if gamma == 0:
        return np.where(chip_j > 0, chip_j / headroom_w + overhead_s, 0.0)
    seconds = np.maximum(np.asarray(split_s) - overhead_s, 0.0)
    s = clock_ratio(chip_j - hbm_j, hbm_j, seconds, headroom_w, gamma)
    # an op with energy but no time of its own keeps the held-energy floor (no clock to read)
    t = np.where(seconds > 0, seconds / s + overhead_s, chip_j / headroom_w + overhead_s)
    return np.where(chip_j > 0, t, 0.0)


def die_energy_scale(chip_j, hbm_j, split_s, overhead_s, headroom_w: float | None, gamma: float):
    """What an op's die energy (its MACs', vector lanes', core and global buffers' joules) is
    multiplied by at the clock the power limit leaves it (1 where the limit does not bind,
    on a chip without a limit, or with ``gamma = 0``): the op priced at ``split_s`` (its time
    under the limit, :func:`clock_limited_time_s`; launch costs ``overhead_s``) spends at most
    the headroom over its time, ``headroom_w · (split_s − overhead_s)``, the die's part
    lowered so (``s^gamma``, :func:`clock_ratio`) and HBM's ``hbm_j`` kept.  The one rule
    ``phaze-estimate-energy``'s records and the search's :func:`energy_space` apply, so the
    plan's power, the step's floor and the search's price agree (docs/energy.md)."""
    if headroom_w is None or gamma == 0:
        return np.ones(np.shape(chip_j))
    chip_j, hbm_j = np.asarray(chip_j, dtype=np.float64), np.asarray(hbm_j, dtype=np.float64)
    cap = headroom_w * np.maximum(np.asarray(split_s) - overhead_s, 0.0)
    die = chip_j - hbm_j
    over = (chip_j > cap) & (die > 0)
    scale = np.divide(cap - hbm_j, die, out=np.ones(np.broadcast_shapes(chip_j.shape, cap.shape)), where=over)
    return np.where(over, np.clip(scale, 0.0, 1.0), 1.0)


@dataclass(frozen=True)
class LayerEnergy:
    """Joules of one layer on one device: its ops of each phase (``fwd_j`` and ``bwd_j`` per
    micro-batch, ``opt_j`` per step), what recomputing it spends per micro-batch under each
    policy (``selective_j``: the attention core again; ``full_j``: the whole forward again),
    and ``network_j``, the network part of ``fwd_j + bwd_j``."""

    index: int
    fwd_j: float = 0.0
    bwd_j: float = 0.0
    opt_j: float = 0.0
    selective_j: float = 0.0
    full_j: float = 0.0
    network_j: float = 0.0


def layer_energies(
    layer_of: Sequence[int],
    phase_of: Sequence[str],
    energies: Sequence[OpEnergy],
    selective_ops: Mapping[int, Sequence[int]],
) -> list[LayerEnergy]:
    """Per-layer sums of the ops' ``energies`` (op ``i`` in layer ``layer_of[i]``, phase
    ``phase_of[i]``: ``fwd``, ``bwd`` or ``opt``); ``selective_ops[layer]``: the op indices a
    selective recompute runs again.  Layers in index order."""
    sums: dict[int, dict[str, float]] = {}
    for layer, phase, e in zip(layer_of, phase_of, energies, strict=True):
        per = sums.setdefault(layer, {"fwd": 0.0, "bwd": 0.0, "opt": 0.0, "network": 0.0})
        per[phase] += e.total_j
        if phase != "opt":
            per["network"] += e.network_j
    out = []
    for layer in sorted(sums):
        per = sums[layer]
        selective = float(sum(energies[i].total_j for i in selective_ops.get(layer, ())))
        out.append(LayerEnergy(layer, per["fwd"], per["bwd"], per["opt"], selective, per["fwd"], per["network"]))
    return out


@dataclass(frozen=True)
class StageWork:
    """What one device of a pipeline stage (one rank's model chunk) runs per step: its
    ``layers`` (indices), ``recompute`` policy (``none``, ``selective`` or ``full``), and its
    data-parallel gradient collective's energy (``dp``)."""

    rank: int
    layers: tuple[int, ...]
    recompute: str
    dp: OpEnergy = OpEnergy()


def stage_works(
    stages: Sequence[Mapping],
    grad_bytes: Mapping[int, int],
    *,
    dp: int,
    tp: int,
    pp: int,
    zero: int,
    rank_order: str,
    acc,
) -> list[StageWork]:
    """The :class:`StageWork` of each of a plan's ``stages`` (records with ``rank``,
    ``first_layer``, ``last_layer``, ``recompute``): its layers, policy, and the energy of its
    gradients' data-parallel collective on ``acc``: an all-reduce of the layers' ``grad_bytes``
    over the ``dp`` devices a stride of ``tp`` (``rank_order`` ``tp-dp-pp``) or ``tp · pp``
    (``tp-pp-dp``) apart, as the placement DP numbers them (docs/design.md §5.5), carried by
    the level that holds their span.  ZeRO 1-2's
    reduce-scatter and all-gather move the same bytes; ZeRO-3 gathers the parameters again for
    the backward: half as much more."""
    stride = {"tp-dp-pp": tp, "tp-pp-dp": tp * pp}[rank_order]
    out = []
    for s in stages:
        ids = tuple(range(int(s["first_layer"]), int(s["last_layer"]) + 1))
        moved = sum(grad_bytes.get(i, 0) for i in ids) * (1.5 if zero == 3 else 1.0)
        dp_energy = collective_energy("all_reduce", moved, dp, acc, dp * stride)
        out.append(StageWork(int(s["rank"]), ids, str(s["recompute"]), dp_energy))
    return out


@dataclass(frozen=True)
class PlanPower:
    """Energy and power of one training step under a plan (all in SI units).

    ``step_energy_j``: every device's energy over the step, static included;
    ``chip_power_w``: the busiest device's average power over the step (chip and HBM, static
    included, network excluded); ``mean_chip_power_w``: the devices' mean; ``static_power_w``:
    one die's static power; ``network_energy_j``: the step's network share of
    ``step_energy_j``."""

    step_energy_j: float
    chip_power_w: float
    mean_chip_power_w: float
    static_power_w: float
    network_energy_j: float


def network_power_w(levels: Sequence, devices: int) -> float:
    """What the network draws per device for a plan of ``devices`` devices (W): the
    ``power_w_per_device`` of every level the plan reaches, the innermost when it has more
    than one device, each level above when it has more devices than one group of the level
    below (a plan inside one node pays no NIC or InfiniBand switch)."""
    total = 0.0
    below = 1
    for level in levels:
        if devices <= below:
            break
        total += level.power_w_per_device or 0.0
        below = level.group_size
    return total


def plan_power(
    layers: Mapping[int, LayerEnergy],
    stages: Sequence[StageWork],
    *,
    devices_per_stage: int,
    micro_batches: int,
    zero_shards: int,
    step_s: float,
    static_w: float,
    network_w: float = 0.0,
) -> PlanPower:
    """The plan's :class:`PlanPower`.  ``stages``: one entry per model chunk (a rank with
    ``v`` chunks has ``v`` entries; they add up per rank); ``devices_per_stage``: devices of one
    rank (TP × DP); ``micro_batches``: m; ``zero_shards``: what the optimizer step is divided by
    (d under ZeRO ≥ 1, else 1); ``step_s``: the step's time; ``static_w``: one die's static
    power; ``network_w``: the network's own power per device (:func:`network_power_w`).  The
    network energy of the layers, of the stages' ``dp`` collectives and the network's own
    power over the step are kept out of the chip's power."""
    if step_s <= 0:
        raise ValueError(f"step time {step_s} s: expected a positive time")
    chip: dict[int, float] = {}
    net: dict[int, float] = {}
    for s in stages:
        recompute = 0.0
        work = 0.0
        opt = 0.0
        links = s.dp.network_j
        for i in s.layers:
            le = layers.get(i)
            if le is None:
                continue
            work += le.fwd_j + le.bwd_j
            opt += le.opt_j
            recompute += {
                RecomputePolicy.NONE: 0.0,
                RecomputePolicy.SELECTIVE: le.selective_j,
                RecomputePolicy.FULL: le.full_j,
            }[RecomputePolicy(s.recompute)]
            links += micro_batches * le.network_j
        total = micro_batches * (work + recompute) + opt / zero_shards + s.dp.total_j
        chip[s.rank] = chip.get(s.rank, 0.0) + total - links
        net[s.rank] = net.get(s.rank, 0.0) + links
    powers = [chip[r] / step_s + static_w for r in chip]
    devices = devices_per_stage * len(chip)
    network_j = devices_per_stage * sum(net.values()) + devices * network_w * step_s
    step_j = devices_per_stage * sum(chip.values()) + network_j + devices * static_w * step_s
    return PlanPower(
        step_energy_j=step_j,
        chip_power_w=max(powers),
        mean_chip_power_w=sum(powers) / len(powers),
        static_power_w=static_w,
        network_energy_j=network_j,
    )


def power_limited_step_s(power: PlanPower, step_s: float, headroom_w: float | None) -> float:
    """The step's time under the chip's power limit: at least the busiest device's dynamic
    energy (``power``'s, over ``step_s``) over ``headroom_w``, the limit less the static power
    (:func:`power_headroom_w`; None: no limit, ``step_s``).  A chip holds its limit by
    lowering its clock, so a step whose ops together draw more (work beside work: collectives
    overlapping compute, ops side by side) lasts as long as its energy allows."""
    if headroom_w is None:
        return step_s
    dynamic_j = (power.chip_power_w - power.static_power_w) * step_s
    return max(step_s, dynamic_j / headroom_w)


def lengthened_step_s(step_s: float, added_s: float) -> float:
    """The step's time as every reader gives it: the placement's ``step_s`` plus ``added_s``,
    what the power limit adds (``phaze.power``'s ``power_limit_s``, which the plan keeps
    instead of the lengthened time).  One sum for the search's price and a compiled plan's
    (:func:`phaze.plan.plan_output.plan_record`): ``step + (limited - step)`` is not always
    ``limited`` in floating point, and the two must agree to the last bit."""
    return step_s + added_s


def power_of_plan(
    plan: Mapping,
    stages: Sequence[Mapping],
    layers: Mapping[int, LayerEnergy],
    grad_bytes: Mapping[int, int],
    acc,
    static_w: float,
) -> PlanPower:
    """:func:`plan_power` of a placement ``plan`` (a record with ``dp``, ``pp``, ``tp``,
    ``zero``, ``rank_order``, ``num_micro_batches``, ``time_per_batch_s``) and its ``stages`` records, on
    ``acc``: each stage's work from :func:`stage_works`, the optimizer divided over the DP
    group under ZeRO >= 1."""
    dp, pp, tp, zero = (int(plan[k]) for k in ("dp", "pp", "tp", "zero"))
    works = stage_works(stages, grad_bytes, dp=dp, tp=tp, pp=pp, zero=zero, rank_order=str(plan["rank_order"]), acc=acc)
    return plan_power(
        layers,
        works,
        devices_per_stage=dp * tp,
        micro_batches=int(plan["num_micro_batches"]),
        zero_shards=dp if zero >= 1 else 1,
        step_s=float(plan["time_per_batch_s"]),
        static_w=static_w,
        network_w=network_power_w(acc.network, dp * pp * tp),
    )
