"""A TP width the model's heads cannot take is refused in one line before any trace (issue 58,
"one line per refusal, before the work"): the heads are read from the model built on meta
(its transformers config's num_attention_heads / num_key_value_heads), as the sharding pass
would find them in the traced step after ~10 s (phaze.driver.check_tp_heads)."""

from __future__ import annotations

import json

import pytest
from conftest import MODELS

from phaze.driver import check_tp_heads
from phaze_ir.errors import PhazeError

TINY = str(MODELS / "tiny_llama_sdpa.py")  # 4 heads, 2 key/value heads
LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 96, "intermediate_size": 128,
    "num_attention_heads": 12, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 256,
    "max_position_embeddings": 128,
}  # fmt: skip


def _refused(capsys, args: list[str]) -> str:
    from phaze.tools import phazec

    rc = phazec.main(args)
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


@pytest.mark.parametrize("tp", ["3", "8"])
def test_a_width_that_does_not_divide_the_heads_is_refused_before_the_trace(tmp_path, capsys, no_trace, tp):
    line = _refused(capsys, [TINY, "--hw", "h100", "--tp", tp, "--devices", "8", "--no-cache", "-q"])
    assert line == (
        f"phazec: error: --tp {tp}: width {tp} does not divide the 4 attention heads of tiny-llama-sdpa (its "
        "config's num_attention_heads): expected a width among 1, 2, 4"
    ), line


def test_a_fixed_placement_s_width_is_named_by_the_placement(capsys, no_trace):
    args = [TINY, "--hw", "h100", "--placement", "expert:1,2,3", "--devices", "6", "--no-cache", "-q"]
    assert _refused(capsys, args).startswith("phazec: error: --placement expert:1,2,3: width 3 does not divide the 4")


def test_a_width_neither_dividing_nor_a_multiple_of_the_kv_heads_is_refused(tmp_path, capsys, no_trace):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    args = [str(tmp_path / "config.json"), "--hw", "h100", "--tp", "6", "--devices", "12", "--no-cache", "-q"]
    line = _refused(capsys, args)
    assert "--tp 6: width 6 neither divides nor is a multiple of the 4 key/value heads" in line, line
    assert line.endswith("expected a width among 1, 2, 4, 12"), line


def test_the_rule_is_the_sharding_pass_s():
    check_tp_heads((1, 2, 4, 8), (32, 8), "m", None)  # any width that fits: the sweep skips the others
    check_tp_heads((16,), (32, 8), "m", None)  # a multiple of the key/value heads: they are replicated
    check_tp_heads((3,), None, "m", None)  # heads not known before the trace: left to the pass
    with pytest.raises(
        PhazeError, match=r"^--tp 3,5: width 3 does not divide the 32 attention heads of m .*\(nor can 5\)"
    ):
        check_tp_heads((3, 5), (32, 8), "m", None)


def test_the_heads_are_read_only_from_a_transformers_model():
    from phaze_ir.frontend import load_model_file
    from phaze_ir.frontend.trace import check_model

    assert check_model(load_model_file(TINY)) == (256, (4, 2))
    assert check_model(load_model_file(str(MODELS / "tiny_cnn.py")))[1] is None


def test_the_training_stage_takes_any_width(tmp_path, capsys):
    """No sharding before the sharded stage: its width is not checked."""
    from phaze.tools import phazec

    rc = phazec.main([TINY, "--tp", "3", "--emit", "training", "--no-cache", "-q", "-o", str(tmp_path / "t.mlir")])
    assert rc == 0, capsys.readouterr().err
