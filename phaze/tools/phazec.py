"""``phazec``: the phaze compiler driver.

``phazec MODEL.py -o OUT.mlir`` searches the accelerator architecture (the paper's space, or
``--space FILE.toml``) jointly with the placement: for micro-batch sizes 1, 2, 4, 8, TP widths
1, 2, 4, 8, recompute policies and HBM capacities, exactly (branch and bound,
``phaze/search``), and writes the best chip (``phaze.accelerator``) and its plan, with the
baselines (TPUv4-like chip with the expert and with the searched placement, the decoupled
search) in ``phaze.baselines``, ``--json`` and ``--report``.  ``phazec a.py b.py -o common.mlir``
finds one chip for several models (best mean throughput).

``phazec MODEL.py --hw CHIP`` compiles for one given accelerator instead: the training step is
sharded, priced on it, scheduled, given recompute options and placed on ``--devices``
accelerators by the exact DP for each micro-batch size and TP width; the best plan is written
(``--report``: with its pipeline timeline and memory as an HTML page).
``--emit STAGE`` stops earlier (the stages are listed in ``phaze/pipeline.py``).

Bad input (a missing or broken model file, an untraceable model, a bad option) gets a one-line
error and exit status 1; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from passes.algorithms.placement_options import PlacementOptions
from phaze.messages import INTERRUPTED, PartialOutput, exit_status, install_error_hook, log_line, show_warnings_as
from phaze.options import Options, Stage
from phaze.outputs import refuse_clashes, write_stdout, write_together
from phaze.points import NoPlanFits
from phaze.tools.flags import (
    SOLVER_FIELDS,
    ToolParser,
    add_cache_limit_argument,
    add_option_arguments,
    add_output_arguments,
    add_worker_arguments,
    check_jobs,
    check_option_flags,
    option_values,
    parsed_flag,
    trim_cache_dir,
)
from phaze_ir.errors import PhazeError

if TYPE_CHECKING:
    from rich.progress import TaskID


HELP_EXAMPLES = """examples:
  phazec examples/gpt2_xl.py -o plan.mlir
      search the paper's architecture space for GPT-2 XL's chip and placement
  phazec examples/llama3_8b.py --hw h100 --devices 64 --global-batch 256 -o plan.mlir --json plan.json
      the best placement of Llama 3 8B on 64 H100s, as PyTorch eager runs it (SDPA attention) under
      bf16 autocast, ZeRO, sequence parallelism, schedule and recompute chosen (a GPU's defaults)
  phazec examples/llama2_7b.py --hw a100 --devices 8 --global-batch 64 --placement expert:1,2,4 \\
      --export megatron launch.args -o plan.mlir
      price one placement (PP 1, DP 2, TP 4) and write its Megatron-LM flags
  phazec MODEL.py --emit latency -o step.mlir
      stop after a pipeline stage (phaze-opt runs the rest, or your own passes)
"""


def _output_flags(out: argparse._ArgumentGroup) -> None:
    """What is written, and where."""
    out.add_argument("-o", "--output", default="-", help="output .mlir file ('-' for stdout, the default)")
    add_option_arguments(out, Options, ["emit"])
    out.add_argument("--json", metavar="FILE", help="also write the plan as JSON (plan stage)")
    out.add_argument(
        "--report",
        metavar="FILE.html",
        help="also write a self-contained HTML report (plan stage): of the search, or with --hw of the plan "
        "(its pipeline timeline and memory per stage)",
    )
    out.add_argument(
        "--export",
        nargs=2,
        action="append",
        metavar=("{megatron,torchtitan}", "FILE"),
        help="also write the plan as that framework's command-line arguments, one per line (with --hw; "
        "may be given for each target; docs/launch.md)",
    )
    out.add_argument(
        "--write-infeasible",
        action="store_true",
        help="when no placement fits, still compile and write the plan (-o or stdout, --json, --report), which "
        "says which constraint binds; without it such a run writes nothing and stops as soon as it knows",
    )


def _model_flags(model: argparse._ArgumentGroup) -> None:
    """The model and its training step."""
    add_option_arguments(
        model,
        Options,
        ("micro_batches", "tp_widths", "seq_len", "dtype", "fp8_recipe", "kernels", "sdpa_order", "optimizer"),
        # None: not asked (the chip's runtime decides, :func:`phaze.driver.runtime_defaults`),
        # which an --export says too (``ModelFacts.dtype_asked``)
        defaults={"dtype": None, "kernels": None, "fp8_recipe": None},
        default_words=RUNTIME_DEFAULT_WORDS,
        notes={"kernels": "used with --hw"},
    )


def _cluster_flags(p: argparse.ArgumentParser) -> None:
    """The chip, the cluster and the placement options (declared in ``PlacementOptions``)."""
    chip = p.add_argument_group("the chip and the cluster")
    add_option_arguments(
        chip,
        Options,
        ("hw", "devices", "global_batch"),
        defaults={"hw": None},
        default_words={"hw": f"search the architecture; stages before 'plan' compile for {Options.hw}"},
        notes={"hw": "compile for it instead of searching the architecture"},
    )
    place = p.add_argument_group("placement (how the step is spread over the devices)")
    add_option_arguments(
        place,
        PlacementOptions,
        [f.name for f in dataclasses.fields(PlacementOptions) if f.name not in ("devices", "global_batch")],
        defaults={"memory_headroom": None, "zero": None, "pipeline_schedule": None, "dp_overlap": None},
        default_words={
            "memory_headroom": "the chip's calibration.memory_headroom (the h100's is fitted on its measured "
            "steps, docs/validation.md), else 0",
        }
        | RUNTIME_DEFAULT_WORDS,
    )
    add_option_arguments(
        place,
        Options,
        ("context_parallel", "sequence_parallel", "tp_overlap", "selective_recompute", "capacity_factor"),
        defaults={"sequence_parallel": None, "selective_recompute": None},
        default_words=RUNTIME_DEFAULT_WORDS,
    )


#: The defaults of the options that name the runtime (``phaze.driver.runtime_defaults``): what a
#: practitioner runs on a CUDA GPU, the paper's settings on its accelerators and in the search.
RUNTIME_DEFAULT_WORDS = {
    "kernels": "on a GPU (--hw a100, h100...) eager, or the --export target's (megatron: megatron; "
    "torchtitan: eager); on the paper's chips and in the architecture search ops",
    "dtype": "on a GPU amp-bfloat16 (amp-float16 before Ampere); on the paper's chips and in the architecture "
    "search float16, which --export launches as bf16 where the chip has it",
    "zero": "auto on a GPU; 0 on the paper's chips and in the architecture search",
    "sequence_parallel": "auto on a GPU; off on the paper's chips and in the architecture search",
    "pipeline_schedule": "auto on a GPU; 1f1b on the paper's chips and in the architecture search",
    "selective_recompute": "on a GPU op (torchtitan's default for its Llama 3 configs) under eager or inductor "
    "kernels, attention (Megatron-LM's) under megatron; attention on the paper's chips and in the architecture "
    "search",
    "dp_overlap": "on on a GPU under eager or inductor kernels (PyTorch's DDP and FSDP overlap their gradient "
    "collectives with the backward); off under megatron (Megatron-LM's --overlap-grad-reduce is off unless "
    "asked), on the paper's chips and in the architecture search",
}


#: The solver's limits the search sets otherwise than a compilation (the gap is the same):
#: ``Options``' fields and the search's names of them (``phaze.search.engine.SolverLimits``).
SEARCH_LIMITS = {
    "schedule_time_limit": "time_limit",
    "schedule_nodes": "node_limit",
    "schedule_max_binaries": "max_binaries",
}

#: Their defaults in words, spelled from the code when the help is shown: the compilation's
#: (``Options``') with ``--hw``, the search's (:func:`solver_defaults`) without.
SOLVER_DEFAULT_WORDS = {
    name: f"{{phaze.options.Options.{name}}} with --hw, {{phaze.search.engine.SolverLimits.{limit}}} when searching"
    + (": unlike the clock, a node limit gives the same answer on any machine" if name == "schedule_nodes" else "")
    for name, limit in SEARCH_LIMITS.items()
}


def _goal_flags(p: argparse.ArgumentParser) -> None:
    """What is optimised, and the scheduling solver's limits."""
    add_option_arguments(p.add_argument_group("what is optimised"), Options, ("objective", "power_cap_w"))
    solver = p.add_argument_group("the operator-scheduling solver (SCIP)")
    # None: the default of the run, with --hw or searching (:func:`solver_defaults`)
    unset = dict.fromkeys(SOLVER_DEFAULT_WORDS)
    add_option_arguments(solver, Options, SOLVER_FIELDS, defaults=unset, default_words=SOLVER_DEFAULT_WORDS)


def _count(text: str) -> int:
    """A budget's value: a whole number, 0 or more (0: no limit)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number, 0 or more (0: no limit)")
    return value


def _run_flags(p: argparse.ArgumentParser) -> None:
    """The cache, the search's workers and the diagnostics."""
    cache_g = p.add_argument_group("cache")
    cache = cache_g.add_mutually_exclusive_group()  # --cache D --no-cache: which one was meant?
    cache.add_argument(
        "--cache",
        default=None,
        metavar="DIR",
        help="cache of prepared models, layer schedules and answers: the same question asked again is "
        "answered from it, an interrupted search resumes from it (default $XDG_CACHE_HOME/phaze or "
        "~/.cache/phaze)",
    )
    cache.add_argument("--no-cache", action="store_true", help="keep nothing on disk, read nothing from it")
    add_cache_limit_argument(cache_g)
    s = p.add_argument_group("architecture search (no --hw)")
    s.add_argument(
        "--space", metavar="FILE.toml", help="architecture space (default: the paper's, docs/design.md §4.3)"
    )
    add_worker_arguments(s, "candidates")
    s.add_argument("--no-baselines", action="store_true", help="skip the baselines")
    s.add_argument(
        "--no-prune",
        action="store_true",
        help="evaluate every candidate exactly (plain enumeration; for checking, slow)",
    )
    s.add_argument(
        "--max-exact",
        type=_count,
        default=None,
        metavar="N",
        help="refuse, in one line, a search that would evaluate more than N architectures exactly "
        "(default {phaze.search.engine.SearchBudget.exact}; the published models need 8 to 50; 0: no limit)",
    )
    s.add_argument(
        "--max-dp-bound",
        type=_count,
        default=None,
        metavar="N",
        help="refuse a search whose DP bounds would take more than N solves×layers "
        "(default {phaze.search.engine.SearchBudget.dp_bound_layers}; 0: no limit)",
    )
    misc = p.add_argument_group("diagnostics")
    add_option_arguments(misc, Options, ["strict"])
    misc.add_argument("--print-op-generic", action="store_true", help="print MLIR's generic op form")
    add_output_arguments(misc)


def _parser() -> argparse.ArgumentParser:
    p = ToolParser(
        prog="phazec",
        description="Compile a PyTorch model file into a phaze plan (MLIR).",
        epilog=HELP_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "models",
        nargs="+",
        metavar="MODEL",
        help="model file defining get_model() and get_inputs(micro_batch_size), or a Hugging Face config.json; "
        "several: one chip for all",
    )
    _output_flags(p.add_argument_group("outputs"))
    _model_flags(p.add_argument_group("the model and its training step"))
    _cluster_flags(p)
    _goal_flags(p)
    _run_flags(p)
    return p


def searching(args: argparse.Namespace) -> bool:
    """No ``--hw`` and the plan stage: the architecture search."""
    return args.hw is None and args.emit == Stage.PLAN


def check_flags(args: argparse.Namespace) -> None:
    """Every option flag of the command line checked by its field's check, and ``-j``, before
    any work (:func:`phaze.tools.flags.check_option_flags`)."""
    check_jobs(args)
    check_option_flags(args, Options)


def rank_order(args: argparse.Namespace):
    """``--rank-order``, with ``auto`` narrowed to ``tp-dp-pp`` where an export asked for can
    launch no other numbering (:func:`phaze.plan.export.pipeline_outermost_only`)."""
    from passes.algorithms.option_values import RankOrder
    from phaze.plan.export import pipeline_outermost_only

    order = parsed_flag(args, Options, "rank_order")
    if order is RankOrder.AUTO and pipeline_outermost_only(args.export, parsed_flag(args, Options, "expert_parallel")):
        return RankOrder.TP_DP_PP
    return order


def memory_headroom(args: argparse.Namespace) -> float:
    """``--memory-headroom``, or the chip's ``calibration.memory_headroom`` (0 without one, or
    without ``--hw``: a searched chip has no calibration)."""
    if args.memory_headroom is not None or not args.hw:
        return args.memory_headroom or 0.0
    from phaze.driver import default_memory_headroom

    return default_memory_headroom(args.hw)


def options(args: argparse.Namespace):
    """The driver options of parsed command-line arguments (checked: :func:`check_flags`)."""
    check_flags(args)

    for flag, given in (("--json", args.json), ("--report", args.report), ("--power-cap", args.power_cap)):
        if given and args.emit != Stage.PLAN:
            raise PhazeError(f"{flag} needs the plan stage (--emit plan)")
    if len(args.models) > 1 and not searching(args):
        raise PhazeError("several models need the architecture search (no --hw, --emit plan)")
    if not searching(args):
        for flag, given in (("--space", args.space), ("--address", args.address)):
            if given:
                raise PhazeError(f"{flag} is for the architecture search; drop --hw (and --emit)")
    search = searching(args)
    if not search and args.objective != Options.objective:
        raise PhazeError(
            f"--objective {args.objective} is for the architecture search (drop --hw); "
            "with --hw the sweep keeps the fastest plan"
        )
    if search:
        # phaze-overlap-tensor-parallel prices it on the chip's SMs
        if parsed_flag(args, Options, "tp_overlap") is not Options.tp_overlap:
            raise PhazeError(
                f"--tp-overlap {args.tp_overlap}: the architecture search's chips have no SM count "
                "([calibration] wave_units) to price the overlap; give --hw CHIP with one (h100)"
            )
    given = option_values(args, Options)
    # rank_order and memory_headroom: "auto" and None are narrowed by the run's exports and chip
    narrowed = {
        "rank_order": rank_order(args),
        "memory_headroom": memory_headroom(args),
        "fp8_recipe": fp8_recipe(args),
    }
    defaults = solver_defaults(search) | runtime_defaults(args, search)
    return Options(**defaults | given | narrowed, unfit_plan=args.write_infeasible)


def fp8_recipe(args: argparse.Namespace) -> str:
    """``--fp8-recipe``, ``auto`` resolved by the exports asked: torchao's rowwise for torchtitan
    (``phaze_ir.frontend.float8_linear.resolve_recipe``), else TE's delayed."""
    from passes.algorithms.option_values import Dtype
    from phaze_ir.frontend.float8_linear import resolve_recipe

    asked = getattr(args, "fp8_recipe", None)
    if asked is not None and parsed_flag(args, Options, "dtype") is not Dtype.FP8:
        raise PhazeError(f"--fp8-recipe {asked}: the FP8 linears' scaling needs --dtype fp8")
    torchtitan = any(target == "torchtitan" for target, _ in getattr(args, "export", None) or ())
    return resolve_recipe(getattr(args, "fp8_recipe", None) or "auto", torchtitan).value


def runtime_defaults(args: argparse.Namespace, search: bool) -> dict[str, str | bool]:
    """The runtime's options where no flag gives them (:data:`RUNTIME_DEFAULT_WORDS`): the
    chip's practitioner runtime with ``--hw`` (:func:`phaze.driver.runtime_defaults`; an
    ``--export`` target's kernels), none (``Options``': the paper's) when searching."""
    if search:
        return {}
    from phaze.driver import runtime_defaults as of_chip

    return of_chip(args.hw or Options.hw, tuple(target for target, _ in args.export or ()), args.kernels)


def solver_defaults(search: bool) -> dict[str, float]:
    """The solver's limits where no flag gives them (:data:`SOLVER_DEFAULT_WORDS`): the search's
    (``phaze.search.engine.SolverLimits``: stopped by nodes, the same answer on any machine)
    when searching, else the compilation's (``Options``')."""
    if not search:
        return {}
    from phaze.search.engine import SolverLimits

    limits = SolverLimits()
    return {name: getattr(limits, limit) or 0 for name, limit in SEARCH_LIMITS.items()}


def search_options(args: argparse.Namespace, opts):
    """The search's options of parsed command-line arguments."""
    import os

    from phaze.search.engine import SearchBudget, SolverLimits
    from phaze.search.run import SearchOptions

    limits = SolverLimits.of_options(opts)
    jobs = args.jobs if args.jobs is not None else max(1, len(os.sched_getaffinity(0)))
    return SearchOptions(
        space=args.space,
        jobs=jobs,
        backend=args.backend,
        address=args.address,
        cache_dir=cache_dir(args),
        limits=limits,
        baselines=not args.no_baselines,
        prune=not args.no_prune,
        budget=SearchBudget(
            exact=SearchBudget.exact if args.max_exact is None else args.max_exact,
            dp_bound_layers=SearchBudget.dp_bound_layers if args.max_dp_bound is None else args.max_dp_bound,
        ),
    )


def trim_cache(args: argparse.Namespace, log) -> None:
    """Keep the run's cache directory under ``--cache-limit`` (:func:`phaze.tools.flags.trim_cache_dir`)."""
    if not args.no_cache:
        trim_cache_dir(cache_path(args), args.cache_limit, log)


def cache_dir(args: argparse.Namespace) -> str | None:
    """The cache directory of the run (``--cache``; default ``$XDG_CACHE_HOME/phaze`` or
    ``~/.cache/phaze``; None with ``--no-cache`` or when it cannot be used)."""
    if args.no_cache:
        return None
    return usable_cache_dir(cache_path(args))


def cache_path(args: argparse.Namespace) -> str:
    """``--cache``, or the default ``$XDG_CACHE_HOME/phaze`` or ``~/.cache/phaze``."""
    if args.cache:
        return args.cache
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "phaze")


