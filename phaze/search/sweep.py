"""``phazec --hw``'s plan sweep priced from the search's settings, then the best point compiled.

The sweep (micro-batch 1, 2, 4, 8 × TP 1, 2, 4, 8, with or without sequence parallelism) asks
one question per point: the throughput of the best placement on one chip.  The IR pipeline
answers it for the whole model at every point (``driver.compile_model``); the search answers
it from a :class:`~phaze.search.setting.Setting` (op table, scheduling groups, per-layer
numbers), which the model cut to 3 and 4 blocks gives (design §2), with the same schedules
(the same canonical problems, through the same cache) and the same DP.  So here every point is
priced from its setting on the :class:`~phaze.search.engine.Evaluator`, and only the best
point is compiled through the IR pipeline from the whole model; its throughput must equal the
settings' exactly, as the search's winner must (design §7.5): a difference is a bug, raised as
:class:`PricingMismatch` (no tolerance, no second compilation).

What the settings do not cover is compiled point by point as before
(``driver.compile_model``): a stage before ``plan``, a sweep of one point (its compilation is
all there is to do), a
micro-batch whose step cannot be imported or whose TP overlap pairs a collective with GEMMs of
another scheduling group.

The sweep is ``phazec --hw``'s, so it lives beside the driver; it prices with the search's
settings and evaluator (:mod:`phaze.search.setting`, :mod:`phaze.search.engine`), which the
phaze layer may import (``phaze.search`` imports nothing of this module).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from xdsl.dialects.builtin import ModuleOp

from passes.algorithms.option_values import Recompute, Runtime, Zero
from passes.cache_file import Store, fields, is_int, need
from phaze import driver
from phaze.model_key import model_key
from phaze.options import DEFAULT_TP_WIDTHS, Options, Stage, context_parallel_degree, narrowed, traced_seq_len
from phaze.pipeline import compile_module, few_collections, traced_line
from phaze.plan.plan_output import Candidate, plan_record
from phaze.plan.plan_template import Point
from phaze.points import (
    NoPlanFits,
    context_parallel_points,
    expert_tp_widths,
    no_fit_message,
    notes_once,
    over_cap_note,
    point_label,
    tp_points,
)
from phaze_ir.errors import ModelTooLarge, PhazeError

if TYPE_CHECKING:
    from phaze.plan.export import Launchable
    from phaze.plan.plan_template import Templates
    from phaze.search.setting import Setting


class PricingMismatch(RuntimeError):
    """An internal error: the plan compiled for the sweep's winner does not price the
    throughput its settings priced.  Both price the same step on the same cost model, so any
    difference is a bug (no tolerance, no second compilation: issue 56)."""


#: How a TP width the model's shapes cannot shard is refused (a head count or a dimension it
#: does not divide): the same at every micro-batch, so it is not traced again.
UNSHARDABLE = "phaze-shard-tensor-parallel: width "
#: The store's kind of entry holding one micro-batch's settings (:func:`prepared`).
SETTINGS_KIND = "sweep-settings"


def why_compiled_point_by_point(opts: Options) -> str:
    """Why the sweep of ``opts`` cannot be priced from settings ("" when it can)."""
    if opts.emit is not Stage.PLAN:
        return f"--emit {opts.emit}"
    return ""


def compile_plan(
    model_path: str,
    opts: Options,
    log,
    accelerator=None,
    seconds: dict[str, float] | None = None,
    stages: Store | None = None,
    templates: Templates | None = None,
) -> tuple:
    """What ``driver.compile_model`` returns (the best point's module, every point of the
    sweep), with the points priced from settings (see the module docstring).  ``seconds`` gets
    ``settings`` (cut traces, import and sharding), ``points`` (schedules and DP of every
    point) and ``winner`` (the best point compiled from the whole model).  ``stages``: where
    each micro-batch's settings are kept and looked up (:func:`prepared`; None: nowhere).
    ``templates``: where the best point is placed from its template when it was compiled
    before (:mod:`phaze.plan.plan_template`: then the module is its placed skeleton)."""
    with few_collections():  # its cut traces allocate as a compilation does
        module, candidates, _ = _compile_plan(model_path, opts, log, accelerator, seconds, stages, templates, None)
    return module, candidates


def compile_launchable(
    model_path: str,
    opts: Options,
    launch: Launchable,
    log,
    accelerator=None,
    stages: Store | None = None,
    templates: Templates | None = None,
) -> tuple[ModuleOp, list[Candidate], Narrowing]:
    """:func:`compile_plan`, its plan the fastest that every ``--export`` target launches
    (``launch``), from the same settings: when the fastest point's placement is refused for its
    ZeRO stage, CP or recompute policies, the points are priced again under each narrowing of
    ``launch.choices`` and the best of the fastest narrowing is compiled (its template placed
    under the narrowed options).  Also returns that :class:`Narrowing` (none: the plan of
    ``opts``; so too when the sweep compiled its points one by one, or none of them launches)."""
    with few_collections():
        return _compile_plan(model_path, opts, log, accelerator, None, stages, templates, launch)


def nearest_placed(module: ModuleOp, opts: Options, log) -> str:
    """:func:`nearest_plan` of a point compiled through the pipeline (``module``, whose plan
    does not fit), each try its skeleton placed again (:func:`phaze.plan.plan_template.place`: the
    placement passes, no compilation), at the point's micro-batch and TP width."""
    from phaze.plan.plan_template import place, point_of, skeleton_of
    from phaze_ir import keys
    from phaze_ir.attributes import StageInfoAttr
    from phaze_ir.hardware_ir import module_accelerator

    skeleton, point = skeleton_of(module), point_of(module)

    def fits(o: Options) -> Fit | None:
        placed = place(skeleton, o, point)
        plan = plan_record(placed)
        if plan.get("feasible") != "yes" or not plan.get("throughput_samples_per_s"):
            return None
        stages = [st.as_dict() for st in keys.records_of(placed, keys.STAGES, StageInfoAttr)]
        policies = [str(st["recompute"]).lower() for st in stages]
        throughput = float(plan["throughput_samples_per_s"])
        return int(plan["dp"]), int(plan["pp"]), point.tp, int(plan["zero"]), policies, point.micro_batch, throughput

    fixed = opts.placement != Options.placement
    return nearest_plan(opts, opts.devices if fixed else module_accelerator(module, "phazec").max_devices, fits, log)


