"""What a compiled step saves for its backward: AOTAutograd's min-cut partitioner.

Pure code (no xDSL); ``phaze-insert-recompute`` runs it on the light graph of a step whose
kernels are Inductor's (``phaze.kernels = "inductor"``, design §5.11).  Eager autograd keeps
every tensor a backward formula reads (:mod:`passes.algorithms.saved`); ``torch.compile``
traces the forward and backward as one joint graph and splits it with
``min_cut_rematerialization_partition`` (``torch/_functorch/partitioners.py``, torch 2.15, the
``inductor`` compiler, its defaults in ``torch/_functorch/config.py``), which saves the
cheapest set of values from which the backward can recompute the rest: a chain of pointwise ops
between two GEMMs (GPT-2's tanh-GELU) is rerun inside the backward's fused kernels from the
chain's input instead of keeping its intermediates.

The rules, each from that file unless named otherwise (functions in parentheses):

**Nodes.**  One node per value of the step (a phaze op's results, the step's arguments); the
optimizer's ops are outside the compiled graph and left out.  The partitioner sees the graph
after Inductor's decompositions (``torch._inductor.decomposition.select_decomp_table``), so an
op phaze keeps whole is split where the decomposition splits it: a norm's statistics (its
results after the first; ``var_mean``) are nodes of their own that its output is computed from,
and a softmax gets a hidden statistics node (``amax`` and ``sum``, two fp32 values per row)
between its input and its output.

**Forward, backward.**  The backward starts at the loss gradient's seed (the first backward
op, ``ones_like(loss)``: AOTAutograd's tangent, a graph input, so its operands are dropped);
every backward value that depends on it is *required for backward* and must be computed in
the backward (``classify_nodes``: the tangents' closure; its nodes get ``in -> sink``).
*Required forward* nodes are the step's arguments and the forward values the forward outputs
(the loss) depend on; the other values (a backward op that reads only forward values, a
forward value read only by the backward) are *unclaimed*: free to go either way, never banned.
A gradient (a backward output) outside the closure must be available (``out -> sink``).

**What may not be recomputed** (``solve_min_cut.should_ban_recomputation``, config defaults;
a banned node gets ``source -> in``): an argument (``_is_primal``); a forward op not on the
recomputable allowlist (``ban_recompute_not_in_allowlist``; ``get_default_op_list``: the
``pointwise``-tagged aten ops, casts, views, creation ops, ``sum``/``mean``/``amax``/``var``,
``index``/``gather``, ``clone``; random ops and the compute-intensive ``mm``/``bmm``/
``addmm``/``convolution``/fused attention are not on it; :func:`op_class` says which phaze ops
are, after Inductor's decompositions: ``cat`` of one non-empty tensor is a ``clone``,
``transpose`` a ``permute``, ``roll``/``tril`` pointwise, while ``embedding``,
``constant_pad_nd``, ``repeat``, ``flip``, ``scatter``, ``cumsum``, ``prod``, ``sort``/``topk``,
collectives and opaque ops stay banned); one *materialized in the backward*
(``ban_recompute_materialized_backward``, ``is_materialized_backwards``: a backward user, through
views, that cannot fuse with it, as a GEMM's weight-gradient reads its input); one whose output
is less than a quarter of its inputs' bytes (``ban_recompute_reductions``: a reduction's small
result is kept, never recomputed); ``max_dist_from_bw = 1000`` bans nothing (the test is
``1000 > d > 1000``).  Two more heuristics ban forward nodes: *used far apart*
(``ban_recompute_used_far_apart``: a fusible user of a value that comes after the first
unfusible op reachable from the value's earlier users, e.g. a residual add after the block's
GEMMs) and *long fusible chains* (``ban_recompute_long_fusible_chains``: a chain of fusible
forward nodes longer than 100 nodes in forward order is cut by banning the node where it
ends).  Views are never banned (``ban_recomputation_if_allowed``).

**Weights** (``get_node_weight``): the value's bytes (a view's own, ``_size_of``) times
``1.1 ** max(min(dist, 100), 1)``, ``dist`` the distance in ops to the nearest node not
required for the forward (``dist_from_bw``), doubled when every user of the value can fuse
with it (not ``is_materialized``: saving it would make a fused kernel write it); parameters and
buffers weigh 0 (``treat_parameters_as_free_to_save``, static inputs).  Fusible means both ops
are on the allowlist or random, or the user is a ``cat`` (``solve_min_cut.is_fusible``).

**The cut.**  Each node is an ``in -> out`` edge of its weight, each data dependency an
infinite ``out -> user in`` edge; the minimum ``source``-``sink`` cut (:func:`min_cut_sink_side`,
the one networkx and torch's ``_activation_checkpointing/min_cut.py`` return: the cut nearest
the sink) cuts the ``in -> out`` edges of the values saved.  ``activation_memory_budget = 1`` (the default): this
one cut is the answer (``choose_saved_values_set``).

**What phaze counts.**  A saved value keeps its storage alive (a saved view its base), as in
:mod:`passes.algorithms.saved`; parameters and buffers are not activations.  A layer's saved
set (:func:`layer_saved`) is what its backward ops read, through the values recomputed for them,
down to saved values.  Granularity differs from torch's: phaze's ops are aten ops before
decomposition (a layer norm is one node, Inductor's graph has eight), so ``dist`` and the
100-node chain limit count phaze's nodes; the weights' ties may break otherwise than torch's.
Not modelled: activation-checkpointing tags (``must_recompute``), an
``activation_memory_budget`` below 1 (its knapsack), the total-weight and other 0-d values a
multi-result op yields beside what the loss depends on (unclaimed here, saved by torch).
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from passes.algorithms.graph import Graph

#: What a node is to the partitioner: on the recomputable allowlist (``RECOMPUTE``; ``VIEW``
#: too), a random op, compute-intensive, a ``cat`` (banned, but a user that fuses with anything),
#: or anything else off the allowlist.
RECOMPUTE, VIEW, RANDOM, COMPUTE, CAT, OTHER, ARG = "recompute", "view", "random", "compute", "cat", "other", "arg"
FUSIBLE = (RECOMPUTE, VIEW, RANDOM)

#: torch/_functorch/config.py (torch 2.15).
MAX_DIST_FROM_BW = 1000
#: ``ban_recompute_long_fusible_chains``: forward nodes past which a fusible chain is cut.
LONG_CHAIN = 100
#: ``should_ban_recomputation``: an output this many times smaller than its inputs is kept.
REDUCTION_RATIO = 4
#: Bytes of one softmax statistic (``amax``, ``sum``): Inductor's decomposition computes them
#: in fp32 (``_softmax``, ``_log_softmax`` in ``torch/_decomp/decompositions.py``).
STAT_BYTES = 4

_INF = math.inf
_ATEN = re.compile(r'aten="([^"]*)"')
_KIND = re.compile(r'kind="([^"]*)"')
_DIM = re.compile(r"dim=(-?\d+) ")
_TENSOR = re.compile(r"tensor<([^>]*)>")

#: Elementwise aten ops off the allowlist that no decomposition puts on it.
_BANNED_ELEMENTWISE = frozenset({"copy"})
#: Reductions off the allowlist (``prod``, ``cumsum``: no decomposition) and selections.
_BANNED_REDUCTIONS = frozenset({"prod", "topk", "sort", "histc"})
_BANNED_REDUCTION_ATEN = frozenset({"cumsum", "prod"})
#: Layout copies on the allowlist after Inductor's decompositions (``clone``; ``index_select``
#: -> ``index``; ``gather``; ``roll`` -> ``iota``/``fmod``/``index``; ``tril`` -> ``where``).
_RECOMPUTED_COPIES = frozenset({"clone", "index", "gather", "roll", "tril", "triu"})
#: The phaze ops the classes below name (``op.name``).
_MATMUL, _NORM, _SOFTMAX = "phaze.matmul", "phaze.norm", "phaze.softmax"
_REDUCTION, _ELEMENTWISE, _LAYOUT = "phaze.reduction", "phaze.elementwise", "phaze.layout"
#: Aten ops phaze expands into several ops that torch runs as one compute-intensive node.
_COMPUTE_ATEN = frozenset({"attention", "convolution", "convolution_backward"})


def _packet(aten: str) -> str:
    """``aten.mul.Tensor`` -> ``mul``; in-place ``div_`` -> ``div``."""
    parts = aten.split(".")
    name = parts[1] if len(parts) > 1 and parts[0] == "aten" else parts[0]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


@dataclass(frozen=True)
class OpClass:
    """An op as the partitioner sees it: ``cls`` of its results; ``stats_results``: how many of
    its last results are statistics its first result is computed from (a norm's mean and
    rstd); ``stats_bytes``: bytes of the statistics a softmax computes on the way (0: none)."""

    cls: str
    stats_results: int = 0
    stats_bytes: int = 0


def _shape(text: str) -> tuple[int, ...]:
    dims = text.split("x")[:-1]
    return tuple(int(d) for d in dims) if all(d.isdigit() for d in dims) else ()


def op_class(graph: Graph, i: int) -> OpClass:
    """How the partitioner treats op ``i`` (from its signature: name, ``kind``, ``aten``; see
    the module docstring for the sources)."""
    op = graph.ops[i]
    name, _, rest = op.signature.partition("|")
    props, _, types = rest.partition("|")
    kind_m, aten_m = _KIND.search(props), _ATEN.search(props)
    kind = kind_m.group(1) if kind_m else ""
    aten = _packet(aten_m.group(1)) if aten_m else ""
    view = bool(op.results) and graph.values[op.results[0]].view_of is not None
    if view:
        return OpClass(VIEW)
    if aten in _COMPUTE_ATEN or name == _MATMUL:
        return OpClass(COMPUTE)
    if name == _NORM:
        stats = len(op.results) - 1 if not kind.endswith("_grad") else 0
        return OpClass(RECOMPUTE, stats_results=max(0, stats))
    if name == _SOFTMAX:
        if kind in ("softmax", "log_softmax"):
            shapes = _TENSOR.findall(types)
            shape = _shape(shapes[0]) if shapes else ()
            dim_m = _DIM.search(props + " ")
            if shape and dim_m:
                dim = int(dim_m.group(1)) % len(shape)
                rows = math.prod(shape) // max(1, shape[dim])
                return OpClass(RECOMPUTE, stats_bytes=2 * STAT_BYTES * rows)
        return OpClass(RECOMPUTE)
    if name == _REDUCTION:
        banned = kind in _BANNED_REDUCTIONS or aten in _BANNED_REDUCTION_ATEN
        return OpClass(OTHER if banned else RECOMPUTE)
    if name == _ELEMENTWISE:
        if kind == "random":
            return OpClass(RANDOM)
        return OpClass(OTHER if aten in _BANNED_ELEMENTWISE else RECOMPUTE)
    if name == _LAYOUT:
        if kind in _RECOMPUTED_COPIES:
            return OpClass(RECOMPUTE)
        if kind in ("cat", "stack"):
            # Inductor's ``cat`` decomposition: one non-empty tensor (or one tensor repeated) is
            # a clone; several stay a ``cat`` (``stack`` is a ``cat`` of unsqueezed tensors).
            distinct = {v for v in op.operands if graph.values[v].nbytes > 0}
            return OpClass(RECOMPUTE if len(distinct) <= 1 else CAT)
        return OpClass(OTHER)
    return OpClass(OTHER)


@dataclass
class Partition:
    """The partitioner's answer.  Nodes are value ids, and ``len(graph.values) + i`` for the
    hidden statistics of op ``i`` (a softmax's).  ``saved``: the nodes whose ``in -> out`` edge
    the cut crosses; ``banned``: the nodes banned from recomputation; ``inputs[n]``: what node
    ``n`` is computed from; ``backward``: the nodes computed in the backward whatever the cut
    (the tangent's closure); ``stats_bytes[i]``: bytes of op ``i``'s hidden statistics."""

    saved: set[int]
    banned: set[int]
    inputs: dict[int, list[int]]
    backward: set[int]
    stats_bytes: dict[int, int] = field(default_factory=dict)
    n_values: int = 0

    def op_of(self, graph: Graph, node: int) -> int:
        """The op that computes ``node`` (-1 for an argument)."""
        return node - self.n_values if node >= self.n_values else graph.values[node].producer


@dataclass
class LayerSaved:
    """One layer's backward under a :class:`Partition`: the storages it keeps (value ids, as
    :func:`passes.algorithms.saved.saved_storages` gives them), the bytes of saved statistics
    that are not values (``stats``, op id -> bytes), and the forward ops its backward reruns."""

    storages: set[int] = field(default_factory=set)
    stats: dict[int, int] = field(default_factory=dict)
    recomputed: set[int] = field(default_factory=set)

    def nbytes(self, graph: Graph) -> int:
        return sum(graph.values[s].nbytes for s in self.storages) + sum(self.stats.values())


def min_cut_partition(
    graph: Graph,
    fwd_outputs: Collection[int] | None = None,
    bwd_outputs: Collection[int] | None = None,
) -> Partition:
    """The values ``min_cut_rematerialization_partition`` saves (module docstring).
    ``fwd_outputs``: the forward's outputs (the loss; default: the forward values the loss
    gradient's seed reads); ``bwd_outputs``: the gradients (default: the backward values the
    optimizer reads)."""
    bwd_ops = [i for i, o in enumerate(graph.ops) if o.phase == "bwd"]
    seed = bwd_ops[0] if bwd_ops else -1
    joint = _joint_graph(graph, seed)
    backward = _tangent_closure(joint, seed)
    required = _required_forward(graph, joint, seed, fwd_outputs)
    if bwd_outputs is None:
        bwd_outputs = {v for o in graph.ops if o.phase == "opt" for v in o.operands if joint.phase.get(v) == "bwd"}
    bwd_out = {v for v in bwd_outputs if v in joint.phase}
    flow = _FlowGraph(graph, joint, required)
    flow.add_nodes(backward, bwd_out)
    flow.ban_used_far_apart()
    flow.ban_long_fusible_chains()
    return Partition(flow.saved(), flow.banned, joint.inputs, backward, joint.stats_bytes, len(graph.values))


@dataclass
class _JointGraph:
    """The partitioner's nodes, in graph order (``order``): the step's arguments, then each
    non-optimizer op's nodes (its hidden statistics, its statistics results, its other
    results), with what each is computed from (``inputs``), its users, its class and phase
    (``"arg"`` for an argument), and each op's nodes (``op_nodes``)."""

    order: list[int]
    inputs: dict[int, list[int]]
    cls: dict[int, str]
    phase: dict[int, str]
    stats_bytes: dict[int, int]
    op_nodes: dict[int, list[int]]
    users: dict[int, list[int]] = field(default_factory=dict)


