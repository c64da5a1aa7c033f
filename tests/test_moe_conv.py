"""Expert GEMMs (``aten._grouped_mm``) and convolutions as ``phaze.matmul``: FLOPs, shapes,
tensor parallelism and a plan (docs/design.md §2, §5.3)."""

from __future__ import annotations

import functools
import importlib.util
import math
import re
import textwrap
import warnings
from pathlib import Path

import pytest
from conftest import EXAMPLES, MODELS
from xdsl.ir import Attribute

from passes.graph_view import step_function
from phaze_ir import dialect as ph
from phaze_ir.errors import PhazeError, PhazeWarning
from phaze_ir.frontend import aten_map as amap
from phaze_ir.frontend import import_graph, load_model_file, trace_model
from phaze_ir.frontend.importer import _torch_flops

MIXTRAL = """
import torch
from transformers import MixtralConfig, MixtralForCausalLM

NAME = "tiny-mixtral"
SEQ_LEN = {seq}


def get_model():
    return MixtralForCausalLM(
        MixtralConfig(
            vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
            max_position_embeddings=64, attn_implementation="eager",
        )
    )


def get_inputs(b, seq_len=SEQ_LEN):
    ids = torch.zeros(b, seq_len, dtype=torch.long)
    return {{"input_ids": ids, "labels": ids}}
"""

CONV = """
import torch
from torch import nn

NAME = "conv"


def get_model():
    return nn.Sequential({first}, nn.ReLU(), {second})


def get_inputs(b):
    return (torch.zeros(b, {shape}),)
"""


@functools.cache
def _model_file(text: str) -> Path:
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="phaze-moe-conv-"))
    p = d / "model.py"
    p.write_text(textwrap.dedent(text))
    return p


@functools.cache
def _traced(text: str, micro_batch: int = 1):
    return trace_model(load_model_file(_model_file(text)), micro_batch)


def _import(traced, capacity_factor: float | None = None):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # strict: no phaze.opaque, every op has semantics
        module = import_graph(traced, strict=True, capacity_factor=capacity_factor)
    module.verify()
    return module, [str(w.message) for w in caught if issubclass(w.category, PhazeWarning)]


def _gemm_flops(module) -> int:
    """2·M·N·K per product of every phaze.matmul (its bias add left out, as torch counts)."""
    total = 0
    for op in module.walk():
        if isinstance(op, ph.MatmulOp):
            batch, m, n, k = op.mnk()
            total += 2 * math.prod(batch) * m * n * k
    return total


def _shape(node_or_value) -> tuple[int, ...]:
    val = node_or_value.meta["val"] if hasattr(node_or_value, "meta") else node_or_value
    return tuple(val.shape)


def _grouped_mm_flops(graph) -> int:
    """2·(rows)·K·N of every _grouped_mm call, from its operand shapes alone."""
    total = 0
    for n in graph.nodes:
        if n.op == "call_function" and amap.packet_name(n.target) == "_grouped_mm":
            a, b = _shape(n.args[0]), _shape(n.args[1])
            if len(a) == 2 and len(b) == 3:  # [T, K] x [E, K, N]
                total += 2 * a[0] * a[1] * b[2]
            elif len(a) == 2 and len(b) == 2:  # [M, T] x [T, N] -> [E, M, N]
                total += 2 * a[0] * a[1] * b[1]
            else:
                raise AssertionError(f"unexpected _grouped_mm form {a} x {b}")
    return total


# -- grouped GEMMs ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seq", [32, 31])
def test_grouped_mm_is_a_matmul_over_experts_with_exact_flops(seq):
    """2·T·K·N per expert GEMM, exactly, whether the experts divide the routed rows (seq 32:
    64 rows over 4 experts) or not (seq 31: 62 rows, priced as 16+16+15+15); every other GEMM
    as torch counts it; the routing ops (topk, sort, histc, floor_divide) are not opaque."""
    traced = _traced(MIXTRAL.format(seq=seq))
    graph = traced.graph_module.graph
    module, said = _import(traced)
    grouped = _grouped_mm_flops(graph)
    others = sum(_torch_flops(n) or 0 for n in graph.nodes if n.op == "call_function")
    assert grouped > 0 and _gemm_flops(module) == others + grouped
    # Forward expert GEMMs: a batch of per-expert weights, the routed rows spread evenly.
    fn = step_function(module)
    expert = [
        o
        for o in fn.body.block.ops
        if isinstance(o, ph.MatmulOp)
        and o.attributes["phaze.phase"].data == "fwd"
        and o.attributes["phaze.module"].data == "model.layers.0.mlp.experts"
    ]
    shapes = sorted((ph.tensor_type(o.lhs).get_shape(), ph.tensor_type(o.rhs).get_shape()) for o in expert)
    rows = 2 * seq  # top-2
    if rows % 4 == 0:
        assert shapes == [((4, 16, 64), (4, 64, 192)), ((4, 16, 96), (4, 96, 64))]
        assert not said
    else:
        # 62 rows: experts 0-1 take 16, experts 2-3 take 15.
        assert shapes == [
            ((2, 15, 64), (2, 64, 192)),
            ((2, 15, 96), (2, 96, 64)),
            ((2, 16, 64), (2, 64, 192)),
            ((2, 16, 96), (2, 96, 64)),
        ]
        assert len(said) == 1 and "do not divide evenly over the 4 experts" in said[0] and "--tp > 1" in said[0]


#: One setting, the root node of each schedule: a plan in seconds.
# (with the runtime these tests were written for, the paper's: a GPU's defaults are now eager bf16 autocast)
FAST = ("--tp", "1", "--micro-batch", "2", "--solver-nodes", "1", "--kernels", "ops", "--dtype", "float16")
FAST += ("--zero", "0", "--sequence-parallel", "off", "--pipeline-schedule", "1f1b", "--no-dp-overlap")


