"""The suite's own hygiene (tests/conftest.py): a test that leaves global state behind fails,
naming what it changed, and the files run in any order (``--file-order``)."""

from __future__ import annotations

import re

from conftest import ROOT

pytest_plugins = ["pytester"]

LEAKS = """
import os, signal, sys, warnings

def test_path():
    sys.path.insert(0, "/nowhere")

def test_environment():
    os.environ["PHAZE_LEAK"] = "1"

def test_folder(tmp_path):
    os.chdir(tmp_path)

def test_warnings():
    warnings.simplefilter("ignore")

def test_signal():
    signal.signal(signal.SIGUSR1, lambda *a: None)

def test_clean(monkeypatch, tmp_path):
    monkeypatch.setenv("PHAZE_SCOPED", "1")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
"""


def _run(pytester, *args):
    pytester.makeconftest((ROOT / "tests" / "conftest.py").read_text())
    return pytester.runpytest_subprocess("-p", "no:xdist", "-p", "no:cacheprovider", *args)


def test_a_test_that_leaves_state_behind_fails(pytester):
    pytester.makepyfile(test_leaks=LEAKS)
    result = _run(pytester, "-rE")
    result.assert_outcomes(passed=6, errors=5)
    for what in ("sys.path", "os.environ", "the working folder", "warnings filters", "signal handlers"):
        result.stdout.fnmatch_lines([f"*left global state changed*{what}*"])
    result.stdout.no_fnmatch_line("*test_clean*left global*")


def test_files_run_in_the_order_asked(pytester):
    for name in ("a", "b", "c", "sweep"):
        pytester.makepyfile(**{f"test_{name}": f"def test_{name}():\n    print('ran {name[0]}')\n"})

    def ran(order: str) -> str:
        return "".join(re.findall(r"ran (\w)", _run(pytester, "-s", f"--file-order={order}").stdout.str()))

    assert ran("given") == "sabc" and ran("reverse") == "scba"  # test_sweep.py: one of the longest, first
    assert sorted(ran("shuffle:1")) == ["a", "b", "c", "s"] and ran("shuffle:1") == ran("shuffle:1")
    _run(pytester, "--file-order=sideways").stderr.fnmatch_lines(["*--file-order: expected given, reverse*"])
