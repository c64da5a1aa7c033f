"""The HTML search report (phaze/search/report.py), read the way a person reads it.

A synthetic search (a few hundred points around a known Pareto front, 4 stages, 3 baselines of
which one is infeasible, and a multi-model variant) and the JSON of a real search (the tiny GPT-2
on the small space, tests/data/search_tiny_gpt2.json) are rendered and checked:

- the pure parts: the Pareto front (against brute force) and the 1F1B schedule (against its
  dependencies and the classic makespan);
- each chart's SVG: the marks it draws (one per evaluated point, front point, 1F1B op, memory
  kind and stage), where (bar lengths and positions in proportion to the numbers), with a
  non-zero extent; ids unique in the page; nothing that refers outside the page;
- the tables: speed-ups, statistics, the multi-model section, missing fields;
- the page in a real browser (headless chromium, tests/report_browser.py): no console error, no
  resource loaded, every chart laid out with data visible in its plot area in the screenshot,
  and proof that this check fails on a page with a JavaScript error, an empty plot or hidden
  data;
- determinism: the same input gives the same bytes, in this process and in another.

Regenerate the real-search JSON with ``phazec tests/models/tiny_gpt2.py --space
examples/spaces/small.toml --devices 64 --global-batch 64 --micro-batch 8 --tp 1 -o plan.mlir
--json tests/data/search_tiny_gpt2.json --no-cache -q`` (about half a minute).
"""

from __future__ import annotations

import copy
import html
import json
import os
import random
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from report_browser import CHROMIUM, inspect

from phaze.search import report as R
from phaze_ir.errors import PhazeError

GIB = 1 << 30
SVG_NS = "{http://www.w3.org/2000/svg}"
XLINK = "{http://www.w3.org/1999/xlink}href"
REAL = Path(__file__).parent / "data" / "search_tiny_gpt2.json"
needs_browser = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not on PATH: the report is not opened")

# The front: area -> throughput, strictly increasing in both.
FRONT = [(100.0, 200.0), (150.0, 320.0), (220.0, 450.0), (300.0, 505.2)]


#: A plan summary as phazec's JSON gives it (made by hand: the report draws it, computes none of it).
SUMMARY = {
    "lines": ["phazec: plan: DP 64, PP 4, TP 4 <best>", "time per batch 8.1 s = compute 5 s (61.7%) + ..."],
    "mfu_causal": 0.412,
    "hfu": 0.471,
    "tokens_per_s": 2069000.0,
    "samples_per_s": 505.2,
    "time_per_batch_s": 8.1,
    "breakdown_s": {
        "compute_s": 5.0,
        "tp_comm_s": 0.9,
        "recompute_s": 0.4,
        "pp_comm_s": 0.3,
        "ep_comm_s": 0.0,
        "bubble_s": 1.1,
        "dp_comm_s": 0.3,
        "optimizer_s": 0.1,
    },
    "memory_bytes": {"params": 1e10, "grads": 1e10, "optimizer": 2e10, "activations": 1.5e10, "workspace": 0.4e10},
    "hbm_bytes": 3.4e10 * 2,
    "runner_up": {"name": "DP 32, PP 8, TP 4", "why": "6.2 % slower: a larger bubble"},
    "warnings": ["peak memory is 86.8 % of HBM <check>"],
}


def synthetic(multi: bool = False) -> dict:
    rng = random.Random(7)
    points = [
        {
            "area_mm2": a,
            "throughput_samples_per_s": t,
            "hbm_bytes": 3.4e10,
            "label": f"front {j}",
            "best": (a, t) == FRONT[-1],
        }
        for j, (a, t) in enumerate(FRONT)
    ]
    for j in range(300):  # every one strictly dominated by a front point
        a0, t0 = rng.choice(FRONT)
        points.append(
            {
                "area_mm2": a0 + rng.uniform(0.5, 80),
                "throughput_samples_per_s": t0 * rng.uniform(0.3, 0.99),
                "label": f"p{j} <&>",
                "best": False,
            }
        )
    rng.shuffle(points)
    stages = [
        {
            "layers": [8 * k, 8 * k + 8],
            "devices": 4,
            "time_s": 0.12,
            "memory_bytes": 5.9e10,
            "recompute": "selective",
            "in_flight": 4 - k,
            "exposed_dp_s": 0.01,
            "memory": {"params": 1e10, "grads": 1e10, "optimizer": 2e10, "activations": 1.5e10, "workspace": 0.4e10},
        }
        for k in range(4)
    ]
    acc = {
        "name": "phaze <best>",
        "tensor_cores": {"count": 8, "pe_x": 128, "pe_y": 128, "buffer_bytes": 1 << 20},
        "vector_cores": {"count": 2, "width": 128},
        "global_buffer": {"bytes": 128 * (1 << 20)},
        "hbm_bytes": 3.4e10 * 2,
        "area_mm2": 300.0,
    }
    d = {
        "devices": 1024,
        "global_batch": 4096,
        "dp": 64,
        "pp": 4,
        "tp": 4,
        "micro_batch_size": 2,
        "num_micro_batches": 32,
        "time_per_batch_s": 8.1,
        "throughput_samples_per_s": 505.2,
        "max_memory_bytes": 6.1e10,
        "accelerator": acc,
        "stages": stages,
        "baselines": [
            {
                "name": "TPUv4 + expert placement",
                "throughput_samples_per_s": 300.0,
                "speedup": 1.68,
                "dp": 128,
                "pp": 8,
                "tp": 1,
                "micro_batch_size": 1,
                "area_mm2": 278.8,
                "hbm_bytes": 3.4e10,
                "accelerator": {"tensor_cores": {"count": 4, "pe_x": 128, "pe_y": 128}},
                "note": "",
            },
            {
                "name": "TPUv4 + phaze placement",
                "throughput_samples_per_s": 400.0,
                "dp": 64,
                "pp": 4,
                "tp": 4,
                "micro_batch_size": 2,
                "area_mm2": 278.8,
            },
            {"name": "Big chip", "throughput_samples_per_s": 0, "area_mm2": 900.0, "note": "does not fit in HBM"},
        ],
        "search": {
            "space": "paper",
            "candidates": 1409280,
            "architectures": 88080,
            "settings": 16,
            "pruned": {"work_bound": 82000, "dp_bound": 5800, "refined_bound": 100, "exact": 20},
            "evaluated": 160,
            # the phases, the total, then the cost evaluator's timers (inside baselines and search)
            "wall_s": {
                "prepare": 80.1,
                "baselines": 20.5,
                "search": 150.2,
                "plan": 12.0,
                "total": 270.0,
                "estimate": 3.2,
                "dp_bound": 9.5,
                "schedule": 120.4,
                "dp_exact": 30.1,
            },
            "points": points,
            "bound_points": [
                {"area_mm2": rng.uniform(100, 400), "throughput_samples_per_s": rng.uniform(100, 900)}
                for _ in range(50)
            ],
        },
    }
    d["summary"] = copy.deepcopy(SUMMARY)
    if multi:
        d["models"] = ["gpt2-xl", "llama2-7b"]
        d["models_detail"] = [
            {"model": "gpt2-xl", "throughput_samples_per_s": 970.0, "own_best_samples_per_s": 1000.0, "loss": 0.03},
            {"model": "llama2-7b", "throughput_samples_per_s": 505.2, "own_best_samples_per_s": 505.2},
        ]
    else:
        d["model"] = "llama2-7b"
    return d


