"""The search's settings of a model with many repeated blocks, from the model cut to 3 and to 4
of them (phaze/search/setting.py, docs/design.md §2): equal, field for field and float for
float, to the settings of the whole model traced; and the whole model traced wherever the cut
would not be (blocks that differ, a forward that treats one block apart)."""

from __future__ import annotations

import textwrap

import pytest
from conftest import MODELS

from phaze.options import Options
from phaze.search import setting as st
from phaze_ir.frontend import load_model_file, trace_model
from phaze_ir.frontend.trace import uniform_blocks

_HEAD = """
import torch
from transformers import {cfg}, {cls}

NAME = "{name}"
SEQ_LEN = 16


def get_model():
    return {cls}({cfg}({args}))


def get_inputs(micro_batch_size, seq_len=SEQ_LEN):
    ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
    return {inputs}
"""

_CAUSAL = '{"input_ids": ids, "labels": ids}'

#: Small configurations of the examples' classes, 6 blocks each.
_MODELS = {
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        "vocab_size=256, hidden_size=64, intermediate_size=176, num_hidden_layers=6, num_attention_heads=4,"
        " num_key_value_heads=2, max_position_embeddings=64, attn_implementation='eager'",
        _CAUSAL,
    ),
    "opt": (
        "OPTConfig",
        "OPTForCausalLM",
        "vocab_size=256, hidden_size=64, ffn_dim=256, num_hidden_layers=6, num_attention_heads=4,"
        " max_position_embeddings=64, word_embed_proj_dim=64",
        _CAUSAL,
    ),
    "bert": (
        "BertConfig",
        "BertForMaskedLM",
        "vocab_size=256, hidden_size=64, intermediate_size=256, num_hidden_layers=6, num_attention_heads=4,"
        " max_position_embeddings=64, attn_implementation='eager'",
        _CAUSAL,
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        "vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,"
        " num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,"
        " attn_implementation='eager'",
        _CAUSAL,
    ),
}


def _model_file(tmp_path, name: str) -> str:
    cfg, cls, args, inputs = _MODELS[name]
    path = tmp_path / f"{name}.py"
    path.write_text(_HEAD.format(cfg=cfg, cls=cls, name=f"tiny-{name}", args=args, inputs=inputs))
    return str(path)


def _whole(model: str, micro_batch: int, tps: tuple[int, ...], opts: Options) -> list[st.Setting]:
    from phaze.driver import with_runtime_attention

    # the attention the settings' runtime runs, as prepare_settings loads it (ops: eager)
    spec = with_runtime_attention(load_model_file(model), opts)
    traced = trace_model(spec, micro_batch, opts.seq_len, dtype=opts.dtype)
    assert traced.blocks is None
    return st._settings_of(traced, spec.name, micro_batch, tps, opts)[0]


def _counting_traces(monkeypatch) -> list[int | None]:
    """The ``max_blocks`` of every trace ``prepare_settings`` makes."""
    calls: list[int | None] = []
    real = trace_model

    def counted(*args, **kwargs):
        calls.append(kwargs.get("max_blocks"))
        return real(*args, **kwargs)

    monkeypatch.setattr("phaze_ir.frontend.trace_model", counted)
    return calls


@pytest.mark.parametrize("name", ["gpt2", *_MODELS])
def test_cut_settings_equal_the_whole_models(tmp_path, monkeypatch, name):
    """Every field of every setting (op table, groups, per-layer numbers) equal to the whole
    model's, at micro-batch 1 (another graph: a size-1 dim) and 2, TP 1 and 2; and only the
    cut models traced: at micro-batch 2 the 3-block cut alone (the deepening was shown exact
    at micro-batch 1, and the cut's skeleton is the same)."""
    model = str(MODELS / "tiny_gpt2_deep.py") if name == "gpt2" else _model_file(tmp_path, name)
    for micro_batch in (1, 2):
        calls = _counting_traces(monkeypatch)
        fast = st.prepare_settings(model, micro_batch, (1, 2), Options())
        assert calls == ([3, 4] if micro_batch == 1 else [3])
        monkeypatch.undo()
        whole = _whole(model, micro_batch, (1, 2), Options())
        assert [s.tp for s in fast] == [s.tp for s in whole] == [1, 2]
        for a, b in zip(fast, whole):
            assert st._same(a, b), (name, micro_batch, a.tp)
            assert a.blocks is not None and a.blocks[1] >= 6


