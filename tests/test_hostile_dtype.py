"""The third hostile pass (issue 58 item 6): ``--dtype fp8`` on a model with no linear that
Transformer Engine would run in FP8 (a CNN: its GEMMs are convolutions) changes nothing, and
says so in one warning instead of pricing bf16 silently."""

from __future__ import annotations

import pytest
from conftest import MODELS, run_main

WORDS = "the model has no linear Transformer Engine runs in FP8"


def test_fp8_that_cannot_apply_is_said_in_one_warning(tmp_path):
    r = run_main(
        "phazec", str(MODELS / "tiny_cnn.py"), "--hw", "h100", "--devices", "2", "--global-batch", "8",
        "--dtype", "fp8", "-o", str(tmp_path / "plan.mlir"),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if WORDS in line]
    assert len(said) == 1, r.stderr
    assert said[0].startswith("phazec: warning: --dtype fp8: ") and "priced in bf16" in said[0]


def test_fp8_linears_of_a_transformer_are_found():
    """The rule the warning applies: tiny GPT-2's linears (Conv1D) are TE's FP8 linears."""
    import torch

    from phaze_ir.frontend.float8_linear import fp8_linears
    from phaze_ir.frontend.loader import load_model_file

    spec = load_model_file(MODELS / "tiny_gpt2.py")
    with torch.device("meta"):
        model = spec.get_model()
    assert fp8_linears(model)
    cnn = load_model_file(MODELS / "tiny_cnn.py")
    with torch.device("meta"):
        assert fp8_linears(cnn.get_model()) == []


def _volta(tmp_path):
    """The a100's file as a Volta GPU (compute capability 7.0: no bf16 tensor cores)."""
    from phaze_ir.hardware import preset_path

    text = preset_path("a100").read_text()
    assert "compute_capability = 8.0" in text
    volta = tmp_path / "volta.toml"
    volta.write_text(text.replace("compute_capability = 8.0", "compute_capability = 7.0"))
    return volta


BF16_WORDS = "(compute capability 7.0) has no bf16 tensor cores (CUDA GPUs have them from 8.0, Ampere)"


def test_bf16_on_a_gpu_without_bf16_tensor_cores_is_refused_in_one_line(tmp_path):
    volta = _volta(tmp_path)
    flags = ["--hw", str(volta), "--devices", "1", "--global-batch", "8", "--micro-batch", "8", "--tp", "1", "-q"]
    for dtype, instead in (("amp-bfloat16", "amp-float16"), ("bfloat16", "float16")):
        r = run_main("phazec", str(MODELS / "tiny_gpt2.py"), *flags, "--dtype", dtype, "-o", str(tmp_path / "p.mlir"))
        assert r.returncode == 1
        (line,) = r.stderr.strip().splitlines()
        assert line == f"phazec: error: --dtype {dtype}: a100 {BF16_WORDS}; torch emulates bf16 there, at a rate " + (
            f"phaze does not price: give --dtype {instead}"
        )


def test_bf16_problem_names_only_what_cannot_run(tmp_path):
    """The rule the refusal applies: fp16 on the Volta, bf16 on an Ampere or a Hopper, and bf16 on a
    chip with no compute capability (the paper's TPU-like chips take bf16) all run."""
    import phaze
    from phaze.driver import bf16_problem
    from phaze_ir.errors import PhazeError
    from phaze_ir.hardware import load_hardware

    volta = load_hardware(str(_volta(tmp_path)))
    assert BF16_WORDS in (bf16_problem("amp-bfloat16", volta) or "")
    for dtype in ("amp-float16", "float16", "fp8", "float32"):
        assert bf16_problem(dtype, volta) is None
    for chip in ("a100", "h100", "tpuv4"):
        assert bf16_problem("amp-bfloat16", load_hardware(chip)) is None
    # the library says the same line, before any work
    with pytest.raises(PhazeError, match=r"^--dtype amp-bfloat16: a100 \(compute capability 7\.0\) has no bf16"):
        phaze.compile(str(MODELS / "tiny_gpt2.py"), hw=str(_volta(tmp_path)), devices=1, global_batch=8,
                      dtype="amp-bfloat16")  # fmt: skip


def test_fp8_on_a_chip_without_fp8_tensor_cores_is_refused_in_one_line(tmp_path):
    """The a100 has no FP8 tensor cores: ``--dtype fp8`` is one line, before any tracing."""
    r = run_main("phazec", str(MODELS / "tiny_gpt2.py"), "--hw", "a100", "--devices", "1", "--global-batch", "8",
                 "--dtype", "fp8", "-q", "-o", str(tmp_path / "p.mlir"))  # fmt: skip
    assert r.returncode == 1
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("phazec: error: --dtype fp8: a100 has no FP8 GEMM rate")
