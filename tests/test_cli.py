"""phazec and phaze-opt as a user runs them: outputs, round trips, and every bad input."""

from __future__ import annotations

import pytest
from conftest import EXAMPLES, MODELS, run_tool


@pytest.fixture(scope="module")
def tiny_mlir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "t.mlir"
    r = run_tool("phazec", str(MODELS / "tiny_gpt2.py"), "--emit", "training", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "phazec: traced" in r.stderr  # progress on stderr
    return out


@pytest.fixture(scope="module")
def tiny_ir() -> str:
    """``phazec --emit ir`` of the tiny GPT-2 on stdout, as phaze-opt reads it (one process for
    the tests that feed it to phaze-opt or xdsl-opt)."""
    fwd = run_tool("phazec", str(MODELS / "tiny_gpt2.py"), "--emit", "ir", "-q")
    assert fwd.returncode == 0 and "@forward" in fwd.stdout and "phaze.layer" not in fwd.stdout
    return fwd.stdout


def test_phaze_opt_prints_what_it_read(tiny_mlir):
    r = run_tool("phaze-opt", str(tiny_mlir))
    assert r.returncode == 0, r.stderr
    assert r.stdout == tiny_mlir.read_text()


def test_generic_form_parses_back(tiny_mlir, tmp_path):
    generic = run_tool("phaze-opt", str(tiny_mlir), "--print-op-generic")
    assert generic.returncode == 0 and '"phaze.matmul"(' in generic.stdout
    g = tmp_path / "g.mlir"
    g.write_text(generic.stdout)
    back = run_tool("phaze-opt", str(g))
    assert back.returncode == 0 and back.stdout == tiny_mlir.read_text()


def test_phaze_opt_runs_a_pass_with_options(tmp_path, tiny_ir):
    r = run_tool("phaze-opt", "-p", "phaze-group-layers", input=tiny_ir)
    assert r.returncode == 0, r.stderr
    assert "#phaze.layer_info<index = 0" in r.stdout
    # "-" is stdin, as mlir-opt reads it (it was a file named "-"), and stdin names its errors
    dash = run_tool("phaze-opt", "-", "-p", "phaze-group-layers", input=tiny_ir, cwd=tmp_path)
    assert dash.returncode == 0 and dash.stdout == r.stdout, dash.stderr
    cut = run_tool("phaze-opt", "-", input="builtin.module {\n", cwd=tmp_path)
    assert cut.returncode == 1 and cut.stderr.startswith("stdin:2:1: error: "), cut.stderr


def test_stdout_output_is_deterministic():
    a = run_tool("phazec", str(EXAMPLES / "mlp.py"), "--emit", "training", "-q")
    b = run_tool("phazec", str(EXAMPLES / "mlp.py"), "--emit", "training", "-q", "-o", "-")
    assert a.returncode == 0 and a.stdout == b.stdout and a.stdout.startswith("builtin.module")


def one_line_error(r, tool: str, fragment: str):
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert "Traceback" not in r.stderr
    assert any(line.startswith(f"{tool}: error:") or "error:" in line for line in lines)
    assert fragment in r.stderr


def test_missing_model_file():
    one_line_error(run_tool("phazec", "nope.py"), "phazec", "nope.py: no such file")


def test_model_with_syntax_error(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("def get_model(:\n")
    one_line_error(run_tool("phazec", str(p)), "phazec", "m.py:1:")


def test_model_without_get_model(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("x = 1\n")
    one_line_error(run_tool("phazec", str(p)), "phazec", "defines no get_model()")


def test_unknown_emit_stage():
    r = run_tool("phazec", str(EXAMPLES / "mlp.py"), "--emit", "bogus")
    assert r.returncode == 2 and "invalid choice: 'bogus'" in r.stderr


def test_debug_shows_traceback():
    r = run_tool("phazec", "nope.py", "--debug")
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_malformed_mlir_reports_line_and_column(tmp_path):
    p = tmp_path / "bad.mlir"
    p.write_text('builtin.module {\n  %x = "phaze.matmul"() : () -> tensor<2x2xq16>\n}\n')
    r = run_tool("phaze-opt", str(p))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"{p}:2:44" in r.stderr and "Expected shape type" in r.stderr


def test_pass_precondition_is_a_clear_error(tiny_ir):
    r = run_tool("phaze-opt", "-p", "phaze-mark-saved", input=tiny_ir)
    one_line_error(r, "phaze-opt", "the step has no backward ops")


def test_unknown_pass():
    r = run_tool("phaze-opt", "-p", "phaze-nope", input="builtin.module {}\n")
    one_line_error(r, "phaze-opt", "phaze-nope")


def test_bad_pipeline_spec():
    """A pipeline xDSL cannot parse: one line naming the spec, the column and how to quote."""
    r = run_tool("phaze-opt", "-p", "phaze-group-layers{x=a.b}", input="builtin.module {}\n")
    one_line_error(r, "phaze-opt", "-p 'phaze-group-layers{x=a.b}': unknown token at column 23")


def test_stock_xdsl_opt_sees_phaze_through_entry_point(tiny_ir):
    """The ``xdsl.universe`` entry point makes the dialect and passes visible to ``xdsl-opt``."""
    import importlib.metadata
    import subprocess
    import sys

    names = {e.name for e in importlib.metadata.entry_points(group="xdsl.universe")}
    if "phaze" not in names:
        pytest.skip("phaze is not pip-installed (the README's commands install it)")
    r = subprocess.run(
        [sys.executable, "-c", "from xdsl.tools.xdsl_opt import main; main()", "-p", "phaze-group-layers"],
        input=tiny_ir,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "#phaze.layer_info<index = 0" in r.stdout


def test_the_help_groups_its_options_and_its_examples_parse():
    """``phazec --help`` shows its options in groups and ends with examples; each example is a
    command line phazec takes (its flags parse, its options pass the checks made before any
    work, its model file exists)."""
    import shlex

    from phaze.driver import check_options
    from phaze.tools.phazec import HELP_EXAMPLES, _parser, check_flags, options

    parser = _parser()
    text = parser.format_help()
    for title in ("outputs:", "the model and its training step:", "placement (", "cache:", "examples:"):
        assert title in text
    commands = [c for c in HELP_EXAMPLES.replace("\\\n", " ").splitlines() if c.strip().startswith("phazec ")]
    assert len(commands) >= 3
    for command in commands:
        argv = shlex.split(command)[1:]
        argv = [str(MODELS / "tiny_gpt2.py") if a == "MODEL.py" else a for a in argv]
        args = parser.parse_args(argv)
        assert all((EXAMPLES / m.split("/", 1)[1]).is_file() for m in args.models if m.startswith("examples/"))
        check_flags(args)
        check_options(options(args))
