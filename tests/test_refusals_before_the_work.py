"""Options that contradict each other in a way known before any trace are refused in one line
before it (issue 58, "one line per refusal, before the work"); each was once refused only after
the whole sweep (~40 s on the tiny Llama), one of them for a reason it did not have."""

from __future__ import annotations

import pytest
from conftest import MODELS

TINY = str(MODELS / "tiny_llama_sdpa.py")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (
            ["--fp8-params"],
            "--fp8-params: FP8 primary weights are the FP8 linears' of --dtype fp8, not amp-bfloat16",
        ),
        (
            ["--fp8-params", "--dtype", "bfloat16"],
            "--fp8-params: FP8 primary weights are the FP8 linears' of --dtype fp8, not bfloat16",
        ),
        (
            # (was: after the sweep, "expected --zero 2 or 3" with --zero 3 given: the nearest-fit
            # search had relaxed ZeRO to auto)
            ["--zero", "3", "--dp-shard", "16"],
            "--dp-shard 16: expected a shard group of at most --devices 8",
        ),
    ],
    ids=["fp8-params-default-dtype", "fp8-params-bf16", "dp-shard-over-devices"],
)
def test_refused_in_one_line_before_any_trace(capsys, no_trace, argv, says):
    from phaze.tools import phazec

    rc = phazec.main([TINY, "--hw", "h100", "--devices", "8", "--global-batch", "16", "--no-cache", "-q", *argv])
    err = capsys.readouterr().err
    assert rc == 1 and err.strip() == f"phazec: error: {says}", err


def test_the_nearest_fit_keeps_hsdp_s_zero():
    """sweep.nearest_plan relaxes a fixed --zero to auto, but not under --dp-shard (HSDP needs
    ZeRO 2 or 3): the relaxed try would have been refused for a reason the user's options lack."""
    from phaze.options import Options
    from phaze.search import sweep

    tried = []

    def fits(o):
        tried.append(o.zero)
        return None

    sweep.nearest_plan(Options(hw="h100", devices=8, zero="3", dp_shard=4), 16, fits, lambda _: None)
    assert tried and set(tried) == {"3"}
    tried.clear()
    sweep.nearest_plan(Options(hw="h100", devices=8, zero="3"), 8, fits, lambda _: None)
    assert "auto" in tried
