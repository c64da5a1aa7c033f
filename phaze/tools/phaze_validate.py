"""``phaze-validate``: compare phaze's predicted time per batch with measured training runs.

``phaze-validate RUNS.csv --hw a100`` reads a CSV of measured GPT runs (the columns of the
vTrain authors' measurements: GPUs, global batch, micro batch, hidden size, attention heads,
layers, sequence length, TP, DP, PP, iteration time in ms; optional vocabulary, dtype, split
and how a run was run), prices each run at exactly its placement with the full IR pipeline on
the given hardware and as the given runtime's kernels (``--kernels``, or a ``kernels`` column;
``phaze/validate.py``), and prints per run the predicted and measured time and the
signed error, then per split (dev, holdout: a seeded fifth held apart) the median and p90 of
|error| and the worst runs.  ``--json FILE`` writes all of it.

Bad input (a missing file or column, an inconsistent row, a bad option) gets a one-line error
and exit status 1; ``--debug`` shows the traceback.  A row with a value beyond its physical
plausibility bound (``phaze/validate.py``, ``COLUMN_BOUNDS``) is refused alone, before anything
is traced: one line on stderr names its row, column and bound, the other rows are priced and
reported (the refused ones among the runs not priced), and the exit status is 3; past 10
refused rows, the rest are counted in a line, and a last line counts them all.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence

from phaze.messages import exit_status, install_error_hook, log_line, show_warnings_as
from phaze.options import Options
from phaze.outputs import refuse_clashes, write_atomically, write_stdout
from phaze.tools import flags
from phaze_ir.errors import PhazeError

#: The exit status when the report is complete but rows were refused (1 is an error, 2 a bad
#: command line).
REFUSED_ROWS_STATUS = 3
#: Refused rows said on stderr one by one; the rest are counted (all are in the report).
SHOWN_REFUSALS = 10


def _parser() -> argparse.ArgumentParser:
    from phaze import validate as v

    p = flags.ToolParser(
        prog="phaze-validate",
        description="Price measured training runs (a CSV) with phaze and report the errors.",
    )
    p.add_argument(
        "csv", metavar="RUNS.csv", help="measured runs, one per line (docs/usage.md: 'Validating the cost model')"
    )
    flags.add_option_arguments(p, Options, ["hw"], required=["hw"])
    p.add_argument("--json", metavar="FILE", help="also write every run, the summaries and the timing as JSON")
    p.add_argument(
        "--split",
        default="all",
        choices=("all", "dev", "holdout"),
        help="price only this part of the runs (default: all)",
    )
    p.add_argument(
        "--holdout",
        type=float,
        default=v.DEFAULT_HOLDOUT,
        metavar="F",
        help="fraction of the runs held apart, never to calibrate on (default 0.2; a 'split' column overrides)",
    )
    p.add_argument(
        "--seed", type=int, default=v.DEFAULT_SEED, metavar="N", help="seed of the held-apart draw (default 0)"
    )
    p.add_argument(
        "--rows",
        metavar="LIST",
        help="price only these rows (1 is the first run): e.g. '1-20,35'; the summaries cover them only",
    )
    # the vTrain runs ran with full recompute
    flags.add_option_arguments(
        p,
        Options,
        ["recompute", "selective_recompute", "kernels"],
        defaults={"recompute": v.DEFAULT_RECOMPUTE},
        notes={"kernels": "a 'kernels' column decides for its rows; the vTrain runs ran as megatron"},
    )
    p.add_argument("--worst", type=int, default=5, metavar="N", help="worst runs shown per split (default 5)")
    p.add_argument("--summary-only", action="store_true", help="print the summaries, not every run")
    flags.add_worker_arguments(p, "the runs")
    p.add_argument(
        "--cache",
        default=None,
        metavar="DIR",
        help="keep layer schedules in this directory, shared by the workers and later runs (default: in memory)",
    )
    flags.add_cache_limit_argument(p)
    flags.add_option_arguments(p, Options, flags.SOLVER_FIELDS)
    flags.add_option_arguments(p, Options, ["strict"])
    flags.add_output_arguments(p)
    return p


def parse_rows(spec: str, count: int) -> set[int]:
    """The rows of ``--rows`` ('1-20,35'), each in 1..count."""
    rows: set[int] = set()
    for part in spec.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        try:
            a = int(lo)
            b = int(hi) if sep else a
        except ValueError:
            raise PhazeError(f"--rows {spec}: expected row numbers and ranges, e.g. '1-20,35'") from None
        if not 1 <= a <= b <= count:
            raise PhazeError(f"--rows {spec}: '{part}' is not within the file's rows 1-{count}")
        rows.update(range(a, b + 1))
    return rows


def check_flags(args: argparse.Namespace) -> None:
    """Every number and option of the command line in its range, before any work (the options
    by their fields' checks: :func:`phaze.tools.flags.check_option_flags`)."""
    flags.check_jobs(args)
    if not (math.isfinite(args.holdout) and 0 <= args.holdout <= 1):
        raise PhazeError(f"--holdout {args.holdout}: expected a fraction in [0, 1]")
    if args.worst < 0:
        raise PhazeError(f"--worst {args.worst}: expected a count from 0")
    flags.check_option_flags(args, Options)


def run(args: argparse.Namespace, log, refused: list | None = None) -> str:
    """Validate as the arguments ask; the text report (the JSON is written when asked).  The
    runs refused (see the module docstring) are said on stderr, and appended to ``refused``."""
    from phaze import validate as v

    check_flags(args)
    inputs = [("the runs file", args.csv)]
    if os.path.exists(args.hw):
        inputs.append(("the --hw file", args.hw))
    refuse_clashes(inputs, [("--json", args.json)])
    runs = v.assign_splits(v.read_runs(args.csv), args.holdout, args.seed)
    if args.rows:
        chosen = parse_rows(args.rows, len(runs))
        runs = [r for r in runs if r.row in chosen]
    if args.split != "all":
        runs = [r for r in runs if r.split == args.split]
    if not runs:
        raise PhazeError(f"{args.csv}: no runs in the {args.split} split")
    rejected = [r for r in runs if r.refused]
    # a refused row says whether rows are left to price (a file of refused rows alone has none)
    after = "refused; the other rows are priced" if len(rejected) < len(runs) else "refused"
    for r in rejected[:SHOWN_REFUSALS]:  # even with -q: they are why the exit status is 3
        said = f"{r.where(args.csv)}: {r.refused} ({after})"
        print(log_line("phaze-validate", said), file=sys.stderr)
    if len(rejected) > SHOWN_REFUSALS:
        more = len(rejected) - SHOWN_REFUSALS
        print(f"phaze-validate: and {more} more rows refused (the report lists them)", file=sys.stderr)
    if refused is not None:
        refused += rejected
    if args.cache:
        os.makedirs(args.cache, exist_ok=True)
    given = flags.option_values(args, Options)
    cache_dir = os.path.abspath(args.cache) if args.cache else None
    settings = v.Settings(v.pricing_options(**given), cache_dir=cache_dir, quiet=args.quiet)
    jobs = args.jobs if args.jobs is not None else max(1, len(os.sched_getaffinity(0)))
    priced, timing = v.validate(runs, settings, jobs, args.backend, args.address, log)
    result = v.Validation(runs, priced, settings, args.csv, args.holdout, args.seed, timing)
    log(
        f"priced {v.count(timing['placements'], 'run')} in {timing['wall_s']:.1f} s ("
        + (f"{timing['distinct_runs']} distinct, " if timing["distinct_runs"] < timing["placements"] else "")
        + f"{v.count(timing['traces'], 'trace')}, "
        f"{v.count(timing['compilations'], 'compilation')}; seconds summed over the workers: trace "
        f"{timing['trace_s']:.1f}, compile {timing['compile_s']:.1f}, place {timing['place_s']:.1f})"
    )
    if args.json:
        write_atomically(args.json, json.dumps(result.to_json(args.worst), indent=2) + "\n")
        log(f"wrote {args.json}")
    if args.cache:
        flags.trim_cache_dir(args.cache, args.cache_limit, log)
    return v.report_text(result, args.worst, per_run=not args.summary_only)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    show_warnings_as("phaze-validate")
    install_error_hook("phaze-validate", args.debug)

    def log(msg: str) -> None:
        if not args.quiet:
            print(log_line("phaze-validate", msg), file=sys.stderr, flush=True)

    refused: list = []
    status = exit_status("phaze-validate", args.debug, lambda: write_stdout(run(args, log, refused)))
    if status == 0 and refused:
        if len(refused) > SHOWN_REFUSALS:  # (each of the first rows said in its own line above)
            from phaze.validate import count

            said = f"{count(len(refused), 'row')} refused, not priced (exit status {REFUSED_ROWS_STATUS})"
            print(f"phaze-validate: {said}", file=sys.stderr)
        return REFUSED_ROWS_STATUS
    return status


if __name__ == "__main__":
    sys.exit(main())
