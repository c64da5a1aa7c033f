"""A hostile or careless config.json is refused in one line naming the key, before transformers
builds the model (session 64's probe round, issue 58: "inputs refused as the loaders intend");
each case is read by the loader alone (no trace: fast)."""

from __future__ import annotations

import json
import os

import pytest

from phaze_ir.errors import PhazeError
from phaze_ir.frontend.loader import load_model_file

LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 256,
    "max_position_embeddings": 128,
}  # fmt: skip
T5 = {"model_type": "t5", "d_model": 64, "d_ff": 128, "num_heads": 4, "d_kv": 16, "num_layers": 2, "vocab_size": 256,
      "n_positions": 128}  # fmt: skip
MIXTRAL = {**LLAMA, "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "num_local_experts": 4}


def _refusal(tmp_path, raw) -> str:
    path = tmp_path / "config.json"
    path.write_text(raw if isinstance(raw, str) else json.dumps(raw))
    with pytest.raises(PhazeError) as info:
        load_model_file(path)
    message = str(info.value)
    assert "\n" not in message and message.isprintable(), message
    return message


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({**T5, "decoder_start_token_id": "x"}, 'decoder_start_token_id = "x": expected a token of the vocabulary'),
        ({**T5, "decoder_start_token_id": 256}, "decoder_start_token_id = 256: expected a token of the vocabulary (0 "
                                                "to 255)"),
        (T5, "no decoder_start_token_id: T5ForConditionalGeneration begins its decoder's inputs"),
        ({**LLAMA, "num_key_value_heads": 0}, "num_key_value_heads = 0: expected a positive integer"),
        ({**LLAMA, "head_dim": 0}, "head_dim = 0: expected a positive integer"),
        ({**LLAMA, "vocab_size": 2**31}, "vocab_size = 2147483648: expected a positive integer of at most"),
        ({**LLAMA, "rms_norm_eps": "1e-6"}, 'rms_norm_eps = "1e-6": expected a positive number'),
        ({**LLAMA, "pad_token_id": -5}, "pad_token_id = -5: expected a token of the vocabulary (0 to 255) or null"),
        ({**MIXTRAL, "num_experts_per_tok": 0}, "num_experts_per_tok = 0: expected a positive integer"),
        ({**LLAMA, "text_config": {"hidden_size": -1}}, "text_config: hidden_size = -1: expected a positive integer"),
        ('{"rope_theta": 1e400, ' + json.dumps(LLAMA)[1:], "rope_theta = Infinity: expected a positive number"),
        ('{"num_hidden_layers": ' + "9" * 5000 + ", " + json.dumps({k: v for k, v in LLAMA.items()
         if k != "num_hidden_layers"})[1:], "invalid JSON: an integer of more than 4300 digits"),
        ({**LLAMA, "architectures": ["Llama\x1b[2JForCausalLM"]}, "architectures names Llama\\x1b[2JForCausalLM, not"),
        ({**LLAMA, "hidden_act": 3}, "field 'hidden_act'"),
    ],
    ids=[
        "t5-decoder-start-string", "t5-decoder-start-past-vocab", "t5-no-decoder-start", "kv-heads-zero",
        "head-dim-zero", "vocab-2^31", "eps-a-string", "pad-negative", "top-k-zero", "nested-size-negative",
        "json-1e400", "json-5000-digit-int", "architectures-escape-code", "activation-an-int",
    ],
)  # fmt: skip
def test_a_hostile_config_is_refused_in_one_line_naming_the_key(tmp_path, raw, says):
    message = _refusal(tmp_path, raw)
    assert message.startswith("config.json: ") and says in message, message


def test_a_config_that_is_a_fifo_a_directory_or_a_symlink_loop_is_refused_unread(tmp_path):
    fifo = tmp_path / "f" / "config.json"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    folder = tmp_path / "d" / "config.json"
    folder.mkdir(parents=True)
    loop = tmp_path / "l" / "config.json"
    loop.parent.mkdir()
    loop.symlink_to(loop)
    for path, says in [(fifo, "is not a regular file"), (folder, "is a directory"), (loop, "symbolic links")]:
        with pytest.raises(PhazeError, match=says) as info:
            load_model_file(path)  # (a FIFO opened to read would wait for a writer)
        assert "\n" not in str(info.value)
