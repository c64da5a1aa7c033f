"""Shared fixtures: traced and imported models, cached for the whole session (tracing a real
model takes seconds; every test that reads its IR shares one import)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
MODELS = Path(__file__).resolve().parent / "models"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Module- and session-scoped fixtures run before ``own_cache``: they too get a cache of this
# session only, never the user's ~/.cache/phaze (phazec keeps answers there by default).
# Removed when the session's interpreter exits (a bare mkdtemp left one behind per run).
_SESSION_CACHE = tempfile.TemporaryDirectory(prefix="phaze-tests-cache-")
os.environ["XDG_CACHE_HOME"] = _SESSION_CACHE.name


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    """Each test's own empty default cache (phazec keeps answers, settings and schedules there):
    a test never reads what another test, or the user, left."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))


@functools.cache
def compiled(model_path: str, emit: str = "training", micro_batch: int = 1) -> str:
    """The printed module of ``phazec MODEL --emit EMIT`` (in-process, cached)."""
    from phaze.tools.phazec import _parser, compile_model

    args = _parser().parse_args([model_path, "--emit", emit, "--micro-batch", str(micro_batch), "-q"])
    text, failure = compile_model(args, lambda msg: None)
    assert failure is None, failure
    return text


def module_text(plan_text: str) -> str:
    """A plan file without the summary's ``//`` comment block that heads it (what ``phaze-opt``
    prints back: MLIR tools keep no comments)."""
    lines = plan_text.splitlines(keepends=True)
    i = 0
    while i < len(lines) and lines[i].startswith("//"):
        i += 1
    if i and i < len(lines) and lines[i] == "\n":
        i += 1
    return "".join(lines[i:])


@pytest.fixture(scope="session")
def tiny_gpt2_text() -> str:
    return compiled(str(MODELS / "tiny_gpt2.py"))


@pytest.fixture
def tiny_gpt2_module(tiny_gpt2_text):
    from phaze_ir.ir import parse_module

    return parse_module(tiny_gpt2_text)


def run_tool(
    *args: str, input: str | None = None, cwd: Path | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run ``phazec``/``phaze-opt`` as a user would, via ``python -m`` so that the tests work
    from a source tree too."""
    tool, *rest = args
    module = {"phazec": "phaze.tools.phazec", "phaze-opt": "phaze.tools.phaze_opt"}[tool]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", module, *rest],
        input=input,
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        env=full_env,
        timeout=600,
    )
