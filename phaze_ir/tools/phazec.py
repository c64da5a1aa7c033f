"""``phazec``: the phaze compiler driver.

``phazec MODEL.py -o OUT.mlir --emit STAGE`` imports a model file and runs the fixed pipeline
up to ``STAGE``:

- ``ir``: the forward step (forward + loss) imported into the ``phaze`` dialect;
- ``training``: the training step: forward, backward (input- and weight-gradient GEMMs),
  optimizer step, saved activations and layers;
- ``sharded``: one device's share under Megatron tensor parallelism of width ``--tp``;
- ``tiled``: GEMMs tiled onto the PE arrays of the accelerator ``--hw`` (in the IR as
  ``phaze.accelerator``);
- ``latency``: every op's latency on that accelerator.

Bad input (a missing or broken model file, an untraceable model, a bad option) gets a one-line
error and exit status 1; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from phaze_ir.errors import PhazeError

STAGES = ("ir", "training", "sharded", "tiled", "latency")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="phazec",
        description="Compile a PyTorch model file into a phaze plan (MLIR).",
    )
    p.add_argument("model", help="model file defining get_model() and get_inputs(micro_batch_size)")
    p.add_argument("-o", "--output", default="-", help="output .mlir file ('-' for stdout, the default)")
    p.add_argument("--emit", default="training", choices=STAGES,
                   help="last stage to run and print (default: training)")
    p.add_argument("--micro-batch", type=int, default=1, metavar="N", help="micro-batch size to trace (default 1)")
    p.add_argument("--seq-len", type=int, default=None, metavar="N",
                   help="sequence length (default: the model file's SEQ_LEN)")
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16", "float32", "model"),
                   help="training precision of weights and activations (default float16; 'model' keeps the model's)")
    p.add_argument("--optimizer", default="adam", choices=("adam", "sgd"),
                   help="optimizer of the training step (default adam, mixed precision)")
    p.add_argument("--hw", default="tpuv4", metavar="NAME|FILE",
                   help="accelerator: a preset (tpuv4, a100, h100) or a hardware TOML file (default tpuv4)")
    p.add_argument("--tp", type=int, default=1, metavar="N", help="tensor-parallel width (default 1)")
    p.add_argument("--strict", action="store_true", help="unknown aten ops are errors, not phaze.opaque")
    p.add_argument("--print-op-generic", action="store_true", help="print MLIR's generic op form")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress messages on stderr")
    p.add_argument("--debug", action="store_true", help="show Python tracebacks on errors")
    return p


def compile_model(args: argparse.Namespace, log) -> str:
    """Run the pipeline the arguments ask for and return the printed module."""
    from passes import TRAINING_PIPELINE
    from phaze_ir.frontend import import_graph, load_model_file, trace_model
    from phaze_ir.ir import make_context, print_module
    from xdsl.passes import PassPipeline
    from passes import ALL_PASSES

    stage = STAGES.index(args.emit)
    if args.tp < 1:
        raise PhazeError(f"--tp {args.tp}: expected a positive integer")
    accelerator = None
    if stage >= STAGES.index("tiled"):
        from phaze_ir.hardware import HardwareError, load_hardware

        try:
            accelerator = load_hardware(args.hw)
        except HardwareError as e:
            raise PhazeError(str(e)) from e
    spec = load_model_file(args.model)
    training = stage >= STAGES.index("training")
    log(f"tracing {spec.name} ({'training step' if training else 'forward'}, micro-batch {args.micro_batch}"
        + (f", seq {args.seq_len or spec.seq_len}" if (args.seq_len or spec.seq_len) else "") + ")")
    traced = trace_model(spec, args.micro_batch, args.seq_len, training=training, dtype=args.dtype)
    log(f"traced {len(traced.graph_module.graph.nodes)} aten nodes in {traced.trace_seconds:.1f} s")
    t = time.perf_counter()
    module = import_graph(traced, strict=args.strict)
    pipeline = []
    if training:
        pipeline.append(TRAINING_PIPELINE.replace("phaze-insert-optimizer", f"phaze-insert-optimizer{{optimizer={args.optimizer}}}"))
    if stage >= STAGES.index("sharded"):
        pipeline.append(f"phaze-shard-tensor-parallel{{width={args.tp}}}")
    if accelerator is not None:
        from phaze_ir.hardware_ir import set_accelerator

        set_accelerator(module, accelerator)
        pipeline.append("phaze-tile-pe-array")
    if stage >= STAGES.index("latency"):
        pipeline.append("phaze-estimate-latency")
    if pipeline:
        PassPipeline.parse_spec(ALL_PASSES, ",".join(pipeline)).apply(make_context(), module)
    module.verify()
    log(f"built {sum(1 for _ in module.walk())} ops in {time.perf_counter() - t:.1f} s")
    return print_module(module, generic=args.print_op_generic)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    quiet = args.quiet

    def log(msg: str) -> None:
        if not quiet:
            print(f"phazec: {msg}", file=sys.stderr, flush=True)

    try:
        text = compile_model(args, log)
        if args.output == "-":
            sys.stdout.write(text)
        else:
            try:
                with open(args.output, "w") as f:
                    f.write(text)
            except OSError as e:
                raise PhazeError(f"{args.output}: cannot write: {e.strerror}") from e
            log(f"wrote {args.output}")
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
