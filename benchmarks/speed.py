"""Speed as a user feels it (issue 56, item 5): each question a new ``phazec`` process, first
from an empty cache (a new ``--cache`` folder, ``XDG_CACHE_HOME`` pointed into it, no
``PHAZE_SCHEDULE_CACHE``), then asked again of the cache it filled (warm), with the plan files
of the two runs compared byte for byte.

    python benchmarks/speed.py [--only NAME[,NAME]] [--keep DIR]

Prints one row per question: its cold and warm wall time and CPU seconds (which compare
across loads better than wall time), the target, pass or fail, whether
the warm plan is the cold one's bytes, and the load average of the machine when the cold run
began (the 2-core development machine is shared: figures compare only at like loads).  An
``--export`` question's target is relative: at most 20 % over the same question without it
(measured in the same invocation when both are asked; ``--only`` one of them prints the
ratio as n/a).  The warm target (1 s) holds for every question.  Exit status 1 when a run
fails (its stderr's last lines printed), else 0: the timings are reported, not asserted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: A warm rerun's target (seconds): the answer read back from the cache.
WARM_TARGET_S = 1.0
#: How much an ``--export`` may add to the same question without it (relative).
EXPORT_EXTRA = 0.20


@dataclass(frozen=True)
class Question:
    name: str
    args: tuple[str, ...]  # phazec's arguments, the output flags added per run
    target_s: float | None  # cold target; None: relative to ``base``
    base: str = ""  # the question without the --export (its cold time the reference)
    exports: tuple[str, ...] = ()  # the export targets, each written to a file of the run


LLAMA_128K = (
    "examples/llama3_8b.py",
    "--hw",
    "h100",
    "--devices",
    "64",
    "--global-batch",
    "64",
    "--seq-len",
    "131072",
    "--context-parallel",
    "auto",
    "--zero",
    "auto",
)

#: The questions of issue 56's check, as a user spells them.
QUESTIONS = (
    # GPT-3 175B, every dimension left to phaze, on 1024 A100s (Megatron-LM's batch of 1536).
    Question(
        "gpt3-auto",
        (
            "examples/gpt3_175b.py",
            "--hw",
            "a100",
            "--devices",
            "1024",
            "--global-batch",
            "1536",
            "--zero",
            "auto",
            "--recompute",
            "auto",
            "--sequence-parallel",
            "auto",
            "--pipeline-schedule",
            "auto",
            "--rank-order",
            "auto",
            "--tp-overlap",
            "auto",
            "--context-parallel",
            "auto",
        ),
        10.0,
    ),
    Question("llama3-8b-128k", LLAMA_128K, 30.0),
    Question("llama3-8b-128k-export", LLAMA_128K, None, "llama3-8b-128k", ("megatron", "torchtitan")),
    # A Hugging Face config.json of a 7B model, as the README's Qwen2 example asks it.
    Question(
        "mistral-7b-hf",
        ("examples/hf/mistral-7b/config.json", "--hw", "h100", "--devices", "64", "--global-batch", "512"),
        20.0,
    ),
    # The README's search (its set-up command: no --hw).
    Question("readme-search", ("examples/gpt2_xl.py",), 25.0),
)


def run_once(q: Question, cache: Path, out: Path) -> tuple[float, str, int]:
    """(wall seconds, stderr, exit status) of one ``phazec`` process asking ``q`` of ``cache``,
    its plan written to ``out/plan.mlir`` (and each export beside it)."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "phaze.tools.phazec", *q.args, "--cache", str(cache), "-o", str(out / "plan.mlir")]
    for e in q.exports:
        cmd += ["--export", e, str(out / f"{e}.args")]
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", XDG_CACHE_HOME=str(cache / "xdg"))
    env.pop("PHAZE_SCHEDULE_CACHE", None)
    start, cpu = time.perf_counter(), _children_cpu()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - start
    CPU_S[q.name, out.name] = _children_cpu() - cpu
    (out / "stderr.txt").write_text(done.stderr)  # what phazec said, kept beside its plan
    return took, done.stderr, done.returncode


