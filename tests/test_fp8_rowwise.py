"""torchao's rowwise float8 recipe priced as it runs (docs/design.md §5.11.5a): the forward GEMM
on PyTorch's CUTLASS rowwise kernel, the backward GEMMs on cuBLAS with a pass scaling their
output, the column-wise scales read across the slow dimension, and torch's async TP leaving the
rowwise all-gather-matmuls unfused."""

from __future__ import annotations

import dataclasses
import functools
import textwrap
import warnings

import pytest
from conftest import MODELS

from passes.graph_view import step_function
from phaze_ir import dialect as ph
from phaze_ir import keys
from phaze_ir.errors import PhazeWarning

#: LayerNorm, a linear of 256 in and 128 out features, sigmoid, on 512 tokens: torchao's
#: ``LNLinearSigmoid`` (``benchmarks/fp8_linear_shapes.py``), small.
LN_LINEAR = """
import torch
from torch import nn

NAME = "ln-linear-sigmoid"


class LNLinearSigmoid(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(256)
        self.fc = nn.Linear(256, 128, bias=False)

    def forward(self, x):
        return torch.sigmoid(self.fc(self.ln(x))).sum()


def get_model():
    return LNLinearSigmoid()


def get_inputs(micro_batch_size):
    return (torch.zeros(micro_batch_size, 512, 256),)
"""