@functools.cache
def _compile(path: Path, *flags: str) -> str:
    from phaze.tools.phazec import _parser, compile_model

    args = _parser().parse_args([str(path), *flags, "-q"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PhazeWarning)
        text, failure = compile_model(args, lambda msg: None)
    assert failure is None, failure
    return text


def _params(text: str) -> dict[str, tuple[int, ...]]:
    found = re.findall(r"tensor<([0-9x]+)x[a-z0-9]+> \{phaze\.param = \"([^\"]+)\"\}", text)
    return {name: tuple(int(d) for d in dims.split("x")) for dims, name in found}


def test_tensor_parallel_splits_experts_like_megatron():
    """At TP 2 the expert weights split as Megatron splits experts: the fused gate/up weight
    [E, 2I, H] along its output (2I: the column GEMM's N), the down weight [E, H, I] along its
    input (I: the row GEMM's K); one all-reduce of the expert output forward, one backward; the
    router stays whole. With uneven rows the experts stay replicated (and the frontend said so)."""
    from phaze_ir.ir import parse_module

    even = _model_file(MIXTRAL.format(seq=32))
    before = _params(_compile(even, "--emit", "training", "--micro-batch", "1"))
    text = _compile(even, "--emit", "sharded", "--tp", "2", "--micro-batch", "1")
    after = _params(text)
    up, down, gate = (f"model.layers.0.mlp.{w}" for w in ("experts.gate_up_proj", "experts.down_proj", "gate.weight"))
    assert before[up] == (4, 192, 64) and after[up] == (4, 96, 64)
    assert before[down] == (4, 64, 96) and after[down] == (4, 64, 48)
    assert after[gate] == before[gate]
    reduces = re.findall(r'"all_reduce" %\S+ group_size 2 \{phaze.phase = "(\w+)", phaze.module = "([^"]+)"', text)
    assert reduces.count(("fwd", "model.layers.0.mlp.experts")) == 1
    assert reduces.count(("bwd", "model.layers.0.mlp.experts")) == 1
    module = parse_module(text)
    fn = step_function(module)
    expert_flops = sum(
        o.flops()
        for o in fn.body.block.ops
        if isinstance(o, ph.MatmulOp) and o.attributes["phaze.module"].data.endswith("mlp.experts")
    )
    whole = parse_module(_compile(even, "--emit", "training", "--micro-batch", "1"))
    whole_flops = sum(
        o.flops()
        for o in step_function(whole).body.block.ops
        if isinstance(o, ph.MatmulOp) and o.attributes["phaze.module"].data.endswith("mlp.experts")
    )
    assert expert_flops * 2 == whole_flops
    uneven = _model_file(MIXTRAL.format(seq=31))
    shard = _params(_compile(uneven, "--emit", "sharded", "--tp", "2", "--micro-batch", "1"))
    assert shard[up] == (4, 192, 64) and shard[down] == (4, 64, 96)


def test_tiny_mixtral_plan():
    text = _compile(_model_file(MIXTRAL.format(seq=32)), "--hw", "a100", "--devices", "4", "--global-batch", "8", *FAST)
    assert (
        "phaze.plan" in text
        and "phaze.warnings" not in text
        and "phaze.tp_replicated" not in text
        and "feasible = yes" in text
    )


def _plan_json(tmp_path: Path, name: str, *flags: str) -> dict:
    import json

    out = tmp_path / f"{name}.json"
    _compile(_model_file(MIXTRAL.format(seq=32)), "--hw", "a100", *FAST, *flags, "--json", str(out))
    return json.loads(out.read_text())


def test_expert_parallelism_splits_the_experts_and_pays_all_to_alls(tmp_path):
    """The tiny Mixtral (2 MoE blocks, 4 experts) on 4 A100s as 4 replicas: EP 2 halves each
    block's expert weights, gradients and optimizer state (ZeRO-1 then shards the experts' half
    over the 2 replicas holding them, the rest over all 4), and its time adds the MoE blocks'
    all-to-alls (2 forward, 2 backward per micro-batch); the IR's layer records carry the
    experts and the dispatched bytes (micro-batch 2 x 32 tokens x top-2 = 128 routed rows x 64
    hidden x 2 bytes)."""
    from phaze_ir.ir import parse_module

    fixed = ("--devices", "4", "--global-batch", "8", "--placement", "expert:1,4,1", "--zero", "1")
    one = _plan_json(tmp_path, "ep1", *fixed, "--expert-parallel", "1")
    two = _plan_json(tmp_path, "ep2", *fixed, "--expert-parallel", "2")
    assert (one["expert_parallel"], two["expert_parallel"]) == (1, 2)
    text = _compile(_model_file(MIXTRAL.format(seq=32)), "--hw", "a100", *FAST, *fixed, "--expert-parallel", "2")
    module = parse_module(text)
    layers = [a.as_dict() for a in module.attributes["phaze.layers"].data]
    memory = [a.as_dict() for a in module.attributes["phaze.layer_memory"].data]
    blocks = [la for la in layers if la["kind"] == "block"]
    assert [(la["experts"], la["dispatch_bytes"]) for la in blocks] == [(4, 128 * 64 * 2)] * 2
    assert all(la["experts"] == 0 and la["dispatch_bytes"] == 0 for la in layers if la["kind"] != "block")
    expert_params = sum(m["expert_param_bytes"] for m in memory)
    expert_state = sum(m["expert_optimizer_bytes"] for m in memory)
    # gate_up [4, 192, 64] and down [4, 64, 96] per block, 2 bytes each; Adam keeps 12 per element.
    assert expert_params == 2 * (4 * 192 * 64 + 4 * 64 * 96) * 2 and expert_state == 6 * expert_params
    (s1,), (s2,) = one["stages"], two["stages"]
    total_params = s1["memory"]["params"]
    assert s2["memory"]["params"] == total_params - expert_params + expert_params // 2
    assert s2["memory"]["grads"] == s1["memory"]["grads"] - expert_params // 2
    dense_state = sum(m["optimizer_bytes"] for m in memory) - expert_state
    assert s1["memory"]["optimizer"] == -(-(dense_state + expert_state) // 4)
    assert s2["memory"]["optimizer"] == -(-dense_state // 4) + -(-(expert_state // 2) // 2)
    assert two["time_per_batch_s"] > one["time_per_batch_s"]
    # The time by part: EP 2 pays the all-to-alls, EP 1 none; under ZeRO-1 both update 1/4 of
    # the optimizer state (EP 2's experts: their half over the 2 replicas holding them).
    for plan in (one, two):
        assert sum(plan["breakdown_s"].values()) == pytest.approx(plan["time_per_batch_s"], rel=1e-9)
    assert one["breakdown_s"]["ep_comm_s"] == 0 < two["breakdown_s"]["ep_comm_s"]
    assert two["breakdown_s"]["optimizer_s"] == pytest.approx(one["breakdown_s"]["optimizer_s"], rel=1e-12)


def test_expert_parallelism_under_context_parallelism_and_sequence_parallel_all_to_alls(tmp_path):
    """The tiny Mixtral on 8 A100s as TP 2 × CP 2 × DP 2 with EP 2 (Megatron-core 0.9 allows EP
    dividing DP under CP: the EP group is the replicas at one CP rank): the plan is priced and
    pays all-to-alls. Under sequence parallelism each TP rank all-to-alls its own half of the
    routed tokens (the TP group gathers them after), so the all-to-alls take less time than
    without it, where every TP rank sends them all."""
    fixed = ("--devices", "8", "--global-batch", "4", "--placement", "expert:1,2,2", "--tp", "2")
    fixed += ("--context-parallel", "2", "--expert-parallel", "2")
    sp = _plan_json(tmp_path, "sp", *fixed, "--sequence-parallel", "on")
    whole = _plan_json(tmp_path, "whole", *fixed, "--sequence-parallel", "off")
    for plan in (sp, whole):
        assert plan["feasible"] and (plan["expert_parallel"], plan["cp"], plan["dp"]) == (2, 2, 2)
    assert 0 < sp["breakdown_s"]["ep_comm_s"] < whole["breakdown_s"]["ep_comm_s"]


def test_sequence_parallel_keeps_the_residual_split_after_an_moe_block():
    """At TP 2 with sequence parallelism the MoE block's output, replicated over the TP group
    after the experts' all-reduce, is added to the split residual by each rank's own tokens
    (Megatron-core's scatter_to_sequence_parallel_region: no collective): per block forward one
    all-gather before q/k/v, one reduce-scatter after o, one all-gather before the router and
    one all-reduce of the expert output, and the norms stay split (their backward gathers
    nothing; their weights' partial gradients are all-reduced once a step, as Megatron does)."""
    text = _compile(
        _model_file(MIXTRAL.format(seq=32)), "--emit", "sharded", "--tp", "2", "--micro-batch", "1",
        "--sequence-parallel", "on",
    )  # fmt: skip
    found = re.findall(r'"(\w+)" %\S+ group_size 2 \{phaze.phase = "(\w+)", phaze.module = "([^"]*)"', text)
    for block in (0, 1):
        p = f"model.layers.{block}."
        fwd = [(kind, module[len(p) :]) for kind, phase, module in found if phase == "fwd" and module.startswith(p)]
        assert fwd == [
            ("all_gather", "self_attn.q_proj"),
            ("reduce_scatter", "self_attn.o_proj"),
            ("all_gather", "mlp.gate"),
            ("all_reduce", "mlp.experts"),
        ]
    assert not [c for c in found if c[1] == "fwd" and c[2] in ("model.layers.0", "model.layers.1")]
    assert not [c for c in found if c[1] == "bwd" and c[2].endswith("layernorm")]
    norms = sorted(m for kind, phase, m in found if phase == "opt" and kind == "all_reduce")
    assert norms == sorted(f"model.layers.{b}.{n}_layernorm" for b in (0, 1) for n in ("input", "post_attention")) + [
        "model.norm"
    ]


def test_expert_tensor_parallelism_folds_ep_wider_than_dp(tmp_path):
    """The tiny Mixtral (4 experts) on 4 A100s as TP 2 x DP 2 with sequence parallelism: at ETP 1
    the experts get their own mesh over the 4 devices (Megatron-core's MoE parallel folding), so
    EP 4 is wider than DP 2, which ETP 2 (the TP width) refuses. A device then holds one expert
    whole: 2/4 of the experts' bytes traced at TP 2, as EP 2 at ETP 2 holds; EP 4's all-to-alls
    cross 4 devices where EP 2's cross 2. The JSON, the summary and Megatron-LM's flags say it."""
    from phaze.plan.plan_output import summary
    from phaze_ir.ir import parse_module

    fixed = ("--devices", "4", "--global-batch", "8", "--placement", "expert:1,2,2", "--tp", "2")
    fixed += ("--sequence-parallel", "on", "--zero", "1")
    one = _plan_json(tmp_path, "ep1", *fixed, "--expert-parallel", "1")
    two = _plan_json(tmp_path, "ep2", *fixed, "--expert-parallel", "2")
    megatron = tmp_path / "plan.megatron"
    flags = (*fixed, "--expert-parallel", "4", "--expert-tensor-parallel", "1")
    folded = _plan_json(tmp_path, "ep4", *flags, "--export", "megatron", str(megatron))
    assert [(p["dp"], p["tp"], p["expert_parallel"], p["expert_tensor_parallel"]) for p in (one, two, folded)] == [
        (2, 2, 1, 2),
        (2, 2, 2, 2),
        (2, 2, 4, 1),
    ]
    assert folded["feasible"]
    module = parse_module(_compile(_model_file(MIXTRAL.format(seq=32)), "--hw", "a100", *FAST, *flags))
    memory = [a.as_dict() for a in module.attributes["phaze.layer_memory"].data]
    experts = sum(m["expert_param_bytes"] for m in memory)  # a device's, at TP 2: every expert's half
    (s1,), (s2,), (s4,) = one["stages"], two["stages"], folded["stages"]
    assert s4["memory"]["params"] == s2["memory"]["params"] == s1["memory"]["params"] - experts + experts * 2 // 4
    assert s4["memory"]["grads"] == s2["memory"]["grads"]
    assert folded["breakdown_s"]["ep_comm_s"] > two["breakdown_s"]["ep_comm_s"] > 0
    assert "expert TP 1 (experts folded over TP x CP x DP)" in summary(module)
    lines = megatron.read_text().splitlines()
    assert "--expert-model-parallel-size=4" in lines and "--expert-tensor-parallel-size=1" in lines
    # ETP 2 (the TP width, the default): EP 4 must divide DP 2.
    with pytest.raises(AssertionError, match="does not divide d = 2"):
        _plan_json(tmp_path, "unfolded", *fixed, "--expert-parallel", "4", "--expert-tensor-parallel", "2")


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--expert-tensor-parallel", "3"), "--expert-tensor-parallel 3: expected a width that divides the TP width 2"),
        (("--expert-tensor-parallel", "-1"), "--expert-tensor-parallel"),
        (
            ("--expert-tensor-parallel", "1", "--rank-order", "tp-pp-dp"),
            "expert tensor parallel 1 with rank order tp-pp-dp: the expert mesh is numbered tp-ep-dp-pp",
        ),
        (
            ("--expert-tensor-parallel", "1", "--zero", "3", "--export", "torchtitan", "{tmp}/t"),
            "--export torchtitan: the plan splits each expert over 1 devices (expert tensor parallel) at TP 2",
        ),
    ],
)
def test_expert_tensor_parallelism_is_refused_where_it_cannot_be(tmp_path, flags, said):
    from phaze.tools.phazec import _parser, compile_model

    model = str(_model_file(MIXTRAL.format(seq=32)))
    fixed = ("--hw", "a100", "--devices", "4", "--global-batch", "8", *FAST, "--tp", "2", "--sequence-parallel", "on")
    args = _parser().parse_args([model, *fixed, *(f.format(tmp=tmp_path) for f in flags), "-q"])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PhazeWarning)
            _, failure = compile_model(args, lambda msg: None)
    except (PhazeError, SystemExit) as e:  # before any work
        failure = str(e)
    assert failure is not None and said in str(failure) and "\n" not in str(failure), (flags, failure)


