"""Typed options (``passes/algorithms/placement_options.py``): an option that declares a
``parse`` is parsed once, when the options are made, and held as its typed value; its text
is never compared again in phaze/, passes/ or phaze_ir/ (an AST check of the sources)."""

from __future__ import annotations

import ast
import dataclasses
import json
import pickle

import pytest
from conftest import ROOT

from passes.algorithms.option_values import (
    AUTO,
    Dtype,
    Fp8RecipeSetting,
    Optimizer,
    PipelineSchedule,
    RankOrder,
    Recompute,
    Runtime,
    SdpaOrder,
    Tristate,
    Zero,
)
from passes.algorithms.placement_options import OptionError
from phaze.options import Options, context_parallel_degree, traced_seq_len, zero_stage

#: The options held as typed values: those whose field declares a parse.
TYPED = frozenset(f.name for f in dataclasses.fields(Options) if f.metadata.get("parse") is not None)


def _option_text_compared(source: str) -> list[tuple[int, str]]:
    """(line, option) of each comparison of a typed option (any ``x.OPTION``) against a string
    literal, or a tuple, list or set of them, and of each ``x.OPTION.isdigit()``-like text
    test on one."""

    def literal_text(node: ast.expr) -> bool:
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(literal_text(e) for e in node.elts)
        return isinstance(node, ast.Constant) and isinstance(node.value, str)

    def option_of(node: ast.expr) -> str | None:
        return node.attr if isinstance(node, ast.Attribute) and node.attr in TYPED else None

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            options = [o for o in map(option_of, operands) if o]
            if options and any(literal_text(o) for o in operands):
                found.append((node.lineno, options[0]))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("isdigit", "isdecimal", "isnumeric") and (name := option_of(node.func.value)):
                found.append((node.lineno, name))
    return found


def test_the_typed_options_are_the_most_used():
    most_used = {"context_parallel", "sequence_parallel", "tp_overlap", "zero", "recompute", "kernels"}
    later = {"pipeline_schedule", "expert_parallel", "fp8_recipe", "optimizer"}
    assert most_used | {"sdpa_order", "rank_order", "emit", "dtype"} | later <= TYPED


def test_the_check_finds_option_text_compared():
    source = """
if opts.context_parallel != "1": pass
if o.tp_overlap in ("on", "auto"): pass
if "on" == opts.sequence_parallel: pass
if opts.context_parallel.isdigit(): pass
if opts.tp_overlap is Tristate.ON or opts.context_parallel != 1 or opts.hw == "h100": pass
"""
    assert _option_text_compared(source) == [
        (2, "context_parallel"),
        (3, "tp_overlap"),
        (4, "sequence_parallel"),
        (5, "context_parallel"),
    ]


def test_no_option_text_is_compared_after_parsing():
    found = []
    for package in ("phaze", "passes", "phaze_ir"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, name in _option_text_compared(path.read_text()):
                found.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert not found, "option text compared after parsing (compare the typed value): " + "; ".join(found)


def test_an_options_text_is_parsed_once_into_its_value():
    opts = dataclasses.replace(
        Options(), context_parallel="auto", tp_overlap="on", sequence_parallel="auto", zero="auto", recompute="full"
    )
    assert opts.context_parallel is AUTO and opts.tp_overlap is Tristate.ON and opts.sequence_parallel is Tristate.AUTO
    assert opts.zero is Zero.AUTO and zero_stage(opts) is None and opts.recompute is Recompute.FULL
    assert zero_stage(dataclasses.replace(opts, zero="3")) == 3 and Options().zero is Zero.PLAIN
    four = dataclasses.replace(opts, context_parallel="4", seq_len=8192)
    assert four.context_parallel == 4 and type(four.context_parallel) is int
    assert context_parallel_degree(four) == 4 and traced_seq_len(four) == 2048
    assert context_parallel_degree(opts) == 1  # auto: a stage before the sweep resolves it
    assert Options().context_parallel == 1 and Options().tp_overlap is Tristate.OFF
    opts.check()
    four.check()


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("context_parallel", "0", "context_parallel='0': expected auto or a degree N >= 1"),
        ("tp_overlap", "maybe", "tp_overlap='maybe': expected one of off, on, auto"),
        ("sequence_parallel", "ON", "sequence_parallel='ON': expected one of auto, on, off"),
        ("zero", "4", "zero: zero '4': expected one of auto, 0, 1, 2, 3"),
        ("recompute", "some", "recompute: recompute 'some': expected one of auto, none, selective, full"),
        (
            "pipeline_schedule",
            "interleaved:1",
            "pipeline_schedule: pipeline schedule 'interleaved:1': "
            "interleaved needs V >= 2 chunks per device (1 is 1f1b)",
        ),
        (
            "expert_parallel",
            "0",
            "expert_parallel: expert parallel '0': expected auto or a degree from 1 to 2147483647",
        ),
    ],
)
def test_a_bad_text_stays_text_for_the_check_to_name(name, text, message):
    opts = dataclasses.replace(Options(), **{name: text})
    assert getattr(opts, name) == text and type(getattr(opts, name)) is str
    with pytest.raises(OptionError) as e:
        opts.check()
    assert e.value.named(name, "=") == message


