"""``phaze-validate`` on hostile CSVs (issue 44, the second hostile pass): 20,000 identical runs
are read once and priced once; a row with a value beyond its physical plausibility bound is
refused alone, before anything is traced, in one line naming its row, column and bound, while
the other rows are priced (exit status 3); every bound a message states is the true one; the
messages name the CSV's columns, never Python's names.

The runs are a tiny GPT (hidden 64, 2 heads, 2 layers, sequence 32, vocabulary 128) on one GPU,
with a one-node solver limit: a trace costs about a second once torch is loaded."""

from __future__ import annotations

import json
import re
from dataclasses import fields

import pytest
from conftest import ROOT

from phaze import validate as v
from phaze_ir.errors import PhazeError

HEADER = (
    "# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
    "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms),vocabulary"
)
#: The tiny run, without its measured time.
TINY = "1,2,1,64,2,2,32,1,1,1"
#: Another run of the same model (global batch 4): priced apart.
OTHER = "1,4,1,64,2,2,32,1,1,1"
SETTINGS = v.Settings(v.pricing_options("a100", schedule_nodes=1), quiet=True)
#: A Python name in a message (``global_batch``, ``problem.devices``): the user typed a column.
PYTHON_NAME = re.compile(r"\b[a-z]+_[a-z_]+\b|\b[a-z]+\.[a-z_]+\b")


def python_names(message: str) -> list[str]:
    """The Python names in ``message``, the CSV's name (``t.csv``) aside."""
    return PYTHON_NAME.findall(message.replace("t.csv", ""))


UP = "expected a positive integer up to"


@pytest.fixture
def counted(monkeypatch):
    """The models traced (name, micro-batch) and the runs placed (one plan read each)."""
    from phaze.plan import plan_output
    from phaze_ir import frontend

    traced: list[tuple[str, int]] = []
    placed: list[int] = []
    trace_step, plan_record = frontend.trace_cut_or_whole, plan_output.plan_record

    def counting_trace(spec, micro_batch_size=1, *args, **kwargs):
        traced.append((spec.name, micro_batch_size))
        return trace_step(spec, micro_batch_size, *args, **kwargs)

    def counting_plan(module):
        placed.append(1)
        return plan_record(module)

    monkeypatch.setattr(frontend, "trace_cut_or_whole", counting_trace)
    monkeypatch.setattr(plan_output, "plan_record", counting_plan)
    return traced, placed


# ------------------------------------------------------------------------------------------
# 1. Identical runs are read once and priced once
# ------------------------------------------------------------------------------------------


def test_20000_identical_runs_are_read_once_and_priced_once(counted, monkeypatch):
    """20,000 rows of one run (three measured times) and one row of another: two rows read and
    checked, one trace, two placements; every row reported, each with its own error, and the
    shared price is the one the run gets alone."""
    traced, placed = counted
    checked: list[int] = []
    run = v._run

    def counting_run(row, columns, n, line, name):
        checked.append(n)
        return run(row, columns, n, line, name)

    monkeypatch.setattr(v, "_run", counting_run)
    text = HEADER + "\n" + "".join(f"{TINY},{10 + k % 3},128\n" for k in range(20_000)) + f"{OTHER},30,128\n"
    runs = v.assign_splits(v.parse_runs(text, "same.csv"))
    assert checked == [1, 20_001]  # the first of the 20,000 and the other run
    assert len(runs) == 20_001 and runs[19_999].measured_ms == 10 + 19_999 % 3 and runs[-1].line == 20_002
    assert [r.split for r in runs].count("holdout") == round(0.2 * 20_001)

    priced, timing = v.validate(runs, SETTINGS, jobs=1)
    assert traced == [("gpt-h64-a2-l2-s32-v128", 1)] and len(placed) == 2
    assert (timing["traces"], timing["compilations"], timing["placements"]) == (1, 1, 20_001)
    assert (timing["distinct_runs"], timing["refused"]) == (2, 0)
    assert sorted(priced) == list(range(1, 20_002)) and all(priced[r].row == r for r in priced)
    tiny = priced[1].predicted_s
    assert tiny and all(priced[r].predicted_s == tiny for r in range(1, 20_001))
    assert priced[20_001].predicted_s != tiny  # the other run: its own price

    data = v.Validation(runs, priced, SETTINGS).to_json()
    assert [r["row"] for r in data["runs"]] == list(range(1, 20_002))
    assert data["runs"][1]["error"] == pytest.approx(tiny / 0.011 - 1)
    assert data["summary"]["all"]["priced"] == 20_001 and data["not_priced"] == []

    alone, _ = v.validate(v.parse_runs(f"{HEADER}\n{TINY},10,128\n{OTHER},30,128\n", "alone.csv"), SETTINGS, jobs=1)
    assert (alone[1].predicted_s, alone[2].predicted_s) == (tiny, priced[20_001].predicted_s)
    assert (alone[1].memory_bytes, alone[1].recompute) == (priced[17].memory_bytes, priced[17].recompute)