def test_a_swept_tp_width_is_one_the_experts_width_divides():
    """Without --tp the plan stage tries the widths the devices hold that --expert-tensor-parallel
    divides (each expert split over K devices of a TP group of t: K divides t)."""
    from phaze.options import Options
    from phaze.points import tp_widths_of

    assert tp_widths_of(Options(devices=8), None) == (1, 2, 4, 8)
    assert tp_widths_of(Options(devices=8, expert_tensor_parallel=2), None) == (2, 4, 8)
    assert tp_widths_of(Options(devices=4, expert_tensor_parallel=8), None) == (1,)  # none: refused by the driver


def test_sequence_parallel_dispatches_one_tp_share_a_device():
    """The DP's problem: under sequence parallelism at TP t an MoE layer's dispatch_bytes (the
    gathered operand of its first expert GEMM) become 1/t a device, what each TP rank's
    all-to-all moves; without sequence parallelism, or at t = 1, the bytes as recorded."""
    from passes.algorithms.placement import LayerNumbers, problem
    from passes.algorithms.placement_options import PlacementOptions
    from passes.algorithms.priced_step import PricedStep
    from phaze_ir.hardware import load_hardware

    a100 = load_hardware("a100")
    moe = LayerNumbers(1e-3, 2e-3, (0.0, 0.0, 0.0), (8, 8, 8), 64, 64, 128, 0, 16, 4, 32, 32, 64, 1001)
    options = PlacementOptions(devices=8, global_batch=8)

    def dispatched(tp: int, sequence_parallel: bool) -> int:
        step = PricedStep(layers=[moe], micro_batch=1, tp=tp, sequence_parallel=sequence_parallel)
        (layer,) = problem(step, options, hbm_bytes=a100.hbm.bytes, levels=a100.network, memory_bound_Bps=1e12)[
            "layers"
        ]
        return int(layer["dispatch_bytes"])

    assert dispatched(4, True) == 251  # ⌈1001 / 4⌉
    assert dispatched(4, False) == dispatched(1, True) == 1001


