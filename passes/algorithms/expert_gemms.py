"""An MoE layer's expert GEMMs at the shape one member of an expert-parallel group runs them
(pure Python, no xDSL).

The traced step holds every expert: a layer's grouped GEMM is ``[E, r, K] x [E, K, N]``, r
the routed rows each expert receives (tokens x top-k over E, spread evenly; the capacity's
padded rows under a capacity factor).  Under expert parallelism e each member of the EP group
holds E/e of the experts and runs them on the rows that the all-to-all brings it from the e
members, e·r each: ``[E/e, e·r, K] x [E/e, K, N]`` (Megatron-LM
``megatron/core/transformer/moe/experts.py``, GroupedMLP/TEGroupedMLP: a rank's
``num_local_experts`` weights run on the tokens the dispatcher permuted to it).  The FLOPs
are the same; the time is not: the member reads 1/e of the weights, and its GEMMs are e
times taller (fewer, fuller waves; a per-expert fallback launches E/e kernels).

:func:`member_gemm` reshapes one expert GEMM; :func:`expert_gemm_times` prices a layer's at
every EP degree with the pricing function it is given (the latency model
``phaze-estimate-latency`` uses), as the DP's ``expert_gemm_s`` (``LayerDict``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from passes.algorithms.latency import MatmulDesc


@dataclass(frozen=True)
class ExpertGemm:
    """One expert GEMM of a layer: its description as traced (``batch`` = the layer's
    experts), whether the backward runs it (else the forward), and whether selective recompute
    re-runs it (a forward GEMM marked ``phaze.recompute = selective``)."""

    desc: MatmulDesc
    backward: bool
    selective: bool = False


def ep_degrees(experts: int) -> list[int]:
    """The EP degrees an MoE layer of ``experts`` experts may run at: the divisors of
    ``experts``, ascending (the DP tries those that also divide its replicas)."""
    return [e for e in range(1, experts + 1) if experts % e == 0]


def member_gemm(desc: MatmulDesc, e: int, rows: int) -> MatmulDesc:
    """``desc``, a GEMM over all of a layer's ``desc.batch`` experts with ``rows`` routed rows
    each, as one member of an EP group of ``e`` runs it: ``batch / e`` experts on ``e·rows``
    rows each.  The rows are M (the forward's and the input gradient's ``[E, r, ·] x [E, ·, ·]``)
    or, when M is not ``rows`` and K is, K (the weight gradient's ``[E, K, r] x [E, r, N]``;
    where both are, M).  What holds the rows (A always; B when they are K) keeps its bytes;
    the weights (B otherwise) and the weight gradient (C, from the shape) are 1/e; a
    per-expert fallback launches ``launches / e`` kernels.  ``desc`` itself at e = 1, or
    when e does not divide its experts or neither M nor K is ``rows`` (a GEMM this rule does
    not know: priced as traced)."""
    if e == 1 or desc.batch % e or rows not in (desc.m, desc.k):
        return desc
    on_m = desc.m == rows
    launches = desc.launches // e if desc.launches > 1 and desc.launches % e == 0 else desc.launches
    return replace(
        desc,
        batch=desc.batch // e,
        m=desc.m * e if on_m else desc.m,
        k=desc.k if on_m else desc.k * e,
        b_bytes=desc.b_bytes // e if on_m else desc.b_bytes,
        launches=launches,
    )


@dataclass(frozen=True)
class ExpertTimes:
    """A layer's expert GEMMs at EP degree ``e`` (the DP's ``ExpertGemmsDict``): their time in
    the forward, the backward and each recompute policy's extra forward (none: 0; selective:
    the GEMMs it re-runs; full: the whole forward's).  The DP reads only the differences from
    e = 1's: the search gives the changes themselves (0 at e = 1, of either sign)."""

    e: int
    fwd_s: float
    bwd_s: float
    recompute_s: tuple[float, float, float]

    def as_dict(self) -> dict[str, object]:
        return {"e": self.e, "fwd_s": self.fwd_s, "bwd_s": self.bwd_s, "recompute_s": list(self.recompute_s)}


def expert_gemm_times(
    gemms: Sequence[ExpertGemm],
    experts: int,
    rows: int,
    price: Callable[[list[MatmulDesc]], list[float]],
) -> tuple[ExpertTimes, ...]:
    """A layer's ``gemms`` (over ``experts`` experts, ``rows`` routed rows each) at every EP
    degree (:func:`ep_degrees`), each GEMM's time the serial sum's term ``price`` gives its
    member's shape (:func:`member_gemm`; a GEMM at a time on the chip, as its scheduled
    makespan runs them); e = 1 is the traced shape.  Empty when there are none."""
    if not gemms or experts <= 0:
        return ()
    degrees = ep_degrees(experts)
    descs = [member_gemm(g.desc, e, rows) for e in degrees for g in gemms]
    seconds = price(descs)
    out = []
    for i, e in enumerate(degrees):
        at = seconds[i * len(gemms) : (i + 1) * len(gemms)]
        fwd = sum(s for g, s in zip(gemms, at) if not g.backward)
        bwd = sum(s for g, s in zip(gemms, at) if g.backward)
        selective = sum(s for g, s in zip(gemms, at) if g.selective and not g.backward)
        out.append(ExpertTimes(e=e, fwd_s=fwd, bwd_s=bwd, recompute_s=(0.0, selective, fwd)))
    return tuple(out)