def _compile_plan(
    model_path: str,
    opts: Options,
    log,
    accelerator,
    seconds: dict[str, float] | None,
    stages: Store | None,
    templates: Templates | None,
    launch: Launchable | None,
) -> tuple[ModuleOp, list[Candidate], Narrowing]:
    if why_compiled_point_by_point(opts):
        return (*driver.compile_model(model_path, opts, log, accelerator, seconds), Narrowing())
    from passes.algorithms.placement import fixed_tp_mismatch
    from phaze.search.engine import Candidates, ModelTask

    begun = driver.start_compilation(model_path, opts, accelerator)
    # the bound prunes a transformers LM whose loss is its own (every token's logits) at the traced length
    vocab = begun.vocab if begun.spec.loss_fn is None and begun.spec.takes_seq_len else None
    opts, acc, spec, fixed, tp_widths = begun.opts, begun.accelerator, begun.spec, begun.fixed, begun.tp_widths
    # Each context-parallel degree c (one, or those --context-parallel auto tries): its options,
    # with the whole sequence explicit (each point's step is traced at S/c, its attention priced
    # as a ring; the same options at c = 1).  Its settings carry c (Setting.cp), which the DP
    # prices; the placement options, and so the evaluator, are the same at every degree.
    asked_opts = opts
    degrees = context_parallel_points(opts, spec.seq_len)
    if len(opts.micro_batches) * len(degrees) * len(tp_points(opts, tp_widths)) == 1:
        # One point: its compilation is all there is to do (the cut traces would be extra).
        return (*driver.compile_model(model_path, opts, log, accelerator, seconds), Narrowing())
    opts = degrees[0]  # the options every degree shares (placement, solver, objective)
    # The widths the sweep asks (those the devices hold), and, priced beside them from the same
    # cut traces, the wider ones the nearest plan that fits on more devices may need.
    asked = set(tp_widths)
    if not opts.tp_widths and fixed is None:
        tp_widths = expert_tp_widths(opts, DEFAULT_TP_WIDTHS)
    seconds = {} if seconds is None else seconds
    for phase in ("settings", "points", "winner"):
        seconds.setdefault(phase, 0.0)

    # Every point, in the order of driver.compile_model (the order that breaks ties): each
    # micro-batch, each CP degree, each TP width with or without SP.
    points: list[tuple[int, int, int, bool, int | None, str]] = []  # (b, c, tp, sp, setting index, error)
    settings = []
    unshardable: dict[int, str] = {}  # a TP width the model's shapes refuse, at every micro-batch
    # Each (b, c)'s settings by point, in the sweep's order, and the widths whose settings wait
    # until the nearest plan that fits on more devices asks them (:func:`beyond_devices`).
    pairs: list[tuple[tuple[int, int], dict[tuple[int, bool], Setting]]] = []
    deferred: dict[tuple[int, int], tuple[tuple[int, ...], Options]] = {}
    prepared_widths: set[int] = set()
    # the settings of every micro-batch and degree but the first prepared meanwhile, in children
    beside = _settings_beside(model_path, opts, degrees, asked_opts, tp_widths, spec, vocab, acc, stages)
    for job, (b, degree) in enumerate((b, o) for b in opts.micro_batches for o in degrees):
        c = context_parallel_degree(degree)
        start = time.perf_counter()
        # The widths whose memory bound alone exceeds the chip's HBM are not traced (pruned).
        seq = degree.seq_len or spec.seq_len
        pruned = {t: bound for t in tp_widths if (bound := beyond_hbm(b, t, c, seq, vocab, acc))}
        widths = tuple(t for t in tp_widths if t not in unshardable and t not in pruned)
        if pruned:
            log(
                f"micro-batch {b}{f', CP {c}' if c > 1 else ''}: TP {', '.join(map(str, pruned))} pruned: "
                + next(iter(pruned.values()))
            )
        try:
            # At c = 1 the settings are traced as the pipeline's sweep traces every degree of the
            # question: under ``auto`` with fused attention (driver.with_runtime_attention).
            traced_as = degree if c > 1 else replace(degree, context_parallel=asked_opts.context_parallel)
            later = beyond_devices(widths, c, opts.devices, prepared_widths)
            now = tuple(t for t in widths if t not in later)
            if later:
                deferred[b, c] = (widths, traced_as)
            compute = beside.compute(job, (b, now, traced_as))
            ready, errors = (
                prepared(model_path, b, now, traced_as, stages, spec.name, log, acc, compute) if now else ([], [])
            )
            prepared_widths.update(now)
        except ModelTooLarge:
            raise  # (compiling every point would trace it again, to the same refusal)
        except PhazeError as e:
            where = f"micro-batch {b}" + (f", CP {c}" if c > 1 else "")
            log(f"{where}: {e}; compiling every point through the pipeline")
            beside.cancel()
            return (*driver.compile_model(model_path, asked_opts, log, accelerator, seconds), Narrowing())
        finally:
            seconds["settings"] += time.perf_counter() - start
        by_point = _by_point(ready, fixed)
        pairs.append(((b, c), by_point))
        unshardable |= {t: e for t, _, e in errors if e.startswith(UNSHARDABLE)}
        if all(t in unshardable for t in asked):  # no width asked shards: said at once, once
            said = "; ".join(dict.fromkeys(unshardable[t] for t in sorted(asked)))
            raise PhazeError(f"--tp {','.join(map(str, sorted(asked)))}: {said} (at every micro-batch)")
        why = {(t, sp): e for t, sp, e in errors} | {
            (t, sp): unshardable[t] for t, sp in tp_points(opts, list(unshardable))
        }
        if fixed is not None:  # a point of another TP width than the placement's is not placed
            for r in ready:
                if fixed_tp_mismatch(fixed, r.tp):
                    why[r.tp, r.sequence_parallel] = fixed_tp_mismatch(fixed, r.tp)
        for t, sp in tp_points(opts, tp_widths):
            setting = by_point.get((t, sp))
            if setting is not None:
                settings.append(setting)
            if t in pruned:  # k = -1: it cannot fit (said as a plan that does not fit)
                points.append((b, c, t, sp, -1, pruned[t]))
                continue
            points.append((b, c, t, sp, len(settings) - 1 if setting is not None else None, why.get((t, sp), "")))
    beside.cancel()

    task = ModelTask(spec.name, settings, fixed)
    jobs = [(0, k, 0, acc.hbm.bytes) for k in range(len(settings))]
    cands = Candidates.of_accelerator(acc)
    sweep = _Sweep(settings, points, asked, cands, task, jobs, seconds)
    priced = sweep.priced(opts, log)
    narrowing = Narrowing()
    if launch is not None and priced.best is not None:
        narrowing, priced = _launchable(sweep, opts, priced, launch, log)
    candidates, best, first_unfit, least = priced.candidates, priced.best, priced.first_unfit, priced.least

    if best is None and opts.power_cap_w is not None and any(c.note.startswith("power ") for c in candidates):
        raise PhazeError(f"no plan meets --power-cap {opts.power_cap_w:g} W: " + notes_once(candidates))
    if best is None and first_unfit is not None and not opts.unfit_plan:
        start = time.perf_counter()
        if deferred:  # the settings on more devices than asked, in the sweep's order
            full = {
                pair: _by_point(prepared(model_path, pair[0], widths, o, stages, spec.name, log, acc)[0], fixed)
                for pair, (widths, o) in deferred.items()
            }
            settings = [s for pair, by in pairs for p in tp_points(opts, tp_widths) if (s := full.get(pair, by).get(p))]
            task = ModelTask(spec.name, settings, fixed)
            jobs = [(0, k, 0, acc.hbm.bytes) for k in range(len(settings))]
        nearest = nearest_fit(opts, acc, task, jobs, log)
        seconds["points"] += time.perf_counter() - start
        unfit = least[1] if least is not None else first_unfit
        raise NoPlanFits(no_fit_message(unfit.note) + (f"; {nearest}" if nearest else ""))
    chosen = best or first_unfit
    if chosen is None:
        raise PhazeError("no micro-batch size and TP width could be compiled: " + notes_once(candidates))
    point = Point(chosen.micro_batch, chosen.tp, chosen.sequence_parallel, chosen.context_parallel)
    if templates is not None and narrowing.options:
        templates = templates.under(narrowed(templates.opts, narrowing.options))
    module = templates.placed(point) if templates is not None else None
    if module is not None:
        where = point_label(point.micro_batch, point.tp, point.sequence_parallel, point.context_parallel)
        log(f"placing the best point ({where}) from its compiled plan (in the cache)")
    else:
        of_degree = {context_parallel_degree(o): narrowed(o, narrowing.options) for o in degrees}
        module = _compile_point(spec, chosen, of_degree[chosen.context_parallel], acc, log, seconds)
    compiled = plan_record(module)
    got = float(compiled.get("throughput_samples_per_s", 0.0)) if compiled.get("feasible") == "yes" else 0.0
    if got != chosen.throughput:
        raise PricingMismatch(
            f"internal error: micro-batch {chosen.micro_batch}, TP {chosen.tp}: the settings price "
            f"{chosen.throughput!r} samples/s, the plan compiled for it {got!r}; please report it"
        )
    return module, candidates, narrowing


