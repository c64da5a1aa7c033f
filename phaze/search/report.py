"""An HTML report of one search: a single self-contained page from the JSON of ``phazec --json``.

The page (no external resources, no JavaScript; plots are inline SVG written here) shows:

1. a header: the model(s), devices, global batch, the chosen accelerator and placement plan;
2. throughput against area of every exactly evaluated architecture (``search.points``), the
   optimistic bounds of pruned candidates (``search.bound_points``) in light grey, the Pareto
   front (max throughput, min area) as a step line, the chosen design and the baselines;
3. the 1F1B pipeline timeline of the chosen plan (Megatron's non-interleaved schedule);
4. the memory of each stage, stacked by kind, against the HBM capacity;
5. the baselines with the chosen plan's speed-up over each;
6. search statistics: the space, candidates pruned per stage, wall time per phase;
7. in multi-model mode, each model's throughput on the common chip against its own best.

Assumptions: a stage's ``time_s`` is the forward plus backward time of one micro-batch on that
stage; the timeline splits it 1/3 forward, 2/3 backward (illustrative only) and ignores
communication. Without stage times, every stage takes ``time_per_batch_s / (m + pp - 1)``.
Points with a missing, non-finite or non-positive throughput or area are infeasible: they are
left off the plot and the front. Every field may be missing; the section then says so or is left
out. Output is deterministic: same input, same bytes.
"""

from __future__ import annotations

import html
import math
import numbers
from collections.abc import Iterable, Sequence
from typing import Any

from phaze_ir.errors import PhazeError

GIB = 1 << 30
MIB = 1 << 20
MAX_TIMELINE_MB = 16
MEMORY_KINDS = ("params", "grads", "optimizer", "activations", "workspace")
MEMORY_COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f")
FWD_COLOUR, BWD_COLOUR = "#4e79a7", "#f28e2b"

