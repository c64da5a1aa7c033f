"""Fused attention kernels as they run, by shape: their achieved FLOP/s from published tables.

Pure Python (no xDSL).  A fused attention kernel (FlashAttention-2 or -3, cuDNN's fused
attention) is not a large GEMM: its efficiency depends on the sequence length, the head
dimension, the causal mask and the pass (the backward recomputes the scores and is slower).  A
chip's ``[calibration] attention_kernels`` names a table of what the kernels' authors published
for it (``phaze_ir/hw_presets/attention/<name>.toml``, each curve with its source; the h100's
is the FlashAttention-3 paper's figures): per kernel (``backend``), pass, mask, head dimension
and GQA ratio, the achieved TFLOP/s at a few sequence lengths.

The FLOPs are the ones the kernel computes (flash-attention's benchmark convention, which the
tables use): the forward's ``4·b·h·s²·d``, halved under a causal mask, the backward 2.5 times
the forward (it recomputes ``QKᵀ``).  phaze's expansion of a fused attention
(``importer._attention``) has exactly these GEMMs, the causal share of them counted by
:func:`~passes.algorithms.latency.causal_fraction`, so a kernel's time is its GEMMs' computed
FLOPs over ``peak · efficiency(shape)``, and the softmax inside it costs nothing more (the
published figure is the whole kernel's).

:func:`efficiency` looks a shape up:

- the sequence length: linear in log2 between the table's lengths, held at the ends (the
  kernels' rate levels off beyond 8k: the FA3 paper's 8k and 16k figures are within 1 %);
- the head dimension: linear in log2 between the head dimensions the table has, held at the
  ends;
- GQA: the curves of the largest GQA ratio the table has at most the one asked (1, multi-head,
  when it has no other: the published H100 figures are multi-head);
- a causal backward the table lacks: the non-causal backward times the forward's causal /
  non-causal ratio at the same shape (the mask's diagonal blocks and the idle tail cost the
  backward as the forward; the FA3 paper publishes no causal backward).

:data:`BACKENDS` names the kernels; which one a runtime runs on a chip is
:func:`passes.algorithms.kernels.attention_backend`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import tomllib

#: The fused attention kernels a table can describe (their index is a description's ``backend``).
BACKENDS = ("flash2", "flash3", "cudnn", "efficient")
#: The passes (a description's ``attention``: 0 not an attention kernel, 1 forward, 2 backward).
PASSES = ("fwd", "bwd")
#: Where ``[calibration] attention_kernels = "NAME"`` is looked up: NAME.toml here.
TABLES_DIR = Path(__file__).resolve().parents[2] / "phaze_ir" / "hw_presets" / "attention"


@dataclass(frozen=True)
class Curve:
    """One published series: ``backend``'s ``phase`` pass, with or without a causal mask, at
    ``head_dim`` and ``gqa`` query heads per K/V head; ``tflops[i]`` at ``seq[i]`` tokens."""

    backend: str
    phase: str
    causal: bool
    head_dim: int
    gqa: int
    seq: tuple[int, ...]
    tflops: tuple[float, ...]
    source: str


@dataclass(frozen=True)
class AttentionTable:
    """A chip's attention kernels (:func:`load`)."""

    name: str
    curves: tuple[Curve, ...]

    def backends(self) -> frozenset[str]:
        return frozenset(c.backend for c in self.curves)

    def has(self, backend: str) -> bool:
        """Whether the table prices ``backend``'s kernels (forward and backward)."""
        return any(c.backend == backend and c.phase == "fwd" for c in self.curves) and any(
            c.backend == backend and c.phase == "bwd" for c in self.curves
        )

    def best_tflops(self) -> float:
        """The highest rate any kernel of the table reaches."""
        return max(max(c.tflops) for c in self.curves)


def _fail(where: str, what: str) -> ValueError:
    return ValueError(f"attention kernel table {where}: {what}")


