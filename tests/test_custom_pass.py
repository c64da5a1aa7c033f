"""The out-of-tree pass in examples/custom_pass, installed as its own package, is found by
phaze-opt through the ``xdsl.universe`` entry point and runs."""

from __future__ import annotations

import subprocess
import sys

from conftest import EXAMPLES, MODELS, run_main, run_tool


def test_custom_pass_runs_through_entry_point(tmp_path):
    target = tmp_path / "site"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(EXAMPLES / "custom_pass"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    src = run_main("phazec", str(MODELS / "tiny_gpt2.py"), "--emit", "training", "-q")
    assert src.returncode == 0, src.stderr
    r = run_tool(
        "phaze-opt",
        "-p",
        'count-ops{op="phaze.matmul"}',
        input=src.stdout,
        env={"PYTHONPATH": f"{target}:{EXAMPLES.parent}"},
    )
    assert r.returncode == 0, r.stderr
    expected = src.stdout.count("= phaze.matmul ")
    assert f"count_ops.phaze.matmul = {expected} : i64" in r.stdout
    assert "count_ops.per_layer = [" in r.stdout
