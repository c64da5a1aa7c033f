"""The search's block bounds and its budget counted ahead: a block's floor bound (one DP per
setting on the block's least bound times, at its largest HBM) lies above each of its chips' DP
bounds and its ceiling (the greatest bound times, the smallest HBM) below, so pruning a block by
its floor keeps the answer and counting it by its ceiling counts chips whose DP bounds reach the
incumbent; over ``--max-exact`` so counted, the search refuses in one line (counts, no clock)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import MODELS

TINY = str(MODELS / "tiny_gpt2.py")


@pytest.fixture(scope="module")
def tiny():
    """The tiny GPT-2's settings (micro-batch 8, TP 1 and 2) and the paper's space."""
    from phaze.options import Options
    from phaze.search.arch_space import paper_space
    from phaze.search.engine import Candidates
    from phaze.search.setting import prepare_settings

    settings = prepare_settings(TINY, 8, (1, 2), Options(micro_batches=(8,), tp_widths=(1, 2)))
    return settings, Candidates.of_space(paper_space())


def _evaluator():
    from passes.algorithms.schedule import ScheduleCache
    from phaze.search.engine import Evaluator, Params, SolverLimits

    return Evaluator(Params(devices=64, global_batch=64), SolverLimits(), ScheduleCache(None))


def _search_state(settings, cands):
    """A search of the tiny GPT-2 on ``cands`` before its first stage: its frontier set."""
    from phaze.search import engine

    ev = _evaluator()
    bb = engine._BranchAndBound(
        cands, [engine.ModelTask("tiny", settings)], ev, True, engine.NoProgress(), "search", engine.SearchBudget(0, 0)
    )
    bb.frontier = engine._Frontier(bb.archs, bb.work_bound_of_configs(), bb.answer.area_key)
    return bb, ev


@pytest.mark.parametrize("block", [0, 57])
def test_a_blocks_floor_and_ceiling_bound_each_chips_dp_bound(tiny, block):
    """Each chip of a block (the first, and one further down the visit order, of chips less
    alike): its DP bound at its own HBM, best over the settings, lies between the block's
    ceiling and its floor; the floor is below the block's best work bound."""
    from phaze.search.engine import BOUND_BATCH, TOL

    settings, cands = tiny
    bb, ev = _search_state(settings, cands)
    start = block * BOUND_BATCH
    bb.frontier.visited = start
    bb.floor_next_block()
    floor, ceiling = bb.frontier.next_floor(), bb.block_ceiling(start)
    archs = bb.frontier.order[start : start + BOUND_BATCH]
    pairs = [(bb.archs[a][0], cands.hbm[bb.archs[a][1]]) for a in archs]
    task = bb.tasks[0]
    per_setting = np.stack([ev.dp_bounds(cands, 0, task, s, pairs) for s in bb.usable[0]])
    each = per_setting.max(axis=0)
    assert len(archs) == BOUND_BATCH and each.max() > 0
    assert floor >= each.max() * (1 - TOL), (floor, each.max())
    assert ceiling <= each.min() * (1 + TOL), (ceiling, each.min())
    work = max(bb.frontier.work_bound[c] for c, _ in pairs)
    assert floor <= work * (1 + TOL)
    # bounds, not a constant: the chips differ and the floor is not the work bound
    assert ceiling < floor < work


def test_the_search_refuses_ahead_of_its_exact_budget_in_one_line(tiny):
    """On the paper space the tiny GPT-2 scores alike on more than a thousand chips (a search
    with no budget evaluates 1,630 exactly): under ``--max-exact 64`` it is refused after two
    exact batches, counting the chips whose DP bounds reach the best found, not after 64
    evaluations; the same line every time, naming the best chip, the gap and what to do."""
    from phaze.search.engine import ModelTask, SearchBudget, SearchTooLarge, search

    settings, cands = tiny
    said, counts = [], []
    for _ in range(2):
        ev = _evaluator()
        with pytest.raises(SearchTooLarge) as info:
            search(cands, [ModelTask("tiny", settings[:1])], ev, budget=SearchBudget(exact=64))
        said.append(str(info.value))
        counts.append(dict(ev.counts))
    assert said[0] == said[1] and counts[0] == counts[1] and "\n" not in said[0]
    head = "the architecture search: more than 64 exact evaluations (its budget) ahead, 16 made and "
    assert said[0].startswith(head), said[0]
    assert "the best found so far, paper:" in said[0] and "% below the best" in said[0]
    assert said[0].endswith("give --hw CHIP to compile for one chip, a smaller --space, or a larger --max-exact")
    assert counts[0]["dp_exact_solves"] < 64


def test_a_search_within_its_budget_is_not_refused_ahead(tiny):
    """The small space's search evaluates 12 architectures: a budget of 16 lets it through,
    ahead or not, with the answer and counts of the search without a budget."""
    from pathlib import Path

    from phaze.search.arch_space import load_space
    from phaze.search.engine import Candidates, ModelTask, SearchBudget, search

    settings, _ = tiny
    cands = Candidates.of_space(load_space(Path(__file__).parents[1] / "examples" / "spaces" / "small.toml"))
    task = [ModelTask("tiny", settings[:1])]
    free = search(cands, task, _evaluator(), budget=None)
    held = search(cands, task, _evaluator(), budget=SearchBudget(exact=16))
    assert free.stats["evaluated"] <= 16
    assert (held.best.config, held.best.hbm, held.best.score) == (free.best.config, free.best.hbm, free.best.score)
    assert held.stats == {**free.stats, "wall_s": held.stats["wall_s"]}
