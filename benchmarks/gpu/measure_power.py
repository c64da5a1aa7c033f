"""Measure the energy one GPU spends on the kernels and training steps phaze prices: the data of
the ``[energy]`` table of phaze's ``h100`` description (``benchmarks/gpu/fit_h100_energy.py``
fits it; data/h100/README.md says how the figures were taken).

    python benchmarks/gpu/measure_power.py OUT_DIR

Plain PyTorch and the NVIDIA driver's NVML library through ctypes (the GPU machine has torch, not
phaze's other packages, nor pynvml).  Each workload runs *sustained*: its kernels captured into a
CUDA graph, the graph replayed back to back for ``WARMUP_S`` (power and temperature settle), then
for ``WINDOW_S`` between two synchronizations, reading NVML's energy counter (millijoules since
the driver loaded) at both ends.  Its average power is the energy over the window's wall time;
the work done in the window (calls x FLOP or bytes per call) gives the energy per call.  A
sampler thread reads the power, SM clock, temperature and clock-event reasons every
``SAMPLE_S`` so that a window run at the power limit, or at a lowered clock, is seen as such.

Workloads: the GPU idle with a CUDA context, bf16 GEMMs (operands cycling through 2x the L2 so
that each call reads them from HBM, as measure_kernels.py times them), memory-bound kernels from HBM and
from L2-resident buffers, and whole training steps of small GPT and Llama models (as
train_step.py runs them: AMP bf16, fused AdamW, eager attention, no recompute).  Writes
``power.csv`` and ``power_environment.json`` into OUT_DIR.
"""

from __future__ import annotations

import csv
import ctypes
import gc
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# measure_kernels.py's graphs and L2 copies, from this script's own folder (first on sys.path when it runs;
# tests/test_gpu_benchmarks.py checks that no module here is named like an installed package)
from measure_kernels import capture, copies_for, l2_bytes  # noqa: E402

WARMUP_S = 1.5  #: sustained run before the window (power and clocks settle)
WINDOW_S = 4.0  #: the measured window (NVML's energy counter moves every few ms)
SAMPLE_S = 0.02  #: sampler period
BATCH_S = 0.05  #: graph replays launched between synchronizations
DTYPE = torch.bfloat16

#: bf16 GEMMs (m, n, k): square ones over sizes, and layer shapes of the models phaze prices
#: (8,192 tokens: GPT-3 175B's QKV at TP 8, Llama-2 7B's gated MLP in, a small-k and a
#: weight-gradient shape)
GEMMS = [
    (2048, 2048, 2048),
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (16384, 16384, 16384),
    (8192, 4608, 12288),
    (8192, 22016, 4096),
    (8192, 8192, 1024),
    (4096, 4096, 16384),
]
#: memory-bound kernels: (op, elements, where): "hbm" operands cycle through 2x the L2 (each call
#: from HBM), "l2" one small set of operands reused (each call from the L2 cache)
MEMORY = [
    ("copy", 2**28, "hbm"),
    ("add", 2**28, "hbm"),
    ("gelu", 2**28, "hbm"),
    ("layer_norm", 2**28, "hbm"),
    ("softmax", 2**28, "hbm"),
    ("copy", 2**24, "hbm"),
    ("copy", 2**21, "l2"),
    ("add", 2**21, "l2"),
]
#: bytes each memory op moves per element (bf16 in and out)
BYTES_PER_ELEMENT = {"copy": 4, "add": 6, "gelu": 4, "layer_norm": 4, "softmax": 4}
#: training steps: (model file, micro-batch) rows of train_step.csv whose GPU time is the step's
STEPS = [
    (os.path.join(HERE, "models", "gpt2_small.py"), 16),
    (os.path.join(HERE, "models", "gpt2_medium.py"), 8),
    (os.path.join(ROOT, "examples", "gpt2_xl.py"), 2),
    (os.path.join(HERE, "models", "llama_1b.py"), 4),
    (os.path.join(HERE, "models", "llama2_7b_4l.py"), 2),
]
COLUMNS = [
    "workload",
    "kind",
    "m",
    "n",
    "k",
    "elements",
    "micro_batch",
    "seq_len",
    "calls",
    "window_s",
    "time_per_call_s",
    "flop_per_call",
    "bytes_per_call",
    "energy_j",
    "power_w",
    "energy_per_call_j",
    "power_median_sample_w",
    "power_max_sample_w",
    "sm_clock_median_hz",
    "mem_clock_median_hz",
    "temperature_max_c",
    "clock_event_reasons",
]


