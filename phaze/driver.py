"""The fixed pipeline behind ``phazec``: which passes run up to each stage, the sweep over
micro-batch sizes and tensor-parallel widths that the plan stage does, and the plan as JSON.

Stages, in order (``phazec --emit STAGE`` stops after STAGE and prints the module):

=========  ==================================================================================
ir         forward + loss, imported into the ``phaze`` dialect
training   + backward, optimizer step, saved activations, layers
sharded    + Megatron tensor parallelism of width ``tp`` (one device's share)
tiled      + the accelerator (``phaze.accelerator``) and GEMM tiling onto its PE arrays
latency    + every op's latency on it
scheduled  + each unique layer's operator schedule (SCIP)
recompute  + memory and time of each layer under each recompute policy
plan       + the best placement (Rust DP); swept over micro-batch sizes and TP widths
=========  ==================================================================================
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from xdsl.dialects.builtin import ModuleOp

from passes.algorithms.placement_options import PlacementOptions
from phaze.options import DEFAULT_TP_WIDTHS, SEQUENCE_PARALLEL_SETTINGS, STAGES, Options
from phaze_ir import keys
from phaze_ir.attributes import PlanAttr, RecordAttr, ReplicatedLinearsAttr, StageInfoAttr, UnpricedOpAttr
from phaze_ir.errors import PhazeError

Log = Callable[[str], None]

#: The JSON's ``stages[].memory`` parts, by the ``#phaze.stage_info`` field each is read from.
MEMORY_PARTS = {
    "params": "param_bytes",
    "grads": "grad_bytes",
    "optimizer": "optimizer_bytes",
    "activations": "activation_bytes",
    "workspace": "workspace_bytes",
}

#: A stage's time per micro-batch by part (``#phaze.stage_info``'s fields, the JSON's
#: ``stages[].time_parts``): they add up to its ``time_s``.
TIME_PARTS = ("compute_s", "recompute_s", "pp_comm_s", "zero_comm_s", "ep_comm_s")

#: The plan's time per batch by part (the JSON's ``breakdown_s``, :func:`time_breakdown`), in
#: the order a step runs them; they add up to ``time_per_batch_s``.
BREAKDOWN_PARTS = (
    "compute_s",
    "tp_comm_s",
    "recompute_s",
    "pp_comm_s",
    "ep_comm_s",
    "bubble_s",
    "dp_comm_s",
    "optimizer_s",
)


def pipeline(
    stage: str, tp: int, opts: Options, sequence_parallel: bool = False, start: str = "ir", energy: bool = False
) -> str:
    """The pass pipeline that takes a module at stage ``start`` (default: just imported) to
    ``stage`` (the accelerator op is added by :func:`import_step` before
    ``phaze-tile-pe-array``); ``sequence_parallel``: shard with Megatron's sequence
    parallelism (only at ``tp > 1``); ``energy``: price energy and power too (the
    accelerator has an ``[energy]`` table)."""
    first, k = STAGES.index(start) + 1, STAGES.index(stage)

    def runs(s: str) -> bool:
        return first <= STAGES.index(s) <= k

    passes = []
    if runs("training"):
        passes += [f"phaze-insert-optimizer{{optimizer={opts.optimizer}}}", "phaze-mark-saved", "phaze-group-layers"]
    if runs("sharded"):
        sp = " sequence_parallel=true" if sequence_parallel and tp > 1 else ""
        passes.append(f"phaze-shard-tensor-parallel{{width={tp}{sp}}}")
        if tp > 1:  # sharding drops the saved bytes and layers of the whole step: count one device's
            passes += ["phaze-mark-saved", "phaze-group-layers"]
    if runs("tiled"):
        if opts.kernels != "ops":
            passes.append(f"phaze-form-kernels{{runtime={opts.kernels}}}")
        passes.append("phaze-tile-pe-array")
    if runs("latency"):
        passes.append("phaze-estimate-latency")
        if energy:
            passes.append("phaze-estimate-energy")
    solver = (
        f"time_limit={opts.schedule_time_limit} gap_limit={opts.schedule_gap} "
        f"node_limit={opts.schedule_nodes} max_binaries={opts.schedule_max_binaries}"
    )
    if runs("scheduled"):
        passes.append(f"phaze-schedule-ops{{{solver}}}")
    if runs("recompute"):
        passes.append(f"phaze-insert-recompute{{{solver}}}")
    if runs("plan"):
        passes.append(place_devices_spec(opts))
        if energy:
            passes.append("phaze-estimate-power")
    return ",".join(passes)


def place_devices_spec(opts: PlacementOptions) -> str:
    """``phaze-place-devices`` with ``opts``' placement options, as a pipeline spec writes them."""

    def value(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        return f'"{v}"' if isinstance(v, str) else repr(v)

    words = " ".join(f"{f.name}={value(getattr(opts, f.name))}" for f in fields(PlacementOptions))
    return f"phaze-place-devices{{{words}}}"


def load_accelerator(name_or_path: str):
    """A hardware preset or file, with its errors as :class:`PhazeError` (a die too large for
    its wafer among them: said before any work, not when the plan is priced)."""
    from passes.algorithms.cost import check_die_fits
    from phaze_ir.hardware import HardwareError, load_hardware

    try:
        acc = load_hardware(name_or_path)
        check_die_fits(acc, name_or_path)
    except HardwareError as e:
        raise PhazeError(str(e)) from e
    return acc


def default_memory_headroom(hw: str) -> float:
    """The memory headroom a plan on chip ``hw`` leaves when none is asked: the chip's
    ``calibration.memory_headroom``, 0 without one (phazec's and ``phaze.compile``'s default)."""
    calibration = load_accelerator(hw).calibration
    return (calibration.memory_headroom or 0.0) if calibration is not None else 0.0


def schedule_cache(opts: Options):
    """The schedule cache a compilation solves through (see ``Options.schedule_cache``)."""
    from passes.algorithms import schedule as sched

    if opts.schedule_cache is not None:
        return opts.schedule_cache
    return sched.ScheduleCache(os.environ.get("PHAZE_SCHEDULE_CACHE") or None)


def compile_module(
    traced,
    stage: str,
    tp: int,
    opts: Options,
    accelerator=None,
    sequence_parallel: bool = False,
    verify: bool = True,
) -> ModuleOp:
    """Import a traced step and run the pipeline up to ``stage``; the scheduling passes solve
    through ``opts.schedule_cache`` (:func:`compile_model` sets it; None: each its own).
    ``verify=False``: as :func:`compile_from`'s."""
    with few_collections():
        if STAGES.index(stage) < STAGES.index("tiled"):
            accelerator = None
        elif accelerator is None:
            accelerator = load_accelerator(opts.hw)
        module = import_step(traced, opts, accelerator)
        return compile_from(module, "ir", stage, tp, opts, sequence_parallel, verify)


def import_step(traced, opts: Options, accelerator=None) -> ModuleOp:
    """The traced step imported into the ``phaze`` dialect, targeting ``accelerator`` (None:
    no target yet)."""
    from phaze_ir.frontend import import_graph
    from phaze_ir.hardware_ir import set_accelerator

    module = import_graph(traced, strict=opts.strict, capacity_factor=opts.capacity_factor)
    if accelerator is not None:
        set_accelerator(module, accelerator)
    return module


def training_step(traced, opts: Options, accelerator=None) -> ModuleOp:
    """The traced step imported (targeting ``accelerator``, None: no target yet) and through
    the training passes: what every TP width of one micro-batch shares.  Compile each width
    from its own :func:`copy_for` it (``compile_from(copy, "training", ...)``)."""
    with few_collections():
        return compile_from(import_step(traced, opts, accelerator), "ir", "training", 1, opts)


def copy_for(module: ModuleOp, k: int, n: int) -> ModuleOp:
    """The module the ``k``-th of ``n`` compilations from ``module`` runs on: a copy, and
    ``module`` itself for the last (nothing needs it after)."""
    return module if k == n - 1 else module.clone()


#: Allocations between young-generation collections while IR is built (Python's default: 700).
#: A pipeline allocates millions of small, long-lived objects (ops, attributes, graph nodes);
#: at the default every pass paid for collections that free nothing, a third of a point's time
#: on GPT-3.  The older generations' thresholds stay Python's.
YOUNG_COLLECTION_ALLOCATIONS = 50_000


@contextlib.contextmanager
def few_collections():
    """Collect the young generation less often while the block runs (cycles are still
    collected); the previous thresholds come back after it."""
    before = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_ALLOCATIONS, *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def compile_from(
    module: ModuleOp,
    start: str,
    stage: str,
    tp: int,
    opts: Options,
    sequence_parallel: bool = False,
    verify: bool = True,
) -> ModuleOp:
    """Run the pipeline on ``module``, which is at stage ``start``, up to ``stage`` (in place;
    returned for convenience); from ``tiled`` on it needs its accelerator
    (:func:`import_step`).  ``verify=False`` skips verifying the result (the sweep verifies
    only the module it returns: verifying is a seventh of a point's time)."""
    from xdsl.passes import PassPipeline

    from passes import ALL_PASSES
    from passes.solver_options import SolverOptions
    from phaze_ir.ir import make_context

    with few_collections():
        spec = pipeline(stage, tp, opts, sequence_parallel, start, energy=_prices_energy(module, stage))
        if spec:
            parsed = PassPipeline.parse_spec(ALL_PASSES, spec).passes
            with_cache = tuple(
                replace(p, cache=opts.schedule_cache) if isinstance(p, SolverOptions) else p for p in parsed
            )
            PassPipeline(with_cache).apply(make_context(), module)
        if verify:
            module.verify()
    return module


def _prices_energy(module: ModuleOp, stage: str) -> bool:
    """Whether the pipeline to ``stage`` prices energy: from the latency stage on, when the
    module's accelerator has an ``[energy]`` table."""
    from phaze_ir.dialect import AcceleratorOp
    from phaze_ir.hardware_ir import module_accelerator

    if STAGES.index(stage) < STAGES.index("latency"):
        return False
    if not any(isinstance(op, AcceleratorOp) for op in module.ops):
        return False
    return module_accelerator(module, "phazec").energy is not None


@dataclass
class Candidate:
    """One (micro-batch, TP width, sequence parallelism) point of the plan sweep."""

    micro_batch: int
    tp: int
    throughput: float = 0.0
    note: str = ""
    sequence_parallel: bool = False


def plan_record(module: ModuleOp) -> dict[str, Any]:
    """``phaze.plan`` of a module as a dict (empty if absent)."""
    attr = module.attributes.get(keys.PLAN)
    return attr.as_dict() if isinstance(attr, PlanAttr) else {}


def check_options(opts: Options) -> None:
    """The one-line error of an option out of range (stage, sizes, placement settings), before
    anything slow; ``phazec --hw`` and the architecture search both check through here."""
    from passes.algorithms.placement import PlacementError, parse_placement
    from passes.algorithms.placement_options import OptionError
    from phaze_ir.frontend.importer import check_capacity_factor

    if opts.emit not in STAGES:
        raise PhazeError(f"unknown stage '{opts.emit}'; expected one of {', '.join(STAGES)}")
    for b in opts.micro_batches:
        if b < 1:
            raise PhazeError(f"--micro-batch {b}: expected a positive integer")
    for t in opts.tp_widths or ():
        if t < 1:
            raise PhazeError(f"--tp {t}: expected a positive integer")
    try:
        opts.check()
    except OptionError as e:
        raise PhazeError(f"--{e.option.replace('_', '-')}: {e}") from e
    if opts.sequence_parallel not in SEQUENCE_PARALLEL_SETTINGS:
        raise PhazeError(
            f"--sequence-parallel '{opts.sequence_parallel}': expected one of {', '.join(SEQUENCE_PARALLEL_SETTINGS)}"
        )
    check_capacity_factor(opts.capacity_factor)
    if opts.placement.startswith("expert:"):  # its degrees are known without the model
        try:
            check_placement_devices(parse_placement(opts.placement, ""), opts.devices)
        except PlacementError as e:
            raise PhazeError(f"--placement: {e}") from e
    if opts.emit == "plan" and all(opts.global_batch % b for b in opts.micro_batches):
        sizes = ", ".join(map(str, opts.micro_batches))
        raise PhazeError(
            f"--global-batch {opts.global_batch} is not a multiple of the micro-batch size ({sizes}): "
            "expected a micro-batch size that divides the global batch"
        )


def check_placement_devices(fixed: tuple[int, int, int] | None, devices: int) -> None:
    """A fixed placement (PP, DP, TP) that needs more devices than the run has is refused."""
    if fixed is not None and fixed[0] * fixed[1] * fixed[2] > devices:
        pp, dp, tp = fixed
        raise PhazeError(
            f"--placement expert:{pp},{dp},{tp} needs {pp * dp * tp} devices: expected at most --devices {devices}"
        )


@dataclass(frozen=True)
class Compilation:
    """What every compilation of a model file starts from (:func:`start_compilation`): the
    options checked, with their schedule cache; the chip (None before the ``tiled`` stage); the
    model file; its fixed placement (None: searched); the TP widths to try."""

    opts: Options
    accelerator: Any
    spec: Any
    fixed: tuple[int, int, int] | None
    tp_widths: tuple[int, ...]


def start_compilation(model_path: str, opts: Options, accelerator=None) -> Compilation:
    """Check ``opts`` and load what a compilation of ``model_path`` needs, each error in one line
    before anything slow (``compile_model`` and ``phazec --hw``'s settings sweep start here)."""
    from passes.algorithms.placement import PlacementError, parse_placement
    from phaze_ir.frontend import load_model_file

    check_options(opts)
    opts = replace(opts, schedule_cache=schedule_cache(opts))
    if accelerator is None and STAGES.index(opts.emit) >= STAGES.index("tiled"):
        accelerator = load_accelerator(opts.hw)
    check_power_cap(opts, accelerator)
    spec = load_model_file(model_path)
    try:
        fixed = parse_placement(opts.placement, spec.name)
    except PlacementError as e:
        raise PhazeError(f"--placement: {e}") from e
    check_placement_devices(fixed, opts.devices)
    return Compilation(opts, accelerator, spec, fixed, tp_widths_of(opts, fixed))


def tp_widths_of(opts: Options, fixed: tuple[int, int, int] | None) -> tuple[int, ...]:
    """The TP widths a compilation tries: ``--tp``'s, else the fixed placement's, else all."""
    return tuple(opts.tp_widths or ((fixed[2],) if fixed is not None else DEFAULT_TP_WIDTHS))


class NoPlanFits(PhazeError):
    """No point of the sweep has a placement that fits (``Options.unfit_plan`` False): the
    message is the one the unfit plan's ``binding`` would give (:func:`no_fit_message`)."""


def no_fit_message(binding: str) -> str:
    """The message a run whose plan does not fit fails with, from the constraint that binds."""
    return binding if "no placement fits" in binding else f"no placement fits: {binding}"


class _NotTheWholeStep(Exception):
    """A deepened step's check trace, run beside its compilation, disagreed with it."""


def compile_model(
    model_path: str, opts: Options, log: Log, accelerator=None, seconds: dict[str, float] | None = None
) -> tuple[ModuleOp, list[Candidate]]:
    """Compile a model file to ``opts.emit``.  For the plan stage, sweep micro-batch sizes and
    TP widths and return the module of the best feasible plan (the highest throughput; ties go
    to the smaller micro-batch, then the smaller TP width) and every point of the sweep.
    ``accelerator``: the chip (default: ``opts.hw``).  ``seconds``, when given, gets the wall
    time spent per phase added to it: ``trace``, ``import`` (import and training passes shared
    by a micro-batch's points) and ``points`` (the rest of the pipeline, every point).

    A deepened step is compiled while its check trace runs beside it
    (``trace_step_checked_later``), and each micro-batch's points are kept only once the check
    agreed; when it does not (a model whose blocks trace alike five at a time but not six),
    the compilation starts again from steps traced as ``trace_step`` traces them."""
    seconds = {} if seconds is None else seconds
    for phase in ("trace", "import", "points"):
        seconds.setdefault(phase, 0.0)
    # The trace allocates as the pipeline does (nodes, fake tensors, their metadata): at
    # Python's default thresholds its collections were 0.6 s of GPT-3 175B's 2.4 s trace.
    with few_collections():
        try:
            return _compile_model(model_path, opts, log, accelerator, seconds, check_later=True)
        except _NotTheWholeStep:
            log("the deepened step is not what the model traces to: compiling again from a whole trace")
            return _compile_model(model_path, opts, log, accelerator, seconds, check_later=False)


def _compile_model(
    model_path: str, opts: Options, log: Log, accelerator, seconds: dict[str, float], check_later: bool
) -> tuple[ModuleOp, list[Candidate]]:
    from phaze_ir.frontend import UnknownOpError, trace_step, trace_step_checked_later

    begun = start_compilation(model_path, opts, accelerator)
    opts, accelerator, spec, tp_widths = begun.opts, begun.accelerator, begun.spec, begun.tp_widths
    stage = opts.emit
    training = STAGES.index(stage) >= STAGES.index("training")
    sweep = stage == "plan"
    micro_batches = opts.micro_batches if sweep else opts.micro_batches[:1]
    tp_widths = tp_widths if sweep else tp_widths[:1]

    best: tuple[float, ModuleOp] | None = None
    candidates: list[Candidate] = []
    fallback: ModuleOp | None = None
    for b in micro_batches:
        log(
            f"tracing {spec.name} ({'training step' if training else 'forward'}, micro-batch {b}"
            + (f", seq {opts.seq_len or spec.seq_len}" if (opts.seq_len or spec.seq_len) else "")
            + ")"
        )
        start = time.perf_counter()
        if check_later:
            traced, holds = trace_step_checked_later(spec, b, opts.seq_len, training=training, dtype=opts.dtype)
        else:
            traced, holds = trace_step(spec, b, opts.seq_len, training=training, dtype=opts.dtype), (lambda: True)
        seconds["trace"] += time.perf_counter() - start
        log(traced_line(traced))
        points = tp_points(opts, tp_widths)
        # The training step before sharding is the same at every TP width: import it and run
        # the training passes once per micro-batch, and give each point a copy.
        shared: ModuleOp | None = None
        if len(points) > 1 and STAGES.index(stage) > STAGES.index("training"):
            start = time.perf_counter()
            try:
                shared = training_step(traced, opts, accelerator)
            except PhazeError:
                shared = None  # each point says why itself
            seconds["import"] += time.perf_counter() - start
        for k, (t, sp) in enumerate(points):
            start = time.perf_counter()
            where = point_label(b, t, sp)
            try:
                if shared is not None:
                    step = copy_for(shared, k, len(points))
                    module = compile_from(step, "training", stage, t, opts, sp, verify=not sweep)
                else:
                    # (a plan is verified once, when chosen)
                    module = compile_module(traced, stage, t, opts, accelerator, sp, verify=not sweep)
            except UnknownOpError:
                _confirm(holds)
                raise  # the model's, not this point's: every point would say it again
            except PhazeError as e:
                if not sweep:
                    _confirm(holds)
                    raise
                candidates.append(Candidate(b, t, note=str(e), sequence_parallel=sp))
                log(f"{where}: skipped: {e}")
                continue
            finally:
                seconds["points"] += time.perf_counter() - start
            if not sweep:
                _confirm(holds)
                log(f"built {sum(1 for _ in module.walk())} ops in {time.perf_counter() - start:.1f} s")
                return module, candidates
            cand, unfit = judge_point(module, b, t, sp, opts, log, f" [{time.perf_counter() - start:.1f} s]")
            candidates.append(cand)
            if cand.throughput > 0 and (best is None or cand.throughput > best[0]):
                best = (cand.throughput, module)
            if unfit:
                fallback = fallback or module
        _confirm(holds)
    return chosen_point(best[1] if best is not None else None, fallback, candidates, opts)


def _confirm(holds: Callable[[], bool]) -> None:
    """Go on only when the step compiled was the whole model's (waiting for its check)."""
    if not holds():
        raise _NotTheWholeStep


def point_label(b: int, t: int, sp: bool) -> str:
    """How a point of the sweep is named in messages: ``micro-batch 2, TP 4, SP``."""
    return f"micro-batch {b}, TP {t}" + (", SP" if sp else "")


def judge_point(
    module: ModuleOp, b: int, t: int, sp: bool, opts: Options, log: Log, took: str = ""
) -> tuple[Candidate, bool]:
    """The sweep's :class:`Candidate` of one placed point (its throughput 0 when its plan does not
    fit or draws more than ``--power-cap``), said in one line (``took`` after it), and whether
    its plan does not fit (its module then says which constraint binds; over the cap: False)."""
    where = point_label(b, t, sp)
    plan = plan_record(module)
    feasible = plan.get("feasible") == "yes"
    note = "" if feasible else plan.get("binding", "")
    over = over_power_cap(module, opts.power_cap_w)
    if feasible and over:
        feasible, note = False, over
    cand = Candidate(b, t, plan["throughput_samples_per_s"] if feasible else 0.0, note, sp)
    if feasible:
        log(f"{where}: {cand.throughput:,.1f} samples/s (DP {plan['dp']}, PP {plan['pp']}){took}")
    elif over:
        log(f"{where}: {over}")
    else:
        log(f"{where}: does not fit: {cand.note}")
    return cand, not feasible and not over


def chosen_point(
    best: ModuleOp | None, fallback: ModuleOp | None, candidates: list[Candidate], opts: Options
) -> tuple[ModuleOp, list[Candidate]]:
    """What the sweep returns (verified): the best point's module, else the first that does not
    fit (its plan says which constraint binds); an error when every point is over the power cap
    or none compiled."""
    if best is not None:
        best.verify()
        return best, candidates
    if opts.power_cap_w is not None and any(c.note.startswith("power ") for c in candidates):
        raise PhazeError(f"no plan meets --power-cap {opts.power_cap_w:g} W: " + notes_once(candidates))
    if fallback is not None:
        fallback.verify()
        return fallback, candidates  # nothing fits: the module says which constraint binds
    raise PhazeError("no micro-batch size and TP width could be compiled: " + notes_once(candidates))


def traced_line(traced) -> str:
    """What the log says of a traced step: its nodes, its time, how it was traced."""
    how = f" (deepened from {traced.deepened_from} blocks)" if traced.deepened_from else ""
    return f"traced {len(traced.graph_module.graph.nodes)} aten nodes in {traced.trace_seconds:.1f} s{how}"


def check_power_cap(opts: Options, accelerator) -> None:
    """Refuse ``--power-cap`` on a chip (None: not loaded) without an ``[energy]`` table."""
    if opts.power_cap_w is not None and (accelerator is None or accelerator.energy is None):
        name = accelerator.name if accelerator is not None else opts.hw
        raise PhazeError(f"--power-cap: hardware '{name}' has no [energy] table, so its plans have no predicted power")


def over_power_cap(module: ModuleOp, cap_w: float | None) -> str:
    """Why a plan's predicted chip power breaks ``cap_w`` ("" when it does not, or no cap)."""
    from phaze_ir.attributes import PowerAttr

    attr = module.attributes.get(keys.POWER)
    if cap_w is None or not isinstance(attr, PowerAttr):
        return ""
    power = float(attr.as_dict()["chip_power_w"])
    return over_cap_note(power, cap_w) if power > cap_w else ""


def over_cap_note(power_w: float, cap_w: float) -> str:
    """A point's note when its plan's chip power is over ``--power-cap``."""
    return f"power {power_w:.1f} W per chip over the cap of {cap_w:g} W"


def tp_points(opts: Options, tp_widths: Sequence[int]) -> list[tuple[int, bool]]:
    """The ``(TP width, sequence parallel)`` points to compile for ``tp_widths``, in the order
    that breaks ties: each width without and/or with sequence parallelism as
    ``opts.sequence_parallel`` says (SP needs ``tp > 1``; ``auto`` compiles both, without
    first)."""
    points = []
    for tp in tp_widths:
        if tp == 1 or opts.sequence_parallel == "off":
            points.append((tp, False))
        elif opts.sequence_parallel == "on":
            points.append((tp, True))
        else:
            points += [(tp, False), (tp, True)]
    return points


def notes_once(candidates: list[Candidate]) -> str:
    """Why each candidate failed, each reason said once with the points it holds for (or just
    the reason, when it holds for all of them)."""
    points: dict[str, list[str]] = {}
    for c in candidates:
        points.setdefault(c.note, []).append(f"b={c.micro_batch} t={c.tp}")
    if len(points) == 1 and len(candidates) > 1:
        return f"{next(iter(points))} (at every point)"
    return "; ".join(f"{', '.join(where)}: {note}" for note, where in points.items())


def capacity_factor(module: ModuleOp) -> float | None:
    """The MoE capacity factor the module's expert GEMMs were padded to (``phaze.capacity_factor``),
    None when they were not (dropless, or no experts)."""
    from xdsl.dialects.builtin import FloatAttr

    attr = module.attributes.get(keys.CAPACITY_FACTOR)
    return float(attr.value.data) if isinstance(attr, FloatAttr) else None


def unpriced_ops(module: ModuleOp) -> list[dict[str, Any]]:
    """``phaze.warnings`` as JSON: the opaque ops the plan does not price (``unpriced-op``) and
    the linears tensor parallelism keeps replicated (``replicated-linears``); empty when none."""
    kinds = {UnpricedOpAttr: "unpriced-op", ReplicatedLinearsAttr: "replicated-linears"}
    return [
        {"kind": kinds[type(r)], **r.as_dict()}
        for r in keys.records_of(module, keys.WARNINGS, RecordAttr)
        if type(r) in kinds
    ]


def time_breakdown(module: ModuleOp) -> dict[str, float] | None:
    """The plan's time per batch by part (:data:`BREAKDOWN_PARTS`, seconds; None when the plan
    has no stages), from ``phaze.plan``, ``phaze.stages`` and ``phaze.layer_schedule``.  The
    time is ``(m + (p − 1)/v) · T + E + O`` (docs/design.md §6.2), T the slowest rank's time per
    micro-batch, E the largest exposed once-per-step DP collectives, O the largest optimizer
    step; the parts split it so that they add up to it (but for rounding):

    - ``compute_s``, ``recompute_s``, ``pp_comm_s``, ``ep_comm_s``: m times the slowest rank's
      scheduled forward and backward work (without its TP collectives), its recompute, its
      boundary transfers, its expert all-to-alls;
    - ``tp_comm_s``: m times the TP collectives of that rank's layers that their schedules do
      not hide behind compute (``phaze.layer_schedule``'s ``tp_comm_s``, inside their
      ``fwd_s + bwd_s``: split out of the compute);
    - ``bubble_s``: ``(p − 1)/v · T``, the pipeline's fill and drain;
    - ``dp_comm_s``: m times ZeRO-2/3's per-micro-batch collectives of that rank, plus E;
    - ``optimizer_s``: O, the optimizer step after the flush."""
    from phaze_ir.attributes import LayerScheduleAttr

    plan = plan_record(module)
    stages = [s.as_dict() for s in keys.records_of(module, keys.STAGES, StageInfoAttr)]
    if not plan or not stages:
        return None
    m = int(plan["num_micro_batches"])
    p, v = int(plan["pp"]), int(plan["virtual_stages"])
    times = [float(s["time_s"]) for s in stages]
    slowest = stages[times.index(max(times))]
    # The rank's layers: its stage's, or under interleaving its v chunks'.
    layers = {
        i
        for s in stages
        if s["rank"] == slowest["rank"]
        for i in range(int(s["first_layer"]), int(s["last_layer"]) + 1)
    }
    records = keys.records_of(module, keys.LAYER_SCHEDULE, LayerScheduleAttr)
    tp = sum(float(r.as_dict()["tp_comm_s"]) for r in records if int(r.as_dict()["index"]) in layers)
    compute = float(slowest["compute_s"])
    tp = min(tp, compute)
    return {
        "compute_s": m * (compute - tp),
        "tp_comm_s": m * tp,
        "recompute_s": m * float(slowest["recompute_s"]),
        "pp_comm_s": m * float(slowest["pp_comm_s"]),
        "ep_comm_s": m * float(slowest["ep_comm_s"]),
        "bubble_s": (p - 1) / v * max(times),
        "dp_comm_s": m * float(slowest["zero_comm_s"]) + max(float(s["exposed_dp_s"]) for s in stages),
        "optimizer_s": max(float(s["optimizer_s"]) for s in stages),
    }


def plan_json(
    module: ModuleOp, candidates: list[Candidate], recompute: str = "auto", headroom: float = 0.0
) -> dict[str, Any]:
    """The plan as JSON (the schema is in docs/usage.md, "The plan as JSON"); ``recompute``: the
    setting it was placed under (``Options.recompute``; each stage's policy is in its stage);
    ``headroom``: the fraction of HBM it was placed to leave free (``Options.memory_headroom``).
    Its ``summary`` is :func:`phaze.summary.build`'s (None when the plan does not fit).
    Under interleaved 1F1B (``virtual_stages`` > 1) ``stages`` lists the model chunks, each
    with the ``rank`` that runs it and that rank's numbers, its ``memory`` by part included."""
    from phaze_ir.hardware_ir import module_accelerator

    plan = plan_record(module)
    if not plan:
        raise PhazeError("--json needs the plan stage (--emit plan)")
    acc = module_accelerator(module, "phazec --json")
    accelerator = acc.to_dict()
    accelerator["hbm_bytes"] = acc.hbm.bytes
    area = acc.area_um2
    accelerator["area_mm2"] = area / 1e6 if area is not None else None
    stages = [s.as_dict() for s in keys.records_of(module, keys.STAGES, StageInfoAttr)]
    out: dict[str, Any] = {
        "model": keys.string_of(module, keys.MODEL),
        "devices": plan["devices"],
        "global_batch": plan["global_batch"],
        "dp": plan["dp"],
        "pp": plan["pp"],
        "tp": plan["tp"],
        "sequence_parallel": keys.SEQUENCE_PARALLEL in module.attributes,
        "virtual_stages": plan["virtual_stages"],
        "zero": plan["zero"],
        "expert_parallel": plan["expert_parallel"],
        "rank_order": plan["rank_order"],
        "pipeline_transfer": plan["pipeline_transfer"],
        "capacity_factor": capacity_factor(module),
        "micro_batch_size": plan["micro_batch_size"],
        "num_micro_batches": plan["num_micro_batches"],
        "time_per_batch_s": plan["time_per_batch_s"],
        # the time per batch by part (they add up to it; None when no plan has numbers)
        "breakdown_s": time_breakdown(module),
        "throughput_samples_per_s": plan["throughput_samples_per_s"],
        "devices_used": plan["devices_used"],
        "max_memory_bytes": plan["max_memory_bytes"],
        "placement": plan["placement"],
        "recompute": recompute,
        "feasible": plan["feasible"] == "yes",
        "binding": plan["binding"],
        "accelerator": accelerator,
        "stages": [
            {
                "rank": s["rank"],
                "layers": [s["first_layer"], s["last_layer"]],
                "devices": s["devices"],
                "time_s": s["time_s"],
                # time_s by part, as the DP adds it up
                "time_parts": {part: s[part] for part in TIME_PARTS},
                "memory_bytes": s["memory_bytes"],
                # memory_bytes by part, as the DP counts it (the parts add up to it)
                "memory": {part: s[field] for part, field in MEMORY_PARTS.items()},
                "recompute": s["recompute"],
                "in_flight": s["in_flight"],
                "exposed_dp_s": s["exposed_dp_s"],
                "optimizer_s": s["optimizer_s"],
            }
            for s in stages
        ],
        "power": power_json(module, plan, acc.power_w),
        **cost_json(module, plan, acc),
        "warnings": unpriced_ops(module),
        "candidates": [
            {
                "micro_batch_size": c.micro_batch,
                "tp": c.tp,
                "sequence_parallel": c.sequence_parallel,
                "throughput_samples_per_s": c.throughput,
                "note": c.note,
            }
            for c in candidates
        ],
    }
    if out["feasible"] and stages:
        from phaze import summary as plan_summary

        others = [line for line in (power_line(module), cost_line(module, plan)) if line]
        out["summary"] = plan_summary.build(module, out, placement_table(module), others, headroom)
    else:
        out["summary"] = None
    return out


def power_json(module: ModuleOp, plan: dict[str, Any], published_w: float | None) -> dict[str, Any] | None:
    """The plan's ``phaze.power`` as JSON, with the energy per token and the chip's published
    power (``power_w``, its TDP) beside the predicted one; None when the step was not priced
    in energy (a chip without an ``[energy]`` table, or an infeasible plan)."""
    from phaze_ir.attributes import PowerAttr

    attr = module.attributes.get(keys.POWER)
    if not isinstance(attr, PowerAttr):
        return None
    out: dict[str, Any] = dict(attr.as_dict())
    seq = keys.int_of(module, keys.SEQ_LEN, 0)  # 0: a model without a sequence
    out["energy_per_token_j"] = float(out["step_energy_j"]) / (int(plan["global_batch"]) * seq) if seq else None
    out["published_power_w"] = published_w
    return out


def cost_json(module: ModuleOp, plan: dict[str, Any], acc) -> dict[str, Any]:
    """The plan's ``cost`` and ``carbon`` (``passes/algorithms/cost.py``), each None when the
    hardware lacks what prices it (``[manufacturing]``; ``[deployment]`` and ``[energy]`` for
    the step's carbon) or the plan is infeasible."""
    from passes.algorithms.cost import plan_cost
    from phaze_ir.attributes import PowerAttr

    if plan.get("feasible") != "yes":
        return {"cost": None, "carbon": None}
    attr = module.attributes.get(keys.POWER)
    energy = float(attr.as_dict()["step_energy_j"]) if isinstance(attr, PowerAttr) else None
    step_s = float(plan["time_per_batch_s"])
    c = plan_cost(acc, int(plan["devices_used"]), step_s, energy)
    if c is None:
        return {"cost": None, "carbon": None}
    cost = {
        "die_usd": c.die_usd,
        "die_yield": c.die_yield,
        "chip_usd": c.chip_usd,
        "cluster_usd": c.cluster_usd,
        "samples_per_s_per_kusd": float(plan["throughput_samples_per_s"]) / (c.cluster_usd / 1e3),
    }
    carbon: dict[str, Any] | None = None
    if c.embodied_kgco2e_per_step is not None:
        samples = int(plan["global_batch"])
        seq = keys.int_of(module, keys.SEQ_LEN, 0)
        operational = c.operational_kgco2e_per_step
        total = c.embodied_kgco2e_per_step + (operational or 0.0) if operational is not None else None
        carbon = {
            "embodied_kgco2e_per_chip": c.embodied_kgco2e_per_chip,
            "embodied_kgco2e_per_step": c.embodied_kgco2e_per_step,
            "operational_kgco2e_per_step": operational,
            "kgco2e_per_step": total,
            "kgco2e_per_sample": total / samples if total is not None else None,
            "kgco2e_per_token": total / (samples * seq) if total is not None and seq else None,
        }
    return {"cost": cost, "carbon": carbon}


def power_line(module: ModuleOp) -> str:
    """One line of the plan's power for stderr ("" when not priced)."""
    from phaze_ir.attributes import PowerAttr

    attr = module.attributes.get(keys.POWER)
    if not isinstance(attr, PowerAttr):
        return ""
    from phaze_ir.hardware_ir import module_accelerator

    p = {k: float(v) for k, v in attr.as_dict().items()}
    network = f" ({p['network_energy_j'] / 1e3:.4g} kJ of it the network's)" if p["network_energy_j"] > 0 else ""
    line = (
        f"power: {p['chip_power_w']:.1f} W per chip ({p['static_power_w']:.1f} W static), "
        f"{p['step_energy_j'] / 1e3:.4g} kJ per step{network}, {p['energy_per_sample_j']:.4g} J per sample"
    )
    limit = module_accelerator(module, "phazec").power_w
    if limit is not None and p["chip_power_w"] > limit:
        # A chip drawing more than its power limit lowers its clocks (the H100's GEMMs run at
        # 1335-1500 MHz under 700 W, data/h100/power.csv): the priced time does not.
        line += f"\n  above the chip's {limit:g} W power limit: it would lower its clocks, so this time is optimistic"
    return line


def summary(module: ModuleOp, candidates: Sequence[Candidate] = (), headroom: float = 0.0) -> str:
    """The plan's summary (:mod:`phaze.summary`) as text for stderr ("" when it does not fit)."""
    if plan_record(module).get("feasible") != "yes":
        return ""
    found = plan_json(module, list(candidates), headroom=headroom)["summary"]
    return "\n".join(found["lines"]) if found else ""


def placement_table(module: ModuleOp) -> str:
    """The plan's placement as a one-row table (and the capacity factor the expert GEMMs are
    padded to, if any)."""
    plan = plan_record(module)
    stages = [s.as_dict() for s in keys.records_of(module, keys.STAGES, StageInfoAttr)]
    recompute = ",".join(sorted({str(s["recompute"]) for s in stages}))
    mem = max(int(s["memory_bytes"]) for s in stages) / 1e9
    v = int(plan["virtual_stages"])
    schedule = "1f1b" if v == 1 else f"interleaved:{v}"
    sp = "on" if keys.SEQUENCE_PARALLEL in module.attributes else "off"
    head = (
        f"{'DP':>5} {'PP':>4} {'TP':>4} {'SP':>3} {'schedule':>13} {'ZeRO':>4} {'EP':>3} {'ranks':>8} "
        f"{'micro-batch':>11} {'recompute':>14} {'s/batch':>10} {'samples/s':>11} {'GB/device':>10}"
    )
    row = (
        f"{plan['dp']:>5} {plan['pp']:>4} {plan['tp']:>4} {sp:>3} {schedule:>13} {plan['zero']:>4} "
        f"{plan['expert_parallel']:>3} {plan['rank_order']:>8} "
        f"{plan['micro_batch_size']:>11} {recompute:>14} "
        f"{plan['time_per_batch_s']:>10.4g} {plan['throughput_samples_per_s']:>11.5g} {mem:>10.2f}"
    )
    factor = capacity_factor(module)
    note = "" if factor is None else f"\nexpert GEMMs padded to capacity factor {factor:g}"
    return head + "\n" + row + note


def cost_line(module: ModuleOp, plan: dict[str, Any]) -> str:
    """One line of the plan's cost and carbon for stderr ("" when not priced)."""
    from phaze_ir.hardware_ir import module_accelerator

    priced = cost_json(module, plan, module_accelerator(module, "phazec"))
    cost, carbon = priced["cost"], priced["carbon"]
    if cost is None:
        return ""
    line = (
        f"cost to make: ${cost['chip_usd']:,.0f} per chip (die ${cost['die_usd']:,.0f} at "
        f"{cost['die_yield']:.1%} yield), ${cost['cluster_usd']:,.0f} for the cluster"
    )
    if carbon is not None and carbon["kgco2e_per_step"] is not None:
        share = carbon["embodied_kgco2e_per_step"] / carbon["kgco2e_per_step"]
        line += f"; {carbon['kgco2e_per_step'] * 1e3:.4g} g CO2e per step ({share:.1%} embodied)"
    return line
