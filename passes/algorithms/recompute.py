"""Activation recomputation: what each layer stashes for its backward under three policies.

Pure code (no xDSL); ``phaze-insert-recompute`` runs it on the IR's light graph.

- **none**: keep everything autograd saves for the layer's backward (the forward tensors its
  backward ops read, resolved to storage through views, each counted once; what
  ``#phaze.layer_info``'s ``saved_bytes`` counts).  Given a
  :class:`~passes.algorithms.partition.Partition` (a step compiled by ``torch.compile``, whose
  kernels are Inductor's), what AOTAutograd's min-cut partitioner keeps for it instead
  (:func:`passes.algorithms.partition.layer_saved`: the saved values its backward reaches
  through the forward ops it reruns); selective starts from that set, full is the same either
  way (the layer's input and what its backward reads from outside the layer).
- **selective** (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
  Models", 2022): recompute the attention core in backward and keep the rest.  The core is found
  by structure, not by names: a softmax between two batched matmuls whose operands are both
  activations (no parameter), i.e. ``Q·Kᵀ`` and ``P·V``; the core is every forward op of the
  layer on a path from the first matmul to the second (inclusive): scaling, masking, the
  softmax, converts, dropout and its mask (re-drawn from the saved RNG state).  Its saved
  outputs (the ``b·heads·s²`` score tensors) leave the stash; anything the core reads that the
  stash does not hold already (and that is not rebuilt from nothing, like a causal mask) joins
  it.
- **full**: keep only the layer's input and re-run its whole forward in backward.  The stash is
  the data-dependent activations the layer's forward reads from outside the layer (the hidden
  state for a transformer block; token ids and labels for the prologue and head), plus any
  other tensor from outside the layer that its backward reads.

**Megatron's fused kernels** (``--kernels megatron``: ``fused_kernels``, each forward op's
kernel id) save what their own backward kernels read, not what autograd would save of the ops
inside them: a fused kernel's backward recomputes its intermediates from the kernel's inputs.
megatron-core 0.16.1's ``bias_swiglu_impl`` (``megatron/core/fusions/fused_bias_swiglu.py``,
``BiasSwiGLUFunction.forward``: ``ctx.save_for_backward(input, bias)``; ``swiglu_back``
computes ``silu`` again) keeps the fc1 output alone, where autograd keeps ``silu(gate)`` too;
Transformer Engine's RMSNorm / LayerNorm (TE 2.20.0.dev0, ``module/_common.py`` and
``ops/basic/rmsnorm.py``: the input and ``rstdevs`` saved) keeps the bf16 input and the
per-row statistics, where a traced norm keeps its fp32 upcast. So, in a kernel of two or more
forward ops, a saved tensor that only the kernel's own ops read in the forward is replaced by
the kernel's data-dependent inputs, unless it is a statistic (fewer elements than the kernel's
largest input: a norm's reciprocal deviation), which the kernel saves as TE's do. A kernel's
output that an op outside it reads (a norm's output the next GEMM keeps) is kept as before.

**FP8 weight copies** (``--dtype fp8``, :meth:`Graph.fp8_weight_copies`) are in no policy's
stash: Transformer Engine casts a weight to FP8 (rowwise and columnwise) on the first
micro-batch of a step and keeps that workspace for every later one (``quantize_weight`` with
``cache_weight``, ``update_workspace`` only when ``is_first_microbatch``, in
``transformer_engine/pytorch/module/linear.py`` and ``module/base.py`` of TE 2.20.0.dev0;
megatron-core 0.16.1 passes ``is_first_microbatch`` from ``extensions/transformer_engine.py``),
and the backward reads that workspace (``wt_save = weightmat``): one copy per step, whatever
the micro-batches in flight.  ``fp8_weight_bytes`` is what the layer's forward casts (both
copies); the memory model holds it beside the weights (:mod:`passes.algorithms.memory`).

Extra forward time per micro-batch: ``full`` re-runs the forward (its scheduled makespan);
``selective`` the core (the makespan of the core's ops scheduled on their own).

**What "selective" re-runs** is the runtime's (:class:`Selective`, ``phazec
--selective-recompute``); the three policies stay the DP's three:

- ``attention`` (default): Megatron-LM's ``--recompute-granularity selective``, above.
- ``op``: torchtitan's per-op selective checkpointing of each transformer block
  (``SelectiveAC`` in ``torchtitan/distributed/activation_checkpoint.py``, torchtitan 0.3.0; the
  same rule as ``_apply_ac_to_transformer_block``'s ``op`` mode at the commit of its published
  runs, 0413364).  Under ``torch.utils.checkpoint``'s selective contexts the block's input and
  the outputs of the ops the policy marks ``MUST_SAVE`` are stashed; every other forward op runs
  again in backward.  ``MUST_SAVE``: the compute-intensive ops (``get_default_op_list()`` in
  ``torch/_functorch/partitioners.py``: ``mm``, ``bmm``, ``addmm``, the SDPA kernels) except
  every second ``mm`` of the block (a counter per block and pass: the 1st, 3rd, ... are saved).
  Here an attention core is one saved op (flash attention's output and statistics), a matmul of
  two activations outside a core is a saved ``bmm``, and every matmul with a parameter operand
  counts as an ``mm``, an FP8 linear's too: its weight operand is the weight's FP8 copy, and
  torchao's ``Float8Linear`` calls ``torch.mm`` on its ``Float8Tensor`` operands, which the
  policy's dispatch mode sees as ``aten.mm`` before the tensor subclass runs it as
  ``aten._scaled_mm`` (a ``TorchDispatchMode`` is called before a subclass's
  ``__torch_dispatch__``; ``torchao/float8/float8_ops.py`` implements ``aten.mm``; under
  ``torch.compile`` ``_CachingTorchDispatchMode`` tags the nodes the call makes with that policy)
  (torchtitan's Llamas have no biases; a linear with a bias, which aten runs
  as an ``addmm``, torchtitan always saves, and MoE's grouped GEMMs, which are not in the list,
  it recomputes: both are counted as ``mm`` here).  Layers that are not blocks are not
  checkpointed.
- ``layer:N``: torchtitan's selective layer checkpointing (``selective_ac_option = "N"`` at
  0413364, ``_apply_ac_to_transformer_block``): a counter over the blocks, from 1; block k
  (0-based) is fully checkpointed when ``(k + 1) % N == 0``, the others keep everything.  Its
  "selective" is, per block, either full's stash and time or none's.
- ``share:P``: fms-fsdp's selective activation checkpointing (``selective_checkpointing = P``,
  ``apply_fsdp_checkpointing`` in ``fms_fsdp/policies/ac_handler.py`` at ed74fd5d): a share P
  of the blocks (0 < P <= 1, a decimal or a fraction ``a/b``) checkpointed whole, evenly spaced:
  with a counter over the blocks from 1 and a cut-off from 1/2, block k is checkpointed when
  ``k * P >= cut-off``, which then grows by 1 (P = 1/2: every second block from the first;
  P = 1: every block, full's).  Computed in exact fractions (the source's floats agree for the
  shares it is run with).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from passes.algorithms.graph import Graph
from passes.algorithms.partition import Partition, layer_saved
from passes.algorithms.saved import saved_storages
from phaze_ir.op_kinds import RecomputePolicy

POLICIES = tuple(p.value for p in RecomputePolicy)

#: The forms of ``--selective-recompute`` (``layer:N`` with N >= 1, ``share:P`` with 0 < P <= 1),
#: see the module docstring.
SELECTIVE_FORMS = ("attention", "op", "layer:N", "share:P")
_LAYER_EVERY = re.compile(r"layer:([1-9][0-9]{0,5})")
_SHARE = re.compile(r"share:([0-9]{1,6}(?:\.[0-9]{1,6})?(?:/[1-9][0-9]{0,5})?)")


@dataclass(frozen=True)
class Selective:
    """What the ``selective`` policy re-runs: ``kind`` ``attention``, ``op``, ``layer`` (every
    ``every``-th block checkpointed whole) or ``share`` (a share ``share`` of the blocks
    checkpointed whole, evenly spaced)."""

    kind: str = "attention"
    every: int = 0
    share: Fraction = Fraction(0)

    def __str__(self) -> str:
        if self.kind == "layer":
            return f"layer:{self.every}"
        return f"share:{self.share}" if self.kind == "share" else self.kind


ATTENTION = Selective()


def parse_selective(text: object) -> Selective:
    """A ``--selective-recompute`` value; ValueError saying what is wrong otherwise."""
    if text in ("attention", "op"):
        return Selective(str(text))
    m = _LAYER_EVERY.fullmatch(text) if isinstance(text, str) else None
    if m is not None:
        return Selective("layer", int(m.group(1)))
    m = _SHARE.fullmatch(text) if isinstance(text, str) else None
    share = Fraction(m.group(1)) if m is not None else Fraction(0)
    if not 0 < share <= 1:
        forms = f"{', '.join(SELECTIVE_FORMS[:-1])} or {SELECTIVE_FORMS[-1]}"
        raise ValueError(
            f"expected {forms} (N a positive integer, up to 999999; P a share of the blocks above 0 and "
            "at most 1, as 0.75 or 3/4)"
        )
    return Selective("share", share=share)


def selective_problem(text: object) -> str | None:
    """The check of ``Options.selective_recompute`` (and of the pass option): the problem in
    words, or None."""
    try:
        parse_selective(text)
    except ValueError as err:
        return str(err)
    return None


_KIND = re.compile(r'kind="([^"]*)"')
_MATMUL = "phaze.matmul"


def op_name(graph: Graph, i: int) -> str:
    """The op's name (``phaze.matmul``), from its signature."""
    return graph.ops[i].signature.split("|", 1)[0]