class NVML:
    """The few NVML calls this needs, through ctypes (libnvidia-ml ships with the driver)."""

    def __init__(self, index: int = 0):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        self._check(self.lib.nvmlInit_v2(), "nvmlInit_v2")
        self.handle = ctypes.c_void_p()
        self._check(self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.handle)), "handle")

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"NVML {what} failed with code {rc}")

    def _uint(self, fn, *args, wide: bool = False) -> int:
        out = ctypes.c_ulonglong() if wide else ctypes.c_uint()
        self._check(getattr(self.lib, fn)(self.handle, *args, ctypes.byref(out)), fn)
        return int(out.value)

    def energy_j(self) -> float:
        """Millijoules since the driver loaded, in joules; NaN where the GPU has no counter
        (the window's energy is then its sampled power times its time)."""
        try:
            return self._uint("nvmlDeviceGetTotalEnergyConsumption", wide=True) / 1e3
        except RuntimeError:
            return math.nan

    def power_w(self) -> float:
        return self._uint("nvmlDeviceGetPowerUsage") / 1e3

    def sm_clock_hz(self) -> float:
        return self._uint("nvmlDeviceGetClockInfo", 1) * 1e6  # NVML_CLOCK_SM

    def mem_clock_hz(self) -> float:
        return self._uint("nvmlDeviceGetClockInfo", 2) * 1e6  # NVML_CLOCK_MEM

    def temperature_c(self) -> int:
        return self._uint("nvmlDeviceGetTemperature", 0)  # NVML_TEMPERATURE_GPU

    def power_limit_w(self) -> float:
        return self._uint("nvmlDeviceGetEnforcedPowerLimit") / 1e3

    def clock_event_reasons(self) -> int:
        return self._uint("nvmlDeviceGetCurrentClocksThrottleReasons", wide=True)


class Sampler:
    """Reads power, clocks, temperature and clock-event reasons every SAMPLE_S while on."""

    def __init__(self, nvml: NVML):
        self.nvml, self.rows, self.on = nvml, [], False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            if self.on:
                n = self.nvml
                try:
                    reasons = n.clock_event_reasons()
                except RuntimeError:
                    reasons = 0
                self.rows.append((n.power_w(), n.sm_clock_hz(), n.mem_clock_hz(), n.temperature_c(), reasons))
            time.sleep(SAMPLE_S)

    def start(self) -> None:
        self.rows, self.on = [], True

    def end(self) -> dict:
        self.on = False
        rows = self.rows or [(math.nan,) * 4 + (0,)]
        reasons = 0
        for r in rows:
            reasons |= r[4]
        return {
            "power_median_sample_w": statistics.median(r[0] for r in rows),
            "power_max_sample_w": max(r[0] for r in rows),
            "sm_clock_median_hz": statistics.median(r[1] for r in rows),
            "mem_clock_median_hz": statistics.median(r[2] for r in rows),
            "temperature_max_c": max(r[3] for r in rows),
            "clock_event_reasons": hex(reasons),
        }