@dataclass(frozen=True)
class Narrowing:
    """How :func:`compile_launchable` narrowed the question's options to a plan every
    ``--export`` target launches: the options narrowed (``{}``: none, the plan is the fastest)
    and, when narrowed, the fastest plan that is not launched and how much slower the launchable
    one is, in one line (said as it is found, and again by a cached answer)."""

    options: dict[str, str] = field(default_factory=dict)
    said: str = ""


@dataclass
class _Priced:
    """The sweep's points priced under one set of placement options: every point's candidate,
    the best (the first on a tie) and its DP placement, the first point that does not fit and
    the one whose option needs the least memory."""

    candidates: list[Candidate] = field(default_factory=list)
    best: Candidate | None = None
    placement: Any = None  #: the DP's plan of ``best`` (its ``PlanDict``)
    first_unfit: Candidate | None = None
    least: tuple[int, Candidate] | None = None


@dataclass
class _Sweep:
    """The sweep's points, in its order (``(b, c, tp, sp, setting index, why not)``), and their
    settings, ready to be priced under the question's placement options or a narrowing of them
    (:func:`_launchable`): the settings are traced once, only the schedules and DP run again."""

    settings: list[Setting]
    points: list[tuple[int, int, int, bool, int | None, str]]
    asked: set[int]  #: the TP widths the devices hold (the wider ones are priced for nearest_fit only)
    cands: Any  #: the chip's ``Candidates``
    task: Any  #: the settings' ``ModelTask``
    jobs: list[tuple[int, int, int, int]]
    seconds: dict[str, float]

    def priced(self, opts: Options, log) -> _Priced:
        """Every point priced under ``opts`` (its schedules and DP), each said in ``log``."""
        from passes.algorithms.placement import binding_message
        from phaze.search.engine import Evaluator, Params, SolverLimits

        start = time.perf_counter()
        evaluator = Evaluator(Params.of_options(opts, "throughput"), SolverLimits.of_options(opts), opts.schedule_cache)
        priced = evaluator.exact(self.cands, [self.task], self.jobs) if self.settings else []
        self.seconds["points"] += time.perf_counter() - start

        out = _Priced()
        objective = evaluator.objective(self.cands)
        for b, c, t, sp, k, error in self.points:
            if t not in self.asked:  # more TP than devices: priced for nearest_fit only
                continue
            where = point_label(b, t, sp, c)
            if c > 1 and t * c > opts.devices:  # no replica fits: said as the pipeline's sweep says it
                note = f"devices: t·c = {t}·{c} exceeds N = {opts.devices}"
                out.candidates.append(Candidate(b, t, note=note, sequence_parallel=sp, context_parallel=c))
                log(f"{where}: does not fit: {note}")
                continue
            if k == -1:
                cand = Candidate(b, t, 0.0, error, sp, c)
                log(f"{where}: does not fit: {error}")
                out.first_unfit = out.first_unfit or cand
                out.candidates.append(cand)
                continue
            if k is None:
                out.candidates.append(Candidate(b, t, note=error, sequence_parallel=sp, context_parallel=c))
                log(f"{where}: skipped: {error}")
                continue
            score, result = priced[k]
            plan = result.get("plan")
            if result.get("feasible") and plan and score > 0:
                cand = Candidate(b, t, evaluator.throughput(result), "", sp, c)
                log(f"{where}: {cand.throughput:,.1f} samples/s (DP {plan['dp']}, PP {plan['pp']})")
                if out.best is None or cand.throughput > out.best.throughput:
                    out.best, out.placement = cand, plan
            elif result.get("feasible") and plan:  # over the power cap
                power = objective.plan_power(self.settings[k], 0, plan).chip_power_w
                assert opts.power_cap_w is not None  # the only way a feasible plan scores 0
                cand = Candidate(b, t, 0.0, over_cap_note(power, opts.power_cap_w), sp, c)
                log(f"{where}: {cand.note}")
            else:
                cand = Candidate(b, t, 0.0, binding_message(result, opts.memory_headroom), sp, c)
                log(f"{where}: does not fit: {cand.note}")
                out.first_unfit = out.first_unfit or cand
                needed = least_needed(result)
                if needed is not None and (out.least is None or needed < out.least[0]):
                    out.least = (needed, cand)
            out.candidates.append(cand)
        return out


