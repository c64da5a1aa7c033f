"""``phazec --hw``'s output, kept in phaze's cache: asking the same question again answers it
without tracing, compiling or printing anything.

One compilation for one chip (``phazec MODEL --hw CHIP``: the sweep of
:func:`phaze.search.sweep.compile_plan`, a fixed placement, or an earlier ``--emit`` stage) ends
in an :class:`Answer`: the module printed, the plan as JSON (plan stage), its summary for
stderr, what an export needs of the model besides the plan, and the phaze warnings said while
compiling.  That answer is an ``hw-answer`` entry of the cache's store
(:class:`passes.cache_file.Store`: ``<cache>/hw-answer/<key>.json``, checked on load,
never code), keyed by the environment digest (phaze's sources, the Rust extension, the packages'
versions), the model (:func:`phaze.model_key.model_key`: the file's bytes and those of the
helpers it imports), the driver's options (their ``repr``), the chip's data and
the printed form.  A hit reads one file: no model imported, nor torch; its warnings are said
again.  A sweep's settings (the model cut to 3 and 4 blocks, per micro-batch: they do not
depend on the chip, the devices or the batch) are kept as ``sweep-settings`` entries
(:func:`phaze.search.sweep.prepared`), and the schedules a compilation solves are ``schedule``
entries of the same store (the search's; or of ``$PHAZE_SCHEDULE_CACHE`` when set): a new question on
the same model (another chip, devices, batch) reads its settings, and on a chip asked about
before skips the layers already scheduled.  A point compiled before (micro-batch, TP width,
sequence parallelism) is placed again from its ``plan-template`` entry
(:mod:`phaze.plan.plan_template`) instead of being compiled: a question of one point (a fixed
placement) imports no model, nor torch.

What the key cannot see: files a model file reads, and modules it imports only inside a function
(as for the search's entries); ``--cache``/``--no-cache`` say where the cache is or that there is
none.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from passes.algorithms.option_values import AUTO
from passes.cache_file import BadEntry, Store, digest, fields, is_int, is_number, need
from phaze import driver
from phaze.model_key import ModelKey, model_key
from phaze.options import Options, Stage, context_parallel_degree, narrowed
from phaze.pipeline import few_collections
from phaze.plan import plan_template
from phaze.plan.plan_output import plan_json
from phaze.points import chosen_point, judge_point, no_fit_message, point_label, tp_points, tp_widths_of
from phaze_ir.errors import PhazeError, PhazeWarning
from phaze_ir.warning import ReplicatedLinearsWarning

if TYPE_CHECKING:
    from phaze.plan.export import Launchable

#: The store's kind of entry this module keeps.
KIND = "hw-answer"


@dataclass
class Answer:
    """What ``phazec --hw`` writes and says of one compilation."""

    #: The output module printed (the generic form when asked).
    text: str
    #: ``phaze.plan.plan_output.plan_json`` of the plan (None before the plan stage).
    plan: dict[str, Any] | None = None
    #: The plan's summary lines (``plan["summary"]["lines"]``, :mod:`phaze.plan.summary`), "" when
    #: there is no feasible plan.
    summary: str = ""
    #: Each layer's kind in order and the sequence length traced (``phaze.plan.export.ModelFacts``).
    layer_kinds: list[str] = field(default_factory=list)
    seq_len: int | None = None
    #: The model's shape as a launcher builds it (``phaze.model_shape``: the exports' model flags).
    model_shape: dict[str, Any] = field(default_factory=dict)
    #: The warnings said while compiling, as the tools print them, in order (said again on a cache hit).
    warnings: list[str] = field(default_factory=list)
    #: The nearest plan that fits, in one clause, of a plan compiled point by point that does not
    #: (:func:`phaze.search.sweep.nearest_placed`; the settings' sweep says its own as it stops), "" else.
    nearest: str = ""
    #: The narrowing of the options (``--zero``, ``--recompute``) whose plan every ``--export``
    #: target launches, when the sweep narrowed to it (``sweep.compile_launchable``); ``{}``: none.
    narrowed: dict[str, str] = field(default_factory=dict)
    #: Then the fastest plan, not launched, and how much slower the plan is, in a line (said again on a cache hit).
    unlaunched: str = ""


def check_answer(payload: Any) -> Answer:
    """An ``hw-answer`` entry's payload as an :class:`Answer` (:class:`BadEntry` when it does not
    hold one)."""
    d = fields(payload, ("text", "plan", "summary", "layer_kinds", "seq_len", "model_shape", "warnings"), "an answer")
    need(isinstance(d["text"], str) and d["text"] != "", "the output's text")
    need(d["plan"] is None or isinstance(d["plan"], dict), "the plan as JSON")
    if d["plan"] is not None:
        fields(d["plan"], ("feasible", "binding", "candidates"), "the plan as JSON")
        if d["plan"]["feasible"]:
            _check_plan_numbers(d["plan"], d["text"])
    need(isinstance(d["summary"], str), "the plan's summary")
    need(isinstance(d["layer_kinds"], list) and all(isinstance(k, str) for k in d["layer_kinds"]), "layer kinds")
    need(d["seq_len"] is None or (is_int(d["seq_len"]) and d["seq_len"] > 0), "a sequence length")
    need(
        isinstance(d["model_shape"], dict)
        and all(isinstance(v, (int, float, str, bool)) for v in d["model_shape"].values()),
        "the model's shape",
    )
    need(isinstance(d["warnings"], list) and all(isinstance(w, str) for w in d["warnings"]), "warnings")
    nearest = payload.get("nearest", "")  # (an answer kept before it was said)
    need(isinstance(nearest, str), "the nearest plan that fits")
    narrowed, unlaunched = payload.get("narrowed", {}), payload.get("unlaunched", "")
    need(
        isinstance(narrowed, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in narrowed.items()),
        "the narrowing of the options",
    )
    need(isinstance(unlaunched, str), "the fastest plan not launched")
    return Answer(
        d["text"],
        d["plan"],
        d["summary"],
        d["layer_kinds"],
        d["seq_len"],
        d["model_shape"],
        d["warnings"],
        nearest,
        narrowed,
        unlaunched,
    )


def _check_plan_numbers(plan: dict, text: str) -> None:
    """A feasible plan's numbers agree with one another and with the module's text (:class:`BadEntry`
    otherwise): an entry whose hashes were recomputed after its numbers were edited is not served."""
    counts = (
        *("devices", "global_batch", "dp", "pp", "tp", "cp"),
        *("micro_batch_size", "num_micro_batches", "devices_used"),
    )
    need(all(is_int(plan.get(k)) and plan[k] > 0 for k in counts), "the plan's degrees and batch sizes > 0")
    # The DP's devices (rust/phaze-dp/src/search.rs, ``devices_used``): the DP x CP group of
    # each of the pp stages, each rank tp wide.
    need(
        plan["dp"] * plan["cp"] * plan["pp"] * plan["tp"] == plan["devices_used"] <= plan["devices"],
        "a plan whose devices are dp x cp x pp x tp, at most the cluster's",
    )
    need(
        plan["micro_batch_size"] * plan["num_micro_batches"] * plan["dp"] == plan["global_batch"],
        "a plan whose micro-batches make up the global batch",
    )
    time, thr = plan.get("time_per_batch_s"), plan.get("throughput_samples_per_s")
    if not (is_number(time) and is_number(thr) and time > 0 and thr > 0):
        raise BadEntry("does not hold a time per batch and throughput > 0")
    need(math.isclose(thr * time, plan["global_batch"], rel_tol=1e-9), "a throughput that is the batch over its time")
    acc = plan.get("accelerator")
    hbm = acc.get("hbm") if isinstance(acc, dict) else None
    most = hbm.get("bytes") if isinstance(hbm, dict) else None
    memory = plan.get("max_memory_bytes")
    need(is_int(most) and is_int(memory) and 0 <= memory <= most, "memory within the chip's HBM")
    # The JSON's time is the module's: phaze.plan's (the placement's) plus what the power limit
    # adds (phaze.power's power_limit_s), summed as plan_output.plan_record sums them.
    placed = _module_float(text, "plan", "time_per_batch_s")
    added = _module_float(text, "power", "power_limit_s") or 0.0
    if added > 0:
        from passes.algorithms.energy import lengthened_step_s  # (numpy: only for a limited step)

        placed = None if placed is None else lengthened_step_s(placed, added)
    need(
        f"global_batch = {plan['global_batch']}," in text and placed is not None and placed == time,
        "the module's plan (its text and its JSON differ)",
    )


def _module_float(text: str, record: str, field: str) -> float | None:
    """The float ``field`` of the module's ``#phaze.<record><...>`` in its printed ``text``
    (None: not there, or not a decimal literal)."""
    m = re.search(rf"#phaze\.{record}<[^>]*?\b{field} = ([-+0-9.eE]+)[,>]", text)
    return float(m.group(1)) if m else None


@few_collections()
def answer(
    model_path: str,
    opts: Options,
    cache_dir: str | None,
    log,
    *,
    generic: bool = False,
    launch: Launchable | None = None,
) -> Answer:
    """The answer of ``phazec MODEL --hw`` under ``opts``: from the cache under
    ``cache_dir`` when it holds one for these inputs, else compiled (and kept there; None: no
    cache).  Errors are never kept: a question that failed fails again, the same way.
    ``launch``: the plan the sweep keeps is the fastest every ``--export`` target launches
    (:func:`phaze.search.sweep.compile_launchable`; part of the key).

    All of it with few young-generation collections (:func:`phaze.pipeline.few_collections`,
    as the compilation in it already ran), the model file's import and the plan's printing
    too: printing keeps a text for every attribute it prints, and at Python's default
    thresholds the collections it set off went over the compiled module's millions of objects
    again and again (GPT-3 175B's plan: 2.2 s to print, 1.3 s without them, the same bytes;
    importing its model file, torch and transformers: 4.9 s, 4.6 s)."""
    stages = Store.of(cache_dir)
    # Checked before anything slow: the options, the chip (its hardware file read here, once, and
    # handed on to the cache's key and the compilation) and the power cap on it.
    accelerator = driver.check_question(opts)
    inputs = _inputs(model_path, stages, accelerator)
    key = None
    if inputs is not None:  # (a question without exports keeps the key it had before they narrowed the sweep)
        launched = (repr(launch),) if launch is not None else ()
        key = stages.key(KIND, inputs.model.digest, repr(opts), inputs.chip, generic, *launched)
    hit = stages.load(KIND, key, check_answer) if key is not None else None
    if hit is not None:
        log(f"the answer is in the cache ({cache_dir}): nothing compiled (--no-cache compiles it again)")
        for message in hit.warnings:
            warnings.warn(message, PhazeWarning, stacklevel=2)
        if hit.unlaunched:
            log(hit.unlaunched)
        return hit
    if cache_dir is not None and opts.schedule_cache is None and not os.environ.get("PHAZE_SCHEDULE_CACHE"):
        from passes.algorithms.schedule import ScheduleCache

        opts = replace(opts, schedule_cache=ScheduleCache(cache_dir))
    templates = None
    if inputs is not None and opts.emit is Stage.PLAN and not generic:
        templates = plan_template.Templates(stages, inputs.model.digest, inputs.chip, opts)
    with _warnings_said() as said:
        result = _compile(model_path, opts, accelerator, log, generic, stages, templates, inputs, said, launch)
    result.warnings = said
    # An answer placed from a template is one template away: kept only to replace a broken entry
    # of its own (said above), which would otherwise be said again at every question.
    file = stages.file(KIND, key) if key is not None else None
    placed = templates is not None and templates.placed_any
    if key is not None and (not placed or (file is not None and file.exists())):
        stages.keep(KIND, key, asdict(result))
    return result


@dataclass(frozen=True)
class _Inputs:
    """What the cache keys a question's model and chip by."""

    model: ModelKey
    chip: str  #: the chip's data digest ("" before the tiled stage)


