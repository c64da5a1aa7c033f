"""A plan field or module attribute out of its range, read by phaze-opt, is one line naming the
field and the value at file:line:col (issue 58, "every refusal one line"): not MLIR's three
lines with an excerpt and a caret, which a syntax error keeps (the value was read whole; the
line says everything)."""

from __future__ import annotations

import re

import pytest
from test_hostile_plan_relations import _plan_text, one_line_error, opt


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> str:
    return _plan_text(str(tmp_path_factory.mktemp("plan")))


@pytest.mark.parametrize(
    ("pattern", "new", "says"),
    [
        (r"devices = 8, global", "devices = 99999999999999999999999, global", "field 'devices' of phaze.plan = 9999"),
        (r"dp = 2, pp", "dp = -2, pp", "field 'dp' of phaze.plan = -2: expected an integer from 0 to"),
        (
            r"max_memory_bytes = \d+",
            "max_memory_bytes = 18446744073709551616",
            "field 'max_memory_bytes' of",
        ),
        (r"zero = 1,", "zero = 9223372036854775808,", "field 'zero' of phaze.plan = 9223372036854775808: expected an"),
        (r"time_per_batch_s = [0-9.e+-]+", "time_per_batch_s = -1.0", "field 'time_per_batch_s' of phaze.plan = -1.0"),
        (r"index = 0", "index = -1", "field 'index' of phaze.layer_info = -1: expected an integer >= 0"),
        (
            r"phaze.micro_batch_size = 8 : i64",
            "phaze.micro_batch_size = 99999999999999999999999 : i64",
            "attribute 'phaze.micro_batch_size': Integer value 99999999999999999999999 is out of range for type i64",
        ),
        (
            r"phaze.micro_batch_size = 8 : i64",
            "phaze.micro_batch_size = -1 : ui64",
            "attribute 'phaze.micro_batch_size': Integer value -1 is out of range for type ui64",
        ),
    ],
    ids=[
        "i64-past",
        "negative-unsigned",
        "past-u64",
        "past-i64-enum",
        "negative-time",
        "negative-index",
        "module-i64-past",
        "module-negative-ui64",
    ],  # fmt: skip
)
def test_a_field_out_of_range_is_one_line_naming_it(tmp_path, capsys, plan, pattern, new, says):
    text, n = re.subn(pattern, new, plan, count=1)
    assert n == 1, pattern
    rc, out, err = opt(tmp_path, text, capsys=capsys)
    line = one_line_error(rc, err)
    assert re.match(r"^\S+in\.mlir:\d+:\d+: error: ", line) and says in line, line
    assert out == ""


def test_a_syntax_error_is_one_line_quoting_the_source_there(tmp_path, capsys, plan):
    rc, _, err = opt(tmp_path, plan.replace("devices = 8, global", "devices = 8 : i64, global", 1), capsys=capsys)
    line = one_line_error(rc, err)
    assert re.match(r"^\S+in\.mlir:\d+:\d+: error: '>' expected \(at ': i64, global_batch = ", line), line


def test_a_plan_s_counts_are_bounded_as_the_options_are(tmp_path, capsys, plan):
    """A plan on 2^63 - 1 devices was read, and then refused by the pass that re-places it."""
    from passes.algorithms.placement import MAX_COUNT
    from phaze_ir.attributes import COUNT_MAX

    assert COUNT_MAX == MAX_COUNT
    rc, _, err = opt(tmp_path, plan.replace("devices = 8, global", "devices = 9223372036854775807, global", 1),
                     capsys=capsys)  # fmt: skip
    assert "field 'devices' of phaze.plan = 9223372036854775807: expected an integer from 1 to 2147483647" in (
        one_line_error(rc, err)
    )


def test_a_fixed_placement_that_names_other_degrees_is_refused(tmp_path, capsys, plan):
    rc, _, err = opt(tmp_path, plan.replace('placement = "expert:2,2,1"', 'placement = "expert:1,1,8"', 1),
                     capsys=capsys)  # fmt: skip
    line = one_line_error(rc, err)
    assert "contradicts itself: placement = 'expert:1,1,8' with pp = 2, dp = 2, tp = 1: expected expert:2,2,1" in line


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ('binding = ""', 'binding = "", bogus = 1', "unknown field 'bogus' of phaze.plan; expected one of devices,"),
        (', binding = ""', "", "phaze.plan is missing field(s) binding"),
    ],
    ids=["unknown", "missing"],
)
def test_an_unknown_or_missing_field_is_one_line(tmp_path, capsys, plan, old, new, says):
    rc, _, err = opt(tmp_path, plan.replace(old, new, 1), capsys=capsys)
    assert says in one_line_error(rc, err)
