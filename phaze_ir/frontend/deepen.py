"""A training step traced from a model cut to 5 of its repeated blocks, deepened to all of them.

Why: tracing costs time in proportion to the blocks (GPT-3 175B's 96: 15 s on the 2-core
machine, quiet), while the blocks of a model whose blocks run the same code (``uniform_blocks``)
trace to the same nodes.  So the model is traced cut to 5 blocks, ``first, 1, template,
3, last``, and the template block's nodes, forward and backward, are copied once per extra
block; the other blocks are kept and renumbered (``last`` becomes block ``N - 1``).  The
result is the graph the whole model traces to: the same nodes in the same order, the same
names (given by torch.fx's own namer, in the same order), the same module paths, parameter
names and constants; what the importer reads of it is checked against a real trace of 6
blocks before it is relied on (:func:`trace_step`), and the examples' IR bytes against
their whole traces (``tests/test_deepen.py``).

How a copy finds its operands: a node of block ``j`` that reads a node of block ``j'`` reads,
in block ``k``'s copy, the node at the same position of block ``k + j' - j``; blocks 1, 2
and 3 must look alike node by node (operation, operands relative to their block, shapes) for
that to hold, and a block read across more than one block away must be one the copy has
(else :func:`deepen` raises, and the model is traced whole).  The layout asked of the cut
step: outside nodes, then the blocks' forward in order, outside nodes (the head and loss and
their backward), the blocks' backward in reverse order, outside nodes; an unlabelled node
(autograd's gradient adds carry no module) belongs to the block around it, or, between two
blocks' backward (the residual stream's add), to the block before it.
"""

from __future__ import annotations

import copy
import operator
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from phaze_ir.frontend.trace import TracedGraph

#: Blocks of the cut trace: first, a middle block on either side of the template, last.
CUT = 5
#: The cut trace's block copied for every block added.
TEMPLATE = 2
#: Fewest blocks a model is deepened for: the cut traces (``CUT`` and ``CUT + 1`` blocks) cost
#: about what a whole trace of ``2 * CUT + 1`` does.
DEEPEN_FROM = 2 * CUT + 2
#: torch.fx's split of a node name into its base and counter (``torch.fx.graph._name_regex``).
_NAME = re.compile(r"^([a-zA-Z_][0-9a-zA-Z_]*?)(?:_(\d+))?$")
#: make_fx's names of the constants it lifts out of the step, numbered as they are met.
_CONSTANT = re.compile(r"^_tensor_constant(\d+)$")


class StepGraph:
    """A deepened step's graph and the constants its ``get_attr`` nodes name: what the importer
    reads of a ``torch.fx.GraphModule``.  (A GraphModule generates and compiles Python code
    for its whole graph, about 1 s for GPT-3 175B, and nothing runs it.)"""

    def __init__(self, graph: Any, constants: dict[str, Any]):
        self.graph = graph
        for name, value in constants.items():
            setattr(self, name, value)


class _CannotDeepen(Exception):
    """The cut step is not laid out as :func:`deepen` needs (the message says where)."""


@dataclass
class _Segment:
    """Consecutive nodes of one region: outside every block (``block`` None) or one block's."""

    kind: str  # "param", "buffer", "input", "fwd", "bwd"
    block: int | None
    nodes: list[Any]


def _shapes(v: Any) -> Any:
    """Shapes, element types and strides of a node's value (tensors, nested), else its repr."""
    import torch

    if isinstance(v, torch.Tensor):
        return (tuple(v.shape), v.dtype, tuple(v.stride()))
    if isinstance(v, (tuple, list)):
        return tuple(_shapes(x) for x in v)
    return repr(v)


def _block_of(path: str, prefix: str) -> int | None:
    if not path.startswith(prefix):
        return None
    head = path[len(prefix) :].split(".", 1)[0]
    return int(head) if head.isdigit() else None


