"""No hidden channels (issue 43): importing phaze changes nothing in the process; the process's
exception hook is installed by phaze's tools' ``main`` (or by a stock xDSL tool building one of
phaze's passes from phaze's universe), and what phaze keeps in module globals cannot change an
answer."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import MODELS, ROOT, run_main, run_tool


def _python(code: str, *args: str, input: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("PHAZE_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-c", code, *args], input=input, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600
    )


def test_importing_the_universe_leaves_the_exception_hook_alone():
    r = _python(
        "import sys\n"
        "found = sys.excepthook\n"
        "import phaze, phaze.universe, phaze.messages, phaze.driver, passes\n"
        "from xdsl.universe import Universe\n"
        "Universe.get_multiverse()\n"
        "print(sys.excepthook is found)\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout == "True\n"


RAISE = """
import sys
from phaze.messages import install_error_hook
from phaze_ir.errors import PhazeError
{install}
raise PhazeError("first line\\nsecond line")
"""


@pytest.mark.parametrize(
    "install, said",
    [
        # one line per refusal: the newline inside the message is shown escaped (phaze_ir.files.printable)
        ("install_error_hook('phazec')", "phazec: error: first line\\nsecond line\n"),
        ("install_error_hook()", "error: first line\\nsecond line\n"),
        (
            "install_error_hook('phazec'); install_error_hook('phaze-opt')",
            "phaze-opt: error: first line\\nsecond line\n",
        ),
    ],
)
def test_the_hook_prints_an_uncaught_phaze_error_on_one_line(install, said):
    r = _python(RAISE.format(install=install))
    assert r.returncode == 1
    assert r.stderr.startswith(said) and "Traceback" not in r.stderr


@pytest.mark.parametrize("install", ["", "install_error_hook('phazec', debug=True)"])
def test_without_the_hook_or_with_debug_the_traceback_stays(install):
    r = _python(RAISE.format(install=install))
    assert r.returncode == 1
    assert "Traceback" in r.stderr and "PhazeError: first line" in r.stderr


def test_other_exceptions_reach_the_hook_found():
    r = _python(
        "import sys\n"
        "sys.excepthook = lambda *a: print('theirs', a[0].__name__)\n"
        "from phaze.messages import install_error_hook, error_hook_installed\n"
        "install_error_hook('phazec'); install_error_hook('phazec')\n"
        "assert error_hook_installed()\n"
        "raise KeyError('x')\n"
    )
    assert r.stdout == "theirs KeyError\n"


def test_stock_xdsl_opt_still_says_a_phaze_error_in_one_line():
    """Stock ``xdsl-opt`` running a phaze pass on IR that lacks what it needs: one line, as
    before the hook moved out of the universe's import (the universe's pass factory installs it)."""
    import importlib.metadata

    if "phaze" not in {e.name for e in importlib.metadata.entry_points(group="xdsl.universe")}:
        pytest.skip("phaze is not pip-installed (the README's commands install it)")
    fwd = run_main("phazec", str(MODELS / "tiny_gpt2.py"), "--emit", "ir", "-q")
    assert fwd.returncode == 0, fwd.stderr
    main = "from xdsl.tools.xdsl_opt import main; main()"
    r = _python(main, "-p", "phaze-mark-saved", input=fwd.stdout)
    assert r.returncode == 1
    assert r.stderr == (
        "error: phaze-mark-saved: the step has no backward ops; import it with phazec --emit training\n"
    )
    # A pipeline of xDSL's passes only builds none of phaze's: the hook found stays.
    r = _python(
        "import sys\nfound = sys.excepthook\n"
        "from xdsl.xdsl_opt_main import xDSLOptMain\n"
        "xDSLOptMain(args=['-p', 'canonicalize']).run()\n"
        "print(sys.excepthook is found)\n",
        input="builtin.module {}\n",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("True\n")


def test_phaze_opt_debug_keeps_the_traceback():
    fwd = run_main("phazec", str(MODELS / "tiny_gpt2.py"), "--emit", "ir", "-q")
    r = run_tool("phaze-opt", "-p", "phaze-mark-saved", "--debug", input=fwd.stdout)
    assert r.returncode == 1
    assert "Traceback" in r.stderr and "the step has no backward ops" in r.stderr
    r = run_main("phaze-opt", "-p", "phaze-mark-saved", input=fwd.stdout)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("phaze-opt: error: phaze-mark-saved: the step has no backward ops")


MODEL = """
from {helper} import SIZE
NAME = f"m{{SIZE}}"
{extra}
def get_model():
    return None
def get_inputs(micro_batch_size):
    return ()
"""


def test_loading_a_model_reads_its_helpers_as_they_are_now(tmp_path):
    """``loader._importing_beside``: a model's helper is the file on disk at each load (an
    earlier load of the same directory changes nothing), and ``sys.path`` is as before after
    a load, one that failed too."""
    from phaze_ir.errors import PhazeError
    from phaze_ir.frontend.loader import load_model_file

    helper = f"phaze_test_helper_{os.getpid()}"
    (tmp_path / f"{helper}.py").write_text("SIZE = 8\n")
    model = tmp_path / "model.py"
    model.write_text(MODEL.format(helper=helper, extra=""))
    path = list(sys.path)
    try:
        assert load_model_file(model).name == "m8"
        assert sys.path == path
        (tmp_path / f"{helper}.py").write_text("SIZE = 16\n")
        assert load_model_file(model).name == "m16"
        broken = tmp_path / "broken.py"
        broken.write_text(MODEL.format(helper=helper, extra="raise RuntimeError('no')"))
        with pytest.raises(PhazeError, match="no"):
            load_model_file(broken)
        assert sys.path == path
        assert load_model_file(model).name == "m16"
    finally:
        sys.modules.pop(helper, None)
