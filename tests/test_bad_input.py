"""Bad input, tried as a careful and as a hostile user would (issue 12): each gives one line,
exit status 1 and no traceback, before any work where it can be known before any work; nothing
already on disk is lost.  What a tool says and writes is checked from its ``main`` in this
process (``run_main``: no 5 s of imports a run); a model that exits or calls ``os._exit``, torch's
log, Ctrl-C and the exit of a failed output need the tool's own process (``run_tool``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, MODELS, ROOT, module_text, run_main, run_tool

TINY = str(MODELS / "tiny_gpt2.py")
OPAQUE = str(MODELS / "tiny_opaque.py")


def one_error(r: subprocess.CompletedProcess, tool: str = "phazec") -> str:
    """The run failed with exactly one error line (progress lines aside) and no traceback."""
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if not line.startswith(f"{tool}: ") or ": error: " in line]
    assert len(errors) == 1, r.stderr
    return errors[0]


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- hardware and space values the IR cannot hold ---------------------------------------------


@pytest.mark.parametrize("value", ["1e19", "1e300", "9223372036854775808"])
def test_hbm_bytes_beyond_i64_are_refused_with_the_field(tmp_path, value):
    text = (EXAMPLES / "hw" / "a100.toml").read_text()
    lines = text.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("bytes = ") and "HBM" in "".join(lines[i - 4 : i]))
    lines[i] = f"bytes = {value}"
    hw = write(tmp_path, "hw.toml", "\n".join(lines) + "\n")
    line = one_error(run_tool("phazec", TINY, "--hw", hw, "-o", str(tmp_path / "o.mlir")))
    assert f"hw.toml: hbm.bytes = {value}: expected a positive integer at most 9223372036854775807" in line


def test_hbm_bytes_are_bounded_by_plausibility_then_by_i64():
    """The plausibility bound (docs/design.md §4.1) refuses 2^63 - 1 bytes of HBM; one more is
    refused first for what the IR cannot hold."""
    from dataclasses import replace

    from phaze_ir.hardware import I64_MAX, HardwareError, field_bound, load_hardware

    hbm = load_hardware("a100").hbm
    bound = field_bound(type(hbm), "bytes")
    assert bound is not None and replace(hbm, bytes=bound.value).bytes == bound.value
    with pytest.raises(HardwareError, match=f"expected a positive integer at most {bound.value} \\(240x"):
        replace(hbm, bytes=I64_MAX)
    with pytest.raises(HardwareError, match="expected a positive integer at most 9223372036854775807"):
        replace(hbm, bytes=I64_MAX + 1)


def space_file(tmp_path: Path, **edits: str) -> str:
    text = (EXAMPLES / "spaces" / "small.toml").read_text()
    for old, new in edits.items():
        assert old in text
        text = text.replace(old, new)
    write(tmp_path, "tpuv4.toml", (EXAMPLES / "hw" / "tpuv4.toml").read_text())
    return write(tmp_path, "space.toml", text)


def test_a_space_with_no_chip_under_its_budget_fails_before_tracing(tmp_path):
    space = space_file(tmp_path, **{"budget_mm2 = 80.0": "budget_mm2 = 0.001"})
    r = run_tool("phazec", TINY, "--space", space, "-o", str(tmp_path / "o.mlir"), "--no-cache")
    line = one_error(r)
    assert "space.toml: no candidate satisfies the area rule" in line and "mm^2" in line
    assert "tracing" not in r.stderr and "preparing" not in r.stderr


def test_an_hbm_option_beyond_i64_is_refused(tmp_path):
    space = space_file(tmp_path, **{"hbm_GiB = [32, 64]": "hbm_GiB = [10000000000000]"})
    line = one_error(run_tool("phazec", TINY, "--space", space, "-o", str(tmp_path / "o.mlir"), "--no-cache"))
    assert "search.hbm_GiB[0] = 10000000000000: expected a positive number at most 8589934591" in line


# -- model files that trace but cannot train ---------------------------------------------------

FROZEN = """
import torch
def get_model():
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    for p in m.parameters():
        p.requires_grad_(False)
    return m
def get_inputs(b):
    return (torch.zeros(b, 64),)
def loss_fn(out):
    return out.sum()
"""

MISMATCH = """
import torch
def get_model():
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
def get_inputs(b):
    return (torch.zeros(b, 65),)
def loss_fn(out):
    return out.sum()
