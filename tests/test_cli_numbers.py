"""Every number on phazec's command line is checked before any work: a bad one gives one line,
said once, exit status 1, in well under a second of tracing (none)."""

from __future__ import annotations

import pytest
from conftest import MODELS, run_tool

TINY = str(MODELS / "tiny_gpt2.py")


@pytest.mark.parametrize(
    "flag, value, says",
    [
        ("--devices", "0", "--devices 0: expected a positive integer"),
        ("--global-batch", "0", "--global-batch 0: expected a positive integer"),
        ("--micro-batch", "-2", "--micro-batch -2: expected a positive integer"),
        ("--tp", "0", "--tp 0: expected a positive integer"),
        ("--seq-len", "0", "--seq-len 0: expected a positive integer"),
        ("-j", "0", "-j/--jobs 0: expected a positive integer"),
        ("--solver-nodes", "-1", "--solver-nodes -1: expected a number from 0 (no limit) to 2147483647"),
        ("--solver-max-binaries", "-5", "--solver-max-binaries -5: expected a number from 0"),
        ("--devices", "99999999999999999999", "--devices 99999999999999999999: expected a positive integer up to"),
        ("--global-batch", "2147483648", "--global-batch 2147483648: expected a positive integer up to 2147483647"),
        ("--micro-batch", "1" + "0" * 20, "--micro-batch 1" + "0" * 20 + ": expected a positive integer up to"),
        ("--solver-nodes", "1" + "0" * 20, "--solver-nodes 1" + "0" * 20 + ": expected a number from 0"),
        ("--solver-time-limit", "nan", "--solver-time-limit nan: expected a positive, finite number"),
        ("--solver-time-limit", "inf", "--solver-time-limit inf: expected a positive, finite number"),
        ("--solver-time-limit", "0", "--solver-time-limit 0.0: expected a positive, finite number"),
        ("--solver-gap", "nan", "--solver-gap nan: expected a relative gap in [0, 1)"),
        ("--solver-gap", "1", "--solver-gap 1.0: expected a relative gap in [0, 1)"),
        ("--capacity-factor", "0.5", "--capacity-factor 0.5: expected a finite number >= 1 (below 1 the experts"),
        ("--capacity-factor", "nan", "--capacity-factor nan: expected a finite number >= 1"),
    ],
)
@pytest.mark.parametrize("mode", [["--hw", "tpuv4"], []], ids=["hw", "search"])
def test_bad_numbers_fail_before_any_work(flag, value, says, mode):
    r = run_tool("phazec", TINY, *mode, flag, value)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr  # said once, nothing traced before it
    assert lines[0].startswith(f"phazec: error: {says}"), r.stderr


def test_a_width_the_model_refuses_is_said_once():
    """--tp 3 on a 4-head model fails at every micro-batch size for one reason: said once."""
    r = run_tool("phazec", TINY, "--hw", "tpuv4", "--tp", "3", "-q")
    assert r.returncode == 1
    assert r.stderr.count("does not divide the 4 attention heads") == 1, r.stderr
    assert "could be compiled: phaze-shard-tensor-parallel: width 3" in r.stderr
    assert r.stderr.strip().endswith("(at every point)"), r.stderr
