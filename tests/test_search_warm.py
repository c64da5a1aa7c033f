"""A warm cache answers in seconds (issue 15): a rerun of a search reads every stage whose inputs
did not change from the cache (phaze/search/warm.py; the store: passes/cache_file.py),
and gives the cold run's bytes: the plan, the JSON (its wall times apart) and the report.  A changed
input is computed again; an entry that fails a check is said in one warning line and computed
again.

End to end through ``phazec`` on the tiny GPT-2 and the tiny space, with its one baseline
(``tpuv4+phaze``: the model has no expert placement), a few seconds a run."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
from conftest import MODELS, module_text, run_main, run_tool

from passes.cache_file import VERSION, content_hash
from phaze.search import report
from phaze_ir.ir import parse_module, print_module

TINY = str(MODELS / "tiny_gpt2.py")
TINY_SPACE = str(Path(__file__).parent / "data" / "tiny_space.toml")
ARGS = ["--space", TINY_SPACE, "--devices", "64", "--global-batch", "64", "--micro-batch", "8", "--tp", "1", "-j", "1"]
PHASES = ["prepare", "baselines", "search", "plan"]


class Run:
    """One ``phazec`` search: its plan's text, its JSON (as written), its report and stderr."""

    def __init__(self, out: Path, cache: Path, *extra: str, model: str = TINY, process: bool = False) -> None:
        out.mkdir()
        args = [model, *ARGS, "-o", str(out / "plan.mlir"), "--json", str(out / "plan.json")]
        args += ["--report", str(out / "report.html"), "--cache", str(cache), *extra]
        # In this process (run_main: no 5 s of imports a run) but where what the process
        # imports is checked: what the cache holds is all a run reads either way.
        if process:
            r = run_tool("phazec", *args, env={"PYTHONPROFILEIMPORTTIME": "1"})
        else:
            r = run_main("phazec", *args)
        assert r.returncode == 0, r.stderr
        self.text = (out / "plan.mlir").read_text()
        self.json_text = (out / "plan.json").read_text()
        self.data = json.loads(self.json_text)
        self.report = (out / "report.html").read_text()
        self.stderr = r.stderr

    def json_with_walls_of(self, other: Run) -> str:
        """This run's JSON as written, with ``other``'s wall times in their place."""
        data = json.loads(self.json_text)
        data["search"]["wall_s"] = other.data["search"]["wall_s"]
        return json.dumps(data, indent=2) + "\n"

    def without(self, *keys: str) -> dict:
        """The JSON without these keys of ``search``."""
        data = json.loads(self.json_text)
        for k in keys:
            data["search"].pop(k)
        return data

    def said(self, text: str) -> bool:
        return any(text in line for line in self.stderr.splitlines())

    def warnings(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("phazec: warning:")]


@pytest.fixture(scope="module")
def cold(tmp_path_factory) -> tuple[Run, Path]:
    """A search into an empty cache: ``(the run, the cache)``."""
    root = tmp_path_factory.mktemp("cold")
    run = Run(root / "run", root / "cache")
    assert run.said("preparing") and run.said("compiling the plan") and run.warnings() == []
    return run, root / "cache"


def copy(cold, tmp_path: Path, *drop: str) -> Path:
    """The cold run's cache, without the stage entries of kinds ``drop``."""
    cache = tmp_path / "cache"
    shutil.copytree(cold[1], cache)
    for kind in drop:
        shutil.rmtree(cache / kind)
    return cache


def entry(cache: Path, kind: str) -> Path:
    (file,) = sorted((cache / kind).glob("*.json"))
    return file


def test_a_warm_rerun_is_the_cold_run_without_computing_anything(cold, tmp_path):
    run, cache = cold
    # Import times on stderr: the rerun imports neither torch nor the model.
    again = Run(tmp_path / "warm", cache, process=True)
    assert again.text == run.text
    assert again.json_with_walls_of(run) == run.json_text
    assert again.said("the answer is in the cache: nothing to compute")
    assert not again.said("preparing") and not again.said("compiling")
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in again.stderr.splitlines() if line.startswith("import time:")
    }
    assert "numpy" in imported and not {m for m in imported if m == "torch" or m.startswith("phaze_model_")}
    walls = again.data["search"]["wall_s"]
    assert list(walls) == list(run.data["search"]["wall_s"]) and all(walls[p] == 0.0 for p in PHASES)
    # The report: the cold run's bytes once both show the same wall times.
    assert report.render(json.loads(again.json_with_walls_of(run))) == run.report
    assert report.render(again.data) == again.report