CSS = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1000px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ccc;margin-top:2em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px}
td.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#f4f4f4}
.bar{display:inline-block;height:.8em;background:#4e79a7}.cap,.empty{color:#555;font-size:.9em}
svg{display:block;margin:.5em 0}svg text{font-size:11px;font-family:sans-serif}"""


# ---------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------


def esc(x: Any) -> str:
    """``x`` as escaped HTML text."""
    return html.escape(str(x))


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
        parts.append(f"{fmt(acc['global_buffer']['bytes'] / MIB)} MiB GB")
    if _num(acc.get("hbm_bytes")) is not None:
        parts.append(f"{fmt(acc['hbm_bytes'] / GIB)} GiB HBM")
    if _num(acc.get("area_mm2")) is not None:
        parts.append(f"{fmt(acc['area_mm2'])} mm²")
    return ", ".join(parts) or "—"


def _n(text: str) -> tuple[str, str]:
    """A right-aligned text cell (a percentage, a speed-up, a missing number)."""
    return ("html", esc(text))


def _table(head: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """An HTML table; ``str`` cells are escaped, numbers formatted and right-aligned. A cell
    given as ``("html", markup)`` is inserted as is, right-aligned (see :func:`_n`)."""
    out = ["<table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>"]
    for row in rows:
        cells = []
        for c in row:
            if isinstance(c, tuple) and c[0] == "html":
                cells.append(f'<td class="n">{c[1]}</td>')
            elif isinstance(c, str):
                cells.append(f"<td>{esc(c)}</td>")
            else:
                cells.append(f'<td class="n">{esc(fmt(c))}</td>')
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "\n".join(out) + "\n</table>"


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
    keyed = []
    for i, p in enumerate(points):
        a, t = _xy(p)
        if a is not None and t is not None and a > 0 and t > 0:
            keyed.append((a, -t, i))
    keyed.sort()
    front, best_t, best_a = [], -math.inf, None
    for a, neg_t, i in keyed:
        t = -neg_t
        if t > best_t or (t == best_t and a == best_a):
            front.append(i)
            best_t, best_a = t, a
    return front


def one_f_one_b(
    pp: int, m: int, fwd: float | Sequence[float], bwd: float | Sequence[float]
) -> list[tuple[int, str, int, float, float]]:
    """Megatron's non-interleaved 1F1B schedule of ``m`` micro-batches on ``pp`` stages, as
    ``(stage, "F"|"B", micro_batch, start, end)`` sorted by (stage, start). ``fwd``/``bwd`` are
    one time for all stages or one per stage. Stage k runs min(pp-k-1, m) warm-up forwards, then
    alternates forward and backward, then drains the backwards; F(k,i) starts after F(k-1,i),
    B(k,i) after B(k+1,i), and each op after the stage's previous one."""
    f = [float(fwd)] * pp if isinstance(fwd, numbers.Real) else [float(x) for x in fwd]
    b = [float(bwd)] * pp if isinstance(bwd, numbers.Real) else [float(x) for x in bwd]
    orders = []
    for k in range(pp):
        w = min(pp - k - 1, m)
        seq = [("F", i) for i in range(w)]
        for j in range(m - w):
            seq += [("F", w + j), ("B", j)]
        orders.append(seq + [("B", i) for i in range(m - w, m)])
    end: dict[tuple[int, str, int], float] = {}
    pos, free = [0] * pp, [0.0] * pp
    out = []
    progress = True
    while progress:
        progress = False
        for k in range(pp):
            while pos[k] < len(orders[k]):
                kind, i = orders[k][pos[k]]
                dep = (k - 1, "F", i) if kind == "F" else (k + 1, "B", i)
                if 0 <= dep[0] < pp and dep not in end:
                    break
                start = max(free[k], end.get(dep, 0.0))
                free[k] = end[(k, kind, i)] = start + (f[k] if kind == "F" else b[k])
                out.append((k, kind, i, start, free[k]))
                pos[k] += 1
                progress = True
    assert all(pos[k] == len(orders[k]) for k in range(pp)), "1F1B deadlock"
    return sorted(out, key=lambda o: (o[0], o[3]))


def nice_ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    """About ``n`` round tick values (1, 2, 5 × 10^k steps) covering [lo, hi]."""
    if not hi > lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(n - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(s * mag for s in (1, 2, 2.5, 5, 10) if s * mag >= raw)
    first = math.floor(lo / step + 1e-9)
    last = math.ceil(hi / step - 1e-9)
    return [round(k * step, 12) for k in range(first, last + 1)]


# ---------------------------------------------------------------------------------------------
# SVG helpers
# ---------------------------------------------------------------------------------------------


class Frame:
    """A plot area: data ranges ``xt``/``yt`` (tick lists, whose ends are the range) mapped to a
    ``w``×``h`` pixel box at margins ``left``/``top`` inside the SVG."""

    def __init__(
        self,
        xt: list[float],
        yt: list[float],
        w: int = 640,
        h: int = 360,
        left: int = 70,
        top: int = 20,
        bottom: int = 45,
        right: int = 20,
    ):
        self.xt, self.yt, self.w, self.h, self.left, self.top = xt, yt, w, h, left, top
        self.width, self.height = left + w + right, top + h + bottom

    def sx(self, x: float) -> float:
        return self.left + (x - self.xt[0]) / ((self.xt[-1] - self.xt[0]) or 1) * self.w

    def sy(self, y: float) -> float:
        return self.top + self.h - (y - self.yt[0]) / ((self.yt[-1] - self.yt[0]) or 1) * self.h

    def open(self, label: str) -> str:
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}"'
            f' viewBox="0 0 {self.width} {self.height}" role="img" aria-label="{esc(label)}">'
        )

    def axes(self, xlabel: str, ylabel: str, xticks: bool = True, yticks: bool = True) -> str:
        """Frame, grid lines and tick labels (of the axes asked for) and axis titles."""
        L, T, W, H = self.left, self.top, self.w, self.h
        out = [f'<rect x="{L}" y="{T}" width="{W}" height="{H}" fill="none" stroke="#888"/>']
        for x in self.xt if xticks else []:
            px = self.sx(x)
            out.append(
                f'<line x1="{px:.1f}" y1="{T}" x2="{px:.1f}" y2="{T + H}" stroke="#eee"/>'
                f'<text x="{px:.1f}" y="{T + H + 14}" text-anchor="middle">{esc(fmt(x))}</text>'
            )
        for y in self.yt if yticks else []:
            py = self.sy(y)
            out.append(
                f'<line x1="{L}" y1="{py:.1f}" x2="{L + W}" y2="{py:.1f}" stroke="#eee"/>'
                f'<text x="{L - 4}" y="{py + 4:.1f}" text-anchor="end">{esc(fmt(y))}</text>'
            )
        out.append(f'<text x="{L + W / 2:.1f}" y="{T + H + 34}" text-anchor="middle">{esc(xlabel)}</text>')
        out.append(
            f'<text transform="translate(14 {T + H / 2:.1f}) rotate(-90)" text-anchor="middle">{esc(ylabel)}</text>'
        )
        return "\n".join(out)


