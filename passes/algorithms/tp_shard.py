"""Megatron-style tensor parallelism on a training step, by sharding propagation.

The input is the whole training step (forward, backward, optimizer) as a light graph of ops on
tensors with static shapes (:class:`TGraph`); the output (:class:`ShardPlan`) is what one device
of a tensor-parallel group of width ``t`` runs: the local shape of every value, the all-reduces
to insert and where, and which linears became column- or row-parallel.

Every value gets a *sharding state*, GSPMD-like:

- ``R`` (``None``): replicated, every device holds the whole tensor;
- :class:`Split` ``(dim, inner, pad)``: split into ``t`` parts along ``dim``; the split factor
  sits ``inner`` elements deep in that dim (``[outer, t, inner]``: a split of the heads stays
  exact when the heads are merged with the micro-batch into one ``b*heads`` dim), and ``pad``
  elements are added to the dim before splitting (the vocabulary only);
- ``P``: partial sum, every device holds a full-shaped tensor and the true value is their sum.

Structure is found from the graph, never from names:

- a *linear* is a forward ``matmul`` whose rhs is a ``param`` argument, possibly through
  single-operand views (``transpose``/``view``/...);
- a linear in a ``block`` layer whose input is replicated becomes **column-parallel** (weight
  split along its output dim, output split along the last dim); a linear whose input is split
  along the contracted dim becomes **row-parallel** (weight split along its input dim, output
  partial).  So "row" is exactly "fed, through elementwise ops, views, softmax and batched
  matmuls of activations, by column outputs", as in Megatron;
- the *LM head* is a forward linear outside the blocks whose output reaches a (log-)softmax over
  its last dim and whose width is the row count of an embedding table looked up in the forward
  (or whose weight *is* that table: tied embeddings).  That table becomes **vocabulary-parallel**
  (split along its rows: the lookup yields a partial sum) and the head column-parallel over the
  vocabulary, both padded to a multiple of ``vocab_multiple * t`` rows as Megatron pads them.

Propagation rules per op kind: matmul (column, row, batched with split batch dims), elementwise
(broadcast-aware; a replicated parameter meeting a split operand, e.g. a bias, is split with
it), views and copies (the split dim is mapped through reshapes by its flat stride, through
transposes/permutes by the permutation read off the shapes), split/cat (the fused QKV of GPT-2
is split along the sharded dim: each device holds its heads' q, k and v, Megatron's layout),
reductions (a sum over the split dim is partial), softmax (a softmax over a split dim is the
distributed one), norms (need the normalized dims whole), embeddings, the optimizer step and the
function's results.  Backward ops follow the same rules, so weight gradients of split weights
come out split (no communication) and the input gradient of a column-parallel linear comes out
partial.

A partial value is all-reduced (one ``all_reduce`` of its full shape, right after the op that
yields it) as soon as it meets a consumer that needs it whole.  Only views and ``add``/``sub``
keep a value partial (and sums, of a zero-padded split: :class:`Pad`): partials add up, and a
replicated addend is added by one device only, so the gradients that q, k and v projections
send to their shared input (and the residual gradient they are accumulated into) are
all-reduced once, Megatron's ``f`` operator; likewise a
block output may be all-reduced just after the residual add instead of just before it (same
bytes).  The all-reduce takes the phase, layer and module of the GEMM that made the value
partial.  This gives Megatron's two all-reduces per transformer block in the forward (after
the attention output projection and after the second MLP GEMM) and two in the backward (the
input gradients of the first linears of attention and MLP).  The vocabulary-parallel
cross-entropy is modelled as: two all-reduces of ``[tokens]`` statistics (Megatron's max and
sum of exponentials, here local ``max`` and ``sum`` reductions of the logits shard feeding an
all-reduce, inserted before the (log-)softmax over the split vocabulary; their results feed
nothing: the softmax op stands for the fused kernel that would consume them) and one
all-reduce of the partial loss (each device holds the target logits of its vocabulary shard),
a scalar in place of Megatron's all-reduce of the ``[tokens]`` target logits.  The backward of the cross-entropy
(``log_softmax_grad`` of an ``nll_loss_grad``) is local, as in Megatron's fused kernel; any
other softmax gradient over a split dim all-reduces one ``[rows]`` sum.

**Sequence parallelism** (``sequence_parallel``, Megatron-SP): a partial activation whose
leading dims are the ``b·s`` tokens is reduce-scattered instead (:class:`AllReduce` with
``scatter``), to a split along the sequence (origin :data:`SEQ`) that dropout, residual adds and
norms carry on ``s/t`` tokens; where such a value meets an op that needs it whole (a GEMM, an
embedding gradient) it is all-gathered (:class:`Gather`: one per storage and phase, so backward
GEMMs re-gather the split input they read instead of saving the whole one).  Gradients of
replicated parameters made partial by the split (norms, row-parallel biases) are all-reduced
once per step, before the optimizer.  A sequence split never demotes a linear.

**Grouped-query attention** (``kv`` key/value heads for ``heads`` query heads): the repeat of
K and V over the query heads, the importer's ``repeat`` in a fused attention kernel
(``aten = "attention"``, ``repeat_interleave``) or transformers' ``repeat_kv`` (expand, copy,
view), carries a split of the key/value heads to the query heads they serve (a head-split
repeat is a local repeat of the local heads), and the backward's sum of the repeated heads'
gradients back to the key/value heads is local.  A width that divides ``kv`` splits the K and V
projections column-parallel (``kv/t`` heads per device).  A width that is a multiple of ``kv``
(fewer key/value heads than devices) keeps the K and V projections replicated and repeats the
whole K and V into each device's own query heads only (the repeat is then the origin of that
split); the backward sum is then partial (a device holds part of one group; transformers' view
of the gradient, which cannot carry the split, reads it zero-padded: :class:`Pad`) and
all-reduced before the projections' backward GEMMs.  Megatron-core takes only those two cases;
any other width is refused (docs/design.md §5.2 compares with what Megatron does).

When a split value reaches an op that cannot take it (a norm over the split dim, a function
result, a mismatch), the column-parallel linear (or the vocabulary split, or the local repeat)
it came from is demoted to replicated and the propagation runs again; e.g. the last of an odd
number of linears that feed a norm stays replicated.  Widths that do not divide the attention
heads or the output size of a column-parallel linear are refused with a :class:`ShardError`.
Linears that stay replicated where Megatron would shard them are reported
(:class:`Replicated`).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import NamedTuple

from phaze_ir import op_kinds


class ShardError(Exception):
    """A width the model cannot be sharded with (one-line message)."""


class Split(NamedTuple):
    """Split of a value into ``t`` parts along ``dim`` (see the module docstring)."""

    dim: int
    inner: int
    pad: int = 0


R = None  # replicated
P = "P"  # partial sum
_PENDING = "U"  # a parameter (or a view of one) whose sharding is not decided yet
VOCAB = -1  # origin of splits that come from the vocabulary-parallel embedding
SEQ = -2  # origin of sequence-parallel splits (a reduce-scatter's result and what follows from it)

# The sharding state of a value: a split, replicated (``R``), partial (``P``) or pending.
State = Split | str | None

VIEW_KINDS = frozenset(op_kinds.VIEW_KINDS)
_CHAIN_KINDS = frozenset(
    ("view", "reshape", "transpose", "permute", "squeeze", "unsqueeze", "alias", "detach", "clone", "expand")
)
_SHAPE_ONLY = frozenset(("fill", "random", "arange"))
_SUMS = frozenset(("sum", "mean"))


@dataclass
class TValue:
    """A value: its (global) shape, the argument role (``param``/``buffer``/``input``/``""``)
    and the index of the op that yields it (-1 for arguments)."""

    shape: tuple[int, ...]
    role: str = ""
    producer: int = -1


@dataclass
class TOp:
    """An op.  ``name`` is the op name without the dialect (``matmul``, ``elementwise``, ...;
    ``return`` for the function's terminator), ``kind`` its kind property, ``dims``/``dim``/
    ``normalized_rank`` the properties of reductions, softmax and norms.  For ``return``,
    ``result_roles[k]`` is ``loss``, ``grad``, ``updated`` or ``""`` and ``result_params[k]`` the
    parameter value of a gradient or updated parameter (-1 otherwise)."""

    name: str
    kind: str
    operands: list[int]
    results: list[int]
    phase: str = "fwd"
    layer: int = 0
    module: str = ""
    aten: str = ""
    dims: tuple[int, ...] = ()
    dim: int = 0
    normalized_rank: int = 1
    result_roles: list[str] = field(default_factory=list)
    result_params: list[int] = field(default_factory=list)


@dataclass
class TGraph:
    """Values and ops of one step in program order, the (kind, module) of every layer, the
    micro-batch size and sequence length traced (``seq_len`` 0: unknown; sequence parallelism
    needs it)."""

    values: list[TValue] = field(default_factory=list)
    ops: list[TOp] = field(default_factory=list)
    layers: list[tuple[str, str]] = field(default_factory=list)
    micro_batch: int = 1
    seq_len: int = 0

    def add_value(self, shape, role: str = "", producer: int = -1) -> int:
        self.values.append(TValue(tuple(shape), role, producer))
        return len(self.values) - 1

    def add_op(self, name: str, kind: str, operands: list[int], result_shapes: list, **kw) -> int:
        index = len(self.ops)
        results = [self.add_value(s, producer=index) for s in result_shapes]
        self.ops.append(TOp(name, kind, list(operands), results, **kw))
        return index


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


@dataclass
class Replicated:
    """Linears that stay replicated where Megatron would shard them, said in one line
    (``message``): ``reason`` ``kv_heads`` (the key/value projections of grouped-query
    attention with fewer key/value heads than the width), ``demoted`` (block linears an op
    between them kept from splitting) or ``outside_blocks`` (forward linears outside the blocks
    holding more than :data:`OUTSIDE_SHARE` of the linear FLOPs); ``count`` of them out of
    ``total`` (the linears of the blocks, all of them in a step without blocks; all forward
    linears for ``outside_blocks``), the
    ``module`` of the first, and the share of the forward linears' FLOPs they hold."""

    reason: str
    count: int
    total: int
    module: str
    flops_share: float
    message: str


@dataclass
class ShardPlan:
    """What one device runs: ``shapes`` (local shape of every value whose shape changes),
    ``states`` (the sharding state of every value), the all-reduces and softmax statistics to
    insert, the linears made column- and row-parallel (op indices), the vocabulary-parallel
    embedding tables (value ids), the linears demoted to replicated and the rounds it took;
    under sequence parallelism the all-gathers too (``all_reduces`` then holds reduce-scatters
    as well)."""

    width: int
    shapes: dict[int, tuple[int, ...]]
    states: list
    all_reduces: list[AllReduce]
    stats: list[SoftmaxStat]
    column: list[int]
    row: list[int]
    vocab_tables: list[int]
    vocab_size: int
    padded_vocab_size: int
    demoted: list[int]
    rounds: int
    gathers: list[Gather] = field(default_factory=list)
    sequence_parallel: bool = False
    replicated: list[Replicated] = field(default_factory=list)
    pads: list[Pad] = field(default_factory=list)
    #: The key/value projections kept replicated (fewer key/value heads than the width).
    kv_replicated: list[int] = field(default_factory=list)


class _NoMap(Exception):
    """A split that an op cannot carry."""


# ------------------------------------------------------------------------------------------
# Mapping a split through views
# ------------------------------------------------------------------------------------------


def _strides(shape) -> list[int]:
    out, acc = [1] * len(shape), 1
    for i in range(len(shape) - 1, -1, -1):
        out[i] = acc
        acc *= shape[i]
    return out


def reshape_split(src, dst, sp: Split, t: int) -> Split:
    """The split of ``dst`` that a row-major reshape of ``src`` (split ``sp``) yields."""
    if sp.pad:
        # A padded dim (the vocabulary) must survive the reshape whole.
        pre, post = math.prod(src[: sp.dim]), math.prod(src[sp.dim + 1 :])
        for e in range(len(dst)):
            if dst[e] == src[sp.dim] and math.prod(dst[:e]) == pre and math.prod(dst[e + 1 :]) == post:
                return Split(e, sp.inner, sp.pad)
        raise _NoMap(f"a reshape {tuple(src)} -> {tuple(dst)} breaks the padded dim {sp.dim}")
    f = sp.inner * _strides(src)[sp.dim]  # flat stride of the split factor
    so = _strides(dst)
    for e in range(len(dst)):
        lo, hi = so[e], so[e] * dst[e]
        if f % lo == 0 and hi % (f * t) == 0:
            return Split(e, f // lo, 0)
    raise _NoMap(f"a reshape {tuple(src)} -> {tuple(dst)} cuts through the split of dim {sp.dim}")


def _permutations(src, dst, kind: str, aten: str) -> list[tuple[int, ...]]:
    """Permutations ``p`` with ``dst[k] == src[p[k]]`` that the op can be."""
    r = len(src)
    if len(dst) != r:
        return []
    if kind == "transpose":
        if r <= 1:
            return [tuple(range(r))]
        if aten.startswith("aten.t.") and r == 2:
            return [(1, 0)]
        out = []
        for i, j in itertools.combinations(range(r), 2):
            p = list(range(r))
            p[i], p[j] = j, i
            if all(dst[k] == src[p[k]] for k in range(r)):
                out.append(tuple(p))
        if not out and tuple(src) == tuple(dst):
            out.append(tuple(range(r)))
        return out
    return [p for p in itertools.permutations(range(r)) if all(dst[k] == src[p[k]] for k in range(r))]


def permute_split(src, dst, sp: Split, kind: str, aten: str) -> Split:
    """The split of ``dst`` after a transpose/permute of ``src``.  The dims the op moves are read
    off the shapes; when several permutations fit and place the split dim differently, a
    transpose that keeps the shape is taken to swap the last two dims (``k.transpose(-1, -2)``,
    the matmul idiom), else the op is refused."""
    perms = _permutations(src, dst, kind, aten)
    images = sorted({p.index(sp.dim) for p in perms})
    if len(images) == 1:
        return Split(images[0], sp.inner, sp.pad)
    r = len(src)
    if kind == "transpose" and r >= 2 and tuple(src) == tuple(dst):
        last = list(range(r))
        last[-1], last[-2] = last[-2], last[-1]
        if tuple(last) in perms:
            return Split(tuple(last).index(sp.dim), sp.inner, sp.pad)
    raise _NoMap(f"cannot tell from the shapes {tuple(src)} -> {tuple(dst)} where {kind} moves dim {sp.dim}")


def _removed_dim(src, dst) -> list[int]:
    """Dims ``i`` such that dropping ``src[i]`` gives ``dst``."""
    return [i for i in range(len(src)) if tuple(src[:i]) + tuple(src[i + 1 :]) == tuple(dst)]


def _inserted_dim(src, dst) -> list[int]:
    return _removed_dim(dst, src)


def map_view(kind: str, aten: str, src, dst, sp: Split, t: int) -> Split:
    """The split of one result ``dst`` of a single-operand layout op on ``src`` split ``sp``."""
    src, dst = tuple(src), tuple(dst)
    if kind in ("alias", "detach", "clone", "copy", "contiguous") and src == dst:
        return sp
    if kind in ("view", "reshape", "alias", "detach", "clone", "copy", "squeeze", "unsqueeze"):
        if math.prod(src) != math.prod(dst):
            raise _NoMap(f"{kind} changes the number of elements")
        if src == dst:
            return sp
        return reshape_split(src, dst, sp, t)
    if kind in ("transpose", "permute"):
        return permute_split(src, dst, sp, kind, aten)
    if kind == "repeat" and aten == "attention" and _repeated_dim(src, dst) == sp.dim and not sp.pad:
        # The importer's grouped-query repeat (repeat_interleave): each of a device's key/value
        # heads becomes its query heads' copies, on the same device.
        return Split(sp.dim, sp.inner * (dst[sp.dim] // src[sp.dim]), 0)
    if kind == "expand":
        off = len(dst) - len(src)
        if dst[sp.dim + off] != src[sp.dim]:
            raise _NoMap("expand of the split dim")
        return Split(sp.dim + off, sp.inner, sp.pad)
    if kind in ("select", "unbind"):
        cands = _removed_dim(src, dst)
        images = {i - (1 if i < sp.dim else 0) for i in cands if i != sp.dim}
        if len(images) != 1 or sp.dim in cands and len(cands) == 1:
            raise _NoMap(f"{kind} of or near the split dim")
        return Split(images.pop(), sp.inner, sp.pad)
    if len(src) == len(dst) and src[sp.dim] == dst[sp.dim]:
        # slice, pad, zero_pad (slice_backward), flip, roll, tril, ...: acting on other dims.
        return sp
    raise _NoMap(f"{kind} {src} -> {dst} changes the split dim {sp.dim}")


# ------------------------------------------------------------------------------------------
# Structure (found once)
# ------------------------------------------------------------------------------------------


class _Structure:
    def __init__(self, g: TGraph, t: int, vocab_multiple: int):
        self.g, self.t = g, t
        nv = len(g.values)
        self.consumers: list[list[tuple[int, int]]] = [[] for _ in range(nv)]
        for i, op in enumerate(g.ops):
            for k, v in enumerate(op.operands):
                self.consumers[v].append((i, k))
        self._root: dict[int, int] = {}
        self.block_layers = {i for i, (kind, _) in enumerate(g.layers) if kind == "block"}
        # Linears: forward matmuls whose rhs is a parameter through views.
        self.linear_param: dict[int, int] = {}
        for i, op in enumerate(g.ops):
            if op.name == "matmul" and op.phase == "fwd":
                root = self.root_param(op.operands[1])
                if root >= 0:
                    self.linear_param[i] = root
        self._find_vocab(vocab_multiple)
        self._check_heads()
        self._find_head_repeats()
        # Parameter gradients (and what they are views or casts of): all-reduced, never
        # reduce-scattered along a sequence they do not have.
        self.param_grads: set[int] = set()
        for op in g.ops:
            grads = []
            if op.name == "optimizer_update" and len(op.operands) > 1:
                grads.append(op.operands[1])
            elif op.name == "return":
                grads += [
                    v
                    for k, v in enumerate(op.operands)
                    if k < len(op.result_roles) and op.result_roles[k] in ("grad", "updated")
                ]
            for v in grads:
                while v not in self.param_grads:
                    self.param_grads.add(v)
                    p = g.values[v].producer
                    if p < 0:
                        break
                    src = g.ops[p]
                    if len(src.operands) != 1 or not (
                        src.name == "layout" or (src.name == "elementwise" and src.kind in ("convert", "copy"))
                    ):
                        break
                    v = src.operands[0]
        # Embedding gradients -> the table of the lookup with the same indices.
        self.emb_grad_table: dict[int, int] = {}
        lookups: dict[int, list[int]] = {}
        for op in g.ops:
            if op.name == "embedding" and op.kind == "lookup" and len(op.operands) >= 2:
                lookups.setdefault(op.operands[1], []).append(op.operands[0])
        for i, op in enumerate(g.ops):
            if op.name == "embedding" and op.kind == "grad" and len(op.operands) >= 2:
                for table in lookups.get(op.operands[1], []):
                    if g.values[table].shape == g.values[op.results[0]].shape:
                        self.emb_grad_table[i] = table
                        break

    def seq_split(self, shape: tuple[int, ...]) -> Split | None:
        """The sequence-parallel split of an activation of ``shape`` whose leading dims are the
        ``b·s`` tokens (``[b, s, h]``, ``[b·s, h]``, ...): the factor ``t`` sits ``s/t`` tokens
        deep in the token index (batch-major), so ``[b, s, h]`` splits its dim 1 and ``[b·s, h]``
        its dim 0 as ``[b, t, s/t]``.  ``None`` for anything else."""
        b, s, t = max(self.g.micro_batch, 1), self.g.seq_len, self.t
        if not s or s % t or len(shape) < 2:
            return None
        acc = 1
        for k in range(len(shape) - 1):
            acc *= shape[k]
            if acc >= b * s:
                break
        if acc != b * s:
            return None
        try:
            return reshape_split((b, s, math.prod(shape) // (b * s)), shape, Split(1, s // t), t)
        except _NoMap:
            return None

    def is_chain_op(self, op: TOp) -> bool:
        return op.name == "layout" and op.kind in _CHAIN_KINDS and len(op.operands) == 1 and len(op.results) == 1

    def root_param(self, v: int) -> int:
        """The parameter argument ``v`` is a view of (-1 if none)."""
        if v in self._root:
            return self._root[v]
        seen = []
        root = -1
        while True:
            seen.append(v)
            val = self.g.values[v]
            if val.producer < 0:
                root = v if val.role == "param" else -1
                break
            op = self.g.ops[val.producer]
            if not self.is_chain_op(op):
                break
            v = op.operands[0]
            if v in self._root:
                root = self._root[v]
                break
        for s in seen:
            self._root[s] = root
        return root

    def chain(self, v: int) -> list[int]:
        """The view ops from the parameter that ``v`` is a view of to ``v``, in order."""
        out = []
        while self.g.values[v].producer >= 0:
            p = self.g.values[v].producer
            out.append(p)
            v = self.g.ops[p].operands[0]
        return out[::-1]

    def layer_name(self, layer: int) -> str:
        kind, module = self.g.layers[layer] if 0 <= layer < len(self.g.layers) else ("", "")
        return f"layer {layer} ({module or kind or '?'})"

    def _reaches_softmax_last(self, v: int, depth: int = 12) -> bool:
        """Does ``v`` reach a forward (log-)softmax over its last dim through views, copies and
        elementwise ops (casts, scaling, a bias)?"""
        frontier = [v]
        for _ in range(depth):
            nxt = []
            for u in frontier:
                for j, _k in self.consumers[u]:
                    op = self.g.ops[j]
                    if op.phase != "fwd":
                        continue
                    if op.name == "softmax" and op.kind in ("softmax", "log_softmax"):
                        rank = len(self.g.values[op.operands[0]].shape)
                        if op.dim % max(rank, 1) == rank - 1:
                            return True
                    if (op.name == "layout" and op.kind in VIEW_KINDS | {"clone"}) or op.name == "elementwise":
                        nxt.extend(op.results)
            frontier = nxt
            if not frontier:
                break
        return False

    def _find_vocab(self, multiple: int) -> None:
        g = self.g
        heads: dict[int, int] = {}  # LM head op -> vocabulary (its output width)
        for i in self.linear_param:
            op = g.ops[i]
            if op.layer in self.block_layers:
                continue
            if self._reaches_softmax_last(op.results[0]):
                heads[i] = g.values[op.results[0]].shape[-1]
        self.lm_heads: set[int] = set()
        self.word_lookups: set[int] = set()
        self.vocab_size = 0
        for i, op in enumerate(g.ops):
            if op.name != "embedding" or op.kind != "lookup" or op.phase != "fwd":
                continue
            table = self.root_param(op.operands[0])
            if table < 0:
                continue
            rows = g.values[table].shape[0]
            tied = [h for h in heads if self.linear_param[h] == table]
            same = [h for h, n in heads.items() if n == rows]
            if tied or same:
                self.word_lookups.add(i)
                self.lm_heads.update(tied or same)
                self.vocab_size = rows
        step = multiple * self.t
        self.padded_vocab = -(-self.vocab_size // step) * step if self.vocab_size else 0
        self.vocab_pad = self.padded_vocab - self.vocab_size

    def _check_heads(self) -> None:
        """Refuse a width that does not divide the attention heads of a block (the batch of a
        forward matmul of two activations in a block is micro-batch x heads), or that neither
        divides nor is a multiple of its key/value heads (grouped-query attention); find the
        key/value projections that stay replicated (fewer key/value heads than the width)."""
        g = self.g
        #: key/value projection (a linear op) -> (key/value heads, query heads), grouped-query
        #: attention only; those of :attr:`kv_replicated` stay replicated.
        self.kv_linears: dict[int, tuple[int, int]] = {}
        self.kv_replicated: set[int] = set()
        attention: dict[int, tuple[int, int]] = {}  # layer -> (heads, head dim) of its Q·Kᵀ
        for op in g.ops:
            if op.name != "matmul" or op.phase != "fwd" or (self.block_layers and op.layer not in self.block_layers):
                continue
            if self.root_param(op.operands[0]) >= 0 or self.root_param(op.operands[1]) >= 0:
                continue
            shape = g.values[op.results[0]].shape
            if len(shape) < 3:
                continue
            batch = math.prod(shape[:-2])
            heads = batch // g.micro_batch if g.micro_batch and batch % g.micro_batch == 0 else batch
            if heads % self.t:
                raise ShardError(
                    f"width {self.t} does not divide the {heads} attention heads of {self.layer_name(op.layer)}"
                )
            attention.setdefault(op.layer, (heads, g.values[op.operands[0]].shape[-1]))
        # Grouped-query attention: the key/value projections are linears of the block whose
        # output is fewer heads of the same head dim (kv < heads, kv | heads).  Megatron-core
        # (megatron/core/transformer/transformer_config.py) takes a width that divides the
        # key/value heads (num_query_groups) or is a multiple of them, and refuses any other;
        # so does phaze.  With fewer key/value heads than the width (transformer/attention.py:
        # num_query_groups < world_size), each device needs one key/value head that other
        # devices need too: phaze keeps those projections replicated (docs/design.md §5.2).
        for i in sorted(self.linear_param):
            op = g.ops[i]
            if op.layer not in attention:
                continue
            heads, head_dim = attention[op.layer]
            n = g.values[op.results[0]].shape[-1]
            if head_dim and n % head_dim == 0 and 0 < (kv := n // head_dim) < heads and heads % kv == 0:
                if kv % self.t and self.t % kv:
                    raise ShardError(
                        f"width {self.t} neither divides nor is a multiple of the {kv} key/value heads of "
                        f"{self.layer_name(op.layer)} (grouped-query attention, {heads} query heads); Megatron "
                        "requires one or the other"
                    )
                self.kv_linears[i] = (kv, heads)
                if kv < self.t:
                    self.kv_replicated.add(i)

    def _find_head_repeats(self) -> None:
        """The ops of the blocks that repeat key/value heads over the query heads (grouped-query
        attention), op -> the dim of its result that holds the repeated heads: the importer's
        ``repeat`` in a fused attention kernel's forward and backward (``aten = "attention"``,
        each head repeated in place: ``repeat_interleave``) and transformers' ``repeat_kv``, a view that
        merges the heads with the dim an ``expand`` broadcast after them
        (``x[:, :, None].expand(b, kv, g, s, d).reshape(b, kv * g, s, d)``, through a copy).
        A replicated key/value tensor is repeated locally into the query heads of the device."""
        g = self.g
        self.head_repeats: dict[int, int] = {}
        for i, op in enumerate(g.ops):
            if op.name != "layout" or len(op.operands) != 1 or len(op.results) != 1:
                continue
            if self.block_layers and op.layer not in self.block_layers:
                continue
            src, dst = g.values[op.operands[0]].shape, g.values[op.results[0]].shape
            if op.kind == "repeat" and op.aten == "attention":
                d = _repeated_dim(src, dst)
                if d is not None:
                    self.head_repeats[i] = d
            elif op.kind in ("view", "reshape"):
                v = op.operands[0]
                while (
                    (p := g.values[v].producer) >= 0
                    and g.ops[p].name == "layout"
                    and g.ops[p].kind in ("clone", "alias")
                ):
                    v = g.ops[p].operands[0]
                p = g.values[v].producer
                if p < 0 or g.ops[p].name != "layout" or g.ops[p].kind != "expand":
                    continue
                before, after = g.values[g.ops[p].operands[0]].shape, g.values[v].shape
                if len(before) != len(after) or len(after) != len(dst) + 1:
                    continue
                for e in range(len(after) - 1):
                    # heads at e, a broadcast dim at e + 1 merged into them
                    merged = after[:e] + (after[e] * after[e + 1],) + after[e + 2 :]
                    if before[e + 1] == 1 < after[e + 1] and before[e] == after[e] and merged == dst:
                        self.head_repeats[i] = e
                        break


def _repeated_dim(src, dst) -> int | None:
    """The one dim along which ``dst`` repeats ``src`` a whole number of times (None if none)."""
    if len(src) != len(dst):
        return None
    diff = [d for d in range(len(src)) if src[d] != dst[d]]
    if len(diff) != 1 or not src[diff[0]] or dst[diff[0]] % src[diff[0]]:
        return None
    return diff[0]


# ------------------------------------------------------------------------------------------
# One round of propagation
# ------------------------------------------------------------------------------------------


class _Round:
    def __init__(
        self, s: _Structure, candidates: set[int], vocab: bool, sp: bool = False, repeats: set[int] | None = None
    ):
        self.s, self.g, self.t = s, s.g, s.t
        self.candidates, self.vocab, self.sp = candidates, vocab, sp
        # Head repeats that may repeat a replicated key/value tensor into the device's query
        # heads only (the origin of that split is the repeat op; see _Structure._find_head_repeats).
        self.repeats = set(s.head_repeats) if repeats is None else repeats
        self.pads: dict[int, Pad] = {}
        self.padded: set[int] = set()  # partial values that are views of a Pad (sums keep them partial)
        self.gathers: dict[tuple[int, bool, str], Gather] = {}
        self.gathered: set[tuple[int, int]] = set()
        g = self.g
        self.st: list = [_PENDING if v.role == "param" else R for v in g.values]
        self.origin: list[frozenset] = [frozenset()] * len(g.values)
        self.reductions: dict[int, AllReduce] = {}
        self.must: dict[int, bool] = {}
        self.stats: list[SoftmaxStat] = []
        self.triggers: set[int] = set()
        self.column: list[int] = []
        self.row: list[int] = []
        self.ce_grad: set[int] = set()
        self.source: dict[int, int] = {}  # partial value -> op that made it partial
        self.cur = -1

    # -- states -------------------------------------------------------------------------------
    def shape(self, v: int) -> tuple[int, ...]:
        return self.g.values[v].shape

    def get(self, v: int):
        s = self.st[v]
        if s is not _PENDING:
            return s
        p = self.g.values[v].producer
        if p < 0:
            return _PENDING
        op = self.g.ops[p]
        src = op.operands[0]
        ss = self.get(src)
        if ss is _PENDING:
            return _PENDING
        out: State
        if isinstance(ss, Split):
            try:
                out = map_view(op.kind, op.aten, self.shape(src), self.shape(v), ss, self.t)
            except _NoMap:
                self.trigger(src)
                out = R
        else:
            out = ss
        self.st[v] = out
        self.origin[v] = self.origin[src]
        return out

    def set(self, v: int, state, origin: frozenset = frozenset(), source: int | None = None) -> None:
        self.st[v] = state
        self.origin[v] = origin if isinstance(state, Split) else frozenset()
        if state == P:
            self.source[v] = self.cur if source is None else source

    def trigger(self, *values: int) -> None:
        """The splits of ``values`` cannot go on: their column-parallel linears (origins) are
        demoted; a sequence-parallel split is all-gathered for the current op instead."""
        for v in values:
            o = self.origin[v]
            if not o:
                raise AssertionError(f"split value {v} has no origin")
            if SEQ in o:
                op = self.g.ops[self.cur]
                ks = [k for k, u in enumerate(op.operands) if u == v]
                if not ks:
                    raise AssertionError(f"sequence-parallel value {v} is not an operand of op {self.cur}")
                for k in ks:
                    self.gather(self.cur, k)
            self.triggers |= o - {SEQ}

    def give_up(self, origin: frozenset, values) -> None:
        """A split of ``origin`` meets what it cannot take (a whole operand along its dim, a
        bias): sequence-parallel ``values`` are gathered, other origins demoted."""
        if SEQ in origin:
            for v in values:
                if SEQ in self.origin[v]:
                    self.trigger(v)
        self.triggers |= origin - {SEQ}

    def is_seq(self, v: int) -> bool:
        return SEQ in self.origin[v]

    def gather(self, i: int, k: int) -> None:
        """Operand ``k`` of op ``i``, split along the sequence, is read whole: an all-gather (one
        per storage and phase, see :class:`Gather`)."""
        if (i, k) in self.gathered:
            return
        self.gathered.add((i, k))
        g = self.g
        v = g.ops[i].operands[k]
        red = self.reductions.get(v)
        chain: list[int] = []
        if self.st[v] == P and red is not None and red.scatter is not None:
            root, reduced = v, True
            if (i, k) in red.uses:
                red.uses.remove((i, k))
        else:
            root, reduced = v, False
            while (p := g.values[root].producer) >= 0:
                op = g.ops[p]
                if not (op.name == "layout" and op.kind in VIEW_KINDS and len(op.operands) == len(op.results) == 1):
                    break
                u = op.operands[0]
                if not (isinstance(self.st[u], Split) and self.is_seq(u)):
                    break
                chain.append(p)
                root = u
        phase = g.ops[i].phase
        ga = self.gathers.get((root, reduced, phase))
        if ga is None:
            ga = self.gathers[root, reduced, phase] = Gather(root, reduced, phase, i)
        ga.uses.append((i, k, tuple(reversed(chain))))

    def decide(self, v: int, desired, origin: frozenset) -> bool:
        """Fix the sharding of the parameter that ``v`` is a view of so that ``v`` gets
        ``desired``; False (and replicated) when no split of the parameter gives it."""
        root = self.s.root_param(v)
        chain = self.s.chain(v) if root != v else []
        if desired is not R:
            rshape = self.shape(root)
            for k in range(len(rshape)):
                n = rshape[k] + desired.pad
                if n % self.t:
                    continue
                cand = Split(k, n // self.t, desired.pad)
                cur, src, ok = cand, root, True
                for p in chain:
                    op = self.g.ops[p]
                    try:
                        cur = map_view(op.kind, op.aten, self.shape(src), self.shape(op.results[0]), cur, self.t)
                    except _NoMap:
                        ok = False
                        break
                    src = op.results[0]
                if ok and cur == desired:
                    self.set(root, cand, origin)
                    return True
        self.set(root, R)
        return False

    def needs_reduce(self, v: int) -> bool:
        """A partial value is reduced for all its consumers as soon as one of them is neither
        a view nor an add/sub (nor an op that reads only its shape)."""
        if v not in self.must:
            must = False
            for j, _k in self.s.consumers[v]:
                op = self.g.ops[j]
                if op.name == "layout" and len(op.operands) == 1 and (op.kind in VIEW_KINDS or op.kind == "clone"):
                    continue
                if op.name == "elementwise" and op.kind in _SHAPE_ONLY | {"add", "sub"}:
                    continue
                if op.name == "reduction" and op.kind in _SUMS and len(op.operands) == 1 and v in self.padded:
                    continue  # a sum of a zero-padded split (a partial sum) is partial
                must = True
                break
            self.must[v] = must
        return self.must[v]

    def reduce(self, i: int, k: int) -> State:
        """Reduce the partial operand ``k`` of op ``i``: an all-reduce (the op reads it
        replicated), or under sequence parallelism a reduce-scatter of an activation (the op
        reads it split along the sequence; the state returned)."""
        v = self.g.ops[i].operands[k]
        red = self.reductions.get(v)
        if red is None:
            scatter = None
            if self.sp and v not in self.s.param_grads:
                scatter = self.s.seq_split(self.shape(v))
            red = self.reductions[v] = AllReduce(
                v,
                self.g.values[v].producer,
                self.source[v],
                scatter=scatter,
                per_step=self.sp and v in self.s.param_grads,
            )
            if scatter is not None:
                self.origin[v] = frozenset((SEQ,))
        if (i, k) not in red.uses:
            red.uses.append((i, k))
        return red.scatter if red.scatter is not None else R

    def read(self, i: int, k: int):
        """State of operand ``k`` of op ``i`` as the op sees it (a partial value that must be
        reduced reads as replicated)."""
        v = self.g.ops[i].operands[k]
        s = self.get(v)
        if s == P and self.needs_reduce(v):
            return self.reduce(i, k)
        return s

    def read_whole_seq(self, i: int, k: int):
        """:meth:`read`, with a sequence-parallel split gathered (GEMMs read whole activations)."""
        s = self.read(i, k)
        if isinstance(s, Split) and self.is_seq(self.g.ops[i].operands[k]):
            self.gather(i, k)
            return R
        return s

    def need_whole(self, i: int, k: int, s=None) -> None:
        """Operand ``k`` of op ``i`` must be replicated."""
        v = self.g.ops[i].operands[k]
        s = self.read(i, k) if s is None else s
        if s is _PENDING:
            self.decide(v, R, frozenset())
        elif s == P:
            if self.reduce(i, k) is not R:
                self.gather(i, k)
        elif isinstance(s, Split):
            self.trigger(v)

    # -- driver -------------------------------------------------------------------------------
    def run(self) -> None:
        for i, op in enumerate(self.g.ops):
            self.cur = i
            getattr(self, f"_op_{op.name}", self._op_default)(i, op)

    def _all_whole(self, i: int, op: TOp) -> None:
        for k in range(len(op.operands)):
            self.need_whole(i, k)
        for r in op.results:
            self.set(r, R)

    _op_default = _all_whole

    # -- matmul -------------------------------------------------------------------------------
    def _op_matmul(self, i: int, op: TOp) -> None:
        t = self.t
        lhs, rhs = op.operands[0], op.operands[1]
        a, b = len(self.shape(lhs)), len(self.shape(rhs))
        out_v = op.results[0]
        r = len(self.shape(out_v))
        if i in self.s.linear_param and self.get(rhs) is _PENDING:
            sl = self.read_whole_seq(i, 0)
            if isinstance(sl, Split) and sl.dim == a - 1:
                if self.decide(rhs, Split(b - 2, sl.inner, sl.pad), self.origin[lhs]):
                    self.row.append(i)
            elif sl is R and i in self.candidates:
                n = self.shape(rhs)[-1]
                pad = self.s.vocab_pad if i in self.s.lm_heads else 0
                if (n + pad) % t:
                    raise ShardError(
                        f"width {t} does not divide the output size {n} of the column-parallel linear "
                        f"{op.module or '?'} in {self.s.layer_name(op.layer)}"
                    )
                origin = frozenset((VOCAB if i in self.s.lm_heads else i,))
                if self.decide(rhs, Split(b - 1, (n + pad) // t, pad), origin):
                    self.column.append(i)
            else:
                self.decide(rhs, R, frozenset())
        sl, sr = self.read_whole_seq(i, 0), self.read_whole_seq(i, 1)
        for k, s in ((0, sl), (1, sr)):
            if s is _PENDING or s == P:
                self.need_whole(i, k, s)
        sl = sl if isinstance(sl, Split) else R
        sr = sr if isinstance(sr, Split) else R
        out: State
        out, parts, bad = R, [], False
        origin = (self.origin[lhs] | self.origin[rhs]) - {SEQ}
        if sl is not R:
            if sl.dim == a - 1:
                if sr is not R and sr.dim == b - 2 and (sr.inner, sr.pad) == (sl.inner, sl.pad):
                    out = P
                else:
                    bad = True
            elif sl.dim == a - 2:
                parts.append(Split(r - 2, sl.inner, sl.pad))
            else:
                o = sl.dim + r - a
                j = o - (r - b)
                if j >= 0 and self.shape(rhs)[j] != 1 and not (sr is not R and sr.dim == j and sr.inner == sl.inner):
                    bad = True
                parts.append(Split(o, sl.inner, sl.pad))
        if sr is not R:
            if sr.dim == b - 2:
                if not (sl is not R and sl.dim == a - 1):
                    bad = True
            elif sr.dim == b - 1:
                parts.append(Split(r - 1, sr.inner, sr.pad))
            else:
                o = sr.dim + r - b
                j = o - (r - a)
                if j >= 0 and self.shape(lhs)[j] != 1 and not (sl is not R and sl.dim == j and sl.inner == sr.inner):
                    bad = True
                parts.append(Split(o, sr.inner, sr.pad))
        if len(set(parts)) > 1:
            bad = True
        if bad:
            self.trigger(*[v for v, s in ((lhs, sl), (rhs, sr)) if s is not R])
            out = R
        elif parts:
            out = parts[0]
        if len(op.operands) > 2:
            out = self._bias(i, op, out, origin)
        self.set(out_v, out, origin)

    def _bias(self, i: int, op: TOp, out, origin: frozenset):
        """The bias of an ``addmm``: split with a column-parallel output, whole otherwise (a
        row-parallel bias is added once, after the reduction, in Megatron)."""
        bias = op.operands[2]
        r, q = len(self.shape(op.results[0])), len(self.shape(bias))
        want = R
        if isinstance(out, Split):
            j = out.dim - (r - q)
            if j >= 0 and self.shape(bias)[j] != 1:
                want = Split(j, out.inner, out.pad)
        sb = self.read(i, 2)
        if sb is _PENDING:
            if want is not R and not self.decide(bias, want, origin):
                self.triggers.update(origin)
                return R
            if want is R:
                self.decide(bias, R, frozenset())
            return out
        if sb == P:
            self.reduce(i, 2)
            sb = R
        if sb != want:
            if isinstance(sb, Split):
                self.trigger(bias)
            self.triggers.update(origin)
            return R
        return out

    # -- elementwise ----------------------------------------------------------------------------
    def _op_elementwise(self, i: int, op: TOp) -> None:
        out_v = op.results[0]
        if op.kind in _SHAPE_ONLY:
            s = self.get(op.operands[0]) if op.operands else R
            origin = self.origin[op.operands[0]] if op.operands else frozenset()
            if s == P and self.sp and op.operands[0] not in self.s.param_grads:
                # (a dropout mask drawn for a partial value: the shape of its reduce-scatter)
                s = self.s.seq_split(self.shape(op.operands[0])) or R
                origin = frozenset((SEQ,))
            if isinstance(s, Split) and len(self.shape(op.operands[0])) == len(self.shape(out_v)):
                self.set(out_v, s, origin)
            else:
                self.set(out_v, R)
            return
        if op.kind == "nll_loss_grad" and len(op.operands) >= 2:
            s = self.read(i, 1)
            for k in range(len(op.operands)):
                if k != 1:
                    self.need_whole(i, k)
            if s == P or s is _PENDING:
                self.need_whole(i, 1, s)
                s = R
            self.set(out_v, s, self.origin[op.operands[1]])
            self.ce_grad.add(out_v)
            return
        states = [self.read(i, k) for k in range(len(op.operands))]
        if any(s == P for s in states):
            # A sum of partials is partial; a replicated addend is added by one device only,
            # so that (R + P) stays partial too (as long as no partial operand is broadcast up).
            if (
                op.kind in ("add", "sub")
                and all(s == P or s is R for s in states)
                and all(self.shape(op.operands[k]) == self.shape(out_v) for k, s in enumerate(states) if s == P)
            ):
                self.set(out_v, P, source=max(self.source[op.operands[k]] for k, s in enumerate(states) if s == P))
                return
            for k, s in enumerate(states):
                if s == P:
                    states[k] = self.reduce(i, k)
        r = len(self.shape(out_v))
        parts = {}
        for k, s in enumerate(states):
            if isinstance(s, Split):
                v = op.operands[k]
                parts[Split(s.dim + r - len(self.shape(v)), s.inner, s.pad)] = v
        if len(parts) > 1:
            self.trigger(*parts.values())
            out = R
        else:
            out = next(iter(parts), R)
        origin = frozenset().union(*(self.origin[v] for v in parts.values())) if parts else frozenset()
        for k, s in enumerate(states):
            if isinstance(s, Split):
                continue
            v = op.operands[k]
            j = out.dim - (r - len(self.shape(v))) if out is not R else -1
            whole = j < 0 or self.shape(v)[j] == 1
            if s is _PENDING:
                if whole:
                    self.decide(v, R, frozenset())
                else:
                    assert isinstance(out, Split)  # not whole: j >= 0, so out is a split
                    if SEQ in origin or not self.decide(v, Split(j, out.inner, out.pad), origin):
                        if SEQ in origin:
                            self.decide(v, R, frozenset())
                        self.give_up(origin, parts.values())
                        out = R
            elif not whole:
                # A replicated operand meets a split one along a full dim: would need a slice.
                self.give_up(origin, parts.values())
                out = R
        self.set(out_v, out, origin)

    # -- reductions, softmax, norms -----------------------------------------------------------------
    def _op_reduction(self, i: int, op: TOp) -> None:
        if op.kind == "nll_loss":
            s = self.read(i, 0)
            for k in range(1, len(op.operands)):
                self.need_whole(i, k)
            rank = len(self.shape(op.operands[0]))
            if isinstance(s, Split) and s.dim == rank - 1:
                self.set(op.results[0], P)
                for rv in op.results[1:]:
                    self.set(rv, R)
                return
            self.need_whole(i, 0, s)
            for rv in op.results:
                self.set(rv, R)
            return
        s = self.read(i, 0)
        for k in range(1, len(op.operands)):
            self.need_whole(i, k)
        v = op.operands[0]
        if s == P and op.kind in _SUMS and len(op.operands) == 1 and v in self.padded:
            for rv in op.results:
                self.set(rv, P, source=self.source[v])
            return
        if not isinstance(s, Split):
            self.need_whole(i, 0, s)
            for rv in op.results:
                self.set(rv, R)
            return
        rank = len(self.shape(v))
        dims = sorted({d % rank for d in op.dims}) if op.dims else list(range(rank))
        if s.dim in dims:
            out = self.shape(op.results[0])
            if op.kind in _SUMS and dims == [s.dim] and len(out) == rank and out[s.dim] > 1:
                # A sum of groups of consecutive rows that keeps the dim: the importer's sum of
                # the repeated heads' gradients back to the key/value heads (``aten = "attention"``).
                group = self.shape(v)[s.dim] // out[s.dim]
                if s.inner % group == 0:  # a device's heads are whole groups: local
                    self.set(op.results[0], Split(s.dim, s.inner // group, 0), self.origin[v])
                    return
                if group % s.inner:  # groups cut across devices unevenly
                    self.trigger(v)
                    self.set(op.results[0], R)
                    return
                # (else a device's heads lie inside one group, which other devices share: partial)
            if op.kind in _SUMS:
                for rv in op.results:
                    self.set(rv, P)
            else:
                self.trigger(v)
                for rv in op.results:
                    self.set(rv, R)
            return
        for rv in op.results:
            keep = len(self.shape(rv)) == rank
            d = s.dim if keep else s.dim - sum(1 for x in dims if x < s.dim)
            self.set(rv, Split(d, s.inner, s.pad), self.origin[v])

    def _from_ce_grad(self, v: int) -> bool:
        for _ in range(16):
            if v in self.ce_grad:
                return True
            p = self.g.values[v].producer
            if p < 0:
                return False
            op = self.g.ops[p]
            if not (
                (op.name == "layout" and len(op.operands) == 1)
                or (op.name == "elementwise" and op.kind in ("convert", "copy"))
            ):
                return False
            v = op.operands[0]
        return False

    def _op_softmax(self, i: int, op: TOp) -> None:
        states = [self.read(i, k) for k in range(len(op.operands))]
        for k, s in enumerate(states):
            if s == P:
                states[k] = self.reduce(i, k)
            elif s is _PENDING:
                self.need_whole(i, k, s)
                states[k] = R
        splits = {s for s in states if isinstance(s, Split)}
        out_v = op.results[0]
        if not splits:
            self.set(out_v, R)
            return
        vs = [op.operands[k] for k, s in enumerate(states) if isinstance(s, Split)]
        if len(splits) > 1 or len(vs) != len(states):
            self.trigger(*vs)
            self.set(out_v, R)
            return
        s = splits.pop()
        rank = len(self.shape(out_v))
        if op.dim % rank == s.dim and any(self.is_seq(v) for v in vs):
            self.trigger(*vs)  # no distributed softmax over the sequence: gathered
            self.set(out_v, R)
            return
        if op.dim % rank == s.dim:
            x = op.operands[0]
            if op.kind in ("softmax", "log_softmax"):
                for kind in ("max", "sum"):
                    self._stat(i, x, s, kind)
            elif not self._from_ce_grad(x):
                self._stat(i, x, s, "sum")
        self.set(out_v, s, self.origin[op.operands[0]])

    def _stat(self, i: int, v: int, s: Split, kind: str) -> None:
        shape = tuple(n for d, n in enumerate(self.shape(v)) if d != s.dim)
        self.stats.append(SoftmaxStat(i, v, s.dim, kind, shape))

    def _op_norm(self, i: int, op: TOp) -> None:
        grad = op.kind.endswith("_grad")
        states = [self.read(i, k) for k in range(len(op.operands))]
        for k, s in enumerate(states):
            if s == P:
                states[k] = self.reduce(i, k)
            elif s is _PENDING:
                self.need_whole(i, k, s)
                states[k] = R
        x = op.operands[1] if grad and len(op.operands) > 1 else op.operands[0]
        rank = len(self.shape(x))
        splits = {s for s in states[: 2 if grad else 1] if isinstance(s, Split)}
        s = next(iter(splits)) if len(splits) == 1 else R
        if len(splits) > 1 or (s is not R and s.dim >= rank - op.normalized_rank):
            self.trigger(*[v for v, st in zip(op.operands, states) if isinstance(st, Split)])
            s = R
        elif s is R:
            for k, st in enumerate(states):
                if isinstance(st, Split):
                    self.trigger(op.operands[k])
        origin = frozenset().union(*(self.origin[v] for v in op.operands))
        for rv in op.results:
            if s is R:
                self.set(rv, R)
            elif len(self.shape(rv)) == rank and self.shape(rv)[s.dim] == self.shape(x)[s.dim]:
                self.set(rv, s, origin)
            else:
                self.set(rv, P)  # a parameter gradient summed over the split dim

    # -- embeddings ---------------------------------------------------------------------------------
    def _op_embedding(self, i: int, op: TOp) -> None:
        out_v = op.results[0]
        for k in range(1, len(op.operands)):
            self.need_whole(i, k)
        if op.kind == "lookup":
            table = op.operands[0]
            if self.get(table) is _PENDING:
                if self.vocab and i in self.s.word_lookups:
                    n = self.s.padded_vocab
                    self.decide(table, Split(0, n // self.t, self.s.vocab_pad), frozenset((VOCAB,)))
                else:
                    self.decide(table, R, frozenset())
            ts = self.get(table)
            if isinstance(ts, Split) and ts.dim == 0:
                self.set(out_v, P)
            else:
                self.need_whole(i, 0, ts)
                self.set(out_v, R)
            return
        # grad: its result is the gradient of the table looked up with the same indices.
        grad_table = self.s.emb_grad_table.get(i)
        ts = self.get(grad_table) if grad_table is not None else R
        if ts is _PENDING:
            ts = R
        self.need_whole(i, 0)
        if isinstance(ts, Split) and ts.dim == 0:
            assert grad_table is not None  # a split state comes from the table
            self.set(out_v, ts, self.origin[grad_table])
        else:
            self.set(out_v, R)

    # -- layout -------------------------------------------------------------------------------------
    def _op_layout(self, i: int, op: TOp) -> None:
        if op.kind in ("cat", "stack"):
            return self._cat(i, op)
        if len(op.operands) != 1:
            return self._all_whole(i, op)
        v = op.operands[0]
        s = self.read(i, 0)
        if s is _PENDING:
            if self.s.is_chain_op(op):
                for rv in op.results:
                    self.st[rv] = _PENDING  # resolved when the parameter is decided
                return
            self.decide(v, R, frozenset())
            s = R
        if s == P:
            if op.kind in VIEW_KINDS or op.kind == "clone":
                for rv in op.results:
                    self.set(rv, P, source=self.source[v])
                    if v in self.padded:
                        self.padded.add(rv)
                return
            s = self.reduce(i, 0)
        if s is R:
            d = self.s.head_repeats.get(i) if i in self.repeats else None
            if d is not None and (n := self.shape(op.results[0])[d]) % self.t == 0:
                # A replicated key/value tensor repeated into the query heads: each device makes
                # the copies its own query heads read (Megatron's layout when kv < width).
                self.set(op.results[0], Split(d, n // self.t), frozenset((i,)))
                return
            for rv in op.results:
                self.set(rv, R)
            return
        src = self.shape(v)
        if op.kind in ("split", "unbind"):
            self._split(i, op, s)
            return
        try:
            for rv in op.results:
                self.set(rv, map_view(op.kind, op.aten, src, self.shape(rv), s, self.t), self.origin[v])
        except _NoMap:
            if (
                op.kind in ("view", "reshape")
                and not s.pad
                and not self.is_seq(v)
                and self.g.values[v].producer >= 0
                and self._summed_only(op.results[0])
            ):
                # A view the split cannot pass (a gradient of transformers' repeat_kv with fewer
                # key/value heads than devices: [b, heads, s, d] -> [b, kv, groups, s, d]) that
                # only sums read: the split is zero-padded into a partial sum.
                self.pad(i, 0)
                self.set(op.results[0], P, source=i)
                self.padded.add(op.results[0])
                return
            self.trigger(v)
            for rv in op.results:
                self.set(rv, R)

    def _summed_only(self, v: int) -> bool:
        """Is ``v`` read only by sums (through views)?"""
        uses = self.s.consumers[v]
        for j, _k in uses:
            op = self.g.ops[j]
            if op.name == "reduction" and op.kind in _SUMS:
                continue
            if op.name == "layout" and op.kind in VIEW_KINDS and len(op.operands) == len(op.results) == 1:
                if self._summed_only(op.results[0]):
                    continue
            return False
        return bool(uses)

    def pad(self, i: int, k: int) -> None:
        """Operand ``k`` of op ``i``, split, is read zero-padded to its whole shape: a partial sum."""
        v = self.g.ops[i].operands[k]
        pad = self.pads.get(v)
        if pad is None:
            pad = self.pads[v] = Pad(v, self.g.values[v].producer)
        pad.uses.append((i, k))

    def _split(self, i: int, op: TOp, s: Split) -> None:
        v = op.operands[0]
        src = self.shape(v)
        if op.kind == "unbind":
            try:
                for rv in op.results:
                    self.set(rv, map_view("select", op.aten, src, self.shape(rv), s, self.t), self.origin[v])
            except _NoMap:
                self.trigger(v)
                for rv in op.results:
                    self.set(rv, R)
            return
        cut = {d for rv in op.results for d, (a, b) in enumerate(zip(src, self.shape(rv))) if a != b}
        if s.dim not in cut:
            for rv in op.results:
                self.set(rv, s, self.origin[v])
            return
        # Split along the sharded dim (GPT-2's fused QKV): every device holds its share of
        # every piece (Megatron orders the fused weight's columns that way).
        pieces = [self.shape(rv)[s.dim] for rv in op.results]
        if s.pad or len(cut) != 1 or any(n % self.t for n in pieces):
            bad = [n for n in pieces if n % self.t]
            if bad and not s.pad:
                raise ShardError(
                    f"width {self.t} does not divide the size {bad[0]} of the pieces that op "
                    f"{op.aten or op.kind} in {self.s.layer_name(op.layer)} splits a sharded tensor into"
                )
            self.trigger(v)
            for rv in op.results:
                self.set(rv, R)
            return
        for rv, n in zip(op.results, pieces):
            self.set(rv, Split(s.dim, n // self.t, 0), self.origin[v])

    def _cat(self, i: int, op: TOp) -> None:
        out_v = op.results[0]
        out = self.shape(out_v)
        live = [k for k, v in enumerate(op.operands) if math.prod(self.shape(v)) > 0]
        states = {k: self.read(i, k) for k in live}
        for k, s in states.items():
            if s == P:
                states[k] = self.reduce(i, k)
            elif s is _PENDING:
                self.need_whole(i, k, s)
                states[k] = R
        splits = [s for s in states.values() if isinstance(s, Split)]
        if not splits:
            self.set(out_v, R)
            return
        vs = [op.operands[k] for k, s in states.items() if isinstance(s, Split)]
        origin = frozenset().union(*(self.origin[v] for v in vs))
        if len(splits) != len(states) or len({(s.dim, s.pad) for s in splits}) > 1:
            self.trigger(*vs)
            self.set(out_v, R)
            return
        s = splits[0]
        if op.kind == "stack":
            new = _inserted_dim(self.shape(op.operands[live[0]]), out)
            if len(set(splits)) > 1 or not new:
                self.trigger(*vs)
                self.set(out_v, R)
                return
            d = s.dim + (1 if new[0] <= s.dim else 0)
            self.set(out_v, Split(d, s.inner, s.pad), origin)
            return
        cat_dims = {d for k in live for d, (a, b) in enumerate(zip(self.shape(op.operands[k]), out)) if a != b}
        if s.dim in cat_dims:
            if s.pad or out[s.dim] % self.t:
                self.trigger(*vs)
                self.set(out_v, R)
                return
            self.set(out_v, Split(s.dim, out[s.dim] // self.t, 0), origin)
            return
        if len(set(splits)) > 1:
            self.trigger(*vs)
            self.set(out_v, R)
            return
        self.set(out_v, s, origin)

    # -- optimizer and results ----------------------------------------------------------------------
    def _match_param(self, i: int, k: int, param: int) -> None:
        """Operand ``k`` of op ``i`` is the gradient of ``param``: same sharding."""
        sp = self.get(param)
        if sp is _PENDING:
            self.decide(param, R, frozenset())
            sp = R
        sg = self.read(i, k)
        if sg == P:
            self.reduce(i, k)
            sg = R
        if sg is _PENDING:
            sg = R
        if sg != sp:
            if isinstance(sp, Split) and isinstance(sg, Split) and sp.dim == sg.dim and sp.pad == sg.pad:
                return
            if isinstance(sp, Split):
                self.trigger(param)
            if isinstance(sg, Split):
                self.trigger(self.g.ops[i].operands[k])

    def _op_optimizer_update(self, i: int, op: TOp) -> None:
        param = op.operands[0]
        self._match_param(i, 1, param)
        sp = self.get(param)
        self.set(op.results[0], sp, self.origin[param])

    def _op_return(self, i: int, op: TOp) -> None:
        for k in range(len(op.operands)):
            role = op.result_roles[k] if k < len(op.result_roles) else ""
            param = op.result_params[k] if k < len(op.result_params) else -1
            if role in ("grad", "updated") and param >= 0:
                self._match_param(i, k, param)
            else:
                self.need_whole(i, k)


# ------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------


#: Share of the forward linears' FLOPs outside the blocks above which their staying replicated
#: is said (an MLP's input and output layers weigh less).
OUTSIDE_SHARE = 0.1


def _replicated_linears(s: _Structure, sharded: set[int], demoted: list[int]) -> list[Replicated]:
    """Linears that stay replicated where Megatron would shard them: the key/value projections
    of grouped-query attention with fewer key/value heads than the width, block linears demoted
    (an op of the block cannot take the split, e.g. an unpriced one) and a large share of linear
    FLOPs outside the blocks (e.g. a T5 encoder, whose blocks the layer grouping counts as
    prologue when it takes the decoder's as the blocks)."""
    g, t = s.g, s.t
    notes = []

    def flops(i: int) -> int:
        op = g.ops[i]
        return 2 * math.prod(g.values[op.results[0]].shape) * g.values[op.operands[0]].shape[-1]

    total_flops = sum(flops(i) for i in s.linear_param)

    def share(ops) -> float:
        return sum(flops(i) for i in ops) / total_flops if total_flops else 0.0

    # (every forward linear of a step without repeated blocks, as shard() takes them)
    block_linears = sum(1 for i in s.linear_param if g.ops[i].layer in s.block_layers or not s.block_layers)
    kv = sorted(i for i in s.kv_replicated if i not in sharded)
    if kv:
        op = g.ops[kv[0]]
        heads, q_heads = s.kv_linears[kv[0]]
        notes.append(
            Replicated(
                "kv_heads",
                len(kv),
                block_linears,
                op.module or "?",
                share(kv),
                f"tensor parallelism (width {t}) keeps the {len(kv)} key/value projections of grouped-query "
                f"attention replicated (first: {op.module or '?'} in {s.layer_name(op.layer)}): {heads} key/value "
                f"heads for {t} devices, each device computes every key/value head and repeats the one that its "
                f"query heads ({q_heads // t} of {q_heads}) read; their FLOPs ({100 * share(kv):.0f} % of the linear "
                "FLOPs) are not divided, and the backward all-reduces their output gradients (Megatron-core instead "
                "splits the fused QKV GEMM and all-gathers its output)",
            )
        )
    in_blocks = [i for i in demoted if g.ops[i].layer in s.block_layers]
    if in_blocks:
        op = g.ops[in_blocks[0]]
        notes.append(
            Replicated(
                "demoted",
                len(in_blocks),
                block_linears,
                op.module or "?",
                share(in_blocks),
                f"tensor parallelism (width {t}) keeps {len(in_blocks)} of the {block_linears} linears of the "
                f"blocks replicated (first: {op.module or '?'} in {s.layer_name(op.layer)}): an op between them "
                "cannot take the split; their FLOPs are not divided",
            )
        )
    outside = [i for i in sorted(s.linear_param) if g.ops[i].layer not in s.block_layers and i not in sharded]
    if s.block_layers and share(outside) > OUTSIDE_SHARE:
        op = g.ops[outside[0]]
        notes.append(
            Replicated(
                "outside_blocks",
                len(outside),
                len(s.linear_param),
                op.module or "?",
                share(outside),
                f"tensor parallelism (width {t}) keeps {len(outside)} linears outside the repeated blocks "
                f"replicated, {100 * share(outside):.0f} % of the linear FLOPs (first: {op.module or '?'} in "
                f"{s.layer_name(op.layer)}): only linears of the blocks are sharded",
            )
        )
    return notes


def _local(shape: tuple[int, ...], st: Split, width: int) -> tuple[int, ...]:
    n = shape[st.dim] + st.pad
    if n % width or n // width % st.inner:
        raise AssertionError(f"a value of shape {shape} cannot take split {st}")
    out = list(shape)
    out[st.dim] = n // width
    return tuple(out)


def shard(graph: TGraph, width: int, vocab_multiple: int = 128, sequence_parallel: bool = False) -> ShardPlan:
    """Shard ``graph`` over a tensor-parallel group of ``width`` devices (see the module
    docstring); with ``sequence_parallel``, Megatron's sequence parallelism on top.  Raises
    :class:`ShardError` for a width the model cannot take."""
    if width < 1:
        raise ShardError(f"width {width}: expected a positive integer")
    if width == 1:
        return ShardPlan(1, {}, [R] * len(graph.values), [], [], [], [], [], 0, 0, [], 0)
    if sequence_parallel:
        if graph.seq_len < 1:
            raise ShardError("sequence parallelism needs the sequence length traced (phaze.seq_len)")
        if graph.seq_len % width:
            raise ShardError(
                f"width {width} does not divide the sequence length {graph.seq_len} (sequence parallelism)"
            )
    s = _Structure(graph, width, vocab_multiple)
    # Column-parallel candidates: the linears of the blocks (every forward linear when the step
    # has no repeated blocks, e.g. a single-block toy) and the LM head.
    # The key/value projections of grouped-query attention with fewer key/value heads than
    # devices stay replicated (_Structure._check_heads).
    candidates = {
        i for i in s.linear_param if graph.ops[i].layer in s.block_layers or not s.block_layers
    } - s.kv_replicated | set(s.lm_heads)
    repeats = set(s.head_repeats)
    vocab = bool(s.word_lookups)
    demoted: list[int] = []
    rounds = 0
    while True:
        rounds += 1
        rnd = _Round(s, candidates if vocab else candidates - s.lm_heads, vocab, sequence_parallel, repeats)
        rnd.run()
        if not rnd.triggers:
            break
        if rounds > len(candidates) + len(s.head_repeats) + 2:
            raise AssertionError("tensor-parallel propagation does not settle")
        if VOCAB in rnd.triggers:
            vocab = False
        for o in sorted(rnd.triggers - {VOCAB}):
            if o in candidates:
                candidates.discard(o)
                demoted.append(o)
            repeats.discard(o)  # a local repeat whose split cannot go on: repeated whole
    shapes: dict[int, tuple[int, ...]] = {}
    states = []
    for v, val in enumerate(graph.values):
        st = rnd.get(v)
        if st is _PENDING:
            st = R
        states.append(st)
        if isinstance(st, Split):
            shapes[v] = _local(val.shape, st, width)
    all_reduces = sorted(rnd.reductions.values(), key=lambda a: a.value)
    # The LM head is sharded too when the vocabulary split survived (vocabulary-parallel).
    vocab_parallel = s.lm_heads if vocab else set()
    notes = _replicated_linears(s, set(rnd.column) | set(rnd.row) | vocab_parallel, demoted)
    for red in all_reduces:
        if red.scatter is not None:
            red.scatter_shape = _local(graph.values[red.value].shape, red.scatter, width)
    return ShardPlan(
        width=width,
        shapes=shapes,
        states=states,
        all_reduces=all_reduces,
        stats=rnd.stats,
        column=sorted(rnd.column),
        row=sorted(rnd.row),
        vocab_tables=sorted(
            {t for i in s.word_lookups if isinstance(states[t := s.root_param(graph.ops[i].operands[0])], Split)}
        ),
        vocab_size=s.vocab_size if vocab else 0,
        padded_vocab_size=s.padded_vocab if vocab else 0,
        demoted=sorted(demoted),
        rounds=rounds,
        gathers=sorted(rnd.gathers.values(), key=lambda a: (a.before_op, a.value, a.reduced)),
        sequence_parallel=sequence_parallel,
        replicated=notes,
        pads=sorted(rnd.pads.values(), key=lambda p: p.value),
        kv_replicated=sorted(s.kv_replicated),
    )
