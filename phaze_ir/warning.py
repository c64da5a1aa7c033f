""":class:`PhazeWarning`, apart from :mod:`phaze_ir.errors` because it needs no xDSL: the pure
algorithms (``passes/algorithms``, which import no xDSL) issue it too."""


class PhazeWarning(UserWarning):
    """Something the user should know that does not stop the compilation (an op phaze does not
    price, a parameter without gradient, a cache entry that fails its check).  Issued with
    :func:`warnings.warn`, so that a message that recurs (the plan sweep imports the model once
    per point) is shown once; phaze's tools print it as ``<tool>: warning: <message>``."""
