"""phazec's and phaze-validate's flags that are options are built from the options' fields
(``phaze.tools.flags``): each option's flag, help and choices are declared once, on its field."""

from __future__ import annotations

import dataclasses

import pytest

from passes.algorithms.kernels import RUNTIMES
from passes.algorithms.placement_options import PlacementOptions
from phaze.options import SEQUENCE_PARALLEL_SETTINGS, STAGES, Options
from phaze.search.objective import OBJECTIVES
from phaze.tools import phaze_validate, phazec
from phaze.tools.flags import option_dest, option_values
from phaze_ir.dialect import OPTIMIZER_KINDS
from phaze_ir.frontend.trace import DTYPES

#: The options' fields, by whether phazec has a flag for each (``unfit_plan`` is set by
#: ``--write-infeasible``, whose default is the opposite; ``schedule_cache`` is no option).
FLAGGED = [f for f in dataclasses.fields(Options) if f.metadata.get("help")]


def _actions(parser):
    return {a.dest: a for a in parser._actions}


def test_every_option_with_help_is_one_phazec_flag_with_that_help():
    """Each field that declares a help is phazec's flag of its name (or the one it declares),
    once, with that help; and the fields without one are those set otherwise."""
    actions = _actions(phazec._parser())
    for f in FLAGGED:
        action = actions[option_dest(Options, f.name)]
        assert action.help.startswith(f.metadata["help"]), f.name
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        # (a switch whose default the chip decides has its --no- form too: --no-dp-overlap)
        assert action.option_strings in ([flag], [flag, "--no-" + flag[2:]]), f.name
    assert {f.name for f in dataclasses.fields(Options)} - {f.name for f in FLAGGED} == {"unfit_plan", "schedule_cache"}
    assert all(f.metadata.get("help") for f in dataclasses.fields(PlacementOptions))


@pytest.mark.parametrize(
    "dest, declared",
    [
        ("emit", STAGES),
        ("dtype", DTYPES),
        ("optimizer", tuple(OPTIMIZER_KINDS)),
        ("objective", OBJECTIVES),
        ("sequence_parallel", SEQUENCE_PARALLEL_SETTINGS),
        ("kernels", RUNTIMES),
    ],
)
def test_a_flags_choices_are_the_tuple_that_declares_them(dest, declared):
    """Choices named by the tuple that declares them (a dotted name, imported when the command
    line is built) are that tuple, in both tools."""
    assert tuple(_actions(phazec._parser())[dest].choices) == tuple(declared)
    validate = _actions(phaze_validate._parser())
    if dest in validate:
        assert tuple(validate[dest].choices) == tuple(declared)


def test_the_flags_read_back_as_the_options_fields():
    """``option_values``: a flag given is its field's value (one value of a tuple field, the
    tuple of it), a flag not given is left to the field's default; the solver's flags, named
    apart from their fields, land on them."""
    args = phazec._parser().parse_args(["m.py", "--micro-batch", "2", "--solver-gap", "0.1", "--strict"])
    values = option_values(args, Options)
    assert values["micro_batches"] == (2,) and "tp_widths" not in values and "hw" not in values
    assert values["schedule_gap"] == 0.1 and values["strict"] is True and "schedule_nodes" not in values
    opts = Options(**values)
    assert opts.tp_widths is None and opts.hw == Options.hw


def test_phaze_validate_prices_with_the_options_its_flags_give():
    """phaze-validate's settings hold the driver's options its flags give, full recompute by
    default (the vTrain runs'), and nothing else of phazec's defaults changed."""
    from phaze import validate as v

    args = phaze_validate._parser().parse_args(
        ["r.csv", "--hw", "h100", "--kernels", "megatron", "--solver-nodes", "3"]
    )
    names = ("hw", "recompute", "kernels", "schedule_time_limit", "schedule_nodes", "schedule_max_binaries")
    opts = v.pricing_options(**option_values(args, Options, names))
    assert (opts.hw, opts.kernels, opts.schedule_nodes, opts.recompute) == ("h100", "megatron", 3, "full")
    assert dataclasses.replace(opts, hw="tpuv4", kernels="ops", schedule_nodes=0, recompute="auto") == Options()
