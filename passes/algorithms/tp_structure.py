"""The input of tensor-parallel sharding (the step as a light graph of ops on tensors with
static shapes: :class:`TGraph`) and the structure found on it once, before any propagation
(:class:`GraphStructure`): the linears, the LM head and the embedding table it matches, the
attention heads and the key/value heads of grouped-query attention, the head repeats, the
parameter gradients.  Structure is found from the graph, never from names."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from passes.algorithms.tp_lattice import ShardError, Split, SplitCannotPass, repeated_dim, reshape_split
from phaze_ir import op_kinds

#: ``phaze.layout`` kinds that alias their operand (views).
VIEW_KINDS = frozenset(op_kinds.VIEW_KINDS)
#: Single-operand layout kinds through which a value still counts as a view of its parameter.
CHAIN_KINDS = frozenset(
    ("view", "reshape", "transpose", "permute", "squeeze", "unsqueeze", "alias", "detach", "clone", "expand")
)
#: Elementwise kinds through which a parameter is still the parameter (``--dtype fp8``'s weight
#: casts, ``phaze_ir/frontend/float8_linear.py``): the cast, and torchao's ``abs`` for the amax
#: and scaling (``mul`` by the scale, ``clamp`` to the FP8 range).
CAST_CHAIN_KINDS = frozenset(("convert", "abs", "mul", "clamp"))


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
    parameter value of a gradient or updated parameter (-1 otherwise).  ``fp8_rowwise``: an FP8
    GEMM whose operands are scaled one scale a row (``phaze.fp8_scales``, torchao's rowwise
    recipe)."""

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
    fp8_rowwise: bool = False


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


