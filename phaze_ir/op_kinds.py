"""Vocabularies of op kinds that both the dialect and the pure algorithms need (plain Python, no
xDSL: ``passes/algorithms`` may import it)."""

from enum import StrEnum


class RecomputePolicy(StrEnum):
    """What a stage's backward recomputes (``#phaze<recompute_policy ...>``, the DP's policies,
    ``--recompute``'s words besides ``auto``): the one declaration of these words."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


#: ``phaze.layout`` kinds that alias their first operand's storage (views: no data moves).
VIEW_KINDS = (
    "view",
    "reshape",
    "transpose",
    "permute",
    "expand",
    "squeeze",
    "unsqueeze",
    "slice",
    "select",
    "alias",
    "split",
    "unbind",
    "as_strided",
    "detach",
    "diagonal",
    # A convolution's operand unfolded into GEMM rows (im2col) and a GEMM result folded back into
    # an image (col2im): implicit GEMM never materializes them, so they cost nothing and alias
    # their operand (docs/design.md §2, §5.3).
    "im2col",
    "col2im",
)
