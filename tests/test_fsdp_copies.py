"""FSDP's copies into and out of its flat buffers, priced by the DP under ZeRO-3 at the chip's
memory-bound rate (docs/design.md §6.5, "FSDP's copies"): FSDP2's and FSDP1's, per micro-batch."""

from __future__ import annotations

import pytest

from passes.algorithms import _phaze_rs
from passes.algorithms import placement as pl
from passes.algorithms.placement import LayerNumbers
from passes.algorithms.placement_options import PlacementOptions
from passes.algorithms.priced_step import PricedStep

# one switch level of 8 devices, 100 GB/s links, 5 us
LEVELS: list[_phaze_rs.LevelDict] = [{"group_size": 8, "bandwidth_Bps": 100e9, "latency_s": 5e-6}]
MIB = 1 << 20
LAYER_BYTES = 64 * MIB  # a layer's bf16 parameters, and its bf16 gradients
RATE = 2e12  # the memory-bound rate, bytes read plus written per second
DP, MICRO_BATCHES = 8, 2


def _time_s(zero: str, reduce_dtype: str, fsdp_version: str | None) -> float:
    """The step of two such layers over DP 8 (2 micro-batches), with FSDP's copies of
    ``fsdp_version`` priced, or none (None)."""
    layer = LayerNumbers(1e-3, 2e-3, (0.0, 0.0, 0.0), (8, 8, 8), LAYER_BYTES, LAYER_BYTES, 6 * LAYER_BYTES, 0, 16)
    step = PricedStep([layer, layer], micro_batch=1, tp=1, grad_element_bytes=2)
    options = PlacementOptions(
        devices=DP,
        global_batch=DP * MICRO_BATCHES,
        zero=zero,
        recompute="none",
        reduce_dtype=reduce_dtype,
        fsdp_version=fsdp_version or "2",
    )
    problem = pl.problem(step, options, hbm_bytes=1 << 40, levels=LEVELS, memory_bound_Bps=RATE)
    if fsdp_version is None:
        problem["fsdp_copies"] = None
    result = _phaze_rs.evaluate_placement(problem, 1, DP)
    assert result["feasible"] and result["plan"] is not None
    return result["plan"]["time_per_batch_s"]


def _copies_s(bytes_per_micro_batch: float) -> float:
    return MICRO_BATCHES * bytes_per_micro_batch / RATE


def test_fsdp2_copies_each_gathered_layer_out_and_its_gradients_in():
    # The stage's parameters and gradients, P = G = 128 MiB, their shards over DP 8; the fp32
    # master is 2 bytes a parameter byte, the reduction fp32 (2 bytes a gradient byte).
    params = grads = 2 * LAYER_BYTES
    shard = params / DP
    per_gather = (2 + 1) * shard + 2 * shard + 2 * params  # cast to bf16, copy in, copy out
    reduce_copy_in = (1 + 2) * grads  # _chunk_cat: bf16 read, fp32 written; no shard cast
    expected = _copies_s(2 * per_gather + reduce_copy_in)
    assert _time_s("3", "fp32", "2") - _time_s("3", "fp32", None) == pytest.approx(expected, rel=1e-9)


def test_fsdp1_gathers_in_place_and_flattens_and_divides_the_gradients():
    # fms-fsdp's: bf16 reduction (s = 1): the shard cast before each gather, the flat gradient's
    # concatenation and pre-divide, the reduced shard post-divided and cast to fp32.
    params = grads = 2 * LAYER_BYTES
    per_gather = (2 + 1) * params / DP
    backward = 2 * grads + 2 * grads + 2 * grads / DP + (1 + 2) * grads / DP
    expected = _copies_s(2 * per_gather + backward)
    assert _time_s("3", "bf16", "1") - _time_s("3", "bf16", None) == pytest.approx(expected, rel=1e-9)
    # FSDP2 copies each gathered layer out of its buffer: more bytes than FSDP1's views
    assert _time_s("3", "bf16", "2") > _time_s("3", "bf16", "1")


@pytest.mark.parametrize("zero", ["0", "1", "2"])
def test_below_zero3_no_copy_is_priced(zero):
    # not FSDP's ZeRO-3: the same floats whether the copies are priced or not
    assert _time_s(zero, "fp32", "2") == _time_s(zero, "fp32", None)
    assert _time_s(zero, "fp32", "1") == _time_s(zero, "fp32", None)


def test_a_bad_fsdp_version_is_refused_in_one_line():
    layer = LayerNumbers(1e-3, 2e-3, (0.0, 0.0, 0.0), (8, 8, 8), 8, 8, 16, 0, 16)
    step = PricedStep([layer], micro_batch=1, tp=1)
    options = PlacementOptions(devices=8, global_batch=8, zero="3", fsdp_version="3")
    with pytest.raises(pl.PlacementError, match=r"^fsdp version '3': expected one of 2, 1$"):
        pl.problem(step, options, hbm_bytes=1 << 30, levels=LEVELS, memory_bound_Bps=RATE)
