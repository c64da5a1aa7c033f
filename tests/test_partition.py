"""What a compiled step saves for its backward: AOTAutograd's min-cut partitioner as
``passes/algorithms/partition.py`` models it, on hand-made graphs, against torch's own
partitioner, and through the pipeline (``phazec --kernels inductor``)."""

from __future__ import annotations

import math
import re

import pytest

from passes.algorithms.graph import Graph
from passes.algorithms.partition import (
    CAT,
    COMPUTE,
    OTHER,
    RANDOM,
    RECOMPUTE,
    VIEW,
    layer_saved,
    min_cut_partition,
    min_cut_sink_side,
    op_class,
)
from passes.algorithms.saved import saved_storages

MM = "phaze.matmul||"


def ew(kind: str, aten: str, types: str = "") -> str:
    return f'phaze.elementwise|aten="aten.{aten}",kind="{kind}"|{types}'


def lay(kind: str, aten: str) -> str:
    return f'phaze.layout|aten="aten.{aten}",kind="{kind}"|'


def red(kind: str, aten: str) -> str:
    return f'phaze.reduction|aten="aten.{aten}",dims=array<i64: -1>,kind="{kind}"|'


def op(g: Graph, phase: str, sig: str, operands: list[int], nbytes: int, view: bool = False) -> int:
    """Add one op of one result; its result's value id."""
    return g.ops[g.add_op(phase, "", operands, [nbytes], signature=sig, view=view)].results[0]


def saved_of(g: Graph) -> set[int]:
    """The storages the partitioner keeps for the (single-layer) step's backward."""
    part = min_cut_partition(g)
    return layer_saved(g, part, [0] * len(g.ops))[0].storages


def _gelu_mlp(act: str = "tanh") -> tuple[Graph, dict[str, int]]:
    """``(x @ w1) -> tanh-GELU -> @ w2 -> sum`` and its backward as eager autograd reads it
    (torch's trace of the same function keeps ``0.5 h``, ``1 + tanh``, ``tanh`` and ``h``;
    tests/test_partition.py's torch run below is its source)."""
    g = Graph()
    x = g.add_value(32 * 64 * 4, role="input")
    w1 = g.add_value(64 * 256 * 4, role="param")
    w2 = g.add_value(256 * 64 * 4, role="param")
    n = 32 * 256 * 4
    h = op(g, "fwd", MM, [x, w1], n)
    half = op(g, "fwd", ew("mul", "mul.Tensor"), [h], n)
    cube = op(g, "fwd", ew("pow", "pow.Tensor_Scalar"), [h], n)
    scaled = op(g, "fwd", ew("mul", "mul.Tensor"), [cube], n)
    inner = op(g, "fwd", ew("add", "add.Tensor"), [h, scaled], n)
    arg = op(g, "fwd", ew("mul", "mul.Tensor"), [inner], n)
    t = op(g, "fwd", ew(act, f"{act}.default"), [arg], n)
    one_t = op(g, "fwd", ew("add", "add.Tensor"), [t], n)
    y = op(g, "fwd", ew("mul", "mul.Tensor"), [half, one_t], n)
    o = op(g, "fwd", MM, [y, w2], 32 * 64 * 4)
    loss = op(g, "fwd", red("sum", "sum.default"), [o], 4)
    seed = op(g, "bwd", ew("fill", "ones_like.default"), [loss], 4)
    go = op(g, "bwd", lay("expand", "expand.default"), [seed], 32 * 64 * 4, view=True)
    yt = op(g, "bwd", lay("transpose", "t.default"), [y], n, view=True)
    dw2 = op(g, "bwd", MM, [yt, go], 256 * 64 * 4)
    w2t = op(g, "bwd", lay("transpose", "t.default"), [w2], 256 * 64 * 4, view=True)
    dy = op(g, "bwd", MM, [go, w2t], n)
    d_half = op(g, "bwd", ew("mul", "mul.Tensor"), [dy, one_t], n)
    d_one_t = op(g, "bwd", ew("mul", "mul.Tensor"), [dy, half], n)
    d_arg = op(g, "bwd", ew("tanh_grad", "tanh_backward.default"), [d_one_t, t], n)
    sq = op(g, "bwd", ew("pow", "pow.Tensor_Scalar"), [h], n)
    d_cube = op(g, "bwd", ew("mul", "mul.Tensor"), [d_arg, sq], n)
    d_h = op(g, "bwd", ew("add", "add.Tensor"), [d_half, d_cube], n)
    xt = op(g, "bwd", lay("transpose", "t.default"), [x], 32 * 64 * 4, view=True)
    dw1 = op(g, "bwd", MM, [xt, d_h], 64 * 256 * 4)
    for w, dw in ((w1, dw1), (w2, dw2)):
        g.add_op("opt", "", [w, dw], [g.values[w].nbytes], signature="phaze.optimizer_update||")
    return g, {"x": x, "h": h, "half": half, "t": t, "one_t": one_t, "y": y, "loss": loss}


