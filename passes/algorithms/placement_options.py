"""The placement options, declared once.

How the step is spread over the devices is set by thirteen options. Each is declared here, once,
with its default, its help text and the check of its value; everything else that takes them is
built from this class rather than spelling them again:

- ``phaze-place-devices`` (the pass) inherits its options from it, so a pipeline spec sets them
  (``phaze-place-devices{recompute=full}``) and ``phaze-opt --help-pass`` shows their help;
- phazec's ``Options`` and the search's ``Params`` inherit them (``Options`` declares its own
  options with the same :func:`option`);
- the command lines of ``phazec`` and ``phaze-validate`` add their flags from the metadata
  (``phaze.tools.flags.add_option_arguments``);
- :meth:`PlacementOptions.check` checks them all, once, at each edge (the command line, the
  pass, an API caller's options), before any work, and the problem the Rust DP solves reads the
  parsed values.

An option's check is declared here once, on its field (:func:`option`), and each edge says a
bad value in its own names (:class:`OptionError`): a command line names the flag
(``--devices 0: expected ...``), a pass its option (``devices=0: expected ...``). The checks of
numbers that other options share are here too (:func:`positive_count`, :func:`positive_number`,
the solver's limits): ``phaze.options.Options`` and the scheduling passes' options
(``passes/solver_options.py``) declare theirs with them, the solver's limits under the names
each gives them (``node_limit``, ``--solver-nodes``).

The placement options' values are the text a user writes (``"interleaved:2"``, ``"auto"``), as
pass options must be (xDSL parses ints, floats, bools and strings); ``placement.problem`` parses
them for the DP. An option that declares a ``parse`` (:func:`option`) is held as what that parses
it into (an int or ``AUTO``, a ``TextEnum``: ``passes/algorithms/option_values.py``): its text is parsed
once, when the options are made (a command line's, an API caller's, a search's), and code
compares the value against members (``opts.tp_overlap is Tristate.ON``), never against text.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import Field, dataclass, field, fields
from typing import Any

from passes.algorithms import placement as pl
from passes.algorithms.option_values import Auto, PipelineSchedule, RankOrder, Recompute, Zero
from phaze_ir.files import excerpt, si_count


def option(
    default: Any,
    check: Callable[[Any], object] | str | None = None,
    help: str = "",
    *,
    choices: tuple[str, ...] | str | None = None,
    metavar: str | None = None,
    flag: str | None = None,
    default_words: str | None = None,
    parse: Callable[[str], object] | str | None = None,
) -> Any:
    """A field that is an option: with the check of its value (None: any value; or the dotted
    name of the function, imported when a value is checked; see :func:`check_option`) and what
    a command line shows of it (``phaze.tools.flags.add_option_arguments``): its help (the
    default is added to it, in ``default_words`` when given), its choices or the shape of its
    value (``metavar``), and its flag where that is not the field's name (``--solver-gap`` for
    ``schedule_gap``).

    The check of a value returns what is wrong with it in words (``"expected a relative gap in
    [0, 1)"``), or None when it is right; the edge names the option and the value before them.
    A text option's check is its parser (:func:`parsed_by`), whose ``PlacementError`` names the
    value itself (``recompute 'x': expected ...``); the edge names the option before it. A
    tuple option's check is of each of its values, and None is right where the field's type
    allows it.

    ``choices`` is the tuple of values, or the dotted name of the one that declares them
    (``"passes.algorithms.kernels.RUNTIMES"``), imported only when a command line is built: the
    option need not import the pass or the search that owns its values. ``help`` and
    ``default_words`` may name such values too, as ``{dotted.name}`` (a tuple, a function
    giving one, or a value), spelled when the command line shows its help
    (``phaze.tools.flags.ToolParser``).

    ``parse`` (a function, or its dotted name) makes the option a typed one: the text a command
    line or an API caller gives is parsed by it once, when the options are made
    (:meth:`PlacementOptions.__post_init__`), and the field holds what it returns; a text it
    refuses stays text, for :meth:`PlacementOptions.check` to say what is wrong with it. The
    edges take such an option as text (``--context-parallel 2``, ``context_parallel="2"``)."""
    metadata = {"check": check, "help": help, "choices": choices, "metavar": metavar}
    metadata |= {"flag": flag, "default_words": default_words, "parse": parse}
    return field(default=default, metadata=metadata)


def positive_count(value: object) -> str | None:
    """A count of devices, samples, sizes: an integer from 1 to :data:`~placement.MAX_COUNT`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= pl.MAX_COUNT:
        return f"expected a positive integer up to {si_count(pl.MAX_COUNT)}"
    return None


def positive_number(expected: str) -> Callable[[object], str | None]:
    """The check of a positive, finite number, said as ``expected`` ("a positive number of
    watts") when it is not one."""

    def check(value: object) -> str | None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
            return f"expected {expected}"
        return None

    return check


# The layer-schedule solver's limits, checked alike as the scheduling passes' options
# (``time_limit``, ``gap_limit``, ``node_limit``, ``max_binaries``: ``passes/solver_options.py``)
# and as phazec's flags (``--solver-time-limit``, ...: ``phaze.options.Options``' ``schedule_*``).

#: The check of a layer schedule's time limit.
time_limit_seconds = positive_number("a positive, finite number of seconds")


def relative_gap(value: object) -> str | None:
    """The check of the solver's gap limit: a fraction of the objective, 0 to prove optimality."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and 0 <= value < 1):
        return "expected a relative gap in [0, 1)"
    return None


def count_limit(value: object) -> str | None:
    """The check of the solver's node or binaries limit: a count, 0 for no limit."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= pl.MAX_COUNT:
        return f"expected a number from 0 (no limit) to {pl.MAX_COUNT}"
    return None


def parsed_by(parse: Callable[[str], object]) -> Callable[[str], None]:
    """The check of a text option: its parser (``placement.parse_recompute``), whose
    ``PlacementError`` names the value itself; what it parses the value into is for the DP."""

    def check(text: str) -> None:
        parse(text)

    return check


def _placement(text: str) -> None:
    """The placement's form; ``expert``'s degrees are the model's, known once it is loaded."""
    if text != "expert":
        pl.parse_placement(text, "")


def _flag(value: bool) -> None:
    if not isinstance(value, bool):
        raise pl.PlacementError(f"dp overlap {value!r}: expected true or false")


def _dp_shard(value: object) -> str | None:
    """HSDP's shard group: 0 (no HSDP) or a count of DP ranks."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= pl.MAX_COUNT:
        return f"expected 0 (shard over the whole DP group) or a shard group size up to {si_count(pl.MAX_COUNT)}"
    return None


def _expert_tensor_parallel(value: object) -> str | None:
    """Expert tensor parallelism: 0 (the TP width) or a width."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= pl.MAX_COUNT:
        return f"expected 0 (the TP width) or an expert tensor-parallel width up to {si_count(pl.MAX_COUNT)}"
    return None


def _fp8_params_flag(value: bool) -> None:
    if not isinstance(value, bool):
        raise pl.PlacementError(f"fp8 params {value!r}: expected true or false")


@dataclass(frozen=True, kw_only=True)
class PlacementOptions:
    """What ``phaze-place-devices`` needs besides the priced module; the defaults are the
    paper's placement space (plain data parallelism, 1F1B, every replica holding every expert)
    with the device numbering chosen."""

    devices: int = option(1024, positive_count, "accelerators in the cluster", metavar="N")
    global_batch: int = option(4096, positive_count, "samples per training step", metavar="N")
    placement: str = option(
        "phaze",
        _placement,
        "phaze searches the placement; expert evaluates the paper's expert placement of the model "
        "(docs/design.md), expert:PP,DP,TP a given one (a fixed placement that does not fit is still "
        "written, with feasible = no and the binding constraint)",
        metavar="phaze|expert|expert:PP,DP,TP",
    )
    dp_overlap: bool = option(False, _flag, "hide the DP gradient all-reduce behind the stage's backward")
    fp8_params: bool = option(
        False,
        _fp8_params_flag,
        "FP8 primary weights (--dtype fp8): the FP8 linears' weights are kept as Transformer Engine's FP8 "
        "tensors (rowwise and columnwise, 2 bytes an element) in place of their bf16 copies, so no FP8 "
        "copies are cast and cached beside them, and ZeRO's parameter all-gathers move 1 byte an element of "
        "them: Megatron-LM's --fp8-param-gather, NeMo's fp8_params, TE's fp8_model_init",
    )
    dp_shard: int = option(
        0,
        _dp_shard,
        "HSDP, as torch's fully_shard on a 2-D device mesh runs it (torchtitan's data_parallel_shard_degree): "
        "ZeRO 2/3 shards over groups of N consecutive DP ranks, which are replicas of each other, and every "
        "layer's sharded gradients are all-reduced across the DP / N replicas after their reduce-scatter; "
        "0 shards over the whole DP group (FSDP). Needs --zero 2 or 3; N must divide DP",
        metavar="N",
    )
    recompute: Recompute = option(
        Recompute.AUTO,
        parsed_by(pl.parse_recompute),
        "activation recompute: auto lets the placement choose each stage's policy; none, selective or full "
        "fixes it for every stage, to price a run as it is run",
        choices=pl.RECOMPUTE_SETTINGS,
        parse=Recompute,
    )
    zero: Zero = option(
        Zero.PLAIN,
        parsed_by(pl.parse_zero),
        "sharding over data parallelism: 0 plain; 1 optimizer state (Megatron's distributed optimizer); "
        "2 and gradients; 3 and parameters (FSDP); auto lets the placement choose",
        choices=pl.ZERO_SETTINGS,
        parse=Zero,
    )
    pipeline_schedule: PipelineSchedule = option(
        PipelineSchedule("1f1b", 1),
        parsed_by(pl.parse_pipeline_schedule),
        "1f1b; interleaved:V, Megatron's interleaved 1F1B with V model chunks per device; auto lets the "
        "placement choose",
        metavar="auto|1f1b|interleaved:V",
        parse=pl.pipeline_schedule,
    )
    expert_parallel: int | Auto = option(
        1,
        parsed_by(pl.parse_expert_parallel),
        "expert parallelism of an MoE model: 1, every data-parallel replica holds every expert; E splits "
        "the experts over E replicas (all-to-all dispatch and combine); auto lets the placement choose",
        metavar="auto|E",
        parse=pl.expert_parallel,
    )
    expert_tensor_parallel: int = option(
        0,
        _expert_tensor_parallel,
        "expert tensor parallelism, Megatron-core's --expert-tensor-parallel-size (MoE parallel folding): "
        "each expert's weights split over K devices; below the TP width the experts get their own mesh over "
        "a stage's TP x CP x DP devices (ETP innermost, then EP, then the experts' data parallelism), so EP "
        "may be wider than DP (e.g. TP 8, DP 1, EP 8 at K = 1). 0 is the TP width; K must divide it",
        metavar="K",
    )
    rank_order: RankOrder = option(
        RankOrder.AUTO,
        parsed_by(pl.parse_rank_order),
        "how devices are numbered into groups, TP innermost: auto lets the placement choose; tp-dp-pp, "
        "pipeline outermost (Megatron-LM's and torchtitan's default); tp-pp-dp, data parallelism outermost "
        "(Megatron-LM's --use-tp-pp-dp-mapping). An --export torchtitan (or megatron with expert "
        "parallelism) makes auto tp-dp-pp",
        choices=pl.RANK_ORDER_SETTINGS,
        parse=RankOrder,
    )
    reduce_dtype: str = option(
        "fp32",
        parsed_by(pl.parse_reduce_dtype),
        "dtype of the DP gradient all-reduce (ZeRO 0/1) or reduce-scatter (ZeRO 2/3): fp32, as Megatron-LM "
        "--bf16 runs without --grad-reduce-in-bf16 and torchtitan's FSDP2 (mixed_precision_reduce float32); "
        "bf16, as fms-fsdp's FSDP policy and Megatron-LM --grad-reduce-in-bf16",
        choices=tuple(pl.REDUCE_DTYPES),
    )
    fsdp_version: str = option(
        "2",
        parsed_by(pl.parse_fsdp_version),
        "the FSDP a ZeRO-3 plan runs under, whose copies into and out of its flat buffers are priced: 2, "
        "torch's fully_shard (torchtitan), copies each gathered layer out of its all-gather buffer and its "
        "gradients into the reduce-scatter's; 1, torch's FullyShardedDataParallel with use_orig_params=False "
        "(fms-fsdp), gathers into the flat parameter its views read and flattens and pre-divides the gradients",
        choices=tuple(pl.FSDP_VERSIONS),
    )
    pipeline_transfer: str = option(
        "whole",
        parsed_by(pl.parse_pipeline_transfer),
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

    def __post_init__(self) -> None:
        # Each typed option's text parsed, once: the value everything after compares.
        for f in fields(self):
            value = getattr(self, f.name)
            if f.metadata.get("parse") is not None and isinstance(value, str):
                try:
                    parsed = parsed_option(f, value)
                except ValueError:  # left as given: check() says what is wrong with it
                    continue
                object.__setattr__(self, f.name, parsed)

    def check(self) -> None:
        """Every option's value checked (those of a subclass too: ``phaze.options.Options``),
        in declaration order: an :class:`OptionError` naming the first bad one (the fixed
        placement's degrees are checked against the model later, by
        :func:`~passes.algorithms.placement.parse_placement`)."""
        for f in fields(self):
            check_option(f, getattr(self, f.name))


def check_option(f: Field, value: object) -> None:
    """``value`` checked by the check field ``f`` declares (:func:`option`; with none, one of
    its choices where it declares them, else any value): an :class:`OptionError` when it is
    wrong."""
    check = f.metadata.get("check")
    if f.metadata.get("parse") is not None and type(value) is not str:
        return  # parsed (PlacementOptions.__post_init__), or given as the parsed value
    if check is None and f.metadata.get("choices") is not None:
        check = _one_of(declared_choices(f))
    annotation = field_type(f)
    if check is None or (value is None and annotation.endswith(" | None")):
        return
    check = _named(check)
    values = (value,)
    if annotation.startswith("tuple["):
        if not isinstance(value, tuple):
            raise OptionError(f, value, "expected a tuple of values")
        values = value
    for one in values:
        try:
            problem = check(one)
        except pl.PlacementError as e:
            raise OptionError(f, one, str(e), names_value=True) from e
        if problem is not None:
            raise OptionError(f, one, problem)


def _named(function: Callable | str) -> Callable:
    """``function``, or the function its dotted name names (imported now)."""
    if isinstance(function, str):
        module, _, name = function.rpartition(".")
        return getattr(importlib.import_module(module), name)
    return function


def parsed_option(f: Field, text: str) -> Any:
    """``text`` as option field ``f`` holds it: parsed by the ``parse`` it declares
    (:func:`option`; a ``ValueError`` when it refuses it), as given when it declares none."""
    parse = f.metadata.get("parse")
    return text if parse is None else _named(parse)(text)


def declared_choices(f: Field) -> tuple[str, ...]:
    """The values option field ``f`` may take, as it declares them (:func:`option`'s
    ``choices``: the tuple, or the dotted name of the one that declares them, imported here)."""
    choices = f.metadata["choices"]
    if isinstance(choices, str):
        module, _, name = choices.rpartition(".")
        choices = getattr(importlib.import_module(module), name)
    return tuple(choices)


def _one_of(choices: tuple[str, ...]) -> Callable[[object], str | None]:
    """The check of an option with ``choices`` and no check of its own."""

    def check(value: object) -> str | None:
        return None if value in choices else f"expected one of {', '.join(choices)}"

    return check


def field_type(f: Field) -> str:
    """The annotation of field ``f`` as it is written (``tuple[int, ...] | None``): a string, as
    the dataclasses of ``from __future__ import annotations`` keep it."""
    return str(getattr(f.type, "__name__", f.type))


def option_flag(f: Field) -> str:
    """The command-line flag of option field ``f``: the one it declares, else ``--global-batch``
    for ``global_batch``."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


#: The most characters of an integer a message shows; a longer one is its first digits and count.
_LONGEST_SHOWN = 24


class OptionError(pl.PlacementError):
    """A bad option value: ``option`` is its field's name, ``flag`` its command-line flag,
    ``value`` the value (one of a tuple option's), ``problem`` what is wrong with it. Said as
    an API caller or a pass names the option, ``devices=0: expected a positive integer up to
    2.15 G (2,147,483,647)`` (or as the problem alone where it names the value: ``recompute 'x': expected
    ...``); :meth:`named` says it under another name (a flag)."""

    def __init__(self, f: Field, value: object, problem: str, names_value: bool = False) -> None:
        self.option, self.flag, self.value, self.problem = f.name, option_flag(f), value, problem
        #: The problem names the value itself (a text option's parser said it).
        self.names_value = names_value
        super().__init__(problem if names_value else self.named(f.name, "="))

    def named(self, name: str, between: str = " ") -> str:
        """The one line that says it, naming the option ``name``: ``--solver-gap 1.0: expected a
        relative gap in [0, 1)`` (``between`` the name and the value: a space), or, where the
        problem names the value, ``--recompute: recompute 'x': expected one of ...``. A text
        value after a flag is shown as typed, after ``=`` as the Python literal an API caller
        writes."""
        if self.names_value:
            return f"{name}: {self.problem}"
        value = excerpt(self.value) if isinstance(self.value, str) else self.value
        shown = value if between == " " and isinstance(value, str) else repr(value)
        if isinstance(self.value, int) and len(shown) > _LONGEST_SHOWN:  # `--devices 999...9` (400 digits)
            digits = str(abs(self.value))
            shown = f"{'-' if self.value < 0 else ''}{digits[:12]}… ({len(digits):,} digits)"
        return f"{name}{between}{shown}: {self.problem}"