class GraphStructure:
    """What the propagation needs to know about the step before it starts, found once per width:

    - ``consumers[v]``: the (op, operand index) pairs that read value ``v``;
    - ``linear_param``: the *linears*, forward matmuls whose rhs is a ``param`` argument
      (possibly through single-operand views), op -> that parameter;
    - ``lm_heads``, ``word_lookups``, ``vocab_size``, ``padded_vocab``, ``vocab_pad``: the LM
      head (a forward linear outside the blocks whose output reaches a (log-)softmax over its
      last dim and whose width is the row count of an embedding table looked up in the forward,
      or whose weight *is* that table) and that table's lookups, padded to a multiple of
      ``vocab_multiple * t`` rows as Megatron pads them;
    - ``kv_linears``, ``kv_replicated``: the key/value projections of grouped-query attention
      and those that stay replicated (fewer key/value heads than the width); widths that do not
      divide the attention heads are refused here (:class:`ShardError`);
    - ``head_repeats``: the ops that repeat key/value heads over the query heads;
    - ``param_grads``: parameter gradients and what they are views or casts of;
    - ``emb_grad_table``: embedding-gradient op -> the table looked up with the same indices;
    - ``by_design``: the block linears Megatron keeps replicated by design, op -> why
      (:meth:`_find_replicated_by_design`: ``"latent"``, MLA's down projections; ``"router"``,
      an MoE router);
    - ``gathered_at_entry``: the modules whose sequence-split inputs are all-gathered before any
      of their ops reads them (the linears of torchao's rowwise FP8 recipe, whose casts run on
      the gathered bf16 input: :meth:`~passes.algorithms.tp_propagation.Propagation.operand`).
    """

    def __init__(self, g: TGraph, t: int, vocab_multiple: int):
        self.graph, self.width = g, t
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
        # torchtitan (820504e, torchtitan/models/llama3/parallelize_llama.py) gives torchao's
        # rowwise FP8 linears the plain ColwiseParallel / RowwiseParallel styles ("For rowwise
        # recipes, we use regular TP and all-gather happens in high precision"): DTensor
        # redistributes a module's input (and, in the backward, its output's gradient) as the
        # module is entered, so the bf16 tensor is gathered and each device casts it whole;
        # torchao's Float8ColwiseParallel, which casts before its float8 all-gather, takes
        # tensorwise scales only (torchao/float8/float8_tensor_parallel.py, June 2025).
        self.gathered_at_entry = {op.module for op in g.ops if op.fp8_rowwise and op.module}
        self._find_vocab(vocab_multiple)
        self._check_heads()
        self._find_head_repeats()
        self._find_param_grads()
        self._find_embedding_grads()
        self._find_replicated_by_design()

    def _find_replicated_by_design(self) -> None:
        """The block linears Megatron-core runs replicated over TP, by what their output feeds
        (forward ops of the same layer, through views, slices, casts and elementwise ops with
        one activation operand):

        - ``"latent"``: a linear whose output (or a slice of it) is squared and averaged over
          its last dim, an RMSNorm of the output: multi-latent attention's down projections
          (transformers' ``q_a_proj``, ``kv_a_proj_with_mqa``), whose latents are normalized
          whole.  Megatron-core builds ``linear_q_down_proj`` and ``linear_kv_down_proj`` as
          ``TELinear(parallel_mode="duplicated")`` with their layernorms
          (``megatron/core/transformer/multi_latent_attention.py``) and splits only the up
          projections, over the heads.
        - ``"router"``: a linear whose output reaches a ``topk``: an MoE router (Megatron's
          ``TopKRouter`` weight is not tensor-parallel, ``megatron/core/transformer/moe/router.py``).

        They are never column-parallel candidates, and not said as linears kept whole (the
        propagation would demote them anyway: a norm needs its dim whole, a top-k its experts)."""
        g = self.graph
        self.by_design: dict[int, str] = {}
        for i in self.linear_param:
            op = g.ops[i]
            if op.layer not in self.block_layers:
                continue
            why = self._output_feeds(i)
            if why:
                self.by_design[i] = why
        #: The modules of the duplicated latent projections: their GEMMs read a sequence split
        #: as it is (Propagation.operand_gathered).
        self.sequence_local = {
            g.ops[i].module for i, why in self.by_design.items() if why == "latent" and g.ops[i].module
        }

    def _output_feeds(self, i: int, depth: int = 16) -> str:
        """``"latent"``, ``"router"`` or "" for linear ``i`` (:meth:`_find_replicated_by_design`).
        A latent's features stay its values' last dim up to the norm (slices of it only: the
        rotary part cut off; a per-head norm, Qwen3's ``q_norm``, follows a reshape into heads),
        and the normalized latent reaches another linear of the layer (its up projection)."""
        if self._reaches(i, depth, lambda j, op: op.name == "reduction" and op.kind == "topk", False):
            return "router"

        def norm(j: int, op: TOp) -> bool:
            return op.name == "reduction" and op.kind == "mean" and self._last_dim_of_square(j)

        return "latent" if self._reaches(i, depth, norm, True) and self._reaches_linear(i, depth) else ""

    def _forward_reach(self, i: int, depth: int, found, passes) -> bool:
        """Does the output of linear ``i`` reach, within ``depth`` ops, a forward op of its layer
        that ``found(j, k, op)`` accepts (the op ``j``, the value's operand index ``k``), going on
        through the ops ``passes(op)`` lets through?"""
        g = self.graph
        layer = g.ops[i].layer
        frontier, seen = [(v, 0) for v in g.ops[i].results], set()
        while frontier:
            v, d = frontier.pop()
            if v in seen or d > depth:
                continue
            seen.add(v)
            for j, k in self.consumers[v]:
                op = g.ops[j]
                if op.phase != "fwd" or op.layer != layer:
                    continue
                if found(j, k, op):
                    return True
                if passes(op):
                    frontier += [(r, d + 1) for r in op.results]
        return False

    def _reaches(self, i: int, depth: int, found, features: bool) -> bool:
        """Does the output of linear ``i`` reach an op ``found(j, op)`` accepts, through forward
        ops of its layer, layouts, elementwise ops and softmaxes with one activation operand (a parameter
        or a broadcast operand, a bias or a norm's scale, rides along); with ``features``, only
        through ops that keep the features the last dim (:meth:`_keeps_features`)?"""
        g = self.graph

        def passes(op: TOp) -> bool:
            out = max((math.prod(g.values[r].shape) for r in op.results), default=0)
            activations = [u for u in op.operands if not self._is_param_view(u) and math.prod(g.values[u].shape) >= out]
            return (
                op.name in ("layout", "elementwise", "softmax")
                and len(activations) == 1
                and (not features or self._keeps_features(op))
            )

        return self._forward_reach(i, depth, lambda j, _k, op: found(j, op), passes)

    def _keeps_features(self, op: TOp) -> bool:
        """Does layout or elementwise ``op`` keep its operand's last dim as its results' last
        dim (a cast, a view that leaves it, a slice or split of it)?"""
        g = self.graph
        n = g.values[op.operands[0]].shape
        for r in op.results:
            m = g.values[r].shape
            if not n or not m or (m[-1] != n[-1] and not (op.kind in ("slice", "split") and m[-1] < n[-1])):
                return False
        return True

    def _reaches_linear(self, i: int, depth: int) -> bool:
        """Does the output of linear ``i`` reach the input of another linear of its layer
        through forward elementwise, layout and reduction ops (no GEMM between)?"""
        return self._forward_reach(
            i,
            depth,
            lambda j, k, _op: j in self.linear_param and k == 0,
            lambda op: op.name in ("layout", "elementwise", "reduction"),
        )

    def _last_dim_of_square(self, j: int) -> bool:
        """Is reduction ``j`` a mean over the last dim of a ``pow`` (an RMSNorm's)?"""
        g = self.graph
        op = g.ops[j]
        v = op.operands[0]
        p = g.values[v].producer
        rank = len(g.values[v].shape)
        return (
            p >= 0
            and g.ops[p].name == "elementwise"
            and g.ops[p].kind == "pow"
            and tuple(d % rank for d in op.dims) == (rank - 1,)
        )

    def _is_param_view(self, v: int) -> bool:
        return self.root_param(v) >= 0

    def _find_param_grads(self) -> None:
        """Parameter gradients (and what they are views or casts of): all-reduced, never
        reduce-scattered along a sequence they do not have."""
        g = self.graph
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

    def _find_embedding_grads(self) -> None:
        """Embedding gradients -> the table of the lookup with the same indices."""
        g = self.graph
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
        b, s, t = max(self.graph.micro_batch, 1), self.graph.seq_len, self.width
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
        except SplitCannotPass:
            return None

    def is_chain_op(self, op: TOp) -> bool:
        """Is ``op`` a single-operand view or copy through which a value is still a view of
        its parameter (:data:`CHAIN_KINDS`), or a step of an FP8 cast of it
        (:data:`CAST_CHAIN_KINDS`: a dtype cast, its absolute value, or its scaling by a scale:
        every other operand a broadcast of fewer elements, as torchao's per-tensor or per-row
        scales are)?"""
        if len(op.results) != 1 or not op.operands:
            return False
        if len(op.operands) == 1 and op.name == "layout" and op.kind in CHAIN_KINDS:
            return True
        if op.name != "elementwise" or op.kind not in CAST_CHAIN_KINDS:
            return False
        values = self.graph.values
        shape = values[op.results[0]].shape
        if values[op.operands[0]].shape != shape:
            return False
        whole = math.prod(shape)
        return all(math.prod(values[v].shape) < whole for v in op.operands[1:])

    def root_param(self, v: int) -> int:
        """The parameter argument ``v`` is a view of (-1 if none)."""
        if v in self._root:
            return self._root[v]
        seen = []
        root = -1
        while True:
            seen.append(v)
            val = self.graph.values[v]
            if val.producer < 0:
                root = v if val.role == "param" else -1
                break
            op = self.graph.ops[val.producer]
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
        while self.graph.values[v].producer >= 0:
            p = self.graph.values[v].producer
            out.append(p)
            v = self.graph.ops[p].operands[0]
        return out[::-1]

    def layer_name(self, layer: int) -> str:
        """``layer N (module)``, for messages."""
        kind, module = self.graph.layers[layer] if 0 <= layer < len(self.graph.layers) else ("", "")
        return f"layer {layer} ({module or kind or '?'})"

    def _reaches_softmax_last(self, v: int, depth: int = 12) -> bool:
        """Does ``v`` reach a forward (log-)softmax over its last dim through views, copies and
        elementwise ops (casts, scaling, a bias)?"""
        frontier = [v]
        for _ in range(depth):
            nxt = []
            for u in frontier:
                for j, _k in self.consumers[u]:
                    op = self.graph.ops[j]
                    if op.phase != "fwd":
                        continue
                    if op.name == "softmax" and op.kind in ("softmax", "log_softmax"):
                        rank = len(self.graph.values[op.operands[0]].shape)
                        if op.dim % max(rank, 1) == rank - 1:
                            return True
                    if (op.name == "layout" and op.kind in VIEW_KINDS | {"clone"}) or op.name == "elementwise":
                        nxt.extend(op.results)
            frontier = nxt
            if not frontier:
                break
        return False

    def _find_vocab(self, multiple: int) -> None:
        """The LM heads (forward linears outside the blocks reaching a softmax over their last
        dim) and the word-embedding lookups whose table they match (by row count, or tied),
        and the vocabulary padded to a multiple of ``multiple * t``."""
        g = self.graph
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
        step = multiple * self.width
        self.padded_vocab = -(-self.vocab_size // step) * step if self.vocab_size else 0
        self.vocab_pad = self.padded_vocab - self.vocab_size

    def _check_heads(self) -> None:
        """Refuse a width that does not divide the attention heads of a block (the batch of a
        forward matmul of two activations in a block is micro-batch x heads), or that neither
        divides nor is a multiple of its key/value heads (grouped-query attention); find the
        key/value projections that stay replicated (fewer key/value heads than the width)."""
        g = self.graph
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
            if heads % self.width:
                raise ShardError(
                    f"width {self.width} does not divide the {heads} attention heads of {self.layer_name(op.layer)}"
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
                if kv % self.width and self.width % kv:
                    raise ShardError(
                        f"width {self.width} neither divides nor is a multiple of the {kv} key/value heads of "
                        f"{self.layer_name(op.layer)} (grouped-query attention, {heads} query heads); Megatron "
                        "requires one or the other"
                    )
                self.kv_linears[i] = (kv, heads)
                if kv < self.width:
                    self.kv_replicated.add(i)

    def _find_head_repeats(self) -> None:
        """The ops of the blocks that repeat key/value heads over the query heads (grouped-query
        attention), op -> the dim of its result that holds the repeated heads: the importer's
        ``repeat`` in a fused attention kernel's forward and backward (``aten = "attention"``,
        each head repeated in place: ``repeat_interleave``) and transformers' ``repeat_kv``, a view that
        merges the heads with the dim an ``expand`` broadcast after them
        (``x[:, :, None].expand(b, kv, g, s, d).reshape(b, kv * g, s, d)``, through a copy).
        A replicated key/value tensor is repeated locally into the query heads of the device."""
        g = self.graph
        self.head_repeats: dict[int, int] = {}
        for i, op in enumerate(g.ops):
            if op.name != "layout" or len(op.operands) != 1 or len(op.results) != 1:
                continue
            if self.block_layers and op.layer not in self.block_layers:
                continue
            src, dst = g.values[op.operands[0]].shape, g.values[op.results[0]].shape
            if op.kind == "repeat" and op.aten == "attention":
                d = repeated_dim(src, dst)
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
