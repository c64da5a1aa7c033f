"""A *setting* of the search: one model traced at one micro-batch size and sharded for one TP
width, reduced to the plain data that pricing it on any architecture needs.

The IR pipeline runs once per setting, up to ``phaze-shard-tensor-parallel``; what follows it in
``phazec --hw`` (tiling, latency, scheduling, recompute, placement) depends on the accelerator
and is redone here over many candidates without the IR:

- the op table (unique op descriptions) that :func:`~passes.algorithms.latency.estimate_space`
  prices on every candidate at once;
- the scheduling *groups*: each layer's forward, backward and optimizer ops, and the attention
  cores that selective recompute re-runs, as rows of that table plus their edges, deduplicated
  (a transformer's blocks share theirs);
- per layer, what the placement DP needs that no accelerator changes (memory, boundary bytes,
  experts: :func:`~passes.algorithms.priced_step.static_numbers`, as ``phaze-place-devices``
  reads them), which :meth:`Setting.priced_step` turns into the DP's one input on a chip;
- for the ``--hw`` sweep, what the passes after the latencies change: under context
  parallelism the fused attention kernels (rings of c steps), under TP overlap the collectives
  overlapped with their GEMMs.

A :class:`Tristate` is picklable (no xDSL objects), so worker processes and Ray can price it.
The search's on-disk cache keeps it per (model, micro-batch, TP) as plain JSON, never as a
pickle (:meth:`Setting.to_json`; :meth:`Setting.from_json` checks what it reads).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import astuple, dataclass, field, replace
from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np

from passes.algorithms import schedule as sched
from passes.algorithms.context_parallel import (
    RingPasses,
    RingTensors,
    backward_passes,
    backward_ring,
    forward_passes,
    forward_ring,
    ring_s,
    ring_step_s,
)
from passes.algorithms.expert_gemms import ExpertTimes
from passes.algorithms.latency import DescRows, OpTable, desc_from_json, desc_to_json
from passes.algorithms.option_values import Runtime, Tristate
from passes.algorithms.placement import LayerNumbers, block_range
from passes.algorithms.priced_step import PricedStep, static_numbers, timed
from passes.algorithms.tp_overlap import (
    FUSED_MATMUL_REDUCE_SCATTER,
    METHODS,
    MICRO_PIPELINED,
    added_s,
    micro_pipelined_added_s,
)
from passes.cache_file import is_int, is_number
from phaze_ir import keys

if TYPE_CHECKING:
    from phaze_ir.hardware import NetworkLevel


@dataclass(frozen=True)
class Group:
    """One scheduling problem's shape: its ops as rows of the setting's op table (``rows[i]``
    for the ``i``-th op of the group, in program order) and the edges between them; under
    context parallelism, ``ring``: ``(i, k)`` for each of its ops that is one of fused
    attention kernel ``k``'s (:attr:`Setting.kernels`), which runs as a ring of c steps."""

    rows: tuple[int, ...]
    edges: tuple[tuple[int, int], ...]
    ring: tuple[tuple[int, int], ...] = ()
    #: under TP overlap, ``(i, method, gemms)`` for each of its TP all-gathers and
    #: reduce-scatters in program order: its op, Transformer Engine's method for it and its
    #: GEMMs' ops (``passes.overlap_tensor_parallel.overlapped``)
    overlap: tuple[tuple[int, str, tuple[int, ...]], ...] = ()
    #: under TP overlap, in the attention cores that selective recompute re-runs, ``(i, g, j)``
    #: for each overlapped TP collective among them: it takes what it adds as op ``j`` of group
    #: ``g`` (its layer's forward, whose GEMMs it overlaps), as ``phaze-insert-recompute``
    #: schedules the re-run ops with the latencies ``phaze-estimate-latency`` wrote on them
    borrowed: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True)
class AttentionKernel:
    """A fused attention kernel of a context-parallel setting's step, as
    ``phaze-context-parallel`` prices it: its ops as rows of the op table (program order), its
    layer's forward attention's tensors (``tensors``: the keys and values one hop of its ring
    carries forward, and what the ring's memory-bound passes move), and whether it is a backward
    kernel (whose hops carry twice the keys and values)."""

    rows: tuple[int, ...]
    tensors: RingTensors
    backward: bool
    #: (row of the off-diagonal twin, row of the traced GEMM) of each causal attention GEMM:
    #: an off-diagonal step of the ring runs the twin (``context_parallel.off_diagonal_gemm``)
    twins: tuple[tuple[int, int], ...] = ()
    #: the row of each of the ring's memory-bound passes (in the order of ``RingPasses.descs``)
    pass_rows: tuple[int, ...] = ()

    @property
    def kv_bytes(self) -> int:
        """The bytes of the keys and values one forward hop of its ring carries."""
        return self.tensors.kv

    def passes(self, c: int) -> RingPasses:
        """The memory-bound passes of its ring of ``c`` steps (``context_parallel``)."""
        make = backward_passes if self.backward else forward_passes
        return make(self.tensors, c)


@dataclass
class LayerRef:
    """One layer: the groups of its forward, backward, optimizer ops and of its selective
    recompute (-1 when it has none), and what the DP needs of it that no accelerator changes
    (``numbers``, its times left at 0: :meth:`Setting.priced_step` fills them in); ``cast``:
    the group of its forward's FP8 weight casts alone (``schedule.cast_groups``; -1 without)."""

    fwd: int
    bwd: int
    opt: int
    selective: int
    numbers: LayerNumbers
    cast: int = -1
    #: an MoE layer's expert GEMMs at each EP degree e > 1 (``passes/algorithms/expert_gemms.py``):
    #: ``(e, fwd, bwd, selective)``, each the index of a :attr:`Setting.expert_sums` entry (-1:
    #: none), the change in its forward, backward and selective recompute from the traced shape
    experts: tuple[tuple[int, int, int, int], ...] = ()


