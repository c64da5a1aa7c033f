"""The second hostile pass (issue 44): input that once ended in a traceback, a hang or a silent
wrong answer now gives one line (or, in a cache, a warning and a recomputation)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import warnings
from pathlib import Path

import pytest

from passes.algorithms import schedule as S
from passes.cache_file import FORMAT, VERSION, BadEntry, Store, read_entry
from phaze_ir.errors import PhazeWarning

# -- the cache ------------------------------------------------------------------------------------


def _schedule_entry(tmp_path: Path) -> tuple[S.Problem, Path]:
    """A schedule solved into the cache ``tmp_path``: its problem and its entry file."""
    p = S.Problem.make([("tensor", 4.0, 1.5), ("vector", 2.0, 1.0)], [(0, 1)], {"tensor": 1, "vector": 1})
    cache = S.ScheduleCache(tmp_path)
    cache.solve(p)
    file = cache.file(p.canonical())
    assert file is not None
    return p, file


def _lookup(directory: Path, problem: S.Problem) -> tuple[S.Schedule | None, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = S.ScheduleCache(directory).get(problem)
    return got, [str(w.message) for w in caught if issubclass(w.category, PhazeWarning)]


def test_a_cache_entry_holding_an_infinite_number_is_ignored(tmp_path):
    p, file = _schedule_entry(tmp_path)
    text = file.read_text()
    entry = json.loads(text)
    makespan = entry["payload"]["schedule"]["makespan"]
    file.write_text(text.replace(f'"makespan": {json.dumps(makespan)}', '"makespan": 1e999', 1))
    assert "1e999" in file.read_text()
    assert _lookup(tmp_path, p) == (
        None,
        [f"schedule cache entry {file} holds a number out of range or nesting too deep: ignored, solved again"],
    )


# -- deep nesting ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '"builtin.module"() ({ %0 = "test.op"() {a = ' + "[" * 400 + "]" * 400 + "} : () -> i32 }) : () -> ()\n",
        '"builtin.module"() ({\n' + '"test.op"() ({\n' * 400 + "}) : () -> ()\n" * 400 + "}) : () -> ()\n",
    ],
    ids=["attributes", "regions"],
)
def test_mlir_nested_too_deeply_is_one_error(tmp_path, capsys, text):
    from phaze.tools import phaze_opt

    file = tmp_path / "deep.mlir"
    file.write_text(text)
    assert phaze_opt.main([str(file)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "RecursionError" not in err
    (line,) = err.splitlines()  # one line: where, what, and the source at the column quoted
    assert line.startswith(f"{file}:") and ": error: nested too deeply for the parser (at '" in line


@pytest.mark.parametrize(
    "value", ["[" * 2000 + "]" * 2000, "{a = " * 2000 + "1" + "}" * 2000], ids=["arrays", "tables"]
)
def test_a_hardware_toml_nested_too_deeply_is_one_error(tmp_path, value):
    from phaze_ir.hardware import HardwareError, load_hardware

    file = tmp_path / "deep.toml"
    file.write_text(f"name = {value}\n")
    with pytest.raises(HardwareError) as e:
        load_hardware(str(file))
    assert str(e.value) == f"{file}: arrays or inline tables nested too deeply"


# -- options the model cannot take ----------------------------------------------------------------


def _layers(experts: int) -> list:
    from passes.algorithms.placement import LayerNumbers

    dense = LayerNumbers(1e-3, 2e-3, (0.0, 0.0, 0.0), (8, 8, 8), 64, 64, 128, 0, 16)
    moe = LayerNumbers(1e-3, 2e-3, (0.0, 0.0, 0.0), (8, 8, 8), 64, 64, 128, 0, 16, experts, 32, 32, 64, 8)
    return [dense, moe] if experts else [dense, dense]


@pytest.mark.parametrize(
    ("experts", "why"),
    [
        (0, "expert parallel 2: the model has no experts (no MoE layer); expected 1 or auto"),
        (3, "expert parallel 2: expected a degree that divides the model's 3 experts"),
    ],
)
def test_expert_parallel_the_model_cannot_take_is_a_placement_error(experts, why):
    from passes.algorithms import placement as pl
    from passes.algorithms.placement_options import PlacementOptions
    from passes.algorithms.priced_step import PricedStep

    def problem(ep: str):
        options = PlacementOptions(devices=8, global_batch=8, expert_parallel=ep)
        return pl.problem(
            PricedStep(_layers(experts), micro_batch=1, tp=1),
            options,
            hbm_bytes=1 << 30,
            levels=[],
            memory_bound_Bps=1e12,
        )

    with pytest.raises(pl.PlacementError) as e:
        problem("2")
    assert str(e.value) == why
    problem("1")
    problem("auto")


# -- files that are not regular files, or too large -----------------------------------------------


def _fifo(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    os.mkfifo(path)  # opened for reading, blocks until a writer comes: it must not be opened so
    return path


@contextlib.contextmanager
def _within(seconds: float):
    """A hang (a FIFO opened for reading) fails the test instead of stopping the suite."""

    def stop(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("kind", ["fifo", "large"])
def test_hardware_and_space_files_that_would_hang_or_fill_memory_are_refused(tmp_path, kind):
    from phaze.search.arch_space import ArchSpaceError, load_space
    from phaze_ir.hardware import HardwareError, load_hardware

    if kind == "fifo":  # as /dev/zero (endless) and /dev/urandom: not a regular file
        path = str(_fifo(tmp_path, "hw.toml"))
        why = f"{path}: is not a regular file, expected a TOML file"
    else:
        path = str(tmp_path / "hw.toml")
        with open(path, "wb") as f:
            os.truncate(f.fileno(), 2 << 20)  # sparse, as the next one: no disk used
        why = f"{path}: holds 2 MiB, more than the 1 MiB a TOML file may hold"
    with _within(10), pytest.raises(HardwareError) as e:
        load_hardware(path)
    assert str(e.value) == why
    with _within(10), pytest.raises(ArchSpaceError) as e2:
        load_space(path)
    assert str(e2.value) == why


@pytest.mark.parametrize("kind", ["fifo", "large"])
def test_a_cache_entry_that_would_hang_or_fill_memory_is_ignored(tmp_path, kind):
    p, file = _schedule_entry(tmp_path)
    file.unlink()
    if kind == "fifo":
        _fifo(file.parent, file.name)
        why = "is not a regular file, expected a cache entry"
    else:
        with open(file, "wb") as f:
            os.truncate(f.fileno(), 257 << 20)  # sparse: no disk used (2 GB would be read whole)
        why = "holds 257 MiB, more than the 256 MiB a cache entry may hold"
    with _within(10):
        got = _lookup(tmp_path, p)
    assert got == (None, [f"schedule cache entry {file} cannot be read ({why}): ignored, solved again"])
    with _within(10), pytest.raises(BadEntry):
        read_entry(file, FORMAT, VERSION, S.ScheduleCache(tmp_path).key(p.canonical()))


# -- outputs land together, or not at all ---------------------------------------------------------


def test_outputs_are_written_together_or_not_at_all(tmp_path):
    from phaze.outputs import write_together
    from phaze_ir.errors import PhazeError

    plan, js, report = tmp_path / "plan.mlir", tmp_path / "plan.json", tmp_path / "gone" / "report.html"
    plan.write_text("the old plan\n")
    js.write_text("the old JSON\n")
    with pytest.raises(PhazeError, match=r"report\.html: cannot write: No such file or directory"):
        write_together([(plan, "new plan\n"), (js, "new JSON\n"), (report, "new report\n")])
    assert (plan.read_text(), js.read_text()) == ("the old plan\n", "the old JSON\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "plan.mlir"]  # no temporary left
    write_together([(plan, "new plan\n"), (js, "new JSON\n")])
    assert (plan.read_text(), js.read_text()) == ("new plan\n", "new JSON\n")


def test_a_plan_that_does_not_fit_changes_no_output_unless_asked(tmp_path):
    from conftest import MODELS, run_main

    plan, js = tmp_path / "plan.mlir", tmp_path / "plan.json"
    plan.write_text("the old plan\n")
    js.write_text("the old JSON\n")
    args = [str(MODELS / "tiny_gpt2.py"), "--hw", "a100", "--devices", "8", "--global-batch", "4"]
    args += ["--micro-batch", "1", "--tp", "1", "--placement", "expert:1,8,1", "-o", str(plan), "--json", str(js)]
    r = run_main("phazec", *args, "-q")  # DP 8 cannot split 4 samples
    assert r.returncode == 1 and "Traceback" not in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("phazec: error: ") and "no placement fits" in r.stderr
    assert r.stderr.rstrip().endswith(f"; nothing written to {plan}, {js} (--write-infeasible writes it)")
    assert (plan.read_text(), js.read_text()) == ("the old plan\n", "the old JSON\n")
    r = run_main("phazec", *args, "-q", "--write-infeasible")
    assert r.returncode == 1 and "nothing written" not in r.stderr, r.stderr
    assert "feasible = no" in plan.read_text() and json.loads(js.read_text())["feasible"] is False


# -- a plan whose attributes contradict its ops ---------------------------------------------------


@pytest.mark.parametrize(
    ("width", "why"),
    [
        ("1 : i64", None),
        ("8 : i64", "phaze.tp_width = 8 is not how the step is sharded (it has no collective)"),
        ('"one"', "'builtin.module' op phaze.tp_width = \"one\": expected a positive integer"),
        ("0 : i64", "'builtin.module' op phaze.tp_width = 0 : i64: expected a positive integer"),
    ],
)
def test_place_devices_refuses_a_tp_width_that_is_not_the_sharding(tmp_path, capsys, width, why):
    from conftest import MODELS, compiled

    from phaze.tools import phaze_opt

    text = compiled(str(MODELS / "tiny_gpt2.py"), "recompute")
    assert text.count("phaze.tp_width = 1 : i64") == 1
    file = tmp_path / "edited.mlir"
    file.write_text(text.replace("phaze.tp_width = 1 : i64", f"phaze.tp_width = {width}"))
    status = phaze_opt.main([str(file), "-p", "phaze-place-devices{devices=8 global_batch=8}"])
    out, err = capsys.readouterr()
    if why is None:
        assert status == 0 and "tp = 1," in out, err
    else:
        assert status == 1 and err.count("\n") == 1 and why in err, err


@pytest.fixture(scope="module")
def tiny_plan() -> str:
    """The plan of the tiny GPT-2 on 8 A100s (in-process, cached across tests)."""
    from conftest import MODELS

    from phaze.tools.phazec import _parser, compile_model

    args = [str(MODELS / "tiny_gpt2.py"), "--hw", "a100", "--devices", "8", "--global-batch", "8"]
    args += ["--micro-batch", "1", "--tp", "1", "--no-cache", "-q"]
    text, failure = compile_model(_parser().parse_args(args), lambda msg: None)
    assert failure is None
    return text


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        (", dp = 8,", ", dp = -8,", ":1:{}: error: field 'dp' of phaze.plan = -8: expected an integer from 0 to"),
        (
            "max_memory_bytes = ",
            "max_memory_bytes = 100000000000000000000000",
            ":1:{}: error: field 'max_memory_bytes' of phaze.plan = 100000000000000000000000: expected an integer",
        ),
        (
            "phaze.micro_batch_size = 1 : i64",
            "phaze.micro_batch_size = 1.5 : f64",
            "phaze-opt: error: 'builtin.module' op phaze.micro_batch_size = 1.500000e+00 : f64: "
            "expected a positive integer",
        ),
        (
            "phaze.target = @acc",
            "phaze.target = @nope",
            "phaze-opt: error: 'builtin.module' op phaze.target = @nope: expected the symbol of an op of the module",
        ),
    ],
    ids=["negative", "beyond-i64", "f64", "no-symbol"],
)
def test_phaze_opt_refuses_a_plan_whose_attributes_are_out_of_range(tmp_path, capsys, tiny_plan, old, new, why):
    import re

    from phaze.tools import phaze_opt

    assert tiny_plan.count(old) == 1
    if old == "max_memory_bytes = ":
        text = re.sub(r"max_memory_bytes = \d+", new, tiny_plan, count=1)
    else:
        text = tiny_plan.replace(old, new)
    file = tmp_path / "plan.mlir"
    file.write_text(text)
    assert phaze_opt.main([str(file)]) == 1
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    if why.startswith(":1:"):  # a parse error at the field: file:line:col, an excerpt and a caret
        # the module's first line, below the summary's comment block
        line = 1 + next(i for i, s in enumerate(text.splitlines()) if s.startswith("builtin.module"))
        assert first.startswith(f"{file}:{line}:") and why.split("{}")[1] in first, err
    else:
        assert first == why, err
    assert "Traceback" not in err
    file.write_text(tiny_plan)
    assert phaze_opt.main([str(file)]) == 0


# -- phaze-validate's CSV -------------------------------------------------------------------------

_HEAD = "# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
_HEAD += "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)"
_ROW = "8,4,1,1024,16,16,1024,1,2,4,77.2"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (
            _HEAD + ",# layers\n" + _ROW + ",12\n",
            "v.csv:1: column '# layers' is given 2 times (columns [6, 12]): expected once",
        ),
        (_HEAD + "\n" + _ROW + ",12,bf16\n", "v.csv:2: row 1 has 13 cells, expected at most the header's 11"),
    ],
    ids=["duplicated-column", "extra-cells"],
)
def test_validate_refuses_a_csv_whose_cells_are_ambiguous(text, why):
    from phaze import validate
    from phaze_ir.errors import PhazeError

    with pytest.raises(PhazeError) as e:
        validate.parse_runs(text, "v.csv")
    assert str(e.value) == why
    (run,) = validate.parse_runs(_HEAD + "\n" + _ROW + ",\n", "v.csv")  # an empty trailing cell is no cell
    assert run.layers == 16


# -- a cache entry forged with its hashes recomputed ----------------------------------------------


def _answer_payload() -> dict:
    """An ``hw-answer`` payload of a feasible plan as phaze keeps it (the fields the check reads)."""
    thr = 64 / 0.0198
    plan = {
        "devices": 8, "global_batch": 64, "dp": 8, "pp": 1, "tp": 1, "cp": 1, "micro_batch_size": 8,
        "num_micro_batches": 1, "devices_used": 8, "time_per_batch_s": 0.0198, "throughput_samples_per_s": thr,
        "max_memory_bytes": 1 << 30,
        "accelerator": {"name": "a100", "hbm": {"bytes": 80 << 30}}, "feasible": True, "binding": "", "candidates": [],
    }  # fmt: skip
    from phaze_ir.attributes import format_float

    text = "builtin.module attributes {phaze.plan = #phaze.plan<devices = 8, global_batch = 64, dp = 8, "
    text += f"time_per_batch_s = {format_float(0.0198)}, throughput_samples_per_s = {format_float(thr)}, "
    text += "max_memory_bytes = 1073741824>} {\n}\n"
    return {
        "text": text,
        "plan": plan,
        "summary": "",
        "layer_kinds": [],
        "seq_len": None,
        "model_shape": {},
        "warnings": [],
    }


@pytest.mark.parametrize(
    ("forge", "why"),
    [
        (lambda p: p["plan"].update(throughput_samples_per_s=999_999.0), "a throughput that is the batch over its"),
        (lambda p: p["plan"].update(time_per_batch_s=64 / 999_999.0, throughput_samples_per_s=999_999.0), "text"),
        (lambda p: p["plan"].update(max_memory_bytes=81 << 30), "memory within the chip's HBM"),
        (lambda p: p["plan"].update(dp=16, devices_used=16), "at most the cluster's"),
        (lambda p: p["plan"].update(cp=2), "devices are dp x cp x pp x tp"),
        (lambda p: p["plan"].update(num_micro_batches=2), "micro-batches make up the global batch"),
        (lambda p: p["plan"].update(accelerator={"hbm": 5}), "memory within the chip's HBM"),
    ],
    ids=["throughput", "text", "memory", "devices", "cp", "batch", "no-hbm"],
)
def test_a_cached_plan_whose_numbers_disagree_is_not_served(forge, why):
    from phaze import hw_answer

    payload = _answer_payload()
    assert hw_answer.check_answer(payload).plan == payload["plan"]
    context_parallel = _answer_payload()  # DP 4 x CP 2 on the 8 devices: served (the DP's devices_used)
    context_parallel["plan"].update(dp=4, cp=2, num_micro_batches=2)
    assert hw_answer.check_answer(context_parallel).plan["cp"] == 2
    forge(payload)
    with pytest.raises(BadEntry, match=why):
        hw_answer.check_answer(payload)


# -- refused before any work ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (
            ["--micro-batch", "3", "--global-batch", "64"],
            "--global-batch 64 is not a multiple of the micro-batch size (3): "
            "expected a micro-batch size that divides the global batch",
        ),
        (
            ["--placement", "expert:2,2,2", "--devices", "4"],
            "--placement expert:2,2,2 needs 8 devices: expected at most --devices 4",
        ),
    ],
    ids=["batch", "placement"],
)
def test_options_the_run_cannot_take_are_refused_before_the_model_is_loaded(tmp_path, flags, why):
    from phaze.tools.phazec import _parser, compile_model
    from phaze_ir.errors import PhazeError

    model = tmp_path / "never_imported.py"
    model.write_text("raise SystemExit('the model was imported')\n")
    args = _parser().parse_args([str(model), "--hw", "a100", *flags, "-o", str(tmp_path / "p.mlir"), "-q"])
    with pytest.raises(PhazeError) as e:
        compile_model(args, lambda msg: None)
    assert str(e.value) == why


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (["--zero", "1"], "--export torchtitan: ZeRO-1 shards the optimizer state but not the parameters"),
        (["--optimizer", "sgd"], "--export torchtitan: torchtitan 0.3.0 has no sgd optimizer"),
    ],
    ids=["zero-1", "sgd"],
)
def test_an_export_the_options_rule_out_is_refused_before_the_model_is_loaded(tmp_path, capsys, flags, why):
    from phaze.tools import phazec

    model = tmp_path / "never_imported.py"
    model.write_text("raise SystemExit('the model was imported')\n")
    args = [str(model), "--hw", "a100", *flags, "--export", "torchtitan", str(tmp_path / "t.args")]
    assert phazec.main([*args, "-o", str(tmp_path / "p.mlir"), "-q"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"phazec: error: {why}") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["never_imported.py"]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_an_output_on_a_file_system_that_takes_no_file_is_refused_before_any_work(tmp_path, capsys):
    from phaze.tools import phazec

    model = tmp_path / "never_imported.py"
    model.write_text("raise SystemExit('the model was imported')\n")
    assert phazec.main([str(model), "--hw", "a100", "-o", "/proc/version", "-q"]) == 1
    err = capsys.readouterr().err
    assert err == "phazec: error: -o /proc/version: cannot write: the directory /proc takes no new file\n"


def test_validate_refuses_a_csv_that_is_not_a_regular_file(tmp_path):
    from phaze import validate
    from phaze_ir.errors import PhazeError

    fifo = _fifo(tmp_path, "runs.csv")
    with _within(10), pytest.raises(PhazeError) as e:
        validate.read_runs(fifo)
    assert str(e.value) == f"{fifo}: is not a regular file, expected a CSV file"


def test_phaze_opt_refuses_an_input_that_is_not_a_regular_file(tmp_path, capsys):
    from phaze.tools import phaze_opt

    fifo = _fifo(tmp_path, "in.mlir")
    with _within(10):
        assert phaze_opt.main([str(fifo)]) == 1
    assert capsys.readouterr().err == f"phaze-opt: error: {fifo}: is not a regular file, expected a .mlir file\n"


def test_a_stage_entry_whose_check_reads_past_its_payload_is_ignored(tmp_path):
    stages = Store.of(str(tmp_path))
    key = stages.key("probe", "a question")
    stages.keep("probe", key, {"answer": 42})  # hashes right, shape not what the reader expects
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert stages.load("probe", key, lambda payload: payload["answers"][0]) is None
    (said,) = [str(w.message) for w in caught if issubclass(w.category, PhazeWarning)]
    assert said.endswith("does not hold what it must (KeyError: 'answers'): ignored, computed again"), said
    assert stages.load("probe", key, lambda payload: payload["answer"]) == 42


# -- the command line ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "flags", "why"),
    [
        ("phazec", ["--devices", "nan"], "argument --devices: invalid int value: 'nan'"),
        ("phazec", ["--devices", "8.5"], "argument --devices: invalid int value: '8.5'"),
        (
            "phazec",
            ["--cache-limit", "-1GiB"],
            "argument --cache-limit: '-1GiB': expected a size such as 4GiB, 500MB or 0 (no limit)",
        ),
        ("phazec", ["--cache", "D", "--no-cache"], "argument --no-cache: not allowed with argument --cache"),
        ("phaze-validate", ["--holdout", "-x"], "argument --holdout: invalid float value: '-x'"),
    ],
    ids=["nan", "fraction", "negative-size", "cache-and-none", "validate"],
)
def test_a_bad_command_line_is_one_line_naming_the_flag(capsys, tool, flags, why):
    """argparse's 22-line usage dump is one line; a value beginning with '-' reaches its flag's
    own check (not "expected one argument"); --cache with --no-cache is refused."""
    from phaze.tools import phaze_validate, phazec

    main = {"phazec": phazec.main, "phaze-validate": phaze_validate.main}[tool]
    first = ["never_imported.py", "--hw", "a100"] if tool == "phazec" else ["runs.csv", "--hw", "a100"]
    with pytest.raises(SystemExit) as e:
        main([*first, *flags])
    assert e.value.code == 2
    assert capsys.readouterr().err == f"{tool}: error: {why} ({tool} --help lists the options)\n"


@pytest.mark.parametrize("tool", ["phazec", "phaze-validate"])
def test_version_needs_no_model(capsys, tool):
    from phaze import __version__
    from phaze.tools import phaze_validate, phazec

    with pytest.raises(SystemExit) as e:
        {"phazec": phazec.main, "phaze-validate": phaze_validate.main}[tool](["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"{tool} {__version__}\n"


def test_an_output_marked_immutable_is_refused_before_any_work(tmp_path, capsys):
    """``chattr +i`` on the plan file: no permission bit or probe file says that it cannot be
    replaced (not even by root), so the flag is read before the model is imported."""
    import shutil
    import subprocess

    from phaze.tools import phazec

    plan = tmp_path / "plan.mlir"
    plan.write_text("the plan of yesterday\n")
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(plan)]).returncode != 0:
        pytest.skip("chattr +i is not possible here (not root, or a file system without the flag)")
    try:
        model = tmp_path / "never_imported.py"
        model.write_text("raise SystemExit('the model was imported')\n")
        assert phazec.main([str(model), "--hw", "a100", "-o", str(plan), "-q"]) == 1
        err = capsys.readouterr().err
        why = "cannot write: the file is immutable or append-only (lsattr shows it)"
        assert err == f"phazec: error: -o {plan}: {why}\n"
        assert plan.read_text() == "the plan of yesterday\n"
    finally:
        subprocess.run(["chattr", "-i", str(plan)])


def test_a_sweep_where_nothing_fits_stops_before_compiling_an_unfit_plan(tmp_path):
    """Without --write-infeasible no output is written, so the unfit plan is not compiled from
    the whole model (a 20,000-block model would take minutes): the run stops when the sweep
    knows, with the message the compiled plan would give."""
    from conftest import MODELS, run_main

    args = [str(MODELS / "tiny_gpt2.py"), "--hw", "a100", "--devices", "8", "--global-batch", "4", "--tp", "1"]
    args += ["--placement", "expert:1,8,1", "--no-cache"]  # DP 8 cannot split 4 samples
    quick = run_main("phazec", *args)
    assert quick.returncode == 1 and "Traceback" not in quick.stderr
    assert "compiling the best point" not in quick.stderr and quick.stdout == ""
    written = run_main("phazec", *args, "--write-infeasible", "-o", str(tmp_path / "unfit.mlir"))
    assert written.returncode == 1 and "compiling the best point" in written.stderr
    assert quick.stderr.splitlines()[-1] == written.stderr.splitlines()[-1]
    assert quick.stderr.splitlines()[-1].startswith("phazec: error: no placement fits: batch: ")
