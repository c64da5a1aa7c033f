"""The pass pipeline on a traced step: which passes run up to each stage (:func:`pipeline`), the
step imported for a chip (:func:`import_step`; :func:`load_accelerator` loads the chip) and
compiled to a stage (:func:`compile_module`; :func:`compile_from` a module part-way,
:func:`training_step` the part every TP width of a micro-batch shares, :func:`copy_for` each
width its copy).  The library that ``phazec``'s sweeps (:mod:`phaze.driver`, :mod:`phaze.search.sweep`),
the search's settings (:mod:`phaze.search.setting`), the plan templates
(:mod:`phaze.plan.plan_template`) and ``phaze-validate`` compile through.

Stages, in order (:data:`phaze.options.STAGES`; ``phazec --emit STAGE`` stops after STAGE and
prints the module):

=========  ==================================================================================
ir         forward + loss, imported into the ``phaze`` dialect
training   + backward, optimizer step, saved activations, layers
sharded    + Megatron tensor parallelism of width ``tp`` (one device's share)
tiled      + the accelerator (``phaze.accelerator``) and GEMM tiling onto its PE arrays
latency    + every op's latency on it (under context parallelism, attention as a ring of c steps)
scheduled  + each unique layer's operator schedule (SCIP)
recompute  + memory and time of each layer under each recompute policy
plan       + the best placement (Rust DP); swept over micro-batch sizes and TP widths
=========  ==================================================================================
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import fields, replace

from xdsl.dialects.builtin import ModuleOp

from passes.algorithms.option_values import Runtime, Tristate
from passes.algorithms.placement_options import PlacementOptions
from phaze.options import STAGES, Options, Stage, context_parallel_degree
from phaze_ir.errors import PhazeError


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
        if opts.kernels is not Runtime.OPS:
            passes.append(form_kernels_spec(opts.kernels, opts.sdpa_order))
        passes.append("phaze-tile-pe-array")
    if runs("latency"):  # how the ops run (rings, overlapped collectives), then their prices
        if (c := context_parallel_degree(opts)) > 1:
            passes.append(f"phaze-context-parallel{{degree={c}}}")
        if opts.tp_overlap is not Tristate.OFF and sequence_parallel and tp > 1:
            passes.append("phaze-overlap-tensor-parallel")
        passes.append("phaze-estimate-latency")
        if energy:
            passes.append(f'phaze-estimate-energy{{selective="{opts.selective_recompute}"}}')
    solver = (
        f"time_limit={opts.schedule_time_limit} gap_limit={opts.schedule_gap} "
        f"node_limit={opts.schedule_nodes} max_binaries={opts.schedule_max_binaries}"
    )
    if runs("scheduled"):
        passes.append(f"phaze-schedule-ops{{{solver}}}")
    if runs("recompute"):
        passes.append(f'phaze-insert-recompute{{{solver} selective="{opts.selective_recompute}"}}')
    if runs("plan"):
        passes.append(place_devices_spec(opts))
        if energy:
            passes.append("phaze-estimate-power")
    return ",".join(passes)


def form_kernels_spec(kernels: str, sdpa_order: str = Options.sdpa_order) -> str:
    """``phaze-form-kernels`` for runtime ``kernels`` under torch's SDPA order ``sdpa_order``
    (written only when not the default, so the default's pipeline is as it was)."""
    order = "" if sdpa_order == Options.sdpa_order else f" sdpa_order={sdpa_order}"
    return f"phaze-form-kernels{{runtime={kernels}{order}}}"


def place_devices_spec(opts: PlacementOptions) -> str:
    """``phaze-place-devices`` with ``opts``' placement options, as a pipeline spec writes them."""

    def value(v: object, typed: bool) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        # a typed option as its text (an expert-parallel degree too: the pass parses the text)
        return f'"{v}"' if isinstance(v, str) or typed else repr(v)

    words = " ".join(
        f"{f.name}={value(getattr(opts, f.name), f.metadata.get('parse') is not None)}"
        for f in fields(PlacementOptions)
    )
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
    through ``opts.schedule_cache`` (:func:`phaze.driver.compile_model` sets it; None: each its own).
    ``verify=False``: as :func:`compile_from`'s."""
    with few_collections():
        if STAGES.index(stage) < STAGES.index(Stage.TILED):
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


def training_step(traced, opts: Options, accelerator=None, verify: bool = True) -> ModuleOp:
    """The traced step imported (targeting ``accelerator``, None: no target yet) and through
    the training passes: what every TP width of one micro-batch shares.  Compile each width
    from its own :func:`copy_for` it (``compile_from(copy, "training", ...)``); ``verify=False``:
    as :func:`compile_from`'s."""
    with few_collections():
        return compile_from(import_step(traced, opts, accelerator), "ir", "training", 1, opts, verify=verify)


def copy_for(module: ModuleOp, k: int, n: int) -> ModuleOp:
    """The module the ``k``-th of ``n`` compilations from ``module`` runs on: a copy, and
    ``module`` itself for the last (nothing needs it after)."""
    return module if k == n - 1 else module.clone()


#: Allocations between young-generation collections while IR is built (Python's default: 700).
#: A pipeline allocates millions of small, long-lived objects (ops, attributes, graph nodes);
#: at the default every pass paid for collections that free nothing, a third of a point's time
#: on GPT-3.
YOUNG_COLLECTION_ALLOCATIONS = 50_000
#: Young collections between collections of the middle generation while IR is built (Python's
#: default: 10).  What survives a young collection then is mostly IR that lives on, and each
#: middle collection went over up to ten young generations' survivors (half a million objects)
#: to free little: 12 of them were 0.5-0.6 s of GPT-3 175B's ``--hw`` question (every
#: dimension ``auto``), in its settings, the winner's deepening and its pipeline; now about
#: one, for 1 % more memory (1.02 instead of 1.01 GB).  The oldest generation's threshold stays
#: Python's.
MIDDLE_COLLECTION_YOUNG = 100


@contextlib.contextmanager
def few_collections():
    """Collect the young and middle generations less often while the block runs (cycles are
    still collected); the previous thresholds come back after it."""
    before = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_ALLOCATIONS, MIDDLE_COLLECTION_YOUNG, *before[2:])
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

    if STAGES.index(stage) < STAGES.index(Stage.LATENCY):
        return False
    if not any(isinstance(op, AcceleratorOp) for op in module.ops):
        return False
    return module_accelerator(module, "phazec").energy is not None


def traced_line(traced) -> str:
    """What the log says of a traced step: its nodes, its time, how it was traced."""
    how = f" (deepened from {traced.deepened_from} blocks)" if traced.deepened_from else ""
    return f"traced {len(traced.graph_module.graph.nodes)} aten nodes in {traced.trace_seconds:.1f} s{how}"
