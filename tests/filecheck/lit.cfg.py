# lit configuration of phaze's FileCheck tests (one .mlir file per pass, plus the dialect's
# printing, parsing and verifier tests).  Run: `lit tests/filecheck -v` (pytest runs it too).
import os
import sys

import lit.formats

config.name = "phaze"
config.test_format = lit.formats.ShTest()
config.suffixes = [".mlir"]
config.test_source_root = os.path.dirname(__file__)
root = os.path.dirname(os.path.dirname(config.test_source_root))
config.environment["PYTHONPATH"] = root + os.pathsep + os.environ.get("PYTHONPATH", "")
config.environment["PATH"] = os.environ.get("PATH", "")
# Run the tools from this source tree with this interpreter, installed or not.
config.substitutions.append(("phaze-opt", f"{sys.executable} -m phaze.tools.phaze_opt"))
config.substitutions.append(("filecheck", f"{sys.executable} -m filecheck"))