def test_expert_parallelism_is_refused_where_it_cannot_be(tmp_path):
    from phaze.tools.phazec import _parser, compile_model

    cases = [
        (
            MIXTRAL.format(seq=32),
            ("--expert-parallel", "3"),
            "expert parallel 3: expected a degree that divides the model's 4 experts",
        ),
        (MIXTRAL.format(seq=32), ("--expert-parallel", "many"), "--expert-parallel: expert parallel 'many'"),
        (MIXTRAL.format(seq=32), ("--expert-parallel", "4", "--placement", "expert:1,2,1"), "does not divide d = 2"),
    ]
    for model, flags, said in cases:
        args = _parser().parse_args(
            [str(_model_file(model)), "--hw", "a100", "--devices", "4", "--global-batch", "8", *FAST, *flags, "-q"]
        )
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PhazeWarning)
                _, failure = compile_model(args, lambda msg: None)
        except Exception as e:  # a PhazeError before any work
            failure = str(e)
        assert failure is not None and said in str(failure), (flags, failure)


# -- capacity factor -------------------------------------------------------------------------------


def _expert_gemms(module) -> list[ph.MatmulOp]:
    return [
        o
        for o in step_function(module).body.block.ops
        if isinstance(o, ph.MatmulOp) and o.attributes["phaze.module"].data.endswith("mlp.experts")
    ]


def _grouped_results(module) -> dict[str, Attribute]:
    """The type of every value an aten._grouped_mm node stands for, by its fx name."""
    return {
        r.name_hint: r.type
        for o in step_function(module).body.block.ops
        for r in o.results
        if r.name_hint and r.name_hint.startswith("_grouped_mm")
    }


def test_capacity_factor_pads_every_expert_gemm_to_capacity():
    """F = 1.25, 64 routed rows (32 tokens x top-2) over 4 experts: every expert processes
    C = ceil(1.25 x 64 / 4) = 20 rows. Each expert GEMM, forward, input gradient and weight
    gradient, is one batched GEMM over the 4 experts with 20 rows (M, or K for the weight
    gradient): 2·E·C·K·N FLOPs, 80/64 of the dropless ones; the grouped results keep their
    shapes; the weight gradients read the forward's padded input; the module records F."""
    traced = _traced(MIXTRAL.format(seq=32))
    dropless, _ = _import(traced)
    padded, said = _import(traced, capacity_factor=1.25)
    assert not said
    experts, rows = 4, 64
    cap = math.ceil(1.25 * rows / experts)
    assert cap == 20
    gemms = _expert_gemms(padded)
    assert len(gemms) == len(_expert_gemms(dropless)) == 2 * 2 * 3  # 2 blocks x 2 GEMMs x fwd/dgrad/wgrad
    for o in gemms:
        batch, m, n, k = o.mnk()
        assert tuple(batch) == (experts,) and cap in (m, k), (batch, m, n, k)
        assert o.flops() == 2 * experts * cap * k * n if m == cap else 2 * experts * m * cap * n
    grouped = sum(o.flops() for o in _expert_gemms(dropless))
    assert sum(o.flops() for o in gemms) * rows == grouped * experts * cap
    assert _gemm_flops(padded) - _gemm_flops(dropless) == grouped * (experts * cap - rows) // rows
    assert _grouped_results(padded) == _grouped_results(dropless) and _grouped_results(padded)
    # The weight gradients' right operand is the forward's padded input (a 'pad' op in forward).
    for o in gemms:
        if o.attributes["phaze.phase"].data == "bwd" and ph.tensor_type(o.rhs).get_shape()[1] == cap:
            src = o.rhs.owner
            assert isinstance(src, ph.LayoutOp) and src.kind.data == "pad"
            assert src.attributes["phaze.phase"].data == "fwd"
    assert padded.attributes["phaze.capacity_factor"].value.data == 1.25
    assert "phaze.capacity_factor" not in dropless.attributes


@pytest.mark.parametrize("seq", [32, 31])
def test_capacity_factor_1_is_dropless_where_the_experts_divide_the_rows(seq):
    """F = 1 at 64 rows over 4 experts is the dropless IR, op for op; at 62 rows it pads the two
    15-row experts to 16: one batched GEMM over all 4 experts (whose whole weights tensor
    parallelism can split), no warning about uneven rows."""
    from phaze_ir.ir import print_module

    traced = _traced(MIXTRAL.format(seq=seq))
    dropless, _ = _import(traced)
    one, said = _import(traced, capacity_factor=1.0)
    assert not said and one.attributes["phaze.capacity_factor"].value.data == 1.0
    if seq == 32:
        assert print_module(step_function(one)) == print_module(step_function(dropless))
        return
    fwd = sorted(
        (ph.tensor_type(o.lhs).get_shape(), ph.tensor_type(o.rhs).get_shape())
        for o in _expert_gemms(one)
        if o.attributes["phaze.phase"].data == "fwd" and o.attributes["phaze.module"].data.startswith("model.layers.0")
    )
    assert fwd == [((4, 16, 64), (4, 64, 192)), ((4, 16, 96), (4, 96, 64))]
    assert _grouped_results(one) == _grouped_results(dropless)


def test_capacity_factor_dispatches_and_saves_the_padded_rows():
    """The all-to-alls of expert parallelism carry the padded rows: each MoE block's
    dispatch_bytes is E·C rows x hidden (4 x 20 x 64 x 2 bytes), E·C/T of the dropless; the
    padded forward inputs are what backward saves."""
    from phaze_ir.ir import parse_module

    even = _model_file(MIXTRAL.format(seq=32))
    flags = ("--emit", "training", "--micro-batch", "1")
    layers = {}
    for name, extra in (("dropless", ()), ("padded", ("--capacity-factor", "1.25"))):
        module = parse_module(_compile(even, *flags, *extra))
        layers[name] = [a.as_dict() for a in module.attributes["phaze.layers"].data if a.as_dict()["kind"] == "block"]
    assert [la["dispatch_bytes"] for la in layers["dropless"]] == [64 * 64 * 2] * 2
    assert [la["dispatch_bytes"] for la in layers["padded"]] == [4 * 20 * 64 * 2] * 2
    text = _compile(even, *flags, "--capacity-factor", "1.25")
    pads = [
        line
        for line in text.splitlines()
        if '"pad"' in line and "aten._grouped_mm" in line and 'phaze.phase = "fwd"' in line
    ]
    saved_pads = [m.group(1) for m in (re.search(r"phaze\.saved_bytes = (\d+)", line) for line in pads) if m]
    # the two GEMMs' padded inputs of each block: [4, 20, 64] and [4, 20, 96], 2 bytes each
    assert sorted(int(b) for b in saved_pads) == sorted([4 * 20 * 64 * 2, 4 * 20 * 96 * 2] * 2)


