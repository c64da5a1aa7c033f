"""What tracing a model costs per micro-batch size, and what tracing it once symbolically would.

    python benchmarks/bench_trace.py [MODEL.py] [--micro-batches 1,2,4,8] [--seq-len N]
                                     [--symbolic [--check]] [--deepen [--check]]

Without ``--symbolic``: the time of ``trace_model`` at each micro-batch size, as ``phazec``
traces them (one concrete ``make_fx`` trace per size), and the peak RSS.

With ``--symbolic``: the experiment behind docs/design.md §2 ("One trace per size"): the same
training step traced once by ``make_fx(tracing_mode="symbolic")`` with the micro-batch and the
sequence length as symbols (every other size static), then bound to each size >= 2 (the sizes
substituted into the shapes and the size arguments, the SymInt arithmetic dropped, the nodes
renamed as a concrete trace names them).  ``--check`` also imports both and says whether the
printed IR is byte-identical to the concrete trace's.  Two settings make it so on every model
tried (the test models, small configurations of each example's class, GPT-3 175B itself), both
set here and neither make_fx's default:

- the symbols are bounded (2 <= size <= 2**31): unbounded, ``x[:, :]`` keeps an
  ``aten.slice(x, 1, 0, INT64_MAX)`` that a concrete trace drops (``size <= INT64_MAX`` is not
  provable for an unbounded symbol);
- the Python dispatcher's ``CompositeImplicitAutograd``/``Autograd`` kernels of aten ops are
  switched off during the trace: symbolic tracing turns the Python dispatcher on (without it
  fake kernels specialize the sizes, e.g. ``constant_pad_nd`` guards ``Eq(s0, 3)``), and its
  Python decompositions differ from the C++ ones a concrete trace runs (dropout becomes
  ``aten.native_dropout`` instead of ``empty_like``/``bernoulli_``/``div_``/``mul``, and
  ``matmul`` ends in ``aten.view`` instead of ``aten._unsafe_view``).

With ``--deepen``: the time of ``trace_step`` (``phaze_ir/frontend/deepen.py``: the model traced
cut to 5 and 6 blocks, the 5-block step deepened to all of them, as phazec traces a whole model)
at each size; ``--check`` says whether its IR is byte-identical to the whole trace's.

Micro-batch 1 is not bound: a transformer traced at 1 has another graph (a size-1 dim makes a
tensor contiguous, so ``reshape`` skips a ``clone``), which a trace at a size >= 2 cannot show.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import resource
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from phaze.pipeline import few_collections  # noqa: E402
from phaze_ir.frontend import import_graph, load_model_file, trace_model, trace_step  # noqa: E402
from phaze_ir.frontend import trace as tr  # noqa: E402
from phaze_ir.frontend.loader import ModelSpec  # noqa: E402
from phaze_ir.ir import print_module  # noqa: E402


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


@contextlib.contextmanager
def _no_python_decompositions() -> Iterator[None]:
    """Switch off the Python dispatcher's CompositeImplicitAutograd/Autograd kernels of aten ops
    (restored on exit): a symbolic trace then decomposes as a concrete one does, in C++."""
    import torch
    from torch._C import DispatchKey

    keys = (DispatchKey.Autograd, DispatchKey.CompositeImplicitAutograd)
    saved: list[tuple[Any, Any, Any]] = []
    for name in dir(torch.ops.aten):
        try:
            packet = getattr(torch.ops.aten, name)
        except Exception:
            continue
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():
            op = getattr(packet, overload)
            for key in keys:
                if key in op.py_kernels:
                    saved.append((op, key, op.py_kernels.pop(key)))
                    op._dispatch_cache.clear()
    try:
        yield
    finally:
        for op, key, kernel in saved:
            op.py_kernels[key] = kernel
            op._dispatch_cache.clear()


def symbolic_trace(spec: ModelSpec, micro_batch: int, seq_len: int | None, dtype: str):
    """The training step traced with the micro-batch (and sequence length) as symbols:
    ``(graph module, {name: symbol}, shape env)``.  Mirrors ``trace_model``."""
    import torch
    import torch.fx.traceback as fxt
    from torch._dynamo.source import ConstantSource
    from torch._functorch._aot_autograd.logging_utils import setup_stacktrace_preservation_hooks
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    with torch.device("meta"):
        model = spec.get_model()
    if dtype != "model":
        model = model.to(tr._torch_dtype(dtype))
    model.train()
    loss_fn = spec.loss_fn or tr._default_loss
    env = ShapeEnv(duck_shape=False)  # a micro-batch equal to the sequence length stays its own symbol
    symbols = {}

    def symint(name: str, hint: int):
        sym = env.create_symbol(hint, ConstantSource(name))
        env.constrain_symbol_range(sym, compiler_min=2, compiler_max=2**31)
        symbols[name] = sym
        return env.create_symintnode(sym, hint=hint)

    with FakeTensorMode(allow_non_fake_inputs=True, shape_env=env):
        model.to_empty(device="cpu")
        tie_weights = getattr(model, "tie_weights", None)
        if tie_weights is not None:
            tie_weights()
        params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
        b = symint("micro_batch", micro_batch)
        if spec.takes_seq_len:
            s = symint("seq_len", seq_len if seq_len is not None else spec.seq_len)
            args, kwargs = spec.inputs(b, s)
        else:
            args, kwargs = spec.inputs(b)
        args, kwargs = tr.cast_inputs(args, kwargs, dtype)
        inputs = [a for a in args if isinstance(a, torch.Tensor)] + [
            v for v in kwargs.values() if isinstance(v, torch.Tensor)
        ]
        pnames, bnames = list(params), list(buffers)
        requires_grad = [n for n in pnames if params[n].requires_grad]

        def step(*flat):
            p, bufs, call_args, call_kwargs = tr.unflatten_step_inputs(flat, pnames, bnames, args, kwargs)
            loss = loss_fn(torch.func.functional_call(model, {**p, **bufs}, call_args, call_kwargs))
            fxt.current_meta["custom"] = {"phaze_phase": "bwd"}
            setup_stacktrace_preservation_hooks([loss.grad_fn])
            grads = torch.autograd.grad(loss, [p[n] for n in requires_grad], allow_unused=True)
            return (loss, *[g for g in grads if g is not None])

        flat = [params[n] for n in pnames] + [buffers[n] for n in bnames] + inputs
        try:
            with (
                tr._transformers_meta_patches(),
                tr._module_stack_hooks(model),
                fxt.preserve_node_meta(),
                tr._quiet_fake_tensor_log(),
                _no_python_decompositions(),
            ):
                gm = make_fx(step, tracing_mode="symbolic")(*flat)
        finally:
            fxt.current_meta.pop("custom", None)
    return gm, symbols, env


def bind(gm, values: dict):
    """``gm`` with its symbols replaced by ``values`` ({symbol: int}): a graph as a concrete trace
    at those sizes writes it (SymInt nodes dropped, shapes concrete, nodes renamed in order)."""
    import torch
    import torch.fx as fx
    from torch.fx._lazy_graph_module import _LazyGraphModule

    memo: dict = {}

    def concrete(x):
        if isinstance(x, (torch.SymInt, torch.SymBool, torch.SymFloat)):
            expr = x.node.expr
            if expr not in memo:
                value = expr.xreplace(values)
                memo[expr] = (
                    int(value)
                    if isinstance(x, torch.SymInt)
                    else bool(value)
                    if isinstance(x, torch.SymBool)
                    else float(value)
                )
            return memo[expr]
        if isinstance(x, torch.Tensor):
            return torch.empty([concrete(d) for d in x.shape], dtype=x.dtype, device="meta")
        if isinstance(x, (list, tuple)):
            return type(x)(concrete(v) for v in x)
        return x

    graph = fx.Graph()
    env: dict = {}
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op == "call_function" and isinstance(val, (torch.SymInt, torch.SymBool, torch.SymFloat)):
            env[node] = concrete(val)  # size arithmetic: a constant once the sizes are known
            continue
        args = fx.node.map_aggregate(fx.node.map_arg(node.args, env.__getitem__), concrete)
        kwargs = fx.node.map_aggregate(fx.node.map_arg(node.kwargs, env.__getitem__), concrete)
        # make_fx names an aten node after its op packet; the counters then run as in a concrete
        # trace, whose graph has no SymInt nodes between them.
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            name = graph._target_to_str(node.target.overloadpacket.__name__)
        else:
            name = None if node.op == "call_function" else node.name
        new = graph.create_node(node.op, node.target, args, kwargs, name=name, type_expr=node.type)
        new.meta = dict(node.meta)
        if val is not None:
            new.meta["val"] = concrete(val)
        env[node] = new
    # Lazily compiled: the importer reads the graph, never runs it (compiling the Python code of
    # GPT-3's 17,000 nodes was half of a binding).
    return _LazyGraphModule(gm, graph)


def seq_modules(gm) -> dict[int, str]:
    """Forward module of each autograd sequence number (as ``trace_model`` records it)."""
    out: dict[int, str] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.meta.get("custom", {}).get("phaze_phase") == "bwd":
            continue
        seq, stack = node.meta.get("seq_nr"), node.meta.get("nn_module_stack")
        if seq is not None and seq not in out and stack:
            out[seq] = list(stack)[-1]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=str(ROOT / "examples" / "gpt3_175b.py"))
    ap.add_argument("--micro-batches", default="1,2,4,8")
    ap.add_argument("--seq-len", type=int, default=None)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--symbolic", action="store_true", help="also trace once symbolically and bind each size")
    ap.add_argument("--deepen", action="store_true", help="also trace each size cut to 5 blocks and deepen it")
    ap.add_argument("--check", action="store_true", help="compare the bound (deepened) IR with the concrete trace's")
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    spec = load_model_file(a.model)
    sizes = [int(b) for b in a.micro_batches.split(",")]
    seq = a.seq_len if a.seq_len is not None else spec.seq_len
    print(f"{spec.name}, seq {seq}, {a.dtype}: one concrete trace per micro-batch (as phazec traces)")
    concrete: dict[int, Any] = {}
    for b in sizes:
        start = time.perf_counter()
        traced = trace_model(spec, b, a.seq_len, training=True, dtype=a.dtype)
        print(
            f"  micro-batch {b}: {time.perf_counter() - start:6.1f} s  "
            f"({len(traced.graph_module.graph.nodes)} aten nodes), peak RSS {peak_gib():.2f} GiB"
        )
        if a.check:
            concrete[b] = traced
        del traced
    if a.deepen:
        print("trace_step: cut to 5 and 6 blocks, deepened (as phazec traces a whole model)")
        for b in sizes:
            start = time.perf_counter()
            traced = trace_step(spec, b, a.seq_len, training=True, dtype=a.dtype)
            line = f"  micro-batch {b}: {time.perf_counter() - start:6.1f} s  " + (
                f"(deepened from {traced.deepened_from} blocks)" if traced.deepened_from else "(traced whole)"
            )
            if a.check:
                same = print_module(import_graph(traced)) == print_module(import_graph(concrete[b]))
                line += ", IR " + ("byte-identical to the whole trace's" if same else "DIFFERS from the whole trace's")
            print(line + f", peak RSS {peak_gib():.2f} GiB")
            del traced
    if not a.symbolic:
        return
    bound_sizes = [b for b in sizes if b >= 2]
    if not bound_sizes:
        sys.exit("--symbolic: no micro-batch >= 2 to trace at")
    start = time.perf_counter()
    gm, symbols, env = symbolic_trace(spec, bound_sizes[0], a.seq_len, a.dtype)
    guards = [str(g.expr) for g in env.guards]
    print(
        f"symbolic trace at micro-batch {bound_sizes[0]}: {time.perf_counter() - start:6.1f} s  "
        f"({len(gm.graph.nodes)} nodes), guards {guards or 'none'}, peak RSS {peak_gib():.2f} GiB"
    )
    template = concrete.get(bound_sizes[0]) or trace_model(spec, bound_sizes[0], a.seq_len, dtype=a.dtype)
    for b in bound_sizes:
        values = {symbols["micro_batch"]: b}
        if "seq_len" in symbols:
            values[symbols["seq_len"]] = seq
        start = time.perf_counter()
        bound = copy.copy(template)
        with few_collections():  # as the pipeline imports: young-generation GC every 50,000 allocations
            bound.graph_module, bound.micro_batch_size = bind(gm, values), b
        bound.seq_module = seq_modules(gm)
        line = f"  bound to micro-batch {b}: {time.perf_counter() - start:6.2f} s"
        failed = [str(g.expr) for g in env.guards if not bool(g.expr.xreplace(values))]
        if failed:
            line += f" (a guard fails there, {failed[0]}: this size needs its own trace)"
        if a.check:
            same = print_module(import_graph(bound)) == print_module(import_graph(concrete[b]))
            line += ", IR " + (
                "byte-identical to the concrete trace's" if same else "DIFFERS from the concrete trace's"
            )
        print(line)
    print(f"peak RSS {peak_gib():.2f} GiB")


if __name__ == "__main__":
    main()