def _renamed(path: str, prefix: str, j: int, k: int) -> str:
    """``path`` of block ``j`` as block ``k``'s (unchanged when it is not in block ``j``)."""
    old = f"{prefix}{j}"
    if j == k or not (path == old or path.startswith(old + ".")):
        return path
    return f"{prefix}{k}{path[len(old) :]}"


def _labels(cut: TracedGraph, prefix: str) -> tuple[list[_Segment], list[_Segment], Any]:
    """The cut step split into segments: its placeholders', its body's, and its output node."""
    from phaze_ir.frontend.importer import provenance

    nodes = list(cut.graph_module.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    if len(placeholders) != len(cut.placeholders):
        raise _CannotDeepen("placeholder bookkeeping out of sync with the graph")
    output = nodes[-1]
    if output.op != "output":
        raise _CannotDeepen("the graph does not end in its output")

    def runs(items: list[tuple[str, int | None, Any]]) -> list[_Segment]:
        # Unlabelled nodes between two nodes of one block are that block's.
        labels = [b for _, b, _ in items]
        known = [i for i, b in enumerate(labels) if b is not None]
        for a, b in zip(known, known[1:]):
            if labels[a] == labels[b] and items[a][0] == items[b][0]:
                for i in range(a + 1, b):
                    if items[i][0] == items[a][0]:
                        labels[i] = labels[a]
        out: list[_Segment] = []
        for (kind, _, node), label in zip(items, labels):
            if out and out[-1].kind == kind and out[-1].block == label:
                out[-1].nodes.append(node)
            else:
                out.append(_Segment(kind, label, [node]))
        # Unlabelled nodes between two neighbouring blocks (the gradient adds of the residual
        # stream between two blocks' backward) are the block's before them.
        merged: list[_Segment] = []
        for i, seg in enumerate(out):
            before, after = (out[i - 1] if i else None), (out[i + 1] if i + 1 < len(out) else None)
            if (
                seg.block is None
                and before is not None
                and after is not None
                and before.block is not None
                and after.block is not None
                and before.kind == seg.kind == after.kind
                and abs(before.block - after.block) == 1
            ):
                merged[-1].nodes.extend(seg.nodes)
            else:
                merged.append(seg)
        return merged

    heads = [(role, _block_of(name, prefix), n) for n, (role, name) in zip(placeholders, cut.placeholders)]
    body: list[tuple[str, int | None, Any]] = []
    label_of: dict[Any, int | None] = {}
    for n in nodes:
        if n.op in ("placeholder", "output"):
            continue
        module, phase = provenance(cut, n)
        if n.op == "call_function" and n.target is operator.getitem and n.args[0] in label_of:
            label = label_of[n.args[0]]  # the block of the op whose result it picks
        else:
            label = _block_of(module, prefix)
        label_of[n] = label
        body.append((phase, label, n))
    return runs(heads), runs(body), output


def _check_layout(segments: list[_Segment], where: str) -> None:
    """Blocks appear as whole runs 0..4 (or 4..0), each once per run, between outside nodes."""
    blocks = [s.block for s in segments if s.block is not None]
    ascending = list(range(CUT))
    descending = ascending[::-1]
    i = 0
    while i < len(blocks):
        if blocks[i : i + CUT] not in (ascending, descending):
            raise _CannotDeepen(f"{where}: blocks in the order {blocks}, expected runs of 0..{CUT - 1}")
        i += CUT
    for a, b in zip(segments, segments[1:]):
        if a.block is not None and b.block is not None and abs(a.block - b.block) != 1:
            raise _CannotDeepen(f"{where}: block {a.block} followed by block {b.block}")


def deepen(cut: TracedGraph, blocks: int) -> TracedGraph:
    """``cut`` (a step traced with ``max_blocks = CUT``) as the step of the model with
    ``blocks`` of its repeated blocks.  Raises :class:`ValueError` saying why when the cut
    step is not laid out as the module docstring says."""
    start = time.perf_counter()
    if cut.blocks is None or cut.blocks[0] != CUT or not cut.block_path:
        raise ValueError(f"deepen needs a step traced cut to {CUT} blocks (got blocks {cut.blocks})")
    if blocks < CUT:
        raise ValueError(f"cannot deepen {CUT} blocks to {blocks}")
    try:
        return _deepen(cut, blocks, start)
    except _CannotDeepen as e:
        raise ValueError(str(e)) from None


def _src(k: int, blocks: int) -> int:
    """The cut step's block that block ``k`` of the deepened step is a copy of."""
    if k <= 1:
        return k
    if k >= blocks - 2:
        return k - blocks + CUT
    return TEMPLATE


def _alike(j: int, k: int) -> bool:
    """Blocks ``j`` and ``k`` of the cut step are interchangeable: equal or both middle ones."""
    return j == k or (1 <= j <= CUT - 2 and 1 <= k <= CUT - 2)


def _deepen(cut: TracedGraph, blocks: int, start: float) -> TracedGraph:
    prefix = cut.block_path + "."
    heads, body, output = _labels(cut, prefix)
    _check_layout(heads, "placeholders")
    _check_layout(body, "step")
    runs, place = _block_runs(heads, body)
    _check_middle_alike(runs, place)
    copier = _Copier(cut, blocks, prefix, runs, place)
    order = _deepened_order(heads, body, runs, blocks)
    for n, k in order:
        copier.copy(n, k)
    roles, grad_names, no_grad = copier.output(output, order)
    return replace(
        cut,
        graph_module=StepGraph(copier.graph, copier.constants),
        placeholders=roles,
        grad_names=grad_names,
        no_grad_params=no_grad,
        seq_module=copier.seq_module,
        trace_seconds=cut.trace_seconds + time.perf_counter() - start,
        blocks=None,
        block_path="",
    )


#: Where a node of a block sits: (run of blocks, block, position in the block's segment).
_Place = tuple[int, int, int]


def _block_runs(heads: list[_Segment], body: list[_Segment]) -> tuple[list[dict[int, _Segment]], dict[Any, _Place]]:
    """Each run of blocks (the placeholders' parameters and buffers, the forward, the
    backward): its segments by block; and where each node of a block sits in it.  A copy reads
    its operands by these places, relative to its block, not by name."""
    runs: list[dict[int, _Segment]] = []
    for segments in (heads, body):
        blocks_of = [s for s in segments if s.block is not None]
        runs.extend({s.block: s for s in blocks_of[i : i + CUT]} for i in range(0, len(blocks_of), CUT))  # type: ignore[misc]
    place: dict[Any, _Place] = {}
    for r, run in enumerate(runs):
        for j, seg in run.items():
            for i, n in enumerate(seg.nodes):
                place[n] = (r, j, i)
    return runs, place


def _check_middle_alike(runs: list[dict[int, _Segment]], place: dict[Any, _Place]) -> None:
    """The middle blocks must look alike node by node (operation, operands relative to their
    block, shapes, phase), so that a copy of the template can stand beside any of them."""
    from torch.fx.node import map_arg

    def signature(n: Any, j: int) -> tuple:
        def arg(a: Any) -> Any:
            if a in place:
                r, jj, i = place[a]
                return ("block", r, jj - j, i)
            return ("node", a.name)

        return (
            n.op,
            n.target if n.op not in ("get_attr", "placeholder") else n.op,
            repr(map_arg((n.args, n.kwargs), arg)),
            _shapes(n.meta.get("val")),
            n.meta.get("custom", {}).get("phaze_phase"),
        )

    for run in runs:
        middle = [run[j] for j in range(1, CUT - 1)]
        if len({len(s.nodes) for s in middle}) != 1:
            raise _CannotDeepen(f"middle blocks of {len(middle[0].nodes)}, ... nodes: not alike")
        for nodes in zip(*(s.nodes for s in middle)):
            sigs = {signature(n, j) for n, j in zip(nodes, range(1, CUT - 1))}
            if len(sigs) != 1:
                raise _CannotDeepen(f"the middle blocks differ at {nodes[0].name}")


def _deepened_order(
    heads: list[_Segment], body: list[_Segment], runs: list[dict[int, _Segment]], blocks: int
) -> list[tuple[Any, int | None]]:
    """The deepened step's nodes in order: (cut node, block k or None); each run of blocks
    (``runs``, in the same order) in place of its last segment, ascending for the forward's
    runs and descending for the backward's, as the whole trace orders them."""
    order: list[tuple[Any, int | None]] = []
    met = 0  # block segments met
    for s in (*heads, *body):
        if s.block is None:
            order.extend((n, None) for n in s.nodes)
            continue
        met += 1
        if met % CUT == 0:
            run = runs[met // CUT - 1]
            ks = range(blocks) if s.block == CUT - 1 else range(blocks - 1, -1, -1)
            for b in ks:
                order.extend((n, b) for n in run[_src(b, blocks)].nodes)
    return order


class _Copier:
    """Builds the deepened graph node by node from the cut one: what it keeps across nodes (the
    copies made so far, the constants and placeholders met, the fresh autograd sequence numbers
    of the blocks added) is what later nodes' copies and names depend on."""

    def __init__(
        self, cut: TracedGraph, blocks: int, prefix: str, runs: list[dict[int, _Segment]], place: dict[Any, _Place]
    ):
        import torch

        self.cut, self.blocks, self.prefix = cut, blocks, prefix
        self.runs, self.place = runs, place
        self.graph = torch.fx.Graph()
        #: (cut node, block k or None) -> its copy
        self.new: dict[tuple[Any, int | None], Any] = {}
        self.constants: dict[str, Any] = {}
        self.placeholders: list[Any] = []
        self.seq_of: dict[tuple[int, Any], int] = {}
        self.next_seq = max([*cut.seq_module, 0]) + 1
        self.seq_module = dict(cut.seq_module)

    def fresh_seq(self, k: int, s: Any) -> Any:
        """Block ``k``'s own autograd sequence number for the copied ``s``: a backward node
        finds its forward module by it, which must be block ``k``'s, not the template's."""
        if (k, s) not in self.seq_of:
            self.seq_of[k, s] = self.next_seq
            if s in self.cut.seq_module:
                self.seq_module[self.next_seq] = _renamed(self.cut.seq_module[s], self.prefix, _src(k, self.blocks), k)
            self.next_seq += 1
        return self.seq_of[k, s]

    def resolve(self, a: Any, k: int | None) -> Any:
        """The copy of cut node ``a`` that block ``k``'s copy (None: an outside node) reads."""
        if a not in self.place:
            return self.new[a, None]
        blocks = self.blocks
        r, j_ref, i = self.place[a]
        kk: int
        if k is None:  # an outside node reading a block: the first two and last two are kept
            if j_ref <= 1:
                kk = j_ref
            elif j_ref >= CUT - 2:
                kk = blocks - CUT + j_ref
            else:
                raise _CannotDeepen(f"{a.name} of the template block is read outside the blocks")
        else:
            kk = k + j_ref - _src(k, blocks)
            if not 0 <= kk < blocks or not _alike(_src(kk, blocks), j_ref):
                raise _CannotDeepen(f"a block reads {a.name} of block {j_ref}, which a copy does not have")
        target = self.runs[r][_src(kk, blocks)].nodes[i]
        return self.new[target, kk]

    def copy(self, n: Any, k: int | None) -> None:
        """Cut node ``n`` as block ``k``'s (None: outside the blocks), named as torch.fx names a
        node of the whole trace (placeholders and constants renumbered in order, the rest by
        their base name, numbered by the graph's namer) and with block ``k``'s module paths."""
        from torch.fx.node import map_arg

        src = _src(k, self.blocks) if k is not None else None

        def operand(a: Any, k: int | None = k) -> Any:
            return self.resolve(a, k)

        args = map_arg(n.args, operand)
        kwargs = map_arg(n.kwargs, operand)
        target = n.target
        if n.op == "placeholder":  # make_fx's names: arg<position>_1
            target = name = f"arg{len(self.placeholders)}_1"
            self.placeholders.append(n)
        elif n.op == "get_attr":  # renumbered in order, named after their target
            if _CONSTANT.match(str(target)) is None:
                raise _CannotDeepen(f"constant {target}: not a constant make_fx lifted")
            target = name = f"_tensor_constant{len(self.constants)}"
            self.constants[target] = getattr(self.cut.graph_module, str(n.target))
        else:
            match = _NAME.match(n.name)
            name = match.group(1) if match else n.name
        node = self.graph.create_node(n.op, target, args, kwargs, name, n.type)
        meta = n.meta
        if k is not None and src is not None and src != k:
            meta = copy.copy(n.meta)
            stack = meta.get("nn_module_stack")
            if stack:
                meta["nn_module_stack"] = {
                    _renamed(p, self.prefix, src, k): (_renamed(v[0], self.prefix, src, k), v[1])
                    for p, v in stack.items()
                }
            if meta.get("seq_nr") is not None:
                meta["seq_nr"] = self.fresh_seq(k, meta["seq_nr"])
        node.meta = meta
        self.new[n, k] = node

    def output(
        self, output: Any, order: list[tuple[Any, int | None]]
    ) -> tuple[list[tuple[str, str]], list[str], list[str]]:
        """The deepened graph's output node (the loss, then each parameter's gradient in the
        parameters' order: the order the whole trace returns them in), and its placeholders'
        roles, gradients' names and names of parameters without a gradient, renamed by block."""
        cut, prefix, blocks = self.cut, self.prefix, self.blocks
        outs = output.args[0]
        outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
        grad_of = dict(zip(cut.grad_names, outs[1:]))
        roles: list[tuple[str, str]] = []
        grads: list[Any] = []
        grad_names: list[str] = []
        role_of = dict(zip((n for n in cut.graph_module.graph.nodes if n.op == "placeholder"), cut.placeholders))
        no_grad: list[str] = []
        for n, k in order:
            if n.op != "placeholder":
                continue
            role, name = role_of[n]
            renamed = _renamed(name, prefix, _src(k, blocks), k) if k is not None else name
            roles.append((role, renamed))
            if name in grad_of:
                grads.append(self.resolve(grad_of[name], k))
                grad_names.append(renamed)
            if name in cut.no_grad_params:
                no_grad.append(renamed)
        if cut.training:
            outputs = [self.resolve(o, None) for o in outs[:1]] + grads
        else:
            outputs = [self.resolve(o, None) for o in outs]
        self.graph.output(tuple(outputs)).meta = output.meta
        return roles, grad_names, no_grad


def importer_view(traced: TracedGraph) -> list[Any]:
    """What the importer reads of ``traced``: every node's operation, name, target, operands,
    shapes, phase and module, and the placeholders' and gradients' names.  Two steps with
    equal views import to the same IR."""
    from torch.fx.node import map_arg

    from phaze_ir.frontend.importer import provenance

    view: list[Any] = [traced.placeholders, traced.grad_names, traced.no_grad_params, traced.training]
    for n in traced.graph_module.graph.nodes:
        module, phase = provenance(traced, n)
        view.append(
            (
                n.op,
                n.name,
                str(n.target),
                repr(map_arg((n.args, n.kwargs), lambda a: a.name)),
                _shapes(n.meta.get("val")),
                phase,
                module,
            )
        )
    return view


def trace_step(
    spec: Any,
    micro_batch_size: int = 1,
    seq_len: int | None = None,
    training: bool = True,
    dtype: str = "float16",
    fp8_recipe: Any = None,
) -> TracedGraph:
    """The whole model's step, as :func:`~phaze_ir.frontend.trace.trace_model` traces it, in
    the time of a few blocks: a model with at least ``DEEPEN_FROM`` repeated blocks that run
    the same code is traced cut to ``CUT`` and to ``CUT + 1`` of them, and when the first
    :func:`deepen`\\ ed to ``CUT + 1`` blocks is what the second traced (:func:`importer_view`),
    it is deepened to all of them; otherwise the model is traced whole (its result says which:
    ``deepened_from``)."""
    step, holds = _deepened(spec, micro_batch_size, seq_len, training, (dtype, fp8_recipe), background=False)
    if holds():
        return step
    return _traced(spec, micro_batch_size, seq_len, training, (dtype, fp8_recipe), None)


def trace_step_checked_later(
    spec: Any,
    micro_batch_size: int = 1,
    seq_len: int | None = None,
    training: bool = True,
    dtype: str = "float16",
    fp8_recipe: Any = None,
) -> tuple[TracedGraph, Callable[[], bool]]:
    """:func:`trace_step` without waiting for its check: the step, deepened when the model's
    blocks allow it, and a call that says (waiting for it) whether the check trace of
    ``CUT + 1`` blocks agreed.  The check runs meanwhile in a forked child process (see
    :class:`_CheckTrace` for when it cannot; it is then traced when asked), so a compilation
    that goes on importing and compiling the step hides it: it is a third of a deepened trace's
    time.  When the call says False the step is not the whole model's, and the caller asks
    :func:`trace_step` (which will trace the model whole)."""
    return _deepened(spec, micro_batch_size, seq_len, training, (dtype, fp8_recipe), background=True)


def _traced(
    spec: Any, micro_batch_size: int, seq_len: int | None, training: bool, dtype: tuple, max_blocks: int | None
) -> TracedGraph:
    """``trace_model`` in ``dtype``: the precision and the FP8 recipe (None: the default)."""
    from phaze_ir.frontend.trace import trace_model

    precision, recipe = dtype
    extra = {} if recipe is None else {"fp8_recipe": recipe}
    return trace_model(
        spec, micro_batch_size, seq_len, training=training, dtype=precision, max_blocks=max_blocks, **extra
    )


def _holds() -> bool:
    return True


def _deepened(
    spec: Any, micro_batch_size: int, seq_len: int | None, training: bool, dtype: tuple, background: bool
) -> tuple[TracedGraph, Callable[[], bool]]:
    """The step, cut to ``CUT`` blocks and deepened when the model has enough of them (else
    traced whole), and whether it holds: False only when the check trace disagreed with the
    deepened step (see :func:`trace_step_checked_later`)."""
    start = time.perf_counter()
    check = _CheckTrace(lambda: _traced(spec, micro_batch_size, seq_len, training, dtype, CUT + 1))
    if background:
        # Before the cut trace: a child forked after its parent ran autograd cannot run it.
        check.start_beside()
    cut = _traced(spec, micro_batch_size, seq_len, training, dtype, CUT)
    if cut.blocks is None:  # nothing to cut: this is the whole model
        check.cancel()
        return cut, _holds
    if cut.blocks[1] < DEEPEN_FROM:
        check.cancel()
        return _traced(spec, micro_batch_size, seq_len, training, dtype, None), _holds
    if not background:
        check.view()  # traced before the deepening, as it always was
    try:
        expected = importer_view(deepen(cut, CUT + 1))
    except ValueError:
        check.cancel()
        return _traced(spec, micro_batch_size, seq_len, training, dtype, None), _holds
    step = replace(deepen(cut, cut.blocks[1]), trace_seconds=time.perf_counter() - start, deepened_from=CUT)
    return step, lambda: check.view() == expected


class _CheckTrace:
    """The :func:`importer_view` of the check trace (``trace``), traced when :meth:`view` is
    first asked, or traced meanwhile in a forked child process (:meth:`start_beside`) whose
    answer :meth:`view` waits for.  When none was forked (no fork on the platform, other
    threads running, or this process traced a training step before: autograd refuses to run in
    a child forked after its parent ran it) or the child could not trace, the view is traced
    here, as without a child; so an error of the check trace is
    raised here, as it always was."""

    def __init__(self, trace: Callable[[], TracedGraph]):
        self._trace = trace
        self._view: list[Any] | None = None
        self._answer: Any = None
        self._child: Any = None

    def start_beside(self) -> None:
        import multiprocessing
        import threading

        from phaze_ir.frontend.trace import autograd_ran

        # A forked child has only the forking thread: a lock another thread held (a search
        # backend's client, a test runner's channel) stays held in it; and it cannot run
        # autograd once this process has.  Then the check is traced here.
        if "fork" not in multiprocessing.get_all_start_methods() or threading.active_count() > 1 or autograd_ran():
            return
        # fork: the child has the model and torch already (a spawned one would import them
        # again, seconds), and needs nothing pickled but its answer.
        context = multiprocessing.get_context("fork")
        self._answer, sent = context.Pipe(duplex=False)
        self._child = context.Process(target=_send_view, args=(self._trace, sent), daemon=True)
        self._child.start()
        sent.close()

    def view(self) -> list[Any]:
        if self._answer is not None:
            try:
                answer = self._answer.recv()
            except (EOFError, OSError):
                answer = None
            self.cancel()
            if answer is not None:
                self._view = answer[0]
        if self._view is None:
            self._view = importer_view(self._trace())
        return self._view

    def cancel(self) -> None:
        """Stop the child, if any (its answer is no longer needed, or was received)."""
        if self._answer is not None:
            self._answer.close()
            self._answer = None
        if self._child is not None:
            self._child.terminate()
            self._child.join()
            self._child = None


def _send_view(trace: Callable[[], TracedGraph], sent: Any) -> None:
    """In the child: trace, and send ``(view,)``, or None when tracing failed (the parent then
    traces it itself).  Silent: what tracing says (a library's warnings) the parent's own trace
    says too; Ctrl-C is the parent's to handle."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    try:
        answer: tuple[list[Any]] | None = (importer_view(trace()),)
    except BaseException:  # the parent traces it again and says why
        answer = None
    sent.send(answer)
    sent.close()


def trace_cut(
    spec: Any,
    micro_batch_size: int = 1,
    seq_len: int | None = None,
    training: bool = True,
    dtype: str = "float16",
    fp8_recipe: Any = None,
) -> TracedGraph | None:
    """The step cut to ``CUT`` blocks, when :func:`trace_step` would deepen it: the model has at
    least ``DEEPEN_FROM`` blocks, the cut step deepens, and deepened to ``CUT + 1`` blocks it
    is what the model cut to ``CUT + 1`` blocks traces to (the same check, traced here).  A
    model with no more than ``CUT`` repeated blocks (or none) is not cut: its whole step, as
    :func:`trace_step` traces it (``blocks`` None), so that a small model is traced once.  None
    otherwise: then :func:`trace_step` traces the step (whole)."""
    how = (dtype, fp8_recipe)
    cut = _traced(spec, micro_batch_size, seq_len, training, how, CUT)
    if cut.blocks is None:  # nothing to cut (trace_model's _cut_blocks): the whole step
        return cut
    if cut.blocks[1] < DEEPEN_FROM:
        return None
    try:
        expected = importer_view(deepen(cut, CUT + 1))
    except ValueError:
        return None
    if importer_view(_traced(spec, micro_batch_size, seq_len, training, how, CUT + 1)) != expected:
        return None
    return cut


def trace_cut_or_whole(
    spec: Any,
    micro_batch_size: int = 1,
    seq_len: int | None = None,
    training: bool = True,
    dtype: str = "float16",
    fp8_recipe: Any = None,
) -> TracedGraph:
    """:func:`trace_cut`'s step cut to ``CUT`` blocks (``blocks`` set) when it has one, for a
    compilation from the cut (``phaze.deepen_compiled.compile_from_cut``, which deepens a
    compiled step, not a trace); else the whole step (``blocks`` None): a model with nothing to
    cut as ``trace_cut`` traced it, any other traced whole, as :func:`trace_step` then traces it
    (its own cut trace would fail as ``trace_cut``'s did)."""
    cut = trace_cut(spec, micro_batch_size, seq_len, training, dtype, fp8_recipe)
    if cut is not None:
        return cut
    return _traced(spec, micro_batch_size, seq_len, training, (dtype, fp8_recipe), None)
