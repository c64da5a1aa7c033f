"""FP8 as a dimension of the architecture space (``[search] fp8_rate``): the space parses it and
prices the FP8 datapath's area and energy from ``phaze_ir/area_22nm.toml``; an FP8 GEMM runs at
the datapath's rate on the space's chips (their bounds with it); ``phazec --dtype fp8`` without
``--hw`` searches the FP8 chips only, finds what plain enumeration finds, and its winner's plan is
``phazec --hw`` of the winning chip, byte for byte; a bf16 search is what it was."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import MODELS, run_main

from passes.algorithms.latency import FP8_DATAPATH_REFUSAL, MatmulDesc, estimate_chip, estimate_space, fp8_problem
from phaze.search.arch_space import ArchSpaceError, loads_space
from phaze_ir import area
from phaze_ir.hardware import Accelerator, HardwareError, dumps_toml, load_hardware

TINY = str(MODELS / "tiny_gpt2.py")
TINY_SPACE = Path(__file__).parent / "data" / "tiny_space.toml"
COMMON = ["--devices", "64", "--global-batch", "64", "--micro-batch", "8", "--tp", "1"]


def _space_text(fp8: str | None, cores: str | None = None) -> str:
    """The tiny space (same name, same axes), with ``fp8_rate = fp8`` when given, and its chips
    of ``cores`` tensor cores only when given (a TOML list)."""
    text = TINY_SPACE.read_text()
    if cores is not None:
        text = text.replace("num_tc = { min = 1, max = 8 }", f"num_tc = {cores}")
    return text if fp8 is None else text + f"fp8_rate = {fp8}\n"


# -- the space ------------------------------------------------------------------------------


def test_the_space_parses_the_fp8_axis_and_prices_its_area_and_energy():
    both = loads_space(_space_text("[0, 2]"))
    plain = loads_space(_space_text(None))
    assert set(both.configs["fp8_rate"].tolist()) == {0, 2}
    assert plain.spec.fp8_rate == (0,) and set(plain.configs["fp8_rate"].tolist()) == {0}
    # Without FP8 GEMMs the search takes the chips without the datapath: the space without the
    # axis, the same chips in the same order, the same floats.
    bf16 = both.for_fp8(False)
    assert bf16.configs.tobytes() == plain.configs.tobytes()
    assert plain.for_fp8(False) is plain
    fp8 = both.for_fp8(True)
    assert len(fp8) and (fp8.configs["fp8_rate"] == area.FP8_RATE).all()
    # The FP8 datapath makes every PE FP8_PE_AREA_RATIO larger; fewer chips fit the budget.
    g = fp8.configs
    base = area.chip_area_um2(g["num_tc"], g["width"], g["depth"], g["num_vc"], g["width_vc"], g["glb_bytes"])
    extra = (area.FP8_PE_AREA_RATIO - 1) * area.PE_AREA_UM2 * g["num_tc"] * g["width"] * g["depth"]
    np.testing.assert_allclose(g["area_um2"], base + extra, rtol=1e-12)
    assert area.FP8_PE_AREA_RATIO > 1 and 0 < area.FP8_MAC_ENERGY_RATIO < 1
    # A candidate as a chip: its FP8 rate, its area, and its FP8 MAC's energy in its [energy].
    acc = fp8[0]
    assert acc.tensor_cores.fp8_rate == area.FP8_RATE and "-fp8x2-" in acc.name
    assert acc.area_um2 == g["area_um2"][0]
    assert acc.energy is not None and acc.energy.fp8_mac_j == acc.energy.mac_j * area.FP8_MAC_ENERGY_RATIO
    assert Accelerator.from_dict(acc.to_dict()) == acc  # what --hw reads back
    assert plain[0].tensor_cores.fp8_rate is None and plain[0].energy.fp8_mac_j is None
    assert "fp8_rate" not in plain[0].to_dict()["tensor_cores"]  # a bf16 chip's description unchanged


@pytest.mark.parametrize("value", ["[1]", "[0, 0]", "[]", '"2"', "[2, 4]", "true"])
def test_a_bad_fp8_axis_is_one_line(value):
    with pytest.raises(ArchSpaceError) as info:
        loads_space(_space_text(value))
    msg = str(info.value)
    assert "\n" not in msg and "fp8_rate" in msg


def test_fp8_without_the_datapath_is_refused_in_one_line():
    with pytest.raises(ArchSpaceError, match=r"--dtype fp8: no chip of the space has the FP8 datapath"):
        loads_space(_space_text(None)).for_fp8(True)
    # A space of FP8 chips only is searched whole by a bf16 run (the datapath is unused).
    only = loads_space(_space_text("[2]"))
    assert only.for_fp8(False) is only


def test_a_chip_states_its_fp8_rate_as_the_area_model_prices_it():
    tpu = load_hardware("tpuv4")
    with pytest.raises(HardwareError, match="fp8_rate = 3: expected 2"):
        dataclasses.replace(tpu, tensor_cores=dataclasses.replace(tpu.tensor_cores, fp8_rate=3))
    h100 = load_hardware("h100")  # a calibrated chip's FP8 rate is its fp8_gemm_flops
    with pytest.raises(HardwareError, match="ideal chip only"):
        dataclasses.replace(h100, tensor_cores=dataclasses.replace(h100.tensor_cores, fp8_rate=2))
    assert fp8_problem(tpu) == FP8_DATAPATH_REFUSAL.format(chip="tpuv4")
    fp8 = dataclasses.replace(tpu, tensor_cores=dataclasses.replace(tpu.tensor_cores, fp8_rate=2))
    assert fp8_problem(fp8) is None
    assert fp8.area_um2 > tpu.area_um2


# -- the latency (and so the bounds) -----------------------------------------------------------


def _gemm(elem: int) -> MatmulDesc:
    m, n, k = 4096, 4096, 4096
    return MatmulDesc(1, m, n, k, elem, elem, 2, m * k * elem, k * n * elem)


def test_an_fp8_gemm_runs_at_the_datapath_rate_on_the_space_and_on_its_chip():
    space = loads_space(_space_text("[0, 2]"))
    fp8 = space.for_fp8(True)
    bf16, f8 = _gemm(2), _gemm(1)
    on_fp8 = estimate_space([bf16, f8], fp8.configs, space.spec.template, cache=None)
    # A 16-bit GEMM is priced the same on a chip with the datapath and one without.
    twin = fp8.configs.copy()
    twin["fp8_rate"] = 0
    plain = estimate_space([bf16], twin, space.spec.template, cache=None)
    assert np.array_equal(on_fp8.split[0], plain.split[0])
    # The FP8 GEMM: compute-bound ones at half the cycles; none slower than a lower bound of
    # half the 16-bit GEMM's time (a bound on the FP8 rate is a bound).
    compute = on_fp8.bound[1] == 0
    assert compute.any()
    np.testing.assert_allclose(on_fp8.split[1][compute], on_fp8.split[0][compute] / 2, rtol=1e-12)
    assert (on_fp8.split[1] >= on_fp8.split[0] / area.FP8_RATE * (1 - 1e-12)).all()
    # One chip priced as the pipeline prices it: the same floats as its column of the space.
    for i in (0, len(fp8) - 1):
        one = estimate_chip([bf16, f8], fp8[i])
        assert one.split[:, 0].tolist() == on_fp8.split[:, i].tolist()
    with pytest.raises(ValueError, match="no FP8 datapath"):
        estimate_space([f8], twin, space.spec.template, cache=None)


def test_the_fp8_macs_energy_on_the_space_is_its_chips():
    from passes.algorithms.energy import energy_space, estimate_energy
    from passes.algorithms.latency import OpTable

    fp8 = loads_space(_space_text("[0, 2]")).for_fp8(True)
    table = OpTable([_gemm(1)])
    chip_j, _ = energy_space(table, fp8.configs, fp8.spec.template)
    for i in (0, len(fp8) - 1):
        assert estimate_energy(_gemm(1), fp8[i]).chip_j == pytest.approx(chip_j[0, i], rel=1e-12)


# -- the search end to end ----------------------------------------------------------------


def _search(tmp_path: Path, name: str, space: Path, *extra: str) -> tuple[str, dict]:
    out = tmp_path / name
    out.mkdir()
    args = [TINY, "--space", str(space), *COMMON, "--no-baselines", "-q", "--cache", str(tmp_path / "cache")]
    r = run_main("phazec", *args, "-o", str(out / "plan.mlir"), "--json", str(out / "plan.json"), *extra)
    assert r.returncode == 0, r.stderr
    return (out / "plan.mlir").read_text(), json.loads((out / "plan.json").read_text())


def _without_search_keys(data: dict) -> dict:
    return {k: v for k, v in data.items() if k != "search"} | {
        "search": {k: v for k, v in data["search"].items() if k not in ("wall_s", "evaluator")}
    }


#: The end-to-end searches run on the tiny space's chips of 4 and 8 tensor cores (26 of its 55
#: chips a datapath): the enumeration schedules every one of them.
CORES = "[4, 8]"


@pytest.fixture(scope="module")
def bf16_over_the_fp8_axis(tmp_path_factory) -> tuple[Path, Path, str, dict]:
    """A bf16 search over the space with the FP8 axis: ``(its folder, the space, its plan, its
    JSON)``; its cache is ``its folder/cache``."""
    root = tmp_path_factory.mktemp("fp8space")
    space = root / "tiny_fp8.toml"
    space.write_text(_space_text("[0, 2]", CORES))
    return root, space, *_search(root, "bf16", space)


@pytest.mark.slow
def test_fp8_search_equals_enumeration_and_its_winner_is_phazec_hw(tmp_path, bf16_over_the_fp8_axis):
    _, space, _, bf16 = bf16_over_the_fp8_axis
    text, got = _search(tmp_path, "pruned", space, "--dtype", "fp8")
    _, plain = _search(tmp_path, "plain", space, "--dtype", "fp8", "--no-prune")
    # The FP8 chips only, and the pruned search finds what enumeration finds.
    assert got["accelerator"]["tensor_cores"]["fp8_rate"] == area.FP8_RATE
    assert plain["search"]["evaluated"] == plain["search"]["architectures"]
    assert got["accelerator"] == plain["accelerator"]
    assert got["throughput_samples_per_s"] == plain["throughput_samples_per_s"]
    assert got["throughput_samples_per_s"] == max(p["throughput_samples_per_s"] for p in plain["search"]["points"])
    assert all("-fp8x2-" in p["label"] for p in plain["search"]["points"])
    # The winner's chip as a hardware file: phazec --hw gives the search's plan, byte for byte
    # (the search adds its baselines' records, phaze.baselines, and nothing else).
    from phaze_ir.hardware_ir import module_accelerator
    from phaze_ir.ir import parse_module

    chip = tmp_path / "winner.toml"
    chip.write_text(dumps_toml(module_accelerator(parse_module(text), "test")))
    hw = tmp_path / "hw.mlir"
    limits = ["--solver-nodes", "1", "--solver-time-limit", "60", "--solver-max-binaries", "2000"]
    r = run_main("phazec", TINY, "--hw", str(chip), *COMMON, "--dtype", "fp8", *limits, "-q", "-o", str(hw))
    assert r.returncode == 0, r.stderr
    searched = re.sub(r", phaze\.baselines = \[.*?\]\}", "}", text, count=1)
    assert searched != text and searched == hw.read_text()
    # FP8 pays here: the FP8 winner beats the bf16 search of the same space.
    assert "fp8_rate" not in bf16["accelerator"]["tensor_cores"]
    assert got["throughput_samples_per_s"] > bf16["throughput_samples_per_s"]


@pytest.mark.slow
def test_a_bf16_search_is_unchanged_by_the_fp8_axis(tmp_path, bf16_over_the_fp8_axis):
    """The axis is not enumerated without FP8 GEMMs: the same plan and answer, byte for byte."""
    root, _, text, with_axis = bf16_over_the_fp8_axis
    space = tmp_path / "tiny.toml"
    space.write_text(_space_text(None, CORES))
    before, without = _search(root, "bf16 without the axis", space)  # its schedules from the same cache
    assert text == before
    assert _without_search_keys(with_axis) == _without_search_keys(without)