@dataclass
class Setting:
    """A model at micro-batch ``micro_batch`` and TP width ``tp``, sharded with Megatron's
    sequence parallelism when ``sequence_parallel`` (see the module docstring); ``blocks``:
    (first layer, count) of its repeated blocks, which an interleaved schedule splits over its
    chunks (None: none)."""

    model: str
    micro_batch: int
    tp: int
    table: OpTable
    groups: list[Group]
    layers: list[LayerRef]
    prepare_s: float = 0.0
    sequence_parallel: bool = False
    blocks: tuple[int, int] | None = None
    #: the runtime frees the gradients after each step (``placement.GRADS_FREED_RUNTIMES``)
    grads_freed: bool = False
    #: the bytes of one gradient element (``passes.place_devices.grad_element_bytes``: 4 under
    #: autocast), which the DP's gradient collectives rescale to the options' reduce dtype
    grad_element_bytes: int = 2
    #: the context-parallel degree c: the step traced at S/c tokens a sample, its fused
    #: attention kernels (``kernels``, referred to by the groups' ``ring``) rings of c steps
    cp: int = 1
    kernels: tuple[AttentionKernel, ...] = ()
    #: the TP collectives overlapped with their GEMMs (``phaze-overlap-tensor-parallel``, as
    #: ``--tp-overlap`` runs it at this point), those of the groups' ``overlap``
    tp_overlap: bool = False
    #: the overlapped GEMMs run without the communication's SMs (Transformer Engine's methods;
    #: not torch's micro-pipelined TP: ``passes.how_ops_run.overlap_sm_margin``)
    tp_overlap_sm_margin: bool = True
    #: what the MoE layers' expert GEMMs change at an EP degree (:attr:`LayerRef.experts`): per
    #: entry the table rows of the EP member's GEMMs and those of the traced ones, whose split
    #: latencies' sums differ by it (:meth:`expert_seconds`); after the groups' makespans in the
    #: arrays the DP's times are read from (:meth:`priced_step`)
    expert_sums: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()
    #: under torch's micro-pipelined TP (``tp_overlap`` without the SM margin), ``(gemm, chunk,
    #: partials)`` table rows for each GEMM a fused op runs: the GEMM as traced, one of its t
    #: chunks (``tp_overlap.chunk_gemm``) and the sum of its partials (``tp_overlap.partials_pass``)
    micro_pipelined_rows: tuple[tuple[int, int, int], ...] = ()
    units: tuple[str, ...] = field(init=False)
    #: :meth:`priced_step`'s distinct layers and each layer's index among them (made on first use).
    _distinct: tuple[list[LayerRef], list[int]] | None = field(init=False, default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.units = self.table.units

    def to_json(self) -> dict[str, Any]:
        """The setting as plain JSON data (:meth:`from_json` reads it back to an equal setting:
        the same descriptions, groups, layers and numbers, floats exactly)."""
        return {
            "model": self.model,
            "micro_batch": self.micro_batch,
            "tp": self.tp,
            "sequence_parallel": self.sequence_parallel,
            "blocks": list(self.blocks) if self.blocks is not None else None,
            "grads_freed": self.grads_freed,
            "grad_element_bytes": self.grad_element_bytes,
            "cp": self.cp,
            "kernels": [
                [list(k.rows), list(astuple(k.tensors)), k.backward, [list(t) for t in k.twins], list(k.pass_rows)]
                for k in self.kernels
            ],
            "tp_overlap": self.tp_overlap,
            "tp_overlap_sm_margin": self.tp_overlap_sm_margin,
            "prepare_s": self.prepare_s,
            "table": [desc_to_json(d) for d in self.table.descs],
            "groups": [
                {
                    "rows": list(g.rows),
                    "edges": [list(e) for e in g.edges],
                    "ring": [list(r) for r in g.ring],
                    "overlap": [[i, method, list(gemms)] for i, method, gemms in g.overlap],
                    "borrowed": [list(b) for b in g.borrowed],
                }
                for g in self.groups
            ],
            "layers": [
                {
                    "fwd": lr.fwd,
                    "bwd": lr.bwd,
                    "opt": lr.opt,
                    "selective": lr.selective,
                    "cast": lr.cast,
                    "numbers": lr.numbers.as_dict(),
                    "experts": [list(x) for x in lr.experts],
                }
                for lr in self.layers
            ],
            "expert_sums": [[list(now), list(traced)] for now, traced in self.expert_sums],
            "micro_pipelined_rows": [list(x) for x in self.micro_pipelined_rows],
        }

    @classmethod
    def from_json(cls, data: object) -> Setting:
        """The setting :meth:`to_json` wrote, checked: the schema (keys, types, signs) and that
        every reference points into what exists (a group's rows into the op table, its edges
        between two of its ops, a layer's groups into the groups); a ``ValueError`` saying what
        is wrong otherwise."""
        keys_ = (
            "model",
            "micro_batch",
            "tp",
            "sequence_parallel",
            "blocks",
            "grads_freed",
            "grad_element_bytes",
            "cp",
            "kernels",
            "tp_overlap",
            "tp_overlap_sm_margin",
            "prepare_s",
            "table",
            "groups",
            "layers",
            "expert_sums",
            "micro_pipelined_rows",
        )
        if isinstance(data, dict) and "expert_sums" not in data:  # written before the EP shapes
            data = {**data, "expert_sums": []}
        if isinstance(data, dict) and "micro_pipelined_rows" not in data:  # before torch's own async TP
            data = {**data, "micro_pipelined_rows": []}
        if not isinstance(data, dict) or sorted(data) != sorted(keys_):
            raise ValueError(f"a setting has the fields {', '.join(keys_)}")
        if not isinstance(data["model"], str):
            raise ValueError("the model name is not a string")
        for k in ("micro_batch", "tp", "cp"):
            if not is_int(data[k]) or data[k] < 1:
                raise ValueError(f"{k} = {data[k]!r}: expected an integer >= 1")
        for k in ("sequence_parallel", "grads_freed", "tp_overlap", "tp_overlap_sm_margin"):
            if not isinstance(data[k], bool):
                raise ValueError(f"{k} = {data[k]!r}: expected true or false")
        if data["grad_element_bytes"] not in (2, 4) or not is_int(data["grad_element_bytes"]):
            raise ValueError(f"grad_element_bytes = {data['grad_element_bytes']!r}: expected 2 or 4")
        blocks = data["blocks"]
        if blocks is not None and not (
            isinstance(blocks, list)
            and len(blocks) == 2
            and all(is_int(x) for x in blocks)
            and blocks[0] >= 0
            and blocks[1] >= 1
        ):
            raise ValueError(f"blocks = {blocks!r}: expected null or [first layer >= 0, count >= 1]")
        p = data["prepare_s"]
        if not (is_number(p) and p >= 0):
            raise ValueError(f"prepare_s = {p!r}: expected a time >= 0")
        for k in ("table", "groups", "layers"):
            if not isinstance(data[k], list):
                raise ValueError(f"{k} is not a list")
        table = OpTable([desc_from_json(d) for d in data["table"]])
        if not isinstance(data["kernels"], list):
            raise ValueError("kernels is not a list")
        kernels = tuple(_kernel_from_json(k, len(table), i) for i, k in enumerate(data["kernels"]))
        groups = [_group_from_json(g, len(table), len(kernels), i) for i, g in enumerate(data["groups"])]
        for i, g in enumerate(groups):
            for _, home, j in g.borrowed:
                if not (home < len(groups) and not groups[home].borrowed and j in {x[0] for x in groups[home].overlap}):
                    raise ValueError(f"group {i}: it borrows op {j} of group {home}, not an overlapped collective")
        sums = data["expert_sums"]
        if not (
            isinstance(sums, list)
            and all(
                isinstance(x, list)
                and len(x) == 2
                and all(isinstance(r, list) and all(is_int(y) and 0 <= y < len(table) for y in r) for r in x)
                for x in sums
            )
        ):
            raise ValueError(f"expert_sums: expected pairs of lists of rows of the {len(table)}-op table")
        chunked = data["micro_pipelined_rows"]
        if not (
            isinstance(chunked, list)
            and all(
                isinstance(x, list) and len(x) == 3 and all(is_int(y) and 0 <= y < len(table) for y in x)
                for x in chunked
            )
        ):
            raise ValueError(
                f"micro_pipelined_rows: expected [gemm, chunk, partials] rows of the {len(table)}-row table"
            )
        micro = data["tp_overlap"] and not data["tp_overlap_sm_margin"]  # torch's micro-pipelined TP
        chunk_of = {x[0] for x in chunked}
        for i, g in enumerate(groups):
            for _, method, gemms in g.overlap:
                if (method in MICRO_PIPELINED) != micro or (micro and any(g.rows[x] not in chunk_of for x in gemms)):
                    raise ValueError(
                        f"group {i}: its overlap's method {method!r} and GEMM rows do not fit "
                        f"{'torch' if micro else 'Transformer Engine'}'s TP overlap (micro_pipelined_rows)"
                    )
        layers = [_layer_from_json(lr, len(groups), i, len(sums)) for i, lr in enumerate(data["layers"])]
        if blocks is not None and blocks[0] + blocks[1] > len(layers):
            raise ValueError(f"blocks = {blocks!r}: past the {len(layers)} layers")
        return cls(
            data["model"],
            data["micro_batch"],
            data["tp"],
            table,
            groups,
            layers,
            float(p),
            data["sequence_parallel"],
            (blocks[0], blocks[1]) if blocks is not None else None,
            data["grads_freed"],
            data["grad_element_bytes"],
            data["cp"],
            kernels,
            data["tp_overlap"],
            data["tp_overlap_sm_margin"],
            tuple((tuple(now), tuple(traced)) for now, traced in sums),
            tuple((x[0], x[1], x[2]) for x in chunked),
        )

    def priced_groups(self) -> list[int]:
        """The groups whose makespans the DP reads (forward, backward, the optimizer step,
        selective recompute, FP8 weight casts), sorted."""
        return sorted({g for lr in self.layers for g in (lr.fwd, lr.bwd, lr.opt, lr.selective, lr.cast) if g >= 0})

    def expert_seconds(self, split: np.ndarray) -> np.ndarray:
        """``[sums, ...]``: each :attr:`expert_sums` entry on the table's split latencies
        ``split`` (``[rows]`` or ``[rows, configs]``): the EP member's expert GEMMs' time less
        the traced ones', each a serial sum in program order (as ``phaze-place-devices`` sums
        them, ``passes.how_ops_run.expert_gemm_times``): the exact change, no bound."""
        out = np.zeros((len(self.expert_sums), *split.shape[1:]))
        for i, (now, traced) in enumerate(self.expert_sums):
            a = b = 0.0
            for r in now:
                a = a + split[r]
            for r in traced:
                b = b + split[r]
            out[i] = a - b
        return out

    def with_experts(self, groups_s: np.ndarray, split: np.ndarray) -> np.ndarray:
        """``groups_s`` (``[groups, ...]`` makespans or their bounds) with :meth:`expert_seconds`
        after them: the arrays :meth:`priced_step` reads (``groups_s`` itself without experts)."""
        if not self.expert_sums:
            return groups_s
        return np.concatenate([groups_s, self.expert_seconds(split)])

    def group_units(self, g: int) -> tuple[str, ...]:
        return tuple(self.units[r] for r in self.groups[g].rows)

    def group_problem(
        self,
        g: int,
        one: np.ndarray,
        split: np.ndarray,
        cores: dict[str, int],
        network: Sequence[NetworkLevel] | None = None,
        sms: int | None = None,
    ) -> sched.Problem:
        """The scheduling problem of group ``g`` with the table's latencies ``one``/``split``
        (``[rows]`` seconds on one candidate): the same problem, bit for bit, as
        ``phaze-schedule-ops`` builds from the IR on that candidate (so they share cache
        entries).  Under context parallelism the ops of each fused attention kernel take the
        ring's time on the chip's ``network``, as ``phaze-context-parallel`` scales them
        (:meth:`ring_factors`), and under TP overlap each overlapped collective takes what it
        adds to its GEMMs on a chip of ``sms`` SMs, as ``phaze-overlap-tensor-parallel`` prices
        it (after the rings, as the pipeline runs the two passes); a collective that selective
        recompute re-runs takes what it adds in its layer's forward (:attr:`Group.borrowed`)."""
        grp = self.groups[g]
        a, b = self._latencies(grp, one, split, network, sms)
        for i, home, j in grp.borrowed:
            _, at_home = self._latencies(self.groups[home], one, split, network, sms)
            a[i] = b[i] = at_home[j]
        ops = [sched.Op(self.units[r], x, y) for r, x, y in zip(grp.rows, a, b)]
        return sched.Problem.make(ops, grp.edges, cores)

    def _latencies(
        self,
        grp: Group,
        one: np.ndarray,
        split: np.ndarray,
        network: Sequence[NetworkLevel] | None,
        sms: int | None,
    ) -> tuple[list[float], list[float]]:
        """The one-core and split latencies of ``grp``'s ops (:meth:`group_problem`): its rows'
        in the table, the rings' ops scaled, the overlapped collectives' what they add."""
        rows = list(grp.rows)
        a, b = one[rows].tolist(), split[rows].tolist()
        if self.cp > 1 and grp.ring:
            if network is None:
                raise ValueError("a context-parallel setting is priced on the chip's network levels")
            factors = self.ring_factors(split, network)
            for i, k in grp.ring:
                f = factors[k]
                if f is not None:
                    a[i], b[i] = a[i] * f, b[i] * f
        if self.tp_overlap and grp.overlap:
            if sms is None:
                raise ValueError("a TP-overlapped setting is priced on a chip with an SM count")
            if not self.tp_overlap_sm_margin:  # torch's micro-pipelined TP, as the pass prices it
                chunk = {g: (c, r) for g, c, r in self.micro_pipelined_rows}
                for i, method, gemms in grp.overlap:
                    whole = [grp.rows[g_] for g_ in gemms]
                    chunk_s = sum(float(split[chunk[r][0]]) for r in whole)
                    reduce_s = float(split[chunk[whole[-1]][1]]) if method == FUSED_MATMUL_REDUCE_SCATTER else 0.0
                    gemm_s = sum(b[g_] for g_ in gemms)
                    a[i] = b[i] = micro_pipelined_added_s(method, b[i], gemm_s, chunk_s, self.tp, reduce_s)
                return a, b
            budget: dict[int, float] = {}  # seconds of each GEMM not yet hiding a collective
            for i, method, gemms in grp.overlap:
                beside = 0.0
                for g_ in gemms:
                    beside += budget.setdefault(g_, b[g_])
                comm = b[i]
                added = added_s(method, comm, beside, self.tp, sms, self.tp_overlap_sm_margin)
                hidden = comm - added if added < comm else 0.0
                for g_ in gemms:  # the time it hid is no longer free beside these GEMMs
                    take = min(budget[g_], hidden)
                    budget[g_] -= take
                    hidden -= take
                a[i] = b[i] = added
        return a, b

    def ring_factors(self, split: np.ndarray, network: Sequence[NetworkLevel]) -> list[float | None]:
        """Per fused attention kernel, the factor ``phaze-context-parallel`` scales its ops'
        latencies by on a chip whose table latencies are ``split`` and whose network is
        ``network``: its ring's time over its local time (None: no local time, left as is)."""
        out: list[float | None] = []
        for k in self.kernels:
            local = sum(float(split[r]) for r in k.rows)
            if local <= 0:
                out.append(None)
                continue
            # as phaze-context-parallel: an off-diagonal step runs the twins of the causal GEMMs
            off = local + sum(float(split[t]) - float(split[r]) for t, r in k.twins)
            hop, level = ring_step_s(network, k.kv_bytes, self.cp, self.tp)
            share = network[level].collective_compute_share or 0.0
            passes = k.passes(self.cp)
            seconds = {d: float(split[r]) for d, r in zip(passes.descs(), k.pass_rows)}
            if k.backward:
                grad_hop, _ = ring_step_s(network, 2 * k.kv_bytes, self.cp, self.tp)
                steps = passes.around(backward_ring(local, off, hop, grad_hop, self.cp), seconds.__getitem__)
            else:
                steps = passes.around(forward_ring(local, off, hop, self.cp), seconds.__getitem__)
            out.append(ring_s(steps, share) / local)
        return out

    def priced_step(self, makespan: np.ndarray) -> PricedStep:
        """The step priced on one chip, given each group's makespan there (``makespan[g]``,
        seconds; after them the :meth:`expert_seconds`, :meth:`with_experts`): its layers' static
        numbers with those times (:func:`~passes.algorithms.priced_step.timed`, as
        ``phaze-place-devices`` reads them from the IR), the DP's one input.  Made once per
        distinct layer: a model's repeated blocks (the same groups, the same numbers) share one
        :class:`~passes.algorithms.placement.LayerNumbers` object, and so one dict of the DP's
        problem.  The search builds a problem per (setting, candidate) pair, tens of thousands
        of them; building every layer anew was a sixth of its main process's time."""
        if self._distinct is None:
            firsts: dict[tuple, int] = {}
            of_layer = []
            for lr in self.layers:
                same = (lr.fwd, lr.bwd, lr.opt, lr.selective, lr.cast, lr.numbers, lr.experts)
                of_layer.append(firsts.setdefault(same, len(firsts)))
            self._distinct = ([self.layers[of_layer.index(k)] for k in range(len(firsts))], of_layer)
        distinct, of_layer = self._distinct
        numbers = []
        for lr in distinct:
            fwd, bwd, opt, sel, cast = (
                float(makespan[g]) if g >= 0 else 0.0 for g in (lr.fwd, lr.bwd, lr.opt, lr.selective, lr.cast)
            )
            numbers.append(
                timed(
                    lr.numbers,
                    fwd_s=fwd,
                    bwd_s=bwd,
                    selective_s=sel,
                    full_s=fwd,
                    opt_s=opt,
                    cast_s=cast,
                    expert_gemm_s=self._expert_times(lr, makespan),
                )
            )
        return PricedStep(
            layers=[numbers[k] for k in of_layer],
            micro_batch=self.micro_batch,
            tp=self.tp,
            sequence_parallel=self.sequence_parallel,
            blocks=self.blocks,
            grads_freed=self.grads_freed,
            grad_element_bytes=self.grad_element_bytes,
            cp=self.cp,
        )

    def _expert_times(self, lr: LayerRef, makespan: np.ndarray) -> tuple[ExpertTimes, ...]:
        """The DP's ``expert_gemm_s`` of layer ``lr``: e = 1 the traced shape's (the change 0),
        each other e the change its :attr:`LayerRef.experts` entry reads after the groups'
        makespans (the DP adds it: its time at 1 is 0 here)."""
        if not lr.experts:
            return ()
        base = len(self.groups)

        def at(i: int) -> float:
            return float(makespan[base + i]) if i >= 0 else 0.0

        out = [ExpertTimes(1, 0.0, 0.0, (0.0, 0.0, 0.0))]
        for e, f, b, sel in lr.experts:
            out.append(ExpertTimes(e, at(f), at(b), (0.0, at(sel), at(f))))
        return tuple(out)


def _kernel_from_json(data: object, rows: int, i: int) -> AttentionKernel:
    if not (
        isinstance(data, list)
        and len(data) == 5
        and isinstance(data[0], list)
        and all(is_int(x) and 0 <= x < rows for x in data[0])
        and isinstance(data[1], list)
        and len(data[1]) == 4
        and all(is_int(x) and x >= 0 for x in data[1])
        and isinstance(data[2], bool)
        and isinstance(data[3], list)
        and all(isinstance(t, list) and len(t) == 2 and all(is_int(x) and 0 <= x < rows for x in t) for t in data[3])
        and isinstance(data[4], list)
        and all(is_int(x) and 0 <= x < rows for x in data[4])
    ):
        raise ValueError(
            f"attention kernel {i}: expected [rows of the {rows}-op table, the bytes >= 0 of its q, kv, out and an"
            " element, backward, twin row pairs, the rows of its ring's passes]"
        )
    return AttentionKernel(
        tuple(data[0]), RingTensors(*data[1]), data[2], tuple((t[0], t[1]) for t in data[3]), tuple(data[4])
    )


def _group_from_json(data: object, rows: int, kernels: int, i: int) -> Group:
    if not isinstance(data, dict) or sorted(data) != ["borrowed", "edges", "overlap", "ring", "rows"]:
        raise ValueError(f"group {i}: expected the fields rows, edges, ring, overlap, borrowed")
    r, e = data["rows"], data["edges"]
    if not (isinstance(r, list) and all(is_int(x) and 0 <= x < rows for x in r)):
        raise ValueError(f"group {i}: its rows are not rows of the {rows}-op table")
    n = len(r)
    if not (
        isinstance(e, list)
        and all(
            isinstance(p, list) and len(p) == 2 and all(is_int(x) and 0 <= x < n for x in p) and p[0] != p[1] for p in e
        )
    ):
        raise ValueError(f"group {i}: its edges are not pairs of two of its {n} ops")
    edges = tuple((p[0], p[1]) for p in e)
    try:
        sched.Problem.make([sched.Op("none", 0.0, 0.0)] * n, edges, {})  # raises on a cycle
    except ValueError as err:
        raise ValueError(f"group {i}: {err}") from None
    ring = data["ring"]
    if not (
        isinstance(ring, list)
        and all(
            isinstance(p, list) and len(p) == 2 and all(is_int(x) for x in p) and 0 <= p[0] < n and 0 <= p[1] < kernels
            for p in ring
        )
    ):
        raise ValueError(f"group {i}: its ring is not pairs of one of its {n} ops and one of the {kernels} kernels")
    overlap = data["overlap"]
    if not (
        isinstance(overlap, list)
        and all(
            isinstance(x, list)
            and len(x) == 3
            and is_int(x[0])
            and 0 <= x[0] < n
            and (x[1] in METHODS or x[1] in MICRO_PIPELINED)
            and isinstance(x[2], list)
            and all(is_int(y) and 0 <= y < n for y in x[2])
            for x in overlap
        )
    ):
        raise ValueError(f"group {i}: its overlap is not [one of its {n} ops, a method, its GEMMs among them]")
    borrowed = data["borrowed"]
    if not (
        isinstance(borrowed, list)
        and all(
            isinstance(x, list) and len(x) == 3 and all(is_int(y) and y >= 0 for y in x) and x[0] < n and x[1] != i
            for x in borrowed
        )
    ):
        raise ValueError(f"group {i}: its borrowed is not [one of its {n} ops, another group, an op of that group]")
    return Group(
        tuple(r),
        edges,
        tuple((p[0], p[1]) for p in ring),
        tuple((x[0], x[1], tuple(x[2])) for x in overlap),
        tuple((x[0], x[1], x[2]) for x in borrowed),
    )


def _layer_from_json(data: object, groups: int, i: int, sums: int = 0) -> LayerRef:
    names = ("fwd", "bwd", "opt", "selective", "cast", "numbers", "experts")
    if isinstance(data, dict) and "cast" not in data:  # written before the FP8 casts' groups
        data = {**data, "cast": -1}
    if isinstance(data, dict) and "experts" not in data:  # written before the EP shapes
        data = {**data, "experts": []}
    if not isinstance(data, dict) or sorted(data) != sorted(names):
        raise ValueError(f"layer {i}: expected the fields {', '.join(names)}")
    for k in names[:5]:
        if not (is_int(data[k]) and -1 <= data[k] < groups):
            raise ValueError(f"layer {i}: its {k} group {data[k]!r} is not -1 or one of the {groups} groups")
    experts = data["experts"]
    if not (
        isinstance(experts, list)
        and all(
            isinstance(x, list)
            and len(x) == 4
            and all(is_int(y) for y in x)
            and x[0] >= 2
            and all(-1 <= y < sums for y in x[1:])
            for x in experts
        )
    ):
        raise ValueError(f"layer {i}: its experts are not [an EP degree >= 2, three of the {sums} expert sums or -1]")
    try:
        numbers = LayerNumbers.from_json(data["numbers"])
    except ValueError as err:
        raise ValueError(f"layer {i}: {err}") from None
    return LayerRef(
        data["fwd"],
        data["bwd"],
        data["opt"],
        data["selective"],
        numbers,
        data["cast"],
        tuple((x[0], x[1], x[2], x[3]) for x in experts),
    )


def setting_from_module(
    module,
    model: str,
    micro_batch: int,
    tp: int,
    sequence_parallel: bool = False,
    selective: str = "attention",
    cp: int = 1,
    tp_overlap: bool = False,
) -> Setting:
    """Reduce a module sharded by ``phaze-shard-tensor-parallel`` (with sequence parallelism
    when ``sequence_parallel``) to a :class:`Tristate` (the optimizer state is read from its
    ``phaze.optimizer_update`` ops, as the pipeline does; ``selective``: what selective
    recompute re-runs, ``Options.selective_recompute``; ``cp``: the context-parallel degree
    the step, traced at S/c tokens, is priced for: its fused attention kernels become rings
    as ``phaze-context-parallel`` makes them; ``tp_overlap``: its TP collectives overlapped
    with their GEMMs, as ``phaze-overlap-tensor-parallel`` overlaps them)."""
    from passes.algorithms.recompute import parse_selective
    from passes.cost_view import op_table
    from passes.how_ops_run import micro_pipelined, overlap_sm_margin
    from passes.place_devices import frees_grads, grad_element_bytes
    from passes.recompute_view import static_costs
    from phaze_ir.errors import PhazeError

    name = "phaze-search"
    table, row_of, priced_ops, _ = op_table(module)
    row_by_op = {id(o): r for o, r in zip(priced_ops, row_of)}
    graph, ops, layer_of, recompute, memory = static_costs(module, "", name, parse_selective(selective))
    rows = [row_by_op[id(o)] for o in ops]
    layers_attr = [a.as_dict() for a in module.attributes[keys.LAYERS].data]

    groups: list[Group] = []
    index: dict[Group, int] = {}
    kernels, kernel_of = _attention_kernels(ops, rows) if cp > 1 else ((), {})
    if kernels:
        table, kernels = _with_ring_rows(table, kernels, cp)
    beside = _overlapped(module, ops) if tp_overlap else {}

    home: dict[int, tuple[int, int]] = {}  # an overlapped collective -> (its group, its op there)

    def group_of(ids: list[int], selective: bool = False) -> int:
        if not ids:
            return -1
        ring = tuple((p, kernel_of[i]) for p, i in enumerate(ids) if i in kernel_of)
        overlap, borrowed = [], []
        position = {i: p for p, i in enumerate(ids)}
        for p, i in enumerate(ids):
            if i not in beside:
                continue
            method, gemms = beside[i]
            if selective and i in home:
                # re-run in backward with the latency phaze-estimate-latency wrote on it: what it
                # adds beside its GEMMs in its own group (phaze-insert-recompute reads the ops')
                borrowed.append((p, *home[i]))
                continue
            if selective or any(g not in position for g in gemms):
                raise PhazeError(
                    "phaze-search: a TP collective overlapped with GEMMs outside its scheduling group "
                    f"(op {i}{', re-run by selective recompute' if selective else ''}): priced point by point"
                )
            overlap.append((p, method, tuple(position[g] for g in gemms)))
        g = Group(tuple(rows[i] for i in ids), sched.group_edges(graph, ids), ring, tuple(overlap), tuple(borrowed))
        if g not in index:
            index[g] = len(groups)
            groups.append(g)
        if not selective:
            for p, _, _ in g.overlap:
                home[ids[p]] = (index[g], p)
        return index[g]

    by_phase = sched.phase_groups(graph, layer_of)
    casts = sched.cast_groups(graph, by_phase)
    layers = []
    for la, rc, mem in zip(layers_attr, recompute, memory):
        k = la["index"]
        layers.append(
            LayerRef(  # its forward first: the collectives its selective recompute re-runs are there
                fwd=group_of(by_phase.get((k, "fwd"), [])),
                bwd=group_of(by_phase.get((k, "bwd"), [])),
                opt=group_of(by_phase.get((k, "opt"), [])),
                selective=group_of(rc.selective_ops, selective=True),
                numbers=static_numbers(la, mem.record(), (rc.none_bytes, rc.selective_bytes, rc.full_bytes)),
                cast=group_of(casts.get(k, [])),
            )
        )
    table, sums = _expert_rows(module, table, ops, [la["index"] for la in layers_attr], recompute, layers)
    chunked: tuple[tuple[int, int, int], ...] = ()
    if tp_overlap and micro_pipelined(module):
        table, chunked = _with_chunk_rows(table, sorted({rows[g] for _, gemms in beside.values() for g in gemms}), tp)
    blocks = block_range([str(la["kind"]) for la in layers_attr])
    grad_bytes = grad_element_bytes(module)
    return Setting(
        model,
        micro_batch,
        tp,
        table,
        groups,
        layers,
        0.0,
        sequence_parallel,
        blocks,
        frees_grads(module),
        grad_bytes,
        cp,
        kernels,
        tp_overlap,
        overlap_sm_margin(module),
        sums,
        chunked,
    )


def _expert_rows(
    module, table: OpTable, ops: list, indices: list, recompute: list, layers: list[LayerRef]
) -> tuple[OpTable, tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]]:
    """The op table with the rows of each MoE layer's expert GEMMs at every EP degree e > 1,
    at the EP member's shape (``expert_gemms.member_gemm``), appended, and the
    :attr:`Setting.expert_sums` that read them; each layer's :attr:`LayerRef.experts` set (its
    entries shared by layers alike). The expert GEMMs as ``phaze-place-devices`` finds them
    (``passes.how_ops_run.expert_gemm_ops``); those of a layer's forward that selective
    recompute re-runs (``static_costs``' selective ops) in its selective entry."""
    from passes.algorithms.expert_gemms import ep_degrees, member_gemm
    from passes.how_ops_run import expert_gemm_ops

    found = expert_gemm_ops(module)
    if not found:
        return table, ()
    rows_of = DescRows(table.descs)
    row, descs = rows_of.row, rows_of.descs
    sums: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
    sum_of: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}

    def entry(now: list[int], traced: list[int]) -> int:
        if not traced:
            return -1
        key = (tuple(now), tuple(traced))
        if key not in sum_of:
            sum_of[key] = len(sums)
            sums.append(key)
        return sum_of[key]

    index = {id(o): i for i, o in enumerate(ops)}
    for k, lr, rc in zip(indices, layers, recompute):
        if k not in found:
            continue
        experts, rows, gemms = found[k]
        selective = set(rc.selective_ops)
        parts = {
            "fwd": [d for o, d, bwd in gemms if not bwd],
            "bwd": [d for o, d, bwd in gemms if bwd],
            "sel": [d for o, d, bwd in gemms if not bwd and index.get(id(o)) in selective],
        }
        traced = {name: [row(d) for d in part] for name, part in parts.items()}
        entries = []
        for e in ep_degrees(experts)[1:]:
            at = {
                name: entry([row(member_gemm(d, e, rows)) for d in part], traced[name]) for name, part in parts.items()
            }
            entries.append((e, at["fwd"], at["bwd"], at["sel"]))
        lr.experts = tuple(entries)
    return OpTable(descs), tuple(sums)


