"""An HTML report of one search, or of one plan: a single self-contained page from the JSON of
``phazec --json``.

The page of a search (no external resources, no JavaScript; the charts are inline SVG drawn by
matplotlib) shows:

1. a header: the model(s), devices, global batch, the chosen accelerator and placement plan;
2. the plan's summary when the JSON has one (``summary``, phazec's; older JSON: none): its
   headline figures (MFU, causal attention as computed, and PaLM's when it differs; HFU,
   tokens/s, samples/s, time per batch, memory against HBM, the runner-up), the step's time by
   part as one stacked bar, the fullest device's memory by part against the HBM (and what the
   headroom leaves usable), the warnings, its text as printed;
3. throughput against area of every exactly evaluated architecture (``search.points``), the
   optimistic bounds of pruned candidates (``search.bound_points``) in light grey, the Pareto
   front (max throughput, min area) as a step line, the chosen design (a hollow ring, so that
   the co-optimised baseline at its point shows) and the baselines; the axes frame the search's
   own points, a baseline far outside them drawn in an "off scale" band at the edge with its
   true figure in the legend; and, when the points carry ``power_w``, throughput against chip
   power with its front;
4. the pipeline timeline of the chosen plan: Megatron's 1F1B schedule, or its interleaved one
   when the plan has ``virtual_stages`` v > 1 (one row per rank, the ops coloured by chunk),
   every micro-batch (past :data:`MAX_TIMELINE_OPS` bars, the first and last, the gap said on
   the chart) on an axis to the end of the step (the time per batch, a dashed line);
5. the memory of each stage (of each rank when interleaved), stacked by kind, against the HBM
   capacity, with what the plan's ZeRO stage shards;
6. the baselines with their plans and the chosen plan's speed-up over each;
7. search statistics: the space, architectures pruned per stage, wall time per phase (the
   phases adding up to the total; the cost evaluator's timers, inside two of them, apart);
8. in multi-model mode, each model's throughput on the common chip against its own best.

The page of a plan (``phazec --hw CHIP --report``: the JSON has ``candidates`` and no ``search``)
has the header (with sequence parallelism, the schedule, ZeRO, recompute and, when it does not
fit, the binding constraint), the summary, the timeline, the memory and the micro-batch sizes
and TP widths tried; a plan has no scatter, baselines or statistics.

Assumptions: a stage's ``time_s`` is the forward plus backward time of one micro-batch on that
stage (on its rank, under interleaving: the DP prices ranks, so each of a rank's v chunks is
drawn taking 1/v of it); the timeline splits it 1/3 forward, 2/3 backward (illustrative only)
and ignores communication. Without stage times, every stage takes ``time_per_batch_s / (m + pp
- 1)`` (``/ (m + (pp - 1) / v)`` per rank when interleaved).
Points with a missing, non-finite or non-positive throughput or area are infeasible: they are
left off the plot and the front. Every field may be missing; the section then says so or is left
out.

The charts are matplotlib figures rendered by its SVG backend alone (no pyplot, no global state:
the style is a context around each figure), with glyphs as paths (DejaVu Sans, shipped with
matplotlib: the page needs no font), ``svg.hashsalt`` fixed and no date in the metadata, so the
output is deterministic: same input (and matplotlib version), same bytes. Each chart's SVG ids
are prefixed with its name (``breakdown-``, ``footprint-``, ``scatter-``, ``timeline-``,
``memory-``), so the ids of the page are
unique; the data of a chart are groups with fixed ids (``scatter-evaluated``, ``timeline-forward``,
``timeline-forward-1`` for chunk 1 of an interleaved plan, ``memory-params``, ...), which the tests
read. matplotlib is imported only when a chart is drawn.

The page is built from jinja2 templates (``phaze/search/templates``, package data): Python
computes what each section shows (a view: its figures and words, tables as :class:`Table` of
:class:`Cell`, charts as SVG :class:`markupsafe.Markup`), ``sections.html.j2`` has a macro per
section kind that lays it out (the prose of the captions included), ``report.html.j2`` the page
and ``report.css`` its style. Autoescape is on: every text from the JSON (model names, notes,
warnings, ...) is HTML-escaped; only the charts' SVG, which matplotlib writes (escaping its
texts), goes in as it is.
"""

from __future__ import annotations

import functools
import io
import math
import numbers
import re
import types
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import jinja2
from markupsafe import Markup, escape

from phaze.outputs import write_atomically
from phaze.search.pareto import front_indices
from phaze_ir.errors import PhazeError

GIB = 1 << 30
MIB = 1 << 20
#: The most bars (ops) a timeline draws: about 0.5 MB of SVG, and past it a bar is under a point
#: wide on the chart anyway. Beyond, the first and the last micro-batches are drawn (the fill and
#: the drain of the pipeline) and the ones between (its steady state, which repeats) are left out,
#: which the chart and its caption say; the time axis still spans the whole step.
MAX_TIMELINE_OPS = 4096
#: What each ZeRO stage divides over the data-parallel replicas (docs/design.md §6.5).
ZERO_SHARDS = {1: "optimizer state", 2: "optimizer state and gradients", 3: "optimizer state, gradients and parameters"}
MEMORY_KINDS = ("params", "grads", "optimizer", "activations", "workspace")
MEMORY_COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f")
FWD_COLOUR, BWD_COLOUR = "#4e79a7", "#f28e2b"
#: How far towards white the last of a rank's chunks is drawn (the first in the full colour):
#: light enough to tell apart, coloured enough to count as ink (tests/report_browser.py).
CHUNK_LIGHTEN = 0.55
POINT_COLOUR, FRONT_COLOUR, BOUND_COLOUR, BASELINE_COLOUR = "#4e79a7", "#e15759", "#bababa", "#59a14f"
BASELINE_MARKERS = ("s", "^", "v", "P", "X", "<", ">", "h")
#: The parts of the summary's bars, in order (Tableau 10, the family of the colours above).
PART_COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")
#: How far beyond the search's own points (a share of their span) a baseline may lie and still be
#: drawn in place, widening the frame by at most that much. Farther, it is drawn in a narrow "off
#: scale" band at the edge, its true figures in the legend: TPU v4 at 279 mm² beside chips of
#: 25-75 mm² would otherwise squeeze every evaluated chip into a fifth of the width.
OFF_SCALE_STRETCH = 0.5
#: The off-scale band's width (or height), as a share of the framed range.
OFF_SCALE_BAND = 0.08
#: The HBM line is drawn when the fullest stage uses at least this share of it (else it would
#: flatten the bars to nothing; the caption then gives the capacity).
HBM_LINE_MIN_SHARE = 0.05
#: Figure width (inches; 72 pt each, 96 CSS px) of the wide charts.
WIDTH_IN = 10.0

#: The charts' style, applied over matplotlib's defaults (not the user's matplotlibrc).
STYLE = {
    "font.family": "DejaVu Sans",
    "font.size": 9.0,
    "axes.labelsize": 9.5,
    "axes.titlesize": 10.0,
    "xtick.labelsize": 8.5,
    "ytick.labelsize": 8.5,
    "legend.fontsize": 8.5,
    "legend.frameon": False,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.edgecolor": "#555555",
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.color": "#e4e4e4",
    "grid.linewidth": 0.7,
    "svg.fonttype": "path",
    "svg.hashsalt": "phaze-report",
    "svg.image_inline": True,
}
#: No date, creator or licence in the SVG metadata (nothing that changes, nothing external).
SVG_METADATA = {"Date": None, "Creator": None, "Format": None, "Type": None}


# ---------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------