def parse(name: str, data: dict) -> AttentionTable:
    """A table from its TOML data, checked; a ``ValueError`` saying what is wrong otherwise."""
    raw = data.get("curve")
    if not isinstance(raw, list) or not raw:
        raise _fail(name, "expected one or more [[curve]] tables")
    curves = []
    for i, c in enumerate(raw):
        at = f"{name} curve {i + 1}"
        if not isinstance(c, dict):
            raise _fail(at, "expected a table")
        known = {"backend", "pass", "causal", "head_dim", "gqa", "seq", "tflops", "source"}
        unknown = sorted(set(c) - known)
        if unknown:
            raise _fail(at, f"unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
        backend, phase = c.get("backend"), c.get("pass")
        if backend not in BACKENDS:
            raise _fail(at, f"backend = {backend!r}: expected one of {', '.join(BACKENDS)}")
        if phase not in PASSES:
            raise _fail(at, f"pass = {phase!r}: expected fwd or bwd")
        causal = c.get("causal")
        if not isinstance(causal, bool):
            raise _fail(at, f"causal = {causal!r}: expected true or false")
        head_dim, gqa = c.get("head_dim"), c.get("gqa", 1)
        for key, v in (("head_dim", head_dim), ("gqa", gqa)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise _fail(at, f"{key} = {v!r}: expected an integer >= 1")
        seq, tflops = c.get("seq"), c.get("tflops")
        if not isinstance(seq, list) or not isinstance(tflops, list) or not seq or len(seq) != len(tflops):
            raise _fail(at, "seq and tflops: expected two lists of the same length, at least one entry")
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in seq) or seq != sorted(set(seq)):
            raise _fail(at, f"seq = {seq!r}: expected increasing integers >= 1")
        if any(isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < 1e5 for t in tflops):
            raise _fail(at, f"tflops = {tflops!r}: expected numbers above 0 (TFLOP/s)")
        source = c.get("source")
        if not isinstance(source, str) or not source.strip():
            raise _fail(at, "source: expected where the figures come from")
        assert isinstance(head_dim, int) and isinstance(gqa, int)  # checked above
        curves.append(Curve(backend, phase, causal, head_dim, gqa, tuple(seq), tuple(float(t) for t in tflops), source))
    return AttentionTable(name, tuple(curves))


@lru_cache(maxsize=16)
def load(name: str) -> AttentionTable:
    """The table ``name`` names: ``TABLES_DIR/name.toml``, or a path to a TOML file."""
    path = Path(name) if name.endswith(".toml") else TABLES_DIR / f"{name}.toml"
    if not path.is_file():
        raise ValueError(f"attention_kernels = {name!r}: no table {path}")
    with path.open("rb") as f:
        return parse(name, tomllib.load(f))


def _interp_log2(x: float, xs: tuple[float, ...], ys: tuple[float, ...]) -> float:
    """``ys`` at ``x``, linear in log2 of ``x`` between ``xs``, held at the ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    lx = math.log2(x)
    for i in range(1, len(xs)):
        if x <= xs[i]:
            a, b = math.log2(xs[i - 1]), math.log2(xs[i])
            w = (lx - a) / (b - a)
            return ys[i - 1] + w * (ys[i] - ys[i - 1])
    return ys[-1]  # pragma: no cover


def _published(table: AttentionTable, backend: str, phase: str, causal: bool, seq: int, head_dim: int, gqa: int):
    """TFLOP/s from the curves of exactly this (backend, phase, causal), or None without any."""
    curves = [c for c in table.curves if (c.backend, c.phase, c.causal) == (backend, phase, causal)]
    if not curves:
        return None
    ratios = sorted({c.gqa for c in curves})
    g = max((r for r in ratios if r <= gqa), default=ratios[0])
    by_dim = sorted((c.head_dim, c) for c in curves if c.gqa == g)
    dims = tuple(float(d) for d, _ in by_dim)
    rates = tuple(_interp_log2(seq, c.seq, c.tflops) for _, c in by_dim)
    return _interp_log2(head_dim, dims, rates)


def tflops(table: AttentionTable, backend: str, phase: str, causal: bool, seq: int, head_dim: int, gqa: int = 1):
    """The TFLOP/s ``backend``'s ``phase`` pass reaches at this shape (module docstring), None
    when the table does not price that kernel."""
    if not table.has(backend):
        return None
    rate = _published(table, backend, phase, causal, seq, head_dim, gqa)
    if rate is not None:
        return rate
    # a causal (or unmasked) pass the table lacks: the other mask's, scaled by the forward's ratio
    other = _published(table, backend, phase, not causal, seq, head_dim, gqa)
    fwd = _published(table, backend, "fwd", causal, seq, head_dim, gqa)
    fwd_other = _published(table, backend, "fwd", not causal, seq, head_dim, gqa)
    if other is None or fwd is None or fwd_other is None:
        return None
    return other * fwd / fwd_other


def efficiency(
    table: AttentionTable,
    backend: str,
    phase: str,
    causal: bool,
    seq: int,
    head_dim: int,
    peak_flops: float,
    gqa: int = 1,
) -> float | None:
    """The fraction of ``peak_flops`` (the chip's dense tensor peak, FLOP/s) the kernel reaches
    at this shape, at most 1; None when the table does not price it."""
    rate = tflops(table, backend, phase, causal, seq, head_dim, gqa)
    if rate is None:
        return None
    return min(1.0, rate * 1e12 / peak_flops)
