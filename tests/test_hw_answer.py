"""``phazec --hw``'s answers kept in the cache (``phaze/hw_answer.py``): the same question
asked again is answered from one file, with the same bytes in every output and the same
warnings; any input that changes (an option, the chip's data, the model file or a helper it
imports, the printed form) asks again; a broken entry is said and computed again; ``--no-cache`` keeps nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MODELS, ROOT, run_main

from passes.cache_file import FORMAT, VERSION, Store, read_entry
from phaze import hw_answer
from phaze.model_key import model_key
from phaze.options import Options
from phaze_ir.errors import PhazeError, PhazeWarning

GPT2 = str(MODELS / "tiny_gpt2.py")
OPAQUE = str(MODELS / "tiny_opaque.py")
# One point (micro-batch 1, TP 1) on 8 A100s: a compilation of a second or two.
POINT = ["--hw", "a100", "--micro-batch", "1", "--tp", "1", "--devices", "8", "--global-batch", "8"]
HIT = "the answer is in the cache"


def _outputs(d: Path) -> list[str]:
    return ["-o", str(d / "plan.mlir"), "--json", str(d / "plan.json"), "--report", str(d / "plan.html")]


def test_the_same_question_is_answered_from_the_cache_byte_for_byte(tmp_path):
    cache = tmp_path / "cache"
    runs = {}
    for run in ("cold", "warm"):
        d = tmp_path / run
        d.mkdir()
        exports = ["--export", "megatron", str(d / "megatron.args"), "--export", "torchtitan", str(d / "titan.args")]
        r = run_main("phazec", GPT2, *POINT, "--cache", str(cache), *_outputs(d), *exports)
        assert r.returncode == 0, r.stderr
        runs[run] = (d, r.stderr)
    (cold, cold_err), (hot, hot_err) = runs["cold"], runs["warm"]
    assert HIT not in cold_err and "traced" in cold_err
    assert HIT in hot_err and "traced" not in hot_err
    for name in ("plan.mlir", "plan.json", "plan.html", "megatron.args", "titan.args"):
        assert (hot / name).read_bytes() == (cold / name).read_bytes(), name
    # The summary is said again, the same lines.
    summary = [line for line in cold_err.splitlines() if not line.startswith("phazec:")]
    assert summary and summary == [line for line in hot_err.splitlines() if not line.startswith("phazec:")]
    assert json.loads((hot / "plan.json").read_text())["feasible"] is True
    # One entry, plain JSON: the printed module is in it.
    (entry,) = (cache / hw_answer.KIND).iterdir()
    assert "module" in json.loads(entry.read_text())["payload"]["text"]


def test_a_hit_imports_no_model_nor_torch_and_says_the_warnings_again(tmp_path):
    """The warnings of the compilation (here: an op phaze has no semantics for) are said on a hit
    too, once each; the hit reads one file (no torch, no model import)."""
    cache = tmp_path / "cache"
    args = [OPAQUE, *POINT, "--dtype", "float32", "--cache", str(cache), "-o", str(tmp_path / "plan.mlir")]
    cold = run_main("phazec", *args)
    assert cold.returncode == 0, cold.stderr
    code = (
        "import sys; from phaze.tools.phazec import main; rc = main(sys.argv[1:]); "
        "print(rc, 'torch' in sys.modules, any(m.startswith('transformers') for m in sys.modules))"
    )
    env = {"PYTHONPATH": str(ROOT)}
    hot = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, cwd=ROOT)
    assert hot.stdout.split() == ["0", "False", "False"], hot.stderr
    assert HIT in hot.stderr
    said = [line for line in cold.stderr.splitlines() if "warning:" in line]
    assert any("unknown aten op" in line for line in said)
    assert said == [line for line in hot.stderr.splitlines() if "warning:" in line]


def _ask(cache: Path, opts: Options, model: str = GPT2, generic: bool = False) -> tuple[str, list[str]]:
    logged: list[str] = []
    result = hw_answer.answer(model, opts, str(cache), logged.append, generic=generic)
    return result.text, logged


def _hit(logged: list[str]) -> bool:
    return any(HIT in line for line in logged)


def _compiled(logged: list[str]) -> bool:
    """Whether the model was traced (not answered from the cache nor placed from a template)."""
    return any(line.startswith("tracing ") for line in logged)


def test_every_input_is_in_the_key(tmp_path):
    cache = tmp_path / "cache"
    opts = Options(hw="a100", micro_batches=(1,), tp_widths=(1,), devices=8, global_batch=8)
    text, logged = _ask(cache, opts)
    assert not _hit(logged)
    again, logged = _ask(cache, opts)
    assert _hit(logged) and again == text
    # An option: another question.
    other, logged = _ask(cache, Options(**{**opts.__dict__, "devices": 16}))
    assert not _hit(logged) and other != text
    # The printed form.
    generic, logged = _ask(cache, opts, generic=True)
    assert not _hit(logged) and generic != text and '"builtin.module"' in generic
    # The chip's data, under the same file name.
    chip = tmp_path / "chip.toml"
    preset = (ROOT / "phaze_ir" / "hw_presets" / "a100.toml").read_text()
    chip.write_text(preset)
    mine = Options(**{**opts.__dict__, "hw": str(chip)})
    # (the same data as the a100 preset's: the point compiled above is placed from its template)
    _, logged = _ask(cache, mine)
    assert not _hit(logged) and not _compiled(logged)
    chip.write_text("# a comment more: the same chip\n" + preset)
    _, logged = _ask(cache, mine)
    assert not _compiled(logged)
    chip.write_text(preset.replace("power_w = 400", "power_w = 350", 1))
    _, logged = _ask(cache, mine)
    assert not _hit(logged) and _compiled(logged)
    _, logged = _ask(cache, mine)
    assert _hit(logged)
    # The model file's bytes.
    model = tmp_path / "model.py"
    model.write_text(Path(GPT2).read_text())
    _ask(cache, opts, str(model))
    _, logged = _ask(cache, opts, str(model))
    assert _hit(logged)
    model.write_text(Path(GPT2).read_text() + "\n# edited\n")
    _, logged = _ask(cache, opts, str(model))
    assert not _hit(logged)


def _model_with_a_helper(d: Path, hidden: int) -> str:
    """examples/mlp.py with its width read from ``helper.py`` beside it."""
    d.mkdir(exist_ok=True)
    text = (ROOT / "examples" / "mlp.py").read_text()
    assert "\nHIDDEN = 256\n" in text
    (d / "model.py").write_text(text.replace("\nHIDDEN = 256\n", "\nfrom helper import HIDDEN\n"))
    (d / "helper.py").write_text(f"HIDDEN = {hidden}\n")
    return str(d / "model.py")


def test_a_helper_the_model_imports_is_in_the_key(tmp_path):
    """Editing a file the model file imports asks again (it answered the old model's question
    before); the same helper is a hit; a helper gone is the model's own import error."""
    cache = tmp_path / "cache"
    opts = Options(hw="a100", micro_batches=(1,), tp_widths=(1,), devices=8, global_batch=8)
    model = _model_with_a_helper(tmp_path / "m", 256)
    narrow, logged = _ask(cache, opts, model)
    assert not _hit(logged)
    _, logged = _ask(cache, opts, model)
    assert _hit(logged)
    _model_with_a_helper(tmp_path / "m", 320)
    wide, logged = _ask(cache, opts, model)
    assert not _hit(logged) and "tensor<320xf16>" in wide and "tensor<320xf16>" not in narrow
    again, logged = _ask(cache, opts, model)
    assert _hit(logged) and again == wide
    (tmp_path / "m" / "helper.py").unlink()
    with pytest.raises(PhazeError, match="helper"):
        _ask(cache, opts, model)