def test_a_pointwise_chain_between_two_gemms_keeps_only_its_input_and_output():
    g, v = _gelu_mlp()
    # eager autograd keeps the chain's intermediates (and the loss the seed reads)
    assert saved_storages(g) == {v[k] for k in ("x", "h", "half", "t", "one_t", "y", "loss")}
    # the partitioner keeps the GEMMs' inputs and the chain's input; the chain reruns in the
    # backward (what torch's min_cut_rematerialization_partition keeps of the same function:
    # mm, permute(mul_3), permute(primals_1))
    part = min_cut_partition(g)
    (layer,) = layer_saved(g, part, [0] * len(g.ops))
    assert layer.storages == {v["x"], v["h"], v["y"]}
    rerun = {g.ops[i].results[0] for i in layer.recomputed}
    assert {v["half"], v["t"], v["one_t"]} <= rerun and v["y"] not in rerun
    assert layer.nbytes(g) == (32 * 64 + 2 * 32 * 256) * 4


def test_a_random_op_is_saved_not_recomputed():
    def step(kind: str, aten: str) -> tuple[Graph, int, int]:
        g = Graph()
        x = g.add_value(4096, role="input")
        w = g.add_value(4096, role="param")
        h = op(g, "fwd", MM, [x, w], 4096)
        like = op(g, "fwd", ew("fill", "empty_like.default"), [h], 4096)
        r = op(g, "fwd", ew(kind, aten), [like], 1024)  # a mask: one byte per element
        y = op(g, "fwd", ew("mul", "mul.Tensor"), [h, r], 4096)
        loss = op(g, "fwd", red("sum", "sum.default"), [y], 4)
        seed = op(g, "bwd", ew("fill", "ones_like.default"), [loss], 4)
        go = op(g, "bwd", lay("expand", "expand.default"), [seed], 4096, view=True)
        op(g, "bwd", ew("mul", "mul.Tensor"), [go, r], 4096)
        op(g, "bwd", ew("mul", "mul.Tensor"), [go, h], 4096)
        return g, h, r

    g, h, r = step("random", "bernoulli_.float")
    assert op_class(g, g.values[r].producer).cls == RANDOM
    part = min_cut_partition(g)
    assert r in part.banned and saved_of(g) == {h, r}
    g, h, r = step("sigmoid", "sigmoid.default")  # the same graph, an op on the allowlist
    assert saved_of(g) == {h}  # r reruns from h, which the backward keeps anyway


