"""Parse errors in one line, as MLIR's tools begin theirs: ``file:line:col: error: message (at
'...')``, the quote a short excerpt of the line from the column on (``after '...'`` at the end of
a line), its control characters escaped, never a whole multi-MB line; an empty file says that it
is empty.  Through ``phaze-opt`` (exit 1, no traceback) and through
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
    assert len(lines) == 1, lines[:5]  # the error, its place and the source there, in one line
    assert re.fullmatch(re.escape(f"{where}:1:{column}: error: ") + r".+", lines[0]), lines[0][:300]
    assert " (at '8e-08, bwd_s = 2.0e-06, opt_s = 0.0>" in lines[0], lines[0][-200:]
    assert len(lines[0]) < 300
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
    assert len(lines) == 1 and lines[0].startswith(f"{path}:1:{column}: error: "), lines[0][:300]
    assert len(lines[0]) < 300 and lines[0].endswith(" (at '?} {')"), lines[0]


def test_short_error_quotes_the_rest_of_the_line(tmp_path):
    path = tmp_path / "bad.mlir"
    path.write_text('builtin.module {\n\t%x = "phaze.matmul"() : () -> tensor<2x2xq16>\t\n}\n')
    r = run_main("phaze-opt", str(path))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    [error] = r.stderr.splitlines()
    column = len('\t%x = "phaze.matmul"() : () -> tensor<2x2x') + 1  # a tab counts as one column
    assert error == f"{path}:2:{column}: error: Expected shape type. (at 'q16>\\t')", error  # the tab escaped


RECORD = "#phaze.layer_latency<index = 1, fwd_s = 8.0e-08, bwd_s = 2.0e-06, opt_s = 0.0>"


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (  # a value spelt wrong
            f'  %x = "phaze.matmul"() {{a = {RECORD.replace("8.0e-08", "8e-08")}}} : () -> ()',
            ":2:70: error: field 'fwd_s' of phaze.layer_latency takes a float literal, with a '.' (like 1.0 or "
            "8.0e-08; 0x7FF0000000000000 for the bits of inf/nan) (at '8e-08, bwd_s = 2.0e-06, opt_s = 0.0>} : …')",
        ),
        (  # a comma missing
            f'  %x = "phaze.matmul"() {{a = {RECORD.replace("e-08,", "e-08")}}} : () -> ()',
            ":2:78: error: '>' expected (at 'bwd_s = 2.0e-06, opt_s = 0.0>} : () -> (…')",
        ),
        (  # a type that cannot be read
            '  %x = "phaze.matmul"() : () -> tensor<2x?q>',
            ":2:43: error: Expected 'x' in shape delimiter, got q (at 'q>')",
        ),
        (  # control characters, in a string and outside
            '  %x = "phaze.matmul"() {a = "\x1b[2J"} : () -> i32 \x1b[2J\x07',
            ":2:50: error: Unexpected character: \\x1b (at '\\x1b[2J\\x07')",
        ),
        (  # a bracket missing: found where the next line begins
            '  %x = "phaze.matmul"() {a = 1 : () -> ()',
            ":3:1: error: Invalid type given for integer or float attribute. (at '}')",
        ),
    ],
    ids=["float-literal", "comma", "type", "control", "bracket"],
)
def test_each_kind_of_syntax_error_is_one_line_that_locates_it(tmp_path, capsys, line, says):
    """The kinds of syntax error a hand-edited plan meets: one line, its file:line:col, the
    source there quoted with its control characters escaped (never a raw escape or a second line)."""
    from phaze.tools import phaze_opt

    path = tmp_path / "e.mlir"
    path.write_text(f"builtin.module {{\n{line}\n}}\n")
    assert phaze_opt.main([str(path)]) == 1
    err = capsys.readouterr().err
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err == f"{path}{says}\n"
    assert all(c.isprintable() for c in err[:-1]), err


def test_an_error_at_the_end_of_a_line_quotes_what_comes_before(tmp_path, capsys):
    from phaze.tools import phaze_opt

    path = tmp_path / "cut.mlir"
    path.write_text('builtin.module {\n  %x = "phaze.matmul"() {a = 1, b = \t')  # cut short, as by a full disk
    assert phaze_opt.main([str(path)]) == 1
    err = capsys.readouterr().err
    said = "unexpected end of input: attribute expected"
    assert err == f"{path}:2:38: error: {said} (after '  %x = \"phaze.matmul\"() {{a = 1, b =')\n"


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