@pytest.mark.parametrize(
    "drop, read, computed",
    [
        (("answer",), ["baseline tpuv4+phaze is in", "the search's result is in", "the plan of tiny-gpt2"], []),
        # The plan from its template (phaze/plan/plan_template.py), then compiled without one.
        (("answer", "plan"), ["the search's result is in", "placed from its compiled plan"], []),
        (("answer", "plan", "plan-template"), ["the search's result is in"], ["compiling the plan"]),
        (("answer", "search"), ["baseline tpuv4+phaze is in", "the plan of tiny-gpt2"], ["search: architectures"]),
        (("answer", "baseline", "model"), ["the search's result is in"], ["tpuv4+phaze: architectures"]),
    ],
)
def test_each_stage_read_back_gives_the_cold_bytes(cold, tmp_path, drop, read, computed):
    """The stages the cache still holds are read (a plan is parsed back), the others computed:
    the same plan, the same JSON and report (counts apart: those of a stage computed again are
    this run's, after what the cache held)."""
    run, _ = cold
    again = Run(tmp_path / "run", copy(cold, tmp_path, *drop))
    assert again.text == run.text
    assert again.without("wall_s", "evaluator") == run.without("wall_s", "evaluator")
    assert not again.said("the answer is in the cache")
    assert all(again.said(s) for s in read) and all(again.said(s) for s in computed)
    assert again.said("compiling the plan") == ("compiling the plan" in computed)
    assert again.warnings() == []
    if "search" not in drop and "baseline" not in drop:  # nothing the evaluator counts was computed
        assert again.json_with_walls_of(run) == run.json_text


def test_the_plan_entry_round_trips_byte_for_byte(cold):
    _, cache = cold
    text = json.loads(entry(cache, "plan").read_text())["payload"]["text"]
    assert print_module(parse_module(text)) == text


def test_the_printed_form_is_part_of_the_answer(cold, tmp_path):
    run, _ = cold
    generic = Run(tmp_path / "generic", copy(cold, tmp_path), "--print-op-generic")
    assert module_text(generic.text) == print_module(parse_module(run.text), generic=True)
    assert generic.said("the plan of tiny-gpt2") and not generic.said("the answer is in the cache")
    again = Run(tmp_path / "again", tmp_path / "cache", "--print-op-generic")
    assert again.text == generic.text and again.said("the answer is in the cache")


@pytest.mark.parametrize(
    "extra, read, computed",
    [
        # The placement's inputs: every stage but the model's name (and the settings, which
        # the settings cache keeps: they do not depend on the batch).
        # The winner's plan is placed from its template when the same chip and point win.
        (["--global-batch", "128"], [], ["tpuv4+phaze: architectures", "placed from its compiled plan"]),
        # The solver limits: the schedules too.
        (["--solver-gap", "0.01"], [], ["compiling the plan"]),
        # Pruning changes the search's statistics, not the answer: the plan is read.
        (["--no-prune"], ["baseline tpuv4+phaze is in", "the plan of tiny-gpt2"], ["search: architectures"]),
        (["--no-baselines"], ["the search's result is in", "the plan of tiny-gpt2"], []),
    ],
)
def test_a_changed_option_is_computed_again(cold, tmp_path, extra, read, computed):
    run, _ = cold
    again = Run(tmp_path / "run", copy(cold, tmp_path), *extra)
    assert not again.said("the answer is in the cache")
    assert all(again.said(s) for s in read) and all(again.said(s) for s in computed)
    if "--global-batch" in extra or "--solver-gap" in extra:
        assert not again.said("is in the cache")
    twice = Run(tmp_path / "twice", tmp_path / "cache", *extra)  # now it is in the cache
    assert twice.text == again.text and twice.json_with_walls_of(again) == again.json_text
    assert twice.said("the answer is in the cache")