def test_what_prices_a_run_is_every_column_but_its_row_time_and_split():
    """Runs equal but for their row, line, measured time and split share a price; a run naming
    the flag's recompute or kernels and one naming none too; any other field tells them apart
    (a field added to Run later is in the key unless it is declared not to price)."""
    (run,) = v.parse_runs(f"{HEADER},recompute,kernels\n{TINY},10,128,,\n", "k.csv")
    key = v.pricing_key(run, SETTINGS)
    same = v._with(run, row=9, line=12, measured_ms=99.0, split="holdout")
    assert v.pricing_key(same, SETTINGS) == key
    given = SETTINGS.options
    assert v.pricing_key(v._with(run, recompute=given.recompute, kernels=given.kernels), SETTINGS) == key
    changed = {"dtype": "bfloat16", "pipeline_schedule": "interleaved:2", "rank_order": "tp-pp-dp"}
    changed |= {"pipeline_transfer": "whole", "sequence_parallel": True, "recompute": "none", "kernels": "megatron"}
    for f in fields(v.Run):
        if f.name in {"row", "line", "measured_ms", "split", "refused"}:
            continue
        other = changed.get(f.name, getattr(run, f.name) + 1 if isinstance(getattr(run, f.name), int) else None)
        assert other is not None, f.name
        assert v.pricing_key(v._with(run, **{f.name: other}), SETTINGS) != key, f.name


# ------------------------------------------------------------------------------------------
# 2. An implausible row is refused alone, before anything is traced
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "row, said",
    [
        # The row: a hidden size of 1,048,576,000 (torch's storage size overflows).
        ("1,2,1,1048576000,16,2,32,1,1,1,10,128", f"'hidden size' is '1048576000', {UP} 1048576"),
        ("1,2,1,1048577,1,2,32,1,1,1,10,128", f"'hidden size' is '1048577', {UP} {2**20}"),
        ("1,2,1,64,2,99999999999,32,1,1,1,10,128", f"'# layers' is '99999999999', {UP} 4096"),
        ("1,2,1,64,2,4097,32,1,1,1,10,128", f"'# layers' is '4097', {UP} 4096"),
        ("1,2,1,64,2,2,16777217,1,1,1,10,128", f"'sequence length' is '16777217', {UP} {2**24}"),
        ("1,16777217,1,64,2,2,32,1,1,1,10,128", f"'global batch' is '16777217', {UP} {2**24}"),
        ("1048577,1048577,1,64,2,2,32,1,1048577,1,10,128", f"'# GPUs' is '1048577', {UP} {2**20}"),
        ("1,2,1,64,2,2,32,1,1,1,10,4194305", f"'vocabulary' is '4194305', {UP} {2**22}"),
        ("1,2,1,64,2,2,32,1,1,1,10,1e30", f"'vocabulary' is '1e30', {UP} 4194304"),
        # Each column within its bound, the step not: 2^60 attention scores a layer.
        (
            "1,1,1,4096,4096,2,16777216,1,1,1,10,128",
            "the step of hidden size 4096, 4096 attention heads, 2 layers, sequence length 16777216 and micro batch 1 "
            "needs about 11.5 EB, expected at most 268 PB (the memory of 1048576 GPUs of 256 GB)",
        ),
    ],
)
def test_an_implausible_row_is_refused_alone_naming_its_column_and_bound(row, said):
    runs = v.parse_runs(f"{HEADER}\n{TINY},10,128\n{row}\n{OTHER},30,128\n", "t.csv")
    assert [r.refused for r in runs][::2] == ["", ""]
    refused = runs[1].refused
    assert refused.startswith(said) and "\n" not in refused and not python_names(refused), refused
    assert runs[1].where("t.csv") == "t.csv:3: row 2"


@pytest.mark.parametrize(
    "row",
    [
        "1048576,1048576,1,64,2,2,32,1,1048576,1,10,128",  # the GPUs' bound
        "1,16777216,16777216,64,2,2,32,1,1,1,10,128",  # the batches'
        "1,2,1,1048576,1048576,2,32,1,1,1,10,128",  # the hidden size's and heads'
        "1,2,1,64,2,4096,32,1,1,1,10,128",  # the layers'
        "1,2,1,64,2,2,16777216,1,1,1,10,4194304",  # the sequence's and the vocabulary's
    ],
)
def test_a_row_at_its_bounds_is_not_refused(row):
    (run,) = v.parse_runs(f"{HEADER}\n{row}\n", "t.csv")
    assert run.refused == "" and v.step_bytes(run) <= v.MAX_STEP_BYTES


