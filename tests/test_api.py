"""``phaze.compile`` (``phaze/api.py``): the README's example runs as it is, a model file gives
the plan phazec gives, and bad options are one line before any work."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import MODELS, run_main

import phaze
from phaze.api import Plan
from phaze_ir.errors import PhazeError

ROOT = Path(__file__).resolve().parents[1]
TINY = str(MODELS / "tiny_gpt2.py")
FLAGS = dict(devices=4, global_batch=8, micro_batch=2, tp=1)


def test_the_readme_example_runs(capsys):
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### From Python") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # the README's own example, as written
    plan = scope["plan"]
    assert isinstance(plan, Plan) and plan.feasible and 0 < plan.mfu < 1 and plan.tokens_per_s > 0
    assert "--hidden-size=512" in scope["launch"] and "--bf16" in scope["launch"]
    assert str(plan).splitlines()[0] == "model small_llama, 39.1 million parameters"
    assert capsys.readouterr().out.startswith("model small_llama")


def test_a_model_file_gives_phazecs_plan(tmp_path):
    plan = phaze.compile(TINY, hw="tpuv4", **FLAGS)
    out = tmp_path / "plan.json"
    flags = ["--devices", "4", "--global-batch", "8", "--micro-batch", "2", "--tp", "1"]
    r = run_main("phazec", TINY, "--hw", "tpuv4", *flags, "--json", str(out), "-o", str(tmp_path / "p.mlir"), "-q")
    assert r.returncode == 0, r.stderr
    assert json.loads(plan.to_json()) == json.loads(out.read_text())
    assert (tmp_path / "p.mlir").read_text().endswith(plan.text)
    assert plan.module.attributes  # the IR parses
    assert plan.export("torchtitan").startswith("--module=phaze_flavour\n--config=phaze_plan\n--parallelism.")
    assert 'FLAVOUR = "phaze:phaze_flavour"' in plan.torchtitan_flavour()  # the module it names


def test_export_says_phazecs_runtime_warnings_once_with_no_source_line(tmp_path):
    """``Plan.export`` says where the launch runs another runtime than the one priced, as
    phazec's ``--export`` does (the same lines), through :mod:`warnings`: once a plan however
    often it is exported, and shown without a source line."""
    import warnings

    from phaze_ir.errors import PhazeWarning

    plan = phaze.compile(TINY, hw="tpuv4", **FLAGS)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan.export("torchtitan")
        plan.export("torchtitan")
    said = [w for w in caught if issubclass(w.category, PhazeWarning)]
    flags = ["--devices", "4", "--global-batch", "8", "--micro-batch", "2", "--tp", "1"]
    r = run_main(
        "phazec", TINY, "--hw", "tpuv4", *flags, "--export", "torchtitan", str(tmp_path / "t.args"), "-o", "-", "-q"
    )
    assert r.returncode == 0, r.stderr
    phazecs = [line.split("warning: ", 1)[1] for line in r.stderr.splitlines() if "warning: --export" in line]
    assert [str(w.message) for w in said] == phazecs and len(phazecs) >= 2  # kernels, the model
    for w in said:
        shown = warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line)
        assert shown == f"phaze:0: PhazeWarning: {w.message}\n"


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ({"devcies": 4}, "unknown option 'devcies'"),
        ({"recompute": "sometimes"}, "phaze.compile: recompute: recompute 'sometimes'"),
        ({"memory_headroom": 1.5}, "phaze.compile: memory_headroom: memory headroom 1.5"),
    ],
)
def test_bad_options_are_one_line(given, said):
    with pytest.raises(PhazeError, match=re.escape(said)) as e:
        phaze.compile(TINY, hw="tpuv4", **given)
    assert "\n" not in str(e.value)


def test_a_factory_needs_its_inputs():
    with pytest.raises(PhazeError, match="needs inputs="):
        phaze.compile(lambda: None, hw="tpuv4")
