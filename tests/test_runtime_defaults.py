"""The defaults a practitioner would choose (issue 57): on a CUDA GPU the runtime run when nothing
is said (phaze.driver.runtime_defaults), the paper's settings on its chips and in the search; the
attention each runtime runs (phaze.driver.with_runtime_attention)."""

from __future__ import annotations

import pytest
from conftest import EXAMPLES

from phaze import api
from phaze.driver import runtime_defaults, with_runtime_attention
from phaze.options import Options
from phaze.tools import phazec
from phaze_ir.frontend import load_model_file

GPU = {
    "kernels": "eager",
    "dtype": "amp-bfloat16",
    "zero": "auto",
    "sequence_parallel": "auto",
    "pipeline_schedule": "auto",
    "dp_overlap": True,
    "selective_recompute": "op",
}


@pytest.mark.parametrize("hw", ["h100", "a100", "h100_hbm2e", "a100_40gb"])
def test_a_gpu_defaults_to_eager_bf16_autocast_and_auto(hw):
    assert runtime_defaults(hw) == GPU


@pytest.mark.parametrize("hw", ["tpuv4", "tpuv4_torus"])
def test_the_papers_chips_keep_the_papers_settings(hw):
    assert runtime_defaults(hw) == {}


def test_an_export_target_sets_the_kernels_it_launches():
    megatron = runtime_defaults("h100", ("megatron",))
    assert (megatron["kernels"], megatron["dp_overlap"], megatron["selective_recompute"]) == (
        "megatron",
        False,
        "attention",
    )
    assert runtime_defaults("h100", ("torchtitan",)) == GPU
    assert runtime_defaults("h100", ("torchtitan", "megatron"))["kernels"] == "eager"  # the first's


def test_a_gpu_before_ampere_gets_fp16_autocast(tmp_path):
    from phaze_ir.hardware import preset_path

    text = preset_path("a100").read_text()
    assert "compute_capability = 8.0" in text
    volta = tmp_path / "volta.toml"
    volta.write_text(text.replace("compute_capability = 8.0", "compute_capability = 7.0"))
    assert runtime_defaults(str(volta))["dtype"] == "amp-float16"


def _opts(*argv: str) -> Options:
    return phazec.options(phazec._parser().parse_args([str(EXAMPLES / "mlp.py"), *argv]))


def test_phazec_fills_only_what_is_not_given():
    o = _opts("--hw", "h100")
    assert {k: getattr(o, k) for k in GPU} == GPU
    o = _opts("--hw", "h100", "--kernels", "ops", "--dtype", "float16", "--zero", "0", "--no-dp-overlap")
    assert (o.kernels, o.dtype, o.zero, o.dp_overlap, o.sequence_parallel) == ("ops", "float16", "0", False, "auto")
    o = _opts("--hw", "h100", "--export", "megatron", "m.args")
    assert (o.kernels, o.dp_overlap) == ("megatron", False)
    # the defaults that follow the runtime follow the kernels asked, not the export's
    o = _opts("--hw", "h100", "--kernels", "eager", "--export", "megatron", "m.args")
    assert (o.kernels, o.dp_overlap, o.selective_recompute) == ("eager", True, "op")
    o = _opts("--hw", "h100", "--kernels", "megatron")
    assert (o.kernels, o.dp_overlap, o.selective_recompute) == ("megatron", False, "attention")
    # Megatron-LM's --bf16, not autocast: the module in bf16, fp32 main params in the optimizer
    assert o.dtype == "bfloat16" and _opts("--hw", "h100", "--kernels", "megatron", "--dtype", "fp8").dtype == "fp8"


def test_the_search_and_the_papers_chips_keep_options_defaults():
    for o in (_opts(), _opts("--hw", "tpuv4"), _opts("--emit", "latency")):
        assert (o.kernels, o.dtype, o.zero, o.sequence_parallel, o.pipeline_schedule, o.dp_overlap) == (
            Options.kernels,
            Options.dtype,
            Options.zero,
            Options.sequence_parallel,
            Options.pipeline_schedule,
            Options.dp_overlap,
        )
        assert (Options.kernels, Options.dtype, Options.zero) == ("ops", "float16", "0")


def test_the_api_has_phazecs_defaults():
    o = api.options("h100")
    assert {k: getattr(o, k) for k in GPU} == GPU
    assert api.options("h100", kernels="ops", dp_overlap=False).kernels == "ops"
    assert api.options("tpuv4").kernels == "ops"
    assert api.options("h100", kernels="megatron").dp_overlap is False


def _attention(spec) -> str:
    import torch

    with torch.device("meta"):
        return spec.get_model().config._attn_implementation


@pytest.mark.parametrize("name", ["llama3_8b", "gpt2_xl", "bert_large", "opt_350m", "mixtral_8x7b"])
def test_examples_build_sdpa_and_ops_runs_it_eager(name):
    spec = load_model_file(EXAMPLES / f"{name}.py")
    assert _attention(spec) == "sdpa"
    assert _attention(with_runtime_attention(spec, Options(kernels="eager"))) == "sdpa"
    assert _attention(with_runtime_attention(spec, Options(kernels="ops"))) == "eager"
    # context parallelism runs ring flash attention, whatever the kernels
    assert _attention(with_runtime_attention(spec, Options(kernels="ops", context_parallel="2"))) == "sdpa"


def test_config_json_gets_sdpa_where_the_architecture_has_it():
    for name in ("qwen2-7b", "mistral-7b"):
        assert _attention(load_model_file(EXAMPLES / "hf" / name / "config.json")) == "sdpa"
