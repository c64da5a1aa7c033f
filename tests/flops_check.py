"""Sum the FLOPs of the training graph from the ``phaze.matmul`` operand shapes of the generic
printout (2*M*N*K per matmul, times batch dims) and compare with the textbook count: the
check of the foundation issue, independent of the dialect's own ``flops()``."""

from __future__ import annotations

import math
import re

_MATMUL = re.compile(r'"phaze\.matmul"\([^)]*\)[^\n]*? : \((tensor<[^>]*>), (tensor<[^>]*>)')


def _shape(t: str) -> list[int]:
    dims = t[len("tensor<") : -1].split("x")[:-1]
    return [int(d) for d in dims]


def matmul_flops_from_generic(text: str) -> int:
    total = 0
    for m in _MATMUL.finditer(text):
        a, b = _shape(m.group(1)), _shape(m.group(2))
        batch = a[:-2] if len(a) >= len(b) else b[:-2]
        total += 2 * a[-2] * a[-1] * b[-1] * math.prod(batch)
    return total


def textbook_gpt2(layers: int, hidden: int, vocab: int, seq: int, batch: int = 1) -> int:
    """Forward x3: 24*s*h^2 per block (QKV, proj, 2 MLP) + 4*s^2*h attention + 2*s*h*V head."""
    fwd = batch * (layers * (24 * seq * hidden**2 + 4 * seq**2 * hidden) + 2 * seq * hidden * vocab)
    return 3 * fwd


def textbook_llama(layers: int, hidden: int, ffn: int, vocab: int, seq: int, batch: int = 1) -> int:
    """Forward x3: 2*s*(4h^2 + 3*h*ffn) per block + 4*s^2*h attention + 2*s*h*V head."""
    fwd = batch * (
        layers * (2 * seq * (4 * hidden**2 + 3 * hidden * ffn) + 4 * seq**2 * hidden) + 2 * seq * hidden * vocab
    )
    return 3 * fwd
