"""``--dtype fp8``: Transformer Engine's FP8 linears (``phaze_ir/frontend/float8_linear.py``),
priced at the chip's FP8 rate (``fp8_gemm_flops``), refused on a chip without one."""

from __future__ import annotations

import dataclasses
import functools
import textwrap
import warnings
from pathlib import Path

import pytest
from conftest import MODELS

from passes.graph_view import step_function
from phaze_ir import dialect as ph
from phaze_ir.errors import PhazeError, PhazeWarning

#: A GEMM-bound layer: Llama 3 8B's MLP (hidden 4096, FFN 14,336) on 2,048 tokens.
GEMM_BOUND = """
import torch
from torch import nn

NAME = "llama3-8b-mlp"


class MLP(nn.Module):
    def __init__(self, hidden=4096, ffn=14336):
        super().__init__()
        self.norm = nn.RMSNorm(hidden)
        self.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x):
        h = self.norm(x)
        h = self.down_proj(nn.functional.silu(self.gate_proj(h)) * self.up_proj(h))
        return (x + h).float().pow(2).mean()


def get_model():
    return MLP()


def get_inputs(micro_batch_size):
    return (torch.zeros(micro_batch_size, 2048, 4096),)
"""


def _compile(path: Path | str, *flags: str) -> str:
    from phaze.tools.phazec import _parser, compile_model

    args = _parser().parse_args([str(path), *flags, "-q"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PhazeWarning)
        text, failure = compile_model(args, lambda msg: None)
    if failure is not None:
        raise failure
    return text


@functools.cache
def _priced(model: str, dtype: str, kernels: str = "eager"):
    """``model`` (a path) traced in ``dtype`` and priced on one H100, as a module."""
    from phaze_ir.ir import parse_module

    flags = ("--hw", "h100", "--tp", "1", "--emit", "latency", "--kernels", kernels, "--dtype", dtype)
    return parse_module(_compile(model, *flags))


@pytest.fixture(scope="module")
def gemm_bound(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("fp8") / "llama3_8b_mlp.py"
    path.write_text(textwrap.dedent(GEMM_BOUND))
    return str(path)


def _ops(module) -> list:
    return [o for o in step_function(module).body.block.ops if isinstance(o, ph.ComputeOp)]


def _element(v) -> str:
    return str(v.type.element_type)


def _fp8(o) -> bool:
    return isinstance(o, ph.MatmulOp) and ph.element_bytes(o.lhs.type.element_type) == 1


def _casts(ops) -> list:
    """The FP8 casts: converts to an 8-bit float."""
    converts = [o for o in ops if isinstance(o, ph.ElementwiseOp) and o.kind.data == "convert"]
    return [o for o in converts if "f8" in _element(o.results[0])]


def _split_s(o) -> float:
    return o.attributes["phaze.latency"].as_dict()["split_s"]


def test_fp8_gemm_runs_at_the_fp8_rate_of_the_toml():
    """A GEMM on FP8 operands takes the compute time of its bf16 twin times peak tensor over
    fp8_gemm_flops (the h100's 1,978.9 over 989.4 TFLOP/s: half), its launch the same."""
    from passes.algorithms.latency import MatmulDesc, estimate_matmul
    from phaze_ir.hardware import load_hardware

    limited = load_hardware("h100")
    # without its power limit (docs/energy.md), which slows this FP8 GEMM a little: below
    h100 = dataclasses.replace(limited, energy=dataclasses.replace(limited.energy, power_limit_w=None))
    cal = h100.calibration
    assert cal.fp8_gemm_flops == 1978.9e12
    m, n, k = 8192, 14336, 4096
    bf16 = MatmulDesc(batch=1, m=m, n=n, k=k, a_elem=2, b_elem=2, c_elem=2, a_bytes=m * k * 2, b_bytes=k * n * 2)
    fp8 = dataclasses.replace(bf16, a_elem=1, b_elem=1, a_bytes=m * k, b_bytes=k * n)
    slow, fast = estimate_matmul(bf16, h100), estimate_matmul(fp8, h100)
    assert slow.bound == fast.bound == "compute"
    overhead = cal.kernel_overhead_s
    ratio = (slow.split_s - overhead) / (fast.split_s - overhead)
    assert ratio == pytest.approx(cal.fp8_gemm_flops / h100.peak_tensor_flops, rel=1e-12)
    assert ratio == pytest.approx(2.0, rel=1e-3)
    # with split accumulation (the backward's GEMMs): that rate times the TOML's efficiency
    split = estimate_matmul(dataclasses.replace(fp8, split_accumulation=True), h100)
    assert (fast.split_s - overhead) / (split.split_s - overhead) == pytest.approx(
        cal.fp8_split_accumulation_efficiency, rel=1e-12
    )
    assert cal.fp8_split_accumulation_efficiency < 1
    # a bf16 GEMM is never split-accumulated
    assert estimate_matmul(dataclasses.replace(bf16, split_accumulation=True), h100) == slow
    # at the 700 W limit the bf16 GEMM keeps its fitted time, the FP8 one is at most as fast
    assert estimate_matmul(bf16, limited) == slow
    assert fast.split_s <= estimate_matmul(fp8, limited).split_s < 1.05 * fast.split_s


def test_a_chip_without_fp8_refuses_in_one_line(tmp_path):
    """The a100 (no FP8 tensor cores) and an h100 file without the figure refuse, naming the
    chip and the key; the h100 takes it."""
    from passes.algorithms.latency import MatmulDesc, estimate_matmul, fp8_problem
    from phaze_ir.hardware import load_hardware

    h100, a100 = load_hardware("h100"), load_hardware("a100")
    assert fp8_problem(h100) is None
    why = fp8_problem(a100)
    assert why is not None and "\n" not in why and "a100" in why and "fp8_gemm_flops" in why
    bare = dataclasses.replace(h100, calibration=dataclasses.replace(h100.calibration, fp8_gemm_flops=None))
    assert fp8_problem(bare) is not None and fp8_problem(dataclasses.replace(h100, calibration=None)) is not None
    fp8 = MatmulDesc(batch=1, m=64, n=64, k=64, a_elem=1, b_elem=1, c_elem=2, a_bytes=4096, b_bytes=4096)
    with pytest.raises(ValueError, match="fp8_gemm_flops"):
        estimate_matmul(fp8, bare)
    # the whole step: one line from phazec
    with pytest.raises(PhazeError) as e:
        _compile(MODELS / "tiny_llama_sdpa.py", "--hw", "a100", "--tp", "1", "--emit", "latency", "--dtype", "fp8")
    assert str(e.value) == why


def test_fp8_linears_as_transformer_engine_runs_them():
    """Every linear of the blocks runs three FP8 GEMMs (forward E4M3 x E4M3; input and weight
    gradients E5M2 x E4M3) on casts of its operands (an input cast once for the linears that
    share it), bf16 out; the LM head and attention stay bf16.  The backward keeps the input's
    and the weight's FP8 columnwise copies: one byte per element each, where the bf16 step
    keeps the 2-byte input."""
    module = _priced(str(MODELS / "tiny_llama_sdpa.py"), "fp8")
    ops = _ops(module)
    gemms = [o for o in ops if isinstance(o, ph.MatmulOp)]
    fp8 = [o for o in gemms if _fp8(o)]
    linears = {o.attributes["phaze.module"].data for o in fp8}
    assert len(linears) == 2 * 7 and len(fp8) == 3 * len(linears)  # q k v o gate up down, 2 blocks
    assert not any("lm_head" in m for m in linears)
    pairs = {(o.attributes["phaze.phase"].data, _element(o.lhs), _element(o.rhs), _element(o.result)) for o in fp8}
    assert pairs == {("fwd", "f8E4M3FN", "f8E4M3FN", "bf16"), ("bwd", "f8E5M2", "f8E4M3FN", "bf16")}
    assert all(_element(o.lhs) == "bf16" for o in gemms if not _fp8(o))  # the LM head's three
    casts = [
        o
        for o in ops
        if isinstance(o, ph.ElementwiseOp) and o.kind.data == "convert" and "f8" in _element(o.results[0])
    ]
    # each weight and output gradient, and each input once for the linears that read it (q k v;
    # o; gate up; down: Megatron's linear_qkv, linear_proj, linear_fc1, linear_fc2)
    assert len(casts) == 2 * len(linears) + 2 * 4
    assert all(_split_s(o) > 0 for o in casts)
    # saved for the backward: the columnwise FP8 copies of the q projection's input and weight
    saved = {
        tuple(o.results[0].type.get_shape()): o.attributes["phaze.saved_bytes"].value.data
        for o in ops
        if o.attributes.get("phaze.module") == fp8[0].attributes["phaze.module"]
        and "phaze.saved_bytes" in o.attributes
        and _element(o.results[0]) == "f8E4M3FN"
    }
    tokens, hidden = 32, 64
    assert saved == {(hidden, tokens): hidden * tokens, (hidden, hidden): hidden * hidden}


def test_a_gemm_bound_layer_runs_its_gemms_twice_as_fast(gemm_bound):
    """Llama 3 8B's MLP on 2,048 tokens: its three forward GEMMs take half the time in FP8 (by
    the TOML's ratio, less the launches and what the power limit takes), its six backward GEMMs,
    split-accumulated as TE runs them, that times the TOML's efficiency; the casts add
    memory-bound kernels, the step is faster."""
    from phaze_ir.hardware import load_hardware

    h100 = load_hardware("h100")
    cal = h100.calibration
    bf16, fp8 = (_ops(_priced(gemm_bound, d)) for d in ("bfloat16", "fp8"))
    gemms = {d: [o for o in ops if isinstance(o, ph.MatmulOp)] for d, ops in (("bf16", bf16), ("fp8", fp8))}
    assert len(gemms["bf16"]) == len(gemms["fp8"]) == 9 and all(_fp8(o) for o in gemms["fp8"])
    # the same products (TE's weight gradient is g^T x where autograd's is x^T g: its transpose)
    assert sorted(sorted(o.mnk()[1:]) for o in gemms["bf16"]) == sorted(sorted(o.mnk()[1:]) for o in gemms["fp8"])
    casts = _casts(fp8)
    assert len(casts) == 3 + 3 + 2  # weights, output gradients, inputs (gate and up share theirs)
    assert all(o.attributes["phaze.latency"].as_dict()["bound"] == "hbm" for o in casts)
    faster = cal.fp8_gemm_flops / h100.peak_tensor_flops
    for phase, n, ratio in (("fwd", 3, faster), ("bwd", 6, faster * cal.fp8_split_accumulation_efficiency)):
        gemm_s = {
            d: sum(_split_s(o) for o in g if o.attributes["phaze.phase"].data == phase) - n * cal.kernel_overhead_s
            for d, g in gemms.items()
        }
        # less what the 700 W limit takes where an FP8 GEMM's energy at that rate is more than the
        # limit allows (docs/energy.md): 1.93 of the 2.0 forward
        assert 0.95 * ratio < gemm_s["bf16"] / gemm_s["fp8"] <= ratio * (1 + 0.02), phase
    step_s = {"bf16": sum(map(_split_s, bf16)), "fp8": sum(map(_split_s, fp8))}
    assert step_s["fp8"] < step_s["bf16"]


def test_gpt2s_conv1d_linears_run_in_fp8_too():
    """transformers' ``Conv1D`` (GPT-2's linears, ``[in, out]`` weights) is a linear Megatron-LM
    runs in TE: its GEMMs are FP8; the tied LM head stays bf16."""
    ops = _ops(_priced(str(MODELS / "tiny_gpt2.py"), "fp8"))
    fp8 = [o for o in ops if _fp8(o)]
    assert len({o.attributes["phaze.module"].data for o in fp8}) == 2 * 4  # c_attn c_proj c_fc c_proj, 2 blocks
    assert len(fp8) == 3 * 8 and not any(o.attributes["phaze.module"].data == "lm_head" for o in fp8)


@pytest.mark.parametrize("recipe", ["delayed", "current", "tensorwise", "rowwise"])
def test_fp8_linears_shard_as_bf16_ones(recipe):
    """At TP 2 the FP8 step's linears are column- and row-parallel as the bf16 step's: the same
    collectives, and each weight's FP8 cast is of the device's shard, whatever the recipe: a
    cast's amax of a weight shard or of a split activation is each device's, all-reduced as a
    scalar (not priced), and torchao's scaling ops on the weight are the weight's."""
    from phaze_ir.ir import parse_module

    def sharded(dtype: str):
        flags = ("--tp", "2", "--emit", "sharded", "--dtype", dtype) + (
            ("--fp8-recipe", recipe) if dtype == "fp8" else ()
        )
        return _ops(parse_module(_compile(MODELS / "tiny_llama_sdpa.py", *flags)))

    bf16, fp8 = sharded("bfloat16"), sharded("fp8")

    def collectives(ops):
        return [(o.kind.data, o.attributes["phaze.module"].data) for o in ops if isinstance(o, ph.CollectiveOp)]

    assert collectives(fp8) == collectives(bf16) and len(collectives(bf16)) > 0
    q = [o for o in fp8 if _fp8(o) and o.attributes["phaze.module"].data.endswith("layers.0.self_attn.q_proj")]
    assert tuple(q[0].rhs.type.get_shape()) == (64, 32)  # [in, out / 2]: the column-parallel shard


@pytest.mark.parametrize("tp", [2, 4])
def test_gpt2s_fp8_linears_shard_as_bf16_ones_and_stay_in_their_layers(tp):
    """GPT-2's ``Conv1D`` linears (``[in, out]`` weights, the fused ``c_attn`` of q, k and v) at
    TP 2 and 4: the FP8 step has the bf16 step's collectives, and each layer holds the same
    weight bytes per device (the FP8 step's weights are bf16).  Choosing the FP8 linears once
    took a transpose of each ``Conv1D`` weight for its shape, a dead op before the first layer
    that made the prologue own every weight: gpt3_175b at PP 8 put all 175B in stage 0."""
    from phaze_ir import keys
    from phaze_ir.attributes import LayerInfoAttr
    from phaze_ir.ir import parse_module

    def priced(dtype: str):
        flags = ("--hw", "h100", "--tp", str(tp), "--emit", "latency", "--dtype", dtype)
        return parse_module(_compile(MODELS / "tiny_gpt2.py", *flags))

    bf16, fp8 = priced("bfloat16"), priced("fp8")

    def collectives(module):
        ops = _ops(module)
        return [(o.kind.data, o.attributes["phaze.module"].data) for o in ops if isinstance(o, ph.CollectiveOp)]

    def layer_bytes(module):
        return [r.as_dict()["param_bytes"] for r in keys.require_records(module, keys.LAYERS, LayerInfoAttr)]

    assert collectives(fp8) == collectives(bf16) and len(collectives(bf16)) > 0
    assert layer_bytes(fp8) == layer_bytes(bf16)
    c_attn = [o for o in _ops(fp8) if _fp8(o) and o.attributes["phaze.module"].data == "transformer.h.0.attn.c_attn"]
    assert tuple(c_attn[0].rhs.type.get_shape()) == (64, 3 * 64 // tp)  # [in, out / TP]: column-parallel


def test_fp8_weight_copies_are_kept_once_per_step_not_per_micro_batch(gemm_bound):
    """Transformer Engine casts each weight to FP8 (rowwise and columnwise) on a step's first
    micro-batch and keeps that workspace for the later ones: the copies are in no stash
    (activations per micro-batch) but in the layer's ``fp8_weight_bytes``, one byte per weight
    element for each of the two copies; the bf16 step has none."""
    from phaze_ir import keys
    from phaze_ir.attributes import LayerMemoryAttr, LayerRecomputeAttr
    from phaze_ir.ir import parse_module

    def memory(dtype: str):
        flags = ("--hw", "h100", "--tp", "1", "--emit", "recompute", "--dtype", dtype)
        module = parse_module(_compile(gemm_bound, *flags))
        mem = [r.as_dict() for r in keys.require_records(module, keys.LAYER_MEMORY, LayerMemoryAttr)]
        rc = [r.as_dict() for r in keys.require_records(module, keys.LAYER_RECOMPUTE, LayerRecomputeAttr)]
        return mem, rc

    (fp8,), (fp8_rc,) = memory("fp8")
    (bf16,), _ = memory("bfloat16")
    weights = 3 * 4096 * 14336  # gate, up, down
    assert fp8["fp8_weight_bytes"] == 2 * weights and bf16["fp8_weight_bytes"] == 0
    # the stash: bf16's but for the two linear inputs (the norm's output, 2,048 x 4,096, and
    # down's, 2,048 x 14,336) kept in FP8, one byte where bf16 keeps two; no weight copy
    assert fp8["saved_none_bytes"] == fp8_rc["none_bytes"]
    assert bf16["saved_none_bytes"] - fp8["saved_none_bytes"] == 2048 * (4096 + 14336)


def test_gpt2s_fp8_weight_copies_are_two_bytes_per_element_too():
    """A ``Conv1D``'s weight is ``[in, out]``, read through a transposed view: its FP8 copies
    are still a rowwise and a columnwise one (TE's linears hold ``[out, in]`` weights), two
    bytes per element, as an ``nn.Linear``'s."""
    from phaze_ir import keys
    from phaze_ir.attributes import LayerMemoryAttr
    from phaze_ir.ir import parse_module

    flags = ("--hw", "h100", "--tp", "1", "--emit", "recompute", "--dtype", "fp8")
    module = parse_module(_compile(MODELS / "tiny_gpt2.py", *flags))
    blocks = [r.as_dict() for r in keys.require_records(module, keys.LAYER_MEMORY, LayerMemoryAttr)][1:3]
    d = 64  # c_attn [d, 3d], attn.c_proj [d, d], c_fc [d, 4d], mlp.c_proj [4d, d]
    assert [b["fp8_weight_bytes"] for b in blocks] == [2 * (3 * d * d + d * d + 4 * d * d + 4 * d * d)] * 2


def _plan(tmp_path: Path, model: str, name: str, *flags: str) -> dict:
    import json

    out = tmp_path / f"{name}.json"
    fixed = ("--hw", "h100", "--devices", "2", "--global-batch", "2", "--micro-batch", "1", "--tp", "1")
    _compile(model, *fixed, "--placement", "expert:1,2,1", "--recompute", "none", *flags, "--json", str(out))
    return json.loads(out.read_text())


def test_fp8_primary_weights_keep_no_copies_beside_them(gemm_bound, tmp_path):
    """``--fp8-params`` (Megatron-LM's --fp8-param-gather, NeMo's fp8_params): the FP8 linears'
    weights are Transformer Engine's FP8 tensors, rowwise and columnwise, in place of the bf16
    weights, so the stage holds no FP8 copies beside them: the FP8 plan's memory less
    ``fp8_weight_bytes`` (2 bytes per weight element); ZeRO-1's parameter all-gather moves the
    FP8 data, 1 byte per weight element (Megatron-LM's uint8 parameter buffer), and no weight
    is cast (the casts once a step beside the optimizer go), so only those are shorter; asked
    of a bf16 step it is refused in one line."""
    exposed = ("--dtype", "fp8", "--zero", "1", "--no-dp-overlap")  # (overlapped, the DP hides behind the GEMMs)
    fp8 = _plan(tmp_path, gemm_bound, "fp8", *exposed)
    primary = _plan(tmp_path, gemm_bound, "primary", *exposed, "--fp8-params")
    weights = 3 * 4096 * 14336
    (a,), (b,) = fp8["stages"], primary["stages"]
    assert a["memory_bytes"] - b["memory_bytes"] == 2 * weights
    assert a["memory"]["params"] - b["memory"]["params"] == 2 * weights
    shorter = fp8["time_per_batch_s"] - primary["time_per_batch_s"]
    assert shorter > 0
    parts = fp8["breakdown_s"], primary["breakdown_s"]
    # the DP's gather of 1-byte weights, and no weight cast once a step beside the optimizer
    dp, opt = (parts[0][k] - parts[1][k] for k in ("dp_comm_s", "optimizer_s"))
    assert dp > 0 and opt > 0
    assert shorter == pytest.approx(dp + opt, rel=1e-9)
    assert parts[1]["compute_s"] == pytest.approx(parts[0]["compute_s"])
    with pytest.raises(
        PhazeError, match=r"^--fp8-params: FP8 primary weights are the FP8 linears. of --dtype fp8, not bfloat16$"
    ) as info:
        _plan(tmp_path, gemm_bound, "bf16", "--dtype", "bfloat16", "--fp8-params")
    assert "\n" not in str(info.value)


def test_adam_with_bf16_state_holds_half_the_optimizer_bytes(gemm_bound, tmp_path):
    """``--optimizer adam-bf16`` (Apex's DistributedFusedAdam with ``dtype=torch.bfloat16``,
    NeMo's ``optim.dtype: bf16``): the weight's copy and the two moments in bf16, 6 bytes per
    element where mixed-precision Adam keeps 12; ZeRO-1 over 2 replicas holds half of each, and
    the update, which reads and writes its state, is faster."""
    adam = _plan(tmp_path, gemm_bound, "adam", "--dtype", "bfloat16", "--zero", "1")
    bf16 = _plan(tmp_path, gemm_bound, "bf16", "--dtype", "bfloat16", "--zero", "1", "--optimizer", "adam-bf16")
    params = 3 * 4096 * 14336 + 4096  # gate, up, down and the norm's weight
    (a,), (b,) = adam["stages"], bf16["stages"]
    assert (a["memory"]["optimizer"], b["memory"]["optimizer"]) == (12 * params // 2, 6 * params // 2)
    assert a["memory_bytes"] - b["memory_bytes"] == 6 * params // 2
    assert bf16["time_per_batch_s"] < adam["time_per_batch_s"]


def test_fp8_primary_weights_are_gathered_at_one_byte_an_element():
    """The DP's problem under ``--fp8-params``: each layer's ``param_gather_bytes`` is its
    parameters' bytes less one byte per FP8 weight element (``fp8_weight_bytes`` counts two:
    the rowwise and columnwise copies), what ZeRO's all-gathers move; without it, the
    parameters' own bytes (the field left out)."""
    from passes.algorithms.placement import LayerNumbers, fp8_param_gather_bytes, problem
    from passes.algorithms.placement_options import PlacementOptions
    from passes.algorithms.priced_step import PricedStep
    from phaze_ir.hardware import load_hardware

    h100 = load_hardware("h100")
    norm = 2 * 4096
    weight = 2 * 4096 * 14336
    layer = LayerNumbers(fwd_s=1e-3, bwd_s=2e-3, recompute_s=(0.0, 0.0, 0.0), saved_bytes=(0, 0, 0),
                         param_bytes=weight + norm, grad_bytes=weight + norm, optimizer_bytes=0, workspace_bytes=0,
                         boundary_bytes=0, fp8_weight_bytes=weight)  # fmt: skip
    assert fp8_param_gather_bytes(layer.param_bytes, layer.fp8_weight_bytes) == 4096 * 14336 + norm

    def dp(fp8_params: bool):
        options = PlacementOptions(devices=2, global_batch=2, fp8_params=fp8_params)
        step = PricedStep(layers=[layer], micro_batch=1, tp=1)
        return problem(step, options, hbm_bytes=h100.hbm.bytes, levels=h100.network, memory_bound_Bps=1e12)

    (primary,), (plain,) = dp(True)["layers"], dp(False)["layers"]
    assert primary["param_gather_bytes"] == 4096 * 14336 + norm and primary["fp8_weight_bytes"] == 0
    assert "param_gather_bytes" not in plain and plain["fp8_weight_bytes"] == weight


def _recipe(model: str, recipe: str, kernels: str = "eager", emit: str = "latency"):
    """``model`` traced in FP8 with ``recipe`` and priced on one H100, as a module."""
    return _recipe_text(model, recipe, kernels, emit)[0]


@functools.cache
def _recipe_text(model: str, recipe: str, kernels: str, emit: str):
    from phaze_ir.ir import parse_module

    flags = ("--hw", "h100", "--tp", "1", "--emit", emit, "--kernels", kernels, "--dtype", "fp8")
    return (parse_module(_compile(model, *flags, "--fp8-recipe", recipe)),)


def _saved_fp8(ops) -> list:
    """The FP8 tensors the forward keeps for the backward."""
    return [o for o in ops if "phaze.saved_bytes" in o.attributes and "f8" in _element(o.results[0])]


def _memory(module) -> dict:
    from phaze_ir import keys
    from phaze_ir.attributes import LayerMemoryAttr

    (mem,) = [r.as_dict() for r in keys.require_records(module, keys.LAYER_MEMORY, LayerMemoryAttr)]
    return mem


def test_current_scaling_reads_each_cast_tensor_for_its_amax():
    """TE's current scaling (``--fp8-recipe current``, Megatron-LM's tensorwise) casts what
    delayed scaling casts and keeps the same FP8 copies, but each cast first reads its tensor
    for its amax: one reduction (a vector norm of order inf) per cast, feeding the scale the
    GEMM reads; the step is slower by those reads."""
    model = str(MODELS / "tiny_llama_sdpa.py")
    delayed, current = _ops(_recipe(model, "delayed")), _ops(_recipe(model, "current"))
    amaxes = [o for o in current if isinstance(o, ph.ReductionOp) and o.kind.data == "norm"]
    assert len(_casts(current)) == len(_casts(delayed)) == len(amaxes) == 2 * 14 + 2 * 4
    assert not [o for o in delayed if isinstance(o, ph.ReductionOp) and o.kind.data == "norm"]
    assert [o.results[0].type.get_shape() for o in _saved_fp8(current)] == [
        o.results[0].type.get_shape() for o in _saved_fp8(delayed)
    ]
    assert sum(map(_split_s, current)) > sum(map(_split_s, delayed))


@pytest.mark.parametrize(
    ("recipe", "grad"),
    [("tensorwise", "f8E5M2"), ("rowwise", "f8E4M3FN")],  # torchao's recipes (float8/config.py)
)
def test_torchaos_float8_linear_keeps_bf16_operands_and_casts_them_again(recipe, grad):
    """torchao's ``Float8Linear`` (``--fp8-recipe tensorwise`` / ``rowwise``, torchtitan's
    float8): three FP8 GEMMs a linear, each linear casting its own input, and six casts a
    linear (input and weight in the forward; the output gradient twice, the weight and the
    input again in the backward); nothing FP8 kept for the backward (the bf16 input and weight
    are) and no weight copy kept for the step.  Rowwise is E4M3 throughout."""
    model = str(MODELS / "tiny_llama_sdpa.py")
    module = _recipe(model, recipe, emit="recompute")
    ops = _ops(module)
    fp8 = [o for o in ops if _fp8(o)]
    linears = {o.attributes["phaze.module"].data for o in fp8}
    assert len(linears) == 2 * 7 and len(fp8) == 3 * len(linears)
    assert not any("lm_head" in m for m in linears)
    pairs = {(o.attributes["phaze.phase"].data, _element(o.lhs), _element(o.rhs), _element(o.result)) for o in fp8}
    assert pairs == {("fwd", "f8E4M3FN", "f8E4M3FN", "bf16"), ("bwd", grad, "f8E4M3FN", "bf16")}
    assert len(_casts(ops)) == 6 * len(linears)
    assert _saved_fp8(ops) == []
    assert all(m["fp8_weight_bytes"] == 0 for m in _memory_all(module))


def _memory_all(module) -> list[dict]:
    from phaze_ir import keys
    from phaze_ir.attributes import LayerMemoryAttr

    return [r.as_dict() for r in keys.require_records(module, keys.LAYER_MEMORY, LayerMemoryAttr)]


def test_the_recipes_price_apart_on_a_gemm_bound_layer(gemm_bound):
    """Llama 3 8B's MLP on 2,048 tokens: TE's current scaling is delayed's step plus an amax
    read a cast; torchao's recipes keep the bf16 step's stash (the inputs in bf16, where TE
    keeps FP8 copies) and no weight copies, and in eager run each cast as five full-size
    kernels, which torch.compile fuses: compiled they come near TE's."""
    step = {}
    for kernels in ("eager", "inductor"):
        for recipe in ("delayed", "current", "tensorwise", "rowwise"):
            step[kernels, recipe] = sum(map(_split_s, _ops(_recipe(gemm_bound, recipe, kernels))))
    for kernels in ("eager", "inductor"):
        assert step[kernels, "delayed"] < step[kernels, "current"] < step[kernels, "tensorwise"]
        assert step[kernels, "delayed"] < step[kernels, "rowwise"]
    assert step["eager", "tensorwise"] > 2 * step["inductor", "tensorwise"]
    assert step["inductor", "tensorwise"] < 1.5 * step["inductor", "delayed"]
    delayed, rowwise = (_memory(_recipe(gemm_bound, r, "eager", "recompute")) for r in ("delayed", "rowwise"))
    (bf16,) = _memory_all(_compile_module(gemm_bound, "bfloat16"))
    assert rowwise["fp8_weight_bytes"] == 0 and delayed["fp8_weight_bytes"] == 2 * 3 * 4096 * 14336
    assert rowwise["saved_none_bytes"] == bf16["saved_none_bytes"]
    assert bf16["saved_none_bytes"] - delayed["saved_none_bytes"] == 2048 * (4096 + 14336)


def _compile_module(model: str, dtype: str):
    from phaze_ir.ir import parse_module

    return parse_module(_compile(model, "--hw", "h100", "--tp", "1", "--emit", "recompute", "--dtype", dtype))


def test_a_backward_fp8_gemm_is_not_priced_as_a_forward_one_of_the_same_types():
    """Two FP8 GEMMs of equal operand and result types, one of the forward and one of the
    backward (an all-E4M3 recipe's input gradient of a square linear has the forward's types),
    are different ops to the pricing: the backward's runs with split accumulation."""
    from passes.cost_view import Describer
    from phaze_ir.ir import parse_module

    t = "tensor<64x64xf8E4M3FN>"
    gemm = 'phaze.matmul %a, %b {{phaze.module = "l", phaze.phase = "{}"}} : ({t}, {t}) -> tensor<64x64xbf16>'
    text = (
        f"builtin.module {{\n  func.func @f(%a: {t}, %b: {t}) {{\n"
        f"    %fwd = {gemm.format('fwd', t=t)}\n    %bwd = {gemm.format('bwd', t=t)}\n"
        "    func.return\n  }\n}"
    )
    module = parse_module(text)
    fwd, bwd = (o for o in module.walk() if o.name == "phaze.matmul")
    describe = Describer()
    (sig_f, desc_f), (sig_b, desc_b) = describe(fwd), describe(bwd)
    assert sig_f != sig_b
    assert desc_f is not None and desc_b is not None
    assert not desc_f.split_accumulation and desc_b.split_accumulation


def test_fp8_weight_casts_once_a_step_below_zero3_every_micro_batch_under_it(gemm_bound, tmp_path):
    """Transformer Engine casts a weight to FP8 on a step's first micro-batch and reuses the
    cast copies in the later ones (``update_workspace`` only when ``is_first_microbatch``);
    under ZeRO-3 (FSDP2) it keeps none and casts in every forward; with FP8 primary weights
    there is nothing to cast.  On 4 micro-batches, ZeRO-1's plan pays the casts once (in its
    optimizer step's part), ZeRO-3's four times (in its compute), ``--fp8-params`` none."""
    from phaze_ir import keys
    from phaze_ir.attributes import LayerScheduleAttr
    from phaze_ir.ir import parse_module

    def cast_s(dtype: str) -> float:
        flags = ("--hw", "h100", "--tp", "1", "--emit", "scheduled", "--dtype", dtype)
        module = parse_module(_compile(gemm_bound, *flags))
        (layer,) = [r.as_dict() for r in keys.require_records(module, keys.LAYER_SCHEDULE, LayerScheduleAttr)]
        assert 0 <= layer["cast_s"] < layer["fwd_s"]
        return layer["cast_s"]

    cast = cast_s("fp8")
    assert cast > 0 and cast_s("bfloat16") == 0

    def plan(name: str, *flags: str) -> dict:
        import json

        out = tmp_path / f"{name}.json"
        fixed = ("--hw", "h100", "--devices", "2", "--global-batch", "8", "--micro-batch", "1", "--tp", "1")
        _compile(
            gemm_bound,
            *fixed,
            "--placement",
            "expert:1,2,1",
            "--recompute",
            "none",
            "--dtype",
            "fp8",
            *flags,
            "--json",
            str(out),
        )
        return json.loads(out.read_text())

    z1, z3, primary = (
        plan("z1", "--zero", "1"),
        plan("z3", "--zero", "3"),
        plan("primary", "--zero", "1", "--fp8-params"),
    )
    (s1,), (s3,), (sp,) = z1["stages"], z3["stages"], primary["stages"]
    assert s3["optimizer_s"] == pytest.approx(sp["optimizer_s"], rel=1e-9)
    # per micro-batch: ZeRO-1 and FP8 primary weights compute alike, ZeRO-3 casts again
    assert z1["breakdown_s"]["compute_s"] == pytest.approx(primary["breakdown_s"]["compute_s"], rel=1e-9)
    assert z3["breakdown_s"]["compute_s"] - z1["breakdown_s"]["compute_s"] == pytest.approx(4 * cast, rel=1e-6)
    # once a step: ZeRO-1 casts beside its optimizer step (1/2 of it, over d = 2), the others not
    assert s1["optimizer_s"] - sp["optimizer_s"] == pytest.approx(cast, rel=1e-6)