def _overlapped(module, ops: list) -> dict[int, tuple[str, list[int]]]:
    """Each TP collective ``phaze-overlap-tensor-parallel`` overlaps, by its index in ``ops``:
    Transformer Engine's method for it (or torch's micro-pipelined TP's) and its GEMMs' indices
    (``passes.overlap_tensor_parallel.overlapped``)."""
    from passes.graph_view import step_function
    from passes.how_ops_run import micro_pipelined
    from passes.overlap_tensor_parallel import overlapped

    index = {id(o): i for i, o in enumerate(ops)}
    found = overlapped(step_function(module), micro_pipelined=micro_pipelined(module))
    return {index[id(o)]: (method, [index[id(g)] for g in gemms]) for o, method, gemms in found}


def _with_chunk_rows(table: OpTable, gemm_rows: list[int], tp: int) -> tuple[OpTable, tuple[tuple[int, int, int], ...]]:
    """``table`` with a row for one chunk of each GEMM of ``gemm_rows`` and for the sum of its
    partials, as torch's micro-pipelined TP runs them at TP width ``tp`` (``tp_overlap.chunk_gemm``,
    ``tp_overlap.partials_pass``: what ``phaze-estimate-latency`` prices its fused ops with), and
    the ``(gemm, chunk, partials)`` rows; rows no group schedules."""
    from passes.algorithms.latency import MatmulDesc
    from passes.algorithms.tp_overlap import chunk_gemm, partials_pass

    rows_of = DescRows(table.descs)
    row, descs = rows_of.row, rows_of.descs
    out = tuple(
        (r, row(chunk_gemm(d, tp)), row(partials_pass(d, tp)))
        for r, d in ((r, descs[r]) for r in gemm_rows)
        if isinstance(d, MatmulDesc)
    )
    return OpTable(descs), out


