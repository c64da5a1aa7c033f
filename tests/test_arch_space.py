"""The area model and the architecture space: the paper's 29,360 candidates, space files, errors."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from phaze.search.arch_space import (
    CONFIG_DTYPE,
    ArchSpace,
    ArchSpaceError,
    SpaceSpec,
    load_space,
    loads_space,
    paper_space,
    paper_spec,
)
from phaze_ir import area
from phaze_ir.hardware import Accelerator, GiB, HardwareError, MiB, load_hardware

REPO = Path(__file__).resolve().parents[1]
SAMPLE = json.loads((Path(__file__).parent / "data" / "phaze_cores_sample.json").read_text())["rows"]
TPUV4_AREA_UM2 = 278_826_676.31216


@pytest.fixture(scope="module")
def paper() -> ArchSpace:
    return paper_space()


# --------------------------------------------------------------------------------------------
# Area model
# --------------------------------------------------------------------------------------------


def test_tpuv4_area() -> None:
    a = area.chip_area_um2(8, 128, 128, 2, 128, 128 * MiB)
    assert isinstance(a, float)
    assert a == pytest.approx(TPUV4_AREA_UM2, rel=1e-12)
    assert round(a / 1e6, 2) == 278.83


def test_area_terms() -> None:
    # One 2x2 tensor core and one 2-lane vector core, both with the minimum 1 KiB buffer.
    expected = (760.041386 * 4 + 6133.98) + (759.823853 * 2 + 6133.98) + 3_338_220
    assert area.chip_area_um2(1, 2, 2, 1, 2, 2 * MiB) == pytest.approx(expected, rel=1e-15)
    assert area.tc_buffer_bytes(128, 128) == 256 * 1024
    assert area.tc_buffer_bytes(4, 4) == 1024
    assert area.vc_buffer_bytes(256) == 4096
    # Vectorized: arrays broadcast, an array comes back.
    out = area.chip_area_um2(np.array([1, 2]), 128, 128, 2, 128, 128 * MiB)
    assert out.shape == (2,) and out[1] > out[0]


def test_design_rounded_constants_are_close() -> None:
    # docs/design.md §4.2 gives them rounded, 760.0414 and 759.8239; the exact constants differ by < 1e-7 relative.
    for n_pe in (4, 65536, 4096 * 65536):
        assert abs(760.0414 - area.PE_AREA_UM2) * n_pe / (760.0414 * n_pe) < 1e-7


def test_area_domain() -> None:
    assert area.in_domain(1024, 2048, 2 * MiB) is True
    assert area.in_domain(3000, 2048, 2 * MiB) is False
    assert area.in_domain(1024, 2048, 3 * MiB) is False
    with pytest.raises(area.AreaModelError, match=r"no global buffer area for 3145728 bytes \(3 MiB\)"):
        area.chip_area_um2(1, 2, 2, 1, 2, 3 * MiB)
    with pytest.raises(area.AreaModelError, match=r"per-core buffer area for 2097152 bytes \(2 MiB\)"):
        area.chip_area_um2(1, 512, 256, 1, 2, 2 * MiB)


# --------------------------------------------------------------------------------------------
# The paper's space
# --------------------------------------------------------------------------------------------


def test_paper_counts(paper: ArchSpace) -> None:
    assert paper.num_candidates == 75_712
    assert len(paper) == 29_360
    assert paper.configs.dtype == CONFIG_DTYPE
    assert paper.spec.budget_um2 == pytest.approx(TPUV4_AREA_UM2, rel=1e-12)
    assert paper.hbm_options == (32 * GiB, 64 * GiB, 80 * GiB)


def test_paper_sample_rows_match_reference(paper: ArchSpace) -> None:
    assert len(SAMPLE) == 300
    c = paper.configs
    for row in SAMPLE:
        got = c[row["index"]]
        assert (
            int(got["num_tc"]),
            int(got["num_vc"]),
            int(got["width"]),
            int(got["depth"]),
            int(got["width_vc"]),
            int(got["glb_bytes"]),
        ) == (row["num_tc"], row["num_vc"], row["width"], row["depth"], row["width_vc"], row["GLB_Buffer"]), row
        assert float(got["area_um2"]) == pytest.approx(row["area"], rel=1e-6)
        # And the scalar area model agrees with the vectorized generation.
        assert area.chip_area_um2(
            row["num_tc"], row["width"], row["depth"], row["num_vc"], row["width_vc"], row["GLB_Buffer"]
        ) == pytest.approx(row["area"], rel=1e-9)


def test_paper_order_is_the_references(paper: ArchSpace) -> None:
    c = paper.configs
    keys = np.stack([c[k] for k in ("num_tc", "num_vc", "width", "depth", "glb_bytes")], axis=1)
    # Strictly decreasing lexicographically, as the reference's cores.json.
    for a, b in zip(keys[:-1].tolist(), keys[1:].tolist()):
        assert a > b


def test_paper_bounds_and_waiver(paper: ArchSpace) -> None:
    c = paper.configs
    budget = paper.spec.budget_um2
    single = (c["num_tc"] == 1) | (c["num_vc"] == 1)
    assert np.all(c["area_um2"] <= budget)
    assert np.all(c["area_um2"][~single] >= 0.3 * budget)
    assert np.any(c["area_um2"][single] < 0.3 * budget)  # the waiver keeps some
    # The TPUv4-like chip is the largest candidate, exactly at the budget.
    i = paper.find(num_tc=8, num_vc=2, width=128, depth=128, glb_bytes=128 * MiB)
    assert i is not None and c["area_um2"][i] == budget == c["area_um2"].max()
    assert paper.find(num_tc=4096, num_vc=4096, width=256, depth=256, glb_bytes=128 * MiB) is None


def test_rule_variants_against_brute_force() -> None:
    base = paper_spec()
    spec = SpaceSpec(
        template=base.template,
        num_tc=(1, 2, 64, 512),
        num_vc=(4096, 1, 16),
        width=(8, 128),
        depth=(256, 2),
        width_vc="width",
        glb_bytes=(2 * MiB, 128 * MiB),
        budget_um2=base.budget_um2,
    )
    for frac, waive in [(0.3, True), (0.3, False), (0.0, True), (0.9, True)]:
        s = ArchSpace.generate(
            SpaceSpec(**{**spec.__dict__, "lower_fraction": frac, "waive_lower_bound_single_core": waive})
        )
        expected = []
        for ntc, nvc, w, d, g in itertools.product(spec.num_tc, spec.num_vc, spec.width, spec.depth, spec.glb_bytes):
            a = area.chip_area_um2(ntc, w, d, nvc, w, g)
            if a <= spec.budget_um2 and (a >= frac * spec.budget_um2 or (waive and 1 in (ntc, nvc))):
                expected.append((ntc, nvc, w, d, w, g))
        got = [
            tuple(r[k] for k in ("num_tc", "num_vc", "width", "depth", "width_vc", "glb_bytes")) for r in s.records()
        ]
        assert got == expected, (frac, waive)


def test_untied_width_vc_axis() -> None:
    base = paper_spec()
    spec = SpaceSpec(
        template=base.template,
        num_tc=(2,),
        num_vc=(2,),
        width=(16, 32),
        depth=(16,),
        width_vc=(64, 8, 4),
        glb_bytes=(8 * MiB,),
        budget_um2=1e12,
        lower_fraction=0.0,
    )
    s = ArchSpace.generate(spec)
    assert s.num_candidates == 6 == len(s)
    assert [r["width_vc"] for r in s.records()] == [64, 8, 4, 64, 8, 4]  # width_vc inside width
    assert s.find(num_tc=2, num_vc=2, width=32, depth=16, glb_bytes=8 * MiB, width_vc=8) == 4


def test_candidate_as_accelerator(paper: ArchSpace) -> None:
    i = paper.find(num_tc=8, num_vc=2, width=128, depth=128, glb_bytes=128 * MiB)
    assert i is not None
    acc = paper[i]
    tpu = load_hardware("tpuv4")
    assert isinstance(acc, Accelerator)
    assert acc.tensor_cores == tpu.tensor_cores and acc.vector_cores == tpu.vector_cores
    assert acc.global_buffer == tpu.global_buffer and acc.hbm == tpu.hbm
    assert acc.network == tpu.network and acc.clock_hz == tpu.clock_hz
    assert acc.area_um2 == paper.configs["area_um2"][i]
    assert acc.peak_tensor_flops == tpu.peak_tensor_flops
    assert acc.name == "paper:tc8x128x128-vc2x128-glb128MiB-hbm32GiB"
    assert paper.accelerator(i, hbm_bytes=80 * GiB).hbm.bytes == 80 * GiB
    assert Accelerator.from_dict(acc.to_dict()) == acc
    assert paper[-1] == paper.accelerator(len(paper) - 1)
    with pytest.raises(IndexError):
        paper.accelerator(len(paper))


def test_configs_are_read_only(paper: ArchSpace) -> None:
    with pytest.raises(ValueError):
        paper.configs["num_tc"][0] = 3


# --------------------------------------------------------------------------------------------
# Space files
# --------------------------------------------------------------------------------------------


def test_paper_toml_is_paper_space(paper: ArchSpace) -> None:
    s = load_space(REPO / "examples" / "spaces" / "paper.toml")
    assert s.spec == paper.spec
    assert np.array_equal(s.configs, paper.configs)


def test_small_toml() -> None:
    s = load_space(REPO / "examples" / "spaces" / "small.toml")
    assert 100 <= len(s) <= 1000
    assert s.num_candidates == 5 * 4 * 4 * 4 * 3
    assert s.spec.budget_um2 == 80e6
    assert s.hbm_options == (32 * GiB, 64 * GiB)
    c = s.configs
    assert np.all(c["area_um2"] <= 80e6)
    assert list(c["num_tc"][:1]) == [16]  # ranges run from max down
    assert s[0].hbm.bandwidth_Bps == 1.2e12


# A minimal valid space; the error tests below mutate one piece of it.
BASE = """\
name = "t"