def _joint_graph(graph: Graph, seed: int) -> _JointGraph:
    """The step as the partitioner's joint graph: split where Inductor's decompositions split
    an op (module docstring, **Nodes**), the seed's operands dropped (AOTAutograd's tangent is
    a graph input)."""
    nv = len(graph.values)
    ops = graph.ops
    classes = [op_class(graph, i) for i in range(len(ops))]
    order: list[int] = [v for v, val in enumerate(graph.values) if val.producer < 0]
    joint = _JointGraph(
        order=order,
        inputs={v: [] for v in order},
        cls=dict.fromkeys(order, ARG),
        phase=dict.fromkeys(order, "arg"),
        stats_bytes={},
        op_nodes={},
    )
    inputs = joint.inputs
    for i, op in enumerate(ops):
        if op.phase == "opt":
            continue
        c = classes[i]
        operands = [] if i == seed else list(op.operands)
        nodes: list[int] = []
        if c.stats_bytes:
            s = nv + i
            joint.stats_bytes[i] = c.stats_bytes
            inputs[s] = operands[:1]
            nodes.append(s)
        k = c.stats_results
        stats = op.results[len(op.results) - k :] if k else []
        for r in stats:
            inputs[r] = operands[:1]
            nodes.append(r)
        for r in op.results[: len(op.results) - k]:
            inputs[r] = operands + [*stats, *([nv + i] if c.stats_bytes else [])]
            nodes.append(r)
        for n in nodes:
            joint.cls[n] = c.cls
            joint.phase[n] = op.phase
        joint.op_nodes[i] = nodes
        order.extend(nodes)
    joint.users = {n: [] for n in order}
    for n in order:
        for v in dict.fromkeys(inputs[n]):
            if v in joint.users:
                joint.users[v].append(n)
    return joint


