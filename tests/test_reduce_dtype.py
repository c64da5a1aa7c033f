"""--reduce-dtype: the DP gradient collectives priced in the dtype the framework reduces in
(docs/design.md §5, "Gradient reduction dtype")."""

from __future__ import annotations

import dataclasses

import pytest

from passes.algorithms import _phaze_rs
from passes.algorithms import placement as pl
from passes.algorithms.placement import LayerNumbers
from passes.algorithms.placement_options import PlacementOptions
from passes.algorithms.priced_step import PricedStep

# one switch level of 8 devices, 100 GB/s links, 5 us: the DP group's collective is a ring on it
LEVELS: list[_phaze_rs.LevelDict] = [{"group_size": 8, "bandwidth_Bps": 100e9, "latency_s": 5e-6}]
GRADS = 64 << 20  # bf16 gradients of a layer, bytes


def _step(grad_bytes: int, grad_element_bytes: int = 2) -> PricedStep:
    layer = LayerNumbers(1e-3, 2e-3, (0.0, 0.0, 0.0), (8, 8, 8), GRADS, grad_bytes, 2 * GRADS, 0, 16)
    return PricedStep([layer, layer], micro_batch=1, tp=1, grad_element_bytes=grad_element_bytes)


def _step_s(zero: str, reduce_dtype: str, grad_bytes: int = GRADS, grad_element_bytes: int = 2) -> float:
    options = PlacementOptions(devices=8, global_batch=8, zero=zero, recompute="none", reduce_dtype=reduce_dtype)
    problem = pl.problem(
        _step(grad_bytes, grad_element_bytes), options, hbm_bytes=1 << 40, levels=LEVELS, memory_bound_Bps=1e12
    )
    problem["fsdp_copies"] = None  # the collectives alone: FSDP's copies read the gradients at their own bytes
    result = _phaze_rs.evaluate_placement(problem, 1, 8)
    assert result["feasible"] and result["plan"] is not None
    return result["plan"]["time_per_batch_s"]


@pytest.mark.parametrize("zero", ["0", "1", "2", "3"])
def test_fp32_reduction_moves_twice_the_bytes_of_bf16_gradients(zero):
    # ZeRO-0: the all-reduce; ZeRO-1: the reduce-scatter once a step; ZeRO-2/3 (FSDP): the
    # reduce-scatter every micro-batch (the parameters' all-gathers the same in both): fp32 on
    # the wire is the collective of gradients twice as large
    fp32 = _step_s(zero, "fp32")
    assert fp32 == _step_s(zero, "bf16", grad_bytes=2 * GRADS)
    assert fp32 > _step_s(zero, "bf16")


def test_gradients_held_in_fp32_reduce_as_they_are_in_fp32_and_halve_in_bf16():
    # autocast's fp32 parameters: grad_bytes count 4 bytes an element already
    assert _step_s("0", "fp32", grad_element_bytes=4) == _step_s("0", "bf16")
    assert _step_s("0", "bf16", grad_element_bytes=4) == _step_s("0", "bf16", grad_bytes=GRADS // 2)


def test_the_scale_reaches_the_problem_and_a_bad_setting_is_refused():
    options = PlacementOptions(devices=8, global_batch=8)
    assert options.reduce_dtype == "fp32"  # Megatron-LM --bf16 and torchtitan's FSDP2 default
    kw = {"hbm_bytes": 1 << 30, "levels": LEVELS, "memory_bound_Bps": 1e12}
    assert pl.problem(_step(GRADS), options, **kw)["grad_reduce_scale"] == 2.0  # type: ignore[arg-type]
    bf16 = dataclasses.replace(options, reduce_dtype="bf16")
    assert pl.problem(_step(GRADS), bf16, **kw)["grad_reduce_scale"] == 1.0  # type: ignore[arg-type]
    with pytest.raises(pl.PlacementError, match=r"^reduce dtype .fp8.: expected one of fp32, bf16, fp16$"):
        pl.problem(_step(GRADS), dataclasses.replace(options, reduce_dtype="fp8"), **kw)  # type: ignore[arg-type]
    problem = pl.problem(_step(GRADS), options, **kw)  # type: ignore[arg-type]
    problem["grad_reduce_scale"] = -1.0
    with pytest.raises(ValueError, match="grad_reduce_scale must be finite and > 0"):
        _phaze_rs.solve_placement(problem)


def test_phazec_prices_fsdp_reduce_scatter_in_the_dtype_given(tmp_path):
    """phazec --reduce-dtype reaches the DP: the ZeRO-3 step's per-micro-batch collectives (the
    reduce-scatter of fp16 gradients and the parameters' all-gathers) cost more in fp32."""
    import json

    from conftest import MODELS

    from phaze.tools.phazec import main

    comm = {}
    for dtype in ("fp32", "bf16"):
        out = tmp_path / f"{dtype}.json"
        argv = [str(MODELS / "tiny_gpt2.py"), "--hw", "h100", "--devices", "8", "--global-batch", "8"]
        argv += ["--placement", "expert:1,8,1", "--zero", "3", "--reduce-dtype", dtype]
        argv += ["--no-cache", "-q", "-o", str(tmp_path / "plan.mlir"), "--json", str(out)]
        assert main(argv) == 0
        comm[dtype] = json.loads(out.read_text())["breakdown_s"]["dp_comm_s"]
    assert comm["fp32"] > comm["bf16"] > 0
    with pytest.raises(SystemExit) as e:  # argparse's refusal, naming the choices
        main([str(MODELS / "tiny_gpt2.py"), "--hw", "h100", "--reduce-dtype", "fp8", "-q"])
    assert e.value.code == 2
