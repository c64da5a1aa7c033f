"""The second hostile pass (issue 44), its messages: each bad input gives one line that names
what is wrong, before any work, quoting at most a short excerpt of the input; no traceback.

A TOML with a byte-order mark is read as the CSV reader reads one; absurd hardware figures are
refused against bounds (each a real chip's figure times a generous factor) while every preset
and every chip of the search spaces stays accepted; a name of megabytes is cut to 80
characters and "…"; a syntax error names the real file, line and column; a placement option
is named as the user set it, not as the DP's field."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import EXAMPLES, MODELS, ROOT, compiled

from phaze_ir.files import EXCERPT_CHARS, excerpt, shorten

BOM = "\ufeff"
TINY_SPACE = ROOT / "tests" / "data" / "tiny_space.toml"


def hw_error(text: str) -> str:
    """The one-line message of loading the hardware TOML ``text`` (it must be refused)."""
    from phaze_ir.hardware import HardwareError, loads_toml

    with pytest.raises(HardwareError) as info:
        loads_toml(text, "hw.toml")
    message = str(info.value)
    assert "\n" not in message, message
    return message


def preset_text(name: str) -> str:
    return (ROOT / "phaze_ir" / "hw_presets" / f"{name}.toml").read_text()


# -- 1. a byte-order mark --------------------------------------------------------------------


def test_a_hardware_toml_starting_with_a_byte_order_mark_is_read(tmp_path):
    from phaze_ir.hardware import load_hardware

    file = tmp_path / "bom.toml"
    file.write_text(BOM + preset_text("tpuv4"), encoding="utf-8")
    assert file.read_bytes().startswith(b"\xef\xbb\xbf")
    assert load_hardware(str(file)) == load_hardware("tpuv4")


def test_a_base_starting_with_a_byte_order_mark_is_read(tmp_path):
    from phaze_ir.hardware import load_hardware

    (tmp_path / "chip.toml").write_text(BOM + preset_text("tpuv4"), encoding="utf-8")
    (tmp_path / "variant.toml").write_text(BOM + 'name = "variant"\nbase = "chip.toml"\n', encoding="utf-8")
    variant = load_hardware(str(tmp_path / "variant.toml"))
    assert variant == dataclasses.replace(load_hardware("tpuv4"), name="variant")


def test_a_space_toml_starting_with_a_byte_order_mark_is_read(tmp_path):
    from phaze.search.arch_space import load_space

    file = tmp_path / "tiny_space.toml"
    file.write_text(BOM + TINY_SPACE.read_text(), encoding="utf-8")
    with_bom, without = load_space(file), load_space(TINY_SPACE)
    assert np.array_equal(with_bom.configs, without.configs)
    assert with_bom.hbm_options == without.hbm_options


def test_a_byte_order_mark_elsewhere_is_still_a_syntax_error():
    message = hw_error(preset_text("tpuv4").replace("\n[tensor_cores]", f"\n{BOM}[tensor_cores]", 1))
    assert message.startswith("hw.toml: TOML syntax error: ")


# -- 2. plausibility bounds ---------------------------------------------------------------------


def test_pe_x_of_2_63_minus_1_is_refused_naming_the_field_its_value_and_the_bound():
    from phaze_ir.hardware import ARRAY_SIDE

    text = preset_text("tpuv4").replace("pe_x = 128", "pe_x = 9223372036854775807", 1)
    assert hw_error(text) == (
        "hw.toml: tensor_cores.pe_x = 9223372036854775807: expected a positive integer at most 65536 "
        f"({ARRAY_SIDE.why})"
    )


def _bounded_fields(data: dict) -> list[tuple[tuple, object]]:
    """(path in ``data``, bound) of every field of ``data`` (a preset's dict) that has one."""
    from phaze_ir import hardware as H

    out: list[tuple[tuple, object]] = []

    def walk(cls: type, table: dict, path: tuple) -> None:
        for f in dataclasses.fields(cls):
            if f.name not in table:
                continue
            if f.metadata.get("at_most") is not None:
                out.append(((*path, f.name), f.metadata["at_most"]))
            elif f.name == "protocols":
                for i, protocol in enumerate(table[f.name]):
                    walk(H.NetworkProtocol, protocol, (*path, f.name, i))

    walk(H.Accelerator, data, ())
    for key, cls in H._TABLES.items():
        if key in data:
            walk(cls, data[key], (key,))
    for i, level in enumerate(data["network"]):
        walk(H.NetworkLevel, level, ("network", i))
    return out


def _dotted(path: tuple) -> str:
    return "".join(f"[{k}]" if isinstance(k, int) else ("." if i else "") + k for i, k in enumerate(path))


def _replaced(data: dict, path: tuple, value: object) -> dict:
    out = json.loads(json.dumps(data))
    node = out
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return out


@pytest.mark.parametrize("preset", ["a100", "h100"])
def test_every_bounded_field_over_its_bound_is_refused_with_one_line(preset):
    """Every bounded field of the preset (each table, the network's levels and protocols), set
    just over its bound, is refused with the file, the field's path, the value and the bound."""
    from phaze_ir.hardware import Accelerator, HardwareError, load_hardware

    data = load_hardware(preset).to_dict()
    fields = _bounded_fields(data)
    assert len(fields) >= 40, [_dotted(p) for p, _ in fields]  # every table of a real chip's preset
    for path, bound in fields:
        if path[-1] == "sram_j_per_byte":  # a table: its entries are bounded
            value: object = {"8192": bound.value * 2}
            shown, where = _dotted(path) + ".8192", "2e-8"
        elif isinstance(bound.value, int):
            value = bound.value + 1
            shown, where = _dotted(path), str(value)
        else:
            value = bound.value * 2
            shown, where = _dotted(path), None
        with pytest.raises(HardwareError) as info:
            Accelerator.from_dict(_replaced(data, path, value), source="hw.toml")
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith(f"hw.toml: {shown} = {where or ''}"), message
        assert f" at most {bound.text()} ({bound.why})" in message, message


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("clock_hz = 1.05e9", "clock_hz = 1e11"),
        ("pe_x = 128", "pe_x = 65536"),
        ("count = 8", "count = 16384"),
        ("bytes = 34_359_738_368", "bytes = 70_368_744_177_664"),  # HBM: 2^46
        ("bytes = 134_217_728", "bytes = 4_398_046_511_104"),  # global buffer: 2^42
        ("power_w = 192", "power_w = 1e6"),
    ],
    ids=["clock", "pe_x", "tensor_cores", "hbm", "global_buffer", "power"],
)
def test_a_value_at_its_bound_is_accepted(old, new):
    from phaze_ir.hardware import loads_toml

    text = preset_text("tpuv4")
    assert old in text
    loads_toml(text.replace(old, new, 1), "hw.toml")