def usable_cache_dir(path: str | None) -> str | None:
    """``path`` if the search can keep its cache there (a directory that exists or can be made,
    and can be written), else None after one warning line: a cache only saves time, so the run
    goes on without one."""
    import tempfile
    import warnings

    from phaze_ir.errors import PhazeWarning

    if path is None:
        return None
    try:
        if os.path.exists(path) and not os.path.isdir(path):
            reason = "it is not a directory"
        else:
            os.makedirs(path, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".phaze-probe.", dir=path)
            os.close(fd)
            os.unlink(probe)
            return path
    except OSError as e:
        reason = e.strerror or str(e)
    warnings.warn(
        f"cache directory {path} is not usable ({reason}); running without a cache", PhazeWarning, stacklevel=2
    )
    return None


class RichProgress:
    """The search's progress as rich bars on stderr (``phaze.search.engine.Progress``)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(
            TextColumn("phazec: {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._task: TaskID | None = None

    def start(self, description: str, total: int) -> None:
        if self._task is None:
            self._bar.start()
        else:
            self._bar.stop_task(self._task)
        self._task = self._bar.add_task(description, total=total)

    def advance(self, n: int = 1) -> None:
        if self._task is not None:
            self._bar.advance(self._task, n)

    def stop(self) -> None:
        if self._task is not None:
            task = self._bar.tasks[-1]
            self._bar.update(self._task, completed=task.total)

    def close(self) -> None:
        if self._task is not None:
            self._bar.stop()


def compile_model(args: argparse.Namespace, log) -> tuple[str, str | None]:
    """Run the pipeline the arguments ask for; return the printed module and, when no placement
    fits, the message saying which constraint binds (``--json``, ``--report`` and ``--export``
    are written, together, when asked)."""
    text, failure, files = compiled(args, log)
    refused = _write(files, log)
    if refused:
        raise PartialOutput(*refused)
    return text, failure


#: An output of a run: its path, its text and what it is (said when it is written).
Output = tuple[str, str, str]


def compiled(args: argparse.Namespace, log) -> tuple[str, str | None, list[Output]]:
    """:func:`compile_model` without writing: the printed module, the failure, and the files
    ``--json``, ``--report`` and ``--export`` ask for (not yet written)."""
    opts = options(args)
    if searching(args):
        return _search(args, opts, log)
    from phaze import hw_answer

    result = _launchable_answer(args, opts, log)
    files: list[Output] = []
    if result.plan is not None:
        facts = None
        if args.export:
            from phaze.plan.export import export_warnings, facts_of

            facts = facts_of(result.layer_kinds, result.seq_len, opts, result.model_shape, result.plan)
            facts = dataclasses.replace(facts, dtype_asked=args.dtype is not None)
            # Where a launch runs another runtime than the one priced: in the plan's summary and
            # JSON, and so once on stderr (the summary's lines; under -q, which prints no
            # summary, said here: the summary's other warnings were said as they arose).
            for line in export_warnings(args.export, result.plan, facts):
                if args.quiet:
                    print(log_line("phazec", f"warning: {line}"), file=sys.stderr, flush=True)
        summary = result.plan.get("summary")
        if summary:
            log("plan:\n" + "\n".join(summary["lines"]))
        if facts is not None:  # every export is rendered (or refused) before any output is written
            from phaze.plan.export import export_files

            rendered, refused = export_files(args.export, result.plan, facts, log)
            files += rendered + [("", "", why) for why in refused]  # a refusal: no path, said by _write
        if args.json:
            files.append((args.json, _json_text(result.plan), "the plan's JSON"))
        if args.report:  # also of a plan that does not fit: its header says what binds
            from phaze.search import report

            files.append((args.report, report.render(result.plan), "the report"))
    from phaze.plan.summary import comment as plan_comment

    # The summary heads the plan file as a comment block, which MLIR parsers skip.
    head = plan_comment(result.plan.get("summary")) if result.plan is not None else ""
    return head + result.text, hw_answer.failure(result), files


def _launchable_answer(args: argparse.Namespace, opts, log):
    """``hw_answer.answer`` of ``opts``, its plan the fastest every ``--export`` target launches
    (:func:`phaze.plan.export.launchable`: the ZeRO stages it has, one recompute policy for all
    stages). One sweep: when the fastest plan's placement is refused, its settings are priced
    again under each narrowing and the best launchable point is compiled
    (:func:`phaze.search.sweep.compile_launchable`). A plan refused for what its placement does
    not show (a pipeline split, a question compiled point by point) has each narrowing searched
    as a question of its own (cheap after the first: the settings and compiled points come from
    the cache), and the fastest plan every target launches is kept, the first on a tie. When
    none launches, the plan of ``opts`` stays and the exports say why they are refused."""
    from phaze import hw_answer
    from phaze.options import narrowed
    from phaze.plan.export import facts_of, launchable, refusals
    from phaze.points import NoPlanFits

    def ask(o, launch=None):
        return hw_answer.answer(args.models[0], o, cache_dir(args), log, generic=args.print_op_generic, launch=launch)

    launch = launchable(args.export, opts)
    result = ask(opts, launch)
    if launch is None or result.plan is None or not result.plan.get("feasible"):
        return result

    def refused(r) -> list[str]:
        facts = facts_of(r.layer_kinds, r.seq_len, opts, r.model_shape, r.plan)
        return refusals(args.export, r.plan, dataclasses.replace(facts, dtype_asked=args.dtype is not None))

    first = refused(result)
    if not first:
        return result
    log(f"{first[0]}: searching the plans every --export launches")
    best = None
    for choice in launch.choices:
        try:
            other = ask(narrowed(opts, choice))
        except NoPlanFits:
            continue
        plan = other.plan
        if plan is None or not plan.get("feasible") or refused(other):
            continue
        if best is None or plan["throughput_samples_per_s"] > best.plan["throughput_samples_per_s"]:
            best = other
    # (none launches: the plan of ``opts`` stays, asked unnarrowed when the sweep's was narrowed)
    return best or (ask(opts) if result.narrowed else result)


def _json_text(data) -> str:
    import json

    return json.dumps(data, indent=2, sort_keys=False) + "\n"


def _write(files: list[Output], log) -> list[str]:
    """Write ``files`` together (all or none, :func:`phaze.outputs.write_together`), saying each;
    an entry without a path is an output refused (an export its target cannot launch): its
    message is returned, for a :class:`phaze.messages.PartialOutput` once the run is done."""
    write_together([(path, text) for path, text, _ in files if path])
    for path, _, what in files:
        if path:
            log(f"wrote {path} ({what})")
    return [what for path, _, what in files if not path]


def refuse_output_clashes(args: argparse.Namespace) -> None:
    """Before any work: no output may be an input (a model file, a hardware or space file) or
    another output of the run."""
    inputs = [("the model file", m) for m in args.models] + [("the --space file", args.space)]
    if args.hw and os.path.exists(args.hw):  # a file, not a preset name
        inputs.append(("the --hw file", args.hw))
    from phaze.plan.export import export_outputs

    outputs = [("-o", args.output), ("--json", args.json), ("--report", args.report)]
    refuse_clashes(inputs, outputs + export_outputs(args))


def _search(args: argparse.Namespace, opts, log) -> tuple[str, str | None, list[Output]]:
    """The architecture search (no ``--hw``)."""
    from phaze.search import report
    from phaze.search.run import answer

    sopts = search_options(args, opts)
    progress = RichProgress() if not args.quiet else None
    try:
        text, data = answer(args.models, opts, sopts, log, progress, generic=args.print_op_generic)
    finally:
        if progress is not None:
            progress.close()
    log("baselines:\n" + baseline_table(data))
    if data.get("summary"):
        log("plan:\n" + "\n".join(data["summary"]["lines"]))
        from phaze.plan.summary import comment as plan_comment

        text = plan_comment(data["summary"]) + text
    st = data["search"]
    log(
        "search: "
        + f"{st['architectures']:,} architectures x {st['settings']} settings; pruned "
        + ", ".join(f"{v:,} by {k.replace('_', ' ')}" for k, v in st["pruned"].items())
        + f"; {st['evaluated']:,} evaluated exactly; {st['wall_s']['total']:.1f} s"
    )
    files: list[Output] = []
    if args.json:
        files.append((args.json, _json_text(data), "the search's JSON"))
    if args.report:
        files.append((args.report, report.render(data), "the report"))
    return text, None, files


def baseline_table(data) -> str:
    """The baselines as a short text table (the plan summary of a search); under an objective
    other than throughput, a column of its values, and the gain is in it."""
    objective = (data.get("search") or {}).get("objective", "throughput")
    other = objective != "throughput"
    score_head = f" {objective:>15}" if other else ""
    width = max([14, *(len(b["name"]) for b in data["baselines"])])
    rows = [
        f"{'baseline':<{width}} {'samples/s':>11}{score_head} {'gain' if other else 'speed-up':>9}  "
        f"{'DP':>5} {'PP':>4} {'TP':>3} {'SP':>3} {'v':>2} {'ZeRO':>4} {'b':>2}  chip"
    ]
    unplanned = []  # a baseline with no plan: a dash in each column, and why in a line below
    for b in data["baselines"]:
        if not b["accelerator"]:
            dash = "-"
            rows.append(
                f"{b['name']:<{width}} {dash:>11}{f' {dash:>15}' if other else ''} {dash:>9}  {dash:>5} {dash:>4} "
                f"{dash:>3} {dash:>3} {dash:>2} {dash:>4} {dash:>2}  {dash}"
            )
            unplanned.append(f"{b['name']}: no plan: {b['note']}")
            continue
        thr = b["throughput_samples_per_s"]
        score = f" {b['score']:>15.5g}" if other else ""
        speedup = f"{b['speedup']:.3f}x" if b.get("speedup") else "-"
        chip = b["accelerator"].get("name", "")
        rows.append(
            f"{b['name']:<{width}} {thr:>11.5g}{score} {speedup:>9}  {b['dp']:>5} {b['pp']:>4} {b['tp']:>3} "
            f"{'on' if b['sequence_parallel'] else 'off':>3} {b['virtual_stages']:>2} {b['zero']:>4} "
            f"{b['micro_batch_size']:>2}  {chip}"
        )
    return "\n".join(rows + unplanned)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["validate"]:  # `phazec validate ...` is `phaze-validate ...`
        from phaze.tools import phaze_validate

        return phaze_validate.main(argv[1:])
    args = _parser().parse_args(argv)
    quiet = args.quiet
    show_warnings_as("phazec")
    install_error_hook("phazec", args.debug)

    def log(msg: str) -> None:
        # -q: errors and warnings only (said as they arise), nothing on success.
        if not quiet:
            print(log_line("phazec", msg, msg.startswith(("plan:", "baselines:"))), file=sys.stderr, flush=True)

    def body() -> None:
        refuse_output_clashes(args)
        try:
            text, failure, files = compiled(args, log)
        except NoPlanFits as e:  # known before the unfit plan was compiled: there is none to write
            text, failure, files = "", str(e), []
        if args.output != "-":
            files.insert(0, (args.output, text, "the plan" if args.emit == Stage.PLAN else "the module"))
        if failure and not args.write_infeasible:
            trim_cache(args, log)
            if not files:
                raise PhazeError(failure)
            written = ", ".join(path for path, _, _ in files)
            raise PhazeError(f"{failure}; nothing written to {written} (--write-infeasible writes it)")
        refused = _write(files, log)
        if args.output == "-":
            write_stdout(text)  # checked: a cut plan is an error, not exit 0
        trim_cache(args, log)
        if failure:
            raise PhazeError(failure)
        if refused:  # the others are written: a distinct status says one is not
            raise PartialOutput(*refused)

    return exit_status("phazec", args.debug, body)


def run() -> None:
    """The ``phazec`` command: :func:`main`, then the process ends at once, its output flushed.
    Python would first free every object left, the compiled IR among them (its ops point at
    their parents, so only the last cycle collection frees them): about 3 s of a GPT-3 175B
    placement's 25 on the 2-core machine.  By then ``main`` has written and closed its files
    and shut down the workers it started.  The exit handlers still run (they are quick):
    multiprocessing's removes the fork server's ``pymp-*`` folder from the system's temporary
    directory, which ``os._exit`` alone would leave behind; not after Ctrl-C, which ends the
    process at once (the fork server, interrupted while it imports, would print a traceback
    while they ran).

    ``main`` runs with few young-generation collections (the thresholds of
    :func:`phaze.pipeline.few_collections`, as the compilation in it already has them), never
    set back: were Python's thresholds back once the answer is in hand, their next allocation
    would set off a collection of the middle generation, which goes over everything the
    compilation left there (GPT-3 175B's plan: 0.8-1.0 s, to free a module that the exit drops
    anyway)."""
    import atexit
    import gc

    from phaze.pipeline import MIDDLE_COLLECTION_YOUNG, YOUNG_COLLECTION_ALLOCATIONS

    gc.set_threshold(YOUNG_COLLECTION_ALLOCATIONS, MIDDLE_COLLECTION_YOUNG, *gc.get_threshold()[2:])
    status = main()
    if status != INTERRUPTED:  # after Ctrl-C, at once: the handlers would wait on the workers
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # main wrote stdout checked; what is left cannot be said
            status = status or 1
    os._exit(status)


if __name__ == "__main__":
    run()