def _launchable(sweep: _Sweep, opts: Options, fastest: _Priced, launch: Launchable, log) -> tuple[Narrowing, _Priced]:
    """The :class:`Narrowing` of ``opts`` (one of ``launch.choices``) and the sweep priced under
    it, whose best plan is the fastest every export target launches (the first narrowing on a
    tie), when the ``fastest`` plan's placement is refused (its ZeRO stage, CP or recompute
    policies: :meth:`~phaze.plan.export.Launchable.refusal`); none and ``fastest`` itself when
    it is not refused so, or when no narrowing has a plan that fits (the exports then say why
    they refuse it).  Each narrowing prices the same settings again (schedules and DP)."""
    assert fastest.best is not None and fastest.placement is not None
    zero = int(fastest.placement["zero"])
    policies = [str(stage["recompute"]) for stage in fastest.placement["stages"]]
    why = launch.refusal(zero, int(fastest.placement["cp"]), policies)
    if why is None:
        return Narrowing(), fastest
    refused = f"the fastest plan ({_best_words(fastest.best)}, ZeRO {zero}) is not launched: {why}"
    log(f"{refused}; pricing the plans every --export launches")
    found: tuple[dict[str, str], _Priced, Candidate] | None = None
    for choice in launch.choices:
        priced = sweep.priced(narrowed(opts, choice), lambda _line: None)
        flags = " ".join(f"--{name} {value}" for name, value in choice.items())
        log(f"{flags}: {_best_words(priced.best) if priced.best is not None else 'no plan fits'}")
        if priced.best is not None and (found is None or priced.best.throughput > found[2].throughput):
            found = (choice, priced, priced.best)
    if found is None:
        log("no plan every --export launches fits: the fastest plan stays")
        return Narrowing(), fastest
    choice, priced, best = found
    below = 1 - best.throughput / fastest.best.throughput
    found_words = f"the fastest plan every --export launches is {below:.1%} slower: {_best_words(best)}"
    log(found_words)
    return Narrowing(choice, f"{refused}; {found_words}"), priced


