"""Kernels as a runtime forms them (``passes/algorithms/kernels.py``, ``phaze-form-kernels``),
SDPA traced as a GPU runs it, and autocast's mixed precision."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from passes.algorithms.kernels import (
    ADAM_CHUNK_ELEMENTS,
    ADAM_MAX_BLOCKS,
    ADAM_MAX_TENSORS,
    MAX_FUSION_SIZE,
    KOp,
    StepValues,
    form_kernels,
)

MODELS = Path(__file__).parent / "models"


class _Step:
    """A hand-made step: values of ``nbytes`` bytes, ops appended in program order."""

    def __init__(self, n_args: int = 1, nbytes: int = 64):
        self.nbytes = [nbytes] * n_args
        self.view_of: list[int | None] = [None] * n_args
        self.ops: list[KOp] = []

    def op(self, kind: str, *operands: int, numel: int = 32, rnumel: int = 1, view: bool = False, **kw) -> int:
        """A new op of ``kind`` reading ``operands``; its one result's value id."""
        v = len(self.nbytes)
        self.nbytes.append(64 if rnumel == 1 else 64 // rnumel)
        self.view_of.append(operands[0] if view else None)
        self.ops.append(KOp(kind, "fwd", tuple(operands), (v,), numel=numel, rnumel=rnumel, **kw))
        return v

    def form(self, runtime: str, outputs: tuple[int, ...] = ()):
        return form_kernels(self.ops, StepValues(self.nbytes, self.view_of, frozenset(outputs)), runtime)


def test_eager_is_one_kernel_per_op_but_what_aten_fuses():
    s = _Step()
    a = s.op("pointwise", 0)
    b = s.op("library", a, fused="attn")
    c = s.op("reduction", b, numel=4, rnumel=8, fused="attn")
    v = s.op("view", c, view=True)
    s.op("pointwise", v, numel=4)
    ks = s.form("eager")
    assert [k.id if k else None for k in ks] == [0, 1, 1, None, 4]
    assert [k.launch if k else None for k in ks] == [1, 1, 0, None, 1]
    # a's result leaves its kernel; b's is made and used inside the attention kernel
    assert ks[0].onchip_written == 0 and ks[1].onchip_written == 64 and ks[2].onchip_read == 64


def test_inductor_fuses_pointwise_chains_and_reductions_of_the_same_size():
    s = _Step()
    a = s.op("pointwise", 0)
    b = s.op("pointwise", a)
    r = s.op("reduction", b, numel=4, rnumel=8, softmax=True)  # prologue: 32 == 4 * 8
    e = s.op("pointwise", r, numel=4)  # epilogue over the reduced size
    other = s.op("reduction", e, numel=2, rnumel=2)  # another size: a kernel of its own
    ks = s.form("inductor", outputs=(other,))
    assert [k.id for k in ks] == [0, 0, 0, 0, 4]
    assert [k.launch for k in ks] == [1, 0, 0, 0, 1]
    assert ks[0].onchip_written == 64 and ks[1].onchip_read == 64 and ks[3].onchip_written == 0
    # Megatron: the pointwise chain and the softmax after it (fused scale-mask-softmax), nothing
    # after a reduction, and no pointwise prologue of another reduction
    assert [k.id for k in s.form("megatron", outputs=(other,))] == [0, 0, 0, 3, 4]


def test_inductor_never_fuses_into_a_cycle_through_a_gemm():
    s = _Step()
    a = s.op("pointwise", 0)
    g = s.op("library", a)  # a GEMM reading a
    s.op("pointwise", a, g)  # reads a (a's kernel) and the GEMM's result, made after a's kernel began
    ks = s.form("inductor")
    assert ks[2].id != ks[0].id


def test_inductor_horizontal_fusion_of_ops_reading_one_input():
    s = _Step()
    s.op("pointwise", 0)
    s.op("pointwise", 0)
    ks = s.form("inductor")
    assert ks[0].id == ks[1].id and ks[1].onchip_read == 64  # the input read once
    assert [k.id for k in s.form("megatron")] == [0, 1]  # Megatron: no horizontal fusion


def test_inductor_fusion_stops_at_its_largest_size():
    s = _Step()
    v = 0
    for _ in range(2 * MAX_FUSION_SIZE + 1):
        v = s.op("pointwise", v)
    ks = s.form("inductor")
    assert len({k.id for k in ks}) == 3 and sum(k.launch for k in ks) == 3


def _adam_launches(sizes: list[int], layers: list[int] | None = None) -> int:
    s = _Step()
    for n, layer in zip(sizes, layers or [-1] * len(sizes)):
        s.ops.append(KOp("optimizer", "opt", (0,), (), param_elements=n, layer=layer))
    return sum(k.launch for k in s.form("eager"))


def test_fused_adam_lists_are_dealt_layer_by_layer():
    """Each layer's parameters are dealt on their own, so a step's launches are the sum of its
    layers' (what the DP and the sweep's per-layer settings add up): 9 tensors per block (a Llama
    block's) over 8 blocks is 8 launches, not the 2 of one list across them, and a block's count
    does not depend on the blocks before it."""
    assert _adam_launches([10] * 72) == 2
    assert _adam_launches([10] * 72, [i // 9 for i in range(72)]) == 8
    blocks = [_adam_launches([10] * 9 * n, [i // 9 for i in range(9 * n)]) for n in (3, 4, 32)]
    assert blocks[1] - blocks[0] == 1 and blocks[2] == 32
    # a layer whose chunks fill launches exactly leaves nothing to close
    full = 2 * ADAM_MAX_BLOCKS * ADAM_CHUNK_ELEMENTS
    assert _adam_launches([full, full], [0, 1]) == 4


def test_fused_adam_launches_follow_multi_tensor_apply():
    assert _adam_launches([10] * ADAM_MAX_TENSORS) == 1
    assert _adam_launches([10] * (ADAM_MAX_TENSORS + 1)) == 2
    assert _adam_launches([10] * 100) == 3  # 36 + 36 + 28 tensors
    # one tensor of 2 x 320 chunks: two full launches, nothing left
    assert _adam_launches([2 * ADAM_MAX_BLOCKS * ADAM_CHUNK_ELEMENTS]) == 2
    assert _adam_launches([2 * ADAM_MAX_BLOCKS * ADAM_CHUNK_ELEMENTS + 1]) == 3
    # ops: one kernel per parameter
    s = _Step()
    for _ in range(100):
        s.ops.append(KOp("optimizer", "opt", (0,), (), param_elements=10))
    assert sum(k.launch for k in s.form("ops")) == 100


def test_foreach_adam_runs_eight_kernels_per_chunk_list():
    """torch's default (``foreach``) AdamW steps each chunk list with eight multi-tensor kernels
    (``_multi_tensor_adam``: mul, lerp, mul, addcmul, sqrt, div, add, addcdiv) where the fused
    step runs one; the lists are dealt as the fused step's."""
    from phaze_ir.op_kinds import OPTIMIZER_FOREACH_KERNELS

    def launches(sizes, kernels):
        s = _Step()
        for n in sizes:
            s.ops.append(KOp("optimizer", "opt", (0,), (), param_elements=n, optimizer_kernels=kernels))
        return sum(k.launch for k in s.form("eager"))

    foreach = OPTIMIZER_FOREACH_KERNELS["adam-foreach"]
    assert foreach == 8
    for sizes in ([10] * 100, [2 * ADAM_MAX_BLOCKS * ADAM_CHUNK_ELEMENTS + 1]):
        assert launches(sizes, foreach) == foreach * launches(sizes, 1) == foreach * _adam_launches(sizes)


def test_foreach_adam_moves_its_eight_kernels_bytes():
    """A parameter's foreach step reads 48 and writes 32 bytes of fp32 state where the fused step
    reads 16 and writes 12 (the fp32 master, gradient and moments once): 32 and 20 more; the
    state it keeps is the fused step's."""
    from xdsl.dialects.builtin import TensorType, f32
    from xdsl.utils.test_value import create_ssa_value

    from phaze_ir import dialect as ph

    t = TensorType(f32, [1000])
    w, g = create_ssa_value(t), create_ssa_value(t)
    fused, foreach = ph.OptimizerUpdateOp("adam", w, g, 8), ph.OptimizerUpdateOp("adam-foreach", w, g, 8)
    assert foreach.bytes_read() - fused.bytes_read() == 32 * 1000
    assert foreach.bytes_written() - fused.bytes_written() == 20 * 1000
    assert foreach.state_bytes_total() == fused.state_bytes_total() and foreach.flops() == fused.flops()
    # the fused step's own traffic: fp32 weight, gradient and two moments read, weight and moments written
    assert (fused.bytes_read(), fused.bytes_written()) == (16 * 1000, 12 * 1000)


def test_unknown_runtime_is_refused():
    with pytest.raises(ValueError, match="expected one of ops, eager, inductor, megatron"):
        _Step().form("xla")


# ---- end to end ------------------------------------------------------------------------------


@functools.cache
def _plan(model: str, kernels: str, dtype: str = "bfloat16", *flags: str) -> tuple[dict, str]:
    """phazec's JSON and plan text of a tiny model on one h100 (in-process, cached)."""
    import json

    from phaze.tools.phazec import _parser, compile_model

    args = _parser().parse_args(
        [str(MODELS / model), "--hw", "h100", "--devices", "1", "--placement", "expert:1,1,1", "--global-batch", "2"]
        + ["--micro-batch", "2", "--tp", "1", "--recompute", "none", "--dtype", dtype, "--kernels", kernels, "-q"]
        + list(flags)
    )
    text, failure = compile_model(args, lambda msg: None)
    assert failure is None, failure
    from phaze.plan.plan_output import plan_json  # noqa: F401  (the JSON is what phazec --json writes)
    from phaze_ir.ir import parse_module

    module = parse_module(text)
    plan = json.loads(json.dumps(module.attributes["phaze.plan"].as_dict()))
    return plan, text


def test_sdpa_traces_as_flash_attention_with_no_score_tensor_in_hbm():
    _, text = _plan("tiny_llama_sdpa.py", "eager")
    lines = [line for line in text.splitlines() if "phaze.fused" in line]
    assert lines, "the fused attention ops carry phaze.fused"
    kernels = {
        line.split("phaze.kernel = #phaze.kernel<id = ")[1].split(",")[0] for line in lines if "phaze.kernel" in line
    }
    # two layers, one forward and one backward attention kernel each
    assert len(kernels) == 4
    launches = sum(" launch = 1," in line for line in lines)
    assert launches == 4
    assert all("causal = 1" in line for line in lines if "phaze.kernel" in line)


@pytest.mark.parametrize("model", ["tiny_llama_sdpa.py", "tiny_gpt2.py"])
def test_fewer_kernels_price_a_faster_step_in_less_memory(model):
    plans = {k: _plan(model, k)[0] for k in ("ops", "eager", "inductor")}
    times = {k: p["time_per_batch_s"] for k, p in plans.items()}
    assert times["inductor"] < times["eager"] < times["ops"], times
    memory = {k: p["max_memory_bytes"] for k, p in plans.items()}
    # One micro-batch per step: eager PyTorch makes the gradients during the backward and frees
    # them after the step, so they overlap the activations only in part (the DP's rule is
    # checked by hand and by brute force in rust/phaze-dp/tests); a compiled step also keeps
    # only what the min-cut partitioner keeps (tests/test_partition.py)
    assert memory["inductor"] < memory["eager"] < memory["ops"], memory


def test_autocast_keeps_fp32_weights_and_gradients_and_16_bit_gemms():
    _, text = _plan("tiny_llama_sdpa.py", "eager", "amp-bfloat16")
    matmuls = [line for line in text.splitlines() if "= phaze.matmul" in line]
    assert matmuls and all(line.rstrip().endswith("bf16>") for line in matmuls)
    updates = [line for line in text.splitlines() if "phaze.optimizer_update" in line]
    # fp32 weights are their own master copy: Adam keeps its two fp32 moments only
    assert updates and all("state_bytes 8 " in line and "xf32>" in line for line in updates)
    norms = [line for line in text.splitlines() if "phaze.norm" in line or "phaze.softmax" in line]
    assert any("f32>" in line for line in norms)


def test_autocast_runs_as_cuda_runs_it():
    """CPU autocast keeps pow, softmax, sums and norms in 16 bits; CUDA's lists run them in fp32
    (autocast_mode.cpp), and the trace follows CUDA's."""
    import torch
    import torch.nn.functional as F

    from phaze_ir.frontend.gpu_dispatch import as_on_cuda

    x = torch.ones(4, 8, dtype=torch.bfloat16)
    calls = {
        "pow": lambda: torch.pow(x, 3.0),
        "operator": lambda: x**2,
        "softmax": lambda: F.softmax(x, -1),
        "sum": lambda: x.sum(-1),
        "layer_norm": lambda: F.layer_norm(x, (8,)),
        "exp": lambda: x.exp(),
    }
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert {k: f().dtype for k, f in calls.items()} == dict.fromkeys(calls, torch.bfloat16)  # the CPU's
        with as_on_cuda():
            assert {k: f().dtype for k, f in calls.items()} == dict.fromkeys(calls, torch.float32)
            assert (x @ x.T.float()).dtype == torch.bfloat16  # GEMMs stay in 16 bits
            assert x.sum(-1, dtype=torch.bfloat16).dtype == torch.bfloat16  # an explicit dtype is kept
    with as_on_cuda():  # without autocast nothing changes
        assert torch.pow(x, 3.0).dtype == torch.bfloat16


def test_bert_with_sdpa_and_a_padding_mask_has_no_opaque_op():
    """A mask sends SDPA to the memory-efficient kernel as on a GPU (not the CPU's math path with
    its _safe_softmax); every op is priced."""
    from conftest import compiled

    text = compiled(str(MODELS / "tiny_bert_sdpa.py"), kernels="eager")  # SDPA as a GPU runtime runs it
    assert "phaze.opaque" not in text
    assert 'phaze.fused = "_scaled_dot_product_efficient_attention dropout 0.1"' in text  # BERT's attention dropout
    assert "_safe_softmax" not in text


def test_a_foreach_adam_step_holds_the_fused_steps_state_and_moves_more_bytes():
    """``--optimizer adam-foreach`` (torch's default AdamW step) keeps the fused step's state and
    prices the step's eight kernels: the same compute and memory, a slower optimizer step."""
    from phaze.plan.plan_output import time_breakdown
    from phaze_ir.ir import parse_module

    fused, fused_text = _plan("tiny_llama_sdpa.py", "eager")
    foreach, text = _plan("tiny_llama_sdpa.py", "eager", "bfloat16", "--optimizer", "adam-foreach")
    assert '"adam-foreach"' in text and '"adam-foreach"' not in fused_text
    assert foreach["max_memory_bytes"] == fused["max_memory_bytes"]
    a, b = time_breakdown(parse_module(fused_text)), time_breakdown(parse_module(text))
    assert b["compute_s"] == a["compute_s"]
    # 82 bytes a bf16 parameter against 30 (and eight launches a list): more than twice the time
    assert b["optimizer_s"] > 2 * a["optimizer_s"] > 0