def _attention_kernels(ops: list, rows: list[int]) -> tuple[tuple[AttentionKernel, ...], dict[int, int]]:
    """The fused attention kernels of a step (``passes.context_parallel.attention_kernels``:
    the ops of one ``phaze.fused`` kernel that has a GEMM), distinct ones once, and the kernel
    of each of their ops (by index into ``ops``, whose rows of the op table are ``rows``).  A
    kernel's hops carry its layer's forward keys and values (``ring_tensors``), as the pass's do."""
    from xdsl.dialects.builtin import IntegerAttr, StringAttr

    from passes.how_ops_run import ring_tensors
    from phaze_ir import dialect as ph

    by_name: dict[str, list[int]] = {}
    for i, o in enumerate(ops):
        fused = o.attributes.get(keys.FUSED)
        if isinstance(fused, StringAttr):
            by_name.setdefault(fused.data, []).append(i)
    found = [ids for ids in by_name.values() if any(isinstance(ops[i], ph.MatmulOp) for i in ids)]

    def layer(o) -> int:
        attr = o.attributes.get(keys.LAYER)
        return attr.value.data if isinstance(attr, IntegerAttr) else -1

    def backward(ids: list[int]) -> bool:
        return keys.string_of(ops[ids[0]], keys.PHASE, "fwd") == "bwd"

    tensors_of_layer: dict[int, RingTensors] = {}
    for ids in found:
        if not backward(ids):
            tensors_of_layer.setdefault(layer(ops[ids[0]]), ring_tensors([ops[i] for i in ids]))
    kernels: dict[AttentionKernel, int] = {}
    kernel_of: dict[int, int] = {}
    for ids in found:
        tensors = tensors_of_layer.get(layer(ops[ids[0]])) or ring_tensors([ops[i] for i in ids])
        k = kernels.setdefault(AttentionKernel(tuple(rows[i] for i in ids), tensors, backward(ids)), len(kernels))
        kernel_of.update(dict.fromkeys(ids, k))
    return tuple(kernels), kernel_of


