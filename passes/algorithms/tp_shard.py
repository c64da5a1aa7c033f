"""Megatron-style tensor parallelism on a training step, by sharding propagation.

The input is the whole training step (forward, backward, optimizer) as a light graph of ops on
tensors with static shapes (:class:`TGraph`); the output (:class:`ShardPlan`) is what one device
of a tensor-parallel group of width ``t`` runs: the local shape of every value, the all-reduces
The work is split in four modules, the shape of xDSL's rewrite patterns:

- ``tp_lattice.py``: the sharding states (the lattice: :data:`REPLICATED`, :class:`Split`
  ``(dim, inner, pad)``, :data:`PARTIAL`, and :data:`PENDING` for a parameter not decided yet)
  and how a split maps through a view;
- ``tp_structure.py``: the input graph (:class:`TGraph`) and the structure found on it once
  (linears, LM head, attention heads, head repeats);
- ``tp_propagation.py``: the driver (:class:`~passes.algorithms.tp_propagation.Propagation`:
  walks the ops, asks the rule of each op kind, inserts collectives where layouts meet) and
  the collectives it records;
- ``tp_rules.py``: one documented rule per op kind, in the table
  :data:`~passes.algorithms.tp_rules.RULES`.

This module runs rounds of propagation until no split needs demoting (:func:`shard`) and
assembles the :class:`ShardPlan`.
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

Propagation rules per op kind (``tp_rules.py``): matmul (column, row, batched with split batch
dims), elementwise (broadcast-aware; a replicated parameter meeting a split operand, e.g. a
bias, is split with it), views and copies (the split dim is mapped through reshapes by its flat
stride, through transposes/permutes by the permutation read off the shapes), split/cat (the
fused QKV of GPT-2 is split along the sharded dim: each device holds its heads' q, k and v,
Megatron's layout), reductions (a sum over the split dim is partial), softmax (a softmax over a
split dim is the distributed one), norms (need the normalized dims whole), embeddings, the
optimizer step and the function's results.  Backward ops follow the same rules, so weight
gradients of split weights come out split (no communication) and the input gradient of a
column-parallel linear comes out partial.

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
(:class:`Replicated`); those Megatron keeps replicated by design (multi-latent attention's down
projections, whose latents are normalized whole, and MoE routers:
``GraphStructure.by_design``) are never column-parallel candidates and not reported
(``ShardPlan.by_design``); under sequence parallelism the down projections run on the device's
tokens (docs/design.md §5.2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from passes.algorithms.tp_lattice import (
    PARTIAL,
    PENDING,
    REPLICATED,
    SEQUENCE_ORIGIN,
    VOCAB_ORIGIN,
    ShardError,
    Split,
    SplitCannotPass,
    State,
    map_view,
    permute_split,
    reshape_split,
)
from passes.algorithms.tp_propagation import AllReduce, Gather, Pad, Propagation, SoftmaxStat
from passes.algorithms.tp_rules import RULES, rule_for
from passes.algorithms.tp_structure import GraphStructure, TGraph, TOp, TValue

__all__ = [
    "PARTIAL",
    "PENDING",
    "REPLICATED",
    "RULES",
    "SEQUENCE_ORIGIN",
    "VOCAB_ORIGIN",
    "AllReduce",
    "Gather",
    "Pad",
    "Replicated",
    "ShardError",
    "ShardPlan",
    "SoftmaxStat",
    "Split",
    "SplitCannotPass",
    "State",
    "TGraph",
    "TOp",
    "TValue",
    "map_view",
    "permute_split",
    "reshape_split",
    "shard",
]


@dataclass
class Replicated:
    """Linears that stay replicated where Megatron would shard them, said in one line
    (``message``): ``reason`` ``kv_heads`` (the key/value projections of grouped-query
    attention with fewer key/value heads than the width), ``demoted`` (block linears an op
    between them kept from splitting), ``outside_blocks`` (forward linears outside the blocks
    holding more than :data:`OUTSIDE_SHARE` of the linear FLOPs) or ``weights`` (matrices the
    blocks read that stay whole though no other note says so: what no rule recognized as a
    linear, e.g. a weight read through an op the structure does not see); ``count`` of them out of
    ``total`` (the linears of the blocks, all of them in a step without blocks; all forward
    linears for ``outside_blocks``), the
    ``module`` of the first, and the share of the forward linears' FLOPs they hold."""

    reason: str
    count: int
    total: int
    module: str
    flops_share: float
    message: str
    #: Their weights' share of the step's parameters (elements).
    param_share: float = 0.0


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
    #: The linears kept replicated as Megatron runs them (op -> ``"latent"`` or ``"router"``:
    #: ``GraphStructure.by_design``), not said as kept whole.
    by_design: dict[int, str] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------
