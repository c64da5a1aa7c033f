"""The sharding rules of tensor parallelism: one per op kind, in the table :data:`RULES`.

A rule is a function ``rule(prop, i, op)`` (:data:`~passes.algorithms.tp_propagation.Rule`):
it reads the states of op ``i``'s operands from the propagation ``prop`` (``prop.operand``,
which reduces a partial value that must be whole), says what the op needs (``require_whole``,
``decide_param`` for a parameter not decided yet, ``refuse_split`` for a split the op cannot
take) and sets the states of its results (``set_state``).  The driver
(:meth:`Propagation.run <passes.algorithms.tp_propagation.Propagation.run>`) calls, for every
op, the rule that :func:`rule_for` finds: the entry of ``(op name, kind)`` if there is one, else
of the op name, else :func:`whole_operands`.  Backward ops follow the same rules as forward ones
(a backward GEMM is a matmul), so weight gradients of split weights come out split and the
input gradient of a column-parallel linear comes out partial, as in Megatron-LM.

The layouts are Megatron-LM's (Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion
Parameter Language Models Using Model Parallelism", §3; ``megatron/core/tensor_parallel/``):
column- and row-parallel linears (``layers.py``: ``ColumnParallelLinear``,
``RowParallelLinear``), the vocabulary-parallel embedding (``VocabParallelEmbedding``) and
cross-entropy (``cross_entropy.py``), and with sequence parallelism (Korthikanti et al. 2022)
the reduce-scatters and all-gathers of ``mappings.py``.  The fused attention of the importer
has no rule of its own: it arrives expanded into batched matmuls, a softmax and the head
repeats of grouped-query attention, each taken by its rule below.
"""

from __future__ import annotations

import math

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
    inserted_dims,
    map_view,
)
from passes.algorithms.tp_propagation import (
    SHAPE_ONLY_KINDS,
    SUM_KINDS,
    Propagation,
    Rule,
    SoftmaxStat,
)
from passes.algorithms.tp_structure import VIEW_KINDS, TOp

# ------------------------------------------------------------------------------------------
# Opaque ops
# ------------------------------------------------------------------------------------------


def whole_operands(prop: Propagation, i: int, op: TOp) -> None:
    """Every operand whole, every result replicated: the rule of an op phaze knows nothing about
    (``phaze.opaque``, e.g. an ``aten`` op the importer could not price) and of any op kind
    without a rule.  A split operand is refused (its linears demoted, a sequence split
    gathered), a partial one reduced."""
    for k in range(len(op.operands)):
        prop.require_whole(i, k)
    for r in op.results:
        prop.set_state(r, REPLICATED)


# ------------------------------------------------------------------------------------------
# Matmul
# ------------------------------------------------------------------------------------------


def matmul(prop: Propagation, i: int, op: TOp) -> None:
    """A matmul (a linear, a batched matmul of activations, a backward GEMM).

    A *linear* whose weight is not decided yet decides it (:func:`_shard_linear_weight`).  Then
    the result follows the operands: split along the contracted dim on both sides (the inner
    factor alike) gives a partial sum (Megatron's row-parallel GEMM, and the input gradient of
    a column-parallel one); the lhs split along its rows or the rhs along its columns splits
    the result there (column-parallel); a split batch dim (the attention heads) stays split.
    Any other combination refuses the splits.  A GEMM reads a sequence-parallel activation
    all-gathered, as Megatron-SP's column-parallel linear does.  A bias (``addmm``) is taken
    by :func:`_linear_bias`.
    """
    lhs, rhs = op.operands[0], op.operands[1]
    out_v = op.results[0]
    if i in prop.structure.linear_param and prop.state(rhs) is PENDING:
        _shard_linear_weight(prop, i, op)
    sl, sr = prop.operand_gathered(i, 0), prop.operand_gathered(i, 1)
    for k, s in ((0, sl), (1, sr)):
        if s is PENDING or s == PARTIAL:
            prop.require_whole(i, k, s)
    sl = sl if isinstance(sl, Split) else REPLICATED
    sr = sr if isinstance(sr, Split) else REPLICATED
    origin = (prop.origins[lhs] | prop.origins[rhs]) - {SEQUENCE_ORIGIN}
    if op.module in prop.structure.sequence_local and (prop.is_sequence_split(lhs) or prop.is_sequence_split(rhs)):
        origin |= {SEQUENCE_ORIGIN}  # (a duplicated linear on its own tokens: the split is the sequence's)
    out, parts, bad = _matmul_result(prop, op, sl, sr)
    if bad:
        prop.refuse_split(*[v for v, s in ((lhs, sl), (rhs, sr)) if s is not REPLICATED])
        out = REPLICATED
    elif parts:
        out = parts[0]
    if len(op.operands) > 2:
        out = _linear_bias(prop, i, op, out, origin)
    prop.set_state(out_v, out, origin)


