"""``phazec MODEL.py --hw HW`` timed by phase: the whole plan sweep (micro-batch 1, 2, 4, 8 x
TP 1, 2, 4, 8) and one fixed placement, each cold (a new model: nothing traced or scheduled
in this process) and warm (the same question asked again in the same process: the schedules
are in memory, everything else is done again); then each as a user runs it, a new ``phazec``
process writing the plan file, from an empty cache and again from the cache it filled (the
answer read from one file: ``phaze/hw_answer.py``), with whether the two plan files are
the same bytes, and a third asking another question (twice the global batch) of that cache:
the sweep's settings are read from it, and a point compiled before (the fixed placement's, the
sweep's best when the same point wins) is placed from its template
(``phaze/plan/plan_template.py``) instead of compiled.  The fixed placement is asked a fourth
time, on twice the devices with twice its data parallelism, and that plan is compared with one
compiled without a cache; its first plan is read back by ``phaze-opt`` and printed again.

    python benchmarks/bench_phazec.py [--model examples/gpt3_175b.py] [--hw a100]
                                      [--devices 1024] [--global-batch 4096]
                                      [--placement expert:8,1,8 --micro-batch 1]

Printed per in-process run (after the model file's first import, timed apart: torch and
transformers, seconds that a process pays once): wall time and its split.  The sweep (``phaze/search/sweep.py``):
``settings`` (the model cut to 3 and 4 blocks traced, imported and sharded per micro-batch),
``points`` (every point's schedules and DP), ``winner`` (the best point traced and compiled
through the pipeline).  One point (``phaze.driver.compile_model``): tracing, import, and the pipeline
(sharding, tiling, latencies, SCIP schedules, recompute, the placement DP).  Then the peak
resident memory (of this process; the ``phazec`` processes' own peaks are printed beside them).
Targets (issue 15, this 2-core machine): the GPT-3 175B sweep on a100 <= 60 s cold; one fixed
placement of a new GPT shape <= 10 s cold, <= 1 s when its shape was traced before; <= 4 GiB.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing


def _run(label: str, model: str, opts) -> None:
    from phaze.plan.plan_output import plan_record
    from phaze.search import sweep

    seconds: dict[str, float] = {}
    start = time.perf_counter()
    module, candidates = sweep.compile_plan(model, opts, lambda msg: None, seconds=seconds)
    wall = time.perf_counter() - start
    plan = plan_record(module)
    what = (
        f"DP {plan['dp']} PP {plan['pp']} TP {plan['tp']} b {plan['micro_batch_size']}: "
        f"{plan['throughput_samples_per_s']:.6g} samples/s"
        if plan.get("feasible") == "yes"
        else "no feasible plan"
    )
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items())
    print(f"{label:<24} {wall:7.1f} s  ({parts}; {len(candidates)} points)  {what}")


def _process(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and peak resident GiB of a ``phazec`` process (it must succeed)."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    with tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stderr=err)
        _, status, rusage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(cmd)} failed:\n{err.read()}")
    return wall, rusage.ru_maxrss / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(REPO / "examples" / "gpt3_175b.py"))
    p.add_argument("--hw", default="a100")
    p.add_argument("--devices", type=int, default=1024)
    p.add_argument("--global-batch", type=int, default=4096)
    p.add_argument("--placement", default="expert:8,1,8", help="the fixed placement timed (PP,DP,TP)")
    p.add_argument("--micro-batch", type=int, default=1, help="micro-batch of the fixed placement")
    p.add_argument("--devices-fixed", type=int, default=64, help="devices of the fixed placement")
    p.add_argument("--global-batch-fixed", type=int, default=64, help="global batch of the fixed placement")
    args = p.parse_args()

    print(f"model: {Path(args.model).name}  hw: {args.hw}")
    # The processes first, while this one is small: a child's peak counts the pages it shares
    # with its parent until it runs Python afresh.
    point = ["--devices", str(args.devices_fixed), "--placement", args.placement]
    point += ["--micro-batch", str(args.micro_batch)]
    pp, dp, tp = (int(x) for x in args.placement.split(":")[1].split(","))
    wider = ["--devices", str(2 * args.devices_fixed), "--placement", f"expert:{pp},{2 * dp},{tp}"]
    wider += ["--micro-batch", str(args.micro_batch), "--global-batch", str(2 * args.global_batch_fixed)]
    with tempfile.TemporaryDirectory() as tmp:
        for label, flags, batch in (
            ("fixed placement", point, args.global_batch_fixed),
            ("sweep", ["--devices", str(args.devices)], args.global_batch),
        ):
            cache = Path(tmp, label.replace(" ", "-"))
            plans: list[Path] = []
            # The third run asks another question (twice the batch) from the cache the first filled.
            for run, b in (("empty cache", batch), ("warm cache", batch), ("warm cache, 2x the batch", 2 * batch)):
                plans.append(Path(tmp, f"{cache.name}-{len(plans)}.mlir"))
                cmd = [sys.executable, "-m", "phaze.tools.phazec", args.model, "--hw", args.hw, *flags]
                cmd += ["--global-batch", str(b), "--cache", str(cache), "-o", str(plans[-1]), "-q"]
                wall, peak = _process(cmd)
                same = "" if len(plans) != 2 else f", the same bytes: {plans[0].read_bytes() == plans[1].read_bytes()}"
                print(f"phazec process, {label}, {run}: {wall:7.1f} s (peak {peak:.2f} GiB{same})")
            if label == "fixed placement":
                placed, compiled = Path(tmp, "wider-placed.mlir"), Path(tmp, "wider-compiled.mlir")
                base = [sys.executable, "-m", "phaze.tools.phazec", args.model, "--hw", args.hw, *wider, "-q"]
                wall, peak = _process([*base, "--cache", str(cache), "-o", str(placed)])
                _process([*base, "--no-cache", "-o", str(compiled)])
                same = placed.read_bytes() == compiled.read_bytes()
                print(
                    f"phazec process, {label}, warm cache, expert:{pp},{2 * dp},{tp} on 2x the devices: "
                    f"{wall:7.1f} s (peak {peak:.2f} GiB, the bytes compiled without a cache: {same})"
                )
                # The plan read back and printed again: what a user's own passes start from.
                back = Path(tmp, "read-back.mlir")
                wall, peak = _process([sys.executable, "-m", "phaze.tools.phaze_opt", str(plans[0]), "-o", str(back)])
                same = back.read_bytes() == plans[0].read_bytes()
                size = plans[0].stat().st_size / 1e6
                print(
                    f"phaze-opt process, the {label}'s {size:.1f} MB plan: {wall:7.1f} s "
                    f"(peak {peak:.2f} GiB, the same bytes: {same})"
                )
    from passes.algorithms.schedule import ScheduleCache
    from phaze.options import Options

    cache = ScheduleCache(None)  # in memory, shared by the runs: a warm run reuses the schedules
    sweep = Options(hw=args.hw, devices=args.devices, global_batch=args.global_batch, schedule_cache=cache)
    fixed = Options(
        schedule_cache=cache,
        hw=args.hw,
        devices=args.devices_fixed,
        global_batch=args.global_batch_fixed,
        placement=args.placement,
        micro_batches=(args.micro_batch,),
    )
    # The libraries the model file imports (torch, transformers) are imported first and timed
    # apart: a process pays them once (a phazec process above, each time), then every model.
    from phaze_ir.frontend import load_model_file

    start = time.perf_counter()
    load_model_file(args.model)
    print(f"{'importing the model file':<24} {time.perf_counter() - start:7.1f} s  (torch and its libraries)")
    _run("fixed placement, cold", args.model, fixed)
    _run("fixed placement, warm", args.model, fixed)
    _run("phazec --hw sweep", args.model, sweep)
    _run("phazec --hw sweep, warm", args.model, sweep)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"peak resident memory: {peak:.2f} GiB")


if __name__ == "__main__":
    main()
