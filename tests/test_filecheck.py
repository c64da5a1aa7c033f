"""Run the FileCheck (.mlir) tests under tests/filecheck with lit, so that `pytest` runs every
Python-side test.  Each .mlir file is one lit test; a failure prints lit's report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

FILECHECK_DIR = Path(__file__).resolve().parent / "filecheck"


@pytest.mark.parametrize("test", sorted(p.name for p in FILECHECK_DIR.glob("*.mlir")))
def test_filecheck(test):
    # lit has no __main__ module; call its entry point with this interpreter.
    r = subprocess.run(
        [sys.executable, "-c", "from lit.main import main; main()", "-v", str(FILECHECK_DIR / test)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Passed: 1" in r.stdout


def test_every_pass_has_a_filecheck_test():
    """Each registered pass ``phaze-NAME`` has ``NAME.mlir`` (dashes as underscores), which
    runs it."""
    from passes import ALL_PASSES

    missing = []
    for name in sorted(ALL_PASSES):
        path = FILECHECK_DIR / (name.removeprefix("phaze-").replace("-", "_") + ".mlir")
        if not path.exists() or name not in path.read_text():
            missing.append(name)
    assert missing == []