def test_no_measured_run_is_refused():
    """The bounds refuse no run measured: the vTrain files and the sample."""
    for path in [*(ROOT / "data" / "vtrain").glob("*.csv"), ROOT / "tests" / "data" / "vtrain_single_sample.csv"]:
        runs = v.read_runs(path)
        assert runs and not [r.row for r in runs if r.refused], path
        assert max(v.step_bytes(r) for r in runs) < v.MAX_STEP_BYTES / 1000


def test_the_tool_refuses_the_row_prices_the_others_and_says_so_in_its_exit_status(counted, tmp_path, capsys):
    """The issue's file: one row of hidden size 1,048,576,000 among good ones.  Its row is said
    on stderr (file, line, row, column, bound) before anything is traced; the others are
    priced; the report lists it among the runs not priced; the JSON says why; exit status 3."""
    from phaze.tools import phaze_validate

    traced, _ = counted
    csv = tmp_path / "runs.csv"
    csv.write_text(f"{HEADER}\n{TINY},10,128\n1,2,1,1048576000,16,2,32,1,1,1,10,128\n{OTHER},30,128\n")
    out = tmp_path / "v.json"
    rc = phaze_validate.main([str(csv), "--hw", "a100", "-j", "1", "--solver-nodes", "1", "--json", str(out)])
    stdout, stderr = capsys.readouterr()
    assert rc == phaze_validate.REFUSED_ROWS_STATUS == 3
    said = (
        f"phaze-validate: {csv}:3: row 2: 'hidden size' is '1048576000', expected a positive integer up to 1048576 "
        "(refused; the other rows are priced)"
    )
    lines = stderr.splitlines()
    assert lines[0] == said and "traced" in lines[2], stderr  # said first, then the work
    assert not any("refused, not priced" in line for line in lines)  # its one line: no count after the report
    assert traced == [("gpt-h64-a2-l2-s32-v128", 1)]  # the refused model is never built
    assert "not priced (1; not in the figures below):" in stdout
    assert "gpt-h1048576000-a16-l2-s32-v128 expert:1,1,1 b=1: refused: 'hidden size' is '1048576000'" in stdout
    data = json.loads(out.read_text())
    assert [r["predicted_s"] is not None for r in data["runs"]] == [True, False, True]
    assert data["not_priced"][0]["note"].startswith("refused: 'hidden size' is '1048576000'")
    assert (data["summary"]["all"]["priced"], data["timing"]["refused"], data["timing"]["placements"]) == (2, 1, 2)


def test_a_file_of_refused_rows_only_is_reported_without_pricing(counted, tmp_path, capsys):
    """Only refused rows: nothing traced, every row reported, 10 said one by one and the rest
    counted, exit status 3."""
    from phaze.tools import phaze_validate

    traced, placed = counted
    csv = tmp_path / "runs.csv"
    csv.write_text(HEADER + "\n" + "1,2,1,64,2,5000,32,1,1,1,10,128\n" * 12)
    rc = phaze_validate.main([str(csv), "--hw", "a100", "-j", "1", "-q", "--summary-only"])
    stdout, stderr = capsys.readouterr()
    assert rc == 3 and traced == [] and placed == []
    lines = stderr.splitlines()
    assert len(lines) == 12 and all(
        "'# layers' is '5000', expected a positive integer up to 4096" in s for s in lines[:10]
    )
    assert lines[10] == "phaze-validate: and 2 more rows refused (the report lists them)"
    assert "not priced (12; not in the figures below):" in stdout


def test_a_model_that_fails_to_trace_leaves_its_runs_unpriced_and_the_others_priced(counted, monkeypatch):
    """Past the row checks, a model that cannot be traced is its runs' note (as a compilation
    that fails is), not the end of the validation."""
    from phaze_ir import frontend

    traced, _ = counted
    trace_step = frontend.trace_cut_or_whole

    def failing(spec, micro_batch_size=1, *args, **kwargs):
        if spec.name.startswith("gpt-h128"):
            raise PhazeError(f"cannot trace {spec.name}: out of luck")
        return trace_step(spec, micro_batch_size, *args, **kwargs)

    monkeypatch.setattr(frontend, "trace_cut_or_whole", failing)
    runs = v.parse_runs(
        f"{HEADER}\n1,2,1,128,2,2,32,1,1,1,10,128\n{TINY},10,128\n1,4,1,128,2,2,32,1,1,1,9,128\n", "t.csv"
    )
    priced, timing = v.validate(runs, SETTINGS, jobs=1)
    assert priced[2].predicted_s and priced[2].feasible
    for row in (1, 3):
        assert priced[row].predicted_s is None
        assert priced[row].note == "not priced: cannot trace gpt-h128-a2-l2-s32-v128: out of luck"
    assert traced == [("gpt-h64-a2-l2-s32-v128", 1)] and timing["traces"] == 2  # the other raised at once