def circles(frame: Frame, xy: Iterable[tuple[float, float]], r: float, style: str) -> str:
    """A group of circles sharing one style (coordinates rounded to 0.1 px)."""
    body = "".join(f'<circle cx="{frame.sx(x):.1f}" cy="{frame.sy(y):.1f}" r="{r}"/>' for x, y in xy)
    return f"<g {style}>{body}</g>"


def legend(x: float, y: float, items: Sequence[tuple[str, str]]) -> str:
    """Colour swatches with labels in a row starting at (x, y)."""
    out = []
    for label, colour in items:
        out.append(
            f'<rect x="{x:.0f}" y="{y - 9:.0f}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{x + 14:.0f}" y="{y:.0f}">{esc(label)}</text>'
        )
        x += 24 + 7 * len(label)
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------


def _unit(x: Any, unit: str) -> str:
    return "—" if _num(x) is None else f"{fmt(x)} {unit}"


def _header(d: dict) -> str:
    models = d.get("models") or ([d["model"]] if d.get("model") else [])
    acc = d.get("accelerator") or {}
    plan = [
        ("DP", d.get("dp")),
        ("PP", d.get("pp")),
        ("TP", d.get("tp")),
        ("micro-batch", d.get("micro_batch_size")),
        ("micro-batches", d.get("num_micro_batches")),
    ]
    plan_txt = ", ".join(f"{k} {fmt(v)}" for k, v in plan if v is not None) or "—"
    rows = [
        ("Model" + ("s" if len(models) > 1 else ""), ", ".join(map(str, models)) or "—"),
        ("Devices", fmt(d.get("devices"))),
        ("Global batch", fmt(d.get("global_batch"))),
        ("Accelerator", (f"{acc['name']}: " if acc.get("name") else "") + accel_summary(acc)),
        ("Plan", plan_txt),
        ("Throughput", _unit(d.get("throughput_samples_per_s"), "samples/s")),
        ("Time per batch", _unit(d.get("time_per_batch_s"), "s")),
        ("Max memory", fmt_bytes(d.get("max_memory_bytes"))),
    ]
    body = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    return f"<h1>phaze search: {esc(', '.join(map(str, models)) or 'report')}</h1>\n<table>{body}</table>"


