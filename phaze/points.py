"""The points of ``phazec --hw``'s sweep: a micro-batch size and a TP width, with or without
sequence parallelism.  Which points a question asks (:func:`tp_widths_of`, :func:`tp_points`: in
the order that breaks ties), how messages name one (:func:`point_label`), how a placed point is
judged (:func:`judge_point`: its throughput, or why it has none: its plan does not fit, or draws
more than ``--power-cap``), which point the sweep keeps (:func:`chosen_point`), and what a run
says when none fits (:class:`NoPlanFits`).  The pipeline's sweep
(:func:`phaze.driver.compile_model`) and the one priced from the search's settings
(:mod:`phaze.search.sweep`) share them, and so do the search's settings (:mod:`phaze.search.setting`)
and a point placed from its template (:mod:`phaze.hw_answer`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from xdsl.dialects.builtin import ModuleOp

from passes.algorithms.option_values import AUTO, Tristate
from phaze.options import DEFAULT_TP_WIDTHS, Options
from phaze.plan.plan_output import Candidate, plan_record
from phaze_ir import keys
from phaze_ir.errors import PhazeError

#: What a compilation says as it goes, a line at a time (phazec: on stderr).
Log = Callable[[str], None]


def tp_widths_of(opts: Options, fixed: tuple[int, int, int] | None) -> tuple[int, ...]:
    """The TP widths a compilation tries: ``--tp``'s, else the fixed placement's, else those of
    :data:`~phaze.options.DEFAULT_TP_WIDTHS` the devices hold (TP 8 is not tried on 4) and
    ``--expert-tensor-parallel`` divides (the experts' width divides the TP width)."""
    if opts.tp_widths:
        return tuple(opts.tp_widths)
    if fixed is not None:
        return (fixed[2],)
    held = tuple(w for w in expert_tp_widths(opts, DEFAULT_TP_WIDTHS) if w <= opts.devices)
    return held or DEFAULT_TP_WIDTHS[:1]


def expert_tp_widths(opts: Options, widths: Sequence[int]) -> tuple[int, ...]:
    """The ``widths`` that ``--expert-tensor-parallel`` divides (all without it): a swept TP
    width the experts' width does not divide is not tried."""
    k = opts.expert_tensor_parallel or 1
    return tuple(w for w in widths if w % k == 0)


def tp_points(opts: Options, tp_widths: Sequence[int]) -> list[tuple[int, bool]]:
    """The ``(TP width, sequence parallel)`` points to compile for ``tp_widths``, in the order
    that breaks ties: each width without and/or with sequence parallelism as
    ``opts.sequence_parallel`` says (SP needs ``tp > 1``; ``auto`` compiles both, without
    first)."""
    points = []
    for tp in tp_widths:
        if tp == 1 or opts.sequence_parallel is Tristate.OFF:
            points.append((tp, False))
        elif opts.sequence_parallel is Tristate.ON:
            points.append((tp, True))
        else:
            points += [(tp, False), (tp, True)]
    return points


def context_parallel_points(opts: Options, model_seq_len: int | None) -> list[Options]:
    """The options of each context-parallel degree a compilation tries, in the order that
    breaks ties (smaller first): ``--context-parallel``'s degree, or under ``auto`` those of
    :func:`~passes.algorithms.context_parallel.auto_degrees`; each with its degree and, past 1,
    the sequence length made explicit (the model's when ``--seq-len`` is not given), which its
    trace divides by the degree (:func:`phaze.options.traced_seq_len`). A degree that cannot
    split the sequence is refused in one line."""
    from passes.algorithms import context_parallel as cp

    seq_len = opts.seq_len or model_seq_len
    asked = opts.context_parallel
    degrees = (asked,) if asked is not AUTO else cp.auto_degrees(seq_len, opts.devices)
    try:
        for c in degrees:
            cp.check_degree(c, seq_len, opts.devices)
    except cp.ContextParallelError as e:
        raise PhazeError(f"--context-parallel: {e}") from e
    return [replace(opts, context_parallel=c, seq_len=seq_len if c > 1 else opts.seq_len) for c in degrees]


def point_label(b: int, t: int, sp: bool, cp: int = 1) -> str:
    """How a point of the sweep is named in messages: ``micro-batch 2, TP 4, SP, CP 8``."""
    return f"micro-batch {b}, TP {t}" + (", SP" if sp else "") + (f", CP {cp}" if cp > 1 else "")


def judge_point(
    module: ModuleOp, b: int, t: int, sp: bool, opts: Options, log: Log, took: str = ""
) -> tuple[Candidate, bool]:
    """The sweep's :class:`Candidate` of one placed point (its throughput 0 when its plan does not
    fit or draws more than ``--power-cap``), said in one line (``took`` after it), and whether
    its plan does not fit (its module then says which constraint binds; over the cap: False)."""
    cp = keys.int_of(module, keys.CONTEXT_PARALLEL, 1)
    where = point_label(b, t, sp, cp)
    plan = plan_record(module)
    feasible = plan.get("feasible") == "yes"
    note = "" if feasible else plan.get("binding", "")
    over = over_power_cap(module, opts.power_cap_w)
    if feasible and over:
        feasible, note = False, over
    cand = Candidate(b, t, plan["throughput_samples_per_s"] if feasible else 0.0, note, sp, cp)
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


def notes_once(candidates: list[Candidate]) -> str:
    """Why each candidate failed, each reason said once with the points it holds for (or just
    the reason, when it holds for all of them)."""
    points: dict[str, list[str]] = {}
    for c in candidates:
        points.setdefault(c.note, []).append(
            f"b={c.micro_batch} t={c.tp}" + (f" c={c.context_parallel}" if c.context_parallel > 1 else "")
        )
    if len(points) == 1 and len(candidates) > 1:
        return f"{next(iter(points))} (at every point)"
    return "; ".join(f"{', '.join(where)}: {note}" for note, where in points.items())


class NoPlanFits(PhazeError):
    """No point of the sweep has a placement that fits (``Options.unfit_plan`` False): the
    message is the one the unfit plan's ``binding`` would give (:func:`no_fit_message`)."""


def no_fit_message(binding: str) -> str:
    """The message a run whose plan does not fit fails with, from the constraint that binds."""
    return binding if "no placement fits" in binding else f"no placement fits: {binding}"
