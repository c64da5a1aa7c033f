"""A Hugging Face ``config.json`` as phazec's model (``phaze_ir/frontend/loader.py``,
``load_hf_config``): the same IR as the example file that spells out the same config, and every
bad file one line naming the file and what is wrong, before transformers builds anything."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import EXAMPLES, compiled, run_main

from phaze_ir.errors import PhazeError
from phaze_ir.frontend import load_model_file


def _example_config(example: str) -> dict:
    """What ``save_pretrained`` writes as config.json for the example's ``config()``: its
    ``to_diff_dict`` (the fields that differ from the class's defaults, and the model type)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"phaze_test_{example}", EXAMPLES / f"{example}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.config().to_diff_dict(), module.NAME


@pytest.mark.parametrize(
    "example, layers, architectures",
    [
        # A causal LM that names its class, as published configs do, with the dtype they carry
        # (which must not change the model phaze builds: the trace casts to --dtype).
        ("llama2_7b", "num_hidden_layers=32", ["LlamaForCausalLM"]),
        # No architectures: an encoder is built as the masked LM it is pre-trained as (not
        # BertLMHeadModel, which transformers' causal-LM mapping also has for "bert").
        ("bert_large", "num_hidden_layers=24", None),
    ],
)
def test_a_config_json_gives_the_ir_of_its_example_file(tmp_path, example, layers, architectures):
    """Byte for byte, cut to 2 layers so that it is fast: a config.json of the example's config
    and the example file itself (its sequence length is max_position_embeddings, as the
    config.json's default is)."""
    config, name = _example_config(example)
    config["num_hidden_layers"] = 2
    if architectures:
        config["architectures"] = architectures
        config["torch_dtype"] = "bfloat16"
    # Named as the example's NAME: the module records the model's name.
    json_path = tmp_path / f"{name}.json"
    json_path.write_text(json.dumps(config, indent=2))
    source = (EXAMPLES / f"{example}.py").read_text()
    assert source.count(layers) == 1
    py_path = tmp_path / f"{example}.py"
    py_path.write_text(source.replace(layers, "num_hidden_layers=2"))

    from_json = compiled(str(json_path), "training")
    assert f'phaze.model = "{name}"' in from_json
    assert from_json == compiled(str(py_path), "training")


def test_a_mixtral_config_json_at_a_given_seq_len_gives_the_ir_of_its_example(tmp_path):
    """A mixture of experts, at --seq-len 512 (the config's default would be its 32768
    positions, the example's SEQ_LEN 4096: --seq-len makes them the same run)."""
    from phaze.tools.phazec import _parser, compile_model

    config, name = _example_config("mixtral_8x7b")
    config.update(num_hidden_layers=2, architectures=["MixtralForCausalLM"])
    json_path = tmp_path / f"{name}.json"
    json_path.write_text(json.dumps(config))
    source = (EXAMPLES / "mixtral_8x7b.py").read_text()
    assert source.count("MixtralForCausalLM(config())") == 1
    py_path = tmp_path / "mixtral_8x7b.py"
    py_path.write_text(source.replace("MixtralForCausalLM(config())", "MixtralForCausalLM(config(2))"))

    def ir(path):
        args = _parser().parse_args([str(path), "--emit", "training", "--micro-batch", "1", "--seq-len", "512", "-q"])
        text, failure = compile_model(args, lambda msg: None)
        assert failure is None, failure
        return text

    from_json = ir(json_path)
    assert "phaze.seq_len = 512 : i64" in from_json and "experts = 8," in from_json  # the MoE blocks
    assert from_json == ir(py_path)


def test_the_published_qwen2_example_loads():
    """examples/hf/qwen2-7b/config.json: named after its directory, its sequence length the
    config's, its class the one ``architectures`` names, 7.6 B parameters (Qwen2-7B's)."""
    import torch

    spec = load_model_file(EXAMPLES / "hf" / "qwen2-7b" / "config.json")
    assert (spec.name, spec.seq_len, spec.sources) == ("qwen2-7b", 131072, ())
    with torch.device("meta"):
        model = spec.get_model()
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config._attn_implementation == "sdpa"  # Qwen2 has it: as PyTorch runs it
    assert sum(p.numel() for p in model.parameters()) == 7_615_616_512
    args, kwargs = spec.inputs(2, 16)
    assert args == () and kwargs["input_ids"].shape == (2, 16) and kwargs["labels"] is kwargs["input_ids"]


LLAMA = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}


