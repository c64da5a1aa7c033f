"""Each option's check is declared once, on its field (``placement_options.option``), and every
edge runs that one declaration: a command line (phazec's and phaze-validate's flags), a pass
option in a pipeline spec (``phaze-place-devices``, the scheduling passes' solver limits, the
same quantities under other names) and ``Options.check()`` refuse the same bad value, each
saying the same problem under its own name of the option."""

from __future__ import annotations

import dataclasses
import re

import pytest
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import PassPipeline

from passes import ALL_PASSES
from passes.algorithms.placement_options import OptionError, PlacementOptions, option_flag
from phaze.options import Options
from phaze.tools import phaze_validate, phazec
from phaze.tools.flags import option_dest
from phaze_ir.errors import PhazeError
from phaze_ir.ir import make_context

#: A bad value of each option with a check or choices: as an API caller gives it, as a flag's
#: text (None: a switch, which takes no value), and as a pass option writes it (None: no pass
#: option; ``phaze-form-kernels``' ``runtime`` and ``phaze-insert-optimizer``'s ``optimizer``
#: are checked against the tuple the option's choices name).
BAD = {
    "devices": (0, "0", "phaze-place-devices{devices=0}"),
    "global_batch": (2**31, "2147483648", "phaze-place-devices{global_batch=2147483648}"),
    "placement": ("expert:0,1,1", "expert:0,1,1", 'phaze-place-devices{placement="expert:0,1,1"}'),
    "dp_overlap": (1, None, None),
    "fp8_params": (1, None, None),
    "dp_shard": (-1, "-1", "phaze-place-devices{dp_shard=-1}"),
    "expert_tensor_parallel": (-1, "-1", "phaze-place-devices{expert_tensor_parallel=-1}"),
    "recompute": ("sometimes", "sometimes", 'phaze-place-devices{recompute="sometimes"}'),
    "zero": ("4", "4", 'phaze-place-devices{zero="4"}'),
    "pipeline_schedule": ("interleaved:1", "interleaved:1", 'phaze-place-devices{pipeline_schedule="interleaved:1"}'),
    "expert_parallel": ("0", "0", 'phaze-place-devices{expert_parallel="0"}'),
    "rank_order": ("pp-dp-tp", "pp-dp-tp", 'phaze-place-devices{rank_order="pp-dp-tp"}'),
    "pipeline_transfer": ("half", "half", 'phaze-place-devices{pipeline_transfer="half"}'),
    "reduce_dtype": ("fp8", "fp8", 'phaze-place-devices{reduce_dtype="fp8"}'),
    "fsdp_version": ("3", "3", 'phaze-place-devices{fsdp_version="3"}'),
    "memory_headroom": (1.0, "1", "phaze-place-devices{memory_headroom=1.0}"),
    "micro_batches": ((2, 0), "0", None),
    "tp_widths": ((0,), "0", None),
    "seq_len": (0, "0", None),
    "capacity_factor": (0.5, "0.5", None),
    "power_cap_w": (-1.0, "-1", None),
    "selective_recompute": ("layer:0", "layer:0", 'phaze-insert-recompute{selective="layer:0"}'),
    "context_parallel": ("0", "0", None),  # the pass takes a degree, not "auto": its own words
    "schedule_time_limit": (0.0, "0", "phaze-schedule-ops{time_limit=0.0}"),
    "schedule_gap": (1.0, "1", "phaze-insert-recompute{gap_limit=1.0}"),
    "schedule_nodes": (-1, "-1", "phaze-schedule-ops{node_limit=-1}"),
    "schedule_max_binaries": (-1, "-1", "phaze-insert-recompute{max_binaries=-1}"),
    # checked as one of their choices (a command line: by argparse)
    "emit": ("x", "x", None),
    "dtype": ("f8", "f8", None),
    "fp8_recipe": ("blockwise", "blockwise", None),
    "optimizer": ("lion", "lion", 'phaze-insert-optimizer{optimizer="lion"}'),
    "objective": ("speed", "speed", None),
    "sequence_parallel": ("yes", "yes", None),
    "tp_overlap": ("maybe", "maybe", None),
    "kernels": ("xla", "xla", 'phaze-form-kernels{runtime="xla"}'),
    "sdpa_order": ("math-first", "math-first", 'phaze-form-kernels{sdpa_order="math-first"}'),
}
CHECKED = {f.name: f for f in dataclasses.fields(Options) if f.metadata.get("check") or f.metadata.get("choices")}


def test_every_checked_option_has_a_bad_value_here():
    assert set(BAD) == set(CHECKED)
    assert all(f.metadata.get("check") for f in dataclasses.fields(PlacementOptions))


