"""Every number on phazec's command line is checked before any work: a bad one gives one line,
said once, exit status 1, in well under a second of tracing (none)."""

from __future__ import annotations

import re

import pytest
from conftest import MODELS, run_main

TINY = str(MODELS / "tiny_gpt2.py")


@pytest.mark.parametrize(
    "flag, value, says",
    [
        ("--devices", "0", "--devices 0: expected a positive integer"),
        ("--global-batch", "0", "--global-batch 0: expected a positive integer"),
        ("--micro-batch", "-2", "--micro-batch -2: expected a positive integer"),
        ("--tp", "0", "--tp 0: expected a positive integer"),
        ("--seq-len", "0", "--seq-len 0: expected a positive integer"),
        ("-j", "0", "-j/--jobs 0: expected a positive integer"),
        ("--solver-nodes", "-1", "--solver-nodes -1: expected a number from 0 (no limit) to 2147483647"),
        ("--solver-max-binaries", "-5", "--solver-max-binaries -5: expected a number from 0"),
        ("--devices", "99999999999999999999", "--devices 99999999999999999999: expected a positive integer up to"),
        (
            "--global-batch",
            "2147483648",
            "--global-batch 2147483648: expected a positive integer up to 2.15 G (2,147,483,647)",
        ),
        ("--micro-batch", "1" + "0" * 20, "--micro-batch 1" + "0" * 20 + ": expected a positive integer up to"),
        ("--solver-nodes", "1" + "0" * 20, "--solver-nodes 1" + "0" * 20 + ": expected a number from 0"),
        ("--solver-time-limit", "nan", "--solver-time-limit nan: expected a positive, finite number"),
        ("--solver-time-limit", "inf", "--solver-time-limit inf: expected a positive, finite number"),
        ("--solver-time-limit", "0", "--solver-time-limit 0.0: expected a positive, finite number"),
        ("--solver-gap", "nan", "--solver-gap nan: expected a relative gap in [0, 1)"),
        ("--solver-gap", "1", "--solver-gap 1.0: expected a relative gap in [0, 1)"),
        ("--capacity-factor", "0.5", "--capacity-factor 0.5: expected a finite number >= 1 (below 1 the experts"),
        ("--capacity-factor", "nan", "--capacity-factor nan: expected a finite number >= 1"),
    ],
)
@pytest.mark.parametrize("mode", [["--hw", "tpuv4"], []], ids=["hw", "search"])
def test_bad_numbers_fail_before_any_work(flag, value, says, mode):
    r = run_main("phazec", TINY, *mode, flag, value)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr  # said once, nothing traced before it
    assert lines[0].startswith(f"phazec: error: {says}"), r.stderr


def test_a_width_the_model_refuses_is_said_once():
    """--tp 3 on a 4-head model fails at every micro-batch size for one reason: said once, in
    one line, before any trace (the heads are read off the model's config), with the widths that
    divide them."""
    r = run_main("phazec", TINY, "--hw", "tpuv4", "--tp", "3", "-q")
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and r.stderr.count("does not divide the 4 attention heads") == 1, r.stderr
    assert r.stderr.startswith("phazec: error: --tp 3: width 3"), r.stderr
    assert r.stderr.strip().endswith("expected a width among 1, 2, 4"), r.stderr
    r = run_main("phazec", TINY, "--hw", "tpuv4", "--tp", "3", "--no-cache")
    assert r.returncode == 1 and "tracing" not in r.stderr, r.stderr  # refused before the first trace


def test_a_misspelt_flag_gets_a_did_you_mean():
    r = run_main("phazec", TINY, "--devics", "4")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "unrecognized arguments: --devics 4; --devics: did you mean --devices?" in r.stderr
    r = run_main("phaze-opt", "x.mlir", "--pases", "p")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "--pases: did you mean --passes?" in r.stderr
    r = run_main("phazec", TINY, "--zzzz")  # nothing close: no guess
    assert r.returncode == 2 and "did you mean" not in r.stderr