"""


def test_a_model_without_trainable_parameters(tmp_path):
    line = one_error(run_tool("phazec", write(tmp_path, "frozen.py", FROZEN), "--hw", "a100"))
    assert line == (
        "phazec: error: frozen.py: the model has no trainable parameters (all 4 have requires_grad=False): "
        "there is no training step to compile"
    )


def test_a_model_file_that_exits_while_imported(tmp_path):
    model = write(tmp_path, "exits.py", "import sys\n\nsys.exit(3)\n")
    line = one_error(run_tool("phazec", model, "--hw", "a100"))
    assert line == "phazec: error: exits.py:3: the model file called sys.exit(3) while being imported"


def test_a_model_file_that_calls_os_exit_while_imported(tmp_path):
    """``os._exit`` ends a process without output or cleanup: phazec exited 0 having said and
    written nothing."""
    model = write(tmp_path, "hard.py", "import os\n\nos._exit(0)\n")
    out = tmp_path / "plan.mlir"
    line = one_error(run_tool("phazec", model, "--hw", "a100", "-o", str(out)))
    assert line == "phazec: error: hard.py:3: the model file called os._exit(0) while being imported"
    assert not out.exists()


def test_a_model_that_calls_os_exit_in_get_model(tmp_path):
    model = write(tmp_path, "hard.py", FROZEN.replace("    m = torch", "    import os; os._exit(4)\n    m = torch"))
    line = one_error(run_tool("phazec", model, "--hw", "a100"))
    assert line == "phazec: error: hard.py: get_model() failed: os._exit(4)"


def test_os_exit_is_refused_only_inside_the_block():
    from phaze_ir.frontend.loader import HardExit, hard_exit_refused

    real = os._exit
    with pytest.raises(HardExit) as raised, hard_exit_refused():
        os._exit(5)
    assert raised.value.code == 5 and str(raised.value) == "os._exit(5)"
    assert os._exit is real


def test_a_model_file_raising_a_base_exception_of_its_own(tmp_path):
    model = write(tmp_path, "base.py", "class Stop(BaseException):\n    pass\n\n\nraise Stop('no')\n")
    line = one_error(run_tool("phazec", model, "--hw", "a100"))
    assert line == "phazec: error: base.py:5: error while importing the model file: Stop: no"


def test_a_model_that_exits_in_get_model(tmp_path):
    exits = FROZEN.replace("    m = torch", "    import sys; sys.exit('bye')\n    m = torch")
    model = write(tmp_path, "exits.py", exits)
    line = one_error(run_tool("phazec", model, "--hw", "a100"))
    assert line == "phazec: error: exits.py: get_model() failed: SystemExit: bye"


def test_a_shape_mismatch_is_one_line_without_torch_log(tmp_path):
    r = run_tool("phazec", write(tmp_path, "mismatch.py", MISMATCH), "--hw", "a100")
    line = one_error(r)
    assert "meta for aten.mm" not in r.stderr  # torch's logger stays quiet
    assert line.startswith("phazec: error: cannot trace mismatch.py in module '0' (Linear): RuntimeError:")


def test_positions_beyond_a_learned_table_are_refused():
    """tiny_gpt2 has n_positions = 64 (a learned table)."""
    line = one_error(run_main("phazec", TINY, "--emit", "ir", "--seq-len", "65"))
    assert line == (
        "phazec: error: tiny_gpt2.py: sequence length 65 is beyond the model's n_positions = 64 "
        "(its learned position table has no rows for the positions after it)"
    )
    assert run_main("phazec", TINY, "--emit", "ir", "--seq-len", "64", "-o", "-").returncode == 0


def test_positions_beyond_a_rotary_models_length_are_a_warning():
    from transformers import LlamaConfig

    sys.path.insert(0, str(MODELS))
    try:
        import tiny_llama
    finally:
        sys.path.remove(str(MODELS))
    limit = tiny_llama.get_model().config.max_position_embeddings
    assert isinstance(tiny_llama.get_model().config, LlamaConfig)
    r = run_main("phazec", str(MODELS / "tiny_llama.py"), "--emit", "ir", "--seq-len", str(limit + 1), "-o", "-")
    assert r.returncode == 0, r.stderr
    warned = [line for line in r.stderr.splitlines() if "warning" in line]
    assert warned == [
        f"phazec: warning: tiny_llama.py: sequence length {limit + 1} is beyond the model's "
        f"max_position_embeddings = {limit} (no position table, but the model is not configured for it)"
    ]


# -- outputs that cannot be written are said before any work -----------------------------------


def test_an_output_in_a_missing_directory_is_refused_before_tracing(tmp_path):
    r = run_tool("phazec", TINY, "--hw", "a100", "-o", str(tmp_path / "o.mlir"), "--json", "/nonexistent/p.json")
    line = one_error(r)
    assert line == "phazec: error: --json /nonexistent/p.json: cannot write: no directory /nonexistent"
    assert "tracing" not in r.stderr
    assert not (tmp_path / "o.mlir").exists()


def test_an_output_that_is_a_directory_is_refused(tmp_path):
    line = one_error(run_tool("phazec", TINY, "--hw", "a100", "-o", str(tmp_path)))
    assert line == f"phazec: error: -o {tmp_path}: is a directory, expected a file name"


def test_phaze_opt_output_in_a_missing_directory(tmp_path):
    src = tmp_path / "in.mlir"
    src.write_text('builtin.module attributes {phaze.model = "m"} {\n}\n')
    line = one_error(run_tool("phaze-opt", str(src), "-o", "/nonexistent/out.mlir"), "phaze-opt")
    assert line == "phaze-opt: error: -o /nonexistent/out.mlir: cannot write: no directory /nonexistent"
    assert src.read_text().startswith("builtin.module")


def test_phaze_opt_on_a_directory():
    line = one_error(run_tool("phaze-opt", str(ROOT / "tests")), "phaze-opt")
    assert line == f"phaze-opt: error: {ROOT / 'tests'}: is a directory, expected a .mlir file"


# -- honest plans: what the cost model does not price is said -----------------------------------


def test_opaque_ops_are_in_the_plan_the_json_and_said_once(tmp_path):
    plan, js = tmp_path / "opaque.mlir", tmp_path / "opaque.json"
    r = run_main("phazec", OPAQUE, "--hw", "a100", "-o", str(plan), "--json", str(js), "-q")
    assert r.returncode == 0, r.stderr
    # The tool says each warning once (the plan summary then lists them as its own lines).
    warned = [line for line in r.stderr.splitlines() if line.startswith("phazec: warning")]
    # One line per aten kind, however many micro-batch sizes and TP widths were compiled.
    assert len(warned) == 2, r.stderr
    assert "aten.i0.default (2x, first in module 'act1')" in warned[0]
    assert "torch knows no FLOP formula for it" in warned[0] and "--strict" in warned[0]
    data = json.loads(js.read_text())
    kinds = {w["aten"]: w for w in data["warnings"]}
    assert set(kinds) == {"aten.i0.default", "aten.special_i1.default"}
    fwd = kinds["aten.i0.default"]
    # torch has no FLOP formula for i0: no count and no share rather than a wrong one.
    b = data["micro_batch_size"]
    assert fwd["flops"] == -1 and fwd["flops_share"] == -1
    assert fwd["count"] == 2 and fwd["module"] == "act1" and fwd["kind"] == "unpriced-op"
    assert fwd["bytes"] == 2 * 2 * b * (256 + 64)  # fp16 operand and result of both
    text = plan.read_text()
    assert 'phaze.warnings = [#phaze.unpriced_op<aten = "aten.i0.default", count = 2' in text
    # The annotation survives phaze-opt and the upstream printer's generic form.
    again = run_tool("phaze-opt", str(plan))
    assert again.returncode == 0 and again.stdout == module_text(text)


def test_a_plan_that_prices_everything_has_no_warnings(tmp_path):
    js = tmp_path / "p.json"
    r = run_main("phazec", TINY, "--hw", "a100", "-o", str(tmp_path / "p.mlir"), "--json", str(js), "-q")
    assert r.returncode == 0, r.stderr
    assert json.loads(js.read_text())["warnings"] == []
    assert "phaze.warnings" not in (tmp_path / "p.mlir").read_text()


def test_strict_refuses_a_model_with_opaque_ops(tmp_path):
    out = tmp_path / "opaque.mlir"
    out.write_text("previous plan\n")
    line = one_error(run_main("phazec", OPAQUE, "--hw", "a100", "--strict", "-o", str(out)))
    assert line.startswith("phazec: error: unknown aten op aten.i0.default (from module 'act1')")
    assert out.read_text() == "previous plan\n"


# -- Ctrl-C ----------------------------------------------------------------------------------


def test_ctrl_c_during_a_parallel_search_says_one_line(tmp_path):
    """SIGINT to the whole process group (as a terminal sends it) while the worker pool starts:
    'phazec: interrupted', status 130, nothing from the workers or from the pool's threads.
    The signal is sent when phazec says it starts the workers, not after a sleep."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "phaze.tools.phazec", TINY, "--space", str(EXAMPLES / "spaces" / "small.toml")]
        + ["-o", str(tmp_path / "o.mlir"), "--no-cache", "-j", "2"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env=env,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.startswith("phazec: preparing"):
            os.killpg(proc.pid, signal.SIGINT)
            break
    rest = proc.stderr.read()
    proc.wait(timeout=120)
    assert proc.returncode == 130, "".join(seen) + rest
    assert rest.strip() == "phazec: interrupted", rest
    assert not (tmp_path / "o.mlir").exists()


# -- names beyond ASCII ------------------------------------------------------------------------

UNICODE = """
import torch
NAME = "modèle-ü"
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.schicht_ü = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(2))
        self.kopf = torch.nn.Linear(64, 10)
    def forward(self, x):
        for layer in self.schicht_ü:
            x = torch.relu(layer(x))
        return self.kopf(x).sum()
def get_model():
    return Net()
def get_inputs(b):
    return (torch.zeros(b, 64),)
"""


def test_a_plan_with_non_ascii_names_parses_back(tmp_path):
    """MLIR prints a string's non-ASCII bytes as escapes; the plan must still read back as the
    same strings (xDSL alone would read them as bytes, and the records would not parse)."""
    plan = tmp_path / "plan.mlir"
    r = run_main("phazec", write(tmp_path, "net.py", UNICODE), "--hw", "a100", "-o", str(plan), "-q")
    assert r.returncode == 0, r.stderr
    text = plan.read_text()
    assert 'phaze.model = "mod\\C3\\A8le-\\C3\\BC"' in text and 'module = "schicht_\\C3\\BC.0"' in text
    again = run_tool("phaze-opt", str(plan))
    assert again.returncode == 0, again.stderr
    assert again.stdout == module_text(text)
    from phaze_ir import keys
    from phaze_ir.ir import parse_module

    assert keys.string_of(parse_module(text), keys.MODEL) == "modèle-ü"


def test_a_searched_plan_says_what_it_does_not_price(tmp_path):
    """The search prices the settings in worker processes: each warning still said once, and
    the JSON of the searched plan has the same records as a fixed-chip plan's."""
    js = tmp_path / "s.json"
    space = str(EXAMPLES / "spaces" / "small.toml")
    out = ["-o", str(tmp_path / "s.mlir"), "--json", str(js)]
    r = run_main("phazec", OPAQUE, "--space", space, *out, "-j", "2", "--no-cache")
    assert r.returncode == 0, r.stderr
    warned = [line for line in r.stderr.splitlines() if line.startswith("phazec: warning")]
    assert len(warned) == 2, r.stderr
    assert {w["aten"] for w in json.loads(js.read_text())["warnings"]} == {"aten.i0.default", "aten.special_i1.default"}
    strict = run_main("phazec", OPAQUE, "--space", space, "-o", str(tmp_path / "t.mlir"), "--strict", "--no-cache")
    assert one_error(strict).startswith("phazec: error: unknown aten op aten.i0.default")


def test_the_position_warning_names_the_length_given_once_under_context_parallelism(tmp_path):
    """Context parallelism traces one device's S/c tokens of a sample: the position check is of
    the whole sample, said once with the length the user gave (not the 128 a device traces)."""
    r = run_main(
        "phazec", str(MODELS / "tiny_llama_sdpa.py"), "--hw", "h100", "--devices", "4", "--global-batch", "4",
        "--micro-batch", "1", "--tp", "1", "--seq-len", "256", "--context-parallel", "2", "--no-cache",
        "-o", str(tmp_path / "plan.mlir"),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "seq 128, one of CP 2: 256 tokens a sample" in r.stderr, r.stderr
    warned = [line for line in r.stderr.splitlines() if "warning:" in line]
    assert warned == [
        "phazec: warning: tiny_llama_sdpa.py: sequence length 256 is beyond the model's max_position_embeddings = 64"
        " (no position table, but the model is not configured for it)"
    ], r.stderr
