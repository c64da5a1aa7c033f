"""The hardware description travels in the IR as ``phaze.accelerator`` and comes back exact."""

from __future__ import annotations

import pytest
from xdsl.dialects.builtin import ModuleOp

from phaze_ir.errors import PhazeError
from phaze_ir.hardware import load_hardware, preset_names
from phaze_ir.hardware_ir import module_accelerator, set_accelerator
from phaze_ir.ir import parse_module, print_module


@pytest.mark.parametrize("name", preset_names())
def test_presets_round_trip_through_the_ir(name):
    acc = load_hardware(name)
    module = ModuleOp([])
    set_accelerator(module, acc)
    text = print_module(module)
    assert "phaze.accelerator @acc {" in text and "phaze.target = @acc" in text
    back = parse_module(text)
    assert print_module(back) == text
    assert module_accelerator(back, "test") == acc


def test_missing_accelerator_names_the_pass():
    with pytest.raises(PhazeError, match="requires a 'phaze.accelerator' op for phaze-estimate-latency"):
        module_accelerator(ModuleOp([]), "phaze-estimate-latency")


def test_bad_spec_in_ir_is_a_clear_error():
    text = print_module(set_accelerator(ModuleOp([]), load_hardware("tpuv4")).parent_op())
    bad = text.replace("pe_x = 128 : i64", "pe_x = -4 : i64")
    with pytest.raises(PhazeError, match=r"tensor_cores\.pe_x = -4"):
        module_accelerator(parse_module(bad), "test")
