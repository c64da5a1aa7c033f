"""The phaze compiler: what a user runs.

``phazec`` and ``phaze-opt`` (``phaze/tools``), the fixed pass pipeline and its sweep over
micro-batch and TP (``phaze/driver.py``), the architecture search with its baselines and report
(``phaze/search``), and the ``xdsl.universe`` entry point (``phaze/universe.py``).

It sits above both other packages: it imports ``phaze_ir`` (the IR) and ``passes`` (the passes
and their algorithms); neither imports it (``[tool.importlinter]`` in ``pyproject.toml``).
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("phaze")
except _metadata.PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "unknown"