def _num(x: Any) -> float | None:
    """``x`` as a finite float, or None."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def fmt(x: Any) -> str:
    """Counts with thousands separators, floats to 4 significant digits, "—" when missing."""
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return f"{int(x):,}"
    v = _num(x)
    if v is None:
        return "—" if x is None else str(x)
    if v == 0:
        return "0"
    if 1e3 <= abs(v) < 1e15:
        return f"{round(v, 3 - int(math.floor(math.log10(abs(v))))):,.0f}"
    return f"{v:.4g}"


def fmt_bytes(x: Any) -> str:
    """Bytes in GiB (from 1 GiB) or MiB."""
    v = _num(x)
    if v is None:
        return "—"
    return f"{fmt(v / GIB)} GiB" if abs(v) >= GIB else f"{fmt(v / MIB)} MiB"


def accel_summary(acc: dict | None) -> str:
    """One line for an accelerator: tensor cores, vector cores, global buffer, HBM, area."""
    acc = acc or {}
    parts = []
    tc, vc = acc.get("tensor_cores") or {}, acc.get("vector_cores") or {}
    if tc:
        parts.append(f"{fmt(tc.get('count'))} × {fmt(tc.get('pe_x'))}×{fmt(tc.get('pe_y'))} TC")
    if vc:
        parts.append(f"{fmt(vc.get('count'))} × {fmt(vc.get('width'))} VC")
    if _num((acc.get("global_buffer") or {}).get("bytes")) is not None:
        parts.append(f"{fmt(acc['global_buffer']['bytes'] / MIB)} MiB global buffer")
    if _num(acc.get("hbm_bytes")) is not None:
        parts.append(f"{fmt(acc['hbm_bytes'] / GIB)} GiB HBM")
    if _num(acc.get("area_mm2")) is not None:
        parts.append(f"{fmt(acc['area_mm2'])} mm²")
    return ", ".join(parts) or "—"


@dataclass(frozen=True)
class Cell:
    """A table cell as the template shows it: ``text`` (escaped there), right-aligned when
    ``num``; ``bar_px``: a bar that many pixels wide instead of text."""

    text: str = ""
    num: bool = False
    bar_px: int | None = None


@dataclass(frozen=True)
class Table:
    """A table for the template's ``table`` macro: the header, the rows and ``total``, a last row
    in bold that the others add up to."""

    head: Sequence[str]
    rows: Sequence[Sequence[Cell]]
    total: Sequence[Cell] | None = None


def _n(text: str) -> Cell:
    """A right-aligned text cell (a percentage, a speed-up, a missing number)."""
    return Cell(text, num=True)


def _cell(c: Any) -> Cell:
    """``str``: a text cell; a :class:`Cell` as it is; anything else a number, formatted
    (:func:`fmt`) and right-aligned."""
    if isinstance(c, Cell):
        return c
    if isinstance(c, str):
        return Cell(c)
    return Cell(fmt(c), num=True)


def _table(head: Sequence[str], rows: Iterable[Sequence[Any]], total: Sequence[Any] | None = None) -> Table:
    """A :class:`Table` of ``rows`` of cells as :func:`_cell` takes them."""
    return Table(list(head), [[_cell(c) for c in row] for row in rows], [_cell(c) for c in total] if total else None)


# ---------------------------------------------------------------------------------------------
# Pure computations
# ---------------------------------------------------------------------------------------------


def _xy(p: Any) -> tuple[float | None, float | None]:
    if isinstance(p, dict):
        return _num(p.get("area_mm2")), _num(p.get("throughput_samples_per_s"))
    return _num(p[0]), _num(p[1])


def pareto_front(points: Sequence[Any]) -> list[int]:
    """Indices of the Pareto-optimal points (max throughput, min area), sorted by area (then
    index). A point is on the front when no other has area <= and throughput >= with one strict:
    exact duplicates of a front point are all on it. ``points`` are dicts with ``area_mm2`` and
    ``throughput_samples_per_s`` or ``(area, throughput)`` pairs; infeasible ones (missing,
    non-finite or non-positive) are never on the front."""
    rows: list[tuple[float | None, ...]] = []
    for p in points:
        a, t = _xy(p)
        if a is not None and t is not None and a > 0 and t > 0:
            rows.append((a, -t))
        else:
            rows.append((None,))
    return front_indices(rows)


def one_f_one_b(
    pp: int, m: int, fwd: float | Sequence[float], bwd: float | Sequence[float]
) -> list[tuple[int, str, int, float, float]]:
    """Megatron's non-interleaved 1F1B schedule of ``m`` micro-batches on ``pp`` stages, as
    ``(stage, "F"|"B", micro_batch, start, end)`` sorted by (stage, start). ``fwd``/``bwd`` are
    one time for all stages or one per stage. Stage k runs min(pp-k-1, m) warm-up forwards, then
    alternates forward and backward, then drains the backwards; F(k,i) starts after F(k-1,i),
    B(k,i) after B(k+1,i), and each op after the stage's previous one."""
    f = [float(fwd)] * pp if isinstance(fwd, numbers.Real) else [float(x) for x in cast(Sequence[float], fwd)]
    b = [float(bwd)] * pp if isinstance(bwd, numbers.Real) else [float(x) for x in cast(Sequence[float], bwd)]
    orders = []
    for k in range(pp):
        w = min(pp - k - 1, m)
        seq = [("F", i) for i in range(w)]
        for j in range(m - w):
            seq += [("F", w + j), ("B", j)]
        orders.append(seq + [("B", i) for i in range(m - w, m)])

    def after(op: tuple[str, int, int]) -> tuple[str, int, int] | None:
        kind, k, i = op  # the op's (kind, stage, micro-batch)
        dep = ("F", k - 1, i) if kind == "F" else ("B", k + 1, i)
        return dep if 0 <= dep[1] < pp else None

    ops = _replay([[(kind, k, i) for kind, i in seq] for k, seq in enumerate(orders)], after, f, b, "1F1B")
    return [(k, kind, i, start, end) for k, kind, i, start, end, _ in ops]


def _replay(
    orders: list[list[tuple[str, int, int]]],
    after: Any,
    f: list[float],
    b: list[float],
    name: str,
) -> list[tuple[int, str, int, float, float, int]]:
    """Run each rank's ``orders`` (ops ``(kind, piece, micro_batch)``, piece: the stage or chunk
    whose ``f``/``b`` time it takes) in turn, each op starting when its rank is free and the op
    ``after(op)`` names (None: nothing) has ended; ``(rank, kind, micro_batch, start, end,
    piece)`` sorted by (rank, start)."""
    end: dict[tuple[str, int, int], float] = {}
    pos, free = [0] * len(orders), [0.0] * len(orders)
    out = []
    progress = True
    while progress:
        progress = False
        for k, order in enumerate(orders):
            while pos[k] < len(order):
                op = order[pos[k]]
                dep = after(op)
                if dep is not None and dep not in end:
                    break
                kind, c, i = op
                start = max(free[k], end[dep] if dep is not None else 0.0)
                free[k] = end[op] = start + (f[c] if kind == "F" else b[c])
                out.append((k, kind, i, start, free[k], c))
                pos[k] += 1
                progress = True
    assert all(pos[k] == len(order) for k, order in enumerate(orders)), f"{name} deadlock"
    return sorted(out, key=lambda o: (o[0], o[3]))


def interleaved_1f1b(
    pp: int, v: int, m: int, fwd: float | Sequence[float], bwd: float | Sequence[float]
) -> list[tuple[int, str, int, float, float, int]]:
    """Megatron-LM's interleaved 1F1B schedule (``forward_backward_pipelining_with_interleaving``)
    of ``m`` micro-batches on ``pp`` ranks with ``v`` model chunks each, as ``(rank, "F"|"B",
    micro_batch, start, end, chunk)`` sorted by (rank, start). Chunk c of the pp·v runs on rank
    c mod pp; ``fwd``/``bwd`` are one time for all chunks or one per chunk (by c).

    Each rank runs m·v forward units (a chunk on a micro-batch) in groups of pp micro-batches:
    the group's pp micro-batches on the rank's chunk 0, then on its chunk 1, ..., so the k-th
    forward is on the rank's chunk ``(k // pp) % v`` (when pp divides m, as Megatron requires;
    otherwise the last group is smaller). Its backward units run in the same order with the
    chunks reversed (the last chunk's gradients come first). Rank k runs ``min((pp − k − 1)·2 +
    (v − 1)·pp, m·v)`` warm-up forwards, then alternates one forward and one backward, then
    drains the backwards. F(c, i) starts after F(c − 1, i) (on rank (c − 1) mod pp), B(c, i)
    after B(c + 1, i) (the last chunk's after its own forward), each op after its rank's previous
    one. With equal chunks the makespan is (m + (pp − 1)/v)·v·(f + b): the bubble of Narayanan et
    al. (2021) that the placement DP prices."""
    n = pp * v
    f = [float(fwd)] * n if isinstance(fwd, numbers.Real) else [float(x) for x in cast(Sequence[float], fwd)]
    b = [float(bwd)] * n if isinstance(bwd, numbers.Real) else [float(x) for x in cast(Sequence[float], bwd)]
    # (rank-local chunk, micro-batch) of each forward unit, in the order every rank runs them.
    units = [(j, i) for g in range(0, m, pp) for j in range(v) for i in range(g, min(g + pp, m))]
    total = len(units)
    orders = []
    for k in range(pp):
        fw = [("F", j * pp + k, i) for j, i in units]
        bw = [("B", (v - 1 - j) * pp + k, i) for j, i in units]
        w = min((pp - k - 1) * 2 + (v - 1) * pp, total)
        seq = fw[:w]
        for q in range(total - w):
            seq += [fw[w + q], bw[q]]
        orders.append(seq + bw[total - w :])

    def after(op: tuple[str, int, int]) -> tuple[str, int, int] | None:
        kind, c, i = op  # the op's (kind, chunk, micro-batch)
        if kind == "F":
            return ("F", c - 1, i) if c > 0 else None
        return ("B", c + 1, i) if c < n - 1 else ("F", c, i)

    return _replay(orders, after, f, b, "interleaved 1F1B")


