"""The third hostile pass (issue 58 item 2): a plan that contradicts itself is refused wherever
it is read, in one line naming the relation; a pass that would leave one refuses; a pass run on
a placed plan takes the plan's own devices and batch; pricing a context-parallel step's ops
again is refused rather than dropping its ring (phaze_ir/plan_check.py)."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
from conftest import MODELS, module_text, run_main

from phaze.tools import phaze_opt

SDPA = str(MODELS / "tiny_llama_sdpa.py")


@functools.cache
def _plan_text(tmp: str) -> str:
    out = Path(tmp) / "plan.mlir"
    r = run_main(
        "phazec", SDPA, "--hw", "h100", "--devices", "8", "--context-parallel", "2", "--global-batch", "16",
        "--placement", "expert:2,2,1", "-o", str(out), "-q",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return module_text(out.read_text())


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> str:
    """A placed plan of DP 2 x PP 2 x TP 1 x CP 2 on 8 devices, 16 samples of 8 per micro-batch."""
    return _plan_text(str(tmp_path_factory.mktemp("plan")))


def opt(tmp_path, text: str, *args: str, capsys) -> tuple[int, str, str]:
    """phaze-opt on ``text`` (in-process): its exit status, stdout and stderr."""
    src = tmp_path / "in.mlir"
    src.write_text(text)
    rc = phaze_opt.main([str(src), *args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def one_line_error(rc: int, err: str) -> str:
    assert rc == 1, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


def edit(text: str, old: str, new: str) -> str:
    """``text`` with the first ``old`` replaced (the first after ``#phaze.stage_info<`` when
    ``old`` starts with ``stage:``)."""
    at = 0
    if old.startswith("stage:"):
        old, new, at = old.removeprefix("stage:"), new.removeprefix("stage:"), text.index("#phaze.stage_info<")
    assert old in text[at:], old
    return text[:at] + text[at:].replace(old, new, 1)


def test_the_plan_as_written_is_read_back(tmp_path, plan, capsys):
    rc, out, err = opt(tmp_path, plan, capsys=capsys)
    assert rc == 0, err
    assert "#phaze.plan<devices = 8, global_batch = 16, dp = 2, pp = 2, tp = 1, cp = 2," in out


@pytest.mark.parametrize(
    ("old", "new", "relation"),
    [
        ("dp = 2, pp = 2", "dp = 3, pp = 2", "devices_used = 8, expected dp·pp·tp·cp = 3·2·1·2 = 12"),
        ("devices = 8, global_batch", "devices = 4, global_batch", "devices_used = 8 on 4 devices"),
        ("num_micro_batches = 1,", "num_micro_batches = 0,", "num_micro_batches = 0 with dp = 2: expected >= 1"),
        ("global_batch = 16,", "global_batch = 24,", "micro_batch_size·num_micro_batches·dp = 8·1·2 = 16"),
        ("throughput_samples_per_s = 1", "throughput_samples_per_s = 2", "throughput_samples_per_s = "),
        ("expert_parallel = 1,", "expert_parallel = 4,", "expert_parallel = 4 does not divide dp = 2"),
        (
            "expert_tensor_parallel = 1,",
            "expert_tensor_parallel = 2,",
            "expert_tensor_parallel = 2 with expert_parallel = 1: expected a width dividing tp = 1",
        ),
        ("rank = 0, first_layer = 0", "rank = 1, first_layer = 0", "stage 0 has index 0 and rank 1"),
        ("first_layer = 0, last_layer = 1, devices = 1", "first_layer = 0, last_layer = 1, devices = 2", "devices"),
        ("first_layer = 0, last_layer = 1,", "first_layer = 0, last_layer = 0,", "holds layers"),
        ("recompute_s = 0.0, pp_comm_s", "recompute_s = 1.0, pp_comm_s", "expected the sum of its parts"),
        ("stage:workspace_bytes = ", "stage:workspace_bytes = 1", "memory_bytes = "),
        ("max_memory_bytes = ", "max_memory_bytes = 1", "expected the largest stage's"),
        ("cp = 2,", "cp = 1,", "devices_used = 8, expected dp·pp·tp·cp = 2·2·1·1 = 4"),
        ("phaze.stage = 1", "phaze.stage = 0", "expected the stage that holds its layer (1)"),
        ("energy_per_sample_j = ", "energy_per_sample_j = 9", "expected step_energy_j / global_batch = "),
        ("static_power_w = ", "static_power_w = 9999", "expected static <= mean <= the busiest chip's"),
        ("#phaze.layer_latency<index = 1,", "#phaze.layer_latency<index = 0,", "layer_latency has indices [0, 0,"),
        ("#phaze.layer_info<index = 1,", "#phaze.layer_info<index = 0,", "phaze.layers has indices [0, 0,"),
    ],
    ids=[
        "dp-3-on-8-devices",
        "more-devices-used-than-devices",
        "zero-micro-batches",
        "batch-not-micro-batches-times-dp",
        "throughput-not-batch-over-time",
        "ep-not-dividing-dp",
        "etp-not-dividing-tp",
        "stage-on-the-wrong-rank",
        "stage-devices-not-tp",
        "layers-not-consecutive",
        "stage-time-not-its-parts",
        "stage-memory-not-its-parts",
        "max-memory-not-the-largest-stage",
        "cp-against-devices",
        "op-stage-not-its-layers",
        "energy-per-sample-not-step-over-batch",
        "static-power-above-the-chips",
        "layer-latency-not-one-per-layer",
        "layers-not-numbered-in-order",
    ],
)
def test_a_plan_that_contradicts_itself_is_refused_naming_the_relation(tmp_path, plan, capsys, old, new, relation):
    rc, out, err = opt(tmp_path, edit(plan, old, new), capsys=capsys)
    line = one_line_error(rc, err)
    assert line.startswith("phaze-opt: error: 'builtin.module' op phaze.plan contradicts itself: "), line
    assert relation in line, line
    assert out == ""


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        ("#phaze.layer_latency<index = 1, fwd_s = ", "#phaze.layer_latency<index = 1, fwd_s = -", "'fwd_s' of "),
        ("step_energy_j = ", "step_energy_j = -", "'step_energy_j' of phaze.power = -"),
        ("clock_limited_share = ", "clock_limited_share = 5", "expected a finite number from 0 to 1"),
    ],
    ids=["negative-layer-latency", "negative-step-energy", "clock-share-above-1"],
)
def test_a_negative_time_or_energy_or_a_share_above_1_is_refused_at_its_field(tmp_path, plan, capsys, old, new, said):
    rc, out, err = opt(tmp_path, edit(plan, old, new), capsys=capsys)
    assert rc == 1 and "Traceback" not in err and out == "", err
    assert said in err.splitlines()[0], err


def test_a_step_time_that_is_not_its_stages_is_refused(tmp_path, plan, capsys):
    """time_per_batch_s doubled (and the throughput with it, so that only the stages disagree)."""
    time = float(re.search(r"time_per_batch_s = ([0-9.e+-]+)", plan)[1])  # type: ignore[index]
    rate = float(re.search(r"throughput_samples_per_s = ([0-9.e+-]+)", plan)[1])  # type: ignore[index]
    text = re.sub(r"time_per_batch_s = [0-9.e+-]+", f"time_per_batch_s = {2 * time!r}", plan, count=1)
    text = re.sub(r"throughput_samples_per_s = [0-9.e+-]+", f"throughput_samples_per_s = {16 / (2 * time)!r}", text)
    assert rate != 16 / (2 * time)
    line = one_line_error(*opt(tmp_path, text, capsys=capsys)[::2])
    assert "time_per_batch_s = " in line and "max stage time" in line, line


def test_a_plan_is_checked_where_the_api_reads_it(plan):
    from phaze_ir.errors import PhazeError
    from phaze_ir.ir import parse_module

    parse_module(plan)
    with pytest.raises(PhazeError, match=r"devices_used = 8, expected dp·pp·tp·cp"):
        parse_module(edit(plan, "dp = 2, pp = 2", "dp = 3, pp = 2"))


def test_a_module_key_against_its_plan_is_refused(tmp_path, plan, capsys):
    """The ops priced for CP 1 under a plan placed for CP 2."""
    text = edit(plan, "phaze.context_parallel = 2", "phaze.context_parallel = 1")
    line = one_line_error(*opt(tmp_path, text, capsys=capsys)[::2])
    assert "cp = 2, but the ops are priced for phaze.context_parallel = 1" in line, line


def test_a_pass_that_would_leave_a_contradiction_refuses(tmp_path, plan):
    """phaze-opt verifies the module after each pass: one that left the plan contradicting the
    ops (here the module as such a pass would leave it) is refused, naming the pass."""
    from passes.mark_saved import MarkSavedPass
    from phaze_ir.errors import PhazeError
    from phaze_ir.ir import parse_text

    src = tmp_path / "in.mlir"
    src.write_text(plan)
    main = phaze_opt.PhazeOptMain(args=[str(src), "-p", "phaze-mark-saved"])
    module = parse_text(edit(plan, "phaze.context_parallel = 2", "phaze.context_parallel = 1"))
    with pytest.raises(PhazeError, match=r"^phaze-mark-saved would leave the module contradicting itself: .*cp = 2"):
        main.pipeline.callback(MarkSavedPass(), module, None)


def test_place_devices_on_a_plan_keeps_its_devices_and_batch(tmp_path, plan, capsys):
    rc, out, err = opt(tmp_path, plan, "-p", "phaze-place-devices", capsys=capsys)
    assert rc == 0, err
    assert re.search(r"#phaze.plan<devices = 8, global_batch = 16,", out), out[:300]
    rc, out, err = opt(tmp_path, plan, "-p", "phaze-place-devices{devices=16}", capsys=capsys)
    assert rc == 0, err
    assert re.search(r"#phaze.plan<devices = 16, global_batch = 16,", out)


def test_estimate_latency_again_on_a_context_parallel_plan_keeps_the_ring(tmp_path, plan, capsys):
    """Priced again, a context-parallel plan keeps its ring (issue 56: phaze-context-parallel
    rescaled what phaze-estimate-latency wrote, and pricing again dropped it). Who writes which
    key: tests/test_keys_writers.py."""
    from phaze_ir import keys
    from phaze_ir.ir import parse_text

    rc, out, err = opt(tmp_path, plan, "-p", "phaze-estimate-latency", capsys=capsys)
    assert rc == 0, err
    before, after = parse_text(plan), parse_text(out)
    assert keys.int_of(after, keys.CONTEXT_PARALLEL, 1) == 2
    assert dict(after.attributes) == dict(before.attributes)  # the ring, the layers' sums: as priced
    assert [o.attributes.get(keys.LATENCY) for o in after.walk()] == [
        o.attributes.get(keys.LATENCY) for o in before.walk()
    ]


def test_pricing_a_plan_again_writes_the_same_bytes(tmp_path, plan, capsys):
    """A pass run again on its own output writes its keys where they were: the layers' sums,
    FLOPs and the ring kept their places among the module's keys (they were taken off and added
    again after the keys later passes wrote: the same values, other bytes)."""
    rc, out, err = opt(tmp_path, plan, "-p", "phaze-estimate-latency", capsys=capsys)
    assert rc == 0, err
    assert module_text(out) == plan
