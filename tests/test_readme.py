"""Every example command of the README runs as written: each ``sh`` block's commands (a line
continued with ``\\``; ``a && b`` runs ``a`` then ``b``) and the command of "What it prints", from
a folder where the README's relative paths (``examples/``, ``data/``, ``benchmarks/``) lead to
the repository's, so that their outputs (``plan.mlir``, ...) land there and not in the checkout.
The block that installs phaze and runs the test suite is not run from inside it.  The commands
share one cache (the second question on a model reads the first one's settings); those that
take more than a few seconds on a 2-core machine are marked ``slow`` (``pytest -m "not slow"``
leaves them out)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

README = (ROOT / "README.md").read_text()
TOOLS = {
    "phazec": "phaze.tools.phazec",
    "phaze-opt": "phaze.tools.phaze_opt",
    "phaze-validate": "phaze.tools.phaze_validate",
}
#: What a command may read from the repository, by the relative path the README gives.
LINKED = ("examples", "data", "benchmarks")
#: The commands quick enough to run in every suite (the rest are marked slow).
QUICK = ("examples/mlp.py",)


def readme_commands() -> list[str]:
    """The README's example commands, each as one line, in order."""
    out = []
    said = re.search(r"^`(phazec [^`]+)`", README, re.MULTILINE)  # "What it prints"
    if said:
        out.append(said.group(1))
    for block in re.findall(r"^```sh\n(.*?)^```", README, re.MULTILINE | re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            line = " ".join(line.split())
            if line and not line.startswith("pip install"):
                out.append(line)
    return out


COMMANDS = readme_commands()


def test_the_readme_has_its_examples():
    assert len(COMMANDS) >= 6 and any("--export megatron" in c for c in COMMANDS)
    assert any(c.startswith("phazec examples/gpt2_xl.py --hw h100") for c in COMMANDS)


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("readme-cache")


@pytest.mark.parametrize(
    "command",
    [
        pytest.param(c, marks=[] if any(q in c for q in QUICK) else [pytest.mark.slow], id=f"{i}-{c.split()[1]}")
        for i, c in enumerate(COMMANDS)
    ],
)
def test_a_readme_command_runs_as_written(command, tmp_path, shared_cache):
    for name in LINKED:
        (tmp_path / name).symlink_to(ROOT / name)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env["XDG_CACHE_HOME"] = str(shared_cache)
    for part in command.split(" && "):
        tool, *args = shlex.split(part)
        argv = [sys.executable, "-m", TOOLS[tool]] if tool in TOOLS else [sys.executable if tool == "python" else tool]
        r = subprocess.run([*argv, *args], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=1800)
        assert r.returncode == 0, f"{part}\n{r.stderr[-3000:]}"
