""":class:`PhazeWarning`, apart from :mod:`phaze_ir.errors` because it needs no xDSL: the pure
algorithms (``passes/algorithms``, which import no xDSL) issue it too."""


class PhazeWarning(UserWarning):
    """Something the user should know that does not stop the compilation (an op phaze does not
    price, a parameter without gradient, a cache entry that fails its check).  Issued with
    :func:`warnings.warn`, so that a message that recurs (the plan sweep imports the model once
    per point) is shown once; phaze's tools print it as ``<tool>: warning: <message>``."""


#: Where :func:`warn_unsourced` says its warnings come from: no file, so no source line.
UNSOURCED = "phaze"


def warn_unsourced(message: str) -> None:
    """Say ``message`` as a :class:`PhazeWarning` through :mod:`warnings`, shown as
    ``phaze:0: PhazeWarning: <message>`` with no source line under it (Python's default
    formatting quotes the line a warning names; this one names none): for a warning about the
    caller's request, not a line of code (``Plan.export``'s runtime differences).  Said each time
    it is called: the caller says each message once."""
    import warnings

    warnings.warn_explicit(message, PhazeWarning, filename=UNSOURCED, lineno=0, module=UNSOURCED, registry={})
