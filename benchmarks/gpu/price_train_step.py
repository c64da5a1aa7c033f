"""Price with phaze, on the calibrated ``h100`` preset, the single-GPU training steps measured in
``data/h100/train_step.csv`` (``benchmarks/gpu/train_step.py``; data/h100/README.md), and print
predicted against measured.

    python benchmarks/gpu/price_train_step.py [--csv data/h100/train_step.csv] [--hw h100]

Every measured row (eager attention: softmax(QKᵀ)V as separate kernels; ``sdpa``: PyTorch's
fused attention) is priced as ``phazec MODEL.py --hw h100 --placement expert:1,1,1 --devices 1
--global-batch B --micro-batch B --recompute none|full --dtype amp-bfloat16 --kernels eager``
prices it (one GPU, one micro-batch of the whole batch; the model file's attention switched to
the row's with transformers' ``set_attn_implementation``), with the work shared: one trace and
one compilation per (model, micro-batch, attention), then the placement once per recompute
policy (as ``phaze-validate`` does).  Rows of ``train_step_runtimes.py``'s CSV (``--csv
OUT/train_step_runtimes.csv``) carry their ``precision`` (``bf16``: ``--dtype bfloat16``) and
``compiled`` (``inductor``: ``--kernels inductor``), and are priced so.  ``--kernels`` and
``--dtype`` price the same rows as
another runtime or precision would (``--kernels ops --dtype bfloat16``: phaze's model before
kernels and autocast were modelled).  The predicted step is the plan's time per batch, which
ends with the optimizer step as the measured step does (the layers' scheduled ``opt_s``, the
plan's ``breakdown_s`` ``optimizer_s``; docs/design.md §6.2).

The primary comparison is with ``kernel_s``, the step's summed GPU kernel time (the profiler's):
phaze prices the chip's work, one kernel after the other.  ``step_s`` (wall time between CUDA
events) is also host time: eager PyTorch issues each of a step's 1,000-8,000 kernels from Python
(~8 us each for a tiny op, ``overhead.csv``; more with autograd and module code), so a small
step waits for the host (``step_s`` several times ``kernel_s``), which the calibration's
``host_dispatch_s`` would model and the h100 preset leaves at 0.

What else differs:
* peak memory: torch's is the caching allocator's peak of allocated bytes in a step (weights,
  grads, AdamW moments, activations, the autocast weight casts, workspaces), phaze's the plan's
  ``max_memory_bytes`` (its memory model of weights, optimizer state and saved activations).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

#: The model file of each model name of train_step.csv (benchmarks/gpu/train_step.py's MODELS).
MODEL_FILES = {
    "gpt2-small": HERE / "models" / "gpt2_small.py",
    "gpt2-medium": HERE / "models" / "gpt2_medium.py",
    "gpt2-xl": ROOT / "examples" / "gpt2_xl.py",
    "llama-1b": HERE / "models" / "llama_1b.py",
    "llama2-7b-4l": HERE / "models" / "llama2_7b_4l.py",
    # benchmarks/gpu/train_step_runtimes.py's
    "llama3-1b-8k": HERE / "models" / "llama3_1b_8k.py",
    "moe-small": HERE / "models" / "moe_small.py",
    "bert-large": ROOT / "examples" / "bert_large.py",
    "opt-350m": ROOT / "examples" / "opt_350m.py",
}
#: phazec's --dtype of each measured precision (the CSV's ``precision``)
DTYPES = {"amp-bf16": "amp-bfloat16", "bf16": "bfloat16"}
GIB = 2**30


@dataclass(frozen=True)
class Measured:
    model: str
    micro_batch: int
    attention: str
    recompute: str
    step_s: float
    kernel_s: float
    kernels: int
    peak_memory_bytes: int
    precision: str = "amp-bf16"  #: ``amp-bf16`` (autocast) or ``bf16`` (the model cast to bf16)
    compiled: str = "none"  #: ``inductor``: the step ran under torch.compile

    @property
    def key(self) -> tuple[str, int, str, str, str, str]:
        return (self.model, self.micro_batch, self.attention, self.recompute, self.precision, self.compiled)


@dataclass(frozen=True)
class Predicted:
    plan_s: float | None  #: the plan's time per batch, its optimizer step included (None: it does not fit)
    opt_s: float  #: of it, the optimizer step (the plan's breakdown_s optimizer_s; 0 when it does not fit)
    memory_bytes: int
    note: str = ""
    ops: int = 0  #: the step's priced ops that take time (without recompute)
    by_kind: tuple[tuple[str, float], ...] = ()  #: seconds per op kind (without recompute)

    @property
    def step_s(self) -> float | None:
        """The whole step, as the measured one: the plan's time per batch (which ends with the
        optimizer step)."""
        return self.plan_s


def read_measured(path: str | os.PathLike[str]) -> list[Measured]:
    """The rows of train_step.csv that have a measurement (not ``oom``)."""
    out = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            try:
                step_s = float(r["step_s"])
            except ValueError:  # oom, error
                continue
            out.append(
                Measured(
                    r["model"],
                    int(r["micro_batch"]),
                    r["attention"],
                    r["recompute"],
                    step_s,
                    float(r["kernel_s"]),
                    int(r["kernels"]),
                    int(r["peak_memory_bytes"]),
                    # train_step_runtimes.py's columns (train_step.py measured AMP, uncompiled)
                    r.get("precision") or "amp-bf16",
                    r.get("compiled") or "none",
                )
            )
    return out


def _kind(op) -> str:
    """The op's kind in the breakdown: its phaze op name (matmul, elementwise, softmax, norm,
    layout (copies), reduction, embedding, optimizer_update, ...)."""
    return op.name.removeprefix("phaze.")


def _breakdown(module, acc) -> tuple[int, dict[str, float]]:
    """(ops that take time, seconds per kind) of the module's step, one op after the other."""
    from passes.algorithms.latency import ViewDesc, estimate_op
    from passes.cost_view import Describer

    describe = Describer()
    ops, by_kind = 0, defaultdict[str, float](float)
    for op in module.walk():
        _, desc = describe(op)
        if desc is None or isinstance(desc, ViewDesc):
            continue
        s = estimate_op(desc, acc).split_s
        if s > 0:
            ops += 1
            by_kind[_kind(op)] += s
    return ops, dict(by_kind)


