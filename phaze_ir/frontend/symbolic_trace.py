"""One trace of a model for many (micro-batch, tokens a sample) shapes, byte for byte the
direct traces' (docs/design.md §2.1, "One trace for many shapes").

A sweep traces the same model cut to a few blocks at each micro-batch b and each context-parallel
degree's S/c tokens (``phaze/search/setting.py``): the same graph at other sizes.  Here the
model is traced once with every dimension of the call's tensors a symbol
(``make_fx(tracing_mode="symbolic")`` over a fake mode with a ``ShapeEnv``, each symbol bounded
to [2, :data:`MAX_SIZE`]), then, for each point, the graph is *specialised*: every SymInt
argument and every size and stride of a node's value evaluated there, the nodes that only
compute sizes dropped, the nodes named as make_fx names them.  A point is served only where
the checks hold there (:meth:`ShapeFamily.at`): the call's tensors have the same ranks and
static sizes, the ShapeEnv's guards and the symbols' ranges hold, and so does every decision
the symbolic trace took without a guard (``statically_known_true/false`` of an expression the
ranges did not decide, which a trace at concrete sizes decides by its value).  Anywhere else
(or when the symbolic trace itself fails) the point is traced directly: never a wrong graph.

Where a concrete trace runs ATen's C++ kernels, make_fx's symbolic trace runs under the Python
dispatcher, where an op with a Python CompositeImplicitAutograd/Autograd kernel
(``torch/_decomp/decompositions.py``) decomposes as that kernel does (dropout into
``native_dropout``, where C++ gives ``bernoulli_``/``div_``/``mul``): those kernels are hidden
while it traces, but matmul's, which runs with its result's ``view`` an ``_unsafe_view`` as
ATen's ``_matmul_impl`` (LinearAlgebra.cpp) gives it.

This leans on torch internals, pinned by constraints.txt (torch 2.15.0): ``OpOverload.py_kernels``
and ``_dispatch_cache``, ``torch.fx.experimental.symbolic_shapes._sym_node_hint_disproves`` and
``_static_eval_sym_bool`` (hooked while tracing to record the unguarded decisions), the
``ShapeEnv``'s ``guards`` and ``var_to_range``, and ``Graph._target_to_str`` (node names).  A
torch that changes them fails tests/test_symbolic_trace.py, not a plan silently.
"""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import time
import warnings
from collections.abc import Iterator
from typing import Any

from phaze_ir.errors import PhazeError
from phaze_ir.frontend.float8_linear import Fp8Recipe
from phaze_ir.frontend.loader import ModelSpec
from phaze_ir.frontend.trace import TracedGraph, cast_inputs, check_position_limit, trace_model

#: The largest size a symbolic dimension may take (far past any micro-batch or sequence).  A
#: bound above, so that a slice to the end of a dimension (stop INT64_MAX) is known to cover it,
#: as at any concrete size (ATen's ``applySlice`` then skips it).
MAX_SIZE = 2**40

#: The fewest points of one family a caller should expect before a symbolic trace pays: one
#: costs about 3 direct traces, a point then about 0.07 s of CPU against 0.9 s traced (Llama 3
#: 8B cut to 3 blocks, docs/benchmarks.md "One trace for many shapes"): 4 points cost 3.3 traces.
MIN_POINTS = 4

#: Families (:func:`family_of`) kept per process, the oldest forgotten first.
FAMILIES_KEPT = 8