#: CPU seconds (user + system, the process and its children) of each run: (question, cold|warm).
CPU_S: dict[tuple[str, str], float] = {}


def _children_cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def command_line(q: Question) -> str:
    """The question as a user types it."""
    exports = "".join(f" --export {e} {e}.args" for e in q.exports)
    return "phazec " + " ".join(q.args) + exports + " -o plan.mlir"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", help="comma-separated question names: " + ", ".join(q.name for q in QUESTIONS))
    p.add_argument("--keep", metavar="DIR", help="keep each run's cache and plans under DIR")
    p.add_argument("--list", action="store_true", help="print each question's command and exit")
    args = p.parse_args(argv)
    chosen = QUESTIONS
    if args.only:
        names = args.only.split(",")
        unknown = sorted(set(names) - {q.name for q in QUESTIONS})
        if unknown:
            p.error(f"--only: no question named {', '.join(unknown)}")
        chosen = tuple(q for q in QUESTIONS if q.name in names)
    if args.list:
        for q in chosen:
            print(f"{q.name}: {command_line(q)}")
        return 0
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="phaze-speed-"))
    cold: dict[str, float] = {}
    rows = []
    failed = False
    for q in chosen:
        work = root / q.name  # cache/, cold/ and warm/ (each run's plan, exports and stderr.txt)
        cache = work / "cache"
        load = os.getloadavg()[0]
        print(f"{q.name}: {command_line(q)}", file=sys.stderr, flush=True)
        c_s, err, rc = run_once(q, cache, work / "cold")
        w_s, err_w, rc_w = run_once(q, cache, work / "warm") if rc == 0 else (float("nan"), "", rc)
        if rc or rc_w:
            failed = True
            print(f"{q.name}: exit {rc or rc_w}:\n" + "\n".join((err or err_w).splitlines()[-15:]), file=sys.stderr)
        cold[q.name] = c_s
        same = (
            rc == 0
            and rc_w == 0
            and all(
                (work / "cold" / f).read_bytes() == (work / "warm" / f).read_bytes()
                for f in ["plan.mlir", *(f"{e}.args" for e in q.exports)]
            )
        )
        if q.target_s is not None:
            target, ok = f"<= {q.target_s:g} s", c_s <= q.target_s
        elif q.base in cold:
            extra = c_s / cold[q.base] - 1.0
            target, ok = f"<= +{EXPORT_EXTRA:.0%} ({extra:+.0%})", extra <= EXPORT_EXTRA
        else:
            target, ok = f"<= +{EXPORT_EXTRA:.0%} (n/a)", False
        rows.append((q.name, c_s, w_s, target, ok and rc == 0, w_s <= WARM_TARGET_S, same, load))
        print(f"{q.name}: cold {c_s:.1f} s, warm {w_s:.2f} s (load {load:.2f})", file=sys.stderr, flush=True)
    print(
        f"{'question':<24} {'cold s':>7} {'cpu s':>7} {'warm s':>7} {'cpu s':>6}  {'target (cold)':<20} "
        f"{'cold':<5} {'warm':<5} same  load"
    )
    for name, c_s, w_s, target, ok, warm_ok, same, load in rows:
        cpu_c, cpu_w = CPU_S.get((name, "cold"), float("nan")), CPU_S.get((name, "warm"), float("nan"))
        print(
            f"{name:<24} {c_s:7.1f} {cpu_c:7.1f} {w_s:7.2f} {cpu_w:6.2f}  {target:<20} {'pass' if ok else 'FAIL':<5} "
            f"{'pass' if warm_ok else 'FAIL':<5} {'yes' if same else 'NO':<4}  {load:.2f}"
        )
    print(
        f"(wall and CPU seconds (user + system); warm target <= {WARM_TARGET_S:g} s; load: 1-minute load average "
        f"when the cold run began; {root})"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