@pytest.fixture(scope="module")
def ln_linear(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("rowwise") / "ln_linear.py"
    path.write_text(textwrap.dedent(LN_LINEAR))
    return str(path)


@functools.cache
def _module(model: str, *flags: str):
    from phaze.tools.phazec import _parser, compile_model
    from phaze_ir.ir import parse_module

    args = _parser().parse_args(
        [model, "--hw", "h100", "--emit", "latency", "--dtype", "fp8", "-q", "--no-cache", *flags]
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PhazeWarning)
        text, failure = compile_model(args, lambda msg: None)
    assert failure is None, failure
    return parse_module(text)


def _ops(module) -> list:
    return [o for o in step_function(module).body.block.ops if isinstance(o, ph.ComputeOp)]


def _h100():
    from phaze_ir.hardware import load_hardware

    limited = load_hardware("h100")  # without its power limit, which slows an FP8 GEMM a little
    return dataclasses.replace(limited, energy=dataclasses.replace(limited.energy, power_limit_w=None))


def test_a_rowwise_gemm_runs_its_kernel_and_its_scaling_pass():
    """The forward rowwise GEMM (fast accumulation) takes its tensorwise twin's compute time over
    the TOML's fp8_rowwise_gemm_efficiency; a backward one (split accumulation) its twin's time
    plus a memory-bound pass of its bytes and one launch (torchao's ``output *= a_inv * b_inv``)."""
    from passes.algorithms.latency import MatmulDesc, estimate_matmul

    h100 = _h100()
    cal = h100.calibration
    m, n, k = 8192, 4096, 4096
    fp8 = MatmulDesc(batch=1, m=m, n=n, k=k, a_elem=1, b_elem=1, c_elem=2, a_bytes=m * k, b_bytes=k * n)
    tensorwise, rowwise = estimate_matmul(fp8, h100), estimate_matmul(dataclasses.replace(fp8, rowwise=True), h100)
    overhead = cal.kernel_overhead_s
    assert tensorwise.bound == rowwise.bound == "compute"
    assert (tensorwise.split_s - overhead) / (rowwise.split_s - overhead) == pytest.approx(
        cal.fp8_rowwise_gemm_efficiency, rel=1e-12
    )
    assert cal.fp8_rowwise_gemm_efficiency < 1
    split = dataclasses.replace(fp8, split_accumulation=True)
    post = dataclasses.replace(split, rowwise=True, post_scale_bytes=2 * m * n * 2, post_scale_launches=1)
    pass_s = 2 * m * n * 2 / (h100.hbm.bandwidth_Bps * cal.memory_efficiency) + overhead
    assert estimate_matmul(post, h100).split_s == pytest.approx(estimate_matmul(split, h100).split_s + pass_s)


def test_the_rowwise_recipes_gemms_say_how_they_run(ln_linear):
    """The importer marks each ``_scaled_mm`` with rowwise scales (and no other GEMM); the forward
    runs PyTorch's kernel (no pass), the backward's input gradient, read by the LayerNorm's
    gradient, has its scaling fused there under Inductor, the weight gradient (a step output)
    a pass of its own, and without Inductor both run eager's two kernels over an fp32 product."""
    from passes.cost_view import matmul_desc, rowwise_gemm

    seen = {}
    for kernels in ("inductor", "eager"):
        gemms = [
            o
            for o in _ops(_module(ln_linear, "--kernels", kernels, "--fp8-recipe", "rowwise"))
            if isinstance(o, ph.MatmulOp)
        ]
        assert all(o.attributes[keys.FP8_SCALES].data == "rowwise" for o in gemms) and len(gemms) == 3
        seen[kernels] = [(rowwise_gemm(o), o.result.type.get_shape()) for o in gemms]
        for o in gemms:
            d = matmul_desc(o)
            assert d.rowwise and (d.post_scale_launches > 0) == (rowwise_gemm(o) in ("own", "eager"))
    assert seen["inductor"] == [("fwd", (512, 128)), ("fused", (512, 256)), ("own", (128, 256))]
    assert [how for how, _ in seen["eager"]] == ["fwd", "eager", "eager"]
    tensorwise = _ops(_module(ln_linear, "--kernels", "inductor", "--fp8-recipe", "tensorwise"))
    assert not [o for o in tensorwise if keys.FP8_SCALES in o.attributes]


def test_the_column_wise_scales_are_read_across_the_slow_dimension(ln_linear):
    """Under rowwise, the kernels that take an amax across rows as they lie in memory (the
    weight gradient's operands along the tokens, the input gradient's weight along its output
    features) and only they are column kernels, their traffic at column_read_efficiency; the
    forward's weight amax (along a transposed view: its rows) and tensorwise's are not."""
    from passes.cost_view import vector_desc

    ops = _ops(_module(ln_linear, "--kernels", "inductor", "--fp8-recipe", "rowwise"))
    amaxes = [o for o in ops if isinstance(o, ph.ReductionOp) and o.kind.data == "max"]
    column = {
        (o.attributes[keys.PHASE].data, o.inputs[0].type.get_shape())
        for o in amaxes
        if keys.COLUMN_KERNEL in o.attributes
    }
    # the output gradient [512, 128] and the input [512, 256] along the tokens; w.t() [256, 128]
    # along its last dimension, the weight's [128, 256] first
    assert column == {("bwd", (512, 128)), ("bwd", (512, 256)), ("bwd", (256, 128))}
    kernel = {o.attributes[keys.KERNEL].as_dict()["id"] for o in ops if keys.COLUMN_KERNEL in o.attributes}
    assert all(
        keys.COLUMN_KERNEL in o.attributes
        for o in ops
        if keys.KERNEL in o.attributes and o.attributes[keys.KERNEL].as_dict()["id"] in kernel
    )
    moving = [
        o for o in ops if keys.COLUMN_KERNEL in o.attributes and vector_desc(o).read_bytes + vector_desc(o).write_bytes
    ]
    assert moving and all(vector_desc(o).column for o in moving)
    tensorwise = _ops(_module(ln_linear, "--kernels", "inductor", "--fp8-recipe", "tensorwise"))
    assert not [o for o in tensorwise if keys.COLUMN_KERNEL in o.attributes]


def test_a_column_kernel_moves_its_bytes_at_the_column_rate():
    from passes.algorithms.latency import VectorDesc, estimate_chip

    h100 = _h100()
    cal = h100.calibration
    d = VectorDesc(work=1, read_bytes=2**28, write_bytes=2**27)
    plain, column = estimate_chip([d, dataclasses.replace(d, column=True)], h100).split[:, 0]
    overhead = cal.kernel_overhead_s
    assert (plain - overhead) / (column - overhead) == pytest.approx(cal.column_read_efficiency, rel=1e-12)
    assert cal.column_read_efficiency < 1


@functools.cache
def _overlapped(recipe: str) -> list:
    from passes.how_ops_run import overlapped

    module = _module(
        str(MODELS / "tiny_llama_sdpa.py"),
        *("--kernels", "inductor", "--tp", "2", "--micro-batch", "1", "--sequence-parallel", "on"),
        *("--tp-overlap", "on", "--fp8-recipe", recipe),
    )
    return [(o.kind.data, o.attributes[keys.PHASE].data, gemms) for o, _, gemms in overlapped(step_function(module))]


def test_async_tp_leaves_rowwise_all_gather_matmuls_unfused():
    """torch's micro-pipelined TP fuses rowwise matmul-reduce-scatters, not all-gather-matmuls
    (pytorch/pytorch issue 149990): under rowwise no all-gather has a GEMM beside it, and the
    reduce-scatters keep theirs; under tensorwise the forward all-gathers have theirs."""
    from passes.cost_view import rowwise_gemm

    rowwise = _overlapped("rowwise")
    gathers = [g for kind, _, g in rowwise if kind == "all_gather"]
    assert gathers and not any(any(rowwise_gemm(x) for x in g) for g in gathers)
    assert any(any(rowwise_gemm(x) for x in g) for kind, _, g in rowwise if kind == "reduce_scatter")
    tensorwise = _overlapped("tensorwise")
    assert any(g for kind, phase, g in tensorwise if kind == "all_gather" and phase == "fwd")


def _gathers(recipe: str | None) -> list[tuple[str, str]]:
    """(phase, element type of what it moves) of every all-gather of tiny Llama's step at TP 2
    with sequence parallelism (``_overlapped``'s compile, cached), FP8 with ``recipe`` or bf16."""
    module = _module(
        str(MODELS / "tiny_llama_sdpa.py"),
        *("--kernels", "inductor", "--tp", "2", "--micro-batch", "1", "--sequence-parallel", "on"),
        *("--tp-overlap", "on"),
        *(("--fp8-recipe", recipe) if recipe else ("--dtype", "bfloat16")),
    )
    return [
        (o.attributes[keys.PHASE].data, str(o.operands[0].type.element_type))
        for o in step_function(module).body.block.ops
        if isinstance(o, ph.CollectiveOp) and o.kind.data == "all_gather"
    ]


def test_rowwise_gathers_bf16_inputs_once_and_casts_them_whole():
    """torchtitan gives rowwise linears plain TP styles (parallelize_llama.py at 820504e): each
    module's bf16 input, and in the backward its output's gradient, is all-gathered as the
    module is entered and cast whole, so the sequence-parallel all-gathers are bf16 ones, as
    many as without FP8 (q, k and v share one); tensorwise's Float8ColwiseParallel gathers
    float8 (the LM head, never FP8, gathers bf16 in all three)."""
    rowwise, bf16 = _gathers("rowwise"), _gathers(None)
    assert rowwise and {t for _, t in rowwise} == {"bf16"}
    assert sorted(rowwise) == sorted(bf16)
    assert "f8E4M3FN" in {t for phase, t in _gathers("tensorwise") if phase == "fwd"}
