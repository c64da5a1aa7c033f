"""User-facing errors.

A :class:`PhazeError` is a problem with the user's input (a file, a model, an option); the CLI
tools print its message on one line and exit non-zero, without a traceback unless ``--debug``.
Anything else escaping the tools is a bug in phaze and keeps its traceback.
"""


class PhazeError(Exception):
    """A clear, one-line problem with the user's input."""
