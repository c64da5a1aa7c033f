"""``phazec``: the phaze compiler driver.

``phazec MODEL.py -o OUT.mlir`` imports a model file and runs the whole pipeline to the plan:
for micro-batch sizes 1, 2, 4, 8 and TP widths 1, 2, 4, 8, the training step is sharded,
priced on the accelerator ``--hw``, scheduled, given recompute options and placed on
``--devices`` accelerators by the exact DP; the best plan is written (``--json`` too).
``--emit STAGE`` stops earlier (the stages are listed in ``phaze_ir/driver.py``).

Bad input (a missing or broken model file, an untraceable model, a bad option) gets a one-line
error and exit status 1; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from phaze_ir.errors import PhazeError

from phaze_ir.driver import STAGES


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="phazec",
        description="Compile a PyTorch model file into a phaze plan (MLIR).",
    )
    p.add_argument("model", help="model file defining get_model() and get_inputs(micro_batch_size)")
    p.add_argument("-o", "--output", default="-", help="output .mlir file ('-' for stdout, the default)")
    p.add_argument("--emit", default="plan", choices=STAGES,
                   help="last stage to run and print (default: plan)")
    p.add_argument("--micro-batch", type=int, default=None, metavar="N",
                   help="micro-batch size (default: 1, and the plan stage tries 1, 2, 4 and 8)")
    p.add_argument("--tp", type=int, default=None, metavar="N",
                   help="tensor-parallel width (default: 1, and the plan stage tries 1, 2, 4 and 8)")
    p.add_argument("--seq-len", type=int, default=None, metavar="N",
                   help="sequence length (default: the model file's SEQ_LEN)")
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32", "model"),
                   help="training precision of weights and activations (default float16; 'model' keeps the model's)")
    p.add_argument("--optimizer", default="adam", choices=("adam", "sgd"),
                   help="optimizer of the training step (default adam, mixed precision)")
    p.add_argument("--hw", default="tpuv4", metavar="NAME|FILE",
                   help="accelerator: a preset (tpuv4, a100, h100) or a hardware TOML file (default tpuv4)")
    p.add_argument("--devices", type=int, default=1024, metavar="N", help="accelerators in the cluster (default 1024)")
    p.add_argument("--global-batch", type=int, default=4096, metavar="N", help="samples per training step (default 4096)")
    p.add_argument("--placement", default="phaze", metavar="phaze|expert|expert:PP,DP,TP",
                   help="search the placement (default), or evaluate the paper's expert one or a given one")
    p.add_argument("--dp-overlap", action="store_true", help="hide the DP gradient all-reduce behind backward")
    p.add_argument("--solver-time-limit", type=float, default=10.0, metavar="S",
                   help="SCIP time limit per layer schedule, seconds (default 10)")
    p.add_argument("--solver-gap", type=float, default=0.005, metavar="G",
                   help="stop a layer's schedule at this proven relative gap (default 0.005)")
    p.add_argument("--json", metavar="FILE", help="also write the plan as JSON (plan stage)")
    p.add_argument("--strict", action="store_true", help="unknown aten ops are errors, not phaze.opaque")
    p.add_argument("--print-op-generic", action="store_true", help="print MLIR's generic op form")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress messages on stderr")
    p.add_argument("--debug", action="store_true", help="show Python tracebacks on errors")
    return p


def options(args: argparse.Namespace):
    """The driver options of parsed command-line arguments."""
    from phaze_ir.driver import DEFAULT_MICRO_BATCHES, Options

    if args.json and args.emit != "plan":
        raise PhazeError("--json needs the plan stage (--emit plan)")
    return Options(
        emit=args.emit,
        micro_batches=(args.micro_batch,) if args.micro_batch is not None else DEFAULT_MICRO_BATCHES,
        tp_widths=(args.tp,) if args.tp is not None else None,
        seq_len=args.seq_len, dtype=args.dtype, optimizer=args.optimizer, hw=args.hw,
        devices=args.devices, global_batch=args.global_batch, placement=args.placement,
        dp_overlap=args.dp_overlap, strict=args.strict,
        schedule_time_limit=args.solver_time_limit, schedule_gap=args.solver_gap,
    )


def compile_model(args: argparse.Namespace, log) -> tuple[str, str | None]:
    """Run the pipeline the arguments ask for; return the printed module and, when no placement
    fits, the message saying which constraint binds (the JSON plan is written when asked)."""
    import json

    from phaze_ir import driver
    from phaze_ir.ir import print_module

    opts = options(args)
    module, candidates = driver.compile_model(args.model, opts, log)
    failure = None
    if opts.emit == "plan":
        plan = driver.plan_record(module)
        if plan.get("feasible") != "yes":
            binding = plan.get("binding", "")
            failure = binding if "no placement fits" in binding else f"no placement fits: {binding}"
        else:
            log("plan:\n" + driver.summary(module))
        if args.json:
            try:
                with open(args.json, "w") as f:
                    json.dump(driver.plan_json(module, candidates), f, indent=2, sort_keys=False)
                    f.write("\n")
            except OSError as e:
                raise PhazeError(f"{args.json}: cannot write: {e.strerror}") from e
            log(f"wrote {args.json}")
    return print_module(module, generic=args.print_op_generic), failure


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    quiet = args.quiet

    def log(msg: str) -> None:
        # The plan summary is shown even with -q: it is the answer, not progress.
        if not quiet or msg.startswith("plan:"):
            print(f"phazec: {msg}", file=sys.stderr, flush=True)

    try:
        text, failure = compile_model(args, log)
        if args.output == "-":
            sys.stdout.write(text)
        else:
            try:
                with open(args.output, "w") as f:
                    f.write(text)
            except OSError as e:
                raise PhazeError(f"{args.output}: cannot write: {e.strerror}") from e
            log(f"wrote {args.output}")
        if failure:
            raise PhazeError(failure)
    except PhazeError as e:
        if args.debug:
            raise
        print(f"phazec: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("phazec: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
