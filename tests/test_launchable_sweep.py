"""``phazec --hw ... --export``'s plan searched in one sweep (``phaze.search.sweep.compile_launchable``):
when the fastest plan's placement is one a target refuses (here torchtitan and ZeRO-1), the
same settings are priced again under each narrowing of ``phaze.plan.export.launchable`` and
only the best launchable point is compiled, the same plan as the two-step search it replaces
(the unnarrowed question, then each narrowing as a question of its own, the fastest kept);
the answer is kept under its exports, says the faster plan that is not launched again from
the cache, and a fastest plan that launches is the unnarrowed question's own."""

from __future__ import annotations

from conftest import MODELS

from phaze import hw_answer
from phaze.options import Options, narrowed
from phaze.plan.export import launchable
from phaze.plan.plan_output import plan_record
from phaze.search import sweep
from phaze_ir.ir import print_module

GPT2 = str(MODELS / "tiny_gpt2.py")
TITAN = [("torchtitan", "plan.titan")]


def _opts(**kw) -> Options:
    # On 8 A100s the fastest plan of the tiny GPT-2 is ZeRO-1 (micro-batch 2, TP 1); recompute
    # fixed, so the narrowings are ZeRO 0 and ZeRO 3 (two searches, not six).
    base = {"hw": "a100", "devices": 8, "global_batch": 16, "micro_batches": (1, 2), "tp_widths": (1, 2)}
    return Options(**base | {"zero": "auto", "recompute": "none"} | kw)


def _points(candidates) -> list[tuple]:
    return [(c.micro_batch, c.tp, c.sequence_parallel, c.throughput, c.note, c.context_parallel) for c in candidates]


def _quiet(_line: str) -> None:
    pass


def _hit(logged: list[str]) -> bool:
    return any("the answer is in the cache" in line for line in logged)


def test_the_sweep_narrows_before_compiling_and_keeps_the_two_step_answer(monkeypatch):
    compiled = []
    compile_point = sweep._compile_point

    def counted(spec, point, opts, *rest):
        compiled.append((point.micro_batch, point.tp, opts.zero))
        return compile_point(spec, point, opts, *rest)

    monkeypatch.setattr(sweep, "_compile_point", counted)
    opts = _opts()
    launch = launchable(TITAN, opts)
    assert launch is not None and launch.choices == ({"zero": "0"}, {"zero": "3"})
    logged: list[str] = []
    module, candidates, narrowing = sweep.compile_launchable(GPT2, opts, launch, logged.append)
    # one winner compiled, under its narrowing: the unnarrowed fastest (ZeRO-1) never was
    assert compiled == [(2, 1, "3")]
    assert narrowing.options == {"zero": "3"} and plan_record(module)["zero"] == 3
    said = (
        "the fastest plan (2317 samples/s at micro-batch 2, TP 1, ZeRO 1) is not launched: --export torchtitan: ZeRO-1"
    )
    assert narrowing.said.startswith(said) and "is 0.8% slower: 2298 samples/s at micro-batch 2, TP 1" in narrowing.said

    # The two-step search: the unnarrowed question's plan is ZeRO-1, which torchtitan refuses;
    # then each narrowing asked as a question of its own, the fastest kept (the first on a tie).
    compiled.clear()
    first, _ = sweep.compile_plan(GPT2, opts, _quiet)
    assert plan_record(first)["zero"] == 1
    answers = [sweep.compile_plan(GPT2, narrowed(opts, choice), _quiet) for choice in launch.choices]
    throughputs = [float(plan_record(m)["throughput_samples_per_s"]) for m, _ in answers]
    fastest = throughputs.index(max(throughputs))
    assert launch.choices[fastest] == narrowing.options
    assert print_module(module) == print_module(answers[fastest][0])
    assert _points(candidates) == _points(answers[fastest][1])


def test_a_fastest_plan_that_launches_is_the_unnarrowed_answer():
    """Megatron-LM runs every ZeRO stage: with ``--recompute auto`` it is narrowed to one policy
    for all stages, and the fastest plan here has one (a single stage), so it is kept as the
    question without the export answers it, each narrowing left unpriced."""
    opts = _opts(recompute="auto")
    launch = launchable([("megatron", "plan.args")], opts)
    assert launch is not None and len(launch.choices) == 3
    logged: list[str] = []
    module, candidates, narrowing = sweep.compile_launchable(GPT2, opts, launch, logged.append)
    assert narrowing == sweep.Narrowing() and not any("not launched" in line for line in logged)
    alone, points = sweep.compile_plan(GPT2, opts, _quiet)
    assert print_module(module) == print_module(alone) and _points(candidates) == _points(points)


def test_the_answer_is_kept_under_its_exports_and_says_the_faster_plan_again(tmp_path):
    cache = str(tmp_path / "cache")
    opts = _opts(micro_batches=(2,), tp_widths=(1, 2))
    launch = launchable(TITAN, opts)
    cold: list[str] = []
    first = hw_answer.answer(GPT2, opts, cache, cold.append, launch=launch)
    assert first.narrowed == {"zero": "3"} and first.plan is not None and first.plan["zero"] == 3
    assert first.unlaunched.startswith("the fastest plan (") and not _hit(cold)
    warm: list[str] = []
    again = hw_answer.answer(GPT2, opts, cache, warm.append, launch=launch)
    assert _hit(warm) and again == first and first.unlaunched in warm
    # The question without the export is another answer (its plan is ZeRO-1).
    other: list[str] = []
    alone = hw_answer.answer(GPT2, opts, cache, other.append)
    assert not _hit(other) and alone.plan is not None and alone.plan["zero"] == 1 and not alone.narrowed