def _inputs(model_path: str, stages: Store, accelerator) -> _Inputs | None:
    """The model's key and the digest of the chip ``accelerator`` (None before the tiled stage);
    None without a cache directory: nothing to look up.  Reading the model file's bytes and its
    helpers' is all a hit costs of the model; a file that cannot be read or imported is the
    loader's one-line error, as without a cache."""
    if stages.directory is None:
        return None
    try:
        model = model_key(model_path, stages)
    except PhazeError:
        return None  # the compilation says why, in its own words
    return _Inputs(model, digest(repr(accelerator)) if accelerator is not None else "")


def _compile(
    model_path: str,
    opts: Options,
    accelerator,
    log,
    generic: bool,
    stages: Store,
    templates: plan_template.Templates | None,
    inputs: _Inputs | None,
    said: list[str],
    launch: Launchable | None = None,
) -> Answer:
    """Compile the model on the chip ``accelerator`` (:func:`phaze.search.sweep.compile_plan`, its
    settings kept in ``stages``; a point compiled before is placed from its template in
    ``templates``) and print its module; the template of a plan compiled here is kept
    (``said``: the warnings of its compilation)."""
    from passes.algorithms.placement import PlacementError
    from phaze.plan.export import model_facts
    from phaze.search import sweep

    got = None
    narrowing = sweep.Narrowing()
    try:
        with _replicated_held_back():
            if templates is not None and inputs is not None:
                got = _one_point_from_template(opts, inputs, templates, log)
            if got is not None:
                module, candidates = got
            elif launch is not None:
                module, candidates, narrowing = sweep.compile_launchable(
                    model_path, opts, launch, log, accelerator, stages=stages, templates=templates
                )
            else:
                module, candidates = sweep.compile_plan(
                    model_path, opts, log, accelerator, stages=stages, templates=templates
                )
    except PlacementError as e:  # an option the traced step cannot take (--fp8-params with no FP8
        # linears, --expert-parallel on a dense model): known once the step is priced; one line
        raise PhazeError(str(e)) from e
    if narrowing.options:  # the plan was placed under the narrowed options: it is printed and kept under them
        opts = narrowed(opts, narrowing.options)
        templates = templates.under(opts) if templates is not None else None
    plan = (
        plan_json(module, candidates, opts.recompute, opts.memory_headroom, opts.dp_shard)
        if opts.emit is Stage.PLAN
        else None
    )
    _say_replicated(module)
    nearest = ""
    if plan is not None and not plan["feasible"] and not opts.unfit_plan:  # phazec refuses it: with what fits
        with _replicated_held_back():
            nearest = sweep.nearest_placed(module, opts, log)
    facts = model_facts(module, opts)
    if templates is not None:
        text = templates.text(module)
        templates.keep(module, text, said)
    else:
        from phaze_ir.ir import print_module

        text = print_module(module, generic=generic)
    return Answer(
        text=text,
        plan=plan,
        summary="\n".join(plan["summary"]["lines"]) if plan is not None and plan["summary"] else "",
        layer_kinds=list(facts.layer_kinds),
        seq_len=facts.seq_len,
        model_shape=dict(facts.shape),
        nearest=nearest,
        narrowed=narrowing.options,
        unlaunched=narrowing.said,
    )


