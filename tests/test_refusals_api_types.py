"""The Python API as strict as the command line (session 64's probe round, issue 58: "every
option type-checked at the edge with the option's name"): an option of the wrong type or value,
and a chip that cannot be read, are one :class:`PhazeError` line naming the argument as the
caller gave it, before anything is loaded."""

from __future__ import annotations

import pytest

import phaze
from phaze.api import options
from phaze_ir.errors import PhazeError


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"devices": float("inf")}, "devices=inf: expected an integer"),
        ({"global_batch": 16.0}, "global_batch=16.0: expected an integer"),
        ({"seq_len": -1}, "seq_len=-1: expected a positive integer up to 2.15 G (2,147,483,647)"),
        ({"micro_batch": [1]}, "micro_batch=[1]: expected an integer"),
        ({"tp": (2,)}, "tp=(2,): expected an integer"),
        ({"tp": []}, "tp=[]: expected an integer"),
        ({"dp_shard": 2.5}, "dp_shard=2.5: expected an integer"),
        ({"placement": b"expert:1,1,1"}, "placement=b'expert:1,1,1': expected a string or an integer"),
        ({"expert_parallel": 1.5}, "expert_parallel=1.5: expected a string or an integer"),
        ({"memory_headroom": True}, "memory_headroom=True: expected a number"),
        ({"capacity_factor": float("nan")}, "capacity_factor=nan: expected a finite number >= 1"),
        ({"objective": "speed"}, "objective='speed': expected one of throughput, perf-per-watt"),
        ({"kernels": 3}, "kernels='3': expected one of ops, eager, inductor, megatron"),
        ({"devices": 2**31}, "devices=2147483648: expected a positive integer up to 2.15 G (2,147,483,647)"),
        ({"context_parallel": 10**12}, "context_parallel='1000000000000': expected auto or a degree from 1 to 2.15 G"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else None,
)
def test_an_option_of_the_wrong_type_or_value_is_one_line_naming_it(given, says):
    with pytest.raises(PhazeError) as info:
        options("h100", **given)
    message = str(info.value)
    assert message.startswith("phaze.compile: ") and says in message and "\n" not in message, message


@pytest.mark.parametrize(
    ("hw", "says"),
    [
        ("h1\x1b[2J00", "hw='h1\\x1b[2J00': unknown hardware preset"),
        ("/no/such/chip.toml", "hw='/no/such/chip.toml': /no/such/chip.toml: no such file"),
        (None, "hw=None: expected a preset name"),
        (3, "hw=3: expected a preset name"),
    ],
    ids=["escape-code-preset", "missing-file", "none", "an-int"],
)
def test_a_chip_that_cannot_be_read_is_said_as_hw(hw, says):
    """(an unknown preset was the loader's line without the argument's name)"""
    with pytest.raises(PhazeError) as info:
        options(hw)
    message = str(info.value)
    assert message.startswith(f"phaze.compile: {says}") and message.isprintable(), message


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (lambda: phaze.compile("m.py", "h100", cache=b"/tmp/x"), "cache=b'/tmp/x': expected a directory or None"),
        (lambda: phaze.compile("m.py", "h100", log=3), "log=3: expected a function or None"),
        (lambda: phaze.compile(b"m.py", "h100"), "model=b'm.py': expected a model file, a config.json or a function"),
    ],
    ids=["cache-bytes", "log-an-int", "model-bytes"],
)
def test_compile_s_own_arguments_are_checked_before_any_work(call, says):
    with pytest.raises(PhazeError) as info:
        call()
    assert str(info.value).startswith(f"phaze.compile: {says}"), str(info.value)