def op_kind(graph: Graph, i: int) -> str:
    """The op's ``kind`` property (``"softmax"``), from its signature ("" if it has none)."""
    parts = graph.ops[i].signature.split("|")
    m = _KIND.search(parts[1]) if len(parts) > 1 else None
    return m.group(1) if m else ""


@dataclass
class LayerRecompute:
    """One layer under the three policies (bytes per micro-batch; ``*_ops`` are op ids)."""

    index: int
    none_bytes: int
    selective_bytes: int
    full_bytes: int
    selective_ops: list[int] = field(default_factory=list)
    fwd_ops: list[int] = field(default_factory=list)
    none_storages: set[int] = field(default_factory=set)
    selective_storages: set[int] = field(default_factory=set)
    full_storages: set[int] = field(default_factory=set)
    #: under a partition: the forward ops the layer's backward reruns with no recompute policy
    none_recomputed: list[int] = field(default_factory=list)
    #: the FP8 copies of its weights its forward makes (:meth:`Graph.fp8_weight_copies`): kept
    #: once per step, not per micro-batch, so in no stash (the module docstring)
    fp8_weight_bytes: int = 0
    fp8_weight_storages: set[int] = field(default_factory=set)

    def saved_bytes(self) -> list[int]:
        """``[none, selective, full]``, the order of the placement DP."""
        return [self.none_bytes, self.selective_bytes, self.full_bytes]