def _best_words(best: Candidate) -> str:
    """A point's throughput and where, in a line: ``1.346 samples/s at micro-batch 1, ...``."""
    where = point_label(best.micro_batch, best.tp, best.sequence_parallel, best.context_parallel)
    return f"{samples_per_s(best.throughput)} samples/s at {where}"


def _settings_beside(model_path: str, opts, degrees, asked_opts, tp_widths, spec, vocab, acc, stages):
    """A :class:`~phaze.search.settings_beside.SettingsBeside` preparing, in forked children, the
    settings of every (micro-batch, CP degree) of the sweep but the first, which
    :func:`_compile_plan` prepares itself meanwhile: each asked as the sweep will ask it when
    no width turns out unshardable, and only when the store holds none of it (else nothing to
    prepare)."""
    from phaze.search.settings_beside import SettingsBeside, can_fork

    if not can_fork():
        return SettingsBeside()
    jobs = []
    prepared_widths: set[int] = set()  # as the sweep's loop keeps it (:func:`beyond_devices`)
    for job, (b, degree) in enumerate((b, o) for b in opts.micro_batches for o in degrees):
        c = context_parallel_degree(degree)
        seq = degree.seq_len or spec.seq_len
        widths = tuple(t for t in tp_widths if not beyond_hbm(b, t, c, seq, vocab, acc))
        later = beyond_devices(widths, c, opts.devices, prepared_widths)
        now = tuple(t for t in widths if t not in later)
        prepared_widths.update(now)
        traced_as = degree if c > 1 else replace(degree, context_parallel=asked_opts.context_parallel)
        if job == 0 or not now or _kept(model_path, b, now, traced_as, stages, spec.name, acc):
            continue
        jobs.append((job, (b, now, traced_as)))
    return SettingsBeside.start(model_path, jobs, acc)