def _shard_linear_weight(prop: Propagation, i: int, op: TOp) -> None:
    """Decide the weight of linear ``i``: **row-parallel** (weight split along its input dim)
    when its input is split along the contracted dim, **column-parallel** (weight split along
    its output dim, origin the linear, or :data:`VOCAB_ORIGIN` for the LM head, padded) when its
    input is replicated and the linear is a candidate, else replicated.  So "row" is exactly
    "fed, through elementwise ops, views, softmax and batched matmuls, by column outputs", as
    Megatron pairs its column- and row-parallel linears.  A width that does not divide a
    column-parallel output is refused."""
    t = prop.width
    lhs, rhs = op.operands[0], op.operands[1]
    a, b = len(prop.shape(lhs)), len(prop.shape(rhs))
    sl = prop.operand_gathered(i, 0)
    if isinstance(sl, Split) and sl.dim == a - 1:
        if prop.decide_param(rhs, Split(b - 2, sl.inner, sl.pad), prop.origins[lhs]):
            prop.row_parallel.append(i)
    elif sl is REPLICATED and i in prop.column_candidates:
        n = prop.shape(rhs)[-1]
        pad = prop.structure.vocab_pad if i in prop.structure.lm_heads else 0
        if (n + pad) % t:
            raise ShardError(
                f"width {t} does not divide the output size {n} of the column-parallel linear "
                f"{op.module or '?'} in {prop.structure.layer_name(op.layer)}"
            )
        origin = frozenset((VOCAB_ORIGIN if i in prop.structure.lm_heads else i,))
        if prop.decide_param(rhs, Split(b - 1, (n + pad) // t, pad), origin):
            prop.column_parallel.append(i)
    else:
        prop.decide_param(rhs, REPLICATED, frozenset())


def _matmul_result(prop: Propagation, op: TOp, sl: State, sr: State) -> tuple[State, list[Split], bool]:
    """The state of a matmul's result from its operands' (``sl``, ``sr``: split or replicated):
    partial (contracted dim split on both sides), the splits it carries (``parts``, one at most
    when it can), and whether the operands' splits cannot meet (``bad``)."""
    lhs, rhs = op.operands[0], op.operands[1]
    a, b = len(prop.shape(lhs)), len(prop.shape(rhs))
    r = len(prop.shape(op.results[0]))
    out: State = REPLICATED
    parts: list[Split] = []
    bad = False
    if isinstance(sl, Split):
        if sl.dim == a - 1:
            if isinstance(sr, Split) and sr.dim == b - 2 and (sr.inner, sr.pad) == (sl.inner, sl.pad):
                out = PARTIAL
            else:
                bad = True
        elif sl.dim == a - 2:
            parts.append(Split(r - 2, sl.inner, sl.pad))
        else:
            o = sl.dim + r - a
            j = o - (r - b)
            aligned = isinstance(sr, Split) and sr.dim == j and sr.inner == sl.inner
            if j >= 0 and prop.shape(rhs)[j] != 1 and not aligned:
                bad = True
            parts.append(Split(o, sl.inner, sl.pad))
    if isinstance(sr, Split):
        if sr.dim == b - 2:
            if not (isinstance(sl, Split) and sl.dim == a - 1):
                bad = True
        elif sr.dim == b - 1:
            parts.append(Split(r - 1, sr.inner, sr.pad))
        else:
            o = sr.dim + r - b
            j = o - (r - a)
            aligned = isinstance(sl, Split) and sl.dim == j and sl.inner == sr.inner
            if j >= 0 and prop.shape(lhs)[j] != 1 and not aligned:
                bad = True
            parts.append(Split(o, sr.inner, sr.pad))
    if len(set(parts)) > 1:
        bad = True
    return out, parts, bad


def _linear_bias(prop: Propagation, i: int, op: TOp, out, origin: frozenset):
    """The bias of an ``addmm``: split with a column-parallel output, whole otherwise (a
    row-parallel bias is added once, after the reduction, in Megatron)."""
    bias = op.operands[2]
    r, q = len(prop.shape(op.results[0])), len(prop.shape(bias))
    want = REPLICATED
    if isinstance(out, Split):
        j = out.dim - (r - q)
        if j >= 0 and prop.shape(bias)[j] != 1:
            want = Split(j, out.inner, out.pad)
    sb = prop.operand(i, 2)
    if sb is PENDING:
        if want is not REPLICATED and not prop.decide_param(bias, want, origin):
            prop.to_demote.update(origin)
            return REPLICATED
        if want is REPLICATED:
            prop.decide_param(bias, REPLICATED, frozenset())
        return out
    if sb == PARTIAL:
        prop.reduce_operand(i, 2)
        sb = REPLICATED
    if sb != want:
        if isinstance(sb, Split):
            prop.refuse_split(bias)
        prop.to_demote.update(origin)
        return REPLICATED
    return out


# ------------------------------------------------------------------------------------------
# Elementwise
# ------------------------------------------------------------------------------------------


def elementwise(prop: Propagation, i: int, op: TOp) -> None:
    """An elementwise op, broadcast-aware.  Partial operands are reduced, except for ``add`` and
    ``sub`` of partial and replicated operands of the result's shape: partials add up, and a
    replicated addend is added by one device only, so the sum stays partial (the gradients
    that q, k and v projections send to their shared input are all-reduced once, Megatron's
    ``f`` operator).  Split operands must agree (mapped to the result's rank); a replicated
    parameter meeting a split operand along a full dim (a bias, a norm's scale) is split with
    it; a replicated activation beside a sequence split is read by each device for its own
    tokens (the result stays split: Megatron-core's ``scatter_to_sequence_parallel_region``,
    ``mappings.py``, a slice without communication); any other replicated operand along a full
    split dim refuses the split (it would need a slice)."""
    if prop.structure.is_chain_op(op) and prop.operand(i, 0) is PENDING:
        for rv in op.results:  # a cast of a parameter (--dtype fp8): decided with the parameter
            prop.states[rv] = PENDING
        return
    out_v = op.results[0]
    states = [prop.operand(i, k) for k in range(len(op.operands))]
    if any(s == PARTIAL for s in states):
        if (
            op.kind in ("add", "sub")
            and all(s == PARTIAL or s is REPLICATED for s in states)
            and all(prop.shape(op.operands[k]) == prop.shape(out_v) for k, s in enumerate(states) if s == PARTIAL)
        ):
            source = max(prop.partial_source[op.operands[k]] for k, s in enumerate(states) if s == PARTIAL)
            prop.set_state(out_v, PARTIAL, source=source)
            return
        for k, s in enumerate(states):
            if s == PARTIAL:
                states[k] = prop.reduce_operand(i, k)
    r = len(prop.shape(out_v))
    parts = {}
    for k, s in enumerate(states):
        if isinstance(s, Split):
            v = op.operands[k]
            parts[Split(s.dim + r - len(prop.shape(v)), s.inner, s.pad)] = v
    if len(parts) > 1 and any(not prop.is_sequence_split(v) for v in parts.values()):
        # A sequence split meeting a head split: the sequence-split operands are gathered
        # (MLA's rotary key, computed on the device's tokens, gathered before it joins the
        # heads: Megatron's gather_from_sequence_parallel_region of k_pos_emb).
        for k, s in enumerate(states):
            v = op.operands[k]
            if isinstance(s, Split) and prop.is_sequence_split(v):
                prop.all_gather(i, k)
                states[k] = REPLICATED
        parts = {p: v for p, v in parts.items() if not prop.is_sequence_split(v)}
    if len(parts) > 1:
        prop.refuse_split(*parts.values())
        out = REPLICATED
    else:
        out = next(iter(parts), REPLICATED)
    origin = frozenset().union(*(prop.origins[v] for v in parts.values())) if parts else frozenset()
    for k, s in enumerate(states):
        if isinstance(s, Split):
            continue
        v = op.operands[k]
        j = out.dim - (r - len(prop.shape(v))) if out is not REPLICATED else -1
        whole = j < 0 or prop.shape(v)[j] == 1 or (s is REPLICATED and _broadcast_along(prop, v, j))
        if s is PENDING:
            if whole:
                prop.decide_param(v, REPLICATED, frozenset())
            else:
                assert isinstance(out, Split)  # not whole: j >= 0, so out is a split
                if SEQUENCE_ORIGIN in origin or not prop.decide_param(v, Split(j, out.inner, out.pad), origin):
                    if SEQUENCE_ORIGIN in origin:
                        prop.decide_param(v, REPLICATED, frozenset())
                    prop.refuse_origin(origin, parts.values())
                    out = REPLICATED
        elif not whole:
            if s is REPLICATED and origin == {SEQUENCE_ORIGIN} and isinstance(out, Split) and not out.pad:
                # A replicated activation meets a sequence-split one (an MoE layer's output,
                # replicated over TP, added to the split residual): each device reads its own
                # tokens of it, as Megatron-core's scatter_to_sequence_parallel_region splits
                # without communication, and the result stays split.
                continue
            # A replicated operand meets a split one along a full dim: would need a slice.
            prop.refuse_origin(origin, parts.values())
            out = REPLICATED
    prop.set_state(out_v, out, origin)


def _broadcast_along(prop: Propagation, v: int, j: int) -> bool:
    """Is ``v`` an ``expand`` of a tensor of size 1 along dim ``j`` (same rank)?  Each device's
    part of it along ``j`` is then the same broadcast data, read without a slice: MLA's shared
    rotary key expanded over the heads and copied into each head's key (transformers'
    DeepseekV3 ``expand_kv``), as Megatron's MLA expands ``k_pos_emb`` over its local heads."""
    p = prop.graph.values[v].producer
    if p < 0:
        return False
    op = prop.graph.ops[p]
    if op.name != "layout" or op.kind != "expand" or len(op.operands) != 1:
        return False
    src = prop.shape(op.operands[0])
    return len(src) == len(prop.shape(v)) and src[j] == 1


def shape_only(prop: Propagation, i: int, op: TOp) -> None:
    """``fill``, ``random``, ``arange`` (:data:`SHAPE_ONLY_KINDS`): the result takes its
    operand's split (the op reads only its shape; nothing is reduced).  Under sequence
    parallelism a dropout mask drawn for a partial activation takes the shape of that
    activation's reduce-scatter."""
    out_v = op.results[0]
    s = prop.state(op.operands[0]) if op.operands else REPLICATED
    origin = prop.origins[op.operands[0]] if op.operands else frozenset()
    if s == PARTIAL and prop.sequence_parallel and op.operands[0] not in prop.structure.param_grads:
        # (a dropout mask drawn for a partial value: the shape of its reduce-scatter)
        s = prop.structure.seq_split(prop.shape(op.operands[0])) or REPLICATED
        origin = frozenset((SEQUENCE_ORIGIN,))
    shape, out_shape = prop.shape(op.operands[0]) if op.operands else (), prop.shape(out_v)
    if isinstance(s, Split) and len(shape) == len(out_shape) and shape[s.dim] == out_shape[s.dim]:
        # (a fresh tensor shaped like another, ``new_empty``: split as it where it is as long)
        prop.set_state(out_v, s, origin)
    else:
        prop.set_state(out_v, REPLICATED)


def cross_entropy_grad(prop: Propagation, i: int, op: TOp) -> None:
    """``nll_loss_grad``: the gradient of the loss w.r.t. the log-probabilities takes their
    split over the vocabulary (operand 1); the other operands whole.  Its result is marked, so
    that the softmax gradient it feeds is local (:func:`softmax`), as in Megatron's fused
    vocabulary-parallel cross-entropy backward.  With fewer than two operands: an ordinary
    elementwise op."""
    if len(op.operands) < 2:
        elementwise(prop, i, op)
        return
    out_v = op.results[0]
    s = prop.operand(i, 1)
    for k in range(len(op.operands)):
        if k != 1:
            prop.require_whole(i, k)
    if s == PARTIAL or s is PENDING:
        prop.require_whole(i, 1, s)
        s = REPLICATED
    prop.set_state(out_v, s, prop.origins[op.operands[1]])
    prop.cross_entropy_grads.add(out_v)


# ------------------------------------------------------------------------------------------
# Reductions, softmax, norms
# ------------------------------------------------------------------------------------------


#: Reductions that take an FP8 cast's amax (``--dtype fp8``: torchao's ``max``/``amax`` of
#: ``abs``, TE current scaling's ``linalg_vector_norm`` of order inf).
AMAX_KINDS = frozenset(("max", "norm"))


def _over_split(prop: Propagation, op: TOp, s) -> bool:
    """Does the reduction ``op`` reduce over the split dim of its operand (state ``s``)?"""
    if not isinstance(s, Split):
        return False
    rank = len(prop.shape(op.operands[0]))
    return not op.dims or s.dim in {d % rank for d in op.dims}


def _amax_of_parameter(prop: Propagation, op: TOp) -> None:
    """The amax of a parameter not yet decided, or over a split dim (an FP8 cast's scale,
    ``--dtype fp8``): each device takes its shard's and the amaxes are all-reduced (torchao's
    ``reduce_amax`` over the mesh, TE's amax reduction group), a few bytes not priced; the
    scale is replicated and the parameter is decided by its GEMM, not here."""
    for rv in op.results:
        prop.set_state(rv, REPLICATED)


def reduction(prop: Propagation, i: int, op: TOp) -> None:
    """A reduction over ``op.dims`` (all dims when empty).  Over dims other than the split one
    the result keeps the split (moved to the result's rank); a sum over the split dim is a
    partial sum, any other reduction over it refuses the split.  A sum of groups of
    consecutive heads that keeps the dim (the backward of grouped-query attention's repeat:
    the repeated heads' gradients summed back to the key/value heads) is local when a device's
    heads are whole groups, partial when a device's heads lie inside one group.  A sum of a
    zero-padded partial value stays partial."""
    s = prop.operand(i, 0)
    if op.kind in AMAX_KINDS and (s is PENDING or _over_split(prop, op, s)):
        _amax_of_parameter(prop, op)
        return
    for k in range(1, len(op.operands)):
        prop.require_whole(i, k)
    v = op.operands[0]
    if s == PARTIAL and op.kind in SUM_KINDS and len(op.operands) == 1 and v in prop.padded_partials:
        for rv in op.results:
            prop.set_state(rv, PARTIAL, source=prop.partial_source[v])
        return
    if not isinstance(s, Split):
        prop.require_whole(i, 0, s)
        for rv in op.results:
            prop.set_state(rv, REPLICATED)
        return
    rank = len(prop.shape(v))
    dims = sorted({d % rank for d in op.dims}) if op.dims else list(range(rank))
    if s.dim in dims:
        out = prop.shape(op.results[0])
        if op.kind in SUM_KINDS and dims == [s.dim] and len(out) == rank and out[s.dim] > 1:
            # A sum of groups of consecutive rows that keeps the dim: the importer's sum of
            # the repeated heads' gradients back to the key/value heads (``aten = "attention"``).
            group = prop.shape(v)[s.dim] // out[s.dim]
            if s.inner % group == 0:  # a device's heads are whole groups: local
                prop.set_state(op.results[0], Split(s.dim, s.inner // group, 0), prop.origins[v])
                return
            if group % s.inner:  # groups cut across devices unevenly
                prop.refuse_split(v)
                prop.set_state(op.results[0], REPLICATED)
                return
            # (else a device's heads lie inside one group, which other devices share: partial)
        if op.kind in SUM_KINDS:
            for rv in op.results:
                prop.set_state(rv, PARTIAL)
        else:
            prop.refuse_split(v)
            for rv in op.results:
                prop.set_state(rv, REPLICATED)
        return
    for rv in op.results:
        keep = len(prop.shape(rv)) == rank
        d = s.dim if keep else s.dim - sum(1 for x in dims if x < s.dim)
        prop.set_state(rv, Split(d, s.inner, s.pad), prop.origins[v])


def cross_entropy_loss(prop: Propagation, i: int, op: TOp) -> None:
    """``nll_loss`` of log-probabilities split over the vocabulary (their last dim): the loss is
    a partial sum (each device holds the target logits of its vocabulary shard), all-reduced
    where it is read whole: a scalar in place of the all-reduce of the ``[tokens]`` target
    logits in Megatron's vocabulary-parallel cross-entropy (``cross_entropy.py``).  The other
    results and operands are whole; an input split otherwise is refused."""
    s = prop.operand(i, 0)
    for k in range(1, len(op.operands)):
        prop.require_whole(i, k)
    rank = len(prop.shape(op.operands[0]))
    if isinstance(s, Split) and s.dim == rank - 1:
        prop.set_state(op.results[0], PARTIAL)
        for rv in op.results[1:]:
            prop.set_state(rv, REPLICATED)
        return
    prop.require_whole(i, 0, s)
    for rv in op.results:
        prop.set_state(rv, REPLICATED)


def softmax(prop: Propagation, i: int, op: TOp) -> None:
    """A softmax, log-softmax or their gradient.  Over a dim that is not split, local.  Over
    the split dim it is the distributed softmax of Megatron's vocabulary-parallel
    cross-entropy: local ``max`` and ``sum`` statistics of the shard and their all-reduces
    (:class:`SoftmaxStat`, inserted before the op, which stands for the fused kernel that
    reads them); a softmax gradient all-reduces one ``[rows]`` sum, except the backward of the
    cross-entropy (fed by ``nll_loss_grad``), local as in Megatron's fused kernel.  A softmax
    over a sequence-parallel split is not distributed: its input is gathered."""
    states = [prop.operand(i, k) for k in range(len(op.operands))]
    for k, s in enumerate(states):
        if s == PARTIAL:
            states[k] = prop.reduce_operand(i, k)
        elif s is PENDING:
            prop.require_whole(i, k, s)
            states[k] = REPLICATED
    splits = {s for s in states if isinstance(s, Split)}
    out_v = op.results[0]
    if not splits:
        prop.set_state(out_v, REPLICATED)
        return
    vs = [op.operands[k] for k, s in enumerate(states) if isinstance(s, Split)]
    if len(splits) > 1 or len(vs) != len(states):
        prop.refuse_split(*vs)
        prop.set_state(out_v, REPLICATED)
        return
    s = splits.pop()
    rank = len(prop.shape(out_v))
    if op.dim % rank == s.dim and any(prop.is_sequence_split(v) for v in vs):
        prop.refuse_split(*vs)  # no distributed softmax over the sequence: gathered
        prop.set_state(out_v, REPLICATED)
        return
    if op.dim % rank == s.dim:
        x = op.operands[0]
        if op.kind in ("softmax", "log_softmax"):
            for kind in ("max", "sum"):
                _softmax_stat(prop, i, x, s, kind)
        elif not _from_cross_entropy_grad(prop, x):
            _softmax_stat(prop, i, x, s, "sum")
    prop.set_state(out_v, s, prop.origins[op.operands[0]])


def _from_cross_entropy_grad(prop: Propagation, v: int) -> bool:
    """Is ``v`` an ``nll_loss_grad`` result, through single-operand layouts and casts?"""
    for _ in range(16):
        if v in prop.cross_entropy_grads:
            return True
        p = prop.graph.values[v].producer
        if p < 0:
            return False
        op = prop.graph.ops[p]
        if not (
            (op.name == "layout" and len(op.operands) == 1)
            or (op.name == "elementwise" and op.kind in ("convert", "copy"))
        ):
            return False
        v = op.operands[0]
    return False


def _softmax_stat(prop: Propagation, i: int, v: int, s: Split, kind: str) -> None:
    """A local ``kind`` reduction of ``v`` over its split dim and its all-reduce, before op ``i``."""
    shape = tuple(n for d, n in enumerate(prop.shape(v)) if d != s.dim)
    prop.softmax_stats.append(SoftmaxStat(i, v, s.dim, kind, shape))


def norm(prop: Propagation, i: int, op: TOp) -> None:
    """A norm (or its gradient, whose input is operand 1) needs the normalized (last
    ``normalized_rank``) dims whole: a split there is refused, as Megatron keeps LayerNorm
    outside the tensor-parallel region.  A split of another dim (the sequence, under
    sequence parallelism) carries through; a result that loses the split dim (a weight or
    bias gradient summed over the tokens) is then a partial sum, all-reduced once per step
    (Megatron all-reduces the gradients of its ``sequence_parallel`` parameters)."""
    grad = op.kind.endswith("_grad")
    states = [prop.operand(i, k) for k in range(len(op.operands))]
    for k, s in enumerate(states):
        if s == PARTIAL:
            states[k] = prop.reduce_operand(i, k)
        elif s is PENDING:
            prop.require_whole(i, k, s)
            states[k] = REPLICATED
    x = op.operands[1] if grad and len(op.operands) > 1 else op.operands[0]
    rank = len(prop.shape(x))
    splits = {s for s in states[: 2 if grad else 1] if isinstance(s, Split)}
    s = next(iter(splits)) if len(splits) == 1 else REPLICATED
    if len(splits) > 1 or (s is not REPLICATED and s.dim >= rank - op.normalized_rank):
        prop.refuse_split(*[v for v, st in zip(op.operands, states) if isinstance(st, Split)])
        s = REPLICATED
    elif s is REPLICATED:
        for k, st in enumerate(states):
            if isinstance(st, Split):
                prop.refuse_split(op.operands[k])
    origin = frozenset().union(*(prop.origins[v] for v in op.operands))
    for rv in op.results:
        if s is REPLICATED:
            prop.set_state(rv, REPLICATED)
        elif len(prop.shape(rv)) == rank and prop.shape(rv)[s.dim] == prop.shape(x)[s.dim]:
            prop.set_state(rv, s, origin)
        else:
            prop.set_state(rv, PARTIAL)  # a parameter gradient summed over the split dim


# ------------------------------------------------------------------------------------------
# Embeddings
# ------------------------------------------------------------------------------------------


def embedding_lookup(prop: Propagation, i: int, op: TOp) -> None:
    """An embedding lookup.  The word embedding matched with the LM head, while the vocabulary
    split is on, is **vocabulary-parallel**: its table split along its rows (padded), so the
    lookup yields a partial sum (each device finds the tokens of its rows), Megatron's
    ``VocabParallelEmbedding``.  Other tables are replicated; the indices are whole."""
    out_v = op.results[0]
    for k in range(1, len(op.operands)):
        prop.require_whole(i, k)
    table = op.operands[0]
    if prop.state(table) is PENDING:
        if prop.vocab_parallel and i in prop.structure.word_lookups:
            n = prop.structure.padded_vocab
            prop.decide_param(table, Split(0, n // prop.width, prop.structure.vocab_pad), frozenset((VOCAB_ORIGIN,)))
        else:
            prop.decide_param(table, REPLICATED, frozenset())
    ts = prop.state(table)
    if isinstance(ts, Split) and ts.dim == 0:
        prop.set_state(out_v, PARTIAL)
    else:
        prop.require_whole(i, 0, ts)
        prop.set_state(out_v, REPLICATED)


def embedding_grad(prop: Propagation, i: int, op: TOp) -> None:
    """An embedding's gradient (any kind but ``lookup``): the gradient of the table looked up
    with the same indices, split as that table is (a vocabulary-parallel table's gradient stays
    split, no communication); its output gradient is read whole."""
    out_v = op.results[0]
    for k in range(1, len(op.operands)):
        prop.require_whole(i, k)
    grad_table = prop.structure.emb_grad_table.get(i)
    ts = prop.state(grad_table) if grad_table is not None else REPLICATED
    if ts is PENDING:
        ts = REPLICATED
    prop.require_whole(i, 0)
    if isinstance(ts, Split) and ts.dim == 0:
        assert grad_table is not None  # a split state comes from the table
        prop.set_state(out_v, ts, prop.origins[grad_table])
    else:
        prop.set_state(out_v, REPLICATED)


# ------------------------------------------------------------------------------------------
# Layout ops
# ------------------------------------------------------------------------------------------


def layout(prop: Propagation, i: int, op: TOp) -> None:
    """A layout op with one operand (views, copies, repeats, slices, ...; several operands:
    :func:`whole_operands`).  A view of an undecided parameter stays pending (decided with the
    parameter); a partial value stays partial through views and copies; a split is mapped
    through the op by :func:`~passes.algorithms.tp_lattice.map_view` (``split``/``unbind`` by
    :func:`split_pieces`).  A replicated key/value tensor entering a local head repeat is
    repeated into the device's own query heads only (:func:`_local_head_repeat`).  A split the
    op cannot carry is refused, except a view read only by sums (the gradient of transformers'
    ``repeat_kv`` with fewer key/value heads than devices), where it is zero-padded into a
    partial sum (:class:`Pad`)."""
    if len(op.operands) != 1:
        return whole_operands(prop, i, op)
    v = op.operands[0]
    s = prop.operand(i, 0)
    if s is PENDING:
        if prop.structure.is_chain_op(op):
            for rv in op.results:
                prop.states[rv] = PENDING  # resolved when the parameter is decided
            return
        prop.decide_param(v, REPLICATED, frozenset())
        s = REPLICATED
    if s == PARTIAL:
        if op.kind in VIEW_KINDS or op.kind == "clone":
            for rv in op.results:
                prop.set_state(rv, PARTIAL, source=prop.partial_source[v])
                if v in prop.padded_partials:
                    prop.padded_partials.add(rv)
            return
        s = prop.reduce_operand(i, 0)
    if s is REPLICATED:
        if not _local_head_repeat(prop, i, op):
            for rv in op.results:
                prop.set_state(rv, REPLICATED)
        return
    src = prop.shape(v)
    if op.kind in ("split", "unbind"):
        split_pieces(prop, i, op, s)
        return
    try:
        for rv in op.results:
            prop.set_state(rv, map_view(op.kind, op.aten, src, prop.shape(rv), s, prop.width), prop.origins[v])
    except SplitCannotPass:
        if (
            op.kind in ("view", "reshape")
            and not s.pad
            and not prop.is_sequence_split(v)
            and prop.graph.values[v].producer >= 0
            and _summed_only(prop, op.results[0])
        ):
            # A view the split cannot pass (a gradient of transformers' repeat_kv with fewer
            # key/value heads than devices: [b, heads, s, d] -> [b, kv, groups, s, d]) that
            # only sums read: the split is zero-padded into a partial sum.
            prop.zero_pad(i, 0)
            prop.set_state(op.results[0], PARTIAL, source=i)
            prop.padded_partials.add(op.results[0])
            return
        prop.refuse_split(v)
        for rv in op.results:
            prop.set_state(rv, REPLICATED)


def _local_head_repeat(prop: Propagation, i: int, op: TOp) -> bool:
    """A replicated key/value tensor repeated into the query heads (op ``i`` a head repeat still
    allowed to be local): each device makes the copies its own query heads read, the result
    split along the heads with the repeat as its origin (Megatron's layout when there are fewer
    key/value heads than devices).  False when the op is no such repeat."""
    d = prop.structure.head_repeats.get(i) if i in prop.local_repeats else None
    if d is not None and (n := prop.shape(op.results[0])[d]) % prop.width == 0:
        prop.set_state(op.results[0], Split(d, n // prop.width), frozenset((i,)))
        return True
    return False


def _summed_only(prop: Propagation, v: int) -> bool:
    """Is ``v`` read only by sums (through views)?"""
    uses = prop.structure.consumers[v]
    for j, _k in uses:
        op = prop.graph.ops[j]
        if op.name == "reduction" and op.kind in SUM_KINDS:
            continue
        if op.name == "layout" and op.kind in VIEW_KINDS and len(op.operands) == len(op.results) == 1:
            if _summed_only(prop, op.results[0]):
                continue
        return False
    return bool(uses)


def split_pieces(prop: Propagation, i: int, op: TOp, s: Split) -> None:
    """``split``/``unbind`` of a value split ``s``.  Pieces cut along other dims keep the split.
    Pieces cut along the split dim (GPT-2's fused QKV) are each split: every device holds its
    share of every piece, as Megatron orders the fused weight's columns; a width that does not
    divide the pieces is refused.  ``unbind`` maps the split like a ``select``."""
    v = op.operands[0]
    src = prop.shape(v)
    if op.kind == "unbind":
        try:
            for rv in op.results:
                prop.set_state(rv, map_view("select", op.aten, src, prop.shape(rv), s, prop.width), prop.origins[v])
        except SplitCannotPass:
            prop.refuse_split(v)
            for rv in op.results:
                prop.set_state(rv, REPLICATED)
        return
    cut = {d for rv in op.results for d, (a, b) in enumerate(zip(src, prop.shape(rv))) if a != b}
    if s.dim not in cut:
        for rv in op.results:
            prop.set_state(rv, s, prop.origins[v])
        return
    pieces = [prop.shape(rv)[s.dim] for rv in op.results]
    if s.pad or len(cut) != 1 or any(n % prop.width for n in pieces):
        bad = [n for n in pieces if n % prop.width]
        if bad and not s.pad:
            raise ShardError(
                f"width {prop.width} does not divide the size {bad[0]} of the pieces that op "
                f"{op.aten or op.kind} in {prop.structure.layer_name(op.layer)} splits a sharded tensor into"
            )
        prop.refuse_split(v)
        for rv in op.results:
            prop.set_state(rv, REPLICATED)
        return
    for rv, n in zip(op.results, pieces):
        prop.set_state(rv, Split(s.dim, n // prop.width, 0), prop.origins[v])


def concat(prop: Propagation, i: int, op: TOp) -> None:
    """``cat``/``stack`` of the non-empty operands: all split alike (or the result is
    replicated and their splits refused), partial ones reduced.  A ``stack`` shifts the split
    dim past the new dim; a ``cat`` along the split dim splits the result there (each device
    concatenates its shares: the fused QKV put back together), if the width divides it."""
    out_v = op.results[0]
    out = prop.shape(out_v)
    live = [k for k, v in enumerate(op.operands) if math.prod(prop.shape(v)) > 0]
    states = {k: prop.operand(i, k) for k in live}
    for k, s in states.items():
        if s == PARTIAL:
            states[k] = prop.reduce_operand(i, k)
        elif s is PENDING:
            prop.require_whole(i, k, s)
            states[k] = REPLICATED
    splits = [s for s in states.values() if isinstance(s, Split)]
    if not splits:
        prop.set_state(out_v, REPLICATED)
        return
    vs = [op.operands[k] for k, s in states.items() if isinstance(s, Split)]
    origin = frozenset().union(*(prop.origins[v] for v in vs))
    if len(splits) != len(states) or len({(s.dim, s.pad) for s in splits}) > 1:
        prop.refuse_split(*vs)
        prop.set_state(out_v, REPLICATED)
        return
    s = splits[0]
    if op.kind == "stack":
        new = inserted_dims(prop.shape(op.operands[live[0]]), out)
        if len(set(splits)) > 1 or not new:
            prop.refuse_split(*vs)
            prop.set_state(out_v, REPLICATED)
            return
        d = s.dim + (1 if new[0] <= s.dim else 0)
        prop.set_state(out_v, Split(d, s.inner, s.pad), origin)
        return
    cat_dims = {d for k in live for d, (a, b) in enumerate(zip(prop.shape(op.operands[k]), out)) if a != b}
    if s.dim in cat_dims:
        if s.pad or out[s.dim] % prop.width:
            prop.refuse_split(*vs)
            prop.set_state(out_v, REPLICATED)
            return
        prop.set_state(out_v, Split(s.dim, out[s.dim] // prop.width, 0), origin)
        return
    if len(set(splits)) > 1:
        prop.refuse_split(*vs)
        prop.set_state(out_v, REPLICATED)
        return
    prop.set_state(out_v, s, origin)


# ------------------------------------------------------------------------------------------
# Optimizer and results
# ------------------------------------------------------------------------------------------


def _match_param(prop: Propagation, i: int, k: int, param: int) -> None:
    """Operand ``k`` of op ``i`` is the gradient of ``param``: same sharding (a partial gradient
    is all-reduced; a split that does not match the parameter's is refused)."""
    sp = prop.state(param)
    if sp is PENDING:
        prop.decide_param(param, REPLICATED, frozenset())
        sp = REPLICATED
    sg = prop.operand(i, k)
    if sg == PARTIAL:
        prop.reduce_operand(i, k)
        sg = REPLICATED
    if sg is PENDING:
        sg = REPLICATED
    if sg != sp:
        if isinstance(sp, Split) and isinstance(sg, Split) and sp.dim == sg.dim and sp.pad == sg.pad:
            return
        if isinstance(sp, Split):
            prop.refuse_split(param)
        if isinstance(sg, Split):
            prop.refuse_split(prop.graph.ops[i].operands[k])


def optimizer_update(prop: Propagation, i: int, op: TOp) -> None:
    """The optimizer step of one parameter: its gradient (operand 1) sharded as the parameter,
    the updated parameter too: each device updates its shard (Megatron's optimizer sees only
    the local shards of split weights)."""
    param = op.operands[0]
    _match_param(prop, i, 1, param)
    sp = prop.state(param)
    prop.set_state(op.results[0], sp, prop.origins[param])


def function_results(prop: Propagation, i: int, op: TOp) -> None:
    """The step's ``return``: a returned gradient or updated parameter is sharded as its
    parameter; anything else (the loss) is returned whole."""
    for k in range(len(op.operands)):
        role = op.result_roles[k] if k < len(op.result_roles) else ""
        param = op.result_params[k] if k < len(op.result_params) else -1
        if role in ("grad", "updated") and param >= 0:
            _match_param(prop, i, k, param)
        else:
            prop.require_whole(i, k)


# ------------------------------------------------------------------------------------------
# The registry
# ------------------------------------------------------------------------------------------

#: The rule of each op kind: keyed by ``(op name, kind)`` where one kind of an op has a rule of
#: its own, else by the op name (``return`` is the step function's terminator).
RULES: dict[str | tuple[str, str], Rule] = {
    "matmul": matmul,
    "elementwise": elementwise,
    **{("elementwise", kind): shape_only for kind in SHAPE_ONLY_KINDS},
    ("elementwise", "nll_loss_grad"): cross_entropy_grad,
    "reduction": reduction,
    ("reduction", "nll_loss"): cross_entropy_loss,
    "softmax": softmax,
    "norm": norm,
    "embedding": embedding_grad,
    ("embedding", "lookup"): embedding_lookup,
    "layout": layout,
    ("layout", "cat"): concat,
    ("layout", "stack"): concat,
    "optimizer_update": optimizer_update,
    "return": function_results,
    "opaque": whole_operands,
}


def rule_for(op: TOp) -> Rule:
    """The rule of ``op``: :data:`RULES` by ``(name, kind)``, else by name, else
    :func:`whole_operands`."""
    return RULES.get((op.name, op.kind)) or RULES.get(op.name, whole_operands)