def _scatter(d: dict) -> str:
    search = d.get("search") or {}
    raw = search.get("points") or []
    pts = [(a, t) for a, t in map(_xy, raw) if a and t and a > 0 and t > 0]
    bounds = [(a, t) for a, t in map(_xy, search.get("bound_points") or []) if a and t and a > 0 and t > 0]
    chosen = (_num((d.get("accelerator") or {}).get("area_mm2")), _num(d.get("throughput_samples_per_s")))
    if None in chosen:
        chosen = next((_xy(p) for p in raw if isinstance(p, dict) and p.get("best")), (None, None))
    base = [(str(b.get("name", "?")), *_xy(b)) for b in d.get("baselines") or []]
    base = [(n, a, t) for n, a, t in base if a and t and a > 0 and t > 0]
    extra = ([chosen] if None not in chosen else []) + [(a, t) for _, a, t in base]
    every = pts + bounds + extra
    if not every:
        return '<h2>Throughput vs area</h2>\n<p class="empty">No evaluated points.</p>'
    xs, ys = [p[0] for p in every], [p[1] for p in every]
    pad = 0.02 * ((max(xs) - min(xs)) or max(xs))
    fr = Frame(nice_ticks(max(min(xs) - pad, 0.0), max(xs) + pad), nice_ticks(0, max(ys) * 1.05))
    out = [
        "<h2>Throughput vs area</h2>",
        fr.open("throughput vs area"),
        fr.axes("area (mm²)", "throughput (samples/s)"),
    ]
    if bounds:
        out.append(circles(fr, bounds, 1.5, 'fill="#ccc"'))
    out.append(circles(fr, pts, 2, 'fill="#4e79a7" fill-opacity="0.5"'))
    front = [pts[i] for i in pareto_front(pts)]
    if front:
        path = (
            f"M{fr.sx(front[0][0]):.1f},{fr.sy(front[0][1]):.1f}"
            + "".join(f"H{fr.sx(a):.1f}V{fr.sy(t):.1f}" for a, t in front[1:])
            + f"H{fr.sx(fr.xt[-1]):.1f}"
        )
        out.append(f'<path d="{path}" fill="none" stroke="#e15759" stroke-width="1.5"/>')
        out.append(circles(fr, front, 3.5, 'class="pareto" fill="#e15759" stroke="#fff"'))
    for name, a, t in base:
        x, y = fr.sx(a), fr.sy(t)
        out.append(
            f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" fill="#59a14f"/>'
            f'<text x="{x + 7:.1f}" y="{y + 4:.1f}">{esc(name)}</text>'
        )
    if None not in chosen:
        x, y = fr.sx(chosen[0]), fr.sy(chosen[1])
        out.append(
            f'<path d="M{x:.1f},{y - 7:.1f}l6,7l-6,7l-6,-7z" fill="#000"/>'
            f'<text x="{x + 8:.1f}" y="{y - 6:.1f}" font-weight="bold">chosen</text>'
        )
    out.append(
        legend(
            fr.left + 8,
            fr.top + 14,
            [("evaluated", "#4e79a7"), ("Pareto front", "#e15759"), ("baseline", "#59a14f"), ("chosen", "#000")]
            + ([("bound (pruned)", "#ccc")] if bounds else []),
        )
    )
    out.append("</svg>")
    out.append(
        f'<p class="cap">{fmt(len(pts))} evaluated architectures, {fmt(len(front))} on the '
        f"Pareto front (max throughput, min area)"
        + (f"; {fmt(len(bounds))} optimistic bounds of pruned candidates in grey" if bounds else "")
        + ".</p>"
    )
    return "\n".join(out)