def test_a_changed_model_file_or_space_is_computed_again(cold, tmp_path):
    run, _ = cold
    model = tmp_path / "tiny_gpt2.py"
    model.write_text(Path(TINY).read_text() + "\n# the same model, other bytes\n")
    again = Run(tmp_path / "model", copy(cold, tmp_path), model=str(model))
    assert again.said("preparing") and not again.said("is in the cache")
    assert again.text == run.text  # the same model
    space = tmp_path / "space.toml"
    space.write_text(Path(TINY_SPACE).read_text().replace("glb_MiB = [8, 32]", "glb_MiB = [8, 16, 32]"))
    other = Run(tmp_path / "space", tmp_path / "cache", "--space", str(space))
    # The TPUv4-like baseline does not depend on the space; the search does.
    assert other.said("baseline tpuv4+phaze is in") and not other.said("the search's result is in")
    assert other.data["search"]["architectures"] > run.data["search"]["architectures"]


def _rehash(file: Path, doctor) -> None:
    data = json.loads(file.read_text())
    doctor(data)
    data["content_hash"] = content_hash(data["payload"])
    file.write_text(json.dumps(data))


def _garbage(file: Path) -> str:
    file.write_bytes(b"\x00\xff garbage")
    return "is not JSON"


def _pickle(file: Path) -> str:
    file.write_bytes(pickle.dumps({"not": "json"}))
    return "is not JSON"


def _flipped(file: Path) -> str:
    text = file.read_text()
    file.write_text(text.replace('"payload": {', '"payload": {"x": 1, ', 1))
    return "does not match its content hash"


def _version(file: Path) -> str:
    _rehash(file, lambda d: d.update(version=VERSION + 1))
    return f"is of version {VERSION + 1}, not {VERSION}"


def _other_inputs(file: Path) -> str:
    _rehash(file, lambda d: d.update(input_hash="0" * 64))
    return "was computed from other inputs"


def _payload(doctor, reason: str):
    def apply(file: Path) -> str:
        _rehash(file, lambda d: doctor(d["payload"]))
        return reason

    apply.__name__ = doctor.__name__
    return apply


def _negative_throughput(p):
    p["data"]["baselines"][1]["throughput_samples_per_s"] = -1.0


def _no_config(p):
    p["winner"]["config"] = 10**6


def _not_a_module(p):
    p["text"] = "builtin.module {\n  nonsense\n"


def _other_throughput(p):
    text = p["text"]
    at = text.index("throughput_samples_per_s = ") + len("throughput_samples_per_s = ")
    p["text"] = text[:at] + "1.0" + text[text.index(",", at) :]


def _no_name(p):
    p["name"] = ""


def _no_skeleton(p):
    p["skeleton"] = "builtin.module {\n  nonsense\n"


def _other_layer_time(p):
    """A layer's scheduled forward time (what the placement reads) changed."""
    (layers,) = [fields for name, kind, fields in p["records"] if kind == "phaze.layer_schedule"]
    layers[0]["fwd_s"] = 1.0


@pytest.mark.parametrize(
    "kind, doctor",
    [
        ("answer", _garbage),
        ("answer", _pickle),
        ("answer", _flipped),
        ("answer", _version),
        ("answer", _other_inputs),
        ("answer", _payload(_negative_throughput, "does not hold a throughput >= 0")),
        ("search", _payload(_no_config, "does not hold a candidate of the space")),
        ("plan", _payload(_not_a_module, "does not hold the plan of tiny-gpt2 (")),
        # caught by the plan's own relations (throughput = batch / time) as it is read
        ("plan", _payload(_other_throughput, "does not hold the plan of tiny-gpt2 (")),
        ("model", _payload(_no_name, "does not hold a model name")),
        ("plan-template", _payload(_no_skeleton, "does not hold a skeleton module (")),
        ("plan-template", _payload(_other_layer_time, "does not hold the plan of tiny-gpt2 (internal error: the plan")),
    ],
)
def test_a_bad_stage_entry_is_said_and_computed_again(cold, tmp_path, kind, doctor):
    run, _ = cold
    drops = {"answer": (), "search": ("answer",), "plan": ("answer", "plan-template"), "model": ()}
    drop = drops.get(kind, ("answer",))
    cache = copy(cold, tmp_path, *drop)
    file = entry(cache, kind)
    reason = doctor(file)
    again = Run(tmp_path / "run", cache)
    warned = again.warnings()
    assert len(warned) == 1 and warned[0].startswith(f"phazec: warning: cache entry {file} {reason}"), warned
    assert warned[0].endswith(": ignored, computed again")
    assert again.text == run.text
    assert again.without("wall_s", "evaluator") == run.without("wall_s", "evaluator")
    # Written again, as it should be: the next run reads it.
    assert Run(tmp_path / "next", cache).warnings() == []