def test_capacity_factor_plan_json_and_megatron_export(tmp_path):
    """At micro-batch 2 (128 routed rows, C = 40) with EP 2: the padded plan is slower (more
    GEMM work, larger all-to-alls), says its factor in the JSON, and exports Megatron-LM's
    capacity factor with the experts' input padded to capacity."""
    fixed = ("--devices", "4", "--global-batch", "8", "--placement", "expert:1,4,1", "--expert-parallel", "2")
    dropless = _plan_json(tmp_path, "dropless", *fixed)
    megatron = tmp_path / "plan.megatron"
    padded = _plan_json(tmp_path, "padded", *fixed, "--capacity-factor", "1.25", "--export", "megatron", str(megatron))
    assert dropless["capacity_factor"] is None and padded["capacity_factor"] == 1.25
    assert padded["time_per_batch_s"] > dropless["time_per_batch_s"]
    lines = megatron.read_text().splitlines()
    assert "--moe-expert-capacity-factor=1.25" in lines and "--moe-pad-expert-input-to-capacity" in lines


def test_capacity_factor_is_said_in_the_summary_and_the_report_header():
    from phaze.plan.plan_output import summary
    from phaze.search.report import _header
    from phaze_ir.ir import parse_module

    flags = ("--hw", "a100", *FAST, "--devices", "4", "--global-batch", "8", "--placement", "expert:1,4,1")
    model = _model_file(MIXTRAL.format(seq=32))
    padded = summary(parse_module(_compile(model, *flags, "--capacity-factor", "1.25")))
    assert "expert GEMMs padded to capacity factor 1.25" in padded.splitlines()
    assert "capacity factor" not in summary(parse_module(_compile(model, *flags)))
    assert "capacity factor 1.25" in _header({"dp": 4, "capacity_factor": 1.25}, "plan")
    assert "capacity factor" not in _header({"dp": 4, "capacity_factor": None}, "plan")


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (("--hw", "a100", "--capacity-factor", "0.5"), "--capacity-factor 0.5: expected a finite number >= 1"),
        (("--hw", "a100", "--capacity-factor", "nan"), "--capacity-factor nan: expected a finite number >= 1"),
        (("--hw", "a100", "--capacity-factor", "inf"), "--capacity-factor inf: expected a finite number >= 1"),
        (
            ("--hw", "a100", "--zero", "0", "--capacity-factor", "1.5", "--export", "torchtitan", "{tmp}/t"),
            "--export torchtitan: the plan pads the experts to capacity factor 1.5",
        ),
    ],
)
def test_capacity_factor_is_refused_where_it_cannot_be(tmp_path, flags, said):
    from phaze.tools.phazec import _parser, compile_model

    model = str(_model_file(MIXTRAL.format(seq=32)))
    args = _parser().parse_args(
        [model, "--devices", "4", "--global-batch", "8", *FAST, *(f.format(tmp=tmp_path) for f in flags), "-q"]
    )
    with pytest.raises(PhazeError) as e, warnings.catch_warnings():
        warnings.simplefilter("ignore", PhazeWarning)
        compile_model(args, lambda msg: None)
    assert said in str(e.value) and "\n" not in str(e.value), str(e.value)
    if "torchtitan" in said:
        assert not (tmp_path / "t").exists()


def test_capacity_factor_on_a_dense_model_warns_and_records_nothing():
    first, second, shape, _ = CONVS["conv2d"]
    module, said = _import(_traced(CONV.format(first=first, second=second, shape=shape), 2), capacity_factor=2.0)
    assert "phaze.capacity_factor" not in module.attributes
    assert len(said) == 1 and "has no expert GEMMs" in said[0] and "not recorded" in said[0]


def test_mixtral_8x7b_example_flops_at_reduced_depth():
    """examples/mixtral_8x7b.py at 2 layers and sequence 256: every GEMM FLOP of the step equals
    the closed form (3x the forward: q/k/v/o, router, top-2 of the 3 expert matrices, attention
    scores and values, LM head)."""
    spec = importlib.util.spec_from_file_location("mixtral_8x7b", EXAMPLES / "mixtral_8x7b.py")
    assert spec and spec.loader
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    cfg = example.config()
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (4096, 14336, 32)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_local_experts) == (32, 8, 8)
    assert (cfg.num_experts_per_tok, cfg.vocab_size, example.SEQ_LEN) == (2, 32000, 4096)
    p = _model_file(
        f"""
        import importlib.util
        import torch
        from transformers import MixtralForCausalLM

        spec = importlib.util.spec_from_file_location("mixtral_8x7b", {str(EXAMPLES / "mixtral_8x7b.py")!r})
        example = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(example)
        NAME = "mixtral-2-layers"
        SEQ_LEN = 256
        get_inputs = example.get_inputs


        def get_model():  # eager attention: its matmuls, as the closed form counts them
            model = MixtralForCausalLM(example.config(num_hidden_layers=2))
            model.set_attn_implementation("eager")
            return model
        """
    )
    module, said = _import(trace_model(load_model_file(p), 1, seq_len=256))
    assert not said
    s, h, kv, f, e, k, v, layers = 256, 4096, 1024, 14336, 8, 2, 32000, 2
    fwd = layers * (2 * s * (2 * h * h + 2 * h * kv) + 2 * s * h * e + 2 * s * k * 3 * h * f + 4 * s * s * h)
    fwd += 2 * s * h * v
    assert _gemm_flops(module) == 3 * fwd


# -- convolutions ----------------------------------------------------------------------------------

CONVS = {
    # (first, second, input shape, groups of each): stride, padding, dilation, bias, groups, transposed
    "conv2d": ("nn.Conv2d(3, 16, 3, stride=2, padding=1)", "nn.Conv2d(16, 8, 3, padding=1)", "3, 16, 16", (1, 1)),
    "grouped": (
        "nn.Conv2d(4, 16, 3, padding=1, groups=2)",
        "nn.Conv2d(16, 8, 1, groups=4, bias=False)",
        "4, 8, 8",
        (2, 4),
    ),
    "transposed": (
        "nn.ConvTranspose2d(8, 6, 3, stride=2, padding=1, output_padding=1, groups=2)",
        "nn.ConvTranspose2d(6, 4, 2, stride=2)",
        "8, 5, 5",
        (2, 1),
    ),
    "conv1d": ("nn.Conv1d(4, 8, 5, dilation=2)", "nn.Conv1d(8, 8, 3, padding=1)", "4, 40", (1, 1)),
}