def _is_activation(graph: Graph, v: int) -> bool:
    s = graph.storage(v)
    return graph.values[s].role != "param"


def attention_cores(graph: Graph, fwd_ops: Sequence[int]) -> list[list[int]]:
    """The attention cores among ``fwd_ops`` (one layer's forward ops, in program order): for
    every softmax, the ops on paths from the nearest activation×activation matmul before it to
    the nearest one after it (both included).  Sorted op-id lists, one per core."""
    in_layer = set(fwd_ops)
    producer = {}
    for i in fwd_ops:
        for r in graph.ops[i].results:
            producer[r] = i
    preds: dict[int, set[int]] = {i: {producer[v] for v in graph.ops[i].operands if v in producer} for i in fwd_ops}
    succs: dict[int, set[int]] = {i: set() for i in fwd_ops}
    for i, ps in preds.items():
        for p in ps:
            succs[p].add(i)

    def closure(start: int, nxt: Mapping[int, set[int]]) -> set[int]:
        seen = {start}
        stack = [start]
        while stack:
            u = stack.pop()
            for w in nxt[u]:
                if w not in seen:
                    seen.add(w)
                    stack.append(w)
        return seen

    act_mm = {
        i
        for i in fwd_ops
        if op_name(graph, i) == _MATMUL
        and len(graph.ops[i].operands) >= 2
        and all(_is_activation(graph, v) for v in graph.ops[i].operands[:2])
    }
    cores: list[list[int]] = []
    taken: set[int] = set()
    for s in fwd_ops:
        if op_name(graph, s) != "phaze.softmax" or op_kind(graph, s) not in ("softmax", "log_softmax") or s in taken:
            continue
        up = closure(s, preds) & act_mm
        down = closure(s, succs) & act_mm
        if not up or not down:
            continue
        first = max(up)  # the nearest (latest) score matmul before the softmax
        second = min(down)  # the nearest context matmul after it
        core = closure(first, succs) & closure(second, preds) & in_layer
        if core & taken:
            continue
        taken |= core
        cores.append(sorted(core))
    return cores


