"""Plot the error distribution of ``phaze-validate`` runs (docs/validation.md's figure).

    phaze-validate data/vtrain/ground_truth_single.csv --hw a100 --json single.json
    phaze-validate data/vtrain/ground_truth_multi.csv --hw a100 --json multi.json
    python benchmarks/plot_validation.py single.json multi.json -o docs/validation_errors.svg

One panel per JSON file: the histogram of signed errors (predicted / measured - 1) of its
development and held-apart runs, with their median and p90 of |error| in the legend.  The SVG
is deterministic (no date, fixed ids): the same JSON gives the same bytes.
"""

from __future__ import annotations

import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+", help="phaze-validate --json files")
    ap.add_argument("-o", "--output", required=True, help="the figure (.svg or .png)")
    args = ap.parse_args()
    plt.rcParams["svg.hashsalt"] = "phaze"
    fig, axes = plt.subplots(1, len(args.json), figsize=(5 * len(args.json), 3.6), squeeze=False)
    bins = np.linspace(-0.6, 0.6, 49)
    for ax, path in zip(axes[0], args.json, strict=True):
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        for split, color in (("dev", "#4c72b0"), ("holdout", "#dd8452")):
            errors = np.array([r["error"] for r in data["runs"] if r["split"] == split and r["error"] is not None])
            if not len(errors):
                continue
            s = data["summary"][split]
            label = f"{split} ({len(errors)}): median {s['median_abs_error']:.1%}, p90 {s['p90_abs_error']:.1%}"
            ax.hist(np.clip(errors, bins[0], bins[-1]), bins=bins, alpha=0.6, color=color, label=label)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_title(f"{os.path.basename(data['csv'])} on {os.path.basename(data['hw'])}", fontsize=10)
        ax.set_xlabel("predicted / measured - 1 (clipped to ±60 %)")
        ax.set_ylabel("runs")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.output, metadata={"Date": None} if args.output.endswith(".svg") else None)


if __name__ == "__main__":
    main()
