"""Huge numbers on the command line (session 64's probe round, issue 58: "long numbers in SI,
one line per refusal, before the work"): each is refused in one line naming its flag and its
bound, before any model is traced; none is a traceback (``--cache-limit 1e400`` was an
``OverflowError``: float('1e400') is infinity) nor a reason that is not its own
(``--context-parallel 99999999999999999999`` was "expected auto or a degree N >= 1")."""

from __future__ import annotations

import pytest
from conftest import MODELS

TINY = str(MODELS / "tiny_llama_sdpa.py")
BOUND = "2.15 G (2,147,483,647)"


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--devices", "1" + "0" * 30], f"--devices 100000000000… (31 digits): expected a positive integer up to "
                                        f"{BOUND}"),
        (["--global-batch", str(2**64)], f"--global-batch {2**64}: expected a positive integer up to {BOUND}"),
        (["--seq-len", str(2**40)], f"--seq-len {2**40}: expected a positive integer up to {BOUND}"),
        (["--context-parallel", "9" * 20], f"--context-parallel {'9' * 20}: expected auto or a degree from 1 to "
                                           f"{BOUND}"),
        (["--selective-recompute", "layer:" + "9" * 30], "expected attention, op, layer:N or share:P "
                                                         "(N a positive integer, up to 999999;"),
        (["--placement", "expert:1,1," + "9" * 50], "PP, DP and TP must be from 1 to 2147483647"),
        (["--power-cap", "1e400"], "--power-cap inf: expected a positive number of watts"),
        (["--solver-time-limit", "1e400"], "--solver-time-limit inf: expected a positive, finite number of seconds"),
        (["--cache-limit", "1e400"], "argument --cache-limit: '1e400': expected a size such as 4GiB, 500MB or 0"),
    ],
    ids=["devices", "global-batch", "seq-len", "context-parallel", "selective-layer", "placement", "power-cap",
         "solver-time-limit", "cache-limit"],
)  # fmt: skip
def test_phazec_refuses_a_huge_number_in_one_line_before_the_work(capsys, no_trace, flags, says):
    from phaze.tools import phazec

    try:
        rc = phazec.main([TINY, "--hw", "h100", "--no-cache", "-q", *flags])
    except SystemExit as e:  # argparse's own refusal (a value its type cannot read)
        rc = e.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc in (1, 2) and len(lines) == 1 and lines[0].startswith("phazec: error: ") and says in lines[0], err


@pytest.mark.parametrize("text", ["1e400", "1e309", "1e300TiB", "1e290TiB"])
def test_a_cache_limit_past_any_float_is_refused_not_an_overflow(text):
    import argparse

    from phaze.tools.flags import cache_size

    if text == "1e290TiB":  # finite: a limit larger than any disk, which is no limit at all
        assert cache_size(text) > 10**300
        return
    with pytest.raises(argparse.ArgumentTypeError, match="expected a size such as 4GiB"):
        cache_size(text)


def test_phaze_validate_refuses_a_huge_cache_limit_in_one_line(tmp_path, capsys):
    from phaze.tools import phaze_validate

    with pytest.raises(SystemExit) as info:
        phaze_validate.main([str(tmp_path / "runs.csv"), "--hw", "h100", "--cache-limit", "1e400"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "--cache-limit: '1e400'" in err, err
