"""One trace per setting where the deepening was shown exact (phaze/search/setting.py,
docs/design.md §2): the model cut to 3 and to 4 blocks is checked at the first micro-batch of a
question in a process; a later micro-batch whose 3-block settings have the same skeleton is
deepened from its one trace, with the settings the two traces would give (bit for bit); one
whose blocks a shape makes differ is checked again, and traced whole where the check fails."""

from __future__ import annotations

import textwrap

import pytest
from conftest import MODELS
from test_cut_trace import _counting_traces, _model_file, _whole

from phaze.options import Options
from phaze.search import setting as st
from phaze.search.settings_beside import _answer_for
from phaze.search.sweep import UNSHARDABLE


def _checked_each_time(model: str, micro_batch: int, tps: tuple[int, ...], opts: Options) -> list[st.Setting]:
    """The settings as every micro-batch was prepared before: both cut traces checked."""
    st._SHOWN.clear()
    return st.prepare_settings(model, micro_batch, tps, opts)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_later_micro_batches_take_one_trace_and_the_same_settings(tmp_path, monkeypatch, name):
    """Micro-batches 1 (a size-1 dim: another graph) and 2 of a tiny GPT-2 and Llama, TP 1
    and 2 with and without sequence parallelism: the check at the first, one trace at the
    others, every setting equal (every field, floats bit for bit) to the one checked apart."""
    model = str(MODELS / "tiny_gpt2_deep.py") if name == "gpt2" else _model_file(tmp_path, name)
    opts = Options(sequence_parallel="auto")
    got = {}
    calls = _counting_traces(monkeypatch)
    for micro_batch in (1, 2):
        got[micro_batch] = st.prepare_settings(model, micro_batch, (1, 2), opts)
    assert calls == [3, 4, 3]
    monkeypatch.undo()
    for micro_batch, fast in got.items():
        slow = _checked_each_time(model, micro_batch, (1, 2), opts)
        assert [(s.tp, s.sequence_parallel) for s in fast] == [(1, False), (2, False), (2, True)]
        assert len(fast) == len(slow) and all(st._same(a, b) for a, b in zip(fast, slow)), micro_batch
        assert all(s.blocks is not None and s.blocks[1] >= 6 for s in fast)


def test_another_question_is_checked_again(monkeypatch):
    """The check holds for its question: other options (here the sequence length) check again."""
    model = str(MODELS / "tiny_gpt2_deep.py")
    calls = _counting_traces(monkeypatch)
    st.prepare_settings(model, 1, (1,), Options())
    st.prepare_settings(model, 2, (1,), Options(seq_len=16))
    st.prepare_settings(model, 4, (1,), Options(seq_len=16))
    assert calls == [3, 4, 3, 4, 3]


def test_every_context_parallel_degree_past_1_shares_one_check(tmp_path, monkeypatch):
    """CP 2, 4 and 8 of a tiny Llama (fused attention priced as rings of c steps), TP 1 and 2
    with and without sequence parallelism, asked as the ``--hw`` sweep asks each degree: the 3-
    and 4-block check at the first degree past 1, one trace at the others (a degree changes
    only shapes, S/c tokens a sample), every setting equal (every field, floats bit for bit) to
    the one checked apart; CP 1 (no rings) is checked on its own."""
    model = _model_file(tmp_path, "llama")
    at = {c: Options(sequence_parallel="auto", seq_len=32, devices=8, context_parallel=str(c)) for c in (2, 4, 8, 1)}

    def prepared(c: int) -> list[st.Setting]:
        return st.prepare_points(model, 1, (1, 2), at[c])[0]

    st._SHOWN.clear()
    calls = _counting_traces(monkeypatch)
    got = {c: prepared(c) for c in at}
    assert calls == [3, 4, 3, 3, 3, 4]
    monkeypatch.undo()
    for c, fast in got.items():
        st._SHOWN.clear()
        slow = prepared(c)  # checked apart: both cut traces
        assert [(s.tp, s.sequence_parallel, s.cp) for s in fast] == [(1, False, c), (2, False, c), (2, True, c)]
        assert all((len(s.kernels) > 0) == (c > 1) for s in fast)
        assert len(fast) == len(slow) and all(st._same(a, b) for a, b in zip(fast, slow)), c


