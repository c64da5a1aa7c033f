"""Measure on one GPU what an analytical cost model of training needs and no datasheet gives:
GEMM time over the shapes transformer training produces, memory-bound kernels over sizes,
attention (unfused and fused), and the per-kernel launch cost.

Plain PyTorch (no phaze import: the GPU machine has torch but not phaze's other packages).
Writes CSV files into OUT_DIR (data/h100/README.md says what each column is and how the figures
were taken); prints a short summary last.

    python benchmarks/gpu/measure_kernels.py OUT_DIR

How it times: every kernel is captured ``REPEAT`` times into a CUDA graph and the graph replayed,
timed with CUDA events: the figure is GPU time per kernel without the host's launch gaps (those
are measured apart, ``overhead.csv``).  The captured calls cycle through enough copies of the
operands (at least 2x the L2 cache in all) that each call reads its operands from HBM, as a
training step's kernels mostly do.  Operands are random (never zeros: they run faster).  Each
figure is the median of ``TRIALS`` replays.
"""

from __future__ import annotations

import csv
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

REPEAT = 20  #: kernels per captured graph
TRIALS = 5  #: graph replays timed; the median is kept
DTYPE = torch.bfloat16

#: (name, hidden, ffn, heads, head_dim): the layer shapes of the models phaze's examples and
#: benchmarks use (GPT-2 small/medium/XL, Llama 1B / 7B / 13B-like, GPT-3 175B).
MODELS = [
    ("gpt2-small", 768, 3072, 12, 64),
    ("gpt2-medium", 1024, 4096, 16, 64),
    ("gpt2-xl", 1600, 6400, 25, 64),
    ("llama-1b", 2048, 5504, 16, 128),
    ("llama2-7b", 4096, 11008, 32, 128),
    ("llama2-13b", 5120, 13824, 40, 128),
    ("gpt3-175b", 12288, 49152, 96, 128),
]
TOKENS = [512, 1024, 2048, 4096, 8192, 16384]  #: micro-batch x sequence
TP = [1, 2, 4, 8]
MAX_GEMM_FLOP = 3e12  #: larger products add little (the rate is flat there) and cost seconds


def l2_bytes() -> int:
    return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20))


def copies_for(nbytes: int) -> int:
    """Operand sets to cycle through so that 2x the L2 cache is touched between reuses."""
    return max(1, min(REPEAT, math.ceil(2 * l2_bytes() / max(nbytes, 1))))