def charts(page: str) -> dict[str, ET.Element]:
    """The charts of ``page`` by name (the prefix of their ids), each parsed as XML."""
    out = {}
    for block in re.findall(r"<svg\b.*?</svg>", page, flags=re.S):
        root = ET.fromstring(block)
        area = next(g.get("id") for g in root.iter(SVG_NS + "g") if (g.get("id") or "").endswith("-plot-area"))
        out[area[: -len("-plot-area")]] = root
    assert page.count("<svg") == len(out)
    return out


def group(svg: ET.Element, gid: str) -> ET.Element | None:
    return next((g for g in svg.iter(SVG_NS + "g") if g.get("id") == gid), None)


def marks(svg: ET.Element, gid: str) -> list[tuple[float, float, float, float]]:
    """The marks drawn in group ``gid``, as boxes ``(x0, y0, x1, y1)`` in SVG units: each
    ``<path>`` outside ``<defs>``, and each ``<use>`` (a marker, or a collection's shape) as the
    shape it refers to, moved to its ``x``, ``y``."""
    g = group(svg, gid)
    if g is None:
        return []
    shapes = {el.get("id"): el for el in svg.iter(SVG_NS + "path") if el.get("id")}
    defs = {id(p) for d in g.iter(SVG_NS + "defs") for p in d.iter()}
    out = []
    for el in g.iter():
        if id(el) in defs:
            continue
        if el.tag == SVG_NS + "use":
            x0, y0, x1, y1 = box(shapes[el.get(XLINK)[1:]])
            x, y = float(el.get("x", 0)), float(el.get("y", 0))
            out.append((x0 + x, y0 + y, x1 + x, y1 + y))
        elif el.tag == SVG_NS + "path":
            # a compound path (report._rects: the rectangles of a series) is a mark per subpath
            out += [box(sub) for sub in re.split(r"(?=M )", el.get("d")) if sub.strip()]
    return out


def box(path: ET.Element | str) -> tuple[float, float, float, float]:
    """The bounding box of a path (an element, or its ``d``)."""
    d = path if isinstance(path, str) else path.get("d")
    nums = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", d)]
    xs, ys = nums[0::2], nums[1::2]
    return (min(xs), min(ys), max(xs), max(ys))


def centre(b: tuple[float, float, float, float]) -> tuple[float, float]:
    return ((b[0] + b[2]) / 2, (b[1] + b[3]) / 2)


def extent(boxes) -> tuple[float, float]:
    """Width and height of the union of ``boxes``."""
    return (max(b[2] for b in boxes) - min(b[0] for b in boxes), max(b[3] for b in boxes) - min(b[1] for b in boxes))


def drawn(svg: ET.Element, gids: list[str]) -> bool:
    """Whether the groups ``gids`` hold marks spanning a non-zero area."""
    boxes = [b for gid in gids for b in marks(svg, gid)]
    return bool(boxes) and min(extent(boxes)) > 0


DATA = {
    "scatter": ["scatter-evaluated", "scatter-front", "scatter-front-line", "scatter-bounds", "scatter-chosen"]
    + [f"scatter-baseline-{j}" for j in range(8)],
    "timeline": ["timeline-forward", "timeline-backward"]
    + [f"timeline-{kind}-{j}" for kind in ("forward", "backward") for j in range(8)],
    "memory": ["memory-hbm", "memory-total"] + [f"memory-{k}" for k in R.MEMORY_KINDS],
    "breakdown": [f"breakdown-{k}" for k in SUMMARY["breakdown_s"]],
    "footprint": ["footprint-hbm", "footprint-usable"] + [f"footprint-{k}" for k in SUMMARY["memory_bytes"]],
}


def empty_charts(page: str) -> list[str]:
    """The charts of ``page`` that draw no data (or data of no extent)."""
    return [name for name, svg in charts(page).items() if not drawn(svg, DATA[name])]


def texts(page: str) -> set[str]:
    """The texts of the charts: matplotlib draws glyphs as paths and writes each text, as is,
    in an XML comment before them."""
    return {html.unescape(t.strip()) for t in re.findall(r"<!-- (.*?) -->", page, flags=re.S)}


#: The charts of the synthetic search's page (its summary's two first), by label.
SEARCH_CHARTS = [
    "time per batch by part",
    "memory per device by part",
    "throughput vs chip area",
    "pipeline timeline",
    "memory per stage",
]


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    """The pages, rendered once for the module: the synthetic search (single and multi-model)
    and the real one."""
    return {
        "single": R.render(synthetic()),
        "multi": R.render(synthetic(multi=True)),
        "real": R.render(json.loads(REAL.read_text())),
    }


# ---------------------------------------------------------------------------------------------
# Pure functions
# ---------------------------------------------------------------------------------------------


def test_pareto_front_known():
    d = synthetic()
    pts = d["search"]["points"]
    got = [(pts[i]["area_mm2"], pts[i]["throughput_samples_per_s"]) for i in R.pareto_front(pts)]
    assert got == FRONT


def test_pareto_front_ties_and_duplicates():
    pts = [(10, 5), (10, 7), (10, 7), (12, 7), (8, 1), (20, 9), (20, 9), (15, 0), (None, 3), (30, float("nan"))]
    # (10,5) loses to (10,7) (same area, more throughput); (12,7) to (10,7) (more area, same
    # throughput); duplicates dominate neither; infeasible points are never on the front.
    assert R.pareto_front(pts) == [4, 1, 2, 5, 6]
    assert R.pareto_front([]) == []
    assert R.pareto_front([(3, 3)]) == [0]


def test_pareto_front_brute_force():
    rng = random.Random(1)
    for _ in range(50):
        pts = [(rng.randint(1, 8), rng.randint(1, 8)) for _ in range(rng.randint(1, 15))]
        want = [i for i, (a, t) in enumerate(pts) if not any(b <= a and u >= t and (b < a or u > t) for b, u in pts)]
        got = R.pareto_front(pts)
        assert sorted(got) == want
        assert [pts[i][0] for i in got] == sorted(pts[i][0] for i in got)


def test_front_of_three_axes_brute_force():
    """phaze.search.pareto.front_indices (the JSON's throughput-power-area front) against the
    definition, with ties and duplicates; rows with a missing coordinate are never on it."""
    from phaze.search.pareto import front_indices

    rng = random.Random(3)
    for _ in range(100):
        rows = [tuple(rng.randint(1, 5) for _ in range(3)) for _ in range(rng.randint(1, 25))]
        want = [
            i
            for i, r in enumerate(rows)
            if not any(all(x <= y for x, y in zip(q, r)) and any(x < y for x, y in zip(q, r)) for q in rows)
        ]
        got = front_indices(rows)
        assert sorted(got) == want
        assert [rows[i] for i in got] == sorted(rows[i] for i in got)
    assert front_indices([(1.0, None, 2.0), (2.0, 2.0, float("inf")), (3.0, 3.0, 3.0)]) == [2]


def test_the_power_chart_draws_points_with_power():
    """With ``power_w`` on the points, the page has a throughput-power chart with its front;
    without, none."""
    d = synthetic()
    assert "Throughput vs power" not in R.render(d)
    for i, p in enumerate(d["search"]["points"]):
        p["power_w"] = 50.0 + (i * 37) % 41
    page = R.render(d)
    assert "<h2>Throughput vs power</h2>" in page
    svg = charts(page)["power"]
    pts = [p for p in d["search"]["points"] if p["throughput_samples_per_s"] > 0]
    assert len(marks(svg, "power-evaluated")) == len(pts)
    front = R.pareto_front([(p["power_w"], p["throughput_samples_per_s"]) for p in pts])
    assert len(marks(svg, "power-front")) == len(front) > 0


