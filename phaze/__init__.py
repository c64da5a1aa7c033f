"""The phaze compiler: what a user runs.

``phaze.compile`` (``phaze/api.py``, the library), ``phazec`` and ``phaze-opt``
(``phaze/tools``), the fixed pass pipeline (``phaze/pipeline.py``) and the driver of a
compilation with its sweep over micro-batch and TP (``phaze/driver.py``; the options in
``phaze/options.py``, the sweep's points in ``phaze/points.py``, the plan's JSON and text in
``phaze/plan/plan_output.py``), the architecture search with its baselines and report (``phaze/search``),
and the ``xdsl.universe`` entry point (``phaze/universe.py``).

It sits above both other packages: it imports ``phaze_ir`` (the IR) and ``passes`` (the passes
and their algorithms); neither imports it (``[tool.importlinter]`` in ``pyproject.toml``).
"""

from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("phaze")
except _metadata.PackageNotFoundError:  # run from a checkout that was never installed
    __version__ = "unknown"


def compile(model, hw: str = "h100", **options):
    """:func:`phaze.api.compile`: the :class:`phaze.api.Plan` of ``model`` on ``hw`` (imported
    on first use: ``import phaze`` stays light)."""
    from phaze.api import compile as compile_plan

    return compile_plan(model, hw, **options)
