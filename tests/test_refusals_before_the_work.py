"""Options that contradict each other in a way known before any trace are refused in one line
before it (issue 58, "one line per refusal, before the work"); each was once refused only after
the whole sweep (~40 s on the tiny Llama), one of them for a reason it did not have."""

from __future__ import annotations

import pytest
from conftest import MODELS

TINY = str(MODELS / "tiny_llama_sdpa.py")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["--fp8-params"],
            "--fp8-params: FP8 primary weights are the FP8 linears' of --dtype fp8, not amp-bfloat16",
        ),
        (
            ["--fp8-params", "--dtype", "bfloat16"],
            "--fp8-params: FP8 primary weights are the FP8 linears' of --dtype fp8, not bfloat16",
        ),
        (
            # (was: after the sweep, "expected --zero 2 or 3" with --zero 3 given: the nearest-fit
            # search had relaxed ZeRO to auto)
            ["--zero", "3", "--dp-shard", "16"],
            "--dp-shard 16: expected a shard group of at most --devices 8",
        ),
    ],
    ids=["fp8-params-default-dtype", "fp8-params-bf16", "dp-shard-over-devices"],
)
def test_refused_in_one_line_before_any_trace(capsys, no_trace, argv, says):
    from phaze.tools import phazec

    rc = phazec.main([TINY, "--hw", "h100", "--devices", "8", "--global-batch", "16", "--no-cache", "-q", *argv])
    err = capsys.readouterr().err
    assert rc == 1 and err.strip() == f"phazec: error: {says}", err


def test_the_nearest_fit_keeps_hsdp_s_zero():
    """sweep.nearest_plan relaxes a fixed --zero to auto, but not under --dp-shard (HSDP needs
    ZeRO 2 or 3): the relaxed try would have been refused for a reason the user's options lack."""
    from phaze.options import Options
    from phaze.search import sweep

    tried = []

    def fits(o):
        tried.append(o.zero)
        return None

    sweep.nearest_plan(Options(hw="h100", devices=8, zero="3", dp_shard=4), 16, fits, lambda _: None)
    assert tried and set(tried) == {"3"}
    tried.clear()
    sweep.nearest_plan(Options(hw="h100", devices=8, zero="3"), 8, fits, lambda _: None)
    assert "auto" in tried


def test_a_t5_config_without_decoder_start_token_id_is_refused_before_the_trace(tmp_path, capsys, no_trace):
    """T5 begins its decoder's inputs with config.decoder_start_token_id (transformers'
    modeling_t5.py ``_shift_right``), which transformers 5's T5Config does not default: the
    model failed inside the trace (an AttributeError quoted from configuration_utils.py)."""
    import json

    from phaze.tools import phazec

    raw = {"model_type": "t5", "d_model": 64, "d_ff": 128, "num_heads": 4, "d_kv": 16, "num_layers": 2,
           "vocab_size": 256, "n_positions": 128}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    rc = phazec.main([str(path), "--hw", "h100", "--devices", "8", "--global-batch", "16", "--no-cache", "-q"])
    err = capsys.readouterr().err
    assert rc == 1 and err.strip() == (
        "phazec: error: config.json: no decoder_start_token_id: T5ForConditionalGeneration begins its decoder's "
        "inputs (the labels shifted right) with it; give it in the file (T5's published configs give 0, their pad "
        "token)"
    ), err


def test_a_seq2seq_config_whose_class_defaults_decoder_start_token_id_is_taken(tmp_path):
    """BART's config class gives decoder_start_token_id a default (2): nothing to refuse."""
    import json

    from phaze_ir.frontend.loader import load_model_file

    raw = {"model_type": "bart", "architectures": ["BartForConditionalGeneration"], "d_model": 32, "vocab_size": 64,
           "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 2, "decoder_attention_heads": 2,
           "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "max_position_embeddings": 32}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    assert load_model_file(path).seq_len == 32