def test_a_refusal_names_the_least_memory_and_the_nearest_plan_that_fits(tmp_path):
    """A chip of 2,000,000 bytes of HBM: no point of the sweep fits on 1 device.  The refusal is
    one line; it says the least memory of every option tried (the smallest over the points,
    not the first point's) and the nearest plan that fits, priced: on 2 devices."""
    from phaze_ir.hardware import preset_path

    hw = tmp_path / "small.toml"
    hw.write_text(preset_path("tpuv4").read_text().replace("bytes = 34_359_738_368", "bytes = 2_000_000", 1))
    args = ("phazec", TINY, "--hw", str(hw), "--devices", "1", "--global-batch", "8", "--no-cache")
    r = run_main(*args, "-q")
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    line = r.stderr
    assert "but HBM is 1.9 MiB (2000000 bytes)" in line, line
    needed = [int(n) for n in re.findall(r"needs is [0-9.]+ [KMG]iB \(([0-9]+) bytes\)", line)]
    every = [int(n) for n in re.findall(r"needs is [0-9.]+ [KMG]iB \(([0-9]+) bytes\)", run_main(*args).stderr)]
    assert len(needed) == 1 and len(every) > 2 and needed[0] == min(every), (needed, every)
    assert "the nearest plan that fits (the fewest devices at this batch): --devices 2 (DP" in line


def test_a_refusal_compiled_point_by_point_names_the_nearest_plan_that_fits_too(tmp_path):
    """One point (--micro-batch 1 --tp 1) is compiled through the pipeline, not priced from the
    settings: its refusal names the nearest plan that fits as the sweep's does, its compiled
    plan placed again on more devices (no compilation)."""
    from phaze_ir.hardware import preset_path

    hw = tmp_path / "small.toml"
    hw.write_text(preset_path("tpuv4").read_text().replace("bytes = 34_359_738_368", "bytes = 2_000_000", 1))
    flags = ("--devices", "1", "--global-batch", "8", "--micro-batch", "1", "--tp", "1", "--no-cache", "-q")
    r = run_main("phazec", TINY, "--hw", str(hw), *flags)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert "but HBM is 1.9 MiB (2000000 bytes)" in r.stderr, r.stderr
    said = "the nearest plan that fits (the fewest devices at this batch): --devices 2 (DP 1 x PP 2 x TP 1, "
    assert said in r.stderr and "micro-batch 1: " in r.stderr, r.stderr


def test_the_fewest_devices_are_found_between_the_doublings():
    """The nearest plan's device count is the fewest that fits, not only a doubling of the
    devices asked: 5 fits where 4 does not, so from 2 devices (8 fits) it is 5."""
    from phaze.options import Options
    from phaze.search.sweep import nearest_plan

    asked: list[int] = []

    def fits(o):
        asked.append(o.devices)
        return (o.devices, 1, 1, 0, ["none"], 1, 1.0) if o.devices >= 5 else None

    said = nearest_plan(Options(devices=2, zero="auto", recompute="auto"), 64, fits, lambda _: None)
    assert said.startswith("the nearest plan that fits (the fewest devices at this batch): --devices 5 (DP 5 x PP 1")
    assert asked == [4, 8, 6, 5]  # doubling to 8, then halving the gap from 4


def test_a_baseline_without_a_plan_is_dashes_and_a_line_saying_why():
    """The search's baseline table: a baseline with no plan shows no "0 samples/s" and no error
    sentence in its chip column; why it has none is said below the table."""
    from phaze.tools.phazec import baseline_table

    def row(name, thr, acc, note=""):
        return {"name": name, "throughput_samples_per_s": thr, "accelerator": acc, "note": note, "dp": 2, "pp": 1,
                "tp": 1, "sequence_parallel": False, "virtual_stages": 1, "zero": 0, "micro_batch_size": 4,
                "speedup": 1.5 if acc else None}  # fmt: skip

    rows = [row("tpuv4+phaze", 12.5, {"name": "tpuv4"}), row("tpuv4+expert", 0.0, None, "memory: no")]
    data = {"search": {"objective": "throughput"}, "baselines": rows}
    lines = baseline_table(data).splitlines()
    assert len(lines) == 4 and "tpuv4" in lines[1] and "12.5" in lines[1]
    assert lines[2].split()[:3] == ["tpuv4+expert", "-", "-"] and "memory" not in lines[2] and " 0 " not in lines[2]
    assert lines[3] == "tpuv4+expert: no plan: memory: no"