[template]
hardware = "tpuv4"

[area]
budget_mm2 = 100.0

[search]
num_tc = { min = 1, max = 8 }
num_vc = [1, 2]
width = [16, 32]
depth = 16
width_vc = "width"
glb_MiB = [8, 32]
hbm_GiB = [32, 64]
"""


def test_base_space() -> None:
    s = loads_space(BASE)
    assert s.spec.name == "t" and s.num_candidates == 4 * 2 * 2 * 1 * 2
    assert s.spec.depth == (16,) and s.spec.glb_bytes == (8 * MiB, 32 * MiB)


SPACE_MUTATIONS = [
    ("unknown top-level key", "[search]", "[serch]", "bad.toml: unknown key 'serch' (did you mean 'search'?)"),
    (
        "unknown search key",
        "glb_MiB = [8, 32]",
        "glb_mib = [8, 32]",
        "bad.toml: unknown key 'search.glb_mib' (did you mean 'glb_MiB'?)",
    ),
    (
        "unknown area key",
        "budget_mm2 = 100.0",
        "budget_mm = 100.0",
        "bad.toml: unknown key 'area.budget_mm' (did you mean 'budget_mm2'?)",
    ),
    (
        "missing search key",
        "depth = 16\n",
        "",
        "bad.toml: missing required key 'search.depth' (an integer, a list, or {min = a, max = b})",
    ),
    ("missing table", "[area]\nbudget_mm2 = 100.0\n", "", "bad.toml: missing required table [area]"),
    (
        "range not a power of two",
        "{ min = 1, max = 8 }",
        "{ min = 1, max = 12 }",
        "bad.toml: search.num_tc.max = 12: expected a power of two (ranges run over powers of two)",
    ),
    (
        "range min above max",
        "{ min = 1, max = 8 }",
        "{ min = 16, max = 8 }",
        "bad.toml: search.num_tc = {min = 16, max = 8}: expected min <= max",
    ),
    (
        "range unknown key",
        "{ min = 1, max = 8 }",
        "{ min = 1, maxi = 8 }",
        "bad.toml: unknown key 'search.num_tc.maxi' (did you mean 'max'?)",
    ),
    (
        "range missing key",
        "{ min = 1, max = 8 }",
        "{ min = 1 }",
        "bad.toml: missing required key 'search.num_tc.max' (a power of two)",
    ),
    (
        "empty list",
        "num_vc = [1, 2]",
        "num_vc = []",
        "bad.toml: search.num_vc = []: expected a non-empty list of a positive integers",
    ),
    (
        "duplicate values",
        "num_vc = [1, 2]",
        "num_vc = [2, 2]",
        "bad.toml: search.num_vc = [2, 2]: expected distinct values",
    ),
    (
        "negative value",
        "num_vc = [1, 2]",
        "num_vc = [1, -2]",
        "bad.toml: search.num_vc[1] = -2: expected a positive integer",
    ),
    (
        "bool value",
        "depth = 16",
        "depth = true",
        "bad.toml: search.depth = true: expected a positive integer, a list of them, or a range {min = a, max = b}",
    ),
    (
        "fractional core count",
        "num_vc = [1, 2]",
        "num_vc = [1, 2.5]",
        "bad.toml: search.num_vc[1] = 2.5: expected a positive integer",
    ),
    (
        "bad tie",
        'width_vc = "width"',
        'width_vc = "wdth"',
        'bad.toml: search.width_vc = "wdth": expected values, or "width" / "depth" to tie it to that axis',
    ),
    (
        "both budgets",
        "budget_mm2 = 100.0",
        'budget_mm2 = 100.0\nbudget_of = "tpuv4"',
        "bad.toml: [area] needs exactly one of 'budget_mm2' (a positive number) and 'budget_of' (a preset "
        "name or hardware TOML path)",
    ),
    (
        "no budget",
        "budget_mm2 = 100.0",
        "lower_fraction = 0.3",
        "bad.toml: [area] needs exactly one of 'budget_mm2' (a positive number) and 'budget_of' (a preset "
        "name or hardware TOML path)",
    ),
    (
        "negative budget",
        "budget_mm2 = 100.0",
        "budget_mm2 = -1",
        "bad.toml: area.budget_mm2 = -1: expected a positive number",
    ),
    (
        "lower fraction out of range",
        "budget_mm2 = 100.0",
        "budget_mm2 = 100.0\nlower_fraction = 1.5",
        "bad.toml: area.lower_fraction = 1.5: expected a number in [0, 1]",
    ),
    (
        "waiver not a boolean",
        "budget_mm2 = 100.0",
        "budget_mm2 = 100.0\nwaive_lower_bound_single_core = 1",
        "bad.toml: area.waive_lower_bound_single_core = 1: expected true or false",
    ),
    (
        "template without hardware",
        'hardware = "tpuv4"',
        "clock_hz = 1e9",
        "bad.toml: missing required key 'template.hardware' (a preset name or a TOML path)",
    ),
    (
        "template unknown preset",
        'hardware = "tpuv4"',
        'hardware = "tpu4"',
        "unknown hardware preset 'tpu4' (did you mean 'tpuv4'?); known presets: a100, a100_40gb, h100, "
        "h100_hbm2e, tpuv4, tpuv4_torus "
        "(or give the path of a .toml file)",
    ),
    ("template missing file", 'hardware = "tpuv4"', 'hardware = "hw/none.toml"', "hw/none.toml: no such file"),
    (
        "template bad override",
        'hardware = "tpuv4"',
        'hardware = "tpuv4"\nclock_hz = -1',
        "bad.toml: template.clock_hz = -1: expected a positive number",
    ),
    (
        "template unknown override",
        'hardware = "tpuv4"',
        'hardware = "tpuv4"\nhbm.bandwith_Bps = 1e12',
        "bad.toml: unknown key 'template.hbm.bandwith_Bps' (did you mean 'bandwidth_Bps'?)",
    ),
    (
        "budget of unknown preset",
        "budget_mm2 = 100.0",
        'budget_of = "a200"',
        "unknown hardware preset 'a200' (did you mean 'a100'?); known presets: a100, a100_40gb, h100, "
        "h100_hbm2e, tpuv4, tpuv4_torus "
        "(or give the path of a .toml file)",
    ),
    (
        "global buffer outside the area model",
        "glb_MiB = [8, 32]",
        "glb_MiB = [8, 3]",
        "bad.toml: search.glb_MiB = 3: expected a global buffer the area model lists (2 MiB, 4 MiB, "
        "8 MiB, 16 MiB, 32 MiB, 64 MiB, 128 MiB)",
    ),
    (
        "PE array outside the area model",
        "width = [16, 32]",
        "width = [16, 32768]",
        "bad.toml: search.width = 32768 with search.depth = 16: a 32768 x 16 PE array has a 8 MiB "
        "per-core buffer (16 B per PE), outside the area model's table (1 KiB, 2 KiB, 4 KiB, 8 KiB, "
        "16 KiB, 32 KiB, 64 KiB, 128 KiB, 256 KiB, 512 KiB, 1 MiB)",
    ),
    (
        "PE array off the table",
        "width = [16, 32]",
        "width = [16, 24]",
        "bad.toml: search.width = 24 with search.depth = 16: a 24 x 16 PE array has a 6 KiB "
        "per-core buffer (16 B per PE), outside the area model's table (1 KiB, 2 KiB, 4 KiB, 8 KiB, "
        "16 KiB, 32 KiB, 64 KiB, 128 KiB, 256 KiB, 512 KiB, 1 MiB)",
    ),
    (
        "vector width outside the area model",
        'width_vc = "width"',
        "width_vc = [131072]",
        "bad.toml: search.width_vc = 131072: a 131072-lane vector core has a 2 MiB per-core buffer "
        "(16 B per lane), outside the area model's table (1 KiB, 2 KiB, 4 KiB, 8 KiB, 16 KiB, 32 KiB, "
        "64 KiB, 128 KiB, 256 KiB, 512 KiB, 1 MiB)",
    ),
]


@pytest.mark.parametrize("what,old,new,message", SPACE_MUTATIONS, ids=[m[0] for m in SPACE_MUTATIONS])
def test_malformed_space_messages(
    what: str, old: str, new: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert old in BASE, what
    (tmp_path / "bad.toml").write_text(BASE.replace(old, new, 1))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HardwareError) as info:
        load_space("bad.toml")
    assert str(info.value) == message
    assert "\n" not in str(info.value)


def test_vector_width_in_domain_at_the_table_edge() -> None:
    s = loads_space(BASE.replace('width_vc = "width"', "width_vc = [32768]"))
    assert set(s.configs["vc_buffer_bytes"].tolist()) == {512 * 1024}


def test_space_errors_are_arch_space_errors() -> None:
    with pytest.raises(ArchSpaceError):
        loads_space(BASE.replace("[search]", "[serch]"))


def test_space_syntax_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ArchSpaceError) as info:
        loads_space(BASE.replace("depth = 16", "depth = = 16"), source="s.toml")
    assert str(info.value) == "s.toml: TOML syntax error: Invalid value (at line 13, column 9)"
    with pytest.raises(ArchSpaceError, match=r"^nope/space\.toml: no such file$"):
        load_space("nope/space.toml")


def test_relative_hardware_paths_and_budget_of(tmp_path: Path) -> None:
    hw = tmp_path / "hw"
    hw.mkdir()
    (hw / "chip.toml").write_text(
        (REPO / "phaze_ir" / "hw_presets" / "tpuv4.toml").read_text().replace('name = "tpuv4"', 'name = "mine"')
    )
    (tmp_path / "s.toml").write_text(
        BASE.replace('hardware = "tpuv4"', 'hardware = "hw/chip.toml"').replace(
            "budget_mm2 = 100.0", 'budget_of = "hw/chip.toml"'
        )
    )
    s = load_space(tmp_path / "s.toml")
    assert s.spec.template.name == "mine"
    assert s.spec.budget_um2 == pytest.approx(TPUV4_AREA_UM2, rel=1e-12)
    # A budget hardware with no area (outside the model, none given) is an error.
    (hw / "noarea.toml").write_text(
        (REPO / "phaze_ir" / "hw_presets" / "tpuv4.toml")
        .read_text()
        .replace("bytes = 134_217_728", "bytes = 100_000_000")
    )
    (tmp_path / "s2.toml").write_text(BASE.replace("budget_mm2 = 100.0", 'budget_of = "hw/noarea.toml"'))
    with pytest.raises(
        ArchSpaceError,
        match=r"area\.budget_of = \"hw/noarea\.toml\": expected hardware "
        r"with an area",
    ):
        load_space(tmp_path / "s2.toml")


def test_spec_validation() -> None:
    tpu = load_hardware("tpuv4")
    kw = dict(
        template=tpu,
        num_tc=(1,),
        num_vc=(1,),
        width=(2,),
        depth=(2,),
        width_vc="width",
        glb_bytes=(2 * MiB,),
        budget_um2=1e9,
    )
    SpaceSpec(**kw)
    for bad in [
        dict(num_tc=()),
        dict(num_tc=(0,)),
        dict(num_tc=(True,)),
        dict(width=(2, 2)),
        dict(width_vc="lanes"),
        dict(budget_um2=0),
        dict(lower_fraction=2.0),
        dict(waive_lower_bound_single_core=1),
        dict(template="tpuv4"),
    ]:
        with pytest.raises(ArchSpaceError):
            SpaceSpec(**{**kw, **bad})
    with pytest.raises(ArchSpaceError, match="glb_bytes = 3145728"):
        ArchSpace.generate(SpaceSpec(**{**kw, "glb_bytes": (3 * MiB,)}))
