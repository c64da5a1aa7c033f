"""Measure the training step of small GPT and Llama models on one GPU, as plain PyTorch runs it:
the validation data of phaze's single-GPU predictions (``benchmarks/gpu/price_train_step.py``
prices the same steps; data/h100/README.md).

    python benchmarks/gpu/train_step.py OUT_DIR

Every model file in :data:`MODELS` (phaze model files: ``get_model()`` builds the model from its
configuration) is built on the GPU with random weights in fp32 and trained with automatic mixed
precision in bf16 (``torch.autocast``) and fused AdamW: forward, loss, backward, optimizer step,
gradients zeroed.  Attention ``eager`` (softmax(QKᵀ)V as separate kernels, what phaze traces) and
``sdpa`` (PyTorch's fused attention); recompute ``none``, and ``full`` (every layer
checkpointed: ``gradient_checkpointing_enable()``, Megatron's full recompute) with eager
attention.  Per configuration: median step time of ``STEPS`` steps after ``WARMUP`` (CUDA
events around each step), peak memory allocated during a step, and from one profiled step the
number of GPU kernels and their summed GPU time (the step's time with the host's launch gaps
taken out).  Writes ``train_step.csv`` into OUT_DIR; an out-of-memory configuration is written
with ``oom``.
"""

from __future__ import annotations

import csv
import gc
import importlib.util
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WARMUP = 3
STEPS = 10

#: (model file, micro-batch sizes)
MODELS = [
    (os.path.join(HERE, "models", "gpt2_small.py"), (1, 2, 4, 8, 16)),
    (os.path.join(HERE, "models", "gpt2_medium.py"), (1, 2, 4, 8)),
    (os.path.join(ROOT, "examples", "gpt2_xl.py"), (1, 2, 4)),
    (os.path.join(HERE, "models", "llama_1b.py"), (1, 2, 4)),
    (os.path.join(HERE, "models", "llama2_7b_4l.py"), (1, 2)),
]
#: (attention, recompute) pairs measured for every model and micro-batch
VARIANTS = [("eager", "none"), ("sdpa", "none"), ("eager", "full")]


def load(path: str):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def kernel_stats(step) -> tuple[int, float]:
    """(GPU kernels, their summed GPU seconds) of one call of ``step``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    n, total_us = 0, 0.0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            n += 1
            total_us += e.time_range.elapsed_us()
    return n, total_us / 1e6


def measure(mod, micro_batch: int, attention: str, recompute: str) -> dict:
    cfg = mod.config()
    cfg._attn_implementation = attention
    with torch.device("cuda"):
        model = _build(mod, cfg)
    if recompute == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    vocab = cfg.vocab_size
    ids = torch.randint(0, vocab, (micro_batch, mod.SEQ_LEN), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(STEPS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    peak = torch.cuda.max_memory_allocated()
    try:
        kernels, kernel_s = kernel_stats(step)
    except Exception as e:  # the profiler is a nicety: keep the timing
        print(f"  profiler failed: {e}", flush=True)
        kernels, kernel_s = -1, float("nan")
    return {
        "params": params,
        "step_s": statistics.median(times),
        "step_min_s": min(times),
        "peak_memory_bytes": peak,
        "kernels": kernels,
        "kernel_s": kernel_s,
    }


def _build(mod, cfg):
    """The model of ``mod`` built from ``cfg`` (get_model() builds from mod.config(); this
    builds the same class from the edited configuration)."""
    with torch.device("meta"):
        meta = mod.get_model()
    cls = type(meta)
    del meta
    return cls(cfg)


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    path = os.path.join(out, "train_step.csv")
    cols = [
        "model",
        "seq_len",
        "micro_batch",
        "attention",
        "recompute",
        "precision",
        "optimizer",
        "params",
        "step_s",
        "step_min_s",
        "peak_memory_bytes",
        "kernels",
        "kernel_s",
    ]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for file, batches in MODELS:
            mod = load(file)
            for b in batches:
                for attention, recompute in VARIANTS:
                    t0 = time.perf_counter()
                    row = {
                        "model": mod.NAME,
                        "seq_len": mod.SEQ_LEN,
                        "micro_batch": b,
                        "attention": attention,
                        "recompute": recompute,
                        "precision": "amp-bf16",
                        "optimizer": "adamw-fused",
                    }
                    try:
                        row.update(measure(mod, b, attention, recompute))
                    except torch.OutOfMemoryError:
                        row.update(step_s="oom")
                    except Exception as e:  # one broken configuration must not lose the others
                        row.update(step_s=f"error: {type(e).__name__}: {e}"[:200])
                    gc.collect()
                    torch.cuda.empty_cache()
                    w.writerow([row.get(c, "") for c in cols])
                    f.flush()
                    print(
                        f"{mod.NAME} b={b} {attention} {recompute}: {row.get('step_s')}",
                        f"({time.perf_counter() - t0:.1f} s)",
                        flush=True,
                    )


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "train-step-out")