def with_attention(spec, attention: str):
    """``spec`` whose model runs ``attention`` (transformers' ``set_attn_implementation``)."""
    build = spec.get_model

    def get_model():
        model = build()
        model.set_attn_implementation(attention)
        return model

    return replace(spec, get_model=get_model)


def price(
    measured: list[Measured], hw: str = "h100", kernels: str = "eager", dtype: str | None = None, log=print
) -> dict[tuple[str, int, str, str, str, str], Predicted]:
    """phaze's prediction of every measured step (:attr:`Measured.key`): as ``kernels`` says, and
    a compiled step (``compiled = inductor``) as Inductor's; at ``dtype``, or when None at the
    row's precision (:data:`DTYPES`)."""
    from xdsl.passes import PassPipeline

    from passes import ALL_PASSES
    from passes.algorithms.schedule import ScheduleCache
    from passes.solver_options import SolverOptions
    from phaze.options import Options
    from phaze.pipeline import load_accelerator, pipeline
    from phaze.plan.plan_output import plan_record, time_breakdown
    from phaze_ir.frontend import import_graph, load_model_file, trace_model
    from phaze_ir.hardware_ir import set_accelerator
    from phaze_ir.ir import make_context

    acc = load_accelerator(hw)
    cache = ScheduleCache(None)  # in memory, shared: equal blocks are solved once

    def passes(stage: str, o: Options) -> tuple:
        parsed = PassPipeline.parse_spec(ALL_PASSES, pipeline(stage, 1, o)).passes
        return tuple(replace(p, cache=cache) if isinstance(p, SolverOptions) else p for p in parsed)

    groups: dict[tuple[str, int, str, str, str], list[str]] = {}
    for m in measured:
        policies = groups.setdefault((m.model, m.micro_batch, m.attention, m.precision, m.compiled), [])
        if m.recompute not in policies:
            policies.append(m.recompute)
    out: dict[tuple[str, int, str, str, str, str], Predicted] = {}
    for (model, b, attention, precision, compiled), policies in groups.items():
        start = time.perf_counter()
        row_dtype = dtype or DTYPES[precision]
        base_opts = Options(
            hw=hw,
            dtype=row_dtype,
            kernels="inductor" if compiled == "inductor" else kernels,
            optimizer="adam",
            devices=1,
            placement="expert:1,1,1",
            schedule_cache=cache,
        )
        spec = with_attention(load_model_file(MODEL_FILES[model]), attention)
        traced = trace_model(spec, b, None, training=True, dtype=row_dtype)
        module = import_graph(traced)
        del traced
        ctx = make_context()
        training = passes("training", base_opts)
        PassPipeline(training).apply(ctx, module)
        set_accelerator(module, acc)
        full = passes("recompute", base_opts)
        PassPipeline(full[len(training) :]).apply(ctx, module)
        ops, by_kind = _breakdown(module, acc)
        for policy in policies:
            opts = replace(base_opts, global_batch=b, recompute=policy)
            PassPipeline((passes("plan", opts)[-1],)).apply(ctx, module)
            plan = plan_record(module)
            feasible = plan.get("feasible") == "yes"
            parts = time_breakdown(module) if feasible else None
            out[(model, b, attention, policy, precision, compiled)] = Predicted(
                float(plan["time_per_batch_s"]) if feasible else None,
                parts["optimizer_s"] if parts is not None else 0.0,
                int(plan.get("max_memory_bytes", 0)),
                "" if feasible else str(plan.get("binding", "")),
                ops,
                tuple(sorted(by_kind.items())),
            )
        what = f"{attention} {precision}" + (" compiled" if compiled == "inductor" else "")
        log(f"  {model} b={b} {what}: {', '.join(policies)} priced in {time.perf_counter() - start:.1f} s")
    return out