def capture(calls) -> torch.cuda.CUDAGraph:
    """``calls`` (zero-argument callables) warmed up on a side stream, captured into a CUDA
    graph, and replayed once."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in calls[:3]:
            c()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in calls:
            c()
    g.replay()
    torch.cuda.synchronize()
    return g


def graph_time(calls) -> float:
    """Seconds per call of ``calls`` (a list of REPEAT zero-argument callables), GPU time."""
    g = capture(calls)
    times = []
    for _ in range(TRIALS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / len(calls))
    del g
    return statistics.median(times)


def gemm_shapes() -> list[tuple[str, int, int, int]]:
    """(where, M, N, K) of every forward and backward GEMM of the MODELS' layers at each token
    count and TP width: forward ``M x K . K x N``, data gradient ``M x N . N x K``, weight
    gradient ``K x M . M x N``."""
    out: dict[tuple[int, int, int], str] = {}
    for name, h, ffn, heads, _ in MODELS:
        gated = name.startswith("llama")
        for t in TP:
            if heads % t:
                continue
            layers = [
                ("qkv", h, 3 * h // t),
                ("proj", h // t, h),
                ("fc1", h, (2 if gated else 1) * ffn // t),
                ("fc2", ffn // t, h),
            ]
            for tokens in TOKENS:
                for lname, k, n in layers:
                    for kind, (mm, nn, kk) in (
                        ("fwd", (tokens, n, k)),
                        ("dgrad", (tokens, k, n)),
                        ("wgrad", (k, n, tokens)),
                    ):
                        if 2 * mm * nn * kk <= MAX_GEMM_FLOP:
                            out.setdefault((mm, nn, kk), f"{name}/tp{t}/{lname}/{kind}")
    return [(w, m, n, k) for (m, n, k), w in sorted(out.items())]


def measure_gemms(path: str) -> None:
    shapes = gemm_shapes()
    print(f"gemm: {len(shapes)} shapes", flush=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["example", "m", "n", "k", "dtype", "time_s", "tflops"])
        for i, (where, m, n, k) in enumerate(shapes):
            nbytes = (m * k + k * n + m * n) * 2
            sets = [
                (
                    torch.randn(m, k, device="cuda", dtype=DTYPE),
                    torch.randn(k, n, device="cuda", dtype=DTYPE),
                    torch.empty(m, n, device="cuda", dtype=DTYPE),
                )
                for _ in range(copies_for(nbytes))
            ]
            calls = [
                (lambda a=a, b=b, c=c: torch.mm(a, b, out=c))
                for a, b, c in (sets[j % len(sets)] for j in range(REPEAT))
            ]
            t = graph_time(calls)
            w.writerow([where, m, n, k, "bf16", f"{t:.6e}", f"{2 * m * n * k / t / 1e12:.2f}"])
            del sets, calls
            if i % 200 == 0:
                f.flush()
                print(f"  {i}/{len(shapes)}", flush=True)


def measure_attention(path: str) -> None:
    """Attention of one layer, (batch, heads, seq, head_dim) as the MODELS at TP 1 and 8: unfused
    (two batched GEMMs and a softmax, what a model traced with eager attention runs) and fused
    (scaled_dot_product_attention), forward and forward+backward."""
    cases = []
    for name, _, _, heads, d in MODELS:
        for seq in (1024, 2048, 4096):
            for t in (1, 8):
                if heads % t == 0:
                    cases.append((name, max(1, 8192 // seq), heads // t, seq, d))
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["example", "batch", "heads", "seq", "head_dim", "impl", "pass", "time_s"])
        for name, b, hh, s, d in cases:
            for impl, pas, t in attention_times(b, hh, s, d):
                w.writerow([name, b, hh, s, d, impl, pas, f"{t:.6e}"])
            torch.cuda.empty_cache()


def attention_times(b: int, hh: int, s: int, d: int) -> list[tuple[str, str, float]]:
    """(impl, pass, seconds) of one attention shape; NaN where it does not fit."""
    q, k, v = (torch.randn(b, hh, s, d, device="cuda", dtype=DTYPE, requires_grad=True) for _ in range(3))
    go = torch.randn(b, hh, s, d, device="cuda", dtype=DTYPE)

    def unfused():
        p = torch.softmax((q @ k.transpose(-1, -2)) * d**-0.5, dim=-1)
        return p @ v

    def fused():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    out = []
    for impl, fn in (("unfused", unfused), ("fused", fused)):
        for pas in ("fwd", "fwd+bwd"):

            def call(fn=fn, pas=pas):
                return fn() if pas == "fwd" else torch.autograd.grad(fn(), (q, k, v), go)

            try:
                t = event_time(call)
            except torch.OutOfMemoryError:
                t = float("nan")
            out.append((impl, pas, t))
    return out


def event_time(fn, min_s: float = 0.02) -> float:
    """Seconds per call of ``fn`` launched back to back (for work large enough that the host
    keeps ahead), median of TRIALS batches."""
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    n = max(1, min(50, int(min_s / max(a.elapsed_time(b) / 1e3, 1e-6))))
    times = []
    for _ in range(TRIALS):
        a.record()
        for _ in range(n):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3 / n)
    return statistics.median(times)


def measure_memory_bound(path: str) -> None:
    """Elementwise and row-reduction kernels over 2^12 .. 2^28 bf16 elements (rows of 1024 for
    the norms and softmax): time and the bytes each must read and write (in bf16, 2 per element
    read or written; dropout's mask 1)."""
    ops = {
        "copy": (lambda x, y, o: o.copy_(x), 4),
        "add": (lambda x, y, o: torch.add(x, y, out=o), 6),
        "gelu": (lambda x, y, o: F.gelu(x), 4),
        "dropout": (lambda x, y, o: F.dropout(x, 0.1, True), 5),  # result + a one-byte mask
        "layer_norm": (lambda x, y, o: F.layer_norm(x.view(-1, 1024), (1024,)), 4),
        "softmax": (lambda x, y, o: torch.softmax(x.view(-1, 1024), -1), 4),
    }
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["op", "elements", "bytes_moved", "time_s", "GBps"])
        for log2 in range(12, 29, 2):
            n = 2**log2
            for op, (fn, bytes_per_element) in ops.items():
                nbytes = bytes_per_element * n
                sets = [
                    tuple(torch.randn(n, device="cuda", dtype=DTYPE) for _ in range(3))
                    for _ in range(copies_for(nbytes))
                ]
                calls = [(lambda s=s, fn=fn: fn(*s)) for s in (sets[j % len(sets)] for j in range(REPEAT))]
                t = graph_time(calls)
                w.writerow([op, n, nbytes, f"{t:.6e}", f"{nbytes / t / 1e9:.1f}"])
                del sets, calls
            torch.cuda.empty_cache()


def measure_overhead(path: str) -> None:
    """The cost of one kernel that does almost nothing: launched from eager PyTorch (host
    dispatch + launch, what a training step's small ops pay) and replayed in a graph (the GPU's
    own minimum per kernel)."""
    x = torch.randn(1024, device="cuda", dtype=DTYPE)
    y = torch.empty_like(x)
    a = torch.randn(64, 64, device="cuda", dtype=DTYPE)
    c = torch.empty(64, 64, device="cuda", dtype=DTYPE)
    rows = []
    for name, fn in (("add_1k", lambda: torch.add(x, 1.0, out=y)), ("mm_64", lambda: torch.mm(a, a, out=c))):
        for _ in range(100):
            fn()
        torch.cuda.synchronize()
        n = 5000
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        eager = (time.perf_counter() - t0) / n
        rows.append((name, "eager", eager))
        rows.append((name, "graph", graph_time([fn] * REPEAT)))
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["kernel", "launch", "time_s"])
        for r in rows:
            w.writerow([r[0], r[1], f"{r[2]:.6e}"])


def environment() -> dict:
    p = torch.cuda.get_device_properties(0)
    smi = ""
    try:
        smi = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit",
                "--format=csv",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except OSError:
        pass
    return {
        "gpu": p.name,
        "sms": p.multi_processor_count,
        "memory_bytes": p.total_memory,
        "l2_bytes": l2_bytes(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "nvidia_smi": smi,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    with open(os.path.join(out, "environment.json"), "w") as f:
        json.dump(environment(), f, indent=1)
    for name, fn in (
        ("overhead", measure_overhead),
        ("memory_bound", measure_memory_bound),
        ("attention", measure_attention),
        ("gemm", measure_gemms),
    ):
        t0 = time.perf_counter()
        try:
            fn(os.path.join(out, f"{name}.csv"))
        except Exception as e:  # keep what the other measurements give
            print(f"{name}: FAILED: {type(e).__name__}: {e}", flush=True)
        print(f"{name}: {time.perf_counter() - t0:.1f} s", flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "kernels-out")