def test_a_reduction_keeps_its_small_output():
    def step(out_bytes: int) -> tuple[Graph, int, int]:
        g = Graph()
        x = g.add_value(32 * 64 * 4, role="input")
        w = g.add_value(64 * 256 * 4, role="param")
        h = op(g, "fwd", MM, [x, w], 32 * 256 * 4)
        s = op(g, "fwd", red("sum", "sum.dim_IntList"), [h], out_bytes)
        e = op(g, "fwd", ew("exp", "exp.default"), [s], out_bytes)
        y = op(g, "fwd", ew("mul", "mul.Tensor"), [h, e], 32 * 256 * 4)
        loss = op(g, "fwd", red("sum", "sum.default"), [y], 4)
        seed = op(g, "bwd", ew("fill", "ones_like.default"), [loss], 4)
        go = op(g, "bwd", lay("expand", "expand.default"), [seed], 32 * 256 * 4, view=True)
        op(g, "bwd", ew("mul", "mul.Tensor"), [go, e], 32 * 256 * 4)
        op(g, "bwd", ew("mul", "mul.Tensor"), [go, h], 32 * 256 * 4)
        return g, h, s

    g, h, s = step(32 * 4)  # a sum over 256: 256x smaller than its input, banned
    part = min_cut_partition(g)
    assert s in part.banned
    (layer,) = layer_saved(g, part, [0] * len(g.ops))
    assert layer.nbytes(g) == 32 * 256 * 4 + 32 * 4 and h in layer.storages
    g, h, s = step(32 * 128 * 4)  # only twice smaller: rerun from h
    part = min_cut_partition(g)
    assert s not in part.banned
    assert layer_saved(g, part, [0] * len(g.ops))[0].storages == {h}


def test_op_classes():
    g = Graph()
    x = g.add_value(4096, role="input")
    empty = g.add_value(0, role="input")
    cases = {
        MM: COMPUTE,
        ew("tanh", "tanh.default"): RECOMPUTE,
        ew("random", "bernoulli_.float"): RANDOM,
        ew("copy", "copy.default"): OTHER,
        lay("transpose", "transpose.int"): VIEW,
        lay("pad", "constant_pad_nd.default"): OTHER,
        red("sum", "sum.dim_IntList"): RECOMPUTE,
        red("sum", "cumsum.default"): OTHER,
        red("prod", "prod.dim_int"): OTHER,
        'phaze.embedding|kind="lookup"|': OTHER,
        'phaze.layout|aten="attention",kind="repeat"|': COMPUTE,
    }
    for sig, cls in cases.items():
        i = g.add_op("fwd", "", [x], [4096], signature=sig, view=cls == VIEW)
        assert op_class(g, i).cls == cls, sig
    one = g.add_op("fwd", "", [empty, x], [4096], signature=lay("cat", "cat.default"))
    two = g.add_op("fwd", "", [x, g.ops[one].results[0]], [8192], signature=lay("cat", "cat.default"))
    assert (op_class(g, one).cls, op_class(g, two).cls) == (RECOMPUTE, CAT)
    sm = g.add_op("fwd", "", [x], [4096], signature='phaze.softmax|dim=-1 : i64,kind="softmax"|tensor<2x4x16x8xf32>')
    assert op_class(g, sm).stats_bytes == 2 * 4 * (2 * 4 * 16)  # amax and sum, fp32, per row
    ln = g.add_op("fwd", "", [x], [4096, 64, 64], signature='phaze.norm|kind="layer_norm"|')
    assert op_class(g, ln).stats_results == 2


#: An op as phaze imports it, and the torch code it comes from: the partitioner's allowlist after
#: Inductor's decompositions must say what op_class says.
_TORCH_CASES = [
    (ew("tanh", "tanh.default"), lambda t, x: t.tanh(x)),
    (ew("convert", "_to_copy.default"), lambda t, x: x.to(t.bfloat16)),
    (ew("fill", "empty_like.default"), lambda t, x: t.empty_like(x)),
    (ew("copy", "copy.default"), lambda t, x: t.ops.aten.copy(x, x)),
    (ew("random", "bernoulli_.float"), lambda t, x: t.empty_like(x).bernoulli_(0.9)),
    (lay("clone", "clone.default"), lambda t, x: x.clone()),
    (lay("pad", "constant_pad_nd.default"), lambda t, x: t.nn.functional.pad(x, (1, 1))),
    (lay("repeat", "repeat.default"), lambda t, x: x.repeat(2, 1)),
    (lay("flip", "flip.default"), lambda t, x: t.flip(x, [1])),
    (lay("roll", "roll.default"), lambda t, x: t.roll(x, 1, 1)),
    (lay("tril", "tril.default"), lambda t, x: t.tril(x)),
    (lay("index", "index_select.default"), lambda t, x: t.index_select(x, 0, t.tensor([1, 2]))),
    (lay("scatter", "scatter.value"), lambda t, x: t.scatter(x, 1, t.zeros(4, 1, dtype=t.long), 1.0)),
    (lay("cat", "cat.default"), lambda t, x: t.cat([x, x + 1])),
    (red("sum", "sum.dim_IntList"), lambda t, x: x.sum(-1)),
    (red("var", "var.correction"), lambda t, x: x.var(-1)),
    (red("prod", "prod.dim_int"), lambda t, x: x.prod(-1)),
    (red("sum", "cumsum.default"), lambda t, x: x.cumsum(-1)),
    (red("topk", "topk.default"), lambda t, x: x.topk(2)),
    ('phaze.softmax|dim=-1 : i64,kind="softmax"|tensor<4x8xf32>', lambda t, x: t.softmax(x, -1)),
    ('phaze.norm|kind="layer_norm",normalized_rank=1 : i64|', lambda t, x: t.nn.functional.layer_norm(x, (8,))),
    ('phaze.embedding|kind="lookup"|', lambda t, x: t.nn.functional.embedding(t.tensor([1, 2]), x)),
    (MM, lambda t, x: x @ x.T),
]


