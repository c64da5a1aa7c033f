"""Parse errors as MLIR's tools show them: ``file:line:col: error: message``, then a short
excerpt of the line around the column with a caret under it, never a whole multi-MB line; an
empty file says that it is empty.  Through ``phaze-opt`` (exit 1, no traceback) and through
``phaze_ir.ir.parse_module`` (an ``MLIRParseError``, which is a ``PhazeError``)."""

from __future__ import annotations

import re

import pytest
from conftest import run_main, run_tool

from phaze_ir.errors import PhazeError
from phaze_ir.ir import MLIRParseError, parse_module

MB = 1 << 20
GOOD_RECORD = "#phaze.layer_latency<index = 1, fwd_s = 1.0e-06, bwd_s = 2.0e-06, opt_s = 0.0>"
BAD_RECORD = "#phaze.layer_latency<index = 1, fwd_s = 8e-08, bwd_s = 2.0e-06, opt_s = 0.0>"


def _huge_line_module(bad_at: float, size: int = 4 * MB) -> tuple[str, int]:
    """A module on one line of about ``size`` characters (a long list of records), with one
    malformed float (``8e-08``) at the fraction ``bad_at`` of it; and the column of that float."""
    n = size // (len(GOOD_RECORD) + 2)
    records = [GOOD_RECORD] * n
    records[int(bad_at * (n - 1))] = BAD_RECORD
    head = "builtin.module attributes {phaze.layer_latency = ["
    line = head + ", ".join(records) + "]} {"
    column = line.index("8e-08") + 1
    return line + "\n}\n", column


def _check_short_error(stderr: str, where: str, column: int) -> list[str]:
    lines = stderr.splitlines()
    assert "Traceback" not in stderr
    assert len(lines) == 3, lines[:5]  # the error, the excerpt, the caret
    assert re.fullmatch(re.escape(f"{where}:1:{column}: error: ") + r".+", lines[0]), lines[0][:300]
    excerpt, caret = lines[1], lines[2]
    assert len(excerpt) < 300 and len(caret) < 300
    assert caret.strip() == "^"
    assert excerpt[caret.index("^") :].startswith("8e-08")  # the caret is under the bad literal
    return lines


@pytest.mark.parametrize("bad_at", [0.0, 0.5, 1.0])
def test_huge_line_error_in_phaze_opt_is_short(tmp_path, bad_at):
    text, column = _huge_line_module(bad_at)
    assert len(text) > 3 * MB
    path = tmp_path / "big.mlir"
    path.write_text(text)
    r = run_main("phaze-opt", str(path))
    assert r.returncode == 1
    lines = _check_short_error(r.stderr, str(path), column)
    assert "takes a float literal" in lines[0]
    assert len(r.stderr) < 1000


def test_huge_line_error_through_parse_module_is_short():
    text, column = _huge_line_module(0.5)
    with pytest.raises(MLIRParseError) as info:
        parse_module(text, "plan.mlir")
    assert isinstance(info.value, PhazeError)
    message = str(info.value)
    assert len(message) < 1000
    _check_short_error(message, "plan.mlir", column)
    assert info.value.location == f"plan.mlir:1:{column}"


def test_huge_string_then_syntax_error(tmp_path):
    """A multi-MB string literal on the line, then a token that does not belong."""
    blob = "x" * (5 * MB)
    text = f'builtin.module attributes {{phaze.note = "{blob}" ?}} {{\n}}\n'
    path = tmp_path / "blob.mlir"
    path.write_text(text)
    r = run_main("phaze-opt", str(path))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    column = text.index("?") + 1
    assert lines[0].startswith(f"{path}:1:{column}: error: "), lines[0][:300]
    assert all(len(line) < 300 for line in lines) and len(lines) <= 3
    assert lines[1][lines[2].index("^")] == "?"


def test_short_error_shows_the_whole_line(tmp_path):
    path = tmp_path / "bad.mlir"
    path.write_text('builtin.module {\n\t%x = "phaze.matmul"() : () -> tensor<2x2xq16>\n}\n')
    r = run_main("phaze-opt", str(path))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    error, excerpt, caret = r.stderr.splitlines()
    assert error.startswith(f"{path}:2:") and "error: Expected shape type" in error
    column = int(error.split(":")[2])
    assert "..." not in excerpt and excerpt.startswith(" %x = ")  # the tab shows as one space
    assert caret.index("^") == column - 1 and excerpt[column - 1 :].startswith("q16")


@pytest.mark.parametrize("content", ["", "\n\n", "   \n", "// just a comment\n// and another\n"])
def test_empty_file_says_so(tmp_path, content):
    path = tmp_path / "empty.mlir"
    path.write_text(content)
    r = run_main("phaze-opt", str(path))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.splitlines() == [
        f"{path}:1:1: error: empty input: expected an MLIR module (the file holds no operation)"
    ]
    assert "Could not parse entire input" not in r.stderr


def test_empty_text_through_parse_module():
    with pytest.raises(MLIRParseError, match="empty input"):
        parse_module("", "x.mlir")


def test_garbage_at_top_level_is_not_called_a_partial_parse(tmp_path):
    path = tmp_path / "g.mlir"
    path.write_text("builtin.module {\n}\n}\n")
    r = run_main("phaze-opt", str(path))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"{path}:3:1: error: expected an operation")


def test_truncated_file_says_end_of_input(tmp_path):
    path = tmp_path / "t.mlir"
    path.write_text("builtin.module {\n")
    r = run_main("phaze-opt", str(path))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"{path}:2:1: error: unexpected end of input")


def test_split_input_file_counts_lines_of_the_whole_file(tmp_path):
    path = tmp_path / "s.mlir"
    path.write_text("builtin.module {\n}\n// -----\nbuiltin.module {\n  %x = \n}\n")
    r = run_main("phaze-opt", str(path), "--split-input-file")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert re.match(re.escape(str(path)) + r":6:\d+: error: ", r.stderr), r.stderr


def test_debug_keeps_the_traceback(tmp_path):
    path = tmp_path / "e.mlir"
    path.write_text("")
    r = run_tool("phaze-opt", str(path), "--debug")
    assert r.returncode != 0 and "Traceback" in r.stderr and "MLIRParseError" in r.stderr
