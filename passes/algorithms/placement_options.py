"""The placement options, declared once.

How the step is spread over the devices is set by eleven options. Each is declared here, once,
with its default, its help text and the check of its value; everything else that takes them is
built from this class rather than spelling them again:

- ``phaze-place-devices`` (the pass) inherits its options from it, so a pipeline spec sets them
  (``phaze-place-devices{recompute=full}``) and ``phaze-opt --help-pass`` shows their help;
- phazec's ``Options`` and the search's ``Params`` inherit them (``Options`` declares its own
  options with the same :func:`option`);
- the command lines of ``phazec`` and ``phaze-validate`` add their flags from the metadata
  (``phaze.tools.flags.add_option_arguments``);
- :meth:`PlacementOptions.check` checks them all, once, at each edge (the command line, the
  pass), before any work, and the problem the Rust DP solves reads the parsed values.

Values are the text a user writes (``"interleaved:2"``, ``"auto"``), as pass options must be
(xDSL parses ints, floats, bools and strings); ``placement.problem`` parses them for the DP.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from passes.algorithms import placement as pl


def option(
    default: Any,
    check: Callable[[Any], object] | None = None,
    help: str = "",
    *,
    choices: tuple[str, ...] | str | None = None,
    metavar: str | None = None,
    flag: str | None = None,
    default_words: str | None = None,
) -> Any:
    """A field that is an option: with the check of its value (it raises a one-line
    ``PlacementError``; None where the option is checked elsewhere) and what a command line
    shows of it (``phaze.tools.flags.add_option_arguments``): its help (the default is added to
    it, in ``default_words`` when given), its choices or the shape of its value (``metavar``),
    and its flag where that is not the field's name (``--solver-gap`` for ``schedule_gap``).

    ``choices`` is the tuple of values, or the dotted name of the one that declares them
    (``"passes.algorithms.kernels.RUNTIMES"``), imported only when a command line is built: the
    option need not import the pass or the search that owns its values."""
    metadata = {"check": check, "help": help, "choices": choices, "metavar": metavar}
    metadata |= {"flag": flag, "default_words": default_words}
    return field(default=default, metadata=metadata)


def _count(what: str):
    def check(value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= pl.MAX_COUNT:
            raise pl.PlacementError(f"{what} = {value}: expected a positive integer up to {pl.MAX_COUNT}")

    return check


def _placement(text: str) -> None:
    """The placement's form; ``expert``'s degrees are the model's, known once it is loaded."""
    if text != "expert":
        pl.parse_placement(text, "")


def _flag(value: bool) -> None:
    if not isinstance(value, bool):
        raise pl.PlacementError(f"dp overlap {value!r}: expected true or false")


@dataclass(frozen=True, kw_only=True)
class PlacementOptions:
    """What ``phaze-place-devices`` needs besides the priced module; the defaults are the
    paper's placement space (plain data parallelism, 1F1B, every replica holding every expert)
    with the device numbering chosen."""

    devices: int = option(1024, _count("devices"), "accelerators in the cluster", metavar="N")
    global_batch: int = option(4096, _count("global batch"), "samples per training step", metavar="N")
    placement: str = option(
        "phaze",
        _placement,
        "phaze searches the placement; expert evaluates the paper's expert placement of the model "
        "(docs/design.md), expert:PP,DP,TP a given one (a fixed placement that does not fit is still "
        "written, with feasible = no and the binding constraint)",
        metavar="phaze|expert|expert:PP,DP,TP",
    )
    dp_overlap: bool = option(False, _flag, "hide the DP gradient all-reduce behind the stage's backward")
    recompute: str = option(
        "auto",
        pl.parse_recompute,
        "activation recompute: auto lets the placement choose each stage's policy; none, selective or full "
        "fixes it for every stage, to price a run as it is run",
        choices=pl.RECOMPUTE_SETTINGS,
    )
    zero: str = option(
        "0",
        pl.parse_zero,
        "sharding over data parallelism: 0 plain; 1 optimizer state (Megatron's distributed optimizer); "
        "2 and gradients; 3 and parameters (FSDP); auto lets the placement choose",
        choices=pl.ZERO_SETTINGS,
    )
    pipeline_schedule: str = option(
        "1f1b",
        pl.parse_pipeline_schedule,
        "1f1b; interleaved:V, Megatron's interleaved 1F1B with V model chunks per device; auto lets the "
        "placement choose",
        metavar="auto|1f1b|interleaved:V",
    )
    expert_parallel: str = option(
        "1",
        pl.parse_expert_parallel,
        "expert parallelism of an MoE model: 1, every data-parallel replica holds every expert; E splits "
        "the experts over E replicas (all-to-all dispatch and combine); auto lets the placement choose",
        metavar="auto|E",
    )
    rank_order: str = option(
        "auto",
        pl.parse_rank_order,
        "how devices are numbered into groups, TP innermost: auto lets the placement choose; tp-dp-pp, "
        "pipeline outermost (Megatron-LM's and torchtitan's default); tp-pp-dp, data parallelism outermost "
        "(Megatron-LM's --use-tp-pp-dp-mapping). An --export torchtitan (or megatron with expert "
        "parallelism) makes auto tp-dp-pp",
        choices=pl.RANK_ORDER_SETTINGS,
    )
    pipeline_transfer: str = option(
        "whole",
        pl.parse_pipeline_transfer,
        "how a pipeline transfer crosses a stage boundary: whole, every TP rank sends the boundary's values "
        "(Megatron-LM); split, each sends 1/t and the next stage's TP group all-gathers them (DeepSpeed's "
        "pipeline engine, Megatron-DeepSpeed; what phaze-validate prices). No effect under sequence "
        "parallelism",
        choices=pl.PIPELINE_TRANSFERS,
    )
    memory_headroom: float = option(
        0.0,
        pl.check_memory_headroom,
        "leave this fraction of each device's HBM free (0 <= F < 1): for what the memory model does not "
        "count (the CUDA context, the allocator's fragmentation) and its error; a memory refusal names it",
        metavar="F",
    )

    def check(self) -> None:
        """Every option's value checked, in declaration order: a :class:`OptionError` naming the
        first bad one (the fixed placement's degrees are checked against the model later, by
        :func:`~passes.algorithms.placement.parse_placement`)."""
        for f in fields(PlacementOptions):
            try:
                f.metadata["check"](getattr(self, f.name))
            except pl.PlacementError as e:
                raise OptionError(f.name, str(e)) from e


class OptionError(pl.PlacementError):
    """A bad placement option; ``option`` is its field's name (a command line shows its flag)."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option