def _pct(x: float | None) -> str:
    return f"{'-':>7}" if x is None else f"{100 * x:+6.1f}%"


def _stats(name: str, e) -> str:
    e = np.asarray(e, dtype=float)
    if not len(e):
        return f"{name:<36} -"
    a = np.abs(e)
    return (
        f"{name:<36} n {len(a):>2}  median |err| {100 * np.median(a):5.1f} %  p90 "
        f"{100 * np.percentile(a, 90):5.1f} %  mean signed {100 * np.mean(e):+6.1f} %"
    )


def report(measured: list[Measured], predicted: dict[tuple[str, int, str, str, str, str], Predicted]) -> str:
    """The table (one row per measured step), the summaries, and phaze's time per op kind."""
    lines = [
        "predicted = the plan's time per batch, the optimizer step (opt) included; errors are predicted / measured - 1",
        f"{'model':<13}{'b':>3} {'attn':<6}{'recompute':<9}{'step_s':>9}{'kernel_s':>9}{'predicted':>10}{'(opt)':>8}"
        f"{'vs step':>9}{'vs kernel':>10}{'kernels':>8}{'ops':>6}{'mem GiB':>8}{'pred':>7}{'vs mem':>8}",
    ]
    rows = []  # (measured, predicted) of the feasible plans
    e_mem = []
    for m in measured:
        p = predicted[m.key]
        em = p.memory_bytes / m.peak_memory_bytes - 1
        e_mem.append(em)
        lead = f"{m.model:<13}{m.micro_batch:>3} {m.attention:<6}{m.recompute:<9}{m.step_s:9.4f}{m.kernel_s:9.4f}"
        if p.step_s is None:
            lines.append(f"{lead}  not priced: {p.note}")
            continue
        rows.append((m, p))
        lines.append(
            f"{lead}{p.step_s:10.4f}{p.opt_s:8.4f}{_pct(p.step_s / m.step_s - 1):>9}"
            f"{_pct(p.step_s / m.kernel_s - 1):>10}{m.kernels:>8}{p.ops:>6}"
            f"{m.peak_memory_bytes / GIB:8.2f}{p.memory_bytes / GIB:7.2f}{_pct(em):>8}"
        )
    pred = np.array([p.step_s for _, p in rows])
    without_opt = pred - np.array([p.opt_s for _, p in rows])
    kern = np.array([m.kernel_s for m, _ in rows])
    step = np.array([m.step_s for m, _ in rows])
    host = step > 1.2 * kern  # the host-bound steps
    none = np.array([m.recompute == "none" for m, _ in rows])
    sdpa = np.array([m.attention == "sdpa" for m, _ in rows])
    mem_sdpa = np.array([m.attention == "sdpa" for m in measured])
    e_mem_a = np.asarray(e_mem)
    ek, es = pred / kern - 1, pred / step - 1
    lines += [
        "",
        _stats("vs kernel_s (GPU busy time)", ek),
        _stats("  eager attention", ek[~sdpa]),
        _stats("  sdpa attention", ek[sdpa]),
        _stats("  recompute none", ek[none]),
        _stats("  recompute full", ek[~none]),
        _stats("  without the optimizer step", without_opt / kern - 1),
        _stats("vs step_s (wall time)", es),
        _stats("  GPU-bound steps", es[~host]),
        _stats("  host-bound steps", es[host]),
        _stats("peak memory", e_mem),
        _stats("  eager attention", e_mem_a[~mem_sdpa]),
        _stats("  sdpa attention", e_mem_a[mem_sdpa]),
        f"(host-bound: step_s > 1.2 x kernel_s: {int(host.sum())} of {len(host)} steps)",
    ]
    if host.any():
        ops = np.array([p.ops for _, p in rows])
        kernels = np.array([m.kernels for m, _ in rows])
        per_op = step[host] / ops[host] * 1e6
        per_kernel = step[host] / kernels[host] * 1e6
        lines.append(
            f"host-bound steps: step_s / phaze's ops {per_op.min():.0f}-{per_op.max():.0f} us "
            f"(median {np.median(per_op):.0f}), step_s / CUDA kernels {per_kernel.min():.0f}-"
            f"{per_kernel.max():.0f} us (median {np.median(per_kernel):.0f}): the host's time per op"
        )
    lines += ["", "phaze's seconds per op kind, one step without recompute (share):"]
    seen = set()
    for m, p in rows:
        if (m.model, m.micro_batch, m.attention) in seen or m.recompute != "none" or not p.by_kind:
            continue
        seen.add((m.model, m.micro_batch, m.attention))
        total = sum(t for _, t in p.by_kind)
        parts = "  ".join(f"{k} {t * 1e3:.1f} ms ({100 * t / total:.0f}%)" for k, t in p.by_kind if t >= 0.005 * total)
        lines.append(f"  {m.model:<13}{m.micro_batch:>3} {m.attention:<6}: {parts}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--csv", default=str(ROOT / "data" / "h100" / "train_step.csv"))
    p.add_argument("--hw", default="h100")
    p.add_argument("--kernels", default="eager", choices=("ops", "eager", "inductor", "megatron"))
    p.add_argument(
        "--dtype",
        default=None,
        help="phazec --dtype of every row (default: each row's measured precision, amp-bf16 as amp-bfloat16)",
    )
    p.add_argument("--attention", choices=("eager", "sdpa"), help="only the rows of this attention")
    args = p.parse_args()
    measured = [m for m in read_measured(args.csv) if args.attention in (None, m.attention)]
    start = time.perf_counter()
    print(
        f"pricing {len(measured)} measured steps on {args.hw} (--kernels {args.kernels}, compiled rows inductor; "
        f"--dtype {args.dtype or 'as measured'}):",
        file=sys.stderr,
    )
    predicted = price(measured, args.hw, args.kernels, args.dtype, log=lambda s: print(s, file=sys.stderr, flush=True))
    print(f"priced in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    print(report(measured, predicted))


if __name__ == "__main__":
    main()