def test_a_chip_whose_peak_flops_pass_the_bound_is_refused_though_each_factor_is_within_its_own():
    from phaze_ir.hardware import FLOPS

    # 2^24 tensor cores of 16 x 16 at 1.41 GHz: each factor within its bound, 1.21e19 FLOP/s.
    text = preset_text("a100").replace("count = 432", "count = 16777216", 1)
    assert hw_error(text) == (
        "hw.toml: tensor_cores: peak 2*count*pe_x*pe_y*clock_hz = 1.21e+19 FLOP/s: "
        f"expected at most 1e19 FLOP/s ({FLOPS.why})"
    )


def test_a_bound_is_checked_when_a_chip_is_built_in_python_too():
    from phaze_ir.hardware import HBM, HardwareError

    with pytest.raises(HardwareError, match=r"^HBM: bytes = 70368744177665: expected a positive integer at most"):
        HBM(bytes=2**46 + 1, bandwidth_Bps=1e12)


def test_every_preset_and_example_description_is_within_the_bounds():
    from phaze_ir.hardware import load_hardware, preset_names

    assert preset_names()
    for name in preset_names():
        load_hardware(name)
    for file in sorted((EXAMPLES / "hw").glob("*.toml")):
        load_hardware(str(file))


def _spaces():
    from phaze.search.arch_space import load_space, paper_space

    files = sorted((ROOT / "tests" / "data").glob("*.toml")) + sorted((EXAMPLES / "spaces").glob("*.toml"))
    return [("default", paper_space())] + [(file.name, load_space(file)) for file in files]