def _with_ring_rows(
    table: OpTable, kernels: tuple[AttentionKernel, ...], c: int
) -> tuple[OpTable, tuple[AttentionKernel, ...]]:
    """``table`` with a row for the off-diagonal twin of each causal attention GEMM of
    ``kernels`` (``context_parallel.off_diagonal_gemm``: what ``phaze-context-parallel`` prices
    an off-diagonal ring step with) and for each memory-bound pass of their rings of ``c`` steps
    (``AttentionKernel.passes``), and the kernels naming them; rows no group schedules."""
    from passes.algorithms.context_parallel import off_diagonal_gemm
    from passes.algorithms.latency import MatmulDesc

    rows_of = DescRows(table.descs)
    descs = rows_of.descs
    out = []
    for k in kernels:
        twins = []
        for r in k.rows:
            d = descs[r]
            twin = off_diagonal_gemm(d) if isinstance(d, MatmulDesc) else None
            if twin is not None:
                twins.append((rows_of.row(twin), r))
        pass_rows = [rows_of.row(d) for d in k.passes(c).descs()]
        out.append(replace(k, twins=tuple(twins), pass_rows=tuple(pass_rows)))
    return OpTable(descs), tuple(out)


def deepened(setting: Setting, blocks: int) -> Setting:
    """``setting`` of a model cut to its first few (at least 3) repeated blocks, for the model
    with ``blocks`` of them: the first block, the middle one ``blocks - 2`` times, the last.
    Every middle block of such a step is priced alike (the same groups, the same numbers), so
    this is the full model's setting when the model's blocks run the same code, which
    :func:`prepare_settings` checks before it relies on it."""
    if setting.blocks is None or setting.blocks[1] < 3 or blocks < 3:
        raise ValueError(f"cannot deepen a setting with blocks {setting.blocks} to {blocks}")
    first, count = setting.blocks
    layers = setting.layers
    head = [replace(lr) for lr in layers[: first + 1]]
    middle = [replace(layers[first + 1]) for _ in range(blocks - 2)]
    tail = [replace(lr) for lr in layers[first + count - 1 :]]
    return replace(setting, layers=head + middle + tail, blocks=(first, blocks))