def sustained(run_once, nvml: NVML, sampler: Sampler) -> dict:
    """Run ``run_once`` (launches some GPU work, returns the calls it launched) back to back for
    WARMUP_S, then for WINDOW_S between synchronizations; the energy and calls of the window."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < WARMUP_S:
        run_once()
        torch.cuda.synchronize()
    sampler.start()
    calls = 0
    e0, t0 = nvml.energy_j(), time.perf_counter()
    while time.perf_counter() - t0 < WINDOW_S:
        calls += run_once()
        torch.cuda.synchronize()
    t1, e1 = time.perf_counter(), nvml.energy_j()
    row = sampler.end()
    window = t1 - t0
    energy = e1 - e0
    if math.isnan(energy):
        energy = statistics.fmean(r[0] for r in sampler.rows) * window
    row.update(
        calls=calls,
        window_s=window,
        time_per_call_s=window / calls,
        energy_j=energy,
        power_w=energy / window,
        energy_per_call_j=energy / calls,
    )
    return row


def graph_runner(calls: list) -> callable:
    """A function replaying a CUDA graph of ``calls`` enough times for about BATCH_S."""
    g = capture(calls)
    t0 = time.perf_counter()
    g.replay()
    torch.cuda.synchronize()
    per_replay = time.perf_counter() - t0
    replays = max(1, round(BATCH_S / max(per_replay, 1e-6)))

    def run_once() -> int:
        for _ in range(replays):
            g.replay()
        return replays * len(calls)

    return run_once


def gemm_calls(m: int, n: int, k: int) -> list:
    per_set = 2 * (m * k + k * n + m * n)
    sets = copies_for(per_set)
    ops = [
        (
            torch.randn(m, k, device="cuda", dtype=DTYPE),
            torch.randn(k, n, device="cuda", dtype=DTYPE),
            torch.empty(m, n, device="cuda", dtype=DTYPE),
        )
        for _ in range(sets)
    ]
    return [lambda a=a, b=b, c=c: torch.mm(a, b, out=c) for a, b, c in (ops * 20)[:20]]


def memory_calls(op: str, elements: int, where: str) -> list:
    per_set = BYTES_PER_ELEMENT[op] * elements
    sets = 1 if where == "l2" else copies_for(per_set)
    calls = []
    for _ in range(sets):
        x = torch.randn(elements, device="cuda", dtype=DTYPE)
        y = torch.randn(elements, device="cuda", dtype=DTYPE)
        o = torch.empty(elements, device="cuda", dtype=DTYPE)
        if op == "copy":
            calls.append(lambda x=x, o=o: o.copy_(x))
        elif op == "add":
            calls.append(lambda x=x, y=y, o=o: torch.add(x, y, out=o))
        elif op == "gelu":
            calls.append(lambda x=x, o=o: torch.ops.aten.gelu.out(x, out=o))
        elif op == "layer_norm":  # over rows of 1024, no affine (as measure_kernels.py)
            calls.append(lambda x=x: torch.nn.functional.layer_norm(x.view(-1, 1024), (1024,)))
        else:  # softmax over rows of 1024
            calls.append(lambda x=x: torch.softmax(x.view(-1, 1024), -1))
    return (calls * 100)[: (100 if where == "l2" else 20)]


def step_runner(path: str, micro_batch: int):
    """The training step of train_step.py for ``path`` at ``micro_batch`` (eager attention, no
    recompute) and its model's name and sequence length."""
    from train_step import _build, load

    mod = load(path)
    cfg = mod.config()
    cfg._attn_implementation = "eager"
    with torch.device("cuda"):
        model = _build(mod, cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    ids = torch.randint(0, cfg.vocab_size, (micro_batch, mod.SEQ_LEN), device="cuda")

    def run_once() -> int:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return 1

    return mod.NAME, mod.SEQ_LEN, run_once, (model, opt)


def environment(nvml: NVML) -> dict:
    p = torch.cuda.get_device_properties(0)
    try:
        smi = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.memory,power.limit,"
                "power.default_limit,power.max_limit,temperature.gpu",
                "--format=csv",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except Exception as e:  # informative only
        smi = f"nvidia-smi failed: {e}"
    return {
        "gpu": p.name,
        "sms": p.multi_processor_count,
        "memory_bytes": p.total_memory,
        "l2_bytes": l2_bytes(),
        "power_limit_w": nvml.power_limit_w(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "nvidia_smi": smi,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "warmup_s": WARMUP_S,
        "window_s": WINDOW_S,
        "sample_s": SAMPLE_S,
    }


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    nvml = NVML()
    torch.zeros(1, device="cuda")  # the CUDA context
    print(f"{torch.cuda.get_device_name(0)}: energy counter {nvml.energy_j()} J", flush=True)
    with open(os.path.join(out, "power_environment.json"), "w") as f:
        json.dump(environment(nvml), f, indent=1)
    sampler = Sampler(nvml)
    work = [("idle", None)]
    work += [(f"gemm_{m}x{n}x{k}", ("gemm", m, n, k)) for m, n, k in GEMMS]
    work += [(f"{op}_{where}_{e}", ("memory", op, e, where)) for op, e, where in MEMORY]
    work += [(f"step_{os.path.basename(p)[:-3]}_b{b}", ("step", p, b)) for p, b in STEPS]
    with open(os.path.join(out, "power.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for name, spec in work:
            t0 = time.perf_counter()
            row = {"workload": name}
            keep = None
            try:
                if spec is None:
                    row["kind"] = "idle"
                    row.update(sustained(lambda: time.sleep(0.05) or 1, nvml, sampler))
                elif spec[0] == "gemm":
                    _, m, n, k = spec
                    row.update(kind="gemm", m=m, n=n, k=k, flop_per_call=2 * m * n * k)
                    row["bytes_per_call"] = 2 * (m * k + k * n + m * n)
                    keep = gemm_calls(m, n, k)
                    row.update(sustained(graph_runner(keep), nvml, sampler))
                elif spec[0] == "memory":
                    _, op, e, where = spec
                    row.update(kind=f"memory_{where}", elements=e)
                    row["bytes_per_call"] = BYTES_PER_ELEMENT[op] * e
                    keep = memory_calls(op, e, where)
                    row.update(sustained(graph_runner(keep), nvml, sampler))
                else:
                    _, path, b = spec
                    model_name, seq, run_once, keep = step_runner(path, b)
                    row.update(kind="train_step", micro_batch=b, seq_len=seq)
                    row["workload"] = f"step_{model_name}_b{b}"
                    row.update(sustained(run_once, nvml, sampler))
            except Exception as e:  # one broken workload must not lose the others
                row["kind"] = f"error: {type(e).__name__}: {e}"[:200]
            del keep
            gc.collect()
            torch.cuda.empty_cache()
            w.writerow([row.get(c, "") for c in COLUMNS])
            f.flush()
            print(
                f"{row['workload']}: {row.get('power_w', math.nan):.1f} W,",
                f"{row.get('energy_per_call_j', math.nan):.4g} J/call,",
                f"{row.get('time_per_call_s', math.nan):.4g} s/call,",
                f"SM {row.get('sm_clock_median_hz', math.nan) / 1e6:.0f} MHz,",
                f"reasons {row.get('clock_event_reasons', '')} ({time.perf_counter() - t0:.1f} s)",
                row["kind"] if row["kind"].startswith("error") else "",
                flush=True,
            )
    sampler.stop.set()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "power-out")