def check_1f1b(pp, m, f, b):
    ops = R.one_f_one_b(pp, m, f, b)
    f = [f] * pp if isinstance(f, (int, float)) else f
    b = [b] * pp if isinstance(b, (int, float)) else b
    assert len(ops) == 2 * pp * m
    at = {(k, kind, i): (s, e) for k, kind, i, s, e in ops}
    assert len(at) == len(ops)
    for (k, kind, i), (s, e) in at.items():
        assert e == pytest.approx(s + (f[k] if kind == "F" else b[k]))
        if kind == "F" and k > 0:
            assert s >= at[(k - 1, "F", i)][1] - 1e-12
        if kind == "B":
            assert s >= at[(k, "F", i)][1] - 1e-12
            if k < pp - 1:
                assert s >= at[(k + 1, "B", i)][1] - 1e-12
    for k in range(pp):  # a stage runs one op at a time, in 1F1B order
        row = [o for o in ops if o[0] == k]
        assert all(x[4] <= y[3] + 1e-12 for x, y in zip(row, row[1:]))
        w = min(pp - k - 1, m)
        assert [o[1] for o in row[:w]] == ["F"] * w
        if m > w:
            assert [o[1] for o in row[w : w + 2]] == ["F", "B"]
        # at most pp - k micro-batches in flight
        live = 0
        for o in row:
            live += 1 if o[1] == "F" else -1
            assert live <= pp - k
    return ops


@pytest.mark.parametrize("pp,m", [(1, 1), (1, 5), (4, 1), (4, 3), (4, 4), (4, 32), (8, 16), (3, 10)])
def test_1f1b_makespan(pp, m):
    ops = check_1f1b(pp, m, 1.0, 2.0)
    assert max(o[4] for o in ops) == pytest.approx((m + pp - 1) * 3.0)


def test_1f1b_unequal_stages():
    check_1f1b(4, 9, [1.0, 0.5, 2.0, 1.0], [2.0, 1.0, 4.0, 2.0])


