"""``phaze-validate`` (phaze/validate.py, phaze/tools/phaze_validate.py): the CSV of measured runs
(columns, byte-order mark, optional columns, one-line refusals), the held-apart split (seeded,
independent of the order of the rows), and the pricing: one trace per (shape, micro-batch), and
for each run exactly the plan that ``phazec --hw a100 --placement expert:PP,DP,TP`` gives.

The fixture, tests/data/vtrain_single_sample.csv, is 10 rows of the vTrain authors' measured
single-node runs (MIT, tests/data/vtrain_single_sample.LICENSE): GPT hidden 1024, 12 and 16
layers, micro-batch 1, TP 1 and 2."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, run_main

from phaze import validate as v
from phaze_ir.errors import PhazeError

SAMPLE = ROOT / "tests" / "data" / "vtrain_single_sample.csv"
VTRAIN = ROOT / "data" / "vtrain"
HEADER = (
    "# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
    "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)"
)


def run_validate(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """``phaze-validate ARGS`` in this process (:func:`conftest.run_main`: what is checked is
    what it says, not the process)."""
    return run_main("phaze-validate", *args, cwd=cwd)


# ------------------------------------------------------------------------------------------
# The CSV
# ------------------------------------------------------------------------------------------


def test_the_sample_reads_with_its_byte_order_mark_and_crlf_line_ends():
    assert SAMPLE.read_bytes().startswith(b"\xef\xbb\xbf# GPUs,") and b"\r\n" in SAMPLE.read_bytes()
    runs = v.read_runs(SAMPLE)
    assert len(runs) == 10
    first = runs[0]
    assert (first.row, first.line) == (1, 2)
    assert (first.gpus, first.global_batch, first.micro_batch) == (8, 4, 1)
    assert (first.hidden, first.heads, first.layers, first.seq_len) == (1024, 16, 16, 1024)
    assert (first.tp, first.dp, first.pp, first.measured_ms) == (1, 2, 4, 77.216619)
    assert first.placement == "expert:4,2,1" and first.measured_s == pytest.approx(0.077216619)
    assert (first.vocabulary, first.dtype) == (50257, "float16")
    assert {r.shape.name for r in runs} == {"gpt-h1024-a16-l12-s1024", "gpt-h1024-a16-l16-s1024"}


def test_the_multi_node_header_with_its_extra_column_and_the_optional_columns():
    text = (
        "\ufeffParameters (billion)," + HEADER + ",Vocabulary,dtype\n"
        "3.6,64,512,8,3072,32,30,2048,1,64,1,3566.5,32000,bf16\n"
        "3.6,64,512,8,3072,32,30,2048,1,64,1,3566.5,,\n"
    )
    a, b = v.parse_runs(text, "m.csv")
    assert (a.vocabulary, a.dtype, a.shape.padded_vocabulary) == (32000, "bfloat16", 32000)
    assert a.shape.name == "gpt-h3072-a32-l30-s2048-v32000-bfloat16"
    assert (b.vocabulary, b.dtype, b.shape.padded_vocabulary) == (50257, "float16", 50304)


def test_how_a_run_was_run_is_read_and_the_defaults_keep_the_split():
    """recompute, sequence parallelism, pipeline schedule and rank order: optional, per run; a
    run written with the defaults is the run without the columns (same identity, so the same
    split)."""
    row = "8,32,4,1024,16,24,1024,2,2,2,219.7"
    plain, given, defaults = v.parse_runs(
        HEADER + ",recompute,sequence parallelism,pipeline schedule,rank order\n"
        f"{row},,,,\n{row},Selective,ON,interleaved:3,TP-PP-DP\n{row},,off,1f1b,tp-dp-pp\n",
        "h.csv",
    )
    assert (plain.recompute, plain.sequence_parallel, plain.pipeline_schedule) == ("", False, "1f1b")
    assert (given.recompute, given.sequence_parallel, given.pipeline_schedule) == ("selective", True, "interleaved:3")
    assert (plain.rank_order, given.rank_order, defaults.rank_order) == ("tp-dp-pp", "tp-pp-dp", "tp-dp-pp")
    (bare,) = v.parse_runs(HEADER + "\n" + row, "b.csv")
    assert plain.identity() == defaults.identity() == bare.identity() != given.identity()
    opts = v.Settings(v.pricing_options("a100")).options_of(given)
    assert (opts.recompute, opts.pipeline_schedule, opts.rank_order) == ("selective", "interleaved:3", "tp-pp-dp")
    assert v.Settings(v.pricing_options("a100")).options_of(plain).recompute == "full"
    (job,) = v.jobs_of([plain, given])
    assert job.compilations == [(2, False, ""), (2, True, "")]  # one compilation with SP, one without


def test_the_kernels_are_read_per_run_and_the_column_wins_over_the_flag():
    """A ``kernels`` column names the runtime of its rows (an empty cell: the flag's); it is how
    phaze prices a run, not what the run was, so it leaves the split as it was; runs of one
    shape and micro-batch share their trace, one compilation per runtime."""
    from passes.algorithms.kernels import RUNTIMES

    assert v.KERNELS == RUNTIMES and v.pricing_options("a100").kernels == "ops"
    row = "8,32,4,1024,16,24,1024,2,2,2,219.7"
    named, empty, ops = v.parse_runs(f"{HEADER},Kernels\n{row},Megatron\n{row},\n{row},ops\n", "k.csv")
    assert (named.kernels, empty.kernels, ops.kernels) == ("megatron", "", "ops")
    (bare,) = v.parse_runs(HEADER + "\n" + row, "b.csv")
    assert named.identity() == empty.identity() == ops.identity() == bare.identity()
    flag = v.Settings(v.pricing_options("a100", kernels="eager"))
    assert [flag.options_of(r).kernels for r in (named, empty, ops)] == ["megatron", "eager", "ops"]
    assert v.Settings(v.pricing_options("a100")).options_of(empty).kernels == "ops" and flag.options.kernels == "eager"
    (job,) = v.jobs_of([named, empty, ops])
    assert job.compilations == [(2, False, ""), (2, False, "megatron"), (2, False, "ops")]


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("recompute", "auto", "'recompute' is 'auto', expected none, selective or full"),
        ("sequence parallelism", "yes", "'sequence parallelism' is 'yes', expected on or off"),
        ("pipeline schedule", "interleaved:1", "'pipeline schedule' is 'interleaved:1'"),
        ("pipeline schedule", "auto", "'pipeline schedule' is 'auto'"),
        ("rank order", "auto", "'rank order' is 'auto', expected tp-dp-pp or tp-pp-dp"),
        ("rank order", "pp-dp-tp", "'rank order' is 'pp-dp-tp'"),
        ("kernels", "fused", "row 1: 'kernels' is 'fused', expected ops, eager, inductor or megatron"),
        ("kernels", "auto", "row 1: 'kernels' is 'auto', expected ops, eager, inductor or megatron"),
    ],
)
def test_a_bad_run_setting_is_one_line(column, value, message):
    with pytest.raises(PhazeError) as e:
        v.parse_runs(f"{HEADER},{column}\n8,32,4,1024,16,24,1024,2,2,2,219.7,{value}", "t.csv")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_model_file_is_megatrons_gpt(tmp_path):
    from phaze_ir.frontend import load_model_file

    shape = v.Shape(1024, 16, 12, 1024)
    spec = load_model_file(v.write_model_file(shape, tmp_path))
    assert (spec.name, spec.seq_len) == ("gpt-h1024-a16-l12-s1024", 1024)
    import torch

    with torch.device("meta"):
        model = spec.get_model()
    c = model.config
    assert (c.vocab_size, c.n_positions, c.n_embd, c.n_layer, c.n_head) == (50304, 1024, 1024, 12, 16)
    assert c.activation_function == "gelu" and c.n_inner is None  # the MLP is 4h
    assert model.lm_head.weight is model.transformer.wte.weight  # tied, as Megatron's


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty file"),
        (HEADER.replace(",micro batch", ""), "no column 'micro batch'"),
        (HEADER.replace("iteration time (ms)", "time"), "no column 'iteration time (ms)'"),
        (HEADER + "\n", "no runs"),
        (HEADER + "\n8,32,4,1024,16,24,1024,2,2,1,219.7", "t.csv:2: row 1: 8 GPUs but TP x DP x PP = 2 x 2 x 1 = 4"),
        (
            HEADER + "\n8,32,4,1024,16,24,1024,2,2,2,219.7\n8,30,4,1024,16,24,1024,2,2,2,1",
            "t.csv:3: row 2: global batch 30 is not a multiple of micro batch x DP = 4 x 2 = 8",
        ),
        (HEADER + "\n8,32,4,1024,12,24,1024,8,1,1,219.7", "row 1: hidden size 1024 is not a multiple of the 12"),
        (
            HEADER + "\n8,32,4,1024,16,24,1024,8,1,1,219.7\n\n3,3,1,1024,16,24,1024,3,1,1,9",
            "t.csv:4: row 2: 16 attention heads cannot be split over TP 3",
        ),
        (HEADER + "\n8,32,4,1024,16,2,1024,1,1,8,219.7", "row 1: 8 pipeline stages for 2 layers"),
        (HEADER + "\n8,32,four,1024,16,24,1024,2,2,2,219.7", "row 1: 'micro batch' is 'four', expected a positive"),
        (HEADER + "\n8,32,4,1024,16,24,1024,2,2,2,-1", "row 1: 'iteration time (ms)' is '-1', expected a positive"),
        (HEADER + "\n8,32,4,1024,16,24,1024,2,2,2", "row 1: no value for 'iteration time (ms)'"),
        (HEADER + ",dtype\n8,32,4,1024,16,24,1024,2,2,2,1,fp8", "row 1: 'dtype' is 'fp8', expected one of"),
        (HEADER + ",split\n8,32,4,1024,16,24,1024,2,2,2,1,test", "row 1: 'split' is 'test', expected dev or holdout"),
        (HEADER + ",split\n8,32,4,1024,16,24,1024,2,2,2,1,", "row 1: the split column is empty"),
    ],
)
def test_a_bad_csv_is_one_line_naming_the_column_or_the_row(text, message):
    with pytest.raises(PhazeError) as e:
        v.parse_runs(text, "t.csv")
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_tool_refuses_a_bad_csv_in_one_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(HEADER.replace(",# layers", "") + "\n")
    r = run_validate(str(bad), "--hw", "a100")
    assert r.returncode == 1 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1
    assert r.stderr.startswith(f"phaze-validate: error: {bad}: no column '# layers' (a run needs: '# GPUs', ")
    # A bad runtime in a row is said before anything is traced, whatever --kernels says.
    bad.write_text(
        f"{HEADER},kernels\n8,32,4,1024,16,24,1024,2,2,2,219.7,megatron\n8,32,4,1024,16,24,1024,2,2,2,1,tvm\n"
    )
    r = run_validate(str(bad), "--hw", "a100", "--kernels", "megatron")
    assert r.returncode == 1 and r.stdout == "" and len(r.stderr.splitlines()) == 1
    said = f"{bad}:3: row 2: 'kernels' is 'tvm', expected ops, eager, inductor or megatron"
    assert r.stderr == f"phaze-validate: error: {said}\n"
    for args, message in [
        ((str(tmp_path / "none.csv"), "--hw", "a100"), "none.csv: no such file"),
        ((str(SAMPLE), "--hw", "nochip"), "nochip"),
        ((str(SAMPLE), "--hw", "a100", "--json", str(SAMPLE)), "is the runs file: refusing to overwrite it"),
        ((str(SAMPLE), "--hw", "a100", "--rows", "5-11"), "'5-11' is not within the file's rows 1-10"),
        ((str(SAMPLE), "--hw", "a100", "--holdout", "1.5"), "--holdout 1.5: expected a fraction in [0, 1]"),
        ((str(SAMPLE), "--hw", "a100", "-j", "0"), "-j/--jobs 0: expected a positive integer"),
    ]:
        r = run_validate(*args)
        assert r.returncode == 1, args
        assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("phaze-validate: error: "), r.stderr
        assert message in r.stderr, (message, r.stderr)


# ------------------------------------------------------------------------------------------
# The split
# ------------------------------------------------------------------------------------------


def test_the_split_is_a_seeded_fifth_independent_of_the_order_of_the_rows():
    runs = v.read_runs(SAMPLE)
    split = v.assign_splits(runs)
    assert [r.split for r in split].count("holdout") == 2  # round(10 / 5)
    # Pinned: a change here moves runs between the parts (calibration would then see held-apart runs).
    assert [r.row for r in split if r.split == "holdout"] == [2, 7]
    assert v.assign_splits(runs) == split
    # The same runs in another order (their row numbers follow the order): the same runs held apart.
    lines = SAMPLE.read_text(encoding="utf-8-sig").splitlines()
    shuffled = v.assign_splits(v.parse_runs("\n".join([lines[0], *reversed(lines[1:])]), "r.csv"))
    assert {r.identity() for r in shuffled if r.split == "holdout"} == {
        r.identity() for r in split if r.split == "holdout"
    }
    other = v.assign_splits(runs, seed=1)
    assert [r.split for r in other].count("holdout") == 2
    assert {r.row for r in other if r.split == "holdout"} != {2, 7}
    assert all(r.split == "dev" for r in v.assign_splits(runs, 0.0))
    # A split column decides for itself.
    marked = [line + ("," + ("holdout" if i == 3 else "dev")) for i, line in enumerate(lines[1:])]
    text = lines[0] + ",split\n" + "\n".join(marked)
    given = v.assign_splits(v.parse_runs(text, "s.csv"))
    assert [r.row for r in given if r.split == "holdout"] == [4]


def test_the_vtrain_files_read_and_split():
    single = v.assign_splits(v.read_runs(VTRAIN / "ground_truth_single.csv"))
    multi = v.assign_splits(v.read_runs(VTRAIN / "ground_truth_multi.csv"))
    assert (len(single), len(multi)) == (1440, 109)
    assert [r.split for r in single].count("holdout") == 288
    assert [r.split for r in multi].count("holdout") == 22
    for runs, shapes, traces, compilations in ((single, 8, 32, 128), (multi, 4, 22, 61)):
        jobs = v.jobs_of(runs)
        assert len({j.shape for j in jobs}) == shapes and len(jobs) == traces
        assert sum(len(j.compilations) for j in jobs) == compilations


def test_bundles_keep_a_shape_family_together_and_spread_the_work():
    runs = v.read_runs(SAMPLE)
    jobs = v.jobs_of(runs)
    assert len(jobs) == 2
    assert [len(b) for b in v.bundles_of(jobs, 2)] == [2]  # l12 and l16: one family, one worker
    assert [len(b) for b in v.bundles_of(jobs, 1)] == [2]
    many = [v.Job(v.Shape(64 * k, 1, 2 + k, 8), 1, (runs[0],)) for k in range(1, 30)]
    bundles = v.bundles_of(many, 2)
    assert len(bundles) == 8 and sorted(j.shape.name for b in bundles for j in b) == sorted(j.shape.name for j in many)


# ------------------------------------------------------------------------------------------
# Pricing
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    """The sample priced in-process (-j 1), with the traces counted."""
    from phaze.tools import phaze_validate
    from phaze_ir import frontend

    out = tmp_path_factory.mktemp("validate") / "v.json"
    traced: list[tuple[str, int]] = []
    original = frontend.trace_cut_or_whole  # one step per (shape, micro-batch), cut or whole

    def counting(spec, micro_batch_size=1, *args, **kwargs):
        traced.append((spec.name, micro_batch_size))
        return original(spec, micro_batch_size, *args, **kwargs)

    import io
    from contextlib import redirect_stdout

    frontend.trace_cut_or_whole = counting
    buf = io.StringIO()
    try:
        with redirect_stdout(buf):
            rc = phaze_validate.main([str(SAMPLE), "--hw", "a100", "-j", "1", "-q", "--json", str(out)])
    finally:
        frontend.trace_cut_or_whole = original
    assert rc == 0
    return buf.getvalue(), json.loads(out.read_text()), traced


def test_runs_of_one_shape_and_micro_batch_share_one_trace(validated):
    _, data, traced = validated
    assert sorted(traced) == [("gpt-h1024-a16-l12-s1024", 1), ("gpt-h1024-a16-l16-s1024", 1)]
    t = data["timing"]
    assert (t["traces"], t["compilations"], t["placements"]) == (2, 4, 10)
    assert t["wall_s"] > 0 and t["trace_s"] > 0 and t["compile_s"] > 0 and t["place_s"] > 0


def test_the_report_and_its_json(validated):
    text, data, _ = validated
    assert data["hw"] == "a100" and data["holdout_fraction"] == 0.2 and data["seed"] == 0
    assert data["recompute"] == "full" and {r["recompute"] for r in data["runs"]} == {"full"}
    assert data["kernels"] == "ops" and {r["kernels"] for r in data["runs"]} == {"ops"}
    assert [r["row"] for r in data["runs"]] == list(range(1, 11))
    for r in data["runs"]:
        assert r["feasible"] and r["predicted_s"] > 0
        assert r["error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1)
    assert [r["split"] for r in data["runs"]].count("holdout") == 2
    s = data["summary"]
    assert (s["dev"]["runs"], s["holdout"]["runs"], s["all"]["runs"]) == (8, 2, 10)
    errors = sorted(abs(r["error"]) for r in data["runs"])
    assert s["all"]["median_abs_error"] == pytest.approx((errors[4] + errors[5]) / 2)
    assert s["all"]["worst"][0] == max(data["runs"], key=lambda r: abs(r["error"]))["row"]
    assert data["not_priced"] == []
    lines = text.splitlines()
    assert lines[0].split() == "row split model GPUs batch b PP DP TP predicted_s measured_s error".split()
    assert len(lines[1:11]) == 10 and lines[1].split()[:3] == ["1", "dev", "gpt-h1024-a16-l16-s1024"]
    assert any(line.startswith("holdout      2      2") for line in lines)
    assert "worst dev runs:" in text and "worst holdout runs:" in text


#: The runtime phaze-validate prices a run as unless its file says otherwise (``Options``'
#: defaults, the paper's): phazec's flags for it, where a GPU's defaults (phaze.driver's
#: runtime_defaults) would price another; a test's own flags after these win.
VALIDATION_RUNTIME = ["--kernels", "ops", "--dtype", "float16", "--zero", "0", "--sequence-parallel", "off"]
VALIDATION_RUNTIME += ["--pipeline-schedule", "1f1b", "--no-dp-overlap", "--selective-recompute", "attention"]


def test_each_prediction_is_phazecs_plan_for_the_same_run(validated, tmp_path):
    """Row 4 (8 GPUs, global batch 64, micro-batch 1, PP 1, DP 4, TP 2) through phazec."""
    from phaze.tools import phazec

    _, data, _ = validated
    run = data["runs"][3]
    assert (run["gpus"], run["global_batch"], run["micro_batch"], run["placement"]) == (8, 64, 1, "expert:1,4,2")
    model = v.write_model_file(v.Shape(run["hidden"], run["heads"], run["layers"], run["seq_len"]), tmp_path)
    out = tmp_path / "plan.json"
    args = [model, *VALIDATION_RUNTIME]
    args += ["--hw", "a100", "--placement", run["placement"], "--devices", "8", "--global-batch", "64"]
    args += ["--micro-batch", "1", "--tp", "2", "--recompute", "full", "--rank-order", "tp-dp-pp"]
    args += ["--json", str(out), "-q", "-o", str(tmp_path / "plan.mlir")]
    assert phazec.main(args) == 0
    plan = json.loads(out.read_text())
    assert run["rank_order"] == plan["rank_order"] == "tp-dp-pp"  # Megatron-DeepSpeed's numbering
    assert plan["time_per_batch_s"] == run["predicted_s"]
    assert plan["max_memory_bytes"] == run["memory_bytes"]


def test_a_pipelined_run_is_phazecs_plan_with_split_transfers(validated, tmp_path):
    """Row 5 (8 GPUs, PP 2, DP 2, TP 2): its stage boundary is crossed as DeepSpeed's pipeline
    engine crosses it, 1/t per TP rank then gathered (--pipeline-transfer split); whole
    transfers price it otherwise."""
    from phaze.tools import phazec

    _, data, _ = validated
    run = data["runs"][4]
    assert (run["placement"], run["pipeline_transfer"]) == ("expert:2,2,2", "split")
    model = v.write_model_file(v.Shape(run["hidden"], run["heads"], run["layers"], run["seq_len"]), tmp_path)
    args = [model, *VALIDATION_RUNTIME]
    args += ["--hw", "a100", "--placement", run["placement"], "--devices", "8", "--global-batch", "4"]
    args += ["--micro-batch", "1", "--tp", "2", "--recompute", "full", "--rank-order", "tp-dp-pp", "-q"]
    times = {}
    for transfer in ("split", "whole"):
        out, mlir = tmp_path / f"{transfer}.json", tmp_path / f"{transfer}.mlir"
        argv = [*args, "--pipeline-transfer", transfer, "--json", str(out), "-o", str(mlir)]
        assert phazec.main(argv) == 0
        plan = json.loads(out.read_text())
        times[transfer] = plan["time_per_batch_s"]
        # The plan says how it priced its transfers, in the IR and in the JSON.
        assert plan["pipeline_transfer"] == transfer and f'pipeline_transfer = "{transfer}"' in mlir.read_text()
    assert times["split"] == run["predicted_s"] and times["whole"] != times["split"]


def test_a_run_with_its_own_settings_is_phazecs_plan_with_those_flags(tmp_path):
    """A run with sequence parallelism, selective recompute and 2 model chunks per device is
    priced as phazec prices the same run with --sequence-parallel on --recompute selective
    --pipeline-schedule interleaved:2 (12 layers over PP 2, TP 2)."""
    from phaze.tools import phazec

    csv = tmp_path / "runs.csv"
    csv.write_text(
        HEADER + ",recompute,sequence parallelism,pipeline schedule\n"
        "4,8,1,1024,16,12,1024,2,1,2,100,selective,on,interleaved:2\n"
    )
    (run,) = v.read_runs(csv)
    result = v.validate([run], v.Settings(v.pricing_options("a100", schedule_nodes=1), quiet=True), jobs=1)[0]
    model = v.write_model_file(run.shape, tmp_path)
    out = tmp_path / "plan.json"
    args = [model, *VALIDATION_RUNTIME]
    args += ["--hw", "a100", "--placement", "expert:2,1,2", "--devices", "4", "--global-batch", "8"]
    args += ["--micro-batch", "1", "--tp", "2", "--recompute", "selective", "--sequence-parallel", "on"]
    args += ["--pipeline-schedule", "interleaved:2", "--solver-nodes", "1", "--json", str(out), "-q"]
    assert phazec.main([*args, "-o", str(tmp_path / "plan.mlir")]) == 0
    plan = json.loads(out.read_text())
    assert (plan["sequence_parallel"], plan["virtual_stages"]) == (True, 2)
    assert result[run.row].predicted_s == plan["time_per_batch_s"]


def test_a_runs_kernels_are_phazecs_and_one_runtime_is_compiled_once(validated, tmp_path):
    """Row 4 of the sample three times: as Megatron's kernels (the column), as the flag's (an
    empty cell, --kernels megatron: the same compilation) and as ops (the column over the flag:
    the sample's price, without kernels).  Megatron's is phazec --kernels megatron's plan."""
    from phaze.tools import phazec

    _, data, _ = validated
    row = "8,64,1,1024,16,12,1024,2,4,1,700.42027"
    csv = tmp_path / "runs.csv"
    csv.write_text(f"{HEADER},kernels\n{row},megatron\n{row},\n{row},ops\n")
    runs = v.read_runs(csv)
    settings = v.Settings(v.pricing_options("a100", kernels="megatron"), quiet=True)
    priced, timing = v.validate(runs, settings, jobs=1)
    assert (timing["traces"], timing["compilations"], timing["placements"]) == (1, 2, 3)
    megatron, flag, ops = (priced[r].predicted_s for r in (1, 2, 3))
    assert megatron == flag and ops == data["runs"][3]["predicted_s"] and megatron < ops
    record = v.Validation(runs, priced, settings).to_json()
    assert record["kernels"] == "megatron"
    assert [r["kernels"] for r in record["runs"]] == ["megatron", "megatron", "ops"]
    model = v.write_model_file(runs[0].shape, tmp_path)
    out = tmp_path / "plan.json"
    args = [model, *VALIDATION_RUNTIME]
    args += ["--hw", "a100", "--placement", "expert:1,4,2", "--devices", "8", "--global-batch", "64"]
    args += ["--micro-batch", "1", "--tp", "2", "--recompute", "full", "--rank-order", "tp-dp-pp"]
    args += ["--pipeline-transfer", "split", "--kernels", "megatron", "--json", str(out), "-q"]
    assert phazec.main([*args, "-o", str(tmp_path / "plan.mlir")]) == 0
    assert json.loads(out.read_text())["time_per_batch_s"] == megatron


def test_a_deep_models_runs_are_compiled_from_its_cut_as_from_its_whole_step(validated, monkeypatch):
    """The sample's 16-layer runs, with ``COMPILED_FROM_CUT`` at 16 blocks (the fixture, at the
    default bound, compiled them whole): each compilation is made from the model cut to 5 and 6
    blocks (``compile_from_cut``, a few blocks' passes) and prices every run as the whole
    step's compilation did; where ``compile_from_cut`` refuses, from the whole step again."""
    import phaze.deepen_compiled as dc

    _, data, _ = validated
    whole = {r["row"]: (r["predicted_s"], r["memory_bytes"]) for r in data["runs"] if r["layers"] == 16}
    runs = [r for r in v.assign_splits(v.read_runs(SAMPLE)) if r.row in whole]
    settings = v.Settings(v.pricing_options("a100"), quiet=True)
    original, made = dc.compile_from_cut, []

    def counting(*args, **kwargs):
        made.append(original(*args, **kwargs))
        return made[-1]

    assert 16 < v.COMPILED_FROM_CUT
    monkeypatch.setattr(v, "COMPILED_FROM_CUT", 16)
    monkeypatch.setattr(dc, "compile_from_cut", counting)
    from_cut, timing = v.validate(runs, settings, jobs=1)
    assert len(made) == timing["compilations"] == 2 and all(m is not None for m in made)
    assert {r: (p.predicted_s, p.memory_bytes) for r, p in from_cut.items()} == whole
    monkeypatch.setattr(dc, "compile_from_cut", lambda *args, **kwargs: None)
    assert v.validate(runs[:1], settings, jobs=1)[0] == {runs[0].row: from_cut[runs[0].row]}


def test_runs_without_a_prediction_are_listed_with_the_binding_constraint():
    runs = v.assign_splits(v.read_runs(SAMPLE))
    priced = {r.row: v.Priced(r.row, r.measured_s * 1.1, True) for r in runs}
    priced[3] = v.Priced(3, None, False, "memory: stage 0 needs 90.1 GiB per device, HBM 80 GiB")
    result = v.Validation(runs, priced, v.Settings(v.pricing_options("a100")))
    text = v.report_text(result)
    assert "not priced (1; not in the figures below):" in text
    assert "    3 dev     gpt-h1024-a16-l16-s1024 expert:4,1,1 b=1: memory: stage 0 needs 90.1 GiB" in text
    data = result.to_json()
    assert data["not_priced"] == [{"row": 3, "split": "dev", "note": priced[3].note}]
    assert data["summary"]["dev"]["priced"] == 7 and data["summary"]["dev"]["not_priced"] == 1
    assert data["summary"]["all"]["median_abs_error"] == pytest.approx(0.1)
    assert data["runs"][2]["predicted_s"] is None and data["runs"][2]["error"] is None


def test_phazec_validate_is_phaze_validate():
    r = run_main("phazec", "validate", "--help")
    assert r.returncode == 0 and r.stdout.startswith("usage: phaze-validate"), r.stderr


def test_the_schedule_cache_is_kept_under_its_limit(tmp_path):
    """``--cache DIR`` keeps the runs' schedules there; ``--cache-limit`` trims it after the run,
    as phazec trims its own (least recently used entries first), and says so."""
    cache = tmp_path / "schedules"
    # tpuv4: an ideal chip, its layers scheduled by SCIP (the calibrated GPUs keep no schedules).
    one = (str(SAMPLE), "--hw", "tpuv4", "-j", "1", "--rows", "1", "--cache", str(cache))
    kept = run_validate(*one)
    assert kept.returncode == 0, kept.stderr
    assert list(cache.rglob("*.json")) and "least recently used" not in kept.stderr
    trimmed = run_validate(*one, "--cache-limit", "1")
    assert trimmed.returncode == 0, trimmed.stderr
    assert not list(cache.rglob("*.json")) and "under 1 B (--cache-limit)" in trimmed.stderr