@pytest.mark.parametrize("name", sorted(CONVS))
def test_convolution_is_an_implicit_gemm_with_torchs_flops(name):
    """Forward and input gradient as torch.utils.flop_counter counts them; the weight gradient of
    a grouped convolution is 1/groups of torch's count (torch's formula drops the groups there:
    it counts every input channel against every output channel)."""
    first, second, shape, groups = CONVS[name]
    traced = _traced(CONV.format(first=first, second=second, shape=shape), 2)
    graph = traced.graph_module.graph
    module, _ = _import(traced)
    overcount = 0
    convs = [n for n in graph.nodes if n.op == "call_function" and amap.packet_name(n.target) == "convolution"]
    assert len(convs) == 2
    for n in graph.nodes:
        if n.op == "call_function" and amap.packet_name(n.target) == "convolution_backward":
            g = n.args[9]
            dy, x, w = (_shape(a) for a in n.args[:3])
            transposed = n.args[7]
            image = x if transposed else dy  # the image with one pixel per window position
            true_wgrad = 2 * image[0] * math.prod(image[2:]) * math.prod(w)
            if n.args[10][1]:
                overcount += (g - 1) * true_wgrad
    assert [c.args[8] for c in convs] == list(groups)
    torch_total = sum(_torch_flops(n) or 0 for n in graph.nodes if n.op == "call_function")
    assert _gemm_flops(module) == torch_total - overcount
    assert (overcount > 0) == (max(groups) > 1)
    # No im2col is materialized: every unfolded operand is a view.
    layouts = [o for o in module.walk() if isinstance(o, ph.LayoutOp) and o.kind.data in ("im2col", "col2im")]
    assert layouts and all(o.is_view and o.bytes_read() == 0 for o in layouts)


def test_cnn_plan_prices_its_convolutions():
    """The CNN that used to be the example of an unpriced model: every op priced, each conv's
    GEMMs tiled."""
    text = _compile(MODELS / "tiny_cnn.py", "--hw", "a100", *FAST)
    assert "phaze.warnings" not in text and "phaze.opaque" not in text
    convs = re.findall(r"phaze\.matmul[^\n]*phaze\.module = \"conv[12]\"[^\n]*", text)
    assert len(convs) == 2 + 2 + 1 and all("phaze.tile" in c for c in convs)  # fwd 2, wgrad 2, dgrad 1


# -- expert GEMMs and routing as the runtime launches them (docs/design.md §5.11) ------------------

#: The issue's single-GPU H100 step, stopped at the latencies.
H100_STEP = ("--hw", "h100", "--devices", "1", "--placement", "expert:1,1,1", "--global-batch", "2",
             "--micro-batch", "2", "--tp", "1", "--recompute", "none", "--emit", "latency")  # fmt: skip


def _priced(kernels: str, dtype: str):
    from phaze_ir.ir import parse_module

    text = _compile(_model_file(MIXTRAL.format(seq=32)), *H100_STEP, "--kernels", kernels, "--dtype", dtype)
    return parse_module(text)


def _latency(op) -> dict:
    return op.attributes["phaze.latency"].as_dict()


def test_grouped_gemm_is_one_kernel_only_in_bf16_on_hopper_and_blackwell():
    """torch 2.15's _grouped_mm_cuda: one CUTLASS kernel when A, B and the result are bf16 on
    compute capability 9.x or 10.x, else one GEMM per expert; a chip with none (not a CUDA GPU)
    runs one kernel."""
    from passes.algorithms.kernels import grouped_mm_one_kernel

    assert grouped_mm_one_kernel(True, 9.0) and grouped_mm_one_kernel(True, 10.0)
    assert not grouped_mm_one_kernel(True, 8.0) and not grouped_mm_one_kernel(True, 12.0)
    assert not grouped_mm_one_kernel(False, 9.0)  # fp16 and fp32 take the fallback
    assert grouped_mm_one_kernel(False, None)


def test_grouped_launches_by_runtime():
    """The two parts of one uneven split share one grouped kernel, or launch one GEMM per expert
    each; megatron and ops launch every part once, as before."""
    from passes.algorithms.kernels import KOp, StepValues, form_kernels

    parts = [
        KOp("library", "fwd", (0, 1), (2,), grouped="0,1", experts=3, bf16=True),
        KOp("library", "fwd", (0, 1), (3,), grouped="0,1", experts=1, bf16=True),
        KOp("library", "fwd", (0, 1), (4,)),
    ]
    values = StepValues([64] * 5, [None] * 5, frozenset({2, 3, 4}))

    def launches(runtime: str, cc: float | None) -> list[int]:
        return [k.launch for k in form_kernels(parts, values, runtime, cc) if k is not None]

    assert launches("eager", 9.0) == [1, 0, 1]
    assert launches("eager", 8.0) == launches("inductor", 8.0) == [3, 1, 1]
    assert launches("megatron", 8.0) == launches("ops", 8.0) == [1, 1, 1]


def test_autocast_leaves_grouped_mm_alone_on_cuda_as_on_cpu():
    """phaze traces under CPU autocast; the expert GEMMs stay fp32 under AMP only because neither
    CUDA's nor the CPU's autocast has a kernel for aten::_grouped_mm (torch 2.15): if a torch
    adds one, the AMP expert GEMMs become 16-bit on the GPU and this model is wrong."""
    import torch

    has = torch._C._dispatch_has_kernel_for_dispatch_key
    assert has("aten::mm", "AutocastCUDA") and has("aten::mm", "AutocastCPU")
    assert not has("aten::_grouped_mm", "AutocastCUDA") and not has("aten::_grouped_mm", "AutocastCPU")


def test_amp_expert_gemms_launch_one_fp32_gemm_per_expert():
    """Under autocast transformers' expert GEMMs read the fp32 weights (F.grouped_mm is not on
    autocast's list), so on an H100 torch runs each as E fp32 GEMMs (CUDA cores) after one host
    sync; in bf16 as one grouped kernel.  The AMP step is slower by what the fp32 rate, the extra
    launches and the syncs say, GEMM by GEMM; ``ops`` prices the same GEMMs as before."""
    from passes.algorithms.latency import wave_s
    from phaze_ir.hardware import load_hardware

    acc = load_hardware("h100")
    cal = acc.calibration
    assert cal.compute_capability == 9.0 and cal.fp32_gemm_flops == 66.9e12 and cal.host_sync_s == 6e-6
    amp, bf16 = (_expert_gemms(_priced("eager", d)) for d in ("amp-bfloat16", "bfloat16"))
    assert len(amp) == len(bf16) == 12  # 2 blocks x (2 forward + 4 backward), T = 128 rows over E = 4
    slower = acc.peak_tensor_flops / cal.fp32_gemm_flops
    assert slower > 14
    extra = 0.0
    for a, b in zip(amp, bf16):
        batch, m, n, k = a.mnk()
        experts = math.prod(batch)
        assert experts == 4 and a.lhs.type.element_type.bitwidth == 32
        assert a.attributes["phaze.kernel"].as_dict()["launch"] == experts
        assert b.attributes["phaze.kernel"].as_dict()["launch"] == 1
        lat = _latency(a)
        assert lat["bound"] == "compute"
        # one wave of 64x64 tiles per expert's GEMM, at the fp32 rate, E launches and one sync
        compute = experts * wave_s(1, m, n, k, 64, 64, 132, acc.peak_tensor_flops) / cal.tensor_efficiency * slower
        assert lat["split_s"] == pytest.approx(compute + experts * cal.kernel_overhead_s + cal.host_sync_s, rel=1e-12)
        extra += lat["split_s"] - _latency(b)["split_s"]
    assert extra > 12 * (3 * cal.kernel_overhead_s + cal.host_sync_s)
    # ops: one kernel per op at the tensor rate, the fp32 operands as before
    from passes.cost_view import matmul_desc

    for o in _expert_gemms(_priced("ops", "amp-bfloat16")):
        batch, m, n, k = o.mnk()
        desc = matmul_desc(o)
        assert "phaze.kernel" not in o.attributes and (desc.launches, desc.fp32, desc.syncs) == (1, False, 0)
        compute = wave_s(math.prod(batch), m, n, k, 64, 64, 132, acc.peak_tensor_flops) / cal.tensor_efficiency
        assert _latency(o)["split_s"] >= compute + cal.kernel_overhead_s
        if _latency(o)["bound"] == "compute":
            assert _latency(o)["split_s"] == pytest.approx(compute + cal.kernel_overhead_s, rel=1e-12)