def _same(a: Setting, b: Setting) -> bool:
    """Equal settings, apart from the time it took to prepare them."""
    return replace(a, prepare_s=0.0).to_json() == replace(b, prepare_s=0.0).to_json()


#: Blocks of the cut models traced by :func:`prepare_settings`: the first, the middle and the
#: last block are what a deepened setting is made of; one more is its check.
CUT_BLOCKS = (3, 4)


def cp_degrees(opts: Any, model_seq_len: int | None) -> list[Any]:
    """The options of each context-parallel degree the search (and the ``--hw`` sweep) prices,
    in the order that breaks ties (the smaller degree first): ``--context-parallel``'s degree,
    or under ``auto`` each of :func:`~passes.algorithms.context_parallel.auto_degrees`, each
    with its degree and, past 1, the whole sequence explicit (``model_seq_len`` when
    ``--seq-len`` is not given), which its step is traced at S/c of
    (:func:`phaze.points.context_parallel_points`, the pipeline's sweep's own).  A degree is a
    setting dimension as a TP width is: each gives its own settings (:attr:`Setting.cp`)."""
    from phaze.points import context_parallel_points

    return context_parallel_points(opts, model_seq_len)


def prepare_settings(model_path: str, micro_batch: int, tps: tuple[int, ...], opts: Any) -> list[Setting]:
    """The :class:`Tristate` of ``model_path`` at ``micro_batch`` per context-parallel degree
    (:func:`cp_degrees`) and TP width, and per width > 1 without and/or with sequence
    parallelism as ``opts.sequence_parallel`` says (``opts``: the driver's
    :class:`~phaze.options.Options`), degree by degree, the smaller first.  A point the model
    cannot be sharded for is left out (its reason is in the exception's message when none is
    left); see :func:`prepare_points`."""
    from phaze_ir.errors import PhazeError

    if opts.context_parallel == 1:
        per_degree = [opts]
    else:
        from phaze_ir.frontend import load_model_file

        per_degree = cp_degrees(opts, load_model_file(model_path).seq_len)
    settings: list[Setting] = []
    said: list[str] = []
    name = ""
    plan_traces(model_path, [(micro_batch, o) for o in per_degree], attention_of=opts)
    for o in per_degree:
        # the attention as the pipeline's sweep has it for every degree (fused under any --context-parallel but 1)
        ready, errors, name = prepare_points(model_path, micro_batch, tps, o, attention_of=opts)
        settings += ready
        cp = f" CP {o.context_parallel}" if o.context_parallel != 1 else ""
        said += [f"TP {t}{' SP' if sp else ''}{cp}: {e}" for t, sp, e in errors]
    if not settings:
        raise PhazeError(f"{name} at micro-batch {micro_batch}: " + "; ".join(said))
    return settings