# ------------------------------------------------------------------------------------------
# 3, 4. Every message states its true bound, in the user's words
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "row, said",
    [
        (
            "1,2,four,64,2,2,32,1,1,1,10,128",
            "row 1: 'micro batch' is 'four', expected a positive integer up to 16777216",
        ),
        ("1,2,1,64,2,0,32,1,1,1,10,128", "row 1: '# layers' is '0', expected a positive integer up to 4096"),
        ("1,2,1,64,2,2.5,32,1,1,1,10,128", "row 1: '# layers' is '2.5', expected a positive integer up to 4096"),
        ("1,2,1,64,2,1e400,32,1,1,1,10,128", "row 1: '# layers' is '1e400', expected a positive integer up to 4096"),
        ("0,2,1,64,2,2,32,1,1,1,10,128", "row 1: '# GPUs' is '0', expected a positive integer up to 1048576"),
        ("1,2,1,64,2,2,32,1,1,1,10,0", "row 1: 'vocabulary' is '0', expected a positive integer up to 4194304"),
        # 5,000 digits: more than Python's int() reads, said as any other number.
        ("1,2,1,64,2,2,32,1,1,1,10," + "9" * 5000, "row 1: 'vocabulary' is '999"),
        ("1,2,1,64,2,2,32,1,1,1,-1,128", "row 1: 'iteration time (ms)' is '-1', expected a positive number of "),
        ("1,2,1,64,2,2,32,1,1,1,1e309,128", "'1e309', expected a positive number of milliseconds (one iteration's: "),
        # Python's float() reads these; no spreadsheet writes them for a number (session 61's probes).
        ("1,2,1,64,2,2,32,1,1,1,1_000,128", "'1_000', expected a positive number of milliseconds (one iteration's: "),
        ("1,2,1,64,2,2,1_000,1,1,1,10,128", "'sequence length' is '1_000', expected a positive integer"),
        ("1,2,1,64,2,2,32,1,1,1,infinity,128", "from 0.001 to 1e+09 ms)"),
    ],
)
def test_a_bad_value_says_its_true_bound_in_the_columns_words(row, said):
    try:
        runs = v.parse_runs(f"{HEADER}\n{row}\n", "t.csv")
    except PhazeError as e:
        message = str(e)
    else:  # beyond the bound but a number: the row is refused, the file read
        assert len(runs) == 1 and runs[0].refused
        message = f"{runs[0].where('t.csv')}: {runs[0].refused}"
    assert said in message and "\n" not in message, message
    assert not python_names(message), message


def test_the_consistency_checks_speak_the_columns_words():
    """The checks of a row against itself: no Python name (``global_batch``, ``run.tp``)."""
    for row in (
        "8,32,4,1024,16,24,1024,2,2,1,219.7,128",
        "8,30,4,1024,16,24,1024,2,2,2,1,128",
        "8,32,4,1024,12,24,1024,8,1,1,219.7,128",
        "3,3,1,1024,16,24,1024,3,1,1,9,128",
        "8,32,4,1024,16,2,1024,1,1,8,219.7,128",
    ):
        with pytest.raises(PhazeError) as e:
            v.parse_runs(f"{HEADER}\n{row}\n", "t.csv")
        assert str(e.value).startswith("t.csv:2: row 1: ") and not python_names(str(e.value)), str(e.value)


def test_a_row_just_within_the_step_bound_is_priced_without_overflow():
    """Two thirds of MAX_STEP_BYTES (2^24 tokens, 64 heads, no recompute: every layer's scores
    kept): priced, not refused and not an overflow; the plan does not fit, and its memory, a
    64-bit count, is within a few times of the estimate."""
    text = f"{HEADER},recompute\n1,1,1,4096,64,2,16777216,1,1,1,10,128,none\n"
    (run,) = v.parse_runs(text, "t.csv")
    assert run.refused == "" and 0.5 < v.step_bytes(run) / v.MAX_STEP_BYTES < 1
    priced, _ = v.validate([run], SETTINGS, jobs=1)
    p = priced[1]
    assert p.predicted_s is None and not p.feasible and p.note.startswith("memory: "), p.note
    assert v.step_bytes(run) / 4 < p.memory_bytes < 4 * v.step_bytes(run) < 2**63