class SymbolicSizes:
    """How :func:`~phaze_ir.frontend.trace.trace_model` traces the call's sizes as symbols (its
    ``shapes``), and what the trace leaves to check a point against."""

    def __init__(self) -> None:
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        self.env = ShapeEnv(should_record_events=False)
        #: the call's tensors as traced (fakes with symbolic sizes), positional then keyword
        self.inputs: list[Any] = []
        #: (expression, the value it must have at a point): decisions taken without a guard
        self.unguarded: list[tuple[Any, bool]] = []
        #: the model's position limit (``trace.position_limit``), checked at each point
        self.positions: tuple[str, int, bool] | None = None

    def fake_mode(self):
        from torch._subclasses.fake_tensor import FakeTensorMode

        return FakeTensorMode(allow_non_fake_inputs=True, shape_env=self.env)

    def symbolic(self, mode, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The call with each tensor a fake of ``mode`` whose every dimension is a symbol (the
        same tensor: the same symbols)."""
        import torch
        import torch._subclasses.fake_tensor as ft
        from torch.fx.experimental.symbolic_shapes import DimDynamic, StatelessSymbolicContext, constrain_range

        memo: dict[int, Any] = {}

        def sym(v):
            if not isinstance(v, torch.Tensor):
                return v
            if id(v) not in memo:
                with ft.unset_fake_temporarily():
                    real = torch.empty(tuple(v.shape), dtype=v.dtype)
                ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * real.dim())
                memo[id(v)] = mode.from_tensor(real, symbolic_context=ctx)
                # (a size of 1 stays the int 1: the ShapeEnv specialises 0 and 1)
                for d in memo[id(v)].shape:
                    if isinstance(d, torch.SymInt):
                        constrain_range(d, min=2, max=MAX_SIZE)
            return memo[id(v)]

        out = tuple(sym(a) for a in args), {k: sym(v) for k, v in kwargs.items()}
        self.inputs = _call_tensors(*out)
        return out

    @contextlib.contextmanager
    def tracing(self) -> Iterator[None]:
        """While make_fx traces: the unguarded decisions recorded, and the Python kernels that
        a concrete trace does not run hidden (the module docstring)."""
        import torch
        import torch.fx.experimental.symbolic_shapes as ss
        from torch._C import DispatchKey

        real_disproves, real_static = ss._sym_node_hint_disproves, ss._static_eval_sym_bool
        asked: list[tuple[Any, bool]] = []

        # ``statically_known_true/false`` of an expression neither the ranges nor the hint
        # decide answers False where a concrete trace answers its value: kept as (expression,
        # the value it must have for a concrete trace to answer alike)
        def disproves(node, target):
            out = real_disproves(node, target)
            if out:
                self.unguarded.append((node.expr, not target))
            else:
                asked.append((node.expr, target))
            return out

        def static(x):
            out = real_static(x)
            if asked and asked[-1][0] is x.node.expr:
                expr, target = asked.pop()
                if out is None:
                    self.unguarded.append((expr, not target))
            return out

        hidden: list[tuple[Any, Any, Any]] = []
        try:
            ss._sym_node_hint_disproves, ss._static_eval_sym_bool = disproves, static
            for packet in list(vars(torch.ops.aten).values()):
                if not isinstance(packet, torch._ops.OpOverloadPacket):
                    continue
                for name in packet.overloads():
                    op = getattr(packet, name)
                    for key in (DispatchKey.CompositeImplicitAutograd, DispatchKey.Autograd):
                        if key in op.py_kernels:
                            kernel = op.py_kernels.pop(key)
                            hidden.append((op, key, kernel))
                            if op is torch.ops.aten.matmul.default:
                                # without it ATen's C++ matmul turns the sizes into ints (guards)
                                op.py_kernels[key] = _as_aten_matmul(kernel)
                            op._dispatch_cache.clear()
            yield
        finally:
            ss._sym_node_hint_disproves, ss._static_eval_sym_bool = real_disproves, real_static
            for op, key, kernel in hidden:
                op.py_kernels[key] = kernel
                op._dispatch_cache.clear()


def _as_aten_matmul(kernel):
    """``kernel`` (torch._decomp's matmul) with its result's ``view`` an ``_unsafe_view``, as
    ATen's C++ matmul gives the batched branch's result (its only view)."""
    import torch

    def matmul(*args, **kwargs):
        view = torch.Tensor.view

        def unsafe_view(self, *shape):
            return torch.ops.aten._unsafe_view(self, shape[0] if len(shape) == 1 else shape)

        torch.Tensor.view = unsafe_view
        try:
            return kernel(*args, **kwargs)
        finally:
            torch.Tensor.view = view

    return matmul


def _call_tensors(args: tuple, kwargs: dict) -> list[Any]:
    """The call's tensors, positional then keyword (as ``trace_model`` orders its inputs)."""
    import torch

    return [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]


@dataclasses.dataclass
class ShapeFamily:
    """One symbolic trace and what serves a point from it (:meth:`at`)."""

    traced: TracedGraph
    sizes: SymbolicSizes
    #: what the symbolic trace warned, (message, category, file, line): each point says it again,
    #: as its own trace would
    said: list[tuple[Any, type[Warning], str, int]]
    dtype: str

    def at(self, spec: ModelSpec, micro_batch_size: int, seq_len: int | None) -> TracedGraph | None:
        """The trace at ``(micro_batch_size, seq_len)`` (None: the model's tokens) specialised
        from this one, its warnings said; None where a check fails there (:func:`failed_checks`)."""
        start = time.perf_counter()
        subs = _point_sizes(spec, self.sizes.inputs, micro_batch_size, seq_len, self.dtype)
        if subs is None or failed_checks(self.sizes, subs):
            return None
        out = specialise(self.traced, subs)
        seq_len = seq_len if seq_len is not None else spec.seq_len
        check_position_limit(self.sizes.positions, spec, seq_len)
        for message, category, filename, lineno in self.said:
            warnings.warn_explicit(message, category, filename, lineno, registry=_SAID)
        return dataclasses.replace(
            out, micro_batch_size=micro_batch_size, seq_len=seq_len, trace_seconds=time.perf_counter() - start
        )


#: The warnings registry of the warnings points say again (:attr:`ShapeFamily.said`): each once
#: per process, as a trace's own are said once from its caller's line.
_SAID: dict = {}


def trace_family(
    spec: ModelSpec,
    micro_batch_size: int,
    seq_len: int | None,
    dtype: str = "float16",
    max_blocks: int | None = None,
    fp8_recipe: Fp8Recipe = Fp8Recipe.DELAYED,
) -> ShapeFamily:
    """``trace_model``'s training step of ``spec`` traced with the call's sizes as symbols, at
    ``(micro_batch_size, seq_len)`` (the hint: a size of 1 there stays 1 in every point the
    family serves).  Raises what the trace raises."""
    sizes = SymbolicSizes()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        traced = trace_model(spec, micro_batch_size, seq_len, True, dtype, max_blocks, fp8_recipe, shapes=sizes)
    return ShapeFamily(traced, sizes, [(w.message, w.category, w.filename, w.lineno) for w in said], dtype)


def _point_sizes(
    spec: ModelSpec, inputs: list[Any], micro_batch_size: int, seq_len: int | None, dtype: str
) -> dict | None:
    """Each symbol of the symbolic trace's inputs (``inputs``) as the size it has in the call
    ``get_inputs(micro_batch_size, seq_len)`` makes (cast to ``dtype`` as traced); None where
    that call's tensors cannot be its inputs (another count or rank, a static size changed,
    one symbol two sizes) or the call fails (its direct trace then says why)."""
    import sympy
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            concrete = _call_tensors(*cast_inputs(*spec.inputs(micro_batch_size, seq_len), dtype))
    except Exception:
        return None
    if len(concrete) != len(inputs):
        return None
    subs: dict[Any, int] = {}
    for sym, real in zip(inputs, concrete):
        if sym.dim() != real.dim() or sym.dtype != real.dtype:
            return None
        for d, n in zip(sym.shape, real.shape):
            e = d.node.expr if isinstance(d, torch.SymInt) else sympy.Integer(d)
            if isinstance(e, sympy.Symbol):
                if subs.setdefault(e, int(n)) != int(n):
                    return None
            elif int(e) != int(n):
                return None
    return subs


def failed_checks(sizes: SymbolicSizes, subs: dict) -> list[str]:
    """The ShapeEnv's guards, the symbols' ranges and the unguarded decisions of the trace
    that ``sizes`` made which fail at the sizes ``subs`` (empty: none)."""
    import sympy

    failed = []
    for expr, must in sizes.unguarded:
        if bool(expr.xreplace(subs)) is not must:
            failed.append(f"unguarded {expr} (taken as {must})")
    for g in sizes.env.guards:
        if g.expr.xreplace(subs) is not sympy.true:
            failed.append(str(g.expr))
    for sym, rng in sizes.env.var_to_range.items():
        if sym in subs and not (rng.lower <= subs[sym] <= rng.upper):
            failed.append(f"{sym} in {rng}")
    return failed


def specialise(traced: TracedGraph, subs: dict) -> TracedGraph:
    """``traced`` (a symbolic trace) at the sizes ``subs``: plain ints where the trace had
    SymInts, meta tensors of the sizes at ``subs`` as the nodes' values (the importer reads a
    value's dtype and shape, the FLOP formulas its shape, never its data or device), the nodes
    that only compute a size dropped (a literal in a direct trace) and each node named as
    make_fx names it (by its op's overload packet: ``view``, ``view_1``, ...)."""
    import torch
    from torch.fx import Graph, GraphModule
    from torch.fx.node import Node, map_aggregate, map_arg

    from phaze_ir.frontend.trace import _seq_modules

    known: dict[Any, int] = {}

    def ev(x):
        if isinstance(x, torch.SymInt):
            e = x.node.expr
            if e not in known:
                known[e] = int(e.xreplace(subs))
            return known[e]
        return x

    def val(v):
        if isinstance(v, torch.Tensor):
            sizes, strides = [ev(d) for d in v.shape], [ev(d) for d in v.stride()]
            return torch.empty_strided(sizes, strides, dtype=v.dtype, device="meta")
        if isinstance(v, (list, tuple)):
            return type(v)(val(x) for x in v)
        return ev(v)

    src = traced.graph_module
    g = Graph()
    env: dict[Node, Any] = {}

    def arg(a):
        return env[a] if isinstance(a, Node) else ev(a)

    for n in src.graph.nodes:
        v = n.meta.get("val")
        if n.op == "call_function" and isinstance(v, torch.SymInt) and n.target is not operator.getitem:
            env[n] = ev(v)
            continue
        if n.op == "output":
            g.output(map_arg(n.args[0], lambda a: env[a]))
            continue
        packet = getattr(n.target, "overloadpacket", None)
        name = n.name if n.op == "placeholder" else g._target_to_str(packet.__name__) if packet else None
        new = g.create_node(n.op, n.target, map_aggregate(n.args, arg), map_aggregate(n.kwargs, arg), name=name)
        new.meta = dict(n.meta)
        new.meta["val"] = val(v)
        new.meta.pop("tensor_meta", None)
        env[n] = new
    gm = GraphModule(src, g)
    return dataclasses.replace(traced, graph_module=gm, seq_module=_seq_modules(gm))


#: This process's families (:func:`family_of`): a symbolic trace, or None where it failed.
_FAMILIES: dict[tuple, ShapeFamily | None] = {}


def family_of(key: Any, micro_batch_size: int, seq_len: int | None) -> tuple:
    """The family of a trace: ``key`` (what the caller's trace depends on besides its sizes),
    and which of its sizes are 1 (a trace at a size of 1 keeps it 1; one at 2 or more, a
    symbol: two families)."""
    return key, micro_batch_size == 1, seq_len == 1


def trace_shared(
    key: Any,
    points: int,
    spec: ModelSpec,
    micro_batch_size: int,
    seq_len: int | None,
    dtype: str = "float16",
    max_blocks: int | None = None,
    fp8_recipe: Fp8Recipe = Fp8Recipe.DELAYED,
) -> TracedGraph | None:
    """``trace_model(spec, micro_batch_size, seq_len, True, dtype, max_blocks, fp8_recipe)``,
    byte for byte, specialised from this process's symbolic trace of its family
    (:func:`family_of`; ``key``: everything but the sizes that changes the graph, as the
    caller knows it), the family traced symbolically first when the caller expects at least
    :data:`MIN_POINTS` ``points`` of it; None where the point's checks fail or the family has
    no symbolic trace: the caller then traces it directly."""
    family = family_of(key, micro_batch_size, seq_len)
    if family not in _FAMILIES and points >= MIN_POINTS:
        try:
            _FAMILIES[family] = trace_family(spec, micro_batch_size, seq_len, dtype, max_blocks, fp8_recipe)
        except Exception:  # (torch's symbolic machinery too): traced directly, which says why if it fails too
            _FAMILIES[family] = None
        while len(_FAMILIES) > FAMILIES_KEPT:
            del _FAMILIES[next(iter(_FAMILIES))]
    shared = _FAMILIES.get(family)
    if shared is None:
        return None
    try:
        return shared.at(spec, micro_batch_size, seq_len)
    except PhazeError:
        raise  # the point's own (its position check), as its direct trace would raise it
    except Exception:  # a graph this code cannot specialise: the point's direct trace
        return None