def test_amp_step_is_slower_than_bf16_under_eager_and_inductor_only_by_the_expert_gemms(tmp_path):
    """The whole step: under eager and inductor the AMP step pays the experts' fp32 GEMMs; a
    chip without the figures (compute capability, fp32 rate) prices them as one grouped kernel
    at the tensor rate."""
    import json

    def step(kernels: str, dtype: str, hw: str = "h100") -> float:
        out = tmp_path / f"{kernels}-{dtype}-{hw.replace('/', '_')}.json"
        flags = [f if f != "h100" else hw for f in H100_STEP[:-2]]
        model = _model_file(MIXTRAL.format(seq=32))
        _compile(model, *flags, "--kernels", kernels, "--dtype", dtype, "--json", str(out))
        return json.loads(out.read_text())["time_per_batch_s"]

    expert_s = {
        k: sum(_latency(o)["split_s"] for o in _expert_gemms(_priced(k, "amp-bfloat16"))) for k in ("eager", "inductor")
    }
    for k in ("eager", "inductor"):
        # the expert GEMMs alone are 12 x (4 launches + a sync) of at least 3.9 us
        assert expert_s[k] > 12 * (4 * 3.877e-6 + 6e-6)
        assert step(k, "amp-bfloat16") > step(k, "bfloat16")
    # the same H100 without the three figures: one grouped kernel, at the tensor rate
    text = (Path(__file__).parents[1] / "phaze_ir" / "hw_presets" / "h100.toml").read_text()
    bare = tmp_path / "h100_bare.toml"
    bare.write_text(re.sub(r"(?m)^(compute_capability|fp32_gemm_flops|host_sync_s) = .*$", "", text))
    assert step("eager", "amp-bfloat16", str(bare)) < step("eager", "amp-bfloat16")


@pytest.mark.parametrize("kernels", ["eager", "inductor"])
def test_routing_ops_are_priced_kernels(kernels):
    """The router's top-k, the sort by expert, the histogram and cumulative sum of tokens per
    expert, the gather of the routed rows and its backward scatter, the inverse permutation:
    every op of the MoE block has semantics (the trace is imported strict elsewhere) and a
    positive latency, sorts and selections each a library kernel of their own."""
    module = _priced(kernels, "amp-bfloat16")
    seen: set[str] = set()
    for o in step_function(module).body.block.ops:
        aten = o.properties.get("aten")
        name = aten.data.split(".")[1] if aten is not None and aten.data.startswith("aten.") else ""
        if name in ("topk", "sort", "histc", "cumsum", "index", "index_put", "index_put_", "scatter"):
            seen.add(name)
            assert not isinstance(o, ph.OpaqueOp)
            kernel = o.attributes["phaze.kernel"].as_dict()
            lat = _latency(o)
            assert lat["split_s"] > 0, (name, lat)
            if name in ("topk", "sort", "histc"):
                assert kernel["launch"] == 1 and lat["split_s"] >= 3.877e-6, (name, kernel)
    assert {"topk", "sort", "histc", "cumsum", "index", "index_put"} <= seen, seen


def test_uneven_split_is_one_grouped_kernel_or_one_gemm_per_expert():
    """31 tokens x top-2 over 4 experts: each grouped GEMM is two batched parts (2 experts of 16
    rows, 2 of 15); in bf16 on the h100 one kernel launched by the first part, in AMP (fp32) each
    part launches one GEMM per expert it holds."""
    from phaze_ir.ir import parse_module

    model = _model_file(MIXTRAL.format(seq=31))
    flags = [f if f != "2" else "1" for f in H100_STEP]  # micro-batch and global batch 1
    for dtype, expected in (("bfloat16", [1, 0]), ("amp-bfloat16", [2, 2])):
        gemms = _expert_gemms(parse_module(_compile(model, *flags, "--kernels", "eager", "--dtype", dtype)))
        launches = [o.attributes["phaze.kernel"].as_dict()["launch"] for o in gemms]
        assert len(launches) == 24 and launches == expected * 12, (dtype, launches)


def test_fp32_rate_launches_and_syncs_need_the_chips_figures():
    """An fp32 GEMM is slower by peak / fp32_gemm_flops where the chip has that figure and as
    fast as a 16-bit one where it has not; launched per product it is quantised per kernel; a
    sync costs host_sync_s (0 without it); an ideal chip (no calibration) prices all alike."""
    import dataclasses

    from passes.algorithms.latency import MatmulDesc, estimate_matmul
    from phaze_ir.hardware import load_hardware

    h100 = load_hardware("h100")
    cal = h100.calibration
    bare = dataclasses.replace(h100, calibration=dataclasses.replace(cal, fp32_gemm_flops=None, host_sync_s=None))
    ideal = dataclasses.replace(h100, calibration=None)
    d = MatmulDesc(batch=8, m=8448, n=4096, k=4096, a_elem=4, b_elem=4, c_elem=4,
                   a_bytes=8 * 8448 * 4096 * 4, b_bytes=8 * 4096 * 4096 * 4)  # fmt: skip
    fp32 = dataclasses.replace(d, fp32=True)
    overhead = cal.kernel_overhead_s
    slow, fast = estimate_matmul(fp32, h100).split_s, estimate_matmul(d, h100).split_s
    assert slow - overhead == pytest.approx((fast - overhead) * h100.peak_tensor_flops / 66.9e12, rel=1e-12)
    assert estimate_matmul(fp32, bare).split_s == fast
    assert estimate_matmul(fp32, ideal) == estimate_matmul(d, ideal)
    # a product of 8448 x 4096 is 132 x 64 tiles of 64 x 64, 64 full waves on 132 SMs: none to merge
    apart = dataclasses.replace(d, launches=8, syncs=1)
    assert estimate_matmul(apart, h100).split_s == pytest.approx(fast + 7 * overhead + cal.host_sync_s, rel=1e-12)
    assert estimate_matmul(apart, bare).split_s == pytest.approx(fast + 7 * overhead, rel=1e-12)
    small = dataclasses.replace(d, m=64, n=64, a_bytes=8 * 64 * 4096 * 4, b_bytes=8 * 4096 * 64 * 4)
    # 8 one-tile products: one wave together, eight launched apart
    together = estimate_matmul(small, h100)
    assert estimate_matmul(dataclasses.replace(small, launches=8), h100).split_s > together.split_s + 7 * overhead


