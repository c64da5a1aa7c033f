"""The propagation of tensor-parallel sharding states: the state of every value, the
collectives inserted where layouts meet, and the driver that walks the ops.

:class:`Propagation` is one round: it walks the ops in program order and asks the rule of each
op's kind (``passes/algorithms/tp_rules.py``) what its results are, given its operands' states.
The rules see the operands through :meth:`Propagation.operand` (a partial value that some
consumer needs whole is reduced there: :meth:`~Propagation.reduce_operand`) and state what an
op needs (:meth:`~Propagation.require_whole`, :meth:`~Propagation.decide_param` for a parameter
whose sharding is not decided yet); the collectives they imply are recorded as
:class:`AllReduce` (or reduce-scatter), :class:`Gather`, :class:`Pad` and :class:`SoftmaxStat`.
A split that reaches an op that cannot take it is refused (:meth:`~Propagation.refuse_split`):
its origins (column-parallel linears, the vocabulary split, local head repeats) are collected in
:attr:`~Propagation.to_demote`, and ``tp_shard.shard`` demotes them and runs a new round, until
a round demotes nothing.  A sequence-parallel split is never demoted: the op that cannot take it
reads it all-gathered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from passes.algorithms.tp_lattice import (
    PARTIAL,
    PENDING,
    REPLICATED,
    SEQUENCE_ORIGIN,
    Split,
    SplitCannotPass,
    State,
    map_view,
)
from passes.algorithms.tp_structure import VIEW_KINDS, GraphStructure, TOp

#: Elementwise kinds that read only their operand's shape (a partial value stays partial).
SHAPE_ONLY_KINDS = frozenset(("fill", "random", "arange"))
#: Reductions that sum (a sum of a partial value is partial; of a split dim, partial).
SUM_KINDS = frozenset(("sum", "mean"))


@dataclass
class AllReduce:
    """All-reduce of ``value`` (a partial sum, full shape), inserted after op ``after_op`` (its
    producer); the operands ``uses`` (op index, operand index) read the reduced value.
    ``source_op`` is the op that made the value partial (a row-parallel GEMM, the input-gradient
    GEMM of a column-parallel one, a vocabulary-parallel lookup; the latest one when partials
    are summed): the all-reduce takes its phase, layer and module.  With ``scatter`` set it is a
    reduce-scatter (sequence parallelism) whose result is split so, of local shape
    ``scatter_shape``.  ``per_step``: the gradient of a replicated parameter that sequence
    parallelism leaves partial (norm weights, row-parallel biases: each device saw its tokens),
    reduced once per step as Megatron does (gradients accumulate over the micro-batches first):
    inserted just before its first reader (the optimizer update), in the ``opt`` phase."""

    value: int
    after_op: int
    source_op: int
    uses: list[tuple[int, int]] = field(default_factory=list)
    scatter: Split | None = None
    scatter_shape: tuple[int, ...] = ()
    per_step: bool = False


@dataclass
class Gather:
    """All-gather (sequence parallelism) of ``value``, a value split along the sequence (or,
    when ``reduced``, the reduce-scatter of the partial ``value``), to its whole shape, inserted
    just before op ``before_op``: the first consumer in ``phase`` that needs it whole (a GEMM, an
    embedding gradient, ...); the all-gather takes that op's phase, layer and module.  One per
    value and phase: a forward value read by backward GEMMs is gathered again in the backward
    (Megatron-SP keeps the split input and re-gathers it for the weight gradient).  ``uses``:
    (op index, operand index, chain), ``chain`` the single-operand views (op indices) from
    ``value`` to that operand, re-run on the gathered value (``q``, ``k`` and ``v`` projections
    reading three views of one normed tensor share one all-gather)."""

    value: int
    reduced: bool
    phase: str
    before_op: int
    uses: list[tuple[int, int, tuple[int, ...]]] = field(default_factory=list)


@dataclass
class Pad:
    """``value``, split, zero-padded to its whole shape right after op ``after_op`` (its
    producer): a partial sum, read by the operands ``uses`` (op index, operand index).  Where a
    split cannot pass a view that only sums read (the gradient of transformers' ``repeat_kv``
    when devices share a key/value head), so the sums' results are partial and all-reduced."""

    value: int
    after_op: int
    uses: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class SoftmaxStat:
    """A local ``kind`` (``max``/``sum``) reduction of ``value`` over ``dim`` (result shape
    ``shape``) and an all-reduce of it, inserted before op ``before_op`` (a softmax over a split
    dim)."""

    before_op: int
    value: int
    dim: int
    kind: str
    shape: tuple[int, ...]