_BY_BATCH = """
import torch

NAME = "{name}"


class Block(torch.nn.Module):
    def __init__(self, i):
        super().__init__()
        self.fc = torch.nn.Linear(32, 32)
        self.layer_idx = i

    def forward(self, x):
        y = x + torch.relu(self.fc(x))
        if self.layer_idx % 2 and x.shape[0] > 1:  # odd blocks do more, from micro-batch 2 on
            y = y * 2 + 1
        return y


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(i) for i in range(6))
        self.head = torch.nn.Linear(32, 1)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x).sum()


def get_model():
    return Model()


def get_inputs(micro_batch_size, seq_len=None):
    return (torch.zeros(micro_batch_size, 32),)


def loss_fn(out):
    return out
"""


def test_blocks_a_shape_makes_differ_are_checked_again_and_traced_whole(tmp_path, monkeypatch):
    """Blocks alike at micro-batch 1 (the check holds: deepened) whose odd ones do more from
    micro-batch 2 on: the 3-block cut's skeleton differs, so both cut traces are checked again,
    disagree, and the model is traced whole, its settings right."""
    path = tmp_path / "by_batch.py"
    path.write_text(textwrap.dedent(_BY_BATCH.format(name="by-batch")))
    model = str(path)
    calls = _counting_traces(monkeypatch)
    one = st.prepare_settings(model, 1, (1,), Options())
    assert calls == [3, 4] and one[0].blocks == (0, 6)
    two = st.prepare_settings(model, 2, (1,), Options())
    assert calls == [3, 4, 3, 4, None]
    monkeypatch.undo()
    assert st._same(one[0], _whole(model, 1, (1,), Options())[0])
    assert st._same(two[0], _whole(model, 2, (1,), Options())[0])


def test_the_skeleton_tells_blocks_that_differ(tmp_path):
    """The 3-block cut's skeleton at micro-batch 1 and 2: the same for blocks alike at both,
    another where a shape made the odd blocks do more; the bytes are not in it."""
    from phaze.driver import with_runtime_attention
    from phaze_ir.frontend import load_model_file, trace_model

    path = tmp_path / "by_batch.py"
    path.write_text(textwrap.dedent(_BY_BATCH.format(name="by-batch")))

    def skeletons(model: str) -> list[str]:
        spec = with_runtime_attention(load_model_file(model), Options())
        out = []
        for b in (1, 2):
            (s,), _ = st._settings_of(trace_model(spec, b, None, max_blocks=3), spec.name, b, (1,), Options())
            out.append(st._skeleton(s))
        return out

    alike = skeletons(str(MODELS / "tiny_gpt2_deep.py"))
    assert alike[0] == alike[1]
    differ = skeletons(str(path))
    assert differ[0] != differ[1]


def _setting_at(tp: int) -> st.Setting:
    (s,) = st.prepare_settings(str(MODELS / "tiny_gpt2.py"), 1, (tp,), Options())
    return s