class _NotKept(Exception):
    """:func:`_kept`'s probe found no settings in the store."""


def _kept(model_path: str, b: int, widths, opts: Options, stages: Store | None, name: str, acc) -> bool:
    """Whether the store holds the settings :func:`prepared` would read (nothing prepared, said
    or kept: the probe's ``compute`` stops at the first thing a miss does; a broken entry's
    warning is said by the sweep's own reading, once)."""
    import warnings

    def miss(*_args):
        raise _NotKept

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prepared(model_path, b, widths, opts, stages, name, lambda _line: None, acc, miss)
    except _NotKept:
        return False
    return True


def beyond_devices(widths: tuple[int, ...], c: int, devices: int, prepared_before: set[int]) -> tuple[int, ...]:
    """The TP widths of ``widths`` whose settings at CP degree ``c`` > 1 wait: ``t·c`` devices
    hold no replica of the point on the ``devices`` asked (the sweep says so without pricing
    it), so only the nearest plan that fits on more devices, asked when no point fits, prices
    them (:func:`_compile_plan` prepares them then).  A width no earlier micro-batch or degree
    prepared is prepared now: whether the model's shapes shard it (``UNSHARDABLE``, the same at
    every micro-batch and degree) is learnt as before; and none waits when all would (the step
    of ``(b, c)`` is traced, a refusal of it said, as before)."""
    later = tuple(t for t in widths if c > 1 and t * c > devices and t in prepared_before)
    return later if len(later) < len(widths) else ()  # (b, c) traced all the same: its errors said as before


def _by_point(ready: list[Setting], fixed) -> dict[tuple[int, bool], Setting]:
    """The settings ``ready`` by point (TP width, sequence parallelism), those of another TP
    width than the fixed placement's left out (not placed)."""
    from passes.algorithms.placement import fixed_tp_mismatch

    return {(s.tp, s.sequence_parallel): s for s in ready if fixed is None or not fixed_tp_mismatch(fixed, s.tp)}


def beyond_hbm(b: int, t: int, c: int, seq_len: int | None, vocab: int | None, acc) -> str:
    """Why point (micro-batch ``b``, TP ``t``, CP ``c``) cannot fit under any placement, from
    the model's shapes alone ("" when the bound does not say so): the gradient of its logits
    (:func:`passes.algorithms.memory.logits_grad_bytes`, a lower bound on every placement's
    memory per device) exceeds the chip's HBM."""
    from passes.algorithms.memory import logits_grad_bytes

    if vocab is None or seq_len is None:
        return ""
    need = logits_grad_bytes(b, seq_len, vocab, t, c)
    if need <= acc.hbm.bytes:
        return ""
    return (
        f"the gradient of the logits alone ({need / 2**30:.1f} GiB: {b} x {seq_len // c - 1} tokens x "
        f"{vocab // t} columns x 2 bytes) exceeds the {acc.hbm.bytes / 2**30:.0f} GiB of HBM"
    )


def least_needed(result: Any) -> int | None:
    """The least memory per device (bytes) of the options a DP result that does not fit tried
    (its memory violation's ``needed_bytes``), None when memory is not what binds."""
    needed = [v.get("needed_bytes") for v in result.get("violations", [])]
    return min((n for n in needed if isinstance(n, int)), default=None)


#: One placement that fits, as the nearest-fit message words it: its DP, PP and TP degrees, ZeRO
#: stage, each stage's recompute policy, micro-batch size and samples/s.
Fit = tuple[int, int, int, int, list[str], int, float]


def nearest_fit(opts: Options, acc, task, jobs, log) -> str:
    """The nearest plan that fits when no point of the sweep does, priced from the same
    settings on the same DP (the schedules come from the cache), in one clause
    (:func:`nearest_plan`)."""
    from phaze.search.engine import Candidates, Evaluator, Params, SolverLimits

    cands = Candidates.of_accelerator(acc)

    def fits(o: Options) -> Fit | None:
        evaluator = Evaluator(Params.of_options(o, "throughput"), SolverLimits.of_options(o), o.schedule_cache)
        priced = evaluator.exact(cands, [task], jobs)
        found = [(evaluator.throughput(r), k, r) for k, (sc, r) in enumerate(priced) if r.get("feasible") and sc > 0]
        if not found:
            return None
        throughput, k, result = max(found, key=lambda f: (f[0], -f[1]))  # ties: the sweep's order
        setting, plan = task.settings[k], result["plan"]
        assert plan is not None  # a feasible result has its plan
        policies = [str(st["recompute"]).lower() for st in plan["stages"]]
        return plan["dp"], plan["pp"], setting.tp, plan["zero"], policies, setting.micro_batch, throughput

    return nearest_plan(opts, acc.max_devices if task.fixed is None else opts.devices, fits, log)


