"""Probe (issue 56 item 5): can ONE symbolic trace of a cut model stand for the direct traces
at every (micro-batch b, tokens a sample s) the sweep asks for, byte for byte?  A prototype,
not wired into phaze (docs/benchmarks.md, "One symbolic trace for every micro-batch").

It traces the model once with the call's input sizes as symbols (``make_fx(tracing_mode=
"symbolic")`` over a fake mode with a ShapeEnv, every input dimension DYNAMIC and bounded to
[2, 2**40], traced at a hint past 0/1), then for each (b, s): maps the symbols to the sizes of
``get_inputs(b, s)``, checks the ShapeEnv's guards, the symbols' ranges and the decisions taken
without a guard (below) hold there, specialises the graph (every SymInt argument and every
size/stride of a node's ``meta["val"]`` evaluated at (b, s) into a meta tensor, the nodes that
only compute sizes dropped, the nodes named as make_fx names them), imports both into the phaze
dialect and compares the IR text and the FX code with the direct trace's.  It prints what
differed and the CPU seconds of one symbolic trace plus N specialisations against N direct
traces; exit status 1 when a point whose checks passed differs (0 otherwise).

    python benchmarks/symbolic_trace_probe.py examples/llama3_8b.py --blocks 3 \
        --points 2x131072,4x32768,8x4096,1x65536 --hint 3x12288

``phazec ARGS``: runs ``phazec ARGS`` with ``phaze.search.setting._prepare_points``' cut traces
at micro-batch >= 2 taken from one symbolic trace per process where the checks pass (the
end-to-end measurement; it logs each trace to $HSYM_LOG, default /tmp/hsym-traces.txt):

    python benchmarks/symbolic_trace_probe.py phazec examples/llama3_8b.py --hw h100 \
        --devices 64 --global-batch 64 --seq-len 131072 --context-parallel auto --zero auto
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import operator
import sys
import time
from typing import Any

#: The largest size a symbolic input dimension may take (far past any micro-batch or sequence).
MAX_SIZE = 2**40


def _cpu() -> float:
    return time.process_time()


@contextlib.contextmanager
def _symbolic_inputs(bounded: bool = True):
    """While active, trace_model's fake mode has a ShapeEnv and the call's tensors are fakes
    whose every dimension is a DYNAMIC symbol (the same tensor: the same symbols)."""
    import torch
    import torch._subclasses.fake_tensor as ft
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
        constrain_range,
    )

    import phaze_ir.frontend.trace as tr

    real_mode = ft.FakeTensorMode
    real_cast = tr.cast_inputs
    holder: dict[str, Any] = {}

    class mode(real_mode):  # type: ignore[misc,valid-type]
        def __init__(self, *a, **k):
            holder["env"] = ShapeEnv(should_record_events=False)
            super().__init__(*a, shape_env=holder["env"], **k)
            holder["mode"] = self

    def cast(args, kwargs, dtype):
        args, kwargs = real_cast(args, kwargs, dtype)
        memo: dict[int, Any] = {}

        def sym(v):
            if not isinstance(v, torch.Tensor):
                return v
            if id(v) not in memo:
                with ft.unset_fake_temporarily():
                    real = torch.zeros(tuple(v.shape), dtype=v.dtype)
                ctx = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * real.dim())
                memo[id(v)] = holder["mode"].from_tensor(real, symbolic_context=ctx)
                # bounded, so that a slice to the end of a dimension (stop INT64_MAX) is known
                # to cover it, as it is at any concrete size (ATen's applySlice then skips it)
                # (a size of 1 in the hint stays the int 1: ShapeEnv specialises 0 and 1)
                for d in memo[id(v)].shape if bounded else ():
                    if isinstance(d, torch.SymInt):
                        constrain_range(d, min=2, max=MAX_SIZE)
            return memo[id(v)]

        out = tuple(sym(a) for a in args), {k: sym(v) for k, v in kwargs.items()}
        holder["inputs"] = _call_tensors(*out)
        return out

    import torch.fx.experimental.proxy_tensor as pt

    real_make_fx = pt.make_fx

    def make_fx(f, **k):
        # symbolic: the proxy mode tracks the SymInts (the fake mode is the inputs')
        return real_make_fx(f, tracing_mode="symbolic", _allow_non_fake_inputs=True, **k)

    # The decisions a symbolic trace takes without a guard: ``statically_known_true`` /
    # ``statically_known_false`` of an expression neither the ranges nor the hint decide answer
    # False, where a trace at concrete sizes answers the expression's value there. Each is kept
    # as (expression, the value it must have at a point for a concrete trace to answer alike).
    import torch.fx.experimental.symbolic_shapes as ss

    real_disproves, real_static = ss._sym_node_hint_disproves, ss._static_eval_sym_bool
    holder["soft"] = soft = []
    asked: list[Any] = []

    def disproves(node, target):
        out = real_disproves(node, target)
        if out:
            soft.append((node.expr, not target))
        else:
            asked.append((node.expr, target))
        return out

    def static(x):
        out = real_static(x)
        if asked and asked[-1][0] is x.node.expr:
            expr, target = asked.pop()
            if out is None:
                soft.append((expr, not target))
        return out

    ss._sym_node_hint_disproves, ss._static_eval_sym_bool = disproves, static
    # make_fx traces symbolically under the Python dispatcher, where an op with a Python
    # CompositeImplicitAutograd/Autograd kernel (torch/_decomp/decompositions.py) decomposes as
    # that kernel does, not as ATen's C++ kernel a concrete trace runs: dropout into
    # native_dropout (C++: bernoulli_, div_, mul), a batched matmul's result through view (C++:
    # _unsafe_view).  Those kernels are hidden while it traces, but matmul's (ATen's C++ matmul
    # specialises the sizes to ints: Eq guards), which runs with Tensor.view as _unsafe_view
    # (its only view is the batched branch's result, as LinearAlgebra.cpp's _matmul_impl).
    from torch._C import DispatchKey

    hidden: list[tuple[Any, Any, Any]] = []
    for packet in list(vars(torch.ops.aten).values()):
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for o in packet.overloads():
            op = getattr(packet, o)
            for key in (DispatchKey.CompositeImplicitAutograd, DispatchKey.Autograd):
                if key in op.py_kernels:
                    kernel = op.py_kernels.pop(key)
                    hidden.append((op, key, kernel))
                    if op is torch.ops.aten.matmul.default:
                        op.py_kernels[key] = _as_aten_matmul(kernel)
                    op._dispatch_cache.clear()
    ft.FakeTensorMode = mode
    tr.cast_inputs = cast
    pt.make_fx = make_fx
    try:
        yield holder
    finally:
        ft.FakeTensorMode = real_mode
        ss._sym_node_hint_disproves, ss._static_eval_sym_bool = real_disproves, real_static
        tr.cast_inputs = real_cast
        pt.make_fx = real_make_fx
        for op, key, fn in hidden:
            op.py_kernels[key] = fn
            op._dispatch_cache.clear()


def _as_aten_matmul(kernel):
    """``kernel`` (torch._decomp's matmul) with its result's ``view`` an ``_unsafe_view``."""
    import torch

    def matmul(*args, **kwargs):
        view = torch.Tensor.view

        def unsafe_view(self, *shape):
            return torch.ops.aten._unsafe_view(self, shape[0] if len(shape) == 1 else shape)

        torch.Tensor.view = unsafe_view  # type: ignore[method-assign,assignment]
        try:
            return kernel(*args, **kwargs)
        finally:
            torch.Tensor.view = view  # type: ignore[method-assign]

    return matmul


def symbolic_trace(spec, hint_b: int, hint_s: int, blocks: int, bounded: bool = True):
    from phaze_ir.frontend.trace import trace_model

    with _symbolic_inputs(bounded) as holder:
        traced = trace_model(spec, hint_b, hint_s, training=True, dtype="float16", max_blocks=blocks)
    return traced, holder["env"], holder["soft"], holder["inputs"]


def _call_tensors(args: tuple, kwargs: dict) -> list[Any]:
    """The call's tensors, positional then keyword (as trace_model's inputs are ordered)."""
    import torch

    return [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]


def point_subs(spec, inputs: list[Any], b: int, s: int) -> dict | None:
    """Each symbol of the symbolic trace's inputs (``inputs``) as the size it has in the call
    ``get_inputs(b, s)`` makes; None where that call's tensors cannot be its inputs (another
    count or rank, a static size changed, one symbol two sizes)."""
    import sympy
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        concrete = _call_tensors(*spec.inputs(b, s))
    if len(concrete) != len(inputs):
        return None
    subs: dict[Any, int] = {}
    for sym, real in zip(inputs, concrete):
        if sym.dim() != real.dim():
            return None
        for d, n in zip(sym.shape, real.shape):
            e = d.node.expr if isinstance(d, torch.SymInt) else sympy.Integer(d)
            if isinstance(e, sympy.Symbol):
                if subs.setdefault(e, int(n)) != int(n):
                    return None
            elif int(e) != int(n):
                return None
    return subs


def failed_checks(env, soft, subs: dict) -> list[str]:
    """The ShapeEnv's guards, symbol ranges and unguarded decisions (``soft``) that fail at
    ``subs`` (empty: none)."""
    import sympy

    failed = []
    for expr, must in soft:
        if bool(expr.xreplace(subs)) is not must:
            failed.append(f"unguarded {expr} (taken as {must})")
    for g in env.guards:
        if g.expr.xreplace(subs) is not sympy.true:
            failed.append(str(g.expr))
    for sym, rng in env.var_to_range.items():
        if sym in subs and not (rng.lower <= subs[sym] <= rng.upper):
            failed.append(f"{sym} in {rng}")
    return failed


def specialise(traced, subs: dict, b: int, s: int):
    """``traced`` (a symbolic trace) at the sizes ``subs``: a TracedGraph whose graph has
    plain ints where the trace had SymInts, and meta tensors of the sizes at ``subs`` in
    ``meta["val"]``; named ``b`` x ``s``."""
    import dataclasses

    import torch
    from torch.fx import Graph, GraphModule

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
            # a meta tensor of the sizes and strides: the importer reads a value's dtype and
            # shape (and the FLOP formulas its shape), never its data or device
            return torch.empty_strided(
                [ev(d) for d in v.shape], [ev(d) for d in v.stride()], dtype=v.dtype, device="meta"
            )
        if isinstance(v, (list, tuple)):
            return type(v)(val(x) for x in v)
        if isinstance(v, torch.SymInt):
            return ev(v)
        return v

    src = traced.graph_module
    g = Graph()
    env: dict[Any, Any] = {}
    for n in src.graph.nodes:
        v = n.meta.get("val")
        if n.op == "call_function" and isinstance(v, torch.SymInt) and n.target is not operator.getitem:
            env[n] = ev(v)  # a size computed: a literal in a direct trace
            continue

        if n.op == "output":
            g.output(torch.fx.node.map_arg(n.args[0], lambda a: env[a]))
            continue
        args = torch.fx.node.map_aggregate(n.args, lambda a: env[a] if isinstance(a, torch.fx.Node) else ev(a))
        kwargs = torch.fx.node.map_aggregate(n.kwargs, lambda a: env[a] if isinstance(a, torch.fx.Node) else ev(a))
        # as make_fx names a node: its op's overload packet (view, view_1, ...)
        packet = getattr(n.target, "overloadpacket", None)
        name = n.name if n.op == "placeholder" else g._target_to_str(packet.__name__) if packet else None
        new = g.create_node(n.op, n.target, args, kwargs, name=name)
        new.meta = dict(n.meta)
        new.meta["val"] = val(v)
        new.meta.pop("tensor_meta", None)
        env[n] = new
    gm = GraphModule(src, g)
    return dataclasses.replace(traced, graph_module=gm, seq_module=_seq_modules(gm), micro_batch_size=b, seq_len=s)


def _seq_modules(gm):
    from phaze_ir.frontend.trace import _seq_modules as f

    return f(gm)


def ir_text(traced) -> str:
    from phaze.options import Options
    from phaze.pipeline import import_step

    return str(import_step(traced, Options()))


def _point(text: str) -> tuple[int, int]:
    b, s = text.split("x")
    return int(b), int(s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--points", default="1x4096,2x2048,4x1024,3x512")
    p.add_argument("--hint", default="3x1536")
    p.add_argument("--unbounded", action="store_true", help="symbols not bounded above (to see the check catch it)")
    p.add_argument("--diff", type=int, default=20, help="diff lines shown per differing point")
    a = p.parse_args(argv)

    from phaze_ir.frontend import load_model_file, trace_model

    spec = load_model_file(a.model)
    points = [_point(t) for t in a.points.split(",")]
    hb, hs = _point(a.hint)

    # warm the process once (imports, first-trace costs) so neither side pays for them
    trace_model(spec, 2, 64, training=True, dtype="float16", max_blocks=a.blocks)

    c0 = _cpu()
    sym, env, soft, inputs = symbolic_trace(spec, hb, hs, a.blocks, not a.unbounded)
    sym_s = _cpu() - c0
    print(
        f"symbolic trace at {hb}x{hs}: {sym_s:.2f} s CPU, {len(sym.graph_module.graph.nodes)} nodes, "
        f"{len(env.guards)} guards: {[str(g.expr) for g in env.guards][:8]}, "
        f"{len(soft)} unguarded decisions: {sorted({str(e) for e, _ in soft})[:8]}"
    )
    spec_s = direct_s = 0.0
    accepted = wrong = refused = caught = 0
    for b, s in points:
        c0 = _cpu()
        subs = point_subs(spec, inputs, b, s)
        failed = failed_checks(env, soft, subs) if subs is not None else ["inputs of other ranks or sizes"]
        special = specialise(sym, subs, b, s) if subs is not None else None
        spec_s += _cpu() - c0
        c0 = _cpu()
        direct = trace_model(spec, b, s, training=True, dtype="float16", max_blocks=a.blocks)
        direct_s += _cpu() - c0
        if special is None:
            print(f"{b}x{s}: refused: {failed[0]}")
            refused += 1
            continue
        code_same = special.graph_module.code == direct.graph_module.code
        t1, t2 = ir_text(special), ir_text(direct)
        same = code_same and t1 == t2
        print(
            f"{b}x{s}: checks failing {failed or 'none'}; FX code {'same' if code_same else 'DIFFERS'}; "
            f"IR {'same' if t1 == t2 else 'DIFFERS'} ({len(t2)} chars)"
        )
        accepted += not failed
        wrong += not failed and not same
        refused += bool(failed)
        caught += bool(failed) and not same
        if not same and a.diff:
            left, right = (special.graph_module.code, direct.graph_module.code) if not code_same else (t1, t2)
            d = list(
                difflib.unified_diff(right.splitlines(), left.splitlines(), "direct", "specialised", lineterm="", n=0)
            )
            print("\n".join(d[: a.diff]))
    n = len(points)
    print(
        f"{accepted} points the checks accept, {wrong} of them differing from the direct trace; {refused} refused "
        f"({caught} of them differing); CPU: 1 symbolic trace {sym_s:.2f} s + {n} specialisations {spec_s:.2f} s "
        f"= {sym_s + spec_s:.2f} s against {n} direct traces {direct_s:.2f} s"
    )
    return 1 if wrong else 0


def phazec(argv: list[str]) -> int:
    """``phazec argv`` with the 3-block cut traces of micro-batch >= 2 specialised from one
    symbolic trace per process and trace options (see the module docstring)."""
    import os

    import phaze_ir.frontend as fe
    import phaze_ir.frontend.trace as tr

    direct = tr.trace_model
    families: dict[tuple, tuple] = {}
    log = os.environ.get("HSYM_LOG", "/tmp/hsym-traces.txt")

    def trace_model(spec, micro_batch_size=1, seq_len=None, training=True, dtype="float16", max_blocks=None, **k):
        c0 = _cpu()
        how, out = "direct", None
        if max_blocks == 3 and micro_batch_size >= 2 and seq_len is not None and training:
            key = (str(spec.path), dtype, max_blocks, tuple(sorted(k.items())))
            if key not in families:
                with _symbolic_inputs() as holder:
                    sym = direct(spec, micro_batch_size, seq_len, training, dtype, max_blocks, **k)
                families[key] = (sym, holder["env"], holder["soft"], holder["inputs"])
                how = "symbolic"
            sym, env, soft, inputs = families[key]
            subs = point_subs(spec, inputs, micro_batch_size, seq_len)
            if subs is not None and not failed_checks(env, soft, subs):
                out, how = specialise(sym, subs, micro_batch_size, seq_len), how + "+specialised"
        if out is None:
            out = direct(spec, micro_batch_size, seq_len, training, dtype, max_blocks, **k)
        with open(log, "a") as f:
            f.write(f"{os.getpid()} b={micro_batch_size} s={seq_len} blocks={max_blocks} {how} cpu={_cpu() - c0:.2f}\n")
        return out

    fe.trace_model = trace_model  # what _prepare_points imports when it runs
    from phaze.tools.phazec import main as phazec_main

    sys.argv = ["phazec", *argv]
    return phazec_main()


if __name__ == "__main__":
    sys.exit(phazec(sys.argv[2:]) if sys.argv[1:2] == ["phazec"] else main())