def prepare_points(
    model_path: str,
    micro_batch: int,
    tps: tuple[int, ...],
    opts: Any,
    accelerator: Any = None,
    attention_of: Any = None,
) -> tuple[list[Setting], list[tuple[int, bool, str]], str]:
    """``(settings, errors, model name)``: the settings of the points the model can be sharded
    for (:func:`prepare_settings`) and ``(tp, sequence parallel, why not)`` of the others.

    A model with more than 4 repeated blocks that run the same code is traced cut to 3 and to 4
    of them and its settings :func:`deepened` from the 3-block ones, when that gives the 4-block
    ones exactly (every field, floats bit for bit) at every point (:func:`deepens_exactly`);
    otherwise it is traced whole.  Tracing and importing scale with the blocks, so GPT-3 175B's
    96 cost as 7 (design §2).  The 4-block check is made once per question in a process: a
    later micro-batch of it whose 3-block settings have the skeletons the check accepted
    (:data:`_SHOWN`, :func:`_skeleton`) is deepened from its one trace, as 3; so is a later
    context-parallel degree past 1 (one check for all of them: :func:`_question`).

    Given the ``accelerator`` (the ``--hw`` sweep's chip), the sharded steps are formed into the
    kernels of ``opts.kernels``' runtime on it (which kernel a fused attention runs depends on
    the chip), as the pipeline forms them before tiling; the search's settings (no chip) are
    formed as on a chip without a CUDA compute capability, as every space's chip is
    (:func:`phaze.search.run._read_inputs` refuses a space whose template has one)."""
    # With few young-generation collections (phaze.pipeline.few_collections), as a compilation:
    # the model file's import and the cut traces allocate as the pipeline does (the --hw sweep
    # ran them so already; the architecture search's settings did not).
    from phaze.pipeline import few_collections

    with few_collections():
        return _prepare_points(model_path, micro_batch, tps, opts, accelerator, attention_of)


def _prepare_points(
    model_path: str, micro_batch: int, tps: tuple[int, ...], opts: Any, accelerator: Any, attention_of: Any
) -> tuple[list[Setting], list[tuple[int, bool, str]], str]:
    """:func:`prepare_points`, with the collections as they are."""
    from phaze.driver import with_runtime_attention
    from phaze.options import traced_seq_len
    from phaze_ir.frontend import load_model_file, trace_model
    from phaze_ir.frontend.symbolic_trace import trace_shared
    from phaze_ir.frontend.trace import whole_sequence

    # ``attention_of``: the options the model's attention is chosen by (``driver.start_compilation``
    # chooses it once, from the question's: fused at every degree of --context-parallel auto, 1 included)
    spec = with_runtime_attention(load_model_file(model_path), attention_of or opts)
    t0 = time.perf_counter()
    # Under a context-parallel degree c (the sweep's options hold it and the whole sequence,
    # phaze.points.context_parallel_points), one device's S/c tokens a sample, as the driver traces it.
    seq_len = traced_seq_len(opts)
    whole = opts.seq_len if seq_len != opts.seq_len else None

    family = _trace_family(model_path, micro_batch, opts, attention_of)
    points = _PLANNED.pop(family, 0) if family is not None else 0
    if points > 1 and family is not None:  # the points of this family still to come
        _PLANNED[family] = points - 1

    def traced(max_blocks: int | None):
        with whole_sequence(whole):
            if max_blocks == CUT_BLOCKS[0] and family is not None:
                # one symbolic trace specialised at each point, where this process has enough of them
                shared = trace_shared(family[0], points, spec, micro_batch, seq_len, opts.dtype, max_blocks, opts.fp8)
                if shared is not None:
                    return shared
            return trace_model(
                spec, micro_batch, seq_len, training=True, dtype=opts.dtype, max_blocks=max_blocks, fp8_recipe=opts.fp8
            )

    def timed(out: tuple[list[Setting], list[tuple[int, bool, str]]]):
        for s in out[0]:
            s.prepare_s = (time.perf_counter() - t0) / len(out[0])
        return out[0], out[1], spec.name

    cut = traced(CUT_BLOCKS[0])
    if cut.blocks is None:  # nothing was cut: the whole model
        return timed(_settings_of(cut, spec.name, micro_batch, tps, opts, accelerator))
    if cut.blocks[1] > CUT_BLOCKS[1]:
        three, errors = _settings_of(cut, spec.name, micro_batch, tps, opts, accelerator)
        question = _question(model_path, opts, accelerator, attention_of)
        if three and question is not None and _shown(question, three):
            # one trace: the deepening of this question was shown exact at another micro-batch
            # in this process, and these 3-block settings have the same skeleton as that one's
            return timed(([deepened(s, cut.blocks[1]) for s in three], errors))
        four, errors4 = _settings_of(traced(CUT_BLOCKS[1]), spec.name, micro_batch, tps, opts, accelerator)
        if deepens_exactly(three, errors, four, errors4):
            if question is not None:
                _SHOWN.setdefault(question, set()).update(_skeleton(s) for s in three)
            return timed(([deepened(s, cut.blocks[1]) for s in three], errors))
    return timed(_settings_of(traced(None), spec.name, micro_batch, tps, opts, accelerator))


#: The cut traces this process is to make, per family (:func:`_trace_family`): what
#: :func:`plan_traces` was told, less those made since.
_PLANNED: dict[tuple, int] = {}


def plan_traces(model_path: str, jobs: Sequence[tuple[int, Any]], attention_of: Any = None) -> None:
    """Say that this process is to prepare the settings of ``model_path`` at each ``(micro-batch,
    options)`` of ``jobs`` (:func:`prepare_points`' ``micro_batch`` and ``opts``): where a family
    of their cut traces has :data:`~phaze_ir.frontend.symbolic_trace.MIN_POINTS` or more, its
    first point traces it once symbolically and every point is specialised from that trace
    (``phaze_ir.frontend.symbolic_trace``), byte for byte the traces it stands for; without it
    each point is traced (a symbolic trace costs about 3)."""
    for b, o in jobs:
        family = _trace_family(model_path, b, o, attention_of)
        if family is not None:
            _PLANNED[family] = _PLANNED.get(family, 0) + 1


def _trace_family(model_path: str, micro_batch: int, opts: Any, attention_of: Any) -> tuple | None:
    """The family (``symbolic_trace.family_of``) of :func:`_prepare_points`' cut trace: what
    it depends on besides the micro-batch and the tokens a sample: the model file (as
    :func:`_question` reads it), the attention the runtime runs (``driver.with_runtime_attention``
    reads these two options), the dtype and the FP8 recipe; None when the file cannot be read."""
    from phaze.options import traced_seq_len
    from phaze_ir.frontend.symbolic_trace import family_of

    model = _model_file(model_path)
    if model is None:
        return None
    chooser = attention_of or opts
    key = (model, chooser.context_parallel != 1, chooser.kernels, opts.dtype, opts.fp8)
    return family_of(key, micro_batch, traced_seq_len(opts))


def _model_file(model_path: Any) -> tuple | None:
    """The model file as a question reads it: its path, size and modification time (None: it
    cannot be read, or the model is not a file: the API's ``ModelSpec`` of a model built in
    Python)."""
    import os

    if not isinstance(model_path, (str, os.PathLike)):
        return None
    try:
        st = os.stat(model_path)
    except OSError:
        return None
    return os.path.realpath(model_path), st.st_size, st.st_mtime_ns


def deepens_exactly(
    three: list[Setting],
    errors: list[tuple[int, bool, str]],
    four: list[Setting],
    errors4: list[tuple[int, bool, str]],
) -> bool:
    """Whether the settings of the model cut to 3 blocks (``three``, and why the other points
    have none), :func:`deepened` to 4, are those of the model cut to 4 (``four``) at every
    point: every field, floats bit for bit."""
    return (
        errors == errors4
        and len(three) == len(four)
        and all(
            (a.tp, a.sequence_parallel) == (b.tp, b.sequence_parallel)
            and a.blocks is not None
            and a.blocks[1] == CUT_BLOCKS[0]
            and _same(deepened(a, CUT_BLOCKS[1]), b)
            for a, b in zip(three, four)
        )
    )


