"""The HTML search report (phaze/search/report.py).

A synthetic search (a few hundred points around a known Pareto front, 4 stages, 3 baselines of
which one is infeasible, and a multi-model variant) is rendered and checked: every <svg> block is
well-formed XML and there is one per plot, nothing refers outside the page, the front and the 1F1B
schedule are right (the schedule against its dependencies and the classic makespan), speed-ups are
the chosen throughput over the baseline's, missing fields are tolerated, and the output is
deterministic.
"""

from __future__ import annotations

import copy
import random
import re
import xml.etree.ElementTree as ET

import pytest

from phaze.search import report as R
from phaze_ir.errors import PhazeError

GIB = 1 << 30
SVG_NS = "{http://www.w3.org/2000/svg}"

# The front: area -> throughput, strictly increasing in both.
FRONT = [(100.0, 200.0), (150.0, 320.0), (220.0, 450.0), (300.0, 505.2)]


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
            "pruned": {"work_bound": 1300000, "dp_bound": 100000, "exact": 120},
            "evaluated": 160,
            "wall_s": {"prepare": 80.1, "estimate": 3.2, "bounds": 20.5, "schedule": 150.2, "dp": 12.0, "total": 270.0},
            "points": points,
            "bound_points": [
                {"area_mm2": rng.uniform(100, 400), "throughput_samples_per_s": rng.uniform(100, 900)}
                for _ in range(50)
            ],
        },
    }
    if multi:
        d["models"] = ["gpt2-xl", "llama2-7b"]
        d["models_detail"] = [
            {"model": "gpt2-xl", "throughput_samples_per_s": 970.0, "own_best_samples_per_s": 1000.0, "loss": 0.03},
            {"model": "llama2-7b", "throughput_samples_per_s": 505.2, "own_best_samples_per_s": 505.2},
        ]
    else:
        d["model"] = "llama2-7b"
    return d


def svgs(page: str) -> list[ET.Element]:
    blocks = re.findall(r"<svg\b.*?</svg>", page, flags=re.S)
    return [ET.fromstring(b) for b in blocks]


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


def test_1f1b_prefix_is_exact():
    """The timeline schedules only m' = 16 + pp micro-batches when m is larger: the ops of the
    first 16 must start exactly when they do in the full schedule."""
    rng = random.Random(5)
    for pp in (1, 2, 4, 7):
        f = [rng.uniform(0.5, 2) for _ in range(pp)]
        b = [2 * x * rng.uniform(0.8, 1.2) for x in f]
        full = {o[:3]: o[3:] for o in R.one_f_one_b(pp, 60, f, b) if o[2] < 16}
        cut = {o[:3]: o[3:] for o in R.one_f_one_b(pp, 16 + pp, f, b) if o[2] < 16}
        assert cut == full


# ---------------------------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------------------------


def test_page_structure():
    page = R.render(synthetic())
    assert page.startswith("<!DOCTYPE html>")
    trees = svgs(page)
    assert len(trees) == 3 == page.count("<svg")  # scatter, timeline, memory
    refs = re.findall(r"https?://[^\s\"'<>]*", page)
    assert set(refs) == {"http://www.w3.org/2000/svg"}
    assert "<script" not in page
    assert "<best>" not in page and "phaze &lt;best&gt;" in page  # escaped
    assert "8 × 128×128 TC" in page and "2 × 128 VC" in page and "128 MiB GB" in page
    assert "1,409,280" in page and "88,080" in page and "505.2" in page
    # the highlighted front points in the scatter are exactly the front
    scatter = trees[0]
    front = [g for g in scatter.iter(SVG_NS + "g") if g.get("class") == "pareto"]
    assert len(front) == 1 and len(list(front[0])) == len(FRONT)
    # timeline: 32 micro-batches, only 16 drawn, 2 ops each on 4 stages
    timeline = trees[1]
    rects = [
        r
        for r in timeline.iter(SVG_NS + "rect")
        if r.get("fill") in (R.FWD_COLOUR, R.BWD_COLOUR) and r.get("height") != "10"
    ]
    assert len(rects) == 2 * 4 * 16
    assert "first 16 of 32 micro-batches" in page
    # memory: 4 stages x 5 kinds, plus the HBM line
    mem = trees[2]
    bars = [r for r in mem.iter(SVG_NS + "rect") if r.get("fill") in R.MEMORY_COLOURS and r.get("height") != "10"]
    assert len(bars) == 20
    assert "HBM 63.33 GiB" in page


def test_speedups():
    d = synthetic()
    page = R.render(d)
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


def test_stats_and_multi_model():
    page = R.render(synthetic(multi=True))
    assert "gpt2-xl, llama2-7b" in page
    assert "Models on the common chip" in page
    assert "3 %" in page and "0 %" in page  # given loss, and computed one
    assert "92.25 %" in page  # work_bound / candidates
    assert "1,300,000" in page and "9,280" in page  # pruned, remaining after dp_bound
    assert len(svgs(page)) == 3


def test_missing_fields():
    d = synthetic()
    for s in d["stages"]:
        del s["memory"]
    del d["search"]["bound_points"]
    for k in ("num_micro_batches", "accelerator"):
        del d[k]
    page = R.render(d)
    assert len(svgs(page)) == 3
    assert "first 16 of 32 micro-batches" in page  # m from global batch / (dp * micro-batch)
    for page in (
        R.render({}),
        R.render({"model": "x", "stages": [{}], "search": {"points": [{}]}}),
        R.render({"pp": 2, "num_micro_batches": 3, "baselines": [{"name": "b"}], "search": {"wall_s": {}}}),
    ):
        assert page.endswith("</html>\n")
        svgs(page)


def test_deterministic(tmp_path):
    d = synthetic(multi=True)
    a = R.render(d)
    assert R.render(copy.deepcopy(d)) == a
    out = tmp_path / "r.html"
    R.write(out, d)
    assert out.read_bytes() == a.encode("utf-8")
    with pytest.raises(PhazeError, match="cannot write"):
        R.write(tmp_path / "missing" / "r.html", d)
