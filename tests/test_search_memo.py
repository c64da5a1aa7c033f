"""The search's work saved by identical inputs, and its budget: chips whose every input to a
setting's schedules is equal (their *signature*) get their makespans, DP results and refined
bounds once, and the same numbers as priced alone; a search over its budget refuses in one line,
by counts (no clock), and a budget never changes an answer it gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import MODELS, run_main

TINY = str(MODELS / "tiny_gpt2.py")
TINY_SPACE = str(Path(__file__).parent / "data" / "tiny_space.toml")
SMALL_SPACE = str(Path(__file__).parents[1] / "examples" / "spaces" / "small.toml")


@pytest.fixture(scope="module")
def tiny():
    """The tiny GPT-2's setting (micro-batch 8, TP 1), the paper's space and a schedule cache."""
    from passes.algorithms.schedule import ScheduleCache
    from phaze.options import Options
    from phaze.search.arch_space import paper_space
    from phaze.search.engine import Candidates
    from phaze.search.setting import prepare_settings

    settings = prepare_settings(TINY, 8, (1,), Options(micro_batches=(8,), tp_widths=(1,)))
    return settings, Candidates.of_space(paper_space()), ScheduleCache(None)


def _evaluator(cache):
    from phaze.search.engine import Evaluator, Params, SolverLimits

    return Evaluator(Params(devices=64, global_batch=64), SolverLimits(), cache)


def _twins(ev, cands, setting, groups: int, singles: int) -> list[list[int]]:
    """``groups`` sets of chips of one signature each (2 or 3 chips, different configs), then
    ``singles`` chips of other signatures, one each, from the first chips of the space."""
    from passes.algorithms.latency import estimate_space

    configs = list(range(4000))
    lat = estimate_space(setting.table, cands.configs[configs], cands.template, cache=None)
    by_sig: dict[bytes, list[int]] = {}
    for c, sig in zip(configs, ev.signatures(cands, setting, lat.one, lat.split, configs)):
        by_sig.setdefault(sig, []).append(c)
    shared = [cs[:3] for cs in by_sig.values() if len(cs) > 1][:groups]
    alone = [cs[:1] for cs in by_sig.values() if cs[:3] not in shared][:singles]
    assert len(shared) == groups and len(alone) == singles
    return shared + alone


def test_chips_of_one_signature_have_the_same_problems(tiny):
    """Equal signatures, equal canonical problems for every priced group (what the memos rely
    on), and chips of unequal signatures differ somewhere (the signature is not constant); some
    twins differ in a core count no group can use."""
    from passes.algorithms.latency import estimate_space
    from phaze.search.pricing import chip_cores

    (setting,), cands, cache = tiny
    ev = _evaluator(cache)
    sets = _twins(ev, cands, setting, groups=6, singles=2)
    configs = [c for cs in sets for c in cs]
    lat = estimate_space(setting.table, cands.configs[configs], cands.template, cache=None)

    def keys(c: int) -> list[str]:
        col = configs.index(c)
        return [
            setting.group_problem(g, lat.one[:, col], lat.split[:, col], chip_cores(cands, c)).canonical().key()
            for g in setting.priced_groups()
        ]

    for cs in sets[:6]:
        assert all(keys(c) == keys(cs[0]) for c in cs[1:])
    assert keys(sets[6][0]) != keys(sets[7][0])
    raw = [(int(cands.configs["num_tc"][c]), int(cands.configs["num_vc"][c])) for cs in sets[:6] for c in cs]
    assert len(set(raw)) > 1


def test_priced_once_per_signature_the_same_numbers_as_alone(tiny):
    """The exact price of chips sharing a signature, priced together (one DP per distinct
    problem, makespans and refined bounds reused), is bit for bit each chip's price alone (a
    fresh evaluator per chip, the same schedules)."""
    from phaze.search.engine import ModelTask

    settings, cands, cache = tiny
    task = ModelTask("tiny", settings)
    ev = _evaluator(cache)
    sets = _twins(ev, cands, settings[0], groups=3, singles=2)
    jobs = [(0, 0, c, h) for cs in sets for c in cs for h in cands.hbm]
    together = ev.exact(cands, [task], jobs)
    assert ev.counts["dp_exact_solves"] == len(sets) * len(cands.hbm) < len(jobs)
    configs = [c for cs in sets for c in cs]
    refined = ev.refined_lower_bounds(cands, settings[0], configs)
    for j, (_, _, c, h) in enumerate(jobs):
        alone = _evaluator(cache)
        ((score, result),) = alone.exact(cands, [task], [(0, 0, c, h)])
        assert score == together[j][0] and result == together[j][1]
        column = alone.refined_lower_bounds(cands, settings[0], [c])[:, 0]
        assert np.array_equal(column, refined[:, configs.index(c)])


def test_the_refined_bounds_of_twins_are_computed_once(tiny):
    """Before any schedule, the refined bounds of chips sharing a signature are each chip's own
    (a fresh evaluator per chip), their problems' bounds computed once per signature."""
    from passes.algorithms.schedule import ScheduleCache

    (setting,), cands, _ = tiny
    ev = _evaluator(ScheduleCache(None))
    sets = _twins(ev, cands, setting, groups=3, singles=1)
    configs = [c for cs in sets for c in cs]
    got = ev.refined_lower_bounds(cands, setting, configs)
    assert len(ev.bounds._refined_memo) == len(sets)
    for col, c in enumerate(configs):
        alone = _evaluator(ScheduleCache(None)).refined_lower_bounds(cands, setting, [c])[:, 0]
        assert np.array_equal(alone, got[:, col])