@pytest.mark.parametrize(
    "content, fragment",
    [
        ('{"model_type": "llama",}', "bad.json:1:24: invalid JSON: Expecting property name"),
        ('{"model_type": NaN}', "bad.json: invalid JSON: NaN is not a JSON number"),
        ("[1, 2]", "bad.json: expected a JSON object (a Hugging Face config), found a list"),
        ("[" * 100_000, "bad.json: invalid JSON: nested too deeply"),
        ('{"vocab_size": ' + "9" * 5000 + "}", "bad.json: invalid JSON: an integer of more than"),
        ('{"hidden_size": 64}', 'bad.json: no "model_type"'),
        ('{"model_type": 7}', "bad.json: model_type = 7: expected a string"),
        ('{"model_type": "lama"}', 'bad.json: unknown model_type "lama": transformers'),
        (
            '{"model_type": "chatglm", "auto_map": {"AutoModel": "modeling_chatglm.ChatGLMModel"}}',
            "needs trust_remote_code",
        ),
        (
            json.dumps({**LLAMA, "architectures": ["MyLlama"], "auto_map": {"AutoModelForCausalLM": "m.MyLlama"}}),
            "bad.json: architectures names MyLlama, the model's own code (auto_map), which needs trust_remote_code",
        ),
        (
            json.dumps({**LLAMA, "architectures": ["LlamaForSequenceClassification"]}),
            "bad.json: architectures names LlamaForSequenceClassification, not a causal, masked or seq2seq",
        ),
        ('{"model_type": "vit", "hidden_size": 8}', "bad.json: model_type 'vit' has no language-model class"),
        (
            '{"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}',
            "bad.json: missing vocab_size, num_hidden_layers (without them transformers would build its default",
        ),
        # GPT-2's names (n_layer...) are the fields' aliases: n_embd missing is hidden_size missing.
        ('{"model_type": "gpt2", "vocab_size": 8, "n_layer": 1, "n_head": 2}', "bad.json: missing hidden_size"),
        (
            json.dumps({**LLAMA, "num_hidden_layers": 10**9}),
            "num_hidden_layers = 1000000000: expected a positive integer of at most",
        ),
        (json.dumps({**LLAMA, "hidden_size": "64"}), 'bad.json: hidden_size = "64": expected a positive integer'),
        (json.dumps({**LLAMA, "vocab_size": 0}), "bad.json: vocab_size = 0: expected a positive integer"),
        (json.dumps({**LLAMA, "hidden_size": True}), "bad.json: hidden_size = true: expected a positive integer"),
        (
            json.dumps({**LLAMA, "text_config": {"max_position_embeddings": 1 << 40}}),
            "bad.json: text_config: max_position_embeddings = 1099511627776",
        ),
        (
            json.dumps({**LLAMA, "num_key_value_heads": 3}),
            "num_attention_heads 4 is not a multiple of num_key_value_heads 3",
        ),
        (json.dumps({**LLAMA, "hidden_size": 66}), "bad.json: transformers refuses the config:"),
    ],
)
def test_a_bad_config_is_one_line_naming_the_file(tmp_path, content, fragment):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(PhazeError) as e:
        load_model_file(path)
    message = str(e.value)
    assert fragment in message
    assert "\n" not in message and len(message) < 400


def test_a_file_that_is_no_config_is_refused_unread(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * ((1 << 20) + 1))
    with pytest.raises(PhazeError, match=r"big\.json: holds 1 MiB, more than the 1 MiB a Hugging Face config\.json"):
        load_model_file(big)
    with pytest.raises(PhazeError, match=r"nope\.json: no such file"):
        load_model_file(tmp_path / "nope.json")
    with pytest.raises(PhazeError, match="bad.json: invalid JSON: not UTF-8 text"):
        (tmp_path / "bad.json").write_bytes(b'{"model_type": "\xff"}')
        load_model_file(tmp_path / "bad.json")


def test_no_sequence_length_asks_for_seq_len(tmp_path):
    """A config without max_position_embeddings (T5's relative positions): the length must come
    from --seq-len, and saying so is the inputs' error, not a crash."""
    path = tmp_path / "t5.json"
    raw = {"model_type": "t5", "vocab_size": 64, "d_model": 16, "num_layers": 1, "num_heads": 2}
    path.write_text(json.dumps({**raw, "decoder_start_token_id": 0}))
    spec = load_model_file(path)
    assert spec.seq_len is None
    with pytest.raises(PhazeError, match="t5.json: the config gives no max_position_embeddings: give --seq-len"):
        spec.inputs(1)
    assert spec.inputs(1, 8)[1]["input_ids"].shape == (1, 8)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX paths")
def test_phazec_says_what_is_wrong_with_a_config_in_one_line(tmp_path):
    """Through phazec as a user runs it: its error line, exit status 1, no traceback."""
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "hidden_size": 64}\n')
    r = run_main("phazec", str(path), "--emit", "ir", "-q")
    assert r.returncode == 1, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("phazec: error: config.json: missing vocab_size"), r.stderr
