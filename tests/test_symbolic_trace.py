"""One symbolic trace for many (micro-batch, tokens) shapes (phaze_ir/frontend/symbolic_trace.py,
docs/design.md §2.1): at every point its checks accept, the specialised step imports to the
direct trace's IR text byte for byte; where they refuse, the point is traced directly."""

from __future__ import annotations

import pytest
from conftest import MODELS

from phaze.options import Options
from phaze.pipeline import import_step
from phaze_ir.frontend import load_model_file, trace_model
from phaze_ir.frontend import symbolic_trace as sym


def _ir(traced) -> str:
    return str(import_step(traced, Options()))


@pytest.fixture(scope="module")
def llama():
    spec = load_model_file(MODELS / "tiny_llama.py")
    return spec, sym.trace_family(spec, 3, 48), sym.trace_family(spec, 1, 48)


# (b, s): micro-batches of 2 and more, and a sample's tokens as context parallelism splits them (S/c of 64)
@pytest.mark.parametrize("b,s", [(2, 64), (4, 32), (8, 8), (2, 2)])
def test_a_specialised_step_is_the_direct_trace(llama, b, s):
    spec, family, _ = llama
    served = family.at(spec, b, s)
    assert served is not None
    direct = trace_model(spec, b, s)
    assert (served.micro_batch_size, served.seq_len) == (b, s)
    assert served.graph_module.code == direct.graph_module.code
    assert _ir(served) == _ir(direct)


def test_a_micro_batch_of_one_is_its_own_family(llama):
    """A trace at b = 1 keeps the batch the int 1 (a size-1 batch changes the ops): a b >= 2
    trace refuses it, and the b = 1 trace serves every b = 1 point, not b = 2."""
    spec, family, ones = llama
    assert family.at(spec, 1, 16) is None
    assert ones.at(spec, 2, 16) is None
    for s in (64, 16):
        served = ones.at(spec, 1, s)
        assert served is not None and _ir(served) == _ir(trace_model(spec, 1, s))


def test_a_point_whose_checks_fail_is_refused_and_would_have_differed():
    """BERT's position ids are sliced to the sequence; at its whole table (s = 64) the slice is
    the table itself (an ``alias`` in the direct trace), a decision the symbolic trace took
    without a guard at s = 48: that point is refused, and its graph, specialised regardless,
    is not the direct trace's (the check is what keeps it out), and the shared trace leaves
    it to the caller's direct trace.  Other points are served."""
    spec = load_model_file(MODELS / "tiny_bert_sdpa.py")
    family = sym.trace_family(spec, 3, 48)
    assert family.at(spec, 4, 32) is not None and _ir(family.at(spec, 4, 32)) == _ir(trace_model(spec, 4, 32))
    assert family.at(spec, 2, 64) is None
    subs = sym._point_sizes(spec, family.sizes.inputs, 2, 64, "float16")
    assert subs is not None and sym.failed_checks(family.sizes, subs)
    assert _ir(sym.specialise(family.traced, subs)) != _ir(trace_model(spec, 2, 64))
    key = ("test-bert", id(family))
    sym._FAMILIES[sym.family_of(key, 3, 48)] = family
    try:
        assert sym.trace_shared(key, 1, spec, 4, 32) is not None
        assert sym.trace_shared(key, 1, spec, 2, 64) is None  # the caller's direct trace then
    finally:
        del sym._FAMILIES[sym.family_of(key, 3, 48)]


def test_a_family_is_traced_symbolically_only_for_enough_points(monkeypatch):
    """Below ``MIN_POINTS`` expected points nothing is traced (the caller traces the point
    directly); at it, the family's first point traces it once and later points reuse it."""
    spec = load_model_file(MODELS / "tiny_llama.py")
    made: list[tuple[int, int]] = []
    real = sym.trace_family

    def counted(spec, b, s, *args):
        made.append((b, s))
        return real(spec, b, s, *args)

    monkeypatch.setattr(sym, "trace_family", counted)
    monkeypatch.setattr(sym, "_FAMILIES", {})
    assert sym.trace_shared("few", sym.MIN_POINTS - 1, spec, 2, 16) is None
    assert made == [] and sym._FAMILIES == {}
    first = sym.trace_shared("many", sym.MIN_POINTS, spec, 2, 16)
    second = sym.trace_shared("many", sym.MIN_POINTS - 1, spec, 4, 8)
    assert made == [(2, 16)] and first is not None and second is not None
    assert _ir(first) == _ir(trace_model(spec, 2, 16)) and _ir(second) == _ir(trace_model(spec, 4, 8))


def test_the_settings_of_planned_points_are_those_traced_point_by_point(monkeypatch):
    """``setting.plan_traces`` told of enough points of one family (a model cut to 3 blocks at
    micro-batches of 2 and more): their settings come from one symbolic trace, every field as
    the settings traced point by point."""
    from phaze.search import setting as st

    path = str(MODELS / "tiny_gpt2_deep.py")
    opts = Options()
    direct = {b: st.prepare_points(path, b, (1, 2), opts)[0] for b in (2, 4)}
    monkeypatch.setattr(sym, "_FAMILIES", {})
    monkeypatch.setattr(st, "_PLANNED", {})
    st.plan_traces(path, [(b, opts) for b in (2, 3, 4, 8)])
    shared = {b: st.prepare_points(path, b, (1, 2), opts)[0] for b in (2, 4)}
    assert len(sym._FAMILIES) == 1 and None not in sym._FAMILIES.values()
    for b in (2, 4):
        assert len(shared[b]) == len(direct[b]) > 0
        assert all(st._same(s, d) for s, d in zip(shared[b], direct[b]))


def test_each_served_point_checks_its_own_sequence_length(llama):
    """The position check runs at each point served, with that point's length (or, under
    ``whole_sequence``, the whole sample's), as its direct trace would: tiny_llama's rotary
    positions are configured for 64 tokens."""
    from phaze_ir.errors import PhazeWarning
    from phaze_ir.frontend.trace import whole_sequence

    spec, family, _ = llama
    with pytest.warns(PhazeWarning, match="sequence length 128 is beyond the model's max_position_embeddings = 64"):
        assert family.at(spec, 2, 128) is not None
    with pytest.warns(PhazeWarning, match="sequence length 256 is beyond"), whole_sequence(256):
        assert family.at(spec, 2, 32) is not None
