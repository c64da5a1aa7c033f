"""Measure single-GPU training steps as the runtimes users run them: compiled (``torch.compile``),
with SDPA, in pure bf16 beside AMP, and of model families ``data/h100/train_step.csv`` lacks (an
encoder, OPT, a grouped-query Llama at 8k tokens, a small mixture of experts).  The data that
checks ``phazec --kernels eager|inductor`` (``benchmarks/gpu/price_train_step.py --csv``).

    python benchmarks/gpu/train_step_runtimes.py OUT_DIR [--budget-s 420] [--only N,M,...]
    python benchmarks/gpu/train_step_runtimes.py OUT_DIR --tiny --device cpu   # a smoke test

Every configuration of :data:`CONFIGS`, in that order (most wanted first), as
``benchmarks/gpu/train_step.py`` measures its steps: the model built on the GPU from its model
file's configuration with random fp32 weights, fused AdamW, ``zero_grad(set_to_none=True)``;
``amp-bf16`` runs forward and loss under ``torch.autocast(bfloat16)``, ``bf16`` casts the model
to bf16 first; ``compiled`` wraps the model in ``torch.compile`` (default mode, Inductor).  Per
configuration: the median step of ``STEPS`` after ``WARMUP`` (the compilation happens in the
warm-up and is timed apart as ``warmup_s``), the peak memory allocated in the timed steps, and
from one profiled step the GPU kernels and their summed time.  Each row is written and flushed
as soon as it is measured, with the GPU's name, torch's and transformers' versions, so that a
run cut short keeps what it measured; no configuration is started after ``--budget-s`` seconds
(the device's time is counted).  ``--tiny`` shrinks every model to two layers of width 64 and
the sequence to 128 (the code paths, not the numbers: what a CPU can check before a GPU run).
"""

from __future__ import annotations

import argparse
import csv
import gc
import os
import statistics
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# train_step.py of this script's own folder (first on sys.path when it runs)
from train_step import _build, kernel_stats, load  # noqa: E402

WARMUP = 3
STEPS = 10

MODEL_FILES = {
    "gpt2-small": os.path.join(HERE, "models", "gpt2_small.py"),
    "gpt2-medium": os.path.join(HERE, "models", "gpt2_medium.py"),
    "llama-1b": os.path.join(HERE, "models", "llama_1b.py"),
    "llama2-7b-4l": os.path.join(HERE, "models", "llama2_7b_4l.py"),
    "llama3-1b-8k": os.path.join(HERE, "models", "llama3_1b_8k.py"),
    "moe-small": os.path.join(HERE, "models", "moe_small.py"),
    "bert-large": os.path.join(ROOT, "examples", "bert_large.py"),
    "opt-350m": os.path.join(ROOT, "examples", "opt_350m.py"),
}

#: (model, micro-batch, attention, recompute, precision, compiled), most wanted first: the MoE in
#: AMP (its experts in fp32, one GEMM per expert) and bf16 (one grouped kernel), compiled steps of
#: models data/h100/ measured eager (the same shapes), the new families eager then compiled.
CONFIGS = [
    ("moe-small", 2, "sdpa", "none", "amp-bf16", False),
    ("moe-small", 2, "sdpa", "none", "bf16", False),
    ("gpt2-small", 8, "sdpa", "none", "amp-bf16", True),
    ("llama-1b", 2, "sdpa", "none", "amp-bf16", True),
    ("llama3-1b-8k", 1, "sdpa", "none", "amp-bf16", False),
    ("bert-large", 8, "sdpa", "none", "amp-bf16", False),
    ("opt-350m", 8, "sdpa", "none", "amp-bf16", False),
    ("gpt2-small", 8, "eager", "none", "amp-bf16", True),
    ("llama3-1b-8k", 1, "sdpa", "none", "amp-bf16", True),
    ("bert-large", 8, "sdpa", "none", "amp-bf16", True),
    ("opt-350m", 8, "sdpa", "none", "amp-bf16", True),
    ("moe-small", 2, "sdpa", "none", "amp-bf16", True),
    ("gpt2-medium", 4, "sdpa", "none", "amp-bf16", True),
    ("llama2-7b-4l", 1, "sdpa", "none", "amp-bf16", True),
    ("moe-small", 8, "sdpa", "none", "amp-bf16", False),
    ("llama3-1b-8k", 2, "sdpa", "full", "amp-bf16", False),
]

COLUMNS = [
    "model",
    "seq_len",
    "micro_batch",
    "attention",
    "recompute",
    "precision",
    "compiled",
    "optimizer",
    "params",
    "step_s",
    "step_min_s",
    "warmup_s",
    "peak_memory_bytes",
    "kernels",
    "kernel_s",
    "gpu",
    "torch",
    "transformers",
]


