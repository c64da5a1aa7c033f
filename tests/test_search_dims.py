"""The architecture search over the dimensions ``phazec --hw`` prices (issue 56): context
parallelism (``auto``: each degree a setting, as a TP width is), expert parallelism with a
capacity factor on an MoE model, and a runtime's kernels under mixed precision.  Under each,
pruning finds what plain enumeration finds (the bounds stay bounds), and the winner's plan is
``phazec --hw`` of the winning chip, byte for byte (the same schedules through one schedule
cache: SCIP stops on a node limit, and on a loaded machine on its time limit too).  Apart from
``test_search.py`` and ``test_search_options.py`` so that they run on other test workers."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import MODELS, run_main
from test_search import TINY_SPACE, eight_core_chips, search

LLAMA = str(MODELS / "tiny_llama_sdpa.py")
#: The search's solver limits (``SolverLimits``), which ``--hw`` takes as flags.
SOLVER = ["--solver-nodes", "1", "--solver-time-limit", "60", "--solver-max-binaries", "2000"]


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory) -> str:
    """A two-layer Mixtral of 4 experts, 2 a token (``test_moe_conv.MIXTRAL``), at 32 tokens."""
    from test_moe_conv import MIXTRAL

    path = tmp_path_factory.mktemp("mixtral") / "tiny_mixtral.py"
    path.write_text(MIXTRAL.format(seq=32))
    return str(path)


def _winner_chip(text: str, path: Path) -> str:
    """The winning chip of a search's plan ``text`` written as a hardware file at ``path``."""
    from phaze_ir.hardware import dumps_toml
    from phaze_ir.hardware_ir import module_accelerator
    from phaze_ir.ir import parse_module

    path.write_text(dumps_toml(module_accelerator(parse_module(text), "test")))
    return str(path)


def _without_baselines(text: str) -> tuple[list[str], str]:
    """A search's plan ``text`` as ``phazec --hw`` would print it: its comment header but its
    runner-up line (the search names its best other baseline, ``--hw`` its sweep's next point),
    and its module printed without the search's ``phaze.baselines``."""
    from phaze_ir.ir import parse_module, print_module

    module = parse_module(text)
    module.attributes.pop("phaze.baselines", None)
    header = [line for line in text.splitlines() if line.startswith("//") and not line.startswith("// runner-up ")]
    return header, print_module(module)