# ---------------------------------------------------------------------------------------------
# Charts (matplotlib, SVG backend only)
# ---------------------------------------------------------------------------------------------


def _mpl() -> Any:
    """The parts of matplotlib the charts use (imported on first use), or a PhazeError saying how
    to get it. Nothing global is touched: no pyplot, no backend switch."""
    try:
        import matplotlib.style
        from matplotlib import lines, patches, path, ticker
        from matplotlib.backends.backend_svg import FigureCanvasSVG
        from matplotlib.figure import Figure
    except ImportError as e:
        raise PhazeError(f"the report draws its charts with matplotlib: pip install matplotlib ({e})") from e
    return types.SimpleNamespace(
        style=matplotlib.style,
        lines=lines,
        patches=patches,
        path=path,
        ticker=ticker,
        Figure=Figure,
        FigureCanvasSVG=FigureCanvasSVG,
    )


def _figure(mpl: Any, w: float, h: float) -> Any:
    """A figure with constrained layout, on an SVG canvas of its own."""
    fig = mpl.Figure(figsize=(w, h), layout="constrained")
    mpl.FigureCanvasSVG(fig)
    return fig


def _axes(fig: Any) -> Any:
    """The figure's one axes; its background is the group ``plot-area`` (where the data are)."""
    ax = fig.add_subplot()
    ax.patch.set_gid("plot-area")
    return ax