def test_sequence_parallel_settings_equal_the_whole_models(monkeypatch):
    """With sequence parallelism too (the norms' weight-gradient all-reduces are in the layer
    whose backward made the gradient, so the head's optimizer group does not grow with the
    blocks)."""
    model = str(MODELS / "tiny_gpt2_deep.py")
    opts = Options(sequence_parallel="auto")
    calls = _counting_traces(monkeypatch)
    fast = st.prepare_settings(model, 2, (2,), opts)
    assert calls == [3, 4]
    monkeypatch.undo()
    whole = _whole(model, 2, (2,), opts)
    assert [(s.tp, s.sequence_parallel) for s in fast] == [(2, False), (2, True)]
    assert all(st._same(a, b) for a, b in zip(fast, whole))


_SPECIAL = """
import torch

NAME = "{name}"


class Block(torch.nn.Module):
    def __init__(self, i, window):
        super().__init__()
        self.fc = torch.nn.Linear(32, 32)
        self.layer_idx = i
        self.window = window

    def forward(self, x):
        return x + torch.relu(self.fc(x))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(i, {window}) for i in range({blocks}))
        self.head = torch.nn.Linear(32, 1)

    def forward(self, x):
        for i, block in enumerate(self.blocks):
            x = block(x)
            if i == {special}:
                x = x * 2 + 1
        return self.head(x).sum()


def get_model():
    return Model()


def get_inputs(micro_batch_size, seq_len=None):
    return (torch.zeros(micro_batch_size, 32),)


def loss_fn(out):
    return out
"""


def _special(tmp_path, name: str, window: str, special: int, blocks: int = 6) -> str:
    """A model of ``blocks`` alike blocks whose forward does something after block ``special``."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(_SPECIAL.format(name=name, window=window, special=special, blocks=blocks)))
    return str(path)


def test_uniform_blocks_lets_an_index_differ_and_nothing_else(tmp_path):
    """A block's own index (``layer_idx``) may differ; any other attribute (a sliding window on
    some layers only) makes the blocks different, and the model is traced whole."""
    import torch

    same = load_model_file(_special(tmp_path, "same", "8", -1))
    windowed = load_model_file(_special(tmp_path, "windowed", "8 if i % 2 else None", -1))
    with torch.device("meta"):
        found = uniform_blocks(same.get_model())
        assert found is not None and found[1:] == ("blocks", 6)
        assert uniform_blocks(windowed.get_model()) is None
    assert trace_model(same, 2, max_blocks=3).blocks == (3, 6)
    assert trace_model(windowed, 2, max_blocks=3).blocks is None
    assert trace_model(same, 2, max_blocks=6).blocks is None  # nothing to cut


def test_a_block_treated_apart_is_traced_whole(tmp_path, monkeypatch):
    """A forward that does something after block 3 only: the 3-block settings deepened to 4
    blocks are not the 4-block ones, so the whole model is traced, and its settings are
    right; after block 1 (the middle of the cut model) the 4-block check catches it too."""
    for special in (3, 1):
        model = _special(tmp_path, f"apart{special}", "8", special)
        calls = _counting_traces(monkeypatch)
        got = st.prepare_settings(model, 2, (1,), Options())
        assert calls == [3, 4, None]
        monkeypatch.undo()
        whole = _whole(model, 2, (1,), Options())
        assert len(got) == 1 and st._same(got[0], whole[0])


def test_four_blocks_are_traced_whole(monkeypatch):
    """A model of 4 blocks (examples/mlp.py) has no middle block to repeat beyond the 4-block
    check: its 3-block cut is not used, the whole model is traced (the first fresh-clone CI of
    the cut priced the MLP from 3 of its 4 blocks: the search's figure and its plan's parted)."""
    from conftest import EXAMPLES

    model = str(EXAMPLES / "mlp.py")
    calls = _counting_traces(monkeypatch)
    got = st.prepare_settings(model, 8, (1,), Options())
    assert calls == [3, None]
    monkeypatch.undo()
    whole = _whole(model, 8, (1,), Options())
    assert len(got) == 1 and st._same(got[0], whole[0]) and got[0].blocks == (1, 4)


def test_deepened_refuses_a_setting_it_cannot_deepen():
    s = st.prepare_settings(str(MODELS / "tiny_gpt2.py"), 1, (1,), Options())[0]
    with pytest.raises(ValueError, match="cannot deepen"):
        st.deepened(s, 8)