def _same_as_hw(tmp_path: Path, model: str, text: str, flags: list[str], cache: Path) -> None:
    """``phazec --hw`` of the winning chip of the search whose plan is ``text`` (asked with
    ``flags``, its cache ``cache``), with the same flags, gives the same plan byte for byte:
    its header (but the runner-up line) and its module (the search's without its baselines)."""
    chip = _winner_chip(text, tmp_path / "winner.toml")
    out = tmp_path / "hw.mlir"
    r = run_main(
        "phazec", model, "--hw", chip, *flags, *SOLVER, "--no-cache", "-q", "-o", str(out),
        env={"PHAZE_SCHEDULE_CACHE": str(cache)},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    hw = out.read_text()
    assert _without_baselines(text) == _without_baselines(hw)


def _enumeration_and_pruned(
    tmp_path: Path, model: str, flags: list[str], space: str = TINY_SPACE
) -> tuple[str, dict, Path]:
    """The search with ``flags`` over ``space``, pruned and enumerated (one cache: the stages
    are priced once): the pruned search's plan and JSON, after checking it found what
    enumeration found.  The tests search ``eight_core_chips``: the enumeration schedules every
    chip (at 8k tokens, the whole attention at CP 1), minutes on a loaded 2-core machine for the
    whole tiny space; the pruned search still skips most of them (8 of 26 architectures evaluated
    under ``--context-parallel auto``, whose winner is the one found among the chips of 4 and 8
    cores, in half the enumeration's time).  The pruned search runs first, so that its winner is compiled through
    the pipeline, not placed from the template the other one left (whose header's MFU is
    computed on the template's skeleton, without the causal attention's ops)."""
    cache = tmp_path / "cache"
    base = ["--space", space, *flags, "--no-baselines"]
    text, got, _ = search(tmp_path, "pruned", base=base, model=model, cache=cache)
    _, plain, _ = search(tmp_path, "plain", "--no-prune", base=base, model=model, cache=cache)
    assert got["accelerator"] == plain["accelerator"]
    assert got["throughput_samples_per_s"] == plain["throughput_samples_per_s"]
    assert (got["dp"], got["pp"], got["tp"], got["cp"], got["expert_parallel"]) == (
        plain["dp"],
        plain["pp"],
        plain["tp"],
        plain["cp"],
        plain["expert_parallel"],
    )
    st = plain["search"]
    assert st["evaluated"] == st["architectures"]
    assert max(p["throughput_samples_per_s"] for p in st["points"]) == got["throughput_samples_per_s"]
    return text, got, cache


@pytest.mark.slow
def test_context_parallel_auto_in_the_search(tmp_path):
    """``--context-parallel auto`` at 8,192 tokens on 8 devices: degrees 1 and 2, each its own
    setting (traced at S/c, its attention kernels rings on the chip's network; fused at CP 1
    too, as the pipeline's sweep traces every degree of ``auto``); pruning keeps the answer, and
    ``--hw`` of the winner with the same flags compiles the same plan."""
    flags = ["--devices", "8", "--global-batch", "8", "--micro-batch", "1", "--tp", "2", "--seq-len", "8192"]
    flags += ["--context-parallel", "auto"]
    text, got, cache = _enumeration_and_pruned(tmp_path, LLAMA, flags, eight_core_chips(tmp_path))
    assert got["search"]["settings"] == 2  # CP 1 and CP 2
    assert (got["cp_ring"] is not None) == (got["cp"] == 2)
    _same_as_hw(tmp_path, LLAMA, text, flags, cache)


@pytest.mark.slow
def test_expert_parallel_auto_and_capacity_in_the_search(tmp_path, mixtral):
    """``--expert-parallel auto --capacity-factor 1.25`` on an MoE model: the settings carry
    the experts' numbers (padded at import), the DP chooses the EP degree on every chip, the
    bounds (all-to-alls only add) keep the answer, and ``--hw`` of the winner agrees."""
    flags = ["--devices", "8", "--global-batch", "8", "--micro-batch", "1", "--tp", "1"]
    flags += ["--expert-parallel", "auto", "--capacity-factor", "1.25"]
    text, got, cache = _enumeration_and_pruned(tmp_path, mixtral, flags, eight_core_chips(tmp_path))
    assert got["capacity_factor"] == 1.25 and got["expert_parallel"] >= 1
    _same_as_hw(tmp_path, mixtral, text, flags, cache)
    # A degree that does not divide the experts: the DP's words, in one line (the settings cached).
    flags[flags.index("auto")] = "3"
    r = run_main("phazec", mixtral, "--space", TINY_SPACE, *flags, "--no-baselines", "--cache", str(cache), "-q")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "expert parallel 3: expected a degree that divides the model's 4 experts" in r.stderr


@pytest.mark.slow
def test_eager_kernels_and_amp_in_the_search(tmp_path):
    """``--kernels eager --dtype amp-bfloat16``: the settings' steps formed into PyTorch eager's
    kernels (SDPA a fused attention) as on any chip of the space, autocast's mixed precision;
    pruning keeps the answer and ``--hw`` of the winner agrees."""
    flags = ["--devices", "8", "--global-batch", "8", "--micro-batch", "1", "--tp", "1"]
    flags += ["--kernels", "eager", "--dtype", "amp-bfloat16"]
    text, got, cache = _enumeration_and_pruned(tmp_path, LLAMA, flags, eight_core_chips(tmp_path))
    assert got["feasible"]
    assert 'kernels = "eager"' in text
    _same_as_hw(tmp_path, LLAMA, text, flags, cache)
