"""A warning said once, for what the answer is (issue 58, "warnings ... once"): the linears
that tensor parallelism keeps replicated were said by ``phaze-shard-tensor-parallel`` for each
step ``phazec --hw`` sharded, the model cut to 3 and 4 blocks and then the whole, at every
width tried: three lines with three counts, and for widths the plan does not take (a TP 1
plan warned of TP 4).  Now the search holds the pass's warnings back and says the plan's own
``phaze.tp_replicated`` records once, in the words of the plan's summary."""

from __future__ import annotations

import warnings

import pytest
from conftest import MODELS
from xdsl.dialects.builtin import ArrayAttr, ModuleOp

from phaze import hw_answer
from phaze_ir import keys
from phaze_ir.attributes import ReplicatedLinearsAttr
from phaze_ir.warning import PhazeWarning, ReplicatedLinearsWarning

TINY = str(MODELS / "tiny_llama_sdpa.py")  # 4 query heads, 2 key/value heads


def _module_with(*counts: int) -> ModuleOp:
    module = ModuleOp([])
    if counts:
        records = [
            ReplicatedLinearsAttr.make(
                reason="kv_heads", width=4, count=n, total=14, module="model.layers.0.self_attn.k_proj",
                flops_share=0.08, param_share=0.05,
            )
            for n in counts
        ]  # fmt: skip
        module.attributes[keys.TP_REPLICATED] = ArrayAttr(records)
    return module


def test_the_search_s_replicated_warnings_are_held_back_and_the_plan_s_said():
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with hw_answer._replicated_held_back():
            for n in (6, 8, 12):  # the 3-block cut, the 4-block cut, the whole model
                said_by_the_pass = f"tensor parallelism (width 4) keeps the {n} key/value projections"
                warnings.warn(said_by_the_pass, ReplicatedLinearsWarning, stacklevel=1)
            warnings.warn("another warning", PhazeWarning, stacklevel=1)  # not held back
        hw_answer._say_replicated(_module_with(12))
    assert [str(w.message) for w in said] == [
        "another warning",
        "TP 4 keeps 12 of 14 linears whole (fewer key/value heads than devices; first "
        "model.layers.0.self_attn.k_proj): 5% of the parameters, 8% of the linear FLOPs",
    ]


def test_a_plan_without_tensor_parallelism_says_nothing_of_it():
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        hw_answer._say_replicated(_module_with())
    assert said == []


@pytest.mark.slow
def test_phazec_hw_says_the_plan_s_replicated_linears_once(capsys, tmp_path):
    """The tiny Llama at TP 4 (2 key/value heads): one warning, the whole model's count (2
    blocks x k and v), not one per cut trace; the plan's summary says the same words."""
    from phaze.tools import phazec

    args = [TINY, "--hw", "h100", "--devices", "8", "--global-batch", "16", "--tp", "4", "--no-cache"]
    assert phazec.main([*args, "-o", str(tmp_path / "p.mlir")]) == 0
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if line.startswith("phazec: warning: ")]
    assert len(said) == 1 and said[0].startswith("phazec: warning: TP 4 keeps 4 of "), err
    words = said[0].removeprefix("phazec: warning: ")
    assert err.count(words) == 2  # the warning, and the plan summary's "warning:" line
    assert "tensor parallelism (width" not in err