def _one_point_from_template(opts: Options, inputs: _Inputs, templates: plan_template.Templates, log) -> tuple | None:
    """What ``compile_plan`` returns for a question of one point (one micro-batch, one TP width,
    sequence parallelism fixed) whose point was compiled before: placed from its template, with
    no model imported (None otherwise)."""
    from passes.algorithms.placement import PlacementError, parse_placement

    name = inputs.model.name
    try:
        fixed = parse_placement(opts.placement, name)
    except PlacementError:
        return None  # the compilation says why
    points = tp_points(opts, tp_widths_of(opts, fixed))
    if len(opts.micro_batches) != 1 or len(points) != 1 or (fixed is not None and fixed[2] != points[0][0]):
        return None
    if opts.context_parallel is AUTO:  # several degrees
        return None
    (t, sp), b, c = points[0], opts.micro_batches[0], context_parallel_degree(opts)
    placed = templates.placed(plan_template.Point(b, t, sp, c))
    if placed is None:
        return None
    log(f"placing {name} at {point_label(b, t, sp, c)} from its compiled plan (in the cache)")
    cand, unfit = judge_point(placed, b, t, sp, opts, log)
    return chosen_point(placed if cand.throughput > 0 else None, placed if unfit else None, [cand], opts)


@contextlib.contextmanager
def _replicated_held_back() -> Iterator[None]:
    """The linears that tensor parallelism keeps replicated, as each width the search tries says
    them for each step it shards (the model cut to 3 and 4 blocks, then the whole: three counts,
    and widths the plan does not take), held back: :func:`_say_replicated` says the plan's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReplicatedLinearsWarning)
        yield


def _say_replicated(module) -> None:
    """The plan's own replicated linears (its ``phaze.tp_replicated`` records: the whole model
    at the plan's TP width), one warning each, in the words of the plan's summary; none for a
    plan without tensor parallelism."""
    from phaze.plan.plan_output import unpriced_ops
    from phaze.plan.summary import replicated_words

    for record in unpriced_ops(module):
        if record["kind"] == "replicated-linears":
            warnings.warn(replicated_words(record), PhazeWarning, stacklevel=2)


@contextlib.contextmanager
def _warnings_said() -> Iterator[list[str]]:
    """The warnings said inside the block, each once, as they are shown (every warning is
    still shown as before): phaze's as they are, a library's or the model file's own as the
    tools say them (:func:`phaze.messages.warning_text`), so that a cache hit, which imports
    no model, says them again in the same words.  Inside, every phaze warning is shown
    (``always``): Python's once-per-line filter would hide one said by an earlier compilation
    in this process from this answer; ``phaze.messages.show_warnings_as`` says each message
    once anyway."""
    from phaze.messages import warning_text

    said: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("always", PhazeWarning)
        previous = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            text = warning_text(message, category, str(filename))
            if text not in said:
                said.append(text)
            previous(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield said


def failure(result: Answer) -> str | None:
    """The message phazec exits 1 with when the answer's plan does not fit (None when it does,
    or before the plan stage)."""
    if result.plan is None or result.plan["feasible"]:
        return None
    return no_fit_message(result.plan["binding"]) + (f"; {result.nearest}" if result.nearest else "")
