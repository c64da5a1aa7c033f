"""The ``xdsl.universe`` entry point: stock xDSL tools (``xdsl-opt``) see phaze's dialect and
passes through it (``[project.entry-points."xdsl.universe"]`` in ``pyproject.toml``)."""

from xdsl.universe import Universe

from passes import ALL_PASSES


def _phaze_dialect():
    from phaze_ir.dialect import Phaze

    return Phaze


PHAZE_UNIVERSE = Universe(all_dialects={"phaze": _phaze_dialect}, all_passes=dict(ALL_PASSES))