def _tangent_closure(joint: _JointGraph, seed: int) -> set[int]:
    """The backward nodes that depend on the seed: computed in the backward whatever the cut
    (``classify_nodes``)."""
    backward: set[int] = set()
    for n in joint.order:
        if joint.phase[n] == "bwd" and (
            n in joint.op_nodes.get(seed, ()) or any(v in backward for v in joint.inputs[n])
        ):
            backward.add(n)
    return backward


def _required_forward(graph: Graph, joint: _JointGraph, seed: int, fwd_outputs: Collection[int] | None) -> set[int]:
    """The arguments and the forward's ancestors of its outputs: what the forward computes
    whatever the cut (the rest is unclaimed, free to go either way).  Without outputs, every
    forward node."""
    phase, order = joint.phase, joint.order
    if fwd_outputs is None:
        fwd_outputs = [v for v in (graph.ops[seed].operands if seed >= 0 else []) if phase.get(v) == "fwd"]
    fwd_outputs = [v for v in fwd_outputs if v in phase]
    if not fwd_outputs:
        return {n for n in order if phase[n] in ("fwd", "arg")}
    required = {n for n in order if phase[n] == "arg"}
    stack = list(fwd_outputs)
    while stack:
        n = stack.pop()
        if n in required or phase.get(n) not in ("fwd", "arg"):
            continue
        required.add(n)
        stack.extend(joint.inputs[n])
    return required