def _tiny_search(budget, space: str = TINY_SPACE):
    from passes.algorithms.schedule import ScheduleCache
    from phaze.options import Options
    from phaze.search.arch_space import load_space
    from phaze.search.engine import Candidates, ModelTask, search
    from phaze.search.setting import prepare_settings

    settings = prepare_settings(TINY, 8, (1,), Options(micro_batches=(8,), tp_widths=(1,)))
    cands = Candidates.of_space(load_space(space))
    return search(cands, [ModelTask("tiny", settings)], _evaluator(ScheduleCache(None)), budget=budget)


@pytest.mark.parametrize(("budget", "space"), [({"exact": 8}, SMALL_SPACE), ({"dp_bound_layers": 10}, TINY_SPACE)])
def test_a_search_over_its_budget_refuses_in_one_line(budget, space):
    """Over either budget, the search stops with one line saying why and what to do, the same
    line every time (counts, no clock); within it, the answer of the search without one.  The
    small space's search evaluates 8 architectures exactly, then more: refused before the
    second batch, it says the best of the first.  The tiny space's first block is queued by its
    floor bound (no DP of its own) and evaluated before any DP bound of a chip: over the DP
    budget after that first exact batch, it says the best of it too."""
    from phaze.search.engine import SearchBudget, SearchTooLarge

    said = []
    for _ in range(2):
        with pytest.raises(SearchTooLarge) as info:
            _tiny_search(SearchBudget(**budget), space)
        said.append(str(info.value))
    assert said[0] == said[1] and "\n" not in said[0]
    assert said[0].startswith("the architecture search: more than ")
    assert "--hw CHIP" in said[0] and "--space" in said[0]
    assert said[0].endswith("or a larger --max-exact" if "exact" in budget else "or a larger --max-dp-bound")
    # past the first exact batch (8 architectures), it says the best found and how close it is
    assert f"the best found so far, {'small' if 'exact' in budget else 'tiny'}:" in said[0], said[0]
    assert "% below the best" in said[0], said[0]
    free = _tiny_search(None)
    roomy = _tiny_search(SearchBudget(exact=1000, dp_bound_layers=10**7))
    assert (roomy.best.config, roomy.best.hbm, roomy.best.score) == (free.best.config, free.best.hbm, free.best.score)
    assert roomy.stats == {**free.stats, "wall_s": roomy.stats["wall_s"]}


def test_phazec_refuses_a_search_over_max_exact_in_one_line(tmp_path):
    r = run_main(
        "phazec", TINY, "--space", TINY_SPACE, "--devices", "64", "--global-batch", "64",
        "--micro-batch", "8", "--tp", "1", "--no-baselines", "--no-cache", "--max-exact", "2", "-q",
        "-o", str(tmp_path / "p.mlir"),
    )  # fmt: skip
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "more than 2 exact evaluations" in r.stderr and "--hw CHIP" in r.stderr
    assert not (tmp_path / "p.mlir").exists()
    bad = run_main("phazec", TINY, "--max-exact", "-3", "-o", str(tmp_path / "q.mlir"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--max-exact" in bad.stderr, bad.stderr
