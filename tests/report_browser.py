"""Open an HTML report in a real headless browser (Debian's ``chromium``) and say what a reader
would find wrong with it: a console error, a resource the page tries to load, a chart that is not
laid out, a chart with something cut off at its edge, or a chart whose plot area shows no data in
the screenshot.

How it looks: the page is copied with a small probe script at the top of ``<head>`` (the report
itself has no script). The probe records uncaught errors, ``console.error`` calls and failed
loads, and once the page has loaded it writes, into a hidden ``<pre>``, the size and position of
every ``<svg>`` and the resources the page fetched. One ``chromium --headless`` run prints the DOM
(``--dump-dom``: the probe's findings) and takes the screenshot (``--screenshot``), with the
browser's console on stderr (``--enable-logging=stderr --v=0``: every message of the page is a
``CONSOLE`` line). In the screenshot, each chart's plot area (the SVG group ``NAME-plot-area``,
scaled from the SVG's viewBox to the laid-out size, less 2 px inside the frame) must hold ink:
pixels that are coloured or darker than the light grey grid. Only data are drawn there (the
legends are outside the axes, the ticks and labels around them), so an empty plot has none. And
each chart's outer 2 px must have no ink: the charts are saved with a blank margin around all they
draw (``bbox_inches="tight"``), so ink there is something cut off (a legend, a label).

Used by tests/test_report.py; any test that has a report file can call :func:`inspect`.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

CHROMIUM = shutil.which("chromium")
WINDOW = (1100, 3800)
#: A plot area must have at least this share of ink (see :func:`ink_share`); a page too.
MIN_INK = 0.002
MIN_PAGE_INK = 0.01

PROBE = """<script>(function () {
  var errors = [];
  window.addEventListener("error", function (e) {
    var t = e.target && e.target !== window ? " " + (e.target.src || e.target.href || e.target.tagName) : "";
    errors.push("error: " + (e.message || "failed to load") + t);
  }, true);
  var ce = console.error;
  console.error = function () {
    errors.push("console.error: " + Array.prototype.join.call(arguments, " "));
    ce.apply(console, arguments);
  };
  window.addEventListener("load", function () {
    var charts = Array.prototype.map.call(document.querySelectorAll("svg"), function (s) {
      var r = s.getBoundingClientRect();
      return {label: s.getAttribute("aria-label"), x: r.left + scrollX, y: r.top + scrollY,
              w: r.width, h: r.height};
    });
    var res = performance.getEntriesByType("resource").map(function (r) { return r.name; });
    var out = document.createElement("pre");
    out.id = "phaze-probe";
    out.hidden = true;
    out.textContent = JSON.stringify({errors: errors, charts: charts, resources: res,
                                      width: document.documentElement.scrollWidth});
    document.body.appendChild(out);
  });
})();</script>"""


@dataclass
class Opened:
    """What the browser made of a page."""

    console: list[str]
    probe: dict | None
    screenshot: Path
    problems: list[str] = field(default_factory=list)


def plot_areas(page: str) -> list[tuple[str, tuple[float, float, float, float], tuple[float, float]]]:
    """For each chart of ``page`` (an ``<svg class="chart">``): its name (the prefix of its ids),
    its plot area ``(x0, y0, x1, y1)`` in viewBox units, and the viewBox size."""
    out = []
    for block in re.findall(r'<svg class="chart".*?</svg>', page, flags=re.S):
        root = ET.fromstring(block)
        vb = [float(v) for v in root.get("viewBox", "0 0 0 0").split()]
        for g in root.iter("{http://www.w3.org/2000/svg}g"):
            gid = g.get("id") or ""
            if gid.endswith("-plot-area"):
                path = g.find("{http://www.w3.org/2000/svg}path")
                nums = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?", path.get("d") if path is not None else "")]
                xs, ys = nums[0::2], nums[1::2]
                out.append((gid[: -len("-plot-area")], (min(xs), min(ys), max(xs), max(ys)), (vb[2], vb[3])))
                break
    return out


def inspect(path: Path, workdir: Path) -> Opened:
    """Open the report at ``path`` in headless chromium; ``problems`` lists what is wrong."""
    from PIL import Image

    page = path.read_text(encoding="utf-8")
    probed = workdir / (path.stem + ".probe.html")
    probed.write_text(page.replace("<head>", "<head>\n" + PROBE, 1), encoding="utf-8")
    shot = workdir / (path.stem + ".png")
    cmd = [
        CHROMIUM or "chromium",
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        "--enable-logging=stderr",
        "--v=0",
        "--dump-dom",
        f"--screenshot={shot}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        probed.resolve().as_uri(),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=workdir)
    console = [ln for ln in r.stderr.splitlines() if ":CONSOLE" in ln or "Uncaught" in ln]
    m = re.search(r'<pre id="phaze-probe"[^>]*>(.*?)</pre>', r.stdout, flags=re.S)
    probe = json.loads(html.unescape(m[1])) if m else None
    opened = Opened(console, probe, shot)
    bad = opened.problems
    bad += [f"console: {ln}" for ln in console]
    if r.returncode != 0 or not shot.exists():
        bad.append(f"chromium failed ({r.returncode}): {r.stderr[-2000:]}")
        return opened
    if probe is None:
        bad.append("the page never finished loading (no probe output)")
        return opened
    bad += [f"page: {e}" for e in probe["errors"]]
    bad += [f"the page loads {u}" for u in probe["resources"]]
    if probe["width"] > WINDOW[0]:
        bad.append(f"the page is {probe['width']} px wide in a {WINDOW[0]} px window")
    img = Image.open(shot).convert("RGB")
    areas = plot_areas(page)
    if len(areas) != len(probe["charts"]):
        bad.append(f"{len(probe['charts'])} <svg> on the page, {len(areas)} charts with a plot area")
    for (name, (x0, y0, x1, y1), (vw, vh)), box in zip(areas, probe["charts"]):
        if box["w"] < 100 or box["h"] < 60:
            bad.append(f"chart {name} is laid out {box['w']:.0f}×{box['h']:.0f} px")
            continue
        edge = _edge_ink(img, box)
        if edge:
            bad.append(f"chart {name}: ink on its {edge} edge (something is cut off)")
        sx, sy = box["w"] / vw, box["h"] / vh
        crop = (box["x"] + x0 * sx + 2, box["y"] + y0 * sy + 2, box["x"] + x1 * sx - 2, box["y"] + y1 * sy - 2)
        if crop[3] > img.height:
            bad.append(f"chart {name} is below the screenshot ({crop[3]:.0f} > {img.height} px)")
            continue
        share = ink_share(img.crop(tuple(round(c) for c in crop)))
        if share < MIN_INK:
            bad.append(f"chart {name}: its plot area shows no data ({100 * share:.3f} % ink)")
    if ink_share(img) < MIN_PAGE_INK:
        bad.append(f"the screenshot is blank ({100 * ink_share(img):.3f} % ink)")
    return opened


def _edge_ink(img, box: dict) -> str | None:
    """The first edge of the laid-out chart ``box`` with ink within 2 px of it: the charts are
    saved with a blank margin all round, so ink there is a label, legend or mark cut off."""
    x0, y0 = round(box["x"]) + 1, round(box["y"]) + 1
    x1, y1 = int(box["x"] + box["w"]) - 1, int(box["y"] + box["h"]) - 1
    if y1 > img.height:
        return None  # below the screenshot: reported as such
    strips = {
        "top": (x0, y0, x1, y0 + 2),
        "bottom": (x0, y1 - 2, x1, y1),
        "left": (x0, y0, x0 + 2, y1),
        "right": (x1 - 2, y0, x1, y1),
    }
    return next((side for side, c in strips.items() if ink_share(img.crop(c)) > 0), None)


def ink_share(img) -> float:
    """The share of pixels of ``img`` (RGB) that are ink: coloured (channels more than 30 apart)
    or darker than the charts' grid (#e4e4e4) and the white background."""
    import numpy as np

    a = np.asarray(img, dtype=np.int16)
    if a.size == 0:
        return 0.0
    return float((((a.max(axis=2) - a.min(axis=2)) > 30) | (a.max(axis=2) < 200)).mean())
