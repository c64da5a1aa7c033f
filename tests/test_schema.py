"""The TOML files' schema (pydantic, phaze_ir/schema.py): the committed JSON Schemas are what
the code generates, and pydantic's errors come out in the files' own one-line words."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from phaze.search import arch_space
from phaze.search.arch_space import ArchSpaceError, loads_space
from phaze_ir import hardware
from phaze_ir.hardware import HardwareError, dumps_toml, load_hardware, loads_toml, preset_names

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = {
    "hardware": ("phaze_ir.hardware", hardware.schema),
    "space": ("phaze.search.arch_space", arch_space.schema),
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_committed_json_schema_is_the_generated_one(name):
    """docs/schema/*.schema.json cannot drift from the declarations: regenerate with
    ``python -m <module> --json-schema > docs/schema/<name>.schema.json``."""
    committed = (ROOT / "docs" / "schema" / f"{name}.schema.json").read_text()
    assert committed == SCHEMAS[name][1]().json_schema_text(), (
        f"docs/schema/{name}.schema.json is stale: python -m {SCHEMAS[name][0]} --json-schema > "
        f"docs/schema/{name}.schema.json"
    )


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_the_module_entry_writes_the_schema(name):
    out = subprocess.run(
        [sys.executable, "-m", SCHEMAS[name][0], "--json-schema"], capture_output=True, text=True, cwd=ROOT, check=True
    )
    assert out.stdout == SCHEMAS[name][1]().json_schema_text()
    assert json.loads(out.stdout)["$schema"].startswith("https://json-schema.org/")


def test_every_field_is_in_the_json_schema_with_its_bound_and_unit():
    """One declaration per field: each dataclass field is a property, its bound a maximum."""
    import dataclasses

    doc = hardware.schema().json_schema()
    tc = doc["$defs"]["TensorCores"]
    assert set(tc["properties"]) == {f.name for f in dataclasses.fields(hardware.TensorCores)}
    assert tc["required"] == ["count", "pe_x", "pe_y"] and tc["additionalProperties"] is False
    pe_x = tc["properties"]["pe_x"]
    assert pe_x["maximum"] == hardware.ARRAY_SIDE.value and pe_x["x-bound"] == hardware.ARRAY_SIDE.why
    assert pe_x["multipleOf"] == 1 and pe_x["exclusiveMinimum"] == 0
    assert doc["$defs"]["HBM"]["properties"]["bandwidth_Bps"]["x-unit"] == "bytes/s"
    top = {f.name for f in dataclasses.fields(hardware.Accelerator)} | {"base"}
    assert set(doc["properties"]) == top
    # The space's [template] takes any hardware key, each optional.
    space = arch_space.schema().json_schema()
    template = space["$defs"]["Template"]
    assert {"hardware", "clock_hz", "tensor_cores"} <= set(template["properties"])
    assert "required" not in space["$defs"]["TensorCoresOverride"]


def _validator():
    from pydantic_core import SchemaValidator

    return SchemaValidator(hardware.schema().core_schema())


@pytest.mark.parametrize("preset", preset_names())
def test_the_presets_pass_the_schema(preset):
    from phaze_ir.files import read_regular

    data = hardware.parse_toml(read_regular(hardware.preset_path(preset), 2**20, "TOML").decode(), preset)
    data.pop("base", None)
    if "tensor_cores" in data:  # (a description with a base lacks its base's tables)
        _validator().validate_python(data)
    again = load_hardware(preset)
    assert loads_toml(dumps_toml(again)) == again


H100 = load_hardware("h100").to_dict()


def _with(**tables) -> dict:
    data = json.loads(json.dumps(H100))
    for key, value in tables.items():
        data[key] = value
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # A wrong type, named with its table and key, the value as TOML writes it.
        (
            _with(tensor_cores={"count": 1, "pe_x": "256", "pe_y": 2}),
            'f.toml: tensor_cores.pe_x = "256": expected a positive integer (got a string; units are in the key '
            "name, write a bare number)",
        ),
        # Beyond its plausibility bound: the bound and why.
        (
            _with(tensor_cores={"count": 1, "pe_x": 2**63 - 1, "pe_y": 2}),
            "f.toml: tensor_cores.pe_x = 9223372036854775807: expected a positive integer at most 65536 "
            f"({hardware.ARRAY_SIDE.why})",
        ),
        # An unknown key is refused before the table's fields, with the closest known key.
        (
            _with(hbm={"bytes": "x", "bandwith_Bps": 1e12}),
            "f.toml: unknown key 'hbm.bandwith_Bps' (did you mean 'bandwidth_Bps'?)",
        ),
        # A missing table, and the first in the file's order of several errors.
        ({"name": "x", "clock_hz": True}, "f.toml: clock_hz = true: expected a positive number (got a boolean)"),
        (
            {"name": "x", "clock_hz": 1e9},
            "f.toml: missing required key 'tensor_cores' (a table with count, pe_x, pe_y, buffer_bytes, fp8_rate)",
        ),
        # Inside an array of tables: the level's index.
        (
            _with(network=[H100["network"][0], {**H100["network"][1], "latency_s": -1}]),
            "f.toml: network[1].latency_s = -1: expected a non-negative number",
        ),
        (
            _with(network=[]),
            "f.toml: network = [...] (an array): expected one or more [[network]] levels (an array of tables)",
        ),
        ([1, 2], "f.toml: hardware description = [1, 2]: expected a table"),
    ],
)
def test_pydantic_errors_in_todays_words(data, message):
    with pytest.raises(HardwareError) as info:
        hardware.Accelerator.from_dict(data, source="f.toml")
    assert str(info.value) == message
    assert "\n" not in str(info.value)


def test_a_numpy_scalar_the_fields_check_takes_stands():
    """A Python caller's numpy values: where the field's own check takes what the schema
    refused, the value stands (TOML cannot hold them)."""
    import numpy as np

    level = dict(H100["network"][1], tree=np.bool_(True))
    acc = hardware.Accelerator.from_dict(_with(network=[H100["network"][0], level]))
    assert acc.network[1].tree is True


SPACE = """
name = "s"
[template]
hardware = "tpuv4"
[area]
budget_mm2 = 300
[search]
num_tc = [1, 2]
num_vc = 1
width = { min = 128, max = 256 }
depth = 128
width_vc = "width"
glb_MiB = [32]
"""


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("num_vc = 1", "num_vc = 1.5"), "<string>: search.num_vc = 1.5: expected a positive integer"),
        (("[area]", "[area]\nbudget = 3"), "<string>: unknown key 'area.budget' (did you mean 'budget_of'?)"),
        (
            ("depth = 128\n", ""),
            "<string>: missing required key 'search.depth' (an integer, a list, or {min = a, max = b})",
        ),
        (
            ('width_vc = "width"', 'width_vc = "widht"'),
            '<string>: search.width_vc = "widht": expected values, or "width" / "depth" to tie it to that axis',
        ),
        (('name = "s"', "name = 3"), "<string>: name = 3: expected a non-empty string"),
        (('[template]\nhardware = "tpuv4"', 'template = "tpuv4"'), '<string>: template = "tpuv4": expected a table'),
    ],
)
def test_space_errors_in_todays_words(edit, message):
    with pytest.raises(ArchSpaceError) as info:
        loads_space(SPACE.replace(*edit))
    assert str(info.value) == message