def nearest_plan(opts: Options, max_devices: int, fits, log) -> str:
    """The nearest plan that fits, in one clause ("" when none of those tried does): first, on
    the same devices, the placement options left to the placement (``--zero auto``,
    ``--recompute auto``: each ZeRO stage and recompute policy tried) where they were fixed;
    then the fewest devices at this batch: N·2, N·4, ... (up to ``max_devices``, what the
    chip's file describes) until one fits, with the options as given, else left to the
    placement, then the fewest between the last that did not and that one (halving the gap:
    a count between fits when more devices fit, which holds but for a count the batch or the
    model's layers do not divide). ``fits(options)``: the best :data:`Fit` under them, or None."""
    # (HSDP's ZeRO stays as given: --dp-shard needs ZeRO 2 or 3, which auto may leave)
    relaxed: dict[str, str] = {}
    if Zero(opts.zero) is not Zero.AUTO and not opts.dp_shard:
        relaxed["zero"] = Zero.AUTO
    if Recompute(opts.recompute) is not Recompute.AUTO:
        relaxed["recompute"] = Recompute.AUTO
    changes = [{}, relaxed] if relaxed else [{}]

    def tried(devices: int, change: dict[str, str]) -> Fit | None:
        o = replace(opts, devices=devices, zero=Zero(change.get("zero", opts.zero)))
        return fits(replace(o, recompute=Recompute(change.get("recompute", opts.recompute))))

    def first_fit(devices: int) -> tuple[dict[str, str], Fit] | None:
        for change in changes:
            if (found := tried(devices, change)) is not None:
                return change, found
        return None

    found: tuple[int, dict[str, str], Fit] | None = None
    if relaxed and (same := tried(opts.devices, relaxed)) is not None:
        found = (opts.devices, relaxed, same)
    lo, n = opts.devices, opts.devices * 2
    while found is None and n <= max_devices:
        if (at := first_fit(n)) is not None:
            found = (n, *at)
            while n - lo > 1:  # the fewest between lo (none fits) and n (one does)
                mid = (lo + n) // 2
                if (at := first_fit(mid)) is not None:
                    n, found = mid, (mid, *at)
                else:
                    lo = mid
            break
        lo, n = n, n * 2
    if found is None:
        return ""
    devices, change, (dp, pp, tp, zero, policies, micro_batch, throughput) = found
    flags = ([f"--devices {devices}"] if devices != opts.devices else []) + [
        f"--{name} {value}" for name, value in change.items()
    ]
    kinds = sorted(set(policies))
    recompute = " or ".join(kinds) + (" by stage" if len(kinds) > 1 else "")
    words = (
        f"DP {dp} x PP {pp} x TP {tp}, ZeRO {zero}, recompute {recompute}, "
        f"micro-batch {micro_batch}: {samples_per_s(throughput)} samples/s"
    )
    where = f"on these {opts.devices:,} devices" if devices == opts.devices else "the fewest devices at this batch"
    log(f"nearest plan that fits ({where}): {' '.join(flags)}: {words}")
    return f"the nearest plan that fits ({where}): {' '.join(flags)} ({words})"


def samples_per_s(x: float) -> str:
    """A throughput in a message: 4 significant digits, thousands grouped (``176,400``)."""
    return f"{x:,.0f}" if x >= 1e4 else f"{x:.4g}"


def _compile_point(spec, point: Candidate, opts: Options, acc, log, seconds) -> ModuleOp:
    """``point`` compiled from the whole model through the pipeline to its plan (its schedules
    are the settings', from the cache): from the model cut to 5 and 6 blocks, compiled and
    deepened (:func:`phaze.deepen_compiled.compile_from_cut`), when that is the same module,
    else from the whole model's trace."""
    from phaze.deepen_compiled import compile_from_cut
    from phaze_ir.frontend import trace_step
    from phaze_ir.frontend.deepen import CUT, trace_cut
    from phaze_ir.frontend.trace import whole_sequence

    where = point_label(point.micro_batch, point.tp, point.sequence_parallel, point.context_parallel)
    log(f"compiling the best point ({where}) for all its blocks")
    start = time.perf_counter()
    whole = opts.seq_len if context_parallel_degree(opts) > 1 else None  # a CP part of a sample
    how = {"training": True, "dtype": opts.dtype, "fp8_recipe": opts.fp8}
    with whole_sequence(whole):
        cut = trace_cut(spec, point.micro_batch, traced_seq_len(opts), **how)
    traced = None
    if cut is not None and cut.blocks is None:  # a model with nothing to cut: its whole step
        traced, cut = cut, None
    # the step cut to 5 and 6 blocks compiled, deepened to all of them (the same bytes)
    module = None if cut is None else compile_from_cut(cut, point.tp, opts, acc, point.sequence_parallel)
    if module is not None and cut is not None and cut.blocks is not None:
        log(f"compiled the model cut to {CUT} and {CUT + 1} blocks, deepened to {cut.blocks[1]}")
    else:
        if traced is None:
            with whole_sequence(whole):
                traced = trace_step(spec, point.micro_batch, traced_seq_len(opts), **how)
        log(traced_line(traced))
        module = compile_module(traced, "plan", point.tp, opts, acc, point.sequence_parallel)  # verified
    seconds["winner"] += time.perf_counter() - start
    log(f"built {sum(1 for _ in module.walk())} ops in {time.perf_counter() - start:.1f} s")
    return module