#: A rule: what op ``i`` (``op``) does to the sharding states, given the propagation so far.
Rule = Callable[["Propagation", int, TOp], None]


class Propagation:
    """One round of sharding propagation over the step (see the module docstring).

    ``column_candidates``: the linears that may become column-parallel this round;
    ``vocab_parallel``: whether the vocabulary split is still on; ``local_repeats``: the head
    repeats that may repeat a replicated key/value tensor into the device's query heads only
    (the origin of that split is the repeat op; see ``GraphStructure._find_head_repeats``).

    After :meth:`run`: ``states`` and ``origins`` of every value, the collectives
    (``all_reduces`` by value, ``gathers``, ``pads``, ``softmax_stats``), the linears made
    ``column_parallel`` and ``row_parallel``, and the origins ``to_demote``.
    """

    def __init__(
        self,
        structure: GraphStructure,
        column_candidates: set[int],
        vocab_parallel: bool,
        sequence_parallel: bool = False,
        local_repeats: set[int] | None = None,
    ):
        self.structure, self.graph, self.width = structure, structure.graph, structure.width
        self.column_candidates, self.vocab_parallel = column_candidates, vocab_parallel
        self.sequence_parallel = sequence_parallel
        self.local_repeats = set(structure.head_repeats) if local_repeats is None else local_repeats
        g = self.graph
        self.states: list = [PENDING if v.role == "param" else REPLICATED for v in g.values]
        self.origins: list[frozenset] = [frozenset()] * len(g.values)
        self.partial_source: dict[int, int] = {}  # partial value -> op that made it partial
        self.all_reduces: dict[int, AllReduce] = {}
        self._must_reduce: dict[int, bool] = {}
        self.gathers: dict[tuple[int, bool, str], Gather] = {}
        self.gathered_operands: set[tuple[int, int]] = set()
        self.pads: dict[int, Pad] = {}
        self.padded_partials: set[int] = set()  # partial values that are views of a Pad (sums keep them partial)
        self.softmax_stats: list[SoftmaxStat] = []
        self.cross_entropy_grads: set[int] = set()  # results of nll_loss_grad (a local softmax backward)
        self.to_demote: set[int] = set()
        self.column_parallel: list[int] = []
        self.row_parallel: list[int] = []
        self.current_op = -1

    def run(self, rule_for: Callable[[TOp], Rule]) -> None:
        """The driver: every op in program order, by the rule of its kind (``rule_for``)."""
        for i, op in enumerate(self.graph.ops):
            self.current_op = i
            rule_for(op)(self, i, op)

    # -- states -------------------------------------------------------------------------------
    def shape(self, v: int) -> tuple[int, ...]:
        """The global shape of value ``v``."""
        return self.graph.values[v].shape

    def state(self, v: int):
        """The state of value ``v``; a pending view of a parameter decided since is resolved
        now, by mapping the parameter's split through the views (refused if it cannot pass)."""
        s = self.states[v]
        if s is not PENDING:
            return s
        p = self.graph.values[v].producer
        if p < 0:
            return PENDING
        op = self.graph.ops[p]
        src = op.operands[0]
        ss = self.state(src)
        if ss is PENDING:
            return PENDING
        out: State
        if isinstance(ss, Split):
            try:
                out = map_view(op.kind, op.aten, self.shape(src), self.shape(v), ss, self.width)
            except SplitCannotPass:
                self.refuse_split(src)
                out = REPLICATED
        else:
            out = ss
        self.states[v] = out
        self.origins[v] = self.origins[src]
        return out

    def set_state(self, v: int, state, origin: frozenset = frozenset(), source: int | None = None) -> None:
        """Value ``v`` gets ``state``; a split keeps ``origin``, a partial sum records the op
        that made it partial (``source``, default the current op): its all-reduce takes that
        op's phase, layer and module."""
        self.states[v] = state
        self.origins[v] = origin if isinstance(state, Split) else frozenset()
        if state == PARTIAL:
            self.partial_source[v] = self.current_op if source is None else source

    def refuse_split(self, *values: int) -> None:
        """The splits of ``values`` cannot go on: their column-parallel linears (origins) are
        demoted; a sequence-parallel split is all-gathered for the current op instead."""
        for v in values:
            o = self.origins[v]
            if not o:
                raise AssertionError(f"split value {v} has no origin")
            if SEQUENCE_ORIGIN in o:
                op = self.graph.ops[self.current_op]
                ks = [k for k, u in enumerate(op.operands) if u == v]
                if not ks:
                    raise AssertionError(f"sequence-parallel value {v} is not an operand of op {self.current_op}")
                for k in ks:
                    self.all_gather(self.current_op, k)
            self.to_demote |= o - {SEQUENCE_ORIGIN}

    def refuse_origin(self, origin: frozenset, values) -> None:
        """A split of ``origin`` meets what it cannot take (a whole operand along its dim, a
        bias): sequence-parallel ``values`` are gathered, other origins demoted."""
        if SEQUENCE_ORIGIN in origin:
            for v in values:
                if SEQUENCE_ORIGIN in self.origins[v]:
                    self.refuse_split(v)
        self.to_demote |= origin - {SEQUENCE_ORIGIN}

    def is_sequence_split(self, v: int) -> bool:
        """Is ``v`` split along the sequence (sequence parallelism)?"""
        return SEQUENCE_ORIGIN in self.origins[v]

    def all_gather(self, i: int, k: int) -> None:
        """Operand ``k`` of op ``i``, split along the sequence, is read whole: an all-gather (one
        per storage and phase, see :class:`Gather`)."""
        if (i, k) in self.gathered_operands:
            return
        self.gathered_operands.add((i, k))
        g = self.graph
        v = g.ops[i].operands[k]
        red = self.all_reduces.get(v)
        chain: list[int] = []
        if self.states[v] == PARTIAL and red is not None and red.scatter is not None:
            root, reduced = v, True
            if (i, k) in red.uses:
                red.uses.remove((i, k))
        else:
            root, reduced = v, False
            while (p := g.values[root].producer) >= 0:
                op = g.ops[p]
                if not _is_view(op):
                    break
                u = op.operands[0]
                if not (isinstance(self.states[u], Split) and self.is_sequence_split(u)):
                    break
                chain.append(p)
                root = u
        phase = g.ops[i].phase
        ga = self.gathers.get((root, reduced, phase))
        if ga is None:
            ga = self.gathers[root, reduced, phase] = Gather(root, reduced, phase, i)
        ga.uses.append((i, k, tuple(reversed(chain))))

    def decide_param(self, v: int, desired, origin: frozenset) -> bool:
        """Fix the sharding of the parameter that ``v`` is a view of so that ``v`` gets
        ``desired``; False (and replicated) when no split of the parameter gives it."""
        root = self.structure.root_param(v)
        chain = self.structure.chain(v) if root != v else []
        if desired is not REPLICATED:
            rshape = self.shape(root)
            for k in range(len(rshape)):
                n = rshape[k] + desired.pad
                if n % self.width:
                    continue
                cand = Split(k, n // self.width, desired.pad)
                cur, src, ok = cand, root, True
                for p in chain:
                    op = self.graph.ops[p]
                    try:
                        cur = map_view(op.kind, op.aten, self.shape(src), self.shape(op.results[0]), cur, self.width)
                    except SplitCannotPass:
                        ok = False
                        break
                    src = op.results[0]
                if ok and cur == desired:
                    self.set_state(root, cand, origin)
                    return True
        self.set_state(root, REPLICATED)
        return False

    def must_reduce(self, v: int) -> bool:
        """A partial value is reduced for all its consumers as soon as one of them is neither
        a view nor an add/sub (nor an op that reads only its shape)."""
        if v not in self._must_reduce:
            must = False
            for j, _k in self.structure.consumers[v]:
                op = self.graph.ops[j]
                if op.name == "layout" and len(op.operands) == 1 and (op.kind in VIEW_KINDS or op.kind == "clone"):
                    continue
                if op.name == "elementwise" and op.kind in SHAPE_ONLY_KINDS | {"add", "sub"}:
                    continue
                if (
                    op.name == "reduction"
                    and op.kind in SUM_KINDS
                    and len(op.operands) == 1
                    and v in self.padded_partials
                ):
                    continue  # a sum of a zero-padded split (a partial sum) is partial
                must = True
                break
            self._must_reduce[v] = must
        return self._must_reduce[v]

    def reduce_operand(self, i: int, k: int) -> State:
        """Reduce the partial operand ``k`` of op ``i``: an all-reduce (the op reads it
        replicated), or under sequence parallelism a reduce-scatter of an activation (the op
        reads it split along the sequence; the state returned)."""
        v = self.graph.ops[i].operands[k]
        red = self.all_reduces.get(v)
        if red is None:
            scatter = None
            if self.sequence_parallel and v not in self.structure.param_grads:
                scatter = self.structure.seq_split(self.shape(v))
            red = self.all_reduces[v] = AllReduce(
                v,
                self.graph.values[v].producer,
                self.partial_source[v],
                scatter=scatter,
                per_step=self.sequence_parallel and v in self.structure.param_grads,
            )
            if scatter is not None:
                self.origins[v] = frozenset((SEQUENCE_ORIGIN,))
        if (i, k) not in red.uses:
            red.uses.append((i, k))
        return red.scatter if red.scatter is not None else REPLICATED

    def operand(self, i: int, k: int):
        """State of operand ``k`` of op ``i`` as the op sees it (a partial value that must be
        reduced reads as replicated)."""
        v = self.graph.ops[i].operands[k]
        s = self.state(v)
        if s == PARTIAL and self.must_reduce(v):
            return self.reduce_operand(i, k)
        op = self.graph.ops[i]
        if (
            isinstance(s, Split)
            and op.module in self.structure.gathered_at_entry
            and not _is_view(op)
            and self.is_sequence_split(v)
        ):
            # a module that gathers its inputs as it is entered (GraphStructure's
            # gathered_at_entry): whatever of it computes on the split value reads it whole
            # (views pass the split on, so that one all-gather per storage and phase serves
            # them all and the backward gathers again, as for a GEMM's operand)
            self.all_gather(i, k)
            return REPLICATED
        return s

    def operand_gathered(self, i: int, k: int):
        """:meth:`operand`, with a sequence-parallel split gathered (GEMMs read whole
        activations), except in the GEMMs of the linears Megatron duplicates over TP (MLA's down
        projections, ``GraphStructure.sequence_local``): those run on the device's own ``s/t``
        tokens, forward and backward, so their weight gradients are partial and all-reduced
        once per step (Megatron marks a duplicated ``TELinear``'s weight ``sequence_parallel``:
        ``megatron/core/extensions/transformer_engine.py``)."""
        s = self.operand(i, k)
        op = self.graph.ops[i]
        if isinstance(s, Split) and op.module and op.module in self.structure.sequence_local:
            return s
        if isinstance(s, Split) and self.is_sequence_split(op.operands[k]):
            self.all_gather(i, k)
            return REPLICATED
        return s

    def require_whole(self, i: int, k: int, s=None) -> None:
        """Operand ``k`` of op ``i`` must be replicated."""
        v = self.graph.ops[i].operands[k]
        s = self.operand(i, k) if s is None else s
        if s is PENDING:
            self.decide_param(v, REPLICATED, frozenset())
        elif s == PARTIAL:
            if self.reduce_operand(i, k) is not REPLICATED:
                self.all_gather(i, k)
        elif isinstance(s, Split):
            self.refuse_split(v)

    # -- driver -------------------------------------------------------------------------------

    def zero_pad(self, i: int, k: int) -> None:
        """Operand ``k`` of op ``i``, split, is read zero-padded to its whole shape: a partial sum."""
        v = self.graph.ops[i].operands[k]
        pad = self.pads.get(v)
        if pad is None:
            pad = self.pads[v] = Pad(v, self.graph.values[v].producer)
        pad.uses.append((i, k))


def _is_view(op: TOp) -> bool:
    """A single-operand view (``transpose``, ``view``, ...): it moves no data."""
    return op.name == "layout" and op.kind in VIEW_KINDS and len(op.operands) == len(op.results) == 1