def test_a_childs_answer_with_widths_found_unshardable_is_taken_without_them():
    """A child asked widths 1, 2 and 8 whose 8 the first micro-batch found unshardable: its
    answer is the sweep's for widths 1 and 2, its refusal of 8 left out; not when it has a
    setting at 8, refused 8 for another reason, or was asked another micro-batch or options."""
    one, two = _setting_at(1), _setting_at(2)
    opts = Options()
    refused = (8, False, f"{UNSHARDABLE}8 does not divide the 4 attention heads")
    asked = (2, (1, 2, 8), opts)
    got = ([one, two], [refused], "m")
    assert _answer_for((2, (1, 2), opts), asked, got) == ([one, two], [], "m")
    assert _answer_for((2, (1, 2, 8), opts), asked, got) == got
    assert _answer_for((2, (1,), opts), asked, got) is None  # 2 has a setting
    other = (8, False, "phaze-shard-tensor-parallel: something else")
    assert _answer_for((2, (1, 2), opts), asked, ([one, two], [other], "m")) is None
    assert _answer_for((4, (1, 2), opts), asked, got) is None
    assert _answer_for((2, (1, 2), Options(seq_len=16)), asked, got) is None
    assert _answer_for((2, (1, 2, 4), opts), asked, got) is None  # a width it was not asked


def test_a_childs_warnings_are_said_by_the_sweep_once():
    """A child's answer comes with the warnings it was told: the sweep says them when it takes
    the answer, once (the registry of the module that said them), through its own filters; a
    warning from a file no loaded module has leaves the question to the sweep itself."""
    import multiprocessing
    import warnings

    from phaze.search import settings_beside as sb
    from phaze_ir.warning import PhazeWarning

    opts = Options()
    job = (2, (1,), opts)

    def beside_told(told: list) -> sb.SettingsBeside:
        beside = sb.SettingsBeside()
        for index in (1, 2):
            answer, sent = multiprocessing.Pipe(duplex=False)
            sent.send((([], [], "m"), told, frozenset()))
            sent.close()
            beside._asked[index] = (job, answer)
        return beside

    beside = beside_told([("sequence length 9 is beyond the model's", PhazeWarning, st.__file__, 7)])
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("default")
        for index in (1, 2):
            assert beside.compute(index, job)("m", 2, (1,), opts) == ([], [], "m")
    assert [(str(w.message), w.category, w.filename) for w in said] == [
        ("sequence length 9 is beyond the model's", PhazeWarning, st.__file__)
    ]
    beside = beside_told([("from nowhere", PhazeWarning, "/nowhere/at/all.py", 1)])
    assert beside.compute(1, job) is st.prepare_points
    beside.cancel()


def test_the_sweep_takes_the_skeletons_a_childs_check_accepted(tmp_path, monkeypatch):
    """A child's answer comes with the skeletons its 4-block check accepted for its job's
    question (here CP 2 of a tiny Llama, as the child's ``prepare_points`` leaves them): the
    sweep takes them with the answer, and its own later job of that question (CP 4) takes one
    trace, with the settings the two traces give; without them it checks again."""
    import multiprocessing

    from phaze.search import settings_beside as sb

    model = _model_file(tmp_path, "llama")
    at = {c: Options(sequence_parallel="auto", seq_len=32, devices=8, context_parallel=str(c)) for c in (2, 4)}
    st._SHOWN.clear()
    st.prepare_points(model, 1, (1, 2), at[2])  # the child's job, checked with both cut traces
    skeletons = st.skeletons_shown(model, at[2])
    assert skeletons
    checked = st.prepare_points(model, 1, (1, 2), at[4])[0]
    for sent_skeletons, traces in ((skeletons, [3]), (frozenset(), [3, 4])):
        st._SHOWN.clear()  # the sweep's process: no check of its own yet
        job = (1, (1, 2), at[2])
        answer, sent = multiprocessing.Pipe(duplex=False)
        sent.send((([], [], "m"), [], sent_skeletons))
        sent.close()
        beside = sb.SettingsBeside(model)
        beside._asked[1] = (job, answer)
        assert beside.compute(1, job)(model, *job) == ([], [], "m")
        calls = _counting_traces(monkeypatch)
        got = st.prepare_points(model, 1, (1, 2), at[4])[0]
        monkeypatch.undo()
        assert calls == traces
        assert len(got) == len(checked) and all(st._same(a, b) for a, b in zip(got, checked))