def test_model_key_reads_the_helpers_from_the_cache(tmp_path, monkeypatch):
    """The ``model`` entry lists the helpers with their digests: while they are unchanged the
    key costs no import; the key changes with a helper's bytes."""
    import phaze_ir.frontend as frontend

    stages = Store.of(str(tmp_path / "cache"))
    model = _model_with_a_helper(tmp_path / "m", 256)
    first = model_key(model, stages)
    assert first.name == "mlp"
    (entry,) = (tmp_path / "cache" / "model").iterdir()
    sources = json.loads(entry.read_text())["payload"]["sources"]
    assert str((tmp_path / "m" / "helper.py").resolve()) in [p for p, _ in sources]

    def no_import(path):
        raise AssertionError("the model was imported")

    monkeypatch.setattr(frontend, "load_model_file", no_import)
    assert model_key(model, stages) == first
    monkeypatch.undo()
    _model_with_a_helper(tmp_path / "m", 512)
    second = model_key(model, stages)
    assert second.name == "mlp" and second.digest != first.digest


def test_a_broken_entry_is_said_and_computed_again(tmp_path):
    cache = tmp_path / "cache"
    opts = Options(hw="a100", micro_batches=(1,), tp_widths=(1,), devices=8, global_batch=8)
    text, _ = _ask(cache, opts)
    (entry,) = (cache / hw_answer.KIND).iterdir()
    kept = json.loads(entry.read_text())
    kept["payload"]["text"] = kept["payload"]["text"].replace("phaze.plan", "phaze.plan ", 1)  # its hash breaks
    entry.write_text(json.dumps(kept))
    with pytest.warns(PhazeWarning, match="does not match its content hash: ignored, computed again"):
        again, logged = _ask(cache, opts)
    assert not _hit(logged) and again == text
    # Computed again, kept again, and it checks.
    assert read_entry(entry, FORMAT, VERSION, kept["input_hash"])["text"] == text
    _, logged = _ask(cache, opts)
    assert _hit(logged)


