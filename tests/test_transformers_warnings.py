"""transformers' logged warnings never reach stderr as ``[transformers] ...`` lines (issue 58
item 5, "warnings through warnings, once"): the tools say each once as ``phazec: warning:
transformers: <first line>``, ``phaze.compile`` through :mod:`warnings` and ``Plan.warnings``,
and the caller's logging is as it was after; a library's Python warning is one line naming its
package, never a file path and a source line (phaze.messages, phaze_ir.warning)."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings

from conftest import MODELS, ROOT

MODEL = f"""
import sys, warnings
sys.path.insert(0, {str(MODELS)!r})
from transformers.utils import logging as hf_logging
import tiny_llama_sdpa
from tiny_llama_sdpa import NAME, SEQ_LEN, get_inputs  # noqa: F401


def get_model():
    hf_logging.get_logger("transformers.models.llama").warning("`foo` is deprecated\\n{{\\n  a dump\\n}}")
    warnings.warn("a warning of the model's own", FutureWarning)
    return tiny_llama_sdpa.get_model()
"""


def test_the_tool_says_transformers_warnings_once_in_one_line(tmp_path):
    (tmp_path / "warny.py").write_text(MODEL)
    env = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "warning", "PATH": "/usr/bin"}
    args = [sys.executable, "-m", "phaze.tools.phazec", str(tmp_path / "warny.py"), "--emit", "training", "-q"]
    args += ["--cache", str(tmp_path / "cache"), "-o", str(tmp_path / "t.mlir")]
    # compiled, then read from the cache (no model imported): the same lines both times (the
    # model's own warning was not said again from the cache)
    for _ in range(2):
        r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        lines = r.stderr.strip().splitlines()
        assert lines == [
            "phazec: warning: transformers: `foo` is deprecated …",
            "phazec: warning: FutureWarning from warny: a warning of the model's own",
        ], r.stderr


def test_the_api_says_them_through_warnings_and_leaves_logging_as_it_was(capsys, monkeypatch):
    import torch
    from transformers.utils import logging as hf_logging

    import phaze
    from phaze_ir import warning

    monkeypatch.syspath_prepend(str(MODELS))
    monkeypatch.setattr(warning, "_FOR_THE_PROCESS", [False])  # as in a program (a tool in-process before)
    warning.route_transformers(False)
    hf_logging.set_verbosity_warning()  # a program that imported transformers first
    try:

        def inputs(b: int, s: int) -> dict:
            ids = torch.zeros(b, s, dtype=torch.long)
            return {"input_ids": ids, "labels": ids}

        def model():
            hf_logging.get_logger("transformers.models.llama").warning("`bar` is deprecated")
            sys.path.insert(0, str(MODELS))
            import tiny_llama_sdpa

            return tiny_llama_sdpa.get_model()

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plan = phaze.compile(model, "h100", inputs=inputs, seq_len=32, devices=8, global_batch=16)
        assert "transformers: `bar` is deprecated" in plan.warnings
        assert [str(w.message) for w in caught].count("transformers: `bar` is deprecated") == 1
        assert "[transformers]" not in capsys.readouterr().err
        handlers = logging.getLogger("transformers").handlers
        assert handlers and not any(warning._FILTER in h.filters for h in handlers)  # the caller's, as it was
    finally:
        hf_logging.set_verbosity_error()
