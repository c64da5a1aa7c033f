"""The hardware description: presets, derived quantities, round trips, and every error message."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from phaze_ir.hardware import (
    HBM,
    Accelerator,
    GiB,
    GlobalBuffer,
    HardwareError,
    MiB,
    NetworkLevel,
    TensorCores,
    VectorCores,
    dumps_toml,
    load_hardware,
    loads_toml,
    preset_names,
)

REPO = Path(__file__).resolve().parents[1]

# A minimal valid hardware file; the error tests below mutate one piece of it.
BASE = """\
name = "chip"
clock_hz = 1e9
bytes_per_element = 2

[tensor_cores]
count = 4
pe_x = 32
pe_y = 32

[vector_cores]
count = 2
width = 64

[global_buffer]
bytes = 8_388_608
bandwidth_Bps = 1e12

[hbm]
bytes = 32e9
bandwidth_Bps = 1.2e12

[[network]]
name = "node"
group_size = 8
bandwidth_Bps = 300e9
latency_s = 2e-6

[[network]]
name = "cluster"
group_size = 1024
bandwidth_Bps = 25e9
latency_s = 5e-6
"""


def test_base_file_is_valid() -> None:
    acc = loads_toml(BASE, source="chip.toml")
    assert acc.tensor_cores == TensorCores(count=4, pe_x=32, pe_y=32, buffer_bytes=16 * 32 * 32)
    assert acc.hbm.bytes == 32_000_000_000 and isinstance(acc.hbm.bytes, int)  # integral float accepted
    assert acc.network[1] == NetworkLevel("cluster", 1024, 25e9, 5e-6)


# --------------------------------------------------------------------------------------------
# Presets
# --------------------------------------------------------------------------------------------


def test_preset_names() -> None:
    assert {"tpuv4", "a100", "h100"} <= set(preset_names())


@pytest.mark.parametrize("name", ["tpuv4", "a100", "h100", "h100_hbm2e", "a100_40gb", "tpuv4_torus"])
def test_preset_round_trips(name: str) -> None:
    acc = load_hardware(name)
    assert acc.name == name
    d = acc.to_dict()
    assert Accelerator.from_dict(d) == acc
    assert Accelerator.from_dict(json.loads(json.dumps(d))) == acc  # JSON-able
    assert loads_toml(dumps_toml(acc)) == acc
    # Stable key order: scalars, then tables, then the network.
    keys = [k for k in d if k not in ("power_w", "cost_usd", "area_mm2")]
    assert keys == [
        "name",
        "clock_hz",
        "bytes_per_element",
        "tensor_cores",
        "vector_cores",
        "global_buffer",
        "hbm",
        *(["calibration"] if acc.calibration is not None else []),
        *(["energy"] if acc.energy is not None else []),
        *(["manufacturing", "deployment"] if acc.manufacturing is not None else []),
        "network",
    ]
    assert list(d["tensor_cores"]) == ["count", "pe_x", "pe_y", "buffer_bytes"]
    assert list(d["network"][0])[:4] == ["name", "group_size", "bandwidth_Bps", "latency_s"]
    # Types are normalised, so that the dict (and an IR attribute made from it) is canonical.
    assert isinstance(d["clock_hz"], float) and isinstance(d["hbm"]["bytes"], int)


@pytest.mark.parametrize("name", ["tpuv4", "a100", "h100", "h100_hbm2e", "a100_40gb", "tpuv4_torus"])
def test_examples_hw_links_to_presets(name: str) -> None:
    assert load_hardware(REPO / "examples" / "hw" / f"{name}.toml") == load_hardware(name)
    assert (REPO / "examples" / "hw" / f"{name}.toml").read_bytes() == (
        REPO / "phaze_ir" / "hw_presets" / f"{name}.toml"
    ).read_bytes()


@pytest.mark.parametrize("name", ["h100_hbm2e", "a100_40gb", "tpuv4_torus"])
def test_a_preset_on_a_base_keeps_every_key_of_a_table_it_replaces(name: str) -> None:
    """A table a variant gives replaces its base's whole (``base =``): a key the variant leaves
    out is not the base's but the default, silently (h100_hbm2e once priced its FP8 backward
    GEMMs at full rate and its attention at the GEMM efficiency, having left out two keys)."""
    import tomllib

    presets = REPO / "phaze_ir" / "hw_presets"
    variant = tomllib.loads((presets / f"{name}.toml").read_text())
    base = tomllib.loads((presets / f"{variant['base']}.toml").read_text())
    for table, keys in base.items():
        if isinstance(keys, dict) and isinstance(variant.get(table), dict):
            assert set(keys) <= set(variant[table]), f"[{table}] lacks {sorted(set(keys) - set(variant[table]))}"


def test_a_description_with_a_base(tmp_path: Path) -> None:
    """``base = PRESET|PATH``: the file's top-level keys replace the base's, the rest is the
    base's (a chip on another network, written once); a base of a base works; a base must not
    lead back to the file, and the file must name itself."""
    (tmp_path / "slow.toml").write_text(
        'base = "a100"\nname = "a100-slow"\n[[network]]\nname = "flat"\ngroup_size = 4096\n'
        "bandwidth_Bps = 1e9\nlatency_s = 1e-5\n"
    )
    slow = load_hardware(tmp_path / "slow.toml")
    a100 = load_hardware("a100")
    assert slow.network == (NetworkLevel("flat", 4096, 1e9, 1e-5),)
    assert dataclasses.replace(slow, name="a100", network=a100.network) == a100
    (tmp_path / "hot.toml").write_text('base = "slow.toml"\nname = "hot"\nclock_hz = 2e9\n')
    hot = load_hardware(tmp_path / "hot.toml")
    assert (hot.name, hot.clock_hz, hot.network) == ("hot", 2e9, slow.network)
    assert hot.calibration == a100.calibration
    for text, message in [
        ('base = "a100"\n', "a description with a base needs its own 'name'"),
        ('base = "a1000"\nname = "x"\n', "unknown hardware preset 'a1000' (did you mean 'a100'?)"),
        ('base = 3\nname = "x"\n', "base = 3: expected a preset name or a TOML path"),
        ('base = "me.toml"\nname = "x"\n', "a description cannot be its own base"),
        ('base = "nothing.toml"\nname = "x"\n', "no such file"),
    ]:
        (tmp_path / "me.toml").write_text(text)
        with pytest.raises(HardwareError, match=re.escape(message)):
            load_hardware(tmp_path / "me.toml")
    # The presets built on a base: tpuv4's die on its torus, a100 with NCCL's protocols.
    tpuv4 = load_hardware("tpuv4")
    torus = load_hardware("tpuv4_torus")
    assert dataclasses.replace(torus, name="tpuv4", network=tpuv4.network) == tpuv4
    assert [lv.topology for lv in torus.network] == ["torus", "torus"]


def test_paper_network_example() -> None:
    acc = load_hardware(REPO / "examples" / "hw" / "tpuv4_paper_network.toml")
    assert acc.network == (NetworkLevel("flat", 1024, 4 * GiB, 0.0),)
    assert acc.area_um2 == load_hardware("tpuv4").area_um2


def test_tpuv4_preset_numbers() -> None:
    acc = load_hardware("tpuv4")
    assert (acc.tensor_cores.count, acc.tensor_cores.pe_x, acc.tensor_cores.pe_y) == (8, 128, 128)
    assert (acc.vector_cores.count, acc.vector_cores.width) == (2, 128)
    assert acc.global_buffer.bytes == 128 * MiB
    assert acc.hbm.bytes == 32 * GiB and acc.hbm.bandwidth_Bps == 1.2e12
    assert acc.clock_hz == 1.05e9 and acc.bytes_per_element == 2
    assert acc.peak_tensor_flops == pytest.approx(275.2512e12, rel=1e-12)
    assert acc.peak_vector_flops == pytest.approx(2 * 128 * 1.05e9, rel=1e-12)
    assert round(acc.area_um2 / 1e6, 2) == 278.83
    assert acc.area_um2 == pytest.approx(278_826_676.31216, rel=1e-12)
    assert acc.modeled_area_um2 == acc.area_um2


def test_gpu_presets_match_public_peaks() -> None:
    a100, h100 = load_hardware("a100"), load_hardware("h100")
    assert a100.peak_tensor_flops == pytest.approx(312e12, rel=1e-3)  # dense fp16, A100 SXM
    assert h100.peak_tensor_flops == pytest.approx(989.4e12, rel=1e-4)  # dense fp16, H100 SXM
    assert 2 * a100.peak_vector_flops == pytest.approx(78e12, rel=1e-3)  # fp16 non-tensor (FMA = 2)
    assert a100.hbm.bytes == h100.hbm.bytes == 80 * GiB
    assert (a100.hbm.bandwidth_Bps, h100.hbm.bandwidth_Bps) == (2.039e12, 3.35e12)
    assert [lv.group_size for lv in a100.network] == [8, 4096]
    assert [lv.bandwidth_Bps for lv in a100.network] == [216.5e9, 25e9]  # node: fitted on NCCL (test_network_fit)
    assert [lv.bandwidth_Bps for lv in h100.network] == [450e9, 50e9]
    # Outside the 22 nm model's domain (L2 sizes it does not list): the given die area is used.
    assert a100.modeled_area_um2 is None and a100.area_um2 == 826e6
    assert h100.modeled_area_um2 is None and h100.area_um2 == 814e6


# --------------------------------------------------------------------------------------------
# Dataclasses
# --------------------------------------------------------------------------------------------


def test_default_buffers_follow_the_area_model() -> None:
    assert TensorCores(1, 16, 16).buffer_bytes == 4096
    assert TensorCores(1, 4, 4).buffer_bytes == 1024  # at least 1 KiB
    assert VectorCores(1, 128).buffer_bytes == 2048
    assert VectorCores(1, 8).buffer_bytes == 1024


def test_derived_peaks_and_network_level() -> None:
    acc = loads_toml(BASE)
    assert acc.peak_tensor_flops == 2 * 4 * 32 * 32 * 1e9
    assert acc.peak_vector_flops == 2 * 64 * 1e9
    assert acc.network_level(1).name == "node"
    assert acc.network_level(8).name == "node"
    assert acc.network_level(9).name == "cluster"
    assert acc.max_devices == 1024
    with pytest.raises(ValueError, match="exceed"):
        acc.network_level(1025)


def test_area_none_outside_domain_without_given_area() -> None:
    acc = loads_toml(BASE.replace("bytes = 8_388_608", "bytes = 3_000_000"))
    assert acc.modeled_area_um2 is None and acc.area_um2 is None


def test_direct_construction_is_validated() -> None:
    with pytest.raises(HardwareError, match=r"^TensorCores: pe_x = -4: expected a positive integer$"):
        TensorCores(count=1, pe_x=-4, pe_y=4)
    with pytest.raises(HardwareError, match="got a boolean"):
        VectorCores(count=True, width=4)  # type: ignore[arg-type]
    with pytest.raises(HardwareError, match="bandwidth_Bps"):
        HBM(bytes=1, bandwidth_Bps=0)
    acc = load_hardware("tpuv4")
    with pytest.raises(HardwareError, match=r"network\[1\]\.group_size = 2"):
        dataclasses.replace(acc, network=[NetworkLevel("a", 4, 1e9, 0), NetworkLevel("b", 2, 1e9, 0)])
    # A node uplink belongs to an outer level; the innermost has nothing below it to leave.
    with pytest.raises(HardwareError, match=r"network\[0\]\.uplink_Bps = 1e11: expected no value"):
        dataclasses.replace(acc, network=[NetworkLevel("a", 4, 1e9, 0, 100e9), NetworkLevel("b", 8, 1e9, 0)])
    up = dataclasses.replace(acc, network=[NetworkLevel("a", 4, 1e9, 0), NetworkLevel("b", 8, 1e9, 0, 2e9)])
    assert Accelerator.from_dict(up.to_dict()) == up and up.to_dict()["network"][1]["uplink_Bps"] == 2e9
    assert "uplink_Bps" not in up.to_dict()["network"][0]
    # A list of levels is accepted and stored as a tuple (the dataclass stays hashable).
    acc2 = dataclasses.replace(acc, network=list(acc.network))
    assert acc2 == acc and hash(acc2) == hash(acc)
    assert GlobalBuffer(bytes=2.0 * MiB, bandwidth_Bps=1).bytes == 2 * MiB  # type: ignore[arg-type]
    # numpy scalars are normalised to Python numbers (so to_dict stays JSON-able).
    import numpy as np

    tc = TensorCores(count=np.int64(8), pe_x=np.int32(16), pe_y=16)  # type: ignore[arg-type]
    assert type(tc.count) is int and type(tc.pe_x) is int
    assert type(HBM(bytes=np.float64(2e9), bandwidth_Bps=np.int64(5)).bandwidth_Bps) is float  # type: ignore[arg-type]
    with pytest.raises(HardwareError):
        TensorCores(count=np.bool_(True), pe_x=1, pe_y=1)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Error messages
# --------------------------------------------------------------------------------------------

# (description, old text, new text, the exact message for a file named bad.toml)
MUTATIONS = [
    ("missing key", "pe_x = 32\n", "", "bad.toml: missing required key 'tensor_cores.pe_x' (a positive integer)"),
    (
        "missing table",
        "[hbm]\nbytes = 32e9\nbandwidth_Bps = 1.2e12\n",
        "",
        "bad.toml: missing required key 'hbm' (a table with bytes, bandwidth_Bps)",
    ),
    (
        "missing network",
        BASE[BASE.index("[[network]]") :],
        "",
        "bad.toml: missing required key 'network' (one or more [[network]] levels)",
    ),
    ("negative", "pe_x = 32", "pe_x = -4", "bad.toml: tensor_cores.pe_x = -4: expected a positive integer"),
    ("zero", "count = 2", "count = 0", "bad.toml: vector_cores.count = 0: expected a positive integer"),
    ("fraction", "pe_y = 32", "pe_y = 1.5", "bad.toml: tensor_cores.pe_y = 1.5: expected a positive integer"),
    (
        "string",
        "pe_x = 32",
        'pe_x = "32"',
        'bad.toml: tensor_cores.pe_x = "32": expected a positive integer (got a string; units are in '
        "the key name, write a bare number)",
    ),
    (
        "bool is not an int",
        "count = 4",
        "count = true",
        "bad.toml: tensor_cores.count = true: expected a positive integer (got a boolean)",
    ),
    (
        "negative bandwidth",
        "bandwidth_Bps = 1.2e12",
        "bandwidth_Bps = -1.2e12",
        "bad.toml: hbm.bandwidth_Bps = -1.2e12: expected a positive number",
    ),
    (
        "zero bandwidth",
        "bandwidth_Bps = 25e9",
        "bandwidth_Bps = 0",
        "bad.toml: network[1].bandwidth_Bps = 0: expected a positive number",
    ),
    (
        "negative latency",
        "latency_s = 2e-6",
        "latency_s = -2e-6",
        "bad.toml: network[0].latency_s = -2e-6: expected a non-negative number",
    ),
    ("infinite clock", "clock_hz = 1e9", "clock_hz = inf", "bad.toml: clock_hz = inf: expected a positive number"),
    ("empty name", 'name = "chip"', 'name = ""', 'bad.toml: name = "": expected a non-empty string'),
    (
        "unknown top-level key",
        "[tensor_cores]",
        "[tensor_core]",
        "bad.toml: unknown key 'tensor_core' (did you mean 'tensor_cores'?)",
    ),
    ("unknown nested key", "pe_x = 32", "pex = 32", "bad.toml: unknown key 'tensor_cores.pex' (did you mean 'pe_x'?)"),
    (
        "unknown key, nothing close",
        "bytes_per_element = 2",
        "bytes_per_element = 2\nzzz = 1",
        "bad.toml: unknown key 'zzz' (known keys: name, clock_hz, tensor_cores, vector_cores, "
        "global_buffer, hbm, bytes_per_element, network, power_w, cost_usd, area_mm2, calibration, energy, "
        "manufacturing, deployment)",
    ),
    (
        "group size does not grow",
        "group_size = 1024",
        "group_size = 4",
        "bad.toml: network[1].group_size = 4: expected a multiple of network[0].group_size = 8 larger "
        "than it (levels go innermost first, each made of whole groups of the one before)",
    ),
    (
        "group size not a multiple",
        "group_size = 1024",
        "group_size = 1020",
        "bad.toml: network[1].group_size = 1020: expected a multiple of network[0].group_size = 8 "
        "larger than it (levels go innermost first, each made of whole groups of the one before)",
    ),
    (
        "duplicate level name",
        'name = "cluster"',
        'name = "node"',
        'bad.toml: network[1].name = "node": expected a name not used by another level',
    ),
    (
        "network not an array",
        BASE[BASE.index("[[network]]") :],
        "",
        "bad.toml: network = 3: expected one or more [[network]] levels (an array of tables)",
    ),
]


@pytest.mark.parametrize("what,old,new,message", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_malformed_file_messages(
    what: str, old: str, new: str, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert old in BASE, what
    text = BASE.replace(old, new, 1)
    if what == "network not an array":
        text = "network = 3\n" + text
    path = tmp_path / "bad.toml"
    path.write_text(text)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HardwareError) as info:
        load_hardware("bad.toml")
    assert str(info.value) == message
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError)


def test_scalar_where_a_table_goes() -> None:
    text = "hbm = 5\n" + BASE.replace("[hbm]\nbytes = 32e9\nbandwidth_Bps = 1.2e12\n", "")
    with pytest.raises(HardwareError) as info:
        loads_toml(text, source="bad.toml")
    assert str(info.value) == "bad.toml: hbm = 5: expected a table"


def test_error_attributes() -> None:
    with pytest.raises(HardwareError) as info:
        loads_toml(BASE.replace("pe_x = 32", "pe_x = -4"), source="x.toml")
    assert info.value.source == "x.toml" and info.value.key_path == "tensor_cores.pe_x"


def test_syntax_error_names_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(BASE.replace("pe_x = 32", "pe_x = = 32"))
    with pytest.raises(HardwareError) as info:
        load_hardware(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: TOML syntax error: ")
    assert "(at line 7, column 8)" in msg
    # Redefining a table is a TOML error too.
    with pytest.raises(HardwareError, match="TOML syntax error"):
        loads_toml("global_buffer = 3\n" + BASE)


def test_missing_file() -> None:
    with pytest.raises(HardwareError) as info:
        load_hardware("no/such/dir/chip.toml")
    assert str(info.value) == "no/such/dir/chip.toml: no such file"


def test_unknown_preset_lists_known_ones() -> None:
    with pytest.raises(HardwareError) as info:
        load_hardware("tpu4")
    msg = str(info.value)
    assert msg.startswith("unknown hardware preset 'tpu4' (did you mean 'tpuv4'?); known presets: ")
    assert ", ".join(preset_names()) in msg and msg.endswith("(or give the path of a .toml file)")
    assert {"a100", "h100", "tpuv4"} <= set(preset_names())


def test_from_dict_errors_name_the_source() -> None:
    d = load_hardware("tpuv4").to_dict()
    d["vector_cores"]["width"] = 0
    with pytest.raises(HardwareError, match=r"^<dict>: vector_cores\.width = 0: expected a positive integer$"):
        Accelerator.from_dict(d)
    with pytest.raises(HardwareError, match=r"^op @acc: hardware description = 3: expected a table$"):
        Accelerator.from_dict(3, source="op @acc")