def test_every_chip_of_the_search_spaces_is_within_the_bounds():
    """The default space (the paper's 29,360 chips: the reference's phaze_cores.json, which
    tests/test_arch_space.py checks row by row), tests/data's and the examples': every column
    of every space within its field's bound, the peak FLOP/s of every chip within theirs, and
    each space's extreme chips (the largest of each column, the highest peaks) built with each
    of its HBM capacities."""
    from phaze_ir import hardware as H

    columns = {
        "num_tc": H.CORES,
        "num_vc": H.CORES,
        "width": H.ARRAY_SIDE,
        "depth": H.ARRAY_SIDE,
        "width_vc": H.ARRAY_SIDE,
        "glb_bytes": H.SRAM_BYTES,
        "tc_buffer_bytes": H.CORE_BUFFER,
        "vc_buffer_bytes": H.CORE_BUFFER,
    }
    spaces = _spaces()
    assert len(spaces) >= 4 and len(spaces[0][1]) == 29_360
    for name, space in spaces:
        c = space.configs
        for column, bound in columns.items():
            assert int(c[column].max()) <= bound.value, (name, column)
        assert max(space.hbm_options) <= H.HBM_BYTES.value, name
        clock = space.spec.template.clock_hz
        tensor = 2.0 * c["num_tc"] * c["width"] * c["depth"] * clock
        vector = 1.0 * c["num_vc"] * c["width_vc"] * clock
        assert tensor.max() <= H.FLOPS.value and vector.max() <= H.FLOPS.value, name
        extremes = {int(np.argmax(c[column])) for column in columns} | {int(np.argmax(tensor)), int(np.argmax(vector))}
        for i in sorted(extremes):
            for hbm in space.hbm_options:
                assert space.accelerator(i, hbm).hbm.bytes == hbm


def test_the_field_bounds_are_documented_beside_the_fields():
    """Each bound says why it is what it is (a real chip's figure times a factor), and the
    refusal quotes that."""
    from phaze_ir import hardware as H

    bounds = {name: value for name, value in vars(H).items() if isinstance(value, H.Bound)}
    assert len(bounds) >= 20
    for name, bound in bounds.items():
        assert bound.why and bound.value > 0, name
    assert H.field_bound(H.TensorCores, "pe_x") is H.ARRAY_SIDE
    assert H.field_bound(H.NetworkLevel, "name") is None


# -- 3. excerpts of the input ------------------------------------------------------------------


def test_an_excerpt_is_80_characters_and_an_ellipsis():
    assert EXCERPT_CHARS == 80
    assert excerpt("a" * 80) == "a" * 80
    assert excerpt("a" * 81) == "a" * 80 + "…"
    assert excerpt("b" * 2_000_000) == "b" * 80 + "…"
    # A message written elsewhere: its long words cut, an excerpt already cut left as it is.
    assert shorten("Operation " + "c" * 2_000_000 + " is not registered") == (
        "Operation " + "c" * 80 + "… is not registered"
    )
    assert shorten("unknown '" + "d" * 80 + "…';") == "unknown '" + "d" * 80 + "…';"
    assert len(shorten(" ".join(["%x"] * 1_000_000))) == 1001