def _svg(mpl: Any, fig: Any, name: str, label: str) -> str:
    """``fig`` as inline SVG markup: no XML prologue, ids prefixed with ``name`` (unique in the
    page), sized by its viewBox (CSS scales it down on narrow windows), labelled for a reader."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", pad_inches=0.06, metadata=SVG_METADATA)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg") :]
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{name}-{m[1]}"', svg)
    svg = re.sub(r'href="#([^"]+)"', lambda m: f'href="#{name}-{m[1]}"', svg)
    svg = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{name}-{m[1]})", svg)
    svg = svg.replace('<style type="text/css">*{', '<style type="text/css">svg.chart *{')  # not the page's
    return svg.replace("<svg ", f'<svg class="chart" role="img" aria-label="{escape(label)}" ', 1).rstrip()


def _chart(draw: Any, name: str, label: str, *args: Any) -> Markup:
    """``draw(mpl, *args)`` (which returns a figure) under the report's style, as inline SVG:
    markup the templates insert as it is (matplotlib escapes the texts it writes)."""
    mpl = _mpl()
    with mpl.style.context(["default", STYLE]):
        return Markup(_svg(mpl, draw(mpl, *args), name, label))


def _ticks(mpl: Any, scale: float = 1.0) -> Any:
    """A tick formatter: the value divided by ``scale``, as :func:`fmt` writes it."""
    return mpl.ticker.FuncFormatter(lambda v, _pos: fmt(0 if abs(v) < 1e-12 * scale else v / scale))


def si_prefix(top: float) -> tuple[str, float]:
    """The SI prefix (and its factor) for an axis of seconds reaching ``top``: s, ms, µs or ns."""
    for prefix, scale in (("", 1.0), ("m", 1e-3), ("µ", 1e-6)):
        if top >= scale:
            return prefix, scale
    return "n", 1e-9


def _rects(
    mpl: Any, ax: Any, boxes: Sequence[tuple[float, float, float, float]], colour: str, gid: str, lw: float = 0.4
) -> None:
    """Rectangles ``(x0, x1, y0, y1)`` as one compound path (one SVG ``<path>`` in the group
    ``gid``, a subpath per rectangle), edged white ``lw`` points wide: a timeline draws thousands,
    and a path each would repeat its style and clip for each. Nothing is drawn for no boxes."""
    if not boxes:
        return
    code = mpl.path.Path
    verts, codes = [], []
    for x0, x1, y0, y1 in boxes:
        verts += [(x0, y0), (x1, y0), (x1, y1), (x0, y1), (x0, y0)]
        codes += [code.MOVETO, code.LINETO, code.LINETO, code.LINETO, code.CLOSEPOLY]
    patch = mpl.patches.PathPatch(code(verts, codes), facecolor=colour, edgecolor="white", linewidth=lw)
    patch.set_gid(gid)
    ax.add_artist(patch)  # not add_patch: its data limits, unused (set by each chart), cost seconds


def _legend_right(ax: Any, handles: Sequence[Any] | None = None) -> None:
    """The legend outside the axes, on the right (constrained layout makes room for it)."""
    kw = {"handles": handles} if handles is not None else {}
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, **kw)


def _axis_frame(core: Sequence[float], extra: Sequence[float]) -> tuple[float, float, bool, bool]:
    """The range ``(lo, hi)`` of one axis framing the values ``core`` and those of ``extra`` (the
    baselines) that lie within :data:`OFF_SCALE_STRETCH` of the core's span beyond it, and whether
    some of ``extra`` lie farther below and above (off the scale)."""
    lo, hi = min(core), max(core)
    span = (hi - lo) or abs(hi) or 1.0
    reach = (lo - OFF_SCALE_STRETCH * span, hi + OFF_SCALE_STRETCH * span)
    inside = [x for x in extra if reach[0] <= x <= reach[1]]
    return (
        min([lo, *inside]),
        max([hi, *inside]),
        any(x < reach[0] for x in extra),
        any(x > reach[1] for x in extra),
    )


def _frame_ticks(mpl: Any, axis: Any, lo: float, hi: float) -> None:
    """Ticks (and grid lines) on ``axis`` within ``[lo, hi]`` alone: none in an off-scale band."""
    ticks = [t for t in mpl.ticker.MaxNLocator(nbins=8).tick_values(lo, hi) if lo - 1e-9 * abs(hi) <= t <= hi]
    axis.set_major_locator(mpl.ticker.FixedLocator(ticks))


def _draw_scatter(
    mpl: Any, pts, bounds, front, base, chosen, xlabel: str = "Chip area (mm²)", xunit: str = "mm²"
) -> Any:
    """The evaluated points, the bounds, the front, the baselines and the chosen design (a ring,
    over whatever lies at its point: the co-optimised baseline is the chosen design). The axes
    frame the search's own points; a baseline far outside them (:func:`_axis_frame`) is drawn in a
    shaded band at the edge, its true figure in the legend."""
    fig = _figure(mpl, WIDTH_IN, 4.4)
    ax = _axes(fig)
    core = pts + bounds + ([chosen] if chosen else []) or [(a, t) for _, a, t in base]
    x_lo, x_hi, x_below, x_above = _axis_frame([a for a, _ in core], [a for _, a, _ in base])
    _, y_hi, _, y_above = _axis_frame([0.0] + [t for _, t in core], [t for _, _, t in base])
    pad = 0.03 * ((x_hi - x_lo) or x_hi)
    x_lo, x_hi, y_hi = max(x_lo - pad, 0.0), x_hi + pad, y_hi * 1.06
    band_x, band_y = OFF_SCALE_BAND * (x_hi - x_lo), OFF_SCALE_BAND * y_hi
    # the plotted range: the frame and its off-scale bands
    view = (x_lo - band_x if x_below else x_lo, x_hi + band_x if x_above else x_hi, y_hi + band_y if y_above else y_hi)
    if chosen:
        ax.scatter(
            *chosen,
            s=150,
            marker="o",
            facecolors="none",
            edgecolors="#000000",
            linewidths=1.6,
            zorder=7,
            label="chosen (ring)",
            gid="chosen",
        )
    if front:
        fx = [a for a, _ in front] + [x_hi]
        fy = [t for _, t in front] + [front[-1][1]]
        ax.step(fx, fy, where="post", color=FRONT_COLOUR, lw=1.6, zorder=4, label="Pareto front", gid="front-line")
        ax.scatter(
            [a for a, _ in front],
            [t for _, t in front],
            s=30,
            c=FRONT_COLOUR,
            edgecolors="white",
            linewidths=0.8,
            zorder=5,
            gid="front",
        )
    if pts:
        ax.scatter(
            [a for a, _ in pts],
            [t for _, t in pts],
            s=12,
            c=POINT_COLOUR,
            alpha=0.5,
            linewidths=0,
            zorder=3,
            label="evaluated exactly",
            gid="evaluated",
        )
    if bounds:
        ax.scatter(
            [a for a, _ in bounds],
            [t for _, t in bounds],
            s=7,
            c=BOUND_COLOUR,
            linewidths=0,
            zorder=2,
            label="bound of a pruned candidate",
            gid="bounds",
        )
    for j, (name, a, t) in enumerate(base):
        # off the scale: in the middle of the band, the true figures in the label
        x = x_lo - band_x / 2 if a < x_lo else x_hi + band_x / 2 if a > x_hi else a
        y = y_hi + band_y / 2 if t > y_hi else t
        off = [f"{fmt(a)} {xunit}"] if x != a else []
        off += [f"{fmt(t)} samples/s"] if y != t else []
        ax.scatter(
            [x],
            [y],
            s=48,
            marker=BASELINE_MARKERS[j % len(BASELINE_MARKERS)],
            c=BASELINE_COLOUR,
            edgecolors="#1d4d16",
            linewidths=0.7,
            zorder=6,
            label=f"baseline: {name}" + (f" (off scale: {', '.join(off)})" if off else ""),
            gid=f"baseline-{j}",
        )
    shade = {"facecolor": "#f0f0f0", "edgecolor": "none", "zorder": 0}
    note = {"fontsize": 7.5, "color": "#555555", "zorder": 1}
    if x_below:
        ax.axvspan(view[0], x_lo, gid="offscale-left", **shade)
        ax.text(x_lo - band_x / 2, y_hi * 0.02, "off scale", rotation=90, ha="center", va="bottom", **note)
    if x_above:
        ax.axvspan(x_hi, view[1], gid="offscale-right", **shade)
        ax.text(x_hi + band_x / 2, y_hi * 0.02, "off scale", rotation=90, ha="center", va="bottom", **note)
    if y_above:
        ax.axhspan(y_hi, view[2], gid="offscale-top", **shade)
        ax.text((x_lo + x_hi) / 2, y_hi + band_y / 2, "off scale", ha="center", va="center", **note)
    ax.set_xlim(view[0], view[1])
    ax.set_ylim(0, view[2])
    _frame_ticks(mpl, ax.xaxis, x_lo, x_hi)
    _frame_ticks(mpl, ax.yaxis, 0.0, y_hi)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("Throughput (samples/s)")
    ax.xaxis.set_major_formatter(_ticks(mpl))
    ax.yaxis.set_major_formatter(_ticks(mpl))
    _legend_right(ax)
    return fig


def _lighter(colour: str, share: float) -> str:
    """``colour`` (``#rrggbb``) mixed with white, ``share`` of the way."""
    rgb = [int(colour[q : q + 2], 16) for q in (1, 3, 5)]
    return "#" + "".join(f"{round(c + share * (255 - c)):02x}" for c in rgb)


def _draw_timeline(
    mpl: Any, pp: int, ops, v: int = 1, step: float | None = None, gap: tuple[int, int] | None = None
) -> Any:
    """The ops of :func:`one_f_one_b` (``v`` = 1: one group per direction) or of
    :func:`interleaved_1f1b` (one group per direction and rank-local chunk, the later chunks in
    lighter shades, so the interleaving shows), the time axis to the end of the schedule or of the
    step (``step``: the plan's time per batch, marked by a dashed line), whichever is later. ``gap``:
    the first and last micro-batch left out (:data:`MAX_TIMELINE_OPS`), said on the chart."""
    row_in = min(0.32, max(0.06, 3.2 / pp))
    fig = _figure(mpl, WIDTH_IN, max(1.7, 0.95 + row_in * pp))
    ax = _axes(fig)
    t_end = max([o[4] for o in ops] + [step or 0.0])
    prefix, scale = si_prefix(t_end)
    # (kind, rank-local chunk or None, colour, gid, legend label)
    series: list[tuple[str, int | None, str, str, str]] = [
        ("F", None, FWD_COLOUR, "forward", "forward"),
        ("B", None, BWD_COLOUR, "backward", "backward"),
    ]
    if v > 1:
        shade = [CHUNK_LIGHTEN * j / (v - 1) for j in range(v)]
        series = [
            (kind, j, _lighter(base, shade[j]), f"{name}-{j}", f"{name}, chunk {j}")
            for kind, base, name in (("F", FWD_COLOUR, "forward"), ("B", BWD_COLOUR, "backward"))
            for j in range(v)
        ]
    # points per second of the axes (about 80 % of the width); the white edges between bars at
    # most a fifth of the narrowest, so that a dense timeline keeps its colours
    pt_per_s = 0.8 * WIDTH_IN * 72 / t_end
    lw = min(0.4, 0.2 * pt_per_s * min(o[4] - o[3] for o in ops))
    for kind, j, colour, gid, _label in series:
        boxes = [(o[3], o[4], o[0] - 0.4, o[0] + 0.4) for o in ops if o[1] == kind and (j is None or o[5] // pp == j)]
        _rects(mpl, ax, boxes, colour, gid, lw)
    # micro-batch numbers in the bars wide and tall enough for them, dark on the light shades of
    # the later chunks
    if row_in * 72 * 0.8 >= 9:
        for o in ops:
            k, i, s, e = o[0], o[2], o[3], o[4]
            light = v > 1 and CHUNK_LIGHTEN * (o[5] // pp) / (v - 1) > 0.3
            if (e - s) * pt_per_s >= 4 + 5 * len(str(i)):
                ax.text(
                    (s + e) / 2,
                    k,
                    str(i),
                    ha="center",
                    va="center",
                    color="#222222" if light else "white",
                    fontsize=7,
                    clip_on=True,
                    in_layout=False,
                )
    patch = mpl.patches.Patch
    handles = [patch(facecolor=colour, label=label) for _k, _j, colour, _g, label in series]
    if step:
        style = {"color": "#000000", "lw": 1.1, "ls": (0, (6, 3))}
        ax.axvline(step, zorder=4, gid="step", **style)
        handles.append(mpl.lines.Line2D([], [], label="end of step", **style))
    if gap:
        # between the fill and the drain, where the left-out steady state would be
        ax.text(
            t_end / 2,
            (pp - 1) / 2,
            f"micro-batches {gap[0]}–{gap[1]} not drawn",
            ha="center",
            va="center",
            fontsize=8,
            color="#222222",
            bbox={"facecolor": "white", "edgecolor": "#888888", "boxstyle": "round,pad=0.3"},
            zorder=5,
            gid="gap",
        )
    ax.set_xlim(0, t_end * 1.005)
    ax.set_ylim(pp - 0.5, -0.5)
    ax.yaxis.set_major_locator(mpl.ticker.FixedLocator(range(0, pp, math.ceil(pp / 16))))
    ax.grid(axis="y", visible=False)
    ax.set_xlabel(f"Time ({prefix}s)")
    ax.set_ylabel("Pipeline rank" if v > 1 else "Pipeline stage")
    ax.xaxis.set_major_formatter(_ticks(mpl, scale))
    ax.yaxis.set_major_formatter(_ticks(mpl))
    _legend_right(ax, handles)
    return fig


def _draw_memory(
    mpl: Any, bars, kinds, colours, unit: tuple[str, int], hbm: float | None, axis: str = "Pipeline stage"
) -> Any:
    n = len(bars)
    fig = _figure(mpl, min(WIDTH_IN, max(6.5, 3.0 + 0.32 * n)), 3.8)
    ax = _axes(fig)
    name, size = unit
    acc = [0.0] * n
    for q, (kind, colour) in enumerate(zip(kinds, colours)):
        boxes = []
        for j, b in enumerate(bars):
            v = b[q] if q < len(b) else 0.0
            if v > 0:
                boxes.append((j - 0.35, j + 0.35, acc[j] / size, (acc[j] + v) / size))
            acc[j] += v
        _rects(mpl, ax, boxes, colour, kind)
    top = max(acc)
    handles = [mpl.patches.Patch(facecolor=c, label=k) for k, c in zip(kinds, colours)][::-1]
    if hbm:
        ax.axhline(hbm / size, color="#000000", lw=1.1, ls=(0, (6, 3)), zorder=4, gid="hbm")
        handles.append(
            mpl.lines.Line2D([], [], color="#000000", lw=1.1, ls=(0, (6, 3)), label=f"HBM capacity ({fmt_bytes(hbm)})")
        )
        top = max(top, hbm)
    pad = max(0.1, (3 - n) / 2)
    ax.set_xlim(-0.5 - pad, n - 0.5 + pad)
    ax.set_ylim(0, (top / size) * 1.08 or 1)
    ax.xaxis.set_major_locator(mpl.ticker.FixedLocator(range(0, n, math.ceil(n / 24))))
    ax.grid(axis="x", visible=False)
    ax.set_xlabel(axis)
    ax.set_ylabel(f"Memory ({name})")
    ax.xaxis.set_major_formatter(_ticks(mpl))
    ax.yaxis.set_major_formatter(_ticks(mpl))
    _legend_right(ax, handles)
    return fig


def _draw_stack(
    mpl: Any,
    parts: Sequence[tuple[str, str, float, str]],
    unit: tuple[str, float],
    limits: Sequence[tuple[str, float, str, Any]] = (),
) -> Any:
    """One horizontal bar stacked from ``parts`` (``(gid, legend label, value, colour)``, in
    order; none of no size), in ``unit`` (name, size); ``limits``: lines across it (``(gid,
    value, legend label, line style)``: the HBM capacity, what its headroom leaves usable)."""
    fig = _figure(mpl, WIDTH_IN, 1.5)
    ax = _axes(fig)
    name, size = unit
    at = 0.0
    handles = []
    for gid, label, v, colour in parts:
        if v > 0:
            _rects(mpl, ax, [(at / size, (at + v) / size, -0.3, 0.3)], colour, gid)
            handles.append(mpl.patches.Patch(facecolor=colour, label=label))
            at += v
    top = at
    for gid, v, label, ls in limits:
        style = {"color": "#000000", "lw": 1.1, "ls": ls}
        ax.axvline(v / size, zorder=4, gid=gid, **style)
        handles.append(mpl.lines.Line2D([], [], label=label, **style))
        top = max(top, v)
    ax.set_xlim(0, top / size * 1.02 or 1)
    ax.set_ylim(-0.5, 0.5)
    ax.yaxis.set_major_locator(mpl.ticker.NullLocator())
    ax.grid(axis="y", visible=False)
    ax.set_xlabel(name)
    ax.xaxis.set_major_formatter(_ticks(mpl))
    fig.legend(handles=handles, loc="outside lower center", ncols=min(4, len(handles)))
    return fig


# ---------------------------------------------------------------------------------------------
# Sections: what each shows, computed here; how, in templates/sections.html.j2
# ---------------------------------------------------------------------------------------------


def _unit(x: Any, unit: str) -> str:
    return "—" if _num(x) is None else f"{fmt(x)} {unit}"


def _schedule(d: dict) -> str | None:
    """The pipeline schedule as phazec's ``--pipeline-schedule`` writes it (None: not said)."""
    v = d.get("virtual_stages")
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        return None
    return "1f1b" if v == 1 else f"interleaved:{v}"


def _plan_text(d: dict) -> str:
    """A plan's settings in words, those it gives: "DP 4, PP 2, TP 1, SP off, schedule
    interleaved:2, ZeRO 1, ..." (the header's, and each baseline's, in the same words)."""
    sp = d.get("sequence_parallel")
    plan = [
        ("DP", d.get("dp")),
        ("PP", d.get("pp")),
        ("TP", d.get("tp")),
        ("SP", None if sp is None else ("on" if sp else "off")),
        ("schedule", _schedule(d)),
        ("ZeRO", d.get("zero")),
        ("EP", d.get("expert_parallel")),
        ("ranks", d.get("rank_order") or None),  # how devices are numbered into groups
        ("capacity factor", d.get("capacity_factor")),  # None (dropless, or no experts): left out
        ("micro-batch", d.get("micro_batch_size")),
        ("micro-batches", d.get("num_micro_batches")),
    ]
    return ", ".join(f"{k} {fmt(v)}" for k, v in plan if v is not None) or "—"


def _header_view(d: dict, title: str = "search") -> dict:
    """The page's heading and its table of the run: rows ``(label, text)``."""
    models = d.get("models") or ([d["model"]] if d.get("model") else [])
    acc = d.get("accelerator") or {}
    rows = [
        ("Model" + ("s" if len(models) > 1 else ""), ", ".join(map(str, models)) or "—"),
        ("Devices", fmt(d.get("devices"))),
        ("Global batch", fmt(d.get("global_batch"))),
        ("Accelerator", (f"{acc['name']}: " if acc.get("name") else "") + accel_summary(acc)),
        ("Plan", _plan_text(d)),
    ]
    if title == "plan":
        policies = sorted({str(s.get("recompute")) for s in d.get("stages") or [] if s.get("recompute")})
        setting = str(d.get("recompute") or "—")
        rows += [
            ("Placement", str(d.get("placement") or "—")),
            ("Recompute", setting + (f" ({', '.join(policies)})" if setting == "auto" and policies else "")),
        ]
        if d.get("feasible") is False:
            rows.append(("Fits", f"no: {d.get('binding') or 'no placement fits'}"))
    rows += [
        ("Throughput", _unit(d.get("throughput_samples_per_s"), "samples/s")),
        ("Time per batch", _unit(d.get("time_per_batch_s"), "s")),
        ("Max memory", fmt_bytes(d.get("max_memory_bytes"))),
    ]
    search = d.get("search") or {}
    if search.get("objective") not in (None, "throughput"):
        best = [p for p in search.get("points") or [] if p.get("best")]
        score = _num(best[0].get("score")) if best else None
        rows.append(("Objective", f"{search['objective']}: {_unit(score, str(search.get('objective_unit', '')))}"))
    power, cost, carbon = d.get("power") or {}, d.get("cost") or {}, d.get("carbon") or {}
    if power:
        rows.append(
            (
                "Power",
                f"{_unit(power.get('chip_power_w'), 'W')} per chip, {_unit(power.get('step_energy_j'), 'J')} per step",
            )
        )
    if cost:
        rows.append(
            ("Cost to make", f"{_unit(cost.get('chip_usd'), 'USD')} per chip, {_unit(cost.get('cluster_usd'), 'USD')}")
        )
    if carbon and carbon.get("kgco2e_per_step") is not None:
        rows.append(("Carbon", f"{_unit(carbon.get('kgco2e_per_step'), 'kg CO2e')} per step"))
    return {"kind": "header", "title": title, "name": ", ".join(map(str, models)) or "report", "rows": rows}


def _header(d: dict, title: str = "search") -> str:
    """The header section as HTML."""
    return _section_html(_header_view(d, title))


def _part_label(key: str) -> str:
    """A part's key in words: ``tp_comm_s`` -> "TP comm", ``params`` -> "params"."""
    words = re.sub(r"_(s|bytes)$", "", str(key)).replace("_", " ")
    return re.sub(r"\b(tp|dp|pp|ep|sp)\b", lambda m: m[1].upper(), words)


def _gid(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "-", str(key))


def _summary(d: dict) -> dict | None:
    """The plan's summary (the JSON's ``summary``, as phazec prints it on stderr): its headline
    figures, where the step's time goes (a stacked bar), the memory of the fullest device by part
    against its HBM, why the runner-up lost, the warnings. None when the JSON has none (older
    JSON); the figures are the summary's own, none computed here."""
    s = d.get("summary")
    if not isinstance(s, dict) or not s:
        return None

    def pct(x: Any) -> str | None:
        v = _num(x)
        return None if v is None else f"{fmt(100 * v)} %"

    mem = {str(k): v for k, v in (s.get("memory_bytes") or {}).items() if _num(v) is not None}
    used = sum(mem.values()) if mem else None
    hbm = _num(s.get("hbm_bytes"))
    hbm = hbm if hbm and hbm > 0 else None
    # the share of HBM plans must leave free (phazec --memory-headroom), when the summary gives one
    headroom = _num(s.get("memory_headroom"))
    usable = hbm * (1 - headroom) if hbm and headroom and 0 < headroom < 1 else None
    memory = None
    if used is not None:
        memory = fmt_bytes(used) + (f" of {fmt_bytes(hbm)} HBM ({fmt(100 * used / hbm)} %)" if hbm else "")
        if usable is not None:
            memory += f"; {fmt_bytes(usable)} usable ({fmt(100 * cast(float, headroom))} % headroom)"
    runner = s.get("runner_up") if isinstance(s.get("runner_up"), dict) else {}
    rows = [
        (
            "MFU",
            pct(s.get("mfu_causal")),
            "model FLOPs per second over the chips' peak"
            + (
                f"; convention: {s['mfu_causal_convention']}" if isinstance(s.get("mfu_causal_convention"), str) else ""
            ),
        ),
        (
            "MFU (PaLM's)",
            pct(s.get("mfu_palm")) if s.get("mfu_palm") != s.get("mfu_causal") else None,
            "the same"
            + (f"; convention: {s['mfu_palm_convention']}" if isinstance(s.get("mfu_palm_convention"), str) else ""),
        ),
        ("HFU", pct(s.get("hfu")), "hardware FLOPs (recompute included) over the peak"),
        ("Tokens/s", None if _num(s.get("tokens_per_s")) is None else fmt(s["tokens_per_s"]), ""),
        ("Samples/s", None if _num(s.get("samples_per_s")) is None else fmt(s["samples_per_s"]), ""),
        ("Time per batch", _unit(s.get("time_per_batch_s"), "s") if _num(s.get("time_per_batch_s")) else None, ""),
        ("Memory per device", memory, "the fullest device"),
        ("Workspace", str(s["workspace"]) if isinstance(s.get("workspace"), str) and s["workspace"] else None, ""),
        ("Runner-up", f"{runner.get('name', '?')}: {runner.get('why', '')}".rstrip(": ") if runner else None, ""),
    ]
    view: dict[str, Any] = {
        "kind": "summary",
        "rows": [r for r in rows if r[1] is not None],
        "breakdown": None,
        "footprint": None,
        "hbm_off_scale": None,  # the HBM capacity, when too large for the footprint's scale
        "warnings": [str(w) for w in s.get("warnings") or []],
        "lines": "\n".join(str(x) for x in s.get("lines") or []),
    }
    parts = {str(k): v for k, v in (s.get("breakdown_s") or {}).items() if _num(v) is not None}
    total = _num(s.get("time_per_batch_s")) or sum(parts.values())
    if parts and total and total > 0:
        prefix, scale = si_prefix(total)
        stack = [
            (_gid(k), f"{_part_label(k)} {fmt(v / scale)} {prefix}s ({100 * v / total:.1f} %)", v, colour)
            for (k, v), colour in zip(parts.items(), _cycle(PART_COLOURS, len(parts)))
        ]
        unit_s = (f"Time ({prefix}s)", scale)
        view["breakdown"] = _chart(_draw_stack, "breakdown", "time per batch by part", stack, unit_s)
    if mem and used and used > 0:
        # the HBM line when the device uses a visible share of it (else it flattens the bar)
        on_chart = hbm if hbm and used >= HBM_LINE_MIN_SHARE * hbm else None
        unit = ("GiB", GIB) if max(used, on_chart or 0) >= GIB else ("MiB", MIB)
        colours = _cycle(PART_COLOURS, len(mem))
        stack = [
            (
                _gid(k),
                f"{_part_label(k)} {fmt_bytes(v)}",
                v,
                MEMORY_COLOURS[MEMORY_KINDS.index(k)] if k in MEMORY_KINDS else colours[j],
            )
            for j, (k, v) in enumerate(mem.items())
        ]
        limits: list[tuple[str, float, str, Any]] = []
        if on_chart:
            limits.append(("hbm", on_chart, f"HBM capacity ({fmt_bytes(on_chart)})", (0, (6, 3))))
            if usable is not None:
                share = fmt(100 * cast(float, headroom))
                limits.append(("usable", usable, f"usable ({share} % headroom)", (0, (1.5, 2))))
        unit_b = (f"Memory ({unit[0]})", float(unit[1]))
        view["footprint"] = _chart(_draw_stack, "footprint", "memory per device by part", stack, unit_b, limits)
        if hbm and not on_chart:
            view["hbm_off_scale"] = fmt_bytes(hbm)
    return view


def _draw_cp_ring(mpl: Any, c: int, hop: str, step: str) -> Any:
    """The context-parallel ring: c devices on a circle, each passing its keys and values to the
    next (``hop`` says a hop's time, ``step`` a step's attention beside it)."""
    fig = _figure(mpl, 4.6, 4.2)
    ax = _axes(fig)
    ax.set_axis_off()
    ax.set_xlim(-1.45, 1.45)
    ax.set_ylim(-1.35, 1.35)
    ax.set_aspect("equal")
    shown = min(c, 16)  # past 16 devices the circle holds the first 15 and the last
    angles = [math.pi / 2 - 2 * math.pi * k / shown for k in range(shown)]
    points = [(math.cos(a), math.sin(a)) for a in angles]
    for k, (x, y) in enumerate(points):
        nx, ny = points[(k + 1) % shown]
        ax.annotate(
            "", xy=(x + 0.82 * (nx - x), y + 0.82 * (ny - y)), xytext=(x + 0.18 * (nx - x), y + 0.18 * (ny - y)),
            arrowprops={"arrowstyle": "->", "color": BWD_COLOUR, "lw": 1.4},
        )  # fmt: skip
        label = str(k if k < shown - 1 or shown == c else c - 1)
        ax.add_patch(mpl.patches.Circle((x, y), 0.13, facecolor=FWD_COLOUR, edgecolor="white", zorder=3, gid=f"cp{k}"))
        ax.text(x, y, label, ha="center", va="center", color="white", fontsize=8, zorder=4)
    ax.text(0, 0.12, f"CP {c}", ha="center", va="center", fontsize=12)
    ax.text(0, -0.12, f"hop {hop}\nbeside a step of {step}", ha="center", va="center", fontsize=8)
    return fig


def _cp_ring(d: dict) -> dict | None:
    """The context-parallel ring of a plan (None without CP): its devices around the ring and,
    per direction, what one micro-batch's attentions take on one device: the steps (the traced
    attention), the hops beside them, and the ring's whole time (docs/design.md §6.8a)."""
    c = int(_num(d.get("cp")) or 1)
    ring = d.get("cp_ring") or {}
    if c <= 1 or not ring:
        return None
    rows = []
    for phase, name in (("fwd", "forward"), ("bwd", "backward")):
        step, hop, total = (_num(ring.get(f"{phase}_{k}_s")) or 0.0 for k in ("step", "hop", "ring"))
        hidden = 1 - max(0.0, total - c * step) / ((c - 1) * hop) if hop > 0 and c > 1 else 1.0
        rows.append([name, _unit(step, "s"), _unit(hop, "s"), _unit(total, "s"), f"{100 * max(0.0, hidden):.0f} %"])
    steps = (_num(ring.get("fwd_step_s")) or 0.0) + (_num(ring.get("bwd_step_s")) or 0.0)
    hops = (_num(ring.get("fwd_hop_s")) or 0.0) + (_num(ring.get("bwd_hop_s")) or 0.0)
    return {
        "kind": "cp_ring",
        "c": c,
        "kv": fmt_bytes(_num(ring.get("kv_bytes")) or 0),
        "chart": _chart(
            _draw_cp_ring, "cp-ring", "context-parallel ring", c, _unit(hops / 2, "s"), _unit(steps / 2, "s")
        ),
        "table": _table(["pass", "a step (sum)", "a hop (sum)", "the ring (sum)", "hops hidden"], rows),
    }


def _cycle(colours: Sequence[str], n: int) -> list[str]:
    return [colours[j % len(colours)] for j in range(n)]


def _candidates(d: dict) -> dict | None:
    """The micro-batch sizes and TP widths the plan stage tried (a plan's ``candidates``)."""
    cands = d.get("candidates") or []
    if not cands:
        return None
    chosen = (d.get("micro_batch_size"), d.get("tp"), bool(d.get("sequence_parallel")))
    rows = []
    for c in cands:
        t = _num(c.get("throughput_samples_per_s"))
        point = (c.get("micro_batch_size"), c.get("tp"), bool(c.get("sequence_parallel")))
        rows.append(
            (
                c.get("micro_batch_size"),
                c.get("tp"),
                "on" if c.get("sequence_parallel") else "off",
                t if t else _n("—"),
                "chosen" if d.get("feasible") is not False and point == chosen else "",
                str(c.get("note") or ""),
            )
        )
    head = ["micro-batch", "TP", "SP", "throughput (samples/s)", "", "note"]
    return {"kind": "candidates", "table": _table(head, rows)}


def _scatter(d: dict) -> dict:
    search = d.get("search") or {}
    raw = search.get("points") or []
    pts = [(a, t) for a, t in map(_xy, raw) if a and t and a > 0 and t > 0]
    bounds = [(a, t) for a, t in map(_xy, search.get("bound_points") or []) if a and t and a > 0 and t > 0]
    chosen = (_num((d.get("accelerator") or {}).get("area_mm2")), _num(d.get("throughput_samples_per_s")))
    if None in chosen:
        chosen = next((_xy(p) for p in raw if isinstance(p, dict) and p.get("best")), (None, None))
    base = [(str(b.get("name", "?")), *_xy(b)) for b in d.get("baselines") or []]
    base = [(n, a, t) for n, a, t in base if a and t and a > 0 and t > 0]
    ca, ct = chosen
    picked = (ca, ct) if ca is not None and ct is not None and ca > 0 and ct > 0 else None
    view: dict[str, Any] = {"kind": "scatter", "chart": None, "points": len(pts), "front": 0, "bounds": len(bounds)}
    if pts or bounds or base or picked:
        front = [pts[i] for i in pareto_front(pts)]
        view["front"] = len(front)
        view["chart"] = _chart(_draw_scatter, "scatter", "throughput vs chip area", pts, bounds, front, base, picked)
    return view


def _power_scatter(d: dict) -> dict | None:
    """Throughput against the chip's power at its plan (``power_w`` of ``search.points``: the
    search priced power, its template has an ``[energy]`` table), with its Pareto front (max
    throughput, min power); None when no point has a power."""
    raw = (d.get("search") or {}).get("points") or []
    pts, chosen = [], None
    for p in raw:
        if not isinstance(p, dict):
            continue
        w, t = _num(p.get("power_w")), _num(p.get("throughput_samples_per_s"))
        if w and t and w > 0 and t > 0:
            pts.append((w, t))
            if p.get("best"):
                chosen = (w, t)
    if not pts:
        return None
    front = [pts[i] for i in pareto_front(pts)]
    svg = _chart(_draw_scatter, "power", "throughput vs chip power", pts, [], front, [], chosen, "Chip power (W)")
    return {"kind": "power", "chart": svg, "points": len(pts), "front": len(front)}


def _virtual_stages(d: dict) -> int:
    """The plan's chunks per rank v: 1 (plain 1F1B) unless ``virtual_stages`` > 1 and the stages
    are the pp·v chunks, chunk c on rank c mod pp (else the stages are drawn as they are)."""
    v = d.get("virtual_stages")
    pp = d.get("pp")
    if not (isinstance(v, int) and isinstance(pp, int) and v > 1 and pp > 1):
        return 1
    stages = d.get("stages") or []
    if len(stages) != pp * v or any(s.get("rank", c % pp) != c % pp for c, s in enumerate(stages)):
        return 1
    return v


def _timeline(d: dict) -> dict:
    """The pipeline timeline: ``chart`` None (with ``pp`` 0: no plan; else the stages take no
    time) or the chart of the whole schedule, with what its caption says (``gap``: the
    micro-batches left out, ``keep`` of the ``m`` drawn; ``step``: the time per batch as
    ``(value, SI prefix)``)."""
    stages = d.get("stages") or []
    pp = int(d.get("pp") or len(stages) or 0)
    m = d.get("num_micro_batches")
    if not m and d.get("global_batch") and d.get("dp") and d.get("micro_batch_size"):
        m = d["global_batch"] // (d["dp"] * d["micro_batch_size"])
    m = int(m or 0)
    view: dict[str, Any] = {"kind": "timeline", "chart": None, "pp": 0, "v": 1, "m": m, "gap": None, "step": None}
    if pp <= 0 or m <= 0:
        return view
    view["pp"] = pp
    v = view["v"] = _virtual_stages(d)
    times = [_num(s.get("time_s")) for s in stages]
    if v > 1:
        # each chunk of a rank takes 1/v of the rank's time per micro-batch (the stage entries of
        # a rank's chunks carry its time)
        if None in times:
            t = _num(d.get("time_per_batch_s"))
            times = [t / (m + (pp - 1) / v) if t else 1.0] * (pp * v)
        chunk_t = [cast(float, t) / v for t in times]
        ops = interleaved_1f1b(pp, v, m, [t / 3 for t in chunk_t], [2 * t / 3 for t in chunk_t])
    else:
        if len(times) != pp or None in times:
            t = _num(d.get("time_per_batch_s"))
            times = [t / (m + pp - 1) if t else 1.0] * pp
        stage_t = cast(list[float], times)  # no None left
        ops = [(*o, o[0]) for o in one_f_one_b(pp, m, [t / 3 for t in stage_t], [2 * t / 3 for t in stage_t])]
    if not max(o[4] for o in ops) > 0:
        return view  # the stages take no time
    # Past MAX_TIMELINE_OPS the first and the last micro-batches are drawn, the middle ones not;
    # the axis spans the schedule and the plan's time per batch either way.
    keep = max(1, MAX_TIMELINE_OPS // (2 * pp * v))  # micro-batches drawn
    gap = None
    if keep < m:
        head = (keep + 1) // 2
        gap = (head, m - (keep - head) - 1)
        ops = [o for o in ops if not gap[0] <= o[2] <= gap[1]]
    step = _num(d.get("time_per_batch_s"))
    step = step if step and step > 0 else None
    view["chart"] = _chart(_draw_timeline, "timeline", "pipeline timeline", pp, ops, v, step, gap)
    view["gap"] = (*gap, keep) if gap else None
    if step:
        prefix, scale = si_prefix(step)
        view["step"] = (step / scale, prefix)
    return view


def _layers(x: Any) -> str:
    """A stage's ``layers`` as given: ``[0, 8]`` stays ``[0, 8]`` (no claim on its bounds)."""
    return "[" + ", ".join(map(fmt, x)) + "]" if isinstance(x, list) else fmt(x)


def _zero_caption(d: dict) -> str:
    """What the plan's ZeRO stage shards over its data-parallel replicas, in words ('' when the
    JSON does not say)."""
    z, dp = d.get("zero"), d.get("dp")
    if not isinstance(z, int) or isinstance(z, bool) or not isinstance(dp, int) or dp < 1:
        return ""
    replicas = f"{fmt(dp)} data-parallel replica{'s' if dp > 1 else ''}"
    if z not in ZERO_SHARDS:
        return (
            f"Nothing is sharded over the {replicas} (ZeRO-0): each holds all of its parameters, "
            "gradients and optimizer state."
        )
    what = ZERO_SHARDS[z]
    if dp == 1:
        return f"ZeRO-{z} shards the {what} over the data-parallel replicas, but there is 1: nothing is divided."
    gathered = "; the parameters include the two layers gathered at a time" if z >= 3 else ""
    return (
        f"{what[0].upper()}{what[1:]} sharded over the {replicas} (ZeRO-{z}): each device holds "
        f"1/{fmt(dp)} of it{gathered}."
    )


def _memory(d: dict) -> dict:
    """The memory of each stage (of each rank when interleaved) as a chart and a table; ``hbm``:
    the capacity, ``hbm_share``: the fullest's share of it in % when too small for the line to be
    drawn (None: it is)."""
    stages = d.get("stages") or []
    pp = d.get("pp")
    v = _virtual_stages(d)
    # Under interleaving a rank's chunks carry the rank's memory: one bar per rank.
    per_rank = stages[: cast(int, pp)] if v > 1 else stages
    what = "rank" if v > 1 else "stage"
    view: dict[str, Any] = {"kind": "memory", "what": what, "v": v, "chart": None, "table": None}
    view.update(hbm=None, hbm_share=None, zero=_zero_caption(d))
    bars = []
    for s in per_rank:
        mem = s.get("memory")
        if isinstance(mem, dict) and mem:
            bars.append([_num(mem.get(k)) or 0.0 for k in MEMORY_KINDS])
        else:
            bars.append([_num(s.get("memory_bytes")) or 0.0])
    if not bars:
        return view
    split = any(len(b) > 1 for b in bars)
    kinds, colours = (MEMORY_KINDS, MEMORY_COLOURS) if split else (("total",), (POINT_COLOUR,))
    hbm = _num((d.get("accelerator") or {}).get("hbm_bytes"))
    hbm = hbm if hbm and hbm > 0 else None
    used = max(sum(b) for b in bars)
    on_chart = hbm if hbm and used >= HBM_LINE_MIN_SHARE * hbm else None
    unit = ("GiB", GIB) if max(used, on_chart or 0) >= GIB else ("MiB", MIB)
    if used > 0:
        label, axis = f"memory per {what}", f"Pipeline {what}"
        view["chart"] = _chart(_draw_memory, "memory", label, bars, kinds, colours, unit, on_chart, axis)
    if hbm:
        view["hbm"] = fmt_bytes(hbm)
        view["hbm_share"] = None if on_chart else 100 * used / hbm
    head = ["stage", "layers", "devices", "recompute", "in flight", "memory", "time (s)", "exposed DP (s)"]
    rows = [
        (
            str(j),
            *([str(s.get("rank", "—"))] if v > 1 else []),
            _layers(s.get("layers")),
            s.get("devices"),
            str(s.get("recompute") or "—"),
            s.get("in_flight"),
            fmt_bytes(s.get("memory_bytes")),
            s.get("time_s"),
            s.get("exposed_dp_s"),
        )
        for j, s in enumerate(stages)
    ]
    if v > 1:  # the rows are chunks; the numbers are their rank's
        head = ["chunk", "rank", *head[1:]]
    view["table"] = _table(head, rows)
    return view


def _baselines(d: dict) -> dict | None:
    bl = d.get("baselines") or []
    if not bl:
        return None
    objective = (d.get("search") or {}).get("objective") or "throughput"
    other = objective != "throughput"
    key = "score" if other else "throughput_samples_per_s"
    ours = next((_num(b.get(key)) for b in bl if b.get("name") == "co-optimized"), None)
    ours = ours if other else _num(d.get("throughput_samples_per_s"))
    rows = []
    for b in bl:
        t = _num(b.get(key))
        ok = t is not None and t > 0
        acc = dict(b.get("accelerator") or {})
        for k in ("area_mm2", "hbm_bytes"):
            acc.setdefault(k, b.get(k))
        rows.append(
            (
                str(b.get("name", "?")),
                accel_summary(acc),
                # the settings the baseline's plan gives (none when it found no plan: DP 0)
                _plan_text(b) if b.get("dp") else "—",
                t if ok else _n("—"),
                _n(f"{fmt(ours / t)}×" if ok and ours and t else "—"),
                str(b.get("note") or ""),
            )
        )
    head = [
        "baseline",
        "accelerator",
        "plan",
        f"{objective} ({(d.get('search') or {}).get('objective_unit', '')})" if other else "throughput (samples/s)",
        "gain of chosen" if other else "speed-up of chosen",
        "note",
    ]
    return {"kind": "baselines", "table": _table(head, rows)}


def _stats(d: dict) -> dict | None:
    s = d.get("search") or {}
    if not s:
        return None
    cand = _num(s.get("candidates"))
    rows = [(k, s.get(k)) for k in ("space", "candidates", "architectures", "settings", "evaluated") if k in s]
    wall = {k: v for k, v in (s.get("wall_s") or {}).items() if _num(v) is not None}
    total = _num(wall.get("total")) or sum(v for k, v in wall.items() if k != "total")
    if total and cand:
        rows.append(("candidates per second", cand / total))
    if total and _num(s.get("evaluated")):
        rows.append(("exact evaluations per second", s["evaluated"] / total))
    view: dict[str, Any] = {"kind": "stats", "table": _table(["", "value"], rows), "pruned": None}
    view.update(phases=None, timers=None)
    pruned = s.get("pruned") or {}
    if pruned:
        # The stages prune architectures (each with all its settings): their counts and the
        # evaluated ones add up to the architectures, not to the candidates.
        archs = _num(s.get("architectures"))
        left, prow = archs, []
        for k, v in pruned.items():
            v = _num(v) or 0
            left = left - v if left is not None else None
            prow.append(
                (
                    str(k).replace("_", " "),
                    int(v) if float(v).is_integer() else v,
                    _n(f"{fmt(100 * v / archs)} %" if archs else "—"),
                    int(left) if left is not None and left >= 0 else _n("—"),
                )
            )
        view["pruned"] = _table(["stage", "pruned", "% of architectures", "remaining"], prow)
    if wall:
        view["phases"], view["timers"] = _wall_times(wall, total)
    return view


def _wall_times(wall: dict[str, float], total: float) -> tuple[Table, Table | None]:
    """``search.wall_s`` as two tables: the phases, one after the other, and what the run spent
    outside them, adding up to the total (its own row, last); then the cost evaluator's timers,
    which run inside the baselines and search phases (counting them again would not add up; None
    when there are none). The bars are on one scale, the total's."""
    from phaze.search.engine import TIMERS

    peak = max(wall.values())

    def bar(v: float) -> Cell:
        return Cell(num=True, bar_px=round(100 * v / (total or peak or 1)))

    phases = [(str(k), v) for k, v in wall.items() if k != "total" and k not in TIMERS]
    timers = [(str(k).replace("_", " "), v) for k, v in wall.items() if k in TIMERS]
    rows: list[Sequence[Any]] = [(k, v, bar(v)) for k, v in phases]
    foot = None
    if "total" in wall:
        rest = wall["total"] - sum(v for _, v in phases)
        if phases and rest > 0:
            rows.append(("other (outside the phases)", rest, bar(rest)))
        foot = ("total", wall["total"], bar(wall["total"]))
    timer_table = _table(["timer", "seconds", ""], [(k, v, bar(v)) for k, v in timers]) if timers else None
    return _table(["phase", "seconds", ""], rows, foot), timer_table


def _models(d: dict) -> dict | None:
    det = d.get("models_detail") or []
    if not det:
        return None
    rows = []
    for r in det:
        t, own = _num(r.get("throughput_samples_per_s")), _num(r.get("own_best_samples_per_s"))
        loss = _num(r.get("loss"))
        if loss is None and t is not None and own:
            loss = 1 - t / own
        rows.append((str(r.get("model", "?")), t, own, _n(f"{fmt(100 * loss)} %" if loss is not None else "—")))
    head = ["model", "throughput on common chip (samples/s)", "own best (samples/s)", "loss"]
    return {"kind": "models", "table": _table(head, rows)}


def is_plan(data: dict) -> bool:
    """Whether ``data`` is the JSON of one plan (``phazec --hw``: it lists the ``candidates`` it
    tried and has no ``search``), not of an architecture search."""
    return "candidates" in data and "search" not in data


# ---------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------


@functools.cache
def _templates() -> jinja2.Environment:
    """The report's templates (``phaze/search/templates``, shipped in the package), HTML-escaping
    every value they show (autoescape) but the charts' SVG, which is :class:`markupsafe.Markup`;
    an undefined name is an error, not an empty string."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("phaze.search", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        auto_reload=False,
    )
    env.filters["fmt"] = fmt
    env.filters["plural"] = _plural
    env.filters["squash"] = _squash
    return env


def _squash(text: Any) -> Any:
    """``text`` with each run of white space one space, none at the ends (a caption written over
    several lines of a template, on one line of the page); markup stays markup."""
    out = re.sub(r"\s+", " ", str(text)).strip()
    return Markup(out) if isinstance(text, Markup) else out


def _plural(n: Any, one: str, many: str | None = None) -> str:
    """``n`` and the word for it: "1 stage", "4 stages", "2 micro-batches" (``many`` given)."""
    return f"{fmt(n)} {one if n == 1 else many or one + 's'}"


def _section_html(view: dict) -> str:
    """One section (a view of :func:`render`'s) as HTML, by its template macro."""
    return str(getattr(_templates().get_template("sections.html.j2").module, view["kind"])(view))


def render(data: dict) -> str:
    """The report of one search, or of one plan (:func:`is_plan`), from the JSON of ``phazec
    --json``, as one self-contained HTML page: what each section shows is computed here (the
    section functions' views), the page is ``templates/report.html.j2``."""
    title = ", ".join(map(str, data.get("models") or [data.get("model") or "search"]))
    if is_plan(data):
        parts = [
            _header_view(data, "plan"),
            _summary(data),
            _cp_ring(data),
            _timeline(data),
            _memory(data),
            _candidates(data),
        ]
    else:
        parts = [
            _header_view(data),
            _summary(data),
            _scatter(data),
            _power_scatter(data),
            _timeline(data),
            _memory(data),
            _baselines(data),
            _stats(data),
            _models(data),
        ]
    page = _templates().get_template("report.html.j2")
    return page.render(title=title, sections=[p for p in parts if p])


def write(path: Any, data: dict) -> None:
    """Write :func:`render` of ``data`` to ``path`` (UTF-8, atomically: a failed write leaves
    the previous file); a PhazeError if it cannot."""
    write_atomically(path, render(data))