def op_policy_saved(
    graph: Graph, fwd_ops: Sequence[int], cores: Sequence[Sequence[int]], fp8_weights: set[int] | None = None
) -> set[int]:
    """The forward ops of one block (in program order) whose outputs torchtitan's per-op policy
    saves (``MUST_SAVE``, module docstring): every attention core whole, every matmul of two
    activations, and the odd-numbered matmuls with a parameter operand (1st, 3rd, ...), an FP8
    copy of a weight (``fp8_weights``, :meth:`Graph.fp8_weight_copies`) counting as its
    parameter."""
    saved = {i for core in cores for i in core}
    weights = graph.fp8_weight_copies() if fp8_weights is None else fp8_weights
    linears = 0
    for i in fwd_ops:
        if i in saved or op_name(graph, i) != _MATMUL:
            continue
        operands = graph.ops[i].operands[:2]
        if all(_is_activation(graph, v) and graph.storage(v) not in weights for v in operands):
            saved.add(i)  # a bmm: compute-intensive, never counted
            continue
        linears += 1
        if linears % 2 == 1:
            saved.add(i)
    return saved


def _attention_selective(
    graph: Graph, cores: Sequence[Sequence[int]], none: set[int], stats: Mapping[int, int], dep: Sequence[bool]
) -> tuple[list[int], set[int], int]:
    """Megatron's selective recompute of one layer: (the ops re-run, the storages kept, the
    statistics' bytes kept): the attention cores' saved outputs go, what the cores read joins."""
    core_ops = sorted(i for core in cores for i in core)
    core_out = {r for i in core_ops for r in graph.ops[i].results}
    core_set = set(core_ops)
    kept = {s for s in none if s not in core_out}
    for i in core_ops:
        for v in graph.ops[i].operands:
            s = graph.storage(v)
            val = graph.values[s]
            if s in core_out or val.role == "param" or not dep[s]:
                continue
            if val.producer >= 0 and val.producer in core_set:
                continue
            kept.add(s)
    return core_ops, kept, sum(b for i, b in stats.items() if i not in core_set)


def _op_selective(
    graph: Graph,
    fwd_ops: Sequence[int],
    cores: Sequence[Sequence[int]],
    none: set[int],
    full: set[int],
    stats: Mapping[int, int],
    users: Mapping[int, Sequence[int]],
    fp8_weights: set[int],
) -> tuple[list[int], set[int], int]:
    """torchtitan's per-op policy on one block: (the ops re-run, the storages kept, the
    statistics' bytes kept).  Kept: the block's input (full's stash) and the outputs of the
    saved ops (:func:`op_policy_saved`); of an attention core (with the statistics it keeps for
    its backward, :func:`_with_statistics`), what autograd keeps of it (the fused kernel's
    output and statistics) and what leaves it.  Re-run: every other forward op.  ``users``:
    the ops that read each storage (through any view of it)."""
    fwd_set = set(fwd_ops)
    cores = [_with_statistics(graph, fwd_ops, core, users, fwd_set) for core in cores]
    saved = op_policy_saved(graph, fwd_ops, cores, fp8_weights)
    core_set = {i for core in cores for i in core}
    kept = set(full)
    for i in saved:
        results = {graph.storage(r) for r in graph.ops[i].results}
        if i in core_set:
            leaving = {s for s in results if any(u not in core_set for u in users.get(s, ()))}
            results = (results & none) | leaving
        kept |= {s for s in results if graph.values[s].role != "param"}
    rerun = [i for i in fwd_ops if i not in saved]
    return rerun, kept, sum(b for i, b in stats.items() if i in saved)


