""":class:`PhazeWarning`, apart from :mod:`phaze_ir.errors` because it needs no xDSL: the pure
algorithms (``passes/algorithms``, which import no xDSL) issue it too."""

import logging
import warnings


class PhazeWarning(UserWarning):
    """Something the user should know that does not stop the compilation (an op phaze does not
    price, a parameter without gradient, a cache entry that fails its check).  Issued with
    :func:`warnings.warn`, so that a message that recurs (the plan sweep imports the model once
    per point) is shown once; phaze's tools print it as ``<tool>: warning: <message>``."""


class ReplicatedLinearsWarning(PhazeWarning):
    """Linears that tensor parallelism keeps replicated at one width of one traced step
    (``phaze-shard-tensor-parallel``'s warning, beside its ``phaze.tp_replicated`` records).  A
    search that shards many widths and cut traces (``phazec --hw``: the model cut to 3 and 4
    blocks, then the whole) holds these back and says the plan's own records once
    (``phaze.hw_answer``): otherwise each width tried, and each cut, says its own count."""


#: Where :func:`warn_unsourced` says its warnings come from: no file, so no source line.
UNSOURCED = "phaze"


def warn_unsourced(message: str) -> None:
    """Say ``message`` as a :class:`PhazeWarning` through :mod:`warnings`, shown as
    ``phaze:0: PhazeWarning: <message>`` with no source line under it (Python's default
    formatting quotes the line a warning names; this one names none): for a warning about the
    caller's request, not a line of code (``Plan.export``'s runtime differences).  Said each time
    it is called: the caller says each message once."""
    warnings.warn_explicit(message, PhazeWarning, filename=UNSOURCED, lineno=0, module=UNSOURCED, registry={})


def first_line(message: str) -> str:
    """A message's first line that says something (a library's may run over many: a config
    dumped as JSON), `` …`` marking the lines left off."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    return (lines[0] + (" …" if len(lines) > 1 else "")) if lines else ""


class _TransformersToWarnings(logging.Filter):
    """On transformers' log handlers: a record at WARNING or above is said as a
    :class:`PhazeWarning` ``transformers: <its first line>`` (so once, through phaze's
    warnings: the tools' one line, ``phaze.compile``'s :mod:`warnings` and ``Plan.warnings``)
    instead of the handler's ``[transformers] ...`` on stderr; a record below (info, debug:
    shown only at a verbosity the user asked for with ``TRANSFORMERS_VERBOSITY``) as before."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        warnings.warn(f"transformers: {first_line(record.getMessage())}", PhazeWarning, stacklevel=2)
        return False


_FILTER = _TransformersToWarnings()
_FOR_THE_PROCESS = [False]


def routed_for_the_process() -> bool:
    """Whether a tool routes transformers' warnings for the whole process (its ``main``)."""
    return _FOR_THE_PROCESS[0]


def route_transformers(on: bool, for_the_process: bool = False) -> None:
    """Put the filter that says transformers' logged warnings as :class:`PhazeWarning` on (take
    it off) the handlers of transformers' logger. transformers makes its handler when first
    imported: ``for_the_process`` (a tool's ``main``, before any import of transformers) keeps
    the route wanted, and :func:`keep_route` (the model loader's, once transformers is
    imported) puts the filter on the handler made since."""
    if for_the_process:
        _FOR_THE_PROCESS[0] = on
    for handler in logging.getLogger("transformers").handlers:
        (handler.addFilter if on else handler.removeFilter)(_FILTER)


def keep_route() -> None:
    """:func:`route_transformers` again where a tool wants it for the process (the loader calls
    this once a model file or config is loaded: transformers' handler exists by then)."""
    if _FOR_THE_PROCESS[0]:
        route_transformers(True)