def check_interleaved(pp, v, m, f, b):
    """The ops of the interleaved schedule: every (chunk, micro-batch) once each way, its
    dependencies, each rank's order as Megatron-LM runs it, one op at a time."""
    n = pp * v
    ops = R.interleaved_1f1b(pp, v, m, f, b)
    f = [f] * n if isinstance(f, (int, float)) else f
    b = [b] * n if isinstance(b, (int, float)) else b
    assert len(ops) == 2 * n * m
    at = {(c, kind, i): (k, s, e) for k, kind, i, s, e, c in ops}
    assert len(at) == len(ops)
    for (c, kind, i), (k, s, e) in at.items():
        assert k == c % pp  # chunk c on rank c mod pp
        assert e == pytest.approx(s + (f[c] if kind == "F" else b[c]))
        if kind == "F" and c > 0:
            assert s >= at[(c - 1, "F", i)][2] - 1e-12
        if kind == "B":
            assert s >= at[(c, "F", i)][2] - 1e-12
            if c < n - 1:
                assert s >= at[(c + 1, "B", i)][2] - 1e-12
    for k in range(pp):
        row = [o for o in ops if o[0] == k]
        assert all(x[4] <= y[3] + 1e-12 for x, y in zip(row, row[1:]))
        fwd = [o for o in row if o[1] == "F"]
        bwd = [o for o in row if o[1] == "B"]
        # the q-th forward is on the rank's chunk (q // pp) % v, its micro-batches in groups of
        # pp (the last group smaller when pp does not divide m); the backwards in the same
        # order, chunks reversed
        if m % pp == 0:
            units = [((q // pp) % v, (q // n) * pp + q % pp) for q in range(m * v)]
        else:
            units = [(j, i) for g in range(0, m, pp) for j in range(v) for i in range(g, min(g + pp, m))]
        assert [(o[5] // pp, o[2]) for o in fwd] == units
        assert [(o[5] // pp, o[2]) for o in bwd] == [(v - 1 - j, i) for j, i in units]
        # (pp − k − 1)·2 + (v − 1)·pp warm-up forwards, then one forward, one backward, ...
        w = min((pp - k - 1) * 2 + (v - 1) * pp, m * v)
        kinds = [o[1] for o in row]
        assert kinds[:w] == ["F"] * w
        assert kinds[w : 2 * m * v - w] == ["F", "B"] * (m * v - w)
    return ops


@pytest.mark.parametrize(
    "pp,v,m", [(2, 2, 2), (2, 2, 16), (2, 4, 4), (3, 2, 9), (4, 2, 4), (4, 3, 8), (4, 4, 32), (8, 2, 16), (2, 1, 6)]
)
def test_interleaved_makespan_is_the_dps(pp, v, m):
    """With equal chunks (a rank's time T = v·(f + b) per micro-batch), the schedule ends at
    (m + (pp − 1)/v)·T: the time per batch the placement DP prices (docs/design.md §6.6)."""
    for f, b in ((1.0, 2.0), (1.0, 1.0), (0.5, 1.5)):
        ops = check_interleaved(pp, v, m, f, b)
        assert max(o[4] for o in ops) == pytest.approx((m + (pp - 1) / v) * v * (f + b), rel=1e-12)


def test_interleaved_unequal_chunks():
    rng = random.Random(3)
    f = [rng.uniform(0.5, 2) for _ in range(8)]
    check_interleaved(4, 2, 8, f, [2 * x for x in f])
    check_interleaved(2, 2, 5, 1.0, 2.0)  # pp does not divide m: a smaller last group


def test_timeline_draws_every_micro_batch_to_the_end_of_the_step():
    """GPT-3 175B's shape (16 ranks, 2 chunks each, 64 micro-batches: 4,096 ops, the most drawn):
    every op where the full schedule puts it, the axis to the step's end (the dashed line at the
    time per batch, after the pipeline's last op). With 3× the micro-batches the first and last
    are drawn (the fill and the drain), the chart and caption say which are not, and the axis
    still spans the whole schedule."""
    pp, v = 16, 2
    for m in (64, 192):
        t = 0.2  # a rank's time per micro-batch
        step = (m + (pp - 1) / v) * t * 1.03  # the pipeline, then DP communication and optimizer
        d = {
            "pp": pp,
            "virtual_stages": v,
            "num_micro_batches": m,
            "time_per_batch_s": step,
            "stages": [{"rank": c % pp, "time_s": t} for c in range(pp * v)],
        }
        assert R._virtual_stages(d) == v
        page = R.render(d)
        svg = charts(page)["timeline"]
        full = R.interleaved_1f1b(pp, v, m, t / v / 3, 2 * t / v / 3)
        keep = R.MAX_TIMELINE_OPS // (2 * pp * v)
        shown = sorted({o[2] for o in full if o[2] < (keep + 1) // 2 or o[2] >= m - keep // 2})
        if m == 64:
            assert shown == list(range(m)) and "are not drawn" not in page
        else:
            assert len(shown) == keep < m and shown[-1] == m - 1
            gap = f"micro-batches {keep // 2}–{m - keep // 2 - 1} not drawn"
            assert gap in texts(page) and f"Micro-batches {keep // 2}–{m - keep // 2 - 1} are not drawn" in page
        boxes = [b for kind in ("forward", "backward") for j in range(v) for b in marks(svg, f"timeline-{kind}-{j}")]
        want = [o for o in full if o[2] in set(shown)]
        assert len(boxes) == len(want)
        # the drawn ops end where the full schedule ends, the step line at the time per batch
        (x0, _, x1, _) = marks(svg, "timeline-forward-0")[0]
        first = next(o for o in full if o[1] == "F" and o[5] == 0)
        scale, origin = (x1 - x0) / (first[4] - first[3]), min(b[0] for b in boxes)
        end = max(o[4] for o in full)
        assert (max(b[2] for b in boxes) - origin) / scale == pytest.approx(end, rel=1e-4)
        (line,) = marks(svg, "timeline-step")
        assert (line[0] - origin) / scale == pytest.approx(step, rel=1e-4) and line[0] > max(b[2] for b in boxes)
        assert "end of step" in texts(page) and "The dashed line ends the step" in page


# ---------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------


def test_page_structure(pages):
    page = pages["single"]
    assert page.startswith("<!DOCTYPE html>") and page.endswith("</html>\n")
    cs = charts(page)
    assert list(cs) == ["breakdown", "footprint", "scatter", "timeline", "memory"]
    assert empty_charts(page) == []
    assert [svg.get("aria-label") for svg in cs.values()] == SEARCH_CHARTS
    # ids are unique in the page, each chart's under its own name
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids))
    for name, svg in cs.items():
        assert all(el.get("id").startswith(name + "-") for el in svg.iter() if el.get("id"))
    # self-contained: nothing loaded, linked or scripted; URLs only as XML namespaces
    assert not re.search(r"<(script|link|img|iframe|object|embed|image)\b|@import|@font-face", page)
    assert not re.search(r'\b(src|href)="(?!#)', page) and not re.search(r"url\((?!#)", page)
    assert re.findall(r'(\S+)="https?://', page) == ["xmlns:xlink", "xmlns"] * 5
    assert "<metadata" not in page and "matplotlib.org" not in page  # no date, no creator
    # the header and its escaping
    assert "<best>" not in page and "phaze &lt;best&gt;" in page
    assert "8 × 128×128 TC" in page and "2 × 128 VC" in page and "128 MiB global buffer" in page
    assert "1,409,280" in page and "88,080" in page and "505.2" in page


def test_scatter(pages):
    page = pages["single"]
    svg = charts(page)["scatter"]
    assert len(marks(svg, "scatter-evaluated")) == 304
    assert len(marks(svg, "scatter-bounds")) == 50
    # the highlighted front points are exactly the front, placed in proportion to the numbers
    # (SVG y grows downwards)
    front = sorted(centre(b) for b in marks(svg, "scatter-front"))
    assert len(front) == len(FRONT)
    (x0, y0), (x1, y1) = front[0], front[-1]
    (a0, t0), (a1, t1) = FRONT[0], FRONT[-1]
    for (x, y), (a, t) in zip(front, FRONT):
        assert (x - x0) / (x1 - x0) == pytest.approx((a - a0) / (a1 - a0), abs=1e-5)
        assert (y - y0) / (y1 - y0) == pytest.approx((t - t0) / (t1 - t0), abs=1e-5)
    assert y1 < y0
    # the step line goes through every front point
    (line,) = [el for el in group(svg, "scatter-front-line").iter(SVG_NS + "path")]
    nums = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", line.get("d"))]
    vertices = set(zip(nums[0::2], nums[1::2]))
    assert all(min(abs(x - u) + abs(y - v) for u, v in vertices) < 1e-5 for x, y in front)
    # the chosen design (at the last front point), the two feasible baselines, not the third;
    # both within the frame (278.8 mm² among chips of 100-380): no off-scale band
    assert [centre(b) for b in marks(svg, "scatter-chosen")] == [pytest.approx(front[-1], abs=1e-5)]
    assert [len(marks(svg, f"scatter-baseline-{j}")) for j in range(3)] == [1, 1, 0]
    assert "offscale" not in page and "off scale" not in texts(page)
    assert texts(page) >= {
        "chosen (ring)",
        "Pareto front",
        "evaluated exactly",
        "bound of a pruned candidate",
        "baseline: TPUv4 + expert placement",
        "baseline: TPUv4 + phaze placement",
        "Chip area (mm²)",
        "Throughput (samples/s)",
    }
    assert "304 evaluated architectures, 4 on the Pareto front" in page
    assert "50 optimistic bounds of pruned candidates in grey" in page


def test_timeline(pages):
    page = pages["single"]
    svg = charts(page)["timeline"]
    fwd, bwd = marks(svg, "timeline-forward"), marks(svg, "timeline-backward")
    assert len(fwd) == len(bwd) == 4 * 32  # every micro-batch on each of the 4 stages
    # every stage takes 0.12 s per micro-batch: 0.04 s forward, 0.08 s backward
    wf, wb = [b[2] - b[0] for b in fwd], [b[2] - b[0] for b in bwd]
    assert max(wf) - min(wf) < 1e-4 and max(wb) - min(wb) < 1e-4 and wb[0] == pytest.approx(2 * wf[0], abs=1e-4)
    # each op starts where the 1F1B schedule says, stage 0 on top
    scale = (fwd[0][2] - fwd[0][0]) / 0.04
    origin = min(b[0] for b in fwd)
    for kind, boxes in (("F", fwd), ("B", bwd)):
        rows = sorted({round((b[1] + b[3]) / 2, 3) for b in boxes})
        assert len(rows) == 4
        got = sorted((rows.index(round((b[1] + b[3]) / 2, 3)), round((b[0] - origin) / scale, 6)) for b in boxes)
        want = sorted((k, round(s, 6)) for k, kd, i, s, _ in R.one_f_one_b(4, 32, 0.04, 0.08) if kd == kind)
        assert [k for k, _ in got] == [k for k, _ in want]
        assert [t for _, t in got] == pytest.approx([t for _, t in want], abs=1e-4)
    # the axis runs to the step's end, 8.1 s, past the pipeline's (32 + 3)·0.12 s
    (step,) = marks(svg, "timeline-step")
    assert (step[0] - origin) / scale == pytest.approx(8.1, rel=1e-4)
    assert texts(page) >= {"forward", "backward", "Time (s)", "Pipeline stage", "end of step"}
    assert "4 stages, 32 micro-batches" in page and "are not drawn" not in page
    assert "The dashed line ends the step (8.1 s per batch)" in page


def test_memory(pages):
    page = pages["single"]
    svg = charts(page)["memory"]
    bars = {k: sorted(marks(svg, f"memory-{k}")) for k in R.MEMORY_KINDS}
    assert all(len(b) == 4 for b in bars.values())
    # stacked in order, each as tall as its bytes: params 1e10, optimizer 2e10, ...
    stage = synthetic()["stages"][0]["memory"]
    unit = (bars["params"][0][3] - bars["params"][0][1]) / stage["params"]
    floor = bars["params"][0][3]
    for j in range(4):
        bottom = floor
        for k in R.MEMORY_KINDS:
            x0, top, x1, y = bars[k][j]
            assert y == pytest.approx(bottom, abs=1e-4) and (y - top) == pytest.approx(stage[k] * unit, rel=1e-5)
            bottom = top
    # the HBM line at the capacity
    (hbm,) = marks(svg, "memory-hbm")
    assert floor - hbm[1] == pytest.approx(3.4e10 * 2 * unit, rel=1e-5)
    assert texts(page) >= {*R.MEMORY_KINDS, "HBM capacity (63.33 GiB)", "Memory (GiB)", "Pipeline stage", "3"}
    assert "HBM capacity 63.33 GiB (the dashed line)." in page


def test_summary(pages):
    """The plan summary (the JSON's ``summary``, made by hand here) at the top, after the header:
    its headline figures as given, the step's time by part as one stacked bar (each part as long
    as its seconds; the parts add up to the time per batch), the fullest device's memory by part
    against the HBM line, the runner-up, the warnings and the lines as phazec prints them, all
    escaped."""
    page = pages["single"]
    top = page[: page.index("<h2>Throughput vs area</h2>")]
    assert top.index("<h1>") < top.index("<h2>Summary</h2>")
    for cell in (
        "<th>MFU</th><td>41.2 %</td>",
        "<th>HFU</th><td>47.1 %</td>",
        "<th>Tokens/s</th><td>2,069,000</td>",
        "<th>Samples/s</th><td>505.2</td>",
        "<th>Time per batch</th><td>8.1 s</td>",
        "<th>Memory per device</th><td>54.95 GiB of 63.33 GiB HBM (86.76 %)</td>",
        "<th>Runner-up</th><td>DP 32, PP 8, TP 4: 6.2 % slower: a larger bubble</td>",
    ):
        assert cell in top
    assert '<ul class="warn"><li>peak memory is 86.8 % of HBM &lt;check&gt;</li></ul>' in top
    assert "<pre>phazec: plan: DP 64, PP 4, TP 4 &lt;best&gt;\ntime per batch 8.1 s" in top
    cs = charts(page)
    parts = SUMMARY["breakdown_s"]
    bars = {k: marks(cs["breakdown"], f"breakdown-{k}") for k in parts}
    assert bars.pop("ep_comm_s") == []  # no time: not drawn
    assert all(len(b) == 1 for b in bars.values())
    unit = (bars["compute_s"][0][2] - bars["compute_s"][0][0]) / parts["compute_s"]
    left = bars["compute_s"][0][0]
    for k, ((x0, _, x1, _),) in bars.items():  # end to end, in order, each as long as its time
        assert x0 == pytest.approx(left, abs=1e-4) and (x1 - x0) == pytest.approx(parts[k] * unit, rel=1e-4)
        left = x1
    assert (left - bars["compute_s"][0][0]) / unit == pytest.approx(SUMMARY["time_per_batch_s"], rel=1e-4)
    assert texts(page) >= {"compute 5 s (61.7 %)", "TP comm 0.9 s (11.1 %)", "optimizer 0.1 s (1.2 %)"}
    mem = SUMMARY["memory_bytes"]
    boxes = {k: marks(cs["footprint"], f"footprint-{k}")[0] for k in mem}
    unit = (boxes["params"][2] - boxes["params"][0]) / mem["params"]
    for k, b in boxes.items():
        assert (b[2] - b[0]) == pytest.approx(mem[k] * unit, rel=1e-4)
    (hbm,) = marks(cs["footprint"], "footprint-hbm")
    assert (hbm[0] - boxes["params"][0]) / unit == pytest.approx(SUMMARY["hbm_bytes"], rel=1e-4)
    assert "footprint-usable" not in page  # no headroom given
    assert texts(page) >= {"params 9.313 GiB", "HBM capacity (63.33 GiB)", "Memory (GiB)", "Time (s)"}


def test_summary_in_part():
    """A summary gives what it gives: the rows and charts of its fields alone; a headroom draws
    the usable share of HBM; an empty one, or none, no section."""
    d = {"summary": {"mfu_causal": 0.5, "memory_bytes": {"params": 3 * GIB, "kv": GIB}, "hbm_bytes": 80 * GIB}}
    page = R.render(d)
    assert "<th>MFU</th><td>50 %</td>" in page and "HFU" not in page and "Runner-up" not in page
    assert "PaLM" not in page  # no mfu_palm given
    assert list(charts(page)) == ["footprint"]  # no breakdown, no stages
    assert "breakdown" not in page and "Warnings" not in page and "<pre>" not in page
    assert texts(page) >= {"params 3 GiB", "kv 1 GiB"}  # a part the report does not know, coloured too
    d["summary"]["memory_headroom"] = 0.1
    page = R.render(d)
    assert "4 GiB of 80 GiB HBM (5 %); 72 GiB usable (10 % headroom)" in page
    # MFU's convention beside it, PaLM's figure when it differs; what the workspace holds, when
    # the summary says it
    d["summary"] |= {"mfu_causal_convention": "as <computed>", "mfu_palm": 0.5, "mfu_palm_convention": "PaLM's <count>"}
    d["summary"]["workspace"] = "workspace 1 GiB: the head (logits and loss)"
    page = R.render(d)
    assert "convention: as &lt;computed&gt;" in page and "PaLM" not in page  # the same figure: one row
    d["summary"]["mfu_palm"] = 0.6
    page = R.render(d)
    assert "<th>MFU (PaLM&#39;s)</th><td>60 %</td>" in page and "convention: PaLM&#39;s &lt;count&gt;" in page
    assert "<th>Workspace</th><td>workspace 1 GiB: the head (logits and loss)</td>" in page
    (usable,) = marks(charts(page)["footprint"], "footprint-usable")
    (hbm,) = marks(charts(page)["footprint"], "footprint-hbm")
    (params,) = marks(charts(page)["footprint"], "footprint-params")
    assert (usable[0] - params[0]) / (hbm[0] - params[0]) == pytest.approx(0.9, rel=1e-4)
    for empty in ({}, {"summary": {}}, {"summary": None}):
        assert "Summary" not in R.render(empty)


def test_real_search(pages):
    """The JSON of a real search: 14 evaluated chips, two of them one chip with two HBM sizes on
    the front, one stage, microseconds and mebibytes."""
    page = pages["real"]
    d = json.loads(REAL.read_text())
    assert empty_charts(page) == []
    svg = charts(page)["scatter"]
    assert len(marks(svg, "scatter-evaluated")) == len(d["search"]["points"]) == 14
    front = [centre(b) for b in marks(svg, "scatter-front")]
    assert len(front) == 2 and front[0] == front[1]
    assert [centre(b) for b in marks(svg, "scatter-chosen")] == [pytest.approx(front[0], abs=1e-5)]
    drawn_baselines = [b["name"] for b in d["baselines"] if b["throughput_samples_per_s"] > 0]
    assert drawn_baselines == ["tpuv4+phaze", "co-optimized"]
    assert texts(page) >= {
        "baseline: tpuv4+phaze (off scale: 278.8 mm²)",
        "baseline: co-optimized",
        "off scale",
        "Time (µs)",
        "Memory (MiB)",
    }
    assert "Summary" not in page and "breakdown-" not in page  # an older JSON: no summary
    # TPU v4 (278.8 mm²) is drawn in the band at the right edge; the evaluated chips (25-74 mm²)
    # span most of the frame, not a fifth of it
    (band,) = marks(svg, "scatter-offscale-right")
    (tpu,) = marks(svg, "scatter-baseline-0")  # the feasible baselines, in order
    (area,) = marks(svg, "scatter-plot-area")
    xs = [centre(b)[0] for b in marks(svg, "scatter-evaluated")]
    assert band[0] < centre(tpu)[0] < band[2] and band[2] == pytest.approx(area[2], abs=0.01)
    assert (max(xs) - min(xs)) / (band[0] - area[0]) > 0.8
    # the chosen ring is hollow, so the co-optimized baseline at its point shows through it
    (coopt,) = marks(svg, "scatter-baseline-1")
    assert centre(coopt) == pytest.approx(front[0], abs=1e-5)
    ring = ET.tostring(group(svg, "scatter-chosen"), encoding="unicode")
    assert "fill: none" in ring and "stroke: #000000" in ring
    tl = charts(page)["timeline"]
    assert len(marks(tl, "timeline-forward")) == len(marks(tl, "timeline-backward")) == 2
    assert marks(charts(page)["memory"], "memory-hbm") == []  # 3.3 MiB of 32 GiB
    assert "HBM capacity 32 GiB (off the scale: the fullest stage uses 0.01006 % of it" in page
    assert "1 stage, 2 micro-batches" in page


def test_speedups(pages):
    d = synthetic()
    page = pages["single"]
    table = page[page.index("<h2>Baselines</h2>") :]
    table = table[: table.index("</table>")]
    rows = re.findall(r"<tr>(.*?)</tr>", table, flags=re.S)[1:]
    assert len(rows) == 3
    for row, b in zip(rows, d["baselines"]):
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
        t = b["throughput_samples_per_s"]
        if t:
            assert cells[4] == R.fmt(d["throughput_samples_per_s"] / t) + "×"
        else:
            assert cells[3] == cells[4] == "—" and cells[5] == "does not fit in HBM"
    assert "1.684×" in table and "1.263×" in table
    head = re.findall(r"<th>(.*?)</th>", table)
    assert head == ["baseline", "accelerator", "plan", "throughput (samples/s)", "speed-up of chosen", "note"]
    plans = [re.findall(r"<td[^>]*>(.*?)</td>", row)[2] for row in rows]
    assert plans == ["DP 128, PP 8, TP 1, micro-batch 1", "DP 64, PP 4, TP 4, micro-batch 2", "—"]


def test_stats_and_multi_model(pages):
    page = pages["multi"]
    assert "gpt2-xl, llama2-7b" in page
    assert "Models on the common chip" in page
    assert "3 %" in page and "0 %" in page  # given loss, and computed one
    # Architectures pruned per stage: of the 88,080, and those left after each stage (the
    # evaluated ones after the last).
    assert "Architectures pruned per stage" in page and "refined bound" in page
    assert "93.1 %" in page and "6.585 %" in page  # work bound, DP bound
    assert "82,000" in page and "6,080" in page and "280" in page and "160" in page
    assert list(charts(page))[2:] == ["scatter", "timeline", "memory"] and empty_charts(page) == []
    # the wall-time bars: the total (270 s) 100 px, the others in proportion
    assert 'style="width:100px"' in page and 'style="width:56px"' in page  # search: 150.2 s
    # the phases, what the run spent outside them and the total, which they add up to; the
    # evaluator's timers (inside baselines and search) in a table of their own
    phases = page[page.index("<h3>Wall time per phase (s)</h3>") :]
    phases, timers = phases[: phases.index("</table>")], phases[phases.index("</table>") :]
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in re.findall(r"<tr[^>]*>(.*?)</tr>", phases)[1:]]
    names = ["prepare", "baselines", "search", "plan", "other (outside the phases)", "total"]
    assert [r[0] for r in rows] == names
    seconds = [float(r[1].replace(",", "")) for r in rows]
    assert sum(seconds[:-1]) == pytest.approx(seconds[-1], abs=0.1) == 270
    assert '<tr class="total"><td>total</td>' in phases
    assert "<h3>Of which, the cost evaluator (s)</h3>" in timers
    timer_rows = re.findall(r"<tr><td>(.*?)</td>", timers[: timers.index("</table>", 10)])
    assert timer_rows == ["estimate", "dp bound", "schedule", "dp exact"]


def test_missing_fields(tmp_path):
    d = synthetic()
    for s in d["stages"]:
        del s["memory"]
    del d["search"]["bound_points"]
    for k in ("num_micro_batches", "accelerator", "summary"):
        del d[k]
    page = R.render(d)
    cs = charts(page)
    assert list(cs) == ["scatter", "timeline", "memory"] and empty_charts(page) == []
    assert "4 stages, 32 micro-batches" in page  # m from global batch / (dp * micro-batch)
    assert len(marks(cs["timeline"], "timeline-forward")) == 4 * 32
    assert group(cs["scatter"], "scatter-bounds") is None and "optimistic" not in page
    assert len(marks(cs["scatter"], "scatter-chosen")) == 1  # the point marked best
    assert len(marks(cs["memory"], "memory-total")) == 4 and "memory-params" not in page
    assert "memory-hbm" not in page and "HBM capacity" not in page  # no accelerator, no HBM
    if CHROMIUM:
        path = tmp_path / "missing.html"
        path.write_text(page, encoding="utf-8")
        assert inspect(path, tmp_path).problems == []

    page = R.render({})
    assert page.endswith("</html>\n") and "<svg" not in page
    assert "No evaluated points." in page and "No pipeline plan." in page and "No stages." in page
    page = R.render({"model": "x", "stages": [{}], "search": {"points": [{}]}})
    assert "<svg" not in page and "No evaluated points." in page and "No memory figures." in page
    page = R.render({"pp": 2, "num_micro_batches": 3, "baselines": [{"name": "b"}], "search": {"wall_s": {}}})
    assert list(charts(page)) == ["timeline"] and empty_charts(page) == []  # 1 s per stage
    assert len(marks(charts(page)["timeline"], "timeline-forward")) == 2 * 3
    assert "<td>b</td>" in page


#: A name no report may let through as markup: a script, an image that would load and report
#: an error, a quote and an ampersand, and an end of comment (the charts write their texts in
#: XML comments).
HOSTILE = """<script>console.error('xss')</script><img src="x.png" onerror="console.error('xss')">&amp; -->"""


def hostile() -> dict:
    """The multi-model search with :data:`HOSTILE` in every text the report shows from the JSON:
    model names, the chip's name, baseline names and notes, a stage's recompute, the summary's
    warnings, lines and runner-up, the space, a pruning stage, a wall-time phase."""
    d = synthetic(multi=True)
    d["models"] = [HOSTILE, "m2"]
    d["accelerator"]["name"] = HOSTILE
    d["baselines"][0]["name"] = d["baselines"][2]["note"] = HOSTILE
    d["stages"][0]["recompute"] = HOSTILE
    s = d["summary"]
    s["warnings"], s["lines"], s["runner_up"] = [HOSTILE], [HOSTILE], {"name": HOSTILE, "why": HOSTILE}
    s["memory_bytes"][HOSTILE] = 1e9
    d["search"]["space"] = HOSTILE
    d["search"]["pruned"][HOSTILE] = 1
    d["search"]["wall_s"] = {HOSTILE: 1.0, **d["search"]["wall_s"]}
    d["models_detail"][0]["model"] = HOSTILE
    return d


def test_what_the_json_says_is_escaped(tmp_path):
    """Every text from the JSON is shown as text (the templates escape all they show but the
    charts' SVG, whose texts matplotlib escapes): no element, attribute or comment end of its
    own, on the page of a search and of a plan; and the browser loads nothing and logs nothing."""
    d = hostile()
    page = R.render(d)
    escaped = html.escape(HOSTILE, quote=False)  # the text; quotes (text, not attributes) either way
    assert "<script" not in page and "<img" not in page
    shown = page.replace("&#39;", "'").replace("&#34;", '"')
    # the title, the heading, the header (models, chip), the summary (runner-up twice, a warning,
    # the printed lines), a stage, a baseline and its note, the space, a pruning stage, a phase,
    # a model on the common chip
    assert shown.count(escaped) >= 15
    # the charts still parse (no comment ended early) and draw what they drew
    assert list(charts(page)) == ["breakdown", "footprint", "scatter", "timeline", "memory"]
    assert empty_charts(page) == []
    assert any(t.startswith("baseline: <script>console.error") for t in texts(page))
    plan = {k: v for k, v in d.items() if k not in ("search", "baselines", "models", "models_detail")}
    plan.update(model=HOSTILE, placement=HOSTILE, recompute="auto", feasible=False, binding=HOSTILE)
    plan["candidates"] = [{"micro_batch_size": 1, "tp": 1, "throughput_samples_per_s": 1.0, "note": HOSTILE}]
    plan_page = R.render(plan)
    assert "<script" not in plan_page and "<img" not in plan_page
    assert plan_page.replace("&#39;", "'").replace("&#34;", '"').count(escaped) >= 8
    if CHROMIUM:
        for name, text in (("hostile", page), ("hostile-plan", plan_page)):
            path = tmp_path / f"{name}.html"
            path.write_text(text, encoding="utf-8")
            assert inspect(path, tmp_path).problems == []


def test_the_templates_are_package_data():
    """The page is built from the templates in phaze/search/templates, which a wheel carries
    (maturin ships every file of the python-packages), read through the package's loader."""
    from importlib.resources import files

    names = {p.name for p in (files("phaze.search") / "templates").iterdir()}
    assert {"report.html.j2", "sections.html.j2", "macros.html.j2", "report.css"} <= names
    env = R._templates()
    assert env.autoescape is True and set(env.list_templates()) >= {"report.html.j2", "sections.html.j2"}
    # every kind of section the page builds has its macro
    module = env.get_template("sections.html.j2").module
    for kind in ("header", "summary", "scatter", "power", "timeline", "memory", "baselines", "stats", "models"):
        assert callable(getattr(module, kind)), kind
    assert callable(module.candidates)


def test_deterministic(pages, tmp_path):
    d = synthetic(multi=True)
    a = pages["multi"]
    assert R.render(copy.deepcopy(d)) == a
    out = tmp_path / "r.html"
    R.write(out, d)
    assert out.read_bytes() == a.encode("utf-8")
    # another process (another hash seed, a fresh matplotlib) writes the same bytes
    other = tmp_path / "other.html"
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from test_report import synthetic; "
        "from phaze.search import report as R; R.write(sys.argv[2], synthetic(multi=True))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(other)], check=True, env=env)
    assert other.read_bytes() == out.read_bytes()
    with pytest.raises(PhazeError, match="cannot write"):
        R.write(tmp_path / "missing" / "r.html", d)


# ---------------------------------------------------------------------------------------------
# The report of one plan (phazec --hw ... --report)
# ---------------------------------------------------------------------------------------------

DEEP = Path(__file__).parent / "models" / "tiny_gpt2_deep.py"


@pytest.fixture(scope="module")
def plan_reports(tmp_path_factory) -> dict[int, tuple[dict, str, str]]:
    """The deep tiny GPT-2 placed by phazec on 8 A100s as DP 4, PP 2, interleaved:2 (four chunks
    of two blocks), under ZeRO 0 and ZeRO 1: per ZeRO stage, the JSON, the report and the plan
    file, each written by phazec (in-process: two compiles, seconds each)."""
    from phaze.tools import phazec

    out = tmp_path_factory.mktemp("plan-reports")
    reports = {}
    for zero in (0, 1):
        stem = out / f"zero{zero}"
        argv = [str(DEEP), "--hw", "a100", "--micro-batch", "1", "--tp", "1", "--devices", "8"]
        argv += ["--global-batch", "64", "--placement", "expert:2,4,1", "--pipeline-schedule", "interleaved:2"]
        argv += ["--zero", str(zero), "-o", f"{stem}.mlir", "--json", f"{stem}.json", "--report", f"{stem}.html", "-q"]
        assert phazec.main(argv) == 0
        data = json.loads(Path(f"{stem}.json").read_text())
        reports[zero] = (data, Path(f"{stem}.html").read_text(encoding="utf-8"), Path(f"{stem}.mlir").read_text())
    return reports


def test_plan_report_page(plan_reports):
    data, page, _ = plan_reports[1]
    assert R.is_plan(data) and (data["pp"], data["virtual_stages"], data["dp"], data["zero"]) == (2, 2, 4, 1)
    cs = charts(page)
    # no scatter in a plan; the summary's charts when phazec writes the JSON's summary
    summary = ["breakdown", "footprint"] if data.get("summary") else []
    assert list(cs) == [*summary, "timeline", "memory"] and empty_charts(page) == []
    assert [svg.get("aria-label") for svg in cs.values()][len(summary) :] == ["pipeline timeline", "memory per rank"]
    assert "<h1>phaze plan: tiny-gpt2-deep</h1>" in page
    plan_line = "DP 4, PP 2, TP 1, SP off, schedule interleaved:2, ZeRO 1, EP 1, ranks tp-dp-pp"
    assert plan_line + ", micro-batch 1, micro-batches 16" in page
    assert "<th>Placement</th><td>expert:2,4,1</td>" in page and "Baselines" not in page
    assert "<h2>Candidates</h2>" in page and "<td>chosen</td>" in page
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids))
    # the chunk table: four chunks on ranks 0, 1, 0, 1, each with its rank's numbers
    table = page[page.index("<table><tr><th>chunk</th>") :]
    rows = re.findall(r"<tr>(.*?)</tr>", table[: table.index("</table>")], flags=re.S)[1:]
    assert [re.findall(r"<td[^>]*>(.*?)</td>", r)[:3] for r in rows] == [
        ["0", "0", "[0, 2]"],
        ["1", "1", "[3, 4]"],
        ["2", "0", "[5, 6]"],
        ["3", "1", "[7, 9]"],
    ]


def test_plan_timeline_draws_the_interleaved_schedule(plan_reports):
    """Two rows (the ranks), the ops of each of a rank's two chunks in a group of their own, where
    Megatron-LM's interleaved schedule puts them, each chunk taking half its rank's time."""
    data, page, _ = plan_reports[1]
    pp, v, m = data["pp"], data["virtual_stages"], data["num_micro_batches"]
    svg = charts(page)["timeline"]
    chunk_t = [s["time_s"] / v for s in data["stages"]]
    ops = R.interleaved_1f1b(pp, v, m, [t / 3 for t in chunk_t], [2 * t / 3 for t in chunk_t])
    groups = {
        (kind, j): marks(svg, f"timeline-{name}-{j}")
        for kind, name in (("F", "forward"), ("B", "backward"))
        for j in range(v)
    }
    assert marks(svg, "timeline-forward") == []  # the plain schedule's groups are not used
    boxes = [b for g in groups.values() for b in g]
    rows = sorted({round((b[1] + b[3]) / 2, 3) for b in boxes})
    assert len(rows) == pp and len(boxes) == 2 * pp * v * m
    (x0, _, x1, _), op = groups[("F", 0)][0], next(o for o in ops if o[1] == "F" and o[5] == 0)
    scale, origin = (x1 - x0) / (op[4] - op[3]), min(b[0] for b in boxes)
    for (kind, j), drawn_boxes in groups.items():
        # each chunk's ops on both ranks, m of them on each
        got = sorted((rows.index(round((b[1] + b[3]) / 2, 3)), round((b[0] - origin) / scale, 9)) for b in drawn_boxes)
        want = sorted((k, round(s, 9)) for k, kd, _i, s, _e, c in ops if kd == kind and c // pp == j)
        assert [k for k, _ in got] == [k for k, _ in want] == sorted([0] * m + [1] * m)
        assert [t for _, t in got] == pytest.approx([t for _, t in want], rel=1e-4, abs=1e-6)
    assert texts(page) >= {"forward, chunk 0", "forward, chunk 1", "backward, chunk 1", "Pipeline rank", "Time (ms)"}
    assert "Megatron-LM's interleaved 1F1B schedule: 2 ranks, 2 model chunks each" in page


def test_plan_memory_shows_what_zero_shards(plan_reports):
    """One bar per rank, stacked by part as the DP counts them; ZeRO-1 divides the optimizer
    state by the DP degree and moves nothing else, and the caption says so."""
    d = plan_reports[0][0]["dp"]
    heights = {}
    for zero, (data, page, _) in plan_reports.items():
        svg = charts(page)["memory"]
        bars = {k: sorted(marks(svg, f"memory-{k}")) for k in R.MEMORY_KINDS}
        assert all(len(b) == data["pp"] for b in bars.values())  # ranks, not chunks
        ranks = [s["memory"] for s in data["stages"][: data["pp"]]]
        for k in R.MEMORY_KINDS:  # each part as tall as its bytes, against the parameters
            for bar, par, mem in zip(bars[k], bars["params"], ranks):
                ratio = (bar[3] - bar[1]) / (par[3] - par[1])
                assert ratio == pytest.approx(mem[k] / mem["params"], rel=1e-4)
        assert all(sum(s["memory"].values()) == s["memory_bytes"] for s in data["stages"])
        heights[zero] = ranks
    for plain, sharded in zip(heights[0], heights[1]):
        assert sharded["optimizer"] == -(-plain["optimizer"] // d)
        assert {k: v for k, v in sharded.items() if k != "optimizer"} == {
            k: v for k, v in plain.items() if k != "optimizer"
        }
    assert (
        "Optimizer state sharded over the 4 data-parallel replicas (ZeRO-1): each device holds 1/4 of it."
        in plan_reports[1][1]
    )
    assert "Nothing is sharded over the 4 data-parallel replicas (ZeRO-0)" in plan_reports[0][1]


def test_plan_pages_of_plain_and_infeasible_plans():
    """A plan under plain 1F1B is drawn as the search's chosen plan is (one group per direction,
    one bar per stage); a plan that does not fit says what binds, with no charts."""
    d = synthetic()
    del d["search"], d["baselines"]
    d.update(candidates=[{"micro_batch_size": 2, "tp": 4, "throughput_samples_per_s": 505.2, "note": ""}], zero=0)
    d.update(virtual_stages=1, sequence_parallel=True, placement="phaze", recompute="auto", feasible=True)
    page = R.render(d)
    assert R.is_plan(d) and list(charts(page))[2:] == ["timeline", "memory"] and empty_charts(page) == []
    assert charts(page)["timeline"].get("aria-label") == "pipeline timeline"
    assert charts(page)["memory"].get("aria-label") == "memory per stage"
    assert len(marks(charts(page)["timeline"], "timeline-forward")) == 4 * 32
    assert "SP on, schedule 1f1b, ZeRO 0" in page and "Recompute</th><td>auto (selective)" in page
    assert "Nothing is sharded over the 64 data-parallel replicas (ZeRO-0)" in page
    bad = {
        "model": "m",
        "pp": 0,
        "stages": [],
        "feasible": False,
        "binding": "memory: no placement fits",
        "candidates": [{"micro_batch_size": 1, "tp": 1, "throughput_samples_per_s": 0.0, "note": "memory: ..."}],
    }
    page = R.render(bad)
    assert "<svg" not in page and "<th>Fits</th><td>no: memory: no placement fits</td>" in page
    assert "No pipeline plan." in page and "chosen" not in page


def test_zero_captions():
    assert R._zero_caption({"zero": 2, "dp": 8}) == (
        "Optimizer state and gradients sharded over the 8 data-parallel replicas (ZeRO-2): each device holds 1/8 of it."
    )
    assert "parameters sharded" in R._zero_caption({"zero": 3, "dp": 2}) and "two layers gathered" in R._zero_caption(
        {"zero": 3, "dp": 2}
    )
    assert "there is 1: nothing is divided" in R._zero_caption({"zero": 1, "dp": 1})
    assert R._zero_caption({"dp": 8}) == R._zero_caption({"zero": 1}) == ""  # an older JSON: nothing said


def test_plan_report_is_deterministic_and_the_plan_round_trips(plan_reports):
    """phazec's report is the rendering of its JSON (same bytes); the plan file, with each
    stage's memory parts, prints back as it was parsed."""
    from phaze_ir.ir import parse_module, print_module

    for data, page, mlir in plan_reports.values():
        assert R.render(copy.deepcopy(data)) == page
        # the module after the summary's comment block, if the plan file has one
        module = re.sub(r"\A(//[^\n]*\n)+\n", "", mlir)
        assert print_module(parse_module(mlir)) == module
        parts = re.findall(
            r"memory_bytes = (\d+), param_bytes = (\d+), grad_bytes = (\d+), optimizer_bytes = (\d+), "
            r"activation_bytes = (\d+), workspace_bytes = (\d+)",
            mlir,
        )
        assert len(parts) == 4 and all(int(t) == sum(map(int, rest)) for t, *rest in parts)


def test_report_needs_the_plan_stage(capsys):
    from phaze.tools import phazec

    assert phazec.main([str(DEEP), "--hw", "a100", "--emit", "recompute", "--report", "r.html"]) == 1
    assert "--report needs the plan stage (--emit plan)" in capsys.readouterr().err


def test_without_matplotlib(monkeypatch, tmp_path):
    """matplotlib is needed only for the charts: without it, a PhazeError that says so (a page
    with no chart still renders)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert "No evaluated points." in R.render({})
    with pytest.raises(PhazeError, match="pip install matplotlib"):
        R.write(tmp_path / "r.html", synthetic())


# ---------------------------------------------------------------------------------------------
# In a browser
# ---------------------------------------------------------------------------------------------


@needs_browser
def test_plan_report_opens_in_a_browser(plan_reports, tmp_path):
    path = tmp_path / "plan.html"
    path.write_text(plan_reports[1][1], encoding="utf-8")
    opened = inspect(path, tmp_path)
    assert opened.problems == []
    assert [c["label"] for c in opened.probe["charts"]][-2:] == ["pipeline timeline", "memory per rank"]


@needs_browser
@pytest.mark.parametrize("name", ["single", "real"])
def test_opens_in_a_browser(pages, name, tmp_path):
    path = tmp_path / f"{name}.html"
    path.write_text(pages[name], encoding="utf-8")
    opened = inspect(path, tmp_path)
    assert opened.problems == []
    assert [c["label"] for c in opened.probe["charts"]] == SEARCH_CHARTS[2 if name == "real" else 0 :]


@needs_browser
def test_the_browser_check_fails_on_a_broken_page(monkeypatch, tmp_path):
    """One page, four faults, each found: an empty scatter plot (axes and labels, no data), a
    JavaScript error, a timeline whose bars a stylesheet hides (in the SVG, not on screen), and a
    memory chart cut at 60 % of its width (its legend clipped, as the hand-written SVG did)."""

    def empty_scatter(mpl, *args):
        fig = R._figure(mpl, R.WIDTH_IN, 4.4)
        ax = R._axes(fig)
        ax.set_xlabel("Chip area (mm²)")
        ax.set_ylabel("Throughput (samples/s)")
        return fig

    monkeypatch.setattr(R, "_draw_scatter", empty_scatter)
    page = R.render(synthetic())
    assert empty_charts(page) == ["scatter"]  # the SVG check sees the empty plot
    page = page.replace("</body>", "<script>undefinedFunction();</script>\n</body>")
    page = page.replace("</style>", "#timeline-forward,#timeline-backward{display:none}\n</style>")
    assert empty_charts(page) == ["scatter"]  # the hidden bars are still in the SVG
    i = page.index('aria-label="memory per stage"')
    w, h = re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', page[i:]).groups()
    cut = f"{0.6 * float(w):.6f}"
    head = re.sub(r'width="[\d.]+pt"', f'width="{cut}pt"', page[i:], count=1)
    page = page[:i] + head.replace(f'viewBox="0 0 {w} {h}"', f'viewBox="0 0 {cut} {h}"', 1)
    path = tmp_path / "broken.html"
    path.write_text(page, encoding="utf-8")
    found = "\n".join(inspect(path, tmp_path).problems)
    assert "Uncaught ReferenceError: undefinedFunction is not defined" in found
    assert "chart scatter: its plot area shows no data" in found
    assert "chart timeline: its plot area shows no data" in found
    assert "chart memory: ink on its right edge (something is cut off)" in found
    assert "chart memory: its plot area" not in found and "chart scatter: ink" not in found
