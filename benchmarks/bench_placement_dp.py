"""Speed of the exact placement DP (rust/phaze-dp) through the Python binding.

A GPT-3 175B-like problem: prologue, N identical blocks, head; s = 2048, h = 12288, b = 1,
t = 8, fp16 with mixed-precision Adam on a 150 TFLOP/s-effective, 80 GB device whose optimizer
step streams 28 bytes per parameter at 2 TB/s; nodes of 8 at 300 GB/s and 5 us, the scale-out
network at 25 GB/s and 10 us; B = 4096; all d and p searched.

    python benchmarks/bench_placement_dp.py

Prints the time of one solve (median of repeats, conversion included) as the cluster grows
to 16,384 devices and the model to 200 layers, in the paper's placement space (plain DP, plain
1F1B) and in the full one (the ZeRO stage and the interleaving searched too, ``auto``), with
the ratio of the two; the batch entry point's throughput, and a check that the GIL is released
while solving.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from pathlib import Path

try:
    from passes.algorithms import _phaze_rs as rs
except ImportError:  # not installed: use the checkout (the .so built in place by maturin develop)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from passes.algorithms import _phaze_rs as rs

TARGET_MS = 20.0  # one solve, 98 layers, N = 1024, t = 8


def gpt3_problem(blocks: int = 96, devices: int = 1024, full_space: bool = False) -> dict:
    """``full_space``: the DP also chooses the ZeRO stage and 1F1B or an interleaving."""
    s, h, v, t = 2048.0, 12288.0, 50257.0, 8
    flops = 150e12
    # Adam's step, memory bound: fp16 gradient in, fp32 master and two moments in and out,
    # fp16 weight out: 2 + 3·4·2 + 2 = 28 bytes per parameter at 2 TB/s.
    opt_s_per_param = 28 / 2e12
    block_fwd = 24 * s * h * h * (1 + s / (6 * h)) / t / flops
    block_params = 12 * h * h / t
    act = int(s * h * 2)  # one fp16 activation of a block's input
    block = {
        "fwd_s": block_fwd,
        "bwd_s": 2 * block_fwd,
        "recompute_s": [0.0, 0.05 * block_fwd, block_fwd],
        # Megatron's stash per layer: s·b·h·(34 + 5·a·s/h)/t bytes with no recompute, 34/t with
        # selective, the input only with full.
        "saved_bytes": [int(s * h * 114 / t), int(s * h * 34 / t), act],
        "param_bytes": int(2 * block_params),
        "grad_bytes": int(2 * block_params),
        "optimizer_bytes": int(12 * block_params),  # fp32 master + two Adam moments
        "workspace_bytes": 4 * act,
        "boundary_bytes": act,
        "opt_s": block_params * opt_s_per_param,
    }
    emb_params = v * h / t
    prologue = {
        "fwd_s": 1e-4,
        "bwd_s": 2e-4,
        "recompute_s": [0.0, 0.0, 1e-4],
        "saved_bytes": [act] * 3,
        "param_bytes": int(2 * emb_params),
        "grad_bytes": int(2 * emb_params),
        "optimizer_bytes": int(12 * emb_params),
        "workspace_bytes": act,
        "boundary_bytes": act,
        "opt_s": emb_params * opt_s_per_param,
    }
    head_fwd = 2 * s * h * v / t / flops
    logits = int(s * v / t * 4)
    head = {
        "fwd_s": head_fwd,
        "bwd_s": 2 * head_fwd,
        "recompute_s": [0.0, 0.0, head_fwd],
        "saved_bytes": [logits, logits, act],
        "param_bytes": int(2 * emb_params),
        "grad_bytes": int(2 * emb_params),
        "optimizer_bytes": int(12 * emb_params),
        "workspace_bytes": logits,
        "boundary_bytes": 0,
        "opt_s": emb_params * opt_s_per_param,
    }
    return {
        "layers": [prologue] + [dict(block) for _ in range(blocks)] + [head],
        "devices": devices,
        "hbm_bytes": 80 * 10**9,
        "levels": [
            {"group_size": 8, "bandwidth_Bps": 300e9, "latency_s": 5e-6},
            {"group_size": devices, "bandwidth_Bps": 25e9, "latency_s": 10e-6},
        ],
        "global_batch": 4096,
        "micro_batch": 1,
        "tp": 8,
        "dp_overlap": True,
        "max_stages": None,
        "zero": "auto" if full_space else "0",
        "virtual_stages": None if full_space else 1,
        "blocks": [1, blocks],
    }


def time_solve(problem: dict, repeats: int = 7) -> tuple[float, dict]:
    rs.solve_placement(problem)  # warm-up
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = rs.solve_placement(problem)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3, result


def main() -> None:
    print(
        f"{'layers':>6} {'N':>6} {'space':>5} {'solve ms':>9} {'d':>4} {'p':>4} {'v':>3} {'ZeRO':>4} {'dev':>6} "
        f"{'s/batch':>8} {'samples/s':>10}  recompute"
    )
    headline = None
    ratios = []
    for blocks in (96, 198):
        for n in (1024, 2048, 4096, 8192, 16384):
            paper_ms = 0.0
            for full in (False, True):
                ms, res = time_solve(gpt3_problem(blocks, n, full))
                plan = res["plan"]
                pols = sorted({s["recompute"] for s in plan["stages"]})
                print(
                    f"{blocks + 2:>6} {n:>6} {'full' if full else 'paper':>5} {ms:>9.2f} {plan['dp']:>4} "
                    f"{plan['pp']:>4} {plan['virtual_stages']:>3} {plan['zero']:>4} {plan['devices_used']:>6} "
                    f"{plan['time_per_batch_s']:>8.2f} {plan['throughput_samples_per_s']:>10.1f}  {','.join(pols)}"
                )
                if full:
                    ratios.append(ms / paper_ms)
                else:
                    paper_ms = ms
                if (blocks, n, full) == (96, 1024, False):
                    headline = ms
    print(f"full space / paper space solve time: median {statistics.median(ratios):.2f}x, max {max(ratios):.2f}x")

    prob = gpt3_problem(96, 1024)
    batch = [gpt3_problem(96, 1024) for _ in range(32)]
    rs.solve_placement_batch(batch[:4])  # warm-up (starts rayon's thread pool)
    t0 = time.perf_counter()
    rs.solve_placement_batch(batch)
    batch_ms = (time.perf_counter() - t0) * 1e3
    print(f"\nsolve_placement_batch: 32 x (98 layers, N = 1024) in {batch_ms:.1f} ms ({batch_ms / 32:.2f} ms each)")

    ms_eval = min(
        (lambda t0: (rs.evaluate_placement(prob, 32, 4), (time.perf_counter() - t0) * 1e3)[1])(time.perf_counter())
        for _ in range(5)
    )
    ev = rs.evaluate_placement(prob, 32, 4)
    print(
        f"evaluate_placement(pp=32, dp=4) [the paper's expert GPT-3 placement at t=8]: {ms_eval:.2f} ms, "
        f"feasible={ev['feasible']}, {ev['plan']['time_per_batch_s']:.2f} s/batch"
    )

    # GIL: another Python thread keeps running while a large batch solves.
    big = [gpt3_problem(198, 16384) for _ in range(64)]
    done = threading.Event()
    ticks = 0

    def work():
        rs.solve_placement_batch(big)
        done.set()

    th = threading.Thread(target=work)
    t0 = time.perf_counter()
    th.start()
    while not done.is_set():
        ticks += 1
    th.join()
    print(
        f"GIL released: {ticks} Python loop iterations ran during a "
        f"{1e3 * (time.perf_counter() - t0):.0f} ms batch solve"
    )

    verdict = "OK" if headline < TARGET_MS else "SLOWER THAN TARGET"
    print(
        f"\nheadline: 98 layers, N = 1024, t = 8, all d and p: {headline:.2f} ms "
        f"(target < {TARGET_MS:.0f} ms): {verdict}"
    )


if __name__ == "__main__":
    main()