# -- FP8 experts as Transformer Engine runs them (docs/design.md §5.11.5) --------------------------


def _element(v) -> str:
    return str(ph.tensor_type(v).element_type)


def _expert_ops(module) -> list:
    return [
        o
        for o in step_function(module).body.block.ops
        if isinstance(o, ph.ComputeOp) and o.attributes["phaze.module"].data.endswith("mlp.experts")
    ]


def _fp8_step(recipe: str):
    from phaze_ir.ir import parse_module

    flags = ("--kernels", "eager", "--dtype", "fp8", "--fp8-recipe", recipe)
    return parse_module(_compile(_model_file(MIXTRAL.format(seq=32)), *H100_STEP, *flags))


@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_fp8_experts_run_transformer_engines_fp8_grouped_gemms(recipe):
    """Under --dtype fp8 with TE's recipes each expert GEMM is FP8, as TE's GroupedLinear runs
    it: forward E4M3 x E4M3, input and weight gradients E5M2 x E4M3, bf16 out, each still one
    grouped kernel on the h100 (2 blocks x 2 GEMMs x 3); per block each expert GEMM's input is
    cast once, its weight once and its output gradient once (with current scaling each after an
    amax); the backward keeps the FP8 columnwise copies of the inputs and weights (1 byte an
    element), no bf16 input of an expert GEMM.  torchtitan 0.3.0's float8 converter swaps
    linears only: under torchao's recipes the experts stay bf16, the linears around them FP8."""
    if recipe == "delayed":
        torchao = _fp8_step("rowwise")
        assert all(_element(o.lhs) == "bf16" == _element(o.rhs) for o in _expert_gemms(torchao))
        gemms = [o for o in step_function(torchao).body.block.ops if isinstance(o, ph.MatmulOp)]
        assert any(_element(o.lhs).startswith("f8") for o in gemms)
    module = _fp8_step(recipe)
    gemms = _expert_gemms(module)
    assert len(gemms) == 12
    kinds = sorted(
        (o.attributes["phaze.phase"].data, _element(o.lhs), _element(o.rhs), _element(o.result)) for o in gemms
    )
    assert kinds == sorted([("fwd", "f8E4M3FN", "f8E4M3FN", "bf16")] * 4 + [("bwd", "f8E5M2", "f8E4M3FN", "bf16")] * 8)
    assert all(o.attributes["phaze.kernel"].as_dict()["launch"] == 1 for o in gemms)
    ops = _expert_ops(module)
    casts = [
        o
        for o in ops
        if isinstance(o, ph.ElementwiseOp) and o.kind.data == "convert" and "f8" in _element(o.results[0])
    ]
    assert len(casts) == 2 * 2 * 3
    amaxes = [o for o in ops if isinstance(o, ph.ReductionOp) and o.kind.data == "norm"]
    assert len(amaxes) == (len(casts) if recipe == "current" else 0)
    saved = sorted(
        (tuple(ph.tensor_type(r).get_shape()), _element(r), o.attributes["phaze.saved_bytes"].value.data)
        for o in ops
        if o.attributes["phaze.module"].data.startswith("model.layers.0") and "phaze.saved_bytes" in o.attributes
        for r in o.results[:1]
        if "f8" in _element(r)
    )
    # 128 routed rows; gate_up [4, 192, 64], down [4, 64, 96]: the columnwise copies
    rows = 128
    assert saved == sorted(
        [
            ((64, rows), "f8E4M3FN", 64 * rows),
            ((96, rows), "f8E4M3FN", 96 * rows),
            ((4, 64, 192), "f8E4M3FN", 4 * 64 * 192),
            ((4, 96, 64), "f8E4M3FN", 4 * 96 * 64),
        ]
    )


def test_fp8_experts_are_the_experts_expert_parallelism_divides():
    """The FP8 expert GEMMs read casts of the expert weights and of the routed rows: their layer
    still has 4 experts, expert parallelism divides the same weights, and the all-to-alls move
    the bf16 rows (128 x 64 x 2 bytes), as in bf16."""
    from phaze_ir.ir import parse_module

    flags = ("--hw", "h100", "--devices", "4", "--global-batch", "8", "--placement", "expert:1,4,1",
             "--expert-parallel", "2", "--kernels", "megatron", *FAST[:6], *FAST[10:])  # fmt: skip
    records = {}
    for dtype in ("bfloat16", "fp8"):
        module = parse_module(_compile(_model_file(MIXTRAL.format(seq=32)), *flags, "--dtype", dtype))
        layers = [a.as_dict() for a in module.attributes["phaze.layers"].data]
        memory = [a.as_dict() for a in module.attributes["phaze.layer_memory"].data]
        records[dtype] = [
            (la["experts"], la["dispatch_bytes"], m["expert_param_bytes"]) for la, m in zip(layers, memory)
        ]
        if dtype == "fp8":
            assert all(_element(o.rhs) == "f8E4M3FN" for o in _expert_gemms(module))
    blocks = [r for r in records["fp8"] if r[0]]
    assert blocks == [(4, 128 * 64 * 2, (4 * 192 * 64 + 4 * 64 * 96) * 2)] * 2
    assert records["fp8"] == records["bfloat16"]


@pytest.mark.parametrize("e", [1, 2, 4])
def test_zero3_under_expert_parallelism_gathers_a_devices_own_experts(tmp_path, e):
    """ZeRO-3 (FSDP) at EP e holds a stage's shard and two gathered layers, each a layer's dense
    part whole and the device's own 1/e of its experts (torchtitan shards the experts over the
    d/e replicas holding them, so a gather brings back those alone; docs/design.md §6.5), not
    the whole layer: the tiny Mixtral on 4 replicas, params read off the layer records."""
    from phaze_ir.ir import parse_module

    fixed = ("--devices", "4", "--global-batch", "8", "--placement", "expert:1,4,1", "--zero", "3")
    plan = _plan_json(tmp_path, f"ep{e}", *fixed, "--expert-parallel", str(e))
    assert plan["feasible"] and (plan["dp"], plan["expert_parallel"]) == (4, e)
    text = _compile(_model_file(MIXTRAL.format(seq=32)), "--hw", "a100", *FAST, *fixed, "--expert-parallel", str(e))
    memory = [a.as_dict() for a in parse_module(text).attributes["phaze.layer_memory"].data]
    params = [(m["param_bytes"], m["expert_param_bytes"]) for m in memory]
    dense, experts = sum(p - x for p, x in params), sum(x for _, x in params)
    assert experts > 0

    def ceil(a: int, b: int) -> int:
        return -(-a // b)

    # The dense part over the 4 replicas, the device's 1/e of the experts over the 4/e holding them.
    shard = ceil(dense, 4) + ceil(ceil(experts, e), 4 // e) if e > 1 else ceil(dense + experts, 4)
    gathered = max(p - x + ceil(x, e) for p, x in params)
    (stage,) = plan["stages"]
    assert stage["memory"]["params"] == shard + 2 * gathered
    if e > 1:  # the MoE blocks are the largest layers whole: the bound they replace is larger
        assert gathered < max(p for p, _ in params)