class _FlowGraph:
    """The min-cut's flow network over the joint graph: node k of ``order`` is vertex 2k (in)
    and 2k + 1 (out).  The bans and the weights read one another's facts (distance to the
    backward, fusibility, what is banned so far), so they live together; the edges' order is
    what the max-flow reads, kept as torch adds them."""

    def __init__(self, graph: Graph, joint: _JointGraph, required: set[int]):
        self.graph, self.joint, self.required = graph, joint, required
        self.nv = len(graph.values)
        order = joint.order
        self.fw_order = {n: k for k, n in enumerate(n for n in order if n in required)}
        self.dist = self._dist_from_bw()
        self.position = {n: k for k, n in enumerate(order)}
        self.source, self.sink = 2 * len(order), 2 * len(order) + 1
        self.edges: list[tuple[int, int, float]] = []
        self.banned: set[int] = set()

    def _dist_from_bw(self) -> dict[int, int]:
        """``dist_from_bw``, in reverse graph order (users come later)."""
        dist: dict[int, int] = {}
        users = self.joint.users
        for n in reversed(self.joint.order):
            if n not in self.required:
                dist[n] = 0
            else:
                dist[n] = min((dist[u] + 1 for u in users[n]), default=int(1e9))
        return dist

    def nbytes(self, n: int) -> int:
        return self.joint.stats_bytes[n - self.nv] if n >= self.nv else self.graph.values[n].nbytes

    def fusible(self, a: int, b: int) -> bool:
        cls = self.joint.cls
        if cls[b] == CAT:  # "memory fusion" into a cat
            return True
        return cls[a] in FUSIBLE and cls[b] in FUSIBLE

    def materialized_backwards(self, n: int) -> bool:
        cls, users, required = self.joint.cls, self.joint.users, self.required
        if cls[n] == VIEW:
            return False
        todo, seen = [n], {n}
        while todo:
            cur = todo.pop()
            for u in users[cur]:
                if u not in required and not self.fusible(cur, u):
                    return True
                if cls[u] == VIEW and u not in seen:
                    seen.add(u)
                    todo.append(u)
        return False

    def ban_reason(self, n: int) -> str:
        if self.joint.cls[n] not in (RECOMPUTE, VIEW):
            return "not in recomputable allowlist"
        if self.materialized_backwards(n):
            return "materialized in backward"
        if MAX_DIST_FROM_BW < self.dist[n] < 1000:  # never, at the default 1000
            return "too far from backward"
        if self.nbytes(n) * REDUCTION_RATIO < sum(self.nbytes(v) for v in self.joint.inputs[n]):
            return "reduction op"
        return ""

    def weight(self, n: int) -> float:
        phase = self.joint.phase
        if phase[n] == "arg" and self.graph.values[n].role in ("param", "buffer"):
            return 0
        w = int(self.nbytes(n) * (1.1 ** max(min(self.dist[n], 100), 1)))
        materialized = phase[n] == "arg" or not all(self.fusible(n, u) for u in self.joint.users[n])
        return w if materialized else w * 2

    def ban(self, n: int) -> None:
        if self.joint.cls[n] == VIEW or n in self.banned:
            return
        self.banned.add(n)
        self.edges.append((self.source, 2 * self.position[n], _INF))

    def add_nodes(self, backward: set[int], bwd_out: set[int]) -> None:
        """Each node's ``in -> out`` edge and its users' edges; the tangent's closure tied to
        the sink, the gradients' outputs too, the banned nodes tied to the source."""
        position, sink, edges = self.position, self.sink, self.edges
        for n in self.joint.order:
            k = position[n]
            if n in backward:
                edges.append((2 * k, sink, _INF))
                continue
            if n in bwd_out:
                edges.append((2 * k + 1, sink, _INF))
            if self.joint.phase[n] == "arg":
                self.ban(n)
            elif n in self.required and self.ban_reason(n):
                self.ban(n)
            edges.append((2 * k, 2 * k + 1, self.weight(n)))
            for u in self.joint.users[n]:
                edges.append((2 * k + 1, 2 * position[u], _INF))

    def _required_in_order(self) -> list[int]:
        return sorted(self.required, key=self.position.__getitem__)

    def ban_used_far_apart(self) -> None:
        """``ban_recompute_used_far_apart``."""
        users, required, fw_order = self.joint.users, self.required, self.fw_order
        for used in self._required_in_order():
            fw_users = [u for u in users[used] if u in required]
            if not fw_users:
                continue
            first = _first_unfusible(
                fw_users, max(fw_order[u] for u in fw_users), users, required, fw_order, self.fusible
            )
            for u in users[used]:
                if u in required and fw_order[u] > first and self.fusible(used, u) and u not in self.banned:
                    self.ban(u)

    def ban_long_fusible_chains(self) -> None:
        """``ban_recompute_long_fusible_chains``."""
        users, required, fw_order = self.joint.users, self.required, self.fw_order
        visited: set[int] = set()
        for start in self._required_in_order():
            heap = [(fw_order[start], start)]
            start_order = fw_order[start]
            while heap:
                _, cur = heapq.heappop(heap)
                if cur in visited:
                    continue
                visited.add(cur)
                if fw_order[cur] > start_order + LONG_CHAIN and not heap:
                    self.ban(cur)
                    break
                for u in users[cur]:
                    if u in required and self.fusible(cur, u) and u not in self.banned:
                        heapq.heappush(heap, (fw_order[u], u))

    def saved(self) -> set[int]:
        """The nodes whose ``in -> out`` edge the minimum cut crosses."""
        edges, source, order = self.edges, self.source, self.joint.order
        sink_side = min_cut_sink_side(2 * len(order) + 2, edges, source, self.sink)
        cut = {u for u, v, c in edges if v == u + 1 and u % 2 == 0 and u < source and c < _INF}
        return {order[u // 2] for u in cut if not sink_side[u] and sink_side[u + 1]}


def _first_unfusible(start, max_range, users, required, fw_order, fusible) -> int:
    """``find_first_unfusible``: the forward position of the first node that cannot fuse with
    the node before it, walking users in forward order from ``start`` up to ``max_range``."""
    heap = [(fw_order[n], n, True) for n in start]
    heapq.heapify(heap)
    seen = set(heap)
    while heap:
        _, n, ok = heapq.heappop(heap)
        if not ok:
            return fw_order[n]
        for u in users[n]:
            if u in required and fw_order[u] <= max_range:
                item = (fw_order[u], u, fusible(n, u))
                if item not in seen:
                    seen.add(item)
                    heapq.heappush(heap, item)
    return max_range


def layer_saved(graph: Graph, part: Partition, layer_of: Sequence[int]) -> list[LayerSaved]:
    """Each layer's backward under ``part``: from the values its backward ops read, through the
    values recomputed for them, down to saved values (module docstring)."""
    n_layers = max(layer_of, default=-1) + 1
    out = [LayerSaved() for _ in range(n_layers)]
    for layer in range(n_layers):
        mine = out[layer]
        seen: set[int] = set()
        stack = [
            v
            for i, op in enumerate(graph.ops)
            if layer_of[i] == layer
            for r in op.results
            if r in part.backward
            for v in part.inputs[r]  # the seed's operands are not (AOTAutograd's tangent)
        ]
        while stack:
            n = stack.pop()
            if n in seen or n in part.backward:
                continue
            seen.add(n)
            if n in part.saved:
                if n >= part.n_values:
                    mine.stats[n - part.n_values] = part.stats_bytes[n - part.n_values]
                    continue
                s = graph.storage(n)
                if graph.values[s].role not in ("param", "buffer"):
                    mine.storages.add(s)
                continue
            if n < part.n_values and graph.values[n].producer < 0:
                continue  # an argument: a parameter, or an input the cut saved (above)
            if n not in part.inputs:
                continue  # the optimizer's
            op = part.op_of(graph, n)
            if graph.ops[op].phase == "fwd":
                mine.recomputed.add(op)
            stack.extend(part.inputs[n])
    return out


def min_cut_sink_side(n: int, edges: Sequence[tuple[int, int, float]], source: int, sink: int) -> bytearray:
    """The sink side of the minimum ``source``-``sink`` cut of the graph of ``n`` vertices and
    ``edges`` ``(tail, head, capacity)``: the vertices that can still reach the sink once a
    maximum flow runs, the cut nearest the sink (what ``networkx.minimum_cut`` and torch's
    ``_activation_checkpointing/min_cut.py`` return).  Dinic's algorithm on flat lists (networkx
    took 16 s of GPT-2 XL's 19 s); an infinite capacity is three times the finite ones' sum, as
    networkx's residual network makes it."""
    finite = sum(c for u, v, c in edges if u != v and 0 < c < _INF)
    big = 3 * finite if finite else 1
    head: list[int] = []
    cap: list[float] = []
    adj: list[list[int]] = [[] for _ in range(n)]
    for u, v, c in edges:
        if u == v or c <= 0:
            continue
        adj[u].append(len(head))
        head.append(v)
        cap.append(big if c == _INF else c)
        adj[v].append(len(head))
        head.append(u)
        cap.append(0)
    reach = {source}
    queue = [source]
    for u in queue:  # a path of infinite edges has no finite cut (networkx: NetworkXUnbounded)
        for e in adj[u]:
            if e % 2 == 0 and cap[e] == big and head[e] not in reach:
                reach.add(head[e])
                queue.append(head[e])
    if sink in reach:
        raise ValueError("an infinite path from the source to the sink: no finite cut")
    while True:
        level = [-1] * n
        level[source] = 0
        queue = [source]
        for u in queue:
            for e in adj[u]:
                if cap[e] > 0 and level[head[e]] < 0:
                    level[head[e]] = level[u] + 1
                    queue.append(head[e])
        if level[sink] < 0:
            break
        at = [0] * n
        path: list[int] = []  # edges from the source to u
        u = source
        while True:
            if u == sink:
                flow = min(cap[e] for e in path)
                back = len(path)
                for k, e in enumerate(path):
                    cap[e] -= flow
                    cap[e ^ 1] += flow
                    if cap[e] == 0 and k < back:
                        back = k
                del path[back:]  # resume at the first saturated edge's tail
                u = head[path[-1]] if path else source
                continue
            edges_u = adj[u]
            while at[u] < len(edges_u):
                e = edges_u[at[u]]
                if cap[e] > 0 and level[head[e]] == level[u] + 1:
                    break
                at[u] += 1
            if at[u] < len(edges_u):
                e = edges_u[at[u]]
                path.append(e)
                u = head[e]
                continue
            if u == source:
                break
            level[u] = -1  # a dead end for this phase
            e = path.pop()
            u = head[e ^ 1]
            at[u] += 1
    side = bytearray(n)
    side[sink] = 1
    queue = [sink]
    for v in queue:
        for e in adj[v]:
            u = head[e]
            if not side[u] and cap[e ^ 1] > 0:
                side[u] = 1
                queue.append(u)
    return side