def _bound(torch, fn):
    def call(a):
        return fn(torch, a)

    return call


def test_op_classes_follow_torchs_allowlist_after_inductors_decompositions():
    torch = pytest.importorskip("torch")
    from torch._functorch.partitioners import get_default_op_list
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    allow = get_default_op_list().recomputable_ops
    table = select_decomp_table()
    g = Graph()
    x, y = g.add_value(128, role="input"), g.add_value(128, role="input")
    for sig, fn in _TORCH_CASES:
        i = g.add_op("fwd", "", [x, y], [128], signature=sig)
        traced = make_fx(_bound(torch, fn), decomposition_table=table)(torch.randn(4, 8))
        targets = [n.target for n in traced.graph.nodes if n.op == "call_function"]
        on_list = all(getattr(t, "overloadpacket", t) in allow or t.__name__ == "getitem" for t in targets)
        assert (op_class(g, i).cls in (RECOMPUTE, VIEW)) == on_list, (sig, targets)


_MLP = """
import math
import torch
from torch import nn

SEQ_LEN = 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(64)
        self.fc1 = nn.Linear(64, 256)
        self.fc2 = nn.Linear(256, 64)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        h = self.fc1(self.ln(x))
        g = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))
        return x + self.drop(self.fc2(g))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.head = nn.Linear(64, 16)

    def forward(self, x, labels):
        for b in self.blocks:
            x = b(x)
        return nn.functional.cross_entropy(self.head(x).view(-1, 16), labels.view(-1))


def get_model():
    return Net()


def get_inputs(micro_batch_size, seq_len=SEQ_LEN):
    labels = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {"x": torch.randn(micro_batch_size, seq_len, 64), "labels": labels}
"""