# Rounds of propagation, and the plan
# ------------------------------------------------------------------------------------------


#: Share of the forward linears' FLOPs outside the blocks above which their staying replicated
#: is said (an MLP's input and output layers weigh less).
OUTSIDE_SHARE = 0.1


def _replicated_linears(s: GraphStructure, sharded: set[int], demoted: list[int]) -> list[Replicated]:
    """Linears that stay replicated where Megatron would shard them: the key/value projections
    of grouped-query attention with fewer key/value heads than the width, block linears demoted
    (an op of the block cannot take the split, e.g. an unpriced one) and a large share of linear
    FLOPs outside the blocks (e.g. a T5 encoder, whose blocks the layer grouping counts as
    prologue when it takes the decoder's as the blocks)."""
    g, t = s.graph, s.width
    notes = []

    def flops(i: int) -> int:
        op = g.ops[i]
        return 2 * math.prod(g.values[op.results[0]].shape) * g.values[op.operands[0]].shape[-1]

    total_flops = sum(flops(i) for i in s.linear_param)

    def share(ops) -> float:
        return sum(flops(i) for i in ops) / total_flops if total_flops else 0.0

    def weights(ops) -> float:
        return param_share(g, {s.linear_param[i] for i in ops})

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
                weights(kv),
            )
        )
    # (a linear demoted from column-parallel that a later round made row-parallel is split)
    in_blocks = [i for i in demoted if g.ops[i].layer in s.block_layers and i not in sharded]
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
                weights(in_blocks),
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
                weights(outside),
            )
        )
    return notes


def param_share(g: TGraph, params: set[int]) -> float:
    """The share of the step's parameter elements that the parameter values ``params`` hold."""
    total = sum(math.prod(v.shape) for v in g.values if v.role == "param")
    return sum(math.prod(g.values[p].shape) for p in params) / total if total else 0.0


def _unsaid_weights(s: GraphStructure, states: list, notes: list[Replicated], said: set[int]) -> None:
    """A note (``weights``) for the matrices that ops of the blocks read and that stay whole,
    other than those ``said`` (the linears' weights the other notes name) and the tables looked
    up (position embeddings stay whole in Megatron too): the safety net under the rules, so a
    weight no rule recognized is said rather than priced whole in silence."""
    g = s.graph
    if not s.block_layers:
        return
    block_params = [
        v
        for v, val in enumerate(g.values)
        if val.role == "param"
        and len(val.shape) >= 2
        and any(g.ops[i].layer in s.block_layers for i, _ in s.consumers[v])
    ]
    tables = {s.root_param(op.operands[0]) for op in g.ops if op.name == "embedding" and op.operands}
    whole = [v for v in block_params if not isinstance(states[v], Split) and v not in said and v not in tables]
    if not whole:
        return
    first = next(g.ops[i] for i, _ in s.consumers[whole[0]] if g.ops[i].layer in s.block_layers)
    share = param_share(g, set(whole))
    notes.append(
        Replicated(
            "weights",
            len(whole),
            len(block_params),
            first.module or "?",
            0.0,
            f"tensor parallelism (width {s.width}) keeps {len(whole)} of the {len(block_params)} weight matrices of "
            f"the blocks whole (first read by {first.module or '?'} in {s.layer_name(first.layer)}), "
            f"{100 * share:.1f} % of the parameters: no rule recognized them as a linear's; each device holds, "
            "computes and updates them whole",
            share,
        )
    )


def _local(shape: tuple[int, ...], split: Split, width: int) -> tuple[int, ...]:
    """The local shape of a value of global ``shape`` split so over ``width`` devices."""
    n = shape[split.dim] + split.pad
    if n % width or n // width % split.inner:
        raise AssertionError(f"a value of shape {shape} cannot take split {split}")
    out = list(shape)
    out[split.dim] = n // width
    return tuple(out)


