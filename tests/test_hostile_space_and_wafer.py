"""The second hostile pass (issue 44), what the first three left: a search space and the cost
model.  A space's values beyond the plausibility bounds of the hardware fields they become, or a
chip of it beyond the peak FLOP/s cap, are refused in one line naming the space file, the key,
the value and the bound, before any model is traced (they used to load, and the search crashed
with a traceback building the chip); what a space quotes of its input is an excerpt; and a die
that does not fit its wafer is refused in one line (it was a ValueError traceback), or, in a
space, left out of the search with one warning."""

from __future__ import annotations

import subprocess
import warnings

import pytest
from conftest import MODELS, ROOT, run_main

TINY = str(MODELS / "tiny_gpt2.py")
TINY_SPACE = ROOT / "tests" / "data" / "tiny_space.toml"
TPUV4 = ROOT / "phaze_ir" / "hw_presets" / "tpuv4.toml"


def one_error(r: subprocess.CompletedProcess) -> str:
    """The run failed with exactly one error line (progress lines aside) and no traceback."""
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if not line.startswith("phazec: ") or ": error: " in line]
    assert len(errors) == 1, r.stderr
    return errors[0]


def space_text(*edits: tuple[str, str]) -> str:
    """tests/data/tiny_space.toml with each ``(old, new)`` replaced once."""
    text = TINY_SPACE.read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text


def space_error(tmp_path, text: str) -> str:
    """The one-line message of loading the space ``text`` from tmp_path/space.toml (refused)."""
    from phaze.search.arch_space import ArchSpaceError, load_space

    file = tmp_path / "space.toml"
    file.write_text(text)
    with pytest.raises(ArchSpaceError) as info:
        load_space(file)
    message = str(info.value)
    assert "\n" not in message, message
    assert message.startswith(f"{file}: "), message
    return message.removeprefix(f"{file}: ")


#: A grid of two chips: one tensor core, and 16,384 of 16 x 256 (52,911 mm^2, more than a 300 mm
#: wafer takes), on the tpuv4 template (with its [manufacturing] table) and a budget of 1e6 mm^2.
TWO_CHIPS = """\
name = "two"
[template]
hardware = "tpuv4"
[area]
budget_mm2 = 1e6
lower_fraction = 0
[search]
num_tc = [1, 16384]
num_vc = [1]
width = [16]
depth = [256]
width_vc = "width"
glb_MiB = [8]
"""

#: tpuv4 with 16,384 tensor cores of 256 x 256: within every bound (2.25e18 FLOP/s), but a die of
#: 843,037 mm^2, which no 300 mm wafer holds.
HUGE_DIE = (
    TPUV4.read_text()
    .replace("count = 8\n", "count = 16384\n", 1)
    .replace("pe_x = 128", "pe_x = 256", 1)
    .replace("pe_y = 128", "pe_y = 256", 1)
    .replace("buffer_bytes = 262_144", "buffer_bytes = 1_048_576", 1)
)

WAFER = "a 300 mm wafer with 5 mm of edge loss ([manufacturing]), whose largest die is 8,094 mm^2"  # tpuv4's


# -- 1. a space's values within the bounds of the hardware fields they become ------------------


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ("num_tc = { min = 1, max = 8 }", "num_tc = [33554432]", "search.num_tc = 33554432"),
        ("num_tc = { min = 1, max = 8 }", "num_tc = { min = 1, max = 33554432 }", "search.num_tc = 33554432"),
        ("num_vc = [1, 4]", "num_vc = [1, 16777217]", "search.num_vc = 16777217"),
    ],
    ids=["num_tc", "num_tc-range", "num_vc"],
)
def test_a_core_count_beyond_its_bound_is_refused_with_the_key_the_value_and_the_bound(tmp_path, old, new, says):
    from phaze_ir.hardware import CORES

    text = space_text((old, new), ("budget_mm2 = 60.0", "budget_mm2 = 1e6"))
    assert space_error(tmp_path, text) == f"{says}: expected a positive integer at most 16777216 ({CORES.why})"


def test_an_hbm_option_beyond_its_bound_is_refused_in_the_keys_unit(tmp_path):
    from phaze.search.arch_space import loads_space
    from phaze_ir.hardware import HBM_BYTES

    message = space_error(tmp_path, space_text(("hbm_GiB = [32, 64]", "hbm_GiB = [32, 65537]")))
    assert message == f"search.hbm_GiB = 65537: expected a positive number at most 65536 ({HBM_BYTES.why})"
    assert loads_space(space_text(("hbm_GiB = [32, 64]", "hbm_GiB = [32, 65536]"))).hbm_options[1] == 2**46