def _torch_saved(path) -> list[int]:
    """Bytes of each storage torch's own min-cut partitioner saves for the model's backward
    (AOTAutograd on CPU with Inductor's decompositions; parameters and 0-d tensors left out)."""
    import importlib.util

    import torch
    from functorch.compile import aot_module, make_boxed_func, min_cut_rematerialization_partition
    from torch._functorch.partitioners import _size_of
    from torch._inductor.decomposition import select_decomp_table

    spec = importlib.util.spec_from_file_location("mlp", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    model = mod.get_model()
    graphs = []

    def keep(gm, _):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    run = aot_module(
        model, keep, keep, partition_fn=min_cut_rematerialization_partition, decompositions=select_decomp_table()
    )
    run(**mod.get_inputs(2)).backward()
    fw, bw = graphs
    (out,) = (n for n in fw.graph.nodes if n.op == "output")
    n_saved = sum(n.op == "placeholder" and not n.name.startswith("tangents") for n in bw.graph.nodes)
    n_params = len(list(model.parameters()))
    placeholders = [n for n in fw.graph.nodes if n.op == "placeholder"]
    bases = {}
    for n in out.args[0][len(out.args[0]) - n_saved :]:
        while getattr(getattr(n.target, "overloadpacket", None), "__name__", "") in ("view", "permute", "alias", "t"):
            n = n.args[0]
        if n in placeholders[:n_params] or not n.meta["val"].dim():
            continue
        bases[n] = _size_of(n)
    return sorted(bases.values())


def test_the_same_saved_bytes_as_torchs_own_partitioner(tmp_path):
    """A two-block LayerNorm/tanh-GELU/dropout MLP with a cross-entropy head: phaze's trace
    and the partition model keep what AOTAutograd's partitioner keeps of torch's trace (the
    GEMMs' outputs and inputs, norm statistics, dropout masks as bytes, the log-softmax's
    statistics), tensor for tensor in bytes."""
    from passes.graph_view import build_graph, read_layers, step_function
    from phaze.options import Options
    from phaze.pipeline import compile_module
    from phaze_ir.frontend import load_model_file, trace_model

    path = tmp_path / "mlp.py"
    path.write_text(_MLP)
    module = compile_module(
        trace_model(load_model_file(str(path)), 2, dtype="float32"), "training", 1, Options(emit="training")
    )
    graph, ops = build_graph(step_function(module))
    part = min_cut_partition(graph)
    layers = layer_saved(graph, part, read_layers(ops))
    storages = set().union(*(layer.storages for layer in layers))
    ours = [graph.values[s].nbytes for s in storages] + [b for layer in layers for b in layer.stats.values()]
    theirs = _torch_saved(path)
    # torch saves the log-softmax's two statistics (amax, log-sum) apart: phaze as one node
    assert sum(ours) == sum(theirs)
    assert sorted(b for b in ours if b >= 1024) == [b for b in theirs if b >= 1024]


def _records(text: str, key: str) -> list[dict[str, int]]:
    line = next(line for line in text.splitlines() if f"{key} = [" in line)
    body = line.split(f"{key} = [", 1)[1].split("]", 1)[0]
    return [dict((k, int(v)) for k, v in re.findall(r"(\w+) = (\d+)\b", rec)) for rec in body.split("#")[1:]]


def test_a_compiled_gpt2_step_keeps_less_than_eager_and_eager_keeps_what_autograd_saves():
    from test_kernels import _plan

    eager, eager_text = _plan("tiny_gpt2.py", "eager", "amp-bfloat16")
    compiled, compiled_text = _plan("tiny_gpt2.py", "inductor", "amp-bfloat16")
    assert compiled["max_memory_bytes"] < eager["max_memory_bytes"]
    autograd = [r["saved_bytes"] for r in _records(eager_text, "phaze.layers")]
    assert autograd == [r["saved_bytes"] for r in _records(compiled_text, "phaze.layers")]
    eager_none = [r["none_bytes"] for r in _records(eager_text, "phaze.layer_recompute")]
    compiled_none = [r["none_bytes"] for r in _records(compiled_text, "phaze.layer_recompute")]
    assert eager_none == autograd  # eager: what autograd saves, as before
    assert all(c <= e for c, e in zip(compiled_none, eager_none))
    assert compiled_none[1] < 0.7 * eager_none[1]  # a block: GELU's and softmax's intermediates rerun


def test_the_min_cut_is_networkxs():
    """Dinic's algorithm gives networkx's cut (the one nearest the sink) on random graphs."""
    import random

    nx = pytest.importorskip("networkx")
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(3, 14)
        edges = [
            (rng.randrange(n), rng.randrange(n), rng.choice([rng.randint(0, 9), rng.randint(0, 3), math.inf]))
            for _ in range(rng.randint(1, 3 * n))
        ]
        graph = nx.DiGraph()
        graph.add_nodes_from(range(n))
        for u, v, c in edges:
            if u != v:
                graph.add_edge(u, v, capacity=c)  # the last of parallel edges, as below
        last = {(u, v): c for u, v, c in edges if u != v}
        try:
            _, (_, sink_side) = nx.minimum_cut(graph, 0, n - 1)
        except nx.NetworkXUnbounded:
            with pytest.raises(ValueError):
                min_cut_sink_side(n, [(u, v, c) for (u, v), c in last.items()], 0, n - 1)
            continue
        side = min_cut_sink_side(n, [(u, v, c) for (u, v), c in last.items()], 0, n - 1)
        assert {v for v in range(n) if side[v]} == set(sink_side)