def shard(graph: TGraph, width: int, vocab_multiple: int = 128, sequence_parallel: bool = False) -> ShardPlan:
    """Shard ``graph`` over a tensor-parallel group of ``width`` devices (see the module
    docstring); with ``sequence_parallel``, Megatron's sequence parallelism on top.  Raises
    :class:`ShardError` for a width the model cannot take.

    Rounds of propagation (:class:`~passes.algorithms.tp_propagation.Propagation` with the rules
    of :data:`~passes.algorithms.tp_rules.RULES`) run until one demotes nothing: each round's
    refused origins (column-parallel linears, the vocabulary split, local head repeats) are
    made replicated for the next."""
    if width < 1:
        raise ShardError(f"width {width}: expected a positive integer")
    if width == 1:
        return ShardPlan(1, {}, [REPLICATED] * len(graph.values), [], [], [], [], [], 0, 0, [], 0)
    if sequence_parallel:
        if graph.seq_len < 1:
            raise ShardError("sequence parallelism needs the sequence length traced (phaze.seq_len)")
        if graph.seq_len % width:
            raise ShardError(
                f"width {width} does not divide the sequence length {graph.seq_len} (sequence parallelism)"
            )
    structure = GraphStructure(graph, width, vocab_multiple)
    # Column-parallel candidates: the linears of the blocks (every forward linear when the step
    # has no repeated blocks, e.g. a single-block toy) and the LM head.
    # The key/value projections of grouped-query attention with fewer key/value heads than
    # devices stay replicated (GraphStructure._check_heads), and so do the linears Megatron
    # keeps replicated by design (MLA's down projections, MoE routers: GraphStructure.by_design).
    candidates = {
        i for i in structure.linear_param if graph.ops[i].layer in structure.block_layers or not structure.block_layers
    } - structure.kv_replicated - set(structure.by_design) | set(structure.lm_heads)
    local_repeats = set(structure.head_repeats)
    vocab_parallel = bool(structure.word_lookups)
    demoted: list[int] = []
    rounds = 0
    while True:
        rounds += 1
        prop = Propagation(
            structure,
            candidates if vocab_parallel else candidates - structure.lm_heads,
            vocab_parallel,
            sequence_parallel,
            local_repeats,
        )
        prop.run(rule_for)
        if not prop.to_demote:
            break
        if rounds > len(candidates) + len(structure.head_repeats) + 2:
            raise AssertionError("tensor-parallel propagation does not settle")
        if VOCAB_ORIGIN in prop.to_demote:
            vocab_parallel = False
        for o in sorted(prop.to_demote - {VOCAB_ORIGIN}):
            if o in candidates:
                candidates.discard(o)
                demoted.append(o)
            local_repeats.discard(o)  # a local repeat whose split cannot go on: repeated whole
    return _plan(prop, vocab_parallel, demoted, rounds)


def _plan(prop: Propagation, vocab_parallel: bool, demoted: list[int], rounds: int) -> ShardPlan:
    """The plan of the last round ``prop`` (the one that demoted nothing)."""
    structure, graph, width = prop.structure, prop.graph, prop.width
    shapes: dict[int, tuple[int, ...]] = {}
    states = []
    for v, val in enumerate(graph.values):
        state = prop.state(v)
        if state is PENDING:
            state = REPLICATED
        states.append(state)
        if isinstance(state, Split):
            shapes[v] = _local(val.shape, state, width)
    all_reduces = sorted(prop.all_reduces.values(), key=lambda a: a.value)
    # The LM head is sharded too when the vocabulary split survived (vocabulary-parallel).
    vocab_heads = structure.lm_heads if vocab_parallel else set()
    sharded = set(prop.column_parallel) | set(prop.row_parallel) | vocab_heads
    notes = _replicated_linears(structure, sharded, demoted)
    said = {
        structure.linear_param[i]
        for i in set(demoted) | structure.kv_replicated | set(structure.by_design)
        if i in structure.linear_param
    }
    if any(n.reason == "outside_blocks" for n in notes):
        said |= {p for i, p in structure.linear_param.items() if graph.ops[i].layer not in structure.block_layers}
    _unsaid_weights(structure, states, notes, said)
    for red in all_reduces:
        if red.scatter is not None:
            red.scatter_shape = _local(graph.values[red.value].shape, red.scatter, width)
    tables = {structure.root_param(graph.ops[i].operands[0]) for i in structure.word_lookups}
    return ShardPlan(
        width=width,
        shapes=shapes,
        states=states,
        all_reduces=all_reduces,
        stats=prop.softmax_stats,
        column=sorted(prop.column_parallel),
        row=sorted(prop.row_parallel),
        vocab_tables=sorted(t for t in tables if isinstance(states[t], Split)),
        vocab_size=structure.vocab_size if vocab_parallel else 0,
        padded_vocab_size=structure.padded_vocab if vocab_parallel else 0,
        demoted=sorted(demoted),
        rounds=rounds,
        gathers=sorted(prop.gathers.values(), key=lambda a: (a.before_op, a.value, a.reduced)),
        sequence_parallel=prop.sequence_parallel,
        replicated=notes,
        pads=sorted(prop.pads.values(), key=lambda p: p.value),
        kv_replicated=sorted(structure.kv_replicated),
        by_design={i: why for i, why in sorted(structure.by_design.items()) if i not in sharded},
    )