def _with_statistics(
    graph: Graph, fwd_ops: Sequence[int], core: Sequence[int], users: Mapping[int, Sequence[int]], fwd_set: set[int]
) -> list[int]:
    """An attention core with the forward ops that compute, from the core's values alone, what
    only the backward reads (the softmax's log-sum-exp that a fused attention kernel returns
    beside its output): one aten op, SDPA, makes them all."""
    ext = set(core)
    for i in fwd_ops:
        op = graph.ops[i]
        if i in ext or op_name(graph, i) == _MATMUL:
            continue
        producers = {graph.values[graph.storage(v)].producer for v in op.operands if _is_activation(graph, v)}
        if not producers or not producers <= ext:
            continue
        if any(u in fwd_set for r in op.results for u in users.get(graph.storage(r), ())):
            continue
        ext.add(i)
    return sorted(ext)


def _checkpointed(selective: Selective, kinds: Sequence[str]) -> list[bool]:
    """Which layers ``layer:N`` or ``share:P`` checkpoints whole (the module docstring): with
    a counter k over the blocks from 1, ``layer:N`` block k when ``k % N == 0`` (torchtitan's),
    ``share:P`` when ``k * P`` reaches the cut-off, from 1/2 up by 1 each time (fms-fsdp's)."""
    out, k, cut_off = [], 0, Fraction(1, 2)
    for kind in kinds:
        if kind != "block":
            out.append(False)
            continue
        k += 1
        if selective.kind == "layer":
            out.append(k % selective.every == 0)
        else:
            out.append(k * selective.share >= cut_off)
            cut_off += out[-1]
    return out


def outside_inputs(graph: Graph, ops: Iterable[int], own: set[int], dep: Sequence[bool]) -> set[int]:
    """The data-dependent storages ``ops`` read from outside ``own`` (what they make): an op's
    result or the step's input, never a parameter (not an activation)."""
    out = set()
    for i in ops:
        for v in graph.ops[i].operands:
            s = graph.storage(v)
            val = graph.values[s]
            if s in own or val.role == "param" or not dep[s]:
                continue
            if val.producer >= 0 or val.role == "input":
                out.add(s)
    return out


def _elements(graph: Graph, storage: int) -> int:
    """Elements of a storage (its bytes where its element size is not known)."""
    v = graph.values[storage]
    return v.nbytes // v.element_bytes if v.element_bytes else v.nbytes