def test_an_error_is_not_kept_a_plan_that_does_not_fit_is(tmp_path):
    cache = tmp_path / "cache"
    broken = tmp_path / "broken.py"
    broken.write_text(
        Path(GPT2).read_text().replace("def get_model():", "def get_model():\n    raise ValueError('no')")
    )
    for _ in range(2):  # failed twice, the same way: nothing was kept in between
        r = run_main("phazec", str(broken), *POINT, "--cache", str(cache), "-o", str(tmp_path / "x.mlir"))
        assert r.returncode == 1 and HIT not in r.stderr and "error:" in r.stderr, r.stderr
    assert not (cache / hw_answer.KIND).exists()
    # A plan that does not fit is an answer: kept, and said again with the same exit status.
    unfit = [*POINT[:-1], "4", "--placement", "expert:1,8,1"]  # DP 8 cannot split 4 samples
    errs = []
    for _ in range(2):
        r = run_main("phazec", GPT2, *unfit, "--cache", str(cache), "-o", str(tmp_path / "y.mlir"))
        assert r.returncode == 1
        errs.append(r.stderr)
    assert HIT not in errs[0] and HIT in errs[1]
    assert errs[0].splitlines()[-1] == errs[1].splitlines()[-1] and "no placement fits" in errs[1]


def test_no_cache_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home"))
    for _ in range(2):
        r = run_main("phazec", GPT2, *POINT, "--no-cache", "-o", str(tmp_path / "y.mlir"))
        assert r.returncode == 0 and HIT not in r.stderr, r.stderr
    assert not (tmp_path / "home").exists()
    r = run_main("phazec", GPT2, *POINT, "-o", str(tmp_path / "y.mlir"))  # the default cache
    assert (tmp_path / "home" / "phaze" / hw_answer.KIND).is_dir()


def test_a_new_question_on_the_same_model_reads_the_sweeps_settings(tmp_path):
    """The settings of a sweep (per micro-batch) do not depend on the chip, the devices or the
    batch: another such question reads them, and its answer is the one computed without a
    cache, byte for byte."""
    cache = tmp_path / "cache"
    sweep = Options(hw="a100", micro_batches=(1, 2), tp_widths=(1, 2), devices=8, global_batch=16)
    _, logged = _ask(cache, sweep)
    assert sum("(the model cut to a few blocks)" in line for line in logged) == 2
    other = Options(**{**sweep.__dict__, "hw": "h100", "devices": 16})
    text, logged = _ask(cache, other)
    assert not _hit(logged) and sum("from its settings (in the cache)" in line for line in logged) == 2
    assert not any("cut to a few blocks" in line for line in logged)
    assert text == hw_answer.answer(GPT2, other, None, lambda _: None).text
    # Another optimizer is another training step: prepared again.
    _, logged = _ask(cache, Options(**{**sweep.__dict__, "optimizer": "sgd"}))
    assert sum("(the model cut to a few blocks)" in line for line in logged) == 2


