"""Tensor-parallel communication overlapped with the GEMMs beside it, as Transformer Engine's
userbuffers run it (Megatron-LM's ``--tp-comm-overlap``; pure Python, no xDSL).

Under sequence parallelism each TP block starts with an all-gather of its input and ends with a
reduce-scatter of its output, and its backward does the duals. Transformer Engine overlaps each
with the GEMM beside it, by one of three methods (``initialize_ub`` in
``transformer_engine/pytorch/module/base.py``, TE 2.20, d0067d0; :data:`METHODS`):

- ``ring_exchange`` (the all-gathers before the QKV and FC1 GEMMs, and those of the output
  gradient before the projection's and FC2's input-gradient GEMMs): the GEMM in t chunks, one
  per TP rank's shard; while chunk i computes, the next shard arrives point to point. Its
  copies run on the copy engines (``use_ce``) with one SM for the rest (``num_sm = 1``).
- ``pipeline`` (the reduce-scatters after the projection's and FC2's GEMMs): the GEMM in 4
  chunks (``num_splits = 4``), each chunk's reduce-scatter beside the next chunk's GEMM, the
  last one alone; the reduce-scatter kernels hold 16 SMs (``num_sm = 16``), which the GEMM is
  launched without (``set_sm_margin``).
- ``bulk`` (the backward's all-gather of the saved input for the weight gradient, beside the
  input-gradient GEMM; the reduce-scatter of the input gradient, beside the weight-gradient
  GEMM): the whole collective beside the whole GEMM, on 16 SMs, the GEMM without them
  (``set_sm_margin``).

A collective of c seconds beside GEMMs of g seconds, split in n steps of x = g/n beside hops of
r, ends as the overlapped DP collectives and the CP ring do (docs/design.md §6.5, §6.8a): each
hop beside a step ends at max(r, x + f·min(r, x)), f the share of the chip's SMs the
collective holds. Where TE sets an SM margin (``set_sm_margin``, the default of ``pipeline``
and ``bulk``: ``get_default_config`` in ``initialize_ub``) every GEMM chunk of the overlap is
launched on the chip's SMs less the communication's (``_math_sms = sm_count - num_comm_sm`` in
``CommOverlapCore``, ``transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp``, and
``nvte_cublas_gemm(..., _math_sms, ...)`` in ``bulk_overlap`` and ``split_overlap_rs``, TE 2.20,
d0067d0), whether a hop runs beside it or not: a step takes x / (1 − f) and a hop beside it
ends at max(r, x / (1 − f)) (the communication on SMs of its own, nothing more shared). What
the collective adds to the GEMMs is that end less g (never below 0).

Torch's micro-pipelined TP (``--kernels inductor``: torchtitan's ``enable_async_tensor_parallel``)
runs differently (:data:`MICRO_PIPELINED`, :func:`micro_pipelined_added_s`). Inductor's
``micro_pipeline_tp`` pass (``torch/_inductor/fx_passes/micro_pipeline_tp.py``) fuses two patterns
only: an all-gather whose result is the left operand of its matmuls (``_find_consumer_matmuls``:
``mm(A, B)`` or a reshape into one; a transposed use, the weight gradient's, is no consumer)
becomes ``fused_all_gather_matmul``, and a reduce-scatter whose input is one matmul's output
(``rs_input`` an ``mm``, or a reshape of one, with no other user) becomes
``fused_matmul_reduce_scatter``; every other TP collective stays a plain NCCL one, its wait before
its consumer, exposed. The fused ops (``torch/distributed/_symmetric_memory/__init__.py``)
split the GEMM by rows into t chunks, one per rank's shard (``_pipelined_all_gather_and_consume``:
the local shard's chunk first, then each remote shard copied and consumed;
``_pipelined_produce_and_all2all``: each destination's chunk produced, then pulled by it, the
local chunk last), on two streams so the copy of one step runs beside the GEMM chunk of the next;
the copies are ``Tensor.copy_`` between symmetric-memory buffers (copy engines, no SMs), so a
hop of r beside a chunk of x ends at max(r, x), and the chunks run at their own shape (M/t rows).
The matmul-reduce-scatter then sums the t partials it received in a kernel of its own
(``reduce_partials``: reads the t stacked partials, writes one), a memory-bound pass after the
last chunk.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from passes.algorithms.latency import MatmulDesc, VectorDesc

#: The settings of ``--tp-overlap``: ``on`` overlaps every point (it needs sequence
#: parallelism), ``auto`` the points with sequence parallelism, ``off`` none.
TP_OVERLAP_SETTINGS = ("off", "on", "auto")


@dataclass(frozen=True)
class Method:
    """How TE overlaps one collective with its GEMM: ``splits`` (0: the TP width, one chunk per
    rank), ``sms`` (the SMs its communication holds), ``last_alone`` (the last chunk's
    collective runs after the last GEMM chunk), ``bulk`` (no chunks: the whole collective
    beside the whole GEMM), ``sm_margin`` (TE's ``set_sm_margin``: the GEMM chunks launched
    without the communication's SMs, for their whole time)."""

    splits: int
    sms: int
    last_alone: bool = False
    bulk: bool = False
    sm_margin: bool = False


#: TE 2.20's defaults (``get_default_config`` in ``initialize_ub``).
METHODS = {
    "ring_exchange": Method(splits=0, sms=1),
    "pipeline": Method(splits=4, sms=16, last_alone=True, sm_margin=True),
    "bulk": Method(splits=1, sms=16, bulk=True, sm_margin=True),
}


def method_of(kind: str, phase: str, feeds_gemm: bool) -> str:
    """TE's method for a TP collective of ``kind`` in ``phase``: forward all-gathers and the
    backward's all-gathers of the output gradient (which feed the input-gradient GEMM) by
    ring exchange, forward reduce-scatters by pipeline, the rest of the backward in bulk.
    ``feeds_gemm``: the all-gather's result is an operand of the GEMM it overlaps (in backward,
    the output gradient's; the saved input's feeds the weight gradient only)."""
    if kind == "all_gather" and (phase == "fwd" or feeds_gemm):
        return "ring_exchange"
    if kind == "reduce_scatter" and phase == "fwd":
        return "pipeline"
    return "bulk"


def added_s(method: str, comm_s: float, gemm_s: float, tp: int, sms: int, sm_margin: bool = True) -> float:
    """What a collective of ``comm_s`` seconds overlapped by ``method`` adds to its GEMMs of
    ``gemm_s`` seconds, on a chip of ``sms`` SMs at TP width ``tp`` (module docstring).
    ``sm_margin=False``: an overlap that launches its GEMMs on every SM (torch's micro-pipelined
    TP), the method's margin ignored."""
    if comm_s <= 0:
        return 0.0
    m = METHODS[method]
    share = m.sms / sms
    if gemm_s <= 0:
        return comm_s  # nothing beside it
    margin = sm_margin and m.sm_margin and share < 1.0

    def step(r: float, x: float) -> float:
        """A hop of r beside a GEMM step of x: its end."""
        return max(r, x / (1.0 - share)) if margin else max(r, x + share * min(r, x))

    if m.bulk:
        return max(0.0, step(comm_s, gemm_s) - gemm_s)
    n = m.splits or tp
    x = gemm_s / n
    hops = n if m.last_alone else n - 1
    r = comm_s / max(1, hops)
    first = x / (1.0 - share) if margin else x
    end = first + (n - 1) * step(r, x) + (r if m.last_alone else 0.0)
    return max(0.0, end - gemm_s)


#: How torch's micro-pipelined TP runs a TP collective (module docstring): fused with the
#: matmuls that read the gathered result, fused with the one matmul whose output it reduces,
#: or plain (no GEMM beside it).
FUSED_ALL_GATHER_MATMUL = "fused_all_gather_matmul"
FUSED_MATMUL_REDUCE_SCATTER = "fused_matmul_reduce_scatter"
PLAIN = "plain"
MICRO_PIPELINED = (FUSED_ALL_GATHER_MATMUL, FUSED_MATMUL_REDUCE_SCATTER, PLAIN)


def chunk_gemm(d: MatmulDesc, tp: int) -> MatmulDesc:
    """One of the t chunks a fused op of torch's micro-pipelined TP runs of the GEMM ``d``: its
    rows (the flattened tokens, gathered or to be scattered) split t ways, a 2-D ``mm`` of its
    own launched by the fused op (``mm_out_op(shard, B, out=...)``), the right operand whole."""
    rows = -(-d.batch * d.m // tp)
    return dataclasses.replace(
        d,
        batch=1,
        m=rows,
        a_bytes=-(-d.a_bytes // tp),
        onchip_bytes=0,
        launches=1,
        post_scale_bytes=-(-d.post_scale_bytes // tp),
    )


def partials_pass(d: MatmulDesc, tp: int) -> VectorDesc:
    """The pass of ``fused_matmul_reduce_scatter`` that sums the t partials of the GEMM ``d``'s
    output it received (``reduce_partials``): reads all of them (``d``'s output, t chunks of
    M/t rows), writes one chunk, an add per element read."""
    elements = d.batch * d.m * d.n
    return VectorDesc(work=elements, read_bytes=d.c_bytes, write_bytes=-(-d.c_bytes // tp))


def micro_pipelined_added_s(
    method: str, comm_s: float, gemm_s: float, chunk_s: float, tp: int, reduce_s: float
) -> float:
    """What a TP collective of ``comm_s`` seconds adds to its GEMMs (``gemm_s`` seconds as
    traced, whole) as torch's micro-pipelined TP runs it by ``method``
    (:data:`MICRO_PIPELINED`): plain, all of it; fused, t steps of ``chunk_s`` (one chunk of
    each of its GEMMs), the t − 1 copies of comm_s/(t − 1) by copy engine each beside a step,
    then (matmul-reduce-scatter) the partials' sum of ``reduce_s``, less the whole GEMMs' time
    (never below 0)."""
    if comm_s <= 0:
        return 0.0
    if method == PLAIN or gemm_s <= 0 or tp < 2:
        return comm_s
    r = comm_s / (tp - 1)
    end = chunk_s + (tp - 1) * max(r, chunk_s)
    if method == FUSED_MATMUL_REDUCE_SCATTER:
        end += reduce_s
    return max(0.0, end - gemm_s)