def prepared(
    model_path: str,
    b: int,
    tps: tuple[int, ...],
    opts: Options,
    stages: Store | None,
    name: str,
    log,
    acc=None,
    compute=None,
) -> tuple[list[Setting], list[tuple[int, bool, str]]]:
    """``prepare_points``'s settings of micro-batch ``b`` and why each other point has none, from
    ``stages`` when it has them (a ``sweep-settings`` entry of the cache's store), else
    prepared and kept there.  They depend on the model (its file and the helpers it imports),
    the micro-batch, the TP widths and what tracing, importing and sharding read of the options
    (sequence parallelism, the sequence length, the dtype, the optimizer, ``--strict``, the
    kernels and, for a runtime's, the chip's compute capability) and what
    selective recompute re-runs, not on
    the chip, the devices or the batch: another question on the same model reads them.
    ``compute``: what prepares them when the store has none (None: ``prepare_points``; a
    child's answer: :meth:`phaze.search.settings_beside.SettingsBeside.compute`)."""
    from phaze.search.setting import prepare_points

    key = None
    if stages is not None and stages.directory is not None:
        # The kernels: ``ops`` traces a transformers model's attention eager
        # (driver.with_runtime_attention); another runtime's kernels are formed on the chip,
        # whose compute capability picks the fused attention's kernel (search.setting.prepare_points).
        capability = None if acc is None or acc.calibration is None else acc.calibration.compute_capability
        runtime = (opts.kernels, capability if opts.kernels is not Runtime.OPS else None, opts.sdpa_order)
        seq = (opts.seq_len, opts.context_parallel)  # a CP degree's settings are traced at S/c
        traced_as = (b, seq, opts.traced_dtype, opts.optimizer, opts.strict, opts.capacity_factor, runtime)
        # and what the settings' selective policy re-runs, and whether their TP collectives overlap
        how = (traced_as, opts.selective_recompute, opts.tp_overlap)
        model = model_key(model_path, stages).digest
        key = stages.key(SETTINGS_KIND, model, tps, opts.sequence_parallel, how)
        hit = stages.load(SETTINGS_KIND, key, lambda payload: _check_prepared(payload, b, tps))
        if hit is not None:
            log(f"pricing {name} at micro-batch {b} from its settings (in the cache)")
            return hit
    log(f"pricing {name} at micro-batch {b} from its settings (the model cut to a few blocks)")
    ready, errors, _ = (compute or prepare_points)(model_path, b, tps, opts, acc)
    if key is not None and stages is not None:
        payload = {"settings": [s.to_json() for s in ready], "errors": [[t, sp, e] for t, sp, e in errors]}
        stages.keep(SETTINGS_KIND, key, payload)
    return ready, errors


def _check_prepared(payload: Any, b: int, tps: tuple[int, ...]) -> tuple[list[Setting], list[tuple[int, bool, str]]]:
    """A ``sweep-settings`` payload: settings of micro-batch ``b`` at widths of ``tps``, and
    ``(tp, sequence parallel, why not)`` of the other points."""
    from passes.cache_file import BadEntry
    from phaze.search.setting import Setting

    d = fields(payload, ("settings", "errors"), "settings")
    need(isinstance(d["settings"], list) and isinstance(d["errors"], list), "settings")
    try:
        settings = [Setting.from_json(x) for x in d["settings"]]
    except ValueError as e:
        raise BadEntry(f"does not hold valid settings ({e})") from None
    need(all(s.micro_batch == b and s.tp in tps for s in settings), f"settings of micro-batch {b} at TP {tps}")
    errors = []
    for item in d["errors"]:
        ok = isinstance(item, list) and len(item) == 3 and is_int(item[0]) and item[0] in tps
        need(ok and isinstance(item[1], bool) and isinstance(item[2], str), "(TP, SP, why not) of each other point")
        errors.append((item[0], item[1], item[2]))
    return settings, errors
