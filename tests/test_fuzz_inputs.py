"""Fuzzing the inputs a user writes by hand (issue 12, item 5): every value of every field of a
hardware file and of a space file, and every numeric flag of phazec.  Each input is either
refused with one line that names what is wrong, or accepted, and then what was accepted can be
carried by the IR (printed, parsed back, the same hardware).  Never a traceback, never an
overflow further on.  Deterministic: hypothesis runs derandomized, with a fixed number of
examples."""

from __future__ import annotations

import copy
import math

import pytest
import tomllib
from conftest import EXAMPLES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUZZ = settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))

#: Values a hostile or careless user writes: numbers at and beyond every limit, non-numbers.
VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e-300, 5e-324, 1e19, 1e300, 0.5, -0.0]),
    st.text(max_size=8),
    st.booleans(),
    st.lists(st.integers(min_value=-4, max_value=4), max_size=3),
    st.dictionaries(st.sampled_from(["a", "min", "max"]), st.integers(min_value=-4, max_value=64), max_size=2),
)


def leaves(data, path=()):
    """(path, value) of every scalar in a parsed TOML document (arrays of tables included)."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from leaves(v, (*path, k))
    elif isinstance(data, list) and data and all(isinstance(x, dict) for x in data):
        for i, v in enumerate(data):
            yield from leaves(v, (*path, i))
    else:
        yield path, data


def replaced(data, path, value):
    out = copy.deepcopy(data)
    node = out
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return out


def one_line(message: str) -> None:
    assert message and "\n" not in message and "Traceback" not in message, message


HARDWARE = {name: tomllib.loads((EXAMPLES / "hw" / f"{name}.toml").read_text()) for name in ("a100", "tpuv4")}
HW_FIELDS = [(name, path) for name, data in HARDWARE.items() for path, _ in leaves(data)]


@FUZZ
@given(where=st.sampled_from(HW_FIELDS), value=VALUES)
def test_any_value_of_any_hardware_field(where, value):
    from xdsl.dialects.builtin import ModuleOp

    from phaze_ir.hardware import Accelerator, HardwareError
    from phaze_ir.hardware_ir import module_accelerator, set_accelerator
    from phaze_ir.ir import parse_module, print_module

    name, path = where
    data = replaced(HARDWARE[name], path, value)
    try:
        acc = Accelerator.from_dict(data, source="hw.toml")
    except HardwareError as e:
        one_line(str(e))
        shown = ".".join(str(k) for k in path if not isinstance(k, int))
        assert shown.split(".")[-1] in str(e) or "network" in str(e), (path, str(e))
        return
    module = ModuleOp([])
    set_accelerator(module, acc)
    module.verify()
    back = module_accelerator(parse_module(print_module(module)), "the fuzz test")
    assert back == acc


SPACE = tomllib.loads((EXAMPLES / "spaces" / "small.toml").read_text())
SPACE_FIELDS = [path for path, _ in leaves(SPACE) if path[0] != "template" or path == ("template", "hardware")]


@FUZZ
@given(path=st.sampled_from(SPACE_FIELDS), value=VALUES)
def test_any_value_of_any_space_field(path, value):
    from phaze.search.arch_space import ArchSpace, spec_from_dict
    from phaze_ir.hardware import HardwareError  # a space's errors, and those of the hardware it names

    data = replaced(SPACE, path, value)
    try:
        spec = spec_from_dict(data, source="space.toml", base_dir=EXAMPLES / "spaces")
        if spec.num_candidates > 10**6:  # a legal but huge grid: generating it is a benchmark, not a test
            return
        space = ArchSpace.generate(spec, source="space.toml")
    except HardwareError as e:
        one_line(str(e))
        return
    assert len(space) > 0
    for hbm in space.spec.hbm_options:
        assert 0 < hbm < 2**63
    assert int(space.configs["area_um2"].max()) <= space.spec.budget_um2


NUMERIC_FLAGS = [
    "--micro-batch",
    "--tp",
    "--seq-len",
    "--devices",
    "--global-batch",
    "-j",
    "--solver-nodes",
    "--solver-max-binaries",
    "--solver-time-limit",
    "--solver-gap",
]
FLAG_VALUES = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["0", "1", "2147483647", "2147483648", "nan", "inf", "-inf", "1e400", "0.5", "x", ""]),
)


@FUZZ
@given(flag=st.sampled_from(NUMERIC_FLAGS), value=FLAG_VALUES)
def test_any_value_of_any_numeric_flag(flag, value, capsys):
    """Refused by argparse (exit status 2, one usage line) or by the check (one line), or
    accepted and then in range for everything downstream (i32 sizes, finite limits)."""
    from passes.algorithms.placement import MAX_COUNT as MAX_INT
    from phaze.tools.phazec import _parser, check_flags
    from phaze_ir.errors import PhazeError

    try:
        args = _parser().parse_args(["m.py", "--hw", "a100", flag, value])
    except SystemExit as e:
        assert e.code == 2
        err = capsys.readouterr().err
        assert f"argument {flag}" in err and "Traceback" not in err, err
        return
    try:
        check_flags(args)
    except PhazeError as e:
        one_line(str(e))
        assert str(e).split(":")[0].endswith(value.strip() or value) or flag in str(e), str(e)
        return
    for dest in ("micro_batch", "tp", "seq_len", "devices", "global_batch", "jobs"):
        v = getattr(args, dest, None)
        assert v is None or 1 <= v <= MAX_INT
    for dest in ("solver_nodes", "solver_max_binaries"):
        v = getattr(args, dest, None)
        assert v is None or 0 <= v <= MAX_INT
    assert args.solver_time_limit is None or (math.isfinite(args.solver_time_limit) and args.solver_time_limit > 0)
    assert 0 <= args.solver_gap < 1


@pytest.mark.parametrize("name", sorted(HARDWARE))
def test_the_presets_themselves_pass(name):
    from phaze_ir.hardware import Accelerator

    Accelerator.from_dict(HARDWARE[name], source=name)