def _timeline(d: dict) -> str:
    stages = d.get("stages") or []
    pp = int(d.get("pp") or len(stages) or 0)
    m = d.get("num_micro_batches")
    if not m and d.get("global_batch") and d.get("dp") and d.get("micro_batch_size"):
        m = d["global_batch"] // (d["dp"] * d["micro_batch_size"])
    m = int(m or 0)
    if pp <= 0 or m <= 0:
        return '<h2>Pipeline timeline</h2>\n<p class="empty">No pipeline plan.</p>'
    times = [_num(s.get("time_s")) for s in stages]
    if len(times) != pp or None in times:
        t = _num(d.get("time_per_batch_s"))
        times = [t / (m + pp - 1) if t else 1.0] * pp
    shown = min(m, MAX_TIMELINE_MB)
    # Ops of micro-batches < shown depend only on micro-batches < shown + pp: same start times.
    ops = [
        o
        for o in one_f_one_b(pp, min(m, shown + pp), [t / 3 for t in times], [2 * t / 3 for t in times])
        if o[2] < shown
    ]
    t_end = max(o[4] for o in ops)
    row = max(6, min(24, 480 // pp))
    fr = Frame(nice_ticks(0, t_end), [0, pp], w=800, h=row * pp, left=70, top=24, right=20)
    out = [
        "<h2>Pipeline timeline (1F1B)</h2>",
        fr.open("pipeline timeline"),
        fr.axes("time (s)", "stage", yticks=False),
    ]
    step = max(1, math.ceil(12 / row))
    for k in range(0, pp, step):
        out.append(f'<text x="{fr.left - 4}" y="{fr.sy(pp - k - 0.5) + 4:.1f}" text-anchor="end">{k}</text>')
    for k, kind, i, s, e in ops:
        x0, x1, y = fr.sx(s), fr.sx(e), fr.sy(pp - k)
        out.append(
            f'<rect x="{x0:.1f}" y="{y + 1:.1f}" width="{max(x1 - x0 - 0.5, 0.5):.1f}" '
            f'height="{row - 2}" fill="{FWD_COLOUR if kind == "F" else BWD_COLOUR}"/>'
        )
        if x1 - x0 >= 12 and row >= 12:
            out.append(
                f'<text x="{(x0 + x1) / 2:.1f}" y="{y + row / 2 + 4:.1f}" text-anchor="middle" fill="#fff">{i}</text>'
            )
    out.append(legend(fr.left, 14, [("forward", FWD_COLOUR), ("backward", BWD_COLOUR)]))
    out.append("</svg>")
    note = (
        f" Only the first {shown} of {fmt(m)} micro-batches are drawn (the gaps are the later ones)."
        if m > shown
        else ""
    )
    return "\n".join(out) + (
        f'\n<p class="cap">{fmt(pp)} stages, {fmt(m)} micro-batches. A stage\'s time is its forward '
        f"plus backward time per micro-batch; the 1/3 forward, 2/3 backward split shown is "
        f"illustrative, and communication is not drawn.{note}</p>"
    )


def _layers(x: Any) -> str:
    """A stage's ``layers`` as given: ``[0, 8]`` stays ``[0, 8]`` (no claim on its bounds)."""
    return "[" + ", ".join(map(fmt, x)) + "]" if isinstance(x, list) else fmt(x)


def _memory(d: dict) -> str:
    stages = d.get("stages") or []
    bars = []
    for s in stages:
        mem = s.get("memory")
        if isinstance(mem, dict) and mem:
            bars.append([(_num(mem.get(k)) or 0.0) / GIB for k in MEMORY_KINDS])
        else:
            bars.append([(_num(s.get("memory_bytes")) or 0.0) / GIB])
    if not bars:
        return '<h2>Memory per stage</h2>\n<p class="empty">No stages.</p>'
    hbm = _num((d.get("accelerator") or {}).get("hbm_bytes"))
    top = max([sum(b) for b in bars] + ([hbm / GIB] if hbm else []))
    n = len(bars)
    fr = Frame([0, n], nice_ticks(0, top * 1.05), w=max(200, min(800, 40 * n)), top=28)
    out = ["<h2>Memory per stage</h2>", fr.open("memory per stage"), fr.axes("stage", "memory (GiB)", xticks=False)]
    bw = fr.w / n * 0.7
    for j, b in enumerate(bars):
        x, acc = fr.sx(j + 0.15), 0.0
        for v, colour in zip(b, MEMORY_COLOURS if len(b) > 1 else ("#888",)):
            if v > 0:
                out.append(
                    f'<rect x="{x:.1f}" y="{fr.sy(acc + v):.1f}" width="{bw:.1f}" '
                    f'height="{fr.sy(acc) - fr.sy(acc + v):.1f}" fill="{colour}"/>'
                )
            acc += v
        if n <= 32 or j % math.ceil(n / 32) == 0:
            out.append(f'<text x="{fr.sx(j + 0.5):.1f}" y="{fr.top + fr.h + 14}" text-anchor="middle">{j}</text>')
    if hbm:
        y = fr.sy(hbm / GIB)
        out.append(
            f'<line x1="{fr.left}" y1="{y:.1f}" x2="{fr.left + fr.w}" y2="{y:.1f}" stroke="#000" '
            f'stroke-dasharray="6 3"/><text x="{fr.left + fr.w - 4}" y="{y - 4:.1f}" '
            f'text-anchor="end">HBM {esc(fmt(hbm / GIB))} GiB</text>'
        )
    kinds = MEMORY_KINDS if any(len(b) > 1 for b in bars) else ("total",)
    out.append(legend(fr.left, 16, list(zip(kinds, MEMORY_COLOURS if len(kinds) > 1 else ("#888",)))))
    out.append("</svg>")
    rows = [
        (
            str(j),
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
    return (
        "\n".join(out)
        + "\n"
        + _table(["stage", "layers", "devices", "recompute", "in flight", "memory", "time (s)", "exposed DP (s)"], rows)
    )


def _baselines(d: dict) -> str:
    bl = d.get("baselines") or []
    if not bl:
        return ""
    ours = _num(d.get("throughput_samples_per_s"))
    rows = []
    for b in bl:
        t = _num(b.get("throughput_samples_per_s"))
        ok = t is not None and t > 0
        acc = dict(b.get("accelerator") or {})
        for k in ("area_mm2", "hbm_bytes"):
            acc.setdefault(k, b.get(k))
        plan = "/".join(fmt(b.get(k)) for k in ("dp", "pp", "tp", "micro_batch_size"))
        rows.append(
            (
                str(b.get("name", "?")),
                accel_summary(acc),
                plan,
                t if ok else _n("—"),
                _n(f"{fmt(ours / t)}×" if ok and ours else "—"),
                str(b.get("note") or ""),
            )
        )
    return "<h2>Baselines</h2>\n" + _table(
        ["baseline", "accelerator", "DP/PP/TP/micro-batch", "throughput (samples/s)", "speed-up of chosen", "note"],
        rows,
    )


def _stats(d: dict) -> str:
    s = d.get("search") or {}
    if not s:
        return ""
    cand = _num(s.get("candidates"))
    rows = [(k, s.get(k)) for k in ("space", "candidates", "architectures", "settings", "evaluated") if k in s]
    wall = {k: v for k, v in (s.get("wall_s") or {}).items() if _num(v) is not None}
    total = _num(wall.get("total")) or sum(v for k, v in wall.items() if k != "total")
    if total and cand:
        rows.append(("candidates per second", cand / total))
    if total and _num(s.get("evaluated")):
        rows.append(("exact evaluations per second", s["evaluated"] / total))
    out = ["<h2>Search statistics</h2>", _table(["", "value"], rows)]
    pruned = s.get("pruned") or {}
    if pruned:
        left, prow = cand, []
        for k, v in pruned.items():
            v = _num(v) or 0
            left = left - v if left is not None else None
            prow.append(
                (
                    str(k),
                    int(v) if float(v).is_integer() else v,
                    _n(f"{fmt(100 * v / cand)} %" if cand else "—"),
                    int(left) if left is not None and left >= 0 else _n("—"),
                )
            )
        out.append("<h3>Pruned per stage</h3>\n" + _table(["stage", "pruned", "% of candidates", "remaining"], prow))
    if wall:
        peak = max(wall.values()) or 1
        wrow = [
            (str(k), v, ("html", f'<span class="bar" style="width:{100 * v / peak:.0f}px"></span>'))
            for k, v in wall.items()
        ]
        out.append("<h3>Wall time per phase (s)</h3>\n" + _table(["phase", "seconds", ""], wrow))
    return "\n".join(out)


def _models(d: dict) -> str:
    det = d.get("models_detail") or []
    if not det:
        return ""
    rows = []
    for r in det:
        t, own = _num(r.get("throughput_samples_per_s")), _num(r.get("own_best_samples_per_s"))
        loss = _num(r.get("loss"))
        if loss is None and t is not None and own:
            loss = 1 - t / own
        rows.append((str(r.get("model", "?")), t, own, _n(f"{fmt(100 * loss)} %" if loss is not None else "—")))
    return "<h2>Models on the common chip</h2>\n" + _table(
        ["model", "throughput on common chip (samples/s)", "own best (samples/s)", "loss"], rows
    )


def render(data: dict) -> str:
    """The report of one search (the JSON of ``phazec --json``) as one self-contained HTML page."""
    title = ", ".join(map(str, data.get("models") or [data.get("model") or "search"]))
    parts = [
        _header(data),
        _scatter(data),
        _timeline(data),
        _memory(data),
        _baselines(data),
        _stats(data),
        _models(data),
    ]
    body = "\n".join(p for p in parts if p)
    return (
        f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>phaze: {esc(title)}</title>\n<style>\n{CSS}\n</style>\n</head>\n<body>\n"
        f"{body}\n</body>\n</html>\n"
    )


def write(path: Any, data: dict) -> None:
    """Write :func:`render` of ``data`` to ``path`` (UTF-8); a PhazeError if it cannot."""
    try:
        with open(path, "w", encoding="utf-8", newline="\n") as f:
            f.write(render(data))
    except OSError as e:
        raise PhazeError(f"{path}: cannot write: {e.strerror or e}") from e