def tiny(cfg):
    """``cfg`` with two layers of width 64 (4 heads, 2 key/value heads where it has them)."""
    for name, value in (
        ("num_hidden_layers", 2),
        ("n_layer", 2),
        ("hidden_size", 64),
        ("n_embd", 64),
        ("word_embed_proj_dim", 64),
        ("intermediate_size", 128),
        ("ffn_dim", 128),
        ("num_attention_heads", 4),
        ("n_head", 4),
        ("num_key_value_heads", 2),
        ("vocab_size", 512),
    ):
        if hasattr(cfg, name):
            setattr(cfg, name, value)
    if hasattr(cfg, "head_dim"):
        cfg.head_dim = 16
    return cfg


def measure(mod, micro_batch: int, attention: str, recompute: str, precision: str, compiled: bool, args) -> dict:
    device = args.device
    seq = 128 if args.tiny else mod.SEQ_LEN
    cfg = mod.config()
    if args.tiny:
        cfg = tiny(cfg)
    cfg._attn_implementation = attention
    with torch.device(device):
        model = _build(mod, cfg)
    if precision == "bf16":
        model = model.to(torch.bfloat16)
    if recompute == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    ids = torch.randint(0, cfg.vocab_size, (micro_batch, seq), device=device)
    run = torch.compile(model) if compiled else model
    amp = torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "amp-bf16")

    def step():
        with amp:
            loss = run(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    t0 = time.perf_counter()
    for _ in range(WARMUP):
        step()
    sync()
    warmup = time.perf_counter() - t0
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(STEPS if not args.tiny else 2):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            s = time.perf_counter()
            step()
            times.append(time.perf_counter() - s)
    row = {
        "params": params,
        "step_s": statistics.median(times),
        "step_min_s": min(times),
        "warmup_s": warmup,
        "peak_memory_bytes": torch.cuda.max_memory_allocated() if device == "cuda" else "",
        "kernels": -1,
        "kernel_s": "",
    }
    if device == "cuda":
        try:
            row["kernels"], row["kernel_s"] = kernel_stats(step)
        except Exception as e:  # the profiler is a nicety: keep the timing
            print(f"  profiler failed: {e}", flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default="train-step-runtimes-out")
    p.add_argument("--budget-s", type=float, default=420.0, help="start no configuration after this many seconds")
    p.add_argument("--only", default=None, help="only these configurations (indices into CONFIGS, e.g. 0,2,5)")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--tiny", action="store_true", help="two layers of width 64, sequence 128 (a smoke test)")
    args = p.parse_args()
    chosen = list(range(len(CONFIGS)))
    if args.only:
        chosen = [int(x) for x in args.only.split(",")]
        if bad := [i for i in chosen if not 0 <= i < len(CONFIGS)]:
            p.error(f"--only: {bad[0]} is not a configuration (0..{len(CONFIGS) - 1})")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA device (--device cpu --tiny runs the code paths on the CPU)")
    import transformers

    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    path = os.path.join(args.out, "train_step_runtimes.csv")
    start = time.perf_counter()
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        f.flush()
        for i in chosen:
            if time.perf_counter() - start > args.budget_s:
                print(f"budget of {args.budget_s:.0f} s spent: configurations from {i} on not run", flush=True)
                break
            name, b, attention, recompute, precision, compiled = CONFIGS[i]
            mod = load(MODEL_FILES[name])
            t0 = time.perf_counter()
            row: dict = {
                "model": mod.NAME,
                "seq_len": 128 if args.tiny else mod.SEQ_LEN,
                "micro_batch": b,
                "attention": attention,
                "recompute": recompute,
                "precision": precision,
                "compiled": "inductor" if compiled else "none",
                "optimizer": "adamw-fused" if args.device == "cuda" else "adamw",
                "gpu": gpu,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
            }
            try:
                row.update(measure(mod, b, attention, recompute, precision, compiled, args))
            except torch.OutOfMemoryError:
                row.update(step_s="oom")
            except Exception as e:  # one broken configuration must not lose the others
                row.update(step_s=f"error: {type(e).__name__}: {e}"[:200])
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
            torch._dynamo.reset()
            w.writerow([row.get(c, "") for c in COLUMNS])
            f.flush()
            print(
                f"[{i}] {mod.NAME} b={b} {attention} {recompute} {precision} "
                f"{'compiled' if compiled else 'eager'}: {row.get('step_s')} ({time.perf_counter() - t0:.1f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