def test_the_area_models_tables_still_speak_first_for_the_axes_they_limit(tmp_path):
    """PE arrays, vector widths and global buffers are limited more tightly by the area model's
    tables, whose message lists what they hold."""
    message = space_error(tmp_path, space_text(("glb_MiB = [8, 32]", "glb_MiB = [8, 8388608]")))
    assert message.startswith("search.glb_MiB = 8388608: expected a global buffer the area model lists (2 MiB,")


def test_core_counts_at_their_bound_are_accepted_and_built():
    from phaze.search.arch_space import loads_space

    # h100 has no [manufacturing] table: no wafer leaves the 115,674 mm^2 of 2^24 cores out.
    text = space_text(
        ('hardware = "tpuv4"', 'hardware = "h100"'),
        ("budget_mm2 = 60.0\nlower_fraction = 0.3", "budget_mm2 = 1e6\nlower_fraction = 0"),
        ("num_tc = { min = 1, max = 8 }", "num_tc = [16777216]"),
        ("num_vc = [1, 4]", "num_vc = [16777216]"),
        ("width = [16, 64]", "width = [1]"),
        ("depth = [16, 64]", "depth = [1]"),
        ("glb_MiB = [8, 32]", "glb_MiB = [8]"),
    )
    space = loads_space(text)
    assert len(space) == 1
    chip = space.accelerator(0, 2**46)
    assert chip.tensor_cores.count == chip.vector_cores.count == 2**24 and chip.hbm.bytes == 2**46


def test_the_budget_is_bounded_as_a_chips_area(tmp_path):
    from phaze.search.arch_space import ArchSpaceError, SpaceSpec
    from phaze_ir.hardware import AREA_MM2, load_hardware

    message = space_error(tmp_path, space_text(("budget_mm2 = 60.0", "budget_mm2 = 1e9")))
    assert message == f"area.budget_mm2 = 1000000000.0: expected a positive number at most 1e6 ({AREA_MM2.why})"
    with pytest.raises(ArchSpaceError, match=r"^SpaceSpec 'space': budget_um2 = 2000000000000\.0: expected a "):
        SpaceSpec(load_hardware("tpuv4"), (1,), (1,), (16,), (16,), "width", (8 * 2**20,), budget_um2=2e12)


def test_a_space_built_in_python_is_bounded_too():
    from phaze.search.arch_space import ArchSpace, ArchSpaceError, SpaceSpec
    from phaze_ir.hardware import load_hardware

    spec = SpaceSpec(load_hardware("h100"), (2**25,), (1,), (1,), (1,), "width", (8 * 2**20,), budget_um2=1e12)
    with pytest.raises(ArchSpaceError) as info:
        ArchSpace.generate(spec)
    assert str(info.value).startswith("SpaceSpec 'space': num_tc = 33554432: expected a positive integer at most")


def test_a_chip_whose_peak_passes_the_cap_is_refused_naming_its_values(tmp_path):
    from phaze_ir.hardware import FLOPS

    # 16,384 cores of 256 x 256 at 100 GHz: each value within its bound, 2.15e20 FLOP/s.
    text = space_text(
        ('hardware = "tpuv4"', 'hardware = "tpuv4"\nclock_hz = 1e11'),
        ("budget_mm2 = 60.0", "budget_mm2 = 1e6"),
        ("num_tc = { min = 1, max = 8 }", "num_tc = [16384]"),
        ("width = [16, 64]", "width = [256]"),
        ("depth = [16, 64]", "depth = [256]"),
    )
    assert space_error(tmp_path, text) == (
        "search.num_tc = 16384, search.width = 256, search.depth = 256: peak 2*num_tc*width*depth*clock_hz = "
        f"2.15e+20 FLOP/s (the template's clock_hz = 1e+11): expected at most 1e19 FLOP/s ({FLOPS.why})"
    )


def test_a_peak_past_the_cap_that_the_area_rule_leaves_out_is_not_refused():
    """The cap is checked on the chips the area rule keeps, not on the grid's corner."""
    from phaze.search.arch_space import loads_space

    text = space_text(
        ('hardware = "tpuv4"', 'hardware = "tpuv4"\nclock_hz = 1e11'),
        ("num_tc = { min = 1, max = 8 }", "num_tc = [1, 16384]"),
        ("width = [16, 64]", "width = [16, 256]"),
        ("depth = [16, 64]", "depth = [16, 256]"),
    )
    space = loads_space(text)
    assert len(space) > 0 and int(space.configs["num_tc"].max()) == 1


