"""Messages safe to print (issue 58, item 7): a control character quoted from the input (a file
name, a config value, an option's value, a model's name) is escaped in every message, so an
escape code cannot colour or clear the terminal and a newline or carriage return cannot forge a
second ``error:`` line; every refusal is one line."""

from __future__ import annotations

import json
import warnings

import pytest
from conftest import MODELS

from phaze.messages import PartialOutput, exit_status, message_lines, show_warnings_as
from phaze_ir.errors import PhazeError, PhazeWarning
from phaze_ir.files import printable

#: What a hostile name holds: a colour code, a clear-screen code, a forged error line after a
#: newline and after a carriage return, a C1 control (CSI), a line separator, a bidi override.
HOSTILE = "m\x1b[31m\x1b[2J\nphazec: error: forged\rphazec: error: forged\x9b1m\u2028x\u202ey"
SAFE = "m\\x1b[31m\\x1b[2J\\nphazec: error: forged\\rphazec: error: forged\\x9b1m\\u2028x\\u202ey"


def _safe(text: str) -> bool:
    """No character a terminal acts on but the newlines that end lines."""
    return all(c.isprintable() or c == "\n" for c in text)


def _one_refusal(stderr: str, tool: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{tool}: error: ") and _safe(stderr), stderr
    return lines[0]


def test_printable_escapes_what_a_terminal_acts_on_and_keeps_the_rest():
    assert printable(HOSTILE) == SAFE
    assert printable("\t") == "\\t" and printable("\x00\x7f") == "\\x00\\x7f"
    assert printable("\U000e0001") == "\\U000e0001"  # a language tag: invisible
    plain = "gpt2-xl é 中文 ✓ 'quoted' \\n as typed"
    assert printable(plain) == plain and printable(SAFE) == SAFE


def test_an_error_is_one_escaped_line(capsys):
    def fail() -> None:
        raise PhazeError(f"{HOSTILE}.py: no such file")

    assert exit_status("phazec", False, fail) == 1
    assert _one_refusal(capsys.readouterr().err, "phazec") == f"phazec: error: {SAFE}.py: no such file"


def test_several_outputs_not_written_are_one_escaped_line_each(capsys):
    def fail() -> None:
        raise PartialOutput(f"--export megatron {HOSTILE}: refused", "--export torchtitan b: refused")

    assert exit_status("phazec", False, fail) == 4
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"phazec: error: --export megatron {SAFE}: refused",
        "phazec: error: --export torchtitan b: refused",
    ]
    assert message_lines(PartialOutput("a\nb")) == ["a\\nb"]


def test_a_warning_is_one_escaped_line_said_once(capsys):
    previous = warnings.showwarning
    try:
        show_warnings_as("phazec")
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            for _ in range(2):
                warnings.warn(f"cache directory {HOSTILE} is not usable", PhazeWarning, stacklevel=1)
    finally:
        warnings.showwarning = previous
    assert capsys.readouterr().err == f"phazec: warning: cache directory {SAFE} is not usable\n"


def test_an_option_value_in_a_command_line_error_is_escaped(capsys):
    from phaze.tools import phazec

    with pytest.raises(SystemExit) as e:
        phazec.main([str(MODELS / "tiny_gpt2.py"), "--hw", "h100", "--tp", f"2{HOSTILE}"])
    assert e.value.code == 2
    line = _one_refusal(capsys.readouterr().err, "phazec")
    assert f"invalid int value: '2{SAFE}'" in line


def test_phazec_a_hostile_file_name_and_hw_name(tmp_path, capsys):
    from phaze.tools import phazec

    assert phazec.main([str(tmp_path / f"{HOSTILE}.py"), "--hw", "h100"]) == 1
    assert _one_refusal(capsys.readouterr().err, "phazec").endswith(f"{SAFE}.py: no such file")
    assert phazec.main([str(MODELS / "tiny_gpt2.py"), "--hw", HOSTILE]) == 1
    assert "unknown hardware preset 'm\\u001b[31m" in _one_refusal(capsys.readouterr().err, "phazec")


def test_a_config_value_is_escaped(tmp_path, capsys):
    from phaze.tools import phazec

    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_layer": f"2{HOSTILE}", "n_embd": 64, "n_head": 2}))
    assert phazec.main([str(config), "--hw", "h100"]) == 1
    assert "n_layer = " in _one_refusal(capsys.readouterr().err, "phazec")


def test_a_model_named_hostile_is_named_escaped(tmp_path):
    """The model's name (its file's stem, its NAME, a config's directory) reaches the plan, its
    summary and the plan file's comment block: escaped where it is made."""
    from phaze_ir.frontend.loader import _model_name, load_model_file

    model = tmp_path / f"{HOSTILE}.py"
    model.write_text((MODELS / "tiny_gpt2.py").read_text() + f"\nNAME = {HOSTILE!r}\n")
    assert load_model_file(model).name == SAFE
    model.write_text((MODELS / "tiny_gpt2.py").read_text() + "\ndel NAME\n")
    assert load_model_file(model).name == SAFE  # the file's stem
    assert _model_name(tmp_path / HOSTILE / "config.json") == SAFE


def test_phaze_opt_a_hostile_file_name_and_a_parse_error_location(tmp_path, capsys):
    from phaze.tools import phaze_opt

    assert phaze_opt.main([str(tmp_path / f"{HOSTILE}.mlir")]) == 1
    assert _one_refusal(capsys.readouterr().err, "phaze-opt").endswith(f"{SAFE}.mlir: No such file or directory")
    bad = tmp_path / f"{HOSTILE}.mlir"
    bad.write_text('"builtin.module"() ({\n  %0 = phaze.nope\n')
    assert phaze_opt.main([str(bad)]) == 1
    err = capsys.readouterr().err
    first = err.splitlines()[0]
    assert _safe(err) and SAFE in first and ": error: " in first, err
    assert sum(": error: " in line for line in err.splitlines()) == 1


def test_phaze_validate_a_refused_row_of_a_hostile_file_is_escaped(tmp_path, capsys):
    from phaze.tools import phaze_validate

    csv = tmp_path / f"{HOSTILE}.csv"
    header = (
        "# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
        "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)"
    )
    csv.write_text(f"{header}\n1,2,1,64,2,5000,32,1,1,1,10\n")  # 5,000 layers: refused, nothing traced
    rc = phaze_validate.main([str(csv), "--hw", "a100", "-q", "--summary-only"])
    err = capsys.readouterr().err
    assert _safe(err) and f"{SAFE}.csv:2: row 1:" in err, err
    assert rc == 3
