"""Vocabularies of op kinds that both the dialect and the pure algorithms need (plain Python, no
xDSL: ``passes/algorithms`` may import it)."""

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
)