#: The deepenings :func:`_prepare_points` found exact in this process (its two cut traces
#: agreed), per question (:func:`_question`): the skeletons (:func:`_skeleton`) of the 3-block
#: settings that agreed.  Another micro-batch of the same question whose 3-block settings have
#: those skeletons is deepened from its one trace (design §2: what can differ between
#: micro-batches).  It decides only how many traces a setting takes, never what a deepened
#: setting holds; that the check it stands for would have accepted the same settings is design
#: §2.1.3's argument (tested in tests/test_setting_deepen.py), not a check made again.
_SHOWN: dict[tuple, set[str]] = {}
#: Questions :data:`_SHOWN` holds at most (the oldest forgotten first).
_SHOWN_KEPT = 64


class _CpDegrees(Enum):
    """What :func:`_question` puts for the context-parallel degree of a point past 1: every such
    degree is one question (one 4-block check), as every micro-batch is. Not a degree nor
    ``AUTO`` (nor text an option could parse into one): a key no compilation's options make."""

    PAST_ONE = "every degree > 1"


_RING_DEGREES = _CpDegrees.PAST_ONE


def _question(model_path: str, opts: Any, accelerator: Any, attention_of: Any) -> tuple | None:
    """What the settings of ``model_path`` depend on besides the micro-batch and the
    context-parallel degree past 1: the model file (its path, size and modification time), the
    options (the sequence length included; the degree only as 1 or more: a degree c > 1 traces
    S/c tokens a sample, a change of shapes as a micro-batch's, and prices the same fused
    attention kernels as rings, so every degree past 1 shares one check: design §2.1.3), the
    options its attention is chosen by and the chip its kernels are formed on; None when the
    file cannot be read."""
    from phaze.options import context_parallel_degree

    model = _model_file(model_path)
    if model is None:
        return None
    if context_parallel_degree(opts) > 1:
        opts = replace(opts, context_parallel=_RING_DEGREES)
    try:
        key = (*model, opts, attention_of, accelerator)
        hash(key)
    except TypeError:  # options that cannot be compared (none of the driver's)
        return None
    if key not in _SHOWN and len(_SHOWN) >= _SHOWN_KEPT:
        del _SHOWN[next(iter(_SHOWN))]
    return key


def skeletons_shown(model_path: str, opts: Any, accelerator: Any = None) -> frozenset[str]:
    """The skeletons this process's 4-block check accepted for the question that
    ``prepare_points(model_path, b, tps, opts, accelerator)`` asks (empty when none): what a
    ``--hw`` sweep's child sends back with its settings (:func:`learn_skeletons`)."""
    question = _question(model_path, opts, accelerator, None)
    return frozenset(_SHOWN.get(question, ())) if question is not None else frozenset()


def learn_skeletons(model_path: str, opts: Any, accelerator: Any, skeletons: frozenset[str]) -> None:
    """Take ``skeletons`` that another process's check accepted for the question of
    :func:`skeletons_shown` (a forked child: the same code, model and options, so the same
    check) as accepted here: a later micro-batch or CP degree of that question is traced once."""
    question = _question(model_path, opts, accelerator, None)
    if question is not None and skeletons:
        _SHOWN.setdefault(question, set()).update(skeletons)


def _shown(question: tuple, three: list[Setting]) -> bool:
    """Whether each of ``three`` has a skeleton the question's check accepted."""
    known = _SHOWN.get(question)
    return known is not None and all(_skeleton(s) in known for s in three)


def _skeleton(setting: Setting) -> str:
    """What of a 3-block setting a micro-batch or a CP degree past 1 cannot change unless its
    layers are priced differently from each other: the point (TP width, sequence parallelism,
    whether under CP, TP overlap), its blocks and, layer by layer, which layers share their scheduling groups
    (forward, backward, optimizer, selective recompute: the groups numbered as the layers first
    name them) and which have equal static numbers (the pattern, not the bytes).  The op
    table's rows are not in it: ops of different layers that a shape happens to make equal
    share a row at one micro-batch and not at another.  A block that a shape makes differ
    from its neighbours (a kernel chosen by length or batch, a layer-dependent branch) changes
    which layers share groups or numbers."""
    import json

    groups: dict[int, int] = {-1: -1}
    numbers: dict[str, int] = {}
    layers = []
    for i, lr in enumerate(setting.layers):
        ids = [groups.setdefault(g, len(groups) - 1) for g in (lr.fwd, lr.bwd, lr.opt, lr.selective)]
        layers.append([*ids, numbers.setdefault(json.dumps(lr.numbers.as_dict(), sort_keys=True), i)])
    # the CP degree as 1 or more (a question holds every degree past 1: :func:`_question`)
    point = [setting.tp, setting.sequence_parallel, setting.cp > 1, setting.tp_overlap, setting.blocks]
    return json.dumps([point, setting.grads_freed, setting.grad_element_bytes, len(setting.kernels), layers])


def _settings_of(
    traced, name: str, micro_batch: int, tps: tuple[int, ...], opts: Any, accelerator: Any = None
) -> tuple[list[Setting], list[tuple[int, bool, str]]]:
    """The settings of one traced step at every TP point it can be sharded for, and why not
    at the others (see :func:`prepare_points`: a runtime's kernels formed on ``accelerator``)."""
    from xdsl.passes import PassPipeline

    from passes import ALL_PASSES
    from phaze.options import Options
    from phaze.pipeline import compile_from, copy_for, form_kernels_spec, training_step
    from phaze.points import tp_points
    from phaze_ir.errors import PhazeError
    from phaze_ir.frontend import UnknownOpError
    from phaze_ir.ir import make_context

    # The training step is the same at every TP width: import it once, copy it per width.
    # The search's settings (no chip) have their kernels formed as on a chip without a CUDA
    # compute capability (the spaces' chips: phaze-form-kernels forms them alike on each).
    kernels = getattr(opts, "kernels", Runtime.OPS)  # (the search's Params have none)
    try:
        # the chip as the pipeline has it from the import on (None: the search's, no chip yet)
        # not verified, as each width's module below (the sweep verifies the winner's, compiled
        # through the same passes; verifying it was 1.6 % of the settings' time)
        training = training_step(traced, opts, accelerator if kernels is not Runtime.OPS else None, verify=False)
    except UnknownOpError:
        raise  # the model's (--strict)
    except PhazeError as e:
        raise PhazeError(f"{name} at micro-batch {micro_batch}: {e}") from e
    from phaze.options import context_parallel_degree

    points = tp_points(opts, tps)
    cp = context_parallel_degree(opts)
    # at the points with sequence parallelism, as the pipeline runs it: the --hw sweep's (a chip's
    # SM count prices it; the architecture search prices each collective alone)
    overlap = opts.tp_overlap is not Tristate.OFF and accelerator is not None
    out = []
    errors = []
    for k, (t, sp) in enumerate(points):
        try:
            # not verified: only its setting is read of it (the sweep verifies the module it
            # compiles for the winner, through the same passes; verifying was a tenth of the settings)
            module = compile_from(copy_for(training, k, len(points)), "training", "sharded", t, opts, sp, verify=False)
            if kernels is not Runtime.OPS:  # as phaze.pipeline.pipeline forms them, before tiling
                spec = form_kernels_spec(kernels, getattr(opts, "sdpa_order", Options.sdpa_order))
                formed = PassPipeline.parse_spec(ALL_PASSES, spec).passes
                PassPipeline(tuple(formed)).apply(make_context(), module)
        except UnknownOpError:
            raise  # the model's (--strict), not this width's
        except PhazeError as e:
            errors.append((t, sp, str(e)))
            continue
        overlapped = overlap and sp and t > 1
        out.append(setting_from_module(module, name, micro_batch, t, sp, opts.selective_recompute, cp, overlapped))
    return out, errors