def test_a_typed_value_reads_as_its_text():
    """What plans, pass specs, JSON and cache keys are built from reads as the text did."""
    for value, text in ((AUTO, "auto"), (Tristate.ON, "on"), (Tristate.OFF, "off"), (Zero.OPTIMIZER, "1")):
        assert str(value) == text and f"{value}" == text and repr(value) == repr(text)
        assert json.dumps({"v": value}) == json.dumps({"v": text}) and value == text


def test_the_members_are_the_settings_the_placement_declares():
    from passes.algorithms.kernels import RUNTIMES, SDPA_ORDERS
    from passes.algorithms.placement import RANK_ORDER_SETTINGS, RECOMPUTE_SETTINGS, ZERO_SETTINGS
    from phaze_ir.frontend.float8_linear import FP8_RECIPE_CHOICES
    from phaze_ir.frontend.trace import DTYPES
    from phaze_ir.op_kinds import OPTIMIZER_KINDS

    assert tuple(Zero) == ZERO_SETTINGS and tuple(Recompute) == RECOMPUTE_SETTINGS
    assert tuple(Runtime) == RUNTIMES and tuple(SdpaOrder) == SDPA_ORDERS
    assert tuple(RankOrder) == RANK_ORDER_SETTINGS and tuple(Dtype) == DTYPES
    assert tuple(Fp8RecipeSetting) == FP8_RECIPE_CHOICES and tuple(Optimizer) == tuple(OPTIMIZER_KINDS)


def test_the_schedule_and_the_expert_degree_are_parsed_once():
    opts = dataclasses.replace(Options(), pipeline_schedule="interleaved:3", expert_parallel="auto")
    assert type(opts.pipeline_schedule) is PipelineSchedule and opts.pipeline_schedule.virtual_stages == 3
    assert str(opts.pipeline_schedule) == "interleaved:3" and repr(opts.pipeline_schedule) == "'interleaved:3'"
    assert opts.expert_parallel is AUTO and Options().expert_parallel == 1 and type(Options().expert_parallel) is int
    assert Options().pipeline_schedule.virtual_stages == 1
    assert dataclasses.replace(opts, pipeline_schedule="auto").pipeline_schedule.virtual_stages is None
    four = dataclasses.replace(opts, expert_parallel="4")
    assert four.expert_parallel == 4 and type(four.expert_parallel) is int
    # a sweep's forked children get them pickled: the chunks travel with the text
    again = pickle.loads(pickle.dumps(opts))
    assert again == opts and again.pipeline_schedule.virtual_stages == 3
    opts.check()
    four.check()


def test_the_pass_parses_a_specs_text_as_the_options_do():
    """phaze-place-devices' typed options are text in a spec, read by the same parse as phazec's
    and the API's: the pass holds what Options holds, and its spec reads back to it."""
    from xdsl.utils.arg_spec import parse_spec

    from passes.place_devices import PlaceDevicesPass
    from phaze.pipeline import place_devices_spec

    opts = dataclasses.replace(
        Options(),
        zero="3",
        recompute="full",
        rank_order="tp-pp-dp",
        pipeline_schedule="interleaved:2",
        expert_parallel="4",
    )
    spec = place_devices_spec(opts)
    assert 'expert_parallel="4"' in spec and 'pipeline_schedule="interleaved:2"' in spec and 'zero="3"' in spec
    made = PlaceDevicesPass.from_spec(parse_spec(spec))
    assert made.zero is Zero.PARAMETERS and made.recompute is Recompute.FULL and made.rank_order is RankOrder.TP_PP_DP
    assert made.expert_parallel == 4 and type(made.expert_parallel) is int
    assert made.pipeline_schedule.virtual_stages == 2
    assert PlaceDevicesPass.from_spec(made.spec()) == made  # (its spec writes the degree as an int)
    bad = PlaceDevicesPass.from_spec(parse_spec('phaze-place-devices{pipeline_schedule="interleaved:x"}'))
    assert bad.pipeline_schedule == "interleaved:x" and type(bad.pipeline_schedule) is str  # for check() to name
    with pytest.raises(OptionError, match="pipeline schedule 'interleaved:x'"):
        bad.check()
    with pytest.raises(ValueError, match=r"Incompatible types: given \(1.5,\), expected <class 'str'>"):
        PlaceDevicesPass.from_spec(parse_spec("phaze-place-devices{zero=1.5}"))


def test_the_searchs_cp_marker_is_no_option_value():
    """The settings check's key for every CP degree past 1 is a marker no option text parses into."""
    from phaze.search.setting import _RING_DEGREES

    marked = dataclasses.replace(Options(), context_parallel=_RING_DEGREES)
    assert marked.context_parallel is _RING_DEGREES and not isinstance(_RING_DEGREES, (str, int))
    hash(marked)  # a key of the question it stands for
    assert all(marked != dataclasses.replace(Options(), context_parallel=c) for c in ("1", "2", "64", "auto"))