class _FusedKernels:
    """The forward kernels of two or more ops (``kernel_of``: each op's kernel id) and what
    their backward kernels keep (module docstring, "Megatron's fused kernels")."""

    def __init__(self, graph: Graph, kernel_of: Sequence[int | None], dep: Sequence[bool]) -> None:
        self.graph, self.kernel_of = graph, kernel_of
        members: dict[int, list[int]] = {}
        for i, op in enumerate(graph.ops):
            if op.phase == "fwd" and i < len(kernel_of) and kernel_of[i] is not None:
                members.setdefault(kernel_of[i], []).append(i)  # type: ignore[arg-type]
        self.members = {k: set(ops) for k, ops in members.items() if len(ops) > 1}
        self.fwd_readers: dict[int, set[int]] = {}
        for i, op in enumerate(graph.ops):
            if op.phase == "fwd":
                for v in op.operands:
                    self.fwd_readers.setdefault(graph.storage(v), set()).add(i)
        self.inputs: dict[int, set[int]] = {
            k: outside_inputs(graph, ops, {graph.storage(r) for i in ops for r in graph.ops[i].results}, dep)
            for k, ops in self.members.items()
        }

    def saved(self, autograd: set[int]) -> set[int]:
        """``autograd``'s saved storages as the fused kernels keep them."""
        graph, out = self.graph, set(autograd)
        for st in autograd:
            producer = graph.values[st].producer
            k = self.kernel_of[producer] if 0 <= producer < len(self.kernel_of) else None
            if k is None or k not in self.members:
                continue
            # views (no kernel of their own) are index arithmetic in the reading kernel
            readers = {i for i in self.fwd_readers.get(st, set()) if self.kernel_of[i] is not None}
            if not readers or not readers <= self.members[k]:
                continue  # the kernel's output, or only the backward reads it (a dropout mask)
            ins = self.inputs[k]
            if ins and _elements(graph, st) < max(_elements(graph, s) for s in ins):
                continue  # a statistic (a norm's reciprocal deviation), saved as TE's are
            out.discard(st)
            out |= ins
        return self._across_kernels(out)

    def _across_kernels(self, saved: set[int]) -> set[int]:
        """``saved`` with what Megatron's kernels keep where the traced ops are kernels of their
        own that Megatron runs as one (module docstring): a norm's widening upcast of its input
        (read by the norm's mean, at most one pointwise op away) is the 2-byte input TE's norms
        keep; an activation (``silu``, ``gelu``) whose input is saved already and which only
        pointwise ops read (``silu(gate) · up``) is recomputed from that input
        (``bias_swiglu``'s, ``bias_gelu``'s backward)."""
        graph, out = self.graph, set(saved)
        for st in saved:
            p = graph.values[st].producer
            if p < 0 or graph.ops[p].phase != "fwd":
                continue
            kind = _kind(graph, p)
            data = [graph.storage(v) for v in graph.ops[p].operands if graph.values[graph.storage(v)].producer >= 0]
            if kind == ("phaze.elementwise", "convert") and len(data) == 1:
                x = data[0]
                wider = graph.values[st].element_bytes > graph.values[x].element_bytes > 0
                if wider and self._feeds_a_mean(st):
                    out.discard(st)
                    out.add(x)
            elif kind in _RECOMPUTED_ACTIVATIONS and len(data) == 1 and data[0] in saved:
                readers = self.fwd_readers.get(st, set())
                if readers and all(_kind(graph, i)[0] == _ELEMENTWISE for i in readers):
                    out.discard(st)
        return out

    def _feeds_a_mean(self, st: int) -> bool:
        """Whether a ``mean`` reduction reads ``st`` in the forward, directly or through one
        pointwise op (an RMSNorm's ``pow``)."""
        graph = self.graph
        for i in self.fwd_readers.get(st, set()):
            if _kind(graph, i) == ("phaze.reduction", "mean"):
                return True
            if _kind(graph, i)[0] == _ELEMENTWISE:
                for r in graph.ops[i].results:
                    if any(_kind(graph, j) == ("phaze.reduction", "mean") for j in self.fwd_readers.get(r, set())):
                        return True
        return False


#: Megatron's fused activations whose backward recomputes them from their saved input
#: (megatron-core 0.16.1 ``fused_bias_swiglu.py``, ``fused_bias_gelu.py``).
_RECOMPUTED_ACTIVATIONS = frozenset((("phaze.elementwise", "silu"), ("phaze.elementwise", "gelu")))


#: The op names (a graph's signatures start with them) the stash rules read.
_ELEMENTWISE = "phaze.elementwise"


def _kind(graph: Graph, i: int) -> tuple[str, str]:
    """(op name, its ``kind`` property) of op ``i``, read from its signature ("" when it has
    none: a graph built without signatures)."""
    name, _, rest = graph.ops[i].signature.partition("|")
    props, _, _ = rest.partition("|")
    for prop in props.split(","):
        key, _, value = prop.partition("=")
        if key == "kind":
            return name, value.strip('"')
    return name, ""


def _kept_fp8_weights(graph: Graph, fwd_ops: Iterable[int], bwd_ops: Iterable[int], fp8_weights: set[int]) -> set[int]:
    """The FP8 weight copies a layer's forward makes and keeps for the step: those its backward
    reads, and those they are made from (TE's rowwise copy, whose transpose the backward reads:
    both are its workspace).  A copy the backward does not read is the forward's alone and
    freed with it (torchao casts the weight again in the backward, ``--fp8-recipe tensorwise``
    and ``rowwise``)."""
    made = {r for i in fwd_ops for r in graph.ops[i].results} & fp8_weights
    read = {graph.storage(v) for i in bwd_ops for v in graph.ops[i].operands}
    kept = made & read
    for i in reversed(list(fwd_ops)):
        op = graph.ops[i]
        if any(graph.storage(r) in kept for r in op.results):
            kept |= {graph.storage(v) for v in op.operands} & made
    return kept


