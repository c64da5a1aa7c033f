"""The sharding lattice of tensor parallelism, and how a split maps through a view.

Every value of the step gets a *sharding state* (:data:`State`), GSPMD-like:

- :data:`REPLICATED` (``None``): every device holds the whole tensor;
- :class:`Split` ``(dim, inner, pad)``: split into ``t`` parts along ``dim``;
- :data:`PARTIAL` (``"P"``): a partial sum, every device holds a full-shaped tensor and the
  true value is their sum;
- :data:`PENDING` (``"U"``): a parameter (or a view of one) whose sharding is not decided yet;
  the first op that reads it decides it (``Propagation.decide_param``).

A split also carries its *origins*: what made it, to be demoted (made replicated, and the
propagation run again) when the split reaches an op that cannot take it.  An origin is the
index of a column-parallel linear or of a local head repeat, :data:`VOCAB_ORIGIN` (the
vocabulary-parallel embedding and LM head) or :data:`SEQUENCE_ORIGIN` (a sequence-parallel
reduce-scatter: never demoted, all-gathered instead).

The functions below map a split through single-operand layout ops (views, copies, repeats):
:func:`map_view` for one result, :func:`reshape_split` through a row-major reshape by the flat
stride of the split factor, :func:`permute_split` through transposes and permutes read off the
shapes.  A split that an op cannot carry raises :class:`SplitCannotPass`.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple


class ShardError(Exception):
    """A width the model cannot be sharded with (one-line message)."""


class SplitCannotPass(Exception):
    """A split that a layout op cannot carry (the op cuts through the split factor, or the
    shapes do not tell where it moves the split dim)."""


class Split(NamedTuple):
    """Split of a value into ``t`` parts along ``dim``.  The split factor sits ``inner``
    elements deep in that dim (``[outer, t, inner]``: a split of the heads stays exact when the
    heads are merged with the micro-batch into one ``b*heads`` dim), and ``pad`` elements are
    added to the dim before splitting (the vocabulary only, padded as Megatron pads it)."""

    dim: int
    inner: int
    pad: int = 0


#: Every device holds the whole tensor.
REPLICATED = None
#: Every device holds a full-shaped tensor; the true value is their sum.
PARTIAL = "P"
#: A parameter (or a view of one) whose sharding is not decided yet.
PENDING = "U"

#: The sharding state of a value: a :class:`Split`, :data:`REPLICATED`, :data:`PARTIAL` or
#: :data:`PENDING`.
State = Split | str | None

#: Origin of splits that come from the vocabulary-parallel embedding (and LM head).
VOCAB_ORIGIN = -1
#: Origin of sequence-parallel splits (a reduce-scatter's result and what follows from it).
SEQUENCE_ORIGIN = -2


def _strides(shape) -> list[int]:
    out, acc = [1] * len(shape), 1
    for i in range(len(shape) - 1, -1, -1):
        out[i] = acc
        acc *= shape[i]
    return out


def reshape_split(src, dst, sp: Split, t: int) -> Split:
    """The split of ``dst`` that a row-major reshape of ``src`` (split ``sp``) yields."""
    if sp.pad:
        # A padded dim (the vocabulary) must survive the reshape whole.
        pre, post = math.prod(src[: sp.dim]), math.prod(src[sp.dim + 1 :])
        for e in range(len(dst)):
            if dst[e] == src[sp.dim] and math.prod(dst[:e]) == pre and math.prod(dst[e + 1 :]) == post:
                return Split(e, sp.inner, sp.pad)
        raise SplitCannotPass(f"a reshape {tuple(src)} -> {tuple(dst)} breaks the padded dim {sp.dim}")
    f = sp.inner * _strides(src)[sp.dim]  # flat stride of the split factor
    so = _strides(dst)
    for e in range(len(dst)):
        lo, hi = so[e], so[e] * dst[e]
        if f % lo == 0 and hi % (f * t) == 0:
            return Split(e, f // lo, 0)
    raise SplitCannotPass(f"a reshape {tuple(src)} -> {tuple(dst)} cuts through the split of dim {sp.dim}")


def _permutations(src, dst, kind: str, aten: str) -> list[tuple[int, ...]]:
    """Permutations ``p`` with ``dst[k] == src[p[k]]`` that the op can be."""
    r = len(src)
    if len(dst) != r:
        return []
    if kind == "transpose":
        if r <= 1:
            return [tuple(range(r))]
        if aten.startswith("aten.t.") and r == 2:
            return [(1, 0)]
        out = []
        for i, j in itertools.combinations(range(r), 2):
            p = list(range(r))
            p[i], p[j] = j, i
            if all(dst[k] == src[p[k]] for k in range(r)):
                out.append(tuple(p))
        if not out and tuple(src) == tuple(dst):
            out.append(tuple(range(r)))
        return out
    return [p for p in itertools.permutations(range(r)) if all(dst[k] == src[p[k]] for k in range(r))]


def permute_split(src, dst, sp: Split, kind: str, aten: str) -> Split:
    """The split of ``dst`` after a transpose/permute of ``src``.  The dims the op moves are read
    off the shapes; when several permutations fit and place the split dim differently, a
    transpose that keeps the shape is taken to swap the last two dims (``k.transpose(-1, -2)``,
    the matmul idiom), else the op is refused."""
    perms = _permutations(src, dst, kind, aten)
    images = sorted({p.index(sp.dim) for p in perms})
    if len(images) == 1:
        return Split(images[0], sp.inner, sp.pad)
    r = len(src)
    if kind == "transpose" and r >= 2 and tuple(src) == tuple(dst):
        last = list(range(r))
        last[-1], last[-2] = last[-2], last[-1]
        if tuple(last) in perms:
            return Split(tuple(last).index(sp.dim), sp.inner, sp.pad)
    raise SplitCannotPass(f"cannot tell from the shapes {tuple(src)} -> {tuple(dst)} where {kind} moves dim {sp.dim}")


def removed_dims(src, dst) -> list[int]:
    """Dims ``i`` such that dropping ``src[i]`` gives ``dst``."""
    return [i for i in range(len(src)) if tuple(src[:i]) + tuple(src[i + 1 :]) == tuple(dst)]


def inserted_dims(src, dst) -> list[int]:
    """Dims ``i`` such that inserting one at ``i`` into ``src`` gives ``dst``."""
    return removed_dims(dst, src)


def repeated_dim(src, dst) -> int | None:
    """The one dim along which ``dst`` repeats ``src`` a whole number of times (None if none)."""
    if len(src) != len(dst):
        return None
    diff = [d for d in range(len(src)) if src[d] != dst[d]]
    if len(diff) != 1 or not src[diff[0]] or dst[diff[0]] % src[diff[0]]:
        return None
    return diff[0]


def map_view(kind: str, aten: str, src, dst, sp: Split, t: int) -> Split:
    """The split of one result ``dst`` of a single-operand layout op on ``src`` split ``sp``."""
    src, dst = tuple(src), tuple(dst)
    if kind in ("alias", "detach", "clone", "copy", "contiguous", "convert") and src == dst:
        return sp
    if kind in ("view", "reshape", "alias", "detach", "clone", "copy", "squeeze", "unsqueeze"):
        if math.prod(src) != math.prod(dst):
            raise SplitCannotPass(f"{kind} changes the number of elements")
        if src == dst:
            return sp
        return reshape_split(src, dst, sp, t)
    if kind in ("transpose", "permute"):
        return permute_split(src, dst, sp, kind, aten)
    if kind == "repeat" and aten == "attention" and repeated_dim(src, dst) == sp.dim and not sp.pad:
        # The importer's grouped-query repeat (repeat_interleave): each of a device's key/value
        # heads becomes its query heads' copies, on the same device.
        return Split(sp.dim, sp.inner * (dst[sp.dim] // src[sp.dim]), 0)
    if kind == "expand":
        off = len(dst) - len(src)
        if dst[sp.dim + off] != src[sp.dim]:
            raise SplitCannotPass("expand of the split dim")
        return Split(sp.dim + off, sp.inner, sp.pad)
    if kind in ("select", "unbind"):
        cands = removed_dims(src, dst)
        images = {i - (1 if i < sp.dim else 0) for i in cands if i != sp.dim}
        if len(images) != 1 or sp.dim in cands and len(cands) == 1:
            raise SplitCannotPass(f"{kind} of or near the split dim")
        return Split(images.pop(), sp.inner, sp.pad)
    if len(src) == len(dst) and src[sp.dim] == dst[sp.dim]:
        # slice, pad, zero_pad (slice_backward), flip, roll, tril, ...: acting on other dims.
        return sp
    raise SplitCannotPass(f"{kind} {src} -> {dst} changes the split dim {sp.dim}")