def test_phazec_refuses_a_space_beyond_the_bounds_in_one_line_before_tracing(tmp_path):
    space = tmp_path / "space.toml"
    space.write_text(
        space_text(("num_tc = { min = 1, max = 8 }", "num_tc = [33554432]"), ("budget_mm2 = 60.0", "budget_mm2 = 1e6"))
    )
    r = run_main("phazec", TINY, "--space", str(space), "--no-cache", "-o", str(tmp_path / "o.mlir"))
    assert one_error(r) == (
        f"phazec: error: {space}: search.num_tc = 33554432: expected a positive integer at most 16777216 "
        "(18x the 900,000 cores of Cerebras WSE-3, the largest chip built)"
    )
    assert "tracing" not in r.stderr and "preparing" not in r.stderr
    assert not (tmp_path / "o.mlir").exists()


# -- 2. what a space quotes of its input is an excerpt ---------------------------------------


def test_a_long_list_in_a_space_is_quoted_as_an_excerpt(tmp_path):
    values = ", ".join(["1"] * 200_000)
    message = space_error(tmp_path, space_text(("num_vc = [1, 4]", f"num_vc = [{values}]")))
    assert message == "search.num_vc = [" + "1, " * 26 + "1…: expected distinct values"


def test_a_long_string_in_a_space_is_quoted_as_an_excerpt(tmp_path):
    message = space_error(tmp_path, space_text(('width_vc = "width"', 'width_vc = "' + "w" * 900_000 + '"')))
    tie = 'expected values, or "width" / "depth" to tie it to that axis'
    assert message == 'search.width_vc = "' + "w" * 79 + "…: " + tie


def test_a_long_key_of_words_in_a_space_is_quoted_as_an_excerpt(tmp_path):
    """A quoted TOML key may hold blanks: it is cut as one without them is, and so is the key
    path the error carries."""
    from phaze.search.arch_space import ArchSpaceError, loads_space

    text = space_text(('name = "tiny"', 'name = "tiny"\n"' + "k " * 400_000 + '" = 1'))
    with pytest.raises(ArchSpaceError) as info:
        loads_space(text, source="space.toml")
    assert str(info.value) == (
        "space.toml: unknown key '" + "k " * 39 + "k…' (known keys: name, template, area, search)"
    )
    assert info.value.key_path == "k " * 40 + "…"


# -- 3. an error of the space's template hardware names the space file --------------------------


def test_a_template_override_beyond_its_bound_names_the_space_file():
    from phaze.search.arch_space import loads_space
    from phaze_ir.hardware import CORES, HardwareError

    text = space_text(('hardware = "tpuv4"', 'hardware = "tpuv4"\ntensor_cores.count = 33554432'))
    with pytest.raises(HardwareError) as info:
        loads_space(text, source="space.toml")
    assert str(info.value) == (
        "space.toml: template.tensor_cores.count = 33554432: expected a positive integer at most 16777216 "
        f"({CORES.why})"
    )


def test_a_candidate_that_cannot_be_built_names_the_space_and_the_candidate(tmp_path):
    """The space's checks keep its chips buildable; an HBM capacity given to ``accelerator`` is
    the caller's, and its refusal still names the space file and the chip, in one line."""
    from phaze.search.arch_space import ArchSpaceError, load_space

    space = load_space(TINY_SPACE)
    with pytest.raises(ArchSpaceError) as info:
        space.accelerator(0, hbm_bytes=2**47)
    message = str(info.value)
    assert message.startswith(f"{TINY_SPACE}: candidate 0, tiny:tc8x") and "-hbm131072GiB: HBM: bytes = " in message
    assert "\n" not in message


# -- 4. a die that does not fit its wafer ------------------------------------------------------


def test_the_largest_die_is_where_a_wafer_holds_one():
    from passes.algorithms.cost import die_fits, dies_per_wafer, max_die_mm2
    from phaze_ir.hardware import load_hardware

    mf = load_hardware("tpuv4").manufacturing
    largest = max_die_mm2(300.0, 5.0)
    assert largest == pytest.approx(8093.965, abs=1e-3)
    assert dies_per_wafer(largest, 300.0, 5.0) == pytest.approx(1.0, abs=1e-12)
    assert die_fits(mf, largest * (1 - 1e-9)) and not die_fits(mf, largest * (1 + 1e-9))
    assert die_fits(mf, [278.83, 8000.0, 8100.0, 843_037.0]).tolist() == [True, True, False, False]


def test_an_edge_loss_past_the_radius_leaves_no_room_for_a_die():
    """The formula counts dies again when the usable diameter is negative (a die of 100 mm^2
    would cost a fraction of its wafer): no die fits such a wafer."""
    import dataclasses

    from passes.algorithms.cost import die_fits, dies_per_wafer, max_die_mm2, unfit_die
    from phaze_ir.hardware import load_hardware

    mf = dataclasses.replace(load_hardware("tpuv4").manufacturing, edge_loss_mm=200.0)
    assert dies_per_wafer(100.0, 300.0, 200.0) > 1  # what the formula alone says
    assert not die_fits(mf, 100.0) and max_die_mm2(300.0, 200.0) == 0.0
    assert unfit_die(mf, 100.0) == "a 300 mm wafer with 200 mm of edge loss ([manufacturing]) has no room for a die"