def analyze_recompute(
    graph: Graph,
    layer_of: Sequence[int],
    partition: Partition | None = None,
    selective: Selective = ATTENTION,
    kinds: Sequence[str] | None = None,
    fused_kernels: Sequence[int | None] | None = None,
) -> list[LayerRecompute]:
    """The three policies of every layer (see the module docstring); ``partition``: what a
    compiled step saves (None: eager autograd); ``selective``: what the selective policy
    re-runs, with ``kinds`` the layers' kinds (``#phaze.layer_info``'s: ``block``, ...), which
    ``op`` and ``layer:N`` need (only blocks are checkpointed); ``fused_kernels``: each op's
    kernel id under Megatron's fused kernels (None: autograd's saved tensors)."""
    if selective != ATTENTION and kinds is None:
        raise ValueError(f"selective recompute {selective} needs the layers' kinds")
    n_layers = max(layer_of, default=-1) + 1
    whole = selective.kind in ("layer", "share")
    checkpointed = _checkpointed(selective, kinds) if whole and kinds else [False] * n_layers
    fwd: list[list[int]] = [[] for _ in range(n_layers)]
    bwd: list[set[int]] = [set() for _ in range(n_layers)]
    for i, op in enumerate(graph.ops):
        if op.phase == "fwd":
            fwd[layer_of[i]].append(i)
        elif op.phase == "bwd":
            bwd[layer_of[i]].add(i)
    dep = graph.data_dependent()
    users = graph.readers() if selective.kind == "op" else {}

    def nbytes(storages: set[int]) -> int:
        return sum(graph.values[s].nbytes for s in storages)

    compiled = layer_saved(graph, partition, layer_of) if partition is not None else None
    fused = _FusedKernels(graph, fused_kernels, dep) if fused_kernels is not None and compiled is None else None
    fp8_weights = graph.fp8_weight_copies()
    out = []
    for layer in range(n_layers):
        # Statistics a partition saves that are not values (a softmax's), op -> bytes.
        stats: dict[int, int] = {}
        autograd = saved_storages(graph, bwd[layer]) - fp8_weights
        none = autograd if fused is None else fused.saved(autograd)
        if compiled is not None:
            none, stats = compiled[layer].storages - fp8_weights, compiled[layer].stats
        cached = _kept_fp8_weights(graph, fwd[layer], bwd[layer], fp8_weights)
        own = {r for i in fwd[layer] for r in graph.ops[i].results}
        # Full: the data-dependent inputs of the forward, plus whatever else from outside the
        # layer its backward reads (parameters are not activations).
        full = outside_inputs(graph, fwd[layer], own, dep) | {s for s in autograd if s not in own}
        cores = attention_cores(graph, fwd[layer])
        is_block = kinds is not None and layer < len(kinds) and kinds[layer] == "block"
        if selective.kind == "attention":
            rerun, kept, kept_stats = _attention_selective(graph, cores, none, stats, dep)
        elif selective.kind == "op" and is_block:
            rerun, kept, kept_stats = _op_selective(graph, fwd[layer], cores, none, full, stats, users, fp8_weights)
        elif checkpointed[layer]:
            rerun, kept, kept_stats = list(fwd[layer]), full, 0
        else:  # not checkpointed: selective keeps what none keeps
            rerun, kept, kept_stats = [], none, sum(stats.values())
        out.append(
            LayerRecompute(
                index=layer,
                none_bytes=nbytes(none) + sum(stats.values()),
                selective_bytes=nbytes(kept) + kept_stats,
                full_bytes=nbytes(full),
                selective_ops=rerun,
                fwd_ops=list(fwd[layer]),
                none_storages=none,
                selective_storages=kept,
                full_storages=full,
                none_recomputed=sorted(compiled[layer].recomputed) if compiled is not None else [],
                fp8_weight_bytes=nbytes(cached),
                fp8_weight_storages=cached,
            )
        )
    return out
