"""torchao's float8 rowwise linear by shape: phaze's priced speed-up over bf16 against torchao's own.

torchao's per-shape table (``data/published/torchao_float8_rowwise_linear_h100.csv``, README there)
is the GPU-kernel time of ``LNLinearSigmoid`` (LayerNorm, a bias-free linear of ``K`` in and ``N``
out features, sigmoid) forward and backward on ``M`` tokens, compiled, in bf16 over the same with
the linear converted to torchao's rowwise ``Float8Linear``, on one H100
(``benchmarks/float8/float8_roofline.py --float8_recipe_name rowwise``).  This prices the same
module with ``--emit latency --kernels inductor`` in bf16 and ``--dtype fp8 --fp8-recipe
rowwise`` (and ``tensorwise``, which the table does not give) and prints both speed-ups side by
side.  Two differences from torchao's script, both in bf16 and FP8 alike: the LayerNorm has its
affine weight (phaze traces gradients of parameters, so the input gradient of the linear is
computed for the norm's weight, where torchao's input requires a gradient), and the loss is
the output's sum (torchao feeds a gradient of ones' shape); the optimizer's ops are left out.

    python benchmarks/fp8_linear_shapes.py                    # a few shapes a TP-sharded Llama has
    python benchmarks/fp8_linear_shapes.py 16384,4096,1024    # M,K,N ...
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "data" / "published" / "torchao_float8_rowwise_linear_h100.csv"

MODEL = """
import torch
from torch import nn

NAME = "ln-linear-sigmoid"


class LNLinearSigmoid(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm({k})
        self.fc = nn.Linear({k}, {n}, bias=False)

    def forward(self, x):
        return torch.sigmoid(self.fc(self.ln(x))).sum()


def get_model():
    return LNLinearSigmoid()


def get_inputs(micro_batch_size):
    return (torch.zeros(micro_batch_size, {m}, {k}),)
"""

#: Shapes of torchao's table near those of Llama 3 8B and 70B's linears at TP 8 (N or K of
#: 128 to 7,168 per device) and unsharded.
DEFAULT_SHAPES = (
    (16384, 4096, 1024),
    (16384, 4096, 2048),
    (16384, 1024, 4096),
    (16384, 2048, 4096),
    (16384, 4096, 4096),
    (16384, 8192, 8192),
)


def published() -> dict[tuple[int, int, int], float]:
    with PUBLISHED.open() as f:
        return {(int(r["m"]), int(r["k"]), int(r["n"])): float(r["speedup"]) for r in csv.DictReader(f)}


def step_s(model: Path, *flags: str) -> float:
    """The priced GPU time of the module's forward and backward (its kernels' sum), no optimizer."""
    from passes.graph_view import step_function
    from phaze_ir import dialect as ph
    from phaze_ir.ir import parse_module

    out = model.with_suffix(".mlir")
    cmd = [sys.executable, "-m", "phaze.tools.phazec", str(model), "--hw", "h100", "--tp", "1"]
    cmd += ["--emit", "latency", "--kernels", "inductor", "--no-cache", "-q", "-o", str(out), *flags]
    subprocess.run(cmd, check=True)
    ops = step_function(parse_module(out.read_text())).body.block.ops
    return sum(
        o.attributes["phaze.latency"].as_dict()["split_s"]
        for o in ops
        if isinstance(o, ph.ComputeOp) and o.attributes["phaze.phase"].data != "opt"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="*", help="M,K,N (default: a few of the table's)")
    args = parser.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes] or list(DEFAULT_SHAPES)
    table = published()
    print("     M      K      N   bf16 ms  rowwise ms  speed-up (torchao's)  tensorwise ms  speed-up")
    with tempfile.TemporaryDirectory() as tmp:
        for m, k, n in shapes:
            model = Path(tmp) / f"ln_linear_{m}_{k}_{n}.py"
            model.write_text(textwrap.dedent(MODEL.format(m=m, k=k, n=n)))
            bf16 = step_s(model, "--dtype", "bfloat16")
            rw = step_s(model, "--dtype", "fp8", "--fp8-recipe", "rowwise")
            tw = step_s(model, "--dtype", "fp8", "--fp8-recipe", "tensorwise")
            theirs = table.get((m, k, n))
            said = f"{theirs:.2f}" if theirs is not None else "  - "
            print(
                f"{m:6d} {k:6d} {n:6d} {bf16 * 1e3:9.3f} {rw * 1e3:11.3f}  {bf16 / rw:8.2f} ({said})"
                f"       {tw * 1e3:11.3f}  {bf16 / tw:8.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