def test_a_die_too_large_for_the_wafer_is_refused_in_one_line():
    from passes.algorithms.cost import check_die_fits, plan_cost
    from phaze_ir.hardware import HardwareError, loads_toml

    chip = loads_toml(HUGE_DIE, "hw.toml")  # within every bound
    says = (
        f"a die of 843,037 mm^2 does not fit {WAFER}: a chip that cannot be made has no cost (without the "
        "[manufacturing] table it is planned unpriced)"
    )
    with pytest.raises(HardwareError) as info:
        check_die_fits(chip, "hw.toml")
    assert str(info.value) == f"hw.toml: {says}"
    assert info.value.key_path == "manufacturing.wafer_diameter_mm"
    with pytest.raises(HardwareError) as info:  # a ValueError too, as before
        plan_cost(chip, 1, 1.0, None)
    assert str(info.value) == f"hardware 'tpuv4': {says}"
    check_die_fits(loads_toml(TPUV4.read_text(), "tpuv4.toml"))


def test_chips_of_a_space_too_large_for_the_wafer_are_left_out_with_one_warning():
    from phaze.search.arch_space import loads_space
    from phaze_ir.warning import PhazeWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        space = loads_space(TWO_CHIPS, source="two.toml")
    assert [str(w.message) for w in caught if issubclass(w.category, PhazeWarning)] == [
        "two.toml: 1 of 2 candidates within the area rule are left out, too large for the wafer: the smallest, "
        f"tc16384x16x256-vc1x16-glb8MiB: a die of 52,911 mm^2 does not fit {WAFER}"
    ]
    assert space.configs["num_tc"].tolist() == [1]
    # Without a [manufacturing] table there is no wafer: both chips are kept.
    h100 = loads_space(TWO_CHIPS.replace('hardware = "tpuv4"', 'hardware = "h100"'))
    assert h100.configs["num_tc"].tolist() == [1, 16384]


def test_a_space_none_of_whose_chips_fits_the_wafer_is_refused(tmp_path):
    text = TWO_CHIPS.replace("num_tc = [1, 16384]", "num_tc = [16384, 8192]")
    assert space_error(tmp_path, text) == (
        "no candidate can be made, each too large for the wafer: the smallest within the area rule, "
        f"tc8192x16x256-vc1x16-glb8MiB: a die of 26,462 mm^2 does not fit {WAFER}"
    )


def test_phazec_refuses_a_space_none_of_whose_chips_fits_the_wafer_before_tracing(tmp_path):
    space = tmp_path / "space.toml"
    space.write_text(TWO_CHIPS.replace("num_tc = [1, 16384]", "num_tc = [16384]"))
    r = run_main("phazec", TINY, "--space", str(space), "--no-cache", "-o", str(tmp_path / "o.mlir"))
    line = one_error(r)
    assert line.startswith(f"phazec: error: {space}: no candidate can be made, each too large for the wafer: ")
    assert "tracing" not in r.stderr and "preparing" not in r.stderr


def test_phazec_says_once_which_chips_of_a_space_the_wafer_leaves_out_and_searches_the_rest(tmp_path):
    space = tmp_path / "space.toml"
    space.write_text(TWO_CHIPS)
    out = tmp_path / "o.mlir"
    args = ["--no-cache", "--no-baselines", "-q", "--tp", "1", "--micro-batch", "1", "--devices", "8"]
    r = run_main("phazec", TINY, "--space", str(space), *args, "--global-batch", "8", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    said = [line for line in r.stderr.splitlines() if "warning" in line or "tc16384" in line]
    assert said == [
        f"phazec: warning: {space}: 1 of 2 candidates within the area rule are left out, too large for the "
        f"wafer: the smallest, tc16384x16x256-vc1x16-glb8MiB: a die of 52,911 mm^2 does not fit {WAFER}"
    ], r.stderr
    assert "two:tc1x16x256-vc1x16-glb8MiB-hbm32GiB" in out.read_text()  # -q: the answer is in the file


def test_phazec_refuses_a_hardware_file_whose_die_does_not_fit_its_wafer_in_one_line(tmp_path):
    hw = tmp_path / "hw.toml"
    hw.write_text(HUGE_DIE)
    line = one_error(run_main("phazec", TINY, "--hw", str(hw), "--no-cache", "-o", str(tmp_path / "o.mlir")))
    assert line.startswith(f"phazec: error: {hw}: a die of 843,037 mm^2 does not fit {WAFER}")