@pytest.mark.slow
def test_a_context_parallel_answer_is_read_back(tmp_path, monkeypatch):
    """``--context-parallel auto`` whose best plan is CP 2 (one sample on two devices: DP 1 x CP
    2): the second question reads the answer kept by the first (its plan's devices are
    dp x cp x pp x tp, as the DP counts them) and compiles nothing, the same bytes."""
    from phaze.search import sweep

    model = tmp_path / "tiny_llama_sdpa_8k.py"  # configured for 8,192 positions: degrees 1 and 2
    source = (MODELS / "tiny_llama_sdpa.py").read_text()
    model.write_text(source.replace("max_position_embeddings=64", "max_position_embeddings=8192"))
    compiled = []
    real = sweep.compile_plan
    monkeypatch.setattr(sweep, "compile_plan", lambda *a, **k: compiled.append(1) or real(*a, **k))
    opts = Options(
        hw="h100", micro_batches=(1,), tp_widths=(1,), devices=2, global_batch=1, seq_len=8192, context_parallel="auto"
    )
    cache = tmp_path / "cache"
    text, logged = _ask(cache, opts, str(model))
    assert len(compiled) == 1 and not _hit(logged)
    again: list[str] = []
    kept = hw_answer.answer(str(model), opts, str(cache), again.append)
    assert (kept.plan["dp"], kept.plan["cp"], kept.plan["devices_used"]) == (1, 2, 2)
    assert len(compiled) == 1 and _hit(again) and kept.text == text


def test_an_answer_the_power_limit_lengthens_holds_its_modules_plan(tmp_path):
    """A kept answer whose step the power limit lengthens (``phaze.power``'s ``power_limit_s`` >
    0) holds its module's plan: the JSON's time is ``phaze.plan``'s plus that, summed as
    plan_record sums them (``lengthened_step_s``); the same JSON beside a module that says
    another time is a broken entry."""
    import re

    from passes.algorithms.energy import lengthened_step_s
    from passes.cache_file import BadEntry
    from phaze_ir.attributes import format_float

    opts = Options(hw="h100", micro_batches=(2,), tp_widths=(1,), devices=2, global_batch=8)
    kept = hw_answer.answer(str(MODELS / "tiny_llama_sdpa.py"), opts, str(tmp_path / "cache"), lambda _l: None)
    placed = float(kept.plan["time_per_batch_s"])
    assert "power_limit_s = 0.0>" in kept.text  # (this one unlimited: made limited below)
    added = placed / 3
    text = re.sub(r"power_limit_s = 0\.0>", f"power_limit_s = {format_float(added)}>", kept.text, count=1)
    time = lengthened_step_s(placed, added)
    plan = {**kept.plan, "time_per_batch_s": time, "throughput_samples_per_s": 8 / time}
    hw_answer._check_plan_numbers(plan, text)  # read back, not computed again
    with pytest.raises(BadEntry, match="its text and its JSON differ"):
        hw_answer._check_plan_numbers(plan, kept.text)  # a module whose step the limit does not lengthen
    with pytest.raises(BadEntry, match="its text and its JSON differ"):
        hw_answer._check_plan_numbers(kept.plan, text)  # the placement's time alone


def test_an_answer_is_computed_and_printed_with_few_young_collections(tmp_path, monkeypatch):
    """The model file's key (its import) and the compilation and printing of the plan run with
    the young generation collected every YOUNG_COLLECTION_ALLOCATIONS allocations (the
    printing's collections went over the compiled module again and again); Python's
    thresholds come back after the answer, an error's too."""
    import gc

    from phaze import pipeline

    seen: list[tuple[str, int]] = []
    key = hw_answer.model_key

    def keyed(*args, **kwargs):
        seen.append(("model key", gc.get_threshold()[0]))
        return key(*args, **kwargs)

    def compiled(*args, **kwargs):
        seen.append(("compile and print", gc.get_threshold()[0]))
        raise PhazeError("stopped here")

    monkeypatch.setattr(hw_answer, "model_key", keyed)
    monkeypatch.setattr(hw_answer, "_compile", compiled)
    before = gc.get_threshold()
    assert before[0] != pipeline.YOUNG_COLLECTION_ALLOCATIONS
    opts = Options(hw="a100", micro_batches=(1,), tp_widths=(1,), devices=8, global_batch=8)
    with pytest.raises(PhazeError, match="stopped here"):
        hw_answer.answer(GPT2, opts, str(tmp_path / "cache"), lambda _: None)
    assert seen == [(what, pipeline.YOUNG_COLLECTION_ALLOCATIONS) for what in ("model key", "compile and print")]
    assert gc.get_threshold() == before