MB2 = 2_000_000


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ('"' + "a" * MB2 + '"() : () -> ()', "Operation " + "a" * 80 + "… is not registered"),
        ("a" * MB2 + ".foo", "Operation " + "a" * 80 + "… is not registered"),
        ('"test.op"() {x = !' + "a" * MB2 + "} : () -> ()", "undefined symbol alias '!" + "a" * 78 + "…"),
        ('"test.op"(%' + "a" * MB2 + ") : (i32) -> ()", "values used but not defined: [%" + "a" * 78 + "…"),
        ('"test.op"() {x = #phaze.' + "a" * MB2 + "} : () -> ()", "'phaze." + "a" * 73 + "…"),
    ],
    ids=["op-name", "bare-op-name", "type-alias", "value", "phaze-attribute"],
)
def test_a_2mb_identifier_in_mlir_is_echoed_as_an_excerpt(tmp_path, capsys, body, says):
    from phaze.tools import phaze_opt

    file = tmp_path / "big.mlir"
    file.write_text('"builtin.module"() ({ ' + body + " }) : () -> ()\n")
    assert phaze_opt.main([str(file)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    first = err.splitlines()[0]
    assert first.startswith(f"{file}:") and says in first, first[:400]
    assert len(err) < 1500, len(err)


def test_a_2mb_key_in_a_hardware_toml_is_echoed_as_an_excerpt():
    text = preset_text("tpuv4").replace('name = "tpuv4"', "k" * 900_000 + ' = 1\nname = "tpuv4"', 1)
    assert hw_error(text).startswith("hw.toml: unknown key '" + "k" * 80 + "…' (known keys: name, clock_hz,")


def test_a_long_string_value_in_a_hardware_toml_is_echoed_as_an_excerpt():
    text = preset_text("tpuv4").replace("clock_hz = 1.05e9", 'clock_hz = "' + "y" * 900_000 + '"', 1)
    assert hw_error(text) == (
        'hw.toml: clock_hz = "'
        + "y" * 79
        + "…: expected a positive number (got a string; units are in the key name, write a bare number)"
    )


def test_a_long_preset_name_is_echoed_as_an_excerpt():
    from phaze_ir.hardware import HardwareError, load_hardware

    with pytest.raises(HardwareError) as info:
        load_hardware("q" * 900_000)  # too long for a file name, too
    assert str(info.value).startswith("unknown hardware preset '" + "q" * 80 + "…'; known presets: a100,")


def test_a_long_key_in_a_space_toml_is_echoed_as_an_excerpt(tmp_path):
    from phaze.search.arch_space import ArchSpaceError, load_space

    file = tmp_path / "space.toml"
    file.write_text(TINY_SPACE.read_text().replace('name = "tiny"', 'name = "tiny"\n' + "s" * 900_000 + " = 1"))
    with pytest.raises(ArchSpaceError) as info:
        load_space(file)
    assert str(info.value).startswith(f"{file}: unknown key '" + "s" * 79 + "…")
    assert len(str(info.value)) < 300


def test_an_integer_of_5000_digits_in_a_hardware_toml_is_one_line():
    text = preset_text("tpuv4").replace("pe_x = 128", "pe_x = " + "9" * 5000, 1)
    line = 1 + text.splitlines().index("pe_x = " + "9" * 5000)
    assert hw_error(text) == f"hw.toml: TOML syntax error: an integer of more than 4300 digits (at line {line})"


def test_a_size_table_key_of_5000_digits_is_refused_against_the_sram_bound():
    text = preset_text("tpuv4").replace("sram_j_per_byte = { ", "sram_j_per_byte = { " + "9" * 5000 + " = 1e-12, ", 1)
    message = hw_error(text)
    assert message.startswith("hw.toml: energy.sram_j_per_byte." + "9" * 80 + "… = ")
    assert message.endswith(
        ": expected a capacity at most 4398046511104 bytes (100x the 44 GB of SRAM of Cerebras WSE-3)"
    )


def test_a_long_placement_option_is_echoed_as_an_excerpt():
    from passes.algorithms import placement as pl

    with pytest.raises(pl.PlacementError) as info:
        pl.parse_zero("z" * 100_000)
    assert str(info.value) == "zero '" + "z" * 80 + "…': expected one of auto, 0, 1, 2, 3"


# -- 4. a syntax error in a model file ---------------------------------------------------------


def _load_error(path: Path) -> str:
    from phaze_ir.errors import PhazeError
    from phaze_ir.frontend.loader import load_model_file

    with pytest.raises(PhazeError) as info:
        load_model_file(path)
    message = str(info.value)
    assert "\n" not in message and "None" not in message, message
    return message


def test_a_syntax_error_names_the_model_file_line_and_column(tmp_path):
    model = tmp_path / "model.py"
    model.write_text("x = 1\ndef f(:\n    pass\n")
    assert re.fullmatch(r"model\.py:2:7: syntax error: .+", _load_error(model))


def test_a_file_with_nul_bytes_is_located_at_its_first_nul(tmp_path):
    binary = tmp_path / "binary.py"
    binary.write_bytes(b"x = 1\ny = 2\x00\x01\x02\xff\n")
    assert _load_error(binary) == "binary.py:2:6: syntax error: source code string cannot contain null bytes"


def test_a_syntax_error_in_an_imported_helper_names_the_helper(tmp_path):
    (tmp_path / "hostile3_helper_syntax.py").write_text("def g(:\n")
    model = tmp_path / "model.py"
    model.write_text("import hostile3_helper_syntax\n")
    message = _load_error(model)
    assert re.fullmatch(r"hostile3_helper_syntax\.py:1:7: syntax error: .+ \(imported by model\.py\)", message)


def test_an_imported_helper_with_nul_bytes_is_named_by_the_models_import_line(tmp_path):
    (tmp_path / "hostile3_helper_nul.py").write_bytes(b"x = 1\x00\n")
    model = tmp_path / "model.py"
    model.write_text("y = 2\nimport hostile3_helper_nul\n")
    assert _load_error(model) == (
        "model.py:2: syntax error in a module the model file imports: source code string cannot contain null bytes"
    )


def test_a_syntax_error_in_code_the_model_compiles_names_the_models_line(tmp_path):
    model = tmp_path / "model.py"
    model.write_text("y = 2\nexec('def (')\n")
    assert re.fullmatch(
        r"model\.py:2: syntax error in code the model file compiles: .+ \(at line 1 of the code it compiles\)",
        _load_error(model),
    )


def test_a_model_raising_with_a_2mb_message_is_one_short_line(tmp_path):
    model = tmp_path / "model.py"
    model.write_text(f"raise ValueError('{'m' * MB2}')\n")
    assert _load_error(model) == ("model.py:1: error while importing the model file: ValueError: " + "m" * 80 + "…")


# -- 5. the names the user typed, not internal ones -------------------------------------------


def test_devices_beyond_the_flags_bound_are_named_as_an_option_not_as_the_dps_field():
    from passes.algorithms import placement as pl
    from passes.algorithms.placement_options import PlacementOptions
    from passes.algorithms.priced_step import PricedStep

    empty = PricedStep([], micro_batch=1, tp=1)
    with pytest.raises(pl.PlacementError) as info:
        pl.problem(
            empty, PlacementOptions(devices=2**64, global_batch=1), hbm_bytes=1, levels=[], memory_bound_Bps=1e12
        )
    assert str(info.value) == "devices = 18446744073709551616: expected a positive integer up to 2.15 G (2,147,483,647)"
    with pytest.raises(pl.PlacementError) as info:
        pl.problem(
            empty, PlacementOptions(devices=8, global_batch=2**32), hbm_bytes=1, levels=[], memory_bound_Bps=1e12
        )
    assert str(info.value) == "global batch = 4294967296: expected a positive integer up to 2.15 G (2,147,483,647)"


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (
            "parse_placement",
            "expert:1,99999999999999999999999,1",
            "placement 'expert:1,99999999999999999999999,1': PP, DP and TP must be from 1 to 2147483647",
        ),
        (
            "parse_pipeline_schedule",
            "interleaved:99999999999999999999999",
            "pipeline schedule 'interleaved:99999999999999999999999': expected interleaved:V with V at most 2147483647",
        ),
        (
            "parse_expert_parallel",
            "9" * 5000,
            "expert parallel '" + "9" * 80 + "…': expected auto or a degree from 1 to 2147483647",
        ),
        ("parse_expert_parallel", "²", "expert parallel '²': expected auto or a degree from 1 to 2147483647"),
    ],
    ids=["placement", "interleaved", "expert-parallel-5000-digits", "expert-parallel-superscript"],
)
def test_a_placement_option_too_large_for_the_dp_is_one_line(parse, text, message):
    from passes.algorithms import placement as pl

    with pytest.raises(pl.PlacementError) as info:
        getattr(pl, parse)(text, "model") if parse == "parse_placement" else getattr(pl, parse)(text)
    assert str(info.value) == message


def test_phaze_opt_names_the_pass_option_not_the_dps_field(tmp_path, capsys):
    from phaze.tools import phaze_opt

    file = tmp_path / "recompute.mlir"
    file.write_text(compiled(str(MODELS / "tiny_gpt2.py"), "recompute"))
    for option, says in [
        ("devices=18446744073709551616", "devices=18446744073709551616: expected a positive integer up to"),
        ("global_batch=18446744073709551616", "global_batch=18446744073709551616: expected a positive integer"),
        ('placement="expert:1,99999999999999999999999,1"', "PP, DP and TP must be from 1 to 2147483647"),
    ]:
        assert phaze_opt.main([str(file), "-p", f"phaze-place-devices{{{option}}}"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("phaze-opt: error: phaze-place-devices: ") and says in err, err
        assert len(err.splitlines()) == 1 and "problem." not in err, err
