"""What the ``--hw`` sweep skips or reuses for speed (issue 56, item 5) gives what it did
without: the settings' modules, no longer verified, verify; an attribute's text memoized by
the object is its text by value."""

from __future__ import annotations

from conftest import MODELS
from xdsl.dialects.builtin import Float16Type, TensorType

from phaze.options import Options
from phaze_ir import dialect as ph

DEEP = str(MODELS / "tiny_gpt2_deep.py")


def test_the_settings_modules_verify(monkeypatch):
    """``_settings_of`` compiles each width's module without verifying it (only its setting is
    read of it): every module a setting is read from, kernels formed on the chip, at TP 1, 2
    with and without sequence parallelism, verifies."""
    import phaze.search.setting as st
    from phaze.pipeline import load_accelerator

    read = []
    real = st.setting_from_module

    def verified(module, *args, **kwargs):
        module.verify()  # raises when the IR is not valid
        read.append(module)
        return real(module, *args, **kwargs)

    monkeypatch.setattr(st, "setting_from_module", verified)
    opts = Options(hw="a100", kernels="eager", sequence_parallel="auto", tp_overlap="auto")
    ready, errors, _ = st.prepare_points(DEEP, 2, (1, 2), opts, load_accelerator("a100"))
    assert errors == [] and [(s.tp, s.sequence_parallel) for s in ready] == [(1, False), (2, False), (2, True)]
    assert len(read) == 2 * 3  # the model cut to 3 and to 4 blocks, three points each


def test_attr_text_by_object_is_its_text_by_value(monkeypatch):
    """Two equal types made apart, the same object asked twice, and past the objects kept
    (all forgotten at once): the same text, ``str`` of the attribute."""
    a, b = TensorType(Float16Type(), [4, 8]), TensorType(Float16Type(), [4, 8])
    assert a is not b
    assert ph.attr_text(a) == ph.attr_text(b) == ph.attr_text(a) == "tensor<4x8xf16>"
    monkeypatch.setattr(ph, "_TEXTS_KEPT", 2)
    c = TensorType(Float16Type(), [3])
    ph._TEXT_OF_OBJECT.clear()
    assert [ph.attr_text(x) for x in (a, b, c, a)] == ["tensor<4x8xf16>", "tensor<4x8xf16>", "tensor<3xf16>"] + [
        "tensor<4x8xf16>"
    ]
    assert len(ph._TEXT_OF_OBJECT) <= 2
