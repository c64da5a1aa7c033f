"""The ``xdsl.universe`` entry point: stock xDSL tools (``xdsl-opt``) see phaze's dialect and
passes through it (``[project.entry-points."xdsl.universe"]`` in ``pyproject.toml``).

Importing this module changes nothing in the process: ``sys.excepthook`` stays the one found.

phaze's errors are xDSL diagnostics (``PhazeError`` is a ``DiagnosticException``).  Stock
``xdsl-opt`` prints a diagnostic only under ``--verify-diagnostics`` and otherwise lets it
escape as a traceback; so that a phaze pass run by stock ``xdsl-opt`` on IR that lacks what it
needs says so in one line, as ``mlir-opt`` would, a tool that builds one of phaze's passes from
this universe (``-p phaze-...``: the universe's factory is called) opts in to
:func:`phaze.messages.install_error_hook`: an uncaught ``PhazeError`` is printed as
``error: <message>`` (exit status 1) and every other exception left to the hook found
(``PHAZE_DEBUG=1`` keeps the traceback).  phaze's own tools install that hook in their ``main``.
"""

from collections.abc import Callable

from xdsl.universe import Universe

from passes import ALL_PASSES


def _phaze_dialect():
    from phaze_ir.dialect import Phaze

    return Phaze


def _reporting_errors(factory: Callable[[], type]) -> Callable[[], type]:
    """``factory``, which also installs phaze's error hook when a tool calls it (it is about to
    run one of phaze's passes)."""

    def load() -> type:
        from phaze.messages import error_hook_installed, install_error_hook

        if not error_hook_installed():  # phaze-opt's own (with its --debug) stays
            install_error_hook()
        return factory()

    return load


PHAZE_UNIVERSE = Universe(
    all_dialects={"phaze": _phaze_dialect},
    all_passes={name: _reporting_errors(factory) for name, factory in ALL_PASSES.items()},
)