def _refused_by_check(name: str) -> OptionError:
    with pytest.raises(OptionError) as info:
        Options(**{name: BAD[name][0]}).check()
    assert info.value.option == name
    return info.value


@pytest.mark.parametrize("name", sorted(BAD))
def test_the_api_the_command_lines_and_the_passes_refuse_alike(name, capsys):
    error = _refused_by_check(name)
    flag, text, spec = option_flag(CHECKED[name]), BAD[name][1], BAD[name][2]
    said = f"{flag}: {error.problem}" if error.names_value else f"{flag} {text}"
    tools = [(phazec, ["m.py", "--hw", "a100"])]
    if option_dest(Options, name) in {a.dest for a in phaze_validate._parser()._actions}:
        tools.append((phaze_validate, ["r.csv", "--hw", "a100"]))
    for tool, argv in tools if text is not None else []:
        try:
            args = tool._parser().parse_args([*argv, flag, text])
        except SystemExit as e:  # a flag with choices: argparse refuses it, naming the flag
            assert e.code == 2 and CHECKED[name].metadata.get("choices")
            assert f"argument {flag}: invalid choice: '{text}'" in capsys.readouterr().err
            continue
        with pytest.raises(PhazeError) as info:
            tool.check_flags(args)
        assert str(info.value).startswith(said) and str(info.value).endswith(error.problem), str(info.value)
    if spec is not None:
        (pass_,) = PassPipeline.parse_spec(ALL_PASSES, spec).passes
        with pytest.raises(PhazeError) as info:
            pass_.apply(make_context(), ModuleOp([]))
        option = spec[spec.index("{") + 1 : spec.index("=")]
        where = "" if error.names_value else f"{option}="
        assert str(info.value).startswith(f"{pass_.name}: {where}"), str(info.value)
        assert str(info.value).endswith(error.problem), str(info.value)


def test_an_api_caller_is_told_the_flag_and_a_pass_its_option():
    """``Options.check()`` names the field as a caller writes it (``devices=0``); the compile
    entry (``driver.check_options``) names the flag, as the command line does."""
    from phaze.driver import check_options

    assert str(_refused_by_check("schedule_gap")) == "schedule_gap=1.0: expected a relative gap in [0, 1)"
    with pytest.raises(PhazeError, match=r"^--solver-gap 1\.0: expected a relative gap in \[0, 1\)$"):
        check_options(Options(schedule_gap=1.0))
    says = r"^--micro-batch 0: expected a positive integer up to 2\.15 G \(2,147,483,647\)$"
    with pytest.raises(PhazeError, match=says):
        check_options(Options(micro_batches=(1, 0)))
    with pytest.raises(PhazeError, match=r"^--recompute: recompute 'x': expected one of "):
        check_options(Options(recompute="x"))


def test_a_tuple_option_is_checked_value_by_value_and_none_where_allowed():
    Options(tp_widths=None, seq_len=None, capacity_factor=None, power_cap_w=None).check()
    with pytest.raises(OptionError, match=r"^micro_batches=4: expected a tuple of values$"):
        Options(micro_batches=4).check()  # type: ignore[arg-type]
    with pytest.raises(OptionError, match=r"^devices=None: expected a positive integer"):
        Options(devices=None).check()  # type: ignore[arg-type]


def test_the_help_spells_the_presets_and_the_solver_defaults_from_the_code():
    """``--hw``'s presets are the shipped ones, the solver's defaults Options' and the search's."""
    from phaze.search.engine import SolverLimits
    from phaze_ir.hardware import preset_names

    text = " ".join(phazec._parser().format_help().split())
    assert f"a preset ({', '.join(preset_names())}) or a hardware TOML file" in text
    limits = SolverLimits()
    assert f"(default: {Options.schedule_time_limit:g} with --hw, {limits.time_limit:g} when searching)" in text
    assert f"(default: {Options.schedule_max_binaries} with --hw, {limits.max_binaries} when searching)" in text
    assert re.search(r"\{\w+(\.\w+)+\}", text) is None  # every {dotted.name} spelled
    assert f"a preset ({', '.join(preset_names())})" in " ".join(phaze_validate._parser().format_help().split())


def test_a_long_bad_text_value_is_quoted_cut():
    """A bad text option of 5,000 characters is said in one short line, at every edge."""
    long = "x" * 5000
    with pytest.raises(OptionError) as info:
        Options(selective_recompute=long).check()
    assert len(str(info.value)) < 300 and str(info.value).startswith("selective_recompute='xxx")
    assert len(info.value.named("--selective-recompute")) < 300
