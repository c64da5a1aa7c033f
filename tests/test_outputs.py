"""Outputs never destroy anything: a run whose output is one of its inputs, or two of whose
outputs are the same file, is refused before any work; every file is written to a temporary
file and renamed into place once complete, so a failed run (a full disk included) leaves the
previous file as it was.  One line, exit status 1, no traceback."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import pytest
from conftest import EXAMPLES, MODELS, ROOT, run_main

from phaze.outputs import refuse_clashes, write_atomically
from phaze_ir.errors import PhazeError

TINY = MODELS / "tiny_gpt2.py"


def _one_line_error(r: subprocess.CompletedProcess, tool: str, says: str) -> None:
    assert r.returncode == 1
    lines = [line for line in r.stderr.splitlines() if ": error" in line]
    assert len(lines) == 1 and lines[0].startswith(f"{tool}: error: ") and says in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_phaze_opt_refuses_to_write_over_its_input(tmp_path):
    src = tmp_path / "x.mlir"
    shutil.copy(ROOT / "tests" / "filecheck" / "tile_pe_array.mlir", src)
    before = src.read_bytes()
    r = run_main("phaze-opt", str(src), "-o", str(tmp_path / "." / "x.mlir"))
    _one_line_error(r, "phaze-opt", "is the input file: refusing to overwrite it")
    assert src.read_bytes() == before


def test_phaze_opt_keeps_the_previous_output_when_the_run_fails(tmp_path):
    out = tmp_path / "out.mlir"
    out.write_text("the previous output\n")
    bad = tmp_path / "bad.mlir"
    bad.write_text("builtin.module {\n  %0 = phaze.nope\n")
    r = run_main("phaze-opt", str(bad), "-o", str(out))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert out.read_text() == "the previous output\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.mlir", "out.mlir"]  # no temporary left


@pytest.mark.parametrize(
    "flags, says",
    [
        (["-o", "{model}"], "-o {model} is the model file: refusing to overwrite it"),
        (["-o", "same.out", "--json", "same.out"], "--json same.out is also -o: give each output its own file"),
        (["-o", "a.mlir", "--json", "./a.mlir"], "--json ./a.mlir is also -o"),
        (["--hw", "{hw}", "-o", "{hw}"], "is the --hw file: refusing to overwrite it"),
    ],
)
def test_phazec_refuses_clashing_outputs_before_any_work(tmp_path, flags, says):
    model = tmp_path / "m.py"
    shutil.copy(TINY, model)
    hw = tmp_path / "chip.toml"
    shutil.copy(EXAMPLES / "hw" / "tpuv4.toml", hw)
    before = {p: p.read_bytes() for p in (model, hw)}
    args = [f.format(model=model, hw=hw) for f in flags]
    if "--hw" not in args:
        args += ["--hw", "tpuv4"]
    r = run_main("phazec", str(model), *args, cwd=tmp_path)
    _one_line_error(r, "phazec", says.format(model=model))
    assert "tracing" not in r.stderr  # refused before any work
    assert {p: p.read_bytes() for p in before} == before
    assert not (tmp_path / "same.out").exists() and not (tmp_path / "a.mlir").exists()


@pytest.mark.skipif(sys.platform != "linux", reason="the file-size limit is set with bash's ulimit")
def test_a_full_disk_leaves_the_previous_plan(tmp_path):
    """The issue's reproduction: writing stops at the file-size limit (as on a full disk)."""
    prev = tmp_path / "prev.mlir"
    prev.write_text("the previous good plan\n")
    cmd = (
        f'trap "" XFSZ; ulimit -f 40; exec {sys.executable} -m phaze.tools.phazec {TINY} --hw tpuv4 '
        f"--micro-batch 1 --tp 1 -q -o {prev}"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    _one_line_error(r, "phazec", f"{prev}: cannot write: File too large")
    assert prev.read_text() == "the previous good plan\n"
    assert [p.name for p in tmp_path.iterdir()] == ["prev.mlir"]  # no temporary left


def test_write_atomically_replaces_whole_and_keeps_the_mode(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("old")
    path.chmod(0o640)
    write_atomically(path, "new\n")
    assert path.read_text() == "new\n" and stat.S_IMODE(path.stat().st_mode) == 0o640
    with pytest.raises(PhazeError, match="cannot write"):
        write_atomically(tmp_path / "missing-dir" / "x.json", "x")


def test_a_link_to_an_input_is_the_input(tmp_path):
    model = tmp_path / "m.py"
    model.write_text("x = 1\n")
    (tmp_path / "link.py").symlink_to(model)
    os.link(model, tmp_path / "hard.py")
    for alias in ("link.py", "hard.py"):
        with pytest.raises(PhazeError, match="is the model file"):
            refuse_clashes([("the model file", str(model))], [("-o", str(tmp_path / alias))])
    refuse_clashes([("the model file", str(model))], [("-o", "-"), ("--json", None), ("--report", "r.html")])
